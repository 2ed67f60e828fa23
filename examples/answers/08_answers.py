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
# # Answers to the exercises of walkthrough 8 (check your own Transformer)
#
# Try the exercises first: they are at the end of `examples/08_check_your_own_model.py`. Every answer below is
# checked by the judge, `parity_tests.check`: the planted mistake is the one it names, and the fixed model passes.

# %%
import contextlib
import io
import runpy
from pathlib import Path

import torch

from parity_tests import check

# The walkthrough's model and its planted mistakes: the walkthrough run once, its own report not shown again.
EXAMPLES = (Path(__file__).parent if "__file__" in globals() else Path.cwd()).resolve().parent
with contextlib.redirect_stdout(io.StringIO()):
    walkthrough = runpy.run_path(str(EXAMPLES / "08_check_your_own_model.py"))
Translator, Norm = walkthrough["Translator"], walkthrough["Norm"]
Translator1, Translator2, Translator3 = (walkthrough[f"Translator{n}"] for n in (1, 2, 3))

# %% [markdown]
# ### Exercise 1: a decoder that learns too fast
#
# The judge finds the first divergence in `writers.0.attend`, the decoder's self-attention, and names
# `attention.causal_shows_next`: the causal mask keeps $j \le i + 1$, so each position also sees the next one.
# `tril(1)` keeps the first diagonal above the main one; the causal mask is `tril()` (or `tril(0)`), $j \le i$.
# In training, the token a position must predict is the next target token, which it now reads: copying it
# drives the loss down fast. In generation there is no next token to read, so the model that learnt to copy
# translates badly.

# %%
found = check.module(Translator1(), "transformer", n_heads=2)
print(found.summary())
assert not found.passed and found.first_divergence == "writers.0.attend"
assert [d.id for d in found.diagnoses] == ["attention.causal_shows_next"]


class Fixed1(Translator1):
    def causal(self, T, device):
        return torch.ones(T, T, dtype=torch.bool, device=device).tril()  # j <= i: itself and the past


fixed = check.module(Fixed1(), "transformer", n_heads=2)
assert fixed.passed and fixed.diagnoses == [] and fixed.caveats == []
print("exercise 1 checked: tril(1) named attention.causal_shows_next at writers.0.attend; tril() passes")

# %% [markdown]
# ### Exercise 2: a layer norm written by hand
#
# The first divergence is `readers.0.attend_norm` and the judge names `layer_norm.unbiased_variance`:
# `x.var()` divides by $n - 1$ by default (Bessel's correction, for estimating a population's variance from a
# sample), and layer norm divides by $n$. With $n = 16$ features the normalised values are
# $\sqrt{(n-1)/n} = \sqrt{15/16} \approx 0.968$ times the right ones (where $\varepsilon$ is small against the
# variance): 3% off, in every norm of every layer, which training partly absorbs into the scales $\gamma$,
# and which no test of the shapes or of the loss going down would show. The fix is
# `x.var(-1, keepdim=True, unbiased=False)` (or `correction=0`).


# %%
class FixedNorm(Norm):
    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, unbiased=False)  # divided by n, not n - 1
        return self.weight * (x - mean) / torch.sqrt(var + self.eps) + self.bias


class Fixed2(Translator2):
    norm = FixedNorm


found = check.module(Translator2(), "transformer", n_heads=2)
print(found.summary())
assert not found.passed and found.first_divergence == "readers.0.attend_norm"
assert [d.id for d in found.diagnoses] == ["layer_norm.unbiased_variance"]
x = torch.randn(3, 16, dtype=torch.float64)
ratio = (Norm(16, eps=0.0)(x) / FixedNorm(16, eps=0.0)(x)).mean().item()
print(f"unbiased / biased normalised values: {ratio:.6f}; sqrt(15/16) = {(15 / 16) ** 0.5:.6f}")
assert abs(ratio - (15 / 16) ** 0.5) < 1e-12
fixed = check.module(Fixed2(), "transformer", n_heads=2)
assert fixed.passed and fixed.diagnoses == []
print("exercise 2 checked: x.var() named layer_norm.unbiased_variance; unbiased=False passes")

# %% [markdown]
# ### Exercise 3: passed, with a caveat
#
# The judge passes `Translator3`, because a Transformer whose token embeddings are not multiplied by
# $\sqrt{d_{\text{model}}}$ is a model the reference can be (several families do not scale them), and its
# outputs say this one does not. The caveat says so (`embedding.missing_scale`): the paper's Transformer
# scales them ("we multiply those weights by $\sqrt{d_{\text{model}}}$", section 3.4). A pass answers "is this
# a Transformer the reference can be?"; the caveats say which one. Scaling the embeddings again, as the
# walkthrough's `Translator.embed` does, removes the caveat.


# %%
class Fixed3(Translator3):
    embed = Translator.embed  # table(ids) * sqrt(d_model) + positions


found = check.module(Translator3(), "transformer", n_heads=2)
print(found.summary())
assert found.passed and [mistake for mistake, _ in found.caveats] == ["embedding.missing_scale"]
fixed = check.module(Fixed3(), "transformer", n_heads=2)
assert fixed.passed and fixed.caveats == []
print("exercise 3 checked: passed with the caveat embedding.missing_scale; scaled, passed without it")
