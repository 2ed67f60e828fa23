"""Weights used through a transform, as 2025-26 fine-tuning and inference code writes them (issue 46, round 19), in
this project's own words; the judge meets them here first (measured with it frozen).

- a Llama whose every layer projection is a GPTQ/AWQ-like packed int4 linear: eight 4-bit values per int32
  (`qweight`, packed along the input features), unpacked in the forward by shifts and masks, with per-group scales
  (float16) and packed zero points, groups of 8 input features; the weight computed is (q - z) s, an (in, out)
  matrix the input is multiplied by (`x @ w`);
- a Llama whose every layer projection is a bitsandbytes-like 4-bit normal float (NF4-like) linear: two indices
  into a 16-level code (quantiles of a normal, own levels) per uint8 of a `(n / 2, 1)` buffer (bitsandbytes'
  layout), one absmax per block of 8 weights, the weight `code[index] * absmax` computed in the forward;
- a GPT whose every linear holds a bitsandbytes-like row-wise absmax int8 weight `CB` and its row absmax `SCB`,
  dequantized BEFORE the product, `F.linear(x, CB.float() * SCB[:, None] / 127, bias)`;
- a Llama whose projections store bfloat16 weights (a frozen base in a fine-tune) and cast them to the input's dtype
  in the forward, `F.linear(x, self.weight.to(x.dtype))`. The judge runs float64 and float32: a bfloat16 value is
  exact in both, so in either run the forward multiplies by exactly the stored values, and the model is the Llama
  of those weights in both (pass; whether the judge casts the module or only the input, the product is the same);
- a GPT with `torch.nn.utils.parametrizations.weight_norm` on every Linear, its head included (weight = g v / |v|,
  g moved off |v| as training leaves it, so the transform matters; fresh3's weight-normed GPT keeps g = |v| and a
  plain head);
- a QLoRA Llama: the packed int4 base plus LoRA A (in -> r) and B (r -> out) at alpha / r = 4, unmerged, B nonzero
  (a trained adapter): y = base(x) + 4 B A x;
- a DoRA GPT: each linear's weight is m (W + s B A) / |W + s B A| with the norm taken per output feature (the
  paper's column norm of the (in, out) matrix), m a learned magnitude vector; the norm is kept in the graph (not
  detached), so the forward is the linear of that weight and its gradient the chain rule's;
- a GPT whose head is tied to the token table through `torch.nn.utils.parametrize`: a parametrization on the head's
  weight that returns the embedding's weight (the head's own tensor unused);
- a Llama whose RMSNorms store their scale as a log (`weight = exp(log_w)`);
- catalogued mistakes put inside these models, each in the second layer or block: K/V heads tiled and eps outside
  the root in the int4 Llama; a keep-mask one band too wide (each query sees the next key) in the NF4 Llama; scores
  scaled by 1 / head_dim in the int8 GPT; silu on up in the bfloat16 Llama; the softmax over the queries in the
  weight-normed GPT; RoPE on the values in the QLoRA Llama; no causal mask in the DoRA GPT; the mask applied after
  the softmax in the tied GPT; eps outside the root in a log-scale norm;
- math the reference lacks: the int8 GPT's second MLP input quantized too (LLM.int8-like W8A8: each row of the
  activations rounded to int8 at its own absmax, `round(x * 127 / absmax) * absmax / 127`): the product is of a
  rounded input, a function the reference has no pair for (said at that linear, naming the rounding).

Expected verdicts decided from the math before the judge ran, each correct model checked by hand (check_by_hand,
run as a script): the NF4 linear equals x @ w.T of its looked-up weight, within a quarter of the largest weight of
the weight it was made from; the packed int4 linear equals x @ ((q - z) s) of the unpacked integers to 0 in
float64; the int8 linear the float64 linear of CB SCB / 127; the DoRA linear the linear of its computed weight; the
QLoRA linear the int4 linear plus 4 B A x; weight_norm's weight g v / |v|; the tied head's weight is the embedding's
tensor itself; the log-scale norm's weight exp(log_w); the W8A8 linear differs from the plain one by 6.5e-3
relative (the rounding), so a judge that passed it would miss a real change.

First met: 10 of 20 right. Wrong:

- int4_llama and its two mistakes: "could not judge: the module's forward could not be recorded ... (its forward
  raised RuntimeError: expected m1 and m2 to have the same dtype, but got: float != c10::Half); pass call= ... or
  mapping=". The model runs in float32 and float64; the judge's computed weight (running.computed_weights) is
  registered in the dtype of the module's first floating buffer, the float16 scales, and the product then meets a
  float16 weight. Measured: with the scales stored in float32 the same model passes and its tiled heads are named.
- qlora_llama and its RoPE on the values: the same refusal (the int4 base's float16 scales); with float32 scales,
  "could not judge: cannot read layers.0.self_attn.q_proj.base_layer.weight (32 rows) as the q projection(s) ...;
  pass mapping=" (the adapter over a base that is no nn.Linear is not merged: running.merged_adapters looks for
  three nn.Linear).
- dora_gpt and its missing causal mask: "differs at h.0.attn: the attention's queries and keys and values are no
  projection's output ..., which the reference has no pair for": F.linear of a weight computed from parameters
  (m, W, A, B) in a module with submodules is not read as a projection (running.computing takes only leaf modules
  of buffers).
- logscale_llama and its eps outside the root: "differs at layers.0.input_layernorm: x * rsqrt(mean(x^2) + eps)
  normalises without a weight (no learned scale), which the reference has no pair for": exp(log_w) is not read as
  the norm's weight.
- int8_gpt.activations_rounded_second_block: no id, no op: "unexplained: h.1.mlp (reference decoder.layers.1.ffn)
  diverges ...; not expressible by the config and no catalogue variant reproduces it" (the place near, the
  rounding not named).

Right, with remarks: int8_gpt passes with a caveat "dtype.float32_island ... torch.mul with a float32 operand" at
every int8 linear, though `CB.float()` of int8 integers is exact and the product is taken in float64;
param_tied_gpt passes with "tie_embeddings=False" printed (the parametrization removed leaves the head its own
parameter, so the tie is judged as two tables). The NF4 Llama passes as written; measured beside it, the same
model with its packed indices in a flat (n / 2,) buffer gets "differs at layers.0.self_attn: the attention's
queries and keys and values are no projection's output" (running.computing reads only modules holding a buffer of
2+ axes).

Fixed since: 20 of 20. A weight the forward computes from a module's own tensors is kept in the dtype the product
reads it in (not its float16 scales'); a scale a leaf norm computes from its own parameter and multiplies the
normed x by (exp(log_w)) is read as that norm's weight (running.computed_weights); a submodule measured to compute
x W^T + b (on random inputs, in float64) from a W none of its tensors holds, its backward checked by finite
differences, is judged as the nn.Linear of W and b (running.linear_maps: DoRA, an adapter over an int4 base); a
tensor rounded to a grid that a projection multiplies is named where it is rounded (unsupported._rounded); a
parametrization returning another tensor the model holds stays that tensor (the tied head judged with
tie_embeddings=True). int8_gpt keeps its float32_island caveat (whole float32 numbers mixed into a float64 op are
also how a float32 table made earlier shows itself, so the caveat was left).

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations, parametrize

D, H, KV, V, T_MAX = 32, 4, 2, 26, 16
HD = D // H
F_FF = 64
GROUP = 8  # the int4 linears' group of input features sharing a scale and zero point
RANK, ALPHA = 4, 16.0


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases moved off their 1s and 0s, so that trained values are what is checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _weight(d_in: int, d_out: int) -> torch.Tensor:
    return torch.randn(d_out, d_in) / math.sqrt(d_in)


# -- the linears: packed int4, row-wise int8, bfloat16, QLoRA, DoRA ---------------------------------------------------


def _pack(q: torch.Tensor, axis: int) -> torch.Tensor:
    """4-bit integers (0..15) packed eight to an int32 along `axis`: value j of a word at bits 4j .. 4j + 3."""
    q = q.movedim(axis, 0).to(torch.int32)
    q = q.reshape(q.shape[0] // 8, 8, *q.shape[1:])
    packed = torch.zeros(q.shape[0], *q.shape[2:], dtype=torch.int32)
    for j in range(8):
        packed |= q[:, j] << (4 * j)  # the top nibble wraps into the sign bit, as GPTQ's packing does
    return packed.movedim(0, axis)


class Int4Linear(nn.Module):
    """GPTQ-like: `qweight` (in / 8, out) int32, `qzeros` (groups, out / 8) int32, `scales` (groups, out) float16;
    w[i, o] = (q[i, o] - z[i // 8, o]) * s[i // 8, o], and y = x @ w."""

    def __init__(self, d_in: int, d_out: int, weight: torch.Tensor | None = None):
        super().__init__()
        self.d_in, self.d_out = d_in, d_out
        w = _weight(d_in, d_out) if weight is None else weight
        w = w.T.reshape(d_in // GROUP, GROUP, d_out)  # (groups, 8, out)
        low, high = w.amin(1), w.amax(1)
        scales = ((high - low) / 15).half()
        zeros = torch.round(-low / scales.float()).clamp(0, 15)
        q = (torch.round(w / scales.float()[:, None]) + zeros[:, None]).clamp(0, 15).reshape(d_in, d_out)
        self.register_buffer("qweight", _pack(q, 0))
        self.register_buffer("qzeros", _pack(zeros, 1))
        self.register_buffer("scales", scales)
        self.register_buffer("shifts", torch.arange(0, 32, 4, dtype=torch.int32), persistent=False)

    def unpacked(self) -> tuple[torch.Tensor, torch.Tensor]:
        q = (self.qweight[:, None, :] >> self.shifts[None, :, None]) & 0xF  # (in / 8, 8, out)
        z = (self.qzeros[:, :, None] >> self.shifts[None, None, :]) & 0xF  # (groups, out / 8, 8)
        return q.reshape(self.d_in, self.d_out), z.reshape(-1, self.d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, z = self.unpacked()
        z = z.repeat_interleave(GROUP, dim=0)
        s = self.scales.to(x.dtype).repeat_interleave(GROUP, dim=0)
        return x @ ((q.to(x.dtype) - z.to(x.dtype)) * s)


def _normal_code() -> torch.Tensor:
    """16 levels at quantiles of a standard normal, scaled to [-1, 1], 0 among them (an NF4-like code: 8 below 0
    from the lower half's quantiles, 7 above from the upper half's, and 0)."""
    normal = torch.distributions.Normal(0.0, 1.0)
    low = normal.icdf(torch.linspace(0.03, 0.5, 9, dtype=torch.float64)[:-1])
    high = normal.icdf(torch.linspace(0.5, 0.97, 8, dtype=torch.float64)[1:])
    return torch.cat([low / -low[0], torch.zeros(1, dtype=torch.float64), high / high[-1]]).float()


class NF4Linear(nn.Module):
    """bitsandbytes-like 4-bit normal float: `packed` (out * in / 2, 1) uint8 (bitsandbytes' layout), two code
    indices a byte (high nibble first), `absmax` one per block of 8 weights, `code` the 16 levels; w = code[index]
    times the absmax of its block."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.d_in, self.d_out = d_in, d_out
        w = _weight(d_in, d_out).reshape(-1, GROUP)
        absmax = w.abs().amax(1, keepdim=True)
        code = _normal_code()
        index = (w / absmax)[..., None].sub(code).abs().argmin(-1).flatten().to(torch.uint8)
        self.register_buffer("packed", ((index[0::2] << 4) | index[1::2])[:, None])
        self.register_buffer("absmax", absmax.flatten())
        self.register_buffer("code", code)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        index = torch.cat([self.packed >> 4, self.packed & 0xF], -1).flatten().long()
        w = (self.code[index].view(-1, GROUP) * self.absmax[:, None]).view(self.d_out, self.d_in)
        return F.linear(x, w.to(x.dtype))


class Int8Linear(nn.Module):
    """bitsandbytes-like: `CB` (out, in) int8 at the row absmax `SCB` (out,), dequantized before the product.
    `round_input`: the activations rounded too (W8A8), each row at its own absmax (the math the reference lacks)."""

    def __init__(self, d_in: int, d_out: int, bias: bool = True, round_input: bool = False):
        super().__init__()
        w = _weight(d_in, d_out)
        absmax = w.abs().amax(1)
        self.register_buffer("CB", torch.round(w * 127 / absmax[:, None]).to(torch.int8))
        self.register_buffer("SCB", absmax)
        self.bias = nn.Parameter(torch.zeros(d_out)) if bias else None
        self.round_input = round_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.round_input:
            absmax = x.abs().amax(-1, keepdim=True)
            x = torch.round(x * 127 / absmax) * absmax / 127
        w = self.CB.float() * self.SCB[:, None] / 127
        return F.linear(x, w.to(x.dtype), self.bias)


class Bf16Linear(nn.Module):
    """A frozen bfloat16 weight, cast to the input's dtype in the forward."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.weight = nn.Parameter(_weight(d_in, d_out).to(torch.bfloat16), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype))


class QLoRALinear(nn.Module):
    """An int4 base, frozen, and an unmerged LoRA adapter: base(x) + (alpha / r) B(A(dropout(x)))."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.base_layer = Int4Linear(d_in, d_out)
        self.lora_A = nn.Linear(d_in, RANK, bias=False)
        self.lora_B = nn.Linear(RANK, d_out, bias=False)
        nn.init.normal_(self.lora_B.weight, std=0.05)  # trained: B is no longer zero
        self.lora_dropout = nn.Dropout(0.05)
        self.scaling = ALPHA / RANK

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling


class DoRALinear(nn.Module):
    """m (W + s B A) / |W + s B A| (the norm of each output feature's row), W frozen, A, B, m trained."""

    def __init__(self, d_in: int, d_out: int, bias: bool = True):
        super().__init__()
        self.base_layer = nn.Linear(d_in, d_out, bias=bias)
        with torch.no_grad():
            self.base_layer.weight.copy_(_weight(d_in, d_out))
        self.base_layer.weight.requires_grad_(False)
        self.lora_A = nn.Linear(d_in, RANK, bias=False)
        self.lora_B = nn.Linear(RANK, d_out, bias=False)
        nn.init.normal_(self.lora_B.weight, std=0.05)
        self.scaling = ALPHA / RANK
        self.magnitude = nn.Parameter(self.merged().norm(dim=1).detach().clone())

    def merged(self) -> torch.Tensor:
        return self.base_layer.weight + self.scaling * self.lora_B.weight @ self.lora_A.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.merged()
        return F.linear(x, self.magnitude[:, None] * w / w.norm(dim=1, keepdim=True), self.base_layer.bias)


def _weight_normed(d_in: int, d_out: int, bias: bool = True) -> nn.Module:
    linear = nn.Linear(d_in, d_out, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(_weight(d_in, d_out))
    linear = parametrizations.weight_norm(linear)
    with torch.no_grad():  # trained: g is no longer |v|
        g = linear.parametrizations.weight.original0
        g.mul_(1 + 0.2 * torch.randn_like(g))
    return linear


def _plain(d_in: int, d_out: int, bias: bool = True) -> nn.Module:
    linear = nn.Linear(d_in, d_out, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(_weight(d_in, d_out))
    return linear


# -- a Llama of a chosen linear and norm; flags for the second layer's mistakes ----------------------------------------


def _rope(x: torch.Tensor) -> torch.Tensor:
    """RoPE in halves (i, i + d / 2) at positions 0 .. T - 1, base 10000."""
    T, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(x.dtype), torch.cat([angles.sin()] * 2, -1).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight; `log_scale`: the weight stored as its log, weight = exp(log_w);
    `eps_outside`: the mistake, x / (sqrt(mean(x^2)) + eps)."""

    def __init__(self, log_scale: bool = False, eps_outside: bool = False, eps: float = 1e-5):
        super().__init__()
        if log_scale:
            self.log_w = nn.Parameter(torch.zeros(D))
        else:
            self.weight = nn.Parameter(torch.ones(D))
        self.log_scale, self.eps_outside, self.eps = log_scale, eps_outside, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.log_w.exp() if self.log_scale else self.weight
        ms = x.pow(2).mean(-1, keepdim=True)
        if self.eps_outside:
            return x / (ms.sqrt() + self.eps) * w
        return x * torch.rsqrt(ms + self.eps) * w


class LlamaAttention(nn.Module):
    def __init__(self, linear, tiled: bool = False, rope_v: bool = False, shows_next: bool = False):
        super().__init__()
        self.q_proj, self.k_proj = linear(D, D), linear(D, KV * HD)
        self.v_proj, self.o_proj = linear(D, KV * HD), linear(D, D)
        self.tiled, self.rope_v, self.shows_next = tiled, rope_v, shows_next

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = _rope(self.q_proj(x).view(B, T, H, HD).transpose(1, 2))
        k = _rope(self.k_proj(x).view(B, T, KV, HD).transpose(1, 2))
        v = self.v_proj(x).view(B, T, KV, HD).transpose(1, 2)
        v = _rope(v) if self.rope_v else v  # the mistake: the values turned too
        if self.tiled:  # the mistake: heads (0, 1, 0, 1) instead of (0, 0, 1, 1)
            k, v = k.repeat(1, H // KV, 1, 1), v.repeat(1, H // KV, 1, 1)
        else:
            k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
        if self.shows_next:  # the mistake: the keep-mask's band one too wide, each query sees the next key
            keep = torch.ones(T, T, dtype=torch.bool, device=x.device).tril(1)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, D))


class LlamaMLP(nn.Module):
    def __init__(self, linear, on_up: bool = False):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = linear(D, F_FF), linear(D, F_FF), linear(F_FF, D)
        self.on_up = on_up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.on_up:  # the mistake: silu on up instead of the gate
            return self.down_proj(self.gate_proj(x) * F.silu(self.up_proj(x)))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    def __init__(self, linear, log_scale: bool = False, input_eps_outside=False, post_eps_outside=False, **flags):
        super().__init__()
        self.input_layernorm = RMSNorm(log_scale, input_eps_outside)
        self.self_attn = LlamaAttention(linear, **{k: v for k, v in flags.items() if k != "on_up"})
        self.post_attention_layernorm = RMSNorm(log_scale, post_eps_outside)
        self.mlp = LlamaMLP(linear, flags.get("on_up", False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, linear, log_scale: bool = False, **second):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([LlamaLayer(linear, log_scale), LlamaLayer(linear, log_scale, **second)])
        self.norm = RMSNorm(log_scale)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def _no_bias(linear):
    return lambda d_in, d_out: linear(d_in, d_out, bias=False)


def int4_llama(**second) -> Llama:
    torch.manual_seed(0)
    return _jitter(Llama(Int4Linear, **second))  # type: ignore[return-value]


def nf4_llama(**second) -> Llama:
    torch.manual_seed(0)
    return _jitter(Llama(NF4Linear, **second))  # type: ignore[return-value]


def bf16_llama(**second) -> Llama:
    torch.manual_seed(0)
    return _jitter(Llama(Bf16Linear, **second))  # type: ignore[return-value]


def qlora_llama(**second) -> Llama:
    torch.manual_seed(0)
    return _jitter(Llama(QLoRALinear, **second))  # type: ignore[return-value]


def logscale_llama(**second) -> Llama:
    torch.manual_seed(0)
    return _jitter(Llama(_no_bias(_plain), log_scale=True, **second))  # type: ignore[return-value]


# -- a GPT of a chosen linear; flags for the second block's mistakes ---------------------------------------------------


class GPTAttention(nn.Module):
    """Fused c_attn, scores by hand: `scale` (None: 1 / sqrt(head_dim)), `axis` of the softmax, `causal`, `after`
    (the mask applied after the softmax, the mistake)."""

    def __init__(self, linear, scale=None, axis=-1, causal=True, after=False):
        super().__init__()
        self.c_attn, self.c_proj = linear(D, 3 * D), linear(D, D)
        self.scale = HD**-0.5 if scale is None else scale
        self.axis, self.causal, self.after = axis, causal, after

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, H, HD).transpose(1, 2) for t in self.c_attn(x).split(D, -1))
        s = q @ k.transpose(-1, -2) * self.scale
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        if self.after:
            p = s.softmax(-1).masked_fill(future, 0.0)
        else:
            p = (s.masked_fill(future, float("-inf")) if self.causal else s).softmax(self.axis)
        return self.c_proj((p @ v).transpose(1, 2).reshape(B, T, D))


class GPTMLP(nn.Module):
    def __init__(self, linear, fc=None):
        super().__init__()
        self.c_fc, self.c_proj = (fc or linear)(D, 4 * D), linear(4 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class GPTBlock(nn.Module):
    def __init__(self, linear, fc=None, **attn):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(D), GPTAttention(linear, **attn)
        self.ln_2, self.mlp = nn.LayerNorm(D), GPTMLP(linear, fc)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TiedTo(nn.Module):
    """A parametrization returning another module's weight (held in a list, so not registered as a submodule)."""

    def __init__(self, embedding: nn.Embedding):
        super().__init__()
        self.embedding = [embedding]

    def forward(self, _unused: torch.Tensor) -> torch.Tensor:
        return self.embedding[0].weight


class GPT(nn.Module):
    """`head`: "plain", "linear" (the model's linear, e.g. weight-normed) or "tied" (a parametrization on the head's
    weight returning the token table's)."""

    def __init__(self, linear, head: str = "plain", fc=None, **second):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T_MAX, D)
        self.h = nn.ModuleList([GPTBlock(linear), GPTBlock(linear, fc, **second)])
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = linear(D, V, bias=False) if head == "linear" else nn.Linear(D, V, bias=False)
        if head == "tied":
            parametrize.register_parametrization(self.lm_head, "weight", TiedTo(self.wte), unsafe=True)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def int8_gpt(round_second_fc: bool = False, **second) -> GPT:
    torch.manual_seed(0)
    fc = (lambda d_in, d_out: Int8Linear(d_in, d_out, round_input=True)) if round_second_fc else None
    return _jitter(GPT(Int8Linear, fc=fc, **second))  # type: ignore[return-value]


def weight_norm_gpt(**second) -> GPT:
    torch.manual_seed(0)
    return _jitter(GPT(_weight_normed, head="linear", **second))  # type: ignore[return-value]


def dora_gpt(**second) -> GPT:
    torch.manual_seed(0)
    return _jitter(GPT(DoRALinear, **second))  # type: ignore[return-value]


def tied_gpt(**second) -> GPT:
    torch.manual_seed(0)
    return _jitter(GPT(_plain, head="tied", **second))  # type: ignore[return-value]


def check_by_hand() -> None:
    """Each transform computes what the docstring says (float64): asserts, run as a script."""
    torch.manual_seed(1)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    original = _weight(D, 2 * D)
    int4 = Int4Linear(D, 2 * D, original).double()
    q, z = int4.unpacked()
    s = int4.scales.double().repeat_interleave(GROUP, 0)
    w = (q.double() - z.double().repeat_interleave(GROUP, 0)) * s
    assert (int4(x) - x @ w).abs().max() == 0 and q.max() <= 15 and q.min() >= 0
    steps = (w - original.T.double()).abs() / s
    assert steps.mean() < 0.3 and steps.max() < 2, steps.max()  # the weight packed, to its steps
    nf4 = NF4Linear(D, 2 * D).double()
    code = nf4.code
    assert code.shape == (16,) and code.min() == -1 and code.max() == 1 and (code == 0).sum() == 1
    index = torch.cat([nf4.packed >> 4, nf4.packed & 0xF], -1).flatten().long()
    w = (code[index].view(-1, GROUP) * nf4.absmax[:, None]).view(2 * D, D)
    assert torch.allclose(nf4(x), x @ w.T, atol=1e-15)
    torch.manual_seed(2)
    near = NF4Linear(D, 2 * D)
    torch.manual_seed(2)
    gap = (near(torch.eye(D)).T - _weight(D, 2 * D)).abs().max()
    assert gap < 0.25 * _weight(D, 2 * D).abs().max(), gap  # the weight it was made from, to its levels
    int8 = Int8Linear(D, 2 * D).double()
    assert torch.allclose(int8(x), x @ (int8.CB.double() * int8.SCB.double()[:, None] / 127).T, atol=1e-15)
    rounded = Int8Linear(D, 2 * D, round_input=True).double()
    rounded.load_state_dict(int8.state_dict())
    with torch.no_grad():
        gap = float((rounded(x) - int8(x)).abs().max() / int8(x).abs().max())
    assert 1e-4 < gap < 1e-2, gap
    qlora = QLoRALinear(D, 2 * D).double().eval()
    s_ba = ALPHA / RANK * qlora.lora_B.weight @ qlora.lora_A.weight
    assert torch.allclose(qlora(x), qlora.base_layer(x) + x @ s_ba.T, atol=1e-14) and s_ba.abs().max() > 0.01
    dora = DoRALinear(D, 2 * D).double()
    with torch.no_grad():
        dora.magnitude.mul_(1.1)
    merged = dora.base_layer.weight + 4.0 * dora.lora_B.weight @ dora.lora_A.weight
    effective = dora.magnitude[:, None] * merged / merged.norm(dim=1, keepdim=True)
    assert torch.allclose(dora(x), F.linear(x, effective, dora.base_layer.bias), atol=1e-14)
    normed = _weight_normed(D, 2 * D).double()
    g, v = normed.parametrizations.weight.original0, normed.parametrizations.weight.original1
    assert torch.allclose(normed.weight, g * v / v.norm(dim=1, keepdim=True), atol=1e-15)
    assert (g.squeeze() - v.norm(dim=1)).abs().max() > 0.01
    tied = tied_gpt()
    assert tied.lm_head.weight is tied.wte.weight
    bf16 = Bf16Linear(D, D)
    assert torch.allclose(bf16(x), x @ bf16.weight.double().T, atol=1e-15)
    norm = logscale_llama().layers[0].input_layernorm
    y = x.float()
    assert torch.allclose(norm(y), y * torch.rsqrt(y.pow(2).mean(-1, True) + 1e-5) * norm.log_w.exp())


CASES = [
    ("int4_llama", int4_llama, "transformer_lm", {}, "pass"),
    (
        "int4_llama.kv_heads_tiled_second_layer",
        lambda: int4_llama(tiled=True),
        "transformer_lm",
        {},
        ("mistake", "attention.kv_heads_tiled", "layers.1.self_attn"),
    ),
    (
        "int4_llama.rms_eps_outside_root_second_layer",
        lambda: int4_llama(input_eps_outside=True),
        "transformer_lm",
        {},
        ("mistake", "rms_norm.eps_outside_sqrt", "layers.1.input_layernorm"),
    ),
    ("nf4_llama", nf4_llama, "transformer_lm", {}, "pass"),
    (
        "nf4_llama.causal_shows_next_second_layer",
        lambda: nf4_llama(shows_next=True),
        "transformer_lm",
        {},
        ("mistake", "attention.causal_shows_next", "layers.1.self_attn"),
    ),
    ("int8_gpt", int8_gpt, "transformer_lm", {}, "pass"),
    (
        "int8_gpt.scaled_by_head_dim_second_block",
        lambda: int8_gpt(scale=1 / HD),
        "transformer_lm",
        {},
        ("mistake", "attention.wrong_scale", "h.1.attn"),
    ),
    (
        "int8_gpt.activations_rounded_second_block",
        lambda: int8_gpt(round_second_fc=True),
        "transformer_lm",
        {},
        ("no pair", "h.1.mlp.c_fc", "round"),
    ),
    ("bf16_llama", bf16_llama, "transformer_lm", {}, "pass"),
    (
        "bf16_llama.activation_on_up_second_layer",
        lambda: bf16_llama(on_up=True),
        "transformer_lm",
        {},
        ("mistake", "gated_feed_forward.activation_on_up", "layers.1.mlp"),
    ),
    ("trained_weight_norm_gpt", weight_norm_gpt, "transformer_lm", {}, "pass"),
    (
        "trained_weight_norm_gpt.softmax_over_queries_second_block",
        lambda: weight_norm_gpt(axis=-2),
        "transformer_lm",
        {},
        ("mistake", "attention.softmax_wrong_axis", "h.1.attn"),
    ),
    ("qlora_llama", qlora_llama, "transformer_lm", {}, "pass"),
    (
        "qlora_llama.rope_on_values_second_layer",
        lambda: qlora_llama(rope_v=True),
        "transformer_lm",
        {},
        ("mistake", "rope.applied_to_v", "layers.1.self_attn"),
    ),
    ("dora_gpt", dora_gpt, "transformer_lm", {}, "pass"),
    (
        "dora_gpt.not_causal_second_block",
        lambda: dora_gpt(causal=False),
        "transformer_lm",
        {},
        ("mistake", "attention.not_causal", "h.1.attn"),
    ),
    ("param_tied_gpt", tied_gpt, "transformer_lm", {}, "pass"),
    (
        "param_tied_gpt.mask_after_softmax_second_block",
        lambda: tied_gpt(after=True),
        "transformer_lm",
        {},
        ("mistake", "attention.mask_after_softmax", "h.1.attn"),
    ),
    ("logscale_llama", logscale_llama, "transformer_lm", {}, "pass"),
    (
        "logscale_llama.eps_outside_root_second_layer",
        lambda: logscale_llama(post_eps_outside=True),
        "transformer_lm",
        {},
        ("mistake", "rms_norm.eps_outside_sqrt", "layers.1.post_attention_layernorm"),
    ),
]


if __name__ == "__main__":
    check_by_hand()
    print("checked by hand")
