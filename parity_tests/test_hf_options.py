"""Options transformers computes that the loaders once refused, each loaded and compared against transformers' own class
in float64 (outputs and every gradient): T5's d_kv with d_kv x heads != d_model (flan-t5-small's layout), BLOOM's and
Llama's pretraining_tp, the gelu_fast activation, a base model's weights in the generation class (BART), Qwen3-MoE's
sliding window (every layer, as transformers 5), and every family's window rule against transformers' per-layer
attention."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from numpy_transformer import hf as numpy_hf
from parity_tests import components as C
from parity_tests import hf_compare as H
from transformer_spec.families import FAMILIES

pytestmark = pytest.mark.filterwarnings("ignore")
SIDES = ("numpy", "torch")


def assert_exact(result) -> None:
    assert not C.failures(result, np.float64), C.failures(result, np.float64)
    assert len(result.grads) > 5 and all(np.any(ours) for ours, _ in result.grads.values())


@pytest.mark.parametrize("side", SIDES)
def test_t5_with_heads_narrower_than_d_model(side):
    """flan-t5-small: 6 heads of d_kv 64 in a d_model of 512 (384 != 512). Here 4 heads of 6 in 32."""
    with tempfile.TemporaryDirectory() as directory:
        torch.manual_seed(0)  # untrained: T5's own initialisation
        config = transformers.T5Config(**(H.T5_TINY | H.T5_VARIANTS["t5 v1.1"] | {"d_kv": 6}))
        transformers.T5ForConditionalGeneration(config).save_pretrained(directory)
        model = numpy_hf.load(directory)
        assert model.config.head_dim == 6 and model.config.d_model == 32
        assert_exact(H.compare_seq2seq(directory, "t5 v1.1", np.float64, side))
        with tempfile.TemporaryDirectory() as again:
            numpy_hf.save(model, again, overwrite=True)
            assert json.loads((Path(again) / "config.json").read_text())["d_kv"] == 6


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize(("family", "overrides"), [("bloom", {"pretraining_tp": 4}), ("llama", {"pretraining_tp": 2})])
def test_pretraining_tp_is_the_same_model(family, overrides, side):
    """transformers computes the same model for any pretraining_tp (BLOOM slices its linears only with
    slow_but_exact; Llama never reads it): loaded, equal to transformers."""
    assert_exact(H.compare_hf(family, np.float64, side, **overrides))


def test_pretraining_tp_is_checked():
    with pytest.raises(ValueError, match="pretraining_tp=0"):
        FAMILIES["bloom"].from_hf(H.tiny_config("bloom").to_dict() | {"pretraining_tp": 0})


@pytest.mark.parametrize("side", SIDES)
def test_gelu_fast_is_the_tanh_gelu(side):
    """gelu_fast is gelu_new's tanh approximation with sqrt(2/pi) written to 10 digits: read as our gelu_tanh, it
    equals transformers' FastGELUActivation to float64's bar."""
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    fast, new = transformers.activations.FastGELUActivation()(x), transformers.activations.NewGELUActivation()(x)
    assert 0 < (fast - new).abs().max() < 4e-12
    result = H.compare_hf("bert", np.float64, side, hidden_act="gelu_fast")
    assert_exact(result)


def test_every_family_slides_the_layers_transformers_slides():
    """Each family's window, layer by layer, against what transformers' own model reads: its attention module's
    sliding_window (Qwen2, Qwen3, Qwen3-MoE, Gemma 3) or the config's on every layer (Mistral, Mixtral, Phi-3)."""
    cases = {
        "mistral": {"sliding_window": 3},
        "mixtral": {"sliding_window": 3},
        "phi3": {"sliding_window": 3},
        "qwen2": {"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1},
        "qwen3": {"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1},
        "qwen3_moe": {"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1},
        "gemma3_text": {},
        "gemma2": {"num_hidden_layers": 4},
    }
    for family, overrides in cases.items():
        config = H.tiny_config(family, **overrides)
        model = H.CLASSES[family](config)
        layers = model.model.layers
        theirs = [getattr(layer.self_attn, "sliding_window", config.sliding_window) for layer in layers]
        ours = FAMILIES[config.model_type].from_hf(config.to_dict())
        assert [ours.layer_window(i) for i in range(len(layers))] == theirs, family
        assert any(theirs) and (family != "qwen3_moe" or all(theirs))


@pytest.mark.parametrize("side", SIDES)
def test_qwen3_moe_slides_every_layer(side):
    """Qwen3-MoE with use_sliding_window: transformers 5 slides every layer (Qwen2's max_window_layers rule would
    slide none of these 3: logits off by about 1 relative)."""
    result = H.compare_hf("qwen3_moe", np.float64, side, use_sliding_window=True, sliding_window=3, length=9)
    assert_exact(result)


@pytest.mark.parametrize("side", SIDES)
def test_bart_base_model_loads_into_the_generation_class(side):
    """bart-base's files are BartModel's (no final_logits_bias): loaded as BartForConditionalGeneration, as
    transformers' from_pretrained loads them (final_logits_bias zeros, lm_head the tied token table), said in a
    warning naming what was created; then equal to that class in float64."""
    with tempfile.TemporaryDirectory() as directory:
        H.build_seq2seq("bart", steps=0).model.save_pretrained(directory)
        assert json.loads((Path(directory) / "config.json").read_text())["architectures"] == ["BartModel"]
        with pytest.warns(UserWarning, match=r"BartModel checkpoint .*\['final_logits_bias'\] created as zeros"):
            model = numpy_hf.load(directory)
        assert not np.any(model.params["output_proj.bias"])
        assert_exact(H.compare_seq2seq(directory, "bart", np.float64, side))
