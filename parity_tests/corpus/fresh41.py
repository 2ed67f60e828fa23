"""Long-context and sparse attention as 2025-26 learners and research repositories write it by hand in small LMs
(issue 46, round 41), in this project's own words. The judge meets them here first (measured with the judge frozen).

- Mistral's sliding window written as a band mask from two triangles (`ones.tril() & ones.triu(-(W - 1))`, W = 4,
  keys i - 3 .. i), in both layers; a Gemma-2 / GPT-OSS pair of a local (band) layer and a global (causal) one, in
  both orders;
- Longformer's "sliding chunks": queries in chunks of W, each reading its own chunk's keys and the previous
  chunk's (all a window of W can reach), the sequence padded to whole chunks, the band applied inside: the window
  computed chunk by chunk;
- StreamingLLM's attention sinks as a mask: the first keys always visible beside a causal window (1 sink and a
  window of 3; and 4 sinks over a window of 4, as the paper's defaults shrunk);
- the Sparse Transformer's strided pattern (the last 2 keys and every third one behind), Longformer's dilated
  window (every second key, 4 of them);
- block-sparse local attention by reshaping into blocks of 3 (each query reads the causal keys of its own block),
  and the same code at blocks of T_MAX (every sequence the model takes in one block);
- ALiBi by hand: no position table, a (H, 1, 1) buffer of slopes 2^(-8h/H) times i - j subtracted from the scores;
  with 4 heads (the paper's slopes), and with 6 heads of 8 features at the same formula;
- a Longformer-style encoder (BERT's post-norm layers): a band |i - j| <= 2 and a global first token (it reads
  every key and every query reads it), the padding hidden; and the same without global tokens;
- mistakes put into them: the band written |i - j| < W, its causal half forgotten (second layer); the band one key
  too wide (`i - j <= W`, second layer); the local layer's band written 0 < i - j <= W (it hides the diagonal, first
  layer); the global layer divided by sqrt(d_model) (second layer); the band's causal half written j <= i + 1
  (second layer of the global-then-local pair; and inside the sliding chunks); ALiBi's bias added with the wrong
  sign (second layer).

Expected verdicts, decided from the math before the judge ran:

- the band in both layers is the reference's sliding_window = 4; the local/global pairs its layer_types; the
  sliding chunks equal the band (measured in float64 at T = 1 .. 16: under 3e-16); blocks of T_MAX equal plain
  causal attention (under 2e-16); ALiBi at 4 heads is the reference's positional "alibi" (the hand-written bias
  equals SDPA given the same float mask to 3e-16); the band-only encoder is the reference's encoder band of
  |i - j| <= window // 2 (layer_types all sliding): each a pass;
- the band without its causal half sees the future inside the window: attention.not_causal is the catalogue's
  name for a self-attention that sees the future (its variant shows every future key, this one only the next 3, the
  nearest catalogued answer and the one a user needs); the hidden diagonal and the next key shown inside a window
  are the catalogue's causal_hides_diagonal and causal_shows_next (the catalogue's variants keep the site's window);
- the window one key wider in one layer: the reference has one window for every windowed layer, no pair, said
  at layers.1.attn;
- sinks, strided and dilated patterns, local blocks and global tokens: masks the reference has none of, said at
  the first attention (layers.0.attn); the 4 sinks over a window of 4 hide a key only from position 8 on (at 8
  positions every causal key is visible), which the model takes (T_MAX 16): still no pair, though only longer
  probes can see it;
- ALiBi with the sign flipped (far keys favoured): no catalogued id, no pair at layers.1.attn; ALiBi's formula
  2^(-8h/H) at 6 heads is not the paper's rule for a head count that is no power of two (the reference's: the 4
  slopes of 4 heads, then every other slope of 8), so no pair at layers.0.attn.

First met: 14 of 21 right. Wrong:

- f41_mistral_band.symmetric_second_layer: "unexplained: layers.1.attn ... positions 0, 1, 2, 3, 4 differ ...; not
  expressible by the config and no catalogue variant reproduces it": the place right, neither an id nor an op (the
  not_causal variant inside a window opens every future key, not a symmetric band);
- f41_sliding_chunks, its .shows_next_second_layer, f41_local_blocks and its .one_block: "could not judge: n_heads
  must be a multiple of n_kv_heads ...: got n_heads=2 (1 for one block), n_kv_heads=4": the head count read from
  the query's axis before its positions (check/dataflow.py, the attention's `heads`), which in a (B, H, chunks,
  W, Dh) layout is the chunk axis;
- f41_sink_window.wide: a pass: the judge's probes (6 positions) never reach the 8th, where the first key would be
  hidden by the window and kept by the sinks;
- f41_longformer: "unexplained: layers.0.attn ... positions 1, 2, 4, 5 differ": the place right, the global token
  not named (neither an op nor the words).

Fixed since: where the positions are cut into chunks or blocks (a query of more than 4 axes), the heads are read
from the view that splits the query's features into (H, Dh), and the keys each query sees are read in sequence
positions (each row of the scores' operands found by value among the rows of that view), so the sliding chunks
are the band they compute and the local blocks a block-diagonal mask; not_causal inside a window is also tried as
the band mirrored (|i - j| < W); one rule says the masks the reference lacks: a window, a band or a block of its own
besides sink keys or global positions (Longformer's global token named), later keys besides a causal mask, else
each query's keys. The chunked band written j <= i + 1 is now expected as no pair, not causal_shows_next: a chunk's
last query has no next key among its chunk's keys, so the mask shows the next key to 3 queries of 4 and no
catalogued variant (every query sees the next) reproduces it; the judge lists the later keys each query reads.

Also fixed since: f41_sink_window.wide: a check that passes at the probe's length is run once more, outputs only, at 24
positions (3 x a config's sliding window where more; never past its position table, here 16); where the outputs part
there, the model is recorded and judged at that length (check/judge.py, longer_sizes), and the mask's finder reads
the 4 sinks beside the window of 4.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
from torch import nn

D, H, V, T_MAX = 32, 4, 26, 16
HD = D // H
WINDOW = 4


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases moved off their 1s and 0s, so that a trained model's values are checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def distance(T: int, device=None) -> torch.Tensor:
    """(T, T) of i - j: how far key j lies behind query i."""
    pos = torch.arange(T, device=device)
    return pos[:, None] - pos[None, :]


def attend(q, k, v, keep, scale, bias=None):
    """The softmax written out: scores times scale, plus a bias, -inf where keep is False, exp over the row sum."""
    s = (q @ k.transpose(-2, -1)) * scale
    if bias is not None:
        s = s + bias
    s = s.masked_fill(~keep, float("-inf"))
    s = s - s.amax(-1, keepdim=True)
    p = s.exp()
    return (p / p.sum(-1, keepdim=True)) @ v


class Attention(nn.Module):
    """Heads of HD features split from one fused qkv Linear; subclasses say which keys each query may see (`keep`)."""

    def __init__(self, n_head: int = H) -> None:
        super().__init__()
        self.n_head, self.width = n_head, n_head * HD
        self.qkv = nn.Linear(D, 3 * self.width)
        self.proj = nn.Linear(self.width, D)

    def heads(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).split(self.width, dim=-1)
        return [t.view(B, T, self.n_head, HD).transpose(1, 2) for t in (q, k, v)]

    def merge(self, y):
        B, _, T, _ = y.shape
        return self.proj(y.transpose(1, 2).reshape(B, T, self.width))

    def scale(self) -> float:
        return 1.0 / math.sqrt(HD)

    def keep(self, T: int, device) -> torch.Tensor:
        return distance(T, device) >= 0

    def forward(self, x):
        q, k, v = self.heads(x)
        return self.merge(attend(q, k, v, self.keep(x.shape[1], x.device), self.scale()))


# -- Mistral's window as a band mask: key j visible when 0 <= i - j < window --------------------------------------


class Band(Attention):
    """The band built from two triangles: tril keeps j <= i, triu(-(W - 1)) keeps j >= i - W + 1."""

    window = WINDOW

    def keep(self, T, device):
        ones = torch.ones(T, T, dtype=torch.bool, device=device)
        return ones.tril() & ones.triu(-(self.window - 1))


class SymmetricBand(Band):
    """The mistake: the band written |i - j| < W, the causal half forgotten (each query sees 3 future keys)."""

    def keep(self, T, device):
        return distance(T, device).abs() < self.window


class WiderBand(Band):
    """The mistake: `i - j <= window` (5 keys, not 4): the band one key too wide."""

    window = WINDOW + 1


class BandShowingNext(Band):
    """The mistake: the band's causal half written j <= i + 1 (each query also reads the next key)."""

    def keep(self, T, device):
        d = distance(T, device)
        return (d >= -1) & (d < self.window)


class Global(Attention):
    """A full causal layer (Gemma 2's and GPT-OSS's global layers)."""


class GlobalByModelWidth(Global):
    """The mistake: the global layer's scores divided by sqrt(d_model) rather than sqrt(d_head)."""

    def scale(self):
        return 1.0 / math.sqrt(D)


class BandHidingDiagonal(Band):
    """The mistake: the local layer's band written 0 < i - j <= W (each query hides itself, sees W keys before)."""

    def keep(self, T, device):
        d = distance(T, device)
        return (d > 0) & (d <= self.window)


# -- Longformer's "sliding chunks": the window computed chunk by chunk (equal to the band) -------------------------


class SlidingChunks(Attention):
    """Queries in chunks of W; each chunk reads its own keys and the previous chunk's (the only ones a window of W
    can reach), masked to the band inside; the sequence padded to a whole number of chunks and cut back."""

    ahead = 0  # the mistake's knob: keys up to i + ahead visible

    def forward(self, x):
        q, k, v = self.heads(x)
        B, Hh, T, Dh = q.shape
        W = WINDOW
        n = -(-T // W)
        pad = n * W - T
        q, k, v = (nn.functional.pad(t, (0, 0, W, pad)) for t in (q, k, v))  # W zero rows before: chunk -1
        q = q[:, :, W:].reshape(B, Hh, n, W, Dh)
        kk = torch.stack([k[:, :, c * W : c * W + 2 * W] for c in range(n)], dim=2)  # (B, H, n, 2W, Dh)
        vv = torch.stack([v[:, :, c * W : c * W + 2 * W] for c in range(n)], dim=2)
        i = torch.arange(W, device=x.device)[:, None] + W  # a query's place among its chunk's 2W keys
        j = torch.arange(2 * W, device=x.device)[None, :]
        chunk = torch.arange(n, device=x.device)[:, None, None]
        keep = (j <= i + self.ahead) & (i - j < W) & (chunk * W + j - W >= 0)  # no key before position 0
        keep = keep & (chunk * W + j - W < T)  # nor the padding after T
        y = attend(q, kk, vv, keep, self.scale())
        return self.merge(y.reshape(B, Hh, n * W, Dh)[:, :, :T])


class SlidingChunksShowingNext(SlidingChunks):
    """The mistake: the chunk's band written j <= i + 1: each query also reads the next key."""

    ahead = 1


# -- StreamingLLM's sinks, a strided pattern, local blocks by reshaping: masks the reference lacks -----------------


class SinkWindow(Band):
    """The first `sinks` keys always visible (attention sinks as tokens), beside a causal window (3 keys)."""

    sinks, window = 1, 3

    def keep(self, T, device):
        sink = torch.arange(T, device=device)[None, :] < self.sinks
        return super().keep(T, device) | (sink & (distance(T, device) >= 0))


class WideSinkWindow(SinkWindow):
    """StreamingLLM's 4 sinks over a window of 4: up to 8 positions, every causal key visible."""

    sinks, window = 4, 4


class Strided(Attention):
    """The Sparse Transformer's strided pattern: the last 2 keys, and every key a multiple of 3 behind."""

    def keep(self, T, device):
        d = distance(T, device)
        return (d >= 0) & ((d < 2) | (d % 3 == 0))


class Dilated(Attention):
    """Longformer's dilated window: W keys, every second one (i, i - 2, i - 4, i - 6)."""

    def keep(self, T, device):
        d = distance(T, device)
        return (d >= 0) & (d % 2 == 0) & (d < 2 * WINDOW)


class LocalBlocks(Attention):
    """Block-sparse by reshaping: the sequence cut into blocks of `block`, each query reads the causal keys of its own
    block only (the blocks padded to a whole number and the padding dropped)."""

    block = 3

    def forward(self, x):
        q, k, v = self.heads(x)
        B, Hh, T, Dh = q.shape
        c = self.block
        n = -(-T // c)
        q, k, v = (nn.functional.pad(t, (0, 0, 0, n * c - T)).reshape(B, Hh, n, c, Dh) for t in (q, k, v))
        y = attend(q, k, v, distance(c, x.device) >= 0, self.scale())
        return self.merge(y.reshape(B, Hh, n * c, Dh)[:, :, :T])


class OneBlock(LocalBlocks):
    """Blocks of T_MAX: every sequence the model takes sits in one block (plain causal attention)."""

    block = T_MAX


# -- ALiBi by hand: -m_h (i - j) per head, no position table -------------------------------------------------------


def geometric_slopes(n_head: int) -> torch.Tensor:
    """2^(-8 h / H) for h = 1 .. H: the paper's rule where H is a power of two (and a learner's for any H)."""
    return torch.tensor([2.0 ** (-8.0 * h / n_head) for h in range(1, n_head + 1)])


class ALiBi(Attention):
    """Causal attention plus ALiBi's bias, the slopes a buffer of (H, 1, 1) times the distance."""

    sign = -1.0

    def __init__(self, n_head: int = H) -> None:
        super().__init__(n_head)
        self.register_buffer("slopes", geometric_slopes(n_head)[:, None, None], persistent=False)

    def forward(self, x):
        q, k, v = self.heads(x)
        T = x.shape[1]
        d = distance(T, x.device)
        bias = self.sign * self.slopes.to(x.dtype) * d.to(x.dtype)
        return self.merge(attend(q, k, v, d >= 0, self.scale(), bias))


class ALiBiWrongSign(ALiBi):
    """The mistake: + m_h (i - j): the far keys favoured, not penalised."""

    sign = 1.0


# -- the LM around them (GPT-2's block: pre-LayerNorm, GELU MLP) ----------------------------------------------------


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(D, 4 * D)
        self.act = nn.GELU()
        self.out = nn.Linear(4 * D, D)

    def forward(self, x):
        return self.out(self.act(self.fc(x)))


class Layer(nn.Module):
    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(D)
        self.attn = attn
        self.ln2 = nn.LayerNorm(D)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class LM(nn.Module):
    """Token table, a learned position table (none where the attention is ALiBi), the layers, a final norm, a head."""

    def __init__(self, attentions, positions: bool = True) -> None:
        super().__init__()
        self.tok = nn.Embedding(V, D)
        self.pos = nn.Embedding(T_MAX, D) if positions else None
        self.layers = nn.ModuleList(Layer(a) for a in attentions)
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, idx):
        T = idx.shape[1]
        assert T <= T_MAX
        x = self.tok(idx)
        if self.pos is not None:
            x = x + self.pos(torch.arange(T, device=idx.device))
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def lm(first=Band, second=Band, positions: bool = True, **kw) -> LM:
    torch.manual_seed(0)
    return _jitter(LM([first(**kw), second(**kw)], positions))


# -- a Longformer-style encoder: a band |i - j| <= 2 and global tokens ---------------------------------------------


class Longformer(Attention):
    """A bidirectional band |i - j| <= W // 2; the first `n_global` positions attend to every key and every query
    attends to them; padding hidden from every query."""

    n_global = 1

    def forward(self, x, attention_mask):
        q, k, v = self.heads(x)
        T = x.shape[1]
        pos = torch.arange(T, device=x.device)
        keep = distance(T, x.device).abs() <= WINDOW // 2
        is_global = pos < self.n_global
        keep = keep | is_global[:, None] | is_global[None, :]
        keep = keep & attention_mask[:, None, None, :].bool()
        return self.merge(attend(q, k, v, keep, self.scale()))


class BandOnly(Longformer):
    n_global = 0


class EncoderLayer(nn.Module):
    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        self.attn = attn
        self.ln1 = nn.LayerNorm(D)
        self.mlp = MLP()
        self.ln2 = nn.LayerNorm(D)

    def forward(self, x, attention_mask):
        x = self.ln1(x + self.attn(x, attention_mask))
        return self.ln2(x + self.mlp(x))


class Encoder(nn.Module):
    """BERT's post-norm encoder: word and position tables, an embedding LayerNorm, the layers."""

    def __init__(self, attention) -> None:
        super().__init__()
        self.word = nn.Embedding(V, D)
        self.pos = nn.Embedding(T_MAX, D)
        self.ln = nn.LayerNorm(D)
        self.layers = nn.ModuleList(EncoderLayer(attention()) for _ in range(2))

    def forward(self, input_ids, attention_mask=None):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        T = input_ids.shape[1]
        x = self.ln(self.word(input_ids) + self.pos(torch.arange(T, device=input_ids.device)))
        for layer in self.layers:
            x = layer(x, attention_mask)
        return x


def encoder(attention=Longformer) -> Encoder:
    torch.manual_seed(0)
    return _jitter(Encoder(attention))


_LM = "transformer_lm"

CASES = [
    ("f41_mistral_band", lambda: lm(), _LM, {}, "pass"),
    (
        "f41_mistral_band.symmetric_second_layer",
        lambda: lm(second=SymmetricBand),
        _LM,
        {},
        ("mistake", "attention.not_causal", "layers.1.attn"),
    ),
    (
        "f41_mistral_band.window_one_wider_second_layer",
        lambda: lm(second=WiderBand),
        _LM,
        {},
        ("no pair", "layers.1.attn", "window"),
    ),
    ("f41_local_global", lambda: lm(Band, Global), _LM, {}, "pass"),
    (
        "f41_local_global.diagonal_hidden_in_window_first_layer",
        lambda: lm(BandHidingDiagonal, Global),
        _LM,
        {},
        ("mistake", "attention.causal_hides_diagonal", "layers.0.attn"),
    ),
    (
        "f41_local_global.global_scaled_by_d_model_second_layer",
        lambda: lm(Band, GlobalByModelWidth),
        _LM,
        {},
        ("mistake", "attention.wrong_scale", "layers.1.attn"),
    ),
    ("f41_global_local", lambda: lm(Global, Band), _LM, {}, "pass"),
    (
        "f41_global_local.band_shows_next_second_layer",
        lambda: lm(Global, BandShowingNext),
        _LM,
        {},
        ("mistake", "attention.causal_shows_next", "layers.1.attn"),
    ),
    ("f41_sliding_chunks", lambda: lm(SlidingChunks, SlidingChunks), _LM, {}, "pass"),
    (
        "f41_sliding_chunks.shows_next_second_layer",
        lambda: lm(SlidingChunks, SlidingChunksShowingNext),
        _LM,
        {},
        ("no pair", "layers.1.attn", "later keys"),
    ),
    ("f41_sink_window", lambda: lm(SinkWindow, SinkWindow), _LM, {}, ("no pair", "layers.0.attn", "sink")),
    (
        "f41_sink_window.wide",
        lambda: lm(WideSinkWindow, WideSinkWindow),
        _LM,
        {},
        ("no pair", "layers.0.attn", "sink"),
    ),
    ("f41_strided", lambda: lm(Strided, Strided), _LM, {}, ("no pair", "layers.0.attn", "mask")),
    ("f41_dilated", lambda: lm(Dilated, Dilated), _LM, {}, ("no pair", "layers.0.attn", "mask")),
    ("f41_local_blocks", lambda: lm(LocalBlocks, LocalBlocks), _LM, {}, ("no pair", "layers.0.attn", "block")),
    ("f41_local_blocks.one_block", lambda: lm(OneBlock, OneBlock), _LM, {}, "pass"),
    ("f41_alibi_hand", lambda: lm(ALiBi, ALiBi, positions=False), _LM, {}, "pass"),
    (
        "f41_alibi_hand.sign_flipped_second_layer",
        lambda: lm(ALiBi, ALiBiWrongSign, positions=False),
        _LM,
        {},
        ("no pair", "layers.1.attn", "ALiBi"),
    ),
    (
        "f41_alibi_hand.six_heads_geometric",
        lambda: lm(ALiBi, ALiBi, positions=False, n_head=6),
        _LM,
        {},
        ("no pair", "layers.0.attn", "ALiBi"),
    ),
    ("f41_longformer", lambda: encoder(), "encoder_model", {}, ("no pair", "layers.0.attn", "global")),
    ("f41_longformer.band_only", lambda: encoder(BandOnly), "encoder_model", {}, "pass"),
]
