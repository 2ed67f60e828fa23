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
# # 10. A modern LLM in plain arrays: Llama 3.2's layer, scaled RoPE, the KV cache and sampling
#
# *Prerequisites:* walkthroughs 01, 01b and 06 (RoPE, RMSNorm, SwiGLU, grouped-query attention). *Time:* 40
# minutes. The symbols are those of [the notation table](../docs/notation.md); local names: $H$ query heads,
# $H_{kv}$ key/value heads, $d_h$ the head width, $\theta_i$ the rotary frequencies, $\tau$ the temperature, $p$
# the top-p mass.
#
# The models people download today (Llama 3.2, Qwen2.5, Mistral, Gemma) are decoder-only Transformers with the same
# few parts: RMSNorm before each sublayer, rotary position embeddings on the queries and keys, grouped-query
# attention (fewer key/value heads than query heads), a SwiGLU feed-forward block, and a tied output layer. Walkthrough
# 06 derived each part's backward. This one puts them together into the whole forward pass of a Llama-3.2-shaped
# model, **written out in about forty lines of NumPy**, and then does what a chat model does with it:
#
# 1. reads a real sentence through a byte-level BPE tokenizer;
# 2. computes Llama 3's *scaled* rotary frequencies by hand (how a model trained on 8k tokens reads 128k);
# 3. runs the forward pass and checks its logits against `transformers`' own `LlamaForCausalLM`;
# 4. looks at the attention maps over that sentence;
# 5. generates with a **KV cache** that grows by one position a step, checked against the library
#    (`numpy_transformer`) and `generate()`;
# 6. samples with temperature and top-p in a few lines, checked against `transformers`' logits warpers.
#
# Everything runs offline on a tiny random checkpoint built here (two layers, $D = 64$): the numbers are
# meaningless, the arithmetic is exactly that of the 1B model. The last section gives the two commands that run the
# real Llama-3.2-1B and Qwen2.5-0.5B-Instruct the same way when you are online.

# %%
import importlib.util
import json
import os
import sys
from pathlib import Path

if importlib.util.find_spec("numpy_transformer") is None or importlib.util.find_spec("examples") is None:
    # not pip-installed, or run from elsewhere: import from the checkout (examples/ is a folder of scripts there)
    sys.path.insert(0, str((Path(__file__).parent if "__file__" in globals() else Path.cwd()).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from transformers import TemperatureLogitsWarper, TopPLogitsWarper  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

import numpy_transformer as nt  # noqa: E402
from examples import plotting  # noqa: E402  (matplotlib with the file-only Agg backend)
from numpy_transformer import hf  # noqa: E402
from numpy_transformer.text import generate_text, load_tokenizer  # noqa: E402
from parity_tests.tiny_text import SENTENCES, tiny_lm  # noqa: E402

OUT = Path(os.environ.get("WALKTHROUGH_OUT", "runs/walkthrough_10"))
OUT.mkdir(parents=True, exist_ok=True)
np.set_printoptions(precision=4, suppress=True, linewidth=110)
checks = {}  # what -> largest difference from the reference it was checked against


def max_diff(a, b) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


# %% [markdown]
# ## 0. A tiny Llama 3.2, built offline
#
# Llama-3.2-1B's config.json says: 16 layers, $D = 2048$, 32 query heads and 8 key/value heads of width 64, a
# SwiGLU block of 8192, a vocabulary of 128256 tokens, tied embeddings, $\theta = 500000$ and
# `rope_scaling = {"rope_type": "llama3", "factor": 32, "low_freq_factor": 1, "high_freq_factor": 4,
# "original_max_position_embeddings": 8192}`. Ours keeps every option and shrinks the sizes: 2 layers, $D = 64$,
# $H = 4$ query heads and $H_{kv} = 2$ key/value heads of width $d_h = 16$, a block of 128, and the vocabulary of a
# byte-level BPE tokenizer trained here on eight sentences (384 ids; `parity_tests/tiny_text.py`). `transformers`
# builds it with random weights and writes it as a Hugging Face checkpoint folder, the same files the Hub serves.

# %%
ROPE = dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=8192)  # fmt: skip
folder = OUT / "tiny_llama32"  # a checkpoint folder, as the Hub serves one
theirs = tiny_lm(folder, "llama", seed=0, hidden_size=64, head_dim=16, intermediate_size=128, tie_word_embeddings=True,
                 max_position_embeddings=131072, rope_parameters=ROPE).double()  # fmt: skip
config = json.loads((folder / "config.json").read_text())
W = {name: array.astype(np.float64) for name, array in load_file(folder / "model.safetensors").items()}
H, H_kv = config["num_attention_heads"], config["num_key_value_heads"]  # 4 query heads, 2 key/value heads
Dh, eps = config["head_dim"], config["rms_norm_eps"]
print(sorted(os.listdir(folder)))
print({k: W[k].shape for k in list(W)[:10]})
print("lm_head.weight stored:", "lm_head.weight" in W, "(tied: the output layer is the embedding table)")

# %% [markdown]
# ## 1. Text to token ids
#
# The tokenizer is the checkpoint's `tokenizer.json`, read by the `tokenizers` package through
# `numpy_transformer.text.load_tokenizer` (which also reads the chat template from tokenizer_config.json). A
# byte-level BPE starts from the 256 bytes and merges frequent pairs, so common words are one token and rare ones
# several; the `Ġ` in a piece is the space before it.

# %%
tokenizer = load_tokenizer(folder)
sentence = SENTENCES[2]
ids = np.array(tokenizer.encode(sentence))
pieces = [tokenizer.backend.id_to_token(int(i)) for i in ids]
print(sentence)
print(ids)
print(pieces)
assert tokenizer.decode(ids) == sentence

# %% [markdown]
# ## 2. Rotary frequencies, and Llama 3's scaling by hand
#
# RoPE rotates feature pair $(i, i + d_h/2)$ of a query or key at position $t$ by the angle $t\,\theta_i$ with
# $\theta_i = \mathrm{base}^{-2i/d_h}$ (walkthrough 06). Pair $i$ turns once every $\lambda_i = 2\pi/\theta_i$
# positions, its *wavelength*. A model trained on sequences of $L = 8192$ tokens has seen every angle of the pairs
# whose wavelength is shorter than $L$, but only a part of a turn of the slow ones. Llama 3's scaling stretches the
# context 32 times by slowing down only those slow pairs, leaving the fast ones (local word order) untouched:
#
# $$\theta_i' = \begin{cases} \theta_i & \lambda_i < L / \mathrm{high} \quad\text{(fast: unchanged)}\\
# \theta_i / s & \lambda_i > L / \mathrm{low} \quad\text{(slow: divided by the factor } s = 32)\\
# (1 - m)\, \theta_i / s + m\, \theta_i & \text{otherwise (a smooth blend)} \end{cases}$$
#
# where the blend's weight $m$ grows from 0 to 1 across the band between the two thresholds:
#
# $$m = \frac{L/\lambda_i - \mathrm{low}}{\mathrm{high} - \mathrm{low}}$$
#
# Nothing else in the model changes: the rotation, its backward, the attention are those of plain RoPE, with
# $\theta'$ in place of $\theta$. (The other kinds `transformers` ships change other things: `linear` divides every
# $\theta_i$ by $s$; `dynamic` raises the base once the input is longer than $L$; `yarn` blends like Llama 3 and
# also multiplies the cos and sin by an attention factor; `longrope` multiplies each $\theta_i$ by its own learned
# factor, one list for short inputs and one for long ones.)


# %%
def llama3_frequencies(rope: dict, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(theta, theta'): the plain rotary frequencies (head_dim / 2,) and Llama 3's scaled ones."""
    theta = rope["rope_theta"] ** (-np.arange(0, head_dim, 2) / head_dim)
    wavelength = 2 * np.pi / theta
    L, low, high, s = (rope[k] for k in ("original_max_position_embeddings", "low_freq_factor", "high_freq_factor",
                                         "factor"))  # fmt: skip
    blend = (L / wavelength - low) / (high - low)
    scaled = np.where(wavelength < L / high, theta, np.where(wavelength > L / low, theta / s,
                                                             (1 - blend) * theta / s + blend * theta))  # fmt: skip
    return theta, scaled


theta, theta_scaled = llama3_frequencies(ROPE, Dh)
their_theta, attention_factor = ROPE_INIT_FUNCTIONS["llama3"](theirs.config, "cpu")
checks["Llama 3 frequencies vs transformers"] = max_diff(theta_scaled / theta, their_theta.double().numpy() / theta)
print(f"{'pair':>4} {'wavelength':>12} {'theta':>10} {'theta scaled':>13} {'ratio':>7}")
for i, (t, t2) in enumerate(zip(theta, theta_scaled, strict=True)):
    print(f"{i:4d} {2 * np.pi / t:12.1f} {t:10.3e} {t2:13.3e} {t2 / t:7.4f}")
print("attention factor:", attention_factor, "(1: Llama 3 scales no logits)")
assert checks["Llama 3 frequencies vs transformers"] < 1e-6  # transformers computes theta' in float32

# %% [markdown]
# Pairs 0 to 3 turn within 2048 positions and keep their speed; pair 4 is blended; pairs 5 to 7, whose wavelength
# exceeds 8192, turn 32 times slower. The rotation itself, with the cos and sin of $t\,\theta'_i$ for every
# position, feature $j$ and $j + d_h/2$ sharing angle $j$ (`rotate_half`, the layout of Hugging Face's
# checkpoints):


# %%
def rope_tables(theta: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    angles = np.outer(positions, theta)  # (T, Dh/2)
    angles = np.concatenate([angles, angles], axis=-1)  # (T, Dh): pair (i, i + Dh/2) shares angle i
    return np.cos(angles), np.sin(angles)


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x (heads, T, Dh) rotated pair by pair: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
    x1, x2 = x[..., : Dh // 2], x[..., Dh // 2 :]
    return x * cos + np.concatenate([-x2, x1], axis=-1) * sin


# %% [markdown]
# ## 3. The forward pass, by hand
#
# One layer, for the new positions of one sequence (the whole prompt the first time; one token a step later). The
# **KV cache** holds, per layer, the keys and values of every position seen so far: the layer computes them only for
# the new positions and appends them, since a causal layer's keys and values at position $t$ depend on positions
# $\le t$ only. **Grouped-query attention** stores $H_{kv} = 2$ key/value heads and lets each serve
# $H / H_{kv} = 2$ query heads: `np.repeat` along the head axis, a view of the same numbers (Llama-3.2-1B: 8 for 32,
# a cache four times smaller).


# %%
def rms_norm(x, weight):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * weight


def attention(x, layer: int, cos, sin, cache: dict):
    """x (T_new, D) -> (T_new, D) and the probabilities (H, T_new, T); cache[layer] = (K, V), each
    (H_kv, T, Dh), extended by the new positions' keys and values."""
    p = f"model.layers.{layer}.self_attn."
    T_new = x.shape[0]
    q = (x @ W[p + "q_proj.weight"].T).reshape(T_new, H, Dh).transpose(1, 0, 2)  # (H, T_new, Dh)
    k = (x @ W[p + "k_proj.weight"].T).reshape(T_new, H_kv, Dh).transpose(1, 0, 2)  # (H_kv, T_new, Dh)
    v = (x @ W[p + "v_proj.weight"].T).reshape(T_new, H_kv, Dh).transpose(1, 0, 2)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    K, V = cache.get(layer, (np.zeros((H_kv, 0, Dh)), np.zeros((H_kv, 0, Dh))))
    K, V = np.concatenate([K, k], axis=1), np.concatenate([V, v], axis=1)  # (H_kv, T, Dh): the cache grows
    cache[layer] = (K, V)
    K, V = np.repeat(K, H // H_kv, axis=0), np.repeat(V, H // H_kv, axis=0)  # (H, T, Dh): query head h reads h // 2
    scores = q @ K.transpose(0, 2, 1) / np.sqrt(Dh)  # (H, T_new, T)
    T = K.shape[1]
    future = np.arange(T)[None, :] > np.arange(T - T_new, T)[:, None]  # key after the query: hidden
    scores = np.where(future, -np.inf, scores)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    out = (probs @ V).transpose(1, 0, 2).reshape(T_new, H * Dh)  # (T_new, H Dh)
    return out @ W[p + "o_proj.weight"].T, probs


def swiglu(x, layer: int):
    p = f"model.layers.{layer}.mlp."
    gate, up = x @ W[p + "gate_proj.weight"].T, x @ W[p + "up_proj.weight"].T
    return (gate / (1 + np.exp(-gate)) * up) @ W[p + "down_proj.weight"].T  # silu(gate) * up, then down


def forward(new_ids, theta, cache: dict, maps: list | None = None):
    """The logits (T_new, V) of the new tokens at positions len(cache) ..., the cache extended."""
    start = cache[0][0].shape[1] if cache else 0
    cos, sin = rope_tables(theta, np.arange(start, start + len(new_ids)))
    x = W["model.embed_tokens.weight"][new_ids]  # (T_new, D)
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        a, probs = attention(rms_norm(x, W[p + "input_layernorm.weight"]), layer, cos, sin, cache)
        x = x + a
        x = x + swiglu(rms_norm(x, W[p + "post_attention_layernorm.weight"]), layer)
        if maps is not None:
            maps.append(probs)
    x = rms_norm(x, W["model.norm.weight"])
    return x @ W.get("lm_head.weight", W["model.embed_tokens.weight"]).T  # (T_new, V): the tied table


maps: list = []
logits = forward(ids, theta_scaled, {}, maps)
with torch.no_grad():
    their_logits = theirs(torch.from_numpy(ids)[None]).logits[0].numpy()
    their_float32 = theirs.float()(torch.from_numpy(ids)[None]).logits[0].double().numpy()
    theirs.double()
error = checks["logits vs LlamaForCausalLM (llama3 RoPE)"] = max_diff(logits, their_logits)
float32_effect = max_diff(their_float32, their_logits)
print("logits", logits.shape, "largest difference from transformers:", error)
print("transformers in float32 vs float64:", float32_effect)
assert error < float32_effect

# %% [markdown]
# Equal to float32 precision, not float64's: even in a float64 model, `transformers` computes the rotary angles, the
# RMSNorm statistics and the attention softmax in float32, on purpose (the 1B model runs in bfloat16, where those
# three would lose most). The bar above is the difference float32 itself makes to their model on this input; the
# library comparison below, where the arithmetic is float64 throughout on both sides, agrees to 1e-12.

# %% [markdown]
# ## 4. Attention maps over the sentence
#
# Row $t$ of a map is what position $t$ reads: a distribution over positions $\le t$ (the upper triangle is the
# causal mask, and the first row can only read itself). The weights are random, so the patterns are not language;
# they are sharp because the tiny model's weights are drawn large. Query heads 0 and 1 read the same key/value head
# (as do 2 and 3), yet their maps differ: grouped-query attention shares the keys, not the queries. On the real
# model the same cell draws heads that follow the previous token, heads that find the earlier copy of a repeated
# word (`·token` twice here), and heads that park their weight on the first token when nothing else is relevant
# (an "attention sink": a row must sum to one somewhere).

# %%
labels = [piece.replace("Ġ", "·") for piece in pieces]
for layer, probs in enumerate(maps):
    plotting.plot_attention(probs, labels, labels, OUT / f"attention_layer{layer}.png", f"layer {layer}: 4 query heads")
print("wrote", ", ".join(f"attention_layer{layer}.png" for layer in range(len(maps))))
print("mean weight on the first token, per head of layer 1:", maps[1][:, 1:, 0].mean(axis=1))

# %% [markdown]
# ## 5. Generation with the KV cache
#
# The first step runs the prompt (all its positions at once) and fills the cache; every later step runs one token.
# Each step's cost is one position through every layer, plus attention over the $T$ cached keys: the cache trades
# memory, $2 \cdot \text{layers} \cdot H_{kv} \cdot d_h$ numbers a token, for not recomputing the prefix. Watch it
# grow:

# %%
cache: dict = {}
step_logits = forward(ids, theta_scaled, cache)[-1]
generated = []
for step in range(6):
    token = int(step_logits.argmax())  # greedy: the most likely token
    generated.append(token)
    K, V = cache[0]
    print(f"step {step}: cache of layer 0 holds K {K.shape} and V {V.shape}; next token {token} "
          f"{tokenizer.backend.id_to_token(token)!r}")  # fmt: skip
    step_logits = forward(np.array([token]), theta_scaled, cache)[-1]

full = forward(np.concatenate([ids, generated]), theta_scaled, {})  # no cache: the whole sequence again
checks["cached step vs recomputed"] = max_diff(step_logits, full[-1])
with torch.no_grad():
    their_tokens = theirs.generate(torch.from_numpy(ids)[None], max_new_tokens=6, do_sample=False)[0, len(ids) :]
assert generated == their_tokens.tolist(), (generated, their_tokens)
print("the same 6 tokens as transformers' generate(); last logits, cached vs recomputed:",
      checks["cached step vs recomputed"])  # fmt: skip
assert checks["cached step vs recomputed"] < 1e-12

# %% [markdown]
# The same with the library, `numpy_transformer`: `hf.load` reads the folder, `rope_scaling` included, into a
# `TransformerLM` (its config's `rope_scaling` holds the llama3 rule, and the library computes $\theta'$ itself), and
# `nt.generate` runs the same loop with a preallocated cache (`numpy_transformer.attention.KVCache`).

# %%
ours = hf.load(folder, dtype=np.float64)
print(ours.config.rope_scaling)
checks["logits vs numpy_transformer"] = max_diff(forward(ids, theta_scaled, {}), ours.forward(ids[None])[0])
library_tokens = nt.generate(ours, ids[None], max_new_tokens=6, do_sample=False)[0, len(ids) :]
assert generated == library_tokens.tolist()
print("numpy_transformer: logits within", checks["logits vs numpy_transformer"], "; the same tokens", generated)
assert checks["logits vs numpy_transformer"] < 1e-10

# %% [markdown]
# ## 6. Sampling: temperature and top-p
#
# Chat checkpoints ship `do_sample: true` with a temperature and a top-p (Qwen2.5-0.5B-Instruct: $\tau = 0.7$,
# $p = 0.8$). From the logits $z$ of the next token:
#
# 1. divide by the temperature, $z / \tau$: below 1 the distribution sharpens, above 1 it flattens;
# 2. softmax, sort the probabilities in decreasing order, and keep the smallest set of tokens whose mass reaches $p$
#    (a token is kept when the mass *before* it is still below $p$; the most likely token always is);
# 3. renormalise over the kept tokens and draw one, from a seeded generator so that a run can be repeated.


# %%
def top_p_distribution(z: np.ndarray, temperature: float, top_p: float) -> np.ndarray:
    """The distribution sampling draws from: softmax(z / temperature) restricted to the top-p set, renormalised."""
    z = z / temperature
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    before = np.cumsum(probs[order]) - probs[order]  # mass of the more likely tokens
    kept = np.zeros_like(probs)
    kept[order[before < top_p]] = probs[order[before < top_p]]
    return kept / kept.sum()


temperature, top_p = 0.7, 0.8
z = forward(ids, theta_scaled, {})[-1]
q = top_p_distribution(z, temperature, top_p)
scores = torch.from_numpy(z)[None]
warped = TopPLogitsWarper(top_p)(None, TemperatureLogitsWarper(temperature)(None, scores))
checks["top-p distribution vs transformers' warpers"] = max_diff(q, torch.softmax(warped, dim=-1)[0].numpy())
print(f"tokens kept: {int((q > 0).sum())} of {len(q)}; the five most likely:",
      [(tokenizer.backend.id_to_token(int(i)), round(float(q[i]), 3)) for i in np.argsort(-q)[:5]])  # fmt: skip
assert checks["top-p distribution vs transformers' warpers"] < 1e-12


def sample(prompt_ids, n: int, seed: int) -> list[int]:
    rng, cache = np.random.default_rng(seed), {}
    step_logits, tokens = forward(prompt_ids, theta_scaled, cache)[-1], []
    for _ in range(n):
        tokens.append(int(rng.choice(len(step_logits), p=top_p_distribution(step_logits, temperature, top_p))))
        step_logits = forward(np.array(tokens[-1:]), theta_scaled, cache)[-1]
    return tokens


first, again, other = sample(ids, 8, seed=0), sample(ids, 8, seed=0), sample(ids, 8, seed=1)
print("seed 0:", repr(tokenizer.decode(first)))
print("seed 0:", repr(tokenizer.decode(again)), "(the same: a seeded generator)")
print("seed 1:", repr(tokenizer.decode(other)))
assert first == again

# %% [markdown]
# The library applies the same warpers (each a small function in `numpy_transformer.logits_processors`, checked
# against transformers' own) in `nt.generate(..., do_sample=True)`, which reads `do_sample`, `temperature` and
# `top_p` from the checkpoint's generation_config.json as `generate()` does. Its distribution at the first step is ours:

# %%
from numpy_transformer.decoding import warped_probabilities  # noqa: E402
from transformer_spec.config import GenerationRules  # noqa: E402

rules = GenerationRules(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
checks["top-p distribution vs numpy_transformer"] = max_diff(q, warped_probabilities(z[None], rules)[0])
library_sample = nt.generate(
    ours, ids[None], max_new_tokens=8, do_sample=True, rng=0, temperature=temperature, top_p=top_p, top_k=0
)
print("nt.generate(do_sample=True), seed 0:", repr(tokenizer.decode(library_sample[0, len(ids) :].tolist())))
assert checks["top-p distribution vs numpy_transformer"] < 1e-12

# %% [markdown]
# ## 7. Chat: the template, and text as it comes
#
# A chat model reads a conversation written in its own format: the chat template of tokenizer_config.json (a Jinja
# template) writes the messages with the model's special tokens and opens the assistant's turn.
# `generate_text` applies it, decodes under the checkpoint's generation rules, and streams each piece of text as it
# is chosen (here into a list; the command line prints it). The words of a random model are noise, of course.

# %%
messages = [{"role": "user", "content": "How are you today?"}]
print(tokenizer.apply_chat_template(messages))
streamed: list[str] = []
text = generate_text(ours, tokenizer, messages, max_new_tokens=10, stream=streamed.append)
print(streamed)
assert "".join(streamed) == text

# %% [markdown]
# ## 8. The real models
#
# With network access and the `hub` extra (`pip install "transformer-parity[hub]"`: `huggingface_hub` downloads
# and caches the files, with a progress bar), the same code runs the released checkpoints, by Hub id:
#
# ```bash
# transformer-parity generate Qwen/Qwen2.5-0.5B-Instruct "Explain rotary embeddings in one sentence." --chat
# transformer-parity generate meta-llama/Llama-3.2-1B "The three parts of a Transformer layer are"
# ```
#
# (Llama 3.2 is a gated repository: accept its licence on the Hub and log in with `hf auth login` first.) In Python:
#
# ```python
# from numpy_transformer import hf
# from numpy_transformer.text import generate_text, load_tokenizer
# model = hf.load("Qwen/Qwen2.5-0.5B-Instruct")          # about 2 GB of float32 arrays
# tokenizer = load_tokenizer("Qwen/Qwen2.5-0.5B-Instruct")
# generate_text(model, tokenizer, [{"role": "user", "content": "Hi!"}], max_new_tokens=40,
#               stream=lambda s: print(s, end="", flush=True))
# ```
#
# On a laptop CPU the 0.5B model writes several tokens a second in plain NumPy: each step reads every weight once,
# so the speed is set by memory bandwidth ([the benchmarks page](../docs/howto/benchmark.md) measures it).

# %% [markdown]
# ## Summary
#
# - A Llama-3.2-style layer: $x \mathrel{+}= \mathrm{Attn}(\mathrm{RMSNorm}(x))$, then
#   $x \mathrel{+}= \mathrm{SwiGLU}(\mathrm{RMSNorm}(x))$; queries and keys rotated by RoPE; $H_{kv} < H$ key/value
#   heads each read by $H / H_{kv}$ query heads; the output layer tied to the embedding table.
# - Llama 3's RoPE scaling changes only the frequencies: fast pairs kept, slow ones divided by the factor, a blend
#   between.
# - The KV cache keeps each layer's keys and values, $2 \cdot \text{layers} \cdot H_{kv} \cdot d_h$ numbers a token;
#   a step then runs one position, and its logits equal the recomputed ones.
# - Sampling: $z/\tau$, softmax, the top-p set, renormalise, draw from a seeded generator.
#
# The checks, collected:

# %%
for name, error in checks.items():
    print(f"{name:45} {error:.1e}")

# %% [markdown]
# ## Exercises
#
# Answers, worked and checked, are in `examples/answers/10_answers.py`. Check yours against `transformers`' own
# classes, on the same scores.
#
# 1. **Top-k and min-p.** Two more ways to cut the tail before sampling: keep the $k$ most likely tokens (`top_k`),
#    or the tokens whose probability is at least `min_p` times the largest one (`min_p`, after the temperature).
#    Write both as distributions, like `top_p_distribution`, and check them against `TopKLogitsWarper` and
#    `MinPLogitsWarper` (each after `TemperatureLogitsWarper`, then a softmax).
# 2. **Repetition penalty.** Qwen2.5-0.5B-Instruct's generation_config.json asks for `repetition_penalty: 1.1`:
#    the logit of every token already in the sequence (prompt included) is divided by 1.1 when it is positive and
#    multiplied by 1.1 when it is negative (both make it less likely). Write it on a batch of scores (N, V) given the
#    tokens so far (N, T), and check it against `RepetitionPenaltyLogitsProcessor`.
# 3. **Dynamic NTK scaling.** `rope_type: "dynamic"` keeps $\theta$ while the input fits the trained length $L$ and,
#    beyond it, raises the base: $b' = b\,\big(s\,T/L - (s - 1)\big)^{d_h/(d_h - 2)}$ for an input of $T$ tokens.
#    Compute $\theta'$ for $T = 2L$ and $T = 8L$, check it against `ROPE_INIT_FUNCTIONS["dynamic"]` with `seq_len=T`,
#    and say which pairs it slows down most (compare with Llama 3's table above).
