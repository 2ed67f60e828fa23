r"""Attention sinks (GPT-OSS): a learned logit per head that joins every softmax's denominator, each pair written by
hand.

Head h has one more logit, :math:`s_h` (the attention's ``sinks`` (H,)), beside the scores :math:`S_{ij}` of query
i's row. The softmax runs over the row and the sink together, and the sink's share is then dropped: it takes
probability mass but has no value to contribute, so a query may give its keys less than 1 in total (down to nothing,
when every key is hidden):

.. math::

    \begin{gathered}
    m_i = \max\big(s_h, \max_j S_{ij}\big), \qquad
    P_{ij} = \frac{e^{S_{ij} - m_i}}{e^{s_h - m_i} + \sum_{j'} e^{S_{ij'} - m_i}}, \\
    P^{\mathrm{sink}}_i = 1 - \textstyle\sum_j P_{ij}
    \end{gathered}

The sums run over the keys query i may read (hidden ones have :math:`P_{ij} = 0`). The attention is then
:math:`O = \mathrm{drop}(P)\, V` as without the sink (sink_attention_forward).

The backward is the softmax's over the row with the sink appended, :math:`[P \,|\, P^{\mathrm{sink}}]`, whose
upstream gradient is :math:`[dP \,|\, 0]` (nothing downstream reads the sink's share):

.. math::

    \begin{gathered}
    r_i = \textstyle\sum_j dP_{ij} P_{ij}, \qquad dS_{ij} = P_{ij} (dP_{ij} - r_i), \\
    ds_h = \textstyle\sum_{b, i} P^{\mathrm{sink}}_{bhi} (0 - r_{bhi}) = -\sum_{b, i} P^{\mathrm{sink}}_{bhi}\, r_{bhi}
    \end{gathered}

(sink_softmax_backward). Shape letters: B batch, H heads, T_q queries, T_k keys, Dh a head's width.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layers import DropoutCache, dropout_backward, dropout_forward
from .scores import (
    PLAIN,
    ScoreCapCache,
    ScoreMod,
    attention_scores,
    position_bias_backward,
    positions,
    score_cap_backward,
)
from .validation import check_float_array


@dataclass(frozen=True, slots=True)
class SinkSoftmaxCache:
    """What sink_softmax_backward needs, by name."""

    probs: np.ndarray  # P, the keys' shares (B, H, T_q, T_k)
    sink: np.ndarray  # P^sink, the sink's share of each row (B, H, T_q, 1)


def sink_softmax_forward(
    scores: np.ndarray, sinks: np.ndarray, allowed: np.ndarray | None = None
) -> tuple[np.ndarray, SinkSoftmaxCache]:
    r"""The softmax of each row of scores (B, H, T_q, T_k) with head h's sink logit :math:`s_h` (sinks (H,)) in its
    denominator (the module's formula), shifted by :math:`m = \max(s_h, \max_j S_{ij})` so that nothing overflows.
    allowed, broadcastable to the scores (True = may attend), or None: hidden entries get probability 0; a row with
    none allowed gives everything to the sink (P = 0, not NaN). Returns P (B, H, T_q, T_k), the scores' dtype, and a
    SinkSoftmaxCache."""
    check_float_array("scores", scores)
    if scores.ndim != 4:
        raise ValueError(f"scores must have shape (B, H, T_q, T_k), got shape {scores.shape}")
    check_float_array("sinks", sinks, scores.dtype, (scores.shape[1],))
    if not np.isfinite(sinks).all():
        raise ValueError(f"sinks must be finite, got {sinks}")
    x = scores if allowed is None else np.where(allowed, scores, -np.inf)  # (B, H, T_q, T_k)
    sink = np.broadcast_to(sinks.reshape(1, -1, 1, 1), (*x.shape[:3], 1))  # s_h on every row, (B, H, T_q, 1)
    row_max = np.maximum(x.max(axis=-1, keepdims=True), sink)  # m, finite: the sink is
    if np.isnan(row_max).any() or (row_max == np.inf).any():
        raise ValueError("sink_softmax: the scores hold NaN or +inf (scores that large overflowed, or NaN came in)")
    exp_keys = np.exp(x - row_max)  # (B, H, T_q, T_k); hidden entries exp(-inf) = 0
    exp_sink = np.exp(sink - row_max)  # (B, H, T_q, 1)
    total = exp_keys.sum(axis=-1, keepdims=True) + exp_sink  # >= 1: the max term is exp(0)
    probs = exp_keys / total
    return probs, SinkSoftmaxCache(probs, exp_sink / total)


def sink_softmax_backward(dprobs: np.ndarray, cache: SinkSoftmaxCache) -> tuple[np.ndarray, np.ndarray]:
    r"""Gradients of sink_softmax_forward (the module's formulas): the softmax's backward over the row and its sink,
    the sink's own upstream gradient zero,

    .. math::

        \begin{gathered}
        r_i = \textstyle\sum_j dP_{ij} P_{ij}, \qquad dS_{ij} = P_{ij} (dP_{ij} - r_i), \\
        ds_h = -\textstyle\sum_{b, i} P^{\mathrm{sink}}_{bhi}\, r_{bhi}
        \end{gathered}

    dprobs (B, H, T_q, T_k). Returns dscores (B, H, T_q, T_k) (zero where hidden: P = 0 there) and dsinks (H,)."""
    if not isinstance(cache, SinkSoftmaxCache):
        raise TypeError(f"cache must be the SinkSoftmaxCache of sink_softmax_forward, got {type(cache).__name__}")
    if dprobs.shape != cache.probs.shape:
        raise ValueError(f"dprobs must have the probabilities' shape {cache.probs.shape}, got {dprobs.shape}")
    row_dot = np.vecdot(dprobs, cache.probs)[..., None]  # r, (B, H, T_q, 1)
    dscores = (dprobs - row_dot) * cache.probs
    dsinks = -(cache.sink * row_dot).sum(axis=(0, 2, 3))  # (H,)
    return dscores, dsinks


@dataclass(frozen=True, slots=True)
class SinkAttentionCache:
    q: np.ndarray  # (B, H, T_q, Dh)
    k: np.ndarray  # (B, H, T_k, Dh)
    v: np.ndarray  # (B, H, T_k, Dh)
    scale: float  # c
    mod: ScoreMod
    q_pos: np.ndarray  # (T_q,)
    k_pos: np.ndarray  # (T_k,)
    table_shape: tuple[int, ...] | None  # T5's bias table's (n_buckets, H), when the scores read it
    probs: np.ndarray  # P before dropout (B, H, T_q, T_k): readable, for plots (the rows sum to 1 - P^sink)
    dropped: np.ndarray  # drop(P)
    softmax: SinkSoftmaxCache
    dropout: DropoutCache
    cap: ScoreCapCache | None = None  # the soft-capped scores (mod.softcap), or None


def sink_attention_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    sinks: np.ndarray,
    mask: np.ndarray | None = None,
    dropout_p: float = 0.0,
    keep_mask: np.ndarray | None = None,
    *,
    mod: ScoreMod = PLAIN,
    q_pos: np.ndarray | None = None,
    k_pos: np.ndarray | None = None,
    bias_table: np.ndarray | None = None,
) -> tuple[np.ndarray, SinkAttentionCache]:
    r"""Scaled dot-product attention whose softmax has a sink per head (GPT-OSS):

    .. math::

        S = c\, Q K^\top (+ \mathrm{bias}), \quad P = \mathrm{sink\_softmax}(S, s), \quad O = \mathrm{drop}(P)\, V

    q (B, H, T_q, Dh), k and v (B, H, T_k, Dh), sinks (H,); the other arguments as
    attention.scaled_dot_product_attention_forward's (mask, dropout, the score rules `mod` at q_pos and k_pos, T5's
    table). Returns out (B, H, T_q, Dh) and a SinkAttentionCache whose `probs` are P before dropout."""
    q_pos = positions(q.shape[2]) if q_pos is None else q_pos
    k_pos = positions(k.shape[2]) if k_pos is None else k_pos
    scores, allowed = attention_scores(q, k, mod, q_pos, k_pos, mask, bias_table)  # (B, H, T_q, T_k)
    cap = None if mod.softcap is None else ScoreCapCache(scores, float(mod.softcap))
    probs, softmax_cache = sink_softmax_forward(scores, sinks, allowed)
    dropped, drop_cache = dropout_forward(probs, dropout_p, keep_mask)
    out = dropped @ v  # (B, H, T_q, Dh)
    table_shape = None if bias_table is None else bias_table.shape
    return out, SinkAttentionCache(
        q, k, v, mod.scale_for(q.shape[-1]), mod, q_pos, k_pos, table_shape, probs, dropped, softmax_cache, drop_cache,
        cap,
    )  # fmt: skip


def sink_attention_backward(
    dout: np.ndarray, cache: SinkAttentionCache
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
    r"""Gradients of sink_attention_forward given :math:`dO` (B, H, T_q, Dh): the lines of
    scaled_dot_product_attention_backward with the sink's softmax backward in the middle,

    .. math::

        \begin{gathered}
        dV = \mathrm{drop}(P)^\top dO, \qquad dP = \mathrm{drop}^\top(dO\, V^\top), \\
        (dS, ds) = \mathrm{sink\_softmax\_backward}(dP), \qquad dQ = c\, dS\, K, \qquad dK = c\, dS^\top Q
        \end{gathered}

    (dS back through a soft cap first, when the scores had one). Returns dq, dk, dv, dtable (T5's table's gradient,
    or None) and dsinks (H,)."""
    if not isinstance(cache, SinkAttentionCache):
        raise TypeError(f"cache must be the SinkAttentionCache of sink_attention_forward, got {type(cache).__name__}")
    q, k, v = cache.q, cache.k, cache.v
    dv = cache.dropped.swapaxes(-1, -2) @ dout  # (B, H, T_k, Dh)
    dprobs = np.einsum("bhqd,bhkd->bhqk", dout, v, optimize=True)  # dO V^T (B, H, T_q, T_k)
    dprobs = dropout_backward(dprobs, cache.dropout)
    dscores, dsinks = sink_softmax_backward(dprobs, cache.softmax)
    if cache.cap is not None:
        dscores = score_cap_backward(dscores, cache.cap)
    dtable = None
    if cache.table_shape is not None:
        dtable = position_bias_backward(dscores, cache.mod, cache.q_pos, cache.k_pos, cache.table_shape)
    dscores *= cache.scale
    dq = dscores @ k  # (B, H, T_q, Dh)
    dk = dscores.swapaxes(-1, -2) @ q  # (B, H, T_k, Dh)
    return dq, dk, dv, dtable, dsinks
