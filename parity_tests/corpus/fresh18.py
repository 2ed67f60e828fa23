"""2025-26 research variants, written as papers' reference code writes them (config dataclasses, einops `rearrange`,
functional everything, weights in `nn.ParameterDict`s), and the everyday models they modify, in this project's own
words (issue 46, round 13). The judge meets them here first (measured with the judge frozen: what it said when it
first met each is in parity_tests/test_unseen.py's TODAY).

- a research GPT (the base every variant below modifies): a `GPTConfig` dataclass, pre-RMSNorm (nn.RMSNorm), the
  attention's wq / wk / wv / wo in a ParameterDict applied by F.linear, heads split by `rearrange`, RoPE in halves,
  scores by einsum, a SwiGLU MLP of w1 / w2 / w3 in a ParameterDict, a final norm, an untied head: the reference's;
- a Gemma-3-style LM in that style: grouped-query attention (4 query heads on 2 K/V heads by einops `repeat`, each
  K/V head serving neighbouring query heads), per-head q/k RMSNorms before RoPE, a sliding window of 4 keys on
  block 0 and global attention on block 1 (layer_types), the head tied to the token table and the logits soft-capped
  by 15 tanh(z / 15): every feature the reference's (qk_norm, n_kv_heads, sliding_window + layer_types,
  tie_embeddings, logit_softcap);
- a GPT-J / Phi-style parallel block in that style: one LayerNorm read by attention and MLP, x + attn(h) + mlp(h),
  rotary on the first half of each head (rotary_dim 4 of 8, in halves), a GELU MLP with biases: the reference's
  (parallel_residual, shared_norm, rotary_dim);
- the research GPT with softmax-plus-one ("off-by-one" softmax, exp(s) / (1 + sum exp(s))): GPT-OSS's attention
  sinks at a sink logit of 0, math the reference has (attn_sinks): its sinks are a learned parameter the user's model
  lacks, held at 0, as the biases a user's Linear lacks are held at zero: the user's function and every gradient of
  its parameters are the reference's at sinks = 0, so a pass;
- math the reference lacks, each the first such op in the flow, expected said at the user's submodule:

  - sigmoid attention (Apple's): p = sigmoid(s - log n), n the sequence length, no softmax;
  - stick-breaking attention: p_ij = sigmoid(s_ij) prod_{j < k <= i} (1 - sigmoid(s_ik)), by logsigmoid and a
    reversed cumsum over the keys;
  - softpick: relu(exp(s) - 1) / (sum |exp(s) - 1| + eps), written in the paper's stable form;
  - the Forgetting Transformer's forget gate: f_t = sigmoid(w_f x_t + b_f) per head, the scores plus
    sum_{j < l <= i} log f_l (a cumsum of logsigmoid, c_i - c_j): a data-dependent term on the scores;
  - multi-token attention: a depthwise (per-head) 3 x 3 convolution over the (query, key) scores, causal in the
    queries, future keys zeroed before it and hidden after it;
  - headwise gated attention: each head's output times sigmoid(x w_g) (one gate per head, H of them), before wo;
  - Canon layers (Canon-A): h + causal depthwise conv1d (kernel 4) of the normed hidden states, before the attention,
    in a submodule `canon_a` of each block;
  - a Mamba-style hybrid: block 0 attention, block 1's mixer a gated causal conv (in_proj to x and z, a depthwise
    causal conv1d on x, silu(x) * silu(z), out_proj): the first op the reference lacks is in block 1's mixer;
  - nGPT (the normalised transformer): no norm layers, q and k turned by RoPE then scaled to unit length per head
    (x / x.norm()) times a learned per-(head, feature) s_qk, the softmax at sqrt(Dh), each sublayer's output and the
    stream put back on the unit sphere by eigen learning rates (h = norm(h + alpha (norm(h_A) - h))), the SwiGLU's
    gate times a learned s_v sqrt(D), the logits times a learned s_z: the first op the reference lacks is the
    per-head unit-length q/k with its (H, Dh) scale, after RoPE, in block 0's attention;

- mistakes put into them, each named where it sits: the Gemma-3-style LM's second attention tiling its K/V heads
  (`repeat(..., "b h t d -> b (r h) t d")`), masking after the softmax, its second MLP with SiLU on the up
  projection; the parallel block's second attention with its softmax over the queries, scaled by d_model ** -0.5,
  and turning its values by RoPE too.

First met: 9 of 19 right (the judge frozen; canon_a and the hybrid counted right after their expected place was
moved from the wrapper to its Conv1d child, blocks.0.canon_a.conv / blocks.1.mixer.conv1d, where the convolution is
computed). Wrong then:
- einops_parallel_lm and its three mistakes: "unexplained at blocks.0.attn": the biases kept in a ParameterDict and
  given to F.linear as its third argument (qkv_bias, out_bias, fc_in_bias) are not mapped (the reference's q/k/v,
  out and linear1 biases "held at zero: the user's layer has no bias"), while fc_out_bias, added by `+`, is; with
  those three biases zeroed the model passes (activation read as gelu, rotary_dim 4), so the math is the reference's;
- research_gpt.softmax_one: unexplained at blocks.0.attn (also with attn_sinks=True given): the sinks at logit 0
  not read as the reference's attn_sinks;
- research_gpt.sigmoid_attention: could not judge, "the number of heads cannot be read from the recorded
  forward: pass n_heads=" (no softmax op to read the heads from);
- research_gpt.stick_breaking, .softpick, .multi_token_attention: a bare "unexplained at blocks.0.attn ... no
  catalogue variant reproduces it", the op (logsigmoid / a reversed cumsum; relu(exp(s) - 1) over sum |.|; a Conv2d
  over the scores, blocks.0.attn.kq_conv) unsaid;
- ngpt: no pair at blocks.0, said as "attn (the attention) is never called in the block": blocks.0.attn is the
  block's ParameterDict of attention weights (never called: F.linear reads it), not a sublayer left out; the per-head
  unit-length q/k times s_qk after RoPE unsaid.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import nn

D, H, V, T_MAX = 32, 4, 26, 32
HD = D // H


@dataclass
class GPTConfig:
    vocab: int = V
    d: int = D
    heads: int = H
    kv_heads: int = H
    ffn: int = 64
    layers: int = 2
    eps: float = 1e-6
    rotary: int = HD
    window: int | None = None  # on block 0 only (block 1 global), as Gemma 3 alternates
    softcap: float | None = None
    tied: bool = False


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases moved off their 1s and 0s, so that trained values are what is checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _weights(**shapes: tuple[int, ...]) -> nn.ParameterDict:
    """A ParameterDict of weights ~ N(0, 1 / fan_in) (1-axis entries: biases, ~ N(0, 0.01))."""
    return nn.ParameterDict(
        {
            k: nn.Parameter(torch.randn(s) / math.sqrt(s[-1]) if len(s) > 1 else 0.1 * torch.randn(s))
            for k, s in shapes.items()
        }
    )


def rope(x: torch.Tensor, rotated: int = HD, base: float = 10000.0) -> torch.Tensor:
    """Rotary in halves on the first `rotated` features of each head of x (B, h, T, Dh)."""
    T = x.shape[-2]
    inv = base ** -(torch.arange(0, rotated, 2, dtype=x.dtype) / rotated)
    angles = torch.outer(torch.arange(T, dtype=x.dtype), inv)
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)
    turn, keep = x[..., :rotated], x[..., rotated:]
    a, b = turn.chunk(2, dim=-1)
    return torch.cat([turn * cos + torch.cat([-b, a], -1) * sin, keep], -1)


def causal(T: int, window: int | None = None) -> torch.Tensor:
    """True where query i may read key j: j <= i (and j > i - window)."""
    i, j = torch.arange(T)[:, None], torch.arange(T)[None]
    keep = j <= i
    return keep if window is None else keep & (j > i - window)


# -- the research GPT and its attention variants --------------------------------------------------------------------


def softmax_probs(s: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return s.masked_fill(~keep, float("-inf")).softmax(-1)


def softmax_one(s: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """exp(s) / (1 + sum exp(s)), stable: the max taken with the 0 of the one."""
    s = s.masked_fill(~keep, float("-inf"))
    m = s.amax(-1, keepdim=True).clamp(min=0).detach()
    e = torch.exp(s - m)
    return e / (torch.exp(-m) + e.sum(-1, keepdim=True))


def sigmoid_probs(s: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Sigmoid attention: sigmoid(s - log n), n the sequence length, masked keys 0."""
    n = s.shape[-1]
    return torch.sigmoid(s - math.log(n)) * keep


def stick_breaking(s: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """beta = sigmoid(s); p_ij = beta_ij prod_{j < k <= i} (1 - beta_ik): logs summed over the later keys."""
    log_beta = F.logsigmoid(s).masked_fill(~keep, 0.0)
    log_rest = F.logsigmoid(-s).masked_fill(~keep, 0.0)
    later = log_rest.flip(-1).cumsum(-1).flip(-1) - log_rest  # sum over k > j of log(1 - beta_ik)
    return torch.exp(log_beta + later) * keep


def softpick(s: torch.Tensor, keep: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """relu(exp(s) - 1) / (sum |exp(s) - 1| + eps), times exp(-m) above and below (m the row's max, at least 0)."""
    s = s.masked_fill(~keep, float("-inf"))
    m = s.amax(-1, keepdim=True).clamp(min=0).detach()
    e = torch.exp(s - m) - torch.exp(-m)
    e = e.masked_fill(~keep, 0.0)
    return F.relu(e) / (e.abs().sum(-1, keepdim=True) + eps)


PROBS = {"softmax": softmax_probs, "one": softmax_one, "sigmoid": sigmoid_probs, "stick": stick_breaking}
PROBS["softpick"] = softpick


class Attention(nn.Module):
    """kind: a key of PROBS, or "forget" (FoX's forget gate on the scores), "mta" (a conv over the scores),
    "gate" (headwise output gate)."""

    def __init__(self, cfg: GPTConfig, kind: str = "softmax"):
        super().__init__()
        self.cfg, self.kind = cfg, kind
        self.w = _weights(wq=(D, D), wk=(D, D), wv=(D, D), wo=(D, D))
        if kind == "forget":
            self.fgate = _weights(weight=(H, D), bias=(H,))
        if kind == "mta":
            self.kq_conv = nn.Conv2d(H, H, (3, 3), groups=H, bias=False)
        if kind == "gate":
            self.w_gate = nn.Parameter(torch.randn(H, D) / math.sqrt(D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        q, k, v = (rearrange(F.linear(x, self.w[n]), "b t (h d) -> b h t d", h=H) for n in ("wq", "wk", "wv"))
        q, k = rope(q), rope(k)
        s = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(HD)
        keep = causal(T)
        if self.kind == "forget":
            log_f = F.logsigmoid(F.linear(x, self.fgate["weight"], self.fgate["bias"]))  # (B, T, H)
            c = rearrange(log_f.cumsum(1), "b t h -> b h t")
            s = s + c[..., :, None] - c[..., None, :]
        if self.kind == "mta":
            s = F.pad(s.masked_fill(~keep, 0.0), (1, 1, 2, 0))  # past queries, keys on both sides
            s = self.kq_conv(s)
        p = PROBS.get(self.kind, softmax_probs)(s, keep)
        y = torch.einsum("bhij,bhjd->bhid", p, v)
        if self.kind == "gate":
            g = torch.sigmoid(F.linear(x, self.w_gate))  # (B, T, H): one gate per head
            y = y * rearrange(g, "b t h -> b h t 1")
        return F.linear(rearrange(y, "b h t d -> b t (h d)"), self.w["wo"])


class SwiGLU(nn.Module):
    def __init__(self, cfg: GPTConfig, up_activated: bool = False):
        super().__init__()
        self.w = _weights(w1=(cfg.ffn, D), w2=(D, cfg.ffn), w3=(cfg.ffn, D))
        self.up_activated = up_activated  # the mistake: SiLU on w3 (up) in place of w1 (gate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.w["w1"]), F.linear(x, self.w["w3"])
        hidden = gate * F.silu(up) if self.up_activated else F.silu(gate) * up
        return F.linear(hidden, self.w["w2"])


class CanonA(nn.Module):
    """Canon-A: h + a causal depthwise conv1d (kernel 4) along the positions."""

    def __init__(self, kernel: int = 4):
        super().__init__()
        self.conv = nn.Conv1d(D, D, kernel, groups=D, padding=kernel - 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        T = h.shape[1]
        return h + rearrange(self.conv(rearrange(h, "b t d -> b d t"))[..., :T], "b d t -> b t d")


class GatedConvMixer(nn.Module):
    """A Mamba-style mixer without the scan: in_proj to (x, z), causal depthwise conv on x, silu(x) * silu(z)."""

    def __init__(self, kernel: int = 4):
        super().__init__()
        self.in_proj = nn.Linear(D, 4 * D, bias=False)
        self.conv1d = nn.Conv1d(2 * D, 2 * D, kernel, groups=2 * D, padding=kernel - 1)
        self.out_proj = nn.Linear(2 * D, D, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        T = h.shape[1]
        x, z = self.in_proj(h).chunk(2, dim=-1)
        x = rearrange(self.conv1d(rearrange(x, "b t e -> b e t"))[..., :T], "b e t -> b t e")
        return self.out_proj(F.silu(x) * F.silu(z))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, kind: str = "softmax", canon: bool = False, mixer: bool = False):
        super().__init__()
        self.attn_norm, self.mlp_norm = nn.RMSNorm(D, eps=cfg.eps), nn.RMSNorm(D, eps=cfg.eps)
        self.canon_a = CanonA() if canon else None
        self.mixer = GatedConvMixer() if mixer else None
        self.attn = None if mixer else Attention(cfg, kind)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attn_norm(x)
        if self.canon_a is not None:
            h = self.canon_a(h)
        x = x + (self.mixer(h) if self.mixer is not None else self.attn(h))
        return x + self.mlp(self.mlp_norm(x))


class ResearchGPT(nn.Module):
    def __init__(self, cfg: GPTConfig, kind: str = "softmax", canon: bool = False, hybrid: bool = False):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, D)
        self.blocks = nn.ModuleList([Block(cfg, kind, canon), Block(cfg, kind, canon, mixer=hybrid)])
        self.norm = nn.RMSNorm(D, eps=cfg.eps)
        self.head = nn.Linear(D, cfg.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def research_gpt(kind: str = "softmax", canon: bool = False, hybrid: bool = False) -> ResearchGPT:
    torch.manual_seed(0)
    return _jitter(ResearchGPT(GPTConfig(), kind, canon, hybrid))


# -- a Gemma-3-style LM: GQA, q/k RMSNorm, a window on block 0, tied head, logit soft cap -----------------------------


class WindowGQA(nn.Module):
    def __init__(self, cfg: GPTConfig, window: int | None, tiled: bool = False, mask_late: bool = False):
        super().__init__()
        self.cfg, self.window, self.tiled, self.mask_late = cfg, window, tiled, mask_late
        kv = cfg.kv_heads * HD
        self.w = _weights(wq=(D, D), wk=(kv, D), wv=(kv, D), wo=(D, D))
        self.q_norm, self.k_norm = nn.RMSNorm(HD, eps=cfg.eps), nn.RMSNorm(HD, eps=cfg.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T, r = x.shape[1], H // self.cfg.kv_heads
        q = rearrange(F.linear(x, self.w["wq"]), "b t (h d) -> b h t d", d=HD)
        k, v = (rearrange(F.linear(x, self.w[n]), "b t (h d) -> b h t d", d=HD) for n in ("wk", "wv"))
        q, k = rope(self.q_norm(q)), rope(self.k_norm(k))
        pattern = "b h t d -> b (r h) t d" if self.tiled else "b h t d -> b (h r) t d"  # tiled: the mistake
        k, v = repeat(k, pattern, r=r), repeat(v, pattern, r=r)
        s = torch.einsum("bhid,bhjd->bhij", q, k) * HD**-0.5
        keep = causal(T, self.window)
        if self.mask_late:  # the mistake: the mask after the softmax
            p = s.softmax(-1).masked_fill(~keep, 0.0)
        else:
            p = s.masked_fill(~keep, float("-inf")).softmax(-1)
        return F.linear(rearrange(p @ v, "b h t d -> b t (h d)"), self.w["wo"])


class GemmaishBlock(nn.Module):
    def __init__(self, cfg: GPTConfig, window: int | None, **mistakes: bool):
        super().__init__()
        self.attn_norm, self.mlp_norm = nn.RMSNorm(D, eps=cfg.eps), nn.RMSNorm(D, eps=cfg.eps)
        up = mistakes.pop("up_activated", False)
        self.attn, self.mlp = WindowGQA(cfg, window, **mistakes), SwiGLU(cfg, up)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GemmaishLM(nn.Module):
    def __init__(self, cfg: GPTConfig, **second: bool):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, D)
        self.blocks = nn.ModuleList([GemmaishBlock(cfg, cfg.window), GemmaishBlock(cfg, None, **second)])
        self.norm = nn.RMSNorm(D, eps=cfg.eps)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x)
        z = F.linear(self.norm(x), self.tok.weight)
        return self.cfg.softcap * torch.tanh(z / self.cfg.softcap)


def gemmaish(**second: bool) -> GemmaishLM:
    torch.manual_seed(0)
    return _jitter(GemmaishLM(GPTConfig(kv_heads=2, window=4, softcap=15.0, tied=True), **second))


# -- a GPT-J / Phi-style parallel block: one LayerNorm, partial rotary, GELU MLP with biases -------------------------


class ParallelAttention(nn.Module):
    def __init__(self, cfg: GPTConfig, over_queries: bool = False, scale: float = HD**-0.5, rope_v: bool = False):
        super().__init__()
        self.cfg, self.over_queries, self.scale, self.rope_v = cfg, over_queries, scale, rope_v
        self.w = _weights(qkv=(3 * D, D), qkv_bias=(3 * D,), out=(D, D), out_bias=(D,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        qkv = F.linear(x, self.w["qkv"], self.w["qkv_bias"])
        q, k, v = rearrange(qkv, "b t (three h d) -> three b h t d", three=3, h=H)
        q, k = rope(q, self.cfg.rotary), rope(k, self.cfg.rotary)
        if self.rope_v:  # the mistake: the values turned too
            v = rope(v, self.cfg.rotary)
        s = torch.einsum("bhid,bhjd->bhij", q, k) * self.scale
        s = s.masked_fill(~causal(T), float("-inf"))
        p = torch.nan_to_num(s.softmax(-2)) if self.over_queries else s.softmax(-1)  # over_queries: the mistake
        return F.linear(rearrange(p @ v, "b h t d -> b t (h d)"), self.w["out"], self.w["out_bias"])


class ParallelBlock(nn.Module):
    def __init__(self, cfg: GPTConfig, **mistakes):
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.attn = ParallelAttention(cfg, **mistakes)
        self.mlp = _weights(fc_in=(cfg.ffn, D), fc_in_bias=(cfg.ffn,), fc_out=(D, cfg.ffn), fc_out_bias=(D,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        m = F.linear(F.gelu(F.linear(h, self.mlp["fc_in"], self.mlp["fc_in_bias"])), self.mlp["fc_out"])
        return x + self.attn(h) + m + self.mlp["fc_out_bias"]


class ParallelLM(nn.Module):
    def __init__(self, cfg: GPTConfig, **second):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, D)
        self.blocks = nn.ModuleList([ParallelBlock(cfg), ParallelBlock(cfg, **second)])
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, cfg.vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def parallel_lm(**second) -> ParallelLM:
    torch.manual_seed(0)
    return _jitter(ParallelLM(GPTConfig(rotary=HD // 2), **second))


# -- nGPT: the normalised transformer ---------------------------------------------------------------------------------


def justnorm(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(p=2, dim=-1, keepdim=True)


class NormalizedBlock(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.attn = _weights(wq=(D, D), wk=(D, D), wv=(D, D), wo=(D, D))
        self.sqk = nn.Parameter(torch.ones(D) + 0.1 * torch.randn(D))  # per (head, feature)
        self.attn_alpha = nn.Parameter(0.05 * torch.ones(D))
        self.mlp = _weights(c_fc=(2 * cfg.ffn, D), c_proj=(D, cfg.ffn))
        self.suv = nn.Parameter(torch.ones(2 * cfg.ffn))
        self.mlp_alpha = nn.Parameter(0.05 * torch.ones(D))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        T = h.shape[1]
        q, k, v = (rearrange(F.linear(h, self.attn[n]), "b t (h d) -> b h t d", h=H) for n in ("wq", "wk", "wv"))
        sqk = rearrange(self.sqk, "(h d) -> 1 h 1 d", h=H)
        q, k = sqk * justnorm(rope(q)), sqk * justnorm(rope(k))
        s = torch.einsum("bhid,bhjd->bhij", q, k) * math.sqrt(HD)
        p = s.masked_fill(~causal(T), float("-inf")).softmax(-1)
        h_att = F.linear(rearrange(p @ v, "b h t d -> b t (h d)"), self.attn["wo"])
        h = justnorm(h + self.attn_alpha.abs() * (justnorm(h_att) - h))
        u, gate = (self.suv * F.linear(h, self.mlp["c_fc"])).chunk(2, dim=-1)
        h_mlp = F.linear(u * F.silu(gate * math.sqrt(D)), self.mlp["c_proj"])
        return justnorm(h + self.mlp_alpha.abs() * (justnorm(h_mlp) - h))


class NGPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, D)
        self.blocks = nn.ModuleList([NormalizedBlock(cfg) for _ in range(cfg.layers)])
        self.head = nn.Linear(D, cfg.vocab, bias=False)
        self.sz = nn.Parameter(torch.ones(cfg.vocab))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.tok(idx)
        for block in self.blocks:
            h = block(h)
        return self.sz * self.head(h)


def ngpt() -> NGPT:
    torch.manual_seed(0)
    model = NGPT(GPTConfig())
    with torch.no_grad():  # nGPT's weights on the unit sphere (its optimizer step renormalises them)
        model.tok.weight.copy_(justnorm(model.tok.weight))
    return model


CASES = [
    ("research_gpt", research_gpt, "transformer_lm", {}, "pass"),
    # exp(s) / (1 + sum exp(s)) is GPT-OSS's sinks at logit 0 (the reference's attn_sinks, its (H,) sinks held at 0 as
    # a Linear's missing bias is): the forward and every gradient of the user's parameters are the reference's
    ("research_gpt.softmax_one", lambda: research_gpt("one"), "transformer_lm", {}, "pass"),
    (
        "research_gpt.sigmoid_attention",
        lambda: research_gpt("sigmoid"),
        "transformer_lm",
        {},
        ("no pair", "blocks.0.attn", "sigmoid"),
    ),
    (
        "research_gpt.stick_breaking",
        lambda: research_gpt("stick"),
        "transformer_lm",
        {},
        ("no pair", "blocks.0.attn", "sigmoid"),
    ),
    (
        "research_gpt.softpick",
        lambda: research_gpt("softpick"),
        "transformer_lm",
        {},
        ("no pair", "blocks.0.attn", "relu"),
    ),
    (
        "research_gpt.forget_gate",
        lambda: research_gpt("forget"),
        "transformer_lm",
        {},
        # a bias on the scores that differs between the batch's sequences is said as computed from the input (since)
        ("no pair", "blocks.0.attn", "computed from the input (linear -> log_sigmoid -> cumsum)"),
    ),
    (
        "research_gpt.multi_token_attention",
        lambda: research_gpt("mta"),
        "transformer_lm",
        {},
        ("no pair", "blocks.0.attn", "conv"),
    ),
    (
        "research_gpt.headwise_gate",
        lambda: research_gpt("gate"),
        "transformer_lm",
        {},
        ("no pair", "blocks.0.attn", "sigmoid"),
    ),
    (
        "research_gpt.canon_a",
        lambda: research_gpt(canon=True),
        "transformer_lm",
        {},
        # decided first as blocks.0.canon_a; the Conv1d is its own submodule, blocks.0.canon_a.conv, where the
        # convolution is computed (the wrapper only adds the residual): said there is the user's place, more exact
        ("no pair", "blocks.0.canon_a.conv", "conv"),
    ),
    (
        "research_gpt.gated_conv_hybrid",
        lambda: research_gpt(hybrid=True),
        "transformer_lm",
        {},
        # decided first as blocks.1.mixer; corrected to its Conv1d submodule, as canon_a's (the first op lacking)
        ("no pair", "blocks.1.mixer.conv1d", "conv"),
    ),
    ("ngpt", ngpt, "transformer_lm", {}, ("no pair", "blocks.0", "norm")),
    ("gemmaish", gemmaish, "transformer_lm", {}, "pass"),
    (
        "gemmaish.kv_heads_tiled_second_block",
        lambda: gemmaish(tiled=True),
        "transformer_lm",
        {},
        ("mistake", "attention.kv_heads_tiled", "blocks.1.attn"),
    ),
    (
        "gemmaish.mask_after_softmax_second_block",
        lambda: gemmaish(mask_late=True),
        "transformer_lm",
        {},
        ("mistake", "attention.mask_after_softmax", "blocks.1.attn"),
    ),
    (
        "gemmaish.activation_on_up_second_block",
        lambda: gemmaish(up_activated=True),
        "transformer_lm",
        {},
        ("mistake", "gated_feed_forward.activation_on_up", "blocks.1.mlp"),
    ),
    ("einops_parallel_lm", parallel_lm, "transformer_lm", {}, "pass"),
    (
        "einops_parallel_lm.softmax_wrong_axis_second_block",
        lambda: parallel_lm(over_queries=True),
        "transformer_lm",
        {},
        ("mistake", "attention.softmax_wrong_axis", "blocks.1.attn"),
    ),
    (
        "einops_parallel_lm.scaled_by_model_width_second_block",
        lambda: parallel_lm(scale=D**-0.5),
        "transformer_lm",
        {},
        ("mistake", "attention.wrong_scale", "blocks.1.attn"),
    ),
    (
        "einops_parallel_lm.rope_on_values_second_block",
        lambda: parallel_lm(rope_v=True),
        "transformer_lm",
        {},
        ("mistake", "rope.applied_to_v", "blocks.1.attn"),
    ),
]
