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
# # 12. Transformers that see and hear: ViT's patches, CLIP's contrastive loss, Whisper's front end
#
# *Prerequisites:* walkthroughs 01, 01b and 03 (attention, its heads, the backward of a whole encoder). *Time:* 55
# minutes. The symbols are those of [the notation table](../docs/notation.md); local names: $p$ the patch side,
# $N$ the patches of an image, $K = C p^2$ the numbers in one patch, $P$ the width of CLIP's shared space, $s$ its
# logit scale; for sound, $M$ the mel bands and $N$ the frames.
#
# A Transformer reads a sequence of vectors. A text becomes one by a table lookup; an image becomes one by cutting it
# into squares. The Vision Transformer (ViT, google/vit-base-patch16-224) cuts a 224 x 224 image into 14 x 14 patches
# of 16 pixels, maps each patch to a vector with one matrix, puts a learned *class token* in front, adds learned
# positions, and runs BERT's encoder (pre-norm). CLIP (openai/clip-vit-base-patch32) has such a vision tower and a text
# tower side by side, and learns from image-text pairs alone: each image should be closest to its own caption among
# all the captions of the batch, and each caption to its own image. This walkthrough:
#
# 1. cuts an image into patches with one reshape, and shows that a strided convolution is that reshape and a matrix
#    product (checked against `nn.Conv2d`);
# 2. runs a ViT with its class token and positions, checked against `transformers`' `ViTModel`, and looks at what the
#    class token attends to;
# 3. derives the patch embedding's backward and the class token's (checked against autograd);
# 4. runs CLIP's two towers: where the text is pooled (the end token), the cosine similarities, the temperature;
# 5. writes CLIP's contrastive loss and **its backward by hand**, checked against autograd and `CLIPModel`'s loss;
# 6. trains a tiny CLIP on four image-caption pairs with that backward, and watches the diagonal appear;
# 7. then hears: turns a made-up sound into Whisper's input, log-mel frames;
# 8. writes Whisper's two convolutions over time as unfold + matrix product, the second halving the frames, and
#    their backward by hand (checked against autograd of `F.conv1d`);
# 9. draws Whisper's fixed sinusoidal positions;
# 10. runs a tiny Whisper against `transformers`' `WhisperForConditionalGeneration`, and decodes it greedily as
#     `generate()` does.
#
# Everything runs offline on tiny random models built here (`transformers` writes them as checkpoint folders, the
# files the Hub serves); the arithmetic is exactly that of the released models.

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
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402

from examples import plotting  # noqa: E402  (matplotlib with the file-only Agg backend)
from examples.plotting import plt  # noqa: E402
from numpy_transformer import audio, clip, hf, vision  # noqa: E402
from numpy_transformer import generate as nt_generate  # noqa: E402
from numpy_transformer.optim import Adam  # noqa: E402

OUT = Path(os.environ.get("WALKTHROUGH_OUT", "runs/walkthrough_12"))
OUT.mkdir(parents=True, exist_ok=True)
QUICK = os.environ.get("WALKTHROUGH_QUICK") == "1"
np.set_printoptions(precision=4, suppress=True, linewidth=110)
checks = {}  # what -> largest difference from the reference it was checked against
transformers.logging.set_verbosity_error()
torch.manual_seed(0)  # transformers' random init, before our perturbation: the same models every run


def max_diff(a, b) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


def perturbed(model, seed):
    """Random weights everywhere (the init leaves biases at zero and norms at one)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model.eval()


# %% [markdown]
# ## 0. Four small pictures
#
# Our images are 32 x 32 pixels with 3 colour channels, drawn here: a red square, a blue disc, green stripes and a
# yellow cross. Pixel values are centred near zero, as an image processor leaves them. Layout (B, C, H, W), as
# PyTorch and `transformers` take images.

# %%
S = 32
yy, xx = np.mgrid[0:S, 0:S] / (S - 1)


def picture(kind: str) -> np.ndarray:
    shape = {
        "square": (abs(xx - 0.5) < 0.25) & (abs(yy - 0.5) < 0.25),
        "disc": (xx - 0.5) ** 2 + (yy - 0.5) ** 2 < 0.09,
        "stripes": (np.floor(xx * 6) % 2) == 0,
        "cross": (abs(xx - 0.5) < 0.1) | (abs(yy - 0.5) < 0.1),
    }[kind]
    colour = {"square": (1, 0, 0), "disc": (0, 0, 1), "stripes": (0, 1, 0), "cross": (1, 1, 0)}[kind]
    rgb = np.stack([shape * c for c in colour]).astype(np.float64)  # (3, S, S), in [0, 1]
    return (rgb - 0.5) / 0.5  # to [-1, 1]


KINDS = ["square", "disc", "stripes", "cross"]
images = np.stack([picture(k) for k in KINDS])  # (4, 3, 32, 32)
print(images.shape)

# %% [markdown]
# ## 1. Patches as tokens
#
# With patches of $p = 8$ pixels, a 32 x 32 image is a 4 x 4 grid: $N = 16$ patches, each $K = 3 \cdot 8 \cdot 8 = 192$
# numbers. Cutting is a reshape: split each image axis into (grid, pixel), bring the two grid axes to the front, and
# flatten each patch, channel first (the order in which a convolution kernel (D, C, p, p) stores its weights). The
# patches are numbered row by row.

# %%
p = 8
B, C, H, W_ = images.shape
grid = H // p
patches = images.reshape(B, C, grid, p, grid, p).transpose(0, 2, 4, 1, 3, 5).reshape(B, grid * grid, C * p * p)
print("patches:", patches.shape)  # (B, N, K)
assert np.array_equal(patches, vision.patches_of(images, p))


def show_grid(path):
    fig, axes = plt.subplots(1, 4, figsize=(9.5, 2.9), layout="constrained")
    for ax, image, kind in zip(axes, images, KINDS, strict=True):
        ax.imshow((image.transpose(1, 2, 0) + 1) / 2)
        for k in range(1, grid):
            ax.axhline(k * p - 0.5, color="white", lw=1)
            ax.axvline(k * p - 0.5, color="white", lw=1)
        for n in range(grid * grid):
            ax.text((n % grid) * p + p / 2 - 0.5, (n // grid) * p + p / 2 - 0.5, str(n), color="grey", fontsize=8,
                    ha="center", va="center")  # fmt: skip
        ax.set_title(kind, fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"each image is a sequence of {grid * grid} patch tokens, numbered row by row", fontsize=11)
    fig.savefig(path, dpi=100)
    plt.close(fig)


show_grid(OUT / "patch_grid.png")

# %% [markdown]
# ViT's patch embedding is `nn.Conv2d(C, D, kernel_size=p, stride=p)`. With the stride equal to the kernel, the
# windows do not overlap: output position $n$ reads exactly patch $n$, and computes $y_n = \mathrm{vec}(X_n)\,
# \mathrm{vec}(W)^\top + b$. So the convolution is one matrix product of the (N, K) patches with the (D, K) kernel.

# %%
D = 16
rng = np.random.default_rng(0)
kernel, kernel_bias = 0.1 * rng.standard_normal((D, C, p, p)), 0.1 * rng.standard_normal(D)
tokens = patches @ kernel.reshape(D, -1).T + kernel_bias  # (B, N, D)
conv = torch.nn.functional.conv2d(torch.tensor(images), torch.tensor(kernel), torch.tensor(kernel_bias), stride=p)
conv_tokens = conv.flatten(2).transpose(1, 2).numpy()  # (B, D, 4, 4) -> (B, 16, D): the order of transformers
checks["patch embedding vs nn.Conv2d"] = max_diff(tokens, conv_tokens)
print("tokens:", tokens.shape, "difference from conv2d:", checks["patch embedding vs nn.Conv2d"])
assert checks["patch embedding vs nn.Conv2d"] < 1e-12

# %% [markdown]
# ## 2. The class token, positions, and a whole ViT
#
# A patch token knows its pixels but not where it sits, so ViT adds a learned position vector per position. It also
# puts one learned vector in front, the *class token* $c$: it has no pixels of its own, and after the layers its
# hidden state is the one that sums up the image (the pooler and a classifier read it). The sequence is
# $[c;\ x_1; \dots; x_N] + E_{\mathrm{pos}}$, $1 + N$ tokens. The layers are pre-norm encoder layers (walkthrough 03's
# with the norm first): $x \mathrel{+}= \mathrm{Attn}(\mathrm{LN}(x))$, $x \mathrel{+}= \mathrm{MLP}(\mathrm{LN}(x))$,
# then a final layer norm, and the pooler $\tanh(h_0 W^\top + b)$.
#
# A tiny ViT in google/vit-base-patch16-224's configuration (exact GELU, layer_norm_eps 1e-12, biases on q, k, v),
# shrunk: D = 16, 4 heads, 2 layers, patches of 8. `transformers` builds it with random weights; the library loads
# the folder, and both run the four images.

# %%
vit_config = transformers.ViTConfig(
    hidden_size=D, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32, image_size=S, patch_size=p,
    layer_norm_eps=1e-12, attn_implementation="sdpa",
)  # fmt: skip
theirs_vit = perturbed(transformers.ViTModel(vit_config).double(), 0)
theirs_vit.save_pretrained(OUT / "tiny_vit")
vit = vision.load(OUT / "tiny_vit", dtype=np.float64)
hidden = vit.forward(images)  # (4, 1 + 16, 16)
pooled = vit.pool(hidden)  # (4, 16)
with torch.no_grad():
    ref = theirs_vit(pixel_values=torch.tensor(images))
checks["ViT last_hidden_state vs transformers"] = max_diff(hidden, ref.last_hidden_state)
checks["ViT pooler_output vs transformers"] = max_diff(pooled, ref.pooler_output)
print("hidden:", hidden.shape, " pooled:", pooled.shape)
assert max(checks["ViT last_hidden_state vs transformers"], checks["ViT pooler_output vs transformers"]) < 1e-12

# %% [markdown]
# What does the class token read? Its row of attention probabilities in the last layer, over the 16 patch tokens,
# laid back on the 4 x 4 grid. (The weights are random, so the pattern means nothing yet; a trained ViT's class token
# attends to the object.)

# %%
probs = vit._caches["layers"][-1].attention.attn.probs  # (B, heads, 1 + N, 1 + N)
from_class = probs[:, :, 0, 1:].mean(axis=1).reshape(B, grid, grid)  # mean over heads, patches only
fig, axes = plt.subplots(2, 4, figsize=(9.5, 5.2), layout="constrained")
for column, (image, attention, kind) in enumerate(zip(images, from_class, KINDS, strict=True)):
    axes[0, column].imshow((image.transpose(1, 2, 0) + 1) / 2)
    axes[0, column].set_title(kind, fontsize=10)
    shown = axes[1, column].imshow(attention, cmap="viridis")
    fig.colorbar(shown, ax=axes[1, column], shrink=0.8)
    for ax in axes[:, column]:
        ax.set_xticks([])
        ax.set_yticks([])
axes[1, 0].set_ylabel("class token's attention\n(last layer, mean of heads)", fontsize=9)
fig.savefig(OUT / "class_token_attention.png", dpi=100)
plt.close(fig)
print(from_class[0])

# %% [markdown]
# ## 3. The backward through patches and the class token
#
# The patch embedding is a linear layer on the patch rows, so its gradients are the linear layer's, every patch of
# every image a row: $dW = \sum_{b,n} dy_{bn}^\top \mathrm{vec}(X_{bn})$, $db = \sum_{b,n} dy_{bn}$. The gradient of
# the pixels is $dy\,W$ put back where each patch came from: the inverse reshape, and nothing adds up, because no
# pixel is in two patches. The class token is one vector read by every image, so its gradient is the sum over the
# batch of position 0's gradient; the position table's is the batch sum at each position.

# %%
dtokens = rng.standard_normal(tokens.shape)  # an upstream gradient (B, N, D)
dkernel = (dtokens.reshape(-1, D).T @ patches.reshape(-1, C * p * p)).reshape(kernel.shape)
dkernel_bias = dtokens.sum(axis=(0, 1))
dpixels = (dtokens @ kernel.reshape(D, -1)).reshape(B, grid, grid, C, p, p).transpose(0, 3, 1, 4, 2, 5)
dpixels = dpixels.reshape(B, C, H, W_)
x_t, k_t, b_t = (torch.tensor(a, requires_grad=True) for a in (images, kernel, kernel_bias))
(F.conv2d(x_t, k_t, b_t, stride=p).flatten(2).transpose(1, 2) * torch.tensor(dtokens)).sum().backward()
checks["patch backward vs autograd"] = max(
    max_diff(dkernel, k_t.grad), max_diff(dkernel_bias, b_t.grad), max_diff(dpixels, x_t.grad)
)
out, cache = vision.patch_embedding_forward(images, kernel, kernel_bias)
library = vision.patch_embedding_backward(dtokens, cache)
checks["patch backward vs numpy_transformer"] = max(
    max_diff(a, b) for a, b in zip(library, (dpixels, dkernel, dkernel_bias), strict=True)
)
dsequence = rng.standard_normal((B, 1 + grid * grid, D))
_, class_cache = vision.prepend_class_token_forward(tokens, theirs_vit.embeddings.cls_token.detach().numpy())
dpatch_tokens, dclass = vision.prepend_class_token_backward(dsequence, class_cache)
checks["class token gradient = batch sum"] = max_diff(dclass.reshape(-1), dsequence[:, 0].sum(axis=0))
print({k: f"{v:.1e}" for k, v in checks.items() if "backward" in k or "class token" in k})
assert checks["patch backward vs autograd"] < 1e-12 and checks["patch backward vs numpy_transformer"] < 1e-12

# %% [markdown]
# ## 4. CLIP's two towers
#
# CLIP's vision tower is the ViT above with three changes: the patch convolution has no bias, a layer norm
# (`pre_layrnorm`, spelled so in the checkpoints) comes before the layers, and the class token's final state is
# normalised (`post_layernorm`) and projected to the shared space by `visual_projection` (no bias). The text tower is
# a GPT-style stack: token and learned position embeddings, pre-norm layers with a **causal** mask and QuickGELU,
# $x\,\sigma(1.702\,x)$, a final layer norm, and `text_projection`. Because of the causal mask only the last token has
# read the whole caption, so the text is pooled at its **end token**. Where that is, `transformers` decides by the
# config: with `eos_token_id` 2 (the value in the released openai/clip-vit-base-patch32 config.json, from before the
# fix of PR 24773) it takes the position of the *largest* id in each row, which works because CLIP's end-of-text
# token is the last id of its vocabulary; with any other `eos_token_id`, the first position holding it. A token
# added to the vocabulary after the end token (id 31 below) fools the legacy rule.

# %%
ids_example = np.array([[5, 31, 7, 30, 1], [4, 30, 8, 1, 1]])  # 30 the end token; 31 a token added later
print("legacy eos 2 (argmax of ids):", clip.end_token_positions(ids_example, 2))
print("eos 30 (first occurrence):   ", clip.end_token_positions(ids_example, 30))

# %% [markdown]
# Our captions, in a vocabulary of eight words, each ending with `<end>`; padded to 5 tokens, the padding masked:

# %%
VOCAB = ["<pad>", "a", "red", "blue", "green", "yellow", "square", "disc", "stripes", "cross", "<end>"]
CAPTIONS = ["a red square", "a blue disc", "green stripes", "a yellow cross"]
T = 5
input_ids = np.zeros((4, T), dtype=np.int64)
mask = np.zeros((4, T), dtype=np.int64)
for row, caption in enumerate(CAPTIONS):
    words = [VOCAB.index(w) for w in caption.split()] + [VOCAB.index("<end>")]
    input_ids[row, : len(words)], mask[row, : len(words)] = words, 1
print(input_ids)
clip_config = transformers.CLIPConfig(
    text_config=dict(vocab_size=len(VOCAB), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                     num_attention_heads=4, max_position_embeddings=T, eos_token_id=VOCAB.index("<end>"),
                     pad_token_id=0, bos_token_id=1),
    vision_config=dict(hidden_size=D, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                       image_size=S, patch_size=p),
    projection_dim=8, attn_implementation="sdpa",
)  # fmt: skip
theirs_clip = perturbed(transformers.CLIPModel(clip_config).double(), 1)
theirs_clip.save_pretrained(OUT / "tiny_clip")
model = clip.load(OUT / "tiny_clip", dtype=np.float64)
out = model.forward(input_ids, images, attention_mask=mask, return_loss=True)
with torch.no_grad():
    ref = theirs_clip(input_ids=torch.tensor(input_ids), pixel_values=torch.tensor(images),
                      attention_mask=torch.tensor(mask), return_loss=True)  # fmt: skip
checks["CLIP logits_per_image vs transformers"] = max_diff(out.logits_per_image, ref.logits_per_image)
checks["CLIP loss vs transformers"] = max_diff(out.loss, ref.loss)
print("logits_per_image (images x captions):\n", out.logits_per_image)
assert checks["CLIP logits_per_image vs transformers"] < 1e-12 and checks["CLIP loss vs transformers"] < 1e-12

# %% [markdown]
# The logits are cosines times a temperature: with $\hat t_j$ and $\hat\imath_k$ the unit text and image embeddings,
# $L_{jk} = e^{s}\,\hat t_j \cdot \hat\imath_k$, and $s$ = `logit_scale` is learned (it starts at $\log(1/0.07)$,
# so $e^s \approx 14.3$: cosines in [-1, 1] become logits in about [-14, 14]).
#
# ## 5. The contrastive loss and its backward, by hand
#
# In a batch of $N$ pairs the right answers are on the diagonal. Each caption should pick its image (a softmax over
# the row of $L$), and each image its caption (a softmax over the column); the loss is the mean of the two
# cross-entropies:
#
# $$\mathcal{L} = \frac{1}{2N}\sum_k \Big[\Big(\log\sum_j e^{L_{kj}} - L_{kk}\Big) + \Big(\log\sum_j e^{L_{jk}} -
# L_{kk}\Big)\Big].$$
#
# A cross-entropy's gradient with respect to its logits is softmax minus one-hot, divided by the count. Here each
# entry of $L$ sits in one row and one column, so it gets both:
#
# $$dL = \frac{1}{2N}\big(P^{\mathrm{row}} - I + P^{\mathrm{col}} - I\big).$$
#
# Then back through $L = e^s \hat T \hat I^\top$: $d\hat T = e^s\, dL\, \hat I$, $d\hat I = e^s\, dL^\top \hat T$, and
# $ds = \sum_{jk} dL_{jk} L_{jk}$ ($e^s$ is its own derivative).

# %%
L = out.logits_per_text  # (captions, images)
n = L.shape[0]


def softmax(z, axis):
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


P_row, P_col = softmax(L, 1), softmax(L, 0)
loss = -(np.log(np.diag(P_row)).mean() + np.log(np.diag(P_col)).mean()) / 2
dL = (P_row - np.eye(n) + P_col - np.eye(n)) / (2 * n)
scale = np.exp(model.params["logit_scale"])
dT, dI = scale * dL @ out.image_embeds, scale * dL.T @ out.text_embeds
ds = (dL * L).sum()
L_t = torch.tensor(L, requires_grad=True)
target = torch.arange(n)
((F.cross_entropy(L_t, target) + F.cross_entropy(L_t.T, target)) / 2).backward()
checks["contrastive loss by hand vs library"] = max_diff(loss, out.loss)
checks["dL by hand vs autograd"] = max_diff(dL, L_t.grad)
model.zero_grad()
model.backward(dloss=1.0)
with torch.enable_grad():
    theirs_loss = theirs_clip(input_ids=torch.tensor(input_ids), pixel_values=torch.tensor(images),
                              attention_mask=torch.tensor(mask), return_loss=True).loss  # fmt: skip
    theirs_loss.backward()
checks["ds by hand vs transformers' logit_scale grad"] = max_diff(ds, theirs_clip.logit_scale.grad)
named = dict(theirs_clip.named_parameters())
checks["every CLIP gradient vs transformers"] = max(max_diff(g, named[k].grad) for k, g in model.grads.items())
print(f"loss {loss:.4f};  dL =\n{dL}")
print({k: f"{v:.1e}" for k, v in checks.items() if "CLIP" in k or "hand" in k})
assert max(checks[k] for k in checks if "hand" in k or "every CLIP" in k) < 1e-12

# %% [markdown]
# Two things to see in $dL$. Each row and each column sums to zero (a softmax minus a one-hot sums to zero), so
# raising every logit together changes nothing. And the diagonal is negative while everything else is positive: the
# descent step raises the matching pairs and lowers the rest, in proportion to how much probability each wrong pair
# took. That is all CLIP's training signal is.
#
# ## 6. Training the tiny CLIP: the diagonal appears
#
# Adam on every parameter, the four pairs as one batch, the gradient of each step from the backward above (the
# library runs the rest of the chain back through both towers). The similarity matrix before and after:

# %%
before = softmax(model.forward(input_ids, images, attention_mask=mask).logits_per_image, 1)
optimizer = Adam(model.params, lr=3e-3)
losses = []
for _ in range(30 if QUICK else 150):
    out = model.forward(input_ids, images, attention_mask=mask, return_loss=True)
    losses.append(float(out.loss))
    model.zero_grad()
    model.backward(dloss=1.0)
    optimizer.step(model.grads)
after = softmax(model.forward(input_ids, images, attention_mask=mask).logits_per_image, 1)
print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} in {len(losses)} steps; exp(logit_scale) now "
      f"{np.exp(model.params['logit_scale']):.2f}")  # fmt: skip
plotting.plot_matrices(
    {"before training": before, "after training": after}, OUT / "similarity.png",
    "CLIP: p(caption | image)", row_labels=[f"image: {k}" for k in KINDS], col_labels=[f"'{k}'" for k in KINDS],
)  # fmt: skip
assert losses[-1] < 0.5 * losses[0] and (after.argmax(axis=1) == np.arange(4)).all()

# %% [markdown]
# In `similarity.png`, rows are the images, columns the captions, named by their last word.
#
# (Four pairs are learnt by heart, of course: CLIP's 400 million pairs make the same loss teach concepts.)

# %% [markdown]
# ## 7. Transformers that hear: Whisper's input
#
# Whisper (openai/whisper-tiny and its larger siblings) is an encoder-decoder, walkthrough 03's with the norms
# first. Its decoder writes text tokens, as any decoder does; its encoder reads sound. Sound reaches it as a
# *log-mel spectrogram*: the waveform (16 000 samples a second) is cut into windows of 25 ms, one every 10 ms; each
# window's spectrum is summed into $M = 80$ bands spaced evenly in pitch (the mel scale: equal steps sound equal),
# and the logarithm is taken. One second makes 100 *frames*, each a column of 80 numbers: the input is (B, M, N), a
# picture of time and pitch. (Whisper pads or cuts every clip to 30 seconds, $N = 3000$.)
#
# We make two sounds of one second here, a tone that rises (a chirp) over a steady high one, and a low hum that
# jumps up halfway, each with a little noise, and turn them into log-mel frames with NumPy. The filters below are
# triangles spaced on the mel scale $2595 \log_{10}(1 + f/700)$; Whisper's processor uses slightly different ones
# (librosa's), but the arithmetic is the same, and the last lines of `log_mel_of` are Whisper's own scaling (clamp
# to 8 below the maximum, then $(x + 4) / 4$).

# %%
rate, hop, window = 16_000, 160, 400  # samples per second; 10 ms hop; 25 ms window
M = 80  # mel bands


def mel(f):
    return 2595 * np.log10(1 + f / 700)


edges = 700 * (10 ** (np.linspace(mel(0), mel(rate / 2), M + 2) / 2595) - 1)  # M + 2 band edges, in Hz
freqs = np.fft.rfftfreq(window, 1 / rate)  # (201,): 0, 40, ..., 8000 Hz
lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
filters = np.maximum(0, np.minimum((freqs - lower) / (centre - lower), (upper - freqs) / (upper - centre)))


def log_mel_of(signal):
    """A waveform (samples,) -> log-mel frames (M, frames)."""
    starts = hop * np.arange(1 + (len(signal) - window) // hop)  # whole windows only
    frames = signal[starts[:, None] + np.arange(window)] * np.hanning(window)  # (frames, 400)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2  # (frames, 201)
    log_mel = np.log10(np.maximum(filters @ power.T, 1e-10))  # (M, frames): bands x frames
    log_mel = np.maximum(log_mel, log_mel.max() - 8.0)
    return (log_mel + 4.0) / 4.0


t = np.arange(rate) / rate  # one second
noise = 0.05 * np.random.default_rng(3).standard_normal(rate)
rising = np.sin(2 * np.pi * (200 + 1500 * t) * t) + 0.5 * np.sin(2 * np.pi * 3000 * t) + noise
hum = np.sin(2 * np.pi * 120 * t) * (t < 0.5) + np.sin(2 * np.pi * 600 * t) * (t >= 0.5) + noise
N = 96  # an even number of frames (the encoder halves them); one second makes 98 whole windows
features = np.stack([log_mel_of(rising)[:, :N], log_mel_of(hum)[:, :N]])  # (2, M, N)
fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.0), layout="constrained", sharey=True)
for ax, frames, name in zip(axes, features, ["a rising tone over a steady one", "a hum that jumps"], strict=True):
    shown = ax.imshow(frames, origin="lower", aspect="auto", cmap="magma", vmin=features.min(), vmax=features.max())
    ax.set_xlabel("frame (10 ms each)")
    ax.set_title(name, fontsize=10)
axes[0].set_ylabel("mel band")
fig.colorbar(shown, ax=axes)
fig.savefig(OUT / "log_mel.png", dpi=100)
plt.close(fig)
print("features:", features.shape)  # (B, M, N)

# %% [markdown]
# ## 8. Two convolutions over time, the second one halving
#
# The encoder's front end is two 1-D convolutions over the frames, each followed by GELU: conv1 maps the 80 bands to
# $D$ channels (kernel 3, padding 1), conv2 maps $D$ to $D$ with kernel 3, padding 1 and **stride 2**. A 1-D
# convolution is what ViT's patch embedding was, with windows that now overlap: output position $t$ reads frames
# $ts - 1, ts, ts + 1$ (padding 1 puts a zero frame at each end), all channels. Put those three frames side by side
# as one row of $3C$ numbers (*unfold*), and the convolution is again one matrix product with the kernel
# flattened to (C_out, 3 C_in). The output length is $\lfloor (N + 2 - 3)/s \rfloor + 1$: $N$ for conv1, $N/2$ for
# conv2. So 3000 frames become 1500 encoder positions, here 96 become 48.
# (Below, the GELU between the two is left out, to keep the check to the convolutions; the library's
# `audio.audio_embed_forward` has it.)

# %%
Dw = 24  # Whisper's d_model, tiny here (384 in whisper-tiny)
w1, b1 = 0.1 * rng.standard_normal((Dw, M, 3)), 0.1 * rng.standard_normal(Dw)


def unfolded(x, stride):
    """x (B, C, N) -> (B, N_out, C * 3): row t holds x[:, :, ts - 1 : ts + 2], padding 1, channel-major."""
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1)))
    n_out = (x.shape[2] + 2 - 3) // stride + 1
    taps = np.stack([xp[:, :, k : k + stride * (n_out - 1) + 1 : stride] for k in range(3)], axis=-1)
    return taps.transpose(0, 2, 1, 3).reshape(x.shape[0], n_out, -1)


cols = unfolded(features, 1)  # (B, N, 3M)
z1 = (cols @ w1.reshape(Dw, -1).T + b1).transpose(0, 2, 1)  # (B, D, N)
reference_z1 = F.conv1d(torch.tensor(features), torch.tensor(w1), torch.tensor(b1), padding=1).numpy()
checks["conv1 as unfold @ kernel vs F.conv1d"] = max_diff(z1, reference_z1)
w2 = 0.1 * rng.standard_normal((Dw, Dw, 3))
z2 = (unfolded(z1, 2) @ w2.reshape(Dw, -1).T).transpose(0, 2, 1)  # (B, D, N / 2)
checks["conv2 (stride 2) vs F.conv1d"] = max_diff(z2, F.conv1d(torch.tensor(z1), torch.tensor(w2), stride=2, padding=1))
print("frames", features.shape[2], "-> conv1", z1.shape[2], "-> conv2", z2.shape[2])
assert (
    z2.shape[2] == N // 2
    and max(checks["conv1 as unfold @ kernel vs F.conv1d"], checks["conv2 (stride 2) vs F.conv1d"]) < 1e-12
)

# %% [markdown]
# The backward is a linear layer's on the unfolded rows: $dW = dY^\top X_{\mathrm{cols}}$ (reshaped to the kernel),
# $db = \sum_{b,t} dY_{bt}$, $dX_{\mathrm{cols}} = dY\, W_{\mathrm{flat}}$. Then each column of $dX_{\mathrm{cols}}$
# goes back to the frame it was copied from. Here is the difference from patches: the windows overlap, so a frame
# was copied into several rows (three with stride 1; one or two with stride 2), and its gradient is the **sum** of
# its copies' gradients. The padding's gradient is dropped.

# %%
dz = rng.standard_normal(z2.shape)  # an upstream gradient of conv2's output (B, D, N / 2)
dy = dz.transpose(0, 2, 1)  # (B, N / 2, D)
cols2 = unfolded(z1, 2)
dw2 = (dy.reshape(-1, Dw).T @ cols2.reshape(-1, 3 * Dw)).reshape(w2.shape)
dcols = (dy @ w2.reshape(Dw, -1)).reshape(*dy.shape[:2], Dw, 3)  # (B, N / 2, D, 3): one slice per tap
dz1 = np.zeros((z1.shape[0], Dw, z1.shape[2] + 2))  # padded, (B, D, N + 2)
for k in range(3):  # tap k of row t read padded frame 2t + k: its gradient goes back there, and adds
    dz1[:, :, k : k + 2 * (dy.shape[1] - 1) + 1 : 2] += dcols[:, :, :, k].transpose(0, 2, 1)
dz1 = dz1[:, :, 1:-1]  # the padding's gradient dropped
z1_t, w2_t = torch.tensor(z1, requires_grad=True), torch.tensor(w2, requires_grad=True)
(F.conv1d(z1_t, w2_t, stride=2, padding=1) * torch.tensor(dz)).sum().backward()
checks["conv backward by hand vs autograd"] = max(max_diff(dz1, z1_t.grad), max_diff(dw2, w2_t.grad))
_, conv_cache = audio.conv1d_forward(z1, w2, None, stride=2, padding=1)
library = audio.conv1d_backward(dz, conv_cache)
checks["conv backward vs numpy_transformer"] = max(max_diff(dz1, library[0]), max_diff(dw2, library[1]))
print({k: f"{v:.1e}" for k, v in checks.items() if "conv" in k})
assert checks["conv backward by hand vs autograd"] < 1e-12 and checks["conv backward vs numpy_transformer"] < 1e-12
assert np.abs(dz1).max() > 0

# %% [markdown]
# ## 9. Fixed positions
#
# After the convolutions, position $t$ of the encoder gets a position vector added, as ViT's patches did. ViT learns
# its table; Whisper's encoder uses a fixed one, sines and cosines of $t$ at $D/2$ frequencies spaced geometrically
# from 1 down to 1/10 000: $PE[t, i] = \sin(t\,\omega_i)$, $PE[t, D/2 + i] = \cos(t\,\omega_i)$ with $\omega_i =
# 10000^{-i/(D/2 - 1)}$ (all sines first, then all cosines, unlike the interleaved table of the original
# Transformer). Being fixed, it has no gradient. whisper-tiny's table, 1500 positions by 384 channels:

# %%
table = audio.whisper_sinusoids(1500, 384)
half = 192
omega = np.exp(-np.log(10000.0) * np.arange(half) / (half - 1))
by_hand = np.concatenate([np.sin(np.arange(1500)[:, None] * omega), np.cos(np.arange(1500)[:, None] * omega)], 1)
checks["sinusoid table by hand vs library"] = max_diff(by_hand, table)
fig, ax = plt.subplots(figsize=(7.5, 3.4), layout="constrained")
shown = ax.imshow(table.T, aspect="auto", cmap="RdBu", vmin=-1, vmax=1, interpolation="nearest")
fig.colorbar(shown, ax=ax)
ax.set_xlabel("encoder position t (20 ms each)")
ax.set_ylabel("channel (sines, then cosines)")
ax.set_title(r"Whisper's fixed positions: $\sin(t\,\omega_i)$, then $\cos(t\,\omega_i)$", fontsize=10)
fig.savefig(OUT / "whisper_positions.png", dpi=100)
plt.close(fig)
assert checks["sinusoid table by hand vs library"] < 1e-12

# %% [markdown]
# In `whisper_positions.png`, the first channels turn fast (one turn every $2\pi$ positions) and the last ones barely
# move: nearby positions differ in the fast channels, distant ones in the slow.
#
# ## 10. A tiny Whisper, against `transformers`
#
# Everything after the front end is known: pre-norm encoder layers (no mask: every frame is read), a final norm,
# then a decoder with learned positions, causal self-attention, cross-attention over the encoder's output, and an
# output projection tied to its token table. `transformers` builds a tiny `WhisperForConditionalGeneration` in
# whisper-tiny's configuration (6 heads, exact GELU), shrunk; the library loads the folder and reads our two
# log-mel inputs. Both compute in float64.

# %%
whisper_config = transformers.WhisperConfig(
    vocab_size=120, num_mel_bins=M, d_model=Dw, encoder_layers=2, decoder_layers=2, encoder_attention_heads=6,
    decoder_attention_heads=6, encoder_ffn_dim=48, decoder_ffn_dim=48, max_source_positions=N // 2,
    max_target_positions=24, pad_token_id=110, bos_token_id=110, eos_token_id=110, decoder_start_token_id=111,
    begin_suppress_tokens=None, suppress_tokens=None, init_std=0.3,
)  # fmt: skip
theirs_whisper = transformers.WhisperForConditionalGeneration(whisper_config).double().eval()
theirs_whisper.save_pretrained(OUT / "tiny_whisper")
whisper = hf.load(OUT / "tiny_whisper", dtype=np.float64)
tgt = np.array([[111, 5, 17, 42], [111, 9, 9, 3]])  # the decoder's tokens, the start token first
logits = whisper.forward(features, tgt)  # (2, 4, 120)
with torch.no_grad():
    ref_logits = theirs_whisper(input_features=torch.tensor(features), decoder_input_ids=torch.tensor(tgt)).logits
checks["Whisper logits vs transformers"] = max_diff(logits, ref_logits)
print(type(whisper).__name__, "logits:", logits.shape, f"difference {checks['Whisper logits vs transformers']:.1e}")
assert checks["Whisper logits vs transformers"] < 1e-10

# %% [markdown]
# Decoding is the text decoder's: start from the decoder start token and append the most likely next token, the
# encoder run once. `numpy_transformer.generate` takes the features where a translation model takes source ids;
# `generate()` of `transformers` returns the tokens after the start token.

# %%
ours_tokens = nt_generate(whisper, features, max_new_tokens=8, do_sample=False, num_beams=1)
theirs_tokens = theirs_whisper.generate(input_features=torch.tensor(features), max_new_tokens=8, do_sample=False,
                                        num_beams=1).numpy()  # fmt: skip
print("ours:  ", ours_tokens[:, 1:].tolist(), "\ntheirs:", theirs_tokens.tolist())
assert (ours_tokens[:, 0] == 111).all() and np.array_equal(ours_tokens[:, 1:], theirs_tokens)
assert len({tuple(row) for row in theirs_tokens}) > 1  # the two sounds took different paths

# %% [markdown]
# ## Summary
#
# - An image becomes tokens by cutting it into patches; the patch embedding, a convolution of stride = kernel, is one
#   matrix product of the patch rows, and its backward puts each patch's gradient back where the patch was.
# - A learned class token in front gathers the image; its gradient is the sum over the batch. Positions are a
#   learned table, one row per patch position.
# - CLIP pools its text at the end token (legacy configs: the largest id), projects both towers into one space, and
#   compares unit vectors: $L = e^s\, \hat T \hat I^\top$.
# - The contrastive loss is two cross-entropies against the diagonal, and its gradient
#   $dL = (P^{\mathrm{row}} + P^{\mathrm{col}} - 2I)/2N$.
# - Sound becomes a picture first: log-mel frames (M, N), one column every 10 ms. Whisper's two convolutions over
#   time are unfold + matrix product; the second, of stride 2, halves the frames. Their windows overlap, so in the
#   backward a frame's gradient is the sum over every window that read it.
# - Whisper's encoder positions are fixed sinusoids (sines, then cosines), with no gradient; the rest is the
#   pre-norm encoder-decoder of walkthrough 03, decoded like any text decoder.
#
# The checks, collected:

# %%
for name, error in checks.items():
    print(f"{name:45} {error:.1e}")

# %% [markdown]
# ## Exercises
#
# Answers, worked and checked, are in `examples/answers/12_answers.py`.
#
# 1. **QuickGELU's backward.** CLIP's activation is $y = x\,\sigma(1.702\,x)$. Derive $dx$ and write
#    `quick_gelu_backward(dout, x)`; check it against finite differences and against torch's autograd.
# 2. **One direction only.** Some models (SigLIP's ancestors, retrieval losses) keep only the images-choose-captions
#    half: $\mathcal{L}_I = \mathrm{CE}(L^\top, \mathrm{diag})$. Write its gradient with respect to $L$ (B_t, B_i) and
#    check it against autograd of `F.cross_entropy(L.T, arange(N))`; which of $P^{\mathrm{row}}$ and
#    $P^{\mathrm{col}}$ does it use?
# 3. **The convolution's backward is a convolution.** For conv1 (stride 1, padding 1, kernel 3), show that the
#    gradient of its input is itself a convolution of $dY$ (padding 1) with the kernel flipped in time and its two
#    channel axes swapped, $W'_{c,o,k} = W_{o,c,2-k}$. Check it against autograd of `F.conv1d`, against
#    `F.conv_transpose1d`, and against `numpy_transformer.audio.conv1d_backward`.
