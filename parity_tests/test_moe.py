"""The mixture-of-experts block (numpy_transformer.moe) against torch_transformer.moe, finite differences and
transformers' own MixtralSparseMoeBlock, Qwen3MoeSparseMoeBlock and load_balancing_loss_func.

NumPy vs torch: outputs, router logits and every gradient (input, router, both expert weights), with random upstream
gradients, float64 <= 1e-10 and float32 <= 1e-5, on every device. Finite differences of the NumPy forward in float64
(per coordinate <= 1e-6, step 1e-5): the expert choice is piecewise constant, so every case first asserts that no row
is near a tie between its k-th and (k+1)-th expert (a step of 1e-5 cannot change the choice). Against transformers
in float64 at 1e-10: its routers compute the softmax in float32 (an upcast of the logits), so the float64 comparisons
run them with that one upcast removed (`routers_in_float64`; a test checks the patch changes nothing in float32).
transformers' load_balancing_loss_func accumulates in float32 whatever the logits' dtype: it is compared at the float32
bar, and the float64 loss against torch_transformer's at 1e-10.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers
from transformers.models.mixtral import modeling_mixtral
from transformers.models.qwen3_moe import modeling_qwen3_moe

import torch_transformer as tt
from numpy_transformer import gradcheck
from numpy_transformer import moe as M
from parity_tests import components as C
from parity_tests.hf_compare import routers_in_float64

one_torch_thread = pytest.fixture(autouse=True)(C.one_torch_thread)

# Tiny, with every expert used: N = B * T = 14 rows, E = 4 experts, k = 2 of them per row.
B, T, D, F_E, E, K = 2, 7, 6, 5, 4, 2
MIN_MARGIN = 1e-3  # the smallest gap p_(k) - p_(k+1) a finite-difference case accepts (a step moves p by ~1e-5)


def make_block(dtype=np.float64, seed: int = 0, top_k: int = K):
    """Random params (transformers' names) and input x (B, T, D); weights large enough that routing is uneven."""
    rng = np.random.default_rng(seed)
    params = {
        "gate.weight": rng.standard_normal((E, D)),
        "experts.gate_up_proj": 0.5 * rng.standard_normal((E, 2 * F_E, D)),
        "experts.down_proj": 0.5 * rng.standard_normal((E, D, F_E)),
    }
    x = rng.standard_normal((B, T, D))
    return {k: v.astype(dtype) for k, v in params.items()}, x.astype(dtype)


def top_k_margin(logits: np.ndarray, top_k: int) -> float:
    """The smallest gap, over rows, between the k-th and the (k+1)-th largest probability (inf when k = E)."""
    p = np.sort(M.softmax_forward(logits)[0], axis=-1)[:, ::-1]
    return float((p[:, top_k - 1] - p[:, top_k]).min()) if top_k < p.shape[1] else np.inf


def torch_block(params: dict, dtype, device, norm_topk_prob: bool, activation: str = "silu", top_k: int = K):
    block = tt.SparseMoeBlock(D, F_E, E, top_k, norm_topk_prob, activation).to(
        device=device, dtype=C.TORCH_DTYPE[np.dtype(dtype)]
    )
    block.load_state_dict({k: torch.from_numpy(v) for k, v in params.items()})
    return block


def numpy_run(params, x, dy, top_k, norm_topk_prob, activation="silu", aux=None, selected=None):
    """Forward and backward of the NumPy block; aux = (coefficient, attention_mask) adds coefficient * the
    load-balancing loss of its router logits. Returns (outputs, gradients) dicts of arrays."""
    y, cache = M.sparse_moe_forward(params, x, top_k, norm_topk_prob, activation, selected=selected)
    outputs = {"out": y, "router_logits": cache.router_logits}
    drouter = None
    if aux is not None:
        coefficient, mask = aux
        loss, aux_cache = M.load_balancing_loss_forward([cache.router_logits], E, top_k, mask)
        (drouter,) = M.load_balancing_loss_backward(aux_cache, coefficient)
        outputs["aux_loss"] = np.asarray(loss)
    dx, grads = M.sparse_moe_backward(dy, cache, drouter)
    return outputs, {"x": dx} | grads


def torch_run(block, x, dy, device, aux=None, selected=None):
    xt = torch.from_numpy(x).to(device).requires_grad_()
    y, logits = block(xt, None if selected is None else torch.from_numpy(selected).to(device))
    total = (y * torch.from_numpy(dy).to(device)).sum()
    outputs = {"out": y, "router_logits": logits}
    if aux is not None:
        coefficient, mask = aux
        mask_t = None if mask is None else torch.from_numpy(mask).to(device)
        outputs["aux_loss"] = tt.load_balancing_loss([logits], E, block.gate.top_k, mask_t)
        total = total + coefficient * outputs["aux_loss"]
    total.backward()
    grads = {"x": xt.grad} | {name: p.grad for name, p in block.named_parameters()}
    return {k: C.to_numpy(v) for k, v in outputs.items()}, {k: C.to_numpy(v) for k, v in grads.items()}


def assert_close(ours: dict, theirs: dict, dtype, what: str) -> None:
    """Every tensor within the bar for dtype (docs/conventions.md): each error against the largest of its comparison."""
    bar = C.BAR[np.dtype(dtype)]
    assert sorted(ours) == sorted(theirs), what
    for name, (diff, err) in C.relative_errors({k: (ours[k], theirs[k]) for k in ours}, dtype).items():
        assert err <= bar, f"{what}: {name} relative error {err:.3e} > {bar} (max |diff| {diff:.3e})"
        assert np.isfinite(ours[name]).all(), f"{what}: {name} is not finite"


MASK = np.array([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]])  # (B, T): two padding positions in row 0


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("aux", [None, (0.02, None), (0.3, MASK)], ids=["block", "block+aux", "block+aux masked"])
@pytest.mark.parametrize("norm_topk_prob", [True, False], ids=["renormalised", "raw gates"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_sparse_moe_matches_torch(dtype, norm_topk_prob, aux, activation, device):
    params, x = make_block(dtype)
    dy = np.random.default_rng(1).standard_normal(x.shape).astype(dtype)
    ours = numpy_run(params, x, dy, K, norm_topk_prob, activation, aux)
    theirs = torch_run(torch_block(params, dtype, device, norm_topk_prob, activation), x, dy, device, aux)
    assert_close(ours[0], theirs[0], dtype, "outputs")
    assert_close(ours[1], theirs[1], dtype, "gradients")
    for name, g in ours[1].items():
        assert g.dtype == np.dtype(dtype) and np.any(g), f"{name}: dtype {g.dtype}, or all zeros"
    assert ours[0]["out"].dtype == np.dtype(dtype)
    selected = np.argsort(-ours[0]["router_logits"], axis=-1, kind="stable")[:, :K]
    assert len(np.unique(selected)) == E, "every expert receives rows"


def test_a_wrong_backward_is_caught(monkeypatch):
    """The comparison can fail: a gate gradient off by a factor 1 + 1e-6 is caught."""
    params, x = make_block()
    dy = np.random.default_rng(1).standard_normal(x.shape)
    original = M.top_k_gates_backward
    monkeypatch.setattr(M, "top_k_gates_backward", lambda dg, cache: original(dg * (1.0 + 1e-6), cache))
    ours = numpy_run(params, x, dy, K, True)
    theirs = torch_run(torch_block(params, np.float64, "cpu", True), x, dy, "cpu")
    with pytest.raises(AssertionError, match="relative error"):
        assert_close(ours[1], theirs[1], np.float64, "gradients")


@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("norm_topk_prob", [True, False], ids=["renormalised", "raw gates"])
def test_sparse_moe_finite_differences(norm_topk_prob, top_k):
    """Every coordinate of x and of the three weights, with the load-balancing loss on the router logits."""
    params, x = make_block(seed=2)
    logits = x.reshape(-1, D) @ params["gate.weight"].T
    assert top_k_margin(logits, top_k) > MIN_MARGIN, "a row is near a top-k tie: choose another seed"
    rng = np.random.default_rng(3)
    dy = rng.standard_normal(x.shape)
    coefficient = 0.5

    def f():  # the scalar whose gradient the backward computes: <y, dy> + coefficient * aux loss
        y, cache = M.sparse_moe_forward(params, x, top_k, norm_topk_prob)
        loss, _ = M.load_balancing_loss_forward([cache.router_logits], E, top_k, MASK)
        return float(np.sum(y * dy) + coefficient * loss)

    _, grads = numpy_run(params, x, dy, top_k, norm_topk_prob, aux=(coefficient, MASK))
    inputs = {"x": x} | params
    result = gradcheck.gradcheck(f, inputs, grads, eps=1e-5, max_coords=None)
    assert result.worst <= C.FD_BAR, f"finite differences:\n{result}"
    assert all(result.max_abs_grad[name] > 0 for name in inputs)
    assert top_k_margin(x.reshape(-1, D) @ params["gate.weight"].T, top_k) > MIN_MARGIN  # restored, unchanged


def test_load_balancing_loss_finite_differences():
    """Three layers' logits, padding in the mask: each logit's gradient against central differences."""
    rng = np.random.default_rng(4)
    logits = [rng.standard_normal((B * T, E)) for _ in range(3)]
    assert min(top_k_margin(z, K) for z in logits) > MIN_MARGIN
    loss, cache = M.load_balancing_loss_forward(logits, E, K, MASK)
    grads = M.load_balancing_loss_backward(cache, 1.0)
    result = gradcheck.gradcheck(
        lambda: float(M.load_balancing_loss_forward(logits, E, K, MASK)[0]),
        {f"layer {i}": z for i, z in enumerate(logits)},
        {f"layer {i}": g for i, g in enumerate(grads)},
        max_coords=None,
    )
    assert result.worst <= C.FD_BAR, str(result)
    assert all(np.any(g) for g in grads) and not np.any(grads[0][5]) and not np.any(grads[0][6])  # padding: zero


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("masked", [False, True], ids=["no mask", "mask"])
def test_load_balancing_loss_matches_transformers(masked, dtype):
    """transformers' load_balancing_loss_func over three layers: the loss and each layer's logit gradient.

    transformers sums the counts and the probabilities in float32 whatever the logits' dtype, so the comparison is
    held to the float32 bar in both dtypes; torch_transformer's loss, computed in the logits' dtype, is held to
    the bar for the dtype (docs/conventions.md)."""
    rng = np.random.default_rng(5)
    logits = [rng.standard_normal((B * T, E)).astype(dtype) for _ in range(3)]
    mask = MASK if masked else None
    dloss = 0.7
    loss, cache = M.load_balancing_loss_forward(logits, E, K, mask)
    ours = {"loss": np.asarray(loss)} | {
        f"dlogits {i}": g for i, g in enumerate(M.load_balancing_loss_backward(cache, dloss))
    }
    assert np.asarray(loss).dtype == np.dtype(dtype)
    for name, fn, bar_dtype in (
        ("transformers", modeling_mixtral.load_balancing_loss_func, np.float32),
        ("torch_transformer", tt.load_balancing_loss, dtype),
    ):
        leaves = [torch.from_numpy(z).requires_grad_() for z in logits]
        theirs_loss = fn(tuple(leaves), E, K, None if mask is None else torch.from_numpy(mask))
        (dloss * theirs_loss).backward()
        theirs = {"loss": C.to_numpy(theirs_loss)} | {f"dlogits {i}": C.to_numpy(z.grad) for i, z in enumerate(leaves)}
        assert_close(ours, theirs, bar_dtype, f"load-balancing loss vs {name}")
    assert all(np.any(g) for name, g in ours.items() if name != "loss")


def test_load_balancing_loss_of_uniform_routing_is_k():
    """E * sum_e f_e P_e with every P_e = 1/E is sum_e f_e = k: the value a perfectly balanced router reaches."""
    loss, _ = M.load_balancing_loss_forward([np.zeros((B * T, E))], E, K)
    assert loss == pytest.approx(K, abs=1e-15)


# ----------------------------------------------------------------------------------------------
# The chosen experts' gates: where the gradient goes.


def test_an_expert_no_row_chose_gets_no_gradient():
    """Expert 3's router logit is far below the others on every row: it never runs. Its weights get exactly zero
    gradient on both sides. Renormalised, the gates are a softmax over the chosen logits alone, so its router row
    gets zero too; with raw gates (p_S) the softmax's denominator reaches every logit, so its router row does not."""
    params, x = make_block(seed=14)  # experts 0, 1, 2 each chosen by 9 or 10 of the 14 rows
    x[..., 0] = np.abs(x[..., 0]) + 3.0
    params["gate.weight"][3] = 0.0
    params["gate.weight"][3, 0] = -2.0  # z_3 = -2 x_0 <= -6: last on every row, but its probability is not negligible
    assert not np.any(M.sparse_moe_forward(params, x, K)[1].top_k.selected == 3)
    dy = np.random.default_rng(7).standard_normal(x.shape)
    for norm_topk_prob in (True, False):
        ours = numpy_run(params, x, dy, K, norm_topk_prob)[1]
        theirs = torch_run(torch_block(params, np.float64, "cpu", norm_topk_prob), x, dy, "cpu")[1]
        assert_close(ours, theirs, np.float64, f"norm_topk_prob={norm_topk_prob}")
        for name in ("experts.gate_up_proj", "experts.down_proj"):
            assert not np.any(ours[name][3]) and not np.any(theirs[name][3]), name
            assert all(np.any(ours[name][e]) for e in range(3)), name
        router_row = np.abs(ours["gate.weight"][3]).max()
        if norm_topk_prob:
            assert router_row == 0.0, "renormalised gates depend on the chosen logits only"
        else:
            assert router_row > 1e-4, "raw gates reach every logit through the softmax's denominator"


@pytest.mark.parametrize("norm_topk_prob", [True, False], ids=["renormalised", "raw gates"])
def test_top_k_gates_with_exact_ties(norm_topk_prob):
    """Rows with exactly equal probabilities at the k-th place. NumPy takes the lower index first; torch.topk's order
    among equal values is unspecified, so its choice is replayed with selected=. Either way each gate's gradient
    reaches the one expert it selected, whole (not shared with its tied twin), as torch.topk's backward sends it."""
    logits = np.array([[2.0, 0.5, 0.5, -1.0], [0.3, 0.3, 0.3, 0.3], [1.0, -2.0, 1.0, 0.0]])  # ties in every row
    dgates = np.array([[0.7, -1.3], [0.4, 1.1], [-0.9, 0.6]])
    (gates, selected), cache = M.top_k_gates_forward(logits, 2, norm_topk_prob)
    np.testing.assert_array_equal(selected, [[0, 1], [0, 1], [0, 2]])  # the lower index of each tie first
    zt = torch.tensor(logits, requires_grad=True)
    values, chosen = torch.topk(F.softmax(zt, dim=-1), 2, dim=-1)
    gates_t = values / values.sum(-1, keepdim=True) if norm_topk_prob else values
    gates_t.backward(torch.tensor(dgates))
    (gates_replayed, _), replay = M.top_k_gates_forward(logits, 2, norm_topk_prob, selected=chosen.numpy())
    dlogits = M.top_k_gates_backward(dgates, replay)
    assert_close(
        {"gates": gates_replayed, "dlogits": dlogits},
        {"gates": C.to_numpy(gates_t), "dlogits": C.to_numpy(zt.grad)},
        np.float64,
        "ties",
    )
    if norm_topk_prob:  # the unchosen twin of a tie gets exactly nothing
        unchosen = np.ones_like(logits, dtype=bool)
        np.put_along_axis(unchosen, chosen.numpy(), False, axis=-1)
        assert not np.any(dlogits[unchosen]) and np.all(dlogits[~unchosen] != 0)
    assert M.top_k_gates_backward(dgates, cache).shape == logits.shape


# ----------------------------------------------------------------------------------------------
# transformers' own blocks.


def hf_block(family: str, norm_topk_prob: bool = True, seed: int = 0, zero_router: bool = False):
    """A tiny transformers block in float64, its weights drawn here (the block alone leaves them uninitialised)."""
    if family == "mixtral":
        config = transformers.MixtralConfig(
            hidden_size=D, intermediate_size=F_E, num_local_experts=E, num_experts_per_tok=K,
            experts_implementation="eager",
        )  # fmt: skip
        block = modeling_mixtral.MixtralSparseMoeBlock(config)
    else:
        config = transformers.Qwen3MoeConfig(
            hidden_size=D, moe_intermediate_size=F_E, num_experts=E, num_experts_per_tok=K,
            norm_topk_prob=norm_topk_prob, experts_implementation="eager",
        )  # fmt: skip
        block = modeling_qwen3_moe.Qwen3MoeSparseMoeBlock(config)
    block = block.double()
    params, _ = make_block(seed=seed)
    if zero_router:  # Qwen3MoeTopKRouter's own initialisation: every logit 0, every row an E-way tie
        params["gate.weight"][:] = 0.0
    block.load_state_dict({k: torch.from_numpy(v) for k, v in params.items()})
    return block, params


def hf_run(block, x, dy):
    """transformers' block: output, router logits (read by a hook, as transformers' output recorder does), chosen
    experts, and the gradients of x and of every weight."""
    seen = {}
    block.zero_grad(set_to_none=True)  # each run's own gradients, not the sum over runs
    hook = block.gate.register_forward_hook(lambda m, args, out: seen.update(logits=out[0], selected=out[2]))
    xt = torch.from_numpy(x).requires_grad_()
    try:
        y = block(xt)
    finally:
        hook.remove()
    y.backward(torch.from_numpy(dy))
    grads = {"x": xt.grad} | {name: p.grad for name, p in block.named_parameters()}
    outputs = {"out": C.to_numpy(y), "router_logits": C.to_numpy(seen["logits"])}
    return outputs, {k: C.to_numpy(v) for k, v in grads.items()}, C.to_numpy(seen["selected"])


BLOCKS = {
    "Mixtral": ("mixtral", True),
    "Qwen3-MoE norm_topk_prob": ("qwen3_moe", True),
    "Qwen3-MoE raw gates": ("qwen3_moe", False),
}


@pytest.mark.parametrize("name", list(BLOCKS))
def test_matches_transformers_block(name):
    """transformers' sparse MoE block in float64 (routers' softmax in float64): the output, the router logits and
    the gradients of x and of every weight, NumPy and torch_transformer each at 1e-10."""
    family, norm_topk_prob = BLOCKS[name]
    block, params = hf_block(family, norm_topk_prob)
    _, x = make_block()
    dy = np.random.default_rng(8).standard_normal(x.shape)
    with routers_in_float64():
        theirs_out, theirs_grads, _ = hf_run(block, x, dy)
    ours = numpy_run(params, x, dy, K, norm_topk_prob)
    assert_close(ours[0], theirs_out, np.float64, f"{name}: NumPy outputs")
    assert_close(ours[1], theirs_grads, np.float64, f"{name}: NumPy gradients")
    torch_side = torch_run(torch_block(params, np.float64, "cpu", norm_topk_prob), x, dy, "cpu")
    assert_close(torch_side[0], theirs_out, np.float64, f"{name}: torch_transformer outputs")
    assert_close(torch_side[1], theirs_grads, np.float64, f"{name}: torch_transformer gradients")
    assert all(np.any(g) for g in theirs_grads.values())


def test_zero_router_ties_replayed_against_qwen3_moe():
    """Qwen3MoeTopKRouter starts from a zero weight: every logit 0, every row a 4-way tie, and which two experts run
    is torch.topk's choice among equal values. Replayed with selected=, the NumPy block equals transformers' to
    1e-10 in outputs and gradients (the router's gradient included: it is not zero, even at a tie)."""
    block, params = hf_block("qwen3_moe", True, seed=9, zero_router=True)
    _, x = make_block(seed=9)
    dy = np.random.default_rng(10).standard_normal(x.shape)
    with routers_in_float64():
        theirs_out, theirs_grads, chosen = hf_run(block, x, dy)
    ours = numpy_run(params, x, dy, K, True, selected=chosen)
    assert_close(ours[0], theirs_out, np.float64, "outputs")
    assert_close(ours[1], theirs_grads, np.float64, "gradients")
    assert np.any(ours[1]["gate.weight"])
    own_choice = M.sparse_moe_forward(params, x, K)[1].top_k.selected
    np.testing.assert_array_equal(own_choice, np.tile([0, 1], (B * T, 1)))  # unreplayed: the lowest indices


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_router_patch_changes_only_the_upcast(family):
    """In float32 the upcast is the identity, so the float64 router equals transformers' own, bit for bit, in its
    three outputs and the gradients of the input and the weight."""
    block, _ = hf_block(family)
    router = block.gate.float()
    x = torch.from_numpy(np.random.default_rng(11).standard_normal((B * T, D)).astype(np.float32))
    dgates = torch.from_numpy(np.random.default_rng(12).standard_normal((B * T, K)).astype(np.float32))
    runs = []
    for patched in (False, True):
        with routers_in_float64() if patched else contextlib.nullcontext():
            xt = x.clone().requires_grad_()
            router.weight.grad = None
            logits, gates, chosen = router(xt)
            (gates * dgates).sum().backward()
            runs.append([logits, gates, chosen, xt.grad, router.weight.grad.clone()])
    for ours, theirs in zip(*runs, strict=True):
        assert torch.equal(ours, theirs)


# ----------------------------------------------------------------------------------------------
# Bad inputs: a ValueError or TypeError naming the argument.


def _bad_calls():
    params, x = make_block()
    logits = np.zeros((3, E))
    calls = {
        "top_k 0": (lambda: M.sparse_moe_forward(params, x, 0), ValueError, "top_k"),
        "top_k > E": (lambda: M.sparse_moe_forward(params, x, E + 1), ValueError, "top_k"),
        "top_k float": (lambda: M.sparse_moe_forward(params, x, 2.0), TypeError, "top_k"),
        "norm_topk_prob str": (lambda: M.sparse_moe_forward(params, x, K, "yes"), TypeError, "norm_topk_prob"),
        "activation": (lambda: M.sparse_moe_forward(params, x, K, activation="swish"), ValueError, "activation"),
        "x 1-D": (lambda: M.sparse_moe_forward(params, x[0, 0], K), ValueError, "x must have shape"),
        "x int": (lambda: M.sparse_moe_forward(params, x.astype(int), K), TypeError, "x must be"),
        "x float32": (lambda: M.sparse_moe_forward(params, x.astype(np.float32), K), TypeError, "gate_up_proj"),
        "missing key": (
            lambda: M.sparse_moe_forward({k: v for k, v in params.items() if k != "gate.weight"}, x, K),
            ValueError,
            "params",
        ),
        "gate_up odd": (
            lambda: M.sparse_moe_forward(params | {"experts.gate_up_proj": np.zeros((E, 9, D))}, x, K),
            ValueError,
            "gate_up_proj",
        ),
        "down shape": (
            lambda: M.sparse_moe_forward(params | {"experts.down_proj": np.zeros((E, F_E, D))}, x, K),
            ValueError,
            "down_proj",
        ),
        "router shape": (
            lambda: M.sparse_moe_forward(params | {"gate.weight": np.zeros((E + 1, D))}, x, K),
            ValueError,
            "gate.weight",
        ),
        "selected shape": (
            lambda: M.top_k_gates_forward(logits, 2, selected=np.zeros((3, 1), int)),
            ValueError,
            "selected",
        ),
        "selected range": (
            lambda: M.top_k_gates_forward(logits, 2, selected=np.full((3, 2), E)),
            ValueError,
            "selected",
        ),
        "selected repeat": (
            lambda: M.top_k_gates_forward(logits, 2, selected=np.array([[0, 1], [2, 2], [1, 0]])),
            ValueError,
            "selected must name k distinct",
        ),
        "selected float": (lambda: M.top_k_gates_forward(logits, 2, selected=np.zeros((3, 2))), TypeError, "selected"),
        "logits NaN": (lambda: M.top_k_gates_forward(np.full((3, E), np.nan), 2), ValueError, "NaN"),
        "logits 3-D": (lambda: M.top_k_gates_forward(np.zeros((1, 3, E)), 2), ValueError, "logits"),
        "aux bare array": (lambda: M.load_balancing_loss_forward(logits, E, K), TypeError, "router_logits"),
        "aux empty": (lambda: M.load_balancing_loss_forward([], E, K), TypeError, "router_logits"),
        "aux shapes": (
            lambda: M.load_balancing_loss_forward([logits, np.zeros((4, E))], E, K),
            ValueError,
            r"router_logits\[1\]",
        ),
        "aux num_experts": (lambda: M.load_balancing_loss_forward([logits], E + 1, K), ValueError, "num_experts"),
        "aux mask shape": (
            lambda: M.load_balancing_loss_forward([logits], E, K, np.ones((2, 2))),
            ValueError,
            "attention_mask",
        ),
        "aux mask values": (
            lambda: M.load_balancing_loss_forward([logits], E, K, np.full((1, 3), 2)),
            ValueError,
            "attention_mask",
        ),
        "aux all padding": (
            lambda: M.load_balancing_loss_forward([logits], E, K, np.zeros((1, 3), int)),
            ValueError,
            "attention_mask",
        ),
        "drouter_logits shape": (
            lambda: M.sparse_moe_backward(x, M.sparse_moe_forward(params, x, K)[1], np.zeros((3, E))),
            ValueError,
            "drouter_logits",
        ),
        "dout shape": (
            lambda: M.sparse_moe_backward(x[:1], M.sparse_moe_forward(params, x, K)[1]),
            ValueError,
            "dout",
        ),
        "wrong cache": (lambda: M.sparse_moe_backward(x, None), TypeError, "cache"),
    }
    return calls


BAD_CALLS = _bad_calls()


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_bad_inputs_raise_naming_the_argument(name):
    call, error, message = BAD_CALLS[name]
    with pytest.raises(error, match=message):
        call()


def test_torch_router_rejects_top_k_beyond_the_experts():
    with pytest.raises(ValueError, match="top_k"):
        tt.SparseMoeBlock(D, F_E, E, E + 1)
