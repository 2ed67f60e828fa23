"""Decoding: greedy search, sampling, beam search and beam sampling behind one generate(), with a key/value cache so
that each step runs one position.

    tokens = generate(model, src_ids, max_new_tokens=20)                       # (B, 1 + steps), the start token first
    tokens = generate(lm, prompt, max_new_tokens=20)                           # (B, T_p + steps), the prompt first
    tokens = generate(lm, prompt, max_new_tokens=20, num_beams=4)              # beam search
    tokens = generate(lm, prompt, do_sample=True, temperature=0.7, top_p=0.9, rng=0)   # sampling
    tokens = generate(lm, prompt, eos_token_id=[2, 7], bad_words_ids=[[5]], min_new_tokens=4)
    tokens = generate(lm, prompt, do_sample=True, num_beams=4, rng=0)          # beam sampling
    config = GenerationConfig(max_new_tokens=20, repetition_penalty=1.2)     # typed and frozen, transformers' names
    tokens = generate(lm, prompt, config, top_k=5)                             # an argument over the config
    tokens = generate(lm, prompt, stop_strings=["\\n"], tokenizer=tokenizer)  # a row stops after a newline
    out = generate(lm, prompt, return_dict_in_generate=True)                   # out.sequences, out.logits

generate(model, src_ids, generation_config=None, *, attention_mask, rng, use_cache, streamer, tokenizer,
return_dict_in_generate, **settings): everything after the ids and the config is a keyword. The settings, under
transformers' names (GenerationConfig lists them), take precedence over generation_config's set fields, which take
precedence over the checkpoint's generation_config.json, as in transformers. The searches are private
(`_greedy_search`, `_sample`, `_beam_search`, `_beam_sample`), chosen in one place (generate, from do_sample and
num_beams).

`src_ids` is the source (B, S) of a `Transformer`, or the prompt (B, T_p) of a `TransformerLM` (any ids:
it need not start with bos_id). max_new_tokens counts generated tokens (None: the config's, else max_length minus
the prompt, else 20, as generate()). Decoding stops once every sequence has produced an end token (eos_token_id,
any of them when it is a list) or a stop string; the positions after it hold the fill (pad_id, eos_id when pad_id
is None).

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
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from transformer_spec.config import GenerationRules
from transformer_spec.generation import (
    HIT_PENALTY,
    GenerateOutput,
    GenerationConfig,
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
    end_ids,
    generate_plan,
    languages_to_detect,
    process_scores,
    sampling_probabilities,
    update_stopped,
    warped_scores,
)
from transformer_spec.stop_strings import StopStrings

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
        encode_source = getattr(model, "encode_source", None)  # a SpeechTransformer's: its audio encoder, no mask
        if encode_source is not None:
            memory, source_mask = encode_source(src_ids, src_mask)  # (B, S, D), None
        else:
            memory, _ = encoder_forward(
                model.encoder_params(), src_ids, cfg, attention_mask=src_mask, keep=False
            )  # (B, S, D)
            source_mask = model_source_mask(src_ids, src_mask, cfg.pad_id)  # (B, 1, 1, S), or None: nothing masked
        memory = np.repeat(memory, n_copies, axis=0)  # (N, S, D): the beams of a source share its memory
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
    model, src_ids, max_len: int | None, n_copies: int, use_cache: bool, attention_mask=None, start_id=None,
    decoder_prompt: tuple = (),
    languages: tuple = (),
):  # fmt: skip
    """Check the arguments; return the prompt (B, T_p), max_len (None: as long as the position table
    allows) and the source of next-token logits for N = B * n_copies rows. attention_mask (B, T_p): the
    real tokens of a left-padded prompt (the LM's; every generated token is real), or of a Transformer's source
    (instead of the tokens not holding pad_id), or None. languages: Whisper's language ids to detect among
    (check_decoding_inputs)."""
    src_ids, prompt, max_len = check_decoding_inputs(model, src_ids, max_len, start_id, decoder_prompt, languages)
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
# The one way in: generate(), which picks one of the four searches below.


def generate(
    model, src_ids, generation_config: GenerationConfig | None = None, *, attention_mask=None, rng=None,
    use_cache: bool = True, streamer=None, tokenizer=None, return_dict_in_generate: bool = False, **kwargs,
):  # fmt: skip
    """Decode as transformers' generate() does: the checkpoint's generation_config.json (model.generation_rules; a
    model of our own: transformers' defaults, and pad_id never generated), generation_config's set fields over it,
    the keyword arguments over both (GenerationConfig lists them, under transformers' names; one that is None: not
    given). do_sample and num_beams pick the search, here and nowhere else: greedy search, sampling, beam search or
    beam sampling (SEARCHES).

    model: Transformer (src_ids (B, S), the source) or TransformerLM (src_ids (B, T_p), the prompt; any ids).
    attention_mask, 1/True = a real token, as generate() takes it: a TransformerLM's (B, T_p) for a left-padded
    prompt (positions count the real tokens; padded keys are never attended to), a Transformer's (B, S) for its
    source (instead of the tokens not holding pad_id).
    rng: sampling's np.random.Generator (a run is reproduced by a generator seeded alike), an int seed, or None (a
    fresh, unseeded one). use_cache False recomputes the whole prefix with model.forward at every step (slow; for
    checking). streamer: None, or a callable given each step's tokens (B,) as they are chosen (int64; a finished
    row's fill); with num_beams > 1 a ValueError, as in transformers. tokenizer: the model's (text.Tokenizer or a
    transformers one), which stop_strings needs (the caller's, or the checkpoint's own: warned about without one).
    Returns int64 ids (B, T_p + steps): the start token (Transformer) or the prompt (LM), then the generated tokens;
    after a row's end token (or stop string), generate()'s fill (pad_id, else the first end token). Stops early
    once every row has ended. return_dict_in_generate: a GenerateOutput instead (with each step's logits, or the
    beams' scores).
    """
    T_p = 1 if isinstance(model, Transformer) else np.shape(src_ids)[-1]  # the plan adds a decoder_prompt
    plan = generate_plan(model_rules(model), generation_config, kwargs, T_p, model.config, tokenizer)
    if plan.strategy in ("beam", "beam_sample"):
        check_no_streamer(streamer)
    generator = as_generator(rng) if plan.strategy in ("sample", "beam_sample") else None
    options = Options(use_cache, attention_mask, generator, streamer, plan.stop)
    out = SEARCHES[plan.strategy](model, src_ids, plan.max_len, plan.rules, options)
    return out if return_dict_in_generate else out.sequences


@dataclass
class Options:
    """How a search runs besides its rules: use_cache, the attention mask, the random Generator (sampling's; None
    otherwise), the streamer and the stop strings (StopStrings or None)."""

    use_cache: bool = True
    attention_mask: np.ndarray | None = None
    rng: np.random.Generator | None = None
    streamer: Callable | None = None
    stop: StopStrings | None = None


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


def is_eos(tokens: np.ndarray, eos: tuple) -> np.ndarray:
    """Which tokens end a sequence: any of `eos` (end_ids: the caller's eos_token_id, else config.eos_ids, several
    in Llama 3's configs); none when it is empty."""
    return np.isin(tokens, eos)


# ----------------------------------------------------------------------------------------------
# Greedy search and sampling: one token per row per step, the most likely one (the lowest id among equals) or one
# drawn from softmax(warped scores), after the logits processors (allowed_scores).


def _greedy_search(model, src_ids, max_len: int, rules: GenerationRules, options: Options) -> GenerateOutput:
    """generate(do_sample=False, num_beams=1)."""
    return _token_by_token(model, src_ids, max_len, rules, options, lambda scores: scores.argmax(axis=-1))


def _sample(model, src_ids, max_len: int, rules: GenerationRules, options: Options) -> GenerateOutput:
    """generate(do_sample=True, num_beams=1): temperature, top_k, top_p, min_p (warped_probabilities), then a draw
    from options.rng."""
    rng = options.rng or as_generator(None)
    return _token_by_token(
        model, src_ids, max_len, rules, options, lambda scores: lp.draw(warped_probabilities(scores, rules), rng)
    )


def _token_by_token(model, src_ids, max_len: int, rules: GenerationRules, options: Options, choose) -> GenerateOutput:
    """Greedy search or sampling (`choose`: allowed scores (B, V) -> tokens (B,)), with the logits each step chose
    from, (B, steps, V)."""
    attention_mask = options.attention_mask
    with evaluating(model):
        prompt, max_len, decoder = start_decoding(
            model, src_ids, max_len, 1, options.use_cache, attention_mask, rules.start_id, rules.decoder_prompt,
            languages_to_detect(rules),
        )  # fmt: skip
        cfg = model.config
        eos = end_ids(rules, cfg)
        B, T_p = prompt.shape
        fill = after_eos(rules, cfg)
        start = penalty_start(model, attention_mask, 1)
        tokens = np.full((B, T_p + max_len), fill, dtype=np.int64)
        tokens[:, :T_p] = prompt
        done = np.zeros(B, dtype=bool)  # the row has produced eos_id (or a stop string)
        step_logits = []
        for t in range(T_p, T_p + max_len):
            logits = decoder.next_logits(tokens[:, :t])  # (B, V)
            step_logits.append(logits)
            scores = allowed_scores(logits, model, rules, Step(tokens[:, :t], T_p, start, t == T_p + max_len - 1))
            tokens[:, t] = np.where(done, fill, choose(scores))
            if options.streamer is not None:
                options.streamer(tokens[:, t].copy())
            done |= is_eos(tokens[:, t], eos)
            if options.stop is not None:
                done |= np.array(options.stop.hits(tokens[:, : t + 1].tolist()))
            if done.all():
                break
    return GenerateOutput(tokens[:, : t + 1], logits=np.stack(step_logits, axis=1))


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
#   - a candidate ends (transformers' stopping criteria) when its token is an eos or, with stop_strings, when its
#     row's text then ends with a stop string (StopStrings on the candidate's own row); one among the first K ranks
#     finishes its hypothesis, with the normalised score
#     sum of log-probs / (generated tokens, the last one included) ** length_penalty;
#   - the first K that do not end (in rank order) become the new live hypotheses; stop strings can leave fewer
#     than K: the best of those that ended then go on as well, their score lowered by HIT_PENALTY (-1e9), as
#     generate() does; when every candidate of every element ends, the search stops;
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


def _beam_search(model, src_ids, max_len: int, rules: GenerationRules, options: Options) -> GenerateOutput:
    """generate(num_beams=K): keep the K most likely hypotheses at every step (the rules are above)."""
    return _beams(model, src_ids, max_len, rules, options, rng=None)


def _beam_sample(model, src_ids, max_len: int, rules: GenerationRules, options: Options) -> GenerateOutput:
    """generate(do_sample=True, num_beams=K): the warpers on the processed log-probabilities (keeping
    beam_sample_keep tokens at least), and the candidates drawn (sampled_candidates) instead of the best taken."""
    return _beams(model, src_ids, max_len, rules, options, rng=options.rng)


def _beams(model, src_ids, max_len: int, rules: GenerationRules, options: Options, rng) -> GenerateOutput:
    """Beam search (rng None) or beam sampling (rng a Generator) under `rules`; the ids (B, T_p + L), the best
    hypothesis of each element (L the longest of them), and each element's best normalised score."""
    beam_size, length_penalty, early_stopping = rules.num_beams, rules.length_penalty, rules.early_stopping
    check_beam_arguments(beam_size, length_penalty, early_stopping)
    use_cache, attention_mask = options.use_cache, options.attention_mask
    with evaluating(model):
        K = beam_size
        prompt, max_len, decoder = start_decoding(
            model, src_ids, max_len, K, use_cache, attention_mask, rules.start_id, rules.decoder_prompt,
            languages_to_detect(rules),
        )  # fmt: skip
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
            hits = is_eos(token, eos)  # (B, n_best): the candidates that end a hypothesis (an end token ...)
            if options.stop is not None:  # ... or a stop string, read on the candidate's own row
                window = tokens[rows.reshape(-1), max(0, t + 1 - options.stop.window) : t]  # (B * n_best, <= w - 1)
                row_texts = np.concatenate([window, token.reshape(-1, 1)], axis=1).tolist()
                hits |= np.array(options.stop.hits(row_texts)).reshape(hits.shape)
            ends = hits[:, :K].copy()  # (B, K): the first K ranks that end a hypothesis
            if step == max_len - 1:
                ends[:] = True  # the last step: every one of the first K ranks ends, eos or not
            candidates = score.tolist(), rows.tolist(), token.tolist(), ends.tolist()  # (B, n_best) or (B, K) each
            collect_finished(finished, stopped, *candidates, tokens[:, T_p:t].tolist(), step + 1, length_penalty)
            if step == max_len - 1 or hits.all():  # hits.all(): no candidate of any element goes on
                break
            # The first K candidates that do not end, in rank order (a stable sort puts False first); with stop strings
            # fewer may be left: ended ones then go on too, penalised by HIT_PENALTY as generate() does.
            live = np.argsort(hits, axis=1, kind="stable")[:, :K]  # (B, K) ranks
            cumulative = np.take_along_axis(
                np.where(hits, score + HIT_PENALTY, score), live, axis=1
            )  # (B, K), best first
            parents = np.take_along_axis(rows, live, axis=1).reshape(B * K)  # (N,)
            tokens = tokens[parents]  # each row takes its parent's prefix ...
            tokens[:, t] = np.take_along_axis(token, live, axis=1).reshape(B * K)  # ... and its new token
            decoder.reorder(parents)
            best_live = cumulative[:, 0].tolist()
            update_stopped(stopped, finished, best_live, step + 1, max_len, length_penalty, K, early_stopping)
            if all(stopped):
                break
    sequences, scores = best_hypotheses(prompt, finished, fill)
    return GenerateOutput(sequences, sequences_scores=scores)


SEARCHES = {"greedy": _greedy_search, "sample": _sample, "beam": _beam_search, "beam_sample": _beam_sample}


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


def detect_language(model, source: np.ndarray, start: int, languages: tuple) -> np.ndarray:
    """Whisper's language detection, as transformers' WhisperGenerationMixin.detect_language does it: the decoder
    reads the start token alone, and of the next-token logits z (B, V) each row's language is the id among
    `languages` (ascending) with the largest, argmax_{l in languages} z_l (the lowest such id on a tie, as an argmax
    over the vocabulary with every other id at -inf). source: the encoder's input (B, ...). Returns ids (B,)."""
    ids = np.asarray(languages, dtype=np.int64)  # (L,)
    first = np.full((source.shape[0], 1), start, dtype=np.int64)  # (B, 1)
    logits = model.forward(source, first, keep_cache=False)[:, -1]  # (B, V)
    return ids[np.argmax(logits[:, ids], axis=-1)]  # (B,)


def check_decoding_inputs(model, src_ids, max_len, start_id=None, decoder_prompt: tuple = (), languages: tuple = ()):
    """Validate like model.forward does. Returns src_ids (B, S) (None for the LM), the prompt (B, T_p)
    and max_len (None becomes the most that fits in config.max_len positions). start_id: a Transformer's first
    decoder token (the caller's decoder_start_token_id); None: config.bos_id. decoder_prompt: the ids a Transformer's
    decoder reads after it (GenerationRules.decoder_prompt), so that its prompt is (B, 1 + len(decoder_prompt)).
    languages: Whisper's language token ids when the language is to be detected (generation.languages_to_detect):
    each row's detected one (detect_language) goes after the start token, the prompt (B, 2 + len(decoder_prompt))."""
    cfg = model.config
    if max_len is not None:
        check_int("max_new_tokens", max_len)
    if isinstance(model, Transformer):
        check_source = getattr(model, "check_source", None)  # a SpeechTransformer's: input features, not ids
        if check_source is not None:
            src_ids = check_source(src_ids)
        else:
            src_ids = check_ids("src_ids", src_ids, cfg.src_vocab_size, cfg.position_limit)
        start = cfg.bos_id if start_id is None else start_id
        if start is None:
            raise ValueError(
                "decoding a Transformer starts from config.bos_id (the decoder start token), which is None"
            )
        prompt = np.tile(np.array([start, *decoder_prompt], dtype=np.int64), (src_ids.shape[0], 1))  # (B, T_p)
        if languages:  # Whisper: each row's language token, detected, after the start token
            prompt = np.insert(prompt, 1, detect_language(model, src_ids, start, languages), axis=1)  # (B, T_p + 1)
    else:
        prompt = check_ids("src_ids", src_ids, cfg.tgt_vocab_size, cfg.position_limit).astype(
            np.int64
        )  # (B, T_p), any ids
        src_ids = None
    max_len = decoding_length(max_len, prompt.shape[1], cfg.position_limit, isinstance(model, TransformerLM))
    return src_ids, prompt, max_len
