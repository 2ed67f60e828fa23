"""Float32 islands the user's forward makes itself (issue 46): a table made in float32 from float32 constants inside
the forward of a float64 run, then widened (`.to(x.dtype)`), is found, made in float64 for the float64 comparison
and named in a caveat; a mask of whole numbers widened from float32 is no island; a real mistake inside such a
table is still caught in float64."""

from __future__ import annotations

import torch
from torch import nn

from parity_tests import check
from parity_tests.check.running import MADE, Float32Islands, find_islands
from parity_tests.corpus import unseen as U


class Widens(nn.Module):
    """Adds a float32 table made in its forward to x: sinusoids (rounded) or an additive causal mask (exact)."""

    def __init__(self, table: str):
        super().__init__()
        self.table = table

    def forward(self, x):
        T = x.shape[1]
        if self.table == "mask":
            made = torch.full((T, T), float("-inf"), dtype=torch.float32).triu(1).nan_to_num(neginf=-1e9)
        else:
            made = torch.sin(torch.arange(T * T, dtype=torch.float32).reshape(T, T) / 7.0)
        return x + made.to(x.dtype)


def test_a_rounded_table_widened_is_an_island_and_a_mask_of_whole_numbers_is_not():
    x = torch.randn(2, 5, 5, dtype=torch.float64)
    for table, expected in (("sinusoids", [("(the module)", MADE)]), ("mask", [])):
        module = Widens(table)
        assert find_islands(module, lambda m=module: m(x)) == expected, table


def test_in_the_float64_comparison_the_table_is_made_in_float64():
    x = torch.zeros(1, 5, 5, dtype=torch.float64)
    exact = torch.sin(torch.arange(25, dtype=torch.float64).reshape(5, 5) / 7.0)
    module = Widens("sinusoids")
    assert (module(x) - exact).abs().max() > 1e-9  # as written: float32's rounding
    with Float32Islands(module), torch.no_grad():
        assert torch.equal(module(x)[0], exact)


class WrongFrequencies(U.Float32Positions):
    """The float32 sinusoids made in the forward with every frequency 1 (an integer division)."""

    def forward(self, src, tgt):
        pe = U.sinusoids(U.T_MAX, U.D, step=1).to(self.src_embed.weight.dtype)
        x = self.src_embed(src) * self.scale + pe[: src.shape[1]]
        for block in self.encoder:
            x = block(x, None)
        y = self.tgt_embed(tgt) * self.scale + pe[: tgt.shape[1]]
        for block in self.decoder:
            y = block(y, x, self.mask(tgt.shape[1]).to(y.dtype), None)
        return self.out(y)


def test_a_mistake_in_a_table_made_in_float32_is_still_named():
    torch.manual_seed(0)
    result = check.module(WrongFrequencies(), "transformer", pad_id=None)
    assert not result.passed and [d.id for d in result.diagnoses][:1] == ["positions.wrong_frequencies"], str(result)
    assert "dtype.float32_island" in [c[0] for c in result.caveats], str(result)
