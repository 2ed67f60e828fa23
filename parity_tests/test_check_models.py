"""Whole models judged as their authors call them, with no glue beyond a factory: the output read from a
`(logits, loss)` tuple or a dict, the last position only (nanoGPT's inference path), hidden states put through the
model's own head (the Annotated Transformer's `generator`).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from parity_tests import check
from parity_tests import user_models as U


class AuthorsOutput(nn.Module):
    """A Llama-style LM returned the way published code returns it: `returns` says how."""

    def __init__(self, returns: str, mistake=None):
        super().__init__()
        torch.manual_seed(0)
        self.model = U.TutorialLlama(mistake=mistake)
        self.returns = returns

    def forward(self, idx, targets=None):
        logits = self.model(idx)
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        if self.returns == "last position":  # nanoGPT: forward(idx) without targets
            return logits[:, [-1], :], loss
        if self.returns == "last position, squeezed":
            return logits[:, -1, :]
        return {"loss": loss, "logits": logits}  # a dict with the loss first (None without targets)


@pytest.mark.parametrize("returns", ["last position", "last position, squeezed", "dict"])
def test_authors_output_is_read_and_compared(returns):
    result = check.module(AuthorsOutput(returns), "transformer_lm")
    assert result.passed, str(result)
    gradients = [r for r in result.rows if r.name.startswith("d ")]
    assert len(gradients) >= 10 and all(r.note != "all zero" for r in gradients), str(result)
    assert ("positions" in result.conventions) == returns.startswith("last"), result.conventions


def test_mistake_behind_the_last_position_is_named_where_it_is():
    result = check.module(AuthorsOutput("last position", "attention.kv_heads_tiled"), "transformer_lm")
    assert not result.passed
    assert result.first_divergence == "model.layers.0.attention", str(result)
    assert [d.id for d in result.diagnoses] == ["attention.kv_heads_tiled"], str(result)


def test_hidden_states_go_through_the_models_own_generator():
    """AnnotatedStyle's forward(src, tgt, src_mask, tgt_mask) returns the decoder's hidden states; its head is the
    separate `generator`. No call= adapter: the judge builds the masks and applies the generator."""
    result = check.module(U.AnnotatedStyle(), "transformer")
    assert result.passed, str(result)
    trap = check.module(U.AnnotatedStyle(mistake="std"), "transformer")
    assert trap.first_divergence == "encoder.0.sublayer.0.norm", str(trap)
    assert [d.id for d in trap.diagnoses] == ["layer_norm.unbiased_variance", "layer_norm.eps_outside_sqrt"]
