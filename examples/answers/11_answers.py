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
# # Answers to the exercises of walkthrough 11 (DeepSeek's latent attention and routing)
#
# Try the exercises first: they are at the end of `examples/11_latent_attention.py`. Every answer below is checked
# against the library (`numpy_transformer.latent_attention`, `numpy_transformer.deepseek_moe`).

# %%
import importlib.util
import sys
from pathlib import Path

import numpy as np

if importlib.util.find_spec("numpy_transformer") is None:  # not pip-installed: import from the checkout
    sys.path.insert(0, str((Path(__file__).parent if "__file__" in globals() else Path.cwd()).resolve().parents[1]))

from numpy_transformer import deepseek_moe, latent_attention  # noqa: E402
from numpy_transformer.attention import rope_angles  # noqa: E402
from numpy_transformer.scores import ScoreMod  # noqa: E402

np.set_printoptions(precision=4, suppress=True)
rng = np.random.default_rng(0)
B, T, D, H, C, R, DN, DV = 1, 5, 8, 2, 4, 2, 3, 3
W = {
    "q_proj.weight": 0.5 * rng.standard_normal((H * (DN + R), D)),
    "kv_a_proj.weight": 0.5 * rng.standard_normal((C + R, D)),
    "kv_a_norm.weight": 1 + 0.1 * rng.standard_normal(C),
    "kv_b_proj.weight": 0.5 * rng.standard_normal((H * (DN + DV), C)),
    "out_proj.weight": 0.5 * rng.standard_normal((D, H * DV)),
}
x = rng.standard_normal((B, T, D))
cos, sin = rope_angles(np.arange(T), R, 10000.0)
mod = ScoreMod(scale=(DN + R) ** -0.5, causal=True)

# %% [markdown]
# ### Exercise 1: the absorbed values
#
# $V_h = \hat c\, W_{vb}[h]^\top$, so $O_h = P_h V_h = (P_h \hat c)\, W_{vb}[h]^\top$ and head h's share of the output
# is $O_h W_o[h]^\top = (P_h \hat c)\, W_{vb}[h]^\top W_o[h]^\top = (P_h \hat c)\, (W_o[h] W_{vb}[h])^\top$: the
# probabilities average the $C$-wide latents, and one $(D, C)$ matrix per head, made once, maps them to the output.

# %%
y, cache = latent_attention.latent_attention_forward(W, x, H, (cos, sin), mod=mod)
ckv = x @ W["kv_a_proj.weight"].T
c = ckv[..., :C]
latent = c / np.sqrt((c**2).mean(-1, keepdims=True) + 1e-6) * W["kv_a_norm.weight"]  # (B, T, C)
W_vb = W["kv_b_proj.weight"].reshape(H, DN + DV, C)[:, DN:]  # (H, DV, C)
W_o = W["out_proj.weight"].reshape(D, H, DV).transpose(1, 0, 2)  # (H, D, DV): each head's columns
probs = cache.attn.probs  # (B, H, T, T)
y_absorbed = sum((probs[:, h] @ latent) @ (W_o[h] @ W_vb[h]).T for h in range(H))  # (B, T, D)
err = np.abs(y_absorbed - y).max()
assert err < 1e-13
print(f"absorbed values vs latent_attention_forward: {err:.1e}: checked")

# %% [markdown]
# ### Exercise 2: a bias that only chooses
#
# The weights read the scores of the chosen experts; the bias moves only the choice, which is constant until two
# biased scores cross. So the central difference in $b$ is exactly zero, and a large enough change of one expert's
# bias makes a token choose it: the weights jump.

# %%
N, E, K, G, KG = 4, 8, 3, 4, 2
z = rng.standard_normal((N, E))
b = 0.1 * rng.standard_normal(E)


def weights(bias):
    (w, selected), _ = deepseek_moe.router_forward(z, K, score_bias=bias, n_groups=G, topk_groups=KG, scaling=2.5)
    return w, selected


eps = 1e-5
for j in range(E):
    step = np.zeros(E)
    step[j] = eps
    fd = (weights(b + step)[0] - weights(b - step)[0]) / (2 * eps)
    assert not fd.any()
print("d weights / d b by central differences: 0 for every expert: checked")
w0, sel0 = weights(b)
unchosen = next(e for e in range(E) if e not in sel0[0])
jump = b.copy()
jump[unchosen] += 2.0  # past every sigmoid score's range (0, 1): expert `unchosen` now wins its group and the top k
w1, sel1 = weights(jump)
assert unchosen in sel1[0] and not np.allclose(w0[0], w1[0])
print(f"token 0 chooses {sel0[0]} -> {sel1[0]} when expert {unchosen}'s bias grows by 2: checked")

# %% [markdown]
# ### Exercise 3: V2-Lite's cache
#
# Per layer: 16 heads of keys (192) and values (128) are 5 120 numbers; the latent and the rotary key 576. Over 27
# layers, 138 240 against 15 552: 8.9 times fewer. A `LatentCache` holds exactly C + R numbers per token.


# %%
def cache_per_token(layers, kv_heads, key_width, value_width, latent=None, rope=None):
    per_layer = latent + rope if latent is not None else kv_heads * (key_width + value_width)
    return layers * per_layer


v2_lite = dict(layers=27, key_width=192, value_width=128)
mha = cache_per_token(kv_heads=16, **v2_lite)
mla = cache_per_token(kv_heads=None, latent=512, rope=64, **v2_lite)
assert (mha, mla) == (138_240, 15_552) and round(mha / mla, 1) == 8.9
big = {  # one V2-Lite-shaped latent attention layer (D shrunk to 32): C = 512, R = 64, 16 heads of 128 + 64
    "q_proj.weight": 0.02 * rng.standard_normal((16 * 192, 32)),
    "kv_a_proj.weight": 0.02 * rng.standard_normal((576, 32)),
    "kv_a_norm.weight": np.ones(512),
    "kv_b_proj.weight": 0.02 * rng.standard_normal((16 * 256, 512)),
    "out_proj.weight": 0.02 * rng.standard_normal((32, 16 * 128)),
}
prompt = rng.standard_normal((1, 6, 32))
kv_cache = latent_attention.LatentCache(1, 6, 512, 64, np.float64)
latent_attention.latent_attention_forward(big, prompt, 16, rope_angles(np.arange(6), 64, 10000.0), mod=mod,
                                          q_pos=np.arange(6), kv_cache=kv_cache)  # fmt: skip
held = kv_cache.latents[:, : kv_cache.length].size + kv_cache.rope_keys[:, : kv_cache.length].size
assert held == 6 * mla // 27
print(f"V2-Lite: {mha:,} vs {mla:,} numbers a token ({mha / mla:.1f}x); a LatentCache holds {held} for 6 tokens "
      "of one layer: checked")  # fmt: skip
