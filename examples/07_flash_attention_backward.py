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
# # 7. FlashAttention's backward by hand
#
# *Prerequisites:* walkthrough 01 (the softmax backward and its row term). *Time:* 40 minutes. The
# symbols are those of [the notation table](../docs/notation.md): $c$ is the scale of the scores,
# $\mathrm{lse}$ a row's log-sum-exp, $\Delta$ the row term; $\mathcal{L}$, never $L$, is a loss.
#
# Walkthrough 01 computed attention the plain way: the scores $S = Q K^\top / \sqrt{d_h}$, the
# probabilities $P = \mathrm{softmax}(S)$ and the output $O = P V$, keeping $P$ for the backward pass.
# $P$ has one entry per (query, key) pair. For one head at $T = 8192$ that is 67 million numbers,
# 256 MiB in float32; a model has many heads and several layers, and the backward needs about three
# such arrays at once.
#
# FlashAttention (Dao et al., 2022; FlashAttention-2, Dao 2023) computes exactly the same $O$ and the
# same gradients without ever holding a $T_q \times T_k$ array. Two ideas make it work:
#
# 1. **Online softmax** (forward): a softmax row can be computed one block of keys at a time, keeping
#    only a running maximum $m$ and a running sum $\ell$ per query. What is kept for the backward is
#    one number per query, the row's log-sum-exp $\mathrm{lse} = m + \log \ell$.
# 2. **Recomputation** (backward): each block of $P$ is rebuilt from $S$ and $\mathrm{lse}$ when it is needed, and
#    the one quantity that seems to need a whole row of $P$, $\mathrm{rowsum}(dP \odot P)$, turns out
#    to equal $\mathrm{rowsum}(dO \odot O)$.
#
# This walkthrough does the first on a single row small enough to print, then one block of the backward
# step by step, then all the blocks, and checks every number against the plain pair
# (`scaled_dot_product_attention_*`) and the library's tiled pair (`flash_attention_*`). It runs in a
# second or two, as a script (`python examples/07_flash_attention_backward.py`) or as a notebook.

# %%
import dataclasses
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np

if importlib.util.find_spec("numpy_transformer") is None:  # not pip-installed: import from the checkout
    sys.path.insert(0, str((Path(__file__).parent if "__file__" in globals() else Path.cwd()).resolve().parent))

from numpy_transformer import (  # noqa: E402
    flash_attention_backward,
    flash_attention_forward,
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)

np.set_printoptions(precision=4, suppress=True, linewidth=110)

# %% [markdown]
# ## Part 1: online softmax on one row
#
# One query's scores against eight keys, and the eight value rows (width 2). The plain way first:
#
# $$m = \max_j s_j, \qquad \ell = \sum_j e^{s_j - m}, \qquad p_j = e^{s_j - m} / \ell, \qquad
# o = \sum_j p_j v_j.$$

# %%
s = np.array([0.5, 2.0, -1.0, 1.5, 3.0, 0.0, -0.5, 2.5])  # one row of scores, T_k = 8
V1 = np.array([[1, 0], [0, 1], [1, 1], [2, 0], [0, 2], [1, -1], [-1, 1], [3, 1]], dtype=float)  # (T_k, 2)
p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
o_plain = p @ V1
print("p =", p)
print("o =", o_plain)

# %% [markdown]
# Now the keys arrive in blocks of three (3, 3 and 2 keys). After each block we hold only three things:
# the largest score seen so far $m$, the sum $\ell$ of $e^{s - m}$ over the keys seen so far, and the
# unnormalised output $o = \sum e^{s - m} v$ over them. A new block $j$ with scores $s^{(j)}$ updates them:
#
# $$\begin{gathered}
# m^{(j)} = \max\big(m^{(j-1)}, \max s^{(j)}\big), \qquad
# \ell^{(j)} = e^{m^{(j-1)} - m^{(j)}}\, \ell^{(j-1)} + \sum e^{s^{(j)} - m^{(j)}}, \\
# o^{(j)} = e^{m^{(j-1)} - m^{(j)}}\, o^{(j-1)} + \sum e^{s^{(j)} - m^{(j)}} v.\end{gathered}$$
#
# The factor $\alpha = e^{m^{(j-1)} - m^{(j)}} \le 1$ is the whole trick. Everything summed so far was
# measured against the old maximum; when the maximum grows, multiplying by $\alpha$ re-measures it
# against the new one ($e^{s - m_\text{old}} \cdot e^{m_\text{old} - m_\text{new}} = e^{s - m_\text{new}}$).
# When the maximum does not change, $\alpha = 1$. Start from $m = -\infty$, $\ell = 0$, $o = 0$.

# %%
m, l, o = -np.inf, 0.0, np.zeros(2)
for start in range(0, 8, 3):
    s_j, v_j = s[start : start + 3], V1[start : start + 3]
    m_new = max(m, s_j.max())
    alpha = math.exp(m - m_new)  # exp(-inf) = 0 at the first block: nothing summed yet
    p_tilde = np.exp(s_j - m_new)  # P~: unnormalised, against the running max
    l = alpha * l + p_tilde.sum()
    o = alpha * o + p_tilde @ v_j
    m = m_new
    print(f"keys {start}..{start + len(s_j) - 1}: m = {m:.2f}, alpha = {alpha:.4f}, l = {l:.4f}, o = {o}")

print("o / l   =", o / l)
print("plain o =", o_plain)
assert np.abs(o / l - o_plain).max() <= 1e-15

# %% [markdown]
# After the last block, $\ell$ is the full row's sum and $o$ its full unnormalised output, so
# $o / \ell$ is the attention output. The probabilities themselves were never stored. What the forward
# keeps for the backward is $\mathrm{lse} = m + \log \ell$, the log-sum-exp of the row, because every
# probability can be rebuilt from its score and $\mathrm{lse}$ alone:
#
# $$p_j = \frac{e^{s_j - m}}{\ell} = e^{s_j - m - \log \ell} = e^{s_j - \mathrm{lse}}.$$

# %%
lse_row = m + math.log(l)
print("lse =", lse_row, "  log(sum(exp(s))) =", np.log(np.exp(s).sum()))
print("exp(s - lse) =", np.exp(s - lse_row))
assert abs(lse_row - np.log(np.exp(s).sum())) <= 1e-14
assert np.abs(np.exp(s - lse_row) - p).max() <= 1e-15

# %% [markdown]
# ### Masked keys, and a row with nothing to attend to
#
# A masked key has score $-\infty$ and contributes $e^{-\infty} = 0$. One case needs care: while every
# key seen so far is masked, $m = -\infty$, and $s - m = -\infty - (-\infty)$ is NaN. The library
# subtracts 0 instead of $m$ while $m = -\infty$ (every term is $e^{-\infty} = 0$ either way). If the
# row ends that way, $\ell = 0$: its output is set to 0 and its $\mathrm{lse}$ to $+\infty$, so that
# the backward's $e^{s - \mathrm{lse}}$ is 0 for every key. Here the first block is masked, then the whole row.

# %%
for name, s_masked in (
    ("first block masked", np.where(np.arange(8) < 3, -np.inf, s)),
    ("all masked", np.full(8, -np.inf)),
):
    m, l, o = -np.inf, 0.0, np.zeros(2)
    for start in range(0, 8, 3):
        s_j, v_j = s_masked[start : start + 3], V1[start : start + 3]
        m_new = max(m, s_j.max())
        shift = 0.0 if m_new == -np.inf else m_new  # never -inf - (-inf)
        alpha = math.exp(m - shift)
        p_tilde = np.exp(s_j - shift)
        l, o, m = alpha * l + p_tilde.sum(), alpha * o + p_tilde @ v_j, m_new
    out = o / l if l > 0 else np.zeros(2)
    print(f"{name:18}: m = {m}, l = {l:.4f}, o = {out}")
    assert np.isfinite(out).all()
    if l > 0:
        keep = s_masked > -np.inf
        p_ref = np.exp(s[keep] - s[keep].max()) / np.exp(s[keep] - s[keep].max()).sum()
        assert np.abs(out - p_ref @ V1[keep]).max() <= 1e-15

# %% [markdown]
# ## Part 2: the whole forward, in blocks
#
# The library's `flash_attention_forward` does the same for every query row at once: the queries are
# cut into blocks of $B_r$ rows ($Q_i$), the keys and values into blocks of $B_c$ rows ($K_j$, $V_j$),
# and the update above becomes matrix products on the block $S_{ij} = c\, Q_i K_j^\top$, $c = 1/\sqrt{d_h}$
# ($B_r \times B_c$). Here $T_q = 6$ queries, $T_k = 8$ keys, $d_h = 2$, blocks of $B_r = 3$ and
# $B_c = 4$: a $2 \times 2$ grid of blocks. Arrays carry the batch and head axes in front, (1, 1, T, Dh).
# The cache keeps q, k, v, out and $\mathrm{lse}$, one number per query; the plain pair's cache keeps $P$.

# %%
rng = np.random.default_rng(0)
T_q, T_k, Dh, B_r, B_c = 6, 8, 2, 3, 4
Q, K, V = (np.round(rng.standard_normal((1, 1, T, Dh)), 1) for T in (T_q, T_k, T_k))  # (1, 1, T, Dh)
scale = 1.0 / math.sqrt(Dh)

O, cache = flash_attention_forward(Q, K, V, block_q=B_r, block_k=B_c)
O_plain, plain_cache = scaled_dot_product_attention_forward(Q, K, V)
P_plain = plain_cache.probs  # (1, 1, T_q, T_k): what the tiled pair never builds
lse = cache.lse  # (1, 1, T_q)
print("O (tiled) =\n", O[0, 0])
print("lse =", lse[0, 0])
fields = {f.name: getattr(cache, f.name) for f in dataclasses.fields(cache)}  # a FlashAttentionCache
print("arrays in the tiled cache:", {k: np.shape(x) for k, x in fields.items() if isinstance(x, np.ndarray)})
assert np.abs(O - O_plain).max() <= 1e-15
assert np.abs(np.exp((Q @ K.swapaxes(-1, -2)) * scale - lse[..., None]) - P_plain).max() <= 1e-15

# %% [markdown]
# ## Part 3: what the backward needs
#
# From walkthrough 01, with $c = 1/\sqrt{d_h}$:
#
# $$\begin{gathered}
# dV = P^\top dO, \qquad dP = dO\, V^\top, \qquad dS = P \odot \big(dP - \mathrm{rowsum}(dP \odot P)\big),
# \\ dQ = c\, dS\, K, \qquad dK = c\, dS^\top Q.\end{gathered}$$
#
# Every entry of $dS$ is local to its block except one: the row term $\mathrm{rowsum}(dP \odot P)$ sums
# over all keys of a row. But
#
# $$\sum_c dP_{rc} P_{rc} = \sum_c (dO_r \cdot v_c)\, P_{rc}
#   = dO_r \cdot \Big(\sum_c P_{rc} v_c\Big) = dO_r \cdot O_r,$$
#
# so $\Delta = \mathrm{rowsum}(dO \odot O)$, one number per query, computed from two arrays we already have,
# stands in for it. We check it on the plain pair's $P$.

# %%
dO = np.round(rng.standard_normal((1, 1, T_q, Dh)), 1)  # a random upstream gradient, never all ones
dP_plain = dO @ V.swapaxes(-1, -2)  # (1, 1, T_q, T_k)
Delta = (dO * O).sum(axis=-1, keepdims=True)  # (1, 1, T_q, 1)
print("rowsum(dP * P) =", (dP_plain * P_plain).sum(axis=-1)[0, 0])
print("rowsum(dO * O) =", Delta[0, 0, :, 0])
assert np.abs((dP_plain * P_plain).sum(axis=-1, keepdims=True) - Delta).max() <= 1e-15
dS_plain = P_plain * (dP_plain - Delta)  # the plain pair's dS (before the scale c), for the checks below

# %% [markdown]
# ## Part 4: one block of the backward, step by step
#
# Take query block $i = 1$ (queries 3 to 5) and key block $j = 0$ (keys 0 to 3). Everything below is a
# $3 \times 4$ block or a few rows: nothing of size $T_q \times T_k$.
#
# **Step 1.** Recompute the scores, exactly as the forward did: $S_{ij} = c\, Q_i K_j^\top$.

# %%
rows, cols = slice(3, 6), slice(0, 4)
Q_i, dO_i, lse_i, Delta_i = Q[..., rows, :], dO[..., rows, :], lse[..., rows, None], Delta[..., rows, :]
K_j, V_j = K[..., cols, :], V[..., cols, :]
S_ij = (Q_i @ K_j.swapaxes(-1, -2)) * scale  # (1, 1, B_r, B_c)
print("S_ij =\n", S_ij[0, 0])

# %% [markdown]
# **Step 2.** The block's probabilities from $\mathrm{lse}$: $P_{ij} = e^{S_{ij} - \mathrm{lse}_i}$. No row sum
# is needed, and the result is exactly the plain pair's $P$ in these rows and columns.

# %%
P_ij = np.exp(S_ij - lse_i)  # (1, 1, B_r, B_c)
print("P_ij =\n", P_ij[0, 0])
print("plain P[3:6, 0:4] =\n", P_plain[0, 0, rows, cols])
assert np.abs(P_ij - P_plain[..., rows, cols]).max() <= 1e-15

# %% [markdown]
# **Step 3.** This block's share of $dV_j$: the keys of block $j$ collect from the queries of block $i$,
# $dV_j \mathrel{+}= P_{ij}^\top dO_i$. (The rest of $dV_j$ comes from the other query blocks.)

# %%
dV_j_share = P_ij.swapaxes(-1, -2) @ dO_i  # (1, 1, B_c, Dh)
print("P_ij^T dO_i =\n", dV_j_share[0, 0])
assert np.abs(dV_j_share - P_plain[..., rows, cols].swapaxes(-1, -2) @ dO_i).max() <= 1e-15

# %% [markdown]
# **Step 4.** $dP_{ij} = dO_i V_j^\top$, then the softmax backward with $\Delta_i$ in place of the row sum:
# $dS_{ij} = P_{ij} \odot (dP_{ij} - \Delta_i)$. It equals the plain pair's $dS$ in this block.

# %%
dP_ij = dO_i @ V_j.swapaxes(-1, -2)  # (1, 1, B_r, B_c)
dS_ij = P_ij * (dP_ij - Delta_i)
print("dS_ij =\n", dS_ij[0, 0])
assert np.abs(dS_ij - dS_plain[..., rows, cols]).max() <= 1e-15

# %% [markdown]
# **Step 5.** The block's shares of $dQ_i$ and $dK_j$, with the scale $c$ of the scores:
# $dQ_i \mathrel{+}= c\, dS_{ij} K_j$ and $dK_j \mathrel{+}= c\, dS_{ij}^\top Q_i$.

# %%
dQ_i_share = scale * dS_ij @ K_j  # (1, 1, B_r, Dh)
dK_j_share = scale * dS_ij.swapaxes(-1, -2) @ Q_i  # (1, 1, B_c, Dh)
print("c dS_ij K_j =\n", dQ_i_share[0, 0])
print("c dS_ij^T Q_i =\n", dK_j_share[0, 0])

# %% [markdown]
# ## Part 5: all the blocks
#
# FlashAttention-2's backward (its Algorithm 2) is these five steps inside two loops: the outer loop over
# key blocks $j$, so that $dK_j$ and $dV_j$ are complete when it moves on, the inner loop over query blocks
# $i$, each adding its share to $dQ_i$. Written out by hand, then compared with the plain pair's backward
# and with `flash_attention_backward`.

# %%
dQ, dK, dV = np.zeros_like(Q), np.zeros_like(K), np.zeros_like(V)
for j0 in range(0, T_k, B_c):  # outer loop: key blocks K_j, V_j
    cj = slice(j0, j0 + B_c)
    for i0 in range(0, T_q, B_r):  # inner loop: query blocks Q_i
        ri = slice(i0, i0 + B_r)
        S = (Q[..., ri, :] @ K[..., cj, :].swapaxes(-1, -2)) * scale  # step 1
        P = np.exp(S - lse[..., ri, None])  # step 2
        dV[..., cj, :] += P.swapaxes(-1, -2) @ dO[..., ri, :]  # step 3
        dS = P * (dO[..., ri, :] @ V[..., cj, :].swapaxes(-1, -2) - Delta[..., ri, :])  # step 4
        dQ[..., ri, :] += scale * dS @ K[..., cj, :]  # step 5
        dK[..., cj, :] += scale * dS.swapaxes(-1, -2) @ Q[..., ri, :]

dq_plain, dk_plain, dv_plain, _ = scaled_dot_product_attention_backward(dO, plain_cache)  # 4th: T5's table's, None
dq_lib, dk_lib, dv_lib, _ = flash_attention_backward(dO, cache)
for name, mine, plain, lib in (
    ("dQ", dQ, dq_plain, dq_lib),
    ("dK", dK, dk_plain, dk_lib),
    ("dV", dV, dv_plain, dv_lib),
):
    by_hand, library = np.abs(mine - plain).max(), np.abs(lib - plain).max()
    print(f"{name}: max |by hand - plain| = {by_hand:.1e}, max |library - plain| = {library:.1e}")
    assert np.abs(mine - plain).max() <= 1e-14 and np.abs(lib - plain).max() <= 1e-14
    assert np.abs(plain).max() > 0  # nothing passed by being zero

# %% [markdown]
# And the shares of block (1, 0) computed in Part 4 are exactly the plain pair's $dS$, cut to that block,
# times $K_j$ and $Q_i$: the full gradients above are these shares summed over the grid.

# %%
assert np.abs(dQ_i_share - scale * dS_plain[..., rows, cols] @ K_j).max() <= 1e-15
assert np.abs(dK_j_share - scale * dS_plain[..., rows, cols].swapaxes(-1, -2) @ Q_i).max() <= 1e-15
print("the shares of block (1, 0) match the plain dS restricted to that block")

# %% [markdown]
# ## Part 6: causal attention skips blocks
#
# With a causal mask, query $r$ sees keys $c \le r$. A block whose keys all come after its queries is
# entirely masked: its $P$ is zero and it contributes nothing, so both passes skip it without computing
# anything. A block on the diagonal is computed with its own small $B_r \times B_c$ mask; a block below it
# needs no mask at all. The map below shows it for $T = 12$ and blocks of 3: the 6 blocks above the
# diagonal of 16 are skipped; for long sequences (many blocks) that approaches half of them, and half the work.

# %%
T, blk = 12, 3
for i0 in range(0, T, blk):
    row = ""
    for j0 in range(0, T, blk):
        row += " . " if j0 > i0 + blk - 1 else (" / " if j0 + blk - 1 > i0 else " # ")
    print(f"queries {i0:2}..{i0 + blk - 1:2} |{row}")
print("# computed, unmasked    / computed, on the diagonal (its own small mask)    . skipped")

Qc, Kc, Vc, dOc = (rng.standard_normal((1, 2, T, 4)) for _ in range(4))
Oc, cc = flash_attention_forward(Qc, Kc, Vc, is_causal=True, block_q=blk, block_k=blk)
causal = np.tril(np.ones((T, T), dtype=bool))  # True = may attend: query r sees keys c <= r
Oc_plain, cc_plain = scaled_dot_product_attention_forward(Qc, Kc, Vc, causal)
grads = flash_attention_backward(dOc, cc)[:3]  # dq, dk, dv (the fourth, T5's table's, is None)
grads_plain = scaled_dot_product_attention_backward(dOc, cc_plain)[:3]
assert np.abs(Oc - Oc_plain).max() <= 1e-14
assert all(np.abs(a - b).max() <= 1e-14 for a, b in zip(grads, grads_plain, strict=True))
print("causal, tiled vs plain: output and gradients agree to 1e-14")

# %% [markdown]
# ## Summary
#
# | | plain pair | tiled pair |
# |---|---|---|
# | forward keeps | $P$, $T_q \times T_k$ per head | $\mathrm{lse} = m + \log \ell$, $T_q$ per head |
# | row term of the softmax backward | $\mathrm{rowsum}(dP \odot P)$ | $\Delta = \mathrm{rowsum}(dO \odot O)$ |
# | a block's probabilities | read from the cache | $P_{ij} = e^{S_{ij} - \mathrm{lse}_i}$, recomputed |
# | largest temporary | $T_q \times T_k$ | $B_r \times B_c$ |
# | causal | builds the $T \times T$ mask | skips the blocks above the diagonal |
#
# The price is computing $S$ and $e^{S - \mathrm{lse}}$ twice (once per pass). On a GPU that is cheap next to reading
# and writing $P$ through slow memory, which is why FlashAttention is faster there as well as smaller; in
# NumPy the loops add Python overhead per block, and `benchmarks/flash_attention.py` measures both the
# memory and the time.

# %% [markdown]
# ## Exercises
#
# Answers, worked and checked, are in `examples/answers/07_answers.py`. Check yours with
# `numpy_transformer.gradcheck.check_pair`.
#
# 1. **Merging two partial softmaxes.** Two workers each see half of a row's keys and return their
#    $(m, \ell, o)$ (unnormalised output). Write the merge that gives the whole row's output and
#    $\mathrm{lse}$, as the online update does for one new block, and check it against the plain softmax.
#    (This is how split-K decoding kernels combine their shares.)
# 2. **Your own tiled pair.** Package Part 5's loops as `tiled_forward(q, k, v)` (online softmax, returning
#    $O$ and a cache of q, k, v, O, lse) and `tiled_backward(dO, cache)` (recomputing every block), and check
#    the pair with `check_pair`, with blocks that do not divide $T$.
# 3. **The gradient of the log-sum-exp.** Show that $\partial\, \mathrm{lse}(s) / \partial s = \mathrm{softmax}(s)$,
#    and check the pair `lse_forward(s)` / `lse_backward(dlse, cache)` with `check_pair`. This is why a
#    cross-entropy loss, $\mathrm{lse}(z) - z_y$, has the gradient $p - \mathrm{onehot}(y)$ (walkthrough 03).
