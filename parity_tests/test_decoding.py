"""Decoding: greedy search and beam search, NumPy and torch.

- the key/value cache: the logits of every cached step equal model.forward's logits at that position
  (float64, max abs difference <= 1e-12), and cached and recomputed decoding give the same tokens;
- beam_size=1 is greedy search, for any length penalty;
- NumPy and torch decode the same tokens from one state dict, ties included;
- eos: the padding after it, the early stop; the max_len limit; the prompt checks; the caller's mode.

The models are random but not degenerate: biases and norm weights moved off their init values,
weights doubled so that the argmax is decisive (the gap between the two best logits is ~0.06 typically
and above 1e-5 in every step decoded here, against rounding differences of ~1e-14), and learned
positions as large as the sinusoids, so that the outputs change from step to step.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import numpy_transformer as nt
import torch_transformer as tt
from numpy_transformer import decoding as nd
from torch_transformer import decoding as td

SMALL = dict(
    src_vocab_size=13,
    tgt_vocab_size=17,
    d_model=16,
    n_heads=4,
    d_ff=24,
    n_encoder_layers=2,
    n_decoder_layers=2,
    max_len=16,
)
CONFIGS = {
    "post-norm relu sinusoidal untied": nt.TransformerConfig(**SMALL),
    "pre-norm gelu learned tied": nt.TransformerConfig(
        **SMALL, norm_first=True, activation="gelu", positional="learned", tie_embeddings=True
    ),
    "post-norm gelu_tanh learned unscaled": nt.TransformerConfig(
        **SMALL, activation="gelu_tanh", positional="learned", scale_embeddings=False
    ),
    "pre-norm relu sinusoidal tied one head": nt.TransformerConfig(
        **{**SMALL, "n_heads": 1}, norm_first=True, tie_embeddings=True
    ),
}
# After the paper: rotary positions (the cache holds keys already rotated to their positions, and each step
# rotates its new queries and keys by positions start ..) and grouped K/V heads (the cache holds n_kv_heads).
MODERN = {
    "llama: pre-norm rms rope silu gated GQA 4/2, no biases": nt.TransformerConfig(
        **SMALL,
        norm_first=True,
        norm="rms",
        positional="rope",
        activation="silu",
        gated_ffn=True,
        n_kv_heads=2,
        bias=False,
        output_bias=False,
    ),
    "post-norm rms rope MQA gated gelu, biases, tied": nt.TransformerConfig(
        **SMALL,
        norm="rms",
        positional="rope",
        rope_theta=100.0,
        activation="gelu",
        gated_ffn=True,
        n_kv_heads=1,
        tie_embeddings=True,
    ),
}
CONFIGS |= MODERN
CONFIG_IDS = list(CONFIGS)
MODERN_IDS = list(MODERN)
LM = [pytest.param(False, id="Transformer"), pytest.param(True, id="TransformerLM")]
MAX_NEW = 12  # generated tokens; a 3-token prompt + 12 fits max_len = 16
TOL = 1e-12


def numpy_model(config, lm: bool, seed: int = 0, dtype=np.float64):
    """A random model with decisive logits (see the module docstring)."""
    model = (nt.TransformerLM if lm else nt.Transformer)(config, seed=seed, dtype=dtype)
    rng = np.random.default_rng(seed + 100)
    for name, value in model.params.items():
        if name.endswith("norm.weight") or name.endswith(".bias"):
            value += (0.3 * rng.standard_normal(value.shape)).astype(dtype)
        elif name.endswith("position_embedding.weight"):
            value *= 50.0  # std 1, like the sinusoids: the position matters to the prediction
        else:
            value *= 2.0
    return model


def torch_twin(np_model, device):
    """The torch model holding np_model's state dict, in float64 on `device`."""
    config = np_model.config
    model = (tt.TransformerLM if isinstance(np_model, nt.TransformerLM) else tt.Transformer)(config)
    model = model.to(device=device, dtype=torch.float64)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in np_model.state_dict().items()})
    return model


def source(config, lm: bool, seed: int = 0) -> np.ndarray:
    """LM: prompts (4, 3) starting with bos. Transformer: sources (4, 6) with trailing padding in one
    row, leading padding in another, and one row that is all padding."""
    rng = np.random.default_rng(seed)
    if lm:
        ids = rng.integers(3, config.tgt_vocab_size, (4, 3))
        ids[:, 0] = config.bos_id
        return ids
    ids = rng.integers(3, config.src_vocab_size, (4, 6))
    ids[0, 4:] = config.pad_id
    ids[1, :2] = config.pad_id
    ids[3] = config.pad_id
    return ids


def prompt_length(model, src) -> int:
    return src.shape[1] if isinstance(model, (nt.TransformerLM, tt.TransformerLM)) else 1


def forward_logits(model, src, tokens):
    """model's forward over the tokens it decoded (but the last): (B, T - 1, V)."""
    if isinstance(model, nt.TransformerLM):
        return model.forward(tokens[:, :-1])
    if isinstance(model, nt.Transformer):
        return model.forward(src, tokens[:, :-1])
    with torch.no_grad():
        if isinstance(model, tt.TransformerLM):
            return model(tokens[:, :-1])
        return model(src, tokens[:, :-1])


def prefix_of(config, lm: bool, src: np.ndarray) -> np.ndarray:
    """What the output starts with: the prompt (LM) or bos_id (Transformer), (B, T_p)."""
    return src if lm else np.full((src.shape[0], 1), config.bos_id)


def assert_well_formed(tokens, prefix, config, max_len, greedy=True):
    """tokens (B, T) start with prefix (B, T_p); per row, no pad before the first eos and only pad after
    it; for greedy search the steps stop as soon as every row has its eos."""
    tokens = np.asarray(tokens)
    T_p = prefix.shape[1]
    assert tokens.dtype == np.int64
    np.testing.assert_array_equal(tokens[:, :T_p], prefix)
    assert T_p < tokens.shape[1] <= T_p + max_len
    ends = []
    for row in tokens[:, T_p:]:
        eos = np.flatnonzero(row == config.eos_id)
        end = eos[0] + 1 if eos.size else len(row)
        assert (row[:end] != config.pad_id).all(), row
        assert (row[end:] == config.pad_id).all(), row
        ends.append(end if eos.size else None)
    if greedy and all(e is not None for e in ends):
        assert tokens.shape[1] == T_p + max(ends), "decoding ran past the step where the last row ended"


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The tensors here are tiny and the ops run one at a time: a thread pool only adds latency (on a
    busy machine, a hundredfold). Restored after each test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------------------------
# The cache: every step's logits against the full forward pass.


@pytest.mark.parametrize("lm", LM)
@pytest.mark.parametrize("config", list(CONFIGS.values()), ids=CONFIG_IDS)
def test_numpy_cached_steps_match_forward(config, lm):
    model = numpy_model(config, lm)
    src = source(config, lm)
    out = nd.generate(model, src, max_new_tokens=MAX_NEW, use_cache=True, return_dict_in_generate=True)
    tokens, logits = out.sequences, out.logits
    out = nd.generate(model, src, max_new_tokens=MAX_NEW, use_cache=False, return_dict_in_generate=True)
    again, recomputed = out.sequences, out.logits
    np.testing.assert_array_equal(tokens, again)
    assert np.abs(logits - recomputed).max() <= TOL
    # Independently: one forward pass over the decoded tokens has the step logits at positions T_p - 1 ..
    T_p = prompt_length(model, src)
    reference = forward_logits(model, src, tokens)[:, T_p - 1 :]  # (B, steps, V)
    assert logits.shape == reference.shape
    assert np.abs(logits - reference).max() <= TOL
    assert_well_formed(tokens, prefix_of(config, lm, src), config, MAX_NEW)


@pytest.mark.parametrize("lm", LM)
@pytest.mark.parametrize("config", list(CONFIGS.values()), ids=CONFIG_IDS)
def test_numpy_beam_search_cached_matches_recomputed(config, lm):
    model = numpy_model(config, lm)
    src = source(config, lm)
    beams = dict(num_beams=3, max_new_tokens=MAX_NEW, length_penalty=0.7, return_dict_in_generate=True)
    cached_run, recomputed_run = (nd.generate(model, src, use_cache=use_cache, **beams) for use_cache in (True, False))
    tokens, scores = cached_run.sequences, cached_run.sequences_scores
    again, rescores = recomputed_run.sequences, recomputed_run.sequences_scores
    np.testing.assert_array_equal(tokens, again)
    assert np.abs(np.array(scores) - rescores).max() <= TOL
    assert_well_formed(tokens, prefix_of(config, lm, src), config, MAX_NEW, greedy=False)


@pytest.mark.parametrize("lm", LM)
@pytest.mark.parametrize("config", [CONFIGS[k] for k in CONFIG_IDS[:2] + MODERN_IDS], ids=CONFIG_IDS[:2] + MODERN_IDS)
def test_torch_cached_steps_match_forward(config, lm, device):
    np_model = numpy_model(config, lm)
    model = torch_twin(np_model, device)
    src = torch.from_numpy(source(config, lm)).to(device)
    out = td.generate(model, src, max_new_tokens=MAX_NEW, use_cache=True, return_dict_in_generate=True)
    tokens, logits = out.sequences, out.logits
    out = td.generate(model, src, max_new_tokens=MAX_NEW, use_cache=False, return_dict_in_generate=True)
    again, recomputed = out.sequences, out.logits
    assert tokens.device == src.device and tokens.dtype == torch.int64
    assert torch.equal(tokens, again)
    assert (logits - recomputed).abs().max().item() <= TOL
    T_p = prompt_length(model, src)
    reference = forward_logits(model, src, tokens)[:, T_p - 1 :]
    assert (logits - reference).abs().max().item() <= TOL
    beams = dict(num_beams=3, max_new_tokens=MAX_NEW, length_penalty=0.7, return_dict_in_generate=True)
    cached_run, recomputed_run = (td.generate(model, src, use_cache=use_cache, **beams) for use_cache in (True, False))
    beam, scores = cached_run.sequences, cached_run.sequences_scores
    beam_again, rescores = recomputed_run.sequences, recomputed_run.sequences_scores
    assert torch.equal(beam, beam_again)
    assert np.abs(np.array(scores) - rescores).max() <= TOL


@pytest.mark.parametrize("lm", LM)
@pytest.mark.parametrize("config", list(MODERN.values()), ids=MODERN_IDS)
def test_cache_holds_the_kv_heads(config, lm, device):
    """Both caches hold n_kv_heads K/V heads per layer (self-attention, and cross-attention's projections of
    the encoder output), not one per query head."""
    np_model = numpy_model(config, lm)
    model = torch_twin(np_model, device)
    src = source(config, lm)
    B, S = src.shape
    n_rows, total = 3 * B, 9  # three beams per source
    H_kv, Dh = config.kv_heads, config.d_head
    assert H_kv < config.n_heads
    ours = nd.new_cache(np_model, None if lm else src, n_rows, total)
    first = np.repeat(src[:, :2] if lm else np.full((B, 1), config.bos_id), 3, axis=0)  # (N, T_new)
    nd.decoder_step(np_model, ours, first)  # the cross-attention caches are filled at the first step
    with torch.no_grad():
        theirs = td.new_cache(model, None if lm else torch.from_numpy(src).to(device), n_rows, total)
        td.decoder_step(model, theirs, torch.from_numpy(first).to(device))
    assert len(ours.layers) == len(theirs.layers) == config.n_decoder_layers
    for (self_cache, memory_cache), (other, other_memory) in zip(ours.layers, theirs.layers, strict=True):
        for keys in (self_cache.keys, self_cache.values, other.keys, other.values):
            assert tuple(keys.shape) == (n_rows, H_kv, total, Dh)
        if lm:
            assert memory_cache is None and other_memory is None
        else:
            for keys in (memory_cache.keys, memory_cache.values, other_memory.keys, other_memory.values):
                assert tuple(keys.shape) == (n_rows, H_kv, S, Dh)
            np.testing.assert_allclose(other_memory.keys.cpu().numpy(), memory_cache.keys, rtol=0, atol=1e-13)


def test_grouped_query_cache_is_n_heads_over_n_kv_heads_times_smaller():
    """8 query heads sharing 2 K/V heads: the cache is a quarter of multi-head attention's, the ratio of a
    Llama-style model with 32 query heads and 8 K/V heads. (Llama 3 8B: 32 layers, Dh 128, bfloat16 keys
    and values take 2 * 32 * 8 * 128 * 2 bytes = 128 KiB per token instead of 512 KiB, 1 GiB instead of
    4 GiB for 8192 positions of one sequence.)"""
    sizes = {}
    for n_kv_heads in (None, 2, 1):
        config = nt.TransformerConfig(**{**SMALL, "n_heads": 8}, positional="rope", n_kv_heads=n_kv_heads)
        model = nt.Transformer(config)
        src = source(config, lm=False)
        cache = nd.new_cache(model, src, 4, config.max_len)
        nd.decoder_step(model, cache, np.full((4, 1), config.bos_id))  # fills the cross-attention caches
        caches = [c for layer in cache.layers for c in layer]
        sizes[n_kv_heads] = sum(c.keys.nbytes + c.values.nbytes for c in caches)
    assert sizes[None] == 4 * sizes[2] == 8 * sizes[1]


def test_float32_decoding_keeps_float32():
    config = CONFIGS["pre-norm gelu learned tied"]
    model = numpy_model(config, lm=False, dtype=np.float32)
    src = source(config, lm=False)
    out = nd.generate(model, src, max_new_tokens=MAX_NEW, return_dict_in_generate=True)
    tokens, logits = out.sequences, out.logits
    out = nd.generate(model, src, max_new_tokens=MAX_NEW, use_cache=False, return_dict_in_generate=True)
    _, recomputed = out.sequences, out.logits
    assert logits.dtype == np.float32 and tokens.dtype == np.int64
    assert np.abs(logits - recomputed).max() <= 1e-4


def test_beam_score_is_the_models_log_probability():
    """The returned score is sum log p(token) / length ** length_penalty by a fresh forward pass, with
    the same pad masking; length counts eos (or is max_len when the winner never ended)."""
    config = CONFIGS["post-norm relu sinusoidal untied"]
    for lm in (False, True):
        model = numpy_model(config, lm)
        src = source(config, lm)
        T_p = prompt_length(model, src)
        out = nd.generate(
            model, src, num_beams=3, max_new_tokens=MAX_NEW, length_penalty=0.5, return_dict_in_generate=True
        )
        tokens, scores = out.sequences, out.sequences_scores
        V = config.tgt_vocab_size
        log_probs = nd.without_pad(nd.log_softmax(forward_logits(model, src, tokens)).reshape(-1, V), config.pad_id)
        log_probs = log_probs.reshape(tokens.shape[0], -1, V)[:, T_p - 1 :]  # (B, steps, V)
        for b, row in enumerate(tokens[:, T_p:]):
            n = int(np.sum(row != config.pad_id))
            total = sum(log_probs[b, i, row[i]] for i in range(n))
            assert abs(total / n**0.5 - scores[b]) <= 1e-10


# ----------------------------------------------------------------------------------------------
# Beam search with one beam and early_stopping=True is greedy search. (With early_stopping=False, the
# default, one beam may go on past its first eos looking for a hypothesis with a better normalised score.)


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
@pytest.mark.parametrize("lm", LM)
def test_beam_size_one_is_greedy(lm, length_penalty, device):
    for config in list(CONFIGS.values())[:2]:
        np_model = numpy_model(config, lm, seed=1)
        src = source(config, lm, seed=1)
        greedy = nd.generate(np_model, src, max_new_tokens=MAX_NEW)
        beam = nd.generate(
            np_model, src, num_beams=1, max_new_tokens=MAX_NEW, length_penalty=length_penalty, early_stopping=True
        )
        np.testing.assert_array_equal(beam, greedy)
        model = torch_twin(np_model, device)
        t_src = torch.from_numpy(src).to(device)
        t_greedy = td.generate(model, t_src, max_new_tokens=MAX_NEW)
        assert torch.equal(
            td.generate(
                model, t_src, num_beams=1, max_new_tokens=MAX_NEW, length_penalty=length_penalty, early_stopping=True
            ),
            t_greedy,
        )


@pytest.mark.parametrize("early_stopping", [True, False, "never"])
@pytest.mark.parametrize("lm", LM)
def test_beam_search_stopping_rules_agree_between_numpy_and_torch(lm, early_stopping, device):
    """The three stopping rules of transformers' generate: the same tokens and scores on both sides, and
    "never" (the exact bound) never scores worse than the heuristic, which never scores worse than True."""
    config = CONFIGS["post-norm relu sinusoidal untied"]
    np_model = numpy_model(config, lm, seed=2)
    np_model.params["output_proj.bias"][config.eos_id] = 1.5  # eos likely: hypotheses finish at many steps
    src = source(config, lm, seed=2)
    model = torch_twin(np_model, device)
    out = nd.generate(
        np_model,
        src,
        num_beams=3,
        max_new_tokens=MAX_NEW,
        length_penalty=1.5,
        early_stopping=early_stopping,
        return_dict_in_generate=True,
    )
    ours, scores = out.sequences, out.sequences_scores
    out = td.generate(
        model, torch.from_numpy(src).to(device), num_beams=3, max_new_tokens=MAX_NEW, length_penalty=1.5,
        early_stopping=early_stopping, return_dict_in_generate=True,
    )  # fmt: skip
    theirs, t_scores = out.sequences, out.sequences_scores
    np.testing.assert_array_equal(theirs.cpu().numpy(), ours)
    np.testing.assert_allclose(t_scores, scores, rtol=1e-12)
    rules = {
        rule: nd.generate(
            np_model,
            src,
            num_beams=3,
            max_new_tokens=MAX_NEW,
            length_penalty=1.5,
            early_stopping=rule,
            return_dict_in_generate=True,
        ).sequences_scores
        for rule in (True, False, "never")
    }
    assert all(n >= f - 1e-12 >= t - 2e-12 for n, f, t in zip(rules["never"], rules[False], rules[True], strict=True))


# ----------------------------------------------------------------------------------------------
# NumPy and torch: the same tokens from one state dict.


@pytest.mark.parametrize("search", ["greedy", "beam 3"])
@pytest.mark.parametrize("lm", LM)
@pytest.mark.parametrize("config", [CONFIGS[k] for k in CONFIG_IDS[:3] + MODERN_IDS], ids=CONFIG_IDS[:3] + MODERN_IDS)
def test_numpy_and_torch_decode_the_same_tokens(config, lm, search, device):
    np_model = numpy_model(config, lm, seed=2)
    model = torch_twin(np_model, device)
    src = source(config, lm, seed=2)
    t_src = torch.from_numpy(src).to(device)
    if search == "greedy":
        ours, theirs = (
            nd.generate(np_model, src, max_new_tokens=MAX_NEW),
            td.generate(model, t_src, max_new_tokens=MAX_NEW),
        )
    else:
        out = nd.generate(
            np_model, src, num_beams=3, max_new_tokens=MAX_NEW, length_penalty=1.0, return_dict_in_generate=True
        )
        ours, scores = out.sequences, out.sequences_scores
        out = td.generate(
            model, t_src, num_beams=3, max_new_tokens=MAX_NEW, length_penalty=1.0, return_dict_in_generate=True
        )
        theirs, t_scores = out.sequences, out.sequences_scores
        assert np.abs(np.array(scores) - t_scores).max() <= 1e-10
    np.testing.assert_array_equal(ours, theirs.cpu().numpy())
    assert_well_formed(ours, prefix_of(config, lm, src), config, MAX_NEW, greedy=search == "greedy")


def test_exact_ties_break_the_same_way(device):
    """All logits equal (a zero output projection): greedy takes the lowest id that is not pad, every
    step; beam search ranks by (beam, token) and the earliest of the finished hypotheses wins."""
    config = CONFIGS["post-norm relu sinusoidal untied"]
    np_model = numpy_model(config, lm=False)
    np_model.params["output_proj.weight"][...] = 0.0
    np_model.params["output_proj.bias"][...] = 0.0
    model = torch_twin(np_model, device)
    src = source(config, lm=False)
    t_src = torch.from_numpy(src).to(device)
    B = src.shape[0]
    greedy = nd.generate(np_model, src, max_new_tokens=5)
    np.testing.assert_array_equal(greedy, np.ones((B, 6)))  # bos_id = 1 is the lowest id but pad
    np.testing.assert_array_equal(td.generate(model, t_src, max_new_tokens=5).cpu().numpy(), greedy)
    # Beam 3, no length penalty: eos finishes at ranks 1 of steps 0, 1, 2 with scores -log V, -2 log V,
    # -3 log V; done after 3 steps; the first is best, and the result is as long as it (as transformers').
    beam = nd.generate(np_model, src, num_beams=3, max_new_tokens=5, length_penalty=0.0)
    np.testing.assert_array_equal(beam, np.tile([1, 2], (B, 1)))
    np.testing.assert_array_equal(
        td.generate(model, t_src, num_beams=3, max_new_tokens=5, length_penalty=0.0).cpu().numpy(), beam
    )


# ----------------------------------------------------------------------------------------------
# eos, padding and early stopping.


def test_rows_end_at_different_steps_and_decoding_stops_early(device):
    config = CONFIGS["post-norm relu sinusoidal untied"]
    np_model = numpy_model(config, lm=True)
    np_model.params["output_proj.bias"][config.eos_id] = 0.0  # this model then ends its rows at steps 2, 1, 1, 6
    src = source(config, lm=True)
    tokens = nd.generate(np_model, src, max_new_tokens=MAX_NEW)
    generated = tokens[:, 3:]
    ends = [int(np.flatnonzero(row == config.eos_id)[0]) + 1 for row in generated]
    assert len(set(ends)) > 1 and max(ends) < MAX_NEW, ends  # the rows end apart, before max_len
    assert tokens.shape == (4, 3 + max(ends))
    assert_well_formed(tokens, src, config, MAX_NEW)
    t_tokens = td.generate(torch_twin(np_model, device), torch.from_numpy(src).to(device), max_new_tokens=MAX_NEW)
    np.testing.assert_array_equal(t_tokens.cpu().numpy(), tokens)


@pytest.mark.parametrize("lm", LM)
def test_eos_at_the_first_step(lm, device):
    config = CONFIGS["pre-norm relu sinusoidal tied one head"]
    np_model = numpy_model(config, lm)
    np_model.params["output_proj.bias"][config.eos_id] = 100.0
    src = source(config, lm)
    model = torch_twin(np_model, device)
    t_src = torch.from_numpy(src).to(device)
    T_p = prompt_length(np_model, src)
    prefix = src if lm else np.full((4, 1), config.bos_id)
    expected = np.concatenate([prefix, np.full((4, 1), config.eos_id)], axis=1)  # one step, then stop
    np.testing.assert_array_equal(nd.generate(np_model, src, max_new_tokens=MAX_NEW), expected)
    np.testing.assert_array_equal(td.generate(model, t_src, max_new_tokens=MAX_NEW).cpu().numpy(), expected)
    # Beam 3: one finished hypothesis at step 0 (only beam 0 is live), three more at step 1: done. The best
    # is the first, one token long, and the result is as long as the best hypothesis (as transformers').
    np.testing.assert_array_equal(nd.generate(np_model, src, num_beams=3, max_new_tokens=MAX_NEW), expected)
    np.testing.assert_array_equal(
        td.generate(model, t_src, num_beams=3, max_new_tokens=MAX_NEW).cpu().numpy(), expected
    )
    assert expected.shape[1] == T_p + 1


def test_max_len_runs_to_the_end_without_eos():
    config = CONFIGS["post-norm relu sinusoidal untied"]
    model = numpy_model(config, lm=False)
    model.params["output_proj.bias"][config.eos_id] = -100.0  # never eos
    src = source(config, lm=False)
    tokens = nd.generate(model, src, max_new_tokens=config.max_len - 1)  # the longest allowed
    assert tokens.shape == (4, config.max_len) and (tokens[:, 1:] != config.pad_id).all()
    assert nd.generate(model, src, num_beams=2, max_length=model.config.position_limit).shape == (
        4,
        config.max_len,
    )  # fill the table


# ----------------------------------------------------------------------------------------------
# Arguments and modes.


@pytest.mark.parametrize("lm", LM)
def test_max_len_over_the_limit_is_an_error(lm, device):
    config = CONFIGS["post-norm relu sinusoidal untied"]
    np_model = numpy_model(config, lm)
    model = torch_twin(np_model, device)
    src = source(config, lm)
    T_p = prompt_length(np_model, src)
    too_long = config.max_len - T_p + 1
    for decode, args in ((nd, (np_model, src)), (td, (model, torch.from_numpy(src).to(device)))):
        limit = rf"max_new_tokens={too_long}.*config.max_len={config.max_len}"
        with pytest.raises(ValueError, match=limit):
            decode.generate(*args, max_new_tokens=too_long)
        with pytest.raises(ValueError, match=limit):
            decode.generate(*args, num_beams=2, max_new_tokens=too_long)
        with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
            decode.generate(*args, max_new_tokens=0)
        with pytest.raises(TypeError, match="max_new_tokens must be an int"):
            decode.generate(*args, max_new_tokens=2.0)
        with pytest.raises(ValueError, match="num_beams must be >= 1"):
            decode.generate(*args, num_beams=0, max_new_tokens=3)
        assert decode.generate(*args, max_new_tokens=too_long - 1).shape[1] <= config.max_len


def test_inputs_are_checked_like_forward(device):
    config = CONFIGS["post-norm relu sinusoidal untied"]
    np_lm, np_mt = numpy_model(config, lm=True), numpy_model(config, lm=False)
    for decode, lm, mt, wrap in (
        (nd, np_lm, np_mt, np.asarray),
        (td, torch_twin(np_lm, device), torch_twin(np_mt, device), lambda a: torch.tensor(a, device=device)),
    ):
        out = decode.generate(lm, wrap([[4, 5], [0, 6]]), max_new_tokens=3)  # any prompt: no bos, even a pad
        assert out[:, :2].tolist() == [[4, 5], [0, 6]]  # returned as given, then its continuation
        with pytest.raises(ValueError, match="src_ids"):
            decode.generate(mt, wrap([[3, 99]]), max_new_tokens=3)  # an id beyond the source vocabulary
        with pytest.raises(ValueError, match="src_ids"):
            decode.generate(mt, wrap([3, 4]), max_new_tokens=3)  # not (B, S)
        with pytest.raises(TypeError):
            decode.generate(mt, wrap([[0.5, 1.0]]), max_new_tokens=3)
        with pytest.raises(TypeError, match="model must be"):
            decode.generate(object(), wrap([[3, 4]]), max_new_tokens=3)


def test_numpy_decoding_runs_in_eval_mode_and_restores_the_mode():
    config = nt.TransformerConfig(**SMALL, dropout=0.5)
    model = numpy_model(config, lm=False)
    src = source(config, lm=False)
    expected = nd.generate(model.eval(), src, max_new_tokens=MAX_NEW)
    model.train()
    assert np.array_equal(nd.generate(model, src, max_new_tokens=MAX_NEW), expected)  # no dropout
    assert np.array_equal(
        nd.generate(model, src, num_beams=2, max_new_tokens=MAX_NEW),
        nd.generate(model.eval(), src, num_beams=2, max_new_tokens=MAX_NEW),
    )
    model.train()
    nd.generate(model, src, num_beams=2, max_new_tokens=MAX_NEW)
    assert model.training
    with pytest.raises(ValueError):
        nd.generate(model, src, max_new_tokens=10**6)
    assert model.training  # restored on the error path too
    model.eval()
    nd.generate(model, src, max_new_tokens=MAX_NEW)
    assert not model.training


def test_torch_decoding_runs_in_eval_mode_without_grad_and_restores_modes(device):
    config = nt.TransformerConfig(**SMALL, dropout=0.5)
    np_model = numpy_model(config, lm=False)
    model = torch_twin(np_model, device)
    src = torch.from_numpy(source(config, lm=False)).to(device)
    expected = td.generate(model.eval(), src, max_new_tokens=MAX_NEW)
    model.train()
    model.decoder.layers[0].eval()  # a mixed mode: each module gets its own mode back
    assert torch.equal(td.generate(model, src, max_new_tokens=MAX_NEW), expected)
    assert model.training and model.encoder.training and not model.decoder.layers[0].training
    assert model.decoder.layers[1].training and not model.decoder.layers[0].self_attn.training
    with pytest.raises(ValueError):
        td.generate(model, src, num_beams=2, max_new_tokens=10**6)
    assert model.training and not model.decoder.layers[0].training
    assert torch.is_grad_enabled()
    out = td.generate(model, src, max_new_tokens=3, return_dict_in_generate=True)
    _, logits = out.sequences, out.logits
    assert not logits.requires_grad  # decoded under no_grad
