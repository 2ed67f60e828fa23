"""Mistakes missed inside whole models, round four (issue 46, round 46; fresh16, fresh32 and fresh42 were rounds one
to three, in GPT-2, Llama, BERT, Marian, Qwen, NeoX, Phi and T5 styles), in three 2026 families, each written by
hand as a blog post walks through it, three layers each (so that the first, the middle and the last layer are all
places), in this project's own words and measured with the judge frozen.

- Gemma 2: the tokens times sqrt(d_model) (in the embedding's dtype), RMSNorm of gain 1 + w (the weight kept at
  0), sandwich norms (input_layernorm and post_attention_layernorm around the attention, pre_ and
  post_feedforward_layernorm around the MLP), q / k / v / o without biases over 4 query and 2 K/V heads
  (repeat_interleave), RoPE in halves, the scores scaled by Dh^-1/2 then capped 20 tanh(s / 20) before the mask, a
  sliding layer (window 3), a global one, a sliding one, GeGLU with the tanh GELU, the head tied to the token table
  and the logits capped 15 tanh(z / 15);
- DeepSeek-V3-style multi-head latent attention: the queries through a latent of 16 (q_a_proj, an RMSNorm
  q_a_layernorm, q_b_proj giving each head a nope part of 8 and a rope part of 4), the keys and values through a
  latent of 12 (kv_a_proj_with_mqa giving the latent and one rope key of 4; kv_a_layernorm; kv_b_proj giving each
  head's nope key and value), the decoupled rope key turned once and shared by every head, the rope parts turned
  as DeepSeek's own code turns them (pairs (2i, 2i + 1) read as complex numbers, view_as_complex times polar), the
  scores over sqrt(8 + 4), SwiGLU blocks of w1 / w3 / w2; and two twins of the same math: the rope parts turned in
  halves (rotate_half), and the paper's letters (separate W_DQ, W_UQ, W_QR, W_DKV, W_UK, W_UV and W_KR Linears,
  k^R = RoPE(W_KR h));
- GPT-OSS: q / k / v / o with biases, a learned sink logit per head joined to the masked scores as one more column,
  softmaxed with them and dropped, a sliding layer (window 3), a full one, a sliding one, RoPE in halves at base
  150000, a router with a bias choosing 2 of 4 experts and softmaxing their logits among themselves, the clamped
  SwiGLU ((clip(up, -7, 7) + 1) * g sigmoid(1.702 g), g = min(gate, 7)); the experts in transformers' stacked layout
  (gate and up interleaved in gate_up_proj's columns, biases) run by a loop over the experts hit, each on its own
  rows (index_add); and two twins: the same stacked experts run densely on every row (bmm, transformers' inference
  path, each expert's output weighted by the scattered routing weights), and the experts as a ModuleList of
  gate / up / down Linears.

The correct models and their twins were checked in float64 before the judge ran (_self_check): MLA in halves with
its rope rows relabelled (pair row 2i from half row i, 2i + 1 from i + 2), and the paper's letters with the fused
weights cut into their pieces, equal the fused model in pairs to 1e-12; the dense experts and the experts of Linears
(gate_up_proj's even columns the gate, odd the up, weights transposed) equal the loop to 1e-12; the sink column
equals logaddexp(logsumexp(s), sink) in the denominator. So every twin is the same model and expected to pass.

The mistakes, one per case, each decided from the math before the judge ran (the id as mistakes.py defines it, and
the submodule where the changed line computes):

- Gemma 2: the first layer's cap put on the probabilities after the softmax (attention.softcap_after_softmax,
  "cap * tanh(P / cap) on the probabilities instead of cap * tanh(S / cap) on the scores", at layers.0.self_attn);
  the middle layer's post-attention norm of the sandwich with eps added to the root (rms_norm.eps_outside_sqrt,
  x / (sqrt(mean(x^2)) + eps), at layers.1.post_attention_layernorm: eps 1e-6 moves each output by about eps /
  rms, far above float64's noise); the middle layer's tanh GELU on the up projection (gated_feed_forward.
  activation_on_up at layers.1.mlp); the last layer's tanh reading the raw scores, 20 tanh(s) (attention.
  softcap_without_division at layers.2.self_attn); the final norm's mean of squares over dim 1, the positions
  (rms_norm.wrong_axis at norm);
- MLA: the first layer's latent norm with eps outside the root (rms_norm.eps_outside_sqrt at
  blocks.0.attn.kv_a_layernorm); the middle layer's decoupled rope key turned at positions 1 .. T while the
  queries' rope parts are turned at 0 .. T - 1 (rope.position_offset, "keys rotated at positions offset from the
  queries'", at blocks.1.attn); the last layer's scores over sqrt(8), the nope width, not sqrt(12), the head's
  query-key width (attention.wrong_scale, "c != sqrt(d_head)", at blocks.2.attn); the final norm with eps outside
  the root (rms_norm.eps_outside_sqrt at norm);
- GPT-OSS: the first layer's sink column never joined, softmax(S) alone (attention.sink_missing at
  layers.0.self_attn); the middle (full) layer's K/V heads widened by `.repeat(1, 2, 1, 1)` (attention.
  kv_heads_tiled at layers.1.self_attn); the last layer's softmax over dim -2 of the scores and the sink column,
  the queries (attention.softmax_wrong_axis at layers.2.self_attn: each key's column keeps its own query, so no
  NaN; the sink's column, softmaxed over the queries on its own, is dropped); the last layer's values turned too
  (rope.applied_to_v at layers.2.self_attn).

First met: 14 of 20 right (every Gemma 2 case, the fused MLA in pairs and three of its four mistakes, GPT-OSS with
looped experts and three of its four mistakes). Wrong:

- f46_mla.rope_in_halves: "unexplained: blocks.0.attn ... diverges with relative error 2.28e-01 (positions 1, 2, 3,
  4, 5 differ, the others agree)". The reference's latent attention (check/variants.py latent_heads) turns its rope
  parts in interleaved pairs only; the halves convention the judge reads for other attentions is not applied to the
  latent's rope rows.
- f46_mla.paper_letters: "could not judge: cannot read blocks.0.attn.w_uq.weight (32 rows) as the q projection(s) of
  an attention of width 48 (2 query piece(s)); pass mapping=". The dataflow reads the query as one projection per
  piece; the separate nope (W_UQ) and rope (W_QR) query projections, and W_KR beside W_DKV, are not joined into the
  fused per-head layout.
- f46_mla.rope_key_one_ahead_middle_layer: "unexplained: blocks.1.attn ... relative error 1.61e-01"; no id.
  variants.latent_heads turns the shared key with no shift, so the catalogue's k_shift variant never reaches a
  latent attention.
- f46_gpt_oss.dense_experts: "unexplained: layers.0.mlp ... relative error 3.09e-01 (every position differs)". The
  mapping lists gate_up_proj and down_proj but neither bias: the biases added to a bmm through `[:, None]` are not
  read, so the reference runs with biases the user's weights never filled.
- f46_gpt_oss.expert_linears: "differs at layers.0.mlp.experts.0: clamp limits the outputs of
  layers.0.mlp.experts.0.gate.weight to a range (as GPT-OSS's clamped SwiGLU), which the reference has no pair
  for". The reference has GPT-OSS's clamped SwiGLU (numpy_transformer/gpt_oss_moe.py); check/unsupported.py's
  _clamped says the clamp before the experts are read as GPT-OSS's when each is its own Linears.
- f46_gpt_oss.softmax_over_queries_last_layer: "unexplained: layers.2.self_attn ... relative error 1.52e+00"; no id.
  variants.attention_heads takes its sink branch (the column joined, softmax over the keys) before it reads the
  axis knob, so with sinks the wrong axis is never tried.

Fixed since (GPT-OSS's three): a stacked expert's bias is read by what it is added to, its rows picked or all of it
broadcast (`bmm + bias[:, None]`); of a gated block's two inputs both clamped on the way, the gate is the one an
activation other than a clamp reads, so experts of their own Linears are read as GPT-OSS's and linked to their rows
and interleaved columns of gate_up_proj (and no clamp inside a routed expert is said to have no pair); the sink
column joins the scores and keeps the mask and axis knobs of the plain softmax, so the wrong axis is tried with sinks.

Fixed since (the MLA cases): the judge reads latent attention's rotary part in either pairing, as it reads other
attentions': a second weight map with each head's rotary rows of q_b_proj and the shared key's of kv_a_proj in
halves (check/session.py latent_layouts); the paper's separate matrices are joined into the fused layout by what
each feeds, the rotary ones read as those RoPE turns (W_UQ and W_QR each head's rows of q_b_proj, W_UK and W_UV
of kv_b_proj, W_DKV and W_KR the latent's and the rotary key's rows of kv_a_proj: check/units.py _paper_rows);
and variants.latent_heads takes the catalogue's RoPE knobs (k_shift, the mixed pairing) as other attentions do.

Most checks take 0.4 to 1.1 s on 2 shared cores (three-layer whole models; fresh42's took as long), over the 0.5 s
asked: all but three are in test_unseen's SLOW set.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

D, H, KV, HD, V, FF, WINDOW = 32, 4, 2, 8, 40, 48, 3
LM = "transformer_lm"


def _jitter(model: nn.Module) -> nn.Module:
    """Every gain and bias moved off its 0 or 1, so that a trained model's values are checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() <= 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def rope_tables(T: int, dim: int, base: float, shift: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (T, dim) in halves at positions shift .. shift + T - 1."""
    inv = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    ang = torch.outer(torch.arange(shift, shift + T, dtype=torch.float64), inv)
    ang = torch.cat((ang, ang), dim=-1)
    return ang.cos(), ang.sin()


def turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)


def band(T: int, window: int | None, device=None, next_too: bool = False) -> torch.Tensor:
    """True where query i may read key j: j <= i (j <= i + 1 when next_too), and i - j < window if one is given."""
    i = torch.arange(T, device=device)[:, None]
    j = torch.arange(T, device=device)[None, :]
    keep = j <= i + int(next_too)
    return keep & (i - j < window) if window else keep


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * g; `offset`: Gemma's gain 1 + w (w kept at 0); `eps_outside`, `axis`: the
    mistakes (eps added to the root; the mean over another axis)."""

    def __init__(self, dim: int, eps: float = 1e-6, offset: bool = False, eps_outside=False, axis=-1) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))
        self.eps, self.offset, self.eps_outside, self.axis = eps, offset, eps_outside, axis

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ms = x.pow(2).mean(self.axis, keepdim=True)
        y = x / (ms.sqrt() + self.eps) if self.eps_outside else x * torch.rsqrt(ms + self.eps)
        return y * (1.0 + self.weight if self.offset else self.weight)


# -- Gemma 2, a blog's walk-through: sandwich norms, two soft caps, local / global / local -------------------------


class Gemma2Attention(nn.Module):
    """q/k/v/o without biases, 4 query heads over 2 K/V heads, scaled by query_pre_attn_scalar^-1/2 (= HD), the scores
    capped 20 tanh(s / 20) before the mask; `cap`: "divided" (right), "undivided", "after" (the mistakes)."""

    def __init__(self, window: int | None, cap: str = "divided") -> None:
        super().__init__()
        self.q_proj = nn.Linear(D, H * HD, bias=False)
        self.k_proj = nn.Linear(D, KV * HD, bias=False)
        self.v_proj = nn.Linear(D, KV * HD, bias=False)
        self.o_proj = nn.Linear(H * HD, D, bias=False)
        self.window, self.cap, self.softcap = window, cap, 20.0

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = turn(self.q_proj(x).view(B, T, H, HD).transpose(1, 2), cos, sin)
        k = turn(self.k_proj(x).view(B, T, KV, HD).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(B, T, KV, HD).transpose(1, 2)
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        s = q @ k.transpose(-1, -2) / math.sqrt(HD)
        if self.cap == "divided":
            s = self.softcap * torch.tanh(s / self.softcap)
        elif self.cap == "undivided":  # the mistake: the tanh of the raw scores
            s = self.softcap * torch.tanh(s)
        p = s.masked_fill(~band(T, self.window, x.device), float("-inf")).softmax(dim=-1)
        if self.cap == "after":  # the mistake: the cap put on the probabilities
            p = self.softcap * torch.tanh(p / self.softcap)
        return self.o_proj((p @ v).transpose(1, 2).reshape(B, T, H * HD))


class GeGLU(nn.Module):
    def __init__(self, on_up: bool = False) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(D, FF, bias=False), nn.Linear(D, FF, bias=False)
        self.down_proj = nn.Linear(FF, D, bias=False)
        self.on_up = on_up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_proj(x), self.up_proj(x)
        if self.on_up:  # the mistake: the tanh GELU on the up projection
            g, u = u, g
        return self.down_proj(F.gelu(g, approximate="tanh") * u)


class Gemma2Layer(nn.Module):
    def __init__(self, window, cap="divided", post_eps_outside=False, on_up=False) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(D, offset=True)
        self.self_attn = Gemma2Attention(window, cap)
        self.post_attention_layernorm = RMSNorm(D, offset=True, eps_outside=post_eps_outside)
        self.pre_feedforward_layernorm = RMSNorm(D, offset=True)
        self.mlp = GeGLU(on_up)
        self.post_feedforward_layernorm = RMSNorm(D, offset=True)

    def forward(self, x, cos, sin):
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Gemma2LM(nn.Module):
    def __init__(self, layers: list, norm_axis: int = -1) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(D, offset=True, axis=norm_axis)
        self.final_softcap = 15.0

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        x = x * torch.tensor(D**0.5, dtype=x.dtype)  # the normaliser, in the embedding's dtype
        cos, sin = rope_tables(input_ids.shape[1], HD, 10000.0)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.norm(x) @ self.embed_tokens.weight.T  # tied
        return self.final_softcap * torch.tanh(logits / self.final_softcap)


def gemma2(where: str = "", mistake: str = "") -> Gemma2LM:
    """Three layers, sliding (window 3), global, sliding; `mistake` put at layer `where` (or the final norm)."""
    torch.manual_seed(0)
    layers = []
    for i, window in enumerate((WINDOW, None, WINDOW)):
        here = where == str(i)
        layers.append(
            Gemma2Layer(
                window,
                cap=mistake if here and mistake in ("undivided", "after") else "divided",
                post_eps_outside=here and mistake == "post_eps",
                on_up=here and mistake == "on_up",
            )
        )
    return _jitter(Gemma2LM(layers, norm_axis=1 if where == "norm" else -1))  # type: ignore[return-value]


# -- multi-head latent attention in the paper's letters: c^Q, c^KV, a decoupled RoPE key --------------------------

C, CQ, DN, DR, DV = 12, 16, 8, 4, 8  # the kv latent, the query latent, nope, rope, value widths per head


def turn_pairs(x: torch.Tensor, shift: int = 0) -> torch.Tensor:
    """DeepSeek's own rotation: features (2i, 2i + 1) read as one complex number, times e^{i t theta_i}."""
    T, R = x.shape[-2], x.shape[-1]
    inv = 1.0 / 10000.0 ** (torch.arange(0, R, 2, dtype=torch.float64) / R)
    freqs = torch.polar(torch.ones(T, R // 2, dtype=torch.float64), torch.outer(torch.arange(shift, shift + T), inv))
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], R // 2, 2).contiguous())
    return torch.view_as_real(z * freqs).flatten(-2).to(x.dtype)


class LatentAttention(nn.Module):
    """The paper's: c_q = norm(W_DQ h), q_nope = W_UQ c_q, q_rope = RoPE(W_QR c_q) per head; c_kv = norm(W_DKV h),
    k_nope = W_UK c_kv, v = W_UV c_kv per head; one k_rope = RoPE(W_KR h) shared by every head; the scores over
    sqrt(DN + DR), the rope parts turned in DeepSeek's interleaved pairs. Mistakes: `shift` (the rope key turned at
    positions m + shift), `scale_dim` (the divisor)."""

    def __init__(self, kv_eps_outside=False, shift=0, scale_dim=DN + DR) -> None:
        super().__init__()
        self.shift, self.scale_dim = shift, scale_dim
        self.w_dq, self.q_norm = nn.Linear(D, CQ, bias=False), RMSNorm(CQ)
        self.w_uq, self.w_qr = nn.Linear(CQ, H * DN, bias=False), nn.Linear(CQ, H * DR, bias=False)
        self.w_dkv, self.kv_norm = nn.Linear(D, C, bias=False), RMSNorm(C, eps_outside=kv_eps_outside)
        self.w_uk, self.w_uv = nn.Linear(C, H * DN, bias=False), nn.Linear(C, H * DV, bias=False)
        self.w_kr = nn.Linear(D, DR, bias=False)
        self.w_o = nn.Linear(H * DV, D, bias=False)
        self.shift, self.scale_dim = shift, scale_dim

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        B, T, _ = h.shape
        heads = lambda t: t.view(B, T, H, -1).transpose(1, 2)  # noqa: E731
        c_q = self.q_norm(self.w_dq(h))
        q = torch.cat((heads(self.w_uq(c_q)), turn_pairs(heads(self.w_qr(c_q)))), dim=-1)
        c_kv = self.kv_norm(self.w_dkv(h))
        k_rope = turn_pairs(self.w_kr(h)[:, None], self.shift).expand(B, H, T, DR)  # one for every head
        k = torch.cat((heads(self.w_uk(c_kv)), k_rope), dim=-1)
        v = heads(self.w_uv(c_kv))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(self.scale_dim)
        p = s.masked_fill(~band(T, None, h.device), float("-inf")).softmax(dim=-1)
        return self.w_o((p @ v).transpose(1, 2).reshape(B, T, H * DV))


class FusedLatentAttention(LatentAttention):
    """The same math in DeepSeek-V3's fused layout: q_b_proj's rows each head's nope then rope part, kv_a_proj_with_mqa
    the latent then the shared rope key, kv_b_proj's rows each head's keys then values; `pairs`: the rope part turned
    in DeepSeek's interleaved pairs (else in halves, rotate_half)."""

    def __init__(self, kv_eps_outside=False, shift=0, scale_dim=DN + DR, pairs=True) -> None:
        nn.Module.__init__(self)
        self.pairs = pairs
        self.q_a_proj, self.q_a_layernorm = nn.Linear(D, CQ, bias=False), RMSNorm(CQ)
        self.q_b_proj = nn.Linear(CQ, H * (DN + DR), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(D, C + DR, bias=False)
        self.kv_a_layernorm = RMSNorm(C, eps_outside=kv_eps_outside)
        self.kv_b_proj = nn.Linear(C, H * (DN + DV), bias=False)
        self.o_proj = nn.Linear(H * DV, D, bias=False)
        self.shift, self.scale_dim = shift, scale_dim

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        B, T, _ = h.shape
        cos, sin = rope_tables(T, DR, 10000.0)
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(h))).view(B, T, H, DN + DR).transpose(1, 2)
        q_nope, q_rope = q.split((DN, DR), dim=-1)
        latent, k_rope = self.kv_a_proj_with_mqa(h).split((C, DR), dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(B, T, H, DN + DV).transpose(1, 2)
        k_nope, v = kv.split((DN, DV), dim=-1)
        if self.pairs:
            k_rope, q_rope = turn_pairs(k_rope[:, None], self.shift).expand(B, H, T, DR), turn_pairs(q_rope)
        else:
            kcos, ksin = rope_tables(T, DR, 10000.0, self.shift)
            k_rope, q_rope = turn(k_rope[:, None], kcos, ksin).expand(B, H, T, DR), turn(q_rope, cos, sin)
        q = torch.cat((q_nope, q_rope), dim=-1)
        k = torch.cat((k_nope, k_rope), dim=-1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(self.scale_dim)
        p = s.masked_fill(~band(T, None, h.device), float("-inf")).softmax(dim=-1)
        return self.o_proj((p @ v).transpose(1, 2).reshape(B, T, H * DV))


class SwiGLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1, self.w3, self.w2 = (
            nn.Linear(D, FF, bias=False),
            nn.Linear(D, FF, bias=False),
            nn.Linear(FF, D, bias=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MLABlock(nn.Module):
    def __init__(self, attn: LatentAttention) -> None:
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(D), attn
        self.ffn_norm, self.ffn = RMSNorm(D), SwiGLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class MLALM(nn.Module):
    def __init__(self, attns: list, final_eps_outside=False) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.blocks = nn.ModuleList([MLABlock(a) for a in attns])
        self.norm = RMSNorm(D, eps_outside=final_eps_outside)
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def mla(where: str = "", mistake: str = "", style: str = "pairs") -> MLALM:
    """Three MLA blocks; `mistake` ("kv_eps", "shift", "scale") put in block `where` ("norm": the final norm's eps);
    `style`: "pairs" or "halves" (DeepSeek-V3's fused projections, the rope turned in interleaved pairs or in
    halves), "paper" (the paper's separate W_UQ, W_QR, W_UK, W_UV, W_KR, in pairs)."""
    torch.manual_seed(0)
    attns = []
    for i in range(3):
        m = mistake if where == str(i) else ""
        kw = {
            "kv_eps_outside": m == "kv_eps",
            "shift": 1 if m == "shift" else 0,
            "scale_dim": DN if m == "scale" else DN + DR,
        }
        attns.append(LatentAttention(**kw) if style == "paper" else FusedLatentAttention(**kw, pairs=style == "pairs"))
    return _jitter(MLALM(attns, final_eps_outside=where == "norm"))  # type: ignore[return-value]


# -- GPT-OSS in miniature: sinks as an extra column, biases everywhere, a routed clamped SwiGLU ---------------------

E, TOP = 4, 2


class SinkAttention(nn.Module):
    """q/k/v/o with biases, a learned sink logit per head joined to each row's scores as one more column, softmaxed
    with them and dropped. Mistakes: `sink` False (left out), `tiled` (K/V heads by .repeat), `axis` (-2), `rope_v`
    (the values turned too)."""

    def __init__(self, window: int | None, sink=True, tiled=False, axis=-1, rope_v=False) -> None:
        super().__init__()
        self.q_proj, self.o_proj = nn.Linear(D, H * HD), nn.Linear(H * HD, D)
        self.k_proj, self.v_proj = nn.Linear(D, KV * HD), nn.Linear(D, KV * HD)
        self.sinks = nn.Parameter(torch.randn(H))
        self.window, self.sink, self.tiled, self.axis, self.rope_v = window, sink, tiled, axis, rope_v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = turn(self.q_proj(x).view(B, T, H, HD).transpose(1, 2), cos, sin)
        k = turn(self.k_proj(x).view(B, T, KV, HD).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(B, T, KV, HD).transpose(1, 2)
        v = turn(v, cos, sin) if self.rope_v else v
        if self.tiled:  # the mistake: query head h reads K/V head h % KV
            k, v = k.repeat(1, H // KV, 1, 1), v.repeat(1, H // KV, 1, 1)
        else:
            k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        s = (q @ k.transpose(-1, -2)) * HD**-0.5
        s = s.masked_fill(~band(T, self.window, x.device), float("-inf"))
        if self.sink:
            s = torch.cat((s, self.sinks.view(1, H, 1, 1).expand(B, H, T, 1).to(s.dtype)), dim=-1)
        p = s.softmax(dim=self.axis)[..., :T]
        return self.o_proj((p @ v).transpose(1, 2).reshape(B, T, H * HD))


class ClampedExpert(nn.Module):
    alpha, limit = 1.702, 7.0

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(D, FF), nn.Linear(D, FF), nn.Linear(FF, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.gate(x).clamp(max=self.limit)
        u = self.up(x).clamp(-self.limit, self.limit)
        return self.down((u + 1) * g * torch.sigmoid(self.alpha * g))


class RoutedMLP(nn.Module):
    """A router with a bias, the top 2 of 4 experts, their logits softmaxed among themselves."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(D, E)
        self.experts = nn.ModuleList([ClampedExpert() for _ in range(E)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top, idx = self.router(x).topk(TOP, dim=-1)
        w = top.softmax(dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            weight = (w * (idx == e)).sum(-1, keepdim=True)  # 0 where e is not chosen
            out = out + weight * expert(x)
        return out


class StackedExperts(nn.Module):
    """transformers' layout: every expert's (in, out) weights stacked, gate and up interleaved in the columns, with
    biases. `dense`: run on every row at once (bmm) and weighted by the scattered routing weights, 0 for the experts
    not chosen (transformers' inference path); else a loop over the experts hit, each on its own rows, index_add_."""

    alpha, limit = 1.702, 7.0

    def __init__(self, dense: bool) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(E, D, 2 * FF) / math.sqrt(D))
        self.gate_up_proj_bias = nn.Parameter(0.1 * torch.randn(E, 2 * FF))
        self.down_proj = nn.Parameter(torch.randn(E, FF, D) / math.sqrt(FF))
        self.down_proj_bias = nn.Parameter(0.1 * torch.randn(E, D))
        self.dense = dense

    def glu(self, h: torch.Tensor) -> torch.Tensor:
        g, u = h[..., ::2].clamp(max=self.limit), h[..., 1::2].clamp(min=-self.limit, max=self.limit)
        return (u + 1) * g * torch.sigmoid(self.alpha * g)

    def forward(self, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x (N, D), weights (N, E): sum over e of weights[:, e] * expert_e(x)."""
        if self.dense:
            h = torch.bmm(x[None].expand(E, -1, -1), self.gate_up_proj) + self.gate_up_proj_bias[:, None]
            y = torch.bmm(self.glu(h), self.down_proj) + self.down_proj_bias[:, None]
            return (y * weights.T[..., None]).sum(0)
        out = torch.zeros_like(x)
        for e in (weights > 0).any(0).nonzero()[:, 0].tolist():
            rows = (weights[:, e] > 0).nonzero()[:, 0]
            h = x[rows] @ self.gate_up_proj[e] + self.gate_up_proj_bias[e]
            y = self.glu(h) @ self.down_proj[e] + self.down_proj_bias[e]
            out = out.index_add(0, rows, y * weights[rows, e, None])
        return out


class StackedMLP(nn.Module):
    def __init__(self, dense: bool) -> None:
        super().__init__()
        self.router = nn.Linear(D, E)
        self.experts = StackedExperts(dense)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, D)
        top, idx = self.router(rows).topk(TOP, dim=-1)
        weights = torch.zeros(rows.shape[0], E, dtype=rows.dtype).scatter(1, idx, top.softmax(dim=-1))
        return self.experts(rows, weights).view(x.shape)


class OssLayer(nn.Module):
    def __init__(self, attn: SinkAttention, experts: str) -> None:
        super().__init__()
        self.input_layernorm, self.self_attn = RMSNorm(D, eps=1e-5), attn
        self.post_attention_layernorm = RMSNorm(D, eps=1e-5)
        self.mlp = RoutedMLP() if experts == "linears" else StackedMLP(experts == "dense")

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class OssLM(nn.Module):
    def __init__(self, attns: list, experts: str) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([OssLayer(a, experts) for a in attns])
        self.norm = RMSNorm(D, eps=1e-5)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        cos, sin = rope_tables(input_ids.shape[1], HD, 150000.0)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def gpt_oss(where: str = "", mistake: str = "", experts: str = "loop") -> OssLM:
    """Three layers, sliding (window 3), full, sliding; `mistake` ("no_sink", "tiled", "axis") in layer `where`;
    `experts`: "loop" or "dense" (transformers' stacked layout, StackedExperts), "linears" (a ModuleList of experts
    with their own gate / up / down Linears)."""
    torch.manual_seed(0)
    attns = []
    for i, window in enumerate((WINDOW, None, WINDOW)):
        m = mistake if where == str(i) else ""
        kw = {"sink": m != "no_sink", "tiled": m == "tiled", "axis": -2 if m == "axis" else -1, "rope_v": m == "rope_v"}
        attns.append(SinkAttention(window, **kw))
    return _jitter(OssLM(attns, experts))  # type: ignore[return-value]


def _self_check() -> None:
    """The twins said to be one model, checked in float64 with weights carried over: MLA in halves and in the paper's
    letters against the fused model in pairs; GPT-OSS's dense experts and its experts of Linears against the loop;
    the sink as a column against logaddexp(logsumexp(s), sink)."""
    torch.set_default_dtype(torch.float64)
    try:
        ids = torch.randint(0, V, (2, 7))
        ref, halves, paper = mla(), mla(style="halves"), mla(style="paper")
        perm = torch.arange(DR).view(2, DR // 2).T.flatten()  # pair row 2i <- half row i, 2i + 1 <- i + DR / 2
        for a, b, c in zip(ref.blocks, halves.blocks, paper.blocks, strict=True):
            x, y, z = a.attn, b.attn, c.attn
            qb = x.q_b_proj.weight.view(H, DN + DR, CQ)
            kva = x.kv_a_proj_with_mqa.weight
            kvb = x.kv_b_proj.weight.view(H, DN + DV, C)
            y.load_state_dict(x.state_dict())
            with torch.no_grad():
                y.q_b_proj.weight.view(H, DN + DR, CQ)[:, DN:][:, perm] = qb[:, DN:].clone()
                y.kv_a_proj_with_mqa.weight[C:][perm] = kva[C:].clone()
                z.w_dq.weight.copy_(x.q_a_proj.weight), z.q_norm.weight.copy_(x.q_a_layernorm.weight)
                z.w_uq.weight.copy_(qb[:, :DN].reshape(-1, CQ)), z.w_qr.weight.copy_(qb[:, DN:].reshape(-1, CQ))
                (
                    z.w_dkv.weight.copy_(kva[:C]),
                    z.w_kr.weight.copy_(kva[C:]),
                    z.kv_norm.weight.copy_(x.kv_a_layernorm.weight),
                )
                z.w_uk.weight.copy_(kvb[:, :DN].reshape(-1, C)), z.w_uv.weight.copy_(kvb[:, DN:].reshape(-1, C))
                z.w_o.weight.copy_(x.o_proj.weight)
            for other in (b, c):
                for name in ("attn_norm", "ffn_norm", "ffn"):
                    getattr(other, name).load_state_dict(getattr(a, name).state_dict())
        for other in (halves, paper):
            for name in ("embed", "norm", "head"):
                getattr(other, name).load_state_dict(getattr(ref, name).state_dict())
            assert (other(ids) - ref(ids)).abs().max() < 1e-12
        loop, dense, linears = gpt_oss(), gpt_oss(experts="dense"), gpt_oss(experts="linears")
        dense.load_state_dict(loop.state_dict())
        state = {k: v for k, v in loop.state_dict().items() if ".experts." not in k}
        linears.load_state_dict(state, strict=False)
        with torch.no_grad():
            for a, b in zip(loop.layers, linears.layers, strict=True):
                st = a.mlp.experts
                for e, ex in enumerate(b.mlp.experts):
                    ex.gate.weight.copy_(st.gate_up_proj[e][:, ::2].T), ex.gate.bias.copy_(st.gate_up_proj_bias[e, ::2])
                    ex.up.weight.copy_(st.gate_up_proj[e][:, 1::2].T), ex.up.bias.copy_(st.gate_up_proj_bias[e, 1::2])
                    ex.down.weight.copy_(st.down_proj[e].T), ex.down.bias.copy_(st.down_proj_bias[e])
        for other in (dense, linears):
            assert (other(ids) - loop(ids)).abs().max() < 1e-12
        att, x = loop.layers[0].self_attn, torch.randn(2, 7, D)
        cos, sin = rope_tables(7, HD, 150000.0)
        q = turn(att.q_proj(x).view(2, 7, H, HD).transpose(1, 2), cos, sin)
        k = turn(att.k_proj(x).view(2, 7, KV, HD).transpose(1, 2), cos, sin).repeat_interleave(H // KV, dim=1)
        v = att.v_proj(x).view(2, 7, KV, HD).transpose(1, 2).repeat_interleave(H // KV, dim=1)
        s = (q @ k.transpose(-1, -2) / math.sqrt(HD)).masked_fill(~band(7, WINDOW), float("-inf"))
        lse = torch.logaddexp(s.logsumexp(-1, keepdim=True), att.sinks.view(1, H, 1, 1))
        plain = att.o_proj(((s - lse).exp() @ v).transpose(1, 2).reshape(2, 7, D))
        assert (att(x, cos, sin) - plain).abs().max() < 1e-12
    finally:
        torch.set_default_dtype(torch.float32)


CASES = [
    ("f46_gemma2", gemma2, LM, {}, "pass"),
    (
        "f46_gemma2.softcap_on_probabilities_first_layer",
        lambda: gemma2("0", "after"),
        LM,
        {},
        ("mistake", "attention.softcap_after_softmax", "layers.0.self_attn"),
    ),
    (
        "f46_gemma2.post_attention_norm_eps_outside_root_middle_layer",
        lambda: gemma2("1", "post_eps"),
        LM,
        {},
        ("mistake", "rms_norm.eps_outside_sqrt", "layers.1.post_attention_layernorm"),
    ),
    (
        "f46_gemma2.geglu_on_up_middle_layer",
        lambda: gemma2("1", "on_up"),
        LM,
        {},
        ("mistake", "gated_feed_forward.activation_on_up", "layers.1.mlp"),
    ),
    (
        "f46_gemma2.softcap_undivided_last_layer",
        lambda: gemma2("2", "undivided"),
        LM,
        {},
        ("mistake", "attention.softcap_without_division", "layers.2.self_attn"),
    ),
    (
        "f46_gemma2.final_norm_over_positions",
        lambda: gemma2("norm"),
        LM,
        {},
        ("mistake", "rms_norm.wrong_axis", "norm"),
    ),
    ("f46_mla", mla, LM, {}, "pass"),
    ("f46_mla.rope_in_halves", lambda: mla(style="halves"), LM, {}, "pass"),
    ("f46_mla.paper_letters", lambda: mla(style="paper"), LM, {}, "pass"),
    (
        "f46_mla.latent_norm_eps_outside_root_first_layer",
        lambda: mla("0", "kv_eps"),
        LM,
        {},
        ("mistake", "rms_norm.eps_outside_sqrt", "blocks.0.attn.kv_a_layernorm"),
    ),
    (
        "f46_mla.rope_key_one_ahead_middle_layer",
        lambda: mla("1", "shift"),
        LM,
        {},
        ("mistake", "rope.position_offset", "blocks.1.attn"),
    ),
    (
        "f46_mla.scaled_by_nope_width_last_layer",
        lambda: mla("2", "scale"),
        LM,
        {},
        ("mistake", "attention.wrong_scale", "blocks.2.attn"),
    ),
    (
        "f46_mla.final_norm_eps_outside_root",
        lambda: mla("norm"),
        LM,
        {},
        ("mistake", "rms_norm.eps_outside_sqrt", "norm"),
    ),
    ("f46_gpt_oss", gpt_oss, LM, {}, "pass"),
    ("f46_gpt_oss.dense_experts", lambda: gpt_oss(experts="dense"), LM, {}, "pass"),
    ("f46_gpt_oss.expert_linears", lambda: gpt_oss(experts="linears"), LM, {}, "pass"),
    (
        "f46_gpt_oss.sink_missing_first_layer",
        lambda: gpt_oss("0", "no_sink"),
        LM,
        {},
        ("mistake", "attention.sink_missing", "layers.0.self_attn"),
    ),
    (
        "f46_gpt_oss.kv_heads_tiled_middle_layer",
        lambda: gpt_oss("1", "tiled"),
        LM,
        {},
        ("mistake", "attention.kv_heads_tiled", "layers.1.self_attn"),
    ),
    (
        "f46_gpt_oss.softmax_over_queries_last_layer",
        lambda: gpt_oss("2", "axis"),
        LM,
        {},
        ("mistake", "attention.softmax_wrong_axis", "layers.2.self_attn"),
    ),
    (
        "f46_gpt_oss.values_rotated_last_layer",
        lambda: gpt_oss("2", "rope_v"),
        LM,
        {},
        ("mistake", "rope.applied_to_v", "layers.2.self_attn"),
    ),
]
