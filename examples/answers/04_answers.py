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
# # Answers to the exercises of walkthrough 4 (training and attention maps)
#
# Try the exercises first: they are at the end of `examples/04_training_and_attention_maps.py`.
# Every answer below is checked.

# %%
import sys
from pathlib import Path

HERE = Path(__file__).parent if "__file__" in globals() else Path.cwd()
sys.path.insert(0, str(HERE.resolve().parents[1]))  # the checkout's root: examples/ is not an installed package

import numpy as np  # noqa: E402

from examples import tasks  # noqa: E402
from numpy_transformer import optim  # noqa: E402
from numpy_transformer.checkpoint import load_checkpoint  # noqa: E402

np.set_printoptions(precision=3, suppress=True)

# %% [markdown]
# ### Exercise 1: where the schedule peaks
#
# $\eta(\mathrm{step}) = \mathrm{factor}\, d_{model}^{-1/2} \min(\mathrm{step}^{-1/2}, \mathrm{step} \cdot
# \mathrm{warmup}^{-3/2})$. The first branch decreases, the second increases, so the minimum is the second
# before they cross and the first after. They cross where $\mathrm{step}^{-1/2} = \mathrm{step} \cdot
# \mathrm{warmup}^{-3/2}$, that is $\mathrm{step}^{3/2} = \mathrm{warmup}^{3/2}$, $\mathrm{step} =
# \mathrm{warmup}$. There both equal $\mathrm{warmup}^{-1/2}$, so the peak is
# $\eta(\mathrm{warmup}) = \mathrm{factor}\, d_{model}^{-1/2} \mathrm{warmup}^{-1/2}
# = \mathrm{factor}\, (d_{model} \cdot \mathrm{warmup})^{-1/2}$.

# %%
factor, d_model, n_w = 0.5, 64, 400
rates = np.array([optim.noam_rate(n, d_model, n_w, factor) for n in range(1, 4001)])
peak = factor * (d_model * n_w) ** -0.5
print(f"peak {rates.max():.6e} at step {rates.argmax() + 1}; formula {peak:.6e}")
assert rates.argmax() + 1 == n_w and abs(rates.max() - peak) <= 1e-15
assert np.all(np.diff(rates[: n_w - 1]) > 0) and np.all(np.diff(rates[n_w - 1 :]) < 0)  # up, then down
print("Exercise 1 checked")

# %% [markdown]
# ### Exercise 2: clipping rescales, it does not turn
#
# All gradients together form one long vector $\nabla\mathcal{L}$ with norm $\lVert \nabla\mathcal{L} \rVert$.
# Clipping multiplies every tensor by the same number $\min(1, \mathrm{max\_norm} / \lVert \nabla\mathcal{L} \rVert)$
# (up to the small $10^{-6}$ that guards against dividing by zero), so the direction of $\nabla\mathcal{L}$ is
# unchanged and its norm becomes $\mathrm{max\_norm}$ when it was larger.

# %%
rng = np.random.default_rng(0)
grads = {"w": 3.0 * rng.standard_normal((4, 5)), "b": 3.0 * rng.standard_normal(5)}
before = np.concatenate([g.ravel() for g in grads.values()])
total = optim.clip_grad_norm(grads, 1.0)  # in place
after = np.concatenate([g.ravel() for g in grads.values()])
cosine = before @ after / (np.linalg.norm(before) * np.linalg.norm(after))
print(f"norm before {total:.3f} (= {np.linalg.norm(before):.3f}), after {np.linalg.norm(after):.6f}, cosine {cosine}")
assert abs(total - np.linalg.norm(before)) <= 1e-12
assert abs(np.linalg.norm(after) - 1.0) <= 1e-5 and abs(cosine - 1.0) <= 1e-12
print("Exercise 2 checked")

# %% [markdown]
# ### Exercise 3: attention maps of a padded batch
#
# Two numbers of different lengths in one batch: the shorter source is padded with `<pad>` (id 0), and
# the model masks those keys (True = may attend only for real tokens). So in every cross-attention map,
# every row sums to one and the padded columns of the shorter example get exactly zero weight.

# %%
model = load_checkpoint(HERE.resolve().parent / "data" / "numbers_small.safetensors").eval()
src_vocab, tgt_vocab = tasks.build_vocabs()
pairs = [("248,402.19", tasks.number_to_words("248,402.19")), ("7", tasks.number_to_words("7"))]
src_ids, tgt_in, _ = tasks.encode_batch(pairs, src_vocab, tgt_vocab)
model.forward(src_ids, tgt_in)
cross = model.attention_maps()["decoder.layers.1.cross_attn"]  # (B, H, T_q, T_k)
padded = src_ids[1] == model.config.pad_id  # the short example's padding columns
print("source ids of the short example:", src_ids[1])
print("its cross-attention, head 0, first row:", cross[1, 0, 0])
assert np.allclose(cross.sum(axis=-1), 1.0, atol=1e-6)
assert padded.any() and np.all(cross[1][..., padded] == 0.0)
print("Exercise 3 checked")
