r"""Cross-entropy over the vocabulary, with ignore_index and label smoothing.

The semantics are those of `torch.nn.functional.cross_entropy` with `reduction="mean"`: with
:math:`p = \mathrm{softmax}(z)` of a row's logits :math:`z`, the smoothed target distribution and the loss
of one row are

.. math::

    q = (1 - \epsilon)\, \mathrm{onehot}(y) + \epsilon / V, \qquad \ell = -\sum_c q_c \log p_c,

and the mean is taken over the rows whose target is not `ignore_index`.

Logits of -inf are allowed (masked vocabulary entries: constrained decoding, padding columns): they get
probability 0 and gradient :math:`p - q = -q`, exactly as torch. Where torch's loss is not finite, ours is
the same or an error:

- a target whose logit is -inf: loss +inf (log 0), gradient finite, as torch;
- label smoothing > 0 with any -inf logit in a kept row: loss +inf (the :math:`\epsilon / V` share of
  log 0), gradient finite, as torch;
- a kept row that is all -inf, or holds NaN or +inf: ValueError naming the row (torch returns NaN).

Ignored rows are never read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layers import L2NormalizeCache, l2_normalize_backward, l2_normalize_forward
from .validation import check_float_array


def log_softmax(logits: np.ndarray) -> np.ndarray:
    r""":math:`\log p = x - \operatorname{logsumexp}(x)` over the last axis, shifted by the row max for
    stability. (N, V).

    -inf entries stay -inf (probability 0). A row whose max is not finite (all -inf, or a NaN or +inf
    anywhere in it) has no distribution: ValueError, instead of a row of NaN."""
    row_max = logits.max(axis=-1, keepdims=True)  # (N, 1); NaN if the row holds a NaN
    bad = ~np.isfinite(row_max[:, 0])
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"logits: row {row} (of the rows whose target is not ignored) has no softmax: its max is "
            f"{row_max[row, 0]} (every logit -inf, or a NaN or +inf among them); {int(bad.sum())} such rows"
        )
    shifted = logits - row_max
    log_total = np.log(np.exp(shifted).sum(axis=-1, keepdims=True))  # (..., 1)
    shifted -= log_total  # in place: (N, V) arrays are the largest of the loss
    return shifted


@dataclass(frozen=True, slots=True)
class CrossEntropyCache:
    logits_shape: tuple[int, ...]  # (N, V) or (B, T, V)
    logp: np.ndarray  # log softmax of the kept rows, (n, V)
    kept: np.ndarray  # (N,) bool: the rows whose target is not ignore_index
    kept_targets: np.ndarray  # (n,) their targets
    label_smoothing: float
    n: int  # the kept rows


def cross_entropy_forward(
    logits: np.ndarray, targets: np.ndarray, ignore_index: int = -100, label_smoothing: float = 0.0
) -> tuple[np.floating, CrossEntropyCache]:
    r"""logits (N, V) or (B, T, V), targets (N,) or (B, T) integers -> scalar mean loss, cache.

    .. math::

        \mathcal{L} = \frac{1}{n} \sum_{i \text{ kept}}
        \Big[ -(1 - \epsilon) \log p_{i, y_i} - \frac{\epsilon}{V} \sum_c \log p_{i, c} \Big]

    where :math:`n` is the number of rows with :math:`y_i \ne` `ignore_index` and :math:`\epsilon` the label
    smoothing.
    """
    check_float_array("logits", logits)
    targets = np.asarray(targets)
    if targets.dtype == np.bool_ or not np.issubdtype(targets.dtype, np.integer):
        raise TypeError(f"targets must be an integer array, got dtype {targets.dtype}")
    if logits.ndim < 2 or targets.shape != logits.shape[:-1]:
        raise ValueError(
            f"targets must have shape logits.shape[:-1] = {logits.shape[:-1]}, got targets of shape "
            f"{targets.shape} with logits of shape {logits.shape}"
        )
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)):
        raise TypeError(f"label_smoothing must be a float in [0, 1], got {label_smoothing!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    V = logits.shape[-1]
    logits2d = logits.reshape(-1, V)  # (N, V)
    flat = targets.reshape(-1)  # (N,)
    kept = flat != ignore_index
    bad = kept & ((flat < 0) | (flat >= V))
    if bad.any():
        raise ValueError(
            f"targets must be in [0, {V}) or equal ignore_index={ignore_index}, got {flat[bad][:5].tolist()}"
        )
    n = int(kept.sum())
    if n == 0:
        raise ValueError(f"targets: every target equals ignore_index={ignore_index}; the mean loss is undefined")
    logp = log_softmax(logits2d[kept] if n < len(flat) else logits2d)  # (n, V)
    nll = -logp[np.arange(n), flat[kept]]  # (n,)
    loss = (1.0 - label_smoothing) * nll.sum()
    if label_smoothing > 0:  # skipped at 0, as torch does: 0 * log 0 would be NaN for a -inf logit
        smooth = -logp.mean(axis=-1)  # (n,) = -(1/V) sum_c log p_c
        loss += label_smoothing * smooth.sum()
    loss /= n
    return loss, CrossEntropyCache(logits.shape, logp, kept, flat[kept], label_smoothing, n)


def cross_entropy_backward(cache: CrossEntropyCache, dloss: float = 1.0) -> np.ndarray:
    r"""The gradient of the mean loss with respect to the logits, the same shape and dtype as the logits:

    .. math::

        dz_i = d\mathcal{L}\, \frac{\mathrm{softmax}(z_i) - q_i}{n}, \qquad
        q_i = (1 - \epsilon)\, \mathrm{onehot}(y_i) + \epsilon / V,

    for kept rows, 0 for ignored rows. (The cache comes first, as in every version of this function: the loss is
    the end of the chain, and dloss defaults to 1.)"""
    shape, logp, kept, kept_targets = cache.logits_shape, cache.logp, cache.kept, cache.kept_targets
    label_smoothing, n = cache.label_smoothing, cache.n
    V = shape[-1]
    dkept = np.exp(logp)  # p, (n, V)
    dkept[np.arange(n), kept_targets] -= 1.0 - label_smoothing
    dkept -= label_smoothing / V
    dkept *= float(dloss) / n
    if n == kept.shape[0]:  # nothing ignored: the kept rows are all the rows
        return dkept.reshape(shape)
    dlogits = np.zeros((kept.shape[0], V), dtype=logp.dtype)
    dlogits[kept] = dkept
    return dlogits.reshape(shape)


# ----------------------------------------------------------------------------------------------
# MultipleNegativesRankingLoss (sentence-transformers): the in-batch softmax over scaled cosine similarities.


@dataclass(frozen=True, slots=True)
class MultipleNegativesRankingCache:
    anchors: L2NormalizeCache  # a_hat = a / |a|, (N, D)
    positives: L2NormalizeCache  # p_hat = p / |p|, (N, D)
    probs: np.ndarray  # softmax of each row of the scores S, (N, N)
    scale: float


def multiple_negatives_ranking_loss_forward(
    anchors: np.ndarray, positives: np.ndarray, scale: float = 20.0
) -> tuple[np.floating, MultipleNegativesRankingCache]:
    r"""anchors (N, D), positives (N, D) -> scalar loss, cache: sentence-transformers' MultipleNegativesRankingLoss
    (its defaults: cosine similarity, query_to_doc only). Each anchor's positive is the row of the same index, and
    every other positive of the batch is one of its negatives:

    .. math::

        S_{ij} = s\, \frac{a_i \cdot p_j}{\lVert a_i \rVert\, \lVert p_j \rVert}, \qquad
        \mathcal{L} = \frac{1}{N} \sum_i \Big( \log \sum_j e^{S_{ij}} - S_{ii} \Big)

    the cross-entropy of each row of S against the diagonal, with s the scale (20: a temperature of 0.05)."""
    check_float_array("anchors", anchors)
    check_float_array("positives", positives, anchors.dtype, anchors.shape)
    if anchors.ndim != 2 or anchors.shape[0] < 1:
        raise ValueError(f"anchors must have shape (N, D) with N >= 1, got shape {anchors.shape}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(f"scale must be a positive float, got {scale!r}")
    a_hat, a_cache = l2_normalize_forward(anchors)  # (N, D)
    p_hat, p_cache = l2_normalize_forward(positives)  # (N, D)
    scores = (a_hat @ p_hat.T) * anchors.dtype.type(scale)  # (N, N)
    logp = log_softmax(scores)  # (N, N)
    n = anchors.shape[0]
    loss = -logp[np.arange(n), np.arange(n)].mean()
    return loss, MultipleNegativesRankingCache(a_cache, p_cache, np.exp(logp), float(scale))


def multiple_negatives_ranking_loss_backward(
    cache: MultipleNegativesRankingCache, dloss: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    r"""Gradients of the loss with respect to the anchors and the positives, (N, D) each. With P the row softmax of
    S, I the identity and :math:`\hat a, \hat p` the unit rows:

    .. math::

        dS = \frac{P - I}{N}, \qquad d\hat a = s\, dS\, \hat p, \qquad d\hat p = s\, dS^\top \hat a,

    then each through its normalisation, :math:`da_i = (d\hat a_i - \hat a_i (\hat a_i \cdot d\hat a_i)) /
    \lVert a_i \rVert` (l2_normalize_backward), and the same for the positives."""
    a_hat, p_hat = cache.anchors.out, cache.positives.out
    n = a_hat.shape[0]
    dscores = cache.probs.copy()  # (N, N)
    dscores[np.arange(n), np.arange(n)] -= 1.0
    dscores *= a_hat.dtype.type(float(dloss) * cache.scale / n)  # s (P - I) / N, the scale folded in
    da_hat = dscores @ p_hat  # (N, D)
    dp_hat = dscores.T @ a_hat  # (N, D)
    return l2_normalize_backward(da_hat, cache.anchors), l2_normalize_backward(dp_hat, cache.positives)
