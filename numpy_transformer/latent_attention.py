r"""DeepSeek's multi-head latent attention (MLA, DeepSeek-V2 and V3), each piece a forward/backward pair by hand.

Every head's keys and values come from one latent vector per token, :math:`C` features wide, and a shared rotary
key part of :math:`R` features; the queries come through a low-rank bottleneck (or one projection, DeepSeek-V2-Lite's):

.. math::

    \begin{gathered}
    Q = \mathrm{RMS}(X W_{qa}^\top)\, W_{qb}^\top \ \text{(or } X W_q^\top\text{)}, \qquad
    Q_h = [\,Q^{\mathrm{nope}}_h \mid Q^{\mathrm{pe}}_h\,], \\
    [\,c \mid k^{\mathrm{pe}}\,] = X W_{kva}^\top, \qquad \hat c = \mathrm{RMS}(c), \\
    [\,K^{\mathrm{nope}}_h \mid V_h\,] = \hat c\, W_{kvb}[h]^\top, \\
    S_h = c_s \big(Q^{\mathrm{nope}}_h K^{\mathrm{nope}\top}_h + \mathrm{rope}(Q^{\mathrm{pe}}_h)\,
    \mathrm{rope}(k^{\mathrm{pe}})^\top\big), \\
    O_h = \mathrm{softmax}(S_h)\, V_h, \qquad Y = [\,O_1 \dots O_H\,]\, W_o^\top
    \end{gathered}

The rotary part is turned in interleaved pairs :math:`(x_{2i}, x_{2i+1})` by the angle :math:`t\,\theta_i`
(DeepSeek's layout; transformers' V3 writes the turned pairs de-interleaved, V2 in place: the scores, dot products of
the query's and the key's rotary parts laid out alike, are the same). The key's rotary part :math:`k^{\mathrm{pe}}`
is one vector per token shared by every head. Decoding keeps :math:`\hat c` and the turned :math:`k^{\mathrm{pe}}`:
:math:`C + R` numbers per token and layer, whatever the number of heads (LatentCache).

Shape letters: B batch, T tokens, P key positions (T, or every cached one), D d_model, H heads, C kv_lora_rank,
:math:`R_q` q_lora_rank, :math:`D_n` qk_nope_head_dim, R qk_rope_head_dim, :math:`D_v` v_head_dim.
:math:`c_s`: the softmax scale, :math:`(D_n + R)^{-1/2}` (times YaRN's mscale squared: the config's attention_scale).
State-dict names below ``self_attn.``: q_proj.weight (H (D_n+R), D), or q_a_proj.weight (R_q, D), q_a_norm.weight
(R_q,), q_b_proj.weight (H (D_n+R), R_q); kv_a_proj.weight (C+R, D), kv_a_norm.weight (C,), kv_b_proj.weight
(H (D_n+D_v), C); out_proj.weight (D, H D_v).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import DTypeLike

from .attention import (
    ScaledDotProductAttentionCache,
    merge_heads,
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
    split_heads,
)
from .layers import Dropout, LinearCache, NormCache, linear_backward, linear_forward, norm_backward, norm_forward
from .scores import PLAIN, ScoreMod, positions
from .validation import check_float_array

LATENT_NORM_EPS = 1e-6  # q_a_layernorm's and kv_a_layernorm's eps in transformers (their RMSNorm's default)


# ----------------------------------------------------------------------------------------------
# RoPE in interleaved pairs.


@dataclass(frozen=True, slots=True)
class InterleavedRopeCache:
    cos: np.ndarray  # (T, R/2), or (B, 1, T, R/2)
    sin: np.ndarray


def rope_interleaved_forward(
    x: np.ndarray, cos: np.ndarray, sin: np.ndarray
) -> tuple[np.ndarray, InterleavedRopeCache]:
    r"""Turn each pair :math:`(x_{2i}, x_{2i+1})` of x (..., T, R) by the angle whose cos and sin are the tables'
    (T, R/2) (or (B, 1, T, R/2)), in place of the pair:

    .. math::

        y_{2i} = x_{2i} \cos - x_{2i+1} \sin, \qquad y_{2i+1} = x_{2i+1} \cos + x_{2i} \sin
    """
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., T, R/2) each
    y = np.empty_like(x)
    y[..., 0::2] = even * cos - odd * sin
    y[..., 1::2] = odd * cos + even * sin
    return y, InterleavedRopeCache(cos, sin)


def rope_interleaved_backward(dout: np.ndarray, cache: InterleavedRopeCache) -> np.ndarray:
    r"""A rotation's gradient is the turn back (its transpose), pair by pair:

    .. math::

        dx_{2i} = dy_{2i} \cos + dy_{2i+1} \sin, \qquad dx_{2i+1} = dy_{2i+1} \cos - dy_{2i} \sin

    dout (..., T, R) -> dx (..., T, R)."""
    cos, sin = cache.cos, cache.sin
    d_even, d_odd = dout[..., 0::2], dout[..., 1::2]
    dx = np.empty_like(dout)
    dx[..., 0::2] = d_even * cos + d_odd * sin
    dx[..., 1::2] = d_odd * cos - d_even * sin
    return dx


# ----------------------------------------------------------------------------------------------
# The decoding cache: the latent and the turned shared key part, not per-head keys and values.


class LatentCache:
    """A latent-attention layer's normalised latents :math:`\\hat c` (N, T_max, C) and turned rotary keys (N, T_max,
    R) of the positions run so far, for N rows decoded side by side: C + R numbers per token, against
    2 H_kv Dh for grouped-query attention's keys and values. Each step expands the cached latents into every head's
    keys and values again (kv_b_proj), as transformers does."""

    def __init__(self, n_rows: int, max_len: int, kv_lora_rank: int, rope_dim: int, dtype: DTypeLike) -> None:
        self.latents = np.zeros((n_rows, max_len, kv_lora_rank), dtype=dtype)  # (N, T_max, C)
        self.rope_keys = np.zeros((n_rows, max_len, rope_dim), dtype=dtype)  # (N, T_max, R)
        self.length = 0  # positions added so far

    def update(
        self, latent: np.ndarray, rope_key: np.ndarray, k_pos: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Add the new latents (N, T_new, C) and rotary keys (N, T_new, R); return every cached one and their
        positions 0 .. length - 1."""
        end = self.length + latent.shape[1]
        self.latents[:, self.length : end], self.rope_keys[:, self.length : end] = latent, rope_key
        self.length = end
        return self.latents[:, :end], self.rope_keys[:, :end], np.arange(end)

    def reorder(self, rows: np.ndarray) -> None:
        """Beam search: row n continues the hypothesis of row rows[n]."""
        self.latents[:] = self.latents[rows]
        self.rope_keys[:] = self.rope_keys[rows]


# ----------------------------------------------------------------------------------------------
# The attention block.


@dataclass(frozen=True, slots=True)
class LatentAttentionCache:
    """What latent_attention_backward needs, by name."""

    n_heads: int
    nope_dim: int  # D_n
    q: LinearCache | None  # q_proj's, or None with the low-rank queries
    q_a: LinearCache | None  # q_a_proj's, q_a_norm's, q_b_proj's (None without the low-rank queries)
    q_norm: NormCache | None
    q_b: LinearCache | None
    kv_a: LinearCache
    kv_norm: NormCache
    kv_b: LinearCache
    q_rope: InterleavedRopeCache
    k_rope: InterleavedRopeCache
    attn: ScaledDotProductAttentionCache  # the scores' kernel; .probs (B, H, T, P) for plots
    out: LinearCache
    decoding: bool = False  # read and extended a LatentCache: a forward-only call


def latent_attention_forward(
    params: dict,
    x: np.ndarray,
    n_heads: int,
    rope: tuple[np.ndarray, np.ndarray],
    *,
    mod: ScoreMod = PLAIN,
    mask: np.ndarray | None = None,
    dropout: Dropout | None = None,
    site: str = "attn",
    q_pos: np.ndarray | None = None,
    kv_cache: LatentCache | None = None,
    key_padding: np.ndarray | None = None,
) -> tuple[np.ndarray, LatentAttentionCache]:
    """Multi-head latent attention of x (B, T, D) over itself (the module's formula). rope: the (cos, sin) tables of
    x's positions, each (T, R/2) or (B, 1, T, R/2); mod: the score rules (its scale c_s, causality); mask
    broadcastable to (B, H, T, P), True = may attend; dropout drops probabilities at f"{site}.dropout". Decoding:
    q_pos (T,), x's positions, and kv_cache, a LatentCache read and extended (forward only). key_padding (B, P):
    the real tokens by key position. Returns y (B, T, D) and a LatentAttentionCache."""
    check_float_array("x", x)
    if x.ndim != 3:
        raise ValueError(f"x must have shape (B, T, D), got shape {x.shape}")
    H = n_heads
    C = params["kv_a_norm.weight"].shape[0]
    R = params["kv_a_proj.weight"].shape[0] - C
    Dv = params["out_proj.weight"].shape[1] // H
    Dn = params["kv_b_proj.weight"].shape[0] // H - Dv
    q_cache = q_a = q_norm = q_b = None
    if "q_proj.weight" in params:
        q, q_cache = linear_forward(x, params["q_proj.weight"], None)  # (B, T, H (Dn + R))
    else:
        q, q_a = linear_forward(x, params["q_a_proj.weight"], None)  # (B, T, R_q)
        q, q_norm = norm_forward({"weight": params["q_a_norm.weight"]}, q, "rms", LATENT_NORM_EPS)
        q, q_b = linear_forward(q, params["q_b_proj.weight"], None)  # (B, T, H (Dn + R))
    q = split_heads(q, H)  # (B, H, T, Dn + R)
    q_pe, q_rope = rope_interleaved_forward(q[..., Dn:], *rope)  # (B, H, T, R)
    q = np.concatenate([q[..., :Dn], q_pe], axis=-1)
    ckv, kv_a = linear_forward(x, params["kv_a_proj.weight"], None)  # (B, T, C + R)
    latent, kv_norm = norm_forward({"weight": params["kv_a_norm.weight"]}, ckv[..., :C], "rms", LATENT_NORM_EPS)
    k_pe, k_rope = rope_interleaved_forward(ckv[:, None, :, C:], *rope)  # (B, 1, T, R): one for every head
    k_pe = k_pe[:, 0]  # (B, T, R)
    q_pos = positions(x.shape[1]) if q_pos is None else q_pos
    k_pos = q_pos
    if kv_cache is not None:
        latent, k_pe, k_pos = kv_cache.update(latent, k_pe, q_pos)  # (B, P, C), (B, P, R): every position so far
    kv, kv_b = linear_forward(latent, params["kv_b_proj.weight"], None)  # (B, P, H (Dn + Dv))
    kv = split_heads(kv, H)  # (B, H, P, Dn + Dv)
    B, P = kv.shape[0], kv.shape[2]
    k = np.concatenate([kv[..., :Dn], np.broadcast_to(k_pe[:, None], (B, H, P, R))], axis=-1)  # (B, H, P, Dn + R)
    v = kv[..., Dn:]  # (B, H, P, Dv)
    if key_padding is not None:
        real = key_padding[:, k_pos][:, None, None, :]  # (B, 1, 1, P)
        mask = real if mask is None else mask & real
    p, keep_mask = 0.0, None
    if dropout is not None and dropout.rate(f"{site}.dropout") > 0:
        p = dropout.rate(f"{site}.dropout")
        keep_mask = dropout.keep_mask(f"{site}.dropout", (B, H, x.shape[1], P))
    context, attn = scaled_dot_product_attention_forward(
        q, k, v, mask, p, keep_mask, mod=mod, q_pos=q_pos, k_pos=k_pos
    )  # (B, H, T, Dv)
    y, out = linear_forward(merge_heads(context), params["out_proj.weight"], None)  # (B, T, D)
    cache = LatentAttentionCache(
        H, Dn, q_cache, q_a, q_norm, q_b, kv_a, kv_norm, kv_b, q_rope, k_rope, attn, out, kv_cache is not None
    )
    return y, cache


def latent_attention_backward(dout: np.ndarray, cache: LatentAttentionCache) -> tuple[np.ndarray, dict]:
    r"""The forward in reverse. The scores read the concatenations :math:`[Q^{\mathrm{nope}} \mid
    \mathrm{rope}(Q^{\mathrm{pe}})]` and :math:`[K^{\mathrm{nope}} \mid \mathrm{rope}(k^{\mathrm{pe}})]`, so their
    gradients split by columns; the shared rotary key served every head, so its gradient is the sum over heads;
    the latent fed both the keys and the values of every head, through one product:

    .. math::

        \begin{gathered}
        dO = \mathrm{split}(dY\, W_o), \qquad dW_o = dY^\top [O_1 \dots O_H], \\
        dQ, dK, dV = \mathrm{attention\_backward}(dO), \\
        d\hat c = \mathrm{merge}([\,dK^{\mathrm{nope}} \mid dV\,])\, W_{kvb}, \\
        dW_{kvb} = \mathrm{merge}([\,dK^{\mathrm{nope}} \mid dV\,])^\top \hat c, \\
        dk^{\mathrm{pe}} = \mathrm{rope}^\top\big(\textstyle\sum_h dK^{\mathrm{pe}}_h\big), \qquad
        dc = \mathrm{RMS}^\top(d\hat c), \\
        dX = [\,dc \mid dk^{\mathrm{pe}}\,]\, W_{kva} + dX_q, \\
        dQ^{\mathrm{pe}} = \mathrm{rope}^\top(dQ^{\mathrm{pe}}_{\mathrm{turned}}), \\
        dX_q = \mathrm{merge}(dQ)\, W_q \ \text{or}\ \mathrm{RMS}^\top(\mathrm{merge}(dQ)\, W_{qb})\, W_{qa}
        \end{gathered}

    with each weight's gradient the transposed input times its output's gradient (:math:`dW = dY^\top X`), and
    :math:`\mathrm{rope}^\top` rope_interleaved_backward. dout (B, T, D) -> dx (B, T, D) and the grads dict keyed
    like params."""
    if not isinstance(cache, LatentAttentionCache):
        raise TypeError(f"cache must be the LatentAttentionCache of latent_attention_forward, got {type(cache)}")
    if cache.decoding:
        raise ValueError("latent_attention_backward: the forward read a LatentCache (decoding), which has no backward")
    H, Dn, grads = cache.n_heads, cache.nope_dim, {}
    dcontext, grads["out_proj.weight"], _ = linear_backward(dout, cache.out)
    dq, dk, dv, _ = scaled_dot_product_attention_backward(split_heads(dcontext, H), cache.attn)
    dkv = merge_heads(np.concatenate([dk[..., :Dn], dv], axis=-1))  # (B, P, H (Dn + Dv))
    dlatent, grads["kv_b_proj.weight"], _ = linear_backward(dkv, cache.kv_b)  # (B, P, C)
    dk_pe = dk[..., Dn:].sum(axis=1, keepdims=True)  # (B, 1, P, R): every head read the one rotary key
    dk_pe = rope_interleaved_backward(dk_pe, cache.k_rope)[:, 0]  # (B, T, R)
    dc, norm_grads = norm_backward(dlatent, cache.kv_norm)
    grads["kv_a_norm.weight"] = norm_grads["weight"]
    dx, grads["kv_a_proj.weight"], _ = linear_backward(np.concatenate([dc, dk_pe], axis=-1), cache.kv_a)
    dq_pe = rope_interleaved_backward(dq[..., Dn:], cache.q_rope)  # (B, H, T, R)
    dq = merge_heads(np.concatenate([dq[..., :Dn], dq_pe], axis=-1))  # (B, T, H (Dn + R))
    if cache.q is not None:
        dx_q, grads["q_proj.weight"], _ = linear_backward(dq, cache.q)
    else:
        assert cache.q_a is not None and cache.q_norm is not None and cache.q_b is not None
        dq, grads["q_b_proj.weight"], _ = linear_backward(dq, cache.q_b)
        dq, norm_grads = norm_backward(dq, cache.q_norm)
        grads["q_a_norm.weight"] = norm_grads["weight"]
        dx_q, grads["q_a_proj.weight"], _ = linear_backward(dq, cache.q_a)
    dx += dx_q  # x fed the queries and the latent
    return dx, grads
