"""Decoding's bookkeeping, shared by numpy_transformer.decoding and torch_transformer.decoding: no math, plain ints,
floats and lists. Each side computes its scores with its own library and hands this module what it found.

- which ids fill a row after its end token (`after_eos`, greedy search) and a short hypothesis (`beam_fill`);
- which token a checkpoint's rules force at a step (`forced_token`), and the error when a row is left no token;
- beam search's finished hypotheses: which are collected (`collect_finished`), when an element stops taking them
  (`cannot_improve`, `update_stopped`), and which one wins (`best_finished`);
- the arguments' checks (`check_int`, `check_beam_arguments`, `decoding_length`).

The rules are transformers' generate()'s; numpy_transformer/decoding.py states them in full above beam_search.
"""

from __future__ import annotations

import math
import numbers

from .config import GenerationRules, TransformerConfig

# A finished hypothesis: its normalised score and its generated tokens (the end token included).
Hypothesis = tuple[float, list]


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


def forced_token(rules: GenerationRules, position: int, last_step: bool) -> int | None:
    """The token the rules force at `position` (the length of the rows so far): forced_bos_id at position 1,
    forced_eos_id at the last step (it wins when both apply); None: none."""
    forced = rules.forced_bos_id if position == 1 else None
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


def check_beam_arguments(beam_size, length_penalty, early_stopping) -> None:
    """beam_size an int >= 1, length_penalty a finite float, early_stopping True, False or "never"."""
    check_int("beam_size", beam_size)
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
        check_int("max_len", max_len)
    else:
        max_len = max(limit - T_p, 1)  # a full table still gets the error below
    if T_p + max_len > limit:
        taken = f"the {T_p}-token prompt" if lm else "bos"
        raise ValueError(
            f"max_len={max_len} generated tokens after {taken} need {T_p + max_len} positions, more than "
            f"config.max_len={limit}: max_len must be at most {limit - T_p}"
        )
    return max_len
