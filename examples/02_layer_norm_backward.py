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
# # 2. Layer norm: the forward pass, the backward pass derived step by step, and a parity trap
#
# *Prerequisites:* walkthrough 01 (the backward as a transposed Jacobian, the fork-sum rule).
# *Time:* 30 minutes. The symbols are those of [the notation table](../docs/notation.md).
#
# Every sublayer of the Transformer sits inside a layer norm, $\mathrm{LayerNorm}(x + \mathrm{Sublayer}(x))$
# in the paper's post-norm placement, $x + \mathrm{Sublayer}(\mathrm{LayerNorm}(x))$ in the pre-norm one.
# Its backward pass is the one most often got wrong by hand, because every output depends on every
# input of its row, through the row's mean and variance.
#
# This walkthrough derives that backward pass one chain-rule step at a time, checks it against an
# explicit Jacobian matrix, against `numpy_transformer.layers.layer_norm_backward`, against PyTorch's
# autograd and against finite differences. It ends with a trap for anyone checking parity with
# PyTorch: the LayerNorm of the Annotated Transformer is a different function from `nn.LayerNorm`.

# %%
import importlib.util
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

if importlib.util.find_spec("numpy_transformer") is None:  # not pip-installed: import from the checkout
    sys.path.insert(0, str((Path(__file__).parent if "__file__" in globals() else Path.cwd()).resolve().parent))

from numpy_transformer.gradcheck import check_pair  # noqa: E402
from numpy_transformer.layers import layer_norm_backward, layer_norm_forward  # noqa: E402

np.set_printoptions(precision=4, suppress=True)

# %% [markdown]
# ## The forward pass
#
# For each row $x \in \mathbb{R}^D$ (one position of one sequence), with a learned gain $\gamma$ and
# bias $\beta$ (the state-dict's `weight` and `bias`):
#
# $$\begin{gathered}
# \mu = \frac{1}{D}\sum_i x_i, \qquad \sigma^2 = \frac{1}{D}\sum_i (x_i - \mu)^2, \qquad
# r = \frac{1}{\sqrt{\sigma^2 + \varepsilon}}, \\ \hat x_i = (x_i - \mu)\, r, \qquad
# y_i = \gamma_i \hat x_i + \beta_i.\end{gathered}$$
#
# Two details decide whether we match `torch.nn.LayerNorm` to the last digit: the variance is the
# *biased* one (divide by $D$, not $D - 1$), and $\varepsilon$ sits *inside* the square root. We keep
# $r$, the reciprocal standard deviation, because the backward pass needs it (so does llm.c's layer
# norm, and ours: its cache holds $\hat x$, $r$ and $\gamma$).
#
# Two rows of width $D = 4$, with a gain and bias away from their initial values of one and zero:

# %%
x = np.array([[1.0, 2.0, 4.0, 7.0], [-1.0, 0.0, 3.0, 0.5]])  # (N, D) = (2, 4)
gamma = np.array([1.0, 0.5, 2.0, -1.0])  # (D,)
beta = np.array([0.0, 0.1, -0.2, 0.3])  # (D,)
eps = 1e-5
N, D = x.shape

mu = x.mean(axis=-1, keepdims=True)  # (N, 1)
xc = x - mu  # centred
var = (xc * xc).mean(axis=-1, keepdims=True)  # (N, 1), biased: divides by D
rstd = 1.0 / np.sqrt(var + eps)  # (N, 1)
x_hat = xc * rstd  # (N, D)
y = x_hat * gamma + beta  # (N, D)
print("mu =", mu.ravel(), " var =", var.ravel(), " rstd =", rstd.ravel())
print("x_hat =\n", x_hat)
print("y =\n", y)

# %% [markdown]
# The library and PyTorch compute the same thing:

# %%
y_lib, cache = layer_norm_forward(x, gamma, beta, eps)
y_torch = F.layer_norm(torch.tensor(x), (D,), torch.tensor(gamma), torch.tensor(beta), eps).numpy()
print("max |by hand - library| =", np.abs(y - y_lib).max())
print("max |by hand - torch|   =", np.abs(y - y_torch).max())
assert np.abs(y - y_lib).max() <= 1e-12 and np.abs(y - y_torch).max() <= 1e-12

# %% [markdown]
# ## Your turn: layer norm's $dx$
#
# Before reading on, try the gradient of the input yourself: $x$ reaches $\hat x$ directly, through the
# mean and through the variance. Write $dx$ from $dy$, $\hat x$, $r$ (`rstd`) and $\gamma$ in `your_dx`, in
# place of `return None`. The cell after the boxed formula checks it, and names a missing term. The
# workbook's `layer_norm` exercise goes further (dgamma and dbeta, batches, float32):
# `transformer-parity exercises DIR --only layer_norm`.


# %%
def your_dx(dy, x_hat, rstd, gamma):
    """dy, x_hat (N, D), rstd (N, 1), gamma (D,) -> dx (N, D): your turn."""
    return None


# %% [markdown]
# ## The backward pass, one forward line at a time
#
# The upstream gradient $dy = \partial \mathcal{L} / \partial y$ is random (why not ones: see below). We walk
# the forward lines from the last to the first; each comment quotes the forward line being inverted.
#
# **The affine part**, $y = \gamma \odot \hat x + \beta$. The gain and bias are shared by all $N$
# rows, so their gradients are sums over rows:
#
# $$d\beta = \sum_{\text{rows}} dy, \qquad d\gamma = \sum_{\text{rows}} dy \odot \hat x, \qquad
# d\hat x = dy \odot \gamma.$$

# %%
rng = np.random.default_rng(0)
dy = np.round(rng.standard_normal((N, D)), 1)  # (N, D)
print("dy =\n", dy)

# y = x_hat * gamma + beta
dbeta = dy.sum(axis=0)  # (D,)
dgamma = (dy * x_hat).sum(axis=0)  # (D,)
dx_hat = dy * gamma  # (N, D)

# %% [markdown]
# **Normalising**, $\hat x = x_c\, r$ with $x_c = x - \mu$. Both factors depend on $x$: paths fork, so
# the gradients that come back along them add (walkthrough 01's rule). The gradient splits: a direct
# part into $x_c$, and a part into the scalar $r$ of each row, which collects a sum over the row
# because $r$ multiplies every entry:
#
# $$dx_c \mathrel{+}= d\hat x\, r, \qquad dr = \sum_i d\hat x_i\, x_{c,i}.$$
#
# **The path through $\sigma^2$.** $r = (\sigma^2 + \varepsilon)^{-1/2}$ gives
# $d\sigma^2 = -\tfrac12 (\sigma^2+\varepsilon)^{-3/2}\, dr = -\tfrac12 r^3\, dr$, and
# $\sigma^2 = \frac1D \sum_i x_{c,i}^2$ sends it back to the centred values:
# $dx_c \mathrel{+}= d\sigma^2 \cdot 2 x_c / D$.
#
# **The path through $\mu$.** $x_c = x - \mu$: $x$ gets $dx_c$ directly, and $\mu$ gets
# $d\mu = -\sum_i dx_{c,i}$; then $\mu = \frac1D \sum_i x_i$ hands $d\mu / D$ to every entry.

# %%
# x_hat = xc * rstd
dxc = dx_hat * rstd  # the direct path
drstd = (dx_hat * xc).sum(axis=-1, keepdims=True)  # (N, 1)
# rstd = (var + eps) ** -0.5
dvar = -0.5 * rstd**3 * drstd  # (N, 1)
# var = mean(xc * xc)
dxc += dvar * 2.0 * xc / D  # the path through the variance
# xc = x - mu
dx_staged = dxc.copy()
dmu = -dxc.sum(axis=-1, keepdims=True)  # (N, 1)
# mu = mean(x)
dx_staged += dmu / D  # the path through the mean
print("dx (step by step) =\n", dx_staged)

# %% [markdown]
# ## Simplifying
#
# Substitute and tidy up. The variance path contributes
# $d\sigma^2 \cdot 2 x_c / D = -r^3 x_c \cdot \frac1D\sum_{j'} d\hat x_{j'}\, x_{c,j'} = -r\, \hat x \cdot
# \mathrm{mean}(d\hat x \odot \hat x)$, so
#
# $$dx_c = r\big(d\hat x - \hat x\, \mathrm{mean}(d\hat x \odot \hat x)\big).$$
#
# The mean path subtracts the row mean of that. The mean of $\hat x$ is zero, so the mean of the
# second term vanishes and only $\mathrm{mean}(d\hat x)$ is left:
#
# $$\boxed{\,dx = r\,\big(d\hat x - \mathrm{mean}(d\hat x) - \hat x\,\mathrm{mean}(d\hat x \odot \hat x)\big)\,}$$
#
# (means over the row). A reading of it: scale $d\hat x$ by $r$, then remove its component along the
# all-ones vector (the mean's path: shifting a whole row does not change $\hat x$) and its component
# along $\hat x$ (the variance's path: scaling a row does not change $\hat x$, up to $\varepsilon$).
# This is the line in `layer_norm_backward`.

# %%
dx_compact = rstd * (
    dx_hat - dx_hat.mean(axis=-1, keepdims=True) - x_hat * (dx_hat * x_hat).mean(axis=-1, keepdims=True)
)
print("dx (boxed formula) =\n", dx_compact)
print("max |step by step - formula| =", np.abs(dx_staged - dx_compact).max())
assert np.abs(dx_staged - dx_compact).max() <= 1e-14

# %% [markdown]
# **Your turn, checked**; then a classic mistake, the mean's path left out.

# %%
from parity_tests.check.your_turn import checker  # noqa: E402

check = checker(
    {"dx": dx_compact},
    reference="layer_norm",
    args={"x": x, "weight": gamma, "bias": beta, "eps": eps},
    dout=dy,
    wrt={"dx": "x"},
    exercise="layer_norm",
)
check("dx", your_dx(dy, x_hat, rstd, gamma))
print("\nwithout - mean(dx_hat):")
assert not check("dx", rstd * (dx_hat - x_hat * (dx_hat * x_hat).mean(axis=-1, keepdims=True)))

# %% [markdown]
# ## The naive way: the full $D \times D$ Jacobian
#
# A second derivation, with no clever staging, for one row. Differentiate $\hat x_i$ with respect to
# $x_j$ directly: $\partial x_{c,i}/\partial x_j = \delta_{ij} - 1/D$;
# $\partial \sigma^2/\partial x_j = \frac2D \sum_{j'} x_{c,j'}(\delta_{j'j} - \frac1D) = \frac2D x_{c,j}$
# (the $\sum_{j'} x_{c,j'}$ term is zero); hence $\partial r/\partial x_j = -r^3 x_{c,j}/D$ and
#
# $$\begin{gathered}
# J_{ij} = \frac{\partial \hat x_i}{\partial x_j} = r\Big(\delta_{ij} - \frac1D
# - \frac{\hat x_i\,\hat x_j}{D}\Big), \qquad \frac{\partial y_i}{\partial x_j} = \gamma_i J_{ij}, \\
# dx_j = \sum_i dy_i\, \gamma_i\, J_{ij}, \text{ i.e. } dx = J^\top (\gamma \odot dy).\end{gathered}$$
#
# (The transposed Jacobian times the upstream gradient, as every backward pass computes: walkthrough 01,
# step 6.)
#
# We build $J$ for row 0 as a matrix, check it against the Jacobian PyTorch computes by autograd, and
# check $J^\top (\gamma \odot dy)$ against the library's `layer_norm_backward`. Building $J$ costs
# $D^2$ per row, $262{,}144$ entries for $D = 512$; the boxed formula costs a few passes over $D$.
# Same numbers, very different bill.

# %%
row = 0
xh = x_hat[row]
J = rstd[row, 0] * (np.eye(D) - 1.0 / D - np.outer(xh, xh) / D)  # (D, D), J[i, j] = d x_hat_i / d x_j
print("J (row 0) =\n", J)


def layer_norm_of_row(v):
    return F.layer_norm(v, (D,), torch.tensor(gamma), torch.tensor(beta), eps)


J_autograd = torch.autograd.functional.jacobian(layer_norm_of_row, torch.tensor(x[row])).numpy()  # dy_i / dx_j
print("max |gamma_i J_ij - autograd's dy_i/dx_j| =", np.abs(gamma[:, None] * J - J_autograd).max())
assert np.abs(gamma[:, None] * J - J_autograd).max() <= 1e-12

dx_lib, dgamma_lib, dbeta_lib = layer_norm_backward(dy, cache)
dx_row_jacobian = J.T @ (gamma * dy[row])
print("dx row 0 from the Jacobian:", dx_row_jacobian)
print("dx row 0 from the library: ", dx_lib[row])
assert np.abs(dx_row_jacobian - dx_lib[row]).max() <= 1e-12

# %% [markdown]
# The library's whole backward, against our step-by-step gradients, for both rows:

# %%
for name, mine, lib in (("dx", dx_staged, dx_lib), ("dgamma", dgamma, dgamma_lib), ("dbeta", dbeta, dbeta_lib)):
    print(f"{name:7} max |by hand - library| = {np.abs(mine - lib).max():.1e}")
    assert np.abs(mine - lib).max() <= 1e-12

# %% [markdown]
# ## PyTorch's autograd
#
# `nn.LayerNorm` in float64, our parameters copied in, the same upstream gradient:

# %%
norm = torch.nn.LayerNorm(D, eps=eps, dtype=torch.float64)
with torch.no_grad():
    norm.weight.copy_(torch.tensor(gamma))
    norm.bias.copy_(torch.tensor(beta))
x_t = torch.tensor(x, requires_grad=True)
norm(x_t).backward(torch.tensor(dy))
for name, mine, theirs in (
    ("dx", dx_lib, x_t.grad),
    ("dgamma", dgamma_lib, norm.weight.grad),
    ("dbeta", dbeta_lib, norm.bias.grad),
):
    print(f"{name:7} max |library - torch| = {np.abs(mine - theirs.numpy()).max():.1e}")
    assert np.abs(mine - theirs.numpy()).max() <= 1e-12

# %% [markdown]
# ## The trap: an upstream gradient of ones
#
# The columns of $J$ sum to zero: $\sum_i J_{ij} = r(1 - 1 - \hat x_j \sum_i \hat x_i / D) = 0$,
# because $\hat x$ has mean zero. In words, $\sum_i \hat x_i = 0$ *whatever* $x$ is, so a loss
# $\mathcal{L} = \sum_i \hat x_i$ is constant and has no gradient. Now a freshly initialised layer norm has
# $\gamma = 1$, $\beta = 0$: there $y = \hat x$, and a test that calls `y.sum().backward()` checks
# $dx = 0$. A backward pass that returned zeros would pass it. (In the paper's post-norm model every
# sublayer ends in a layer norm, so the same `.sum()` silences the gradient of everything beneath.)

# %%
y0, cache0 = layer_norm_forward(x, np.ones(D), np.zeros(D), eps)  # gamma = 1, beta = 0: the initial values
dx_from_ones, _, _ = layer_norm_backward(np.ones_like(y0), cache0)
print("column sums of J:", J.sum(axis=0))
print("dx for dy = 1, gamma = 1 (zero up to rounding):\n", dx_from_ones)
assert np.abs(dx_from_ones).max() <= 1e-14
dx_from_random, _, _ = layer_norm_backward(dy, cache0)
assert np.abs(dx_from_random).max() > 1e-2  # a random dy gives a real test

# %% [markdown]
# ## Finite differences
#
# The last check needs no derivation: perturb each coordinate of $x$, $\gamma$, $\beta$ by
# $\pm 10^{-5}$, rerun the forward, and compare the central difference of $\mathcal{L} = \sum y \odot G$
# ($G$ random) with the analytic gradient. `check_pair` does exactly that.

# %%
result = check_pair(
    layer_norm_forward,
    layer_norm_backward,
    dict(x=x.copy(), weight=gamma.copy(), bias=beta.copy(), eps=eps),
    wrt=["x", "weight", "bias"],
    max_coords=None,
)
print(result)
assert result.worst <= 1e-6

# %% [markdown]
# ## A parity trap: the Annotated Transformer's LayerNorm
#
# The Annotated Transformer (Harvard NLP) writes its own layer norm: it divides $x - \mu$ by
# `x.std(-1)` plus $\varepsilon = 10^{-6}$. Two differences from `nn.LayerNorm`, each harmless for
# training and each fatal for a parity test:
#
# 1. `Tensor.std` is the *unbiased* estimate, $\sqrt{\sum (x - \mu)^2 / (D - 1)}$. For a row with
#    $\sigma^2 \gg \varepsilon$ the output shrinks by the factor $\sqrt{(D-1)/D}$: 13% for $D = 4$,
#    0.1% for $D = 512$. At $D = 512$ that is small enough to pass for noise in a loss curve, and
#    ten million times the $10^{-10}$ bar of our float64 parity tests.
# 2. $\varepsilon$ is added to the standard deviation, *outside* the square root: $\sigma + \varepsilon$
#    instead of $\sqrt{\sigma^2 + \varepsilon}$. It matters for rows of small variance, where the
#    two differ by a large factor.
#
# Below, a NumPy version of that formula (written from its definition), against `nn.LayerNorm` with
# the same $\varepsilon$, then each difference on its own.


# %%
def annotated_style_layer_norm(x, gain, bias, eps=1e-6):
    """gain * (x - mean) / (std + eps) + bias, with the unbiased std (ddof=1) and eps outside the root."""
    mean = x.mean(axis=-1, keepdims=True)
    std = x.std(axis=-1, ddof=1, keepdims=True)
    return gain * (x - mean) / (std + eps) + bias


def torch_layer_norm(x, eps):
    return torch.nn.functional.layer_norm(torch.tensor(x), (x.shape[-1],), eps=eps).numpy()


wide = np.random.default_rng(1).standard_normal((3, 512))
for name, rows in (("D = 4", x), ("D = 512", wide)):
    theirs = annotated_style_layer_norm(rows, 1.0, 0.0)
    ours = torch_layer_norm(rows, 1e-6)
    d = rows.shape[-1]
    ratio = np.linalg.norm(theirs) / np.linalg.norm(ours)
    print(
        f"{name:8} max |annotated - nn.LayerNorm| = {np.abs(theirs - ours).max():.2e};"
        f"  size ratio = {ratio:.6f};  sqrt((D-1)/D) = {np.sqrt((d - 1) / d):.6f}"
    )
    assert np.abs(theirs - ours).max() > 1e-4

# %% [markdown]
# The placement of $\varepsilon$ on its own: keep the biased variance, and feed a row whose spread
# ($\sigma \approx 10^{-3}$) is comparable to $\sqrt{\varepsilon}$ with PyTorch's default
# $\varepsilon = 10^{-5}$. Inside the root, $\varepsilon$ dominates the denominator; outside, it
# barely matters. (Such rows are not exotic: a residual stream that has nearly collapsed, or padding
# positions, produce them.)

# %%
flat_row = 5.0 + 1e-3 * np.array([[1.0, -1.0, 2.0, -2.0]])
sigma = flat_row.std(axis=-1, keepdims=True)  # biased
inside = (flat_row - flat_row.mean()) / np.sqrt(sigma**2 + 1e-5)  # nn.LayerNorm
outside = (flat_row - flat_row.mean()) / (sigma + 1e-5)
print("eps inside the root :", inside.ravel())
print("eps outside the root:", outside.ravel())
assert np.abs(inside - torch_layer_norm(flat_row, 1e-5)).max() <= 1e-12
assert np.abs(inside - outside).max() > 0.5

# %% [markdown]
# Fix both (biased variance, $\varepsilon$ inside the root) and the difference is rounding:


# %%
def nn_style_layer_norm(x, gain, bias, eps=1e-6):
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)  # ddof=0: biased
    return gain * (x - mean) / np.sqrt(var + eps) + bias


fixed_diff = np.abs(nn_style_layer_norm(wide, 1.0, 0.0) - torch_layer_norm(wide, 1e-6)).max()
print(f"max |fixed version - nn.LayerNorm| = {fixed_diff:.1e}")
assert fixed_diff <= 1e-12

# %% [markdown]
# ## Summary
#
# - forward: $\hat x = (x - \mu)\, r$ with $r = (\sigma^2 + \varepsilon)^{-1/2}$ (biased variance), and
#   $y = \gamma \odot \hat x + \beta$;
# - backward: $d\beta = \sum_{\text{rows}} dy$, $d\gamma = \sum_{\text{rows}} dy \odot \hat x$,
#   $d\hat x = dy \odot \gamma$, and
#   $dx = r\,\big(d\hat x - \mathrm{mean}(d\hat x) - \hat x\, \mathrm{mean}(d\hat x \odot \hat x)\big)$.
#
# The two subtracted terms are the paths through $\mu$ and $\sigma^2$; they are also why an upstream
# gradient of ones tells you nothing about a layer norm with $\gamma = 1$.
#
# Next: walkthrough 03 runs this backward inside every sublayer of a whole model.
#
# ## Exercises
#
# Answers, worked and checked, are in `examples/answers/02_answers.py`. Check yours with
# `numpy_transformer.gradcheck.check_pair`.
#
# 1. **RMSNorm from the staged derivation.** RMSNorm drops the mean: $y = \gamma \odot x\, r$ with
#    $r = (\mathrm{mean}(x^2) + \varepsilon)^{-1/2}$. Walk its forward lines backwards as this walkthrough
#    did, arrive at $dx = r\,\big(d\hat x - \hat x\, \mathrm{mean}(d\hat x \odot \hat x)\big)$, and check
#    your pair. (Walkthrough 06 has the derivation; try it first.)
# 2. **Two invariances, seen in the gradient.** For any upstream $dy$ (take $\gamma = 1$, $\beta = 0$), show
#    that $\sum_j dx_j = 0$ and $\hat x \cdot dx = r\, (\hat x \cdot dy)\, \varepsilon / (\sigma^2 + \varepsilon)$,
#    from the boxed formula. Explain each with an invariance of the forward: shifting a row changes
#    nothing; scaling it changes nothing when $\varepsilon = 0$. Check both numerically.
# 3. **The Annotated Transformer's LayerNorm, backwards.** Derive the backward of
#    $y = \gamma \odot (x - \mu) / (\tilde\sigma + \varepsilon) + \beta$ with $\tilde\sigma$ the *unbiased* standard
#    deviation ($D - 1$ in the denominator), and check it with `check_pair`. Where does it differ from the
#    boxed formula?
