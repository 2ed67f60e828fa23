"""Multi-head attention and the masks the model builds for it.

Shape letters: B batch, T_q queries, T_k keys, D d_model, H heads, Dh = D // H head size.
Masks are boolean and True means "may attend" (the convention of `F.scaled_dot_product_attention`);
they broadcast to (B, H, T_q, T_k).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .layers import Dropout, apply_rope, init_linear, rms_norm
from .scores import PLAIN, ScoreMod, alibi_slopes, position_bias, position_mask, positions, soft_cap
from .sinks import sink_softmax


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


def only_causal(mod: ScoreMod) -> bool:
    """Whether the score rules are causality and nothing else (no window, band, bias or soft cap): SDPA's is_causal
    then applies them without a mask tensor."""
    no_window = mod.window is None and mod.band is None
    return mod.causal and no_window and mod.alibi_slopes is None and mod.relative is None and mod.softcap is None


class KVCache:
    """A self-attention layer's keys and values in decoding, per K/V head (rotated, with RoPE), for N rows decoded
    side by side (a batch, or its beams): (N, H_kv, T_max, Dh) buffers filled step by step, in the dtype and on
    the device of `like`.

    With `window` (a sliding window) the buffers hold only the last `window` positions, position p in slot
    p % window (a rolling cache): a query never sees further back, so the cache stays the window's size however
    long the sequence grows. Each slot's position is kept beside it, and that is what the score rules read.
    """

    def __init__(
        self, n_rows: int, n_kv_heads: int, max_len: int, head_dim: int, like: Tensor, window: int | None = None
    ):
        size = max_len if window is None else min(max_len, window)
        self.keys = like.new_zeros(n_rows, n_kv_heads, size, head_dim)  # (N, H_kv, T_max, Dh)
        self.values = torch.zeros_like(self.keys)
        self.positions = torch.full((size,), -1, dtype=torch.long, device=like.device)  # each slot's; -1: empty
        self.window = window
        self.length = 0  # positions added so far

    def update(self, k: Tensor, v: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
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
        keys = torch.cat([self.keys[:, :, filled], k], dim=2)  # (N, H_kv, T_kept + T_new, Dh)
        values = torch.cat([self.values[:, :, filled], v], dim=2)
        pos = torch.cat([self.positions[filled], k_pos])
        newest = slice(max(0, T_new - size), T_new)
        slots = k_pos[newest] % size
        self.keys[:, :, slots], self.values[:, :, slots] = k[:, :, newest], v[:, :, newest]
        self.positions[slots] = k_pos[newest]
        self.length += T_new
        return keys, values, pos

    def reorder(self, rows: Tensor) -> None:
        """Beam search: row n continues the hypothesis of row rows[n], so it takes that row's keys and values (only
        the slots written so far move)."""
        n = min(self.length, self.keys.shape[2])
        self.keys[:, :, :n] = self.keys[rows, :, :n]
        self.values[:, :, :n] = self.values[rows, :, :n]


class MemoryCache:
    """Cross-attention's keys and values of the encoder output: projected at the first step, read at every
    step after (the memory does not change while the decoder runs)."""

    def __init__(self) -> None:
        self.keys: Tensor | None = None  # (N, H_kv, S, Dh)
        self.values: Tensor | None = None

    def reorder(self, rows: Tensor) -> None:
        pass  # rows[n] is always a beam of the same source, and all beams of a source hold the same memory


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention (sections 3.2.1 and 3.2.2).

        head_h  = softmax(q_h k_h^T / sqrt(Dh) + bias_h) v_h      over the keys the mask and the score rules allow
        MHA     = concat(head_1, ..., head_H) W_out^T + b_out

    with q = query W_q^T + b_q (likewise k, v), and head h taking columns h*Dh:(h+1)*Dh.

    Options after the paper: `n_kv_heads` < n_heads K/V heads (grouped-query attention: query head h
    reads K/V head h // (n_heads / n_kv_heads)); `bias=False` (no biases, as Llama); rotary positions,
    given to `forward` as the (cos, sin) tables of the query and key positions. The score rules (`score_mod`, a
    scores.ScoreMod: the scale, causal, a sliding `window`, a `band`, ALiBi, T5's `relative` bias) are read from
    the queries' and keys' positions by scores.position_mask and scores.position_bias, as the NumPy side's are.

    A query row whose mask allows no key gets all-zero probabilities, so its context is zero (its
    output is `out_proj.bias`) and no gradient reaches its scores.

    Two paths compute the same thing: the fused `F.scaled_dot_product_attention` by default, and an
    explicit softmax when the probabilities are wanted (`need_weights`), the dropout units are
    given (`dropout_mask`), or the scores are soft-capped (`softcap`, Gemma 2's cap * tanh(s / cap): SDPA has no
    step between the scores and the softmax). With `need_weights` the probabilities before dropout are also kept, as
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
        qk_norm_projection: bool = False,
        causal: bool = False,
        relative: tuple | None = None,
        softcap: float | None = None,
        sinks: bool = False,
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
        width, kv_width = n_heads * self.head_dim, n_kv_heads * self.head_dim
        qkv_bias = bias if qkv_bias is None else qkv_bias  # Qwen2: biases on q, k, v but not on out_proj
        self.q_proj = init_linear(nn.Linear(d_model, width, bias=qkv_bias))
        self.k_proj = init_linear(nn.Linear(d_model, kv_width, bias=qkv_bias))
        self.v_proj = init_linear(nn.Linear(d_model, kv_width, bias=qkv_bias))
        self.out_proj = init_linear(nn.Linear(width, d_model, bias=bias))
        # OLMo 2 (qk_norm_projection): over each whole projection (H*Dh, H_kv*Dh), before the head split
        q_width, k_width = (width, kv_width) if qk_norm_projection else (self.head_dim, self.head_dim)
        if qk_norm_eps is not None:  # Qwen3: RMSNorm of each head's queries and keys (over Dh), before RoPE
            self.q_norm = rms_norm(q_width, qk_norm_eps, qk_norm_kind)  # Gemma's: kind "rms_offset"
            self.k_norm = rms_norm(k_width, qk_norm_eps, qk_norm_kind)
        self.qk_norm = qk_norm_eps is not None
        self.qk_norm_projection = qk_norm_projection and self.qk_norm
        # GPT-OSS's attention sinks: a learned logit per head in every softmax's denominator (sinks=True)
        self.sinks = nn.Parameter(torch.zeros(n_heads)) if sinks else None
        self.dropout = Dropout(dropout)  # on the attention probabilities
        self.attn_probs: Tensor | None = None  # (B, H, T_q, T_k), from the last need_weights forward
        slopes = alibi_slopes(n_heads) if alibi else None  # ALiBi: one slope per head
        self.score_mod = ScoreMod(scale, causal, window, band, slopes, relative, softcap)
        self.causal_score_mod = dataclasses.replace(self.score_mod, causal=True)  # forward(is_causal=True)

    @property
    def window(self) -> int | None:
        """The sliding window: query i sees keys j > i - window (None: no window)."""
        return self.score_mod.window

    @property
    def band(self) -> int | None:
        """The bidirectional window (ModernBERT's local layers): query i sees keys |i - j| <= band."""
        return self.score_mod.band

    @property
    def scale(self) -> float:
        """The factor on q . k: 1 / sqrt(Dh), or the model's (T5: 1)."""
        return self.score_mod.scale_for(self.head_dim)

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
        bias_table: Tensor | None = None,
        kv_cache: KVCache | MemoryCache | None = None,
        key_padding: Tensor | None = None,
        q_pos: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Inputs: query (B, T_q, D), key and value (B, T_k, D); attn_mask boolean, broadcastable to
        (B, H, T_q, T_k); dropout_mask an optional keep-mask (B, H, T_q, T_k) for the probabilities;
        rope the rotary (cos, sin), each (T, Dh), of the positions of a self-attention's T = T_q = T_k
        tokens; is_causal: query i attends to keys j <= i only (on top of attn_mask and the module's score_mod);
        bias_table: T5's (n_buckets, H) table of the stack, read when score_mod.relative says so.
        q_pos (T_q,): the queries' positions (default 0 .. T_q - 1; the keys' are 0 .. T_k - 1, or the cache's).
        kv_cache, in decoding: a KVCache (self-attention: the new keys and values are added at q_pos, attention
        reads all cached ones at their positions) or a MemoryCache (cross-attention: the memory's projections,
        computed at the first step). key_padding (B, P) bool, True = a real token, indexed by key position (every
        position so far, the cached ones included): padded keys are masked out (a left-padded batch; read at the
        key positions after the cache update, since a rolling cache keeps them in no fixed order).

        Returns: out (B, T_q, D), and the probabilities (B, H, T_q, T_k) before dropout when
        `need_weights`, else None.
        """
        for name, x in (("query", query), ("key", key), ("value", value)):
            if x.dim() != 3:
                raise ValueError(f"{name} must have shape (B, T, D), got {tuple(x.shape)}")
        mod = self.causal_score_mod if is_causal else self.score_mod
        q, k, v = self._project(query, key, value, kv_cache)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        k_pos = None  # 0 .. T_k - 1
        if isinstance(kv_cache, KVCache):
            if q_pos is None:
                raise ValueError("a KVCache needs q_pos, the positions (T_q,) of the new queries, got None")
            k, v, k_pos = kv_cache.update(k, v, q_pos)  # (B, H_kv, T_cached, Dh): every position so far
        elif isinstance(kv_cache, MemoryCache):
            kv_cache.keys, kv_cache.values = k, v
        if key_padding is not None:
            read_at = torch.arange(k.shape[2], device=k.device) if k_pos is None else k_pos
            real = key_padding[:, read_at][:, None, None, :]  # (B, 1, 1, T_k): the keys that are real tokens
            attn_mask = real if attn_mask is None else attn_mask & real
        context, probs = self.attend(q, k, v, mod, attn_mask, need_weights, dropout_mask, q_pos, k_pos, bias_table)
        context = context.transpose(1, 2).flatten(2)  # (B, T_q, H*Dh): the inverse of _split_heads
        return self.out_proj(context), probs

    def _project(
        self, query: Tensor, key: Tensor, value: Tensor, kv_cache: KVCache | MemoryCache | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The heads: q (B, H, T_q, Dh), k and v (B, H_kv, T_k, Dh) (a MemoryCache's after the first step), each
        head's queries and keys RMS-normalised when the module has qk norms (Qwen3)."""
        q = self.q_proj(query)  # (B, T_q, H*Dh)
        if self.qk_norm_projection:  # OLMo 2: one norm over every head's features
            q = self.q_norm(q)
        q = self._split_heads(q, self.n_heads)  # (B, H, T_q, Dh)
        if self.qk_norm and not self.qk_norm_projection:
            q = self.q_norm(q)
        if isinstance(kv_cache, MemoryCache) and kv_cache.keys is not None and kv_cache.values is not None:
            return q, kv_cache.keys, kv_cache.values  # the memory's, projected at the first step
        k = self.k_proj(key)  # (B, T_k, H_kv*Dh)
        if self.qk_norm_projection:
            k = self.k_norm(k)
        k = self._split_heads(k, self.n_kv_heads)  # (B, H_kv, T_k, Dh)
        v = self._split_heads(self.v_proj(value), self.n_kv_heads)  # (B, H_kv, T_k, Dh)
        if self.qk_norm and not self.qk_norm_projection:
            k = self.k_norm(k)
        return q, k, v

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mod: ScoreMod = PLAIN,
        attn_mask: Tensor | None = None,
        need_weights: bool = False,
        dropout_mask: Tensor | None = None,
        q_pos: Tensor | None = None,
        k_pos: Tensor | None = None,
        bias_table: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attention of projected heads: q (B, H, T_q, Dh), k and v (B, H_kv, T_k, Dh) -> the context
        (B, H, T_q, Dh), and the probabilities when `need_weights` (else None), under the score rules `mod` at
        positions q_pos (T_q,) and k_pos (T_k,) (default 0 .. T - 1 each; decoding passes the cached ones).
        bias_table: T5's (n_buckets, H), when mod.relative says so."""
        if attn_mask is not None and attn_mask.dtype != torch.bool:
            raise TypeError(f"attn_mask must be a boolean tensor (True = may attend), got {attn_mask.dtype}")
        explicit = need_weights or (dropout_mask is not None and self.training and self.dropout.p > 0)
        explicit = explicit or mod.softcap is not None  # SDPA cannot cap the scores
        explicit = explicit or self.sinks is not None  # nor add a sink to the softmax's denominator
        if only_causal(mod) and attn_mask is None and not explicit and q_pos is None and k_pos is None:
            # no mask tensor: the kernel applies causality itself (top-left aligned)
            return self._fused(q, k, v, None, None, None, is_causal=True, scale=mod.scale_for(self.head_dim)), None
        attn_mask, bias = self._rules(q, k, mod, attn_mask, q_pos, k_pos, bias_table)
        has_key = None
        if attn_mask is not None:
            # A row with no allowed key would be a softmax over nothing (NaN). Let the kernel see
            # every key in such rows, then zero what they produce.
            has_key = attn_mask.any(dim=-1, keepdim=True)  # (..., T_q, 1)
            attn_mask = attn_mask | ~has_key
        if not explicit:
            return self._fused(q, k, v, attn_mask, has_key, bias, False, mod.scale_for(self.head_dim)), None
        n_rep = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)  # (B, H, T_k, Dh)
        context, probs = self._explicit_attention(q, k, v, attn_mask, has_key, dropout_mask, bias, mod)
        if need_weights:
            self.attn_probs = probs.detach()
        return context, (probs if need_weights else None)

    def _rules(
        self,
        q: Tensor,
        k: Tensor,
        mod: ScoreMod,
        attn_mask: Tensor | None,
        q_pos: Tensor | None,
        k_pos: Tensor | None,
        bias_table: Tensor | None,
    ) -> tuple[Tensor | None, Tensor | None]:
        """What the score rules add at the positions (scores.position_mask, scores.position_bias): attn_mask and the
        allowed mask combined, and the bias (H, T_q, T_k) in q's dtype (None: none)."""
        q_pos = positions(q.shape[2], device=q.device) if q_pos is None else q_pos
        k_pos = positions(k.shape[2], device=q.device) if k_pos is None else k_pos
        allowed = position_mask(mod, q_pos, k_pos)  # (T_q, T_k), or None
        if allowed is not None:
            attn_mask = allowed if attn_mask is None else attn_mask & allowed
        return attn_mask, position_bias(mod, q_pos, k_pos, q.dtype, bias_table)

    def _fused(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        attn_mask: Tensor | None,
        has_key: Tensor | None,
        bias: Tensor | None,
        is_causal: bool,
        scale: float,
    ) -> Tensor:
        """F.scaled_dot_product_attention with the mask and the bias; enable_gqa lets each K/V head serve its group
        of query heads. Rows with no allowed key (has_key False) get a zero context."""
        if bias is not None:  # SDPA adds a float mask to the scores: the bias, and -inf where not allowed
            attn_mask = bias if attn_mask is None else bias.masked_fill(~attn_mask, float("-inf"))
        dropout_p = self.dropout.p if self.training else 0.0
        context = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
            enable_gqa=self.n_kv_heads != self.n_heads,
        )  # fmt: skip
        if has_key is not None:
            context = context.masked_fill(~has_key, 0.0)  # (B, H, T_q, Dh)
        return context

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
        mod: ScoreMod = PLAIN,
    ) -> tuple[Tensor, Tensor]:
        """softmax(c q k^T + bias) v (the scores soft-capped first when mod.softcap is set; with sinks, GPT-OSS's,
        each head's sink logit one more column of the softmax, its share dropped after it), spelled out; returns
        context (B, H, T_q, Dh) and probs."""
        scores = q @ k.transpose(-2, -1) * mod.scale_for(self.head_dim)  # (B, H, T_q, T_k)
        if bias is not None:
            scores = scores + bias
        scores = soft_cap(scores, mod.softcap)
        if attn_mask is not None:
            # -inf exists in every float dtype (bf16 included) and gives exactly zero probability.
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        if self.sinks is None:
            probs = F.softmax(scores, dim=-1)  # (B, H, T_q, T_k)
        else:  # GPT-OSS: the head's sink logit joins the softmax's denominator (sinks.sink_softmax)
            probs = sink_softmax(scores, self.sinks)  # (B, H, T_q, T_k)
        if has_key is not None:
            probs = probs.masked_fill(~has_key, 0.0)  # fully masked rows: zero, and zero gradient
        context = self.dropout(probs, dropout_mask) @ v  # (B, H, T_q, Dh)
        return context, probs
