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
# # 1b. Multi-head attention, forward and backward, by hand
#
# *Prerequisites:* walkthrough 01 (one head's forward and backward); matrix products and reshapes in
# NumPy. *Time:* 30 minutes. The symbols are those of [the notation table](../docs/notation.md); the
# mask convention and the error measure are in [the conventions](../docs/conventions.md).
#
# Section 3.2.2 of "Attention Is All You Need", in this project's layout (rows are positions,
# weights stored as `nn.Linear` stores them):
#
# $$\mathrm{MultiHead}(X_q, X_k, X_v) = \mathrm{Concat}(O_1, \dots, O_H)\, W_O^\top + b_O,$$
#
# $$O_h = \mathrm{Attention}(Q_h, K_h, V_h),$$
#
# where $Q = X_q W_Q^\top + b_Q$ and $Q_h$ is its $h$-th block of $d_h$ columns (likewise $K$, $V$).
# Walkthrough 01 did one head. Here is everything around it: the four projections, the **head split**
# (a reshape and a transpose), the **merge**, and the backward of each, on a model small enough to
# print: $D = 4$, $H = 2$ heads of width $d_h = 2$, two queries and three keys. Every number is then
# checked against the library pair `multi_head_attention_forward` / `multi_head_attention_backward`,
# against PyTorch's own `nn.MultiheadAttention` under autograd (float64), and against finite
# differences.

# %%
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch

# The checkout's root: the figures' code is in examples/plotting.py (and the packages, if not pip-installed).
sys.path.insert(0, str((Path(__file__).parent if "__file__" in globals() else Path.cwd()).resolve().parent))
OUT = Path(os.environ.get("WALKTHROUGH_OUT", "runs/walkthrough_01b"))  # where the figures go
OUT.mkdir(parents=True, exist_ok=True)

from examples import plotting  # noqa: E402
from numpy_transformer import multi_head_attention_backward, multi_head_attention_forward  # noqa: E402
from numpy_transformer.gradcheck import check_pair  # noqa: E402

np.set_printoptions(precision=4, suppress=True)

# %% [markdown]
# ## The inputs and the parameters
#
# Cross-attention, to keep the shapes apart: two query positions $X_q$ ($T_q = 2$) read three
# key/value positions $X_k = X_v$ ($T_k = 3$), as a decoder reads the encoder's output. Key 2 is
# padding, so the mask $M$ (True = may attend) is False in its column for every query and every head.
# The weights are small round numbers; the biases are not zero, so that none of their gradients is
# compared at a special point.

# %%
D, H = 4, 2
Dh = D // H  # head width d_h = 2
Xq = np.array([[1.0, 0.0, -1.0, 2.0], [0.5, 1.0, 0.0, -1.0]])  # (T_q, D) = (2, 4)
Xkv = np.array([[0.0, 1.0, 1.0, 0.0], [2.0, -1.0, 0.5, 1.0], [1.0, 1.0, -1.0, 0.0]])  # (T_k, D) = (3, 4)
keep = np.array([True, True, False])  # (T_k,): key 2 is padding
T_q, T_k = len(Xq), len(Xkv)

rng = np.random.default_rng(1)
params = {}
for name in ("q", "k", "v", "out"):
    params[f"{name}_proj.weight"] = np.round(rng.standard_normal((D, D)) * 0.6, 1)  # (out, in) = (D, D)
    params[f"{name}_proj.bias"] = np.round(rng.standard_normal(D) * 0.3, 1)  # (D,)
W_Q, W_K, W_V, W_O = (params[f"{n}_proj.weight"] for n in ("q", "k", "v", "out"))
b_Q, b_K, b_V, b_O = (params[f"{n}_proj.bias"] for n in ("q", "k", "v", "out"))
print("W_Q =\n", W_Q, "\nb_Q =", b_Q)

# %% [markdown]
# ## Step 1: the projections
#
# $$Q = X_q W_Q^\top + b_Q, \qquad K = X_k W_K^\top + b_K, \qquad V = X_v W_V^\top + b_V.$$
#
# Each is an ordinary linear layer applied to every row. All heads are computed at once: head $h$
# will own columns $h d_h, \dots, (h + 1) d_h - 1$ of $Q$, $K$ and $V$, which is the same as giving
# each head its own $d_h \times D$ block of rows of $W_Q$.

# %%
Q = Xq @ W_Q.T + b_Q  # (T_q, D)
K = Xkv @ W_K.T + b_K  # (T_k, D)
V = Xkv @ W_V.T + b_V  # (T_k, D)
print("Q =\n", Q)

# %% [markdown]
# ## Step 2: the head split, a reshape and a transpose
#
# $(T, D) \to (T, H, d_h)$ is a `reshape`: it only re-reads the same numbers, row by row, as
# $H$ groups of $d_h$. Then a `transpose` brings the head axis first, $(H, T, d_h)$, so that each head
# is a $(T, d_h)$ matrix and one batched product serves all heads. Neither step computes anything: the
# split is a **permutation** of the entries of $Q$. Watch where each entry of a labelled array goes:


# %%
def split_heads(x):
    """(T, D) -> (H, T, Dh): column block h of x becomes head h."""
    T = x.shape[0]
    return x.reshape(T, H, Dh).transpose(1, 0, 2)  # (T, H, Dh) -> (H, T, Dh)


def merge_heads(x):
    """(H, T, Dh) -> (T, D): the inverse permutation, head h back into column block h."""
    T = x.shape[1]
    return x.transpose(1, 0, 2).reshape(T, H * Dh)  # (H, T, Dh) -> (T, H, Dh) -> (T, D)


labels = np.arange(T_q * D).reshape(T_q, D)  # entry (t, d) holds its own flat index
print("labels (T_q, D) =\n", labels)
print("split_heads(labels) (H, T_q, Dh) =\n", split_heads(labels))
assert np.array_equal(merge_heads(split_heads(labels)), labels)  # merge undoes split
Qh, Kh, Vh = split_heads(Q), split_heads(K), split_heads(V)  # (H, T, Dh) each
assert np.array_equal(Qh[1], Q[:, Dh:])  # head 1 is the second block of columns

# %% [markdown]
# The mistake this guards against (the checker's `attention.heads_without_transpose`): reshaping
# $(T, D)$ straight to $(H, T, d_h)$, without going through $(T, H, d_h)$. The shapes fit, the code
# runs, but a "head" then holds the wrong numbers: here head 0 gets all four features of position 0,
# read as if they were two positions, and no head sees both positions at all.

# %%
wrong = labels.reshape(H, T_q, Dh)
print("reshape without transpose, head 0 =\n", wrong[0], "\n(the correct head 0 =\n", split_heads(labels)[0], ")")
assert not np.array_equal(wrong, split_heads(labels))

# %% [markdown]
# ## Step 3: each head is walkthrough 01's attention
#
# For every head $h$, with $c = 1/\sqrt{d_h}$ and the mask applied as $-\infty$:
#
# $$S_h = c\, Q_h K_h^\top, \qquad P_h = \mathrm{softmax}(S_h), \qquad O_h = P_h V_h.$$
#
# The mask has shape $(T_k,)$ here and broadcasts over heads and queries: in the library, a padding
# mask is $(B, 1, 1, T_k)$ and broadcasts to $(B, H, T_q, T_k)$.

# %%
c = 1.0 / math.sqrt(Dh)
S = c * Qh @ Kh.transpose(0, 2, 1)  # (H, T_q, T_k)
S_masked = np.where(keep, S, -np.inf)
E = np.exp(S_masked - S_masked.max(axis=-1, keepdims=True))
P = E / E.sum(axis=-1, keepdims=True)  # (H, T_q, T_k)
Oh = P @ Vh  # (H, T_q, Dh)
print("P (head 0, head 1) =\n", P)

# %% [markdown]
# ## Step 4: the merge and the output projection
#
# $$C = \mathrm{merge}(O_1, \dots, O_H) = \mathrm{Concat}(O_1, \dots, O_H), \qquad Y = C W_O^\top + b_O.$$
#
# The merge is the inverse permutation of the split: transpose back to $(T_q, H, d_h)$, then read
# each row's $H$ groups as one row of width $D$. The output projection is where the heads mix: each
# output feature is a weighted sum over all heads' features.

# %%
C = merge_heads(Oh)  # (T_q, D)
Y = C @ W_O.T + b_O  # (T_q, D)
print("C =\n", C, "\nY =\n", Y)

# %% [markdown]
# The library takes a batch axis in front, $(B, T, D)$, and a mask broadcastable to
# $(B, H, T_q, T_k)$:

# %%
mask4 = keep[None, None, None, :]  # (1, 1, 1, T_k)
Y_lib, cache = multi_head_attention_forward(params, Xq[None], Xkv[None], Xkv[None], H, attn_mask=mask4)
print("max |by hand - library| =", np.abs(Y_lib[0] - Y).max())
assert np.abs(Y_lib[0] - Y).max() <= 1e-12

# %% [markdown]
# ## The backward pass
#
# The upstream gradient $dY = \partial \mathcal{L} / \partial Y$ is random (walkthrough 01, step 8 says
# why never all ones). We undo the forward from its last line to its first. Notation: for a step
# $y = f(x)$ with Jacobian $J_f$, the backward computes $dx = J_f^\top dy$, without ever building
# $J_f$ (see [the notation table](../docs/notation.md)).

# %%
dY = np.round(rng.standard_normal((T_q, D)), 1)  # (T_q, D)
print("dY =\n", dY)

# %% [markdown]
# The graph of the whole layer: forward left to right (black, each arrow with its value's shape),
# backward right to left (red, dashed). Two arrows leave $X_{kv}$, so two gradients arrive there and
# add (step 9); the split's backward is the merge and the merge's backward is the split (steps 6 and 8).

# %%
nodes = {
    "Xq": (0.0, 2.4, "$X_q$"),
    "Xkv": (0.0, 0.6, "$X_{kv}$"),
    "pq": (1.9, 2.4, "$\\cdot W_Q^\\top + b_Q$"),
    "pk": (1.9, 1.2, "$\\cdot W_K^\\top + b_K$"),
    "pv": (1.9, 0.0, "$\\cdot W_V^\\top + b_V$"),
    "sq": (3.5, 2.4, "split"),
    "sk": (3.5, 1.2, "split"),
    "sv": (3.5, 0.0, "split"),
    "att": (5.7, 1.2, "attention\nper head"),
    "merge": (7.5, 1.2, "merge"),
    "out": (9.0, 1.2, "$\\cdot W_O^\\top + b_O$"),
    "L": (10.3, 1.2, "$\\mathcal{L}$"),
}
edges = [
    ("Xq", "pq", "X_q", f"({T_q}, {D})"),
    ("Xkv", "pk", "X_{kv}", f"({T_k}, {D})", 0.6),  # the labels of the two arrows leaving X_kv: apart
    ("Xkv", "pv", "X_{kv}", f"({T_k}, {D})", 0.6),
    ("pq", "sq", "Q", f"({T_q}, {D})"),
    ("pk", "sk", "K", f"({T_k}, {D})"),
    ("pv", "sv", "V", f"({T_k}, {D})"),
    ("sq", "att", "Q_h", f"({H}, {T_q}, {Dh})", 0.3),  # clear of K_h's labels, which meet attention head-on
    ("sk", "att", "K_h", f"({H}, {T_k}, {Dh})", 0.4),
    ("sv", "att", "V_h", f"({H}, {T_k}, {Dh})", 0.3),
    ("att", "merge", "O_h", f"({H}, {T_q}, {Dh})"),
    ("merge", "out", "C", f"({T_q}, {D})"),
    ("out", "L", "Y", f"({T_q}, {D})"),
]
plotting.plot_computation_graph(nodes, edges, OUT / "graph.png", "multi-head attention", size=(7.3, 4.0))

# %% [markdown]
# ## Your turn: the output projection's backward
#
# Before reading step 5: $Y = C W_O^\top + b_O$ is a linear layer. Write its three gradients, $dC$, $dW_O$
# (the $(\text{out}, \text{in})$ layout of $W_O$) and $db_O$, from $dY$, $C$ and $W_O$ in
# `your_output_projection_backward`, in place of `return None`. The cell after step 5 checks each of the
# three. The workbook's `linear` exercise goes further (any number of leading axes, float32), and its
# `multi_head_attention` exercise is this whole walkthrough: `transformer-parity exercises DIR --only linear`.


# %%
def your_output_projection_backward(dY, C, W_O):
    """dY, C (T_q, D), W_O (D, D) -> (dC, dW_O, db_O): your turn."""
    return None


# %% [markdown]
# ## Step 5: through the output projection
#
# $Y = C W_O^\top + b_O$, a linear layer, so (the shapes decide the order of each product):
#
# $$dC = dY\, W_O, \qquad dW_O = dY^\top C, \qquad db_O = \sum_{\text{rows}} dY.$$
#
# $dW_O$ and $db_O$ are sums over the rows because the same weights serve every position.

# %%
dC = dY @ W_O  # (T_q, D)
dW_O = dY.T @ C  # (D, D), the (out, in) layout of W_O
db_O = dY.sum(axis=0)  # (D,)

# %% [markdown]
# **Your turn, checked**, tensor by tensor; then a classic mistake, the weight gradient transposed.

# %%
from parity_tests.check.your_turn import checker  # noqa: E402

check = checker(
    {"dC": dC, "dW_O": dW_O, "db_O": db_O},
    reference="linear",
    args={"x": C, "weight": W_O, "bias": b_O},
    dout=dY,
    wrt={"dC": "x", "dW_O": "weight", "db_O": "bias"},
    exercise="linear",
)
check("dC, dW_O, db_O", your_output_projection_backward(dY, C, W_O))
print("\nC.T @ dY for dW_O:")
assert not check("dC, dW_O, db_O", (dY @ W_O, C.T @ dY, dY.sum(axis=0)))

# %% [markdown]
# ## Step 6: through the merge, whose backward is the split
#
# A permutation moves each entry somewhere else without changing it, so its Jacobian $J$ is a
# permutation matrix, and the transpose of a permutation matrix is its inverse: $J^\top = J^{-1}$.
# So the backward of the merge is the split, and the backward of the split is the merge. Each
# entry's gradient just travels back to where the entry came from:
#
# $$dO_h = \mathrm{split}(dC)_h.$$
#
# A numerical check of "the backward of a permutation is its inverse": for any $x$ and $g$,
# $\langle \mathrm{merge}(x), g \rangle = \langle x, \mathrm{split}(g) \rangle$ (the definition of the
# transpose).

# %%
dOh = split_heads(dC)  # (H, T_q, Dh)
x_test, g_test = rng.standard_normal((H, T_q, Dh)), rng.standard_normal((T_q, D))
assert abs(np.sum(merge_heads(x_test) * g_test) - np.sum(x_test * split_heads(g_test))) <= 1e-12

# %% [markdown]
# ## Step 7: through each head (walkthrough 01, steps 5 to 7)
#
# $$dV_h = P_h^\top dO_h, \qquad dP_h = dO_h V_h^\top,$$
#
# $$dS_h = P_h \odot \big(dP_h - \mathrm{rowsum}(dP_h \odot P_h)\big),$$
#
# $$dQ_h = c\, dS_h K_h, \qquad dK_h = c\, dS_h^\top Q_h.$$
#
# The masked key gets $P = 0$, hence $dS = 0$ in its column, hence nothing in $dK_h$ from the scores:
# its row of $dK$ is zero, and so is its row of $dV$.

# %%
dVh = P.transpose(0, 2, 1) @ dOh  # (H, T_k, Dh)
dP = dOh @ Vh.transpose(0, 2, 1)  # (H, T_q, T_k)
dS = P * (dP - (dP * P).sum(axis=-1, keepdims=True))  # (H, T_q, T_k)
dQh = c * dS @ Kh  # (H, T_q, Dh)
dKh = c * dS.transpose(0, 2, 1) @ Qh  # (H, T_k, Dh)
print("dS (head 0, head 1) =\n", dS)

# %% [markdown]
# $P_h$, $dP_h$ and $dS_h$ of both heads, one row of panels per head. Key 2 is padding: its column is
# zero in $P_h$ and therefore in $dS_h$, in every head. The two heads look at the same keys with
# different weights, and receive different gradients.

# %%
plotting.plot_matrices({"P": P, "dP": dP, "dS": dS}, OUT / "P_dP_dS.png", "the softmax backward, per head")

# %% [markdown]
# ## Step 8: through the split, whose backward is the merge
#
# $$dQ = \mathrm{merge}(dQ_1, \dots, dQ_H), \quad dK = \mathrm{merge}(dK_1, \dots), \quad
# dV = \mathrm{merge}(dV_1, \dots).$$

# %%
dQ, dK, dV = merge_heads(dQh), merge_heads(dKh), merge_heads(dVh)  # (T, D) each
assert (dK[2] == 0).all() and (dV[2] == 0).all()  # the padded key receives nothing

# %% [markdown]
# ## Step 9: through the three projections
#
# Three linear layers, the same rule as step 5:
#
# $$dX_q = dQ\, W_Q, \quad dW_Q = dQ^\top X_q, \quad db_Q = \sum_{\text{rows}} dQ,$$
#
# and likewise for $K$ and $V$. In this cross-attention the keys and the values are read from the
# same array $X_{kv}$: two paths fork from it, so its gradient is the **sum** of the two,
# $dX_{kv} = dX_k + dX_v$ (the fork-sum rule of walkthrough 01). In self-attention, one array is
# query, key and value, and its gradient is the sum of all three.

# %%
dXq, dW_Q, db_Q = dQ @ W_Q, dQ.T @ Xq, dQ.sum(axis=0)
dXk, dW_K, db_K = dK @ W_K, dK.T @ Xkv, dK.sum(axis=0)
dXv, dW_V, db_V = dV @ W_V, dV.T @ Xkv, dV.sum(axis=0)
dXkv = dXk + dXv  # the keys' path + the values' path
by_hand = {
    "dquery": dXq,
    "dkey": dXk,
    "dvalue": dXv,
    "q_proj.weight": dW_Q,
    "q_proj.bias": db_Q,
    "k_proj.weight": dW_K,
    "k_proj.bias": db_K,
    "v_proj.weight": dW_V,
    "v_proj.bias": db_V,
    "out_proj.weight": dW_O,
    "out_proj.bias": db_O,
}
print("dX_q =\n", dXq, "\ndX_kv = dX_k + dX_v =\n", dXkv)

# %% [markdown]
# One gradient is zero: $db_K$. Walkthrough 03 explains why (a bias shared by every key shifts each
# row of scores by the same amount, which the softmax ignores); here it is, as rounding noise:

# %%
print("db_K =", db_K, "  (db_Q =", db_Q, ")")
assert np.abs(db_K).max() <= 1e-15

# %% [markdown]
# ## Check 1: the library's backward
#
# `multi_head_attention_backward(dout, cache)` returns the three inputs' gradients and a dict of
# the parameters' gradients under their state-dict names.

# %%
dquery, dkey, dvalue, grads = multi_head_attention_backward(dY[None], cache)
library = {"dquery": dquery[0], "dkey": dkey[0], "dvalue": dvalue[0]} | grads
for name, mine in by_hand.items():
    diff = np.abs(mine - library[name]).max()
    print(f"{name:16} max |by hand - library| = {diff:.1e}")
    assert diff <= 1e-12

# %% [markdown]
# ## Check 2: PyTorch's `nn.MultiheadAttention`, under autograd
#
# An implementation we did not write, with its own layout: its three input projections are stacked
# in one `in_proj_weight` of shape $(3D, D)$, in the order $Q, K, V$. And its mask points the other
# way: `key_padding_mask` is **True where a key is padding** (may *not* attend), the opposite of this
# project's True = may attend. So we pass `~keep`. Everything in float64; the upstream gradient is
# the same $dY$.

# %%
mha = torch.nn.MultiheadAttention(D, H, batch_first=True, dtype=torch.float64)
with torch.no_grad():
    mha.in_proj_weight.copy_(torch.from_numpy(np.concatenate([W_Q, W_K, W_V])))  # (3D, D)
    mha.in_proj_bias.copy_(torch.from_numpy(np.concatenate([b_Q, b_K, b_V])))  # (3D,)
    mha.out_proj.weight.copy_(torch.from_numpy(W_O))
    mha.out_proj.bias.copy_(torch.from_numpy(b_O))
xq_t = torch.tensor(Xq[None], requires_grad=True)
xk_t = torch.tensor(Xkv[None], requires_grad=True)
xv_t = torch.tensor(Xkv[None], requires_grad=True)  # a separate leaf, so that dX_k and dX_v stay apart
Y_t, _ = mha(xq_t, xk_t, xv_t, key_padding_mask=torch.tensor(~keep)[None], need_weights=False)
Y_t.backward(torch.from_numpy(dY[None]))
in_grad, in_bias_grad = mha.in_proj_weight.grad.numpy(), mha.in_proj_bias.grad.numpy()
autograd = {"Y": Y_t.detach().numpy()[0], "dquery": xq_t.grad[0].numpy(), "dkey": xk_t.grad[0].numpy()}
autograd |= {"dvalue": xv_t.grad[0].numpy(), "out_proj.weight": mha.out_proj.weight.grad.numpy()}
autograd["out_proj.bias"] = mha.out_proj.bias.grad.numpy()
for i, name in enumerate("qkv"):
    autograd[f"{name}_proj.weight"] = in_grad[i * D : (i + 1) * D]
    autograd[f"{name}_proj.bias"] = in_bias_grad[i * D : (i + 1) * D]
for name, mine in ({"Y": Y} | by_hand).items():
    diff = np.abs(mine - autograd[name]).max()
    print(f"{name:16} max |by hand - torch autograd| = {diff:.1e}")
    assert diff <= 1e-12

# %% [markdown]
# ## Check 3: finite differences
#
# No second implementation at all: `check_pair` perturbs every coordinate of the inputs and of the
# parameters, reruns the library's forward, and compares the central differences with what the
# backward returned ($\tau = 10^{-5}$; the bar is $10^{-6}$, as in [the conventions](../docs/conventions.md)).

# %%
result = check_pair(
    multi_head_attention_forward,
    multi_head_attention_backward,
    dict(
        params={k: v.copy() for k, v in params.items()},
        query=Xq[None].copy(),
        key=Xkv[None].copy(),
        value=Xkv[None].copy(),
        n_heads=H,
        attn_mask=mask4,
    ),
    wrt=["query", "key", "value", "params"],
    max_coords=None,  # every coordinate: 8 + 12 + 12 + 80
)
print(result)
assert result.worst <= 1e-6
assert all(g > 0 for name, g in result.max_abs_grad.items() if name != "params.k_proj.bias")

# %% [markdown]
# ## Summary
#
# | forward | backward |
# |---|---|
# | $Q = X_q W_Q^\top + b_Q$ (and $K$, $V$) | $dX_q = dQ\, W_Q$, $dW_Q = dQ^\top X_q$, $db_Q = \sum dQ$ |
# | $Q_h = \mathrm{split}(Q)$: reshape, transpose to $(H, T, d_h)$ | $dQ = \mathrm{merge}(dQ_h)$, the inverse |
# | $O_h = \mathrm{Attention}(Q_h, K_h, V_h)$ | walkthrough 01: $dQ_h, dK_h, dV_h$ from $dO_h$ |
# | $C = \mathrm{merge}(O_h)$ | $dO_h = \mathrm{split}(dC)$ |
# | $Y = C W_O^\top + b_O$ | $dC = dY\, W_O$, $dW_O = dY^\top C$, $db_O = \sum dY$ |
# | one array read twice (keys and values; $q = k = v$) | the gradients of its uses add |
#
# Next: walkthrough 02 (layer norm), then 03, where this whole block runs inside an encoder-decoder.
#
# ## Exercises
#
# Answers, worked and checked, are in `examples/answers/01b_answers.py`.
#
# 1. **Self-attention.** Call the library with one array as query, key and value (the same $X$, $T = 3$)
#    and a causal mask. Show that the gradient of $X$ is `dquery + dkey + dvalue`, by checking
#    `check_pair` on a function `self_attention(params, x)` built from the pair.
# 2. **The wrong split.** Replace `split_heads` by the reshape without transpose (and `merge_heads` by
#    its inverse, `x.reshape(T, D)`). Does the by-hand backward still agree with finite differences of
#    the *wrong* forward? Does the forward still agree with the library? What does this tell you about
#    what a gradient check can and cannot catch?
# 3. **Grouped-query attention by hand.** With $H = 2$ query heads sharing $H_{kv} = 1$ key/value head
#    ($W_K$, $W_V$ of shape $(d_h, D)$), the K/V head is repeated for both query heads. Show that its
#    gradient is the sum over the query heads it serves, and check against the library with
#    `n_kv_heads=1`.
