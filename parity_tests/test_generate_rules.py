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

import copy
import json

import numpy as np
import pytest
import torch
import transformers
from numpy_transformer.config import GenerationRules

import numpy_transformer as nt
import torch_transformer as tt
from numpy_transformer import hf as numpy_hf
from parity_tests import components as C
from parity_tests import hf_compare as H
from torch_transformer import hf as torch_hf

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
        out = lib.generate(model, ids, max_new_tokens=max_new, use_cache=use_cache, **kwargs)
    else:
        out = lib.generate(model, ids, num_beams=num_beams, max_new_tokens=max_new, use_cache=use_cache, **kwargs)
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

    # generation_config.json alone lists both (config.json only the first): generate() reads the former, so do we
    generation = tmp_path / "two" / "generation_config.json"
    config_json = tmp_path / "two" / "config.json"
    config_json.write_text(json.dumps(json.loads(config_json.read_text()) | {"eos_token_id": first}))
    assert json.loads(generation.read_text())["eos_token_id"] == [first, second]
    reloaded = H.load_ours(side, tmp_path / "two", np.float64)
    assert reloaded.config.eos_id == (first, second)
    np.testing.assert_array_equal(ours_decode(reloaded, PROMPTS, side, 1, 8, True), greedy)


def first_new_token(continuation: np.ndarray, after: int = 2) -> int:
    """A token the continuation produces for the first time at step `after` or later."""
    for step, token in enumerate(continuation):
        if step >= after and token not in continuation[:step] and token > 2:
            return int(token)
    raise AssertionError(f"no token appears for the first time after step {after}: {continuation}")


# ----------------------------------------------------------------------------------------------
# Left-padded batches: the forward pass and every gradient, then greedy and beam search.

# The tiny tied BLOOM repeats its last token whatever the prompt; untied and wider its continuations vary.
LEFT_PADDED = {
    "gpt2": {},
    "llama": {},
    "mistral": {},
    "bloom": {"hidden_size": 32, "tie_word_embeddings": False},
    "phi3": {"partial_rotary_factor": 0.5},  # fused qkv GQA 4/2, partial rotary
    "gpt_neox": {},  # parallel residual, rotary_pct 0.5
    "qwen3": {"head_dim": 16},  # q/k norm before RoPE, heads of 16 features with a hidden size of 32
    "gemma3_text": {},  # a local layer (a window of 3) and a global one, the logits capped
    "mixtral": {},  # a sparse mixture of experts
    "qwen3_moe": {},  # q/k norm, experts and a dense layer
    "gemma2": {"tie_word_embeddings": False},  # scores and logits soft-capped, a local layer and a global one
    "phi": {},  # the parallel block of one norm, partial rotary 0.4
    "olmo2": {},  # norms of the sublayers' outputs only, q/k norms over the whole projections
    "smollm3": {"tie_word_embeddings": False},  # layer 3 of 4 without positions (NoPE)
    "gpt_oss": {},  # attention sinks, a sliding layer and a full one, YaRN, GPT-OSS's experts
}


def left_padded_batch(vocab: int, seed: int = 0):
    """ids (3, 7) and attention_mask (3, 7): row 0 unpadded, rows 1 and 2 with 2 and 4 pads on the left (pad
    id 0 there; real ids avoid 0, 1, 2)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab, size=(3, 7))
    mask = np.ones((3, 7), dtype=np.int64)
    for row, pads in ((1, 2), (2, 4)):
        mask[row, :pads] = 0
        ids[row, :pads] = 0
    return ids, mask


def theirs_padded_forward(model, family: str, ids, mask, upstream):
    """transformers' logits (B, T, V) of a left-padded batch, positions from the mask as generate() makes them
    (cumsum - 1, padding 0; BLOOM takes none: its ALiBi reads the mask), and its parameter gradients of
    sum(logits * upstream)."""
    model.zero_grad(set_to_none=True)
    ids_t, mask_t = torch.from_numpy(ids), torch.from_numpy(mask)
    kwargs = {} if family == "bloom" else {"position_ids": (mask_t.cumsum(-1) - 1).masked_fill(mask_t == 0, 0)}
    with H.patch_for(family, np.float64):
        logits = model(input_ids=ids_t, attention_mask=mask_t, use_cache=False, **kwargs).logits
        (logits * torch.from_numpy(upstream)).sum().backward()
    grads = {name: H.to_numpy(p.grad) for name, p in model.named_parameters()}
    return H.to_numpy(logits), grads


def ours_padded_forward(model, side: str, ids, mask, upstream):
    """Our logits and gradients (transformers' names) of the same batch and objective."""
    if side == "numpy":
        model.eval().zero_grad()
        logits = model.forward(ids, attention_mask=mask)
        model.backward(upstream)
        return logits, numpy_hf.to_hf(model, model.grads, tied=False)
    model.eval().zero_grad(set_to_none=True)
    logits = model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    (logits * torch.from_numpy(upstream)).sum().backward()
    grads = torch_hf.to_hf(model, {n: p.grad for n, p in model.named_parameters()}, tied=False)
    return H.to_numpy(logits), {k: H.to_numpy(v) for k, v in grads.items()}


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("family", list(LEFT_PADDED))
def test_left_padded_forward_and_gradients_equal_transformers(family, side, tmp_path):
    """float64, left-padded batch: logits at the real positions and every parameter gradient within 1e-10 of
    transformers' (upstream gradient random at the real positions, zero at the padded ones, whose logits are of
    no token on either side). Without the mask the real positions of the padded rows differ."""
    theirs_model = H.build_tiny(family, tmp_path, **LEFT_PADDED[family]).double()
    ours_model = H.load_ours(side, tmp_path, np.float64)
    ids, mask = left_padded_batch(H.TINY[family]["vocab_size"])
    upstream = np.random.default_rng(1).standard_normal((*ids.shape, H.TINY[family]["vocab_size"]))
    upstream *= mask[..., None]
    theirs, theirs_grads = theirs_padded_forward(theirs_model, family, ids, mask, upstream)
    ours, ours_grads = ours_padded_forward(ours_model, side, ids, mask, upstream)
    real = mask.astype(bool)
    scale = np.abs(theirs[real]).max()
    assert np.abs(ours[real] - theirs[real]).max() <= 1e-10 * scale
    assert set(ours_grads) == set(theirs_grads)
    for name, theirs_grad in theirs_grads.items():
        assert np.any(theirs_grad), f"{name}: zero gradient, nothing compared"
        err = np.abs(ours_grads[name] - theirs_grad).max() / np.abs(theirs_grad).max()
        assert err <= 1e-10, f"{name}: relative error {err:.2e}"
    unmasked, _ = ours_padded_forward(ours_model, side, ids, np.ones_like(mask), upstream)
    assert np.abs(unmasked[real] - theirs[real]).max() > 1e-3 * scale  # the mask matters


# Decoding each family on one side in the default run, the sides alternating (the forward and every gradient of
# both sides are compared above for every family); the other side with -m slow.
DECODED = [
    pytest.param(family, side, marks=[pytest.mark.slow] if (i + j) % 2 else [])
    for i, family in enumerate(LEFT_PADDED)
    for j, side in enumerate(SIDES)
]


@pytest.mark.parametrize(("family", "side"), DECODED)
def test_left_padded_prompts_decode_as_generate(family, side, tmp_path):
    """Greedy and beam search (3 beams), cached and not, on a left-padded batch with its attention_mask: equal
    to generate() on the same batch (Mistral's window of 3 rolls over the padding from the first step)."""
    theirs_model = H.build_tiny(family, tmp_path, **LEFT_PADDED[family]).double()
    ours_model = H.load_ours(side, tmp_path, np.float64)
    ids, mask = left_padded_batch(H.TINY[family]["vocab_size"], seed=3)
    for num_beams in (1, 3):
        theirs = theirs_decode(theirs_model, family, ids, num_beams, 6, attention_mask=mask)
        for use_cache in (True, False):
            ours = ours_decode(ours_model, ids, side, num_beams, 6, use_cache, attention_mask=mask)
            np.testing.assert_array_equal(ours, theirs, err_msg=f"num_beams={num_beams}, use_cache={use_cache}")
    unmasked = ours_decode(ours_model, ids, side, 1, 6, True)  # the pads read as tokens at positions 0, 1, ...
    assert not np.array_equal(unmasked, theirs_decode(theirs_model, family, ids, 1, 6, attention_mask=mask))


# ----------------------------------------------------------------------------------------------
# Every token banned.


def tiny_lm(side: str, **fields):
    config = nt.TransformerConfig(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=0, n_decoder_layers=1, **fields)
    if side == "numpy":
        return nt.TransformerLM(config)
    torch.manual_seed(0)
    return tt.TransformerLM(config).double()


@pytest.mark.parametrize("search", ["greedy", "beam"])
@pytest.mark.parametrize("side", SIDES)
def test_every_token_banned_is_a_value_error(side, search):
    """bad_words_ids covering the whole vocabulary but the end token, which min_length bans (bad_words_ids cannot
    ban an end token alone: generate() drops that entry), or (a model of our own, which never generates pad) a
    vocabulary of the pad id alone: a ValueError naming the position, where greedy search emitted the pad id and
    beam search raised "max() arg is an empty sequence"."""
    prompt = np.array([[5, 6, 7], [8, 9, 10]])
    lm = tiny_lm(side)
    (eos,) = lm.config.eos_ids
    lm.generation_rules = GenerationRules(bad_words=tuple((t,) for t in range(32)), min_length=10)
    assert (eos,) in lm.generation_rules.bad_words  # dropped, as generate() drops it: min_length bans eos
    only_pad = tiny_lm(side, src_vocab_size=1, tgt_vocab_size=1, bos_id=None, eos_id=None)
    for model, ids in ((lm, prompt), (only_pad, np.zeros((2, 3), dtype=np.int64))):
        with pytest.raises(ValueError, match=r"every token is banned at position 3 for rows \[0, 1[],]"):
            ours_decode(model, ids, side, 1 if search == "greedy" else 2, 4, True)


# ----------------------------------------------------------------------------------------------
# A loaded checkpoint decodes under its own generation rules: models whose most likely token is the pad id (or the
# end token) at some steps.

# (family, which token, how): the decoder-only models scale that row of the output layer (a logit of either sign
# grows: the token wins some steps and not others); the encoder-decoders raise it in final_logits_bias, or (T5, no
# bias, a tied head) scale the row of the shared table. GPT-2 and Llama get pad id 3 (they have none of their own).
TILTS = {
    ("gpt2", "pad"): 2.0, ("gpt2", "eos"): -3.0, ("llama", "pad"): 3.0, ("llama", "eos"): 2.0,
    ("t5", "pad"): 1.9, ("t5", "eos"): 1.8, ("bart", "pad"): 6.0, ("bart", "eos"): 1.5,
    ("marian", "pad"): 6.0, ("marian", "eos"): 3.0,
}  # fmt: skip
SEQ2SEQ = ("t5", "bart", "marian")


@pytest.fixture(scope="module")
def seq2seq_models():
    """model_type -> a tiny trained transformers model (built once: the tests tilt copies of it)."""
    return {model_type: H.build_seq2seq(model_type) for model_type in SEQ2SEQ}


def tilted_checkpoint(family: str, which: str, directory, seq2seq_models):
    """Write a checkpoint of `family` whose `which` token ("pad" or "eos") is the most likely at some steps; return
    (transformers' model of it in float64, the token)."""
    if family in SEQ2SEQ:
        model = copy.deepcopy(seq2seq_models[family])
    else:
        model = H.build_tiny(family, directory, pad_token_id=3)
    config = model.config
    token = config.pad_token_id if which == "pad" else config.eos_token_id
    with torch.no_grad():
        if family in ("bart", "marian"):
            model.final_logits_bias[0, token] += TILTS[family, which]
        else:
            model.get_output_embeddings().weight[token] *= TILTS[family, which]
    model.save_pretrained(directory)
    if family in SEQ2SEQ:
        return H.seq2seq_reference(directory, family, np.float64), token
    return model.double(), token


def generate_both(family: str, theirs_model, ours_model, side: str, num_beams: int, use_caches=(True, False)):
    """(theirs, [ours for each use_cache]): generate() under the checkpoint's own generation config, and ours."""
    if family not in SEQ2SEQ:
        theirs = theirs_decode(theirs_model, family, PROMPTS, num_beams, 8)
        return theirs, [ours_decode(ours_model, PROMPTS, side, num_beams, 8, cache) for cache in use_caches]
    src, _, _ = H.seq2seq_batch(ours_model.config, np.random.default_rng(2))
    pad = theirs_model.config.pad_token_id
    with H.seq2seq_patch(family, np.float64), torch.no_grad():
        theirs = theirs_model.generate(
            input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(src != pad), do_sample=False,
            num_beams=num_beams, max_new_tokens=8,
        ).numpy()  # fmt: skip
    return theirs, [ours_decode(ours_model, src, side, num_beams, 8, cache) for cache in use_caches]


@pytest.mark.parametrize("which", ["pad", "eos"])
@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("family", ["t5", "bart", "marian", "gpt2", "llama"])
def test_pad_or_eos_likely_models_decode_as_generate(family, side, which, seq2seq_models, tmp_path):
    """Greedy and beam search (4 beams), cached and not, equal generate() reading the same checkpoint, whose
    generation config bans nothing: the pad id is generated where it is the most likely token, and what follows an
    end token is generate()'s fill (greedy: the pad id; beam: `pad_token_id or eos_token_id`). The pad-likely models
    decode differently under the rule of our own models (never pad): the comparison is not vacuous."""
    theirs_model, token = tilted_checkpoint(family, which, tmp_path, seq2seq_models)
    ours_model = H.load_ours(side, tmp_path, np.float64)
    assert ours_model.generation_rules.bad_words == ()
    for num_beams in (1, 4):
        theirs, ours = generate_both(family, theirs_model, ours_model, side, num_beams)
        for got, use_cache in zip(ours, (True, False), strict=True):
            np.testing.assert_array_equal(got, theirs, err_msg=f"num_beams={num_beams}, use_cache={use_cache}")
        if num_beams == 1:
            greedy = theirs
    generated = greedy[:, 1:] if family in SEQ2SEQ else greedy[:, PROMPTS.shape[1] :]
    eos = ours_model.config.eos_ids
    before_eos = [row[: next((i for i, t in enumerate(row) if t in eos), len(row))] for row in generated]
    if which == "pad":
        assert any(token in row for row in before_eos), f"the pad id is never generated: {generated}"
        ours_model.generation_rules = None  # a model of our own: never pad
        (never_pad,) = generate_both(family, theirs_model, ours_model, side, 1, use_caches=(True,))[1]
        assert not np.array_equal(never_pad, greedy)
    else:
        assert any(len(row) < 8 for row in before_eos), f"no row ends: {generated}"


# ----------------------------------------------------------------------------------------------
# The encoder's attention_mask beside pad_id: given, it says which keys are read, whatever ids they hold.


@pytest.mark.parametrize("side", SIDES)
def test_encoder_model_attention_mask_equals_transformers(side, tmp_path):
    """BERT with an attention_mask that hides two positions holding ordinary ids (pad_id would hide nothing):
    hidden states and every gradient (pooler aside) within 1e-10 of transformers' in float64."""
    theirs_model = H.build_tiny("bert", tmp_path).double()
    ours_model = H.load_ours(side, tmp_path, np.float64)
    ids, types = H.make_inputs("bert")
    ids[-1] = np.random.default_rng(4).integers(3, 40, size=ids.shape[1])  # no pad id anywhere
    mask = np.ones(ids.shape, dtype=np.int64)
    mask[-1, -2:] = 0
    upstream = np.random.default_rng(5).standard_normal((*ids.shape, theirs_model.config.hidden_size))
    theirs_model.zero_grad(set_to_none=True)
    theirs = theirs_model(
        input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), token_type_ids=torch.from_numpy(types)
    ).last_hidden_state
    (theirs * torch.from_numpy(upstream)).sum().backward()
    theirs_grads = {n: H.to_numpy(p.grad) for n, p in theirs_model.named_parameters() if not n.startswith("pooler.")}
    if side == "numpy":
        ours = ours_model.eval().forward(ids, types, attention_mask=mask)
        ours_model.zero_grad()
        ours_model.backward(upstream)
        ours_grads = numpy_hf.to_hf(ours_model, ours_model.grads, tied=False)
        unmasked = ours_model.forward(ids, types)
    else:
        out = ours_model.eval()(torch.from_numpy(ids), torch.from_numpy(types), attention_mask=torch.from_numpy(mask))
        (out * torch.from_numpy(upstream)).sum().backward()
        grads = {n: torch.zeros_like(p) if p.grad is None else p.grad for n, p in ours_model.named_parameters()}
        grads = torch_hf.to_hf(ours_model, grads, tied=False)  # the pooler, unread, has no gradient: zeros
        ours, ours_grads = H.to_numpy(out), {k: H.to_numpy(v) for k, v in grads.items()}
        unmasked = H.to_numpy(ours_model(torch.from_numpy(ids), torch.from_numpy(types)))
    theirs = H.to_numpy(theirs)
    pooler = {k: v for k, v in ours_grads.items() if k.startswith("pooler.")}
    assert all(v is None or not np.any(v) for v in pooler.values()), "the hidden states do not read the pooler"
    ours_grads = {k: v for k, v in ours_grads.items() if not k.startswith("pooler.")}
    result = H.pair(ours, theirs, ours_grads, theirs_grads, "hidden")  # the suite's float64 measure (1e-10)
    problems = C.failures(result, np.float64)
    assert not problems, "\n".join(problems)
    assert all(np.any(ours) for ours, _ in result.grads.values()), "a zero gradient: nothing compared"
    assert np.abs(unmasked - theirs).max() > 1e-3  # the mask matters


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("family", ["bart", "t5"])
def test_transformer_source_attention_mask_equals_transformers(family, side, seq2seq_models, tmp_path):
    """A source batch whose padding holds ordinary ids, marked only by attention_mask: logits within 1e-10 of
    transformers' (float64), and greedy and beam search, cached and not, equal to generate() with that mask."""
    seq2seq_models[family].save_pretrained(tmp_path)
    theirs_model = H.seq2seq_reference(tmp_path, family, np.float64)
    ours_model = H.load_ours(side, tmp_path, np.float64)
    src, tgt, _ = H.seq2seq_batch(ours_model.config, np.random.default_rng(2))
    mask = (src != theirs_model.config.pad_token_id).astype(np.int64)
    src = np.where(mask == 1, src, 5)  # the padding now holds an ordinary id: only the mask says it is padding
    with H.seq2seq_patch(family, np.float64), torch.no_grad():
        theirs = theirs_model(
            input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(mask),
            decoder_input_ids=torch.from_numpy(tgt),
        ).logits.numpy()  # fmt: skip
    if side == "numpy":
        ours, unmasked = ours_model.forward(src, tgt, attention_mask=mask), ours_model.forward(src, tgt)
    else:
        with torch.no_grad():
            ours = ours_model(torch.from_numpy(src), torch.from_numpy(tgt), attention_mask=torch.from_numpy(mask))
            ours, unmasked = ours.numpy(), ours_model(torch.from_numpy(src), torch.from_numpy(tgt)).numpy()
    assert np.abs(ours - theirs).max() <= 1e-10 * np.abs(theirs).max()
    assert np.abs(unmasked - theirs).max() > 1e-3  # without the mask the padding is read
    for num_beams in (1, 4):
        with H.seq2seq_patch(family, np.float64), torch.no_grad():
            expected = theirs_model.generate(
                input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(mask), do_sample=False,
                num_beams=num_beams, max_new_tokens=8,
            ).numpy()  # fmt: skip
        for use_cache in (True, False):
            got = ours_decode(ours_model, src, side, num_beams, 8, use_cache, attention_mask=mask)
            np.testing.assert_array_equal(got, expected, err_msg=f"num_beams={num_beams}, use_cache={use_cache}")


@pytest.mark.parametrize("side", SIDES)
def test_a_bad_attention_mask_is_refused_naming_it(side):
    """Another shape, floats, values other than 0/1, a row without a real token: each a clear error naming
    attention_mask, from forward and from decoding alike."""
    lm = tiny_lm(side)
    ids = np.array([[5, 6, 7], [8, 9, 10]])
    cases = [
        (np.ones((2, 2), dtype=np.int64), ValueError, r"attention_mask must have the shape of the ids \(2, 3\)"),
        (np.ones((2, 3)), TypeError, "attention_mask must be a bool or integer"),
        (np.full((2, 3), 2), ValueError, r"attention_mask must hold 0 \(padding\) and 1"),
        (np.array([[1, 1, 1], [0, 0, 0]]), ValueError, r"attention_mask: rows \[1\] have no real token"),
    ]
    for mask, error, message in cases:
        with pytest.raises(error, match=message):
            if side == "numpy":
                lm.forward(ids, attention_mask=mask)
            else:
                lm(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
        with pytest.raises(error, match=message):
            ours_decode(lm, ids, side, 1, 2, True, attention_mask=mask)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize(
    "fields",
    [
        dict(positional="learned"), dict(positional="sinusoidal"), dict(positional="rope", norm_first=True),
        dict(positional="alibi"), dict(positional="rope", sliding_window=2), dict(positional="rope", attention="flash"),
    ],
    ids=["learned", "sinusoidal", "rope", "alibi", "rope-window-2", "rope-flash"],
)  # fmt: skip
def test_a_left_padded_row_computes_what_the_row_alone_computes(fields, side):
    """Each option of our own models: the real tokens of a left-padded row get the logits of the same tokens run
    alone (the pads change nothing), float64."""
    if side == "torch" and fields.get("attention") == "flash":
        fields = {k: v for k, v in fields.items() if k != "attention"}  # the torch side has one attention kernel
    lm = tiny_lm(side, max_len=16, **fields)
    ids = np.array([[0, 0, 0, 5, 6, 7, 8], [8, 9, 10, 11, 12, 13, 14]])
    mask = (np.arange(7) >= 3) | (np.arange(2)[:, None] == 1)
    if side == "numpy":
        padded, alone = lm.forward(ids, attention_mask=mask)[0, 3:], lm.forward(ids[:1, 3:])[0]
    else:
        with torch.no_grad():
            padded = lm(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))[0, 3:].numpy()
            alone = lm(torch.from_numpy(ids[:1, 3:]))[0].numpy()
    np.testing.assert_allclose(padded, alone, rtol=0, atol=1e-12)
