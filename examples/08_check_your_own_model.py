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
# # 8. Check your own Transformer
#
# *Prerequisites:* none beyond having written (or copied) a Transformer in PyTorch. *Time:* 10 minutes, and 30
# for the exercises.
#
# Most people learn the Transformer by writing one: following a tutorial, a course lab, a blog post. The
# model trains, the loss goes down, and nothing says whether it is the model of the paper or a slightly
# different one. This project has a reference that is known to be right (every forward and backward
# written by hand in NumPy, equal to PyTorch and to Hugging Face `transformers` to 1e-10), so it can be
# the judge: `parity_tests.check` loads the reference's weights into *your* module, calls it the way you
# wrote it, compares the output and every gradient, and, when something differs, finds the first
# submodule that diverges and names the mistake.
#
# Here is a model written the way tutorials write it: its own names, one small module per head, masks built
# inside from the pad id. It holds a classic bug, the one line most often copied wrong.

# %%
import math

import torch
from torch import nn

from parity_tests import check

_ = torch.manual_seed(0)  # (it returns the generator, which a notebook would print)

# %% [markdown]
# ## The model
#
# Each head is its own module with its own query, key and value projections; the heads' outputs are
# concatenated and projected. The scale of the scores is computed as `head_dim ** 1/2`.
# Python reads that as `(head_dim ** 1) / 2`: exponentiation binds tighter than division.

# %%
SCALE_BUG = True


class OneHead(nn.Module):
    def __init__(self, d_model, head_dim):
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(d_model, head_dim) for _ in range(3))
        self.head_dim = head_dim

    def forward(self, x, memory, keep):
        q, k, v = self.query(x), self.key(memory), self.value(memory)
        divisor = self.head_dim**1 / 2 if SCALE_BUG else math.sqrt(self.head_dim)
        scores = q @ k.transpose(-2, -1) / divisor  # (B, T_q, T_k)
        scores = scores.masked_fill(~keep, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v


class Heads(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.heads = nn.ModuleList(OneHead(d_model, d_model // n_heads) for _ in range(n_heads))
        self.merge = nn.Linear(d_model, d_model)

    def forward(self, x, memory, keep):
        return self.merge(torch.cat([h(x, memory, keep) for h in self.heads], dim=-1))


class Block(nn.Module):
    def __init__(self, d_model, n_heads, d_hidden, cross):
        super().__init__()
        self.attend = Heads(d_model, n_heads)
        self.attend_norm = nn.LayerNorm(d_model)
        self.cross = Heads(d_model, n_heads) if cross else None
        self.cross_norm = nn.LayerNorm(d_model) if cross else None
        self.mlp = nn.Sequential(nn.Linear(d_model, d_hidden), nn.ReLU(), nn.Linear(d_hidden, d_model))
        self.mlp_norm = nn.LayerNorm(d_model)

    def forward(self, x, keep, memory=None, memory_keep=None):
        x = self.attend_norm(x + self.attend(x, x, keep))
        if self.cross is not None:
            x = self.cross_norm(x + self.cross(x, memory, memory_keep))
        return self.mlp_norm(x + self.mlp(x))


class Translator(nn.Module):
    """forward(source ids, target ids) -> logits; masks built inside from the pad id."""

    def __init__(self, vocab=17, d_model=16, n_heads=2, d_hidden=32, layers=2, pad=0, longest=40):
        super().__init__()
        self.words_in, self.words_out = nn.Embedding(vocab, d_model), nn.Embedding(vocab, d_model)
        self.where = nn.Embedding(longest, d_model)  # learned positions, shared by both sides
        self.where_out = nn.Embedding(longest, d_model)
        self.readers = nn.ModuleList(Block(d_model, n_heads, d_hidden, cross=False) for _ in range(layers))
        self.writers = nn.ModuleList(Block(d_model, n_heads, d_hidden, cross=True) for _ in range(layers))
        self.to_words = nn.Linear(d_model, vocab)
        self.pad, self.d_model = pad, d_model

    def embed(self, ids, table, positions):
        return table(ids) * math.sqrt(self.d_model) + positions(torch.arange(ids.shape[1], device=ids.device))

    def causal(self, T, device):
        return torch.ones(T, T, dtype=torch.bool, device=device).tril()  # (T, T): True where j <= i

    def forward(self, source, target):
        source_keep = (source != self.pad)[:, None, :]  # (B, 1, T_src): padding keys masked
        future = self.causal(target.shape[1], target.device)  # (T, T)
        x = self.embed(source, self.words_in, self.where)
        for block in self.readers:
            x = block(x, source_keep)
        y = self.embed(target, self.words_out, self.where_out)
        for block in self.writers:
            y = block(y, future, x, source_keep)
        return self.to_words(y)


# %% [markdown]
# ## Checking it: three lines
#
# `check.module` needs the module and the name of what it should be (here the whole encoder-decoder,
# `"transformer"`). Everything else is read from the module: the sizes from the parameters' shapes, which
# parameter is which (the per-head projections are rows of the reference's q/k/v projections), how it is
# called (batch-first ids, masks built inside), and what the shapes cannot tell (post-norm, ReLU, learned
# positions, scaled embeddings), by checking the candidates. Only the number of heads is given, because the
# module never states it in a form the checker recognises.

# %%
result = check.module(Translator(), "transformer", n_heads=2)
print(result.summary())  # print(result) adds the weight map and the error of every tensor

# %% [markdown]
# The report says what it found at every step: the conventions and the config it judged the model under (marked
# "assumed": with a mistake inside, none reproduces the reference, so the closest is used), how many of the
# comparisons (the output and every gradient, in float64 and float32) stayed within their bars, the first submodule
# whose output left the bar, and the diagnosis: the reference with the scores divided by `head_dim / 2` reproduces
# this model's output to float64 precision. (Here that number, 4, is also sqrt(d_model), another common slip; the
# message names both.)

# %%
assert not result.passed
assert result.first_divergence == "readers.0.attend"
(diagnosis,) = result.diagnoses
assert diagnosis.id == "attention.wrong_scale" and "(d_head ** 1) / 2" in diagnosis.message
print(diagnosis)

# %% [markdown]
# ## The fix
#
# Write the root as `math.sqrt(head_dim)` (or `head_dim ** 0.5`) and check again. Now every output and
# gradient agrees with the reference to about 1e-15 in float64 and 1e-7 in float32, and there is nothing to
# diagnose.

# %%
SCALE_BUG = False
fixed = check.module(Translator(), "transformer", n_heads=2)
assert fixed.passed and fixed.diagnoses == [] and fixed.first_divergence is None
worst = max(r.error for r in fixed.rows if r.dtype == "float64")
print(f"passed: {fixed.passed}; worst float64 error {worst:.1e}")
print("\n".join(str(fixed).splitlines()[3:9]), "\n  ...")  # the start of the map: user name, reference name
assert worst < 1e-12

# %% [markdown]
# ## What else it knows
#
# The catalogue of mistakes it names (`check.CATALOGUE`) covers the bugs found most often in tutorial code:
# layer norm with the unbiased variance or eps outside the root, every wrong scale of the scores, masks
# applied after the softmax, ignored, inverted, on the queries, swapped between self- and cross-attention,
# causal masks off by one, heads split without the transpose, the softmax over the wrong axis, dropout left
# on in evaluation, embeddings scaled twice or not at all, sinusoid frequencies computed with an integer
# division. A divergence none of these explains is reported as such, with the submodule and the error.
#
# For hand-written backward passes in NumPy, `check.pair(forward, backward, "layer_norm")` does the same
# against the reference pair and central finite differences, and `transformer-parity exercises DIR`
# writes a workbook of backward passes to derive that `transformer-parity grade DIR` marks.

# %%
print(len(check.CATALOGUE), "mistakes in the catalogue:")
for mistake, line in check.CATALOGUE.items():
    print(f"  {mistake:<36} {line}")

# %% [markdown]
# ## Planted mistakes
#
# Three variants of the model, each with something changed, the way a tutorial's model might differ from the
# paper's. Each trains, and each one's loss goes down. The exercises below ask the judge what is wrong with them.


# %%
class Translator1(Translator):
    def causal(self, T, device):
        return torch.ones(T, T, dtype=torch.bool, device=device).tril(1)


class Norm(nn.Module):
    """Layer norm from its formula: (x - mean) / sqrt(var + eps), scaled and shifted."""

    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))
        self.eps = eps

    def forward(self, x):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True)
        return self.weight * (x - mean) / torch.sqrt(var + self.eps) + self.bias


class Translator2(Translator):
    norm = Norm  # in place of nn.LayerNorm, in every block

    def __init__(self, **sizes):
        super().__init__(**sizes)
        for block in [*self.readers, *self.writers]:
            block.attend_norm = self.norm(self.d_model)
            block.mlp_norm = self.norm(self.d_model)
            if block.cross is not None:
                block.cross_norm = self.norm(self.d_model)


class Translator3(Translator):
    def embed(self, ids, table, positions):
        return table(ids) + positions(torch.arange(ids.shape[1], device=ids.device))


# %% [markdown]
# ## Exercises
#
# Answers, worked and checked, are in `examples/answers/08_answers.py`. Check yours with the judge,
# `check.module(model, "transformer", n_heads=2)`, as the walkthrough does.
#
# 1. **A decoder that learns too fast.** Judge `Translator1()` (planted mistakes, above). Which submodule
#    diverges first, and which mistake does the judge name? Fix `Translator1.causal` until the judge passes.
#    Why would this model's training loss fall faster than the walkthrough's, and its translations still be bad?
# 2. **A layer norm written by hand.** Judge `Translator2()`: its `Norm` follows the formula, and still the
#    judge finds the first divergence in a norm. Name the mistake, fix `Norm` in a subclass (set `norm` on a
#    subclass of `Translator2`), and check again. By what factor is this norm's output off, with 16 features?
# 3. **Passed, with a caveat.** Judge `Translator3()`: it passes. Read the whole summary: what does the caveat
#    say, and is this the paper's model? Make it the paper's model and check that the caveat is gone.
