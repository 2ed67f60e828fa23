"""The open LLMs of 2025-26 the other corpus files do not hold, each written by hand as a blog post walks through
it (issue 46, round 14), in this project's own words. The judge meets them here first (measured with the judge frozen:
what it said when it first met each is in parity_tests/test_unseen.py's TODAY).

- a Granite-3-style LM: its four muP numbers, the embeddings times `embedding_multiplier` (12), the scores times
  `attention_multiplier` (1 / Dh, in place of 1 / sqrt(Dh)), each sublayer's output times `residual_multiplier`
  (0.22) before it joins the stream, the logits divided by `logits_scaling` (8), SDPA given the scale; with the
  first and third at 1 it is the reference's `attention_scale` 1/8 and `output_scale` 1/8 (a pass with
  attention_scale given; with nothing given, the catalogue's scores over d_head, below); the embeddings
  times 12 are no pair (the reference scales them by sqrt(D) or not at all), said where they are multiplied, the
  model's forward; the residual multiplier alone is no pair, said at the first layer (the reference's residual adds
  the sublayer's output as it is);
- a MiniCPM-style LM: `scale_emb` (12) on the embeddings, each sublayer's output times scale_depth / sqrt(L), the
  last hidden state divided by d_model / dim_model_base before a tied head: no pair, said where the embeddings are
  scaled;
- a Llama-4-style LM written as Meta writes it (tok_embeddings, wq / wk / wv / wo, w1 / w2 / w3, complex rotary of
  interleaved pairs from `torch.polar`): four layers, every fourth one NoPE (no rotary: the reference's
  `rope_layers`), the others attending in chunks of `attention_chunk_size` keys (a query sees the causal keys of its
  own chunk only); at Llama 4's chunk of 8192 every probe sits in one chunk (a pass: the mask is causal), at a chunk
  of 4 the block-diagonal mask is no pair, said at the first attention; mistakes: the keys of the second layer turned
  in halves while the queries are turned in pairs, the causal mask left off the NoPE layer;
- a Cohere2-style (Command R7B) LM: one LayerNorm without bias read by a parallel block, interleaved rotary on the
  sliding-window layer and none on the global one (its NoPE), the logits times `logit_scale` (1/4), the head tied;
  its second attention's K/V heads tiled (`.repeat`);
- a GLM-4-style LM: q/k/v biases and none on o_proj, rotary on the first half of each head in interleaved pairs,
  norms before and after each sublayer (post_self_attn_layernorm, post_mlp_layernorm), one gate_up_proj chunked; its
  second attention turning the keys in halves;
- an EXAONE-4-style LM: the norms only after the sublayers (OLMo 2's order), per-head q/k RMSNorms, a sliding layer
  with rotary and a global one without (NoPE); its second q_norm averaging over the positions;
- an OLMo-3-style LM: OLMo 2's post-sublayer norms and q/k RMSNorms over the whole projection, a sliding-window
  layer beside a full one; eps outside the root in its second post-feed-forward norm.
- a Hunyuan-style (dense) LM: per-head q/k RMSNorms (query_layernorm, key_layernorm) read after the rotation, not
  before: a gain per feature after the pairs are mixed, no pair (said at the first attention).

Decided from the math before the judge ran: the correct models are each what the reference computes under some
TransformerConfig (attention_scale, output_scale, rope_layers, layer_types with sliding_window, parallel_residual with
shared_norm and norm_bias False, sandwich_norm, input_norm False, qk_norm with qk_norm_projection, rotary_dim), except
the embedding and residual multipliers, the chunked mask and the q/k norms after the rotation, which no field
gives.

One expectation was revised after the judge ran, for a reason of the math: Granite with nothing given was first
expected to pass, and the judge said attention.wrong_scale at its first attention; its scores times 1 / Dh in every
layer are, to the letter, the catalogue's slip (Q K^T / d_head), which the code cannot tell from Granite's
attention_multiplier, so the mistake is the verdict, and the same model with attention_scale=1/8 given is a pass
(a case of its own).

First met: 11 of 18 right (10 of 17 on the expectations as first written). Wrong then:

- granite_hand (attention_scale given): "unexplained: model.embed_tokens ... its output is the reference's times
  2.121" (12 over the reference's sqrt(32)): neither an id nor the op, and at the lookup, not at the model's forward
  that multiplies; minicpm_hand the same (its scale_emb 12);
- granite_hand.residual_multiplier_only: no pair at model.layers.0, right in place, said as "mul in
  model.layers.0's own forward computes what the reference's layer does not": the factor 0.22 unsaid;
- llama4_hand.chunks_of_4: "unexplained: layers.0.attention ... positions 1, 2, 3, 4, 5 differ": the chunked mask
  not named;
- glm4_hand and glm4_hand.mixed_pairing_second_layer: "could not judge: found 9 norms in the module, the reference
  'transformer_lm' has 10": GLM-4's four norms a layer (Gemma 2's sandwich, the reference's sandwich_norm) read as a
  post-norm stream whose first norm, reading only the lookup, is an embedding norm;
- hunyuan_hand: "unexplained: model.layers.0.self_attn ... positions 1, 2, 3, 4, 5 differ": the q/k norms after the
  rotation not named.

Right since, all seven: a number added (a norm's eps) is no longer read as the residual sum, so the sandwich reads
as pre-norm and GLM-4's first input norm as layer 0's (Gemma 2 had escaped only because its (1 + weight) gain hid every
norm from the count of the lookup's); the embedding multiplier, the chunked mask and the q/k norms after the rotation
are read from the recorded flow and said where they run; the residual multiplier is said with its 0.22.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

D, H, KV, V, F_FF, WINDOW = 32, 4, 2, 26, 64, 4
HD = D // H


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases moved off their 1s and 0s, so that trained values are what is checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last axis; `outside` puts eps outside the root (the mistake),
    `axis` another axis for the mean (the mistake when not -1)."""

    def __init__(self, width: int = D, eps: float = 1e-6, outside: bool = False, axis: int = -1):
        super().__init__()
        self.weight, self.eps, self.outside, self.axis = nn.Parameter(torch.ones(width)), eps, outside, axis

    def forward(self, x):
        if self.outside:
            return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.eps) * self.weight
        return x * torch.rsqrt(x.pow(2).mean(self.axis, keepdim=True) + self.eps) * self.weight


def _halves(x, base: float = 10000.0, rotated: int = HD):
    """Rotary in halves (rotate_half) on the first `rotated` features of x (B, h, T, Dh)."""
    T = x.shape[-2]
    inv = 1.0 / base ** (torch.arange(0, rotated, 2, dtype=x.dtype) / rotated)
    angles = torch.outer(torch.arange(T, dtype=x.dtype), inv).repeat(1, 2)
    turn, keep = x[..., :rotated], x[..., rotated:]
    a, b = turn.chunk(2, dim=-1)
    return torch.cat([turn * angles.cos() + torch.cat([-b, a], -1) * angles.sin(), keep], -1)


def _pairs(x, base: float = 10000.0, rotated: int = HD):
    """Rotary in interleaved pairs (2i, 2i + 1) on the first `rotated` features of x (B, h, T, Dh)."""
    T = x.shape[-2]
    inv = 1.0 / base ** (torch.arange(0, rotated, 2, dtype=x.dtype) / rotated)
    angles = torch.outer(torch.arange(T, dtype=x.dtype), inv)
    cos, sin = angles.cos(), angles.sin()
    turn, keep = x[..., :rotated], x[..., rotated:]
    a, b = turn[..., 0::2], turn[..., 1::2]
    return torch.cat([torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2), keep], -1)


def _keep(T: int, window: int | None = None, chunk: int | None = None) -> torch.Tensor:
    """True where query i may read key j: j <= i, within the last `window` keys, inside i's chunk of `chunk`."""
    i, j = torch.arange(T)[:, None], torch.arange(T)[None]
    keep = j <= i
    if window is not None:
        keep &= i - j < window
    if chunk is not None:
        keep &= i // chunk == j // chunk
    return keep


class SwiGLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(D, F_FF, bias=False), nn.Linear(D, F_FF, bias=False)
        self.down_proj = nn.Linear(F_FF, D, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# -- Granite 3: embedding, attention, residual multipliers and logits scaling -----------------------------------------


class GraniteAttention(nn.Module):
    def __init__(self, attention_multiplier: float):
        super().__init__()
        self.q_proj, self.o_proj = nn.Linear(D, D, bias=False), nn.Linear(D, D, bias=False)
        self.k_proj, self.v_proj = nn.Linear(D, KV * HD, bias=False), nn.Linear(D, KV * HD, bias=False)
        self.scaling = attention_multiplier

    def forward(self, x):
        B, T, _ = x.shape
        q = _halves(self.q_proj(x).view(B, T, H, HD).transpose(1, 2))
        k = _halves(self.k_proj(x).view(B, T, KV, HD).transpose(1, 2))
        v = self.v_proj(x).view(B, T, KV, HD).transpose(1, 2)
        k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scaling)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, D))


class GraniteLayer(nn.Module):
    def __init__(self, attention_multiplier: float, residual_multiplier: float):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(), RMSNorm()
        self.self_attn, self.mlp = GraniteAttention(attention_multiplier), SwiGLU()
        self.residual_multiplier = residual_multiplier

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x)) * self.residual_multiplier
        return x + self.mlp(self.post_attention_layernorm(x)) * self.residual_multiplier


class GraniteModel(nn.Module):
    def __init__(self, embedding_multiplier: float, residual_multiplier: float):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([GraniteLayer(1 / HD, residual_multiplier) for _ in range(2)])
        self.norm, self.embedding_multiplier = RMSNorm(), embedding_multiplier

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids) * self.embedding_multiplier
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class GraniteForCausalLM(nn.Module):
    def __init__(self, embedding_multiplier: float, residual_multiplier: float, logits_scaling: float):
        super().__init__()
        self.model = GraniteModel(embedding_multiplier, residual_multiplier)
        self.lm_head, self.logits_scaling = nn.Linear(D, V, bias=False), logits_scaling

    def forward(self, input_ids):
        return self.lm_head(self.model(input_ids)) / self.logits_scaling


def granite(embedding: float = 12.0, residual: float = 0.22, logits: float = 8.0) -> GraniteForCausalLM:
    torch.manual_seed(0)
    return _jitter(GraniteForCausalLM(embedding, residual, logits))


# -- MiniCPM: scale_emb, scale_depth / sqrt(L) on each sublayer, hidden / (d_model / dim_model_base), tied ------------


class MiniCPMLayer(nn.Module):
    def __init__(self, residual_scale: float):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(eps=1e-5), RMSNorm(eps=1e-5)
        self.self_attn, self.mlp, self.residual_scale = GraniteAttention(HD**-0.5), SwiGLU(), residual_scale

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x)) * self.residual_scale
        return x + self.mlp(self.post_attention_layernorm(x)) * self.residual_scale


class MiniCPMModel(nn.Module):
    scale_emb, scale_depth, dim_model_base = 12.0, 1.4, 8

    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([MiniCPMLayer(self.scale_depth / math.sqrt(2)) for _ in range(2)])
        self.norm = RMSNorm(eps=1e-5)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids) * self.scale_emb
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class MiniCPMForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = MiniCPMModel()

    def forward(self, input_ids):
        hidden = self.model(input_ids)
        return F.linear(hidden / (D / self.model.dim_model_base), self.model.embed_tokens.weight)


def minicpm() -> MiniCPMForCausalLM:
    torch.manual_seed(0)
    return _jitter(MiniCPMForCausalLM())


# -- Llama 4, Meta's way: complex rotary of interleaved pairs, every fourth layer NoPE, chunked local attention ------


def _polar(T: int, like: torch.Tensor, base: float = 500000.0) -> torch.Tensor:
    """freqs_cis (T, Dh / 2): e^(i t theta_k), theta_k = base^(-2k / Dh), complex of like's precision."""
    inv = 1.0 / base ** (torch.arange(0, HD, 2, dtype=like.dtype) / HD)
    angles = torch.outer(torch.arange(T, dtype=like.dtype), inv)
    return torch.polar(torch.ones_like(angles), angles)


def _turn(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """x (B, T, h, Dh) turned by freqs_cis, its features read as complex pairs (2i, 2i + 1)."""
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(z * freqs_cis[None, :, None]).flatten(3)


class Llama4Attention(nn.Module):
    def __init__(self, use_rope: bool, chunk: int | None, keys_in_halves: bool = False, causal: bool = True):
        super().__init__()
        self.wq, self.wo = nn.Linear(D, D, bias=False), nn.Linear(D, D, bias=False)
        self.wk, self.wv = nn.Linear(D, KV * HD, bias=False), nn.Linear(D, KV * HD, bias=False)
        self.use_rope, self.chunk = use_rope, chunk
        self.keys_in_halves = keys_in_halves  # the mistake: the keys turned in halves, the queries in pairs
        self.causal = causal  # the mistake when False: the causal mask left off

    def forward(self, x, freqs_cis):
        B, T, _ = x.shape
        q, k = self.wq(x).view(B, T, H, HD), self.wk(x).view(B, T, KV, HD)
        v = self.wv(x).view(B, T, KV, HD)
        if self.use_rope:
            q = _turn(q, freqs_cis)
            k = _halves(k.transpose(1, 2), 500000.0).transpose(1, 2) if self.keys_in_halves else _turn(k, freqs_cis)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(HD)
        if self.causal:
            chunk = self.chunk if self.use_rope else None  # the NoPE layers attend globally
            scores = scores.masked_fill(~_keep(T, chunk=chunk), float("-inf"))
        return self.wo((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D))


class Llama4FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w3 = nn.Linear(D, F_FF, bias=False), nn.Linear(D, F_FF, bias=False)
        self.w2 = nn.Linear(F_FF, D, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Llama4Block(nn.Module):
    def __init__(self, attention: Llama4Attention):
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(eps=1e-5), attention
        self.ffn_norm, self.feed_forward = RMSNorm(eps=1e-5), Llama4FeedForward()

    def forward(self, x, freqs_cis):
        x = x + self.attention(self.attention_norm(x), freqs_cis)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama4(nn.Module):
    """`nope_layer_interval` 4: layer 3 has no rotary; `attention_chunk_size` on the rotary layers."""

    def __init__(self, chunk: int, mistake: str = ""):
        super().__init__()
        self.tok_embeddings = nn.Embedding(V, D)
        attentions = [Llama4Attention((i + 1) % 4 != 0, chunk) for i in range(4)]
        if mistake == "mixed_pairing":
            attentions[1] = Llama4Attention(True, chunk, keys_in_halves=True)
        if mistake == "not_causal":
            attentions[3] = Llama4Attention(False, chunk, causal=False)
        self.layers = nn.ModuleList([Llama4Block(a) for a in attentions])
        self.norm, self.output = RMSNorm(eps=1e-5), nn.Linear(D, V, bias=False)

    def forward(self, tokens):
        x = self.tok_embeddings(tokens)
        freqs_cis = _polar(tokens.shape[1], x)
        for layer in self.layers:
            x = layer(x, freqs_cis)
        return self.output(self.norm(x))


def llama4(chunk: int = 8192, mistake: str = "") -> Llama4:
    torch.manual_seed(0)
    return _jitter(Llama4(chunk, mistake))


# -- Cohere2 (Command R7B): parallel block of one bias-free LayerNorm, sliding layer with rotary, global layer NoPE ---


class CohereLayerNorm(nn.Module):
    """A LayerNorm with a weight and no bias, written out."""

    def __init__(self, eps: float = 1e-5):
        super().__init__()
        self.weight, self.variance_epsilon = nn.Parameter(torch.ones(D)), eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        variance = (x - mean).pow(2).mean(-1, keepdim=True)
        return self.weight * (x - mean) * torch.rsqrt(variance + self.variance_epsilon)


class Cohere2Attention(nn.Module):
    def __init__(self, sliding: bool, tiled: bool = False):
        super().__init__()
        self.q_proj, self.o_proj = nn.Linear(D, D, bias=False), nn.Linear(D, D, bias=False)
        self.k_proj, self.v_proj = nn.Linear(D, KV * HD, bias=False), nn.Linear(D, KV * HD, bias=False)
        self.sliding, self.tiled = sliding, tiled  # tiled: the mistake, K/V heads by .repeat

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, H, HD).transpose(1, 2)
        k = self.k_proj(x).view(B, T, KV, HD).transpose(1, 2)
        v = self.v_proj(x).view(B, T, KV, HD).transpose(1, 2)
        if self.sliding:  # rotary on the sliding layers only
            q, k = _pairs(q), _pairs(k)
        if self.tiled:
            k, v = k.repeat(1, H // KV, 1, 1), v.repeat(1, H // KV, 1, 1)
        else:
            k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
        keep = _keep(T, window=WINDOW if self.sliding else None)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, D))


class Cohere2Layer(nn.Module):
    def __init__(self, attention: Cohere2Attention):
        super().__init__()
        self.input_layernorm, self.self_attn, self.mlp = CohereLayerNorm(), attention, SwiGLU()

    def forward(self, x):
        h = self.input_layernorm(x)
        return x + self.self_attn(h) + self.mlp(h)


class Cohere2Model(nn.Module):
    def __init__(self, tiled_second: bool):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        attentions = [Cohere2Attention(True), Cohere2Attention(False, tiled_second)]  # sliding, then global
        self.layers = nn.ModuleList([Cohere2Layer(a) for a in attentions])
        self.norm = CohereLayerNorm()


class Cohere2ForCausalLM(nn.Module):
    logit_scale = 0.25

    def __init__(self, tiled_second: bool):
        super().__init__()
        self.model = Cohere2Model(tiled_second)

    def forward(self, input_ids):
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x)
        return F.linear(self.model.norm(x), self.model.embed_tokens.weight) * self.logit_scale


def cohere2(tiled_second: bool = False) -> Cohere2ForCausalLM:
    torch.manual_seed(0)
    return _jitter(Cohere2ForCausalLM(tiled_second))


# -- GLM-4: qkv biases, half-head rotary in interleaved pairs, norms before and after each sublayer ------------------


class Glm4Attention(nn.Module):
    def __init__(self, keys_in_halves: bool = False):
        super().__init__()
        self.q_proj, self.o_proj = nn.Linear(D, D), nn.Linear(D, D, bias=False)
        self.k_proj, self.v_proj = nn.Linear(D, KV * HD), nn.Linear(D, KV * HD)
        self.keys_in_halves = keys_in_halves  # the mistake: the keys turned in halves, the queries in pairs

    def forward(self, x):
        B, T, _ = x.shape
        q = _pairs(self.q_proj(x).view(B, T, H, HD).transpose(1, 2), rotated=HD // 2)
        k = self.k_proj(x).view(B, T, KV, HD).transpose(1, 2)
        k = _halves(k, rotated=HD // 2) if self.keys_in_halves else _pairs(k, rotated=HD // 2)
        v = self.v_proj(x).view(B, T, KV, HD).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, D))


class Glm4MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_up_proj, self.down_proj = nn.Linear(D, 2 * F_FF, bias=False), nn.Linear(F_FF, D, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Glm4Layer(nn.Module):
    def __init__(self, keys_in_halves: bool = False):
        super().__init__()
        self.input_layernorm, self.self_attn = RMSNorm(eps=1e-5), Glm4Attention(keys_in_halves)
        self.post_self_attn_layernorm, self.post_attention_layernorm = RMSNorm(eps=1e-5), RMSNorm(eps=1e-5)
        self.mlp, self.post_mlp_layernorm = Glm4MLP(), RMSNorm(eps=1e-5)

    def forward(self, x):
        x = x + self.post_self_attn_layernorm(self.self_attn(self.input_layernorm(x)))
        return x + self.post_mlp_layernorm(self.mlp(self.post_attention_layernorm(x)))


class Glm4Model(nn.Module):
    def __init__(self, keys_in_halves_second: bool):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([Glm4Layer(), Glm4Layer(keys_in_halves_second)])
        self.norm = RMSNorm(eps=1e-5)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class Glm4ForCausalLM(nn.Module):
    def __init__(self, keys_in_halves_second: bool):
        super().__init__()
        self.model, self.lm_head = Glm4Model(keys_in_halves_second), nn.Linear(D, V, bias=False)

    def forward(self, input_ids):
        return self.lm_head(self.model(input_ids))


def glm4(keys_in_halves_second: bool = False) -> Glm4ForCausalLM:
    torch.manual_seed(0)
    return _jitter(Glm4ForCausalLM(keys_in_halves_second))


# -- EXAONE 4 and OLMo 3: the norms after the sublayers, q/k norms, a sliding layer beside a global one --------------


class PostNormAttention(nn.Module):
    """EXAONE 4's (per-head q/k norms, `whole` False) or OLMo 3's (norms over the whole projection, `whole` True);
    rotary on the sliding layers only where `nope_global`."""

    def __init__(self, sliding: bool, whole: bool, nope_global: bool, q_norm: RMSNorm | None = None):
        super().__init__()
        self.q_proj, self.o_proj = nn.Linear(D, D, bias=False), nn.Linear(D, D, bias=False)
        self.k_proj, self.v_proj = nn.Linear(D, KV * HD, bias=False), nn.Linear(D, KV * HD, bias=False)
        width_q, width_k = (D, KV * HD) if whole else (HD, HD)
        self.q_norm = q_norm if q_norm is not None else RMSNorm(width_q)
        self.k_norm = RMSNorm(width_k)
        self.sliding, self.whole, self.rope = sliding, whole, sliding or not nope_global

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.whole:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.view(B, T, H, HD), k.view(B, T, KV, HD), v.view(B, T, KV, HD)
        if not self.whole:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.rope:
            q, k = _halves(q, 1e6), _halves(k, 1e6)
        k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
        scores = (q @ k.transpose(-1, -2)) * HD**-0.5
        scores = scores.masked_fill(~_keep(T, window=WINDOW if self.sliding else None), float("-inf"))
        return self.o_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D))


class PostNormLayer(nn.Module):
    def __init__(self, attention: PostNormAttention, post_ffn_norm: RMSNorm | None = None):
        super().__init__()
        self.self_attn, self.post_attention_layernorm = attention, RMSNorm()
        self.mlp = SwiGLU()
        self.post_feedforward_layernorm = post_ffn_norm if post_ffn_norm is not None else RMSNorm()

    def forward(self, x):
        x = x + self.post_attention_layernorm(self.self_attn(x))
        return x + self.post_feedforward_layernorm(self.mlp(x))


class PostNormModel(nn.Module):
    def __init__(self, layers: list):
        super().__init__()
        self.embed_tokens, self.layers, self.norm = nn.Embedding(V, D), nn.ModuleList(layers), RMSNorm()


class PostNormForCausalLM(nn.Module):
    def __init__(self, layers: list):
        super().__init__()
        self.model, self.lm_head = PostNormModel(layers), nn.Linear(D, V, bias=False)

    def forward(self, input_ids):
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(self.model.norm(x))


def exaone4(q_norm_over_positions_second: bool = False) -> PostNormForCausalLM:
    """Sliding then global; the global layer NoPE; per-head q/k norms (the mistake: the second q_norm's mean over
    the positions, axis 1 of (B, T, H, Dh))."""
    torch.manual_seed(0)
    second_q_norm = RMSNorm(HD, axis=1) if q_norm_over_positions_second else None
    layers = [
        PostNormLayer(PostNormAttention(True, whole=False, nope_global=True)),
        PostNormLayer(PostNormAttention(False, whole=False, nope_global=True, q_norm=second_q_norm)),
    ]
    return _jitter(PostNormForCausalLM(layers))


def olmo3(eps_outside_second: bool = False) -> PostNormForCausalLM:
    """Sliding then full, rotary on both; q/k norms over the whole projection (the mistake: eps outside the root of
    the second post-feed-forward norm)."""
    torch.manual_seed(0)
    layers = [
        PostNormLayer(PostNormAttention(True, whole=True, nope_global=False)),
        PostNormLayer(PostNormAttention(False, whole=True, nope_global=False), RMSNorm(outside=eps_outside_second)),
    ]
    return _jitter(PostNormForCausalLM(layers))


# -- Hunyuan (dense): per-head q/k RMSNorms read AFTER the rotation ----------------------------------------------------


class HunyuanAttention(nn.Module):
    """query_layernorm / key_layernorm (weight (Dh,)) on the turned queries and keys: a rotation keeps each head's
    sum of squares, so the root is the reference's, but the per-feature gain meets the features after they are
    mixed in pairs: g (R x) / rms, where the reference's q_norm gives R (g x) / rms; the two agree only where the gain
    is the same on both features of each pair, so trained gains have no pair."""

    def __init__(self):
        super().__init__()
        self.q_proj, self.o_proj = nn.Linear(D, D, bias=False), nn.Linear(D, D, bias=False)
        self.k_proj, self.v_proj = nn.Linear(D, KV * HD, bias=False), nn.Linear(D, KV * HD, bias=False)
        self.query_layernorm, self.key_layernorm = RMSNorm(HD), RMSNorm(HD)

    def forward(self, x):
        B, T, _ = x.shape
        q = _halves(self.q_proj(x).view(B, T, H, HD).transpose(1, 2))
        k = _halves(self.k_proj(x).view(B, T, KV, HD).transpose(1, 2))
        q, k = self.query_layernorm(q), self.key_layernorm(k)
        v = self.v_proj(x).view(B, T, KV, HD).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, D))


class HunyuanLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm, self.self_attn = RMSNorm(eps=1e-5), HunyuanAttention()
        self.post_attention_layernorm, self.mlp = RMSNorm(eps=1e-5), SwiGLU()

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class HunyuanForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = PostNormModel([HunyuanLayer() for _ in range(2)])  # embed_tokens, layers, norm
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, input_ids):
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(self.model.norm(x))


def hunyuan() -> HunyuanForCausalLM:
    torch.manual_seed(0)
    return _jitter(HunyuanForCausalLM())


CASES = [
    ("granite_hand", granite, "transformer_lm", {"attention_scale": 1 / HD}, ("no pair", "model", "12")),
    # 1 / Dh in every layer, nothing given: the catalogue's slip (Q K^T / d_head) to the letter; the code cannot tell
    # Granite's attention_multiplier from it, so the mistake is the verdict; stated (the reference's attention_scale),
    # the same model passes
    (
        "granite_hand.attention_and_logits_only",
        lambda: granite(1.0, 1.0),
        "transformer_lm",
        {},
        ("mistake", "attention.wrong_scale", "model.layers.0.self_attn"),
    ),
    (
        "granite_hand.attention_and_logits_only.scale_given",
        lambda: granite(1.0, 1.0),
        "transformer_lm",
        {"attention_scale": 1 / HD},
        "pass",
    ),
    (
        "granite_hand.residual_multiplier_only",
        lambda: granite(embedding=1.0),
        "transformer_lm",
        {"attention_scale": 1 / HD},
        ("no pair", "model.layers.0", "0.22"),
    ),
    ("minicpm_hand", minicpm, "transformer_lm", {}, ("no pair", "model", "12")),
    ("llama4_hand", llama4, "transformer_lm", {}, "pass"),
    (
        "llama4_hand.chunks_of_4",
        lambda: llama4(chunk=4),
        "transformer_lm",
        {},
        ("no pair", "layers.0.attention", "mask"),
    ),
    (
        "llama4_hand.mixed_pairing_second_layer",
        lambda: llama4(mistake="mixed_pairing"),
        "transformer_lm",
        {},
        ("mistake", "rope.mixed_pairing", "layers.1.attention"),
    ),
    (
        "llama4_hand.nope_layer_not_causal",
        lambda: llama4(mistake="not_causal"),
        "transformer_lm",
        {},
        ("mistake", "attention.not_causal", "layers.3.attention"),
    ),
    ("cohere2_hand", cohere2, "transformer_lm", {}, "pass"),
    (
        "cohere2_hand.kv_heads_tiled_second_layer",
        lambda: cohere2(tiled_second=True),
        "transformer_lm",
        {},
        ("mistake", "attention.kv_heads_tiled", "model.layers.1.self_attn"),
    ),
    ("glm4_hand", glm4, "transformer_lm", {}, "pass"),
    (
        "glm4_hand.mixed_pairing_second_layer",
        lambda: glm4(keys_in_halves_second=True),
        "transformer_lm",
        {},
        ("mistake", "rope.mixed_pairing", "model.layers.1.self_attn"),
    ),
    ("exaone4_hand", exaone4, "transformer_lm", {}, "pass"),
    (
        "exaone4_hand.q_norm_over_positions_second_layer",
        lambda: exaone4(q_norm_over_positions_second=True),
        "transformer_lm",
        {},
        ("mistake", "rms_norm.wrong_axis", "model.layers.1.self_attn.q_norm"),
    ),
    ("olmo3_hand", olmo3, "transformer_lm", {}, "pass"),
    (
        "olmo3_hand.eps_outside_sqrt_second_layer",
        lambda: olmo3(eps_outside_second=True),
        "transformer_lm",
        {},
        ("mistake", "rms_norm.eps_outside_sqrt", "model.layers.1.post_feedforward_layernorm"),
    ),
    ("hunyuan_hand", hunyuan, "transformer_lm", {}, ("no pair", "model.layers.0.self_attn", "norm")),
]
