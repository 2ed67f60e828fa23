"""The models people study in 2026, written by hand the way a course or a blog writes them (issue 46, round 6), in
this project's own words, each in a coding style of its own. The judge meets them here first (measured with the
judge frozen: what it said when it first met each is in parity_tests/test_unseen.py's TODAY).

- Gemma 2 as helper functions: one fused qkv Linear of grouped-query sizes split by `.split`, einsum scores, a
  `softcap(x, cap)` function on the scores (50) and the logits (30), a functional RMSNorm of gain `1 + w`, sandwich
  norms, a local layer (a band of 3 keys) then a global one, a GeGLU of tanh GELU, embeddings times sqrt(d) and the
  table read back as the output projection;
- GPT-OSS by hand: biases on every projection, the sinks joined by log-sum-exp (`logaddexp(logsumexp(s), sink)`,
  then `exp(s - lse)`: never a concatenated column), a sliding layer then a full one, and a mixture of experts whose
  router (with a bias) keeps the top 2 logits and softmaxes those, each token's experts' weights GATHERED from
  stacked (E, D, 2F) parameters (gate and up interleaved), the clamped SwiGLU `(up + 1) * gate * sigmoid(1.702
  gate)` with its limit 7; and the same attention over a plain SwiGLU (no router);
- Qwen3-MoE by hand: per-head q and k RMSNorms, RoPE at 1e6, a router softmax over all experts, the top 2 kept and
  renormalised, a loop over an nn.ModuleList of SwiGLU experts adding their rows back by `index_add_`;
- a Llama 3.1 of Meta's names whose rotary tables come from a `precompute_rope` function applying the "llama3"
  frequency rule by hand (low frequencies divided by 8, high ones kept, a blend between), turned on interleaved
  pairs in real arithmetic, checked with its scaling given (rope_scaling=, rope_theta=);
- a ModernBERT-ish encoder: one fused Wqkv, no biases, LayerNorms written out with a weight only, no norm before the
  first layer's attention, a global layer (RoPE base 160000) then a local one (|i - j| <= 2, base 10000) handed to
  SDPA as an additive finfo.min mask with the padding, a GeGLU of exact GELU, a final norm;
- a ViT patchified by `F.unfold` and a Linear (no convolution), a [CLS] parameter, a learned (1, 1 + N, D) table,
  a fused qkv by matmul, the classifier on the class token;
- a CLIP vision tower in OpenAI's repository's style: `conv1` without bias, `class_embedding` (D,),
  `positional_embedding`, `ln_pre`, `transformer.resblocks` of nn.MultiheadAttention run sequence-first (the
  permute to (N, B, D) and back), QuickGELU, `ln_post` on the class token, `@ proj`;
- a Phi-2-style LM: one fused qkv Linear with bias, rotary on the first half of each head (partial_rotary_factor
  0.5, halves; its tables made in the forward, or by a rotary module keeping inv_freq), a parallel block of one
  LayerNorm, a tanh-GELU MLP, a final LayerNorm and a head with a bias, SDPA given a boolean keep-mask by `tril`;
- a Whisper audio encoder in OpenAI's repository's style (conv1, conv2 of stride 2, GELU, a `sinusoids` buffer of
  sines then cosines, blocks of attn / attn_ln / mlp / mlp_ln with a bias-free key and the scale split between q and
  k, ln_post): no level of the judge's takes mel frames, but the reference has every part of it (audio.py's front
  end and sinusoids, pre-norm encoder layers, a final norm), so it is judged as check/towers.py reads a ViT, and
  passes (first expected: could not judge, naming its front end);
- mistakes put into them, each in the second block and named where it sits: Gemma 2's attention cap without the
  division and its GELU on the up projection, GPT-OSS's sink left out of the log-sum-exp (with and without
  experts), Qwen3-MoE's scores as K Q^T, Llama 3.1's mask put on after the softmax, ModernBERT's second MLP norm of
  unbiased variance, the ViT's scores divided by sqrt(d_model), the CLIP tower's QuickGELU constant mistyped,
  Phi-2's causal mask letting the next token in; Qwen3-MoE's silu on the up projection of one expert (expert 2 of
  the second layer; expert 3 of a model whose own router never picks it, so its recorded forward never runs it).

First met: 3 of 21 right (Gemma 2, its cap mistake, the Phi with a rotary module). Wrong then: both mixtures of
experts (said as a top-k the reference has no pair for, their attention mistakes never reached), GPT-OSS's sinks by
log-sum-exp (unread), Gemma 2's GELU on the up projection of a layer holding its MLP's Linears (not found), the
Llama 3.1 given rope_scaling= (refused: a RoPE field given before RoPE is read), the ModernBERT encoder (its local
band, local base and missing first attention norm unread: 'unexplained'), the unfold ViT and OpenAI's CLIP vision
tower (neither read by check/towers.py), the partial-rotary Phi (its rotary width, from tables made in the forward,
unread), the Whisper encoder (its Conv1d said to have no pair in the reference, which has it).

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from transformer_spec.config import RopeScaling

D, H, KV, HD, V, T_MAX = 32, 4, 2, 8, 26, 32
E, TOP, FF = 4, 2, 16  # experts, experts a token, an expert's width
WINDOW = 3
ROOT_HD = math.sqrt(HD)


def _angles(T, inv_freq):
    """(T, 2 R) angles of half-split RoPE: each frequency twice, the halves side by side."""
    angles = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    return torch.cat((angles, angles), dim=-1)


def _inv_freq(dim, theta):
    return 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def rotate_halves(x, cos, sin):
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), dim=-1) * sin


# -- Gemma 2 as helper functions --------------------------------------------------------------------------------------


def softcap(x, cap):
    return cap * torch.tanh(x / cap)


def gemma_rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


def keep_band(T, window=None):
    """True where query i may read key j: j <= i, and i - j < window when a window is given."""
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    keep = j <= i
    return keep & (i - j < window) if window else keep


class GemmaNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(D))

    def forward(self, x):
        return gemma_rms(x, self.weight)


class Gemma2Attention(nn.Module):
    def __init__(self, window, cap_divides=True):
        super().__init__()
        self.qkv = nn.Linear(D, (H + 2 * KV) * HD, bias=False)
        self.out = nn.Linear(H * HD, D, bias=False)
        self.window, self.cap_divides = window, cap_divides

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).split([H * HD, KV * HD, KV * HD], dim=-1)
        q = rotate_halves(q.view(B, T, H, HD), cos[:, None], sin[:, None])
        k = rotate_halves(k.view(B, T, KV, HD), cos[:, None], sin[:, None]).repeat_interleave(H // KV, dim=2)
        v = v.view(B, T, KV, HD).repeat_interleave(H // KV, dim=2)
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) * HD**-0.5
        s = softcap(s, 50.0) if self.cap_divides else 50.0 * torch.tanh(s)  # the mistake: tanh(s), not tanh(s / 50)
        p = s.masked_fill(~keep_band(T, self.window), float("-inf")).softmax(dim=-1)
        return self.out(torch.einsum("bhqk,bkhd->bqhd", p, v).reshape(B, T, H * HD))


class Gemma2Layer(nn.Module):
    def __init__(self, window, cap_divides=True, act_on_up=False):
        super().__init__()
        self.act_on_up = act_on_up  # the mistake: GELU on the up projection, the gate's taken as it is
        self.pre_attn, self.post_attn = GemmaNorm(), GemmaNorm()
        self.attn = Gemma2Attention(window, cap_divides)
        self.pre_ffw, self.post_ffw = GemmaNorm(), GemmaNorm()
        self.gate, self.up = nn.Linear(D, 64, bias=False), nn.Linear(D, 64, bias=False)
        self.down = nn.Linear(64, D, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.post_attn(self.attn(self.pre_attn(x), cos, sin))
        h = self.pre_ffw(x)
        gate, up = (self.up(h), self.gate(h)) if self.act_on_up else (self.gate(h), self.up(h))
        return x + self.post_ffw(self.down(F.gelu(gate, approximate="tanh") * up))


class Gemma2(nn.Module):
    def __init__(self, cap_divides_second=True, act_on_up_second=False):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.layers = nn.ModuleList([Gemma2Layer(WINDOW), Gemma2Layer(None, cap_divides_second, act_on_up_second)])
        self.final_norm = GemmaNorm()

    def forward(self, ids):
        x = self.embed(ids)
        x = x * torch.tensor(D**0.5, dtype=x.dtype)
        angles = _angles(ids.shape[1], _inv_freq(HD, 10000.0))
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return softcap(self.final_norm(x) @ self.embed.weight.T, 30.0)


def gemma2(cap_divides_second=True, act_on_up_second=False) -> Gemma2:
    torch.manual_seed(0)
    return Gemma2(cap_divides_second, act_on_up_second)


# -- GPT-OSS by hand: sinks by log-sum-exp, a gathered top-k mixture of experts ---------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim=D, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class SinkAttention(nn.Module):
    def __init__(self, window, sink_joins=True):
        super().__init__()
        self.q_proj, self.o_proj = nn.Linear(D, H * HD), nn.Linear(H * HD, D)
        self.k_proj, self.v_proj = nn.Linear(D, KV * HD), nn.Linear(D, KV * HD)
        self.sinks = nn.Parameter(torch.randn(H))
        self.window, self.sink_joins = window, sink_joins

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = rotate_halves(self.q_proj(x).view(B, T, H, HD).transpose(1, 2), cos, sin)
        k = rotate_halves(self.k_proj(x).view(B, T, KV, HD).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(B, T, KV, HD).transpose(1, 2)
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        s = (q @ k.transpose(-1, -2) / math.sqrt(HD)).masked_fill(~keep_band(T, self.window), float("-inf"))
        lse = torch.logsumexp(s, dim=-1, keepdim=True)
        if self.sink_joins:  # the sink's logit takes its share of the denominator (the mistake: left out)
            lse = torch.logaddexp(lse, self.sinks.view(1, H, 1, 1))
        y = torch.exp(s - lse) @ v
        return self.o_proj(y.transpose(1, 2).reshape(B, T, H * HD))


class GatheredExperts(nn.Module):
    """GPT-OSS's experts: stacked (in, out) weights, gate and up interleaved in the columns, biases."""

    alpha, limit = 1.702, 7.0

    def __init__(self):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(E, D, 2 * FF) / math.sqrt(D))
        self.gate_up_proj_bias = nn.Parameter(0.1 * torch.randn(E, 2 * FF))
        self.down_proj = nn.Parameter(torch.randn(E, FF, D) / math.sqrt(FF))
        self.down_proj_bias = nn.Parameter(0.1 * torch.randn(E, D))

    def forward(self, x, e):
        """x (N, D) rows, e (N,) the expert each row goes to: that expert's weights gathered per row."""
        h = torch.einsum("nd,ndf->nf", x, self.gate_up_proj[e]) + self.gate_up_proj_bias[e]
        gate, up = h[:, 0::2].clamp(max=self.limit), h[:, 1::2].clamp(-self.limit, self.limit)
        act = (up + 1) * gate * torch.sigmoid(self.alpha * gate)
        return torch.einsum("nf,nfd->nd", act, self.down_proj[e]) + self.down_proj_bias[e]


class OssMoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.router = nn.Linear(D, E)
        self.experts = GatheredExperts()

    def forward(self, x):
        rows = x.reshape(-1, D)
        top, chosen = self.router(rows).topk(TOP, dim=-1)
        gates = top.softmax(dim=-1)  # over the chosen experts only
        out = sum(gates[:, slot, None] * self.experts(rows, chosen[:, slot]) for slot in range(TOP))
        return out.view(x.shape)


class OssBlock(nn.Module):
    def __init__(self, window, sink_joins=True, dense=False):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(), RMSNorm()
        self.attn = SinkAttention(window, sink_joins)
        self.mlp = Expert() if dense else OssMoE()  # dense: one plain SwiGLU, the sinks judged without a router

    def forward(self, x, cos, sin):
        x = x + self.attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class GptOss(nn.Module):
    def __init__(self, sink_joins_second=True, dense=False):
        super().__init__()
        self.embedding = nn.Embedding(V, D)
        self.blocks = nn.ModuleList([OssBlock(WINDOW, dense=dense), OssBlock(None, sink_joins_second, dense)])
        self.norm = RMSNorm()
        self.unembedding = nn.Linear(D, V, bias=False)
        angles = _angles(T_MAX, _inv_freq(HD, 150000.0))
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, ids):
        T = ids.shape[1]
        x = self.embedding(ids)
        cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.unembedding(self.norm(x))


def gpt_oss(sink_joins_second=True, dense=False) -> GptOss:
    torch.manual_seed(0)
    return GptOss(sink_joins_second, dense)


# -- Qwen3-MoE by hand: per-head q/k norms, a loop over experts by index_add_ -----------------------------------------


class Expert(nn.Module):
    on_up = False  # the mistake: silu on the up projection (set on one expert)

    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(D, FF, bias=False), nn.Linear(D, FF, bias=False)
        self.down_proj = nn.Linear(FF, D, bias=False)

    def forward(self, x):
        if self.on_up:
            return self.down_proj(self.gate_proj(x) * F.silu(self.up_proj(x)))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoeBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(D, E, bias=False)
        self.experts = nn.ModuleList([Expert() for _ in range(E)])

    def forward(self, hidden):
        x = hidden.reshape(-1, D)
        weights, chosen = self.gate(x).softmax(dim=-1).topk(TOP, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)  # norm_topk_prob
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.where(chosen == e)
            if len(rows):
                out.index_add_(0, rows, expert(x[rows]) * weights[rows, slot, None])
        return out.view(hidden.shape)


class Qwen3Attention(nn.Module):
    def __init__(self, swapped=False):
        super().__init__()
        self.q_proj, self.o_proj = nn.Linear(D, H * HD, bias=False), nn.Linear(H * HD, D, bias=False)
        self.k_proj, self.v_proj = nn.Linear(D, KV * HD, bias=False), nn.Linear(D, KV * HD, bias=False)
        self.q_norm, self.k_norm = RMSNorm(HD), RMSNorm(HD)
        self.swapped = swapped

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = rotate_halves(self.q_norm(self.q_proj(x).view(B, T, H, HD)).transpose(1, 2), cos, sin)
        k = rotate_halves(self.k_norm(self.k_proj(x).view(B, T, KV, HD)).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(B, T, KV, HD).transpose(1, 2)
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        s = (k @ q.transpose(-1, -2)) if self.swapped else (q @ k.transpose(-1, -2))  # the mistake: K Q^T
        s = s * HD**-0.5 + torch.full((T, T), float("-inf")).triu(1).to(x.dtype)
        return self.o_proj((s.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, H * HD))


class Qwen3MoeLayer(nn.Module):
    def __init__(self, swapped=False):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(), RMSNorm()
        self.self_attn = Qwen3Attention(swapped)
        self.mlp = SparseMoeBlock()

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3Moe(nn.Module):
    def __init__(self, swapped_second=False):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([Qwen3MoeLayer(), Qwen3MoeLayer(swapped_second)])
        self.norm = RMSNorm()
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        angles = _angles(input_ids.shape[1], _inv_freq(HD, 1e6))
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def qwen3_moe(swapped_second=False, on_up: tuple = (), unchosen: int | None = None) -> Qwen3Moe:
    """`on_up`: (layer, expert) whose expert puts silu on its up projection; `unchosen`: an expert no token reaches
    (every embedding shifted by 20 along feature 0, which then dominates each normed stream, and that expert's router
    row lowered by 3 along it: its logit stays below the others', so top-2 of 4 never picks it)."""
    torch.manual_seed(0)
    model = Qwen3Moe(swapped_second)
    for layer, expert in [on_up] if on_up else []:
        model.layers[layer].mlp.experts[expert].on_up = True
    if unchosen is not None:
        with torch.no_grad():
            model.embed_tokens.weight[:, 0] += 20.0
            for layer in model.layers:
                layer.mlp.gate.weight[unchosen, 0] -= 3.0
    return model


# -- Llama 3.1: the "llama3" frequency rule in a precompute function, interleaved pairs ------------------------------

LLAMA3 = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=512)
THETA = 500000.0


def precompute_rope(head_dim, end, theta=THETA, factor=8.0, low=1.0, high=4.0, original=512):
    """cos and sin (end, head_dim / 2) of Llama 3.1's scaled frequencies."""
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    wavelen = 2 * math.pi / freqs
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * freqs / factor + smooth * freqs
    scaled = torch.where(wavelen < original / high, freqs, blended)
    scaled = torch.where(wavelen > original / low, freqs / factor, scaled)
    angles = torch.outer(torch.arange(end, dtype=torch.float64), scaled)
    return angles.cos(), angles.sin()


def rotate_pairs(x, cos, sin):
    """Turn features (2i, 2i + 1) by angle i, in real arithmetic (Meta's complex product written out)."""
    x0, x1 = x.unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


class Llama31Attention(nn.Module):
    def __init__(self, mask_after=False):
        super().__init__()
        self.wq, self.wo = nn.Linear(D, H * HD, bias=False), nn.Linear(H * HD, D, bias=False)
        self.wk, self.wv = nn.Linear(D, KV * HD, bias=False), nn.Linear(D, KV * HD, bias=False)
        self.mask_after = mask_after

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        xq = rotate_pairs(self.wq(x).view(B, T, H, HD), cos[:, None], sin[:, None]).transpose(1, 2)
        xk = rotate_pairs(self.wk(x).view(B, T, KV, HD), cos[:, None], sin[:, None]).transpose(1, 2)
        xv = self.wv(x).view(B, T, KV, HD).transpose(1, 2)
        xk, xv = xk.repeat_interleave(H // KV, dim=1), xv.repeat_interleave(H // KV, dim=1)
        scores = torch.matmul(xq, xk.transpose(2, 3)) / math.sqrt(HD)
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        if self.mask_after:  # the mistake: the future zeroed after the softmax, the rows not renormalised
            probs = scores.softmax(-1).masked_fill(future, 0.0)
        else:
            probs = scores.masked_fill(future, float("-inf")).softmax(-1)
        return self.wo(torch.matmul(probs, xv).transpose(1, 2).reshape(B, T, H * HD))


class Llama31Block(nn.Module):
    def __init__(self, mask_after=False):
        super().__init__()
        self.attention_norm, self.ffn_norm = RMSNorm(eps=1e-5), RMSNorm(eps=1e-5)
        self.attention = Llama31Attention(mask_after)
        self.w1, self.w3, self.w2 = (
            nn.Linear(D, 64, bias=False),
            nn.Linear(D, 64, bias=False),
            nn.Linear(64, D, bias=False),
        )

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        z = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(z)) * self.w3(z))


class Llama31(nn.Module):
    def __init__(self, mask_after_second=False):
        super().__init__()
        self.tok_embeddings = nn.Embedding(V, D)
        self.layers = nn.ModuleList([Llama31Block(), Llama31Block(mask_after_second)])
        self.norm = RMSNorm(eps=1e-5)
        self.output = nn.Linear(D, V, bias=False)
        cos, sin = precompute_rope(HD, T_MAX)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens):
        T = tokens.shape[1]
        h = self.tok_embeddings(tokens)
        cos, sin = self.rope_cos[:T].to(h.dtype), self.rope_sin[:T].to(h.dtype)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h))


def llama31(mask_after_second=False) -> Llama31:
    torch.manual_seed(0)
    return Llama31(mask_after_second)


LLAMA31_GIVEN = {"rope_theta": THETA, "rope_scaling": RopeScaling("llama3", **LLAMA3)}


# -- a ModernBERT-ish encoder: fused Wqkv, no biases, global then local, GeGLU ----------------------------------------


class WeightOnlyLayerNorm(nn.Module):
    def __init__(self, unbiased=False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(D))
        self.unbiased = unbiased  # the mistake: torch.var's default n - 1

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, unbiased=self.unbiased)
        return (x - mean) / torch.sqrt(var + 1e-5) * self.weight


class ModernAttention(nn.Module):
    def __init__(self, local):
        super().__init__()
        self.Wqkv = nn.Linear(D, 3 * D, bias=False)
        self.Wo = nn.Linear(D, D, bias=False)
        self.local = local

    def forward(self, x, keep):
        B, T, _ = x.shape
        q, k, v = self.Wqkv(x).view(B, T, 3, H, HD).permute(2, 0, 3, 1, 4)
        angles = _angles(T, _inv_freq(HD, 10000.0 if self.local else 160000.0))
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        q, k = rotate_halves(q, cos, sin), rotate_halves(k, cos, sin)
        allowed = keep[:, None, None, :]  # (B, 1, 1, T): padding keys hidden
        if self.local:  # ModernBERT's local_attention = 4: |i - j| <= 2
            i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
            allowed = allowed & ((i - j).abs() <= 2)
        bias = torch.zeros(allowed.shape, dtype=x.dtype).masked_fill(~allowed, torch.finfo(x.dtype).min)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.Wo(y.transpose(1, 2).reshape(B, T, D))


class ModernMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.Wi = nn.Linear(D, 2 * 48, bias=False)
        self.Wo = nn.Linear(48, D, bias=False)

    def forward(self, x):
        inp, gate = self.Wi(x).chunk(2, dim=-1)
        return self.Wo(F.gelu(inp) * gate)


class ModernLayer(nn.Module):
    def __init__(self, index, unbiased=False):
        super().__init__()
        self.attn_norm = nn.Identity() if index == 0 else WeightOnlyLayerNorm()
        self.attn = ModernAttention(local=index % 3 != 0)  # global_attn_every_n_layers = 3
        self.mlp_norm = WeightOnlyLayerNorm(unbiased)
        self.mlp = ModernMLP()

    def forward(self, x, keep):
        x = x + self.attn(self.attn_norm(x), keep)
        return x + self.mlp(self.mlp_norm(x))


class ModernEncoder(nn.Module):
    pad_id = 0

    def __init__(self, unbiased_second=False):
        super().__init__()
        self.tok_embeddings = nn.Embedding(V, D)
        self.embed_norm = WeightOnlyLayerNorm()
        self.layers = nn.ModuleList([ModernLayer(0), ModernLayer(1, unbiased_second)])
        self.final_norm = WeightOnlyLayerNorm()

    def forward(self, input_ids):
        keep = input_ids != self.pad_id
        x = self.embed_norm(self.tok_embeddings(input_ids))
        for layer in self.layers:
            x = layer(x, keep)
        return self.final_norm(x)


def modern_encoder(unbiased_second=False) -> ModernEncoder:
    torch.manual_seed(0)
    return ModernEncoder(unbiased_second)


# -- a ViT patchified by F.unfold and a Linear ------------------------------------------------------------------------


class UnfoldAttention(nn.Module):
    def __init__(self, divisor=ROOT_HD):
        super().__init__()
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.divisor = divisor

    def forward(self, x):
        B, N, _ = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, H, HD).permute(2, 0, 3, 1, 4)
        attn = (q @ k.transpose(-2, -1) / self.divisor).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B, N, D))


class UnfoldBlock(nn.Module):
    def __init__(self, divisor=ROOT_HD):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(D, eps=1e-6), UnfoldAttention(divisor)
        self.norm2 = nn.LayerNorm(D, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class UnfoldViT(nn.Module):
    def __init__(self, divisor_second=ROOT_HD, image=8, patch=4, classes=5):
        super().__init__()
        self.patch = patch
        self.patch_embed = nn.Linear(3 * patch * patch, D)
        self.cls_token = nn.Parameter(0.02 * torch.randn(1, 1, D))
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, 1 + (image // patch) ** 2, D))
        self.blocks = nn.ModuleList([UnfoldBlock(), UnfoldBlock(divisor_second)])
        self.norm = nn.LayerNorm(D, eps=1e-6)
        self.head = nn.Linear(D, classes)

    def forward(self, images):
        patches = F.unfold(images, kernel_size=self.patch, stride=self.patch).transpose(1, 2)  # (B, N, 3 p p)
        x = self.patch_embed(patches)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


def unfold_vit(divisor_second=ROOT_HD) -> UnfoldViT:
    torch.manual_seed(0)
    return UnfoldViT(divisor_second)


# -- a CLIP vision tower in OpenAI's repository's style ----------------------------------------------------------------


class QuickGELU(nn.Module):
    def __init__(self, constant=1.702):
        super().__init__()
        self.constant = constant

    def forward(self, x):
        return x * torch.sigmoid(self.constant * x)


class ResidualAttentionBlock(nn.Module):
    def __init__(self, constant=1.702):
        super().__init__()
        self.attn = nn.MultiheadAttention(D, H)
        self.ln_1, self.ln_2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.mlp = nn.Sequential()
        self.mlp.add_module("c_fc", nn.Linear(D, 4 * D))
        self.mlp.add_module("gelu", QuickGELU(constant))
        self.mlp.add_module("c_proj", nn.Linear(4 * D, D))

    def forward(self, x):  # x (N, B, D): sequence first, as nn.MultiheadAttention's default
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, constant_second=1.702):
        super().__init__()
        self.resblocks = nn.Sequential(ResidualAttentionBlock(), ResidualAttentionBlock(constant_second))

    def forward(self, x):
        return self.resblocks(x)


class VisionTransformer(nn.Module):
    def __init__(self, constant_second=1.702, image=8, patch=4, output_dim=12):
        super().__init__()
        scale = D**-0.5
        self.conv1 = nn.Conv2d(3, D, kernel_size=patch, stride=patch, bias=False)
        self.class_embedding = nn.Parameter(scale * torch.randn(D))
        self.positional_embedding = nn.Parameter(scale * torch.randn((image // patch) ** 2 + 1, D))
        self.ln_pre = nn.LayerNorm(D)
        self.transformer = Transformer(constant_second)
        self.ln_post = nn.LayerNorm(D)
        self.proj = nn.Parameter(scale * torch.randn(D, output_dim))

    def forward(self, x):
        x = self.conv1(x).reshape(x.shape[0], D, -1).permute(0, 2, 1)  # (B, N, D)
        cls = self.class_embedding.to(x.dtype) + torch.zeros(x.shape[0], 1, D, dtype=x.dtype)
        x = self.ln_pre(torch.cat([cls, x], dim=1) + self.positional_embedding.to(x.dtype))
        x = self.transformer(x.permute(1, 0, 2)).permute(1, 0, 2)  # NLD -> LND -> NLD
        return self.ln_post(x[:, 0, :]) @ self.proj


def clip_vision(constant_second=1.702) -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(constant_second)


# -- a Phi-2-style LM: fused qkv, partial rotary, a parallel block ----------------------------------------------------

ROTARY = HD // 2  # partial_rotary_factor 0.5


class PhiAttention(nn.Module):
    def __init__(self, shift=0):
        super().__init__()
        self.qkv_proj = nn.Linear(D, 3 * D)
        self.dense = nn.Linear(D, D)
        self.shift = shift  # 1: the mistake, tril(diagonal=1) lets the next token in

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q, k, v = self.qkv_proj(x).view(B, T, 3, H, HD).transpose(1, 3).unbind(dim=2)  # (B, H, T, HD) each
        q = torch.cat((rotate_halves(q[..., :ROTARY], cos, sin), q[..., ROTARY:]), dim=-1)
        k = torch.cat((rotate_halves(k[..., :ROTARY], cos, sin), k[..., ROTARY:]), dim=-1)
        keep = torch.ones(T, T, dtype=torch.bool).tril(diagonal=self.shift)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return self.dense(y.transpose(1, 2).reshape(B, T, D))


class PhiLayer(nn.Module):
    def __init__(self, shift=0):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(D)
        self.self_attn = PhiAttention(shift)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x, cos, sin):
        h = self.input_layernorm(x)
        return x + self.self_attn(h, cos, sin) + self.fc2(F.gelu(self.fc1(h), approximate="tanh"))


class PhiRotary(nn.Module):
    """As transformers' rotary modules: the turned features' inverse frequencies kept (float64), tables per call."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", _inv_freq(ROTARY, 10000.0), persistent=False)

    def forward(self, T, dtype):
        angles = _angles(T, self.inv_freq.double())
        return angles.cos().to(dtype), angles.sin().to(dtype)


class Phi(nn.Module):
    def __init__(self, shift_second=0, rotary_module=False):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([PhiLayer(), PhiLayer(shift_second)])
        self.final_layernorm = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, V)
        self.rotary_emb = PhiRotary() if rotary_module else None

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        if self.rotary_emb is not None:
            cos, sin = self.rotary_emb(input_ids.shape[1], x.dtype)
        else:  # the tables made here, from the frequencies of the ROTARY turned features
            angles = _angles(input_ids.shape[1], _inv_freq(ROTARY, 10000.0))
            cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.final_layernorm(x))


def phi(shift_second=0, rotary_module=False) -> Phi:
    torch.manual_seed(0)
    return Phi(shift_second, rotary_module)


# -- a Whisper audio encoder in OpenAI's repository's style: mel frames in, no level of the judge's takes them -------


def sinusoids(length, channels, max_timescale=10000):
    """Whisper's table: sines in the first half of the channels, cosines in the second."""
    increment = math.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = torch.exp(-increment * torch.arange(channels // 2, dtype=torch.float64))
    scaled_time = torch.arange(length, dtype=torch.float64)[:, None] * inv_timescales[None, :]
    return torch.cat([torch.sin(scaled_time), torch.cos(scaled_time)], dim=1)


class WhisperAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.query, self.value, self.out = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.key = nn.Linear(D, D, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, H, HD).permute(0, 2, 1, 3) for t in (self.query(x), self.key(x), self.value(x)))
        w = (q * HD**-0.25) @ (k * HD**-0.25).transpose(-1, -2)  # the scale split between q and k, as Whisper's
        return self.out((w.softmax(-1) @ v).permute(0, 2, 1, 3).flatten(2))


class WhisperBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn, self.attn_ln = WhisperAttention(), nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        self.mlp_ln = nn.LayerNorm(D)

    def forward(self, x):
        x = x + self.attn(self.attn_ln(x))
        return x + self.mlp(self.mlp_ln(x))


class AudioEncoder(nn.Module):
    def __init__(self, n_mels=8, n_ctx=8):
        super().__init__()
        self.conv1 = nn.Conv1d(n_mels, D, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(D, D, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positional_embedding", sinusoids(n_ctx, D))
        self.blocks = nn.ModuleList([WhisperBlock(), WhisperBlock()])
        self.ln_post = nn.LayerNorm(D)

    def forward(self, mel):  # (B, n_mels, 2 n_ctx) log-mel frames
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).permute(0, 2, 1)
        x = x + self.positional_embedding[: x.shape[1]].to(x.dtype)
        for block in self.blocks:
            x = block(x)
        return self.ln_post(x)


def audio_encoder() -> AudioEncoder:
    torch.manual_seed(0)
    return AudioEncoder()


CASES = [
    ("gemma2_helpers", gemma2, "transformer_lm", {}, "pass"),
    (
        "gemma2_helpers.softcap_without_division_second_block",
        lambda: gemma2(cap_divides_second=False),
        "transformer_lm",
        {},
        ("mistake", "attention.softcap_without_division", "layers.1.attn"),
    ),
    (
        "gemma2_helpers.activation_on_up_second_block",
        lambda: gemma2(act_on_up_second=True),
        "transformer_lm",
        {},
        ("mistake", "gated_feed_forward.activation_on_up", "layers.1"),
    ),
    ("gpt_oss_hand", gpt_oss, "transformer_lm", {}, "pass"),
    ("gpt_oss_hand.dense", lambda: gpt_oss(dense=True), "transformer_lm", {}, "pass"),
    (
        "gpt_oss_hand.dense.sink_missing_second_block",
        lambda: gpt_oss(sink_joins_second=False, dense=True),
        "transformer_lm",
        {},
        ("mistake", "attention.sink_missing", "blocks.1.attn"),
    ),
    (
        "gpt_oss_hand.sink_missing_second_block",
        lambda: gpt_oss(sink_joins_second=False),
        "transformer_lm",
        {},
        ("mistake", "attention.sink_missing", "blocks.1.attn"),
    ),
    ("qwen3_moe_hand", qwen3_moe, "transformer_lm", {}, "pass"),
    (
        "qwen3_moe_hand.q_k_swapped_second_block",
        lambda: qwen3_moe(swapped_second=True),
        "transformer_lm",
        {},
        ("mistake", "attention.q_k_swapped", "layers.1.self_attn"),
    ),
    # a mistake inside one expert: its block's variants on the rows routed to it, named at that expert
    (
        "qwen3_moe_hand.activation_on_up_expert_2_second_block",
        lambda: qwen3_moe(on_up=(1, 2)),
        "transformer_lm",
        {},
        ("mistake", "gated_feed_forward.activation_on_up", "layers.1.mlp.experts.2"),
    ),
    # an expert the model's own router never picks, so the recorded forward never runs it: mapped from the structure
    # (experts.3 beside experts.0 .. 2) and judged under the judge's weights, whose router reaches it (first: could
    # not judge, "found 3 experts run after layers.0.mlp.gate.weight ..., the reference has 4; pass mapping=")
    ("qwen3_moe_hand.expert_3_never_chosen", lambda: qwen3_moe(unchosen=3), "transformer_lm", {}, "pass"),
    (
        "qwen3_moe_hand.expert_3_never_chosen.activation_on_up_in_it_second_block",
        lambda: qwen3_moe(on_up=(1, 3), unchosen=3),
        "transformer_lm",
        {},
        ("mistake", "gated_feed_forward.activation_on_up", "layers.1.mlp.experts.3"),
    ),
    ("llama31_rope", llama31, "transformer_lm", LLAMA31_GIVEN, "pass"),
    (
        "llama31_rope.mask_after_softmax_second_block",
        lambda: llama31(mask_after_second=True),
        "transformer_lm",
        LLAMA31_GIVEN,
        ("mistake", "attention.mask_after_softmax", "layers.1.attention"),
    ),
    ("modernbert_hand", modern_encoder, "encoder_model", {}, "pass"),
    (
        "modernbert_hand.unbiased_variance_second_layer",
        lambda: modern_encoder(unbiased_second=True),
        "encoder_model",
        {},
        ("mistake", "layer_norm.unbiased_variance", "layers.1.mlp_norm"),
    ),
    ("unfold_vit", unfold_vit, "transformer_lm", {}, "pass"),
    (
        "unfold_vit.scaled_by_model_width_second_block",
        lambda: unfold_vit(math.sqrt(D)),
        "transformer_lm",
        {},
        ("mistake", "attention.wrong_scale", "blocks.1.attn"),
    ),
    ("clip_vision_openai", clip_vision, "transformer_lm", {}, "pass"),
    (
        "clip_vision_openai.quick_gelu_constant_second_block",
        lambda: clip_vision(1.72),
        "transformer_lm",
        {},
        ("mistake", "activation.quick_gelu_constant", "transformer.resblocks.1.mlp.gelu"),
    ),
    ("whisper_audio_encoder", audio_encoder, "encoder_model", {}, "pass"),
    ("phi_partial_rotary", phi, "transformer_lm", {}, "pass"),
    ("phi_partial_rotary.inv_freq_buffer", lambda: phi(rotary_module=True), "transformer_lm", {}, "pass"),
    (
        "phi_partial_rotary.causal_shows_next_second_block",
        lambda: phi(shift_second=1),
        "transformer_lm",
        {},
        ("mistake", "attention.causal_shows_next", "layers.1.self_attn"),
    ),
]
