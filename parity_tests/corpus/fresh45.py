"""RoPE scaling and position-encoding variants written by hand in small Llama-style LMs (issue 46, round 45), as
2025-26 long-context blog posts and repos write them. The judge meets them here first (measured with the judge
frozen).

- linear position interpolation: the positions divided by the factor (4), the factor stated in an HF-style
  ``config.rope_scaling``;
- NTK-aware base change: base times factor^(d / (d - 2)) (no config: a plain RoPE at a larger base);
- dynamic NTK: the base rescaled only when the sequence is longer than the original max length. That length is
  8 here (``max_position_embeddings``), so that the judge's probes, longer than 8, see the rescaled base;
- YaRN: a per-frequency ramp between the interpolated and the original frequencies by wavelength (beta_fast 32,
  beta_slow 1, original length 8, factor 4), cos and sin times 0.1 ln(s) + 1; at the LM and at the attention;
- Llama 3.1's frequency-dependent scaling (factor 8, low_freq_factor 1, high_freq_factor 4, old_context_len 64,
  where the head's wavelengths 6.3, 63, 628 and 6283 fall one above, one between, two below); at the LM and at the
  decoder layer;
- LongRoPE / Phi-3: per-frequency short and long factor lists chosen by the sequence's length (original 8, so the
  long list is read by the probes), cos and sin times sqrt(1 + ln(s) / ln(8)) with s = 32 / 8;
- a large base (500000, the attribute ``rope_theta``);
- xPos: rotary with a per-dimension exponential decay, the queries times zeta_i^(t / 512) and the keys times
  zeta_i^(-t / 512): math the reference lacks (no pair).
- mistakes, each in the second layer: the values rotated too (rope.applied_to_v); the keys rotated one position
  ahead (rope.position_offset); queries turned in halves and keys in pairs (rope.mixed_pairing); scores over
  d_head (attention.wrong_scale); K/V heads tiled (attention.kv_heads_tiled); YaRN's attention factor left off
  cos and sin, which scales the scores by 1 / m^2 of the reference's, m = 0.1 ln 4 + 1, and LongRoPE's, m =
  sqrt(1 + ln 4 / ln 8) (rope.attention_factor_missing, since the first fix; first expected as
  attention.wrong_scale); and two the catalogue has no id for, said as no pair at the attention: the positions
  multiplied by the linear factor instead of divided, and LongRoPE's short factors kept past the original length.

Expected verdicts decided from the math before the judge ran. Each hand-written frequency function was checked
against the reference's own (numpy_transformer.attention's SCALED_FREQUENCIES at the same settings): equal to
1e-12 in float64 (``_checked_against_the_reference``), and the NTK-aware base change, base 10000 * 4^(8/6), is a
plain RoPE at that base.

YaRN's attention factor left off: the reference's q and k are both times m, its scores m^2 Q K^T / sqrt(d_head);
the model's Q K^T / sqrt(d_head), a scale of the scores off the reference's by m^2. First expected as the
catalogue's attention.wrong_scale (the nearest id then); the expectation is now rope.attention_factor_missing, an
entry the catalogue gained for it: the user wrote no divisor of the scores, they left a factor off cos and sin,
and the reference runs exactly that (its scaling with attention_factor 1), so the id names what they wrote.

First met: 11 of 18 right. Wrong:

- f45_ntk_llama (a plain RoPE at base 10000 * 4^(4/3) = 63496.042): "unexplained: model.layers.0.self_attn ...
  diverges with relative error 6.19e-09 ...; an error this small is typically float32 rounding"; the config it
  shows holds rope_theta=63496.0: the base read from the tables rounded (tables.base_of or rope, as far as can be
  told quickly).
- f45_dynamic_ntk_llama (max_position_embeddings 8): "RoPE scaled as the module's config states: dynamic, base
  10000", yet judged at max_len=64, not the config's 8, so the reference stays plain RoPE at the probes' lengths:
  unexplained at model.layers.0.self_attn (session.py's cfg.max_len, not read from the config).
- f45_longrope_phi3: the same, longrope read from the config, judged at max_len=64 (the length factor 64 / 8 and
  its attention factor are not the config's 32 / 8): unexplained at model.layers.0.self_attn.
- f45_yarn_llama.attention_factor_left_off_second_layer: unexplained at model.layers.1.self_attn, no id (no
  wrong_scale variant of a factor m^2 on the scores).
- f45_pi_llama.positions_times_factor_second_layer and f45_xpos_llama: "unexplained: ... diverges ...; not
  expressible by the config and no catalogue variant reproduces it", the place right, no op named (no pair
  expected, said with cos / pow).
- f45_longrope_phi3.short_factors_past_original_second_layer: unexplained at model.layers.0.self_attn, the first
  layer's (correct) LongRoPE already judged under max_len=64 as in f45_longrope_phi3.

Fixed since: a RoPE base is read from a table computed in float64 to float64's precision (tables.rope_table tries
the base read unrounded and keeps the one that gives the table to float64's precision before one that gives it to
float32's); the max length (and Phi-3's top-level original length) of the config that states a scaled RoPE is the
reference's max_len (tables.stated_scaling); a scaled RoPE's attention factor left off cos and sin is the new
catalogue entry rope.attention_factor_missing; an attention whose recorded cos and sin turn at angles t w_i with
frequencies none of the reference's under the config is said as no pair at that attention, with both frequency
lists read as base^(-2i/d) times or divided by what (divergence._other_angles: "times 4" where the reference's
linear scaling divides by 4; the short factors where it reads the long ones); the turned queries multiplied by a
table the forward makes (xPos's decay, a pow) is said as no pair naming that op (unsupported._turned_then_scaled).
The expected words stay "cos" (the op the angles feed) and "pow" (the op that makes xPos's table).

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

D, H, KV, V = 32, 4, 2, 29
HD = D // H

LINEAR = {"rope_type": "linear", "factor": 4.0}
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8, "beta_fast": 32, "beta_slow": 1}
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0, 1.1, 1.3, 1.7],
    "long_factor": [1.0, 2.5, 6.0, 12.0],
    "original_max_position_embeddings": 8,
}


@dataclass
class LlamaConfig:
    """The fields a long-context repo copies from transformers' LlamaConfig."""

    vocab_size: int = V
    hidden_size: int = D
    num_attention_heads: int = H
    num_key_value_heads: int = KV
    num_hidden_layers: int = 2
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32
    rope_scaling: dict | None = None
    kind: str = "default"  # which hand-written scaling the rotary runs (not read by transformers)
    bugs: dict = field(default_factory=dict)  # layer index -> the mistake written in that layer


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains moved off their 1s, so that a trained model's values are checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


# -- the hand-written frequencies: (inverse frequencies (d/2,), factor on cos and sin) for a sequence of T -------


def plain_inv_freq(base: float, d: int = HD) -> torch.Tensor:
    return 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)


def linear_freqs(cfg: LlamaConfig, T: int, d: int = HD) -> tuple[torch.Tensor, float]:
    """Position interpolation: t / factor, the same as every frequency / factor."""
    return plain_inv_freq(cfg.rope_theta, d) / cfg.rope_scaling["factor"], 1.0


def ntk_freqs(cfg: LlamaConfig, T: int, d: int = HD, factor: float = 4.0) -> tuple[torch.Tensor, float]:
    """NTK-aware: the base raised so that the lowest frequency is interpolated by the factor."""
    return plain_inv_freq(cfg.rope_theta * factor ** (d / (d - 2)), d), 1.0


def dynamic_freqs(cfg: LlamaConfig, T: int, d: int = HD) -> tuple[torch.Tensor, float]:
    """Dynamic NTK: past max_position_embeddings the base grows with the length; up to it, plain RoPE."""
    base, limit, factor = cfg.rope_theta, cfg.max_position_embeddings, cfg.rope_scaling["factor"]
    if T > limit:
        base = base * ((factor * T / limit) - (factor - 1)) ** (d / (d - 2))
    return plain_inv_freq(base, d), 1.0


def yarn_freqs(cfg: LlamaConfig, T: int, d: int = HD) -> tuple[torch.Tensor, float]:
    """YaRN: a ramp over the dimensions by how many turns each makes over the original length."""
    rs = cfg.rope_scaling
    s, orig, base = rs["factor"], rs["original_max_position_embeddings"], cfg.rope_theta

    def dim_of(turns: float) -> float:
        return (d * math.log(orig / (turns * 2 * math.pi))) / (2 * math.log(base))

    lo = max(math.floor(dim_of(rs["beta_fast"])), 0)
    hi = min(math.ceil(dim_of(rs["beta_slow"])), d - 1)
    if lo == hi:
        hi += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
    extrapolate = 1 - ramp
    pos_freqs = plain_inv_freq(base, d)
    inv = (pos_freqs / s) * (1 - extrapolate) + pos_freqs * extrapolate
    return inv, 0.1 * math.log(s) + 1.0


def llama3_freqs(cfg: LlamaConfig, T: int, d: int = HD) -> tuple[torch.Tensor, float]:
    """Llama 3.1: long wavelengths interpolated, short ones kept, a smooth blend between."""
    rs = cfg.rope_scaling
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    inv = plain_inv_freq(cfg.rope_theta, d)
    wavelen = 2 * math.pi / inv
    out = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return torch.where(medium, smoothed, out), 1.0


def longrope_freqs(cfg: LlamaConfig, T: int, d: int = HD, short_always: bool = False) -> tuple[torch.Tensor, float]:
    """Phi-3's LongRoPE: divisors per frequency, the long list past the original length; sqrt(1 + ln s / ln orig)."""
    rs = cfg.rope_scaling
    orig = rs["original_max_position_embeddings"]
    factors = rs["long_factor"] if T > orig and not short_always else rs["short_factor"]
    scale = cfg.max_position_embeddings / orig
    inv = plain_inv_freq(cfg.rope_theta, d) / torch.tensor(factors, dtype=torch.float64)
    return inv, math.sqrt(1 + math.log(scale) / math.log(orig))


FREQS = {
    "default": lambda cfg, T: (plain_inv_freq(cfg.rope_theta), 1.0),
    "linear": linear_freqs,
    "ntk": ntk_freqs,
    "dynamic": dynamic_freqs,
    "yarn": yarn_freqs,
    "llama3": llama3_freqs,
    "longrope": longrope_freqs,
}


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """The (2i, 2i + 1) pairing: the mixed-pairing mistake's keys."""
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class ScaledRopeAttention(nn.Module):
    """Grouped-query attention; cos and sin made in the forward for the sequence's length by the config's kind."""

    def __init__(self, config: LlamaConfig, layer_idx: int) -> None:
        super().__init__()
        self.config, self.bug = config, config.bugs.get(layer_idx, "")
        self.q_proj = nn.Linear(D, H * HD, bias=False)
        self.k_proj = nn.Linear(D, KV * HD, bias=False)
        self.v_proj = nn.Linear(D, KV * HD, bias=False)
        self.o_proj = nn.Linear(H * HD, D, bias=False)

    def cos_sin(self, T: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """cos, sin (T + 1, HD) of positions 0..T at the frequencies of a sequence of T, and those positions; the
        bugs of the linear and LongRoPE kinds written here."""
        cfg = self.config
        if self.bug == "short_always":
            inv, m = longrope_freqs(cfg, T, short_always=True)
        else:
            inv, m = FREQS[cfg.kind](cfg, T)
        if self.bug == "no_mscale":
            m = 1.0
        t = torch.arange(T + 1, dtype=torch.float64)
        if self.bug == "times_factor":  # positions * factor, with the frequencies left plain
            inv, t = plain_inv_freq(cfg.rope_theta), t * cfg.rope_scaling["factor"]
        freqs = torch.outer(t, inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * m).to(device, dtype), (emb.sin() * m).to(device, dtype), t

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, H, HD).transpose(1, 2)
        k = self.k_proj(x).view(B, T, KV, HD).transpose(1, 2)
        v = self.v_proj(x).view(B, T, KV, HD).transpose(1, 2)
        cos, sin, _ = self.cos_sin(T, x.device, x.dtype)
        cq, sq = cos[:T], sin[:T]
        ck, sk = (cos[1:], sin[1:]) if self.bug == "key_offset" else (cq, sq)
        q = q * cq + rotate_half(q) * sq
        if self.bug == "mixed_pairing":
            ck2, sk2 = (torch.stack((c[:, : HD // 2],) * 2, -1).flatten(-2) for c in (ck, sk))
            k = k * ck2 + rotate_pairs(k) * sk2
        else:
            k = k * ck + rotate_half(k) * sk
        if self.bug == "rotate_v":
            v = v * cq + rotate_half(v) * sq
        if self.bug == "tiled":
            k, v = k.repeat(1, H // KV, 1, 1), v.repeat(1, H // KV, 1, 1)
        else:
            k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        scale = 1.0 / HD if self.bug == "head_dim" else None
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, H * HD))


class XPosAttention(ScaledRopeAttention):
    """xPos: the rotated queries times zeta_i^(t / 512) and the keys times zeta_i^(-t / 512), zeta_i = (2i/d + 0.4)
    / 1.4, so that the score decays with the distance per dimension."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, H, HD).transpose(1, 2)
        k = self.k_proj(x).view(B, T, KV, HD).transpose(1, 2)
        v = self.v_proj(x).view(B, T, KV, HD).transpose(1, 2)
        cos, sin, t = self.cos_sin(T, x.device, x.dtype)
        cos, sin, t = cos[:T], sin[:T], t[:T]
        zeta = (torch.arange(0, HD, 2, dtype=torch.float64) + 0.4 * HD) / (1.4 * HD)
        power = (t / 512)[:, None]
        decay = torch.cat((zeta, zeta)) ** power  # (T, HD)
        decay = decay.to(x.dtype)
        q = (q * cos + rotate_half(q) * sin) * decay
        k = (k * cos + rotate_half(k) * sin) / decay
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, H * HD))


class LlamaMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(D, 64, bias=False), nn.Linear(D, 64, bias=False)
        self.down_proj = nn.Linear(64, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, layer_idx: int, attention: type[nn.Module]) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(D, config.rms_norm_eps)
        self.self_attn = attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(D, config.rms_norm_eps)
        self.mlp = LlamaMLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig, attention: type[nn.Module]) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList(DecoderLayer(config, i, attention) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(D, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class LongLlama(nn.Module):
    def __init__(self, config: LlamaConfig, attention: type[nn.Module] = ScaledRopeAttention) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config, attention)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(input_ids))


def _config(kind: str, bug: str = "", **fields) -> LlamaConfig:
    scaling = {"linear": LINEAR, "dynamic": DYNAMIC, "yarn": YARN, "llama3": LLAMA3, "longrope": LONGROPE}
    fields.setdefault("rope_scaling", dict(scaling[kind]) if kind in scaling else None)
    return LlamaConfig(kind=kind, bugs={1: bug} if bug else {}, **fields)


def long_llama(kind: str, bug: str = "", **fields) -> LongLlama:
    torch.manual_seed(0)
    return _jitter(LongLlama(_config(kind, bug, **fields)))


def xpos_llama() -> LongLlama:
    torch.manual_seed(0)
    return _jitter(LongLlama(_config("default"), XPosAttention))


def yarn_attention() -> ScaledRopeAttention:
    torch.manual_seed(0)
    return ScaledRopeAttention(_config("yarn"), 0)


def llama3_layer() -> DecoderLayer:
    torch.manual_seed(0)
    layer = _jitter(DecoderLayer(_config("llama3"), 0, ScaledRopeAttention))
    layer.config = layer.self_attn.config
    return layer


def _checked_against_the_reference() -> dict[str, float]:
    """The largest gap of each hand-written frequency function (and factor) from the reference's own at the same
    settings, over lengths 4 to 40 (below and past the original lengths)."""
    import numpy as np

    from numpy_transformer import attention as A
    from parity_tests.check.tables import read_scaling

    gaps = {}
    for kind in ("linear", "dynamic", "yarn", "llama3", "longrope"):
        cfg = _config(kind, max_position_embeddings=8 if kind == "dynamic" else 32)
        s = read_scaling(cfg.rope_scaling, "rope_scaling")
        gap = 0.0
        for T in range(4, 41):
            ours, m = FREQS[kind](cfg, T)
            ref, mr = A.rope_frequencies(HD, cfg.rope_theta, s, cfg.max_position_embeddings, T)
            gap = max(gap, float(np.abs(ours.numpy() - ref).max()), abs(m - mr))
        gaps[kind] = gap
    ntk, _ = ntk_freqs(_config("default"), 8)
    gaps["ntk"] = float((ntk - plain_inv_freq(10000.0 * 4.0 ** (HD / (HD - 2)))).abs().max())
    return gaps


SELF_ATTN = "model.layers.1.self_attn"

CASES = [
    ("f45_pi_llama", lambda: long_llama("linear"), "transformer_lm", {}, "pass"),
    ("f45_ntk_llama", lambda: long_llama("ntk"), "transformer_lm", {}, "pass"),
    ("f45_dynamic_ntk_llama", lambda: long_llama("dynamic", max_position_embeddings=8), "transformer_lm", {}, "pass"),
    ("f45_yarn_llama", lambda: long_llama("yarn"), "transformer_lm", {}, "pass"),
    ("f45_llama31", lambda: long_llama("llama3"), "transformer_lm", {}, "pass"),
    ("f45_longrope_phi3", lambda: long_llama("longrope"), "transformer_lm", {}, "pass"),
    ("f45_base500k_llama", lambda: long_llama("default", rope_theta=500000.0), "transformer_lm", {}, "pass"),
    ("f45_yarn.attention", yarn_attention, "multi_head_attention", {}, "pass"),
    ("f45_llama31.decoder_layer", llama3_layer, "decoder_only_layer", {}, "pass"),
    (
        "f45_llama31.values_rotated_second_layer",
        lambda: long_llama("llama3", "rotate_v"),
        "transformer_lm",
        {},
        ("mistake", "rope.applied_to_v", SELF_ATTN),
    ),
    (
        "f45_dynamic_ntk_llama.keys_one_ahead_second_layer",
        lambda: long_llama("dynamic", "key_offset", max_position_embeddings=8),
        "transformer_lm",
        {},
        ("mistake", "rope.position_offset", SELF_ATTN),
    ),
    (
        "f45_yarn_llama.keys_in_pairs_second_layer",
        lambda: long_llama("yarn", "mixed_pairing"),
        "transformer_lm",
        {},
        ("mistake", "rope.mixed_pairing", SELF_ATTN),
    ),
    (
        "f45_base500k_llama.scaled_by_head_dim_second_layer",
        lambda: long_llama("default", "head_dim", rope_theta=500000.0),
        "transformer_lm",
        {},
        ("mistake", "attention.wrong_scale", SELF_ATTN),
    ),
    (
        "f45_ntk_llama.kv_heads_tiled_second_layer",
        lambda: long_llama("ntk", "tiled"),
        "transformer_lm",
        {},
        ("mistake", "attention.kv_heads_tiled", SELF_ATTN),
    ),
    (
        "f45_yarn_llama.attention_factor_left_off_second_layer",
        lambda: long_llama("yarn", "no_mscale"),
        "transformer_lm",
        {},
        ("mistake", "rope.attention_factor_missing", SELF_ATTN),
    ),
    (
        "f45_longrope_phi3.attention_factor_left_off_second_layer",
        lambda: long_llama("longrope", "no_mscale"),
        "transformer_lm",
        {},
        ("mistake", "rope.attention_factor_missing", SELF_ATTN),
    ),
    (
        "f45_pi_llama.positions_times_factor_second_layer",
        lambda: long_llama("linear", "times_factor"),
        "transformer_lm",
        {},
        ("no pair", SELF_ATTN, "cos"),
    ),
    (
        "f45_longrope_phi3.short_factors_past_original_second_layer",
        lambda: long_llama("longrope", "short_always"),
        "transformer_lm",
        {},
        ("no pair", SELF_ATTN, "cos"),
    ),
    ("f45_xpos_llama", xpos_llama, "transformer_lm", {}, ("no pair", "model.layers.0.self_attn", "pow")),
]
