"""Model code as inference and serving engines and fast-inference repositories write it, 2025-26 (issue 46, round 14),
in this project's own words: styles none of the other corpus files uses. The judge meets them here first (measured
with the judge frozen: what it said when it first met each is in parity_tests/test_unseen.py's TODAY).

- a vLLM-style Llama: its forward takes flattened tokens, `forward(input_ids: (N,), positions: (N,))`, no batch
  axis, and returns hidden states (the logits are `lm_head`'s, a submodule of its own); a merged `qkv_proj` split by
  sizes, a merged `gate_up_proj` read by a `SiluAndMul` module, rotary turned on (N, H * Dh) by the positions (a
  `cos_sin_cache` buffer built in float64 and indexed by them), an RMSNorm with a fused residual,
  `norm(x, residual) -> (normed(x + residual), x + residual)`, each decoder layer taking and returning
  (hidden, residual) pairs. Its user passes `call=` running each sequence of the batch as one flat request with
  positions 0 .. T - 1 (its forward cannot be called on (B, T) ids: the judge is expected to say so, naming `call=`);
- a gpt-fast-style Transformer: `setup_caches(max_batch, max_seq)` called before use, a `KVCache` module whose
  buffers are written by `index_copy_` at `input_pos` and read whole, under a causal mask buffer indexed by
  `input_pos`, a `freqs_cis` table of (cos, sin) pairs indexed by `input_pos` (rotary in interleaved pairs), `wqkv`
  split by sizes, `w1`/`w3`/`w2`, grouped K/V heads by `repeat_interleave`; its user passes `input_pos` by `call=`;
- an SGLang-style Llama whose sequences are packed into one flat batch: `forward(input_ids, positions,
  forward_batch)`, `forward_batch` a dataclass holding each sequence's length, every attention's core a
  `RadixAttention`-like module called as `attn(q, k, v, forward_batch)` that splits the packed rows by those lengths
  (causal within each, nothing across them); its user packs the batch by `call=`;
- a model with weights packed for speed: q, k and v in one (3D, D) parameter whose rows are interleaved per head
  (q, k, v of head 0, then of head 1 ...), gate and up in one (2F, D) parameter interleaved row by row, the
  projection's output split by `[..., ::2]` (gate) and `[..., 1::2]` (up);
- an MLX port: raw (in, out) weights applied as `x @ w`, channels last everywhere, an RMSNorm by rsqrt, rotary in
  halves at MLX's default base;
- a GQA GPT calling `F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, scale=Dh ** -0.5)`,
  the K/V heads never expanded by hand;
- a Medusa-style draft model: a Llama trunk whose last hidden state also feeds three extra heads (a SiLU residual
  block and a Linear to the vocabulary each), `forward` returning (logits, the heads' logits stacked). A demanding
  user expects the trunk's logits (the tuple's first element) judged as the LM and a pass: the draft heads are a
  separate training target, not part of the next-token logits;
- mistakes put into them, each named where it sits (its second layer or block): vLLM's gate and up swapped in
  `gate_up_proj` (the SiLU on the up half), its keys turned at positions + 1 (the queries at the positions), its
  fused norm handing on the residual before the add (the attention's output leaves the stream: math the reference
  has no pair for, said at that norm); gpt-fast's K/V heads tiled; SGLang's RadixAttention built with scaling 1/Dh,
  and its SiLU on the up projection; the packed model's gate read from the odd rows; the MLX port's RMSNorm eps
  outside the root; the SDPA GPT's K/V heads tiled before SDPA, and its scale given as 1/Dh; the Medusa trunk's
  second attention left without its mask.

First met: 9 of 20 right (the gpt-fast, SGLang, MLX and SDPA models pass, their mistakes named where they sit; the
vLLM model without `call=` is refused naming `call=`). Wrong then:

- vllm_llama and its three mistakes, each: "differs at model.layers.0.self_attn.attn: the attention runs again with
  the same weights (layers that share their parameters, as ALBERT's), which the reference has no pair for". The
  `call=` runs the model once per sequence (the batch as B flat requests), so each module is called B times in one
  recorded forward: read as weight sharing;
- sglang_llama.wrong_scale_second_layer and .activation_on_up_second_layer, each: "differs at
  model.layers.0.self_attn: a LayerNorm normalises the keys", the first layer (correct) blamed for a mistake of
  the second, with no model reproducing the reference ("conventions assumed (none reproduced the reference ...)");
  the correct model passes, so the packed (B * T, D) rows inside the `call=` are read whole but not layer by layer;
- packed_lm and its mistake: FAILED, unexplained at layers.0.feed_forward. W13 is mapped as "fused rows gate,
  linear1" (the gate the first F rows), while the forward reads gate and up from alternate rows; the same model
  with the halves contiguous passes;
- medusa and its mistake: "could not judge: ... KeyError: 'decoder.layers.0.ffn.gate.weight'; pass call= ... or
  mapping=": the draft heads' Linears (D -> D and D -> V, besides the trunk's own) upset the map of the trunk;
  passing `call=` that returns the trunk's logits alone (medusa.trunk_logits_by_call) is refused the same way.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

D, H, KV, V, F_MLP, T_MAX = 32, 4, 2, 26, 64, 32
HD = D // H
LM = "transformer_lm"


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains moved off their 1s, so that trained values are what is checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _inv_freq(dim: int = HD, base: float = 10000.0) -> torch.Tensor:
    return 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def _turn_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary in halves of the last axis: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


# -- vLLM: flattened tokens, merged projections, SiluAndMul, fused-residual RMSNorm ------------------------------------


class FusedRMSNorm(nn.Module):
    """norm(x) -> normed x; norm(x, residual) -> (normed(x + residual), x + residual)."""

    def __init__(self, hidden: int, eps: float = 1e-6, hands_on_pre_add: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps
        self.hands_on_pre_add = hands_on_pre_add  # the mistake: the residual handed on is the one before the add

    def forward(self, x, residual=None):
        before = residual
        if residual is not None:
            x = x + residual
            residual = x
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon) * self.weight
        if residual is None:
            return normed
        return normed, (before if self.hands_on_pre_add else residual)


class SiluAndMul(nn.Module):
    """silu(x[..., :F]) * x[..., F:]."""

    def forward(self, x):
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


class VllmRotary(nn.Module):
    """Rotary (halves) of flattened q (N, H * Dh) and k (N, KV * Dh), read from a [cos | sin] cache by position."""

    def __init__(self, max_position: int = T_MAX, base: float = 10000.0):
        super().__init__()
        angles = torch.outer(torch.arange(max_position, dtype=torch.float64), _inv_freq(HD, base))
        self.register_buffer("cos_sin_cache", torch.cat([angles.cos(), angles.sin()], dim=-1), persistent=False)

    def turn(self, positions, x):
        cos, sin = self.cos_sin_cache[positions].to(x.dtype).chunk(2, dim=-1)
        shaped = x.view(x.shape[0], -1, HD)
        return _turn_halves(shaped, cos[:, None], sin[:, None]).reshape(x.shape)

    def forward(self, positions, q, k, key_shift: int = 0):
        return self.turn(positions, q), self.turn(positions + key_shift, k)


class VllmAttentionCore(nn.Module):
    """Causal attention of one flat request: q (N, H * Dh), k and v (N, KV * Dh) -> (N, H * Dh)."""

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int):
        super().__init__()
        self.num_heads, self.head_size, self.scale, self.num_kv_heads = num_heads, head_size, scale, num_kv_heads

    def forward(self, q, k, v):
        N = q.shape[0]
        q = q.view(N, self.num_heads, self.head_size).transpose(0, 1)
        group = self.num_heads // self.num_kv_heads
        k = k.view(N, self.num_kv_heads, self.head_size).transpose(0, 1).repeat_interleave(group, dim=0)
        v = v.view(N, self.num_kv_heads, self.head_size).transpose(0, 1).repeat_interleave(group, dim=0)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return out.transpose(0, 1).reshape(N, self.num_heads * self.head_size)


class VllmAttention(nn.Module):
    def __init__(self, key_shift: int = 0):
        super().__init__()
        self.q_size, self.kv_size = H * HD, KV * HD
        self.qkv_proj = nn.Linear(D, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(H * HD, D, bias=False)
        self.rotary_emb = VllmRotary()
        self.attn = VllmAttentionCore(H, HD, HD**-0.5, KV)
        self.key_shift = key_shift  # the mistake: the keys turned at positions + 1

    def forward(self, positions, hidden_states):
        qkv = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k, key_shift=self.key_shift)
        return self.o_proj(self.attn(q, k, v))


class VllmMLP(nn.Module):
    def __init__(self, up_first: bool = False):
        super().__init__()
        self.gate_up_proj = nn.Linear(D, 2 * F_MLP, bias=False)
        self.down_proj = nn.Linear(F_MLP, D, bias=False)
        self.act_fn = SiluAndMul()
        self.up_first = up_first  # the mistake: the halves read the other way round (the SiLU on the up half)

    def forward(self, x):
        gate_up = self.gate_up_proj(x)
        if self.up_first:
            gate, up = gate_up.chunk(2, dim=-1)
            gate_up = torch.cat([up, gate], dim=-1)
        return self.down_proj(self.act_fn(gate_up))


class VllmDecoderLayer(nn.Module):
    def __init__(self, key_shift: int = 0, up_first: bool = False, pre_add: bool = False):
        super().__init__()
        self.self_attn = VllmAttention(key_shift)
        self.mlp = VllmMLP(up_first)
        self.input_layernorm = FusedRMSNorm(D)
        self.post_attention_layernorm = FusedRMSNorm(D, hands_on_pre_add=pre_add)

    def forward(self, positions, hidden_states, residual):
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class VllmLlamaModel(nn.Module):
    def __init__(self, **second):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([VllmDecoderLayer(), VllmDecoderLayer(**second)])
        self.norm = FusedRMSNorm(D)

    def forward(self, input_ids, positions):
        hidden_states, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class VllmLlamaForCausalLM(nn.Module):
    """forward(input_ids (N,), positions (N,)) -> hidden states (N, D); compute_logits(hidden) -> (N, V)."""

    def __init__(self, **second):
        super().__init__()
        self.model = VllmLlamaModel(**second)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, input_ids, positions):
        return self.model(input_ids, positions)

    def compute_logits(self, hidden_states):
        return self.lm_head(hidden_states)


def vllm_llama(**second) -> VllmLlamaForCausalLM:
    torch.manual_seed(0)
    return _jitter(VllmLlamaForCausalLM(**second))


def vllm_call(model: VllmLlamaForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    """Each sequence of the batch one flat request at positions 0 .. T - 1; the logits by compute_logits."""
    positions = torch.arange(ids.shape[1])
    return torch.stack([model.compute_logits(model(row, positions)) for row in ids])


# -- gpt-fast: setup_caches, a KVCache written by index_copy_, freqs_cis and a mask indexed by input_pos ---------------


class KVCache(nn.Module):
    def __init__(self, max_batch_size: int, max_seq_length: int, n_heads: int, head_dim: int):
        super().__init__()
        shape = (max_batch_size, n_heads, max_seq_length, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape))
        self.register_buffer("v_cache", torch.zeros(shape))

    def update(self, input_pos, k_val, v_val):
        B = k_val.shape[0]
        k_out, v_out = self.k_cache[:B], self.v_cache[:B]
        k_out.index_copy_(2, input_pos, k_val)
        v_out.index_copy_(2, input_pos, v_val)
        return k_out, v_out


def _freqs_cis(seq_len: int, base: float = 10000.0) -> torch.Tensor:
    """(seq_len, Dh / 2, 2): the cos and sin of each position's angle per pair."""
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), _inv_freq(HD, base))
    return torch.stack([angles.cos(), angles.sin()], dim=-1)


def _apply_rotary_emb(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """Interleaved pairs (x_2i, x_2i+1) of x (B, T, h, Dh) turned by freqs_cis (T, Dh / 2, 2)."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    f = freqs_cis.to(x.dtype).view(1, pairs.shape[1], 1, pairs.shape[3], 2)
    out = torch.stack(
        [pairs[..., 0] * f[..., 0] - pairs[..., 1] * f[..., 1], pairs[..., 1] * f[..., 0] + pairs[..., 0] * f[..., 1]],
        dim=-1,
    )
    return out.flatten(3)


class FastAttention(nn.Module):
    def __init__(self, tiled: bool = False):
        super().__init__()
        self.wqkv = nn.Linear(D, (H + 2 * KV) * HD, bias=False)
        self.wo = nn.Linear(D, D, bias=False)
        self.kv_cache: KVCache | None = None
        self.tiled = tiled  # the mistake: K/V heads tiled (head h reads K/V head h % KV)

    def forward(self, x, freqs_cis, mask, input_pos):
        B, T, _ = x.shape
        q, k, v = self.wqkv(x).split([D, KV * HD, KV * HD], dim=-1)
        q, k, v = q.view(B, T, H, HD), k.view(B, T, KV, HD), v.view(B, T, KV, HD)
        q, k = _apply_rotary_emb(q, freqs_cis), _apply_rotary_emb(k, freqs_cis)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.kv_cache is not None:
            k, v = self.kv_cache.update(input_pos, k, v)
        if self.tiled:
            k, v = k.repeat(1, H // KV, 1, 1), v.repeat(1, H // KV, 1, 1)
        else:
            k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0)
        return self.wo(y.transpose(1, 2).contiguous().view(B, T, D))


class FastFeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(D, F_MLP, bias=False)
        self.w3 = nn.Linear(D, F_MLP, bias=False)
        self.w2 = nn.Linear(F_MLP, D, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class FastRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps) * self.weight


class FastBlock(nn.Module):
    def __init__(self, tiled: bool = False):
        super().__init__()
        self.attention = FastAttention(tiled)
        self.feed_forward = FastFeedForward()
        self.ffn_norm = FastRMSNorm(D)
        self.attention_norm = FastRMSNorm(D)

    def forward(self, x, input_pos, freqs_cis, mask):
        h = x + self.attention(self.attention_norm(x), freqs_cis, mask, input_pos)
        return h + self.feed_forward(self.ffn_norm(h))


class FastTransformer(nn.Module):
    def __init__(self, tiled_second: bool = False):
        super().__init__()
        self.tok_embeddings = nn.Embedding(V, D)
        self.layers = nn.ModuleList([FastBlock(), FastBlock(tiled_second)])
        self.norm = FastRMSNorm(D)
        self.output = nn.Linear(D, V, bias=False)
        self.max_batch_size, self.max_seq_length = -1, -1

    def setup_caches(self, max_batch_size: int, max_seq_length: int) -> None:
        self.max_batch_size, self.max_seq_length = max_batch_size, max_seq_length
        for b in self.layers:
            b.attention.kv_cache = KVCache(max_batch_size, max_seq_length, KV, HD)
        self.register_buffer("freqs_cis", _freqs_cis(max_seq_length), persistent=False)
        mask = torch.tril(torch.ones(max_seq_length, max_seq_length, dtype=torch.bool))
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, idx, input_pos):
        mask = self.causal_mask[None, None, input_pos]
        freqs_cis = self.freqs_cis[input_pos]
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, input_pos, freqs_cis, mask)
        return self.output(self.norm(x))


def gpt_fast(tiled_second: bool = False) -> FastTransformer:
    torch.manual_seed(0)
    model = FastTransformer(tiled_second)
    model.setup_caches(max_batch_size=8, max_seq_length=T_MAX)
    return _jitter(model)


def gpt_fast_call(model: FastTransformer, ids: torch.Tensor) -> torch.Tensor:
    """The prefill: every position of the prompt at once, input_pos 0 .. T - 1."""
    return model(ids, torch.arange(ids.shape[1]))


# -- SGLang: packed sequences, a forward_batch, a RadixAttention-like core -----------------------------------------


@dataclass
class ForwardBatch:
    """What the scheduler hands each forward: the length of each packed sequence, in order."""

    seq_lens: list[int]


class RadixAttention(nn.Module):
    """attn(q, k, v, forward_batch): q (N, H * Dh), k and v (N, KV * Dh), causal within each packed sequence."""

    def __init__(self, num_heads: int, head_dim: int, scaling: float, num_kv_heads: int, layer_id: int):
        super().__init__()
        self.tp_q_head_num, self.head_dim, self.scaling = num_heads, head_dim, scaling
        self.tp_k_head_num, self.layer_id = num_kv_heads, layer_id

    def forward(self, q, k, v, forward_batch: ForwardBatch):
        outs, group = [], self.tp_q_head_num // self.tp_k_head_num
        for qs, ks, vs in zip(*(t.split(forward_batch.seq_lens) for t in (q, k, v)), strict=True):
            n = qs.shape[0]
            qh = qs.view(n, self.tp_q_head_num, self.head_dim).transpose(0, 1)
            kh = ks.view(n, self.tp_k_head_num, self.head_dim).transpose(0, 1).repeat_interleave(group, 0)
            vh = vs.view(n, self.tp_k_head_num, self.head_dim).transpose(0, 1).repeat_interleave(group, 0)
            scores = (qh @ kh.transpose(-1, -2)) * self.scaling
            hidden = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
            probs = scores.masked_fill(hidden, float("-inf")).softmax(-1)
            outs.append((probs @ vh).transpose(0, 1).reshape(n, -1))
        return torch.cat(outs)


class SglAttention(nn.Module):
    def __init__(self, layer_id: int, scaling: float = HD**-0.5):
        super().__init__()
        self.q_proj = nn.Linear(D, D, bias=False)
        self.k_proj = nn.Linear(D, KV * HD, bias=False)
        self.v_proj = nn.Linear(D, KV * HD, bias=False)
        self.o_proj = nn.Linear(D, D, bias=False)
        self.attn = RadixAttention(H, HD, scaling, KV, layer_id)
        self.register_buffer("inv_freq", _inv_freq(), persistent=False)

    def rotate(self, positions, x):
        angles = positions.to(x.dtype)[:, None] * self.inv_freq.to(x.dtype)
        shaped = x.view(x.shape[0], -1, HD)
        return _turn_halves(shaped, angles.cos()[:, None], angles.sin()[:, None]).reshape(x.shape)

    def forward(self, positions, hidden_states, forward_batch):
        q, k, v = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
        q, k = self.rotate(positions, q), self.rotate(positions, k)
        return self.o_proj(self.attn(q, k, v, forward_batch))


class SglMLP(nn.Module):
    def __init__(self, silu_on_up: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(D, F_MLP, bias=False)
        self.up_proj = nn.Linear(D, F_MLP, bias=False)
        self.down_proj = nn.Linear(F_MLP, D, bias=False)
        self.silu_on_up = silu_on_up  # the mistake: the SiLU on up_proj's output, gate_proj's taken as it is

    def forward(self, x):
        gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(up) * gate if self.silu_on_up else F.silu(gate) * up)


class SglDecoderLayer(nn.Module):
    def __init__(self, layer_id: int, scaling: float = HD**-0.5, silu_on_up: bool = False):
        super().__init__()
        self.self_attn = SglAttention(layer_id, scaling)
        self.mlp = SglMLP(silu_on_up)
        self.input_layernorm = nn.RMSNorm(D, eps=1e-6)
        self.post_attention_layernorm = nn.RMSNorm(D, eps=1e-6)

    def forward(self, positions, hidden_states, forward_batch):
        h = hidden_states + self.self_attn(positions, self.input_layernorm(hidden_states), forward_batch)
        return h + self.mlp(self.post_attention_layernorm(h))


class SglModel(nn.Module):
    def __init__(self, second_scaling: float, silu_on_up_second: bool):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([SglDecoderLayer(0), SglDecoderLayer(1, second_scaling, silu_on_up_second)])
        self.norm = nn.RMSNorm(D, eps=1e-6)

    def forward(self, input_ids, positions, forward_batch):
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer(positions, h, forward_batch)
        return self.norm(h)


class SglLlamaForCausalLM(nn.Module):
    def __init__(self, second_scaling: float = HD**-0.5, silu_on_up_second: bool = False):
        super().__init__()
        self.model = SglModel(second_scaling, silu_on_up_second)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, input_ids, positions, forward_batch: ForwardBatch):
        return self.lm_head(self.model(input_ids, positions, forward_batch))


def sglang_llama(second_scaling: float = HD**-0.5, silu_on_up_second: bool = False) -> SglLlamaForCausalLM:
    torch.manual_seed(0)
    return _jitter(SglLlamaForCausalLM(second_scaling, silu_on_up_second))


def sglang_call(model: SglLlamaForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    """The batch packed into one flat request: positions restart at 0 for each sequence; logits back as (B, T, V)."""
    B, T = ids.shape
    batch = ForwardBatch(seq_lens=[T] * B)
    return model(ids.reshape(-1), torch.arange(T).repeat(B), batch).view(B, T, -1)


# -- packed weights: qkv rows interleaved per head, gate and up interleaved row by row ---------------------------------


class PackedAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.Wqkv = nn.Parameter(torch.randn(3 * D, D) / math.sqrt(D))  # rows: q_0, k_0, v_0, q_1, k_1, v_1 ...
        self.Wo = nn.Parameter(torch.randn(D, D) / math.sqrt(D))
        self.register_buffer("inv_freq", _inv_freq(), persistent=False)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = F.linear(x, self.Wqkv).view(B, T, H, 3, HD).unbind(dim=3)
        angles = torch.arange(T, dtype=x.dtype)[:, None] * self.inv_freq.to(x.dtype)
        cos, sin = angles.cos()[:, None], angles.sin()[:, None]
        q, k = _turn_halves(q, cos, sin), _turn_halves(k, cos, sin)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return F.linear(y.transpose(1, 2).reshape(B, T, D), self.Wo)


class PackedMLP(nn.Module):
    def __init__(self, gate_odd: bool = False):
        super().__init__()
        self.W13 = nn.Parameter(torch.randn(2 * F_MLP, D) / math.sqrt(D))  # rows: gate_0, up_0, gate_1, up_1 ...
        self.W2 = nn.Parameter(torch.randn(D, F_MLP) / math.sqrt(F_MLP))
        self.gate_odd = gate_odd  # the mistake: the gate read from the odd rows (the SiLU on the up half)

    def forward(self, x):
        h = F.linear(x, self.W13)
        gate, up = (h[..., 1::2], h[..., ::2]) if self.gate_odd else (h[..., ::2], h[..., 1::2])
        return F.linear(F.silu(gate) * up, self.W2)


class PackedBlock(nn.Module):
    def __init__(self, gate_odd: bool = False):
        super().__init__()
        self.attention_norm = nn.RMSNorm(D, eps=1e-5)
        self.attention = PackedAttention()
        self.ffn_norm = nn.RMSNorm(D, eps=1e-5)
        self.feed_forward = PackedMLP(gate_odd)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class PackedLM(nn.Module):
    def __init__(self, gate_odd_second: bool = False):
        super().__init__()
        self.tok_embeddings = nn.Embedding(V, D)
        self.layers = nn.ModuleList([PackedBlock(), PackedBlock(gate_odd_second)])
        self.norm = nn.RMSNorm(D, eps=1e-5)
        self.output = nn.Linear(D, V, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def packed_lm(gate_odd_second: bool = False) -> PackedLM:
    torch.manual_seed(0)
    return _jitter(PackedLM(gate_odd_second))


# -- an MLX port: (in, out) weights applied as x @ w, channels last ----------------------------------------------------


class MlxRMSNorm(nn.Module):
    def __init__(self, dims: int, eps: float = 1e-5, eps_outside: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dims))
        self.eps = eps
        self.eps_outside = eps_outside  # the mistake: x / (rms + eps)

    def forward(self, x):
        ms = x.square().mean(-1, keepdims=True)
        scale = 1.0 / (ms.sqrt() + self.eps) if self.eps_outside else torch.rsqrt(ms + self.eps)
        return self.weight * (x * scale)


class MlxAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq = nn.Parameter(torch.randn(D, D) / math.sqrt(D))  # (in, out), as MLX ports keep them
        self.wk = nn.Parameter(torch.randn(D, KV * HD) / math.sqrt(D))
        self.wv = nn.Parameter(torch.randn(D, KV * HD) / math.sqrt(D))
        self.wo = nn.Parameter(torch.randn(D, D) / math.sqrt(D))
        self.scale = HD**-0.5

    def forward(self, x):
        B, L, _ = x.shape
        queries = (x @ self.wq).reshape(B, L, H, HD)
        keys = (x @ self.wk).reshape(B, L, KV, HD)
        values = (x @ self.wv).reshape(B, L, KV, HD)
        angles = torch.arange(L, dtype=x.dtype)[:, None] * _inv_freq().to(x.dtype)
        cos, sin = angles.cos()[:, None], angles.sin()[:, None]
        queries, keys = _turn_halves(queries, cos, sin), _turn_halves(keys, cos, sin)
        keys = keys.repeat_interleave(H // KV, dim=2)
        values = values.repeat_interleave(H // KV, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", queries, keys) * self.scale
        scores = scores + torch.full((L, L), float("-inf"), dtype=x.dtype).triu(1)
        out = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), values)
        return out.reshape(B, L, D) @ self.wo


class MlxMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(D, F_MLP) / math.sqrt(D))
        self.w3 = nn.Parameter(torch.randn(D, F_MLP) / math.sqrt(D))
        self.w2 = nn.Parameter(torch.randn(F_MLP, D) / math.sqrt(F_MLP))

    def forward(self, x):
        return (F.silu(x @ self.w1) * (x @ self.w3)) @ self.w2


class MlxBlock(nn.Module):
    def __init__(self, eps_outside: bool = False):
        super().__init__()
        self.attention = MlxAttention()
        self.feed_forward = MlxMLP()
        self.attention_norm = MlxRMSNorm(D)
        self.ffn_norm = MlxRMSNorm(D, eps_outside=eps_outside)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class MlxLlama(nn.Module):
    def __init__(self, eps_outside_second: bool = False):
        super().__init__()
        self.tok_embeddings = nn.Parameter(torch.randn(V, D))
        self.layers = nn.ModuleList([MlxBlock(), MlxBlock(eps_outside_second)])
        self.norm = MlxRMSNorm(D)
        self.output = nn.Parameter(torch.randn(D, V) / math.sqrt(D))

    def forward(self, inputs):
        h = self.tok_embeddings[inputs]
        for layer in self.layers:
            h = layer(h)
        return self.norm(h) @ self.output


def mlx_llama(eps_outside_second: bool = False) -> MlxLlama:
    torch.manual_seed(0)
    return _jitter(MlxLlama(eps_outside_second))


# -- SDPA with enable_gqa=True and an explicit scale -------------------------------------------------------------------


class GqaAttention(nn.Module):
    def __init__(self, tiled: bool = False, scale: float = HD**-0.5, causal: bool = True):
        super().__init__()
        self.q_proj = nn.Linear(D, D, bias=False)
        self.k_proj = nn.Linear(D, KV * HD, bias=False)
        self.v_proj = nn.Linear(D, KV * HD, bias=False)
        self.o_proj = nn.Linear(D, D, bias=False)
        self.tiled, self.scale = tiled, scale  # the mistakes: K/V heads tiled by hand; another scale
        self.causal = causal  # the mistake: no causal mask

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, H, HD).transpose(1, 2)
        k = self.k_proj(x).view(B, T, KV, HD).transpose(1, 2)
        v = self.v_proj(x).view(B, T, KV, HD).transpose(1, 2)
        q, k = _turn_halves(q, cos, sin), _turn_halves(k, cos, sin)
        if self.tiled:
            k, v = k.repeat(1, H // KV, 1, 1), v.repeat(1, H // KV, 1, 1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=True, scale=self.scale)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, D))


class GqaBlock(nn.Module):
    def __init__(self, **attention):
        super().__init__()
        self.ln_1 = nn.RMSNorm(D, eps=1e-6)
        self.attn = GqaAttention(**attention)
        self.ln_2 = nn.RMSNorm(D, eps=1e-6)
        self.mlp = SglMLP()

    def forward(self, x, cos, sin):
        x = x + self.attn(self.ln_1(x), cos, sin)
        return x + self.mlp(self.ln_2(x))


class GqaGPT(nn.Module):
    def __init__(self, **second):
        super().__init__()
        self.wte = nn.Embedding(V, D)
        self.h = nn.ModuleList([GqaBlock(), GqaBlock(**second)])
        self.ln_f = nn.RMSNorm(D, eps=1e-6)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, idx):
        angles = torch.arange(idx.shape[1], dtype=torch.float64)[:, None] * _inv_freq()
        x = self.wte(idx)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        for block in self.h:
            x = block(x, cos, sin)
        return self.lm_head(self.ln_f(x))


def gqa_gpt(**second) -> GqaGPT:
    torch.manual_seed(0)
    return _jitter(GqaGPT(**second))


# -- Medusa: extra draft heads on the trunk's last hidden state --------------------------------------------------------


class ResBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(D, D)

    def forward(self, x):
        return x + F.silu(self.linear(x))


class MedusaTrunk(nn.Module):
    """A Llama trunk of the SDPA GPT's blocks; the mistake: its second attention given is_causal=False."""

    def __init__(self, unmasked_second: bool = False):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([GqaBlock(), GqaBlock(causal=not unmasked_second)])
        self.norm = nn.RMSNorm(D, eps=1e-6)

    def forward(self, input_ids):
        angles = torch.arange(input_ids.shape[1], dtype=torch.float64)[:, None] * _inv_freq()
        x = self.embed_tokens(input_ids)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class MedusaModel(nn.Module):
    def __init__(self, unmasked_second: bool = False, medusa_num_heads: int = 3):
        super().__init__()
        self.base_model = MedusaTrunk(unmasked_second)
        self.lm_head = nn.Linear(D, V, bias=False)
        self.medusa_head = nn.ModuleList(
            [nn.Sequential(ResBlock(), nn.Linear(D, V, bias=False)) for _ in range(medusa_num_heads)]
        )

    def forward(self, input_ids):
        hidden = self.base_model(input_ids)
        return self.lm_head(hidden), torch.stack([head(hidden) for head in self.medusa_head])


def medusa(unmasked_second: bool = False) -> MedusaModel:
    torch.manual_seed(0)
    return _jitter(MedusaModel(unmasked_second))


def medusa_call(model: MedusaModel, ids: torch.Tensor) -> torch.Tensor:
    """What a user passes once told to: the trunk's logits alone."""
    return model(ids)[0]


CASES = [
    ("vllm_llama", vllm_llama, LM, {"call": vllm_call}, "pass"),
    ("vllm_llama.no_call", vllm_llama, LM, {}, ("could not judge", "", "call=")),
    (
        "vllm_llama.gate_up_swapped_second_layer",
        lambda: vllm_llama(up_first=True),
        LM,
        {"call": vllm_call},
        ("mistake", "gated_feed_forward.activation_on_up", "model.layers.1.mlp"),
    ),
    (
        "vllm_llama.keys_one_ahead_second_layer",
        lambda: vllm_llama(key_shift=1),
        LM,
        {"call": vllm_call},
        ("mistake", "rope.position_offset", "model.layers.1.self_attn"),
    ),
    (
        "vllm_llama.fused_norm_pre_add_residual_second_layer",
        lambda: vllm_llama(pre_add=True),
        LM,
        {"call": vllm_call},
        ("no pair", "model.layers.1.post_attention_layernorm", "residual"),
    ),
    ("gpt_fast", gpt_fast, LM, {"call": gpt_fast_call}, "pass"),
    (
        "gpt_fast.kv_heads_tiled_second_layer",
        lambda: gpt_fast(tiled_second=True),
        LM,
        {"call": gpt_fast_call},
        ("mistake", "attention.kv_heads_tiled", "layers.1.attention"),
    ),
    ("sglang_llama", sglang_llama, LM, {"call": sglang_call}, "pass"),
    (
        "sglang_llama.wrong_scale_second_layer",
        lambda: sglang_llama(second_scaling=HD**-1.0),
        LM,
        {"call": sglang_call},
        ("mistake", "attention.wrong_scale", "model.layers.1.self_attn"),
    ),
    (
        "sglang_llama.activation_on_up_second_layer",
        lambda: sglang_llama(silu_on_up_second=True),
        LM,
        {"call": sglang_call},
        ("mistake", "gated_feed_forward.activation_on_up", "model.layers.1.mlp"),
    ),
    ("packed_lm", packed_lm, LM, {}, "pass"),
    (
        "packed_lm.gate_from_odd_rows_second_layer",
        lambda: packed_lm(gate_odd_second=True),
        LM,
        {},
        ("mistake", "gated_feed_forward.activation_on_up", "layers.1.feed_forward"),
    ),
    ("mlx_llama", mlx_llama, LM, {}, "pass"),
    (
        "mlx_llama.rms_eps_outside_sqrt_second_layer",
        lambda: mlx_llama(eps_outside_second=True),
        LM,
        {},
        ("mistake", "rms_norm.eps_outside_sqrt", "layers.1.ffn_norm"),
    ),
    ("gqa_sdpa_gpt", gqa_gpt, LM, {}, "pass"),
    (
        "gqa_sdpa_gpt.kv_heads_tiled_second_block",
        lambda: gqa_gpt(tiled=True),
        LM,
        {},
        ("mistake", "attention.kv_heads_tiled", "h.1.attn"),
    ),
    (
        "gqa_sdpa_gpt.wrong_scale_second_block",
        lambda: gqa_gpt(scale=1.0 / HD),
        LM,
        {},
        ("mistake", "attention.wrong_scale", "h.1.attn"),
    ),
    ("medusa", medusa, LM, {}, "pass"),
    ("medusa.trunk_logits_by_call", medusa, LM, {"call": medusa_call}, "pass"),
    (
        "medusa.not_causal_second_layer",
        lambda: medusa(unmasked_second=True),
        LM,
        {},
        ("mistake", "attention.not_causal", "base_model.layers.1.attn"),
    ),
]
