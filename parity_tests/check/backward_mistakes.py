"""Mistakes in a hand-written backward pass, named per gradient by tests of the gradient itself.

check.pair calls `diagnose(reference, tensor, got, expected, args, dout)` for each float64 gradient that misses
its bar (or has the wrong shape): `got` is the user's gradient of input `tensor` ("x", "weight", "params.q_proj.bias"),
`expected` the reference's, `args` the case's inputs and `dout` the upstream gradient. The tests, in order:

- the shape: a transposed weight gradient, or a bias gradient not summed over the leading axes;
- the sign (got = -expected), a square weight's transpose;
- a constant factor (got = c expected, c found by least squares), named by where such a factor comes from in that
  pair: sqrt(d_head) in attention, the count of kept targets in cross-entropy, 1 - p in dropout, the number of
  rows where a sum became a mean, ...;
- the pair's own structure: softmax's error p_i times one number per row (the row term), layer norm's error a + b
  x_hat per row (the mean and the variance terms), `dweight[ids] += dout` in an embedding, attention without the
  softmax's row term, dropout without the mask.

A test matches when the user's gradient equals the mistake's within MATCH (relative to its largest value); the
mistakes are exact formulas, so a match is ~1e-15 in float64 and a coincidence is not.

Shape letters: B batch, H heads, T_q / T_k positions, Dh head size, N rows (every leading axis together).
"""

from __future__ import annotations

import math

import numpy as np

from numpy_transformer import layers as L

from .report import Diagnosis

FLOAT32_MATCH = 1e-4  # a float32 gradient summed in another order
MATCH = 1e-7  # the catalogue's ids for these mistakes are in report.CATALOGUE, after the forward's


def _close(a, b, floor: float = 0.0) -> float:
    """max |a - b| relative to max(max |b|, floor); inf where that is zero and a differs from b."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return math.inf
    scale = max(float(np.abs(b).max(initial=0.0)), floor)
    diff = float(np.abs(a - b).max(initial=0.0))
    return diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)


def _found(vid, tensor, message, error) -> Diagnosis:
    return Diagnosis(vid, message, f"d{tensor}", error)


def diagnose(reference, tensor, got, expected, args, dout) -> list:
    """The Diagnoses of the user's gradient `got` of `tensor` (empty when no known mistake reproduces it; two
    when layer norm misses both of its terms)."""
    single = np.asarray(got).dtype == np.float32 or np.asarray(expected).dtype == np.float32
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    if got.shape != expected.shape:  # judged in float32 too: a wrong shape is wrong in any dtype
        found = _shape_mistake(tensor, got, expected, FLOAT32_MATCH if single else MATCH)
        return [] if found is None else [found]
    if not np.all(np.isfinite(got)):
        return []
    for test in (_sign, _transposed, _pair_structure, _factor):
        found = test(reference, tensor, got, expected, args, dout)
        if found:
            return found if isinstance(found, list) else [found]
    return []


def _shape_mistake(tensor, got, expected, tol):
    if tensor.endswith("weight") and got.ndim == 2 and got.T.shape == expected.shape:
        error = _close(got.T, expected)
        if error <= tol:
            return _transposed_weight(tensor, got, expected, error)
    n = expected.shape[-1] if expected.ndim == 1 else None
    if tensor.endswith("bias") and n and got.ndim > 1 and got.shape[-1] == n:
        # judged against the size of the terms summed: the key projection's bias has a gradient of zero (up to
        # rounding), the sum of terms that cancel
        error = _close(got.reshape(-1, n).sum(axis=0), expected, float(np.abs(got).max(initial=0.0)))
        if error <= tol:
            return _found(
                "linear.bias_not_summed",
                tensor,
                f"shape {got.shape} instead of {expected.shape}: every leading axis (batch and positions) shares "
                f"the bias, so sum dout over all of them, dout.reshape(-1, {n}).sum(axis=0)",
                error,
            )
    return None


def _transposed_weight(tensor, got, expected, error):
    return _found(
        "linear.weight_grad_transposed",
        tensor,
        f"the transpose of the right gradient: a weight's gradient has the weight's shape (D_out, D_in) = "
        f"{expected.shape}, dweight = dout^T @ x (summed over the rows), not x^T @ dout",
        error,
    )


def _sign(reference, tensor, got, expected, args, dout):
    error = _close(-got, expected)
    if error <= MATCH:
        return _found(
            "backward.sign_flipped",
            tensor,
            "the wrong sign everywhere: minus the gradient (a subtraction the wrong way round, or a descent "
            "step's minus folded into the gradient)",
            error,
        )
    return None


def _transposed(reference, tensor, got, expected, args, dout):
    if tensor.endswith("weight") and got.ndim == 2 and got.shape[0] == got.shape[1]:
        error = _close(got.T, expected)
        if error <= MATCH:
            return _transposed_weight(tensor, got, expected, error)
    return None


def _factor(reference, tensor, got, expected, args, dout):
    norm = float((expected * expected).sum())
    if norm == 0.0:
        return None
    c = float((got * expected).sum()) / norm
    error = _close(got, c * expected)
    if error > MATCH or abs(c - 1.0) < 1e-6 or c == 0.0:
        return None
    known = [(vid, origin) for value, vid, origin in _known_factors(reference, tensor, args, expected)
             if abs(c / value - 1.0) < 1e-6]  # fmt: skip
    vid, origin = known[0] if known else ("backward.scaled", "look for a scale applied twice, missing or inverted")
    return _found(vid, tensor, f"{c:.6g} times the right gradient, everywhere: {origin}", error)


def _rows(args, expected) -> int:
    """N, the rows a parameter's gradient sums over: every leading axis of the input."""
    for name in ("x", "query", "logits"):
        if name in args:
            return int(np.prod(np.shape(args[name])[:-1]))
    return int(np.prod(expected.shape[:-1])) or 1


def _known_factors(reference, tensor, args, expected) -> list:
    """(value, id, where such a factor comes from) for the constant factors this pair's gradients can be off by."""
    out = []
    if reference in ("scaled_dot_product_attention", "multi_head_attention"):
        dh = args["q"].shape[-1] if "q" in args else args["query"].shape[-1] // args["n_heads"]
        root = math.sqrt(dh)
        if tensor in ("q", "k", "query", "key") or tensor.startswith(("params.q_proj", "params.k_proj")):
            missing = f"sqrt(d_head) = sqrt({dh}): the 1/sqrt(d_head) of the scores, S = Q K^T / sqrt(d_head), "
            missing += "is missing from the backward of S (dq = dS K / sqrt(d_head), dk = dS^T Q / sqrt(d_head))"
            out.append((root, "attention.backward_missing_scale", missing))
            out.append((1 / root, "backward.scaled", f"1/sqrt(d_head) = 1/sqrt({dh}): the scale applied twice"))
        out.append((float(dh), "backward.scaled", f"d_head = {dh}: a scale of 1/d_head where 1/sqrt belongs"))
    if reference == "cross_entropy":
        keep = np.asarray(args["targets"]) != args.get("ignore_index", -100)
        kept, positions, batch = int(keep.sum()), int(keep.size), int(keep.shape[0])
        wrong = "cross_entropy.wrong_denominator"
        out.append((kept / positions, wrong, f"{kept}/{positions}: divided by all {positions} positions, ignored ones "
                    f"included, instead of the {kept} targets kept"))  # fmt: skip
        out.append((float(kept), wrong, f"{kept}: not divided by the {kept} targets kept (the loss is their mean)"))
        out.append((kept / batch, wrong, f"{kept}/{batch}: divided by the batch size {batch} instead of the {kept} "
                    "targets kept"))  # fmt: skip
    if reference == "dropout":
        keep = 1.0 - args["p"]
        out.append((keep, "dropout.not_rescaled", f"1 - p = {keep:g}: the forward's 1/(1 - p) is missing: "
                    "dx = dout * mask / (1 - p)"))  # fmt: skip
    n = _rows(args, expected)
    if tensor.endswith("bias"):
        out.append((1 / n, "linear.bias_not_summed", f"1/{n}: averaged over the {n} rows instead of summed"))
    elif tensor.endswith("weight"):
        out.append((1 / n, "backward.scaled", f"1/{n}: averaged over the {n} rows instead of summed"))
    return out + [
        (2.0, "backward.scaled", "a term counted twice, or a 1/2 forgotten"),
        (0.5, "backward.scaled", "a 1/2 too many, or a term counted once that appears twice"),
    ]


def _pair_structure(reference, tensor, got, expected, args, dout):
    test = {
        "softmax": _softmax_row_term,
        "layer_norm": _layer_norm_terms,
        "embedding": _embedding_repeats,
        "scaled_dot_product_attention": _attention_row_term,
        "multi_head_attention": _attention_row_term,
        "dropout": _dropout_mask,
    }.get(reference)
    return None if test is None else test(reference, tensor, got, expected, args, dout)


def _per_row_fit(err, basis) -> float:
    """How far err is from a per-row combination of the basis arrays (each the shape of err), relative to err."""
    D = err.shape[-1]
    e = err.reshape(-1, D)
    A = np.stack([np.broadcast_to(b, err.shape).reshape(-1, D) for b in basis], axis=-1)  # (N, D, k)
    coef = np.stack([np.linalg.lstsq(a, row, rcond=None)[0] for a, row in zip(A, e, strict=True)])  # (N, k)
    residual = e - np.einsum("ndk,nk->nd", A, coef)
    scale = float(np.abs(e).max(initial=0.0))
    return float(np.abs(residual).max(initial=0.0)) / scale if scale > 0 else math.inf


def _softmax_row_term(reference, tensor, got, expected, args, dout):
    p, _ = L.softmax_forward(args["x"], args.get("mask"))
    error = _per_row_fit(got - expected, [p])
    if error > MATCH:
        return None
    sums = float(np.abs(got.sum(axis=-1)).max())
    return _found(
        "softmax.missing_row_term",
        tensor,
        "off by p times one number per row: the row term is missing or wrong, dx = p * (dout - sum(dout * p, "
        f"axis=-1, keepdims=True)), and every row of dx must sum to zero (yours sum to up to {sums:.2e})",
        error,
    )


def _layer_norm_terms(reference, tensor, got, expected, args, dout):
    if tensor != "x":
        return None
    x_hat = L.layer_norm_forward(args["x"], args["weight"], args["bias"], args["eps"])[1].x_hat
    err = got - expected
    error = _per_row_fit(err, [np.ones_like(x_hat), x_hat])
    if error > MATCH:
        return None
    mean_off = _per_row_fit(err, [np.ones_like(x_hat)]) <= MATCH
    var_off = _per_row_fit(err, [x_hat]) <= MATCH
    ids = ["layer_norm.missing_mean_term"] if mean_off else ["layer_norm.missing_variance_term"] if var_off else []
    ids = ids or ["layer_norm.missing_mean_term", "layer_norm.missing_variance_term"]
    terms = {
        "layer_norm.missing_mean_term": "- mean(g), the path through the mean (each row of dx must sum to zero)",
        "layer_norm.missing_variance_term": "- x_hat * mean(g * x_hat), the path through the variance (each row of "
        "dx must be orthogonal to x_hat)",
    }
    return [
        _found(i, tensor, f"dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)) with g = dout * weight: {terms[i]} "
               "is missing or wrong", error)
        for i in ids
    ]  # fmt: skip


def _embedding_repeats(reference, tensor, got, expected, args, dout):
    ids = np.asarray(args["ids"])
    once = np.zeros(expected.shape)
    once[ids] += dout  # a repeated id keeps one of its rows of dout: the mistake itself
    error = _close(got, once)
    if error > MATCH:
        return None
    values, counts = np.unique(ids, return_counts=True)
    repeated = ", ".join(f"{v} ({c}x)" for v, c in zip(values, counts, strict=True) if c > 1)
    return _found(
        "embedding.repeated_ids",
        tensor,
        f"dweight[ids] += dout counts a repeated id once (ids here: {repeated}): use np.add.at(dweight, ids, dout)",
        error,
    )


def _attention_row_term(reference, tensor, got, expected, args, dout):
    variant = _attention_grads(reference, args, dout, row_term=False)
    if tensor not in variant:
        return None
    error = _close(got, variant[tensor])
    if error > MATCH:
        return None
    return _found(
        "softmax.missing_row_term",
        tensor,
        "the softmax's backward misses its row term: dS = P * (dP - sum(dP * P, axis=-1, keepdims=True)), "
        "not P * dP (every row of dS must sum to zero)",
        error,
    )


def _attention_core(q, k, v, mask, do, row_term):
    scale = 1.0 / math.sqrt(q.shape[-1])
    p, _ = L.softmax_forward(q @ np.swapaxes(k, -1, -2) * scale, mask)  # (B, H, T_q, T_k)
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) if row_term else p * dp
    ds = ds * scale
    return ds @ k, np.swapaxes(ds, -1, -2) @ q, dv


def _attention_grads(reference, args, dout, row_term) -> dict:
    """The pair's gradients, by input name, with or without the softmax's row term."""
    if reference == "scaled_dot_product_attention":
        dq, dk, dv = _attention_core(args["q"], args["k"], args["v"], args.get("mask"), dout, row_term)
        return {"q": dq, "k": dk, "v": dv}
    p, H = args["params"], args["n_heads"]
    B, T_q, D = args["query"].shape

    def split(x):  # (B, T, D) -> (B, H, T, Dh)
        return x.reshape(B, x.shape[1], H, D // H).transpose(0, 2, 1, 3)

    def merge(x):  # (B, H, T, Dh) -> (B, T, D)
        return x.transpose(0, 2, 1, 3).reshape(B, x.shape[2], D)

    heads = [split(args[n] @ p[f"{s}_proj.weight"].T + p[f"{s}_proj.bias"]) for n, s in _MHA_NAMES]
    dheads = _attention_core(*heads, args.get("attn_mask"), split(dout @ p["out_proj.weight"]), row_term)
    grads = {}
    for (name, short), dh in zip(_MHA_NAMES, dheads, strict=True):
        d = merge(dh)
        grads[name] = d @ p[f"{short}_proj.weight"]
        grads[f"params.{short}_proj.weight"] = d.reshape(-1, D).T @ args[name].reshape(-1, D)
        grads[f"params.{short}_proj.bias"] = d.reshape(-1, D).sum(axis=0)
    return grads


_MHA_NAMES = (("query", "q"), ("key", "k"), ("value", "v"))


def _dropout_mask(reference, tensor, got, expected, args, dout):
    norm = float((dout * dout).sum())
    c = float((got * dout).sum()) / norm if norm else 0.0
    error = _close(got, c * dout)
    if error > MATCH or not np.any(~args["keep_mask"]):
        return None
    scale = "" if abs(c * (1 - args["p"]) - 1) < 1e-6 else f" (and the scale is {c:.6g}, not 1/(1 - p))"
    return _found(
        "dropout.mask_not_reapplied",
        tensor,
        "dout times a constant: the forward's keep mask is not applied, so the dropped units get a gradient, "
        f"dx = dout * keep_mask / (1 - p){scale}",
        error,
    )
