"""Scaled RoPE (linear, dynamic NTK, YaRN, LongRoPE, Llama 3) against transformers' own classes: tiny random
checkpoints of the families that ship each kind, both sides, float64, outputs and every gradient (a random upstream
gradient), at lengths on both sides of the one the kind switches at; the inverse frequencies of real-shaped configs
against transformers' own initialisers; greedy decoding against generate() across the switch; config.json read and
written back as the file spells it."""

from __future__ import annotations

import copy
import dataclasses
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from transformers import modeling_rope_utils

import torch_transformer.hf as torch_hf
from numpy_transformer import hf as numpy_hf
from numpy_transformer.attention import rope_frequencies
from numpy_transformer.decoding import generate as numpy_generate
from parity_tests import components as C
from parity_tests import hf_compare as H
from parity_tests import modernbert_compare as M
from torch_transformer.decoding import generate as torch_generate
from torch_transformer.layers import rope_inv_freq
from transformer_spec.config import RopeScaling, TransformerConfig
from transformer_spec.families import FAMILIES

pytestmark = pytest.mark.filterwarnings("ignore")

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}
LLAMA3 = {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}  # fmt: skip  # head 8 at base 500: wavelengths 6.3 (kept), 30 (blended), 140 and 660 (divided by 8)
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0, 1.3, 1.7, 2.2], "long_factor": [1.5, 3.0, 6.0, 11.0]}
# GPT-NeoX at its default partial rotary 0.25 of a head of 32: RoPE on 8 features, 4 frequencies (LLAMA3's and
# LONGROPE's), the other 24 unturned
NEOX = {"hidden_size": 64, "num_attention_heads": 2, "rotary_pct": 0.25}
NEOX_DYNAMIC = NEOX | {"max_position_embeddings": 16, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}
NEOX_LONGROPE = NEOX | {"rope_scaling": LONGROPE | {"original_max_position_embeddings": 16}}
# (family, transformers config overrides (the RoPE as config.json spells it), where config.json holds it, length)
CASES = {
    "llama llama3": ("llama", {"rope_scaling": LLAMA3}, "rope_scaling", 12),
    "llama llama3 in rope_parameters": ("llama", {"rope_scaling": LLAMA3}, "rope_parameters", 12),
    "llama linear 4": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, "rope_scaling", 12),
    "llama dynamic 2, T 20 > max 16": (
        "llama", {"max_position_embeddings": 16, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
        "rope_scaling", 20,
    ),
    "llama dynamic 2, T 12 <= max 16": (
        "llama", {"max_position_embeddings": 16, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
        "rope_scaling", 12,
    ),
    "llama yarn mscale 0.707 / 1": (
        "llama", {"max_position_embeddings": 2048, "rope_scaling": YARN | {"mscale": 0.707, "mscale_all_dim": 1.0}},
        "rope_parameters", 12,
    ),
    "qwen2 yarn (type, untruncated)": (
        "qwen2", {"max_position_embeddings": 2048, "rope_scaling": {
            "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512, "truncate": False,
        }}, "rope_scaling", 12,
    ),
    "qwen3 yarn": ("qwen3", {"max_position_embeddings": 2048, "rope_scaling": YARN}, "rope_scaling", 12),
    "mistral dynamic 3, T 20 > max 16": (
        "mistral", {"max_position_embeddings": 16, "rope_scaling": {"rope_type": "dynamic", "factor": 3.0}},
        "rope_scaling", 20,
    ),
    "phi3 longrope, T 20 > original 16": (
        "phi3", {"original_max_position_embeddings": 16, "rope_scaling": LONGROPE}, "rope_scaling", 20,
    ),
    "phi3 longrope, T 12 <= original 16": (
        "phi3", {"original_max_position_embeddings": 16, "rope_scaling": LONGROPE}, "rope_scaling", 12,
    ),
    "phi3 longrope partial rotary 0.5, T 20": (
        "phi3",
        {
            "original_max_position_embeddings": 16, "partial_rotary_factor": 0.5,
            "rope_scaling": {"rope_type": "longrope", "short_factor": [1.0, 1.5], "long_factor": [2.0, 7.0]},
        },
        "rope_scaling", 20,
    ),
    "gpt_neox linear 4": ("gpt_neox", NEOX | {"rope_scaling": {"type": "linear", "factor": 4.0}}, "rope_scaling", 12),
    "gpt_neox dynamic 2, T 20 > max 16": ("gpt_neox", NEOX_DYNAMIC, "rope_parameters", 20),
    "gpt_neox dynamic 2, T 12 <= max 16": ("gpt_neox", NEOX_DYNAMIC, "rope_scaling", 12),
    "gpt_neox yarn": ("gpt_neox", NEOX | {"max_position_embeddings": 2048, "rope_scaling": YARN}, "rope_scaling", 12),
    "gpt_neox longrope, T 20 > original 16": ("gpt_neox", NEOX_LONGROPE, "rope_scaling", 20),
    "gpt_neox longrope, T 12 <= original 16": ("gpt_neox", NEOX_LONGROPE, "rope_parameters", 12),
    "gpt_neox llama3": ("gpt_neox", NEOX | {"rope_scaling": LLAMA3}, "rope_parameters", 12),
    "gemma3 linear 8 on the global layers": (
        "gemma3_text", {"rope_scaling": {"rope_type": "linear", "factor": 8.0}}, "rope_scaling", 12,
    ),
    "gemma3 linear 8 in rope_parameters": (
        "gemma3_text", {"rope_scaling": {"rope_type": "linear", "factor": 8.0}}, "rope_parameters", 12,
    ),
}  # fmt: skip
SIDES = ("numpy", "torch")


def spell(directory, family: str, rope: dict, written_as: str) -> dict:
    """Rewrite the saved config.json's RoPE as a released file spells it: `rope_scaling` (an older "type" kept
    where the case uses one) with rope_theta (and Gemma 3's rope_local_base_freq, Phi-3's partial_rotary_factor) at
    the top level (GPT-NeoX's rotary_emb_base and rotary_pct), no rope_parameters; or in rope_parameters (as
    transformers 5 saves it). Returns config.json."""
    path = Path(directory) / "config.json"
    c = json.loads(path.read_text())
    params = c.pop("rope_parameters")
    if written_as == "rope_scaling":
        if family == "gemma3_text":
            c["rope_theta"] = params["full_attention"]["rope_theta"]
            c["rope_local_base_freq"] = params["sliding_attention"]["rope_theta"]
        elif family == "gpt_neox":
            c["rotary_emb_base"], c["rotary_pct"] = params["rope_theta"], params["partial_rotary_factor"]
        else:
            c["rope_theta"] = params["rope_theta"]
            if params.get("partial_rotary_factor", 1.0) != 1.0:
                c["partial_rotary_factor"] = params["partial_rotary_factor"]
        c["rope_scaling"] = rope
    else:
        c["rope_parameters"] = params
    path.write_text(json.dumps(c))
    return c


def fresh(family: str, overrides: dict) -> dict:
    """A deep copy of a case's overrides, with Gemma 3's nested rope_parameters copied too: transformers' configs
    write into the RoPE objects they are given (setdefault, update), which must not reach the shared tables."""
    own = copy.deepcopy(overrides)
    if "rope_parameters" in H.TINY[family]:
        own.setdefault("rope_parameters", copy.deepcopy(H.TINY[family]["rope_parameters"]))
    return own


def build(family: str, directory, overrides: dict, written_as: str, seed: int = 0) -> dict:
    """The tiny checkpoint of a case in `directory`, its config.json spelled as the case says; returns config.json."""
    H.build_tiny(family, directory, seed, **fresh(family, overrides))
    return spell(directory, family, copy.deepcopy(overrides["rope_scaling"]), written_as)


def compare_scaled(case: str, side: str, seed: int = 0):
    """(Result, our model) of a case: the checkpoint rewritten as the case spells it, read by both transformers (its
    class, float64, the float32 islands patched) and us."""
    family, overrides, written_as, length = CASES[case]
    with tempfile.TemporaryDirectory() as directory:
        build(family, directory, overrides, written_as, seed)
        theirs = H.CLASSES[family].from_pretrained(directory, dtype=torch.float64).eval()
        ours = H.load_ours(side, directory, np.float64)
    ids, _ = H.make_inputs(family, seed, length=length)
    upstream = np.random.default_rng(seed + 1000).standard_normal((*ids.shape, H.TINY[family]["vocab_size"]))
    with H.patch_for(family, np.float64):
        theirs_out, theirs_grads = H.run_transformers(theirs, family, ids, None, upstream)
    run = H.run_numpy if side == "numpy" else H.run_torch
    ours_out, ours_grads = run(ours, family, ids, None, upstream)
    return H.pair(ours_out, theirs_out, ours_grads, theirs_grads, "logits"), ours


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("case", CASES)
def test_scaled_rope_matches_transformers(case, side):
    result, ours = compare_scaled(case, side)
    rope = CASES[case][1]["rope_scaling"]
    assert ours.config.rope_scaling.rope_type == rope.get("rope_type", rope.get("type"))
    assert not C.failures(result, np.float64), C.failures(result, np.float64)
    out_diff, out_rel, grad_diff, grad_rel = C.worst(result, np.float64)
    assert out_rel <= 1e-12 and grad_rel <= 1e-10, (out_rel, grad_rel)
    assert len(result.grads) > 10 and all(np.any(ours_grad) for ours_grad, _ in result.grads.values())


@pytest.mark.parametrize(
    "case",
    [
        "llama llama3",
        "phi3 longrope, T 20 > original 16",
        "llama dynamic 2, T 20 > max 16",
        "gpt_neox llama3",
        "gpt_neox longrope, T 20 > original 16",
        "gpt_neox dynamic 2, T 20 > max 16",
    ],
)
def test_the_scaling_changes_the_outputs(case):
    """The scaled model against the same checkpoint with plain RoPE: the comparison above could not pass with the
    scaling ignored."""
    family, overrides, _, length = CASES[case]
    with tempfile.TemporaryDirectory() as directory:
        build(family, directory, overrides, "rope_scaling")
        scaled = numpy_hf.load(directory, dtype=np.float64)
    plain = type(scaled)(dataclasses.replace(scaled.config, rope_scaling=None, max_len=length))  # room for T
    plain.load_state_dict(scaled.state_dict())
    ids, _ = H.make_inputs(family, 0, length=length)
    assert np.abs(scaled.forward(ids) - plain.forward(ids)).max() > 1e-3


# ----------------------------------------------------------------------------------------------
# Real-shaped RoPE configs: our inverse frequencies and attention factor (both sides) against transformers' own
# initialiser, run in float64 (H.rope_inits_in_float64) and as shipped (float32).

PHI35_SHORT = [1.0, 1.02, 1.03, 1.05, 1.05, 1.07, 1.1, 1.13, 1.18, 1.25, 1.3, 1.4] * 4  # 48 values, Phi-3.5's shape
PHI35_LONG = [1.08, 1.11, 1.14, 1.34, 1.59, 1.6, 1.62, 2.62, 3.23, 3.24, 3.25, 3.29] * 4
REAL = {  # name: (config class, config kwargs, sequence lengths)
    "Llama-3.2-1B llama3 32": (
        transformers.LlamaConfig,
        dict(
            hidden_size=2048, num_attention_heads=32, head_dim=64, max_position_embeddings=131072,
            rope_theta=500000.0, rope_scaling={
                "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        ),
        (8,),
    ),
    "Qwen2.5-7B yarn 4": (
        transformers.Qwen2Config,
        dict(
            hidden_size=3584, num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
            rope_theta=1000000.0,
            rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
        ),
        (8,),
    ),
    "Phi-3.5-mini longrope": (
        transformers.Phi3Config,
        dict(
            hidden_size=3072, num_attention_heads=32, max_position_embeddings=131072,
            original_max_position_embeddings=4096, rope_theta=10000.0,
            rope_scaling={"type": "longrope", "short_factor": PHI35_SHORT, "long_factor": PHI35_LONG},
        ),
        (4096, 4097),
    ),
    "gemma-3-4b linear 8 (global)": (
        transformers.LlamaConfig,  # Gemma 3's global layers: head 256, base 1e6, linear 8, as a flat config
        dict(hidden_size=2560, num_attention_heads=8, head_dim=256, rope_theta=1000000.0,
             rope_scaling={"rope_type": "linear", "factor": 8.0}),
        (8,),
    ),
    "vicuna-16k-like dynamic 4": (
        transformers.LlamaConfig,
        dict(hidden_size=4096, num_attention_heads=32, max_position_embeddings=4096, rope_theta=10000.0,
             rope_scaling={"rope_type": "dynamic", "factor": 4.0}),
        (4096, 9000),
    ),
}  # fmt: skip


def real_scaling(config) -> tuple[RopeScaling, int, float, int]:
    """Our RopeScaling (through the family's reader), max_len, base and rotary width of a transformers config."""
    ours = FAMILIES[config.model_type].from_hf(config.to_dict())  # transformers 5 writes rope_parameters
    return ours.rope_scaling, ours.max_len, ours.rope_theta, ours.rope_dim


@pytest.mark.parametrize("name", REAL)
def test_real_shaped_frequencies_match_transformers(name):
    config_class, kwargs, lengths = REAL[name]
    config = config_class(**kwargs)
    scaling, max_len, theta, dim = real_scaling(config)
    kind = config.rope_parameters["rope_type"]
    for seq_len in lengths:
        with H.rope_inits_in_float64():
            theirs, theirs_factor = modeling_rope_utils.ROPE_INIT_FUNCTIONS[kind](config, "cpu", seq_len=seq_len)
        shipped, _ = modeling_rope_utils.ROPE_INIT_FUNCTIONS[kind](config, "cpu", seq_len=seq_len)  # float32
        ours, factor = rope_frequencies(dim, theta, scaling, max_len, seq_len)
        ours_t, factor_t = rope_inv_freq(dim, theta, scaling, max_len, seq_len)
        assert theirs.dtype == torch.float64 and ours.shape == tuple(theirs.shape) == (dim // 2,)
        for mine, their_factor in ((ours, theirs_factor), (ours_t.numpy(), factor_t)):
            assert np.abs(mine / theirs.numpy() - 1).max() <= 1e-14
            assert their_factor == pytest.approx(factor, rel=1e-15)
        assert np.abs(ours / shipped.double().numpy() - 1).max() <= 1e-6  # the float32 tables, within float32
        if kind in ("longrope", "dynamic") and seq_len > lengths[0]:
            assert np.abs(ours / rope_frequencies(dim, theta, scaling, max_len, lengths[0])[0] - 1).max() > 1e-3


# ----------------------------------------------------------------------------------------------
# Greedy decoding against generate(): the KV cache keeps each key rotated as it was when cached (transformers' too),
# and Phi-3 recomputes its cache when the sequence first outgrows the original length (its
# prepare_inputs_for_generation): our steps must equal its tokens across that switch.

DECODES = {
    "llama llama3": ("llama", {"rope_scaling": LLAMA3}, 6, 14),
    "llama dynamic over max 16": (
        "llama", {"max_position_embeddings": 16, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, 10, 14,
    ),
    "phi3 longrope over original 16": (
        "phi3", {"original_max_position_embeddings": 16, "rope_scaling": LONGROPE}, 10, 14,
    ),
    "llama longrope over original 16 (its cache kept)": (
        "llama", {"rope_scaling": LONGROPE | {"original_max_position_embeddings": 16}}, 10, 14,
    ),
    "gpt_neox dynamic over max 16": ("gpt_neox", NEOX_DYNAMIC, 10, 14),
    "gpt_neox longrope over original 16 (its cache kept)": ("gpt_neox", NEOX_LONGROPE, 10, 14),
    "gpt_neox yarn": ("gpt_neox", NEOX | {"max_position_embeddings": 2048, "rope_scaling": YARN}, 6, 14),
}  # fmt: skip


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("case", DECODES)
def test_greedy_matches_generate_across_the_switch(case, side):
    family, overrides, prompt_len, new = DECODES[case]
    with tempfile.TemporaryDirectory() as directory:
        build(family, directory, overrides, "rope_scaling")
        theirs = H.CLASSES[family].from_pretrained(directory, dtype=torch.float64).eval()
        ours = H.load_ours(side, directory, np.float64)
    ids, _ = H.make_inputs(family, 3, batch=1, length=prompt_len)
    with H.patch_for(family, np.float64), torch.no_grad():
        expected = theirs.generate(
            torch.from_numpy(ids), max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0
        ).numpy()
    assert expected.shape[1] == prompt_len + new
    if side == "numpy":
        got = numpy_generate(ours, ids, max_new_tokens=new)
    else:
        got = torch_generate(ours, torch.from_numpy(ids), max_new_tokens=new).numpy()
    # ours stops at the config's eos (id 2), generate() was told not to: the tokens up to there, past the switch
    assert got.shape[1] == expected.shape[1] or got[0, -1] == 2
    assert got.shape[1] > H.TINY[family]["max_position_embeddings"] // 2 + 1
    np.testing.assert_array_equal(got, expected[:, : got.shape[1]])


# ----------------------------------------------------------------------------------------------
# A Phi-3-mini-128k-shaped checkpoint (max_position_embeddings 131072, rope_scaling {"type": "longrope"}, the original
# length at the top level, here shrunk to 8, a window far past it), its transformers model run as shipped (float32)
# before the float64 comparison, as a user's script runs it: LongRoPE's long frequencies, which transformers makes at
# the first long call and keeps on the module, are then float32's until H.rope_tables_in_float64 drops them. Before
# it did, every comparison past the original length read them: 14 tokens differed by 5e-7 in the logits and 2.5e-6
# in every gradient, 9 tokens by 1e-6, 8 by 5e-15. Compared: the 14 tokens, a left-padded batch of them, and greedy
# decoding from 8 tokens across the switch, its tokens and each step's logits (float64, read off the model's forward
# inside generate(); generate's own output_logits are cast to float32).

PHI3_128K = {
    "max_position_embeddings": 131072, "original_max_position_embeddings": 8, "sliding_window": 262144,
    "tie_word_embeddings": False,
    "rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.01, 1.02, 1.05],
                     "long_factor": [1.0700000524520874, 1.1200000047683716, 3.25, 9.8]},
}  # fmt: skip


def phi3_128k(directory, side: str, ids: np.ndarray):
    """(transformers' Phi3ForCausalLM run once as shipped on `ids`, then cast to float64; ours) of the checkpoint."""
    build("phi3", directory, PHI3_128K, "rope_scaling")
    theirs = H.CLASSES["phi3"].from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        theirs(torch.from_numpy(ids))  # float32: transformers keeps the long frequencies it makes here
    return theirs.double(), H.load_ours(side, directory, np.float64)


def relative(ours, theirs) -> float:
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


@pytest.mark.parametrize("side", SIDES)
def test_phi3_128k_past_the_original_length_matches_transformers(side, tmp_path):
    from parity_tests.test_generate_rules import ours_padded_forward, theirs_padded_forward

    ids, _ = H.make_inputs("phi3", 0, length=14)
    theirs, ours = phi3_128k(tmp_path, side, ids)
    assert ours.config.rope_scaling.original_length(ours.config.max_len) == 8
    upstream = np.random.default_rng(1000).standard_normal((*ids.shape, H.TINY["phi3"]["vocab_size"]))
    with H.patch_for("phi3", np.float64):
        theirs_out, theirs_grads = H.run_transformers(theirs, "phi3", ids, None, upstream)
    ours_out, ours_grads = (H.run_numpy if side == "numpy" else H.run_torch)(ours, "phi3", ids, None, upstream)
    result = H.pair(ours_out, theirs_out, ours_grads, theirs_grads, "logits")
    _, out_rel, _, grad_rel = C.worst(result, np.float64)
    assert out_rel <= 1e-12 and grad_rel <= 1e-10, (out_rel, grad_rel)
    assert len(result.grads) > 10 and all(np.any(ours_grad) for ours_grad, _ in result.grads.values())

    mask = np.ones_like(ids)
    mask[1, :4] = 0  # row 1: 10 real tokens, past the original length too
    padded = np.where(mask == 1, ids, 0)
    upstream = upstream * mask[..., None]
    theirs_out, theirs_grads = theirs_padded_forward(theirs, "phi3", padded, mask, upstream)
    ours_out, ours_grads = ours_padded_forward(ours, side, padded, mask, upstream)
    real = mask.astype(bool)
    assert relative(ours_out[real], theirs_out[real]) <= 1e-12
    for name, theirs_grad in theirs_grads.items():
        assert np.any(theirs_grad) and relative(ours_grads[name], theirs_grad) <= 1e-10, name

    steps: list = []  # each forward's last logits in generate(), float64
    hook = theirs.register_forward_hook(lambda module, args, out: steps.append(H.to_numpy(out.logits[:, -1])))
    prompt = ids[:1, :8]
    with H.patch_for("phi3", np.float64), torch.no_grad():
        expected = theirs.generate(
            torch.from_numpy(prompt), max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0
        ).numpy()
    hook.remove()
    ours.generation_rules = None  # as generate() was told: no end token
    ours.config = dataclasses.replace(ours.config, eos_id=None)
    if side == "numpy":
        out = numpy_generate(ours, prompt, max_new_tokens=6, return_dict_in_generate=True)
        tokens, logits = out.sequences, out.logits
    else:
        out = torch_generate(ours, torch.from_numpy(prompt), max_new_tokens=6, return_dict_in_generate=True)
        tokens, logits = H.to_numpy(out.sequences), H.to_numpy(out.logits)
    np.testing.assert_array_equal(tokens, expected)
    assert len(steps) == logits.shape[1] == 6
    for step, theirs_logits in enumerate(steps):  # steps 1..5 are past the original length
        assert relative(logits[:, step], theirs_logits) <= 1e-12, step


# ----------------------------------------------------------------------------------------------
# config.json written back as read.


def round_trip(make) -> tuple[dict, dict]:
    """config.json as `make(directory)` builds it, and as hf.save writes it back after hf.load; asserted on the
    way: the config read again equals the first, and transformers reads the same RoPE from both files."""
    with tempfile.TemporaryDirectory() as first, tempfile.TemporaryDirectory() as second:
        original = make(first)
        model = numpy_hf.load(first, dtype=np.float64)
        numpy_hf.save(model, second, overwrite=True)
        assert numpy_hf.load(second, dtype=np.float64).config == model.config
        before, after = (transformers.AutoConfig.from_pretrained(d).rope_parameters for d in (first, second))
        assert after == before
        return original, json.loads((Path(second) / "config.json").read_text())


@pytest.mark.parametrize("case", [c for c in CASES if "T 12" not in c])
def test_round_trip_keeps_the_spelling(case):
    family, overrides, written_as, _ = CASES[case]
    original, written = round_trip(lambda directory: build(family, directory, overrides, written_as))
    if written_as == "rope_scaling":  # Gemma 3's bases go in rope_parameters, as hf.save always writes them
        assert written["rope_scaling"] == original["rope_scaling"]
        assert family == "gemma3_text" or "rope_parameters" not in written
    else:
        assert "rope_scaling" not in written and written["rope_parameters"] == original["rope_parameters"]


# RopeScaling holds the math only: the spelling is the file's (transformer_spec.families.rope), and whether decoding
# makes a LongRoPE cache again is the family's (TransformerConfig.rope_cache_remade, read by its family file).
LLAMA_JSON = {
    "model_type": "llama", "vocab_size": 40, "hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 48,
    "num_hidden_layers": 2, "max_position_embeddings": 32,
}  # fmt: skip


def test_one_scaling_two_spellings_each_written_as_read():
    llama = FAMILIES["llama"]
    older = LLAMA_JSON | {"rope_theta": 500.0, "rope_scaling": {"type": "linear", "factor": 4.0}}
    newer = LLAMA_JSON | {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 500.0}}
    config = llama.from_hf(older)
    assert config == llama.from_hf(newer) and config.rope_scaling == RopeScaling("linear", factor=4.0)
    assert {f.name for f in dataclasses.fields(RopeScaling)} >= {"rope_type", "factor"}
    assert not {"written_as", "type_key", "remake_cache"} & {f.name for f in dataclasses.fields(RopeScaling)}
    written = llama.config_json(config, older)
    assert written["rope_scaling"] == {"type": "linear", "factor": 4.0} and "rope_parameters" not in written
    for as_read in (newer, None):  # a model of our own: as transformers 5 writes it
        written = llama.config_json(config, as_read)
        assert "rope_scaling" not in written
        assert written["rope_parameters"] == {"rope_type": "linear", "factor": 4.0, "rope_theta": 500.0}


def test_a_scaling_changed_after_loading_goes_where_transformers_reads_it(tmp_path):
    """A model loaded from a rope_scaling file, its scaling replaced: hf.save writes the new one in rope_scaling (the
    key transformers reads first, which the file's old value would otherwise hold), and transformers reads it; its
    scaling taken off: rope_scaling null."""
    build("llama", tmp_path / "a", {"rope_scaling": LLAMA3}, "rope_scaling")
    model = numpy_hf.load(tmp_path / "a", dtype=np.float64)
    dynamic = RopeScaling("dynamic", factor=3.0)
    model.config = dataclasses.replace(model.config, rope_scaling=dynamic)
    numpy_hf.save(model, tmp_path / "b")
    assert transformers.AutoConfig.from_pretrained(tmp_path / "b").rope_parameters["rope_type"] == "dynamic"
    assert numpy_hf.load(tmp_path / "b").config.rope_scaling == dynamic
    model.config = dataclasses.replace(model.config, rope_scaling=None)  # taken off: null, not the file's llama3
    numpy_hf.save(model, tmp_path / "c")
    assert transformers.AutoConfig.from_pretrained(tmp_path / "c").rope_parameters["rope_type"] == "default"
    assert numpy_hf.load(tmp_path / "c").config.rope_scaling is None


def test_whether_decoding_remakes_a_longrope_cache_is_the_familys():
    """Phi-3's family file says its generate() makes the cache again past the original length; Llama's (and GPT-NeoX's,
    Gemma 3's) keeps it; with any other RoPE there is nothing to remake (the default, a model of our own's: remade,
    the cache then equals a full forward). An older checkpoint's metadata, which held the flag and the spelling in
    RopeScaling (remake_cache, written_as, type_key), reads as the same config."""
    longrope = {"rope_scaling": LONGROPE | {"original_max_position_embeddings": 16}}
    llama = FAMILIES["llama"].from_hf(LLAMA_JSON | longrope)
    phi3 = FAMILIES["phi3"].from_hf(LLAMA_JSON | {"original_max_position_embeddings": 16, "rope_scaling": LONGROPE})
    assert llama.rope_scaling == phi3.rope_scaling and (llama.rope_cache_remade, phi3.rope_cache_remade) == (
        False,
        True,
    )
    assert FAMILIES["llama"].from_hf(LLAMA_JSON).rope_cache_remade
    assert (phi3.cache_outgrown(16, 17), llama.cache_outgrown(16, 17), phi3.cache_outgrown(15, 16)) == (
        True,
        False,
        False,
    )
    legacy = llama.to_dict()
    del legacy["rope_cache_remade"]
    legacy["rope_scaling"] |= {"written_as": "rope_scaling", "type_key": "rope_type", "remake_cache": False}
    assert TransformerConfig.from_dict(legacy) == llama


def test_torch_side_writes_the_same_config_json():
    family, overrides, written_as, _ = CASES["phi3 longrope partial rotary 0.5, T 20"]
    with tempfile.TemporaryDirectory() as first, tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        build(family, first, overrides, written_as)
        numpy_hf.save(numpy_hf.load(first), a, overwrite=True)
        torch_hf.save(torch_hf.load(first), b, overwrite=True)
        assert json.loads((Path(a) / "config.json").read_text()) == json.loads((Path(b) / "config.json").read_text())


# ----------------------------------------------------------------------------------------------
# Refusals: the key as the file spells it, long values shortened.


def refusal(family: str, **changes) -> str:
    with tempfile.TemporaryDirectory() as directory:
        H.build_tiny(family, directory, 0)
        path = Path(directory) / "config.json"
        c = json.loads(path.read_text())
        for key, value in changes.items():
            if value is None:
                c.pop(key, None)
            else:
                c[key] = value
        path.write_text(json.dumps(c))
        with pytest.raises(ValueError) as error:
            numpy_hf.load(directory)
    return str(error.value)


def test_unknown_kind_is_refused_under_the_files_key():
    message = refusal("llama", rope_scaling={"type": "ntk-by-parts", "factor": 2.0})
    assert "rope_scaling.type='ntk-by-parts'" in message and "rope_parameters" not in message
    message = refusal("llama", rope_parameters={"rope_type": "proportional", "factor": 2.0, "rope_theta": 500.0})
    assert "rope_parameters.rope_type='proportional'" in message


def test_phi3_refuses_other_kinds_and_shortens_the_lists():
    message = refusal("phi3", rope_scaling={"type": "linear", "factor": 2.0})
    assert "rope_scaling.type='linear'" in message
    message = refusal(
        "phi3",
        rope_scaling={"type": "longrope", "short_factor": PHI35_SHORT, "long_factor": PHI35_LONG, "x": PHI35_LONG},
    )
    assert "rope_scaling.x" in message and "48 values" in message and len(message) < 400
    message = refusal("phi3", rope_scaling={"type": "longrope", "short_factor": PHI35_SHORT, "long_factor": PHI35_LONG})
    assert "short_factor needs one factor per rotary frequency" in message and len(message) < 400


def test_gpt_neox_and_gemma3_local_refusals_name_their_key():
    message = refusal("gpt_neox", rope_scaling={"type": "ntk-by-parts", "factor": 2.0})
    assert "rope_scaling.type='ntk-by-parts'" in message and "rope_parameters" not in message
    longrope = {"rope_type": "longrope", "short_factor": PHI35_SHORT, "long_factor": [1.0]}
    message = refusal("gpt_neox", rope_scaling=longrope)
    assert "short_factor needs one factor per rotary frequency" in message and len(message) < 400
    local = {"full_attention": {"rope_type": "default", "rope_theta": 500.0}}
    local["sliding_attention"] = {"rope_type": "ntk-by-parts", "factor": 2.0, "rope_theta": 1e4}
    message = refusal("gemma3_text", rope_parameters=local)
    assert "rope_parameters.sliding_attention.rope_type='ntk-by-parts'" in message


# ----------------------------------------------------------------------------------------------
# Gemma 3's local layers: Gemma3RotaryEmbedding initialises each layer kind from its own RoPE object, so a scaled
# rope_parameters.sliding_attention is computed (at the local base), beside the global kind's own.

GEMMA_LOCAL = {  # name: (rope_parameters, tokens)
    "gemma3 linear 2 on the local layers": (
        {"full_attention": {"rope_type": "default", "rope_theta": 500.0},
         "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}, 12,
    ),
    "gemma3 linear 8 global, yarn local": (
        {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 500.0},
         "sliding_attention": YARN | {"original_max_position_embeddings": 16, "rope_theta": 10000.0}}, 12,
    ),
    "gemma3 dynamic 2 local, T 20 > max 16": (
        {"full_attention": {"rope_type": "default", "rope_theta": 500.0},
         "sliding_attention": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 100.0}}, 20,
    ),
}  # fmt: skip


def build_gemma_local(directory, case: str) -> dict:
    params, length = GEMMA_LOCAL[case]
    H.build_tiny("gemma3_text", directory, 0, rope_parameters=copy.deepcopy(params), max_position_embeddings=16)
    return json.loads((Path(directory) / "config.json").read_text())


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("case", GEMMA_LOCAL)
def test_gemma3_scaled_local_layers_match_transformers(case, side):
    params, length = GEMMA_LOCAL[case]
    with tempfile.TemporaryDirectory() as directory:
        build_gemma_local(directory, case)
        theirs = H.CLASSES["gemma3_text"].from_pretrained(directory, dtype=torch.float64).eval()
        ours = H.load_ours(side, directory, np.float64)
    local = params["sliding_attention"]
    assert ours.config.rope_local_scaling.rope_type == local["rope_type"]
    assert ours.config.rope_local_theta == local["rope_theta"]
    ids, _ = H.make_inputs("gemma3_text", 0, length=length)
    upstream = np.random.default_rng(1000).standard_normal((*ids.shape, H.TINY["gemma3_text"]["vocab_size"]))
    with H.patch_for("gemma3_text", np.float64):
        theirs_out, theirs_grads = H.run_transformers(theirs, "gemma3_text", ids, None, upstream)
    run = H.run_numpy if side == "numpy" else H.run_torch
    ours_out, ours_grads = run(ours, "gemma3_text", ids, None, upstream)
    result = H.pair(ours_out, theirs_out, ours_grads, theirs_grads, "logits")
    assert not C.failures(result, np.float64), C.failures(result, np.float64)
    out_diff, out_rel, grad_diff, grad_rel = C.worst(result, np.float64)
    assert out_rel <= 1e-12 and grad_rel <= 1e-10, (out_rel, grad_rel)
    assert len(result.grads) > 10 and all(np.any(ours_grad) for ours_grad, _ in result.grads.values())
    if side == "numpy":  # the comparison above could not pass with the local scaling ignored
        plain = type(ours)(dataclasses.replace(ours.config, rope_local_scaling=None, max_len=32))
        plain.load_state_dict(ours.state_dict())
        assert np.abs(plain.forward(ids) - ours_out).max() > 1e-3


@pytest.mark.parametrize("case", GEMMA_LOCAL)
def test_gemma3_local_scaling_round_trip_keeps_the_spelling(case):
    original, written = round_trip(lambda directory: build_gemma_local(directory, case))
    assert written["rope_parameters"] == original["rope_parameters"]


# ----------------------------------------------------------------------------------------------
# ModernBERT: ModernBertRotaryEmbedding initialises each layer kind from its own RoPE object (rope_parameters[kind]),
# a top-level rope_scaling merged into both: every kind computed per kind, the global and local bases kept. Its tiny
# checkpoint (modernbert_compare: head 8, four frequencies, a global then two local layers) at 9 tokens.

MB_LOCAL_LONGROPE = {"rope_type": "longrope", "original_max_position_embeddings": 8, "rope_theta": 50.0}
MB_CASES = {  # name: (ModernBertConfig overrides, where config.json holds the scaling)
    "modernbert linear 4 on both kinds": ({"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, "rope_scaling"),
    "modernbert dynamic 2 on both kinds, T 9 > max 8": (
        {"max_position_embeddings": 8, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling",
    ),
    "modernbert yarn on the global layers": (
        {"rope_parameters": {
            "full_attention": YARN | {"original_max_position_embeddings": 16, "rope_theta": 500.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
        }}, "rope_parameters",
    ),
    "modernbert llama3 global, longrope local, T 9 > original 8": (
        {"rope_parameters": {
            "full_attention": LLAMA3 | {"original_max_position_embeddings": 8, "rope_theta": 500.0},
            "sliding_attention": LONGROPE | MB_LOCAL_LONGROPE,
        }}, "rope_parameters",
    ),
}  # fmt: skip


def build_modernbert(directory, case: str) -> dict:
    """The tiny ModernBERT checkpoint of a case, config.json's scaling as a top-level rope_scaling (each kind's
    rope_parameters then plain, at its base) or per kind in rope_parameters (as transformers 5 saves it)."""
    overrides, written_as = MB_CASES[case]
    M.build_tiny(directory, **copy.deepcopy(overrides))
    path = Path(directory) / "config.json"
    c = json.loads(path.read_text())
    if written_as == "rope_scaling":
        c["rope_scaling"] = copy.deepcopy(overrides["rope_scaling"])
        bases = {"full_attention": M.TINY["global_rope_theta"], "sliding_attention": M.TINY["local_rope_theta"]}
        c["rope_parameters"] = {kind: {"rope_type": "default", "rope_theta": base} for kind, base in bases.items()}
    path.write_text(json.dumps(c))
    return c


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("case", MB_CASES)
def test_modernbert_scaled_rope_matches_transformers(case, side):
    with tempfile.TemporaryDirectory() as directory:
        build_modernbert(directory, case)
        theirs = transformers.ModernBertModel.from_pretrained(
            directory, dtype=torch.float64, attn_implementation="eager"
        )
        ours = M.load_ours(side, directory, np.float64)
    assert (ours.config.rope_scaling, ours.config.rope_local_scaling) != (None, None)
    ids, mask = M.make_inputs(0)
    upstream = np.random.default_rng(1000).standard_normal((*ids.shape, M.TINY["hidden_size"]))
    with M.modernbert_in_float64():
        theirs_out, theirs_grads = M.run_transformers(theirs.eval(), ids, mask, upstream)
    ours_out, ours_grads = M.run_ours(ours, side, ids, mask, upstream)
    result = H.pair(ours_out, theirs_out, ours_grads, theirs_grads, "hidden")
    assert not C.failures(result, np.float64), C.failures(result, np.float64)
    out_diff, out_rel, grad_diff, grad_rel = C.worst(result, np.float64)
    assert out_rel <= 1e-12 and grad_rel <= 1e-10, (out_rel, grad_rel)
    assert len(result.grads) > 10 and all(np.any(ours_grad) for ours_grad, _ in result.grads.values())
    if side == "numpy":  # the comparison above could not pass with the scaling ignored
        plain = dataclasses.replace(ours.config, rope_scaling=None, rope_local_scaling=None, max_len=32)  # room for T
        unscaled = type(ours)(plain)
        unscaled.load_state_dict(ours.state_dict())
        assert np.abs(unscaled.forward(ids, attention_mask=mask) - ours_out).max() > 1e-3


@pytest.mark.parametrize("case", MB_CASES)
def test_modernbert_round_trip_keeps_the_spelling(case):
    original, written = round_trip(lambda directory: build_modernbert(directory, case))
    assert written.get("rope_scaling") == original.get("rope_scaling")
    assert written["rope_parameters"] == original["rope_parameters"]


@pytest.mark.parametrize("family", ["modernbert", "gemma3_text"])
@pytest.mark.parametrize("with_parameters", [True, False])
def test_an_older_type_key_is_read_as_transformers_does(family, with_parameters):
    """ModernBertConfig and Gemma3TextConfig merge a top-level rope_scaling into each kind's (ModernBERT) or the
    global kind's (Gemma 3) {"rope_type": "default", ...}: an older "type" key then leaves rope_type "default" (with
    rope_parameters in the file or without), and transformers computes plain RoPE; so do we."""
    with tempfile.TemporaryDirectory() as directory:
        M.build_tiny(directory) if family == "modernbert" else H.build_tiny(family, directory)
        path = Path(directory) / "config.json"
        c = json.loads(path.read_text()) | {"rope_scaling": {"type": "linear", "factor": 4.0}}
        if not with_parameters:
            del c["rope_parameters"]
        path.write_text(json.dumps(c))
        theirs = transformers.AutoConfig.from_pretrained(directory)
        ours = numpy_hf.load(directory)
    assert {params["rope_type"] for params in theirs.rope_parameters.values()} == {"default"}
    assert ours.config.rope_scaling is None and ours.config.rope_local_scaling is None
