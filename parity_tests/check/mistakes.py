"""The registry of known mistakes: one entry each, so that a new id is one entry here.

An entry gives the id (stable; report.CATALOGUE is read from here), the line of math the mistake changes, the
unit it is looked for at, and how it is found there:

- a forward unit ("attention", whose entries are in attention_mistakes.py, "layer_norm", "rms_norm",
  "gated_feed_forward", "embedding", "positions"): its variants, given the unit's Site (diagnosis.py), a list of
  (message template, knobs); the knobs are those of the unit's
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

from . import backward_mistakes as BM
from .attention_mistakes import ATTENTION, ATTENTION_MISTAKES
from .diagnosis import Mistake, Site

__all__ = ["ATTENTION", "BACKWARD", "MISTAKES", "BY_ID", "Mistake", "Site", "variants", "attention_variants"]


BACKWARD = "backward"
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
        tests=(("shape", BM.transposed_weight), ("transposed", BM.transposed_weight)),
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
