r"""A sparse mixture-of-experts block (Mixtral, Qwen3-MoE), each piece a forward/backward pair written by hand.

The block takes the place of the feed-forward block. A router scores the E experts for every row, the k best
run on that row, and their outputs are summed, weighted by gates:

.. math::

    \begin{gathered}
    z = x W_r^\top, \qquad p = \mathrm{softmax}(z), \qquad S = \mathrm{topk}(p, k), \\
    g_j = \frac{p_{S_j}}{\sum_{i < k} p_{S_i}}, \qquad y = \sum_{j < k} g_j\, \mathrm{FFN}_{S_j}(x)
    \end{gathered}

(Mixtral's order: softmax, then top-k, then renormalise; Qwen3-MoE renormalises only when `norm_topk_prob`, else
:math:`g_j = p_{S_j}`.) Each expert is a gated feed-forward block (SwiGLU with SiLU) whose gate and up projections
are one fused weight, as transformers 5 stores them: ``experts.gate_up_proj`` (E, 2F, D), the gate rows first, and
``experts.down_proj`` (E, D, F):

.. math::

    [\,a \;|\; u\,] = x\, W_{gu}[e]^\top, \qquad \mathrm{FFN}_e(x) = \big(\phi(a) \odot u\big)\, W_d[e]^\top

Shape letters: N rows (B * T), D d_model, E experts, k experts per row (`top_k`), F an expert's hidden width.
Local names (not in the notation table): :math:`W_r` the router's weight (E, D), ``gate.weight``; :math:`z` the
router logits; :math:`S` the selected experts (N, k); :math:`g` the gates (N, k); :math:`W_{gu}[e]`,
:math:`W_d[e]` expert e's fused gate/up weight (2F, D) and down weight (D, F); :math:`a` the gate half,
:math:`u` the up half.

Ties: among exactly equal probabilities the NumPy top-k takes the lowest expert index first. torch.topk does not
promise an order among equal values (on the CPU it depends on E and k), so every forward here that selects takes
``selected=`` to replay another implementation's choice exactly. Either way the backward sends each gate's gradient
to the one expert it selected, whole, as torch.topk's backward does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from .layers import (
    ACTIVATIONS,
    LinearCache,
    SoftmaxCache,
    linear_backward,
    linear_forward,
    softmax_backward,
    softmax_forward,
)
from .validation import check_float_array

MOE_KEYS = ("gate.weight", "experts.gate_up_proj", "experts.down_proj")  # transformers' names below `mlp.`


# ----------------------------------------------------------------------------------------------
# Argument checks: each message names the argument, what it got and what was expected.


def check_top_k(top_k: object, num_experts: int) -> int:
    """top_k must be an int in [1, num_experts]."""
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)):
        raise TypeError(f"top_k must be an int in [1, {num_experts}], got {top_k!r}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be in [1, num_experts={num_experts}], got {top_k}")
    return int(top_k)


def check_selected(selected: object, n_rows: int, top_k: int, num_experts: int) -> np.ndarray:
    """selected: an integer array (N, k) of distinct expert indices per row, each in [0, E)."""
    selected = np.asarray(selected)
    if selected.dtype == np.bool_ or not np.issubdtype(selected.dtype, np.integer):
        raise TypeError(f"selected must be an integer array of expert indices, got dtype {selected.dtype}")
    if selected.shape != (n_rows, top_k):
        raise ValueError(f"selected must have shape (N, top_k) = {(n_rows, top_k)}, got {selected.shape}")
    if selected.size and (selected.min() < 0 or selected.max() >= num_experts):
        raise ValueError(
            f"selected must hold expert indices in [0, {num_experts}), got values in "
            f"[{selected.min()}, {selected.max()}]"
        )
    ordered = np.sort(selected, axis=-1)
    repeats = (ordered[:, 1:] == ordered[:, :-1]).any(axis=-1)
    if repeats.any():
        row = int(np.flatnonzero(repeats)[0])
        raise ValueError(f"selected must name k distinct experts per row, row {row} holds {selected[row].tolist()}")
    return selected


def check_activation(activation: object) -> str:
    """activation must name one of layers.ACTIVATIONS (the experts' phi; Mixtral and Qwen3-MoE use "silu")."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    return activation


def check_expert_weights(
    gate_up_proj: np.ndarray, down_proj: np.ndarray, d_model: int, dtype: DTypeLike
) -> tuple[int, int]:
    """gate_up_proj (E, 2F, D) and down_proj (E, D, F) of x's dtype; returns (E, F)."""
    check_float_array("gate_up_proj", gate_up_proj, dtype)
    check_float_array("down_proj", down_proj, dtype)
    if gate_up_proj.ndim != 3 or gate_up_proj.shape[1] % 2 or gate_up_proj.shape[2] != d_model:
        raise ValueError(f"gate_up_proj must have shape (E, 2F, D={d_model}), got {gate_up_proj.shape}")
    E, F = gate_up_proj.shape[0], gate_up_proj.shape[1] // 2
    if down_proj.shape != (E, d_model, F):
        raise ValueError(f"down_proj must have shape (E, D, F) = {(E, d_model, F)}, got {down_proj.shape}")
    return E, F


# ----------------------------------------------------------------------------------------------
# The router's choice: softmax over the experts, the k largest probabilities, their (renormalised) gates.


def top_k_indices(probs: np.ndarray, top_k: int) -> np.ndarray:
    """The k largest entries of each row of probs (N, E), largest first; among equal values the lower index first
    (a stable sort). (N, k) integers."""
    return np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]  # (N, k)


@dataclass(frozen=True, slots=True)
class TopKGatesCache:
    """What top_k_gates_backward needs, by name."""

    probs: np.ndarray  # p = softmax(z), (N, E)
    selected: np.ndarray  # S, (N, k)
    gates: np.ndarray  # g, (N, k)
    norm_topk_prob: bool


def top_k_gates_forward(
    logits: np.ndarray, top_k: int, norm_topk_prob: bool = True, selected: np.ndarray | None = None
) -> tuple[tuple[np.ndarray, np.ndarray], TopKGatesCache]:
    r"""Router logits z (N, E) -> the gates g (N, k) of the selected experts S (N, k), Mixtral's order:

    .. math::

        \begin{gathered}
        p = \mathrm{softmax}(z), \qquad S = \mathrm{topk}(p, k), \\
        g_j = \frac{p_{S_j}}{\sum_{i < k} p_{S_i}} \ (\mathrm{norm\_topk\_prob}), \quad \text{else } g_j = p_{S_j}
        \end{gathered}

    S holds the k largest probabilities of each row, largest first (ties: the lower index first), unless
    `selected` (N, k) gives the choice to replay. Returns (gates, selected) and a TopKGatesCache.
    """
    check_float_array("logits", logits)
    if logits.ndim != 2:
        raise ValueError(f"logits must have shape (N, E), got shape {logits.shape}")
    N, E = logits.shape
    top_k = check_top_k(top_k, E)
    if not isinstance(norm_topk_prob, (bool, np.bool_)):
        raise TypeError(f"norm_topk_prob must be a bool, got {norm_topk_prob!r}")
    probs, _ = softmax_forward(logits)  # (N, E)
    if selected is None:
        selected = top_k_indices(probs, top_k)  # (N, k)
    else:
        selected = check_selected(selected, N, top_k, E)
    gates = np.take_along_axis(probs, selected, axis=-1)  # (N, k)
    if norm_topk_prob:
        gates /= gates.sum(axis=-1, keepdims=True)
    return (gates, selected), TopKGatesCache(probs, selected, gates, bool(norm_topk_prob))


def top_k_gates_backward(dgates: np.ndarray, cache: TopKGatesCache) -> np.ndarray:
    r"""Gradient of the gates g (N, k) with respect to the router logits z (N, E). The choice S is piecewise
    constant (no gradient); each gate's gradient reaches the logit of the expert it selected.

    Renormalised, :math:`g_j = e^{z_{S_j}} / \sum_{i < k} e^{z_{S_i}}`: the softmax's denominator cancels, so g is
    a softmax over the k chosen logits alone, and only they get a gradient:

    .. math::

        dz_{S_j} = g_j \big(dg_j - \textstyle\sum_{i < k} dg_i\, g_i\big), \qquad dz_e = 0 \ \ (e \notin S)

    Not renormalised, :math:`g_j = p_{S_j}`: dp is dg scattered to the chosen columns (zero elsewhere), and the
    softmax's backward spreads it over every logit through the shared denominator:

    .. math::

        dp_{S_j} = dg_j, \qquad dz = p \odot \big(dp - \mathrm{rowsum}(dp \odot p)\big)
    """
    if not isinstance(cache, TopKGatesCache):
        raise TypeError(f"cache must be the TopKGatesCache of top_k_gates_forward, got {type(cache).__name__}")
    if dgates.shape != cache.gates.shape:
        raise ValueError(f"dgates must have the gates' shape {cache.gates.shape}, got {dgates.shape}")
    dlogits = np.zeros_like(cache.probs)  # (N, E)
    if cache.norm_topk_prob:
        g = cache.gates
        dchosen = g * (dgates - np.vecdot(dgates, g)[:, None])  # softmax backward over the k chosen, (N, k)
        np.put_along_axis(dlogits, cache.selected, dchosen, axis=-1)
        return dlogits
    np.put_along_axis(dlogits, cache.selected, dgates, axis=-1)  # dp: only the chosen probabilities were read
    return softmax_backward(dlogits, SoftmaxCache(cache.probs))


# ----------------------------------------------------------------------------------------------
# One expert: a gated feed-forward block whose gate and up projections are one fused weight (2F, D).


@dataclass(frozen=True, slots=True)
class ExpertCache:
    """What expert_backward needs, by name."""

    activation: str
    gate_up: LinearCache  # [a | u] = x W_gu^T
    act: Any  # the activation's cache of phi(a)
    phi_a: np.ndarray  # phi(a), (n, F)
    up: np.ndarray  # u, (n, F)
    down: LinearCache  # y = h W_d^T


def expert_forward(
    x: np.ndarray, gate_up_proj: np.ndarray, down_proj: np.ndarray, activation: str = "silu"
) -> tuple[np.ndarray, ExpertCache]:
    r"""One expert on its rows x (n, D), with its fused gate/up weight :math:`W_{gu}` (2F, D) (the gate's F rows
    first, then the up projection's) and its down weight :math:`W_d` (D, F):

    .. math::

        [\,a \;|\; u\,] = x\, W_{gu}^\top, \qquad h = \phi(a) \odot u, \qquad y = h\, W_d^\top

    Returns y (n, D) and an ExpertCache.
    """
    act_forward, _ = ACTIVATIONS[activation]
    F = down_proj.shape[-1]
    gate_up, gate_up_cache = linear_forward(x, gate_up_proj, None)  # (n, 2F)
    a, u = gate_up[:, :F], gate_up[:, F:]  # (n, F) each: transformers' chunk(2, dim=-1)
    phi_a, act_cache = act_forward(a)
    h = phi_a * u  # (n, F)
    y, down_cache = linear_forward(h, down_proj, None)  # (n, D)
    return y, ExpertCache(activation, gate_up_cache, act_cache, phi_a, u, down_cache)


def expert_backward(dy: np.ndarray, cache: ExpertCache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""The gated block's backward (walkthrough 06), the two halves of the fused weight side by side:

    .. math::

        \begin{gathered}
        dh = dy\, W_d, \qquad dW_d = dy^\top h, \\
        du = dh \odot \phi(a), \qquad da = \phi'(a) \odot dh \odot u, \\
        dW_{gu} = [\,da \;|\; du\,]^\top x, \qquad dx = [\,da \;|\; du\,]\, W_{gu}
        \end{gathered}

    Returns dx (n, D), dgate_up_proj (2F, D), ddown_proj (D, F).
    """
    _, act_backward = ACTIVATIONS[cache.activation]
    dh, ddown_proj, _ = linear_backward(dy, cache.down)  # (n, F)
    du = dh * cache.phi_a  # h = phi(a) * u: each factor gets dh times the other
    da = act_backward(dh * cache.up, cache.act)
    dgate_up = np.concatenate([da, du], axis=-1)  # (n, 2F), the fused layout: gate first
    dx, dgate_up_proj, _ = linear_backward(dgate_up, cache.gate_up)  # (n, D), (2F, D)
    return dx, dgate_up_proj, ddown_proj


# ----------------------------------------------------------------------------------------------
# Dispatch and combine: each expert runs on the rows routed to it; its outputs, scaled by their gates,
# are added back into those rows.


@dataclass(frozen=True, slots=True)
class RoutedExpert:
    """One expert that received rows: expert ran on x[rows]; slots: which of each row's k choices it is."""

    expert: int  # e
    rows: np.ndarray  # (n_e,)
    slots: np.ndarray  # (n_e,)
    y: np.ndarray  # its output on those rows, (n_e, D)
    cache: ExpertCache


@dataclass(frozen=True, slots=True)
class ExpertsCache:
    """What experts_backward needs, by name: one entry per expert that received rows."""

    x_shape: tuple[int, ...]  # (N, D)
    weight_shapes: tuple[tuple[int, ...], tuple[int, ...]]  # gate_up_proj's and down_proj's shapes
    gates: np.ndarray  # (N, k)
    routed: list[RoutedExpert]


def experts_forward(
    x: np.ndarray,
    selected: np.ndarray,
    gates: np.ndarray,
    gate_up_proj: np.ndarray,
    down_proj: np.ndarray,
    activation: str = "silu",
) -> tuple[np.ndarray, ExpertsCache]:
    r"""Dispatch the rows of x (N, D) to their selected experts S (N, k) and combine the outputs with the gates
    g (N, k):

    .. math::

        y_n = \sum_{j < k} g_{nj}\, \mathrm{FFN}_{S_{nj}}(x_n)

    computed expert by expert: expert e runs once, on the rows that chose it (an expert no row chose does not
    run). gate_up_proj (E, 2F, D), down_proj (E, D, F). Returns y (N, D) and an ExpertsCache.
    """
    check_float_array("x", x)
    if x.ndim != 2:
        raise ValueError(f"x must have shape (N, D), got shape {x.shape}")
    E, _ = check_expert_weights(gate_up_proj, down_proj, x.shape[1], x.dtype)
    check_float_array("gates", gates, x.dtype)
    if gates.ndim != 2 or gates.shape[0] != x.shape[0]:
        raise ValueError(f"gates must have shape (N, k) with N = {x.shape[0]}, got {gates.shape}")
    check_top_k(gates.shape[1], E)
    selected = check_selected(selected, x.shape[0], gates.shape[1], E)
    activation = check_activation(activation)
    y = np.zeros_like(x)  # (N, D)
    routed: list[RoutedExpert] = []
    for e in range(E):
        rows, slots = np.nonzero(selected == e)  # the rows routed to e, and which of their k choices e is
        if rows.size == 0:
            continue
        y_e, cache_e = expert_forward(x[rows], gate_up_proj[e], down_proj[e], activation)  # (n_e, D)
        y[rows] += gates[rows, slots, None] * y_e  # a row chooses e at most once: no index repeats
        routed.append(RoutedExpert(e, rows, slots, y_e, cache_e))
    return y, ExpertsCache(x.shape, (gate_up_proj.shape, down_proj.shape), gates, routed)


def experts_backward(dy: np.ndarray, cache: ExpertsCache) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    r"""Gradients of :math:`y_n = \sum_j g_{nj}\, y^{(S_{nj})}_n`, with :math:`y^{(e)} = \mathrm{FFN}_e(x)` on the rows
    routed to e. A gate scales its expert's output, so its gradient is the dot product of dy with that output; the
    expert itself receives dy scaled by the gate:

    .. math::

        dg_{nj} = dy_n \cdot y^{(S_{nj})}_n, \qquad dy^{(S_{nj})}_n = g_{nj}\, dy_n, \qquad
        dx_n = \textstyle\sum_{j < k} J_{\mathrm{FFN}_{S_{nj}}}^\top\, g_{nj}\, dy_n

    x fans out to k experts, so its gradients add (the rule of every fork). An expert no row chose gets zero
    gradient. Returns, in the order of the forward's inputs (the choice S has none): dx (N, D), dgates (N, k),
    dgate_up_proj (E, 2F, D), ddown_proj (E, D, F).
    """
    if not isinstance(cache, ExpertsCache):
        raise TypeError(f"cache must be the ExpertsCache of experts_forward, got {type(cache).__name__}")
    if dy.shape != cache.x_shape:
        raise ValueError(f"dy must have the output's shape {cache.x_shape}, got {dy.shape}")
    gate_up_shape, down_shape = cache.weight_shapes
    dx = np.zeros_like(dy)  # (N, D)
    dgate_up_proj = np.zeros(gate_up_shape, dtype=dy.dtype)  # (E, 2F, D)
    ddown_proj = np.zeros(down_shape, dtype=dy.dtype)  # (E, D, F)
    dgates = np.zeros_like(cache.gates)  # (N, k)
    for routed in cache.routed:
        e, rows, slots, y_e = routed.expert, routed.rows, routed.slots, routed.y
        dy_e = dy[rows]  # (n_e, D)
        # y[rows] += gates[rows, slots] * y_e
        dgates[rows, slots] = np.vecdot(dy_e, y_e)
        dx_e, dgate_up_proj[e], ddown_proj[e] = expert_backward(cache.gates[rows, slots, None] * dy_e, routed.cache)
        dx[rows] += dx_e  # x fans out to k experts: the gradients add
    return dx, dgates, dgate_up_proj, ddown_proj


# ----------------------------------------------------------------------------------------------
# The block: router, top-k gates, experts. Params keyed by transformers' names below the block's prefix.


@dataclass(frozen=True, slots=True)
class SparseMoeCache:
    """What sparse_moe_backward needs, by name; router_logits (N, E) is readable (the load-balancing loss's input)."""

    x_shape: tuple[int, ...]  # (..., D)
    router: LinearCache  # z = x W_r^T
    router_logits: np.ndarray  # z, (N, E)
    top_k: TopKGatesCache
    experts: ExpertsCache


def check_moe_params(params: dict, d_model: int, dtype: DTypeLike) -> int:
    """params holds exactly MOE_KEYS, shaped (E, D), (E, 2F, D), (E, D, F), in x's dtype; returns E."""
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict keyed {list(MOE_KEYS)}, got {type(params).__name__}")
    missing, unknown = [k for k in MOE_KEYS if k not in params], sorted(set(params) - set(MOE_KEYS))
    if missing or unknown:
        raise ValueError(f"params must hold exactly {list(MOE_KEYS)}: missing {missing}, unexpected {unknown}")
    E, _ = check_expert_weights(params["experts.gate_up_proj"], params["experts.down_proj"], d_model, dtype)
    check_float_array("params['gate.weight']", params["gate.weight"], dtype, (E, d_model))
    return E


def sparse_moe_forward(
    params: dict,
    x: np.ndarray,
    top_k: int,
    norm_topk_prob: bool = True,
    activation: str = "silu",
    selected: np.ndarray | None = None,
) -> tuple[np.ndarray, SparseMoeCache]:
    r"""The sparse mixture-of-experts block of Mixtral (norm_topk_prob True) and Qwen3-MoE, x (..., D) -> (..., D):

    .. math::

        z = x W_r^\top, \qquad (g, S) = \mathrm{topk\_gates}(z), \qquad y = \sum_{j < k} g_j\, \mathrm{FFN}_{S_j}(x)

    params: gate.weight (E, D) (the router), experts.gate_up_proj (E, 2F, D), experts.down_proj (E, D, F), as in
    transformers' state dict below ``model.layers.{i}.mlp.``. selected (N, k): an expert choice to replay instead
    of the top-k's own (see the module's note on ties). Returns y and a SparseMoeCache, whose router_logits (N, E)
    feed load_balancing_loss_forward.
    """
    check_float_array("x", x)
    if x.ndim < 2 or x.shape[-1] == 0 or x.size == 0:
        raise ValueError(f"x must have shape (..., D) with at least one row, got shape {x.shape}")
    D = x.shape[-1]
    check_moe_params(params, D, x.dtype)
    activation = check_activation(activation)
    x2d = x.reshape(-1, D)  # (N, D)
    logits, router_cache = linear_forward(x2d, params["gate.weight"], None)  # (N, E)
    (gates, selected), top_k_cache = top_k_gates_forward(logits, top_k, norm_topk_prob, selected)  # (N, k) each
    y, experts_cache = experts_forward(
        x2d, selected, gates, params["experts.gate_up_proj"], params["experts.down_proj"], activation
    )  # (N, D)
    return y.reshape(x.shape), SparseMoeCache(x.shape, router_cache, logits, top_k_cache, experts_cache)


def sparse_moe_backward(
    dout: np.ndarray, cache: SparseMoeCache, drouter_logits: np.ndarray | None = None
) -> tuple[np.ndarray, dict]:
    r"""The block's forward in reverse. x feeds both the router and the experts, so its two gradients add; the
    router logits get the gates' gradient, plus drouter_logits (N, E) when they also fed a loss (the
    load-balancing loss):

    .. math::

        \begin{gathered}
        dx^{\text{experts}}, dW_{gu}, dW_d, dg = \mathrm{experts\_backward}(dy), \\
        dz = \mathrm{top\_k\_gates\_backward}(dg) + dz^{\text{aux}}, \\
        dW_r = dz^\top x, \qquad dx = dx^{\text{experts}} + dz\, W_r
        \end{gathered}

    dout (..., D). Returns dx (..., D) and the grads dict keyed like params.
    """
    if not isinstance(cache, SparseMoeCache):
        raise TypeError(f"cache must be the SparseMoeCache of sparse_moe_forward, got {type(cache).__name__}")
    if dout.shape != cache.x_shape:
        raise ValueError(f"dout must have the output's shape {cache.x_shape}, got {dout.shape}")
    grads = {}
    dout2d = dout.reshape(-1, dout.shape[-1])  # (N, D)
    dx, dgates, grads["experts.gate_up_proj"], grads["experts.down_proj"] = experts_backward(dout2d, cache.experts)
    dlogits = top_k_gates_backward(dgates, cache.top_k)  # (N, E)
    if drouter_logits is not None:
        check_float_array("drouter_logits", drouter_logits, dlogits.dtype, dlogits.shape)
        dlogits += drouter_logits  # the logits fed the gates and the auxiliary loss: two paths add
    dx_router, grads["gate.weight"], _ = linear_backward(dlogits, cache.router)
    dx += dx_router  # x fed the router and the experts
    return dx.reshape(cache.x_shape), {k: grads[k] for k in MOE_KEYS}


# ----------------------------------------------------------------------------------------------
# The load-balancing auxiliary loss (Switch Transformer, eqs. 4-6), as transformers' load_balancing_loss_func.


@dataclass(frozen=True, slots=True)
class LoadBalancingCache:
    """What load_balancing_loss_backward needs, by name."""

    probs: list  # p of each layer, (N, E)
    row_weight: np.ndarray  # m_n / W: each row's share (0 for padding), (N,)
    fraction_routed: np.ndarray  # f, (E,)
    num_experts: int


def load_balancing_loss_forward(
    router_logits: Sequence[np.ndarray], num_experts: int, top_k: int, attention_mask: np.ndarray | None = None
) -> tuple[np.ndarray, LoadBalancingCache]:
    r"""The auxiliary loss that pushes the router to spread rows evenly, over the router logits of L layers (each
    (N, E), N = B * T), as transformers' ``load_balancing_loss_func``: with :math:`c_{lne} = 1` when expert e is
    among row n's top k in layer l, the mask :math:`m_n` (1 for a real token; all ones without attention_mask) and
    :math:`W = L \sum_n m_n`,

    .. math::

        f_e = \frac1W \sum_{l, n} m_n\, c_{lne}, \qquad P_e = \frac1W \sum_{l, n} m_n\, p_{lne}, \qquad
        \mathcal L_{\text{aux}} = E \sum_e f_e\, P_e

    f (the fraction of choices routed to e; :math:`\sum_e f_e = k`) and P (the mean probability given to e) are
    pooled over the layers before they are multiplied, as transformers does; the loss is not a sum of per-layer
    losses. Uniform routing gives :math:`\mathcal L_{\text{aux}} = k`. router_logits: a list or tuple (transformers
    returns 0 for a bare tensor; this raises). attention_mask (B, T), 1/True for a real token.
    Returns the loss (a scalar of the logits' dtype) and a LoadBalancingCache.
    """
    if not isinstance(router_logits, (list, tuple)) or len(router_logits) == 0:
        raise TypeError(
            f"router_logits must be a non-empty list or tuple of (N, E) arrays, one per layer, got "
            f"{type(router_logits).__name__}" + (" of length 0" if isinstance(router_logits, (list, tuple)) else "")
        )
    first = router_logits[0]
    for i, z in enumerate(router_logits):
        check_float_array(f"router_logits[{i}]", z, getattr(first, "dtype", None))
        if z.ndim != 2 or z.shape != first.shape:
            raise ValueError(f"router_logits[{i}] must have shape (N, E) = {first.shape} like layer 0, got {z.shape}")
    N, E = first.shape
    if isinstance(num_experts, bool) or not isinstance(num_experts, (int, np.integer)) or num_experts != E:
        raise ValueError(f"num_experts must equal the router logits' last dimension E = {E}, got {num_experts!r}")
    top_k = check_top_k(top_k, E)
    if attention_mask is None:
        mask = np.ones(N, dtype=first.dtype)
    else:
        mask = np.asarray(attention_mask)
        if mask.ndim != 2 or mask.size != N:
            raise ValueError(f"attention_mask must have shape (B, T) with B * T = N = {N}, got shape {mask.shape}")
        if not (mask.dtype == np.bool_ or np.issubdtype(mask.dtype, np.integer)) or not np.isin(mask, (0, 1)).all():
            raise ValueError(f"attention_mask must hold 0/1 or False/True, got dtype {mask.dtype}")
        mask = mask.reshape(-1).astype(first.dtype)  # (N,)
        if not mask.any():
            raise ValueError("attention_mask: every position is padding; the loss's mean is undefined")
    row_weight = mask / (len(router_logits) * float(mask.sum()))  # m_n / W, (N,)
    probs = [softmax_forward(z)[0] for z in router_logits]  # (N, E) per layer
    fraction_routed = np.zeros(E, dtype=first.dtype)  # f
    mean_prob = np.zeros(E, dtype=first.dtype)  # P
    for p in probs:
        np.add.at(fraction_routed, top_k_indices(p, top_k), row_weight[:, None])  # count each choice, weighted
        mean_prob += row_weight @ p
    loss = E * np.vecdot(fraction_routed, mean_prob)
    return loss, LoadBalancingCache(probs, row_weight, fraction_routed, E)


def load_balancing_loss_backward(cache: LoadBalancingCache, dloss: float = 1.0) -> list:
    r"""The gradient of :math:`\mathcal L_{\text{aux}} = E \sum_e f_e P_e` with respect to each layer's logits. The
    counts f are piecewise constant in the logits (no gradient); P is a weighted mean of probabilities:

    .. math::

        dp_{lne} = d\mathcal L\, E\, f_e\, \frac{m_n}{W}, \qquad
        dz_l = p_l \odot \big(dp_l - \mathrm{rowsum}(dp_l \odot p_l)\big)

    Padding rows get zero. Returns a list of dz (N, E), one per layer, in the order of router_logits.
    """
    if not isinstance(cache, LoadBalancingCache):
        raise TypeError(
            f"cache must be the LoadBalancingCache of load_balancing_loss_forward, got {type(cache).__name__}"
        )
    dprobs = (float(dloss) * cache.num_experts) * (cache.row_weight[:, None] * cache.fraction_routed)  # (N, E)
    return [softmax_backward(dprobs, SoftmaxCache(p)) for p in cache.probs]
