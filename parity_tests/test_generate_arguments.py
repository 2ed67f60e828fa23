"""generate()'s token arguments, as transformers' generate() takes them: `bad_words_ids`, `forced_bos_token_id`,
`forced_eos_token_id` (an id or a list), `eos_token_id` (an id or a list), `pad_token_id`, with `min_new_tokens`,
each over the checkpoint's generation_config.json, on both sides, greedy and beam, equal token for token to
transformers' generate(); a generation_config.json with `forced_eos_token_id: [a, b]` read and decoded as generate()
decodes it; bad arguments refused naming them.

One tiny random GPT-2 (float64), written with save_pretrained in the test; nothing is downloaded.
"""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest
import torch
import transformers

import numpy_transformer as nt
import torch_transformer as tt
from numpy_transformer import hf as numpy_hf
from parity_tests import hf_compare as H
from torch_transformer import hf as torch_hf

transformers.logging.set_verbosity_error()

SIDES = ["numpy", "torch"]
PROMPTS = np.array([[5, 9, 7, 21], [12, 4, 30, 8]])
# Without arguments the tiny GPT-2 continues PROMPTS greedily with [21 21 33 33 33 33 33 33] and
# [38 12 28 25 21 33 25 3]: 33 and 25 come a few steps in, 21 at once, (28, 25) a pair in a row.
CASES = {
    "two end tokens": dict(eos_token_id=[33, 25]),
    "an end token and a pad": dict(eos_token_id=33, pad_token_id=0),
    "min_new_tokens over end tokens": dict(eos_token_id=[33, 25], min_new_tokens=5),
    "bad words, one and a pair": dict(bad_words_ids=[[21], [28, 25]]),
    "two forced end tokens": dict(forced_eos_token_id=[7, 3]),
    "one forced end token": dict(forced_eos_token_id=7),
    "all at once": dict(eos_token_id=[25], bad_words_ids=[[21]], forced_eos_token_id=[9, 4], min_new_tokens=2),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(transformers' model, the folder it was saved to)."""
    folder = tmp_path_factory.mktemp("gpt2")
    return H.build_tiny("gpt2", folder).double(), folder


def theirs(model, ids, **kwargs) -> np.ndarray:
    with torch.no_grad():
        out = model.generate(
            torch.from_numpy(ids), attention_mask=torch.ones(ids.shape, dtype=torch.long), do_sample=False, **kwargs
        )
    return out.numpy()


def ours(side: str, model, ids, **kwargs) -> np.ndarray:
    if side == "torch":
        return tt.generate(model, torch.from_numpy(ids), **kwargs).numpy()
    return nt.generate(model, ids, **kwargs)


@pytest.mark.parametrize("side", SIDES)
def test_token_arguments_decode_as_generate(side, checkpoint):
    """Each case of CASES, greedy and with 3 beams, 8 new tokens: our generate() equals transformers' token for
    token, and each argument changed greedy search's tokens."""
    model, folder = checkpoint
    mine = H.load_ours(side, folder, np.float64)
    for num_beams in (1, 3):
        plain = theirs(model, PROMPTS, max_new_tokens=8, num_beams=num_beams)
        for name, kwargs in CASES.items():
            expected = theirs(model, PROMPTS, max_new_tokens=8, num_beams=num_beams, **kwargs)
            got = ours(side, mine, PROMPTS, max_new_tokens=8, num_beams=num_beams, **kwargs)
            forced = kwargs.get("forced_eos_token_id")
            if num_beams > 1 and isinstance(forced, list):
                # Beam search: each beam's forced end tokens tie at the last step; torch.topk orders ties as it
                # happens to (here 7 before 3), we take the lower id. The tokens are equal elsewhere.
                assert got.shape == expected.shape, (name, got, expected)
                differ = got != expected  # only where the two picked different forced tokens of a tie
                assert np.isin(got[differ], forced).all() and np.isin(expected[differ], forced).all(), (got, expected)
                assert (differ.sum(axis=1) <= 1).all(), (got, expected)  # one token at most, a row's last
                continue
            assert got.shape == expected.shape and (got == expected).all(), (name, num_beams, got, expected)
            if num_beams == 1:  # (a beam search may find the same best hypothesis either way)
                assert got.shape != plain.shape or (got != plain).any(), (name, "changed nothing")


@pytest.mark.parametrize("side", SIDES)
def test_max_length_as_generate_takes_it(side, checkpoint):
    """max_length (prompt included) as an argument: generate(max_length=7) after 4 prompt tokens makes 3, and
    max_new_tokens wins when both are given, as in generate()."""
    model, folder = checkpoint
    mine = H.load_ours(side, folder, np.float64)
    for kwargs in ({"max_length": 7}, {"max_length": 7, "max_new_tokens": 5}):
        expected = theirs(model, PROMPTS, **kwargs)
        np.testing.assert_array_equal(ours(side, mine, PROMPTS, **kwargs), expected)
    assert theirs(model, PROMPTS, max_length=7).shape[1] == 7


@pytest.mark.parametrize("side", SIDES)
def test_forced_bos_token_id_after_a_one_token_prompt(side, checkpoint):
    """forced_bos_token_id forces the token at position 1 (after a one-token prompt), as generate() does."""
    model, folder = checkpoint
    mine, ids = H.load_ours(side, folder, np.float64), PROMPTS[:, :1]
    expected = theirs(model, ids, max_new_tokens=4, forced_bos_token_id=17)
    np.testing.assert_array_equal(ours(side, mine, ids, max_new_tokens=4, forced_bos_token_id=17), expected)
    assert (expected[:, 1] == 17).all()


@pytest.mark.parametrize("side", SIDES)
def test_a_forced_eos_list_in_generation_config_and_arguments_over_it(side, checkpoint, tmp_path):
    """generation_config.json with forced_eos_token_id [7, 3] and bad_words_ids [[21]] (refused on load before):
    read, and decoded as generate() decodes it; the caller's bad_words_ids, forced_eos_token_id and eos_token_id
    then replace the file's, as generate()'s arguments replace its generation config's."""
    model, folder = checkpoint
    model.save_pretrained(tmp_path)
    path = tmp_path / "generation_config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"forced_eos_token_id": [7, 3], "bad_words_ids": [[21]]}))
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    mine = H.load_ours(side, tmp_path, np.float64)
    assert mine.generation_rules.forced_eos_id == (7, 3)
    for kwargs in ({}, {"bad_words_ids": [[33]], "forced_eos_token_id": 9, "eos_token_id": [25]}):
        expected = theirs(reference, PROMPTS, max_new_tokens=6, **kwargs)
        np.testing.assert_array_equal(ours(side, mine, PROMPTS, max_new_tokens=6, **kwargs), expected)
    assert (theirs(reference, PROMPTS, max_new_tokens=6)[:, -1] == 3).all()  # the lower id of the tie at 0
    (numpy_hf if side == "numpy" else torch_hf).save(mine, tmp_path / "saved")  # written back as a list
    assert json.loads((tmp_path / "saved" / "generation_config.json").read_text())["forced_eos_token_id"] == [7, 3]
    assert H.load_ours(side, tmp_path / "saved", np.float64).generation_rules.forced_eos_id == (7, 3)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"forced_eos_token_id": []}, ValueError, "forced_eos_token_id"),
        ({"eos_token_id": 40}, ValueError, "eos_token_id=40"),
        ({"bad_words_ids": [[]]}, ValueError, "bad_words_ids"),
        ({"bad_words_ids": [3]}, ValueError, "bad_words_ids"),
        ({"forced_bos_token_id": "5"}, TypeError, "forced_bos_token_id"),
        ({"pad_token_id": 1.0}, TypeError, "pad_token_id"),
    ],
)
@pytest.mark.parametrize("side", SIDES)
def test_bad_token_arguments_are_refused_naming_them(side, kwargs, error, words, checkpoint):
    _, folder = checkpoint
    mine = H.load_ours(side, folder, np.float64)
    with pytest.raises(error, match=words):
        ours(side, mine, PROMPTS, max_new_tokens=2, **kwargs)


@pytest.mark.parametrize("side", SIDES)
def test_a_model_of_our_own_takes_the_token_arguments(side):
    """A model of our own (no generation config): eos_token_id stops a row there and fills after it with its pad
    id; every decoding entry point takes the arguments."""
    cfg = nt.TransformerConfig(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=0, n_decoder_layers=1)
    lib = nt if side == "numpy" else tt
    torch.manual_seed(0)
    model = nt.TransformerLM(cfg) if side == "numpy" else tt.TransformerLM(cfg).double()
    ids = PROMPTS[:, :2] % cfg.tgt_vocab_size
    ids = ids if side == "numpy" else torch.from_numpy(ids)
    free = np.asarray(lib.generate(model, ids, max_new_tokens=6))
    stop = int(free[0, 3])
    got = np.asarray(lib.generate(model, ids, max_new_tokens=6, eos_token_id=[stop]))
    assert got[0, 3] == stop and (got[0, 4:] == cfg.pad_id).all()
    banned = np.asarray(lib.generate(model, ids, max_new_tokens=6, bad_words_ids=[[stop]]))
    assert stop not in banned[:, 2:]
    beams = np.asarray(lib.generate(model, ids, num_beams=2, max_new_tokens=6, forced_eos_token_id=[5, 6]))
    assert beams[0, -1] in (5, 6) or beams.shape[1] < 8


# ----------------------------------------------------------------------------------------------
# Beam-search sampling: do_sample with num_beams > 1, as transformers 5 computes it (its _get_top_k_continuations:
# torch.multinomial without replacement of (1 + n_eos) K continuations from softmax of the cumulative scores plus
# the processed and warped log-probabilities, then sorted by score).

BEAM_SAMPLING = dict(do_sample=True, num_beams=3, temperature=0.8, top_k=12, top_p=0.95)


# transformers 5.24 began ranking the sampled candidates by score (`_get_top_k_continuations`); 5.20 to 5.23 keep them
# in the order multinomial drew them, so the beams, and with them every later draw under the seed, come out in another
# order there: the same draws, another bookkeeping. Ours ranks them, as 5.24 and later do; under the older releases the
# test ranks transformers' drawn candidates the same way (their scores, sequences and beam indices reordered together).
SORTS_SAMPLED_BEAMS = "topk_log_probs.sort(" in inspect.getsource(
    transformers.generation.utils.GenerationMixin._get_top_k_continuations
)


def ranked_by_score(continuations):
    """transformers' _get_top_k_continuations with its candidates then ranked by score, as 5.24's ranks them (a
    top-k's are already in that order)."""

    def ranked(self, *args, **kwargs):
        scores, sequences, beam_indices = continuations(self, *args, **kwargs)  # (B, K), (B, K, L), (B, K, L')
        scores, order = scores.sort(dim=-1, descending=True)
        return scores, *(t.gather(1, order[..., None].expand_as(t)) for t in (sequences, beam_indices))

    return ranked


def test_torch_beam_sampling_draws_what_generate_draws(checkpoint, tmp_path, monkeypatch):
    """Under one torch.manual_seed, our torch generate(do_sample=True, num_beams=3) equals transformers' token for
    token (float32 on both sides: generate()'s beam search computes its scores in float32), for 4 seeds, and the
    seeds give different outputs (it sampled)."""
    if not SORTS_SAMPLED_BEAMS:
        mixin = transformers.generation.utils.GenerationMixin
        monkeypatch.setattr(mixin, "_get_top_k_continuations", ranked_by_score(mixin._get_top_k_continuations))
    model, folder = checkpoint
    theirs_model = H.build_tiny("gpt2", tmp_path)  # float32
    mine = H.load_ours("torch", tmp_path, np.float32)
    prompts = torch.from_numpy(PROMPTS)
    outputs = set()
    for seed in (0, 1, 2, 3):
        with torch.no_grad():
            torch.manual_seed(seed)
            expected = theirs_model.generate(
                prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=8, **BEAM_SAMPLING
            )
            torch.manual_seed(seed)
            got = tt.generate(mine, prompts, max_new_tokens=8, **BEAM_SAMPLING)
        np.testing.assert_array_equal(got.numpy(), expected.numpy())
        outputs.add(tuple(got.flatten().tolist()))
    assert len(outputs) > 1


def test_beam_sampling_candidate_probabilities_equal_transformers():
    """The NumPy side's law over an element's K*V continuations (softmax of the cumulative scores plus the warped
    log-probabilities) equals the one transformers' warpers (min_tokens_to_keep 2, as generate() sets it with
    beams and one end token) and softmax give, float64, within 1e-12."""
    from transformers.generation import logits_process as P

    from numpy_transformer.decoding import candidate_probabilities, log_softmax
    from transformer_spec.config import GenerationRules
    from transformer_spec.generation import warped_scores

    rng = np.random.default_rng(0)
    B, K, V = 2, 3, 40
    log_probs = log_softmax(rng.normal(size=(B * K, V)) * 2)
    cumulative = np.sort(-rng.exponential(size=(B, K)) * 3, axis=1)[:, ::-1].copy()
    rules = GenerationRules(do_sample=True, num_beams=K, temperature=0.8, top_k=12, top_p=0.9, min_p=0.02)
    ours = candidate_probabilities(
        cumulative, warped_scores(nt.logits_processors, log_probs, rules, 2).reshape(B, K, V)
    )
    warped = torch.from_numpy(log_probs)
    warpers = [P.TemperatureLogitsWarper(0.8), P.TopKLogitsWarper(12, min_tokens_to_keep=2)]
    warpers += [P.TopPLogitsWarper(0.9, min_tokens_to_keep=2), P.MinPLogitsWarper(0.02, min_tokens_to_keep=2)]
    for warper in warpers:
        warped = warper(None, warped)
    scores = (warped.view(B, K, V) + torch.from_numpy(cumulative)[:, :, None]).reshape(B, K * V)
    theirs = torch.softmax(scores, dim=-1).numpy()
    assert np.isfinite(theirs).all() and (theirs == 0).any() and (theirs > 0).sum() > 2 * K * B
    assert np.abs(ours[1] - theirs).max() / np.abs(theirs).max() < 1e-12
    np.testing.assert_array_equal(ours[1] == 0, theirs == 0)


def test_draws_without_replacement_follow_sequential_drawing():
    """lp.draw_distinct's first two draws of 4 distinct from p (V = 6) against the law of drawing one by one without
    replacement, P(i then j) = p_i p_j / (1 - p_i): each of the 30 pairs within 5 standard deviations over 20000
    rows (and torch.multinomial's, the law generate() draws from, likewise)."""
    p = np.array([0.4, 0.25, 0.15, 0.1, 0.07, 0.03])
    n = 20000
    law = p[:, None] * p[None, :] / (1 - p[:, None])
    np.fill_diagonal(law, 0.0)
    drawn = {
        "numpy": nt.logits_processors.draw_distinct(np.tile(p, (n, 1)), 4, np.random.default_rng(1)),
        "torch": torch.multinomial(torch.from_numpy(np.tile(p, (n, 1))), 4, generator=torch.Generator().manual_seed(1)),
    }
    for side, rows in drawn.items():
        rows = np.asarray(rows)
        assert (np.sort(rows, axis=1)[:, 1:] != np.sort(rows, axis=1)[:, :-1]).all(), side  # distinct
        counts = np.zeros((6, 6))
        np.add.at(counts, (rows[:, 0], rows[:, 1]), 1)
        assert (np.abs(counts - n * law) <= 5 * np.sqrt(n * law * (1 - law)) + 1e-9).all(), (side, counts / n - law)


def test_numpy_beam_sampling_has_the_torch_sides_law(checkpoint):
    """One new token by beam sampling (3 beams) from 1500 copies of a prompt, float64: the NumPy side's token
    frequencies and the torch side's (which draws what generate() draws) agree within 5 standard deviations of
    their difference; seeds reproduce on the NumPy side."""
    _, folder = checkpoint
    n = 1500
    prompts = np.repeat(PROMPTS[:1], n, axis=0)
    settings = BEAM_SAMPLING | dict(temperature=1.5, top_k=0, top_p=1.0)
    mine_np = H.load_ours("numpy", folder, np.float64)
    first = nt.generate(mine_np, prompts, max_new_tokens=1, rng=5, **settings)[:, -1]
    again = nt.generate(mine_np, prompts[:50], max_new_tokens=1, rng=5, **settings)[:, -1]
    np.testing.assert_array_equal(again, nt.generate(mine_np, prompts[:50], max_new_tokens=1, rng=5, **settings)[:, -1])
    mine_t = H.load_ours("torch", folder, np.float64)
    second = tt.generate(mine_t, torch.from_numpy(prompts), max_new_tokens=1, rng=5, **settings)[:, -1].numpy()
    f, g = np.bincount(first, minlength=40) / n, np.bincount(second, minlength=40) / n
    assert (f > 0).sum() > 3  # it sampled several tokens
    spread = np.sqrt((f * (1 - f) + g * (1 - g)) / n) + 1 / n
    assert (np.abs(f - g) <= 5 * spread).all(), (f, g)


@pytest.mark.parametrize("side", SIDES)
def test_decoder_start_and_forced_bos_of_an_encoder_decoder(side, tmp_path):
    """A tiny BART: decoder_start_token_id (the first decoder token) and forced_bos_token_id as arguments, greedy
    and with 2 beams, equal to generate()'s tokens."""
    H.build_seq2seq("bart", steps=0).save_pretrained(tmp_path)  # untrained: random weights
    model = H.seq2seq_reference(tmp_path, "bart", np.float64)
    mine = H.load_ours(side, tmp_path, np.float64)
    src = PROMPTS % model.config.vocab_size
    for kwargs in ({"decoder_start_token_id": 9}, {"decoder_start_token_id": 9, "forced_bos_token_id": 11}):
        for num_beams in (1, 2):
            expected = theirs(model, src, max_new_tokens=5, num_beams=num_beams, **kwargs)
            got = ours(side, mine, src, max_new_tokens=5, num_beams=num_beams, **kwargs)
            np.testing.assert_array_equal(got, expected)
            assert (got[:, 0] == 9).all()
