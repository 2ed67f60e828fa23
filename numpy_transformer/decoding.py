"""Decoding: greedy search, beam search and sampling, with a key/value cache so that each step runs one position.

    tokens = greedy_decode(model, src_ids, max_len=20)                 # (B, 1 + steps), bos first
    tokens = beam_search(model, src_ids, beam_size=4, max_len=20)      # (B, 1 + steps)
    tokens = greedy_decode(lm, prompt, max_len=20)                     # (B, T_p + steps), prompt first
    tokens = sample(lm, prompt, 20, np.random.default_rng(0), temperature=0.7, top_p=0.9)
    tokens = generate(lm, prompt, max_new_tokens=20)                   # as generate(): the checkpoint's settings
    tokens = generate(lm, prompt, 20, eos_token_id=[2, 7], bad_words_ids=[[5]], min_new_tokens=4)  # its arguments
    tokens = generate(lm, prompt, 20, rng=0, do_sample=True, num_beams=4)   # beam sampling

`src_ids` is the source (B, S) of a `Transformer`, or the prompt (B, T_p) of a `TransformerLM` (any ids:
it need not start with bos_id). `max_len` counts generated tokens. Decoding stops once every sequence
has produced eos_id (any of them, when it is a tuple); the positions after a sequence's eos hold pad_id (eos_id when
pad_id is None).

Which tokens may come next. A model of our own never generates pad_id (in the output it means "after eos"). A model
read from a Hugging Face checkpoint (hf.load) decodes under that checkpoint's rules and nothing else
(`model.generation_rules`, from its generation_config.json): the pad id is banned only when bad_words_ids lists it,
and what follows an end token is generate()'s fill, as transformers' generate() does. Its settings
(repetition_penalty, no_repeat_ngram_size, min_length, sampling's warpers, num_beams, ...) apply unless the caller
passes its own, by the same names (allowed_scores, warped_probabilities; logits_processors has each formula).

Why a cache. The decoder is causal: the hidden states of position i depend on positions <= i only, so
the keys and values that every earlier position computed are still right when position t is added.
Keeping them turns a step from a forward pass over the whole prefix (t positions through every layer,
and the encoder again) into one position through every layer plus attention over t cached keys. The
cross-attention keys and values depend only on the encoder's output: they are computed once.

Shape letters: B batch, K beam size, N rows decoded side by side (B, or B*K in beam search), S source
length, T_p prompt length (1 for the Transformer: bos), T_new positions run by one step (the prompt at the
first step, then 1), T_max positions the cache holds, D d_model, H heads, Dh head size, V vocabulary.
"""

from __future__ import annotations

import contextlib
import numbers
from dataclasses import dataclass

import numpy as np

from transformer_spec.config import GenerationRules
from transformer_spec.generation import (
    BEAM,
    PROCESSORS,
    SAMPLING,
    Step,
    after_eos,
    beam_fill,
    beam_sample_keep,
    best_finished,
    check_beam_arguments,
    check_int,
    check_no_streamer,
    check_rows_left_a_token,
    collect_finished,
    decoding_length,
    decoding_rules,
    end_ids,
    generate_plan,
    process_scores,
    sampling_probabilities,
    update_stopped,
    warped_scores,
)

from . import logits_processors as lp
from .attention import KVCache, MemoryCache
from .latent_attention import LatentCache
from .layers import linear_forward
from .model import (
    Transformer,
    TransformerLM,
    decoder_forward,
    encoder_forward,
    sub,
)
from .model import source_mask as model_source_mask
from .validation import check_attention_mask, check_ids

# ----------------------------------------------------------------------------------------------
# The cache: per decoder layer, a KVCache for self-attention (the keys and values of every position so far, or of
# the last sliding_window ones) and a MemoryCache for cross-attention (the encoder output's keys and values,
# projected at the first step). Attention reads and extends them itself: a step is decoder_forward on the new
# positions, with the caches passed in.


@dataclass
class DecoderCache:
    """Everything a decoding step needs besides the new tokens."""

    layers: list  # per decoder layer, (KVCache, MemoryCache or None)
    memory: np.ndarray | None  # (N, S, D) the encoder output, one copy per row; None in the LM
    memory_mask: np.ndarray | None  # (N, 1, 1, S) source padding, True = may attend; None in the LM or no pad_id
    decoder_params: dict  # the decoder's params, keyed below "decoder." (sliced once, not per step)
    length: int = 0  # positions cached so far


def new_cache(model, src_ids: np.ndarray | None, n_rows: int, total_len: int, src_mask=None) -> DecoderCache:
    """An empty cache for n_rows rows holding total_len positions. For a Transformer, src_ids (B, S) is
    the source (src_mask (B, S): its real tokens, or None: those not holding pad_id) and each source serves
    n_rows // B consecutive rows (the beams); the encoder runs here, once. src_ids is None for the LM."""
    cfg, params = model.config, model.params
    memory, memory_mask = None, None
    if src_ids is not None:
        n_copies = n_rows // src_ids.shape[0]
        memory, _ = encoder_forward(
            model.encoder_params(), src_ids, cfg, attention_mask=src_mask, keep=False
        )  # (B, S, D)
        memory = np.repeat(memory, n_copies, axis=0)  # (N, S, D): the beams of a source share its memory
        source_mask = model_source_mask(src_ids, src_mask, cfg.pad_id)  # (B, 1, 1, S), or None: nothing masked
        if source_mask is not None:
            memory_mask = np.repeat(source_mask, n_copies, axis=0)  # (N, 1, 1, S)
    layers = [
        (
            KVCache(n_rows, cfg.kv_heads, total_len, cfg.d_head, model.dtype, cfg.layer_window(i))  # its window's
            if cfg.kv_lora_rank is None
            else LatentCache(n_rows, total_len, cfg.kv_lora_rank, cfg.rope_dim, model.dtype),  # MLA: the latent
            None if memory is None else MemoryCache(),
        )
        for i in range(cfg.n_decoder_layers)
    ]
    return DecoderCache(layers, memory, memory_mask, sub(params, "decoder"))


def decoder_step(model, cache: DecoderCache, new_ids: np.ndarray, attention_mask: np.ndarray | None = None):
    """Run new_ids (N, T_new) at positions cache.length .. through the decoder; extend the cache. attention_mask
    (N, cache.length + T_new): the real tokens of a left-padded prompt and everything after it, or None.

    Returns the logits of the last new position, (N, V): the distribution of the next token.
    """
    x, _ = decoder_forward(
        cache.decoder_params, new_ids, cache.memory, model.config, memory_mask=cache.memory_mask,
        caches=cache.layers, start=cache.length, attention_mask=attention_mask, keep=False,
    )  # fmt: skip
    cache.length += new_ids.shape[1]
    x = model.scale_output(x[:, -1])  # (N, D): only the last position predicts
    logits, _ = linear_forward(x, model.output_weight(), model.output_bias())  # (N, V)
    return model.softcap(logits)[0]


def reorder_cache(cache: DecoderCache, rows: np.ndarray) -> None:
    """Beam search: row n continues the hypothesis of row rows[n], so it takes that row's keys and values.
    The cross-attention caches do not move: rows[n] is always a beam of the same source."""
    for self_cache, _ in cache.layers:
        self_cache.reorder(rows)


# ----------------------------------------------------------------------------------------------
# The two ways of getting the next token's logits: incremental (the cache) or recomputed.


class Incremental:
    """use_cache=True: each step runs only the positions the cache has not seen. mask (N, T_max): the real tokens
    (a left-padded prompt's, then every generated one), or None."""

    def __init__(self, model, src_ids, n_rows: int, total_len: int, mask=None, src_mask=None):
        self.model = model
        self.fresh_cache = lambda: new_cache(model, src_ids, n_rows, total_len, src_mask)
        self.cache = self.fresh_cache()
        self.mask = mask

    def next_logits(self, tokens: np.ndarray) -> np.ndarray:
        """tokens (N, T), the whole prefix -> logits of the next token (N, V). A cache its RoPE outgrows (LongRoPE
        past the original length, config.cache_outgrown) is made again from the whole prefix, as Phi-3's generate()."""
        if self.model.config.cache_outgrown(self.cache.length, tokens.shape[1]):
            self.cache = self.fresh_cache()
        mask = None if self.mask is None else self.mask[:, : tokens.shape[1]]
        return decoder_step(self.model, self.cache, tokens[:, self.cache.length :], mask)

    def reorder(self, rows: np.ndarray) -> None:
        reorder_cache(self.cache, rows)


class Recompute:
    """use_cache=False: each step runs model.forward on the whole prefix and keeps its last position."""

    def __init__(self, model, src_ids, n_copies: int, mask=None, src_mask=None):
        self.model = model
        self.src_ids = None if src_ids is None else np.repeat(src_ids, n_copies, axis=0)  # (N, S), one per beam
        self.src_mask = None if src_mask is None else np.repeat(src_mask, n_copies, axis=0)  # (N, S) or None
        self.mask = mask  # (N, T_max) the real tokens, or None

    def next_logits(self, tokens: np.ndarray) -> np.ndarray:
        """tokens (N, T) -> logits of the next token (N, V)."""
        if self.src_ids is None:
            mask = None if self.mask is None else self.mask[:, : tokens.shape[1]]
            return self.model.forward(tokens, attention_mask=mask, keep_cache=False)[:, -1]
        return self.model.forward(self.src_ids, tokens, attention_mask=self.src_mask, keep_cache=False)[:, -1]

    def reorder(self, rows: np.ndarray) -> None:
        pass  # the prefix is all there is, and the caller reorders it; the beams of a source share src_ids


def start_decoding(
    model, src_ids, max_len: int | None, n_copies: int, use_cache: bool, attention_mask=None, start_id=None
):  # fmt: skip
    """Check the arguments; return the prompt (B, T_p), max_len (None: as long as the position table
    allows) and the source of next-token logits for N = B * n_copies rows. attention_mask (B, T_p): the
    real tokens of a left-padded prompt (the LM's; every generated token is real), or of a Transformer's source
    (instead of the tokens not holding pad_id), or None."""
    src_ids, prompt, max_len = check_decoding_inputs(model, src_ids, max_len, start_id)
    mask, src_mask = None, None
    if isinstance(model, Transformer):
        src_mask = check_attention_mask(attention_mask, src_ids)  # (B, S), or None
    elif (given := check_attention_mask(attention_mask, prompt)) is not None:  # (B, T_p)
        mask = np.ones((prompt.shape[0] * n_copies, prompt.shape[1] + max_len), dtype=bool)  # (N, T_max)
        mask[:, : prompt.shape[1]] = np.repeat(given, n_copies, axis=0)
    if use_cache:
        n_rows = prompt.shape[0] * n_copies
        return prompt, max_len, Incremental(model, src_ids, n_rows, prompt.shape[1] + max_len, mask, src_mask)
    return prompt, max_len, Recompute(model, src_ids, n_copies, mask, src_mask)


def allowed_scores(scores: np.ndarray, model, rules: GenerationRules, step: Step) -> np.ndarray:
    """The next-token scores (N, V) (logits in greedy search and sampling, log-probabilities in beam search) after
    the logits processors, in transformers' order (transformer_spec.generation.process_scores; each formula in
    logits_processors): a model of our own first bans pad_id (without_pad); then repetition_penalty,
    no_repeat_ngram, bad_words, min_length, the forced tokens (forced_bos_id at position 1, forced_eos_id at the
    last step). A model read from a checkpoint applies its GenerationRules (from its generation_config.json, the
    caller's settings over them) and nothing else. The caller's array is never changed.

    ValueError when a row is left no token at all."""
    if model.generation_rules is None:
        scores = without_pad(scores, model.config.pad_id)  # a copy
    scores = process_scores(lp, scores, rules, step, end_ids(rules, model.config))
    check_something_allowed(scores, step.tokens.shape[1])
    return scores


def warped_probabilities(scores: np.ndarray, rules: GenerationRules, min_tokens_to_keep: int = 1) -> np.ndarray:
    """Sampling's distribution (N, V) from processed scores: temperature, top_k, top_p, min_p (each when it changes
    something, as generate() builds them), then the softmax (transformer_spec.generation.sampling_probabilities)."""
    return sampling_probabilities(lp, scores, rules, min_tokens_to_keep)


def penalty_start(model, attention_mask, n_copies: int) -> np.ndarray | None:
    """Where repetition_penalty starts counting in each of the N rows: after a decoder-only prompt's left padding
    (the first real token of attention_mask, as generate() takes it), None: everywhere (no mask, or an
    encoder-decoder, whose decoder ids have none)."""
    if attention_mask is None or isinstance(model, Transformer):
        return None
    return np.repeat(np.argmax(np.asarray(attention_mask) != 0, axis=1), n_copies)  # (N,)


def check_something_allowed(scores: np.ndarray, position: int) -> None:
    """ValueError when the rules leave a row (N, V) no token at all: argmax would pick one of the banned ones, and a
    beam would have no continuation."""
    empty = np.isneginf(scores).all(axis=-1)  # (N,)
    check_rows_left_a_token(np.flatnonzero(empty).tolist(), position)


def without_pad(scores: np.ndarray, pad_id: int | None) -> np.ndarray:
    """A copy of scores (N, V) with pad_id at -inf: a model of our own never generates pad (in the output it means
    "after eos"). Without a pad_id, a plain copy."""
    scores = scores.copy()
    if pad_id is not None:
        scores[:, pad_id] = -np.inf
    return scores


# ----------------------------------------------------------------------------------------------
# Greedy search.


def greedy_decode(model, src_ids, max_len: int, use_cache: bool = True, attention_mask=None, **settings) -> np.ndarray:
    """Take the most likely token at every step (the lowest id among equals), after the logits processors (see
    allowed_scores: never pad_id in a model of our own; a loaded one's generation_config.json rules).

    model: Transformer (src_ids (B, S), the source) or TransformerLM (src_ids (B, T_p), the prompt).
    max_len: the most tokens to generate (None: as many as config.max_len positions allow).
    use_cache False recomputes the whole prefix with model.forward at every step (slow; for checking).
    attention_mask, 1/True = a real token, as transformers' generate() takes it: a TransformerLM's (B, T_p) for a
    left-padded prompt (positions count the real tokens; padded keys are never attended to), a Transformer's
    (B, S) for its source (the source keys read, instead of those not holding pad_id).
    settings: repetition_penalty, no_repeat_ngram_size, min_length, min_new_tokens, over the checkpoint's (None:
    the checkpoint's; a model of our own: transformers' defaults, which change nothing).
    Returns int64 ids (B, T_p + steps): bos_id (Transformer) or the prompt (LM), then the generated
    tokens; after a row's eos_id, pad_id (a loaded checkpoint: generate()'s fill). Steps stop early once every row
    has produced eos_id.
    """
    rules = decoding_rules(model_rules(model), settings, PROCESSORS, "greedy_decode", model.config)
    tokens, _ = greedy_search(model, src_ids, max_len, use_cache, attention_mask, rules)
    return tokens


def sample(
    model, src_ids, max_len: int, rng=None, use_cache: bool = True, attention_mask=None, streamer=None, **settings
) -> np.ndarray:
    """Draw every token from the distribution softmax(warped scores), as generate(do_sample=True) does: the logits
    processors of greedy_decode, then temperature, top_k, top_p and min_p (warped_probabilities).

    rng: a np.random.Generator (drawn from; a run is reproduced by a generator seeded alike), an int seed, or None
    (a fresh, unseeded generator). settings: those of greedy_decode and temperature, top_k, top_p, min_p, over the
    checkpoint's (None: the checkpoint's; top_k 0 and min_p 0 turn them off; a model of our own starts from
    transformers' defaults: temperature 1, top_k 50, top_p 1). streamer: None, or a callable given each step's
    tokens (B,) as they are chosen (int64; a finished row's fill). Other arguments and the result as greedy_decode.
    """
    rules = decoding_rules(model_rules(model), settings, PROCESSORS + SAMPLING, "sample", model.config)
    tokens, _ = greedy_search(model, src_ids, max_len, use_cache, attention_mask, rules, as_generator(rng), streamer)
    return tokens


def as_generator(rng) -> np.random.Generator:
    """rng as a np.random.Generator: itself, one seeded with an int, or a fresh one for None."""
    if rng is None:
        return np.random.default_rng()
    if isinstance(rng, numbers.Integral) and not isinstance(rng, bool):
        return np.random.default_rng(int(rng))
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, an int seed or None, got {type(rng).__name__}")
    return rng


def model_rules(model) -> GenerationRules | None:
    """The model's generation rules (None for a model of our own), after checking it is a model that decodes."""
    check_model(model)
    return model.generation_rules


def generate(
    model, src_ids, max_new_tokens: int | None = None, attention_mask=None, rng=None, use_cache: bool = True,
    streamer=None, **settings,
) -> np.ndarray:  # fmt: skip
    """Decode as transformers' generate() does under the checkpoint's generation_config.json, the caller's settings
    over it: sampling when do_sample (sample), beam search when num_beams > 1 (beam_search), else greedy search.

    max_new_tokens: None: the rules' max_new_tokens, else their max_length minus the decoder input (the prompt, or
    the start token), else 20, as generate(). settings: do_sample, num_beams, length_penalty, early_stopping and
    those of sample (None: the checkpoint's). rng and streamer as in sample (beam search streams nothing: a
    streamer with num_beams > 1 is a ValueError, as in transformers). do_sample with num_beams > 1 samples the
    beams' candidates (beam_search_scores with an rng).
    """
    T_p = 1 if isinstance(model, Transformer) else np.shape(src_ids)[-1]
    rules, max_len, strategy = generate_plan(model_rules(model), settings, T_p, max_new_tokens, model.config)
    if strategy in ("beam", "beam_sample"):
        check_no_streamer(streamer)
        out, _ = beam_search_scores(
            model, src_ids, rules.num_beams, max_len, rules.length_penalty, use_cache, rules.early_stopping,
            attention_mask, rules, rng=as_generator(rng) if strategy == "beam_sample" else None,
        )  # fmt: skip
        return out
    generator = as_generator(rng) if strategy == "sample" else None
    return greedy_search(model, src_ids, max_len, use_cache, attention_mask, rules, generator, streamer)[0]


def is_eos(tokens: np.ndarray, eos: tuple) -> np.ndarray:
    """Which tokens end a sequence: any of `eos` (end_ids: the caller's eos_token_id, else config.eos_ids, several
    in Llama 3's configs); none when it is empty."""
    return np.isin(tokens, eos)


def greedy_search(
    model, src_ids, max_len: int, use_cache: bool = True, attention_mask=None, rules=None, rng=None, streamer=None
):  # fmt: skip
    """greedy_decode (rng None) or sample (rng a Generator) under `rules` (None: the model's), which also returns
    the logits it chose from, (B, steps, V), for the tests. streamer: called with each step's tokens (B,)."""
    check_model(model)
    rules = rules or model.generation_rules or GenerationRules()
    with evaluating(model):
        prompt, max_len, decoder = start_decoding(model, src_ids, max_len, 1, use_cache, attention_mask, rules.start_id)
        cfg = model.config
        eos = end_ids(rules, cfg)
        B, T_p = prompt.shape
        fill = after_eos(rules, cfg)
        start = penalty_start(model, attention_mask, 1)
        tokens = np.full((B, T_p + max_len), fill, dtype=np.int64)
        tokens[:, :T_p] = prompt
        done = np.zeros(B, dtype=bool)  # the row has produced eos_id
        step_logits = []
        for t in range(T_p, T_p + max_len):
            logits = decoder.next_logits(tokens[:, :t])  # (B, V)
            step_logits.append(logits)
            scores = allowed_scores(logits, model, rules, Step(tokens[:, :t], T_p, start, t == T_p + max_len - 1))
            if rng is None:
                choice = scores.argmax(axis=-1)  # (B,) the first maximum
            else:
                choice = lp.draw(warped_probabilities(scores, rules), rng)  # (B,)
            tokens[:, t] = np.where(done, fill, choice)
            if streamer is not None:
                streamer(tokens[:, t].copy())
            done |= is_eos(tokens[:, t], eos)
            if done.all():
                break
    return tokens[:, : t + 1], np.stack(step_logits, axis=1)


# ----------------------------------------------------------------------------------------------
# Beam search, with the rules of transformers' generate(num_beams=K) (transformers 4.5x and later).
#
# Rows b*K .. b*K + K - 1 hold the K live hypotheses of batch element b. Each step scores every
# continuation, score = cumulative log-probability of the hypothesis + log p(token), with log p from
# the log-softmax of the logits and the banned tokens then set to -inf (as in greedy search: pad_id in a model of
# our own, the checkpoint's bad words in a loaded one; the other tokens are not renormalised). Candidates are
# ranked per element by (-score, beam, token): a stable sort of the flat index beam * V + token, so equal scores go
# to the lower beam, then the lower token id. Of the (1 + n_eos) K best, 2K at least (at most n_eos K are eos,
# n_eos per beam, so K at least are not):
#   - an eos among the first K ranks finishes its hypothesis, with the normalised score
#     sum of log-probs / (generated tokens, eos included) ** length_penalty;
#   - the first K that are not eos (in rank order) become the new live hypotheses;
#   - at the last step (max_len generated tokens) every candidate among the first K ranks finishes,
#     eos or not.
# When an element stops taking finished hypotheses (`early_stopping`):
#   - True: once it has K of them;
#   - False (transformers' default): once it has K and the best live hypothesis, scored at its current
#     length, cannot beat the worst of the best K (a heuristic: with length_penalty > 0 a longer one
#     could still win);
#   - "never": as False, but scoring the best live one at max_len when length_penalty > 0 (the exact bound).
# The search stops when every element has stopped, or at max_len. The answer is the finished hypothesis
# with the best normalised score, the earliest found among equals. The bookkeeping of finished hypotheses (collect,
# stop, pick the best) is plain Python, shared with torch_transformer.decoding: transformer_spec.generation.


def log_softmax(x: np.ndarray) -> np.ndarray:
    """log softmax over the last axis: x - max - log(sum(exp(x - max)))."""
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def best_candidates(cumulative: np.ndarray, log_probs: np.ndarray, n_best: int):
    """cumulative (B, K), log_probs (B, K, V) -> the n_best continuations of every element, best first:
    (score, beam, token), each (B, n_best). Ties: lower beam, then lower token id (a stable sort)."""
    B, K, V = log_probs.shape
    scores = (cumulative[:, :, None] + log_probs).reshape(B, K * V)  # flat index beam * V + token
    order = np.argsort(-scores, axis=1, kind="stable")[:, :n_best]  # (B, n_best)
    return np.take_along_axis(scores, order, axis=1), order // V, order % V


def candidate_probabilities(cumulative: np.ndarray, log_probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Beam sampling's law over an element's continuations: the scores s = cumulative (B, K) + warped log_probs
    (B, K, V), flat (B, K * V) (index beam * V + token), and softmax(s) over each row."""
    B, K, V = log_probs.shape
    scores = (cumulative[:, :, None] + log_probs).reshape(B, K * V)
    return scores, lp.softmax(scores)


def sampled_candidates(cumulative: np.ndarray, log_probs: np.ndarray, n_best: int, rng: np.random.Generator):
    """Beam-search sampling's candidates (transformers' beam-search multinomial sampling): n_best continuations of
    every element drawn without replacement from softmax over its K*V continuation scores (cumulative (B, K) plus
    the warped log_probs (B, K, V)), then ranked by score (ties: the earlier drawn). (score, beam, token), each
    (B, n_best), as best_candidates."""
    V = log_probs.shape[-1]
    scores, probs = candidate_probabilities(cumulative, log_probs)  # (B, K * V) each
    drawn = lp.draw_distinct(probs, n_best, rng)  # (B, n_best) flat indices
    drawn_scores = np.take_along_axis(scores, drawn, axis=1)
    order = np.argsort(-drawn_scores, axis=1, kind="stable")  # (B, n_best), best first
    flat = np.take_along_axis(drawn, order, axis=1)
    return np.take_along_axis(drawn_scores, order, axis=1), flat // V, flat % V


def beam_search(
    model,
    src_ids,
    beam_size: int | None = None,
    max_len: int | None = None,
    length_penalty: float | None = None,
    use_cache: bool = True,
    early_stopping: bool | str | None = None,
    attention_mask=None,
    **settings,
) -> np.ndarray:
    """Keep the beam_size most likely hypotheses at every step (the rules are above this function).

    Arguments and result as greedy_decode (settings too: the logits processors, applied to the log-probabilities);
    max_len None generates up to config.max_len positions.
    beam_size: None: the checkpoint's num_beams when it asks for beams, else 4.
    length_penalty: exponent of the length that divides a hypothesis' log-probability (0: none; larger
    favours longer outputs); None: the checkpoint's (1.0 without one). early_stopping: True, False or "never", as
    transformers' generate; None: the checkpoint's (False without one).
    attention_mask: a left-padded prompt's real tokens, as in greedy_decode.
    Returns int64 ids (B, T_p + L), the best hypothesis of each element, L the longest of them.
    """
    tokens, _ = beam_search_scores(
        model, src_ids, beam_size, max_len, length_penalty, use_cache, early_stopping, attention_mask, None, **settings
    )
    return tokens


def beam_search_scores(
    model, src_ids, beam_size=None, max_len=None, length_penalty=None, use_cache=True, early_stopping=None,
    attention_mask=None, rules=None, rng=None, **settings,
):  # fmt: skip
    """beam_search that also returns each element's best normalised score, a list of B floats. rules: the rules to
    decode under (generate's), instead of the model's with `settings` over them. rng: None, or a Generator: beam
    sampling (generate(do_sample=True, num_beams=K)): the warpers on the processed log-probabilities (keeping
    beam_sample_keep tokens at least), and the candidates drawn (sampled_candidates) instead of the best taken."""
    if rules is None:
        given = {"length_penalty": length_penalty, "early_stopping": early_stopping} | settings
        rules = decoding_rules(model_rules(model), given, PROCESSORS + BEAM, "beam_search", model.config)
    if beam_size is None:
        beam_size = rules.num_beams if rules.num_beams > 1 else 4
    length_penalty, early_stopping = rules.length_penalty, rules.early_stopping
    check_beam_arguments(beam_size, length_penalty, early_stopping)
    check_model(model)
    with evaluating(model):
        K = beam_size
        prompt, max_len, decoder = start_decoding(model, src_ids, max_len, K, use_cache, attention_mask, rules.start_id)
        cfg = model.config
        eos = end_ids(rules, cfg)
        B, T_p = prompt.shape
        fill = beam_fill(rules, cfg)
        tokens = np.full((B * K, T_p + max_len), fill, dtype=np.int64)
        tokens[:, :T_p] = np.repeat(prompt, K, axis=0)  # (B*K, T_p)
        # The K beams start as copies of one prompt: only beam 0 may be extended at the first step.
        cumulative = np.full((B, K), -np.inf, dtype=model.dtype)
        cumulative[:, 0] = 0.0
        # Each beam may end with every eos id: of the best (1 + n_eos) K candidates (2K at least, as generate), K
        # are not eos.
        n_best = max(2, 1 + len(eos)) * K
        finished: list[list] = [[] for _ in range(B)]  # per element: (normalised score, generated tokens), in order
        stopped = [False] * B  # the element takes no more finished hypotheses
        start = penalty_start(model, attention_mask, K)
        for step in range(max_len):
            t = T_p + step
            log_probs = log_softmax(decoder.next_logits(tokens[:, :t]))  # (N, V)
            log_probs = allowed_scores(log_probs, model, rules, Step(tokens[:, :t], T_p, start, step == max_len - 1))
            if rng is None:
                score, beam, token = best_candidates(cumulative, log_probs.reshape(B, K, -1), n_best)  # (B, n_best)
            else:
                log_probs = warped_scores(lp, log_probs, rules, beam_sample_keep(eos)).reshape(B, K, -1)  # (B, K, V)
                score, beam, token = sampled_candidates(cumulative, log_probs, n_best, rng)  # (B, n_best) each
            rows = np.arange(B)[:, None] * K + beam  # (B, n_best): the row each candidate continues
            ends = is_eos(token[:, :K], eos)  # (B, K): the first K ranks that end a hypothesis
            if step == max_len - 1:
                ends[:] = True  # the last step: every one of the first K ranks ends, eos or not
            candidates = score.tolist(), rows.tolist(), token.tolist(), ends.tolist()  # (B, n_best) or (B, K) each
            collect_finished(finished, stopped, *candidates, tokens[:, T_p:t].tolist(), step + 1, length_penalty)
            if step == max_len - 1:
                break
            # The first K candidates that are not eos, in rank order (a stable sort puts False first).
            live = np.argsort(is_eos(token, eos), axis=1, kind="stable")[:, :K]  # (B, K) ranks
            cumulative = np.take_along_axis(score, live, axis=1)  # (B, K), best first
            parents = np.take_along_axis(rows, live, axis=1).reshape(B * K)  # (N,)
            tokens = tokens[parents]  # each row takes its parent's prefix ...
            tokens[:, t] = np.take_along_axis(token, live, axis=1).reshape(B * K)  # ... and its new token
            decoder.reorder(parents)
            best_live = cumulative[:, 0].tolist()
            update_stopped(stopped, finished, best_live, step + 1, max_len, length_penalty, K, early_stopping)
            if all(stopped):
                break
    return best_hypotheses(prompt, finished, fill)


def best_hypotheses(prompt, finished, fill_id):
    """The prompt followed by each element's best finished hypothesis, padded with fill_id to the longest:
    ids (B, T_p + L), and the scores."""
    B, T_p = prompt.shape
    best = best_finished(finished)
    out = np.full((B, T_p + max(len(h) for _, h in best)), fill_id, dtype=np.int64)
    out[:, :T_p] = prompt
    for b, (_, hypothesis) in enumerate(best):
        out[b, T_p : T_p + len(hypothesis)] = hypothesis
    return out, [score for score, _ in best]


# ----------------------------------------------------------------------------------------------
# Arguments and modes.


def check_model(model) -> None:
    if not isinstance(model, (Transformer, TransformerLM)):
        raise TypeError(f"model must be a numpy_transformer Transformer or TransformerLM, got {type(model).__name__}")


@contextlib.contextmanager
def evaluating(model):
    """Evaluation mode (no dropout) for the duration; the caller's mode afterwards, even on an error."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def check_decoding_inputs(model, src_ids, max_len, start_id=None):
    """Validate like model.forward does. Returns src_ids (B, S) (None for the LM), the prompt (B, T_p)
    and max_len (None becomes the most that fits in config.max_len positions). start_id: a Transformer's first
    decoder token (the caller's decoder_start_token_id); None: config.bos_id."""
    cfg = model.config
    if max_len is not None:
        check_int("max_len", max_len)
    if isinstance(model, Transformer):
        src_ids = check_ids("src_ids", src_ids, cfg.src_vocab_size, cfg.position_limit)
        start = cfg.bos_id if start_id is None else start_id
        if start is None:
            raise ValueError(
                "decoding a Transformer starts from config.bos_id (the decoder start token), which is None"
            )
        prompt = np.full((src_ids.shape[0], 1), start, dtype=np.int64)  # (B, 1)
    else:
        prompt = check_ids("src_ids", src_ids, cfg.tgt_vocab_size, cfg.position_limit).astype(
            np.int64
        )  # (B, T_p), any ids
        src_ids = None
    max_len = decoding_length(max_len, prompt.shape[1], cfg.position_limit, isinstance(model, TransformerLM))
    return src_ids, prompt, max_len
