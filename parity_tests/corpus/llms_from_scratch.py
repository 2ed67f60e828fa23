"""A book's GPT, as readers of a "large language model from scratch" book write it: a config dict, a LayerNorm with
`scale` and `shift`, a tanh GELU whose constant is `torch.tensor(2.0 / torch.pi)` (made in float32 inside the
forward, whatever the model's dtype), a causal mask kept as a float buffer of ones above the diagonal, pre-norm
blocks, learned positions, an `out_head` without bias. The same book's later chapters (its Llama 3 and Qwen3) add
an RMSNorm that computes in float32 (`x.to(torch.float32)`, cast back at the end) and a head run on
`x.to(cfg["dtype"])`.

The float32 constant, the RMSNorm's float32 computation and the cast before the head are float32 islands inside a
float64 model: the judge is to name them (dtype.float32_island), run them in float64 for the float64 comparison,
and still find a catalogued mistake there."""

from __future__ import annotations

import torch
from torch import nn

LEVEL = "transformer_lm"
CALL = None

GPT_CONFIG = {
    "vocab_size": 30,
    "context_length": 16,
    "emb_dim": 32,
    "n_heads": 4,
    "n_layers": 2,
    "drop_rate": 0.1,
    "qkv_bias": True,
    "dtype": torch.float32,  # the later chapters' head input dtype
}


class LayerNorm(nn.Module):
    def __init__(self, emb_dim):
        super().__init__()
        self.eps = 1e-5
        self.scale = nn.Parameter(torch.ones(emb_dim))
        self.shift = nn.Parameter(torch.zeros(emb_dim))

    def forward(self, x):
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)
        norm_x = (x - mean) / torch.sqrt(var + self.eps)
        return self.scale * norm_x + self.shift


class RMSNorm(nn.Module):
    """The later chapters' norm: computed in float32, whatever comes in, and cast back."""

    def __init__(self, emb_dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(emb_dim))

    def forward(self, x):
        input_dtype = x.dtype
        x = x.to(torch.float32)
        means = x.pow(2).mean(dim=-1, keepdim=True)
        x_normed = x * torch.rsqrt(means + self.eps)
        return (x_normed * self.weight).to(dtype=input_dtype)


class GELU(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1 + torch.tanh(torch.sqrt(torch.tensor(2.0 / torch.pi)) * (x + 0.044715 * torch.pow(x, 3))))


class KeptConstantGELU(nn.Module):
    """The same GELU with its constant made once, in __init__, as a plain tensor attribute (float32: .to() and
    .double() leave it)."""

    def __init__(self):
        super().__init__()
        self.c = torch.sqrt(torch.tensor(2.0 / torch.pi))

    def forward(self, x):
        return 0.5 * x * (1 + torch.tanh(self.c * (x + 0.044715 * torch.pow(x, 3))))


class TypedConstantGELU(nn.Module):
    """The same GELU with its constant made in forward with its dtype given (float32 whatever the model's)."""

    def forward(self, x):
        c = torch.sqrt(torch.tensor(2.0 / torch.pi, dtype=torch.float32))
        return 0.5 * x * (1 + torch.tanh(c * (x + 0.044715 * torch.pow(x, 3))))


class FeedForward(nn.Module):
    def __init__(self, cfg, activation=GELU):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(cfg["emb_dim"], 4 * cfg["emb_dim"]), activation(), nn.Linear(4 * cfg["emb_dim"], cfg["emb_dim"])
        )

    def forward(self, x):
        return self.layers(x)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        assert d_out % num_heads == 0, "d_out must be divisible by num_heads"
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def scale(self, keys):
        return keys.shape[-1] ** 0.5

    def forward(self, x):
        b, num_tokens, d_in = x.shape
        keys = self.W_key(x).view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
        queries = self.W_query(x).view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
        values = self.W_value(x).view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)

        attn_scores = queries @ keys.transpose(2, 3)
        mask_bool = self.mask.bool()[:num_tokens, :num_tokens]
        attn_scores.masked_fill_(mask_bool, -torch.inf)
        attn_weights = torch.softmax(attn_scores / self.scale(keys), dim=-1)
        attn_weights = self.dropout(attn_weights)

        context_vec = (attn_weights @ values).transpose(1, 2)
        context_vec = context_vec.contiguous().view(b, num_tokens, self.d_out)
        return self.out_proj(context_vec)


class TransformerBlock(nn.Module):
    def __init__(self, cfg, norm=LayerNorm, attention=MultiHeadAttention):
        super().__init__()
        self.att = attention(
            d_in=cfg["emb_dim"],
            d_out=cfg["emb_dim"],
            context_length=cfg["context_length"],
            num_heads=cfg["n_heads"],
            dropout=cfg["drop_rate"],
            qkv_bias=cfg["qkv_bias"],
        )
        self.ff = FeedForward(cfg)
        self.norm1 = norm(cfg["emb_dim"])
        self.norm2 = norm(cfg["emb_dim"])
        self.drop_shortcut = nn.Dropout(cfg["drop_rate"])

    def forward(self, x):
        shortcut = x
        x = self.norm1(x)
        x = self.att(x)
        x = self.drop_shortcut(x)
        x = x + shortcut

        shortcut = x
        x = self.norm2(x)
        x = self.ff(x)
        x = self.drop_shortcut(x)
        return x + shortcut


class GPTModel(nn.Module):
    def __init__(self, cfg, norm=LayerNorm, attention=MultiHeadAttention):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg["vocab_size"], cfg["emb_dim"])
        self.pos_emb = nn.Embedding(cfg["context_length"], cfg["emb_dim"])
        self.drop_emb = nn.Dropout(cfg["drop_rate"])
        self.trf_blocks = nn.Sequential(*[TransformerBlock(cfg, norm, attention) for _ in range(cfg["n_layers"])])
        self.final_norm = norm(cfg["emb_dim"])
        self.out_head = nn.Linear(cfg["emb_dim"], cfg["vocab_size"], bias=False)

    def forward(self, in_idx):
        batch_size, seq_len = in_idx.shape
        tok_embeds = self.tok_emb(in_idx)
        pos_embeds = self.pos_emb(torch.arange(seq_len, device=in_idx.device))
        x = tok_embeds + pos_embeds
        x = self.drop_emb(x)
        x = self.trf_blocks(x)
        x = self.final_norm(x)
        return self.out_head(x)


class CastHeadGPT(GPTModel):
    """The later chapters' ending: the head run on x.to(cfg["dtype"]) (float32 here)."""

    def forward(self, in_idx):
        batch_size, seq_len = in_idx.shape
        x = self.tok_emb(in_idx) + self.pos_emb(torch.arange(seq_len, device=in_idx.device))
        x = self.final_norm(self.trf_blocks(self.drop_emb(x)))
        return self.out_head(x.to(self.cfg["dtype"]))


def model(**parts) -> GPTModel:
    torch.manual_seed(0)
    return GPTModel(GPT_CONFIG, **parts)


def cast_head() -> GPTModel:
    torch.manual_seed(0)
    return CastHeadGPT(GPT_CONFIG)


def rms_in_float32() -> GPTModel:
    return model(norm=RMSNorm)


def kept_constant() -> GPTModel:
    gpt = model()
    for block in gpt.trf_blocks:
        block.ff = FeedForward(GPT_CONFIG, activation=KeptConstantGELU)
    gpt.load_state_dict(model().state_dict())
    return gpt


def typed_constant() -> GPTModel:
    gpt = model()
    for block in gpt.trf_blocks:
        block.ff = FeedForward(GPT_CONFIG, activation=TypedConstantGELU)
    gpt.load_state_dict(model().state_dict())
    return gpt


ALSO_CLEAN = [cast_head, rms_in_float32, kept_constant]


# -- mistakes put in ----------------------------------------------------------------------------------------------


class ScaledByHeadDim(MultiHeadAttention):
    def scale(self, keys):
        return keys.shape[-1]  # not its square root


class EpsOutsideRoot(LayerNorm):
    def forward(self, x):
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)
        return self.scale * (x - mean) / (torch.sqrt(var) + self.eps) + self.shift


class Float32EpsOutsideRoot(LayerNorm):
    """The later chapters' habit (compute the norm in float32, cast back) on the book's LayerNorm, with eps added
    outside the root: a change the float32 bar alone would let through."""

    def forward(self, x):
        input_dtype = x.dtype
        x = x.to(torch.float32)
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)
        return (self.scale * (x - mean) / (torch.sqrt(var) + self.eps) + self.shift).to(input_dtype)


class RMSEpsOutsideRoot(RMSNorm):
    """The later chapters' float32 RMSNorm with eps added outside the root (not in MISTAKES: the clean model's norms
    are LayerNorms; parity_tests/test_corpus.py judges it on its own)."""

    def forward(self, x):
        input_dtype = x.dtype
        x = x.to(torch.float32)
        x_normed = x / (torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True)) + self.eps)
        return (x_normed * self.weight).to(dtype=input_dtype)


def rms_eps_outside_sqrt_in_float32() -> GPTModel:
    return model(norm=lambda dim: RMSEpsOutsideRoot(dim, eps=1e-6))


def wrong_scale() -> GPTModel:
    return model(attention=ScaledByHeadDim)


def eps_outside_sqrt() -> GPTModel:
    return model(norm=EpsOutsideRoot)


def eps_outside_sqrt_in_float32() -> GPTModel:
    return model(norm=Float32EpsOutsideRoot)


# (factory, the catalogue id the judge must name first, the submodule it must name)
MISTAKES = [
    (wrong_scale, "attention.wrong_scale", "trf_blocks.0.att"),
    (eps_outside_sqrt, "layer_norm.eps_outside_sqrt", "trf_blocks.0.norm1"),
    (eps_outside_sqrt_in_float32, "layer_norm.eps_outside_sqrt", "trf_blocks.0.norm1"),
]
