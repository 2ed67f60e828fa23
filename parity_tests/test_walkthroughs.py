"""The teaching walkthroughs in examples/ run to the end.

Each walkthrough asserts its own comparisons (by hand vs numpy_transformer vs torch autograd vs finite
differences), so a wrong number anywhere fails here. They run in this process with runpy, under
`np.printoptions()` so that their print settings do not leak into other tests.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
WALKTHROUGHS = [
    "01_attention_by_hand.py",
    "02_layer_norm_backward.py",
    "03_backprop_encoder_decoder.py",
    "04_training_and_attention_maps.py",  # in its quick mode (WALKTHROUGH_QUICK=1)
    "05_reading_bert.py",  # the real all-MiniLM-L6-v2 against transformers (the test extras)
    "06_rope_rmsnorm_swiglu.py",
    "07_flash_attention_backward.py",
]


@pytest.mark.parametrize("name", WALKTHROUGHS)
def test_walkthrough_runs(name: str, capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("WALKTHROUGH_QUICK", "1")
    monkeypatch.setenv("WALKTHROUGH_OUT", str(tmp_path))
    with np.printoptions():  # restored afterwards
        runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    assert capsys.readouterr().out  # it printed its numbers


@pytest.mark.parametrize("name", WALKTHROUGHS)
def test_walkthrough_is_a_percent_notebook(name: str) -> None:
    """A jupytext "percent" file whose first cell is prose, and which has prose before its code."""
    text = (EXAMPLES / name).read_text()
    assert "format_name: percent" in text.split("# ---", 2)[1]
    cells = [line for line in text.splitlines() if line.startswith("# %%")]
    assert cells[0] == "# %% [markdown]"
    n_markdown = sum(cell == "# %% [markdown]" for cell in cells)
    assert n_markdown >= len(cells) - n_markdown  # at least as many prose cells as code cells
