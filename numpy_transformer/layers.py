"""The building blocks, each a forward/backward pair written by hand.

Every pair follows one shape:

    out, cache = thing_forward(x, ...)          # cache keeps exactly what the backward needs
    dx, ... = thing_backward(dout, cache)       # gradients in the order of the forward's inputs

A pair's cache is a small frozen dataclass, `<Pair>Cache`, defined right above its forward, whose fields are
named as the backward reads them; only the pair's own backward reads it. Leaf pairs take their inputs, then
their parameters (`linear_forward(x, weight, bias)`); composite pairs take the params dict first, then their
inputs, then the config or options (`feed_forward_forward(params, x, activation, ...)`).

Shape letters: B batch, T sequence, D d_model, F d_ff, V vocabulary, N = B*T rows.
Scalars are Python floats, so a float32 array stays float32 (NumPy 2 would promote
`float32_array * np.float64(x)` to float64).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from .special import erf  # scipy's erf for float64; for float32 within one unit in the last place, and faster

# ----------------------------------------------------------------------------------------------
# Linear: y = x @ W.T + b, with W stored (out_features, in_features) as torch.nn.Linear stores it.


@dataclass(frozen=True, slots=True)
class LinearCache:
    x: np.ndarray  # the input (..., in)
    weight: np.ndarray  # W (out, in)
    has_bias: bool


# Up to this many rows (a decoding step, a short prompt) the product runs as (W x^T)^T: the same numbers, with W's
# many rows on BLAS's long side. At one thread both layouts take the same time here (AMD EPYC, OpenBLAS Haswell); at
# two threads on a busy machine x W^T took 3 to 15 times as long at 8 to 64 rows, and on an Intel Xeon (SkylakeX
# kernel, quiet) (W x^T)^T read the weights at 12.9 GB/s against 8.7 at 8 rows.
FEW_ROWS = 64


def linear_forward(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> tuple[np.ndarray, LinearCache]:
    r""":math:`y = x W^\top + b`: x (..., in), weight (out, in), bias (out,) or None -> y (..., out)."""
    x2d = x.reshape(-1, x.shape[-1])  # (N, in): one large matrix product instead of a batch of small ones
    if len(x2d) <= FEW_ROWS:
        out = np.ascontiguousarray((weight @ x2d.T).T)  # (N, out), C order as below (a copy of N x out numbers)
    else:
        out = x2d @ weight.T  # (N, out)
    if bias is not None:
        out += bias
    return out.reshape(*x.shape[:-1], weight.shape[0]), LinearCache(x, weight, bias is not None)


def linear_backward(dout: np.ndarray, cache: LinearCache) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    r"""Gradients of :math:`y = x W^\top + b`, every leading position a row (dW and db sum over them):

    .. math::

        dx = dy\, W, \qquad dW = dy^\top x, \qquad db = \textstyle\sum_{\text{rows}} dy

    dx (..., in), dW (out, in), db (out,) or None when the forward had no bias.
    """
    dout2d = dout.reshape(-1, dout.shape[-1])  # (N, out)
    dx = (dout2d @ cache.weight).reshape(cache.x.shape)  # (..., in)
    dweight = dout2d.T @ cache.x.reshape(-1, cache.x.shape[-1])  # (out, in)
    dbias = dout2d.sum(axis=0) if cache.has_bias else None
    return dx, dweight, dbias


# ----------------------------------------------------------------------------------------------
# tanh (BERT's pooler).


@dataclass(frozen=True, slots=True)
class TanhCache:
    out: np.ndarray  # y = tanh(x)


def tanh_forward(x: np.ndarray) -> tuple[np.ndarray, TanhCache]:
    r""":math:`y = \tanh(x)`, elementwise; the cache keeps y."""
    out = np.tanh(x)
    return out, TanhCache(out)


def tanh_backward(dout: np.ndarray, cache: TanhCache) -> np.ndarray:
    r"""Gradient of :math:`y = \tanh(x)`: :math:`dx = dy\,(1 - y^2)`, same shape as dy."""
    return dout * (1 - cache.out * cache.out)


# ----------------------------------------------------------------------------------------------
# L2 normalisation of the last axis (torch.nn.functional.normalize(x, p=2, dim=-1)): sentence embeddings, cosines.


@dataclass(frozen=True, slots=True)
class L2NormalizeCache:
    out: np.ndarray  # y = x / max(|x|, eps), (..., D)
    norm: np.ndarray  # max(|x|, eps), (..., 1)
    clamped: np.ndarray  # (..., 1) bool: |x| <= eps, where the divisor is the constant eps


def l2_normalize_forward(x: np.ndarray, eps: float = 1e-12) -> tuple[np.ndarray, L2NormalizeCache]:
    r""":math:`y = x / \max(\lVert x \rVert_2, \epsilon)` along the last axis, as `F.normalize` computes it:
    x (..., D) -> y (..., D), unit rows (a row shorter than eps is divided by eps instead)."""
    length = np.sqrt((x * x).sum(axis=-1, keepdims=True))  # (..., 1)
    clamped = length <= eps
    norm = np.maximum(length, x.dtype.type(eps))
    out = x / norm
    return out, L2NormalizeCache(out, norm, clamped)


def l2_normalize_backward(dout: np.ndarray, cache: L2NormalizeCache) -> np.ndarray:
    r"""Gradient of :math:`y = x / \lVert x \rVert`: the part of dy along y is removed, the rest divided by the length,

    .. math::

        dx = \frac{dy - y\, (y \cdot dy)}{\lVert x \rVert}

    and :math:`dx = dy / \epsilon` for a row whose length is at most eps (there the divisor is a constant).
    dy (..., D) -> dx (..., D)."""
    y = cache.out
    along = (y * dout).sum(axis=-1, keepdims=True)  # (..., 1): y . dy
    dx = np.where(cache.clamped, dout, dout - y * along) / cache.norm
    return dx


# ----------------------------------------------------------------------------------------------
# Token embedding: a table lookup, optionally scaled by sqrt(D) as in the paper.


@dataclass(frozen=True, slots=True)
class EmbeddingCache:
    ids: np.ndarray  # (B, T) the rows read
    table_shape: tuple[int, ...]  # (V, D)
    scale: float
    padding_idx: int | None


def embedding_forward(
    ids: np.ndarray, weight: np.ndarray, scale: float = 1.0, padding_idx: int | None = None
) -> tuple[np.ndarray, EmbeddingCache]:
    r"""ids (B, T) integers, the table E = weight (V, D) -> :math:`y = \mathrm{scale} \cdot E[\mathrm{ids}]`, (B, T, D).
    padding_idx: lookups of this id pass no gradient back (nn.Embedding's padding_idx); None: every id does."""
    out = weight[ids]  # (B, T, D)
    if scale != 1.0:
        out *= scale
    return out, EmbeddingCache(ids, weight.shape, scale, padding_idx)


def embedding_backward(dout: np.ndarray, cache: EmbeddingCache) -> np.ndarray:
    r"""Gradient of :math:`y_{bt} = \mathrm{scale} \cdot E[\mathrm{ids}_{bt}]` with respect to the table E, (V, D):

    .. math::

        dE[v] = \mathrm{scale} \sum_{(b, t):\ \mathrm{ids}_{bt} = v} dy_{bt}

    Rows of a repeated id accumulate; ids that do not occur get zero, and so does padding_idx (its
    lookups are treated as constants, as torch's nn.Embedding(padding_idx=...) does). The scatter-add is
    done by sorting the ids and summing runs of equal ids with np.add.reduceat (fast, no Python loop).
    """
    table_shape, scale, padding_idx = cache.table_shape, cache.scale, cache.padding_idx
    flat_ids = cache.ids.reshape(-1)
    rows = dout.reshape(-1, table_shape[1])  # (N, D)
    order = np.argsort(flat_ids, kind="stable")
    sorted_ids = flat_ids[order]
    starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])  # first of each run
    dweight = np.zeros(table_shape, dtype=dout.dtype)
    dweight[sorted_ids[starts]] = np.add.reduceat(rows[order], starts, axis=0)
    if padding_idx is not None:
        dweight[padding_idx] = 0.0
    if scale != 1.0:
        dweight *= scale
    return dweight


# ----------------------------------------------------------------------------------------------
# Positions: the paper's sinusoids, or a learned table; either way added to the embeddings.


def sinusoidal_table(
    max_len: int, d_model: int, dtype: DTypeLike = np.float64, layout: str = "interleaved"
) -> np.ndarray:
    r"""The paper's sinusoids, a table PE (max_len, D), with the frequencies :math:`w_i = 10000^{-2i/D}`:

    .. math::

        PE[\mathrm{pos}, 2i] = \sin(\mathrm{pos}\, w_i), \qquad PE[\mathrm{pos}, 2i + 1] = \cos(\mathrm{pos}\, w_i)

    layout "interleaved" (the paper) puts them side by side as written; "split" (Marian) puts every
    sine first and every cosine after them:
    :math:`[\sin(\mathrm{pos}\, w_0), \sin(\mathrm{pos}\, w_1), \dots, \cos(\mathrm{pos}\, w_0), \dots]`.
    Computed in float64 and cast (a float64 table never passes through float32); for odd D the
    last cosine is dropped, so "split" has :math:`\lceil D/2 \rceil` sines and :math:`\lfloor D/2 \rfloor` cosines.
    """
    half = (d_model + 1) // 2
    pos = np.arange(max_len, dtype=np.float64)[:, None]  # (max_len, 1)
    inv_freq = 10000.0 ** (-np.arange(0, 2 * half, 2, dtype=np.float64) / d_model)  # (half,)
    table = np.empty((max_len, 2 * half))
    table[:, 0::2] = np.sin(pos * inv_freq)
    table[:, 1::2] = np.cos(pos * inv_freq)
    table = table[:, :d_model]
    if layout == "split":
        table = np.concatenate([table[:, 0::2], table[:, 1::2]], axis=1)  # sines, then cosines
    elif layout != "interleaved":
        raise ValueError(f"layout must be 'interleaved' or 'split', got {layout!r}")
    return table.astype(dtype)


@dataclass(frozen=True, slots=True)
class AddPositionsCache:
    length: int  # T, the rows of the table read
    table_shape: tuple[int, ...]  # (max_len, D)


def add_positions_forward(x: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, AddPositionsCache]:
    r"""x (B, T, D), table PE (max_len, D) -> :math:`y = x + PE[{:}T]`."""
    T = x.shape[1]
    return x + table[:T], AddPositionsCache(T, table.shape)


def add_positions_backward(dout: np.ndarray, cache: AddPositionsCache) -> tuple[np.ndarray, np.ndarray]:
    r"""Gradients of :math:`y = x + PE[{:}T]`: the sum passes dy to both, summed over the batch for the table
    (whose rows from T on were not read):

    .. math::

        dx = dy, \qquad dPE[t] = \textstyle\sum_{\text{batch}} dy_t \ \ (t < T), \qquad dPE[t] = 0 \ \ (t \ge T)
    """
    dtable = np.zeros(cache.table_shape, dtype=dout.dtype)
    dtable[: cache.length] = dout.sum(axis=0)
    return dout, dtable


# ----------------------------------------------------------------------------------------------
# Softmax over the last axis, with an optional boolean mask (True = may attend).


@dataclass(frozen=True, slots=True)
class SoftmaxCache:
    probs: np.ndarray  # p, the output


def softmax_forward(x: np.ndarray, mask: np.ndarray | None = None) -> tuple[np.ndarray, SoftmaxCache]:
    r"""Softmax over the last axis, masked entries excluded (the sums run over the allowed entries), shifted by
    the row's max m so that no exponential overflows:

    .. math::

        p_j = \frac{e^{x_j - m}}{\sum_k e^{x_k - m}}, \qquad m = \max_k x_k

    A row whose entries are all masked out (or all -inf) gets p = 0 everywhere (not NaN): it attends to
    nothing. A NaN or +inf in a row has no softmax: ValueError.
    """
    if mask is not None:
        x = np.where(mask, x, -np.inf)  # a new array, ours to overwrite below
    row_max = x.max(axis=-1, keepdims=True)  # (..., 1): NaN if the row holds a NaN
    finite = np.isfinite(row_max)
    if not finite.all():
        if np.isnan(row_max).any() or (row_max == np.inf).any():
            raise ValueError("softmax: the input holds NaN or +inf (scores that large overflowed, or NaN came in)")
        row_max[~finite] = 0.0  # an all-masked row (max -inf): exp(-inf - 0) = 0 below, no inf - inf
    probs = np.subtract(x, row_max, out=x if mask is not None else None)  # x - max, in place when x is ours
    np.exp(probs, out=probs)  # in place: these arrays are (B, H, T_q, T_k), the largest of attention
    total = probs.sum(axis=-1, keepdims=True)
    if not finite.all():
        total[total == 0.0] = 1.0  # 0 / 1 = 0 for the all-masked rows
    probs /= total
    return probs, SoftmaxCache(probs)


def softmax_backward(dprobs: np.ndarray, cache: SoftmaxCache) -> np.ndarray:
    r"""Gradient of :math:`p = \mathrm{softmax}(x)`:

    .. math::

        dx = p \odot \big(dp - \mathrm{rowsum}(dp \odot p)\big)

    Masked entries have p = 0, so they (and all-masked rows) receive exactly zero gradient.
    """
    probs = cache.probs
    row_dot = np.vecdot(dprobs, probs)[..., None]  # sum_j dp_j p_j, (..., 1)
    dx = dprobs - row_dot
    dx *= probs
    return dx


# ----------------------------------------------------------------------------------------------
# Activations.


@dataclass(frozen=True, slots=True)
class ReluCache:
    x: np.ndarray


def relu_forward(x: np.ndarray) -> tuple[np.ndarray, ReluCache]:
    r""":math:`\mathrm{relu}(x) = \max(x, 0)`."""
    return np.maximum(x, 0), ReluCache(x)


def relu_backward(dout: np.ndarray, cache: ReluCache) -> np.ndarray:
    r""":math:`\mathrm{relu}'(x)` is 1 where :math:`x > 0`, else 0: :math:`dx = dy \odot [x > 0]`."""
    return dout * (cache.x > 0)


_SQRT_2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_TANH_C = 0.044715


@dataclass(frozen=True, slots=True)
class GeluCache:
    x: np.ndarray
    cdf: np.ndarray  # Phi(x)


def gelu_forward(x: np.ndarray) -> tuple[np.ndarray, GeluCache]:
    r"""Exact GELU, with :math:`\Phi` the standard normal distribution function (erf: special.erf, within one
    unit in the last place in float32):

    .. math::

        \mathrm{gelu}(x) = x\, \Phi(x), \qquad \Phi(x) = \tfrac12 \big(1 + \operatorname{erf}(x / \sqrt 2)\big)
    """
    cdf = erf(x / _SQRT_2)
    cdf += 1.0  # in place: these are (N, d_ff) arrays, the feed-forward's largest
    cdf *= 0.5
    return x * cdf, GeluCache(x, cdf)


def gelu_backward(dout: np.ndarray, cache: GeluCache) -> np.ndarray:
    r"""The derivative of :math:`x\, \Phi(x)` (the product rule; :math:`\Phi'` is the standard normal density):

    .. math::

        dx = dy \odot \big(\Phi(x) + x\, \Phi'(x)\big), \qquad \Phi'(x) = e^{-x^2 / 2} / \sqrt{2 \pi}
    """
    x = cache.x
    dx = x * x  # one new array, updated in place from here on
    dx *= -0.5
    np.exp(dx, out=dx)
    dx *= _INV_SQRT_2PI  # Phi'(x)
    dx *= x
    dx += cache.cdf  # Phi(x) + x Phi'(x)
    dx *= dout
    return dx


# Beyond |x| = 50, u > 4000 and tanh(u) is exactly +-1 in float32 and float64; clipping the cubic's argument
# there changes no value, and keeps x^3 and x^2 from overflowing (1e13 in float32 would make 0 * inf = NaN).
_GELU_TANH_CLIP = 50.0


@dataclass(frozen=True, slots=True)
class GeluTanhCache:
    x: np.ndarray
    x_clipped: np.ndarray  # x clipped to +-_GELU_TANH_CLIP, for the cubic
    t: np.ndarray  # tanh(u)


def gelu_tanh_forward(x: np.ndarray) -> tuple[np.ndarray, GeluTanhCache]:
    r"""Tanh-approximate GELU:

    .. math::

        \mathrm{gelu}(x) \approx \tfrac12 x \big(1 + \tanh(u)\big), \qquad u = \sqrt{2/\pi}\, (x + 0.044715\, x^3)
    """
    xc = np.clip(x, -_GELU_TANH_CLIP, _GELU_TANH_CLIP)  # the same tanh(u), without overflow
    u = xc * xc  # one new array, updated in place: (N, d_ff), the feed-forward's largest
    u *= xc  # x^3 as x * x * x: x**3 calls pow(), 20x slower
    u *= _GELU_TANH_C
    u += xc
    u *= _SQRT_2_OVER_PI
    t = np.tanh(u, out=u)
    out = t + 1.0
    out *= x
    out *= 0.5
    return out, GeluTanhCache(x, xc, t)


def gelu_tanh_backward(dout: np.ndarray, cache: GeluTanhCache) -> np.ndarray:
    r"""The derivative of the tanh approximation, with :math:`t = \tanh(u)`:

    .. math::

        dx = dy \odot \Big(\tfrac12 (1 + t) + \tfrac12 x\, (1 - t^2) \sqrt{2/\pi}\, (1 + 3 \cdot 0.044715\, x^2)\Big)

    (Beyond the clip, :math:`1 - t^2` is exactly 0 and the second term vanishes.)"""
    x, xc, t = cache.x, cache.x_clipped, cache.t
    du = xc * (3.0 * _GELU_TANH_C)  # two new arrays, updated in place (the same values as the formula's, bitwise)
    du *= xc
    du += 1.0
    du *= _SQRT_2_OVER_PI  # du/dx
    dx = t * t
    np.subtract(1.0, dx, out=dx)  # 1 - t^2
    dx *= x
    dx *= 0.5
    dx *= du  # the second term
    half = np.add(t, 1.0, out=du)  # du is spent: (1 + t) / 2 goes in its place
    half *= 0.5
    dx += half
    dx *= dout
    return dx


@dataclass(frozen=True, slots=True)
class SiluCache:
    x: np.ndarray
    sigmoid: np.ndarray  # sigma(x)


def silu_forward(x: np.ndarray) -> tuple[np.ndarray, SiluCache]:
    r"""SiLU (also "swish"), the activation of Llama's gated feed-forward, with the logistic sigmoid
    :math:`\sigma(x) = 1 / (1 + e^{-x})`: :math:`\mathrm{silu}(x) = x\, \sigma(x)`."""
    s = np.negative(x)  # one new array, updated in place from here on: (N, d_ff), the gated block's largest
    with np.errstate(over="ignore"):  # exp(-x) is inf below x = -88 (float32): 1 / (1 + inf) = 0, sigma's limit
        np.exp(s, out=s)
    s += 1.0
    np.reciprocal(s, out=s)  # sigma(x), in NumPy's exp: scipy's expit took 3 times as long in float32
    return x * s, SiluCache(x, s)


def silu_backward(dout: np.ndarray, cache: SiluCache) -> np.ndarray:
    r"""The product rule and :math:`\sigma' = \sigma (1 - \sigma)`, with :math:`\sigma = \sigma(x)` the sigmoid:

    .. math::

        dx = dy \odot \big(\sigma + x\, \sigma (1 - \sigma)\big) = dy \odot \sigma \big(1 + x (1 - \sigma)\big)
    """
    x, s = cache.x, cache.sigmoid
    dx = 1.0 - s  # one new array, updated in place from here on
    dx *= x
    dx += 1.0
    dx *= s  # sigma (1 + x (1 - sigma))
    dx *= dout
    return dx


# QuickGELU (CLIP's and the original GPT's x * sigmoid(1.702 x)), the sigmoid approximation of GELU.
QUICK_GELU_SLOPE = 1.702


@dataclass(frozen=True, slots=True)
class QuickGeluCache:
    x: np.ndarray
    s: np.ndarray  # sigmoid(1.702 x)


def quick_gelu_forward(x: np.ndarray) -> tuple[np.ndarray, QuickGeluCache]:
    r"""QuickGELU, :math:`y = x\, \sigma(a x)` with :math:`a = 1.702`, elementwise (transformers'
    QuickGELUActivation, hidden_act "quick_gelu")."""
    s = np.multiply(x, -QUICK_GELU_SLOPE)  # one new array, updated in place from here on
    with np.errstate(over="ignore"):  # exp overflows to inf far below 0: 1 / (1 + inf) = 0, sigma's limit
        np.exp(s, out=s)
    s += 1.0
    np.reciprocal(s, out=s)  # sigma(a x)
    return x * s, QuickGeluCache(x, s)


def quick_gelu_backward(dout: np.ndarray, cache: QuickGeluCache) -> np.ndarray:
    r"""The product rule and :math:`\sigma' = \sigma (1 - \sigma)`, with :math:`\sigma = \sigma(a x)`:

    .. math::

        dx = dy \odot \big(\sigma + a\, x\, \sigma (1 - \sigma)\big)

    same shape as dy."""
    x, s = cache.x, cache.s
    return dout * (s + QUICK_GELU_SLOPE * x * s * (1 - s))


# An activation's pair: forward x -> (y, cache), backward (dy, cache) -> dx.
ActivationPair = tuple[Callable[[np.ndarray], tuple[np.ndarray, Any]], Callable[[np.ndarray, Any], np.ndarray]]

ACTIVATIONS: dict[str, ActivationPair] = {
    "relu": (relu_forward, relu_backward),
    "gelu": (gelu_forward, gelu_backward),
    "gelu_tanh": (gelu_tanh_forward, gelu_tanh_backward),
    "silu": (silu_forward, silu_backward),
    "quick_gelu": (quick_gelu_forward, quick_gelu_backward),
}


# ----------------------------------------------------------------------------------------------
# Inverted dropout: keep each unit with probability 1 - p and scale the kept ones by 1 / (1 - p),
# so nothing changes at evaluation time. The keep-mask is an explicit argument, which is what lets
# another implementation be made to drop exactly the same units.


@dataclass(frozen=True, slots=True)
class DropoutCache:
    keep_mask: np.ndarray | None  # k; None: no dropout (evaluation, or p = 0)
    scale: float  # 1 / (1 - p)


def dropout_forward(
    x: np.ndarray, p: float = 0.0, keep_mask: np.ndarray | None = None
) -> tuple[np.ndarray, DropoutCache]:
    r""":math:`y = x \odot k / (1 - p_{drop})`, k the keep_mask; keep_mask None means no dropout (evaluation,
    or p = 0)."""
    if keep_mask is None:
        return x, DropoutCache(None, 1.0)
    scale = 1.0 / (1.0 - p)
    out = x * keep_mask
    out *= scale  # in place: one temporary instead of two
    return out, DropoutCache(keep_mask, scale)


def dropout_backward(dout: np.ndarray, cache: DropoutCache) -> np.ndarray:
    r"""The same mask and scale: :math:`dx = dy \odot k / (1 - p_{drop})` (dy itself without dropout)."""
    if cache.keep_mask is None:
        return dout
    dx = dout * cache.keep_mask
    dx *= cache.scale
    return dx


def dropout_kind(site: str) -> str:
    """The kind of a dropout site (config.DROPOUT_KINDS), read from its name: "...embedding_dropout" (the summed
    embeddings), "...attn.dropout" (attention probabilities), "...ffn.dropout" (the feed-forward's hidden
    activation); any other site is a sublayer's output before the residual add ("...self_attn_dropout")."""
    if site.endswith("embedding_dropout"):
        return "embedding"
    if site.endswith("attn.dropout"):
        return "attention"
    if site.endswith("ffn.dropout"):
        return "activation"
    return "residual"


class Dropout:
    """Where the keep-masks of one forward pass come from, by dropout site name.

    Either draws them from `rng` (keep with probability 1 - p) and records them in `masks`, or,
    when built with `masks=`, hands out exactly those (so two implementations drop the same units).
    Site names: "encoder.embedding_dropout", "{layer}.self_attn.dropout" (attention probabilities),
    "{layer}.ffn.dropout" (FFN hidden), "{layer}.self_attn_dropout" (sublayer output), and so on.
    `p` is one rate for every site, or {kind: rate} by dropout_kind (config.dropout_rates); a site whose
    rate is 0 draws no mask and is the identity.
    """

    def __init__(self, p: float | dict, rng: np.random.Generator | None = None, masks: dict | None = None):
        if masks is None and rng is None:
            raise ValueError("Dropout needs either rng= to draw masks or masks= to replay them")
        self.p = p
        self.rng = rng
        self.replay = masks is not None
        self.masks = {} if masks is None else masks
        self.used: set = set()

    def rate(self, site: str) -> float:
        """The dropout rate of `site`."""
        return self.p[dropout_kind(site)] if isinstance(self.p, dict) else self.p

    def keep_mask(self, site: str, shape: tuple) -> np.ndarray:
        self.used.add(site)
        if self.replay:
            if site not in self.masks:
                raise ValueError(f"dropout_masks: no mask for site {site!r} (expected shape {shape})")
            mask = np.asarray(self.masks[site])
            if mask.shape != tuple(shape) or mask.dtype != np.bool_:
                raise ValueError(
                    f"dropout_masks[{site!r}] must be a bool array of shape {tuple(shape)}, "
                    f"got {mask.dtype} array of shape {mask.shape}"
                )
            return mask
        if self.rng is None:  # __init__ checked that one of masks and rng is given
            raise ValueError(f"dropout: no mask for site {site!r} and no rng to draw one")
        mask = self.rng.random(shape, dtype=np.float32) >= self.rate(site)
        self.masks[site] = mask
        return mask

    def check_all_used(self) -> None:
        """After a forward pass: replayed masks for sites the model does not have are a mistake."""
        unknown = sorted(set(self.masks) - self.used)
        if unknown:
            raise ValueError(f"dropout_masks: unknown sites {unknown}; this model's sites are {sorted(self.used)}")


def dropout_site(dropout: Dropout | None, site: str, x: np.ndarray) -> tuple[np.ndarray, DropoutCache]:
    """Apply the dropout of `site` to x (identity when dropout is None); returns (out, cache)."""
    if dropout is None or dropout.rate(site) == 0.0:
        return dropout_forward(x)
    return dropout_forward(x, dropout.rate(site), dropout.keep_mask(site, x.shape))


# ----------------------------------------------------------------------------------------------
# Layer norm over the last axis, as torch.nn.LayerNorm: biased variance, eps inside the root.


@dataclass(frozen=True, slots=True)
class LayerNormCache:
    x_hat: np.ndarray  # (x - mean) * rstd, (..., D)
    rstd: np.ndarray  # r = 1 / sqrt(var + eps), (..., 1)
    weight: np.ndarray  # gamma (D,)


def layer_norm_forward(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, eps: float
) -> tuple[np.ndarray, LayerNormCache]:
    r"""Layer norm over the last axis (D), with the row's mean :math:`\mu` and biased variance :math:`\sigma^2`, the
    gain :math:`\gamma` = weight and the bias :math:`\beta` = bias (None: no bias, ModernBERT's, as
    nn.LayerNorm(bias=False)):

    .. math::

        y = \frac{x - \mu}{\sqrt{\sigma^2 + \varepsilon}} \odot \gamma + \beta
    """
    mean = x.mean(axis=-1, keepdims=True)  # (..., 1)
    x_hat = x - mean
    with np.errstate(over="ignore"):  # an overflow is reported by check_statistics, as a ValueError
        var = np.vecdot(x_hat, x_hat)[..., None] / x.shape[-1]  # biased: divides by D
    rstd = 1.0 / np.sqrt(var + eps)  # (..., 1)
    check_statistics("layer_norm", rstd, x.dtype)
    x_hat *= rstd  # (x - mean) * rstd, in place
    out = x_hat * weight
    if bias is not None:
        out += bias
    return out, LayerNormCache(x_hat, rstd, weight)


def layer_norm_backward(dout: np.ndarray, cache: LayerNormCache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Gradients of :math:`y = \hat x \odot \gamma + \beta`, :math:`\hat x = (x - \mu)\, r`,
    :math:`r = (\sigma^2 + \varepsilon)^{-1/2}`; with :math:`d\hat x = dy \odot \gamma`:

    .. math::

        \begin{gathered}
        d\gamma = \textstyle\sum_{\text{rows}} dy \odot \hat x, \qquad d\beta = \textstyle\sum_{\text{rows}} dy, \\
        dx = r \big(d\hat x - \mathrm{mean}(d\hat x) - \hat x\, \mathrm{mean}(d\hat x \odot \hat x)\big)
        \end{gathered}

    Returns dx (..., D), dweight and dbias (D,); the means are over the last axis. The two subtracted terms are the
    paths through the mean and the variance.
    """
    x_hat, rstd, weight = cache.x_hat, cache.rstd, cache.weight
    D = x_hat.shape[-1]
    dout2d, x_hat2d = dout.reshape(-1, D), x_hat.reshape(-1, D)
    # sum over rows of dy * x_hat without an (N, D) temporary (a two-operand reduction: einsum's
    # `optimize` does not apply, and is 50x slower here)
    dweight = np.einsum("nd,nd->d", dout2d, x_hat2d)
    dbias = dout2d.sum(axis=0)
    dx_hat = dout * weight
    dx_hat_mean = dx_hat.mean(axis=-1, keepdims=True)  # (..., 1)
    dx_hat_x_mean = np.vecdot(dx_hat, x_hat)[..., None] / D  # mean(dx_hat * x_hat), (..., 1)
    dx = x_hat * dx_hat_x_mean
    np.subtract(dx_hat, dx, out=dx)  # dx_hat - x_hat * mean(dx_hat x_hat), in place
    dx -= dx_hat_mean
    dx *= rstd
    return dx, dweight, dbias


def check_statistics(name: str, rstd: np.ndarray, dtype: DTypeLike) -> None:
    r"""A norm's :math:`r` per row, (..., 1) (:math:`1 / \sqrt{\sigma^2 + \varepsilon}`, or RMSNorm's
    :math:`1 / \sqrt{\mathrm{mean}(x^2) + \varepsilon}`): 0 when the squares overflowed the dtype
    (:math:`\lvert x \rvert` beyond about :math:`10^{19}` in float32), NaN when the input held NaN or inf. Either
    way the norm of the row is lost: ValueError, instead of an output of zeros (torch returns NaN for layer norm,
    zeros for RMSNorm)."""
    if not (rstd > 0).all():  # False for 0 and for NaN
        raise ValueError(
            f"{name}: a row's mean square is not finite in {np.dtype(dtype)} (its input is too large for the "
            "dtype, or holds NaN or inf): the row cannot be normalised"
        )


# ----------------------------------------------------------------------------------------------
# RMSNorm over the last axis (Llama): no centring and no bias, only the root mean square.


@dataclass(frozen=True, slots=True)
class RMSNormCache:
    x_hat: np.ndarray  # x * rstd, (..., D)
    rstd: np.ndarray  # r = 1 / sqrt(mean(x^2) + eps), (..., 1)
    weight: np.ndarray  # the gain gamma (D,) (Gemma's: 1 + w)


def rms_norm_forward(x: np.ndarray, weight: np.ndarray, eps: float) -> tuple[np.ndarray, RMSNormCache]:
    r"""RMSNorm over the last axis (D), with the gain :math:`\gamma` = weight:

    .. math::

        y = \frac{x}{\sqrt{\mathrm{mean}(x^2) + \varepsilon}} \odot \gamma
    """
    with np.errstate(over="ignore"):  # an overflow is reported by check_statistics, as a ValueError
        rstd = 1.0 / np.sqrt(np.vecdot(x, x)[..., None] / x.shape[-1] + eps)  # (..., 1)
    check_statistics("rms_norm", rstd, x.dtype)
    x_hat = x * rstd
    return x_hat * weight, RMSNormCache(x_hat, rstd, weight)


def rms_norm_backward(dout: np.ndarray, cache: RMSNormCache) -> tuple[np.ndarray, np.ndarray]:
    r"""Gradients of :math:`y = \hat x \odot \gamma`, :math:`\hat x = x\, r`,
    :math:`r = (\nu + \varepsilon)^{-1/2}`, :math:`\nu = \mathrm{mean}(x^2)`; with :math:`d\hat x = dy \odot \gamma`:

    .. math::

        d\gamma = \textstyle\sum_{\text{rows}} dy \odot \hat x, \qquad
        dx = r \big(d\hat x - \hat x\, \mathrm{mean}(d\hat x \odot \hat x)\big)

    Returns dx (..., D) and dweight (D,). :math:`\partial r / \partial x_j = -r^3 x_j / D` gives the second term;
    there is no mean to subtract, so layer norm's :math:`\mathrm{mean}(d\hat x)` term is absent.
    """
    x_hat, rstd, weight = cache.x_hat, cache.rstd, cache.weight
    D = x_hat.shape[-1]
    dweight = np.einsum("nd,nd->d", dout.reshape(-1, D), x_hat.reshape(-1, D))  # as in layer_norm_backward
    dx_hat = dout * weight
    dx = x_hat * (np.vecdot(dx_hat, x_hat)[..., None] / D)
    np.subtract(dx_hat, dx, out=dx)
    dx *= rstd
    return dx, dweight


def offset_rms_norm_forward(x: np.ndarray, weight: np.ndarray, eps: float) -> tuple[np.ndarray, RMSNormCache]:
    r"""Gemma's RMSNorm, whose parameter w is the gain's offset from one: the gain is :math:`\gamma = 1 + w`
    (w = 0 is the identity gain; transformers computes it in float32, here in x's dtype),

    .. math::

        y = \frac{x}{\sqrt{\mathrm{mean}(x^2) + \varepsilon}} \odot (1 + w)
    """
    return rms_norm_forward(x, 1.0 + weight, eps)


def offset_rms_norm_backward(dout: np.ndarray, cache: RMSNormCache) -> tuple[np.ndarray, np.ndarray]:
    r"""RMSNorm's gradients with :math:`\gamma = 1 + w`; :math:`\partial\gamma / \partial w = 1`, so w gets
    :math:`d\gamma` unchanged. With :math:`g = dy \odot (1 + w)`:

    .. math::

        dw = \textstyle\sum_{\text{rows}} dy \odot \hat x, \qquad
        dx = r \big(g - \hat x\, \mathrm{mean}(g \odot \hat x)\big)

    Returns dx (..., D) and dweight (D,). The cache is RMSNorm's (its weight field holds the gain 1 + w)."""
    return rms_norm_backward(dout, cache)


# ----------------------------------------------------------------------------------------------
# The norms as pairs on a params dict ({"weight", "bias"} or {"weight"}), grads dict keyed alike: what
# norm_forward chooses between by config.norm.


def layer_norm_params_forward(params: dict, x: np.ndarray, eps: float) -> tuple[np.ndarray, LayerNormCache]:
    """layer_norm_forward on params weight and, when present, bias (config.norm_bias False: weight only)."""
    return layer_norm_forward(x, params["weight"], params.get("bias"), eps)


def layer_norm_params_backward(dout: np.ndarray, cache: LayerNormCache) -> tuple[np.ndarray, dict]:
    """layer_norm_backward: dx and {"weight": dgamma, "bias": dbeta} (norm_backward drops a bias the params lack)."""
    dx, dweight, dbias = layer_norm_backward(dout, cache)
    return dx, {"weight": dweight, "bias": dbias}


def rms_weight(params: dict, kind: str) -> np.ndarray:
    """An RMSNorm's one parameter, params["weight"]; ValueError when params holds a bias as well."""
    if "bias" in params:
        raise ValueError(f"norm_forward: RMSNorm has no bias, but params holds one (kind {kind!r} takes weight only)")
    return params["weight"]


def rms_norm_params_forward(params: dict, x: np.ndarray, eps: float) -> tuple[np.ndarray, RMSNormCache]:
    """rms_norm_forward on params weight (no bias)."""
    return rms_norm_forward(x, rms_weight(params, "rms"), eps)


def offset_rms_norm_params_forward(params: dict, x: np.ndarray, eps: float) -> tuple[np.ndarray, RMSNormCache]:
    """offset_rms_norm_forward (gain 1 + weight) on params weight (no bias)."""
    return offset_rms_norm_forward(x, rms_weight(params, "rms_offset"), eps)


def rms_norm_params_backward(dout: np.ndarray, cache: RMSNormCache) -> tuple[np.ndarray, dict]:
    """rms_norm_backward (both RMS kinds: w of the gain 1 + w gets dgamma unchanged): dx and {"weight": dgamma}."""
    dx, dweight = rms_norm_backward(dout, cache)
    return dx, {"weight": dweight}


# A norm's pair on a params dict: forward (params, x, eps) -> (y, cache), backward (dy, cache) -> (dx, grads).
NormPair = tuple[
    Callable[[dict, np.ndarray, float], tuple[np.ndarray, LayerNormCache | RMSNormCache]],
    Callable[[np.ndarray, Any], tuple[np.ndarray, dict]],
]

# The one place that chooses the normalisation, read by norm_forward and norm_backward: config.norm is "layer",
# "rms" or "rms_offset" (Gemma's 1 + w gain).
NORM_PAIRS: dict[str, NormPair] = {
    "layer": (layer_norm_params_forward, layer_norm_params_backward),
    "rms": (rms_norm_params_forward, rms_norm_params_backward),
    "rms_offset": (offset_rms_norm_params_forward, rms_norm_params_backward),
}


@dataclass(frozen=True, slots=True)
class NormCache:
    kind: str  # the NORM_PAIRS entry norm_forward ran, whose backward norm_backward runs
    norm: LayerNormCache | RMSNormCache  # that pair's cache
    names: tuple[str, ...]  # the params it read ("weight", and "bias"): its grads are keyed alike


def norm_forward(params: dict, x: np.ndarray, kind: str, eps: float) -> tuple[np.ndarray, NormCache]:
    """LayerNorm (kind "layer"; params weight and bias, or weight only: config.norm_bias False), RMSNorm ("rms";
    weight only) or Gemma's RMSNorm of gain 1 + weight ("rms_offset"; weight only) of x (..., D): NORM_PAIRS[kind]."""
    if kind not in NORM_PAIRS:
        raise ValueError(f"norm kind must be 'layer', 'rms' or 'rms_offset', got {kind!r}")
    forward, _ = NORM_PAIRS[kind]
    out, norm_cache = forward(params, x, eps)
    return out, NormCache(kind, norm_cache, tuple(k for k in ("weight", "bias") if k in params))


def norm_backward(dout: np.ndarray, cache: NormCache) -> tuple[np.ndarray, dict]:
    """Backward of norm_forward, the backward of the pair it ran: dx and the grads dict keyed like its params
    ("weight", and "bias")."""
    _, backward = NORM_PAIRS[cache.kind]
    dx, grads = backward(dout, cache.norm)
    return dx, {k: grads[k] for k in cache.names}


# ----------------------------------------------------------------------------------------------
# Position-wise feed-forward block: linear2(dropout(act(linear1(x)))). The biases are optional
# (absent from params when config.bias is False, as in Llama).


@dataclass(frozen=True, slots=True)
class FeedForwardCache:
    activation_backward: Callable[[np.ndarray, Any], np.ndarray]  # phi's backward
    linear1: LinearCache  # a = x W_1^T + b_1
    activation: Any  # phi's own cache
    dropout: DropoutCache
    linear2: LinearCache  # y = drop(phi(a)) W_2^T + b_2


def feed_forward_forward(
    params: dict,
    x: np.ndarray,
    activation: str = "relu",
    dropout: Dropout | None = None,
    site: str = "ffn",
    activations: dict[str, ActivationPair] = ACTIVATIONS,
) -> tuple[np.ndarray, FeedForwardCache]:
    r"""x (B, T, D) -> (B, T, D), with the activation :math:`\phi`:

    .. math::

        y = \mathrm{drop}\big(\phi(x W_1^\top + b_1)\big)\, W_2^\top + b_2

    params: linear1.weight (F, D), linear2.weight (D, F), and linear1.bias (F,), linear2.bias (D,) when the
    layer has biases. activations: name -> (forward, backward) of :math:`\phi`, ACTIVATIONS unless another table
    is passed."""
    act_forward, act_backward = activations[activation]
    a, lin1_cache = linear_forward(x, params["linear1.weight"], params.get("linear1.bias"))  # (B, T, F)
    phi, act_cache = act_forward(a)
    phi, drop_cache = dropout_site(dropout, f"{site}.dropout", phi)
    out, lin2_cache = linear_forward(phi, params["linear2.weight"], params.get("linear2.bias"))  # (B, T, D)
    return out, FeedForwardCache(act_backward, lin1_cache, act_cache, drop_cache, lin2_cache)


def feed_forward_backward(dout: np.ndarray, cache: FeedForwardCache) -> tuple[np.ndarray, dict]:
    r"""Chain rule through :math:`y = \mathrm{drop}(\phi(a))\, W_2^\top + b_2`, :math:`a = x W_1^\top + b_1`,
    one backward per forward line (:math:`d\phi` the gradient of the activation's output):

    .. math::

        d\phi &= \mathrm{drop}^\top(dy\, W_2), \qquad dW_2 = dy^\top \mathrm{drop}(\phi(a)), \qquad
        db_2 = \textstyle\sum_{\text{rows}} dy, \\
        da &= \phi'(a) \odot d\phi, \\
        dx &= da\, W_1, \qquad dW_1 = da^\top x, \qquad db_1 = \textstyle\sum_{\text{rows}} da

    Returns dx (B, T, D) and the grads dict keyed like params.
    """
    grads: dict[str, np.ndarray | None] = {}
    dphi, grads["linear2.weight"], grads["linear2.bias"] = linear_backward(dout, cache.linear2)  # (B, T, F)
    dphi = dropout_backward(dphi, cache.dropout)
    da = cache.activation_backward(dphi, cache.activation)
    dx, grads["linear1.weight"], grads["linear1.bias"] = linear_backward(da, cache.linear1)  # (B, T, D)
    return dx, without_none(grads)


@dataclass(frozen=True, slots=True)
class GatedFeedForwardCache:
    activation_backward: Callable[[np.ndarray, Any], np.ndarray]  # phi's backward
    gate: LinearCache  # g = x W_g^T + b_g
    up: LinearCache  # u = x W_1^T + b_1
    activation: Any  # phi's own cache
    phi_g: np.ndarray  # phi(g) (B, T, F)
    u: np.ndarray  # (B, T, F)
    dropout: DropoutCache
    down: LinearCache  # y = drop(phi(g) * u) W_2^T + b_2


def gated_feed_forward_forward(
    params: dict,
    x: np.ndarray,
    activation: str = "silu",
    dropout: Dropout | None = None,
    site: str = "ffn",
    activations: dict[str, ActivationPair] = ACTIVATIONS,
) -> tuple[np.ndarray, GatedFeedForwardCache]:
    r"""The gated feed-forward block (Llama's SwiGLU when activation :math:`\phi` is "silu"): the gate
    :math:`\phi(g)` scales the up projection u feature by feature,

    .. math::

        g = x W_g^\top + b_g, \qquad u = x W_1^\top + b_1, \qquad \tilde u = \phi(g) \odot u, \qquad
        y = \mathrm{drop}(\tilde u)\, W_2^\top + b_2

    x (B, T, D) -> (B, T, D); params: gate.weight (F, D), linear1.weight (F, D) (Llama's up_proj),
    linear2.weight (D, F) (down_proj), and their biases when the layer has them. activations: name -> (forward,
    backward) of :math:`\phi`, ACTIVATIONS unless another table is passed.
    """
    act_forward, act_backward = activations[activation]
    missing = [k for k in ("gate.weight", "linear1.weight", "linear2.weight") if k not in params]
    if missing:
        raise ValueError(f"gated feed-forward params is missing {missing}; it needs gate, linear1 (up), linear2 (down)")
    g, gate_cache = linear_forward(x, params["gate.weight"], params.get("gate.bias"))  # (B, T, F)
    u, up_cache = linear_forward(x, params["linear1.weight"], params.get("linear1.bias"))  # (B, T, F)
    a, act_cache = act_forward(g)
    h = a * u
    h, drop_cache = dropout_site(dropout, f"{site}.dropout", h)
    out, down_cache = linear_forward(h, params["linear2.weight"], params.get("linear2.bias"))  # (B, T, D)
    return out, GatedFeedForwardCache(act_backward, gate_cache, up_cache, act_cache, a, u, drop_cache, down_cache)


def gated_feed_forward_backward(dout: np.ndarray, cache: GatedFeedForwardCache) -> tuple[np.ndarray, dict]:
    r"""Gradients of :math:`y = \mathrm{drop}(\tilde u)\, W_2^\top + b_2`, :math:`\tilde u = \phi(g) \odot u`,
    :math:`g = x W_g^\top + b_g`, :math:`u = x W_1^\top + b_1`. The product rule gives each factor of
    :math:`\tilde u` the gradient :math:`d\tilde u` times the other, and x feeds both the gate and the up
    projection, so the two paths add:

    .. math::

        d\tilde u &= \mathrm{drop}^\top(dy\, W_2), \qquad dW_2 = dy^\top \mathrm{drop}(\tilde u), \qquad
        db_2 = \textstyle\sum_{\text{rows}} dy, \\
        du &= d\tilde u \odot \phi(g), \qquad dW_1 = du^\top x, \qquad db_1 = \textstyle\sum_{\text{rows}} du, \\
        dg &= \phi'(g) \odot d\tilde u \odot u, \qquad dW_g = dg^\top x, \qquad
        db_g = \textstyle\sum_{\text{rows}} dg, \\
        dx &= du\, W_1 + dg\, W_g

    dh (the code's name for :math:`d\tilde u`), du, dg (B, T, F). Returns dx (B, T, D) and the grads dict keyed
    like params.
    """
    grads: dict[str, np.ndarray | None] = {}
    dh, grads["linear2.weight"], grads["linear2.bias"] = linear_backward(dout, cache.down)  # (B, T, F)
    dh = dropout_backward(dh, cache.dropout)
    du = dh * cache.phi_g
    dg = cache.activation_backward(dh * cache.u, cache.activation)
    dx, grads["linear1.weight"], grads["linear1.bias"] = linear_backward(du, cache.up)  # (B, T, D)
    dx_gate, grads["gate.weight"], grads["gate.bias"] = linear_backward(dg, cache.gate)
    dx += dx_gate  # the gate's path and the up projection's path meet at x
    return dx, without_none(grads)


def without_none(grads: dict[str, np.ndarray | None]) -> dict[str, np.ndarray]:
    """grads without the entries of biases the layer does not have (their backward returned None)."""
    return {k: v for k, v in grads.items() if v is not None}


# ----------------------------------------------------------------------------------------------
# The residual sublayer around attention or the feed-forward block, in either placement of the norm:
#   post-norm (the paper):  h = x,        out = Norm(x + drop(f(h)))
#   pre-norm:               h = Norm(x),  out = x + drop(f(h))
# Two pairs stand on either side of the sublayer f, which the caller runs between them (no callbacks):
# residual_in makes f's input h, residual_out joins f's output y to the residual stream. Backwards, x gets
# two gradients, one along the residual path (from residual_out_backward) and one through f (from
# residual_in_backward), and the caller adds them. Norm is layer norm or RMSNorm (norm_forward), `norm`
# its params ({"weight", "bias"} or {"weight"}), which come first, as every composite pair's params do.


@dataclass(frozen=True, slots=True)
class ResidualInCache:
    norm: NormCache | None  # pre-norm: the norm's cache; post-norm (or no norm): None


def residual_in_forward(
    norm: dict, x: np.ndarray, norm_first: bool, eps: float, kind: str = "layer"
) -> tuple[np.ndarray, ResidualInCache]:
    """The sublayer's input h (B, T, D): Norm(x) in pre-norm, x itself in post-norm."""
    if not norm_first:
        return x, ResidualInCache(None)
    h, norm_cache = norm_forward(norm, x, kind, eps)
    return h, ResidualInCache(norm_cache)


def residual_in_backward(dh: np.ndarray, cache: ResidualInCache) -> tuple[np.ndarray, dict]:
    r""":math:`dx = J_{\mathrm{Norm}}^\top dh` (the norm's backward) in pre-norm, :math:`dx = dh` in post-norm; with
    the norm's grads dict (empty in post-norm)."""
    if cache.norm is None:
        return dh, {}
    return norm_backward(dh, cache.norm)


@dataclass(frozen=True, slots=True)
class ResidualOutCache:
    norm: NormCache | None  # post-norm: the norm's cache; pre-norm: None (its norm is residual_in's)
    dropout: DropoutCache


def residual_out_forward(
    norm: dict,
    x: np.ndarray,
    y: np.ndarray,
    norm_first: bool,
    eps: float,
    dropout: Dropout | None = None,
    site: str = "",
    kind: str = "layer",
) -> tuple[np.ndarray, ResidualOutCache]:
    r"""The sublayer's output y joins the residual stream x (both (B, T, D)): :math:`x + \mathrm{drop}(y)` in
    pre-norm, :math:`\mathrm{Norm}\big(x + \mathrm{drop}(y)\big)` in post-norm."""
    y, drop_cache = dropout_site(dropout, site, y)
    s = x + y
    if norm_first:
        return s, ResidualOutCache(None, drop_cache)
    out, norm_cache = norm_forward(norm, s, kind, eps)
    return out, ResidualOutCache(norm_cache, drop_cache)


def residual_out_backward(dout: np.ndarray, cache: ResidualOutCache) -> tuple[np.ndarray, np.ndarray, dict]:
    r"""Backward of residual_out_forward: dx along the residual path, dy into the sublayer, the norm's grads
    (an empty dict in pre-norm: its norm is residual_in's). With :math:`s = x + \mathrm{drop}(y)`:

    .. math::

        \text{pre-norm, } \mathrm{out} = s&: \qquad dx = d\mathrm{out}, \qquad
        dy = \mathrm{drop}^\top d\mathrm{out}, \\
        \text{post-norm, } \mathrm{out} = \mathrm{Norm}(s)&: \qquad ds = J_{\mathrm{Norm}}^\top d\mathrm{out},
        \qquad dx = ds, \qquad dy = \mathrm{drop}^\top ds
    """
    norm_grads: dict = {}
    if cache.norm is not None:
        dout, norm_grads = norm_backward(dout, cache.norm)  # ds
    return dout, dropout_backward(dout, cache.dropout), norm_grads


@dataclass(frozen=True, slots=True)
class SandwichOutCache:
    norm: NormCache  # the post-norm's cache, z = Norm_post(y)
    dropout: DropoutCache


def sandwich_out_forward(
    post_norm: dict, x: np.ndarray, y: np.ndarray, eps: float, dropout: Dropout | None = None, site: str = "",
    kind: str = "rms",
) -> tuple[np.ndarray, SandwichOutCache]:  # fmt: skip
    r"""Gemma's sandwich: the sublayer's output y is normalised before it joins the residual stream x (both
    (B, T, D)), :math:`\mathrm{out} = x + \mathrm{drop}\big(\mathrm{Norm_{post}}(y)\big)`; the pre-norm of the
    sublayer's input is residual_in's. post_norm: the second norm's params."""
    z, norm_cache = norm_forward(post_norm, y, kind, eps)  # (B, T, D)
    z, drop_cache = dropout_site(dropout, site, z)
    return x + z, SandwichOutCache(norm_cache, drop_cache)


def sandwich_out_backward(dout: np.ndarray, cache: SandwichOutCache) -> tuple[np.ndarray, np.ndarray, dict]:
    r"""Backward of sandwich_out_forward: dx along the residual path, dy into the sublayer through the post-norm,
    and the post-norm's grads. With :math:`z = \mathrm{Norm_{post}}(y)`:

    .. math::

        dx = d\mathrm{out}, \qquad dz = \mathrm{drop}^\top d\mathrm{out}, \qquad
        dy = J_{\mathrm{Norm_{post}}}^\top dz
    """
    dz = dropout_backward(dout, cache.dropout)
    dy, norm_grads = norm_backward(dz, cache.norm)
    return dout, dy, norm_grads


# ----------------------------------------------------------------------------------------------
# Soft-capping (Gemma's final logits): a smooth clamp of every value into (-cap, cap).


@dataclass(frozen=True, slots=True)
class SoftcapCache:
    t: np.ndarray  # tanh(z / cap)


def softcap_forward(z: np.ndarray, cap: float) -> tuple[np.ndarray, SoftcapCache]:
    r""":math:`y = c \tanh(z / c)`, elementwise, c = cap: about z where :math:`|z| \ll c`, never past
    :math:`\pm c`. z (...) -> y (...)."""
    t = np.tanh(z / cap)
    return cap * t, SoftcapCache(t)


def softcap_backward(dout: np.ndarray, cache: SoftcapCache) -> np.ndarray:
    r"""The derivative of :math:`c \tanh(z / c)` is :math:`1 - \tanh^2(z / c)`, so with t = tanh(z / c):

    .. math::

        dz = dy \odot (1 - t^2)
    """
    t = cache.t
    return dout * (1.0 - t * t)
