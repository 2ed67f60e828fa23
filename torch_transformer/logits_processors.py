"""Logits processors in torch: one small function each, equal to transformers' LogitsProcessor of the same name on
the same scores (numpy_transformer.logits_processors states the formulas; this is written with torch's own ops).

scores (N, V): the next token's scores of N rows; tokens (N, t): the rows so far (the decoder's ids). Each function
returns a new tensor; banned tokens get -inf. Decoding applies them in transformers' order: repetition_penalty,
no_repeat_ngram, bad_words, min_length, forced tokens; when sampling, temperature, top_k, top_p, min_p, softmax.
"""

from __future__ import annotations

import torch
from torch import Tensor

NEG_INF = float("-inf")


def repetition_penalty(scores: Tensor, tokens: Tensor, penalty: float, start: Tensor | None = None) -> Tensor:
    """Tokens already in the row (from position start (N,) on; None: all): s / penalty where s >= 0, s * penalty
    where s < 0. RepetitionPenaltyLogitsProcessor."""
    counted = torch.ones_like(tokens, dtype=torch.bool)
    if start is not None:
        counted = torch.arange(tokens.shape[1], device=tokens.device)[None, :] >= start[:, None]
    rows = torch.arange(tokens.shape[0], device=tokens.device)[:, None].expand_as(tokens)  # (N, t)
    seen = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    seen[rows[counted], tokens[counted]] = True
    penalised = torch.where(scores < 0, scores * penalty, scores / penalty)
    return torch.where(seen, penalised, scores)


def no_repeat_ngram(scores: Tensor, tokens: Tensor, n: int) -> Tensor:
    """Ban the tokens that would complete an n-gram already in the row. NoRepeatNGramLogitsProcessor."""
    t = tokens.shape[1]
    if t < n:
        return scores.clone()
    windows = tokens.unfold(1, n, 1)  # (N, t - n + 1, n)
    prefix = tokens[:, t - n + 1 :]  # (N, n - 1)
    matches = (windows[..., :-1] == prefix[:, None, :]).all(dim=-1)  # (N, t - n + 1)
    banned = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    banned[torch.nonzero(matches, as_tuple=True)[0], windows[..., -1][matches]] = True
    return scores.masked_fill(banned, NEG_INF)


def bad_words(scores: Tensor, tokens: Tensor, words) -> Tensor:
    """Ban each sequence's last token in the rows ending with the rest of it (one token: everywhere).
    NoBadWordsLogitsProcessor."""
    scores = scores.clone()
    for sequence in words:
        *prefix, last = sequence
        if not prefix:
            scores[:, last] = NEG_INF
        elif tokens.shape[1] >= len(prefix):
            ends_with = (tokens[:, tokens.shape[1] - len(prefix) :] == tokens.new_tensor(prefix)).all(dim=1)  # (N,)
            scores[ends_with, last] = NEG_INF
    return scores


def min_length(scores: Tensor, length: int, minimum: int, eos_ids) -> Tensor:
    """The end tokens -inf while length < minimum. MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor."""
    if length >= minimum:
        return scores.clone()
    return scores.index_fill(-1, torch.tensor(list(eos_ids), device=scores.device), NEG_INF)


def forced_token(scores: Tensor, token: int | tuple) -> Tensor:
    """Every score -inf but `token`'s, 0. ForcedBOSTokenLogitsProcessor, ForcedEOSTokenLogitsProcessor."""
    out = torch.full_like(scores, NEG_INF)
    out[:, list(token) if isinstance(token, tuple) else token] = 0.0  # several forced end tokens: each at 0
    return out


def suppress(scores: Tensor, ids) -> Tensor:
    """Ban the tokens `ids` (ids past the vocabulary: ignored). SuppressTokensLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor."""
    banned = torch.zeros(scores.shape[-1], dtype=torch.bool, device=scores.device)
    banned[[i for i in ids if i < scores.shape[-1]]] = True
    return scores.masked_fill(banned, NEG_INF)


# ----------------------------------------------------------------------------------------------
# Sampling's warpers.


def temperature(scores: Tensor, value: float) -> Tensor:
    """s / T. TemperatureLogitsWarper."""
    if not value > 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {value!r} (greedy search: do_sample=False)")
    return scores / value


def top_k(scores: Tensor, k: int, min_tokens_to_keep: int = 1) -> Tensor:
    """Keep the scores >= the row's k-th largest (k at least min_tokens_to_keep, at most V). TopKLogitsWarper."""
    k = min(max(k, min_tokens_to_keep), scores.shape[-1])
    kth = torch.topk(scores, k, dim=-1).values[:, -1:]  # (N, 1)
    return scores.masked_fill(scores < kth, NEG_INF)


def top_p(scores: Tensor, p: float, min_tokens_to_keep: int = 1) -> Tensor:
    """Drop the least likely tokens whose cumulative probability (ascending order) is <= 1 - p, keeping the
    min_tokens_to_keep most likely. TopPLogitsWarper."""
    ascending, order = torch.sort(scores, dim=-1, stable=True)
    cumulative = torch.softmax(ascending, dim=-1).cumsum(dim=-1)
    drop_sorted = cumulative <= 1 - p
    drop_sorted[:, scores.shape[-1] - min_tokens_to_keep :] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return scores.masked_fill(drop, NEG_INF)


def min_p(scores: Tensor, p: float, min_tokens_to_keep: int = 1) -> Tensor:
    """Drop the tokens less likely than p times the most likely one, keeping the min_tokens_to_keep most likely.
    MinPLogitsWarper."""
    probs = torch.softmax(scores, dim=-1)
    drop = probs < p * probs.amax(dim=-1, keepdim=True)
    best = torch.topk(probs, min(min_tokens_to_keep, scores.shape[-1]), dim=-1).indices
    drop = drop.scatter(-1, best, False)
    return scores.masked_fill(drop, NEG_INF)


def softmax(scores: Tensor) -> Tensor:
    """softmax over the last axis; -inf scores get probability 0."""
    return torch.softmax(scores, dim=-1)
