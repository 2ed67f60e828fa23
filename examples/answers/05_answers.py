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
# # Answers to the exercises of walkthrough 5 (reading BERT)
#
# Try the exercises first: they are at the end of `examples/05_reading_bert.py`. Every answer below is
# checked with `gradcheck.check_pair` or `gradcheck.check_model`.

# %%
import importlib.util
import sys
from pathlib import Path

import numpy as np

if importlib.util.find_spec("numpy_transformer") is None:  # not pip-installed: import from the checkout
    sys.path.insert(0, str((Path(__file__).parent if "__file__" in globals() else Path.cwd()).resolve().parents[1]))

from numpy_transformer import EncoderModel, TransformerConfig  # noqa: E402
from numpy_transformer.gradcheck import check_model, check_pair  # noqa: E402

np.set_printoptions(precision=4, suppress=True)
rng = np.random.default_rng(0)

# %% [markdown]
# ### Exercise 1: the cosine, as a pair
#
# $\mathrm{sim} = \bar x_1 \cdot \bar x_2 / (\lVert \bar x_1 \rVert \lVert \bar x_2 \rVert)$ is a scalar, so its
# backward scales the two gradients by the scalar upstream gradient.
# $\partial \mathrm{sim} / \partial \bar x_1 \cdot \bar x_1 = \mathrm{sim} - \mathrm{sim} = 0$: an angle does not
# change when $\bar x_1$ lengthens. And since $\mathrm{sim}(3\bar x_1, \bar x_2) = \mathrm{sim}(\bar x_1, \bar x_2)$,
# the chain rule gives $3\, \nabla_{3\bar x_1} = \nabla_{\bar x_1}$: the gradient at $3\bar x_1$ is a third of the
# gradient at $\bar x_1$.


# %%
def cosine_forward(xbar1, xbar2):
    norm1, norm2 = np.linalg.norm(xbar1), np.linalg.norm(xbar2)
    sim = xbar1 @ xbar2 / (norm1 * norm2)
    return sim, (xbar1, xbar2, norm1, norm2, sim)


def cosine_backward(dsim, cache):
    xbar1, xbar2, norm1, norm2, sim = cache
    dxbar1 = xbar2 / (norm1 * norm2) - sim * xbar1 / norm1**2
    dxbar2 = xbar1 / (norm1 * norm2) - sim * xbar2 / norm2**2
    return dsim * dxbar1, dsim * dxbar2


xbar1, xbar2 = rng.standard_normal(6), rng.standard_normal(6)
inputs = dict(xbar1=xbar1.copy(), xbar2=xbar2.copy())
result = check_pair(cosine_forward, cosine_backward, inputs, wrt=["xbar1", "xbar2"], max_coords=None)
print(result)
d1, _ = cosine_backward(1.0, cosine_forward(xbar1, xbar2)[1])
d3, _ = cosine_backward(1.0, cosine_forward(3 * xbar1, xbar2)[1])
print(f"d1 . xbar1 = {d1 @ xbar1:.1e};  max |3 d(3 xbar1) - d(xbar1)| = {np.abs(3 * d3 - d1).max():.1e}")
assert result.worst <= 1e-6 and abs(d1 @ xbar1) <= 1e-14 and np.abs(3 * d3 - d1).max() <= 1e-14
print("Exercise 1 checked")

# %% [markdown]
# ### Exercise 2: mean pooling over real tokens
#
# $\bar x_b = \frac{1}{n_b} \sum_t \mathrm{real}_{bt}\, x_{bt}$ with $n_b = \sum_t \mathrm{real}_{bt}$. Each real
# $x_{bt}$ contributes $1/n_b$ of itself, so $dx_{bt} = \mathrm{real}_{bt}\, d\bar x_b / n_b$: the same vector at
# every real position, zero at the padding.


# %%
def mean_pool_forward(x, real):
    n = real.sum(axis=1, keepdims=True)  # (B, 1)
    return (x * real[..., None]).sum(axis=1) / n, (real, n)  # (B, D)


def mean_pool_backward(dxbar, cache):
    real, n = cache
    return real[..., None] * (dxbar / n)[:, None, :]  # (B, T, D)


x = rng.standard_normal((2, 4, 3))
real = np.array([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
result = check_pair(mean_pool_forward, mean_pool_backward, dict(x=x.copy(), real=real), wrt=["x"], max_coords=None)
print(result)
dx = mean_pool_backward(rng.standard_normal((2, 3)), mean_pool_forward(x, real)[1])
assert result.worst <= 1e-6 and (dx[1, 2:] == 0).all() and np.abs(dx[1, :2]).max() > 0
print("Exercise 2 checked")

# %% [markdown]
# ### Exercise 3: three tables, one sum
#
# $e_t$ is a sum of three rows, one from each table, so $de_t$ goes unchanged to each of the three rows
# (the derivative of a sum with respect to each term is 1), added into the row that was read. Summing a
# table's gradient over its rows therefore gives $\sum_t de_t$ for every table: the same vector three
# times (with `scale_embeddings=True`, the paper's $\sqrt{D}$ factor, the word table's sum would be $\sqrt{D}$
# times the others'). A row no position reads receives nothing. (BERT's post-norm layers and exact GELU are what the
# tiny model shares with all-MiniLM-L6-v2; `check_model` checks all of its tensors by finite differences.)

# %%
config = TransformerConfig(
    src_vocab_size=11,
    tgt_vocab_size=11,
    d_model=8,
    n_heads=2,
    d_ff=16,
    n_encoder_layers=1,
    n_decoder_layers=0,
    norm_first=False,
    activation="gelu",
    positional="learned",
    max_len=8,
    type_vocab_size=3,
    embedding_norm=True,
    scale_embeddings=False,  # BERT does not multiply its word embeddings by sqrt(D)
    pad_id=0,
)
model = EncoderModel(config, seed=0).eval()
ids = np.array([[5, 6, 7, 0], [3, 4, 0, 0]])
types = np.array([[0, 0, 1, 0], [0, 1, 0, 0]])  # type 2 is never used
result = check_model(model, ids, types)
print(f"check_model: worst error {result.worst:.1e} over {len(result.errors)} tensors")
hidden = model.forward(ids, types)
model.zero_grad()
model.backward(rng.standard_normal(hidden.shape))
sums = {k: model.grads[f"encoder.{k}_embedding.weight"].sum(axis=0) for k in ("token", "position", "token_type")}
for k, v in sums.items():
    print(f"{k:10} table's gradient summed over rows: {v}")
assert result.worst <= 1e-6
assert np.abs(sums["token"] - sums["position"]).max() <= 1e-14
assert np.abs(sums["token"] - sums["token_type"]).max() <= 1e-14
assert (model.grads["encoder.token_type_embedding.weight"][2] == 0).all()
print("Exercise 3 checked")
