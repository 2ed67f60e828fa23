"""Cases that compare the NumPy reference with PyTorch's own built-in layers.

A parameter dict (the names of docs/conventions.md) is mapped onto nn.MultiheadAttention, nn.LayerNorm,
nn.TransformerEncoderLayer and nn.TransformerDecoderLayer (batch_first; q, k and v concatenated
into in_proj_weight; norm1/norm2/norm3 for our self_attn_norm/cross_attn_norm/ffn_norm). torch's
boolean masks mean True = "masked out", the opposite of ours, so every mask is inverted on the way.
Agreement here shows that both of our implementations compute the canonical model.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from numpy_transformer import TransformerConfig
from numpy_transformer import attention as A
from numpy_transformer import model as M
from parity_tests.components import Case, make_case

B, T, S, D, H, FF = 2, 5, 6, 8, 2, 12
TORCH_ACTIVATION = {"relu": "relu", "gelu": "gelu", "gelu_tanh": functools.partial(F.gelu, approximate="tanh")}


def random_params(shapes: dict, dtype, rng) -> dict:
    """Random weights (norms around 1, biases non-zero, so that every term of the math is exercised)."""
    params = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            value = 1 + 0.3 * rng.standard_normal(shape)
        elif name.endswith(".weight"):
            value = rng.standard_normal(shape) / math.sqrt(shape[-1])
        else:
            value = 0.3 * rng.standard_normal(shape)
        params[name] = value.astype(dtype)
    return params


def layer_shapes(config: TransformerConfig, cross: bool) -> dict:
    """Parameter shapes of one encoder (cross=False) or decoder layer, names below the layer."""
    prefix = "decoder.layers.0." if cross else "encoder.layers.0."
    return {k[len(prefix) :]: v for k, v in M.parameter_shapes(config).items() if k.startswith(prefix)}


def in_proj(params: dict, prefix: str) -> dict:
    """Our q/k/v/out projections as nn.MultiheadAttention's parameters (torch.cat: gradients flow back)."""
    return {
        f"{prefix}in_proj_weight": torch.cat([params[f"{prefix}{p}_proj.weight"] for p in "qkv"]),
        f"{prefix}in_proj_bias": torch.cat([params[f"{prefix}{p}_proj.bias"] for p in "qkv"]),
        f"{prefix}out_proj.weight": params[f"{prefix}out_proj.weight"],
        f"{prefix}out_proj.bias": params[f"{prefix}out_proj.bias"],
    }


def builtin_layer_params(params: dict, cross: bool) -> dict:
    """The state-dict names -> nn.TransformerEncoderLayer (cross=False) / nn.TransformerDecoderLayer names."""
    mapped = in_proj(params, "self_attn.")
    norms = {"self_attn_norm": "norm1", "ffn_norm": "norm2"}
    if cross:
        norms = {"self_attn_norm": "norm1", "cross_attn_norm": "norm2", "ffn_norm": "norm3"}
        renamed = {k.replace("cross_attn.", "multihead_attn."): v for k, v in params.items()}
        mapped |= in_proj(renamed, "multihead_attn.")
    for ours, theirs in norms.items():
        mapped[f"{theirs}.weight"], mapped[f"{theirs}.bias"] = params[f"{ours}.weight"], params[f"{ours}.bias"]
    for w in ("weight", "bias"):
        mapped[f"linear1.{w}"], mapped[f"linear2.{w}"] = params[f"ffn.linear1.{w}"], params[f"ffn.linear2.{w}"]
    return mapped


def padding(length: int, valid: list[int]) -> np.ndarray:
    """(B, length) bool, True where a position holds a real token (the first valid[b] positions)."""
    return np.arange(length)[None, :] < np.array(valid)[:, None]


def case_nn_multihead_attention(dtype, rng, kind: str = "cross") -> Case:
    """Self (causal + padding) or cross (padding, T_q != T_k) attention vs nn.MultiheadAttention."""
    query = rng.standard_normal((B, T, D)).astype(dtype)
    memory = query if kind == "self" else rng.standard_normal((B, S, D)).astype(dtype)
    mask = padding(memory.shape[1], [memory.shape[1], 3])[:, None, None, :]  # (B, 1, 1, T_k), True = may attend
    if kind == "self":
        mask = mask & np.tril(np.ones((T, T), dtype=bool))  # causal as well: (B, 1, T, T)
    shapes = {k: v for k, v in layer_shapes(TransformerConfig(d_model=D, n_heads=H), False).items() if "attn." in k}
    params = {k[len("self_attn.") :]: v for k, v in random_params(shapes, dtype, rng).items()}
    module = nn.MultiheadAttention(D, H, batch_first=True)

    def torch_fn(params, query, key, value, n_heads, attn_mask):
        module.to(device=query.device, dtype=query.dtype)
        T_q, T_k = query.shape[1], key.shape[1]
        full = attn_mask.expand(B, H, T_q, T_k).reshape(B * H, T_q, T_k)
        kwargs = {"attn_mask": ~full, "need_weights": False}  # torch: True = masked out
        return functional_call(module, in_proj(params, ""), (query, key, value), kwargs)[0]

    args = dict(params=params, query=query, key=memory.copy(), value=memory.copy(), n_heads=H, attn_mask=mask)
    return Case(
        A.multi_head_attention_forward,
        A.multi_head_attention_backward,
        args,
        ["query", "key", "value", "params"],
        torch_fn,
    )


def case_nn_layer_norm(dtype, rng) -> Case:
    case = make_case("layer_norm", dtype, seed=int(rng.integers(1 << 16)))
    module = nn.LayerNorm(D, eps=case.args["eps"])

    def torch_fn(x, weight, bias, eps):
        module.to(device=x.device, dtype=x.dtype)
        return functional_call(module, {"weight": weight, "bias": bias}, (x,))

    case.torch_fn = torch_fn
    return case


def case_nn_encoder_layer(dtype, rng, norm_first: bool = False, activation: str = "relu") -> Case:
    """Our encoder layer (padding mask) vs nn.TransformerEncoderLayer (src_key_padding_mask)."""
    config = TransformerConfig(d_model=D, n_heads=H, d_ff=FF, activation=activation, norm_first=norm_first)
    params = random_params(layer_shapes(config, cross=False), dtype, rng)
    x = rng.standard_normal((B, T, D)).astype(dtype)
    module = nn.TransformerEncoderLayer(
        D,
        H,
        FF,
        dropout=0.0,
        activation=TORCH_ACTIVATION[activation],
        batch_first=True,
        norm_first=norm_first,
        layer_norm_eps=config.layer_norm_eps,
    )

    def torch_fn(params, x, mask, config):
        module.to(device=x.device, dtype=x.dtype)
        kwargs = {"src_key_padding_mask": ~mask[:, 0, 0, :]}  # (B, T), True = padding
        return functional_call(module, builtin_layer_params(params, cross=False), (x,), kwargs)

    args = dict(params=params, x=x, mask=padding(T, [T, 3])[:, None, None, :], config=config)
    return Case(M.encoder_layer_forward, M.encoder_layer_backward, args, ["x", "params"], torch_fn)


def case_nn_decoder_layer(dtype, rng, norm_first: bool = False, activation: str = "relu") -> Case:
    """Our decoder layer (causal + padding, cross-attention with source padding) vs nn.TransformerDecoderLayer."""
    config = TransformerConfig(d_model=D, n_heads=H, d_ff=FF, activation=activation, norm_first=norm_first)
    params = random_params(layer_shapes(config, cross=True), dtype, rng)
    x = rng.standard_normal((B, T, D)).astype(dtype)
    memory = rng.standard_normal((B, S, D)).astype(dtype)
    tgt_valid, src_valid = padding(T, [T, 3]), padding(S, [4, S])
    self_mask = np.tril(np.ones((T, T), dtype=bool))[None, None] & tgt_valid[:, None, None, :]  # (B, 1, T, T)
    module = nn.TransformerDecoderLayer(
        D,
        H,
        FF,
        dropout=0.0,
        activation=TORCH_ACTIVATION[activation],
        batch_first=True,
        norm_first=norm_first,
        layer_norm_eps=config.layer_norm_eps,
    )

    def torch_fn(params, x, memory, self_mask, memory_mask, config):
        module.to(device=x.device, dtype=x.dtype)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        kwargs = {
            "tgt_mask": ~causal,
            "tgt_key_padding_mask": ~self_mask[:, 0, -1, :],
            "memory_key_padding_mask": ~memory_mask[:, 0, 0, :],
        }
        return functional_call(module, builtin_layer_params(params, cross=True), (x, memory), kwargs)

    args = dict(
        params=params, x=x, memory=memory, self_mask=self_mask, memory_mask=src_valid[:, None, None, :], config=config
    )
    return Case(M.decoder_layer_forward, M.decoder_layer_backward, args, ["x", "memory", "params"], torch_fn)


BUILTIN_CASES = {
    "nn.MultiheadAttention (self)": functools.partial(case_nn_multihead_attention, kind="self"),
    "nn.MultiheadAttention (cross)": functools.partial(case_nn_multihead_attention, kind="cross"),
    "nn.LayerNorm": case_nn_layer_norm,
    "nn.TransformerEncoderLayer (post-norm, relu)": case_nn_encoder_layer,
    "nn.TransformerEncoderLayer (pre-norm, gelu)": functools.partial(
        case_nn_encoder_layer, norm_first=True, activation="gelu"
    ),
    "nn.TransformerDecoderLayer (post-norm, relu)": case_nn_decoder_layer,
    "nn.TransformerDecoderLayer (pre-norm, gelu)": functools.partial(
        case_nn_decoder_layer, norm_first=True, activation="gelu"
    ),
}
