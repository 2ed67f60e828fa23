"""minGPT style: NewGELU written out (tanh), a Block whose MLP lives in an nn.ModuleDict and is called through a
per-instance lambda (`self.mlpf`), `forward(idx, targets=None) -> (logits, loss)` with every position's logits,
an untied `lm_head`."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.nn import functional as F

LEVEL = "transformer_lm"
CALL = None


class CfgNode:
    """minGPT's configuration object: a bag of attributes."""

    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


def get_default_config(**overrides) -> CfgNode:
    C = CfgNode(
        model_type="gpt-tiny",
        n_layer=2,
        n_head=2,
        n_embd=16,
        vocab_size=20,
        block_size=12,
        embd_pdrop=0.1,
        resid_pdrop=0.1,
        attn_pdrop=0.1,
    )
    C.__dict__.update(overrides)
    return C


class NewGELU(nn.Module):
    """GELU as in Google BERT and OpenAI GPT: the tanh approximation (https://arxiv.org/abs/1606.08415)."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)
        mask = torch.tril(torch.ones(config.block_size, config.block_size))
        self.register_buffer("bias", mask.view(1, 1, config.block_size, config.block_size))
        self.n_head = config.n_head
        self.n_embd = config.n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v  # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.ModuleDict(
            dict(
                c_fc=nn.Linear(config.n_embd, 4 * config.n_embd),
                c_proj=nn.Linear(4 * config.n_embd, config.n_embd),
                act=NewGELU(),
                dropout=nn.Dropout(config.resid_pdrop),
            )
        )
        m = self.mlp
        self.mlpf = lambda x: m.dropout(m.c_proj(m.act(m.c_fc(x))))  # MLP forward

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlpf(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config, attention=CausalSelfAttention):
        super().__init__()
        self.block_size = config.block_size
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.embd_pdrop),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        for block in self.transformer.h:
            block.attn = attention(config)
        self.apply(self._init_weights)

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        device = idx.device
        b, t = idx.size()
        assert t <= self.block_size, f"Cannot forward sequence of length {t}, block size is only {self.block_size}"
        pos = torch.arange(0, t, dtype=torch.long, device=device).unsqueeze(0)  # (1, t)
        tok_emb = self.transformer.wte(idx)  # (b, t, n_embd)
        pos_emb = self.transformer.wpe(pos)  # (1, t, n_embd)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


def model(**overrides) -> GPT:
    """The clean model: two layers, two heads, d_model 16, vocabulary 20, dropout 0.1 (off in eval)."""
    torch.manual_seed(0)
    return GPT(get_default_config(**overrides))


# --- mistakes put in on purpose ---------------------------------------------------------------------------------


class SoftmaxOverQueries(CausalSelfAttention):
    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-2)  # over the queries
        y = self.attn_dropout(att) @ v
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class ShowsNextPosition(CausalSelfAttention):
    def __init__(self, config):
        super().__init__(config)
        mask = torch.tril(torch.ones(config.block_size, config.block_size), diagonal=1)  # one step into the future
        self.bias.copy_(mask.view(1, 1, config.block_size, config.block_size))


class MaskAfterSoftmax(CausalSelfAttention):
    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = F.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1))), dim=-1)
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, 0.0)  # zeroed after the softmax, rows no longer sum to 1
        y = self.attn_dropout(att) @ v
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class DropoutAlwaysOn(CausalSelfAttention):
    def forward(self, x):
        y = super().forward(x)
        return F.dropout(y, p=0.1, training=True)  # F.dropout's training flag left at True: drops in eval too


def softmax_wrong_axis() -> GPT:
    torch.manual_seed(0)
    return GPT(get_default_config(), attention=SoftmaxOverQueries)


def causal_shows_next() -> GPT:
    torch.manual_seed(0)
    return GPT(get_default_config(), attention=ShowsNextPosition)


def mask_after_softmax() -> GPT:
    torch.manual_seed(0)
    return GPT(get_default_config(), attention=MaskAfterSoftmax)


def dropout_in_eval() -> GPT:
    torch.manual_seed(0)
    return GPT(get_default_config(), attention=DropoutAlwaysOn)


# (factory, the catalogue id the judge must name first, the submodule it must name)
MISTAKES = [
    (softmax_wrong_axis, "attention.softmax_wrong_axis", "transformer.h.0.attn"),
    (causal_shows_next, "attention.causal_shows_next", "transformer.h.0.attn"),
    (mask_after_softmax, "attention.mask_after_softmax", "transformer.h.0.attn"),
    (dropout_in_eval, "dropout.active_in_eval", "transformer.h.0.attn"),
]
