r"""DeepSeek's mixture of experts (DeepSeek-V2 and V3), each piece a forward/backward pair written by hand.

A router scores the E routed experts of every row; the chosen k run and are summed with their weights, and the
shared experts (one SwiGLU block :math:`S F_e` wide, S = n_shared_experts) run on every row beside them:

.. math::

    \begin{gathered}
    z = x W_r^\top, \qquad s = \sigma(z) \ \text{(V3)} \ \text{or}\ \mathrm{softmax}(z) \ \text{(V2)}, \\
    S = \mathrm{topk}_{\text{groups}}(s + b, k), \\
    w_j = \rho\, \frac{s_{S_j}}{\sum_{i < k} s_{S_i} + \epsilon} \ (\mathrm{norm\_topk\_prob}), \
    \text{else } w_j = \rho\, s_{S_j}, \\
    y = \sum_{j < k} w_j\, \mathrm{FFN}_{S_j}(x) + \mathrm{FFN}_{\text{shared}}(x)
    \end{gathered}

b is V3's e_score_correction_bias (E,): added to the scores to choose, never to weigh (the weights read s). The
group-limited choice (n_group groups of E / n_group experts, V3's noaux_tc) ranks each group by the sum of its two
best biased scores, keeps the topk_group best groups and takes the top k among their experts. ρ is
routed_scaling_factor, ε = 1e-20 (transformers'). The choice is piecewise constant: the gradient reaches the
router through the chosen weights only, and b gets none.

Shape letters: N rows (B * T), D d_model, E routed experts, k experts per row, G groups, F_e an expert's width.
State-dict names below ``ffn.``: router.weight (E, D), router.score_bias (E,) (V3), experts.gate_up_proj
(E, 2 F_e, D), experts.down_proj (E, D, F_e) (moe.py's experts), shared.gate.weight, shared.linear1.weight
(S F_e, D), shared.linear2.weight (D, S F_e).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layers import (
    GatedFeedForwardCache,
    LinearCache,
    SoftmaxCache,
    gated_feed_forward_backward,
    gated_feed_forward_forward,
    linear_backward,
    linear_forward,
    softmax_backward,
    softmax_forward,
)
from .moe import ExpertsCache, check_selected, check_top_k, experts_backward, experts_forward
from .validation import check_float_array

NORM_EPS = 1e-20  # transformers' V3 router adds it to the chosen scores' sum
SCORINGS = ("softmax", "sigmoid")


def sigmoid(z: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-z), without overflow for large |z|, in z's dtype."""
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1 / (1 + e), e / (1 + e))


def group_limited_top_k(choice: np.ndarray, top_k: int, n_groups: int, topk_groups: int) -> np.ndarray:
    """The k experts of each row of choice (N, E) with the largest scores among the topk_groups best of n_groups
    groups (E / n_groups consecutive experts each; a group's score: the sum of its two largest entries), largest
    first, ties to the lower index. n_groups = topk_groups: a plain top-k. (N, k) integers."""
    N, E = choice.shape
    if n_groups > 1 and topk_groups < n_groups:
        grouped = choice.reshape(N, n_groups, E // n_groups)  # (N, G, E/G)
        group_score = -np.sort(-grouped, axis=-1)[..., :2].sum(axis=-1)  # (N, G): the two best of each group
        kept = np.argsort(-group_score, axis=-1, kind="stable")[:, :topk_groups]  # (N, topk_groups)
        keep = np.zeros((N, n_groups), dtype=bool)
        np.put_along_axis(keep, kept, True, axis=-1)
        choice = np.where(np.repeat(keep, E // n_groups, axis=-1), choice, -np.inf)  # other groups' experts out
    return np.argsort(-choice, axis=-1, kind="stable")[:, :top_k]  # (N, k)


@dataclass(frozen=True, slots=True)
class RouterCache:
    """What router_backward needs, by name."""

    scoring: str  # "softmax" or "sigmoid"
    scores: np.ndarray  # s, (N, E)
    selected: np.ndarray  # S, (N, k)
    chosen: np.ndarray  # s at S, (N, k)
    denominator: np.ndarray | None  # sum of the chosen s + eps, (N, 1); None without norm_topk_prob
    scaling: float  # rho


def router_forward(
    logits: np.ndarray,
    top_k: int,
    *,
    scoring: str = "sigmoid",
    score_bias: np.ndarray | None = None,
    n_groups: int = 1,
    topk_groups: int = 1,
    norm_topk_prob: bool = True,
    scaling: float = 1.0,
    selected: np.ndarray | None = None,
) -> tuple[tuple[np.ndarray, np.ndarray], RouterCache]:
    r"""Router logits z (N, E) -> the weights w (N, k) of the chosen experts S (N, k) (the module's formula).
    score_bias (E,): added to the scores for the choice only. selected (N, k): a choice to replay instead.
    Returns (weights, selected) and a RouterCache."""
    check_float_array("logits", logits)
    if logits.ndim != 2:
        raise ValueError(f"logits must have shape (N, E), got shape {logits.shape}")
    N, E = logits.shape
    top_k = check_top_k(top_k, E)
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
    if n_groups < 1 or E % n_groups or not 1 <= topk_groups <= n_groups:
        raise ValueError(
            f"n_groups must divide E={E} and topk_groups be in [1, n_groups], got {n_groups}, {topk_groups}"
        )
    scores = sigmoid(logits) if scoring == "sigmoid" else softmax_forward(logits)[0]  # s (N, E)
    if selected is None:
        choice = scores if score_bias is None else scores + score_bias  # the bias chooses ...
        selected = group_limited_top_k(choice, top_k, n_groups, topk_groups)  # (N, k)
    else:
        selected = check_selected(selected, N, top_k, E)
    chosen = np.take_along_axis(scores, selected, axis=-1)  # ... the scores weigh, (N, k)
    denominator = None
    weights = chosen
    if norm_topk_prob:
        denominator = chosen.sum(axis=-1, keepdims=True) + NORM_EPS  # (N, 1)
        weights = chosen / denominator
    weights = weights * scaling
    return (weights, selected), RouterCache(scoring, scores, selected, chosen, denominator, float(scaling))


def router_backward(dweights: np.ndarray, cache: RouterCache) -> np.ndarray:
    r"""Gradient of the weights w (N, k) with respect to the logits z (N, E); the choice S (and the bias that made
    it) has none. With :math:`\hat w_j = s_{S_j} / d`, :math:`d = \sum_i s_{S_i} + \epsilon`:

    .. math::

        \begin{gathered}
        dw' = \rho\, dw, \qquad ds_e = 0 \ (e \notin S), \\
        ds_{S_j} = \frac{dw'_j - \sum_i dw'_i\, \hat w_i}{d} \ (\mathrm{norm\_topk\_prob}), \ \text{else } dw'_j, \\
        dz = ds \odot s \odot (1 - s) \ (\sigma), \\
        dz = s \odot \big(ds - \mathrm{rowsum}(ds \odot s)\big) \ (\mathrm{softmax})
        \end{gathered}

    Returns dz (N, E)."""
    if not isinstance(cache, RouterCache):
        raise TypeError(f"cache must be the RouterCache of router_forward, got {type(cache).__name__}")
    dw = dweights * cache.scaling  # (N, k)
    if cache.denominator is not None:
        normed = cache.chosen / cache.denominator
        dw = (dw - np.vecdot(dw, normed)[:, None]) / cache.denominator
    dscores = np.zeros_like(cache.scores)  # (N, E)
    np.put_along_axis(dscores, cache.selected, dw, axis=-1)
    if cache.scoring == "sigmoid":
        return dscores * cache.scores * (1 - cache.scores)
    return softmax_backward(dscores, SoftmaxCache(cache.scores))


@dataclass(frozen=True, slots=True)
class DeepseekMoeCache:
    x_shape: tuple[int, ...]
    router_linear: LinearCache
    router: RouterCache
    experts: ExpertsCache
    shared: GatedFeedForwardCache | None
    has_score_bias: bool


def deepseek_moe_forward(
    params: dict,
    x: np.ndarray,
    top_k: int,
    *,
    scoring: str = "sigmoid",
    n_groups: int = 1,
    topk_groups: int = 1,
    norm_topk_prob: bool = True,
    scaling: float = 1.0,
    activation: str = "silu",
    selected: np.ndarray | None = None,
) -> tuple[np.ndarray, DeepseekMoeCache]:
    r"""The block of the module's formula, x (..., D) -> (..., D): router, routed experts, shared experts (when
    params hold shared.*). Returns y and a DeepseekMoeCache."""
    check_float_array("x", x)
    D = x.shape[-1]
    x2d = x.reshape(-1, D)  # (N, D)
    logits, router_linear = linear_forward(x2d, params["router.weight"], None)  # (N, E)
    (weights, selected), router = router_forward(
        logits, top_k, scoring=scoring, score_bias=params.get("router.score_bias"), n_groups=n_groups,
        topk_groups=topk_groups, norm_topk_prob=norm_topk_prob, scaling=scaling, selected=selected,
    )  # fmt: skip
    y, experts = experts_forward(
        x2d, selected, weights, params["experts.gate_up_proj"], params["experts.down_proj"], activation
    )  # (N, D)
    shared = None
    if "shared.gate.weight" in params:
        shared_params = {k.removeprefix("shared."): v for k, v in params.items() if k.startswith("shared.")}
        y_shared, shared = gated_feed_forward_forward(shared_params, x2d, activation)
        y = y + y_shared  # the shared experts run on every row
    cache = DeepseekMoeCache(x.shape, router_linear, router, experts, shared, "router.score_bias" in params)
    return y.reshape(x.shape), cache


def deepseek_moe_backward(dout: np.ndarray, cache: DeepseekMoeCache) -> tuple[np.ndarray, dict]:
    r"""The block's forward in reverse; x fed the router, the routed experts and the shared ones, so its three
    gradients add:

    .. math::

        \begin{gathered}
        dx^{\text{experts}}, dW_{gu}, dW_d, dw = \mathrm{experts\_backward}(dy), \\
        dz = \mathrm{router\_backward}(dw), \\
        dx = dx^{\text{experts}} + dz\, W_r + dx^{\text{shared}}
        \end{gathered}

    with :math:`dW_r = dz^\top x`; the score bias gets zero (it only chose). dout (..., D). Returns dx (..., D) and
    the grads dict keyed like params."""
    if not isinstance(cache, DeepseekMoeCache):
        raise TypeError(f"cache must be the DeepseekMoeCache of deepseek_moe_forward, got {type(cache).__name__}")
    grads = {}
    dout2d = dout.reshape(-1, dout.shape[-1])  # (N, D)
    dx, dweights, grads["experts.gate_up_proj"], grads["experts.down_proj"] = experts_backward(dout2d, cache.experts)
    dlogits = router_backward(dweights, cache.router)  # (N, E)
    dx_router, grads["router.weight"], _ = linear_backward(dlogits, cache.router_linear)
    dx += dx_router  # x fed the router and the experts
    if cache.has_score_bias:
        grads["router.score_bias"] = np.zeros_like(cache.router.scores[0])  # it chose, it did not weigh
    if cache.shared is not None:
        dx_shared, shared_grads = gated_feed_forward_backward(dout2d, cache.shared)
        dx += dx_shared  # ... and the shared experts
        grads |= {f"shared.{k}": v for k, v in shared_grads.items()}
    return dx.reshape(cache.x_shape), grads
