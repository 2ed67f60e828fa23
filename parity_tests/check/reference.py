"""The reference at each level, read from its entry's fields (levels.Level: unit, group, stacks), never its name:
its parameter shapes for a config (`shapes`), its runner (`runner`: run(params, p, cfg, dtype) -> (out, backward),
backward(dout) -> ({input: gradient}, {parameter: gradient})) and the stages judged in situ (`stages`). Every call
the judge makes into numpy_transformer's level math is here: a change of its signatures is met in this one file."""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import numpy_transformer as nt
from numpy_transformer import layers as L
from numpy_transformer import model as M
from numpy_transformer.latent_attention import LATENT_NORM_EPS
from numpy_transformer.scores import ScoreMod

from . import variants as V
from .probes import Probe, keep_mask

# -- parameter shapes: {name: shape} ------------------------------------------------------------------------------


def unit_shapes(cfg, unit: str) -> dict:
    """A component's parameters: its linears' weights (out, in) and biases (out,) (none where cfg.bias is False; k
    and v kv_heads * d_head wide), a norm's scale (and shift), a learned position table, the token table."""
    D, F, kv = cfg.d_model, cfg.d_ff, cfg.kv_heads * cfg.d_head
    linears = {
        "attention": (("q_proj", D, D), ("k_proj", kv, D), ("v_proj", kv, D), ("out_proj", D, D)),
        "feed_forward": (("linear1", F, D), ("linear2", D, F)),
        "gated_feed_forward": (("gate", F, D), ("linear1", F, D), ("linear2", D, F)),
    }
    shapes: dict = {}
    for name, out_features, in_features in linears.get(unit, ()):
        shapes[f"{name}.weight"] = (out_features, in_features)
        shapes |= {f"{name}.bias": (out_features,)} if cfg.bias else {}
    if unit in ("layer_norm", "rms_norm"):
        shapes = {"weight": (D,), "bias": (D,)} if unit == "layer_norm" else {"weight": (D,)}
    elif unit == "positions" and cfg.positional == "learned":
        shapes = {"position_embedding.weight": (cfg.max_len, D)}
    elif unit == "embedding":
        shapes = {"token_embedding.weight": (cfg.src_vocab_size, D)}
    return shapes


def shapes(entry, cfg) -> dict:
    """The reference's parameters at `entry`'s level: a component's, one layer's (named below it), a model's, an
    encoder-decoder's decoder stack, or the stacks' layers and final norms (nn.Transformer's always end in one)."""
    if entry.unit is not None:
        return unit_shapes(cfg, entry.unit)
    if entry.group == "layer":  # a causal layer is a decoder's: cross-attending unless decoder-only
        prefix = f"{'decoder' if entry.causal else 'encoder'}.layers.0."
        one = dataclasses.replace(cfg, n_encoder_layers=1, n_decoder_layers=1)
        full = nt.parameter_shapes(one, decoder_only=entry.causal and not entry.cross)
        return {k[len(prefix) :]: v for k, v in full.items() if k.startswith(prefix)}
    decoder = entry.stacks == ("decoder",)
    if decoder and entry.cross:  # an encoder-decoder's decoder stack: its output projection, tied, is not its own
        cfg = dataclasses.replace(cfg, tie_embeddings=True)
    full = nt.parameter_shapes(cfg, decoder_only=decoder and not entry.cross, encoder_only=entry.encoder_only)
    if entry.group == "model":
        return {k: v for k, v in full.items() if k.startswith("decoder.")} if decoder and entry.cross else full
    kept = ("layers.",) if entry.final_norms == "always" else ("layers.", "final_norm.")
    out = {k: v for k, v in full.items() if k.startswith(tuple(f"{s}.{w}" for s in entry.stacks for w in kept))}
    if entry.final_norms == "always":
        out |= {f"{s}.final_norm.{w}": (cfg.d_model,) for s in entry.stacks for w in ("weight", "bias")}
    return out


# -- forward and backward: run(params, p, cfg, dtype) -> (out, backward) ------------------------------------------
# a stack's or a model's backward carries the forward's activations (backward.activations, keyed as the model's:
# "encoder.embedding" (a stack's input), "encoder.layers.0", ..., "encoder" (a decoder's memory))


def _named(pair_backward, cache, inputs: tuple):
    """backward(dout) -> ({input: gradient}, {parameter: gradient}) for a pair whose backward(dout, cache) returns
    the gradients of `inputs` in order (None: one the level does not take), then the parameters' dict."""

    def backward(dout):
        grads = pair_backward(dout, cache)
        return {n: g for n, g in zip(inputs, grads, strict=False) if n is not None}, grads[len(inputs)]

    return backward


def _on_x(forward: Callable, backward: Callable, knobs: Callable) -> Callable:
    """The runner of a position-wise pair on the probe's x: forward(params, x, *knobs(cfg)), backward _named."""

    def run(params: dict, p: Probe, cfg, dtype):
        out, cache = forward(params, p.floats["x"], *knobs(cfg))
        return out, _named(backward, cache, ("x",))

    return run


def run_heads(params: dict, p: Probe, cfg, dtype):
    out, cache = nt.scaled_dot_product_attention_forward(*(p.floats[n] for n in "qkv"), keep_mask(p, "src"))
    backward = nt.scaled_dot_product_attention_backward  # dq, dk, dv, dbias (None: no T5 table)
    return out, lambda dout: (dict(zip("qkv", backward(dout, cache), strict=False)), {})


def run_attention(params: dict, p: Probe, cfg, dtype):
    q = p.floats["query"]
    k = q if p.self_attention else p.floats["key"]
    v = p.floats.get("value", k)  # a cross-attention's one memory: the key is the value too
    rope = M.rope_for(cfg, q.shape[1], dtype)  # (cos, sin) with rotary positions, else None
    if rope is not None and not p.self_attention:
        raise ValueError("rotary positions need self-attention: one input, T_q = T_k")
    mask = None if p.causal else keep_mask(p, "src")
    # the config's scale and soft cap on q . k; causal or not, a window
    rules = ScoreMod(cfg.attention_scale, p.causal, cfg.sliding_window if p.causal else None, softcap=cfg.attn_softcap)
    out, cache = nt.multi_head_attention_forward(
        params, q, k, v, cfg.n_heads, mask, n_kv_heads=cfg.n_kv_heads, rope=rope, mod=rules, cross=not p.self_attention
    )

    def backward(dout):
        dq, dk, dv, grads = nt.multi_head_attention_backward(dout, cache)
        if p.self_attention:
            return {"query": dq + dk + dv}, grads  # q = k = v: the three paths add
        if "value" not in p.floats:
            return {"query": dq, "key": dk + dv}, grads
        return {"query": dq, "key": dk, "value": dv}, grads

    return out, backward


def run_positions(params: dict, p: Probe, cfg, dtype):
    table = params.get("position_embedding.weight")
    if table is None:
        table = L.sinusoidal_table(cfg.max_len, cfg.d_model, dtype, cfg.sinusoid_layout)
    out, cache = L.add_positions_forward(p.floats["x"], table)

    def backward(dout):
        dx, dtable = L.add_positions_backward(dout, cache)
        return {"x": dx}, ({"position_embedding.weight": dtable} if params else {})

    return out, backward


def run_embedding(params: dict, p: Probe, cfg, dtype):
    scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
    out, cache = L.embedding_forward(p.ids["ids"], params["token_embedding.weight"], scale)
    return out, lambda dout: ({}, {"token_embedding.weight": L.embedding_backward(dout, cache)})


UNIT_RUNS = {  # a component's runner, by its unit
    "heads": run_heads,
    "attention": run_attention,
    "layer_norm": _on_x(L.norm_forward, L.norm_backward, lambda cfg: ("layer", cfg.layer_norm_eps)),
    "rms_norm": _on_x(L.norm_forward, L.norm_backward, lambda cfg: ("rms", cfg.layer_norm_eps)),
    "feed_forward": _on_x(L.feed_forward_forward, L.feed_forward_backward, lambda cfg: (cfg.activation,)),
    "gated_feed_forward": _on_x(
        L.gated_feed_forward_forward, L.gated_feed_forward_backward, lambda cfg: (cfg.activation,)
    ),
    "positions": run_positions,
    "embedding": run_embedding,
}  # fmt: skip


def run_layer(params: dict, p: Probe, cfg, dtype, causal: bool, layer: int = 0):
    """One layer on x: an encoder layer (the keys' padding masked; `layer` its index in its stack), a decoder-only one
    (causal; a parallel layer where cfg says), or, given a memory (B, T_k, D), a decoder layer cross-attending to it
    (its padding masked); the self-attention rotary where cfg says."""
    x, memory = p.floats["x"], p.floats.get("memory")
    rope = M.rope_for(cfg, x.shape[1], dtype) if memory is None else None  # rotary (cos, sin), or None
    if not causal:
        out, cache = M.encoder_layer_forward(params, x, cfg, mask=keep_mask(p, "src"), rope=rope, layer=layer)
        return out, _named(M.encoder_layer_backward, cache, ("x",))
    forward, backward = M.decoder_layer(cfg)  # sequential, or the parallel layer cfg states
    out, cache = forward(params, x, memory, cfg, memory_mask=keep_mask(p, "cross"), rope=rope)
    return out, _named(backward, cache, ("x", None if memory is None else "memory"))


def run_stack(params: dict, p: Probe, cfg, dtype, stack: str):
    """x (B, T, D) through `stack`'s layers (run_layer, each on the last one's output) and final norm
    (nn.TransformerEncoder's, the Annotated Transformer's Encoder(layer, N)): dmemory is the sum of the layers'."""
    x, backwards, hidden = p.floats["x"], [], [p.floats["x"]]
    for i in range(cfg.n_encoder_layers if stack == "encoder" else cfg.n_decoder_layers):
        on_x = dataclasses.replace(p, floats=p.floats | {"x": x})  # the probe with the last layer's output as x
        x, layer_backward = run_layer(M.sub(params, f"{stack}.layers.{i}"), on_x, cfg, dtype, stack == "decoder", i)
        backwards.append(layer_backward)
        hidden.append(x)
    out, norm_cache = M.final_norm_forward(M.sub(params, stack), x, cfg)

    def backward(dout):
        dx, grads = M.final_norm_backward(dout, norm_cache)
        dmemory = None
        for i in reversed(range(len(backwards))):
            dinputs, layer_grads = backwards[i](dx)
            dx, dmemory_i = dinputs["x"], dinputs.get("memory")
            if dmemory_i is not None:
                dmemory = dmemory_i if dmemory is None else dmemory + dmemory_i
            grads |= M.prefixed(layer_grads, f"layers.{i}")
        return {"x": dx} | ({"memory": dmemory} if stack == "decoder" else {}), M.prefixed(grads, stack)

    backward.activations = _activations(stack, hidden, p.floats.get("memory"))  # type: ignore[attr-defined]
    return out, backward


def run_stacks(params: dict, p: Probe, cfg, dtype):
    """torch.nn.Transformer's: the encoder stack on src, then the decoder stack on tgt cross-attending to its output,
    each ending in a norm; its backward, the same in reverse."""
    normed = dataclasses.replace(cfg, final_norm=True)
    source, target = (dataclasses.replace(p, floats={"x": p.floats[n]}) for n in ("src", "tgt"))
    memory, encoder_backward = run_stack(params, source, normed, dtype, "encoder")
    target.floats["memory"] = memory
    out, decoder_backward = run_stack(params, target, normed, dtype, "decoder")

    def backward(dout):
        dtarget, decoder_grads = decoder_backward(dout)
        dmemory = np.zeros_like(memory) if dtarget["memory"] is None else dtarget["memory"]
        dsource, encoder_grads = encoder_backward(dmemory)
        return {"src": dsource["x"], "tgt": dtarget["x"]}, encoder_grads | decoder_grads

    return out, backward


def run_decoder(params: dict, p: Probe, cfg, dtype):
    decoder, memory = M.sub(params, "decoder"), p.floats["memory"]
    out, cache = M.decoder_forward(decoder, p.ids["tgt"], memory, cfg, memory_mask=keep_mask(p, "cross"))

    def backward(dout):
        dmemory, grads = M.decoder_backward(dout, cache)
        return {"memory": dmemory}, M.prefixed(grads, "decoder")

    backward.activations = _activations("decoder", cache.hidden, memory)  # type: ignore[attr-defined]
    return out, backward


def model_runner(model_class, *inputs: str):
    """The runner of a whole model (nt.Transformer, ...) called on the probe's ids `inputs`."""

    def run(params: dict, p: Probe, cfg, dtype):
        model = model_class(cfg, dtype=dtype).eval()
        model.load_state_dict(params)
        out = model.forward(*(p.ids[n] for n in inputs), *([p.ids["types"]] if "types" in p.ids else []))
        out = model.mlm_logits(out) if cfg.mlm_head else out  # an encoder's masked-LM head: its logits

        def backward(dout):
            model.zero_grad()
            model.backward(model.mlm_logits_backward(dout) if cfg.mlm_head else dout)
            return {}, dict(model.grads)

        backward.activations = model.activations()  # type: ignore[attr-defined]
        return out, backward

    return run


MODELS = {("encoder", "decoder"): nt.Transformer, ("decoder",): nt.TransformerLM, ("encoder",): nt.EncoderModel}


def runner(entry) -> Callable:
    """The runner of `entry`'s level: a component's, one layer, one stack or nn.Transformer's two on embeddings, an
    encoder-decoder's decoder stack on ids and a memory, or a whole model."""
    if entry.unit is not None:
        return UNIT_RUNS[entry.unit]
    if entry.group == "layer":
        return functools.partial(run_layer, causal=entry.causal)
    if entry.group == "stacks":
        return run_stacks if len(entry.stacks) == 2 else functools.partial(run_stack, stack=entry.stacks[0])
    if entry.cross and entry.stacks == ("decoder",):
        return run_decoder
    return model_runner(MODELS[entry.stacks], *entry.inputs)


def _activations(stack: str, hidden: list, memory) -> dict:
    """A stack's activations as a model's are keyed: its input, each layer's output, a decoder's memory."""
    acts = {f"{stack}.embedding": hidden[0]} | {f"{stack}.layers.{i}": h for i, h in enumerate(hidden[1:])}
    return acts | ({} if memory is None else {"encoder": memory})


# -- the stages of a layer's or a model's forward, each judged in situ (divergence.py) ----------------------------


@dataclass(frozen=True)
class Stage:
    """One part of the reference's forward: its unit (a reference prefix) and kind ("embedding", "attention", "norm",
    "ffn", "layer"), its inputs and output in the reference's run, the valid positions, an attention's masks (the
    catalogue's site), and `rerun`: the part on the user's inputs, as its parent gave them (judged in situ)."""

    unit: str
    kind: str
    inputs: tuple
    output: np.ndarray
    valid: np.ndarray | None
    masks: dict | None = None
    rerun: Callable | None = None


def layer_of(unit: str) -> int:
    """The index of the layer a reference unit (or layer) prefix names: 1 for "decoder.layers.1.self_attn"."""
    return int(m.group(1)) if (m := re.search(r"layers\.(\d+)(\.|$)", unit)) else 0


def unit_params(params: dict, unit: str) -> dict:
    """The weights of reference unit `unit` (a layer, or a layer's unit): its own, and where its stack holds T5's
    table (relative_bias.weight, which the reference hands every layer of the stack), that table as its
    self-attention's, where multi_head_attention reads it."""
    stack, _, rest = unit.partition(".layers.")
    table, inner = params.get(f"{stack}.relative_bias.weight"), rest.partition(".")[2]
    share = {"": "self_attn.relative_bias.weight", "self_attn": "relative_bias.weight"}.get(inner)
    return M.sub(params, unit) | ({share: table} if rest and share and table is not None else {})


def unit_forward(kind: str, params: dict, cfg, name: str, layer: int = 0, causal: bool = False) -> Callable:
    """A layer's unit `name` of `kind` ("norm", "ffn" or "attention") with its weights `params`, in float64: a
    function of its inputs (an attention's: query, key and value input, mask) -> its output; an attention with the
    whole model's terms on its scores (rope_knobs; `causal`: a decoder's)."""
    if kind == "norm":
        return lambda x: L.norm_forward(params, x, cfg.norm, cfg.layer_norm_eps)[0]
    if kind == "ffn":
        return lambda x: M.ffn_forward(params, x, cfg, None, "ffn")[0]  # plain or gated, as cfg says
    rope = V.rope_knobs(cfg, rotary=name == "self_attn", layer=layer, causal=causal)
    return lambda query, kv, keep: V.multi_head_attention(params, query, kv, kv, cfg.n_heads, keep, **rope)


def stages(entry, params: dict, p: Probe, cfg) -> list:
    """The reference's stages in forward order on probe `p`, float64: each stack's embeddings (a model's; BERT's
    embedding norm first), then, layer by layer, its units and its output (a layer level: its units alone)."""
    if entry.group == "layer":  # a causal layer's self-attention is a decoder's
        return layer_stages(params, "", p.floats["x"], p.floats.get("memory"), cfg, entry.causal, p.valid, p)[:-1]
    acts = runner(entry)(params, p, cfg, np.float64)[1].activations
    found: list = []
    for stack in entry.stacks:
        decoder, x = stack == "decoder", acts[f"{stack}.embedding"]
        valid = p.tgt_keep if decoder else p.src_keep
        if entry.group == "model":
            ids = p.ids["src"] if stack == "encoder" and "src" in p.ids else (p.ids.get("tgt", p.ids.get("ids")))
            if cfg.embedding_norm:  # BERT's and BART's: the summed embeddings normed, before the layers
                # an encoder without its own table reads the decoder's (share_embeddings)
                own = {"token_embedding.weight": params.get("decoder.token_embedding.weight")} | M.sub(params, stack)
                summed = M.embed_forward(own, ids, dataclasses.replace(cfg, embedding_norm=False))[0]
                found.append(Stage(f"{stack}.embedding_norm", "norm", (summed,), x, valid))
            found.append(Stage(f"{stack}.embedding", "embedding", (ids,), x, valid))
        memory = acts.get("encoder") if entry.cross and decoder else None
        for i in range(cfg.n_encoder_layers if stack == "encoder" else cfg.n_decoder_layers):
            name = f"{stack}.layers.{i}"
            inner = layer_stages(unit_params(params, name), f"{name}.", x, memory, cfg, decoder, valid, p)
            found += inner[:-1] + [dataclasses.replace(inner[-1], output=acts[name])]
            x = acts[name]
        if entry.final_norms == "always" or cfg.has_final_norm:  # the stack's final norm, on its last layer's output
            norm = unit_forward("norm", M.sub(params, f"{stack}.final_norm"), cfg, "final_norm")
            found.append(Stage(f"{stack}.final_norm", "norm", (x,), norm(x), valid, None, norm))
    if cfg.mlm_head:  # an encoder's masked-LM head: its norm, on its dense projection of the output, activated
        dense, norm = M.sub(params, "mlm_head.dense"), unit_forward("norm", M.sub(params, "mlm_head.norm"), cfg, "")
        a = M.ACTIVATIONS[cfg.activation][0](found[-1].output @ dense["weight"].T + dense.get("bias", 0.0))[0]
        found.append(Stage("mlm_head.norm", "norm", (a,), norm(a), p.src_keep, None, norm))
    return found


def _projection_norms(params: dict, name: str, inputs: tuple, cfg, prefix: str, valid) -> list:
    """The RMSNorms inside attention `name`, each a stage on the reference's projection of its query (or key) input:
    OLMo 2's q_norm and k_norm of the whole q and k projections (qk_norm_projection); latent attention's q_a_norm
    of q_a_proj's output (V3's) and kv_a_norm of kv_a_proj's first C rows (C its width; eps LATENT_NORM_EPS)."""
    latent = f"{name}.kv_a_norm.weight" in params
    if name == "ffn" or not (latent or cfg.qk_norm and cfg.qk_norm_projection):
        return []
    rms = dataclasses.replace(cfg, norm="rms", layer_norm_eps=LATENT_NORM_EPS if latent else cfg.layer_norm_eps)
    roles = (("q_a", inputs[0]), ("kv_a", inputs[0])) if latent else tuple(zip("qk", inputs, strict=False))
    found = []
    for role, x in roles:
        if f"{name}.{role}_norm.weight" not in params:  # V2's queries: one q_proj, no q_a_norm
            continue
        proj, weight = M.sub(params, f"{name}.{role}_proj"), params[f"{name}.{role}_norm.weight"]
        y = (x @ proj["weight"].T + proj.get("bias", 0.0))[..., : weight.shape[0]]  # (B, T, the norm's width)
        norm = unit_forward("norm", M.sub(params, f"{name}.{role}_norm"), rms, name)
        found.append(Stage(f"{prefix}{name}.{role}_norm", "norm", (y,), norm(y), valid, None, norm))
    return found


def layer_stages(params: dict, prefix: str, x, memory, cfg, decoder: bool, valid, p: Probe, attend=None) -> list:
    """The stages inside one layer (`decoder`: causal, cross-attending to `memory` where given), in forward order,
    float64, each with its rerun: its units ("self_attn", "self_attn_norm", ...) with the inputs each read and an
    attention's masks (a decoder's self-attention: causal, padding and the cross-attention's, maybe swapped); then the
    layer: post-norm, the last norm's output; pre-norm, x plus each sublayer's output. `attend` (name -> attention
    of query, key/value input and mask; a norm's name: a function of its input) puts a catalogue variant in a
    sublayer's or a norm's place, in the layer's rerun too."""
    found, first = [], x
    layer = layer_of(prefix)
    window = cfg.layer_window(layer)
    own = keep_mask(p, "self", window) if decoder else keep_mask(p, "src", window if cfg.layer_types else None)
    sublayers = [("self_attn", own)] + (
        [("cross_attn", keep_mask(p, "cross"))] if decoder and memory is not None else []
    )
    shared = cfg.parallel_residual and cfg.shared_norm  # Phi-2's block: the feed-forward reads the attention's norm
    added = []  # what each sublayer adds to the stream (pre-norm)
    for name, keep in [*sublayers, ("ffn", None)]:
        norm_name = "self_attn_norm" if shared else f"{name}_norm"
        norm = (attend or {}).get(norm_name) or unit_forward("norm", M.sub(params, norm_name), cfg, name)
        # the unit's input: OLMo 2's, ModernBERT's first attention's (first_attn_norm False) the stream itself
        opening = name == "self_attn" and prefix in ("", "encoder.layers.0.")  # an encoder layer alone, a stack's
        normed = cfg.input_norm and (cfg.first_attn_norm or not opening)
        h = norm(x) if cfg.norm_first and normed else x
        kind = "ffn" if name == "ffn" else "attention"
        inputs = (h,) if name == "ffn" else (h, h if name == "self_attn" else memory, keep)
        masks = None if name == "ffn" else {"self_attention": name == "self_attn"}
        if name == "self_attn" and decoder:
            masks = {"causal": True, "pad": keep_mask(p, "tgt"), "swap": keep_mask(p, "src")}
        rerun = (attend or {}).get(name) or unit_forward(kind, M.sub(params, name), cfg, name, layer, decoder)
        y = rerun(*inputs)
        unit = Stage(prefix + name, kind, inputs, y, valid, masks, rerun)
        if cfg.norm_first:
            if normed and not (shared and name == "ffn"):
                found.append(Stage(f"{prefix}{name}_norm", "norm", (x,), h, valid, None, norm))
            found += [*_projection_norms(params, name, inputs, cfg, prefix, valid), unit]
            if cfg.sandwich_norm:  # Gemma's: the sublayer's output normed before it joins the stream
                post = unit_forward("norm", M.sub(params, f"{name}_post_norm"), cfg, name)
                normed_y = post(y)
                found.append(Stage(f"{prefix}{name}_post_norm", "norm", (y,), normed_y, valid, None, post))
                y = normed_y
            added.append(y)
            x = x if cfg.parallel_residual else x + y  # parallel: every sublayer reads the layer's input
        else:
            s = x + y
            x = norm(s)
            found += [unit, Stage(f"{prefix}{name}_norm", "norm", (s,), x, valid, None, norm)]
    out = first + sum(added) if cfg.norm_first else x

    def whole(x, memory, attend=None):
        return layer_stages(params, prefix, x, memory, cfg, decoder, valid, p, attend)[-1].output

    return found + [Stage(prefix[:-1], "layer", (first, memory), out, valid, None, whole)]
