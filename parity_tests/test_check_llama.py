"""check.module on Llama-style modules: RMSNorm, rotary positions, SwiGLU, grouped-query attention.

A Llama written the way a learner writes it (parity_tests.user_models.TutorialLlama, style E) is checked with no map
at every level it has a module for, in float64 and float32; so are its interleaved-RoPE variant (passing, with the
pairing reported as a convention) and transformers' own LlamaForCausalLM. Every Llama mistake of the catalogue is
put into the tutorial's modules and must be named, at the component level and inside the whole LM, where the first
divergence must be the broken submodule. Every comparison can fail: the checker's upstream gradients are random,
and the tests assert that no compared gradient is zero on both sides.
"""

from __future__ import annotations

import re

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from parity_tests import check
from parity_tests import hf_compare as H
from parity_tests import user_models as U
from parity_tests.check.report import CATALOGUE
from parity_tests.corpus import fresh12 as F12

LLAMA_IDS = [
    "rms_norm.eps_outside_sqrt",
    "rms_norm.wrong_axis",
    "rope.mixed_pairing",
    "rope.position_offset",
    "rope.applied_to_v",
    "gated_feed_forward.activation_on_up",
    "attention.kv_heads_tiled",
]


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


def ids(result) -> list[str]:
    return [d.id for d in result.diagnoses]


def assert_passes(result) -> None:
    """Passed in float64 and float32, with gradients compared, none of them zero on both sides."""
    assert result.passed, str(result)
    assert result.diagnoses == [] and result.first_divergence is None
    assert {r.dtype for r in result.rows} == {"float64", "float32"}
    gradients = [r for r in result.rows if r.name.startswith("d")]
    assert gradients, str(result)
    assert [r.name for r in gradients if r.note == "all zero"] == [], str(result)


def attention(**options):
    return U.LlamaAttention(16, 4, 2, **options)  # 4 query heads of 4, 2 K/V heads


# -- the tutorial written right, at every level ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, reference",
    [
        (lambda: U.RMSNorm(16), "rms_norm"),
        (lambda: torch.nn.RMSNorm(16, eps=1e-5), "rms_norm"),
        (lambda: torch.nn.RMSNorm(16), "rms_norm"),  # eps None: the dtype's machine epsilon
        (lambda: U.SwiGLU(16, 24), "gated_feed_forward"),
        (lambda: U.AnonymousGLU(16, 24), "gated_feed_forward"),  # gate and up told apart by trying both
        (lambda: attention(), "multi_head_attention"),
        (lambda: attention(theta=500.0), "multi_head_attention"),  # the module's own base
        (lambda: U.LlamaAttention(16, 4, 4), "multi_head_attention"),  # no grouping: n_kv_heads = n_heads
        (lambda: U.FusedLlamaAttention(16, 4, 1), "multi_head_attention"),  # fused q, k, v; one K/V head
        (lambda: U.LlamaBlock(16, 4, 2, 24, theta=10000.0), "decoder_only_layer"),
        (lambda: U.LlamaBlock(16, 4, 2, 24, theta=500.0, interleaved=True), "decoder_only_layer"),
        (lambda: U.TutorialLlama(), "transformer_lm"),
        (lambda: U.TutorialLlama(tie=True, theta=500.0, n_kv_heads=1), "transformer_lm"),
    ],
)
def test_tutorial_llama_passes_with_no_map(make, reference):
    assert_passes(check.module(make(), reference))


def test_tutorial_llama_config_and_map_are_inferred():
    result = check.module(U.TutorialLlama(theta=500.0), "transformer_lm")
    c = result.config
    assert (c.norm, c.gated_ffn, c.activation, c.positional, c.rope_theta) == ("rms", True, "silu", "rope", 500.0)
    assert (c.n_heads, c.n_kv_heads, c.norm_first, c.bias, c.scale_embeddings, c.layer_norm_eps) == (
        4, 2, True, False, False, 1e-6,
    )  # fmt: skip
    assert result.mapping["layers.1.feed_forward.w1.weight"] == ("decoder.layers.1.ffn.gate.weight", "as is")
    assert result.mapping["layers.1.feed_forward.w3.weight"] == ("decoder.layers.1.ffn.linear1.weight", "as is")
    assert result.mapping["layers.0.attention.wk.weight"] == ("decoder.layers.0.self_attn.k_proj.weight", "as is")
    assert result.conventions["rope_pairing"].startswith("halves")
    assert any("cos_cached" in note and "float32 precision" in note for note in result.notes)


def test_gate_read_from_the_flow_without_names():
    """No name says which of the two D -> F linears is the gate: the recorded forward does (the one the
    activation reads), whatever order they are registered in."""
    result = check.module(U.AnonymousGLU(16, 24), "gated_feed_forward")
    assert result.passed, str(result)
    assert result.mapping["fc_b.weight"] == ("gate.weight", "as is")
    assert result.mapping["fc_a.weight"] == ("linear1.weight", "as is")


@pytest.mark.parametrize("reference", ["multi_head_attention", "transformer_lm"])
def test_interleaved_rope_is_a_convention(reference):
    module = attention(interleaved=True) if reference != "transformer_lm" else U.TutorialLlama(interleaved=True)
    result = check.module(module, reference)
    assert_passes(result)
    assert result.conventions["rope_pairing"].startswith("interleaved pairs (2i, 2i + 1)")
    q = "wq.weight" if reference != "transformer_lm" else "layers.0.attention.wq.weight"
    assert "RoPE pairs interleaved (head size 4)" in result.mapping[q][1]
    again = check.module(module, reference, mapping=result.mapping)  # the printed map, passed back
    assert again.passed, str(again)


def test_transformers_llama_passes_as_a_user_model():
    config = LlamaConfig(**{**H.TINY["llama"], "vocab_size": 24, "num_hidden_layers": 1})
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with H.llama_in_float64():  # transformers computes RMSNorm and cos/sin in float32 even in a float64 model
        result = check.module(model, "transformer_lm")
    assert_passes(result)
    c = result.config
    assert (c.n_heads, c.n_kv_heads, c.rope_theta, c.d_ff, c.norm) == (4, 2, 500.0, 48, "rms")
    assert result.mapping["model.layers.0.mlp.up_proj.weight"][0] == "decoder.layers.0.ffn.linear1.weight"
    unpatched = check.module(model, "transformer_lm", dtypes=("float64",))  # its float32 islands, as they are
    assert unpatched.passed and unpatched.caveats[0][0] == "dtype.float32_island", str(unpatched)
    assert "model.layers.0.input_layernorm" in unpatched.caveats[0][1]  # named where they are


# -- the mistakes, each named where it is --------------------------------------------------------------------------


def test_catalogue_holds_the_llama_ids():
    assert set(LLAMA_IDS) <= set(CATALOGUE)


COMPONENTS = {
    "rms_norm": lambda mistake: U.RMSNorm(16, mistake=mistake),
    "gated_feed_forward": lambda mistake: U.SwiGLU(16, 24, mistake),
    "multi_head_attention": lambda mistake: attention(mistake=mistake),
}


@pytest.mark.parametrize("mistake", LLAMA_IDS)
def test_component_mistake_is_named(mistake):
    reference = {"rms_norm": "rms_norm", "gated_feed_forward": "gated_feed_forward"}.get(
        mistake.split(".")[0], "multi_head_attention"
    )
    result = check.module(COMPONENTS[reference](mistake), reference)
    assert not result.passed
    assert ids(result)[0] == mistake, str(result)


def test_rms_norm_diagnosis_uses_the_modules_eps():
    result = check.module(U.RMSNorm(16, eps=1e-3, mistake="rms_norm.eps_outside_sqrt"), "rms_norm")
    assert "eps = 0.001" in result.diagnoses[0].message, str(result)


@pytest.mark.parametrize(
    "mistake, where",
    [
        ("rms_norm.eps_outside_sqrt", "layers.0.attention_norm"),
        ("rms_norm.wrong_axis", "layers.0.attention_norm"),
        ("rope.mixed_pairing", "layers.0.attention"),
        ("rope.position_offset", "layers.0.attention"),
        ("rope.applied_to_v", "layers.0.attention"),
        ("attention.kv_heads_tiled", "layers.0.attention"),
        ("gated_feed_forward.activation_on_up", "layers.0.feed_forward"),
    ],
)
def test_tutorial_llama_mistake_is_found_where_it_is(mistake, where):
    result = check.module(U.TutorialLlama(mistake=mistake), "transformer_lm")
    assert not result.passed
    assert result.first_divergence == where, str(result)
    assert ids(result) == [mistake], str(result)


@pytest.mark.parametrize(
    "mistake, where",
    [
        ("rms_norm.wrong_axis", "attention_norm"),
        ("attention.kv_heads_tiled", "attention"),
        ("gated_feed_forward.activation_on_up", "feed_forward"),
    ],
)
def test_llama_block_mistake_is_found_where_it_is(mistake, where):
    result = check.module(U.LlamaBlock(16, 4, 2, 24, theta=10000.0, mistake=mistake), "decoder_only_layer")
    assert not result.passed
    assert result.first_divergence == where and ids(result) == [mistake], str(result)


def test_gpt_block_is_a_decoder_only_layer_too():
    result = check.module(U.Block(8, 2, 16), "decoder_only_layer", n_heads=2)  # LayerNorm, ReLU, biases, no RoPE
    assert_passes(result)
    assert (result.config.norm, result.config.gated_ffn, result.config.n_kv_heads) == ("layer", False, None)


def test_mixed_pairing_is_a_mistake_even_in_an_interleaved_model():
    result = check.module(U.TutorialLlama(interleaved=True, mistake="rope.mixed_pairing"), "transformer_lm")
    assert result.first_divergence == "layers.0.attention" and ids(result) == ["rope.mixed_pairing"], str(result)


def test_mixed_pairing_in_a_later_block_of_an_interleaved_model():
    """Block 0 turns q and k in pairs (2i, 2i + 1), so the map reads their rows in pairs; block 1 turns its queries
    in halves (i, i + Dh/2): the variant turns them in the user's halves, not in the map's rows' (the keys' side is
    fresh12's polar_llama.mixed_pairing_second_block)."""

    class QueriesInHalves(F12.LlamaAttention):
        query_rotary = staticmethod(F12.apply_rotary_halves)

    result = check.module(F12.polar_llama(QueriesInHalves), "transformer_lm")
    assert result.first_divergence == "layers.1.attention" and ids(result) == ["rope.mixed_pairing"], str(result)


def test_unreadable_gated_block_is_refused_with_what_was_found():
    class TwoUps(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = (torch.nn.Linear(16, 24) for _ in range(3))

    refused = check.module(TwoUps(), "gated_feed_forward")  # could not judge: said in result.error, never raised
    assert not refused.passed and re.search(
        r"forward could not be recorded .* a\.weight \(16 -> 24\), b\.weight", refused.error or ""
    ), str(refused)
    refused = check.module(U.SwiGLU(16, 24), "feed_forward")  # could not judge: said in result.error, never raised
    assert not refused.passed and re.search("check it as 'gated_feed_forward'", refused.error or ""), str(refused)
