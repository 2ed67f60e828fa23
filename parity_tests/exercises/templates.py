"""The workbook's exercise files, as text: each a given forward pass and a backward pass to derive.

Every forward returns (out, cache); every cache holds "inputs" (the forward's own arguments, as given) and the
arrays its docstring names. The backward stubs raise NotImplementedError, which the grader reports as "not
implemented yet". The pairs follow the reference's protocol (parity_tests.check.pairs): backward(dout, cache)
returns the gradients of the differentiable inputs in the forward's order; cross_entropy's is backward(cache, dloss).
"""

from __future__ import annotations

HEADER = '''"""Exercise: the backward pass of {title}.

The forward pass is given. Write `backward` so that it returns {returns}.
Shape letters: B batch, H heads, T (T_q, T_k) positions, D d_model, Dh head size, F d_ff, V vocabulary.
Check your work with:  transformer-parity grade <this directory>
"""

import numpy as np
'''

SOFTMAX = (
    HEADER.format(title="softmax", returns="dx, the gradient of the loss with respect to x")
    + '''

def forward(x, mask=None):
    """p = softmax(x) over the last axis. x (..., T_k); mask broadcastable to x, True = may attend, or None.
    Masked entries get p = 0; a row with nothing left to attend to gets p = 0 everywhere (not NaN).
    cache: "inputs", "p" (the probabilities, the shape of x)."""
    s = x if mask is None else np.where(mask, x, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)  # a fully masked row: exp(-inf - 0) = 0, no inf - inf
    e = np.exp(s - top)  # subtracting the row maximum: no overflow at large scores
    total = e.sum(axis=-1, keepdims=True)
    p = e / np.where(total == 0.0, 1.0, total)
    return p, {"inputs": {"x": x, "mask": mask}, "p": p}


def backward(dout, cache):
    """dout: dL/dp, the shape of x. Return dx = dL/dx, the shape of x.

    Derive it from the Jacobian of softmax, dp_i/dx_j = p_i (delta_ij - p_j), applied to dout row by row,
    without building the (T_k, T_k) Jacobian. Masked entries (p = 0) must get zero gradient."""
    raise NotImplementedError("softmax backward: derive dx from dout and cache['p']")
'''
)

LINEAR = (
    HEADER.format(title="a linear layer", returns="(dx, dweight, dbias)")
    + '''

def forward(x, weight, bias):
    """out = x @ weight.T + bias, as torch.nn.Linear. x (..., D_in), weight (D_out, D_in), bias (D_out,).
    cache: "inputs", "x", "weight"."""
    return x @ weight.T + bias, {"inputs": {"x": x, "weight": weight, "bias": bias}, "x": x, "weight": weight}


def backward(dout, cache):
    """dout (..., D_out). Return dx (..., D_in), dweight (D_out, D_in), dbias (D_out,).
    Every leading axis of x (batch and positions) shares the same weight: sum over them."""
    raise NotImplementedError("linear backward: derive dx, dweight, dbias")
'''
)

LAYER_NORM = (
    HEADER.format(title="layer norm", returns="(dx, dweight, dbias)")
    + '''

def forward(x, weight, bias, eps):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over the last axis, as torch.nn.LayerNorm: the biased
    variance (divide by D), eps inside the square root. x (..., D), weight and bias (D,).
    cache: "inputs", "x_hat" ((x - mean) * rstd, the shape of x), "rstd" (1 / sqrt(var + eps), (..., 1)), "weight"."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    x_hat = (x - mean) * rstd
    cache = {"inputs": {"x": x, "weight": weight, "bias": bias, "eps": eps}, "x_hat": x_hat, "rstd": rstd,
             "weight": weight}
    return x_hat * weight + bias, cache


def backward(dout, cache):
    """dout (..., D). Return dx (..., D), dweight (D,), dbias (D,).
    x_hat depends on x through the mean and the variance too: dx has three terms (or one line with two means)."""
    raise NotImplementedError("layer_norm backward: derive dx, dweight, dbias")
'''
)

EMBEDDING = (
    HEADER.format(title="an embedding lookup", returns="dweight")
    + '''

def forward(ids, weight):
    """out = weight[ids]: ids (B, T) integers, weight (V, D) -> (B, T, D). cache: "inputs", "ids", "shape" (V, D)."""
    return weight[ids], {"inputs": {"ids": ids, "weight": weight}, "ids": ids, "shape": weight.shape}


def backward(dout, cache):
    """dout (B, T, D). Return dweight (V, D): each row gets the sum of the dout of every position that looked it up.
    Beware: `dweight[ids] += dout` does not add repeated ids twice (np.add.at does)."""
    raise NotImplementedError("embedding backward: derive dweight")
'''
)

DROPOUT = (
    HEADER.format(title="dropout", returns="dx, the gradient of the loss with respect to x")
    + '''

def forward(x, p, keep_mask):
    """Inverted dropout: out = x * keep_mask / (1 - p), as torch's nn.Dropout in training mode, with the units
    kept given (keep_mask, bool, the shape of x: True = kept) so that the grader can replay them.
    cache: "inputs", "keep_mask", "scale" (1 / (1 - p))."""
    scale = 1.0 / (1.0 - p)
    return x * keep_mask * scale, {"inputs": {"x": x, "p": p, "keep_mask": keep_mask}, "keep_mask": keep_mask,
                                   "scale": scale}


def backward(dout, cache):
    """dout, the shape of x. Return dx, the shape of x: the forward multiplies x by a constant array."""
    raise NotImplementedError("dropout backward: derive dx")
'''
)

ATTENTION = (
    HEADER.format(title="scaled dot-product attention", returns="(dq, dk, dv)")
    + '''

def forward(q, k, v, mask=None):
    """out = softmax(q k^T / sqrt(Dh)) v. q (B, H, T_q, Dh), k and v (B, H, T_k, Dh), mask broadcastable to
    (B, H, T_q, T_k), True = may attend, or None. A query with nothing to attend to gets zeros.
    cache: "inputs", "q", "k", "v", "p" (the probabilities (B, H, T_q, T_k)), "scale" (1 / sqrt(Dh))."""
    scale = 1.0 / np.sqrt(q.shape[-1])
    s = q @ np.swapaxes(k, -1, -2) * scale  # (B, H, T_q, T_k)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    p = e / np.where(total == 0.0, 1.0, total)
    cache = {"inputs": {"q": q, "k": k, "v": v, "mask": mask}, "q": q, "k": k, "v": v, "p": p, "scale": scale}
    return p @ v, cache


def backward(dout, cache):
    """dout (B, H, T_q, Dh). Return dq (B, H, T_q, Dh), dk and dv (B, H, T_k, Dh).
    Go back through out = p v, then the softmax (row by row), then s = q k^T * scale."""
    raise NotImplementedError("scaled dot-product attention backward: derive dq, dk, dv")
'''
)

MULTI_HEAD = (
    HEADER.format(title="multi-head attention", returns="(dquery, dkey, dvalue, grads)")
    + '''

def _linear(x, params, name):
    return x @ params[name + ".weight"].T + params[name + ".bias"]


def forward(params, query, key, value, n_heads, attn_mask=None):
    """MultiHead(Q, K, V) = concat(head_1 .. head_H) W_O^T + b_O, head_h = softmax(q_h k_h^T / sqrt(Dh)) v_h with
    q = query W_Q^T + b_Q split into H heads of Dh = D / H columns (likewise k, v).
    params: "q_proj.weight" (D, D), "q_proj.bias" (D,), likewise k_proj, v_proj, out_proj.
    query (B, T_q, D), key and value (B, T_k, D), attn_mask broadcastable to (B, H, T_q, T_k), True = may attend.
    cache: "inputs", "params", "query", "key", "value", "q", "k", "v" (split: (B, H, T, Dh)), "p" (B, H, T_q, T_k),
    "context" ((B, T_q, D), the heads merged, before out_proj)."""
    B, T_q, D = query.shape
    Dh = D // n_heads

    def split(x):  # (B, T, D) -> (B, H, T, Dh)
        return x.reshape(B, x.shape[1], n_heads, Dh).transpose(0, 2, 1, 3)

    q = split(_linear(query, params, "q_proj"))
    k, v = split(_linear(key, params, "k_proj")), split(_linear(value, params, "v_proj"))
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(Dh)  # (B, H, T_q, T_k)
    if attn_mask is not None:
        s = np.where(attn_mask, s, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    p = e / np.where(total == 0.0, 1.0, total)
    context = (p @ v).transpose(0, 2, 1, 3).reshape(B, T_q, D)  # heads merged
    inputs = {"params": params, "query": query, "key": key, "value": value, "n_heads": n_heads,
              "attn_mask": attn_mask}
    cache = {"inputs": inputs, "params": params, "query": query, "key": key, "value": value, "q": q, "k": k,
             "v": v, "p": p, "context": context}
    return _linear(context, params, "out_proj"), cache


def backward(dout, cache):
    """dout (B, T_q, D). Return dquery (B, T_q, D), dkey and dvalue (B, T_k, D), and grads: a dict with the keys
    of params. For self-attention the caller passes one array as query, key and value and adds the three."""
    raise NotImplementedError("multi-head attention backward: derive dquery, dkey, dvalue and the grads dict")
'''
)

FEED_FORWARD = (
    HEADER.format(title="the feed-forward block", returns="(dx, grads)")
    + '''
from scipy.special import erf


def forward(params, x, activation="relu"):
    """y = linear2(act(linear1(x))), act relu or exact gelu (x * Phi(x)). params: "linear1.weight" (F, D),
    "linear1.bias" (F,), "linear2.weight" (D, F), "linear2.bias" (D,). x (B, T, D).
    cache: "inputs", "params", "x", "h" (linear1's output (B, T, F)), "a" (the activation's output)."""
    h = x @ params["linear1.weight"].T + params["linear1.bias"]
    a = np.maximum(h, 0.0) if activation == "relu" else 0.5 * h * (1.0 + erf(h / np.sqrt(2.0)))
    cache = {"inputs": {"params": params, "x": x, "activation": activation}, "params": params, "x": x, "h": h, "a": a}
    return a @ params["linear2.weight"].T + params["linear2.bias"], cache


def backward(dout, cache):
    """dout (B, T, D). Return dx (B, T, D) and grads, a dict with the keys of params.
    gelu'(h) = Phi(h) + h * phi(h), with phi the standard normal density."""
    raise NotImplementedError("feed-forward backward: derive dx and the grads dict")
'''
)

CROSS_ENTROPY = (
    HEADER.format(title="cross-entropy", returns="dlogits")
    + '''

def forward(logits, targets, ignore_index=-100, label_smoothing=0.0):
    """The mean over the targets that are not ignore_index of -((1 - e) log p[target] + e mean_c log p[c]), with
    p = softmax(logits) and e = label_smoothing, as torch.nn.functional.cross_entropy.
    logits (B, T, V), targets (B, T) integers. cache: "inputs", "p" (B, T, V), "targets", "keep" (B, T) bool,
    "count" (the number of targets kept), "label_smoothing"."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    keep = targets != ignore_index
    safe = np.where(keep, targets, 0)
    nll = -np.take_along_axis(log_p, safe[..., None], axis=-1)[..., 0]
    smooth = -log_p.mean(axis=-1)
    per_token = (1.0 - label_smoothing) * nll + label_smoothing * smooth
    count = max(int(keep.sum()), 1)
    loss = float((per_token * keep).sum() / count)
    inputs = {"logits": logits, "targets": targets, "ignore_index": ignore_index, "label_smoothing": label_smoothing}
    return loss, {"inputs": inputs, "p": np.exp(log_p), "targets": safe, "keep": keep, "count": count,
                  "label_smoothing": label_smoothing}


def backward(cache, dloss=1.0):
    """dloss: dL/dloss, a number. Return dlogits (B, T, V). Ignored targets get zero gradient."""
    raise NotImplementedError("cross-entropy backward: derive dlogits")
'''
)

ENCODER_LAYER = (
    HEADER.format(title="a whole encoder layer", returns="(dx, grads)")
    + '''
from numpy_transformer import multi_head_attention_backward, multi_head_attention_forward
from numpy_transformer.layers import (
    feed_forward_backward,
    feed_forward_forward,
    layer_norm_backward,
    layer_norm_forward,
)


def forward(params, x, mask, config):
    """One encoder layer built from the reference's pairs: post-norm (config.norm_first False)
        h = LN1(x + MHA(x, x, x)),  y = LN2(h + FFN(h))
    or pre-norm (norm_first True)
        h = x + MHA(LN1(x), ...),   y = h + FFN(LN2(h)).
    params: "self_attn.{q,k,v,out}_proj.{weight,bias}", "self_attn_norm.{weight,bias}", "ffn.linear{1,2}.*",
    "ffn_norm.{weight,bias}". x (B, T, D), mask (B, 1, 1, T) True = may attend.
    cache: "inputs", "norm_first", and the cache of each pair by name: "attn", "norm1", "ffn", "norm2"."""
    def sub(prefix):
        return {k[len(prefix) + 1 :]: v for k, v in params.items() if k.startswith(prefix + ".")}

    eps, caches = config.layer_norm_eps, {}
    norm1, norm2 = sub("self_attn_norm"), sub("ffn_norm")
    if config.norm_first:
        a_in, caches["norm1"] = layer_norm_forward(x, norm1["weight"], norm1["bias"], eps)
        a, caches["attn"] = multi_head_attention_forward(sub("self_attn"), a_in, a_in, a_in, config.n_heads, mask)
        h = x + a
        f_in, caches["norm2"] = layer_norm_forward(h, norm2["weight"], norm2["bias"], eps)
        f, caches["ffn"] = feed_forward_forward(sub("ffn"), f_in, config.activation)
        y = h + f
    else:
        a, caches["attn"] = multi_head_attention_forward(sub("self_attn"), x, x, x, config.n_heads, mask)
        h, caches["norm1"] = layer_norm_forward(x + a, norm1["weight"], norm1["bias"], eps)
        f, caches["ffn"] = feed_forward_forward(sub("ffn"), h, config.activation)
        y, caches["norm2"] = layer_norm_forward(h + f, norm2["weight"], norm2["bias"], eps)
    inputs = {"params": params, "x": x, "mask": mask, "config": config}
    return y, caches | {"inputs": inputs, "norm_first": config.norm_first}


def backward(dout, cache):
    """dout (B, T, D). Return dx (B, T, D) and grads, a dict with the keys of params.
    Call the pairs' backward functions in the reverse order of the forward: layer_norm_backward(d, cache) ->
    (dx, dweight, dbias); feed_forward_backward(d, cache) -> (dx, grads); multi_head_attention_backward(d, cache)
    -> (dquery, dkey, dvalue, grads). Where a residual connection joins two paths, add their gradients; the
    self-attention's three inputs are the same array: add dquery, dkey and dvalue."""
    raise NotImplementedError("encoder layer backward: chain the pairs' backward passes in reverse")
'''
)

EXERCISES = {
    "softmax": SOFTMAX,
    "linear": LINEAR,
    "layer_norm": LAYER_NORM,
    "embedding": EMBEDDING,
    "dropout": DROPOUT,
    "scaled_dot_product_attention": ATTENTION,
    "multi_head_attention": MULTI_HEAD,
    "feed_forward": FEED_FORWARD,
    "cross_entropy": CROSS_ENTROPY,
    "encoder_layer": ENCODER_LAYER,
}

# What each exercise is worth when a class is graded (all or nothing: every case and both dtypes must pass).
POINTS = {
    "softmax": 1,
    "linear": 1,
    "layer_norm": 2,
    "embedding": 1,
    "dropout": 1,
    "scaled_dot_product_attention": 2,
    "multi_head_attention": 3,
    "feed_forward": 2,
    "cross_entropy": 1,
    "encoder_layer": 2,
}


def notebook(name: str) -> str:
    """A jupytext "percent" notebook for one exercise: the exercise's docstring as prose, then the grader."""
    doc = EXERCISES[name].split('"""')[1].strip()
    prose = "\n".join(f"# {line}".rstrip() for line in doc.splitlines())
    return f"""# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
{prose}
#
# Open `../{name}.py`, write `backward`, then run the cell below: it compares your gradients with the reference's
# and with central finite differences of the forward, on several shapes and the edge cases, and names the mistake
# when it knows it.

# %%
import importlib.util
from pathlib import Path

from parity_tests import check

path = Path("..") / "{name}.py" if Path("..", "{name}.py").exists() else Path("{name}.py")
spec = importlib.util.spec_from_file_location("{name}", path)
exercise = importlib.util.module_from_spec(spec)
spec.loader.exec_module(exercise)
print(check.pair(exercise.forward, exercise.backward, "{name}"))
"""
