# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Answers to the exercises of walkthrough 1 (attention by hand)
#
# Try the exercises first: they are at the end of `examples/01_attention_by_hand.py`. Every answer
# below is checked with `gradcheck.check_pair` (central differences, float64, bar $10^{-6}$).

# %%
import importlib.util
import sys
from pathlib import Path

import numpy as np

if importlib.util.find_spec("numpy_transformer") is None:  # not pip-installed: import from the checkout
    sys.path.insert(0, str((Path(__file__).parent if "__file__" in globals() else Path.cwd()).resolve().parents[1]))

from numpy_transformer.gradcheck import check_pair  # noqa: E402

np.set_printoptions(precision=4, suppress=True)
rng = np.random.default_rng(0)

# %% [markdown]
# ### Exercise 1: the softmax pair
#
# The forward keeps $P$, the only thing the backward needs; the backward is step 6's formula,
# $dS = P \odot (dP - \mathrm{rowsum}(dP \odot P))$. Each row of $dS$ sums to
# $\sum_j p_j dp_j - (\sum_j p_j) \sum_i p_i dp_i = 0$, since $\sum_j p_j = 1$.


# %%
def softmax_forward(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    P = e / e.sum(axis=-1, keepdims=True)  # (T_q, T_k)
    return P, P


def softmax_backward(dP, P):
    return P * (dP - (dP * P).sum(axis=-1, keepdims=True))


s = rng.standard_normal((2, 3))
result = check_pair(softmax_forward, softmax_backward, dict(s=s), wrt=["s"], max_coords=None)
print(result)
dS = softmax_backward(rng.standard_normal((2, 3)), softmax_forward(s)[1])
print("row sums of dS:", dS.sum(axis=-1))
assert result.worst <= 1e-6 and np.abs(dS.sum(axis=-1)).max() <= 1e-15
print("Exercise 1 checked")

# %% [markdown]
# ### Exercise 2: a learned bias on the scores
#
# $S = c\, Q K^\top + b$ with $b$ of shape $(T_q, T_k)$, broadcast over the batch and heads axes. For
# each batch element and head, $\partial S_{ij} / \partial b_{ij} = 1$, so the bias receives $dS$
# unchanged from every one of them: one parameter read by $B \cdot H$ score matrices is a fork, and
# the gradients add, $db = \sum_{\text{batch, heads}} dS$. The rest of the backward is walkthrough 01's.


# %%
def biased_attention_forward(q, k, v, b):
    c = 1.0 / np.sqrt(q.shape[-1])
    S = c * q @ k.swapaxes(-1, -2) + b  # (B, H, T_q, T_k); b broadcasts
    P, _ = softmax_forward(S)
    return P @ v, (q, k, v, P, c)


def biased_attention_backward(dO, cache):
    q, k, v, P, c = cache
    dv = P.swapaxes(-1, -2) @ dO
    dS = softmax_backward(dO @ v.swapaxes(-1, -2), P)  # (B, H, T_q, T_k)
    db = dS.sum(axis=(0, 1))  # (T_q, T_k): one bias, B * H uses
    return c * dS @ k, c * dS.swapaxes(-1, -2) @ q, dv, db


args = dict(
    q=rng.standard_normal((2, 2, 3, 2)),
    k=rng.standard_normal((2, 2, 4, 2)),
    v=rng.standard_normal((2, 2, 4, 2)),
    b=rng.standard_normal((3, 4)),
)
result = check_pair(biased_attention_forward, biased_attention_backward, args, wrt=["q", "k", "v", "b"])
print(result)
assert result.worst <= 1e-6 and min(result.max_abs_grad.values()) > 0
print("Exercise 2 checked")

# %% [markdown]
# ### Exercise 3: a learned temperature
#
# $S = c\, A$ with $A = Q K^\top$ and $c$ a scalar parameter. $\partial S_{ij} / \partial c = A_{ij}$, and
# $c$ is used by every entry (a fork again), so $dc = \sum_{ij} dS_{ij} A_{ij}$, summed over the batch
# and heads too. The input gradients are step 7's, with the learned $c$ in place of $1/\sqrt{d_h}$.


# %%
def temperature_attention_forward(q, k, v, c):
    A = q @ k.swapaxes(-1, -2)  # (B, H, T_q, T_k)
    P, _ = softmax_forward(c[0] * A)
    return P @ v, (q, k, v, P, A, c[0])


def temperature_attention_backward(dO, cache):
    q, k, v, P, A, c = cache
    dv = P.swapaxes(-1, -2) @ dO
    dS = softmax_backward(dO @ v.swapaxes(-1, -2), P)
    dc = np.array([np.sum(dS * A)])  # (1,): c multiplies every score
    return c * dS @ k, c * dS.swapaxes(-1, -2) @ q, dv, dc


args = dict(
    q=rng.standard_normal((1, 2, 3, 2)),
    k=rng.standard_normal((1, 2, 3, 2)),
    v=rng.standard_normal((1, 2, 3, 2)),
    c=np.array([0.7]),
)
result = check_pair(temperature_attention_forward, temperature_attention_backward, args, wrt=["q", "k", "v", "c"])
print(result)
assert result.worst <= 1e-6 and result.max_abs_grad["c"] > 0
print("Exercise 3 checked")
