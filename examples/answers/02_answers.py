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
# # Answers to the exercises of walkthrough 2 (layer norm)
#
# Try the exercises first: they are at the end of `examples/02_layer_norm_backward.py`. Every answer
# below is checked with `gradcheck.check_pair` (and, where a PyTorch function exists, autograd).

# %%
import importlib.util
import sys
from pathlib import Path

import numpy as np
import torch

if importlib.util.find_spec("numpy_transformer") is None:  # not pip-installed: import from the checkout
    sys.path.insert(0, str((Path(__file__).parent if "__file__" in globals() else Path.cwd()).resolve().parents[1]))

from numpy_transformer.gradcheck import check_pair  # noqa: E402

np.set_printoptions(precision=4, suppress=True)
rng = np.random.default_rng(0)
x = rng.standard_normal((3, 5))  # (N, D)
gamma, beta = 1.0 + 0.3 * rng.standard_normal(5), 0.3 * rng.standard_normal(5)
eps = 1e-5

# %% [markdown]
# ### Exercise 1: RMSNorm
#
# Forward lines: $\nu = \mathrm{mean}(x^2)$, $r = (\nu + \varepsilon)^{-1/2}$, $\hat x = x\, r$,
# $y = \gamma \odot \hat x$.
# Backwards: $d\gamma = \sum_{\text{rows}} dy \odot \hat x$ and $d\hat x = dy \odot \gamma$; then $\hat x = x\, r$
# forks ($x$ directly, and through $r$): $dx \mathrel{+}= d\hat x\, r$ and $dr = \sum_i d\hat x_i x_i$;
# $d\nu = -\tfrac12 r^3\, dr$; $\nu = \mathrm{mean}(x^2)$ gives $dx \mathrel{+}= d\nu \cdot 2x / D$. Substituting,
# $d\nu \cdot 2x/D = -r^3 x\, (d\hat x \cdot x)/D = -r\, \hat x\, \mathrm{mean}(d\hat x \odot \hat x)$, so
# $dx = r\,\big(d\hat x - \hat x\, \mathrm{mean}(d\hat x \odot \hat x)\big)$: layer norm's formula without
# the $-\mathrm{mean}(d\hat x)$ term, since there is no mean to go back through.


# %%
def rms_norm_forward(x, gamma):
    r = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)  # (N, 1)
    x_hat = x * r
    return gamma * x_hat, (x_hat, r, gamma)


def rms_norm_backward(dy, cache):
    x_hat, r, gamma = cache
    dx_hat = dy * gamma
    dx = r * (dx_hat - x_hat * (dx_hat * x_hat).mean(axis=-1, keepdims=True))
    return dx, (dy * x_hat).sum(axis=0)


result = check_pair(rms_norm_forward, rms_norm_backward, dict(x=x.copy(), gamma=gamma.copy()), wrt=["x", "gamma"])
print(result)
x_t, g_t = torch.tensor(x, requires_grad=True), torch.tensor(gamma, requires_grad=True)
dy = rng.standard_normal(x.shape)
torch.nn.functional.rms_norm(x_t, (5,), g_t, eps).backward(torch.from_numpy(dy))
dx, dgamma = rms_norm_backward(dy, rms_norm_forward(x, gamma)[1])
diff = max(np.abs(dx - x_t.grad.numpy()).max(), np.abs(dgamma - g_t.grad.numpy()).max())
print(f"vs F.rms_norm under autograd: {diff:.1e}")
assert result.worst <= 1e-6 and diff <= 1e-14
print("Exercise 1 checked")

# %% [markdown]
# ### Exercise 2: two invariances, seen in the gradient
#
# With $\gamma = 1$, $d\hat x = dy$ and $dx = r\,(dy - \mathrm{mean}(dy) - \hat x\, \mathrm{mean}(dy \odot \hat x))$.
#
# - $\sum_j dx_j = r\,(\sum dy - D\, \mathrm{mean}(dy) - \mathrm{mean}(dy \odot \hat x) \sum_j \hat x_j) = 0$, because
#   $\hat x$ has mean zero. Invariance: $\hat x(x + t\mathbf 1) = \hat x(x)$, so the loss does not change along
#   $\mathbf 1$, and the gradient has no component along it.
# - $\hat x \cdot dx = r\,\big(\hat x \cdot dy - \lVert \hat x \rVert^2 \mathrm{mean}(dy \odot \hat x)\big)
#   = r\,(\hat x \cdot dy)\,(1 - \lVert \hat x \rVert^2 / D)$, and
#   $\lVert \hat x \rVert^2 / D = \sigma^2 / (\sigma^2 + \varepsilon)$, so
#   $\hat x \cdot dx = r\,(\hat x \cdot dy)\, \varepsilon / (\sigma^2 + \varepsilon)$. Invariance: scaling the
#   centred row, $x_c \to (1 + t)\, x_c$, leaves $\hat x$ unchanged when $\varepsilon = 0$, so the gradient
#   has no component along $x_c$ (equivalently $\hat x$) but what $\varepsilon$ leaves.

# %%
mu, var = x.mean(axis=-1, keepdims=True), x.var(axis=-1, keepdims=True)
r = 1.0 / np.sqrt(var + eps)
x_hat = (x - mu) * r
dx = r * (dy - dy.mean(axis=-1, keepdims=True) - x_hat * (dy * x_hat).mean(axis=-1, keepdims=True))
predicted = (r * (x_hat * dy).sum(axis=-1, keepdims=True) * eps / (var + eps)).ravel()
print("row sums of dx:", dx.sum(axis=-1))
print("x_hat . dx:    ", (x_hat * dx).sum(axis=-1), "\npredicted:     ", predicted)
assert np.abs(dx.sum(axis=-1)).max() <= 1e-14
assert np.abs((x_hat * dx).sum(axis=-1) - predicted).max() <= 1e-14
print("Exercise 2 checked")

# %% [markdown]
# ### Exercise 3: the Annotated Transformer's LayerNorm, backwards
#
# $y = \gamma \odot x_c\, \tilde r + \beta$ with $x_c = x - \mu$, $\tilde\sigma = \sqrt{\sum x_c^2 / (D - 1)}$ and
# $\tilde r = 1 / (\tilde\sigma + \varepsilon)$. The same staging: $d\hat x = dy \odot \gamma$;
# $dx_c \mathrel{+}= d\hat x\, \tilde r$, $d\tilde r = d\hat x \cdot x_c$; $d\tilde\sigma = -\tilde r^2\, d\tilde r$;
# $\tilde\sigma^2 = \sum x_c^2 / (D - 1)$ gives $dx_c \mathrel{+}= d\tilde\sigma\, x_c / ((D - 1)\, \tilde\sigma)$;
# the mean path subtracts the row mean. The result:
#
# $$dx = \tilde r\,\big(d\hat x - \mathrm{mean}(d\hat x)\big) -
# \frac{\tilde r^2\, (d\hat x \cdot x_c)}{(D-1)\, \tilde\sigma}\, x_c$$
#
# (the last term has mean zero already). It differs from the boxed formula in two places: $D - 1$ where
# the boxed one has $D$, and $\tilde r^2 / \tilde\sigma$ where it has $r^3 = r^2 \cdot r$ (the two agree only
# when $\varepsilon = 0$ and $D$ is large).


# %%
def annotated_forward(x, gamma, beta, eps=1e-6):
    xc = x - x.mean(axis=-1, keepdims=True)
    std = np.sqrt((xc * xc).sum(axis=-1, keepdims=True) / (x.shape[-1] - 1))  # unbiased
    r_tilde = 1.0 / (std + eps)
    x_hat = xc * r_tilde
    return gamma * x_hat + beta, (xc, std, r_tilde, x_hat, gamma)


def annotated_backward(dy, cache):
    xc, std, r_tilde, x_hat, gamma = cache
    D = xc.shape[-1]
    dx_hat = dy * gamma
    dx = r_tilde * (dx_hat - dx_hat.mean(axis=-1, keepdims=True))
    dx -= r_tilde * r_tilde * (dx_hat * xc).sum(axis=-1, keepdims=True) * xc / ((D - 1) * std)
    return dx, (dy * x_hat).sum(axis=0), dy.sum(axis=0)


result = check_pair(
    annotated_forward,
    annotated_backward,
    dict(x=x.copy(), gamma=gamma.copy(), beta=beta.copy()),
    wrt=["x", "gamma", "beta"],
    max_coords=None,
)
print(result)
assert result.worst <= 1e-6
print("Exercise 3 checked")
