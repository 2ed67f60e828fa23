"""Scaled dot-product attention and multi-head attention, forward and backward.

Shape letters: B batch, H heads, T_q query positions, T_k key positions, D d_model, Dh = D / H.
Masks are boolean, broadcastable to (B, H, T_q, T_k), and True means "may attend" (the convention
of torch.nn.functional.scaled_dot_product_attention).
"""

from __future__ import annotations

import math

import numpy as np

from .layers import (
    Dropout,
    dropout_backward,
    dropout_forward,
    linear_backward,
    linear_forward,
    softmax_backward,
    softmax_forward,
)
from .validation import check_float_array, check_ndim


def scaled_dot_product_attention_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    dropout_p: float = 0.0,
    keep_mask: np.ndarray | None = None,
):
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(Dh)) V, the paper's equation (1).

    q (B, H, T_q, Dh), k and v (B, H, T_k, Dh), mask broadcastable to (B, H, T_q, T_k).
    keep_mask (B, H, T_q, T_k) drops attention probabilities (inverted dropout, rate dropout_p).
    Returns out (B, H, T_q, Dh) and a cache whose "probs" are the probabilities before dropout.
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.swapaxes(-1, -2)) * scale  # (B, H, T_q, T_k)
    probs, softmax_cache = softmax_forward(scores, mask)
    dropped, drop_cache = dropout_forward(probs, dropout_p, keep_mask)
    out = dropped @ v  # (B, H, T_q, Dh)
    return out, {
        "q": q,
        "k": k,
        "v": v,
        "scale": scale,
        "probs": probs,
        "dropped": dropped,
        "softmax": softmax_cache,
        "dropout": drop_cache,
    }


def scaled_dot_product_attention_backward(dout: np.ndarray, cache):
    """Gradients of out = drop(P) V,  P = softmax(S),  S = Q K^T * s  (s = 1/sqrt(Dh)).

    dV = drop(P)^T dout                      (B, H, T_k, Dh)
    dP = drop^T (dout V^T)                   (B, H, T_q, T_k)
    dS = P * (dP - rowsum(dP * P))           softmax backward; zero where masked
    dQ = s * dS K                            (B, H, T_q, Dh)
    dK = s * dS^T Q                          (B, H, T_k, Dh)
    """
    q, k, v, scale = cache["q"], cache["k"], cache["v"], cache["scale"]
    dv = cache["dropped"].swapaxes(-1, -2) @ dout  # (B, H, T_k, Dh)
    dprobs = dout @ v.swapaxes(-1, -2)  # (B, H, T_q, T_k)
    dprobs = dropout_backward(dprobs, cache["dropout"])
    dscores = softmax_backward(dprobs, cache["softmax"])
    dscores *= scale
    dq = dscores @ k  # (B, H, T_q, Dh)
    dk = dscores.swapaxes(-1, -2) @ q  # (B, H, T_k, Dh)
    return dq, dk, dv


def split_heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    """(B, T, D) -> (B, H, T, Dh): head h takes columns h*Dh:(h+1)*Dh."""
    B, T, D = x.shape
    return x.reshape(B, T, n_heads, D // n_heads).transpose(0, 2, 1, 3)  # (B, H, T, Dh)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(B, H, T, Dh) -> (B, T, D), the inverse of split_heads."""
    B, H, T, Dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * Dh)  # (B, T, D)


MHA_KEYS = tuple(f"{p}_proj.{w}" for p in ("q", "k", "v", "out") for w in ("weight", "bias"))


def multi_head_attention_forward(
    params: dict,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    n_heads: int,
    attn_mask: np.ndarray | None = None,
    dropout: Dropout | None = None,
    site: str = "attn",
):
    """MultiHead(Q, K, V) = Concat(head_1..head_H) W_O^T,  head_h = Attention(Q W_Q,h^T, K W_K,h^T, V W_V,h^T).

    params: q_proj.weight (D, D), q_proj.bias (D,), ... out_proj.bias (D,).
    query (B, T_q, D), key and value (B, T_k, D); attn_mask broadcastable to (B, H, T_q, T_k),
    True = may attend. Self-attention passes the same array as query, key and value.
    `dropout` (when given) drops attention probabilities at site f"{site}.dropout".
    Returns out (B, T_q, D) and a cache; cache["attn"]["probs"] holds the probabilities (B, H, T_q, T_k).
    """
    _check_attention_inputs(query, key, value, n_heads, attn_mask)
    _check_attention_params(params, query.shape[-1], query.dtype)
    q, q_cache = linear_forward(query, params["q_proj.weight"], params["q_proj.bias"])  # (B, T_q, D)
    k, k_cache = linear_forward(key, params["k_proj.weight"], params["k_proj.bias"])  # (B, T_k, D)
    v, v_cache = linear_forward(value, params["v_proj.weight"], params["v_proj.bias"])  # (B, T_k, D)
    q, k, v = split_heads(q, n_heads), split_heads(k, n_heads), split_heads(v, n_heads)  # (B, H, T, Dh)
    keep_mask = None
    if dropout is not None:
        B, H, T_q, T_k = q.shape[0], n_heads, q.shape[2], k.shape[2]
        keep_mask = dropout.keep_mask(f"{site}.dropout", (B, H, T_q, T_k))
    context, attn_cache = scaled_dot_product_attention_forward(
        q, k, v, attn_mask, dropout.p if dropout is not None else 0.0, keep_mask
    )  # (B, H, T_q, Dh)
    context = merge_heads(context)  # (B, T_q, D)
    out, out_cache = linear_forward(context, params["out_proj.weight"], params["out_proj.bias"])
    return out, {"q": q_cache, "k": k_cache, "v": v_cache, "attn": attn_cache, "out": out_cache}


def multi_head_attention_backward(dout: np.ndarray, cache):
    """The forward in reverse:

        dcontext, dW_O, db_O = linear backward of out = context W_O^T + b_O
        dq, dk, dv (per head) = attention backward on dcontext split into heads
        dquery = dq W_Q,  dW_Q = dq^T query,  db_Q = sum(dq)   (likewise for key and value)

    dout (B, T_q, D). Returns dquery (B, T_q, D), dkey (B, T_k, D), dvalue (B, T_k, D) and the
    grads dict keyed like params. For self-attention the caller adds the three input gradients.
    The key bias gets zero gradient in exact arithmetic: q.b_K is shared by every key of a row,
    and softmax ignores a shift shared by a whole row.
    """
    grads = {}
    n_heads = cache["attn"]["q"].shape[1]
    dcontext, grads["out_proj.weight"], grads["out_proj.bias"] = linear_backward(dout, cache["out"])
    dq, dk, dv = scaled_dot_product_attention_backward(split_heads(dcontext, n_heads), cache["attn"])
    dquery, grads["q_proj.weight"], grads["q_proj.bias"] = linear_backward(merge_heads(dq), cache["q"])
    dkey, grads["k_proj.weight"], grads["k_proj.bias"] = linear_backward(merge_heads(dk), cache["k"])
    dvalue, grads["v_proj.weight"], grads["v_proj.bias"] = linear_backward(merge_heads(dv), cache["v"])
    return dquery, dkey, dvalue, {k: grads[k] for k in MHA_KEYS}


def _check_attention_params(params: dict, D: int, dtype) -> None:
    missing = [k for k in MHA_KEYS if k not in params]
    if missing:
        raise ValueError(f"params is missing {missing}; expected the keys {list(MHA_KEYS)}")
    for k in MHA_KEYS:
        expected = (D, D) if k.endswith("weight") else (D,)
        if params[k].shape != expected:
            raise ValueError(f"params[{k!r}] has shape {params[k].shape}, expected {expected} for d_model={D}")
        if params[k].dtype != dtype:
            raise TypeError(f"params[{k!r}] has dtype {params[k].dtype}, expected the inputs' dtype {dtype}")


def _check_attention_inputs(query, key, value, n_heads, attn_mask) -> None:
    for name, x in (("query", query), ("key", key), ("value", value)):
        check_float_array(name, x)
        check_ndim(name, x, 3, "(B, T, D)")
    B, T_q, D = query.shape
    if key.shape[0] != B or value.shape[0] != B:
        raise ValueError(
            f"batch sizes disagree: query has B={B}, key has B={key.shape[0]}, value has B={value.shape[0]}"
        )
    if key.shape != value.shape:
        raise ValueError(f"key and value must have the same shape (B, T_k, D), got {key.shape} and {value.shape}")
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise TypeError(f"query, key and value must share one dtype, got {query.dtype}, {key.dtype} and {value.dtype}")
    if key.shape[2] != D:
        raise ValueError(f"key must have d_model={D} features like query, got shape {key.shape}")
    if isinstance(n_heads, bool) or not isinstance(n_heads, (int, np.integer)) or n_heads < 1:
        raise ValueError(f"n_heads must be a positive int, got {n_heads!r}")
    if D % n_heads != 0:
        raise ValueError(f"d_model must be divisible by n_heads: got d_model={D}, n_heads={n_heads}")
    if attn_mask is not None:
        attn_mask = np.asarray(attn_mask)
        if attn_mask.dtype != np.bool_:
            raise TypeError(f"attn_mask must be a bool array (True = may attend), got dtype {attn_mask.dtype}")
        target = (B, n_heads, T_q, key.shape[1])
        try:
            np.broadcast_shapes(attn_mask.shape, target)
        except ValueError:
            raise ValueError(
                f"attn_mask of shape {attn_mask.shape} does not broadcast to (B, H, T_q, T_k) = {target}"
            ) from None
        if attn_mask.ndim > 4 or np.broadcast_shapes(attn_mask.shape, target) != target:
            raise ValueError(f"attn_mask of shape {attn_mask.shape} must broadcast to (B, H, T_q, T_k) = {target}")
