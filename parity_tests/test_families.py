"""The model families beyond the paper's: the encoder-only EncoderModel (BERT), the embedding options
of BERT, Marian and BART (token types, the embedding norm, split sinusoids, shared embeddings), and the
padding rules real checkpoints need (pad_id None; a decoder that masks only the future).

- NumPy vs torch_transformer, outputs and every gradient (float64 <= 1e-10, float32 <= 1e-5), in
  evaluation and in training mode with the same dropout units, with padding and token types;
- state-dict names and shapes of the new keys, the same on both sides;
- what is masked: nothing with pad_id None; in the decoder, nothing but the future;
- the split sinusoids against Marian's own formula, shared-embedding gradients as the sum of every use,
  checkpoints of an EncoderModel, decoding from a start token equal to pad_id.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import numpy_transformer as nt
import torch_transformer as tt
from numpy_transformer import checkpoint as ncp
from numpy_transformer import decoding as nd
from numpy_transformer.model import parameter_shapes
from parity_tests import components as C
from parity_tests.test_decoding import numpy_model, torch_twin
from parity_tests.test_parity_models import DTYPES, assert_parity
from torch_transformer import checkpoint as tcp
from torch_transformer import decoding as td

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
SHARED = {**SMALL, "tgt_vocab_size": 13}  # share_embeddings needs one vocabulary
ENCODER_CONFIGS = {
    "BERT: post-norm gelu learned token-types embedding-norm": nt.TransformerConfig(
        **SMALL,
        activation="gelu",
        positional="learned",
        type_vocab_size=2,
        embedding_norm=True,
        scale_embeddings=False,
        layer_norm_eps=1e-12,
    ),
    "pre-norm relu split-sinusoids 3 token-types": nt.TransformerConfig(
        **SMALL, norm_first=True, sinusoid_layout="split", type_vocab_size=3
    ),
    "post-norm gelu_tanh no types, pad_id None": nt.TransformerConfig(**SMALL, activation="gelu_tanh", pad_id=None),
    "rope rms GQA 4/2 gated silu, no biases, token types": nt.TransformerConfig(
        **SMALL,
        positional="rope",
        norm="rms",
        n_kv_heads=2,
        gated_ffn=True,
        activation="silu",
        bias=False,
        type_vocab_size=2,
    ),
}
SEQ2SEQ_CONFIGS = {
    "Marian: split sinusoids, shared and tied": nt.TransformerConfig(
        **SHARED, sinusoid_layout="split", share_embeddings=True, tie_embeddings=True, bos_id=0
    ),
    "BART: learned, embedding norm, gelu, shared and tied": nt.TransformerConfig(
        **SHARED,
        positional="learned",
        embedding_norm=True,
        activation="gelu",
        share_embeddings=True,
        tie_embeddings=True,
        scale_embeddings=False,
    ),
    "pre-norm, token types in the encoder, embedding norm, shared untied": nt.TransformerConfig(
        **SHARED, norm_first=True, type_vocab_size=2, embedding_norm=True, share_embeddings=True
    ),
    "pad_id None, split sinusoids, embedding norm": nt.TransformerConfig(
        **SMALL, pad_id=None, sinusoid_layout="split", embedding_norm=True
    ),
    "rope rms GQA 4/2 (cross-attention too), gated silu, pre-norm, no biases": nt.TransformerConfig(
        **SMALL,
        positional="rope",
        norm="rms",
        n_kv_heads=2,
        gated_ffn=True,
        activation="silu",
        norm_first=True,
        bias=False,
        output_bias=False,
    ),
    "post-norm rms MQA learned, gated gelu, shared and tied, no output bias": nt.TransformerConfig(
        **SHARED,
        norm="rms",
        n_kv_heads=1,
        positional="learned",
        gated_ffn=True,
        activation="gelu",
        share_embeddings=True,
        tie_embeddings=True,
        output_bias=False,
    ),
}
LM_CONFIGS = {
    "GPT-2-like: pre-norm gelu_tanh learned tied, pad_id None": nt.TransformerConfig(
        **SMALL, norm_first=True, activation="gelu_tanh", positional="learned", tie_embeddings=True, pad_id=None
    ),
    "embedding norm, split sinusoids": nt.TransformerConfig(**SMALL, embedding_norm=True, sinusoid_layout="split"),
    "Llama-like: pre-norm rms rope silu gated GQA 4/2, no biases, no output bias, pad_id None": nt.TransformerConfig(
        **SMALL,
        norm_first=True,
        norm="rms",
        positional="rope",
        rope_theta=500000.0,
        activation="silu",
        gated_ffn=True,
        n_kv_heads=2,
        bias=False,
        output_bias=False,
        pad_id=None,
    ),
    "post-norm rms rope MQA gated gelu_tanh with biases, tied": nt.TransformerConfig(
        **SMALL,
        norm="rms",
        positional="rope",
        n_kv_heads=1,
        gated_ffn=True,
        activation="gelu_tanh",
        tie_embeddings=True,
    ),
    "GPT-NeoX-like: parallel residual, partial rotary 2 of 4, gelu, pad_id None": nt.TransformerConfig(
        **SMALL,
        norm_first=True,
        parallel_residual=True,
        positional="rope",
        rotary_dim=2,
        activation="gelu",
        pad_id=None,
        output_bias=False,
    ),
    "Qwen3-like: q/k norm before rope, rms gated silu GQA 4/2, no biases": nt.TransformerConfig(
        **SMALL,
        norm_first=True,
        norm="rms",
        positional="rope",
        qk_norm=True,
        activation="silu",
        gated_ffn=True,
        n_kv_heads=2,
        bias=False,
        output_bias=False,
        layer_norm_eps=1e-6,
    ),
    "Phi-3-like: partial rotary 2 of 4, window 3, rms gated silu GQA 4/2, no biases": nt.TransformerConfig(
        **SMALL,
        norm_first=True,
        norm="rms",
        positional="rope",
        rotary_dim=2,
        sliding_window=3,
        activation="silu",
        gated_ffn=True,
        n_kv_heads=2,
        bias=False,
        output_bias=False,
    ),
    "Gemma-3-like: (1 + w) rms sandwich, q/k norms, GeGLU tanh, local/global kinds, head_dim, capped logits": (
        nt.TransformerConfig(
            **SMALL,
            norm_first=True,
            norm="rms_offset",
            sandwich_norm=True,
            qk_norm=True,
            positional="rope",
            activation="gelu_tanh",
            gated_ffn=True,
            n_kv_heads=2,
            bias=False,
            output_bias=False,
            tie_embeddings=True,
            head_dim=6,
            attention_scale=0.3,
            logit_softcap=2.0,
            sliding_window=2,
            rope_local_theta=100.0,
            layer_types=("sliding_attention", "full_attention"),
        )  # fmt: skip
    ),
    "Phi-2-like: parallel block of one norm, partial rotary 2 of 4, gelu_tanh, biases, pad_id None": (
        nt.TransformerConfig(
            **SMALL,
            norm_first=True,
            parallel_residual=True,
            shared_norm=True,
            positional="rope",
            rotary_dim=2,
            activation="gelu_tanh",
            pad_id=None,
        )  # fmt: skip
    ),
    "Gemma-2-like: (1 + w) rms sandwich, scores capped 0.8, logits capped 2, local then global, head_dim 6": (
        nt.TransformerConfig(
            **SMALL,
            norm_first=True,
            norm="rms_offset",
            sandwich_norm=True,
            positional="rope",
            activation="gelu_tanh",
            gated_ffn=True,
            n_kv_heads=2,
            bias=False,
            output_bias=False,
            tie_embeddings=True,
            head_dim=6,
            attention_scale=0.5,
            attn_softcap=0.8,
            logit_softcap=2.0,
            sliding_window=2,
            layer_types=("sliding_attention", "full_attention"),
        )  # fmt: skip
    ),
    "OLMo-2-like: rms norms of the sublayers' outputs only, q/k norms over the projections, GQA 4/2, untied": (
        nt.TransformerConfig(
            **SMALL | dict(n_heads=4),
            norm_first=True,
            norm="rms",
            sandwich_norm=True,
            input_norm=False,
            qk_norm=True,
            qk_norm_projection=True,
            positional="rope",
            activation="silu",
            gated_ffn=True,
            n_kv_heads=2,
            bias=False,
            output_bias=False,
        )  # fmt: skip
    ),
    "SmolLM3-like: NoPE first layer then a rotary one, GQA 4/1, tied": (
        nt.TransformerConfig(
            **SMALL | dict(n_heads=4),
            norm_first=True,
            norm="rms",
            positional="rope",
            rope_layers=(False, True),
            activation="silu",
            gated_ffn=True,
            n_kv_heads=1,
            bias=False,
            output_bias=False,
            tie_embeddings=True,
        )  # fmt: skip
    ),
}


# ----------------------------------------------------------------------------------------------
# NumPy vs torch.


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scenario", C.MASK_SCENARIOS)
@pytest.mark.parametrize("config", list(ENCODER_CONFIGS.values()), ids=list(ENCODER_CONFIGS))
def test_encoder_models_match(config, scenario, dtype, device):
    result = C.compare_encoder_models(config, dtype, device, scenario=scenario)
    assert_parity(result, dtype)
    assert sum(name.startswith("hidden encoder.layers") for name in result.outputs) == config.n_encoder_layers
    assert sum(name.startswith("attention") for name in result.outputs) == config.n_encoder_layers


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_encoder_training_mode_with_shared_dropout_masks(norm_first, dtype, device):
    config = nt.TransformerConfig(
        **SMALL, dropout=0.2, norm_first=norm_first, activation="gelu", type_vocab_size=2, embedding_norm=True
    )
    result = C.compare_encoder_models(config, dtype, device, train=True, scenario="padding")
    assert_parity(result, dtype)
    evaluation = C.compare_encoder_models(config, dtype, device, train=False, scenario="padding")
    assert np.abs(result.outputs["hidden"][0] - evaluation.outputs["hidden"][0]).max() > 1e-3  # units were dropped


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scenario", ["padding", "fully_masked"])
@pytest.mark.parametrize("config", list(SEQ2SEQ_CONFIGS.values()), ids=list(SEQ2SEQ_CONFIGS))
def test_encoder_decoder_options_match(config, scenario, dtype, device):
    result = C.compare_models(config, dtype, device, scenario=scenario)
    assert_parity(result, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", list(LM_CONFIGS.values()), ids=list(LM_CONFIGS))
def test_lm_options_match(config, dtype, device):
    result = C.compare_models(config, dtype, device, lm=True, scenario="fully_masked")
    assert_parity(result, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_marian_bart_options_in_training_mode(dtype, device):
    config = nt.TransformerConfig(
        **SHARED,
        dropout=0.2,
        embedding_norm=True,
        sinusoid_layout="split",
        share_embeddings=True,
        tie_embeddings=True,
        type_vocab_size=2,
    )
    assert_parity(C.compare_models(config, dtype, device, train=True, scenario="fully_masked"), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", ["Transformer", "TransformerLM", "EncoderModel"])
def test_llama_options_in_training_mode(family, dtype, device):
    """RMSNorm, rotary positions, the gated feed-forward and grouped-query attention (self- and cross-)
    with dropout on: the same units dropped on both sides (the gated block's dropout site included)."""
    config = nt.TransformerConfig(
        **SMALL,
        dropout=0.2,
        norm="rms",
        positional="rope",
        gated_ffn=True,
        activation="silu",
        n_kv_heads=2,
        norm_first=family != "Transformer",
        bias=family == "EncoderModel",
    )
    if family == "EncoderModel":
        result = C.compare_encoder_models(config, dtype, device, train=True, scenario="padding")
    else:
        result = C.compare_models(config, dtype, device, lm=family == "TransformerLM", train=True, scenario="padding")
    assert_parity(result, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lm", [True, False], ids=["TransformerLM", "Transformer"])
def test_capped_scores_in_training_mode(lm, dtype, device):
    """Gemma 2's soft cap on every attention's scores (self- and, in a Transformer, cross-attention) with dropout on
    the probabilities: torch's explicit path (SDPA has no cap) drops the units the NumPy side dropped."""
    config = nt.TransformerConfig(**SMALL, dropout=0.2, norm_first=True, attn_softcap=0.7, attention_scale=0.9)
    result = C.compare_models(config, dtype, device, lm=lm, train=True, scenario="padding")
    assert_parity(result, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shared_norm", [False, True], ids=["GPT-NeoX", "Phi-2"])
def test_parallel_residual_in_training_mode(shared_norm, dtype, device):
    """GPT-NeoX's parallel layer (and Phi-2's block of one norm) with dropout on every site (attention probabilities,
    both sublayers' outputs, the embeddings, the feed-forward's hidden units): the same units dropped on both sides."""
    config = nt.TransformerConfig(
        **SMALL, dropout=0.2, norm_first=True, parallel_residual=True, positional="rope", rotary_dim=2,
        shared_norm=shared_norm,
    )  # fmt: skip
    result = C.compare_models(config, dtype, device, lm=True, train=True, scenario="padding")
    assert_parity(result, dtype)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(parallel_residual=True), "needs norm_first=True"),
        (dict(positional="rope", rotary_dim=3), "must be even"),
        (dict(positional="rope", rotary_dim=6), "at most the head size 4"),
        (dict(positional="rope", rotary_dim=0), ">= 2"),
        (dict(shared_norm=True, norm_first=True), "shared_norm=True is the parallel block's one norm"),
        (dict(input_norm=False, norm_first=True), "input_norm=False .* needs sandwich_norm=True"),
        (dict(qk_norm_projection=True), "qk_norm_projection=True .* needs qk_norm=True"),
        (dict(positional="rope", rope_layers=(True,)), "rope_layers must list one entry per layer"),
        (dict(rope_layers=(True, False)), "needs positional='rope'"),
    ],
)
def test_bad_parallel_residual_and_rotary_dim_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        nt.TransformerConfig(**SMALL, **fields)


@pytest.mark.parametrize("side", ["numpy", "torch"])
@pytest.mark.parametrize("model", ["Transformer", "EncoderModel"])
def test_parallel_residual_is_a_decoder_only_layer(model, side):
    config = nt.TransformerConfig(**SMALL, norm_first=True, parallel_residual=True)
    with pytest.raises(ValueError, match="parallel_residual=True is a decoder-only layer"):
        getattr(nt if side == "numpy" else tt, model)(config)


# ----------------------------------------------------------------------------------------------
# State-dict names and shapes.


def torch_shapes(model) -> dict:
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def family_shapes(numpy_class, config) -> dict:
    """numpy_transformer.parameter_shapes for the family of numpy_class."""
    return parameter_shapes(
        config, decoder_only=numpy_class is nt.TransformerLM, encoder_only=numpy_class is nt.EncoderModel
    )


@pytest.mark.parametrize(
    ("numpy_class", "torch_class", "config"),
    [
        *[(nt.EncoderModel, tt.EncoderModel, c) for c in ENCODER_CONFIGS.values()],
        *[(nt.Transformer, tt.Transformer, c) for c in SEQ2SEQ_CONFIGS.values()],
        *[(nt.TransformerLM, tt.TransformerLM, c) for c in LM_CONFIGS.values()],
    ],
)
def test_state_dict_names_and_shapes_agree(numpy_class, torch_class, config):
    """parameter_shapes, the NumPy model's state_dict() and the torch model's: the same keys, in the same
    order, with the same shapes."""
    ours = [(k, v.shape) for k, v in numpy_class(config).state_dict().items()]
    assert ours == list(torch_shapes(torch_class(config)).items())
    assert ours == list(family_shapes(numpy_class, config).items())


def llama_config(**overrides) -> nt.TransformerConfig:
    values = dict(
        src_vocab_size=19,
        tgt_vocab_size=17,
        d_model=16,
        n_heads=4,
        n_kv_heads=2,
        d_ff=24,
        n_encoder_layers=1,
        n_decoder_layers=2,
        norm_first=True,
        norm="rms",
        positional="rope",
        activation="silu",
        gated_ffn=True,
        bias=False,
        output_bias=False,
        pad_id=None,
    )
    return nt.TransformerConfig(**(values | overrides))


# One Llama decoder layer, written out by hand: d_model 16, 4 query heads of 4, 2 K/V heads (width 8), d_ff 24;
# RMSNorm weights only, no linear biases, the gate before the up (linear1) and down (linear2) projections.
LLAMA_LAYER = [
    ("self_attn.q_proj.weight", (16, 16)),
    ("self_attn.k_proj.weight", (8, 16)),
    ("self_attn.v_proj.weight", (8, 16)),
    ("self_attn.out_proj.weight", (16, 16)),
    ("self_attn_norm.weight", (16,)),
    ("ffn.gate.weight", (24, 16)),
    ("ffn.linear1.weight", (24, 16)),
    ("ffn.linear2.weight", (16, 24)),
    ("ffn_norm.weight", (16,)),
]
LLAMA_CROSS = [  # between self-attention and the feed-forward block, in a decoder with an encoder
    ("cross_attn.q_proj.weight", (16, 16)),
    ("cross_attn.k_proj.weight", (8, 16)),
    ("cross_attn.v_proj.weight", (8, 16)),
    ("cross_attn.out_proj.weight", (16, 16)),
    ("cross_attn_norm.weight", (16,)),
]


def test_llama_state_dict_written_out():
    """The Llama-style LM: no norm biases, no linear biases, ffn.gate.*, k_proj/v_proj n_kv_heads * Dh wide,
    no position table, no output_proj.bias; the same list from parameter_shapes and both models."""
    config = llama_config()
    expected = [("decoder.token_embedding.weight", (17, 16))]
    expected += [(f"decoder.layers.{i}.{name}", shape) for i in range(2) for name, shape in LLAMA_LAYER]
    expected += [("decoder.final_norm.weight", (16,)), ("output_proj.weight", (17, 16))]
    assert list(parameter_shapes(config, decoder_only=True).items()) == expected
    assert [(k, v.shape) for k, v in nt.TransformerLM(config).state_dict().items()] == expected
    assert list(torch_shapes(tt.TransformerLM(config)).items()) == expected
    # tied: the output projection reads decoder.token_embedding.weight, and stores nothing of its own
    tied = llama_config(tie_embeddings=True)
    assert list(torch_shapes(tt.TransformerLM(tied)).items()) == expected[:-1]
    assert [(k, v.shape) for k, v in nt.TransformerLM(tied).state_dict().items()] == expected[:-1]


def test_llama_options_in_the_other_families_written_out():
    """The same options in an encoder-decoder (cross-attention with 2 K/V heads too) and an EncoderModel."""
    config = llama_config()
    layer = LLAMA_LAYER[:5] + LLAMA_CROSS + LLAMA_LAYER[5:]
    encoder = [("encoder.token_embedding.weight", (19, 16))]
    encoder += [(f"encoder.layers.0.{name}", shape) for name, shape in LLAMA_LAYER]
    encoder += [("encoder.final_norm.weight", (16,))]
    expected = encoder + [("decoder.token_embedding.weight", (17, 16))]
    expected += [(f"decoder.layers.{i}.{name}", shape) for i in range(2) for name, shape in layer]
    expected += [("decoder.final_norm.weight", (16,)), ("output_proj.weight", (17, 16))]
    assert list(parameter_shapes(config).items()) == expected
    assert [(k, v.shape) for k, v in nt.Transformer(config).state_dict().items()] == expected
    assert list(torch_shapes(tt.Transformer(config)).items()) == expected
    assert list(parameter_shapes(config, encoder_only=True).items()) == encoder
    assert [(k, v.shape) for k, v in nt.EncoderModel(config).state_dict().items()] == encoder
    assert list(torch_shapes(tt.EncoderModel(config)).items()) == encoder


def test_new_keys():
    D = SMALL["d_model"]
    bert = nt.EncoderModel(ENCODER_CONFIGS["BERT: post-norm gelu learned token-types embedding-norm"]).params
    assert all(k.startswith("encoder.") for k in bert)
    assert bert["encoder.token_type_embedding.weight"].shape == (2, D)
    assert bert["encoder.embedding_norm.weight"].shape == bert["encoder.embedding_norm.bias"].shape == (D,)
    assert bert["encoder.token_embedding.weight"].shape == (SMALL["src_vocab_size"], D)
    assert not any(k.startswith(("decoder.", "output_proj.")) or "final_norm" in k for k in bert)

    bart = nt.Transformer(SEQ2SEQ_CONFIGS["BART: learned, embedding norm, gelu, shared and tied"]).params
    assert "encoder.token_embedding.weight" not in bart and "output_proj.weight" not in bart
    assert bart["decoder.token_embedding.weight"].shape == (13, D)
    for stack in ("encoder", "decoder"):
        assert bart[f"{stack}.embedding_norm.weight"].shape == (D,)
    assert "encoder.token_type_embedding.weight" not in bart and "decoder.token_type_embedding.weight" not in bart

    typed = parameter_shapes(SEQ2SEQ_CONFIGS["pre-norm, token types in the encoder, embedding norm, shared untied"])
    assert typed["encoder.token_type_embedding.weight"] == (2, D)
    assert "decoder.token_type_embedding.weight" not in typed  # token types belong to the encoder only
    assert "output_proj.weight" in typed and "encoder.token_embedding.weight" not in typed

    # share_embeddings means nothing without both stacks: an EncoderModel or an LM keeps its own table.
    shared = nt.TransformerConfig(**SHARED, share_embeddings=True)
    assert "encoder.token_embedding.weight" in parameter_shapes(shared, encoder_only=True)
    assert "decoder.token_embedding.weight" in parameter_shapes(shared, decoder_only=True)


# ----------------------------------------------------------------------------------------------
# Token types: defaults and errors.


def test_token_types_default_to_zero_on_both_sides():
    config = ENCODER_CONFIGS["BERT: post-norm gelu learned token-types embedding-norm"]
    model = nt.EncoderModel(config, seed=1).eval()
    ids = np.random.default_rng(0).integers(3, config.src_vocab_size, size=(2, 5))
    zeros = np.zeros_like(ids)
    np.testing.assert_array_equal(model.forward(ids), model.forward(ids, zeros))
    assert np.abs(model.forward(ids, np.ones_like(ids)) - model.forward(ids)).max() > 1e-3  # the types count
    twin = tt.EncoderModel(config).double().eval()
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    with torch.no_grad():
        t_ids = torch.from_numpy(ids)
        torch.testing.assert_close(twin(t_ids), twin(t_ids, torch.zeros_like(t_ids)), rtol=0, atol=0)


def test_bad_token_type_ids_are_rejected_on_both_sides():
    typed = ENCODER_CONFIGS["BERT: post-norm gelu learned token-types embedding-norm"]
    untyped = ENCODER_CONFIGS["post-norm gelu_tanh no types, pad_id None"]
    ids = np.full((2, 4), 5)
    cases = [  # (config, token_type_ids, error, message)
        (typed, np.zeros((2, 4)), TypeError, "token_type_ids must be an integer"),
        (typed, np.zeros((2, 3), dtype=np.int64), ValueError, r"shape of ids \(2, 4\)"),
        (typed, np.zeros((1, 4), dtype=np.int64), ValueError, r"shape of ids \(2, 4\)"),
        (typed, np.full((2, 4), 2), ValueError, r"token_type_ids must hold .*\[0, 2\)"),
        (typed, np.full((2, 4), -1), ValueError, r"token_type_ids must hold .*\[0, 2\)"),
        (untyped, np.zeros((2, 4), dtype=np.int64), ValueError, "type_vocab_size=0"),
    ]
    for config, types, error, message in cases:
        with pytest.raises(error, match=message):
            nt.EncoderModel(config).forward(ids, types)
        with pytest.raises(error, match=message):
            tt.EncoderModel(config)(torch.from_numpy(ids), torch.from_numpy(types))


def test_encoder_model_input_errors():
    config = ENCODER_CONFIGS["pre-norm relu split-sinusoids 3 token-types"]
    model = nt.EncoderModel(config)
    with pytest.raises(ValueError, match="backward called before forward"):
        model.backward(np.zeros((1, 2, config.d_model)))
    hidden = model.forward(np.array([[3, 4]]))
    assert hidden.shape == (1, 2, config.d_model) and hidden.dtype == np.float64
    with pytest.raises(ValueError, match=r"dhidden must have shape \(1, 2, 16\)"):
        model.backward(np.zeros((1, 3, config.d_model)))
    with pytest.raises(TypeError, match="dhidden must have dtype float64"):
        model.backward(np.zeros((1, 2, config.d_model), dtype=np.float32))
    with pytest.raises(ValueError, match=r"ids must hold ids in \[0, 13\)"):
        model.forward(np.array([[3, 13]]))
    with pytest.raises(ValueError, match="ids"):
        tt.EncoderModel(config)(torch.tensor([[3, 13]]))


# ----------------------------------------------------------------------------------------------
# What is masked.


def test_pad_id_none_masks_nothing():
    """With pad_id None, id 0 is a token like any other: every attention row sums to one over all keys,
    and the model equals one whose pad_id names an id that does not occur."""
    config = nt.TransformerConfig(**SMALL, pad_id=None)
    elsewhere = nt.TransformerConfig(**SMALL, pad_id=12)  # 12 is not in the ids below
    rng = np.random.default_rng(3)
    src = rng.integers(0, 12, size=(2, 6))
    tgt = rng.integers(0, 12, size=(2, 5))
    src[:, -2:], tgt[:, 0], tgt[1, -2:] = 0, 0, 0  # where padding with pad_id 0 would be
    for np_class, inputs in ((nt.Transformer, (src, tgt)), (nt.TransformerLM, (tgt,)), (nt.EncoderModel, (src,))):
        model = np_class(config, seed=2).eval()
        out = model.forward(*inputs)
        for name, probs in model.attention_maps().items():
            np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-13)  # no row is short of a key
            if name.startswith("decoder") and name.endswith("self_attn"):
                assert np.all(probs[..., 0] > 0.0), name  # every query attends to key 0, which holds id 0
            else:
                assert np.all(probs[..., -2:] > 0.0), name  # the source's trailing 0s are attended to
        other = np_class(elsewhere, seed=2).eval()
        other.load_state_dict(model.state_dict())
        np.testing.assert_array_equal(other.forward(*inputs), out)


def test_decoder_reads_a_pad_start_token_as_a_token(device):
    """Marian starts decoding from pad_id. The decoder's self-attention masks only the future, so the
    logits equal those of the same weights with no padding token at all (an unmasked decoder), on both
    sides; the source has no padding, so nothing else differs."""
    config = nt.TransformerConfig(**SMALL, bos_id=0)  # bos_id == pad_id == 0, Marian's decoder start
    unmasked = nt.TransformerConfig(**SMALL, bos_id=0, pad_id=None)
    rng = np.random.default_rng(4)
    src = rng.integers(3, 13, size=(2, 6))
    tgt = rng.integers(3, 17, size=(2, 5))
    tgt[:, 0] = 0  # the start token is the pad id
    tgt[1, -2:] = 0  # and trailing target padding, which causality hides from the real positions
    model = numpy_model(config, lm=False)
    reference = nt.Transformer(unmasked).eval()
    reference.load_state_dict(model.state_dict())
    logits = model.eval().forward(src, tgt)
    np.testing.assert_array_equal(logits, reference.forward(src, tgt))
    for i in range(config.n_decoder_layers):
        np.testing.assert_allclose(model.attention_maps()[f"decoder.layers.{i}.self_attn"][:, :, 0, 0], 1.0)
    twin = torch_twin(model, device)
    with torch.no_grad():
        t_logits = twin(torch.from_numpy(src).to(device), torch.from_numpy(tgt).to(device))
    diff, err = C.relative_errors({"logits": (logits, C.to_numpy(t_logits))}, np.float64)["logits"]
    assert err <= 1e-10, f"relative error {err:.2e}"


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "recompute"])
def test_decoding_from_the_pad_id(use_cache, device):
    """Greedy and beam search from bos_id == pad_id (Marian): the same tokens on both sides, with and
    without the cache, every output starting with the pad id and never emitting it again."""
    config = nt.TransformerConfig(**{**SHARED, "max_len": 16}, bos_id=0, share_embeddings=True, tie_embeddings=True)
    model = numpy_model(config, lm=False)
    src = np.random.default_rng(5).integers(3, 13, size=(3, 6))
    src[1, 4:] = 0  # and source padding
    twin = torch_twin(model, device)
    t_src = torch.from_numpy(src).to(device)
    for decode_np, decode_t in (
        (
            lambda m, s: nd.generate(m, s, max_new_tokens=8, use_cache=use_cache),
            lambda m, s: td.generate(m, s, max_new_tokens=8, use_cache=use_cache),
        ),
        (
            lambda m, s: nd.generate(m, s, num_beams=3, max_new_tokens=8, length_penalty=0.6, use_cache=use_cache),
            lambda m, s: td.generate(m, s, num_beams=3, max_new_tokens=8, length_penalty=0.6, use_cache=use_cache),
        ),
    ):
        tokens = decode_np(model, src)
        np.testing.assert_array_equal(tokens, decode_t(twin, t_src).cpu().numpy())
        assert np.all(tokens[:, 0] == 0)
        generated = tokens[:, 1:]
        for row in generated:
            eos = np.flatnonzero(row == config.eos_id)
            real = row if eos.size == 0 else row[: eos[0]]
            assert np.all(real != 0), row  # pad is never generated
    np.testing.assert_array_equal(
        nd.generate(model, src, max_new_tokens=8, use_cache=True),
        nd.generate(model, src, max_new_tokens=8, use_cache=False),
    )


def test_lm_decoding_without_a_padding_token(device):
    """pad_id None (GPT-2): a prompt holding id 0 and no bos is taken as given; id 0 may be generated;
    a row that ends fills with eos_id. Both sides agree."""
    config = nt.TransformerConfig(**{**SMALL, "max_len": 16}, pad_id=None, positional="learned")
    model = numpy_model(config, lm=True)
    prompt = np.array([[0, 5, 6], [7, 0, 0], [3, 3, 9]])
    twin = torch_twin(model, device)
    for use_cache in (True, False):
        greedy = nd.generate(model, prompt, max_new_tokens=10, use_cache=use_cache)
        np.testing.assert_array_equal(greedy[:, :3], prompt)
        np.testing.assert_array_equal(
            greedy, td.generate(twin, torch.from_numpy(prompt).to(device), max_new_tokens=10, use_cache=use_cache).cpu()
        )
        beams = nd.generate(model, prompt, num_beams=3, max_new_tokens=10, length_penalty=1.0, use_cache=use_cache)
        np.testing.assert_array_equal(beams[:, :3], prompt)
        np.testing.assert_array_equal(
            beams,
            td.generate(
                twin,
                torch.from_numpy(prompt).to(device),
                num_beams=3,
                max_new_tokens=10,
                length_penalty=1.0,
                use_cache=use_cache,
            ).cpu(),
        )
    # No pad ban: the first step's choice is the argmax over the whole vocabulary, id 0 included.
    logits = model.eval().forward(prompt)[:, -1]
    np.testing.assert_array_equal(greedy[:, 3], logits.argmax(-1))
    for row in greedy:
        eos = np.flatnonzero(row[3:] == config.eos_id)
        if eos.size:
            assert np.all(row[3 + eos[0] :] == config.eos_id)


# ----------------------------------------------------------------------------------------------
# The embedding options one by one.


def test_split_sinusoids_are_marians():
    """Marian's table (transformers' MarianSinusoidalPositionalEmbedding, written out here in float64):
    angle[pos, j] = pos / 10000^(2 (j // 2) / D); sines of the even j first, then cosines of the odd j."""
    for d_model in (16, 7):
        angle = np.array([[pos / 10000 ** (2 * (j // 2) / d_model) for j in range(d_model)] for pos in range(12)])
        sentinel = (d_model + 1) // 2
        expected = np.empty((12, d_model))
        expected[:, :sentinel] = np.sin(angle[:, 0::2])
        expected[:, sentinel:] = np.cos(angle[:, 1::2])
        ours = nt.layers.sinusoidal_table(12, d_model, np.float64, "split")
        np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-15)
        theirs = tt.sinusoidal_table(12, d_model, torch.float64, layout="split").numpy()
        np.testing.assert_allclose(theirs, expected, rtol=0, atol=1e-15)
        # computed in float64, not through float32: far finer than float32's rounding
        assert np.abs(ours - expected.astype(np.float32)).max() > 1e-9
        assert nt.layers.sinusoidal_table(12, d_model, np.float32, "split").dtype == np.float32
    interleaved = nt.layers.sinusoidal_table(12, 16)
    np.testing.assert_array_equal(
        nt.layers.sinusoidal_table(12, 16, layout="split"), np.hstack([interleaved[:, 0::2], interleaved[:, 1::2]])
    )
    with pytest.raises(ValueError, match="layout"):
        nt.layers.sinusoidal_table(4, 4, layout="paired")


def test_embedding_norm_normalises_the_summed_embeddings():
    config = nt.TransformerConfig(**SMALL, embedding_norm=True, type_vocab_size=2, layer_norm_eps=1e-12)
    model = nt.EncoderModel(config, seed=3).eval()
    model.forward(np.array([[3, 4, 5, 6]]), np.array([[0, 0, 1, 1]]))
    x = model.activations()["encoder.embedding"]  # after the norm (weight one, bias zero at init)
    np.testing.assert_allclose(x.mean(-1), 0.0, atol=1e-14)
    np.testing.assert_allclose(x.var(-1), 1.0, rtol=1e-10)


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_shared_table_gradient_is_the_sum_of_every_use(tie):
    """share_embeddings: the gradient of the one table equals the encoder lookup's gradient plus the
    decoder lookup's (plus the tied projection's), taken from a twin with two equal tables."""
    shared = nt.TransformerConfig(**SHARED, share_embeddings=True, tie_embeddings=tie)
    separate = nt.TransformerConfig(**SHARED, tie_embeddings=tie)
    model = nt.Transformer(shared, seed=1).eval()
    twin = nt.Transformer(separate, seed=1).eval()
    state = model.state_dict()
    twin.load_state_dict(state | {"encoder.token_embedding.weight": state["decoder.token_embedding.weight"]})
    rng = np.random.default_rng(6)
    src, tgt = rng.integers(3, 13, size=(2, 6)), rng.integers(3, 13, size=(2, 5))
    dlogits = rng.standard_normal((2, 5, 13))
    for m in (model, twin):
        np.testing.assert_array_equal(model.forward(src, tgt), m.forward(src, tgt))
        m.zero_grad()
        m.backward(dlogits)
    g_enc, g_dec = twin.grads["encoder.token_embedding.weight"], twin.grads["decoder.token_embedding.weight"]
    assert np.abs(g_enc).max() > 0 and np.abs(g_dec).max() > 0
    np.testing.assert_allclose(model.grads["decoder.token_embedding.weight"], g_enc + g_dec, rtol=1e-13, atol=1e-15)


# ----------------------------------------------------------------------------------------------
# Checkpoints.


def test_encoder_model_checkpoints_load_into_either_side(tmp_path):
    config = ENCODER_CONFIGS["BERT: post-norm gelu learned token-types embedding-norm"]
    model = nt.EncoderModel(config, seed=7)
    ncp.save_checkpoint(tmp_path / "np.safetensors", model, metadata={"step": 3})
    again = ncp.load_checkpoint(tmp_path / "np.safetensors")
    assert isinstance(again, nt.EncoderModel)
    for k, v in model.params.items():
        np.testing.assert_array_equal(again.params[k], v)
    twin = tcp.load_checkpoint(tmp_path / "np.safetensors")
    assert isinstance(twin, tt.EncoderModel) and twin.encoder.token_type_embedding is not None
    tcp.save_checkpoint(tmp_path / "torch.safetensors", twin)
    back = nt.EncoderModel(config, seed=8)
    assert ncp.load_into(back, tmp_path / "torch.safetensors") == {}
    for k, v in model.params.items():
        np.testing.assert_array_equal(back.params[k], v)
    with pytest.raises(ValueError, match="holds a EncoderModel, cannot load into a Transformer"):
        ncp.load_into(nt.Transformer(config), tmp_path / "np.safetensors")


@pytest.mark.parametrize("dtype", DTYPES)
def test_scale_by_layer_and_ffn_bias_match(dtype, device):
    """attention_scale_by_layer (each stack's self-attention of layer i scaled by 1 / (i + 1), cross-attention not)
    and ffn_bias apart from bias (the attention's biases, none in the feed-forward), both sides alike; neither is
    ignored (each changes the outputs)."""
    config = nt.TransformerConfig(**SMALL, norm_first=True, attention_scale_by_layer=True, ffn_bias=False)
    assert "encoder.layers.0.ffn.linear1.bias" not in parameter_shapes(config)
    assert "encoder.layers.0.self_attn.out_proj.bias" in parameter_shapes(config)
    result = C.compare_models(config, dtype, device, scenario="padding")
    assert_parity(result, dtype)
    plain = C.compare_models(dataclasses.replace(config, attention_scale_by_layer=False), dtype, device)
    assert np.abs(result.outputs["logits"][0] - plain.outputs["logits"][0]).max() > 1e-3
