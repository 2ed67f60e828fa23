"""bentrevett/pytorch-seq2seq style ("Attention is All You Need" notebook): Encoder, Decoder and Seq2Seq classes
taking `device`, learned position tables, token embeddings scaled by `self.scale = torch.sqrt(torch.FloatTensor(
[hid_dim]))`, post-norm layers (`self_attn_layer_norm(src + dropout(_src))`), a `MultiHeadAttentionLayer` with
fc_q/fc_k/fc_v/fc_o and `energy.masked_fill(mask == 0, -1e10)`, masks built by `Seq2Seq.make_src_mask` /
`make_trg_mask` from the pad index, and `forward(src, trg) -> (output, attention)`.

Sizes keep both float32 scales exact (sqrt(16) = 4, sqrt(head_dim 4) = 2): the tutorial's float32 constants are
then no rounding at all. The injected `hid_dim ** 1/2` is the catalogue's example of a scale that parses wrong."""

import torch
import torch.nn as nn

LEVEL = "transformer"
CALL = None


class Encoder(nn.Module):
    def __init__(self, input_dim, hid_dim, n_layers, n_heads, pf_dim, dropout, device, max_length=100, **parts):
        super().__init__()
        self.device = device
        self.tok_embedding = nn.Embedding(input_dim, hid_dim)
        self.pos_embedding = nn.Embedding(max_length, hid_dim)
        self.layers = nn.ModuleList(
            [EncoderLayer(hid_dim, n_heads, pf_dim, dropout, device, **parts) for _ in range(n_layers)]
        )
        self.dropout = nn.Dropout(dropout)
        self.scale = torch.sqrt(torch.FloatTensor([hid_dim])).to(device)

    def forward(self, src, src_mask):
        # src = [batch size, src len]; src_mask = [batch size, 1, 1, src len]
        batch_size = src.shape[0]
        src_len = src.shape[1]
        pos = torch.arange(0, src_len).unsqueeze(0).repeat(batch_size, 1).to(self.device)  # [batch size, src len]
        src = self.dropout((self.tok_embedding(src) * self.scale) + self.pos_embedding(pos))
        for layer in self.layers:
            src = layer(src, src_mask)
        return src  # [batch size, src len, hid dim]


class EncoderLayer(nn.Module):
    def __init__(self, hid_dim, n_heads, pf_dim, dropout, device, attention=None):
        super().__init__()
        attention = attention or MultiHeadAttentionLayer
        self.self_attn_layer_norm = nn.LayerNorm(hid_dim)
        self.ff_layer_norm = nn.LayerNorm(hid_dim)
        self.self_attention = attention(hid_dim, n_heads, dropout, device)
        self.positionwise_feedforward = PositionwiseFeedforwardLayer(hid_dim, pf_dim, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, src, src_mask):
        _src, _ = self.self_attention(src, src, src, src_mask)
        src = self.self_attn_layer_norm(src + self.dropout(_src))  # dropout, residual connection and layer norm
        _src = self.positionwise_feedforward(src)
        return self.ff_layer_norm(src + self.dropout(_src))


class MultiHeadAttentionLayer(nn.Module):
    def __init__(self, hid_dim, n_heads, dropout, device):
        super().__init__()
        assert hid_dim % n_heads == 0
        self.hid_dim = hid_dim
        self.n_heads = n_heads
        self.head_dim = hid_dim // n_heads
        self.fc_q = nn.Linear(hid_dim, hid_dim)
        self.fc_k = nn.Linear(hid_dim, hid_dim)
        self.fc_v = nn.Linear(hid_dim, hid_dim)
        self.fc_o = nn.Linear(hid_dim, hid_dim)
        self.dropout = nn.Dropout(dropout)
        self.scale = torch.sqrt(torch.FloatTensor([self.head_dim])).to(device)

    def softmax(self, energy):
        return torch.softmax(energy, dim=-1)

    def forward(self, query, key, value, mask=None):
        batch_size = query.shape[0]
        Q = self.fc_q(query)  # [batch size, query len, hid dim]
        K = self.fc_k(key)
        V = self.fc_v(value)
        Q = Q.view(batch_size, -1, self.n_heads, self.head_dim).permute(0, 2, 1, 3)  # [batch, n heads, len, head dim]
        K = K.view(batch_size, -1, self.n_heads, self.head_dim).permute(0, 2, 1, 3)
        V = V.view(batch_size, -1, self.n_heads, self.head_dim).permute(0, 2, 1, 3)
        energy = torch.matmul(Q, K.permute(0, 1, 3, 2)) / self.scale  # [batch size, n heads, query len, key len]
        if mask is not None:
            energy = energy.masked_fill(mask == 0, -1e10)
        attention = self.softmax(energy)
        x = torch.matmul(self.dropout(attention), V)  # [batch size, n heads, query len, head dim]
        x = x.permute(0, 2, 1, 3).contiguous()
        x = x.view(batch_size, -1, self.hid_dim)  # [batch size, query len, hid dim]
        return self.fc_o(x), attention


class PositionwiseFeedforwardLayer(nn.Module):
    def __init__(self, hid_dim, pf_dim, dropout):
        super().__init__()
        self.fc_1 = nn.Linear(hid_dim, pf_dim)
        self.fc_2 = nn.Linear(pf_dim, hid_dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        x = self.dropout(torch.relu(self.fc_1(x)))  # [batch size, seq len, pf dim]
        return self.fc_2(x)  # [batch size, seq len, hid dim]


class Decoder(nn.Module):
    def __init__(self, output_dim, hid_dim, n_layers, n_heads, pf_dim, dropout, device, max_length=100, **parts):
        super().__init__()
        self.device = device
        self.tok_embedding = nn.Embedding(output_dim, hid_dim)
        self.pos_embedding = nn.Embedding(max_length, hid_dim)
        self.layers = nn.ModuleList(
            [DecoderLayer(hid_dim, n_heads, pf_dim, dropout, device, **parts) for _ in range(n_layers)]
        )
        self.fc_out = nn.Linear(hid_dim, output_dim)
        self.dropout = nn.Dropout(dropout)
        self.scale = torch.sqrt(torch.FloatTensor([hid_dim])).to(device)

    def forward(self, trg, enc_src, trg_mask, src_mask):
        # trg = [batch size, trg len]; enc_src = [batch size, src len, hid dim]
        # trg_mask = [batch size, 1, trg len, trg len]; src_mask = [batch size, 1, 1, src len]
        batch_size = trg.shape[0]
        trg_len = trg.shape[1]
        pos = torch.arange(0, trg_len).unsqueeze(0).repeat(batch_size, 1).to(self.device)
        trg = self.dropout((self.tok_embedding(trg) * self.scale) + self.pos_embedding(pos))
        for layer in self.layers:
            trg, attention = layer(trg, enc_src, trg_mask, src_mask)
        return self.fc_out(trg), attention  # [batch size, trg len, output dim]


class DecoderLayer(nn.Module):
    def __init__(self, hid_dim, n_heads, pf_dim, dropout, device, attention=None):
        super().__init__()
        attention = attention or MultiHeadAttentionLayer
        self.self_attn_layer_norm = nn.LayerNorm(hid_dim)
        self.enc_attn_layer_norm = nn.LayerNorm(hid_dim)
        self.ff_layer_norm = nn.LayerNorm(hid_dim)
        self.self_attention = attention(hid_dim, n_heads, dropout, device)
        self.encoder_attention = attention(hid_dim, n_heads, dropout, device)
        self.positionwise_feedforward = PositionwiseFeedforwardLayer(hid_dim, pf_dim, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, trg, enc_src, trg_mask, src_mask):
        _trg, _ = self.self_attention(trg, trg, trg, trg_mask)
        trg = self.self_attn_layer_norm(trg + self.dropout(_trg))
        _trg, attention = self.encoder_attention(trg, enc_src, enc_src, src_mask)
        trg = self.enc_attn_layer_norm(trg + self.dropout(_trg))
        _trg = self.positionwise_feedforward(trg)
        return self.ff_layer_norm(trg + self.dropout(_trg)), attention


class Seq2Seq(nn.Module):
    def __init__(self, encoder, decoder, src_pad_idx, trg_pad_idx, device):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.src_pad_idx = src_pad_idx
        self.trg_pad_idx = trg_pad_idx
        self.device = device

    def make_src_mask(self, src):
        return (src != self.src_pad_idx).unsqueeze(1).unsqueeze(2)  # [batch size, 1, 1, src len]

    def make_trg_mask(self, trg):
        trg_pad_mask = (trg != self.trg_pad_idx).unsqueeze(1).unsqueeze(2)  # [batch size, 1, 1, trg len]
        trg_len = trg.shape[1]
        trg_sub_mask = torch.tril(torch.ones((trg_len, trg_len), device=self.device)).bool()  # [trg len, trg len]
        return trg_pad_mask & trg_sub_mask  # [batch size, 1, trg len, trg len]

    def forward(self, src, trg):
        src_mask = self.make_src_mask(src)
        trg_mask = self.make_trg_mask(trg)
        enc_src = self.encoder(src, src_mask)  # [batch size, src len, hid dim]
        output, attention = self.decoder(trg, enc_src, trg_mask, src_mask)
        return output, attention  # [batch size, trg len, output dim], [batch size, n heads, trg len, src len]


INPUT_DIM, OUTPUT_DIM, HID_DIM, N_LAYERS, N_HEADS, PF_DIM, DROPOUT = 24, 26, 16, 2, 4, 32, 0.1
SRC_PAD_IDX = TRG_PAD_IDX = 0


def initialize_weights(m):
    if hasattr(m, "weight") and m.weight.dim() > 1:
        nn.init.xavier_uniform_(m.weight.data)


def model(seq2seq=Seq2Seq, **parts) -> Seq2Seq:
    """The clean model: two layers each side, four heads of size 4, hid_dim 16, pf_dim 32, vocabularies 24 and 26."""
    torch.manual_seed(0)
    device = torch.device("cpu")
    enc = Encoder(INPUT_DIM, HID_DIM, N_LAYERS, N_HEADS, PF_DIM, DROPOUT, device, **parts)
    dec = Decoder(OUTPUT_DIM, HID_DIM, N_LAYERS, N_HEADS, PF_DIM, DROPOUT, device, **parts)
    net = seq2seq(enc, dec, SRC_PAD_IDX, TRG_PAD_IDX, device)
    net.apply(initialize_weights)
    return net


# --- mistakes put in on purpose ---------------------------------------------------------------------------------


class HidDimScale(MultiHeadAttentionLayer):
    def __init__(self, hid_dim, n_heads, dropout, device):
        super().__init__(hid_dim, n_heads, dropout, device)
        self.scale = hid_dim**1 / 2  # meant sqrt: parses as (hid_dim ** 1) / 2


class NoSubsequentMask(Seq2Seq):
    def make_trg_mask(self, trg):
        return (trg != self.trg_pad_idx).unsqueeze(1).unsqueeze(2)  # padding only: the decoder sees the future


class HidesOwnPosition(Seq2Seq):
    def make_trg_mask(self, trg):
        trg_pad_mask = (trg != self.trg_pad_idx).unsqueeze(1).unsqueeze(2)
        trg_len = trg.shape[1]
        trg_sub_mask = torch.tril(torch.ones((trg_len, trg_len), device=self.device), diagonal=-1).bool()  # j < i
        return trg_pad_mask & trg_sub_mask


class ExpWithoutMax(MultiHeadAttentionLayer):
    def softmax(self, energy):
        e = torch.exp(energy)  # no max subtracted: overflows once scores pass ~88 (float32) or ~709 (float64)
        return e / e.sum(dim=-1, keepdim=True)


def wrong_scale() -> Seq2Seq:
    return model(attention=HidDimScale)


def not_causal() -> Seq2Seq:
    return model(seq2seq=NoSubsequentMask)


def causal_hides_diagonal() -> Seq2Seq:
    return model(seq2seq=HidesOwnPosition)


def no_max_subtraction() -> Seq2Seq:
    return model(attention=ExpWithoutMax)


# (factory, the catalogue id the judge must name first, the submodule it must name)
MISTAKES = [
    (wrong_scale, "attention.wrong_scale", "encoder.layers.0.self_attention"),
    (not_causal, "attention.not_causal", "decoder.layers.0.self_attention"),
    (no_max_subtraction, "attention.no_max_subtraction", "encoder.layers.0.self_attention"),
    (causal_hides_diagonal, "attention.causal_hides_diagonal", "decoder.layers.0.self_attention"),
]
