"""Inputs users really send: -inf logits, constant and huge rows, saturated attention, activations far out.

Each case either matches torch (outputs and gradients, the conventions' error measure, where torch's result is
finite; identical inf entries where torch's loss is +inf), or raises a clear ValueError where torch would
return NaN. Never a silent NaN. Three deliberate differences, each tested against the exact answer:
- a softmax row that is all -inf (no mask given) attends to nothing, zeros, as a fully masked row does
  (torch: NaN);
- gelu_tanh beyond |x| ~ 1e13 in float32 stays x and its gradient 1 (torch: NaN from x^3 overflowing);
- float32 layer norm of rows far from zero (1e4 + noise) is closer to the float64 answer than torch's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import numpy_transformer as nt
from numpy_transformer import attention as A
from numpy_transformer import layers as L
from parity_tests import components as C

DTYPES = [pytest.param(np.float64, id="float64"), pytest.param(np.float32, id="float32")]
NEG_INF = -np.inf
CASES_TESTED: list[str] = []  # case ids, for the count in the README (nothing reads it)


def torch_pair(fn, dout, *inputs):
    """torch's output and the gradient of sum(output * dout) with respect to every input."""
    leaves = [torch.tensor(x, requires_grad=True) for x in inputs]
    out = fn(*leaves)
    out.backward(torch.as_tensor(np.asarray(dout, dtype=inputs[0].dtype)))
    return out.detach().numpy(), [None if leaf.grad is None else leaf.grad.numpy() for leaf in leaves]


def assert_close(ours, theirs, dtype, what: str, bar_dtype=None):
    """Equal non-finite entries (the same inf in the same place), and the finite ones within the conventions' bar
    (of `bar_dtype`, default `dtype`). Several tensors of one comparison: pass dicts name -> array, judged
    together (the conventions' floor: a tensor's noise is measured against the largest tensor of the comparison)."""
    if not isinstance(ours, dict):
        ours, theirs = {what: ours}, {what: theirs}
    pairs = {}
    for name in ours:
        a, b = np.asarray(ours[name], dtype=np.float64), np.asarray(theirs[name], dtype=np.float64)
        assert not np.isnan(a).any(), f"{name}: NaN in ours"
        np.testing.assert_array_equal(np.isfinite(a), np.isfinite(b), err_msg=f"{name}: non-finite entries")
        np.testing.assert_array_equal(a[~np.isfinite(a)], b[~np.isfinite(b)], err_msg=name)
        pairs[name] = (a[np.isfinite(b)], b[np.isfinite(b)])
    bar = C.BAR[np.dtype(bar_dtype or dtype)]
    for name, (_, error) in C.relative_errors(pairs, bar_dtype or dtype).items():
        assert error <= bar, f"{name}: relative error {error:.2e}"


# ----------------------------------------------------------------------------------------------
# Cross-entropy with -inf logits.


def logits_with_minus_inf(dtype, V=7):
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 5, V)).astype(dtype)
    logits[..., [1, 4]] = NEG_INF  # two columns masked everywhere (a constrained vocabulary)
    logits[0, 2, 5] = NEG_INF  # and one more entry
    targets = rng.integers(0, V, size=(2, 5))
    targets[np.isin(targets, [1, 4])] = 0
    targets[0, 2] = 3
    return logits, targets


def torch_cross_entropy(logits, targets, ignore_index, label_smoothing):
    dout = 0.7  # an upstream gradient that is not 1
    loss, (grad,) = torch_pair(
        lambda x: F.cross_entropy(
            x.reshape(-1, x.shape[-1]),
            torch.from_numpy(targets.reshape(-1)),
            ignore_index=ignore_index,
            label_smoothing=label_smoothing,
        ),
        dout,
        logits,
    )
    return loss, grad, dout


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("ignore", [False, True], ids=["all-targets", "ignore_index"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_with_minus_inf_logits_matches_torch(dtype, ignore, label_smoothing):
    """Masked vocabulary entries: probability 0, gradient -q there; finite loss without smoothing, +inf with
    it (the eps / V share of log 0), the same gradient as torch either way."""
    logits, targets = logits_with_minus_inf(dtype)
    ignore_index = -100
    if ignore:
        ignore_index = 6
        targets[1, 3:] = ignore_index
    loss, cache = nt.cross_entropy_forward(logits, targets, ignore_index, label_smoothing)
    t_loss, t_grad, dout = torch_cross_entropy(logits, targets, ignore_index, label_smoothing)
    if label_smoothing == 0:
        assert np.isfinite(loss) and np.isfinite(t_loss)
    else:
        assert loss == t_loss == np.inf
    assert_close(loss, t_loss, dtype, "loss")
    dlogits = nt.cross_entropy_backward(cache, dout)
    assert dlogits.dtype == np.dtype(dtype)
    assert_close(dlogits, t_grad, dtype, "dlogits")
    assert np.any(dlogits)
    CASES_TESTED.append(f"cross_entropy -inf {dtype} ignore={ignore} eps={label_smoothing}")


def test_cross_entropy_never_reads_an_ignored_row():
    """A NaN in a row whose target is ignored changes nothing: the same loss, zero gradient in that row.
    (torch's loss is finite too, but its gradient of that row is NaN.)"""
    logits, targets = logits_with_minus_inf(np.float64)
    targets[1, 4] = -100
    clean, _ = nt.cross_entropy_forward(logits, targets, label_smoothing=0.1)
    logits[1, 4] = np.nan
    loss, cache = nt.cross_entropy_forward(logits, targets, label_smoothing=0.1)
    assert loss == clean
    dlogits = nt.cross_entropy_backward(cache)
    assert np.isfinite(dlogits).all() and not dlogits[1, 4].any()
    _, t_grad, _ = torch_cross_entropy(logits, targets, -100, 0.1)
    assert np.isnan(t_grad[1, 4]).all()  # what torch does instead
    CASES_TESTED.append("cross_entropy NaN in an ignored row")


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_target_at_minus_inf_is_infinite_as_torch(dtype):
    """log p of a target with probability 0 is -inf: the loss is +inf on both sides, the gradient finite."""
    logits, targets = logits_with_minus_inf(dtype)
    targets[0, 0] = 1  # a masked column
    loss, cache = nt.cross_entropy_forward(logits, targets)
    t_loss, t_grad, dout = torch_cross_entropy(logits, targets, -100, 0.0)
    assert loss == t_loss == np.inf
    assert_close(nt.cross_entropy_backward(cache, dout), t_grad, dtype, "dlogits")
    CASES_TESTED.append(f"cross_entropy target at -inf {dtype}")


@pytest.mark.parametrize("bad", ["all -inf", "nan", "+inf"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_row_without_a_distribution_raises(dtype, bad):
    """Where torch returns NaN (a kept row with every logit -inf, or a NaN or +inf in it), a clear error."""
    logits, targets = logits_with_minus_inf(dtype)
    if bad == "all -inf":
        logits[1, 2] = NEG_INF
    else:
        logits[1, 2, 0] = np.nan if bad == "nan" else np.inf
    t_loss, _, _ = torch_cross_entropy(logits, targets, -100, 0.0)
    assert np.isnan(t_loss)
    with pytest.raises(ValueError, match="row 7 .* has no softmax"):
        nt.cross_entropy_forward(logits, targets)
    CASES_TESTED.append(f"cross_entropy {bad} row {dtype}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_huge_logits_match_torch(dtype):
    rng = np.random.default_rng(1)
    logits = (rng.standard_normal((4, 9)) * (1e30 if dtype == np.float32 else 1e300)).astype(dtype)
    targets = rng.integers(0, 9, size=4)
    loss, cache = nt.cross_entropy_forward(logits, targets, label_smoothing=0.1)
    t_loss, t_grad, dout = torch_cross_entropy(logits, targets, -100, 0.1)
    assert_close(loss, t_loss, dtype, "loss")
    assert_close(nt.cross_entropy_backward(cache, dout), t_grad, dtype, "dlogits")
    CASES_TESTED.append(f"cross_entropy huge logits {dtype}")


# ----------------------------------------------------------------------------------------------
# Softmax and attention.


ROWS = {
    "constant": lambda rng, D: np.full((3, D), 2.5),
    "huge": lambda rng, D: rng.standard_normal((3, D)) * 1e30,
    "one -inf": lambda rng, D: np.where(np.arange(D) == 2, NEG_INF, rng.standard_normal((3, D))),
}


@pytest.mark.parametrize("row", list(ROWS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_rows_match_torch(dtype, row):
    rng = np.random.default_rng(2)
    x = ROWS[row](rng, 6).astype(dtype)
    probs, cache = L.softmax_forward(x)
    dout = rng.standard_normal(x.shape).astype(dtype)
    t_out, (t_grad,) = torch_pair(lambda t: F.softmax(t, dim=-1), dout, x)
    assert_close(probs, t_out, dtype, "probs")
    assert_close(L.softmax_backward(dout, cache), t_grad, dtype, "dx")
    CASES_TESTED.append(f"softmax {row} {dtype}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_row_of_minus_inf_attends_to_nothing(dtype):
    """No mask given, but a row of -inf: it is a fully masked row, zeros and zero gradient (torch: NaN)."""
    x = np.random.default_rng(3).standard_normal((2, 5)).astype(dtype)
    x[1] = NEG_INF
    probs, cache = L.softmax_forward(x)
    np.testing.assert_array_equal(probs[1], 0.0)
    np.testing.assert_allclose(probs[0].sum(), 1.0, rtol=1e-6)
    dx = L.softmax_backward(np.ones_like(x) + x.clip(-1, 1), cache)
    np.testing.assert_array_equal(dx[1], 0.0)
    assert np.isnan(F.softmax(torch.from_numpy(x), dim=-1)[1].numpy()).all()  # what torch does instead
    CASES_TESTED.append(f"softmax all -inf row {dtype}")


@pytest.mark.parametrize("bad", [np.nan, np.inf], ids=["nan", "+inf"])
def test_softmax_with_nan_or_plus_inf_raises(bad):
    x = np.zeros((2, 4))
    x[0, 1] = bad
    with pytest.raises(ValueError, match="softmax: the input holds NaN or \\+inf"):
        L.softmax_forward(x)
    CASES_TESTED.append(f"softmax {bad}")


@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "padding-mask"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_with_scores_of_1e4_matches_torch(dtype, masked):
    """Scores of about +-1e4 (saturated softmax rows): the same output and dq, dk, dv as torch. The reference
    is torch in float64 on the same inputs: there torch's own float32 kernel is off by ~1e-5 (relative, with
    the conventions' floor) in dq, where ours stays within 1e-14."""
    rng = np.random.default_rng(4)
    q = (rng.standard_normal((2, 2, 5, 8)) * 60).astype(dtype)  # q.k / sqrt(8) reaches ~1e4
    k = (rng.standard_normal((2, 2, 6, 8)) * 60).astype(dtype)
    v = rng.standard_normal((2, 2, 6, 8)).astype(dtype)
    mask = None
    if masked:
        mask = np.ones((2, 1, 1, 6), dtype=bool)
        mask[1, ..., 4:] = False
    scores = (q @ k.swapaxes(-1, -2)) / np.sqrt(8)
    assert np.abs(scores).max() > 5e3
    out, cache = A.scaled_dot_product_attention_forward(q, k, v, mask)
    dout = rng.standard_normal(out.shape).astype(dtype)
    t_mask = None if mask is None else torch.from_numpy(mask)
    t_out, t_grads = torch_pair(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=t_mask),
        dout.astype(np.float64),
        *(a.astype(np.float64) for a in (q, k, v)),
    )
    assert_close(out, t_out, dtype, "out")
    ours = dict(zip(("dq", "dk", "dv"), A.scaled_dot_product_attention_backward(dout, cache)[:3], strict=True))
    assert_close(ours, dict(zip(("dq", "dk", "dv"), t_grads, strict=True)), dtype, "gradients")
    CASES_TESTED.append(f"attention 1e4 scores {dtype} masked={masked}")


# ----------------------------------------------------------------------------------------------
# Layer norm and RMSNorm.


NORMS = {
    "layer": (
        lambda x, w, b: L.layer_norm_forward(x, w, b, 1e-5),
        L.layer_norm_backward,
        lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5),
    ),
    "rms": (
        lambda x, w, b: L.rms_norm_forward(x, w, 1e-6),
        L.rms_norm_backward,
        lambda x, w, b: F.rms_norm(x, (x.shape[-1],), w, 1e-6),
    ),
}
SCALES = {np.dtype(np.float32): (1.0, 1e4, 1e15), np.dtype(np.float64): (1.0, 1e4, 1e100)}


@pytest.mark.parametrize("kind", list(NORMS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_norms_of_huge_rows_match_torch(dtype, kind):
    """Rows as large as the dtype squares without overflow (1e15 in float32, 1e100 in float64) match torch
    (in float64 on the same inputs, the reference)."""
    forward, backward, torch_norm = NORMS[kind]
    rng = np.random.default_rng(5)
    D = 8
    w, b = (1 + 0.5 * rng.standard_normal(D)).astype(dtype), rng.standard_normal(D).astype(dtype)
    for scale in SCALES[np.dtype(dtype)]:
        x = (rng.standard_normal((3, D)) * scale).astype(dtype)
        out, cache = forward(x, w, b)
        dout = rng.standard_normal(x.shape).astype(dtype)
        t_out, t_grads = torch_pair(torch_norm, dout.astype(np.float64), *(a.astype(np.float64) for a in (x, w, b)))
        assert_close(out, t_out, dtype, f"{kind} out at scale {scale:g}")
        grads = backward(dout, cache)
        assert_close({"dx": grads[0], "dweight": grads[1]}, {"dx": t_grads[0], "dweight": t_grads[1]}, dtype, "")
    CASES_TESTED.append(f"{kind} norm huge rows {dtype}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_of_constant_rows_is_exact(dtype):
    """A constant row has x - mean = 0 exactly (ours computes the mean of equal values exactly), so the output
    is the bias, dweight gets nothing from it and dx = (g - mean(g)) / sqrt(eps), g = dy * w: exact at every
    scale. torch's Welford mean leaves a rounding residue on large constant rows that 1 / sqrt(var + eps)
    blows up (in float64 at 3e100 its x_hat is +-1, not 0), so the reference here is the formula."""
    rng = np.random.default_rng(10)
    D, eps = 8, 1e-5
    w, b = (1 + 0.5 * rng.standard_normal(D)).astype(dtype), rng.standard_normal(D).astype(dtype)
    for value in (3.0, -7e4, 3e15 if dtype == np.float32 else 3e100):
        x = np.full((2, D), value, dtype=dtype)
        out, cache = L.layer_norm_forward(x, w, b, eps)
        dout = rng.standard_normal(x.shape).astype(dtype)
        dx, dweight, dbias = L.layer_norm_backward(dout, cache)
        g = dout.astype(np.float64) * w
        assert_close(out, np.broadcast_to(b, x.shape), dtype, f"out at {value:g}")
        assert_close(
            {"dx": dx, "dweight": dweight, "dbias": dbias},
            {"dx": (g - g.mean(-1, keepdims=True)) / np.sqrt(eps), "dweight": np.zeros(D), "dbias": dout.sum(0)},
            dtype,
            f"at {value:g}",
        )
    CASES_TESTED.append(f"layer norm constant rows {dtype}")


@pytest.mark.parametrize("bad", ["overflow", "nan"])
@pytest.mark.parametrize("kind", list(NORMS))
def test_norms_raise_where_the_row_cannot_be_normalised(kind, bad):
    """float32 rows of 1e20 square to inf (torch: NaN for layer norm, zeros for RMSNorm); NaN in a row."""
    forward, _, _ = NORMS[kind]
    x = np.random.default_rng(6).standard_normal((2, 8)).astype(np.float32)
    x[1] = x[1] * 1e20 if bad == "overflow" else np.nan
    w, b = np.ones(8, np.float32), np.zeros(8, np.float32)
    with pytest.raises(ValueError, match=f"{kind}_norm: a row's mean square is not finite in float32"):
        forward(x, w, b)
    CASES_TESTED.append(f"{kind} norm {bad}")


def test_float32_layer_norm_far_from_zero_is_closer_to_float64_than_torch():
    """Rows of 1e4 + N(0, 1) in float32: both sides lose digits to the mean; ours (two-pass: the mean, then
    the variance of the centred row) stays closer to the float64 layer norm of the same float32 inputs."""
    rng = np.random.default_rng(7)
    x = (1e4 + rng.standard_normal((16, 8))).astype(np.float32)
    w, b = np.linspace(0.5, 1.5, 8), np.linspace(-1, 1, 8)
    exact, _ = L.layer_norm_forward(x.astype(np.float64), w, b, 1e-5)
    ours, _ = L.layer_norm_forward(x, w.astype(np.float32), b.astype(np.float32), 1e-5)
    theirs = F.layer_norm(torch.from_numpy(x), (8,), torch.tensor(w).float(), torch.tensor(b).float(), 1e-5).numpy()
    assert np.abs(ours - exact).max() <= np.abs(theirs - exact).max()
    assert np.abs(ours - exact).max() < 5e-3
    CASES_TESTED.append("layer norm far from zero")


# ----------------------------------------------------------------------------------------------
# Activations and embeddings.


ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_activations_far_out_match_torch(dtype, name):
    """At +-1e4 and +-1e12 (and 1e30 in float64): the same values and gradients as torch."""
    big = (1e4, 1e12) if dtype == np.float32 else (1e4, 1e12, 1e30)
    x = np.array([[-m for m in big] + [-1.5, -1e-3, 0.7] + list(big)], dtype=dtype)
    forward, backward = L.ACTIVATIONS[name]
    out, cache = forward(x)
    dout = np.random.default_rng(8).standard_normal(x.shape).astype(dtype)
    t_out, (t_grad,) = torch_pair(ACTIVATIONS[name], dout, x)
    assert_close(out, t_out, dtype, f"{name} out")
    assert_close(backward(dout, cache), t_grad, dtype, f"{name} dx")
    CASES_TESTED.append(f"{name} far out {dtype}")


def test_gelu_tanh_beyond_float32_cubes_stays_exact():
    """x = +-1e20 in float32: x^3 overflows, and torch's tanh GELU returns NaN; ours is x (or 0) with
    gradient 1 (or 0), the exact limits."""
    x = np.array([-1e20, -3e19, 3e19, 1e20], dtype=np.float32)
    out, cache = L.gelu_tanh_forward(x)
    np.testing.assert_array_equal(out, np.where(x > 0, x, 0).astype(np.float32))
    np.testing.assert_array_equal(L.gelu_tanh_backward(np.ones_like(x), cache), (x > 0).astype(np.float32))
    _, (t_grad,) = torch_pair(lambda t: F.gelu(t, approximate="tanh"), np.ones_like(x), x)
    assert np.isnan(t_grad).any()  # what torch does instead: its gradient is NaN
    CASES_TESTED.append("gelu_tanh 1e20 float32")


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # row 4 overflows to inf, as torch's
@pytest.mark.parametrize("dtype", DTYPES)
def test_embeddings_of_extreme_magnitude_match_torch(dtype):
    """Table rows near the dtype's largest value, scaled by sqrt(D): the same values, including the inf
    of an overflowing row, and the same table gradient."""
    rng = np.random.default_rng(9)
    big = np.finfo(dtype).max / 4
    table = (rng.standard_normal((6, 4)) * big / 10).astype(dtype)
    table[5] = big  # sqrt(4) * max / 4 = max / 2: finite; row 4 below overflows
    table[4] = np.finfo(dtype).max
    ids = np.array([[0, 5, 4, 5], [1, 1, 3, 2]])
    out, cache = L.embedding_forward(ids, table, 2.0)
    dout = rng.standard_normal(out.shape).astype(dtype) * big
    t_out, (t_grad,) = torch_pair(lambda w: F.embedding(torch.from_numpy(ids), w) * 2.0, dout, table)
    assert_close(out, t_out, dtype, "lookup")
    assert_close(L.embedding_backward(dout, cache), t_grad, dtype, "dtable")
    CASES_TESTED.append(f"embeddings extreme {dtype}")


def test_a_model_fed_overflowing_embeddings_raises_instead_of_returning_nan():
    """End to end: a float32 LM whose token table is scaled to 1e20 fails at its first norm, naming it."""
    config = nt.TransformerConfig(tgt_vocab_size=12, d_model=8, n_heads=2, d_ff=16, norm_first=True, pad_id=None)
    model = nt.TransformerLM(config, dtype=np.float32)
    model.params["decoder.token_embedding.weight"] *= np.float32(1e20)
    with pytest.raises(ValueError, match="layer_norm: a row's mean square is not finite in float32"):
        model.forward(np.array([[3, 4, 5]]))
    CASES_TESTED.append("model overflowing embeddings")
