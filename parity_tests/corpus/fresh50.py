"""Config-driven LLM libraries in litgpt's style, as 2025-26 fine-tuners read and copy them (issue 46, round 50),
in this project's own words. The judge meets them here first (measured with the judge frozen).

- one ``Config`` dataclass (``n_embd``, ``n_head``, ``n_query_groups``, ``head_size``, ``rotary_percentage``,
  ``parallel_residual``, ``shared_attention_norm``, ``bias``, ``lm_head_bias``, ``norm_class_name``,
  ``mlp_class_name``, ``intermediate_size``, ``padded_vocab_size`` above ``vocab_size``, ``rope_base``,
  ``norm_eps``) read by one ``GPT`` whose ``Block``, ``CausalSelfAttention`` and MLPs take it;
- the fused ``qkv`` Linear in the grouped layout: for each query group its q heads' rows, then the group's k rows,
  then its v rows; the forward views it as (B, T, n_query_groups, q_per_kv + 2, head_size) and splits;
- the rope cache built once as cos/sin buffers of ``block_size`` rows and sliced in the forward, the rotation of
  the two halves, applied to the first ``rotary_percentage`` of each head;
- models from configs in the style of Pythia (parallel residual, rotary on a quarter, GeLU MLP, LayerNorm of
  bias), Llama-3 (grouped K/V heads, SwiGLU, RMSNorm), Phi-2 (parallel with one shared norm, rotary on a quarter,
  ``lm_head`` of bias), Gemma (GeGLU of the tanh GeLU, embedding times sqrt(n_embd), RMSNorm of gain 1 + w);
- mistakes in the second block: K/V groups widened by ``repeat`` (tiled heads, the group a head reads is
  h mod G instead of h // q_per_kv); the rotation put on v too; a hand-written LayerNorm of eps outside the root;
  the Gemma RMSNorm of eps outside the root; SwiGLU's SiLU moved to ``fc_2`` (a relabeled SwiGLU: pass); the
  scores divided by head_size (wrong scale); the causal mask left off; the qkv clipped to [-c, c] (OLMo's
  ``clip_qkv``, math the reference lacks: no pair at the block's attention naming the clamp).

Expected verdicts decided from the math before the judge ran. ``layout_error()`` measures that the grouped-layout
attention equals a plain per-head attention (separate q, k, v of the weights re-laid, each head reading its group's
k and v) in float64: at most 6e-16 on all four configs.

One expectation was corrected after the run, on the math, not on the judge's word: SiLU put on ``fc_2`` instead of
``fc_1`` in the second block (``a * silu(b)`` for ``silu(a) * b``) was first written down as
gated_feed_forward.activation_on_up; but with two independent Linears this is a SwiGLU whose gate is ``fc_2``, a
relabeling of the weights that only the names (litgpt's ``fc_1`` = gate, for loading checkpoints) can call wrong.
The judge said pass, which is right for the computation; the case now expects pass.

First met: 16 of 16 right (counting the corrected case above as right). Wrong: none. Timings: the passes
0.07-0.17 s each, the mistakes and the no pair 0.7-1.1 s each (the judge's search over variants).

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

LM = "transformer_lm"


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases moved off their 1s and 0s, so that a trained model's values are checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


@dataclass
class Config:
    """Every size and switch of one model; the modules read only this."""

    name: str = "tiny"
    block_size: int = 16
    vocab_size: int = 50
    padded_vocab_size: int = 64
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_query_groups: int = 4
    head_size: int = 16
    rotary_percentage: float = 0.25
    parallel_residual: bool = True
    shared_attention_norm: bool = False
    bias: bool = True
    lm_head_bias: bool = False
    norm_class_name: str = "LayerNorm"
    mlp_class_name: str = "GptNeoxMLP"
    intermediate_size: int = 128
    rope_base: int = 10000
    norm_eps: float = 1e-5
    scale_embeddings: bool = False
    gelu_approximate: str = "none"
    clip_qkv: float | None = None
    mistake: str = ""  # injected in block `mistake_layer` only
    mistake_layer: int = 1

    @property
    def rope_n_elem(self) -> int:
        """How many channels of a head the rotation turns."""
        return int(self.rotary_percentage * self.head_size)


PYTHIA = Config(name="pythia-tiny")
LLAMA3 = Config(
    name="llama-3-tiny", n_query_groups=2, rotary_percentage=1.0, parallel_residual=False, bias=False,
    norm_class_name="RMSNorm", mlp_class_name="LLaMAMLP", intermediate_size=96, rope_base=500000,
)  # fmt: skip
PHI2 = Config(name="phi-2-tiny", shared_attention_norm=True, lm_head_bias=True, gelu_approximate="tanh")
GEMMA = Config(
    name="gemma-tiny", n_embd=48, n_query_groups=1, head_size=16, rotary_percentage=1.0, parallel_residual=False,
    bias=False, norm_class_name="RMSNorm", mlp_class_name="GemmaMLP", intermediate_size=96, norm_eps=1e-6,
    scale_embeddings=True, gelu_approximate="tanh",
)  # fmt: skip


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) times the gain (1 + w where the gain is stored as an offset, as Gemma's)."""

    def __init__(self, size: int, eps: float, add_unit_offset: bool = False, eps_outside: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size) if add_unit_offset else torch.ones(size))
        self.eps, self.add_unit_offset, self.eps_outside = eps, add_unit_offset, eps_outside

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ms = x.pow(2).mean(-1, keepdim=True)
        x = x / (ms.sqrt() + self.eps) if self.eps_outside else x * torch.rsqrt(ms + self.eps)
        return x * ((1 + self.weight) if self.add_unit_offset else self.weight)


class HandLayerNorm(nn.Module):
    """A LayerNorm written out (the copier's own), of eps outside the root: (x - mean) / (std + eps)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight, self.bias, self.eps = nn.Parameter(torch.ones(size)), nn.Parameter(torch.zeros(size)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = x - x.mean(-1, keepdim=True)
        return c / (c.pow(2).mean(-1, keepdim=True).sqrt() + self.eps) * self.weight + self.bias


def norm(config: Config, bad: bool) -> nn.Module:
    """The norm the config names; the eps-outside variants where this block carries that mistake."""
    if config.norm_class_name == "RMSNorm":
        offset = config.scale_embeddings  # Gemma's gain is 1 + w
        return RMSNorm(config.n_embd, config.norm_eps, offset, bad and config.mistake == "rms_eps_outside")
    if bad and config.mistake == "ln_eps_outside":
        return HandLayerNorm(config.n_embd, config.norm_eps)
    return nn.LayerNorm(config.n_embd, eps=config.norm_eps)


def build_rope_cache(config: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of (block_size, rope_n_elem): angle t / base^(2i / n) for pair i, repeated over the two halves."""
    n = config.rope_n_elem
    theta = 1.0 / config.rope_base ** (torch.arange(0, n, 2).float() / n)
    angles = torch.outer(torch.arange(config.block_size).float(), theta).repeat(1, 2)
    return torch.cos(angles), torch.sin(angles)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates the pairs (i, i + n/2) of x's last axis: x cos + (-x2, x1) sin."""
    half = x.size(-1) // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class CausalSelfAttention(nn.Module):
    """One fused qkv Linear in the grouped layout, rope on the first rope_n_elem channels, SDPA with a bool mask."""

    def __init__(self, config: Config, bad: bool) -> None:
        super().__init__()
        c = config
        self.qkv = nn.Linear(c.n_embd, (c.n_head + 2 * c.n_query_groups) * c.head_size, bias=c.bias)
        self.proj = nn.Linear(c.n_head * c.head_size, c.n_embd, bias=c.bias)
        self.config, self.mistake = c, (c.mistake if bad else "")

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        c, (B, T, _) = self.config, x.shape
        q_per_kv, n = c.n_head // c.n_query_groups, c.rope_n_elem
        qkv = self.qkv(x)
        if c.clip_qkv is not None and self.mistake == "clip_qkv":
            qkv = qkv.clamp(min=-c.clip_qkv, max=c.clip_qkv)
        qkv = qkv.view(B, T, c.n_query_groups, q_per_kv + 2, c.head_size).permute(0, 2, 3, 1, 4)
        q, k, v = qkv.split((q_per_kv, 1, 1), dim=2)
        if self.mistake == "tiled":  # each head h reads group h mod G
            k, v = k.repeat(1, q_per_kv, 1, 1, 1), v.repeat(1, q_per_kv, 1, 1, 1)
        elif q_per_kv != 1:
            k, v = k.expand(B, c.n_query_groups, q_per_kv, T, c.head_size), v.expand_as(q)
        q, k, v = (t.reshape(B, -1, T, c.head_size) for t in (q, k, v))
        q = torch.cat((apply_rope(q[..., :n], cos, sin), q[..., n:]), dim=-1)
        k = torch.cat((apply_rope(k[..., :n], cos, sin), k[..., n:]), dim=-1)
        if self.mistake == "rope_on_v":
            v = torch.cat((apply_rope(v[..., :n], cos, sin), v[..., n:]), dim=-1)
        scale = 1.0 / (c.head_size if self.mistake == "scale" else math.sqrt(c.head_size))
        attn_mask = None if self.mistake == "no_mask" else mask
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)
        return self.proj(y.transpose(1, 2).reshape(B, T, c.n_head * c.head_size))


class GptNeoxMLP(nn.Module):
    """fc, GeLU (exact or tanh as the config says), proj."""

    def __init__(self, config: Config, bad: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, config.intermediate_size, bias=config.bias)
        self.proj = nn.Linear(config.intermediate_size, config.n_embd, bias=config.bias)
        self.approximate = config.gelu_approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate=self.approximate))


class LLaMAMLP(nn.Module):
    """proj(act(fc_1 x) * fc_2 x): SiLU for Llama, the tanh GeLU for Gemma (GemmaMLP)."""

    def __init__(self, config: Config, bad: bool) -> None:
        super().__init__()
        self.fc_1 = nn.Linear(config.n_embd, config.intermediate_size, bias=config.bias)
        self.fc_2 = nn.Linear(config.n_embd, config.intermediate_size, bias=config.bias)
        self.proj = nn.Linear(config.intermediate_size, config.n_embd, bias=config.bias)
        self.gemma, self.on_up = config.mlp_class_name == "GemmaMLP", bad and config.mistake == "act_on_up"

    def act(self, x: torch.Tensor) -> torch.Tensor:
        """The gate's nonlinearity."""
        return F.gelu(x, approximate="tanh") if self.gemma else F.silu(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.fc_1(x), self.fc_2(x)
        return self.proj(a * self.act(b) if self.on_up else self.act(a) * b)


MLPS = {"GptNeoxMLP": GptNeoxMLP, "LLaMAMLP": LLaMAMLP, "GemmaMLP": LLaMAMLP}


class Block(nn.Module):
    """norm_1, attn, norm_2 (absent where the attention norm is shared), mlp; parallel or sequential residual."""

    def __init__(self, config: Config, index: int) -> None:
        super().__init__()
        bad = index == config.mistake_layer
        self.norm_1 = norm(config, bad)
        self.attn = CausalSelfAttention(config, bad)
        self.norm_2 = None if config.shared_attention_norm else norm(config, bad)
        self.mlp = MLPS[config.mlp_class_name](config, bad)
        self.config = config

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n1 = self.norm_1(x)
        h = self.attn(n1, cos, sin, mask)
        if self.config.parallel_residual:
            n2 = n1 if self.norm_2 is None else self.norm_2(x)
            return h + self.mlp(n2) + x
        x = x + h
        assert self.norm_2 is not None
        return x + self.mlp(self.norm_2(x))


class GPT(nn.Module):
    """wte, blocks, ln_f, lm_head over the padded vocabulary; the rope cache and mask made once and sliced."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=config.lm_head_bias)
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.padded_vocab_size, config.n_embd),
                h=nn.ModuleList(Block(config, i) for i in range(config.n_layer)),
                ln_f=norm(config, False),
            )
        )
        cos, sin = build_rope_cache(config)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        ones = torch.ones(config.block_size, config.block_size, dtype=torch.bool)
        self.register_buffer("mask_cache", torch.tril(ones), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.size(1)
        assert T <= self.config.block_size, f"sequence of {T} longer than the block size"
        cos, sin, mask = self.cos[:T], self.sin[:T], self.mask_cache[:T, :T]
        x = self.transformer.wte(idx)
        if self.config.scale_embeddings:
            x = x * torch.tensor(self.config.n_embd**0.5, dtype=x.dtype)
        for block in self.transformer.h:
            x = block(x, cos, sin, mask)
        return self.lm_head(self.transformer.ln_f(x))


def gpt(config: Config, mistake: str = "", **kw: object) -> GPT:
    """A seeded, jittered GPT of the config, the mistake (if any) in its second block."""
    torch.manual_seed(0)
    return _jitter(GPT(replace(config, mistake=mistake, **kw))).eval()  # type: ignore[arg-type]


def layout_error(config: Config) -> float:
    """Largest gap, in float64, between a block's grouped-layout attention and a plain per-head one of its weights."""
    model = gpt(config).double()
    attn, c = model.transformer.h[0].attn, config
    T, q_per_kv, n = 7, c.n_head // c.n_query_groups, c.rope_n_elem
    x = torch.randn(2, T, c.n_embd, dtype=torch.float64)
    cos, sin, mask = model.cos[:T].double(), model.sin[:T].double(), model.mask_cache[:T, :T]
    w = attn.qkv.weight.view(c.n_query_groups, q_per_kv + 2, c.head_size, c.n_embd)
    b = attn.qkv.bias.view(c.n_query_groups, q_per_kv + 2, c.head_size) if attn.qkv.bias is not None else None
    heads = []
    for h in range(c.n_head):
        g, j = divmod(h, q_per_kv)
        rows = [(g, j), (g, q_per_kv), (g, q_per_kv + 1)]
        q, k, v = (x @ w[r].T + (b[r] if b is not None else 0) for r in rows)
        q = torch.cat((apply_rope(q[..., :n], cos, sin), q[..., n:]), -1)
        k = torch.cat((apply_rope(k[..., :n], cos, sin), k[..., n:]), -1)
        s = (q @ k.transpose(-1, -2) / math.sqrt(c.head_size)).masked_fill(~mask, -math.inf)
        heads.append(s.softmax(-1) @ v)
    plain = attn.proj(torch.cat(heads, -1))
    return float((plain - attn(x, cos, sin, mask)).abs().max().detach())


CASES = [
    ("f50_pythia", lambda: gpt(PYTHIA), LM, {}, "pass"),
    ("f50_llama3", lambda: gpt(LLAMA3), LM, {}, "pass"),
    ("f50_phi2", lambda: gpt(PHI2), LM, {}, "pass"),
    ("f50_gemma", lambda: gpt(GEMMA), LM, {}, "pass"),
    ("f50_llama3.one_layer", lambda: gpt(LLAMA3, n_layer=1), LM, {}, "pass"),
    ("f50_pythia.short_context", lambda: gpt(PYTHIA, block_size=8), LM, {}, "pass"),
    ("f50_phi2.full_rotary", lambda: gpt(PHI2, rotary_percentage=1.0), LM, {}, "pass"),
    ("f50_gemma.silu_mlp", lambda: gpt(GEMMA, mlp_class_name="LLaMAMLP"), LM, {}, "pass"),
    ("f50_llama3.kv_heads_tiled_second_block", lambda: gpt(LLAMA3, "tiled"), LM, {},
     ("mistake", "attention.kv_heads_tiled", "transformer.h.1.attn")),
    ("f50_pythia.rope_on_v_second_block", lambda: gpt(PYTHIA, "rope_on_v"), LM, {},
     ("mistake", "rope.applied_to_v", "transformer.h.1.attn")),
    ("f50_pythia.ln_eps_outside_second_block", lambda: gpt(PYTHIA, "ln_eps_outside"), LM, {},
     ("mistake", "layer_norm.eps_outside_sqrt", "transformer.h.1.norm_1")),
    ("f50_gemma.rms_eps_outside_second_block", lambda: gpt(GEMMA, "rms_eps_outside"), LM, {},
     ("mistake", "rms_norm.eps_outside_sqrt", "transformer.h.1.norm_1")),
    ("f50_llama3.gate_on_fc_2_second_block", lambda: gpt(LLAMA3, "act_on_up"), LM, {}, "pass"),
    ("f50_phi2.scale_by_head_size_second_block", lambda: gpt(PHI2, "scale"), LM, {},
     ("mistake", "attention.wrong_scale", "transformer.h.1.attn")),
    ("f50_gemma.mask_left_off_second_block", lambda: gpt(GEMMA, "no_mask"), LM, {},
     ("mistake", "attention.not_causal", "transformer.h.1.attn")),
    ("f50_pythia.clip_qkv_second_block", lambda: gpt(PYTHIA, "clip_qkv", clip_qkv=0.3), LM, {},
     ("no pair", "transformer.h.1.attn", "clamp")),
]  # fmt: skip
