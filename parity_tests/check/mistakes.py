"""The registry of known mistakes: one entry each, so that a new id is one entry here.

An entry gives the id (stable; report.CATALOGUE is read from here), the line of math the mistake changes, the
unit it is looked for at, and how it is found there:

- a forward unit ("attention", "layer_norm", "rms_norm", "gated_feed_forward", "embedding", "positions"): its
  variants, given the unit's Site, a list of (message template, knobs); the knobs are those of the unit's
  function in variants.py (multi_head_attention and attention_heads, layer_norm, rms_norm, gated_feed_forward,
  and for the embeddings the scale and the position table), the template is formatted with what the matcher
  knows there (eps, the activation). A unit's entries are tried in the order they are listed here; the levels
  a mistake applies to are every level whose unit it is, and the layers and models that hold that unit
  (`levels_of`);
- "backward": a test of one gradient of a hand-written pair (check.pair; backward_mistakes.py holds the tests),
  `pairs` the references it applies to (empty: every pair);
- None: found by a probe (dropout, overflow, a float32 island).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import backward_mistakes as BM
from . import variants as VR


@dataclass(frozen=True)
class Site:
    """An attention as its variants see it: d_model D, head size Dh, the reference's mask `keep` (True = may
    attend, broadcastable to (B, H, T_q, T_k), or None); for a causal self-attention (`causal`) its keys' padding
    `pad` (B, 1, 1, T) or None and the cross-attention's mask `swap`; whether it is a self-attention, whether it
    rotates queries and keys (`rope`) and has fewer K/V heads than query heads (`gqa`)."""

    D: int
    Dh: int
    keep: np.ndarray | None = None
    causal: bool = False
    pad: np.ndarray | None = None
    swap: np.ndarray | None = None
    self_attention: bool = True
    rope: bool = False
    gqa: bool = False


@dataclass(frozen=True)
class Mistake:
    id: str
    line: str  # the line of math it changes (the catalogue)
    unit: str | None = None  # the unit it is looked for at (see the module docstring); None: by a probe
    variants: Callable[[Site], list] | None = None  # Site -> [(message template, knobs)]
    pairs: tuple = ()  # "backward": the check.pair references it applies to (empty: every one)
    combines: bool = False  # also tried together with its unit's other combining mistakes (x.std() + eps)
    tests: tuple = ()  # "backward": (stage, test) pairs, test(backward_mistakes.Gradient) -> Diagnosis(es) or None

    def applies(self, unit: str, site: Site) -> list:
        """[(message template, knobs)] of this mistake at a `unit` described by `site` (none elsewhere)."""
        return self.variants(site) if self.unit == unit and self.variants is not None else []


def _causal(site: Site, mask: Callable) -> list:
    """Variants of a causal self-attention's mask: mask(T) (1, 1, T, T), with the keys' padding too when the user
    may mask it (a causal attention's padding of the target)."""
    if not site.causal:
        return []
    T = site.keep.shape[-1]
    return [mask(T) & pad for pad in [True] + ([] if site.pad is None else [site.pad])]


def _not_causal(site: Site) -> list:
    if not site.causal:
        return []
    return [("no causal mask: every query sees the future", {"keep": keep})
            for keep in [None] + ([] if site.pad is None else [site.pad])]  # fmt: skip


def _rope_v(site: Site) -> list:
    if not site.rope:
        return []
    return [
        ("the values rotated too; RoPE rotates queries and keys only", {"rope_v": True}),
        # a model in Meta's pairing: its v rows are not read in that order
        ("the values rotated too (in pairs 2i, 2i + 1); RoPE rotates queries and keys only", {"rope_v": "interleaved"}),
        ("the values rotated too (in halves i, i + Dh/2); RoPE rotates queries and keys only", {"rope_v": "half"}),
    ]


# which of the two is which depends on the map's pairing (the q and k rows read in the other order swap them)
MIXED = "queries and keys rotated with different pairings: one in halves (i, i + Dh/2), the other in pairs (2i, 2i + 1)"


def _padded_keys(site: Site) -> bool:
    return site.keep is not None and np.ndim(site.keep) == 4 and site.keep.shape[2] == 1


ATTENTION = "attention"
BACKWARD = "backward"
MISTAKES = (
    # -- attention mistakes, in the order they are tried --------------------------------------------------------
    Mistake("rope.applied_to_v", "the values rotated too: RoPE rotates queries and keys only", ATTENTION, _rope_v),
    Mistake(
        "rope.mixed_pairing",
        "queries and keys rotated with different pairings: halves (i, i + Dh/2) and pairs (2i, 2i+1)",
        ATTENTION,
        lambda s: [(MIXED, {"pairs": p}) for p in (("half", "interleaved"), ("interleaved", "half"))] if s.rope else [],
    ),
    Mistake(
        "rope.position_offset",
        "keys rotated at positions offset from the queries': scores see n - m + 1, not n - m",
        ATTENTION,
        lambda s: (
            [
                ("keys rotated one position ahead of the queries (m + 1)", {"k_shift": 1}),
                ("keys rotated one position behind the queries (m - 1)", {"k_shift": -1}),
            ]
            if s.rope
            else []
        ),
    ),  # fmt: skip
    Mistake(
        "attention.kv_heads_tiled",
        "K/V heads tiled (.repeat: head h reads h % n_kv), not repeat_interleave (h // n_rep)",
        ATTENTION,
        lambda s: (
            [
                (
                    "K/V heads repeated by tiling (.repeat: query head h reads K/V head h % n_kv), "
                    "not repeat_interleave",
                    {"tile": True},
                )
            ]
            if s.gqa
            else []
        ),
    ),  # fmt: skip
    Mistake(
        "attention.wrong_scale",
        "scores = Q K^T / c with c != sqrt(d_head)",
        ATTENTION,
        lambda s: [
            (f"scores divided by {origin}; expected sqrt(d_head) = {math.sqrt(s.Dh):.3g}", {"divisor": divisor})
            for divisor, origin in VR.scale_divisors(s.D, s.Dh).items()
        ],
    ),
    Mistake(
        "attention.heads_without_transpose",
        "(B, T, D).view(B, H, T, Dh) without the transpose: heads mix positions",
        ATTENTION,
        lambda s: [
            ("heads split by a reshape without the transpose", {"transpose": False}),
            ("heads split by a reshape without the transpose (merged back with it)", {"transpose": "split"}),
            ("heads merged back by a reshape without the transpose (split with it)", {"transpose": "merge"}),
        ],
    ),
    Mistake(
        "attention.softmax_wrong_axis",
        "softmax over queries (dim=-2) instead of keys (dim=-1)",
        ATTENTION,
        lambda s: [("softmax over the queries (dim=-2) instead of the keys", {"axis": -2, "mask_mode": "fill"})],
    ),
    Mistake(
        "attention.mask_after_softmax",
        "P = softmax(S) then P[masked] = 0, instead of S[masked] = -inf before softmax",
        ATTENTION,
        lambda s: (
            [
                ("masked probabilities zeroed after the softmax (not renormalised)", {"mask_mode": "after"}),
                ("masked probabilities zeroed after the softmax, then renormalised", {"mask_mode": "after_renorm"}),
            ]
            if s.keep is not None
            else []
        ),
    ),  # fmt: skip
    Mistake(
        "attention.mask_ignored",
        "the mask is passed in but never applied: P = softmax(S) over every key",
        ATTENTION,  # a causal attention that applies no mask is attention.not_causal
        lambda s: (
            [("the mask is passed in but never applied", {"mask_mode": "ignored"})]
            if s.keep is not None and not s.causal
            else []
        ),
    ),  # fmt: skip
    Mistake(
        "attention.mask_inverted",
        "the mask's polarity flipped: the kept keys are masked and the masked ones kept",
        ATTENTION,
        lambda s: (
            [("the mask's polarity is flipped", {"keep": ~s.keep})] if s.keep is not None and not s.causal else []
        ),
    ),
    Mistake(
        "attention.not_causal", "the decoder's self-attention sees the future: no causal mask", ATTENTION, _not_causal
    ),
    Mistake(
        "attention.causal_hides_diagonal",
        "causal mask j < i instead of j <= i: a query cannot see its own position",
        ATTENTION,
        lambda s: [
            ("causal mask j < i: a query cannot see itself", {"keep": keep})
            for keep in _causal(s, lambda T: np.tril(np.ones((T, T), bool), -1)[None, None])
        ],
    ),  # fmt: skip
    Mistake(
        "attention.causal_shows_next",
        "causal mask j <= i + 1 instead of j <= i: a query sees one future position",
        ATTENTION,
        lambda s: [
            ("causal mask j <= i + 1: a query sees the next position", {"keep": keep})
            for keep in _causal(s, lambda T: np.tril(np.ones((T, T), bool), 1)[None, None])
        ],
    ),  # fmt: skip
    Mistake(
        "attention.masks_swapped",
        "the decoder's self-attention gets the source mask and cross-attention the target's",
        ATTENTION,
        lambda s: (
            [("self-attention got the source's padding mask (and cross-attention the causal one)", {"keep": s.swap})]
            if s.causal and s.swap is not None and s.swap.shape[-1] == s.keep.shape[-1]
            else []
        ),
    ),  # fmt: skip
    Mistake(
        "attention.padding_on_queries",
        "padding masks query rows instead of key columns",
        ATTENTION,  # (B, 1, T, 1): rows of padded queries masked instead
        lambda s: (
            [("padding masks the queries' rows instead of the keys' columns", {"keep": s.keep.transpose(0, 1, 3, 2)})]
            if not s.causal and s.self_attention and _padded_keys(s)
            else []
        ),
    ),  # fmt: skip
    Mistake(
        "attention.q_k_swapped",
        "scores = K Q^T instead of Q K^T: each key scores the queries (the score matrix transposed)",
        ATTENTION,
        lambda s: (
            [("scores computed as K Q^T: the query and key projections exchanged", {"swap_qk": True})]
            if s.self_attention
            else []
        ),
    ),  # fmt: skip
    # -- norms: each alone, then a layer norm's together (the Annotated Transformer's x.std() + eps) -------------
    Mistake(
        "layer_norm.unbiased_variance",
        "var = sum((x - mean)^2) / (n - 1) instead of / n",
        "layer_norm",
        lambda s: [
            ("the variance divides by n - 1 (torch's x.std()/x.var() default) (eps = {eps:g})", {"unbiased": True})
        ],
        combines=True,
    ),
    Mistake(
        "layer_norm.eps_outside_sqrt",
        "y = (x - mean) / (sqrt(var) + eps) instead of / sqrt(var + eps)",
        "layer_norm",
        lambda s: [
            ("eps added to the standard deviation, outside the square root (eps = {eps:g})", {"eps_outside": True})
        ],
        combines=True,
    ),
    Mistake(
        "layer_norm.wrong_axis",
        "mean and variance over the positions, the batch or everything instead of the features (dim=-1)",
        "layer_norm",
        lambda s: [
            ("mean and variance taken over the positions, not the features (dim=-1) (eps = {eps:g})", {"axis": -2}),
            ("mean and variance taken over the batch, not the features (dim=-1) (eps = {eps:g})", {"axis": 0}),
            ("mean and variance taken over every element (no dim), not the features (eps = {eps:g})", {"axis": None}),
        ],
    ),
    Mistake(
        "rms_norm.eps_outside_sqrt",
        "y = x / (sqrt(mean(x^2)) + eps) instead of x / sqrt(mean(x^2) + eps)",
        "rms_norm",
        lambda s: [
            ("eps added to the root mean square, outside the square root (eps = {eps:g})", {"eps_outside": True})
        ],
    ),
    Mistake(
        "rms_norm.wrong_axis",
        "mean(x^2) over the positions, the batch or everything instead of the features (dim=-1)",
        "rms_norm",
        lambda s: [
            ("the mean of x^2 taken over the positions, not the features (dim=-1) (eps = {eps:g})", {"axis": -2}),
            ("the mean of x^2 taken over the batch, not the features (dim=-1) (eps = {eps:g})", {"axis": 0}),
            ("the mean of x^2 taken over every element (no dim), not the features (eps = {eps:g})", {"axis": None}),
        ],
    ),
    # -- feed-forward, embeddings, positions --------------------------------------------------------------------
    Mistake(
        "gated_feed_forward.activation_on_up",
        "down(gate(x) * silu(up(x))) instead of down(silu(gate(x)) * up(x))",
        "gated_feed_forward",
        lambda s: [
            (
                "{activation} applied to the up projection, not the gate: down(gate(x) * {activation}(up(x)))",
                {"on_up": True},
            )
        ],
    ),  # fmt: skip
    Mistake(
        "embedding.missing_scale",
        "token embeddings not multiplied by sqrt(d_model)",
        "embedding",
        lambda s: [(f"token embeddings not multiplied by sqrt(d_model) = {math.sqrt(s.D):g}", {"scale": 1.0})],
    ),
    Mistake(
        "embedding.double_scale",
        "token embeddings multiplied by sqrt(d_model) twice (by d_model)",
        "embedding",
        lambda s: [(f"token embeddings multiplied by d_model = {s.D} (sqrt twice)", {"scale": float(s.D)})],
    ),
    Mistake(
        "positions.wrong_frequencies",
        "sinusoid frequencies not 1 / 10000^(2i/d)",
        "positions",
        lambda s: [("sinusoid frequencies are all 1, not 1 / 10000^(2i/d)", {"table": "wrong_frequencies"})],
    ),
    # -- found by probes ------------------------------------------------------------------------------------------
    Mistake(
        "attention.no_max_subtraction",
        "softmax = exp(s) / sum(exp(s)) without subtracting the row maximum: overflows",
    ),
    Mistake("dropout.active_in_eval", "dropout applied in evaluation mode: two calls on the same input differ"),
    Mistake(
        "dtype.float32_island", "a float64 model computes in float32 inside a submodule (x.float(), .to(torch.float32))"
    ),
    # -- a hand-written backward pass (check.pair): tests of one gradient (backward_mistakes.py), by stage ---------
    Mistake(
        "softmax.missing_row_term",
        "dx = p * dp instead of p * (dp - rowsum(dp * p)): rows of dx must sum to zero",
        BACKWARD,
        pairs=("softmax", "scaled_dot_product_attention", "multi_head_attention"),
        tests=(("structure", BM.softmax_row_term),),
    ),
    Mistake(
        "layer_norm.missing_mean_term",
        "dx = r (g - x_hat mean(g x_hat)) without - mean(g): the path through the mean",
        BACKWARD,
        pairs=("layer_norm",),
        tests=(("structure", BM.layer_norm_terms),),  # one test tells the two terms apart
    ),
    Mistake(
        "layer_norm.missing_variance_term",
        "dx = r (g - mean(g)) without - x_hat mean(g x_hat): the path through the var",
        BACKWARD,
        pairs=("layer_norm",),
        tests=(("structure", BM.layer_norm_terms),),
    ),
    Mistake(
        "embedding.repeated_ids",
        "dweight[ids] += dout (a repeated id counted once) instead of np.add.at",
        BACKWARD,
        pairs=("embedding",),
        tests=(("structure", BM.embedding_repeats),),
    ),
    Mistake("backward.sign_flipped", "a gradient with the wrong sign", BACKWARD, tests=(("sign", BM.sign_flipped),)),
    Mistake(
        "linear.weight_grad_transposed",
        "dweight = x^T dout (D_in, D_out) instead of dout^T x (D_out, D_in)",
        BACKWARD,
        tests=(("shape", BM.transposed_shape), ("transposed", BM.transposed_square)),
    ),
    Mistake(
        "linear.bias_not_summed",
        "dbias = dout (or summed over some leading axes, or averaged) instead of summed over all",
        BACKWARD,
        tests=(("shape", BM.bias_not_summed_shape), ("factor", BM.bias_averaged)),
    ),
    Mistake(
        "dropout.mask_not_reapplied",
        "dx = dout / (1 - p) without the forward's keep mask",
        BACKWARD,
        pairs=("dropout",),
        tests=(("structure", BM.dropout_mask),),
    ),
    Mistake(
        "dropout.not_rescaled",
        "dx = dout * mask without the 1 / (1 - p) the forward applied",
        BACKWARD,
        pairs=("dropout",),
        tests=(("factor", BM.dropout_not_rescaled),),
    ),
    Mistake(
        "attention.backward_missing_scale",
        "dq = dS K, dk = dS^T Q without the 1/sqrt(d_head) of S = Q K^T / sqrt(d_head)",
        BACKWARD,
        pairs=("scaled_dot_product_attention", "multi_head_attention"),
        tests=(("factor", BM.attention_scale),),
    ),
    Mistake(
        "cross_entropy.wrong_denominator",
        "dlogits divided by the wrong count (all positions, the batch, or not at all)",
        BACKWARD,
        pairs=("cross_entropy",),
        tests=(("factor", BM.cross_entropy_denominator),),
    ),
    Mistake(  # the last: a factor no entry above names
        "backward.scaled",
        "a gradient off by a constant factor (a scale missing, doubled or inverted; a mean for a sum)",
        BACKWARD,
        tests=(("factor", BM.scaled),),
    ),
)
BY_ID = {m.id: m for m in MISTAKES}
if len(BY_ID) != len(MISTAKES):
    raise RuntimeError("a mistake id is registered twice")


def variants(unit: str, site: Site, combining: bool = False) -> list:
    """(id, message template, knobs) for every registered mistake's variants at a `unit` described by `site`, in
    registry order; `combining`: only those that are also tried together."""
    chosen = [m for m in MISTAKES if m.combines or not combining]
    return [(m.id, message, knobs) for m in chosen for message, knobs in m.applies(unit, site)]


def attention_variants(site: Site) -> list:
    """(id, message, knobs) for every registered attention mistake's variants at `site`, in registry order."""
    return variants(ATTENTION, site)


def backward_tests(reference: str, stage: str) -> list:
    """The tests of a hand-written `reference` pair's gradient at `stage`, in registry order, each once."""
    tests = []
    for m in MISTAKES:
        if m.unit == BACKWARD and (not m.pairs or reference in m.pairs):
            tests += [test for at, test in m.tests if at == stage and test not in tests]
    return tests


def levels_of(mistake: Mistake) -> tuple:
    """The levels `mistake` is looked for at: a forward unit's own level (an attention's: scaled dot-product
    attention too) and every layer, stack and model holding that unit (an embedding's or positions': models); a
    backward mistake's pairs (every pair when none are named); a probe's: every level."""
    from .level_table import LEVELS  # the levels' registry reads nothing from here: imported where needed

    if mistake.unit == "backward":
        from .pairs import PAIRS

        return mistake.pairs or tuple(PAIRS)
    units = ("attention", "heads") if mistake.unit == ATTENTION else (mistake.unit,)
    holders = ("model",) if mistake.unit in ("embedding", "positions") else ("layer", "stacks", "model")
    return tuple(
        name for name, level in LEVELS.items() if mistake.unit is None or level.unit in units or level.group in holders
    )
