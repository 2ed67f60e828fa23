"""Llama style, as Meta's single-file model.py: RMSNorm computed on `x.float()`, rotary positions from precomputed
complex `freqs_cis` (interleaved pairs (2i, 2i + 1)) passed to every layer as an argument, grouped-query attention
with `repeat_kv`, a SwiGLU feed-forward with w1 (gate), w3 (up) and w2 (down), no biases anywhere, an additive
causal mask built in `Transformer.forward`. (No KV cache and no inference_mode: the training-time forward.)

The `.float()` upcasts and the complex64 rotary product make a float32 island inside a float64 model: the judge is
to name it (dtype.float32_island) and run it in float64 for the float64 comparison."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

LEVEL = "transformer_lm"
CALL = None


@dataclass
class ModelArgs:
    dim: int = 32
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = 2  # two query heads share each K/V head
    vocab_size: int = 26
    multiple_of: int = 16  # the SwiGLU hidden size is rounded up to a multiple of this
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq_len: int = 32


class RMSNorm(torch.nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float()).type_as(x)
        return output * self.weight


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device, dtype=torch.float32)
    freqs = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64, (end, dim / 2)


def reshape_for_broadcast(freqs_cis: torch.Tensor, x: torch.Tensor):
    ndim = x.ndim
    assert 0 <= 1 < ndim
    assert freqs_cis.shape == (x.shape[1], x.shape[-1])
    shape = [d if i == 1 or i == ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(*shape)


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = reshape_for_broadcast(freqs_cis, xq_)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """torch.repeat_interleave(x, dim=2, repeats=n_rep)"""
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return (
        x[:, :, :, None, :]
        .expand(bs, slen, n_kv_heads, n_rep, head_dim)
        .reshape(bs, slen, n_kv_heads * n_rep, head_dim)
    )


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_kv_heads = args.n_heads if args.n_kv_heads is None else args.n_kv_heads
        self.n_local_heads = args.n_heads
        self.n_local_kv_heads = self.n_kv_heads
        self.n_rep = self.n_local_heads // self.n_local_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)

    def rotate(self, xq, xk, freqs_cis):
        return apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)

    def rotate_values(self, xv, freqs_cis):
        return xv

    def repeat(self, x):
        return repeat_kv(x, self.n_rep)

    def forward(self, x, start_pos, freqs_cis, mask):
        bsz, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        xq = xq.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        xk = xk.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)
        xv = xv.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)
        xq, xk = self.rotate(xq, xk, freqs_cis)
        xv = self.rotate_values(xv, freqs_cis)
        keys = self.repeat(xk)  # (bs, seqlen, n_local_heads, head_dim)
        values = self.repeat(xv)
        xq = xq.transpose(1, 2)  # (bs, n_local_heads, seqlen, head_dim)
        keys = keys.transpose(1, 2)
        values = values.transpose(1, 2)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask  # (bs, n_local_heads, seqlen, seqlen)
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        output = torch.matmul(scores, values)  # (bs, n_local_heads, seqlen, head_dim)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.wo(output)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, multiple_of: int, ffn_dim_multiplier: float | None):
        super().__init__()
        hidden_dim = int(2 * hidden_dim / 3)
        if ffn_dim_multiplier is not None:
            hidden_dim = int(ffn_dim_multiplier * hidden_dim)
        hidden_dim = multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: ModelArgs, attention=Attention, feed_forward=FeedForward, norm=RMSNorm):
        super().__init__()
        self.n_heads = args.n_heads
        self.dim = args.dim
        self.head_dim = args.dim // args.n_heads
        self.attention = attention(args)
        self.feed_forward = feed_forward(args.dim, 4 * args.dim, args.multiple_of, args.ffn_dim_multiplier)
        self.layer_id = layer_id
        self.attention_norm = norm(args.dim, eps=args.norm_eps)
        self.ffn_norm = norm(args.dim, eps=args.norm_eps)

    def forward(self, x, start_pos, freqs_cis, mask):
        h = x + self.attention(self.attention_norm(x), start_pos, freqs_cis, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, params: ModelArgs, **parts):
        super().__init__()
        self.params = params
        self.vocab_size = params.vocab_size
        self.n_layers = params.n_layers
        self.tok_embeddings = nn.Embedding(params.vocab_size, params.dim)
        self.layers = torch.nn.ModuleList()
        for layer_id in range(params.n_layers):
            self.layers.append(TransformerBlock(layer_id, params, **parts))
        self.norm = parts.get("norm", RMSNorm)(params.dim, eps=params.norm_eps)
        self.output = nn.Linear(params.dim, params.vocab_size, bias=False)
        self.freqs_cis = precompute_freqs_cis(params.dim // params.n_heads, params.max_seq_len * 2, params.rope_theta)

    def forward(self, tokens: torch.Tensor, start_pos: int = 0):
        _bsz, seqlen = tokens.shape
        h = self.tok_embeddings(tokens)
        self.freqs_cis = self.freqs_cis.to(h.device)
        freqs_cis = self.freqs_cis[start_pos : start_pos + seqlen]
        mask = None
        if seqlen > 1:
            mask = torch.full((seqlen, seqlen), float("-inf"), device=tokens.device)
            mask = torch.triu(mask, diagonal=1)
            mask = torch.hstack([torch.zeros((seqlen, start_pos), device=tokens.device), mask]).type_as(h)
        for layer in self.layers:
            h = layer(h, start_pos, freqs_cis, mask)
        h = self.norm(h)
        return self.output(h)


def model(**parts) -> Transformer:
    """The clean model: two layers, four query heads sharing two K/V heads, dim 32, vocabulary 26."""
    torch.manual_seed(0)
    return Transformer(ModelArgs(), **parts)


# --- mistakes put in on purpose ---------------------------------------------------------------------------------


class TiledKV(Attention):
    def repeat(self, x):
        return x.repeat(1, 1, self.n_rep, 1)  # tiles the heads: head h reads K/V head h % n_kv


class KeysRotatedInHalves(Attention):
    def rotate(self, xq, xk, freqs_cis):
        xq, _ = apply_rotary_emb(xq, xk, freqs_cis)
        half = xk.shape[-1] // 2  # the keys rotated with rotate_half's pairing (i, i + hd/2) instead
        cos = torch.view_as_real(freqs_cis)[..., 0].repeat(1, 2)[None, :, None, :].type_as(xk)
        sin = torch.view_as_real(freqs_cis)[..., 1].repeat(1, 2)[None, :, None, :].type_as(xk)
        rotated = torch.cat((-xk[..., half:], xk[..., :half]), dim=-1)
        return xq, xk * cos + rotated * sin


class RotatesValuesToo(Attention):
    def rotate_values(self, xv, freqs_cis):
        _, xv = apply_rotary_emb(xv, xv, freqs_cis)  # the values rotated like the keys
        return xv


class SiluOnUp(FeedForward):
    def forward(self, x):
        return self.w2(self.w1(x) * F.silu(self.w3(x)))  # the activation on w3 (up), not w1 (gate)


class EpsOutsideRoot(RMSNorm):
    def _norm(self, x):
        return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.eps)


class MeanOverPositions(RMSNorm):
    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + self.eps)  # dim 1: the positions, not the features


def kv_heads_tiled() -> Transformer:
    return model(attention=TiledKV)


def mixed_pairing() -> Transformer:
    return model(attention=KeysRotatedInHalves)


def activation_on_up() -> Transformer:
    return model(feed_forward=SiluOnUp)


def rms_eps_outside_sqrt() -> Transformer:
    return model(norm=EpsOutsideRoot)


def applied_to_v() -> Transformer:
    return model(attention=RotatesValuesToo)


def rms_wrong_axis() -> Transformer:
    return model(norm=MeanOverPositions)


# (factory, the catalogue id the judge must name first, the submodule it must name)
MISTAKES = [
    (kv_heads_tiled, "attention.kv_heads_tiled", "layers.0.attention"),
    (mixed_pairing, "rope.mixed_pairing", "layers.0.attention"),
    (activation_on_up, "gated_feed_forward.activation_on_up", "layers.0.feed_forward"),
    (rms_eps_outside_sqrt, "rms_norm.eps_outside_sqrt", "layers.0.attention_norm"),
    (applied_to_v, "rope.applied_to_v", "layers.0.attention"),
    (rms_wrong_axis, "rms_norm.wrong_axis", "layers.0.attention_norm"),
]
