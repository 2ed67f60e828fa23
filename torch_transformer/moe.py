"""A sparse mixture-of-experts block (Mixtral, Qwen3-MoE) as a PyTorch user writes it; autograd does the backward.

    router logits z = x W_r^T, p = softmax(z), top-k of p, gates renormalised over the k (norm_topk_prob),
    y = sum over the k chosen experts of gate * expert(x), each expert SwiGLU with a fused gate/up weight.

The parameter names are transformers' below `model.layers.{i}.mlp.`: `gate.weight` (E, D),
`experts.gate_up_proj` (E, 2F, D), `experts.down_proj` (E, D, F), so a Mixtral or Qwen3-MoE block's state dict
loads as it is. Shape letters: N rows (B * T), D d_model, E experts, k experts per row, F an expert's width.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .layers import ACTIVATIONS


class TopKRouter(nn.Module):
    """Scores the experts for each row and keeps the k best: returns (logits (N, E), gates (N, k), selected (N, k))."""

    def __init__(self, d_model: int, num_experts: int, top_k: int, norm_topk_prob: bool = True):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must be in [1, num_experts={num_experts}], got {top_k}")
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob
        self.weight = nn.Parameter(torch.empty(num_experts, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: Tensor, selected: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        logits = F.linear(x, self.weight)  # (N, E)
        probs = F.softmax(logits, dim=-1)
        if selected is None:  # `selected` replays a given choice (equal probabilities: topk's order is unspecified)
            gates, selected = torch.topk(probs, self.top_k, dim=-1)  # (N, k), largest first
        else:
            gates = probs.gather(-1, selected)
        if self.norm_topk_prob:
            gates = gates / gates.sum(dim=-1, keepdim=True)
        return logits, gates, selected


class Experts(nn.Module):
    """E gated feed-forward experts stored as two 3-D weights; each runs only on the rows routed to it."""

    def __init__(self, d_model: int, d_ff: int, num_experts: int, activation: str = "silu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.activation = activation
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * d_ff, d_model))  # gate rows, then up rows
        self.down_proj = nn.Parameter(torch.empty(num_experts, d_model, d_ff))
        nn.init.normal_(self.gate_up_proj, std=0.02)
        nn.init.normal_(self.down_proj, std=0.02)

    def forward(self, x: Tensor, selected: Tensor, gates: Tensor) -> Tensor:
        act = ACTIVATIONS[self.activation]
        out = torch.zeros_like(x)  # (N, D)
        for e in range(self.gate_up_proj.shape[0]):
            rows, slot = torch.where(selected == e)  # the rows that chose expert e, and in which of their k places
            if rows.numel() == 0:
                continue
            gate, up = F.linear(x[rows], self.gate_up_proj[e]).chunk(2, dim=-1)  # (n_e, F) each
            expert_out = F.linear(act(gate) * up, self.down_proj[e])  # (n_e, D)
            out = out.index_add(0, rows, expert_out * gates[rows, slot, None])
        return out


class SparseMoeBlock(nn.Module):
    """The feed-forward block of Mixtral and Qwen3-MoE: x (B, T, D) -> (y (B, T, D), router logits (B * T, E))."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        num_experts: int,
        top_k: int,
        norm_topk_prob: bool = True,
        activation: str = "silu",
    ):
        super().__init__()
        self.gate = TopKRouter(d_model, num_experts, top_k, norm_topk_prob)
        self.experts = Experts(d_model, d_ff, num_experts, activation)

    def forward(self, x: Tensor, selected: Tensor | None = None) -> tuple[Tensor, Tensor]:
        flat = x.reshape(-1, x.shape[-1])  # (N, D)
        logits, gates, selected = self.gate(flat, selected)
        return self.experts(flat, selected, gates).reshape(x.shape), logits


class MoeFeedForward(nn.Module):
    """A decoder layer's feed-forward block as a sparse mixture of experts (config.is_moe_layer): state-dict names
    `router.weight` (E, D), `experts.gate_up_proj`, `experts.down_proj` below the layer's `ffn.` (transformers'
    `mlp.gate.weight` is our `ffn.router.weight`). x (B, T, D) -> (B, T, D); the router logits (B * T, E) of the
    last call stay in `router_logits`, part of the graph, for the load-balancing loss."""

    def __init__(
        self, d_model: int, d_expert: int, num_experts: int, top_k: int, norm_topk_prob: bool, activation: str
    ):
        super().__init__()
        self.router = TopKRouter(d_model, num_experts, top_k, norm_topk_prob)
        self.experts = Experts(d_model, d_expert, num_experts, activation)
        self.router_logits: Tensor | None = None

    def forward(self, x: Tensor, dropout_mask: Tensor | None = None) -> Tensor:
        """dropout_mask: always None (the experts have no dropout site, whatever the activation dropout's rate)."""
        flat = x.reshape(-1, x.shape[-1])  # (N, D)
        self.router_logits, gates, selected = self.router(flat)
        return self.experts(flat, selected, gates).reshape(x.shape)


def load_balancing_loss(
    router_logits: Sequence[Tensor], num_experts: int, top_k: int, attention_mask: Tensor | None = None
) -> Tensor:
    """Switch Transformer's auxiliary loss over L layers' router logits (each (N, E)): E * sum_e f_e * P_e, with f_e
    the share of the top-k choices that went to expert e and P_e the mean probability it was given, both pooled over
    the layers and over the real tokens of attention_mask (B, T). Computed in the logits' dtype."""
    if not isinstance(router_logits, (list, tuple)) or not router_logits:
        raise TypeError(f"router_logits must be a non-empty list or tuple of (N, E) tensors, got {type(router_logits)}")
    probs = torch.stack([F.softmax(z, dim=-1) for z in router_logits])  # (L, N, E)
    chosen = torch.topk(probs, top_k, dim=-1).indices  # (L, N, k)
    routed = F.one_hot(chosen, num_experts).sum(dim=-2).to(probs.dtype)  # (L, N, E): 1 where e is among the k
    if attention_mask is None:
        weight = torch.ones(probs.shape[1], dtype=probs.dtype, device=probs.device)
    else:
        weight = attention_mask.reshape(-1).to(probs.dtype)  # (N,)
    total = weight.sum() * probs.shape[0]
    fraction_routed = torch.einsum("n,lne->e", weight, routed) / total  # (E,)
    mean_prob = torch.einsum("n,lne->e", weight, probs) / total  # (E,)
    return num_experts * torch.dot(fraction_routed, mean_prob)
