"""The judge on the styles it met in codebases it had never seen (issue 46; parity_tests/corpus/unseen.py).

Each case gets one of the four answers: a pass; a catalogued mistake named at its submodule; "differs at
<submodule>: <op> ..., which the reference has no pair for" (result.unsupported); "could not judge: ...; pass ..."
(result.error). Never an exception, never a failure with neither an id nor a named op. Where the judge gets a case
wrong today, the case is marked xfail (strict) with what it says today; a fix turns the mark into an unexpected pass,
and the mark must then go.
"""

from __future__ import annotations

import pytest
import torch

from parity_tests import check
from parity_tests.corpus.unseen import CASES

# What the judge says today where it is wrong, keyed by case name.
TODAY: dict[str, str] = {
    "inference_llama": "RuntimeError: element 0 of tensors does not require grad (the forward under inference_mode)",
    "inference_llama.kv_heads_tiled": "RuntimeError: element 0 of tensors does not require grad",
    "table_attention": "ValueError: the module's forward could not be recorded (its tables are arguments)",
    "table_lm.partial_rotary": "fails at 4e-2 at blocks.0.attn, not expressible by the config",
    "offset_rms_norm": "fails: dx diverges at 1.0, not expressible",
    "offset_rms_norm.eps_outside_sqrt": "fails with no id: dx diverges at 1.0",
    "frozen_gated_mlp": "ValueError: forward could not be recorded: gate_proj.weight (64 -> 32), read transposed",
    "gemma_lm": "ValueError: could not be called: cannot reshape array of size 1024 into shape (64,32)",
    "gemma_lm.activation_on_up": "ValueError: could not be called (the frozen custom Linear read transposed)",
    "gemma_lm.rms_eps_outside_sqrt": "ValueError: could not be called (the frozen custom Linear read transposed)",
    "seq2seq": "attention.mask_ignored at encoder.0.attn: padded probes although pad_id=None",
    "seq2seq.tied_three_ways": "attention.mask_ignored at encoder.0.attn: padded probes although pad_id=None",
    "seq2seq.wrong_frequencies": "no id: src_embed diverges at 4.5e-2, not expressible",
    "seq2seq.not_causal": "attention.mask_ignored at encoder.0.attn",
    "seq2seq.causal_inverted": "attention.mask_ignored at encoder.0.attn",
    "any_mask_causal": "fails at 1.55 at qkv with no id (a padding mask passed, read as causal)",
    "relu_squared": "no id: d linear1.weight diverges (the reference's tensor named, not the user's op)",
    "quick_gelu": "no id: dx diverges at 2.3e-2",
    "weightless_norms": "ValueError: found 0 norms in the module",
    "previous_token_gate": "ValueError: the feed-forward block smear_gate does not read the attention's output",
}


def _case(name, *values):
    marks = [pytest.mark.xfail(strict=True, reason=TODAY[name])] if name in TODAY else []
    return pytest.param(*values, id=name, marks=marks)


@pytest.mark.parametrize(("factory", "level", "keywords", "expected"), [_case(*case) for case in CASES])
def test_unseen_style_gets_its_verdict(factory, level, keywords, expected):
    torch.manual_seed(0)
    try:  # nothing escapes check.module (pytest's own report of the judge's frames would take minutes)
        result = check.module(factory(), level, **keywords)
    except Exception as exc:
        pytest.fail(f"check.module raised {type(exc).__name__}: {str(exc)[:400]}", pytrace=False)
    if expected == "pass":
        assert result.passed, str(result)
        return
    assert not result.passed, str(result)
    kind, first, second = expected
    if kind == "mistake":  # (id, where)
        assert result.diagnoses, str(result)
        assert (result.diagnoses[0].id, result.diagnoses[0].where) == (first, second), str(result)
    else:  # "no pair" (where, words): said at the user's submodule, in the user's terms
        where, what = first, second
        assert result.unsupported and not result.diagnoses, str(result)
        assert result.unsupported.startswith(f"differs at {where or '(the module)'}: "), result.unsupported
        assert what in result.unsupported and "which the reference has no pair for" in result.unsupported
