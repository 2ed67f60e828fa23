"""The Annotated Transformer's style: an EncoderDecoder built by `make_model` from `clones` of deep-copied parts,
attention as a free function, sublayers called through lambdas in `SublayerConnection` (pre-norm, final norms on
both stacks), a float32 sinusoid table as a buffer, masks built by the caller with `subsequent_mask`, and the output
head kept apart in `generator` (log_softmax). `EncoderDecoder.forward(src, tgt, src_mask, tgt_mask)` returns hidden
states, so the author's call (CALL) passes the masks.

The clean model's LayerNorm uses the right formula; the original's `a_2 * (x - mean) / (std + eps) + b_2` (unbiased
std, eps outside the root) is one of the mistakes put in below."""

from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn
from torch.nn.functional import log_softmax

LEVEL = "transformer"
PAD = 0


class EncoderDecoder(nn.Module):
    """A standard Encoder-Decoder architecture."""

    def __init__(self, encoder, decoder, src_embed, tgt_embed, generator):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.src_embed = src_embed
        self.tgt_embed = tgt_embed
        self.generator = generator

    def forward(self, src, tgt, src_mask, tgt_mask):
        """Take in and process masked src and target sequences."""
        return self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask)

    def encode(self, src, src_mask):
        return self.encoder(self.src_embed(src), src_mask)

    def decode(self, memory, src_mask, tgt, tgt_mask):
        return self.decoder(self.tgt_embed(tgt), memory, src_mask, tgt_mask)


class Generator(nn.Module):
    """Define standard linear + softmax generation step."""

    def __init__(self, d_model, vocab):
        super().__init__()
        self.proj = nn.Linear(d_model, vocab)

    def forward(self, x):
        return log_softmax(self.proj(x), dim=-1)


def clones(module, N):
    """Produce N identical layers."""
    return nn.ModuleList([copy.deepcopy(module) for _ in range(N)])


class LayerNorm(nn.Module):
    """Construct a layernorm module: (x - mean) / sqrt(var + eps), the biased variance, as nn.LayerNorm."""

    def __init__(self, features, eps=1e-6):
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(features))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, unbiased=False)
        return self.a_2 * (x - mean) / torch.sqrt(var + self.eps) + self.b_2


class Encoder(nn.Module):
    """Core encoder is a stack of N layers."""

    def __init__(self, layer, N):
        super().__init__()
        self.layers = clones(layer, N)
        self.norm = LayerNorm(layer.size)

    def forward(self, x, mask):
        """Pass the input (and mask) through each layer in turn."""
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


class SublayerConnection(nn.Module):
    """A residual connection followed by a layer norm (the norm first, for code simplicity)."""

    def __init__(self, size, dropout):
        super().__init__()
        self.norm = LayerNorm(size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, sublayer):
        """Apply residual connection to any sublayer with the same size."""
        return x + self.dropout(sublayer(self.norm(x)))


class EncoderLayer(nn.Module):
    """Encoder is made up of self-attn and feed forward."""

    def __init__(self, size, self_attn, feed_forward, dropout):
        super().__init__()
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.sublayer = clones(SublayerConnection(size, dropout), 2)
        self.size = size

    def forward(self, x, mask):
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, mask))
        return self.sublayer[1](x, self.feed_forward)


class Decoder(nn.Module):
    """Generic N layer decoder with masking."""

    def __init__(self, layer, N):
        super().__init__()
        self.layers = clones(layer, N)
        self.norm = LayerNorm(layer.size)

    def forward(self, x, memory, src_mask, tgt_mask):
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return self.norm(x)


class DecoderLayer(nn.Module):
    """Decoder is made of self-attn, src-attn, and feed forward."""

    def __init__(self, size, self_attn, src_attn, feed_forward, dropout):
        super().__init__()
        self.size = size
        self.self_attn = self_attn
        self.src_attn = src_attn
        self.feed_forward = feed_forward
        self.sublayer = clones(SublayerConnection(size, dropout), 3)

    def forward(self, x, memory, src_mask, tgt_mask):
        m = memory
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, tgt_mask))
        x = self.sublayer[1](x, lambda x: self.src_attn(x, m, m, src_mask))
        return self.sublayer[2](x, self.feed_forward)


def subsequent_mask(size):
    """Mask out subsequent positions."""
    attn_shape = (1, size, size)
    subsequent = torch.triu(torch.ones(attn_shape), diagonal=1).type(torch.uint8)
    return subsequent == 0


def attention(query, key, value, mask=None, dropout=None):
    """Compute 'Scaled Dot Product Attention'."""
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = scores.softmax(dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value), p_attn


class MultiHeadedAttention(nn.Module):
    def __init__(self, h, d_model, dropout=0.1, attention=attention):
        """Take in model size and number of heads."""
        super().__init__()
        assert d_model % h == 0
        self.d_k = d_model // h  # we assume d_v always equals d_k
        self.h = h
        self.linears = clones(nn.Linear(d_model, d_model), 4)
        self.attn = None
        self.dropout = nn.Dropout(p=dropout)
        self.attention = attention

    def forward(self, query, key, value, mask=None):
        if mask is not None:
            mask = mask.unsqueeze(1)  # the same mask applied to all h heads
        nbatches = query.size(0)
        # 1) Do all the linear projections in batch from d_model => h x d_k
        query, key, value = [
            lin(x).view(nbatches, -1, self.h, self.d_k).transpose(1, 2)
            for lin, x in zip(self.linears, (query, key, value), strict=False)
        ]
        # 2) Apply attention on all the projected vectors in batch.
        x, self.attn = self.attention(query, key, value, mask=mask, dropout=self.dropout)
        # 3) "Concat" using a view and apply a final linear.
        x = x.transpose(1, 2).contiguous().view(nbatches, -1, self.h * self.d_k)
        del query, key, value
        return self.linears[-1](x)


class PositionwiseFeedForward(nn.Module):
    """Implements FFN equation."""

    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.w_2(self.dropout(self.w_1(x).relu()))


class Embeddings(nn.Module):
    def __init__(self, d_model, vocab):
        super().__init__()
        self.lut = nn.Embedding(vocab, d_model)
        self.d_model = d_model

    def forward(self, x):
        return self.lut(x) * math.sqrt(self.d_model)


class PositionalEncoding(nn.Module):
    """Implement the PE function, the table computed once in float32."""

    def __init__(self, d_model, dropout, max_len=5000):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        pe = pe.unsqueeze(0)
        self.register_buffer("pe", pe)

    def forward(self, x):
        x = x + self.pe[:, : x.size(1)].requires_grad_(False)
        return self.dropout(x)


def make_model(
    src_vocab,
    tgt_vocab,
    N=6,
    d_model=512,
    d_ff=2048,
    h=8,
    dropout=0.1,
    norm=LayerNorm,
    attend=attention,
    embeddings=Embeddings,
    positions=PositionalEncoding,
):
    """Helper: Construct a model from hyperparameters (and, here, the parts a mistake replaces)."""
    c = copy.deepcopy
    attn = MultiHeadedAttention(h, d_model, attention=attend)
    ff = PositionwiseFeedForward(d_model, d_ff, dropout)
    position = positions(d_model, dropout)
    model = EncoderDecoder(
        Encoder(EncoderLayer(d_model, c(attn), c(ff), dropout), N),
        Decoder(DecoderLayer(d_model, c(attn), c(attn), c(ff), dropout), N),
        nn.Sequential(embeddings(d_model, src_vocab), c(position)),
        nn.Sequential(embeddings(d_model, tgt_vocab), c(position)),
        Generator(d_model, tgt_vocab),
    )
    for module in model.modules():
        if isinstance(module, (Encoder, Decoder, SublayerConnection)):
            module.norm = norm(module.norm.a_2.shape[0])
    for p in model.parameters():  # Glorot / fan_avg, as the original
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    return model


def model(**parts) -> EncoderDecoder:
    """The clean model: two layers each side, two heads, d_model 16, vocabularies 22 and 24."""
    torch.manual_seed(0)
    return make_model(22, 24, N=2, d_model=16, d_ff=32, h=2, **parts)


def make_std_mask(tgt, pad):
    """Create a mask to hide padding and future words."""
    tgt_mask = (tgt != pad).unsqueeze(-2)
    return tgt_mask & subsequent_mask(tgt.size(-1)).type_as(tgt_mask.data)


def CALL(model, src, tgt):
    """The author's call: masks as the original's Batch builds them, hidden states out (the generator is separate)."""
    src_mask = (src != PAD).unsqueeze(-2)
    return model(src, tgt, src_mask, make_std_mask(tgt, PAD))


# --- mistakes put in on purpose ---------------------------------------------------------------------------------


class OriginalLayerNorm(LayerNorm):
    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)  # unbiased, and eps added outside the root below
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2


def attention_mask_inverted(query, key, value, mask=None, dropout=None):
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 1, -1e9)  # hides what the mask keeps
    p_attn = scores.softmax(dim=-1)
    return torch.matmul(dropout(p_attn) if dropout is not None else p_attn, value), p_attn


def attention_by_d_k(query, key, value, mask=None, dropout=None):
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / d_k  # by d_k, not sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = scores.softmax(dim=-1)
    return torch.matmul(dropout(p_attn) if dropout is not None else p_attn, value), p_attn


class IntegerFrequencies(PositionalEncoding):
    def __init__(self, d_model, dropout, max_len=5000):
        super().__init__(d_model, dropout, max_len)
        position = torch.arange(0, max_len).unsqueeze(1)
        div_term = 1 / 10000 ** (torch.arange(0, d_model, 2) // d_model)  # integer division: every frequency is 1
        self.pe[0, :, 0::2] = torch.sin(position * div_term)
        self.pe[0, :, 1::2] = torch.cos(position * div_term)


class UnscaledEmbeddings(Embeddings):
    def forward(self, x):
        return self.lut(x)  # the sqrt(d_model) the paper multiplies by, forgotten


class EmbeddingsScaledTwice(Embeddings):
    def forward(self, x):
        return self.lut(x) * math.sqrt(self.d_model) * math.sqrt(self.d_model)  # scaled here and "again": by d_model


def std_plus_eps() -> EncoderDecoder:
    return model(norm=OriginalLayerNorm)


def mask_inverted() -> EncoderDecoder:
    return model(attend=attention_mask_inverted)


def wrong_scale() -> EncoderDecoder:
    return model(attend=attention_by_d_k)


def wrong_frequencies() -> EncoderDecoder:
    return model(positions=IntegerFrequencies)


def double_scale() -> EncoderDecoder:
    return model(embeddings=EmbeddingsScaledTwice)


def missing_scale() -> EncoderDecoder:
    """Not in MISTAKES: without the scale the model is another valid convention (GPT's), so it passes, and the
    result must say that the pass holds only if no scale was meant (embedding.missing_scale)."""
    return model(embeddings=UnscaledEmbeddings)


# (factory, the catalogue id the judge must name first, the submodule it must name)
MISTAKES = [
    (std_plus_eps, "layer_norm.unbiased_variance", "encoder.layers.0.sublayer.0.norm"),
    (mask_inverted, "attention.mask_inverted", "encoder.layers.0.self_attn"),
    (wrong_scale, "attention.wrong_scale", "encoder.layers.0.self_attn"),
    (wrong_frequencies, "positions.wrong_frequencies", "src_embed.1"),
    (double_scale, "embedding.double_scale", "src_embed.0"),
]
