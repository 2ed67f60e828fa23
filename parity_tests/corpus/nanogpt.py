"""nanoGPT style: a GPT in one file. Fused `c_attn`, a flash/manual attention switch (the manual path masks with a
registered lower-triangular `bias` buffer), `forward(idx, targets=None) -> (logits, loss)` with the last position's
logits only when there are no targets, the token table tied to `lm_head`."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

LEVEL = "transformer_lm"
CALL = None


@dataclass
class GPTConfig:
    block_size: int = 16  # the longest context the position table covers
    vocab_size: int = 24
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 16
    dropout: float = 0.0
    bias: bool = True  # biases in the linears and layer norms, as GPT-2
    flash: bool = True  # F.scaled_dot_product_attention when True, the written-out softmax when False


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (torch's had none to switch off)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v in one matmul
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.flash = config.flash and hasattr(F, "scaled_dot_product_attention")
        if not self.flash:
            tril = torch.tril(torch.ones(config.block_size, config.block_size))
            self.register_buffer("bias", tril.view(1, 1, config.block_size, config.block_size))

    def split_heads(self, t, B, T, C):
        return t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)

    def merge_heads(self, y, B, T, C):
        return y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)

    def scores(self, q, k):
        return (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, T, T)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (self.split_heads(t, B, T, C) for t in (q, k, v))
        if self.flash:
            p = self.dropout if self.training else 0
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=p, is_causal=True)
        else:
            att = self.scores(q, k)
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v  # (B, nh, T, hs)
        return self.resid_dropout(self.c_proj(self.merge_heads(y, B, T, C)))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config, block=Block):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([block(config) for _ in range(config.n_layer)]),
                ln_f=LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        size = self.config.block_size
        assert t <= size, f"Cannot forward sequence of length {t}, block size is only {size}"
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)  # (t,)
        tok_emb = self.transformer.wte(idx)  # (b, t, n_embd)
        pos_emb = self.transformer.wpe(pos)  # (t, n_embd)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])  # inference: only the last position is needed
            loss = None
        return logits, loss


def model(**overrides) -> GPT:
    """The clean model: two layers, two heads, d_model 16, vocabulary 24."""
    torch.manual_seed(0)
    return GPT(GPTConfig(**overrides))


# --- mistakes put in on purpose ---------------------------------------------------------------------------------


class ScaledByHeadSize(CausalSelfAttention):
    def scores(self, q, k):
        return (q @ k.transpose(-2, -1)) * (1.0 / k.size(-1))  # divides by hs, not sqrt(hs)


class QueriesAndKeysSwapped(CausalSelfAttention):
    def scores(self, q, k):
        return (k @ q.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # K Q^T: the score matrix transposed


class NoCausalMask(CausalSelfAttention):
    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (self.split_heads(t, B, T, C) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False)  # sees the future
        return self.resid_dropout(self.c_proj(self.merge_heads(y, B, T, C)))


class HeadsWithoutTranspose(CausalSelfAttention):
    def split_heads(self, t, B, T, C):
        return t.reshape(B, self.n_head, T, C // self.n_head)  # no transpose: each "head" mixes positions

    def merge_heads(self, y, B, T, C):
        return y.contiguous().view(B, T, C)


class UnbiasedLayerNorm(LayerNorm):
    def forward(self, input):
        mean = input.mean(-1, keepdim=True)
        var = input.var(-1, keepdim=True)  # torch's default: unbiased, / (n - 1)
        out = (input - mean) / torch.sqrt(var + 1e-5) * self.weight
        return out + self.bias if self.bias is not None else out


class EpsOutsideRoot(LayerNorm):
    def forward(self, input):
        mean = input.mean(-1, keepdim=True)
        std = input.var(-1, keepdim=True, unbiased=False).sqrt()
        out = (input - mean) / (std + 1e-5) * self.weight  # eps added to the standard deviation
        return out + self.bias if self.bias is not None else out


class Float32LayerNorm(LayerNorm):
    def forward(self, input):
        weight, bias = self.weight.float(), None if self.bias is None else self.bias.float()
        return F.layer_norm(input.float(), self.weight.shape, weight, bias, 1e-5).type_as(input)  # "for stability"


def _with_attention(attention, **overrides) -> GPT:
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(**overrides))
    for block in gpt.transformer.h:
        block.attn = attention(gpt.config)
    return gpt


def wrong_scale() -> GPT:
    return _with_attention(ScaledByHeadSize, flash=False)


def q_k_swapped() -> GPT:
    return _with_attention(QueriesAndKeysSwapped, flash=False)


def not_causal() -> GPT:
    return _with_attention(NoCausalMask)


def heads_without_transpose() -> GPT:
    return _with_attention(HeadsWithoutTranspose)


def _with_norm(norm) -> GPT:
    gpt = model()
    for block in gpt.transformer.h:
        block.ln_1 = norm(gpt.config.n_embd, bias=True)
        block.ln_2 = norm(gpt.config.n_embd, bias=True)
    gpt.transformer.ln_f = norm(gpt.config.n_embd, bias=True)
    return gpt


def unbiased_variance() -> GPT:
    return _with_norm(UnbiasedLayerNorm)


def eps_outside_sqrt() -> GPT:
    return _with_norm(EpsOutsideRoot)


def float32_island() -> GPT:
    """Not in MISTAKES: the layer norms compute in float32 whatever the model's dtype. Named (dtype.float32_island,
    at the first of them), then run in float64 for the float64 comparison, which it passes."""
    gpt = model()
    for block in gpt.transformer.h:
        block.ln_1 = Float32LayerNorm(gpt.config.n_embd, bias=True)
        block.ln_2 = Float32LayerNorm(gpt.config.n_embd, bias=True)
    return gpt


def manual_attention() -> GPT:
    """The clean model on the written-out softmax path (flash=False): it must pass too."""
    return model(flash=False)


# the clean model's other attention path: it must pass too
ALSO_CLEAN = [manual_attention]

# (factory, the catalogue id the judge must name first, the submodule it must name)
MISTAKES = [
    (wrong_scale, "attention.wrong_scale", "transformer.h.0.attn"),
    (not_causal, "attention.not_causal", "transformer.h.0.attn"),
    (heads_without_transpose, "attention.heads_without_transpose", "transformer.h.0.attn"),
    (q_k_swapped, "attention.q_k_swapped", "transformer.h.0.attn"),
    (unbiased_variance, "layer_norm.unbiased_variance", "transformer.h.0.ln_1"),
    (eps_outside_sqrt, "layer_norm.eps_outside_sqrt", "transformer.h.0.ln_1"),
]
