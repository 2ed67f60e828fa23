# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 4. Training in pure NumPy, then reading the attention maps
#
# *Prerequisites:* walkthroughs 01, 01b and 03 (what the backward pass computes); the notation is
# [the project's table](../docs/notation.md). *Time:* 20 minutes to read; the quick run takes about
# 20 seconds, the full run a few minutes.
#
# The first walkthroughs checked the gradients. This one uses them: we train the hand-written NumPy
# Transformer to read numbers aloud,
#
#     "29,284.30"  ->  "twenty-nine thousand two hundred eighty-four point three zero"
#
# and then look inside it. The source is a string of characters (digits, "," and "."), the target
# a sequence of English words. To get it right the model has to find, for each word it writes, the
# digits that word is about: exactly what cross-attention is for, and what its maps will show.
#
# Every step of the loop below is a NumPy call you can read: `model.forward`, the cross-entropy,
# `model.backward` (the hand-written backward of the whole network), gradient clipping, Adam and the
# paper's learning-rate schedule. Three ways to run it:
#
# - `python examples/04_training_and_attention_maps.py`: trains the model (d_model 128) for four
#   minutes, then decodes and draws its maps;
# - `WALKTHROUGH_QUICK=1 python examples/04_training_and_attention_maps.py` (the test suite runs this):
#   the loop for 15 steps, to see it run, then decodes and draws the maps of the **small checkpoint
#   shipped with the example**, `examples/data/numbers_small.safetensors`;
# - `WALKTHROUGH_TRAIN_SMALL=1 python examples/04_training_and_attention_maps.py`: trains that small
#   checkpoint (d_model 64, 3,000 steps, a few minutes on 2 cores) and writes it there, with its loss
#   history (the curve drawn below).

# %%
import json
import os
import sys
import time
from pathlib import Path

# The checkout's root: examples/ is a folder of scripts there, not an installed package.
sys.path.insert(0, str((Path(__file__).parent if "__file__" in globals() else Path.cwd()).resolve().parent))

import numpy as np  # noqa: E402

import numpy_transformer as nt  # noqa: E402
from examples import plotting, tasks  # noqa: E402
from numpy_transformer import optim  # noqa: E402
from numpy_transformer.checkpoint import load_into, save_checkpoint  # noqa: E402

QUICK = os.environ.get("WALKTHROUGH_QUICK") == "1"
TRAIN_SMALL = os.environ.get("WALKTHROUGH_TRAIN_SMALL") == "1"  # writes the shipped checkpoint
SMALL = QUICK or TRAIN_SMALL  # the small model: the shipped checkpoint's size
HERE = Path(__file__).parent if "__file__" in globals() else Path.cwd() / "examples"
CHECKPOINT = HERE.resolve() / "data" / "numbers_small.safetensors"
OUT = Path(os.environ.get("WALKTHROUGH_OUT", "runs/walkthrough_04"))
OUT.mkdir(parents=True, exist_ok=True)
np.set_printoptions(precision=3, suppress=True)

# %% [markdown]
# ## The data
#
# `make_numbers_dataset` samples numbers of every magnitude (the number of digits is drawn first,
# so "7" is as likely a length as "123,456"), a third of them with one or two decimals, and splits
# them so that no test number is ever seen in training. The vocabularies come from the converter's
# own tables, so every word the test set needs is known. Ids 0, 1, 2 are `<pad>`, `<bos>`, `<eos>`.
# Every mode draws the same splits, so the shipped checkpoint never saw the numbers it is tested on.

# %%
splits = tasks.make_numbers_dataset(40_000, 200, 500, max_value=999_999, seed=0)
n_test = 100 if QUICK else 500
src_vocab, tgt_vocab = tasks.build_vocabs(splits.train)
for source, target in splits.train[:4]:
    print(f"{source:>12}  ->  {target}")
print(f"source vocabulary: {len(src_vocab)} characters; target vocabulary: {len(tgt_vocab)} words")

# %% [markdown]
# A batch is three padded integer arrays. The decoder reads `tgt_in` (the target shifted right,
# starting with `<bos>`) and must predict `tgt_out` (the target followed by `<eos>`): at position t
# it has seen the words before t and is asked for word t, which the causal mask enforces.

# %%
src_ids, tgt_in, tgt_out = tasks.encode_batch(splits.train[:2], src_vocab, tgt_vocab)
print("src_ids\n", src_ids, "\ntgt_in\n", tgt_in, "\ntgt_out\n", tgt_out)

# %% [markdown]
# ## The model
#
# The paper's architecture at a small size: 2 encoder and 2 decoder layers, d_model 128, 4 heads,
# d_ff 512 (d_model 64 and d_ff 128 for the small model), post-norm, ReLU, sinusoidal positions,
# dropout 0.1, float32. The model object holds its
# parameters in a dict keyed by the same names torch_transformer uses.

# %%
S, T = tasks.max_lengths(splits.train + splits.val + splits.test, src_vocab, tgt_vocab)
config = nt.TransformerConfig(
    src_vocab_size=len(src_vocab),
    tgt_vocab_size=len(tgt_vocab),
    d_model=64 if SMALL else 128,
    n_heads=4,
    d_ff=128 if SMALL else 512,
    n_encoder_layers=2,
    n_decoder_layers=2,
    dropout=0.1,
    max_len=max(S, T) + 1,
)
model = nt.Transformer(config, seed=0, dtype=np.float32)
n_params = sum(p.size for p in model.params.values())
print(f"{n_params:,} parameters in {len(model.params)} tensors")

# %% [markdown]
# ## The training loop
#
# Adam with $\beta_2 = 0.98$ and $\epsilon = 10^{-9}$, and the paper's learning-rate schedule
# (section 5.3, in its own words: the step counts from 1, warmup is the number of warm-up steps,
# factor a constant scale):
#
# $$\eta(\mathrm{step}) = \mathrm{factor} \cdot d_{model}^{-1/2} \cdot
# \min\left(\mathrm{step}^{-1/2},\; \mathrm{step} \cdot \mathrm{warmup}^{-3/2}\right)$$
#
# a linear warm-up for $\mathrm{warmup}$ steps, then a decay with the inverse square root of the step; the two
# branches meet at $\mathrm{step} = \mathrm{warmup}$, where the rate peaks at $\mathrm{factor}\, (d_{model} \cdot
# \mathrm{warmup})^{-1/2}$. Label smoothing 0.1 (the paper's value; its gradient is derived in walkthrough
# 03); padding positions of the target are ignored by the loss. Each line of the loop is one call.

# %%
factor, warmup = 0.5, 400
plot_steps = np.arange(1, 4_001)
rates = [optim.noam_rate(int(n), config.d_model, warmup, factor) for n in plot_steps]
plotting.plot_schedule(plot_steps, rates, OUT / "schedule.png", warmup=warmup)
peak = factor * (config.d_model * warmup) ** -0.5
print(
    f"peak rate {max(rates):.2e} at step {int(np.argmax(rates)) + 1} (formula: {peak:.2e}); schedule drawn to",
    "schedule.png",
)
assert abs(max(rates) - peak) <= 1e-12 and int(np.argmax(rates)) + 1 == warmup

# %%
optimizer = optim.Adam(model.params, lr=1.0, betas=(0.9, 0.98), eps=1e-9)  # the schedule gives the whole rate
schedule = optim.NoamLR(optimizer, config.d_model, warmup=warmup, factor=factor)
budget_seconds, max_steps = (10, 15) if QUICK else (3_600, 3_000) if TRAIN_SMALL else (240, 4_000)
rng = np.random.default_rng(0)
val_batch = tasks.encode_batch(splits.val, src_vocab, tgt_vocab)  # 200 numbers the loop never trains on


def validation_loss() -> float:
    """The same label-smoothed loss on the validation numbers, dropout off (eval mode)."""
    src_ids, tgt_in, tgt_out = val_batch
    logits = model.eval().forward(src_ids, tgt_in)  # (B, T, V)
    return float(nt.cross_entropy_forward(logits, tgt_out, config.pad_id, label_smoothing=0.1)[0])


losses, val_steps, val_losses, step, start = [], [], [], 0, time.perf_counter()
while step < max_steps and time.perf_counter() - start < budget_seconds:
    for batch in tasks.batches(splits.train, 64, rng):
        src_ids, tgt_in, tgt_out = tasks.encode_batch(batch, src_vocab, tgt_vocab)
        logits = model.train().forward(src_ids, tgt_in)  # (B, T, V)
        loss, cache = nt.cross_entropy_forward(logits, tgt_out, config.pad_id, label_smoothing=0.1)
        model.zero_grad()
        model.backward(nt.cross_entropy_backward(cache))  # every gradient, by hand
        optim.clip_grad_norm(model.grads, 1.0)
        optimizer.step(model.grads)
        schedule.step()
        losses.append(float(loss))
        step += 1
        if step % 250 == 0:
            if not QUICK:  # a few validation points for the loss curve (the quick run is too short for them)
                val_steps.append(step)
                val_losses.append(validation_loss())
            print(f"step {step}: loss {np.mean(losses[-50:]):.3f}, lr {optimizer.lr:.2e}")
        if step >= max_steps or time.perf_counter() - start >= budget_seconds:
            break
print(f"{step} steps in {time.perf_counter() - start:.0f} s, final loss {np.mean(losses[-20:]):.3f}")
plotting.plot_loss_curve(
    list(range(1, step + 1)),
    losses,
    OUT / "loss_curve.png",
    val_steps=val_steps,
    val_losses=val_losses,
    title=f"training loss of this run ({step} steps)",
)
model = model.eval()

# %% [markdown]
# ## The model we read: trained, or plainly not
#
# Fifteen steps teach a Transformer nothing: its exact match is 0 and its attention maps are noise
# around uniform rows. So in quick mode we now swap in the small checkpoint this example ships,
# trained by this very script (`WALKTHROUGH_TRAIN_SMALL=1`, 3,000 steps of the loop above at d_model
# 64) and saved with `numpy_transformer.checkpoint.save_checkpoint` (weights, config, and how it was
# made, in one safetensors file). If the file is missing, we keep the 15-step model and say so.

# %%
TRAINED = not QUICK
if TRAIN_SMALL:
    CHECKPOINT.parent.mkdir(parents=True, exist_ok=True)
    command = "WALKTHROUGH_TRAIN_SMALL=1 python examples/04_training_and_attention_maps.py"
    every = 10  # the loss history: the mean training loss of each block of 10 steps, and the validation points
    history = {
        "every": every,
        "steps": list(range(every, step + 1, every)),
        "train_loss": [round(float(np.mean(losses[i - every : i])), 4) for i in range(every, step + 1, every)],
        "val_steps": val_steps,
        "val_loss": [round(v, 4) for v in val_losses],
    }
    made = {
        "steps": str(step),
        "seconds": f"{time.perf_counter() - start:.0f}",
        "command": command,
        "loss_history": history,
    }
    save_checkpoint(CHECKPOINT, model, made)
    print(f"wrote {CHECKPOINT} ({CHECKPOINT.stat().st_size / 1024:.0f} KiB) after {step} steps")
elif QUICK and CHECKPOINT.exists():
    made = load_into(model, CHECKPOINT)  # checks the file's config is the quick mode's, then loads its weights
    history = json.loads(made["loss_history"])  # how it was made: steps, seconds, command, loss history
    TRAINED = True
    print(f"loaded {CHECKPOINT.name} ({CHECKPOINT.stat().st_size / 1024:.0f} KiB): the maps are of a trained model")
else:
    history = None
    print(f"{CHECKPOINT.name} is missing: the maps below are of a model trained {step} steps, which learned nothing")

# %% [markdown]
# ## The shipped checkpoint's loss curve
#
# The curve drawn after the loop above is the run just made: in quick mode, 15 steps, the loss still
# near where it starts. The checkpoint carries its whole training history in its metadata, written by
# `WALKTHROUGH_TRAIN_SMALL=1`: the mean training loss of each block of 10 steps, and every 250 steps the
# validation loss (the same label-smoothed cross-entropy, on the 200 validation numbers, dropout off).
# Here is the real curve of the model whose maps we read.
#
# With label smoothing the loss cannot reach 0. The target of a row is
# $q = (1 - \epsilon_{ls})\,\mathrm{onehot}(y) + \epsilon_{ls} / \lvert\mathcal V\rvert$ (walkthrough 03), and the
# loss $-\sum_c q_c \log \mathrm{softmax}(z)_c$ of logits $z$ is smallest when $\mathrm{softmax}(z) = q$
# exactly, where it equals the entropy of $q$: the dotted line.

# %%
if history is not None:
    q = np.full(config.tgt_vocab_size, 0.1 / config.tgt_vocab_size)  # the smoothed target, epsilon_ls = 0.1
    q[0] += 0.9  # the true word's share (which word it is does not change the entropy)
    floor = float(-(q * np.log(q)).sum())
    plotting.plot_loss_curve(
        history["steps"],
        history["train_loss"],
        OUT / "checkpoint_loss_curve.png",
        val_steps=history["val_steps"],
        val_losses=history["val_loss"],
        title=f"the shipped checkpoint's training ({history['steps'][-1]:,} steps, d_model {config.d_model})",
        label=f"training loss (mean of each {history['every']} steps)",
        floor=floor,
        smooth=False,  # already the means of blocks of 10 steps
    )
    train, val = history["train_loss"], history["val_loss"]
    print(f"training loss: {train[0]:.2f} over steps 1-10, {train[-1]:.2f} over the last 10 steps")
    print(f"validation loss: {val[0]:.2f} at step {history['val_steps'][0]}, {val[-1]:.2f} at the end")
    print(f"lowest possible loss (entropy of the smoothed target): {floor:.3f}")
    assert val[-1] < val[0] and train[-1] < train[0] / 3, "the shipped checkpoint's history shows no learning"

# %% [markdown]
# Read against the schedule above: the loss falls fastest while the rate climbs to its peak (step 400)
# and just after, from about 5 to near 1 by step 800; the rest of the 3,000 steps shave off the last
# tenths. The validation loss sits a little below the training loss (no dropout there) and ends within a
# few hundredths of the dotted line: on the label-smoothed loss, the model is close to as good as it can
# be, which the exact match below confirms.

# %% [markdown]
# ## Translating numbers it has never seen
#
# Greedy decoding: start from `<bos>`, run the model, append the most likely word, repeat until
# `<eos>`. `nt.generate` keeps each layer's keys and values of past positions (the KV cache), so
# every step runs the decoder on one new position only.

# %%
src_ids, _, tgt_out = tasks.encode_batch(splits.test[:n_test], src_vocab, tgt_vocab)
pred = nt.generate(model.eval(), src_ids, max_new_tokens=T)
for (source, target), row in list(zip(splits.test[:n_test], pred, strict=True))[:6]:
    guess = " ".join(tgt_vocab.decode(row))
    print(f"{source:>12}  ->  {guess}{'' if guess == target else '   (expected: ' + target + ')'}")
exact = tasks.exact_match(pred, tgt_out, tgt_vocab)
print(f"exact match on {n_test} unseen numbers: {exact:.3f}")
print(f"token accuracy: {tasks.token_accuracy(pred, tgt_out, config.pad_id):.3f}")
if QUICK and TRAINED:
    assert exact >= 0.8, f"the shipped checkpoint should read most numbers right, got exact match {exact:.3f}"

# %% [markdown]
# ## Reading the attention maps
#
# `model.attention_maps()` returns the attention probabilities of the last forward pass, one
# (B, H, T_q, T_k) array per attention module. We run the model on one test number with its own
# translation as the decoder input. The first figure below is the one this section reads: the
# cross-attention of the last decoder layer, averaged over its heads. Below it, every head of every
# module, one figure per module (encoder self-attention, decoder self-attention, cross-attention).
#
# What to look for in that first map: a decoder position reads one word and writes the next, so each
# row is named by **the word being written**, and should put its weight on the characters that word
# reads. We print, for each word written, the
# character it attended to most, marked in brackets in the source string. In the shipped checkpoint:
# writing "thousand", the comma; writing "point", the decimal point; each digit word, its own digit
# (after the point) or the first digit of its group. Words that need no new character (the "hundred"
# of "two hundred", the last word before `<eos>`) park their weight on the source's `<eos>` column, a
# "nothing to read here" slot. The encoder's self-attention tends to look at neighbours and
# separators, which is how a character learns its place value (a "2" three places before a comma
# means "two hundred ... thousand"). An untrained model shows none of this: its rows are nearly
# uniform, and its prints below say so.

# %%
example = [max(splits.test[:50], key=lambda pair: len(pair[0]))]
source = example[0][0]
src_ids, _, _ = tasks.encode_batch(example, src_vocab, tgt_vocab)
words = tgt_vocab.decode(nt.generate(model, src_ids, max_new_tokens=T)[0])
tgt_in = np.array([[tgt_vocab.bos_id] + tgt_vocab.encode(words, add_eos=False)])
model.eval().forward(src_ids, tgt_in)
maps = model.attention_maps()
src_tokens = list(source) + ["<eos>"]
state = "trained" if TRAINED else f"UNTRAINED ({step} steps)"
cross = maps["decoder.layers.1.cross_attn"][0].mean(axis=0)  # (T_q, T_k), averaged over heads
written = words + ["<eos>"]  # row t reads input word t and writes word t + 1: name it by what it writes
plotting.plot_attention_large(
    cross[: len(written), : len(src_tokens)],
    written,
    src_tokens,
    OUT / "cross_attention_main.png",
    title=f"last decoder layer's cross-attention, mean over heads ({state})",
    ylabel="word being written",
    xlabel="source character",
)
paths = plotting.plot_attention_maps(maps, src_tokens, ["<bos>"] + words, OUT, note=state, written_tokens=written)
print(f"{source!r} -> {' '.join(words)!r}; last cross-attention, mean over heads ({state} model):")
for word, row in zip(written, cross, strict=True):
    j = int(row.argmax())
    where = source[:j] + "[" + src_tokens[j] + "]" + source[j + 1 :] if j < len(source) else source + " [<eos>]"
    print(f"writing {word!r:>14}, it looks most at {src_tokens[j]!r:>7} in {where:<16} (weight {row.max():.2f})")
print("attention maps written to", *(Path(p).name for p in paths), sep="\n  ")

# %% [markdown]
# Every row of every map sums to one (softmax over the keys it may see). Source padding never
# receives weight, and in the decoder's self-attention the upper triangle is empty: the causal mask,
# the only mask there (the target's padding comes after its real tokens, where causality hides it).
# These maps are the `probs` saved in the forward pass's cache, the same arrays the backward pass
# used in walkthroughs 1 and 3.

# %%
for name, probs in maps.items():
    assert np.allclose(probs.sum(axis=-1), 1.0, atol=1e-5), name
assert np.all(np.triu(maps["decoder.layers.0.self_attn"][0], k=1) == 0.0)

# %% [markdown]
# ## Exercises
#
# Answers, worked and checked, are in `examples/answers/04_answers.py`.
#
# 1. **The schedule.** Show that the two branches of $\eta$ meet at $\mathrm{step} = \mathrm{warmup}$ and that the peak
#    rate is $\mathrm{factor}\,(d_{model} \cdot \mathrm{warmup})^{-1/2}$; check it against `optim.noam_rate`
#    for $d_{model} = 64$, $\mathrm{warmup} = 400$, $\mathrm{factor} = 0.5$.
# 2. **Gradient clipping is a rescaling.** `optim.clip_grad_norm(grads, 1.0)` multiplies every gradient
#    by $\min(1, 1 / \lVert \nabla\mathcal{L} \rVert)$, where $\lVert \nabla\mathcal{L} \rVert$ is the norm of all
#    gradients together.
#    Verify it on random gradients, and show that clipping does not change the gradients' direction.
# 3. **Attention maps from the library.** Load the shipped checkpoint, run one number through it, and
#    check that `model.attention_maps()["decoder.layers.1.cross_attn"]` rows sum to one and put zero
#    weight on source padding when the batch holds a shorter number padded to a longer one.
