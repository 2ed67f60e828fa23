"""The levels a user's module is judged at: what the reference computes there, its inputs, and how it is called.

Each level gives: the reference's parameter names and shapes for a config, a probe (random inputs with padding,
batch-first, as the reference takes them), the reference's forward and hand-written backward on that probe, and the
intermediate activations the user's submodules are matched against. Sizes are tiny: a check runs in a second.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

import numpy_transformer as nt
from numpy_transformer import layers as L
from numpy_transformer import model as M

from . import variants as V
from .level_table import STACKS_OF, named

COMPONENTS = named("component")
LAYERS = named("layer")  # the last: a GPT or Llama block, no memory
MODELS = named("model")  # "decoder": ids and a memory in
REFERENCES = COMPONENTS + LAYERS + ("encoder",) + MODELS  # "encoder" is judged as "encoder_model" (the same math)
# torch.nn.Transformer checked as "transformer": it has no embeddings and no output projection, and its encoder and
# decoder always end in a layer norm; judged as the reference's two stacks on embeddings, each with its final norm.
STACKS = named("stacks")[0]
B = 3  # three sequences: a (B, 1, T) mask read as (1, B, 1, T) against two heads fails instead of broadcasting


@dataclass
class Probe:
    """The reference's inputs, batch-first. `floats` are differentiated (their gradients compared), `ids` are
    token ids, `src_keep` / `tgt_keep` (B, T) say which positions are real (not padding), `causal` whether the
    level's self-attention is causal. `valid` (B, T_out) are the output positions compared."""

    floats: dict = field(default_factory=dict)
    ids: dict = field(default_factory=dict)
    src_keep: np.ndarray | None = None
    tgt_keep: np.ndarray | None = None
    causal: bool = False
    valid: np.ndarray | None = None
    self_attention: bool = False

    def astype(self, dtype) -> Probe:
        return dataclasses.replace(self, floats={k: v.astype(dtype) for k, v in self.floats.items()})


def _keep(rng, T: int, pad_rows: tuple = (1,), n_pad: int = 2) -> np.ndarray:
    """(B, T) True at real positions; the sequences in pad_rows end with n_pad padding positions."""
    keep = np.ones((B, T), dtype=bool)
    for b in pad_rows:
        keep[b, T - n_pad :] = False
    return keep


def _ids(rng, keep: np.ndarray, vocab: int, pad_id: int | None) -> np.ndarray:
    low = 0 if pad_id is None else pad_id + 1
    ids = rng.integers(low, vocab, size=keep.shape)
    if pad_id is not None:
        ids[~keep] = pad_id
    return ids


def probe(level: str, cfg, rng, self_attention: bool = False, causal: bool = False) -> Probe:
    """Random reference inputs for `level` (float64). Lengths: 5 queries, 6 keys (T_q != T_k where the level
    has two sequences); the second sequence ends with two padding positions. A causal multi-head attention
    (`causal`, self-attention that masks the future, as Llama's) has no padding mask: its third sequence ends
    with one padding position, whose output is not compared (causality hides it from every other)."""
    D, Dh, H = cfg.d_model, cfg.d_head, cfg.n_heads
    T_q, T_k = 5, 6
    p = Probe(self_attention=self_attention or causal, causal=causal)
    if level == "multi_head_attention" and causal:
        p.floats = {"query": rng.standard_normal((B, T_k, D))}
        p.tgt_keep = _keep(rng, T_k, (2,), 1)
        p.valid = p.tgt_keep
        return p
    if level == "scaled_dot_product_attention":
        p.floats = {
            "q": rng.standard_normal((B, H, T_q, Dh)),
            "k": rng.standard_normal((B, H, T_k, Dh)),
            "v": rng.standard_normal((B, H, T_k, Dh)),
        }
        p.src_keep = _keep(rng, T_k)
    elif level == "multi_head_attention":
        if self_attention:
            p.floats = {"query": rng.standard_normal((B, T_k, D))}
        else:
            p.floats = {n: rng.standard_normal((B, T, D)) for n, T in (("query", T_q), ("key", T_k), ("value", T_k))}
        p.src_keep = _keep(rng, T_k)
    elif level in (
        "layer_norm",
        "rms_norm",
        "feed_forward",
        "gated_feed_forward",
        "positional_encoding",
        "encoder_layer",
    ):
        p.floats = {"x": rng.standard_normal((B, T_k, D))}
        if level == "encoder_layer":
            p.src_keep = _keep(rng, T_k)
            p.valid = p.src_keep
    elif level == "decoder_only_layer":  # causal self-attention only: the last position of one sequence padding
        p.floats = {"x": rng.standard_normal((B, T_k, D))}
        p.tgt_keep, p.causal = _keep(rng, T_k, (2,), 1), True
        p.valid = p.tgt_keep
    elif level == "decoder_layer":
        p.floats = {"x": rng.standard_normal((B, T_q, D)), "memory": rng.standard_normal((B, T_k, D))}
        p.src_keep, p.tgt_keep, p.causal = _keep(rng, T_k), _keep(rng, T_q, (2,), 1), True
        p.valid = p.tgt_keep
    elif level == "embedding":
        p.ids = {"ids": rng.integers(0, cfg.src_vocab_size, size=(B, T_k))}
    elif level == STACKS:
        p.floats = {"src": rng.standard_normal((B, T_k, D)), "tgt": rng.standard_normal((B, T_q, D))}
        p.src_keep, p.tgt_keep, p.causal = _keep(rng, T_k), _keep(rng, T_q, (2,), 1), True
        p.valid = p.tgt_keep
    elif level == "transformer":
        p.src_keep, p.tgt_keep, p.causal = _keep(rng, T_k), _keep(rng, T_k, (2,), 1), True
        p.ids = {
            "src": _ids(rng, p.src_keep, cfg.src_vocab_size, cfg.pad_id),
            "tgt": _ids(rng, p.tgt_keep, cfg.tgt_vocab_size, cfg.pad_id),
        }
        p.valid = p.tgt_keep
    elif level == "transformer_lm":
        p.tgt_keep, p.causal = _keep(rng, T_k, (2,), 1 if cfg.pad_id is not None else 0), True
        p.ids = {"ids": _ids(rng, p.tgt_keep, cfg.tgt_vocab_size, cfg.pad_id)}
        p.valid = p.tgt_keep
    elif level == "decoder":
        p.floats = {"memory": rng.standard_normal((B, T_k, D))}
        p.src_keep, p.tgt_keep, p.causal = _keep(rng, T_k), _keep(rng, T_q, (2,), 1), True
        p.ids = {"tgt": _ids(rng, p.tgt_keep, cfg.tgt_vocab_size, cfg.pad_id)}
        p.valid = p.tgt_keep
    elif level == "encoder_model":
        p.src_keep = _keep(rng, T_k)
        p.ids = {"ids": _ids(rng, p.src_keep, cfg.src_vocab_size, cfg.pad_id)}
        p.valid = p.src_keep
    return p


def reference_shapes(level: str, cfg) -> dict:
    """The reference's parameter names and shapes at `level` (a component's names are those below its prefix)."""
    D, F = cfg.d_model, cfg.d_ff
    linear = {"weight": lambda o, i: (o, i), "bias": lambda o, i: (o,)}
    kinds = ("weight", "bias") if cfg.bias else ("weight",)  # a user without any bias: the reference has none
    if level == "multi_head_attention":
        kv = cfg.kv_heads * cfg.d_head  # the k and v projections' width (grouped-query attention: < D)
        widths = {"q": D, "k": kv, "v": kv, "out": D}
        return {f"{p}_proj.{w}": linear[w](widths[p], D) for p in ("q", "k", "v", "out") for w in kinds}
    if level == "layer_norm":
        return {"weight": (D,), "bias": (D,)}
    if level == "rms_norm":
        return {"weight": (D,)}
    if level == "feed_forward":
        return {f"linear{i}.{w}": linear[w](*((F, D) if i == 1 else (D, F))) for i in (1, 2) for w in kinds}
    if level == "gated_feed_forward":
        dims = {"gate": (F, D), "linear1": (F, D), "linear2": (D, F)}
        return {f"{n}.{w}": linear[w](*dims[n]) for n in dims for w in kinds}
    if level == "positional_encoding":
        return {"position_embedding.weight": (cfg.max_len, D)} if cfg.positional == "learned" else {}
    if level == "embedding":
        return {"token_embedding.weight": (cfg.src_vocab_size, D)}
    if level == "decoder_only_layer":
        shapes = nt.parameter_shapes(dataclasses.replace(cfg, n_decoder_layers=1), decoder_only=True)
        return {k[len("decoder.layers.0.") :]: v for k, v in shapes.items() if k.startswith("decoder.layers.0.")}
    if level in LAYERS:
        shapes = nt.parameter_shapes(dataclasses.replace(cfg, n_encoder_layers=1, n_decoder_layers=1))
        prefix = "encoder.layers.0." if level == "encoder_layer" else "decoder.layers.0."
        return {k[len(prefix) :]: v for k, v in shapes.items() if k.startswith(prefix)}
    if level == "decoder":  # the decoder stack of an encoder-decoder, before the output projection
        return {
            k: v
            for k, v in nt.parameter_shapes(dataclasses.replace(cfg, tie_embeddings=True)).items()
            if k.startswith("decoder.")
        }
    if level in MODELS:
        return nt.parameter_shapes(cfg, level == "transformer_lm", level == "encoder_model")
    if level == STACKS:
        shapes = {k: v for k, v in nt.parameter_shapes(cfg).items() if ".layers." in k}
        for stack in STACKS_OF[STACKS]:
            shapes |= {f"{stack}.final_norm.weight": (D,), f"{stack}.final_norm.bias": (D,)}
        return shapes
    return {}


def init_reference(shapes: dict, rng, zero: list) -> dict:
    """Random float64 reference parameters: weights ~ N(0, 1/fan_in), norm scales near 1, biases small;
    the biases the user's linears lack (`zero`) held at zero."""
    params = {}
    for name, shape in shapes.items():
        if len(shape) == 2:
            params[name] = rng.standard_normal(shape) / math.sqrt(shape[1] if "embedding" not in name else 1.0)
        elif name.endswith("norm.weight") or name == "weight":
            params[name] = 1.0 + 0.2 * rng.standard_normal(shape)
        else:
            params[name] = 0.2 * rng.standard_normal(shape)
        if name in zero:
            params[name] = np.zeros(shape)
    return params


def keep_mask(p: Probe, kind: str) -> np.ndarray | None:
    """The reference's boolean mask (True = may attend) for one attention, broadcastable to (B, H, T_q, T_k):
    kind "src" (padding of the keys), "self" (the decoder's: causal), "cross" (the source's padding)."""
    if kind in ("src", "cross"):
        return None if p.src_keep is None else p.src_keep[:, None, None, :]
    if kind == "self":
        T = p.tgt_keep.shape[1] if p.tgt_keep is not None else p.floats["x"].shape[1]
        return np.tril(np.ones((T, T), dtype=bool))[None, None]  # query i sees keys j <= i
    raise ValueError(kind)


def run_reference(level: str, params: dict, p: Probe, cfg, dtype):
    """The reference's forward at `level` on probe `p`, in `dtype`. Returns (out, backward), where
    backward(dout) -> (input gradients by name, parameter gradients by name), all from the hand-written
    backward passes."""
    params = {k: v.astype(dtype) for k, v in params.items()}
    p = p.astype(dtype)
    f = p.floats
    if level == "scaled_dot_product_attention":
        out, cache = nt.scaled_dot_product_attention_forward(f["q"], f["k"], f["v"], keep_mask(p, "src"))

        def backward(dout):
            dq, dk, dv, _ = nt.scaled_dot_product_attention_backward(dout, cache)
            return {"q": dq, "k": dk, "v": dv}, {}

    elif level == "multi_head_attention":
        q = f["query"]
        k, v = (q, q) if p.self_attention else (f["key"], f["value"])
        rope = M.rope_for(cfg, q.shape[1], dtype)  # (cos, sin) with rotary positions, else None
        if rope is not None and not p.self_attention:
            raise ValueError("rotary positions need self-attention: one input, T_q = T_k")
        mask = None if p.causal else keep_mask(p, "src")
        out, cache = nt.multi_head_attention_forward(
            params, q, k, v, cfg.n_heads, mask, n_kv_heads=cfg.n_kv_heads, rope=rope, is_causal=p.causal
        )

        def backward(dout):
            dq, dk, dv, grads = nt.multi_head_attention_backward(dout, cache)
            if p.self_attention:
                return {"query": dq + dk + dv}, grads  # q = k = v: the three paths add
            return {"query": dq, "key": dk, "value": dv}, grads

    elif level == "layer_norm":
        out, cache = L.layer_norm_forward(f["x"], params["weight"], params["bias"], cfg.layer_norm_eps)

        def backward(dout):
            dx, dw, db = L.layer_norm_backward(dout, cache)
            return {"x": dx}, {"weight": dw, "bias": db}

    elif level == "rms_norm":
        out, cache = L.rms_norm_forward(f["x"], params["weight"], cfg.layer_norm_eps)

        def backward(dout):
            dx, dw = L.rms_norm_backward(dout, cache)
            return {"x": dx}, {"weight": dw}

    elif level == "feed_forward":
        out, cache = L.feed_forward_forward(params, f["x"], cfg.activation)

        def backward(dout):
            dx, grads = L.feed_forward_backward(dout, cache)
            return {"x": dx}, grads

    elif level == "gated_feed_forward":
        out, cache = L.gated_feed_forward_forward(params, f["x"], cfg.activation)

        def backward(dout):
            dx, grads = L.gated_feed_forward_backward(dout, cache)
            return {"x": dx}, grads

    elif level == "positional_encoding":
        table = params.get("position_embedding.weight")
        if table is None:
            table = L.sinusoidal_table(cfg.max_len, cfg.d_model, dtype, cfg.sinusoid_layout)
        out, cache = L.add_positions_forward(f["x"], table)

        def backward(dout):
            dx, dtable = L.add_positions_backward(dout, cache)
            return {"x": dx}, ({"position_embedding.weight": dtable} if params else {})

    elif level == "embedding":
        scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
        out, cache = L.embedding_forward(p.ids["ids"], params["token_embedding.weight"], scale)

        def backward(dout):
            return {}, {"token_embedding.weight": L.embedding_backward(dout, cache)}

    elif level == "encoder_layer":
        out, cache = M.encoder_layer_forward(params, f["x"], cfg, mask=keep_mask(p, "src"))

        def backward(dout):
            dx, grads = M.encoder_layer_backward(dout, cache)
            return {"x": dx}, grads

    elif level == "decoder_only_layer":
        rope = M.rope_for(cfg, f["x"].shape[1], dtype)  # rotary (cos, sin), or None
        out, cache = M.decoder_layer_forward(params, f["x"], None, cfg, rope=rope)

        def backward(dout):
            dx, _, grads = M.decoder_layer_backward(dout, cache)
            return {"x": dx}, grads

    elif level == "decoder_layer":
        out, cache = M.decoder_layer_forward(params, f["x"], f["memory"], cfg, memory_mask=keep_mask(p, "cross"))

        def backward(dout):
            dx, dmemory, grads = M.decoder_layer_backward(dout, cache)
            return {"x": dx, "memory": dmemory}, grads

    elif level == STACKS:
        return _run_stacks(params, p, cfg)
    elif level == "decoder":
        out, cache = M.decoder_forward(
            M.sub(params, "decoder"), p.ids["tgt"], f["memory"], cfg, memory_mask=keep_mask(p, "cross")
        )

        def backward(dout):
            dmemory, grads = M.decoder_backward(dout, cache)
            return {"memory": dmemory}, M.prefixed(grads, "decoder")
    else:
        model = {"transformer": nt.Transformer, "transformer_lm": nt.TransformerLM, "encoder_model": nt.EncoderModel}
        model = model[level](cfg, dtype=dtype).eval()
        model.load_state_dict(params)
        out = model.forward(p.ids["src"], p.ids["tgt"]) if level == "transformer" else model.forward(p.ids["ids"])

        def backward(dout):
            model.zero_grad()
            model.backward(dout)
            return {}, dict(model.grads)

        backward.model = model
    return out, backward


def _run_stacks(params: dict, p: Probe, cfg):
    """torch.nn.Transformer's computation from the reference's pairs: encoder layers, a layer norm, decoder layers
    (cross-attending to the normed memory, padding masked), a layer norm; and its backward, the same in reverse."""
    mask, eps = keep_mask(p, "src"), cfg.layer_norm_eps
    x, encoder_caches = p.floats["src"], []
    for i in range(cfg.n_encoder_layers):
        x, cache = M.encoder_layer_forward(M.sub(params, f"encoder.layers.{i}"), x, cfg, mask=mask)
        encoder_caches.append(cache)
    memory, memory_norm = L.layer_norm_forward(
        x, params["encoder.final_norm.weight"], params["encoder.final_norm.bias"], eps
    )
    y, decoder_caches = p.floats["tgt"], []
    for i in range(cfg.n_decoder_layers):
        y, cache = M.decoder_layer_forward(M.sub(params, f"decoder.layers.{i}"), y, memory, cfg, memory_mask=mask)
        decoder_caches.append(cache)
    out, out_norm = L.layer_norm_forward(y, params["decoder.final_norm.weight"], params["decoder.final_norm.bias"], eps)

    def backward(dout):
        grads = {}
        dy, grads["decoder.final_norm.weight"], grads["decoder.final_norm.bias"] = L.layer_norm_backward(dout, out_norm)
        dmemory = np.zeros_like(memory)
        for i in reversed(range(cfg.n_decoder_layers)):
            dy, dmemory_i, layer_grads = M.decoder_layer_backward(dy, decoder_caches[i])
            dmemory += dmemory_i  # every decoder layer reads the same memory: the gradients add
            grads |= M.prefixed(layer_grads, f"decoder.layers.{i}")
        dx, grads["encoder.final_norm.weight"], grads["encoder.final_norm.bias"] = L.layer_norm_backward(
            dmemory, memory_norm
        )
        for i in reversed(range(cfg.n_encoder_layers)):
            dx, layer_grads = M.encoder_layer_backward(dx, encoder_caches[i])
            grads |= M.prefixed(layer_grads, f"encoder.layers.{i}")
        return {"src": dx, "tgt": dy}, grads

    return out, backward


def layer_trace(params: dict, x, memory, self_keep, cross_keep, cfg, decoder: bool) -> list:
    """The reference's intermediate activations inside one layer, in forward order, float64: a list of
    (unit, kind, inputs, output) with unit the name below the layer ("self_attn", "self_attn_norm", ...),
    kind "attention", "norm" or "ffn", and inputs what that unit read (for attention: query, key/value, mask)."""
    trace = []
    sublayers = [("self_attn", self_keep)] + ([("cross_attn", cross_keep)] if decoder and memory is not None else [])
    sublayers.append(("ffn", None))
    for name, keep in sublayers:
        weights = M.sub(params, f"{name}_norm")

        def norm(y, weights=weights):
            if cfg.norm == "rms":
                return V.rms_norm(y, weights["weight"], cfg.layer_norm_eps)
            return V.layer_norm(y, weights["weight"], weights["bias"], cfg.layer_norm_eps)

        def apply(h, name=name, keep=keep):
            if name == "ffn":
                y = M.ffn_forward(M.sub(params, "ffn"), h, cfg, None, "ffn")[0]
                trace.append((name, "ffn", (h,), y))
                return y
            kv = h if name == "self_attn" else memory
            rope = V.rope_knobs(cfg, rotary=name == "self_attn")
            y = V.multi_head_attention(M.sub(params, name), h, kv, kv, cfg.n_heads, keep, **rope)
            trace.append((name, "attention", (h, kv, keep), y))
            return y

        if cfg.norm_first:
            h = norm(x)
            trace.append((f"{name}_norm", "norm", (x,), h))
            x = x + apply(h)
        else:
            s = x + apply(x)
            x = norm(s)
            trace.append((f"{name}_norm", "norm", (s,), x))
    return trace
