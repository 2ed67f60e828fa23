"""check.module(part, level, example=(args, kwargs)): the part called as one real call of it calls it (issue 46).

The example settles what the judge would otherwise guess: which arguments are the inputs, whether a mask is passed
and of what kind, and extra inputs (cos/sin tables) passed through, recomputed in the run's dtype.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from parity_tests import check
from parity_tests.__main__ import main
from parity_tests.check import cli
from parity_tests.corpus.unseen import (
    D,
    H,
    SoftmaxOverQueries,
    any_mask_causal,
    any_mask_causal_example,
    table_attention,
    table_attention_example,
)


def test_attention_handed_its_tables_is_judged_from_an_example():
    # forward(x, cos, sin, mask): float32 tables and a boolean causal mask in the example; the float64 run gets
    # the tables recomputed in float64 (passed as given, they would fail the 1e-10 bar at ~1e-8)
    result = check.module(table_attention(), "multi_head_attention", n_heads=H, example=table_attention_example())
    assert result.passed, str(result)
    assert result.conventions["call"] == "as the example calls it"
    assert result.conventions["mask"] == "mask: bool_keep (T, T)" and result.config.positional == "rope"
    assert max(r.error for r in result.rows if r.dtype == "float64") < 1e-13, str(result)


def test_an_example_does_not_hide_a_mistake():
    torch.manual_seed(0)
    wrong = SoftmaxOverQueries()
    result = check.module(wrong, "multi_head_attention", n_heads=H, example=table_attention_example())
    assert not result.passed and (result.diagnoses or result.unexplained or result.unsupported), str(result)


def test_a_block_that_takes_any_mask_for_causal_still_fails_given_a_padding_mask():
    # its example passes a padding mask: the block reads it as causal (is_causal = mask is not None)
    (x,), _ = any_mask_causal_example()
    keep = torch.ones(2, 7, dtype=torch.bool)
    result = check.module(any_mask_causal(), "encoder_layer", n_heads=H, example=((x,), {"mask": keep}))
    assert not result.passed and result.conventions == {}, str(result)
    assert result.assumed["mask"] == "mask: bool_keep (B, T)"
    assert result.first_divergence == "qkv" and result.unexplained, str(result)


@pytest.mark.parametrize(
    "example",
    [[(torch.zeros(2, 7, D),), {}], (torch.zeros(2, 7, D), {}), ((torch.zeros(2, 7, D),), []), ((),)],
    ids=["a list", "args not a tuple", "kwargs not a dict", "one element"],
)
def test_an_example_of_the_wrong_form_is_refused(example):
    with pytest.raises(TypeError, match="example must be"):
        check.module(any_mask_causal(), "encoder_layer", n_heads=H, example=example)


def test_an_example_and_a_call_adapter_are_refused_together():
    with pytest.raises(TypeError, match="not both"):
        check.module(any_mask_causal(), "encoder_layer", example=any_mask_causal_example(), call=lambda m, x: m(x))


def test_cli_example_is_called_in_the_judging_process():
    # what the CLI's child process runs: FUNC() gives example=; a FUNC that is not a function is a bad argument
    target, example = "parity_tests.corpus.unseen:any_mask_causal", "parity_tests.corpus.unseen:any_mask_causal_example"
    verdict = cli.judge(target, "encoder_layer", {"n_heads": H}, None, None, {"example": example})
    assert verdict["status"] == "judged" and verdict["passed"], verdict["report"]
    assert "call=as the example calls it" in verdict["report"]
    verdict = cli.judge(
        target, "encoder_layer", {"n_heads": H}, None, None, {"example": "parity_tests.corpus.unseen:D"}
    )
    assert verdict["status"] == "bad_argument" and "--example" in verdict["reason"]


@pytest.mark.slow
def test_cli_example_flag(capsys):
    # the block judged as its own encoder calls it (no mask): it passes (exit 0); without the example it fails
    base = ["check", "parity_tests.corpus.unseen:any_mask_causal", "encoder_layer", "--n-heads", str(H)]
    assert main([*base, "--example", "parity_tests.corpus.unseen:any_mask_causal_example"]) == 0, capsys.readouterr()
    assert "call=as the example calls it" in capsys.readouterr().out
    assert main(base) == 1


def sdpa(q, k, v, mask=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_a_function_is_judged_at_the_example_lengths_and_an_example_without_inputs_is_said():
    q, k = torch.randn(2, 2, 4, 8), torch.randn(2, 2, 5, 8)
    keep = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    result = check.module(sdpa, "scaled_dot_product_attention", example=((q, k, k), {"mask": keep}))
    assert result.passed and result.conventions["mask"] == "mask: bool_keep (B, 1, 1, T)", str(result)
    said = check.module(sdpa, "scaled_dot_product_attention", example=((1,), {}))
    assert not said.passed and said.error.startswith("could not judge: the example passes no tensor"), said.error


def test_the_probe_takes_its_sizes_from_the_example_and_leaves_the_defaults_alone():
    """The example's batch (4) and length (7) reach the forward; the probes' module-level defaults, which another
    check running meanwhile would read, stay as they are while it runs."""
    from parity_tests.check import probes

    seen = []

    class Recording(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(D)

        def forward(self, x):
            seen.append((tuple(x.shape), probes.SIZES, probes.B))
            return self.norm(x)

    result = check.module(Recording(), "layer_norm", example=((torch.randn(4, 7, D),), {}))
    assert result.passed, str(result)
    assert {shape for shape, _, _ in seen} == {(4, 7, D)}, seen
    assert {(sizes, B) for _, sizes, B in seen} == {(probes.Sizes(), 3)}, seen


class _PositionsGiven(nn.Module):
    """A Llama whose forward takes its position ids (input_ids, position_ids, attention_mask), as a generation loop
    calls it."""

    def __init__(self, second: str = "ok") -> None:
        super().__init__()
        from parity_tests.corpus import fresh43

        torch.manual_seed(0)
        self.body = fresh43._jitter(fresh43.LlamaBody(second))
        self.prepare = fresh43._prepare_4d

    def forward(self, input_ids, position_ids, attention_mask):
        keep = attention_mask.long()
        return self.body.run(input_ids, position_ids, self.prepare(keep, self.body.embed_tokens.weight.dtype), keep)


def _left_padded(first: int) -> tuple:
    """Two sequences of 7, the first left-padded by 2, position ids counting each one's real tokens from `first`."""
    ids = torch.randint(1, 26, (2, 7), generator=torch.Generator().manual_seed(1))
    keep = torch.ones(2, 7, dtype=torch.long)
    keep[0, :2] = 0
    positions = (keep.cumsum(-1) - 1 + first).masked_fill(keep == 0, 1)
    return (ids.masked_fill(keep == 0, 0), positions, keep), {}


@pytest.mark.parametrize("first", [0, 1, 3])
def test_position_ids_counting_the_real_tokens_from_any_start_are_given_alike(first):
    """An example's left-padded position ids that count the real tokens from 0 (HF's cumsum - 1), from 1 (the bare
    cumulative sum) or from 3 are given to the probe as first .. T - 1 + first: RoPE reads only q - k, so each
    passes, and a mistake inside is still named where it runs."""
    result = check.module(_PositionsGiven(), "transformer_lm", example=_left_padded(first))
    assert result.passed, str(result)
    assert result.conventions["position_ids"] == f"position_ids: the positions {first} .. T - {1 - first}, (B, T)"
    wrong = check.module(_PositionsGiven("inverted"), "transformer_lm", example=_left_padded(first))
    assert not wrong.passed and [(d.id, d.where) for d in wrong.diagnoses][:1] == [
        ("attention.mask_inverted", "body.layers.1.self_attn")
    ], str(wrong)


class _CrossOfOneMemory(nn.Module):
    """forward(x, memory, key_padding_mask): nn.MultiheadAttention reading the memory as its keys and values."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x, memory, key_padding_mask=None):
        return self.attn(x, memory, memory, key_padding_mask=key_padding_mask, need_weights=False)[0]


def test_an_example_of_two_tensors_and_a_mask_is_a_query_and_one_memory():
    # the key is the value on both sides, masked or not (session.probe_of); two tensors, not three, in the example
    torch.manual_seed(0)
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[1, -2:] = True
    example = ((torch.randn(2, 4, 16), torch.randn(2, 5, 16)), {"key_padding_mask": mask})
    for given in ({}, {"example": example}):
        result = check.module(_CrossOfOneMemory().eval(), "multi_head_attention", **given)
        assert result.passed, str(result)
        assert result.conventions["attention"] == "cross-attention: the query and one memory (key = value)"
