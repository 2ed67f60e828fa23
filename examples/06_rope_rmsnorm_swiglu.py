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
# # 6. RoPE, RMSNorm and SwiGLU backward by hand
#
# *Prerequisites:* walkthroughs 01, 01b and 02. *Time:* 45 minutes. The symbols are those of
# [the notation table](../docs/notation.md); its symbols for this walkthrough's parts: $\nu$ is a row's mean square
# (RMSNorm), $t$ and $t'$ the positions of a query and a key (RoPE), $g$ and $u$ the gated block's gate
# and up projections (SwiGLU).
#
# Llama keeps the paper's layer (attention, then a feed-forward block, each around a residual
# connection) and changes four of its parts:
#
# | the paper | Llama |
# |---|---|
# | layer norm: centre, divide by the standard deviation, scale, shift | **RMSNorm**: divide by the RMS, scale |
# | sinusoids *added* to the token embeddings | **rotary embeddings (RoPE)**: queries and keys *rotated* |
# | $W_2\, \mathrm{ReLU}(W_1 x)$ | **SwiGLU**: $W_2 \big(\mathrm{SiLU}(W_g x) \odot W_1 x\big)$ |
# | one key and value head per query head | **grouped-query attention**: several query heads share one K/V head |
#
# This walkthrough derives the backward pass of each on numbers small enough to print, and checks every
# one four ways: against the formula written out by hand, against the library's forward/backward pair
# (`numpy_transformer.layers`, `numpy_transformer.attention`), against PyTorch's autograd (`F.rms_norm`,
# `F.silu`, a `rotate_half` as Hugging Face writes it, `F.scaled_dot_product_attention(enable_gqa=True)`)
# and against central finite differences. In between, it shows numerically the property RoPE was designed
# for: attention scores that depend only on the distance between two positions.

# %%
import importlib.util
import os
import sys
from pathlib import Path

if importlib.util.find_spec("numpy_transformer") is None or importlib.util.find_spec("examples") is None:
    # not pip-installed, or run from elsewhere: import from the checkout (examples/ is a folder of scripts there)
    sys.path.insert(0, str((Path(__file__).parent if "__file__" in globals() else Path.cwd()).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from examples import plotting  # noqa: E402  (matplotlib with the file-only Agg backend)
from numpy_transformer.attention import (  # noqa: E402
    repeat_kv_backward,
    repeat_kv_forward,
    rope_angles,
    rope_backward,
    rope_forward,
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)
from numpy_transformer.gradcheck import check_pair  # noqa: E402
from numpy_transformer.layers import (  # noqa: E402
    gated_feed_forward_backward,
    gated_feed_forward_forward,
    rms_norm_backward,
    rms_norm_forward,
    silu_backward,
    silu_forward,
    sinusoidal_table,
)

OUT = Path(os.environ.get("WALKTHROUGH_OUT", "runs/walkthrough_06"))
OUT.mkdir(parents=True, exist_ok=True)
np.set_printoptions(precision=4, suppress=True, linewidth=110)
rng = np.random.default_rng(0)
checks = {}  # derivation -> (max |by hand - library|, max |by hand - torch|, finite-difference error)


def max_diff(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max())


# %% [markdown]
# ## 1. RMSNorm
#
# Layer norm subtracts the mean and divides by the standard deviation. RMSNorm (Zhang and Sennrich,
# 2019) skips the centring and divides by the root mean square; there is a gain $\gamma$ and no bias:
#
# $$r = \Big(\frac1D \sum_i x_i^2 + \varepsilon\Big)^{-1/2}, \qquad \hat x_i = x_i\, r,
# \qquad y_i = \gamma_i\, \hat x_i.$$
#
# Cheaper (one statistic instead of two), and in practice as good. Two rows of width $D = 4$, Llama's
# $\varepsilon = 10^{-6}$:

# %%
x = np.array([[1.0, -2.0, 3.0, 0.5], [0.2, 0.4, -0.1, 1.5]])  # (N, D) = (2, 4)
gamma = np.array([1.0, 0.5, -1.5, 2.0])  # (D,)
eps = 1e-6
N, D = x.shape

ms = (x * x).mean(axis=-1, keepdims=True)  # (N, 1), the mean square
r = 1.0 / np.sqrt(ms + eps)  # (N, 1)
x_hat = x * r  # (N, D)
y = x_hat * gamma  # (N, D)
print("r =", r.ravel())
print("y =\n", y)

y_lib, rms_cache = rms_norm_forward(x, gamma, eps)
y_torch = F.rms_norm(torch.tensor(x), (D,), torch.tensor(gamma), eps).numpy()
print(f"max |by hand - library| = {max_diff(y, y_lib):.1e},  max |by hand - F.rms_norm| = {max_diff(y, y_torch):.1e}")
assert max_diff(y, y_lib) <= 1e-15 and max_diff(y, y_torch) <= 1e-15

# %% [markdown]
# ### Backward, one forward line at a time
#
# With a random upstream gradient $dy$, from the last forward line to the first (each comment quotes the
# line being inverted):
#
# - $y = \gamma \odot \hat x$: $d\gamma = \sum_{\text{rows}} dy \odot \hat x$ (the gain is shared by all rows), and
#   $d\hat x = dy \odot \gamma$;
# - $\hat x = x\, r$: the direct path $dx \mathrel{+}= d\hat x\, r$, and $r$, one number per row, collects
#   $dr = \sum_i d\hat x_i\, x_i$;
# - $r = (\nu + \varepsilon)^{-1/2}$, $\nu$ the mean square: $d\nu = -\tfrac12 r^3\, dr$;
# - $\nu = \frac1D \sum_i x_i^2$: $dx \mathrel{+}= d\nu \cdot 2x / D$.
#
# Substituting,
# $d\nu \cdot 2x/D = -r^3 x \sum_i d\hat x_i\, x_i / D = -r\, \hat x\, \mathrm{mean}(d\hat x \odot \hat x)$, so
#
# $$\boxed{\,dx = r\,\big(d\hat x - \hat x\, \mathrm{mean}(d\hat x \odot \hat x)\big)\,}$$
#
# Layer norm's formula (walkthrough 02) without its $-\mathrm{mean}(d\hat x)$ term: there is no mean to go back
# through.

# %%
dy = np.round(rng.standard_normal((N, D)), 1)  # (N, D)
print("dy =\n", dy)
# y = x_hat * w
dgamma = (dy * x_hat).sum(axis=0)  # (D,)
dx_hat = dy * gamma  # (N, D)
# x_hat = x * r
dx_staged = dx_hat * r  # the direct path
dr = (dx_hat * x).sum(axis=-1, keepdims=True)  # (N, 1)
# r = (ms + eps) ** -0.5
dms = -0.5 * r**3 * dr  # (N, 1)
# ms = mean(x * x)
dx_staged += dms * 2.0 * x / D  # the path through the mean square
dx_boxed = r * (dx_hat - x_hat * (dx_hat * x_hat).mean(axis=-1, keepdims=True))
print("dx (step by step) =\n", dx_staged)
print(f"max |step by step - boxed formula| = {max_diff(dx_staged, dx_boxed):.1e}")
assert max_diff(dx_staged, dx_boxed) <= 1e-15

# %% [markdown]
# The library's `rms_norm_backward`, PyTorch's autograd through `F.rms_norm`, and finite differences
# (`check_pair`, central step $10^{-5}$; the project's bar is $10^{-6}$):

# %%
dx_lib, dgamma_lib = rms_norm_backward(dy, rms_cache)
x_t = torch.tensor(x, requires_grad=True)
gamma_t = torch.tensor(gamma, requires_grad=True)
F.rms_norm(x_t, (D,), gamma_t, eps).backward(torch.tensor(dy))
fd = check_pair(rms_norm_forward, rms_norm_backward, dict(x=x.copy(), weight=gamma.copy(), eps=eps), ["x", "weight"],
                max_coords=None)  # fmt: skip
print(fd)
lib_err = max(max_diff(dx_staged, dx_lib), max_diff(dgamma, dgamma_lib))
torch_err = max(max_diff(dx_staged, x_t.grad.numpy()), max_diff(dgamma, gamma_t.grad.numpy()))
print(f"max |by hand - library| = {lib_err:.1e},  max |by hand - torch| = {torch_err:.1e}")
assert lib_err <= 1e-14 and torch_err <= 1e-14 and fd.worst <= 1e-6
checks["RMSNorm"] = (lib_err, torch_err, fd.worst)

# %% [markdown]
# One more reading of the boxed formula. RMSNorm does not care how long $x$ is: $y(\lambda x) = y(x)$ for
# any $\lambda > 0$ (up to $\varepsilon$). So moving $x$ along itself changes nothing, and the gradient has
# no component along $x$:
# $x \cdot dx = r\,(d\hat x \cdot x)(1 - r^2 \nu) = r\,(d\hat x \cdot x)\,\varepsilon / (\nu + \varepsilon)$,
# zero but for $\varepsilon$. (Layer norm's gradient is likewise orthogonal to both $\mathbf 1$ and
# $\hat x$.)

# %%
along_x = (x * dx_staged).sum(axis=-1)
predicted = r.ravel() * (dx_hat * x).sum(axis=-1) * eps / (ms.ravel() + eps)
print("x . dx per row:                      ", "  ".join(f"{v: .3e}" for v in along_x))
print("predicted r (dx_hat . x) eps / (ms + eps):", "  ".join(f"{v: .3e}" for v in predicted))
assert max_diff(along_x, predicted) <= 1e-14

# %% [markdown]
# ## 2. Rotary position embeddings: a rotation of pairs
#
# RoPE (Su et al., 2021) leaves the token embeddings alone and encodes position $t$ inside attention, by
# rotating each query and key. A head's $d_h$ features are cut into $d_h / 2$ pairs, and pair $i$ is
# rotated in its plane by the angle $t\, \theta_i$, with $\theta_i = \text{base}^{-2i/d_h}$ (base 10,000):
# fast rotations for the first pairs, slow ones for the last. Hugging Face's layout (ours) pairs feature
# $i$ with feature $i + d_h/2$ (the "half-split" layout; the RoFormer paper pairs neighbours $2i, 2i+1$,
# the same idea with the features permuted):
#
# $$\begin{pmatrix} y_i \\ y_{i + d_h/2} \end{pmatrix} =
# \begin{pmatrix} \cos t\theta_i & -\sin t\theta_i \\ \sin t\theta_i & \cos t\theta_i \end{pmatrix}
# \begin{pmatrix} x_i \\ x_{i + d_h/2} \end{pmatrix}.$$
#
# With $d_h = 4$ there are two pairs, (0, 2) and (1, 3), and $\theta = (1, 1/100)$. As one matrix for
# position $t$, $y = R(t)\, x$:

# %%
Dh = 4
theta = 10000.0 ** (-np.arange(0, Dh, 2) / Dh)  # (Dh/2,) = [1, 0.01]


def rotation(t: float) -> np.ndarray:
    """R(t), (Dh, Dh): pair (i, i + Dh/2) rotated by t * theta_i."""
    R, half = np.zeros((Dh, Dh)), Dh // 2
    for i, angle in enumerate(t * theta):
        c, s = np.cos(angle), np.sin(angle)
        R[i, i], R[i, i + half], R[i + half, i], R[i + half, i + half] = c, -s, s, c
    return R


print("theta =", theta)
print("R(3) =\n", rotation(3))

# %% [markdown]
# Three positions of one head. `rope_angles` gives the library's tables, $\cos t\theta_i$ and
# $\sin t\theta_i$ of shape $(T, d_h/2)$; `rope_forward` applies them to an array (B, H, T, Dh). PyTorch
# has no built-in RoPE; Hugging Face writes it with a helper that swaps the halves,
# `rotate_half(x) = cat(-x2, x1)`, and duplicated tables: $y = x \odot \cos + \mathrm{rotate\_half}(x)
# \odot \sin$. We write that in torch, from its definition.

# %%
positions = np.array([1.0, 2.0, 7.0])
xr = np.round(rng.standard_normal((len(positions), Dh)), 1)  # (T, Dh), one head's queries
cos, sin = rope_angles(positions, Dh, 10000.0)  # (T, Dh/2) each
y_by_hand = np.stack([rotation(t) @ xr[row] for row, t in enumerate(positions)])  # (T, Dh)
y_lib, rope_cache = rope_forward(xr[None, None], cos, sin)  # (1, 1, T, Dh)


def rotate_half(v):
    v1, v2 = v.chunk(2, dim=-1)
    return torch.cat([-v2, v1], dim=-1)


def torch_rope(v, cos, sin):
    cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)  # (T, Dh)
    return v * cos + rotate_half(v) * sin


xr_t = torch.tensor(xr, requires_grad=True)
y_torch = torch_rope(xr_t, torch.tensor(cos), torch.tensor(sin))
print("x =\n", xr, "\nR(t) x =\n", y_by_hand)
print(f"max |by hand - library| = {max_diff(y_by_hand, y_lib[0, 0]):.1e},  "
      f"max |by hand - torch rotate_half| = {max_diff(y_by_hand, y_torch.detach()):.1e}")  # fmt: skip
print("lengths before and after:", np.linalg.norm(xr, axis=-1), np.linalg.norm(y_by_hand, axis=-1))
assert max_diff(y_by_hand, y_lib[0, 0]) <= 1e-15 and max_diff(y_by_hand, y_torch.detach()) <= 1e-15

# %% [markdown]
# ### Backward: the inverse rotation
#
# $y = R\, x$ is linear, so $dx = R^\top dy$ (the rule for any matrix product, walkthrough 01). For a
# rotation this is special: $R$ is *orthogonal*, $R^\top R = I$ (each column has length
# $\cos^2 + \sin^2 = 1$, and the two columns of a pair are perpendicular), so its transpose is its
# inverse, and the inverse of a rotation by $t\theta$ is the rotation by $-t\theta$:
#
# $$dx = R(t)^\top dy = R(t)^{-1} dy = R(-t)\, dy.$$
#
# The backward of RoPE is RoPE with $\sin \to -\sin$. That is exactly `rope_backward`: it calls
# `rope_forward(dout, cos, -sin)`. Rotating the gradient back is also why a rotation neither grows nor
# shrinks it: $\lVert dx \rVert = \lVert dy \rVert$.

# %%
R7 = rotation(7)
print("R(7)^T R(7) =\n", R7.T @ R7)
assert max_diff(R7.T @ R7, np.eye(Dh)) <= 1e-15 and max_diff(R7.T, rotation(-7)) <= 1e-15

dyr = np.round(rng.standard_normal(xr.shape), 1)  # (T, Dh)
dx_transpose = np.stack([rotation(t).T @ dyr[row] for row, t in enumerate(positions)])
dx_inverse = np.stack([rotation(-t) @ dyr[row] for row, t in enumerate(positions)])
dx_lib = rope_backward(dyr[None, None], rope_cache)[0, 0]
y_torch.backward(torch.tensor(dyr))
fd = check_pair(rope_forward, rope_backward, dict(x=xr[None, None].copy(), cos=cos, sin=sin), ["x"], max_coords=None)
print("dx = R^T dy =\n", dx_transpose)
print(fd)
lib_err = max(max_diff(dx_transpose, dx_lib), max_diff(dx_transpose, dx_inverse))
torch_err = max_diff(dx_transpose, xr_t.grad.numpy())
print(f"max |R^T dy - R(-t) dy or library| = {lib_err:.1e},  max |R^T dy - torch autograd| = {torch_err:.1e}")
assert lib_err <= 1e-15 and torch_err <= 1e-15 and fd.worst <= 1e-6
assert max_diff(np.linalg.norm(dx_lib, axis=-1), np.linalg.norm(dyr, axis=-1)) <= 1e-14
checks["RoPE"] = (lib_err, torch_err, fd.worst)

# %% [markdown]
# ## 3. Why the scores depend only on the distance
#
# Attention compares a query at position $t$ with a key at position $t'$ through their dot product. After
# rotation:
#
# $$\big(R(t)\, q\big) \cdot \big(R(t')\, k\big) = q^\top R(t)^\top R(t')\, k
# = q^\top R(-t) R(t')\, k = q^\top R(t' - t)\, k,$$
#
# because rotations of the same planes compose by adding their angles. The absolute positions cancel;
# only the offset $t' - t$ is left. Shift both positions by the same amount and the score does not change.
# Below, one query and one key ($d_h = 8$, four rotation speeds) at several pairs of positions, each shifted
# by 0, 1, 10, 100 and 1000: every row of the table is constant.

# %%
Dh8 = 8
q8, k8 = rng.standard_normal(Dh8), rng.standard_normal(Dh8)


def rope_score(t, t2, q=q8, k=k8):
    """(R(t) q) . (R(t') k), with the library's rope_forward at positions t and t' (t2 in the code)."""
    cos, sin = rope_angles(np.array([t, t2]), Dh8, 10000.0)
    rotated, _ = rope_forward(np.stack([q, k])[None, None], cos, sin)  # (1, 1, 2, Dh)
    return rotated[0, 0, 0] @ rotated[0, 0, 1]


shifts = [0, 1, 10, 100, 1000]
pair, offset = "(t, t')", "t' - t"
print(f"{pair:>9} {offset:>6} " + "".join(f"{f'shift {shift}':>11}" for shift in shifts))
for t, t2 in [(0, 0), (0, 1), (1, 0), (2, 5), (5, 2), (3, 12)]:
    row = [rope_score(t + shift, t2 + shift) for shift in shifts]
    print(f"{f'({t}, {t2})':>9} {t2 - t:>6} " + "".join(f"{v:11.6f}" for v in row))
    assert max(row) - min(row) <= 1e-12

# %% [markdown]
# The paper's positions do not have this property. There the sinusoid $p_t$ is *added* to the embedding,
# and the score of $(x_q + p_t)$ against $(x_k + p_{t'})$ contains the cross terms $x_q \cdot p_{t'}$ and
# $p_t \cdot x_k$, which depend on $t$ and $t'$ themselves, not on their difference:

# %%
table = sinusoidal_table(2000, Dh8)  # (max_len, Dh): the paper's sinusoids


def additive_score(t, t2, q=q8, k=k8):
    return (q + table[t]) @ (k + table[t2])


row = [additive_score(2 + shift, 5 + shift) for shift in shifts]
print("additive sinusoids, (t, t') = (2, 5): " + "".join(f"{v:11.6f}" for v in row))
assert max(row) - min(row) > 0.1

# %% [markdown]
# As pictures: the score of the query at every position $t$ against the key at every position $t'$,
# $0 \le t, t' < 48$. With RoPE the matrix is constant along each diagonal ($t' - t$ fixed), a Toeplitz
# matrix; with added sinusoids it is not. (In a trained model $q$ and $k$ also depend on the token, of
# course; what RoPE guarantees is that position enters only as the offset.)

# %%
span = range(48)
rope_matrix = np.array([[rope_score(t, t2) for t2 in span] for t in span])
additive_matrix = np.array([[additive_score(t, t2) for t2 in span] for t in span])
assert max_diff(np.diagonal(rope_matrix, 3), rope_matrix[0, 3]) <= 1e-12  # constant along a diagonal

plt = plotting.plt
fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
for ax, matrix, title in ((axes[0], rope_matrix, "rotary: (R(t) q) . (R(t') k)"),
                          (axes[1], additive_matrix, "added sinusoids: (q + p_t) . (k + p_t')")):  # fmt: skip
    image = ax.imshow(matrix, cmap="coolwarm")
    ax.set_xlabel("key position t'")
    ax.set_ylabel("query position t")
    ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=ax, shrink=0.8)
fig.tight_layout()
fig.savefig(OUT / "rope_scores.png", dpi=110)
plt.close(fig)
print("wrote rope_scores.png")

# %% [markdown]
# ### Scaled RoPE: longer contexts by changing the frequencies
#
# A model trained on sequences of $L$ positions has never seen the angles $t\,\theta_i$ for $t \ge L$. The
# checkpoints that read longer texts change the frequencies $\theta_i$ (and some the size of cos and sin), never
# the rotation itself: the backward above stays the transpose. `config.rope_scaling` (a `RopeScaling`, read from
# config.json's `rope_scaling` or `rope_parameters`) picks one of transformers' kinds, computed in one place,
# `rope_frequencies`:
#
# - **linear** (gemma-3's global layers, factor 8): every $\theta_i / f$: position $t$ turns as $t / f$ did;
# - **dynamic** (NTK): up to `max_position_embeddings` nothing changes; past it the base grows with the length
#   $T$, $b\,(fT/L - (f - 1))^{R/(R-2)}$, so the slow pairs slow down most;
# - **llama3** (Llama 3.1, 3.2): fast pairs (wavelength below $L/4$) kept, slow ones (above $L$) divided by $f$,
#   a smooth blend between: local order stays sharp, long range is squeezed;
# - **yarn** (Qwen2.5, Qwen3): the same idea with a linear ramp over the dimensions, and cos and sin times an
#   attention factor $0.1 \ln f + 1$, which multiplies every score by its square (a sharper softmax);
# - **longrope** (Phi-3.5, Phi-4-mini): a divisor per pair, one list for sequences within the original length and
#   another past it (chosen by the sequence's length), and an attention factor $\sqrt{1 + \ln f / \ln L}$.
#
# The frequencies of a head of 8 (four pairs) at base 500 under each kind, for a 20-position sequence of a
# model whose original length is 16:

# %%
from numpy_transformer.attention import rope_frequencies  # noqa: E402
from transformer_spec.config import RopeScaling  # noqa: E402

kinds = {
    "plain": None,
    "linear 4": RopeScaling("linear", factor=4.0),
    "dynamic 2": RopeScaling("dynamic", factor=2.0),
    "llama3 8": RopeScaling("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0),
    "yarn 4": RopeScaling("yarn", factor=4.0),
    "longrope": RopeScaling("longrope", short_factor=(1.0, 1.2, 1.5, 2.0), long_factor=(1.0, 2.0, 4.0, 8.0)),
}
for name, scaling in kinds.items():
    inv_freq, factor = rope_frequencies(8, 500.0, scaling, max_len=16, seq_len=20)
    print(f"{name:>10}: theta_i = {np.array2string(inv_freq, precision=4)}, cos/sin x {factor:.4f}")

# %% [markdown]
# ## 4. SiLU
#
# SwiGLU's activation is SiLU (also called swish), $\mathrm{silu}(x) = x\, \sigma(x)$ with the logistic
# sigmoid $\sigma(x) = 1 / (1 + e^{-x})$: close to ReLU far from zero, smooth near it, and slightly
# negative for negative $x$. Its derivative, by the product rule and $\sigma' = \sigma(1 - \sigma)$:
#
# $$\mathrm{silu}'(x) = \sigma(x) + x\, \sigma(x)\big(1 - \sigma(x)\big) = \sigma(x)\big(1 + x(1 - \sigma(x))\big).$$
#
# Unlike ReLU's, it is negative for $x$ below about $-1.28$ (where SiLU has its minimum).

# %%
xs = np.array([-3.0, -1.278, -0.5, 0.0, 0.5, 2.0, 6.0])
sig = 1.0 / (1.0 + np.exp(-xs))
silu = xs * sig
dsilu = sig * (1.0 + xs * (1.0 - sig))
print("x        ", xs)
print("silu(x)  ", silu)
print("silu'(x) ", dsilu)

dys = np.round(rng.standard_normal(xs.shape), 1)
silu_lib, silu_cache = silu_forward(xs)
dx_lib = silu_backward(dys, silu_cache)
xs_t = torch.tensor(xs, requires_grad=True)
silu_t = F.silu(xs_t)
silu_t.backward(torch.tensor(dys))
fd = check_pair(silu_forward, silu_backward, dict(x=xs.copy()), ["x"], max_coords=None)
print(fd)
lib_err = max(max_diff(silu, silu_lib), max_diff(dys * dsilu, dx_lib))
torch_err = max(max_diff(silu, silu_t.detach()), max_diff(dys * dsilu, xs_t.grad.numpy()))
print(f"max |by hand - library| = {lib_err:.1e},  max |by hand - F.silu autograd| = {torch_err:.1e}")
assert lib_err <= 1e-15 and torch_err <= 1e-15 and fd.worst <= 1e-6
checks["SiLU"] = (lib_err, torch_err, fd.worst)

# %% [markdown]
# ## 5. The gated feed-forward block (SwiGLU)
#
# Llama's feed-forward block has three weight matrices and no biases: a *gate* $W_g$ and an *up*
# projection $W_1$, both $D \to F$, and a *down* projection $W_2$, $F \to D$:
#
# $$g = x W_g^\top, \qquad u = x W_1^\top, \qquad \tilde u = \mathrm{silu}(g) \odot u, \qquad y = \tilde u W_2^\top.$$
#
# The gate decides, feature by feature, how much of $u$ passes. (In the state dict: `ffn.gate.weight`,
# `ffn.linear1.weight` for Llama's `up_proj`, `ffn.linear2.weight` for `down_proj`.) We take $D = 3$,
# $F = 4$, two positions.
#
# Backward, the forward's lines in reverse:
#
# - $y = \tilde u W_2^\top$: $d\tilde u = dy\, W_2$, $dW_2 = dy^\top \tilde u$ (`ut`, `dut` in the code);
# - $\tilde u = \phi(g) \odot u$ with $\phi = \mathrm{silu}$: the **product rule**, each factor gets $d\tilde u$
#   times the *other* factor: $du = d\tilde u \odot \phi(g)$, $d\phi = d\tilde u \odot u$ ($d\phi$ the gradient
#   of the activation's output, as in walkthrough 03);
# - $\phi(g) = \mathrm{silu}(g)$: $dg = d\phi \odot \mathrm{silu}'(g)$;
# - $u = x W_1^\top$ and $g = x W_g^\top$: $dW_1 = du^\top x$, $dW_g = dg^\top x$, and $x$ feeds *both*,
#   so its gradient is the sum of the two paths: $dx = du\, W_1 + dg\, W_g$.

# %%
Dm, Fm = 3, 4
xf = np.round(rng.standard_normal((2, Dm)), 1)  # (T, D)
params = {
    "gate.weight": np.round(rng.standard_normal((Fm, Dm)), 1),  # (F, D)
    "linear1.weight": np.round(rng.standard_normal((Fm, Dm)), 1),  # (F, D), up_proj
    "linear2.weight": np.round(rng.standard_normal((Dm, Fm)), 1),  # (D, F), down_proj
}
Wg, W1, W2 = params["gate.weight"], params["linear1.weight"], params["linear2.weight"]

gf = xf @ Wg.T  # (T, F)
uf = xf @ W1.T  # (T, F)
sg = 1.0 / (1.0 + np.exp(-gf))
phif = gf * sg  # silu(g)
ut = phif * uf  # (T, F), u tilde
yf = ut @ W2.T  # (T, D)
print("g =\n", gf, "\nu =\n", uf, "\nu tilde = silu(g) * u =\n", ut, "\ny =\n", yf)

dyf = np.round(rng.standard_normal(yf.shape), 1)  # (T, D)
# y = u_tilde W2^T
dut = dyf @ W2  # (T, F)
dW2 = dyf.T @ ut  # (D, F)
# u_tilde = phi(g) * u: each factor gets dut times the other
duf = dut * phif
dphif = dut * uf
# phi(g) = silu(g)
dgf = dphif * sg * (1.0 + gf * (1.0 - sg))
# u = x W1^T and g = x Wg^T: two paths into x
dW1 = duf.T @ xf  # (F, D)
dWg = dgf.T @ xf  # (F, D)
dxf = duf @ W1 + dgf @ Wg  # (T, D): the up path + the gate path
by_hand = {"x": dxf, "gate.weight": dWg, "linear1.weight": dW1, "linear2.weight": dW2}
print("dx =\n", dxf)

# %% [markdown]
# The library's pair, PyTorch's autograd on the same three lines written with `F.linear` and `F.silu`, and
# finite differences over $x$ and all three weights:

# %%
yf_lib, ffn_cache = gated_feed_forward_forward(params, xf, "silu")
dxf_lib, grads_lib = gated_feed_forward_backward(dyf, ffn_cache)
library = {"x": dxf_lib} | grads_lib

leaves = {name: torch.tensor(v, requires_grad=True) for name, v in ({"x": xf} | params).items()}
yf_t = F.linear(F.silu(F.linear(leaves["x"], leaves["gate.weight"])) * F.linear(leaves["x"], leaves["linear1.weight"]),
                leaves["linear2.weight"])  # fmt: skip
yf_t.backward(torch.tensor(dyf))
fd = check_pair(gated_feed_forward_forward, gated_feed_forward_backward,
                dict(params={k: v.copy() for k, v in params.items()}, x=xf.copy(), activation="silu"),
                ["x", "params"], max_coords=None)  # fmt: skip
print(fd)
lib_err = max([max_diff(yf, yf_lib)] + [max_diff(by_hand[k], library[k]) for k in by_hand])
torch_err = max([max_diff(yf, yf_t.detach())] + [max_diff(by_hand[k], leaves[k].grad) for k in by_hand])
print(f"max |by hand - library| = {lib_err:.1e},  max |by hand - torch autograd| = {torch_err:.1e}")
assert sorted(grads_lib) == ["gate.weight", "linear1.weight", "linear2.weight"]  # no biases, as in Llama
assert lib_err <= 1e-14 and torch_err <= 1e-14 and fd.worst <= 1e-6
checks["SwiGLU feed-forward"] = (lib_err, torch_err, fd.worst)

# %% [markdown]
# ## 6. Grouped-query attention: a shared head's gradient is a sum
#
# At generation time a model keeps every past key and value (the KV cache), and that memory, not the
# arithmetic, is often the limit. Grouped-query attention (Ainslie et al., 2023) keeps fewer K/V heads
# than query heads: with $H = 4$ query heads and $H_{kv} = 2$ K/V heads, query heads 0 and 1 read K/V
# head 0 and query heads 2 and 3 read K/V head 1 (query head $h$ reads K/V head $\lfloor h / n_{rep}
# \rfloor$, $n_{rep} = H / H_{kv} = 2$). The cache halves.
#
# In code the shared heads are simply repeated before attention (`repeat_kv_forward`, Hugging Face's
# `repeat_kv`): (B, H_kv, T, Dh) $\to$ (B, H, T, Dh). A copy used in several places gets the *sum* of the
# gradients of its uses, the same rule as a residual connection or a tied embedding:
#
# $$dK_j = \sum_{r < n_{rep}} dK^{\text{rep}}_{j\, n_{rep} + r}.$$

# %%
B, H, H_kv, T, Dh = 1, 4, 2, 3, 2
n_rep = H // H_kv
q = np.round(rng.standard_normal((B, H, T, Dh)), 1)  # (B, H, T, Dh)
k = np.round(rng.standard_normal((B, H_kv, T, Dh)), 1)  # (B, H_kv, T, Dh)
v = np.round(rng.standard_normal((B, H_kv, T, Dh)), 1)
k_rep, repeat_cache = repeat_kv_forward(k, n_rep)  # (B, H, T, Dh)
print("which K/V head each query head reads:", [h // n_rep for h in range(H)])
assert all(np.array_equal(k_rep[:, h], k[:, h // n_rep]) for h in range(H))

dk_rep = np.round(rng.standard_normal(k_rep.shape), 1)  # (B, H, T, Dh)
dk_by_hand = np.zeros_like(k)
for h in range(H):
    dk_by_hand[:, h // n_rep] += dk_rep[:, h]  # each query head's share, added into the K/V head it read
dk_lib = repeat_kv_backward(dk_rep, repeat_cache)  # (B, H_kv, T, Dh)


def hf_repeat_kv(x, n_rep):
    """Hugging Face's repeat_kv, written from its definition: expand a new axis, then fold it into the heads."""
    b, h_kv, t, d = x.shape
    return x[:, :, None].expand(b, h_kv, n_rep, t, d).reshape(b, h_kv * n_rep, t, d)


k_t = torch.tensor(k, requires_grad=True)
hf_repeat_kv(k_t, n_rep).backward(torch.tensor(dk_rep))
print("dK per query head (K/V head 0's two readers):\n", dk_rep[0, 0], "\n+\n", dk_rep[0, 1])
print("= dK of K/V head 0:\n", dk_by_hand[0, 0])
print(f"max |by hand - library| = {max_diff(dk_by_hand, dk_lib):.1e},  "
      f"max |by hand - torch (expand/reshape)| = {max_diff(dk_by_hand, k_t.grad):.1e}")  # fmt: skip
assert max_diff(dk_by_hand, dk_lib) == 0.0 and max_diff(dk_by_hand, k_t.grad) <= 1e-15

# %% [markdown]
# The same rule inside attention. Our forward: repeat $K$ and $V$, then the plain attention of walkthrough
# 01; our backward: attention's backward, then `repeat_kv_backward` on $dK$ and $dV$. PyTorch's
# `F.scaled_dot_product_attention(..., enable_gqa=True)` takes the un-repeated $K$ and $V$ directly and
# differentiates on its own. We also hand the composed pair to `check_pair`.


# %%
def gqa_forward(q, k, v):
    k_rep, cache = repeat_kv_forward(k, q.shape[1] // k.shape[1])  # (B, H, T, Dh)
    v_rep, _ = repeat_kv_forward(v, q.shape[1] // v.shape[1])
    out, attn_cache = scaled_dot_product_attention_forward(q, k_rep, v_rep)  # (B, H, T, Dh)
    return out, (cache, attn_cache)


def gqa_backward(dout, cache):
    repeat_cache, attn_cache = cache
    dq, dk_rep, dv_rep, _ = scaled_dot_product_attention_backward(dout, attn_cache)  # (B, H, T, Dh) each; no T5 table
    return dq, repeat_kv_backward(dk_rep, repeat_cache), repeat_kv_backward(dv_rep, repeat_cache)  # dK, dV summed


out, gqa_cache = gqa_forward(q, k, v)
dout = np.round(rng.standard_normal(out.shape), 1)
dq, dk, dv = gqa_backward(dout, gqa_cache)
leaves = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
out_t = F.scaled_dot_product_attention(*leaves, enable_gqa=True)
out_t.backward(torch.tensor(dout))
fd = check_pair(gqa_forward, gqa_backward, dict(q=q.copy(), k=k.copy(), v=v.copy()), ["q", "k", "v"], max_coords=None)
print(fd)
torch_err = max(
    max_diff(out, out_t.detach()), *(max_diff(a, t.grad) for a, t in zip((dq, dk, dv), leaves, strict=True))
)
print(f"dK =\n{dk[0]}\nmax |ours - torch enable_gqa| (output, dQ, dK, dV) = {torch_err:.1e}")
assert torch_err <= 1e-14 and fd.worst <= 1e-6
checks["grouped-query attention"] = (max_diff(dk_by_hand, dk_lib), torch_err, fd.worst)

# %% [markdown]
# ## Summary
#
# - **RMSNorm**, $y = \gamma \odot x\, r$ with $r = (\mathrm{mean}(x^2) + \varepsilon)^{-1/2}$:
#   $dx = r\,(d\hat x - \hat x\, \mathrm{mean}(d\hat x \odot \hat x))$ with $d\hat x = dy \odot \gamma$, and
#   $d\gamma = \sum_{\text{rows}} dy \odot \hat x$.
# - **RoPE**, $y = R(t)\, x$, each pair $(i, i + d_h/2)$ rotated by $t\theta_i$: $dx = R(t)^\top dy = R(-t)\, dy$,
#   the inverse rotation ($\sin \to -\sin$), because a rotation is orthogonal.
# - **SiLU**, $x\,\sigma(x)$: $dx = \sigma(x)\big(1 + x(1 - \sigma(x))\big)\, dy$.
# - **SwiGLU**, $y = W_2(\mathrm{silu}(W_g x) \odot W_1 x)$: the product rule, $du = d\tilde u \odot \phi(g)$
#   and $d\phi = d\tilde u \odot u$; then $dx = du\, W_1 + dg\, W_g$, two paths meeting at $x$.
# - **Grouped-query attention**, each K/V head repeated for $n_{rep}$ query heads: $dK_j$ and $dV_j$ are the
#   sums over the query heads that read head $j$.
#
# And the property RoPE exists for: $(R(t) q) \cdot (R(t') k) = q^\top R(t' - t)\, k$, a score that
# depends on the positions only through their distance. The checks, collected:

# %%
print(f"{'derivation':26} {'vs library':>11} {'vs torch':>10} {'finite diff.':>13}")
for name, (lib_err, torch_err, fd_err) in checks.items():
    print(f"{name:26} {lib_err:11.1e} {torch_err:10.1e} {fd_err:13.1e}")

# %% [markdown]
# ## Exercises
#
# Answers, worked and checked, are in `examples/answers/06_answers.py`. Check yours with
# `numpy_transformer.gradcheck.check_pair`.
#
# 1. **RoPE in the RoFormer layout.** The RoFormer paper (and GPT-J, and Meta's original Llama code)
#    rotates neighbouring features $(2i, 2i + 1)$ instead of $(i, i + d_h/2)$. Write that forward and its
#    backward (the inverse rotation again), check the pair, and show that the two layouts give the same
#    output up to a fixed permutation of the features.
# 2. **Repeating K/V heads.** Write `repeat_kv` by hand: $(B, H_{kv}, T, d_h) \to (B, H_{kv} n_{rep}, T, d_h)$,
#    each head repeated $n_{rep}$ times in a row, and its backward (a sum over each group of copies: a
#    fork). Check it with $H_{kv} = 2$, $n_{rep} = 3$.
# 3. **GeGLU.** Replace SiLU by the exact GELU in the gated block: $y = W_2\,(\mathrm{GELU}(x W_g^\top) \odot
#    x W_1^\top)$. Derive the backward from the SwiGLU one (only $\phi'$ changes) and check it against
#    autograd and finite differences.
