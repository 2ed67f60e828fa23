"""check.module: users' torch modules judged by the NumPy reference, and their mistakes named.

Every catalogue id is put into a deliberately broken module (parity_tests.user_models) and must be named, at the
component level and inside a layer or a whole model (where the first divergence must be the broken submodule);
the same modules written right, in each supported layout and mask convention, and torch.nn's own modules, must
pass with no diagnosis and no map given.
"""

from __future__ import annotations

import json
import math
import re
import warnings

import pytest
import torch
from torch import nn

from parity_tests import check
from parity_tests import user_models as U
from parity_tests.check.report import CATALOGUE
from parity_tests.corpus import fresh5


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


def ids(result) -> list[str]:
    return [d.id for d in result.diagnoses]


# -- components ---------------------------------------------------------------------------------------------------

ATTENTION_MISTAKES = [
    "attention.wrong_scale",
    "attention.no_max_subtraction",
    "attention.mask_after_softmax",
    "attention.mask_ignored",
    "attention.mask_inverted",
    "attention.padding_on_queries",
    "attention.heads_without_transpose",
    "attention.softmax_wrong_axis",
    "dropout.active_in_eval",
]


@pytest.mark.parametrize("mistake", ATTENTION_MISTAKES)
def test_multi_head_attention_mistake_is_named(mistake):
    # An inverted polarity is a convention unless the caller states the convention (mask="bool_keep").
    mask = "bool_keep" if mistake == "attention.mask_inverted" else None
    result = check.module(U.Attention(8, 2, mistake=mistake), "multi_head_attention", mask=mask)
    assert not result.passed
    assert ids(result)[0] == mistake, str(result)


@pytest.mark.parametrize(
    "mistake",
    [
        "attention.wrong_scale",
        "attention.no_max_subtraction",
        "attention.mask_after_softmax",
        "attention.mask_ignored",
        "attention.mask_inverted",
        "attention.softmax_wrong_axis",
    ],
)
def test_scaled_dot_product_attention_function_mistake_is_named(mistake):
    def attention(q, k, v, mask=None):
        return U.attention_function(q, k, v, mask, mistake)

    result = check.module(attention, "scaled_dot_product_attention", mask="int_keep", n_heads=2)
    assert not result.passed
    assert ids(result)[0] == mistake, str(result)


def test_scaled_dot_product_attention_wrong_scale_names_the_head_size():
    """Heads already split (B, H, T, Dh): the sizes named are the probe's own (Dh the last axis, d_model = H Dh)."""

    def attention(q, k, v, mask=None):
        return U.attention_function(q, k, v, mask, "attention.wrong_scale")  # divides by d_k, not its root

    (diagnosis,) = check.module(attention, "scaled_dot_product_attention", mask="int_keep", n_heads=2).diagnoses
    found = re.search(r"divided by d_head = (\d+): the root is missing", diagnosis.message)
    assert found, diagnosis.message
    Dh = int(found.group(1))
    assert f"expected sqrt(d_head) = {math.sqrt(Dh):.3g}" in diagnosis.message, diagnosis.message


def test_wrong_scale_names_the_precedence_trap():
    result = check.module(U.Attention(16, 2, mistake="attention.wrong_scale"), "multi_head_attention")
    (diagnosis,) = result.diagnoses
    assert "d_model / 2 = 8" in diagnosis.message and "(d_model ** 1) / 2" in diagnosis.message
    assert "expected sqrt(d_head) = 2.83" in diagnosis.message


class _CappedAttention(nn.Module):
    """A causal attention whose scores, times `scale`, are squashed by Gemma 2's soft cap: cap * tanh(s / cap)."""

    def __init__(self, D: int = 16, H: int = 2, cap: float = 2.0, scale: float | None = None) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D, bias=False) for _ in range(4))
        self.H, self.cap, self.scale = H, cap, (D // H) ** -0.5 if scale is None else scale
        with torch.no_grad():  # scores large enough for the cap to bite
            self.q.weight.mul_(3), self.k.weight.mul_(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = (f(x).view(B, T, self.H, -1).transpose(1, 2) for f in (self.q, self.k, self.v))
        s = self.cap * torch.tanh(q @ k.transpose(-2, -1) * self.scale / self.cap)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return self.o((s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D))


def test_the_attention_level_reads_the_stated_scale_and_soft_cap():
    """reference.run_attention: the scores' rule holds the config's attention_scale and attn_softcap; a wrong scale is
    tried against the stated one (mistakes._divisors: the default 1 / sqrt(d_head) is then a mistake)."""
    for stated in ({"attn_softcap": 2.0}, {}):  # the cap stated, or read from the forward (dataflow.softcaps)
        capped = check.module(_CappedAttention(), "multi_head_attention", **stated)
        assert capped.passed, str(capped)
    assert not check.module(_CappedAttention(), "multi_head_attention", attn_softcap=4.0).passed  # the cap counts
    scaled = check.module(_CappedAttention(cap=1e9, scale=0.125), "multi_head_attention", attention_scale=0.125)
    assert scaled.passed, str(scaled)
    default = check.module(_CappedAttention(cap=1e9), "multi_head_attention", attention_scale=0.125)
    assert ids(default) == ["attention.wrong_scale"] and "the default" in default.diagnoses[0].message, str(default)


@pytest.mark.parametrize("mistake", ["layer_norm.unbiased_variance", "layer_norm.eps_outside_sqrt"])
def test_layer_norm_mistake_is_named(mistake):
    result = check.module(U.LayerNorm(8, mistake=mistake), "layer_norm")
    assert not result.passed and ids(result) == [mistake], str(result)
    assert "eps = 1e-06" in result.diagnoses[0].message  # the user's own eps, read from the module


class AxisLayerNorm(nn.Module):
    """A layer norm whose statistics run over `dims` (the features, -1, is right; (B, T, D) code ported from
    (T, D) code often keeps dim=0 or dim=1)."""

    def __init__(self, features: int, dims):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(features)), nn.Parameter(torch.zeros(features))
        self.dims, self.eps = dims, 1e-5

    def forward(self, x):
        mean = x.mean(self.dims, keepdim=True)
        var = x.var(self.dims, keepdim=True, unbiased=False)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


@pytest.mark.parametrize("dims", [1, 0, (0, 1, 2)])
def test_layer_norm_over_the_wrong_axis_is_named(dims):
    torch.manual_seed(0)
    result = check.module(AxisLayerNorm(8, dims), "layer_norm")
    assert not result.passed and ids(result) == ["layer_norm.wrong_axis"], str(result)
    assert check.module(AxisLayerNorm(8, -1), "layer_norm").passed


def test_layer_norm_over_the_wrong_axis_is_named_inside_a_layer():
    torch.manual_seed(0)
    layer = U.EncoderLayer(8, 2, 16)
    layer.ff_layer_norm = AxisLayerNorm(8, 1)
    result = check.module(layer, "encoder_layer")
    assert [(d.id, d.where) for d in result.diagnoses] == [("layer_norm.wrong_axis", "ff_layer_norm")], str(result)


@pytest.mark.parametrize("mistake", ["embedding.missing_scale", "embedding.double_scale"])
def test_embedding_mistake_is_named(mistake):
    result = check.module(U.Embedding(11, 8, mistake=mistake), "embedding")
    assert not result.passed and ids(result) == [mistake], str(result)


def test_positions_wrong_frequencies_is_named():
    result = check.module(U.Positions(8, mistake="positions.wrong_frequencies"), "positional_encoding")
    assert not result.passed and ids(result) == ["positions.wrong_frequencies"], str(result)


@pytest.mark.parametrize(
    "make, reference",
    [
        (lambda: U.Attention(8, 2), "multi_head_attention"),
        (lambda: U.RawAttention(8, 2), "multi_head_attention"),  # raw (in, out) parameters, no output bias
        (lambda: U.GPT2Attention(8, 2), "multi_head_attention"),  # fused c_attn, Conv1D (in, out), additive mask
        (lambda: U.PerHeadAttention(8, 2), "multi_head_attention"),  # one Linear per head and role
        (lambda: torch.nn.MultiheadAttention(8, 2), "multi_head_attention"),  # sequence-first, fused in_proj
        (lambda: torch.nn.MultiheadAttention(8, 2, bias=False, batch_first=True), "multi_head_attention"),
        (lambda: U.LayerNorm(8), "layer_norm"),
        (lambda: torch.nn.LayerNorm(8), "layer_norm"),
        (lambda: fresh5.BufferShiftLayerNorm(8), "layer_norm"),  # one scale, F.layer_norm: the root module's
        (lambda: U.FeedForward(8, 16), "feed_forward"),
        (lambda: U.Embedding(11, 8), "embedding"),
        (lambda: U.Positions(8), "positional_encoding"),  # a float32-built sinusoid buffer
        (lambda: U.attention_function, "scaled_dot_product_attention"),
    ],
)
def test_correct_component_passes_with_no_map(make, reference):
    result = check.module(make(), reference, n_heads=2)
    assert result.passed, str(result)
    assert result.diagnoses == [] and result.first_divergence is None
    assert {r.dtype for r in result.rows} == {"float64", "float32"}


@pytest.mark.parametrize("kind", ["bool_masked", "additive", "bool_keep", "int_keep"])
@pytest.mark.parametrize("shape", ["(B, T)", "(B, 1, T)", "(B, 1, 1, T)"])
def test_mask_conventions_are_detected(kind, shape):
    result = check.module(U.ConventionAttention(8, 2, kind, shape), "multi_head_attention")
    assert result.passed, str(result)
    assert shape in result.conventions["mask"]


def test_map_is_reported_and_can_be_passed_back():
    result = check.module(U.RawAttention(8, 2), "multi_head_attention", n_heads=2)
    assert result.mapping["W_q"] == ("q_proj.weight", "transposed")
    assert "held at zero" in result.mapping["(no parameter: out_proj.bias)"][1]
    again = check.module(U.RawAttention(8, 2), "multi_head_attention", n_heads=2, mapping=result.mapping)
    assert again.passed, str(again)
    fused = check.module(torch.nn.MultiheadAttention(8, 2), "multi_head_attention")
    assert fused.mapping["in_proj_weight"] == ("{q,k,v}_proj.weight", "fused rows q, k, v")
    assert check.module(torch.nn.MultiheadAttention(8, 2), "multi_head_attention", mapping=fused.mapping).passed


def test_map_passed_back_is_read_from_its_data_not_its_printed_notes():
    """The map is data (weight_map.MapEntry: the links it was printed from): passed back, or through the CLI's
    JSON, it is read from that data, so blanked notes change nothing; a hand-written map is read from its notes."""
    from parity_tests.check import weight_map as WM

    module = torch.nn.MultiheadAttention(8, 2)
    result = check.module(module, "multi_head_attention")
    blank = {k: WM.MapEntry(v[0], "", v.link, v.kind) for k, v in result.mapping.items()}
    assert check.module(module, "multi_head_attention", mapping=blank).passed
    as_json = json.loads(json.dumps(result.to_dict()["mapping"]))
    assert all(len(v) == 3 and "kind" in v[2] for v in as_json.values()), as_json
    blank_json = {k: [v[0], "", v[2]] for k, v in as_json.items()}
    assert check.module(module, "multi_head_attention", mapping=blank_json).passed
    by_hand = {k: (v[0], v[1]) for k, v in result.mapping.items()}  # plain pairs, as a user would type them
    assert check.module(module, "multi_head_attention", mapping=by_hand).passed


class HeadTensorAttention(nn.Module):
    """q, k, v and the output as 3-axis parameters einsum reads ("heads_first": TransformerLens's W_Q (H, D, Dh) and
    W_O (H, Dh, D), with its per-head biases b_Q (H, Dh) and output bias b_O (D,)); forward(x, mask), 1 = attend."""

    LAYOUTS = {"heads_first": ("hde", "hed"), "rows": ("hed", "dhe"), "columns": ("dhe", "hde")}

    def __init__(self, d_model: int, n_heads: int, layout: str):
        super().__init__()
        qkv, out = self.LAYOUTS[layout]
        size = {"h": n_heads, "d": d_model, "e": d_model // n_heads}
        self.W_Q, self.W_K, self.W_V = (nn.Parameter(torch.randn(*(size[c] for c in qkv))) for _ in range(3))
        self.W_O = nn.Parameter(torch.randn(*(size[c] for c in out)))
        self.b_Q, self.b_K, self.b_V = (nn.Parameter(torch.randn(n_heads, d_model // n_heads)) for _ in range(3))
        self.b_O = nn.Parameter(torch.randn(d_model))
        self.into, self.out_of = f"btd,{qkv}->bhte", f"bhse,{out}->bsd"

    def forward(self, x, mask):
        q = torch.einsum(self.into, x, self.W_Q) + self.b_Q[:, None]
        k = torch.einsum(self.into, x, self.W_K) + self.b_K[:, None]
        v = torch.einsum(self.into, x, self.W_V) + self.b_V[:, None]
        scores = torch.einsum("bhse,bhte->bhst", q, k) / math.sqrt(q.shape[-1])
        probs = scores.masked_fill(mask[:, None, None, :] == 0, float("-inf")).softmax(-1)
        return torch.einsum(self.out_of, probs @ v, self.W_O) + self.b_O


@pytest.mark.parametrize(
    "layout, q_note, o_note",
    [
        ("heads_first", "split into 2 heads, each transposed", "transposed, split into 2 heads"),
        ("rows", "split into 2 heads", "split into 2 heads"),
        ("columns", "transposed, split into 2 heads", "transposed, split into 2 heads, each transposed"),
    ],
)
def test_head_tensors_einsum_reads_are_linked_head_by_head(layout, q_note, o_note):
    """A 3-axis parameter einsum reads is a projection, laid out as the equation says (mapping.head_layout), its
    gradients compared as the reference's rows (mapping.scatter); the printed notes passed back by hand read back."""
    torch.manual_seed(0)
    module = HeadTensorAttention(8, 2, layout)
    result = check.module(module, "multi_head_attention")
    assert result.passed, str(result)
    assert result.mapping["W_Q"] == ("q_proj.weight", q_note) and result.mapping["W_O"] == ("out_proj.weight", o_note)
    assert result.mapping["b_Q"] == ("q_proj.bias", "as is")  # (H, Dh) from (H * Dh,)
    by_hand = {k: (v[0], v[1]) for k, v in result.mapping.items()}
    assert check.module(module, "multi_head_attention", mapping=by_hand).passed


class TurnedHeadTensors(HeadTensorAttention):
    """TransformerLens's tensors, but q, k and v read through a transpose: einsum("btd,hed->bhte", x, W.mT)."""

    def forward(self, x, mask):
        q, k, v = (torch.einsum("btd,hed->bhte", x, w.transpose(1, 2)) for w in (self.W_Q, self.W_K, self.W_V))
        probs = (torch.einsum("bhse,bhte->bhst", q, k) / 2).masked_fill(mask[:, None, None, :] == 0, -math.inf)
        return torch.einsum(self.out_of, probs.softmax(-1) @ v, self.W_O)


def test_a_head_tensor_read_through_a_transpose_is_refused_naming_it():
    """head_layout reads a 3-axis weight's axes from the einsum only as stored: through a transpose it is refused,
    naming the parameter, never linked in a layout it does not have."""
    result = check.module(TurnedHeadTensors(8, 2, "heads_first"), "multi_head_attention")
    assert not result.passed and "W_Q acts as a projection" in (result.error or ""), str(result)
    assert "a 3-D one einsum or @ reads as stored); pass mapping=" in result.error


@pytest.mark.parametrize(
    "edit, said",
    [
        ({"in_proj_weight": ("{q,k,v}_proj.weight", "fused rows q, k, v (by hand)")}, "names 'v \\(by hand\\)_proj"),
        ({"in_proj_weight": ("q_proj.wieght", "as is")}, "names 'q_proj.wieght', which the reference"),
        ({"in_proj_weight": ("q_proj.weight", "as is")}, r"hold 64 numbers, the module's 'in_proj_weight' \(24, 8\)"),
        ({"in_proj_weight": ("q_proj.weight", "rows 4:12")}, "rows 4:12 of 'q_proj.weight'"),
        ({"in_proj_wieght": ("q_proj.weight", "as is")}, "no parameter or buffer of that name"),
        ({"(no parameter: x)": ("x.bias", "held at zero")}, "holds 'x.bias' at zero, which the reference"),
    ],
)
def test_a_given_map_naming_what_is_not_there_is_refused_naming_the_entry(edit, said):
    """A hand-written map's typo (a reference name, a user name, rows, a size) is refused naming the entry,
    before anything runs (it failed as a KeyError or a reshape inside "could not be called" before)."""
    module = torch.nn.MultiheadAttention(8, 2)
    given = {k: tuple(v) for k, v in check.module(module, "multi_head_attention").mapping.items()} | edit
    refused = check.module(
        module, "multi_head_attention", mapping=given
    )  # could not judge: said in result.error, never raised
    assert not refused.passed and re.search(said, refused.error or ""), str(refused)


def test_report_prints_every_section():
    result = check.module(U.Attention(8, 2, mistake="attention.wrong_scale"), "multi_head_attention")
    text = str(result)
    for part in (
        "FAILED",
        "conventions assumed (none reproduced the reference; judged under the closest):",  # nothing confirmed them
        "config assumed (the closest, not confirmed):",
        "mapping",
        "float64 (bar 1e-10)",
        "diagnosis: attention.wrong_scale",
    ):
        assert part in text
    json.dumps(result.to_dict())  # the CLI's --json


def test_user_module_is_not_modified():
    module = U.Attention(8, 2)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    check.module(module, "multi_head_attention")
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert next(module.parameters()).dtype == torch.float32


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="reference must be one of"):
        check.module(U.Attention(8, 2), "attention")
    with pytest.raises(ValueError, match="mask must be one of"):
        check.module(U.Attention(8, 2), "multi_head_attention", mask="ones")
    with pytest.raises(TypeError, match="user_module must be a torch.nn.Module"):
        check.module("model", "transformer")
    refused = check.module(
        torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(4)]), "multi_head_attention"
    )  # could not judge: said in result.error, never raised
    assert not refused.passed and re.search("pass n_heads=", refused.error or ""), str(refused)
    with pytest.raises(TypeError, match="unknown keyword"):
        check.module(U.Attention(8, 2), "multi_head_attention", heads=2)


def test_catalogue_has_every_design_id():
    assert len(CATALOGUE) == 46  # 18 original, 7 Llama, 12 backward (test_grader.py), dtype.float32_island,
    # q_k_swapped, layer_norm.wrong_axis, Gemma 2's two soft-cap mistakes,
    # GPT-OSS's sink left out, QuickGELU's constant,
    # a ViT's positions added before the class token,
    # a scaled RoPE's attention factor left off (fresh45)
    assert {"attention.masks_swapped", "embedding.double_scale", "positions.wrong_frequencies"} <= set(CATALOGUE)


def test_every_registered_mistake_says_where_it_is_looked_for():
    """The registry of mistakes: every forward unit's entry has variants at that unit, each with a message, and
    applies to its unit's level and to the layers and models holding it; a backward entry has its tests, by stage,
    and the pairs it applies to; a probe's entry applies everywhere."""
    from parity_tests.check import backward_mistakes as BM
    from parity_tests.check import mistakes as MK
    from parity_tests.check.levels import LEVELS
    from parity_tests.check.report import levels_of

    site = MK.Site(8, 4)
    for mistake in MK.MISTAKES:
        levels = levels_of(mistake)
        assert levels and set(levels) <= set(LEVELS) | set(check.PAIRS), mistake.id
        if mistake.unit == MK.BACKWARD:
            assert mistake.tests and all(stage in ("shape",) + BM.STAGES for stage, _ in mistake.tests), mistake.id
            continue
        if mistake.unit in (None, MK.ATTENTION):
            continue
        found = mistake.applies(mistake.unit, site)
        assert found and all(message and knobs for message, knobs in found), mistake.id
        own = [name for name in levels if LEVELS[name].unit == mistake.unit]
        assert own and "transformer" in levels, (mistake.id, levels)


def test_every_registered_attention_mistake_has_a_variant_that_changes_the_output():
    """The registry of mistakes (check/mistakes.py): each attention entry yields variants at some attention site
    (padded, causal, rotary, grouped-query), and one of them computes something other than the reference (the
    renormalised mask after the softmax equals it but at rows with no key left)."""
    import numpy as np

    from parity_tests.check import mistakes as MK
    from parity_tests.check import variants as VR
    from transformer_spec.config import RopeScaling

    rng = np.random.default_rng(0)
    B, H, T, Dh = 2, 2, 4, 4
    q, k, v = (rng.standard_normal((B, H, T, Dh)) for _ in range(3))
    pad = np.ones((B, 1, 1, T), bool)
    pad[1, ..., -1] = False
    causal = np.tril(np.ones((T, T), bool))[None, None]
    sites = [
        MK.Site(H * Dh, Dh, pad),
        MK.Site(H * Dh, Dh, causal, causal=True, pad=pad, swap=pad),
        MK.Site(H * Dh, Dh, None, rope=True, gqa=True),
        MK.Site(H * Dh, Dh, causal, causal=True, softcap=1.5),  # Gemma 2's cap on the scores
        MK.Site(H * Dh, Dh, causal, causal=True, sinks=True),  # GPT-OSS's sink logit per head
        MK.Site(H * Dh, Dh, None, rope=True, scaling=(RopeScaling("yarn", 4.0, 8), 32)),  # YaRN's attention factor
    ]
    for mistake in (m for m in MK.MISTAKES if m.unit == MK.ATTENTION):
        found = [(s, knobs) for s in sites for _, knobs in mistake.variants(s)]
        assert found, f"{mistake.id}: no variant at any site"
        whole = {"transpose", "rope_v", "pairs", "k_shift", "tile", "scaling"}
        heads = [(s, dict(kn)) for s, kn in found if not set(kn) & whole]
        if not heads:
            continue  # knobs of the whole multi-head attention only: test_check_llama and the corpus name them
        differences = []
        for site, knobs in heads:
            own = {"softcap": site.softcap, "sinks": rng.standard_normal(H) if site.sinks else None}
            reference = VR.attention_heads(q, k, v, site.keep, **own)
            variant = VR.attention_heads(q, k, v, knobs.pop("keep", site.keep), **(own | knobs))
            assert np.isfinite(variant).all(), (mistake.id, knobs)
            differences.append(np.abs(variant - reference).max())
        assert max(differences) > 1e-6, mistake.id


def test_the_per_part_attention_carries_the_whole_models_terms_on_the_scores():
    """variants.rope_knobs: the in-situ reference attention adds what score_mod adds (the scale by layer, ALiBi, the
    soft cap), equal to the whole model's attention (numpy_transformer, that ScoreMod) on the same q, k, v: ALiBi's
    causal form (the key index, uncapped) and the reference's -m |i - j| (capped, or not causal)."""
    import numpy as np

    from numpy_transformer import TransformerConfig, scaled_dot_product_attention_forward
    from numpy_transformer.model import score_mod
    from parity_tests.check import variants as VR

    rng = np.random.default_rng(0)
    B, H, T, Dh = 2, 4, 5, 3
    q, k, v = (rng.standard_normal((B, H, T, Dh)) for _ in range(3))
    causal = np.tril(np.ones((T, T), bool))[None, None]
    base = dict(src_vocab_size=7, tgt_vocab_size=7, d_model=H * Dh, n_heads=H, d_ff=8, n_encoder_layers=0)
    for cap, decoder, keep in ((2.0, True, causal), (None, True, causal), (2.0, False, None), (None, False, None)):
        cfg = TransformerConfig(**base, positional="alibi", attention_scale_by_layer=True, attn_softcap=cap)
        knobs = VR.rope_knobs(cfg, True, 2, causal=decoder)
        assert knobs["alibi"] is not None and knobs["divisor"] == 3 * math.sqrt(Dh) and knobs["softcap"] == cap
        ours = VR.attention_heads(q, k, v, keep, **{n: knobs[n] for n in ("divisor", "alibi", "softcap")})
        whole = scaled_dot_product_attention_forward(q, k, v, mod=score_mod(cfg, decoder, 2))[0]
        assert np.abs(ours).max() > 0.1 and np.allclose(ours, whole, atol=1e-12), (cap, decoder)
    bare = VR.attention_heads(q, k, v, None, divisor=3 * math.sqrt(Dh))
    assert np.abs(bare - ours).max() > 1e-3  # the terms change the output: the test can fail


# -- layers and torch.nn ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, reference",
    [
        (lambda: U.EncoderLayer(8, 2, 16), "encoder_layer"),
        (lambda: U.DecoderLayer(8, 2, 16), "decoder_layer"),
        (lambda: torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), "encoder_layer"),
        (lambda: torch.nn.TransformerEncoderLayer(8, 2, 16, 0.0, "gelu", norm_first=True), "encoder_layer"),
        (lambda: torch.nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0), "decoder_layer"),
        (lambda: torch.nn.TransformerDecoderLayer(8, 2, 16, 0.0, batch_first=True, norm_first=True), "decoder_layer"),
    ],
)
def test_correct_layer_passes_with_no_map(make, reference):
    result = check.module(make(), reference)
    assert result.passed, str(result)


def test_torch_layer_config_is_inferred():
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, 0.0, "gelu", norm_first=True)
    result = check.module(layer, "encoder_layer")
    assert result.config.norm_first and result.config.activation == "gelu"
    assert result.conventions["batch_first"] is False


@pytest.mark.parametrize(
    "mistake",
    [
        "attention.mask_ignored",
        "attention.mask_after_softmax",
        "attention.padding_on_queries",
        "attention.heads_without_transpose",
        "attention.softmax_wrong_axis",
        "attention.wrong_scale",
    ],
)
def test_encoder_layer_mistake_is_found_in_its_submodule(mistake):
    result = check.module(U.EncoderLayer(8, 2, 16, mistake=mistake), "encoder_layer")
    assert not result.passed
    assert result.first_divergence == "self_attention"
    assert ids(result) == [mistake], str(result)


@pytest.mark.parametrize("mistake", ["attention.no_max_subtraction", "dropout.active_in_eval"])
def test_probes_find_what_outputs_do_not_show(mistake):
    result = check.module(U.EncoderLayer(8, 2, 16, mistake=mistake), "encoder_layer")
    assert not result.passed and ids(result) == [mistake], str(result)
    assert result.diagnoses[0].where == "self_attention"


# -- whole models in three tutorial styles -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, reference, kwargs, conventions",
    [
        (U.Seq2Seq, "transformer", {}, {"output": "probs", "batch_first": True}),
        (U.HeadwiseLM, "transformer_lm", {"n_heads": 2}, {"output": "logits", "batch_first": False}),
        (U.FusedTransformer, "transformer", {}, {"output": "logits", "batch_first": True}),
    ],
)
def test_tutorial_model_passes(make, reference, kwargs, conventions):
    result = check.module(make(), reference, **kwargs)
    assert result.passed, str(result)
    assert conventions.items() <= result.conventions.items()


def test_tutorial_models_config_is_inferred():
    lm = check.module(U.HeadwiseLM(), "transformer_lm", n_heads=2)
    c = lm.config
    assert (c.norm_first, c.positional, c.scale_embeddings, c.n_decoder_layers) == (True, "learned", False, 2)
    assert lm.mapping["blocks.0.sa.heads.1.query.weight"] == ("decoder.layers.0.self_attn.q_proj.weight", "rows 4:8")
    fused = check.module(U.FusedTransformer(), "transformer")
    assert fused.config.activation == "gelu" and not fused.config.norm_first
    assert "additive" in fused.conventions["mask"]


@pytest.mark.parametrize(
    "make, reference, kwargs, mistake, where",
    [
        (U.Seq2Seq, "transformer", {}, "attention.causal_hides_diagonal", "decoder.layers.0.self_attention"),
        (U.Seq2Seq, "transformer", {}, "attention.causal_shows_next", "decoder.layers.0.self_attention"),
        (U.Seq2Seq, "transformer", {}, "attention.not_causal", "decoder.layers.0.self_attention"),
        (U.Seq2Seq, "transformer", {}, "attention.mask_inverted", "encoder.layers.0.self_attention"),
        (U.Seq2Seq, "transformer", {}, "attention.masks_swapped", "decoder.layers.0.self_attention"),
        (U.Seq2Seq, "transformer", {"scale_embeddings": True}, "embedding.missing_scale", "encoder.tok_embedding"),
        (U.Seq2Seq, "transformer", {}, "embedding.double_scale", "encoder.tok_embedding"),
        (U.HeadwiseLM, "transformer_lm", {"n_heads": 2}, "attention.causal_hides_diagonal", "blocks.0.sa"),
        (U.HeadwiseLM, "transformer_lm", {"n_heads": 2}, "attention.wrong_scale", "blocks.0.sa"),
        (U.FusedTransformer, "transformer", {}, "attention.wrong_scale", "encoder.0.attn"),
        (U.FusedTransformer, "transformer", {}, "layer_norm.unbiased_variance", "encoder.0.norm1"),
        (U.FusedTransformer, "transformer", {}, "layer_norm.eps_outside_sqrt", "encoder.0.norm1"),
        (U.FusedTransformer, "transformer", {}, "positions.wrong_frequencies", "positions"),  # the table's module
    ],
)
def test_tutorial_model_mistake_is_found_where_it_is(make, reference, kwargs, mistake, where):
    result = check.module(make(mistake=mistake), reference, **kwargs)
    assert not result.passed
    assert result.first_divergence == where, str(result)
    assert ids(result) == [mistake], str(result)


def test_call_adapter():
    def call(module, src, tgt):
        return module(src, tgt).log()  # the model's probabilities, as log-probabilities

    result = check.module(U.Seq2Seq(), "transformer", call=call)
    assert result.passed and result.conventions["output"] == "log_probs", str(result)


@pytest.mark.parametrize(
    "options",
    [dict(), dict(batch_first=True, norm_first=True, activation="gelu")],
    ids=["post-norm, sequence-first", "pre-norm, gelu, batch-first"],
)
def test_torch_nn_transformer_passes_with_no_map(options):
    with warnings.catch_warnings():  # torch's note that its nested-tensor fast path is off for this layout
        warnings.simplefilter("ignore", UserWarning)
        model = torch.nn.Transformer(8, 2, 2, 1, 16, 0.0, **options)
    result = check.module(model, "transformer")
    assert result.passed, str(result)
    assert result.config.norm_first == options.get("norm_first", False)
    assert result.mapping["encoder.norm.weight"] == ("encoder.final_norm.weight", "as is")


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_model_built_from_torch_layers_passes(norm_first):
    result = check.module(U.TinyEncoder(norm_first=norm_first), "encoder_model")
    assert result.passed, str(result)
    assert (result.config.norm_first, result.config.positional) == (norm_first, "learned")


def test_fully_padded_source_is_reported_not_failed():
    tutorial = check.module(U.Attention(8, 2), "multi_head_attention")  # masked_fill(-1e10): averages the padding
    assert tutorial.passed and any("fully padded source" in note for note in tutorial.notes)
    torch_mha = check.module(torch.nn.MultiheadAttention(8, 2), "multi_head_attention")
    assert torch_mha.passed and not any("fully padded" in note for note in torch_mha.notes)


def test_heads_that_cannot_be_told_apart_are_refused_with_the_candidates():
    class Anonymous(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.parts = torch.nn.ModuleList(torch.nn.Linear(8, 4) for _ in range(6))
            self.mix = torch.nn.Linear(8, 8)

    refused = check.module(
        Anonymous(), "multi_head_attention", n_heads=2
    )  # could not judge: said in result.error, never raised
    assert not refused.passed and re.search(
        r"forward could not be recorded.*parts\.0\.weight \(8 -> 4\).*mapping=", refused.error or ""
    ), str(refused)


def test_a_forward_that_cannot_be_recorded_says_what_it_raised():
    """A model whose forward takes features (an nn.Transformer wrapped), judged at the level whose probe is token
    ids: could not judge, and the message carries what the forward raised, so the wrong level shows at once."""

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.t = torch.nn.Transformer(16, 2, 1, 1, 32, dropout=0.0, batch_first=True)

        def forward(self, src, tgt):
            return self.t(src, tgt)

    refused = check.module(Wrapped(), "transformer", n_heads=2)
    assert not refused.passed and re.search(
        r"forward could not be recorded.*\(its forward raised RuntimeError: the feature number of src and tgt.*\)"
        r"; pass call=",
        refused.error or "",
    ), str(refused)
    # a forward that never ran says nothing of the kind
    assert "its forward raised" not in (check.module(U.Attention(8, 2), "multi_head_attention").error or "")


def test_a_given_mapping_is_read_before_the_pieces_are_dealt():
    """Where the judge cannot deal the pieces itself, mapping= settles it: read first, never refused by the
    dealing it replaces."""

    class Anonymous(torch.nn.Module):  # two heads of 4, their q, k, v as parts 0-5 (q0, q1, k0, k1, v0, v1)
        def __init__(self):
            super().__init__()
            self.parts = torch.nn.ModuleList(torch.nn.Linear(8, 4) for _ in range(6))
            self.mix = torch.nn.Linear(8, 8)

        def forward(self, query, key, value, mask=None):
            B, T, _ = query.shape
            q, k, v = (torch.stack([self.parts[2 * r + h](x) for h in range(2)], 1) for r, x in
                       enumerate((query, key, value)))  # fmt: skip
            scores = q @ k.transpose(-2, -1) / 2.0
            if mask is not None:
                scores = scores.masked_fill(mask == 0, -1e9)
            out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, 8)
            return self.mix(out)

    rows = {0: ("q", "0:4"), 1: ("q", "4:8"), 2: ("k", "0:4"), 3: ("k", "4:8"), 4: ("v", "0:4"), 5: ("v", "4:8")}
    mapping = {
        f"parts.{i}.{t}": (f"{r}_proj.{t}", f"rows {span}") for i, (r, span) in rows.items() for t in ("weight", "bias")
    }
    mapping |= {"mix.weight": ("out_proj.weight", "as is"), "mix.bias": ("out_proj.bias", "as is")}
    result = check.module(Anonymous(), "multi_head_attention", n_heads=2, mapping=mapping)
    assert result.passed, str(result)


def test_one_dtype_only():
    result = check.module(U.Attention(8, 2), "multi_head_attention", dtypes=("float64",))
    assert result.passed and {r.dtype for r in result.rows} == {"float64"}


def test_encoder_and_decoder_stacks():
    encoder = check.module(U.Encoder(), "encoder")
    assert encoder.passed and encoder.reference == "encoder", str(encoder)
    broken = check.module(U.Encoder(mistake="embedding.double_scale"), "encoder")
    assert broken.first_divergence == "tok_embedding" and ids(broken) == ["embedding.double_scale"]
    decoder = check.module(U.Decoder(), "decoder")
    assert decoder.passed, str(decoder)
    assert "trg_mask" in decoder.conventions["mask"] and "src_mask" in decoder.conventions["mask"]


def test_decoder_with_its_output_layer_is_refused():
    class DecoderWithOutput(U.Decoder):
        def __init__(self):
            super().__init__()
            self.fc_out = torch.nn.Linear(8, 11)

    refused = check.module(DecoderWithOutput(), "decoder")  # could not judge: said in result.error, never raised
    assert not refused.passed and re.search("has an output projection.*check the whole model", refused.error or ""), (
        str(refused)
    )


def test_random_state_and_threads_are_left_as_they_were():
    module = U.Attention(8, 2, mistake="dropout.active_in_eval")  # draws random numbers when called
    threads = torch.get_num_threads()
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    check.module(module, "multi_head_attention")
    assert torch.equal(torch.rand(3), expected)
    assert torch.get_num_threads() == threads


def test_annotated_style_model_with_a_call_adapter():
    result = check.module(U.AnnotatedStyle(), "transformer", call=U.annotated_call)
    assert result.passed, str(result)
    assert result.conventions["output"] == "log_probs" and result.config.norm_first
    trap = check.module(U.AnnotatedStyle(mistake="std"), "transformer", call=U.annotated_call)
    assert trap.first_divergence == "encoder.0.sublayer.0.norm", str(trap)
    assert ids(trap) == ["layer_norm.unbiased_variance", "layer_norm.eps_outside_sqrt"]


def test_what_the_judge_cannot_read_is_refused_saying_where():
    """A layer without a feed-forward block: no bare StopIteration from the judge's dealing, a could-not-judge
    saying what the layers lack (and no mapping= offered: none stands for math the module lacks)."""

    class NoFeedForward(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 8)
            self.q, self.k, self.v, self.o = (torch.nn.Linear(8, 8) for _ in range(4))
            self.n1, self.n2 = torch.nn.LayerNorm(8), torch.nn.LayerNorm(8)
            self.head = torch.nn.Linear(8, 10)

        def forward(self, ids):
            x = self.emb(ids)
            a = torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2), -1) @ self.v(x)
            return self.head(self.n2(self.n1(x + self.o(a))))

    refused = check.module(
        NoFeedForward(), "transformer_lm", n_heads=1
    )  # could not judge: said in result.error, never raised
    assert not refused.passed and re.search(
        r"no feed-forward block in the module's layers \(attention alone.*no mapping=", refused.error or ""
    ), str(refused)


def test_roles_come_from_the_computation_not_the_registration_order():
    """An attention registering W_key, W_value, W_query (a book's style), alone and in its block: the query is
    the projection whose product the softmax reads as rows, whatever was registered first."""
    from parity_tests.corpus import book_gpt as BG

    attention = check.module(BG.MultiHeadAttention(16, 16, 16, 0.0, 2), "multi_head_attention", n_heads=2)
    assert attention.passed, str(attention)
    assert attention.mapping["W_query.weight"][0] == "q_proj.weight", str(attention)
    block = check.module(BG.TransformerBlock(BG.GPT_CONFIG), "decoder_only_layer", n_heads=2)
    assert block.passed, str(block)
    assert block.mapping["att.W_key.weight"][0] == "self_attn.k_proj.weight", str(block)


def test_a_variant_names_its_mistake_only_where_it_reproduces_the_output_far_better_than_the_reference():
    """A catalogue variant within float64 precision of the user's output names nothing where the reference is about
    as close (the user's output differs from both by a rounding) or the divergence is itself of a rounding's size."""
    import numpy as np

    from parity_tests.check import variants as VR
    from parity_tests.check.matchers import match_unit

    rng = np.random.default_rng(0)
    x, params = rng.standard_normal((2, 5, 8)), {"weight": 1.0 + 0.2 * rng.standard_normal(8)}

    def named(user, eps):
        return [d.id for d in match_unit("rms_norm", user, x, params, eps, "silu", "")]

    assert named(VR.rms_norm(x, params["weight"], 1e-5, eps_outside=True), 1e-5) == ["rms_norm.eps_outside_sqrt"]
    # eps 1e-14: the mistake moves the output by ~1e-14, under float64's bar: no mistake to name
    assert named(VR.rms_norm(x, params["weight"], 1e-14, eps_outside=True), 1e-14) == []
    # the reference's output off by a rounding (1e-9): the variant (eps 1e-9 outside the root) is within 1e-8 of
    # it, but no closer than the reference itself
    rounded = VR.rms_norm(x, params["weight"], 1e-9) * (1.0 + 1e-9 * rng.standard_normal(x.shape))
    assert named(rounded, 1e-9) == []


def test_a_number_the_embeddings_are_divided_by_is_said_as_a_division():
    """A factor the reference lacks is said in the user's words: embeddings divided by 8 as "divided by 8", not as a
    product by its reciprocal."""
    from parity_tests.corpus import fresh48

    class Divided(fresh48.MiniCPMLM):
        def forward(self, input_ids):
            x = self.embed_tokens(input_ids) / 8.0
            for layer in self.layers:
                x = layer(x)
            return self.lm_head(self.norm(x) / (fresh48.D / self.dim_model_base))

    torch.manual_seed(0)
    result = check.module(Divided(), "transformer_lm", positional="rope", output_scale=0.25)
    assert not result.passed and "embeddings (embed_tokens.weight) are divided by 8," in (result.unsupported or ""), (
        str(result)
    )
