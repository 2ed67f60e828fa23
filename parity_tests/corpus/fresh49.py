"""Decoder-only LMs in the x-transformers style as learners copy it in 2025-26 (issue 46, round 49), in this
project's own words. The judge meets it here first (measured with the judge frozen).

- one `Decoder` class driven by keyword flags (`ff_glu`, `attn_qk_norm`, `attn_qk_norm_learned`,
  `attn_talking_heads`, `attn_gate_values`, `shift_tokens`, `gate_residual`, `kv_cat`), its layers a ModuleList of pairs
  `Residual(PreNorm(dim, Attention))`, `Residual(PreNorm(dim, FeedForward))`;
- einops `rearrange` for the heads; `heads * dim_head` (4 * 12 = 48) unequal to `dim` (32), the heads' output
  projected back by `to_out = nn.Sequential(nn.Linear(inner_dim, dim), nn.Dropout(p))`; `to_q` and a fused `to_kv`;
- an `AbsolutePositionalEmbedding` whose learned table is read times `dim ** -0.5`, expected "differs at pos_emb, the
  embeddings are multiplied by 0.1768 ... no pair" (changed from the writer's "pass", see below);
- an RMSNorm of `x / norm(x) * sqrt(dim) * g` with the norm clamped at 1e-8 (the root-mean-square norm at eps
  0, right);
- `ff_glu`: GEGLU of one fused projection chunked into value and gate, `value * gelu(gate)`;
- `attn_qk_norm`: cosine-similarity attention, queries and keys divided by their L2 norms and the scores times a
  temperature (fixed 10, or a learned scalar). Since l2norm(q) = rms(q) / sqrt(d), the scores equal
  rms(q) . rms(k) * t / d, which the reference's QK-norm (RMSNorm of each head's q and k, gains g_q and g_k, the
  scores over sqrt(d)) computes with g_q = g_k = sqrt(t / sqrt(d)) at eps 0. The writer expected "pass"; the
  maintainer decided "no pair" at the attention, naming F.normalize: the reference's QK-norm has per-feature
  learned gains and the config's eps, a temperature (fixed or a learned scalar) is nothing the reference states,
  and fresh51's Swin v2 cosine attention is said the same way;
- flags the reference has no pair for: talking heads (the heads' scores mixed by a learned H x H matrix before and
  after the softmax), `gate_values` (each head's output times sigmoid of a projection of x), token shift (half the
  features of each position taken from the position before), GRU-gated residuals (`nn.GRUCell` in place of the
  addition).
- mistakes, each in the second layer: the scores scaled by inner_dim ** -0.5 (wrong scale); the causal mask left
  off (not causal); the mask of `triu(0)` (hides the diagonal); the softmax over the queries' axis; GELU on the GEGLU
  value half.

Expected verdicts decided from the math before the judge ran; the rewrites (fused to_kv, rearrange, the clamped
L2 RMSNorm, the cosine-sim attention) checked in float64 against a plain attention and RMSNorm of the same weights
(to 1e-12, the RMSNorm at eps 0, the cosine attention against QK-RMSNorm with the gains above).

The first case keeps x-transformers' scaled position table, the second its L2 RMSNorm; the others read the
table unscaled and norm by the mean square (x * rsqrt(mean(x^2) + 1e-8) * g), so that what lies behind is measured.

First met: 2 of 16 right (talking heads, gate_values). Wrong:

- every model of the plain attention (the decoders, the five mistakes, token shift), f49_decoder_scaled_positions
  included: attention.q_k_swapped at attn_layers.layers.0.0.fn.fn, the first layer (the queries, 48 rows of to_q,
  narrower than the fused to_kv's 96 read as the keys; check/units.py's _queries_first looks the likely source).
  Found before it by hand: the scaled table alone answered "differs at pos_emb: the embeddings are multiplied by
  0.1768, where the reference scales them by sqrt(D) or not at all, ... no pair" (a learned table times a constant
  is a learned table).
- f49_decoder_l2_norms: "differs at attn_layers.layers.0.0.fn: the layer has no norm with a learned scale ... no
  pair" (x / norm(x) * sqrt(d) * g not read as an RMSNorm).
- the three cosine-sim models: "differs at attn_layers.layers.0.0.fn.fn: F.normalize(x) scales each vector to unit
  length (L2), without a weight, ... no pair" (the QK-norm with gains sqrt(t / sqrt(d)) not tried).
- f49_gru_residual: "could not judge: found 5 norms in the module, the reference 'transformer_lm' has 9; pass
  mapping=" (expected: no pair at the GRU gate).

Fixed since: 17 of 17 right (the kv_cat case added). check/units.py's _queries_first reads a fused
projection's width for each role from the rows that role reads of it (to_kv's keys: half its rows), so q and k are
no longer exchanged; a score divisor of sqrt(n_heads * d_head) is a catalogued attention.wrong_scale where the heads'
width is not d_model; x / norm(x).clamp(min=e) * g (F.normalize's too) is an RMSNorm, its eps the floor squared
(mapping._floor); a pad of (k, -k) on one axis is said as a token shift (unsupported._token_shift), torch's
recurrent cells as an RNN's (unsupported._rnn, which answers before the norm count stops the judge); a split part of
a cat is read back to the cat's input (dataflow._cat_input: separate to_k and to_v joined then chunked, the added
case f49_decoder_kv_cat, checked in float64 against the fused to_kv of the same rows: equal). Expectations changed
from the writer's: the scaled position table is a no pair (as Granite's and MiniCPM's scaled token tables in
fresh23: a table times a number the reference does not state is not its table; the gradient the user's table gets
is c times the reference's), the three cosine-sim models a no pair naming F.normalize (the maintainer's decision,
above), GELU on the GEGLU value said at the feed-forward's `net` (the Sequential holding the block's projections,
where the judge places a feed-forward block's mistakes), the GRU gate said at the GRUCell
(`attn_layers.layers.0.0.gru`, where it runs).

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

DIM, HEADS, DIM_HEAD, V, T_MAX, MULT = 32, 4, 12, 40, 16, 2
LM = "transformer_lm"


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases moved off their 1s and 0s, so that a trained model's values are checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


class RMSNorm(nn.Module):
    """x / norm(x) * sqrt(dim) * g, the norm clamped at eps; `mean_square` (class-wide): x * rsqrt(mean(x^2) + eps) * g
    instead (eps 1e-8)."""

    mean_square = True

    def __init__(self, dim: int, eps: float = 1e-8) -> None:
        super().__init__()
        self.scale, self.eps = dim**0.5, eps
        self.g = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mean_square:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.g
        return x / x.norm(dim=-1, keepdim=True).clamp(min=self.eps) * self.scale * self.g


class AbsolutePositionalEmbedding(nn.Module):
    def __init__(self, dim: int, max_seq_len: int, scaled: bool = True) -> None:
        super().__init__()
        self.scale = dim**-0.5 if scaled else 1.0
        self.emb = nn.Embedding(max_seq_len, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.emb(torch.arange(x.shape[1], device=x.device)) * self.scale


class PreNorm(nn.Module):
    def __init__(self, dim: int, fn: nn.Module) -> None:
        super().__init__()
        self.norm, self.fn = RMSNorm(dim), fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self.norm(x))


class Residual(nn.Module):
    def __init__(self, fn: nn.Module) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x) + x


class GRUGating(nn.Module):
    """The residual addition replaced by a GRU cell: the branch's output the input, the stream the state."""

    def __init__(self, dim: int, fn: nn.Module) -> None:
        super().__init__()
        self.fn, self.gru = fn, nn.GRUCell(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fn(x)
        return self.gru(y.reshape(-1, x.shape[-1]), x.reshape(-1, x.shape[-1])).reshape(x.shape)


class ShiftTokens(nn.Module):
    """Half the features of each position taken from the position before (zeros at the first)."""

    def __init__(self, fn: nn.Module) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=-1)
        a = F.pad(a, (0, 0, 1, -1))
        return self.fn(torch.cat((a, b), dim=-1))


class GEGLU(nn.Module):
    def __init__(self, dim_in: int, dim_out: int, on_value: bool = False) -> None:
        super().__init__()
        self.proj, self.on_value = nn.Linear(dim_in, dim_out * 2), on_value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, gate = self.proj(x).chunk(2, dim=-1)
        return F.gelu(x) * gate if self.on_value else x * F.gelu(gate)


class FeedForward(nn.Module):
    def __init__(self, dim: int, glu: bool = False, mistake: str = "", dropout: float = 0.1) -> None:
        super().__init__()
        inner = dim * MULT
        plain = nn.Sequential(nn.Linear(dim, inner), nn.GELU())
        project_in = GEGLU(dim, inner, mistake == "gelu_on_value") if glu else plain
        self.net = nn.Sequential(project_in, nn.Dropout(dropout), nn.Linear(inner, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Attention(nn.Module):
    """Causal multi-head attention of to_q and a fused to_kv, heads * dim_head != dim; `mistake` one of
    "inner_scale", "no_mask", "triu0", "softmax_queries"."""

    def __init__(self, dim: int, flags: dict, mistake: str = "", dropout: float = 0.1) -> None:
        super().__init__()
        inner = HEADS * DIM_HEAD
        self.heads, self.mistake = HEADS, mistake
        self.scale = (inner if mistake == "inner_scale" else DIM_HEAD) ** -0.5
        self.qk_norm = flags.get("attn_qk_norm", False)
        if self.qk_norm:
            t = torch.tensor(10.0)
            self.temperature = nn.Parameter(t.log()) if flags.get("attn_qk_norm_learned") else None
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.kv_cat = flags.get("kv_cat", False)  # to_k and to_v apart, their outputs joined then chunked
        if self.kv_cat:
            self.to_k, self.to_v = nn.Linear(dim, inner, bias=False), nn.Linear(dim, inner, bias=False)
        else:
            self.to_kv = nn.Linear(dim, inner * 2, bias=False)
        self.talking_heads = flags.get("attn_talking_heads", False)
        if self.talking_heads:
            self.pre_softmax_talking_heads = nn.Conv2d(HEADS, HEADS, 1, bias=False)
            self.post_softmax_talking_heads = nn.Conv2d(HEADS, HEADS, 1, bias=False)
        self.to_v_gate = nn.Linear(dim, inner) if flags.get("attn_gate_values") else None
        self.dropout = nn.Dropout(dropout)
        self.to_out = nn.Sequential(nn.Linear(inner, dim), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.to_q(x)
        kv = torch.cat((self.to_k(x), self.to_v(x)), dim=-1) if self.kv_cat else self.to_kv(x)
        k, v = kv.chunk(2, dim=-1)
        q, k, v = (rearrange(t, "b n (h d) -> b h n d", h=self.heads) for t in (q, k, v))
        if self.qk_norm:
            q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
            scale = self.temperature.exp() if self.temperature is not None else 10.0
        else:
            scale = self.scale
        dots = torch.einsum("b h i d, b h j d -> b h i j", q, k) * scale
        if self.talking_heads:
            dots = self.pre_softmax_talking_heads(dots)
        i, j = dots.shape[-2:]
        if self.mistake != "no_mask":
            mask = torch.ones(i, j, dtype=torch.bool, device=x.device).triu(0 if self.mistake == "triu0" else j - i + 1)
            dots = dots.masked_fill(mask, -torch.finfo(dots.dtype).max)
        attn = dots.softmax(dim=-2 if self.mistake == "softmax_queries" else -1)
        attn = self.dropout(attn)
        if self.talking_heads:
            attn = self.post_softmax_talking_heads(attn)
        out = torch.einsum("b h i j, b h j d -> b h i d", attn, v)
        out = rearrange(out, "b h n d -> b n (h d)")
        if self.to_v_gate is not None:
            out = out * self.to_v_gate(x).sigmoid()
        return self.to_out(out)


class Decoder(nn.Module):
    """The layers of one flag set; `mistake` ("" or an Attention / FeedForward mistake) put in the second layer."""

    def __init__(self, dim: int, depth: int, mistake: str = "", **flags: bool) -> None:
        super().__init__()
        wrap = (lambda fn: GRUGating(dim, fn)) if flags.get("gate_residual") else Residual
        shift = ShiftTokens if flags.get("shift_tokens") else (lambda fn: fn)
        self.layers = nn.ModuleList()
        for n in range(depth):
            m = mistake if n == 1 else ""
            attn = Attention(dim, flags, m)
            ff = FeedForward(dim, flags.get("ff_glu", False), m)
            self.layers.append(nn.ModuleList([wrap(PreNorm(dim, shift(attn))), wrap(PreNorm(dim, shift(ff)))]))
        self.norm = RMSNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for attn, ff in self.layers:
            x = ff(attn(x))
        return self.norm(x)


class TransformerWrapper(nn.Module):
    def __init__(
        self, num_tokens: int, max_seq_len: int, attn_layers: Decoder, scaled: bool, emb_dropout: float = 0.1
    ) -> None:
        super().__init__()
        self.token_emb = nn.Embedding(num_tokens, DIM)
        self.pos_emb = AbsolutePositionalEmbedding(DIM, max_seq_len, scaled)
        self.emb_dropout = nn.Dropout(emb_dropout)
        self.attn_layers = attn_layers
        self.to_logits = nn.Linear(DIM, num_tokens)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.token_emb(x) + self.pos_emb(x)
        return self.to_logits(self.attn_layers(self.emb_dropout(x)))


def lm(mistake: str = "", scaled: bool = False, l2: bool = False, **flags: bool) -> nn.Module:
    """The wrapper of a two-layer Decoder; `scaled`: the position table read times dim ** -0.5; `l2`: the norms
    of x / norm(x) * sqrt(dim) * g (else of the mean square)."""
    torch.manual_seed(0)
    RMSNorm.mean_square = not l2
    return _jitter(TransformerWrapper(V, T_MAX, Decoder(DIM, 2, mistake, **flags), scaled))


ATTN1 = "attn_layers.layers.1.0.fn.fn"
FF1 = "attn_layers.layers.1.1.fn.fn"
ATTN0 = "attn_layers.layers.0.0.fn.fn"

CASES = [
    ("f49_decoder_scaled_positions", lambda: lm(scaled=True), LM, {}, ("no pair", "pos_emb", "multiplied by 0.1768")),
    ("f49_decoder_l2_norms", lambda: lm(l2=True), LM, {}, "pass"),
    ("f49_decoder", lm, LM, {}, "pass"),
    ("f49_decoder_glu", lambda: lm(ff_glu=True), LM, {}, "pass"),
    ("f49_decoder_cosine_sim", lambda: lm(attn_qk_norm=True), LM, {}, ("no pair", ATTN0, "normalize")),
    (
        "f49_decoder_cosine_sim_learned",
        lambda: lm(attn_qk_norm=True, attn_qk_norm_learned=True),
        LM,
        {},
        ("no pair", ATTN0, "normalize"),
    ),
    ("f49_decoder_glu_cosine_sim", lambda: lm(ff_glu=True, attn_qk_norm=True), LM, {}, ("no pair", ATTN0, "normalize")),
    (
        "f49_decoder.scale_by_inner_dim_second_layer",
        lambda: lm("inner_scale"),
        LM,
        {},
        ("mistake", "attention.wrong_scale", ATTN1),
    ),
    (
        "f49_decoder.mask_left_off_second_layer",
        lambda: lm("no_mask"),
        LM,
        {},
        ("mistake", "attention.not_causal", ATTN1),
    ),
    (
        "f49_decoder.triu_0_second_layer",
        lambda: lm("triu0"),
        LM,
        {},
        ("mistake", "attention.causal_hides_diagonal", ATTN1),
    ),
    (
        "f49_decoder.softmax_over_queries_second_layer",
        lambda: lm("softmax_queries"),
        LM,
        {},
        ("mistake", "attention.softmax_wrong_axis", ATTN1),
    ),
    (
        "f49_decoder_glu.gelu_on_value_second_layer",
        lambda: lm("gelu_on_value", ff_glu=True),
        LM,
        {},
        ("mistake", "gated_feed_forward.activation_on_up", FF1 + ".net"),
    ),
    ("f49_talking_heads", lambda: lm(attn_talking_heads=True), LM, {}, ("no pair", ATTN0, "conv")),
    ("f49_gate_values", lambda: lm(attn_gate_values=True), LM, {}, ("no pair", ATTN0, "sigmoid")),
    ("f49_shift_tokens", lambda: lm(shift_tokens=True), LM, {}, ("no pair", "attn_layers.layers.0.0.fn.fn", "pad")),
    ("f49_decoder_kv_cat", lambda: lm(kv_cat=True), LM, {}, "pass"),
    ("f49_gru_residual", lambda: lm(gate_residual=True), LM, {}, ("no pair", "attn_layers.layers.0.0.gru", "gru_cell")),
]
