r"""What attention does to its scores, by position: the rules of numpy_transformer/scores.py, with torch's ops.

In head h, query i and key j (positions, not indices),

.. math::

    s_{ij} = c\, q_i \cdot k_j + \mathrm{bias}_h(i, j), \qquad \text{read only where the mask and the positions
    allow it.}

- `scale`: :math:`c = 1 / \sqrt{d_h}` unless the model says otherwise (T5 uses 1);
- `causal`: query i sees keys :math:`j \le i`;
- `window` (Mistral's sliding window): query i sees keys :math:`j > i - \mathrm{window}`;
- `band` (ModernBERT's local attention): query i sees keys :math:`\lvert i - j \rvert \le \mathrm{band}`;
- `alibi_slopes` (BLOOM's ALiBi): :math:`\mathrm{bias}_h(i, j) = -m_h \lvert i - j \rvert`;
- `relative` (T5's bias): :math:`\mathrm{bias}_h(i, j) = W_{\mathrm{bucket}(j - i),\, h}`, W the stack's learned
  (n_buckets, H) table, read by every self-attention of the stack (autograd sums its gradient over them);
- `softcap` (Gemma 2's attn_logit_softcapping): :math:`s \leftarrow \mathrm{cap} \tanh(s / \mathrm{cap})` after
  the scale and the bias, before the mask (`soft_cap`; SDPA has no such step, so attention then spells it out).

`MultiHeadAttention` holds a `ScoreMod` and hands its mask and bias to `F.scaled_dot_product_attention`; decoding
passes the positions of the new queries and of the cached keys, so a step reads the same rules as training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class ScoreMod:
    r"""How attention turns :math:`q \cdot k` into the scores the softmax reads (see the module docstring)."""

    scale: float | None = None  # None: 1 / sqrt(Dh)
    causal: bool = False  # query i sees keys j <= i
    window: int | None = None  # query i sees keys j > i - window
    band: int | None = None  # query i sees keys |i - j| <= band
    alibi_slopes: tuple | None = None  # (H,) slopes m_h: bias -m_h |i - j|
    relative: tuple | None = None  # (n_buckets, max_distance, bidirectional): T5's bias W[bucket(j - i), h]
    softcap: float | None = None  # s -> softcap * tanh(s / softcap), after the scale and the bias (Gemma 2)

    def scale_for(self, head_dim: int) -> float:
        r"""The factor :math:`c` on :math:`q \cdot k`: `scale`, or :math:`1 / \sqrt{d_h}`."""
        return 1.0 / math.sqrt(head_dim) if self.scale is None else float(self.scale)

    @property
    def hides_positions(self) -> bool:
        """Whether some (query, key) pairs are hidden by their positions alone (causal, a window or a band)."""
        return self.causal or self.window is not None or self.band is not None


PLAIN = ScoreMod()


def alibi_slopes(n_heads: int) -> tuple:
    r"""ALiBi's slopes: :math:`m_h = 2^{-8h/P}` for :math:`h = 1, \dots, P`, P the largest power of two
    :math:`\le H`, then the odd powers :math:`2^{-8h/(2P)}`, h = 1, 3, ..., for the heads beyond P (BLOOM's rule)."""
    P = 2 ** math.floor(math.log2(n_heads))
    slopes = torch.pow(2.0, -8.0 * torch.arange(1, P + 1, dtype=torch.float64) / P)
    extra = torch.pow(2.0, -8.0 * torch.arange(1, 2 * (n_heads - P) + 1, 2, dtype=torch.float64) / (2 * P))
    return tuple(torch.cat([slopes, extra]).tolist())


def position_mask(mod: ScoreMod, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
    """(T_q, T_k), True where query q_pos[i] may see key k_pos[j] by position alone; None: all may."""
    if not mod.hides_positions:
        return None
    distance = q_pos[:, None] - k_pos[None, :]  # (T_q, T_k): i - j
    allowed = torch.ones_like(distance, dtype=torch.bool)
    if mod.causal:
        allowed = allowed & (distance >= 0)  # key j <= query i
    if mod.window is not None:
        allowed = allowed & (distance < mod.window)  # key j > i - window
    if mod.band is not None:
        allowed = allowed & (distance.abs() <= mod.band)  # |i - j| <= band, on either side
    return allowed


def relative_buckets(relative: tuple, q_pos: Tensor, k_pos: Tensor) -> Tensor:
    r"""T5's bucket of each distance j - i, (T_q, T_k) long in [0, n_buckets). Bidirectional (an encoder): half the
    buckets for :math:`j > i`, half for :math:`j \le i`, of :math:`d = \lvert j - i \rvert`; in a decoder all of
    them, of :math:`d = \max(i - j, 0)`. Within :math:`n_b` buckets, :math:`d < n_e = n_b / 2` has bucket d, and

    .. math::

        \mathrm{bucket}(d) = \min\Big(n_b - 1,\; n_e + \Big\lfloor
        \frac{\log(d / n_e)}{\log(\mathrm{max\_distance} / n_e)}\, (n_b - n_e) \Big\rfloor\Big) \quad (d \ge n_e)

    in float32, as T5's own code computes it."""
    n_buckets, max_distance, bidirectional = relative
    distance = k_pos[None, :] - q_pos[:, None]  # (T_q, T_k): j - i
    buckets = torch.zeros_like(distance)
    if bidirectional:
        n_buckets //= 2
        buckets = buckets + (distance > 0).long() * n_buckets
        distance = distance.abs()
    else:
        distance = (-distance).clamp(min=0)  # i - j; keys after the query (masked anyway) share bucket 0
    exact = n_buckets // 2
    far = distance.clamp(min=exact).float()  # the log is read only where d >= exact
    log_ratio = torch.log(far / exact) / math.log(max_distance / exact)
    large = (exact + (log_ratio * (n_buckets - exact)).long()).clamp(max=n_buckets - 1)
    return buckets + torch.where(distance < exact, distance, large)


def position_bias(
    mod: ScoreMod, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype, table: Tensor | None = None
) -> Tensor | None:
    r"""(H, T_q, T_k): the ALiBi bias :math:`-m_h \lvert i - j \rvert`, or T5's :math:`W_{\mathrm{bucket}(j - i),\,
    h}` read from `table` (n_buckets, H); None when there is none."""
    if mod.relative is not None:
        if table is None:
            raise ValueError("position_bias: mod.relative needs T5's table (n_buckets, H), got table=None")
        buckets = relative_buckets(mod.relative, q_pos, k_pos)  # (T_q, T_k)
        return table[buckets].permute(2, 0, 1).to(dtype)  # (H, T_q, T_k)
    if mod.alibi_slopes is None:
        return None
    distance = (q_pos[:, None] - k_pos[None, :]).abs().to(torch.float64)  # (T_q, T_k)
    slopes = torch.tensor(mod.alibi_slopes, dtype=torch.float64, device=q_pos.device)[:, None, None]  # (H, 1, 1)
    return (-slopes * distance).to(dtype)  # (H, T_q, T_k)


def soft_cap(scores: Tensor, cap: float | None) -> Tensor:
    r""":math:`\mathrm{cap} \tanh(S / \mathrm{cap})` of the scores (B, H, T_q, T_k) (Gemma 2's attention soft cap); the
    scores unchanged when cap is None."""
    return scores if cap is None else torch.tanh(scores / cap) * cap


def positions(length: int, start: int = 0, device: torch.device | None = None) -> Tensor:
    """The positions start .. start + length - 1 (long)."""
    return torch.arange(start, start + length, device=device)
