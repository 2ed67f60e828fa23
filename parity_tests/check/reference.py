"""The reference at each level (levels.py names each level's): its parameter shapes for a config, and a runner
run(params, p, cfg, dtype) -> (out, backward), backward(dout) -> (input gradients, parameter gradients) by name, on
a probe (params and floats already in `dtype`). Every call the judge makes into numpy_transformer's level math is
here, so a change of numpy_transformer's signatures or caches is met in this one file.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

import numpy_transformer as nt
from numpy_transformer import layers as L
from numpy_transformer import model as M
from numpy_transformer.scores import ScoreMod

from .probes import Probe, keep_mask

# -- parameter shapes: cfg -> {name: shape} -----------------------------------------------------------------------


def _linear(out_features: int, in_features: int, cfg, prefix: str) -> dict:
    """A linear's weight (out, in) and, unless the user's linears have none (cfg.bias False), its bias (out,)."""
    shapes = {f"{prefix}.weight": (out_features, in_features)}
    return shapes | ({f"{prefix}.bias": (out_features,)} if cfg.bias else {})


def no_shapes(cfg) -> dict:  # scaled dot-product attention: no parameters
    return {}


def attention_shapes(cfg) -> dict:
    D, kv = cfg.d_model, cfg.kv_heads * cfg.d_head  # the k and v width (grouped-query attention: < D)
    widths = {"q": D, "k": kv, "v": kv, "out": D}
    return {k: v for p in ("q", "k", "v", "out") for k, v in _linear(widths[p], D, cfg, f"{p}_proj").items()}


def layer_norm_shapes(cfg) -> dict:
    return {"weight": (cfg.d_model,), "bias": (cfg.d_model,)}


def rms_norm_shapes(cfg) -> dict:
    return {"weight": (cfg.d_model,)}


def feed_forward_shapes(cfg) -> dict:
    D, F = cfg.d_model, cfg.d_ff
    return _linear(F, D, cfg, "linear1") | _linear(D, F, cfg, "linear2")


def gated_feed_forward_shapes(cfg) -> dict:
    D, F = cfg.d_model, cfg.d_ff
    return _linear(F, D, cfg, "gate") | _linear(F, D, cfg, "linear1") | _linear(D, F, cfg, "linear2")


def positions_shapes(cfg) -> dict:
    return {"position_embedding.weight": (cfg.max_len, cfg.d_model)} if cfg.positional == "learned" else {}


def embedding_shapes(cfg) -> dict:
    return {"token_embedding.weight": (cfg.src_vocab_size, cfg.d_model)}


def _below(shapes: dict, prefix: str) -> dict:
    return {k[len(prefix) :]: v for k, v in shapes.items() if k.startswith(prefix)}


def layer_shapes(cfg, stack: str, decoder_only: bool = False) -> dict:
    """One layer of `stack` ("encoder", or "decoder": cross-attending unless decoder_only), names below it."""
    one = dataclasses.replace(cfg, n_encoder_layers=1, n_decoder_layers=1)
    return _below(nt.parameter_shapes(one, decoder_only=decoder_only), f"{stack}.layers.0.")


encoder_layer_shapes = functools.partial(layer_shapes, stack="encoder")
decoder_layer_shapes = functools.partial(layer_shapes, stack="decoder")
decoder_only_layer_shapes = functools.partial(layer_shapes, stack="decoder", decoder_only=True)


def stack_shapes(cfg, stack: str) -> dict:
    """A stack's layers (a decoder's each cross-attending to a memory) and, pre-norm, its final norm: no
    embeddings."""
    shapes = nt.parameter_shapes(cfg, encoder_only=stack == "encoder")
    return {k: v for k, v in shapes.items() if k.startswith((f"{stack}.layers.", f"{stack}.final_norm."))}


encoder_stack_shapes = functools.partial(stack_shapes, stack="encoder")
decoder_stack_shapes = functools.partial(stack_shapes, stack="decoder")

transformer_shapes = nt.parameter_shapes
transformer_lm_shapes = functools.partial(nt.parameter_shapes, decoder_only=True)
encoder_model_shapes = functools.partial(nt.parameter_shapes, encoder_only=True)


def decoder_shapes(cfg) -> dict:
    """The decoder stack of an encoder-decoder, before the output projection."""
    shapes = nt.parameter_shapes(dataclasses.replace(cfg, tie_embeddings=True))
    return {k: v for k, v in shapes.items() if k.startswith("decoder.")}


def stacks_shapes(cfg) -> dict:
    D = cfg.d_model
    shapes = {k: v for k, v in nt.parameter_shapes(cfg).items() if ".layers." in k}
    for stack in ("encoder", "decoder"):
        shapes |= {f"{stack}.final_norm.weight": (D,), f"{stack}.final_norm.bias": (D,)}
    return shapes


# -- forward and backward: run(params, p, cfg, dtype) -> (out, backward) ------------------------------------------


def _named(pair_backward, cache, inputs: tuple, weights: tuple | None = None):
    """backward(dout) -> ({input: gradient}, {parameter: gradient}) for a pair whose backward(dout, cache) returns
    the gradients of `inputs` in order (None: one the level does not take), then the parameters': one array for
    each name in `weights`, or (weights None) their dict."""

    def backward(dout):
        grads = pair_backward(dout, cache)
        dinputs = {n: g for n, g in zip(inputs, grads, strict=False) if n is not None}
        rest = grads[len(inputs) :]
        return dinputs, rest[0] if weights is None else dict(zip(weights, rest, strict=True))

    return backward


def run_heads(params: dict, p: Probe, cfg, dtype):
    q, k, v, mask = p.floats["q"], p.floats["k"], p.floats["v"], keep_mask(p, "src")
    out, cache = nt.scaled_dot_product_attention_forward(q, k, v, mask)
    return out, _named(nt.scaled_dot_product_attention_backward, cache, ("q", "k", "v", None), ())  # no T5 table


def run_attention(params: dict, p: Probe, cfg, dtype):
    q = p.floats["query"]
    k, v = (q, q) if p.self_attention else (p.floats["key"], p.floats["value"])
    rope = M.rope_for(cfg, q.shape[1], dtype)  # (cos, sin) with rotary positions, else None
    if rope is not None and not p.self_attention:
        raise ValueError("rotary positions need self-attention: one input, T_q = T_k")
    mask = None if p.causal else keep_mask(p, "src")
    rules = ScoreMod(causal=p.causal)  # the score rules: causal or not
    out, cache = nt.multi_head_attention_forward(
        params, q, k, v, cfg.n_heads, mask, n_kv_heads=cfg.n_kv_heads, rope=rope, mod=rules, cross=not p.self_attention
    )

    def backward(dout):
        dq, dk, dv, grads = nt.multi_head_attention_backward(dout, cache)
        if p.self_attention:
            return {"query": dq + dk + dv}, grads  # q = k = v: the three paths add
        return {"query": dq, "key": dk, "value": dv}, grads

    return out, backward


def run_norm(params: dict, p: Probe, cfg, dtype, kind: str):
    """x through numpy_transformer's norm pair of `kind` ("layer": weight and bias; "rms": weight)."""
    out, cache = L.norm_forward(params, p.floats["x"], kind, cfg.layer_norm_eps)
    return out, _named(L.norm_backward, cache, ("x",))


run_layer_norm = functools.partial(run_norm, kind="layer")
run_rms_norm = functools.partial(run_norm, kind="rms")


def run_feed_forward(params: dict, p: Probe, cfg, dtype):
    out, cache = L.feed_forward_forward(params, p.floats["x"], cfg.activation)
    return out, _named(L.feed_forward_backward, cache, ("x",))


def run_gated_feed_forward(params: dict, p: Probe, cfg, dtype):
    out, cache = L.gated_feed_forward_forward(params, p.floats["x"], cfg.activation)
    return out, _named(L.gated_feed_forward_backward, cache, ("x",))


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

    def backward(dout):
        return {}, {"token_embedding.weight": L.embedding_backward(dout, cache)}

    return out, backward


def run_encoder_layer(params: dict, p: Probe, cfg, dtype):
    out, cache = M.encoder_layer_forward(params, p.floats["x"], cfg, mask=keep_mask(p, "src"))
    return out, _named(M.encoder_layer_backward, cache, ("x",))


def run_decoder_only_layer(params: dict, p: Probe, cfg, dtype):
    rope = M.rope_for(cfg, p.floats["x"].shape[1], dtype)  # rotary (cos, sin), or None
    out, cache = M.decoder_layer_forward(params, p.floats["x"], None, cfg, rope=rope)
    return out, _named(M.decoder_layer_backward, cache, ("x", None))  # no memory


def run_decoder_layer(params: dict, p: Probe, cfg, dtype):
    x, memory = p.floats["x"], p.floats["memory"]
    out, cache = M.decoder_layer_forward(params, x, memory, cfg, memory_mask=keep_mask(p, "cross"))
    return out, _named(M.decoder_layer_backward, cache, ("x", "memory"))


def layers_forward(params: dict, x, cfg, mask=None, memory=None, cross=None) -> tuple:
    """A stack's layers on x (B, T, D), `params` below the stack: encoder layers (self-attention masked by
    `mask`), or, given a memory, decoder layers (causal self-attention, cross-attention masked by `cross`).
    Returns (out, the layers' caches, each layer's output)."""
    caches, outputs = [], []
    for i in range(cfg.n_decoder_layers if memory is not None else cfg.n_encoder_layers):
        layer = M.sub(params, f"layers.{i}")
        if memory is None:
            x, cache = M.encoder_layer_forward(layer, x, cfg, mask=mask)
        else:
            x, cache = M.decoder_layer_forward(layer, x, memory, cfg, memory_mask=cross)
        caches.append(cache)
        outputs.append(x)
    return x, caches, outputs


def layers_backward(dx, caches: list, decoder: bool) -> tuple:
    """Backward of layers_forward: (dx, dmemory (the decoder layers' add; None for encoder layers), grads)."""
    grads: dict = {}
    dmemory = None
    for i in reversed(range(len(caches))):
        if decoder:
            dx, dmemory_i, layer_grads = M.decoder_layer_backward(dx, caches[i])
            dmemory = dmemory_i if dmemory is None else dmemory + dmemory_i
        else:
            dx, layer_grads = M.encoder_layer_backward(dx, caches[i])
        grads |= M.prefixed(layer_grads, f"layers.{i}")
    return dx, dmemory, grads


def _stack_layers(params: dict, p: Probe, cfg, stack: str) -> tuple:
    """layers_forward of `stack` ("encoder" or "decoder", `params` holding it) on the probe's x: an encoder's
    self-attention masked by the padding, a decoder's layers cross-attending to the probe's memory."""
    below, x = M.sub(params, stack), p.floats["x"]
    if stack == "encoder":
        return layers_forward(below, x, cfg, mask=keep_mask(p, "src"))
    return layers_forward(below, x, cfg, memory=p.floats["memory"], cross=keep_mask(p, "cross"))


def run_single_stack(params: dict, p: Probe, cfg, dtype, stack: str):
    """x (B, T, D) through `stack`'s layers and final norm (pre-norm): nn.TransformerEncoder's, nn.TransformerDecoder's
    or the Annotated Transformer's Encoder(layer, N) and Decoder(layer, N), a decoder's layers each cross-attending to
    the memory (B, T_k, D, its padding masked)."""
    x, caches, _ = _stack_layers(params, p, cfg, stack)
    out, norm_cache = M.final_norm_forward(M.sub(params, stack), x, cfg)

    def backward(dout):
        dh, grads = M.final_norm_backward(dout, norm_cache)
        dx, dmemory, layer_grads = layers_backward(dh, caches, stack == "decoder")
        dinputs = {"x": dx} if stack == "encoder" else {"x": dx, "memory": dmemory}
        return dinputs, M.prefixed(grads | layer_grads, stack)

    return out, backward


def stack_activations(params: dict, p: Probe, cfg, stack: str) -> dict:
    """A stack's activations (float64): {"stack.layers.i": each layer's output}, and a decoder's memory ("encoder")."""
    outputs = _stack_layers(params, p, cfg, stack)[2]
    memory = {"encoder": p.floats["memory"]} if stack == "decoder" else {}
    return memory | {f"{stack}.layers.{i}": x for i, x in enumerate(outputs)}


run_encoder_stack = functools.partial(run_single_stack, stack="encoder")
run_decoder_stack = functools.partial(run_single_stack, stack="decoder")
encoder_stack_activations = functools.partial(stack_activations, stack="encoder")
decoder_stack_activations = functools.partial(stack_activations, stack="decoder")


def run_decoder(params: dict, p: Probe, cfg, dtype):
    decoder, memory = M.sub(params, "decoder"), p.floats["memory"]
    out, cache = M.decoder_forward(decoder, p.ids["tgt"], memory, cfg, memory_mask=keep_mask(p, "cross"))

    def backward(dout):
        dmemory, grads = M.decoder_backward(dout, cache)
        return {"memory": dmemory}, M.prefixed(grads, "decoder")

    return out, backward


def decoder_activations(params: dict, p: Probe, cfg) -> dict:
    """An encoder-decoder's decoder stack's activations (float64): its embeddings, then its stack's."""
    x = M.embed_forward(M.sub(params, "decoder"), p.ids["tgt"], cfg, None, "decoder")[0]
    embedded = dataclasses.replace(p, floats=p.floats | {"x": x})
    return {"decoder.embedding": x} | decoder_stack_activations(params, embedded, cfg)


def feed_forward_output(params: dict, x, cfg) -> np.ndarray:
    """A layer's feed-forward block (plain or gated, as cfg says) on x: its output only."""
    return M.ffn_forward(params, x, cfg, None, "ffn")[0]


def summed_embeddings(params: dict, ids, cfg) -> np.ndarray:
    """An encoder's token (+ position, + type) embeddings before BERT's embedding norm."""
    return M.embed_forward(params, ids, dataclasses.replace(cfg, embedding_norm=False))[0]


def model_runner(model_class, *inputs: str):
    """The runner of a whole model (nt.Transformer, ...) called on the probe's ids `inputs`; its backward keeps
    the model object (backward.model) for its activations."""

    def run(params: dict, p: Probe, cfg, dtype):
        model = model_class(cfg, dtype=dtype).eval()
        model.load_state_dict(params)
        out = model.forward(*(p.ids[n] for n in inputs))

        def backward(dout):
            model.zero_grad()
            model.backward(dout)
            return {}, dict(model.grads)

        backward.model = model  # type: ignore[attr-defined]  # the activations, for the first divergence
        return out, backward

    return run


run_transformer = model_runner(nt.Transformer, "src", "tgt")
run_transformer_lm = model_runner(nt.TransformerLM, "ids")
run_encoder_model = model_runner(nt.EncoderModel, "ids")


def run_stacks(params: dict, p: Probe, cfg, dtype):
    """torch.nn.Transformer's computation: the encoder stack on src, then the decoder stack on tgt cross-attending to
    its output (padding masked), each ending in a norm (nn.Transformer's always do); its backward, the same in
    reverse."""
    normed = dataclasses.replace(cfg, final_norm=True)
    source, target = (dataclasses.replace(p, floats={"x": p.floats[n]}) for n in ("src", "tgt"))
    memory, encoder_backward = run_encoder_stack(params, source, normed, dtype)
    target.floats["memory"] = memory
    out, decoder_backward = run_decoder_stack(params, target, normed, dtype)

    def backward(dout):
        dtarget, decoder_grads = decoder_backward(dout)
        dmemory = np.zeros_like(memory) if dtarget["memory"] is None else dtarget["memory"]
        dsource, encoder_grads = encoder_backward(dmemory)
        return {"src": dsource["x"], "tgt": dtarget["x"]}, encoder_grads | decoder_grads

    return out, backward
