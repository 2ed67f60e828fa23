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
# # Answers to the exercises of walkthrough 12 (Transformers that see)
#
# Try the exercises first: they are at the end of `examples/12_vision_and_audio.py`. Every answer below is checked
# against finite differences or torch's autograd.

# %%
import numpy as np
import torch
import torch.nn.functional as F

rng = np.random.default_rng(0)

# %% [markdown]
# ### Exercise 1: QuickGELU's backward
#
# With $a = 1.702$ and $\sigma' = \sigma(1 - \sigma)$, the product rule gives
# $dx = dy\,\big(\sigma(ax) + a\,x\,\sigma(ax)(1 - \sigma(ax))\big)$.

# %%


def quick_gelu(x):
    return x / (1 + np.exp(-1.702 * x))


def quick_gelu_backward(dout, x):
    s = 1 / (1 + np.exp(-1.702 * x))
    return dout * (s + 1.702 * x * s * (1 - s))


x = 3 * rng.standard_normal(20)
dout = rng.standard_normal(20)
h = 1e-6
fd = (quick_gelu(x + h) - quick_gelu(x - h)) / (2 * h) * dout
x_t = torch.tensor(x, requires_grad=True)
(x_t * torch.sigmoid(1.702 * x_t) * torch.tensor(dout)).sum().backward()
error_fd = np.abs(quick_gelu_backward(dout, x) - fd).max()
error_autograd = np.abs(quick_gelu_backward(dout, x) - x_t.grad.numpy()).max()
assert error_fd < 1e-7 and error_autograd < 1e-12
print(f"exercise 1 checked: finite differences {error_fd:.1e}, autograd {error_autograd:.1e}")

# %% [markdown]
# ### Exercise 2: one direction only
#
# $\mathcal{L}_I = \frac1N \sum_k \big(\log\sum_j e^{L_{jk}} - L_{kk}\big)$: each image (a column of $L$) chooses
# among the captions, so the softmax runs down the columns, and $dL = (P^{\mathrm{col}} - I)/N$: the column
# softmax only.

# %%
N = 5
L = 3 * rng.standard_normal((N, N))
e = np.exp(L - L.max(axis=0, keepdims=True))
P_col = e / e.sum(axis=0, keepdims=True)
dL = (P_col - np.eye(N)) / N
L_t = torch.tensor(L, requires_grad=True)
F.cross_entropy(L_t.T, torch.arange(N)).backward()
error = np.abs(dL - L_t.grad.numpy()).max()
assert error < 1e-12
print(f"exercise 2 checked: the column softmax, against autograd {error:.1e}")
