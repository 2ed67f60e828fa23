"""GPT-OSS's mixture of experts as a PyTorch user writes it; autograd does the backward.

    router logits z = x W_r^T + b_r, the k largest kept and softmaxed among themselves,
    y = sum over the k chosen experts of gate * expert(x), each expert
    h = x W_gu[e] + b_gu[e] (gate columns even, up columns odd), a = min(gate, L), u = clamp(up, -L, L),
    expert(x) = ((u + 1) * a * sigmoid(alpha a)) W_d[e] + b_d[e].

Parameter names are transformers' below `model.layers.{i}.mlp.`: `router.weight` (E, D), `router.bias` (E,),
`experts.gate_up_proj` (E, D, 2F), `experts.gate_up_proj_bias` (E, 2F), `experts.down_proj` (E, F, D),
`experts.down_proj_bias` (E, D): the weights stored (in, out), as GptOssExperts holds them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class GptOssRouter(nn.Module):
    """Top-k of the logits, then a softmax over the k kept: returns (logits (N, E), gates (N, k), selected (N, k))."""

    def __init__(self, d_model: int, num_experts: int, top_k: int):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must be in [1, num_experts={num_experts}], got {top_k}")
        self.top_k = top_k
        self.weight = nn.Parameter(torch.empty(num_experts, d_model))
        self.bias = nn.Parameter(torch.zeros(num_experts))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        logits = F.linear(x, self.weight, self.bias)  # (N, E)
        kept, selected = torch.topk(logits, self.top_k, dim=-1)  # (N, k), largest first
        return logits, torch.softmax(kept, dim=-1), selected


class GptOssExperts(nn.Module):
    """E experts with biases and a clamped SwiGLU (limit L, sigmoid gain alpha); each runs only on its rows."""

    def __init__(self, d_model: int, d_ff: int, num_experts: int, limit: float = 7.0, alpha: float = 1.702):
        super().__init__()
        self.limit, self.alpha = limit, alpha
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, d_model, 2 * d_ff))
        self.gate_up_proj_bias = nn.Parameter(torch.zeros(num_experts, 2 * d_ff))
        self.down_proj = nn.Parameter(torch.empty(num_experts, d_ff, d_model))
        self.down_proj_bias = nn.Parameter(torch.zeros(num_experts, d_model))
        nn.init.normal_(self.gate_up_proj, std=0.02)
        nn.init.normal_(self.down_proj, std=0.02)

    def activation(self, gate_up: Tensor) -> Tensor:
        """(n, 2F) interleaved -> (n, F): (clamp(up) + 1) * a sigmoid(alpha a), a = gate clamped from above."""
        gate = gate_up[:, 0::2].clamp(max=self.limit)
        up = gate_up[:, 1::2].clamp(-self.limit, self.limit)
        return (up + 1) * (gate * torch.sigmoid(self.alpha * gate))

    def forward(self, x: Tensor, selected: Tensor, gates: Tensor) -> Tensor:
        out = torch.zeros_like(x)  # (N, D)
        for e in range(self.gate_up_proj.shape[0]):
            rows, slot = torch.where(selected == e)  # the rows that chose expert e, and in which of their k places
            if rows.numel() == 0:
                continue
            hidden = self.activation(x[rows] @ self.gate_up_proj[e] + self.gate_up_proj_bias[e])  # (n_e, F)
            expert_out = hidden @ self.down_proj[e] + self.down_proj_bias[e]  # (n_e, D)
            out = out.index_add(0, rows, expert_out * gates[rows, slot, None])
        return out


class GptOssFeedForward(nn.Module):
    """A GPT-OSS decoder layer's feed-forward block (config.expert_kind "gpt_oss"): x (B, T, D) -> (B, T, D); the
    router logits (B * T, E) of the last call stay in `router_logits`, part of the graph, for the load-balancing
    loss."""

    def __init__(
        self, d_model: int, d_expert: int, num_experts: int, top_k: int, limit: float = 7.0, alpha: float = 1.702
    ):
        super().__init__()
        self.router = GptOssRouter(d_model, num_experts, top_k)
        self.experts = GptOssExperts(d_model, d_expert, num_experts, limit, alpha)
        self.router_logits: Tensor | None = None

    def forward(self, x: Tensor, dropout_mask: Tensor | None = None) -> Tensor:
        """dropout_mask: always None (the experts have no dropout site)."""
        flat = x.reshape(-1, x.shape[-1])  # (N, D)
        self.router_logits, gates, selected = self.router(flat)
        return self.experts(flat, selected, gates).reshape(x.shape)
