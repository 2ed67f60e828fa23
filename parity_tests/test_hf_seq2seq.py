"""The encoder-decoders against `transformers`' own Marian, BART and T5 (the original and v1.1).

Tiny `MarianMTModel` and `BartForConditionalGeneration` models are built here and trained for a few
seconds on a reversal task (random weights with tied, post-norm embeddings just repeat one token,
which would make the decoding comparisons vacuous), written with `save_pretrained`, then loaded
with our `hf.load` on both sides. Required: float64 logits and every parameter gradient within
1e-10 of transformers' (through `hf.to_hf`), float32 within 1e-5, with padded sources; greedy search
equal to `generate(num_beams=1)` and beam search equal to `generate(num_beams=4)` with the same
length penalty; `hf.save` loads back into `from_pretrained`.

One float32 island: Marian computes its sinusoids with `torch.FloatTensor`, so a float64 Marian
holds positions rounded to float32 (~6e-8). The float64 comparisons replace exactly that table with
the float64 one (ours is computed in the model's dtype), and one test checks the unmodified model
within the float32 bar.

T5's float32 island: T5LayerNorm takes its mean square in float32; the float64 comparisons compute it in
float64 (hf_compare.t5_in_float64), nothing else changed. Its dropout after each stack's final norm is not one of
our sites, so T5 is compared in evaluation mode only.

`final_logits_bias` is a buffer in transformers (never trained there); ours is `output_proj.bias`, a
parameter with a gradient. It is compared as an output bias, and its gradient is checked against
the sum of the logits' upstream gradient over positions (what it would be), not against theirs.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import transformers

import numpy_transformer as nt
import torch_transformer as tt
from numpy_transformer import hf as np_hf
from parity_tests import components as C
from parity_tests.hf_compare import (
    SEQ2SEQ_TYPES,
    V,
    build_seq2seq,
    compare_seq2seq,
    seq2seq_batch,
    seq2seq_reference,
)
from torch_transformer import hf as torch_hf

transformers.logging.set_verbosity_error()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """model_type -> directory of a trained tiny checkpoint (float32, as save_pretrained writes it)."""
    out = {}
    for model_type in SEQ2SEQ_TYPES:
        directory = tmp_path_factory.mktemp(model_type.replace(" ", "_"))
        build_seq2seq(model_type).save_pretrained(directory)
        out[model_type] = directory
    return out


build = build_seq2seq
theirs = seq2seq_reference
batch = seq2seq_batch
compare = compare_seq2seq


@pytest.mark.parametrize("side", ["numpy", "torch"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("model_type", SEQ2SEQ_TYPES)
def test_logits_and_every_gradient_match_transformers(checkpoints, model_type, dtype, side):
    result = compare(checkpoints[model_type], model_type, dtype, side)
    problems = C.failures(result, dtype)
    assert not problems, "\n".join(problems)
    assert len(result.grads) >= 30 and all(np.any(ours) for ours, _ in result.grads.values())


@pytest.mark.parametrize("rates", [(0.1, 0.0, 0.0), (0.1, 0.2, 0.3)], ids=["opus-mt-rates", "three-rates"])
@pytest.mark.parametrize("model_type", ["marian", "bart"])
def test_training_mode_with_the_checkpoints_own_rates_matches_transformers(checkpoints, model_type, rates, tmp_path):
    """config.json's dropout / attention_dropout / activation_dropout, loaded with no argument; in training mode the
    transformers model replays our masks (the same units dropped), and outputs and every gradient agree in float64."""
    directory = tmp_path / model_type
    shutil.copytree(checkpoints[model_type], directory)
    config = json.loads((directory / "config.json").read_text())
    config.update(zip(("dropout", "attention_dropout", "activation_dropout"), rates, strict=True))
    (directory / "config.json").write_text(json.dumps(config))
    loaded = np_hf.load(directory)
    assert not loaded.training
    assert loaded.config.dropout_rates == dict(zip(("embedding", "attention", "activation", "residual"),
                                                    (rates[0], rates[1], rates[2], rates[0]), strict=True))  # fmt: skip
    result = compare_seq2seq(directory, model_type, np.float64, "numpy", train=True)
    problems = C.failures(result, np.float64)
    assert not problems, "\n".join(problems)
    assert all(np.any(ours) for ours, _ in result.grads.values())
    evaluation = compare_seq2seq(directory, model_type, np.float64, "numpy")  # dropout made a difference
    assert np.abs(result.outputs["logits"][1] - evaluation.outputs["logits"][1]).max() > 1e-3


def test_unmodified_float64_marian_is_within_the_float32_bar(checkpoints):
    """Without replacing its float32-rounded sinusoids, a float64 Marian differs from ours by about the
    float32 rounding of the positions: inside the float32 bar, outside the float64 one."""
    directory = checkpoints["marian"]
    reference = theirs(directory, "marian", np.float64, float64_positions=False)
    ours = np_hf.load(directory, dtype=np.float64).eval()
    src, tgt, _ = batch(ours.config, np.random.default_rng(1))
    t_src = torch.from_numpy(src)
    expected = reference(
        input_ids=t_src, attention_mask=t_src != ours.config.pad_id, decoder_input_ids=torch.from_numpy(tgt)
    )
    ((_, error),) = C.relative_errors(
        {"logits": (ours.forward(src, tgt), C.to_numpy(expected.logits))}, np.float32
    ).values()
    assert 1e-12 < error <= 1e-5


@pytest.mark.parametrize("side", ["numpy", "torch"])
@pytest.mark.parametrize("model_type", SEQ2SEQ_TYPES)
def test_greedy_search_equals_generate(checkpoints, model_type, side):
    """Greedy decoding from the checkpoint's decoder start token under the checkpoint's generation config (which bans
    nothing here: Marian's real ones ban pad with bad_words_ids, these tiny ones do not), stopping at eos."""
    directory = checkpoints[model_type]
    reference = theirs(directory, model_type, np.float32)
    src, _, _ = batch(np_hf.load(directory).config, np.random.default_rng(2))
    pad = reference.config.pad_token_id
    expected = reference.generate(
        input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(src != pad), do_sample=False, num_beams=1,
        max_new_tokens=10,
    ).numpy()  # fmt: skip
    if side == "numpy":
        got = nt.generate(np_hf.load(directory, dtype=np.float32).eval(), src, max_new_tokens=10)
    else:
        got = tt.generate(torch_hf.load(directory).eval(), torch.from_numpy(src), max_new_tokens=10).numpy()
    np.testing.assert_array_equal(got, expected)
    assert len({tuple(row) for row in got}) == len(got), "the rows should differ: a degenerate model proves little"


@pytest.mark.parametrize("early_stopping", [False, True])
@pytest.mark.parametrize("length_penalty", [1.0, 0.6, 2.0])
@pytest.mark.parametrize("side", ["numpy", "torch"])
@pytest.mark.parametrize("model_type", SEQ2SEQ_TYPES)
def test_beam_search_equals_generate(checkpoints, model_type, side, length_penalty, early_stopping):
    """Beam search with four beams equals generate(num_beams=4) with the same length penalty and stopping
    rule (transformers' default early_stopping=False included); both follow the checkpoint's generation config
    (BART's and Marian's force eos at max length)."""
    directory = checkpoints[model_type]
    reference = theirs(directory, model_type, np.float32)
    src, _, _ = batch(np_hf.load(directory).config, np.random.default_rng(4))
    pad = reference.config.pad_token_id
    expected = reference.generate(
        input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(src != pad), do_sample=False, num_beams=4,
        max_new_tokens=10, length_penalty=length_penalty,
        early_stopping=early_stopping,
    ).numpy()  # fmt: skip
    if side == "numpy":
        model = np_hf.load(directory, dtype=np.float32)
        got = nt.generate(
            model, src, num_beams=4, max_new_tokens=10, length_penalty=length_penalty, early_stopping=early_stopping
        )
    else:
        model = torch_hf.load(directory)
        got = tt.generate(
            model,
            torch.from_numpy(src),
            num_beams=4,
            max_new_tokens=10,
            length_penalty=length_penalty,
            early_stopping=early_stopping,
        )
        got = got.numpy()
    np.testing.assert_array_equal(got, expected)


def test_beam_search_differs_from_greedy_here(checkpoints):
    """The beam comparison above means something: on these inputs four beams do not just find greedy's answer."""
    model = np_hf.load(checkpoints["marian"], dtype=np.float32)
    src, _, _ = batch(model.config, np.random.default_rng(4))
    greedy = nt.generate(model, src, max_new_tokens=10)
    beam = nt.generate(model, src, num_beams=4, max_new_tokens=10)
    assert greedy.shape != beam.shape or (greedy != beam).any()


@pytest.mark.parametrize("side", ["numpy", "torch"])
@pytest.mark.parametrize("model_type", SEQ2SEQ_TYPES)
def test_round_trip_through_from_pretrained(checkpoints, model_type, side, tmp_path):
    """hf.save writes a directory that from_pretrained loads to the same logits (and the same keys)."""
    directory = checkpoints[model_type]
    if side == "numpy":
        model = np_hf.load(directory, dtype=np.float64).eval()
        np_hf.save(model, tmp_path)
    else:
        model = torch_hf.load(directory, dtype=torch.float64).eval()
        torch_hf.save(model, tmp_path)
    original, reloaded = theirs(directory, model_type, np.float64), theirs(tmp_path, model_type, np.float64)
    src, tgt, _ = batch(model.config, np.random.default_rng(3))
    t_src = torch.from_numpy(src)
    kwargs = dict(input_ids=t_src, attention_mask=t_src != model.config.pad_id, decoder_input_ids=torch.from_numpy(tgt))
    np.testing.assert_allclose(
        reloaded(**kwargs).logits.detach(), original(**kwargs).logits.detach(), rtol=0, atol=1e-12
    )


def test_separate_token_tables_and_an_untied_output(tmp_path):
    """Marian with share_encoder_decoder_embeddings=False (two tables, a target vocabulary of its own)
    and tie_word_embeddings=False: the encoder reads encoder.embed_tokens, the decoder its own table,
    the output projection lm_head.weight."""
    model = build(
        "marian", steps=0, share_encoder_decoder_embeddings=False, decoder_vocab_size=V, tie_word_embeddings=False
    )
    model.save_pretrained(tmp_path)
    ours = np_hf.load(tmp_path, dtype=np.float64)
    assert not ours.config.share_embeddings and not ours.config.tie_embeddings
    assert {"encoder.token_embedding.weight", "decoder.token_embedding.weight", "output_proj.weight"} <= set(
        ours.params
    )
    result = compare(tmp_path, "marian", np.float64, "numpy")
    assert not C.failures(result, np.float64)


# ----------------------------------------------------------------------------------------------
# The checkpoint's generation_config.json (GenerationRules): forced eos at max length, forced bos, bad words.


def generation_case(checkpoints, model_type, tmp_path, **fields):
    """A copy of the checkpoint whose generation_config.json has `fields` changed; src and the reference model."""
    directory = tmp_path / model_type.replace(" ", "_")
    shutil.copytree(checkpoints[model_type], directory)
    path = directory / "generation_config.json"
    generation = json.loads(path.read_text())
    generation.update(fields)
    path.write_text(json.dumps(generation))
    src, _, _ = batch(np_hf.load(directory).config, np.random.default_rng(2))
    return directory, src, theirs(directory, model_type, np.float32)


def our_decoding(directory, src, side, search, **kwargs):
    if side == "numpy":
        return nt.generate(np_hf.load(directory, dtype=np.float32), src, **search, **kwargs)
    return tt.generate(torch_hf.load(directory), torch.from_numpy(src), **search, **kwargs).numpy()


GREEDY = {"do_sample": False, "num_beams": 1}
BEAM = {"do_sample": False}


@pytest.mark.parametrize("side", ["numpy", "torch"])
@pytest.mark.parametrize("model_type", ["marian", "bart"])
def test_forced_eos_at_max_length_as_generate(checkpoints, model_type, side, tmp_path):
    """Marian's and BART's generation configs force eos at max length: with 3 new tokens no row reaches eos by
    itself, and the last token is eos in ours as in generate(), which reads the same file (greedy and beam)."""
    directory, src, reference = generation_case(checkpoints, model_type, tmp_path)
    rules = np_hf.load(directory).generation_rules
    assert rules.forced_eos_id == reference.generation_config.forced_eos_token_id is not None
    pad = reference.config.pad_token_id
    common = dict(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(src != pad), max_new_tokens=3)
    greedy = reference.generate(**common, do_sample=False, num_beams=1).numpy()
    assert (greedy[:, -1] == rules.forced_eos_id).all()
    np.testing.assert_array_equal(our_decoding(directory, src, side, GREEDY, max_new_tokens=3), greedy)
    beam = reference.generate(**common, do_sample=False, num_beams=4).numpy()
    np.testing.assert_array_equal(our_decoding(directory, src, side, BEAM, num_beams=4, max_new_tokens=3), beam)


@pytest.mark.parametrize("side", ["numpy", "torch"])
def test_forced_bos_and_bad_words_as_generate(checkpoints, side, tmp_path):
    """A BART generation config with forced_bos_token_id (mBART's language token) and bad_words_ids of one and of
    two tokens: the first generated token is forced, the banned tokens never appear, a two-token sequence is
    never completed; greedy and beam equal to generate() reading the same file. Without the rules ours differs."""
    plain_dir, src, plain_ref = generation_case(checkpoints, "bart", tmp_path / "plain")
    pad = plain_ref.config.pad_token_id
    common = dict(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(src != pad), max_new_tokens=8)
    free = plain_ref.generate(**common, do_sample=False, num_beams=1).numpy()
    banned = int(free[0, 2])  # a token the free model generates: banning it changes the output
    pair = [int(free[1, 1]), int(free[1, 2])]
    fields = dict(forced_bos_token_id=7, bad_words_ids=[[pad], [banned], pair])
    directory, src, reference = generation_case(checkpoints, "bart", tmp_path / "rules", **fields)
    for search, kwargs, theirs_kwargs in (
        (GREEDY, dict(max_new_tokens=8), dict(num_beams=1)),
        (BEAM, dict(num_beams=4, max_new_tokens=8), dict(num_beams=4)),
    ):
        expected = reference.generate(**common, do_sample=False, **theirs_kwargs).numpy()
        got = our_decoding(directory, src, side, search, **kwargs)
        np.testing.assert_array_equal(got, expected)
        assert (got[:, 1] == 7).all() and not (got[:, 2:] == banned).any()
    assert not np.array_equal(our_decoding(directory, src, side, GREEDY, max_new_tokens=8), free)
