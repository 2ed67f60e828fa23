"""Transformers over video, time series, point clouds and boards as 2025-26 learners write them by hand (issue 46,
round 58), in this project's own words. The judge meets them here first (measured with the judge frozen).

- TimeSformer's divided space-time attention in timm's idioms (one ``qkv`` Linear permuted to (3, B, H, N, hd),
  ``scale = hd ** -0.5``, ``proj``): the block on (B, F, N, D) attends over the F frames at each patch on
  (B * N, F, D), adds ``temporal_fc`` of it, then over the N patches of each frame on (B * F, N, D), then the MLP;
  a space block alone (on (B * F, N, D)) and a stack of time blocks alone (on (B * N, F, D)), each an ordinary pre-LN
  layer or stack;
- ViViT's factorised encoder in lucidrains' idioms (``PreNorm(dim, fn)`` around a bias-free ``to_qkv`` chunked in
  three, ``layers`` of [attention, feed-forward] pairs, a hand-written LayerNorm, a final norm): a CLS per frame
  and a (1, F, N + 1, D) table, the spatial encoder on (B * F, N + 1, D), each frame's CLS after a temporal CLS into
  the temporal encoder;
- iTransformer and Informer in Time-Series-Library's idioms: ``AttentionLayer`` of query/key/value/out projections
  around ``FullAttention`` (``einsum("blhe,bshe->bhls")``), post-norm ``EncoderLayer`` with kernel-1 ``Conv1d``
  feed-forward, ``Encoder(attn_layers, conv_layers, norm)``; iTransformer's ``DataEmbedding_inverted`` (the whole
  series of each variate one token by ``Linear(seq_len, d_model)``) and ``projector`` to the horizon; Informer's
  distilling ``ConvLayer`` (circular Conv1d of kernel 3, BatchNorm1d, ELU, MaxPool1d of stride 2) between layers;
- Autoformer's encoder layer (the ordinary attention in place of its auto-correlation): ``series_decomp`` (both ends
  repeated, ``AvgPool1d(k, stride=1)``, the seasonal part ``x - moving_mean`` kept) after the attention's sum and
  after the feed-forward's, no norms;
- a point cloud transformer (PCT): plain SA layers token-major with PCT's names (``q_conv`` and ``k_conv`` one tied
  weight, as PCT ties them), ``sa1`` and ``sa2`` as attributes, a per-point MLP embedding of xyz without positions;
  PCT's offset-attention as published, channel-first, one head, the softmax then each column divided by its sum,
  ``x + ReLU(BN(trans_conv(x - x_r)))``;
- a chess transformer: 13 piece ids on 64 squares, a (1, 64, D) square table added whole (the board is always 64
  squares), post-norm layers of a ``qkv`` Linear and SDPA, a policy head of 64 target squares per square;
- mistakes, each in the second layer of a correct model: scale 1 / hd (the TimeSformer time stack; PCT's ``sa2``),
  the softmax over queries (iTransformer's encoder), the variance by ``x.var()``'s n - 1 (ViViT's hand-written
  norm), heads split by a view without the transpose (the chess encoder).

Expected verdicts decided from the math. Each attention equals a head-by-head rewrite in float64: timm's 2.5e-16,
lucidrains' 2.5e-16, TSLib's 2.2e-16, the SDPA one 4.4e-16, the tied PCT SA layer (norms and feed-forward included)
8.9e-16; the hand-written LayerNorm equals ``F.layer_norm`` to 4.4e-16, its unbiased twin the n - 1 formula exactly;
the chess mistake equals ``view(B, H, T, hd)`` of the (B, T, D) projections merged by a plain reshape (2.2e-16), the
catalogue's split-and-merge variant. A space block alone on (B * F, N, D) and a time stack alone on (B * N, F, D) are
the reference's layer and stack: passes. TSLib's post-norm encoder with its final norm is the reference's (kernel-1
convolutions are linears): a pass. PCT's q/k tie is the reference's attention at W_q = W_k, its gradient the sum of
the two (a tie, as embeddings are tied): a pass (the same layer untied passes today). The square table added whole
is the position table read at 0 .. 63 on a 64-square board: a pass. The divided block attends within a frame and
within a patch, never over all F N tokens: no pair, first at ``temporal_attn``. ViViT first prepends a CLS per
frame (``space_token``): no pair at the module. iTransformer's value embedding projects time to features: no pair
there (said, "8 -> 32"). Informer's distilling convolution: no pair at ``downConv``. Autoformer's decomposition
stands where a post-norm layer's norm stands: no pair at ``decomp1.moving_avg`` (its op). The offset-attention's
first departure is in its own forward (the column renormalisation, then x - x_r): no pair at the module. The
per-point MLP: no pair at ``embedding.0``. The policy head is a projection the encoder model has not: no pair at
``policy_head``. The chess body without an example cannot run on fewer than 64 squares: could not judge, asking for
``example=``.

First met: 9 of 20 right. Wrong:

- f58_timesformer.divided_block, f58_vivit, f58_pct.embedded: "could not judge: the module's forward could not be
  recorded on the inputs of 'encoder_layer' / 'encoder_stack' ... (its forward raised ValueError: not enough values
  to unpack (expected 4, got 3))" (the MLP's "mat1 and mat2 shapes cannot be multiplied (24x32 and 3x32)"), though
  each was given ``example=`` of its own shape.
- f58_pct.sa_layer, f58_pct.sa_stack and its wrong_scale_sa2 twin: "could not judge: cannot read q_conv.weight (32
  rows) as the q, k projection(s) of an attention of width 32 (1 query piece(s)); pass mapping=" (the tied q/k
  weight; untied, the layer passes).
- f58_autoformer.layer: "differs at attention: the layer has no norm with a learned scale, where each of the
  reference's has one": the right class, but not the decomposition the layer computes.
- f58_pct.offset_attention: "differs at after_norm: batch_norm(x) normalises each feature by its statistics over the
  batch": the right class, past the first departure.
- f58_chess.body and its heads_without_transpose twin: FAILED with no id and no op ("unexplained: piece_embedding
  (reference encoder.embedding) diverges with relative error 1.97e-01"): the table added whole not read as positions.
- f58_chess.body.no_example: "could not judge: ... (its forward raised RuntimeError: The size of tensor a (3) must
  match the size of tensor b (64) at non-singleton dimension 1); pass call= (how to call it) or mapping=", not
  example=.

Fixed since: a parameter of two axes over 1, (T, D) or (1, T, D), added whole to the rows the ids looked up (no
projection between), one row to each position, is read as a position table at 0 .. T - 1 (dataflow._added_whole): the
chess body passes and its mistake is named. Where the forward could not be recorded on the judge's own probe (neither
example= nor call= given), the answer asks for example= too: f58_chess.body.no_example. Where the level's probe cannot
stand for an example's input, the example's own call is read: an input of more axes than (B, T, D) is said at the first
op reading its tokens in groups (the divided block's scores over each patch's frames, ViViT's cat of ``space_token``
beside each frame's patches), one of another width than the attentions read at the projection that widens it (PCT's
per-point MLP, ``embedding.0``). A layer with no norm whose stream, after the attention's residual sum, goes through ops
of its own before the next unit is said at the first of them, with the ops (Autoformer's decomposition: repeat, cat,
avg_pool1d, sub at ``decomp1.moving_avg``); a softmax's weights divided by their sum along another axis than the
softmax's (PCT's column renormalisation) are said at the division. A weight the queries and the keys each project the
input by, a product of its own apiece (PCT's ``q_conv`` and ``k_conv`` one tensor), is read as a tie, not as a fused
projection whose rows the two split: linked to the reference's q and k projections both, the reference run with them
equal and the tensor's gradient compared with the sum of theirs (a note says so), as a module run again is read.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

D, H = 32, 4
HD = D // H
FRAMES, PATCHES = 3, 4  # the video's frames and patches per frame
SEQ_LEN, PRED_LEN, VARIATES = 8, 4, 5  # the time series' lookback, horizon and variates
POINTS = 8
PIECES, SQUARES, MOVES = 13, 64, 64  # empty square and 12 pieces; 64 squares; a move's target square per square


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases moved off their 1s and 0s (BatchNorm's running statistics too), so that a trained
    model's values are checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
        for m in model.modules():
            if isinstance(m, nn.BatchNorm1d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.8, 1.2)
    return model.eval()


def _seeded(make):
    """A factory: the model built under seed 0 and jittered."""

    def factory(*args, **kwargs):
        torch.manual_seed(0)
        return _jitter(make(*args, **kwargs))

    return factory


# -- TimeSformer (Bertasius et al. 2021): divided space-time attention, timm's idioms -----------------------------


class Attention(nn.Module):
    """timm's: one `qkv` Linear, (B, N, 3, H, hd) permuted to (3, B, H, N, hd), `scale = hd ** -0.5`, `proj`.
    `mistake`: "wrong_scale" (scale = 1 / hd), "softmax_over_queries" (softmax along dim -2)."""

    def __init__(self, dim: int = D, num_heads: int = H, mistake: str = "") -> None:
        super().__init__()
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.scale = head_dim**-1.0 if mistake == "wrong_scale" else head_dim**-0.5
        self.axis = -2 if mistake == "softmax_over_queries" else -1
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = attn.softmax(dim=self.axis)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class Mlp(nn.Module):
    def __init__(self, dim: int = D) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """A pre-LN ViT block: x + attn(norm1(x)), x + mlp(norm2(x))."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(D, eps=1e-6), Attention(mistake=mistake)
        self.norm2, self.mlp = nn.LayerNorm(D, eps=1e-6), Mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TimeStack(nn.Module):
    """Blocks and a final norm: TimeSformer's time attention alone, run on (B * N, F, D), each patch's frames."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block(mistake)])
        self.norm = nn.LayerNorm(D, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x)


class DividedBlock(nn.Module):
    """TimeSformer's 'divided_space_time' block on (B, F, N, D): the time attention over the F frames at each patch
    (on (B * N, F, D)), its `temporal_fc`, then the space attention over the N patches of each frame (on
    (B * F, N, D)), then the MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.temporal_norm1, self.temporal_attn = nn.LayerNorm(D, eps=1e-6), Attention()
        self.temporal_fc = nn.Linear(D, D)
        self.norm1, self.attn = nn.LayerNorm(D, eps=1e-6), Attention()
        self.norm2, self.mlp = nn.LayerNorm(D, eps=1e-6), Mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, N, C = x.shape
        xt = x.permute(0, 2, 1, 3).reshape(B * N, T, C)
        xt = self.temporal_fc(self.temporal_attn(self.temporal_norm1(xt)))
        x = x + xt.reshape(B, N, T, C).permute(0, 2, 1, 3)
        xs = x.reshape(B * T, N, C)
        x = x + self.attn(self.norm1(xs)).reshape(B, T, N, C)
        return x + self.mlp(self.norm2(x))


block = _seeded(Block)
time_stack = _seeded(TimeStack)
divided_block = _seeded(DividedBlock)


def video_tokens() -> tuple:
    return (torch.randn(2, FRAMES, PATCHES, D, generator=torch.Generator().manual_seed(1)),), {}


# -- ViViT (Arnab et al. 2021), model 2 "factorised encoder", lucidrains' idioms -----------------------------------


class HandLayerNorm(nn.Module):
    """A LayerNorm written out; `unbiased`: the variance by torch's default `x.var()` (divides by n - 1)."""

    def __init__(self, dim: int, unbiased: bool = False, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim))
        self.unbiased, self.eps = unbiased, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, unbiased=self.unbiased)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class PreNorm(nn.Module):
    def __init__(self, dim: int, fn: nn.Module, unbiased: bool = False) -> None:
        super().__init__()
        self.norm, self.fn = HandLayerNorm(dim, unbiased), fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self.norm(x))


class LucidAttention(nn.Module):
    """`to_qkv` without bias chunked in three, heads by `view` + `transpose`, `to_out`."""

    def __init__(self, dim: int = D, heads: int = H) -> None:
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.to_qkv = nn.Linear(dim, dim * 3, bias=False)
        self.to_out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in self.to_qkv(x).chunk(3, dim=-1))
        attn = (torch.matmul(q, k.transpose(-1, -2)) * self.scale).softmax(dim=-1)
        return self.to_out(torch.matmul(attn, v).transpose(1, 2).reshape(b, n, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int = D) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Transformer(nn.Module):
    """lucidrains' `Transformer`: `layers` of [PreNorm(attention), PreNorm(feed-forward)], a final norm.
    `unbiased_second`: the second layer's attention norm divides its variance by n - 1."""

    def __init__(self, depth: int = 2, unbiased_second: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.ModuleList(
                [PreNorm(D, LucidAttention(), unbiased=unbiased_second and i == 1), PreNorm(D, FeedForward())]
            )
            for i in range(depth)
        )
        self.norm = HandLayerNorm(D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for attn, ff in self.layers:
            x = attn(x) + x
            x = ff(x) + x
        return self.norm(x)


class ViViT(nn.Module):
    """`forward(x)` on patch tokens (B, F, N, D): a CLS per frame prepended, the (1, F, N + 1, D) position table
    added, the spatial encoder on (B * F, N + 1, D), each frame's CLS into the temporal encoder after a temporal CLS,
    its CLS out."""

    def __init__(self) -> None:
        super().__init__()
        self.pos_embedding = nn.Parameter(0.2 * torch.randn(1, FRAMES, PATCHES + 1, D))
        self.space_token = nn.Parameter(0.2 * torch.randn(1, 1, D))
        self.space_transformer = Transformer()
        self.temporal_token = nn.Parameter(0.2 * torch.randn(1, 1, D))
        self.temporal_transformer = Transformer()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, n, _ = x.shape
        cls_space = self.space_token[None].expand(b, t, 1, D)
        x = torch.cat((cls_space, x), dim=2) + self.pos_embedding[:, :, : n + 1]
        x = self.space_transformer(x.reshape(b * t, n + 1, D))
        x = x[:, 0].reshape(b, t, D)
        x = torch.cat((self.temporal_token.expand(b, 1, D), x), dim=1)
        return self.temporal_transformer(x)[:, 0]


transformer = _seeded(Transformer)
vivit = _seeded(ViViT)


# -- iTransformer (Liu et al. 2024) and Informer (Zhou et al. 2021), Time-Series-Library's idioms -------------------


class FullAttention(nn.Module):
    """TSLib's inner attention: `einsum("blhe,bshe->bhls")`, scale 1 / sqrt(E), softmax, `einsum("bhls,bshd->blhd")`.
    `mistake` "softmax_over_queries": the softmax along dim -2."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.axis = -2 if mistake == "softmax_over_queries" else -1

    def forward(self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        E = queries.shape[-1]
        scores = torch.einsum("blhe,bshe->bhls", queries, keys)
        A = torch.softmax(scores / math.sqrt(E), dim=self.axis)
        return torch.einsum("bhls,bshd->blhd", A, values).contiguous()


class AttentionLayer(nn.Module):
    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.inner_attention = FullAttention(mistake)
        self.query_projection, self.key_projection = nn.Linear(D, D), nn.Linear(D, D)
        self.value_projection, self.out_projection = nn.Linear(D, D), nn.Linear(D, D)
        self.n_heads = H

    def forward(self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        B, L, _ = queries.shape
        _, S, _ = keys.shape
        queries = self.query_projection(queries).view(B, L, self.n_heads, -1)
        keys = self.key_projection(keys).view(B, S, self.n_heads, -1)
        values = self.value_projection(values).view(B, S, self.n_heads, -1)
        out = self.inner_attention(queries, keys, values).view(B, L, -1)
        return self.out_projection(out)


class EncoderLayer(nn.Module):
    """TSLib's post-norm layer: norm1(x + attention(x)), norm2(x + conv2(act(conv1(x)))), kernel-1 Conv1d's."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.attention = AttentionLayer(mistake)
        self.conv1 = nn.Conv1d(in_channels=D, out_channels=4 * D, kernel_size=1)
        self.conv2 = nn.Conv1d(in_channels=4 * D, out_channels=D, kernel_size=1)
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.dropout = nn.Dropout(0.1)
        self.activation = F.gelu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attention(x, x, x))
        y = x = self.norm1(x)
        y = self.dropout(self.activation(self.conv1(y.transpose(-1, 1))))
        y = self.dropout(self.conv2(y).transpose(-1, 1))
        return self.norm2(x + y)


class ConvLayer(nn.Module):
    """Informer's distilling layer: circular Conv1d (kernel 3), BatchNorm1d, ELU, MaxPool1d (stride 2)."""

    def __init__(self) -> None:
        super().__init__()
        self.downConv = nn.Conv1d(D, D, kernel_size=3, padding=1, padding_mode="circular")
        self.norm = nn.BatchNorm1d(D)
        self.activation = nn.ELU()
        self.maxPool = nn.MaxPool1d(kernel_size=3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.downConv(x.permute(0, 2, 1))
        x = self.maxPool(self.activation(self.norm(x)))
        return x.transpose(1, 2)


class Encoder(nn.Module):
    """TSLib's `Encoder(attn_layers, conv_layers, norm_layer)`: with conv layers, each attention layer but the last
    followed by its distilling layer."""

    def __init__(self, distil: bool = False, mistake: str = "") -> None:
        super().__init__()
        self.attn_layers = nn.ModuleList([EncoderLayer(), EncoderLayer(mistake)])
        self.conv_layers = nn.ModuleList([ConvLayer()]) if distil else None
        self.norm = nn.LayerNorm(D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.conv_layers is not None:
            for attn_layer, conv_layer in zip(self.attn_layers, self.conv_layers, strict=False):
                x = conv_layer(attn_layer(x))
            x = self.attn_layers[-1](x)
        else:
            for attn_layer in self.attn_layers:
                x = attn_layer(x)
        return self.norm(x)


class DataEmbeddingInverted(nn.Module):
    """iTransformer's: the whole series of each variate one token, `Linear(seq_len, d_model)` over time."""

    def __init__(self) -> None:
        super().__init__()
        self.value_embedding = nn.Linear(SEQ_LEN, D)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.value_embedding(x.permute(0, 2, 1)))


class ITransformer(nn.Module):
    """`forward(x_enc)` on (B, seq_len, N): variates as tokens, the encoder, `projector` to the horizon,
    (B, pred_len, N) out (`use_norm` off: no per-series standardising)."""

    def __init__(self) -> None:
        super().__init__()
        self.enc_embedding = DataEmbeddingInverted()
        self.encoder = Encoder()
        self.projector = nn.Linear(D, PRED_LEN)

    def forward(self, x_enc: torch.Tensor) -> torch.Tensor:
        N = x_enc.shape[2]
        enc_out = self.encoder(self.enc_embedding(x_enc))
        return self.projector(enc_out).permute(0, 2, 1)[:, :, :N]


encoder = _seeded(Encoder)
itransformer = _seeded(ITransformer)


def series() -> tuple:
    return (torch.randn(2, SEQ_LEN, VARIATES, generator=torch.Generator().manual_seed(1)),), {}


# -- Autoformer (Wu et al. 2021): series decomposition inside the layer ------------------------------------------


class MovingAvg(nn.Module):
    """The trend: both ends repeated (replicate padding), `AvgPool1d(kernel, stride=1)` over time."""

    def __init__(self, kernel_size: int = 3) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.avg = nn.AvgPool1d(kernel_size=kernel_size, stride=1, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        front = x[:, 0:1, :].repeat(1, (self.kernel_size - 1) // 2, 1)
        end = x[:, -1:, :].repeat(1, (self.kernel_size - 1) // 2, 1)
        x = torch.cat([front, x, end], dim=1)
        return self.avg(x.permute(0, 2, 1)).permute(0, 2, 1)


class SeriesDecomp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.moving_avg = MovingAvg()

    def forward(self, x: torch.Tensor) -> tuple:
        moving_mean = self.moving_avg(x)
        return x - moving_mean, moving_mean


class AutoformerLayer(nn.Module):
    """Autoformer's encoder layer (the ordinary attention in place of its auto-correlation, as learners swap it):
    x + attention(x) decomposed, the kernel-1 Conv1d feed-forward (no bias), the sum decomposed; the seasonal parts
    go on; no norms."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = AttentionLayer()
        self.conv1 = nn.Conv1d(D, 4 * D, kernel_size=1, bias=False)
        self.conv2 = nn.Conv1d(4 * D, D, kernel_size=1, bias=False)
        self.decomp1, self.decomp2 = SeriesDecomp(), SeriesDecomp()
        self.activation = F.relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(x, x, x)
        x, _ = self.decomp1(x)
        y = self.activation(self.conv1(x.transpose(-1, 1)))
        y = self.conv2(y).transpose(-1, 1)
        res, _ = self.decomp2(x + y)
        return res


autoformer_layer = _seeded(AutoformerLayer)


# -- PCT (Guo et al. 2021): per-point embedding, plain self-attention layers and offset-attention -----------------


class SALayer(nn.Module):
    """A plain SA layer written token-major (B, N, C), PCT's names: `q_conv` and `k_conv` one weight (PCT ties
    them), no bias; `v_conv`, `trans_conv`; post-norm with a ReLU feed-forward. `mistake` "wrong_scale": the scores
    divided by the head size."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.q_conv = nn.Linear(D, D, bias=False)
        self.k_conv = nn.Linear(D, D, bias=False)
        self.q_conv.weight = self.k_conv.weight
        self.v_conv, self.trans_conv = nn.Linear(D, D), nn.Linear(D, D)
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.ffn = nn.Sequential(nn.Linear(D, 2 * D), nn.ReLU(), nn.Linear(2 * D, D))
        self.scale = HD if mistake == "wrong_scale" else math.sqrt(HD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, _ = x.shape
        q = self.q_conv(x).view(B, N, H, HD).transpose(1, 2)
        k = self.k_conv(x).view(B, N, H, HD).transpose(1, 2)
        v = self.v_conv(x).view(B, N, H, HD).transpose(1, 2)
        energy = torch.softmax(q @ k.transpose(-1, -2) / self.scale, dim=-1)
        x_r = self.trans_conv((energy @ v).transpose(1, 2).reshape(B, N, D))
        x = self.norm1(x + x_r)
        return self.norm2(x + self.ffn(x))


class OffsetAttention(nn.Module):
    """PCT's SA_Layer as published, channel-first (B, C, N): one head, q and k one weight of C / 4 rows, the
    softmax over keys then each column divided by its sum over queries, x - x_r through `trans_conv`,
    `after_norm` (BatchNorm1d) and ReLU, added back: x + LBR(x - SA(x)). Taken and returned as (B, N, C)."""

    def __init__(self) -> None:
        super().__init__()
        self.q_conv = nn.Conv1d(D, D // 4, 1, bias=False)
        self.k_conv = nn.Conv1d(D, D // 4, 1, bias=False)
        self.q_conv.weight = self.k_conv.weight
        self.v_conv, self.trans_conv = nn.Conv1d(D, D, 1), nn.Conv1d(D, D, 1)
        self.after_norm, self.act = nn.BatchNorm1d(D), nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 1)
        x_q = self.q_conv(x).permute(0, 2, 1)
        x_k, x_v = self.k_conv(x), self.v_conv(x)
        attention = torch.softmax(torch.bmm(x_q, x_k), dim=-1)
        attention = attention / (1e-9 + attention.sum(dim=1, keepdim=True))
        x_r = torch.bmm(x_v, attention)
        x_r = self.act(self.after_norm(self.trans_conv(x - x_r)))
        return (x + x_r).permute(0, 2, 1)


class PointTransformer(nn.Module):
    """`sa1`, `sa2` in turn (attributes, not a list); `embed`: each point's xyz through a per-point MLP first (no
    positions), `forward(points)` on (B, N, 3)."""

    def __init__(self, embed: bool = False, mistake: str = "") -> None:
        super().__init__()
        self.embedding = nn.Sequential(nn.Linear(3, D), nn.ReLU(), nn.Linear(D, D)) if embed else None
        self.sa1, self.sa2 = SALayer(), SALayer(mistake)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        return self.sa2(self.sa1(x))


sa_layer = _seeded(SALayer)
offset_attention = _seeded(OffsetAttention)
point_transformer = _seeded(PointTransformer)


def points() -> tuple:
    return (torch.randn(2, POINTS, 3, generator=torch.Generator().manual_seed(1)),), {}


def point_features() -> tuple:
    return (torch.randn(2, POINTS, D, generator=torch.Generator().manual_seed(1)),), {}


# -- a chess transformer: 64 square tokens, a learned table of 64 rows, post-norm, a policy head --------------------


class SquareAttention(nn.Module):
    """One `qkv` Linear chunked, heads by `view` + `transpose`, SDPA (bidirectional). `mistake`
    "heads_without_transpose": (B, T, D) viewed straight as (B, H, T, hd) and merged back by a reshape."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.transpose = mistake != "heads_without_transpose"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if self.transpose:
            q, k, v = (t.view(B, T, H, HD).transpose(1, 2) for t in (q, k, v))
        else:
            q, k, v = (t.reshape(B, H, T, HD) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v)
        y = y.transpose(1, 2) if self.transpose else y
        return self.out(y.reshape(B, T, D))


class BoardLayer(nn.Module):
    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.attn, self.ln1 = SquareAttention(mistake), nn.LayerNorm(D)
        self.ff = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        self.ln2 = nn.LayerNorm(D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.ff(x))


class BoardEncoder(nn.Module):
    """`forward(board)` on (B, 64) piece ids: the piece table plus all 64 rows of the square table (added whole,
    as board code does: the board always has 64 squares), post-norm layers."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.piece_embedding = nn.Embedding(PIECES, D)
        self.square_embedding = nn.Parameter(0.2 * torch.randn(1, SQUARES, D))
        self.layers = nn.ModuleList([BoardLayer(), BoardLayer(mistake)])

    def forward(self, board: torch.Tensor) -> torch.Tensor:
        x = self.piece_embedding(board) + self.square_embedding
        for layer in self.layers:
            x = layer(x)
        return x


class ChessTransformer(nn.Module):
    """The encoder and a policy head: for each square, logits over the 64 target squares, flattened (B, 4096)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = BoardEncoder()
        self.policy_head = nn.Linear(D, MOVES)

    def forward(self, board: torch.Tensor) -> torch.Tensor:
        return self.policy_head(self.body(board)).flatten(1)


board_encoder = _seeded(BoardEncoder)
chess_transformer = _seeded(ChessTransformer)


def boards() -> tuple:
    return (torch.randint(0, PIECES, (2, SQUARES), generator=torch.Generator().manual_seed(1)),), {}


CASES = [
    ("f58_timesformer.space_block", block, "encoder_layer", {}, "pass"),
    (
        "f58_timesformer.time_stack.wrong_scale_second_block",
        lambda: time_stack("wrong_scale"),
        "encoder_stack",
        {},
        ("mistake", "attention.wrong_scale", "blocks.1.attn"),
    ),
    (
        "f58_timesformer.divided_block",
        divided_block,
        "encoder_layer",
        {"example": video_tokens()},
        ("no pair", "temporal_attn", ""),
    ),
    ("f58_vivit.space_transformer", transformer, "encoder_stack", {}, "pass"),
    (
        "f58_vivit.temporal_transformer.unbiased_variance_second_layer",
        lambda: transformer(unbiased_second=True),
        "encoder_stack",
        {},
        ("mistake", "layer_norm.unbiased_variance", "layers.1.0.norm"),
    ),
    ("f58_vivit", vivit, "encoder_stack", {"example": video_tokens()}, ("no pair", "", "space_token")),
    ("f58_itransformer.encoder", encoder, "encoder_stack", {}, "pass"),
    (
        "f58_itransformer.encoder.softmax_over_queries_second_layer",
        lambda: encoder(mistake="softmax_over_queries"),
        "encoder_stack",
        {},
        ("mistake", "attention.softmax_wrong_axis", "attn_layers.1.attention"),
    ),
    (
        "f58_itransformer",
        itransformer,
        "encoder_stack",
        {"example": series()},
        ("no pair", "enc_embedding.value_embedding", "8 -> 32"),
    ),
    (
        "f58_informer.encoder.distil",
        lambda: encoder(distil=True),
        "encoder_stack",
        {},
        ("no pair", "conv_layers.0.downConv", "kernel 3"),
    ),
    ("f58_autoformer.layer", autoformer_layer, "encoder_layer", {}, ("no pair", "decomp1.moving_avg", "")),
    ("f58_pct.sa_layer", sa_layer, "encoder_layer", {}, "pass"),
    ("f58_pct.sa_stack", point_transformer, "encoder_stack", {"example": point_features()}, "pass"),
    (
        "f58_pct.sa_stack.wrong_scale_sa2",
        lambda: point_transformer(mistake="wrong_scale"),
        "encoder_stack",
        {"example": point_features()},
        ("mistake", "attention.wrong_scale", "sa2"),
    ),
    (
        "f58_pct.embedded",
        lambda: point_transformer(embed=True),
        "encoder_stack",
        {"example": points()},
        ("no pair", "embedding.0", ""),
    ),
    ("f58_pct.offset_attention", offset_attention, "encoder_layer", {"example": point_features()}, ("no pair", "", "")),
    ("f58_chess.body", board_encoder, "encoder_model", {"example": boards()}, "pass"),
    (
        "f58_chess.body.heads_without_transpose_second_layer",
        lambda: board_encoder("heads_without_transpose"),
        "encoder_model",
        {"example": boards()},
        ("mistake", "attention.heads_without_transpose", "layers.1.attn"),
    ),
    ("f58_chess", chess_transformer, "encoder_model", {"example": boards()}, ("no pair", "policy_head", "32 -> 64")),
    ("f58_chess.body.no_example", board_encoder, "encoder_model", {}, ("could not judge", None, "example")),
]
