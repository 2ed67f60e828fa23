"""The code people read in 2025-26 outside tutorials (issue 46, round 12), in this project's own words: styles none of
the other corpus files uses. The judge meets them here first (measured with the judge frozen: what it said when it
first met each is in parity_tests/test_unseen.py's TODAY).

- a modded-nanogpt ("speedrun") GPT: `CastedLinear` (weights kept in float32, cast to the input's dtype in the
  forward), the attention's q, k and v from one stacked (3, D, D) parameter, zero-initialised output projections and
  head, q/k RMSNorms, RoPE, logits soft-capped by 30 tanh(z / 30). Its core (norms with weights, a ReLU MLP) is the
  reference's math; each of its own features is tried alone on that core, and all together as the speedrun writes
  them:
  - ReLU squared in the MLP: math the reference lacks (its activations: relu, gelu, gelu_tanh, silu, quick_gelu);
  - value embeddings: v = l0 v + l1 ve, ve read from a second token table: the reference lacks it;
  - U-net skips: the second half of the blocks reads the first half's outputs times learned weights (with two
    blocks: block 0's output times 1 + w before block 1): the reference lacks it, said at the model's root;
  - rotary with half the frequencies at 0 ((1/1024)^linspace(0, 1, Dh/4), then Dh/4 zeros), pairs (i, i + Dh/2),
    turned backwards (y1 = x1 cos + x2 sin): the reference HAS this math. A zero frequency leaves its pair as it is,
    so only pairs (0, 4) and (1, 5) turn, at 1 and 1/1024, a geometric series: the reference's partial rotary with
    rotary_dim = 4 and base 1024^2 (base^(-2/4) = 1/1024), on the q/k features relabelled (features (0, 1, 4, 5)
    taken as its first four, and the second of each pair negated: R(-t) = S R(t) S with S = diag(1, -1), which
    leaves q.k unchanged when q and k both get it). A pass: q and k are free projections, so the relabelling is a
    map of W_q and W_k rows, as the interleaved layouts the reference reads are;
  - the whole speedrun: norms without weights (F.rms_norm(x, (D,))) everywhere, the embeddings normed, each block's
    input mixed with x0 by learned lambdas, and all of the above: the first math the reference lacks in the flow is
    the weightless RMSNorm on the embeddings, in the model's own forward: said at (the module);
- a Megatron-style GPT run sequence-first ([s, b, h]): `ColumnParallelLinear` / `RowParallelLinear` at tensor-parallel
  world size 1, each returning (output, bias), a `gather_output` flag, grouped-query attention from one fused
  `linear_qkv` laid out [q heads | k heads | v heads] per partition, rotary from a module returning the angles
  (s, 1, 1, Dh), a SwiGLU from one fused `linear_fc1` (gate | up), the logits transposed back to [b, s, V];
- an x-transformers-style LM: `attn_layers.layers` a ModuleList of alternating ('a', 'f') entries, each a ModuleList
  [norm, block, residual-fn], pre-norm, rotary angles made once by a `RotaryEmbedding` module and passed to every
  attention, einsum scores masked by -finfo.max;
- a fairseq-style decoder LM: time-first (T, B, C), an `incremental_state` argument (None when scoring), scaled
  embeddings with `padding_idx`, the queries scaled before the product, the heads folded into the batch (`bmm`),
  a float future mask; positions from a module whose padding_idx offsets them (position t read at padding_idx + 1 + t):
  - learned (fairseq's LearnedPositionalEmbedding: a table of T_MAX + padding_idx + 1 rows, rows 0 and 1 never
    read): the reference's learned table with its rows relabelled, a pass;
  - sinusoidal (fairseq's get_embedding): frequencies 10000^(-i / (D/2 - 1)) (not the paper's 10000^(-i / (D/2))),
    sines then cosines, at positions t + 2: no table of the reference's (interleaved or split, from position 0) is
    these numbers, and the table is fixed: no pair, said at decoder.embed_positions;
- a timm-style ViT: class token, pos_embed, fused `qkv` with bias, `attn_drop`, `ls1` / `ls2` as nn.Identity (timm's
  init_values=None: a pass); with LayerScale at init_values=1.0 (gamma all ones: the forward is the reference's, but
  gamma is a trained parameter the reference has no pair for, its gradient compared with nothing: after one step of
  training the model is no longer the reference's, so no pair, said at blocks.0.ls1); and at 0.1 (no pair);
- a torchtitan-style Llama 3: `tok_embeddings`, `layers` an nn.ModuleDict keyed "0", "1", `attention.wq/wk/wv/wo`,
  `feed_forward.w1/w2/w3`, `attention_norm` / `ffn_norm`, grouped-query attention by `repeat_kv`, a persistent complex
  `freqs_cis` buffer (base 500000) applied by view_as_complex (the product in the input's own precision);
- mistakes put into them, each named where it sits: the speedrun core's second k-norm with eps outside the root,
  Megatron's second attention tiling its K/V heads, x-transformers' second attention masking after the softmax,
  fairseq's second layer without its future mask, the ViT's second attention dropping out in evaluation, torchtitan's
  second feed-forward with its SiLU on the up projection (w3) in place of the gate (w1). Beside them, torchtitan's
  second attention reading freqs_cis from row 1 for q and k alike: q.k reads the difference of the angles, a pass.

First met: 14 of 22 right (the judge frozen). Wrong then:
- speedrun_core.stacked_qkv_w: could not judge, "cannot read blocks.0.attn.qkv_w (32 rows) as the q, k, v
  projection(s) ...; pass mapping=": the (3, D, D) parameter flattened to (3D, D) is a fused qkv, unread;
- speedrun_core.half_zero_rotary: unexplained at blocks.0.attn (read as interleaved pairs at base 1.1e12); the
  reference's partial rotary (rotary_dim 4, base 1024^2) on relabelled q/k features unfound;
- speedrun_core.value_embeds: no pair at blocks.0.attn, but said as "a sublayer's output is multiplied by a learned
  gain per feature, blocks.0.attn.lambdas": the value embeddings mixed into v are not said;
- speedrun_gpt: no pair said at blocks.0 (the block's weightless rms_norm), where the first is the model's own
  rms_norm of the embeddings, at (the module);
- speedrun_core.k_norm_eps_outside_sqrt_second_block: unexplained at blocks.1.attn ("an error this small is typically
  float32 rounding"): eps outside the root of a per-head k-norm unnamed (unnamed too at eps 1e-3, and with a norm
  class of its own in place of the nn.RMSNorm subclass: not the size of eps);
- fairseq_lm.sinusoidal_positions: unexplained at decoder.embed_tokens (read as rope): the table of other frequencies
  at positions t + 2 not said at decoder.embed_positions;
- timm_vit.identity_layer_scale, timm_vit.layer_scale: unexplained at blocks.0 ("diverges from the reference
  tower"): LayerScale's gamma, said in a language model (fresh5's layer_scale_lm), is not said in a ViT tower.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

D, H, KV, V, T_MAX, PAD = 32, 4, 2, 26, 32, 1
HD = D // H
FF = 64


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases moved off their 1s and 0s, so that trained values are what is checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1 and p.numel() > 2:
                p.add_(0.1 * torch.randn_like(p))
    return model


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


# -- modded-nanogpt: the speedrun GPT ----------------------------------------------------------------------------------


def norm(x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.size(-1),))


class CastedLinear(nn.Linear):
    """Kept in float32 when the rest of the model is cast down; cast to the input's dtype in the forward."""

    def __init__(self, in_features, out_features, zero_init=False):
        super().__init__(in_features, out_features, bias=False)
        if zero_init:
            nn.init.zeros_(self.weight)

    def forward(self, x):
        return F.linear(x, self.weight.type_as(x))


class SpeedrunRotary(nn.Module):
    def __init__(self, dim, half_zero=False):
        super().__init__()
        if half_zero:  # the speedrun's: a quarter of the dims turned, the rest at frequency 0, turned backwards
            freq = (1 / 1024) ** torch.linspace(0, 1, steps=dim // 4, dtype=torch.float64)
            freq = torch.cat([freq, freq.new_zeros(dim // 4)])
        else:
            freq = 1.0 / 10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        theta = torch.outer(torch.arange(T_MAX, dtype=torch.float64), freq)
        self.register_buffer("cos", theta.cos(), persistent=False)
        self.register_buffer("sin", theta.sin(), persistent=False)
        self.backwards = half_zero

    def forward(self, x_BTHD):
        T = x_BTHD.size(1)
        cos, sin = self.cos[None, :T, None, :].to(x_BTHD.dtype), self.sin[None, :T, None, :].to(x_BTHD.dtype)
        x1, x2 = x_BTHD.chunk(2, dim=-1)
        if self.backwards:
            return torch.cat((x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos), dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class EpsOutsideRMSNorm(nn.RMSNorm):
    """The mistake: x / (rms(x) + eps) in place of x / sqrt(ms(x) + eps)."""

    def forward(self, x):
        return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.eps) * self.weight


class SpeedrunAttention(nn.Module):
    def __init__(self, weightless=False, half_zero=False, value_embed=False, k_eps_outside=False, stacked=False):
        super().__init__()
        if stacked:  # the later records' one (3, D, D) parameter
            bound = (3**0.5) * 0.5 * D**-0.5
            self.qkv_w = nn.Parameter(torch.empty(3, D, D).uniform_(-bound, bound))
        else:  # the earlier records' three CastedLinears
            self.c_q, self.c_k, self.c_v = CastedLinear(D, D), CastedLinear(D, D), CastedLinear(D, D)
        self.stacked = stacked
        self.rotary = SpeedrunRotary(HD, half_zero)
        self.c_proj = CastedLinear(D, D, zero_init=True)
        self.weightless = weightless
        if not weightless:
            self.q_norm = nn.RMSNorm(HD, eps=1e-6)
            self.k_norm = (EpsOutsideRMSNorm if k_eps_outside else nn.RMSNorm)(HD, eps=1e-6)
        self.lambdas = nn.Parameter(torch.tensor([0.5, 0.5])) if value_embed else None

    def forward(self, x, ve=None):
        B, T = x.size(0), x.size(1)
        if self.stacked:
            qkv = F.linear(x, self.qkv_w.flatten(end_dim=1).type_as(x))
            q, k, v = qkv.view(B, T, 3 * H, HD).chunk(3, dim=-2)
        else:
            q, k, v = (f(x).view(B, T, H, HD) for f in (self.c_q, self.c_k, self.c_v))
        q, k = (norm(q), norm(k)) if self.weightless else (self.q_norm(q), self.k_norm(k))
        q, k = self.rotary(q), self.rotary(k)
        if self.lambdas is not None:
            v = self.lambdas[0] * v + self.lambdas[1] * ve.view_as(v)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, D))


class SpeedrunMLP(nn.Module):
    def __init__(self, relu_squared=False):
        super().__init__()
        self.c_fc = CastedLinear(D, 4 * D)
        self.c_proj = CastedLinear(4 * D, D, zero_init=True)
        self.relu_squared = relu_squared

    def forward(self, x):
        x = F.relu(self.c_fc(x))
        return self.c_proj(x.square() if self.relu_squared else x)


class SpeedrunBlock(nn.Module):
    def __init__(self, weightless=False, relu_squared=False, **attention):
        super().__init__()
        self.attn = SpeedrunAttention(weightless, **attention)
        self.mlp = SpeedrunMLP(relu_squared)
        self.weightless = weightless
        if weightless:  # the speedrun's x0 mix: each block's input is l0 x + l1 x0
            self.lambdas = nn.Parameter(torch.tensor([1.0, 0.0]))
        else:
            self.attn_norm, self.mlp_norm = nn.RMSNorm(D, eps=1e-6), nn.RMSNorm(D, eps=1e-6)

    def forward(self, x, ve, x0):
        if self.weightless:
            x = self.lambdas[0] * x + self.lambdas[1] * x0
            x = x + self.attn(norm(x), ve)
            return x + self.mlp(norm(x))
        x = x + self.attn(self.attn_norm(x), ve)
        return x + self.mlp(self.mlp_norm(x))


class SpeedrunGPT(nn.Module):
    def __init__(
        self,
        weightless=False,
        relu_squared=False,
        value_embed=False,
        unet=False,
        half_zero=False,
        eps2=False,
        stacked=False,
    ):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.value_embeds = nn.ModuleList([nn.Embedding(V, D)]) if value_embed else None
        self.blocks = nn.ModuleList(
            [
                SpeedrunBlock(weightless, relu_squared, half_zero=half_zero, value_embed=value_embed, stacked=stacked),
                SpeedrunBlock(
                    weightless,
                    relu_squared,
                    half_zero=half_zero,
                    value_embed=value_embed,
                    stacked=stacked,
                    k_eps_outside=eps2,
                ),
            ]
        )
        self.skip_weights = nn.Parameter(torch.ones(len(self.blocks) // 2)) if unet else None
        self.weightless = weightless
        if not weightless:
            self.norm = nn.RMSNorm(D, eps=1e-6)
        self.lm_head = CastedLinear(D, V, zero_init=True)

    def forward(self, input_seq):
        ve = self.value_embeds[0](input_seq) if self.value_embeds is not None else None
        x = x0 = norm(self.embed(input_seq)) if self.weightless else self.embed(input_seq)
        if self.skip_weights is None:
            for block in self.blocks:
                x = block(x, ve, x0)
        else:  # U-net: the encoder half's outputs pushed, popped into the decoder half
            n = len(self.skip_weights)
            skips = []
            for i in range(n):
                x = self.blocks[i](x, ve, x0)
                skips.append(x)
            for i in range(n):
                x = x + self.skip_weights[i] * skips.pop()
                x = self.blocks[n + i](x, ve, x0)
        x = norm(x) if self.weightless else self.norm(x)
        logits = self.lm_head(x).float() if x.dtype != torch.float64 else self.lm_head(x)
        return 30 * torch.tanh(logits / 30)


def speedrun(**features) -> SpeedrunGPT:
    torch.manual_seed(0)
    return _jitter(SpeedrunGPT(**features))


def speedrun_full() -> SpeedrunGPT:
    return speedrun(weightless=True, relu_squared=True, value_embed=True, unet=True, half_zero=True, stacked=True)


# -- Megatron: tensor-parallel linears at world size 1, sequence-first -------------------------------------------------

WORLD_SIZE = 1


def copy_to_tensor_model_parallel_region(x):  # the identity forward, all-reduce backward: one rank
    return x


def gather_from_tensor_model_parallel_region(x):  # all-gather along the last dim: one rank's piece
    return torch.cat([x], dim=-1)


def reduce_from_tensor_model_parallel_region(x):  # all-reduce: one rank
    return x


class ColumnParallelLinear(nn.Module):
    def __init__(self, input_size, output_size, bias=True, gather_output=True, skip_bias_add=False):
        super().__init__()
        self.output_size_per_partition = output_size // WORLD_SIZE
        self.gather_output, self.skip_bias_add = gather_output, skip_bias_add
        self.weight = nn.Parameter(torch.empty(self.output_size_per_partition, input_size))
        nn.init.normal_(self.weight, std=input_size**-0.5)
        self.bias = nn.Parameter(torch.zeros(self.output_size_per_partition)) if bias else None

    def forward(self, input_):
        input_parallel = copy_to_tensor_model_parallel_region(input_)
        bias = self.bias if not self.skip_bias_add else None
        output_parallel = F.linear(input_parallel, self.weight, bias)
        output = gather_from_tensor_model_parallel_region(output_parallel) if self.gather_output else output_parallel
        return output, (self.bias if self.skip_bias_add else None)


class RowParallelLinear(nn.Module):
    def __init__(self, input_size, output_size, bias=True, input_is_parallel=True):
        super().__init__()
        self.input_size_per_partition = input_size // WORLD_SIZE
        self.input_is_parallel = input_is_parallel
        self.weight = nn.Parameter(torch.empty(output_size, self.input_size_per_partition))
        nn.init.normal_(self.weight, std=input_size**-0.5)
        self.bias = nn.Parameter(torch.zeros(output_size)) if bias else None

    def forward(self, input_):
        output_parallel = F.linear(input_, self.weight)
        output = reduce_from_tensor_model_parallel_region(output_parallel)
        return (output + self.bias if self.bias is not None else output), None


class VocabParallelEmbedding(nn.Embedding):
    pass


class MegatronRotaryEmbedding(nn.Module):
    def __init__(self, kv_channels, rotary_base=10000):
        super().__init__()
        dim = kv_channels
        self.register_buffer(
            "inv_freq", 1.0 / rotary_base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim), persistent=False
        )

    def forward(self, max_seq_len):
        seq = torch.arange(max_seq_len, dtype=self.inv_freq.dtype)
        freqs = torch.outer(seq, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb[:, None, None, :]  # [s, 1, 1, dim]


def apply_rotary_pos_emb_bshd(t, freqs):
    cos, sin = freqs.cos().to(t.dtype), freqs.sin().to(t.dtype)
    return t * cos + rotate_half(t) * sin


class MegatronSelfAttention(nn.Module):
    def __init__(self, tiled=False):
        super().__init__()
        self.np = H // WORLD_SIZE  # heads per partition
        self.ng = KV // WORLD_SIZE  # query groups per partition
        self.linear_qkv = ColumnParallelLinear(D, (H + 2 * KV) * HD, bias=False, gather_output=False)
        self.linear_proj = RowParallelLinear(H * HD, D, bias=False, input_is_parallel=True)
        self.tiled = tiled  # the mistake: the K/V heads tiled (.repeat) where each is to serve its group in turn

    def forward(self, hidden_states, rotary_pos_emb):
        mixed_qkv, _ = self.linear_qkv(hidden_states)  # [s, b, (np + 2 ng) hn]
        s, b, _ = mixed_qkv.shape
        query, key, value = torch.split(mixed_qkv, [self.np * HD, self.ng * HD, self.ng * HD], dim=-1)
        query, key, value = query.view(s, b, self.np, HD), key.view(s, b, self.ng, HD), value.view(s, b, self.ng, HD)
        query = apply_rotary_pos_emb_bshd(query, rotary_pos_emb)
        key = apply_rotary_pos_emb_bshd(key, rotary_pos_emb)
        query, key, value = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, np, s, hn]
        if self.tiled:
            key, value = key.repeat(1, self.np // self.ng, 1, 1), value.repeat(1, self.np // self.ng, 1, 1)
        else:
            key = key.repeat_interleave(self.np // self.ng, dim=1)
            value = value.repeat_interleave(self.np // self.ng, dim=1)
        context = F.scaled_dot_product_attention(query, key, value, is_causal=True)
        context = context.permute(2, 0, 1, 3).reshape(s, b, self.np * HD)  # [s, b, hp]
        return self.linear_proj(context)


class MegatronMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear_fc1 = ColumnParallelLinear(D, 2 * FF, bias=False, gather_output=False)
        self.linear_fc2 = RowParallelLinear(FF, D, bias=False)

    def forward(self, hidden_states):
        intermediate, _ = self.linear_fc1(hidden_states)
        gate, up = torch.chunk(intermediate, 2, dim=-1)
        return self.linear_fc2(F.silu(gate) * up)


class MegatronLayer(nn.Module):
    def __init__(self, tiled=False):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(D, eps=1e-5)
        self.self_attention = MegatronSelfAttention(tiled)
        self.pre_mlp_layernorm = nn.RMSNorm(D, eps=1e-5)
        self.mlp = MegatronMLP()

    def forward(self, hidden_states, rotary_pos_emb):
        residual = hidden_states
        attention_output, attention_bias = self.self_attention(self.input_layernorm(hidden_states), rotary_pos_emb)
        hidden_states = residual + (attention_output if attention_bias is None else attention_output + attention_bias)
        residual = hidden_states
        mlp_output, mlp_bias = self.mlp(self.pre_mlp_layernorm(hidden_states))
        return residual + (mlp_output if mlp_bias is None else mlp_output + mlp_bias)


class MegatronTransformerBlock(nn.Module):
    def __init__(self, tiled_second=False):
        super().__init__()
        self.layers = nn.ModuleList([MegatronLayer(), MegatronLayer(tiled_second)])
        self.final_layernorm = nn.RMSNorm(D, eps=1e-5)

    def forward(self, hidden_states, rotary_pos_emb):
        for layer in self.layers:
            hidden_states = layer(hidden_states, rotary_pos_emb)
        return self.final_layernorm(hidden_states)


class MegatronEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.word_embeddings = VocabParallelEmbedding(V, D)

    def forward(self, input_ids):
        return self.word_embeddings(input_ids).transpose(0, 1).contiguous()  # [b, s, h] -> [s, b, h]


class MegatronGPTModel(nn.Module):
    def __init__(self, tiled_second=False):
        super().__init__()
        self.embedding = MegatronEmbedding()
        self.rotary_pos_emb = MegatronRotaryEmbedding(HD)
        self.decoder = MegatronTransformerBlock(tiled_second)
        self.output_layer = ColumnParallelLinear(D, V, bias=False, gather_output=True)

    def forward(self, input_ids, labels=None):
        decoder_input = self.embedding(input_ids)
        rotary_pos_emb = self.rotary_pos_emb(decoder_input.size(0))
        hidden_states = self.decoder(decoder_input, rotary_pos_emb)
        logits, _ = self.output_layer(hidden_states)
        return logits.transpose(0, 1).contiguous()  # [s, b, v] -> [b, s, v]


def megatron(tiled_second=False) -> MegatronGPTModel:
    torch.manual_seed(0)
    return _jitter(MegatronGPTModel(tiled_second))


# -- x-transformers: alternating ('a', 'f') layers of [norm, block, residual] ------------------------------------------


class RotaryEmbedding(nn.Module):
    def __init__(self, dim, theta=10000):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))

    def forward(self, t):
        freqs = torch.einsum("i , j -> i j", t.type_as(self.inv_freq), self.inv_freq)
        return torch.cat((freqs, freqs), dim=-1)


def apply_rotary_pos_emb(t, freqs):
    return t * freqs.cos().to(t.dtype) + rotate_half(t) * freqs.sin().to(t.dtype)


class XAttention(nn.Module):
    def __init__(self, mask_after_softmax=False):
        super().__init__()
        self.heads, self.scale = H, HD**-0.5
        self.to_q, self.to_k, self.to_v = (nn.Linear(D, D, bias=False) for _ in range(3))
        self.to_out = nn.Linear(D, D, bias=False)
        self.mask_after_softmax = mask_after_softmax

    def forward(self, x, rotary_pos_emb=None):
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, self.heads, HD).transpose(1, 2) for t in (self.to_q(x), self.to_k(x), self.to_v(x)))
        if rotary_pos_emb is not None:
            q, k = apply_rotary_pos_emb(q, rotary_pos_emb), apply_rotary_pos_emb(k, rotary_pos_emb)
        dots = torch.einsum("b h i d, b h j d -> b h i j", q, k) * self.scale
        causal_mask = torch.ones(n, n, dtype=torch.bool).triu(1)
        max_neg_value = -torch.finfo(dots.dtype).max
        if self.mask_after_softmax:  # the mistake: the future's probabilities zeroed after the softmax
            attn = dots.softmax(dim=-1).masked_fill(causal_mask, 0.0)
        else:
            attn = dots.masked_fill(causal_mask, max_neg_value).softmax(dim=-1)
        out = torch.einsum("b h i j, b h j d -> b h i d", attn, v)
        return self.to_out(out.transpose(1, 2).reshape(b, n, D))


class XFeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.ff = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        return self.ff(x)


class Residual(nn.Module):
    def forward(self, x, residual):
        return x + residual


class XDecoder(nn.Module):
    def __init__(self, depth=2, mask_after_softmax_second=False):
        super().__init__()
        self.rotary_pos_emb = RotaryEmbedding(HD)
        self.layer_types = ("a", "f") * depth
        self.layers = nn.ModuleList()
        for i, kind in enumerate(self.layer_types):
            block = XAttention(mask_after_softmax_second and i == 2) if kind == "a" else XFeedForward()
            self.layers.append(nn.ModuleList([nn.LayerNorm(D), block, Residual()]))
        self.final_norm = nn.LayerNorm(D)

    def forward(self, x):
        rotary_pos_emb = self.rotary_pos_emb(torch.arange(x.shape[1]))
        for kind, (norm_, block, residual_fn) in zip(self.layer_types, self.layers, strict=True):
            residual = x
            x = norm_(x)
            x = block(x, rotary_pos_emb=rotary_pos_emb) if kind == "a" else block(x)
            x = residual_fn(x, residual)
        return self.final_norm(x)


class TokenEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)

    def forward(self, x):
        return self.emb(x)


class TransformerWrapper(nn.Module):
    def __init__(self, mask_after_softmax_second=False):
        super().__init__()
        self.token_emb = TokenEmbedding()
        self.attn_layers = XDecoder(mask_after_softmax_second=mask_after_softmax_second)
        self.to_logits = nn.Linear(D, V, bias=False)

    def forward(self, x, return_embeddings=False):
        x = self.attn_layers(self.token_emb(x))
        return x if return_embeddings else self.to_logits(x)


def xtransformer(mask_after_softmax_second=False) -> TransformerWrapper:
    torch.manual_seed(0)
    return _jitter(TransformerWrapper(mask_after_softmax_second))


# -- fairseq: a time-first decoder LM with incremental_state, positions offset by padding_idx -------------------------


def make_positions_from(T, padding_idx, incremental_state):
    """padding_idx + 1 + t (fairseq's make_positions on a sequence without pads); the last alone when decoding."""
    if incremental_state is not None:
        return torch.tensor([padding_idx + T])
    return padding_idx + 1 + torch.arange(T)


class LearnedPositionalEmbedding(nn.Embedding):
    def __init__(self, num_embeddings, embedding_dim, padding_idx):
        super().__init__(num_embeddings + padding_idx + 1, embedding_dim, padding_idx)
        self.max_positions = num_embeddings

    def forward(self, input, incremental_state=None):
        positions = make_positions_from(input.size(1), self.padding_idx, incremental_state)
        return F.embedding(positions, self.weight, self.padding_idx)[None].expand(input.size(0), -1, -1)


class SinusoidalPositionalEmbedding(nn.Module):
    def __init__(self, embedding_dim, padding_idx, init_size=T_MAX + PAD + 1):
        super().__init__()
        self.padding_idx = padding_idx
        self.register_buffer("weights", self.get_embedding(init_size, embedding_dim, padding_idx), persistent=False)

    @staticmethod
    def get_embedding(num_embeddings, embedding_dim, padding_idx):
        half_dim = embedding_dim // 2
        emb = math.log(10000) / (half_dim - 1)
        emb = torch.exp(torch.arange(half_dim, dtype=torch.float64) * -emb)
        emb = torch.arange(num_embeddings, dtype=torch.float64)[:, None] * emb[None, :]
        emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=1)
        emb[padding_idx, :] = 0
        return emb

    def forward(self, input, incremental_state=None):
        positions = make_positions_from(input.size(1), self.padding_idx, incremental_state)
        return self.weights.index_select(0, positions)[None].expand(input.size(0), -1, -1).detach()


class FairseqMultiheadAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.num_heads, self.head_dim = H, HD
        self.scaling = HD**-0.5
        self.k_proj, self.v_proj, self.q_proj, self.out_proj = (nn.Linear(D, D) for _ in range(4))

    def forward(self, query, key, value, incremental_state=None, attn_mask=None):
        tgt_len, bsz, embed_dim = query.size()
        q = self.q_proj(query) * self.scaling
        k, v = self.k_proj(key), self.v_proj(value)
        if incremental_state is not None:  # the keys and values of the steps before
            saved = incremental_state.setdefault(id(self), {})
            if "prev_key" in saved:
                k, v = torch.cat([saved["prev_key"], k], 0), torch.cat([saved["prev_value"], v], 0)
            saved["prev_key"], saved["prev_value"] = k, v
        q = q.contiguous().view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        k = k.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        v = v.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        attn_weights = torch.bmm(q, k.transpose(1, 2))
        if attn_mask is not None:
            attn_weights = attn_weights + attn_mask.unsqueeze(0)
        attn_probs = F.softmax(attn_weights, dim=-1)
        attn = torch.bmm(attn_probs, v).transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
        return self.out_proj(attn), None


class FairseqDecoderLayer(nn.Module):
    def __init__(self, drop_future_mask=False):
        super().__init__()
        self.self_attn = FairseqMultiheadAttention()
        self.self_attn_layer_norm = nn.LayerNorm(D)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.final_layer_norm = nn.LayerNorm(D)
        self.drop_future_mask = drop_future_mask  # the mistake: this layer never applies the future mask

    def forward(self, x, incremental_state=None, self_attn_mask=None):
        residual = x
        x = self.self_attn_layer_norm(x)
        mask = None if self.drop_future_mask else self_attn_mask
        x, attn = self.self_attn(query=x, key=x, value=x, incremental_state=incremental_state, attn_mask=mask)
        x = residual + x
        residual = x
        x = self.fc2(F.relu(self.fc1(self.final_layer_norm(x))))
        return residual + x, attn


class FairseqTransformerDecoder(nn.Module):
    def __init__(self, sinusoidal=False, drop_future_mask_second=False):
        super().__init__()
        self.padding_idx = PAD
        self.embed_tokens = nn.Embedding(V, D, padding_idx=PAD)
        self.embed_scale = math.sqrt(D)
        if sinusoidal:
            self.embed_positions = SinusoidalPositionalEmbedding(D, PAD)
        else:
            self.embed_positions = LearnedPositionalEmbedding(T_MAX, D, PAD)
        self.layers = nn.ModuleList([FairseqDecoderLayer(), FairseqDecoderLayer(drop_future_mask_second)])
        self.layer_norm = nn.LayerNorm(D)
        self.output_projection = nn.Linear(D, V, bias=False)

    def buffered_future_mask(self, tensor):
        dim = tensor.size(0)
        return torch.triu(torch.full([dim, dim], float("-inf"), dtype=tensor.dtype), 1)

    def forward(self, prev_output_tokens, incremental_state=None):
        positions = self.embed_positions(prev_output_tokens, incremental_state=incremental_state)
        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
        x = self.embed_scale * self.embed_tokens(prev_output_tokens) + positions.to(self.embed_tokens.weight.dtype)
        x = x.transpose(0, 1)  # B x T x C -> T x B x C
        inner_states = [x]
        for layer in self.layers:
            mask = self.buffered_future_mask(x) if incremental_state is None else None
            x, _ = layer(x, incremental_state, self_attn_mask=mask)
            inner_states.append(x)
        x = self.layer_norm(x).transpose(0, 1)  # T x B x C -> B x T x C
        return self.output_projection(x), {"attn": [None], "inner_states": inner_states}


class FairseqLanguageModel(nn.Module):
    def __init__(self, **options):
        super().__init__()
        self.decoder = FairseqTransformerDecoder(**options)

    def forward(self, src_tokens, incremental_state=None):
        return self.decoder(src_tokens, incremental_state)


def fairseq_lm(**options) -> FairseqLanguageModel:
    torch.manual_seed(0)
    return _jitter(FairseqLanguageModel(**options))


# -- timm: a ViT with a class token, pos_embed, fused qkv, attn_drop and LayerScale ------------------------------------


class LayerScale(nn.Module):
    def __init__(self, dim, init_values=1e-5):
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x):
        return x * self.gamma


class TimmAttention(nn.Module):
    def __init__(self, attn_drop=0.1, dropout_in_eval=False):
        super().__init__()
        self.num_heads, self.head_dim = H, HD
        self.scale = HD**-0.5
        self.qkv = nn.Linear(D, 3 * D, bias=True)
        self.q_norm, self.k_norm = nn.Identity(), nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(D, D)
        self.proj_drop = nn.Dropout(0.0)
        self.dropout_in_eval = dropout_in_eval  # the mistake: F.dropout(..., training=True) whatever the mode

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        attn = attn.softmax(dim=-1)
        if self.dropout_in_eval:
            attn = F.dropout(attn, self.attn_drop.p, training=True)
        else:
            attn = self.attn_drop(attn)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))


class TimmMlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class TimmBlock(nn.Module):
    def __init__(self, init_values=None, dropout_in_eval=False):
        super().__init__()
        self.norm1 = nn.LayerNorm(D, eps=1e-6)
        self.attn = TimmAttention(dropout_in_eval=dropout_in_eval)
        self.ls1 = LayerScale(D, init_values) if init_values else nn.Identity()
        self.drop_path1 = nn.Identity()
        self.norm2 = nn.LayerNorm(D, eps=1e-6)
        self.mlp = TimmMlp()
        self.ls2 = LayerScale(D, init_values) if init_values else nn.Identity()
        self.drop_path2 = nn.Identity()

    def forward(self, x):
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class PatchEmbed(nn.Module):
    def __init__(self, img_size=8, patch_size=4, in_chans=3):
        super().__init__()
        self.num_patches = (img_size // patch_size) ** 2
        self.proj = nn.Conv2d(in_chans, D, kernel_size=patch_size, stride=patch_size)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)  # NCHW -> NLC


class VisionTransformer(nn.Module):
    def __init__(self, init_values=None, dropout_in_eval_second=False, num_classes=5):
        super().__init__()
        self.patch_embed = PatchEmbed()
        self.cls_token = nn.Parameter(0.02 * torch.randn(1, 1, D))
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, 1 + self.patch_embed.num_patches, D))
        self.pos_drop = nn.Dropout(0.0)
        self.blocks = nn.Sequential(TimmBlock(init_values), TimmBlock(init_values, dropout_in_eval_second))
        self.norm = nn.LayerNorm(D, eps=1e-6)
        self.head = nn.Linear(D, num_classes)

    def forward_features(self, x):
        x = self.patch_embed(x)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = self.pos_drop(x + self.pos_embed)
        return self.norm(self.blocks(x))

    def forward_head(self, x):
        return self.head(x[:, 0])

    def forward(self, x):
        return self.forward_head(self.forward_features(x))


def timm_vit(**options) -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(**options)


# -- torchtitan: Llama 3 with a ModuleDict of layers and a persistent complex freqs_cis -------------------------------


@dataclass
class TitanArgs:
    dim: int = D
    n_layers: int = 2
    n_heads: int = H
    n_kv_heads: int = KV
    vocab_size: int = V
    hidden_dim: int = FF
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    max_seq_len: int = T_MAX


def precompute_freqs_cis(dim: int, end: int, theta: float) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64)[: (dim // 2)] / dim))
    freqs = torch.outer(torch.arange(end, dtype=torch.float64), freqs)
    return torch.polar(torch.ones_like(freqs), freqs)  # complex128


def reshape_for_broadcast(freqs_cis: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    seqlen = x.shape[1]
    return freqs_cis[0:seqlen].view(1, seqlen, 1, x.shape[-1])


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = reshape_for_broadcast(freqs_cis, xq_).to(xq_.dtype)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return x[:, :, :, None, :].expand(bs, slen, n_kv_heads, n_rep, head_dim).reshape(bs, slen, -1, head_dim)


class TitanAttention(nn.Module):
    def __init__(self, args: TitanArgs, shift=0):
        super().__init__()
        self.n_heads, self.n_kv_heads = args.n_heads, args.n_kv_heads
        self.n_rep = self.n_heads // self.n_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        self.shift = shift  # freqs_cis read from row `shift` on, for q and k alike

    def forward(self, x, freqs_cis):
        bs, seqlen, _ = x.shape
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis[self.shift :])
        keys, values = repeat_kv(xk, self.n_rep), repeat_kv(xv, self.n_rep)
        xq, xk, xv = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        output = F.scaled_dot_product_attention(xq, xk, xv, is_causal=True)
        return self.wo(output.transpose(1, 2).contiguous().view(bs, seqlen, -1))


class TitanFeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, on_up=False):
        super().__init__()
        self.on_up = on_up  # the mistake: SiLU on w3's output (the up projection), w1's (the gate) left linear
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x):
        if self.on_up:
            return self.w2(self.w1(x) * F.silu(self.w3(x)))
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TitanBlock(nn.Module):
    def __init__(self, layer_id: int, args: TitanArgs, shift=0, on_up=False):
        super().__init__()
        self.attention = TitanAttention(args, shift)
        self.feed_forward = TitanFeedForward(args.dim, args.hidden_dim, on_up)
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.layer_id = layer_id

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class TitanTransformer(nn.Module):
    def __init__(self, args: TitanArgs, shift_second=0, on_up_second=False):
        super().__init__()
        self.model_args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.register_buffer(
            "freqs_cis", precompute_freqs_cis(args.dim // args.n_heads, args.max_seq_len, args.rope_theta), True
        )
        self.layers = nn.ModuleDict(
            {str(i): TitanBlock(i, args, *((shift_second, on_up_second) if i == 1 else (0, False))) for i in range(2)}
        )
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def torchtitan(shift_second=0, on_up_second=False) -> TitanTransformer:
    torch.manual_seed(0)
    return _jitter(TitanTransformer(TitanArgs(), shift_second, on_up_second))


CASES = [
    ("speedrun_core", speedrun, "transformer_lm", {}, "pass"),
    ("speedrun_core.stacked_qkv_w", lambda: speedrun(stacked=True), "transformer_lm", {}, "pass"),
    ("speedrun_core.half_zero_rotary", lambda: speedrun(half_zero=True), "transformer_lm", {}, "pass"),
    (
        "speedrun_core.relu_squared",
        lambda: speedrun(relu_squared=True),
        "transformer_lm",
        {},
        ("no pair", "blocks.0.mlp", "relu"),
    ),
    (
        "speedrun_core.value_embeds",
        lambda: speedrun(value_embed=True),
        "transformer_lm",
        {},
        ("no pair", "blocks.0.attn", "value"),
    ),
    ("speedrun_core.unet_skips", lambda: speedrun(unet=True), "transformer_lm", {}, ("no pair", "", "skip")),
    ("speedrun_gpt", speedrun_full, "transformer_lm", {}, ("no pair", "", "rms_norm")),
    (
        "speedrun_core.k_norm_eps_outside_sqrt_second_block",
        lambda: speedrun(eps2=True),
        "transformer_lm",
        {},
        ("mistake", "rms_norm.eps_outside_sqrt", "blocks.1.attn.k_norm"),
    ),
    ("megatron_gpt", megatron, "transformer_lm", {}, "pass"),
    (
        "megatron_gpt.kv_heads_tiled_second_layer",
        lambda: megatron(tiled_second=True),
        "transformer_lm",
        {},
        ("mistake", "attention.kv_heads_tiled", "decoder.layers.1.self_attention"),
    ),
    ("xtransformer_lm", xtransformer, "transformer_lm", {}, "pass"),
    (
        "xtransformer_lm.mask_after_softmax_second_attention",
        lambda: xtransformer(mask_after_softmax_second=True),
        "transformer_lm",
        {},
        ("mistake", "attention.mask_after_softmax", "attn_layers.layers.2.1"),
    ),
    ("fairseq_lm.learned_positions", fairseq_lm, "transformer_lm", {}, "pass"),
    (
        "fairseq_lm.not_causal_second_layer",
        lambda: fairseq_lm(drop_future_mask_second=True),
        "transformer_lm",
        {},
        ("mistake", "attention.not_causal", "decoder.layers.1.self_attn"),
    ),
    (
        "fairseq_lm.sinusoidal_positions",
        lambda: fairseq_lm(sinusoidal=True),
        "transformer_lm",
        {},
        ("no pair", "decoder.embed_positions", "position"),
    ),
    ("timm_vit", timm_vit, "transformer_lm", {}, "pass"),
    (
        "timm_vit.dropout_active_in_eval_second_block",
        lambda: timm_vit(dropout_in_eval_second=True),
        "transformer_lm",
        {},
        ("mistake", "dropout.active_in_eval", "blocks.1.attn"),
    ),
    # gamma = 1: the forward is the reference's, but gamma is trained and its gradient has no reference tensor to be
    # compared with; one step of training moves it off 1 (the judge draws its own weights, gamma too): no pair.
    (
        "timm_vit.identity_layer_scale",
        lambda: timm_vit(init_values=1.0),
        "transformer_lm",
        {},
        ("no pair", "blocks.0.ls1", "gamma"),
    ),
    (
        "timm_vit.layer_scale",
        lambda: timm_vit(init_values=0.1),
        "transformer_lm",
        {},
        ("no pair", "blocks.0.ls1", "gamma"),
    ),
    ("torchtitan_llama3", torchtitan, "transformer_lm", {}, "pass"),
    # Both q and k turned from row 1 of freqs_cis: q.k reads only the difference of their angles, unchanged, a pass.
    # (First written expecting rope.position_offset: that mistake is the keys alone moved; the judge's pass is right.)
    (
        "torchtitan_llama3.freqs_cis_from_row_one_second_layer",
        lambda: torchtitan(shift_second=1),
        "transformer_lm",
        {},
        "pass",
    ),
    (
        "torchtitan_llama3.activation_on_up_second_layer",
        lambda: torchtitan(on_up_second=True),
        "transformer_lm",
        {},
        ("mistake", "gated_feed_forward.activation_on_up", "layers.1.feed_forward"),
    ),
]
