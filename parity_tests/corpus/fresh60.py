"""Routing and mixtures of experts as 2025-26 learners write them by hand in small decoder-only LMs (issue 46, round
60), in this project's own words. The judge meets them here first (measured with the judge frozen). fresh24's loops
over GPT-OSS's and Mixtral's experts are not repeated. Every model is one small Llama-style LM (RoPE inside the
attention, RMSNorm, pre-norm layers) whose feed-forward is a routed block:

- a Switch Transformer (Fedus et al.): a softmax router whose top-1 probability multiplies its expert's output (not
  renormalised), each expert taking at most ``capacity = int(capacity_factor * tokens / E)`` tokens in order
  (positions by ``cumsum`` of the one-hot choice), the tokens over capacity given 0 (the residual carries them
  unchanged); with a factor of E the capacity is every token, never binding; and the degenerate Switch of one
  expert, whose softmax over one logit is exactly 1, its expert SwiGLU or the paper's ReLU feed-forward;
- expert-choice routing (Zhou et al. 2022): softmax over the experts, each expert picking its top-c tokens
  (``topk`` along the tokens), their gathered scores weighing its outputs, scattered back by ``index_add_``;
- DeepSeekMoE: shared experts always on (a ModuleList of two, summed) beside fine-grained routed experts, top-k of
  the softmax renormalised; DeepSeek-V3's auxiliary-loss-free routing: sigmoid affinities, a bias added for the
  choice only, the chosen affinities normalised over the k and scaled by ``routed_scaling_factor``; and the
  learner's slip of weighing the experts by the biased affinities too;
- Soft MoE (Puigcerver et al. 2023): slots as mixes of the tokens (``x @ phi``, dispatch softmax over the tokens,
  combine softmax over the slots), one expert per group of slots;
- a Mixtral-style router written two ways: top-2 of the logits then softmax over those two; softmax over all the
  experts then top-2, left unrenormalised (Qwen2-MoE's ``norm_topk_prob=False``);
- catalogued mistakes in the second layer's attention (scale 1 / d_head, no causal mask, the mask showing the next
  key), judged at the attention, at the layer where its MoE has a pair, and at the whole model.

Expected verdicts decided from the math (float64 checks, not committed). The reference's mixture (Mixtral, Qwen3-MoE,
DeepSeek V2/V3: ``n_experts``, ``top_k``, ``norm_topk_prob``, ``router_scoring``, ``router_score_bias``,
``routed_scaling``, ``n_shared_experts``) is a softmax or sigmoid router's top-k with or without renormalisation
and optional shared experts. Top-2 then softmax equals softmax then top-2 renormalised (max difference 1e-16), so
both Mixtral routers and DeepSeekMoE and V3 (the reference's V3 adds 1e-20 to the denominator) pass. Switch's top-1
with its probability is ``top_k=1, norm_topk_prob=False``; a capacity of every token keeps each one (its mask all
true for any input): pass; a binding capacity zeroes tokens the reference's block never drops: no pair at the block
(its ``cumsum``). One expert: the router's softmax is 1 for any input, so the block is exactly its SwiGLU expert (0
difference): pass as a gated feed-forward and as a model, and with the paper's ReLU expert a dense ReLU feed-forward
(pass). V3's bias in the weights too is no router of the reference (its bias chooses, never weighs; the output moves
by 0.12): no pair at the block, its ``e_score_correction_bias``. Expert choice selects along the tokens (no pair,
``topk``), Soft MoE mixes tokens by a softmax over them (no pair, ``softmax``). At the whole model the first
layer's block departs before the second layer's attention: the no pair is said there; where the block has a pair
the attention's mistake is named. Float64 figures: top-2 then softmax against softmax, top-2, renormalised 1.1e-16
(same experts); the Switch against a per-token rewrite 5.6e-17, with a capacity of every token against none 0, with
a factor of 1 two of 16 rows zeroed; DeepSeekMoE and V3 against per-token rewrites 2.4e-16 and 2.8e-16; the attention
against a head-by-head loop 1.1e-16; Soft MoE's first row moves by 3e-2 when the last token changes. Changed after
the run, for a math reason: the attention's second-layer mistakes were first K Q^T (``attention.q_k_swapped``) and
an attention without its mask, judged alone; with as many key as query heads K Q^T under the causal mask is the
reference's attention with the two projections exchanged (s_ij = (W_k x_i) . (W_q x_j) for j <= i, RoPE included),
and an attention alone with no mask is the reference's unmasked attention, so both pass (the judge passes them);
the mask that shows the next key (``attention.causal_shows_next``) replaced them.

First met: 12 of 20 right. Wrong:

- f60_switch.capacity_binds and f60_switch.capacity_never_binds: FAILED with no id and no op (the ``torch.max``
  router not read; the first two experts mapped as the dense feed-forwards of layers 0 and 1);
- f60_switch.capacity_binds.shows_next_second_layer: ``attention.causal_shows_next`` at ``layers.1.attn``, past the
  first layer's capacity;
- f60_expert_choice and its wrong_scale_second_layer twin: "could not judge: top_k must be in [1, n_experts=4], got
  9; pass call= (how to call it) or mapping= (the weight map)" (the top-c over the tokens read as a router's top-k);
- f60_deepseek_moe: "could not judge: found 9 experts run after layers.0.ffn.gate.weight in the module, the reference
  'transformer_lm' has 8; pass mapping=" (two shared experts summed, one wide SwiGLU block in the reference);
- f60_deepseek_v3: "differs at lm_head: every part agrees in situ, the output departs after the last: linear in
  lm_head, which the reference has no pair for" (``output_bias=True`` assumed, the head has none; its twin with the
  next key shown in the second layer is named right);
- f60_deepseek_v3.bias_weighs: FAILED with no id and no op ("unexplained: (the module): ... not expressible by the
  config and no catalogue variant reproduces it").

Fixed since: ``torch.max`` (or ``argmax``) over an axis of a router's probabilities is read as its top-1 (``topk`` of
k = 1; over one expert, whose probability is 1, no choice, the block dense as before); a top-k along another axis
than the router's scores (expert choice's tokens) is no router's, said at the block, not refused as a ``top_k`` the
config rejects; a ``cumsum`` of what a router's top-k chose (an expert's capacity) is said where it runs. A router's
choice bias (V3's) is no longer taken for a loose 1-D parameter (an output bias the head lacks), and the biased
scores read as the gates (summed, divided, multiplied on their way to the experts) are said at the block. Shared
experts run apart and summed are the reference's one wide shared block, each one its run of that block's hidden
units (its gate and up rows, its down's columns: ``columns a:b:1`` in the printed map).

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

D, H, HD, V, LAYERS = 32, 4, 8, 48, 2
E, TOP, FF = 4, 2, 16  # experts, experts a token, an expert's width


def _rope(x: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Llama's rotation of (B, H, T, HD) by halves."""
    T = x.shape[-2]
    inv = theta ** -(torch.arange(0, HD, 2, dtype=x.dtype) / HD)
    ang = torch.outer(torch.arange(T, dtype=x.dtype), inv)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int = D, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class Attention(nn.Module):
    """Causal multi-head attention with RoPE; `mistake`: "wrong_scale" (1 / d_head), "not_causal", "shows_next" (the
    mask's triu(2): each query also sees the next key)."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(D, D, bias=False) for _ in range(4))
        self.mistake = mistake

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = (w(x).view(B, T, H, HD).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = _rope(q), _rope(k)
        s = q @ k.transpose(-1, -2) / (HD if self.mistake == "wrong_scale" else HD**0.5)
        if self.mistake != "not_causal":
            hidden = torch.ones(T, T, dtype=torch.bool).triu(2 if self.mistake == "shows_next" else 1)
            s = s.masked_fill(hidden, float("-inf"))
        return self.wo((s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D))


class Expert(nn.Module):
    """A SwiGLU expert, Mixtral's names; `relu`: the Switch paper's (T5's) expert, w2(relu(w1 x)) without biases."""

    def __init__(self, width: int = FF, relu: bool = False) -> None:
        super().__init__()
        self.w1, self.w2 = nn.Linear(D, width, bias=False), nn.Linear(width, D, bias=False)
        self.w3 = None if relu else nn.Linear(D, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is None:
            return self.w2(F.relu(self.w1(x)))
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


# -- Switch Transformer: top-1 with a capacity factor -----------------------------------------------------------------


class SwitchFFN(nn.Module):
    def __init__(self, n_experts: int = E, capacity_factor: float | None = 1.0, relu: bool = False) -> None:
        super().__init__()
        self.switch = nn.Linear(D, n_experts, bias=False)
        self.experts = nn.ModuleList([Expert(relu=relu) for _ in range(n_experts)])
        self.n_experts, self.capacity_factor = n_experts, capacity_factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        tokens = x.reshape(-1, D)
        probs = torch.softmax(self.switch(tokens), dim=-1)
        route_prob_max, routes = torch.max(probs, dim=-1)
        out = torch.zeros_like(tokens)
        if self.capacity_factor is None:  # no capacity: every token to its expert
            keep = torch.ones_like(routes, dtype=torch.bool)
        else:
            capacity = int(self.capacity_factor * tokens.shape[0] / self.n_experts)
            onehot = F.one_hot(routes, self.n_experts)
            position = (torch.cumsum(onehot, dim=0) * onehot).sum(-1) - 1  # the token's place in its expert's queue
            keep = position < capacity
        for i, expert in enumerate(self.experts):
            idx = torch.nonzero((routes == i) & keep).flatten()
            out[idx] = expert(tokens[idx]) * route_prob_max[idx, None]
        return out.view(B, T, D)


# -- expert choice: each expert picks its top-c tokens ---------------------------------------------------------------


class ExpertChoiceFFN(nn.Module):
    def __init__(self, capacity: int = 2) -> None:
        super().__init__()
        self.gate = nn.Linear(D, E, bias=False)
        self.experts = nn.ModuleList([Expert() for _ in range(E)])
        self.capacity = capacity  # tokens per expert = capacity * tokens / experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        tokens = x.reshape(-1, D)
        n = tokens.shape[0]
        c = self.capacity * n // E
        scores = self.gate(tokens).softmax(dim=-1)  # (n, E)
        gates, index = torch.topk(scores.t(), c, dim=-1)  # (E, c): each expert's tokens
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            out.index_add_(0, index[e], gates[e, :, None] * expert(tokens[index[e]]))
        return out.view(B, T, D)


# -- DeepSeekMoE: shared experts and fine-grained routed experts; V3's auxiliary-loss-free router ---------------------


class DeepSeekMoE(nn.Module):
    """`v3`: sigmoid affinities, `e_score_correction_bias` added for the choice only, the chosen normalised;
    `bias_weighs`: the learner's slip of weighing the experts by the biased affinities too."""

    bias_weighs = False

    def __init__(self, n_routed: int = 8, k: int = 2, n_shared: int = 2, v3: bool = False, scale: float = 1.0) -> None:
        super().__init__()
        self.gate = nn.Linear(D, n_routed, bias=False)
        self.experts = nn.ModuleList([Expert(FF // 2) for _ in range(n_routed)])
        self.shared_experts = nn.ModuleList([Expert(FF // 2) for _ in range(n_shared)])
        self.k, self.v3, self.scale = k, v3, scale
        if v3:
            self.e_score_correction_bias = nn.Parameter(0.3 * torch.randn(n_routed), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        tokens = x.reshape(-1, D)
        logits = self.gate(tokens)
        if self.v3:
            affinity = logits.sigmoid()
            biased, topk_idx = (affinity + self.e_score_correction_bias).topk(self.k, dim=-1)
            weight = biased if self.bias_weighs else affinity.gather(-1, topk_idx)
            weight = weight / weight.sum(dim=-1, keepdim=True) * self.scale
        else:
            weight, topk_idx = logits.softmax(dim=-1).topk(self.k, dim=-1)
            weight = weight / weight.sum(dim=-1, keepdim=True)
        y = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.where(topk_idx == e)
            y.index_add_(0, rows, weight[rows, slot, None] * expert(tokens[rows]))
        for shared in self.shared_experts:
            y = y + shared(tokens)
        return y.view(B, T, D)


# -- Soft MoE: slots as softmax mixes of the tokens --------------------------------------------------------------------


class SoftMoE(nn.Module):
    def __init__(self, slots_per_expert: int = 2) -> None:
        super().__init__()
        self.phi = nn.Parameter(torch.randn(D, E * slots_per_expert) / D**0.5)
        self.experts = nn.ModuleList([Expert() for _ in range(E)])
        self.slots = slots_per_expert

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = x @ self.phi  # (B, T, E S)
        dispatch = logits.softmax(dim=1)  # over the tokens
        combine = logits.softmax(dim=-1)  # over the slots
        slots = dispatch.transpose(1, 2) @ x  # (B, E S, D)
        outs = torch.cat(
            [ex(s) for ex, s in zip(self.experts, slots.split(self.slots, dim=1), strict=True)], dim=1
        )  # (B, E S, D)
        return combine @ outs


# -- Mixtral's router two ways ---------------------------------------------------------------------------------------


class MixtralFFN(nn.Module):
    """`order`: "topk_softmax" (top-2 logits, softmax over them) or "softmax_topk" (softmax, top-2, no renorm)."""

    def __init__(self, order: str = "topk_softmax") -> None:
        super().__init__()
        self.gate = nn.Linear(D, E, bias=False)
        self.experts = nn.ModuleList([Expert() for _ in range(E)])
        self.order = order

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        tokens = x.view(-1, D)
        logits = self.gate(tokens)
        if self.order == "topk_softmax":
            weights, selected = torch.topk(logits, TOP)
            weights = F.softmax(weights, dim=1, dtype=torch.float).to(tokens.dtype)
        else:
            weights, selected = torch.topk(F.softmax(logits, dim=1), TOP)
        out = torch.zeros_like(tokens)
        for i, expert in enumerate(self.experts):
            batch_idx, nth = torch.where(selected == i)
            out[batch_idx] += weights[batch_idx, nth, None] * expert(tokens[batch_idx])
        return out.view(B, T, D)


# -- the LM ----------------------------------------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, ffn: nn.Module, mistake: str = "") -> None:
        super().__init__()
        self.attn_norm, self.ffn_norm = RMSNorm(), RMSNorm()
        self.attn, self.ffn = Attention(mistake), ffn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class MoeLM(nn.Module):
    def __init__(self, make_ffn, mistake_second: str = "") -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(V, D)
        self.layers = nn.ModuleList([Block(make_ffn(), mistake_second if i == 1 else "") for i in range(LAYERS)])
        self.norm = RMSNorm()
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(idx)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains moved off their 1s, so that a trained model's values are checked."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def lm(make_ffn, mistake_second: str = "") -> MoeLM:
    torch.manual_seed(0)
    return _jitter(MoeLM(make_ffn, mistake_second))


def switch(capacity_factor: float | None = 1.0, n_experts: int = E, mistake_second: str = "", relu=False) -> MoeLM:
    return lm(lambda: SwitchFFN(n_experts, capacity_factor, relu), mistake_second)


def expert_choice(mistake_second: str = "") -> MoeLM:
    return lm(ExpertChoiceFFN, mistake_second)


def deepseek(v3: bool = False, mistake_second: str = "", bias_weighs: bool = False) -> MoeLM:
    model = lm(lambda: DeepSeekMoE(v3=v3, n_shared=1 if v3 else 2, scale=2.5 if v3 else 1.0), mistake_second)
    for layer in model.layers:
        layer.ffn.bias_weighs = bias_weighs
    return model


def soft_moe(mistake_second: str = "") -> MoeLM:
    return lm(SoftMoE, mistake_second)


def mixtral(order: str = "topk_softmax", mistake_second: str = "") -> MoeLM:
    return lm(lambda: MixtralFFN(order), mistake_second)


LM, MHA, LAYER, GFF = "transformer_lm", "multi_head_attention", "decoder_only_layer", "gated_feed_forward"
SCALE, NOT_CAUSAL, NEXT = "attention.wrong_scale", "attention.not_causal", "attention.causal_shows_next"
CASES = [
    ("f60_switch.capacity_binds", switch, LM, {}, ("no pair", "layers.0.ffn", "cumsum")),
    ("f60_switch.capacity_never_binds", lambda: switch(float(E)), LM, {}, "pass"),
    ("f60_switch.one_expert", lambda: switch(None, 1), LM, {}, "pass"),
    ("f60_switch.one_expert.ffn", lambda: switch(None, 1).layers[0].ffn, GFF, {}, "pass"),
    ("f60_switch.one_expert.relu", lambda: switch(None, 1, relu=True), LM, {}, "pass"),
    (
        "f60_switch.capacity_binds.shows_next_second_layer",
        lambda: switch(mistake_second="shows_next"),
        LM,
        {},
        ("no pair", "layers.0.ffn", "cumsum"),
    ),
    ("f60_expert_choice", expert_choice, LM, {}, ("no pair", "layers.0.ffn", "topk")),
    (
        "f60_expert_choice.attention.wrong_scale_second_layer",
        lambda: expert_choice("wrong_scale").layers[1].attn,
        MHA,
        {},
        ("mistake", SCALE, ""),
    ),
    (
        "f60_expert_choice.wrong_scale_second_layer",
        lambda: expert_choice("wrong_scale"),
        LM,
        {},
        ("no pair", "layers.0.ffn", "topk"),
    ),
    ("f60_deepseek_moe", deepseek, LM, {}, "pass"),
    ("f60_deepseek_v3", lambda: deepseek(v3=True), LM, {}, "pass"),
    (
        "f60_deepseek_v3.bias_weighs",
        lambda: deepseek(v3=True, bias_weighs=True),
        LM,
        {},
        ("no pair", "layers.0.ffn", "e_score_correction_bias"),
    ),
    (
        "f60_deepseek_v3.shows_next_second_layer",
        lambda: deepseek(True, "shows_next"),
        LM,
        {},
        ("mistake", NEXT, "layers.1.attn"),
    ),
    (
        "f60_deepseek_v3.layer.not_causal",
        lambda: deepseek(True, "not_causal").layers[1],
        LAYER,
        {},
        ("mistake", NOT_CAUSAL, "attn"),
    ),
    ("f60_soft_moe", soft_moe, LM, {}, ("no pair", "layers.0.ffn", "softmax")),
    (
        "f60_soft_moe.not_causal_second_layer",
        lambda: soft_moe("not_causal"),
        LM,
        {},
        ("no pair", "layers.0.ffn", "softmax"),
    ),
    (
        "f60_soft_moe.attention.shows_next_second_layer",
        lambda: soft_moe("shows_next").layers[1].attn,
        MHA,
        {},
        ("mistake", NEXT, ""),
    ),
    ("f60_mixtral.topk_softmax", mixtral, LM, {}, "pass"),
    ("f60_mixtral.softmax_topk", lambda: mixtral("softmax_topk"), LM, {}, "pass"),
    (
        "f60_mixtral.layer.wrong_scale",
        lambda: mixtral(mistake_second="wrong_scale").layers[1],
        LAYER,
        {},
        ("mistake", SCALE, "attn"),
    ),
]
