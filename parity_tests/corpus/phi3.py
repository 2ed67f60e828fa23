"""Phi-3 written from scratch: `Phi3Attention` with one fused `qkv_proj` (the queries' heads, then the keys' and
the values' fewer heads: grouped-query attention) split by width, rotate-half RoPE computed in `forward` from an
`inv_freq` buffer (base 10000), the key and value heads repeated for their groups, torch's
`scaled_dot_product_attention(..., is_causal=True)` and `o_proj`; `Phi3MLP` with one fused `gate_up_proj` chunked
into the gate and the up halves, `down_proj(up * silu(gate))`; an RMSNorm computing in float32 as Hugging Face's
does; pre-norm decoder layers, `embed_tokens`, a final `norm` and an untied `lm_head`. `forward(input_ids)` returns
the logits."""

import torch
import torch.nn as nn
import torch.nn.functional as F

LEVEL = "transformer_lm"
CALL = None


class Phi3Config:
    def __init__(
        self,
        vocab_size=32,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta


class Phi3RMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Phi3Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.num_key_value_groups = self.num_heads // self.num_key_value_heads
        self.head_dim = config.hidden_size // self.num_heads
        op_size = (self.num_heads + 2 * self.num_key_value_heads) * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, op_size, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def rotary(self, x):
        seq_len = x.shape[-2]
        position_ids = torch.arange(seq_len, device=x.device, dtype=self.inv_freq.dtype)
        freqs = torch.outer(position_ids, self.inv_freq)  # (seq_len, head_dim // 2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (seq_len, head_dim)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    def attend(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def repeat_kv(self, t):  # each K/V head shared by num_key_value_groups query heads
        return t.repeat_interleave(self.num_key_value_groups, dim=1)

    def forward(self, hidden_states):
        bsz, q_len, _ = hidden_states.shape
        qkv = self.qkv_proj(hidden_states)
        query_pos = self.num_heads * self.head_dim
        kv_size = self.num_key_value_heads * self.head_dim
        q, k, v = qkv.split([query_pos, kv_size, kv_size], dim=-1)
        q = q.view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(bsz, q_len, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        v = v.view(bsz, q_len, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.rotary(v)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = self.repeat_kv(k), self.repeat_kv(v)  # (bsz, num_heads, q_len, head_dim)
        attn_output = self.attend(q, k, v)
        attn_output = attn_output.transpose(1, 2).reshape(bsz, q_len, -1)
        return self.o_proj(attn_output)


class Phi3MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, hidden_states):
        gate, up = self.gate_up_proj(hidden_states).chunk(2, dim=-1)
        return self.down_proj(up * F.silu(gate))


class Phi3DecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self_attn = Phi3Attention(config)
        self.mlp = Phi3MLP(config)
        self.input_layernorm = Phi3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Phi3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states):
        residual = hidden_states
        hidden_states = self.self_attn(self.input_layernorm(hidden_states))
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
        return residual + hidden_states


class Phi3ForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([Phi3DecoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = Phi3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, input_ids):
        hidden_states = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        hidden_states = self.norm(hidden_states)
        return self.lm_head(hidden_states)


def model() -> Phi3ForCausalLM:
    torch.manual_seed(0)
    return Phi3ForCausalLM(Phi3Config())


class UpFirstMLP(Phi3MLP):
    def forward(self, hidden_states):
        up, gate = self.gate_up_proj(hidden_states).chunk(2, dim=-1)  # this author keeps up in the first half
        return self.down_proj(up * F.silu(gate))


def up_first() -> Phi3ForCausalLM:
    phi = model()
    for layer in phi.layers:
        layer.mlp.__class__ = UpFirstMLP
    return phi


ALSO_CLEAN = [up_first]


# --- mistakes put in on purpose ---------------------------------------------------------------------------------


class EpsOutsideSqrt(Phi3RMSNorm):
    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        rms = hidden_states.pow(2).mean(-1, keepdim=True).sqrt()
        hidden_states = hidden_states / (rms + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


def rms_eps_outside_sqrt() -> Phi3ForCausalLM:
    phi = model()
    phi.layers[1].post_attention_layernorm.__class__ = EpsOutsideSqrt
    return phi


class ScaledByWidth(Phi3Attention):
    def attend(self, q, k, v):
        scale = (self.num_heads * self.head_dim) ** -0.5  # the model's width, not a head's
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)


def wrong_scale() -> Phi3ForCausalLM:
    phi = model()
    phi.layers[0].self_attn.__class__ = ScaledByWidth
    return phi


class TiledKV(Phi3Attention):
    def repeat_kv(self, t):
        return t.repeat(1, self.num_key_value_groups, 1, 1)  # kv heads 0, 1, 0, 1 instead of 0, 0, 1, 1


def kv_heads_tiled() -> Phi3ForCausalLM:
    phi = model()
    phi.layers[1].self_attn.__class__ = TiledKV
    return phi


MISTAKES = [
    (rms_eps_outside_sqrt, "rms_norm.eps_outside_sqrt", "layers.1.post_attention_layernorm"),
    (wrong_scale, "attention.wrong_scale", "layers.0.self_attn"),
    (kv_heads_tiled, "attention.kv_heads_tiled", "layers.1.self_attn"),
]
