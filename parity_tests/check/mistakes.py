"""The registry of known mistakes, one entry each (a new id is one entry here): its id (stable; report.CATALOGUE
reads it), the line of math it changes, the unit it is looked for at, and how it is found there:

- a forward unit ("attention", "layer_norm", "rms_norm", "gated_feed_forward", "embedding", "positions"): its
  variants, (message template, knobs) at the unit's Site (diagnosis.py), the knobs those of the unit's function in
  variants.py, the template formatted with the eps and activation the matcher read; tried in registry order,
  where `report.levels_of` says;
- "backward": tests of one gradient of a hand-written pair (check.pair; backward_mistakes.py), `pairs` the
  references it applies to (empty: every pair);
- None: found by a probe (dropout, overflow, a float32 island)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from numpy_transformer.attention import rope_frequencies

from . import backward_mistakes as BM
from .diagnosis import Mistake, Site

__all__ = ["ATTENTION", "BACKWARD", "MISTAKES", "BY_ID", "Mistake", "Site", "variants"]

ATTENTION, BACKWARD = "attention", "backward"


def _at(mistake_id: str, line: str, *variants, unit=ATTENTION, when: Callable | None = None, **fields) -> Mistake:
    """An entry looked for at a forward `unit`: its `variants` (message template, knobs), tried at a Site where
    `when` holds (at every one when None), or one function Site -> [(message template, knobs)]."""

    def fixed(site: Site) -> list:
        return [(message, dict(knobs)) for message, knobs in variants] if when is None or when(site) else []

    return Mistake(mistake_id, line, unit, variants[0] if callable(variants[0]) else fixed, **fields)


def _backward(mistake_id: str, line: str, *tests: tuple, pairs: tuple = ()) -> Mistake:
    return Mistake(mistake_id, line, BACKWARD, pairs=pairs, tests=tests)


def _triangle(site: Site, message: str, triangle: np.ndarray) -> list:
    """A causal mask (T, T) as the variant's keep (1, 1, T, T), alone and with the target's padding if it has one."""
    pads = [True] if site.pad is None else [True, site.pad]
    return [(message, {"keep": triangle[None, None] & pad}) for pad in pads]


def _causal(message: str, diagonal: int | None) -> Callable[[Site], list]:
    """A causal self-attention's variants: its mask tril(diagonal), or none (diagonal None) or the padding alone;
    within a sliding window's band where the site has one (the keys its keep hides below the triangle); and no
    causal half of a window's band (diagonal None) also as the band mirrored: the window on both sides, |i - j| < W."""

    def variants(site: Site) -> list:
        if not site.causal:
            return []
        T = site.keep.shape[-1]  # type: ignore[union-attr]  # a causal site's keep is (1, 1, T, T), never None
        window = site.keep[0, 0]  # type: ignore[index]
        band = window | np.triu(np.ones((T, T), bool), 1)  # all True: no window
        if diagonal is None and band.all():  # no mask, or the 0/1 causal keep added to the scores: +1 is no -inf
            added = f"{message} (the 0/1 causal mask added to the scores: +1 seen, 0 hidden)"
            added = _triangle(site, added, np.tril(band))
            unmasked = [(message, {"keep": keep}) for keep in ([None] if site.pad is None else [None, site.pad])]
            return unmasked + [(words, knobs | {"mask_mode": "added"}) for words, knobs in added]
        if diagonal is None:
            mirrored = "the window's band without its causal half: |i - j| < W"
            return _triangle(site, message, band) + _triangle(site, mirrored, window | window.T)
        return _triangle(site, message, band & np.tril(np.ones((T, T), bool), diagonal))

    return variants


def _masks_swapped(site: Site) -> list:
    """A causal self-attention given the cross-attention's padding mask, where the two have the same keys."""
    if not site.causal or site.swap is None or site.keep is None or site.swap.shape[-1] != site.keep.shape[-1]:
        return []
    return [("self-attention got the source's padding mask (and cross-attention the causal one)", {"keep": site.swap})]


def _inverted(site: Site) -> list:
    """A mask's polarity flipped; an encoder's padding flipped within its local band (a layer the recording could
    not read the band of: its flipped mask hid every key there); a causal mask's triangle too: triu for tril (each
    query sees itself and the future, not the past), or the causal keep negated (only the future)."""
    if site.keep is None or not site.causal:
        flipped = [] if site.keep is None else [("the mask's polarity is flipped", {"keep": ~site.keep})]
        if site.band is None or site.keep is None:
            return flipped
        padding = site.keep.any(-2, keepdims=True)  # the keys some query sees: the real ones (a band sees itself)
        inside = "the padding mask's polarity is flipped inside the local band"
        return flipped + [(inside, {"keep": ~padding & site.band})]
    ones = np.ones((site.keep.shape[-1],) * 2, bool)
    flipped = "the causal mask's triangle flipped (triu for tril): a query sees itself and the future"
    future = "the causal mask's polarity flipped: each query sees only the future"
    return _triangle(site, flipped, np.triu(ones)) + _triangle(site, future, np.triu(ones, 1))


def _padding_on_queries(site: Site) -> list:
    """A self-attention's padding of its keys (B, 1, 1, T) put on its queries' rows instead (B, 1, T, 1)."""
    keep = site.keep
    if site.causal or not site.self_attention or keep is None or np.ndim(keep) != 4 or keep.shape[2] != 1:
        return []
    return [("padding masks the queries' rows instead of the keys' columns", {"keep": keep.transpose(0, 1, 3, 2)})]


def _divisors(site: Site) -> list:
    """The divisors of the scores a user may have written instead of the one expected (the config's stated divisor,
    else sqrt(d_head)), each with its origin; where two origins give the same number the first one listed names it.
    Under a stated divisor, sqrt(d_head) itself is one: the default kept where the stated scale belongs."""
    D, Dh = site.D, site.Dh
    root = math.sqrt(Dh)
    stated = [] if site.divisor is None else [(root, f"sqrt(d_head) = {root:.3g}: the default, not the config's")]
    candidates = stated + [
        (Dh, f"d_head = {Dh}: the root is missing"),
        (Dh / 2, f"d_head / 2 = {Dh / 2:g}: `d_head ** 1/2` parses as `(d_head ** 1) / 2`"),
        (D / 2, f"d_model / 2 = {D / 2:g}: `d_model ** 1/2` parses as `(d_model ** 1) / 2`"),
        (math.sqrt(D), f"sqrt(d_model) = {math.sqrt(D):.3g}: the model width instead of the head's"),
        (D, f"d_model = {D}: the model width, and no root"),
        (1.0, "1: no scaling at all"),
    ]
    if site.H and not math.isclose(D / site.H, Dh):  # the root of D / H where the head's width is set apart
        other = math.sqrt(D / site.H)
        candidates.append((other, f"sqrt(d_model / n_heads) = {other:.3g}: not this model's head width"))
        inner = math.sqrt(site.H * Dh)  # the heads' joint width where it is not d_model's (x-transformers' inner_dim)
        candidates.append((inner, f"sqrt(n_heads * d_head) = {inner:.3g}: the heads' joint width, not one head's"))
    found: dict = {}
    divisor = root if site.divisor is None else site.divisor
    for value, origin in candidates:
        same = next((v for v in found if math.isclose(value, v)), value)  # the first value listed that is this one
        if not math.isclose(value, divisor):
            found[same] = f"{found[same]}; or {origin}" if same in found else origin
    said = "sqrt(d_head)" if site.divisor is None else "the config's 1 / attention_scale"
    expected = f"expected {said} = {divisor:.3g}"
    return [(f"scores divided by {origin}; {expected}", {"divisor": value}) for value, origin in found.items()]


def _factor_left_off(site: Site) -> list:
    """A scaled RoPE whose cos and sin carry an attention factor m other than 1 (YaRN's, LongRoPE's) run without it:
    the scores 1 / m^2 of the reference's. m does not depend on the base (rope_frequencies' at 10000)."""
    if site.scaling is None:
        return []
    s, max_len = site.scaling
    m = rope_frequencies(site.Dh, 10000.0, s, max_len, max_len)[1]
    if math.isclose(m, 1.0):
        return []
    message = f"cos and sin not multiplied by the {s.rope_type} scaling's attention factor m = {m:.4g}: the scores "
    message += f"1 / m^2 = {m**-2:.4g} of the reference's"
    return [(message, {"scaling": (dataclasses.replace(s, attention_factor=1.0), max_len)})]


def _wrong_axis(statistic: str) -> tuple:
    """A norm's `statistic` taken over the positions, the batch or every element instead of the features."""
    over = (
        (-2, "the positions, not the features (dim=-1)"),
        (0, "the batch, not the features (dim=-1)"),
        (None, "every element (no dim), not the features"),
    )
    return tuple((f"{statistic} taken over {where} (eps = {{eps:g}})", {"axis": axis}) for axis, where in over)


ROTATED_V = "the values rotated too{}; RoPE rotates queries and keys only"
# which of the two is which depends on the map's pairing (the q and k rows read in the other order swap them)
MIXED = "queries and keys rotated with different pairings: one in halves (i, i + Dh/2), the other in pairs (2i, 2i + 1)"

MISTAKES = (
    # -- attention, in the order its variants are tried -----------------------------------------------------------
    _at(
        "rope.applied_to_v",
        "the values rotated too: RoPE rotates queries and keys only",
        (ROTATED_V.format(""), {"rope_v": True}),
        (ROTATED_V.format(" (in pairs 2i, 2i + 1)"), {"rope_v": "interleaved"}),  # Meta's pairing: v read otherwise
        (ROTATED_V.format(" (in halves i, i + Dh/2)"), {"rope_v": "half"}),
        when=lambda s: s.rope,
    ),
    _at(
        "rope.mixed_pairing",
        "queries and keys rotated with different pairings: halves (i, i + Dh/2) and pairs (2i, 2i+1)",
        (MIXED, {"pairs": ("half", "interleaved")}),
        (MIXED, {"pairs": ("interleaved", "half")}),
        when=lambda s: s.rope,
    ),
    _at(
        "rope.position_offset",
        "keys rotated at positions offset from the queries': scores see n - m + 1, not n - m",
        ("keys rotated one position ahead of the queries (m + 1)", {"k_shift": 1}),
        ("keys rotated one position behind the queries (m - 1)", {"k_shift": -1}),
        when=lambda s: s.rope,
    ),
    _at(
        "rope.attention_factor_missing",
        "cos and sin of a scaled RoPE (YaRN, LongRoPE) not multiplied by its attention factor m: scores / m^2",
        _factor_left_off,
    ),
    _at(
        "attention.kv_heads_tiled",
        "K/V heads tiled (.repeat: head h reads h % n_kv), not repeat_interleave (h // n_rep)",
        (
            "K/V heads repeated by tiling (.repeat: query head h reads K/V head h % n_kv), not repeat_interleave",
            {"tile": True},
        ),
        when=lambda s: s.gqa,
    ),
    _at("attention.wrong_scale", "scores = Q K^T / c with c != sqrt(d_head)", _divisors),
    _at(
        "attention.heads_without_transpose",
        "(B, T, D).view(B, H, T, Dh) without the transpose: heads mix positions",
        ("heads split by a reshape without the transpose", {"transpose": False}),
        ("heads split by a reshape without the transpose (merged back with it)", {"transpose": "split"}),
        ("heads merged back by a reshape without the transpose (split with it)", {"transpose": "merge"}),
    ),
    _at(
        "attention.softmax_wrong_axis",
        "softmax over queries (dim=-2) instead of keys (dim=-1)",
        ("softmax over the queries (dim=-2) instead of the keys", {"axis": -2, "mask_mode": "fill"}),
        ("softmax over the queries, a mask added to the scores (it cancels)", {"axis": -2, "mask_mode": "ignored"}),
    ),
    _at(
        "attention.mask_after_softmax",
        "P = softmax(S) then P[masked] = 0, instead of S[masked] = -inf before softmax",
        ("masked probabilities zeroed after the softmax (not renormalised)", {"mask_mode": "after"}),
        ("masked probabilities zeroed after the softmax, then renormalised", {"mask_mode": "after_renorm"}),
        when=lambda s: s.keep is not None,
    ),
    _at(
        "attention.mask_ignored",  # a causal attention that applies no mask is attention.not_causal
        "the mask is passed in but never applied: P = softmax(S) over every key (or softmax(S + m), its 0/1 added)",
        ("the mask is passed in but never applied", {"mask_mode": "ignored"}),
        (
            "the 0/1 keep mask added to the scores (+1 kept, 0 hidden), not -inf at the hidden keys",
            {"mask_mode": "added"},
        ),
        when=lambda s: s.keep is not None and not s.causal,
    ),
    _at(
        "attention.mask_inverted",
        "the mask's polarity flipped: the kept keys are masked and the masked ones kept",
        _inverted,
    ),
    _at(
        "attention.not_causal",
        "the decoder's self-attention sees the future: no causal mask",
        _causal("no causal mask: every query sees the future", None),
    ),
    _at(
        "attention.causal_hides_diagonal",
        "causal mask j < i instead of j <= i: a query cannot see its own position",
        _causal("causal mask j < i: a query cannot see itself", -1),
    ),
    _at(
        "attention.causal_shows_next",
        "causal mask j <= i + 1 instead of j <= i: a query sees one future position",
        _causal("causal mask j <= i + 1: a query sees the next position", 1),
    ),
    _at(
        "attention.masks_swapped",
        "the decoder's self-attention gets the source mask and cross-attention the target's",
        _masks_swapped,
    ),
    _at("attention.padding_on_queries", "padding masks query rows instead of key columns", _padding_on_queries),
    _at(
        "attention.softcap_without_division",
        "cap * tanh(S) instead of cap * tanh(S / cap): the scores squashed at the wrong scale",
        (
            "the soft cap's tanh reads the scores undivided: cap * tanh(S), not cap * tanh(S / cap)",
            {"cap_mode": "undivided"},
        ),
        when=lambda s: s.softcap is not None,
    ),
    _at(
        "attention.softcap_after_softmax",
        "cap * tanh(P / cap) on the probabilities instead of cap * tanh(S / cap) on the scores before the mask",
        (
            "the soft cap applied to the probabilities after the softmax, not to the scores before it",
            {"cap_mode": "probabilities"},
        ),
        when=lambda s: s.softcap is not None,
    ),
    _at(
        "attention.sink_missing",
        "the sink logit left out of the softmax's denominator: softmax(S) instead of softmax([S, s_h]) without s_h",
        ("the sink logit is not in the softmax's denominator (each row sums to 1)", {"sink_mode": "missing"}),
        when=lambda s: s.sinks,
    ),
    _at(
        "attention.q_k_swapped",
        "scores = K Q^T instead of Q K^T: each key scores the queries (the score matrix transposed)",
        ("scores computed as K Q^T: the query and key projections exchanged", {"swap_qk": True}),
        when=lambda s: s.self_attention,
    ),
    # -- norms: each alone, then a layer norm's together (the Annotated Transformer's x.std() + eps) -------------
    _at(
        "layer_norm.unbiased_variance",
        "var = sum((x - mean)^2) / (n - 1) instead of / n",
        ("the variance divides by n - 1 (torch's x.std()/x.var() default) (eps = {eps:g})", {"unbiased": True}),
        unit="layer_norm",
        combines=True,
    ),
    _at(
        "layer_norm.eps_outside_sqrt",
        "y = (x - mean) / (sqrt(var) + eps) instead of / sqrt(var + eps)",
        ("eps added to the standard deviation, outside the square root (eps = {eps:g})", {"eps_outside": True}),
        unit="layer_norm",
        combines=True,
    ),
    _at(
        "layer_norm.wrong_axis",
        "mean and variance over the positions, the batch or everything instead of the features (dim=-1)",
        *_wrong_axis("mean and variance"),
        unit="layer_norm",
    ),
    _at(
        "rms_norm.eps_outside_sqrt",
        "y = x / (sqrt(mean(x^2)) + eps) instead of x / sqrt(mean(x^2) + eps)",
        ("eps added to the root mean square, outside the square root (eps = {eps:g})", {"eps_outside": True}),
        unit="rms_norm",
    ),
    _at(
        "rms_norm.wrong_axis",
        "mean(x^2) over the positions, the batch or everything instead of the features (dim=-1)",
        *_wrong_axis("the mean of x^2"),
        unit="rms_norm",
    ),
    # -- feed-forward, embeddings, positions --------------------------------------------------------------------
    _at(
        "gated_feed_forward.activation_on_up",
        "down(gate(x) * silu(up(x))) instead of down(silu(gate(x)) * up(x))",
        (
            "{activation} applied to the up projection, not the gate: down(gate(x) * {activation}(up(x)))",
            {"on_up": True},
        ),
        unit="gated_feed_forward",
    ),
    _at(
        "embedding.missing_scale",
        "token embeddings not multiplied by sqrt(d_model)",
        lambda s: [(f"token embeddings not multiplied by sqrt(d_model) = {math.sqrt(s.D):g}", {"scale": 1.0})],
        unit="embedding",
        # not in BERT's family (an embedding norm, a token-type table), which never scales: no scale is its own
        plausible=lambda cfg: not (cfg.embedding_norm or cfg.type_vocab_size),
    ),
    _at(
        "embedding.double_scale",
        "token embeddings multiplied by sqrt(d_model) twice (by d_model)",
        lambda s: [(f"token embeddings multiplied by d_model = {s.D} (sqrt twice)", {"scale": float(s.D)})],
        unit="embedding",
    ),
    _at(
        "positions.wrong_frequencies",
        "sinusoid frequencies not 1 / 10000^(2i/d)",
        ("sinusoid frequencies are all 1, not 1 / 10000^(2i/d)", {"table": "wrong_frequencies"}),
        unit="positions",
    ),
    # -- found by probes ------------------------------------------------------------------------------------------
    Mistake(
        "attention.no_max_subtraction", "softmax = exp(s) / sum(exp(s)) without subtracting the row maximum: overflows"
    ),
    Mistake("dropout.active_in_eval", "dropout applied in evaluation mode: two calls on the same input differ"),
    Mistake(  # found by towers.py at a ViT's front end
        "positions.added_before_class_token",
        "a ViT's positions added to the patches before the class token is prepended: patch n gets row n - 1",
    ),
    Mistake(  # found where unsupported.py reads the activation's values
        "activation.quick_gelu_constant", "x * sigmoid(c x) with c other than QuickGELU's 1.702 (a mistyped constant)"
    ),
    Mistake(
        "dtype.float32_island", "a float64 model computes in float32 inside a submodule (x.float(), .to(torch.float32))"
    ),
    # -- a hand-written backward pass (check.pair): tests of one gradient (backward_mistakes.py), by stage ---------
    _backward(
        "softmax.missing_row_term",
        "dx = p * dp instead of p * (dp - rowsum(dp * p)): rows of dx must sum to zero",
        ("structure", BM.softmax_row_term),
        pairs=("softmax", "scaled_dot_product_attention", "multi_head_attention"),
    ),
    _backward(
        "layer_norm.missing_mean_term",
        "dx = r (g - x_hat mean(g x_hat)) without - mean(g): the path through the mean",
        ("structure", BM.layer_norm_terms),  # one test tells the two terms apart
        pairs=("layer_norm",),
    ),
    _backward(
        "layer_norm.missing_variance_term",
        "dx = r (g - mean(g)) without - x_hat mean(g x_hat): the path through the var",
        ("structure", BM.layer_norm_terms),
        pairs=("layer_norm",),
    ),
    _backward(
        "embedding.repeated_ids",
        "dweight[ids] += dout (a repeated id counted once) instead of np.add.at",
        ("structure", BM.embedding_repeats),
        pairs=("embedding",),
    ),
    _backward("backward.sign_flipped", "a gradient with the wrong sign", ("sign", BM.sign_flipped)),
    _backward(
        "linear.weight_grad_transposed",
        "dweight = x^T dout (D_in, D_out) instead of dout^T x (D_out, D_in)",
        ("shape", BM.transposed_weight),
        ("transposed", BM.transposed_weight),
    ),
    _backward(
        "linear.bias_not_summed",
        "dbias = dout (or summed over some leading axes, or averaged) instead of summed over all",
        ("shape", BM.bias_not_summed_shape),
        ("factor", BM.bias_averaged),
    ),
    _backward(
        "dropout.mask_not_reapplied",
        "dx = dout / (1 - p) without the forward's keep mask",
        ("structure", BM.dropout_mask),
        pairs=("dropout",),
    ),
    _backward(
        "dropout.not_rescaled",
        "dx = dout * mask without the 1 / (1 - p) the forward applied",
        ("factor", BM.dropout_not_rescaled),
        pairs=("dropout",),
    ),
    _backward(
        "attention.backward_missing_scale",
        "dq = dS K, dk = dS^T Q without the 1/sqrt(d_head) of S = Q K^T / sqrt(d_head)",
        ("factor", BM.attention_scale),
        pairs=("scaled_dot_product_attention", "multi_head_attention"),
    ),
    _backward(
        "cross_entropy.wrong_denominator",
        "dlogits divided by the wrong count (all positions, the batch, or not at all)",
        ("factor", BM.cross_entropy_denominator),
        pairs=("cross_entropy",),
    ),
    _backward(  # the last: a factor no entry above names
        "backward.scaled",
        "a gradient off by a constant factor (a scale missing, doubled or inverted; a mean for a sum)",
        ("factor", BM.scaled),
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


def diagnose_backward(reference, tensor, got, expected, args, dout) -> list:
    """The Diagnoses of the user's gradient `got` of `tensor` (none, or two where layer norm misses both terms): the
    registry's backward tests for the `reference` pair, stage by stage, each stage's in registry order, each once."""
    single = np.asarray(got).dtype == np.float32 or np.asarray(expected).dtype == np.float32
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    shaped = got.shape == expected.shape
    if shaped and not np.all(np.isfinite(got)):
        return []
    tol = BM.MATCH if shaped or not single else BM.FLOAT32_MATCH  # a wrong shape is judged in float32 too
    g = BM.Gradient(reference, tensor, got, expected, args, dout, tol)
    mine = [m for m in MISTAKES if m.unit == BACKWARD and (not m.pairs or reference in m.pairs)]
    for stage in BM.STAGES if shaped else ("shape",):
        for test in dict.fromkeys(test for m in mine for at, test in m.tests if at == stage):
            found = test(g)
            if found:
                return found if isinstance(found, list) else [found]
    return []
