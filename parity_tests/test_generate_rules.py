"""Decoding a checkpoint as transformers' `generate()` decodes it, on both sides, greedy and beam, cached and not.

- several end tokens (Llama 3's `"eos_token_id": [128001, 128009]`): a row stops at any of them;
- left-padded prompts with an `attention_mask`: positions from the mask (cumulative sum minus one), as generate()
  computes them, and the forward pass and every gradient equal to transformers' on such a batch (float64, 1e-10);
- every token banned: a ValueError naming the step, never the pad id;
- a loaded checkpoint bans only what its generation config bans: models whose most likely token is the pad id (or
  the end token) decode as generate() does.

Tiny random models, written with save_pretrained in the test; nothing is downloaded.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

import numpy_transformer as nt
import torch_transformer as tt
from parity_tests import hf_compare as H

transformers.logging.set_verbosity_error()

SIDES = ["numpy", "torch"]


def ours_decode(model, ids, side: str, num_beams: int, max_new: int, use_cache: bool, attention_mask=None):
    """Our greedy search (num_beams 1) or beam search on either side, as a NumPy array."""
    kwargs = {} if attention_mask is None else {"attention_mask": attention_mask}
    if side == "torch":
        ids = torch.from_numpy(ids)
        kwargs = {k: torch.from_numpy(v) for k, v in kwargs.items()}
    lib = nt if side == "numpy" else tt
    if num_beams == 1:
        out = lib.greedy_decode(model, ids, max_new, use_cache=use_cache, **kwargs)
    else:
        out = lib.beam_search(model, ids, num_beams, max_new, use_cache=use_cache, **kwargs)
    return np.asarray(out)


def theirs_decode(model, family: str, ids, num_beams: int, max_new: int, attention_mask=None):
    """transformers' generate() under the checkpoint's own generation config (float64 patches where they apply)."""
    mask = np.ones(ids.shape, dtype=np.int64) if attention_mask is None else attention_mask
    with H.patch_for(family, np.float64), torch.no_grad():
        out = model.generate(
            torch.from_numpy(ids), attention_mask=torch.from_numpy(mask.astype(np.int64)), do_sample=False,
            num_beams=num_beams, max_new_tokens=max_new, min_new_tokens=0,
        )  # fmt: skip
    return out.numpy()


# ----------------------------------------------------------------------------------------------
# Several end tokens.

PROMPTS = np.array([[5, 9, 7, 21], [12, 4, 30, 8]])


@pytest.mark.parametrize("side", SIDES)
def test_the_second_end_token_stops_a_row_as_generate_does(side, tmp_path):
    """A Llama whose config lists two end tokens, [never generated, generated a few steps in]: greedy and beam,
    cached and not, stop that row at the second one, as generate() does (before: only the first counted, and the
    row ran on past it)."""
    free = theirs_decode(H.build_tiny("llama", tmp_path / "free", eos_token_id=None).double(), "llama", PROMPTS, 1, 8)
    first = next(t for t in range(3, 40) if t not in free)  # never generated
    second = first_new_token(free[0, PROMPTS.shape[1] :])
    theirs_model = H.build_tiny("llama", tmp_path / "two", eos_token_id=[first, second]).double()
    ours_model = H.load_ours(side, tmp_path / "two", np.float64)
    assert ours_model.config.eos_id == (first, second)
    for num_beams in (1, 3):
        theirs = theirs_decode(theirs_model, "llama", PROMPTS, num_beams, 8)
        for use_cache in (True, False):
            ours = ours_decode(ours_model, PROMPTS, side, num_beams, 8, use_cache)
            np.testing.assert_array_equal(ours, theirs)
    greedy = ours_decode(ours_model, PROMPTS, side, 1, 8, True)
    stop = list(free[0, PROMPTS.shape[1] :]).index(second)
    assert greedy[0, PROMPTS.shape[1] + stop] == second
    assert (greedy[0, PROMPTS.shape[1] + stop + 1 :] == first).all()  # no pad id: filled with the first end token


def first_new_token(continuation: np.ndarray, after: int = 2) -> int:
    """A token the continuation produces for the first time at step `after` or later."""
    for step, token in enumerate(continuation):
        if step >= after and token not in continuation[:step] and token > 2:
            return int(token)
    raise AssertionError(f"no token appears for the first time after step {after}: {continuation}")
