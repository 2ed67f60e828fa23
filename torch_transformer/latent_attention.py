"""DeepSeek's multi-head latent attention (MLA) as a PyTorch user writes it; autograd does the backward.

    queries: q_proj(x), or q_b_proj(RMSNorm(q_a_proj(x))); [latent | k_rot] = kv_a_proj(x);
    [k_nope_h | v_h] = kv_b_proj(RMSNorm(latent)) per head; k_rot, one for every head, and each query's rotary part
    turned by RoPE as complex numbers (feature pairs (2i, 2i+1) as one complex number, times e^{i t theta_i});
    softmax(scale (q_nope . k_nope + q_rot . k_rot)) v, then out_proj.

Decoding caches the normalised latent and the turned k_rot (LatentCache): kv_lora_rank + qk_rope_head_dim numbers
per token and layer. State-dict names as numpy_transformer.latent_attention's. Shape letters: B batch, T tokens,
P key positions, H heads, C kv_lora_rank, R qk_rope_head_dim, Dn qk_nope_head_dim, Dv v_head_dim.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from transformer_spec.config import TransformerConfig

from .layers import Dropout, init_linear

LATENT_NORM_EPS = 1e-6  # transformers' q_a_layernorm and kv_a_layernorm (their RMSNorm's default eps)


def rope_complex(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (..., T, R): each pair (x_2i, x_2i+1) read as the complex number x_2i + i x_2i+1 and multiplied by
    cos + i sin of its angle (the tables' first R/2 columns, (T, R) or (B, 1, T, R)); back to (..., T, R)."""
    half = x.shape[-1] // 2
    turn = torch.complex(cos[..., :half], sin[..., :half])  # e^{i t theta}
    pairs = x.unflatten(-1, (half, 2)).clone(memory_format=torch.contiguous_format)  # a fresh, aligned copy
    pairs = torch.view_as_complex(pairs)  # (..., T, R/2) complex
    return torch.view_as_real(pairs * turn).flatten(-2)


class LatentCache:
    """A latent-attention layer's normalised latents (N, T_max, C) and turned rotary keys (N, T_max, R), in the
    dtype and on the device of `like`."""

    def __init__(self, n_rows: int, max_len: int, kv_lora_rank: int, rope_dim: int, like: Tensor):
        self.latents = like.new_zeros(n_rows, max_len, kv_lora_rank)
        self.rope_keys = like.new_zeros(n_rows, max_len, rope_dim)
        self.length = 0

    def update(self, latent: Tensor, rope_key: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Add (N, T_new, C) and (N, T_new, R); return every cached latent and rotary key and their positions."""
        end = self.length + latent.shape[1]
        self.latents[:, self.length : end], self.rope_keys[:, self.length : end] = latent, rope_key
        self.length = end
        return self.latents[:, :end], self.rope_keys[:, :end], torch.arange(end, device=latent.device)

    def reorder(self, rows: Tensor) -> None:
        """Beam search: row n continues the hypothesis of row rows[n]."""
        self.latents[:, : self.length] = self.latents[rows, : self.length]
        self.rope_keys[:, : self.length] = self.rope_keys[rows, : self.length]


class LatentAttention(nn.Module):
    """Multi-head latent attention, with MultiHeadAttention's call signature (self-attention only; causal when
    is_causal, as a decoder calls it): x (B, T, D) -> (B, T, D)."""

    def __init__(self, config: TransformerConfig, scale: float | None = None):
        super().__init__()
        c = config
        assert c.kv_lora_rank is not None
        D, H = c.d_model, c.n_heads
        self.n_heads, self.rope_dim, self.nope_dim, self.value_dim = H, c.rope_dim, c.d_head - c.rope_dim, c.value_dim
        self.kv_lora_rank = c.kv_lora_rank
        self.scale = c.d_head**-0.5 if scale is None else scale
        if c.q_lora_rank is None:
            self.q_proj = init_linear(nn.Linear(D, H * c.d_head, bias=False))
        else:
            self.q_a_proj = init_linear(nn.Linear(D, c.q_lora_rank, bias=False))
            self.q_a_norm = nn.RMSNorm(c.q_lora_rank, eps=LATENT_NORM_EPS)
            self.q_b_proj = init_linear(nn.Linear(c.q_lora_rank, H * c.d_head, bias=False))
        self.kv_a_proj = init_linear(nn.Linear(D, c.kv_lora_rank + c.rope_dim, bias=False))
        self.kv_a_norm = nn.RMSNorm(c.kv_lora_rank, eps=LATENT_NORM_EPS)
        self.kv_b_proj = init_linear(nn.Linear(c.kv_lora_rank, H * (self.nope_dim + c.value_dim), bias=False))
        self.out_proj = init_linear(nn.Linear(H * c.value_dim, D, bias=False))
        self.dropout = Dropout(c.dropout_rates["attention"])
        self.attn_probs: Tensor | None = None

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
        kv_cache: LatentCache | None = None,
        key_padding: Tensor | None = None,
        q_pos: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """query (B, T, D) (key and value: the same tensor); rope the (cos, sin) of its positions; q_pos (T,) and
        kv_cache in decoding; key_padding (B, P) True = a real token. Returns out (B, T, D) and, with need_weights,
        the probabilities (B, H, T, P)."""
        if rope is None:
            raise ValueError("LatentAttention needs the rotary tables (rope), got None")
        x, H, Dn = query, self.n_heads, self.nope_dim
        B, T, _ = x.shape
        q = self.q_proj(x) if hasattr(self, "q_proj") else self.q_b_proj(self.q_a_norm(self.q_a_proj(x)))
        q = q.unflatten(-1, (H, -1)).transpose(1, 2)  # (B, H, T, Dn + R)
        q_nope, q_rot = q.split([Dn, self.rope_dim], dim=-1)
        latent, k_rot = self.kv_a_proj(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        latent = self.kv_a_norm(latent)  # (B, T, C)
        q_rot = rope_complex(q_rot, *rope)
        k_rot = rope_complex(k_rot.unsqueeze(1), *rope).squeeze(1)  # (B, T, R)
        q_pos = torch.arange(T, device=x.device) if q_pos is None else q_pos
        k_pos = q_pos
        if kv_cache is not None:
            latent, k_rot, k_pos = kv_cache.update(latent, k_rot, q_pos)  # every position so far
        k_nope, v = self.kv_b_proj(latent).unflatten(-1, (H, -1)).transpose(1, 2).split([Dn, self.value_dim], -1)
        scores = (q_nope @ k_nope.transpose(-1, -2) + q_rot @ k_rot.unsqueeze(1).transpose(-1, -2)) * self.scale
        allowed = q_pos[:, None] >= k_pos[None, :]  # (T, P): causal in a decoder ...
        if not is_causal:
            allowed = torch.ones_like(allowed)  # ... every key in an encoder
        if attn_mask is not None:
            allowed = allowed & attn_mask
        if key_padding is not None:
            allowed = allowed & key_padding[:, k_pos][:, None, None, :]
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
        probs = probs.masked_fill(~allowed, 0.0)  # a row with no key left: zeros, not NaN
        self.attn_probs = probs.detach() if need_weights else None
        context = self.dropout(probs, dropout_mask) @ v  # (B, H, T, Dv)
        return self.out_proj(context.transpose(1, 2).flatten(2)), self.attn_probs
