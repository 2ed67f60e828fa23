"""Every NumPy forward/backward pair against the same computation in PyTorch.

Outputs and every input and parameter gradient, with a random upstream gradient, in float64
(error <= 1e-10) and float32 (error <= 1e-5), on every device torch has here.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from parity_tests import components as C

one_torch_thread = pytest.fixture(autouse=True)(C.one_torch_thread)

CASES = dict(C.CASES)
for _activation in ("relu", "gelu", "gelu_tanh", "silu"):
    CASES[f"feed_forward ({_activation})"] = functools.partial(C.case_feed_forward, activation=_activation)
# the gated block with another activation (GEGLU); and Llama's attention without the padding mask
CASES["gated_feed_forward (gelu_tanh)"] = functools.partial(C.case_gated_feed_forward, activation="gelu_tanh")
CASES["multi_head_attention (GQA 2 of 4, rope, fused causal)"] = functools.partial(C.case_gqa_attention, padding=False)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", list(CASES))
def test_operation_matches_torch(name, dtype, device):
    case = CASES[name](np.dtype(dtype), np.random.default_rng(0))
    result = C.run_case(case, device)
    assert not C.failures(result, dtype), f"{name}: " + "\n".join(C.failures(result, dtype))
    for grad_name, (ours, _) in result.grads.items():
        assert np.any(ours), f"{name}: gradient {grad_name} is all zeros"
    assert all(ours.dtype == np.dtype(dtype) for ours, _ in result.grads.values())


@pytest.mark.parametrize(
    "name",
    [
        "layer_norm",
        "multi_head_attention",
        "softmax (masked)",
        "rms_norm",
        "rope",
        "gated_feed_forward (SwiGLU)",
        "multi_head_attention (GQA 2 of 4, rope, causal, padding)",
    ],
)
def test_a_wrong_backward_is_caught(name, monkeypatch):
    """The comparison can fail: scale one gradient of the NumPy backward by 1 + 1e-6 and it must."""
    case = C.make_case(name, np.float64)
    original = case.backward

    def perturbed(dout, cache):
        grads = original(dout, cache)
        first = grads[0] if isinstance(grads, tuple) else grads
        first *= 1.0 + 1e-6
        return grads

    case.backward = perturbed
    assert C.failures(C.run_case(case, "cpu"), np.float64)


def test_fully_masked_row_matches_torch_transformer(device):
    """A query with nothing to attend to: zero probabilities, zero context, no NaN, on both sides."""
    case = C.make_case("multi_head_attention", np.float64)
    assert not case.args["attn_mask"][0, :, 2, :].any()
    result = C.run_case(case, device)
    ours, theirs = result.outputs["out"]
    bias = case.args["params"]["out_proj.bias"]
    np.testing.assert_array_equal(ours[0, 2], bias)  # context is zero, so only the output bias remains
    np.testing.assert_allclose(theirs[0, 2], bias, rtol=0, atol=1e-14)
    assert all(np.isfinite(t).all() for _, t in result.grads.values())


def test_rotary_key_bias_has_a_gradient():
    """Without rotary positions the key bias adds one q . b_K to a whole row of scores and gets zero
    gradient; rotated by each key's own angle it does not, and both sides agree on a non-zero gradient."""
    result = C.run_case(C.make_case("multi_head_attention (GQA 2 of 4, rope, causal, padding)", np.float64), "cpu")
    ours, theirs = result.grads["params.k_proj.bias"]
    neighbour = np.abs(result.grads["params.q_proj.bias"][0]).max()
    assert np.abs(ours).max() > 1e-3 * neighbour
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-14 * neighbour)


def test_fully_masked_row_under_grouped_query_attention(device):
    """Causal + padding of the first key: the first query of the second sequence attends to nothing."""
    case = C.make_case("multi_head_attention (GQA 2 of 4, rope, causal, padding)", np.float64)
    assert not case.args["attn_mask"][1, ..., 0].any()
    result = C.run_case(case, device)
    ours, theirs = result.outputs["out"]
    bias = case.args["params"]["out_proj.bias"]
    np.testing.assert_array_equal(ours[1, 0], bias)
    np.testing.assert_allclose(theirs[1, 0], bias, rtol=0, atol=1e-14)
    assert all(np.isfinite(t).all() for _, t in result.grads.values())


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_linear_on_few_rows_matches_torch(dtype):
    """linear_forward runs up to layers.FEW_ROWS rows as (W x^T)^T (BLAS's faster layout for decoding steps), more
    as x W^T: on either side of the threshold, as close to the float64 product as torch's F.linear in the same
    dtype (float64: within 1e-14), and a C-ordered output."""
    import torch

    from numpy_transformer import layers as L

    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((48, 40)), rng.standard_normal(48)
    for rows in (1, 8, L.FEW_ROWS, L.FEW_ROWS + 1):
        x = rng.standard_normal((rows, 1, 40))  # (B, T=1, in): a decoding step's shape
        exact = x @ w.T + b  # float64
        ours, _ = L.linear_forward(*(a.astype(dtype) for a in (x, w, b)))
        theirs = torch.nn.functional.linear(*(torch.from_numpy(a.astype(dtype)) for a in (x, w, b))).numpy()
        assert ours.dtype == np.dtype(dtype) and ours.shape == (rows, 1, 48) and ours.flags.c_contiguous
        scale = np.abs(exact).max()
        bar = 1e-14 if dtype == np.float64 else 4 * max(np.abs(theirs - exact).max() / scale, 1e-7)
        assert np.abs(ours - exact).max() / scale <= bar, rows
