"""The models people study in 2026, written by hand as a learner writes them after reading the papers (issue 46,
round 4), in this project's own words: styles none of the other corpus files uses, met by the judge here first.

- a Gemma-2-style LM: embeddings scaled by sqrt(d) and read back as the output projection, four RMSNorms of gain
  `1 + weight` around each sublayer (before and after attention and MLP), a GeGLU of tanh GELU, the attention
  scores soft-capped and the logits too; its layers alternating a local (sliding window) and a global attention,
  and the same LM with every layer global;
- a GPT-OSS-style LM: biases on every projection, a sink logit per head joined to the scores and dropped after the
  softmax, a band of recent keys on every other layer, and its feed-forward GPT-OSS's clamped SwiGLU
  (`(up + 1) * gate * sigmoid(1.702 gate)` of an interleaved `gate_up_proj`, both clamped), and the same LM with a
  plain SwiGLU;
- a Qwen2-style LM: biases on q, k and v and none on the output projection, grouped-query attention, a RoPE base of
  1e6 kept as `self.rope_theta`, transformers' `model.layers` / `lm_head` layout;
- an OLMo-style LM: LayerNorm without any parameter (`F.layer_norm(x, (D,))`), one fused `att_proj`, a SwiGLU of
  one `ff_proj` chunked into up and gate, the token table tied to the output;
- an OLMo-2-style LM: the norms after the sublayers, inside the residual (`x + norm(attn(x))`), RMSNorms of the
  whole q and k projections before the heads are split;
- a Mixtral-style LM of a hand-written mixture of experts: a router, the top 2 experts a token, the softmax over the
  two chosen logits, experts looped over;
- a ViT written out: patches by a Conv2d, a class token, a learned position table, one fused qkv Linear, pre-norm
  blocks, a final norm and a classifier on the class token;
- mistakes put into them, each named where it sits: eps outside the root of Gemma 2's post-feed-forward norm, the
  values rotated in Qwen2's second attention, silu on the up projection of Qwen2's MLP, eps outside the root of
  OLMo 2's k_norm, the heads split without the transpose in the ViT's second block;
- written after the first fixes, and first met then: a Gemma-3-style LM (per-head q and k norms of gain 1 + weight,
  its sliding layer turned at base 10000 and its global one at 1e6), with its K/V heads tiled in the global layer; a
  SmolLM3-style LM whose second layer turns nothing (NoPE); a Mistral whose window is SDPA's boolean mask; math the
  reference lacks: Qwen3-Next's gated attention (the heads' output times sigmoid of a projection) and Llama 4's
  q and k RMS-normalised without a weight, written by hand.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

D, H, KV, V, WINDOW = 32, 4, 2, 26, 3
HD = D // H


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def rope_tables(T: int, theta: float, like: torch.Tensor):
    """cos and sin (T, HD) of the half-split rotation, in like's dtype."""
    inv_freq = 1.0 / theta ** (torch.arange(0, HD, 2, dtype=like.dtype, device=like.device) / HD)
    angles = torch.outer(torch.arange(T, dtype=like.dtype, device=like.device), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def band(T: int, window: int | None, device=None):
    """Keep-mask (T, T): each query sees itself and the past, only the last `window` keys where a window is given."""
    i = torch.arange(T, device=device)
    keep = i[None, :] <= i[:, None]
    return keep if window is None else keep & (i[:, None] - i[None, :] < window)


# -- Gemma 2: four (1 + w) RMSNorms a layer, soft caps, local and global layers, scaled tied embeddings -----------


class GemmaRMSNorm(nn.Module):
    def __init__(self, dim: int = D, eps: float = 1e-6, outside: bool = False):
        super().__init__()
        self.weight = nn.Parameter(0.1 * torch.randn(dim))  # gain 1 + weight: zero is the identity
        self.eps, self.outside = eps, outside

    def forward(self, x):
        if self.outside:  # eps added after the root
            return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.eps) * (1.0 + self.weight)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)


class Gemma2Attention(nn.Module):
    def __init__(self, window: int | None, softcap: float = 5.0):
        super().__init__()
        self.q_proj = nn.Linear(D, H * HD, bias=False)
        self.k_proj = nn.Linear(D, KV * HD, bias=False)
        self.v_proj = nn.Linear(D, KV * HD, bias=False)
        self.o_proj = nn.Linear(H * HD, D, bias=False)
        self.window, self.softcap = window, softcap
        self.scaling = HD**-0.5  # query_pre_attn_scalar = head_dim

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, H, HD).transpose(1, 2)
        k = self.k_proj(x).view(B, T, KV, HD).transpose(1, 2)
        v = self.v_proj(x).view(B, T, KV, HD).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        scores = (q @ k.transpose(2, 3)) * self.scaling
        scores = self.softcap * torch.tanh(scores / self.softcap)
        scores = scores.masked_fill(~band(T, self.window, x.device), float("-inf"))
        out = scores.softmax(dim=-1) @ v
        return self.o_proj(out.transpose(1, 2).reshape(B, T, H * HD))


class GeGLU(nn.Module):
    def __init__(self, hidden: int = 64):
        super().__init__()
        self.gate_proj = nn.Linear(D, hidden, bias=False)
        self.up_proj = nn.Linear(D, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, D, bias=False)

    def forward(self, x):
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class Gemma2Layer(nn.Module):
    def __init__(self, window: int | None, outside: bool = False):
        super().__init__()
        self.input_layernorm = GemmaRMSNorm()
        self.self_attn = Gemma2Attention(window)
        self.post_attention_layernorm = GemmaRMSNorm()
        self.pre_feedforward_layernorm = GemmaRMSNorm()
        self.mlp = GeGLU()
        self.post_feedforward_layernorm = GemmaRMSNorm(outside=outside)

    def forward(self, x, cos, sin):
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Gemma2LM(nn.Module):
    def __init__(self, local: bool = True, outside_second: bool = False, final_softcap: float = 3.0):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        windows = (WINDOW if local else None, None)  # local, global, as Gemma 2 alternates them
        self.layers = nn.ModuleList([Gemma2Layer(windows[0]), Gemma2Layer(windows[1], outside_second)])
        self.norm = GemmaRMSNorm()
        self.final_softcap = final_softcap
        self.rope_theta = 10000.0

    def forward(self, input_ids):
        h = self.embed_tokens(input_ids)
        h = h * torch.tensor(D**0.5, dtype=h.dtype)  # the normaliser, in the activations' dtype
        cos, sin = rope_tables(input_ids.shape[1], self.rope_theta, h)
        for layer in self.layers:
            h = layer(h, cos, sin)
        logits = F.linear(self.norm(h), self.embed_tokens.weight)
        return self.final_softcap * torch.tanh(logits / self.final_softcap)


def gemma2_lm(local: bool = True, outside_second: bool = False) -> Gemma2LM:
    torch.manual_seed(0)
    return Gemma2LM(local, outside_second)


# -- GPT-OSS: sinks, a band on every other layer, the clamped SwiGLU of an interleaved gate_up_proj -----------------


class SinkBandAttention(nn.Module):
    def __init__(self, window: int | None):
        super().__init__()
        self.q_proj = nn.Linear(D, H * HD)
        self.k_proj = nn.Linear(D, KV * HD)
        self.v_proj = nn.Linear(D, KV * HD)
        self.o_proj = nn.Linear(H * HD, D)
        self.sinks = nn.Parameter(torch.randn(H))
        self.window = window

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, H, HD).transpose(1, 2)
        k = self.k_proj(x).view(B, T, KV, HD).transpose(1, 2)
        v = self.v_proj(x).view(B, T, KV, HD).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(HD)
        scores = scores.masked_fill(~band(T, self.window, x.device), float("-inf"))
        sink = self.sinks.view(1, H, 1, 1).expand(B, H, T, 1)
        probs = torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]  # the sink takes its share, then goes
        return self.o_proj((probs @ v).transpose(1, 2).reshape(B, T, H * HD))


class ClampedSwiGLU(nn.Module):
    def __init__(self, hidden: int = 64, limit: float = 7.0, alpha: float = 1.702):
        super().__init__()
        self.gate_up_proj = nn.Linear(D, 2 * hidden)
        self.down_proj = nn.Linear(hidden, D)
        self.limit, self.alpha = limit, alpha

    def forward(self, x):
        gate_up = self.gate_up_proj(x)
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]  # interleaved columns
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        glu = gate * torch.sigmoid(gate * self.alpha)
        return self.down_proj((up + 1) * glu)


class OssBlock(nn.Module):
    def __init__(self, window: int | None, clamped: bool = True):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(D, eps=1e-5)
        self.attn = SinkBandAttention(window)
        self.post_attention_layernorm = nn.RMSNorm(D, eps=1e-5)
        self.mlp = ClampedSwiGLU() if clamped else Qwen2MLP()

    def forward(self, x, cos, sin):
        x = x + self.attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class OssLM(nn.Module):
    def __init__(self, clamped: bool = True):
        super().__init__()
        self.embedding = nn.Embedding(V, D)
        self.block = nn.ModuleList([OssBlock(WINDOW, clamped), OssBlock(None, clamped)])  # sliding, full, ...
        self.norm = nn.RMSNorm(D, eps=1e-5)
        self.unembedding = nn.Linear(D, V, bias=False)

    def forward(self, x):
        h = self.embedding(x)
        cos, sin = rope_tables(x.shape[1], 150000.0, h)
        for block in self.block:
            h = block(h, cos, sin)
        return self.unembedding(self.norm(h))


def oss_lm(clamped: bool = True) -> OssLM:
    torch.manual_seed(0)
    return OssLM(clamped)


# -- Qwen2: q, k, v biases, no o bias, GQA, RoPE base 1e6 as self.rope_theta ---------------------------------------


class Qwen2Attention(nn.Module):
    def __init__(self, rotate_values: bool = False):
        super().__init__()
        self.q_proj = nn.Linear(D, H * HD, bias=True)
        self.k_proj = nn.Linear(D, KV * HD, bias=True)
        self.v_proj = nn.Linear(D, KV * HD, bias=True)
        self.o_proj = nn.Linear(H * HD, D, bias=False)
        self.rotate_values = rotate_values

    def forward(self, hidden_states, position_embeddings):
        cos, sin = position_embeddings or (None, None)
        B, T, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(B, T, -1, HD).transpose(1, 2)
        k = self.k_proj(hidden_states).view(B, T, -1, HD).transpose(1, 2)
        v = self.v_proj(hidden_states).view(B, T, -1, HD).transpose(1, 2)
        if position_embeddings is not None:  # None: a NoPE layer (SmolLM3's), no positions at all
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if self.rotate_values:
            v = v * cos + rotate_half(v) * sin
        k = k[:, :, None].expand(B, KV, H // KV, T, HD).reshape(B, H, T, HD)
        v = v[:, :, None].expand(B, KV, H // KV, T, HD).reshape(B, H, T, HD)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class Qwen2MLP(nn.Module):
    def __init__(self, hidden: int = 64, on_up: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(D, hidden, bias=False)
        self.up_proj = nn.Linear(D, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, D, bias=False)
        self.on_up = on_up

    def forward(self, x):
        if self.on_up:
            return self.down_proj(self.gate_proj(x) * F.silu(self.up_proj(x)))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen2DecoderLayer(nn.Module):
    def __init__(self, rotate_values: bool = False, on_up: bool = False):
        super().__init__()
        self.self_attn = Qwen2Attention(rotate_values)
        self.mlp = Qwen2MLP(on_up=on_up)
        self.input_layernorm = nn.RMSNorm(D, eps=1e-6)
        self.post_attention_layernorm = nn.RMSNorm(D, eps=1e-6)

    def forward(self, hidden_states, position_embeddings):
        residual = hidden_states
        hidden_states = self.self_attn(self.input_layernorm(hidden_states), position_embeddings)
        hidden_states = residual + hidden_states
        residual = hidden_states
        return residual + self.mlp(self.post_attention_layernorm(hidden_states))


class Qwen2Model(nn.Module):
    def __init__(self, rotate_values_second: bool = False, on_up_first: bool = False):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList(
            [Qwen2DecoderLayer(on_up=on_up_first), Qwen2DecoderLayer(rotate_values=rotate_values_second)]
        )
        self.norm = nn.RMSNorm(D, eps=1e-6)
        self.rope_theta = 1000000.0

    def forward(self, input_ids):
        h = self.embed_tokens(input_ids)
        position_embeddings = rope_tables(input_ids.shape[1], self.rope_theta, h)
        for layer in self.layers:
            h = layer(h, position_embeddings)
        return self.norm(h)


class Qwen2ForCausalLM(nn.Module):
    def __init__(self, **mistakes):
        super().__init__()
        self.model = Qwen2Model(**mistakes)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, input_ids, labels=None):
        logits = self.lm_head(self.model(input_ids))
        if labels is None:
            return logits
        return logits, F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())


def qwen2_lm(**mistakes) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    return Qwen2ForCausalLM(**mistakes)


# -- OLMo: LayerNorm without parameters, fused att_proj and ff_proj, tied output -----------------------------------


class NonParametricLayerNorm(nn.Module):
    def forward(self, x):
        return F.layer_norm(x, (D,), eps=1e-5)


class OlmoBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm = NonParametricLayerNorm()
        self.att_proj = nn.Linear(D, 3 * D, bias=False)
        self.attn_out = nn.Linear(D, D, bias=False)
        self.ff_norm = NonParametricLayerNorm()
        self.ff_proj = nn.Linear(D, 2 * 64, bias=False)
        self.ff_out = nn.Linear(64, D, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q, k, v = self.att_proj(self.attn_norm(x)).split(D, dim=-1)
        q, k, v = (t.view(B, T, H, HD).transpose(1, 2) for t in (q, k, v))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_out(att.transpose(1, 2).reshape(B, T, D))
        up, gate = self.ff_proj(self.ff_norm(x)).chunk(2, dim=-1)  # OLMo's order: the up half first
        return x + self.ff_out(F.silu(gate) * up)


class OlmoLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(V, D)
        self.blocks = nn.ModuleList([OlmoBlock(), OlmoBlock()])
        self.ln_f = NonParametricLayerNorm()

    def forward(self, input_ids):
        x = self.wte(input_ids)
        cos, sin = rope_tables(input_ids.shape[1], 10000.0, x)
        for block in self.blocks:
            x = block(x, cos, sin)
        return F.linear(self.ln_f(x), self.wte.weight)


def olmo_lm() -> OlmoLM:
    torch.manual_seed(0)
    return OlmoLM()


# -- OLMo 2: norms after the sublayers inside the residual, RMSNorm of the whole q and k projections ---------------


class WrittenRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, outside: bool = False):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))
        self.eps, self.outside = eps, outside

    def forward(self, x):
        ms = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x / (ms.sqrt() + self.eps) if self.outside else x * torch.rsqrt(ms + self.eps))


class Olmo2Attention(nn.Module):
    def __init__(self, k_norm_outside: bool = False):
        super().__init__()
        self.q_proj = nn.Linear(D, D, bias=False)
        self.k_proj = nn.Linear(D, D, bias=False)
        self.v_proj = nn.Linear(D, D, bias=False)
        self.o_proj = nn.Linear(D, D, bias=False)
        self.q_norm = WrittenRMSNorm(D)
        self.k_norm = WrittenRMSNorm(D, outside=k_norm_outside)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q, k = self.q_norm(self.q_proj(x)), self.k_norm(self.k_proj(x))  # normed before the heads are split
        q, k, v = (t.view(B, T, H, HD).transpose(1, 2) for t in (q, k, self.v_proj(x)))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        scores = q @ k.transpose(-2, -1) / math.sqrt(HD)
        scores = scores + torch.full((T, T), float("-inf"), dtype=x.dtype, device=x.device).triu(1)
        return self.o_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D))


class Olmo2Layer(nn.Module):
    def __init__(self, k_norm_outside: bool = False):
        super().__init__()
        self.self_attn = Olmo2Attention(k_norm_outside)
        self.post_attention_layernorm = WrittenRMSNorm(D)
        self.mlp = Qwen2MLP()
        self.post_feedforward_layernorm = WrittenRMSNorm(D)

    def forward(self, x, cos, sin):
        x = x + self.post_attention_layernorm(self.self_attn(x, cos, sin))
        return x + self.post_feedforward_layernorm(self.mlp(x))


class Olmo2LM(nn.Module):
    def __init__(self, k_norm_outside_second: bool = False):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([Olmo2Layer(), Olmo2Layer(k_norm_outside_second)])
        self.norm = WrittenRMSNorm(D)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        cos, sin = rope_tables(input_ids.shape[1], 500000.0, x)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def olmo2_lm(k_norm_outside_second: bool = False) -> Olmo2LM:
    torch.manual_seed(0)
    return Olmo2LM(k_norm_outside_second)


# -- a Mixtral-style mixture of experts written by hand: top 2 of 4, the softmax over the chosen two ---------------


class Expert(nn.Module):
    def __init__(self, hidden: int = 32):
        super().__init__()
        self.w1 = nn.Linear(D, hidden, bias=False)
        self.w2 = nn.Linear(hidden, D, bias=False)
        self.w3 = nn.Linear(D, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SparseMoE(nn.Module):
    def __init__(self, n_experts: int = 4, top_k: int = 2):
        super().__init__()
        self.gate = nn.Linear(D, n_experts, bias=False)
        self.experts = nn.ModuleList([Expert() for _ in range(n_experts)])
        self.top_k = top_k

    def forward(self, x):
        flat = x.reshape(-1, D)  # (B * T, D)
        weights, chosen = self.gate(flat).topk(self.top_k, dim=-1)  # (B * T, k)
        weights = weights.softmax(dim=-1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == e)
            if token.numel():
                out.index_add_(0, token, weights[token, slot, None] * expert(flat[token]))
        return out.view_as(x)


class MoELayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm = nn.RMSNorm(D, eps=1e-5)
        self.attention = Qwen2Attention()
        self.ffn_norm = nn.RMSNorm(D, eps=1e-5)
        self.moe = SparseMoE()

    def forward(self, x, tables):
        x = x + self.attention(self.attention_norm(x), tables)
        return x + self.moe(self.ffn_norm(x))


class MoELM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(V, D)
        self.layers = nn.ModuleList([MoELayer(), MoELayer()])
        self.norm = nn.RMSNorm(D, eps=1e-5)
        self.output = nn.Linear(D, V, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        tables = rope_tables(tokens.shape[1], 10000.0, h)
        for layer in self.layers:
            h = layer(h, tables)
        return self.output(self.norm(h))


def moe_lm() -> MoELM:
    torch.manual_seed(0)
    return MoELM()


# -- a ViT written out: Conv2d patches, class token, learned positions, fused qkv, a classifier on the class token -


class ViTAttention(nn.Module):
    def __init__(self, transpose: bool = True):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.transpose = transpose

    def heads(self, t):
        B, N, _ = t.shape
        if self.transpose:
            return t.reshape(B, N, H, HD).transpose(1, 2)  # (B, H, N, HD)
        return t.reshape(B, H, N, HD)  # the heads split without the transpose

    def forward(self, x):
        B, N, _ = x.shape
        q, k, v = map(self.heads, self.qkv(x).chunk(3, dim=-1))
        attn = (q @ k.transpose(-2, -1)) * HD**-0.5
        out = attn.softmax(dim=-1) @ v  # (B, H, N, HD)
        return self.proj(out.transpose(1, 2).reshape(B, N, D))


class ViTBlock(nn.Module):
    def __init__(self, transpose: bool = True):
        super().__init__()
        self.ln_1 = nn.LayerNorm(D, eps=1e-6)
        self.attn = ViTAttention(transpose)
        self.ln_2 = nn.LayerNorm(D, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln_2(x))))


class HandViT(nn.Module):
    def __init__(self, transpose_second: bool = True, image: int = 8, patch: int = 4, classes: int = 5):
        super().__init__()
        self.to_patches = nn.Conv2d(3, D, kernel_size=patch, stride=patch)
        self.class_token = nn.Parameter(torch.zeros(1, 1, D))
        self.positions = nn.Parameter(0.02 * torch.randn(1, 1 + (image // patch) ** 2, D))
        self.layers = nn.ModuleList([ViTBlock(), ViTBlock(transpose_second)])
        self.ln = nn.LayerNorm(D, eps=1e-6)
        self.classifier = nn.Linear(D, classes)

    def forward(self, images):
        x = self.to_patches(images)  # (B, D, h, w)
        x = x.flatten(2).transpose(1, 2)  # (B, N, D)
        cls = self.class_token.expand(x.shape[0], -1, -1)
        x = torch.cat((cls, x), dim=1) + self.positions
        for layer in self.layers:
            x = layer(x)
        return self.classifier(self.ln(x)[:, 0])


def hand_vit(transpose_second: bool = True) -> HandViT:
    torch.manual_seed(0)
    return HandViT(transpose_second)


# -- written after the first fixes (issue 46, round 4), first met then: Gemma 3, SmolLM3's NoPE layers, a Mistral ----


class Gemma3Attention(Gemma2Attention):
    """Gemma 3: per-head q and k norms of gain 1 + weight before RoPE, no soft cap."""

    def __init__(self, window: int | None, tiled: bool = False):
        super().__init__(window)
        self.q_norm, self.k_norm = GemmaRMSNorm(HD), GemmaRMSNorm(HD)
        self.tiled = tiled

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, H, HD)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, KV, HD)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, KV, HD).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if self.tiled:  # K/V heads tiled: K/V head j serves query heads j, j + KV, ...
            k, v = k.repeat(1, H // KV, 1, 1), v.repeat(1, H // KV, 1, 1)
        else:
            k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        scores = (q @ k.transpose(2, 3)) * self.scaling
        scores = scores.masked_fill(~band(T, self.window, x.device), float("-inf"))
        return self.o_proj((scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, H * HD))


class Gemma3Layer(Gemma2Layer):
    def __init__(self, window: int | None, tiled: bool = False):
        super().__init__(window)
        self.self_attn = Gemma3Attention(window, tiled)
        self.sliding = window is not None


class Gemma3LM(nn.Module):
    """Local layers turned at base 10000, the global one at 1e6 (Gemma 3's rope_local_base_freq)."""

    def __init__(self, tiled_second: bool = False):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([Gemma3Layer(WINDOW), Gemma3Layer(None, tiled_second)])
        self.norm = GemmaRMSNorm()
        self.rope_theta, self.rope_local_base_freq = 1000000.0, 10000.0

    def forward(self, input_ids):
        h = self.embed_tokens(input_ids) * D**0.5
        T = input_ids.shape[1]
        local, full = rope_tables(T, self.rope_local_base_freq, h), rope_tables(T, self.rope_theta, h)
        for layer in self.layers:
            h = layer(h, *(local if layer.sliding else full))
        return F.linear(self.norm(h), self.embed_tokens.weight)


def gemma3_lm(tiled_second: bool = False) -> Gemma3LM:
    torch.manual_seed(0)
    return Gemma3LM(tiled_second)


class NoPELM(Qwen2ForCausalLM):
    """SmolLM3's NoPE layers: the second layer's attention turns nothing (no positions at all)."""

    def __init__(self):
        super().__init__()
        self.model.forward = self._forward  # type: ignore[method-assign]

    def _forward(self, input_ids):
        h = self.model.embed_tokens(input_ids)
        tables = rope_tables(input_ids.shape[1], self.model.rope_theta, h)
        for i, layer in enumerate(self.model.layers):
            h = layer(h, None if i % 2 else tables)
        return self.model.norm(h)


def nope_lm() -> NoPELM:
    torch.manual_seed(0)
    return NoPELM()


class MistralAttention(nn.Module):
    """A sliding window given to SDPA as a boolean keep-mask (True: may attend)."""

    def __init__(self):
        super().__init__()
        self.wq, self.wk = nn.Linear(D, D, bias=False), nn.Linear(D, KV * HD, bias=False)
        self.wv, self.wo = nn.Linear(D, KV * HD, bias=False), nn.Linear(D, D, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, H, HD).transpose(1, 2)
        k, v = (w(x).view(B, T, KV, HD).transpose(1, 2) for w in (self.wk, self.wv))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=band(T, WINDOW, x.device), enable_gqa=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, D))


class MistralLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.attention = nn.RMSNorm(D, eps=1e-5), MistralAttention()
        self.ffn_norm, self.feed_forward = nn.RMSNorm(D, eps=1e-5), Expert(64)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class MistralLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(V, D)
        self.layers = nn.ModuleList([MistralLayer(), MistralLayer()])
        self.norm = nn.RMSNorm(D, eps=1e-5)
        self.output = nn.Linear(D, V, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        cos, sin = rope_tables(tokens.shape[1], 10000.0, h)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h))


def mistral_lm() -> MistralLM:
    torch.manual_seed(0)
    return MistralLM()


class GatedAttention(Qwen2Attention):
    """Qwen3-Next's gated attention: the heads' output times sigmoid of a projection of the input, before o_proj."""

    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(D, H * HD, bias=False)

    def forward(self, hidden_states, position_embeddings):
        B, T, _ = hidden_states.shape
        cos, sin = position_embeddings
        q, k, v = (f(hidden_states).view(B, T, -1, HD).transpose(1, 2) for f in (self.q_proj, self.k_proj, self.v_proj))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        out = out.transpose(1, 2).reshape(B, T, -1) * torch.sigmoid(self.gate_proj(hidden_states))
        return self.o_proj(out)


class QKRMSWithoutWeight(Qwen2Attention):
    """Llama 4's rotary layers: queries and keys RMS-normalised per head, with no weight, after RoPE."""

    def forward(self, hidden_states, position_embeddings):
        B, T, _ = hidden_states.shape
        cos, sin = position_embeddings
        q, k, v = (f(hidden_states).view(B, T, -1, HD).transpose(1, 2) for f in (self.q_proj, self.k_proj, self.v_proj))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        q, k = (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) for t in (q, k))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


def qwen2_with(attention) -> Qwen2ForCausalLM:
    """The Qwen2-style LM of one layer, its attention `attention`."""
    model = qwen2_lm()
    model.model.layers = model.model.layers[:1]
    model.model.layers[0].self_attn = attention()
    return model


CASES = [
    ("gemma2_lm", gemma2_lm, "transformer_lm", {}, "pass"),
    ("gemma2_lm.all_global", lambda: gemma2_lm(local=False), "transformer_lm", {}, "pass"),
    (
        "gemma2_lm.rms_eps_outside_sqrt_second_block",
        lambda: gemma2_lm(local=False, outside_second=True),
        "transformer_lm",
        {},
        ("mistake", "rms_norm.eps_outside_sqrt", "layers.1.post_feedforward_layernorm"),
    ),
    # the reference's clamped SwiGLU is GPT-OSS's experts' only: with mixtures read, a dense one stays without a pair
    # (a one-expert mixture would need a router the module lacks)
    ("oss_lm", oss_lm, "transformer_lm", {}, ("no pair", "block.0.mlp", "clamp")),
    ("oss_lm.plain_swiglu", lambda: oss_lm(clamped=False), "transformer_lm", {}, "pass"),
    ("qwen2_lm", qwen2_lm, "transformer_lm", {}, "pass"),
    (
        "qwen2_lm.rope_on_values_second_block",
        lambda: qwen2_lm(rotate_values_second=True),
        "transformer_lm",
        {},
        ("mistake", "rope.applied_to_v", "model.layers.1.self_attn"),
    ),
    (
        "qwen2_lm.activation_on_up",
        lambda: qwen2_lm(on_up_first=True),
        "transformer_lm",
        {},
        ("mistake", "gated_feed_forward.activation_on_up", "model.layers.0.mlp"),
    ),
    ("olmo_lm", olmo_lm, "transformer_lm", {}, ("no pair", "blocks.0.attn_norm", "without a weight")),
    ("olmo2_lm", olmo2_lm, "transformer_lm", {}, "pass"),
    (
        "olmo2_lm.k_norm_eps_outside_sqrt_second_block",
        lambda: olmo2_lm(k_norm_outside_second=True),
        "transformer_lm",
        {},
        ("mistake", "rms_norm.eps_outside_sqrt", "layers.1.self_attn.k_norm"),
    ),
    # a mixture of experts: once said as a top-k with no pair; the reference has Mixtral's (numpy_transformer/moe.py),
    # and the top-k logits softmaxed are its softmax, top-k, renormalised (the denominator cancels): a pass
    ("moe_lm", moe_lm, "transformer_lm", {}, "pass"),
    ("hand_vit", hand_vit, "transformer_lm", {}, "pass"),
    (
        "hand_vit.heads_without_transpose_second_block",
        lambda: hand_vit(transpose_second=False),
        "transformer_lm",
        {},
        ("mistake", "attention.heads_without_transpose", "layers.1.attn"),
    ),
    # written after the first fixes; first met then
    ("gemma3_lm", gemma3_lm, "transformer_lm", {}, "pass"),
    (
        "gemma3_lm.kv_heads_tiled_second_block",
        lambda: gemma3_lm(tiled_second=True),
        "transformer_lm",
        {},
        ("mistake", "attention.kv_heads_tiled", "layers.1.self_attn"),
    ),
    ("nope_lm", nope_lm, "transformer_lm", {}, "pass"),
    ("mistral_lm", mistral_lm, "transformer_lm", {}, "pass"),
    (
        "gated_attention_lm",
        lambda: qwen2_with(GatedAttention),
        "transformer_lm",
        {},
        ("no pair", "model.layers.0.self_attn", "sigmoid"),
    ),
    (
        "qk_rms_without_weight_lm",
        lambda: qwen2_with(QKRMSWithoutWeight),
        "transformer_lm",
        {},
        ("no pair", "model.layers.0.self_attn", "without a weight"),
    ),
]
