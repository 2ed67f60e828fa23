"""Building blocks: the sinusoidal position table, rotary position embedding, dropout with optional
given keep-masks, the position-wise feed-forward block (plain or gated), the norm the config asks
for, and the residual sublayer (pre- or post-norm).

Shape letters: B batch, H heads, T sequence, D d_model, Dh head size, F d_ff.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_spec.config import RopeScaling

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,  # exact: x * Phi(x), with the normal CDF written through erf
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,  # x * sigmoid(x), "swish"
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),  # QuickGELU (CLIP's)
}


def sinusoidal_table(
    max_len: int,
    d_model: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    layout: str = "interleaved",
) -> Tensor:
    """The paper's fixed positional encoding (section 3.5), shape (max_len, D).

        PE[pos, 2i]   = sin(pos / 10000**(2i / D))
        PE[pos, 2i+1] = cos(pos / 10000**(2i / D))

    layout "interleaved" is the paper's, as written; "split" (Marian's) holds every sine first, then
    every cosine. Computed in float64 and then cast to `dtype`, so a float64 model gets the table to
    full precision. For odd D the table is built with D + 1 columns (the exponent still uses D) and
    the last (cosine) column is dropped.
    """
    position = torch.arange(max_len, dtype=torch.float64, device=device)[:, None]  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device=device)  # (ceil(D / 2),)
    angle = position / 10000.0 ** (two_i / d_model)  # (max_len, ceil(D / 2))
    if layout == "split":
        # ceil(D / 2) sines, then floor(D / 2) cosines.
        table = torch.cat([angle.sin(), angle[:, : d_model // 2].cos()], dim=-1)  # (max_len, D)
    elif layout == "interleaved":
        # Column 2i holds sin, column 2i + 1 holds cos of the same angle.
        table = torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1)  # (max_len, 2 * ceil(D / 2))
    else:
        raise ValueError(f"layout must be 'interleaved' or 'split', got {layout!r}")
    return table[:, :d_model].to(dtype)  # (max_len, D)


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last axis: Hugging Face's rotary layout."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(
    start: int,
    end: int,
    head_dim: int,
    theta: float,
    dtype: torch.dtype,
    device: torch.device | str | None,
    scaling: RopeScaling | None = None,
    max_len: int = 0,
) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotary angles of positions start .. end - 1, each (T, Dh): the angle of feature i
    and of feature i + Dh/2 is pos * theta**(-2i / Dh) (or its scaled frequency, rope_inv_freq). Computed in
    float64, then cast to `dtype`."""
    positions = torch.arange(start, end, device=device)
    return rope_cos_sin_at(positions, head_dim, theta, dtype, scaling, max_len)


def rope_cos_sin_at(
    positions: Tensor,
    head_dim: int,
    theta: float,
    dtype: torch.dtype,
    scaling: RopeScaling | None = None,
    max_len: int = 0,
) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotary angles of `positions` (T,) or (B, T) (each row its own, a padded batch), each
    (T, Dh) or (B, 1, T, Dh) (broadcast over the heads), times the scaling's attention factor (rope_inv_freq: the
    frequencies of a sequence reaching the largest position). Computed in float64, then cast to `dtype`."""
    seq_len = 0  # read only where the frequencies depend on it: a host read breaks torch.compile's graph
    if scaling is not None and scaling.depends_on_length and positions.numel():
        seq_len = int(positions.max()) + 1
    inv_freq, factor = rope_inv_freq(head_dim, theta, scaling, max_len, seq_len, positions.device)
    angles = positions.to(torch.float64)[..., None] * inv_freq  # (..., T, Dh/2)
    angles = torch.cat([angles, angles], dim=-1)  # (..., T, Dh): the same angle for i and i + Dh/2
    if positions.dim() == 2:
        angles = angles[:, None]  # (B, 1, T, Dh)
    return (angles.cos() * factor).to(dtype), (angles.sin() * factor).to(dtype)


def rope_inv_freq(
    dim: int, theta: float, scaling: RopeScaling | None, max_len: int, seq_len: int, device=None
) -> tuple[Tensor, float]:
    """The inverse frequencies (dim/2,) float64 of RoPE at base theta, and the factor on cos and sin: plain
    theta**(-2i/dim) and 1, or scaled as transformers' kinds scale them (RopeScaling: linear, dynamic NTK, YaRN,
    LongRoPE, Llama 3) for a sequence of seq_len positions in a model of max_len positions."""
    exponents = torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim
    inv_freq = theta**-exponents
    if scaling is None:
        return inv_freq, 1.0
    kind, f = scaling.rope_type, scaling.length_factor(max_len)
    original = scaling.original_length(max_len)
    if kind == "linear":
        return inv_freq / f, 1.0
    if kind == "dynamic":  # NTK: the base grows with the length past max_len
        length = max(seq_len, max_len)
        return (theta * (f * length / max_len - (f - 1)) ** (dim / (dim - 2))) ** -exponents, 1.0
    if kind == "llama3":
        wavelength = 2 * math.pi / inv_freq
        low, high = scaling.low_freq_factor or 1.0, scaling.high_freq_factor or 4.0  # (both validated present)
        smooth = (original / wavelength - low) / (high - low)
        blend = torch.lerp(inv_freq / f, inv_freq, smooth)
        blend = torch.where(wavelength < original / high, inv_freq, blend)
        return torch.where(wavelength > original / low, inv_freq / f, blend), 1.0
    if kind == "longrope":
        factors = (scaling.long_factor if seq_len > original else scaling.short_factor) or ()
        attention = scaling.attention_factor
        if attention is None:
            attention = math.sqrt(1 + math.log(f) / math.log(original)) if f > 1 else 1.0
        return inv_freq / torch.tensor(factors, dtype=torch.float64, device=device), attention
    return yarn_inv_freq(inv_freq, dim, theta, scaling, f, original)


def yarn_inv_freq(
    inv_freq: Tensor, dim: int, theta: float, scaling: RopeScaling, f: float, original: int
) -> tuple[Tensor, float]:
    """YaRN: the frequencies interpolated (/ f) below a linear ramp between the dimensions turning beta_fast and
    beta_slow times over the original length, kept above it; the attention factor from mscale."""

    def mscale(m: float) -> float:
        return 0.1 * m * math.log(f) + 1.0 if f > 1 else 1.0

    attention = scaling.attention_factor
    if attention is None:
        m, m_all = scaling.mscale, scaling.mscale_all_dim
        attention = mscale(m) / mscale(m_all) if m and m_all else mscale(1.0)
    rotations = torch.tensor([scaling.beta_fast or 32, scaling.beta_slow or 1], dtype=torch.float64)
    ends = dim * torch.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))
    if scaling.truncate is not False:
        ends = torch.stack([ends[0].floor(), ends[1].ceil()])
    low, high = max(ends[0].item(), 0), min(ends[1].item(), dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(dim // 2, dtype=torch.float64, device=inv_freq.device) - low) / (high - low)).clamp(0, 1)
    return torch.lerp(inv_freq, inv_freq / f, ramp), float(attention)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary position embedding of x (B, H, T, Dh) with cos, sin (T, R): x cos + rotate_half(x) sin on the first R
    features (R = Dh, or fewer: partial rotary, GPT-NeoX), the rest unchanged."""
    rotated, rest = x[..., : cos.shape[-1]], x[..., cos.shape[-1] :]
    return torch.cat([rotated * cos + rotate_half(rotated) * sin, rest], dim=-1)


def init_linear(linear: nn.Linear) -> nn.Linear:
    """Xavier-uniform weight and zero bias (when there is one), the usual Transformer initialisation."""
    nn.init.xavier_uniform_(linear.weight)
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)
    return linear


class OffsetRMSNorm(nn.RMSNorm):
    """Gemma's RMSNorm: the parameter `weight` is the gain's offset from one, y = rms_norm(x) * (1 + weight); it
    starts at zero, the unit gain."""

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.zeros_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.normalized_shape, 1.0 + self.weight, self.eps)


def rms_norm(dim: int, eps: float, kind: str = "rms") -> nn.Module:
    """An RMSNorm over the last `dim` features: `nn.RMSNorm` (kind "rms") or Gemma's OffsetRMSNorm ("rms_offset")."""
    return OffsetRMSNorm(dim, eps=eps) if kind == "rms_offset" else nn.RMSNorm(dim, eps=eps)


def make_norm(config) -> nn.Module:
    """The norm the config asks for: `nn.LayerNorm` (weight and bias; weight only when config.norm_bias is False),
    `nn.RMSNorm` (weight only) or Gemma's OffsetRMSNorm (weight only, the gain 1 + weight)."""
    if config.norm in ("rms", "rms_offset"):
        return rms_norm(config.d_model, config.layer_norm_eps, config.norm)
    return nn.LayerNorm(config.d_model, eps=config.layer_norm_eps, bias=config.norm_bias)


class Dropout(nn.Dropout):
    """`nn.Dropout` that can also be handed the units to keep.

    With `keep_mask` (boolean, True = keep, the shape of `x`) it computes `x * keep_mask / (1 - p)`,
    so that another implementation given the same mask drops exactly the same units. Without it,
    it is `F.dropout`. In eval mode, or with p == 0, it is the identity and `keep_mask` is ignored.
    """

    def forward(self, x: Tensor, keep_mask: Tensor | None = None) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if keep_mask is None:
            return F.dropout(x, self.p, training=True)
        keep_mask = torch.as_tensor(keep_mask, device=x.device)
        if keep_mask.dtype != torch.bool:
            raise TypeError(f"dropout keep_mask must be a boolean tensor (True = keep), got {keep_mask.dtype}")
        if keep_mask.shape != x.shape:
            raise ValueError(f"dropout keep_mask has shape {tuple(keep_mask.shape)}, expected {tuple(x.shape)}")
        return x * keep_mask.to(x.dtype) / (1.0 - self.p)


def masks_under(dropout_masks: Mapping[str, Tensor] | None, prefix: str) -> dict[str, Tensor]:
    """The entries of `dropout_masks` whose site name starts with `prefix`, with the prefix removed.

    The model receives keep-masks keyed by full site name ("decoder.layers.1.ffn.dropout"); each
    module hands its children the part of the dict below them ("layers.1." -> "ffn.dropout").
    """
    if not dropout_masks:
        return {}
    return {name[len(prefix) :]: mask for name, mask in dropout_masks.items() if name.startswith(prefix)}


class FeedForward(nn.Module):
    """Position-wise feed-forward block (section 3.3): `linear2(dropout(act(linear1(x))))`, or with
    `gated` (Llama's SwiGLU when the activation is silu) `linear2(dropout(act(gate(x)) * linear1(x)))`.

    Inputs: x (B, T, D); `dropout_mask` an optional keep-mask (B, T, F) for the hidden units.
    Returns: (B, T, D).
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        activation: str = "relu",
        dropout: float = 0.0,
        gated: bool = False,
        bias: bool = True,
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {tuple(ACTIVATIONS)}, got {activation!r}")
        self.activation = activation
        self.gate = init_linear(nn.Linear(d_model, d_ff, bias=bias)) if gated else None
        self.linear1 = init_linear(nn.Linear(d_model, d_ff, bias=bias))  # Llama's up_proj when gated
        self.linear2 = init_linear(nn.Linear(d_ff, d_model, bias=bias))  # down_proj
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor, dropout_mask: Tensor | None = None) -> Tensor:
        act = ACTIVATIONS[self.activation]
        if self.gate is None:
            hidden = act(self.linear1(x))  # (B, T, F)
        else:
            hidden = act(self.gate(x)) * self.linear1(x)  # (B, T, F)
        return self.linear2(self.dropout(hidden, dropout_mask))  # (B, T, D)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}, gated={self.gate is not None}"


def residual(
    x: Tensor,
    sublayer: Callable[[Tensor], Tensor],
    norm: nn.Module,
    dropout: Dropout,
    norm_first: bool,
    dropout_mask: Tensor | None = None,
    post_norm: nn.Module | None = None,
) -> Tensor:
    """One residual sublayer around `sublayer` (attention or feed-forward), x (B, T, D) -> (B, T, D).

    post-norm (the paper, norm_first False): norm(x + dropout(sublayer(x)))
    pre-norm  (norm_first True):             x + dropout(sublayer(norm(x)))
    sandwich  (Gemma, post_norm given):      x + dropout(post_norm(sublayer(norm(x))))
    with `norm` an `nn.LayerNorm` or an `nn.RMSNorm`.
    """
    if post_norm is not None:
        return x + dropout(post_norm(sublayer(norm(x))), dropout_mask)
    if norm_first:
        return x + dropout(sublayer(norm(x)), dropout_mask)
    return norm(x + dropout(sublayer(x), dropout_mask))
