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
# # 1. Scaled dot-product attention, forward and backward, by hand
#
# *Prerequisites:* matrix products, the chain rule for a function of several variables, NumPy
# indexing. *Time:* 40 minutes. The symbols are those of [the notation table](../docs/notation.md);
# the mask convention and the error measure are stated in [the conventions](../docs/conventions.md).
#
# Equation (1) of "Attention Is All You Need":
#
# $$\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_h}}\right) V$$
#
# In this walkthrough we compute it, and every gradient of it, on matrices small enough to print:
# two queries ($T_q = 2$), three keys and values ($T_k = 3$), head width $d_h = 2$. Each step is
# first written as a line or two of plain NumPy, next to the equation it implements. Then the same
# numbers come out of `numpy_transformer.attention`, out of PyTorch's autograd, and out of central
# finite differences, and the script asserts that they agree.
#
# Run it as a script (`python examples/01_attention_by_hand.py`) or open it as a notebook with
# jupytext.

# %%
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

# The checkout's root: the figures' code is in examples/plotting.py (and the packages, if not pip-installed).
sys.path.insert(0, str((Path(__file__).parent if "__file__" in globals() else Path.cwd()).resolve().parent))
OUT = Path(os.environ.get("WALKTHROUGH_OUT", "runs/walkthrough_01"))  # where the figures go
OUT.mkdir(parents=True, exist_ok=True)

from examples import plotting  # noqa: E402
from numpy_transformer import (  # noqa: E402
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)
from numpy_transformer.gradcheck import check_pair  # noqa: E402

np.set_printoptions(precision=4, suppress=True)

# %% [markdown]
# ## The inputs
#
# One query per row of $Q$ (shape $T_q \times d_h$), one key per row of $K$ and one value per row of
# $V$ (both $T_k \times d_h$). Inside a Transformer these come out of the learned projections
# $x W_Q^\top$, $x W_K^\top$, $x W_V^\top$; here we simply write them down. Everything is float64,
# the precision in which gradients can be checked to twelve digits.

# %%
Q = np.array([[1.0, 0.0], [1.0, -2.0]])  # (T_q, Dh) = (2, 2)
K = np.array([[1.0, 2.0], [0.0, 1.0], [-2.0, 1.0]])  # (T_k, Dh) = (3, 2)
V = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]])  # (T_k, Dh) = (3, 2)
T_q, Dh = Q.shape
T_k = K.shape[0]
print("Q =\n", Q, "\nK =\n", K, "\nV =\n", V)

# %% [markdown]
# ## Step 1: scores
#
# $$S = \frac{Q K^\top}{\sqrt{d_h}} = c\, Q K^\top, \qquad s_{ij} = c\, q_i \cdot k_j, \qquad c = \frac{1}{\sqrt{d_h}}$$
#
# The scale $c$ (`scale` in the code) comes back in the backward pass (step 7).
# Entry $(i, j)$ says how well query $i$ matches key $j$. Why divide by $\sqrt{d_h}$? If the
# components of $q$ and $k$ are independent with unit variance, $q \cdot k$ is a sum of $d_h$ such
# products and has variance $d_h$. Without the scale, wide heads would produce large scores, the
# softmax would saturate to a near one-hot vector, and its gradient (step 6) would be close to zero.

# %%
scale = 1.0 / math.sqrt(Dh)
S = Q @ K.T * scale  # (T_q, T_k)
print("S =\n", S)

# %% [markdown]
# ## Step 2: the mask
#
# A boolean mask of the scores' shape says which keys each query may look at. In this project (as in
# `F.scaled_dot_product_attention`) **True means "may attend"**. The decoder's causal mask and the
# padding masks are built this way. A masked score is replaced by $-\infty$ before the softmax, so
# that $e^{-\infty} = 0$ gives it zero probability.
#
# Here query 0 may not look at key 2 (as if key 2 lay in its future); query 1 sees all three keys.

# %%
mask = np.array([[True, True, False], [True, True, True]])  # (T_q, T_k), True = may attend
S_masked = np.where(mask, S, -np.inf)
print("S with masked entries at -inf =\n", S_masked)

# %% [markdown]
# What if a row is masked *entirely*: a query that may attend to nothing (a padded query whose keys
# are all padding, say)? A softmax over an empty set is $0 / 0$: the textbook formula gives NaN, and
# a NaN in one row of one batch poisons the loss and every gradient after it. This project's
# convention ([the conventions](../docs/conventions.md)) is that such a row gets **all-zero
# probabilities**, so its attention output is zero and no gradient flows back through its scores.

# %%
row = np.full(3, -np.inf)  # a fully masked row of scores
with np.errstate(invalid="ignore"):
    textbook = np.exp(row - row.max()) / np.exp(row - row.max()).sum()  # -inf - (-inf) = NaN
print("textbook softmax of a fully masked row:", textbook)
print("this project's answer:                 ", np.zeros(3))

# %% [markdown]
# ## Step 3: softmax
#
# $$p_{ij} = \frac{e^{s_{ij} - m_i}}{\sum_{j'} e^{s_{ij'} - m_i}}, \qquad m_i = \max_{j'} s_{ij'}$$
#
# Subtracting the row maximum $m_i$ leaves the result unchanged (it multiplies numerator and
# denominator by the same $e^{-m_i}$) and keeps $e^{x}$ from overflowing. Keep this *shift
# invariance* in mind: adding the same number to every score of a row does not change the
# probabilities. It is why, in a real model, the key projection's bias never gets a gradient
# (walkthrough 03).
#
# Each row of $P$ is a probability distribution over the keys: non-negative, summing to one, and
# exactly zero where the mask says no.

# %%
m = S_masked.max(axis=-1, keepdims=True)  # (T_q, 1)
e = np.exp(S_masked - m)
P = e / e.sum(axis=-1, keepdims=True)  # (T_q, T_k)
print("P =\n", P)
print("row sums of P:", P.sum(axis=-1))

# %% [markdown]
# ## Step 4: the output
#
# $$O = P V, \qquad o_i = \sum_j p_{ij} v_j$$
#
# Each output row is a weighted average of the value rows, weighted by how well the query matched
# each key.

# %%
O = P @ V  # (T_q, Dh)
print("O =\n", O)

# %% [markdown]
# The library computes the same thing. Its arrays have the shape (B, H, T, Dh), batch and heads
# first; we add two axes of size one. The cache it returns keeps what the backward pass will need
# (the inputs, the scale and the probabilities).

# %%
q4, k4, v4, mask4 = Q[None, None], K[None, None], V[None, None], mask[None, None]  # (1, 1, T, Dh)
out_lib, cache = scaled_dot_product_attention_forward(q4, k4, v4, mask4)
print("library O =\n", out_lib[0, 0])
print("library P =\n", cache.probs[0, 0])
assert np.abs(out_lib[0, 0] - O).max() <= 1e-12
assert np.abs(cache.probs[0, 0] - P).max() <= 1e-12

# %% [markdown]
# ## The backward pass
#
# Somewhere above this attention there is a scalar loss $\mathcal{L}$. The backward pass receives the
# *upstream gradient* $dO = \partial \mathcal{L} / \partial O$ (same shape as $O$) and must return
# $dQ, dK, dV$. We draw $dO$ at random (and round it to print nicely). Equivalently, the loss is
# $\mathcal{L} = \sum_{i,d} O_{id}\, G_{id}$ for a fixed random $G = dO$. Why random and not all ones
# is the subject of step 8.
#
# Notation: $dX$ always means $\partial \mathcal{L} / \partial X$, the same shape as $X$.

# %%
rng = np.random.default_rng(0)
dO = np.round(rng.standard_normal((T_q, Dh)), 1)  # (T_q, Dh)
print("dO =\n", dO)

# %% [markdown]
# The whole computation as a graph. The forward pass runs left to right (black arrows, each labelled
# with the value it carries and that value's shape); the backward pass runs right to left (red, dashed),
# each arrow carrying the gradient of the same value, with the same shape. Steps 5 to 7 walk the red
# arrows from $dO$ back to $dQ$, $dK$ and $dV$.

# %%
nodes = {
    "Q": (0.0, 2.6, "$Q$"),
    "K": (0.0, 0.8, "$K$"),
    "V": (0.0, -0.5, "$V$"),
    "S": (2.2, 1.8, "$S = c\\,QK^\\top$"),
    "P": (4.4, 1.8, "$P = \\mathrm{softmax}(S)$\n(mask: $P = 0$)"),
    "O": (6.0, 0.6, "$O = PV$"),
    "L": (7.4, 0.6, "$\\mathcal{L}$"),
}
edges = [
    ("Q", "S", "Q", f"({T_q}, {Dh})"),
    ("K", "S", "K", f"({T_k}, {Dh})"),
    ("S", "P", "S", f"({T_q}, {T_k})"),
    ("P", "O", "P", f"({T_q}, {T_k})"),
    ("V", "O", "V", f"({T_k}, {Dh})"),
    ("O", "L", "O", f"({T_q}, {Dh})"),
]
plotting.plot_computation_graph(nodes, edges, OUT / "graph.png", "one attention head")

# %% [markdown]
# ## Step 5: through $O = P V$
#
# $O_{id} = \sum_j P_{ij} V_{jd}$ is linear in both factors. The chain rule gives
#
# $$\frac{\partial \mathcal{L}}{\partial V_{jd}} = \sum_i P_{ij}\, dO_{id} \;\Rightarrow\; dV = P^\top dO,
# \qquad
# \frac{\partial \mathcal{L}}{\partial P_{ij}} = \sum_d dO_{id}\, V_{jd} \;\Rightarrow\; dP = dO\, V^\top.$$
#
# (A rule of thumb that checks every matrix product: the gradient has the shape of the thing it is
# the gradient of, and there is only one way to multiply the other two factors to get that shape.)

# %%
dV = P.T @ dO  # (T_k, Dh)
dP = dO @ V.T  # (T_q, T_k)
print("dV =\n", dV)
print("dP =\n", dP)

# %% [markdown]
# ## Your turn: the softmax's backward
#
# Before reading step 6, derive the gradient of the scores yourself: write $dS$ (before the scale $c$)
# from $dP$ and $P$ in `your_dS` below, in place of `return None`, without building the $T_k \times T_k$
# Jacobian. The cell after step 6 compares yours with the walkthrough's own, and names the mistake when it
# is a known one. The workbook's `softmax` exercise goes further (padding, a fully masked row, large scores,
# float32): `transformer-parity exercises DIR --only softmax`.


# %%
def your_dS(dP, P):
    """dP, P (T_q, T_k) -> dS (T_q, T_k), the gradient of the scaled scores: your turn."""
    return None


# %% [markdown]
# ## Step 6: through the softmax
#
# Take one row: $p = \mathrm{softmax}(s)$, $p_i = e^{s_i} / Z$ with $Z = \sum_{j} e^{s_{j}}$. By the
# quotient rule, using $\partial Z / \partial s_j = e^{s_j}$,
#
# $$\frac{\partial p_i}{\partial s_j} = \frac{\delta_{ij} e^{s_i}}{Z} - \frac{e^{s_i} e^{s_j}}{Z^2}
# = p_i(\delta_{ij} - p_j).$$
#
# As a matrix, the Jacobian of one row is $J = \mathrm{diag}(p) - p p^\top$ (symmetric), where in
# general the Jacobian $J_f$ of a step $y = f(x)$ holds $(J_f)_{ij} = \partial y_i / \partial x_j$. The
# gradient with respect to the scores sums over every probability that $s_j$ moves:
#
# $$ds_j = \sum_i dp_i\, p_i(\delta_{ij} - p_j) = p_j\, dp_j - p_j \sum_i dp_i\, p_i
# = p_j\Big(dp_j - \sum_i dp_i\, p_i\Big).$$
#
# In matrix form that sum is $ds = J^\top dp$: **the transposed Jacobian times the upstream
# gradient**. Every backward pass in this project computes $dx = J_f^\top\, dy$ for its step $y = f(x)$
# (a *vector-Jacobian product*), and for a chain $y = g(f(x))$ the chain rule applies the transposed
# Jacobians in reverse order, $dx = J_f^\top J_g^\top\, dy$: that is why a backward pass runs the forward
# backwards. The trick is never to build $J$: here the product collapses to a formula.
#
# For the whole matrix: $dS = P \odot \big(dP - \mathrm{rowsum}(dP \odot P)\big)$. No $T_k \times T_k$
# Jacobian is ever built: one product, one row sum, one subtraction. Two consequences can be read
# straight off the formula:
#
# - where $p_j = 0$ (a masked key) $ds_j = 0$: masked entries receive no gradient, and a fully
#   masked row (all $p = 0$) sends back exactly zero, never NaN;
# - the entries of each row of $dS$ sum to zero, $\sum_j ds_j = \sum_j p_j dp_j - 1 \cdot \sum_i p_i
#   dp_i = 0$: the shift invariance of step 3 again, seen from the gradient side.
#
# We first do it the slow way, with the explicit Jacobian of each row, then with the formula.

# %%
dS_jacobian = np.zeros_like(P)
for i in range(T_q):
    J = np.diag(P[i]) - np.outer(P[i], P[i])  # (T_k, T_k), J[a, b] = dp_a / ds_b
    dS_jacobian[i] = J.T @ dP[i]  # ds_b = sum_a dp_a * J[a, b]
    if i == 0:
        print("Jacobian of row 0 (key 2 is masked: its row and column are zero) =\n", J)

dS = P * (dP - (dP * P).sum(axis=-1, keepdims=True))  # (T_q, T_k)
print("dS from the Jacobians =\n", dS_jacobian)
print("dS from the formula   =\n", dS)
print("row sums of dS:", dS.sum(axis=-1))
assert np.abs(dS_jacobian - dS).max() <= 1e-15

# %% [markdown]
# The three matrices side by side. In $P$ the masked entry (query 0, key 2) is zero, so in
# $dS = P \odot (\dots)$ it is zero too, whatever $dP$ holds there. Each row of $dS$ sums to zero: a
# row's reds and blues balance. Each entry of $dS$ is $dP$'s entry minus the row's $P$-weighted mean of
# $dP$, scaled by $p_{ij}$: a key that gets little attention gets little gradient.

# %%
plotting.plot_matrices({"P": P, "dP": dP, "dS": dS}, OUT / "P_dP_dS.png", "the softmax backward, one head")

# %% [markdown]
# **Your turn, checked.** `check` compares your `dS` with the one derived above (float64, relative error at
# most $10^{-10}$), then, on a classic mistake, shows what it says when the row term is left out.

# %%
from parity_tests.check.your_turn import checker  # noqa: E402

check = checker(
    {"dS": dS}, reference="softmax", args={"x": S, "mask": mask}, dout=dP, wrt={"dS": "x"}, exercise="softmax"
)
check("dS", your_dS(dP, P))
print("\nP * dP, the row term forgotten:")
assert not check("dS", P * dP)

# %% [markdown]
# ## Step 7: through $S = Q K^\top / \sqrt{d_h}$
#
# With the scale $c = 1/\sqrt{d_h}$ of step 1, $S_{ij} = c \sum_d Q_{id} K_{jd}$, so
#
# $$dQ = c\, dS\, K, \qquad dK = c\, dS^\top Q.$$
#
# The same scale $c$ that tamed the forward pass multiplies the gradients on the way back.

# %%
dQ = scale * dS @ K  # (T_q, Dh)
dK = scale * dS.T @ Q  # (T_k, Dh)
print("dQ =\n", dQ)
print("dK =\n", dK)

# %% [markdown]
# ## Step 8: why the upstream gradient must not be all ones
#
# It is tempting to test a backward pass with `out.sum().backward()`, an upstream gradient of ones.
# For a softmax this is useless: $\sum_j p_{ij} = 1$ whatever the scores are, so the loss
# $\mathcal{L} = \sum P$ is a constant, and its gradient is zero. The formula shows it:
# $dP = 1 \Rightarrow dS = P \odot (1 - \mathrm{rowsum}(P)) = P \odot (1 - 1) = 0$.
# A softmax backward that returned zeros, or anything times $(1 - 1)$, would pass such a test.

# %%
ones_dP = np.ones_like(P)
dS_from_ones = P * (ones_dP - (ones_dP * P).sum(axis=-1, keepdims=True))
print("dS when dP is all ones (zero up to rounding):\n", dS_from_ones)
assert np.abs(dS_from_ones).max() <= 1e-15

# %% [markdown]
# For the whole attention, $dO = 1$ does not make $dS$ vanish (the values $V$ weight the keys
# differently), but it is still a weak test: $dP = 1\, V^\top$ has *every row equal* (entry $j$ is the
# sum of value row $j$). A backward pass that mixes up the query rows of $dP$, a transposed index
# or a reversed loop, gives the right answer for $dO = 1$ and the wrong one for any other $dO$.
# Below, `bug` reverses the rows of $dP$.


# %%
def scores_gradient(dO, bug=False):
    dP = dO @ V.T
    if bug:
        dP = dP[::-1]  # the mistake: query rows swapped
    return P * (dP - (dP * P).sum(axis=-1, keepdims=True))


ones_dO = np.ones_like(O)
print(
    "with dO = 1:      max |correct - buggy| =", np.abs(scores_gradient(ones_dO) - scores_gradient(ones_dO, True)).max()
)
print("with dO = random: max |correct - buggy| =", np.abs(scores_gradient(dO) - scores_gradient(dO, True)).max())
assert np.abs(scores_gradient(ones_dO) - scores_gradient(ones_dO, True)).max() <= 1e-15
assert np.abs(scores_gradient(dO) - scores_gradient(dO, True)).max() > 1e-2

# %% [markdown]
# The same trap hides in layer norm (walkthrough 02). That is why every test in this project draws a
# random upstream gradient, and also asserts that the gradients it compares are not all zero.

# %% [markdown]
# ## Step 9: the library's backward
#
# `scaled_dot_product_attention_backward(dout, cache)` implements steps 5 to 7, with the batch and
# head axes in front. It returns the gradients in the order of the forward's inputs: $dQ, dK, dV$, and a fourth,
# the gradient of T5's relative-position table when the scores read one (None here: always four values).

# %%
dq_lib, dk_lib, dv_lib, _ = scaled_dot_product_attention_backward(dO[None, None], cache)
for name, mine, lib in (("dQ", dQ, dq_lib), ("dK", dK, dk_lib), ("dV", dV, dv_lib)):
    diff = np.abs(mine - lib[0, 0]).max()
    print(f"{name}: max |by hand - library| = {diff:.1e}")
    assert diff <= 1e-12

# %% [markdown]
# ## Step 10: PyTorch's autograd
#
# Now an implementation we did not write: autograd differentiates PyTorch's fused
# `F.scaled_dot_product_attention`, and, separately, the same formula spelled out with `softmax`.
# Both in float64, both given the same upstream gradient $dO$ through `out.backward(dO)`.


# %%
def torch_inputs():
    return [torch.tensor(a[None, None], dtype=torch.float64, requires_grad=True) for a in (Q, K, V)]


mask_t = torch.tensor(mask)
dO_t = torch.tensor(dO[None, None])

q_t, k_t, v_t = torch_inputs()
out_fused = F.scaled_dot_product_attention(q_t, k_t, v_t, attn_mask=mask_t)  # (1, 1, T_q, Dh)
out_fused.backward(dO_t)
fused = {"O": out_fused.detach(), "dQ": q_t.grad, "dK": k_t.grad, "dV": v_t.grad}

q_t, k_t, v_t = torch_inputs()
scores_t = (q_t @ k_t.transpose(-2, -1) / math.sqrt(Dh)).masked_fill(~mask_t, float("-inf"))
out_explicit = torch.softmax(scores_t, dim=-1) @ v_t
out_explicit.backward(dO_t)
explicit = {"O": out_explicit.detach(), "dQ": q_t.grad, "dK": k_t.grad, "dV": v_t.grad}

by_hand = {"O": O, "dQ": dQ, "dK": dK, "dV": dV}
print(f"{'':4} {'vs F.scaled_dot_product_attention':>34} {'vs explicit softmax':>20}")
for name, mine in by_hand.items():
    d_fused = np.abs(mine - fused[name][0, 0].numpy()).max()
    d_explicit = np.abs(mine - explicit[name][0, 0].numpy()).max()
    print(f"{name:4} {d_fused:34.1e} {d_explicit:20.1e}")
    assert d_fused <= 1e-12 and d_explicit <= 1e-12

# %% [markdown]
# ## Step 11: a fully masked row, end to end
#
# Back to the row with nothing to attend to. Mask out all of query 1's keys and run the library's
# forward and backward: query 1's probabilities and output are zero, its gradient $dQ$ is zero, and
# it contributes nothing to $dK$ and $dV$ (which equal what query 0 alone would give). No NaN
# anywhere.
#
# PyTorch, for comparison: a hand-written softmax over a row of $-\infty$ gives NaN. What the fused
# `F.scaled_dot_product_attention` returns for such a row has varied between versions and kernels,
# which is why `torch_transformer` does not rely on it: it lets the kernel see every key of such a
# row and then sets the row's output to zero itself.

# %%
mask_empty = np.array([[True, True, False], [False, False, False]])  # query 1 may attend to nothing
out_e, cache_e = scaled_dot_product_attention_forward(q4, k4, v4, mask_empty[None, None])
dq_e, dk_e, dv_e, _ = scaled_dot_product_attention_backward(dO[None, None], cache_e)
print("P =\n", cache_e.probs[0, 0])
print("O =\n", out_e[0, 0])
print("dQ =\n", dq_e[0, 0])
assert np.isfinite(out_e).all() and np.isfinite(dq_e).all() and np.isfinite(dk_e).all() and np.isfinite(dv_e).all()
assert (out_e[0, 0, 1] == 0).all() and (dq_e[0, 0, 1] == 0).all()

# Query 0 alone: the same dK and dV.
_, cache_0 = scaled_dot_product_attention_forward(q4[:, :, :1], k4, v4, mask_empty[None, None, :1])
_, dk_0, dv_0, _ = scaled_dot_product_attention_backward(dO[None, None, :1], cache_0)
assert np.abs(dk_e - dk_0).max() <= 1e-15 and np.abs(dv_e - dv_0).max() <= 1e-15

scores_empty = torch.tensor(S).masked_fill(~torch.tensor(mask_empty), float("-inf"))
print("torch.softmax of the masked scores:\n", torch.softmax(scores_empty, dim=-1))
q_t, k_t, v_t = torch_inputs()
print(
    "F.scaled_dot_product_attention in this torch version:\n",
    F.scaled_dot_product_attention(q_t, k_t, v_t, attn_mask=torch.tensor(mask_empty))[0, 0].detach(),
)

# %% [markdown]
# ## Step 12: finite differences
#
# The last witness needs no calculus at all. For each coordinate $x$ of $Q$, $K$ and $V$,
#
# $$\frac{\partial \mathcal{L}}{\partial x} \approx \frac{\mathcal{L}(x + \tau) - \mathcal{L}(x - \tau)}{2\tau},
# \qquad \tau = 10^{-5},$$
#
# with $\mathcal{L} = \sum O \odot G$ for a random $G$. `check_pair` runs the forward function repeatedly on
# perturbed copies, compares with what the backward function returned, and reports the worst
# relative error $|fd - an| / \max(|fd|, |an|, 10^{-2})$ per input. Central differences are accurate
# to about $\tau^2 \approx 10^{-10}$ here, so agreement to about $10^{-8}$ or better is what a correct
# backward looks like; the project's bar is $10^{-6}$.

# %%
result = check_pair(
    scaled_dot_product_attention_forward,
    lambda dout, cache: scaled_dot_product_attention_backward(dout, cache)[:3],  # dQ, dK, dV (no T5 table here)
    dict(q=q4.copy(), k=k4.copy(), v=v4.copy(), mask=mask4),
    wrt=["q", "k", "v"],
    max_coords=None,  # all 16 coordinates
)
print(result)
assert result.worst <= 1e-6
assert all(g > 0 for g in result.max_abs_grad.values())  # nothing passed by being zero

# %% [markdown]
# ## Step 13: gradients add where paths fork
#
# One rule remains, and every model uses it. When one value feeds several computations, a change of
# that value moves every one of them, and the loss feels the sum of those moves. So:
#
# > **Gradients add where paths fork.** If $x$ is used by $f_1, \dots, f_n$, then
# > $dx = J_{f_1}^\top dy_1 + \dots + J_{f_n}^\top dy_n$.
#
# It is the multivariable chain rule, $\partial \mathcal{L} / \partial x = \sum_{j'}
# (\partial \mathcal{L} / \partial y_{j'})(\partial y_{j'} / \partial x)$, read as a recipe. In the
# Transformer it appears as a residual connection ($x + f(x)$: $dx = dy + J_f^\top dy$), as
# self-attention reading one array as query, key and value, as a tied embedding used at the input and
# at the output, and as one weight matrix shared by every position (which is why weight gradients are
# sums over positions). This is why backward code *accumulates* (`+=`) instead of assigning.
#
# Self-attention on one head: $O = \mathrm{Attention}(X, X, X)$. Its gradient is the sum of the three
# gradients the attention backward returns; any one of them alone fails the finite-difference check.

# %%
X3 = np.array([[0.5, -1.0], [1.0, 0.5], [-0.5, 2.0]])[None, None]  # (1, 1, T, Dh), T = 3
causal = np.tril(np.ones((3, 3), dtype=bool))[None, None]  # (1, 1, T, T), True = may attend


def self_attention_forward(x, mask):
    return scaled_dot_product_attention_forward(x, x, x, mask)  # one array, three roles


def self_attention_backward(dout, cache):
    dq, dk, dv, _ = scaled_dot_product_attention_backward(dout, cache)
    return dq + dk + dv  # the three paths that fork from x meet again: their gradients add


fork = check_pair(self_attention_forward, self_attention_backward, dict(x=X3.copy(), mask=causal), wrt=["x"])
only_q = check_pair(
    self_attention_forward, lambda d, c: scaled_dot_product_attention_backward(d, c)[0], dict(x=X3.copy(), mask=causal),
    wrt=["x"],
)  # fmt: skip
print(f"dq + dk + dv: worst error {fork.worst:.1e};   dq alone: worst error {only_q.worst:.1e}")
assert fork.worst <= 1e-6 and only_q.worst > 1e-2

# %% [markdown]
# ## Summary
#
# | forward | backward |
# |---|---|
# | $S = c\, Q K^\top$, $c = 1/\sqrt{d_h}$ | $dQ = c\, dS\, K$, $dK = c\, dS^\top Q$ |
# | $P = \mathrm{softmax}(S)$, masked entries $\to 0$ | $dS = P \odot (dP - \mathrm{rowsum}(dP \odot P))$ |
# | $O = P V$ | $dP = dO\, V^\top$, $dV = P^\top dO$ |
# | $x$ used by several paths (step 13) | $dx = \sum_{j'} J_{f_{j'}}^\top dy_{j'}$ |
#
# Multi-head attention (`multi_head_attention_forward`) wraps this in four linear layers and a
# reshape into heads. Next, walkthrough 01b (`examples/01b_multi_head_attention_by_hand.py`) follows the
# gradient through all of it by hand, on printable numbers; walkthrough 03 then runs it inside a whole
# model.
#
# ## Exercises
#
# Answers, worked and checked, are in `examples/answers/01_answers.py`. Check yours with
# `numpy_transformer.gradcheck.check_pair`, as step 12 does.
#
# 1. **Softmax on its own.** Write `softmax_forward(s)` (returning $P$ and a cache) and
#    `softmax_backward(dP, cache)` with the formula of step 6, for scores of shape $(T_q, T_k)$, and
#    check the pair with `check_pair`. Then check that each row of your $dS$ sums to zero.
# 2. **A learned bias on the scores.** ALiBi, T5 and relative-position models add a bias $b_{ij}$ to the
#    scores, $S = c\, Q K^\top + b$, with one $b$ shared by every batch element and head. Show that
#    $db = \sum_{\text{batch, heads}} dS$, where $dS$ is the gradient of the biased scores. Write the pair
#    (inputs $Q, K, V, b$) and check it.
# 3. **The temperature.** Replace $c = 1/\sqrt{d_h}$ by a learned scalar $c$. Derive
#    $dc = \sum_{ij} dS_{ij} (Q K^\top)_{ij}$ and check it with finite differences.
