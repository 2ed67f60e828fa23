"""d2l.ai style: the Transformer encoder of "Dive into Deep Learning". Lazy linears, attention through a
`DotProductAttention` whose `masked_softmax` fills the scores past each sequence's `valid_lens` with -1e6, heads
folded into the batch by `transpose_qkv` / `transpose_output`, `AddNorm` (post-norm: ln(dropout(Y) + X)),
`PositionWiseFFN`, a float32 sinusoid table `P` kept as a plain tensor attribute, blocks in an nn.Sequential.
`forward(X, valid_lens)`: the author's call (CALL) gives each sequence's length, as d2l's data iterators do."""

import math

import torch
from torch import nn

LEVEL = "encoder"
PAD = 0


def masked_softmax(X, valid_lens):
    """Perform softmax operation by masking elements on the last axis."""

    # X: 3D tensor, valid_lens: 1D or 2D tensor
    def _sequence_mask(X, valid_len, value=0):
        maxlen = X.size(1)
        mask = torch.arange((maxlen), dtype=torch.float32, device=X.device)[None, :] < valid_len[:, None]
        X[~mask] = value
        return X

    if valid_lens is None:
        return nn.functional.softmax(X, dim=-1)
    shape = X.shape
    if valid_lens.dim() == 1:
        valid_lens = torch.repeat_interleave(valid_lens, shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)
    # On the last axis, replace masked elements with a very large negative value, whose exponentiation outputs 0
    X = _sequence_mask(X.reshape(-1, shape[-1]), valid_lens, value=-1e6)
    return nn.functional.softmax(X.reshape(shape), dim=-1)


class DotProductAttention(nn.Module):
    """Scaled dot product attention."""

    def __init__(self, dropout, scale=math.sqrt):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.scale = scale

    # Shape of queries: (batch_size, no. of queries, d); of keys: (batch_size, no. of key-value pairs, d);
    # of values: (batch_size, no. of key-value pairs, value dimension);
    # of valid_lens: (batch_size,) or (batch_size, no. of queries)
    def forward(self, queries, keys, values, valid_lens=None):
        d = queries.shape[-1]
        scores = torch.bmm(queries, keys.transpose(1, 2)) / self.scale(d)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


class MultiHeadAttention(nn.Module):
    """Multi-head attention."""

    def __init__(self, num_hiddens, num_heads, dropout, bias=False, attention=DotProductAttention):
        super().__init__()
        self.num_heads = num_heads
        self.attention = attention(dropout)
        self.W_q = nn.LazyLinear(num_hiddens, bias=bias)
        self.W_k = nn.LazyLinear(num_hiddens, bias=bias)
        self.W_v = nn.LazyLinear(num_hiddens, bias=bias)
        self.W_o = nn.LazyLinear(num_hiddens, bias=bias)

    def forward(self, queries, keys, values, valid_lens):
        # After transposing, shape of output queries, keys, or values:
        # (batch_size * num_heads, no. of queries or key-value pairs, num_hiddens / num_heads)
        queries = self.transpose_qkv(self.W_q(queries))
        keys = self.transpose_qkv(self.W_k(keys))
        values = self.transpose_qkv(self.W_v(values))
        if valid_lens is not None:
            # On axis 0, copy the first item (scalar or vector) for num_heads times, then copy the next item, ...
            valid_lens = torch.repeat_interleave(valid_lens, repeats=self.num_heads, dim=0)
        output = self.attention(queries, keys, values, valid_lens)  # (batch_size * num_heads, no. of queries, ...)
        output_concat = self.transpose_output(output)  # (batch_size, no. of queries, num_hiddens)
        return self.W_o(output_concat)

    def transpose_qkv(self, X):
        """Transposition for parallel computation of multiple attention heads."""
        X = X.reshape(X.shape[0], X.shape[1], self.num_heads, -1)
        X = X.permute(0, 2, 1, 3)
        return X.reshape(-1, X.shape[2], X.shape[3])

    def transpose_output(self, X):
        """Reverse the operation of transpose_qkv."""
        X = X.reshape(-1, self.num_heads, X.shape[1], X.shape[2])
        X = X.permute(0, 2, 1, 3)
        return X.reshape(X.shape[0], X.shape[1], -1)


class PositionalEncoding(nn.Module):
    """Positional encoding."""

    def __init__(self, num_hiddens, dropout, max_len=1000):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        # Create a long enough P
        self.P = torch.zeros((1, max_len, num_hiddens))
        X = torch.arange(max_len, dtype=torch.float32).reshape(-1, 1) / torch.pow(
            10000, self.exponents(num_hiddens) / num_hiddens
        )
        self.P[:, :, 0::2] = torch.sin(X)
        self.P[:, :, 1::2] = torch.cos(X)

    def exponents(self, num_hiddens):
        return torch.arange(0, num_hiddens, 2, dtype=torch.float32)

    def forward(self, X):
        X = X + self.P[:, : X.shape[1], :].to(X.device)
        return self.dropout(X)


class PositionWiseFFN(nn.Module):
    """The positionwise feed-forward network."""

    def __init__(self, ffn_num_hiddens, ffn_num_outputs):
        super().__init__()
        self.dense1 = nn.LazyLinear(ffn_num_hiddens)
        self.relu = nn.ReLU()
        self.dense2 = nn.LazyLinear(ffn_num_outputs)

    def forward(self, X):
        return self.dense2(self.relu(self.dense1(X)))


class AddNorm(nn.Module):
    """The residual connection followed by layer normalization."""

    def __init__(self, norm_shape, dropout):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.ln = nn.LayerNorm(norm_shape)

    def forward(self, X, Y):
        return self.ln(self.dropout(Y) + X)


class TransformerEncoderBlock(nn.Module):
    """The Transformer encoder block."""

    def __init__(self, num_hiddens, ffn_num_hiddens, num_heads, dropout, use_bias=False, attention=MultiHeadAttention):
        super().__init__()
        self.attention = attention(num_hiddens, num_heads, dropout, use_bias)
        self.addnorm1 = AddNorm(num_hiddens, dropout)
        self.ffn = PositionWiseFFN(ffn_num_hiddens, num_hiddens)
        self.addnorm2 = AddNorm(num_hiddens, dropout)

    def forward(self, X, valid_lens):
        Y = self.addnorm1(X, self.attention(X, X, X, valid_lens))
        return self.addnorm2(Y, self.ffn(Y))


class TransformerEncoder(nn.Module):
    """The Transformer encoder."""

    def __init__(
        self,
        vocab_size,
        num_hiddens,
        ffn_num_hiddens,
        num_heads,
        num_blks,
        dropout,
        use_bias=False,
        attention=MultiHeadAttention,
        positions=PositionalEncoding,
    ):
        super().__init__()
        self.num_hiddens = num_hiddens
        self.embedding = nn.Embedding(vocab_size, num_hiddens)
        self.pos_encoding = positions(num_hiddens, dropout)
        self.blks = nn.Sequential()
        for i in range(num_blks):
            block = TransformerEncoderBlock(num_hiddens, ffn_num_hiddens, num_heads, dropout, use_bias, attention)
            self.blks.add_module("block" + str(i), block)

    def forward(self, X, valid_lens):
        # Since positional encoding values are between -1 and 1, the embedding values are multiplied by the square
        # root of the embedding dimension to rescale before they are summed up
        X = self.pos_encoding(self.embedding(X) * math.sqrt(self.num_hiddens))
        self.attention_weights = [None] * len(self.blks)
        for i, blk in enumerate(self.blks):
            X = blk(X, valid_lens)
            self.attention_weights[i] = blk.attention.attention.attention_weights
        return X


def CALL(encoder, X):
    """The author's call: each sequence's valid length, as d2l's data iterators give it with the batch."""
    valid_lens = (X != PAD).sum(dim=1)
    return encoder(X, valid_lens)


def model(**parts) -> TransformerEncoder:
    """The clean model: two blocks, two heads, d_model 24, FFN 48, vocabulary 30; the lazy linears materialised by
    one forward pass, as d2l does before training."""
    torch.manual_seed(0)
    encoder = TransformerEncoder(30, 24, 48, 2, 2, 0.1, **parts)
    encoder.eval()
    with torch.no_grad():
        CALL(encoder, torch.ones((2, 5), dtype=torch.long))
    return encoder


# --- mistakes put in on purpose ---------------------------------------------------------------------------------


class ScaledByD(DotProductAttention):
    def __init__(self, dropout):
        super().__init__(dropout, scale=float)  # scores / d, not / sqrt(d)


class IgnoresValidLens(DotProductAttention):
    def forward(self, queries, keys, values, valid_lens=None):
        d = queries.shape[-1]
        scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)
        self.attention_weights = masked_softmax(scores, None)  # valid_lens taken and dropped
        return torch.bmm(self.dropout(self.attention_weights), values)


class HeadsWithoutTranspose(MultiHeadAttention):
    def transpose_qkv(self, X):
        return X.reshape(X.shape[0] * self.num_heads, X.shape[1], -1)  # no permute: heads mix positions

    def transpose_output(self, X):
        return X.reshape(-1, X.shape[1], X.shape[2] * self.num_heads)  # (B * H, T, Dh) read back as (B, T, D)


class IntegerExponents(PositionalEncoding):
    def exponents(self, num_hiddens):
        return torch.arange(0, num_hiddens, 2) // num_hiddens * num_hiddens  # integer division: every frequency is 1


def _with_attention(scores) -> TransformerEncoder:
    return model(attention=lambda *args: MultiHeadAttention(*args, attention=scores))


def wrong_scale() -> TransformerEncoder:
    return _with_attention(ScaledByD)


def mask_ignored() -> TransformerEncoder:
    return _with_attention(IgnoresValidLens)


def heads_without_transpose() -> TransformerEncoder:
    return model(attention=HeadsWithoutTranspose)


def wrong_frequencies() -> TransformerEncoder:
    return model(positions=IntegerExponents)


# (factory, the catalogue id the judge must name first, the submodule it must name)
MISTAKES = [
    (wrong_scale, "attention.wrong_scale", "blks.block0.attention"),
    (mask_ignored, "attention.mask_ignored", "blks.block0.attention"),
    (heads_without_transpose, "attention.heads_without_transpose", "blks.block0.attention"),
    (wrong_frequencies, "positions.wrong_frequencies", "pos_encoding"),
]
