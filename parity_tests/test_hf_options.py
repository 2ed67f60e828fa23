"""Options transformers computes that the loaders once refused, each loaded and compared against transformers' own class
in float64 (outputs and every gradient): T5's d_kv with d_kv x heads != d_model (flan-t5-small's layout), BLOOM's and
Llama's pretraining_tp, the gelu_fast and quick_gelu activations, a base model's weights in the generation class
(BART), Qwen3-MoE's sliding window (every layer, as transformers 5), every family's window rule against transformers'
per-layer attention, Llama's and ModernBERT's mlp_bias apart from attention_bias, Qwen3-MoE's attention_bias, GPT-2's
scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn and scale_attn_weights, and EmbeddingGemma (Gemma3TextModel
with bidirectional attention) as an EncoderModel."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

import numpy_transformer as nt
import torch_transformer.hf as torch_hf
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


@pytest.mark.parametrize("side", SIDES)
def test_quick_gelu_is_read_from_hidden_act(side):
    """hidden_act "quick_gelu" (CLIP's x * sigmoid(1.702 x)) is an activation of TransformerConfig: a BERT that
    names it equals transformers' QuickGELUActivation model to float64's bar."""
    assert_exact(H.compare_hf("bert", np.float64, side, hidden_act="quick_gelu"))


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


# ----------------------------------------------------------------------------------------------
# Released configs once refused: Llama's mlp_bias apart from attention_bias (Llama-architecture conversions of other
# families: biases on q, k, v and o, none in the MLP), GPT-2's scale_attn_by_inverse_layer_idx and
# reorder_and_upcast_attn (the Stanford CRFM GPT-2 runs) and scale_attn_weights false.

OPTIONS = {  # name: (family, transformers config overrides)
    "llama attention_bias without mlp_bias": ("llama", {"attention_bias": True, "mlp_bias": False}),
    "llama mlp_bias without attention_bias": ("llama", {"attention_bias": False, "mlp_bias": True}),
    "qwen3 attention_bias (its MLP has none)": ("qwen3", {"attention_bias": True}),
    "qwen3_moe attention_bias (its router, experts and dense MLP have none)": ("qwen3_moe", {"attention_bias": True}),
    "gpt2 scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn": (
        "gpt2", {"scale_attn_by_inverse_layer_idx": True, "reorder_and_upcast_attn": True},
    ),
    "gpt2 scale_attn_weights false, by inverse layer": (
        "gpt2", {"scale_attn_weights": False, "scale_attn_by_inverse_layer_idx": True},
    ),
}  # fmt: skip


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("case", OPTIONS)
def test_released_options_match_transformers(case, side):
    family, overrides = OPTIONS[case]
    assert_exact(H.compare_hf(family, np.float64, side, **overrides))


@pytest.mark.parametrize("case", OPTIONS)
def test_released_options_change_the_model_and_are_written_back(case, tmp_path):
    """Each option changes the outputs (the comparison above could not pass with it ignored) and hf.save writes
    config.json's keys back as read; the biases are where transformers has them."""
    family, overrides = OPTIONS[case]
    H.build_tiny(family, tmp_path / "a", **overrides)
    model = numpy_hf.load(tmp_path / "a")
    numpy_hf.save(model, tmp_path / "b")
    written = json.loads((tmp_path / "b" / "config.json").read_text())
    assert {key: written.get(key) for key in overrides} == overrides
    assert numpy_hf.load(tmp_path / "b").config == model.config
    H.build_tiny(family, tmp_path / "plain")
    plain = numpy_hf.load(tmp_path / "plain")
    ids, _ = H.make_inputs(family)
    if family in ("llama", "qwen3", "qwen3_moe"):  # the plain model has no biases: those in common, the others 0.5
        mine = {name: value for name, value in model.params.items() if not name.endswith(".bias")}
        attention = {"q_proj", "k_proj", "v_proj", "out_proj"}
        biased = attention if overrides["attention_bias"] else {"gate", "linear1", "linear2"}
        assert {name.split(".")[-2] for name in model.params if name.endswith(".bias")} == biased
        model.load_state_dict(mine | {n: 0.5 * np.ones_like(v) for n, v in model.params.items() if n not in mine})
        plain.load_state_dict(mine)
    else:
        plain.load_state_dict(model.state_dict())
    assert np.abs(model.forward(ids) - plain.forward(ids)).max() > 1e-3


# ----------------------------------------------------------------------------------------------
# EmbeddingGemma: Gemma3TextModel with use_bidirectional_attention, an EncoderModel. Three layers (local, global,
# local), a window of 4 in the file (transformers keeps 4 // 2 + 1 = 3: |i - j| < 3 on the local layers), 9 tokens,
# a row padded on the right from position 6 (its real queries' band reaches the padding).

EMBEDDING_GEMMA = {
    "use_bidirectional_attention": True, "sliding_window": 4, "num_hidden_layers": 3,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"], "final_logit_softcapping": None,
}  # fmt: skip


def build_embedding_gemma(directory) -> None:
    """A tiny random Gemma3TextModel with bidirectional attention (weights redrawn as H.build_tiny draws them)."""
    torch.manual_seed(0)
    config = H.tiny_config("gemma3_text", **EMBEDDING_GEMMA)
    model = transformers.Gemma3TextModel(config).float().eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
            p.copy_(0.2 * noise if p.ndim == 1 else H.STD * noise)  # norm weights: the gain is 1 + w
    model.save_pretrained(directory)


def embedding_gemma_inputs():
    ids = np.random.default_rng(7).integers(3, H.TINY["gemma3_text"]["vocab_size"], size=(2, 9))
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    return np.where(mask == 1, ids, 0), mask


def run_embedding_gemma(model, side: str, ids, mask, upstream) -> tuple[np.ndarray, dict]:
    """Hidden states (B, T, D) and every parameter's gradient of sum(hidden * upstream), by transformers' names:
    transformers' Gemma3TextModel (side "transformers", its float32 islands in float64) or ours."""
    if side == "transformers":
        model.zero_grad(set_to_none=True)
        with H.gemma3_in_float64():
            out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state
            (out * torch.from_numpy(upstream)).sum().backward()
        return H.to_numpy(out), {name: H.to_numpy(p.grad) for name, p in model.named_parameters()}
    if side == "numpy":
        model.eval().zero_grad()
        out = model.forward(ids, attention_mask=mask)
        model.backward(upstream)
        return out, numpy_hf.to_hf(model, model.grads, tied=False)
    model.eval().zero_grad(set_to_none=True)
    out = model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    (out * torch.from_numpy(upstream)).sum().backward()
    grads = torch_hf.to_hf(model, {name: p.grad for name, p in model.named_parameters()}, tied=False)
    return H.to_numpy(out), {name: H.to_numpy(g) for name, g in grads.items()}


@pytest.mark.parametrize("side", SIDES)
def test_embedding_gemma_matches_transformers(side, tmp_path):
    """Loaded as an EncoderModel; its hidden states at the real positions and every gradient within 1e-10 of
    Gemma3TextModel's (float64, eager attention); hf.save writes a folder transformers reads back as the same model."""
    build_embedding_gemma(tmp_path / "a")
    theirs = transformers.Gemma3TextModel.from_pretrained(
        tmp_path / "a", dtype=torch.float64, attn_implementation="eager"
    ).eval()
    ours = H.load_ours(side, tmp_path / "a", np.float64)
    assert type(ours).__name__ == "EncoderModel" and ours.config.sliding_window == 4
    ids, mask = embedding_gemma_inputs()
    upstream = np.random.default_rng(1).standard_normal((*ids.shape, H.TINY["gemma3_text"]["hidden_size"]))
    upstream *= mask[..., None]  # padded positions: no token's hidden state
    theirs_out, theirs_grads = run_embedding_gemma(theirs, "transformers", ids, mask, upstream)
    ours_out, ours_grads = run_embedding_gemma(ours, side, ids, mask, upstream)
    real = mask.astype(bool)
    result = H.pair(ours_out[real], theirs_out[real], ours_grads, theirs_grads, "hidden")
    assert_exact(result)
    _, out_rel, _, grad_rel = C.worst(result, np.float64)
    assert out_rel <= 1e-12 and grad_rel <= 1e-10, (out_rel, grad_rel)
    (numpy_hf if side == "numpy" else torch_hf).save(ours, tmp_path / "b")
    written = json.loads((tmp_path / "b" / "config.json").read_text())
    assert written["architectures"] == ["Gemma3TextModel"] and written["use_bidirectional_attention"] is True
    again = transformers.Gemma3TextModel.from_pretrained(
        tmp_path / "b", dtype=torch.float64, attn_implementation="eager"
    ).eval()
    assert again.config.sliding_window == theirs.config.sliding_window
    assert np.array_equal(run_embedding_gemma(again, "transformers", ids, mask, upstream)[0], theirs_out)


def test_embedding_gemma_band_and_bidirection_matter(tmp_path):
    """The comparison above could not pass with the local layers' band ignored (every layer global) or read as the
    window itself (|i - j| < 4), nor against the same checkpoint run causally (use_bidirectional_attention false)."""
    build_embedding_gemma(tmp_path)
    ours = numpy_hf.load(tmp_path, dtype=np.float64)
    ids, mask = embedding_gemma_inputs()
    real = mask.astype(bool)
    out = ours.forward(ids, attention_mask=mask)[real]
    for window, kinds in ((None, None), (7, ours.config.layer_types)):  # 7 // 2 = 3: |i - j| <= 3
        other = nt.EncoderModel(dataclasses.replace(ours.config, sliding_window=window, layer_types=kinds))
        other.load_state_dict(ours.state_dict())
        assert np.abs(other.forward(ids, attention_mask=mask)[real] - out).max() > 1e-3
    path = tmp_path / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"use_bidirectional_attention": False}))
    causal = transformers.Gemma3TextModel.from_pretrained(tmp_path, dtype=torch.float64, attn_implementation="eager")
    upstream = np.zeros((*ids.shape, H.TINY["gemma3_text"]["hidden_size"]))
    causal_out, _ = run_embedding_gemma(causal.eval(), "transformers", ids, mask, upstream)
    assert np.abs(causal_out[real] - out).max() > 1e-3


@pytest.mark.parametrize("side", SIDES)
def test_gpt2_scaled_by_inverse_layer_decodes_as_generate(side, tmp_path):
    """Cached greedy decoding reads each layer's own scale too: equal to generate()."""
    prompts = np.random.default_rng(3).integers(3, H.TINY["gpt2"]["vocab_size"], size=(2, 5))
    overrides = OPTIONS["gpt2 scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn"][1]
    ours, theirs = H.greedy_pair("gpt2", side, prompts, 8, tmp_path, **overrides)
    np.testing.assert_array_equal(ours, theirs)


# gemma-2-2b's config.json as released (transformers 4.42's keys: a top-level rope_theta, hidden_act beside
# hidden_activation, cache_implementation), its sizes shrunk as hf_compare's tiny gemma-2-2b shape; the keys
# transformers' Gemma2 does not compute with are listed, every other key is read by the family's map
GEMMA2_2B_RELEASED = {
    "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
    "final_logit_softcapping": 30.0, "head_dim": 8, "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 72, "initializer_range": 0.02, "intermediate_size": 288,
    "max_position_embeddings": 32, "model_type": "gemma2", "num_attention_heads": 8, "num_hidden_layers": 2,
    "num_key_value_heads": 4, "pad_token_id": 0, "query_pre_attn_scalar": 8, "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0, "sliding_window": 3, "torch_dtype": "float32", "transformers_version": "4.42.4",
    "use_cache": True, "vocab_size": 40,
}  # fmt: skip
NOT_COMPUTED = {  # by transformers' Gemma2ForCausalLM (hidden_act: it reads hidden_activation)
    "architectures", "model_type", "cache_implementation", "hidden_act", "initializer_range", "torch_dtype",
    "transformers_version", "use_cache",
}  # fmt: skip


@pytest.mark.parametrize("side", SIDES)
def test_gemma2_released_config_json_reads_whole(side, tmp_path):
    """A checkpoint whose config.json is gemma-2-2b's as released (shrunk): every key it sets is either read by the
    gemma2 map or one transformers does not compute with; the model equals transformers' in float64, outputs and
    every gradient, with both released soft caps (50, 30) and the window of 3 in force."""
    from transformer_spec.families.gemma2 import GEMMA2_CONFIG

    read = {key.theirs for key in GEMMA2_CONFIG.keys} | set(GEMMA2_CONFIG.dropout)
    assert set(GEMMA2_2B_RELEASED) - read == NOT_COMPUTED
    H.build_tiny(
        "gemma2", tmp_path, **{k: GEMMA2_2B_RELEASED[k] for k in ("attn_logit_softcapping", "final_logit_softcapping")}
    )
    (tmp_path / "config.json").write_text(json.dumps(GEMMA2_2B_RELEASED))
    theirs = H.CLASSES["gemma2"].from_pretrained(tmp_path, dtype=torch.float64).eval()
    ours = H.load_ours(side, tmp_path, np.float64)
    assert (ours.config.attn_softcap, ours.config.logit_softcap, ours.config.sliding_window) == (50.0, 30.0, 3)
    assert ours.config.layer_types == ("sliding_attention", "full_attention") and ours.config.attention_scale is None
    ids, _ = H.make_inputs("gemma2")
    upstream = np.random.default_rng(5).standard_normal((*ids.shape, 40))
    with H.patch_for("gemma2", np.float64):
        theirs_out, theirs_grads = H.run_transformers(theirs, "gemma2", ids, None, upstream)
    ours_out, ours_grads = (H.run_numpy if side == "numpy" else H.run_torch)(ours, "gemma2", ids, None, upstream)
    assert_exact(H.pair(ours_out, theirs_out, ours_grads, theirs_grads, "logits"))


def test_gemma2_soft_caps_bend_the_tiny_model(tmp_path):
    """The tiny gemma2 checkpoint's caps (scores 2, logits 3) are reached: without either one, our logits leave
    transformers' by far more than the float64 bar, so the comparisons above would see a cap computed wrongly."""
    import dataclasses

    import numpy_transformer as nt

    H.build_tiny("gemma2", tmp_path)
    theirs = H.CLASSES["gemma2"].from_pretrained(tmp_path, dtype=torch.float64).eval()
    ours = numpy_hf.load(tmp_path, dtype=np.float64).eval()
    ids, _ = H.make_inputs("gemma2")
    with H.patch_for("gemma2", np.float64), torch.no_grad():
        reference = H.transformers_forward(theirs, "gemma2", ids).numpy()
    assert np.abs(ours.forward(ids) - reference).max() < 1e-12 * np.abs(reference).max()
    for cap in ("attn_softcap", "logit_softcap"):
        uncapped = nt.TransformerLM(dataclasses.replace(ours.config, **{cap: None}), dtype=np.float64).eval()
        uncapped.load_state_dict(ours.state_dict())
        assert np.abs(uncapped.forward(ids) - reference).max() > 0.05 * np.abs(reference).max(), cap


# phi-2's config.json as released (transformers 4.37's keys: a top-level rope_theta and partial_rotary_factor,
# resid_pdrop 0.1), its sizes shrunk as hf_compare's tiny phi-2 shape (heads of 10 features, 4 of them turned); the
# keys transformers' Phi does not compute with are listed, every other key is read by the family's map
PHI2_RELEASED = {
    "_name_or_path": "microsoft/phi-2", "architectures": ["PhiForCausalLM"], "attention_dropout": 0.0,
    "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 2, "hidden_act": "gelu_new", "hidden_size": 40,
    "initializer_range": 0.02, "intermediate_size": 160, "layer_norm_eps": 1e-05, "max_position_embeddings": 32,
    "model_type": "phi", "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 4,
    "partial_rotary_factor": 0.4, "qk_layernorm": False, "resid_pdrop": 0.1, "rope_scaling": None,
    "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.37.0",
    "use_cache": True, "vocab_size": 40,
}  # fmt: skip
PHI_NOT_COMPUTED = {
    "_name_or_path", "architectures", "model_type", "initializer_range", "torch_dtype", "transformers_version",
    "use_cache",
}  # fmt: skip


@pytest.mark.parametrize("side", SIDES)
def test_phi2_released_config_json_reads_whole(side, tmp_path):
    """A checkpoint whose config.json is phi-2's as released (shrunk): every key it sets is read by the phi map (or
    computed by no layer of transformers' class); in evaluation mode the model equals transformers' in float64,
    outputs and every gradient, and its dropout rates are the file's."""
    from transformer_spec.families.phi import PHI_CONFIG

    # partial_rotary_factor at the top level: read by the rope_parameters key's reader (transformers moves it there)
    read = {key.theirs for key in PHI_CONFIG.keys} | set(PHI_CONFIG.dropout) | {"partial_rotary_factor"}
    assert set(PHI2_RELEASED) - read == PHI_NOT_COMPUTED
    H.build_tiny("phi", tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(PHI2_RELEASED))
    theirs = H.CLASSES["phi"].from_pretrained(tmp_path, dtype=torch.float64).eval()
    ours = H.load_ours(side, tmp_path, np.float64)
    assert ours.config.rotary_dim == 4 and ours.config.shared_norm and ours.config.residual_dropout == 0.1
    ids, _ = H.make_inputs("phi")
    upstream = np.random.default_rng(6).standard_normal((*ids.shape, 40))
    with H.patch_for("phi", np.float64):
        theirs_out, theirs_grads = H.run_transformers(theirs, "phi", ids, None, upstream)
    ours_out, ours_grads = (H.run_numpy if side == "numpy" else H.run_torch)(ours, "phi", ids, None, upstream)
    assert_exact(H.pair(ours_out, theirs_out, ours_grads, theirs_grads, "logits"))


# OLMo-2-0425-1B's and SmolLM3-3B's config.json as released (their keys and option values as written by the
# transformers of their release: OLMo 2 16 of 16 heads, rope_theta 500000, eps 1e-6, untied; SmolLM3 GQA 16 / 4, a
# NoPE layer every 4th of 36 listed in no_rope_layers, rope_theta 5e6, tied, pretraining_tp 2, max_window_layers
# beside use_sliding_window false), their sizes shrunk as hf_compare's tiny shapes (SmolLM3: 4 layers, the 4th NoPE)
OLMO2_1B_RELEASED = {
    "architectures": ["Olmo2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": None,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 128,
    "max_position_embeddings": 32, "model_type": "olmo2", "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 4, "pad_token_id": 0, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 500000,
    "tie_word_embeddings": False, "torch_dtype": "float32", "transformers_version": "4.52.0.dev0", "use_cache": True,
    "vocab_size": 40,
}  # fmt: skip
SMOLLM3_3B_RELEASED = {
    "architectures": ["SmolLM3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": None,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 172,
    "max_position_embeddings": 32, "max_window_layers": 28, "mlp_bias": False, "model_type": "smollm3",
    "no_rope_layer_interval": 4, "no_rope_layers": [1, 1, 1, 0], "num_attention_heads": 4, "num_hidden_layers": 4,
    "num_key_value_heads": 1, "pad_token_id": 0, "pretraining_tp": 2, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 5000000.0, "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.54.0.dev0", "use_cache": False, "use_sliding_window": False, "vocab_size": 40,
}  # fmt: skip
RELEASED_NOT_COMPUTED = {  # keys transformers' classes do not compute with
    "architectures", "model_type", "initializer_range", "torch_dtype", "transformers_version", "use_cache",
}  # fmt: skip
RELEASED_2026 = {"olmo2": OLMO2_1B_RELEASED, "smollm3": SMOLLM3_3B_RELEASED}


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("family", list(RELEASED_2026))
def test_olmo2_and_smollm3_released_config_json_reads_whole(family, side, tmp_path):
    """A checkpoint whose config.json is OLMo-2-0425-1B's or SmolLM3-3B's as released (shrunk): every key it sets is
    read by the family's map (or computed by no layer of transformers' class); the model equals transformers' in
    float64, outputs and every gradient (random upstream gradients)."""
    from transformer_spec.families.olmo2 import OLMO2_CONFIG
    from transformer_spec.families.smollm3 import SMOLLM3_CONFIG

    released = RELEASED_2026[family]
    config_map = {"olmo2": OLMO2_CONFIG, "smollm3": SMOLLM3_CONFIG}[family]
    read = {key.theirs for key in config_map.keys} | set(config_map.dropout)
    assert set(released) - read == RELEASED_NOT_COMPUTED
    H.build_tiny(family, tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(released))
    theirs = H.CLASSES[family].from_pretrained(tmp_path, dtype=torch.float64).eval()
    ours = H.load_ours(side, tmp_path, np.float64)
    if family == "smollm3":
        assert ours.config.rope_layers == (True, True, True, False) and ours.config.tie_embeddings
    else:
        assert ours.config.qk_norm_projection and not ours.config.input_norm and ours.config.sandwich_norm
    ids, _ = H.make_inputs(family)
    upstream = np.random.default_rng(7).standard_normal((*ids.shape, 40))
    with H.patch_for(family, np.float64):
        theirs_out, theirs_grads = H.run_transformers(theirs, family, ids, None, upstream)
    ours_out, ours_grads = (H.run_numpy if side == "numpy" else H.run_torch)(ours, family, ids, None, upstream)
    assert_exact(H.pair(ours_out, theirs_out, ours_grads, theirs_grads, "logits"))


def test_smollm3_nope_layer_bends_the_tiny_model(tmp_path):
    """The tiny SmolLM3's NoPE layer matters: turning it by RoPE too moves our logits far past the float64 bar, so
    the comparisons above would see a NoPE layer that rotated."""
    H.build_tiny("smollm3", tmp_path)
    ours = numpy_hf.load(tmp_path, dtype=np.float64).eval()
    assert ours.config.rope_layers == (True, True, True, False)
    ids, _ = H.make_inputs("smollm3")
    reference = ours.forward(ids)
    rotary = nt.TransformerLM(dataclasses.replace(ours.config, rope_layers=None), dtype=np.float64).eval()
    rotary.load_state_dict(ours.state_dict())
    assert np.abs(rotary.forward(ids) - reference).max() > 0.01 * np.abs(reference).max()


@pytest.mark.parametrize(
    ("family", "change", "named"),
    [
        ("smollm3", {"use_sliding_window": True, "sliding_window": 3}, "use_sliding_window"),
        ("smollm3", {"no_rope_layers": [1, 0]}, "no_rope_layers"),
        ("smollm3", {"no_rope_layers": [1, 1, 2, 0]}, "no_rope_layers"),
        ("smollm3", {"layer_types": ["full_attention"] * 3 + ["sliding_attention"]}, "layer_types"),
        ("smollm3", {"head_dim": 16}, "head_dim"),
        ("olmo2", {"head_dim": 16}, "head_dim"),
        ("olmo2", {"hidden_act": "tanh"}, "hidden_act"),
    ],
)
def test_olmo2_and_smollm3_refuse_what_they_do_not_compute(family, change, named):
    """A released config.json's value that is not computed here is refused by name, not ignored."""
    with pytest.raises(ValueError, match=named):
        FAMILIES[family].from_hf(RELEASED_2026[family] | change)
