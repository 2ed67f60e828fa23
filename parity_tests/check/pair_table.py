"""The pairs check.pair judges and the exercise workbook grades: each reference pair's forward and backward, the
inputs it differentiates, its cases and how its backward is called.

Shape letters: B batch, H heads, T_q / T_k positions, D d_model, Dh head size, F d_ff, V vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from numpy_transformer import TransformerConfig
from numpy_transformer import attention as A
from numpy_transformer import layers as L
from numpy_transformer import loss as LS
from numpy_transformer import model as M

B, H, D, F, V = 2, 2, 8, 12, 11
LARGE = 1e3  # "large scores": exp overflows without the max subtraction (float64 at 709, float32 at 88)


@dataclass
class Pair:
    """One reference pair: its functions, the inputs differentiated, and its cases (name -> fn(rng) -> args)."""

    forward: Callable
    backward: Callable
    wrt: list
    cases: dict
    call_backward: Callable = lambda backward, dout, cache: backward(dout, cache)  # -> the gradients


def _mask(T_q, T_k, pad=1, full_row=False, causal=False):
    """(B, 1, T_q, T_k) True = may attend: the second sequence's last `pad` keys padded; optionally causal, and
    optionally a fully masked query row (the first sequence's row 0)."""
    keep = np.ones((B, 1, T_q, T_k), dtype=bool)
    if causal:
        keep &= np.tril(np.ones((T_q, T_k), dtype=bool))
    keep[1, :, :, T_k - pad :] = False
    keep[1, :, :, 0] = True
    if full_row:
        keep[0, :, 0, :] = False
    return keep


def _linear_params(rng, prefix_dims: dict) -> dict:
    params = {}
    for name, (o, i) in prefix_dims.items():
        params[f"{name}.weight"] = rng.standard_normal((o, i)) / math.sqrt(i)
        params[f"{name}.bias"] = 0.3 * rng.standard_normal(o)
    return params


def _attention_params(rng, prefix="") -> dict:
    return _linear_params(rng, {f"{prefix}{p}_proj": (D, D) for p in ("q", "k", "v", "out")})


def _heads(rng, T_q, T_k, scale=1, **mask) -> dict:
    """scaled_dot_product_attention's arguments: q (B, H, T_q, Dh) and k (B, H, T_k, Dh) times `scale`, v."""
    return dict(q=scale * _n(rng, B, H, T_q, 4), k=scale * _n(rng, B, H, T_k, 4), v=_n(rng, B, H, T_k, 4), **mask)


def _mha(rng, T_q, T_k, attn_mask) -> dict:
    """multi_head_attention's arguments: queries (B, T_q, D), keys and values (B, T_k, D), H heads."""
    params = _attention_params(rng)
    query, key, value = _n(rng, B, T_q, D), _n(rng, B, T_k, D), _n(rng, B, T_k, D)
    return dict(params=params, query=query, key=key, value=value, n_heads=H, attn_mask=attn_mask)


def _encoder_layer(rng, T, pad, norm_first, activation="relu") -> dict:
    """encoder_layer's arguments: x (B, T, D), the second sequence's last `pad` positions padded."""
    params = _attention_params(rng, "self_attn.") | _linear_params(rng, {"ffn.linear1": (F, D), "ffn.linear2": (D, F)})
    for norm in ("self_attn_norm", "ffn_norm"):
        params[f"{norm}.weight"] = 1 + 0.2 * rng.standard_normal(D)
        params[f"{norm}.bias"] = 0.2 * rng.standard_normal(D)
    config = TransformerConfig(d_model=D, n_heads=H, d_ff=F, norm_first=norm_first, activation=activation)
    return dict(params=params, x=_n(rng, B, T, D), mask=_mask(1, T, pad=pad)[:, :, :1], config=config)


def _feed_forward(rng, activation) -> dict:
    params = _linear_params(rng, {"linear1": (F, D), "linear2": (D, F)})
    return dict(params=params, x=_n(rng, B, 5, D), activation=activation)


def _cross_entropy(rng, **options) -> dict:
    """cross_entropy's arguments: logits (B, T, V) and targets, the second sequence's last two ignored."""
    logits, targets = 2 * _n(rng, B, 5, V), rng.integers(0, V, size=(B, 5))
    targets[1, -2:] = -100
    return dict(logits=logits, targets=targets, ignore_index=-100, **options)


def _n(rng, *shape):
    return rng.standard_normal(shape)


SOFTMAX = {
    "rows (B, H, T, T)": lambda r: dict(x=_n(r, B, H, 5, 5)),
    "padding mask": lambda r: dict(x=_n(r, B, H, 5, 6), mask=_mask(5, 6, pad=2)),
    "a fully masked row": lambda r: dict(x=_n(r, B, H, 4, 4), mask=_mask(4, 4, full_row=True)),
    "large scores": lambda r: dict(x=LARGE * _n(r, B, 3, 5)),
}
LINEAR = {
    "(B, T, D) -> (B, T, F)": lambda r: dict(x=_n(r, B, 5, D), weight=_n(r, F, D), bias=_n(r, F)),
    "(N, D) -> (N, V)": lambda r: dict(x=_n(r, 7, D), weight=_n(r, V, D), bias=_n(r, V)),
}
LAYER_NORM = {
    "(B, T, D)": lambda r: dict(x=_n(r, B, 5, D), weight=1 + 0.2 * _n(r, D), bias=_n(r, D), eps=1e-5),
    "offset and scaled rows": lambda r: dict(
        x=3 + 5 * _n(r, 3, 4, D), weight=1 + 0.2 * _n(r, D), bias=_n(r, D), eps=1e-3
    ),
}
DROPOUT = {
    "(B, T, D), p = 0.25": lambda r: dict(x=_n(r, B, 5, D), p=0.25, keep_mask=r.random((B, 5, D)) >= 0.25),
    "(N, F), p = 0.5": lambda r: dict(x=_n(r, 6, F), p=0.5, keep_mask=r.random((6, F)) >= 0.5),
}
EMBEDDING = {
    "repeated ids": lambda r: dict(ids=r.integers(0, 4, size=(B, 6)), weight=_n(r, V, D)),
    "one sequence": lambda r: dict(ids=r.integers(0, V, size=(1, 9)), weight=_n(r, V, D)),
}
SCALED_DOT_PRODUCT_ATTENTION = {
    "padding, T_q = T_k": lambda r: _heads(r, 5, 5, mask=_mask(5, 5, pad=2)),
    "T_q != T_k, causal": lambda r: _heads(r, 4, 6, mask=_mask(4, 6, causal=True)),
    "a fully masked row": lambda r: _heads(r, 4, 4, mask=_mask(4, 4, full_row=True)),
    "large scores": lambda r: _heads(r, 4, 4, scale=30),
}
MULTI_HEAD_ATTENTION = {
    "cross-attention, T_q != T_k, padding": lambda r: _mha(r, 4, 6, _mask(4, 6, pad=2)),
    "a fully masked row": lambda r: _mha(r, 5, 5, _mask(5, 5, full_row=True, causal=True)),
}
FEED_FORWARD = {"relu": lambda r: _feed_forward(r, "relu"), "gelu": lambda r: _feed_forward(r, "gelu")}
CROSS_ENTROPY = {
    "ignored targets": lambda r: _cross_entropy(r),
    "label smoothing": lambda r: _cross_entropy(r, label_smoothing=0.1),
}
ENCODER_LAYER = {
    "post-norm, padding": lambda r: _encoder_layer(r, 5, 2, False),
    "pre-norm, gelu": lambda r: _encoder_layer(r, 6, 1, True, "gelu"),
}

PAIRS = {
    "softmax": Pair(L.softmax_forward, L.softmax_backward, ["x"], SOFTMAX),
    "linear": Pair(L.linear_forward, L.linear_backward, ["x", "weight", "bias"], LINEAR),
    "layer_norm": Pair(L.layer_norm_forward, L.layer_norm_backward, ["x", "weight", "bias"], LAYER_NORM),
    "dropout": Pair(L.dropout_forward, L.dropout_backward, ["x"], DROPOUT),
    "embedding": Pair(L.embedding_forward, L.embedding_backward, ["weight"], EMBEDDING),
    "scaled_dot_product_attention": Pair(
        A.scaled_dot_product_attention_forward,
        A.scaled_dot_product_attention_backward,
        ["q", "k", "v"],
        SCALED_DOT_PRODUCT_ATTENTION,
        call_backward=lambda backward, dout, cache: tuple(backward(dout, cache))[:3],  # (dq, dk, dv), not dtable
    ),
    "multi_head_attention": Pair(
        A.multi_head_attention_forward,
        A.multi_head_attention_backward,
        ["query", "key", "value", "params"],
        MULTI_HEAD_ATTENTION,
    ),
    "feed_forward": Pair(L.feed_forward_forward, L.feed_forward_backward, ["x", "params"], FEED_FORWARD),
    "cross_entropy": Pair(
        LS.cross_entropy_forward,
        LS.cross_entropy_backward,
        ["logits"],
        CROSS_ENTROPY,
        call_backward=lambda backward, dout, cache: backward(cache, dout),
    ),
    "encoder_layer": Pair(M.encoder_layer_forward, M.encoder_layer_backward, ["x", "params"], ENCODER_LAYER),
}
