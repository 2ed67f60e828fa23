r"""Tiled attention: FlashAttention's algorithm (Dao et al. 2022; Dao 2023), forward and backward, in NumPy.

The same function as scaled_dot_product_attention_forward / _backward, :math:`\mathrm{softmax}(c\, Q K^\top) V`
with :math:`c = 1 / \sqrt{d_h}` and a boolean mask (True = may attend), computed without ever holding a
(T_q, T_k) array. The queries are cut into blocks of B_r = block_q rows and the keys and values into blocks of
B_c = block_k rows; the loops run over blocks only, and inside a block everything is a matrix product batched
over B and H.

The symbols, as the notation table spells them (the comments below use the papers' names where they differ:
s for c, l for :math:`\ell`, L for lse, D for :math:`\Delta`); a block's arrays keep the B and H axes in front:

- :math:`Q_i` (B, H, B_r, Dh): the i-th block of queries, :math:`i = 1, \dots, T_r = \lceil T_q / B_r \rceil`;
- :math:`K_j, V_j` (B, H, B_c, Dh): the j-th block of keys and values, :math:`j = 1, \dots, T_c = \lceil T_k / B_c
  \rceil`;
- :math:`S_{ij}` (B, H, B_r, B_c): :math:`c\, Q_i K_j^\top`, :math:`-\infty` where the mask says no;
- :math:`m_i, \ell_i` (B, H, B_r, 1): the running row max and running row sum of :math:`e^{S - m}`;
- :math:`O_i` (B, H, B_r, Dh): the output rows of block i;
- :math:`\mathrm{lse}_i` (B, H, B_r): the row log-sum-exp, :math:`m_i + \log \ell_i`: all the backward keeps of
  the softmax;
- :math:`\Delta_i` (B, H, B_r, 1): :math:`\mathrm{rowsum}(dO_i \odot O_i)`, the backward's stand-in for
  :math:`\mathrm{rowsum}(dP \odot P)`.

Memory: besides q, k, v and out, the forward keeps lse (B, H, T_q) and the backward's extra arrays are the
gradients themselves; every other array is one block, (B, H, B_r, B_c). There is no attention dropout here
(it would need the (T_q, T_k) keep-mask this pair exists to avoid), and no probabilities to plot.

A query row with nothing to attend to (every key masked) gets a zero output and zero gradient, never NaN:
its running max stays :math:`-\infty`, so the shift used for the exponentials is 0 instead
(:math:`e^{-\infty - 0} = 0`), its sum :math:`\ell` stays 0, and its lse is stored as :math:`+\infty` so that
the backward's :math:`e^{S - \mathrm{lse}}` is 0 for every key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .scores import (
    PLAIN,
    ScoreCapCache,
    ScoreMod,
    attention_scores,
    position_bias_backward,
    positions,
    score_cap_backward,
)
from .validation import check_float_array, check_ndim, check_score_mask


@dataclass(frozen=True, slots=True)
class FlashAttentionCache:
    q: np.ndarray  # (B, H, T_q, Dh)
    k: np.ndarray  # (B, H, T_k, Dh)
    v: np.ndarray  # (B, H, T_k, Dh)
    out: np.ndarray  # O (B, H, T_q, Dh)
    lse: np.ndarray  # L, the row log-sum-exp (B, H, T_q); +inf for a row with nothing to attend to
    attn_mask: np.ndarray | None  # as given: a padding mask (B, 1, 1, T_k) is small; causal builds none
    mod: ScoreMod
    bias_table: np.ndarray | None  # T5's (n_buckets, H), or None
    block_q: int
    block_k: int


def flash_attention_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    attn_mask: np.ndarray | None = None,
    is_causal: bool = False,
    block_q: int = 64,
    block_k: int = 64,
    *,
    mod: ScoreMod = PLAIN,
    bias_table: np.ndarray | None = None,
) -> tuple[np.ndarray, FlashAttentionCache]:
    r""":math:`O = \mathrm{softmax}(c\, Q K^\top)\, V`, :math:`c = 1 / \sqrt{d_h}`, one block of keys at a time
    (online softmax).

    q (B, H, T_q, Dh), k and v (B, H, T_k, Dh); attn_mask boolean, broadcastable to (B, H, T_q, T_k),
    True = may attend; is_causal: torch's name for the causal score rule (mod.causal), which it only sets: query i
    sees keys j <= i (top-left aligned), key blocks wholly above the diagonal are skipped, and no (T_q, T_k) mask
    is built. mod: the scores' other
    rules (scores.ScoreMod: scale, a sliding window, whose blocks wholly outside the window are skipped too, ALiBi),
    applied block by block by the same function as the plain pair's. bias_table: T5's (n_buckets, H) relative
    position bias, when mod.relative says so; the backward then returns its gradient.
    Returns out (B, H, T_q, Dh) and a cache holding q, k, v, out and the row log-sum-exp lse (B, H, T_q), besides
    the mask as given and the options (nothing computed here is of size (T_q, T_k)).

    Why it works. For one query row with scores :math:`s_1, \dots, s_{T_k}`, softmax needs the max
    :math:`m = \max_k s_k` and the sum :math:`\ell = \sum_k e^{s_k - m}` over the whole row, but both can be built
    block by block. After the blocks 1 .. j-1 we hold :math:`m^{(j-1)}`, :math:`\ell^{(j-1)}` and the unnormalised
    output :math:`o^{(j-1)} = \sum_k e^{s_k - m^{(j-1)}} v_k` over their keys. Block j brings scores
    :math:`S_j`; then

    .. math::

        m^{(j)} &= \max\big(m^{(j-1)}, \mathrm{rowmax}(S_j)\big), \qquad \tilde P_j = e^{S_j - m^{(j)}}, \\
        \ell^{(j)} &= e^{m^{(j-1)} - m^{(j)}}\, \ell^{(j-1)} + \mathrm{rowsum}(\tilde P_j), \\
        o^{(j)} &= e^{m^{(j-1)} - m^{(j)}}\, o^{(j-1)} + \tilde P_j V_j

    The factor :math:`e^{m^{(j-1)} - m^{(j)}} \le 1` re-expresses what was summed under the old max in terms of the
    new one, so after the last block :math:`\ell` and o are exactly the full row's sum and unnormalised output:
    :math:`O = o / \ell`. The softmax itself is not kept, only :math:`\mathrm{lse} = m + \log \ell`, from which any
    probability can be recomputed as :math:`P = e^{S - m} / \ell = e^{S - \mathrm{lse}}`.
    """
    _check_flash_inputs(q, k, v, attn_mask, is_causal, block_q, block_k)
    mod = dataclasses.replace(mod, causal=True) if is_causal else mod  # torch's is_causal: the causal score rule
    B, H, T_q, Dh = q.shape
    T_k, Dv = k.shape[2], v.shape[3]
    q_pos, k_pos = positions(T_q), positions(T_k)
    mask = _as_4d(attn_mask)
    out = np.empty((B, H, T_q, Dv), dtype=q.dtype)  # O
    lse = np.empty((B, H, T_q), dtype=q.dtype)  # L
    for i0 in range(0, T_q, block_q):  # outer loop: query blocks Q_i
        i1 = min(i0 + block_q, T_q)
        q_i = q[:, :, i0:i1]  # (B, H, B_r, Dh)
        m_i = np.full((B, H, i1 - i0, 1), -np.inf, dtype=q.dtype)  # m_i^(0) = -inf
        l_i = np.zeros((B, H, i1 - i0, 1), dtype=q.dtype)  # l_i^(0) = 0
        o_i = np.zeros((B, H, i1 - i0, Dv), dtype=q.dtype)  # O_i^(0) = 0
        for j0 in _key_blocks(i0, i1, T_k, block_k, mod):  # inner loop: key blocks K_j, V_j
            j1 = min(j0 + block_k, T_k)
            # S_ij = s Q_i K_j^T (+ the ScoreMod's bias), hidden entries -inf
            mask_ij = _block_mask(mask, i0, i1, j0, j1)
            s_ij = _block_scores(q_i, k[:, :, j0:j1], mod, q_pos[i0:i1], k_pos[j0:j1], mask_ij, bias_table)
            # m_i^(j) = max(m_i^(j-1), rowmax(S_ij))
            m_new = np.maximum(m_i, s_ij.max(axis=-1, keepdims=True))  # (B, H, B_r, 1)
            shift = np.where(m_new == -np.inf, 0, m_new)  # a row masked so far: exp(-inf - 0) = 0, not NaN
            # P~_ij = exp(S_ij - m_i^(j))
            p_ij = s_ij
            p_ij -= shift
            np.exp(p_ij, out=p_ij)  # (B, H, B_r, B_c), in place: S_ij is not needed again
            # l_i^(j) = exp(m_i^(j-1) - m_i^(j)) l_i^(j-1) + rowsum(P~_ij)
            alpha = np.exp(m_i - shift)  # (B, H, B_r, 1)
            l_i = alpha * l_i + p_ij.sum(axis=-1, keepdims=True)
            # O_i^(j) = diag(exp(m_i^(j-1) - m_i^(j))) O_i^(j-1) + P~_ij V_j
            o_i = alpha * o_i + p_ij @ v[:, :, j0:j1]  # (B, H, B_r, Dv)
            m_i = m_new
        # O_i = diag(l_i)^-1 O_i^(T_c);  L_i = m_i + log(l_i)   (a row with nothing to attend to: O = 0, L = +inf)
        empty = l_i == 0
        l_safe = np.where(empty, 1, l_i)
        out[:, :, i0:i1] = o_i / l_safe
        lse[:, :, i0:i1] = np.where(empty, np.inf, m_i + np.log(l_safe))[..., 0]
    return out, FlashAttentionCache(q, k, v, out, lse, attn_mask, mod, bias_table, block_q, block_k)


def flash_attention_backward(
    dout: np.ndarray, cache: FlashAttentionCache
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    r"""Gradients of :math:`O = P V`, :math:`P = \mathrm{softmax}(S)`, :math:`S = c\, Q K^\top`, recomputing P one
    block at a time.

    dout (B, H, T_q, Dh) and the forward's cache -> dq (B, H, T_q, Dh), dk and dv (B, H, T_k, Dh), and dtable:
    when the forward took T5's bias table, its gradient dW (n_buckets, H) (scores.position_bias_backward, from
    each block's dS before the scale), else None. Always four values.

    The plain backward (scaled_dot_product_attention_backward) is, entry by entry,

    .. math::

        dV &= P^\top dO, \qquad dP = dO\, V^\top, \\
        dS &= P \odot \big(dP - \mathrm{rowsum}(dP \odot P)\big), \\
        dQ &= c\, dS\, K, \qquad dK = c\, dS^\top Q

    and needs P only block by block: the entries of :math:`dS_{ij}` depend on :math:`S_{ij}`, :math:`dO_i`,
    :math:`V_j` and two row quantities. The first is the softmax's normaliser:
    :math:`P_{ij} = e^{S_{ij} - \mathrm{lse}_i}`, with lse from the forward. The second,
    :math:`\mathrm{rowsum}(dP \odot P)`, runs over the whole row of keys, but it is a number per query that the
    output already holds: for a query row r,

    .. math::

        \Delta_r = \mathrm{rowsum}(dP \odot P)_r = \sum_k (dO_r \cdot V_k)\, P_{rk}
        = dO_r \cdot \sum_k P_{rk} V_k = dO_r \cdot O_r

    so :math:`\Delta = \mathrm{rowsum}(dO \odot O)` (B, H, T_q) costs one pass over O and no (T_q, T_k) array.
    Each block then adds its share to the sums that make up dQ, dK and dV:

    .. math::

        &dV_j \mathrel{+}= P_{ij}^\top dO_i, \qquad dP_{ij} = dO_i V_j^\top, \qquad
        dS_{ij} = P_{ij} \odot (dP_{ij} - \Delta_i), \\
        &dQ_i \mathrel{+}= c\, dS_{ij} K_j, \qquad dK_j \mathrel{+}= c\, dS_{ij}^\top Q_i

    The outer loop runs over key blocks, so that :math:`dK_j` and :math:`dV_j` are finished when it moves on;
    :math:`dQ_i` collects a term from every key block. With a soft cap (mod.softcap, Gemma 2) the recomputed
    :math:`S_{ij}` are the capped scores :math:`S'_{ij}`, and each block's :math:`dS_{ij}` goes back through the cap,
    :math:`\odot (1 - (S'_{ij} / \mathrm{cap})^2)` (scores.score_cap_backward), before the bias table and the scale.
    """
    _check_flash_backward(dout, cache)
    q, k, v, out, lse = cache.q, cache.k, cache.v, cache.out, cache.lse
    mod, block_q, block_k, table = cache.mod, cache.block_q, cache.block_k, cache.bias_table
    T_q, T_k = q.shape[2], k.shape[2]
    scale = mod.scale_for(q.shape[-1])
    q_pos, k_pos = positions(T_q), positions(T_k)
    mask = _as_4d(cache.attn_mask)
    # D = rowsum(dO * O), in place of rowsum(dP * P)
    D = np.vecdot(dout, out)[..., None]  # (B, H, T_q, 1)
    dq = np.zeros_like(q)  # (B, H, T_q, Dh): every key block adds to it
    dk = np.empty_like(k)  # (B, H, T_k, Dh): each block written once
    dv = np.empty_like(v)
    dtable = None if table is None else np.zeros_like(table)  # T5's bias table: each block adds its buckets' dS
    for j0 in range(0, T_k, block_k):  # outer loop: key blocks K_j, V_j
        j1 = min(j0 + block_k, T_k)
        k_j, v_j = k[:, :, j0:j1], v[:, :, j0:j1]  # (B, H, B_c, Dh)
        dk_j = np.zeros_like(k_j)  # dK_j = 0
        dv_j = np.zeros_like(v_j)  # dV_j = 0
        for i0 in _query_blocks(j0, j1, T_q, block_q, mod):  # inner loop: query blocks Q_i
            i1 = min(i0 + block_q, T_q)
            q_i, do_i = q[:, :, i0:i1], dout[:, :, i0:i1]  # (B, H, B_r, Dh)
            # S_ij = s Q_i K_j^T (+ bias), recomputed exactly as the forward computed it
            mask_ij = _block_mask(mask, i0, i1, j0, j1)
            s_ij = _block_scores(q_i, k_j, mod, q_pos[i0:i1], k_pos[j0:j1], mask_ij, table)
            # a soft cap (Gemma 2): S_ij is the capped S'_ij, kept for its backward (1 - (S'/cap)^2)
            cap = None if mod.softcap is None else ScoreCapCache(s_ij.copy(), float(mod.softcap))
            # P_ij = exp(S_ij - L_i)
            p_ij = s_ij
            p_ij -= lse[:, :, i0:i1, None]
            np.exp(p_ij, out=p_ij)  # (B, H, B_r, B_c)
            # dV_j += P_ij^T dO_i
            dv_j += p_ij.swapaxes(-1, -2) @ do_i  # (B, H, B_c, Dh)
            # dP_ij = dO_i V_j^T
            dp_ij = np.einsum("bhqd,bhkd->bhqk", do_i, v_j, optimize=True)  # (B, H, B_r, B_c): as the plain pair
            # dS_ij = P_ij * (dP_ij - D_i), times s for the scale inside S
            dp_ij -= D[:, :, i0:i1]
            ds_ij = p_ij
            ds_ij *= dp_ij
            if cap is not None:  # dS_ij = dS'_ij (1 - (S'_ij / cap)^2)
                ds_ij = score_cap_backward(ds_ij, cap)
            if dtable is not None:  # dW += dS_ij summed by bucket (the bias is added after the scale)
                dtable += position_bias_backward(ds_ij, mod, q_pos[i0:i1], k_pos[j0:j1], dtable.shape)
            ds_ij *= scale
            # dQ_i += dS_ij K_j;  dK_j += dS_ij^T Q_i
            dq[:, :, i0:i1] += ds_ij @ k_j  # (B, H, B_r, Dh)
            dk_j += ds_ij.swapaxes(-1, -2) @ q_i  # (B, H, B_c, Dh)
        dk[:, :, j0:j1] = dk_j
        dv[:, :, j0:j1] = dv_j
    return dq, dk, dv, dtable


# ----------------------------------------------------------------------------------------------
# One block: its scores, its mask, and which blocks a causal pass visits.


def _block_scores(
    q_i: np.ndarray,
    k_j: np.ndarray,
    mod: ScoreMod,
    q_pos: np.ndarray,
    k_pos: np.ndarray,
    mask_ij: np.ndarray | None,
    table: np.ndarray | None = None,
) -> np.ndarray:
    """S_ij (B, H, B_r, B_c) from scores.attention_scores (the plain pair's function, on one block), -inf where
    hidden. Both passes compute a block's scores here (the backward recomputes them), so the tests can count
    the blocks each pass visits."""
    s_ij, allowed = attention_scores(q_i, k_j, mod, q_pos, k_pos, mask_ij, table)
    if allowed is not None:
        np.copyto(s_ij, -np.inf, where=~allowed)
    return s_ij


def _block_mask(mask: np.ndarray | None, i0: int, i1: int, j0: int, j1: int) -> np.ndarray | None:
    """The caller's mask for queries i0 .. i1 - 1 and keys j0 .. j1 - 1, broadcastable to (B, H, B_r, B_c)."""
    if mask is None:
        return None
    rows = slice(i0, i1) if mask.shape[2] != 1 else slice(None)  # a padding mask has one row for all queries
    cols = slice(j0, j1) if mask.shape[3] != 1 else slice(None)
    return mask[:, :, rows, cols]


def _key_blocks(i0: int, i1: int, T_k: int, block_k: int, mod: ScoreMod) -> range:
    """Forward: the starts of the key blocks that queries i0 .. i1 - 1 can see. Causal: keys j <= i < i1, so
    they end at i1. A window: keys j > i - window >= i0 - window, so they start in the block of i0 - window + 1.
    A band: keys i0 - band <= j <= i1 - 1 + band."""
    end = min(i1, T_k) if mod.causal else T_k
    start = 0 if mod.window is None else max(0, i0 - mod.window + 1) // block_k * block_k
    if mod.band is not None:
        start = max(start, max(0, i0 - mod.band) // block_k * block_k)
        end = min(end, i1 + mod.band)
    return range(start, end, block_k)


def _query_blocks(j0: int, j1: int, T_q: int, block_q: int, mod: ScoreMod) -> range:
    """Backward: the starts of the query blocks that see some key of j0 .. j1 - 1. Causal: query j0 is the first
    (in the block starting at j0 // block_q * block_q; none when j0 >= T_q). A window: queries i < j + window,
    so they end before j1 - 1 + window. A band: queries j0 - band <= i <= j1 - 1 + band."""
    start = (T_q if j0 >= T_q else j0 // block_q * block_q) if mod.causal else 0
    end = T_q if mod.window is None else min(T_q, j1 - 1 + mod.window)
    if mod.band is not None:
        start = max(start, max(0, j0 - mod.band) // block_q * block_q)
        end = min(end, j1 + mod.band)
    return range(start, end, block_q)


def _as_4d(mask: np.ndarray | None) -> np.ndarray | None:
    """A mask broadcastable to (B, H, T_q, T_k), given leading axes of size one (a view: nothing is copied)."""
    if mask is None:
        return None
    mask = np.asarray(mask)
    return mask.reshape((1,) * (4 - mask.ndim) + mask.shape)


# ----------------------------------------------------------------------------------------------
# Argument checks: every message names the argument, what it got and what was expected.


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _check_flash_inputs(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    attn_mask: np.ndarray | None,
    is_causal: bool,
    block_q: int,
    block_k: int,
) -> None:
    _check_flash_qkv(q, k, v)
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    _check_positive_int("block_q", block_q)
    _check_positive_int("block_k", block_k)
    check_score_mask(attn_mask, (q.shape[0], q.shape[1], q.shape[2], k.shape[2]))


def _check_flash_qkv(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_float_array(name, x)
        check_ndim(name, x, 4, "(B, H, T, Dh)")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype} and {v.dtype}")
    B, H, T_q, Dh = q.shape
    if k.shape[:2] != (B, H) or v.shape[:2] != (B, H):
        raise ValueError(
            f"q, k and v must share (B, H): got q {q.shape}, k {k.shape}, v {v.shape} (shapes are (B, H, T, Dh))"
        )
    if Dh < 1 or k.shape[3] != Dh:
        raise ValueError(f"k must have q's head size Dh={Dh} >= 1, got q {q.shape} and k {k.shape}")
    if v.shape[2] != k.shape[2]:
        raise ValueError(f"k and v must have the same number of keys T_k, got k {k.shape} and v {v.shape}")


def _check_flash_backward(dout: np.ndarray, cache: FlashAttentionCache) -> None:
    if not isinstance(cache, FlashAttentionCache):
        raise TypeError(f"cache must be the FlashAttentionCache of flash_attention_forward, got {type(cache).__name__}")
    out = cache.out
    check_float_array("dout", dout, dtype=out.dtype, shape=out.shape)
