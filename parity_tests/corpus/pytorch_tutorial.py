"""PyTorch tutorial style ("Language Modeling with nn.Transformer"): an nn.TransformerEncoder run sequence-first
(T, B), token embeddings scaled by sqrt(d_model), a sinusoid PositionalEncoding kept as a (max_len, 1, D) float32
buffer with dropout, the causal mask an additive float (T, T) matrix from `generate_square_subsequent_mask` (built
in `forward` when the caller passes none), `init_weights` with uniform ranges, a linear decoder to the vocabulary."""

import math

import torch
from torch import Tensor, nn
from torch.nn import TransformerEncoder, TransformerEncoderLayer

LEVEL = "transformer_lm"
CALL = None


def generate_square_subsequent_mask(sz: int) -> Tensor:
    """An upper-triangular matrix of -inf, with zeros on and below the diagonal."""
    return torch.triu(torch.ones(sz, sz) * float("-inf"), diagonal=1)


class PositionalEncoding(nn.Module):
    def __init__(self, d_model: int, dropout: float = 0.1, max_len: int = 5000):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(position * div_term)
        pe[:, 0, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x: Tensor) -> Tensor:
        """x: Tensor, shape [seq_len, batch_size, embedding_dim]"""
        x = x + self.pe[: x.size(0)]
        return self.dropout(x)


class TransformerModel(nn.Module):
    def __init__(self, ntoken: int, d_model: int, nhead: int, d_hid: int, nlayers: int, dropout: float = 0.5):
        super().__init__()
        self.model_type = "Transformer"
        self.pos_encoder = PositionalEncoding(d_model, dropout)
        encoder_layers = TransformerEncoderLayer(d_model, nhead, d_hid, dropout)
        self.transformer_encoder = TransformerEncoder(encoder_layers, nlayers, enable_nested_tensor=False)
        self.embedding = nn.Embedding(ntoken, d_model)
        self.d_model = d_model
        self.linear = nn.Linear(d_model, ntoken)
        self.init_weights()

    def init_weights(self) -> None:
        initrange = 0.1
        self.embedding.weight.data.uniform_(-initrange, initrange)
        self.linear.bias.data.zero_()
        self.linear.weight.data.uniform_(-initrange, initrange)

    def forward(self, src: Tensor, src_mask: Tensor = None) -> Tensor:
        """src: [seq_len, batch_size]; src_mask: [seq_len, seq_len]; returns [seq_len, batch_size, ntoken]"""
        src = self.embedding(src) * math.sqrt(self.d_model)
        src = self.pos_encoder(src)
        if src_mask is None:
            src_mask = self.causal_mask(len(src)).to(src.device)
        output = self.transformer_encoder(src, src_mask)
        return self.linear(output)

    def causal_mask(self, size: int) -> Tensor:
        return nn.Transformer.generate_square_subsequent_mask(size)


def model(**overrides) -> TransformerModel:
    """The clean model: two post-norm ReLU layers, two heads, d_model 16, d_hid 32, vocabulary 28."""
    torch.manual_seed(0)
    sizes = dict(ntoken=28, d_model=16, nhead=2, d_hid=32, nlayers=2, dropout=0.2) | overrides
    return TransformerModel(**sizes)


# --- mistakes put in on purpose ---------------------------------------------------------------------------------


class NoMask(TransformerModel):
    def forward(self, src: Tensor) -> Tensor:
        src = self.pos_encoder(self.embedding(src) * math.sqrt(self.d_model))
        return self.linear(self.transformer_encoder(src))  # no causal mask at all: every position sees the future


class MaskOneStepLate(TransformerModel):
    def forward(self, src: Tensor) -> Tensor:
        src = self.pos_encoder(self.embedding(src) * math.sqrt(self.d_model))
        mask = torch.triu(torch.ones(len(src), len(src)) * float("-inf"), diagonal=2)  # each position sees the next
        return self.linear(self.transformer_encoder(src, mask))


class IntegerFrequencies(PositionalEncoding):
    def __init__(self, d_model: int, dropout: float = 0.1, max_len: int = 5000):
        super().__init__(d_model, dropout, max_len)
        position = torch.arange(max_len).unsqueeze(1)
        div_term = 1 / 10000 ** (torch.arange(0, d_model, 2) // d_model)  # integer division: every frequency is 1
        self.pe[:, 0, 0::2] = torch.sin(position * div_term)
        self.pe[:, 0, 1::2] = torch.cos(position * div_term)


def _sized(cls) -> TransformerModel:
    torch.manual_seed(0)
    return cls(ntoken=28, d_model=16, nhead=2, d_hid=32, nlayers=2, dropout=0.2)


def not_causal() -> TransformerModel:
    return _sized(NoMask)


def causal_shows_next() -> TransformerModel:
    return _sized(MaskOneStepLate)


def wrong_frequencies() -> TransformerModel:
    lm = model()
    lm.pos_encoder = IntegerFrequencies(16, 0.2)
    return lm


# (factory, the catalogue id the judge must name first, the submodule it must name)
MISTAKES = [
    (not_causal, "attention.not_causal", "transformer_encoder.layers.0.self_attn"),
    (causal_shows_next, "attention.causal_shows_next", "transformer_encoder.layers.0.self_attn"),
    (wrong_frequencies, "positions.wrong_frequencies", "pos_encoder"),
]
