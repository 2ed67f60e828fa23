"""Encoders, encoder-decoders and towers as people write them by hand (issue 46, round 4), in this project's own
words: styles none of the other corpus files uses, met by the judge here for the first time.

- a BERT written out: word, position and token-type tables summed and normed, post-norm layers whose attention
  takes a 0/1 padding mask, and a masked-LM head (its own transform, GELU and LayerNorm, a decoder tied to the word
  table with a bias of its own); the same encoder returning its hidden states;
- a T5-like encoder-decoder: a norm that divides by the root mean square without taking the mean off, scores not
  divided by sqrt(d), a learned bias per relative-distance bucket in the first layer of each stack;
- a BART-style model (mBART's pre-norm layers): learned positions read from row 2 on, embeddings scaled by
  sqrt(d_model), a norm on the embeddings, final norms on both stacks, one token table for both stacks and the head;
- a seq2seq tutorial model around `nn.Transformer`: sinusoid positions, `src_key_padding_mask` and the target's
  causal and padding masks all built from the pad id inside `forward`, a `generator` Linear;
- a CLIP-text-like tower: token and learned position tables, causal pre-norm blocks of QuickGELU MLPs, a final
  LayerNorm, the end token's state (the largest id) through a projection parameter;
- a Whisper-encoder-like stack: two Conv1d over mel frames (the second of stride 2), a sinusoid table, pre-norm
  blocks and a final norm;
- the BERT's and the BART's layers alone, whose padding mask is a required argument named `keep`;
- mistakes put into them, each named where it sits: the second layer's LayerNorm variance unbiased, the second
  decoder layer's self-attention not causal (in the whole model and in the layer alone), the source padding mask
  inverted, QuickGELU's constant mistyped in the tower's second block.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/fresh.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

D, H, V, T_MAX, TYPES, PAD = 32, 4, 26, 32, 2, 0
HD = D // H


def sinusoids(length: int, width: int) -> torch.Tensor:
    """Sines in the even columns, cosines in the odd ones (the paper's table)."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    rate = torch.exp(-math.log(10000.0) * torch.arange(0, width, 2, dtype=torch.float32) / width)
    table = torch.zeros(length, width)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate)
    return table


# -- a BERT written out, with its masked-LM head ---------------------------------------------------------------


class BertLayerNorm(nn.Module):
    def __init__(self, unbiased: bool = False, eps: float = 1e-12):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(D))
        self.beta = nn.Parameter(torch.zeros(D))
        self.unbiased, self.eps = unbiased, eps

    def forward(self, x):
        centred = x - x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, unbiased=self.unbiased)
        return self.gamma * centred / torch.sqrt(var + self.eps) + self.beta


class BertSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.query = nn.Linear(D, D)
        self.key = nn.Linear(D, D)
        self.value = nn.Linear(D, D)
        self.dense = nn.Linear(D, D)

    def heads(self, x):
        return x.view(x.shape[0], x.shape[1], H, HD).permute(0, 2, 1, 3)  # (B, H, T, HD)

    def forward(self, x, keep):
        q, k, v = self.heads(self.query(x)), self.heads(self.key(x)), self.heads(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(HD)
        scores = scores + (1.0 - keep[:, None, None, :].to(x.dtype)) * -10000.0
        context = scores.softmax(-1) @ v
        return self.dense(context.permute(0, 2, 1, 3).reshape(x.shape))


class BertLayer(nn.Module):
    def __init__(self, unbiased: bool = False):
        super().__init__()
        self.attention = BertSelfAttention()
        self.attention_norm = BertLayerNorm()
        self.intermediate = nn.Linear(D, 4 * D)
        self.output = nn.Linear(4 * D, D)
        self.output_norm = BertLayerNorm(unbiased)

    def forward(self, x, keep):
        x = self.attention_norm(x + self.attention(x, keep))
        return self.output_norm(x + self.output(F.gelu(self.intermediate(x))))


class HandBert(nn.Module):
    def __init__(self, mlm_head: bool = True, unbiased_second: bool = False, unbiased_head: bool = False):
        super().__init__()
        self.word = nn.Embedding(V, D, padding_idx=PAD)
        self.position = nn.Embedding(T_MAX, D)
        self.token_type = nn.Embedding(TYPES, D)
        self.embedding_norm = BertLayerNorm()
        self.layers = nn.ModuleList([BertLayer(), BertLayer(unbiased_second)])
        if mlm_head:
            self.transform = nn.Linear(D, D)
            self.transform_norm = BertLayerNorm(unbiased_head)
            self.decoder_bias = nn.Parameter(torch.zeros(V))
        self.mlm_head = mlm_head

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if attention_mask is None:
            attention_mask = (input_ids != PAD).long()
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word(input_ids) + self.position(positions)[None] + self.token_type(token_type_ids)
        x = self.embedding_norm(x)
        for layer in self.layers:
            x = layer(x, attention_mask)
        if not self.mlm_head:
            return x
        x = self.transform_norm(F.gelu(self.transform(x)))
        return x @ self.word.weight.T + self.decoder_bias


def hand_bert(**kw) -> HandBert:
    torch.manual_seed(0)
    return HandBert(**kw)


# -- a T5-like encoder-decoder: RMS without the mean, no 1/sqrt(d), a relative bias -------------------------------


class T5Norm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(D))

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class T5Attention(nn.Module):
    BUCKETS = 8

    def __init__(self, relative: bool, causal: bool = False):
        super().__init__()
        self.q = nn.Linear(D, D, bias=False)
        self.k = nn.Linear(D, D, bias=False)
        self.v = nn.Linear(D, D, bias=False)
        self.o = nn.Linear(D, D, bias=False)
        self.bias = nn.Embedding(self.BUCKETS, H) if relative else None
        self.causal = causal

    def bucket(self, distance):
        """Distances -3..3 each their own bucket, the rest the last (a crude T5 bucketing)."""
        return torch.where(distance.abs() <= 3, distance + 3, torch.full_like(distance, self.BUCKETS - 1))

    def forward(self, x, memory=None, keep=None):
        source = x if memory is None else memory
        B, T, S = x.shape[0], x.shape[1], source.shape[1]
        q = self.q(x).view(B, T, H, HD).transpose(1, 2)
        k = self.k(source).view(B, S, H, HD).transpose(1, 2)
        v = self.v(source).view(B, S, H, HD).transpose(1, 2)
        scores = q @ k.transpose(-1, -2)  # T5: no 1/sqrt(d)
        if self.bias is not None:
            distance = torch.arange(S, device=x.device)[None, :] - torch.arange(T, device=x.device)[:, None]
            scores = scores + self.bias(self.bucket(distance)).permute(2, 0, 1)
        if self.causal:
            scores = scores.masked_fill(torch.ones(T, S, dtype=torch.bool).triu(1), float("-inf"))
        if keep is not None:
            scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
        return self.o((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D))


class T5Block(nn.Module):
    def __init__(self, relative: bool, decoder: bool):
        super().__init__()
        self.norm1 = T5Norm()
        self.attn = T5Attention(relative, causal=decoder)
        if decoder:
            self.norm_cross = T5Norm()
            self.cross = T5Attention(False)
        self.norm2 = T5Norm()
        self.wi = nn.Linear(D, 2 * D, bias=False)
        self.wo = nn.Linear(2 * D, D, bias=False)
        self.decoder = decoder

    def forward(self, x, memory=None, keep=None):
        x = x + self.attn(self.norm1(x), keep=None if self.decoder else keep)
        if self.decoder:
            x = x + self.cross(self.norm_cross(x), memory, keep)
        return x + self.wo(F.relu(self.wi(self.norm2(x))))


class HandT5(nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = nn.Embedding(V, D)
        self.encoder = nn.ModuleList([T5Block(True, False), T5Block(False, False)])
        self.encoder_norm = T5Norm()
        self.decoder = nn.ModuleList([T5Block(True, True), T5Block(False, True)])
        self.decoder_norm = T5Norm()
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, src, tgt):
        keep = src != PAD
        memory = self.shared(src)
        for block in self.encoder:
            memory = block(memory, keep=keep)
        memory = self.encoder_norm(memory)
        y = self.shared(tgt)
        for block in self.decoder:
            y = block(y, memory, keep)
        return self.lm_head(self.decoder_norm(y))


def hand_t5() -> HandT5:
    torch.manual_seed(0)
    return HandT5()


# -- T5 by hand, its relative position bias as the paper has it (issue: T5 read) ----------------------------------
# T5's bias: a per-head table nn.Embedding(n_buckets, H), owned by each stack's first layer and handed to the
# others, read at the bucket of key - query: in the encoder bidirectional (half the buckets for keys after the
# query), in the decoder causal (all of them for i - j >= 0); exact below half a half, log-spaced beyond up to
# max_distance, where the last bucket saturates. Added to q k^T, which is not scaled. The reference computes
# exactly this (positional "relative": relative_buckets = the table's rows, relative_max_distance, attention_scale
# 1.0), so the right model passes. At n = 8 and the probe's lengths (distances up to 5):
# - "linear" (min(|d|, n_half - 1), no log range): in the encoder (n_half 4, exact 2) that is T5's buckets at
#   max_distance 3 or 4 (d = 3 already saturates: 2 + floor(log(3/2) / log(m/2) * 2) >= 3), in the decoder (exact
#   4) T5's at 7 to 9 (d = 5 must read 5: 4 + floor(4 log(5/4) / log(m/4)) = 5); the reference has one
#   max_distance for both stacks: no pair. The decoder-only LM with linear buckets is T5's at one max_distance
#   (7 to 9 fit every distance the probe shows; at 8 every distance at all: 4 + floor(4 log2(d/4)) is d for
#   d = 4..7 and saturates at 8): the same math, a pass;
# - "bidirectional decoder": the causal decoder reads the encoder's bidirectional buckets (d = i - j = 3 reads
#   bucket 2, T5's causal buckets 3): no max_distance makes the causal buckets so;
# - "scaled bias": (q k^T + bias) / sqrt(Dh): the table's values reach the scores divided by sqrt(Dh), a factor on
#   the bias the reference has none of (its scale multiplies q k^T alone);
# - "unsigned": the encoder's buckets of |key - query| (the causal formula's, all 8 buckets), keys before and after
#   the query sharing them: d = +1 reads bucket 1, T5's bidirectional buckets 4 + 1; no max_distance of either form
#   gives them;
# - "first layer only": the first layer's bias not handed on, the later layers' scores get none: the reference
#   adds its stack's bias in every self-attention;
# - "scaled scores": q k^T / sqrt(Dh) + bias in every attention (cross ones too): the reference's scaled scores plus
#   T5's bias (attention_scale left at 1 / sqrt(Dh)): the same math, a pass.
T5_BUCKETS, T5_MAX_DISTANCE = 8, 16


def t5_bucket(distance, bidirectional: bool, n: int = T5_BUCKETS, max_distance: int = T5_MAX_DISTANCE, linear=False):
    """T5's _relative_position_bucket of key - query, as transformers writes it (linear: no log range)."""
    bucket = torch.zeros_like(distance)
    if bidirectional:
        n //= 2
        bucket = bucket + (distance > 0).long() * n
        distance = distance.abs()
    else:
        distance = -torch.clamp(distance, max=0)
    exact = n // 2
    if linear:
        return bucket + distance.clamp(max=n - 1)
    large = exact + (torch.log(distance.float() / exact) / math.log(max_distance / exact) * (n - exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, n - 1))
    return bucket + torch.where(distance < exact, distance, large)


class T5RelAttention(nn.Module):
    """T5's attention: no 1/sqrt(d), the stack's bias computed by the first layer and handed on (position_bias)."""

    def __init__(self, has_bias: bool, causal: bool, kind: str = "t5", cross: bool = False):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D, bias=False) for _ in range(4))
        self.relative_attention_bias = nn.Embedding(T5_BUCKETS, H) if has_bias else None
        self.causal, self.kind, self.cross = causal, kind, cross

    def position_bias(self, T, S, device):
        distance = torch.arange(S, device=device)[None, :] - torch.arange(T, device=device)[:, None]  # key - query
        both = not self.causal or self.kind == "bidirectional_decoder"
        buckets = t5_bucket(distance, both, linear=self.kind == "linear")
        if self.kind == "unsigned" and not self.causal:  # |key - query| alone: keys before and after share buckets
            buckets = t5_bucket(-distance.abs(), False)
        return self.relative_attention_bias(buckets).permute(2, 0, 1)[None]  # (1, H, T, S)

    def forward(self, x, memory=None, keep=None, bias=None):
        source = x if memory is None else memory
        B, T, S = x.shape[0], x.shape[1], source.shape[1]
        q = self.q(x).view(B, T, H, HD).transpose(1, 2)
        k = self.k(source).view(B, S, H, HD).transpose(1, 2)
        v = self.v(source).view(B, S, H, HD).transpose(1, 2)
        if not self.cross and bias is None and self.relative_attention_bias is not None:
            bias = self.position_bias(T, S, x.device)
        scores = q @ k.transpose(-1, -2)
        if self.kind == "scaled_scores":
            scores = scores / math.sqrt(HD)
        if bias is not None:
            scores = scores + bias
        if self.kind == "scaled_bias":
            scores = scores / math.sqrt(HD)
        if self.causal:
            scores = scores.masked_fill(torch.ones(T, S, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        if keep is not None:
            scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
        out = self.o((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D))
        return out, bias


class T5RelBlock(nn.Module):
    def __init__(self, first: bool, decoder: bool, kind: str = "t5", cross: bool = True):
        super().__init__()
        self.norm1 = T5Norm()
        self.attn = T5RelAttention(
            first, causal=decoder, kind=kind if decoder or kind != "bidirectional_decoder" else "t5"
        )
        self.cross = T5RelAttention(False, False, kind, cross=True) if decoder and cross else None
        self.norm_cross = T5Norm() if self.cross is not None else None
        self.norm2 = T5Norm()
        self.wi = nn.Linear(D, 2 * D, bias=False)
        self.wo = nn.Linear(2 * D, D, bias=False)
        self.kind = kind

    def forward(self, x, memory=None, keep=None, bias=None):
        h, bias = self.attn(self.norm1(x), keep=keep if self.cross is None and memory is None else None, bias=bias)
        x = x + h
        if self.cross is not None:
            x = x + self.cross(self.norm_cross(x), memory, keep)[0]
        return x + self.wo(F.relu(self.wi(self.norm2(x)))), None if self.kind == "first_layer_only" else bias


class T5ByHand(nn.Module):
    """T5 v1.0 by hand: shared token table, pre-RMS-norm layers, each stack's final norm, one bias table a stack."""

    def __init__(self, kind: str = "t5"):
        super().__init__()
        self.shared = nn.Embedding(V, D)
        self.encoder = nn.ModuleList([T5RelBlock(i == 0, False, kind) for i in range(2)])
        self.encoder_norm = T5Norm()
        self.decoder = nn.ModuleList([T5RelBlock(i == 0, True, kind) for i in range(2)])
        self.decoder_norm = T5Norm()
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, src, tgt):
        keep, bias = src != PAD, None
        memory = self.shared(src)
        for block in self.encoder:
            memory, bias = block(memory, keep=keep, bias=bias)
        memory, bias = self.encoder_norm(memory), None
        y = self.shared(tgt)
        for block in self.decoder:
            y, bias = block(y, memory, keep, bias=bias)
        return self.lm_head(self.decoder_norm(y))


class T5LM(nn.Module):
    """A decoder-only LM with T5's causal relative bias (no position table), RMS norms, a final norm."""

    def __init__(self, kind: str = "t5"):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.layers = nn.ModuleList([T5RelBlock(i == 0, True, kind, cross=False) for i in range(2)])
        self.norm = T5Norm()
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, ids):
        x, bias = self.embed(ids), None
        for block in self.layers:
            x, bias = block(x, bias=bias)
        return self.lm_head(self.norm(x))


def t5_by_hand(kind: str = "t5") -> T5ByHand:
    torch.manual_seed(0)
    return T5ByHand(kind)


def t5_lm(kind: str = "t5") -> T5LM:
    torch.manual_seed(0)
    return T5LM(kind)


# -- a BART-style model by hand (mBART's pre-norm): offset positions, scaled embeddings, final norms ------------


class BartAttention(nn.Module):
    def __init__(self, causal: bool = False):
        super().__init__()
        self.k_proj = nn.Linear(D, D)
        self.v_proj = nn.Linear(D, D)
        self.q_proj = nn.Linear(D, D)
        self.out_proj = nn.Linear(D, D)
        self.causal = causal

    def forward(self, x, memory=None, keep=None):
        source = x if memory is None else memory
        B, T, S = x.shape[0], x.shape[1], source.shape[1]
        q = self.q_proj(x).view(B, T, H, HD).transpose(1, 2) * HD**-0.5
        k = self.k_proj(source).view(B, S, H, HD).transpose(1, 2)
        v = self.v_proj(source).view(B, S, H, HD).transpose(1, 2)
        scores = q @ k.transpose(-1, -2)
        hidden = torch.zeros(B, 1, T, S, dtype=torch.bool, device=x.device)
        if self.causal:
            hidden = hidden | torch.ones(T, S, dtype=torch.bool, device=x.device).triu(1)
        if keep is not None:
            hidden = hidden | ~keep[:, None, None, :]
        scores = scores.masked_fill(hidden, torch.finfo(scores.dtype).min)
        return self.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D))


class BartEncoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn_layer_norm = nn.LayerNorm(D)
        self.self_attn = BartAttention()
        self.final_layer_norm = nn.LayerNorm(D)
        self.fc1 = nn.Linear(D, 2 * D)
        self.fc2 = nn.Linear(2 * D, D)

    def forward(self, x, keep):
        x = x + self.self_attn(self.self_attn_layer_norm(x), keep=keep)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class BartDecoderLayer(nn.Module):
    def __init__(self, causal: bool = True):
        super().__init__()
        self.self_attn_layer_norm = nn.LayerNorm(D)
        self.self_attn = BartAttention(causal)
        self.encoder_attn_layer_norm = nn.LayerNorm(D)
        self.encoder_attn = BartAttention()
        self.final_layer_norm = nn.LayerNorm(D)
        self.fc1 = nn.Linear(D, 2 * D)
        self.fc2 = nn.Linear(2 * D, D)

    def forward(self, x, memory, keep):
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        x = x + self.encoder_attn(self.encoder_attn_layer_norm(x), memory, keep)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class LearnedPositions(nn.Embedding):
    OFFSET = 2

    def __init__(self):
        super().__init__(T_MAX + self.OFFSET, D)

    def forward(self, ids):  # type: ignore[override]
        positions = torch.arange(ids.shape[1], device=ids.device) + self.OFFSET
        return super().forward(positions)


class HandBart(nn.Module):
    def __init__(self, second_causal: bool = True):
        super().__init__()
        self.shared = nn.Embedding(V, D, padding_idx=PAD)
        self.embed_scale = math.sqrt(D)
        self.encoder_positions = LearnedPositions()
        self.decoder_positions = LearnedPositions()
        self.encoder_embedding_norm = nn.LayerNorm(D)
        self.decoder_embedding_norm = nn.LayerNorm(D)
        self.encoder_layers = nn.ModuleList([BartEncoderLayer(), BartEncoderLayer()])
        self.decoder_layers = nn.ModuleList([BartDecoderLayer(), BartDecoderLayer(second_causal)])
        self.encoder_norm = nn.LayerNorm(D)
        self.decoder_norm = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, V, bias=False)
        self.lm_head.weight = self.shared.weight

    def forward(self, input_ids, decoder_input_ids):
        keep = input_ids != PAD
        x = self.shared(input_ids) * self.embed_scale + self.encoder_positions(input_ids)
        x = self.encoder_embedding_norm(x)
        for layer in self.encoder_layers:
            x = layer(x, keep)
        memory = self.encoder_norm(x)
        y = self.shared(decoder_input_ids) * self.embed_scale + self.decoder_positions(decoder_input_ids)
        y = self.decoder_embedding_norm(y)
        for layer in self.decoder_layers:
            y = layer(y, memory, keep)
        return self.lm_head(self.decoder_norm(y))


def hand_bart(**kw) -> HandBart:
    torch.manual_seed(0)
    return HandBart(**kw)


# -- a seq2seq tutorial model around nn.Transformer, its masks built from the pad id in forward -----------------


class Seq2SeqTransformer(nn.Module):
    def __init__(self, inverted_padding: bool = False):
        super().__init__()
        self.src_tok = nn.Embedding(V, D)
        self.tgt_tok = nn.Embedding(V, D)
        self.register_buffer("pos", sinusoids(T_MAX, D)[:, None, :])  # (T, 1, D), sequence-first
        self.transformer = nn.Transformer(
            D, H, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=2 * D, dropout=0.1
        )
        self.generator = nn.Linear(D, V)
        self.inverted_padding = inverted_padding

    def embed(self, table, ids):  # ids (T, B) -> (T, B, D)
        return table(ids) * math.sqrt(D) + self.pos[: ids.shape[0]]

    def forward(self, src, tgt):  # src (S, B), tgt (T, B): sequence-first, as the tutorial batches them
        src_padding = (src != PAD).T if self.inverted_padding else (src == PAD).T  # (B, S), True where hidden
        tgt_padding = (tgt == PAD).T
        tgt_mask = self.transformer.generate_square_subsequent_mask(tgt.shape[0], dtype=torch.bool)
        out = self.transformer(
            self.embed(self.src_tok, src),
            self.embed(self.tgt_tok, tgt),
            tgt_mask=tgt_mask,
            src_key_padding_mask=src_padding,
            tgt_key_padding_mask=tgt_padding,
            memory_key_padding_mask=src_padding,
        )
        return self.generator(out)


def seq2seq_transformer(**kw) -> Seq2SeqTransformer:
    torch.manual_seed(0)
    return Seq2SeqTransformer(**kw)


# -- a CLIP-text-like tower: causal pre-norm blocks, QuickGELU, end-token pooling, a projection ----------------


class QuickGELU(nn.Module):
    def __init__(self, constant: float = 1.702):
        super().__init__()
        self.constant = constant

    def forward(self, x):
        return x * torch.sigmoid(self.constant * x)


class TextBlock(nn.Module):
    def __init__(self, constant: float = 1.702):
        super().__init__()
        self.ln_1 = nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, H, batch_first=True)
        self.ln_2 = nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), QuickGELU(constant), nn.Linear(4 * D, D))

    def forward(self, x, mask):
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class TextTower(nn.Module):
    def __init__(self, constant_second: float = 1.702):
        super().__init__()
        self.token_embedding = nn.Embedding(V, D)
        self.positional_embedding = nn.Parameter(0.01 * torch.randn(T_MAX, D))
        self.blocks = nn.ModuleList([TextBlock(), TextBlock(constant_second)])
        self.ln_final = nn.LayerNorm(D)
        self.text_projection = nn.Parameter(D**-0.5 * torch.randn(D, 16))

    def forward(self, text):
        T = text.shape[1]
        x = self.token_embedding(text) + self.positional_embedding[:T]
        mask = torch.full((T, T), float("-inf"), device=text.device).triu(1)
        for block in self.blocks:
            x = block(x, mask)
        x = self.ln_final(x)
        return x[torch.arange(x.shape[0]), text.argmax(dim=-1)] @ self.text_projection


def text_tower(**kw) -> TextTower:
    torch.manual_seed(0)
    return TextTower(**kw)


# -- a Whisper-encoder-like stack: a Conv1d front end over mel frames, sinusoid positions -------------------------


class AudioBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_ln = nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, H, batch_first=True)
        self.mlp_ln = nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        h = self.attn_ln(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.mlp_ln(x))


class AudioEncoder(nn.Module):
    MELS = 8

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv1d(self.MELS, D, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(D, D, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positional_embedding", sinusoids(T_MAX, D))
        self.blocks = nn.ModuleList([AudioBlock(), AudioBlock()])
        self.ln_post = nn.LayerNorm(D)

    def forward(self, mel):  # mel (B, MELS, frames) -> (B, frames / 2, D)
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).permute(0, 2, 1)
        x = x + self.positional_embedding[: x.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.ln_post(x)


def audio_encoder() -> AudioEncoder:
    torch.manual_seed(0)
    return AudioEncoder()


CASES = [
    ("hand_bert", lambda: hand_bert(mlm_head=False), "encoder_model", {}, "pass"),
    ("hand_bert.mlm_head", hand_bert, "encoder_model", {}, "pass"),
    (
        "hand_bert.unbiased_variance_second_layer",
        lambda: hand_bert(mlm_head=False, unbiased_second=True),
        "encoder_model",
        {},
        ("mistake", "layer_norm.unbiased_variance", "layers.1.output_norm"),
    ),
    (
        "hand_bert.mlm_head.unbiased_variance_head",
        lambda: hand_bert(unbiased_head=True),
        "encoder_model",
        {},
        ("mistake", "layer_norm.unbiased_variance", "transform_norm"),
    ),
    ("hand_bert.layer", lambda: hand_bert(mlm_head=False).layers[0], "encoder_layer", {}, "pass"),
    ("hand_t5", hand_t5, "transformer", {}, ("no pair", "encoder.0.attn", "relative")),
    ("t5_by_hand", t5_by_hand, "transformer", {}, "pass"),
    ("t5_by_hand.scaled_scores", lambda: t5_by_hand("scaled_scores"), "transformer", {}, "pass"),
    ("t5_by_hand.linear", lambda: t5_by_hand("linear"), "transformer", {}, ("no pair", "encoder.0.attn", "relative")),
    (
        "t5_by_hand.bidirectional_decoder",
        lambda: t5_by_hand("bidirectional_decoder"),
        "transformer",
        {},
        ("no pair", "decoder.0.attn", "bidirectional"),
    ),
    (
        "t5_by_hand.scaled_bias",
        lambda: t5_by_hand("scaled_bias"),
        "transformer",
        {},
        ("no pair", "encoder.0.attn", "relative"),
    ),
    (
        "t5_by_hand.first_layer_only",
        lambda: t5_by_hand("first_layer_only"),
        "transformer",
        {},
        ("no pair", "encoder.0.attn", "relative position bias in 2 of its 4 self-attentions"),
    ),
    (
        "t5_by_hand.unsigned",
        lambda: t5_by_hand("unsigned"),
        "transformer",
        {},
        ("no pair", "encoder.0.attn", "buckets none of T5's log-spaced ones"),
    ),
    ("t5_lm", t5_lm, "transformer_lm", {}, "pass"),
    ("t5_lm.linear", lambda: t5_lm("linear"), "transformer_lm", {}, "pass"),  # T5's buckets at max_distance 8
    (
        "t5_lm.bidirectional",
        lambda: t5_lm("bidirectional_decoder"),
        "transformer_lm",
        {},
        ("no pair", "layers.0.attn", "bidirectional"),
    ),
    ("hand_bart", hand_bart, "transformer", {}, "pass"),
    (
        "hand_bart.not_causal_second_decoder_layer",
        lambda: hand_bart(second_causal=False),
        "transformer",
        {},
        ("mistake", "attention.not_causal", "decoder_layers.1.self_attn"),
    ),
    ("hand_bart.decoder_layer", lambda: hand_bart().decoder_layers[0], "decoder_layer", {}, "pass"),
    (
        "hand_bart.decoder_layer.not_causal",
        lambda: hand_bart(second_causal=False).decoder_layers[1],
        "decoder_layer",
        {},
        ("mistake", "attention.not_causal", "self_attn"),
    ),
    ("seq2seq_transformer", seq2seq_transformer, "transformer", {}, "pass"),
    (
        "seq2seq_transformer.padding_inverted",
        lambda: seq2seq_transformer(inverted_padding=True),
        "transformer",
        {},
        ("mistake", "attention.mask_inverted", "transformer.encoder.layers.0.self_attn"),
    ),
    ("text_tower", text_tower, "transformer_lm", {}, "pass"),
    (
        "text_tower.quick_gelu_constant_second_block",
        lambda: text_tower(constant_second=1.72),
        "transformer_lm",
        {},
        ("mistake", "activation.quick_gelu_constant", "blocks.1.mlp.1"),
    ),
    # passes (first expected: no pair at conv1): the reference has Whisper's two convolutions with their GELUs
    # (numpy_transformer/audio.py) and this table, the paper's sinusoids (layers.sinusoidal_table), added as audio.py
    # adds Whisper's; check/towers.py reads a fixed table of positions that is either
    ("audio_encoder", audio_encoder, "encoder_stack", {}, "pass"),
]
