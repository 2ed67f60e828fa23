"""GPT-OSS against transformers' GptOssForCausalLM beyond hf_compare's shared lists (test_hf: the tiny gpt-oss-20b
shape's outputs and gradients, round trips, state-dict names; test_generate_rules: left-padded batches, greedy and
beam search against generate()): gpt-oss-20b's config.json as released (shrunk) read whole, the values refused by
name, GptOssConfig's defaults (its YaRN, its layer alternation), that the tiny model reaches what it is meant to test
(the clamp, the sinks, YaRN's truncate false), the float64 patch, and the load-balancing loss."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from transformers.models.gpt_oss import modeling_gpt_oss

import numpy_transformer as nt
from numpy_transformer import hf as numpy_hf
from parity_tests import components as C
from parity_tests import hf_compare as H
from torch_transformer import hf as torch_hf
from transformer_spec.families import FAMILIES
from transformer_spec.families.gpt_oss import GPT_OSS_CONFIG

SIDES = ["numpy", "torch"]

# gpt-oss-20b's config.json as released (the keys and option values transformers 4.55 wrote, the original release's
# initial_context_length and experts_per_token beside them), sizes shrunk as hf_compare's tiny gpt_oss: 36 wide,
# 8 heads of 8 features to 2 K/V heads, 8 experts of which 4 run, 2 layers, a window of 3 (128 there); the released
# swiglu_limit 7, rope_scaling (YaRN, factor 32 over 4096, beta 32 / 1, truncate false), rope_theta 150000,
# router_aux_loss_coef 0.9, eps 1e-5, untied, attention biases. Its quantization_config (MXFP4 expert blocks) is left
# out: the tiny checkpoint's experts are plain tensors, and that key is refused (below).
GPT_OSS_20B_RELEASED = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0, "eos_token_id": 2,
    "experts_per_token": 4, "head_dim": 8, "hidden_act": "silu", "hidden_size": 36, "initial_context_length": 4096,
    "initializer_range": 0.02, "intermediate_size": 36, "layer_types": ["sliding_attention", "full_attention"],
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 8, "num_experts_per_tok": 4,
    "num_hidden_layers": 2, "num_key_value_heads": 2, "num_local_experts": 8, "output_router_logits": False,
    "pad_token_id": 0, "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 3, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True, "vocab_size": 40,
}  # fmt: skip
NOT_COMPUTED = {  # keys transformers' GptOssForCausalLM does not compute with
    "architectures", "model_type", "initializer_range", "transformers_version", "use_cache",
    "initial_context_length", "experts_per_token",
}  # fmt: skip


def assert_exact(result) -> None:
    problems = C.failures(result, np.float64)
    assert not problems, problems[0]
    zero = [name for name, (ours, _) in result.grads.items() if not np.any(ours)]
    assert not zero, f"zero gradients: {zero}"


def compare(directory, side: str, seed: int = 6) -> C.Result:
    """Our model of the checkpoint in `directory` (float64) against transformers' from_pretrained of it: logits and
    every gradient of sum(logits * R), R random."""
    theirs = H.CLASSES["gpt_oss"].from_pretrained(directory, dtype=torch.float64, **H.loading_options("gpt_oss"))
    ours = H.load_ours(side, directory, np.float64)
    ids, _ = H.make_inputs("gpt_oss")
    upstream = np.random.default_rng(seed).standard_normal((*ids.shape, 40))
    with H.patch_for("gpt_oss", np.float64):
        theirs_out, theirs_grads = H.run_transformers(theirs.eval(), "gpt_oss", ids, None, upstream)
    ours_out, ours_grads = (H.run_numpy if side == "numpy" else H.run_torch)(ours, "gpt_oss", ids, None, upstream)
    return H.pair(ours_out, theirs_out, ours_grads, theirs_grads, "logits")


@pytest.mark.parametrize("side", SIDES)
def test_released_config_json_reads_whole(side, tmp_path):
    """A checkpoint whose config.json is gpt-oss-20b's as released (shrunk): every key it sets is read by the family's
    map (or computed by no layer of transformers' class); the model equals transformers' in float64, outputs and every
    gradient (random upstream gradients)."""
    read = {key.theirs for key in GPT_OSS_CONFIG.keys} | set(GPT_OSS_CONFIG.dropout)
    assert set(GPT_OSS_20B_RELEASED) - read == NOT_COMPUTED
    H.build_tiny("gpt_oss", tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(GPT_OSS_20B_RELEASED))
    result = compare(tmp_path, side)
    assert_exact(result)
    config = H.load_ours(side, tmp_path, np.float64).config
    scaling = config.rope_scaling
    assert (scaling.rope_type, scaling.factor, scaling.truncate) == ("yarn", 32.0, False)
    # the released file spells it rope_scaling; a save writes it back there (the spelling lives with the file read)
    saved = tmp_path / "saved"
    (numpy_hf if side == "numpy" else torch_hf).save(H.load_ours(side, tmp_path, np.float64), saved)
    written = json.loads((saved / "config.json").read_text())
    assert written["rope_scaling"]["rope_type"] == "yarn" and "rope_parameters" not in written
    assert config.attn_sinks and config.expert_kind == "gpt_oss" and config.swiglu_limit == 7.0
    assert config.layer_types == ("sliding_attention", "full_attention") and config.rope_theta == 150000.0


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"quantization_config": {"quant_method": "mxfp4"}}, "quantization_config"),
        ({"output_router_logits": True}, "output_router_logits"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"swiglu_limit": 0.0}, "swiglu_limit"),
        ({"swiglu_alpha": -1.0}, "swiglu_alpha"),
        ({"layer_types": "sliding_attention"}, "layer_types"),
        ({"sliding_window": 0}, "sliding_window"),
        ({"rope_scaling": {"rope_type": "ntk", "factor": 2.0}}, "rope_scaling.rope_type"),
    ],
)
def test_refuses_what_it_does_not_compute(change, named):
    """A released config.json's value that is not computed here is refused by name, not ignored."""
    with pytest.raises(ValueError, match=named):
        FAMILIES["gpt_oss"].from_hf(GPT_OSS_20B_RELEASED | change)


def test_gpt_oss_config_defaults_are_read_as_transformers_fills_them(tmp_path):
    """A config.json that names no RoPE, no layer_types, no swiglu_alpha: GptOssConfig's YaRN (factor 32 over 4096,
    beta 32 / 1, truncate false, base 150000), every other layer sliding, alpha 1.702; equal to transformers."""
    H.build_tiny("gpt_oss", tmp_path)
    released = {k: v for k, v in GPT_OSS_20B_RELEASED.items() if k not in ("rope_scaling", "rope_theta",
                                                                            "layer_types")}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(released))
    config = FAMILIES["gpt_oss"].from_hf(released)
    scaling = config.rope_scaling
    assert (scaling.rope_type, scaling.factor, scaling.beta_fast, scaling.beta_slow, scaling.truncate) == (
        "yarn", 32.0, 32.0, 1.0, False)  # fmt: skip
    assert scaling.original_max_position_embeddings == 4096 and config.rope_theta == 150000.0
    assert config.layer_types == ("sliding_attention", "full_attention") and config.swiglu_alpha == 1.702
    assert_exact(compare(tmp_path, "numpy"))


def test_the_tiny_model_reaches_what_it_tests(tmp_path):
    """The tiny model's clamp (1.5) is reached, and its sinks and YaRN's truncate false matter: without the clamp,
    the sinks or with truncate true, our logits move far past the float64 bar, so the comparisons would see them
    wrong. Its experts all receive rows."""
    H.build_tiny("gpt_oss", tmp_path)
    ours = numpy_hf.load(tmp_path, dtype=np.float64).eval()
    ids, _ = H.make_inputs("gpt_oss")
    reference = ours.forward(ids)
    for layer in ours._last_forward("test").stacks()["decoder"][0].layers:
        block = layer.ffn.block
        assert {r.expert for r in block.routed} == set(range(8))
        gate = np.concatenate([r.act.gate for r in block.routed])
        up = np.concatenate([r.act.up for r in block.routed])
        assert (gate > 1.5).any() and (np.abs(up) > 1.5).any()
    c = ours.config
    changes = {
        "no clamp": dict(swiglu_limit=1e6),
        "no sinks": dict(attn_sinks=False),
        "truncate": dict(rope_scaling=dataclasses.replace(c.rope_scaling, truncate=True)),
    }
    for name, change in changes.items():
        other = nt.TransformerLM(dataclasses.replace(c, **change), dtype=np.float64).eval()
        state = {k: v for k, v in ours.state_dict().items() if other.config.attn_sinks or not k.endswith("sinks")}
        other.load_state_dict(state)
        assert np.abs(other.forward(ids) - reference).max() > 1e-3 * np.abs(reference).max(), name


def test_unpatched_float64_is_float32_accurate_and_the_patch_swaps_two_forwards():
    """transformers' own float64 GPT-OSS (RMSNorm and the rotary tables in float32) agrees with ours to the float32
    bar, not the float64 one: why its float64 comparison is patched; the patch swaps exactly GptOssRMSNorm.forward and
    GptOssRotaryEmbedding.forward, and restores them."""
    result = H.compare_hf("gpt_oss", np.float64, side="numpy", llama_float64=False)
    assert C.worst(result, np.float64)[3] > 1e-10
    assert not C.failures(result, np.float32)
    m = modeling_gpt_oss
    classes = (m.GptOssRMSNorm, m.GptOssRotaryEmbedding)
    before = [dict(vars(c)) for c in classes], dict(vars(m))
    with H.gpt_oss_in_float64():
        changed = [
            [k for k, v in vars(c).items() if b.get(k) is not v] for c, b in zip(classes, before[0], strict=True)
        ]
        assert changed == [["forward"], ["forward"]]
        assert dict(vars(m)) == before[1]
    assert ([dict(vars(c)) for c in classes], dict(vars(m))) == before


@pytest.mark.parametrize("side", SIDES)
def test_load_balancing_loss_equals_transformers(side, tmp_path):
    """transformers' aux_loss (output_router_logits=True: the router logits of every layer, pooled) equals our
    load_balancing_loss in float64 (its float32 counting patched to the logits' dtype), and our router logits equal
    transformers'."""
    theirs = H.build_tiny("gpt_oss", tmp_path).double()
    ours = H.load_ours(side, tmp_path, np.float64).eval()
    ids, _ = H.make_inputs("gpt_oss")
    saved = modeling_gpt_oss.load_balancing_loss_func
    modeling_gpt_oss.load_balancing_loss_func = H.load_balancing_loss_func_float64
    try:
        with H.patch_for("gpt_oss", np.float64), torch.no_grad():
            out = theirs(input_ids=torch.from_numpy(ids), output_router_logits=True, use_cache=False)
    finally:
        modeling_gpt_oss.load_balancing_loss_func = saved
    if side == "numpy":
        ours.forward(ids)
        aux, logits = float(ours.load_balancing_loss()), ours.router_logits()
    else:
        with torch.no_grad():
            ours(torch.from_numpy(ids))
            aux, logits = ours.load_balancing_loss().item(), [z.numpy() for z in ours.router_logits()]
    assert abs(aux - out.aux_loss.item()) <= 1e-13 * abs(aux)
    for mine, theirs_z in zip(logits, out.router_logits, strict=True):
        np.testing.assert_allclose(mine, theirs_z.numpy(), rtol=0, atol=1e-13)
