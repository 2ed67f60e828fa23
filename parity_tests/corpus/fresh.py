"""Models in styles none of the other corpus files uses, as a learner in 2026 writes them (issue 46, round 3), in
this project's own words: the judge meets them here for the first time.

- a bias-free pre-norm GPT: one fused qkv Linear split by `.unflatten(-1, (3, H, head_dim)).unbind(...)`,
  `F.scaled_dot_product_attention(..., is_causal=True)`, learned positions as a bare nn.Parameter, its blocks in
  an nn.ModuleDict iterated by `.values()`, the head tied by `self.head.weight = self.tok.weight`, and a dataclass
  output `(logits, loss)`;
- a Llama written with einsum only (`"bhqd,bhkd->bhqk"`, no einops), grouped-query attention by
  `repeat_interleave`, an RMSNorm in a float32 upcast (`x.float() ... .type_as(x)`, `torch.rsqrt`), half-split RoPE
  tables built in the forward, a SwiGLU of one fused Linear split by `.chunk`, and a dict output;
- a post-norm BERT-ish encoder: word, learned position and token-type embeddings summed and normed, layers of its
  own LayerNorm class written out, attention over a padding mask of 1s and 0s turned additive;
- a GPT of raw nn.Parameters and no nn.Linear, as a port from JAX writes it: `x @ W` with W stored (in, out), norms
  by `F.layer_norm(x, (D,), self.ln1_g, self.ln1_b)` (GPT-2's g and b) called in the block itself, the attention
  inline in the block, the token table read back as the output projection (`@ self.wte.T`);
- a GPT that is one nn.Sequential from ids to logits (an embedding module that adds its own positions, pre-norm
  `Residual(f)` wrappers), its SDPA given a boolean keep-mask it builds with `tril`;
- mistakes put into them, each named where it sits: the causal flag left off in the second block's SDPA, K/V heads
  tiled instead of repeated, softmax over the queries in an einsum attention, the LayerNorm's variance unbiased,
  the scores divided by d_head (no root) in the raw GPT's second block, `tril(diagonal=1)` (the next token shown)
  in the Sequential GPT's second attention.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

D, H, KV, V, T_MAX, TYPES = 32, 4, 2, 26, 32, 2
HD = D // H


# -- a bias-free pre-norm GPT: fused qkv, SDPA, blocks in a ModuleDict, tied head, dataclass output ----------------


@dataclass
class LMOutput:
    logits: torch.Tensor
    loss: torch.Tensor | None = None


class FusedAttention(nn.Module):
    def __init__(self, causal: bool = True):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D, bias=False)
        self.proj = nn.Linear(D, D, bias=False)
        self.causal = causal

    def split(self, qkv):
        return qkv.unflatten(-1, (3, H, HD)).transpose(1, 3).unbind(dim=2)  # each (B, H, T, HD)

    def forward(self, x):
        q, k, v = self.split(self.qkv(x))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).flatten(-2))


class PerHeadQKV(FusedAttention):
    """GPT-NeoX's layout: each head's q, k and v rows together, (head, q | k | v, feature)."""

    def split(self, qkv):
        return qkv.unflatten(-1, (H, 3 * HD)).transpose(1, 2).chunk(3, dim=-1)


class FusedBlock(nn.Module):
    def __init__(self, causal: bool = True, norm_bias: bool = False):
        super().__init__()
        self.norm1 = nn.LayerNorm(D, bias=norm_bias)
        self.attn = FusedAttention(causal)
        self.norm2 = nn.LayerNorm(D, bias=norm_bias)
        self.ff = nn.Sequential(nn.Linear(D, 4 * D, bias=False), nn.GELU(), nn.Linear(4 * D, D, bias=False))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.ff(self.norm2(x))


class FusedGPT(nn.Module):
    def __init__(self, last_causal: bool = True, as_tuple: bool = False, norm_bias: bool = False):
        super().__init__()
        self.tok = nn.Embedding(V, D)
        self.pos = nn.Parameter(0.02 * torch.randn(T_MAX, D))
        self.layers = nn.ModuleDict(
            {"first": FusedBlock(True, norm_bias), "second": FusedBlock(last_causal, norm_bias)}
        )
        self.norm = nn.LayerNorm(D, bias=norm_bias)
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.tok.weight
        self.as_tuple = as_tuple

    def forward(self, idx, targets=None):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for block in self.layers.values():
            x = block(x)
        logits = self.head(self.norm(x))
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return (logits, loss) if self.as_tuple else LMOutput(logits, loss)


def fused_gpt(last_causal: bool = True, as_tuple: bool = False, norm_bias: bool = False) -> FusedGPT:
    torch.manual_seed(0)
    return FusedGPT(last_causal, as_tuple, norm_bias)


def per_head_gpt() -> FusedGPT:
    """The tuple-returning GPT with norm biases, its fused qkv rows in GPT-NeoX's per-head layout."""
    model = fused_gpt(as_tuple=True, norm_bias=True)
    for block in model.layers.values():
        block.attn = PerHeadQKV()
    return model


# -- an einsum Llama: GQA by repeat_interleave, float32-upcast RMSNorm, SwiGLU by chunk, dict output -------------


class UpcastRMSNorm(nn.Module):
    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(D))

    def forward(self, x):
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight).type_as(x)


def half_turn(x, cos, sin):
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), dim=-1) * sin


class EinsumAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq = nn.Linear(D, H * HD, bias=False)
        self.wk = nn.Linear(D, KV * HD, bias=False)
        self.wv = nn.Linear(D, KV * HD, bias=False)
        self.wo = nn.Linear(H * HD, D, bias=False)

    def widen(self, t):
        return t.repeat_interleave(H // KV, dim=1)  # (B, KV, T, HD) -> (B, H, T, HD), each K/V head kept adjacent

    def normalise(self, scores):
        return scores.softmax(dim=-1)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, H, HD).transpose(1, 2)
        k = self.wk(x).view(B, T, KV, HD).transpose(1, 2)
        v = self.wv(x).view(B, T, KV, HD).transpose(1, 2)
        q, k = half_turn(q, cos, sin), half_turn(k, cos, sin)
        k, v = self.widen(k), self.widen(v)
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(HD)
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        probs = self.normalise(scores.masked_fill(future, float("-inf")))
        out = torch.einsum("bhqk,bhkd->bqhd", probs, v)
        return self.wo(out.reshape(B, T, H * HD))


class TiledKV(EinsumAttention):
    def widen(self, t):
        return t.repeat(1, H // KV, 1, 1)  # heads tiled: K/V head j serves query heads j, j + KV, ...


class SoftmaxOverQueries(EinsumAttention):
    def normalise(self, scores):
        return scores.softmax(dim=-2)  # normalised over the queries


class SwiGLU(nn.Module):
    def __init__(self, hidden: int = 64):
        super().__init__()
        self.w13 = nn.Linear(D, 2 * hidden, bias=False)
        self.w2 = nn.Linear(hidden, D, bias=False)

    def forward(self, x):
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class EinsumLayer(nn.Module):
    def __init__(self, attention=EinsumAttention):
        super().__init__()
        self.attention_norm = UpcastRMSNorm()
        self.attention = attention()
        self.ffn_norm = UpcastRMSNorm()
        self.feed_forward = SwiGLU()

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class EinsumLlama(nn.Module):
    def __init__(self, last=EinsumAttention, theta: float = 10000.0):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.layers = nn.ModuleList([EinsumLayer(), EinsumLayer(last)])
        self.norm = UpcastRMSNorm()
        self.output = nn.Linear(D, V, bias=False)
        self.theta = theta

    def tables(self, T, like):
        inv = self.theta ** -(torch.arange(0, HD, 2, dtype=torch.float64) / HD)
        angles = torch.outer(torch.arange(T, dtype=torch.float64), inv)
        angles = torch.cat((angles, angles), dim=-1).to(like.dtype)
        return angles.cos(), angles.sin()

    def forward(self, tokens):
        h = self.embed(tokens)
        cos, sin = self.tables(tokens.shape[1], h)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return {"logits": self.output(self.norm(h))}


def einsum_llama(last=EinsumAttention) -> EinsumLlama:
    torch.manual_seed(0)
    return EinsumLlama(last)


# -- a post-norm BERT-ish encoder: token types, learned positions, its own LayerNorm, a 0/1 padding mask ---------


class WrittenLayerNorm(nn.Module):
    def __init__(self, eps: float = 1e-12, unbiased: bool = False):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(D))
        self.beta = nn.Parameter(torch.zeros(D))
        self.eps, self.unbiased = eps, unbiased

    def forward(self, x):
        mu = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, unbiased=self.unbiased)
        return self.gamma * (x - mu) / torch.sqrt(var + self.eps) + self.beta


class PaddedSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.query, self.key, self.value = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.dense = nn.Linear(D, D)

    def forward(self, x, additive):
        B, T, _ = x.shape
        q, k, v = (lin(x).view(B, T, H, HD).permute(0, 2, 1, 3) for lin in (self.query, self.key, self.value))
        scores = q @ k.transpose(-1, -2) / math.sqrt(HD) + additive  # additive: (B, 1, 1, T), 0 or very negative
        return self.dense((scores.softmax(-1) @ v).permute(0, 2, 1, 3).reshape(B, T, D))


class PostNormLayer(nn.Module):
    def __init__(self, unbiased: bool = False):
        super().__init__()
        self.attention = PaddedSelfAttention()
        self.attention_norm = WrittenLayerNorm(unbiased=unbiased)
        self.intermediate = nn.Linear(D, 4 * D)
        self.output = nn.Linear(4 * D, D)
        self.output_norm = WrittenLayerNorm()

    def forward(self, x, additive):
        x = self.attention_norm(x + self.attention(x, additive))
        return self.output_norm(x + self.output(F.gelu(self.intermediate(x))))


class TypedEncoder(nn.Module):
    def __init__(self, unbiased_second: bool = False):
        super().__init__()
        self.word = nn.Embedding(V, D)
        self.position = nn.Embedding(T_MAX, D)
        self.token_type = nn.Embedding(TYPES, D)
        self.embedding_norm = WrittenLayerNorm()
        self.layers = nn.ModuleList([PostNormLayer(), PostNormLayer(unbiased_second)])

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        B, T = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones(B, T, dtype=torch.long, device=input_ids.device)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        positions = torch.arange(T, device=input_ids.device)
        x = self.word(input_ids) + self.position(positions) + self.token_type(token_type_ids)
        x = self.embedding_norm(x)
        additive = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, additive)
        return x


def typed_encoder(unbiased_second: bool = False) -> TypedEncoder:
    torch.manual_seed(0)
    return TypedEncoder(unbiased_second)


# -- raw parameters, no nn.Linear: x @ W with W stored (in, out), as a port from JAX writes it ------------------


class RawBlock(nn.Module):
    def __init__(self, scale: float = HD**-0.5, axis: int = -1, causal: bool = True):
        super().__init__()
        self.ln1_g, self.ln1_b = nn.Parameter(torch.ones(D)), nn.Parameter(torch.zeros(D))
        self.w_qkv, self.b_qkv = nn.Parameter(0.1 * torch.randn(D, 3 * D)), nn.Parameter(torch.zeros(3 * D))
        self.w_o, self.b_o = nn.Parameter(0.1 * torch.randn(D, D)), nn.Parameter(torch.zeros(D))
        self.ln2_g, self.ln2_b = nn.Parameter(torch.ones(D)), nn.Parameter(torch.zeros(D))
        self.w_in, self.b_in = nn.Parameter(0.1 * torch.randn(D, 4 * D)), nn.Parameter(torch.zeros(4 * D))
        self.w_out, self.b_out = nn.Parameter(0.1 * torch.randn(4 * D, D)), nn.Parameter(torch.zeros(D))
        self.register_buffer("causal", torch.tril(torch.ones(T_MAX, T_MAX, dtype=torch.bool)), persistent=False)
        self.scale, self.axis, self.is_causal = scale, axis, causal

    def attend(self, x):
        B, T, _ = x.shape
        q, k, v = (x @ self.w_qkv + self.b_qkv).split(D, dim=-1)
        q, k, v = (t.reshape(B, T, H, HD).permute(0, 2, 1, 3) for t in (q, k, v))
        scores = (q @ k.transpose(-1, -2)) * self.scale
        if self.is_causal:
            scores = scores.masked_fill(~self.causal[:T, :T], float("-inf"))
        y = (scores.softmax(self.axis) @ v).permute(0, 2, 1, 3).reshape(B, T, D)
        return y @ self.w_o + self.b_o

    def forward(self, x):
        x = x + self.attend(F.layer_norm(x, (D,), self.ln1_g, self.ln1_b))
        h = F.layer_norm(x, (D,), self.ln2_g, self.ln2_b)
        return x + F.gelu(h @ self.w_in + self.b_in) @ self.w_out + self.b_out


class RawGPT(nn.Module):
    def __init__(self, last_scale: float = HD**-0.5, last_axis: int = -1, last_causal: bool = True):
        super().__init__()
        self.wte = nn.Parameter(0.1 * torch.randn(V, D))
        self.wpe = nn.Parameter(0.1 * torch.randn(T_MAX, D))
        self.blocks = nn.ModuleList([RawBlock(), RawBlock(last_scale, last_axis, last_causal)])
        self.lnf_g, self.lnf_b = nn.Parameter(torch.ones(D)), nn.Parameter(torch.zeros(D))

    def forward(self, ids):
        x = self.wte[ids] + self.wpe[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return F.layer_norm(x, (D,), self.lnf_g, self.lnf_b) @ self.wte.T  # tied: the table read back


def raw_gpt(last_scale: float = HD**-0.5, last_axis: int = -1, last_causal: bool = True) -> RawGPT:
    torch.manual_seed(0)
    return RawGPT(last_scale, last_axis, last_causal)


# -- one nn.Sequential from ids to logits; SDPA with a boolean keep-mask it builds itself ---------------------------


class TokensAndPositions(nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(V, D)
        self.positions = nn.Embedding(T_MAX, D)

    def forward(self, ids):
        return self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))


class MaskedSDPA(nn.Module):
    def __init__(self, ahead: int = 0):
        super().__init__()
        self.c_attn = nn.Linear(D, 3 * D)
        self.c_proj = nn.Linear(D, D)
        self.ahead = ahead  # 0: each position sees itself and the past

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, H, HD).transpose(1, 2) for t in self.c_attn(x).split(D, dim=2))
        keep = torch.ones(T, T, dtype=torch.bool, device=x.device).tril(diagonal=self.ahead)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, D))


class Residual(nn.Module):
    """x + f(LayerNorm(x)): the pre-norm sublayer as a module of its own."""

    def __init__(self, f):
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.f = f

    def forward(self, x):
        return x + self.f(self.norm(x))


def sequential_gpt(ahead_second: int = 0) -> nn.Sequential:
    torch.manual_seed(0)
    layers = []
    for ahead in (0, ahead_second):
        layers.append(Residual(MaskedSDPA(ahead)))
        layers.append(Residual(nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))))
    return nn.Sequential(TokensAndPositions(), *layers, nn.LayerNorm(D), nn.Linear(D, V, bias=False))


CASES = [
    ("fused_gpt", fused_gpt, "transformer_lm", {}, "pass"),
    ("fused_gpt.tuple_output", lambda: fused_gpt(as_tuple=True), "transformer_lm", {}, "pass"),
    ("fused_gpt.norm_biases", lambda: fused_gpt(as_tuple=True, norm_bias=True), "transformer_lm", {}, "pass"),
    ("fused_gpt.per_head_qkv", per_head_gpt, "transformer_lm", {}, "pass"),
    (
        "fused_gpt.not_causal_second_block",
        lambda: fused_gpt(last_causal=False, as_tuple=True, norm_bias=True),
        "transformer_lm",
        {},
        ("mistake", "attention.not_causal", "layers.second.attn"),
    ),
    ("einsum_llama", einsum_llama, "transformer_lm", {}, "pass"),
    (
        "einsum_llama.kv_heads_tiled_second_block",
        lambda: einsum_llama(TiledKV),
        "transformer_lm",
        {},
        ("mistake", "attention.kv_heads_tiled", "layers.1.attention"),
    ),
    (
        "einsum_llama.softmax_wrong_axis_second_block",
        lambda: einsum_llama(SoftmaxOverQueries),
        "transformer_lm",
        {},
        ("mistake", "attention.softmax_wrong_axis", "layers.1.attention"),
    ),
    ("raw_gpt", raw_gpt, "transformer_lm", {}, "pass"),
    (
        "raw_gpt.wrong_scale_second_block",
        lambda: raw_gpt(1 / HD),
        "transformer_lm",
        {},
        ("mistake", "attention.wrong_scale", "blocks.1"),
    ),
    (
        "raw_gpt.softmax_wrong_axis_second_block",
        lambda: raw_gpt(last_axis=-2),
        "transformer_lm",
        {},
        ("mistake", "attention.softmax_wrong_axis", "blocks.1"),
    ),
    (
        "raw_gpt.not_causal_second_block",
        lambda: raw_gpt(last_causal=False),
        "transformer_lm",
        {},
        ("mistake", "attention.not_causal", "blocks.1"),
    ),
    ("sequential_gpt", sequential_gpt, "transformer_lm", {}, "pass"),
    (
        "sequential_gpt.causal_shows_next_second_block",
        lambda: sequential_gpt(ahead_second=1),
        "transformer_lm",
        {},
        ("mistake", "attention.causal_shows_next", "3.f"),
    ),
    ("typed_encoder", typed_encoder, "encoder", {}, "pass"),
    (
        "typed_encoder.unbiased_variance_second_block",
        lambda: typed_encoder(unbiased_second=True),
        "encoder",
        {},
        ("mistake", "layer_norm.unbiased_variance", "layers.1.attention_norm"),
    ),
]
