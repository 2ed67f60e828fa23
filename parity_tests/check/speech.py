"""Whisper's whole encoder-decoder (mel frames and decoder ids in, logits out) judged against the reference's
SpeechTransformer (numpy_transformer/audio.py), read from its structure as towers.py reads the audio encoder: the
front end (two Conv1d over mel frames and a fixed table of positions), the encoder's pre-norm blocks of two
LayerNorms and its final norm; then the decoder: the nn.Embedding called with the ids (the tokens), the table the
recorded forward reads at rows 0 .. T-1 (learned positions: an nn.Embedding, or a parameter sliced [:T] as OpenAI's),
pre-norm blocks of three LayerNorms (norm, q k v out of the self-attention, norm, q k v out of the cross-attention,
norm, fc1, fc2, in the order the forward calls them), a final norm, and the logits through a Linear or the token
table (tied). The head count and activation are those under which the outputs agree; the outputs and every
parameter's gradient are compared in float64 and float32 (running.reference_rows). Where it fails, the encoder that
differs is judged as Whisper's audio encoder (towers.py); else the first decoder block whose output differs from the
reference layer's: no pair where its cross-attention's keys or values read another tensor than the encoder's output,
else the judge's decoder_layer level on its recorded call, under the map the first block passes by."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect

import numpy as np
import torch
from torch import nn

from numpy_transformer.audio import POSITION_TABLE, SpeechTransformer, whisper_sinusoids
from transformer_spec.config import TransformerConfig

from . import dataflow as DF
from . import towers as TW
from .calling import first_tensor
from .diagnosis import MATCH, _error
from .report import Result
from .running import copy_module, first_calls, reference_rows

# a decoder block's parts, in call order: the reference's names (below decoder.layers.i.)
ATTENTION = ("", "q", "k", "v", "out")
DECODER = tuple(f"{a}.{p}_proj" if p else f"{a}_norm" for a in ("self_attn", "cross_attn") for p in ATTENTION)
DECODER += ("ffn_norm", "ffn.linear1", "ffn.linear2")


def judge_speech(user: nn.Module, reference: str, judge) -> Result | None:
    """The verdict on `user` as Whisper's encoder-decoder; None where it is not one (no audio front end, or a forward
    of one input); could not judge where it is one but its parts do not read as the reference's. Where it fails, the
    stack that differs first is judged on its own (`judge`: check.module, passed in): _place."""
    try:
        needed = [p for p in inspect.signature(user.forward).parameters.values() if p.default is p.empty]
        model = copy_module(user).double().eval() if len(needed) > 1 else None
        TW._draw(model, np.random.default_rng(0))
        front = TW._front(model)
    except Exception:  # not a module, one input, or no front end this reads
        return None
    if front[0] != "audio":
        return None
    said = f"{reference}, read as Whisper's encoder-decoder (numpy_transformer/audio.py's SpeechTransformer)"
    try:
        return _judged(model, front, Result(reference=said), judge)
    except Exception as exc:  # never out of the judge
        rest = "the forward takes ids, but the rest is not Whisper's encoder-decoder as check/speech.py reads it"
        return Result(said, error=f"could not judge: {front[2]} reads mel frames and {rest} ({exc})")


def _judged(model: nn.Module, front: tuple, result: Result, judge) -> Result:
    """`result` filled: the module read (_read), the reference run under each (activation, head count) and the one
    whose encoder agrees, then whose logits agree best, compared; a failure placed (_place, _source)."""
    links, inputs, cfg, table, stacks, blocks = _read(model, front)
    refs = [_reference(model, links, table, cfg, a, h) for a, h in _tries(cfg)]
    with first_calls(model.named_modules()) as calls, torch.no_grad():
        out = first_tensor(model(*map(torch.from_numpy, inputs))).numpy()
    memory = first_tensor(calls[stacks[0]].output).numpy()  # the encoder's memory agreeing first, then the logits
    ranks = [(_error(memory, r.encode_source(inputs[0])[0]) > MATCH, _error(out, r.forward(*inputs))) for r in refs]
    best = min(range(len(refs)), key=ranks.__getitem__)
    (activation, n_heads), (differs, error) = _tries(cfg)[best], ranks[best]
    read = {"activation": activation, "n_heads": str(n_heads), "eps": str(cfg.layer_norm_eps),
            "tie_embeddings": str(cfg.tie_embeddings)}  # fmt: skip
    if error <= MATCH:
        result.conventions = read
    else:
        result.assumed, result.confirmed = read, False
    result.mapping = {u: (ours, "as is") for u, ours in links.items()}
    dout = np.random.default_rng(2).standard_normal(out.shape)
    for dtype in (np.float64, np.float32):
        result.rows += _compare(model, links, inputs, table, cfg, activation, n_heads, dout, dtype)
    result.passed = all(r.ok for r in result.rows)
    if result.passed:
        return result
    hidden = refs[best]._cache.decoder.hidden[1:]  # the reference's states after each decoder layer
    block = next((b for b, h in zip(blocks, hidden, strict=True) if _error(_out(calls[b]), h) > MATCH), None)
    if differs or block is None:
        _place(model, stacks[0] if differs else stacks[1], differs, calls, result, judge)
    else:  # the first decoder block that differs: what its cross-attention reads, else its layer's verdict
        read = dict(norm_first=True, activation=activation, n_heads=n_heads, dtypes=("float64",))
        verdict = _source(block, links, calls, stacks[0]) or TW.judge_block(
            model, block, blocks[0], calls, lambda b, **kw: judge(b, "decoder_layer", **read, **kw)
        )
        _said(verdict, block, result)
    return result


def _out(call) -> np.ndarray:
    return first_tensor(call.output).detach().numpy()


def _source(block: str, links: dict, calls: dict, encoder: str) -> Result | None:
    """No pair where `block`'s cross-attention (the Linears linked to its cross_attn's q, k and v projections) reads
    its keys or values from another tensor than the encoder's output, as its recorded calls show; else None."""
    layer = ".".join(links[next(u for u in links if u.startswith(f"{block}."))].split(".")[:3])  # decoder.layers.i
    parts = {ours.split(".")[-2]: u.rsplit(".", 1)[0] for u, ours in links.items() if ours.startswith(f"{layer}.cross")}
    memory, queries = _out(calls[encoder]), calls[parts["q_proj"]].args[0]
    read = {p: calls[parts[p]].args[0].numpy() for p in ("k_proj", "v_proj")}
    other = [p for p, x in read.items() if x.shape != memory.shape or _error(x, memory) > MATCH]
    if not other:
        return None
    own = all(torch.equal(calls[parts[p]].args[0], queries) for p in other)
    what = "the decoder's own states (what its queries read)" if own else "another tensor"
    where = TW._up(parts[other[0]]).removeprefix(block).lstrip(".") or "(the module)"
    names = " and ".join(parts[p].rsplit(".", 1)[-1] for p in other)
    said = f"differs at {where}: the cross-attention's {names} projections read {what}, not the encoder's output"
    return Result(reference="", unsupported=f"{said}, which the reference has no pair for")


def _place(model: nn.Module, where: str, encoder: bool, calls: dict, result: Result, judge) -> None:
    """The first stack whose output differs from the reference's (`where`, "" where it is the module itself) judged
    on its own recorded call (`calls`): the encoder as Whisper's audio encoder (towers.py), the decoder at the judge's
    "decoder" level; what that names (a catalogued mistake, math the reference lacks) said there."""
    verdict, call = None, calls.get(where)
    with contextlib.suppress(Exception):  # a stack neither reads: the place alone is said
        if encoder:
            verdict = TW.judge_tower(model.get_submodule(where), "encoder_model", judge)
        elif call is not None:
            example = (call.args, call.kwargs)
            verdict = judge(model.get_submodule(where), "decoder", example=example, dtypes=("float64",))
    result.first_divergence = where or None
    _said(verdict, where, result)


def _said(verdict: Result | None, where: str, result: Result) -> None:
    """What `verdict` on the part `where` ("": the module) names, put in `result` at the whole module's places."""
    at = f"{where}." if where else ""
    for d in verdict.diagnoses if verdict else []:
        d.where = f"{at}{d.where}" if d.where else where
        result.diagnoses.append(d)
    result.first_divergence = result.diagnoses[0].where if result.diagnoses else where or None
    said = verdict.unsupported if verdict and verdict.unsupported else None
    if said and where:  # its place inside the part, or the part itself ("(the module)" there)
        said = said.replace("differs at (the module)", f"differs at {where}", 1).replace(
            "differs at ", f"differs at {at}", 1
        )
        said = said.replace(f"differs at {at}{where}:", f"differs at {where}:", 1)
    result.unsupported = said
    inner = verdict.unexplained if verdict and verdict.unexplained else None  # at the part's own part that differs
    if not (result.diagnoses or result.unsupported):
        alone = "its output differs from the reference's; no catalogue variant reproduces it"
        result.unexplained = f"{at}{inner}" if inner else f"{where or '(the module)'}: {alone}"


def _tries(cfg: TransformerConfig) -> list:
    """(activation, head count) pairs the reference is run under."""
    D = cfg.d_model
    return [(a, h) for a in ("gelu", "gelu_tanh", "relu", "silu", "quick_gelu") for h in range(1, D + 1) if D % h == 0]


def _read(model: nn.Module, front: tuple) -> tuple:
    """(links: user parameter -> the reference's name, (features, ids), config, the fixed position table)."""
    _, features, first, D, convs, positions, _ = front  # positions: the encoder's fixed table
    links = {u: ours[0] for u, ours in convs.items()}
    encoder = TW._up(first)
    table = model.get_buffer(positions).double().numpy()
    if not encoder or _error(table, whisper_sinusoids(*table.shape)) > 1e-6:
        raise ValueError(f"{positions}: not Whisper's sinusoids, or the convolutions not inside an encoder")
    embeddings = [n for n, m in model.named_modules() if isinstance(m, nn.Embedding)]
    rows = min(model.get_submodule(n).num_embeddings for n in embeddings)
    ids = np.random.default_rng(1).integers(1, rows - 1, (2, min(8, rows)))
    order: list = []
    with first_calls(model.named_modules(), order) as calls, torch.no_grad():
        flow = DF.record(lambda: model(torch.from_numpy(features), torch.from_numpy(ids)), model)
        out = first_tensor(calls[""].output)
    called = [n for n in embeddings if n in calls and torch.equal(calls[n].args[0], torch.from_numpy(ids))]
    tables = {positions} | {f"{n}.weight" for n in called}  # the positions: the other table read at rows 0 .. T-1
    placed = [t for t, c in flow.positions.items() if c == 0 and t not in tables]
    if len(called) != 1 or len(placed) != 1:
        raise ValueError(f"{len(called)} tables reading the ids and {len(placed)} of positions: not one each")
    tokens = called[0]
    links |= {f"{tokens}.weight": "decoder.token_embedding.weight", placed[0]: "decoder.position_embedding.weight"}

    def norms(name: str) -> int:
        return sum(isinstance(m, nn.LayerNorm) for m in model.get_submodule(name).modules())

    mine = [n for n in order if n.startswith(f"{encoder}.")]
    enc = [n for n in mine if norms(n) == 2 and norms(TW._up(n)) > 2]
    dec = [n for n in order if n and n not in mine and norms(n) == 3 and norms(TW._up(n)) > 3]
    inside = [n for n in order if any(n.startswith(b + ".") for b in enc + dec)]
    for i, block in enumerate(enc):
        links |= {u: ours[0] for u, ours in TW._block_parts(model, [n for n in inside if n.startswith(block + ".")],
                                                            f"encoder.layers.{i}.", TW.AUDIO).items()}  # fmt: skip
    for i, block in enumerate(dec):
        links |= _decoder_parts(model, [n for n in inside if n.startswith(block + ".")], f"decoder.layers.{i}.")
    rest = [n for n in order if n not in inside and isinstance(model.get_submodule(n), (nn.LayerNorm, nn.Linear))]
    ends = [n for n in rest if isinstance(model.get_submodule(n), nn.LayerNorm)]
    if not enc or not dec or len(ends) != 2:
        raise ValueError(f"{len(enc)} encoder blocks, {len(dec)} decoder blocks and {len(ends)} final norms")
    heads = [n for n in rest if isinstance(model.get_submodule(n), nn.Linear)]
    for name, ours in zip(ends + heads[-1:], ("encoder.final_norm", "decoder.final_norm", "output_proj"), strict=False):
        links |= {f"{name}.{k}": f"{ours}.{k}" for k in ("weight", "bias")}
    held = dict(model.named_parameters())
    links = {u: ours for u, ours in links.items() if u in held and not ours.endswith("k_proj.bias")}
    fc1 = next(v for u, v in held.items() if links.get(u) == "decoder.layers.0.ffn.linear1.weight")
    eps = next(m.eps for m in model.modules() if isinstance(m, nn.LayerNorm))
    cfg = TransformerConfig(
        src_vocab_size=out.shape[-1], tgt_vocab_size=out.shape[-1], d_model=D, n_heads=1, d_ff=fc1.shape[0],
        n_encoder_layers=len(enc), n_decoder_layers=len(dec), norm_first=True, positional="learned",
        max_len=model.get_parameter(placed[0]).shape[0], n_mels=features.shape[1], source_positions=len(table),
        tie_embeddings=not heads, output_bias=bool(heads) and f"{heads[-1]}.bias" in held, layer_norm_eps=eps,
        dropout=0.0, scale_embeddings=False, pad_id=None,
    )  # fmt: skip
    decoder = _common([tokens, *dec])
    return links, (features, ids), cfg, table, (encoder, "" if decoder.startswith(encoder) else decoder), dec


def _common(names: list) -> str:
    """The deepest submodule holding every one of `names` ("" : the module)."""
    parts = [n.split(".") for n in names]
    same = [p[0] for p in zip(*parts, strict=False) if len(set(p)) == 1]
    return ".".join(same[: min(map(len, parts)) - 1])


def _decoder_parts(model: nn.Module, names: list, layer: str) -> dict:
    """A decoder block's parameters -> the reference's names, from the order its forward calls its LayerNorms and
    Linears (DECODER's); raises where they are not that."""
    calls = [n for n in names if isinstance(model.get_submodule(n), (nn.LayerNorm, nn.Linear))]
    kinds = [isinstance(model.get_submodule(n), nn.LayerNorm) for n in calls]
    if kinds != [ours.endswith("norm") for ours in DECODER]:
        raise ValueError(f"a decoder block calling {len(calls)} norms and linears, not norm, q k v out twice, fc1, fc2")
    parts = zip(calls, DECODER, strict=True)
    return {f"{u}.{k}": f"{layer}{ours}.{k}" for u, ours in parts for k in ("weight", "bias")}


def _run(model, links, inputs, table, cfg, activation, n_heads, dtype=np.float64, dout=None) -> tuple:
    """The reference's logits in `dtype` under (activation, n_heads) on the module's weights, and its gradients by
    the user's names for the upstream gradient `dout` (None: none)."""
    ref = _reference(model, links, table, cfg, activation, n_heads, dtype)
    logits = ref.forward(inputs[0].astype(dtype), inputs[1])
    if dout is None:
        return logits, {}
    ref.zero_grad()
    ref.backward(dout.astype(dtype))
    return logits, {f"d {u}": ref.grads[v] for u, v in links.items()}


def _reference(model, links, table, cfg, activation, n_heads, dtype=np.float64) -> SpeechTransformer:
    """The reference's SpeechTransformer in `dtype` under (activation, n_heads) holding the module's weights (`links`:
    user name -> ours), a bias the module lacks zero; raises where a weight has no part of the module."""
    ref = SpeechTransformer(dataclasses.replace(cfg, activation=activation, n_heads=n_heads), dtype=dtype)
    held = dict(model.named_parameters())
    ours = {v: held[u].detach().numpy() for u, v in links.items()}
    for name, value in ref.params.items():
        if name not in ours and not name.endswith("bias"):
            raise ValueError(f"no part of the module is the reference's {name}")
        ref.params[name] = ours.get(name, np.zeros_like(value)).astype(dtype)
    ref.buffers[POSITION_TABLE] = table.astype(dtype)
    return ref


def _compare(model, links, inputs, table, cfg, activation, n_heads, dout, dtype) -> list:
    """Rows for the logits and every linked parameter's gradient in `dtype`."""
    user = copy_module(model).to(torch.float64 if dtype == np.float64 else torch.float32)
    out = first_tensor(user(torch.from_numpy(inputs[0].astype(dtype)), torch.from_numpy(inputs[1])))
    out.backward(torch.from_numpy(dout.astype(dtype)))
    held = dict(user.named_parameters())
    mine = {"output": out} | {f"d {u}": torch.zeros_like(held[u]) if held[u].grad is None else held[u].grad
                              for u in links}  # fmt: skip
    mine = {n: t.detach().double().numpy() for n, t in mine.items()}

    def reference(d):
        logits, grads = _run(model, links, inputs, table, cfg, activation, n_heads, d, dout)
        return {"output": logits} | grads

    return reference_rows(mine, reference, dtype)
