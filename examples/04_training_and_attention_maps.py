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
# The first three walkthroughs checked the gradients. This one uses them: we train the
# hand-written NumPy Transformer to read numbers aloud,
#
#     "29,284.30"  ->  "twenty-nine thousand two hundred eighty-four point three zero"
#
# and then look inside it. The source is a string of characters (digits, "," and "."), the target
# a sequence of English words. To get it right the model has to find, for each word it writes, the
# digits that word is about: exactly what cross-attention is for, and what its maps will show.
#
# Every step of the loop below is a NumPy call you can read: `model.forward`, the cross-entropy,
# `model.backward` (the hand-written backward of the whole network), gradient clipping, Adam and the
# paper's learning-rate schedule. Set `WALKTHROUGH_QUICK=1` to run it in seconds (the test suite
# does); the full run trains for a few minutes on a laptop CPU.

# %%
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

QUICK = os.environ.get("WALKTHROUGH_QUICK") == "1"
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

# %%
n_train, n_test = (2_000, 100) if QUICK else (40_000, 500)
splits = tasks.make_numbers_dataset(n_train, 200, n_test, max_value=999_999, seed=0)
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
# d_ff 512, post-norm, ReLU, sinusoidal positions, dropout 0.1, float32. The model object holds its
# parameters in a dict keyed by the same names torch_transformer uses.

# %%
S, T = tasks.max_lengths(splits.train + splits.val + splits.test, src_vocab, tgt_vocab)
config = nt.TransformerConfig(
    src_vocab_size=len(src_vocab),
    tgt_vocab_size=len(tgt_vocab),
    d_model=64 if QUICK else 128,
    n_heads=4,
    d_ff=128 if QUICK else 512,
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
# Adam with beta2 = 0.98 and eps = 1e-9, and the paper's schedule
# lrate = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5): a linear warm-up, then a decay
# with the inverse square root of the step. Label smoothing 0.1 (the paper's value); padding
# positions of the target are ignored by the loss. Each line of the loop is one call.

# %%
optimizer = optim.Adam(model.params, lr=0.5, betas=(0.9, 0.98), eps=1e-9)
schedule = optim.NoamLR(optimizer, config.d_model, warmup=400)
budget_seconds, max_steps = (10, 15) if QUICK else (240, 4_000)
rng = np.random.default_rng(0)
losses, step, start = [], 0, time.perf_counter()
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
            print(f"step {step}: loss {np.mean(losses[-50:]):.3f}, lr {optimizer.lr:.2e}")
        if step >= max_steps or time.perf_counter() - start >= budget_seconds:
            break
print(f"{step} steps in {time.perf_counter() - start:.0f} s, final loss {np.mean(losses[-20:]):.3f}")
plotting.plot_loss_curve(list(range(1, step + 1)), losses, OUT / "loss_curve.png")

# %% [markdown]
# ## Translating numbers it has never seen
#
# Greedy decoding: start from `<bos>`, run the model, append the most likely word, repeat until
# `<eos>`. `greedy_decode` keeps each layer's keys and values of past positions (the KV cache), so
# every step runs the decoder on one new position only.

# %%
src_ids, _, tgt_out = tasks.encode_batch(splits.test, src_vocab, tgt_vocab)
pred = nt.greedy_decode(model.eval(), src_ids, max_len=T)
for (source, target), row in list(zip(splits.test, pred, strict=True))[:6]:
    guess = " ".join(tgt_vocab.decode(row))
    print(f"{source:>12}  ->  {guess}{'' if guess == target else '   (expected: ' + target + ')'}")
print(f"exact match on {len(splits.test)} unseen numbers: {tasks.exact_match(pred, tgt_out, tgt_vocab):.3f}")
print(f"token accuracy: {tasks.token_accuracy(pred, tgt_out, config.pad_id):.3f}")

# %% [markdown]
# ## Reading the attention maps
#
# `model.attention_maps()` returns the attention probabilities of the last forward pass, one
# (B, H, T_q, T_k) array per attention module. We run the model on one test number with its own
# translation as the decoder input and draw every head of every module.
#
# What to look for in the cross-attention of the last decoder layer: the row of each word should put
# its weight on the characters that word reads. "thousand" looks at the comma (or at the digits before
# it), "hundred" at the hundreds digit, "point" at the decimal point, each decimal word at its
# digit. The encoder's self-attention tends to look at neighbours and separators, which is how a
# character learns its place value (a "2" before a comma three places away means "two thousand").

# %%
example = [max(splits.test[:50], key=lambda pair: len(pair[0]))]
src_ids, _, _ = tasks.encode_batch(example, src_vocab, tgt_vocab)
words = tgt_vocab.decode(nt.greedy_decode(model, src_ids, max_len=T)[0])
tgt_in = np.array([[tgt_vocab.bos_id] + tgt_vocab.encode(words, add_eos=False)])
model.eval().forward(src_ids, tgt_in)
maps = model.attention_maps()
paths = plotting.plot_attention_maps(maps, list(example[0][0]) + ["<eos>"], ["<bos>"] + words, OUT)
cross = maps["decoder.layers.1.cross_attn"][0].mean(axis=0)  # (T_q, T_k), averaged over heads
for word, row in zip(["<bos>"] + words, cross, strict=False):
    print(f"{word:>14} looks most at {example[0][0] + '$'!s:>14}[{int(row.argmax())}]  ({row.max():.2f})")
print("attention maps written to", *paths, sep="\n  ")

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
