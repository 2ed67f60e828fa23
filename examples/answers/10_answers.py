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
# # Answers to the exercises of walkthrough 10 (a modern LLM in plain arrays)
#
# Try the exercises first: they are at the end of `examples/10_modern_llm.py`. Every answer below is checked against
# `transformers`' own class on the same scores.

# %%
import numpy as np
import torch
from transformers import (
    LlamaConfig,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
)
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

np.set_printoptions(precision=4, suppress=True)
rng = np.random.default_rng(0)
z = rng.standard_normal((3, 50)) * 2  # scores of 3 rows over 50 tokens


def softmax(v):
    e = np.exp(v - v.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def theirs(warpers, scores: np.ndarray, ids=None) -> np.ndarray:
    """transformers' processors applied in order to the same scores, then a softmax."""
    s = torch.from_numpy(scores)
    ids = None if ids is None else torch.from_numpy(ids)
    for warper in warpers:
        s = warper(ids, s)
    return torch.softmax(s, dim=-1).numpy()


# %% [markdown]
# ### Exercise 1: top-k and min-p
#
# Both keep a set of tokens and renormalise over it. Top-k: the $k$ largest probabilities (as transformers, every
# token tied with the $k$-th largest is kept). Min-p: the tokens with $p_i \ge \text{min\_p} \cdot \max_j p_j$,
# probabilities taken after the temperature.


# %%
def top_k_distribution(z, temperature, k):
    p = softmax(z / temperature)
    kth = np.sort(p, axis=-1)[:, -k][:, None]  # the k-th largest of each row
    kept = np.where(p >= kth, p, 0.0)
    return kept / kept.sum(axis=-1, keepdims=True)


def min_p_distribution(z, temperature, min_p):
    p = softmax(z / temperature)
    kept = np.where(p >= min_p * p.max(axis=-1, keepdims=True), p, 0.0)
    return kept / kept.sum(axis=-1, keepdims=True)


err_k = np.abs(top_k_distribution(z, 0.7, 5) - theirs([TemperatureLogitsWarper(0.7), TopKLogitsWarper(5)], z)).max()
err_min_p = np.abs(
    min_p_distribution(z, 0.7, 0.1) - theirs([TemperatureLogitsWarper(0.7), MinPLogitsWarper(0.1)], z)
).max()
print(f"exercise 1 checked: top-k vs TopKLogitsWarper {err_k:.1e}; min-p vs MinPLogitsWarper {err_min_p:.1e}")
print("tokens kept per row, top-k 5:", (top_k_distribution(z, 0.7, 5) > 0).sum(axis=1),
      "min-p 0.1:", (min_p_distribution(z, 0.7, 0.1) > 0).sum(axis=1))  # fmt: skip
assert err_k < 1e-12 and err_min_p < 1e-12

# %% [markdown]
# ### Exercise 2: repetition penalty
#
# For each row, the tokens it holds (a token counted once, however often it occurs): a positive logit divided by the
# penalty, a negative one multiplied by it. Every other logit is unchanged.


# %%
def repetition_penalty(scores, tokens, penalty):
    out = scores.copy()
    rows = np.arange(scores.shape[0])[:, None]  # (N, 1), against tokens (N, T)
    seen = scores[rows, tokens]
    out[rows, tokens] = np.where(seen > 0, seen / penalty, seen * penalty)
    return out


tokens = rng.integers(0, 50, (3, 12))
mine = repetition_penalty(z, tokens, 1.1)
expected = RepetitionPenaltyLogitsProcessor(1.1)(torch.from_numpy(tokens), torch.from_numpy(z.copy())).numpy()
err_rep = np.abs(mine - expected).max()
print(f"exercise 2 checked: repetition penalty vs RepetitionPenaltyLogitsProcessor {err_rep:.1e}")
assert err_rep < 1e-12 and np.abs(mine - z).max() > 0.01  # equal to theirs, and it changed something

# %% [markdown]
# ### Exercise 3: dynamic NTK scaling
#
# Raising the base slows every pair except pair 0 (whose $\theta_0 = b^0 = 1$ never changes), and the slow pairs
# most: $\theta'_i / \theta_i = (b'/b)^{-2i/d_h}$ falls with $i$. Llama 3's table instead keeps the fast pairs exact and
# divides the slow ones by the same factor; dynamic scaling changes nothing until the input is longer than $L$.

# %%
Dh, base, L, s = 16, 10000.0, 64, 4.0
config = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=Dh, max_position_embeddings=L,
                     rope_parameters={"rope_type": "dynamic", "rope_theta": base, "factor": s})  # fmt: skip
theta = base ** (-np.arange(0, Dh, 2) / Dh)
for T in (L, 2 * L, 8 * L):
    new_base = base * (s * max(T, L) / L - (s - 1)) ** (Dh / (Dh - 2))
    scaled = new_base ** (-np.arange(0, Dh, 2) / Dh)
    their_theta = ROPE_INIT_FUNCTIONS["dynamic"](config, "cpu", seq_len=T)[0].double().numpy()
    err = np.abs(scaled / their_theta - 1).max()  # relative: theirs is float32
    print(f"T = {T:4d}: theta'/theta = {scaled / theta}, relative difference from transformers {err:.1e}")
    assert err < 1e-6
print("exercise 3 checked: dynamic NTK frequencies vs ROPE_INIT_FUNCTIONS['dynamic'] at three lengths")
