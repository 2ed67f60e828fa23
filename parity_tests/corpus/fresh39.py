"""Transformer code of the 2017-2021 era that learners still copy from old blog posts, books and repositories
(issue 46, round 39), in this project's own words, run on today's torch. The judge meets it here first (measured
with the judge frozen).

- an OpenAI GPT-1 as its first PyTorch port wrote it: `super(Cls, self).__init__()`, a `Conv1D` whose weight is
  stored (in, out) and applied as `torch.addmm(b, x, W)`, GELU written as the tanh formula, post-LN blocks
  (`ln_1(x + a)`, `ln_2(n + m)`, no final norm), a hand LayerNorm with eps inside the root, learned positions, the
  keys split already transposed (`permute(0, 2, 3, 1)`), a `tril` buffer `b` applied as `w * b + -1e9 * (1 - b)`,
  `nn.functional.softmax(w, dim=-1)`, the head tied by `self.lm_head.weight = self.tokens_embed.weight`;
- a BERT of the pytorch-pretrained-bert era: `BertLayerNorm` written out, `(x - u) / torch.sqrt(s + eps)`, GELU by
  erf, token-type embeddings (ids all 0 when not passed), the extended mask `(1.0 - mask[:, None, None, :]) *
  -10000.0` added to the scores, heads folded as (B * H, T, dh) and multiplied by `torch.bmm`, merged back by
  `.contiguous().view`, init by `.data.normal_(0, 0.02)`; and the same BERT returning its pooler's
  `tanh(dense(h[:, 0]))` as well as the hidden states;
- a sequence-first (T, B, C) language model after the old `nn.Transformer` tutorial but with attention written by
  hand: `generate_square_subsequent_mask` (0 / -inf floats, by `masked_fill(mask == 0, float('-inf'))` on a
  `triu(...).transpose` of ones) added to the `bmm` scores, heads as (B * H, T, dh) by `.contiguous().view(T, B *
  H, dh).transpose(0, 1)`, the sinusoid table kept (max_len, 1, D) and added as `Variable(self.pe[:x.size(0)],
  requires_grad=False)`, embeddings times sqrt(D), an `xavier_uniform_` loop over the parameters of more than one
  axis, `self.decoder.weight = self.encoder.weight`, and `F.log_softmax(output, dim=-1)` returned;
- a batch-first "Transformer from scratch" GPT of a 2019 blog post: the causal mask built in NumPy,
  `np.triu(np.ones((1, T, T)), k=1).astype('uint8')` through `torch.from_numpy`, read as `mask == 0` (True =
  keep) and filled with the float -1e9 (`masked_fill(mask == 0, -1e9)`), `Variable(self.pe[:, :x.size(1)],
  requires_grad=False)`, `torch.autograd.Variable` around the ids, `F.softmax(x, dim=-1)`, pre-LN blocks with a
  final norm, a `sublayer` of residual connections.

Expected verdicts decided from the math before the judge ran. The fill of -1e9 (or -10000 added) is exact
wherever every row keeps a key: e^-1e9 and e^-10000 are 0 in float64 and float32, so the masked keys' weights are
exactly 0 (checked: the GPT-1 attention, the blog GPT's and the BERT's bmm attention each equal a plain
softmax(QK^T / sqrt(dh)) with -inf masks to 1e-15 in float64; the tutorial's (B * H, T, dh) fold equals the plain
(B, H, T, dh) one to 1e-15). GPT-1's keys split already transposed give the same QK^T. Token types all 0 add one
constant row, which a learned position table absorbs (a pass). The log-softmax output is the logits minus each
row's logsumexp (read as log-probabilities: a pass). The pooler's tanh of a projection of the first position is
math the reference has no pair for (a no pair, said at the pooler).

The mistakes, each in the second layer: GPT-1's `tril(..., diagonal=1)` (a query sees the next position); its
heads merged by `.view` without the permute back (heads_without_transpose); its hand LayerNorm of eps outside the
root (eps 1e-5, the ratio sqrt(s) / (sqrt(s) + eps) visible in float64); the BERT's BertLayerNorm with
`x.var(-1, keepdim=True)` (torch's unbiased default); its extended mask `mask * -10000.0` (the real tokens hidden);
its scores divided by sqrt(hidden_size) (wrong scale); the tutorial's `F.dropout(p, p=0.1)` whose `training`
defaults to True (dropout in evaluation); the tutorial's sinusoids built as torch 0.4 built them, a LongTensor
arange times a float truncated to 0 (every frequency 1; written here as `int(...)`); the blog GPT's mask read as
`mask == 1` on the uint8 table of ones above the diagonal (the polarity flipped: the past hidden, the future
kept).

A GPT-1 block alone at "decoder_only_layer" (the causal buffer built in) is judged too, and with its tril of
diagonal 1. A BertLayer alone takes the extended mask and the 0/1 mask both (`forward(hidden_states,
attention_mask, raw_mask)`): at "encoder_layer" without help the judge cannot call it, and the honest answer says
so and names `call=`; given one real call (`example=`) it is a pass, and its flipped mask is named. And the blog
GPT with Shaw et al.'s relative keys in both blocks (a learned vector per clipped distance j - i, its dot product
with the query added to the scores) is math the reference lacks: a no pair at blocks.0.attn, expected to name the
relative keys.

First met: 14 of 20 right. Wrong:

- openai_gpt1.causal_shows_next_second_block, openai_gpt1.heads_merged_without_permute_second_block and
  openai_gpt1.eps_outside_sqrt_second_block: each "differs at h.0.attn: the scores are multiplied by a learned
  factor of h.0.attn.b (a temperature), which the reference has no pair for" (the correct first block named; the
  mask written as a product, w * b + -1e9 * (1 - b), read as a learned temperature because b is a buffer; the
  correct model passes, so the reading only runs once something diverges, and it comes first in forward order);
- openai_gpt1.block.causal_shows_next: the same "differs at attn: ... a learned factor of attn.b (a temperature)";
- pretrained_bert.pooled: no id, no op: "unexplained: (the module): output diverges ...; no catalogue variant
  reproduces it" (the pooler's tanh of the first position's projection not said);
- blog_gpt.shaw_relative: "differs at blocks.0.attn: the scores get a second product added before the softmax,
  blocks.0.attn.q_linear.weight times the states, which the reference has no pair for" (class and place right, but
  the product is named by the query's weight, not by the relative key table it reads, relative_k).

Fixed since: a factor on the scores that is 1 at every (query, key) read is read as a mask's keep side, not a
learned temperature (GPT-1's 0/1 buffer beside its -1e9 term), so each second block's mistake is named; a head on
one position per sequence whose projection an activation follows (the pooler's tanh of the first position's dense)
is said where the row is picked, naming the activation; and an operand of a second product on the scores that is a
table's rows is named by that table and what picks them (relative_k, by key - query).

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

# ruff: noqa: UP008, UP018  (super(Cls, self) and float(0.0), as the era's code writes them)

from __future__ import annotations

import copy
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd import Variable
from torch.nn.parameter import Parameter

D, H, V, T_MAX = 32, 4, 26, 16
DH = D // H


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases moved off their 1s and 0s, so that a trained model's values are checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


# -- OpenAI GPT-1: Conv1D, tanh GELU, post-LN, a tril buffer applied as w * b + -1e9 * (1 - b) ---------------------


def gelu(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))


class LayerNorm(nn.Module):
    """The hand LayerNorm, eps inside the root; `eps_outside`: the mistake, sqrt(s) + eps."""

    eps_outside = False

    def __init__(self, n_state, e=1e-5):
        super(LayerNorm, self).__init__()
        self.g = nn.Parameter(torch.ones(n_state))
        self.b = nn.Parameter(torch.zeros(n_state))
        self.e = e

    def forward(self, x):
        u = x.mean(-1, keepdim=True)
        s = (x - u).pow(2).mean(-1, keepdim=True)
        if self.eps_outside:
            x = (x - u) / (torch.sqrt(s) + self.e)
        else:
            x = (x - u) / torch.sqrt(s + self.e)
        return self.g * x + self.b


class EpsOutsideLayerNorm(LayerNorm):
    eps_outside = True


class Conv1D(nn.Module):
    def __init__(self, nf, rf, nx):
        super(Conv1D, self).__init__()
        self.rf = rf
        self.nf = nf
        if rf == 1:  # faster 1x1 conv
            w = torch.empty(nx, nf)
            nn.init.normal_(w, std=0.02)
            self.w = Parameter(w)
            self.b = Parameter(torch.zeros(nf))
        else:
            raise NotImplementedError

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.b, x.view(-1, x.size(-1)), self.w)
        return x.view(*size_out)


class Attention(nn.Module):
    """`shows_next`: the mistake tril(..., diagonal=1); `merge_without_permute`: the heads merged by .view alone."""

    shows_next = False
    merge_without_permute = False

    def __init__(self, nx, n_ctx, n_head, scale=True):
        super(Attention, self).__init__()
        n_state = nx
        assert n_state % n_head == 0
        b = torch.tril(torch.ones(n_ctx, n_ctx), diagonal=1 if self.shows_next else 0)
        self.register_buffer("b", b.view(1, 1, n_ctx, n_ctx))
        self.n_head = n_head
        self.split_size = n_state
        self.scale = scale
        self.c_attn = Conv1D(n_state * 3, 1, nx)
        self.c_proj = Conv1D(n_state, 1, nx)
        self.attn_dropout = nn.Dropout(0.1)
        self.resid_dropout = nn.Dropout(0.1)

    def _attn(self, q, k, v):
        w = torch.matmul(q, k)
        if self.scale:
            w = w / math.sqrt(v.size(-1))
        b = self.b[:, :, : w.size(-2), : w.size(-1)]
        w = w * b + -1e9 * (1 - b)
        w = nn.functional.softmax(w, dim=-1)
        w = self.attn_dropout(w)
        return torch.matmul(w, v)

    def merge_heads(self, x):
        if not self.merge_without_permute:
            x = x.permute(0, 2, 1, 3).contiguous()
        new_x_shape = x.size()[:-2] + (x.size(-2) * x.size(-1),)
        if self.merge_without_permute:
            new_x_shape = (x.size(0), x.size(2), x.size(1) * x.size(3))
        return x.view(*new_x_shape)

    def split_heads(self, x, k=False):
        new_x_shape = x.size()[:-1] + (self.n_head, x.size(-1) // self.n_head)
        x = x.view(*new_x_shape)
        if k:
            return x.permute(0, 2, 3, 1)
        return x.permute(0, 2, 1, 3)

    def forward(self, x):
        x = self.c_attn(x)
        query, key, value = x.split(self.split_size, dim=2)
        query = self.split_heads(query)
        key = self.split_heads(key, k=True)
        value = self.split_heads(value)
        a = self._attn(query, key, value)
        a = self.merge_heads(a)
        a = self.c_proj(a)
        return self.resid_dropout(a)


class ShowsNextAttention(Attention):
    shows_next = True


class MergedWithoutPermute(Attention):
    merge_without_permute = True


class MLP(nn.Module):
    def __init__(self, n_state, nx):
        super(MLP, self).__init__()
        self.c_fc = Conv1D(n_state, 1, nx)
        self.c_proj = Conv1D(nx, 1, n_state)
        self.act = gelu
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        h = self.act(self.c_fc(x))
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    def __init__(self, n_ctx, nx, n_head, attention=Attention, norm=LayerNorm):
        super(Block, self).__init__()
        self.attn = attention(nx, n_ctx, n_head, scale=True)
        self.ln_1 = norm(nx)
        self.mlp = MLP(4 * nx, nx)
        self.ln_2 = LayerNorm(nx)

    def forward(self, x):
        a = self.attn(x)
        n = self.ln_1(x + a)
        m = self.mlp(n)
        return self.ln_2(n + m)


class OpenAIGPTLMHeadModel(nn.Module):
    def __init__(self, second_attention=Attention, second_norm=LayerNorm):
        super(OpenAIGPTLMHeadModel, self).__init__()
        self.tokens_embed = nn.Embedding(V, D)
        self.positions_embed = nn.Embedding(T_MAX, D)
        self.drop = nn.Dropout(0.1)
        self.h = nn.ModuleList([Block(T_MAX, D, H), Block(T_MAX, D, H, second_attention, second_norm)])
        self.lm_head = nn.Linear(D, V, bias=False)
        self.lm_head.weight = self.tokens_embed.weight  # Tied weights
        nn.init.normal_(self.tokens_embed.weight, std=0.02)
        nn.init.normal_(self.positions_embed.weight, std=0.01)

    def forward(self, input_ids, position_ids=None):
        if position_ids is None:
            position_ids = torch.arange(input_ids.size(-1), dtype=torch.long, device=input_ids.device)
            position_ids = position_ids.unsqueeze(0).expand_as(input_ids)
        hidden_states = self.drop(self.tokens_embed(input_ids) + self.positions_embed(position_ids))
        for block in self.h:
            hidden_states = block(hidden_states)
        return self.lm_head(hidden_states)


def gpt1(second_attention=Attention, second_norm=LayerNorm):
    torch.manual_seed(0)
    return _jitter(OpenAIGPTLMHeadModel(second_attention, second_norm))


# -- pytorch-pretrained-bert: BertLayerNorm by hand, -10000 extended mask, bmm over (B * H, T, dh) -------------------


class BertLayerNorm(nn.Module):
    """`unbiased`: the mistake, s = x.var(-1, keepdim=True) (divides by n - 1)."""

    unbiased = False

    def __init__(self, hidden_size, eps=1e-12):
        super(BertLayerNorm, self).__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x):
        u = x.mean(-1, keepdim=True)
        s = x.var(-1, keepdim=True) if self.unbiased else (x - u).pow(2).mean(-1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.variance_epsilon)
        return self.weight * x + self.bias


class UnbiasedBertLayerNorm(BertLayerNorm):
    unbiased = True


class BertSelfAttention(nn.Module):
    """Heads folded to (B * H, T, dh) for torch.bmm. `flip_mask`: the mistake, the extended mask rebuilt here as
    mask * -10000 (the real tokens hidden); `model_width_scale`: the scores divided by sqrt(hidden_size)."""

    flip_mask = False
    model_width_scale = False

    def __init__(self, hidden_size, num_attention_heads):
        super(BertSelfAttention, self).__init__()
        self.num_attention_heads = num_attention_heads
        self.attention_head_size = int(hidden_size / num_attention_heads)
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.query = nn.Linear(hidden_size, self.all_head_size)
        self.key = nn.Linear(hidden_size, self.all_head_size)
        self.value = nn.Linear(hidden_size, self.all_head_size)
        self.dropout = nn.Dropout(0.1)

    def fold(self, x):
        B, T, _ = x.size()
        x = x.view(B, T, self.num_attention_heads, self.attention_head_size).transpose(1, 2)
        return x.contiguous().view(B * self.num_attention_heads, T, self.attention_head_size)

    def forward(self, hidden_states, attention_mask, raw_mask):
        B, T, _ = hidden_states.size()
        q = self.fold(self.query(hidden_states))
        k = self.fold(self.key(hidden_states))
        v = self.fold(self.value(hidden_states))
        scores = torch.bmm(q, k.transpose(1, 2))
        width = self.all_head_size if self.model_width_scale else self.attention_head_size
        scores = scores / math.sqrt(width)
        if self.flip_mask:
            attention_mask = raw_mask[:, None, None, :].to(dtype=scores.dtype) * -10000.0
        scores = scores.view(B, self.num_attention_heads, T, T) + attention_mask
        probs = nn.Softmax(dim=-1)(scores)
        probs = self.dropout(probs).view(B * self.num_attention_heads, T, T)
        context = torch.bmm(probs, v).view(B, self.num_attention_heads, T, self.attention_head_size)
        return context.transpose(1, 2).contiguous().view(B, T, self.all_head_size)


class FlippedMaskSelfAttention(BertSelfAttention):
    flip_mask = True


class WidthScaledSelfAttention(BertSelfAttention):
    model_width_scale = True


class BertSelfOutput(nn.Module):
    def __init__(self, hidden_size, norm):
        super(BertSelfOutput, self).__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.LayerNorm = norm(hidden_size, eps=1e-12)
        self.dropout = nn.Dropout(0.1)

    def forward(self, hidden_states, input_tensor):
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + input_tensor)


class BertAttention(nn.Module):
    def __init__(self, hidden_size, heads, self_attention, norm):
        super(BertAttention, self).__init__()
        self.self = self_attention(hidden_size, heads)
        self.output = BertSelfOutput(hidden_size, norm)

    def forward(self, input_tensor, attention_mask, raw_mask):
        return self.output(self.self(input_tensor, attention_mask, raw_mask), input_tensor)


def bert_gelu(x):
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


class BertLayer(nn.Module):
    def __init__(self, hidden_size, heads, self_attention=BertSelfAttention, norm=BertLayerNorm):
        super(BertLayer, self).__init__()
        self.attention = BertAttention(hidden_size, heads, self_attention, norm)
        self.intermediate = nn.Linear(hidden_size, 4 * hidden_size)
        self.output = nn.Linear(4 * hidden_size, hidden_size)
        self.output_norm = BertLayerNorm(hidden_size, eps=1e-12)
        self.dropout = nn.Dropout(0.1)

    def forward(self, hidden_states, attention_mask, raw_mask):
        attention_output = self.attention(hidden_states, attention_mask, raw_mask)
        h = self.output(bert_gelu(self.intermediate(attention_output)))
        return self.output_norm(self.dropout(h) + attention_output)


class BertPooler(nn.Module):
    def __init__(self, hidden_size):
        super(BertPooler, self).__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states):
        return self.activation(self.dense(hidden_states[:, 0]))


class BertModel(nn.Module):
    def __init__(self, second_attention=BertSelfAttention, second_norm=BertLayerNorm, pooled=False):
        super(BertModel, self).__init__()
        self.word_embeddings = nn.Embedding(V, D)
        self.position_embeddings = nn.Embedding(T_MAX, D)
        self.token_type_embeddings = nn.Embedding(2, D)
        self.LayerNorm = BertLayerNorm(D, eps=1e-12)
        self.dropout = nn.Dropout(0.1)
        self.layer = nn.ModuleList([BertLayer(D, H), BertLayer(D, H, second_attention, second_norm)])
        self.pooled = pooled
        if pooled:
            self.pooler = BertPooler(D)
        self.apply(self.init_bert_weights)

    def init_bert_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            module.bias.data.zero_()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        extended_attention_mask = attention_mask.unsqueeze(1).unsqueeze(2)
        extended_attention_mask = extended_attention_mask.to(dtype=self.word_embeddings.weight.dtype)
        extended_attention_mask = (1.0 - extended_attention_mask) * -10000.0
        position_ids = torch.arange(input_ids.size(1), dtype=torch.long, device=input_ids.device)
        position_ids = position_ids.unsqueeze(0).expand_as(input_ids)
        embeddings = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        hidden_states = self.dropout(self.LayerNorm(embeddings))
        for layer_module in self.layer:
            hidden_states = layer_module(hidden_states, extended_attention_mask, attention_mask)
        return self.pooler(hidden_states) if self.pooled else hidden_states


def bert(second_attention=BertSelfAttention, second_norm=BertLayerNorm, pooled=False):
    torch.manual_seed(0)
    return _jitter(BertModel(second_attention, second_norm, pooled))


def _layer_call():
    """One real call of a BertLayer: states, the extended mask (-10000 on the padding) and the 0/1 mask."""
    raw = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(1))
    return (x, (1.0 - raw[:, None, None, :].float()) * -10000.0, raw), {}


# -- the nn.Transformer tutorial, attention by hand: (T, B, C), a 0 / -inf float mask added, log_softmax out --------


class PositionalEncoding(nn.Module):
    """The (max_len, 1, D) table; `torch04`: the mistake, the arange a LongTensor times a float truncated to 0 (as
    torch 0.4 computed it), so every frequency is e^0 = 1."""

    torch04 = False

    def __init__(self, d_model, dropout=0.1, max_len=5000):
        super(PositionalEncoding, self).__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len).unsqueeze(1).float()
        if self.torch04:
            div_term = torch.exp((torch.arange(0, d_model, 2) * int(-math.log(10000.0) / d_model)).float())
        else:
            div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        pe = pe.unsqueeze(0).transpose(0, 1)
        self.register_buffer("pe", pe)

    def forward(self, x):
        x = x + Variable(self.pe[: x.size(0), :], requires_grad=False)
        return self.dropout(x)


class Torch04PositionalEncoding(PositionalEncoding):
    torch04 = True


class SelfAttention(nn.Module):
    """(T, B, C) in and out, heads folded to (B * H, T, dh); `eval_dropout`: the mistake, F.dropout(p, p=0.1) with
    `training` left at its default (True)."""

    eval_dropout = False

    def __init__(self, embed_dim, num_heads, dropout=0.1):
        super(SelfAttention, self).__init__()
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, dropout
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim**-0.5
        self.in_proj = nn.Linear(embed_dim, 3 * embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x, attn_mask):
        T, B, C = x.size()
        q, k, v = self.in_proj(x).chunk(3, dim=-1)
        q = (q * self.scaling).contiguous().view(T, B * self.num_heads, self.head_dim).transpose(0, 1)
        k = k.contiguous().view(T, B * self.num_heads, self.head_dim).transpose(0, 1)
        v = v.contiguous().view(T, B * self.num_heads, self.head_dim).transpose(0, 1)
        attn_weights = torch.bmm(q, k.transpose(1, 2))
        attn_weights += attn_mask.unsqueeze(0)
        attn_weights = F.softmax(attn_weights, dim=-1)
        if self.eval_dropout:
            attn_weights = F.dropout(attn_weights, p=self.dropout)
        else:
            attn_weights = F.dropout(attn_weights, p=self.dropout, training=self.training)
        attn = torch.bmm(attn_weights, v)
        attn = attn.transpose(0, 1).contiguous().view(T, B, C)
        return self.out_proj(attn)


class EvalDropoutSelfAttention(SelfAttention):
    eval_dropout = True


class EncoderLayer(nn.Module):
    def __init__(self, d_model, nhead, dim_feedforward, dropout, attention=SelfAttention):
        super(EncoderLayer, self).__init__()
        self.self_attn = attention(d_model, nhead, dropout)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, src, src_mask):
        src = self.norm1(src + self.dropout(self.self_attn(src, src_mask)))
        return self.norm2(src + self.dropout(self.linear2(F.relu(self.linear1(src)))))


class TransformerModel(nn.Module):
    def __init__(self, ntoken, ninp, nhead, nhid, nlayers, dropout=0.1, second=SelfAttention, pos=PositionalEncoding):
        super(TransformerModel, self).__init__()
        self.model_type = "Transformer"
        self.src_mask = None
        self.pos_encoder = pos(ninp, dropout)
        layer = EncoderLayer(ninp, nhead, nhid, dropout)
        self.layers = nn.ModuleList([copy.deepcopy(layer) for _ in range(nlayers - 1)])
        self.layers.append(EncoderLayer(ninp, nhead, nhid, dropout, second))
        self.encoder = nn.Embedding(ntoken, ninp)
        self.ninp = ninp
        self.decoder = nn.Linear(ninp, ntoken)
        self.decoder.weight = self.encoder.weight
        for p in self.parameters():
            if p.dim() > 1:
                torch.nn.init.xavier_uniform_(p)

    def generate_square_subsequent_mask(self, sz):
        mask = (torch.triu(torch.ones(sz, sz)) == 1).transpose(0, 1)
        mask = mask.float().masked_fill(mask == 0, float("-inf")).masked_fill(mask == 1, float(0.0))
        return mask

    def forward(self, src, has_mask=True):
        if has_mask:
            device = src.device
            if self.src_mask is None or self.src_mask.size(0) != len(src):
                self.src_mask = self.generate_square_subsequent_mask(len(src)).to(device)
        src = self.encoder(src) * math.sqrt(self.ninp)
        output = self.pos_encoder(src)
        for layer in self.layers:
            output = layer(output, self.src_mask.to(output.dtype))
        return F.log_softmax(self.decoder(output), dim=-1)


def tutorial_lm(second=SelfAttention, pos=PositionalEncoding):
    torch.manual_seed(0)
    return _jitter(TransformerModel(V, D, H, 64, 2, 0.1, second, pos))


# -- a 2019 blog post's GPT: a NumPy uint8 mask, Variable everywhere, pre-LN with a sublayer connection -------------


def subsequent_mask(size, flipped=False):
    attn_shape = (1, size, size)
    mask = np.triu(np.ones(attn_shape), k=1).astype("uint8")
    return torch.from_numpy(mask) == (1 if flipped else 0)


class MultiHeadedAttention(nn.Module):
    """`flipped`: the mistake, the uint8 table read as mask == 1 (True on the future: the future kept)."""

    flipped = False

    def __init__(self, h, d_model, dropout=0.1):
        super(MultiHeadedAttention, self).__init__()
        self.d_k = d_model // h
        self.h = h
        self.q_linear = nn.Linear(d_model, d_model)
        self.k_linear = nn.Linear(d_model, d_model)
        self.v_linear = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        bs, T = x.size(0), x.size(1)
        mask = Variable(subsequent_mask(T, self.flipped).to(x.device))
        k = self.k_linear(x).view(bs, -1, self.h, self.d_k).transpose(1, 2)
        q = self.q_linear(x).view(bs, -1, self.h, self.d_k).transpose(1, 2)
        v = self.v_linear(x).view(bs, -1, self.h, self.d_k).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)
        scores = scores.masked_fill(mask.unsqueeze(1) == 0, -1e9)
        scores = self.dropout(F.softmax(scores, dim=-1))
        concat = torch.matmul(scores, v).transpose(1, 2).contiguous().view(bs, -1, self.h * self.d_k)
        return self.out(concat)


class FlippedMaskAttention(MultiHeadedAttention):
    flipped = True


class RelativeAttention(MultiHeadedAttention):
    """Shaw et al. (2018) as tutorials of 2019 copied it: a learned key vector per clipped distance j - i, its dot
    product with the query added to the scores (no absolute table needed, but the blog keeps it)."""

    def __init__(self, h, d_model, dropout=0.1, max_relative_position=4):
        super(RelativeAttention, self).__init__(h, d_model, dropout)
        self.max_relative_position = max_relative_position
        self.relative_k = nn.Embedding(2 * max_relative_position + 1, self.d_k)

    def forward(self, x):
        bs, T = x.size(0), x.size(1)
        mask = Variable(subsequent_mask(T).to(x.device))
        k = self.k_linear(x).view(bs, -1, self.h, self.d_k).transpose(1, 2)
        q = self.q_linear(x).view(bs, -1, self.h, self.d_k).transpose(1, 2)
        v = self.v_linear(x).view(bs, -1, self.h, self.d_k).transpose(1, 2)
        r = torch.arange(T, device=x.device)
        distance = torch.clamp(r[None, :] - r[:, None], -self.max_relative_position, self.max_relative_position)
        rel = self.relative_k(distance + self.max_relative_position)
        scores = torch.matmul(q, k.transpose(-2, -1)) + torch.einsum("bhid,ijd->bhij", q, rel)
        scores = scores.masked_fill(mask.unsqueeze(1) == 0, -1e9) / math.sqrt(self.d_k)
        scores = self.dropout(F.softmax(scores, dim=-1))
        concat = torch.matmul(scores, v).transpose(1, 2).contiguous().view(bs, -1, self.h * self.d_k)
        return self.out(concat)


class PositionalEncoder(nn.Module):
    def __init__(self, d_model, max_seq_len=80):
        super(PositionalEncoder, self).__init__()
        self.d_model = d_model
        pe = torch.zeros(max_seq_len, d_model)
        for pos in range(max_seq_len):
            for i in range(0, d_model, 2):
                pe[pos, i] = math.sin(pos / (10000 ** (i / d_model)))
                pe[pos, i + 1] = math.cos(pos / (10000 ** (i / d_model)))
        self.register_buffer("pe", pe.unsqueeze(0))

    def forward(self, x):
        x = x * math.sqrt(self.d_model)
        return x + Variable(self.pe[:, : x.size(1)], requires_grad=False)


class SublayerConnection(nn.Module):
    def __init__(self, size, dropout):
        super(SublayerConnection, self).__init__()
        self.norm = nn.LayerNorm(size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, sublayer):
        return x + self.dropout(sublayer(self.norm(x)))


class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff=64, dropout=0.1):
        super(FeedForward, self).__init__()
        self.linear_1 = nn.Linear(d_model, d_ff)
        self.dropout = nn.Dropout(dropout)
        self.linear_2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.linear_2(self.dropout(F.relu(self.linear_1(x))))


class DecoderBlock(nn.Module):
    def __init__(self, d_model, heads, attention=MultiHeadedAttention, dropout=0.1):
        super(DecoderBlock, self).__init__()
        self.attn = attention(heads, d_model, dropout)
        self.ff = FeedForward(d_model)
        self.sublayer = nn.ModuleList([SublayerConnection(d_model, dropout) for _ in range(2)])

    def forward(self, x):
        x = self.sublayer[0](x, lambda x: self.attn(x))
        return self.sublayer[1](x, self.ff)


class BlogGPT(nn.Module):
    def __init__(self, second=MultiHeadedAttention, first=MultiHeadedAttention):
        super(BlogGPT, self).__init__()
        self.embed = nn.Embedding(V, D)
        self.pe = PositionalEncoder(D, T_MAX)
        self.blocks = nn.ModuleList([DecoderBlock(D, H, first), DecoderBlock(D, H, second)])
        self.norm = nn.LayerNorm(D)
        self.out = nn.Linear(D, V)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def forward(self, src):
        x = self.pe(self.embed(Variable(src)))
        for block in self.blocks:
            x = block(x)
        return self.out(self.norm(x))


def blog_gpt(second=MultiHeadedAttention, first=MultiHeadedAttention):
    torch.manual_seed(0)
    return _jitter(BlogGPT(second, first))


CASES = [
    ("openai_gpt1", gpt1, "transformer_lm", {}, "pass"),
    (
        "openai_gpt1.causal_shows_next_second_block",
        lambda: gpt1(ShowsNextAttention),
        "transformer_lm",
        {},
        ("mistake", "attention.causal_shows_next", "h.1.attn"),
    ),
    (
        "openai_gpt1.heads_merged_without_permute_second_block",
        lambda: gpt1(MergedWithoutPermute),
        "transformer_lm",
        {},
        ("mistake", "attention.heads_without_transpose", "h.1.attn"),
    ),
    (
        "openai_gpt1.eps_outside_sqrt_second_block",
        lambda: gpt1(second_norm=EpsOutsideLayerNorm),
        "transformer_lm",
        {},
        ("mistake", "layer_norm.eps_outside_sqrt", "h.1.ln_1"),
    ),
    ("openai_gpt1.block", lambda: gpt1().h[1], "decoder_only_layer", {}, "pass"),
    (
        "openai_gpt1.block.causal_shows_next",
        lambda: gpt1(ShowsNextAttention).h[1],
        "decoder_only_layer",
        {},
        ("mistake", "attention.causal_shows_next", "attn"),
    ),
    ("pretrained_bert", bert, "encoder_model", {}, "pass"),
    (
        "pretrained_bert.unbiased_variance_second_layer",
        lambda: bert(second_norm=UnbiasedBertLayerNorm),
        "encoder_model",
        {},
        ("mistake", "layer_norm.unbiased_variance", "layer.1.attention.output.LayerNorm"),
    ),
    (
        "pretrained_bert.mask_flipped_second_layer",
        lambda: bert(FlippedMaskSelfAttention),
        "encoder_model",
        {},
        ("mistake", "attention.mask_inverted", "layer.1.attention.self"),
    ),
    (
        "pretrained_bert.scaled_by_hidden_size_second_layer",
        lambda: bert(WidthScaledSelfAttention),
        "encoder_model",
        {},
        ("mistake", "attention.wrong_scale", "layer.1.attention.self"),
    ),
    (
        "pretrained_bert.layer",
        lambda: bert().layer[1],
        "encoder_layer",
        {},
        ("could not judge", None, "pass call="),
    ),
    ("pretrained_bert.layer.example", lambda: bert().layer[1], "encoder_layer", {"example": _layer_call()}, "pass"),
    (
        "pretrained_bert.layer.example.mask_flipped",
        lambda: bert(FlippedMaskSelfAttention).layer[1],
        "encoder_layer",
        {"example": _layer_call()},
        ("mistake", "attention.mask_inverted", "attention.self"),
    ),
    (
        "pretrained_bert.pooled",
        lambda: bert(pooled=True),
        "encoder_model",
        {},
        ("no pair", "pooler", "tanh"),
    ),
    ("tutorial_hand_lm", tutorial_lm, "transformer_lm", {}, "pass"),
    (
        "tutorial_hand_lm.dropout_training_default_second_layer",
        lambda: tutorial_lm(EvalDropoutSelfAttention),
        "transformer_lm",
        {},
        ("mistake", "dropout.active_in_eval", "layers.1.self_attn"),
    ),
    (
        "tutorial_hand_lm.torch04_frequencies",
        lambda: tutorial_lm(pos=Torch04PositionalEncoding),
        "transformer_lm",
        {},
        ("mistake", "positions.wrong_frequencies", "pos_encoder"),
    ),
    ("blog_gpt", blog_gpt, "transformer_lm", {}, "pass"),
    (
        "blog_gpt.uint8_mask_flipped_second_block",
        lambda: blog_gpt(FlippedMaskAttention),
        "transformer_lm",
        {},
        ("mistake", "attention.mask_inverted", "blocks.1.attn"),
    ),
    (
        "blog_gpt.shaw_relative",
        lambda: blog_gpt(RelativeAttention, RelativeAttention),
        "transformer_lm",
        {},
        ("no pair", "blocks.0.attn", "relative"),
    ),
]
