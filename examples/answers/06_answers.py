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
# # Answers to the exercises of walkthrough 6 (RoPE, RMSNorm, SwiGLU)
#
# Try the exercises first: they are at the end of `examples/06_rope_rmsnorm_swiglu.py`. Every answer
# below is checked with `gradcheck.check_pair` (and autograd where PyTorch has the function).

# %%
import importlib.util
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy.special import erf

if importlib.util.find_spec("numpy_transformer") is None:  # not pip-installed: import from the checkout
    sys.path.insert(0, str((Path(__file__).parent if "__file__" in globals() else Path.cwd()).resolve().parents[1]))

from numpy_transformer.gradcheck import check_pair  # noqa: E402

np.set_printoptions(precision=4, suppress=True)
rng = np.random.default_rng(0)

# %% [markdown]
# ### Exercise 1: RoPE in the RoFormer layout
#
# Pair $i$ is now $(x_{2i}, x_{2i+1})$, rotated by the angle $t\theta_i$ at position $t$:
# $y_{2i} = x_{2i} \cos - x_{2i+1} \sin$, $y_{2i+1} = x_{2i} \sin + x_{2i+1} \cos$. Each pair's Jacobian is a
# $2 \times 2$ rotation $R$, whose transpose is the rotation by the opposite angle, so the backward is the
# same code with $\sin \to -\sin$. The two layouts are the same rotations applied to differently ordered
# features: permuting the input by $\pi = (0, 2, 4, \dots, 1, 3, 5, \dots)$ (the evens, then the odds) turns
# neighbour pairs into half-split pairs, so $y_{\text{interleaved}}[\pi] = y_{\text{half}}(x[\pi])$.

# %%
T, Dh = 5, 6
theta = 10000.0 ** (-np.arange(0, Dh, 2) / Dh)  # (Dh/2,)
angles = np.arange(T)[:, None] * theta[None, :]  # (T, Dh/2): position t times theta_i
cos, sin = np.cos(angles), np.sin(angles)


def rope_interleaved_forward(x, sign=1.0):
    """x (T, Dh): rotate (x[2i], x[2i+1]) by sign * m * theta_i."""
    even, odd = x[:, 0::2], x[:, 1::2]
    y = np.empty_like(x)
    y[:, 0::2] = even * cos - sign * odd * sin
    y[:, 1::2] = even * sign * sin + odd * cos
    return y, None


def rope_interleaved_backward(dy, _):
    return rope_interleaved_forward(dy, sign=-1.0)[0]  # R^T = R(-m theta): the inverse rotation


def rope_half_forward(x):
    half = Dh // 2
    x1, x2 = x[:, :half], x[:, half:]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=1)


x = rng.standard_normal((T, Dh))
result = check_pair(rope_interleaved_forward, rope_interleaved_backward, dict(x=x.copy()), wrt=["x"], max_coords=None)
print(result)
perm = np.concatenate([np.arange(0, Dh, 2), np.arange(1, Dh, 2)])  # evens, then odds
diff = np.abs(rope_interleaved_forward(x)[0][:, perm] - rope_half_forward(x[:, perm])).max()
print(f"interleaved output, permuted, vs half-split of the permuted input: {diff:.1e}")
assert result.worst <= 1e-6 and diff <= 1e-15
print("Exercise 1 checked")

# %% [markdown]
# ### Exercise 2: repeating K/V heads
#
# Forward: `np.repeat(x, n_rep, axis=1)` puts the $n_{rep}$ copies of head $j$ at positions
# $j n_{rep}, \dots, (j + 1) n_{rep} - 1$. Each copy is read by its own query head: a fork, so the backward
# sums each group, `dy.reshape(B, H_kv, n_rep, T, Dh).sum(axis=2)`.


# %%
def repeat_kv_forward(x, n_rep):
    return np.repeat(x, n_rep, axis=1), (x.shape, n_rep)  # (B, H_kv * n_rep, T, Dh)


def repeat_kv_backward(dy, cache):
    (B, H_kv, T, Dh), n_rep = cache
    return dy.reshape(B, H_kv, n_rep, T, Dh).sum(axis=2)  # (B, H_kv, T, Dh)


x = rng.standard_normal((1, 2, 3, 2))
result = check_pair(repeat_kv_forward, repeat_kv_backward, dict(x=x.copy(), n_rep=3), wrt=["x"], max_coords=None)
print(result)
y, _ = repeat_kv_forward(x, 3)
assert result.worst <= 1e-6 and np.array_equal(y[:, 3], x[:, 1])  # query head 3 reads K/V head 1
print("Exercise 2 checked")

# %% [markdown]
# ### Exercise 3: GeGLU
#
# $g = x W_g^\top$, $u = x W_1^\top$, $\tilde u = \phi(g) \odot u$ with $\phi = \mathrm{GELU}$, $y = \tilde u W_2^\top$.
# Backwards: $d\tilde u = dy\, W_2$, $dW_2 = dy^\top \tilde u$; the product rule $d\phi = d\tilde u \odot u$,
# $du = d\tilde u \odot \phi(g)$; then $dg = d\phi \odot \mathrm{GELU}'(g)$
# with $\mathrm{GELU}'(g) = \Phi(g) + g\, \Phi'(g)$ (walkthrough 03);
# $dW_1 = du^\top x$, $dW_g = dg^\top x$, and $x$ feeds both paths, $dx = du\, W_1 + dg\, W_g$.


# %%
def geglu_forward(x, W_g, W_1, W_2):
    g, u = x @ W_g.T, x @ W_1.T  # (N, F)
    cdf = 0.5 * (1.0 + erf(g / np.sqrt(2.0)))
    phi = g * cdf
    ut = phi * u  # u tilde
    return ut @ W_2.T, (x, W_g, W_1, W_2, g, u, cdf, phi, ut)


def geglu_backward(dy, cache):
    x, W_g, W_1, W_2, g, u, cdf, phi, ut = cache
    dut = dy @ W_2
    dphi, du = dut * u, dut * phi
    dg = dphi * (cdf + g * np.exp(-0.5 * g * g) / np.sqrt(2.0 * np.pi))
    return du @ W_1 + dg @ W_g, dg.T @ x, du.T @ x, dy.T @ ut


N, D, F_ = 3, 4, 6
args = dict(
    x=rng.standard_normal((N, D)),
    W_g=rng.standard_normal((F_, D)) * 0.5,
    W_1=rng.standard_normal((F_, D)) * 0.5,
    W_2=rng.standard_normal((D, F_)) * 0.5,
)
result = check_pair(geglu_forward, geglu_backward, {k: v.copy() for k, v in args.items()}, wrt=list(args))
print(result)
leaves = {k: torch.tensor(v, requires_grad=True) for k, v in args.items()}
y_t = F.linear(F.gelu(F.linear(leaves["x"], leaves["W_g"])) * F.linear(leaves["x"], leaves["W_1"]), leaves["W_2"])
dy = rng.standard_normal((N, D))
y_t.backward(torch.from_numpy(dy))
ours = geglu_backward(dy, geglu_forward(**args)[1])
diff = max(np.abs(g - leaves[k].grad.numpy()).max() for k, g in zip(args, ours, strict=True))
print(f"max |ours - autograd| over dx, dW_g, dW_1, dW_2: {diff:.1e}")
assert result.worst <= 1e-6 and diff <= 1e-14
print("Exercise 3 checked")
