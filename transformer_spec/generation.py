"""Decoding's bookkeeping, shared by numpy_transformer.decoding and torch_transformer.decoding: no math, plain ints,
floats and lists. Each side computes its scores with its own library and hands this module what it found.

- which ids fill a row after its end token (`after_eos`, greedy search) and a short hypothesis (`beam_fill`);
- which token a checkpoint's rules force at a step (`forced_token`), and the error when a row is left no token;
- beam search's finished hypotheses: which are collected (`collect_finished`), when an element stops taking them
  (`cannot_improve`, `update_stopped`), and which one wins (`best_finished`);
- the arguments' checks (`check_int`, `check_beam_arguments`, `decoding_length`);
- a checkpoint's generation_config.json: which settings decoding applies, which cannot change the tokens, and which
  it does not apply (`generation_settings`, warned about by name), and the caller's settings over the checkpoint's
  (`decoding_rules`, `generate_strategy`, `new_tokens`);
- generate()'s one way in: `GenerationConfig` (every setting, typed and frozen, transformers' names), `generate_plan`
  (the checkpoint's rules, the config's set fields over them, the arguments over both; which search; stop strings)
  and `GenerateOutput` (return_dict_in_generate).

The rules are transformers' generate()'s; numpy_transformer/decoding.py states them in full above _beam_search.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import warnings
from dataclasses import dataclass
from typing import Any

from .config import GenerationRules, TransformerConfig
from .stop_strings import StopStrings

# A finished hypothesis: its normalised score and its generated tokens (the end token included).
Hypothesis = tuple[float, list]
# Beam search: what a candidate that ended (an end token, a stop string) adds to its score when it is still among
# the K that go on (fewer than K of the candidates did not end: only stop strings can do that), as generate() adds it.
HIT_PENALTY = -1.0e9


# ----------------------------------------------------------------------------------------------
# Fill ids and forced tokens.


def default_fill(config: TransformerConfig) -> int:
    """pad_id, or the (first) eos_id itself when there is no padding token (as transformers' generate does). Without
    an eos_id no row ends early, and the fill is never seen."""
    if config.pad_id is not None:
        return config.pad_id
    return config.eos_ids[0] if config.eos_ids else 0


def after_eos(rules: GenerationRules | None, config: TransformerConfig) -> int:
    """The id that fills a row after its eos_id in greedy search: the checkpoint's rules' fill_id (generate()'s
    pad_token_id, else its first eos_token_id), or for a model of our own (rules None) default_fill."""
    if rules is not None and rules.fill_id is not None:
        return rules.fill_id
    return default_fill(config)


def beam_fill(rules: GenerationRules | None, config: TransformerConfig) -> int:
    """The id that pads a finished hypothesis shorter than the best in beam search: the checkpoint's (generate()'s
    `pad_token_id or eos_token_id`: eos for T5, whose pad id is 0), or for a model of our own default_fill."""
    if rules is not None and rules.beam_fill_id is not None:
        return rules.beam_fill_id
    return default_fill(config)


def end_ids(rules: GenerationRules | None, config: TransformerConfig) -> tuple:
    """The end tokens a decoding call stops at (and min_length bans): the caller's eos_token_id, else the config's
    eos_ids (a loaded checkpoint's: its generation_config.json's)."""
    if rules is not None and rules.eos_ids is not None:
        return rules.eos_ids
    return config.eos_ids


def forced_token(rules: GenerationRules, position: int, last_step: bool) -> int | tuple | None:
    """The token the rules force at `position` (the length of the rows so far): forced_bos_id at position 1,
    forced_eos_id (an id or a tuple of ids, all left possible) at the last step (it wins when both apply); None:
    none."""
    forced: int | tuple | None = rules.forced_bos_id if position == 1 else None
    if last_step and rules.forced_eos_id is not None:
        forced = rules.forced_eos_id
    return forced


def check_rows_left_a_token(empty_rows: list[int], position: int) -> None:
    """ValueError when the rules leave rows `empty_rows` no token at all: argmax would pick one of the banned ones,
    and a beam would have no continuation."""
    if empty_rows:
        raise ValueError(
            f"decoding: every token is banned at position {position} for rows {empty_rows} "
            "(pad_id and the checkpoint's bad_words_ids cover the whole vocabulary): nothing may be generated"
        )


# ----------------------------------------------------------------------------------------------
# Beam search's finished hypotheses.


def collect_finished(
    finished: list[list[Hypothesis]],
    stopped: list[bool],
    score: list[list[float]],
    rows: list[list[int]],
    token: list[list[int]],
    ends: list[list[bool]],
    generated: list[list[int]],
    length: int,
    length_penalty: float,
) -> None:
    """Move the hypotheses that end at this step (`ends` (B, K), among the first K ranks) into `finished`, for the
    elements not `stopped`, with the normalised score sum of log-probs / length ** length_penalty. score, rows and
    token (B, n_best): the ranked candidates; generated (N, length - 1): the tokens each row generated so far. A
    score of -inf comes from a beam that never was (a vocabulary smaller than the beam) and is skipped."""
    for b, flags in enumerate(ends):
        if stopped[b]:
            continue
        for r, ended in enumerate(flags):
            if ended and math.isfinite(score[b][r]):
                hypothesis = generated[rows[b][r]] + [token[b][r]]
                finished[b].append((score[b][r] / length**length_penalty, hypothesis))


def cannot_improve(
    found: list[Hypothesis],
    best_live: float,
    length: int,
    max_len: int,
    length_penalty: float,
    K: int,
    early_stopping: bool | str,
) -> bool:
    """Whether an element stops taking finished hypotheses: it has K of them, and (early_stopping False) its best
    live hypothesis, of cumulative log-probability best_live after `length` tokens, scored at its current length
    (at max_len for "never" with length_penalty > 0, the exact bound) cannot beat the worst of the best K."""
    if len(found) < K:
        return False  # fewer than K: it takes more
    if early_stopping is True:
        return True
    worst_of_best = sorted(score for score, _ in found)[-K]
    at = max_len if early_stopping == "never" and length_penalty > 0 else length
    return best_live / at**length_penalty <= worst_of_best


def update_stopped(
    stopped: list[bool],
    finished: list[list[Hypothesis]],
    best_live: list[float],
    length: int,
    max_len: int,
    length_penalty: float,
    K: int,
    early_stopping: bool | str,
) -> None:
    """Mark the elements that stop taking finished hypotheses (cannot_improve); a stopped element stays stopped."""
    for b, found in enumerate(finished):
        stopped[b] = stopped[b] or cannot_improve(
            found, best_live[b], length, max_len, length_penalty, K, early_stopping
        )


def best_finished(finished: list[list[Hypothesis]]) -> list[Hypothesis]:
    """Each element's finished hypothesis with the best normalised score, the earliest found among equals."""
    return [max(found, key=lambda c: c[0]) for found in finished]  # max keeps the first of equal scores


# ----------------------------------------------------------------------------------------------
# Arguments.


def check_int(name: str, value) -> None:
    """TypeError unless value is an int (a NumPy integer too; not a bool); ValueError unless it is >= 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def check_beam_arguments(num_beams, length_penalty, early_stopping) -> None:
    """num_beams an int >= 1, length_penalty a finite float, early_stopping True, False or "never"."""
    check_int("num_beams", num_beams)
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)):
        raise TypeError(f"length_penalty must be a float, got {type(length_penalty).__name__} ({length_penalty!r})")
    if not math.isfinite(length_penalty):
        raise ValueError(f"length_penalty must be finite, got {length_penalty}")
    if early_stopping not in (True, False, "never"):
        raise ValueError(f"early_stopping must be True, False or 'never' (as in transformers), got {early_stopping!r}")


def decoding_length(max_len: int | None, T_p: int, limit: int, lm: bool) -> int:
    """The tokens to generate after a prompt of T_p positions (bos for an encoder-decoder): max_len, or None for as
    many as `limit` (config.max_len) positions allow. ValueError when they do not fit in `limit`."""
    if max_len is not None:
        check_int("max_new_tokens", max_len)
    else:
        max_len = max(limit - T_p, 1)  # a full table still gets the error below
    if T_p + max_len > limit:
        taken = f"the {T_p}-token prompt" if lm else "bos"
        raise ValueError(
            f"max_new_tokens={max_len} generated tokens after {taken} need {T_p + max_len} positions, more than "
            f"config.max_len={limit}: max_new_tokens must be at most {limit - T_p}"
        )
    return max_len


# ----------------------------------------------------------------------------------------------
# generation_config.json's settings (transformers 5's names) and the caller's.

# Read into GenerationRules and applied, with transformers' defaults (a missing key or null: the default). The ids
# (bos, eos, pad, decoder start, forced bos / eos, bad_words_ids) are read with the config (families.core).
APPLIED = {
    "repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_length": 0, "min_new_tokens": None,
    "do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0, "min_p": None,
    "num_beams": 1, "length_penalty": 1.0, "early_stopping": False, "max_length": None, "max_new_tokens": None,
    "suppress_tokens": (), "begin_suppress_tokens": (), "stop_strings": (),
}  # fmt: skip
SUPPRESS = ("suppress_tokens", "begin_suppress_tokens")  # lists of ids: read as tuples
IDS = (
    "bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "forced_bos_token_id",
    "forced_eos_token_id", "bad_words_ids",
)  # fmt: skip
# Never change which tokens come out (outputs asked for, caches, compilation, assisted decoding's own knobs).
INERT = (
    "transformers_version", "_from_model_config", "use_cache", "output_attentions", "output_hidden_states",
    "output_scores", "output_logits", "return_dict_in_generate", "cache_implementation", "cache_config",
    "compile_config", "disable_compile", "max_cache_len", "prefill_chunk_size", "low_memory", "is_assistant",
    "num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
    "assistant_lookbehind", "target_lookbehind", "max_matching_ngram_size", "trust_remote_code",
)  # fmt: skip
# Not applied here; at these values (or null) generate() does not apply them either. Any other value is warned about
# by name when a checkpoint is read, and refused when a caller passes it.
NOT_APPLIED = {
    "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "top_h": None, "encoder_repetition_penalty": 1.0,
    "encoder_no_repeat_ngram_size": 0, "num_beam_groups": 1, "diversity_penalty": 0.0, "num_return_sequences": 1,
    "remove_invalid_values": False, "renormalize_logits": False, "exponential_decay_length_penalty": None,
    "sequence_bias": None, "guidance_scale": 1.0,
    "constraints": None, "force_words_ids": None, "penalty_alpha": None, "dola_layers": None,
    "watermarking_config": None, "max_time": None, "token_healing": False,
    "prompt_lookup_num_tokens": None, "assistant_early_exit": None, "use_mtp": False,
}  # fmt: skip
SAMPLING = ("temperature", "top_k", "top_p", "min_p")
# The token ids generate() takes as arguments (transformers' names), over the checkpoint's: they go to the logits
# processors (bad words, forced tokens, min_length's end tokens), to stopping (eos) and to the fill after an end.
TOKEN_SETTINGS = (
    "bad_words_ids", "forced_bos_token_id", "forced_eos_token_id", "eos_token_id", "pad_token_id",
    "decoder_start_token_id", "suppress_tokens", "begin_suppress_tokens",
)  # fmt: skip
PROCESSORS = ("repetition_penalty", "no_repeat_ngram_size", "min_length", "min_new_tokens") + TOKEN_SETTINGS
BEAM = ("length_penalty", "early_stopping")


def short(value, limit: int = 60) -> str:
    """repr(value), cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def as_floats(settings: dict) -> dict:
    """settings with the float settings given as ints (`"repetition_penalty": 1`) made floats, as transformers
    reads them."""
    floats = ("repetition_penalty", "temperature", "top_p", "min_p", "length_penalty")
    return {
        k: float(v) if k in floats and isinstance(v, int) and not isinstance(v, bool) else v
        for k, v in settings.items()
    }


def generation_settings(generation: dict, where) -> dict:
    """The settings of generation_config.json (or config.json's keys of the same names, transformers' fallback)
    that decoding applies, as GenerationRules fields (numbers as the file has them; a null: the default). Every
    other key that would change generate()'s tokens (one of NOT_APPLIED away from its inert value, or a key this
    library does not know that is not null or false) is named in one UserWarning: decoding here will not do it."""
    settings = as_floats({name: generation[name] for name in APPLIED if generation.get(name) is not None})
    for name in SUPPRESS:
        if name in settings:
            settings[name] = suppressed_ids(name, settings[name], None)
    if "stop_strings" in settings:  # a str or a list of them; an empty list: none
        settings["stop_strings"] = stop_string_tuple(settings["stop_strings"]) if settings["stop_strings"] else ()
    ignored = [
        f"{name}={short(value)}"
        for name, value in generation.items()
        if name not in APPLIED and name not in IDS and name not in INERT
        and value not in (None, False, [], {}) and (name not in NOT_APPLIED or value != NOT_APPLIED[name])
    ]  # fmt: skip
    if ignored:
        warnings.warn(
            f"{where}: settings this library does not apply, so decoding will differ from transformers' "
            f"generate() where they matter: {', '.join(ignored)}",
            UserWarning,
            stacklevel=3,
        )
    return settings


def decoding_rules(
    rules: GenerationRules | None, settings: dict, allowed: tuple, caller: str, config: TransformerConfig | None = None
) -> GenerationRules:
    """The rules a decoding call applies: the checkpoint's (a model of our own: transformers' defaults) with the
    caller's settings over them (a setting None: the checkpoint's; the token ids of TOKEN_SETTINGS under
    transformers' names, checked against config's vocabulary, see token_settings). TypeError naming a setting
    `caller` does not take; ValueError naming a transformers setting this library does not apply."""
    for name in settings:
        if name in allowed:
            continue
        if name in NOT_APPLIED or name in APPLIED:
            where = "not applied by this library" if name in NOT_APPLIED else f"not a setting of {caller}"
            raise ValueError(f"{caller}: {name}={short(settings[name])} is {where} (it takes {', '.join(allowed)})")
        raise TypeError(f"{caller}() got an unexpected keyword argument {name!r} (it takes {', '.join(allowed)})")
    given = as_floats({name: value for name, value in settings.items() if value is not None})
    ids = {name: given.pop(name) for name in TOKEN_SETTINGS if name in given}
    try:
        if ids:
            given |= token_settings(ids, rules, config)
        return dataclasses.replace(rules or GenerationRules(), **given)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{caller}: {error}") from None


def token_settings(ids: dict, rules: GenerationRules | None, config: TransformerConfig | None) -> dict:
    """The caller's token ids (transformers' names: bad_words_ids a list of non-empty lists of ids; forced_bos_token_id
    an id; forced_eos_token_id and eos_token_id an id or a list of ids; pad_token_id an id) as GenerationRules
    fields, each checked against config's vocabulary (TypeError / ValueError naming the argument). A new
    eos_token_id or pad_token_id remakes the fills (remade_fills)."""
    vocab = config.tgt_vocab_size if config is not None else None
    out: dict = {}
    if "bad_words_ids" in ids:
        words = ids["bad_words_ids"]
        if not isinstance(words, (list, tuple)) or not all(isinstance(w, (list, tuple)) and w for w in words):
            raise ValueError(f"bad_words_ids must be a list of non-empty lists of token ids, got {short(words)}")
        out["bad_words"] = tuple(tuple(one_id("bad_words_ids", t, vocab) for t in w) for w in words)
    if "forced_bos_token_id" in ids:
        out["forced_bos_id"] = one_id("forced_bos_token_id", ids["forced_bos_token_id"], vocab)
    if "forced_eos_token_id" in ids:
        forced = id_list("forced_eos_token_id", ids["forced_eos_token_id"], vocab)
        out["forced_eos_id"] = forced[0] if len(forced) == 1 else forced
    if "eos_token_id" in ids:
        out["eos_ids"] = id_list("eos_token_id", ids["eos_token_id"], vocab)
    if "pad_token_id" in ids:
        out["pad_id"] = one_id("pad_token_id", ids["pad_token_id"], vocab)
    out |= {name: suppressed_ids(name, ids[name], vocab) for name in SUPPRESS if name in ids}
    if "decoder_start_token_id" in ids:  # an encoder-decoder's first decoder token (a decoder-only model: unused)
        out["start_id"] = one_id("decoder_start_token_id", ids["decoder_start_token_id"], vocab)
    if "eos_token_id" in ids or "pad_token_id" in ids:
        out |= remade_fills(out, rules, config)
    return out


def one_id(name: str, value, vocab: int | None) -> int:
    """value as a token id: TypeError unless an int (not a bool), ValueError outside the vocabulary."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a token id (an int), got {type(value).__name__} ({short(value)})")
    value = int(value)
    if value < 0 or (vocab is not None and value >= vocab):
        raise ValueError(f"{name}={value} is not a token id of a vocabulary of {vocab}")
    return value


def id_list(name: str, value, vocab: int | None) -> tuple:
    """An id or a non-empty list of ids as a tuple of ids (one_id's checks on each)."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{name} must be an id or a non-empty list of ids, got {short(value)}")
        return tuple(one_id(name, v, vocab) for v in value)
    return (one_id(name, value, vocab),)


def suppressed_ids(name: str, value, vocab: int | None) -> tuple:
    """suppress_tokens / begin_suppress_tokens (a list of ids, maybe empty: nothing banned) as a tuple of ids."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a list of token ids, got {type(value).__name__} ({short(value)})")
    return tuple(one_id(name, v, vocab) for v in value)


def remade_fills(given: dict, rules: GenerationRules | None, config: TransformerConfig | None) -> dict:
    """fill_id and beam_fill_id under the caller's pad_id / eos_ids (in `given`) as generate() makes them: the pad
    id, else the first end token, after a row's end; `pad_token_id or eos_token_id` in a short beam hypothesis. A
    model of our own (rules None): its pad id, else the first end token, in both (default_fill)."""
    own = rules is None
    pad = given.get("pad_id", config.pad_id if own and config is not None else rules.pad_id if rules else None)
    eos = given.get("eos_ids") or (rules.eos_ids if rules and rules.eos_ids else None)
    eos = eos or (config.eos_ids if config is not None else ())
    first = eos[0] if eos else None
    fill = pad if pad is not None else first
    return {"fill_id": fill, "beam_fill_id": fill if own else (pad or first)}


def minimum_length(rules: GenerationRules, T_p: int) -> int:
    """The decoder length (prompt, or start token, and generated tokens) below which the end tokens are banned:
    min_new_tokens + T_p when min_new_tokens is set (it takes precedence, as in generate()), else min_length."""
    return rules.min_length if rules.min_new_tokens is None else rules.min_new_tokens + T_p


def new_tokens(max_new_tokens: int | None, rules: GenerationRules, T_p: int) -> int:
    """How many tokens generate() makes after a decoder input of T_p positions: max_new_tokens, else the rules'
    max_new_tokens, else their max_length - T_p, else 20 (transformers' default)."""
    if max_new_tokens is not None:
        check_int("max_new_tokens", max_new_tokens)
        return max_new_tokens
    if rules.max_new_tokens is not None:
        return rules.max_new_tokens
    if rules.max_length is not None:
        if rules.max_length <= T_p:
            raise ValueError(
                f"max_length={rules.max_length} (the generation config's) leaves no room after {T_p} positions: "
                "pass max_new_tokens"
            )
        return rules.max_length - T_p
    return 20


def generate_strategy(rules: GenerationRules) -> str:
    """ "greedy", "sample", "beam" or "beam_sample" (do_sample with num_beams > 1: transformers' beam-search
    multinomial sampling), as generate() chooses from do_sample and num_beams."""
    if rules.do_sample and rules.num_beams > 1:
        return "beam_sample"
    if rules.do_sample:
        return "sample"
    return "beam" if rules.num_beams > 1 else "greedy"


GENERATE_SETTINGS = PROCESSORS + SAMPLING + BEAM + ("do_sample", "num_beams", "max_length")
GENERATION_KEYS = frozenset(APPLIED) | frozenset(NOT_APPLIED)  # config.json's keys that are generation settings


def bad_words_applied(words: tuple, eos_ids: tuple) -> tuple:
    """The bad-words sequences generate() applies: all but those that are one end token alone (transformers'
    NoBadWordsLogitsProcessor drops them, so that a row can still end)."""
    return tuple(w for w in words if not (len(w) == 1 and w[0] in eos_ids))


@dataclass(frozen=True)
class GenerationConfig:
    """Every decoding setting generate() takes, under transformers' names; a field left None is not set. generate()
    decodes under the checkpoint's generation_config.json (model.generation_rules; a model of our own: transformers'
    defaults) with this config's set fields over it, and generate()'s keyword arguments over both, the precedence
    transformers' generate(generation_config=..., **kwargs) gives. Frozen: `dataclasses.replace(config, top_k=5)`
    makes another. The values are checked when it is made (TypeError / ValueError naming the field); the token ids
    against a model's vocabulary when generate() reads them.

    - max_new_tokens, max_length: how many tokens (max_length counts the prompt, or the start token, too);
    - min_length, min_new_tokens: the end tokens banned before then;
    - do_sample, num_beams: greedy search, sampling, beam search or beam sampling;
    - temperature, top_k, top_p, min_p: sampling's warpers;
    - repetition_penalty, no_repeat_ngram_size, bad_words_ids, forced_bos_token_id, forced_eos_token_id: the logits
      processors (numpy_transformer.logits_processors has each formula);
    - length_penalty, early_stopping: beam search;
    - eos_token_id (an id or a list), pad_token_id, decoder_start_token_id: the ids generate() stops at, fills with,
      and starts an encoder-decoder's decoder from;
    - suppress_tokens, begin_suppress_tokens: lists of ids banned at every step, and at the first generated step;
    - stop_strings: a string or a list of them; a row stops once its text ends with one (as transformers'
      StopStringCriteria; generate() needs tokenizer= for it; with beams a candidate ending with one is a finished
      hypothesis, as one ending with eos).
    """

    max_new_tokens: int | None = None
    max_length: int | None = None
    min_length: int | None = None
    min_new_tokens: int | None = None
    do_sample: bool | None = None
    num_beams: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    no_repeat_ngram_size: int | None = None
    length_penalty: float | None = None
    early_stopping: bool | str | None = None
    bad_words_ids: Any = None
    forced_bos_token_id: int | None = None
    forced_eos_token_id: Any = None
    eos_token_id: Any = None
    pad_token_id: int | None = None
    decoder_start_token_id: int | None = None
    suppress_tokens: Any = None
    begin_suppress_tokens: Any = None
    stop_strings: Any = None

    def __post_init__(self) -> None:
        settings = self.settings()
        stops = settings.pop("stop_strings", None)
        settings.pop("max_new_tokens", None)
        if self.max_new_tokens is not None:
            check_int("max_new_tokens", self.max_new_tokens)
        decoding_rules(None, settings, GENERATE_SETTINGS, "GenerationConfig")
        if stops is not None:
            stop_string_tuple(stops)

    def settings(self) -> dict:
        """The fields that are set (not None), by name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


def stop_string_tuple(stop_strings) -> tuple:
    """stop_strings (a str or a non-empty list of non-empty str) as a tuple; TypeError / ValueError naming it."""
    if isinstance(stop_strings, str):
        stop_strings = [stop_strings]
    if not isinstance(stop_strings, (list, tuple)) or not stop_strings:
        raise TypeError(f"stop_strings must be a str or a non-empty list of str, got {short(stop_strings)}")
    for one in stop_strings:
        if not isinstance(one, str) or not one:
            raise ValueError(f"stop_strings must hold non-empty strings, got {short(one)}")
    return tuple(stop_strings)


@dataclass
class GenerateOutput:
    """generate(..., return_dict_in_generate=True): the ids (B, T_p + steps); greedy search and sampling add the
    logits each step chose from, (B, steps, V), before any processor (transformers' output_logits); beam search
    and beam sampling add each element's best normalised score (transformers' sequences_scores), a list of B
    floats."""

    sequences: Any
    logits: Any = None
    sequences_scores: list | None = None


@dataclass(frozen=True)
class Plan:
    """What one generate() call does: the rules (checkpoint's, config's, arguments', in that precedence), how many
    tokens (new_tokens), which search (generate_strategy), and the stop strings (StopStrings, or None)."""

    rules: GenerationRules
    max_len: int
    strategy: str
    stop: Any = None


def generate_plan(
    rules: GenerationRules | None,
    generation_config: GenerationConfig | None,
    kwargs: dict,
    T_p: int,
    config: TransformerConfig | None = None,
    tokenizer=None,
) -> Plan:
    """What generate() does: the checkpoint's rules with generation_config's set fields over them and the keyword
    arguments over both (a None argument: not given); the tokens to generate after a decoder input of T_p positions
    (new_tokens); "greedy", "sample", "beam" or "beam_sample" (generate_strategy); the stop strings, read against
    `tokenizer`. TypeError for a generation_config that is not a GenerationConfig or an argument generate() does not
    take; ValueError for stop_strings without a tokenizer."""
    if generation_config is not None and not isinstance(generation_config, GenerationConfig):
        raise TypeError(f"generation_config must be a GenerationConfig or None, got {type(generation_config).__name__}")
    settings = generation_config.settings() if generation_config is not None else {}
    settings |= {name: value for name, value in kwargs.items() if value is not None}
    max_new_tokens = settings.pop("max_new_tokens", None)
    stop_strings = settings.pop("stop_strings", None)
    spoken = {name: settings.pop(name) for name in ("language", "task") if name in settings}
    rules = decoding_rules(rules, settings, GENERATE_SETTINGS, "generate", config)
    if spoken:
        rules = with_language(rules, spoken, config)
    strategy = generate_strategy(rules)
    stop = None
    if stop_strings is None and rules.stop_strings:  # the checkpoint's own, applied as generate() applies them
        if tokenizer is None:
            warnings.warn(
                f"generate: the checkpoint's generation_config.json has stop_strings="
                f"{short(list(rules.stop_strings))}, not applied without tokenizer= (transformers' generate() "
                "refuses to run without one): pass the model's tokenizer",
                UserWarning,
                stacklevel=3,
            )
        else:
            stop_strings = rules.stop_strings
    if stop_strings is not None:
        if tokenizer is None:
            raise ValueError("generate: stop_strings needs tokenizer= (the model's tokenizer), as in transformers")
        stop = StopStrings(stop_string_tuple(stop_strings), tokenizer)
    # an encoder-decoder's decoder_prompt (Whisper's forced tokens) follows its start token: both are decoder input
    T_p += len(rules.decoder_prompt) + (1 if languages_to_detect(rules) else 0)  # and a detected language token
    return Plan(rules, new_tokens(max_new_tokens, rules, T_p), strategy, stop)


def with_language(rules: GenerationRules, spoken: dict, config: TransformerConfig | None) -> GenerationRules:
    """The rules with the decoder_prompt Whisper's generate(language=..., task=...) starts from: the checkpoint's
    prompt keys (rules.prompt_settings) with the caller's language and task over them (forced_decoder_ids then no
    longer read), made as families.whisper.whisper_decoder_prompt makes it. ValueError for a checkpoint without
    them (not a Whisper one) or a language / task its tables do not hold."""
    from .families.whisper import whisper_decoder_prompt  # the family's own rule (families import this module)

    given = ", ".join(f"{name}={value!r}" for name, value in spoken.items())
    if not rules.prompt_settings:
        raise ValueError(
            f"generate: {given} needs a Whisper checkpoint's generation_config.json (lang_to_id, task_to_id)"
        )
    vocab = config.tgt_vocab_size if config is not None else 2**63
    settings = dict(rules.prompt_settings) | spoken
    try:
        prompt, _ = whisper_decoder_prompt(settings, vocab)
    except ValueError as error:
        raise ValueError(f"generate: {error}") from None
    # the settings with the caller's language and task: whether the language is still to detect reads them
    return dataclasses.replace(rules, decoder_prompt=prompt, prompt_settings=tuple(settings.items()))


def languages_to_detect(rules: GenerationRules) -> tuple:
    """The language token ids Whisper's generate() would detect the language among (ascending), for the prompt the
    rules make (families.whisper.whisper_languages_to_detect of rules.prompt_settings); () when there is none to
    detect, or the rules have no Whisper prompt. Decoding then runs the decoder on the start token alone and puts,
    after it, the language token of the largest logit among these (each row its own)."""
    if not rules.prompt_settings:
        return ()
    from .families.whisper import whisper_languages_to_detect  # the family's own rule (families import this module)

    return whisper_languages_to_detect(dict(rules.prompt_settings))


def check_no_streamer(streamer) -> None:
    """ValueError when a streamer is given to beam search, which has no token to stream before it ends (transformers
    refuses it too)."""
    if streamer is not None:
        raise ValueError("streamer: beam search (num_beams > 1) cannot stream tokens as they come; pass num_beams=1")


# ----------------------------------------------------------------------------------------------
# The order generate() applies the logits processors in (its _get_logits_processor), written once; each side passes
# its own module of processors (numpy_transformer.logits_processors, torch_transformer.logits_processors).


@dataclass
class Step:
    """What the logits processors read besides the scores: the rows so far, tokens (N, t) (the side's array); the
    decoder input's length T_p (the prompt, or the start token); start (N,), the first position repetition_penalty
    counts (after a left-padded prompt's pads), or None; whether this is the last step."""

    tokens: Any
    prompt_length: int
    start: Any
    last: bool


def process_scores(lp, scores, rules: GenerationRules, step: Step, eos_ids: tuple):  # eos_ids: end_ids's
    """scores (N, V) after the processors the rules ask for, in generate()'s order: repetition_penalty,
    no_repeat_ngram, bad_words (but an end token alone), min_length (min_new_tokens counted from the prompt), the
    forced tokens, suppress_tokens, begin_suppress_tokens (at begin_index). `lp`: the side's logits_processors
    module."""
    tokens = step.tokens
    if rules.repetition_penalty != 1.0:
        scores = lp.repetition_penalty(scores, tokens, rules.repetition_penalty, step.start)
    if rules.no_repeat_ngram_size > 0:
        scores = lp.no_repeat_ngram(scores, tokens, rules.no_repeat_ngram_size)
    if words := bad_words_applied(rules.bad_words, eos_ids):
        scores = lp.bad_words(scores, tokens, words)
    minimum = minimum_length(rules, step.prompt_length)
    if eos_ids and tokens.shape[1] < minimum:
        scores = lp.min_length(scores, tokens.shape[1], minimum, eos_ids)
    forced = forced_token(rules, tokens.shape[1], step.last)
    if forced is not None:
        scores = lp.forced_token(scores, forced)
    if rules.suppress_tokens:
        scores = lp.suppress(scores, rules.suppress_tokens)
    if rules.begin_suppress_tokens and tokens.shape[1] == begin_index(rules, step.prompt_length):
        scores = lp.suppress(scores, rules.begin_suppress_tokens)
    return scores


def begin_index(rules: GenerationRules, T_p: int) -> int:
    """The row length at which begin_suppress_tokens apply: the decoder input's T_p (the first generated token), one
    later when a one-token input is followed by forced_bos_id (generate()'s SuppressTokensAtBeginLogitsProcessor)."""
    return T_p + 1 if T_p == 1 and rules.forced_bos_id is not None else T_p


def sampling_probabilities(lp, scores, rules: GenerationRules, min_tokens_to_keep: int = 1):
    """Sampling's distribution (N, V) from processed scores: the warpers (warped_scores), then the softmax. `lp`:
    the side's logits_processors module."""
    return lp.softmax(warped_scores(lp, scores, rules, min_tokens_to_keep))


def beam_sample_keep(eos_ids: tuple) -> int:
    """The tokens each warper keeps at least in beam-search sampling: one more than the end tokens (2 without
    one), so that a beam can always go on without ending (generate()'s min_tokens_to_keep with beams)."""
    return len(eos_ids) + 1 if eos_ids else 2


def warped_scores(lp, scores, rules: GenerationRules, min_tokens_to_keep: int = 1):
    """Processed scores (N, V) after the warpers in generate()'s order (temperature, top_k, top_p, min_p, each only
    where it changes something, as generate() builds them). `lp`: the side's logits_processors module."""
    if rules.temperature != 1.0:
        scores = lp.temperature(scores, rules.temperature)
    if rules.top_k:  # None or 0: off
        scores = lp.top_k(scores, rules.top_k, min_tokens_to_keep)
    if rules.top_p < 1.0:
        scores = lp.top_p(scores, rules.top_p, min_tokens_to_keep)
    if rules.min_p is not None:
        scores = lp.min_p(scores, rules.min_p, min_tokens_to_keep)
    return scores
