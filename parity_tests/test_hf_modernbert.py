"""ModernBERT (transformers' ModernBertModel) as our EncoderModel, both sides: the math it adds, checked by hand and
against transformers.

- the new pairs against finite differences: LayerNorm without a bias, the norm dispatch without one, and a whole
  ModernBERT-like EncoderModel (no attention norm on layer 0, global and local layers with their own rotary bases,
  GeGLU, no biases);
- NumPy vs torch_transformer on the same config, outputs and every gradient;
- hf.load of a tiny random ModernBertModel (written by transformers with save_pretrained, never downloaded) against
  transformers in float64 (its float32 islands replaced: modernbert_compare.modernbert_in_float64) and, unpatched,
  in float32: outputs and every gradient, both sides, with and without biases;
- the round trip: our model (loaded, or built here) through hf.save and from_pretrained, both sides;
- what is refused, and ModernBertForMaskedLM's base read from its checkpoint.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
import transformers

import numpy_transformer as nt
import torch_transformer as tt
import torch_transformer.hf as torch_hf
from numpy_transformer import hf as numpy_hf
from numpy_transformer import layers as L
from numpy_transformer.gradcheck import check_model, check_pair
from parity_tests import components as C
from parity_tests import modernbert_compare as M
from parity_tests.test_numpy_gradcheck import assert_passes, make_ids, perturb, rand, tiny_config
from parity_tests.test_parity_models import assert_parity

one_torch_thread = pytest.fixture(autouse=True)(C.one_torch_thread)

# ModernBERT's options on our config: what modernbert_from_hf sets, on a small model
MODERNBERT_LIKE = dict(
    norm_first=True,
    positional="rope",
    rope_theta=500.0,
    rope_local_theta=50.0,
    layer_types=("full_attention", "sliding_attention", "sliding_attention"),
    sliding_window=4,
    gated_ffn=True,
    activation="gelu",
    bias=False,
    embedding_norm=True,
    norm_bias=False,
    first_attn_norm=False,
    scale_embeddings=False,
    embedding_padding_idx=True,
)


# ----------------------------------------------------------------------------------------------
# Finite differences.


def test_layer_norm_without_bias_gradcheck():
    rng = np.random.default_rng(90)
    args = dict(x=0.5 + 2.0 * rand(rng, 2, 3, 8), weight=1 + 0.3 * rand(rng, 8), bias=None, eps=1e-5)

    def backward(dout, cache):  # the pair's dbias is the bias's, which this forward does not have
        dx, dweight, _ = L.layer_norm_backward(dout, cache)
        return dx, dweight

    result = check_pair(L.layer_norm_forward, backward, args, wrt=["x", "weight"], max_coords=None)
    assert_passes(result, "layer_norm-no-bias")


def test_norm_dispatch_without_bias_gradcheck():
    """norm_forward on {"weight"} alone is LayerNorm without a bias: its grads dict holds only "weight"."""
    rng = np.random.default_rng(91)
    args = dict(params={"weight": 1 + 0.3 * rand(rng, 8)}, x=rand(rng, 2, 3, 8, scale=2.0), kind="layer", eps=1e-5)
    result = check_pair(L.norm_forward, L.norm_backward, args, wrt=["x", "params"], max_coords=None)
    assert set(result.errors) == {"x", "params.weight"}
    assert_passes(result, "norm-layer-no-bias")
    out, _ = L.norm_forward(args["params"], args["x"], "layer", 1e-5)
    with_zero_bias, _ = L.layer_norm_forward(args["x"], args["params"]["weight"], np.zeros(8), 1e-5)
    np.testing.assert_array_equal(out, with_zero_bias)


def test_modernbert_like_encoder_model_gradcheck():
    """Every parameter of a ModernBERT-like EncoderModel (layer 0 global without an attention norm, layers 1 and 2
    local with their own base, a band of |i - j| <= 2 shorter than the rows, GeGLU, LayerNorms without biases)
    against finite differences, with padding."""
    # padding_idx's rule (no gradient to the pad row from lookups) is not a derivative: left out here
    overrides = MODERNBERT_LIKE | dict(embedding_padding_idx=False)
    cfg = tiny_config(**overrides, n_encoder_layers=3, n_decoder_layers=0, max_len=8, pad_id=0)
    rng = np.random.default_rng(92)
    model = nt.EncoderModel(cfg, seed=5)
    model.eval()
    perturb(model, rng)
    assert "encoder.layers.0.self_attn_norm.weight" not in model.params
    assert "encoder.layers.1.self_attn_norm.weight" in model.params
    assert not any(name.endswith(".bias") for name in model.params)
    ids = make_ids(rng, ["......", "....__"], cfg.src_vocab_size, cfg.pad_id)
    result = check_model(model, ids, seed=7, max_coords=16)
    assert set(result.errors) == set(model.params)
    assert_passes(result, "modernbert-like", rotated=("self_attn",))


# ----------------------------------------------------------------------------------------------
# NumPy vs torch.


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("scenario", ["none", "padding"])
def test_modernbert_like_numpy_and_torch_match(scenario, dtype, device):
    config = nt.TransformerConfig(
        src_vocab_size=13, tgt_vocab_size=13, d_model=16, n_heads=4, d_ff=24, n_encoder_layers=3, n_decoder_layers=0,
        max_len=12, **MODERNBERT_LIKE,
    )  # fmt: skip
    result = C.compare_encoder_models(config, dtype, device, scenario=scenario)
    assert_parity(result, dtype)
    assert not any(name.startswith("encoder.layers.0.self_attn_norm") for name in result.grads)


def test_norm_bias_and_first_attn_norm_state_dicts_agree():
    config = nt.TransformerConfig(**{**MODERNBERT_LIKE, "n_encoder_layers": 3, "n_decoder_layers": 0})
    numpy_shapes = {k: v.shape for k, v in nt.EncoderModel(config).params.items()}
    torch_shapes = {k: tuple(v.shape) for k, v in tt.EncoderModel(config).state_dict().items()}
    assert numpy_shapes == torch_shapes
    assert "encoder.embedding_norm.weight" in numpy_shapes and "encoder.embedding_norm.bias" not in numpy_shapes
    with pytest.raises(ValueError, match="first_attn_norm=False .* needs norm_first=True"):
        nt.TransformerConfig(first_attn_norm=False)
    with pytest.raises(TypeError, match="norm_bias must be a bool"):
        nt.TransformerConfig(norm_bias=1)


# ----------------------------------------------------------------------------------------------
# Against transformers.

VARIANTS = {
    "global+2 local, no biases": {},
    "biases everywhere, norm biases, tanh gelu": dict(
        attention_bias=True, mlp_bias=True, norm_bias=True, hidden_activation="gelu_pytorch_tanh"
    ),
    "every layer global": dict(global_attn_every_n_layers=1),
    "attention biases, none in the MLP": dict(attention_bias=True, mlp_bias=False),
}


@pytest.mark.parametrize("side", ["numpy", "torch"])
@pytest.mark.parametrize("overrides", list(VARIANTS.values()), ids=list(VARIANTS))
def test_matches_transformers_in_float64(overrides, side):
    result = M.compare_modernbert(np.float64, side, **overrides)
    assert not C.failures(result, np.float64), C.failures(result, np.float64)
    for name, (_, theirs) in result.grads.items():  # no vacuous pass: every gradient is there
        assert np.isfinite(theirs).all() and np.abs(theirs).max() > 0, name


@pytest.mark.parametrize("side", ["numpy", "torch"])
def test_matches_unpatched_transformers_in_float32(side):
    result = M.compare_modernbert(np.float32, side, patch=False)
    assert not C.failures(result, np.float32), C.failures(result, np.float32)


def test_the_local_band_and_bases_matter(tmp_path):
    """The local layers' band and base are read from config.json: a model read as all-global, or with the global
    base everywhere, differs from transformers' (so the comparisons above can fail)."""
    theirs = M.build_tiny(tmp_path).double()
    ours = numpy_hf.load(tmp_path, dtype=np.float64)
    ids, mask = M.make_inputs()
    with M.modernbert_in_float64():
        reference = theirs(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long())
    reference = reference.last_hidden_state.detach().numpy()
    np.testing.assert_allclose(ours.forward(ids, attention_mask=mask), reference, rtol=0, atol=1e-10)
    for wrong in (dict(layer_types=None, sliding_window=None), dict(rope_local_theta=None)):
        other = nt.EncoderModel(dataclasses.replace(ours.config, **wrong))
        other.params = ours.params
        assert np.abs(other.forward(ids, attention_mask=mask) - reference).max() > 1e-3, wrong


@pytest.mark.parametrize("side", ["numpy", "torch"])
def test_round_trip_through_from_pretrained(side, tmp_path):
    """A checkpoint loaded, saved by hf.save, read by transformers' from_pretrained: the same tensors, the same
    hidden states (float64, patched); config.json read back gives the same config."""
    M.build_tiny(tmp_path / "a")
    ours = M.load_ours(side, tmp_path / "a", np.float64)
    (numpy_hf if side == "numpy" else torch_hf).save(ours, tmp_path / "b")
    theirs = transformers.ModernBertModel.from_pretrained(tmp_path / "b", attn_implementation="eager").double()
    again = M.load_ours(side, tmp_path / "b", np.float64)
    assert again.config == ours.config
    ids, mask = M.make_inputs(seed=3)
    with M.modernbert_in_float64():
        out = theirs(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long())
    ours_out, _ = M.run_ours(ours, side, ids, mask, np.zeros((*ids.shape, M.TINY["hidden_size"])))
    np.testing.assert_allclose(ours_out, out.last_hidden_state.detach().numpy(), rtol=0, atol=1e-10)


def test_our_own_model_saved_as_modernbert(tmp_path):
    """A model built here (not loaded) with ModernBERT's options is written as a modernbert checkpoint, and
    transformers computes what we compute."""
    config = nt.TransformerConfig(
        src_vocab_size=20, tgt_vocab_size=20, d_model=16, n_heads=2, d_ff=12, n_encoder_layers=3, n_decoder_layers=0,
        max_len=16, **MODERNBERT_LIKE,
    )  # fmt: skip
    ours = nt.EncoderModel(config, seed=3)
    perturb(ours, np.random.default_rng(4))
    numpy_hf.save(ours, tmp_path)
    hf_json = json.loads((tmp_path / "config.json").read_text())
    assert hf_json["model_type"] == "modernbert" and hf_json["local_attention"] == 4
    theirs = transformers.ModernBertModel.from_pretrained(tmp_path, attn_implementation="eager").double()
    ids = np.random.default_rng(5).integers(3, 20, size=(2, 9))
    mask = np.ones(ids.shape, dtype=bool)
    with M.modernbert_in_float64():
        out = theirs(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long())
    np.testing.assert_allclose(
        ours.forward(ids, attention_mask=mask), out.last_hidden_state.detach().numpy(), rtol=0, atol=1e-10
    )


def test_masked_lm_checkpoint_loads_its_base(tmp_path):
    """ModernBertForMaskedLM's checkpoint ("model." prefix, a prediction head and a decoder): its base model."""
    config = transformers.ModernBertConfig(**M.TINY)
    mlm = transformers.ModernBertForMaskedLM._from_config(config, attn_implementation="eager").eval()
    mlm.save_pretrained(tmp_path)
    ours = numpy_hf.load(tmp_path, dtype=np.float64)
    base = mlm.model.state_dict()
    np.testing.assert_array_equal(
        ours.params["encoder.token_embedding.weight"], base["embeddings.tok_embeddings.weight"].double().numpy()
    )
    wqkv = base["layers.1.attn.Wqkv.weight"].double().numpy()
    np.testing.assert_array_equal(ours.params["encoder.layers.1.self_attn.k_proj.weight"], wqkv[32:64])
    wi = base["layers.2.mlp.Wi.weight"].double().numpy()  # [input; gate]: act(input) * gate
    np.testing.assert_array_equal(ours.params["encoder.layers.2.ffn.gate.weight"], wi[:24])
    np.testing.assert_array_equal(ours.params["encoder.layers.2.ffn.linear1.weight"], wi[24:])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(attention_dropout=0.1), "attention_dropout=0.1 is not supported"),
        (dict(layer_types=["full_attention"] * 2), "a list of 3 kinds, one per layer"),
        (
            dict(rope_parameters={"full_attention": {"rope_type": "proportional", "factor": 2.0}}),
            "rope_parameters.full_attention.rope_type='proportional'",
        ),
    ],
)
def test_configs_it_cannot_express_are_refused(overrides, message, tmp_path):
    M.build_tiny(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | overrides))
    for hf in (numpy_hf, torch_hf):
        with pytest.raises(ValueError, match=message):
            hf.load(tmp_path)


# ----------------------------------------------------------------------------------------------
# The masked-LM head (ModernBertForMaskedLM).


def test_mlm_head_gradcheck():
    """mlm_head_forward / mlm_head_backward against finite differences: h, the dense layer, the norm, the tied table
    and the logits' bias."""
    from numpy_transformer.model import mlm_head_backward, mlm_head_forward

    rng = np.random.default_rng(93)
    config = tiny_config(activation="gelu", mlm_head=True, n_decoder_layers=0)
    params = {
        "mlm_head.dense.weight": rand(rng, 8, 8), "mlm_head.dense.bias": rand(rng, 8),
        "mlm_head.norm.weight": 1 + 0.3 * rand(rng, 8), "mlm_head.norm.bias": rand(rng, 8),
        "encoder.token_embedding.weight": rand(rng, 11, 8), "mlm_head.bias": rand(rng, 11),
    }  # fmt: skip
    args = dict(params=params, h=rand(rng, 2, 3, 8), config=config)
    result = check_pair(mlm_head_forward, mlm_head_backward, args, wrt=["h", "params"], max_coords=None)
    assert set(result.errors) == {"h"} | {f"params.{k}" for k in params}
    assert_passes(result, "mlm_head")


@pytest.mark.parametrize("side", ["numpy", "torch"])
@pytest.mark.parametrize(
    "overrides",
    [{}, dict(attention_bias=True, mlp_bias=True, classifier_bias=True, norm_bias=True, decoder_bias=False)],
    ids=["no biases, decoder bias", "biases, norm biases, no decoder bias"],
)
def test_masked_lm_matches_transformers_in_float64(overrides, side):
    result = M.compare_modernbert_mlm(np.float64, side, **overrides)
    assert not C.failures(result, np.float64), C.failures(result, np.float64)
    assert {"head.dense.weight", "head.norm.weight", "model.embeddings.tok_embeddings.weight"} <= set(result.grads)
    assert ("decoder.bias" in result.grads) == overrides.get("decoder_bias", True)
    for name, (_, theirs) in result.grads.items():
        assert np.isfinite(theirs).all() and np.abs(theirs).max() > 0, name


@pytest.mark.parametrize("side", ["numpy", "torch"])
def test_masked_lm_round_trip_through_from_pretrained(side, tmp_path):
    """A ModernBertForMaskedLM checkpoint loaded, saved by hf.save (as a ModernBertForMaskedLM), read by
    from_pretrained: the same logits."""
    M.build_tiny_mlm(tmp_path / "a")
    ours = M.load_ours(side, tmp_path / "a", np.float64)
    assert ours.config.mlm_head
    (numpy_hf if side == "numpy" else torch_hf).save(ours, tmp_path / "b")
    assert json.loads((tmp_path / "b" / "config.json").read_text())["architectures"] == ["ModernBertForMaskedLM"]
    theirs = transformers.ModernBertForMaskedLM.from_pretrained(tmp_path / "b", attn_implementation="eager").double()
    ids, mask = M.make_inputs(seed=4)
    with M.modernbert_in_float64():
        logits = theirs(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long()).logits
    ours_out, _ = M.run_ours_mlm(ours, side, ids, mask, np.zeros((*ids.shape, M.TINY["vocab_size"])))
    np.testing.assert_allclose(ours_out, logits.detach().numpy(), rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(classifier_activation="relu"), r"classifier_activation='relu' .* the value of hidden_activation"),
        (dict(classifier_bias=True), r"classifier_bias=True .* the value of attention_bias"),
        (dict(tie_word_embeddings=False), r"tie_word_embeddings=False is not supported"),
    ],
)
def test_masked_lm_configs_it_cannot_express_are_refused(overrides, message, tmp_path):
    M.build_tiny_mlm(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | overrides))
    for hf in (numpy_hf, torch_hf):
        with pytest.raises(ValueError, match=message):
            hf.load(tmp_path)


def test_mlm_logits_needs_the_head_and_a_forward():
    model = nt.EncoderModel(nt.TransformerConfig(n_decoder_layers=0))
    with pytest.raises(ValueError, match=r"no masked-LM head \(config.mlm_head=False\)"):
        model.mlm_logits(np.zeros((1, 2, 32)))
    with pytest.raises(ValueError, match=r"no masked-LM head"):
        tt.EncoderModel(nt.TransformerConfig(n_decoder_layers=0)).mlm_logits(torch.zeros(1, 2, 32))
    head = nt.EncoderModel(nt.TransformerConfig(n_decoder_layers=0, mlm_head=True))
    with pytest.raises(ValueError, match="mlm_logits_backward called before mlm_logits"):
        head.mlm_logits_backward(np.zeros((1, 2, 32)))


def test_older_config_json_keys_give_the_same_config(tmp_path):
    """Hub files written before layer_types / rope_parameters: global_attn_every_n_layers, global_rope_theta and
    local_rope_theta give the config the newer keys give."""
    M.build_tiny(tmp_path)
    newer = numpy_hf.load(tmp_path).config
    path = tmp_path / "config.json"
    c = json.loads(path.read_text())
    del c["layer_types"], c["rope_parameters"]
    c |= dict(global_attn_every_n_layers=3, global_rope_theta=500.0, local_rope_theta=50.0)
    path.write_text(json.dumps(c))
    assert numpy_hf.load(tmp_path).config == newer
    assert newer.layer_types == ("full_attention", "sliding_attention", "sliding_attention")
    assert (newer.rope_theta, newer.rope_local_theta, newer.sliding_window) == (500.0, 50.0, 4)
