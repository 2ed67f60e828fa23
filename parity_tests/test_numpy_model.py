"""Behaviour of numpy_transformer beyond its gradients: dtypes, masks, fully masked rows, state dicts,
initialisation, train/eval and dropout replay, attention maps, the loss against a direct formula,
and importing without torch.

Every comparison can fail: upstream gradients are random draws from seeded generators, and each
"does not change" check is paired with a "does change" check where the change is expected.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numpy_transformer import (
    EncoderModel,
    Transformer,
    TransformerConfig,
    TransformerLM,
    cross_entropy_backward,
    cross_entropy_forward,
    multi_head_attention_backward,
    multi_head_attention_forward,
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)
from numpy_transformer import layers as L
from numpy_transformer.attention import (
    MHA_KEYS,
    repeat_kv_backward,
    repeat_kv_forward,
    rope_angles,
    rope_backward,
    rope_forward,
)
from numpy_transformer.model import parameter_shapes

REPO = Path(__file__).resolve().parents[1]


def tiny_config(**overrides) -> TransformerConfig:
    values = dict(
        src_vocab_size=11,
        tgt_vocab_size=13,
        d_model=8,
        n_heads=2,
        d_ff=12,
        n_encoder_layers=2,
        n_decoder_layers=2,
        max_len=8,
    )
    return TransformerConfig(**(values | overrides))


def make_ids(rng, rows: list[str], vocab: int, pad_id: int = 0) -> np.ndarray:
    """One string per batch row: "_" is pad_id, "." a token drawn from [3, vocab) other than pad_id."""
    choices = np.array([i for i in range(3, vocab) if i != pad_id])
    picture = np.array([list(r) for r in rows])
    ids = rng.choice(choices, size=picture.shape)
    ids[picture == "_"] = pad_id
    return ids


def randomize(model, rng) -> None:
    """Move biases and norm weights off their init values (zero / one), in place."""
    for name, value in model.params.items():
        if name.endswith("norm.weight") or name.endswith(".bias"):
            value += (0.3 * rng.standard_normal(value.shape)).astype(value.dtype)


def float_leaves(obj, path: str):
    """(path, dtype) of every floating-point array or NumPy scalar inside nested dicts/lists/tuples/dataclasses."""
    if isinstance(obj, (np.ndarray, np.generic)):
        if np.issubdtype(obj.dtype, np.floating):
            yield path, obj.dtype
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from float_leaves(v, f"{path}[{k!r}]")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from float_leaves(v, f"{path}[{i}]")
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):  # a pair's cache: its fields
        for f in dataclasses.fields(obj):
            yield from float_leaves(getattr(obj, f.name), f"{path}.{f.name}")


def assert_all_dtype(obj, dtype, path: str) -> None:
    wrong = [(p, d) for p, d in float_leaves(obj, path) if d != dtype]
    assert not wrong, f"expected every floating array to be {np.dtype(dtype)}, got: {wrong[:10]}"


# ----------------------------------------------------------------------------------------------
# dtype in = dtype out.


DTYPE_CASES = [
    pytest.param(False, dict(dropout=0.2), id="transformer-post-relu-sinusoidal-train-dropout"),
    pytest.param(
        False,
        dict(norm_first=True, activation="gelu", positional="learned", tie_embeddings=True),
        id="transformer-pre-gelu-learned-tied",
    ),
    pytest.param(True, dict(norm_first=True, activation="gelu_tanh", dropout=0.1), id="lm-pre-gelu_tanh-train-dropout"),
    pytest.param(
        True,
        dict(
            norm_first=True,
            norm="rms",
            positional="rope",
            activation="silu",
            gated_ffn=True,
            n_heads=4,
            n_kv_heads=2,
            bias=False,
            output_bias=False,
        ),
        id="lm-llama-rms-rope-silu-gated-GQA-no-bias",
    ),
    pytest.param(
        False,
        dict(norm="rms", positional="rope", gated_ffn=True, n_kv_heads=1, rope_theta=500.0, dropout=0.2),
        id="transformer-post-rms-rope-gated-MQA-train-dropout",
    ),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize(("lm", "overrides"), DTYPE_CASES)
def test_model_keeps_its_dtype_everywhere(lm, overrides, dtype):
    cfg = tiny_config(**overrides)
    rng = np.random.default_rng(0)
    model = (TransformerLM if lm else Transformer)(cfg, seed=1, dtype=dtype)
    assert_all_dtype(model.params, dtype, "params")
    tgt = make_ids(rng, ["....._", "...___"], cfg.tgt_vocab_size)
    inputs = (tgt,) if lm else (make_ids(rng, [".....", "...__"], cfg.src_vocab_size), tgt)
    with np.errstate(all="raise", under="ignore"):
        logits = model.forward(*inputs)
        loss, cache = cross_entropy_forward(logits, tgt, ignore_index=cfg.pad_id, label_smoothing=0.1)
        dlogits = cross_entropy_backward(cache)
        model.zero_grad()
        model.backward(dlogits)
    assert logits.dtype == dtype
    assert np.asarray(loss).dtype == dtype
    assert dlogits.dtype == dtype
    assert_all_dtype(model.grads, dtype, "grads")
    assert_all_dtype(model.attention_maps(), dtype, "attention_maps()")
    assert_all_dtype(model.activations(), dtype, "activations()")
    # White-box: every intermediate the forward kept for the backward (a silent float64 upcast in
    # float32 shows up here even when a later cast hides it from the outputs).
    assert_all_dtype(model._cache, dtype, "model._cache")
    assert set(model.grads) == set(model.params)
    for k, g in model.grads.items():
        assert g.shape == model.params[k].shape, k
    assert all(np.isfinite(g).all() for g in model.grads.values())


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_functional_pairs_keep_their_dtype(dtype):
    rng = np.random.default_rng(1)

    def r(*shape):
        return rng.standard_normal(shape).astype(dtype)

    def check(name, *arrays):
        assert_all_dtype(list(arrays), dtype, name)

    x = r(2, 3, 8)
    out, c = L.linear_forward(x, r(5, 8), r(5))
    check("linear", out, L.linear_backward(r(2, 3, 5), c))
    out, c = L.embedding_forward(np.array([[1, 2, 1]]), r(4, 8), math.sqrt(8))
    check("embedding", out, L.embedding_backward(r(1, 3, 8), c))
    out, c = L.add_positions_forward(x, L.sinusoidal_table(6, 8, dtype))
    check("add_positions", out, L.add_positions_backward(r(2, 3, 8), c))
    mask = np.ones((2, 3, 8), dtype=bool)
    mask[0, 1] = False
    out, c = L.softmax_forward(x, mask)
    check("softmax", out, L.softmax_backward(r(2, 3, 8), c))
    for act, (forward, backward) in L.ACTIVATIONS.items():
        out, c = forward(x)
        check(act, out, c, backward(r(2, 3, 8), c))
    out, c = L.dropout_forward(x, 0.3, rng.random(x.shape) >= 0.3)
    check("dropout", out, L.dropout_backward(r(2, 3, 8), c))
    out, c = L.layer_norm_forward(x, r(8), r(8), 1e-5)
    check("layer_norm", out, c, L.layer_norm_backward(r(2, 3, 8), c))
    keep = rng.random((2, 2, 3, 5)) >= 0.2
    out, c = scaled_dot_product_attention_forward(r(2, 2, 3, 4), r(2, 2, 5, 4), r(2, 2, 5, 4), keep, 0.2, keep)
    check("sdpa", out, c, scaled_dot_product_attention_backward(r(2, 2, 3, 4), c))
    params = {k: r(8, 8) if k.endswith("weight") else r(8) for k in MHA_KEYS}
    memory = r(2, 5, 8)
    out, c = multi_head_attention_forward(params, x, memory, memory, 2, keep[:, :1])
    check("multi_head_attention", out, c, multi_head_attention_backward(r(2, 3, 8), c))
    ffn = {"linear1.weight": r(12, 8), "linear1.bias": r(12), "linear2.weight": r(8, 12), "linear2.bias": r(8)}
    for act in L.ACTIVATIONS:
        out, c = L.feed_forward_forward(ffn, x, act)
        check(f"feed_forward-{act}", out, c, L.feed_forward_backward(r(2, 3, 8), c))
    loss, c = cross_entropy_forward(r(2, 3, 7), np.array([[1, 2, -100], [0, 6, 3]]), label_smoothing=0.1)
    check("cross_entropy", loss, cross_entropy_backward(c, 0.5))
    # after the paper
    out, c = L.rms_norm_forward(x, r(8), 1e-6)
    check("rms_norm", out, c, L.rms_norm_backward(r(2, 3, 8), c))
    gated = ffn | {"gate.weight": r(12, 8), "gate.bias": r(12)}
    out, c = L.gated_feed_forward_forward(gated, x, "silu")
    check("gated_feed_forward", out, c, L.gated_feed_forward_backward(r(2, 3, 8), c))
    cos, sin = rope_angles(np.arange(2, 5), 4, 10000.0, dtype)
    out, c = rope_forward(r(2, 2, 3, 4), cos, sin)
    check("rope", cos, sin, out, c, rope_backward(r(2, 2, 3, 4), c))
    out, c = repeat_kv_forward(r(2, 1, 3, 4), 2)
    check("repeat_kv", out, repeat_kv_backward(r(2, 2, 3, 4), c))
    gqa = {k: v[:4] if k.startswith(("k_proj", "v_proj")) else v for k, v in params.items()}  # 1 K/V head of 2
    out, c = multi_head_attention_forward(gqa, x, x, x, 2, n_kv_heads=1, rope=rope_angles(np.arange(3), 4, 1e4, dtype))
    check("multi_head_attention (GQA, rope)", out, c, multi_head_attention_backward(r(2, 3, 8), c))


# ----------------------------------------------------------------------------------------------
# Fully masked attention rows: zero probabilities, zero context, zero gradient to the scores, no NaN.


def test_fully_masked_row_in_scaled_dot_product_attention():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal(s) for s in [(2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 4)])
    q *= 10.0  # large scores in the other rows: their softmax must still be fine
    mask = rng.random((2, 2, 3, 5)) < 0.6
    mask[..., 0] = True
    mask[1, 0, 2] = False  # batch 1, head 0, query 2: nothing to attend to
    mask[0, :, 1] = False  # batch 0, query 1, every head
    dout = rng.standard_normal((2, 2, 3, 4))
    with np.errstate(all="raise", under="ignore"):
        out, cache = scaled_dot_product_attention_forward(q, k, v, mask)
        dq, dk, dv, dtable = scaled_dot_product_attention_backward(dout, cache)
        dscores = L.softmax_backward(rng.standard_normal((2, 2, 3, 5)), cache.softmax)
    assert dtable is None  # no T5 table was read
    probs = cache.probs
    for row in [(1, 0, 2), (0, 0, 1), (0, 1, 1)]:
        assert np.all(probs[row] == 0.0)
        assert np.all(out[row] == 0.0)
        assert np.all(dq[row] == 0.0)  # dq = s * dS K with dS = 0 on this row
        assert np.all(dscores[row] == 0.0)
    assert np.all(probs[~mask] == 0.0)
    live = mask.any(axis=-1)
    np.testing.assert_allclose(probs.sum(-1)[live], 1.0, rtol=1e-12)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(dq)) and np.all(np.isfinite(dk)) and np.all(np.isfinite(dv))
    # The dead rows pass nothing back: dK and dV equal those of the same dout with the dead rows zeroed.
    dead = ~live
    _, dk2, dv2, _ = scaled_dot_product_attention_backward(np.where(dead[..., None], 0.0, dout), cache)
    np.testing.assert_array_equal(dk, dk2)
    np.testing.assert_array_equal(dv, dv2)
    assert np.abs(dq[live]).max() > 0 and np.abs(dk).max() > 0


def test_fully_masked_row_in_multi_head_attention_is_the_output_bias():
    rng = np.random.default_rng(3)
    params = {k: rng.standard_normal((8, 8) if k.endswith("weight") else (8,)) for k in MHA_KEYS}
    x, memory = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 4, 8))
    mask = np.ones((2, 1, 1, 4), dtype=bool)
    mask[1] = False  # every key of batch 1 is padding
    with np.errstate(all="raise", under="ignore"):
        out, cache = multi_head_attention_forward(params, x, memory, memory, 2, mask)
        dquery, dkey, dvalue, grads = multi_head_attention_backward(rng.standard_normal(out.shape), cache)
    np.testing.assert_array_equal(out[1], np.broadcast_to(params["out_proj.bias"], (3, 8)))  # context is zero
    assert np.all(cache.attn.probs[1] == 0.0)
    assert np.all(dquery[1] == 0.0) and np.all(dkey[1] == 0.0) and np.all(dvalue[1] == 0.0)
    assert np.abs(dquery[0]).max() > 0 and np.abs(dkey[0]).max() > 0 and np.abs(dvalue[0]).max() > 0
    assert all(np.isfinite(g).all() for g in grads.values())


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train-dropout"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_all_pad_source_row_in_the_model(norm_first, train):
    cfg = tiny_config(norm_first=norm_first, dropout=0.2 if train else 0.0)
    rng = np.random.default_rng(4)
    model = Transformer(cfg, seed=2).train(train)
    randomize(model, rng)
    src = make_ids(rng, ["....", "____"], cfg.src_vocab_size)
    tgt = make_ids(rng, ["_..", "..."], cfg.tgt_vocab_size)  # and a target row starting with pad
    with np.errstate(all="raise", under="ignore"):
        logits = model.forward(src, tgt)
        masks = dict(model.dropout_masks)
        dlogits = rng.standard_normal(logits.shape)
        dlogits[0] = 0.0  # only the all-pad row sends gradient back
        model.zero_grad()
        model.backward(dlogits)
    maps = model.attention_maps()
    for i in range(cfg.n_encoder_layers):
        assert np.all(maps[f"encoder.layers.{i}.self_attn"][1] == 0.0)
    for i in range(cfg.n_decoder_layers):
        assert np.all(maps[f"decoder.layers.{i}.cross_attn"][1] == 0.0)
        # The decoder masks only the future: query 0 of row 0 attends to its one key, the pad it starts with.
        np.testing.assert_allclose(maps[f"decoder.layers.{i}.self_attn"][0, :, 0, 0], 1.0, rtol=1e-13)
    assert np.isfinite(logits).all()
    assert all(np.isfinite(g).all() for g in model.grads.values())
    # The all-pad row reads nothing from the encoder: no encoder gradient, and none to cross-attention's keys.
    for name, g in model.grads.items():
        if name.startswith("encoder.") or ".cross_attn.k_proj" in name or ".cross_attn.v_proj" in name:
            assert np.all(g == 0.0), name
    assert np.abs(model.grads["decoder.layers.0.cross_attn.q_proj.weight"]).max() == 0.0  # context is constant 0
    assert np.abs(model.grads["decoder.layers.0.cross_attn.out_proj.bias"]).max() > 0
    # ... and its logits do not depend on the encoder's parameters at all.
    for name, value in model.params.items():
        if name.startswith("encoder."):
            value += 0.5
    logits2 = model.forward(src, tgt, dropout_masks=masks)
    np.testing.assert_array_equal(logits2[1], logits[1])
    assert np.abs(logits2[0] - logits[0]).max() > 1e-3


def test_lm_row_starting_with_pad_attends_to_it():
    """The decoder masks nothing but the future: a pad at the start is a key like any other."""
    cfg = tiny_config()
    rng = np.random.default_rng(5)
    model = TransformerLM(cfg, seed=0).eval()
    ids = make_ids(rng, ["_...", "...."], cfg.tgt_vocab_size)
    with np.errstate(all="raise", under="ignore"):
        logits = model.forward(ids)
        model.backward(rng.standard_normal(logits.shape))
    maps = model.attention_maps()
    assert set(maps) == {f"decoder.layers.{i}.self_attn" for i in range(cfg.n_decoder_layers)}
    for m in maps.values():
        np.testing.assert_allclose(m[0, :, 0, 0], 1.0, rtol=1e-13)  # query 0's only key is the pad
        assert np.all(m[0, :, 1:, 0] > 0.0)  # and the later queries attend to it too
    assert np.isfinite(logits).all() and all(np.isfinite(g).all() for g in model.grads.values())


# ----------------------------------------------------------------------------------------------
# Masks.


def assert_causal(forward, ids: np.ndarray, vocab: int, rng) -> None:
    """forward(ids) -> logits (B, T, V). Changing the tokens after t leaves positions <= t alone."""
    base = forward(ids)
    T = ids.shape[1]
    for t in range(T - 1):
        changed = ids.copy()
        changed[:, t + 1 :] = rng.integers(3, vocab, size=(ids.shape[0], T - t - 1))
        changed[:, t + 1] = np.where(ids[:, t + 1] == 3, 4, 3)  # certainly different
        logits = forward(changed)
        np.testing.assert_allclose(logits[:, : t + 1], base[:, : t + 1], rtol=1e-12, atol=1e-13)
        assert np.abs(logits[:, t + 1] - base[:, t + 1]).max() > 1e-6  # the change is visible where allowed


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_decoder_is_causal(norm_first):
    cfg = tiny_config(norm_first=norm_first, positional="learned")
    rng = np.random.default_rng(6)
    model = Transformer(cfg, seed=3).eval()
    randomize(model, rng)
    src = make_ids(rng, ["....", "..__"], cfg.src_vocab_size)
    tgt = make_ids(rng, [".....", "....."], cfg.tgt_vocab_size)
    assert_causal(lambda t: model.forward(src, t), tgt, cfg.tgt_vocab_size, rng)


def test_lm_is_causal():
    cfg = tiny_config(activation="gelu", tie_embeddings=True)
    rng = np.random.default_rng(7)
    model = TransformerLM(cfg, seed=3).eval()
    randomize(model, rng)
    assert_causal(model.forward, make_ids(rng, ["......", "......"], cfg.tgt_vocab_size), cfg.tgt_vocab_size, rng)


def test_lm_causal_in_training_mode_with_replayed_masks():
    cfg = tiny_config(dropout=0.3)
    rng = np.random.default_rng(8)
    model = TransformerLM(cfg, seed=3)
    ids = make_ids(rng, ["......", "......"], cfg.tgt_vocab_size)
    model.forward(ids)
    masks = dict(model.dropout_masks)
    assert_causal(lambda x: model.forward(x, dropout_masks=masks), ids, cfg.tgt_vocab_size, rng)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_source_padding_is_invisible(positional):
    """What sits under padded source positions (the pad embedding) does not reach the logits, and a
    padded row gives the logits of the same row without its padding."""
    cfg = tiny_config(positional=positional, norm_first=positional == "learned")
    rng = np.random.default_rng(9)
    model = Transformer(cfg, seed=4).eval()
    randomize(model, rng)
    src = make_ids(rng, ["......", "...___"], cfg.src_vocab_size)
    tgt = make_ids(rng, ["....", "...."], cfg.tgt_vocab_size)
    base = model.forward(src, tgt)
    table = model.params["encoder.token_embedding.weight"]
    table[cfg.pad_id] += rng.standard_normal(cfg.d_model)  # a different embedding under every pad
    np.testing.assert_allclose(model.forward(src, tgt), base, rtol=1e-12, atol=1e-13)
    shift = rng.standard_normal(cfg.d_model)  # not a constant: pre-norm's layer norms would cancel that
    table[src[1, 0]] += shift  # control: an embedding that is read does change the logits
    assert np.abs(model.forward(src, tgt) - base).max() > 1e-3
    table[src[1, 0]] -= shift
    alone = model.forward(src[1:, :3], tgt[1:])
    np.testing.assert_allclose(alone[0], base[1], rtol=1e-10, atol=1e-12)


def test_pad_id_comes_from_the_config():
    """The same weights with pad_id 0 or 4, padding written with that id: the same logits."""
    cfg0, cfg4 = tiny_config(), tiny_config(pad_id=4)
    rng = np.random.default_rng(10)
    a = Transformer(cfg0, seed=5).eval()
    randomize(a, rng)
    b = Transformer(cfg4, seed=6).eval()
    b.load_state_dict(a.state_dict())
    src = make_ids(rng, ["....", "..__"], 11, pad_id=4)  # no 0 and no 4 outside the "_"s
    tgt = make_ids(rng, ["...", ".._"], 13, pad_id=4)
    src0, tgt0 = np.where(src == 4, 0, src), np.where(tgt == 4, 0, tgt)
    real = tgt != 4  # a pad *query* reads its own (different) embedding; every other position must agree
    np.testing.assert_allclose(b.forward(src, tgt)[real], a.forward(src0, tgt0)[real], rtol=1e-12, atol=1e-13)
    assert np.abs(b.forward(src0, tgt0) - a.forward(src0, tgt0))[real].max() > 1e-6  # 0 is a real token for b


def test_masked_keys_do_not_reach_multi_head_attention():
    rng = np.random.default_rng(11)
    params = {k: rng.standard_normal((8, 8) if k.endswith("weight") else (8,)) for k in MHA_KEYS}
    x, memory = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 5, 8))
    mask = np.ones((2, 1, 1, 5), dtype=bool)
    mask[0, ..., 3:] = False
    out, _ = multi_head_attention_forward(params, x, memory, memory, 2, mask)
    changed = memory.copy()
    changed[0, 3:] = rng.standard_normal((2, 8))
    np.testing.assert_allclose(multi_head_attention_forward(params, x, changed, changed, 2, mask)[0], out, rtol=1e-13)
    assert np.abs(multi_head_attention_forward(params, x, changed, changed, 2)[0] - out).max() > 1e-3


# ----------------------------------------------------------------------------------------------
# Gradients accumulate; tied embeddings add two paths.


@pytest.mark.parametrize("lm", [False, True], ids=["transformer", "lm"])
def test_gradients_accumulate_until_zero_grad(lm):
    cfg = tiny_config(tie_embeddings=True)
    rng = np.random.default_rng(12)
    model = (TransformerLM if lm else Transformer)(cfg, seed=0).eval()
    tgt = make_ids(rng, ["....", "..._"], cfg.tgt_vocab_size)
    inputs = (tgt,) if lm else (make_ids(rng, [".....", "...__"], cfg.src_vocab_size), tgt)
    logits = model.forward(*inputs)
    d1, d2 = rng.standard_normal(logits.shape), rng.standard_normal(logits.shape)
    assert all(np.all(g == 0.0) for g in model.grads.values())  # a fresh model starts at zero
    single = []
    for d in (d1, d2):
        model.zero_grad()
        model.backward(d)
        single.append({k: g.copy() for k, g in model.grads.items()})
    model.zero_grad()
    model.backward(d1)
    model.backward(d2)
    for k, g in model.grads.items():
        np.testing.assert_allclose(g, single[0][k] + single[1][k], rtol=1e-12, atol=1e-15, err_msg=k)
    assert max(np.abs(g).max() for g in model.grads.values()) > 0
    model.zero_grad()
    assert all(np.all(g == 0.0) for g in model.grads.values())
    model.backward(d1)
    for k, g in model.grads.items():
        np.testing.assert_array_equal(g, single[0][k], err_msg=k)


def test_tied_embeddings_add_both_paths():
    """A tied model equals an untied one whose output weight is a copy of the decoder's table; the
    tied table's gradient is the sum of the untied table's and the untied output weight's."""
    rng = np.random.default_rng(13)
    tied = Transformer(tiny_config(tie_embeddings=True), seed=0).eval()
    untied = Transformer(tiny_config(), seed=1).eval()
    state = tied.state_dict()
    untied.load_state_dict(state | {"output_proj.weight": state["decoder.token_embedding.weight"]})
    src = make_ids(rng, ["....", "..._"], 11)
    tgt = make_ids(rng, ["...", "..."], 13)
    logits = tied.forward(src, tgt)
    np.testing.assert_array_equal(untied.forward(src, tgt), logits)
    d = rng.standard_normal(logits.shape)
    tied.backward(d)
    untied.backward(d)
    table = "decoder.token_embedding.weight"
    np.testing.assert_allclose(
        tied.grads[table], untied.grads[table] + untied.grads["output_proj.weight"], rtol=1e-12, atol=1e-14
    )
    for k, g in tied.grads.items():
        if k != table:
            np.testing.assert_array_equal(g, untied.grads[k], err_msg=k)


# ----------------------------------------------------------------------------------------------
# State dicts.


def expected_state_shapes(cfg: TransformerConfig, lm: bool) -> dict:
    """The list of docs/conventions.md, written out again here independently of numpy_transformer.parameter_shapes,
    in the order of the state dict. With the options after the paper: no norm biases with RMSNorm, no linear
    biases without `bias`, ffn.gate.* before linear1 when gated, k_proj/v_proj of width n_kv_heads * Dh,
    no position table with rotary positions, no output_proj.bias without `output_bias`."""
    D = cfg.d_model
    keys = {}
    stacks = [("decoder", cfg.tgt_vocab_size, cfg.n_decoder_layers)]
    if not lm:
        stacks.insert(0, ("encoder", cfg.src_vocab_size, cfg.n_encoder_layers))
    for stack, vocab, n_layers in stacks:
        keys[f"{stack}.token_embedding.weight"] = (vocab, D)
        if cfg.positional == "learned":
            keys[f"{stack}.position_embedding.weight"] = (cfg.max_len, D)
        for i in range(n_layers):
            keys |= expected_layer_shapes(cfg, f"{stack}.layers.{i}", cross=stack == "decoder" and not lm)
        if cfg.norm_first:
            keys |= expected_norm_shapes(cfg, f"{stack}.final_norm")
    if not cfg.tie_embeddings:
        keys["output_proj.weight"] = (cfg.tgt_vocab_size, D)
    if cfg.output_bias:
        keys["output_proj.bias"] = (cfg.tgt_vocab_size,)
    return keys


def expected_layer_shapes(cfg: TransformerConfig, prefix: str, cross: bool) -> dict:
    """One layer's: self-attention (and cross-attention) projections each followed by its norm, then the
    feed-forward (gate, linear1, linear2) and its norm."""
    D, F = cfg.d_model, cfg.d_ff
    kv = (cfg.n_heads if cfg.n_kv_heads is None else cfg.n_kv_heads) * (D // cfg.n_heads)
    keys = {}
    for block in ["self_attn"] + (["cross_attn"] if cross else []):
        for proj, out_features in (("q_proj", D), ("k_proj", kv), ("v_proj", kv), ("out_proj", D)):
            keys |= expected_linear_shapes(cfg, f"{prefix}.{block}.{proj}", out_features, D)
        keys |= expected_norm_shapes(cfg, f"{prefix}.{block}_norm")
    if cfg.gated_ffn:
        keys |= expected_linear_shapes(cfg, f"{prefix}.ffn.gate", F, D)
    keys |= expected_linear_shapes(cfg, f"{prefix}.ffn.linear1", F, D)
    keys |= expected_linear_shapes(cfg, f"{prefix}.ffn.linear2", D, F)
    return keys | expected_norm_shapes(cfg, f"{prefix}.ffn_norm")


def expected_linear_shapes(cfg: TransformerConfig, name: str, out_features: int, in_features: int) -> dict:
    """weight (out, in), and bias (out,) with `bias`."""
    keys = {f"{name}.weight": (out_features, in_features)}
    if cfg.bias:
        keys[f"{name}.bias"] = (out_features,)
    return keys


def expected_norm_shapes(cfg: TransformerConfig, name: str) -> dict:
    """weight (D,), and bias (D,) for a LayerNorm."""
    keys = {f"{name}.weight": (cfg.d_model,)}
    if cfg.norm == "layer":
        keys[f"{name}.bias"] = (cfg.d_model,)
    return keys


STATE_GRID = [
    pytest.param(
        lm,
        positional,
        norm_first,
        tie,
        id=f"{'lm' if lm else 'seq2seq'}-{positional}-{'pre' if norm_first else 'post'}-{'tied' if tie else 'untied'}",
    )
    for lm, positional, norm_first, tie in itertools.product(
        [False, True], ["sinusoidal", "learned"], [False, True], [False, True]
    )
]


@pytest.mark.parametrize(("lm", "positional", "norm_first", "tie"), STATE_GRID)
def test_state_dict_keys_and_shapes(lm, positional, norm_first, tie):
    cfg = tiny_config(
        positional=positional,
        norm_first=norm_first,
        tie_embeddings=tie,
        n_encoder_layers=2,
        n_decoder_layers=3,
        d_ff=12,
    )
    model = (TransformerLM if lm else Transformer)(cfg, seed=0)
    state = model.state_dict()
    assert {k: v.shape for k, v in state.items()} == expected_state_shapes(cfg, lm)
    assert list(state) == list(expected_state_shapes(cfg, lm))  # the same order too
    assert all(v.dtype == np.float64 for v in state.values())
    assert (not lm) == any(k.startswith("encoder.") for k in state)
    assert (not lm) == any(".cross_attn." in k for k in state)
    assert ("output_proj.weight" in state) == (not tie)
    assert ("decoder.final_norm.weight" in state) == norm_first


# id: config overrides after the paper (d_model 8, 2 heads: Dh 4; 4 heads: Dh 2)
MODERN_STATE_CASES = {
    "llama-rms-rope-silu-gated-GQA-no-bias-no-output-bias": dict(
        norm_first=True,
        norm="rms",
        positional="rope",
        activation="silu",
        gated_ffn=True,
        n_heads=4,
        n_kv_heads=2,
        bias=False,
        output_bias=False,
    ),
    "rms-post-norm-MQA-learned-tied": dict(norm="rms", n_kv_heads=1, positional="learned", tie_embeddings=True),
    "gated-with-bias-GQA-rope-layer-norm": dict(gated_ffn=True, n_heads=4, n_kv_heads=1, positional="rope"),
    "no-bias-output-bias-pre-norm": dict(bias=False, norm_first=True),
    "bias-no-output-bias-tied": dict(output_bias=False, tie_embeddings=True),
}


@pytest.mark.parametrize("lm", [False, True], ids=["seq2seq", "lm"])
@pytest.mark.parametrize("case", list(MODERN_STATE_CASES))
def test_state_dict_keys_and_shapes_after_the_paper(case, lm):
    """parameter_shapes, the model's state_dict() and the independent list: the same keys, order and shapes."""
    cfg = tiny_config(**MODERN_STATE_CASES[case], n_encoder_layers=1, n_decoder_layers=2)
    state = (TransformerLM if lm else Transformer)(cfg, seed=0).state_dict()
    expected = expected_state_shapes(cfg, lm)
    assert list(state) == list(expected) == list(parameter_shapes(cfg, decoder_only=lm))
    assert {k: v.shape for k, v in state.items()} == expected == parameter_shapes(cfg, decoder_only=lm)
    assert ("output_proj.bias" in state) == cfg.output_bias
    assert any(k.endswith("norm.bias") for k in state) == (cfg.norm == "layer")
    assert any(k.endswith("proj.bias") or k.endswith("linear1.bias") for k in state if "layers" in k) == cfg.bias
    assert any(".ffn.gate." in k for k in state) == cfg.gated_ffn
    assert any("position_embedding" in k for k in state) == (cfg.positional == "learned")


def test_state_dict_without_encoder_layers():
    cfg = tiny_config(n_encoder_layers=0, n_decoder_layers=1)
    state = Transformer(cfg).state_dict()
    assert {k: v.shape for k, v in state.items()} == expected_state_shapes(cfg, lm=False)
    assert [k for k in state if k.startswith("encoder.")] == ["encoder.token_embedding.weight"]


def test_state_dict_is_a_copy():
    model = Transformer(tiny_config(), seed=0)
    state = model.state_dict()
    state["output_proj.bias"] += 1.0
    assert np.all(model.params["output_proj.bias"] == 0.0)


@pytest.mark.parametrize("lm", [False, True], ids=["transformer", "lm"])
def test_load_state_dict_round_trip_in_place(lm):
    cls = TransformerLM if lm else Transformer
    cfg = tiny_config(tie_embeddings=True, positional="learned", norm_first=True)
    rng = np.random.default_rng(14)
    source = cls(cfg, seed=0).eval()
    randomize(source, rng)
    target = cls(cfg, seed=1).eval()
    arrays = dict(target.params)  # the objects, not copies
    assert any(not np.array_equal(target.params[k], v) for k, v in source.params.items())
    target.load_state_dict(source.state_dict())
    for k, v in source.params.items():
        assert target.params[k] is arrays[k], f"{k} was replaced, not loaded in place"
        np.testing.assert_array_equal(target.params[k], v, err_msg=k)
    tgt = make_ids(rng, ["....", "..._"], cfg.tgt_vocab_size)
    inputs = (tgt,) if lm else (make_ids(rng, ["...", ".._"], cfg.src_vocab_size), tgt)
    np.testing.assert_array_equal(target.forward(*inputs), source.forward(*inputs))
    again = cls(cfg, seed=2)
    again.load_state_dict(target.state_dict())
    assert all(np.array_equal(again.params[k], v) for k, v in source.params.items())


def test_load_float64_state_into_float32_model():
    cfg = tiny_config()
    source = Transformer(cfg, seed=0)
    target = Transformer(cfg, seed=1, dtype=np.float32)
    target.load_state_dict(source.state_dict())
    for k, v in source.params.items():
        assert target.params[k].dtype == np.float32
        np.testing.assert_array_equal(target.params[k], v.astype(np.float32), err_msg=k)


# ----------------------------------------------------------------------------------------------
# Initialisation.


@pytest.mark.parametrize("lm", [False, True], ids=["transformer", "lm"])
def test_init_is_deterministic_in_the_seed(lm):
    cls = TransformerLM if lm else Transformer
    cfg = tiny_config(positional="learned")
    a, b, c = cls(cfg, seed=7), cls(cfg, seed=7), cls(cfg, seed=8)
    for k, v in a.params.items():
        np.testing.assert_array_equal(v, b.params[k], err_msg=k)
        random = not (k.endswith(".bias") or k.endswith("norm.weight"))
        assert random == (not np.array_equal(v, c.params[k])), k
    f32 = cls(cfg, seed=7, dtype=np.float32)
    for k, v in a.params.items():
        np.testing.assert_array_equal(f32.params[k], v.astype(np.float32), err_msg=k)


def test_init_statistics():
    D, F, V = 64, 256, 400
    cfg = TransformerConfig(
        src_vocab_size=V,
        tgt_vocab_size=V + 7,
        d_model=D,
        n_heads=4,
        d_ff=F,
        n_encoder_layers=1,
        n_decoder_layers=1,
        max_len=300,
        positional="learned",
    )
    model = Transformer(cfg, seed=0)
    seen = set()
    for k, v in model.params.items():
        if k.endswith(".bias"):
            assert np.all(v == 0.0), k
        elif k.endswith("norm.weight"):
            assert np.all(v == 1.0), k
        elif k.endswith("token_embedding.weight"):
            assert abs(v.std() - D**-0.5) < 0.03 * D**-0.5, k
            assert abs(v.mean()) < 0.05 * D**-0.5, k
        elif k.endswith("position_embedding.weight"):
            assert abs(v.std() - 0.02) < 0.03 * 0.02, k
        else:  # Xavier-uniform: U(-a, a), a = sqrt(6 / (fan_in + fan_out)), std a / sqrt(3)
            fan_out, fan_in = v.shape
            a = math.sqrt(6.0 / (fan_in + fan_out))
            assert np.abs(v).max() <= a, k
            assert np.abs(v).max() > 0.98 * a, k
            assert abs(v.std() - a / math.sqrt(3)) < 0.05 * a / math.sqrt(3), k
        seen.add(k.rsplit(".", 1)[-1])
    assert seen == {"weight", "bias"}


# ----------------------------------------------------------------------------------------------
# train() / eval() and dropout replay.


@pytest.mark.parametrize("lm", [False, True], ids=["transformer", "lm"])
def test_train_eval_and_dropout_replay(lm):
    cls = TransformerLM if lm else Transformer
    cfg = tiny_config(dropout=0.3)
    rng = np.random.default_rng(15)
    model = cls(cfg, seed=0)
    assert model.training  # a fresh model is in training mode
    tgt = make_ids(rng, ["......", "....__"], cfg.tgt_vocab_size)
    inputs = (tgt,) if lm else (make_ids(rng, [".....", "..___"], cfg.src_vocab_size), tgt)

    assert model.eval() is model and not model.training
    e1, e2 = model.forward(*inputs), model.forward(*inputs)
    np.testing.assert_array_equal(e1, e2)
    assert model.dropout_masks == {}
    no_dropout = cls(tiny_config(), seed=0).eval()
    no_dropout.load_state_dict(model.state_dict())
    np.testing.assert_array_equal(no_dropout.forward(*inputs), e1)  # eval mode = no dropout at all

    assert model.train() is model and model.training
    t1 = model.forward(*inputs)
    masks1 = {k: v.copy() for k, v in model.dropout_masks.items()}
    t2 = model.forward(*inputs)
    masks2 = dict(model.dropout_masks)
    assert set(masks1) == set(masks2)
    assert any(not np.array_equal(masks1[k], masks2[k]) for k in masks1)
    assert np.abs(t1 - t2).max() > 1e-6 and np.abs(t1 - e1).max() > 1e-6
    everything = np.concatenate([m.ravel() for m in masks1.values()])
    assert everything.dtype == np.bool_ and 0.55 < everything.mean() < 0.85  # keep probability 0.7

    stacks = ["decoder"] if lm else ["encoder", "decoder"]
    expected_sites = set()
    for stack in stacks:
        expected_sites.add(f"{stack}.embedding_dropout")
        n = cfg.n_decoder_layers if stack == "decoder" else cfg.n_encoder_layers
        for i in range(n):
            blocks = ["self_attn"] + (["cross_attn"] if stack == "decoder" and not lm else [])
            for block in blocks:
                expected_sites |= {f"{stack}.layers.{i}.{block}.dropout", f"{stack}.layers.{i}.{block}_dropout"}
            expected_sites |= {f"{stack}.layers.{i}.ffn.dropout", f"{stack}.layers.{i}.ffn_dropout"}
    assert set(masks1) == expected_sites

    np.testing.assert_array_equal(model.forward(*inputs, dropout_masks=masks1), t1)  # replay is exact
    np.testing.assert_array_equal(model.forward(*inputs, dropout_masks=masks2), t2)
    assert model.train(False) is model and not model.training
    np.testing.assert_array_equal(model.forward(*inputs, dropout_masks=masks1), e1)  # eval ignores masks


# ----------------------------------------------------------------------------------------------
# Attention maps.


@pytest.mark.parametrize("lm", [False, True], ids=["transformer", "lm"])
def test_attention_maps(lm):
    cfg = tiny_config(n_heads=4)
    rng = np.random.default_rng(16)
    model = (TransformerLM if lm else Transformer)(cfg, seed=0).eval()
    with pytest.raises(ValueError, match="no forward pass"):
        model.attention_maps()
    tgt = make_ids(rng, ["_....", "....."], cfg.tgt_vocab_size)  # batch 0 starts with pad: a key like any other
    src = make_ids(rng, ["...", ".._"], cfg.src_vocab_size)
    model.forward(tgt) if lm else model.forward(src, tgt)
    maps = model.attention_maps()
    B, H, T_tgt, T_src = 2, 4, 5, 3
    expected = {f"decoder.layers.{i}.self_attn": (B, H, T_tgt, T_tgt) for i in range(cfg.n_decoder_layers)}
    if not lm:
        expected |= {f"decoder.layers.{i}.cross_attn": (B, H, T_tgt, T_src) for i in range(cfg.n_decoder_layers)}
        expected |= {f"encoder.layers.{i}.self_attn": (B, H, T_src, T_src) for i in range(cfg.n_encoder_layers)}
    assert {k: v.shape for k, v in maps.items()} == expected
    for name, probs in maps.items():
        sums = probs.sum(-1)
        assert np.all(probs >= 0.0)
        if name.endswith("self_attn") and name.startswith("decoder"):
            assert np.all(np.triu(np.ones((T_tgt, T_tgt), dtype=bool), 1) <= (probs == 0.0))  # causal
            np.testing.assert_allclose(sums, 1.0, rtol=1e-12)  # nothing but the future is masked
            assert np.all(probs[0, :, :, 0] > 0.0)  # the pad at the start is attended to
        else:
            np.testing.assert_allclose(sums, 1.0, rtol=1e-12)
            assert np.all(probs[1, :, :, 2] == 0.0)  # the padded source key


# ----------------------------------------------------------------------------------------------
# Cross-entropy against a direct formula; embedding backward against np.add.at.


def direct_cross_entropy(logits, targets, ignore_index, eps):
    """Row by row: q = (1 - eps) onehot(y) + eps / V, loss = mean over kept rows of -sum q log softmax."""
    V = logits.shape[-1]
    rows, ys = logits.reshape(-1, V), targets.reshape(-1)
    losses, grads = [], np.zeros_like(rows)
    kept = [i for i in range(len(ys)) if ys[i] != ignore_index]
    for i in kept:
        z = rows[i]
        logp = z - (z.max() + math.log(sum(math.exp(v - z.max()) for v in z)))
        q = np.full(V, eps / V)
        q[ys[i]] += 1.0 - eps
        losses.append(-(q * logp).sum())
        grads[i] = (np.exp(logp) - q) / len(kept)
    return sum(losses) / len(kept), grads.reshape(logits.shape)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize(
    ("shape", "ignore_index"), [((7,), -100), ((2, 5), -100), ((3, 4), 0)], ids=["2d", "3d", "3d-ignore0"]
)
def test_cross_entropy_matches_direct_formula(shape, ignore_index, label_smoothing):
    rng = np.random.default_rng(17)
    V = 6
    logits = 3.0 * rng.standard_normal((*shape, V))
    targets = rng.integers(0 if ignore_index == -100 else 1, V, size=shape)
    flat = targets.reshape(-1)
    flat[[0, 3]] = ignore_index
    loss, cache = cross_entropy_forward(logits, targets, ignore_index=ignore_index, label_smoothing=label_smoothing)
    want_loss, want_grad = direct_cross_entropy(logits, targets, ignore_index, label_smoothing)
    assert isinstance(float(loss), float)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-13)
    dlogits = cross_entropy_backward(cache)
    assert dlogits.shape == logits.shape
    np.testing.assert_allclose(dlogits, want_grad, rtol=1e-12, atol=1e-15)
    ignored = targets == ignore_index
    assert np.all(dlogits[ignored] == 0.0)
    assert np.all(np.abs(dlogits[~ignored]).max(-1) > 0)
    np.testing.assert_allclose(cross_entropy_backward(cache, 2.5), 2.5 * dlogits, rtol=1e-14)
    np.testing.assert_allclose(dlogits.sum(-1), 0.0, atol=1e-15)  # p and q both sum to one


def test_cross_entropy_is_stable_for_huge_logits():
    logits = np.array([[1000.0, 0.0, -1000.0], [0.0, 0.0, 0.0]])
    loss, cache = cross_entropy_forward(logits, np.array([0, 2]), label_smoothing=0.1)
    assert np.isfinite(loss) and np.isfinite(cross_entropy_backward(cache)).all()
    want, _ = direct_cross_entropy(logits, np.array([0, 2]), -100, 0.1)
    np.testing.assert_allclose(loss, want, rtol=1e-13)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    B=st.integers(1, 3),
    T=st.integers(1, 6),
    V=st.integers(1, 5),
    scale=st.sampled_from([1.0, 0.5, math.sqrt(8)]),
    seed=st.integers(0, 2**16),
)
def test_embedding_backward_equals_add_at(B, T, V, scale, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, V, size=(B, T))  # small V: many repeats
    weight = rng.standard_normal((V, 4))
    out, cache = L.embedding_forward(ids, weight, scale)
    np.testing.assert_array_equal(out, scale * weight[ids])
    dout = rng.standard_normal((B, T, 4))
    want = np.zeros_like(weight)
    np.add.at(want, ids.reshape(-1), dout.reshape(-1, 4))
    np.testing.assert_allclose(L.embedding_backward(dout, cache), scale * want, rtol=1e-13, atol=1e-14)


# ----------------------------------------------------------------------------------------------
# Embeddings and positions as the paper defines them.


def test_sinusoidal_table_follows_the_paper():
    table = L.sinusoidal_table(10, 6)
    for pos in range(10):
        for i in range(3):
            angle = pos / 10000 ** (2 * i / 6)
            assert table[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-15)
            assert table[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-15)
    odd = L.sinusoidal_table(4, 5)  # odd D: columns 0, 2, 4 are sines, 1, 3 cosines, frequencies from D = 5
    assert odd.shape == (4, 5)
    for pos in range(4):
        for col in range(5):
            angle = pos / 10000 ** (2 * (col // 2) / 5)
            want = math.sin(angle) if col % 2 == 0 else math.cos(angle)
            assert odd[pos, col] == pytest.approx(want, abs=1e-15)


@pytest.mark.parametrize("scale_embeddings", [True, False])
@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_embedding_layer_is_scaled_tokens_plus_positions(positional, scale_embeddings):
    cfg = tiny_config(positional=positional, scale_embeddings=scale_embeddings)
    rng = np.random.default_rng(18)
    model = Transformer(cfg, seed=0).eval()
    src = make_ids(rng, ["....", "...."], cfg.src_vocab_size)
    model.forward(src, make_ids(rng, ["..", ".."], cfg.tgt_vocab_size))
    scale = math.sqrt(cfg.d_model) if scale_embeddings else 1.0
    table = model.params["encoder.position_embedding.weight"] if positional == "learned" else L.sinusoidal_table(8, 8)
    want = scale * model.params["encoder.token_embedding.weight"][src] + table[:4]
    np.testing.assert_allclose(model.activations()["encoder.embedding"], want, rtol=1e-15, atol=1e-15)


# ----------------------------------------------------------------------------------------------
# numpy_transformer needs no torch.


def test_imports_and_runs_without_torch():
    code = textwrap.dedent(
        """
        import importlib.abc
        import sys

        attempts = []

        class BlockTorch(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    attempts.append(name)
                    raise ImportError(f"torch is blocked in this test: {name}")
                return None

        for name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
            del sys.modules[name]
        sys.meta_path.insert(0, BlockTorch())
        try:
            import torch  # noqa: F401
        except ImportError:
            pass
        else:
            raise SystemExit("the blocker let torch through")
        attempts.clear()

        import numpy as np
        import numpy_transformer as nt

        cfg = nt.TransformerConfig(src_vocab_size=7, tgt_vocab_size=9, d_model=8, n_heads=2, d_ff=12,
                                   n_encoder_layers=1, n_decoder_layers=1, max_len=8, dropout=0.1)
        rng = np.random.default_rng(0)
        for model, inputs in [
            (nt.Transformer(cfg, seed=0), (rng.integers(3, 7, (2, 4)), rng.integers(3, 9, (2, 3)))),
            (nt.TransformerLM(cfg, seed=0), (rng.integers(3, 9, (2, 3)),)),
        ]:
            logits = model.forward(*inputs)
            loss, cache = nt.cross_entropy_forward(logits, inputs[-1], ignore_index=cfg.pad_id)
            model.backward(nt.cross_entropy_backward(cache))
            assert np.isfinite(float(loss))
            assert all(np.isfinite(g).all() for g in model.grads.values())
        assert "torch" not in sys.modules, "torch got imported"
        assert not attempts, f"numpy_transformer tried to import {attempts}"
        print("ran without torch")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ran without torch" in result.stdout


# ----------------------------------------------------------------------------------------------
# The stacks' bookkeeping returns new dicts: nothing the caller passed in is changed.


def test_table_share_and_final_norm_leave_their_arguments_alone():
    from numpy_transformer import model as M

    rng = np.random.default_rng(5)
    share, earlier = rng.standard_normal((4, 2)), rng.standard_normal((4, 2))
    stack = {"relative_bias.weight": earlier.copy(), "layers.1.ffn.linear1.weight": rng.standard_normal((3, 3))}
    layer = {"self_attn.relative_bias.weight": share, "ffn.linear1.weight": rng.standard_normal((3, 3))}
    stack_before, layer_before = dict(stack), dict(layer)
    merged = M.add_table_share(stack, layer, "layers.0")
    assert stack == stack_before and layer == layer_before  # the same keys holding the same arrays
    np.testing.assert_array_equal(stack["relative_bias.weight"], earlier)  # not added to in place
    np.testing.assert_array_equal(merged["relative_bias.weight"], earlier + share)  # the shares add
    assert "layers.0.self_attn.relative_bias.weight" not in merged  # the share moved to the stack's name
    assert merged["layers.0.ffn.linear1.weight"] is layer["ffn.linear1.weight"]
    # a stack without T5's table: the layer's grads under its prefix, nothing else
    plain = M.add_table_share({}, {"ffn.linear1.weight": layer["ffn.linear1.weight"]}, "layers.2")
    assert list(plain) == ["layers.2.ffn.linear1.weight"]

    cfg = TransformerConfig(d_model=8, n_heads=2, d_ff=12, norm_first=True)
    params = {"final_norm.weight": 1 + rng.standard_normal(8), "final_norm.bias": rng.standard_normal(8)}
    x, dout = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 3, 8))
    _, cache = M.final_norm_forward(params, x, cfg)
    dx, grads = M.final_norm_backward(dout, cache)
    assert sorted(grads) == ["final_norm.bias", "final_norm.weight"]
    assert np.abs(dx).max() > 0 and all(np.abs(g).max() > 0 for g in grads.values())
    post = dataclasses.replace(cfg, norm_first=False)
    same, none = M.final_norm_backward(dout, M.final_norm_forward(params, x, post)[1])
    assert same is dout and none == {}


def test_cross_flag_puts_the_keys_at_their_own_positions():
    """cross=True: the keys sit at 0 .. T_k - 1 whatever the queries' positions; self-attention's keys sit at the
    queries' positions. ALiBi reads the distance i - j, so it tells the two apart."""
    from numpy_transformer.attention import causal_mask
    from numpy_transformer.scores import ScoreMod

    rng = np.random.default_rng(6)
    params = {k: rng.standard_normal((8, 8) if k.endswith("weight") else (8,)) for k in MHA_KEYS}
    x, memory = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 5, 8))
    mod, later = ScoreMod(alibi_slopes=(0.5, 0.25)), np.arange(4, 7)
    out, cache = multi_head_attention_forward(params, x, memory, memory, 2, mod=mod, cross=True, q_pos=later)
    np.testing.assert_array_equal(cache.attn.k_pos, np.arange(5))
    at_start, _ = multi_head_attention_forward(params, x, memory, memory, 2, mod=mod, cross=True)
    assert np.abs(out - at_start).max() > 1e-3  # the queries moved away from the keys: the bias changed
    shifted, cache = multi_head_attention_forward(params, x, x, x, 2, mod=mod, q_pos=later)
    np.testing.assert_array_equal(cache.attn.k_pos, later)  # self-attention: the keys moved with the queries
    unshifted, _ = multi_head_attention_forward(params, x, x, x, 2, mod=mod)
    np.testing.assert_allclose(shifted, unshifted, rtol=0, atol=1e-12)  # the same distances, the same output
    # torch's is_causal with T_q != T_k and no cross flag: keys at 0 .. T_k - 1, top-left aligned
    causal, cache = multi_head_attention_forward(params, x, memory, memory, 2, is_causal=True)
    hidden = ~causal_mask(3, 5)[0, 0]  # (T_q, T_k): query i sees keys j <= i
    assert np.all(cache.attn.probs[:, :, hidden] == 0) and np.all(cache.attn.probs[:, :, ~hidden] > 0)
    assert np.abs(causal).max() > 0


# ----------------------------------------------------------------------------------------------
# Inference: forward(..., keep_cache=False) keeps nothing for backward, and frees each layer as it goes.


def inference_case(kind: str, rng, **overrides):
    """A small model of each kind with padding in its inputs, and its inputs."""
    if kind == "encoder":
        cfg = tiny_config(type_vocab_size=2, positional="learned", activation="gelu", **overrides)
        return EncoderModel(cfg, seed=3), (make_ids(rng, ["....__", "......"], cfg.src_vocab_size),)
    tgt = make_ids(rng, ["....", "...."], 13)
    if kind == "lm":
        return TransformerLM(tiny_config(**overrides), seed=3), (tgt,)
    return Transformer(tiny_config(**overrides), seed=3), (make_ids(rng, ["...__", "....."], 11), tgt)


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train-dropout"])
@pytest.mark.parametrize("kind", ["transformer", "lm", "encoder"])
def test_inference_forward_gives_the_same_outputs_and_keeps_nothing(kind, training):
    rng = np.random.default_rng(4)
    model, inputs = inference_case(kind, rng, dropout=0.2)
    model.train(training)
    kept = model.forward(*inputs)
    masks = model.dropout_masks  # replayed below; empty in evaluation mode
    assert bool(masks) == training
    unkept = model.forward(*inputs, dropout_masks=masks or None, keep_cache=False)
    np.testing.assert_array_equal(unkept, kept)  # the same arithmetic, bit for bit
    dout = rng.standard_normal(kept.shape)
    for method, args in (("backward", (dout,)), ("attention_maps", ()), ("activations", ())):
        with pytest.raises(ValueError, match=rf"{method} called after a forward with keep_cache=False"):
            getattr(model, method)(*args)
    model.forward(*inputs, dropout_masks=masks or None)  # a kept pass can be differentiated again
    model.zero_grad()
    model.backward(dout)
    assert all(np.isfinite(g).all() for g in model.grads.values())
    assert any(np.abs(g).max() > 0 for g in model.grads.values())


@pytest.mark.parametrize("value", ["no", 0, None], ids=["str", "int", "None"])
def test_keep_cache_must_be_a_bool(value):
    model, inputs = inference_case("lm", np.random.default_rng(0))
    with pytest.raises(TypeError, match=rf"keep_cache must be a bool, got {type(value).__name__}"):
        model.forward(*inputs, keep_cache=value)


def test_inference_holds_about_one_layer_of_activations():
    """A kept pass holds every layer's activations until the next pass; an unkept one frees each layer's before the
    next layer allocates its own, so its peak is a small part of a six-layer pass's (tracemalloc sees NumPy's
    allocations)."""
    import tracemalloc

    rng = np.random.default_rng(0)
    cfg = tiny_config(d_model=32, n_heads=4, d_ff=128, n_encoder_layers=6, max_len=64, src_vocab_size=50)
    model = EncoderModel(cfg, seed=0).eval()
    ids = rng.integers(3, 50, size=(16, 64))
    peaks = {}
    for keep in (True, False, True):
        model.forward(ids[:1])  # drop the last pass's cache before measuring
        tracemalloc.start()
        try:
            model.forward(ids, keep_cache=keep)
            peaks[keep] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peaks[False] < peaks[True] / 3, peaks
