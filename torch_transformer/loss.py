"""Cross-entropy over the vocabulary, mean over the targets that are not ignored.

Shape letters: B batch, T sequence, V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def cross_entropy(logits: Tensor, targets: Tensor, ignore_index: int = -100, label_smoothing: float = 0.0) -> Tensor:
    r"""`F.cross_entropy` on logits (..., V) flattened to (N, V) and targets (...) flattened to (N,):
    with :math:`\log p_n = \mathrm{log\_softmax}(z_n)` and :math:`\epsilon` the label smoothing, the mean over
    the rows :math:`n` whose target :math:`y_n` is not `ignore_index`, of

    .. math::

        -(1 - \epsilon) \log p_{n, y_n} - \frac{\epsilon}{V} \sum_v \log p_{n, v} .

    If every target is ignored the mean is 0 / 0 = NaN, as in torch.
    """
    if targets.dtype.is_floating_point or targets.dtype.is_complex:
        raise TypeError(f"targets must be an integer tensor of class indices, got {targets.dtype}")
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"targets must have the shape of logits without its last (V) axis: got targets "
            f"{tuple(targets.shape)}, logits {tuple(logits.shape)}, expected {tuple(logits.shape[:-1])}"
        )
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),  # (N, V)
        targets.reshape(-1).long(),  # (N,)
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
    )


def multiple_negatives_ranking_loss(anchors: Tensor, positives: Tensor, scale: float = 20.0) -> Tensor:
    r"""sentence-transformers' MultipleNegativesRankingLoss on embeddings (N, D) each: the cross-entropy of each row
    of :math:`S = s \cos(a_i, p_j)` against the diagonal (each anchor's own positive; the others are its negatives)."""
    if anchors.dim() != 2 or positives.shape != anchors.shape:
        raise ValueError(f"anchors and positives must both have shape (N, D), got {tuple(anchors.shape)} and "
                         f"{tuple(positives.shape)}")  # fmt: skip
    scores = F.normalize(anchors, dim=-1) @ F.normalize(positives, dim=-1).T * scale  # (N, N)
    return F.cross_entropy(scores, torch.arange(len(anchors), device=anchors.device))
