"""Efficient-attention approximations and token mixers as 2025-26 learners write them by hand from the papers, in
small LMs and encoders (issue 46, round 47), in this project's own words. The judge meets them here first (measured
with the judge frozen; this corpus is not fixed afterwards). New beside fresh31 (linear attention of elu + 1,
flash-style tiles) and fresh7 (query chunks, a log-sum-exp merge), whose styles are not repeated.

- a post-norm BERT-style encoder (word and position tables, an embedding LayerNorm, two layers of a mixer and a GELU
  MLP, ``forward(input_ids, attention_mask=None)``) whose mixer is one of: the hand-written softmax attention;
  Linformer (keys and values projected along the sequence by learned ``proj_k`` and ``proj_v`` of T_MAX x 4
  positions, sliced to the sequence's length, padding zeroed first); Performer's FAVOR+ (a fixed Gaussian
  ``projection_matrix`` buffer of 16 features, positive features ``exp(w x - |x|^2 / 2) / sqrt(m)``); cosFormer
  (ReLU features re-weighted by ``cos`` and ``sin`` of ``pi i / 2 T``); ReLU-squared attention divided by the
  sequence's length; Nystromformer (4 landmarks, segment means, ``torch.linalg.pinv``); a dense Synthesizer (a
  learned ``synthetic_logits`` table of H x T_MAX x T_MAX, sliced, its softmax reading the values); FNet (the real
  part of ``torch.fft.fft2`` over tokens and features); gMLP's spatial gating unit (a ``spatial_weight`` of T_MAX x
  T_MAX over the positions, after a LayerNorm of the gate half);
- a pre-norm GPT (learned positions, untied head) whose attention is sigmoid attention (``sigmoid(s - log n)``
  under the causal mask, n the sequence's length, no softmax), or the same module with ``exp`` in sigmoid's place
  normalised by the row's sum;
- a three-layer hybrid GPT whose middle layer alone is ReLU attention divided by n, the others ordinary softmax.

Expected verdicts decided from the math before the judge ran:

- the softmax encoder and the softmax GPT: the reference's models, a pass;
- each efficient mixer is math the reference has no pair for, said where it first runs (the first layer's mixer,
  not the embedding), in words naming the user's op: ``proj_k`` (Linformer), ``projection_matrix`` (Performer),
  ``cos`` (cosFormer), ``relu`` (ReLU-squared; the hybrid's ReLU), ``pinv`` (Nystromformer), ``synthetic_logits``
  (Synthesizer), ``fft`` (FNet), ``spatial_weight`` (gMLP), ``sigmoid`` (sigmoid attention);
- the Linformer at ``proj_k = proj_v = identity`` sliced to T x T keeps every key and value as it is: exact
  softmax attention (measured: 0 difference in float64 from the softmax encoder given the same weights), a pass;
- the "sigmoid" GPT written with ``exp(s - log n)`` over its row's sum: the bias ``-log n`` is the same along a
  row and cancels in the normalisation, so it is softmax(s) (measured: under 6e-16 in float64), a pass. Its first
  version took the row's maximum over every key, the future ones too, so that with large scores the visible keys'
  exp all underflow (0 / 0); the judge named that attention.no_max_subtraction, rightly (my model's bug, as in
  fresh31's running maximum from 0); the maximum is now taken over the visible keys;
- the hybrid's softmax layers: its first attention alone at multi_head_attention and its last layer alone at
  decoder_only_layer are the reference's, a pass; the hybrid with its first attention's causal mask left out, or
  its scores divided by d_head, is attention.not_causal or attention.wrong_scale at ``layers.0.attn`` (it diverges
  there, before the ReLU layer); its last attention alone with the softmax over the queries is
  attention.softmax_wrong_axis at the module.
- Performer given n_heads= (the judge asked for it): still the no pair at ``layers.0.attn``.

Checked by hand in float64: the hand-written attention equals SDPA (causal) to 2e-16; the identity Linformer equals
the softmax encoder given the same weights to 0 (with and without padding); every model runs finite on ids of 7.

First met: 11 of 20 right. Wrong:

- f47_linformer.identity: "differs at layers.0.attn: the states are held as 6 streams, weighed by learned weights
  (a weight per stream): layers.0.attn.proj_k (16 x 16) mixes them ...": the identity projections, which leave
  keys and values as they are, read as a mix of streams (the values of the unmapped parameters not tried);
- f47_performer, f47_cosformer, f47_synthesizer, f47_fnet: "could not judge: the number of heads cannot be read
  from the recorded forward: pass n_heads=": the heads are asked for before the mixer is read (FNet has none);
- f47_performer.n_heads: "could not judge: found 5 norms in the module, the reference 'encoder_model' has 2; pass
  mapping=" (the feature map's squared norm, it seems, counted as a norm);
- f47_nystrom: "differs at layers.0.attn: the attention's values are no projection's output: the attention's input
  (or a tensor made outside the forward) taken as it is": the place right, the op (landmarks, pinv) not named;
- f47_hybrid.not_causal_first_layer and f47_hybrid.wrong_scale_first_layer: "differs at layers.1.attn: the
  attention's weights are computed from the scores by relu ...": the no pair of the later layer said before the
  first layer's divergence is placed and explained (the unsupported reader answers ahead of the catalogue).

Fixed since: an einsum reading a weight along an axis of a state other than its features is no projection
(dataflow.across: the roles are read through it, so the identity Linformer's keys and values are k's and v's and
it passes), and where such a weight runs along the sequence's positions it is said as a projection of the keys or
values along the positions (unsupported._across); a product of computed tensors summing over the positions with no
scores q k^T behind it is said with the ops and parameters making its operands (unsupported._mixed: Performer's
projection_matrix, cosFormer's cos, the Synthesizer's synthetic_logits), an op of torch.fft or torch.linalg by its
name (unsupported._foreign: FNet's fft2, Nystromformer's pinv), each before the heads or the norms are asked for;
where a no pair is said at a later layer, every layer ending before it is judged on its own first (judge.before_head),
so the hybrid's first-layer mistakes are named at layers.0.attn.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

D, H, V, T_MAX = 32, 4, 26, 16
HD = D // H
LM, ENC, MHA = "transformer_lm", "encoder_model", "multi_head_attention"


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases moved off their 1s and 0s, so that a trained model's values are checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _mask(keep: torch.Tensor | None, T: int, causal: bool, device) -> torch.Tensor:
    """A boolean (B or 1, 1, T, T) of the keys each query reads: the padding keep-mask, the causal triangle."""
    seen = torch.ones(1, 1, T, T, dtype=torch.bool, device=device)
    if causal:
        seen = seen & torch.ones(T, T, dtype=torch.bool, device=device).tril()
    if keep is not None:
        seen = seen & keep[:, None, None, :].bool()
    return seen


class Attention(nn.Module):
    """Hand-written attention of separate q, k, v Linears; `weights` turns the scores into the mixing weights."""

    def __init__(self, causal: bool, mistake: str = "") -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))
        self.causal, self.mistake = causal, mistake

    def split(self, t: torch.Tensor) -> torch.Tensor:
        B, T, _ = t.shape
        return t.view(B, T, H, HD).transpose(1, 2)

    def merge(self, y: torch.Tensor) -> torch.Tensor:
        B, _, T, _ = y.shape
        return self.o(y.transpose(1, 2).reshape(B, T, D))

    def weights(self, s: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        return s.masked_fill(~seen, float("-inf")).softmax(-2 if self.mistake == "axis" else -1)

    def mix(self, q, k, v, seen):
        s = q @ k.transpose(-2, -1) / (HD if self.mistake == "scale" else math.sqrt(HD))
        return self.weights(s, seen) @ v

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = (self.split(f(x)) for f in (self.q, self.k, self.v))
        seen = _mask(keep, x.shape[1], self.causal and self.mistake != "open", x.device)
        return self.merge(self.mix(q, k, v, seen))


class Sigmoid(Attention):
    """Sigmoid attention (Ramapuram et al.): sigmoid(s + b), b = -log n, no normalisation over the keys."""

    def weights(self, s, seen):
        return torch.sigmoid(s - math.log(s.shape[-1])).masked_fill(~seen, 0.0)


class SigmoidAsSoftmax(Attention):
    """The sigmoid module's bias kept, exp in sigmoid's place and the row normalised: softmax(s) again."""

    def weights(self, s, seen):
        s = s.masked_fill(~seen, float("-inf")) - math.log(s.shape[-1])
        e = (s - s.amax(-1, keepdim=True)).exp()
        return e / e.sum(-1, keepdim=True)


class ReLUSquared(Attention):
    """relu(s)^2 / n: Primer-style squared ReLU in the softmax's place, normalised by the sequence's length."""

    def weights(self, s, seen):
        return (F.relu(s) ** 2).masked_fill(~seen, 0.0) / s.shape[-1]


class ReLUOverN(Attention):
    """relu(s) / n (the hybrid's middle layer)."""

    def weights(self, s, seen):
        return F.relu(s).masked_fill(~seen, 0.0) / s.shape[-1]


class Linformer(Attention):
    """Keys and values projected along the sequence: K' = proj_k[:T]^T K, V' = proj_v[:T]^T V (padding zeroed)."""

    def __init__(self, causal: bool = False, k: int = 4, identity: bool = False) -> None:
        super().__init__(causal)
        self.k_len = T_MAX if identity else k
        init = torch.eye(T_MAX) if identity else torch.randn(T_MAX, k) / math.sqrt(k)
        self.proj_k, self.proj_v = nn.Parameter(init.clone()), nn.Parameter(init.clone())
        self.identity = identity

    def mix(self, q, k, v, seen):
        T = q.shape[-2]
        width = T if self.identity else self.k_len
        pad = seen[:, :, :1, :].transpose(-2, -1).to(k.dtype)  # (B, 1, T, 1): 1 on the real keys
        k = torch.einsum("bhtd,tn->bhnd", k * pad, self.proj_k[:T, :width])
        v = torch.einsum("bhtd,tn->bhnd", v * pad, self.proj_v[:T, :width])
        s = q @ k.transpose(-2, -1) / math.sqrt(HD)
        if self.identity:  # projected position n is token n: its padding mask still applies
            s = s.masked_fill(~seen, float("-inf"))
        return s.softmax(-1) @ v


class Performer(Attention):
    """FAVOR+: positive random features of a fixed Gaussian projection_matrix (m = 16), bidirectional."""

    def __init__(self, causal: bool = False, m: int = 16) -> None:
        super().__init__(causal)
        self.register_buffer("projection_matrix", torch.randn(m, HD))

    def features(self, x):
        x = x * HD**-0.25
        w = self.projection_matrix.to(x.dtype)
        return torch.exp(x @ w.T - (x * x).sum(-1, keepdim=True) / 2) / math.sqrt(w.shape[0])

    def mix(self, q, k, v, seen):
        pad = seen[:, :, :1, :].transpose(-2, -1).to(k.dtype)
        qf, kf = self.features(q), self.features(k) * pad
        num = qf @ (kf.transpose(-2, -1) @ v)
        den = qf @ kf.sum(-2).unsqueeze(-1)
        return num / den


class CosFormer(Attention):
    """cosFormer: relu features, each position re-weighted by cos and sin of pi i / 2T (the cos decomposed)."""

    def mix(self, q, k, v, seen):
        T = q.shape[-2]
        pad = seen[:, :, :1, :].transpose(-2, -1).to(k.dtype)
        q, k = F.relu(q), F.relu(k) * pad
        angle = (math.pi / 2) * torch.arange(1, T + 1, dtype=q.dtype, device=q.device)[:, None] / T
        qc, qs, kc, ks = q * angle.cos(), q * angle.sin(), k * angle.cos(), k * angle.sin()
        num = qc @ (kc.transpose(-2, -1) @ v) + qs @ (ks.transpose(-2, -1) @ v)
        den = qc @ kc.sum(-2).unsqueeze(-1) + qs @ ks.sum(-2).unsqueeze(-1)
        return num / (den + 1e-6)


class Nystrom(Attention):
    """Nystromformer: 4 landmarks (segment means of the queries and keys), the middle kernel inverted by pinv."""

    def mix(self, q, k, v, seen):
        m = min(4, q.shape[-2])
        ql = torch.stack([c.mean(-2) for c in q.tensor_split(m, dim=-2)], -2)
        kl = torch.stack([c.mean(-2) for c in k.tensor_split(m, dim=-2)], -2)
        scale = 1 / math.sqrt(HD)
        k1 = (q @ kl.transpose(-2, -1) * scale).softmax(-1)
        k2 = (ql @ kl.transpose(-2, -1) * scale).softmax(-1)
        s3 = (ql @ k.transpose(-2, -1) * scale).masked_fill(~seen[:, :, :1, :], float("-inf"))
        return k1 @ torch.linalg.pinv(k2) @ (s3.softmax(-1) @ v)


class Synthesizer(nn.Module):
    """Dense-random Synthesizer: the weights a learned table (per head) sliced to T x T; only values are read."""

    def __init__(self, causal: bool = False) -> None:
        super().__init__()
        self.synthetic_logits = nn.Parameter(torch.randn(H, T_MAX, T_MAX))
        self.v, self.o = nn.Linear(D, D), nn.Linear(D, D)
        self.causal = causal

    def forward(self, x, keep=None):
        B, T, _ = x.shape
        v = self.v(x).view(B, T, H, HD).transpose(1, 2)
        seen = _mask(keep, T, self.causal, x.device)
        w = self.synthetic_logits[:, :T, :T].to(x.dtype).masked_fill(~seen, float("-inf")).softmax(-1)
        return self.o((w @ v).transpose(1, 2).reshape(B, T, D))


class Fourier(nn.Module):
    """FNet's mixer: the real part of the 2-D FFT over the tokens and the features; no parameters."""

    def forward(self, x, keep=None):
        return torch.fft.fft2(x, dim=(-2, -1)).real


class SpatialGating(nn.Module):
    """gMLP's spatial gating unit: x -> (u, v), v normalised and mixed over the positions, u * v projected back."""

    def __init__(self, causal: bool = False) -> None:
        super().__init__()
        self.proj_in, self.proj_out = nn.Linear(D, 4 * D), nn.Linear(2 * D, D)
        self.norm = nn.LayerNorm(2 * D)
        self.spatial_weight = nn.Parameter(torch.randn(T_MAX, T_MAX) * 0.1)
        self.spatial_bias = nn.Parameter(torch.ones(T_MAX))

    def forward(self, x, keep=None):
        T = x.shape[1]
        u, v = F.gelu(self.proj_in(x)).chunk(2, dim=-1)
        v = self.norm(v)
        v = torch.einsum("st,btd->bsd", self.spatial_weight[:T, :T].to(x.dtype), v) + self.spatial_bias[:T, None]
        return self.proj_out(u * v)


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))


class EncoderLayer(nn.Module):
    """Post-norm: x = ln1(x + mixer(x)); x = ln2(x + mlp(x))."""

    def __init__(self, mixer: nn.Module) -> None:
        super().__init__()
        self.attn, self.ln1, self.mlp, self.ln2 = mixer, nn.LayerNorm(D), _mlp(), nn.LayerNorm(D)

    def forward(self, x, keep):
        x = self.ln1(x + self.attn(x, keep))
        return self.ln2(x + self.mlp(x))


class Encoder(nn.Module):
    """BERT's shape: word and position tables, an embedding LayerNorm, two layers."""

    def __init__(self, mixers: list[nn.Module]) -> None:
        super().__init__()
        self.word, self.pos, self.ln = nn.Embedding(V, D), nn.Embedding(T_MAX, D), nn.LayerNorm(D)
        self.layers = nn.ModuleList(EncoderLayer(m) for m in mixers)

    def forward(self, input_ids, attention_mask=None):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        T = input_ids.shape[1]
        x = self.ln(self.word(input_ids) + self.pos(torch.arange(T, device=input_ids.device)))
        for layer in self.layers:
            x = layer(x, attention_mask)
        return x


def encoder(mixer=lambda: Attention(causal=False)) -> Encoder:
    return _jitter(Encoder([mixer(), mixer()]))


class Block(nn.Module):
    """Pre-norm GPT block."""

    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(D), attn, nn.LayerNorm(D), _mlp()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, attns: list[nn.Module]) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T_MAX, D)
        self.layers = nn.ModuleList(Block(a) for a in attns)
        self.ln_f, self.lm_head = nn.LayerNorm(D), nn.Linear(D, V, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.layers:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt(kind=Attention) -> GPT:
    return _jitter(GPT([kind(causal=True), kind(causal=True)]))


def hybrid(first: str = "", last: str = "") -> GPT:
    """Three layers: softmax, ReLU / n, softmax; `first` / `last` a mistake in a softmax layer."""
    attns = [Attention(True, first), ReLUOverN(True), Attention(True, last)]
    return _jitter(GPT(attns))


CASES = [
    ("f47_encoder", encoder, ENC, {}, "pass"),
    ("f47_gpt", gpt, LM, {}, "pass"),
    ("f47_linformer", lambda: encoder(Linformer), ENC, {}, ("no pair", "layers.0.attn", "proj_k")),
    ("f47_linformer.identity", lambda: encoder(lambda: Linformer(identity=True)), ENC, {}, "pass"),
    ("f47_performer", lambda: encoder(Performer), ENC, {}, ("no pair", "layers.0.attn", "projection_matrix")),
    (
        "f47_performer.n_heads",
        lambda: encoder(Performer),
        ENC,
        {"n_heads": H},
        ("no pair", "layers.0.attn", "projection_matrix"),
    ),
    ("f47_cosformer", lambda: encoder(lambda: CosFormer(False)), ENC, {}, ("no pair", "layers.0.attn", "cos")),
    ("f47_relu_squared", lambda: encoder(lambda: ReLUSquared(False)), ENC, {}, ("no pair", "layers.0.attn", "relu")),
    ("f47_nystrom", lambda: encoder(lambda: Nystrom(False)), ENC, {}, ("no pair", "layers.0.attn", "pinv")),
    (
        "f47_synthesizer",
        lambda: encoder(Synthesizer),
        ENC,
        {},
        ("no pair", "layers.0.attn", "synthetic_logits"),
    ),
    ("f47_fnet", lambda: encoder(Fourier), ENC, {}, ("no pair", "layers.0.attn", "fft")),
    ("f47_gmlp", lambda: encoder(SpatialGating), ENC, {}, ("no pair", "layers.0.attn", "spatial_weight")),
    ("f47_sigmoid_gpt", lambda: gpt(Sigmoid), LM, {}, ("no pair", "layers.0.attn", "sigmoid")),
    ("f47_sigmoid_gpt.exp_normalised", lambda: gpt(SigmoidAsSoftmax), LM, {}, "pass"),
    ("f47_hybrid", hybrid, LM, {}, ("no pair", "layers.1.attn", "relu")),
    (
        "f47_hybrid.not_causal_first_layer",
        lambda: hybrid(first="open"),
        LM,
        {},
        ("mistake", "attention.not_causal", "layers.0.attn"),
    ),
    (
        "f47_hybrid.wrong_scale_first_layer",
        lambda: hybrid(first="scale"),
        LM,
        {},
        ("mistake", "attention.wrong_scale", "layers.0.attn"),
    ),
    ("f47_hybrid.first_attention", lambda: hybrid().layers[0].attn, MHA, {}, "pass"),
    ("f47_hybrid.last_layer", lambda: hybrid().layers[2], "decoder_only_layer", {}, "pass"),
    (
        "f47_hybrid.last_attention.softmax_over_queries",
        lambda: hybrid(last="axis").layers[2].attn,
        MHA,
        {},
        ("mistake", "attention.softmax_wrong_axis", ""),
    ),
]
