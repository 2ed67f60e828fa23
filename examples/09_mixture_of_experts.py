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
# # 9. Mixture of experts by hand: the router, top-k, and the gradient through the chosen gates
#
# *Prerequisites:* walkthroughs 01 (the softmax backward) and 06 (the gated feed-forward block). *Time:* 40
# minutes. The symbols are those of [the notation table](../docs/notation.md); local names: $E$ experts, $k$ of
# them per token, $W_r$ the router's weight $(E, D)$, $z$ the router logits, $p$ the router probabilities, $S$
# the selected experts, $g$ the gates, $W_{gu}[e]$ and $W_d[e]$ expert $e$'s fused gate/up weight $(2F, D)$ and
# down weight $(D, F)$, $a$ and $u$ the gate and up halves of $x W_{gu}[e]^\top$.
#
# Mixtral and Qwen3-MoE keep Llama's layer and replace its feed-forward block by $E$ of them, the *experts*.
# Each token runs through only $k$ of them (Mixtral: 2 of 8), chosen for that token by a *router*:
#
# $$\begin{gathered}
# z = x W_r^\top, \qquad p = \mathrm{softmax}(z), \qquad S = \mathrm{topk}(p, k), \\
# g_j = \frac{p_{S_j}}{\sum_{i<k} p_{S_i}}, \qquad y = \sum_{j<k} g_j\, \mathrm{FFN}_{S_j}(x).\end{gathered}$$
#
# The model holds $E$ times the feed-forward weights but spends the arithmetic of $k$. Three things are new
# for the backward pass: the gates, which the router's logits reach through a softmax and a renormalisation;
# the top-k choice, which is a step function (no gradient, and a trap for finite differences); and the
# load-balancing loss, which keeps the router from sending everything to one expert. This walkthrough computes
# each on numbers small enough to print and checks them four ways: by hand, against the library
# (`numpy_transformer.moe`), against PyTorch's autograd (`torch.topk`, `F.softmax`; and
# `torch_transformer.SparseMoeBlock`) and against `transformers`' own `MixtralSparseMoeBlock` and
# `load_balancing_loss_func`; and the library's backward against central finite differences.

# %%
import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("numpy_transformer") is None or importlib.util.find_spec("examples") is None:
    # not pip-installed, or run from elsewhere: import from the checkout (examples/ is a folder of scripts there)
    sys.path.insert(0, str((Path(__file__).parent if "__file__" in globals() else Path.cwd()).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from transformers.models.mixtral import modeling_mixtral  # noqa: E402

import torch_transformer as tt  # noqa: E402
from numpy_transformer import moe  # noqa: E402
from numpy_transformer.gradcheck import check_pair, gradcheck  # noqa: E402

np.set_printoptions(precision=4, suppress=True, linewidth=110)
rng = np.random.default_rng(0)
checks = {}  # what -> (max |by hand - library|, max |by hand - torch|, max |by hand - transformers|, fd error)


def max_diff(a, b) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


def silu(v):
    return v / (1.0 + np.exp(-v))


# %% [markdown]
# ## 1. The router: softmax, then top-k, then renormalise
#
# Six tokens ($N = 6$) of width $D = 4$, four experts ($E = 4$), two per token ($k = 2$), each expert $F = 3$
# wide. The router is one linear layer without bias, $W_r$ of shape $(E, D)$: one logit per expert.

# %%
N, D, E, k, F_E = 6, 4, 4, 2, 3
x = np.round(rng.standard_normal((N, D)), 1)  # (N, D)
W_r = np.round(rng.standard_normal((E, D)), 1)  # (E, D), transformers' `gate.weight`
W_gu = np.round(0.5 * rng.standard_normal((E, 2 * F_E, D)), 2)  # (E, 2F, D), `experts.gate_up_proj`
W_d = np.round(0.5 * rng.standard_normal((E, D, F_E)), 2)  # (E, D, F), `experts.down_proj`

z = x @ W_r.T  # (N, E)
p = np.exp(z - z.max(axis=1, keepdims=True))
p /= p.sum(axis=1, keepdims=True)  # (N, E), softmax over the experts
S = np.argsort(-p, axis=1, kind="stable")[:, :k]  # (N, k): the k largest, largest first
p_S = np.take_along_axis(p, S, axis=1)  # (N, k)
g = p_S / p_S.sum(axis=1, keepdims=True)  # (N, k): renormalised over the chosen
print("router probabilities p =\n", p)
print("chosen experts S =\n", S)
print("gates g =\n", g)

# %% [markdown]
# Mixtral's router does exactly these three lines (`softmax`, `torch.topk`, divide by the sum); Qwen3-MoE does
# the same when its config says `norm_topk_prob`, and keeps $g_j = p_{S_j}$ otherwise. Written the other way
# round, top-k of the *logits* then a softmax over the $k$ chosen logits (Mistral's reference code), it is the
# same function: the softmax's denominator cancels in the ratio,
#
# $$g_j = \frac{e^{z_{S_j}} / \sum_e e^{z_e}}{\sum_{i<k} e^{z_{S_i}} / \sum_e e^{z_e}}
# = \frac{e^{z_{S_j}}}{\sum_{i<k} e^{z_{S_i}}} = \mathrm{softmax}(z_S)_j,$$
#
# a fact the backward pass will use. The library's pair and PyTorch:

# %%
(g_lib, S_lib), gates_cache = moe.top_k_gates_forward(z, k, norm_topk_prob=True)
z_t = torch.tensor(z, requires_grad=True)
top_t, S_t = torch.topk(F.softmax(z_t, dim=-1), k, dim=-1)
g_t = top_t / top_t.sum(-1, keepdim=True)
g_softmax_of_chosen = F.softmax(torch.tensor(np.take_along_axis(z, S, axis=1)), dim=-1).numpy()
print(f"max |by hand - library| = {max_diff(g, g_lib):.1e},  max |by hand - torch| = {max_diff(g, g_t.detach()):.1e}")
print(f"max |g - softmax of the chosen logits| = {max_diff(g, g_softmax_of_chosen):.1e}")
assert np.array_equal(S, S_lib) and np.array_equal(S, S_t.numpy())
assert max_diff(g, g_lib) <= 1e-15 and max_diff(g, g_t.detach()) <= 1e-15 and max_diff(g, g_softmax_of_chosen) <= 1e-15

# %% [markdown]
# ## 2. Dispatch and combine
#
# Each expert is Llama's gated block, with its gate and up projections stored as one fused weight, as
# `transformers` 5 stores them: the first $F$ rows of $W_{gu}[e]$ make the gate pre-activation $a$, the last
# $F$ the up projection $u$,
#
# $$[\,a \,|\, u\,] = x\, W_{gu}[e]^\top, \qquad \mathrm{FFN}_e(x) = \big(\mathrm{silu}(a) \odot u\big)\, W_d[e]^\top.$$
#
# Expert $e$ runs once, on the rows that chose it (*dispatch*); its outputs, each scaled by its gate, are added
# back into those rows (*combine*). A row chooses an expert at most once, so within one expert no row repeats.

# %%
y = np.zeros_like(x)  # (N, D)
expert_out = {}  # e -> (rows, slots, FFN_e(x[rows]))
for e in range(E):
    rows, slots = np.nonzero(S == e)  # the rows routed to e, and which of their k choices e is
    a_u = x[rows] @ W_gu[e].T  # (n_e, 2F)
    out_e = (silu(a_u[:, :F_E]) * a_u[:, F_E:]) @ W_d[e].T  # (n_e, D)
    y[rows] += g[rows, slots, None] * out_e
    expert_out[e] = (rows, slots, out_e)
    print(f"expert {e}: rows {rows.tolist()}")
print("y =\n", y)

# %% [markdown]
# Expert 0 is nobody's choice here: it does not run, and (section 4) it gets no gradient at all, its router row
# included. Only the load-balancing loss of section 6 reaches it.
#
# The library's block takes the weights under `transformers`' own names, so a Mixtral layer's
# `mlp.*` tensors load as they are. The same block in `torch_transformer` (a loop over experts with
# `torch.where` and `index_add`) and `transformers`' `MixtralSparseMoeBlock` itself:

# %%
params = {"gate.weight": W_r, "experts.gate_up_proj": W_gu, "experts.down_proj": W_d}
y_lib, moe_cache = moe.sparse_moe_forward(params, x, k)
block_t = tt.SparseMoeBlock(D, F_E, E, k).double()
block_t.load_state_dict({name: torch.tensor(v) for name, v in params.items()})
x_t = torch.tensor(x, requires_grad=True)
y_t, z_block_t = block_t(x_t)

config = transformers.MixtralConfig(
    hidden_size=D, intermediate_size=F_E, num_local_experts=E, num_experts_per_tok=k, experts_implementation="eager"
)
block_hf = modeling_mixtral.MixtralSparseMoeBlock(config).double()
block_hf.load_state_dict({name: torch.tensor(v) for name, v in params.items()})
x_hf = torch.tensor(x[None], requires_grad=True)  # (B, T, D) = (1, 6, 4)
y_hf = block_hf(x_hf)[0]
print(f"max |by hand - library| = {max_diff(y, y_lib):.1e}")
print(f"max |by hand - torch_transformer| = {max_diff(y, y_t.detach()):.1e}")
print(f"max |by hand - transformers' MixtralSparseMoeBlock| = {max_diff(y, y_hf.detach()):.1e}")
assert max_diff(y, y_lib) <= 1e-15 and max_diff(y, y_t.detach()) <= 1e-14
assert 1e-12 < max_diff(y, y_hf.detach()) <= 1e-6  # close, but not float64-close: see below

# %% [markdown]
# ### A float32 island
#
# `transformers` agrees to about $10^{-8}$, not $10^{-15}$, though everything is float64. Its router computes
# the softmax as `softmax(router_logits.float())`: in float32, whatever the model's dtype (so that a bfloat16
# model routes by float32 probabilities). Replacing that one line by a float64 softmax, the rest of its code
# unchanged, the difference is rounding alone:


# %%
def mixtral_router_float64(self, hidden_states):
    """MixtralTopKRouter.forward's computation, with the softmax in the logits' dtype instead of float32."""
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_logits = F.linear(hidden_states, self.weight)
    router_top_value, router_indices = torch.topk(F.softmax(router_logits, dim=-1), self.top_k, dim=-1)
    router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
    return router_logits, router_top_value, router_indices


saved_router = modeling_mixtral.MixtralTopKRouter.forward
modeling_mixtral.MixtralTopKRouter.forward = mixtral_router_float64
try:
    x_hf = torch.tensor(x[None], requires_grad=True)
    y_hf = block_hf(x_hf)[0]
finally:
    modeling_mixtral.MixtralTopKRouter.forward = saved_router
print(f"max |by hand - MixtralSparseMoeBlock, float64 router| = {max_diff(y, y_hf.detach()):.1e}")
assert max_diff(y, y_hf.detach()) <= 1e-14
checks["forward"] = (max_diff(y, y_lib), max_diff(y, y_t.detach()), max_diff(y, y_hf.detach()), None)

# %% [markdown]
# ## 3. Backward through the combine
#
# With a random upstream gradient $dy$ (never all ones: walkthrough 01, step 8), the last line first. Row $n$ is
# $y_n = \sum_j g_{nj}\, \mathrm{FFN}_{S_{nj}}(x_n)$: a gate multiplies its expert's output, so
#
# $$dg_{nj} = dy_n \cdot \mathrm{FFN}_{S_{nj}}(x_n), \qquad d\,\mathrm{FFN}_{S_{nj}}(x_n) = g_{nj}\, dy_n.$$
#
# Each expert's backward is then walkthrough 06's gated block, its two halves side by side in the fused
# weight (with $\tilde u = \mathrm{silu}(a) \odot u$ and $d\mathrm{out}$ the expert's output gradient):
# $d\tilde u = d\mathrm{out}\, W_d$, $dW_d = d\mathrm{out}^\top \tilde u$, $du = d\tilde u \odot \mathrm{silu}(a)$,
# $da = d\tilde u \odot u \odot \mathrm{silu}'(a)$, $dW_{gu} = [\,da \,|\, du\,]^\top x$,
# $dx = [\,da \,|\, du\,]\, W_{gu}$. A token feeds $k$ experts: its gradients from them add. An expert no token
# chose gets zero gradient.

# %%
dy = np.round(rng.standard_normal((N, D)), 1)  # (N, D)
dx = np.zeros_like(x)
dW_gu, dW_d, dg = np.zeros_like(W_gu), np.zeros_like(W_d), np.zeros_like(g)
for e, (rows, slots, out_e) in expert_out.items():
    # y[rows] += g[rows, slots] * out_e
    dg[rows, slots] = (dy[rows] * out_e).sum(axis=1)
    dout_e = g[rows, slots, None] * dy[rows]  # (n_e, D)
    a_u = x[rows] @ W_gu[e].T
    a, u = a_u[:, :F_E], a_u[:, F_E:]
    sig = 1.0 / (1.0 + np.exp(-a))
    # out_e = (silu(a) * u) @ W_d[e].T
    dW_d[e] = dout_e.T @ (silu(a) * u)  # (D, F)
    dh = dout_e @ W_d[e]  # (n_e, F)
    du, da = dh * silu(a), dh * u * sig * (1.0 + a * (1.0 - sig))
    # a_u = x[rows] @ W_gu[e].T
    dW_gu[e] = np.concatenate([da, du], axis=1).T @ x[rows]  # (2F, D)
    dx[rows] += np.concatenate([da, du], axis=1) @ W_gu[e]  # x fans out to k experts: the gradients add
print("dg =\n", dg)

# %% [markdown]
# ## 4. Backward through the gates: only the chosen logits
#
# The top-k choice $S$ is a step function of $z$: moving a logit a little does not change which experts run,
# so the choice has no gradient, and $z$ reaches the output only through the gates. Renormalised, the gates are a
# softmax over the $k$ chosen logits (section 1), so their backward is walkthrough 01's softmax backward on
# those $k$ entries, and every other logit gets exactly zero:
#
# $$dz_{S_j} = g_j \Big(dg_j - \sum_{i<k} dg_i\, g_i\Big), \qquad dz_e = 0 \quad (e \notin S).$$
#
# (Through the long road, $dp$ from the renormalisation and then the full softmax backward, the same zeros come
# out of a cancellation: $\mathrm{rowsum}(dp \odot p)$ is exactly 0 in exact arithmetic.) Then the router is a
# linear layer: $dW_r = dz^\top x$, and $x$, which fed both the router and the experts, adds $dz\, W_r$.

# %%
dz = np.zeros_like(z)
np.put_along_axis(dz, S, g * (dg - (dg * g).sum(axis=1, keepdims=True)), axis=1)
dW_r = dz.T @ x  # (E, D)
dx_total = dx + dz @ W_r  # two paths from x: experts and router
print("dz =\n", dz)
assert np.count_nonzero(dz) == N * k  # only the chosen logits

dx_lib, grads_lib = moe.sparse_moe_backward(dy, moe_cache)
by_hand = {"x": dx_total, "gate.weight": dW_r, "experts.gate_up_proj": dW_gu, "experts.down_proj": dW_d}
library = {"x": dx_lib} | grads_lib

y_t.backward(torch.tensor(dy))
autograd = {"x": x_t.grad} | {name: p_.grad for name, p_ in block_t.named_parameters()}
modeling_mixtral.MixtralTopKRouter.forward = mixtral_router_float64
try:
    block_hf.zero_grad()
    x_hf = torch.tensor(x[None], requires_grad=True)
    block_hf(x_hf)[0].backward(torch.tensor(dy))
finally:
    modeling_mixtral.MixtralTopKRouter.forward = saved_router
hf_grads = {"x": x_hf.grad[0]} | {name: p_.grad for name, p_ in block_hf.named_parameters()}
fd = check_pair(moe.sparse_moe_forward, moe.sparse_moe_backward,
                dict(params={n: v.copy() for n, v in params.items()}, x=x.copy(), top_k=k), ["x", "params"],
                max_coords=None)  # fmt: skip
lib_err = max(max_diff(by_hand[n], library[n]) for n in by_hand)
torch_err = max(max_diff(by_hand[n], autograd[n]) for n in by_hand)
hf_err = max(max_diff(by_hand[n], hf_grads[n]) for n in by_hand)
print(fd)
print(f"max |by hand - library| = {lib_err:.1e},  max |by hand - torch autograd| = {torch_err:.1e},  "
      f"max |by hand - transformers| = {hf_err:.1e}")  # fmt: skip
assert lib_err <= 1e-14 and torch_err <= 1e-13 and hf_err <= 1e-13 and fd.worst <= 1e-6
checks["block backward"] = (lib_err, torch_err, hf_err, fd.worst)

# %% [markdown]
# Without renormalisation (Qwen3-MoE with `norm_topk_prob=False`), $g_j = p_{S_j}$ keeps the softmax's
# denominator, which every logit is in: the unchosen logits get a gradient too,
# $dz = p \odot (dp - \mathrm{rowsum}(dp \odot p))$ with $dp$ equal to $dg$ on the chosen columns and 0 elsewhere.
# Exercise 1 derives it.

# %%
(g_raw, _), raw_cache = moe.top_k_gates_forward(z, k, norm_topk_prob=False)
dz_raw = moe.top_k_gates_backward(dg, raw_cache)
print("raw gates, dz =\n", dz_raw)
assert np.count_nonzero(dz_raw) == N * E

# %% [markdown]
# ## 5. Finite differences and the step in top-k
#
# The check above perturbs every coordinate by $\tau = 10^{-5}$. That is only meaningful away from a *tie*: if a
# token's $k$-th and $(k+1)$-th probabilities were within about $\tau$ of each other, the perturbation could swap
# the two experts, and the finite difference would measure a jump, not a slope. So before trusting a
# finite-difference check of a router, look at the smallest margin:

# %%
p_sorted = np.sort(p, axis=1)[:, ::-1]
margin = p_sorted[:, k - 1] - p_sorted[:, k]  # (N,)
print("margin between the k-th and (k+1)-th probability, per token:", margin)
assert margin.min() > 1e-3

# %% [markdown]
# And at a tie, what the jump looks like: move one token's logit for its best unchosen expert up through the
# $k$-th one. The output does not move smoothly; it jumps when the choice flips, by roughly the difference
# between the two experts' outputs times the gate.

# %%
n = int(np.argmin(margin))
loser = np.argsort(-p[n], kind="stable")[k]  # the best expert not chosen for token n
gap = np.sort(z[n])[::-1][k - 1] - z[n, loser]  # how far its logit is below the k-th
y_n = {}
for shift in (gap - 1e-3, gap + 1e-3):
    z_shift = z.copy()
    z_shift[n, loser] += shift
    (g_s, S_s), _ = moe.top_k_gates_forward(z_shift, k)
    y_n[shift], _ = moe.experts_forward(x[n : n + 1], S_s[n : n + 1], g_s[n : n + 1], W_gu, W_d)
    print(f"logit + {shift:.4f}: token {n} runs experts {sorted(S_s[n].tolist())}, y_n = {y_n[shift][0]}")
jump = max_diff(*y_n.values())
print(f"a change of 2e-3 in one logit moves y_n by up to {jump:.3f}: a step, not a slope")
assert jump > 1e-2

# %% [markdown]
# Torch's `topk` does not say which of two *exactly* equal values it returns first (on the CPU the order
# depends on $E$ and $k$). The library takes the lower index first, and every forward that selects takes
# `selected=` to replay another implementation's choice; whichever expert is chosen, each gate's gradient goes
# to that expert alone, whole, as `torch.topk`'s own backward sends it.
#
# ## 6. The load-balancing loss
#
# Nothing in the gradient above pushes the router to use every expert; left alone, it tends to send most tokens
# to a few. Switch Transformer's auxiliary loss penalises the imbalance; `transformers` adds it to the loss of
# Mixtral and Qwen3-MoE when the router logits are asked for (`output_router_logits`), scaled by
# `router_aux_loss_coef`. With $f_e$ the fraction of the $N k$ choices that went to
# expert $e$ (times $k$, so $\sum_e f_e = k$) and $P_e$ the mean probability the router gave it,
#
# $$f_e = \frac1N \sum_n [e \in S_n], \qquad P_e = \frac1N \sum_n p_{ne}, \qquad
# \mathcal{L}_{\text{aux}} = E \sum_e f_e P_e.$$
#
# Uniform routing ($f_e = k/E$, $P_e = 1/E$) gives $\mathcal{L}_{\text{aux}} = k$. The counts $f$ are step
# functions like the choice itself: the gradient flows through $P$ only, each token's probabilities pushed
# down in proportion to how busy each expert already is,
#
# $$dp_{ne} = \frac{E\, f_e}{N}, \qquad dz_n = p_n \odot \big(dp_n - \mathrm{rowsum}(dp_n \odot p_n)\big).$$
#
# (`transformers`' `load_balancing_loss_func` pools $f$ and $P$ over all layers and over the tokens of its
# attention mask before multiplying; with one layer and no padding it is the formula above.)

# %%
f = np.zeros(E)
np.add.at(f, S, 1.0 / N)
P = p.mean(axis=0)
aux = E * (f * P).sum()
dp = np.broadcast_to(E * f / N, (N, E))
dz_aux = p * (dp - (dp * p).sum(axis=1, keepdims=True))
print("f =", f, " P =", P, f" aux loss = {aux:.6f}")

aux_lib, aux_cache = moe.load_balancing_loss_forward([z], E, k)
(dz_aux_lib,) = moe.load_balancing_loss_backward(aux_cache)
z_t = torch.tensor(z, requires_grad=True)
aux_t = tt.load_balancing_loss([z_t], E, k)
aux_t.backward()
z_hf = torch.tensor(z, requires_grad=True)
aux_hf = modeling_mixtral.load_balancing_loss_func((z_hf,), E, k)
aux_hf.backward()
aux_fd = gradcheck(lambda: float(moe.load_balancing_loss_forward([z], E, k)[0]), {"z": z}, {"z": dz_aux_lib})
lib_err = max(abs(aux - aux_lib), max_diff(dz_aux, dz_aux_lib))
torch_err = max(abs(aux - aux_t.item()), max_diff(dz_aux, z_t.grad))
hf_err = max(abs(aux - aux_hf.item()), max_diff(dz_aux, z_hf.grad))
print(f"max |by hand - library| = {lib_err:.1e},  max |by hand - torch| = {torch_err:.1e},  "
      f"max |by hand - load_balancing_loss_func| = {hf_err:.1e} (it sums in float32)")  # fmt: skip
print(f"finite differences: worst error {aux_fd.worst:.1e}")
assert lib_err <= 1e-15 and torch_err <= 1e-15 and hf_err <= 1e-6 and aux_fd.worst <= 1e-6
checks["load-balancing loss"] = (lib_err, torch_err, hf_err, aux_fd.worst)

# %% [markdown]
# In training, the block's backward receives this gradient too: the router logits fed both the gates and the
# loss, so their two gradients add (`sparse_moe_backward(dy, cache, drouter_logits=...)`). Expert 0's router row,
# which the gates left at zero, now gets a gradient: $dz_{n0} = -p_{n0}\, \mathrm{rowsum}(dp_n \odot p_n) < 0$ on
# every token (its $f_0 = 0$), so gradient descent raises its logits, toward the idle expert.

# %%
coef = 0.02  # transformers' default router_aux_loss_coef is 0.001: larger here, so the change shows
dx_both, grads_both = moe.sparse_moe_backward(dy, moe_cache, drouter_logits=coef * dz_aux_lib)
print("dW_r without and with the auxiliary loss:\n", grads_lib["gate.weight"], "\n", grads_both["gate.weight"])
assert max_diff(grads_both["gate.weight"], grads_lib["gate.weight"] + coef * dz_aux_lib.T @ x) <= 1e-15
assert not np.any(grads_lib["gate.weight"][0]) and np.any(grads_both["gate.weight"][0])
assert (dz_aux[:, 0] < 0).all()  # every token: raise the idle expert's logit

# %% [markdown]
# ## 7. The block in a whole model: a tiny Mixtral
#
# A `TransformerConfig` with `n_experts > 0` makes every decoder layer's feed-forward block this one
# (`dense_layers` keeps some dense, as Qwen3-MoE's `mlp_only_layers`; `d_expert` sets the experts' width). The
# model keeps each layer's router logits (`model.router_logits()`, as `transformers`' `output_router_logits`);
# `model.load_balancing_loss()` pools them over the layers, and `backward(dlogits, daux_loss=c)` sends the
# gradient of $\mathcal{L} + c\,\mathcal{L}_{\text{aux}}$ into every router, beside the gates'. The torch twin
# gets the same from autograd, and `hf.save` writes a checkpoint that `MixtralForCausalLM` loads.

# %%
import tempfile  # noqa: E402

import numpy_transformer as nt  # noqa: E402
from numpy_transformer import hf  # noqa: E402

config = nt.TransformerConfig(
    src_vocab_size=30, tgt_vocab_size=30, d_model=16, n_heads=4, d_ff=24, n_encoder_layers=0, n_decoder_layers=2,
    norm_first=True, norm="rms", positional="rope", gated_ffn=True, activation="silu", bias=False, output_bias=False,
    pad_id=None, scale_embeddings=False, n_experts=4, top_k=2, router_aux_loss_coef=0.02,
)  # fmt: skip
model = nt.TransformerLM(config, seed=0)
ids = rng.integers(3, 30, size=(2, 6))
logits = model.forward(ids)
aux_model = model.load_balancing_loss()
dlogits = rng.standard_normal(logits.shape)
model.backward(dlogits, daux_loss=config.router_aux_loss_coef)

twin = tt.TransformerLM(config).double()
twin.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
logits_t = twin(torch.from_numpy(ids))
aux_t = twin.load_balancing_loss()
((logits_t * torch.from_numpy(dlogits)).sum() + config.router_aux_loss_coef * aux_t).backward()
model_err = max(max_diff(p.grad, model.grads[name]) for name, p in twin.named_parameters())
print(f"aux loss {float(aux_model):.6f} (uniform routing: {k})")
print(f"max |NumPy - torch| over every gradient of L + c L_aux: {model_err:.1e}")
assert model_err <= 1e-12 and abs(float(aux_model) - aux_t.item()) <= 1e-15

with tempfile.TemporaryDirectory() as directory:
    hf.save(model, directory)
    transformers.utils.logging.disable_progress_bar()
    mixtral = transformers.MixtralForCausalLM.from_pretrained(
        directory, dtype=torch.float64, experts_implementation="eager"
    )
    hf_logits = mixtral(torch.from_numpy(ids)).logits.detach()
hf_err = max_diff(hf_logits, logits)
print(f"max |NumPy - MixtralForCausalLM| logits: {hf_err:.1e} (its router softmax and RMSNorm run in float32)")
assert hf_err <= 1e-5
checks["a whole MoE model"] = (None, model_err, hf_err, None)

# %% [markdown]
# ## Summary
#
# | forward | backward |
# |---|---|
# | $z = x W_r^\top$ | $dW_r = dz^\top x$, $dx \mathrel{+}= dz\, W_r$ |
# | $S = \mathrm{topk}(\mathrm{softmax}(z), k)$ | none: a step function (keep finite differences away from ties) |
# | $g = \mathrm{softmax}(z_S)$ (renormalised) | $dz_S = g \odot (dg - \mathrm{rowsum}(dg \odot g))$; others 0 |
# | $g = p_S$ (raw) | $dp_S = dg$, $dz = p \odot (dp - \mathrm{rowsum}(dp \odot p))$: every logit |
# | $y_n = \sum_j g_{nj}\, o_{nj}$ ($o$: expert outputs) | $dg_{nj} = dy_n \cdot o_{nj}$, $do_{nj} = g_{nj}\, dy_n$ |
# | $\mathcal{L}_{\text{aux}} = E \sum_e f_e P_e$ | $dp_{ne} = E f_e / N$, then the softmax backward |
#
# The checks, collected (`-` where there is no such witness):

# %%
print(f"{'derivation':22} {'vs library':>11} {'vs torch':>10} {'vs transformers':>16} {'finite diff.':>13}")
for name, errors in checks.items():
    print(
        f"{name:22} "
        + " ".join(f"{'-' if e is None else f'{e:.1e}':>{w}}" for e, w in zip(errors, (11, 10, 16, 13), strict=True))
    )

# %% [markdown]
# ## Exercises
#
# Answers, worked and checked, are in `examples/answers/09_answers.py`. Check yours with
# `numpy_transformer.gradcheck.check_pair`.
#
# 1. **Raw gates.** With $g_j = p_{S_j}$ (Qwen3-MoE's `norm_topk_prob=False`), show that
#    $dz_e = p_e\,(dg_e [e \in S] - \sum_j dg_j\, p_{S_j})$: an unchosen expert's logit gets
#    $-p_e \sum_j dg_j\, p_{S_j}$. Write the pair and check it against `top_k_gates_backward` and finite
#    differences.
# 2. **The router z-loss.** ST-MoE adds $\mathcal{L}_z = \frac1N \sum_n \big(\log \sum_e e^{z_{ne}}\big)^2$ to
#    keep the logits small. Derive $dz_n = \frac{2}{N} \mathrm{lse}(z_n)\, \mathrm{softmax}(z_n)$ and check it
#    against autograd and finite differences.
# 3. **Top-k first.** Mistral's reference code for Mixtral took the top $k$ *logits* and a softmax over them. Write that
#    router (forward and backward) and show that its gates and its $dz$ equal `top_k_gates_forward` /
#    `top_k_gates_backward` with renormalisation, to rounding.
