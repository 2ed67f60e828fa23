"""Whole models that are not decoder-only language models, written by hand (issue 46, round 52, "mistakes missed
inside whole models", round five), in this project's own words. Rounds fresh16, fresh32, fresh42 and fresh46 were
mostly decoder-only LMs; fresh6, fresh19, fresh20 and fresh35 wrote encoders and towers in other idioms (fresh6's
pre-norm mBART and its T5 of a table per block, fresh19's einops ViT and transformers-named CLIP towers, fresh20's
Whisper in transformers' names). The judge meets these here first (measured with the judge frozen).

- a post-norm BERT encoder: one fused `qkv` Linear split by `unbind`, heads contracted by `torch.einsum`, the
  padding mask built from `attention_mask` as the extended additive mask `(1 - mask) * finfo.min`, word, position
  and token-type tables summed and normed (LayerNorm eps 1e-12), GELU in an `act` module;
- a T5-style encoder-decoder: a bias-free RMS norm (no mean taken off), unscaled scores, the relative position
  bias computed once per stack by the stack itself from its first block's table (`block.0.relative_bias`) and
  handed to every block, T5's log buckets (bidirectional in the encoder, causal in the decoder, 8 buckets, max
  distance 16), one token table for both stacks, the head tied to it and fed `y * d_model ** -0.5` as T5 v1.0 does;
- a BART-style encoder-decoder as the original BART is: post-norm layers, learned positions read from row 2 on,
  a `layernorm_embedding` on each stack's embeddings, no final norms, GELU, the source padding mask from the ids in
  the encoder's self-attention and in every cross-attention;
- a ViT: a Conv2d patch embedding, a class token put in front, a table of N + 1 positions added after it, pre-norm
  blocks of `nn.MultiheadAttention`-free attention (fused qkv, SDPA), a final norm, the class token's row through a
  head;
- a CLIP text tower in OpenAI's layout but written with SDPA and a boolean causal buffer (True = may attend),
  QuickGELU, `ln_final`, the end token (the largest id) pooled and projected by a Linear without bias;
- a Whisper-style encoder-decoder as OpenAI's repository lays it out: two Conv1d (the second stride 2) each
  followed by GELU, a sinusoid table (sines in the first half of the channels) as a buffer, pre-norm `blocks` with
  `attn_ln` / `mlp_ln`, `ln_post`; a decoder of learned positions, causal self-attention `attn`, `cross_attn` over
  the audio states, `ln`, logits through the token table; the same model with its decoder's learned positions held
  by an nn.Embedding read at 0..T-1 (the same rows, the same math), which carries the two Whisper mistakes below so
  that they measure the mistake and not the reading of the front end.

Mistakes, each put in ONE place and expected as the catalogue's id there (decided from the math before the
judge ran).

- the BERT's second layer's extended mask written `mask * finfo.min` (the real tokens hidden, the padding kept),
  attention.mask_inverted at `layers.1.attn`; its second layer's activation GELU's tanh form while the first keeps
  erf: the reference holds one activation per model, so no pair, said at `layers.1.act` in words naming tanh; its
  second layer's last norm written by hand with its mean and variance over the positions (dim 1):
  layer_norm.wrong_axis at `layers.1.ln_ffn`;
- the T5's second decoder block's self-attention not causal (the decoder's `causal` flag dropped there),
  attention.not_causal at `decoder.block.1.self_attn`; the second decoder block's cross-attention norm dividing by
  root(mean(x^2)) + eps (eps 1e-6 outside the root): rms_norm.eps_outside_sqrt at `decoder.block.1.norm_cross`;
  the second encoder block's softmax over the queries (`softmax(dim=-2)`): attention.softmax_wrong_axis at
  `encoder.block.1.self_attn`;
- the BART's second decoder layer's cross-attention given no source padding mask: attention.mask_ignored at
  `decoder.layers.1.encoder_attn`; its second encoder layer's scores divided by head_dim, not its root,
  attention.wrong_scale at `encoder.layers.1.self_attn`;
- the ViT's second block's attention probabilities passed through `F.dropout(p, 0.1)` (training defaults to True),
  dropout.active_in_eval at `blocks.1.attn`; its second block's scores divided by head_dim: attention.wrong_scale at
  `blocks.1.attn`;
- the CLIP text tower's second layer's causal buffer one diagonal too wide (`tril(1)`: each token sees the next),
  attention.causal_shows_next at `transformer.resblocks.1.attn`;
- the Whisper's second encoder block's scores K Q^T (keys and queries swapped): attention.q_k_swapped at
  `encoder.blocks.1.attn`; the decoder's second cross-attention reading the decoder's own states for keys and
  values (`cross_attn(h, h)`, not the audio): the reference's cross-attention always reads the encoder's output,
  and no catalogue id describes a cross-attention fed the wrong source, so no pair, said at
  `decoder.blocks.1.cross_attn`.

Each correct model was checked by hand: the fused-qkv einsum BERT attention equals a plain per-head loop (padding
hidden by -inf) to 1e-16 in float64, the SDPA with the boolean keep buffer equals masked_fill(-inf) + softmax to
2e-16, T5's buckets equal T5's formula worked out by hand (bidirectional: 0, 1, 2, 2, 2, 2 back,
5, 6, 6, 6, 6, 7 forward; causal: 0, 1, 2, 3, 4, 4, 5, 5, 6, 6, 6). The OpenAI-layout Whisper is the position-table
Whisper with its rows held by a Parameter, and the latter passes.

First met: 16 of 20 right. Wrong:

- f52_t5_style.not_causal_second_decoder_block: no pair, "differs at decoder.block.1.self_attn: the scores get T5's
  relative position bias ... read at causal buckets in an attention that reads keys after the query", not
  attention.not_causal (the reference's causal decoder with its mask dropped reads the keys after the query at the
  causal formula's bucket 0, exactly as this model does: the catalogue's variant is this math);
- f52_whisper_style (OpenAI's layout, a pass): "could not judge: encoder.conv1 reads mel frames and the forward
  takes ids, but the rest is not Whisper's encoder-decoder as check/speech.py reads it (1 tables, 1 of them reading
  the ids: not tokens and positions)": the decoder's positions, an nn.Parameter sliced `[:T]` as OpenAI's Whisper
  holds them, are not found (check/speech.py's _read counts nn.Embedding modules only);
- f52_whisper_style.keys_queries_swapped_second_encoder_block: neither an id nor a named op, the judge saying
  "unexplained" at the whole encoder ("its output differs from the reference's; no catalogue variant reproduces
  it"): the speech path seems not to judge the diverging encoder block at its layer level, where
  attention.q_k_swapped is tried;
- f52_whisper_style.cross_reads_own_states_second_decoder_block: "differs at decoder.(the module): a projection of
  every position's state (32 -> 26 features) makes the module's output, where the reference's output is the
  states", the place and the op wrong (the logits head, which is right, not the second cross-attention, and the
  malformed place "decoder.(the module)").

Fixed since: all 20 right. T5's causal buckets read where keys after the query are seen (bucket 0 there) are read
as the reference's causal bias with its mask dropped, so attention.not_causal is tried and named; the Whisper reading
(check/speech.py) finds the decoder's positions in the recorded forward (the table read at rows 0 .. T-1, a sliced
Parameter or an nn.Embedding); a tower's later block that differs is judged under the map its first block passes by
(a model stores its layers alike), which names the exchanged queries and keys; a decoder failure is placed at the
first decoder block whose output differs, as no pair where its cross-attention's keys or values read another tensor
than the encoder's output, else by the judge's decoder_layer level there.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

D, H, V, T_MAX, TYPES, PAD = 32, 4, 26, 32, 2, 0
HD = D // H


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases moved off their 1s and 0s, so that a trained model's values are checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _split(x: torch.Tensor) -> torch.Tensor:
    """(B, T, D) -> (B, H, T, HD)."""
    return x.unflatten(-1, (H, HD)).transpose(1, 2)


def _merge(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, HD) -> (B, T, D)."""
    return x.transpose(1, 2).flatten(2)


# -- a post-norm BERT: fused qkv, einsum heads, the extended additive mask ----------------------------------------


class BertAttention(nn.Module):
    def __init__(self, inverted: bool = False):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.inverted = inverted

    def forward(self, x, attention_mask):
        q, k, v = self.qkv(x).unflatten(-1, (3, H, HD)).unbind(2)  # each (B, T, H, HD)
        scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(HD)
        keep = attention_mask[:, None, None, :].to(scores.dtype)
        hidden = keep if self.inverted else 1.0 - keep
        scores = scores + hidden * torch.finfo(scores.dtype).min
        context = torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v)
        return self.proj(context.flatten(2))


class TimeAxisLayerNorm(nn.LayerNorm):
    """A LayerNorm written by hand whose mean and variance are taken over the positions (dim 1), not the features."""

    def forward(self, x):  # type: ignore[override]
        centred = x - x.mean(1, keepdim=True)
        return self.weight * centred / torch.sqrt(centred.square().mean(1, keepdim=True) + self.eps) + self.bias


class BertLayer(nn.Module):
    def __init__(self, inverted: bool = False, approximate: str = "none", time_axis: bool = False):
        super().__init__()
        self.attn = BertAttention(inverted)
        self.ln_attn = nn.LayerNorm(D, eps=1e-12)
        self.fc_in = nn.Linear(D, 4 * D)
        self.act = nn.GELU(approximate=approximate)
        self.fc_out = nn.Linear(4 * D, D)
        self.ln_ffn = (TimeAxisLayerNorm if time_axis else nn.LayerNorm)(D, eps=1e-12)

    def forward(self, x, attention_mask):
        x = self.ln_attn(x + self.attn(x, attention_mask))
        return self.ln_ffn(x + self.fc_out(self.act(self.fc_in(x))))


class PostNormBert(nn.Module):
    def __init__(self, inverted_second: bool = False, approximate_second: str = "none", time_axis_second=False):
        super().__init__()
        self.word_embeddings = nn.Embedding(V, D, padding_idx=PAD)
        self.position_embeddings = nn.Embedding(T_MAX, D)
        self.token_type_embeddings = nn.Embedding(TYPES, D)
        self.embeddings_norm = nn.LayerNorm(D, eps=1e-12)
        self.layers = nn.ModuleList([BertLayer(), BertLayer(inverted_second, approximate_second, time_axis_second)])

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        if attention_mask is None:
            attention_mask = input_ids.ne(PAD).long()
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        x = self.embeddings_norm(x + self.token_type_embeddings(token_type_ids))
        for layer in self.layers:
            x = layer(x, attention_mask)
        return x


def post_norm_bert(**kw) -> PostNormBert:
    torch.manual_seed(0)
    return _jitter(PostNormBert(**kw))


# -- a T5-style encoder-decoder: the stack computes its bias once from block 0's table -----------------------------

BUCKETS, MAX_DISTANCE = 8, 16


def relative_buckets(query_len: int, key_len: int, bidirectional: bool) -> torch.Tensor:
    """T5's bucket of (key - query): exact below half the (half) buckets, log-spaced up to MAX_DISTANCE beyond."""
    relative = torch.arange(key_len)[None, :] - torch.arange(query_len)[:, None]
    n, bucket = BUCKETS, torch.zeros_like(relative)
    if bidirectional:
        n //= 2
        bucket = (relative > 0).long() * n
        relative = relative.abs()
    else:
        relative = (-relative).clamp(min=0)
    exact = n // 2
    far = exact + (torch.log(relative.clamp(min=1).double() / exact) / math.log(MAX_DISTANCE / exact) * (n - exact))
    far = far.long().clamp(max=n - 1)
    return bucket + torch.where(relative < exact, relative, far)


class RMSNormNoBias(nn.Module):
    def __init__(self, eps: float = 1e-6, eps_outside: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(D))
        self.eps, self.eps_outside = eps, eps_outside

    def forward(self, x):
        mean_square = x.square().mean(-1, keepdim=True)
        if self.eps_outside:
            return self.weight * x / (mean_square.sqrt() + self.eps)
        return self.weight * (x * torch.rsqrt(mean_square + self.eps))


class T5Attention(nn.Module):
    def __init__(self, causal: bool = False, softmax_dim: int = -1):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D, bias=False) for _ in range(4))
        self.causal, self.softmax_dim = causal, softmax_dim

    def forward(self, x, source, bias=None, keep=None):
        q, k, v = _split(self.q(x)), _split(self.k(source)), _split(self.v(source))
        scores = q @ k.transpose(-2, -1)  # T5: no 1/sqrt(d)
        if bias is not None:
            scores = scores + bias
        if self.causal:
            T = x.shape[1]
            scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        if keep is not None:
            scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
        return self.o(_merge(scores.softmax(self.softmax_dim) @ v))


class T5Block(nn.Module):
    def __init__(self, first: bool, decoder: bool, causal: bool = True, softmax_dim: int = -1, eps_outside=False):
        super().__init__()
        self.relative_bias = nn.Embedding(BUCKETS, H) if first else None
        self.norm_self = RMSNormNoBias()
        self.self_attn = T5Attention(causal=decoder and causal, softmax_dim=softmax_dim)
        if decoder:
            self.norm_cross = RMSNormNoBias(eps_outside=eps_outside)
            self.cross_attn = T5Attention()
        self.norm_ff = RMSNormNoBias()
        self.wi = nn.Linear(D, 2 * D, bias=False)
        self.wo = nn.Linear(2 * D, D, bias=False)
        self.decoder = decoder

    def forward(self, x, bias, memory=None, keep=None):
        h = self.norm_self(x)
        x = x + self.self_attn(h, h, bias, keep=None if self.decoder else keep)
        if self.decoder:
            x = x + self.cross_attn(self.norm_cross(x), memory, keep=keep)
        return x + self.wo(F.relu(self.wi(self.norm_ff(x))))


class T5Stack(nn.Module):
    def __init__(self, decoder: bool, second: dict):
        super().__init__()
        self.block = nn.ModuleList([T5Block(True, decoder), T5Block(False, decoder, **second)])
        self.final_norm = RMSNormNoBias()
        self.decoder = decoder

    def forward(self, x, memory=None, keep=None):
        T = x.shape[1]
        buckets = relative_buckets(T, T, bidirectional=not self.decoder).to(x.device)
        bias = self.block[0].relative_bias(buckets).permute(2, 0, 1)[None]  # (1, H, T, T)
        for block in self.block:
            x = block(x, bias, memory, keep)
        return self.final_norm(x)


class T5Style(nn.Module):
    def __init__(self, encoder_second: dict | None = None, decoder_second: dict | None = None):
        super().__init__()
        self.shared = nn.Embedding(V, D)
        self.encoder = T5Stack(False, encoder_second or {})
        self.decoder = T5Stack(True, decoder_second or {})

    def forward(self, input_ids, decoder_input_ids):
        keep = input_ids != PAD
        memory = self.encoder(self.shared(input_ids), keep=keep)
        y = self.decoder(self.shared(decoder_input_ids), memory, keep)
        return (y * D**-0.5) @ self.shared.weight.T


def t5_style(**kw) -> T5Style:
    torch.manual_seed(0)
    return _jitter(T5Style(**kw))


# -- a BART-style encoder-decoder as the original: post-norm, offset positions, layernorm_embedding ----------------


class BartAttention(nn.Module):
    def __init__(self, causal: bool = False, scale: float = HD**-0.5, masked: bool = True):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(D, D) for _ in range(4))
        self.causal, self.scale, self.masked = causal, scale, masked

    def forward(self, x, source, keep=None):
        q, k, v = _split(self.q_proj(x)), _split(self.k_proj(source)), _split(self.v_proj(source))
        scores = (q @ k.transpose(-2, -1)) * self.scale
        if self.causal:
            T = x.shape[1]
            future = torch.triu(torch.full((T, T), float("-inf"), device=x.device), 1)
            scores = scores + future
        if keep is not None and self.masked:
            scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
        return self.out_proj(_merge(scores.softmax(-1) @ v))


class BartEncoderLayer(nn.Module):
    def __init__(self, scale: float = HD**-0.5):
        super().__init__()
        self.self_attn = BartAttention(scale=scale)
        self.self_attn_layer_norm = nn.LayerNorm(D)
        self.fc1, self.fc2 = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)
        self.final_layer_norm = nn.LayerNorm(D)

    def forward(self, x, keep):
        x = self.self_attn_layer_norm(x + self.self_attn(x, x, keep))
        return self.final_layer_norm(x + self.fc2(F.gelu(self.fc1(x))))


class BartDecoderLayer(nn.Module):
    def __init__(self, cross_masked: bool = True):
        super().__init__()
        self.self_attn = BartAttention(causal=True)
        self.self_attn_layer_norm = nn.LayerNorm(D)
        self.encoder_attn = BartAttention(masked=cross_masked)
        self.encoder_attn_layer_norm = nn.LayerNorm(D)
        self.fc1, self.fc2 = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)
        self.final_layer_norm = nn.LayerNorm(D)

    def forward(self, y, memory, keep):
        y = self.self_attn_layer_norm(y + self.self_attn(y, y))
        y = self.encoder_attn_layer_norm(y + self.encoder_attn(y, memory, keep))
        return self.final_layer_norm(y + self.fc2(F.gelu(self.fc1(y))))


class BartStack(nn.Module):
    OFFSET = 2

    def __init__(self, tokens: nn.Embedding, layers: list):
        super().__init__()
        self.embed_tokens = tokens
        self.embed_positions = nn.Embedding(T_MAX + self.OFFSET, D)
        self.layernorm_embedding = nn.LayerNorm(D)
        self.layers = nn.ModuleList(layers)

    def embed(self, ids):
        positions = torch.arange(self.OFFSET, ids.shape[1] + self.OFFSET, device=ids.device)
        return self.layernorm_embedding(self.embed_tokens(ids) + self.embed_positions(positions))


class BartOriginal(nn.Module):
    def __init__(self, encoder_scale_second: float = HD**-0.5, cross_masked_second: bool = True):
        super().__init__()
        self.shared = nn.Embedding(V, D, padding_idx=PAD)
        self.encoder = BartStack(self.shared, [BartEncoderLayer(), BartEncoderLayer(encoder_scale_second)])
        self.decoder = BartStack(self.shared, [BartDecoderLayer(), BartDecoderLayer(cross_masked_second)])
        self.final_logits_bias = nn.Parameter(torch.zeros(V))

    def forward(self, input_ids, decoder_input_ids):
        keep = input_ids != PAD
        x = self.encoder.embed(input_ids)
        for layer in self.encoder.layers:
            x = layer(x, keep)
        y = self.decoder.embed(decoder_input_ids)
        for layer in self.decoder.layers:
            y = layer(y, x, keep)
        return F.linear(y, self.shared.weight, self.final_logits_bias)


def bart_original(**kw) -> BartOriginal:
    torch.manual_seed(0)
    return _jitter(BartOriginal(**kw))


# -- a ViT: Conv2d patches, a class token in front, N + 1 positions, pre-norm SDPA blocks --------------------------

IMAGE, PATCH, CHANNELS, CLASSES = 16, 4, 3, 10


class VitAttention(nn.Module):
    def __init__(self, dropout_always: bool = False, scale: float | None = None):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.dropout_always, self.scale = dropout_always, scale

    def forward(self, x):
        q, k, v = (_split(t) for t in self.qkv(x).chunk(3, dim=-1))
        if not self.dropout_always:
            return self.proj(_merge(F.scaled_dot_product_attention(q, k, v, scale=self.scale)))
        probabilities = F.dropout((q @ k.transpose(-2, -1) * HD**-0.5).softmax(-1), 0.1)
        return self.proj(_merge(probabilities @ v))


class VitBlock(nn.Module):
    def __init__(self, **attention):
        super().__init__()
        self.norm1 = nn.LayerNorm(D, eps=1e-6)
        self.attn = VitAttention(**attention)
        self.norm2 = nn.LayerNorm(D, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Vit(nn.Module):
    def __init__(self, **second):
        super().__init__()
        self.patch_embed = nn.Conv2d(CHANNELS, D, kernel_size=PATCH, stride=PATCH)
        self.cls_token = nn.Parameter(0.02 * torch.randn(1, 1, D))
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, (IMAGE // PATCH) ** 2 + 1, D))
        self.blocks = nn.ModuleList([VitBlock(), VitBlock(**second)])
        self.norm = nn.LayerNorm(D, eps=1e-6)
        self.head = nn.Linear(D, CLASSES)

    def forward(self, pixel_values):
        x = self.patch_embed(pixel_values).flatten(2).transpose(1, 2)  # (B, N, D)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


def vit(**kw) -> Vit:
    torch.manual_seed(0)
    return _jitter(Vit(**kw))


# -- a CLIP text tower: SDPA with a boolean keep buffer, QuickGELU, end-token pooling ------------------------------


class QuickGELU(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


class ClipAttention(nn.Module):
    def __init__(self, shows_next: bool = False):
        super().__init__()
        self.in_proj = nn.Linear(D, 3 * D)
        self.out_proj = nn.Linear(D, D)
        keep = torch.ones(T_MAX, T_MAX, dtype=torch.bool).tril(1 if shows_next else 0)  # True = may attend
        self.register_buffer("keep", keep, persistent=False)

    def forward(self, x):
        T = x.shape[1]
        q, k, v = (_split(t) for t in self.in_proj(x).chunk(3, dim=-1))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.keep[:T, :T])
        return self.out_proj(_merge(out))


class ResidualAttentionBlock(nn.Module):
    def __init__(self, shows_next: bool = False):
        super().__init__()
        self.ln_1 = nn.LayerNorm(D)
        self.attn = ClipAttention(shows_next)
        self.ln_2 = nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), QuickGELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    def __init__(self, shows_next_second: bool = False):
        super().__init__()
        self.resblocks = nn.Sequential(ResidualAttentionBlock(), ResidualAttentionBlock(shows_next_second))

    def forward(self, x):
        return self.resblocks(x)


class ClipText(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.token_embedding = nn.Embedding(V, D)
        self.positional_embedding = nn.Parameter(0.01 * torch.randn(T_MAX, D))
        self.transformer = Transformer(**kw)
        self.ln_final = nn.LayerNorm(D)
        self.text_projection = nn.Linear(D, 16, bias=False)

    def forward(self, text):
        x = self.token_embedding(text) + self.positional_embedding[: text.shape[1]]
        x = self.ln_final(self.transformer(x))
        return self.text_projection(x[torch.arange(x.shape[0], device=x.device), text.argmax(-1)])


def clip_text(**kw) -> ClipText:
    torch.manual_seed(0)
    return _jitter(ClipText(**kw))


# -- a Whisper-style encoder-decoder in OpenAI's layout ------------------------------------------------------------

MELS = 8


def whisper_sinusoids(length: int, width: int) -> torch.Tensor:
    """Sines in the first half of the channels, cosines in the second, timescales from 1 to 10000."""
    increment = math.log(10000) / (width // 2 - 1)
    rates = torch.exp(-increment * torch.arange(width // 2))
    angles = torch.arange(length)[:, None] * rates[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


class WhisperAttention(nn.Module):
    def __init__(self, swapped: bool = False):
        super().__init__()
        self.query = nn.Linear(D, D)
        self.key = nn.Linear(D, D, bias=False)
        self.value = nn.Linear(D, D)
        self.out = nn.Linear(D, D)
        self.swapped = swapped

    def forward(self, x, source=None, causal: bool = False):
        source = x if source is None else source
        q, k, v = _split(self.query(x)), _split(self.key(source)), _split(self.value(source))
        scale = HD**-0.25  # OpenAI's: q and k each by d^-1/4
        q, k = q * scale, k * scale
        scores = k @ q.transpose(-2, -1) if self.swapped else q @ k.transpose(-2, -1)
        if causal:
            T = x.shape[1]
            scores = scores + torch.full((T, T), float("-inf"), device=x.device).triu(1)
        return self.out(_merge(scores.softmax(-1) @ v))


class WhisperBlock(nn.Module):
    def __init__(self, cross: bool = False, swapped: bool = False, cross_reads_self: bool = False):
        super().__init__()
        self.attn = WhisperAttention(swapped)
        self.attn_ln = nn.LayerNorm(D)
        if cross:
            self.cross_attn = WhisperAttention()
            self.cross_attn_ln = nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        self.mlp_ln = nn.LayerNorm(D)
        self.cross, self.cross_reads_self = cross, cross_reads_self

    def forward(self, x, audio=None):
        x = x + self.attn(self.attn_ln(x), causal=self.cross)
        if self.cross:
            h = self.cross_attn_ln(x)
            x = x + self.cross_attn(h, h if self.cross_reads_self else audio)
        return x + self.mlp(self.mlp_ln(x))


class AudioEncoder(nn.Module):
    def __init__(self, swapped_second: bool = False):
        super().__init__()
        self.conv1 = nn.Conv1d(MELS, D, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(D, D, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positional_embedding", whisper_sinusoids(T_MAX, D))
        self.blocks = nn.ModuleList([WhisperBlock(), WhisperBlock(swapped=swapped_second)])
        self.ln_post = nn.LayerNorm(D)

    def forward(self, mel):  # (B, MELS, frames) -> (B, frames / 2, D)
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).permute(0, 2, 1)
        x = x + self.positional_embedding[: x.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.ln_post(x)


class TextDecoder(nn.Module):
    def __init__(self, cross_reads_self_second: bool = False, table: bool = False):
        super().__init__()
        self.token_embedding = nn.Embedding(V, D)
        self.positional_embedding = nn.Parameter(0.01 * torch.randn(T_MAX, D))
        if table:  # the same rows held by an nn.Embedding read at 0..T-1
            rows = self.positional_embedding.data
            del self.positional_embedding
            self.positional_embedding = nn.Embedding.from_pretrained(rows, freeze=False)
        self.blocks = nn.ModuleList([WhisperBlock(True), WhisperBlock(True, cross_reads_self=cross_reads_self_second)])
        self.ln = nn.LayerNorm(D)

    def forward(self, tokens, audio):
        T = tokens.shape[1]
        if isinstance(self.positional_embedding, nn.Embedding):
            positions = self.positional_embedding(torch.arange(T, device=tokens.device))
        else:
            positions = self.positional_embedding[:T]
        x = self.token_embedding(tokens) + positions
        for block in self.blocks:
            x = block(x, audio)
        return self.ln(x) @ self.token_embedding.weight.T


class WhisperStyle(nn.Module):
    def __init__(self, swapped_second: bool = False, cross_reads_self_second: bool = False, table: bool = False):
        super().__init__()
        self.encoder = AudioEncoder(swapped_second)
        self.decoder = TextDecoder(cross_reads_self_second, table)

    def forward(self, mel, tokens):
        return self.decoder(tokens, self.encoder(mel))


def whisper_style(**kw) -> WhisperStyle:
    torch.manual_seed(0)
    return _jitter(WhisperStyle(**kw))


CASES = [
    ("f52_post_norm_bert", post_norm_bert, "encoder_model", {}, "pass"),
    (
        "f52_post_norm_bert.mask_inverted_second_layer",
        lambda: post_norm_bert(inverted_second=True),
        "encoder_model",
        {},
        ("mistake", "attention.mask_inverted", "layers.1.attn"),
    ),
    (
        "f52_post_norm_bert.gelu_tanh_second_layer",
        lambda: post_norm_bert(approximate_second="tanh"),
        "encoder_model",
        {},
        ("no pair", "layers.1.act", "tanh"),
    ),
    (
        "f52_post_norm_bert.norm_over_positions_second_layer",
        lambda: post_norm_bert(time_axis_second=True),
        "encoder_model",
        {},
        ("mistake", "layer_norm.wrong_axis", "layers.1.ln_ffn"),
    ),
    ("f52_t5_style", t5_style, "transformer", {}, "pass"),
    (
        "f52_t5_style.not_causal_second_decoder_block",
        lambda: t5_style(decoder_second={"causal": False}),
        "transformer",
        {},
        ("mistake", "attention.not_causal", "decoder.block.1.self_attn"),
    ),
    (
        "f52_t5_style.cross_norm_eps_outside_root_second_decoder_block",
        lambda: t5_style(decoder_second={"eps_outside": True}),
        "transformer",
        {},
        ("mistake", "rms_norm.eps_outside_sqrt", "decoder.block.1.norm_cross"),
    ),
    (
        "f52_t5_style.softmax_over_queries_second_encoder_block",
        lambda: t5_style(encoder_second={"softmax_dim": -2}),
        "transformer",
        {},
        ("mistake", "attention.softmax_wrong_axis", "encoder.block.1.self_attn"),
    ),
    ("f52_bart_original", bart_original, "transformer", {}, "pass"),
    (
        "f52_bart_original.cross_mask_dropped_second_decoder_layer",
        lambda: bart_original(cross_masked_second=False),
        "transformer",
        {},
        ("mistake", "attention.mask_ignored", "decoder.layers.1.encoder_attn"),
    ),
    (
        "f52_bart_original.scale_by_head_dim_second_encoder_layer",
        lambda: bart_original(encoder_scale_second=1.0 / HD),
        "transformer",
        {},
        ("mistake", "attention.wrong_scale", "encoder.layers.1.self_attn"),
    ),
    ("f52_vit", vit, "transformer_lm", {}, "pass"),
    (
        "f52_vit.dropout_always_second_block",
        lambda: vit(dropout_always=True),
        "transformer_lm",
        {},
        ("mistake", "dropout.active_in_eval", "blocks.1.attn"),
    ),
    (
        "f52_vit.scale_by_head_dim_second_block",
        lambda: vit(scale=1.0 / HD),
        "transformer_lm",
        {},
        ("mistake", "attention.wrong_scale", "blocks.1.attn"),
    ),
    ("f52_clip_text", clip_text, "transformer_lm", {}, "pass"),
    (
        "f52_clip_text.shows_next_second_layer",
        lambda: clip_text(shows_next_second=True),
        "transformer_lm",
        {},
        ("mistake", "attention.causal_shows_next", "transformer.resblocks.1.attn"),
    ),
    ("f52_whisper_style", whisper_style, "transformer", {}, "pass"),
    ("f52_whisper_style.position_table", lambda: whisper_style(table=True), "transformer", {}, "pass"),
    (
        "f52_whisper_style.keys_queries_swapped_second_encoder_block",
        lambda: whisper_style(swapped_second=True, table=True),
        "transformer",
        {},
        ("mistake", "attention.q_k_swapped", "encoder.blocks.1.attn"),
    ),
    (
        "f52_whisper_style.cross_reads_own_states_second_decoder_block",
        lambda: whisper_style(cross_reads_self_second=True, table=True),
        "transformer",
        {},
        ("no pair", "decoder.blocks.1.cross_attn", ""),
    ),
]
