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
# # Answers to the exercises of walkthrough 1b (multi-head attention by hand)
#
# Try the exercises first: they are at the end of `examples/01b_multi_head_attention_by_hand.py`.
# Every answer below is checked, with `gradcheck.check_pair` or against the library.

# %%
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np

if importlib.util.find_spec("numpy_transformer") is None:  # not pip-installed: import from the checkout
    sys.path.insert(0, str((Path(__file__).parent if "__file__" in globals() else Path.cwd()).resolve().parents[1]))

from numpy_transformer import multi_head_attention_backward, multi_head_attention_forward  # noqa: E402
from numpy_transformer.gradcheck import check_pair  # noqa: E402

np.set_printoptions(precision=4, suppress=True)
rng = np.random.default_rng(0)
D, H = 4, 2
Dh = D // H


def random_params(kv_width=D):
    """q/out projections (D, D); k/v projections (kv_width, D); all biases nonzero."""
    params = {}
    for name in ("q", "k", "v", "out"):
        rows = kv_width if name in ("k", "v") else D
        params[f"{name}_proj.weight"] = rng.standard_normal((rows, D)) * 0.6
        params[f"{name}_proj.bias"] = rng.standard_normal(rows) * 0.3
    return params


# %% [markdown]
# ### Exercise 1: self-attention's gradient is the sum of three
#
# In self-attention one array $X$ is the query, the key and the value: three paths fork from it, so
# $dX = dX_q + dX_k + dX_v$ (the fork-sum rule). We wrap the library pair as a pair of one input and
# let finite differences judge it; then we show that any one of the three alone fails.

# %%
X = rng.standard_normal((1, 3, D))  # (B, T, D)
causal = np.tril(np.ones((3, 3), dtype=bool))[None, None]  # (1, 1, T, T), True = may attend
params = random_params()


def self_attention_forward(params, x, n_heads, attn_mask):
    return multi_head_attention_forward(params, x, x, x, n_heads, attn_mask=attn_mask)


def self_attention_backward(dout, cache):
    dquery, dkey, dvalue, grads = multi_head_attention_backward(dout, cache)
    return dquery + dkey + dvalue, grads  # three uses of x: their gradients add


args = dict(params=params, x=X, n_heads=H, attn_mask=causal)
result = check_pair(self_attention_forward, self_attention_backward, args, wrt=["x", "params"], max_coords=None)
print(result)
assert result.worst <= 1e-6


def query_only_backward(dout, cache):
    dquery, _, _, grads = multi_head_attention_backward(dout, cache)
    return dquery, grads


wrong = check_pair(self_attention_forward, query_only_backward, args, wrt=["x", "params"], max_coords=None)
print(f"with dquery alone, the error on x is {wrong.errors['x']:.2f}: far above the bar")
assert wrong.errors["x"] > 1e-2
print("Exercise 1 checked")

# %% [markdown]
# ### Exercise 2: the wrong split passes a gradient check
#
# We write the whole multi-head attention by hand, with the split and the merge as arguments, and its
# backward following walkthrough 1b. With the wrong split (reshape straight to $(H, T, d_h)$) and its
# inverse as the merge, the backward is still the exact derivative of *that* forward: a reshape is a
# permutation too, and its backward is its inverse. So finite differences agree. But the forward is no
# longer multi-head attention, and the comparison with the library (or with PyTorch) shows it.
#
# The lesson: a gradient check proves that a backward matches its own forward. It cannot tell whether
# the forward computes the right function; only a comparison with an independent reference can.


# %%
def split_right(x):  # (T, D) -> (H, T, Dh)
    return x.reshape(x.shape[0], H, Dh).transpose(1, 0, 2)


def merge_right(x):  # (H, T, Dh) -> (T, D)
    return x.transpose(1, 0, 2).reshape(x.shape[1], D)


def split_wrong(x):  # (T, D) -> (H, T, Dh) with no transpose: heads mix positions
    return x.reshape(H, x.shape[0], Dh)


def merge_wrong(x):  # its inverse
    return x.reshape(x.shape[1], D)


def mha_forward(params, xq, xkv, keep, split, merge):
    """Multi-head attention of one sequence by hand: xq (T_q, D), xkv (T_k, D), keep (T_k,) True = may attend."""
    Q = split(xq @ params["q_proj.weight"].T + params["q_proj.bias"])  # (H, T_q, Dh)
    K = split(xkv @ params["k_proj.weight"].T + params["k_proj.bias"])  # (H, T_k, Dh)
    V = split(xkv @ params["v_proj.weight"].T + params["v_proj.bias"])  # (H, T_k, Dh)
    c = 1.0 / math.sqrt(Dh)
    S = np.where(keep, c * Q @ K.transpose(0, 2, 1), -np.inf)  # (H, T_q, T_k)
    E = np.exp(S - S.max(axis=-1, keepdims=True))
    P = E / E.sum(axis=-1, keepdims=True)
    C = merge(P @ V)  # (T_q, D)
    Y = C @ params["out_proj.weight"].T + params["out_proj.bias"]
    return Y, (params, xq, xkv, Q, K, V, P, C, c, split, merge)


def mha_backward(dY, cache):
    """dxq, dxkv (the keys' and the values' paths added), grads: walkthrough 1b's steps 5 to 9."""
    params, xq, xkv, Q, K, V, P, C, c, split, merge = cache
    dC = dY @ params["out_proj.weight"]
    grads = {"out_proj.weight": dY.T @ C, "out_proj.bias": dY.sum(axis=0)}
    dO = split(dC)  # the merge's backward is its inverse
    dV = P.transpose(0, 2, 1) @ dO
    dP = dO @ V.transpose(0, 2, 1)
    dS = P * (dP - (dP * P).sum(axis=-1, keepdims=True))
    dQ, dK = c * dS @ K, c * dS.transpose(0, 2, 1) @ Q
    dx = {}
    for name, d, x in (("q", merge(dQ), xq), ("k", merge(dK), xkv), ("v", merge(dV), xkv)):
        dx[name] = d @ params[f"{name}_proj.weight"]
        grads[f"{name}_proj.weight"], grads[f"{name}_proj.bias"] = d.T @ x, d.sum(axis=0)
    return dx["q"], dx["k"] + dx["v"], grads


xq, xkv, keep = rng.standard_normal((2, D)), rng.standard_normal((3, D)), np.array([True, True, False])
params = random_params()
library, _ = multi_head_attention_forward(params, xq[None], xkv[None], xkv[None], H, keep[None, None, None])
for name, split, merge in (("right", split_right, merge_right), ("wrong", split_wrong, merge_wrong)):
    args = dict(params=params, xq=xq, xkv=xkv, keep=keep, split=split, merge=merge)
    check = check_pair(mha_forward, mha_backward, args, wrt=["xq", "xkv", "params"], max_coords=None)
    off = np.abs(mha_forward(**args)[0] - library[0]).max()
    print(f"{name} split: gradient check worst {check.worst:.1e}; forward vs library max|diff| {off:.1e}")
    assert check.worst <= 1e-6  # both backwards match their own forwards ...
    assert (off <= 1e-12) if name == "right" else (off > 1e-2)  # ... only one forward is multi-head attention
print("Exercise 2 checked")

# %% [markdown]
# ### Exercise 3: grouped-query attention, a shared head's gradient is a sum
#
# With $H_{kv} = 1$ key/value head serving $H = 2$ query heads, $K$ and $V$ have width $d_h$, and the
# forward repeats them for each query head. Repeating is a fork: one array read by two heads. So the
# backward adds the two heads' gradients: $dK = dK_1 + dK_2$, $dV = dV_1 + dV_2$ (each $(T_k, d_h)$).
# Then the projections' backward as usual, with $W_K$, $W_V$ of shape $(d_h, D)$.

# %%
params = random_params(kv_width=Dh)
xq, xkv = rng.standard_normal((2, D)), rng.standard_normal((3, D))
dY = rng.standard_normal((2, D))
c = 1.0 / math.sqrt(Dh)

Q = split_right(xq @ params["q_proj.weight"].T + params["q_proj.bias"])  # (H, T_q, Dh)
K = xkv @ params["k_proj.weight"].T + params["k_proj.bias"]  # (T_k, Dh): one head
V = xkv @ params["v_proj.weight"].T + params["v_proj.bias"]  # (T_k, Dh)
S = c * Q @ K.T  # (H, T_q, T_k): K broadcasts to every query head, the repeat
E = np.exp(S - S.max(axis=-1, keepdims=True))
P = E / E.sum(axis=-1, keepdims=True)
C = merge_right(P @ V)  # (T_q, D)
Y = C @ params["out_proj.weight"].T + params["out_proj.bias"]

dO = split_right(dY @ params["out_proj.weight"])  # (H, T_q, Dh)
dV = (P.transpose(0, 2, 1) @ dO).sum(axis=0)  # (T_k, Dh): the shared head collects from both query heads
dP = dO @ V.T
dS = P * (dP - (dP * P).sum(axis=-1, keepdims=True))
dQ = merge_right(c * dS @ K)  # (T_q, D)
dK = (c * dS.transpose(0, 2, 1) @ Q).sum(axis=0)  # (T_k, Dh): summed over the query heads
by_hand = {
    "dquery": dQ @ params["q_proj.weight"],
    "dkey": dK @ params["k_proj.weight"],
    "dvalue": dV @ params["v_proj.weight"],
    "k_proj.weight": dK.T @ xkv,
    "v_proj.weight": dV.T @ xkv,
}

out, cache = multi_head_attention_forward(params, xq[None], xkv[None], xkv[None], H, n_kv_heads=1)
dquery, dkey, dvalue, grads = multi_head_attention_backward(dY[None], cache)
library = {"dquery": dquery[0], "dkey": dkey[0], "dvalue": dvalue[0]} | grads
assert np.abs(out[0] - Y).max() <= 1e-12
for name, mine in by_hand.items():
    print(f"{name:14} max |by hand - library| = {np.abs(mine - library[name]).max():.1e}")
    assert np.abs(mine - library[name]).max() <= 1e-12
print("Exercise 3 checked")
