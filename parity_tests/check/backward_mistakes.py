"""Mistakes in a hand-written backward pass, named per gradient by tests of the gradient itself.

mistakes.diagnose_backward runs them on each float64 gradient check.pair finds off its bar (or of the wrong shape).
The registry (mistakes.py, unit "backward") names each mistake's tests by stage; the stages, in order (the first
that finds something answers): "shape" (only when the shape is wrong), "sign", "transposed" (a square weight's
transpose), "structure" (the pair's own formula with one term missing) and "factor" (got = c expected, c by least
squares, named by where such a factor comes from in that pair; any other is backward.scaled, the last entry). A
test matches when the user's gradient equals the mistake's within MATCH (relative to its largest value): the
mistakes are exact formulas, so a match is ~1e-15 in float64.

Shape letters: B batch, H heads, T_q / T_k positions, Dh head size, N rows (every leading axis together).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from numpy_transformer import layers as L

from . import variants as VR
from .diagnosis import Diagnosis, relative

FLOAT32_MATCH = 1e-4  # a float32 gradient summed in another order
MATCH = 1e-7
STAGES = ("sign", "transposed", "structure", "factor")  # with the right shape; a wrong shape: "shape" only


@dataclass
class Gradient:
    """One failing gradient: the user's `got` of input `tensor` ("x", "weight", "params.q_proj.bias") and the
    reference's `expected` (float64), the case's `args` and upstream `dout`, and the tolerance of a match
    (FLOAT32_MATCH for a float32 gradient of the wrong shape, else MATCH)."""

    reference: str
    tensor: str
    got: np.ndarray
    expected: np.ndarray
    args: dict
    dout: np.ndarray
    tol: float

    def found(self, vid: str, message: str, error: float) -> Diagnosis | None:
        """The Diagnosis `vid` when `error` (the user's gradient against the mistake's) is a match, else None."""
        return Diagnosis(vid, message, f"d{self.tensor}", error) if error <= self.tol else None


def _ratio(got, basis) -> float | None:
    """c minimising |got - c basis| (None when basis is zero)."""
    norm = float((basis * basis).sum())
    return float((got * basis).sum()) / norm if norm else None


def transposed_weight(g: Gradient):
    """A weight's gradient equal to the transpose of the right one (of the transposed shape, or square)."""
    if not (g.tensor.endswith("weight") and g.got.ndim == 2 and g.got.T.shape == g.expected.shape):
        return None
    said = "the transpose of the right gradient: a weight's gradient has the weight's shape (D_out, D_in) = "
    said += f"{g.expected.shape}, dweight = dout^T @ x (summed over the rows), not x^T @ dout"
    return g.found("linear.weight_grad_transposed", said, relative(g.got.T, g.expected))


def bias_not_summed_shape(g: Gradient):
    """A bias gradient that keeps leading axes: summed over them, the right one."""
    got, expected = g.got, g.expected
    n = expected.shape[-1] if expected.ndim == 1 else None
    if not (g.tensor.endswith("bias") and n and got.ndim > 1 and got.shape[-1] == n):
        return None
    said = f"shape {got.shape} instead of {expected.shape}: every leading axis (batch and positions) shares the bias, "
    said += f"so sum dout over all of them, dout.reshape(-1, {n}).sum(axis=0)"
    # judged against the size of the terms summed: the key projection's bias has a gradient of zero (up to
    # rounding), the sum of terms that cancel
    error = relative(got.reshape(-1, n).sum(axis=0), expected, float(np.abs(got).max(initial=0.0)))
    return g.found("linear.bias_not_summed", said, error)


def sign_flipped(g: Gradient):
    said = "the wrong sign everywhere: minus the gradient (a subtraction the wrong way round, or a descent step's "
    said += "minus folded into the gradient)"
    return g.found("backward.sign_flipped", said, relative(-g.got, g.expected))


def _named_factor(g: Gradient, vid: str, known: list, other: str | None = None):
    """Stage "factor": a Diagnosis `vid` when got = c expected everywhere (c by least squares, not 1 or 0) with c
    one of `known` [(value, where it comes from)], or any c when `other` says where to look."""
    c = _ratio(g.got, g.expected)
    origin = None if c in (None, 0.0) else next((o for value, o in known if abs(c / value - 1.0) < 1e-6), other)
    if c is None or origin is None or abs(c - 1.0) < 1e-6:
        return None
    return g.found(vid, f"{c:.6g} times the right gradient, everywhere: {origin}", relative(g.got, c * g.expected))


def _d_head(args) -> int:
    return args["q"].shape[-1] if "q" in args else args["query"].shape[-1] // args["n_heads"]


def _of_scores(tensor: str) -> bool:
    """Whether `tensor`'s gradient passes through the scores' scale: the queries', the keys', their projections'."""
    return tensor in ("q", "k", "query", "key") or tensor.startswith(("params.q_proj", "params.k_proj"))


def attention_scale(g: Gradient):
    """dq, dk (and the q, k projections') off by sqrt(d_head): the scores' scale missing from their backward."""
    if not _of_scores(g.tensor):
        return None
    dh = _d_head(g.args)
    missing = f"sqrt(d_head) = sqrt({dh}): the 1/sqrt(d_head) of the scores, S = Q K^T / sqrt(d_head), "
    missing += "is missing from the backward of S (dq = dS K / sqrt(d_head), dk = dS^T Q / sqrt(d_head))"
    return _named_factor(g, "attention.backward_missing_scale", [(math.sqrt(dh), missing)])


def cross_entropy_denominator(g: Gradient):
    keep = np.asarray(g.args["targets"]) != g.args.get("ignore_index", -100)
    kept, positions, batch = int(keep.sum()), int(keep.size), int(keep.shape[0])
    known = [
        (kept / positions, f"{kept}/{positions}: divided by all {positions} positions, ignored ones included, "
         f"instead of the {kept} targets kept"),
        (float(kept), f"{kept}: not divided by the {kept} targets kept (the loss is their mean)"),
        (kept / batch, f"{kept}/{batch}: divided by the batch size {batch} instead of the {kept} targets kept"),
    ]  # fmt: skip
    return _named_factor(g, "cross_entropy.wrong_denominator", known)


def dropout_not_rescaled(g: Gradient):
    keep = 1.0 - g.args["p"]
    origin = f"1 - p = {keep:g}: the forward's 1/(1 - p) is missing: dx = dout * mask / (1 - p)"
    return _named_factor(g, "dropout.not_rescaled", [(keep, origin)])


def _averaged(g: Gradient) -> tuple:
    """(1/N, where it comes from): a parameter's gradient averaged over the N rows it sums over (every leading
    axis of the input)."""
    name = next((name for name in ("x", "query", "logits") if name in g.args), None)
    n = int(np.prod(np.shape(g.args[name])[:-1])) if name else int(np.prod(g.expected.shape[:-1])) or 1
    return 1 / n, f"1/{n}: averaged over the {n} rows instead of summed"


def bias_averaged(g: Gradient):
    return _named_factor(g, "linear.bias_not_summed", [_averaged(g)]) if g.tensor.endswith("bias") else None


def scaled(g: Gradient):
    """Any other constant factor, named where the pair explains it (a scale applied twice, a mean for a sum)."""
    known = []
    if g.reference in ("scaled_dot_product_attention", "multi_head_attention"):
        dh = _d_head(g.args)
        if _of_scores(g.tensor):
            known.append((1 / math.sqrt(dh), f"1/sqrt(d_head) = 1/sqrt({dh}): the scale applied twice"))
        known.append((float(dh), f"d_head = {dh}: a scale of 1/d_head where 1/sqrt belongs"))
    if g.tensor.endswith("weight"):
        known.append(_averaged(g))
    known += [(2.0, "a term counted twice, or a 1/2 forgotten"),
              (0.5, "a 1/2 too many, or a term counted once that appears twice")]  # fmt: skip
    return _named_factor(g, "backward.scaled", known, "look for a scale applied twice, missing or inverted")


def _per_row_fit(err, basis) -> float:
    """Stage "structure": how far err is from a per-row combination of the basis arrays (each the shape of err),
    relative to err."""
    D = err.shape[-1]
    e = err.reshape(-1, D)
    A = np.stack([np.broadcast_to(b, err.shape).reshape(-1, D) for b in basis], axis=-1)  # (N, D, k)
    coef = np.stack([np.linalg.lstsq(a, row, rcond=None)[0] for a, row in zip(A, e, strict=True)])  # (N, k)
    residual = e - np.einsum("ndk,nk->nd", A, coef)
    scale = float(np.abs(e).max(initial=0.0))
    return float(np.abs(residual).max(initial=0.0)) / scale if scale > 0 else math.inf


def softmax_row_term(g: Gradient):
    """softmax's dx off by p times one number per row; in attention, dS = P * dP (the row term missing)."""
    if g.reference != "softmax":  # attention: dS = P * dP, the pair's gradients by input name
        variant = _attention_without_row_term(g.reference, g.args, g.dout)
        if g.tensor not in variant:
            return None
        said = "the softmax's backward misses its row term: dS = P * (dP - sum(dP * P, axis=-1, keepdims=True)), "
        said += "not P * dP (every row of dS must sum to zero)"
        return g.found("softmax.missing_row_term", said, relative(g.got, variant[g.tensor]))
    p, _ = L.softmax_forward(g.args["x"], g.args.get("mask"))
    sums = float(np.abs(g.got.sum(axis=-1)).max())
    said = "off by p times one number per row: the row term is missing or wrong, dx = p * (dout - sum(dout * p, "
    said += f"axis=-1, keepdims=True)), and every row of dx must sum to zero (yours sum to up to {sums:.2e})"
    return g.found("softmax.missing_row_term", said, _per_row_fit(g.got - g.expected, [p]))


def layer_norm_terms(g: Gradient):
    """Layer norm's dx off by a + b x_hat per row: the mean term, the variance term, or both missing."""
    if g.tensor != "x":
        return None
    x_hat = L.layer_norm_forward(**g.args)[1].x_hat  # args: the pair's inputs, x, weight, bias, eps
    err, ones = g.got - g.expected, np.ones_like(x_hat)
    error = _per_row_fit(err, [ones, x_hat])
    if error > MATCH:
        return None
    terms = {
        "layer_norm.missing_mean_term": "- mean(g), the path through the mean (each row of dx must sum to zero)",
        "layer_norm.missing_variance_term": "- x_hat * mean(g * x_hat), the path through the variance (each row of "
        "dx must be orthogonal to x_hat)",
    }
    alone = [i for i, basis in zip(terms, (ones, x_hat), strict=True) if _per_row_fit(err, [basis]) <= MATCH]
    said = "dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)) with g = dout * weight: {} is missing or wrong"
    return [g.found(i, said.format(terms[i]), error) for i in alone[:1] or terms]  # one term missing alone, else both


def embedding_repeats(g: Gradient):
    ids = np.asarray(g.args["ids"])
    once = np.zeros(g.expected.shape)
    once[ids] += g.dout  # a repeated id keeps one of its rows of dout: the mistake itself
    values, counts = np.unique(ids, return_counts=True)
    repeated = ", ".join(f"{v} ({c}x)" for v, c in zip(values, counts, strict=True) if c > 1)
    said = f"dweight[ids] += dout counts a repeated id once (ids here: {repeated}): use np.add.at(dweight, ids, dout)"
    return g.found("embedding.repeated_ids", said, relative(g.got, once))


def _attention_core(q, k, v, mask, do):
    scale = 1.0 / math.sqrt(q.shape[-1])
    p, _ = L.softmax_forward(q @ np.swapaxes(k, -1, -2) * scale, mask)  # (B, H, T_q, T_k)
    dv = np.swapaxes(p, -1, -2) @ do
    ds = p * (do @ np.swapaxes(v, -1, -2)) * scale  # the mistake: dS = P * dP
    return ds @ k, np.swapaxes(ds, -1, -2) @ q, dv


def _attention_without_row_term(reference, args, dout) -> dict:
    """The pair's gradients, by input name, with the softmax's backward missing its row term."""
    if reference == "scaled_dot_product_attention":
        return dict(zip("qkv", _attention_core(args["q"], args["k"], args["v"], args.get("mask"), dout), strict=True))
    p, H, D = args["params"], args["n_heads"], args["query"].shape[-1]
    names = (("query", "q"), ("key", "k"), ("value", "v"))
    heads = [VR.split(VR.linear(args[name], p, f"{short}_proj"), H) for name, short in names]  # (B, H, T, Dh)
    dheads = _attention_core(*heads, args.get("attn_mask"), VR.split(dout @ p["out_proj.weight"], H))
    grads = {}
    for (name, short), dh in zip(names, dheads, strict=True):
        d = VR.merge(dh)  # (B, T, D)
        grads[name] = d @ p[f"{short}_proj.weight"]
        grads[f"params.{short}_proj.weight"] = d.reshape(-1, D).T @ args[name].reshape(-1, D)
        grads[f"params.{short}_proj.bias"] = d.reshape(-1, D).sum(axis=0)
    return grads


def dropout_mask(g: Gradient):
    """dx = dout times a constant: the forward's keep mask not applied."""
    if np.all(g.args["keep_mask"]):
        return None
    c = _ratio(g.got, g.dout) or 0.0
    scale = "" if abs(c * (1 - g.args["p"]) - 1) < 1e-6 else f" (and the scale is {c:.6g}, not 1/(1 - p))"
    said = "dout times a constant: the forward's keep mask is not applied, so the dropped units get a gradient, "
    said += f"dx = dout * keep_mask / (1 - p){scale}"
    return g.found("dropout.mask_not_reapplied", said, relative(g.got, c * g.dout))
