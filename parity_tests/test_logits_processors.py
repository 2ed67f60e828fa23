"""Decoding under every generation setting a checkpoint ships, equal to transformers' generate(), on both sides.

- each logits processor (repetition_penalty, no_repeat_ngram, bad_words, min_length / min_new_tokens, temperature,
  top_k, top_p, min_p) equal to transformers' own LogitsProcessor class on the same random scores (float64, 1e-12);
- sampling: the distribution we draw from equal to softmax after transformers' processors and warpers, in the order
  its generate() builds them; a seeded run reproducible; the torch side's draws equal to generate(do_sample=True)
  under the same torch seed; every sampled token inside the allowed set, at the allowed frequencies;
- greedy and beam search under a checkpoint's repetition_penalty (a Qwen2), no_repeat_ngram_size and min_length (a
  BART), read from its saved generation_config.json, equal to generate() (and different without them);
- generate() choosing greedy, beam or sampling from the checkpoint's do_sample and num_beams; the settings this
  library does not apply warned about (a checkpoint) or refused (a caller) by name.

Tiny random models written with save_pretrained in the test; nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
import transformers
from transformers import GenerationConfig
from transformers.generation import logits_process as L

import numpy_transformer as nt
import torch_transformer as tt
from numpy_transformer import decoding as nd
from numpy_transformer import hf as numpy_hf
from numpy_transformer import logits_processors as nlp
from parity_tests import hf_compare as H
from torch_transformer import decoding as td
from torch_transformer import hf as torch_hf
from torch_transformer import logits_processors as tlp

transformers.logging.set_verbosity_error()

SIDES = ["numpy", "torch"]
PROMPTS = np.array([[5, 9, 7, 21], [12, 4, 30, 8]])


def random_scores(seed: int = 0, N: int = 6, V: int = 37, t: int = 9):
    """scores (N, V) float64 with a few -inf (a token banned before), tokens (N, t) with repeats, and a start (N,)
    (the first counted position, as a left-padded prompt gives)."""
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(N, V)) * 3
    scores[rng.random((N, V)) < 0.05] = -np.inf
    tokens = rng.integers(0, V // 3, size=(N, t))  # a small range: repeated tokens and n-grams
    tokens[:, -2:] = tokens[:, 1:3]  # the last two tokens already seen together, followed by another
    start = rng.integers(0, 4, size=N)
    return scores, tokens, start


def ours_processed(side: str, name: str, scores, tokens, start):
    """Our processor `name` on the side's arrays, as a NumPy array."""
    lib = nlp if side == "numpy" else tlp
    if side == "torch":
        scores, tokens, start = (torch.from_numpy(a) for a in (scores, tokens, start))
    calls = {
        "repetition_penalty": lambda: lib.repetition_penalty(scores, tokens, 1.3, start),
        "no_repeat_ngram_2": lambda: lib.no_repeat_ngram(scores, tokens, 2),
        "no_repeat_ngram_3": lambda: lib.no_repeat_ngram(scores, tokens, 3),
        "bad_words": lambda: lib.bad_words(scores, tokens, ((4,), (int(tokens[0, -1]), 7), (1, 2, 3))),
        "min_length": lambda: lib.min_length(scores, tokens.shape[1], 10, (3, 5)),
        "min_new_tokens": lambda: lib.min_length(scores, tokens.shape[1] - 4, 6, (3,)),
        "temperature": lambda: lib.temperature(scores, 0.7),
        "top_k": lambda: lib.top_k(scores, 5),
        "top_k_keep": lambda: lib.top_k(scores, 2, min_tokens_to_keep=3),
        "top_p": lambda: lib.top_p(scores, 0.8),
        "top_p_keep": lambda: lib.top_p(scores, 0.3, min_tokens_to_keep=3),
        "min_p": lambda: lib.min_p(scores, 0.05),
        "min_p_keep": lambda: lib.min_p(scores, 0.5, min_tokens_to_keep=4),
        "suppress_tokens": lambda: lib.suppress(scores, (4, 7, 40)),  # 40: past the vocabulary, ignored
        "begin_suppress_tokens": lambda: lib.suppress(scores, (2, 9)),  # the step check: process_scores's
    }
    return np.asarray(calls[name]())


def theirs_processed(name: str, scores, tokens, start):
    """transformers' LogitsProcessor for `name`, on the same scores."""
    eos = torch.tensor([3, 5])
    processors = {
        "no_repeat_ngram_2": L.NoRepeatNGramLogitsProcessor(2),
        "no_repeat_ngram_3": L.NoRepeatNGramLogitsProcessor(3),
        "bad_words": L.NoBadWordsLogitsProcessor([[4], [int(tokens[0, -1]), 7], [1, 2, 3]], eos_token_id=36),
        "min_length": L.MinLengthLogitsProcessor(10, eos),
        "min_new_tokens": L.MinNewTokensLengthLogitsProcessor(4, 6, [3]),
        "temperature": L.TemperatureLogitsWarper(0.7),
        "top_k": L.TopKLogitsWarper(5),
        "top_k_keep": L.TopKLogitsWarper(2, min_tokens_to_keep=3),
        "top_p": L.TopPLogitsWarper(0.8),
        "top_p_keep": L.TopPLogitsWarper(0.3, min_tokens_to_keep=3),
        "min_p": L.MinPLogitsWarper(0.05),
        "min_p_keep": L.MinPLogitsWarper(0.5, min_tokens_to_keep=4),
        "suppress_tokens": L.SuppressTokensLogitsProcessor([4, 7, 40]),
        "begin_suppress_tokens": L.SuppressTokensAtBeginLogitsProcessor([2, 9], begin_index=tokens.shape[1]),
    }
    if name == "repetition_penalty":
        # row by row, each with its own start: an int prompt_ignore_length is what every release in the tested
        # range takes (a tensor of starts, one a row, came later)
        return np.concatenate(
            [
                L.RepetitionPenaltyLogitsProcessor(1.3, prompt_ignore_length=int(start[i]))(
                    torch.from_numpy(tokens[i : i + 1]), torch.from_numpy(scores[i : i + 1]).clone()
                ).numpy()
                for i in range(len(scores))
            ]
        )
    return processors[name](torch.from_numpy(tokens), torch.from_numpy(scores).clone()).numpy()


PROCESSOR_NAMES = [
    "repetition_penalty", "no_repeat_ngram_2", "no_repeat_ngram_3", "bad_words", "min_length", "min_new_tokens",
    "temperature", "top_k", "top_k_keep", "top_p", "top_p_keep", "min_p", "min_p_keep", "suppress_tokens",
    "begin_suppress_tokens",
]  # fmt: skip


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", PROCESSOR_NAMES)
def test_each_processor_equals_transformers(name, side):
    """The same -inf entries and the other scores within 1e-12 of transformers' processor (float64), on three random
    draws; each processor changes the scores somewhere (the comparison is not vacuous)."""
    for seed in range(3):
        scores, tokens, start = random_scores(seed)
        ours = ours_processed(side, name, scores, tokens, start)
        theirs = theirs_processed(name, scores, tokens, start)
        assert ours.dtype == np.float64
        np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(theirs))
        finite = np.isfinite(theirs)
        np.testing.assert_allclose(ours[finite], theirs[finite], rtol=0, atol=1e-12)
        assert not np.array_equal(theirs, scores), f"{name} changed nothing: the test cannot fail"


@pytest.mark.parametrize("side", SIDES)
def test_processors_keep_float32(side):
    """dtype in = dtype out: float32 scores stay float32 through every processor."""
    scores, tokens, start = random_scores(1)
    for name in PROCESSOR_NAMES:
        ours = ours_processed(side, name, scores.astype(np.float32), tokens, start)
        assert ours.dtype == np.float32, name


# ----------------------------------------------------------------------------------------------
# Sampling: the distribution, the seed, the draws.

SAMPLING = dict(
    do_sample=True, temperature=0.7, top_k=12, top_p=0.9, min_p=0.05, repetition_penalty=1.3,
    no_repeat_ngram_size=2, min_new_tokens=3,
)  # fmt: skip


@pytest.fixture(scope="module")
def qwen2_sampling(tmp_path_factory):
    """A tiny Qwen2 checkpoint whose generation_config.json asks for SAMPLING; (directory, transformers' model)."""
    directory = tmp_path_factory.mktemp("qwen2_sampling")
    model = H.build_tiny("qwen2", directory)
    for key, value in SAMPLING.items():
        setattr(model.generation_config, key, value)
    model.save_pretrained(directory)
    return directory, model


def theirs_distribution(model, tokens: np.ndarray, scores: np.ndarray, T_p: int) -> np.ndarray:
    """softmax of transformers' processors and warpers, as its generate() builds them from the model's
    generation config (its _get_logits_processor), applied to scores (N, V) after rows tokens (N, t)."""
    config, _ = model._prepare_generation_config(None)
    model._prepare_special_tokens(config, True, device="cpu")
    config.min_length = config.min_new_tokens + T_p  # as _prepare_generated_length sets it
    processors = model._get_logits_processor(
        generation_config=config, input_ids_seq_length=T_p, encoder_input_ids=torch.from_numpy(tokens[:, :T_p]),
        device="cpu", model_kwargs={"attention_mask": torch.ones(tokens.shape[0], T_p)},
    )  # fmt: skip
    names = [type(p).__name__ for p in processors]
    assert names[:2] == ["RepetitionPenaltyLogitsProcessor", "NoRepeatNGramLogitsProcessor"], names
    assert names[-4:] == ["TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper"]
    processed = processors(torch.from_numpy(tokens), torch.from_numpy(scores))
    return torch.softmax(processed, dim=-1).numpy()


@pytest.mark.parametrize("side", SIDES)
def test_sampling_distribution_equals_transformers(side, qwen2_sampling):
    """The probabilities we draw from (our processors, then our warpers, then softmax), at several steps, equal
    transformers' processed probabilities within 1e-12, the same tokens at zero; some tokens are cut off."""
    directory, theirs_model = qwen2_sampling
    ours_model = H.load_ours(side, directory, np.float64)
    rules = ours_model.generation_rules
    assert (rules.do_sample, rules.temperature, rules.top_k, rules.top_p, rules.min_p) == (True, 0.7, 12, 0.9, 0.05)
    V = ours_model.config.tgt_vocab_size
    for t in (4, 6, 9):  # T_p = 4: min_new_tokens bans eos before 7 positions
        scores, tokens, _ = random_scores(t, N=5, V=V, t=t)
        scores = scores / 3  # logits of unit scale: several tokens survive the warpers
        theirs = theirs_distribution(theirs_model, tokens, scores, 4)
        if side == "numpy":
            step = nd.Step(tokens[:, :t], 4, None, False)
            ours = nd.warped_probabilities(nd.allowed_scores(scores, ours_model, rules, step), rules)
        else:
            step = td.Step(torch.from_numpy(tokens), 4, None, False)
            ours = td.allowed_scores(torch.from_numpy(scores), ours_model, rules, step)
            ours = td.warped_probabilities(ours, rules).numpy()
        np.testing.assert_array_equal(ours == 0, theirs == 0)
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-12)
        assert (theirs == 0).sum(axis=-1).min() > 0 and (theirs > 0).sum(axis=-1).max() > 1


def ours_sample(side: str, model, prompts: np.ndarray, max_len: int, rng, **settings) -> np.ndarray:
    if side == "numpy":
        return nt.generate(model, prompts, max_new_tokens=max_len, do_sample=True, rng=rng, **settings)
    return tt.generate(
        model, torch.from_numpy(prompts), max_new_tokens=max_len, do_sample=True, rng=rng, **settings
    ).numpy()


@pytest.mark.parametrize("side", SIDES)
def test_a_seeded_run_is_reproducible(side, qwen2_sampling):
    """The same seed (an int, or a generator seeded alike) draws the same tokens; another seed other tokens."""
    ours_model = H.load_ours(side, qwen2_sampling[0], np.float64)
    make = (lambda s: np.random.default_rng(s)) if side == "numpy" else (lambda s: torch.Generator().manual_seed(s))
    first = ours_sample(side, ours_model, PROMPTS, 12, make(7))
    np.testing.assert_array_equal(ours_sample(side, ours_model, PROMPTS, 12, make(7)), first)
    np.testing.assert_array_equal(ours_sample(side, ours_model, PROMPTS, 12, 7), first)
    assert not np.array_equal(ours_sample(side, ours_model, PROMPTS, 12, make(8)), first)


def test_torch_sampling_draws_what_generate_draws(qwen2_sampling):
    """The torch side without a generator draws from torch's global one, as generate(do_sample=True) does: under
    the same torch.manual_seed the same tokens (float32 on both sides, as generate() samples from float32)."""
    directory, theirs_model = qwen2_sampling
    ours_model = H.load_ours("torch", directory, np.float32)
    prompts = torch.from_numpy(np.repeat(PROMPTS, 4, axis=0))  # 8 rows
    with torch.no_grad():
        torch.manual_seed(11)
        theirs = theirs_model.float().generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=10)
        torch.manual_seed(11)
        ours = tt.generate(ours_model, prompts, max_new_tokens=10, attention_mask=torch.ones_like(prompts))
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    assert len({tuple(row) for row in ours[:, 4:].tolist()}) > 1  # the rows of one prompt differ: it sampled


@pytest.mark.parametrize("side", SIDES)
def test_samples_come_from_the_allowed_set_at_its_frequencies(side, qwen2_sampling):
    """2000 draws of the first token of one prompt: every one has probability > 0 under transformers' processed
    distribution, and each token's count is within 5 standard deviations of 2000 p."""
    directory, theirs_model = qwen2_sampling
    ours_model = H.load_ours(side, directory, np.float64)
    n = 2000
    prompts = np.repeat(PROMPTS[:1], n, axis=0)
    rng = np.random.default_rng(3) if side == "numpy" else torch.Generator().manual_seed(3)
    drawn = ours_sample(side, ours_model, prompts, 1, rng, min_new_tokens=0)[:, -1]
    with H.patch_for("qwen2", np.float64), torch.no_grad():
        logits = theirs_model.double()(torch.from_numpy(PROMPTS[:1])).logits[:, -1].numpy()
    theirs_model.generation_config.min_new_tokens = 0
    p = theirs_distribution(theirs_model, PROMPTS[:1], logits, 4)[0]
    theirs_model.generation_config.min_new_tokens = SAMPLING["min_new_tokens"]
    theirs_model.float()
    assert (p[drawn] > 0).all(), f"a token outside the allowed set was drawn: {set(drawn[p[drawn] == 0])}"
    counts = np.bincount(drawn, minlength=p.size)
    assert np.all(np.abs(counts - n * p) <= 5 * np.sqrt(n * p * (1 - p)) + 1)
    assert (p > 0).sum() > 1 and len(set(drawn)) > 1


# ----------------------------------------------------------------------------------------------
# Greedy and beam search under a checkpoint's processors.


def ours_decode(side: str, model, ids: np.ndarray, num_beams: int, max_new: int, **settings) -> np.ndarray:
    lib = nt if side == "numpy" else tt
    if side == "torch":
        ids = torch.from_numpy(ids)
        settings = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in settings.items()}
    if num_beams == 1:
        return np.asarray(lib.generate(model, ids, max_new_tokens=max_new, **settings))
    return np.asarray(lib.generate(model, ids, num_beams=num_beams, max_new_tokens=max_new, **settings))


def theirs_generate(model, family: str, ids: np.ndarray, mask: np.ndarray, num_beams: int, max_new: int):
    """generate() under the model's own generation config (greedy or beam), float64."""
    with H.patch_for(family, np.float64), torch.no_grad():
        out = model.generate(
            torch.from_numpy(ids), attention_mask=torch.from_numpy(mask.astype(np.int64)), num_beams=num_beams,
            max_new_tokens=max_new, do_sample=False,
        )  # fmt: skip
    return out.numpy()


@pytest.mark.parametrize("side", SIDES)
def test_repetition_penalty_from_the_checkpoint_as_generate(side, tmp_path):
    """A Qwen2 whose generation_config.json has repetition_penalty 1.1 (as Qwen2.5-0.5B-Instruct's), a left-padded
    batch: greedy (the penalty counted after the pads, as generate() counts it) and beam search equal generate();
    greedy without the penalty differs from it (before this setting was read, 10 of 40 tokens differed)."""
    model = H.build_tiny("qwen2", tmp_path)
    model.generation_config.repetition_penalty = 1.1
    model.save_pretrained(tmp_path)
    model = model.double()
    ours_model = H.load_ours(side, tmp_path, np.float64)
    assert ours_model.generation_rules.repetition_penalty == 1.1
    ids, mask = PROMPTS.copy(), np.ones(PROMPTS.shape, dtype=np.int64)
    ids[1, :2], mask[1, :2] = 0, 0  # row 1 left-padded
    for num_beams in (1, 3):
        theirs = theirs_generate(model, "qwen2", ids, mask, num_beams, 20)
        ours = ours_decode(side, ours_model, ids, num_beams, 20, attention_mask=mask)
        np.testing.assert_array_equal(ours, theirs, err_msg=f"num_beams={num_beams}")
    before = ours_decode(side, ours_model, PROMPTS, 1, 20, repetition_penalty=1.0)
    assert not np.array_equal(before, theirs_generate(model, "qwen2", PROMPTS, np.ones_like(PROMPTS), 1, 20))


@pytest.fixture(scope="module")
def bart_rules(tmp_path_factory):
    """A tiny trained BART whose generation_config.json has no_repeat_ngram_size 3 and min_length 12 (as
    bart-large-cnn's 3 and 56); (directory, transformers' float64 model)."""
    directory = tmp_path_factory.mktemp("bart_rules")
    model = H.build_seq2seq("bart")
    model.generation_config.no_repeat_ngram_size = 3
    model.generation_config.min_length = 12
    model.save_pretrained(directory)
    return directory, H.seq2seq_reference(directory, "bart", np.float64)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("num_beams", [1, 4])
def test_no_repeat_ngram_and_min_length_from_the_checkpoint_as_generate(side, num_beams, bart_rules):
    """Greedy and beam search of a BART read with its no_repeat_ngram_size and min_length equal generate(); without
    either setting they differ (before they were read: greedy 37 and 19, beam 15 and 40 of 51 tokens differed)."""
    directory, theirs_model = bart_rules
    ours_model = H.load_ours(side, directory, np.float64)
    rules = ours_model.generation_rules
    assert (rules.no_repeat_ngram_size, rules.min_length) == (3, 12)
    src, _, _ = H.seq2seq_batch(ours_model.config, np.random.default_rng(2))
    theirs = theirs_generate(theirs_model, "bart", src, src != theirs_model.config.pad_token_id, num_beams, 16)
    np.testing.assert_array_equal(ours_decode(side, ours_model, src, num_beams, 16), theirs)
    for setting in ("no_repeat_ngram_size", "min_length"):
        without = ours_decode(side, ours_model, src, num_beams, 16, **{setting: 0})
        assert without.shape != theirs.shape or not np.array_equal(without, theirs), setting


@pytest.mark.parametrize("side", SIDES)
def test_suppress_tokens_as_generate(side, qwen2_sampling, bart_rules):
    """suppress_tokens and begin_suppress_tokens as generate()'s arguments, greedy and beam search, equal
    generate(): a Qwen2 (begin: the first token after the prompt) and a BART (begin: the first token after the start
    token, one later with forced_bos_token_id). The suppressed ids are tokens generate() picks without them."""
    qwen_dir, qwen = qwen2_sampling
    bart_dir, bart = bart_rules
    src, _, _ = H.seq2seq_batch(H.load_ours(side, bart_dir, np.float64).config, np.random.default_rng(2))
    cases = [
        ("qwen2", qwen_dir, qwen, PROMPTS, {}),
        ("bart", bart_dir, bart, src, {}),
        ("bart", bart_dir, bart, src, {"forced_bos_token_id": 5}),
    ]
    for family, directory, theirs_model, ids, extra in cases:
        ours_model = H.load_ours(side, directory, np.float64)
        mask = np.ones(ids.shape, dtype=np.int64) if family == "qwen2" else ids != theirs_model.config.pad_token_id
        plain = theirs_generate_with(theirs_model, family, ids, mask, 1, 8, **extra)
        T_p = ids.shape[1] if family == "qwen2" else 1 + ("forced_bos_token_id" in extra)
        begin = sorted({int(t) for t in plain[:, T_p]})
        ends = set(np.ravel(theirs_model.generation_config.eos_token_id).tolist())  # (BART's forced end token: 5.25
        later = sorted({int(t) for t in plain[:, T_p + 1 :].ravel()} - set(begin) - ends)[:2]  # refuses it suppressed)
        settings = dict(suppress_tokens=later, begin_suppress_tokens=begin, **extra)
        for num_beams in (1, 3):
            theirs = theirs_generate_with(theirs_model, family, ids, mask, num_beams, 8, **settings)
            if num_beams == 1:
                assert not np.array_equal(theirs, plain), family  # the settings change what generate() picks
            kwargs = settings | {"do_sample": False} | ({"attention_mask": mask} if family == "qwen2" else {})
            ours = ours_decode(side, ours_model, ids, num_beams, 8, **kwargs)
            np.testing.assert_array_equal(ours, theirs, err_msg=f"{family} {extra}, num_beams={num_beams}")


def theirs_generate_with(model, family: str, ids, mask, num_beams: int, max_new: int, **settings):
    """generate() greedy or beam, float64, with `settings` as its arguments."""
    with H.patch_for(family, np.float64), torch.no_grad():
        out = model.generate(
            torch.from_numpy(ids), attention_mask=torch.from_numpy(np.asarray(mask).astype(np.int64)),
            num_beams=num_beams, max_new_tokens=max_new, do_sample=False, **settings,
        )  # fmt: skip
    return out.numpy()


# ----------------------------------------------------------------------------------------------
# generate(): the strategy from the checkpoint; settings not applied.


@pytest.mark.parametrize("side", SIDES)
def test_generate_follows_the_checkpoints_num_beams_and_do_sample(side, bart_rules, qwen2_sampling):
    """generate() with nothing but the ids: the BART's num_beams 4, length_penalty 2 and max_length from its
    generation_config.json, as transformers' generate() reads them; the Qwen2's do_sample (a seed reproduces it);
    a caller's do_sample=False over the checkpoint's is greedy search."""
    directory, theirs_model = bart_rules
    config_path = directory / "generation_config.json"
    saved = json.loads(config_path.read_text())
    config_path.write_text(json.dumps(saved | {"num_beams": 4, "length_penalty": 2.0, "max_length": 15}))
    try:
        ours_model = H.load_ours(side, directory, np.float64)
        reference = H.seq2seq_reference(directory, "bart", np.float64)
    finally:
        config_path.write_text(json.dumps(saved))
    src, _, _ = H.seq2seq_batch(ours_model.config, np.random.default_rng(2))
    with torch.no_grad():
        theirs = reference.generate(torch.from_numpy(src), attention_mask=torch.from_numpy(src != 1)).numpy()
    lib = nt if side == "numpy" else tt
    ids = src if side == "numpy" else torch.from_numpy(src)
    np.testing.assert_array_equal(np.asarray(lib.generate(ours_model, ids)), theirs)
    assert theirs.shape[1] <= 15

    qwen = H.load_ours(side, qwen2_sampling[0], np.float64)
    prompts = PROMPTS if side == "numpy" else torch.from_numpy(PROMPTS)
    sampled = np.asarray(lib.generate(qwen, prompts, max_new_tokens=8, rng=5))
    np.testing.assert_array_equal(
        np.asarray(lib.generate(qwen, prompts, max_new_tokens=8, do_sample=True, rng=5)), sampled
    )
    greedy = np.asarray(lib.generate(qwen, prompts, max_new_tokens=8, do_sample=False))
    assert not np.array_equal(greedy, sampled)
    config = nt.GenerationConfig(do_sample=False, max_new_tokens=8)  # a config's set field over the checkpoint's too
    np.testing.assert_array_equal(greedy, np.asarray(lib.generate(qwen, prompts, config)))
    # an argument over the config: sampling again
    np.testing.assert_array_equal(np.asarray(lib.generate(qwen, prompts, config, do_sample=True, rng=5)), sampled)


def test_unapplied_settings_are_warned_about_by_name(tmp_path):
    """A checkpoint asking for settings this library does not apply loads with one warning naming each (and not
    those at their inert values, nor those that never change the tokens)."""
    model = H.build_tiny("qwen2", tmp_path)
    model.save_pretrained(tmp_path)
    path = tmp_path / "generation_config.json"
    extra = {"typical_p": 0.9, "sequence_bias": [[[3], 1.0]], "epsilon_cutoff": 0.0, "use_cache": True, "my_flag": 1}
    path.write_text(json.dumps(json.loads(path.read_text()) | extra))
    for side in SIDES:
        with pytest.warns(UserWarning, match=r"typical_p=0\.9, sequence_bias=\[\[\[3\], 1\.0\]\], my_flag=1$"):
            H.load_ours(side, tmp_path, np.float64)


@pytest.mark.parametrize("side", SIDES)
def test_settings_not_applied_are_refused_by_name(side, qwen2_sampling):
    """A caller's transformers setting that is not applied: ValueError naming it; a setting generate() does not
    take (or a config that is not a GenerationConfig): TypeError naming it; a bad value: the error names the
    setting. (Sampling with beams is computed now: test_generate_arguments.)"""
    model = H.load_ours(side, qwen2_sampling[0], np.float64)
    lib = nt if side == "numpy" else tt
    ids = PROMPTS if side == "numpy" else torch.from_numpy(PROMPTS)
    with pytest.raises(ValueError, match=r"generate: typical_p=0\.5 is not applied by this library"):
        lib.generate(model, ids, max_new_tokens=4, typical_p=0.5)
    with pytest.raises(TypeError, match=r"generation_config must be a GenerationConfig or None, got dict"):
        lib.generate(model, ids, {"temperature": 0.5})
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'topk'"):
        lib.generate(model, ids, max_new_tokens=4, do_sample=True, rng=0, topk=3)
    with pytest.raises(ValueError, match=r"generate: top_p must be a number in \[0, 1\], got 1\.5"):
        lib.generate(model, ids, max_new_tokens=4, do_sample=True, rng=0, top_p=1.5)
    with pytest.raises(ValueError, match=r"temperature must be > 0 when sampling, got 0\.0"):
        lib.generate(model, ids, max_new_tokens=4, do_sample=True, rng=0, temperature=0.0)


@pytest.mark.parametrize("side", SIDES)
def test_a_save_keeps_the_decoding_settings(side, qwen2_sampling, tmp_path):
    """hf.save writes the settings that differ from transformers' defaults; transformers reads them back."""
    model = H.load_ours(side, qwen2_sampling[0], np.float64)
    (numpy_hf if side == "numpy" else torch_hf).save(model, tmp_path)
    again = H.load_ours(side, tmp_path, np.float64)
    assert again.generation_rules == model.generation_rules
    theirs = GenerationConfig.from_pretrained(tmp_path)
    assert (theirs.do_sample, theirs.temperature, theirs.top_k, theirs.min_new_tokens) == (True, 0.7, 12, 3)


@pytest.mark.parametrize("side", SIDES)
def test_a_bad_word_that_is_the_end_token_alone_is_not_applied(side, qwen2_sampling):
    """bad_words_ids listing the end token alone: generate()'s NoBadWordsLogitsProcessor drops that entry (a row can
    still end), the others apply; so do ours."""
    directory, theirs_model = qwen2_sampling
    model = H.load_ours(side, directory, np.float64)
    (eos,) = model.config.eos_ids
    rules = dataclasses.replace(
        model.generation_rules,
        bad_words=((eos,), (4,)),
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        min_new_tokens=None,
    )
    scores, tokens, _ = random_scores(2, N=3, V=model.config.tgt_vocab_size, t=9)
    scores[:, eos] = 1.0
    if side == "numpy":
        ours = nd.allowed_scores(scores, model, rules, nd.Step(tokens, 9, None, False))
    else:
        step = td.Step(torch.from_numpy(tokens), 9, None, False)
        ours = td.allowed_scores(torch.from_numpy(scores), model, rules, step).numpy()
    theirs = L.NoBadWordsLogitsProcessor([[eos], [4]], eos_token_id=eos)(
        torch.from_numpy(tokens), torch.from_numpy(scores)
    )
    np.testing.assert_array_equal(ours, theirs.numpy())
    assert np.isfinite(ours[:, eos]).all() and np.isneginf(ours[:, 4]).all()


@pytest.mark.parametrize("side", SIDES)
def test_a_streamer_gets_each_token_as_it_comes(side, qwen2_sampling):
    """generate(..., streamer=f): f gets each step's tokens (B,), which together are the continuation it returns;
    beam search cannot stream: a ValueError naming streamer."""
    model = H.load_ours(side, qwen2_sampling[0], np.float64)
    lib = nt if side == "numpy" else tt
    prompts = PROMPTS if side == "numpy" else torch.from_numpy(PROMPTS)
    steps: list = []
    out = np.asarray(
        lib.generate(model, prompts, max_new_tokens=6, rng=1, streamer=lambda tokens: steps.append(np.asarray(tokens)))
    )
    assert len(steps) == out.shape[1] - PROMPTS.shape[1] and all(s.shape == (2,) for s in steps)
    np.testing.assert_array_equal(np.stack(steps, axis=1), out[:, PROMPTS.shape[1] :])
    with pytest.raises(ValueError, match="streamer: beam search"):
        lib.generate(model, prompts, max_new_tokens=6, do_sample=False, num_beams=2, streamer=print)
