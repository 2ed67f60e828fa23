"""Bad input to numpy_transformer raises ValueError or TypeError, and the message names the argument,
says what it got and what was expected: a mistake is reported where it is made, never as a NumPy
broadcasting error or a NaN further down. One test per case; each `match` looks for the argument's
name and for the offending value or shape.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from numpy_transformer import (
    EncoderModel,
    Transformer,
    TransformerConfig,
    TransformerLM,
    cross_entropy_forward,
    multi_head_attention_backward,
    multi_head_attention_forward,
)
from numpy_transformer import layers as L
from numpy_transformer import model as M
from numpy_transformer.attention import MHA_KEYS, rope_angles

V_SRC, V_TGT, MAX_LEN = 11, 13, 6


def tiny_config(**overrides) -> TransformerConfig:
    values = dict(
        src_vocab_size=V_SRC,
        tgt_vocab_size=V_TGT,
        d_model=8,
        n_heads=2,
        d_ff=12,
        n_encoder_layers=1,
        n_decoder_layers=1,
        max_len=MAX_LEN,
    )
    return TransformerConfig(**(values | overrides))


def esc(value) -> str:
    """A literal piece of a message for pytest.raises(match=...)."""
    return re.escape(str(value))


def ids(rng, B: int, T: int, vocab: int) -> np.ndarray:
    return rng.integers(3, vocab, size=(B, T))


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def model():
    return Transformer(tiny_config(), seed=0)


@pytest.fixture
def lm():
    return TransformerLM(tiny_config(), seed=0)


@pytest.fixture
def src(rng):
    return ids(rng, 2, 4, V_SRC)


@pytest.fixture
def tgt(rng):
    return ids(rng, 2, 3, V_TGT)


# ----------------------------------------------------------------------------------------------
# Token ids.


def test_src_ids_out_of_range(model, src, tgt):
    src[1, 2] = V_SRC
    with pytest.raises(ValueError, match=r"src_ids.*\[0, 11\).*11\]"):
        model.forward(src, tgt)


def test_tgt_ids_out_of_range(model, src, tgt):
    tgt[0, 0] = 40
    with pytest.raises(ValueError, match=r"tgt_ids.*\[0, 13\).*40\]"):
        model.forward(src, tgt)


def test_negative_ids(model, src, tgt):
    src[0, 1] = -1
    with pytest.raises(ValueError, match=r"src_ids.*\[0, 11\).*\[-1, "):
        model.forward(src, tgt)


def test_float_ids(model, src, tgt):
    with pytest.raises(TypeError, match=r"src_ids.*integer.*float64"):
        model.forward(src.astype(np.float64), tgt)


def test_bool_ids(model, src, tgt):
    with pytest.raises(TypeError, match=r"tgt_ids.*integer.*bool"):
        model.forward(src, tgt > 5)


def test_one_dimensional_ids(model, src, tgt):
    with pytest.raises(ValueError, match=r"src_ids.*\(B, T\).*" + esc((4,))):
        model.forward(src[0], tgt)


def test_three_dimensional_ids(model, src, tgt):
    with pytest.raises(ValueError, match=r"tgt_ids.*\(B, T\).*" + esc((1, 2, 3))):
        model.forward(src, tgt[None])


def test_empty_sequence(model, src):
    with pytest.raises(ValueError, match=r"tgt_ids.*at least one.*" + esc((2, 0))):
        model.forward(src, np.zeros((2, 0), dtype=np.int64))


def test_empty_batch(lm):
    with pytest.raises(ValueError, match=r"ids.*at least one.*" + esc((0, 4))):
        lm.forward(np.zeros((0, 4), dtype=np.int64))


def test_src_tgt_batch_sizes_disagree(model, src, tgt):
    with pytest.raises(ValueError, match=r"src_ids and tgt_ids.*batch size.*2 and 1"):
        model.forward(src, tgt[:1])


def test_src_longer_than_max_len(model, rng, tgt):
    with pytest.raises(ValueError, match=r"src_ids has 7 positions.*max_len=6"):
        model.forward(ids(rng, 2, MAX_LEN + 1, V_SRC), tgt)


def test_tgt_longer_than_max_len(model, rng, src):
    with pytest.raises(ValueError, match=r"tgt_ids has 9 positions.*max_len=6"):
        model.forward(src, ids(rng, 2, 9, V_TGT))


def test_lm_ids_longer_than_max_len(lm, rng):
    with pytest.raises(ValueError, match=r"ids has 7 positions.*max_len=6"):
        lm.forward(ids(rng, 1, MAX_LEN + 1, V_TGT))


def test_lm_ids_out_of_range(lm, rng):
    bad = ids(rng, 2, 4, V_TGT)
    bad[1, 3] = V_TGT
    with pytest.raises(ValueError, match=r"ids.*\[0, 13\).*13\]"):
        lm.forward(bad)


# ----------------------------------------------------------------------------------------------
# Configuration.


def test_config_d_model_not_divisible_by_n_heads():
    with pytest.raises(ValueError, match=r"d_model must be divisible by n_heads.*d_model=30.*n_heads=4"):
        tiny_config(d_model=30, n_heads=4)


def test_config_unknown_activation():
    with pytest.raises(ValueError, match=r"activation.*'relu', 'gelu', 'gelu_tanh'.*'swish'"):
        tiny_config(activation="swish")


def test_config_unknown_positional():
    with pytest.raises(ValueError, match=r"positional.*'sinusoidal', 'learned'.*'rotary'"):
        tiny_config(positional="rotary")


@pytest.mark.parametrize(
    ("field", "value", "minimum"),
    [
        ("d_model", -8, 1),
        ("n_heads", -2, 1),
        ("d_ff", 0, 1),
        ("src_vocab_size", 0, 1),
        ("max_len", -1, 1),
        ("n_encoder_layers", -1, 0),
        ("n_decoder_layers", -3, 0),
    ],
)
def test_config_negative_size(field, value, minimum):
    with pytest.raises(ValueError, match=rf"{field} must be >= {minimum}, got {value}"):
        tiny_config(**{field: value})


def test_config_size_not_an_int():
    with pytest.raises(TypeError, match=r"d_ff must be an int.*float.*12\.5"):
        tiny_config(d_ff=12.5)


@pytest.mark.parametrize("value", [1.0, 1.5, -0.1])
def test_config_dropout_out_of_range(value):
    with pytest.raises(ValueError, match=rf"dropout must be in \[0, 1\), got {value}"):
        tiny_config(dropout=value)


@pytest.mark.parametrize("field", ["embedding_dropout", "attention_dropout", "activation_dropout", "residual_dropout"])
def test_config_site_dropout_checked(field):
    with pytest.raises(ValueError, match=rf"{field} must be in \[0, 1\), got 1.0"):
        tiny_config(**{field: 1.0})
    with pytest.raises(TypeError, match=rf"{field} must be a float, got str"):
        tiny_config(**{field: "0.1"})
    assert tiny_config(dropout=0.3, **{field: 0.0}).dropout_rates[field.removesuffix("_dropout")] == 0.0


def test_flash_attention_refuses_only_attention_dropout():
    with pytest.raises(ValueError, match="attention='flash' has no attention dropout"):
        tiny_config(attention="flash", dropout=0.1)
    assert tiny_config(attention="flash", dropout=0.1, attention_dropout=0.0).has_dropout


@pytest.mark.parametrize("field", ["norm_first", "tie_embeddings", "scale_embeddings"])
def test_config_non_bool_flag(field):
    with pytest.raises(TypeError, match=rf"{field} must be a bool, got int"):
        tiny_config(**{field: 1})


def test_config_final_norm():
    """final_norm: None follows norm_first; True / False say it outright; anything else is refused."""
    assert [tiny_config(norm_first=first).has_final_norm for first in (False, True)] == [False, True]
    assert (
        tiny_config(final_norm=True).has_final_norm
        and not tiny_config(norm_first=True, final_norm=False).has_final_norm
    )
    with pytest.raises(TypeError, match=r"final_norm must be a bool or None, got int"):
        tiny_config(final_norm=1)


def test_config_pad_id_not_below_src_vocab():
    with pytest.raises(ValueError, match=r"pad_id.*src_vocab_size=11, got 11"):
        tiny_config(pad_id=V_SRC)


def test_config_pad_id_not_below_tgt_vocab():
    with pytest.raises(ValueError, match=r"pad_id.*tgt_vocab_size=13, got 15"):
        tiny_config(src_vocab_size=20, pad_id=15)


def test_config_layer_norm_eps_not_positive():
    with pytest.raises(ValueError, match=r"layer_norm_eps.*positive.*got 0"):
        tiny_config(layer_norm_eps=0.0)


def test_config_from_dict_unknown_field():
    with pytest.raises(ValueError, match=r"unknown fields \['d_modle'\]"):
        TransformerConfig.from_dict(tiny_config().to_dict() | {"d_modle": 8})


# ----------------------------------------------------------------------------------------------
# Model construction.


def test_model_with_a_dict_instead_of_a_config():
    with pytest.raises(TypeError, match=r"config must be a TransformerConfig, got dict"):
        Transformer(tiny_config().to_dict())


def test_lm_with_a_non_config():
    with pytest.raises(TypeError, match=r"config must be a TransformerConfig, got NoneType"):
        TransformerLM(None)


@pytest.mark.parametrize(("dtype", "name"), [(np.float16, "float16"), (int, "int64"), (np.int32, "int32")])
def test_model_with_unsupported_dtype(dtype, name):
    with pytest.raises(TypeError, match=rf"dtype must be float32 or float64, got {name}"):
        Transformer(tiny_config(), dtype=dtype)


# ----------------------------------------------------------------------------------------------
# Backward.


def test_backward_before_forward(rng):
    with pytest.raises(ValueError, match=r"backward called before forward"):
        Transformer(tiny_config()).backward(rng.standard_normal((2, 3, V_TGT)))


def test_lm_backward_before_forward(rng):
    with pytest.raises(ValueError, match=r"backward called before forward"):
        TransformerLM(tiny_config()).backward(rng.standard_normal((2, 3, V_TGT)))


@pytest.mark.parametrize("method", ["backward", "attention_maps", "activations", "router_logits"])
@pytest.mark.parametrize("cls", [Transformer, TransformerLM, EncoderModel], ids=lambda c: c.__name__)
def test_what_reads_the_forward_before_any_forward(cls, method, rng):
    """Every method that reads the last forward pass says so, by name, before there is one."""
    model = cls(tiny_config(), seed=0)
    args = (rng.standard_normal((2, 3, 8)),) if method == "backward" else ()
    with pytest.raises(ValueError, match=rf"{method} called before forward: .*\(call forward first\)"):
        getattr(model, method)(*args)


def test_each_model_keeps_its_own_cache(rng):
    """Each model class's forward makes its own cache type; an EncoderModel has no router logits ([])."""
    caches = {}
    for cls, inputs in (
        (Transformer, (ids(rng, 2, 3, V_SRC), ids(rng, 2, 3, V_TGT))),
        (TransformerLM, (ids(rng, 2, 3, V_TGT),)),
        (EncoderModel, (ids(rng, 2, 3, V_SRC),)),
    ):
        model = cls(tiny_config(), seed=0)
        out = model.forward(*inputs)
        caches[cls.__name__] = type(model._cache).__name__
        assert ("logits" in model.activations()) == (cls is not EncoderModel)
        assert model.router_logits() == []
        model.backward(rng.standard_normal(out.shape))
        assert any(np.abs(g).sum() > 0 for g in model.grads.values())
    assert caches == {
        "Transformer": "TransformerCache",
        "TransformerLM": "LMCache",
        "EncoderModel": "EncoderModelCache",
    }


def test_dlogits_of_wrong_shape(model, src, tgt, rng):
    model.forward(src, tgt)
    with pytest.raises(ValueError, match=r"dlogits must have shape " + esc((2, 3, 13)) + ".*" + esc((2, 3, 12))):
        model.backward(rng.standard_normal((2, 3, 12)))


def test_lm_dlogits_of_wrong_shape(lm, rng):
    lm.forward(ids(rng, 2, 4, V_TGT))
    with pytest.raises(ValueError, match=r"dlogits must have shape " + esc((2, 4, 13)) + ".*" + esc((2, 3, 13))):
        lm.backward(rng.standard_normal((2, 3, V_TGT)))


def test_float32_dlogits_into_float64_model(model, src, tgt, rng):
    model.forward(src, tgt)
    with pytest.raises(TypeError, match=r"dlogits must have dtype float64, got float32"):
        model.backward(rng.standard_normal((2, 3, V_TGT)).astype(np.float32))


def test_float64_dlogits_into_float32_model(src, tgt, rng):
    model = Transformer(tiny_config(), dtype=np.float32)
    model.forward(src, tgt)
    with pytest.raises(TypeError, match=r"dlogits must have dtype float32, got float64"):
        model.backward(rng.standard_normal((2, 3, V_TGT)))


def test_dlogits_not_an_array(model, src, tgt, rng):
    model.forward(src, tgt)
    with pytest.raises(TypeError, match=r"dlogits must be a numpy array, got list"):
        model.backward(rng.standard_normal((2, 3, V_TGT)).tolist())


# ----------------------------------------------------------------------------------------------
# State dicts. A rejected load must leave the parameters untouched.


def assert_unchanged(model, before: dict) -> None:
    for k, v in model.params.items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)


def test_state_dict_missing_keys(model):
    before = model.state_dict()
    missing = ["encoder.layers.0.ffn.linear1.weight", "decoder.layers.0.cross_attn.k_proj.bias", "output_proj.bias"]
    state = {k: v + 1.0 for k, v in before.items() if k not in missing}
    with pytest.raises(ValueError, match=r"missing keys") as info:
        model.load_state_dict(state)
    for k in missing:
        assert repr(k) in str(info.value)
    assert_unchanged(model, before)


def test_state_dict_unexpected_keys(model):
    before = model.state_dict()
    extra = {"encoder.layers.1.ffn.linear1.weight": np.zeros((12, 8)), "output_proj.scale": np.ones(13)}
    with pytest.raises(ValueError, match=r"unexpected keys") as info:
        model.load_state_dict({k: v + 1.0 for k, v in before.items()} | extra)
    for k in extra:
        assert repr(k) in str(info.value)
    assert_unchanged(model, before)


def test_state_dict_misshaped_keys(model):
    before = model.state_dict()
    bad = {"encoder.token_embedding.weight": np.zeros((8, 11)), "output_proj.bias": np.zeros(3)}
    with pytest.raises(ValueError, match=r"mis-shaped keys") as info:
        model.load_state_dict(before | bad)
    message = str(info.value)
    assert "encoder.token_embedding.weight: got (8, 11), expected (11, 8)" in message
    assert "output_proj.bias: got (3,), expected (13,)" in message
    assert_unchanged(model, before)


def test_state_dict_not_a_dict(model):
    with pytest.raises(TypeError, match=r"state must be a dict.*got list"):
        model.load_state_dict(list(model.state_dict().items()))


def test_state_dict_non_numeric_value(model):
    with pytest.raises(TypeError, match=r"state\['output_proj.bias'\] must be a numeric array.*<U1"):
        model.load_state_dict(model.state_dict() | {"output_proj.bias": np.array(["x"] * 13)})


def test_state_dict_non_strict_tolerates_missing_and_unexpected(model):
    before = model.state_dict()
    state = {"output_proj.bias": before["output_proj.bias"] + 1.0, "not.a.parameter": np.zeros(2)}
    model.load_state_dict(state, strict=False)
    np.testing.assert_array_equal(model.params["output_proj.bias"], before["output_proj.bias"] + 1.0)
    np.testing.assert_array_equal(model.params["output_proj.weight"], before["output_proj.weight"])


def test_state_dict_non_strict_still_rejects_misshaped(model):
    before = model.state_dict()
    with pytest.raises(ValueError, match=r"mis-shaped keys.*output_proj.bias: got \(12,\), expected \(13,\)"):
        model.load_state_dict({"output_proj.bias": np.zeros(12), "decoder.final_norm.weight": np.ones(8)}, strict=False)
    assert_unchanged(model, before)


def test_lm_state_dict_with_encoder_keys(lm):
    state = Transformer(tiny_config(), seed=0).state_dict()
    with pytest.raises(ValueError, match=r"unexpected keys.*'encoder.token_embedding.weight'"):
        lm.load_state_dict(state)


# ----------------------------------------------------------------------------------------------
# Multi-head attention.


@pytest.fixture
def mha_params(rng):
    return {k: rng.standard_normal((8, 8) if k.endswith("weight") else (8,)) for k in MHA_KEYS}


def test_mha_query_and_key_batch_sizes_disagree(mha_params, rng):
    query, memory = rng.standard_normal((2, 3, 8)), rng.standard_normal((3, 4, 8))
    with pytest.raises(ValueError, match=r"batch sizes disagree: query has B=2, key has B=3"):
        multi_head_attention_forward(mha_params, query, memory, memory, 2)


def test_mha_key_value_shape_mismatch(mha_params, rng):
    query, key, value = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 5, 8))
    with pytest.raises(
        ValueError, match=r"key and value must have the same shape.*" + esc((2, 4, 8)) + ".*" + esc((2, 5, 8))
    ):
        multi_head_attention_forward(mha_params, query, key, value, 2)


def test_mha_key_width_differs_from_query(mha_params, rng):
    query, key = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 4, 6))
    with pytest.raises(ValueError, match=r"key must have d_model=8.*" + esc((2, 4, 6))):
        multi_head_attention_forward(mha_params, query, key, key, 2)


def test_mha_d_model_not_divisible_by_n_heads(mha_params, rng):
    x = rng.standard_normal((2, 3, 8))
    with pytest.raises(ValueError, match=r"d_model must be divisible by n_heads.*d_model=8, n_heads=3"):
        multi_head_attention_forward(mha_params, x, x, x, 3)


def test_mha_n_heads_not_positive(mha_params, rng):
    x = rng.standard_normal((2, 3, 8))
    with pytest.raises(ValueError, match=r"n_heads must be a positive int, got 0"):
        multi_head_attention_forward(mha_params, x, x, x, 0)


def test_mha_query_wrong_ndim(mha_params, rng):
    x = rng.standard_normal((2, 3, 8))
    with pytest.raises(ValueError, match=r"query must have shape \(B, T, D\).*" + esc((3, 8))):
        multi_head_attention_forward(mha_params, x[0], x, x, 2)


def test_mha_integer_query(mha_params, rng):
    x = rng.standard_normal((2, 3, 8))
    with pytest.raises(TypeError, match=r"query must be a floating-point array.*int64"):
        multi_head_attention_forward(mha_params, np.ones((2, 3, 8), dtype=np.int64), x, x, 2)


def test_mha_non_bool_mask(mha_params, rng):
    x = rng.standard_normal((2, 3, 8))
    with pytest.raises(TypeError, match=r"attn_mask must be a bool array.*int64"):
        multi_head_attention_forward(mha_params, x, x, x, 2, attn_mask=np.ones((2, 1, 1, 3), dtype=np.int64))


def test_mha_float_mask(mha_params, rng):
    x = rng.standard_normal((2, 3, 8))
    with pytest.raises(TypeError, match=r"attn_mask must be a bool array.*float64"):
        multi_head_attention_forward(mha_params, x, x, x, 2, attn_mask=np.zeros((2, 1, 3, 3)))


def test_mha_mask_does_not_broadcast(mha_params, rng):
    query, memory = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 5, 8))
    bad = np.ones((2, 1, 1, 4), dtype=bool)
    with pytest.raises(ValueError, match=r"attn_mask of shape " + esc(bad.shape) + ".*" + esc((2, 2, 3, 5))):
        multi_head_attention_forward(mha_params, query, memory, memory, 2, attn_mask=bad)


def test_mha_mask_with_too_many_dimensions(mha_params, rng):
    x = rng.standard_normal((2, 3, 8))
    bad = np.ones((1, 2, 1, 1, 3), dtype=bool)
    with pytest.raises(ValueError, match=r"attn_mask of shape " + esc(bad.shape) + ".*" + esc((2, 2, 3, 3))):
        multi_head_attention_forward(mha_params, x, x, x, 2, attn_mask=bad)


# ----------------------------------------------------------------------------------------------
# Cross-entropy.


@pytest.fixture
def logits(rng):
    return rng.standard_normal((2, 3, 5))


def test_cross_entropy_targets_of_wrong_shape(logits):
    with pytest.raises(ValueError, match=r"targets must have shape.*" + esc((2, 3)) + ".*" + esc((2, 4))):
        cross_entropy_forward(logits, np.zeros((2, 4), dtype=np.int64))


def test_cross_entropy_flattened_targets_for_3d_logits(logits):
    with pytest.raises(ValueError, match=r"targets must have shape.*" + esc((2, 3)) + ".*" + esc((6,))):
        cross_entropy_forward(logits, np.zeros(6, dtype=np.int64))


def test_cross_entropy_float_targets(logits):
    with pytest.raises(TypeError, match=r"targets must be an integer array, got dtype float64"):
        cross_entropy_forward(logits, np.zeros((2, 3)))


def test_cross_entropy_targets_too_large(logits):
    targets = np.array([[0, 1, 7], [2, 3, 4]])
    with pytest.raises(ValueError, match=r"targets must be in \[0, 5\) or equal ignore_index=-100, got \[7\]"):
        cross_entropy_forward(logits, targets)


def test_cross_entropy_negative_targets_that_are_not_ignore_index(logits):
    targets = np.array([[0, -1, 2], [-100, 3, 4]])
    with pytest.raises(ValueError, match=r"targets must be in \[0, 5\).*got \[-1\]"):
        cross_entropy_forward(logits, targets)


def test_cross_entropy_all_targets_ignored(logits):
    with pytest.raises(ValueError, match=r"targets: every target equals ignore_index=0"):
        cross_entropy_forward(logits, np.zeros((2, 3), dtype=np.int64), ignore_index=0)


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_cross_entropy_label_smoothing_out_of_range(logits, value):
    with pytest.raises(ValueError, match=rf"label_smoothing must be in \[0, 1\], got {value}"):
        cross_entropy_forward(logits, np.ones((2, 3), dtype=np.int64), label_smoothing=value)


def test_cross_entropy_integer_logits():
    with pytest.raises(TypeError, match=r"logits must be a floating-point array, got dtype int64"):
        cross_entropy_forward(np.ones((2, 5), dtype=np.int64), np.ones(2, dtype=np.int64))


# ----------------------------------------------------------------------------------------------
# Replayed dropout masks.


@pytest.fixture
def trained(src, tgt):
    model = Transformer(tiny_config(dropout=0.2), seed=0)
    model.forward(src, tgt)
    return model, dict(model.dropout_masks)


def test_dropout_masks_missing_a_site(trained, src, tgt):
    model, masks = trained
    del masks["decoder.layers.0.ffn.dropout"]
    with pytest.raises(
        ValueError, match=r"dropout_masks: no mask for site 'decoder.layers.0.ffn.dropout'.*\(2, 3, 12\)"
    ):
        model.forward(src, tgt, dropout_masks=masks)


def test_dropout_masks_wrong_shape(trained, src, tgt):
    model, masks = trained
    masks["encoder.layers.0.self_attn.dropout"] = np.ones((2, 2, 4, 3), dtype=bool)
    with pytest.raises(
        ValueError,
        match=r"dropout_masks\['encoder.layers.0.self_attn.dropout'\].*" + esc((2, 2, 4, 4)) + ".*" + esc((2, 2, 4, 3)),
    ):
        model.forward(src, tgt, dropout_masks=masks)


def test_a_failed_forward_leaves_nothing_for_backward(trained, src, tgt, rng):
    """A forward pass drops the last pass's cache before it runs (its memory is reused): when it fails midway, backward
    refuses, instead of differentiating the older pass's activations."""
    model, masks = trained
    model.backward(rng.standard_normal((*tgt.shape, V_TGT)))  # the good pass can be differentiated
    masks["decoder.layers.0.ffn.dropout"] = np.ones((2, 3, 5), dtype=bool)  # found wrong late in the pass
    with pytest.raises(ValueError, match=r"dropout_masks\['decoder.layers.0.ffn.dropout'\]"):
        model.forward(src, tgt, dropout_masks=masks)
    with pytest.raises(ValueError, match=r"backward called before forward"):
        model.backward(rng.standard_normal((*tgt.shape, V_TGT)))


def test_dropout_masks_wrong_dtype(trained, src, tgt):
    model, masks = trained
    masks["encoder.embedding_dropout"] = masks["encoder.embedding_dropout"].astype(np.float64)
    with pytest.raises(ValueError, match=r"dropout_masks\['encoder.embedding_dropout'\] must be a bool array.*float64"):
        model.forward(src, tgt, dropout_masks=masks)


def test_lm_dropout_masks_missing_a_site(rng):
    lm = TransformerLM(tiny_config(dropout=0.2), seed=0)
    x = ids(rng, 2, 4, V_TGT)
    lm.forward(x)
    masks = {k: v for k, v in lm.dropout_masks.items() if k != "decoder.embedding_dropout"}
    with pytest.raises(ValueError, match=r"no mask for site 'decoder.embedding_dropout'.*\(2, 4, 8\)"):
        lm.forward(x, dropout_masks=masks)


# ----------------------------------------------------------------------------------------------
# Gaps found while writing this suite, now closed.


def test_mha_params_of_another_width(mha_params, rng):
    x = rng.standard_normal((2, 3, 4))  # d_model 4, but the params read 8 features (2 heads of 4 from q_proj's rows)
    with pytest.raises(ValueError, match=r"params\['q_proj.weight'\] has shape \(8, 8\), expected \(8, 4\)"):
        multi_head_attention_forward(mha_params, x, x, x, 2)


def test_mha_mixed_dtypes_are_rejected(mha_params, rng):
    query = rng.standard_normal((2, 3, 8)).astype(np.float32)
    memory = rng.standard_normal((2, 4, 8))
    with pytest.raises(TypeError, match="share one dtype.*float32.*float64"):
        multi_head_attention_forward(mha_params, query, memory, memory, 2)
    with pytest.raises(TypeError, match=r"params\['q_proj.weight'\] has dtype float64, expected .*float32"):
        multi_head_attention_forward(mha_params, query, query, query, 2)


def test_label_smoothing_none(rng):
    logits = rng.standard_normal((2, 3, 5))
    with pytest.raises(TypeError, match="label_smoothing must be a float"):
        cross_entropy_forward(logits, np.zeros((2, 3), dtype=int), label_smoothing=None)


def test_dropout_masks_for_unknown_sites(rng, src, tgt):
    model = Transformer(tiny_config(dropout=0.1), seed=0).train()
    model.forward(src, tgt)
    masks = dict(model.dropout_masks) | {"encoder.layers.7.ffn.dropout": np.ones((2, 4, 12), dtype=bool)}
    with pytest.raises(ValueError, match=r"unknown sites \['encoder.layers.7.ffn.dropout'\]"):
        model.forward(src, tgt, dropout_masks=masks)


# ----------------------------------------------------------------------------------------------
# After the paper: grouped-query attention, biases, rotary positions, the norm kind.


def gqa_params(rng, D: int = 8, n_heads: int = 2, n_kv_heads: int = 1, bias: bool = True) -> dict:
    """Attention params for d_model D with n_kv_heads K/V heads: k_proj and v_proj (n_kv_heads * Dh, D)."""
    kv = D // n_heads * n_kv_heads
    shapes = {"q_proj": (D, D), "k_proj": (kv, D), "v_proj": (kv, D), "out_proj": (D, D)}
    params = {f"{k}.weight": rng.standard_normal(s) for k, s in shapes.items()}
    if bias:
        params |= {f"{k}.bias": rng.standard_normal(s[:1]) for k, s in shapes.items()}
    return params


def rope_tables(T: int, head_dim: int, dtype=np.float64):
    return rope_angles(np.arange(T), head_dim, 10000.0, dtype)


def test_gqa_k_proj_of_the_width_of_all_heads(mha_params, rng):
    """k_proj.weight of plain multi-head attention, (D, D), handed to one K/V head: expected (Dh, D)."""
    x = rng.standard_normal((2, 3, 8))
    with pytest.raises(
        ValueError, match=r"params\['k_proj.weight'\] has shape \(8, 8\), expected \(4, 8\).*n_kv_heads=1"
    ):
        multi_head_attention_forward(mha_params, x, x, x, 2, n_kv_heads=1)


def test_gqa_v_proj_of_another_width(rng):
    params = gqa_params(rng, n_heads=4, n_kv_heads=2)  # k_proj, v_proj (4, 8)
    params["v_proj.weight"] = rng.standard_normal((2, 8))  # one K/V head of 2 features
    params["v_proj.bias"] = rng.standard_normal(2)
    x = rng.standard_normal((2, 3, 8))
    with pytest.raises(
        ValueError, match=r"params\['v_proj.weight'\] has shape \(2, 8\), expected \(4, 8\).*n_kv_heads=2"
    ):
        multi_head_attention_forward(params, x, x, x, 4, n_kv_heads=2)


def test_gqa_bias_of_another_width(rng):
    params = gqa_params(rng, n_kv_heads=1)
    params["k_proj.bias"] = rng.standard_normal(8)
    x = rng.standard_normal((2, 3, 8))
    with pytest.raises(ValueError, match=r"params\['k_proj.bias'\] has shape \(8,\), expected \(4,\)"):
        multi_head_attention_forward(params, x, x, x, 2, n_kv_heads=1)


@pytest.mark.parametrize("missing", ["q_proj.bias", "v_proj.bias", ("k_proj.bias", "out_proj.bias")])
def test_mha_only_some_biases(mha_params, rng, missing):
    missing = [missing] if isinstance(missing, str) else list(missing)
    for name in missing:
        del mha_params[name]
    x = rng.standard_normal((2, 3, 8))
    with pytest.raises(ValueError, match=r"params has the biases .* but not \[.*\].*all four biases, none"):
        multi_head_attention_forward(mha_params, x, x, x, 2)


def test_mha_biases_on_q_k_v_only_are_qwen2s(mha_params, rng):
    """q, k and v biases without out_proj's: Qwen2's attention, accepted, with no out_proj.bias gradient."""
    del mha_params["out_proj.bias"]
    x = rng.standard_normal((2, 3, 8))
    out, cache = multi_head_attention_forward(mha_params, x, x, x, 2)
    *_, grads = multi_head_attention_backward(rng.standard_normal(out.shape), cache)
    assert sorted(grads) == sorted(mha_params)


def test_mha_one_bias_only(rng):
    params = gqa_params(rng, n_kv_heads=2, bias=False) | {"k_proj.bias": rng.standard_normal(8)}
    x = rng.standard_normal((2, 3, 8))
    with pytest.raises(ValueError, match=r"params has the biases \['k_proj.bias'\] but not"):
        multi_head_attention_forward(params, x, x, x, 2)


def test_mha_missing_weight(mha_params, rng):
    del mha_params["v_proj.weight"]
    x = rng.standard_normal((2, 3, 8))
    with pytest.raises(ValueError, match=r"params is missing \['v_proj.weight'\]"):
        multi_head_attention_forward(mha_params, x, x, x, 2)


def test_rope_tables_of_torch_width(mha_params, rng):
    """torch_transformer's tables are (T, Dh), each angle twice; the NumPy pair rotation takes (T, Dh/2)."""
    x = rng.standard_normal((2, 3, 8))
    cos, sin = rope_tables(3, 4)
    full = (np.concatenate([cos, cos], axis=-1), np.concatenate([sin, sin], axis=-1))
    with pytest.raises(ValueError, match=r"rope cos must have shape \(T, Dh/2\) = \(3, 2\), got \(3, 4\)"):
        multi_head_attention_forward(mha_params, x, x, x, 2, rope=full)


def test_rope_tables_for_another_length(mha_params, rng):
    x = rng.standard_normal((2, 3, 8))
    with pytest.raises(ValueError, match=r"rope cos must have shape \(T, Dh/2\) = \(3, 2\), got \(5, 2\)"):
        multi_head_attention_forward(mha_params, x, x, x, 2, rope=rope_tables(5, 4))


def test_rope_sin_of_the_wrong_shape(mha_params, rng):
    x = rng.standard_normal((2, 3, 8))
    cos, sin = rope_tables(3, 4)
    with pytest.raises(ValueError, match=r"rope sin must have shape \(T, Dh/2\) = \(3, 2\), got \(3, 1\)"):
        multi_head_attention_forward(mha_params, x, x, x, 2, rope=(cos, sin[:, :1]))


def test_rope_with_t_q_different_from_t_k(mha_params, rng):
    """Rotary positions rotate self-attention's queries and keys by one set of positions."""
    query, memory = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 4, 8))
    with pytest.raises(ValueError, match=r"rope.*T_q=3 != T_k=4"):
        multi_head_attention_forward(mha_params, query, memory, memory, 2, rope=rope_tables(3, 4))


def test_rope_with_an_odd_head_size(rng):
    """Tables of shape (T, Dh // 2) pass the shape check for an odd Dh; the head size itself is the error."""
    x = rng.standard_normal((2, 3, 6))  # 2 heads of 3 features: no pairs to rotate
    params = {k: rng.standard_normal((6, 6) if k.endswith("weight") else (6,)) for k in MHA_KEYS}
    cos, sin = rope_tables(3, 2)  # (3, 1) = (T, Dh // 2)
    with pytest.raises(ValueError, match=r"rope.*head size must be even.*Dh = 6 / 2 = 3"):
        multi_head_attention_forward(params, x, x, x, 2, rope=(cos, sin))


def test_rope_tables_of_another_dtype(rng):
    """float64 tables with float32 inputs would silently make the output float64."""
    params = {k: v.astype(np.float32) for k, v in gqa_params(rng, n_kv_heads=2).items()}
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    with pytest.raises(TypeError, match=r"rope cos must have the inputs' dtype float32, got float64"):
        multi_head_attention_forward(params, x, x, x, 2, rope=rope_tables(3, 4, np.float64))


@pytest.mark.parametrize(("n_heads", "n_kv_heads"), [(4, 3), (2, 4)])
def test_mha_n_heads_not_a_multiple_of_n_kv_heads(rng, n_heads, n_kv_heads):
    x = rng.standard_normal((2, 3, 8))
    params = gqa_params(rng, n_heads=n_heads, n_kv_heads=n_heads)
    with pytest.raises(
        ValueError, match=rf"n_heads must be a multiple of n_kv_heads.*n_heads={n_heads}, n_kv_heads={n_kv_heads}"
    ):
        multi_head_attention_forward(params, x, x, x, n_heads, n_kv_heads=n_kv_heads)


@pytest.mark.parametrize("n_kv_heads", [0, -1, 1.0, True])
def test_mha_n_kv_heads_not_a_positive_int(mha_params, rng, n_kv_heads):
    x = rng.standard_normal((2, 3, 8))
    with pytest.raises(ValueError, match=rf"n_kv_heads must be a positive int, got {esc(n_kv_heads)}"):
        multi_head_attention_forward(mha_params, x, x, x, 2, n_kv_heads=n_kv_heads)


@pytest.mark.parametrize(("n_heads", "n_kv_heads"), [(4, 3), (2, 4)])
def test_config_n_heads_not_a_multiple_of_n_kv_heads(n_heads, n_kv_heads):
    with pytest.raises(
        ValueError, match=rf"n_heads must be a multiple of n_kv_heads.*n_heads={n_heads}, n_kv_heads={n_kv_heads}"
    ):
        tiny_config(n_heads=n_heads, n_kv_heads=n_kv_heads)


def test_config_n_kv_heads_not_positive():
    with pytest.raises(ValueError, match=r"n_kv_heads must be >= 1, got 0"):
        tiny_config(n_kv_heads=0)


def test_config_n_kv_heads_not_an_int():
    with pytest.raises(TypeError, match=r"n_kv_heads must be an int.*float"):
        tiny_config(n_kv_heads=1.0)


def test_config_parallel_residual_not_a_bool():
    with pytest.raises(TypeError, match=r"parallel_residual must be a bool, got str"):
        tiny_config(parallel_residual="rope")


def test_config_rope_with_an_odd_head_size():
    with pytest.raises(ValueError, match=r"positional='rope'.*head size.*even.*12 / 4 = 3"):
        tiny_config(d_model=12, n_heads=4, positional="rope")


@pytest.mark.parametrize("value", [0.0, -1.0, "10000", True, float("nan")])
def test_config_rope_theta_not_positive(value):
    with pytest.raises(ValueError, match=rf"rope_theta must be a positive float, got {esc(repr(value))}"):
        tiny_config(rope_theta=value)


def test_config_unknown_norm():
    with pytest.raises(ValueError, match=r"norm must be one of \('layer', 'rms', 'rms_offset'\), got 'batch'"):
        tiny_config(norm="batch")


@pytest.mark.parametrize("field", ["gated_ffn", "bias", "output_bias"])
def test_config_new_flags_must_be_bools(field):
    with pytest.raises(TypeError, match=rf"{field} must be a bool, got int"):
        tiny_config(**{field: 1})


def test_config_unknown_activation_lists_silu():
    with pytest.raises(ValueError, match=r"activation.*'silu'.*got 'swiglu'"):
        tiny_config(activation="swiglu")


def test_norm_forward_unknown_kind(rng):
    x = rng.standard_normal((2, 3, 8))
    with pytest.raises(ValueError, match=r"norm kind must be 'layer', 'rms' or 'rms_offset', got 'batch'"):
        L.norm_forward({"weight": np.ones(8), "bias": np.zeros(8)}, x, "batch", 1e-5)


@pytest.mark.parametrize("norm_first", [True, False], ids=["pre-norm", "post-norm"])
def test_residual_with_an_unknown_norm_kind(rng, norm_first):
    x = rng.standard_normal((2, 3, 8))
    with pytest.raises(ValueError, match=r"norm kind must be 'layer', 'rms' or 'rms_offset', got 'RMS'"):
        h, _ = L.residual_in_forward({"weight": np.ones(8)}, x, norm_first, 1e-5, kind="RMS")
        L.residual_out_forward({"weight": np.ones(8)}, x, h, norm_first, 1e-5, kind="RMS")


@pytest.mark.parametrize("kind", ["layer", "rms", "rms_offset"])
def test_norm_backward_runs_the_pair_its_forward_chose(kind, rng):
    """norm_forward records the NORM_PAIRS entry it ran; norm_backward runs that entry's backward, whose grads
    are keyed like the params the forward read."""
    x, dout = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 3, 8))
    params = {"weight": rng.standard_normal(8)} | ({"bias": rng.standard_normal(8)} if kind == "layer" else {})
    out, cache = L.norm_forward(params, x, kind, 1e-5)
    assert cache.kind == kind
    expected, _ = L.NORM_PAIRS[kind][0](params, x, 1e-5)
    np.testing.assert_array_equal(out, expected)
    dx, grads = L.norm_backward(dout, cache)
    assert set(grads) == set(params)
    assert np.abs(dx).sum() > 0 and all(np.abs(g).sum() > 0 for g in grads.values())


def test_dense_ffn_backward_refuses_router_gradients(rng):
    cfg = tiny_config()
    params = M.sub(Transformer(cfg, seed=0).params, "decoder.layers.0.ffn")
    x = rng.standard_normal((2, 3, 8))
    out, cache = M.ffn_forward(params, x, cfg, None, "ffn")
    assert cache.kind == "feed_forward"
    with pytest.raises(ValueError, match=r"drouter_logits given for a dense feed-forward block"):
        M.ffn_backward(rng.standard_normal(out.shape), cache, rng.standard_normal((6, 4)))


def test_rms_norm_params_with_a_bias_are_rejected():
    with pytest.raises(ValueError, match="RMSNorm has no bias"):
        L.norm_forward({"weight": np.ones(4), "bias": np.zeros(4)}, np.ones((2, 4)), "rms", 1e-6)


def test_gated_feed_forward_without_its_gate_is_rejected():
    params = {"linear1.weight": np.ones((6, 4)), "linear2.weight": np.ones((4, 6))}
    with pytest.raises(ValueError, match=r"missing \['gate.weight'\]"):
        L.gated_feed_forward_forward(params, np.ones((1, 2, 4)))
