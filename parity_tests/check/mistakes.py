"""The registry of known mistakes: one entry each, so that a new id is one entry here.

An entry gives the id (stable; report.CATALOGUE is read from here), the line of math the mistake changes, the
unit it is looked for at, and how it is found there:

- a forward unit ("attention", whose entries are in attention_mistakes.py, "layer_norm", "rms_norm",
  "gated_feed_forward", "embedding", "positions"): its variants, given the unit's Site (diagnosis.py), a list of
  (message template, knobs), the knobs those of the unit's function in variants.py (for the embeddings the scale
  and the position table), the template formatted with what the matcher knows there (eps, the activation). A
  unit's entries are tried in registry order; `report.levels_of` says where each is looked for;
- "backward": a test of one gradient of a hand-written pair (check.pair; backward_mistakes.py holds the tests),
  `pairs` the references it applies to (empty: every pair);
- None: found by a probe (dropout, overflow, a float32 island)."""

from __future__ import annotations

import math

import numpy as np

from . import backward_mistakes as BM
from .attention_mistakes import ATTENTION, ATTENTION_MISTAKES
from .diagnosis import Mistake, Site

__all__ = ["ATTENTION", "BACKWARD", "MISTAKES", "BY_ID", "Mistake", "Site", "variants"]


BACKWARD = "backward"


def _backward(mistake_id: str, line: str, *tests: tuple, pairs: tuple = ()) -> Mistake:
    """A hand-written backward's mistake: its tests of one gradient, (stage, test), and the pairs it applies to."""
    return Mistake(mistake_id, line, BACKWARD, pairs=pairs, tests=tests)


MISTAKES = ATTENTION_MISTAKES + (
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
        # not in BERT's family (an embedding norm, a token-type table), which never scales: no scale is its own
        plausible=lambda cfg: not (cfg.embedding_norm or cfg.type_vocab_size),
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


def backward_tests(reference: str, stage: str) -> list:
    """The tests of a hand-written `reference` pair's gradient at `stage`, in registry order, each once."""
    mine = [m for m in MISTAKES if m.unit == BACKWARD and (not m.pairs or reference in m.pairs)]
    return list(dict.fromkeys(test for m in mine for at, test in m.tests if at == stage))


def diagnose_backward(reference, tensor, got, expected, args, dout) -> list:
    """The Diagnoses of the user's gradient `got` of `tensor` (empty when no known mistake reproduces it; two
    when layer norm misses both of its terms): the registry's backward tests, stage by stage."""
    single = np.asarray(got).dtype == np.float32 or np.asarray(expected).dtype == np.float32
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    shaped = got.shape == expected.shape
    if shaped and not np.all(np.isfinite(got)):
        return []
    tol = BM.MATCH if shaped or not single else BM.FLOAT32_MATCH  # a wrong shape is judged in float32 too
    g = BM.Gradient(reference, tensor, got, expected, args, dout, tol)
    for stage in BM.STAGES if shaped else ("shape",):
        for test in backward_tests(reference, stage):
            found = test(g)
            if found:
                return found if isinstance(found, list) else [found]
    return []
