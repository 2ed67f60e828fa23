"""Scaled dot-product attention and multi-head attention, forward and backward.

Shape letters: B batch, H heads, T_q query positions, T_k key positions, D d_model, Dh = D / H (the head
width :math:`d_h`). The formulas use the symbols of the notation table (docs/notation.md).
Masks are boolean, broadcastable to (B, H, T_q, T_k), and True means "may attend" (the convention
of torch.nn.functional.scaled_dot_product_attention). Causal attention is a score rule, ScoreMod(causal=True)
(scores.py); `is_causal=True` on the public pairs is torch's spelling of the same rule and builds it, nothing more.

Each pair's cache is a frozen dataclass named after it and read only by its backward (AttentionCache.attn.probs,
the plain kernel's probabilities, is the one field meant for readers: plots and walkthroughs). Leaf pairs take
their inputs, then their parameters; multi_head_attention_forward, a composite pair, takes its params dict first.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import DTypeLike

from .flash_attention import FlashAttentionCache, flash_attention_backward, flash_attention_forward
from .layers import (
    Dropout,
    DropoutCache,
    LinearCache,
    NormCache,
    SoftmaxCache,
    dropout_backward,
    dropout_forward,
    linear_backward,
    linear_forward,
    norm_backward,
    norm_forward,
    softmax_backward,
    softmax_forward,
)
from .scores import (
    PLAIN,
    ScoreCapCache,
    ScoreMod,
    attention_scores,
    position_bias_backward,
    positions,
    score_cap_backward,
)
from .sinks import SinkAttentionCache, sink_attention_backward, sink_attention_forward
from .validation import check_float_array, check_ndim, check_score_mask

if TYPE_CHECKING:  # an annotation only: the grader's child runs these pairs with nothing but NumPy beside them
    from transformer_spec.config import RopeScaling


@dataclass(frozen=True, slots=True)
class ScaledDotProductAttentionCache:
    q: np.ndarray  # (B, H, T_q, Dh)
    k: np.ndarray  # (B, H, T_k, Dh)
    v: np.ndarray  # (B, H, T_k, Dh)
    scale: float  # c
    mod: ScoreMod
    q_pos: np.ndarray  # (T_q,)
    k_pos: np.ndarray  # (T_k,)
    table_shape: tuple[int, ...] | None  # T5's bias table's (n_buckets, H), when the scores read it
    probs: np.ndarray  # P before dropout (B, H, T_q, T_k): readable, for plots
    dropped: np.ndarray  # drop(P)
    softmax: SoftmaxCache
    dropout: DropoutCache
    cap: ScoreCapCache | None = None  # the soft-capped scores (mod.softcap, Gemma 2), or None


def scaled_dot_product_attention_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    dropout_p: float = 0.0,
    keep_mask: np.ndarray | None = None,
    *,
    mod: ScoreMod = PLAIN,
    q_pos: np.ndarray | None = None,
    k_pos: np.ndarray | None = None,
    bias_table: np.ndarray | None = None,
) -> tuple[np.ndarray, ScaledDotProductAttentionCache]:
    r"""The paper's equation (1), with the scale :math:`c = 1 / \sqrt{d_h}` and dropout on the probabilities:

    .. math::

        S = c\, Q K^\top, \qquad P = \mathrm{softmax}(S), \qquad O = \mathrm{drop}(P)\, V

    q (B, H, T_q, Dh), k and v (B, H, T_k, Dh), mask broadcastable to (B, H, T_q, T_k), True = may attend.
    keep_mask (B, H, T_q, T_k) drops attention probabilities (inverted dropout, rate dropout_p).
    mod: what else the scores get (scores.ScoreMod: another scale, causal, a sliding window, ALiBi), at the
    positions q_pos (T_q,) and k_pos (T_k,) (default 0 .. T - 1 each). bias_table: T5's (n_buckets, H) relative
    position bias, when mod.relative says so; the backward then returns its gradient.
    Returns out (B, H, T_q, Dh) and a cache whose `probs` are the probabilities before dropout.
    """
    q_pos = positions(q.shape[2]) if q_pos is None else q_pos
    k_pos = positions(k.shape[2]) if k_pos is None else k_pos
    scores, allowed = attention_scores(q, k, mod, q_pos, k_pos, mask, bias_table)  # (B, H, T_q, T_k)
    cap = None if mod.softcap is None else ScoreCapCache(scores, float(mod.softcap))  # softmax leaves S' as it is
    probs, softmax_cache = softmax_forward(scores, allowed)
    dropped, drop_cache = dropout_forward(probs, dropout_p, keep_mask)
    out = dropped @ v  # (B, H, T_q, Dh)
    table_shape = None if bias_table is None else bias_table.shape
    scale = mod.scale_for(q.shape[-1])
    return out, ScaledDotProductAttentionCache(
        q, k, v, scale, mod, q_pos, k_pos, table_shape, probs, dropped, softmax_cache, drop_cache, cap
    )


def scaled_dot_product_attention_backward(
    dout: np.ndarray, cache: ScaledDotProductAttentionCache
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    r"""Gradients of :math:`O = \mathrm{drop}(P)\, V`, :math:`P = \mathrm{softmax}(S)`,
    :math:`S = c\, Q K^\top + \mathrm{bias}` (:math:`c = 1 / \sqrt{d_h}` unless the ScoreMod says otherwise),
    given :math:`dO`; the softmax backward gives zero where masked:

    .. math::

        dV &= \mathrm{drop}(P)^\top dO, \qquad dP = \mathrm{drop}^\top(dO\, V^\top), \\
        dS &= P \odot \big(dP - \mathrm{rowsum}(dP \odot P)\big), \\
        dQ &= c\, dS\, K, \qquad dK = c\, dS^\top Q

    With a soft cap (mod.softcap, :math:`S' = \mathrm{cap} \tanh(S / \mathrm{cap})` read by the softmax), the
    softmax's gradient is :math:`dS'`, and :math:`dS = dS' \odot (1 - (S' / \mathrm{cap})^2)`
    (scores.score_cap_backward) before the lines below it.
    dQ (B, H, T_q, Dh), dK and dV (B, H, T_k, Dh). ALiBi's bias is a constant; when the forward took T5's
    bias table W (n_buckets, H), its gradient :math:`dW_{b, h}` is the sum of :math:`dS_{h, ij}` (before the
    scale: the bias is added after it) over the batch and the pairs (i, j) in bucket b
    (scores.position_bias_backward), returned as the fourth gradient, after dV; without a table the fourth is
    None. Always four values: dq, dk, dv, dtable.
    """
    q, k, v = cache.q, cache.k, cache.v
    dv = cache.dropped.swapaxes(-1, -2) @ dout  # (B, H, T_k, Dh)
    dprobs = np.einsum("bhqd,bhkd->bhqk", dout, v, optimize=True)  # dO V^T (B, H, T_q, T_k): as the scores' Q K^T
    dprobs = dropout_backward(dprobs, cache.dropout)
    dscores = softmax_backward(dprobs, cache.softmax)
    if cache.cap is not None:  # back through S' = cap tanh(S / cap)
        dscores = score_cap_backward(dscores, cache.cap)
    dtable = None
    if cache.table_shape is not None:  # the bias was added after the scale: it gets dS itself
        dtable = position_bias_backward(dscores, cache.mod, cache.q_pos, cache.k_pos, cache.table_shape)
    dscores *= cache.scale
    dq = dscores @ k  # (B, H, T_q, Dh)
    dk = dscores.swapaxes(-1, -2) @ q  # (B, H, T_k, Dh)
    return dq, dk, dv, dtable


def split_heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    """(B, T, H*Dh) -> (B, H, T, Dh): head h takes columns h*Dh:(h+1)*Dh."""
    B, T, width = x.shape
    return x.reshape(B, T, n_heads, width // n_heads).transpose(0, 2, 1, 3)  # (B, H, T, Dh)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(B, H, T, Dh) -> (B, T, H*Dh), the inverse of split_heads."""
    B, H, T, Dh = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * Dh)  # (B, T, H*Dh)


def causal_mask(T_q: int, T_k: int) -> np.ndarray:
    """Query i may attend to keys j <= i. (1, 1, T_q, T_k); for T_q != T_k aligned at the top left,
    as is_causal in torch's scaled_dot_product_attention. A helper for tests and walkthroughs that spell the causal
    rule out as a mask: the library itself asks for causal attention with ScoreMod(causal=True)."""
    return np.tri(T_q, T_k, dtype=bool)[None, None]


# ----------------------------------------------------------------------------------------------
# Rotary position embedding (RoPE, Su et al.; Llama), in Hugging Face's half-split layout: feature i of
# a head is paired with feature i + Dh/2, and the pair is rotated by the angle pos * theta^(-2i/Dh).
# Applied to queries and keys, so the score q_t . k_t' = q R(t)^T R(t') k = q R(t' - t) k depends on the
# positions only through their distance.


def rope_angles(
    positions: np.ndarray,
    head_dim: int,
    theta: float,
    dtype: DTypeLike = np.float64,
    scaling: RopeScaling | None = None,
    max_len: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    r"""cos and sin of the angles :math:`t\, \theta_i`, :math:`\theta_i = \mathrm{base}^{-2i/d_h}` (base: the
    argument `theta`), for every position t and :math:`i < d_h / 2`; each (T, Dh/2), or (B, T, Dh/2) for positions
    (B, T) (a padded batch, each row its own). With `scaling` (a scaled RoPE, rope_frequencies), the frequencies of
    a sequence reaching the largest of `positions` and cos and sin times the scaling's attention factor; max_len:
    the model's max_position_embeddings. Computed in float64, then cast."""
    positions = np.asarray(positions, dtype=np.float64)
    seq_len = int(positions.max()) + 1 if positions.size else 0  # the length dynamic and longrope choose by
    inv_freq, factor = rope_frequencies(head_dim, theta, scaling, max_len, seq_len)  # (Dh/2,), a float
    angles = positions[..., None] * inv_freq  # (T, Dh/2), or (B, T, Dh/2)
    return (factor * np.cos(angles)).astype(dtype), (factor * np.sin(angles)).astype(dtype)


# Scaled RoPE: each kind changes the inverse frequencies (and yarn and longrope the size of cos and sin); the
# rotation itself, and so its backward (the transpose), stays as it is. One function per kind, chosen in
# rope_frequencies. Each takes the plain frequencies base^(-2i/R) (R/2,) and returns (frequencies, attention factor).


def linear_frequencies(
    inv_freq: np.ndarray, theta: float, dim: int, s: RopeScaling, max_len: int, seq_len: int
) -> tuple[np.ndarray, float]:
    """Position interpolation: every frequency / factor (position t turns as t / factor did)."""
    return inv_freq / s.length_factor(max_len), 1.0


def dynamic_frequencies(
    inv_freq: np.ndarray, theta: float, dim: int, s: RopeScaling, max_len: int, seq_len: int
) -> tuple[np.ndarray, float]:
    """Dynamic NTK: past max_len positions (L = seq_len) the base grows to
    base (factor L / max_len - (factor - 1))^(R / (R - 2)); up to max_len, plain RoPE."""
    length, factor = max(seq_len, max_len), s.length_factor(max_len)
    base = theta * (factor * length / max_len - (factor - 1)) ** (dim / (dim - 2))
    return base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim), 1.0


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's 0.1 mscale ln(scale) + 1 (1 for scale <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_frequencies(
    inv_freq: np.ndarray, theta: float, dim: int, s: RopeScaling, max_len: int, seq_len: int
) -> tuple[np.ndarray, float]:
    r"""YaRN: frequency i is :math:`(1 - e_i)\, \theta_i / f + e_i\, \theta_i`, :math:`e_i = 1 - \mathrm{ramp}(i)`
    with the ramp 0 below the dimension turning beta_fast times over the original length and 1 above the one turning
    beta_slow times (floored and ceiled unless truncate is False); cos and sin times attention_factor."""
    factor, original = s.length_factor(max_len), s.original_length(max_len)
    attention = s.attention_factor
    if attention is None:
        attention = yarn_mscale(factor)
        mscale, mscale_all_dim = s.mscale, s.mscale_all_dim
        if mscale and mscale_all_dim:
            attention = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)

    def turning_dim(rotations: float) -> float:  # the dimension that turns `rotations` times over `original`
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = turning_dim(s.beta_fast or 32), turning_dim(s.beta_slow or 1)
    if s.truncate is not False:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high + 0.001 if low == high else high  # a ramp of width 0 would divide by zero
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)  # (R/2,)
    kept = 1.0 - ramp  # the share of the original frequency (extrapolated), the rest interpolated
    return inv_freq / factor * (1 - kept) + inv_freq * kept, float(attention)


def longrope_frequencies(
    inv_freq: np.ndarray, theta: float, dim: int, s: RopeScaling, max_len: int, seq_len: int
) -> tuple[np.ndarray, float]:
    """LongRoPE: frequency i / short_factor[i], or / long_factor[i] when the sequence is longer than the original
    length; cos and sin times attention_factor (default sqrt(1 + ln f / ln original), 1 when f <= 1)."""
    original, factor = s.original_length(max_len), s.length_factor(max_len)
    attention = s.attention_factor
    if attention is None:
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    divisors = (s.long_factor if seq_len > original else s.short_factor) or ()  # (R/2,), validated
    return inv_freq / np.asarray(divisors, dtype=np.float64), float(attention)


def llama3_frequencies(
    inv_freq: np.ndarray, theta: float, dim: int, s: RopeScaling, max_len: int, seq_len: int
) -> tuple[np.ndarray, float]:
    """Llama 3.1: wavelengths 2 pi / theta_i longer than original / low_freq_factor divided by factor, shorter than
    original / high_freq_factor kept, between them a blend by s = (original / wavelength - low) / (high - low):
    (1 - s) theta_i / factor + s theta_i."""
    original, factor = s.original_length(max_len), s.length_factor(max_len)
    low, high = s.low_freq_factor or 1.0, s.high_freq_factor or 4.0  # (both validated present)
    wavelength = 2 * math.pi / inv_freq  # (R/2,)
    long_waves, short_waves = wavelength > original / low, wavelength < original / high
    smooth = (original / wavelength - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return np.where(long_waves, inv_freq / factor, np.where(short_waves, inv_freq, blended)), 1.0


SCALED_FREQUENCIES = {
    "linear": linear_frequencies,
    "dynamic": dynamic_frequencies,
    "yarn": yarn_frequencies,
    "longrope": longrope_frequencies,
    "llama3": llama3_frequencies,
}


def rope_frequencies(
    dim: int, theta: float, scaling: RopeScaling | None = None, max_len: int = 0, seq_len: int = 0
) -> tuple[np.ndarray, float]:
    """The inverse frequencies (R/2,) float64 of a RoPE turning R = dim features at base theta, and the factor on
    cos and sin: base^(-2i/R) and 1 for plain RoPE, else as the scaling's kind computes them (SCALED_FREQUENCIES)
    for a sequence of seq_len positions in a model of max_len (max_position_embeddings)."""
    inv_freq = theta ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)  # (R/2,)
    if scaling is None:
        return inv_freq, 1.0
    return SCALED_FREQUENCIES[scaling.rope_type](inv_freq, theta, dim, scaling, max_len, seq_len)


@dataclass(frozen=True, slots=True)
class RopeCache:
    cos: np.ndarray  # (T, R/2), or (B, 1, T, R/2)
    sin: np.ndarray


def rope_forward(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> tuple[np.ndarray, RopeCache]:
    r"""Rotate every pair :math:`(x_i, x_{i + R/2})` of the first R features of x (B, H, T, Dh) by its angle
    :math:`t\, \theta_i` (the tables cos and sin, (T, R/2), of rope_angles); R = Dh, or (partial rotary, GPT-NeoX)
    fewer: the features from R on pass through unchanged. R is read from the tables' width:

    .. math::

        y_i &= x_i \cos t\theta_i - x_{i + R/2} \sin t\theta_i, \\
        y_{i + R/2} &= x_i \sin t\theta_i + x_{i + R/2} \cos t\theta_i, \qquad y_{j \ge R} = x_j
    """
    half = cos.shape[-1]  # R/2
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]  # (B, H, T, R/2) x 2, (.., Dh - R)
    out = np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos, rest], axis=-1)  # (B, H, T, Dh)
    return out, RopeCache(cos, sin)


def rope_backward(dout: np.ndarray, cache: RopeCache) -> np.ndarray:
    r""":math:`y = R x` with R a rotation of each pair, so :math:`dx = R^\top dy`. A rotation is orthogonal: its
    transpose is its inverse, the rotation by the opposite angle (sin -> -sin, cos unchanged); the features
    that pass through (partial rotary, j >= R) pass their gradient through:

    .. math::

        dx_i &= dy_i \cos t\theta_i + dy_{i + R/2} \sin t\theta_i, \\
        dx_{i + R/2} &= -dy_i \sin t\theta_i + dy_{i + R/2} \cos t\theta_i, \qquad dx_{j \ge R} = dy_j
    """
    dx, _ = rope_forward(dout, cache.cos, -cache.sin)
    return dx


# ----------------------------------------------------------------------------------------------
# Grouped-query attention: n_kv_heads K/V heads, each read by n_rep = H / n_kv_heads query heads
# (query head h reads K/V head h // n_rep). Multi-query attention is n_kv_heads = 1.


@dataclass(frozen=True, slots=True)
class RepeatKVCache:
    n_rep: int  # query heads per K/V head


def repeat_kv_forward(x: np.ndarray, n_rep: int) -> tuple[np.ndarray, RepeatKVCache]:
    r"""(B, H_kv, T, Dh) -> (B, H_kv * n_rep, T, Dh), each K/V head repeated for the n_rep query heads it serves:
    query head h reads K/V head :math:`\lfloor h / n_{\mathrm{rep}} \rfloor`."""
    if n_rep == 1:
        return x, RepeatKVCache(n_rep)
    return np.repeat(x, n_rep, axis=1), RepeatKVCache(n_rep)  # (B, H, T, Dh)


def repeat_kv_backward(dout: np.ndarray, cache: RepeatKVCache) -> np.ndarray:
    r"""A K/V head read by n_rep query heads receives the sum of their gradients, (B, H, T, Dh) ->
    (B, H_kv, T, Dh): for K/V head j,

    .. math::

        dx_j = \sum_{r = 0}^{n_{\mathrm{rep}} - 1} dy_{j\, n_{\mathrm{rep}} + r}
    """
    n_rep = cache.n_rep
    if n_rep == 1:
        return dout
    B, H, T, Dh = dout.shape
    return dout.reshape(B, H // n_rep, n_rep, T, Dh).sum(axis=2)  # (B, H_kv, T, Dh)


MHA_KEYS = tuple(f"{p}_proj.{w}" for p in ("q", "k", "v", "out") for w in ("weight", "bias"))


# ----------------------------------------------------------------------------------------------
# Qwen3's q_norm and k_norm: an RMSNorm over each head's Dh features of the queries and of the keys, after the
# projections and before RoPE, with one weight (Dh,) shared by every head. Attention applies it when its params
# hold q_norm.weight and k_norm.weight (config.qk_norm). Gemma's are the same with the gain 1 + weight (kind
# "rms_offset", as its other norms).

QK_NORM_KEYS = ("q_norm.weight", "k_norm.weight")


def qk_norm_forward(x: np.ndarray, weight: np.ndarray, eps: float, kind: str = "rms") -> tuple[np.ndarray, NormCache]:
    r"""RMSNorm of every head's vector: x (B, H, T, Dh), weight (Dh,) -> (B, H, T, Dh),

    .. math::

        y_{bht} = \frac{x_{bht}}{\sqrt{\mathrm{mean}_d\, x_{bhtd}^2 + \varepsilon}} \odot \gamma

    the RMSNorm pair's math over the last axis, every (batch, head, position) a row; :math:`\gamma` = weight
    (kind "rms", Qwen3) or 1 + weight (kind "rms_offset", Gemma). Its cache is the norm pair's, NormCache."""
    return norm_forward({"weight": weight}, x, kind, eps)


def qk_norm_backward(dout: np.ndarray, cache: NormCache) -> tuple[np.ndarray, np.ndarray]:
    r"""With :math:`\hat x = x\, r`, :math:`g = dy \odot \gamma`: each head's vector is a row of its own, and
    the weight is shared by all of them, so its gradient sums over batch, heads and positions:

    .. math::

        dx_{bht} = r_{bht} \big(g_{bht} - \hat x_{bht}\, \mathrm{mean}_d(g_{bht} \odot \hat x_{bht})\big), \qquad
        d\gamma = \textstyle\sum_{b, h, t} dy_{bht} \odot \hat x_{bht}

    Returns dx (B, H, T, Dh) and dweight (Dh,) (Gemma's w = gamma - 1 gets d gamma)."""
    dx, grads = norm_backward(dout, cache)
    return dx, grads["weight"]


# OLMo 2's q_norm and k_norm: one RMSNorm over the whole projection, (B, T, H*Dh) with weight (H*Dh,), before the
# head split (config.qk_norm_projection): a single root mean square over every head of a position, so the heads'
# gradients are coupled through it, unlike the per-head norm above.


def qk_projection_norm_forward(
    x: np.ndarray, weight: np.ndarray, eps: float, kind: str = "rms"
) -> tuple[np.ndarray, NormCache]:
    r"""RMSNorm of a whole projection: x (B, T, W), W = H*Dh (H_kv*Dh for the keys), weight (W,) -> (B, T, W),

    .. math::

        y_{bt} = \frac{x_{bt}}{\sqrt{\mathrm{mean}_{j < W}\, x_{btj}^2 + \varepsilon}} \odot \gamma

    one root mean square per (batch, position) over all the heads' features together; :math:`\gamma` = weight (kind
    "rms", OLMo 2's). The cache is the norm pair's, NormCache."""
    return norm_forward({"weight": weight}, x, kind, eps)


def qk_projection_norm_backward(dout: np.ndarray, cache: NormCache) -> tuple[np.ndarray, np.ndarray]:
    r"""With :math:`r_{bt} = (\mathrm{mean}_j x_{btj}^2 + \varepsilon)^{-1/2}`, :math:`\hat x = x\, r` and
    :math:`g = dy \odot \gamma`: :math:`\partial r / \partial x_{btj} = -r^3 x_{btj} / W`, so every feature's
    gradient carries the whole row's :math:`\sum_j g_j \hat x_j` (all heads, not its own head's only):

    .. math::

        dx_{bt} = r_{bt} \big(g_{bt} - \hat x_{bt}\, \mathrm{mean}_{j < W}(g_{btj}\, \hat x_{btj})\big), \qquad
        d\gamma = \textstyle\sum_{b, t} dy_{bt} \odot \hat x_{bt}

    Returns dx (B, T, W) and dweight (W,)."""
    dx, grads = norm_backward(dout, cache)
    return dx, grads["weight"]


# ----------------------------------------------------------------------------------------------
# Decoding caches, updated inside attention (as transformers' past_key_values.update is): a step runs only
# the new positions, and attention reads the keys and values of every earlier one from here.


class KVCache:
    """A self-attention layer's keys and values of the positions run so far, per K/V head (rotated, with RoPE),
    for N rows decoded side by side (a batch, or its beams): (N, H_kv, T_max, Dh) buffers filled step by step.

    With `window` (a sliding window) the buffers hold only the last `window` positions, position p in slot
    p % window (a rolling cache): a query never sees further back, so the cache stays the window's size however
    long the sequence grows. Each slot's position is kept beside it, and that is what the score rules read.
    """

    def __init__(
        self, n_rows: int, n_kv_heads: int, max_len: int, head_dim: int, dtype: DTypeLike, window: int | None = None
    ) -> None:
        size = max_len if window is None else min(max_len, window)
        self.keys = np.zeros((n_rows, n_kv_heads, size, head_dim), dtype=dtype)  # (N, H_kv, T_max, Dh)
        self.values = np.zeros_like(self.keys)
        self.positions = np.full(size, -1, dtype=np.int64)  # the position in each slot; -1: empty
        self.window = window
        self.length = 0  # positions added so far

    def update(self, k: np.ndarray, v: np.ndarray, k_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Add the new keys and values (N, H_kv, T_new, Dh) at positions k_pos (T_new,); return what attention
        reads now: every cached key and value (the new ones included) and their positions."""
        size, T_new = self.keys.shape[2], k.shape[2]
        if self.window is None:  # slot = position: write, then read the filled prefix
            end = self.length + T_new
            self.keys[:, :, self.length : end], self.values[:, :, self.length : end] = k, v
            self.positions[self.length : end] = k_pos
            self.length = end
            return self.keys[:, :, :end], self.values[:, :, :end], self.positions[:end]
        # rolling: the new queries read what the window kept and every new key (a prompt may be longer than the
        # window), then the slots take the newest positions
        filled = self.positions >= 0
        keys = np.concatenate([self.keys[:, :, filled], k], axis=2)  # (N, H_kv, T_kept + T_new, Dh)
        values = np.concatenate([self.values[:, :, filled], v], axis=2)
        pos = np.concatenate([self.positions[filled], k_pos])
        newest = slice(max(0, T_new - size), T_new)
        slots = k_pos[newest] % size
        self.keys[:, :, slots], self.values[:, :, slots] = k[:, :, newest], v[:, :, newest]
        self.positions[slots] = k_pos[newest]
        self.length += T_new
        return keys, values, pos

    def reorder(self, rows: np.ndarray) -> None:
        """Beam search: row n continues the hypothesis of row rows[n], so it takes that row's keys and values."""
        self.keys[:] = self.keys[rows]
        self.values[:] = self.values[rows]


class MemoryCache:
    """Cross-attention's keys and values of the encoder output: projected at the first step, read at every
    step after (the memory does not change while the decoder runs)."""

    def __init__(self) -> None:
        self.keys: np.ndarray | None = None  # (N, H_kv, S, Dh)
        self.values: np.ndarray | None = None

    def reorder(self, rows: np.ndarray) -> None:
        pass  # rows[n] is always a beam of the same source, and all beams of a source hold the same memory


@dataclass(frozen=True, slots=True)
class AttentionCache:
    """What multi_head_attention_backward needs, by name."""

    n_heads: int
    kernel: str  # "plain" or "flash": the pair that made `attn`, so the one whose backward reads it
    q: LinearCache  # the four projections
    k: LinearCache | None  # None when the keys and values came from a MemoryCache
    v: LinearCache | None
    out: LinearCache
    rope: RopeCache | None  # rotary positions, or None
    repeat_kv: RepeatKVCache  # query heads per K/V head
    # the kernel's own; the plain one's .probs (plots); with sinks in params (GPT-OSS), sinks.sink_attention_forward's
    attn: ScaledDotProductAttentionCache | FlashAttentionCache | SinkAttentionCache
    decoding: bool = False  # keys and values came from a decoding cache: a forward-only call
    q_norm: NormCache | None = None  # qk_norm_forward's caches of the queries and the keys (Qwen3), or None
    k_norm: NormCache | None = None
    qk_norm_projection: bool = False  # the norms were over each whole projection (OLMo 2), before the head split


@dataclass(frozen=True, slots=True)
class _Projected:
    """The heads of one attention call, after the projections (and qk-norm, RoPE, the decoding cache)."""

    q: np.ndarray  # (B, H, T_q, Dh)
    k: np.ndarray  # (B, H_kv, T_k, Dh)
    v: np.ndarray  # (B, H_kv, T_k, Dh)
    k_pos: np.ndarray  # (T_k,)
    q_cache: LinearCache
    k_cache: LinearCache | None
    v_cache: LinearCache | None
    rope: RopeCache | None
    q_norm: NormCache | None
    k_norm: NormCache | None


def multi_head_attention_forward(
    params: dict,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    n_heads: int,
    attn_mask: np.ndarray | None = None,
    dropout: Dropout | None = None,
    site: str = "attn",
    *,
    n_kv_heads: int | None = None,
    rope: tuple[np.ndarray, np.ndarray] | None = None,
    is_causal: bool = False,
    kernel: str = "plain",
    mod: ScoreMod = PLAIN,
    cross: bool = False,
    q_pos: np.ndarray | None = None,
    kv_cache: KVCache | MemoryCache | None = None,
    bias_table: np.ndarray | None = None,
    key_padding: np.ndarray | None = None,
    qk_norm_eps: float = 1e-6,
    qk_norm_kind: str = "rms",
    qk_norm_projection: bool = False,
) -> tuple[np.ndarray, AttentionCache]:
    r"""Multi-head attention of the inputs query, key and value (:math:`X_q, X_k, X_v`): each head h attends with
    its own block of :math:`d_h` columns of the projections, then the output projection mixes the heads:

    .. math::

        Q &= X_q W_Q^\top + b_Q, \qquad K = X_k W_K^\top + b_K, \qquad V = X_v W_V^\top + b_V, \\
        O_h &= \mathrm{Attention}(Q_h, K_h, V_h), \qquad Y = \mathrm{Concat}(O_1, \dots, O_H)\, W_O^\top + b_O

    params: q_proj.weight (H*Dh, D), k_proj.weight and v_proj.weight (H_kv*Dh, D), out_proj.weight (D, H*Dh),
    and their biases, or none of them (bias-free attention, as Llama's), or the q, k, v biases only (Qwen2's).
    Dh, the head width, is q_proj's rows / H: D / H unless the model says otherwise (Qwen3, Gemma).
    query (B, T_q, D), key and value (B, T_k, D); attn_mask broadcastable to (B, H, T_q, T_k),
    True = may attend. Self-attention passes the same array as query, key and value.
    n_kv_heads: K/V heads (grouped-query attention; None = n_heads). rope: (cos, sin) of the positions,
    each (T, Dh/2), to rotate queries and keys with (self-attention, T_q = T_k = T).
    mod: the scores' rules (scores.ScoreMod: scale, causal, a sliding window, ALiBi); is_causal=True is torch's
    name for mod.causal and only sets it. q_pos (T_q,): the queries' positions (default 0 .. T_q - 1).
    cross: the keys are another sequence's (cross-attention), at their own positions 0 .. T_k - 1; in
    self-attention (cross False) they sit at the queries' positions q_pos (0 .. T_k - 1 when q_pos is not given).
    kv_cache: in decoding, a KVCache (self-attention: the new keys are added, attention reads all cached ones)
    or a MemoryCache (cross-attention: the memory's projections, computed once); the call is then forward-only.
    bias_table: T5's relative position bias (n_buckets, H), read when mod.relative says so; its gradient comes
    back in the grads dict as "relative_bias.weight" (the stack that owns the table adds its layers' shares).
    key_padding (B, P) bool, True = a real token, indexed by key position (P covers every key position, the cached
    ones included): padded keys are masked out (a left-padded batch; the key positions of a rolling cache are in
    no fixed order, so the mask is read at them after the cache update).
    With q_norm.weight and k_norm.weight (Dh,) in params (Qwen3), each head's queries and keys are RMS-normalised
    (qk_norm_forward, eps qk_norm_eps, kind qk_norm_kind) after the projections and before RoPE; with
    qk_norm_projection (OLMo 2) the weights are (H*Dh,) and (H_kv*Dh,) and each whole projection is normalised before
    the head split (qk_projection_norm_forward).
    With sinks (H,) in params (GPT-OSS's attention sinks), each head's softmax has its sink logit in the denominator
    (sinks.sink_attention_forward; the plain kernel only); its gradient comes back as "sinks".
    `dropout` (when given) drops attention probabilities at site f"{site}.dropout".
    kernel: "plain" (scaled_dot_product_attention_*, which holds the (B, H, T_q, T_k) probabilities) or
    "flash" (flash_attention_*, tiled: no (T_q, T_k) array, so no probabilities to read, and no dropout).
    Returns out (B, T_q, D) and an AttentionCache; with the plain kernel cache.attn.probs holds the
    probabilities (B, H, T_q, T_k).
    """
    p = _check_kernel(kernel, dropout, site)  # the attention probabilities' dropout rate
    mod = dataclasses.replace(mod, causal=True) if is_causal else mod  # torch's is_causal: the causal score rule
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    _check_attention_inputs(query, key, value, n_heads, attn_mask, n_kv_heads)
    head_dim = _check_attention_params(params, query.shape[-1], n_heads, n_kv_heads, query.dtype, qk_norm_projection)
    _check_rope(rope, query, key, n_heads, head_dim)
    self_pos = None if cross else q_pos  # self-attention's keys sit at the queries' positions, when given
    q_pos = positions(query.shape[1]) if q_pos is None else q_pos
    heads = _project(
        params, query, key, value, n_heads, n_kv_heads, self_pos, kv_cache, rope, qk_norm_eps, qk_norm_kind,
        qk_norm_projection,
    )  # fmt: skip  # (B, H, T_q, Dh) queries, (B, H_kv, T_k, Dh) keys and values
    if key_padding is not None:
        real = key_padding[:, heads.k_pos][:, None, None, :]  # (B, 1, 1, T_k): the keys that are real tokens
        attn_mask = real if attn_mask is None else attn_mask & real
    k, repeat_cache = repeat_kv_forward(heads.k, n_heads // n_kv_heads)  # (B, H, T_k, Dh)
    v, _ = repeat_kv_forward(heads.v, n_heads // n_kv_heads)
    attn_cache: ScaledDotProductAttentionCache | FlashAttentionCache | SinkAttentionCache
    sinks = params.get("sinks")
    if sinks is not None and kernel == "flash":
        raise ValueError("params holds sinks (GPT-OSS's attention sinks): kernel='flash' has none, use kernel='plain'")
    if kernel == "flash" and kv_cache is None:  # the tiled kernel skips the blocks the score rules hide
        context, attn_cache = flash_attention_forward(heads.q, k, v, attn_mask, mod=mod, bias_table=bias_table)
        kernel_used = "flash"
    else:
        keep_mask = None
        if dropout is not None and p > 0:
            B, H, T_q, T_k = query.shape[0], n_heads, query.shape[1], k.shape[2]
            keep_mask = dropout.keep_mask(f"{site}.dropout", (B, H, T_q, T_k))
        if sinks is not None:  # GPT-OSS: a sink logit per head in every softmax's denominator
            check_float_array("params['sinks']", sinks, query.dtype, (n_heads,))
            context, attn_cache = sink_attention_forward(
                heads.q, k, v, sinks, attn_mask, p, keep_mask, mod=mod, q_pos=q_pos, k_pos=heads.k_pos,
                bias_table=bias_table,
            )  # fmt: skip  # (B, H, T_q, Dh)
        else:
            context, attn_cache = scaled_dot_product_attention_forward(
                heads.q, k, v, attn_mask, p, keep_mask, mod=mod, q_pos=q_pos, k_pos=heads.k_pos, bias_table=bias_table
            )  # (B, H, T_q, Dh)
        kernel_used = "plain"
    context = merge_heads(context)  # (B, T_q, H*Dh)
    out, out_cache = linear_forward(context, params["out_proj.weight"], params.get("out_proj.bias"))
    cache = AttentionCache(
        n_heads=n_heads,
        kernel=kernel_used,
        q=heads.q_cache,
        k=heads.k_cache,
        v=heads.v_cache,
        out=out_cache,
        rope=heads.rope,
        repeat_kv=repeat_cache,
        attn=attn_cache,
        decoding=kv_cache is not None,
        q_norm=heads.q_norm,
        k_norm=heads.k_norm,
        qk_norm_projection=qk_norm_projection,
    )
    return out, cache


def _project(
    params: dict,
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    n_heads: int,
    n_kv_heads: int,
    k_pos: np.ndarray | None,
    kv_cache: KVCache | MemoryCache | None,
    rope: tuple[np.ndarray, np.ndarray] | None,
    qk_norm_eps: float,
    qk_norm_kind: str,
    qk_norm_projection: bool = False,
) -> _Projected:
    """The forward's first lines: Q, K, V split into heads (qk-normed, rotated), the decoding cache read and
    extended, and the keys' positions: k_pos (self-attention's, the queries'), or 0 .. T_k - 1 when None."""
    q, q_cache = linear_forward(query, params["q_proj.weight"], params.get("q_proj.bias"))  # (B, T_q, H*Dh)
    qk_norm = "q_norm.weight" in params  # Qwen3: RMSNorm of each head's queries and keys, before RoPE
    q_norm_cache = k_norm_cache = k_cache = v_cache = None
    if qk_norm and qk_norm_projection:  # OLMo 2: of the whole projection, before the split
        q, q_norm_cache = qk_projection_norm_forward(q, params["q_norm.weight"], qk_norm_eps, qk_norm_kind)
    q = split_heads(q, n_heads)  # (B, H, T_q, Dh)
    if qk_norm and not qk_norm_projection:
        q, q_norm_cache = qk_norm_forward(q, params["q_norm.weight"], qk_norm_eps, qk_norm_kind)
    if isinstance(kv_cache, MemoryCache) and kv_cache.keys is not None and kv_cache.values is not None:
        k, v = kv_cache.keys, kv_cache.values  # the memory's, projected at step 1
    else:
        k, k_cache = linear_forward(key, params["k_proj.weight"], params.get("k_proj.bias"))  # (B, T_k, H_kv*Dh)
        v, v_cache = linear_forward(value, params["v_proj.weight"], params.get("v_proj.bias"))  # (B, T_k, H_kv*Dh)
        if qk_norm and qk_norm_projection:
            k, k_norm_cache = qk_projection_norm_forward(k, params["k_norm.weight"], qk_norm_eps, qk_norm_kind)
        k, v = split_heads(k, n_kv_heads), split_heads(v, n_kv_heads)  # (B, H_kv, T_k, Dh)
        if qk_norm and not qk_norm_projection:
            k, k_norm_cache = qk_norm_forward(k, params["k_norm.weight"], qk_norm_eps, qk_norm_kind)
    k_pos = positions(k.shape[2]) if k_pos is None else k_pos
    rope_cache = None
    if rope is not None:
        q, rope_cache = rope_forward(q, *rope)
        if k_cache is not None:  # keys projected here, not read back from a MemoryCache
            k, _ = rope_forward(k, *rope)  # the same positions, so the same rotation (and the same backward)
    if isinstance(kv_cache, KVCache):
        k, v, k_pos = kv_cache.update(k, v, k_pos)  # (N, H_kv, T_cached, Dh): every position so far
    elif isinstance(kv_cache, MemoryCache):
        kv_cache.keys, kv_cache.values = k, v
    return _Projected(q, k, v, k_pos, q_cache, k_cache, v_cache, rope_cache, q_norm_cache, k_norm_cache)


def multi_head_attention_backward(
    dout: np.ndarray, cache: AttentionCache
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    r"""The forward in reverse, given :math:`dY`: the output projection's backward (C the merged heads), each
    head's attention backward on :math:`dO_h = \mathrm{split}(dC)_h`, then the input projections' (the query's
    below; likewise for the key and the value):

    .. math::

        dC &= dY\, W_O, \qquad dW_O = dY^\top C, \qquad db_O = \textstyle\sum_{\text{rows}} dY, \\
        dX_q &= dQ\, W_Q, \qquad dW_Q = dQ^\top X_q, \qquad db_Q = \textstyle\sum_{\text{rows}} dQ

    In between, with grouped-query attention a K/V head's dK and dV are the sums over the query heads that
    share it (repeat_kv_backward), and with RoPE dQ and dK are rotated back by the opposite angle (rope_backward,
    a rotation's transpose).

    dout (B, T_q, D). Returns dquery (B, T_q, D), dkey (B, T_k, D), dvalue (B, T_k, D) and the
    grads dict keyed like params. For self-attention the caller adds the three input gradients.
    Without RoPE the key bias gets zero gradient in exact arithmetic: :math:`q_i \cdot b_K` is shared by every
    key of row i, and softmax ignores a shift shared by a whole row. With RoPE each key's bias is rotated by
    its own angle, the shift is no longer shared, and :math:`b_K` gets a real gradient (Qwen2 has both).
    """
    if not isinstance(cache, AttentionCache):
        raise TypeError(f"cache must be the AttentionCache of multi_head_attention_forward, got {type(cache).__name__}")
    if cache.decoding or cache.k is None or cache.v is None:
        raise ValueError("this forward read its keys from a decoding cache (kv_cache=...): it has no backward")
    grads: dict[str, np.ndarray | None] = {}
    dcontext, grads["out_proj.weight"], grads["out_proj.bias"] = linear_backward(dout, cache.out)
    dcontext_heads = split_heads(dcontext, cache.n_heads)  # (B, H, T_q, Dh)
    if isinstance(cache.attn, FlashAttentionCache):  # cache.kernel == "flash"
        dq, dk, dv, dtable = flash_attention_backward(dcontext_heads, cache.attn)
    elif isinstance(cache.attn, SinkAttentionCache):  # GPT-OSS: the sinks get their gradient too
        dq, dk, dv, dtable, grads["sinks"] = sink_attention_backward(dcontext_heads, cache.attn)
    else:
        dq, dk, dv, dtable = scaled_dot_product_attention_backward(dcontext_heads, cache.attn)
    dk = repeat_kv_backward(dk, cache.repeat_kv)  # (B, H_kv, T_k, Dh)
    dv = repeat_kv_backward(dv, cache.repeat_kv)
    if cache.rope is not None:
        dq = rope_backward(dq, cache.rope)
        dk = rope_backward(dk, cache.rope)
    if cache.q_norm is not None and cache.k_norm is not None and not cache.qk_norm_projection:
        # Qwen3: through each head's RMSNorm of q and k
        dq, grads["q_norm.weight"] = qk_norm_backward(dq, cache.q_norm)
        dk, grads["k_norm.weight"] = qk_norm_backward(dk, cache.k_norm)
    dq, dk = merge_heads(dq), merge_heads(dk)  # (B, T_q, H*Dh), (B, T_k, H_kv*Dh)
    if cache.q_norm is not None and cache.k_norm is not None and cache.qk_norm_projection:  # OLMo 2: whole projection
        dq, grads["q_norm.weight"] = qk_projection_norm_backward(dq, cache.q_norm)
        dk, grads["k_norm.weight"] = qk_projection_norm_backward(dk, cache.k_norm)
    dquery, grads["q_proj.weight"], grads["q_proj.bias"] = linear_backward(dq, cache.q)
    dkey, grads["k_proj.weight"], grads["k_proj.bias"] = linear_backward(dk, cache.k)
    dvalue, grads["v_proj.weight"], grads["v_proj.bias"] = linear_backward(merge_heads(dv), cache.v)
    grads["relative_bias.weight"] = dtable  # T5's table, read by every layer of the stack: the stack adds them
    keys = MHA_KEYS + QK_NORM_KEYS + ("sinks", "relative_bias.weight")
    return dquery, dkey, dvalue, {k: g for k in keys if (g := grads.get(k)) is not None}


def _check_kernel(kernel: str, dropout: Dropout | None, site: str) -> float:
    """kernel is "plain" or "flash", and the flash kernel has no dropout; returns the attention dropout's rate."""
    if kernel not in ("plain", "flash"):
        raise ValueError(f"kernel must be 'plain' or 'flash', got {kernel!r}")
    p = 0.0 if dropout is None else dropout.rate(f"{site}.dropout")  # the attention probabilities' rate
    if kernel == "flash" and p > 0:
        raise ValueError(f"kernel='flash' has no attention dropout: pass dropout=None, got p={p}")
    return p


def _check_attention_params(
    params: dict, D: int, n_heads: int, n_kv_heads: int, dtype: DTypeLike, qk_norm_projection: bool = False
) -> int:
    """Check the projections' names, shapes and dtypes (the q/k norms' per head, or with qk_norm_projection over
    each whole projection); return Dh, the head width (q_proj's rows / n_heads)."""
    weights = [k for k in MHA_KEYS if k.endswith("weight")]
    biases = [k for k in MHA_KEYS if k.endswith("bias")]
    missing = [k for k in weights if k not in params]
    if missing:
        raise ValueError(f"params is missing {missing}; expected the keys {weights}")
    present = [k for k in biases if k in params]
    no_key_bias = [k for k in biases if not k.startswith("k_proj")]  # Whisper's: every bias but the key's
    if present not in ([], biases, biases[:3], no_key_bias):
        absent = [k for k in biases if k not in params]
        raise ValueError(
            f"params has the biases {present} but not {absent}: give all four biases, none (bias-free attention), "
            "those of q_proj, k_proj and v_proj only (Qwen2's), or all but k_proj's (Whisper's)"
        )
    norms = [k for k in QK_NORM_KEYS if k in params]
    if norms not in ([], list(QK_NORM_KEYS)):
        raise ValueError(f"params has {norms} alone: give both q_norm.weight and k_norm.weight (Qwen3's), or neither")
    width = np.shape(params["q_proj.weight"])[0]  # H * Dh
    if width % n_heads != 0:
        if width == D:
            raise ValueError(f"d_model must be divisible by n_heads: got d_model={D}, n_heads={n_heads}")
        raise ValueError(
            f"params['q_proj.weight'] has {width} rows (n_heads * head_dim), not divisible by n_heads={n_heads}"
        )
    kv = width // n_heads * n_kv_heads  # H_kv * Dh
    expected: dict[str, tuple[int, ...]] = {"q_proj": (width, D), "k_proj": (kv, D), "v_proj": (kv, D)}
    expected |= {"out_proj": (D, width), "q_norm": (width // n_heads,), "k_norm": (width // n_heads,)}
    if qk_norm_projection:  # OLMo 2: over the whole projections
        expected |= {"q_norm": (width,), "k_norm": (kv,)}
    for k in weights + present + norms:
        shape = expected[k.split(".")[0]]
        shape = shape if k.endswith("weight") else shape[:1]
        if params[k].shape != shape:
            raise ValueError(
                f"params[{k!r}] has shape {params[k].shape}, expected {shape} for d_model={D}, "
                f"n_heads={n_heads}, n_kv_heads={n_kv_heads}, head_dim={width // n_heads}"
            )
        if params[k].dtype != dtype:
            raise TypeError(f"params[{k!r}] has dtype {params[k].dtype}, expected the inputs' dtype {dtype}")
    return width // n_heads


def _check_attention_inputs(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    n_heads: int,
    attn_mask: np.ndarray | None,
    n_kv_heads: int | None = None,
) -> None:
    _check_query_key_value(query, key, value)
    _check_head_counts(n_heads, n_kv_heads)
    check_score_mask(attn_mask, (query.shape[0], n_heads, query.shape[1], key.shape[1]))


def _check_query_key_value(query: np.ndarray, key: np.ndarray, value: np.ndarray) -> None:
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


def _check_head_counts(n_heads: int, n_kv_heads: int | None) -> None:
    if isinstance(n_heads, bool) or not isinstance(n_heads, (int, np.integer)) or n_heads < 1:
        raise ValueError(f"n_heads must be a positive int, got {n_heads!r}")
    if n_kv_heads is not None:
        if isinstance(n_kv_heads, bool) or not isinstance(n_kv_heads, (int, np.integer)) or n_kv_heads < 1:
            raise ValueError(f"n_kv_heads must be a positive int, got {n_kv_heads!r}")
        if n_heads % n_kv_heads != 0:
            raise ValueError(
                f"n_heads must be a multiple of n_kv_heads, got n_heads={n_heads}, n_kv_heads={n_kv_heads}"
            )


def _check_rope(rope: object, query: np.ndarray, key: np.ndarray, n_heads: int, Dh: int) -> None:
    """rope, when given, must be (cos, sin), each (T, Dh/2) (or (B, 1, T, Dh/2)), in the inputs' dtype; R/2 < Dh/2
    for partial rotary (the first R features of each head turn)."""
    if rope is None:
        return
    B, T_q, T_k = query.shape[0], query.shape[1], key.shape[1]
    if T_q != T_k:
        raise ValueError(
            f"rope rotates self-attention's queries and keys by one set of positions: T_q={T_q} != T_k={T_k}"
        )
    if Dh % 2:
        raise ValueError(
            f"rope rotates pairs of features: the head size must be even, got Dh = {Dh * n_heads} / {n_heads} = {Dh}"
        )
    if not isinstance(rope, (tuple, list)) or len(rope) != 2:
        raise TypeError(f"rope must be a (cos, sin) pair of arrays, got {type(rope).__name__}")
    half = np.shape(rope[0])[-1] if np.ndim(rope[0]) else 0  # R/2: Dh/2, or fewer (partial rotary)
    half = half if 0 < half <= Dh // 2 else Dh // 2
    for name, table in zip(("cos", "sin"), rope, strict=True):
        if np.shape(table) not in ((T_q, half), (B, 1, T_q, half)):
            raise ValueError(
                f"rope {name} must have shape (T, Dh/2) = {(T_q, half)}, got {np.shape(table)} (or, each row "
                f"at its own positions, (B, 1, T, Dh/2) = {(B, 1, T_q, half)}; with partial rotary R/2 for Dh/2, "
                "R < Dh the rotated features)"
            )
        if getattr(table, "dtype", None) != query.dtype:
            raise TypeError(
                f"rope {name} must have the inputs' dtype {query.dtype}, got {getattr(table, 'dtype', None)}"
            )
