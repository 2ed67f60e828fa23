"""The open models learners still study, each written by hand the way a blog post walks through it (issue 46, round 8),
in this project's own words: styles none of the other corpus files uses. The judge meets them here first (measured
with the judge frozen: what it said when it first met each is in parity_tests/test_unseen.py's TODAY).

- a Falcon-7B-style LM: one LayerNorm read by both the attention and the MLP (a parallel block), multi-query
  attention out of a fused `query_key_value` Linear split by sizes [D, Dh, Dh], the single K/V head left to
  broadcast in the matmul (never expanded), rotary on the whole head, no Linear biases;
- a BLOOM-style LM: a LayerNorm on the word embeddings, the fused qkv laid out per head (q, k, v interleaved by
  head: viewed (B, T, H, 3, Dh)), ALiBi's slope times the key's index added by `torch.baddbmm` (the reference's
  -m |i - j| up to a constant on each causal row, which the softmax cancels: its positional "alibi"), GELU-tanh, the
  table read back as the head; alone, and with positional="alibi" given;
- an OPT-style LM: learned positions in a table of T_MAX + 2 rows read at positions + 2, the queries scaled before
  the product (`q_proj(x) * scaling`), ReLU MLP, pre-LayerNorm, a final norm, the head tied to the token table;
- a StableLM-style LM: LayerNorms with bias, a SwiGLU MLP, 2 heads of 16 with rotary on the first 25% of each
  (4 of 16 features, in halves); and with 4 heads of 8, where 25% is one pair (features 0 and 1) turned at
  frequency 1, alone and with rotary_dim=2 given;
- a Starcoder2-style LM: biases everywhere, a GELU-tanh MLP of c_fc / c_proj, grouped-query attention
  (`repeat_interleave`), a sliding window of 4 keys given to SDPA as a boolean keep-mask, RoPE at base 1e5;
- a RoBERTa-style encoder: positions numbered from padding_idx + 1 by a cumsum over the non-padding tokens, post-LN,
  GELU, a token-type table of one row;
- a DistilBERT-style encoder: no token types, q_lin / k_lin / v_lin / out_lin, the queries divided by sqrt(Dh)
  before the product, sa_layer_norm / output_layer_norm;
- a DeBERTa-style encoder: disentangled attention, content-to-position and position-to-content terms read from a
  relative-position table (a parameter of each attention, projected by its own query and key Linears) and added to
  the scores, all over sqrt(3 Dh): math the reference has no pair for, said at the first attention;
- a GPT whose softmax is written out (exp(s - max s) / sum): alone; with ALiBi added at the reference's slopes (a
  pass: "alibi"); with a learned per-head table of key - query added (no pair, said at the first attention);
- a MosaicBERT-style encoder with ALiBi on both sides, -m |i - j| (the reference's: a pass); at a quarter of the
  slopes, and as m (j - i) (BLOOM's form, unmasked after the query): no pair, each said with the form it has;
- mistakes put into them, each named where it sits: RoPE on the values in Falcon's second block, OPT's second
  attention scaled by d_model ** -0.5, StableLM's second softmax over the queries, Starcoder2's K/V heads tiled
  (`.repeat`) in its second block, DistilBERT's attention dropout left on in evaluation in its second layer.

First met: 13 of 16 right. Wrong then: BLOOM's ALiBi by baddbmm (unexplained, though the reference has ALiBi: it
passes with positional="alibi" given), StableLM's 25% rotary where that is one pair (rotary_dim read as 4: passes
with rotary_dim=2 given), and DeBERTa's disentangled terms (said as a flipped mask, under a mask convention that hides
every term on the scores). The two cases with positional= and rotary_dim= given were added to settle the math of
the first two (the judge right on both). Added later (the judge before its fix -> now): the written-out softmax with
ALiBi (unexplained -> pass) and with a relative table (unexplained -> no pair: the terms were looked for only behind
a softmax op); the ALiBi encoder (attention.mask_inverted -> pass: a term subtracted from the scores was not seen),
at a quarter of the slopes and in BLOOM's form on both sides (attention.mask_inverted -> no pair; ALiBi was read on
causal rows only, where m (j - i) and -m |i - j| agree).

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

D, H, KV, V, T_MAX, PAD = 32, 4, 2, 26, 32, 1
HD = D // H


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases moved off their 1s and 0s, so that trained values are what is checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _hidden(T: int) -> torch.Tensor:
    """True where a query may not look: the keys after it."""
    return torch.ones(T, T, dtype=torch.bool).triu(1)


def _rope(x: torch.Tensor, rotated: int = HD, base: float = 10000.0) -> torch.Tensor:
    """Rotary in halves (rotate_half) on the first `rotated` features of each head of x (B, h, T, Dh)."""
    T = x.shape[-2]
    inv = 1.0 / base ** (torch.arange(0, rotated, 2, dtype=x.dtype) / rotated)
    angles = torch.outer(torch.arange(T, dtype=x.dtype), inv)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    turn, keep = x[..., :rotated], x[..., rotated:]
    first, second = turn.chunk(2, dim=-1)
    return torch.cat([turn * cos + torch.cat([-second, first], -1) * sin, keep], -1)


# -- Falcon-7B: parallel block of one LayerNorm, multi-query attention from a fused query_key_value -------------------


class FalconAttention(nn.Module):
    def __init__(self, rope_on_values=False):
        super().__init__()
        self.query_key_value = nn.Linear(D, D + 2 * HD, bias=False)
        self.dense = nn.Linear(D, D, bias=False)
        self.rope_on_values = rope_on_values  # the mistake: the values turned as well

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.query_key_value(x).split([D, HD, HD], dim=-1)
        q = _rope(q.view(B, T, H, HD).transpose(1, 2))
        k = _rope(k[:, None])  # (B, 1, T, Dh): the one K/V head broadcast over the query heads
        v = _rope(v[:, None]) if self.rope_on_values else v[:, None]
        scores = (q @ k.transpose(-1, -2) / math.sqrt(HD)).masked_fill(_hidden(T), float("-inf"))
        return self.dense((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D))


class FalconBlock(nn.Module):
    def __init__(self, rope_on_values=False):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(D)
        self.self_attention = FalconAttention(rope_on_values)
        self.dense_h_to_4h = nn.Linear(D, 4 * D, bias=False)
        self.dense_4h_to_h = nn.Linear(4 * D, D, bias=False)

    def forward(self, x):
        h = self.input_layernorm(x)
        return x + self.self_attention(h) + self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(h)))


class FalconLM(nn.Module):
    def __init__(self, rope_on_values_second):
        super().__init__()
        self.word_embeddings = nn.Embedding(V, D)
        self.h = nn.ModuleList([FalconBlock(), FalconBlock(rope_on_values_second)])
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, input_ids):
        x = self.word_embeddings(input_ids)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def falcon(rope_on_values_second=False) -> FalconLM:
    torch.manual_seed(0)
    return _jitter(FalconLM(rope_on_values_second))


# -- BLOOM: embedding LayerNorm, per-head fused qkv, ALiBi by baddbmm ------------------------------------------------


def _alibi_slopes(n_heads: int) -> torch.Tensor:
    """The geometric slopes 2^(-8 i / n) for i = 1 .. n (n a power of two)."""
    return 2.0 ** (-8.0 * torch.arange(1, n_heads + 1) / n_heads)


class BloomAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.query_key_value = nn.Linear(D, 3 * D)
        self.dense = nn.Linear(D, D)

    def forward(self, x, alibi):
        B, T, _ = x.shape
        fused = self.query_key_value(x).view(B, T, H, 3, HD)  # per head: its q, k, v side by side
        q, k, v = (fused[..., i, :].transpose(1, 2).reshape(B * H, T, HD) for i in range(3))
        scores = torch.baddbmm(alibi, q, k.transpose(1, 2), beta=1.0, alpha=1 / math.sqrt(HD)).view(B, H, T, T)
        weights = scores.masked_fill(_hidden(T), torch.finfo(x.dtype).min).softmax(-1)
        context = (weights.view(B * H, T, T) @ v).view(B, H, T, HD)
        return self.dense(context.transpose(1, 2).reshape(B, T, D))


class BloomBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = nn.LayerNorm(D), nn.LayerNorm(D)
        self.self_attention = BloomAttention()
        self.dense_h_to_4h, self.dense_4h_to_h = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x, alibi):
        x = x + self.self_attention(self.input_layernorm(x), alibi)
        h = F.gelu(self.dense_h_to_4h(self.post_attention_layernorm(x)), approximate="tanh")
        return x + self.dense_4h_to_h(h)


class BloomLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.word_embeddings = nn.Embedding(V, D)
        self.word_embeddings_layernorm = nn.LayerNorm(D)
        self.h = nn.ModuleList([BloomBlock() for _ in range(2)])
        self.ln_f = nn.LayerNorm(D)
        self.register_buffer("slopes", _alibi_slopes(H), persistent=False)

    def forward(self, input_ids):
        B, T = input_ids.shape
        alibi = (self.slopes[:, None, None] * torch.arange(T)[None, None]).repeat(B, 1, 1)  # (B * H, 1, T)
        x = self.word_embeddings_layernorm(self.word_embeddings(input_ids))
        for block in self.h:
            x = block(x, alibi.to(x.dtype))
        return self.ln_f(x) @ self.word_embeddings.weight.T


def bloom() -> BloomLM:
    torch.manual_seed(0)
    return _jitter(BloomLM())


# -- a softmax written out, with a term on the scores; an encoder with ALiBi on both sides (MosaicBERT's) -------------


class HandSoftmaxAttention(nn.Module):
    """Causal attention whose softmax is written out: e = exp(s - max s), e / sum e; `term` added to the scores:
    "none"; "alibi", -m_h |i - j| at the reference's slopes (2^(-8 h / H)): its positional "alibi"; "table", a learned
    per-head bias of key - query, a row per distance, which the judge does not read as T5's bucketed table (as
    fresh3's t5_bias_gpt): math said to have no pair."""

    def __init__(self, term: str = "none"):
        super().__init__()
        self.c_attn, self.c_proj, self.term = nn.Linear(D, 3 * D), nn.Linear(D, D), term
        self.register_buffer("slopes", _alibi_slopes(H), persistent=False)
        if term == "table":
            self.rel = nn.Parameter(0.5 * torch.randn(2 * T_MAX - 1, H))

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.c_attn(x).view(B, T, 3, H, HD).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-2, -1) / math.sqrt(HD)
        distance = torch.arange(T)[None, :] - torch.arange(T)[:, None]  # key - query
        if self.term == "alibi":
            s = s + -self.slopes[:, None, None] * distance.abs().to(x.dtype)
        elif self.term == "table":
            s = s + self.rel[distance + T_MAX - 1].permute(2, 0, 1)
        s = s.masked_fill(_hidden(T), float("-inf"))
        e = torch.exp(s - s.amax(-1, keepdim=True))
        p = e / e.sum(-1, keepdim=True)
        return self.c_proj((p @ v).transpose(1, 2).reshape(B, T, D))


class HandSoftmaxBlock(nn.Module):
    def __init__(self, term: str):
        super().__init__()
        self.ln_1, self.ln_2, self.attn = nn.LayerNorm(D), nn.LayerNorm(D), HandSoftmaxAttention(term)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class HandSoftmaxGPT(nn.Module):
    def __init__(self, term: str = "none"):
        super().__init__()
        self.wte = nn.Embedding(V, D)
        self.wpe = nn.Embedding(T_MAX, D) if term == "none" else None
        self.h = nn.ModuleList([HandSoftmaxBlock(term) for _ in range(2)])
        self.ln_f, self.lm_head = nn.LayerNorm(D), nn.Linear(D, V, bias=False)

    def forward(self, idx):
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def hand_softmax_gpt(term: str = "none") -> HandSoftmaxGPT:
    torch.manual_seed(0)
    return _jitter(HandSoftmaxGPT(term))


class AlibiBertLayer(nn.Module):
    """Post-LN BERT layer, no positions, ALiBi read on both sides of each query (MosaicBERT's): `form` "abs", the
    scores minus m_h |i - j|, the reference's bias in an encoder (numpy_transformer.scores.position_bias: -m |i - j|,
    no causal mask); "signed", plus m_h (j - i) (BLOOM's form, the same on causal rows, but no mask hides j > i here:
    +m (j - i) where the reference has -m (j - i), 2 m (j - i) apart on the keys after the query, no row constant the
    softmax cancels). `factor` times the reference's slopes m_h = 2^(-8 h / H)."""

    def __init__(self, form: str = "abs", factor: float = 1.0):
        super().__init__()
        self.query, self.key, self.value, self.dense = (nn.Linear(D, D) for _ in range(4))
        self.attention_norm, self.output_norm = nn.LayerNorm(D, eps=1e-12), nn.LayerNorm(D, eps=1e-12)
        self.intermediate, self.output = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.register_buffer("slopes", factor * _alibi_slopes(H), persistent=False)
        self.form = form

    def forward(self, x, keep):
        B, T, _ = x.shape
        q, k, v = (p(x).view(B, T, H, HD).transpose(1, 2) for p in (self.query, self.key, self.value))
        distance = (torch.arange(T)[None, :] - torch.arange(T)[:, None]).to(x.dtype)  # j - i
        scores = q @ k.transpose(-1, -2) / math.sqrt(HD)
        if self.form == "abs":
            scores = scores - self.slopes[:, None, None] * distance.abs()
        else:
            scores = scores + self.slopes[:, None, None] * distance
        scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
        x = self.attention_norm(x + self.dense((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D)))
        return self.output_norm(x + self.output(F.gelu(self.intermediate(x))))


class AlibiBert(nn.Module):
    def __init__(self, form: str = "abs", factor: float = 1.0):
        super().__init__()
        self.word_embeddings = nn.Embedding(V, D, padding_idx=PAD)
        self.embeddings_norm = nn.LayerNorm(D, eps=1e-12)
        self.layer = nn.ModuleList([AlibiBertLayer(form, factor) for _ in range(2)])

    def forward(self, input_ids, attention_mask=None):
        keep = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        x = self.embeddings_norm(self.word_embeddings(input_ids))
        for layer in self.layer:
            x = layer(x, keep)
        return x


def alibi_bert(form: str = "abs", factor: float = 1.0) -> AlibiBert:
    torch.manual_seed(0)
    return _jitter(AlibiBert(form, factor))


# -- OPT: learned positions offset by 2, queries scaled first, ReLU, tied head ----------------------------------------


class OffsetPositions(nn.Embedding):
    """OPT's learned positions: the table has 2 rows more, position t reads row t + 2."""

    offset = 2

    def __init__(self):
        super().__init__(T_MAX + self.offset, D)

    def forward(self, T):
        return super().forward(torch.arange(T) + self.offset)


class OptAttention(nn.Module):
    def __init__(self, scaling=HD**-0.5):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(D, D) for _ in range(4))
        self.scaling = scaling  # D ** -0.5: the mistake, the model width for the head width

    def forward(self, x):
        B, T, _ = x.shape
        q = (self.q_proj(x) * self.scaling).view(B, T, H, HD).transpose(1, 2)
        k, v = (p(x).view(B, T, H, HD).transpose(1, 2) for p in (self.k_proj, self.v_proj))
        weights = (q @ k.transpose(-1, -2)).masked_fill(_hidden(T), float("-inf")).softmax(-1)
        return self.out_proj((weights @ v).transpose(1, 2).reshape(B, T, D))


class OptLayer(nn.Module):
    def __init__(self, scaling=HD**-0.5):
        super().__init__()
        self.self_attn_layer_norm, self.self_attn = nn.LayerNorm(D), OptAttention(scaling)
        self.final_layer_norm, self.fc1, self.fc2 = nn.LayerNorm(D), nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x):
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        return x + self.fc2(F.relu(self.fc1(self.final_layer_norm(x))))


class OptDecoder(nn.Module):
    def __init__(self, second_scaling):
        super().__init__()
        self.embed_tokens, self.embed_positions = nn.Embedding(V, D), OffsetPositions()
        self.layers = nn.ModuleList([OptLayer(), OptLayer(second_scaling)])
        self.final_layer_norm = nn.LayerNorm(D)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids) + self.embed_positions(input_ids.shape[1])
        for layer in self.layers:
            x = layer(x)
        return self.final_layer_norm(x)


class OptLM(nn.Module):
    def __init__(self, second_scaling):
        super().__init__()
        self.decoder = OptDecoder(second_scaling)

    def forward(self, input_ids):
        return F.linear(self.decoder(input_ids), self.decoder.embed_tokens.weight)


def opt(second_scaling=HD**-0.5) -> OptLM:
    torch.manual_seed(0)
    return _jitter(OptLM(second_scaling))


# -- StableLM: rotary on 25% of each head, LayerNorm with bias, SwiGLU ------------------------------------------------


class StableAttention(nn.Module):
    axis = -1  # -2: the mistake, the softmax over the queries
    heads = 2  # 2 heads of 16 features, the first 4 of each turned; 4 heads: 2 of 8 turned (one pair)

    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(D, D) for _ in range(3))
        self.o_proj = nn.Linear(D, D, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        width = D // self.heads
        q, k, v = (p(x).view(B, T, self.heads, width).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = _rope(q, width // 4), _rope(k, width // 4)
        scores = (q @ k.transpose(-1, -2) / math.sqrt(width)).masked_fill(_hidden(T), float("-inf"))
        return self.o_proj((scores.softmax(self.axis) @ v).transpose(1, 2).reshape(B, T, D))


class OverQueries(StableAttention):
    axis = -2


class FourHeads(StableAttention):
    heads = 4


class StableLayer(nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.input_layernorm, self.self_attn = nn.LayerNorm(D), attention()
        self.post_attention_layernorm = nn.LayerNorm(D)
        self.gate_proj, self.up_proj = nn.Linear(D, 64, bias=False), nn.Linear(D, 64, bias=False)
        self.down_proj = nn.Linear(64, D, bias=False)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class StableLM(nn.Module):
    def __init__(self, second, first):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([StableLayer(first), StableLayer(second)])
        self.norm = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def stablelm(second=StableAttention, first=StableAttention) -> StableLM:
    torch.manual_seed(0)
    return _jitter(StableLM(second, first))


# -- Starcoder2: biases everywhere, GELU-tanh c_fc / c_proj, GQA, a sliding window ------------------------------------

WINDOW = 4


class StarAttention(nn.Module):
    tiled = False  # the mistake: the K/V heads tiled by .repeat, not each repeated in place

    def __init__(self):
        super().__init__()
        self.q_proj, self.o_proj = nn.Linear(D, D), nn.Linear(D, D)
        self.k_proj, self.v_proj = nn.Linear(D, KV * HD), nn.Linear(D, KV * HD)

    def forward(self, x):
        B, T, _ = x.shape
        q = _rope(self.q_proj(x).view(B, T, H, HD).transpose(1, 2), base=1e5)
        k = _rope(self.k_proj(x).view(B, T, KV, HD).transpose(1, 2), base=1e5)
        v = self.v_proj(x).view(B, T, KV, HD).transpose(1, 2)
        if self.tiled:
            k, v = k.repeat(1, H // KV, 1, 1), v.repeat(1, H // KV, 1, 1)
        else:
            k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        gap = torch.arange(T)[:, None] - torch.arange(T)[None]  # query - key
        keep = (gap >= 0) & (gap < WINDOW)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, D))


class TiledStarAttention(StarAttention):
    tiled = True


class StarMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc, self.c_proj = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class StarLayer(nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.input_layernorm, self.self_attn = nn.LayerNorm(D), attention()
        self.post_attention_layernorm, self.mlp = nn.LayerNorm(D), StarMLP()

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class StarModel(nn.Module):
    def __init__(self, second):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([StarLayer(StarAttention), StarLayer(second)])
        self.norm = nn.LayerNorm(D)


class Starcoder2(nn.Module):
    def __init__(self, second):
        super().__init__()
        self.model = StarModel(second)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, input_ids):
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(self.model.norm(x))


def starcoder2(second=StarAttention) -> Starcoder2:
    torch.manual_seed(0)
    return _jitter(Starcoder2(second))


# -- RoBERTa: positions from padding_idx + 1 by a cumsum, post-LN, one token type --------------------------------------


class BertishLayer(nn.Module):
    """BERT's post-LN layer: query / key / value / dense, a (B, T) keep-mask of the keys, GELU."""

    def __init__(self):
        super().__init__()
        self.query, self.key, self.value, self.dense = (nn.Linear(D, D) for _ in range(4))
        self.attention_norm, self.output_norm = nn.LayerNorm(D, eps=1e-5), nn.LayerNorm(D, eps=1e-5)
        self.intermediate, self.output = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x, keep):
        B, T, _ = x.shape
        q, k, v = (p(x).view(B, T, H, HD).transpose(1, 2) for p in (self.query, self.key, self.value))
        scores = (q @ k.transpose(-1, -2) / math.sqrt(HD)).masked_fill(~keep[:, None, None, :], float("-inf"))
        x = self.attention_norm(x + self.dense((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D)))
        return self.output_norm(x + self.output(F.gelu(self.intermediate(x))))


class RobertaEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.word_embeddings = nn.Embedding(V, D, padding_idx=PAD)
        self.position_embeddings = nn.Embedding(T_MAX + PAD + 1, D, padding_idx=PAD)
        self.token_type_embeddings = nn.Embedding(1, D)  # one type: a constant row added everywhere
        self.embeddings_norm = nn.LayerNorm(D, eps=1e-5)
        self.layer = nn.ModuleList([BertishLayer() for _ in range(2)])

    def forward(self, input_ids, attention_mask=None):
        real = (input_ids != PAD).long()
        positions = torch.cumsum(real, dim=1) * real + PAD  # real tokens at PAD + 1, PAD + 2, ...; padding at PAD
        keep = (real if attention_mask is None else attention_mask).bool()
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        x = self.embeddings_norm(x + self.token_type_embeddings(torch.zeros_like(input_ids)))
        for layer in self.layer:
            x = layer(x, keep)
        return x


def roberta() -> RobertaEncoder:
    torch.manual_seed(0)
    return _jitter(RobertaEncoder())


# -- DistilBERT: q_lin / k_lin / v_lin / out_lin, sa_layer_norm / output_layer_norm, no token types -------------------


class DistilAttention(nn.Module):
    always_drop = False  # the mistake: F.dropout's training left at its default True

    def __init__(self):
        super().__init__()
        self.q_lin, self.k_lin, self.v_lin, self.out_lin = (nn.Linear(D, D) for _ in range(4))

    def forward(self, x, mask):
        B, T, _ = x.shape
        q, k, v = (p(x).view(B, T, H, HD).transpose(1, 2) for p in (self.q_lin, self.k_lin, self.v_lin))
        scores = (q / math.sqrt(HD)) @ k.transpose(-1, -2)
        scores = scores.masked_fill((mask == 0)[:, None, None, :], torch.finfo(scores.dtype).min)
        weights = F.dropout(scores.softmax(-1), p=0.1, training=True if self.always_drop else self.training)
        return self.out_lin((weights @ v).transpose(1, 2).reshape(B, T, D))


class AlwaysDropping(DistilAttention):
    always_drop = True


class DistilLayer(nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.attention, self.sa_layer_norm = attention(), nn.LayerNorm(D, eps=1e-12)
        self.lin1, self.lin2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.output_layer_norm = nn.LayerNorm(D, eps=1e-12)

    def forward(self, x, mask):
        x = self.sa_layer_norm(x + self.attention(x, mask))
        return self.output_layer_norm(x + self.lin2(F.gelu(self.lin1(x))))


class DistilTransformer(nn.Module):
    def __init__(self, second):
        super().__init__()
        self.layer = nn.ModuleList([DistilLayer(DistilAttention), DistilLayer(second)])


class DistilEmbeddings(nn.Module):
    def __init__(self):
        super().__init__()
        self.word_embeddings, self.position_embeddings = nn.Embedding(V, D), nn.Embedding(T_MAX, D)
        self.LayerNorm = nn.LayerNorm(D, eps=1e-12)

    def forward(self, input_ids):
        return self.LayerNorm(self.word_embeddings(input_ids) + self.position_embeddings.weight[: input_ids.shape[1]])


class DistilEncoder(nn.Module):
    def __init__(self, second):
        super().__init__()
        self.embeddings, self.transformer = DistilEmbeddings(), DistilTransformer(second)

    def forward(self, input_ids, attention_mask=None):
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        x = self.embeddings(input_ids)
        for layer in self.transformer.layer:
            x = layer(x, mask)
        return x


def distilbert(second=DistilAttention) -> DistilEncoder:
    torch.manual_seed(0)
    return _jitter(DistilEncoder(second))


# -- DeBERTa: disentangled attention (content-to-position, position-to-content) --------------------------------------

SPAN = 4  # relative distances clamped to [-SPAN, SPAN - 1]: a table of 2 * SPAN rows


class DisentangledAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.query_proj, self.key_proj, self.value_proj, self.dense = (nn.Linear(D, D) for _ in range(4))
        self.rel = nn.Parameter(torch.randn(2 * SPAN, D) * 0.5)  # the relative-position table, this layer's own

    def forward(self, x, keep):
        B, T, _ = x.shape
        q, k, v = (p(x).view(B, T, H, HD).transpose(1, 2) for p in (self.query_proj, self.key_proj, self.value_proj))
        rel_q, rel_k = (p(self.rel).view(2 * SPAN, H, HD).transpose(0, 1) for p in (self.query_proj, self.key_proj))
        index = ((torch.arange(T)[:, None] - torch.arange(T)[None]).clamp(-SPAN, SPAN - 1) + SPAN).expand(B, H, T, T)
        c2p = torch.gather(q @ rel_k.transpose(-1, -2)[None], -1, index)  # query i with the key's distance i - j
        p2c = torch.gather(k @ rel_q.transpose(-1, -2)[None], -1, index).transpose(-1, -2)  # key j with j - i
        scores = (q @ k.transpose(-1, -2) + c2p + p2c) / math.sqrt(3 * HD)
        weights = scores.masked_fill(~keep[:, None, None, :], torch.finfo(x.dtype).min).softmax(-1)
        return self.dense((weights @ v).transpose(1, 2).reshape(B, T, D))


class DebertaLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention, self.attention_norm = DisentangledAttention(), nn.LayerNorm(D, eps=1e-7)
        self.intermediate, self.output = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.output_norm = nn.LayerNorm(D, eps=1e-7)

    def forward(self, x, keep):
        x = self.attention_norm(x + self.attention(x, keep))
        return self.output_norm(x + self.output(F.gelu(self.intermediate(x))))


class DebertaStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.ModuleList([DebertaLayer() for _ in range(2)])


class DebertaEncoder(nn.Module):
    """No absolute positions: the relative terms carry them (DeBERTa-v2's position_biased_input False)."""

    def __init__(self):
        super().__init__()
        self.word_embeddings, self.embeddings_norm = nn.Embedding(V, D), nn.LayerNorm(D, eps=1e-7)
        self.encoder = DebertaStack()

    def forward(self, input_ids, attention_mask=None):
        keep = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        x = self.embeddings_norm(self.word_embeddings(input_ids))
        for layer in self.encoder.layer:
            x = layer(x, keep)
        return x


def deberta() -> DebertaEncoder:
    torch.manual_seed(0)
    return _jitter(DebertaEncoder())


CASES = [
    ("falcon_hand", falcon, "transformer_lm", {}, "pass"),
    (
        "falcon_hand.rope_applied_to_v_second_block",
        lambda: falcon(rope_on_values_second=True),
        "transformer_lm",
        {},
        ("mistake", "rope.applied_to_v", "h.1.self_attention"),
    ),
    ("bloom_hand", bloom, "transformer_lm", {}, "pass"),
    ("bloom_hand.positional_given", bloom, "transformer_lm", {"positional": "alibi"}, "pass"),
    ("hand_softmax_gpt", hand_softmax_gpt, "transformer_lm", {}, "pass"),
    ("hand_softmax_gpt.alibi", lambda: hand_softmax_gpt("alibi"), "transformer_lm", {}, "pass"),
    (
        "hand_softmax_gpt.relative_table",
        lambda: hand_softmax_gpt("table"),
        "transformer_lm",
        {},
        ("no pair", "h.0.attn", "a bias of the relative position alone"),
    ),
    ("alibi_bert", alibi_bert, "encoder_model", {}, "pass"),
    (
        "alibi_bert.quarter_slopes",
        lambda: alibi_bert(factor=0.25),
        "encoder_model",
        {},
        ("no pair", "layer.0", "ALiBi's bias (a per-head slope, 0.0625 for the first head, times -|key - query|)"),
    ),
    (
        "alibi_bert.signed_both_sides",
        lambda: alibi_bert("signed"),
        "encoder_model",
        {},
        ("no pair", "layer.0", "times key - query on both sides: the reference's times -|key - query|"),
    ),
    ("opt_hand", opt, "transformer_lm", {}, "pass"),
    (
        "opt_hand.scaled_by_model_width_second_block",
        lambda: opt(second_scaling=D**-0.5),
        "transformer_lm",
        {},
        ("mistake", "attention.wrong_scale", "decoder.layers.1.self_attn"),
    ),
    ("stablelm_hand", stablelm, "transformer_lm", {}, "pass"),
    ("stablelm_hand.one_rotary_pair", lambda: stablelm(FourHeads, first=FourHeads), "transformer_lm", {}, "pass"),
    (
        "stablelm_hand.one_rotary_pair.rotary_dim_given",
        lambda: stablelm(FourHeads, first=FourHeads),
        "transformer_lm",
        {"rotary_dim": 2},
        "pass",
    ),
    (
        "stablelm_hand.softmax_wrong_axis_second_block",
        lambda: stablelm(OverQueries),
        "transformer_lm",
        {},
        ("mistake", "attention.softmax_wrong_axis", "layers.1.self_attn"),
    ),
    ("starcoder2_hand", starcoder2, "transformer_lm", {}, "pass"),
    (
        "starcoder2_hand.kv_heads_tiled_second_block",
        lambda: starcoder2(TiledStarAttention),
        "transformer_lm",
        {},
        ("mistake", "attention.kv_heads_tiled", "model.layers.1.self_attn"),
    ),
    ("roberta_hand", roberta, "encoder_model", {}, "pass"),
    ("distilbert_hand", distilbert, "encoder_model", {}, "pass"),
    (
        "distilbert_hand.dropout_active_in_eval_second_layer",
        lambda: distilbert(AlwaysDropping),
        "encoder_model",
        {},
        ("mistake", "dropout.active_in_eval", "transformer.layer.1.attention"),
    ),
    ("deberta_hand", deberta, "encoder_model", {}, ("no pair", "encoder.layer.0.attention", "scores")),
]
