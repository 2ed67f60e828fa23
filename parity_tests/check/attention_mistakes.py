"""The attention mistakes of the registry (mistakes.py), in the order they are tried; their knobs are those of
variants.multi_head_attention and variants.attention_heads. A new attention id is one entry here."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from . import variants as VR
from .diagnosis import Mistake, Site

ATTENTION = "attention"


def _causal(message: str, diagonal: int | None) -> Callable[[Site], list]:
    """A causal self-attention's variants: its mask tril(diagonal) (1, 1, T, T), or none (diagonal None), with the
    keys' padding too where the user may mask it (a causal attention's padding of the target)."""

    def variants(site: Site) -> list:
        if not site.causal:
            return []
        pads = [] if site.pad is None else [site.pad]
        if diagonal is None:
            return [(message, {"keep": keep}) for keep in [None, *pads]]
        T = site.keep.shape[-1]  # type: ignore[union-attr]  # a causal site's keep is (1, 1, T, T), never None
        mask = np.tril(np.ones((T, T), bool), diagonal)[None, None]
        return [(message, {"keep": mask & pad}) for pad in [True, *pads]]

    return variants


def _only(holds: Callable[[Site], bool], *variants: tuple) -> Callable[[Site], list]:
    """Variants that do not depend on the site, at a site where `holds` (none elsewhere)."""
    return lambda s: [(message, dict(knobs)) for message, knobs in variants] if holds(s) else []


def _attention(mistake_id: str, line: str, variants: Callable[[Site], list]) -> Mistake:
    """An attention's mistake: its variants (message, knobs) at a Site."""
    return Mistake(mistake_id, line, ATTENTION, variants)


# which of the two is which depends on the map's pairing (the q and k rows read in the other order swap them)
MIXED = "queries and keys rotated with different pairings: one in halves (i, i + Dh/2), the other in pairs (2i, 2i + 1)"


def _masks_swapped(site: Site) -> list:
    """A causal self-attention given the cross-attention's padding mask, where the two have the same keys."""
    if not site.causal or site.swap is None or site.keep is None or site.swap.shape[-1] != site.keep.shape[-1]:
        return []
    return [("self-attention got the source's padding mask (and cross-attention the causal one)", {"keep": site.swap})]


def _inverted(site: Site) -> list:
    """A mask's polarity flipped; a causal mask's triangle too: triu for tril (each query sees itself and the future,
    not the past), or the causal keep negated (only the future)."""
    if site.keep is None:
        return []
    if not site.causal:
        return [("the mask's polarity is flipped", {"keep": ~site.keep})]
    ones = np.ones((site.keep.shape[-1],) * 2, bool)
    pads = [True] + ([] if site.pad is None else [site.pad])
    return [
        (message, {"keep": triangle[None, None] & pad})
        for message, triangle in (
            ("the causal mask's triangle flipped (triu for tril): a query sees itself and the future", np.triu(ones)),
            ("the causal mask's polarity flipped: each query sees only the future", np.triu(ones, 1)),
        )
        for pad in pads
    ]


def _padding_on_queries(site: Site) -> list:
    """A self-attention's padding of its keys (B, 1, 1, T) put on its queries' rows instead (B, 1, T, 1)."""
    keep = site.keep
    if site.causal or not site.self_attention or keep is None or np.ndim(keep) != 4 or keep.shape[2] != 1:
        return []
    return [("padding masks the queries' rows instead of the keys' columns", {"keep": keep.transpose(0, 1, 3, 2)})]


ATTENTION_MISTAKES = (
    _attention(
        "rope.applied_to_v",
        "the values rotated too: RoPE rotates queries and keys only",
        _only(
            lambda s: s.rope,
            ("the values rotated too; RoPE rotates queries and keys only", {"rope_v": True}),
            # a model in Meta's pairing: its v rows are not read in that order
            (
                "the values rotated too (in pairs 2i, 2i + 1); RoPE rotates queries and keys only",
                {"rope_v": "interleaved"},
            ),
            ("the values rotated too (in halves i, i + Dh/2); RoPE rotates queries and keys only", {"rope_v": "half"}),
        ),
    ),
    _attention(
        "rope.mixed_pairing",
        "queries and keys rotated with different pairings: halves (i, i + Dh/2) and pairs (2i, 2i+1)",
        lambda s: [(MIXED, {"pairs": p}) for p in (("half", "interleaved"), ("interleaved", "half"))] if s.rope else [],
    ),
    _attention(
        "rope.position_offset",
        "keys rotated at positions offset from the queries': scores see n - m + 1, not n - m",
        _only(
            lambda s: s.rope,
            ("keys rotated one position ahead of the queries (m + 1)", {"k_shift": 1}),
            ("keys rotated one position behind the queries (m - 1)", {"k_shift": -1}),
        ),
    ),
    _attention(
        "attention.kv_heads_tiled",
        "K/V heads tiled (.repeat: head h reads h % n_kv), not repeat_interleave (h // n_rep)",
        _only(
            lambda s: s.gqa,
            (
                "K/V heads repeated by tiling (.repeat: query head h reads K/V head h % n_kv), not repeat_interleave",
                {"tile": True},
            ),
        ),
    ),
    _attention(
        "attention.wrong_scale",
        "scores = Q K^T / c with c != sqrt(d_head)",
        lambda s: [
            (f"scores divided by {origin}; expected sqrt(d_head) = {math.sqrt(s.Dh):.3g}", {"divisor": divisor})
            for divisor, origin in VR.scale_divisors(s.D, s.Dh).items()
        ],
    ),
    _attention(
        "attention.heads_without_transpose",
        "(B, T, D).view(B, H, T, Dh) without the transpose: heads mix positions",
        lambda s: [
            ("heads split by a reshape without the transpose", {"transpose": False}),
            ("heads split by a reshape without the transpose (merged back with it)", {"transpose": "split"}),
            ("heads merged back by a reshape without the transpose (split with it)", {"transpose": "merge"}),
        ],
    ),
    _attention(
        "attention.softmax_wrong_axis",
        "softmax over queries (dim=-2) instead of keys (dim=-1)",
        lambda s: [("softmax over the queries (dim=-2) instead of the keys", {"axis": -2, "mask_mode": "fill"})],
    ),
    _attention(
        "attention.mask_after_softmax",
        "P = softmax(S) then P[masked] = 0, instead of S[masked] = -inf before softmax",
        _only(
            lambda s: s.keep is not None,
            ("masked probabilities zeroed after the softmax (not renormalised)", {"mask_mode": "after"}),
            ("masked probabilities zeroed after the softmax, then renormalised", {"mask_mode": "after_renorm"}),
        ),
    ),
    _attention(
        "attention.mask_ignored",  # a causal attention that applies no mask is attention.not_causal
        "the mask is passed in but never applied: P = softmax(S) over every key",
        _only(
            lambda s: s.keep is not None and not s.causal,
            ("the mask is passed in but never applied", {"mask_mode": "ignored"}),
        ),
    ),
    _attention(
        "attention.mask_inverted",
        "the mask's polarity flipped: the kept keys are masked and the masked ones kept",
        _inverted,
    ),
    _attention(
        "attention.not_causal",
        "the decoder's self-attention sees the future: no causal mask",
        _causal("no causal mask: every query sees the future", None),
    ),
    _attention(
        "attention.causal_hides_diagonal",
        "causal mask j < i instead of j <= i: a query cannot see its own position",
        _causal("causal mask j < i: a query cannot see itself", -1),
    ),
    _attention(
        "attention.causal_shows_next",
        "causal mask j <= i + 1 instead of j <= i: a query sees one future position",
        _causal("causal mask j <= i + 1: a query sees the next position", 1),
    ),
    _attention(
        "attention.masks_swapped",
        "the decoder's self-attention gets the source mask and cross-attention the target's",
        _masks_swapped,
    ),
    _attention(
        "attention.padding_on_queries",
        "padding masks query rows instead of key columns",
        _padding_on_queries,
    ),
    _attention(
        "attention.softcap_without_division",
        "cap * tanh(S) instead of cap * tanh(S / cap): the scores squashed at the wrong scale",
        _only(
            lambda s: s.softcap is not None,
            (
                "the soft cap's tanh reads the scores undivided: cap * tanh(S), not cap * tanh(S / cap)",
                {"cap_mode": "undivided"},
            ),
        ),
    ),
    _attention(
        "attention.softcap_after_softmax",
        "cap * tanh(P / cap) on the probabilities instead of cap * tanh(S / cap) on the scores before the mask",
        _only(
            lambda s: s.softcap is not None,
            (
                "the soft cap applied to the probabilities after the softmax, not to the scores before it",
                {"cap_mode": "probabilities"},
            ),
        ),
    ),
    _attention(
        "attention.sink_missing",
        "the sink logit left out of the softmax's denominator: softmax(S) instead of softmax([S, s_h]) without s_h",
        _only(
            lambda s: s.sinks,
            ("the sink logit is not in the softmax's denominator (each row sums to 1)", {"sink_mode": "missing"}),
        ),
    ),
    _attention(
        "attention.q_k_swapped",
        "scores = K Q^T instead of Q K^T: each key scores the queries (the score matrix transposed)",
        _only(
            lambda s: s.self_attention,
            ("scores computed as K Q^T: the query and key projections exchanged", {"swap_qk": True}),
        ),
    ),
)
