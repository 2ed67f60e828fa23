"""Numerical-stability and precision idioms as 2025-26 training code and teaching notebooks write attention and
norms (issue 46, round 15), in this project's own words; the judge meets them here first (measured with it frozen).

- a GPT whose softmax is written as `exp(s - logsumexp(s))` (the log-sum-exp trick by hand);
- a GPT whose causal mask is filled with `torch.finfo(dtype).min` instead of -inf (HF's idiom);
- a GPT masking by `torch.where(causal, scores, -inf)` and cleaning the probabilities with `nan_to_num`;
- a GPT taking its softmax on `scores.float()` and casting back with `type_as` (the fp16-safe softmax: a float32
  island in a float64 model, equal math);
- a GPT whose query is pre-scaled (`q * d_head ** -0.5` before the product), and one handing the pre-scaled query to
  `F.scaled_dot_product_attention(..., scale=1.0)`;
- a GPT soft-capping its attention scores by `cap * torch.tanh(s / cap)` (Gemma 2's attention cap), and one capping
  its final logits the same way (Gemma 2's final-logit cap);
- a GPT clamping its scores to +-50 before the softmax (a QK-clip the reference lacks: no pair);
- a GPT of RMSNorms computed in float32 by `x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)` and cast back;
- a GPT of LayerNorms written with `torch.var_mean(x, -1, correction=0, keepdim=True)`;
- mistakes put into them, each at the second block: the log-sum-exp taken over the queries (dim=-2), the
  finfo-filled model zeroing the masked probabilities after its softmax, the pre-scaled query divided again by
  sqrt(d_head) in the scores (the scale twice: S / d_head), the tanh cap without the division (cap * tanh(S)), the
  RMSNorm's eps added outside the root, and `torch.var_mean` left at its default correction (unbiased variance).

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

D, H, V, T_MAX = 32, 4, 26, 16
HD = D // H
EPS = 1e-5


def _heads(x):
    return x.unflatten(-1, (H, HD)).transpose(1, 2)  # (B, T, D) -> (B, H, T, HD)


def _future(T):
    return torch.ones(T, T, dtype=torch.bool).triu(1)  # True where the key is after the query


class Attention(nn.Module):
    """q, k, v and the output projection; `attend` (B, H, T, HD) x3 -> (B, H, T, HD) is what each style writes."""

    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(D, D)
        self.k_proj = nn.Linear(D, D)
        self.v_proj = nn.Linear(D, D)
        self.out_proj = nn.Linear(D, D)

    def forward(self, x):
        y = self.attend(_heads(self.q_proj(x)), _heads(self.k_proj(x)), _heads(self.v_proj(x)))
        return self.out_proj(y.transpose(1, 2).flatten(-2))

    def scores(self, q, k):
        return q @ k.transpose(-2, -1) / math.sqrt(HD)

    def attend(self, q, k, v):
        """The textbook causal attention (the models whose idioms sit in their norms keep it)."""
        return self.scores(q, k).masked_fill(_future(q.shape[-2]), float("-inf")).softmax(-1) @ v


class LogSumExpSoftmax(Attention):
    """P = exp(S - logsumexp(S)) over `axis`."""

    axis = -1

    def attend(self, q, k, v):
        s = self.scores(q, k).masked_fill(_future(q.shape[-2]), float("-inf"))
        return torch.exp(s - torch.logsumexp(s, dim=self.axis, keepdim=True)) @ v


class LogSumExpOverQueries(LogSumExpSoftmax):
    axis = -2


class FinfoMinFill(Attention):
    """The masked scores set to the dtype's most negative number; `zero_after`: the mistake, the mask applied to
    the probabilities (set to 0) after the softmax instead of to the scores before it."""

    zero_after = False

    def attend(self, q, k, v):
        s, future = self.scores(q, k), _future(q.shape[-2])
        if self.zero_after:
            return s.softmax(-1).masked_fill(future, 0.0) @ v
        return s.masked_fill(future, torch.finfo(s.dtype).min).softmax(-1) @ v


class FinfoMinZeroAfter(FinfoMinFill):
    zero_after = True


class WhereNanToNum(Attention):
    def attend(self, q, k, v):
        s = self.scores(q, k)
        s = torch.where(~_future(q.shape[-2]), s, torch.tensor(float("-inf"), dtype=s.dtype))
        return torch.nan_to_num(F.softmax(s, dim=-1), nan=0.0) @ v


class Float32Softmax(Attention):
    def attend(self, q, k, v):
        s = self.scores(q, k).masked_fill(_future(q.shape[-2]), float("-inf"))
        return F.softmax(s.float(), dim=-1).type_as(q) @ v


class PreScaledQuery(Attention):
    """q * d_head^-0.5 before the product; `twice`: the mistake, the scores divided by sqrt(d_head) as well."""

    twice = False

    def attend(self, q, k, v):
        q = q * HD**-0.5
        s = q @ k.transpose(-2, -1)
        if self.twice:
            s = s / math.sqrt(HD)
        return s.masked_fill(_future(q.shape[-2]), float("-inf")).softmax(-1) @ v


class ScaledTwice(PreScaledQuery):
    twice = True


class PreScaledSDPA(Attention):
    def attend(self, q, k, v):
        return F.scaled_dot_product_attention(q * HD**-0.5, k, v, is_causal=True, scale=1.0)


class TanhCap(Attention):
    """S' = cap * tanh(S / cap) before the mask and the softmax; `divided` False: the mistake, cap * tanh(S)."""

    cap, divided = 5.0, True

    def attend(self, q, k, v):
        s = self.scores(q, k)
        s = self.cap * torch.tanh(s / self.cap if self.divided else s)
        return s.masked_fill(_future(q.shape[-2]), float("-inf")).softmax(-1) @ v


class TanhCapUndivided(TanhCap):
    divided = False


class ClampedScores(Attention):
    def attend(self, q, k, v):
        s = self.scores(q, k).clamp(-50.0, 50.0)
        return s.masked_fill(_future(q.shape[-2]), float("-inf")).softmax(-1) @ v


class Float32RMSNorm(nn.Module):
    """y = w * x / sqrt(mean(x^2) + eps) computed in float32 and cast back; `outside`: the mistake, the eps added
    outside the root (x / (sqrt(mean(x^2)) + eps))."""

    outside = False

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(D))

    def forward(self, x):
        h = x.to(torch.float32)
        ms = h.pow(2).mean(-1, keepdim=True)
        h = h / (ms.sqrt() + EPS) if self.outside else h * torch.rsqrt(ms + EPS)
        return (self.weight * h).to(x.dtype)


class EpsOutsideRMSNorm(Float32RMSNorm):
    outside = True


class VarMeanLayerNorm(nn.Module):
    """y = (x - mean) / sqrt(var + eps) * w + b, mean and var by torch.var_mean; `correction` 1: the mistake (the
    default, unbiased variance)."""

    correction = 0

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(D))
        self.bias = nn.Parameter(torch.zeros(D))

    def forward(self, x):
        var, mean = torch.var_mean(x, dim=-1, correction=self.correction, keepdim=True)
        return (x - mean) * torch.rsqrt(var + EPS) * self.weight + self.bias


class UnbiasedVarMeanLayerNorm(VarMeanLayerNorm):
    correction = 1


def layer_norm():
    return nn.LayerNorm(D)


class Block(nn.Module):
    def __init__(self, attention, norm):
        super().__init__()
        self.ln_1 = norm()
        self.attn = attention()
        self.ln_2 = norm()
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, first, second, norm, logit_cap):
        super().__init__()
        self.wte = nn.Embedding(V, D)
        self.wpe = nn.Embedding(T_MAX, D)
        self.blocks = nn.ModuleList([Block(first, norm), Block(second, norm)])
        self.ln_f = norm()
        self.lm_head = nn.Linear(D, V, bias=False)
        self.logit_cap = logit_cap

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if self.logit_cap:
            logits = self.logit_cap * torch.tanh(logits / self.logit_cap)
        return logits


def gpt(first=Attention, second=None, norm=layer_norm, logit_cap=None, second_norm=None) -> GPT:
    """A GPT-2-style LM of `first`'s attention (`second`'s in its second block), `norm` everywhere (`second_norm`
    in the second block's `second_norm[0]` norm: "ln_1" or "ln_2")."""
    torch.manual_seed(0)
    model = GPT(first, second or first, norm, logit_cap)
    if second_norm is not None:
        name, cls = second_norm
        setattr(model.blocks[1], name, cls())
    return model


CASES = [
    ("lse_softmax_gpt", lambda: gpt(LogSumExpSoftmax), "transformer_lm", {}, "pass"),
    (
        "lse_softmax_gpt.logsumexp_over_queries_second_block",
        lambda: gpt(LogSumExpSoftmax, LogSumExpOverQueries),
        "transformer_lm",
        {},
        ("mistake", "attention.softmax_wrong_axis", "blocks.1.attn"),
    ),
    ("finfo_min_gpt", lambda: gpt(FinfoMinFill), "transformer_lm", {}, "pass"),
    (
        "finfo_min_gpt.mask_after_softmax_second_block",
        lambda: gpt(FinfoMinFill, FinfoMinZeroAfter),
        "transformer_lm",
        {},
        ("mistake", "attention.mask_after_softmax", "blocks.1.attn"),
    ),
    ("where_nan_to_num_gpt", lambda: gpt(WhereNanToNum), "transformer_lm", {}, "pass"),
    ("float32_softmax_gpt", lambda: gpt(Float32Softmax), "transformer_lm", {}, "pass"),
    ("prescaled_q_gpt", lambda: gpt(PreScaledQuery), "transformer_lm", {}, "pass"),
    (
        "prescaled_q_gpt.scaled_twice_second_block",
        lambda: gpt(PreScaledQuery, ScaledTwice),
        "transformer_lm",
        {},
        ("mistake", "attention.wrong_scale", "blocks.1.attn"),
    ),
    ("prescaled_sdpa_gpt", lambda: gpt(PreScaledSDPA), "transformer_lm", {}, "pass"),
    ("tanh_cap_gpt", lambda: gpt(TanhCap), "transformer_lm", {}, "pass"),
    (
        "tanh_cap_gpt.cap_without_division_second_block",
        lambda: gpt(TanhCap, TanhCapUndivided),
        "transformer_lm",
        {},
        ("mistake", "attention.softcap_without_division", "blocks.1.attn"),
    ),
    ("logit_cap_gpt", lambda: gpt(logit_cap=10.0), "transformer_lm", {}, "pass"),
    ("clamped_scores_gpt", lambda: gpt(ClampedScores), "transformer_lm", {}, ("no pair", "blocks.0.attn", "clamp")),
    ("rsqrt_rms_gpt", lambda: gpt(norm=Float32RMSNorm), "transformer_lm", {}, "pass"),
    (
        "rsqrt_rms_gpt.eps_outside_sqrt_second_block",
        lambda: gpt(norm=Float32RMSNorm, second_norm=("ln_1", EpsOutsideRMSNorm)),
        "transformer_lm",
        {},
        ("mistake", "rms_norm.eps_outside_sqrt", "blocks.1.ln_1"),
    ),
    ("var_mean_ln_gpt", lambda: gpt(norm=VarMeanLayerNorm), "transformer_lm", {}, "pass"),
    (
        "var_mean_ln_gpt.unbiased_second_block",
        lambda: gpt(norm=VarMeanLayerNorm, second_norm=("ln_2", UnbiasedVarMeanLayerNorm)),
        "transformer_lm",
        {},
        ("mistake", "layer_norm.unbiased_variance", "blocks.1.ln_2"),
    ),
]
