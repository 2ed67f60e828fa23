"""transformer_spec.generation, the decoding bookkeeping both sides share: its rules worked by hand, and both
decoding modules refusing the same bad arguments with the same messages."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import numpy_transformer as nt
import torch_transformer as tt
from transformer_spec.config import GenerationRules, TransformerConfig
from transformer_spec.generation import (
    after_eos,
    beam_fill,
    best_finished,
    cannot_improve,
    collect_finished,
    decoding_length,
    forced_token,
    update_stopped,
)

SMALL = dict(
    src_vocab_size=11, tgt_vocab_size=11, d_model=8, n_heads=2, d_ff=16, n_encoder_layers=1, n_decoder_layers=1,
    max_len=12, pad_id=0, bos_id=1, eos_id=2,
)  # fmt: skip


def test_fill_ids_follow_the_rules_then_the_config() -> None:
    config = TransformerConfig(**SMALL)
    assert after_eos(None, config) == 0 and beam_fill(None, config) == 0  # pad_id
    no_pad = TransformerConfig(**{**SMALL, "pad_id": None})
    assert after_eos(None, no_pad) == 2  # the eos id itself
    rules = GenerationRules(fill_id=5, beam_fill_id=2)
    assert after_eos(rules, config) == 5 and beam_fill(rules, config) == 2


def test_forced_tokens_at_their_steps() -> None:
    rules = GenerationRules(forced_bos_id=7, forced_eos_id=2)
    assert forced_token(rules, 1, last_step=False) == 7
    assert forced_token(rules, 3, last_step=False) is None
    assert forced_token(rules, 3, last_step=True) == 2
    assert forced_token(rules, 1, last_step=True) == 2  # forced_eos_id wins at a last step that is also position 1


def test_finished_hypotheses_collected_scored_and_picked() -> None:
    """Two elements, K = 2: element 0 ends its rank-0 candidate (score -2 over 3 tokens, length_penalty 1); its rank-1
    candidate ends with a -inf score (a beam that never was) and is skipped; element 1 is stopped and takes none."""
    finished: list[list] = [[], []]
    score = [[-2.0, float("-inf"), -3.0, -4.0], [-1.0, -2.0, -3.0, -4.0]]
    rows = [[1, 0, 0, 1], [2, 3, 2, 3]]
    token = [[2, 2, 5, 6], [2, 2, 7, 8]]
    ends = [[True, True], [True, True]]
    generated = [[4, 4], [5, 5], [6, 6], [7, 7]]
    collect_finished(finished, [False, True], score, rows, token, ends, generated, 3, 1.0)
    assert finished == [[(-2.0 / 3, [5, 5, 2])], []]
    finished[0].append((-2.0 / 3, [9, 2]))  # an equal score found later
    assert best_finished(finished[:1]) == [(-2.0 / 3, [5, 5, 2])]  # the earliest among equals


@pytest.mark.parametrize(
    ("early_stopping", "best_live", "expected"),
    [(True, 0.0, True), (False, -3.0, True), (False, -1.0, False), ("never", -3.0, False), ("never", -9.0, True)],
)
def test_when_an_element_stops(early_stopping, best_live, expected) -> None:
    """K = 2 finished at -1 and -1.5 (worst of the best: -1.5); the best live one has log-prob best_live after 2 of
    at most 4 tokens. False scores it at 2 (-3 / 2 = -1.5 <= -1.5: stop), "never" at 4 (-3 / 4 > -1.5: go on)."""
    found = [(-1.0, [2]), (-1.5, [3, 2])]
    assert cannot_improve(found, best_live, 2, 4, 1.0, 2, early_stopping) is expected
    assert cannot_improve(found[:1], best_live, 2, 4, 1.0, 2, early_stopping) is False  # fewer than K: never stops
    stopped = [False, True]
    update_stopped(stopped, [found, []], [best_live, 0.0], 2, 4, 1.0, 2, early_stopping)
    assert stopped == [expected, True]  # a stopped element stays stopped


def test_decoding_length_fills_the_table_or_refuses() -> None:
    assert decoding_length(None, 3, 12, lm=True) == 9
    assert decoding_length(4, 1, 12, lm=False) == 4
    with pytest.raises(ValueError, match=r"max_new_tokens=10 generated tokens after the 3-token prompt need 13"):
        decoding_length(10, 3, 12, lm=True)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(num_beams=0), ValueError, r"num_beams must be >= 1, got 0"),
        (dict(num_beams=2.0), TypeError, r"num_beams must be an int, got float"),
        (dict(length_penalty="1"), TypeError, r"length_penalty must be a float, got str"),
        (dict(length_penalty=float("nan")), ValueError, r"length_penalty must be finite, got nan"),
        (dict(early_stopping="sometimes"), ValueError, r"early_stopping must be True, False or 'never'"),
        (dict(max_new_tokens=0), ValueError, r"max_new_tokens must be >= 1, got 0"),
    ],
)
def test_both_sides_refuse_the_same_beam_arguments(kwargs, error, message) -> None:
    config = TransformerConfig(**SMALL)
    ours, theirs = nt.Transformer(config), tt.Transformer(config)
    src = np.array([[3, 4, 5]])
    with pytest.raises(error, match=message):
        nt.generate(ours, src, **{"num_beams": 4, "max_new_tokens": 3, **kwargs})
    with pytest.raises(error, match=message):
        tt.generate(theirs, torch.from_numpy(src), **{"num_beams": 4, "max_new_tokens": 3, **kwargs})


def test_generation_config_is_typed_frozen_and_checked_when_made() -> None:
    """GenerationConfig: the fields set, frozen (dataclasses.replace makes another), a bad value or an unknown name
    refused when it is made, naming it."""
    config = nt.GenerationConfig(max_new_tokens=5, top_k=3, eos_token_id=[2, 3])
    assert config.settings() == {"max_new_tokens": 5, "top_k": 3, "eos_token_id": [2, 3]}
    assert nt.GenerationConfig is tt.GenerationConfig
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.top_k = 4  # type: ignore[misc]
    assert dataclasses.replace(config, top_k=4).top_k == 4
    with pytest.raises(TypeError, match="topk"):
        nt.GenerationConfig(topk=3)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="top_p"):
        nt.GenerationConfig(top_p=1.5)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        nt.GenerationConfig(max_new_tokens=0)
    with pytest.raises(ValueError, match="bad_words_ids"):
        nt.GenerationConfig(bad_words_ids=[[]])


def test_one_way_in_with_its_precedence() -> None:
    """Each side's decoding has one public entry, generate(); an argument wins over the config's field, which wins
    over the model's (a model of our own: transformers' defaults); every search behind it gives what the same
    settings as arguments give."""
    for module in (nt.decoding, tt.decoding):
        for old in ("greedy_decode", "sample", "greedy_search", "beam_search", "beam_search_scores"):
            assert not hasattr(module, old), (module.__name__, old)
    config = TransformerConfig(**SMALL)
    src = np.array([[3, 4, 5], [6, 7, 8]])
    three = nt.GenerationConfig(max_new_tokens=3, num_beams=2)
    for lib, model, ids in ((nt, nt.Transformer(config), src), (tt, tt.Transformer(config), torch.from_numpy(src))):
        by_config = np.asarray(lib.generate(model, ids, three))
        assert by_config.shape[1] <= 4
        np.testing.assert_array_equal(by_config, np.asarray(lib.generate(model, ids, max_new_tokens=3, num_beams=2)))
        over = np.asarray(lib.generate(model, ids, three, max_new_tokens=5, num_beams=1))  # the arguments win
        np.testing.assert_array_equal(over, np.asarray(lib.generate(model, ids, max_new_tokens=5)))
        out = lib.generate(model, ids, three, return_dict_in_generate=True)
        assert out.logits is None and len(out.sequences_scores) == 2
        out = lib.generate(model, ids, max_new_tokens=3, return_dict_in_generate=True)
        assert out.sequences_scores is None and tuple(out.logits.shape) == (2, out.sequences.shape[1] - 1, 11)
