"""Whole models: one state dict into the NumPy reference and torch_transformer.

Logits, loss, every parameter gradient by name, and every layer's hidden state and attention
map, so a failure names the first layer where the two disagree. Over the conventions' grid of
configurations and mask scenarios, for Transformer and TransformerLM, float64 and float32,
evaluation and training mode (dropout on, the same units dropped on both sides).
"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_transformer import TransformerConfig
from parity_tests import components as C

one_torch_thread = pytest.fixture(autouse=True)(C.one_torch_thread)

SMALL = dict(
    src_vocab_size=13,
    tgt_vocab_size=17,
    d_model=16,
    n_heads=4,
    d_ff=24,
    n_encoder_layers=2,
    n_decoder_layers=2,
    max_len=12,
)
CONFIGS = {
    "post-norm relu sinusoidal untied": TransformerConfig(**SMALL),
    "pre-norm gelu learned tied": TransformerConfig(
        **SMALL, norm_first=True, activation="gelu", positional="learned", tie_embeddings=True
    ),
    "post-norm gelu_tanh learned unscaled": TransformerConfig(
        **SMALL, activation="gelu_tanh", positional="learned", scale_embeddings=False
    ),
    "pre-norm relu sinusoidal tied one head": TransformerConfig(
        **{**SMALL, "n_heads": 1}, norm_first=True, tie_embeddings=True
    ),
    # nn.TransformerEncoder(post-norm layers, norm=LayerNorm): a final norm after post-norm layers
    "post-norm relu sinusoidal final norm": TransformerConfig(**SMALL, final_norm=True),
}
DTYPES = [pytest.param(np.float64, id="float64"), pytest.param(np.float32, id="float32")]


def assert_parity(result, dtype):
    problems = C.failures(result, dtype)
    assert not problems, "first disagreement: " + problems[0] + "\nall:\n" + "\n".join(problems)
    nonzero = [name for name, (ours, _) in result.grads.items() if np.any(ours)]
    assert len(nonzero) == len(result.grads), "zero gradients: " + str(sorted(set(result.grads) - set(nonzero)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scenario", C.MASK_SCENARIOS)
@pytest.mark.parametrize("lm", [False, True], ids=["Transformer", "TransformerLM"])
@pytest.mark.parametrize("config", list(CONFIGS.values()), ids=list(CONFIGS))
def test_models_match(config, lm, scenario, dtype, device):
    result = C.compare_models(config, dtype, device, lm=lm, scenario=scenario)
    assert_parity(result, dtype)
    n_layers = config.n_decoder_layers + (0 if lm else config.n_encoder_layers)
    assert sum(name.startswith("hidden") for name in result.outputs) >= n_layers
    assert sum(name.startswith("attention") for name in result.outputs) == n_layers + (
        0 if lm else config.n_decoder_layers
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lm", [False, True], ids=["Transformer", "TransformerLM"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_training_mode_with_shared_dropout_masks(norm_first, lm, dtype, device):
    config = TransformerConfig(**SMALL, dropout=0.2, norm_first=norm_first, activation="gelu")
    result = C.compare_models(config, dtype, device, lm=lm, train=True, scenario="padding")
    assert_parity(result, dtype)


def test_training_mode_really_drops_units():
    """With dropout on, the compared logits differ from the evaluation-mode logits (masks took effect)."""
    config = TransformerConfig(**SMALL, dropout=0.2)
    train = C.compare_models(config, np.float64, "cpu", train=True)
    evaluation = C.compare_models(config, np.float64, "cpu", train=False)
    assert np.abs(train.outputs["logits"][0] - evaluation.outputs["logits"][0]).max() > 1e-3


def test_a_wrong_gradient_is_named():
    """Corrupt one parameter gradient by a relative 1e-7: the check fails and names that parameter."""
    result = C.compare_models(CONFIGS["post-norm relu sinusoidal untied"], np.float64, "cpu")
    name = "encoder.layers.1.ffn.linear1.weight"
    ours, theirs = result.grads[name]
    result.grads[name] = (ours * (1 + 1e-7), theirs)
    problems = C.failures(result, np.float64)
    assert len(problems) == 1 and name in problems[0]


SITE_RATES = {  # a rate per kind of site, one of them 0 in each case (that site draws no mask on either side)
    "all four differ": dict(
        embedding_dropout=0.1, attention_dropout=0.2, activation_dropout=0.3, residual_dropout=0.15
    ),
    "gpt-2 style": dict(embedding_dropout=0.1, attention_dropout=0.2, activation_dropout=0.0, residual_dropout=0.3),
    "opus-mt style": dict(dropout=0.1, attention_dropout=0.0, activation_dropout=0.0),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", ["Transformer", "TransformerLM", "EncoderModel"])
@pytest.mark.parametrize("rates", list(SITE_RATES.values()), ids=list(SITE_RATES))
def test_training_mode_with_a_rate_per_site(rates, family, dtype, device):
    """Each kind of dropout site at its own rate (masks shared): NumPy and torch agree, and exactly the sites with
    a rate above 0 drew masks."""
    config = TransformerConfig(**SMALL, norm_first=True, activation="gelu", **rates)
    if family == "EncoderModel":
        result = C.compare_encoder_models(config, dtype, device, train=True)
    else:
        result = C.compare_models(config, dtype, device, lm=family == "TransformerLM", train=True)
    assert_parity(result, dtype)


def test_only_sites_with_a_rate_draw_masks():
    import numpy_transformer as nt
    import torch_transformer as tt

    config = TransformerConfig(**SMALL, **SITE_RATES["gpt-2 style"])
    model = nt.Transformer(config, seed=0).train()
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(3, 13, size=(2, 6)), rng.integers(3, 17, size=(2, 5))
    model.forward(src, tgt)
    expected = tt.dropout_site_shapes(config, batch_size=2, tgt_len=5, src_len=6)
    assert list(model.dropout_masks) == list(expected)  # the same sites, in forward order
    assert not any(site.endswith("ffn.dropout") for site in model.dropout_masks)  # activation_dropout 0
    assert {site: mask.shape for site, mask in model.dropout_masks.items()} == expected
    kept = {kind: [] for kind in ("embedding", "attention", "residual")}
    for site, mask in model.dropout_masks.items():
        kept[nt.layers.dropout_kind(site)].append(mask.mean())
    for kind, rate in (("embedding", 0.1), ("attention", 0.2), ("residual", 0.3)):
        assert abs(np.mean(kept[kind]) - (1 - rate)) < 0.08, (kind, np.mean(kept[kind]))


@pytest.mark.parametrize("lm", [False, True], ids=["Transformer", "TransformerLM"])
def test_tiled_attention_trains_with_dropout_everywhere_but_the_probabilities(lm, device):
    """attention='flash' has no (T_q, T_k) probabilities to drop, but every other site may have dropout."""
    config = TransformerConfig(**SMALL, attention="flash", dropout=0.2, attention_dropout=0.0)
    assert_parity(C.compare_models(config, np.float64, device, lm=lm, train=True), np.float64)
