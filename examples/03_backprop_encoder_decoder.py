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
# # 3. Backpropagation through a whole encoder-decoder, one layer at a time
#
# *Prerequisites:* walkthroughs 01, 01b and 02. *Time:* 60 minutes. The symbols are those of
# [the notation table](../docs/notation.md); the error measure and its tolerances are in
# [the conventions](../docs/conventions.md).
#
# Walkthroughs 01, 01b and 02 derived the backward passes that need real calculus: attention's softmax,
# the heads of multi-head attention, and layer norm. The rest of the Transformer is linear layers,
# activations, dropout, table lookups, reshapes and additions, plus the loss; this walkthrough derives
# the ones not seen yet (the loss with label smoothing and padding, ReLU, GELU, dropout, the post-norm
# residual) and puts it all together. We build a tiny encoder-decoder in
# `numpy_transformer`, load the very same weights into `torch_transformer`, run one padded batch
# through both, and then walk the backward pass by hand, in the order the model itself does it:
#
# 1. the loss (cross-entropy with label smoothing, padding ignored) and its gradient, the logits';
# 2. the output projection;
# 3. the decoder's final layer norm (present because we use pre-norm);
# 4. the decoder layers, last to first, each one sublayer at a time: feed-forward, then
#    cross-attention (which also sends a gradient to the encoder's output), then self-attention;
# 5. the decoder's embedding table;
# 6. the encoder's final norm, its layers last to first, and its embedding table.
#
# Three close-ups open the pieces the walk calls as one line: self-attention's $q = k = v$, the
# feed-forward's activations and dropout, and the paper's post-norm residual next to this model's
# pre-norm one.
#
# After every step we compare the gradient of that step's input, and the gradients of that step's
# parameters, with what PyTorch's autograd computed for its own implementation. Each numpy step is
# one call of a function from `numpy_transformer`, on the caches of a real forward pass: nothing
# below re-implements the model.

# %%
import dataclasses
import inspect
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy.special import erf

# The checkout's root: the figures' code is in examples/plotting.py (and the packages, if not pip-installed).
sys.path.insert(0, str((Path(__file__).parent if "__file__" in globals() else Path.cwd()).resolve().parent))
OUT = Path(os.environ.get("WALKTHROUGH_OUT", "runs/walkthrough_03"))  # where the figures go
OUT.mkdir(parents=True, exist_ok=True)

import torch_transformer  # noqa: E402
from examples import plotting  # noqa: E402
from numpy_transformer import (  # noqa: E402
    Transformer,
    TransformerConfig,
    cross_entropy_backward,
    cross_entropy_forward,
    multi_head_attention_backward,
)
from numpy_transformer.gradcheck import check_pair  # noqa: E402
from numpy_transformer.layers import (  # noqa: E402
    layer_norm_backward,
    linear_backward,
    linear_forward,
    residual_in_backward,
    residual_out_backward,
)
from numpy_transformer.model import (  # noqa: E402
    decoder_forward,
    decoder_layer_backward,
    embed_backward,
    encoder_forward,
    ffn_backward,
    padding_mask,
    sub,
)

np.set_printoptions(precision=4, suppress=True)

# %% [markdown]
# ## A tiny model, twice
#
# Two encoder layers and two decoder layers, $d_{model} = 8$, two heads of width 4, $d_{ff} = 16$,
# ReLU, sinusoidal positions, pre-norm ($x + \mathrm{Sublayer}(\mathrm{LN}(x))$, with a final layer
# norm after each stack), no dropout, float64. The NumPy model initialises the weights; we move the
# biases and the layer-norm gains off their initial values (zero and one), so that no gradient is
# compared at a point where it happens to be special. Then the state dict, whose names and layouts
# are the same on both sides, goes into the PyTorch model unchanged.

# %%
cfg = TransformerConfig(
    src_vocab_size=11,
    tgt_vocab_size=13,
    d_model=8,
    n_heads=2,
    d_ff=16,
    n_encoder_layers=2,
    n_decoder_layers=2,
    norm_first=True,
    max_len=16,
)
np_model = Transformer(cfg, seed=0, dtype=np.float64).eval()
rng = np.random.default_rng(0)
for name, value in np_model.params.items():
    if name.endswith(".bias") or name.endswith("norm.weight"):
        value += 0.3 * rng.standard_normal(value.shape)

torch_model = torch_transformer.Transformer(cfg).double().eval()
torch_model.load_state_dict({k: torch.from_numpy(v) for k, v in np_model.state_dict().items()})
torch_params = dict(torch_model.named_parameters())
print(f"{len(np_model.params)} parameter tensors, {sum(v.size for v in np_model.params.values())} numbers")

# %% [markdown]
# ## A padded batch
#
# Two source sentences of different lengths, padded with `pad_id = 0`, and their targets. The
# decoder reads `tgt_in` (the target shifted right, starting with `bos_id = 1`) and is trained to
# predict `tgt_out` (ending with `eos_id = 2`). Source padding is masked out of the encoder's
# self-attention and the decoder's cross-attention as a key; the decoder's self-attention masks only
# the future (target padding sits at the end, where causality hides it from every real position, as
# in Hugging Face's decoders), and padded targets are ignored by the loss.

# %%
src = np.array([[5, 7, 3, 9, 4], [6, 8, 10, 0, 0]])  # (B, T_src)
tgt_in = np.array([[1, 4, 6, 8], [1, 5, 7, 0]])  # (B, T_tgt)
tgt_out = np.array([[4, 6, 8, 2], [5, 7, 2, 0]])  # (B, T_tgt); the trailing 0 is padding, ignored
src_t, tgt_in_t, tgt_out_t = (torch.from_numpy(a) for a in (src, tgt_in, tgt_out))

# %% [markdown]
# ## The forward pass, keeping the caches
#
# `Transformer.forward` is three calls: the encoder, the decoder (which reads the encoder's output,
# the *memory*, with the source's padding mask), and the output projection. We make the same three
# calls ourselves, so that we hold the caches the backward pass will need. Every cache is a small dataclass
# whose fields are named as its backward reads them. A stack's cache holds one `LayerCache` per layer in
# `.layers`; a layer's cache has three fields per sublayer, in the order the forward ran them: `self_attn_in`
# (what `residual_in_forward` kept: the norm's cache in pre-norm, None in post-norm), `self_attn` (the
# sublayer's own: an `AttentionCache`; `ffn` holds the feed-forward's), `self_attn_out` (a `SublayerOutCache`:
# the way the output joined the stream, `.kind` "residual", the norm's name and, in `.join`, what
# `residual_out_forward` kept: the dropout mask, and the norm's cache in post-norm); likewise `ffn_*`, and `cross`
# (None in a layer without cross-attention) holds the cross-attention sublayer's three as `attn_in`, `attn` and
# `attn_out`. A norm's cache, `NormCache`, names the norm it ran in `.kind`
# ("layer" here, or "rms") and holds that norm's cache in `.norm`.

# %%
params = np_model.params
memory, enc_cache = encoder_forward(sub(params, "encoder"), src, cfg)  # (B, T_src, D)
x, dec_cache = decoder_forward(sub(params, "decoder"), tgt_in, memory, cfg, memory_mask=padding_mask(src, cfg.pad_id))
logits, out_cache = linear_forward(x, params["output_proj.weight"], params["output_proj.bias"])  # (B, T_tgt, V)

print("encoder cache:", [f.name for f in dataclasses.fields(enc_cache)], " layers:", len(enc_cache.layers))
print("decoder layer cache:", [f.name for f in dataclasses.fields(dec_cache.layers[0])])
assert np.array_equal(logits, np_model.forward(src, tgt_in))  # the same calls as the model's own forward

# %% [markdown]
# ## The loss
#
# Cross-entropy with label smoothing $\epsilon_{ls} = 0.1$: the target distribution of a position
# with label $y$ is $q = (1 - \epsilon_{ls})\, \mathrm{onehot}(y) + \epsilon_{ls} / |\mathcal V|$, the loss
# of a position is $-\sum_c q_c \log p_c$ with $p = \mathrm{softmax}(z)$ of its logits $z$, and the mean
# runs over the $n = 7$ positions whose target is not padding. Its gradient is derived in step 1.
#
# On the torch side we run the forward with *hooks* (next cell) and compute the loss with
# `F.cross_entropy`.

# %%
loss, ce_cache = cross_entropy_forward(logits, tgt_out, ignore_index=cfg.pad_id, label_smoothing=0.1)

# %% [markdown]
# The whole model as a graph, each arrow labelled with the shape of what it carries: the forward pass
# left to right (black), the backward pass that the steps below walk right to left (red, dashed). The
# encoder's output, the memory, feeds the cross-attention of *every* decoder layer: its gradient is the
# sum of what each decoder layer sends back (step 4), and only that sum enters the encoder (step 6).

# %%
(B, T_src), T_tgt, D = src.shape, tgt_in.shape[1], cfg.d_model
nodes = {
    "emb_s": (0.0, 2.0, "source ids:\nembedding\n+ positions"),
    "enc0": (1.9, 2.0, "encoder\nlayer 0"),
    "enc1": (3.8, 2.0, "encoder\nlayer 1"),
    "enc_n": (5.7, 2.0, "final\nnorm"),
    "emb_t": (0.0, 0.0, "target ids:\nembedding\n+ positions"),
    "dec0": (1.9, 0.0, "decoder\nlayer 0"),
    "dec1": (4.6, 0.0, "decoder\nlayer 1"),
    "dec_n": (6.3, 0.0, "final\nnorm"),
    "proj": (7.9, 0.0, "output\nprojection"),
    "L": (9.5, 0.0, "$\\mathcal{L}$\n(cross-\nentropy)"),
}
edges = [
    ("emb_s", "enc0", "x", f"({B}, {T_src}, {D})"),
    ("enc0", "enc1", "x", f"({B}, {T_src}, {D})"),
    ("enc1", "enc_n", "x", f"({B}, {T_src}, {D})"),
    ("enc_n", "dec0", "\\mathrm{memory}", f"({B}, {T_src}, {D})", 0.6, -1),  # its labels clear of the other edge's
    ("enc_n", "dec1", "\\mathrm{memory}", f"({B}, {T_src}, {D})", 0.6),
    ("emb_t", "dec0", "x", f"({B}, {T_tgt}, {D})"),
    ("dec0", "dec1", "x", f"({B}, {T_tgt}, {D})"),
    ("dec1", "dec_n", "x", f"({B}, {T_tgt}, {D})"),
    ("dec_n", "proj", "x", f"({B}, {T_tgt}, {D})"),
    ("proj", "L", "z", f"({B}, {T_tgt}, {cfg.tgt_vocab_size})"),
]
plotting.plot_computation_graph(nodes, edges, OUT / "graph.png", "the encoder-decoder", size=(8.4, 3.8))

# %% [markdown]
# ## Watching gradients inside the PyTorch model
#
# Autograd only keeps the gradients of leaves (the parameters). To see the gradient arriving at an
# intermediate activation we call `retain_grad()` on it, and to get hold of the activation we
# register hooks on the submodules that produce or consume it:
#
# - a *forward pre-hook* sees a module's inputs. In pre-norm, a sublayer's input is the input of its
#   layer norm (`self_attn_norm`, `cross_attn_norm`, `ffn_norm`), so we hook those;
# - a *forward hook* sees a module's output (the final norms').
#
# One more trick: every decoder layer's cross-attention reads the same `memory` tensor, so autograd
# sums their gradients into one. To see each layer's share, a pre-hook on each cross-attention
# replaces its key and value argument with `memory.view_as(memory)`: the same numbers, but its own
# node in the graph, whose gradient is that layer's share alone.

# %%
captured = {}  # name -> torch activation whose .grad we will read


def keep_input(name):
    def hook(module, args):
        args[0].retain_grad()
        captured[name] = args[0]

    return hook


def keep_output(name):
    def hook(module, args, output):
        output.retain_grad()
        captured[name] = output

    return hook


def own_memory(name):
    def hook(module, args):
        query, key, value, *rest = args  # cross-attention: key and value are both `memory`
        alias = key.view_as(key)
        alias.retain_grad()
        captured[name] = alias
        return (query, alias, alias, *rest)

    return hook


get = torch_model.get_submodule
for stack in ("encoder", "decoder"):
    get(f"{stack}.final_norm").register_forward_pre_hook(keep_input(f"{stack}.final_norm.in"))
    get(f"{stack}.final_norm").register_forward_hook(keep_output(f"{stack}.final_norm.out"))
    n_layers = cfg.n_encoder_layers if stack == "encoder" else cfg.n_decoder_layers
    sublayers = ("self_attn", "ffn") if stack == "encoder" else ("self_attn", "cross_attn", "ffn")
    for i in range(n_layers):
        for s in sublayers:
            get(f"{stack}.layers.{i}.{s}_norm").register_forward_pre_hook(keep_input(f"{stack}.layers.{i}.{s}.in"))
for i in range(cfg.n_decoder_layers):
    get(f"decoder.layers.{i}.cross_attn").register_forward_pre_hook(own_memory(f"decoder.layers.{i}.memory"))
get("decoder.layers.0.self_attn").register_forward_pre_hook(keep_input("decoder.layers.0.self_attn.h"))

logits_t = torch_model(src_t, tgt_in_t)
logits_t.retain_grad()
captured["logits"] = logits_t
loss_t = F.cross_entropy(
    logits_t.reshape(-1, cfg.tgt_vocab_size), tgt_out_t.reshape(-1), ignore_index=cfg.pad_id, label_smoothing=0.1
)
loss_t.backward()

print(f"loss: numpy {loss:.15f}   torch {loss_t.item():.15f}   |diff| = {abs(loss - loss_t.item()):.1e}")
print(f"max |logits diff| = {np.abs(logits - logits_t.detach().numpy()).max():.1e}")
assert abs(loss - loss_t.item()) <= 1e-12
assert np.abs(logits - logits_t.detach().numpy()).max() <= 1e-12

# %% [markdown]
# ## How we compare
#
# For every step: the largest absolute difference of the input's gradient, and of each parameter
# gradient, from PyTorch's. The pass/fail number is the project's error
# ([the conventions' error measure](../docs/conventions.md)),
# $\max|a - b| / \max(\max|b|,\ 10^{-3}\, \mathrm{top})$, where $\mathrm{top}$ is the largest gradient
# entry of the whole model. The floor $10^{-3}\, \mathrm{top}$ matters for gradients that are zero in
# exact arithmetic, which we will meet. The bar is $10^{-10}$; float64 rounding gives about $10^{-14}$.
#
# `grads` collects the NumPy gradients by state-dict name as the walk produces them.

# %%
s_scale = max(p.grad.abs().max().item() for p in torch_params.values())
grads = {}
table = []


def error(a, b):
    return np.abs(a - b).max() / max(np.abs(b).max(), 1e-3 * s_scale)


def fmt(diff):
    return "-" if diff is None else f"{diff:.1e}"  # "-": the step's input is token ids, with no gradient


def compare(step, dinput=None, torch_name=None, param_grads=None):
    """Record one step: its input's gradient against captured[torch_name].grad, and its parameters'."""
    param_grads = param_grads or {}
    errors, input_diff, param_diff = [], None, 0.0
    if dinput is not None:
        reference = captured[torch_name].grad.numpy()
        input_diff = np.abs(dinput - reference).max()
        errors.append(error(dinput, reference))
        assert np.abs(dinput).max() > 0, f"{step}: an all-zero gradient would pass vacuously"
    for name, g in param_grads.items():
        reference = torch_params[name].grad.numpy()
        param_diff = max(param_diff, np.abs(g - reference).max())
        errors.append(error(g, reference))
    grads.update(param_grads)
    worst = max(errors)
    table.append((step, input_diff, len(param_grads), param_diff, worst))
    n = len(param_grads)
    print(f"{step:38} d(input) {fmt(input_diff):>8}   {n:2d} params {param_diff:8.1e}   error {worst:8.1e}")
    assert worst <= 1e-10, f"{step}: error {worst:.2e} above the bar"


# %% [markdown]
# ## Your turn: the loss's gradient
#
# Before reading step 1: the loss is the mean over the kept targets of the label-smoothed cross-entropy
# ($\epsilon_{ls} = 0.1$, targets equal to the pad id ignored). Write its gradient with respect to the logits,
# $(B, T_{tgt}, V)$, in `your_dlogits`, in place of `return None`. The cell after step 1 checks it. The
# workbook's `cross_entropy` exercise goes further (other smoothings, float32), and its `encoder_layer`
# exercise chains a layer's backward as step 4 does: `transformer-parity exercises DIR --only cross_entropy`.


# %%
def your_dlogits(logits, targets, pad_id, label_smoothing):
    """logits (B, T, V), targets (B, T) -> dlogits (B, T, V): your turn."""
    return None


# %% [markdown]
# ## Step 1: the loss gives the logits' gradient
#
# One kept row first, with logits $z$ and $p = \mathrm{softmax}(z)$, so $\log p_c = z_c - \log \sum_k e^{z_k}$:
#
# $$\ell = -\sum_c q_c \log p_c = -\sum_c q_c z_c + \Big(\sum_c q_c\Big) \log \sum_k e^{z_k}
# = -\sum_c q_c z_c + \log \sum_k e^{z_k},$$
#
# because $q$ sums to one. Differentiating, $\partial \ell / \partial z_c = -q_c + e^{z_c} / \sum_k e^{z_k}$:
#
# $$\frac{\partial \ell}{\partial z} = p - q.$$
#
# The softmax's Jacobian of walkthrough 01 never appears: paired with the log, it cancels. Label
# smoothing only changes $q$; with $\epsilon_{ls} = 0$, $q$ is one-hot and the gradient is $p$ minus one at
# the target. Written out: $(1 - \epsilon_{ls})$ of the loss is $-\log p_y$ and $\epsilon_{ls}$ of it is the
# mean of $-\log p_c$ over the whole vocabulary, which pulls every logit towards the same value.
#
# **Ignored rows and the division by $n$.** The loss is the mean over the kept rows,
# $\mathcal{L} = \frac1n \sum_{i\ \mathrm{kept}} \ell_i$, so each kept row's gradient is $(p_i - q_i)/n$ and an
# ignored row's is exactly $0$ (it is not in the sum). Why $n$, the count of kept targets, and not
# $B \cdot T$, the count of positions? Because the loss should be a mean per *target*: divided by
# $B \cdot T$, the same sentences would give a smaller loss, and smaller gradients, the more padding
# their batch happens to carry, so the effective learning rate would depend on the batch's lengths.
# It is also what `F.cross_entropy(..., ignore_index=...)` computes, so the two implementations agree.
# Every later step starts from this array. (A random upstream gradient would do as well for checking; a
# real loss shows the backward pass as it runs in training.)

# %%
V_tgt = cfg.tgt_vocab_size
z = logits.reshape(-1, V_tgt)  # (N, V): one row per position
y = tgt_out.reshape(-1)  # (N,)
kept = y != cfg.pad_id
n = int(kept.sum())
p_rows = np.exp(z - z.max(axis=-1, keepdims=True))
p_rows /= p_rows.sum(axis=-1, keepdims=True)  # (N, V)
q_rows = np.full_like(z, 0.1 / V_tgt)
q_rows[np.arange(len(y)), y] += 1.0 - 0.1  # (1 - eps) onehot(y) + eps / V
loss_by_hand = -(q_rows * np.log(p_rows))[kept].sum() / n
dlogits_by_hand = np.where(kept[:, None], (p_rows - q_rows) / n, 0.0).reshape(logits.shape)

dlogits = cross_entropy_backward(ce_cache)  # (B, T_tgt, V)
print(f"n = {n} kept targets of {len(y)} positions; loss by hand {loss_by_hand:.15f}")
print("max |dlogits by hand - library| =", np.abs(dlogits_by_hand - dlogits).max())
print("max |dlogits| at the padded position (batch 1, position 3):", np.abs(dlogits[1, 3]).max())
assert abs(loss_by_hand - loss) <= 1e-14 and np.abs(dlogits_by_hand - dlogits).max() <= 1e-15
compare("loss -> logits", dlogits, "logits")

# %% [markdown]
# **Your turn, checked**; then a classic mistake, dividing by every position instead of the kept targets.

# %%
from parity_tests.check.your_turn import checker  # noqa: E402

check = checker(
    {"dlogits": dlogits},
    reference="cross_entropy",
    args={"logits": logits, "targets": tgt_out, "ignore_index": cfg.pad_id, "label_smoothing": 0.1},
    dout=1.0,
    wrt={"dlogits": "logits"},
    exercise="cross_entropy",
)
check("dlogits", your_dlogits(logits, tgt_out, cfg.pad_id, 0.1))
print("\ndivided by all B * T positions:")
assert not check("dlogits", np.where(kept[:, None], (p_rows - q_rows) / len(y), 0.0).reshape(logits.shape))

# %% [markdown]
# The same gradient divided by $B \cdot T = 8$ instead of $n = 7$ is off by the factor $7/8$ everywhere,
# far outside the bar; and finite differences of the library's loss agree with its backward (the loss
# is a scalar, so its upstream gradient is a random scalar).

# %%
per_position = np.where(kept[:, None], (p_rows - q_rows) / len(y), 0.0).reshape(logits.shape)
print(f"dividing by B*T instead: error {error(per_position, captured['logits'].grad.numpy()):.1e}")
assert error(per_position, captured["logits"].grad.numpy()) > 1e-2
ce_check = check_pair(
    lambda logits, targets: cross_entropy_forward(logits, targets, ignore_index=cfg.pad_id, label_smoothing=0.1),
    lambda dloss, cache: cross_entropy_backward(cache, dloss),
    dict(logits=logits.copy(), targets=tgt_out),
    wrt=["logits"],
)
print(ce_check)
assert ce_check.worst <= 1e-6

# %% [markdown]
# ## Step 2: the output projection
#
# $\mathrm{logits} = x W^\top + b$ with $W$ of shape $(\lvert\mathcal V\rvert, D)$, as `nn.Linear` stores it.
# Its backward (`linear_backward`): $dx = d\mathrm{logits}\, W$, $dW = \sum_{b,t} d\mathrm{logits}_{bt}^\top x_{bt}$,
# $db = \sum_{b,t} d\mathrm{logits}_{bt}$. The sums over batch and positions are there because the
# same $W$ and $b$ serve every position.

# %%
dx, dW, db = linear_backward(dlogits, out_cache)  # dx (B, T_tgt, D)
compare("output_proj", dx, "decoder.final_norm.out", {"output_proj.weight": dW, "output_proj.bias": db})

# %% [markdown]
# ## Step 3: the decoder's final layer norm
#
# Pre-norm layers leave their output un-normalised, so the stack ends with one more layer norm.
# Its backward is walkthrough 02's boxed formula.

# %%
final_norm_cache = dec_cache.final_norm.norm  # the NormCache's layer norm cache (kind "layer")
dx, dw, db = layer_norm_backward(dx, final_norm_cache)
compare(
    "decoder.final_norm", dx, "decoder.final_norm.in", {"decoder.final_norm.weight": dw, "decoder.final_norm.bias": db}
)

# %% [markdown]
# ## Step 4: the decoder layers, last to first
#
# A pre-norm sublayer computes $\mathrm{out} = x + f(\mathrm{LN}(x))$, as two pairs around the
# sublayer: `residual_in_forward` makes $\tilde x = \mathrm{LN}(x)$, the sublayer makes $y = f(\tilde x)$,
# `residual_out_forward` makes $x + y$. Backwards, in reverse: `residual_out_backward` hands
# $d\mathrm{out}$ both to the residual path (as $dx$) and to the sublayer (as $dy$); the sublayer's
# backward turns $dy$ into $d\tilde x$; `residual_in_backward` carries $d\tilde x$ through the layer norm to $x$; and
# the two gradients at $x$ are added (two paths fork from $x$, so their gradients add):
#
# $$dx = d\mathrm{out} + J_{\mathrm{LN}}^\top J_f^\top\, d\mathrm{out}
# = \big(I + J_{\mathrm{LN}}^\top J_f^\top\big)\, d\mathrm{out},$$
#
# where $J_f$ is the Jacobian of the sublayer at its input and $J_f^\top dy$ is what its backward
# computes (walkthrough 01, step 6; [the notation table](../docs/notation.md)). The post-norm version
# is the third close-up below. Each decoder layer has three sublayers, undone in reverse order:
#
# - **feed-forward**, $f(\tilde x) = W_2\, \mathrm{relu}(W_1 \tilde x + b_1) + b_2$; `ffn_backward` (which runs
#   `feed_forward_backward` here, or the gated block's backward in a Llama-style model);
# - **cross-attention**, $f(\tilde x) = \mathrm{MHA}(\tilde x, \mathrm{memory}, \mathrm{memory})$: the query comes
#   from the decoder, keys and values from the encoder's output. `multi_head_attention_backward`
#   returns the query's gradient, the sublayer's own, and `dkey + dvalue` is the gradient this layer
#   sends to the memory. Every decoder layer reads the same memory, so these shares are
#   **accumulated** across layers (`dmemory += ...`), and the sum is what the encoder receives;
# - **self-attention**, $f(\tilde x) = \mathrm{MHA}(\tilde x, \tilde x, \tilde x)$ with the causal and padding
#   mask (the heads and projections inside it are walkthrough 01b's):
#   one array is the query, the key and the value, so its gradient is the **sum of the three**
#   input gradients of attention (`dquery + dkey + dvalue`).
#
# The library's decoder-layer backward is that list of calls, short enough to read whole; the walk below
# makes the same calls one by one and checks each against PyTorch:

# %%
print(inspect.getsource(decoder_layer_backward))

# %% [markdown]
# Now the walk. The sublayer's parameters are reported under their state-dict names: the norm's
# `{sublayer}_norm.*` and the sublayer's own (`ffn.linear1.weight`, `cross_attn.q_proj.bias`, ...).

# %%
dmemory = np.zeros_like(memory)  # (B, T_src, D): filled by every decoder layer's cross-attention
upstream_of = {}  # the gradient entering each sublayer, kept for the close-up below


def out_cache(out):
    """What residual_out_forward kept for a sublayer: its SublayerOutCache `out` holds it in `.join` (Gemma's
    sandwich, kind "sandwich", would hold sandwich_out_forward's there instead, for sandwich_out_backward)."""
    assert out.kind == "residual"  # the paper's residual, not Gemma's sandwich
    return out.join


for i in reversed(range(cfg.n_decoder_layers)):
    layer, p = dec_cache.layers[i], f"decoder.layers.{i}"

    # feed-forward: x2 = x1 + ffn(LN(x1))
    upstream_of[f"{p}.ffn"] = dx
    dx_residual, dy, norm_out = residual_out_backward(dx, out_cache(layer.ffn_out))
    dh, ffn_grads = ffn_backward(dy, layer.ffn)
    dx_ffn, norm_in = residual_in_backward(dh, layer.ffn_in)
    dx = dx_residual + dx_ffn  # the residual path and the path through the sublayer meet at x1
    step_grads = {f"{p}.ffn_norm.{k}": v for k, v in (norm_in | norm_out).items()}
    compare(f"{p}.ffn", dx, f"{p}.ffn.in", step_grads | {f"{p}.ffn.{k}": v for k, v in ffn_grads.items()})

    # cross-attention: x1 = x0 + MHA(LN(x0), memory, memory)
    upstream_of[f"{p}.cross_attn"] = dx
    dx_residual, dy, norm_out = residual_out_backward(dx, out_cache(layer.cross.attn_out))
    dh, dkey, dvalue, cross_grads = multi_head_attention_backward(dy, layer.cross.attn)
    dmemory_i = dkey + dvalue  # the memory was both the key and the value
    dmemory += dmemory_i  # every decoder layer reads the same memory: the shares add
    dx_cross, norm_in = residual_in_backward(dh, layer.cross.attn_in)
    dx = dx_residual + dx_cross
    step_grads = {f"{p}.cross_attn_norm.{k}": v for k, v in (norm_in | norm_out).items()}
    step_grads |= {f"{p}.cross_attn.{k}": v for k, v in cross_grads.items()}
    compare(f"{p}.cross_attn", dx, f"{p}.cross_attn.in", step_grads)
    compare(f"{p}.cross_attn -> memory", dmemory_i, f"{p}.memory")

    # self-attention: x0 = x + MHA(h, h, h), h = LN(x)
    upstream_of[f"{p}.self_attn"] = dx
    dx_residual, dy, norm_out = residual_out_backward(dx, out_cache(layer.self_attn_out))
    dquery, dkey, dvalue, self_grads = multi_head_attention_backward(dy, layer.self_attn)
    dx_self, norm_in = residual_in_backward(dquery + dkey + dvalue, layer.self_attn_in)  # h played three roles
    dx = dx_residual + dx_self
    step_grads = {f"{p}.self_attn_norm.{k}": v for k, v in (norm_in | norm_out).items()}
    step_grads |= {f"{p}.self_attn.{k}": v for k, v in self_grads.items()}
    compare(f"{p}.self_attn", dx, f"{p}.self_attn.in", step_grads)

# %% [markdown]
# ### Close-up: q = k = v
#
# Take the last sublayer we undid, decoder layer 0's self-attention, and open it one level further.
# In pre-norm it computes $\mathrm{out} = x + \mathrm{MHA}(\tilde x, \tilde x, \tilde x)$ with
# $\tilde x = \mathrm{LN}(x)$.
# `multi_head_attention_backward` returns three gradients, one per role $\tilde x$ played. Against
# PyTorch's gradient of $\tilde x$ (captured at the attention module's input), each alone is wrong by a
# lot; their sum is right.

# %%
mha_cache = dec_cache.layers[0].self_attn
dquery, dkey, dvalue, _ = multi_head_attention_backward(upstream_of["decoder.layers.0.self_attn"], mha_cache)
dh_torch = captured["decoder.layers.0.self_attn.h"].grad.numpy()
for name, candidate in (("dquery", dquery), ("dkey", dkey), ("dvalue", dvalue), ("sum", dquery + dkey + dvalue)):
    print(f"{name:7} max |candidate - torch's dh| = {np.abs(candidate - dh_torch).max():.1e}")
assert error(dquery + dkey + dvalue, dh_torch) <= 1e-10
assert min(error(g, dh_torch) for g in (dquery, dkey, dvalue)) > 1e-3

# %% [markdown]
# ### Close-up: the feed-forward's activation, and dropout
#
# `ffn_backward` above ran $f(\tilde x) = W_2\, \phi(W_1 \tilde x + b_1) + b_2$ backwards: two linear layers (step 2's
# rule) around an elementwise activation $\phi$. An elementwise function has a diagonal Jacobian,
# $J_\phi = \mathrm{diag}(\phi'(a))$, so its backward is a product, $da = \phi'(a) \odot d\phi$. What is
# left is each activation's derivative:
#
# - **ReLU**, $\phi(a) = \max(a, 0)$: $\phi'(a) = 1$ where $a > 0$, else $0$ (at $a = 0$ exactly, 0, as
#   PyTorch chooses). A unit that is off passes no gradient back.
# - **GELU, exact** (BERT's), $\phi(a) = a\, \Phi(a)$ with $\Phi(a) = \tfrac12\big(1 + \mathrm{erf}(a/\sqrt2)\big)$
#   the standard normal CDF. The product rule, with $\Phi'(a) = e^{-a^2/2} / \sqrt{2\pi}$:
#   $$\phi'(a) = \Phi(a) + a\, \Phi'(a).$$
# - **GELU, tanh approximation** (GPT-2's), $\phi(a) = \tfrac12 a\,(1 + \tanh \xi)$ with
#   $\xi = \sqrt{2/\pi}\,(a + 0.044715\, a^3)$. The product rule and $\tanh' = 1 - \tanh^2$:
#   $$\phi'(a) = \tfrac12 (1 + \tanh \xi) +
#   \tfrac12 a\, (1 - \tanh^2 \xi)\, \sqrt{2/\pi}\, (1 + 3 \cdot 0.044715\, a^2).$$
#
# **Dropout** in training mode draws a keep-mask $\kappa$ (each entry 1 with probability $1 - p_{drop}$) and
# scales what it keeps, $y = x \odot \kappa / (1 - p_{drop})$, so that the expected value of $y$ is $x$ ("inverted
# dropout": nothing to rescale at evaluation, where $y = x$). It is linear in $x$ with a diagonal
# Jacobian, so $dx = dy \odot \kappa / (1 - p_{drop})$: the **same** mask and the same scale. A dropped unit
# gets no gradient; the backward must reuse the forward's mask, never draw a new one.
#
# Each pair by hand, checked against PyTorch's autograd (`F.relu`, `F.gelu` with both `approximate`
# settings) and against finite differences. For dropout, torch draws its own mask; we read it back from
# torch's output (a kept entry is nonzero) and run our backward with it.

# %%
a = np.linspace(-3.0, 3.0, 13) + 0.05  # pre-activations, away from ReLU's kink at 0
c_gelu = np.sqrt(2.0 / np.pi)


def relu_pair():
    return (lambda a: (np.maximum(a, 0.0), a)), (lambda d, a: d * (a > 0))


def gelu_pair():
    def forward(a):
        cdf = 0.5 * (1.0 + erf(a / np.sqrt(2.0)))  # Phi(a)
        return a * cdf, (a, cdf)

    def backward(d, cache):
        a, cdf = cache
        return d * (cdf + a * np.exp(-0.5 * a * a) / np.sqrt(2.0 * np.pi))  # Phi(a) + a Phi'(a)

    return forward, backward


def gelu_tanh_pair():
    def forward(a):
        th = np.tanh(c_gelu * (a + 0.044715 * a**3))
        return 0.5 * a * (1.0 + th), (a, th)

    def backward(d, cache):
        a, th = cache
        return d * (0.5 * (1.0 + th) + 0.5 * a * (1.0 - th * th) * c_gelu * (1.0 + 3 * 0.044715 * a * a))

    return forward, backward


upstream = np.random.default_rng(1).standard_normal(a.shape)
for name, (forward, backward), torch_fn in (
    ("relu", relu_pair(), F.relu),
    ("gelu (exact)", gelu_pair(), lambda x: F.gelu(x, approximate="none")),
    ("gelu (tanh)", gelu_tanh_pair(), lambda x: F.gelu(x, approximate="tanh")),
):
    a_t = torch.tensor(a, requires_grad=True)
    out_t = torch_fn(a_t)
    out_t.backward(torch.from_numpy(upstream))
    out, cache = forward(a)
    d_autograd = np.abs(backward(upstream, cache) - a_t.grad.numpy()).max()
    fd = check_pair(forward, backward, dict(a=a.copy()), wrt=["a"], max_coords=None)
    print(f"{name:13} forward vs torch {np.abs(out - out_t.detach().numpy()).max():.1e}   "
          f"backward vs autograd {d_autograd:.1e}   finite differences {fd.worst:.1e}")  # fmt: skip
    assert np.abs(out - out_t.detach().numpy()).max() <= 1e-15 and d_autograd <= 1e-15 and fd.worst <= 1e-6

p_drop = 0.3
torch.manual_seed(0)
x_t = torch.tensor(np.random.default_rng(2).standard_normal((4, 6)), requires_grad=True)
y_t = F.dropout(x_t, p_drop, training=True)
dy = np.random.default_rng(3).standard_normal((4, 6))
y_t.backward(torch.from_numpy(dy))
k = (y_t.detach().numpy() != 0).astype(np.float64)  # torch's keep-mask, read from its output
dx_dropout = dy * k / (1.0 - p_drop)
dropout_fd = check_pair(
    lambda x: (x * k / (1.0 - p_drop), None), lambda d, _: d * k / (1.0 - p_drop), dict(x=x_t.detach().numpy().copy()),
    wrt=["x"], max_coords=None,
)  # fmt: skip
print(f"dropout       {int(k.sum())} of {k.size} kept; backward vs autograd "
      f"{np.abs(dx_dropout - x_t.grad.numpy()).max():.1e}   finite differences {dropout_fd.worst:.1e}")  # fmt: skip
assert np.abs(dx_dropout - x_t.grad.numpy()).max() <= 1e-15 and dropout_fd.worst <= 1e-6

# %% [markdown]
# ### Close-up: the post-norm residual, next to pre-norm
#
# This model is pre-norm. The paper, BERT (walkthrough 05) and the model of walkthrough 04 are
# post-norm: the layer norm comes *after* the residual sum,
#
# $$\text{post-norm: } \mathrm{out} = \mathrm{LN}\big(x + f(x)\big),$$
#
# $$\text{pre-norm: } \mathrm{out} = x + f\big(\mathrm{LN}(x)\big).$$
#
# Backwards, post-norm first undoes the norm: the sum $x + f(x)$ receives $J_{\mathrm{LN}}^\top\, d\mathrm{out}$;
# then two paths fork from $x$ (the residual and the sublayer) and their gradients add:
#
# $$\text{post-norm: } dx = \big(I + J_f^\top\big)\, J_{\mathrm{LN}}^\top\, d\mathrm{out},$$
#
# $$\text{pre-norm: } dx = \big(I + J_{\mathrm{LN}}^\top J_f^\top\big)\, d\mathrm{out}.$$
#
# The difference matters in deep stacks: in pre-norm the identity term carries $d\mathrm{out}$ to $x$
# untouched, so the gradient has a clean path through every layer; in post-norm every layer's gradient
# passes through a layer norm's $J_{\mathrm{LN}}^\top$, one reason why post-norm models are trained with a
# learning-rate warm-up (walkthrough 04; Xiong et al., 2020, "On Layer Normalization in the Transformer
# Architecture").
#
# We check both formulas literally, with the Jacobians built as matrices (for a sublayer that acts row
# by row, a ReLU feed-forward, each row's Jacobians are $D \times D$; the shared weights are the same in
# every row), against PyTorch's autograd and against finite differences. The layer norm's Jacobian
# comes from walkthrough 02:
#
# $$J_{\mathrm{LN}} = \mathrm{diag}(\gamma)\, r\,
# \big(I - \tfrac1D \mathbf{1}\mathbf{1}^\top - \tfrac1D \hat x \hat x^\top\big).$$

# %%
Dr, Fr, eps_ln = 4, 6, 1e-5
g = np.random.default_rng(4)
x_rows = g.standard_normal((3, Dr))  # (N, D): three positions
W1, b1 = g.standard_normal((Fr, Dr)) * 0.5, g.standard_normal(Fr) * 0.2
W2, b2 = g.standard_normal((Dr, Fr)) * 0.5, g.standard_normal(Dr) * 0.2
gamma, beta = 1.0 + 0.3 * g.standard_normal(Dr), 0.3 * g.standard_normal(Dr)
dout_rows = g.standard_normal((3, Dr))


def ln(x):
    x_hat = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps_ln)
    return gamma * x_hat + beta


def ffn(h):
    return np.maximum(h @ W1.T + b1, 0.0) @ W2.T + b2


def J_ln(x):  # (D, D) for one row
    r = 1.0 / np.sqrt(x.var() + eps_ln)
    x_hat = (x - x.mean()) * r
    return np.diag(gamma) @ (r * (np.eye(Dr) - np.ones((Dr, Dr)) / Dr - np.outer(x_hat, x_hat) / Dr))


def J_ffn(h):  # (D, D) for one row: W2 diag(relu'(a)) W1
    return W2 @ np.diag((W1 @ h + b1 > 0).astype(float)) @ W1


post_dx = np.stack([(np.eye(Dr) + J_ffn(x).T) @ J_ln(x + ffn(x)).T @ d for x, d in zip(x_rows, dout_rows, strict=True)])
pre_dx = np.stack([(np.eye(Dr) + J_ln(x).T @ J_ffn(ln(x)).T) @ d for x, d in zip(x_rows, dout_rows, strict=True)])

params_t = [torch.tensor(w) for w in (W1, b1, W2, b2, gamma, beta)]


def torch_sublayer(x, post):
    W1_t, b1_t, W2_t, b2_t, g_t, be_t = params_t
    ffn_t = lambda h: F.linear(F.relu(F.linear(h, W1_t, b1_t)), W2_t, b2_t)  # noqa: E731
    norm_t = lambda h: F.layer_norm(h, (Dr,), g_t, be_t, eps_ln)  # noqa: E731
    return norm_t(x + ffn_t(x)) if post else x + ffn_t(norm_t(x))


for name, post, dx_mine in (("post-norm", True, post_dx), ("pre-norm", False, pre_dx)):
    x_t = torch.tensor(x_rows, requires_grad=True)
    torch_sublayer(x_t, post).backward(torch.from_numpy(dout_rows))
    diff = np.abs(dx_mine - x_t.grad.numpy()).max()
    print(f"{name:9}  dx from the Jacobians vs autograd {diff:.1e}")
    assert diff <= 1e-13
print(f"post-norm and pre-norm gradients differ by {np.abs(post_dx - pre_dx).max():.2f}: two different functions")

# %% [markdown]
# `check_pair` draws its own random upstream gradient, so for finite differences we wrap the formula as a
# backward that takes any `dout`:

# %%
for name, forward, formula in (
    (
        "post-norm",
        lambda x: (ln(x + ffn(x)), x),
        lambda d, x: np.stack([(np.eye(Dr) + J_ffn(r).T) @ J_ln(r + ffn(r)).T @ e for r, e in zip(x, d, strict=True)]),
    ),
    (
        "pre-norm",
        lambda x: (x + ffn(ln(x)), x),
        lambda d, x: np.stack([(np.eye(Dr) + J_ln(r).T @ J_ffn(ln(r)).T) @ e for r, e in zip(x, d, strict=True)]),
    ),
):
    fd = check_pair(forward, formula, dict(x=x_rows.copy()), wrt=["x"], max_coords=None)
    print(f"{name:9}  dx from the Jacobians vs finite differences: worst error {fd.worst:.1e}")
    assert fd.worst <= 1e-6

# %% [markdown]
# ## Step 5: the decoder's embedding table
#
# The decoder's input was $x = \sqrt{D}\, E[\mathrm{ids}] + PE$. The sinusoids $PE$ are fixed, so
# the only parameter is the table $E$; `embed_backward` scatters $\sqrt{D}\, dx$ back into the rows
# that were looked up, *adding* where an id occurs more than once (`bos_id` starts both target
# sentences, so its row collects two positions' gradients). Rows of ids that never occurred get zero.
# Token ids are integers, so there is no input gradient to compare at this step.

# %%
embed_grads = embed_backward(dx, dec_cache.embed)
compare("decoder.token_embedding", param_grads={f"decoder.{k}": v for k, v in embed_grads.items()})

# %% [markdown]
# ## Step 6: the encoder
#
# The encoder's output received gradient from both decoder layers' cross-attention; their sum,
# `dmemory`, is where the encoder's backward starts. Against PyTorch's gradient at the encoder's
# output:

# %%
compare("memory (sum over decoder layers)", dmemory, "encoder.final_norm.out")

# %% [markdown]
# From here on it is the decoder again, minus cross-attention: the final norm, then each layer's
# feed-forward and self-attention sublayers in reverse (self-attention without the causal mask, only
# the source padding mask), then the embedding table.

# %%
final_norm_cache = enc_cache.final_norm.norm
dx, dw, db = layer_norm_backward(dmemory, final_norm_cache)
compare(
    "encoder.final_norm", dx, "encoder.final_norm.in", {"encoder.final_norm.weight": dw, "encoder.final_norm.bias": db}
)

for i in reversed(range(cfg.n_encoder_layers)):
    layer, p = enc_cache.layers[i], f"encoder.layers.{i}"

    dx_residual, dy, norm_out = residual_out_backward(dx, out_cache(layer.ffn_out))
    dh, ffn_grads = ffn_backward(dy, layer.ffn)
    dx_ffn, norm_in = residual_in_backward(dh, layer.ffn_in)
    dx = dx_residual + dx_ffn
    step_grads = {f"{p}.ffn_norm.{k}": v for k, v in (norm_in | norm_out).items()}
    compare(f"{p}.ffn", dx, f"{p}.ffn.in", step_grads | {f"{p}.ffn.{k}": v for k, v in ffn_grads.items()})

    dx_residual, dy, norm_out = residual_out_backward(dx, out_cache(layer.self_attn_out))
    dquery, dkey, dvalue, self_grads = multi_head_attention_backward(dy, layer.self_attn)
    dx_self, norm_in = residual_in_backward(dquery + dkey + dvalue, layer.self_attn_in)
    dx = dx_residual + dx_self
    step_grads = {f"{p}.self_attn_norm.{k}": v for k, v in (norm_in | norm_out).items()}
    step_grads |= {f"{p}.self_attn.{k}": v for k, v in self_grads.items()}
    compare(f"{p}.self_attn", dx, f"{p}.self_attn.in", step_grads)

embed_grads = embed_backward(dx, enc_cache.embed)
compare("encoder.token_embedding", param_grads={f"encoder.{k}": v for k, v in embed_grads.items()})

# %% [markdown]
# ## The whole walk
#
# Every parameter of the model has been reached, and every step agrees with PyTorch:

# %%
print(f"{'step':38} {'max|d(input) diff|':>18} {'params':>7} {'max|param diff|':>16} {'error':>9}")
for step, input_diff, n_params, param_diff, worst in table:
    print(f"{step:38} {fmt(input_diff):>18} {n_params:7d} {param_diff:16.1e} {worst:9.1e}")
assert set(grads) == set(np_model.params)

# %% [markdown]
# ## A gradient that should be zero: the key projection's bias
#
# Look at the key bias $b_K$ of any attention. Key $j$ is $k_j = W_K x_j + b_K$, so the score of
# query $i$ against key $j$ is
#
# $$s_{ij} = \frac{q_i \cdot (W_K x_j)}{\sqrt{d_h}} + \frac{q_i \cdot b_K}{\sqrt{d_h}}.$$
#
# The second term is the same for every key $j$ of row $i$: a shift of the whole row, which the
# softmax ignores (walkthrough 01, step 3). So the loss does not depend on $b_K$ at all and its
# gradient is exactly zero. From the gradient side: $db_K = \sum_i q_i \sum_j ds_{ij} / \sqrt{d_h}$,
# and each row of $dS$ sums to zero. In floating point both implementations return rounding noise
# instead of zero, about $10^{-17}$, where the query bias next to it has gradients of order $10^{-2}$:

# %%
print(f"{'tensor':40} {'numpy max|g|':>13} {'torch max|g|':>13} {'q_proj.bias max|g|':>19}")
for name in sorted(k for k in grads if k.endswith("k_proj.bias")):
    q_name = name.replace("k_proj", "q_proj")
    ours, theirs = np.abs(grads[name]).max(), torch_params[name].grad.abs().max().item()
    print(f"{name:40} {ours:13.1e} {theirs:13.1e} {np.abs(grads[q_name]).max():19.1e}")
    assert ours <= 1e-13 * s_scale and theirs <= 1e-13 * s_scale

# %% [markdown]
# This is why the project ([its conventions](../docs/conventions.md)) judges an error against
# $\max(\max|b|, 10^{-3}\, \mathrm{top})$ and not against $\max|b|$ alone: the relative error of one
# rounding noise against another is of order one, and would fail a correct implementation. With the floor,
# the key bias's difference is measured against the size of its neighbours' gradients, where it belongs.

# %%
name = "decoder.layers.0.self_attn.k_proj.bias"
a, b = grads[name], torch_params[name].grad.numpy()
print(f"{name}: max|a - b| / max|b| = {np.abs(a - b).max() / np.abs(b).max():.1e}   (without the floor)")
print(f"{name}: the project's error = {error(a, b):.1e}   (with the floor)")

# %% [markdown]
# ## The model's own backward
#
# `Transformer.backward(dlogits)` is the same walk, written as a plain list of calls
# (`decoder_backward`, then `encoder_backward` on the memory's gradient). It fills `np_model.grads`
# with exactly what we computed step by step:

# %%
np_model.zero_grad()
np_model.forward(src, tgt_in)
np_model.backward(dlogits)
worst = max(np.abs(np_model.grads[k] - grads[k]).max() for k in grads)
print(f"max |model.backward - step-by-step walk| over all {len(grads)} tensors = {worst:.1e}")
assert worst <= 1e-14 * s_scale

# %% [markdown]
# ## Exercises
#
# Answers, worked and checked, are in `examples/answers/03_answers.py`. Check yours with
# `numpy_transformer.gradcheck.check_pair`.
#
# 1. **Cross-entropy by hand.** Write `ce_forward(logits, targets, ignore_index, eps)` and its backward for
#    logits $(N, |\mathcal V|)$, with label smoothing and ignored rows, as derived in step 1. Check it with
#    `check_pair`, and against `cross_entropy_forward` / `cross_entropy_backward`. What is the gradient
#    when every row is ignored?
# 2. **A tied output projection.** With `tie_embeddings=True` the output projection uses the decoder's
#    token table $E$: $z = x E^\top + b$. $E$ is then read twice (the lookup at the input, the projection
#    at the output). Show that its gradient is the sum of `embed_backward`'s scatter and the projection's
#    $dz^\top x$, and check `Transformer(TransformerConfig(..., tie_embeddings=True))` with
#    `gradcheck.check_model`.
# 3. **SiLU, and why its Jacobian is diagonal.** Derive the backward of $\phi(a) = a\, \sigma(a)$
#    ($\sigma$ the logistic sigmoid), check it against `F.silu` under autograd and with `check_pair`, then
#    build its full Jacobian for a vector of 5 entries by finite differences and show it is diagonal.
