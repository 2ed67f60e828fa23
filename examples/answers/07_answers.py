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
# # Answers to the exercises of walkthrough 7 (FlashAttention's backward)
#
# Try the exercises first: they are at the end of `examples/07_flash_attention_backward.py`. Every answer
# below is checked, with `gradcheck.check_pair` or against the plain attention pair.

# %%
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np

if importlib.util.find_spec("numpy_transformer") is None:  # not pip-installed: import from the checkout
    sys.path.insert(0, str((Path(__file__).parent if "__file__" in globals() else Path.cwd()).resolve().parents[1]))

from numpy_transformer import (  # noqa: E402
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)
from numpy_transformer.gradcheck import check_pair  # noqa: E402

np.set_printoptions(precision=4, suppress=True)
rng = np.random.default_rng(0)

# %% [markdown]
# ### Exercise 1: merging two partial softmaxes
#
# Worker $a$ holds $m_a = \max s_a$, $\ell_a = \sum e^{s_a - m_a}$, $o_a = \sum e^{s_a - m_a} v$, and likewise
# worker $b$. With $m = \max(m_a, m_b)$, rescale each to the common maximum:
# $\ell = e^{m_a - m} \ell_a + e^{m_b - m} \ell_b$ and $o = e^{m_a - m} o_a + e^{m_b - m} o_b$; the row's output
# is $o / \ell$ and its log-sum-exp $m + \log \ell$. The online update is this merge with $b$ the new block.


# %%
def partial(s, v):
    m = s.max()
    e = np.exp(s - m)
    return m, e.sum(), e @ v


def merge(a, b):
    (m_a, l_a, o_a), (m_b, l_b, o_b) = a, b
    m = max(m_a, m_b)
    alpha, beta = math.exp(m_a - m), math.exp(m_b - m)
    l = alpha * l_a + beta * l_b
    return (alpha * o_a + beta * o_b) / l, m + math.log(l)


s, v = rng.standard_normal(10) * 3, rng.standard_normal((10, 2))
out, lse = merge(partial(s[:4], v[:4]), partial(s[4:], v[4:]))
p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
print("merged output", out, " plain", p @ v, "; lse", lse, " plain", np.log(np.exp(s).sum()))
assert np.abs(out - p @ v).max() <= 1e-15 and abs(lse - np.log(np.exp(s).sum())) <= 1e-14
print("Exercise 1 checked")

# %% [markdown]
# ### Exercise 2: a tiled pair of one's own
#
# The forward runs the online update over key blocks for each query block and keeps only q, k, v, O and
# lse; the backward is Part 5's two loops, with $\Delta = \mathrm{rowsum}(dO \odot O)$ computed first. Blocks
# of 4 queries and 3 keys over $T_q = 7$, $T_k = 5$: the last blocks are partial.


# %%
def tiled_forward(q, k, v, block_q=4, block_k=3):
    """q (T_q, Dh), k and v (T_k, Dh): O (T_q, Dh) and the row log-sum-exp, never a (T_q, T_k) array."""
    c = 1.0 / math.sqrt(q.shape[-1])
    O, lse = np.zeros_like(q), np.zeros(len(q))
    for i0 in range(0, len(q), block_q):
        ri = slice(i0, i0 + block_q)
        m = np.full(len(q[ri]), -np.inf)
        l, o = np.zeros(len(q[ri])), np.zeros_like(q[ri])
        for j0 in range(0, len(k), block_k):
            cj = slice(j0, j0 + block_k)
            S = c * q[ri] @ k[cj].T  # (block_q, block_k)
            m_new = np.maximum(m, S.max(axis=1))
            alpha = np.exp(m - m_new)
            E = np.exp(S - m_new[:, None])
            l, o, m = alpha * l + E.sum(axis=1), alpha[:, None] * o + E @ v[cj], m_new
        O[ri], lse[ri] = o / l[:, None], m + np.log(l)
    return O, (q, k, v, O, lse, c, block_q, block_k)


def tiled_backward(dO, cache):
    q, k, v, O, lse, c, block_q, block_k = cache
    Delta = (dO * O).sum(axis=1)  # (T_q,): the row term, from two arrays we have
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for j0 in range(0, len(k), block_k):
        cj = slice(j0, j0 + block_k)
        for i0 in range(0, len(q), block_q):
            ri = slice(i0, i0 + block_q)
            P = np.exp(c * q[ri] @ k[cj].T - lse[ri, None])  # recomputed
            dv[cj] += P.T @ dO[ri]
            dS = P * (dO[ri] @ v[cj].T - Delta[ri, None])
            dq[ri] += c * dS @ k[cj]
            dk[cj] += c * dS.T @ q[ri]
    return dq, dk, dv


q, k, v = rng.standard_normal((7, 2)), rng.standard_normal((5, 2)), rng.standard_normal((5, 2))
result = check_pair(tiled_forward, tiled_backward, dict(q=q.copy(), k=k.copy(), v=v.copy()), wrt=["q", "k", "v"])
print(result)
O_plain, plain_cache = scaled_dot_product_attention_forward(q[None, None], k[None, None], v[None, None])
dO = rng.standard_normal((7, 2))
grads_plain = scaled_dot_product_attention_backward(dO[None, None], plain_cache)[:3]  # dq, dk, dv
O, cache = tiled_forward(q, k, v)
diff = max(np.abs(a - b[0, 0]).max() for a, b in zip(tiled_backward(dO, cache), grads_plain, strict=True))
print(f"vs the plain pair: output {np.abs(O - O_plain[0, 0]).max():.1e}, gradients {diff:.1e}")
assert result.worst <= 1e-6 and np.abs(O - O_plain[0, 0]).max() <= 1e-14 and diff <= 1e-14
print("Exercise 2 checked")

# %% [markdown]
# ### Exercise 3: the gradient of the log-sum-exp
#
# $\mathrm{lse}(s) = \log \sum_k e^{s_k}$, so $\partial\, \mathrm{lse} / \partial s_j = e^{s_j} / \sum_k e^{s_k} = p_j$:
# the softmax is the gradient of the log-sum-exp. A cross-entropy row is $\ell = \mathrm{lse}(z) - z_y$, whose
# gradient is therefore $p - \mathrm{onehot}(y)$.


# %%
def lse_forward(s):
    m = s.max(axis=-1, keepdims=True)
    lse = m[..., 0] + np.log(np.exp(s - m).sum(axis=-1))  # (N,)
    return lse, (s, lse)


def lse_backward(dlse, cache):
    s, lse = cache
    return dlse[..., None] * np.exp(s - lse[..., None])  # softmax(s), scaled by the upstream gradient


result = check_pair(lse_forward, lse_backward, dict(s=rng.standard_normal((3, 4))), wrt=["s"], max_coords=None)
print(result)
assert result.worst <= 1e-6
print("Exercise 3 checked")
