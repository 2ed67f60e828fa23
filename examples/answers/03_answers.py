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
# # Answers to the exercises of walkthrough 3 (backprop through an encoder-decoder)
#
# Try the exercises first: they are at the end of `examples/03_backprop_encoder_decoder.py`. Every answer
# below is checked, with `gradcheck.check_pair` / `check_model`, the library, or PyTorch's autograd.

# %%
import importlib.util
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

if importlib.util.find_spec("numpy_transformer") is None:  # not pip-installed: import from the checkout
    sys.path.insert(0, str((Path(__file__).parent if "__file__" in globals() else Path.cwd()).resolve().parents[1]))

from numpy_transformer import (  # noqa: E402
    Transformer,
    TransformerConfig,
    cross_entropy_backward,
    cross_entropy_forward,
)
from numpy_transformer.gradcheck import check_model, check_pair  # noqa: E402

np.set_printoptions(precision=4, suppress=True)
rng = np.random.default_rng(0)

# %% [markdown]
# ### Exercise 1: cross-entropy by hand
#
# Per kept row, $\partial \ell / \partial z = p - q$ with $q = (1 - \epsilon_{ls})\, \mathrm{onehot}(y) +
# \epsilon_{ls} / |\mathcal V|$; the loss is the mean over the $n$ kept rows, so the gradient is $(p - q)/n$
# there and $0$ on ignored rows. The forward keeps $p$, $q$, the kept rows and $n$.
#
# When every row is ignored, $n = 0$ and the mean is $0/0$: there is no loss to differentiate.
# `F.cross_entropy` returns NaN; the library raises a ValueError saying so, which is what our pair does.


# %%
def ce_forward(logits, targets, ignore_index, eps):
    kept = targets != ignore_index  # (N,)
    n = int(kept.sum())
    if n == 0:
        raise ValueError(f"targets: every target equals ignore_index={ignore_index}; the mean loss is undefined")
    V = logits.shape[-1]
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)  # (N, V)
    q = np.full_like(logits, eps / V)
    q[np.arange(len(targets)), np.where(kept, targets, 0)] += 1.0 - eps  # ignored rows' q is never read
    loss = -(q * np.log(p))[kept].sum() / n
    return loss, (p, q, kept, n)


def ce_backward(dloss, cache):
    p, q, kept, n = cache
    return dloss * np.where(kept[:, None], (p - q) / n, 0.0)  # (N, V)


logits = rng.standard_normal((6, 5))
targets = np.array([1, 4, 0, 2, 0, 3])  # two rows are padding (id 0)
args = dict(logits=logits, targets=targets, ignore_index=0, eps=0.1)
result = check_pair(ce_forward, ce_backward, args, wrt=["logits"], max_coords=None)
print(result)
loss_lib, cache_lib = cross_entropy_forward(logits, targets, ignore_index=0, label_smoothing=0.1)
loss_mine, cache_mine = ce_forward(**args)
diff = np.abs(ce_backward(1.0, cache_mine) - cross_entropy_backward(cache_lib)).max()
print(f"loss: mine {loss_mine:.15f}, library {loss_lib:.15f}; max |dlogits mine - library| = {diff:.1e}")
assert result.worst <= 1e-6 and abs(loss_mine - loss_lib) <= 1e-14 and diff <= 1e-15
for forward in (ce_forward, lambda **a: cross_entropy_forward(a["logits"], a["targets"], a["ignore_index"], a["eps"])):
    try:
        forward(**(args | {"targets": np.zeros(6, dtype=int)}))
    except ValueError as error:
        print("every row ignored:", error)
    else:
        raise AssertionError("a loss over no targets should be refused")
print("Exercise 1 checked")

# %% [markdown]
# ### Exercise 2: a tied output projection
#
# With tied embeddings the decoder's token table $E$ ($|\mathcal V| \times D$) is read twice: by the lookup
# at the decoder's input and by the output projection $z = x E^\top + b$. Two paths fork from $E$, so
# $dE = \mathrm{scatter}(\sqrt{D}\, dx_{\text{input}}) + dz^\top x$: the lookup's scatter-add (walkthrough 03,
# step 5) plus the projection's weight gradient (step 2).
#
# We check it twice. First, an untied model holding the same table in both places has the two shares as
# two separate gradients, and the tied model's gradient is their sum. Second, finite differences of the
# tied model's loss with `check_model`.

# %%
cfg = dict(src_vocab_size=7, tgt_vocab_size=9, d_model=8, n_heads=2, d_ff=16, n_encoder_layers=1, max_len=8)
cfg["n_decoder_layers"] = 1
tied = Transformer(TransformerConfig(**cfg, tie_embeddings=True), seed=0).eval()
untied = Transformer(TransformerConfig(**cfg, tie_embeddings=False), seed=0).eval()
state = tied.state_dict()
untied.load_state_dict(state | {"output_proj.weight": state["decoder.token_embedding.weight"].copy()})

src, tgt = np.array([[3, 4, 5, 6]]), np.array([[1, 5, 7]])
dlogits = rng.standard_normal((1, 3, 9))
for model in (tied, untied):
    model.forward(src, tgt)
    model.zero_grad()
    model.backward(dlogits)
share_input = untied.grads["decoder.token_embedding.weight"]
share_output = untied.grads["output_proj.weight"]
diff = np.abs(tied.grads["decoder.token_embedding.weight"] - (share_input + share_output)).max()
print(f"max |tied dE - (lookup's share + projection's share)| = {diff:.1e}")
assert diff <= 1e-14 and np.abs(share_input).max() > 0 and np.abs(share_output).max() > 0
fd = check_model(tied, src, tgt)
print(f"check_model on the tied model: worst error {fd.worst:.1e} over {len(fd.errors)} tensors")
assert fd.worst <= 1e-6
print("Exercise 2 checked")

# %% [markdown]
# ### Exercise 3: SiLU, and its diagonal Jacobian
#
# $\phi(a) = a\, \sigma(a)$ with $\sigma' = \sigma (1 - \sigma)$. The product rule:
# $\phi'(a) = \sigma(a) + a\, \sigma(a)(1 - \sigma(a)) = \sigma(a)\big(1 + a(1 - \sigma(a))\big)$.
# Output $i$ depends on input $i$ only, so $\partial \phi_i / \partial a_j = 0$ for $i \neq j$: the
# Jacobian is diagonal, $J = \mathrm{diag}(\phi'(a))$, and $J^\top d\phi = \phi'(a) \odot d\phi$.


# %%
def silu_forward(a):
    s = 1.0 / (1.0 + np.exp(-a))
    return a * s, (a, s)


def silu_backward(d, cache):
    a, s = cache
    return d * s * (1.0 + a * (1.0 - s))


a = rng.standard_normal(5)
result = check_pair(silu_forward, silu_backward, dict(a=a.copy()), wrt=["a"], max_coords=None)
a_t = torch.tensor(a, requires_grad=True)
upstream = rng.standard_normal(5)
F.silu(a_t).backward(torch.from_numpy(upstream))
diff = np.abs(silu_backward(upstream, silu_forward(a)[1]) - a_t.grad.numpy()).max()
h = 1e-5
jacobian = np.stack(
    [(silu_forward(a + h * e)[0] - silu_forward(a - h * e)[0]) / (2 * h) for e in np.eye(5)], axis=1
)  # column j: d phi / d a_j
off_diagonal = np.abs(jacobian - np.diag(np.diag(jacobian))).max()
print(f"finite differences {result.worst:.1e}; vs autograd {diff:.1e}; largest off-diagonal entry {off_diagonal:.1e}")
print("diagonal:", np.diag(jacobian), "\nphi'(a): ", silu_backward(np.ones(5), silu_forward(a)[1]))
assert result.worst <= 1e-6 and diff <= 1e-15 and off_diagonal == 0.0
assert np.abs(np.diag(jacobian) - silu_backward(np.ones(5), silu_forward(a)[1])).max() <= 1e-9
print("Exercise 3 checked")
