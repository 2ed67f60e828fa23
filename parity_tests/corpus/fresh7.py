"""Attention as performance-minded code, 2025-26 tutorials and course assignments write it (issue 46, round 4), in
this project's own words: the judge meets these styles here for the first time (measured, not fixed, this round).

- a GPT whose attention runs over key chunks with an online softmax written by hand (a running maximum and sum,
  the accumulator rescaled as each chunk arrives: FlashAttention's math in plain PyTorch, equal math);
- a GPT whose attention runs over query chunks (memory-efficient attention: each chunk of queries sees all keys);
- a GPT with its heads folded into the batch, (B * H, T, Dh), scores by `torch.baddbmm` on an empty tensor with
  beta 0 and the scale as alpha, the softmax taken with `dtype=torch.float32` and cast back;
- a GPT calling `F.scaled_dot_product_attention(..., scale=...)` with the scale given;
- a GPT whose attention is split over the keys and merged by log-sum-exp (FlashDecoding's split-K), and one whose
  attention is a one-head function lifted over the batch and the heads by `torch.vmap`;
- a nanochat-style GPT: rotary, q and k normed by `F.rms_norm` without a weight, the stream normed the same way,
  ReLU squared, an untied head, no biases anywhere (math the reference lacks: said where it first runs);
- a Flax/JAX port: every weight a raw nn.Parameter in an nn.ParameterDict, einsum with 'BTNH' letters;
- a course-assignment MultiHeadAttention: per-head nn.Linear lists for q, k and v, a (T, T) mask of 0/1 integers
  passed in by the model, `masked_fill(mask == 0, -inf)`;
- a GPT whose token table is `nn.Embedding(..., max_norm=1.0)` (its rows renormalised in the forward);
- mistakes put into them, each named where it sits: the online softmax's causal test letting the next key in, the
  query-chunked attention's scores divided by d_head, the folded attention's softmax over the queries, SDPA given
  scale=1/d_head, the split-K attention left without its causal mask, the Flax port's K/V heads tiled, the course
  model's mask read transposed (each query sees itself and the future).

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

D, H, KV, V, T_MAX = 32, 4, 2, 26, 32
HD = D // H


def _heads(x, n=H):
    return x.unflatten(-1, (n, HD)).transpose(1, 2)  # (B, T, n * HD) -> (B, n, T, HD)


def _merge(y):
    return y.transpose(1, 2).flatten(-2)  # (B, H, T, HD) -> (B, T, D)


class Attention(nn.Module):
    """q, k, v and the output projection; `attend` (B, H, T, HD) x3 -> (B, H, T, HD) is what each style writes."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(D, D)
        self.k = nn.Linear(D, D)
        self.v = nn.Linear(D, D)
        self.o = nn.Linear(D, D)

    def forward(self, x):
        return self.o(_merge(self.attend(_heads(self.q(x)), _heads(self.k(x)), _heads(self.v(x)))))


class OnlineSoftmax(Attention):
    """Keys in chunks; m the running row maximum, s the running sum, acc the unnormalised output."""

    chunk, shown = 5, 0  # shown: how many keys past the query the causal test lets in (0: none)

    def attend(self, q, k, v):
        T = q.shape[-2]
        m = torch.full(q.shape[:-1] + (1,), float("-inf"), dtype=q.dtype)
        s = torch.zeros_like(m)
        acc = torch.zeros_like(q)
        rows = torch.arange(T)[:, None]
        for start in range(0, T, self.chunk):
            kc, vc = k[..., start : start + self.chunk, :], v[..., start : start + self.chunk, :]
            scores = q @ kc.transpose(-2, -1) / math.sqrt(HD)
            cols = torch.arange(start, start + kc.shape[-2])[None, :]
            scores = scores.masked_fill(cols > rows + self.shown, float("-inf"))
            m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
            p = torch.exp(scores - m_new)
            correction = torch.exp(m - m_new)
            s = s * correction + p.sum(-1, keepdim=True)
            acc = acc * correction + p @ vc
            m = m_new
        return acc / s


class OnlineSoftmaxShowsNext(OnlineSoftmax):
    shown = 1


class QueryChunks(Attention):
    chunk, divisor = 6, math.sqrt(HD)

    def attend(self, q, k, v):
        T = q.shape[-2]
        out = []
        for start in range(0, T, self.chunk):
            qc = q[..., start : start + self.chunk, :]
            scores = qc @ k.transpose(-2, -1) / self.divisor
            rows = torch.arange(start, start + qc.shape[-2])[:, None]
            scores = scores.masked_fill(torch.arange(T)[None, :] > rows, float("-inf"))
            out.append(scores.softmax(-1) @ v)
        return torch.cat(out, dim=-2)


class QueryChunksByDHead(QueryChunks):
    divisor = HD


class FoldedHeads(Attention):
    """Heads folded into the batch: (B * H, T, HD), the scores by baddbmm with beta 0."""

    axis = -1

    def attend(self, q, k, v):
        B, _, T, _ = q.shape
        q, k, v = (t.reshape(B * H, T, HD) for t in (q, k, v))
        empty = torch.empty(B * H, T, T, dtype=q.dtype)
        scores = torch.baddbmm(empty, q, k.transpose(1, 2), beta=0.0, alpha=1 / math.sqrt(HD))
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
        probs = F.softmax(scores, dim=self.axis, dtype=torch.float32).to(v.dtype)
        return torch.bmm(probs, v).reshape(B, H, T, HD)


class FoldedHeadsSoftmaxOverQueries(FoldedHeads):
    axis = -2


class ScaledSDPA(Attention):
    scale = 1 / math.sqrt(HD)

    def attend(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)


class ScaledSDPAByDHead(ScaledSDPA):
    scale = 1 / HD


class LogSumExpMerge(Attention):
    """Split-K (FlashDecoding's merge): each half of the keys attended alone, its output and log-sum-exp kept, the
    halves merged by their share of the whole row's exp-sum."""

    causal = True

    def attend(self, q, k, v):
        T = q.shape[-2]
        rows, cut = torch.arange(T)[:, None], (T + 1) // 2
        outs, lses = [], []
        for start, stop in ((0, cut), (cut, T)):
            scores = q @ k[..., start:stop, :].transpose(-2, -1) * HD**-0.5
            if self.causal:
                scores = scores.masked_fill(torch.arange(start, stop)[None, :] > rows, float("-inf"))
            lse = torch.logsumexp(scores, dim=-1, keepdim=True)  # -inf where a row sees none of these keys
            outs.append(torch.nan_to_num(torch.exp(scores - lse)) @ v[..., start:stop, :])
            lses.append(lse)
        total = torch.logsumexp(torch.cat(lses, dim=-1), dim=-1, keepdim=True)
        return sum(torch.exp(lse - total) * out for lse, out in zip(lses, outs, strict=True))


class LogSumExpMergeNotCausal(LogSumExpMerge):
    causal = False


def _one_head(q, k, v):
    """One head's causal attention, (T, HD) x3 -> (T, HD); torch.vmap lifts it over the batch and the heads."""
    scores = q @ k.T / math.sqrt(q.shape[-1])
    T = q.shape[0]
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


class VmappedHeads(Attention):
    def attend(self, q, k, v):
        return torch.vmap(torch.vmap(_one_head))(q, k, v)


class Block(nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.ln_1 = nn.LayerNorm(D)
        self.attn = attention()
        self.ln_2 = nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, first, second, max_norm=None):
        super().__init__()
        self.wte = nn.Embedding(V, D, max_norm=max_norm)
        self.wpe = nn.Embedding(T_MAX, D)
        self.blocks = nn.ModuleList([Block(first), Block(second)])
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt(first, second=None, max_norm=None) -> GPT:
    torch.manual_seed(0)
    return GPT(first, second or first, max_norm)


# -- nanochat style: rotary, weightless F.rms_norm on the stream and on q and k, ReLU squared, untied, no biases -----


def norm(x):
    return F.rms_norm(x, (x.shape[-1],))


def rotate(x, cos, sin):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((a * cos + b * sin, b * cos - a * sin), dim=-1)


class ChatAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_q = nn.Linear(D, D, bias=False)
        self.c_k = nn.Linear(D, KV * HD, bias=False)
        self.c_v = nn.Linear(D, KV * HD, bias=False)
        self.c_proj = nn.Linear(D, D, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.c_q(x).view(B, T, H, HD)
        k = self.c_k(x).view(B, T, KV, HD)
        v = self.c_v(x).view(B, T, KV, HD)
        q, k = norm(rotate(q, cos, sin)), norm(rotate(k, cos, sin))
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, D))


class ChatMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(D, 4 * D, bias=False)
        self.c_proj = nn.Linear(4 * D, D, bias=False)

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)).square())


class ChatBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = ChatAttention()
        self.mlp = ChatMLP()

    def forward(self, x, cos, sin):
        x = x + self.attn(norm(x), cos, sin)
        return x + self.mlp(norm(x))


class ChatGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(V, D)
        self.h = nn.ModuleList([ChatBlock(), ChatBlock()])
        self.lm_head = nn.Linear(D, V, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, HD, 2, dtype=torch.float32) / HD))
        angles = torch.outer(torch.arange(T_MAX, dtype=torch.float32), inv)
        self.register_buffer("cos", angles.cos()[None, :, None, :], persistent=False)  # (1, T, 1, HD / 2)
        self.register_buffer("sin", angles.sin()[None, :, None, :], persistent=False)

    def forward(self, idx):
        T = idx.shape[1]
        cos, sin = self.cos[:, :T], self.sin[:, :T]
        x = norm(self.wte(idx))
        for block in self.h:
            x = block(x, cos, sin)
        return self.lm_head(norm(x))


def nanochat_gpt() -> ChatGPT:
    torch.manual_seed(0)
    return ChatGPT()


# -- a Flax/JAX port: raw parameters in an nn.ParameterDict, einsum with 'BTNH' letters, GQA ------------------------


class FlaxBlock(nn.Module):
    tiled = False

    def __init__(self):
        super().__init__()
        p = {
            "ln1_scale": torch.ones(D), "ln1_bias": torch.zeros(D), "ln2_scale": torch.ones(D),
            "ln2_bias": torch.zeros(D), "q_kernel": torch.randn(D, H, HD) / math.sqrt(D),
            "k_kernel": torch.randn(D, KV, HD) / math.sqrt(D), "v_kernel": torch.randn(D, KV, HD) / math.sqrt(D),
            "out_kernel": torch.randn(H, HD, D) / math.sqrt(D), "up_kernel": torch.randn(D, 4 * D) / math.sqrt(D),
            "up_bias": torch.zeros(4 * D), "down_kernel": torch.randn(4 * D, D) / math.sqrt(4 * D),
            "down_bias": torch.zeros(D),
        }  # fmt: skip
        self.params = nn.ParameterDict({name: nn.Parameter(value) for name, value in p.items()})

    def forward(self, x):
        p = self.params
        h = F.layer_norm(x, (D,), p["ln1_scale"], p["ln1_bias"])
        q = torch.einsum("BTD,DNH->BTNH", h, p["q_kernel"])
        k = torch.einsum("BTD,DKH->BTKH", h, p["k_kernel"])
        v = torch.einsum("BTD,DKH->BTKH", h, p["v_kernel"])
        if self.tiled:
            k, v = k.repeat(1, 1, H // KV, 1), v.repeat(1, 1, H // KV, 1)
        else:
            k, v = k.repeat_interleave(H // KV, dim=2), v.repeat_interleave(H // KV, dim=2)
        logits = torch.einsum("BTNH,BSNH->BNTS", q, k) / math.sqrt(HD)
        T = x.shape[1]
        logits = torch.where(torch.tril(torch.ones(T, T, dtype=torch.bool)), logits, -1e30)
        weights = torch.softmax(logits, dim=-1)
        y = torch.einsum("BNTS,BSNH->BTNH", weights, v)
        x = x + torch.einsum("BTNH,NHD->BTD", y, p["out_kernel"])
        h = F.layer_norm(x, (D,), p["ln2_scale"], p["ln2_bias"])
        h = F.gelu(h @ p["up_kernel"] + p["up_bias"], approximate="tanh")
        return x + h @ p["down_kernel"] + p["down_bias"]


class FlaxBlockTiled(FlaxBlock):
    tiled = True


class FlaxGPT(nn.Module):
    def __init__(self, second):
        super().__init__()
        self.embedding = nn.ParameterDict(
            {"tokens": nn.Parameter(torch.randn(V, D)), "positions": nn.Parameter(0.02 * torch.randn(T_MAX, D))}
        )
        self.layers = nn.ModuleList([FlaxBlock(), second()])
        self.final = nn.ParameterDict({"scale": nn.Parameter(torch.ones(D)), "bias": nn.Parameter(torch.zeros(D))})

    def forward(self, tokens):
        x = self.embedding["tokens"][tokens] + self.embedding["positions"][: tokens.shape[1]]
        for layer in self.layers:
            x = layer(x)
        x = F.layer_norm(x, (D,), self.final["scale"], self.final["bias"])
        return torch.einsum("BTD,VD->BTV", x, self.embedding["tokens"])


def flax_gpt(second=FlaxBlock) -> FlaxGPT:
    torch.manual_seed(0)
    return FlaxGPT(second)


# -- a course assignment: per-head nn.Linear lists, a (T, T) mask of 0/1 ints passed in --------------------------


class MultiHeadAttention(nn.Module):
    def __init__(self, inverted=False):
        super().__init__()
        self.W_q = nn.ModuleList([nn.Linear(D, HD) for _ in range(H)])
        self.W_k = nn.ModuleList([nn.Linear(D, HD) for _ in range(H)])
        self.W_v = nn.ModuleList([nn.Linear(D, HD) for _ in range(H)])
        self.W_o = nn.Linear(D, D)
        self.inverted = inverted

    def forward(self, x, mask):
        heads = []
        for W_q, W_k, W_v in zip(self.W_q, self.W_k, self.W_v, strict=True):
            scores = torch.matmul(W_q(x), W_k(x).transpose(-2, -1)) / math.sqrt(HD)
            hidden = (mask.T if self.inverted else mask) == 0  # inverted: the mask read transposed
            heads.append(torch.matmul(torch.softmax(scores.masked_fill(hidden, float("-inf")), -1), W_v(x)))
        return self.W_o(torch.cat(heads, dim=-1))


class CourseBlock(nn.Module):
    def __init__(self, inverted=False):
        super().__init__()
        self.mha = MultiHeadAttention(inverted)
        self.norm1 = nn.LayerNorm(D)
        self.ffn = nn.Sequential(nn.Linear(D, 4 * D), nn.ReLU(), nn.Linear(4 * D, D))
        self.norm2 = nn.LayerNorm(D)

    def forward(self, x, mask):
        x = self.norm1(x + self.mha(x, mask))  # post-norm, as the assignment's figure draws it
        return self.norm2(x + self.ffn(x))


class CourseLM(nn.Module):
    def __init__(self, inverted=False):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.pos = nn.Embedding(T_MAX, D)
        self.layers = nn.ModuleList([CourseBlock(), CourseBlock(inverted)])
        self.out = nn.Linear(D, V)

    def forward(self, x):
        T = x.shape[1]
        mask = torch.tril(torch.ones(T, T, dtype=torch.int64))  # 1: may attend
        h = self.embed(x) + self.pos(torch.arange(T))
        for layer in self.layers:
            h = layer(h, mask)
        return self.out(h)


def course_lm(inverted=False) -> CourseLM:
    torch.manual_seed(0)
    return CourseLM(inverted)


CASES = [
    ("online_softmax_gpt", lambda: gpt(OnlineSoftmax), "transformer_lm", {}, "pass"),
    (
        "online_softmax_gpt.causal_shows_next_second_block",
        lambda: gpt(OnlineSoftmax, OnlineSoftmaxShowsNext),
        "transformer_lm",
        {},
        ("mistake", "attention.causal_shows_next", "blocks.1.attn"),
    ),
    ("query_chunk_gpt", lambda: gpt(QueryChunks), "transformer_lm", {}, "pass"),
    (
        "query_chunk_gpt.wrong_scale_second_block",
        lambda: gpt(QueryChunks, QueryChunksByDHead),
        "transformer_lm",
        {},
        ("mistake", "attention.wrong_scale", "blocks.1.attn"),
    ),
    ("folded_heads_gpt", lambda: gpt(FoldedHeads), "transformer_lm", {}, "pass"),
    (
        "folded_heads_gpt.softmax_wrong_axis_second_block",
        lambda: gpt(FoldedHeads, FoldedHeadsSoftmaxOverQueries),
        "transformer_lm",
        {},
        ("mistake", "attention.softmax_wrong_axis", "blocks.1.attn"),
    ),
    ("scaled_sdpa_gpt", lambda: gpt(ScaledSDPA), "transformer_lm", {}, "pass"),
    (
        "scaled_sdpa_gpt.wrong_scale_second_block",
        lambda: gpt(ScaledSDPA, ScaledSDPAByDHead),
        "transformer_lm",
        {},
        ("mistake", "attention.wrong_scale", "blocks.1.attn"),
    ),
    ("lse_merge_gpt", lambda: gpt(LogSumExpMerge), "transformer_lm", {}, "pass"),
    (
        "lse_merge_gpt.not_causal_second_block",
        lambda: gpt(LogSumExpMerge, LogSumExpMergeNotCausal),
        "transformer_lm",
        {},
        ("mistake", "attention.not_causal", "blocks.1.attn"),
    ),
    ("vmap_heads_gpt", lambda: gpt(VmappedHeads), "transformer_lm", {}, "pass"),
    (
        "nanochat_gpt",
        nanochat_gpt,
        "transformer_lm",
        {},
        ("no pair", "", "rms_norm(x) normalises without a weight"),
    ),
    ("flax_gpt", flax_gpt, "transformer_lm", {}, "pass"),
    (
        "flax_gpt.kv_heads_tiled_second_block",
        lambda: flax_gpt(FlaxBlockTiled),
        "transformer_lm",
        {},
        ("mistake", "attention.kv_heads_tiled", "layers.1"),
    ),
    ("course_lm", course_lm, "transformer_lm", {}, "pass"),
    (
        "course_lm.mask_inverted_second_block",
        lambda: course_lm(inverted=True),
        "transformer_lm",
        {},
        ("mistake", "attention.mask_inverted", "layers.1.mha"),
    ),
    (
        "max_norm_gpt",
        lambda: gpt(ScaledSDPA, max_norm=1.0),
        "transformer_lm",
        {},
        ("no pair", "wte", "max_norm"),
    ),
]
