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
# # 11. DeepSeek by hand: latent attention, the cache that shrinks, and the bias that chooses but does not weigh
#
# *Prerequisites:* walkthroughs 01b (multi-head attention's backward), 06 (RoPE, RMSNorm) and 09 (a router's top-k).
# *Time:* 40 minutes. The symbols are those of [the notation table](../docs/notation.md); local names: $C$ the latent
# width (`kv_lora_rank`), $R$ the rotary part of a head (`qk_rope_head_dim`), $D_n$ the rest of a query/key head
# (`qk_nope_head_dim`), $D_v$ a value head, $R_q$ the queries' rank (`q_lora_rank`), $\hat c$ the normalised latent,
# $k^{pe}$ the rotary key, $c_s$ the softmax scale, $s$ the router's scores, $b$ its bias.
#
# DeepSeek-V2 and V3 (and R1, V3's fine-tune) keep Llama's decoder and change two things. **Multi-head latent
# attention (MLA)** computes every head's keys and values from one small vector per token, the *latent*:
#
# $$\begin{gathered}
# [\,c \mid k^{pe}\,] = x W_{kva}^\top, \qquad \hat c = \mathrm{RMS}(c), \qquad
# [\,K_h \mid V_h\,] = \hat c\, W_{kvb}[h]^\top, \\
# S_h = c_s \big(Q^{nope}_h K_h^\top + \mathrm{rope}(Q^{pe}_h)\, \mathrm{rope}(k^{pe})^\top\big), \qquad
# O_h = \mathrm{softmax}(S_h)\, V_h .\end{gathered}$$
#
# Decoding then caches $\hat c$ and the turned $k^{pe}$, $C + R = 576$ numbers per token and layer in V3, where 128
# heads of ordinary keys and values would be 40 960. The **mixture of experts** scores experts by a sigmoid, adds a
# bias to the scores *to choose* (never to weigh), limits the choice to the best groups of experts, and runs shared
# experts on every token. This walkthrough computes both on numbers small enough to print, and checks them against
# the library (`numpy_transformer.latent_attention`, `numpy_transformer.deepseek_moe`), PyTorch's autograd,
# `transformers`' own `DeepseekV3Attention` and `DeepseekV3TopkRouter`, and finite differences. A short coda does
# the same for two other changes of 2024-25 models to the softmax: Gemma 2's soft cap and GPT-OSS's sink.

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
import transformers  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3  # noqa: E402

from numpy_transformer import deepseek_moe, latent_attention  # noqa: E402
from numpy_transformer.attention import rope_angles  # noqa: E402
from numpy_transformer.gradcheck import check_pair  # noqa: E402
from numpy_transformer.scores import ScoreMod  # noqa: E402

QUICK = os.environ.get("WALKTHROUGH_QUICK") == "1"  # the tests' mode: the same numbers (everything here is small)
np.set_printoptions(precision=4, suppress=True, linewidth=110)
rng = np.random.default_rng(0)
checks = {}  # what -> (max |by hand - library|, max |by hand - torch|, max |by hand - transformers|, fd error)


def max_diff(a, b) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


# %% [markdown]
# ## 1. Latent attention, forward, in a dozen lines
#
# Five tokens of width $D = 8$, $H = 2$ heads; each query/key head is $D_n + R = 3 + 2$ wide, each value head
# $D_v = 3$; the latent has $C = 4$ features and the queries go through a rank $R_q = 5$ bottleneck (V3's
# `q_a_proj`, `q_a_layernorm`, `q_b_proj`).

# %%
B, T, D, H, C, R, DN, DV, RQ = 1, 5, 8, 2, 4, 2, 3, 3, 5
x = rng.standard_normal((B, T, D))
W = {
    "q_a_proj.weight": 0.5 * rng.standard_normal((RQ, D)),
    "q_a_norm.weight": 1 + 0.1 * rng.standard_normal(RQ),
    "q_b_proj.weight": 0.5 * rng.standard_normal((H * (DN + R), RQ)),
    "kv_a_proj.weight": 0.5 * rng.standard_normal((C + R, D)),
    "kv_a_norm.weight": 1 + 0.1 * rng.standard_normal(C),
    "kv_b_proj.weight": 0.5 * rng.standard_normal((H * (DN + DV), C)),
    "out_proj.weight": 0.5 * rng.standard_normal((D, H * DV)),
}
cos, sin = rope_angles(np.arange(T), R, 10000.0)  # (T, R/2): one angle per pair of rotary features
scale = (DN + R) ** -0.5  # c_s (V3 multiplies it by YaRN's mscale squared: 1 here)


def rms(v, w, eps=1e-6):
    return v / np.sqrt((v**2).mean(-1, keepdims=True) + eps) * w


def rope_pairs(v):  # turn the pairs (v_0, v_1), (v_2, v_3), ... by their angles (DeepSeek's interleaved layout)
    out = np.empty_like(v)
    out[..., 0::2] = v[..., 0::2] * cos - v[..., 1::2] * sin
    out[..., 1::2] = v[..., 1::2] * cos + v[..., 0::2] * sin
    return out


def heads(v):  # (B, T, H*d) -> (B, H, T, d)
    return v.reshape(B, v.shape[1], H, -1).transpose(0, 2, 1, 3)


q = heads(rms(x @ W["q_a_proj.weight"].T, W["q_a_norm.weight"]) @ W["q_b_proj.weight"].T)  # (B, H, T, DN + R)
q_nope, q_pe = q[..., :DN], rope_pairs(q[..., DN:])
ckv = x @ W["kv_a_proj.weight"].T  # (B, T, C + R): the latent and the rotary key, one per token
latent = rms(ckv[..., :C], W["kv_a_norm.weight"])  # (B, T, C): what the cache keeps ...
k_pe = rope_pairs(ckv[..., C:])  # (B, T, R): ... and this, shared by every head
kv = heads(latent @ W["kv_b_proj.weight"].T)  # (B, H, T, DN + DV): every head's keys and values, expanded
k_nope, v = kv[..., :DN], kv[..., DN:]
scores = scale * (q_nope @ k_nope.swapaxes(-1, -2) + q_pe @ k_pe[:, None].swapaxes(-1, -2))  # (B, H, T, T)
scores = np.where(np.tril(np.ones((T, T), dtype=bool)), scores, -np.inf)  # causal
probs = np.exp(scores - scores.max(-1, keepdims=True))
probs /= probs.sum(-1, keepdims=True)
y = (probs @ v).transpose(0, 2, 1, 3).reshape(B, T, H * DV) @ W["out_proj.weight"].T  # (B, T, D)

y_lib, lib_cache = latent_attention.latent_attention_forward(
    W, x, H, (cos, sin), mod=ScoreMod(scale=scale, causal=True)
)
print("y[0, :2] =\n", y[0, :2])
print(f"by hand vs the library: {max_diff(y, y_lib):.1e}")

# %% [markdown]
# Against `transformers`' own `DeepseekV3Attention` (its names: `q_a_layernorm`, `kv_a_proj_with_mqa`,
# `kv_a_layernorm`, `o_proj`; its rotary tables are `cat(freqs, freqs)`, of which it reads the first half, as we
# do). It writes the turned pairs de-interleaved, evens then odds; the scores, dot products of two vectors laid out
# alike, are the same.

# %%
config = transformers.DeepseekV3Config(
    hidden_size=D, num_attention_heads=H, num_key_value_heads=H, q_lora_rank=RQ, kv_lora_rank=C,
    qk_nope_head_dim=DN, qk_rope_head_dim=R, v_head_dim=DV, attention_bias=False, rms_norm_eps=1e-6,
)  # fmt: skip
config._attn_implementation = "sdpa"  # computes in the inputs' dtype (the eager one takes its softmax in float32)


def rms_norm_in_input_dtype(self, hidden):  # transformers' RMSNorm computes in float32: here in float64, as ours
    return self.weight * (hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


modeling_deepseek_v3.DeepseekV3RMSNorm.forward = rms_norm_in_input_dtype  # (this script only: a float64 run)
theirs = modeling_deepseek_v3.DeepseekV3Attention(config, layer_idx=0).double().eval()
names = {
    "q_a_norm": "q_a_layernorm",
    "kv_a_proj": "kv_a_proj_with_mqa",
    "kv_a_norm": "kv_a_layernorm",
    "out_proj": "o_proj",
}
with torch.no_grad():
    for name, value in W.items():
        module, param = name.rsplit(".", 1)
        getattr(getattr(theirs, names.get(module, module)), param).copy_(torch.from_numpy(value))
    tables = tuple(torch.from_numpy(np.concatenate([t, t], -1))[None] for t in (cos, sin))  # (1, T, R)
    causal = torch.full((T, T), -torch.inf).triu(1)[None, None]  # additive mask (1, 1, T, T)
    y_hf = theirs(torch.from_numpy(x), position_embeddings=tables, attention_mask=causal)[0].numpy()
print(f"by hand vs transformers' DeepseekV3Attention: {max_diff(y, y_hf):.1e}")

# %% [markdown]
# ## 2. Why the cache shrinks, and why RoPE is kept apart
#
# Keys and values are a fixed linear function of $\hat c$, so decoding need only keep $\hat c$ (and the rotary
# key): each step expands the cached latents again. Below, one token at a time through a `LatentCache`, which
# holds $(B, P, C)$ latents and $(B, P, R)$ rotary keys, gives the whole forward's output.

# %%
cache = latent_attention.LatentCache(B, T, C, R, np.float64)
steps = [
    latent_attention.latent_attention_forward(
        W, x[:, t : t + 1], H, (cos[t : t + 1], sin[t : t + 1]), mod=ScoreMod(scale=scale, causal=True),
        q_pos=np.array([t]), kv_cache=cache,
    )[0]
    for t in range(T)
]  # fmt: skip
print(f"token by token through the latent cache vs the whole forward: {max_diff(np.concatenate(steps, 1), y):.1e}")
print("the cache holds", cache.latents.shape, "latents and", cache.rope_keys.shape, "rotary keys")


def cache_per_token(layers, kv_heads, key_width, value_width, latent=None, rope=None):
    """Numbers cached per token over the layers: K/V heads' keys and values, or MLA's latent and rotary key."""
    per_layer = latent + rope if latent is not None else kv_heads * (key_width + value_width)
    return layers * per_layer


v3 = dict(layers=61, key_width=192, value_width=128)  # DeepSeek-V3: 128 heads, C = 512, R = 64
for kind, n in (
    ("MHA, 128 K/V heads", cache_per_token(kv_heads=128, **v3)),
    ("GQA, 8 K/V heads", cache_per_token(kv_heads=8, **v3)),
    ("MQA, 1 K/V head", cache_per_token(kv_heads=1, **v3)),
    ("MLA, latent 512 + rope 64", cache_per_token(kv_heads=None, latent=512, rope=64, **v3)),
):
    print(f"{kind:28s} {n:>9,} numbers a token, {2 * n / 2**10:8.1f} KiB in bfloat16")

# %% [markdown]
# Why not turn the latent itself by RoPE? Without rotation the key part of a score is
# $q^{nope} \cdot (W_{kb} \hat c) = (W_{kb}^\top q^{nope}) \cdot \hat c$: a query can be multiplied into $W_{kb}$
# once and scored against the cached latents directly, never expanding a key (the "absorbed" form of inference
# engines). A rotation by the key's own position would sit between $W_{kb}$ and $\hat c$ and stop that; so the
# position goes into a separate $R$-wide part, one rotary key for all heads. The absorbed scores equal the expanded:

# %%
W_kb = W["kv_b_proj.weight"].reshape(H, DN + DV, C)[:, :DN]  # (H, DN, C): each head's key rows of kv_b_proj
absorbed = np.einsum("bhtn,hnc,bsc->bhts", q_nope, W_kb, latent)  # (q W_kb) . c: no key expanded
expanded = q_nope @ k_nope.swapaxes(-1, -2)
print(f"absorbed vs expanded no-position scores: {max_diff(absorbed, expanded):.1e}")
checks["forward"] = (max_diff(y, y_lib), None, max_diff(y, y_hf), None)
checks["the latent cache"] = (max_diff(np.concatenate(steps, 1), y), None, None, None)

# %% [markdown]
# ## 3. The backward, through the low-rank projections
#
# Walkthrough 01b's attention backward gives $dQ$, $dK$, $dV$ per head. Then three things are new. The latent fed
# every head's keys and values through one product, so its gradient is *one* product too,
# $d\hat c = [\,dK^{nope} \mid dV\,]\, W_{kvb}$ (the heads merged back into columns). The rotary key was read by
# every head, so its gradient is the sum over heads, turned back: $dk^{pe} = \mathrm{rope}^\top(\sum_h dK^{pe}_h)$.
# And $x$ fed both the queries and the latent, so $dx$ adds the two paths.

# %%
dy = rng.standard_normal(y.shape)
dctx = heads(dy @ W["out_proj.weight"])  # (B, H, T, DV)
dW_o = dy.reshape(-1, D).T @ (probs @ v).transpose(0, 2, 1, 3).reshape(-1, H * DV)
dv = probs.swapaxes(-1, -2) @ dctx
dprobs = dctx @ v.swapaxes(-1, -2)
dscores = probs * (dprobs - (dprobs * probs).sum(-1, keepdims=True)) * scale  # softmax backward, times c_s
dq_nope, dk_nope = dscores @ k_nope, dscores.swapaxes(-1, -2) @ q_nope
dq_pe = dscores @ np.broadcast_to(k_pe[:, None], (B, H, T, R))
dk_pe_turned = (dscores.swapaxes(-1, -2) @ q_pe).sum(axis=1)  # (B, T, R): summed over the heads


def rope_pairs_back(g):  # the transpose of the rotation: turn back by the same angle
    out = np.empty_like(g)
    out[..., 0::2] = g[..., 0::2] * cos + g[..., 1::2] * sin
    out[..., 1::2] = g[..., 1::2] * cos - g[..., 0::2] * sin
    return out


def rms_back(g, v, w, eps=1e-6):  # RMSNorm's backward (walkthrough 06): dv = r (g w - v_hat mean(g w v_hat))
    r = 1 / np.sqrt((v**2).mean(-1, keepdims=True) + eps)
    gw = g * w
    return r * (gw - (v * r) * (gw * v * r).mean(-1, keepdims=True)), (g * v * r).reshape(-1, v.shape[-1]).sum(0)


dkv = np.concatenate([dk_nope, dv], -1).transpose(0, 2, 1, 3).reshape(B, T, -1)  # (B, T, H (DN + DV))
dW_kvb = dkv.reshape(-1, dkv.shape[-1]).T @ latent.reshape(-1, C)
dlatent = dkv @ W["kv_b_proj.weight"]  # one product for every head's keys and values
dc, dW_kvnorm = rms_back(dlatent, ckv[..., :C], W["kv_a_norm.weight"])
dckv = np.concatenate([dc, rope_pairs_back(dk_pe_turned)], -1)  # (B, T, C + R)
dW_kva = dckv.reshape(-1, C + R).T @ x.reshape(-1, D)
dq = np.concatenate([dq_nope, rope_pairs_back(dq_pe)], -1).transpose(0, 2, 1, 3).reshape(B, T, -1)
qa = x @ W["q_a_proj.weight"].T
dW_qb = dq.reshape(-1, dq.shape[-1]).T @ rms(qa, W["q_a_norm.weight"]).reshape(-1, RQ)
dqa, dW_qnorm = rms_back(dq @ W["q_b_proj.weight"], qa, W["q_a_norm.weight"])
dW_qa = dqa.reshape(-1, RQ).T @ x.reshape(-1, D)
dx = dckv @ W["kv_a_proj.weight"] + dqa @ W["q_a_proj.weight"]  # x fed the latent and the queries: add
by_hand = {
    "x": dx, "out_proj.weight": dW_o, "kv_b_proj.weight": dW_kvb, "kv_a_norm.weight": dW_kvnorm,
    "kv_a_proj.weight": dW_kva, "q_b_proj.weight": dW_qb, "q_a_norm.weight": dW_qnorm, "q_a_proj.weight": dW_qa,
}  # fmt: skip

dx_lib, grads_lib = latent_attention.latent_attention_backward(dy, lib_cache)
lib_err = max(max_diff(dx, dx_lib), *(max_diff(by_hand[k], grads_lib[k]) for k in W))

x_t = torch.from_numpy(x).requires_grad_()
W_t = {k: torch.from_numpy(w).requires_grad_() for k, w in W.items()}
theirs.zero_grad()
with torch.no_grad():
    for name, value in W_t.items():
        module, param = name.rsplit(".", 1)
        getattr(getattr(theirs, names.get(module, module)), param).copy_(value)
x_hf = torch.from_numpy(x).requires_grad_()
(theirs(x_hf, position_embeddings=tables, attention_mask=causal)[0] * torch.from_numpy(dy)).sum().backward()
hf_grads = {k: getattr(theirs, names.get(k.rsplit(".", 1)[0], k.rsplit(".", 1)[0])).weight.grad for k in W}
hf_err = max(max_diff(dx, x_hf.grad), *(max_diff(by_hand[k], hf_grads[k]) for k in W))
fd = check_pair(
    lambda params, x: latent_attention.latent_attention_forward(
        params, x, H, (cos, sin), mod=ScoreMod(scale=scale, causal=True)
    ),
    latent_attention.latent_attention_backward, {"params": W, "x": x}, wrt=["x", "params"],
)  # fmt: skip
print(f"backward by hand vs the library {lib_err:.1e}, vs transformers' autograd {hf_err:.1e}; "
      f"the library vs finite differences {fd.worst:.1e}")  # fmt: skip
checks["backward"] = (lib_err, None, hf_err, fd.worst)

# %% [markdown]
# ## 4. The router: a sigmoid, a bias that chooses, groups, and shared experts
#
# Eight experts in $G = 4$ groups of two; each token keeps the best 2 groups (a group's score: the sum of its two
# best biased scores) and takes its $k = 3$ experts among them. The bias $b$ (`e_score_correction_bias`, which
# DeepSeek nudges during training to balance the load, with no gradient) enters only the choice; the weights are the
# *unbiased* scores of the chosen experts, renormalised and times $\rho = 2.5$.

# %%
N, E, K, G, KG, RHO = 4, 8, 3, 4, 2, 2.5
z = rng.standard_normal((N, E))  # router logits
b = 0.1 * rng.standard_normal(E)
s = 1 / (1 + np.exp(-z))  # sigmoid scores: each expert on its own, no softmax across them
choice = s + b  # ... the bias chooses
group_score = np.sort(choice.reshape(N, G, E // G), -1)[..., -2:].sum(-1)  # (N, G)
kept = np.argsort(-group_score, -1, kind="stable")[:, :KG]
allowed = np.zeros((N, G), dtype=bool)
np.put_along_axis(allowed, kept, True, -1)
selected = np.argsort(-np.where(np.repeat(allowed, E // G, -1), choice, -np.inf), -1, kind="stable")[:, :K]
chosen = np.take_along_axis(s, selected, -1)  # ... the scores weigh
weights = RHO * chosen / (chosen.sum(-1, keepdims=True) + 1e-20)
(w_lib, sel_lib), router_cache = deepseek_moe.router_forward(
    z, K, scoring="sigmoid", score_bias=b, n_groups=G, topk_groups=KG, norm_topk_prob=True, scaling=RHO
)
print("selected experts per token:\n", selected, "\nweights:\n", weights)
without_bias = deepseek_moe.group_limited_top_k(s, K, G, KG)
print("tokens whose choice the bias changed:", np.flatnonzero((np.sort(without_bias) != np.sort(selected)).any(-1)))

router_config = transformers.DeepseekV3Config(
    hidden_size=E, n_routed_experts=E, num_experts_per_tok=K, n_group=G, topk_group=KG, routed_scaling_factor=RHO
)
hf_router = modeling_deepseek_v3.DeepseekV3TopkRouter(router_config)
with torch.no_grad():  # the router's linear layer as the identity: its logits are our z (it computes in float32)
    hf_router.weight.copy_(torch.eye(E))
    hf_router.e_score_correction_bias.copy_(torch.from_numpy(b))
    _, hf_weights, hf_selected = hf_router(torch.from_numpy(z))
order = np.argsort(hf_selected.numpy(), -1)  # transformers' topk(sorted=False): compare as sets
same_choice = np.array_equal(np.sort(hf_selected.numpy(), -1), np.sort(selected, -1))
hf_router_err = max_diff(np.take_along_axis(hf_weights.numpy(), order, -1),
                         np.take_along_axis(weights, np.argsort(selected, -1), -1))  # fmt: skip
print(f"transformers chooses the same experts: {same_choice}; weights within {hf_router_err:.1e} (float32)")
assert same_choice and hf_router_err < 1e-6

# %% [markdown]
# **The gradient goes through the chosen weights, not through the choice.** The choice is a step function of $s + b$:
# it does not move for a small change of $z$ or $b$ (away from ties), so $b$ gets exactly zero, and of the scores
# only the chosen ones get a gradient. With $\hat w_j = s_{S_j} / d$, $d = \sum_i s_{S_i} + \epsilon$:
#
# $$ds_{S_j} = \frac{\rho\, dw_j - \sum_i \rho\, dw_i\, \hat w_i}{d}, \qquad dz = ds \odot s \odot (1 - s).$$
#
# The sigmoid keeps the experts apart: an unchosen expert's logit gets nothing (under a softmax, walkthrough 09,
# every logit of the row gets a share).

# %%
dw = rng.standard_normal((N, K))
normed = chosen / (chosen.sum(-1, keepdims=True) + 1e-20)
ds_chosen = (RHO * dw - (RHO * dw * normed).sum(-1, keepdims=True)) / (chosen.sum(-1, keepdims=True) + 1e-20)
ds = np.zeros_like(s)
np.put_along_axis(ds, selected, ds_chosen, -1)
dz = ds * s * (1 - s)
dz_lib = deepseek_moe.router_backward(dw, router_cache)
z_t, b_t = torch.from_numpy(z).requires_grad_(), torch.from_numpy(b).requires_grad_()
s_t = torch.sigmoid(z_t)
grouped = (s_t + b_t).view(N, G, E // G)  # the choice in torch, from s + b ...
best_groups = grouped.topk(2, dim=-1).values.sum(-1).topk(KG, dim=-1).indices
keep = torch.zeros(N, G, dtype=torch.bool).scatter(1, best_groups, True)
sel_t = grouped.masked_fill(~keep[..., None], -torch.inf).flatten(1).topk(K, dim=-1).indices  # ... an index
assert np.array_equal(sel_t.numpy(), selected)
w_t = s_t.gather(-1, sel_t)  # ... and the weights read s alone
w_t = RHO * w_t / (w_t.sum(-1, keepdim=True) + 1e-20)
(w_t * torch.from_numpy(dw)).sum().backward()
print("dz (zero where not chosen):\n", dz)
print(f"the bias's gradient in autograd: {b_t.grad} (no path from b to the weights: topk's indices carry none)")


def router_weights(z):  # the router's weights as a forward/backward pair's forward: (weights, cache)
    (w, _), cache = deepseek_moe.router_forward(z, K, score_bias=b, n_groups=G, topk_groups=KG, scaling=RHO)
    return w, cache


router_fd = check_pair(router_weights, deepseek_moe.router_backward, {"z": z.copy()}, wrt=["z"])
checks["router"] = (max(max_diff(weights, w_lib), max_diff(dz, dz_lib)), max_diff(dz, z_t.grad), hf_router_err,
                    router_fd.worst)  # fmt: skip

# %% [markdown]
# ## 5. Coda: two more changes to the softmax (Gemma 2's soft cap, GPT-OSS's sink)
#
# **Soft cap.** Gemma 2 squashes every score, $S' = \kappa \tanh(S/\kappa)$, before the mask and the softmax; the
# backward multiplies by the tanh's derivative, read from the capped scores alone: $dS = dS' \odot (1 - (S'/\kappa)^2)$.
# **Sink.** GPT-OSS gives each head a learned logit $\sigma_h$ that sits in the softmax's denominator and nowhere else,
# $p_j = e^{S_j} / (e^{\sigma} + \sum_i e^{S_i})$: a head can attend to "nothing" (its probabilities sum to less
# than one). Its gradient: with $p_\varnothing = e^{\sigma} / (e^{\sigma} + \sum_i e^{S_i})$, the sink is one more
# column of the softmax whose output is thrown away, so $dS = p \odot (dp - \sum_i dp_i p_i)$ and
# $d\sigma = -p_\varnothing \sum_i dp_i\, p_i$.

# %%
S = 3 * rng.standard_normal((2, 6))  # two heads' scores of one query over six keys
kappa, sink = 2.0, np.array([0.5, -1.0])
capped = kappa * np.tanh(S / kappa)
scaled = np.concatenate([sink[:, None], capped], -1)  # the sink as column 0
p_all = np.exp(scaled - scaled.max(-1, keepdims=True))
p_all /= p_all.sum(-1, keepdims=True)
p, p_sink = p_all[:, 1:], p_all[:, 0]
dp = rng.standard_normal(p.shape)
inner = (dp * p).sum(-1, keepdims=True)
dS = p * (dp - inner) * (1 - (capped / kappa) ** 2)  # through the softmax, then the cap
dsink = -p_sink * inner[:, 0]
S_t, sink_t = torch.from_numpy(S).requires_grad_(), torch.from_numpy(sink).requires_grad_()
logits_t = torch.cat([sink_t[:, None], kappa * torch.tanh(S_t / kappa)], -1)
(torch.softmax(logits_t, -1)[:, 1:] * torch.from_numpy(dp)).sum().backward()
coda_err = max(max_diff(dS, S_t.grad), max_diff(dsink, sink_t.grad))
print(f"row sums with the sink: {p.sum(-1)}; cap and sink backward vs autograd: {coda_err:.1e}")
checks["soft cap and sink"] = (None, coda_err, None, None)

# %% [markdown]
# ## 6. The checks

# %%
print(f"{'':20s} {'library':>9s} {'torch':>9s} {'transformers':>13s} {'finite diff':>12s}")
for what, errors in checks.items():
    cells = [f"{'':>{w}s}" if e is None else f"{e:{w}.1e}" for e, w in zip(errors, (9, 9, 13, 12), strict=True)]
    print(f"{what:20s} " + " ".join(cells))
for what, (lib, torch_err, hf_err, fd_err) in checks.items():
    for value, bar in ((lib, 1e-12), (torch_err, 1e-12), (fd_err, 1e-6)):
        assert value is None or value < bar, (what, value)
    assert hf_err is None or hf_err < (1e-6 if what == "router" else 1e-12), (what, hf_err)
assert b_t.grad is None  # the bias chose; it weighed nothing

# %% [markdown]
# The whole DeepSeek-V3 and V2-Lite models (these pieces in Llama's decoder, the first layer dense) are families of
# the library (`transformer_spec/families/deepseek_v3.py`, `deepseek_v2.py`): `numpy_transformer.hf.load` reads their
# checkpoints, and the tests compare them with `transformers` in float64, every gradient included, and decode as
# `generate()` does with the latent cache ([the checkpoints page](../docs/howto/hf_checkpoint.md)).
#
# ## Exercises
#
# Answers, worked and checked, are in `examples/answers/11_answers.py`.
#
# 1. **The absorbed values.** Section 2 absorbed $W_{kb}$ into the queries. Do the same for the values: show that
#    $O_h W_o[h]^\top = (P_h \hat c)\, (W_o[h] W_{vb}[h])^\top$, so a decoder can keep $P_h \hat c$ ($C$ wide) and
#    never expand a value, and check it against `latent_attention_forward`.
# 2. **A bias that only chooses.** With finite differences, show that the router's weights do not move when $b$
#    moves a little (the gradient is zero), and find a change of one expert's bias that moves a token's choice (a
#    jump: the function is piecewise constant in $b$).
# 3. **V2-Lite's cache.** Using `cache_per_token`, show that DeepSeek-V2-Lite (27 layers, 16 heads, keys 192 and
#    values 128 wide, C = 512, R = 64) caches 8.9 times fewer numbers per token than the same heads as ordinary
#    multi-head attention, and check the count against a `LatentCache` after a decoded prompt.
