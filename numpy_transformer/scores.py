r"""The one place where attention's scores are made and modified.

Every attention in the package computes its scores here: the plain pair (scaled_dot_product_attention_*),
each block of the tiled pair (flash_attention_*), and cached decoding, which is the plain pair over the keys
its cache holds. A variant of attention is a field of `ScoreMod`, not a change to three kernels: in head h,

.. math::

    s_{ij} = c\, q_i \cdot k_j + \mathrm{bias}_h(i, j), \qquad \text{read only where } M_{ij}
    \text{ and the positions } (i, j) \text{ allow it.}

- `scale`: :math:`c = 1 / \sqrt{d_h}` unless the model says otherwise (T5 uses 1).
- `causal`: query i sees keys :math:`j \le i`.
- `window` (a sliding window, Mistral's): query i sees keys :math:`j > i - \mathrm{window}`, so with `causal`
  the last `window` positions, itself included.
- `band` (a bidirectional window, ModernBERT's local attention): query i sees keys
  :math:`\lvert i - j \rvert \le \mathrm{band}`, band positions on each side and itself (ModernBERT's
  `local_attention // 2`).
- `alibi_slopes` (BLOOM's ALiBi, Press et al. 2022): :math:`\mathrm{bias}_h(i, j) = -m_h \lvert i - j \rvert`,
  a penalty growing with the distance, one slope :math:`m_h` per head; no position table anywhere else.
  (Causal, :math:`j \le i`, it is :math:`-m_h (i - j)`.)
- `relative` (T5's relative position bias, Raffel et al. 2020): :math:`\mathrm{bias}_h(i, j) =
  W_{\mathrm{bucket}(j - i),\, h}`, a learned table W (n_buckets, H) read at the bucket of the distance: exact
  for small distances, logarithmically wider beyond, one bucket for everything past max_distance; in a decoder
  (not bidirectional) only :math:`j \le i` has buckets. Its gradient sums :math:`dS` over every (i, j) whose
  distance falls in bucket b, over the batch, and over every layer that reads the same table:

  .. math::

      dW_{b, h} = \sum_{\text{batch}} \; \sum_{(i, j):\ \mathrm{bucket}(j - i) = b} dS_{h, ij}

- `softcap` (Gemma 2's attn_logit_softcapping): the score, bias included, is squashed into (-cap, cap),
  :math:`s \leftarrow \mathrm{cap} \tanh(s / \mathrm{cap})`, before the mask and the softmax read it
  (score_cap_forward / score_cap_backward).

i and j are positions, not indices: `q_pos` (T_q,) and `k_pos` (T_k,) say where each query and key sits in the
sequence (0 .. T - 1 in training; the new positions and the cached ones in decoding), so the same function
serves a block of the tiled pair and a step of decoding.

The backward: ALiBi's bias is a constant (it has no parameter; T5's table gets dW above) and hidden entries (causal,
the window, the band, padding) get zero probability, so dS reaches q and k through the scale only:
:math:`dQ = c\, dS\, K`, :math:`dK = c\, dS^\top Q`; with a soft cap, dS first goes back through the cap
(score_cap_backward: times :math:`1 - \tanh^2`). Those lines live in the pairs that call `attention_scores`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import DTypeLike


@dataclass(frozen=True)
class ScoreMod:
    r"""How attention turns :math:`q \cdot k` into the scores the softmax reads (see the module docstring)."""

    scale: float | None = None  # None: 1 / sqrt(Dh)
    causal: bool = False  # query i sees keys j <= i
    window: int | None = None  # query i sees keys j > i - window
    band: int | None = None  # query i sees keys |i - j| <= band
    alibi_slopes: tuple | None = None  # (H,) slopes m_h: bias -m_h |i - j|
    relative: tuple | None = None  # (n_buckets, max_distance, bidirectional): T5's bias W[bucket(j - i), h]
    softcap: float | None = None  # s -> softcap * tanh(s / softcap), after the scale and the bias (Gemma 2)

    def scale_for(self, head_dim: int) -> float:
        r"""The factor :math:`c` on :math:`q \cdot k`: `scale`, or :math:`1 / \sqrt{d_h}`. A Python float, so
        float32 stays float32."""
        return 1.0 / math.sqrt(head_dim) if self.scale is None else float(self.scale)

    @property
    def hides_positions(self) -> bool:
        """Whether some (query, key) pairs are hidden by their positions alone (causal or a window)."""
        return self.causal or self.window is not None or self.band is not None


PLAIN = ScoreMod()


def alibi_slopes(n_heads: int) -> tuple:
    r"""ALiBi's slopes, a geometric sequence per head: for H a power of two, :math:`m_h = 2^{-8h/H}`,
    :math:`h = 1, \dots, H`. Otherwise the slopes of the largest power of two P below H, then every other slope
    of 2P for the rest (the rule of the ALiBi paper's code, which BLOOM follows)."""
    P = 2 ** math.floor(math.log2(n_heads))
    slopes = [2.0 ** (-8.0 * h / P) for h in range(1, P + 1)]
    slopes += [2.0 ** (-8.0 * h / (2 * P)) for h in range(1, 2 * (n_heads - P), 2)]
    return tuple(slopes)


def position_mask(mod: ScoreMod, q_pos: np.ndarray, k_pos: np.ndarray) -> np.ndarray | None:
    """(T_q, T_k), True where query q_pos[i] may see key k_pos[j] by position alone; None: all may."""
    if not mod.hides_positions:
        return None
    distance = q_pos[:, None] - k_pos[None, :]  # (T_q, T_k): i - j
    allowed = np.ones(distance.shape, dtype=bool)
    if mod.causal:
        allowed &= distance >= 0  # key j <= query i
    if mod.window is not None:
        allowed &= distance < mod.window  # key j > i - window
    if mod.band is not None:
        allowed &= np.abs(distance) <= mod.band  # |i - j| <= band, on either side
    return allowed


def relative_buckets(relative: tuple, q_pos: np.ndarray, k_pos: np.ndarray) -> np.ndarray:
    r"""T5's bucket of each distance j - i, (T_q, T_k) ints in [0, n_buckets).

    Bidirectional (an encoder): half the buckets for :math:`j > i`, half for :math:`j \le i`, the distance
    :math:`d = \lvert j - i \rvert`; in a decoder all of them, :math:`d = \max(i - j, 0)`. Within a half of
    :math:`n_b` buckets, each distance :math:`d < n_e = \lfloor n_b / 2 \rfloor` has its own, bucket d; beyond,
    logarithmically wider ones:

    .. math::

        \mathrm{bucket}(d) = \min\Big(n_b - 1,\; n_e + \Big\lfloor
        \frac{\log(d / n_e)}{\log(\mathrm{max\_distance} / n_e)}\, (n_b - n_e) \Big\rfloor\Big) \quad (d \ge n_e)

    Computed in float32 as T5's own code computes it (a bucket boundary is where the log lands on a whole number:
    the trained tables mean T5's rounding there)."""
    n_buckets, max_distance, bidirectional = relative
    distance = k_pos[None, :] - q_pos[:, None]  # (T_q, T_k): j - i
    buckets = np.zeros(distance.shape, dtype=np.int64)
    if bidirectional:
        n_buckets //= 2
        buckets += (distance > 0) * n_buckets
        distance = np.abs(distance)
    else:
        distance = np.maximum(-distance, 0)  # i - j; keys after the query (masked anyway) share bucket 0
    exact = n_buckets // 2
    far = np.maximum(distance, exact).astype(np.float32)  # the log is read only where d >= exact
    log_ratio = np.log(far / np.float32(exact)) / np.float32(math.log(max_distance / exact))
    large = exact + (log_ratio * np.float32(n_buckets - exact)).astype(np.int64)
    return buckets + np.where(distance < exact, distance, np.minimum(large, n_buckets - 1))


def position_bias(
    mod: ScoreMod, q_pos: np.ndarray, k_pos: np.ndarray, dtype: DTypeLike, table: np.ndarray | None = None
) -> np.ndarray | None:
    r"""(H, T_q, T_k): the ALiBi bias :math:`-m_h \lvert i - j \rvert`, or T5's :math:`W_{\mathrm{bucket}(j - i),\, h}`;
    None when there is none."""
    if mod.relative is not None:
        if table is None:
            raise ValueError("position_bias: the ScoreMod asks for T5's relative bias (mod.relative), got table=None")
        buckets = relative_buckets(mod.relative, q_pos, k_pos)  # (T_q, T_k)
        return np.moveaxis(table[buckets], -1, 0).astype(dtype, copy=False)  # (H, T_q, T_k)
    if mod.alibi_slopes is None:
        return None
    distance = np.abs(q_pos[:, None] - k_pos[None, :]).astype(np.float64)  # (T_q, T_k)
    slopes = np.asarray(mod.alibi_slopes, dtype=np.float64)[:, None, None]  # (H, 1, 1)
    return (-slopes * distance).astype(dtype)  # (H, T_q, T_k)


def position_bias_backward(
    dscores: np.ndarray, mod: ScoreMod, q_pos: np.ndarray, k_pos: np.ndarray, table_shape: tuple
) -> np.ndarray:
    r"""T5's table gradient (n_buckets, H) from dS (B, H, T_q, T_k), the scores' gradient (before any scale: the
    bias is added after it), summed over the batch and every (i, j) in bucket b:

    .. math::

        dW_{b, h} = \sum_{\text{batch}} \; \sum_{(i, j):\ \mathrm{bucket}(j - i) = b} dS_{h, ij}
    """
    if mod.relative is None:
        raise ValueError("position_bias_backward: the ScoreMod reads no T5 table (mod.relative is None)")
    buckets = relative_buckets(mod.relative, q_pos, k_pos)  # (T_q, T_k)
    per_pair = dscores.sum(axis=0).reshape(dscores.shape[1], -1)  # (H, T_q * T_k): the batch shares the table
    dtable = np.zeros(table_shape, dtype=dscores.dtype)
    np.add.at(dtable, buckets.reshape(-1), per_pair.T)  # rows of the same bucket add
    return dtable


def attention_scores(
    q: np.ndarray,
    k: np.ndarray,
    mod: ScoreMod,
    q_pos: np.ndarray,
    k_pos: np.ndarray,
    mask: np.ndarray | None = None,
    table: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    r""":math:`S = c\, Q K^\top + \mathrm{bias}` (then :math:`\mathrm{cap} \tanh(S / \mathrm{cap})` with
    mod.softcap), and where S may be read.

    q (B, H, T_q, Dh), k (B, H, T_k, Dh); q_pos (T_q,) and k_pos (T_k,) their positions; mask (the caller's:
    padding, ...) broadcastable to (B, H, T_q, T_k), True = may attend, or None. table: T5's (n_buckets, H) bias
    table when mod.relative says so.
    Returns the scores (B, H, T_q, T_k) and the allowed mask (the caller's mask and the positions' rules
    combined, broadcastable to the scores), or None when everything is allowed.
    """
    # Q K^T for every (b, h), as einsum: NumPy hands BLAS a batch laid out for it, where q @ k.swapaxes(-1, -2) gives
    # it a transposed operand per pair, 10 to 40 times slower on a busy 2-core host (benchmarks/attention_products.py)
    scores = np.einsum("bhqd,bhkd->bhqk", q, k, optimize=True)  # (B, H, T_q, T_k)
    scores *= mod.scale_for(q.shape[-1])  # in place: the (T_q, T_k) arrays are attention's largest
    bias = position_bias(mod, q_pos, k_pos, scores.dtype, table)
    if bias is not None:
        scores += bias  # (H, T_q, T_k) broadcast over the batch
    if mod.softcap is not None:
        scores, _ = score_cap_forward(scores, mod.softcap)  # in place, (B, H, T_q, T_k)
    allowed = position_mask(mod, q_pos, k_pos)
    if mask is not None:
        allowed = mask if allowed is None else mask & allowed
    return scores, allowed


@dataclass(frozen=True, slots=True)
class ScoreCapCache:
    capped: np.ndarray  # the capped scores S' (B, H, T_q, T_k); -inf where a tiled pass hid an entry
    cap: float


def score_cap_forward(scores: np.ndarray, cap: float) -> tuple[np.ndarray, ScoreCapCache]:
    r"""Gemma 2's soft cap of the attention scores, elementwise and in place (scores (B, H, T_q, T_k) are
    attention's largest array; the capped ones replace them):

    .. math::

        S' = \mathrm{cap} \tanh(S / \mathrm{cap})

    about S where :math:`|S| \ll \mathrm{cap}`, never past :math:`\pm \mathrm{cap}`. The cache holds S' itself:
    :math:`\tanh(S / \mathrm{cap}) = S' / \mathrm{cap}` is all the backward needs."""
    scores /= cap
    np.tanh(scores, out=scores)
    scores *= cap
    return scores, ScoreCapCache(scores, float(cap))


def score_cap_backward(dcapped: np.ndarray, cache: ScoreCapCache) -> np.ndarray:
    r"""The derivative of :math:`\mathrm{cap} \tanh(S / \mathrm{cap})` is :math:`1 - \tanh^2(S / \mathrm{cap})`, and
    :math:`\tanh(S / \mathrm{cap}) = S' / \mathrm{cap}`, so from the capped scores alone:

    .. math::

        dS = dS' \odot \big(1 - (S' / \mathrm{cap})^2\big)

    dcapped and the cache's S' (B, H, T_q, T_k) -> dS. An entry the tiled pair hid (S' = -inf, probability 0, so
    dS' = 0 there) passes 0, not 0 * inf."""
    t = cache.capped / cache.cap  # tanh(S / cap)
    if not np.isfinite(t).all():
        t = np.where(np.isinf(t), 0.0, t).astype(t.dtype, copy=False)
    return dcapped * (1.0 - t * t)


def positions(length: int, start: int = 0) -> np.ndarray:
    """The positions start .. start + length - 1 (int64)."""
    return np.arange(start, start + length)
