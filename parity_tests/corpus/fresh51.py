"""Training-stabilisation variants of the Transformer layer (issue 46, round 51), as 2019-2025 papers define them
and a 2026 learner writes them in a small decoder-only LM: learned positions, hand-written attention, GELU MLP, two
layers. The judge meets them here first (measured with the judge frozen).

- pre-norm with a small init (T-Fixup-style scaled init: only the init differs, the forward is a plain layer);
- post-norm LN(x + f(x)), with a T-Fixup-style scaled init;
- NormFormer's extra LayerNorms after the attention and after the FFN (the reference's sandwich norm);
- a LayerNorm on q and k per head written as an RMSNorm (the reference's qk_norm, RMS only);
- DeepNorm: post-norm LN(alpha * x + f(x)), alpha = (2N) ** 0.25 = 1.4142 for N = 2 layers;
- ReZero: x + alpha * f(x), alpha a learned scalar set to 0.5, no norm;
- ScaleNorm: g * x / max(norm(x), eps), one learned scalar g;
- NormFormer with its LayerNorm on the FFN's hidden activations (after the GELU);
- Sub-LN (Magneto): a LayerNorm before the attention's output projection;
- Admin: post-norm LN(x * omega + f(x)), omega a learned per-feature vector;
- QK-LayerNorm: a LayerNorm (mean removed, with a bias) on each head's q and k;
- Swin v2's cosine attention: cos(q, k) / tau with a learned temperature tau per head.
- mistakes in the models the reference has, each in the second layer: the scale 1 / d_head, a LayerNorm of
  unbiased variance, the k RMSNorm's eps outside the root, a causal mask left off.

Expected verdicts decided from the math before the judge ran: the reference has pre- and post-norm (norm_first),
the sandwich norm (sandwich_norm), an RMSNorm of q and k per head (qk_norm, no LayerNorm kind) and norms of a
(D,) gain; it has no factor on the residual stream, no learned scalar on a sublayer, no one-scalar norm without eps
in the root, no norm inside the FFN or before the output projection, no mean-removing q/k norm and no cosine
scores. Those are said at the submodule whose forward first computes them (the layer itself for the residual's
factor, layers.0). The correct models are the reference's layers written out (pre-/post-norm, the sandwich, the
q/k RMSNorm of eps layer_norm_eps); the T-Fixup init only rescales weights, which the forward does not read apart.

Two expectations were sharpened after the first run, both in the judge's favour and said here: ReZero's scale is
a learned parameter, so its name (layers.0.alpha) names the op rather than its value 0.5; the QK-LayerNorm departs
in the user's submodule layers.0.attn.q_norm, one level below the attention first written down. The q/k RMSNorm was
first written with eps 1e-6 beside LayerNorms of 1e-5: the reference ties the q/k norm's eps to layer_norm_eps, and
the judge answered "unexplained ... typically float32 rounding" with no op (an eps the reference cannot hold apart);
the corpus then used 1e-5 there, and the 1e-6 model came back as its own case (f51_qk_rms_own_eps, added with the
fixes below): the q/k norms of eps 1e-6 are a no pair at the first of them, layers.0.attn.q_norm, said with its eps.

First met: 12 of 16 right (17 cases since f51_qk_rms_own_eps). Wrong:

- f51_scalenorm: "differs at layers.0.ln_1: a tensor is multiplied by a learned scale, layers.0.ln_1.g (one
  number)": the place is right, but the division by the L2 norm (the op with no pair even at a fixed g) is not said.
- f51_normformer_ffn_ln: "could not judge: found 11 norms in the module, the reference 'transformer_lm' has 9; pass
  mapping=" where the extra LayerNorm on the FFN's hidden activations is a no pair at layers.0.mlp.
- f51_sub_ln: "could not judge: found 7 norms ..., the reference has 5; pass mapping=" where the LayerNorm before
  out_proj is a no pair at layers.0.attn.
- f51_admin: "could not judge: found 7 norms ..., the reference has 5" (the two per-feature omegas, (D,) vectors,
  read as norms) where x * omega is a no pair at layers.0.

Fixed since: a 1-D parameter is a norm's scale only where it multiplies a normalised x, not the output of a norm
that applied its own weight (Admin's omegas: the residual stream times a learned vector, said at the layer with the
parameter's name); a norm whose output reaches an attention's output projection or a feed-forward block's last one
is said at the submodule that applies it (Sub-LN, NormFormer's hidden LayerNorm), before any count of norms;
x / x.norm() is read with its divisor floored (clamp or + eps) and a learned number on the dividend, so ScaleNorm is
said as the division by the L2 norm; an attention whose q/k RMSNorms take an eps of their own is rerun by the
reference at those eps and, where that reproduces the user's, said at the first such norm with its eps.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

D, H, V, T_MAX, N_LAYERS = 32, 4, 26, 16, 2
HD = D // H
DEEPNORM_ALPHA = (2 * N_LAYERS) ** 0.25


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases moved off their 1s and 0s, so that a trained model's values are checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() <= 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


class UnbiasedLayerNorm(nn.Module):
    """The mistake: the variance divided by D - 1."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=True)
        return (x - mu) / torch.sqrt(var + 1e-5) * self.weight + self.bias


class ScaleNorm(nn.Module):
    """g * x / max(||x||, eps), g one learned scalar initialised to sqrt(D)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.g, self.eps = nn.Parameter(torch.tensor(math.sqrt(dim))), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.g * x / x.norm(dim=-1, keepdim=True).clamp(min=self.eps)


class HeadRMSNorm(nn.Module):
    """RMSNorm over one head's width; `outside`: the mistake, eps added after the root."""

    def __init__(self, dim: int, outside: bool = False, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight, self.outside, self.eps = nn.Parameter(torch.ones(dim)), outside, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ms = x.pow(2).mean(-1, keepdim=True)
        return x / (ms.sqrt() + self.eps if self.outside else torch.sqrt(ms + self.eps)) * self.weight


class Attention(nn.Module):
    """Causal attention of explicit scores. `qk`: None, "rms", "rms_outside" (k's eps outside the root), "rms_1e-6" (its
    eps 1e-6 where the LayerNorms' is 1e-5), "layer";
    `scale`: "sqrt" or "head_dim" (the mistake); `causal`; `sub_ln`: Magneto's LayerNorm before out_proj; `cosine`:
    Swin v2's cos(q, k) / tau, tau per head learned (clamped at 0.01)."""

    def __init__(self, qk=None, scale="sqrt", causal=True, sub_ln=False, cosine=False) -> None:
        super().__init__()
        self.qkv, self.out_proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.scale, self.causal, self.cosine = scale, causal, cosine
        if qk in ("rms", "rms_outside", "rms_1e-6"):
            eps = 1e-6 if qk == "rms_1e-6" else 1e-5
            self.q_norm, self.k_norm = HeadRMSNorm(HD, eps=eps), HeadRMSNorm(HD, qk == "rms_outside", eps)
        elif qk == "layer":
            self.q_norm, self.k_norm = nn.LayerNorm(HD), nn.LayerNorm(HD)
        self.has_qk = qk is not None
        self.sub_ln = nn.LayerNorm(D) if sub_ln else None
        if cosine:
            self.tau = nn.Parameter(torch.full((H, 1, 1), 0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, H, HD).transpose(1, 2) for t in self.qkv(x).split(D, -1))
        if self.has_qk:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.cosine:
            s = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1) / self.tau.clamp(min=0.01)
        else:
            s = q @ k.transpose(-2, -1) / (math.sqrt(HD) if self.scale == "sqrt" else HD)
        if self.causal:
            s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        y = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D)
        return self.out_proj(self.sub_ln(y) if self.sub_ln is not None else y)


class MLP(nn.Module):
    """fc1 -> GELU -> (NormFormer's LayerNorm on the hidden activations) -> fc2."""

    def __init__(self, hidden_ln: bool = False) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.hidden_ln = nn.LayerNorm(4 * D) if hidden_ln else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x))
        return self.fc2(self.hidden_ln(h) if self.hidden_ln is not None else h)


class Block(nn.Module):
    """`style`: "pre" x + f(LN(x)); "post" LN(x + f(x)); "sandwich" x + LN(f(LN(x))) (NormFormer);
    "deepnorm" LN(alpha x + f(x)); "rezero" x + alpha f(x); "admin" LN(x * omega + f(x)). `norm`: the norm's class."""

    def __init__(self, style="pre", attn=None, mlp=None, norm=nn.LayerNorm) -> None:
        super().__init__()
        self.style = style
        self.attn, self.mlp = attn or Attention(), mlp or MLP()
        if style != "rezero":
            self.ln_1, self.ln_2 = norm(D), norm(D)
        if style == "sandwich":
            self.post_attn_ln, self.post_mlp_ln = nn.LayerNorm(D), nn.LayerNorm(D)
        if style == "rezero":
            self.alpha = nn.Parameter(torch.tensor(0.0))
            with torch.no_grad():
                self.alpha.fill_(0.5)  # zero at init; non-zero so that the math shows
        if style == "admin":
            self.omega_1, self.omega_2 = nn.Parameter(torch.ones(D)), nn.Parameter(torch.ones(D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.style
        if s == "pre":
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))
        if s == "sandwich":
            x = x + self.post_attn_ln(self.attn(self.ln_1(x)))
            return x + self.post_mlp_ln(self.mlp(self.ln_2(x)))
        if s == "rezero":
            x = x + self.alpha * self.attn(x)
            return x + self.alpha * self.mlp(x)
        if s == "deepnorm":
            x = self.ln_1(DEEPNORM_ALPHA * x + self.attn(x))
            return self.ln_2(DEEPNORM_ALPHA * x + self.mlp(x))
        if s == "admin":
            x = self.ln_1(x * self.omega_1 + self.attn(x))
            return self.ln_2(x * self.omega_2 + self.mlp(x))
        x = self.ln_1(x + self.attn(x))
        return self.ln_2(x + self.mlp(x))


class LM(nn.Module):
    """Token and learned position embeddings, two blocks, a final LayerNorm for pre-norm styles, an untied head."""

    def __init__(self, first: Block, second: Block, final_norm: bool, tfixup: bool = False) -> None:
        super().__init__()
        self.tok_emb, self.pos_emb = nn.Embedding(V, D), nn.Embedding(T_MAX, D)
        self.layers = nn.ModuleList([first, second])
        self.ln_f = nn.LayerNorm(D) if final_norm else None
        self.head = nn.Linear(D, V, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
                if tfixup and name.endswith(("out_proj.weight", "fc2.weight", "qkv.weight")):
                    p.data.mul_(0.67 * N_LAYERS**-0.25)  # T-Fixup's scaled init: the forward unchanged

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        T = input_ids.shape[1]
        x = self.tok_emb(input_ids) + self.pos_emb(torch.arange(T, device=input_ids.device))
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln_f(x) if self.ln_f is not None else x)


def lm(style="pre", second=None, first_kw=None, second_kw=None, norm=nn.LayerNorm, tfixup=False) -> nn.Module:
    """Two blocks of `style`; the second's attention, MLP or norm from `second_kw` (the mistake) where given."""
    torch.manual_seed(0)
    first_kw = first_kw or {}
    second_kw = second_kw if second_kw is not None else first_kw
    blocks = [
        Block(second or style if i else style, Attention(**kw.get("attn", {})), MLP(**kw.get("mlp", {})),
              kw.get("norm", norm))
        for i, kw in enumerate((first_kw, second_kw))
    ]  # fmt: skip
    final = style in ("pre", "sandwich", "rezero")
    return _jitter(LM(blocks[0], blocks[1], final_norm=final and style != "rezero", tfixup=tfixup))


LEVEL = "transformer_lm"
PRE = {"positional": "learned", "norm_first": True}
POST = {"positional": "learned", "norm_first": False}
SANDWICH = PRE | {"sandwich_norm": True}
QK = PRE | {"qk_norm": True}
RMS_QK = {"attn": {"qk": "rms"}}

CASES = [
    ("f51_small_init_prenorm", lambda: lm("pre", tfixup=True), LEVEL, PRE, "pass"),
    ("f51_tfixup_postnorm", lambda: lm("post", tfixup=True), LEVEL, POST, "pass"),
    ("f51_normformer_sandwich", lambda: lm("sandwich"), LEVEL, SANDWICH, "pass"),
    ("f51_qk_rms", lambda: lm("pre", first_kw=RMS_QK), LEVEL, QK, "pass"),
    (
        "f51_qk_rms_own_eps",
        lambda: lm("pre", first_kw={"attn": {"qk": "rms_1e-6"}}),
        LEVEL,
        QK,
        ("no pair", "layers.0.attn.q_norm", "eps 1e-06"),
    ),
    ("f51_deepnorm", lambda: lm("deepnorm"), LEVEL, POST, ("no pair", "layers.0", "1.41")),
    ("f51_rezero", lambda: lm("rezero"), LEVEL, PRE, ("no pair", "layers.0", "layers.0.alpha")),
    ("f51_scalenorm", lambda: lm("pre", norm=ScaleNorm), LEVEL, PRE, ("no pair", "layers.0.ln_1", "norm")),
    (
        "f51_normformer_ffn_ln",
        lambda: lm("sandwich", first_kw={"mlp": {"hidden_ln": True}}),
        LEVEL,
        SANDWICH,
        ("no pair", "layers.0.mlp", "norm"),
    ),
    (
        "f51_sub_ln",
        lambda: lm("pre", first_kw={"attn": {"sub_ln": True}}),
        LEVEL,
        PRE,
        ("no pair", "layers.0.attn", "norm"),
    ),
    ("f51_admin", lambda: lm("admin"), LEVEL, POST, ("no pair", "layers.0", "mul")),
    (
        "f51_qk_layernorm",
        lambda: lm("pre", first_kw={"attn": {"qk": "layer"}}),
        LEVEL,
        QK,
        ("no pair", "layers.0.attn.q_norm", "LayerNorm"),
    ),
    (
        "f51_cosine_attention",
        lambda: lm("post", first_kw={"attn": {"cosine": True}}),
        LEVEL,
        POST,
        ("no pair", "layers.0.attn", "normalize"),
    ),
    (
        "f51_small_init_prenorm.wrong_scale_second_block",
        lambda: lm("pre", second_kw={"attn": {"scale": "head_dim"}}),
        LEVEL,
        PRE,
        ("mistake", "attention.wrong_scale", "layers.1.attn"),
    ),
    (
        "f51_tfixup_postnorm.unbiased_variance_second_block",
        lambda: lm("post", second_kw={"norm": UnbiasedLayerNorm}),
        LEVEL,
        POST,
        ("mistake", "layer_norm.unbiased_variance", "layers.1.ln_1"),
    ),
    (
        "f51_qk_rms.k_eps_outside_sqrt_second_block",
        lambda: lm("pre", first_kw=RMS_QK, second_kw={"attn": {"qk": "rms_outside"}}),
        LEVEL,
        QK,
        ("mistake", "rms_norm.eps_outside_sqrt", "layers.1.attn.k_norm"),
    ),
    (
        "f51_normformer_sandwich.not_causal_second_block",
        lambda: lm("sandwich", second_kw={"attn": {"causal": False}}),
        LEVEL,
        SANDWICH,
        ("mistake", "attention.not_causal", "layers.1.attn"),
    ),
]
