r"""GPT-OSS's mixture of experts (transformers' GptOssMLP: GptOssTopKRouter and GptOssExperts), each piece a
forward/backward pair written by hand.

The router has a bias; it keeps the k largest logits of each row and softmaxes those k alone (top-k first, then the
softmax: equal to Mixtral's softmax, top-k, renormalise, since the shared denominator cancels):

.. math::

    z = x W_r^\top + b_r, \quad S = \mathrm{topk}(z, k), \quad g_j = \frac{e^{z_{S_j}}}{\sum_{i < k} e^{z_{S_i}}}

Each expert's weights are stored (in, out), with biases, the gate and up columns of gate_up_proj interleaved (gate
in the even columns, up in the odd ones), and its activation is a clamped SwiGLU with a sigmoid gain
:math:`\alpha` (1.702) and a clamp L (swiglu_limit, 7):

.. math::

    \begin{gathered}
    h = x\, W_{gu}[e] + b_{gu}[e], \qquad a = \min(h_{:, 0::2}, L), \qquad u = \mathrm{clip}(h_{:, 1::2}, -L, L), \\
    \mathrm{FFN}_e(x) = \big((u + 1) \odot a\, \sigma(\alpha a)\big)\, W_d[e] + b_d[e], \\
    y = \textstyle\sum_{j < k} g_j\, \mathrm{FFN}_{S_j}(x)
    \end{gathered}

Shape letters: N rows (B * T), D d_model, E experts, k experts per row, F an expert's hidden width. Local names:
:math:`W_r` (E, D) and :math:`b_r` (E,) the router's ``router.weight`` and ``router.bias``; :math:`W_{gu}[e]` (D, 2F)
and :math:`b_{gu}[e]` (2F,) ``experts.gate_up_proj`` and ``experts.gate_up_proj_bias``; :math:`W_d[e]` (F, D) and
:math:`b_d[e]` (D,) ``experts.down_proj`` and ``experts.down_proj_bias`` (transformers' names and layouts below
``mlp.``); a the clamped gate, u the clamped up projection.

The choice S is piecewise constant: the backward sends each gate's gradient through the kept logits only (as
torch.topk's backward), never through the choice. Among exactly equal logits the NumPy top-k takes the lower index
first; `selected=` replays another implementation's choice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import DTypeLike
from scipy.special import expit

from .moe import check_selected, check_top_k
from .validation import check_float_array

# transformers' names below `mlp.` (ours below `ffn.`), in the order of the state dict
GPT_OSS_MOE_KEYS = (
    "router.weight",
    "router.bias",
    "experts.gate_up_proj",
    "experts.gate_up_proj_bias",
    "experts.down_proj",
    "experts.down_proj_bias",
)


# ----------------------------------------------------------------------------------------------
# The router: top-k of the logits, then a softmax over the k kept.


@dataclass(frozen=True, slots=True)
class TopKSoftmaxCache:
    selected: np.ndarray  # S, (N, k)
    gates: np.ndarray  # g, (N, k)
    n_experts: int


def top_k_softmax_forward(
    logits: np.ndarray, top_k: int, selected: np.ndarray | None = None
) -> tuple[tuple[np.ndarray, np.ndarray], TopKSoftmaxCache]:
    r"""Router logits z (N, E) -> (gates g (N, k), selected S (N, k)): S the k largest logits of each row, largest
    first (ties: the lower index first) unless `selected` gives the choice to replay, and

    .. math::

        g_j = \frac{e^{z_{S_j} - m}}{\sum_{i < k} e^{z_{S_i} - m}}, \qquad m = \max_j z_{S_j}
    """
    check_float_array("logits", logits)
    if logits.ndim != 2:
        raise ValueError(f"logits must have shape (N, E), got shape {logits.shape}")
    N, E = logits.shape
    top_k = check_top_k(top_k, E)
    if selected is None:
        selected = np.argsort(-logits, axis=-1, kind="stable")[:, :top_k]  # (N, k)
    else:
        selected = check_selected(selected, N, top_k, E)
    kept = np.take_along_axis(logits, selected, axis=-1)  # z_S, (N, k)
    gates = np.exp(kept - kept.max(axis=-1, keepdims=True))
    gates /= gates.sum(axis=-1, keepdims=True)
    return (gates, selected), TopKSoftmaxCache(selected, gates, E)


def top_k_softmax_backward(dgates: np.ndarray, cache: TopKSoftmaxCache) -> np.ndarray:
    r"""The softmax's backward over the k kept logits, scattered back to their experts (the others get zero):

    .. math::

        dz_{S_j} = g_j \big(dg_j - \textstyle\sum_{i < k} dg_i\, g_i\big), \qquad dz_e = 0 \ \ (e \notin S)

    dgates (N, k) -> dlogits (N, E)."""
    if not isinstance(cache, TopKSoftmaxCache):
        raise TypeError(f"cache must be the TopKSoftmaxCache of top_k_softmax_forward, got {type(cache).__name__}")
    if dgates.shape != cache.gates.shape:
        raise ValueError(f"dgates must have the gates' shape {cache.gates.shape}, got {dgates.shape}")
    g = cache.gates
    dkept = g * (dgates - np.vecdot(dgates, g)[:, None])  # (N, k)
    dlogits = np.zeros((g.shape[0], cache.n_experts), dtype=g.dtype)  # (N, E)
    np.put_along_axis(dlogits, cache.selected, dkept, axis=-1)
    return dlogits


# ----------------------------------------------------------------------------------------------
# The clamped SwiGLU of one expert's interleaved gate and up columns.


@dataclass(frozen=True, slots=True)
class ClampedSwigluCache:
    gate: np.ndarray  # the gate columns before the clamp, (n, F)
    up: np.ndarray  # the up columns before the clamp, (n, F)
    a: np.ndarray  # min(gate, L), (n, F)
    glu: np.ndarray  # a sigma(alpha a), (n, F)
    sigmoid: np.ndarray  # sigma(alpha a), (n, F)
    limit: float
    alpha: float


def clamped_swiglu_forward(gate_up: np.ndarray, limit: float, alpha: float) -> tuple[np.ndarray, ClampedSwigluCache]:
    r"""gate_up (n, 2F), gate in the even columns and up in the odd ones, ->

    .. math::

        a = \min(\mathrm{gate}, L), \qquad u = \mathrm{clip}(\mathrm{up}, -L, L), \qquad
        y = (u + 1) \odot a\, \sigma(\alpha a)

    Returns y (n, F) and a ClampedSwigluCache."""
    gate, up = gate_up[:, 0::2], gate_up[:, 1::2]  # (n, F) each: transformers' [..., ::2] and [..., 1::2]
    a = np.minimum(gate, limit)
    u = np.clip(up, -limit, limit)
    sigmoid = expit(alpha * a)  # sigma(alpha a), without overflow
    glu = a * sigmoid
    return (u + 1.0) * glu, ClampedSwigluCache(gate, up, a, glu, sigmoid, float(limit), float(alpha))


def clamped_swiglu_backward(dy: np.ndarray, cache: ClampedSwigluCache) -> np.ndarray:
    r"""dy (n, F) -> d gate_up (n, 2F), interleaved as the input. With :math:`\mathrm{glu} = a\, \sigma(\alpha a)`,
    whose derivative is :math:`\sigma(\alpha a) \big(1 + \alpha a (1 - \sigma(\alpha a))\big)` (the product rule and
    :math:`\sigma' = \sigma (1 - \sigma)`), and a clamp passing the gradient where its input is inside the bounds (the
    bound included, as torch.clamp):

    .. math::

        \begin{gathered}
        d\mathrm{up} = dy \odot \mathrm{glu} \odot [\lvert \mathrm{up} \rvert \le L], \\
        d\mathrm{gate} = dy \odot (u + 1) \odot \sigma(\alpha a) \big(1 + \alpha a (1 - \sigma(\alpha a))\big)
        \odot [\mathrm{gate} \le L]
        \end{gathered}
    """
    limit = cache.limit
    u = np.clip(cache.up, -limit, limit)
    dup = dy * cache.glu * ((cache.up >= -limit) & (cache.up <= limit))
    dglu = dy * (u + 1.0)
    s = cache.sigmoid
    da = dglu * s * (1.0 + cache.alpha * cache.a * (1.0 - s))  # d(a sigma(alpha a))/da
    dgate = da * (cache.gate <= limit)
    dgate_up = np.empty((dy.shape[0], 2 * dy.shape[1]), dtype=dy.dtype)  # (n, 2F)
    dgate_up[:, 0::2], dgate_up[:, 1::2] = dgate, dup
    return dgate_up


# ----------------------------------------------------------------------------------------------
# The block: router, gates, the experts on their rows.


@dataclass(frozen=True, slots=True)
class RoutedGptOssExpert:
    expert: int  # e
    rows: np.ndarray  # (n_e,)
    slots: np.ndarray  # (n_e,): which of each row's k choices e is
    x: np.ndarray  # the rows' inputs, (n_e, D)
    act: ClampedSwigluCache
    hidden: np.ndarray  # the activation's output, (n_e, F)
    y: np.ndarray  # FFN_e(x), (n_e, D)


@dataclass(frozen=True, slots=True)
class GptOssMoeCache:
    """What gpt_oss_moe_backward needs; router_logits (N, E) is readable (the load-balancing loss's input)."""

    x_shape: tuple[int, ...]  # (..., D)
    x: np.ndarray  # (N, D)
    params: dict  # the block's weights (read by the backward)
    router_logits: np.ndarray  # z, (N, E)
    top_k: TopKSoftmaxCache
    routed: list[RoutedGptOssExpert]


def check_gpt_oss_moe_params(params: dict, d_model: int, dtype: DTypeLike) -> tuple[int, int]:
    """params holds exactly GPT_OSS_MOE_KEYS: router (E, D) and (E,), gate_up_proj (E, D, 2F) and its bias (E, 2F),
    down_proj (E, F, D) and its bias (E, D), in x's dtype; returns (E, F)."""
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict keyed {list(GPT_OSS_MOE_KEYS)}, got {type(params).__name__}")
    missing = [k for k in GPT_OSS_MOE_KEYS if k not in params]
    unknown = sorted(set(params) - set(GPT_OSS_MOE_KEYS))
    if missing or unknown:
        raise ValueError(f"params must hold exactly {list(GPT_OSS_MOE_KEYS)}: missing {missing}, unexpected {unknown}")
    gate_up = check_float_array("params['experts.gate_up_proj']", params["experts.gate_up_proj"], dtype)
    if gate_up.ndim != 3 or gate_up.shape[1] != d_model or gate_up.shape[2] % 2:
        raise ValueError(f"params['experts.gate_up_proj'] must have shape (E, D={d_model}, 2F), got {gate_up.shape}")
    E, F = gate_up.shape[0], gate_up.shape[2] // 2
    expected = {
        "router.weight": (E, d_model), "router.bias": (E,), "experts.gate_up_proj_bias": (E, 2 * F),
        "experts.down_proj": (E, F, d_model), "experts.down_proj_bias": (E, d_model),
    }  # fmt: skip
    for name, shape in expected.items():
        check_float_array(f"params[{name!r}]", params[name], dtype, shape)
    return E, F


def gpt_oss_moe_forward(
    params: dict,
    x: np.ndarray,
    top_k: int,
    limit: float = 7.0,
    alpha: float = 1.702,
    selected: np.ndarray | None = None,
) -> tuple[np.ndarray, GptOssMoeCache]:
    r"""GPT-OSS's expert block (the module's formulas), x (..., D) -> (..., D): the router's top-k softmax gates,
    each chosen expert run once on the rows that chose it, the outputs (their down bias included) weighed by the
    gates and summed. params keyed GPT_OSS_MOE_KEYS; limit L and alpha the clamped SwiGLU's; selected (N, k): a
    choice to replay. Returns y and a GptOssMoeCache."""
    check_float_array("x", x)
    if x.ndim < 2 or x.shape[-1] == 0 or x.size == 0:
        raise ValueError(f"x must have shape (..., D) with at least one row, got shape {x.shape}")
    D = x.shape[-1]
    E, _ = check_gpt_oss_moe_params(params, D, x.dtype)
    x2d = x.reshape(-1, D)  # (N, D)
    logits = x2d @ params["router.weight"].T + params["router.bias"]  # (N, E)
    (gates, selected), top_k_cache = top_k_softmax_forward(logits, top_k, selected)  # (N, k) each
    y = np.zeros_like(x2d)  # (N, D)
    routed = []
    for e in range(E):
        rows, slots = np.nonzero(selected == e)
        if rows.size == 0:
            continue
        x_e = x2d[rows]  # (n_e, D)
        gate_up = x_e @ params["experts.gate_up_proj"][e] + params["experts.gate_up_proj_bias"][e]  # (n_e, 2F)
        hidden, act_cache = clamped_swiglu_forward(gate_up, limit, alpha)  # (n_e, F)
        y_e = hidden @ params["experts.down_proj"][e] + params["experts.down_proj_bias"][e]  # (n_e, D)
        y[rows] += gates[rows, slots, None] * y_e  # a row chooses e at most once
        routed.append(RoutedGptOssExpert(e, rows, slots, x_e, act_cache, hidden, y_e))
    return y.reshape(x.shape), GptOssMoeCache(x.shape, x2d, params, logits, top_k_cache, routed)


def gpt_oss_moe_backward(
    dout: np.ndarray, cache: GptOssMoeCache, drouter_logits: np.ndarray | None = None
) -> tuple[np.ndarray, dict]:
    r"""The block in reverse, dout (..., D). Per expert e and its rows (:math:`dy^{(e)} = g\, dy`, the gate's share;
    hid the clamped SwiGLU's output):

    .. math::

        \begin{gathered}
        dg_{nj} = dy_n \cdot \mathrm{FFN}_{S_{nj}}(x_n), \\
        dW_d[e] = \mathrm{hid}^\top dy^{(e)}, \quad db_d[e] = \textstyle\sum_{\text{rows}} dy^{(e)}, \\
        dh = \mathrm{clamped\_swiglu\_backward}(dy^{(e)} W_d[e]^\top), \\
        dW_{gu}[e] = x^\top dh, \quad db_{gu}[e] = \textstyle\sum_{\text{rows}} dh, \\
        dx \mathrel{+}= dh\, W_{gu}[e]^\top
        \end{gathered}

    then the router: :math:`dz = \mathrm{top\_k\_softmax\_backward}(dg)` (+ drouter_logits (N, E), the
    load-balancing loss's, when given), :math:`dW_r = dz^\top x`, :math:`db_r = \sum_{\text{rows}} dz`,
    :math:`dx \mathrel{+}= dz\, W_r`. Experts no row chose get zero gradient. Returns dx (..., D) and the grads dict
    keyed like params."""
    if not isinstance(cache, GptOssMoeCache):
        raise TypeError(f"cache must be the GptOssMoeCache of gpt_oss_moe_forward, got {type(cache).__name__}")
    if dout.shape != cache.x_shape:
        raise ValueError(f"dout must have the output's shape {cache.x_shape}, got {dout.shape}")
    params, x = cache.params, cache.x
    dy = dout.reshape(-1, dout.shape[-1])  # (N, D)
    grads = {k: np.zeros_like(params[k]) for k in GPT_OSS_MOE_KEYS}
    dx = np.zeros_like(x)  # (N, D)
    dgates = np.zeros_like(cache.top_k.gates)  # (N, k)
    for r in cache.routed:
        e, rows, slots = r.expert, r.rows, r.slots
        dgates[rows, slots] = np.vecdot(dy[rows], r.y)
        dy_e = cache.top_k.gates[rows, slots, None] * dy[rows]  # (n_e, D)
        grads["experts.down_proj"][e] = r.hidden.T @ dy_e  # (F, D)
        grads["experts.down_proj_bias"][e] = dy_e.sum(axis=0)
        dgate_up = clamped_swiglu_backward(dy_e @ params["experts.down_proj"][e].T, r.act)  # (n_e, 2F)
        grads["experts.gate_up_proj"][e] = r.x.T @ dgate_up  # (D, 2F)
        grads["experts.gate_up_proj_bias"][e] = dgate_up.sum(axis=0)
        dx[rows] += dgate_up @ params["experts.gate_up_proj"][e].T  # x fans out to k experts: the gradients add
    dlogits = top_k_softmax_backward(dgates, cache.top_k)  # (N, E)
    if drouter_logits is not None:
        check_float_array("drouter_logits", drouter_logits, dlogits.dtype, dlogits.shape)
        dlogits += drouter_logits
    grads["router.weight"] = dlogits.T @ x  # (E, D)
    grads["router.bias"] = dlogits.sum(axis=0)
    dx += dlogits @ params["router.weight"]  # x fed the router and the experts
    return dx.reshape(cache.x_shape), grads
