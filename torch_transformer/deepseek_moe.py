"""DeepSeek's mixture of experts (V2, V3) as a PyTorch user writes it; autograd does the backward.

    s = sigmoid(x W_r^T) (V3) or softmax (V2); choose the top k of s + score_bias (the bias chooses, it does not
    weigh) among the best router_topk_groups of router_groups groups (a group's score: its two best); weights
    s_chosen (/ their sum + 1e-20 with norm_topk_prob) * routed_scaling; y = sum of weight * expert(x) + shared(x).

State-dict names below the layer's `ffn.`: router.weight (E, D), router.score_bias (E,) (a buffer: V3's
e_score_correction_bias), experts.gate_up_proj, experts.down_proj (moe.Experts), shared.gate / linear1 / linear2.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from transformer_spec.config import TransformerConfig

from .layers import FeedForward
from .moe import Experts


class DeepseekRouter(nn.Module):
    """Scores E experts per row and keeps k: returns (weights (N, k), selected (N, k))."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        c = config
        self.top_k, self.scoring, self.norm_topk_prob, self.scaling = (
            c.top_k,
            c.router_scoring,
            c.norm_topk_prob,
            c.routed_scaling,
        )
        self.groups, self.topk_groups = c.router_groups, c.router_topk_groups
        self.weight = nn.Parameter(torch.empty(c.n_experts, c.d_model))
        nn.init.normal_(self.weight, std=0.02)
        self.score_bias: Tensor | None
        if c.router_score_bias:
            self.register_buffer("score_bias", torch.zeros(c.n_experts))
        else:
            self.score_bias = None

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        logits = x @ self.weight.T  # (N, E)
        scores = logits.sigmoid() if self.scoring == "sigmoid" else logits.softmax(dim=-1)
        with torch.no_grad():  # the choice: no gradient
            choice = scores if self.score_bias is None else scores + self.score_bias
            if self.groups > 1 and self.topk_groups < self.groups:
                grouped = choice.unflatten(-1, (self.groups, -1))  # (N, G, E/G)
                best_groups = grouped.topk(2, dim=-1).values.sum(-1).topk(self.topk_groups, dim=-1).indices
                keep = torch.zeros_like(grouped[..., 0], dtype=torch.bool).scatter(1, best_groups, True)  # (N, G)
                choice = grouped.masked_fill(~keep[..., None], float("-inf")).flatten(1)
            selected = choice.topk(self.top_k, dim=-1).indices  # (N, k)
        weights = scores.gather(1, selected)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.scaling, selected


class DeepseekMoe(nn.Module):
    """A decoder layer's feed-forward block, DeepSeek's: routed experts plus shared ones. x (B, T, D) -> (B, T, D)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        c = config
        self.router = DeepseekRouter(c)
        self.experts = Experts(c.d_model, c.expert_width, c.n_experts, c.activation)
        self.shared = (
            FeedForward(c.d_model, c.n_shared_experts * c.expert_width, c.activation, gated=True, bias=False)
            if c.n_shared_experts
            else None
        )

    def forward(self, x: Tensor, dropout_mask: Tensor | None = None) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])  # (N, D)
        weights, selected = self.router(flat)
        y = self.experts(flat, selected, weights)
        if self.shared is not None:
            y = y + self.shared(flat)
        return y.reshape(x.shape)
