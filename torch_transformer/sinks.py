"""Attention sinks (GPT-OSS) as a PyTorch user writes them; autograd does the backward.

Head h has one learned logit s_h (the attention's `sinks` (H,)) that joins every softmax's denominator beside the
row's scores S_ij; the sink's own share is then dropped, so a query may give its keys less than 1 in total:

    P_ij = exp(S_ij) / (exp(s_h) + sum_j' exp(S_ij'))

The sink is one more column of the softmax (torch.cat), sliced off after it; F.softmax's shift by the row's maximum
then covers the sink too. Shape letters: B batch, H heads, T_q queries, T_k keys.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def sink_softmax(scores: Tensor, sinks: Tensor) -> Tensor:
    """The softmax of each row of scores (B, H, T_q, T_k), hidden entries -inf, with head h's sink logit sinks[h]
    (sinks (H,)) in its denominator; the keys' shares P (B, H, T_q, T_k), the scores' dtype. A row with every key
    hidden gives everything to the sink (P = 0, not NaN)."""
    sink = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:3], 1)  # (B, H, T_q, 1)
    return F.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]  # (B, H, T_q, T_k)
