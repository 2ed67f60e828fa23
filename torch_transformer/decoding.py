"""Greedy search, sampling, beam search and beam sampling behind one generate(), for `Transformer` and
`TransformerLM`, with a key/value cache.

    tokens = generate(model, src_ids, max_new_tokens=20)                      # (B, 1 + steps), the start token first
    tokens = generate(lm, prompt, max_new_tokens=20, num_beams=4)             # beam search
    tokens = generate(lm, prompt, do_sample=True, top_p=0.9, rng=torch.Generator().manual_seed(0))
    tokens = generate(lm, prompt, GenerationConfig(max_new_tokens=20), top_k=5)   # an argument over the config

The same generate(), arguments and rules as `numpy_transformer.decoding` (see its docstring and the
beam-search notes below), under the same names, written with PyTorch's own ops; the bookkeeping that is not math
(fill ids, forced tokens, finished hypotheses, argument checks) is one shared module, transformer_spec.generation.
`src_ids` is the source (B, S) or, for the LM, the prompt (B, T_p); the result is a long tensor on src_ids' device.

The cache (use_cache=True) lives in attention, as transformers' past_key_values does: a step is the model's own
decoder on the new positions, and each self-attention writes their keys and values into its KVCache's
preallocated (N, H_kv, T_max, Dh) buffers and attends over everything written so far, at the positions the
score rules read (causal, a sliding window, ALiBi, T5's bias). Cross-attention keys and values are projected once,
at the first step, into a MemoryCache. use_cache=False calls model(...) on the whole prefix at every step.

compiled=True runs each cached step through `torch.compile(decoder_step, dynamic=True)`: the step is one
graph (no breaks, no host-device synchronisation), and with dynamic shapes a search needs a few of them
(the step at position 0, the later steps, one more when the number of rows changes), not one per step.
The search loop around it stays Python: greedy search reads `done.all()` once per step to stop early and
beam search ranks hypotheses on the host, both on purpose (a host decision per generated token is what
ends the loop).

Shape letters: B batch, K beam size, N rows decoded side by side (B or B*K), S source length, T_p prompt
length (1 for the Transformer), T_new positions in one step, T_max positions cached, D, H, Dh, V.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

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
from .model import Transformer, TransformerLM, check_attention_mask, check_ids
from .model import source_mask as model_source_mask

Model = Transformer | TransformerLM  # the models that decode

# ----------------------------------------------------------------------------------------------
# The cache: per decoder layer a KVCache (self-attention) and a MemoryCache (cross-attention), which attention
# itself reads and extends; a step is the decoder's forward on the new positions.


@dataclass
class DecoderCache:
    layers: list  # per decoder layer: (KVCache, MemoryCache or None)
    memory: Tensor | None  # (N, S, D) the encoder's output, one copy per row; None in the LM
    memory_mask: Tensor | None  # (N, 1, 1, S) source padding, True = may attend; None in the LM or without pad_id
    length: int = 0  # positions cached so far


def new_cache(model: Model, src_ids: Tensor | None, n_rows: int, total_len: int, src_mask=None) -> DecoderCache:
    """An empty cache of n_rows rows and total_len positions; for a Transformer, source b serves rows
    b * K .. b * K + K - 1 (K = n_rows // B), and the encoder runs here (src_mask (B, S): the real source tokens,
    or None: those not holding pad_id). It holds the config's K/V heads (n_kv_heads), not one per query head."""
    c = model.config
    weight = model.decoder.token_table()
    memory, memory_mask = None, None
    if src_ids is not None and isinstance(model, Transformer):
        copies = n_rows // src_ids.shape[0]
        encode_source = getattr(model, "encode_source", None)  # a SpeechTransformer's: its audio encoder, no mask
        if encode_source is not None:
            memory, source_mask = encode_source(src_ids, src_mask)  # (B, S, D), None
        else:
            memory = model.encode(src_ids, attention_mask=src_mask)  # (B, S, D)
            source_mask = model_source_mask(src_ids, src_mask, c.pad_id)  # (B, 1, 1, S), or None: nothing masked
        memory = memory.repeat_interleave(copies, dim=0)  # (N, S, D)
        if source_mask is not None:
            memory_mask = source_mask.repeat_interleave(copies, dim=0)  # (N, 1, 1, S)
    layers = [
        (
            KVCache(n_rows, c.kv_heads, total_len, c.d_head, weight, c.layer_window(i))  # the layer's window
            if c.kv_lora_rank is None
            else LatentCache(n_rows, total_len, c.kv_lora_rank, c.rope_dim, weight),  # MLA: the latent
            None if memory is None else MemoryCache(),
        )
        for i in range(len(model.decoder.layers))
    ]
    return DecoderCache(layers, memory, memory_mask)


def decoder_step(model: Model, cache: DecoderCache, new_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """new_ids (N, T_new) at positions cache.length .. -> logits of the last one, (N, V); extends the cache.
    attention_mask (N, cache.length + T_new): the real tokens of a left-padded prompt and after, or None."""
    x = model.decoder(
        new_ids, cache.memory, cache.memory_mask, caches=cache.layers, start=cache.length, attention_mask=attention_mask
    )
    cache.length += new_ids.shape[1]
    return model.output_logits(x[:, -1])  # (N, V): only the last position predicts


def reorder_cache(cache: DecoderCache, rows: Tensor) -> None:
    """Row n continues row rows[n]'s hypothesis. Cross-attention caches stay: rows[n] is a beam of the same source."""
    for self_cache, _ in cache.layers:
        self_cache.reorder(rows)


_compiled_step = None


def compiled_decoder_step():
    """`decoder_step` under torch.compile with dynamic shapes, built once per process. Not fullgraph: after
    torch._dynamo's recompile limit (many different models in one process) it falls back to eager instead
    of failing; parity_tests/test_compile.py checks with fullgraph=True that the step is one graph."""
    global _compiled_step
    if _compiled_step is None:
        _compiled_step = torch.compile(decoder_step, dynamic=True)
    return _compiled_step


class Incremental:
    """use_cache=True: each step runs only the positions not yet cached (compiled: see `compiled_decoder_step`)."""

    def __init__(
        self, model: Model, src_ids, n_rows: int, total_len: int, compiled: bool = False, mask=None, src_mask=None
    ):
        self.model = model
        self.fresh_cache = lambda: new_cache(model, src_ids, n_rows, total_len, src_mask)
        self.cache = self.fresh_cache()
        self.step = compiled_decoder_step() if compiled else decoder_step
        self.mask = mask  # (N, T_max) the real tokens, or None

    def next_logits(self, tokens: Tensor) -> Tensor:
        """tokens (N, T), the whole prefix -> logits (N, V) of the next token. A cache its RoPE outgrows (LongRoPE
        past the original length, config.cache_outgrown) is made again from the whole prefix, as Phi-3's generate()."""
        if self.model.config.cache_outgrown(self.cache.length, tokens.shape[1]):
            self.cache = self.fresh_cache()
        new = tokens[:, self.cache.length :]
        if self.mask is None:
            return self.step(self.model, self.cache, new)
        return self.step(self.model, self.cache, new, self.mask[:, : tokens.shape[1]])

    def reorder(self, rows: Tensor) -> None:
        reorder_cache(self.cache, rows)


class Recompute:
    """use_cache=False: the model's forward on the whole prefix, last position."""

    def __init__(self, model: Model, src_ids: Tensor | None, copies: int, mask=None, src_mask=None):
        self.model = model
        self.src_ids = None if src_ids is None else src_ids.repeat_interleave(copies, dim=0)  # (N, S)
        self.src_mask = None if src_mask is None else src_mask.repeat_interleave(copies, dim=0)  # (N, S) or None
        self.mask = mask  # (N, T_max) the real tokens, or None

    def next_logits(self, tokens: Tensor) -> Tensor:
        if self.src_ids is None:
            mask = None if self.mask is None else self.mask[:, : tokens.shape[1]]
            logits = self.model(tokens, attention_mask=mask)
        else:
            logits = self.model(self.src_ids, tokens, attention_mask=self.src_mask)
        return logits[:, -1]  # (N, V)

    def reorder(self, rows: Tensor) -> None:
        pass  # the caller reorders the prefix; the beams of one source share src_ids


def start_decoding(
    model: Model,
    src_ids: Tensor,
    max_len: int | None,
    n_copies: int,
    use_cache: bool,
    attention_mask: Tensor | None = None,
    compiled: bool = False,
    start_id: int | None = None,
    decoder_prompt: tuple = (),
    languages: tuple = (),
) -> tuple[Tensor, int, Incremental | Recompute]:
    """Check the arguments; return the prompt (B, T_p), max_len and the source of next-token logits for
    N = B * n_copies rows. attention_mask: a left-padded prompt's real tokens (B, T_p) (the LM's; every generated
    token is real, and the beams of one prompt share its mask, so reordering them leaves it as it is), or a
    Transformer's source's (B, S), or None. compiled: the cached step under torch.compile (needs use_cache).
    start_id: a Transformer's first decoder token (None: config.bos_id); decoder_prompt: the ids after it; languages:
    Whisper's language ids to detect among (check_decoding_inputs)."""
    source, prompt, max_len = check_decoding_inputs(model, src_ids, max_len, start_id, decoder_prompt, languages)
    mask, src_mask = None, None
    if isinstance(model, Transformer):
        src_mask = check_attention_mask(attention_mask, src_ids)  # (B, S), or None
    elif (given := check_attention_mask(attention_mask, prompt)) is not None:  # (B, T_p)
        mask = torch.ones(prompt.shape[0] * n_copies, prompt.shape[1] + max_len, dtype=torch.bool, device=prompt.device)
        mask[:, : prompt.shape[1]] = given.repeat_interleave(n_copies, dim=0)  # (N, T_max)
    if compiled and not use_cache:
        raise ValueError(
            "compiled=True compiles the cached decoding step: it needs use_cache=True "
            "(without the cache, torch.compile the model itself)"
        )
    if use_cache:
        n_rows, total = prompt.shape[0] * n_copies, prompt.shape[1] + max_len
        return prompt, max_len, Incremental(model, source, n_rows, total, compiled, mask, src_mask)
    return prompt, max_len, Recompute(model, source, n_copies, mask, src_mask)


def allowed_scores(scores: Tensor, model: Model, rules: GenerationRules, step: Step) -> Tensor:
    """scores (N, V) after the logits processors, in transformers' order (see numpy_transformer.decoding): a model
    of our own first bans pad (without_pad); then repetition_penalty, no_repeat_ngram, bad_words, min_length, the
    forced tokens. ValueError when a row is left no token."""
    if model.generation_rules is None:
        scores = without_pad(scores, model.config.pad_id)
    scores = process_scores(lp, scores, rules, step, end_ids(rules, model.config))
    check_something_allowed(scores, step.tokens.shape[1])
    return scores


def warped_probabilities(scores: Tensor, rules: GenerationRules, min_tokens_to_keep: int = 1) -> Tensor:
    """Sampling's distribution (N, V): temperature, top_k, top_p, min_p (each when it changes something), softmax."""
    return sampling_probabilities(lp, scores, rules, min_tokens_to_keep)


def penalty_start(model: Model, attention_mask: Tensor | None, n_copies: int) -> Tensor | None:
    """The first real token of a decoder-only prompt's attention_mask, per row (N,); None: count every position."""
    if attention_mask is None or isinstance(model, Transformer):
        return None
    return (attention_mask != 0).int().argmax(dim=1).repeat_interleave(n_copies)


def check_something_allowed(scores: Tensor, position: int) -> None:
    """ValueError when the rules leave a row (N, V) no token: argmax would pick a banned one, a beam nothing."""
    empty = torch.isneginf(scores).all(dim=-1)  # (N,)
    check_rows_left_a_token(torch.nonzero(empty).flatten().tolist(), position)


def without_pad(scores: Tensor, pad_id: int | None) -> Tensor:
    """scores (N, V) with pad_id at -inf: a model of our own never generates pad (in the output it means "after
    eos"). Unchanged when there is no pad_id."""
    if pad_id is None:
        return scores
    return scores.index_fill(-1, torch.tensor([pad_id], device=scores.device), float("-inf"))


def is_eos(tokens: Tensor, eos: tuple) -> Tensor:
    """Which tokens end a sequence: any of `eos` (end_ids: the caller's eos_token_id, else config.eos_ids); none
    when it is empty."""
    return torch.isin(tokens, tokens.new_tensor(eos, dtype=torch.long))


# ----------------------------------------------------------------------------------------------
# The one way in: generate(), which picks one of the four searches below.


def generate(
    model: Model,
    src_ids: Tensor,
    generation_config: GenerationConfig | None = None,
    *,
    attention_mask: Tensor | None = None,
    rng: torch.Generator | int | None = None,
    use_cache: bool = True,
    compiled: bool = False,
    streamer=None,
    tokenizer=None,
    return_dict_in_generate: bool = False,
    **kwargs,
):
    """As transformers' generate(): the checkpoint's generation_config.json, generation_config's set fields over it,
    the keyword arguments over both (numpy_transformer.decoding.generate has the full description; the same
    arguments). do_sample and num_beams pick the search here, and nowhere else (SEARCHES). rng: a torch.Generator
    (on the model's device), an int seed, or None (torch's global generator, as generate() uses:
    torch.manual_seed(s) then generate reproduces transformers' draws). compiled: run the cached step through
    torch.compile (see the module docstring). Returns long ids (B, T_p + steps) on src_ids' device, or with
    return_dict_in_generate a GenerateOutput."""
    T_p = 1 if isinstance(model, Transformer) else src_ids.shape[-1]
    plan = generate_plan(model_rules(model), generation_config, kwargs, T_p, model.config, tokenizer)
    if plan.strategy in ("beam", "beam_sample"):
        check_no_streamer(streamer)
    generator = as_generator(rng, src_ids) if plan.strategy in ("sample", "beam_sample") else None
    options = Options(use_cache, compiled, attention_mask, generator, streamer, plan.stop)
    out = SEARCHES[plan.strategy](model, src_ids, plan.max_len, plan.rules, options)
    return out if return_dict_in_generate else out.sequences


@dataclass
class Options:
    """How a search runs besides its rules: use_cache, compiled, the attention mask, the random generator
    (sampling's: a torch.Generator, or True for the global one; None otherwise), the streamer and the stop strings
    (StopStrings or None)."""

    use_cache: bool = True
    compiled: bool = False
    attention_mask: Tensor | None = None
    rng: torch.Generator | bool | None = None
    streamer: Callable | None = None
    stop: StopStrings | None = None


def as_generator(rng, src_ids) -> torch.Generator | bool:
    """rng as a torch.Generator (an int seeds a new one on src_ids' device); True for None: the global one."""
    if rng is None:
        return True
    if isinstance(rng, int) and not isinstance(rng, bool):
        device = src_ids.device if isinstance(src_ids, Tensor) else "cpu"
        return torch.Generator(device=device).manual_seed(rng)
    if not isinstance(rng, torch.Generator):
        raise TypeError(f"rng must be a torch.Generator, an int seed or None, got {type(rng).__name__}")
    return rng


def model_rules(model) -> GenerationRules | None:
    """The model's generation rules (None for a model of our own), after checking it decodes."""
    check_model(model)
    return model.generation_rules


# ----------------------------------------------------------------------------------------------
# Greedy search and sampling (numpy_transformer.decoding has the rules).


def _greedy_search(model: Model, src_ids: Tensor, max_len: int, rules: GenerationRules, options: Options):
    """generate(do_sample=False, num_beams=1): the first maximum of the allowed scores."""
    return _token_by_token(model, src_ids, max_len, rules, options, lambda scores: scores.argmax(dim=-1))


def _sample(model: Model, src_ids: Tensor, max_len: int, rules: GenerationRules, options: Options):
    """generate(do_sample=True, num_beams=1): torch.multinomial from softmax of the warped scores."""
    generator = options.rng if isinstance(options.rng, torch.Generator) else None  # True: the global one

    def choose(scores: Tensor) -> Tensor:
        return torch.multinomial(warped_probabilities(scores, rules), 1, generator=generator)[:, 0]

    return _token_by_token(model, src_ids, max_len, rules, options, choose)


def _token_by_token(
    model: Model, src_ids: Tensor, max_len: int, rules: GenerationRules, options: Options, choose
) -> GenerateOutput:
    """Greedy search or sampling (`choose`: allowed scores (B, V) -> tokens (B,)), with the logits each step chose
    from, (B, steps, V)."""
    attention_mask = options.attention_mask
    with evaluating(model):
        prompt, max_len, decoder = start_decoding(
            model, src_ids, max_len, 1, options.use_cache, attention_mask, options.compiled, rules.start_id,
            rules.decoder_prompt, languages_to_detect(rules),
        )  # fmt: skip
        cfg = model.config
        eos = end_ids(rules, cfg)
        B, T_p = prompt.shape
        fill = after_eos(rules, cfg)
        start = penalty_start(model, attention_mask, 1)
        tokens = prompt.new_full((B, T_p + max_len), fill)
        tokens[:, :T_p] = prompt
        done = torch.zeros(B, dtype=torch.bool, device=prompt.device)  # the row has produced eos_id (or a stop string)
        step_logits = []
        for t in range(T_p, T_p + max_len):
            logits = decoder.next_logits(tokens[:, :t])  # (B, V)
            step_logits.append(logits)
            scores = allowed_scores(logits, model, rules, Step(tokens[:, :t], T_p, start, t == T_p + max_len - 1))
            tokens[:, t] = choose(scores).masked_fill(done, fill)
            if options.streamer is not None:
                options.streamer(tokens[:, t].clone())
            done |= is_eos(tokens[:, t], eos)
            if options.stop is not None:
                done |= torch.tensor(options.stop.hits(tokens[:, : t + 1].tolist()), device=done.device)
            if bool(done.all()):
                break
    return GenerateOutput(tokens[:, : t + 1], logits=torch.stack(step_logits, dim=1))


# ----------------------------------------------------------------------------------------------
# Beam search (rules and notes: numpy_transformer.decoding).


def best_candidates(cumulative: Tensor, log_probs: Tensor, n_best: int) -> tuple[Tensor, Tensor, Tensor]:
    """cumulative (B, K), log_probs (B, K, V) -> the n_best continuations of every element, best first:
    (score, beam, token), each (B, n_best). Ties: lower beam, then lower token id (a stable sort)."""
    B, K, V = log_probs.shape
    scores = (cumulative[:, :, None] + log_probs).reshape(B, K * V)  # flat index beam * V + token
    top, order = torch.sort(scores, dim=1, descending=True, stable=True)
    order = order[:, :n_best]  # (B, n_best)
    return top[:, :n_best], order // V, order % V


def sampled_candidates(
    cumulative: Tensor, log_probs: Tensor, n_best: int, rng: torch.Generator | bool
) -> tuple[Tensor, Tensor, Tensor]:
    """Beam-search sampling's candidates, as generate(do_sample=True, num_beams=K) draws them: n_best of the K*V
    continuations of every element drawn with torch.multinomial (without replacement) from softmax of their
    scores (cumulative (B, K) plus the warped log_probs (B, K, V)), then sorted by score, best first, with
    torch.sort as generate() sorts them. rng: a torch.Generator, or True: the global one. As best_candidates."""
    B, K, V = log_probs.shape
    scores = (cumulative[:, :, None] + log_probs).reshape(B, K * V)  # flat index beam * V + token
    generator = rng if isinstance(rng, torch.Generator) else None
    drawn = torch.multinomial(torch.softmax(scores, dim=-1), n_best, generator=generator)  # (B, n_best)
    top, order = scores.gather(1, drawn).sort(dim=-1, descending=True)
    flat = drawn.gather(1, order)
    return top, flat // V, flat % V


def _beam_search(model: Model, src_ids: Tensor, max_len: int, rules: GenerationRules, options: Options):
    """generate(num_beams=K): the K most likely hypotheses kept at every step."""
    return _beams(model, src_ids, max_len, rules, options, rng=None)


def _beam_sample(model: Model, src_ids: Tensor, max_len: int, rules: GenerationRules, options: Options):
    """generate(do_sample=True, num_beams=K): the warpers on the processed log-probabilities and the candidates
    drawn (sampled_candidates)."""
    return _beams(model, src_ids, max_len, rules, options, rng=options.rng)


def _beams(
    model: Model, src_ids: Tensor, max_len: int, rules: GenerationRules, options: Options, rng
) -> GenerateOutput:
    """Beam search (rng None) or beam sampling (rng a torch.Generator, or True: the global one) under `rules`: the
    ids (B, T_p + L) and each element's best normalised score."""
    beam_size, length_penalty, early_stopping = rules.num_beams, rules.length_penalty, rules.early_stopping
    check_beam_arguments(beam_size, length_penalty, early_stopping)
    use_cache, compiled, attention_mask = options.use_cache, options.compiled, options.attention_mask
    with evaluating(model):
        K = beam_size
        prompt, max_len, decoder = start_decoding(
            model, src_ids, max_len, K, use_cache, attention_mask, compiled, rules.start_id, rules.decoder_prompt,
            languages_to_detect(rules),
        )  # fmt: skip
        cfg = model.config
        eos = end_ids(rules, cfg)
        B, T_p = prompt.shape
        fill = beam_fill(rules, cfg)
        tokens = prompt.new_full((B * K, T_p + max_len), fill)
        tokens[:, :T_p] = prompt.repeat_interleave(K, dim=0)  # (B*K, T_p)
        dtype = model.decoder.token_table().dtype
        cumulative = torch.full((B, K), float("-inf"), dtype=dtype, device=prompt.device)
        cumulative[:, 0] = 0.0  # the K beams start as copies of one prompt: only beam 0 may be extended at first
        n_best = max(2, 1 + len(eos)) * K  # each beam may end with every eos id: K of these are not eos
        finished: list[list] = [[] for _ in range(B)]  # per element: (normalised score, generated tokens), in order
        stopped = [False] * B  # the element takes no more finished hypotheses
        start = penalty_start(model, attention_mask, K)
        for step in range(max_len):
            t = T_p + step
            log_probs = F.log_softmax(decoder.next_logits(tokens[:, :t]), dim=-1)  # (N, V)
            log_probs = allowed_scores(log_probs, model, rules, Step(tokens[:, :t], T_p, start, step == max_len - 1))
            if rng is None:
                score, beam, token = best_candidates(cumulative, log_probs.view(B, K, -1), n_best)  # (B, n_best)
            else:
                log_probs = warped_scores(lp, log_probs, rules, beam_sample_keep(eos)).view(B, K, -1)  # (B, K, V)
                score, beam, token = sampled_candidates(cumulative, log_probs, n_best, rng)  # (B, n_best) each
            rows = torch.arange(B, device=prompt.device)[:, None] * K + beam  # (B, n_best): the row each continues
            hits = is_eos(
                token, eos
            )  # (B, n_best): the candidates that end a hypothesis (an end token or a stop string)
            if options.stop is not None:
                window = tokens[rows.flatten(), max(0, t + 1 - options.stop.window) : t]  # (B * n_best, <= w - 1)
                row_texts = torch.cat([window, token.reshape(-1, 1)], dim=1).tolist()
                hits |= torch.tensor(options.stop.hits(row_texts), device=hits.device).view(hits.shape)
            ends = hits[:, :K]  # (B, K): the first K ranks that end a hypothesis
            if step == max_len - 1:
                ends = torch.ones_like(ends)  # the last step: every one of the first K ranks ends, eos or not
            candidates = score.tolist(), rows.tolist(), token.tolist(), ends.tolist()  # (B, n_best) or (B, K) each
            collect_finished(finished, stopped, *candidates, tokens[:, T_p:t].tolist(), step + 1, length_penalty)
            if step == max_len - 1 or bool(hits.all()):  # hits.all(): no candidate of any element goes on
                break
            # The first K candidates that do not end, in rank order (a stable sort puts False first); fewer may be
            # left with stop strings: ended ones then go on too, penalised by HIT_PENALTY as generate() does.
            live = torch.sort(hits.to(torch.uint8), dim=1, stable=True).indices[:, :K]  # (B, K) ranks
            cumulative = (score + hits * HIT_PENALTY).gather(1, live)  # (B, K), best first
            parents = rows.gather(1, live).flatten()  # (N,)
            tokens = tokens[parents]  # each row takes its parent's prefix ...
            tokens[:, t] = token.gather(1, live).flatten()  # ... and its new token
            decoder.reorder(parents)
            best_live = cumulative[:, 0].tolist()
            update_stopped(stopped, finished, best_live, step + 1, max_len, length_penalty, K, early_stopping)
            if all(stopped):
                break
    sequences, scores = best_hypotheses(prompt, finished, fill)
    return GenerateOutput(sequences, sequences_scores=scores)


SEARCHES = {"greedy": _greedy_search, "sample": _sample, "beam": _beam_search, "beam_sample": _beam_sample}


def best_hypotheses(prompt: Tensor, finished: list[list], fill_id: int) -> tuple[Tensor, list[float]]:
    """The prompt followed by each element's best finished hypothesis, padded with fill_id to the longest:
    ids (B, T_p + L), and the scores."""
    B, T_p = prompt.shape
    best = best_finished(finished)
    out = prompt.new_full((B, T_p + max(len(h) for _, h in best)), fill_id)
    out[:, :T_p] = prompt
    for b, (_, hypothesis) in enumerate(best):
        out[b, T_p : T_p + len(hypothesis)] = torch.tensor(hypothesis, dtype=out.dtype)
    return out, [score for score, _ in best]


# ----------------------------------------------------------------------------------------------
# Arguments and modes.


def check_model(model) -> None:
    if not isinstance(model, (Transformer, TransformerLM)):
        raise TypeError(f"model must be a torch_transformer Transformer or TransformerLM, got {type(model).__name__}")


@contextlib.contextmanager
def evaluating(model: nn.Module):
    """Eval mode and no autograd for the duration; afterwards every submodule's own mode is restored."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        for module, mode in modes:
            module.training = mode


def detect_language(model: Model, source: Tensor, start: int, languages: tuple) -> Tensor:
    """Whisper's language detection (transformers' detect_language): the decoder reads the start token alone; each
    row's language is the id among `languages` (ascending) with the largest next-token logit (the lowest on a tie).
    source: the encoder's input (B, ...). Returns ids (B,)."""
    ids = torch.tensor(languages, dtype=torch.long, device=source.device)  # (L,)
    first = torch.full((source.shape[0], 1), start, dtype=torch.long, device=source.device)  # (B, 1)
    with torch.no_grad():
        logits = model(source, first)[:, -1]  # (B, V)
    return ids[logits[:, ids].argmax(dim=-1)]  # (B,)


def check_decoding_inputs(
    model: Model,
    src_ids: Tensor,
    max_len: int | None,
    start_id: int | None = None,
    decoder_prompt: tuple = (),
    languages: tuple = (),
) -> tuple[Tensor | None, Tensor, int]:
    """Validate as the model's forward does. Returns src_ids (B, S) (None for the LM), the prompt (B, T_p) and
    max_len (None becomes the most that fits in config.max_len positions). start_id: a Transformer's first decoder
    token (the caller's decoder_start_token_id); None: config.bos_id. decoder_prompt: the ids a Transformer's decoder
    reads after it (GenerationRules.decoder_prompt): the prompt is (B, 1 + len(decoder_prompt)). languages: Whisper's
    language token ids when the language is to be detected (generation.languages_to_detect): each row's detected one
    (detect_language) goes after the start token."""
    cfg = model.config
    if max_len is not None:
        check_int("max_new_tokens", max_len)
    source: Tensor | None = None
    if isinstance(model, Transformer):
        check_source = getattr(model, "check_source", None)  # a SpeechTransformer's: input features, not ids
        if check_source is not None:
            check_source(src_ids)
        else:
            check_ids("src_ids", src_ids, cfg.src_vocab_size, cfg.position_limit)
        start = cfg.bos_id if start_id is None else start_id
        if start is None:
            raise ValueError(
                "decoding a Transformer starts from config.bos_id (the decoder start token), which is None"
            )
        source = src_ids
        first = torch.tensor([start, *decoder_prompt], dtype=torch.long, device=src_ids.device)
        prompt = first.expand(src_ids.shape[0], -1).clone()  # (B, T_p)
        if languages:  # Whisper: each row's language token, detected, after the start token
            detected = detect_language(model, src_ids, start, languages)  # (B,)
            prompt = torch.cat([prompt[:, :1], detected[:, None], prompt[:, 1:]], dim=1)  # (B, T_p + 1)
    else:
        check_ids("src_ids", src_ids, cfg.tgt_vocab_size, cfg.position_limit)
        prompt = src_ids.long()  # (B, T_p): any ids, as given
    max_len = decoding_length(max_len, prompt.shape[1], cfg.position_limit, isinstance(model, TransformerLM))
    return source, prompt, max_len
