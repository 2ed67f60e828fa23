"""Transformers written the way tutorials write them, each with a switch that puts in one known mistake.

These are the users' models the checker (parity_tests.check) is tested on. None of them uses this project's
names or layout: each has its own parameter names, its own calling convention and its own masks.

- `Attention`, `LayerNorm`, `Embedding`, `Positions`, `attention_function`: components in the style of the
  bentrevett / Annotated Transformer notebooks, with `mistake=` naming a catalogue id
  (docs/howto/check_your_model.md) to put in.
- `EncoderLayer`, `DecoderLayer`, `Seq2Seq`: an encoder-decoder with separate q/k/v linears, learned positions,
  masks built inside from the pad id, softmax probabilities out (style C).
- `HeadwiseLM`: a decoder-only model with one small module per head (Karpathy's "Let's build GPT"), bias-free
  q/k/v, pre-norm, sequence-first (T, B) ids, the causal mask a buffer inside each head (style A).
- `FusedTransformer`: an encoder-decoder with one fused q/k/v projection per attention, post-norm, a sinusoid
  buffer, additive float masks passed in (style B).
- `TutorialLlama`: a Llama written the way a learner studying Llama writes it (style E): `RMSNorm`, `Rotary`
  cos/sin buffers built in float32 inside each attention, grouped-query `LlamaAttention` (wq, wk, wv, wo, causal
  inside), Meta's `SwiGLU` (w1 the gate, w3 the up, w2 the down), pre-norm, no biases; `interleaved=True` rotates
  Meta's pairs (2i, 2i + 1) instead of rotate_half's halves.
- `MinGPTBlock`: minGPT's block, its MLP called through a lambda over the original submodules (style F).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def attention_function(q, k, v, mask=None, mistake=None):
    """softmax(Q K^T / sqrt(d_k)) V on (B, H, T, Dh); mask (B, 1, 1, T_k), 1 = attend."""
    d_k = q.shape[-1]
    divisor = {"attention.wrong_scale": d_k, None: math.sqrt(d_k)}.get(mistake, math.sqrt(d_k))
    scores = q @ k.transpose(-2, -1) / divisor
    if mask is not None and mistake not in ("attention.mask_ignored", "attention.mask_after_softmax"):
        scores = scores.masked_fill(mask == (1 if mistake == "attention.mask_inverted" else 0), -1e9)
    if mistake == "attention.no_max_subtraction":
        e = torch.exp(scores)
        p = e / e.sum(-1, keepdim=True)
    else:
        p = torch.softmax(scores, dim=-2 if mistake == "attention.softmax_wrong_axis" else -1)
    if mask is not None and mistake == "attention.mask_after_softmax":
        p = p.masked_fill(mask == 0, 0.0)
    return p @ v


class Attention(nn.Module):
    """Multi-head attention with separate fc_q, fc_k, fc_v, fc_o (bentrevett's); forward(query, key, value, mask)
    with mask (B, 1, 1, T_k) or (B, 1, T_q, T_k), 1 = attend."""

    def __init__(self, hid_dim, n_heads, dropout=0.0, mistake=None):
        super().__init__()
        self.hid_dim, self.n_heads, self.head_dim, self.mistake = hid_dim, n_heads, hid_dim // n_heads, mistake
        self.fc_q, self.fc_k = nn.Linear(hid_dim, hid_dim), nn.Linear(hid_dim, hid_dim)
        self.fc_v, self.fc_o = nn.Linear(hid_dim, hid_dim), nn.Linear(hid_dim, hid_dim)
        self.dropout = nn.Dropout(dropout)
        divisors = {"attention.wrong_scale": hid_dim**1 / 2}  # the precedence trap: (hid_dim ** 1) / 2
        self.scale = divisors.get(mistake, math.sqrt(self.head_dim))

    def split(self, x):
        B = x.shape[0]
        if self.mistake == "attention.heads_without_transpose":
            return x.view(B, self.n_heads, -1, self.head_dim)
        return x.view(B, -1, self.n_heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, query, key, value, mask=None):
        B = query.shape[0]
        Q, K, V = self.split(self.fc_q(query)), self.split(self.fc_k(key)), self.split(self.fc_v(value))
        energy = Q @ K.permute(0, 1, 3, 2) / self.scale  # (B, H, T_q, T_k)
        m = self.mistake
        if mask is not None and m not in ("attention.mask_ignored", "attention.mask_after_softmax"):
            if m == "attention.padding_on_queries":
                mask = mask.transpose(-1, -2)
            energy = energy.masked_fill(mask == (1 if m == "attention.mask_inverted" else 0), -1e10)
        if m == "attention.no_max_subtraction":
            attention = energy.exp() / energy.exp().sum(-1, keepdim=True)
        else:
            attention = torch.softmax(energy, dim=-2 if m == "attention.softmax_wrong_axis" else -1)
        if mask is not None and m == "attention.mask_after_softmax":
            attention = attention.masked_fill(mask == 0, 0.0)
        if m == "dropout.active_in_eval":
            attention = F.dropout(attention, 0.1)  # training=True by default: on in eval too
        else:
            attention = self.dropout(attention)
        x = attention @ V  # (B, H, T_q, Dh)
        if m == "attention.heads_without_transpose":
            x = x.reshape(B, -1, self.hid_dim)
        else:
            x = x.permute(0, 2, 1, 3).contiguous().view(B, -1, self.hid_dim)
        return self.fc_o(x)


class LayerNorm(nn.Module):
    """The Annotated Transformer's LayerNorm (a_2, b_2), written right unless `mistake` says otherwise."""

    def __init__(self, features, eps=1e-6, mistake=None):
        super().__init__()
        self.a_2, self.b_2 = nn.Parameter(torch.ones(features)), nn.Parameter(torch.zeros(features))
        self.eps, self.mistake = eps, mistake

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        if self.mistake == "std":  # the Annotated Transformer's own: x.std() (n - 1) plus eps outside the root
            return self.a_2 * (x - mean) / (x.std(-1, keepdim=True) + self.eps) + self.b_2
        var = x.var(-1, keepdim=True, unbiased=self.mistake == "layer_norm.unbiased_variance")
        if self.mistake == "layer_norm.eps_outside_sqrt":
            return self.a_2 * (x - mean) / (var.sqrt() + self.eps) + self.b_2
        return self.a_2 * (x - mean) / torch.sqrt(var + self.eps) + self.b_2


class Embedding(nn.Module):
    """Token embeddings times sqrt(d_model) (the paper's section 3.4)."""

    def __init__(self, vocab, d_model, mistake=None):
        super().__init__()
        self.lut, self.d_model, self.mistake = nn.Embedding(vocab, d_model), d_model, mistake

    def forward(self, x):
        scale = {"embedding.missing_scale": 1.0, "embedding.double_scale": self.d_model}
        return self.lut(x) * scale.get(self.mistake, math.sqrt(self.d_model))


class Positions(nn.Module):
    """The paper's sinusoids in a buffer `pe` (1, max_len, D), built in float32 as tutorials do; forward adds them."""

    def __init__(self, d_model, max_len=64, mistake=None):
        super().__init__()
        position = torch.arange(0, max_len).unsqueeze(1)
        if mistake == "positions.wrong_frequencies":
            div_term = torch.exp(torch.arange(0, d_model, 2) // d_model * -math.log(10000.0))  # integer division: 1
        else:
            div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0))

    def forward(self, x):
        return x + self.pe[:, : x.size(1)]


# -- Style C: bentrevett's encoder-decoder (separate q/k/v, learned positions, masks inside, softmax out) ----------


class FeedForward(nn.Module):
    def __init__(self, hid_dim, pf_dim):
        super().__init__()
        self.fc_1, self.fc_2 = nn.Linear(hid_dim, pf_dim), nn.Linear(pf_dim, hid_dim)

    def forward(self, x):
        return self.fc_2(torch.relu(self.fc_1(x)))


class EncoderLayer(nn.Module):
    def __init__(self, hid_dim, n_heads, pf_dim, mistake=None):
        super().__init__()
        self.self_attn_layer_norm = nn.LayerNorm(hid_dim)
        self.ff_layer_norm = nn.LayerNorm(hid_dim)
        self.self_attention = Attention(hid_dim, n_heads, mistake=mistake)
        self.positionwise_feedforward = FeedForward(hid_dim, pf_dim)

    def forward(self, src, src_mask):
        src = self.self_attn_layer_norm(src + self.self_attention(src, src, src, src_mask))
        return self.ff_layer_norm(src + self.positionwise_feedforward(src))


class DecoderLayer(nn.Module):
    def __init__(self, hid_dim, n_heads, pf_dim, mistake=None):
        super().__init__()
        self.self_attn_layer_norm = nn.LayerNorm(hid_dim)
        self.enc_attn_layer_norm = nn.LayerNorm(hid_dim)
        self.ff_layer_norm = nn.LayerNorm(hid_dim)
        self.self_attention = Attention(hid_dim, n_heads, mistake=mistake)
        self.encoder_attention = Attention(hid_dim, n_heads)
        self.positionwise_feedforward = FeedForward(hid_dim, pf_dim)

    def forward(self, trg, enc_src, trg_mask, src_mask):
        trg = self.self_attn_layer_norm(trg + self.self_attention(trg, trg, trg, trg_mask))
        trg = self.enc_attn_layer_norm(trg + self.encoder_attention(trg, enc_src, enc_src, src_mask))
        return self.ff_layer_norm(trg + self.positionwise_feedforward(trg))


class Stack(nn.Module):
    def __init__(self, vocab, hid_dim, n_layers, n_heads, pf_dim, layer, max_length=32, mistake=None):
        super().__init__()
        self.tok_embedding = nn.Embedding(vocab, hid_dim)
        self.pos_embedding = nn.Embedding(max_length, hid_dim)
        self.layers = nn.ModuleList([layer(hid_dim, n_heads, pf_dim) for _ in range(n_layers)])
        scale = {"embedding.missing_scale": 1.0, "embedding.double_scale": float(hid_dim)}
        self.scale = scale.get(mistake, math.sqrt(hid_dim))

    def embed(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0).repeat(ids.shape[0], 1)
        return self.tok_embedding(ids) * self.scale + self.pos_embedding(pos)


class Seq2Seq(nn.Module):
    """forward(src, trg) -> softmax probabilities (B, T_trg, V); masks built inside from pad_idx (style C)."""

    def __init__(
        self, src_vocab=13, trg_vocab=11, hid_dim=8, n_layers=1, n_heads=2, pf_dim=16, pad_idx=0, mistake=None
    ):
        super().__init__()
        embed_mistake = mistake if mistake and mistake.startswith("embedding") else None
        self.encoder = Stack(src_vocab, hid_dim, n_layers, n_heads, pf_dim, EncoderLayer, mistake=embed_mistake)
        self.decoder = Stack(trg_vocab, hid_dim, n_layers, n_heads, pf_dim, DecoderLayer)
        self.fc_out = nn.Linear(hid_dim, trg_vocab)
        self.pad_idx, self.mistake = pad_idx, mistake

    def make_src_mask(self, src):
        return (src != self.pad_idx).unsqueeze(1).unsqueeze(2)  # (B, 1, 1, T_src)

    def make_trg_mask(self, trg):
        T = trg.shape[1]
        pad = (trg != self.pad_idx).unsqueeze(1).unsqueeze(2)  # (B, 1, 1, T)
        diagonal = {"attention.causal_hides_diagonal": -1, "attention.causal_shows_next": 1}.get(self.mistake, 0)
        sub = torch.tril(torch.ones((T, T), device=trg.device), diagonal=diagonal).bool()
        if self.mistake == "attention.not_causal":
            return pad
        return pad & sub

    def forward(self, src, trg):
        src_mask, trg_mask = self.make_src_mask(src), self.make_trg_mask(trg)
        if self.mistake == "attention.mask_inverted":
            src_mask = ~src_mask
        x = self.encoder.embed(src)
        for layer in self.encoder.layers:
            x = layer(x, src_mask)
        if self.mistake == "attention.masks_swapped":  # the decoder's two masks exchanged
            src_mask, trg_mask = trg_mask, src_mask
        y = self.decoder.embed(trg)
        for layer in self.decoder.layers:
            y = layer(y, x, trg_mask, src_mask)
        return torch.softmax(self.fc_out(y), dim=-1)


# -- Style A: one module per head, bias-free q/k/v, pre-norm, sequence-first ids, causal buffer inside -------------


class Head(nn.Module):
    def __init__(self, n_embd, head_size, block_size, mistake=None):
        super().__init__()
        self.key = nn.Linear(n_embd, head_size, bias=False)
        self.query = nn.Linear(n_embd, head_size, bias=False)
        self.value = nn.Linear(n_embd, head_size, bias=False)
        diagonal = {"attention.causal_hides_diagonal": -1, "attention.causal_shows_next": 1}.get(mistake, 0)
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size), diagonal=diagonal))
        self.mistake = mistake

    def forward(self, x):  # (T, B, C): sequence-first
        x = x.transpose(0, 1)
        T = x.shape[1]
        k, q = self.key(x), self.query(x)
        scale = k.shape[-1] ** -0.5 if self.mistake != "attention.wrong_scale" else x.shape[-1] ** -0.5
        wei = q @ k.transpose(-2, -1) * scale  # (B, T, T)
        wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))
        wei = F.softmax(wei, dim=-1)
        return (wei @ self.value(x)).transpose(0, 1)


class HeadwiseAttention(nn.Module):
    def __init__(self, n_embd, num_heads, block_size, mistake=None):
        super().__init__()
        self.heads = nn.ModuleList([Head(n_embd, n_embd // num_heads, block_size, mistake) for _ in range(num_heads)])
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        return self.proj(torch.cat([h(x) for h in self.heads], dim=-1))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size, mistake=None):
        super().__init__()
        self.sa = HeadwiseAttention(n_embd, n_head, block_size, mistake)
        self.ffwd = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.ReLU(), nn.Linear(4 * n_embd, n_embd))
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)

    def forward(self, x):
        x = x + self.sa(self.ln1(x))
        return x + self.ffwd(self.ln2(x))


class HeadwiseLM(nn.Module):
    """forward(idx (T, B)) -> logits (T, B, V): decoder-only, learned positions, pre-norm with a final norm (A)."""

    def __init__(self, vocab_size=13, n_embd=8, n_head=2, n_layer=2, block_size=16, mistake=None):
        super().__init__()
        self.token_embedding_table = nn.Embedding(vocab_size, n_embd)
        self.position_embedding_table = nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*[Block(n_embd, n_head, block_size, mistake) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size)

    def forward(self, idx):
        T = idx.shape[0]
        x = self.token_embedding_table(idx) + self.position_embedding_table(torch.arange(T, device=idx.device))[:, None]
        return self.lm_head(self.ln_f(self.blocks(x)))


# -- Style B: one fused q/k/v projection per attention, post-norm, sinusoid buffer, additive masks passed in --------


class FusedAttention(nn.Module):
    """in_proj (3D, D) read as q, k, v rows (nn.MultiheadAttention's layout); mask additive (0 / -inf)."""

    def __init__(self, d_model, h, mistake=None):
        super().__init__()
        self.h, self.d_k, self.mistake = h, d_model // h, mistake
        self.in_proj = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, query, key, value, mask):
        B, D = query.shape[0], query.shape[-1]
        w_q, w_k, w_v = self.in_proj.weight.chunk(3)
        b_q, b_k, b_v = self.in_proj.bias.chunk(3)
        q = F.linear(query, w_q, b_q).view(B, -1, self.h, self.d_k).transpose(1, 2)
        k = F.linear(key, w_k, b_k).view(B, -1, self.h, self.d_k).transpose(1, 2)
        v = F.linear(value, w_v, b_v).view(B, -1, self.h, self.d_k).transpose(1, 2)
        divisor = D**1 / 2 if self.mistake == "attention.wrong_scale" else math.sqrt(self.d_k)
        scores = q @ k.transpose(-2, -1) / divisor + mask
        x = torch.softmax(scores, dim=-1) @ v
        return self.out(x.transpose(1, 2).reshape(B, -1, D))


class FusedLayer(nn.Module):
    def __init__(self, d_model, h, d_ff, cross, mistake=None):
        super().__init__()
        self.attn = FusedAttention(d_model, h, mistake)
        self.norm1 = LayerNorm(d_model, eps=1e-5, mistake=mistake if mistake and "layer_norm" in mistake else None)
        self.cross = FusedAttention(d_model, h) if cross else None
        self.norm2 = nn.LayerNorm(d_model) if cross else None
        self.w_1, self.w_2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.norm3 = nn.LayerNorm(d_model)

    def forward(self, x, mask, memory=None, memory_mask=None):
        x = self.norm1(x + self.attn(x, x, x, mask))
        if self.cross is not None:
            x = self.norm2(x + self.cross(x, memory, memory, memory_mask))
        return self.norm3(x + self.w_2(F.gelu(self.w_1(x))))


class FusedTransformer(nn.Module):
    """forward(src, tgt, src_mask, tgt_mask) -> logits; masks additive floats (0 / -inf) (style B)."""

    def __init__(self, src_vocab=13, tgt_vocab=11, d_model=8, h=2, d_ff=16, n=1, mistake=None):
        super().__init__()
        self.src_embed, self.tgt_embed = nn.Embedding(src_vocab, d_model), nn.Embedding(tgt_vocab, d_model)
        self.positions = Positions(d_model, 64, mistake if mistake == "positions.wrong_frequencies" else None)
        self.encoder = nn.ModuleList([FusedLayer(d_model, h, d_ff, False, mistake) for _ in range(n)])
        self.decoder = nn.ModuleList([FusedLayer(d_model, h, d_ff, True) for _ in range(n)])
        self.generator = nn.Linear(d_model, tgt_vocab)
        self.d_model = d_model

    def forward(self, src, tgt, src_mask, tgt_mask):
        x = self.positions(self.src_embed(src) * math.sqrt(self.d_model))
        for layer in self.encoder:
            x = layer(x, src_mask)
        y = self.positions(self.tgt_embed(tgt) * math.sqrt(self.d_model))
        for layer in self.decoder:
            y = layer(y, tgt_mask, x, src_mask)
        return self.generator(y)


# -- Other layouts of one attention: raw (in, out) parameters, GPT-2's Conv1D c_attn, one module per head ----------


class RawAttention(nn.Module):
    """Self-attention from raw nn.Parameters stored (in, out) and applied as x @ W; no bias on the output;
    forward(x, mask) with mask (B, T) of 0/1, 1 = attend."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Parameter(torch.randn(d_model, d_model)) for _ in range(4))
        self.b_q, self.b_k, self.b_v = (nn.Parameter(torch.zeros(d_model)) for _ in range(3))

    def forward(self, x, mask):
        B, T, D = x.shape
        H = self.n_heads

        def heads(y):
            return y.view(B, T, H, D // H).transpose(1, 2)

        q, k, v = heads(x @ self.W_q + self.b_q), heads(x @ self.W_k + self.b_k), heads(x @ self.W_v + self.b_v)
        scores = q @ k.transpose(-1, -2) / math.sqrt(D // H)
        scores = scores.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
        return (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(B, T, D) @ self.W_o


class Conv1D(nn.Module):
    """GPT-2's Conv1D: a linear layer whose weight is stored (in, out)."""

    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        return x @ self.weight + self.bias


class GPT2Attention(nn.Module):
    """GPT-2's layout: c_attn (D, 3D) fused q/k/v, c_proj; attention_mask additive (B, 1, 1, T) (0 / -1e4)."""

    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn, self.c_proj = Conv1D(3 * n_embd, n_embd), Conv1D(n_embd, n_embd)

    def forward(self, hidden_states, attention_mask=None):
        B, T, D = hidden_states.shape
        q, k, v = self.c_attn(hidden_states).split(D, dim=2)
        q, k, v = (t.view(B, T, self.n_head, D // self.n_head).transpose(1, 2) for t in (q, k, v))
        w = q @ k.transpose(-1, -2) / math.sqrt(D // self.n_head)
        if attention_mask is not None:
            w = w + attention_mask
        return self.c_proj((torch.softmax(w, -1) @ v).transpose(1, 2).reshape(B, T, D))


class PerHeadAttention(nn.Module):
    """One Linear per head and role (heads[h].q, .k, .v, each D -> Dh), then an output Linear; forward(query, key,
    value, mask) with mask (B, 1, 1, T_k) bool, True = attend."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        d_head = d_model // n_heads
        self.heads = nn.ModuleList(
            nn.ModuleDict({r: nn.Linear(d_model, d_head) for r in ("q", "k", "v")}) for _ in range(n_heads)
        )
        self.out = nn.Linear(d_model, d_model)

    def forward(self, query, key, value, mask=None):
        outs = []
        for head in self.heads:
            q, k, v = head["q"](query), head["k"](key), head["v"](value)
            s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            if mask is not None:
                s = s.masked_fill(~mask[:, 0], float("-inf"))
            outs.append(torch.softmax(s, -1) @ v)
        return self.out(torch.cat(outs, -1))


class ConventionAttention(Attention):
    """Attention whose mask argument comes in another convention: kind "bool_masked" (True = masked), "additive"
    (0 / -inf), "bool_keep", "int_keep" (1 = attend); shape "(B, T)", "(B, 1, T)" or "(B, 1, 1, T)"; it converts
    to its parent's 1 = attend."""

    def __init__(self, hid_dim, n_heads, kind, shape):
        super().__init__(hid_dim, n_heads)
        self.kind, self.shape = kind, shape

    def forward(self, query, key, value, mask=None):
        convert = {
            "bool_masked": lambda m: ~m,
            "additive": lambda m: m == 0,
            "bool_keep": lambda m: m,
            "int_keep": lambda m: m == 1,
        }
        keep = convert[self.kind](mask)
        if self.shape == "(B, T)":
            keep = keep[:, None, None, :]
        elif self.shape == "(B, 1, T)":
            keep = keep[:, None]
        return super().forward(query, key, value, keep)


class TinyEncoder(nn.Module):
    """An encoder-only model from torch.nn's own layers: token and learned position tables, nn.TransformerEncoder,
    the padding mask built inside from the pad id; forward(ids) -> hidden states (B, T, D)."""

    def __init__(self, vocab=13, d_model=8, nhead=2, layers=2, pad_id=0, norm_first=False):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, d_model), nn.Embedding(32, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead, 16, 0.0, batch_first=True, norm_first=norm_first)
        norm = nn.LayerNorm(d_model) if norm_first else None
        self.encoder = nn.TransformerEncoder(layer, layers, norm=norm, enable_nested_tensor=False)
        self.pad_id = pad_id

    def forward(self, ids):
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        return self.encoder(x, src_key_padding_mask=ids == self.pad_id)


class Encoder(Stack):
    """bentrevett's Encoder: forward(src, src_mask) -> (B, T, D); src_mask (B, 1, 1, T), True = attend."""

    def __init__(self, vocab=13, hid_dim=8, n_layers=2, n_heads=2, pf_dim=16, mistake=None):
        super().__init__(vocab, hid_dim, n_layers, n_heads, pf_dim, EncoderLayer, mistake=mistake)

    def forward(self, src, src_mask):
        x = self.embed(src)
        for layer in self.layers:
            x = layer(x, src_mask)
        return x


class Decoder(Stack):
    """bentrevett's Decoder without its output layer: forward(trg, enc_src, trg_mask, src_mask) -> (B, T, D)."""

    def __init__(self, vocab=11, hid_dim=8, n_layers=2, n_heads=2, pf_dim=16):
        super().__init__(vocab, hid_dim, n_layers, n_heads, pf_dim, DecoderLayer)

    def forward(self, trg, enc_src, trg_mask, src_mask):
        y = self.embed(trg)
        for layer in self.layers:
            y = layer(y, enc_src, trg_mask, src_mask)
        return y


# -- Style D: the Annotated Transformer's shape: norms inside residual wrappers, pre-norm with final norms, the
#    q/k/v/out linears as one ModuleList, a log-softmax generator outside forward, masks passed in (a call= adapter)


class Residual(nn.Module):
    """x + sublayer(norm(x)): the norm lives in the wrapper, not in the layer."""

    def __init__(self, size, mistake=None):
        super().__init__()
        self.norm = LayerNorm(size, mistake=mistake)

    def forward(self, x, sublayer):
        return x + sublayer(self.norm(x))


class ListAttention(nn.Module):
    """q, k, v and output projections as `linears[0..3]`; mask (B, 1, T_k) or (B, T_q, T_k), True = attend."""

    def __init__(self, h, d_model):
        super().__init__()
        self.h, self.d_k = h, d_model // h
        self.linears = nn.ModuleList(nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, query, key, value, mask):
        B = query.shape[0]
        q, k, v = (
            lin(x).view(B, -1, self.h, self.d_k).transpose(1, 2)
            for lin, x in zip(self.linears, (query, key, value), strict=False)
        )
        scores = (q @ k.transpose(-2, -1) / math.sqrt(self.d_k)).masked_fill(mask.unsqueeze(1) == 0, -1e9)
        x = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, -1, self.h * self.d_k)
        return self.linears[3](x)


class ListLayer(nn.Module):
    def __init__(self, d_model, h, d_ff, cross, mistake=None):
        super().__init__()
        self.self_attn = ListAttention(h, d_model)
        self.src_attn = ListAttention(h, d_model) if cross else None
        self.feed_forward = FeedForward(d_model, d_ff)
        self.sublayer = nn.ModuleList(Residual(d_model, mistake) for _ in range(3 if cross else 2))

    def forward(self, x, mask, memory=None, memory_mask=None):
        x = self.sublayer[0](x, lambda y: self.self_attn(y, y, y, mask))
        if self.src_attn is not None:
            x = self.sublayer[1](x, lambda y: self.src_attn(y, memory, memory, memory_mask))
        return self.sublayer[-1](x, self.feed_forward)


class AnnotatedStyle(nn.Module):
    """forward(src, tgt, src_mask, tgt_mask) -> the decoder's hidden states; `generator` gives log-probabilities.
    mistake "std" puts in the Annotated Transformer's own LayerNorm (x.std() + eps) (style D)."""

    def __init__(self, src_vocab=13, tgt_vocab=11, d_model=16, h=2, d_ff=32, n=2, mistake=None):
        super().__init__()
        self.encoder = nn.ModuleList(ListLayer(d_model, h, d_ff, False, mistake) for _ in range(n))
        self.encoder_norm = LayerNorm(d_model, mistake=mistake)
        self.decoder = nn.ModuleList(ListLayer(d_model, h, d_ff, True, mistake) for _ in range(n))
        self.decoder_norm = LayerNorm(d_model, mistake=mistake)
        self.src_embed, self.tgt_embed = Embedding(src_vocab, d_model), Embedding(tgt_vocab, d_model)
        self.positions = Positions(d_model)
        self.generator = nn.Linear(d_model, tgt_vocab)

    def forward(self, src, tgt, src_mask, tgt_mask):
        x = self.positions(self.src_embed(src))
        for layer in self.encoder:
            x = layer(x, src_mask)
        x = self.encoder_norm(x)
        y = self.positions(self.tgt_embed(tgt))
        for layer in self.decoder:
            y = layer(y, tgt_mask, x, src_mask)
        return self.decoder_norm(y)


def annotated_call(model, src, tgt, pad=0):
    """The call= adapter for AnnotatedStyle: its masks built as the Annotated Transformer builds them, then the
    generator's log-probabilities."""
    src_mask = (src != pad).unsqueeze(-2)  # (B, 1, T_src)
    T = tgt.shape[1]
    tgt_mask = (tgt != pad).unsqueeze(-2) & torch.tril(torch.ones(T, T, dtype=torch.bool, device=tgt.device))
    return F.log_softmax(model.generator(model(src, tgt, src_mask, tgt_mask)), dim=-1)


# -- Style F: minGPT's block: a fused c_attn, a causal buffer named `bias`, the MLP run through a per-instance lambda --


class MinGPTAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.attn_dropout, self.resid_dropout = nn.Dropout(0.1), nn.Dropout(0.1)
        causal = torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size)
        self.register_buffer("bias", causal)
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = self.attn_dropout(F.softmax(att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf")), dim=-1))
        return self.resid_dropout(self.c_proj((att @ v).transpose(1, 2).contiguous().view(B, T, C)))


class MinGPTBlock(nn.Module):
    """minGPT's Block: `self.mlpf` is a lambda over the original submodules, which a plain deep copy breaks."""

    def __init__(self, n_embd=8, n_head=2, block_size=16):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = MinGPTAttention(n_embd, n_head, block_size)
        self.mlp = nn.ModuleDict(
            dict(c_fc=nn.Linear(n_embd, 4 * n_embd), c_proj=nn.Linear(4 * n_embd, n_embd), act=nn.GELU(),
                 dropout=nn.Dropout(0.1))
        )  # fmt: skip
        m = self.mlp
        self.mlpf = lambda x: m.dropout(m.c_proj(m.act(m.c_fc(x))))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlpf(self.ln_2(x))


# -- Style E: a Llama as a learner writes it: RMSNorm, RoPE inside attention, grouped-query attention, SwiGLU ------


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, no bias (Llama's). mistake: "rms_norm.eps_outside_sqrt" or
    "rms_norm.wrong_axis" (the mean over dim=1, the positions)."""

    def __init__(self, dim, eps=1e-6, mistake=None):
        super().__init__()
        self.eps, self.mistake = eps, mistake
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        if self.mistake == "rms_norm.eps_outside_sqrt":
            return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.eps) * self.weight
        dim = 1 if self.mistake == "rms_norm.wrong_axis" else -1
        return x * torch.rsqrt(x.pow(2).mean(dim, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def rotate_pairs(x):
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([-x2, x1], dim=-1).flatten(-2)


class Rotary(nn.Module):
    """RoPE's cos and sin for positions 0 .. max_len - 1, buffers (max_len, Dh) built in float32 in
    rotate_half's layout (each frequency for both halves); forward rotates (B, H, T, Dh) by halves or, with
    `interleaved`, by adjacent pairs (the frequencies repeated pair by pair)."""

    def __init__(self, head_dim, max_len=64, theta=10000.0):
        super().__init__()
        self.theta = theta
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
        freqs = torch.outer(torch.arange(max_len).float(), inv_freq)  # (max_len, Dh/2)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def forward(self, x, interleaved=False, offset=0):
        T, half = x.shape[-2], x.shape[-1] // 2
        cos, sin = self.cos_cached[offset : offset + T], self.sin_cached[offset : offset + T]
        if interleaved:
            cos, sin = cos[:, :half].repeat_interleave(2, -1), sin[:, :half].repeat_interleave(2, -1)
            return x * cos + rotate_pairs(x) * sin
        return x * cos + rotate_half(x) * sin


class LlamaAttention(nn.Module):
    """Causal self-attention with n_kv_heads K/V heads (each read by n_heads / n_kv_heads query heads) and RoPE on
    q and k; forward(x) (B, T, D). mistake: "rope.applied_to_v", "rope.mixed_pairing" (keys rotated in the
    other pairing), "rope.position_offset" (keys one position ahead), "attention.kv_heads_tiled"."""

    def __init__(self, dim, n_heads, n_kv_heads, max_len=64, theta=10000.0, interleaved=False, mistake=None):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.interleaved, self.mistake = interleaved, mistake
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)
        self.rotary = Rotary(self.head_dim, max_len, theta)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        m = self.mistake
        q = self.rotary(q, self.interleaved)
        k = self.rotary(k, self.interleaved != (m == "rope.mixed_pairing"), 1 if m == "rope.position_offset" else 0)
        if m == "rope.applied_to_v":
            v = self.rotary(v, self.interleaved)
        n_rep = self.n_heads // self.n_kv_heads
        if m == "attention.kv_heads_tiled":
            k, v = k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1)
        else:
            k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        future = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1)
        scores = scores.masked_fill(future, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v  # (B, H, T, Dh)
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))


class FusedLlamaAttention(nn.Module):
    """Grouped-query attention with q, k and v in one projection `wqkv` (D -> D + 2 kv rows, as Phi-3 keeps them),
    RoPE by halves, torch's scaled_dot_product_attention with is_causal; forward(x) (B, T, D)."""

    def __init__(self, dim, n_heads, n_kv_heads, max_len=64, theta=10000.0):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.wqkv = nn.Linear(dim, dim + 2 * n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.rotary = Rotary(self.head_dim, max_len, theta)

    def forward(self, x):
        B, T, D = x.shape
        kv = self.n_kv_heads * self.head_dim
        q, k, v = self.wqkv(x).split([D, kv, kv], dim=-1)
        q = self.rotary(q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2))
        k = self.rotary(k.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2))
        v = v.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        n_rep = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(B, T, D))


class SwiGLU(nn.Module):
    """Meta's FeedForward: w2(silu(w1(x)) * w3(x)), w1 the gate, w3 the up, w2 the down projection, no biases.
    mistake "gated_feed_forward.activation_on_up": silu on w3 instead of w1."""

    def __init__(self, dim, hidden, mistake=None):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.mistake = mistake

    def forward(self, x):
        if self.mistake == "gated_feed_forward.activation_on_up":
            return self.w2(self.w1(x) * F.silu(self.w3(x)))
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class AnonymousGLU(nn.Module):
    """A gated feed-forward whose names do not say which linear is the gate: fc_a is the up projection, fc_b the
    gate, fc_c the down; silu(fc_b(x)) * fc_a(x)."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.fc_a, self.fc_b = nn.Linear(dim, hidden), nn.Linear(dim, hidden)
        self.fc_c = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc_c(F.silu(self.fc_b(x)) * self.fc_a(x))


class LlamaBlock(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, hidden, theta, interleaved=False, mistake=None):
        super().__init__()
        norm_mistake = mistake if mistake and mistake.startswith("rms_norm") else None
        self.attention_norm = RMSNorm(dim, mistake=norm_mistake)
        self.attention = LlamaAttention(dim, n_heads, n_kv_heads, theta=theta, interleaved=interleaved, mistake=mistake)
        self.ffn_norm = RMSNorm(dim, mistake=norm_mistake)
        self.feed_forward = SwiGLU(dim, hidden, mistake=mistake)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class TutorialLlama(nn.Module):
    """forward(tokens (B, T)) -> logits (B, T, V): token embeddings (no positions: RoPE acts in attention), pre-norm
    RMSNorm blocks, a final RMSNorm, a bias-free output projection (or tied to the embeddings) (style E)."""

    def __init__(
        self, vocab=13, dim=16, n_layers=2, n_heads=4, n_kv_heads=2, hidden=24, theta=10000.0, interleaved=False,
        tie=False, mistake=None,
    ):  # fmt: skip
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(
            LlamaBlock(dim, n_heads, n_kv_heads, hidden, theta, interleaved, mistake) for _ in range(n_layers)
        )
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        if tie:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens):
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))
