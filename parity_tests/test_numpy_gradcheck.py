"""Every hand-written backward pass of numpy_transformer against central finite differences.

The bar of docs/conventions.md: per coordinate |fd - analytic| / max(|fd|, |analytic|, 1e-2) <= 1e-6, central step
1e-5, float64, with a random upstream gradient (numpy_transformer.gradcheck draws one from a seeded
generator: never all ones, never a plain .sum()). Besides the bar, every compared gradient must be
non-zero, so that no check passes vacuously; the one exception is the key projection's bias of
attention, whose gradient is zero in exact arithmetic (it adds q . b_K to every score of a query row,
and softmax ignores a shift shared by the whole row): that one must be zero up to rounding, judged
against its neighbours. Rotary positions break that argument (each key's bias is rotated by the key's
own angle, so the shift is no longer shared by the row): in attention with RoPE the key bias has a
gradient like any other, and is checked like any other.

Sizes are tiny (d_model 8, 2 heads, d_ff 12, vocabularies ~11, sequences of 3-6) and big tensors are
sampled (max_coords) to keep the file fast.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os

import numpy as np
import pytest

from numpy_transformer import EncoderModel, Transformer, TransformerConfig, TransformerLM, parameter_shapes
from numpy_transformer import attention as A
from numpy_transformer import layers as L
from numpy_transformer import loss as X
from numpy_transformer import model as M
from numpy_transformer.gradcheck import check_model, check_pair, gradcheck

BAR = 1e-6
NONZERO = 1e-6  # a compared gradient must reach this fraction of the largest gradient of its check
EXACT_ZERO = 1e-12  # ... and k_proj.bias must stay below this fraction (rounding noise only)

WORST: dict[str, float] = {}  # test node id -> worst relative error, for reports; the tests do not read it


def is_zero_in_exact_arithmetic(name: str, rotated: tuple = ()) -> bool:
    """The key bias shifts every score of a query row by the same q . b_K; softmax ignores it. Not so in
    attention with rotary positions (names containing one of `rotated`): there R(t') b_K differs per key
    position t'."""
    return name.endswith("k_proj.bias") and not any(block in name for block in rotated)


def assert_passes(result, label: str, rotated: tuple = ()) -> None:
    """The bar, and no vacuous pass: every compared gradient is non-zero except k_proj.bias (outside the
    attention blocks named in `rotated`, which use rotary positions)."""
    WORST[os.environ.get("PYTEST_CURRENT_TEST", label).split(" ")[0]] = result.worst
    assert result.errors, "nothing was compared"
    assert result.worst <= BAR, f"{label}: worst relative error {result.worst:.2e} > {BAR}\n{result}"
    scale = max(result.max_abs_grad.values())
    assert scale > 0.0, f"{label}: every gradient is zero\n{result}"
    for name, g in result.max_abs_grad.items():
        if is_zero_in_exact_arithmetic(name, rotated):
            assert g <= EXACT_ZERO * scale, f"{label}: {name} should be ~0 (max |grad| {g:.2e}, largest {scale:.2e})"
        else:
            assert g >= NONZERO * scale, f"{label}: {name} is (nearly) all zero: {g:.2e} vs largest {scale:.2e}"


def rand(rng, *shape, scale=1.0):
    return scale * rng.standard_normal(shape)


def replayed(p: float, run, seed: int = 7) -> L.Dropout:
    """Run `run(dropout)` once with keep-masks drawn from a seeded generator; return a Dropout that
    hands out exactly those masks, so repeated forwards (the finite differences) agree."""
    drawing = L.Dropout(p, rng=np.random.default_rng(seed))
    run(drawing)
    assert drawing.masks, "the forward drew no dropout mask"
    everything = np.concatenate([m.ravel() for m in drawing.masks.values()])
    assert everything.any() and not everything.all(), "the keep-masks should keep some units and drop some"
    return L.Dropout(p, masks=drawing.masks)


def random_params(shapes: dict, rng) -> dict:
    """Generic parameter values: not the init's special point (unit norm weights, zero biases), where
    a backward pass that forgot a factor of the norm weight or a bias path would still look right."""
    params = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            value = 1.0 + 0.3 * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            value = 0.3 * rng.standard_normal(shape)
        elif len(shape) == 2 and not name.endswith("embedding.weight"):
            value = rng.standard_normal(shape) / math.sqrt(shape[1])
        else:
            value = 0.5 * rng.standard_normal(shape)
        params[name] = value
    return params


def perturb(model, rng) -> None:
    """Move a model's parameters off the init's special point, in place (check_model perturbs in place)."""
    for name, value in model.params.items():
        if name.endswith("norm.weight") or name.endswith(".bias"):
            value += 0.3 * rng.standard_normal(value.shape)


def make_ids(rng, rows: list[str], vocab: int, pad_id: int | None = 0) -> np.ndarray:
    """Ids from a picture: one string per batch row, "_" is pad_id, "." a token drawn from [3, vocab)
    without pad_id, so that only the intended positions equal pad_id. With pad_id None, "_" is id 0, an
    ordinary token then."""
    choices = np.array([i for i in range(3, vocab) if i != pad_id])
    picture = np.array([list(r) for r in rows])
    ids = rng.choice(choices, size=picture.shape)
    ids[picture == "_"] = 0 if pad_id is None else pad_id
    return ids


def tiny_config(**overrides) -> TransformerConfig:
    values = dict(
        src_vocab_size=11,
        tgt_vocab_size=13,
        d_model=8,
        n_heads=2,
        d_ff=12,
        n_encoder_layers=1,
        n_decoder_layers=1,
        max_len=6,
    )
    return TransformerConfig(**(values | overrides))


# ----------------------------------------------------------------------------------------------
# The checker itself: it must be able to fail.


def test_gradcheck_catches_a_wrong_gradient():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4))
    w = rng.standard_normal((3, 4))
    good = gradcheck(lambda: np.sum(np.sin(x) * w), {"x": x}, {"x": np.cos(x) * w}, max_coords=None)
    bad = gradcheck(lambda: np.sum(np.sin(x) * w), {"x": x}, {"x": np.cos(x) * w * 1.001}, max_coords=None)
    assert good.worst <= BAR
    assert bad.worst > 1e-4


def test_check_pair_catches_a_wrong_backward():
    rng = np.random.default_rng(1)
    args = dict(
        x=rng.standard_normal((2, 3, 8)), weight=1 + rng.standard_normal(8), bias=rng.standard_normal(8), eps=1e-5
    )

    def wrong(dout, cache):  # forgets the path through the mean
        x_hat, rstd, weight = cache.x_hat, cache.rstd, cache.weight
        g = dout * weight
        dx = rstd * (g - x_hat * (g * x_hat).mean(axis=-1, keepdims=True))
        return dx, (dout * x_hat).reshape(-1, 8).sum(0), dout.reshape(-1, 8).sum(0)

    result = check_pair(L.layer_norm_forward, wrong, args, wrt=["x", "weight", "bias"], max_coords=None)
    assert result.errors["x"] > 1e-3
    assert result.errors["weight"] <= BAR


# ----------------------------------------------------------------------------------------------
# Layers.


@pytest.mark.parametrize("x_shape", [(5, 4), (2, 3, 4)], ids=["x2d", "x3d"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_linear(bias, x_shape):
    rng = np.random.default_rng(10)
    args = dict(x=rand(rng, *x_shape), weight=rand(rng, 6, 4), bias=rand(rng, 6) if bias else None)
    if bias:
        result = check_pair(L.linear_forward, L.linear_backward, args, wrt=["x", "weight", "bias"], max_coords=None)
    else:
        assert L.linear_backward(rand(rng, *x_shape[:-1], 6), L.linear_forward(**args)[1])[2] is None

        def backward(dout, cache):
            return L.linear_backward(dout, cache)[:2]

        result = check_pair(L.linear_forward, backward, args, wrt=["x", "weight"], max_coords=None)
    assert_passes(result, f"linear-{bias}-{x_shape}")


@pytest.mark.parametrize("scale", [1.0, math.sqrt(8)], ids=["scale1", "scale-sqrtD"])
def test_embedding_repeated_ids(scale):
    rng = np.random.default_rng(11)
    ids = np.array([[1, 3, 1, 6], [3, 3, 0, 6], [5, 1, 3, 3]])  # repeats within and across rows; 2 and 4 unused
    args = dict(ids=ids, weight=rand(rng, 7, 8), scale=scale)
    result = check_pair(L.embedding_forward, L.embedding_backward, args, wrt=["weight"], max_coords=None)
    assert_passes(result, f"embedding-{scale}")


def test_add_positions_learned_table():
    rng = np.random.default_rng(12)
    args = dict(x=rand(rng, 2, 3, 4), table=rand(rng, 6, 4))  # T = 3 < max_len = 6: rows 3.. get zero
    result = check_pair(L.add_positions_forward, L.add_positions_backward, args, wrt=["x", "table"], max_coords=None)
    assert_passes(result, "add_positions")


def _softmax_masks(rng):
    padding = np.ones((2, 1, 5), dtype=bool)
    padding[1, 0, 3:] = False
    fully = rng.random((2, 3, 5)) < 0.6
    fully[:, :, 0] = True
    fully[1, 2, :] = False  # a row with nothing to attend to
    return {"no-mask": None, "padding-broadcast": padding, "fully-masked-row": fully}


@pytest.mark.parametrize("case", ["no-mask", "padding-broadcast", "fully-masked-row"])
def test_softmax(case):
    rng = np.random.default_rng(13)
    mask = _softmax_masks(rng)[case]
    args = dict(x=rand(rng, 2, 3, 5, scale=2.0), mask=mask)
    result = check_pair(L.softmax_forward, L.softmax_backward, args, wrt=["x"], max_coords=None)
    assert_passes(result, f"softmax-{case}")
    if case == "fully-masked-row":
        probs, cache = L.softmax_forward(**args)
        assert np.all(probs[1, 2] == 0.0)
        assert np.all(L.softmax_backward(rand(rng, 2, 3, 5), cache)[1, 2] == 0.0)


@pytest.mark.parametrize("name", ["relu", "gelu", "gelu_tanh", "silu", "quick_gelu"])
def test_activation(name):
    rng = np.random.default_rng(14)
    x = rand(rng, 3, 4, 5, scale=2.0)
    if name == "relu":
        x = np.sign(x) * (0.1 + np.abs(x))  # keep away from the kink at 0
    forward, backward = L.ACTIVATIONS[name]
    result = check_pair(forward, backward, dict(x=x), wrt=["x"], max_coords=None)
    assert_passes(result, f"activation-{name}")


def test_dropout_fixed_keep_mask():
    rng = np.random.default_rng(15)
    keep = rng.random((3, 4, 5)) >= 0.3
    assert keep.any() and not keep.all()
    args = dict(x=rand(rng, 3, 4, 5), p=0.3, keep_mask=keep)
    result = check_pair(L.dropout_forward, L.dropout_backward, args, wrt=["x"], max_coords=None)
    assert_passes(result, "dropout")


@pytest.mark.parametrize("eps", [1e-5, 0.1])
def test_layer_norm(eps):
    rng = np.random.default_rng(16)
    args = dict(x=0.5 + 2.0 * rand(rng, 2, 3, 8), weight=1 + 0.3 * rand(rng, 8), bias=rand(rng, 8), eps=eps)
    result = check_pair(L.layer_norm_forward, L.layer_norm_backward, args, wrt=["x", "weight", "bias"], max_coords=None)
    assert_passes(result, f"layer_norm-{eps}")


def test_feed_forward_dropout():
    rng = np.random.default_rng(17)
    cfg = tiny_config()
    params = random_params(M.sub(parameter_shapes(cfg), "encoder.layers.0.ffn"), rng)
    x = rand(rng, 2, 3, 8)
    dropout = replayed(0.3, lambda d: L.feed_forward_forward(params, x, "gelu", d))
    args = dict(params=params, x=x, activation="gelu", dropout=dropout)
    result = check_pair(L.feed_forward_forward, L.feed_forward_backward, args, wrt=["x", "params"], max_coords=None)
    assert_passes(result, "feed_forward-dropout")


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
def test_feed_forward(activation):
    rng = np.random.default_rng(18)
    params = random_params(M.sub(parameter_shapes(tiny_config()), "encoder.layers.0.ffn"), rng)
    args = dict(params=params, x=rand(rng, 2, 3, 8), activation=activation)
    result = check_pair(L.feed_forward_forward, L.feed_forward_backward, args, wrt=["x", "params"], max_coords=None)
    assert_passes(result, f"feed_forward-{activation}")


@pytest.mark.parametrize("eps", [1e-6, 0.1])
def test_rms_norm(eps):
    rng = np.random.default_rng(60)
    args = dict(x=0.5 + 2.0 * rand(rng, 2, 3, 8), weight=1 + 0.3 * rand(rng, 8), eps=eps)
    result = check_pair(L.rms_norm_forward, L.rms_norm_backward, args, wrt=["x", "weight"], max_coords=None)
    assert_passes(result, f"rms_norm-{eps}")


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_norm_dispatch(kind):
    """norm_forward / norm_backward: the params dict ("weight", and "bias" for layer norm) in, grads dict out."""
    rng = np.random.default_rng(61)
    norm = {"weight": 1 + 0.3 * rand(rng, 8)} | ({"bias": rand(rng, 8)} if kind == "layer" else {})
    args = dict(params=norm, x=rand(rng, 2, 3, 8, scale=2.0), kind=kind, eps=1e-5)
    result = check_pair(L.norm_forward, L.norm_backward, args, wrt=["x", "params"], max_coords=None)
    assert set(result.errors) == {"x"} | {f"params.{k}" for k in norm}
    assert_passes(result, f"norm-{kind}")


def gated_ffn_params(rng, bias: bool) -> dict:
    shapes = M.sub(parameter_shapes(tiny_config(gated_ffn=True, bias=bias)), "encoder.layers.0.ffn")
    assert list(shapes)[0] == "gate.weight" and ("linear1.bias" in shapes) == bias
    return random_params(shapes, rng)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("activation", ["silu", "gelu", "relu"])
def test_gated_feed_forward(activation, bias):
    rng = np.random.default_rng(62)
    x = rand(rng, 2, 3, 8)
    if activation == "relu":
        x = np.sign(x) * (0.1 + np.abs(x))  # the kink: keep the gate's inputs off 0 (they are x W_g^T + b_g) ...
    params = gated_ffn_params(rng, bias)
    args = dict(params=params, x=x, activation=activation)
    if activation == "relu":  # ... by checking that no gate pre-activation is within reach of the step
        gate, _ = L.linear_forward(x, params["gate.weight"], params.get("gate.bias"))
        assert np.abs(gate).min() > 1e-3
    result = check_pair(
        L.gated_feed_forward_forward, L.gated_feed_forward_backward, args, wrt=["x", "params"], max_coords=None
    )
    assert_passes(result, f"gated_feed_forward-{activation}-{bias}")


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_gated_feed_forward_dropout(bias):
    rng = np.random.default_rng(63)
    params, x = gated_ffn_params(rng, bias), rand(rng, 2, 3, 8)
    dropout = replayed(0.3, lambda d: L.gated_feed_forward_forward(params, x, "silu", d))
    assert set(dropout.masks) == {"ffn.dropout"} and dropout.masks["ffn.dropout"].shape == (2, 3, 12)
    args = dict(params=params, x=x, activation="silu", dropout=dropout)
    result = check_pair(
        L.gated_feed_forward_forward, L.gated_feed_forward_backward, args, wrt=["x", "params"], max_coords=None
    )
    assert_passes(result, f"gated_feed_forward-dropout-{bias}")


# ----------------------------------------------------------------------------------------------
# Attention.


@pytest.mark.parametrize("case", ["no-mask", "padding", "fully-masked-row", "mask+dropout"])
def test_scaled_dot_product_attention(case):
    rng = np.random.default_rng(20)
    B, H, T_q, T_k, Dh = 2, 2, 3, 5, 4
    mask, p, keep = None, 0.0, None
    if case == "padding":
        mask = np.ones((B, 1, 1, T_k), dtype=bool)
        mask[1, ..., 3:] = False
    elif case in ("fully-masked-row", "mask+dropout"):
        mask = rng.random((B, H, T_q, T_k)) < 0.7
        mask[..., 0] = True
        mask[1, 0, 2, :] = False  # query 2 of batch 1, head 0: nothing to attend to
    if case == "mask+dropout":
        p = 0.25
        keep = rng.random((B, H, T_q, T_k)) >= p
    args = dict(
        q=rand(rng, B, H, T_q, Dh),
        k=rand(rng, B, H, T_k, Dh),
        v=rand(rng, B, H, T_k, Dh),
        mask=mask,
        dropout_p=p,
        keep_mask=keep,
    )
    result = check_pair(
        A.scaled_dot_product_attention_forward,
        lambda dout, cache: A.scaled_dot_product_attention_backward(dout, cache)[:3],  # dtable: None, no T5 table
        args,
        wrt=["q", "k", "v"],
        max_coords=None,
    )
    assert_passes(result, f"sdpa-{case}")


def mha_params(rng, D: int) -> dict:
    return random_params({k: (D, D) if k.endswith("weight") else (D,) for k in A.MHA_KEYS}, rng)


def self_attention_forward(params, x, n_heads, attn_mask=None, dropout=None):
    return A.multi_head_attention_forward(params, x, x, x, n_heads, attn_mask, dropout)


def self_attention_backward(dout, cache):
    dquery, dkey, dvalue, grads = A.multi_head_attention_backward(dout, cache)
    return dquery + dkey + dvalue, grads  # x was fed as query, key and value: the three paths add


def shared_memory_forward(params, x, memory, n_heads, attn_mask=None):
    return A.multi_head_attention_forward(params, x, memory, memory, n_heads, attn_mask)


def shared_memory_backward(dout, cache):
    dquery, dkey, dvalue, grads = A.multi_head_attention_backward(dout, cache)
    return dquery, dkey + dvalue, grads  # memory was fed as key and value


def padding(B: int, T_k: int, pads: dict) -> np.ndarray:
    """(B, 1, 1, T_k) key mask; pads: batch row -> the key positions that are padding."""
    mask = np.ones((B, 1, 1, T_k), dtype=bool)
    for b, positions in pads.items():
        mask[b, 0, 0, positions] = False
    return mask


def causal(T: int) -> np.ndarray:
    return np.tril(np.ones((T, T), dtype=bool))[None, None]


# id: (kind, B, T_q, T_k, H, mask, dropout)
MHA_CASES = {
    "self-no-mask-B2-H2": ("self", 2, 4, 4, 2, None, 0.0),
    "self-padding-B2-H2": ("self", 2, 4, 4, 2, padding(2, 4, {1: [2, 3]}), 0.0),
    "self-causal-B2-H2": ("self", 2, 4, 4, 2, causal(4), 0.0),
    "self-causal+padding-fully-masked-row-B2-H2": ("self", 2, 4, 4, 2, causal(4) & padding(2, 4, {1: [0, 3]}), 0.0),
    "self-padding-B3-H4": ("self", 3, 5, 5, 4, padding(3, 5, {0: [4], 2: [1, 2]}), 0.0),
    "self-H1-B1": ("self", 1, 3, 3, 1, None, 0.0),
    "self-causal-dropout-B2-H2": ("self", 2, 4, 4, 2, causal(4), 0.3),
    "cross-Tq3-Tk5-padding-B2-H2": ("cross", 2, 3, 5, 2, padding(2, 5, {0: [4], 1: [2, 3, 4]}), 0.0),
    "cross-Tq5-Tk2-no-mask-B2-H4": ("cross", 2, 5, 2, 4, None, 0.0),
    "cross-Tq4-Tk3-all-keys-padded-row": ("cross", 2, 4, 3, 2, padding(2, 3, {1: [0, 1, 2]}), 0.0),
    "memory-shared-Tq4-Tk6-padding": ("memory", 2, 4, 6, 2, padding(2, 6, {0: [5], 1: [3, 4, 5]}), 0.0),
    "memory-shared-fully-masked-row": ("memory", 2, 3, 4, 2, padding(2, 4, {0: [0, 1, 2, 3]}), 0.0),
}


def test_key_bias_gradient_is_zero_in_exact_arithmetic():
    """b_K adds q_i . b_K to every score of query row i: a shift shared by the whole row, which softmax
    ignores. So the output does not depend on b_K (finite differences see only rounding) and the
    analytic gradient s * sum_j dS_ij q_i vanishes because each row of dS sums to zero."""
    rng = np.random.default_rng(22)
    params = mha_params(rng, 8)
    query, memory = rand(rng, 2, 3, 8), rand(rng, 2, 5, 8)
    mask = padding(2, 5, {1: [3, 4]})
    out, cache = A.multi_head_attention_forward(params, query, memory, memory, 2, mask)
    params["k_proj.bias"] += 5.0 * rng.standard_normal(8)
    moved, _ = A.multi_head_attention_forward(params, query, memory, memory, 2, mask)
    np.testing.assert_allclose(moved, out, rtol=1e-12, atol=1e-12)
    grads = A.multi_head_attention_backward(rand(rng, 2, 3, 8), cache)[3]
    neighbours = max(np.abs(grads[k]).max() for k in ("q_proj.bias", "v_proj.bias", "k_proj.weight"))
    assert neighbours > 0.1
    assert np.abs(grads["k_proj.bias"]).max() <= EXACT_ZERO * neighbours


@pytest.mark.parametrize("case", list(MHA_CASES))
def test_multi_head_attention(case):
    kind, B, T_q, T_k, H, mask, p = MHA_CASES[case]
    rng = np.random.default_rng(21)
    D = 8
    params = mha_params(rng, D)
    query, key, value = rand(rng, B, T_q, D), rand(rng, B, T_k, D), rand(rng, B, T_k, D)
    if kind == "self":
        dropout = None
        if p:
            dropout = replayed(p, lambda d: self_attention_forward(params, query, H, mask, d))
        args = dict(params=params, x=query, n_heads=H, attn_mask=mask, dropout=dropout)
        result = check_pair(self_attention_forward, self_attention_backward, args, wrt=["x", "params"], max_coords=16)
    elif kind == "cross":  # key and value distinct arrays: each input gradient on its own
        args = dict(params=params, query=query, key=key, value=value, n_heads=H, attn_mask=mask)
        result = check_pair(
            A.multi_head_attention_forward,
            A.multi_head_attention_backward,
            args,
            wrt=["query", "key", "value", "params"],
            max_coords=16,
        )
    else:  # memory read as key and value, as the decoder's cross-attention does
        args = dict(params=params, x=query, memory=key, n_heads=H, attn_mask=mask)
        result = check_pair(
            shared_memory_forward, shared_memory_backward, args, wrt=["x", "memory", "params"], max_coords=16
        )
    assert_passes(result, f"mha-{case}")


@pytest.mark.parametrize(("start", "theta"), [(0, 10000.0), (5, 100.0)], ids=["start0", "start5-theta100"])
def test_rope(start, theta):
    rng = np.random.default_rng(23)
    cos, sin = A.rope_angles(np.arange(start, start + 4), 6, theta)  # (T, Dh/2) = (4, 3)
    args = dict(x=rand(rng, 2, 3, 4, 6), cos=cos, sin=sin)
    result = check_pair(A.rope_forward, A.rope_backward, args, wrt=["x"], max_coords=None)
    assert_passes(result, f"rope-{start}-{theta}")


def test_qk_norm():
    """Qwen3's RMSNorm of each head's vector (B, H, T, Dh), one weight (Dh,) for every head and position."""
    rng = np.random.default_rng(25)
    args = dict(x=rand(rng, 2, 3, 4, 6), weight=1.0 + 0.3 * rand(rng, 6), eps=1e-6)
    result = check_pair(A.qk_norm_forward, A.qk_norm_backward, args, wrt=["x", "weight"], max_coords=None)
    assert_passes(result, "qk_norm")


@pytest.mark.parametrize("rotary_dim", [2, 4], ids=["R2of8", "R4of8"])
def test_partial_rope(rotary_dim):
    """GPT-NeoX's partial rotary: the tables cover the first R of 8 features; the rest pass through, and so does
    their gradient (checked below to be dy itself)."""
    rng = np.random.default_rng(24)
    cos, sin = A.rope_angles(np.arange(3, 7), rotary_dim, 500.0)  # (T, R/2) = (4, R/2)
    args = dict(x=rand(rng, 2, 3, 4, 8), cos=cos, sin=sin)
    result = check_pair(A.rope_forward, A.rope_backward, args, wrt=["x"], max_coords=None)
    assert_passes(result, f"partial-rope-{rotary_dim}")
    y, cache = A.rope_forward(**args)
    dy = rand(rng, *y.shape)
    np.testing.assert_array_equal(y[..., rotary_dim:], args["x"][..., rotary_dim:])
    np.testing.assert_array_equal(A.rope_backward(dy, cache)[..., rotary_dim:], dy[..., rotary_dim:])
    assert not np.allclose(y[..., :rotary_dim], args["x"][..., :rotary_dim])  # the first R features turn


@pytest.mark.parametrize("n_rep", [1, 2, 4])
def test_repeat_kv(n_rep):
    rng = np.random.default_rng(24)
    args = dict(x=rand(rng, 2, 2, 3, 4), n_rep=n_rep)
    result = check_pair(A.repeat_kv_forward, A.repeat_kv_backward, args, wrt=["x"], max_coords=None)
    assert_passes(result, f"repeat_kv-{n_rep}")


def gqa_params(rng, D: int, H: int, H_kv: int, bias: bool) -> dict:
    kv = D // H * H_kv
    shapes = {"q_proj": (D, D), "k_proj": (kv, D), "v_proj": (kv, D), "out_proj": (D, D)}
    shapes = {f"{k}.weight": s for k, s in shapes.items()} | (
        {f"{k}.bias": s[:1] for k, s in shapes.items()} if bias else {}
    )
    return random_params(shapes, rng)


def gqa_self_attention_forward(params, x, n_heads, n_kv_heads, rope, is_causal, attn_mask=None, dropout=None):
    return A.multi_head_attention_forward(
        params, x, x, x, n_heads, attn_mask, dropout, n_kv_heads=n_kv_heads, rope=rope, is_causal=is_causal
    )


# id: (kind, H, H_kv, rope, is_causal, bias, padded keys per batch row, dropout); D 16, T 4 (cross: T_k 5)
GQA_CASES = {
    "self-GQA-2of4-rope-causal": ("self", 4, 2, True, True, True, {}, 0.0),
    "self-GQA-2of4-rope-causal-padding-fully-masked-row": ("self", 4, 2, True, True, True, {1: [0, 3]}, 0.0),
    "self-MQA-rope-causal-no-bias": ("self", 4, 1, True, True, False, {}, 0.0),
    "self-GQA-2of4-rope-not-causal-padding": ("self", 4, 2, True, False, True, {0: [3]}, 0.0),
    "self-MHA-rope-causal": ("self", 4, None, True, True, True, {}, 0.0),
    "self-GQA-2of4-causal-no-rope": ("self", 4, 2, False, True, True, {1: [2]}, 0.0),
    "self-GQA-2of4-rope-causal-dropout-no-bias": ("self", 4, 2, True, True, False, {0: [3]}, 0.3),
    "cross-GQA-2of4-padding": ("cross", 4, 2, False, False, True, {1: [3, 4]}, 0.0),
    "cross-MQA-no-bias": ("cross", 2, 1, False, False, False, {0: [0, 1, 2, 3, 4]}, 0.0),
}


@pytest.mark.parametrize("case", list(GQA_CASES))
def test_grouped_query_attention(case):
    kind, H, H_kv, use_rope, is_causal, bias, pads, p = GQA_CASES[case]
    rng = np.random.default_rng(25)
    B, T, T_k, D = 2, 4, 5, 16
    params = gqa_params(rng, D, H, H if H_kv is None else H_kv, bias)
    if kind == "self":
        rope = A.rope_angles(np.arange(T), D // H, 10000.0) if use_rope else None
        x, mask = rand(rng, B, T, D), padding(B, T, pads)
        args = dict(params=params, x=x, n_heads=H, n_kv_heads=H_kv, rope=rope, is_causal=is_causal, attn_mask=mask)
        if p:
            args["dropout"] = replayed(p, lambda d: gqa_self_attention_forward(**(args | {"dropout": d})))
        result = check_pair(
            gqa_self_attention_forward, self_attention_backward, args, wrt=["x", "params"], max_coords=16
        )
    else:  # key and value distinct arrays: each input gradient on its own
        args = dict(
            params=params,
            query=rand(rng, B, T, D),
            key=rand(rng, B, T_k, D),
            value=rand(rng, B, T_k, D),
            n_heads=H,
            attn_mask=padding(B, T_k, pads),
            n_kv_heads=H_kv,
        )
        wrt = ["query", "key", "value", "params"]
        result = check_pair(A.multi_head_attention_forward, A.multi_head_attention_backward, args, wrt, max_coords=16)
    assert ("params.k_proj.bias" in result.errors) == bias
    assert_passes(result, f"gqa-{case}", rotated=("params.",) if use_rope else ())


def test_attention_with_qk_norm():
    """Qwen3's attention: each head's queries and keys RMS-normalised before RoPE (q_norm, k_norm in params),
    grouped K/V heads, causal, a padded key."""
    rng = np.random.default_rng(27)
    params = gqa_params(rng, 16, 4, 2, bias=False)
    params |= {"q_norm.weight": 1.0 + 0.3 * rand(rng, 4), "k_norm.weight": 1.0 + 0.3 * rand(rng, 4)}
    x, mask = rand(rng, 2, 4, 16), padding(2, 4, {1: [2]})
    rope = A.rope_angles(np.arange(4), 4, 10000.0)
    args = dict(params=params, x=x, n_heads=4, n_kv_heads=2, rope=rope, is_causal=True, attn_mask=mask)
    result = check_pair(gqa_self_attention_forward, self_attention_backward, args, wrt=["x", "params"], max_coords=16)
    assert {"params.q_norm.weight", "params.k_norm.weight"} <= set(result.errors)
    assert_passes(result, "attention-qk-norm", rotated=("params.",))


def test_rotary_key_bias_has_a_gradient():
    """With rotary positions the key bias reaches the score of the key at position t' as q . R(t') b_K, which
    differs from key to key: it is no longer a shift that softmax ignores, and its gradient is as large as its
    neighbours'."""
    rng = np.random.default_rng(26)
    params = gqa_params(rng, 16, 4, 2, bias=True)
    x = rand(rng, 2, 4, 16)
    rope = A.rope_angles(np.arange(4), 4, 10000.0)
    _, cache = gqa_self_attention_forward(params, x, 4, 2, rope, True)
    grads = A.multi_head_attention_backward(rand(rng, 2, 4, 16), cache)[3]
    neighbours = max(np.abs(grads[k]).max() for k in ("q_proj.bias", "v_proj.bias", "k_proj.weight"))
    assert np.abs(grads["k_proj.bias"]).max() > 1e-3 * neighbours


# ----------------------------------------------------------------------------------------------
# Residual sublayer, layers, stacks.


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dropout_p", [0.0, 0.3], ids=["no-dropout", "dropout"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_residual_around_feed_forward(norm_first, dropout_p, kind):
    rng = np.random.default_rng(30)
    ffn_params = random_params(M.sub(parameter_shapes(tiny_config()), "encoder.layers.0.ffn"), rng)

    def forward(x, norm, ffn_params, dropout=None):
        h, in_cache = L.residual_in_forward(norm, x, norm_first, 1e-5, kind)
        y, ffn_cache = L.feed_forward_forward(ffn_params, h, "gelu_tanh", dropout)
        out, out_cache = L.residual_out_forward(norm, x, y, norm_first, 1e-5, dropout, "ffn_dropout", kind)
        return out, (in_cache, ffn_cache, out_cache)

    def backward(dout, cache):
        in_cache, ffn_cache, out_cache = cache
        dx, dy, norm_out = L.residual_out_backward(dout, out_cache)
        dh, ffn_grads = L.feed_forward_backward(dy, ffn_cache)
        dx_ffn, norm_in = L.residual_in_backward(dh, in_cache)
        assert not (norm_in and norm_out)  # one norm: before the sublayer (pre-norm) or after the sum (post-norm)
        return dx + dx_ffn, norm_in | norm_out, ffn_grads

    norm = {"weight": 1 + 0.3 * rand(rng, 8)} | ({"bias": rand(rng, 8)} if kind == "layer" else {})
    args = dict(x=rand(rng, 2, 3, 8), norm=norm, ffn_params=ffn_params)
    if dropout_p:
        args["dropout"] = replayed(dropout_p, lambda d: forward(**(args | {"dropout": d})))
        assert set(args["dropout"].masks) == {"ffn.dropout", "ffn_dropout"}
    result = check_pair(forward, backward, args, wrt=["x", "norm", "ffn_params"], max_coords=None)
    assert_passes(result, f"residual-{norm_first}-{dropout_p}-{kind}")


# id: (config overrides, dropout p, padded key positions per batch row)
LAYER_CASES = {
    "post-norm-relu": (dict(), 0.0, {}),
    "pre-norm-gelu-padding": (dict(norm_first=True, activation="gelu"), 0.0, {1: [3]}),
    "post-norm-gelu_tanh-padding-dropout": (dict(activation="gelu_tanh"), 0.2, {0: [2, 3]}),
    "pre-norm-relu-H4-dropout": (dict(norm_first=True, n_heads=4), 0.2, {}),
    # after the paper: RMSNorm, gated feed-forward, grouped-query attention, rotary positions, no biases
    "pre-norm-rms-silu-gated-MQA-rope-no-bias": (
        dict(
            norm_first=True, norm="rms", activation="silu", gated_ffn=True, n_kv_heads=1, positional="rope", bias=False
        ),
        0.0,
        {1: [3]},
    ),
    "post-norm-rms-silu-gated-GQA-2of4-rope-padding": (
        dict(norm="rms", activation="silu", gated_ffn=True, n_heads=4, n_kv_heads=2, positional="rope"),
        0.0,
        {0: [2, 3]},
    ),
    "post-norm-rms-gelu-gated-GQA-2of4-rope-no-bias-dropout": (
        dict(norm="rms", activation="gelu", gated_ffn=True, n_heads=4, n_kv_heads=2, positional="rope", bias=False),
        0.2,
        {},
    ),
    "pre-norm-layer-norm-silu-gated-MQA-rope-dropout": (
        dict(norm_first=True, activation="silu", gated_ffn=True, n_kv_heads=1, positional="rope"),
        0.2,
        {1: [0]},
    ),
}


def rotated_blocks(cfg) -> tuple:
    """The attention blocks with rotary positions (self-attention only; cross-attention never rotates)."""
    return ("self_attn.",) if cfg.positional == "rope" else ()


@pytest.mark.parametrize("case", list(LAYER_CASES))
def test_encoder_layer(case):
    overrides, p, pads = LAYER_CASES[case]
    cfg = tiny_config(**overrides)
    rng = np.random.default_rng(31)
    params = random_params(M.sub(parameter_shapes(cfg), "encoder.layers.0"), rng)
    x, mask = rand(rng, 2, 4, 8), padding(2, 4, pads)
    rope = M.rope_for(cfg, 4, np.float64)  # (cos, sin) with rotary positions, else None
    args = dict(params=params, x=x, mask=mask, config=cfg, dropout=None, rope=rope)
    if p:
        layer = functools.partial(M.encoder_layer_forward, params, x, cfg, mask=mask, rope=rope)
        args["dropout"] = replayed(p, lambda d: layer(dropout=d))
    result = check_pair(M.encoder_layer_forward, M.encoder_layer_backward, args, wrt=["x", "params"], max_coords=16)
    assert_passes(result, f"encoder_layer-{case}", rotated_blocks(cfg))


# GPT-NeoX's parallel layer, x + Attn(Norm1(x)) + FFN(Norm2(x)): pre-norm, decoder-only (no memory)
PARALLEL_CASES = {
    "layer-norm-gelu-rope-partial-R2": (dict(activation="gelu", positional="rope", rotary_dim=2, n_heads=2), 0.0),
    "layer-norm-gelu-rope-dropout": (dict(activation="gelu", positional="rope"), 0.2),
    "rms-silu-gated-GQA-2of4-no-bias": (
        dict(norm="rms", activation="silu", gated_ffn=True, n_heads=4, n_kv_heads=2, positional="rope", bias=False),
        0.0,
    ),
}


@pytest.mark.parametrize("case", list(PARALLEL_CASES))
def test_parallel_layer(case):
    overrides, p = PARALLEL_CASES[case]
    cfg = tiny_config(norm_first=True, parallel_residual=True, n_encoder_layers=0, **overrides)
    rng = np.random.default_rng(33)
    params = random_params(M.sub(parameter_shapes(cfg, decoder_only=True), "decoder.layers.0"), rng)
    x = rand(rng, 2, 3, 8)
    rope = M.rope_for(cfg, 3, np.float64)

    def forward(params, x, dropout=None):
        return M.parallel_layer_forward(params, x, None, cfg, dropout=dropout, rope=rope)

    def backward(dout, cache):
        dx, dmemory, grads = M.parallel_layer_backward(dout, cache)
        assert dmemory is None
        return dx, grads

    args = dict(params=params, x=x)
    if p:
        args["dropout"] = replayed(p, lambda d: forward(params, x, d))
    result = check_pair(forward, backward, args, wrt=["x", "params"], max_coords=16)
    assert_passes(result, f"parallel_layer-{case}", rotated_blocks(cfg))
    # the composition itself: the layer's output minus its input is the two sublayers' outputs, each on Norm(x)
    sequential = dataclasses.replace(cfg, parallel_residual=False)
    y_parallel, _ = forward(params, x)
    y_sequential, _ = M.decoder_layer_forward(params, x, None, sequential, rope=rope)
    assert not np.allclose(y_parallel, y_sequential)


@pytest.mark.parametrize("with_memory", [True, False], ids=["memory", "no-memory"])
@pytest.mark.parametrize("case", list(LAYER_CASES))
def test_decoder_layer(case, with_memory):
    overrides, p, pads = LAYER_CASES[case]
    cfg = tiny_config(**overrides)
    rng = np.random.default_rng(32)
    params = random_params(M.sub(parameter_shapes(cfg, decoder_only=not with_memory), "decoder.layers.0"), rng)
    T_tgt, T_src = 3, 4
    x = rand(rng, 2, T_tgt, 8)
    self_mask = causal(T_tgt) & padding(2, T_tgt, {b: [t for t in ts if t < T_tgt] for b, ts in pads.items()})
    memory, memory_mask = (rand(rng, 2, T_src, 8), padding(2, T_src, pads)) if with_memory else (None, None)
    rope = M.rope_for(cfg, T_tgt, np.float64)

    def forward(params, x, memory, dropout=None):
        return M.decoder_layer_forward(
            params, x, memory, cfg, self_mask=self_mask, memory_mask=memory_mask, dropout=dropout, rope=rope
        )

    args = dict(params=params, x=x, memory=memory)
    if p:
        args["dropout"] = replayed(p, lambda d: forward(params, x, memory, d))
    if with_memory:
        assert "cross_attn.q_proj.weight" in params
        result = check_pair(forward, M.decoder_layer_backward, args, wrt=["x", "memory", "params"], max_coords=16)
    else:
        assert not any(k.startswith("cross_attn") for k in params)

        def backward(dout, cache):
            dx, dmemory, grads = M.decoder_layer_backward(dout, cache)
            assert dmemory is None
            return dx, grads

        result = check_pair(forward, backward, args, wrt=["x", "params"], max_coords=16)
    assert_passes(result, f"decoder_layer-{case}-{with_memory}", rotated_blocks(cfg))


# id: (config overrides, dropout p, source picture)
STACK_CASES = {
    "post-norm-sinusoidal-2layers": (dict(n_encoder_layers=2, n_decoder_layers=2), 0.0, ["....", "...."]),
    "pre-norm-learned-padding": (dict(norm_first=True, positional="learned"), 0.0, ["....", "..__"]),
    "pre-norm-learned-2layers-dropout-all-pad-row": (
        dict(norm_first=True, positional="learned", n_encoder_layers=2, n_decoder_layers=2, activation="gelu"),
        0.2,
        ["...._", "_____"],
    ),
    "pre-norm-rms-silu-gated-GQA-2of4-rope-no-bias-2layers": (
        dict(
            norm_first=True,
            norm="rms",
            activation="silu",
            gated_ffn=True,
            n_heads=4,
            n_kv_heads=2,
            positional="rope",
            bias=False,
            n_encoder_layers=2,
            n_decoder_layers=2,
        ),
        0.0,
        ["....", "..__"],
    ),
    "post-norm-rms-MQA-rope-dropout-all-pad-row": (
        dict(norm="rms", n_kv_heads=1, positional="rope", gated_ffn=True, activation="gelu"),
        0.2,
        ["....", "____"],
    ),
}


@pytest.mark.parametrize("case", list(STACK_CASES))
def test_encoder(case):
    overrides, p, picture = STACK_CASES[case]
    cfg = tiny_config(**overrides)
    rng = np.random.default_rng(33)
    params = random_params(M.sub(parameter_shapes(cfg), "encoder"), rng)
    src_ids = make_ids(rng, picture, cfg.src_vocab_size)
    args = dict(params=params, src_ids=src_ids, config=cfg, dropout=None)
    if p:
        args["dropout"] = replayed(p, lambda d: M.encoder_forward(params, src_ids, cfg, d))
    result = check_pair(M.encoder_forward, M.encoder_backward, args, wrt=["params"], max_coords=16)
    assert_passes(result, f"encoder-{case}", rotated_blocks(cfg))


@pytest.mark.parametrize("case", list(STACK_CASES))
def test_decoder_with_memory(case):
    overrides, p, picture = STACK_CASES[case]
    cfg = tiny_config(**overrides)
    rng = np.random.default_rng(34)
    params = random_params(M.sub(parameter_shapes(cfg), "decoder"), rng)
    src_ids = make_ids(rng, picture, cfg.src_vocab_size)
    tgt_ids = make_ids(rng, ["_..", "..."], cfg.tgt_vocab_size)  # batch 0 query 0: nothing to attend to
    memory, memory_mask = rand(rng, 2, len(picture[0]), 8), M.padding_mask(src_ids, cfg.pad_id)

    def forward(params, memory, dropout=None):
        return M.decoder_forward(params, tgt_ids, memory, cfg, dropout, memory_mask=memory_mask)

    args = dict(params=params, memory=memory, dropout=None)
    if p:
        args["dropout"] = replayed(p, lambda d: forward(params, memory, d))
    result = check_pair(forward, M.decoder_backward, args, wrt=["memory", "params"], max_coords=16)
    assert_passes(result, f"decoder-{case}", rotated_blocks(cfg))


@pytest.mark.parametrize("case", list(STACK_CASES))
def test_decoder_without_memory(case):
    overrides, p, _ = STACK_CASES[case]
    cfg = tiny_config(**overrides)
    rng = np.random.default_rng(35)
    params = random_params(M.sub(parameter_shapes(cfg, decoder_only=True), "decoder"), rng)
    tgt_ids = make_ids(rng, ["....", "_.._"], cfg.tgt_vocab_size)

    def forward(params, dropout=None):
        return M.decoder_forward(params, tgt_ids, None, cfg, dropout)

    def backward(dout, cache):
        dmemory, grads = M.decoder_backward(dout, cache)
        assert dmemory is None
        return grads

    args = dict(params=params, dropout=None)
    if p:
        args["dropout"] = replayed(p, lambda d: forward(params, d))
    result = check_pair(forward, backward, args, wrt=["params"], max_coords=16)
    assert_passes(result, f"decoder-no-memory-{case}", rotated_blocks(cfg))


# ----------------------------------------------------------------------------------------------
# Cross-entropy.


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 1.0])
@pytest.mark.parametrize("layout", ["2d", "3d"])
def test_cross_entropy(layout, label_smoothing):
    rng = np.random.default_rng(40)
    V = 7
    shape = (6,) if layout == "2d" else (2, 4)
    targets = rng.integers(0, V, size=shape)
    targets.reshape(-1)[[1, 4]] = -100  # ignored rows (ignore_index=-100)
    args = dict(logits=rand(rng, *shape, V, scale=2.0), targets=targets, label_smoothing=label_smoothing)

    def backward(dloss, cache):
        return X.cross_entropy_backward(cache, dloss)

    result = check_pair(X.cross_entropy_forward, backward, args, wrt=["logits"], max_coords=None)
    assert_passes(result, f"cross_entropy-{layout}-{label_smoothing}")


def test_cross_entropy_custom_ignore_index():
    rng = np.random.default_rng(41)
    targets = np.array([[3, 0, 2, 0], [0, 5, 5, 1]])
    args = dict(logits=rand(rng, 2, 4, 6), targets=targets, ignore_index=0, label_smoothing=0.2)
    result = check_pair(X.cross_entropy_forward, lambda d, c: X.cross_entropy_backward(c, d), args, wrt=["logits"])
    assert_passes(result, "cross_entropy-ignore0")


# ----------------------------------------------------------------------------------------------
# Whole models, every parameter tensor. Pictures: "_" is pad_id, "." any other token.


# id: (config overrides, train with dropout, src picture, tgt picture)
TRANSFORMER_CASES = [
    pytest.param(dict(), ["...."], ["...."], id="B1-no-padding-post-norm-relu-sinusoidal-untied"),
    pytest.param(
        dict(norm_first=True, activation="gelu", positional="learned", n_encoder_layers=2, n_decoder_layers=2),
        ["......", "....__"],
        ["...", ".._"],
        id="B2-padding-Tsrc6-Ttgt3-pre-norm-gelu-learned-2layers",
    ),
    pytest.param(
        dict(activation="gelu_tanh", tie_embeddings=True),
        ["...", "___"],
        ["_....", "....."],
        id="fully-masked-rows-all-pad-src-tgt-starts-with-pad-Tsrc3-Ttgt5-post-norm-gelu_tanh-tied",
    ),
    pytest.param(
        dict(n_heads=4, norm_first=True, tie_embeddings=True, positional="learned"),
        ["....", "..__", ".._."],
        ["..", "..", ".."],
        id="B3-H4-padding-pre-norm-relu-tied-learned",
    ),
    pytest.param(
        dict(dropout=0.2, norm_first=True, activation="gelu", n_decoder_layers=2),
        ["....._", "...___"],
        ["....", "..._"],
        id="train-dropout-pre-norm-gelu-sinusoidal-untied-padding",
    ),
    pytest.param(
        dict(dropout=0.3, tie_embeddings=True, positional="learned", activation="relu"),
        ["...", ".._"],
        ["_...", "...."],
        id="train-dropout-post-norm-relu-tied-learned-fully-masked-row",
    ),
    pytest.param(
        dict(scale_embeddings=False, n_encoder_layers=0, pad_id=4),
        [".._.", "...."],
        ["...", "._."],
        id="no-scale-no-encoder-layers-pad_id4",
    ),
    pytest.param(
        dict(
            src_vocab_size=13,
            embedding_norm=True,
            sinusoid_layout="split",
            share_embeddings=True,
            tie_embeddings=True,
            activation="gelu",
        ),
        ["....", "..__"],
        ["_...", "...."],
        id="Marian-BART-options-embedding-norm-split-sinusoids-shared-tied-pad-start-token",
    ),
    pytest.param(
        dict(src_vocab_size=13, share_embeddings=True, positional="learned", norm_first=True, type_vocab_size=3),
        ["...._", "....."],
        ["...", "..."],
        id="shared-untied-learned-pre-norm-token-types-in-the-encoder",
    ),
    pytest.param(
        dict(pad_id=None, embedding_norm=True, dropout=0.2),
        ["..._", "...."],
        ["_..", "..."],
        id="train-dropout-pad_id-None-embedding-norm",
    ),
    pytest.param(
        dict(
            positional="rope",
            norm="rms",
            n_heads=4,
            n_kv_heads=2,
            gated_ffn=True,
            activation="silu",
            norm_first=True,
            n_encoder_layers=2,
        ),
        ["....._", "...___"],
        ["_...", "...."],
        id="rope-rms-GQA-2of4-cross-attention-gated-silu-pre-norm-padding-fully-masked-row",
    ),
    pytest.param(
        dict(
            positional="rope",
            norm="rms",
            n_kv_heads=1,
            bias=False,
            output_bias=False,
            tie_embeddings=True,
            dropout=0.2,
            activation="gelu",
        ),
        ["....", ".._."],
        ["...", "..."],
        id="train-dropout-rope-rms-MQA-no-bias-no-output-bias-post-norm-tied",
    ),
]


@pytest.mark.parametrize(("overrides", "src", "tgt"), TRANSFORMER_CASES)
def test_transformer(overrides, src, tgt):
    cfg = tiny_config(**overrides)
    rng = np.random.default_rng(50)
    model = Transformer(cfg, seed=3)
    if cfg.dropout == 0.0:
        model.eval()
    perturb(model, rng)
    src_ids = make_ids(rng, src, cfg.src_vocab_size, cfg.pad_id)
    tgt_ids = make_ids(rng, tgt, cfg.tgt_vocab_size, cfg.pad_id)
    if cfg.share_embeddings:  # ids that the source and the target both use: the two lookups meet in one row
        src_ids[0, :2], tgt_ids[1, 1:3] = 5, 5
    result = check_model(model, src_ids, tgt_ids, seed=5, max_coords=16)
    assert set(result.errors) == set(model.params)  # every parameter tensor was checked
    if cfg.dropout:
        masks = np.concatenate([m.ravel() for m in model.dropout_masks.values()])
        assert masks.any() and not masks.all(), "training mode should have dropped some units"
    assert_passes(result, f"transformer-{sorted(overrides.items())}", rotated_blocks(cfg))


LLAMA = dict(
    norm_first=True,
    norm="rms",
    positional="rope",
    activation="silu",
    gated_ffn=True,
    n_heads=4,
    n_kv_heads=2,
    bias=False,
    output_bias=False,
    pad_id=None,
    n_decoder_layers=2,
)
LM_CASES = [
    pytest.param(dict(), [".....", "....."], id="B2-no-padding-post-norm-relu-sinusoidal-untied"),
    pytest.param(
        dict(norm_first=True, activation="gelu", tie_embeddings=True, positional="learned"),
        ["_....", "...__"],
        id="padding-row-starts-with-pad-pre-norm-gelu-tied-learned",
    ),
    pytest.param(dict(dropout=0.25, activation="gelu_tanh"), ["....", "..._"], id="train-dropout-post-norm-gelu_tanh"),
    pytest.param(
        dict(n_heads=4, norm_first=True, n_decoder_layers=2, dropout=0.2, tie_embeddings=True),
        ["......", "_....."],
        id="train-dropout-H4-pre-norm-relu-2layers-tied-fully-masked-row",
    ),
    pytest.param(
        LLAMA, ["......", "......"], id="Llama-rms-rope-silu-gated-GQA-2of4-no-bias-no-output-bias-pad_id-None"
    ),
    pytest.param(
        LLAMA | dict(n_kv_heads=1, n_heads=2, dropout=0.2, tie_embeddings=True, bias=True, norm_first=False),
        ["_....", "....."],
        id="train-dropout-post-norm-rms-rope-MQA-gated-tied-with-biases",
    ),
    pytest.param(
        dict(
            norm_first=True,
            parallel_residual=True,
            positional="rope",
            rotary_dim=2,
            activation="gelu",
            n_decoder_layers=2,
            pad_id=None,
            output_bias=False,
        ),
        ["....", "...."],
        id="GPT-NeoX-parallel-residual-partial-rotary-R2of4-gelu",
    ),  # fmt: skip
]


@pytest.mark.parametrize(("overrides", "ids"), LM_CASES)
def test_transformer_lm(overrides, ids):
    cfg = tiny_config(**overrides)
    rng = np.random.default_rng(51)
    model = TransformerLM(cfg, seed=4)
    if cfg.dropout == 0.0:
        model.eval()
    perturb(model, rng)
    result = check_model(model, make_ids(rng, ids, cfg.tgt_vocab_size, cfg.pad_id), seed=6, max_coords=16)
    assert set(result.errors) == set(model.params)
    assert not any(k.startswith("encoder") or "cross_attn" in k for k in result.errors)
    assert_passes(result, f"lm-{sorted(overrides.items())}", rotated_blocks(cfg))


ENCODER_CASES = [
    pytest.param(
        dict(type_vocab_size=2, embedding_norm=True, positional="learned", activation="gelu", layer_norm_eps=1e-12),
        ["......", "....__"],
        id="BERT-post-norm-token-types-embedding-norm-learned-gelu-padding",
    ),
    pytest.param(
        dict(norm_first=True, n_encoder_layers=2, n_heads=4, type_vocab_size=3, sinusoid_layout="split"),
        ["....", "___.", "...."],
        id="pre-norm-2layers-H4-3-token-types-split-sinusoids",
    ),
    pytest.param(
        dict(dropout=0.2, embedding_norm=True, type_vocab_size=2, activation="gelu_tanh"),
        ["......", "...___"],
        id="train-dropout-post-norm-embedding-norm-token-types",
    ),
    pytest.param(dict(pad_id=None, scale_embeddings=False), ["...._", "_...."], id="pad_id-None-unscaled-no-types"),
    pytest.param(
        dict(positional="rope", type_vocab_size=2, activation="gelu", embedding_norm=True),
        ["......", "....__"],
        id="rope-post-norm-layer-norm-token-types-padding",
    ),
    pytest.param(
        dict(positional="rope", norm="rms", n_heads=4, n_kv_heads=2, gated_ffn=True, activation="silu", bias=False),
        [".....", "..___"],
        id="rope-rms-GQA-2of4-gated-silu-no-bias",
    ),
    pytest.param(dict(final_norm=True), ["......", "....__"], id="post-norm-with-final-norm"),
]


@pytest.mark.parametrize(("overrides", "ids"), ENCODER_CASES)
def test_encoder_model(overrides, ids):
    cfg = tiny_config(**overrides)
    rng = np.random.default_rng(52)
    model = EncoderModel(cfg, seed=5)
    if cfg.dropout == 0.0:
        model.eval()
    perturb(model, rng)
    src_ids = make_ids(rng, ids, cfg.src_vocab_size, cfg.pad_id)
    inputs = (src_ids,)
    if cfg.type_vocab_size:
        inputs += (rng.integers(0, cfg.type_vocab_size, size=src_ids.shape),)
    result = check_model(model, *inputs, seed=7, max_coords=16)
    assert set(result.errors) == set(model.params)
    assert all(k.startswith("encoder.") for k in result.errors)
    assert_passes(result, f"encoder-{sorted(overrides.items())}", rotated_blocks(cfg))


@pytest.mark.parametrize("relative_bias", [False, True], ids=["RoBERTa", "MPNet-with-T5-bias-8-buckets"])
def test_encoder_model_with_roberta_positions(relative_bias):
    """RoBERTa's positions (positions_after_pad): pad_id + the count of real tokens, rows padded on the left and
    inside; MPNet's adds T5's bidirectional bias beside them (relative_bias; 8 buckets, a maximum distance of 6, so
    that the 5 positions reach the logarithmic buckets). The table's pad_id row takes no gradient by convention
    (nn.Embedding's padding_idx), not because the output ignores it: a pad token's own hidden state reads it. With
    the upstream gradient zero at the pad tokens (whose rows nothing else reads: they are masked out as keys) that
    convention is the true derivative, and finite differences check every parameter, the whole position table
    included."""
    cfg = tiny_config(positional="learned", positions_after_pad=True, embedding_norm=True, activation="gelu")
    if relative_bias:
        cfg = dataclasses.replace(cfg, relative_bias=True, relative_buckets=8, relative_max_distance=6)
    rng = np.random.default_rng(53)
    model = EncoderModel(cfg, seed=6).eval()
    perturb(model, rng)
    ids = make_ids(rng, ["__...", ".._..", "....."], cfg.src_vocab_size, cfg.pad_id)
    upstream = rng.standard_normal((*ids.shape, cfg.d_model)) * (ids != cfg.pad_id)[..., None]  # (B, T, D)
    model.zero_grad()
    model.forward(ids)
    model.backward(upstream)
    grads = {k: g.copy() for k, g in model.grads.items()}
    assert not grads["encoder.position_embedding.weight"][cfg.pad_id].any()
    assert grads["encoder.position_embedding.weight"][cfg.pad_id + 1 : cfg.pad_id + 6].all()  # positions 1 .. 5 read

    def fn():
        return np.sum(model.forward(ids) * upstream)

    result = gradcheck(fn, model.params, grads, max_coords=16, seed=8)
    assert set(result.errors) == set(model.params)
    assert ("encoder.relative_bias.weight" in model.params) == relative_bias
    assert_passes(result, f"encoder-roberta-positions-relative-bias-{relative_bias}")
    table = "encoder.position_embedding.weight"
    whole = gradcheck(fn, {table: model.params[table]}, {table: grads[table]}, max_coords=None, seed=8)
    assert whole.worst <= BAR, f"the whole position table: {whole}"


# ----------------------------------------------------------------------------------------------
# Gemma 3's new pairs: the RMSNorm of gain 1 + w, the sandwich residual, the final soft-capping, and q/k norms.


@pytest.mark.parametrize("eps", [1e-6, 0.1])
def test_offset_rms_norm(eps):
    """Gemma's RMSNorm, gain 1 + w: w near 0 (its neutral value), off it so that a missing 1 would show."""
    rng = np.random.default_rng(70)
    args = dict(x=0.5 + 2.0 * rand(rng, 2, 3, 8), weight=0.3 * rand(rng, 8), eps=eps)
    result = check_pair(
        L.offset_rms_norm_forward, L.offset_rms_norm_backward, args, wrt=["x", "weight"], max_coords=None
    )
    assert_passes(result, f"offset_rms_norm-{eps}")


def test_offset_rms_norm_is_rms_norm_of_gain_one_plus_w():
    rng = np.random.default_rng(71)
    x, w = rand(rng, 2, 3, 8), 0.3 * rand(rng, 8)
    np.testing.assert_array_equal(L.offset_rms_norm_forward(x, w, 1e-6)[0], L.rms_norm_forward(x, 1.0 + w, 1e-6)[0])
    assert not np.allclose(L.offset_rms_norm_forward(x, w, 1e-6)[0], L.rms_norm_forward(x, w, 1e-6)[0])


@pytest.mark.parametrize("cap", [0.5, 30.0])
def test_softcap(cap):
    """cap * tanh(z / cap): values past the cap (cap 0.5) where the slope is far from one, and a cap far above them."""
    rng = np.random.default_rng(72)
    args = dict(z=2.0 * rand(rng, 2, 3, 5), cap=cap)
    result = check_pair(L.softcap_forward, L.softcap_backward, args, wrt=["z"], max_coords=None)
    assert_passes(result, f"softcap-{cap}")
    assert np.abs(L.softcap_forward(args["z"], cap)[0]).max() < cap


@pytest.mark.parametrize("dropout_p", [0.0, 0.3], ids=["no-dropout", "dropout"])
def test_sandwich_residual_around_feed_forward(dropout_p):
    """x + drop(Norm_post(FFN(Norm(x)))): the pre-norm's and the post-norm's weights both get gradients."""
    rng = np.random.default_rng(73)
    ffn_params = random_params(M.sub(parameter_shapes(tiny_config()), "encoder.layers.0.ffn"), rng)

    def forward(x, norm, post_norm, ffn_params, dropout=None):
        h, in_cache = L.residual_in_forward(norm, x, True, 1e-6, "rms_offset")
        y, ffn_cache = L.feed_forward_forward(ffn_params, h, "gelu_tanh", dropout)
        out, out_cache = L.sandwich_out_forward(post_norm, x, y, 1e-6, dropout, "ffn_dropout", "rms_offset")
        return out, (in_cache, ffn_cache, out_cache)

    def backward(dout, cache):
        in_cache, ffn_cache, out_cache = cache
        dx, dy, post_grads = L.sandwich_out_backward(dout, out_cache)
        dh, ffn_grads = L.feed_forward_backward(dy, ffn_cache)
        dx_ffn, norm_grads = L.residual_in_backward(dh, in_cache)
        return dx + dx_ffn, norm_grads, post_grads, ffn_grads

    args = dict(x=rand(rng, 2, 3, 8), norm={"weight": 0.3 * rand(rng, 8)}, post_norm={"weight": 0.3 * rand(rng, 8)})
    args["ffn_params"] = ffn_params
    if dropout_p:
        args["dropout"] = replayed(dropout_p, lambda d: forward(**(args | {"dropout": d})))
    wrt = ["x", "norm", "post_norm", "ffn_params"]
    result = check_pair(forward, backward, args, wrt=wrt, max_coords=None)
    assert {"norm.weight", "post_norm.weight"} <= set(result.errors)
    assert_passes(result, f"sandwich-{dropout_p}")


@pytest.mark.parametrize("kind", ["rms", "rms_offset"])
def test_qk_norm_kinds(kind):
    """The RMSNorm of each head's vector (B, H, T, Dh), one weight (Dh,) for every head and position: Qwen3's
    ("rms") and Gemma's, gain 1 + w ("rms_offset")."""
    rng = np.random.default_rng(74)
    args = dict(x=rand(rng, 2, 3, 4, 6), weight=0.3 * rand(rng, 6) + (kind == "rms"), eps=1e-6, kind=kind)
    result = check_pair(A.qk_norm_forward, A.qk_norm_backward, args, wrt=["x", "weight"], max_coords=None)
    assert_passes(result, f"qk_norm-{kind}")


GEMMA = dict(
    norm_first=True, norm="rms_offset", positional="rope", activation="gelu_tanh", gated_ffn=True, n_heads=4,
    n_kv_heads=2, bias=False, output_bias=False, qk_norm=True, sandwich_norm=True, logit_softcap=2.0,
    attention_scale=0.4, tie_embeddings=True, n_decoder_layers=2, pad_id=None,
)  # fmt: skip


@pytest.mark.parametrize("dropout", [0.0, 0.2], ids=["eval", "train-dropout"])
def test_gemma_lm(dropout):
    """A whole Gemma-like LM: (1 + w) norms in the sandwich, q/k norms, GeGLU (tanh), scaled tied embeddings, its own
    attention scale, the final soft-capping; every parameter checked."""
    cfg = tiny_config(**GEMMA, dropout=dropout)
    rng = np.random.default_rng(75)
    model = TransformerLM(cfg, seed=4)
    if dropout == 0.0:
        model.eval()
    perturb(model, rng)
    result = check_model(
        model, make_ids(rng, ["......", "......"], cfg.tgt_vocab_size, cfg.pad_id), seed=6, max_coords=16
    )
    assert set(result.errors) == set(model.params)
    assert {k for k in model.params if "post_norm" in k or "q_norm" in k} <= set(result.errors)
    assert_passes(result, f"gemma-lm-{dropout}", rotated_blocks(cfg))


# ----------------------------------------------------------------------------------------------
# Gemma 2's new pair: the soft cap of the attention scores (scores.score_cap_*), alone, inside the plain and the tiled
# attention pairs, and in a whole Gemma 2 LM.


@pytest.mark.parametrize("cap", [0.5, 50.0])
def test_score_cap(cap):
    """cap * tanh(S / cap) of scores (B, H, T_q, T_k): scores past the cap (0.5), where the slope is far from one, and
    the released cap (50) far above them. The forward works in place: each call gets its own copy."""
    from numpy_transformer import scores as S

    rng = np.random.default_rng(76)
    args = dict(scores=2.0 * rand(rng, 2, 3, 4, 5), cap=cap)
    result = check_pair(
        lambda scores, cap: S.score_cap_forward(scores.copy(), cap), S.score_cap_backward, args, wrt=["scores"],
        max_coords=None,
    )  # fmt: skip
    assert_passes(result, f"score-cap-{cap}")
    assert np.abs(S.score_cap_forward(args["scores"].copy(), cap)[0]).max() < cap


@pytest.mark.parametrize("kernel", ["plain", "flash"])
def test_attention_with_capped_scores(kernel):
    """The plain and the tiled pair with Gemma 2's cap, a causal sliding window and padding, every score past the
    bend of tanh (cap 0.7); the tiled pair in blocks of 2, so that hidden entries (-inf) pass the cap's backward."""
    from numpy_transformer.scores import ScoreMod

    rng = np.random.default_rng(77)
    B, H, T, Dh = 2, 2, 5, 4
    mask = np.ones((B, 1, 1, T), dtype=bool)
    mask[1, ..., :2] = False  # a left-padded row
    mod = ScoreMod(scale=0.9, causal=True, window=3, softcap=0.7)
    args = dict(q=2.0 * rand(rng, B, H, T, Dh), k=2.0 * rand(rng, B, H, T, Dh), v=rand(rng, B, H, T, Dh), mask=mask)
    if kernel == "plain":
        forward = functools.partial(A.scaled_dot_product_attention_forward, mod=mod)
        backward = A.scaled_dot_product_attention_backward
    else:
        forward = functools.partial(A.flash_attention_forward, mod=mod, block_q=2, block_k=2)
        backward = A.flash_attention_backward
    result = check_pair(
        lambda q, k, v, mask: forward(q, k, v, mask),
        lambda dout, cache: backward(dout, cache)[:3],
        args,
        wrt=["q", "k", "v"],
        max_coords=None,
    )
    assert_passes(result, f"capped-attention-{kernel}")
    plain = A.scaled_dot_product_attention_forward(args["q"], args["k"], args["v"], mask, mod=mod)[0]
    uncapped = A.scaled_dot_product_attention_forward(
        args["q"], args["k"], args["v"], mask, mod=dataclasses.replace(mod, softcap=None)
    )[0]
    assert np.abs(plain - uncapped).max() > 0.05  # the cap bends these scores


@pytest.mark.slow  # 2-3 s each: the default run checks the cap's pair and both kernels with it (above)
@pytest.mark.parametrize("attention", ["plain", "flash"])
def test_gemma2_lm(attention):
    """A whole Gemma 2-like LM: Gemma's (1 + w) sandwich without q/k norms, every attention score capped (0.8), the
    final logits capped (2), a local layer (window 2) then a global one; every parameter checked."""
    fields = GEMMA | dict(qk_norm=False, attn_softcap=0.8, layer_types=("sliding_attention", "full_attention"))
    cfg = tiny_config(**fields, n_encoder_layers=0, sliding_window=2, attention=attention)
    rng = np.random.default_rng(78)
    model = TransformerLM(cfg, seed=5).eval()
    perturb(model, rng)
    result = check_model(
        model, make_ids(rng, ["......", "......"], cfg.tgt_vocab_size, cfg.pad_id), seed=7, max_coords=16
    )
    assert set(result.errors) == set(model.params)
    assert_passes(result, f"gemma2-lm-{attention}", rotated_blocks(cfg))


# Phi-2's parallel block of one norm, x + Attn(N(x)) + FFN(N(x)): the norm's backward runs once on both branches' sum
PARALLEL_BLOCK_CASES = {
    "phi-layer-norm-gelu_tanh-partial-R2-biases": (dict(activation="gelu_tanh", rotary_dim=2, n_heads=2), 0.0),
    "dropout-GQA-2of4": (dict(activation="gelu_tanh", n_heads=4, n_kv_heads=2), 0.2),
}


@pytest.mark.parametrize("case", list(PARALLEL_BLOCK_CASES))
def test_parallel_block(case):
    overrides, p = PARALLEL_BLOCK_CASES[case]
    cfg = tiny_config(
        norm_first=True, parallel_residual=True, shared_norm=True, positional="rope", n_encoder_layers=0, **overrides
    )
    rng = np.random.default_rng(34)
    params = random_params(M.sub(parameter_shapes(cfg, decoder_only=True), "decoder.layers.0"), rng)
    assert not any(name.startswith("ffn_norm") for name in params)  # one norm: self_attn_norm
    x = rand(rng, 2, 3, 8)
    rope = M.rope_for(cfg, 3, np.float64)

    def forward(params, x, dropout=None):
        return M.parallel_block_forward(params, x, None, cfg, dropout=dropout, rope=rope)

    def backward(dout, cache):
        dx, dmemory, grads = M.parallel_block_backward(dout, cache)
        assert dmemory is None
        return dx, grads

    args = dict(params=params, x=x)
    if p:
        args["dropout"] = replayed(p, lambda d: forward(params, x, d))
    result = check_pair(forward, backward, args, wrt=["x", "params"], max_coords=16)
    assert {"params.self_attn_norm.weight", "params.self_attn_norm.bias"} <= set(result.errors)
    assert_passes(result, f"parallel_block-{case}", rotated_blocks(cfg))
    # the composition: GPT-NeoX's layer with both norms equal to the one norm computes the same
    two_norms = dataclasses.replace(cfg, shared_norm=False)
    with_ffn_norm = params | {k.replace("self_attn_norm", "ffn_norm"): v for k, v in params.items() if "_norm" in k}
    y_block, _ = forward(params, x)
    y_neox, _ = M.parallel_layer_forward(with_ffn_norm, x, None, two_norms, rope=rope)
    np.testing.assert_allclose(y_block, y_neox, rtol=0, atol=1e-14)


# ----------------------------------------------------------------------------------------------
# OLMo 2's new pair: the RMSNorm of a whole q or k projection (B, T, H*Dh), one root mean square across the heads; and
# a whole OLMo 2-like LM (norms of the sublayers' outputs only) and a SmolLM3-like one (a layer without positions).


def test_qk_projection_norm():
    """x (B, T, H*Dh) = (2, 3, 12) (three heads of 4): every feature's gradient reads the whole row's sum."""
    rng = np.random.default_rng(81)
    args = dict(x=rand(rng, 2, 3, 12), weight=0.3 * rand(rng, 12) + 1.0, eps=1e-6)
    result = check_pair(A.qk_projection_norm_forward, A.qk_projection_norm_backward, args, wrt=["x", "weight"])
    assert_passes(result, "qk_projection_norm")


OLMO2 = dict(
    norm_first=True, norm="rms", positional="rope", activation="silu", gated_ffn=True, n_heads=4, n_kv_heads=2,
    bias=False, output_bias=False, qk_norm=True, qk_norm_projection=True, sandwich_norm=True, input_norm=False,
    n_encoder_layers=0, n_decoder_layers=2, pad_id=None, scale_embeddings=False,
)  # fmt: skip


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(OLMO2, id="olmo2-post-norms-projection-qk-norms"),
        pytest.param(
            {
                k: v
                for k, v in OLMO2.items()
                if k not in ("qk_norm", "qk_norm_projection", "sandwich_norm", "input_norm")
            }
            | dict(n_decoder_layers=3, rope_layers=(True, False, True)),
            id="smollm3-nope-middle-layer",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_olmo2_and_smollm3_lm(overrides):
    """A whole OLMo 2-like LM (no pre-norms: x + Norm_post(f(x)); q/k norms over the projections) and a SmolLM3-like
    one (its middle layer without RoPE); every parameter checked."""
    cfg = tiny_config(**overrides)
    rng = np.random.default_rng(82)
    model = TransformerLM(cfg, seed=8).eval()
    perturb(model, rng)
    if cfg.input_norm is False:
        assert not any(k.endswith(("self_attn_norm.weight", "ffn_norm.weight")) for k in model.params)
        assert model.params["decoder.layers.0.self_attn.q_norm.weight"].shape == (cfg.n_heads * cfg.d_head,)
    result = check_model(
        model, make_ids(rng, ["......", "......"], cfg.tgt_vocab_size, cfg.pad_id), seed=9, max_coords=16
    )
    assert set(result.errors) == set(model.params)
    assert_passes(result, "olmo2-smollm3-lm", rotated_blocks(cfg))
