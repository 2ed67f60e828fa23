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
# # Answers to the exercises of walkthrough 12 (Transformers that see and hear)
#
# Try the exercises first: they are at the end of `examples/12_vision_and_audio.py`. Every answer below is checked
# against finite differences or torch's autograd.

# %%
import numpy as np
import torch
import torch.nn.functional as F

from numpy_transformer import audio

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

# %% [markdown]
# ### Exercise 3: the convolution's backward is a convolution
#
# $y_{o,t} = \sum_{c,k} W_{o,c,k}\, x_{c,\,t + k - 1}$ (zero outside $0 .. N-1$). Frame $j$ is read by output $t = j
# - k + 1$ through tap $k$, so $dx_{c,j} = \sum_{o,k} W_{o,c,k}\, dy_{o,\,j - k + 1}$. Put $k' = 2 - k$: $dx_{c,j} =
# \sum_{o,k'} W_{o,c,2-k'}\, dy_{o,\,j + k' - 1}$, which is the forward's formula with $dy$ as input and the
# kernel $W'_{c,o,k'} = W_{o,c,2-k'}$: flipped in time, channels swapped, the same padding 1.

# %%
M, D, N = 6, 4, 10
x = rng.standard_normal((2, M, N))
w, b = rng.standard_normal((D, M, 3)), rng.standard_normal(D)
dy = rng.standard_normal((2, D, N))
flipped = torch.tensor(w[:, :, ::-1].transpose(1, 0, 2).copy())  # (M, D, 3): W'_{c,o,k} = W_{o,c,2-k}
dx = F.conv1d(torch.tensor(dy), flipped, padding=1).numpy()
x_t = torch.tensor(x, requires_grad=True)
(F.conv1d(x_t, torch.tensor(w), torch.tensor(b), padding=1) * torch.tensor(dy)).sum().backward()
transposed = F.conv_transpose1d(torch.tensor(dy), torch.tensor(w), padding=1).numpy()
_, cache = audio.conv1d_forward(x, w, b, stride=1, padding=1)
library_dx = audio.conv1d_backward(dy, cache)[0]
errors = [np.abs(dx - other).max() for other in (x_t.grad.numpy(), transposed, library_dx)]
assert np.abs(dx).max() > 0 and max(errors) < 1e-12
print(
    "exercise 3 checked: the flipped, swapped kernel; against autograd, conv_transpose1d and the library "
    f"{max(errors):.1e}"
)
