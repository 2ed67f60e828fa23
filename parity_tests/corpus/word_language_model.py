"""pytorch/examples' word_language_model style: `TransformerModel` a subclass of `nn.Transformer` that keeps only
its encoder (post-norm layers and the encoder's final LayerNorm that nn.Transformer builds), replaces
`self.decoder` with the output Linear, runs sequence-first with `input_emb` scaled by sqrt(ninp), a sinusoid
`PositionalEncoding` buffer, a causal mask from `_generate_square_subsequent_mask` kept on `self.src_mask`, and
returns log-probabilities."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

LEVEL = "transformer_lm"
CALL = None


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout=0.1, max_len=5000):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        pe = pe.unsqueeze(0).transpose(0, 1)
        self.register_buffer("pe", pe)

    def forward(self, x):
        x = x + self.pe[: x.size(0), :]
        return self.dropout(x)


class TransformerModel(nn.Transformer):
    """Container module with an encoder, a recurrent or transformer module, and a decoder."""

    def __init__(self, ntoken, ninp, nhead, nhid, nlayers, dropout=0.5):
        super().__init__(d_model=ninp, nhead=nhead, dim_feedforward=nhid, num_encoder_layers=nlayers, dropout=dropout)
        self.model_type = "Transformer"
        self.src_mask = None
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        self.input_emb = nn.Embedding(ntoken, ninp)
        self.ninp = ninp
        self.decoder = nn.Linear(ninp, ntoken)
        self.init_weights()

    def _generate_square_subsequent_mask(self, sz):
        return torch.log(torch.tril(torch.ones(sz, sz)))

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.input_emb.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, src, has_mask=True):
        if has_mask:
            device = src.device
            if self.src_mask is None or self.src_mask.size(0) != len(src):
                mask = self._generate_square_subsequent_mask(len(src)).to(device)
                self.src_mask = mask
        else:
            self.src_mask = None
        src = self.input_emb(src) * math.sqrt(self.ninp)
        src = self.pos_encoder(src)
        output = self.encoder(src, mask=self.src_mask)
        output = self.decoder(output)
        return F.log_softmax(output, dim=-1)


def model() -> TransformerModel:
    torch.manual_seed(0)
    return TransformerModel(ntoken=28, ninp=16, nhead=2, nhid=32, nlayers=2, dropout=0.2)


# --- mistakes put in on purpose ---------------------------------------------------------------------------------


class ShowsNext(TransformerModel):
    def _generate_square_subsequent_mask(self, sz):
        return torch.log(torch.tril(torch.ones(sz, sz), diagonal=1))  # each position sees the next one too


def causal_shows_next() -> TransformerModel:
    torch.manual_seed(0)
    return ShowsNext(ntoken=28, ninp=16, nhead=2, nhid=32, nlayers=2, dropout=0.2)


class ScaledTwice(TransformerModel):
    def forward(self, src, has_mask=True):
        self.src_mask = self._generate_square_subsequent_mask(len(src)).to(src.device)
        src = self.pos_encoder(self.input_emb(src) * math.sqrt(self.ninp) * math.sqrt(self.ninp))  # sqrt(ninp) twice
        return F.log_softmax(self.decoder(self.encoder(src, mask=self.src_mask)), dim=-1)


def double_scale() -> TransformerModel:
    # (no scale at all is a language model's convention, GPT's: the judge takes it, so it is no mistake to inject)
    torch.manual_seed(0)
    return ScaledTwice(ntoken=28, ninp=16, nhead=2, nhid=32, nlayers=2, dropout=0.2)


MISTAKES = [
    (causal_shows_next, "attention.causal_shows_next", "encoder.layers.0.self_attn"),
    (double_scale, "embedding.double_scale", "input_emb"),
]
