"""Multi-head attention and the masks the model builds for it.

Shape letters: B batch, T_q queries, T_k keys, D d_model, H heads, Dh = D // H head size.
Masks are boolean and True means "may attend" (the convention of `F.scaled_dot_product_attention`);
they broadcast to (B, H, T_q, T_k).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .layers import Dropout, apply_rope, init_linear, rms_norm


def padding_mask(ids: Tensor, pad_id: int | None) -> Tensor | None:
    """Key-padding mask (B, 1, 1, T): keys holding `pad_id` may not be attended to. None (no mask) when
    the vocabulary has no padding token (pad_id None, as in GPT-2)."""
    if pad_id is None:
        return None
    return (ids != pad_id)[:, None, None, :]  # (B, 1, 1, T)


def causal_mask(length: int, device: torch.device, key_length: int | None = None) -> Tensor:
    """Causal mask (T, T_k) (T_k = T by default): query i may attend to keys j <= i."""
    key_length = length if key_length is None else key_length
    return torch.ones(length, key_length, dtype=torch.bool, device=device).tril()  # (T, T_k)


def alibi_slopes(n_heads: int) -> Tensor:
    """ALiBi's per-head slopes (float64): 2^(-8h/P) for h = 1 .. P, P the largest power of two <= H, then the odd
    powers of 2^(-8/(2P)) for the heads beyond P (BLOOM's rule)."""
    P = 2 ** math.floor(math.log2(n_heads))
    slopes = torch.pow(2.0, -8.0 * torch.arange(1, P + 1, dtype=torch.float64) / P)
    extra = torch.pow(2.0, -4.0 * torch.arange(1, 2 * (n_heads - P) + 1, 2, dtype=torch.float64) / P)
    return torch.cat([slopes, extra])


class KVCache:
    """A self-attention layer's keys and values in decoding, per K/V head (rotated, with RoPE): (N, H_kv, T_max, Dh)
    buffers that each step writes its new positions into; attention reads every position written so far.

    With `window` (a sliding window) the buffers hold the last `window` positions only, position p in slot
    p % window (a rolling cache), each slot's position kept beside it for the score rules."""

    def __init__(
        self, like: Tensor, n_rows: int, n_kv_heads: int, max_len: int, head_dim: int, window: int | None = None
    ):
        size = max_len if window is None else min(max_len, window)
        self.keys = like.new_zeros(n_rows, n_kv_heads, size, head_dim)  # (N, H_kv, T_max or window, Dh)
        self.values = torch.zeros_like(self.keys)
        self.window = window
        self.slot_positions = torch.full((size,), -1, dtype=torch.long, device=like.device)  # -1: empty
        self.length = 0  # positions written

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor]]:
        """Write k, v (N, H_kv, T_new, Dh) at the next positions; return the keys and values attention reads and
        the (query, key) positions: the new ones, start .. end - 1, and those of the keys."""
        start, end = self.length, self.length + k.shape[2]
        self.length = end
        new_positions = torch.arange(start, end, device=k.device)
        if self.window is None:  # slot = position
            self.keys[:, :, start:end], self.values[:, :, start:end] = k, v
            return self.keys[:, :, :end], self.values[:, :, :end], (new_positions, torch.arange(end, device=k.device))
        # rolling: the new queries read what the window kept and every new key, then the slots take the newest
        kept = self.slot_positions >= 0
        keys = torch.cat([self.keys[:, :, kept], k], dim=2)
        values = torch.cat([self.values[:, :, kept], v], dim=2)
        key_positions = torch.cat([self.slot_positions[kept], new_positions])
        newest = slice(max(0, k.shape[2] - self.keys.shape[2]), k.shape[2])
        slots = new_positions[newest] % self.keys.shape[2]
        self.keys[:, :, slots], self.values[:, :, slots] = k[:, :, newest], v[:, :, newest]
        self.slot_positions[slots] = new_positions[newest]
        return keys, values, (new_positions, key_positions)

    def reorder(self, rows: Tensor) -> None:
        """Beam search: row n continues row rows[n]'s hypothesis (only the written positions move)."""
        n = min(self.length, self.keys.shape[2])
        self.keys[:, :, :n] = self.keys[rows, :, :n]
        self.values[:, :, :n] = self.values[rows, :, :n]


class MemoryCache:
    """Cross-attention's keys and values of the encoder output in decoding: projected at the first step, read at
    every step after."""

    def __init__(self):
        self.keys: Tensor | None = None  # (N, H_kv, S, Dh)
        self.values: Tensor | None = None

    def reorder(self, rows: Tensor) -> None:
        pass  # rows[n] is a beam of the same source: all beams of a source hold the same memory


class RelativePositionBias(nn.Module):
    """T5's relative position bias: a learned (n_buckets, H) table read at the bucket of each distance j - i,
    giving (H, T_q, T_k) to add to every layer's self-attention scores. One per stack; autograd sums its gradient
    over every layer that reads it.

    Buckets: in an encoder (bidirectional) half are for keys after the query and half for the others; within a
    half of n buckets, distances below n/2 each get one, larger ones share logarithmically wider buckets up to
    max_distance, and everything beyond shares the last. A decoder's buckets count only keys before the query."""

    def __init__(self, n_buckets: int, n_heads: int, max_distance: int):
        super().__init__()
        self.n_buckets, self.max_distance = n_buckets, max_distance
        self.weight = nn.Parameter(torch.empty(n_buckets, n_heads))
        nn.init.normal_(self.weight, std=0.02)

    def buckets(self, q_pos: Tensor, k_pos: Tensor, bidirectional: bool) -> Tensor:
        """The bucket of every (query, key) pair, (T_q, T_k) long; computed in float32 as T5 computes it."""
        relative = k_pos[None, :] - q_pos[:, None]  # (T_q, T_k): j - i
        n = self.n_buckets
        bucket = torch.zeros_like(relative)
        if bidirectional:
            n //= 2
            bucket = bucket + (relative > 0).long() * n
            distance = relative.abs()
        else:
            distance = (-relative).clamp(min=0)  # keys before the query; later ones (masked) share bucket 0
        exact = n // 2
        far = distance.clamp(min=exact).float()  # the log is read only where distance >= exact
        log_ratio = torch.log(far / exact) / math.log(self.max_distance / exact)
        large = (exact + (log_ratio * (n - exact)).long()).clamp(max=n - 1)
        return bucket + torch.where(distance < exact, distance, large)

    def forward(self, q_pos: Tensor, k_pos: Tensor, bidirectional: bool) -> Tensor:
        """(H, T_q, T_k): weight[bucket(j - i), h]."""
        return self.weight[self.buckets(q_pos, k_pos, bidirectional)].permute(2, 0, 1)


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention (sections 3.2.1 and 3.2.2).

        head_h  = softmax(q_h k_h^T / sqrt(Dh)) v_h      over the keys the mask allows
        MHA     = concat(head_1, ..., head_H) W_out^T + b_out

    with q = query W_q^T + b_q (likewise k, v), and head h taking columns h*Dh:(h+1)*Dh.

    Options after the paper: `n_kv_heads` < n_heads K/V heads (grouped-query attention: query head h
    reads K/V head h // (n_heads / n_kv_heads)); `bias=False` (no biases, as Llama); rotary positions,
    given to `forward` as the (cos, sin) tables of the query and key positions.

    A query row whose mask allows no key gets all-zero probabilities, so its context is zero (its
    output is `out_proj.bias`) and no gradient reaches its scores.

    Two paths compute the same thing: the fused `F.scaled_dot_product_attention` by default, and an
    explicit softmax when the probabilities are wanted (`need_weights`) or the dropout units are
    given (`dropout_mask`). With `need_weights` the probabilities before dropout are also kept, as
    `attn_probs` (detached), for plotting.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        n_kv_heads: int | None = None,
        bias: bool = True,
        *,
        qkv_bias: bool | None = None,
        window: int | None = None,
        alibi: bool = False,
        scale: float | None = None,
        head_dim: int | None = None,
        band: int | None = None,
        qk_norm_eps: float | None = None,
        qk_norm_kind: str = "rms",
    ):
        super().__init__()
        if head_dim is None and d_model % n_heads != 0:
            raise ValueError(f"d_model must be divisible by n_heads: got d_model={d_model}, n_heads={n_heads}")
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_heads % n_kv_heads != 0:
            raise ValueError(
                f"n_heads must be a multiple of n_kv_heads, got n_heads={n_heads}, n_kv_heads={n_kv_heads}"
            )
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = d_model // n_heads if head_dim is None else head_dim  # Dh (Qwen3, Gemma: not D / H)
        self.scale = 1.0 / math.sqrt(self.head_dim) if scale is None else float(scale)  # on q . k (T5: 1)
        width, kv_width = n_heads * self.head_dim, n_kv_heads * self.head_dim
        qkv_bias = bias if qkv_bias is None else qkv_bias  # Qwen2: biases on q, k, v but not on out_proj
        self.q_proj = init_linear(nn.Linear(d_model, width, bias=qkv_bias))
        self.k_proj = init_linear(nn.Linear(d_model, kv_width, bias=qkv_bias))
        self.v_proj = init_linear(nn.Linear(d_model, kv_width, bias=qkv_bias))
        self.out_proj = init_linear(nn.Linear(width, d_model, bias=bias))
        if qk_norm_eps is not None:  # Qwen3: RMSNorm of each head's queries and keys (over Dh), before RoPE
            self.q_norm = rms_norm(self.head_dim, qk_norm_eps, qk_norm_kind)  # Gemma's: kind "rms_offset"
            self.k_norm = rms_norm(self.head_dim, qk_norm_eps, qk_norm_kind)
        self.qk_norm = qk_norm_eps is not None
        self.dropout = Dropout(dropout)  # on the attention probabilities
        self.attn_probs: Tensor | None = None  # (B, H, T_q, T_k), from the last need_weights forward
        self.window = window  # causal sliding window: query i sees keys j > i - window
        self.band = band  # bidirectional window (ModernBERT's local layers): query i sees keys |i - j| <= band
        # ALiBi: one slope per head, the penalty per position of distance (a buffer: it moves with the module)
        self.register_buffer("alibi_slopes", alibi_slopes(n_heads) if alibi else None, persistent=False)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attn_mask: Tensor | None = None,
        need_weights: bool = False,
        dropout_mask: Tensor | None = None,
        rope: tuple[Tensor, Tensor] | None = None,
        is_causal: bool = False,
        position_bias: Tensor | None = None,
        kv_cache: KVCache | MemoryCache | None = None,
        key_padding: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Inputs: query (B, T_q, D), key and value (B, T_k, D); attn_mask boolean, broadcastable to
        (B, H, T_q, T_k); dropout_mask an optional keep-mask (B, H, T_q, T_k) for the probabilities;
        rope the rotary (cos, sin), each (T, Dh), of the positions of a self-attention's T = T_q = T_k
        tokens; is_causal: query i attends to keys j <= i only (on top of attn_mask); position_bias (H, T_q, T_k)
        added to the scores (T5's). kv_cache, in decoding: a KVCache (self-attention: the new keys and values are
        added, attention reads all cached ones at their positions) or a MemoryCache (cross-attention: the
        memory's projections, computed at the first step). key_padding (B, P) bool, True = a real token, indexed by
        key position (every position so far, the cached ones included): padded keys are masked out (a left-padded
        batch; read at the key positions after the cache update, since a rolling cache keeps them in no fixed order).

        Returns: out (B, T_q, D), and the probabilities (B, H, T_q, T_k) before dropout when
        `need_weights`, else None.
        """
        for name, x in (("query", query), ("key", key), ("value", value)):
            if x.dim() != 3:
                raise ValueError(f"{name} must have shape (B, T, D), got {tuple(x.shape)}")
        q = self._split_heads(self.q_proj(query), self.n_heads)  # (B, H, T_q, Dh)
        if self.qk_norm:
            q = self.q_norm(q)
        if isinstance(kv_cache, MemoryCache) and kv_cache.keys is not None:
            k, v = kv_cache.keys, kv_cache.values  # the memory's, projected at the first step
        else:
            k = self._split_heads(self.k_proj(key), self.n_kv_heads)  # (B, H_kv, T_k, Dh)
            v = self._split_heads(self.v_proj(value), self.n_kv_heads)  # (B, H_kv, T_k, Dh)
            if self.qk_norm:
                k = self.k_norm(k)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        positions = None
        if isinstance(kv_cache, KVCache):
            k, v, positions = kv_cache.update(k, v)  # (B, H_kv, T_cached, Dh): every position so far
        elif isinstance(kv_cache, MemoryCache):
            kv_cache.keys, kv_cache.values = k, v
        if key_padding is not None:
            k_pos = torch.arange(k.shape[2], device=k.device) if positions is None else positions[1]
            real = key_padding[:, k_pos][:, None, None, :]  # (B, 1, 1, T_k): the keys that are real tokens
            attn_mask = real if attn_mask is None else attn_mask & real
        context, probs = self.attend(
            q, k, v, attn_mask, need_weights, dropout_mask, is_causal, positions, position_bias
        )
        context = context.transpose(1, 2).flatten(2)  # (B, T_q, H*Dh): the inverse of _split_heads
        return self.out_proj(context), probs

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        attn_mask: Tensor | None = None,
        need_weights: bool = False,
        dropout_mask: Tensor | None = None,
        is_causal: bool = False,
        positions: tuple[Tensor, Tensor] | None = None,
        position_bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attention of projected heads: q (B, H, T_q, Dh), k and v (B, H_kv, T_k, Dh) -> the context
        (B, H, T_q, Dh), and the probabilities when `need_weights` (else None). positions: the queries' and
        keys' positions, (T_q,) and (T_k,) (default 0 .. T - 1 each; decoding passes the cached ones).
        position_bias: a bias (H, T_q, T_k) added to the scores (T5's, from the stack's RelativePositionBias)."""
        if attn_mask is not None and attn_mask.dtype != torch.bool:
            raise TypeError(f"attn_mask must be a boolean tensor (True = may attend), got {attn_mask.dtype}")
        explicit = need_weights or (dropout_mask is not None and self.training and self.dropout.p > 0)
        rules = self.window is not None or self.band is not None or self.alibi_slopes is not None
        rules = rules or positions is not None
        fused_causal = is_causal and attn_mask is None and not explicit and not rules and position_bias is None
        bias = position_bias
        if rules:  # the score rules, from the positions: causal, the window, ALiBi's bias
            allowed, alibi = self.score_rules(q, k, is_causal, positions)
            bias = alibi if alibi is not None else bias
            if allowed is not None:
                attn_mask = allowed if attn_mask is None else attn_mask & allowed
        elif is_causal and not fused_causal:
            causal = causal_mask(q.shape[2], q.device, k.shape[2])  # (T_q, T_k)
            attn_mask = causal if attn_mask is None else attn_mask & causal
        has_key = None
        if attn_mask is not None:
            # A row with no allowed key would be a softmax over nothing (NaN). Let the kernel see
            # every key in such rows, then zero what they produce.
            has_key = attn_mask.any(dim=-1, keepdim=True)  # (..., T_q, 1)
            attn_mask = attn_mask | ~has_key

        if explicit:
            n_rep = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)  # (B, H, T_k, Dh)
            context, probs = self._explicit_attention(q, k, v, attn_mask, has_key, dropout_mask, bias)
            if need_weights:
                self.attn_probs = probs.detach()
            return context, (probs if need_weights else None)
        dropout_p = self.dropout.p if self.training else 0.0
        # Default scale 1 / sqrt(Dh); enable_gqa lets each K/V head serve its group of query heads.
        gqa = self.n_kv_heads != self.n_heads
        if fused_causal:  # no mask tensor: the kernel applies causality itself (top-left aligned)
            context = F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout_p, is_causal=True, scale=self.scale, enable_gqa=gqa
            )
            return context, None
        if bias is not None:  # SDPA adds a float mask to the scores: the bias, and -inf where not allowed
            attn_mask = bias if attn_mask is None else bias.masked_fill(~attn_mask, float("-inf"))
        context = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=self.scale, enable_gqa=gqa
        )
        if has_key is not None:
            context = context.masked_fill(~has_key, 0.0)  # (B, H, T_q, Dh)
        return context, None

    def score_rules(
        self, q: Tensor, k: Tensor, is_causal: bool, positions: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor | None, Tensor | None]:
        """What the positions do to the scores: the allowed mask (T_q, T_k) (causal: key j <= query i; a window:
        j > i - window; a band: |i - j| <= band), and ALiBi's bias -m_h |i - j| (H, T_q, T_k) in q's dtype; None for
        what does not apply."""
        if positions is None:
            positions = (torch.arange(q.shape[2], device=q.device), torch.arange(k.shape[2], device=q.device))
        q_pos, k_pos = positions
        distance = q_pos[:, None] - k_pos[None, :]  # (T_q, T_k): i - j
        allowed = None
        if is_causal:
            allowed = distance >= 0
        if self.window is not None:
            inside = distance < self.window
            allowed = inside if allowed is None else allowed & inside
        if self.band is not None:
            inside = distance.abs() <= self.band
            allowed = inside if allowed is None else allowed & inside
        bias = None
        if self.alibi_slopes is not None:
            bias = -self.alibi_slopes.to(q.dtype)[:, None, None] * distance.abs().to(q.dtype)  # (H, T_q, T_k)
        return allowed, bias

    def _split_heads(self, x: Tensor, n_heads: int) -> Tensor:
        """(B, T, n_heads * Dh) -> (B, n_heads, T, Dh); head h takes columns h*Dh:(h+1)*Dh."""
        # reshape rather than unflatten: Tensor.unflatten is Python code that torch.compile cannot trace while a
        # torch.set_default_device(...) mode is active (a graph break per call)
        return x.reshape(*x.shape[:-1], n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def _explicit_attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        attn_mask: Tensor | None,
        has_key: Tensor | None,
        dropout_mask: Tensor | None,
        bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """softmax(q k^T / sqrt(Dh) + bias) v, spelled out; returns context (B, H, T_q, Dh) and probs."""
        scores = q @ k.transpose(-2, -1) * self.scale  # (B, H, T_q, T_k)
        if bias is not None:
            scores = scores + bias
        if attn_mask is not None:
            # -inf exists in every float dtype (bf16 included) and gives exactly zero probability.
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        probs = F.softmax(scores, dim=-1)  # (B, H, T_q, T_k)
        if has_key is not None:
            probs = probs.masked_fill(~has_key, 0.0)  # fully masked rows: zero, and zero gradient
        context = self.dropout(probs, dropout_mask) @ v  # (B, H, T_q, Dh)
        return context, probs
