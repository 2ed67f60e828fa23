"""Logits processors: what decoding does to the next token's scores before it chooses, one small function each,
equal to transformers' LogitsProcessor of the same name on the same scores.

Every function takes scores (N, V), the next token's scores of N rows (logits in greedy search and sampling,
log-probabilities in beam search), and returns a new array of the same shape and dtype; tokens (N, t) are the rows
so far (the decoder's ids: the prompt of a decoder-only model, the start token of an encoder-decoder, then what was
generated). Banned tokens get -inf.

Applied by decoding in transformers' order (generate()'s `_get_logits_processor`): repetition_penalty,
no_repeat_ngram, bad_words, min_length, forced tokens, suppress (suppress_tokens, then begin_suppress_tokens);
then, when sampling only, the warpers temperature, top_k, top_p, min_p, and the softmax the token is drawn from.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def repetition_penalty(scores: np.ndarray, tokens: np.ndarray, penalty: float, start=None) -> np.ndarray:
    """Every token v already in the row: s_v / penalty when s_v >= 0, s_v * penalty when s_v < 0 (both lower a
    score when penalty > 1). start (N,): the first position of each row that counts (a left-padded prompt's pads
    before it do not), or None: all of them. RepetitionPenaltyLogitsProcessor."""
    N, V = scores.shape
    counted = np.ones(tokens.shape, dtype=bool)  # (N, t)
    if start is not None:
        counted = np.arange(tokens.shape[1])[None, :] >= np.asarray(start)[:, None]
    seen = np.zeros((N, V), dtype=bool)
    rows = np.broadcast_to(np.arange(N)[:, None], tokens.shape)  # (N, t)
    seen[rows[counted], tokens[counted]] = True
    penalised = np.where(scores < 0, scores * penalty, scores / penalty)
    return np.where(seen, penalised, scores).astype(scores.dtype, copy=False)


def no_repeat_ngram(scores: np.ndarray, tokens: np.ndarray, n: int) -> np.ndarray:
    """Ban every token that would complete an n-gram already in the row: the last tokens of the windows of n whose
    first n - 1 equal the row's last n - 1 tokens (n = 1: every token in the row). NoRepeatNGramLogitsProcessor."""
    out = scores.copy()
    t = tokens.shape[1]
    if t < n:
        return out
    windows = sliding_window_view(tokens, n, axis=1)  # (N, t - n + 1, n)
    prefix = tokens[:, t - n + 1 :]  # (N, n - 1)
    matches = (windows[:, :, :-1] == prefix[:, None, :]).all(axis=-1)  # (N, t - n + 1)
    rows, where = np.nonzero(matches)
    out[rows, windows[rows, where, -1]] = -np.inf
    return out


def bad_words(scores: np.ndarray, tokens: np.ndarray, words) -> np.ndarray:
    """Ban the last token of each sequence in `words` (tuples of ids) in the rows that end with the rest of it (a
    one-token sequence everywhere). NoBadWordsLogitsProcessor."""
    out = scores.copy()
    for sequence in words:
        *prefix, last = sequence
        if not prefix:
            out[:, last] = -np.inf
        elif tokens.shape[1] >= len(prefix):
            ends_with = (tokens[:, tokens.shape[1] - len(prefix) :] == np.array(prefix)).all(axis=1)  # (N,)
            out[ends_with, last] = -np.inf
    return out


def min_length(scores: np.ndarray, length: int, minimum: int, eos_ids) -> np.ndarray:
    """Ban the end tokens while length < minimum. MinLengthLogitsProcessor (length: the rows' t) and
    MinNewTokensLengthLogitsProcessor (length: the tokens generated so far, minimum: min_new_tokens)."""
    out = scores.copy()
    if length < minimum:
        out[:, list(eos_ids)] = -np.inf
    return out


def forced_token(scores: np.ndarray, token: int | tuple) -> np.ndarray:
    """Only `token` may come: every other score -inf, its own 0. ForcedBOSTokenLogitsProcessor (at position 1),
    ForcedEOSTokenLogitsProcessor (at the last step)."""
    out = np.full_like(scores, -np.inf)
    out[:, list(token) if isinstance(token, tuple) else token] = 0.0  # several forced end tokens: each at 0
    return out


def suppress(scores: np.ndarray, ids) -> np.ndarray:
    """Ban the tokens `ids` (ids past the vocabulary: ignored). SuppressTokensLogitsProcessor (every step) and
    SuppressTokensAtBeginLogitsProcessor (the first generated step)."""
    out = scores.copy()
    out[:, [i for i in ids if i < scores.shape[-1]]] = -np.inf
    return out


# ----------------------------------------------------------------------------------------------
# Sampling's warpers.


def temperature(scores: np.ndarray, value: float) -> np.ndarray:
    """s / T: T < 1 sharpens the distribution softmax(s / T), T > 1 flattens it. TemperatureLogitsWarper."""
    if not value > 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {value!r} (greedy search: do_sample=False)")
    return scores / value


def top_k(scores: np.ndarray, k: int, min_tokens_to_keep: int = 1) -> np.ndarray:
    """Keep the scores >= the k-th largest of the row (k raised to min_tokens_to_keep, at most V; ties at the k-th
    all kept), the others -inf. TopKLogitsWarper."""
    V = scores.shape[-1]
    k = min(max(k, min_tokens_to_keep), V)
    kth = np.partition(scores, V - k, axis=-1)[:, V - k : V - k + 1]  # (N, 1) the k-th largest
    return np.where(scores < kth, -np.inf, scores).astype(scores.dtype, copy=False)


def top_p(scores: np.ndarray, p: float, min_tokens_to_keep: int = 1) -> np.ndarray:
    """Nucleus: sort the row ascending, p_i = softmax of the sorted scores, c_i = p_1 + ... + p_i; drop the tokens
    with c_i <= 1 - p (the least likely ones, whose mass is at most 1 - p) except the min_tokens_to_keep most likely,
    -inf. TopPLogitsWarper."""
    order = np.argsort(scores, axis=-1, kind="stable")  # (N, V) ascending
    cumulative = np.cumsum(softmax(np.take_along_axis(scores, order, axis=-1)), axis=-1)  # (N, V)
    drop_sorted = cumulative <= 1 - p
    drop_sorted[:, scores.shape[-1] - min_tokens_to_keep :] = False
    drop = np.zeros_like(drop_sorted)
    np.put_along_axis(drop, order, drop_sorted, axis=-1)
    return np.where(drop, -np.inf, scores).astype(scores.dtype, copy=False)


def min_p(scores: np.ndarray, p: float, min_tokens_to_keep: int = 1) -> np.ndarray:
    """Drop the tokens whose probability softmax(s)_v is below p times the row's largest probability, except the
    min_tokens_to_keep most likely, -inf. MinPLogitsWarper."""
    probs = softmax(scores)
    drop = probs < p * probs.max(axis=-1, keepdims=True)
    k = min(min_tokens_to_keep, scores.shape[-1])
    best = np.argsort(-probs, axis=-1, kind="stable")[:, :k]  # (N, k)
    np.put_along_axis(drop, best, False, axis=-1)
    return np.where(drop, -np.inf, scores).astype(scores.dtype, copy=False)


def softmax(x: np.ndarray) -> np.ndarray:
    """softmax over the last axis: exp(x - max) / sum(exp(x - max)); -inf scores get probability 0."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def draw(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One token per row from probs (N, V) (rows summing to 1), by the inverse of the cumulative distribution: with
    u uniform in [0, 1), the first token whose cumulative probability exceeds u. A token of probability 0 is never
    drawn. Returns int64 ids (N,)."""
    cumulative = np.cumsum(probs, axis=-1)  # (N, V)
    u = rng.random((probs.shape[0], 1)) * cumulative[:, -1:]  # (N, 1)
    chosen = (cumulative <= u).sum(axis=-1)  # (N,) entries at or below u precede the chosen one
    last_possible = probs.shape[-1] - 1 - np.argmax(probs[:, ::-1] > 0, axis=-1)  # rounding cannot go past it
    return np.minimum(chosen, last_possible).astype(np.int64)


def draw_distinct(probs: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n distinct tokens per row from probs (N, V), as n draws without replacement (each from the probabilities of
    the tokens not drawn yet, renormalised), by the exponential race: with E_v independent Exp(1) draws, the n
    largest p_v / E_v (the first n arrivals of races of rates p_v). Returns int64 ids (N, n), in arrival order.
    The order of a row's sample has the law of sequential drawing; torch.multinomial(replacement=False) draws the
    same law (the same race, on torch's generator)."""
    keys = probs / rng.exponential(size=probs.shape)  # (N, V); probability 0: key 0, after every possible token
    return np.argsort(-keys, axis=-1, kind="stable")[:, :n].astype(np.int64)
