"""Cross-entropy over the vocabulary, mean over the targets that are not ignored.

Shape letters: B batch, T sequence, V vocabulary.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def cross_entropy(logits: Tensor, targets: Tensor, ignore_index: int = -100, label_smoothing: float = 0.0) -> Tensor:
    """`F.cross_entropy` on logits (..., V) flattened to (N, V) and targets (...) flattened to (N,).

    loss = mean over n with targets[n] != ignore_index of
           -(1 - eps) * log_softmax(logits[n])[targets[n]] - eps / V * sum_v log_softmax(logits[n])[v]
    with eps = label_smoothing. If every target is ignored the mean is 0 / 0 = NaN, as in torch.
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
