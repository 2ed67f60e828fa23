"""generate()'s token arguments, as transformers' generate() takes them: `bad_words_ids`, `forced_bos_token_id`,
`forced_eos_token_id` (an id or a list), `eos_token_id` (an id or a list), `pad_token_id`, with `min_new_tokens`,
each over the checkpoint's generation_config.json, on both sides, greedy and beam, equal token for token to
transformers' generate(); a generation_config.json with `forced_eos_token_id: [a, b]` read and decoded as generate()
decodes it; bad arguments refused naming them.

One tiny random GPT-2 (float64), written with save_pretrained in the test; nothing is downloaded.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers

import numpy_transformer as nt
import torch_transformer as tt
from parity_tests import hf_compare as H

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
    free = np.asarray(lib.greedy_decode(model, ids, 6))
    stop = int(free[0, 3])
    got = np.asarray(lib.generate(model, ids, max_new_tokens=6, eos_token_id=[stop]))
    assert got[0, 3] == stop and (got[0, 4:] == cfg.pad_id).all()
    banned = np.asarray(lib.greedy_decode(model, ids, 6, bad_words_ids=[[stop]]))
    assert stop not in banned[:, 2:]
    beams = np.asarray(lib.beam_search(model, ids, 2, 6, forced_eos_token_id=[5, 6]))
    assert beams[0, -1] in (5, 6) or beams.shape[1] < 8
