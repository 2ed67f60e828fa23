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
# # Answers to the exercises of walkthrough 9 (mixture of experts)
#
# Try the exercises first: they are at the end of `examples/09_mixture_of_experts.py`. Every answer
# below is checked with `gradcheck.check_pair` (and autograd or the library where they have the function).

# %%
import importlib.util
import sys
from pathlib import Path

import numpy as np
import torch

if importlib.util.find_spec("numpy_transformer") is None:  # not pip-installed: import from the checkout
    sys.path.insert(0, str((Path(__file__).parent if "__file__" in globals() else Path.cwd()).resolve().parents[1]))

from numpy_transformer import moe  # noqa: E402
from numpy_transformer.gradcheck import check_pair  # noqa: E402

np.set_printoptions(precision=4, suppress=True)
rng = np.random.default_rng(0)
N, E, k = 5, 6, 2
z = rng.standard_normal((N, E))  # router logits (N, E)
p_sorted = np.sort(np.exp(z) / np.exp(z).sum(axis=1, keepdims=True), axis=1)[:, ::-1]
assert (p_sorted[:, k - 1] - p_sorted[:, k]).min() > 1e-3  # no top-k tie within reach of a finite-difference step


def softmax(v):
    e = np.exp(v - v.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# %% [markdown]
# ### Exercise 1: raw gates
#
# $g_j = p_{S_j}$ with $p = \mathrm{softmax}(z)$, so $\partial g_j / \partial z_e = p_{S_j} (\delta_{S_j e} - p_e)$
# (the softmax's Jacobian). Summing over the $k$ gates,
#
# $$dz_e = \sum_j dg_j\, p_{S_j} (\delta_{S_j e} - p_e) = p_e \Big(dg_e [e \in S] - \sum_j dg_j\, p_{S_j}\Big),$$
#
# where $dg_e$ is the gradient of the gate that selected $e$. An unchosen expert gets
# $-p_e \sum_j dg_j\, p_{S_j}$: not zero, because every logit is in the softmax's denominator.


# %%
def raw_gates_forward(z):
    p = softmax(z)
    S = np.argsort(-p, axis=1, kind="stable")[:, :k]  # (N, k)
    return np.take_along_axis(p, S, axis=1), (p, S)


def raw_gates_backward(dg, cache):
    p, S = cache
    chosen = np.zeros_like(p)
    np.put_along_axis(chosen, S, dg, axis=1)  # dg_e [e in S]
    return p * (chosen - (dg * np.take_along_axis(p, S, axis=1)).sum(axis=1, keepdims=True))


dg = rng.standard_normal((N, k))
result = check_pair(raw_gates_forward, raw_gates_backward, dict(z=z.copy()), wrt=["z"], max_coords=None)
print(result)
_, cache = moe.top_k_gates_forward(z, k, norm_topk_prob=False)
diff = np.abs(raw_gates_backward(dg, raw_gates_forward(z)[1]) - moe.top_k_gates_backward(dg, cache)).max()
print(f"max |mine - top_k_gates_backward(norm_topk_prob=False)| = {diff:.1e}")
assert result.worst <= 1e-6 and diff <= 1e-15
print("Exercise 1 checked")

# %% [markdown]
# ### Exercise 2: the router z-loss
#
# $\mathcal{L}_z = \frac1N \sum_n \ell_n^2$ with $\ell_n = \mathrm{lse}(z_n) = \log \sum_e e^{z_{ne}}$. The
# derivative of a log-sum-exp is the softmax, $\partial \ell_n / \partial z_{ne} = \mathrm{softmax}(z_n)_e$, so
#
# $$dz_n = d\mathcal{L}\, \frac{2}{N}\, \ell_n\, \mathrm{softmax}(z_n).$$


# %%
def z_loss_forward(z):
    m = z.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(z - m).sum(axis=1))  # (N,)
    return np.mean(lse**2), (lse, softmax(z))


def z_loss_backward(dloss, cache):
    lse, p = cache
    return dloss * (2.0 / len(lse)) * lse[:, None] * p


result = check_pair(z_loss_forward, z_loss_backward, dict(z=z.copy()), wrt=["z"], max_coords=None)
print(result)
z_t = torch.tensor(z, requires_grad=True)
torch.logsumexp(z_t, dim=1).square().mean().backward()
diff = np.abs(z_loss_backward(1.0, z_loss_forward(z)[1]) - z_t.grad.numpy()).max()
print(f"max |mine - autograd| = {diff:.1e}")
assert result.worst <= 1e-6 and diff <= 1e-15
print("Exercise 2 checked")

# %% [markdown]
# ### Exercise 3: top-k first
#
# Take the $k$ largest logits $z_S$ (the same experts as the $k$ largest probabilities: the softmax is
# increasing), then $g = \mathrm{softmax}(z_S)$. Its backward is the softmax backward on the $k$ chosen entries,
# scattered back; the other logits get zero. The walkthrough showed the forward is the same function as
# softmax-then-top-k-then-renormalise, so the gradients must agree too.


# %%
def top_k_first_forward(z):
    S = np.argsort(-z, axis=1, kind="stable")[:, :k]  # (N, k): the largest logits
    g = softmax(np.take_along_axis(z, S, axis=1))
    return g, (g, S, z.shape)


def top_k_first_backward(dg, cache):
    g, S, shape = cache
    dz = np.zeros(shape)
    np.put_along_axis(dz, S, g * (dg - (dg * g).sum(axis=1, keepdims=True)), axis=1)
    return dz


result = check_pair(top_k_first_forward, top_k_first_backward, dict(z=z.copy()), wrt=["z"], max_coords=None)
print(result)
g_mine, cache_mine = top_k_first_forward(z)
(g_lib, S_lib), cache_lib = moe.top_k_gates_forward(z, k, norm_topk_prob=True)
gate_diff = np.abs(g_mine - g_lib).max()
grad_diff = np.abs(top_k_first_backward(dg, cache_mine) - moe.top_k_gates_backward(dg, cache_lib)).max()
print(f"max |gates - library| = {gate_diff:.1e},  max |dz - library| = {grad_diff:.1e}")
assert result.worst <= 1e-6 and np.array_equal(cache_mine[1], S_lib) and gate_diff <= 1e-15 and grad_diff <= 1e-15
print("Exercise 3 checked")
