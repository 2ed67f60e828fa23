"""The teaching walkthroughs in examples/ and their exercises' answers run to the end.

Each walkthrough asserts its own comparisons (by hand vs numpy_transformer vs torch autograd vs finite
differences), so a wrong number anywhere fails here; so does each answers file in examples/answers/
(every answer is checked with gradcheck.check_pair or against the library). They run in this process
with runpy, under `np.printoptions()` so that their print settings do not leak into other tests.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
WALKTHROUGHS = [
    "01_attention_by_hand.py",
    "01b_multi_head_attention_by_hand.py",
    "02_layer_norm_backward.py",
    "03_backprop_encoder_decoder.py",
    "04_training_and_attention_maps.py",  # in its quick mode (WALKTHROUGH_QUICK=1)
    "05_reading_bert.py",  # the real all-MiniLM-L6-v2 against transformers (the test extras)
    "06_rope_rmsnorm_swiglu.py",
    "07_flash_attention_backward.py",
    "08_check_your_own_model.py",
    "09_mixture_of_experts.py",
    "10_modern_llm.py",  # a tiny random Llama 3.2 built offline, against transformers and the library
    "11_latent_attention.py",  # DeepSeek's latent attention and routing, against transformers' own modules
    "12_vision_and_audio.py",  # a tiny ViT and CLIP built offline, against transformers; CLIP trained by hand
]
ANSWERS = EXAMPLES / "answers"


def answers_of(name: str) -> Path:
    """examples/answers/01b_answers.py for examples/01b_multi_head_attention_by_hand.py."""
    return ANSWERS / (name.split("_", 1)[0] + "_answers.py")


def run_script(path: Path, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("WALKTHROUGH_QUICK", "1")
    monkeypatch.setenv("WALKTHROUGH_OUT", str(tmp_path))
    with np.printoptions():  # restored afterwards
        runpy.run_path(str(path), run_name="__main__")


@pytest.mark.parametrize("name", WALKTHROUGHS)
def test_walkthrough_runs(name: str, capsys, monkeypatch, tmp_path) -> None:
    run_script(EXAMPLES / name, monkeypatch, tmp_path)
    assert capsys.readouterr().out  # it printed its numbers


ANSWERED = [name for name in WALKTHROUGHS if "\n# ## Exercises\n" in (EXAMPLES / name).read_text()]


@pytest.mark.parametrize("name", ANSWERED)
def test_exercise_answers_run(name: str, capsys, monkeypatch, tmp_path) -> None:
    """A walkthrough with exercises has an answers file, which runs and checks every answer."""
    path = answers_of(name)
    assert path.is_file(), f"{name} has exercises but no answers file {path}"
    assert path.name in (EXAMPLES / name).read_text(), f"{name} should point its readers to {path.name}"
    run_script(path, monkeypatch, tmp_path)
    out = capsys.readouterr().out
    n_exercises = sum(line.startswith("# ### Exercise") for line in path.read_text().splitlines())
    assert n_exercises >= 2 and out.count("checked") >= n_exercises, "every exercise's answer is checked"


@pytest.mark.parametrize("name", WALKTHROUGHS)
def test_walkthrough_is_a_percent_notebook(name: str) -> None:
    """A jupytext "percent" file whose first cell is prose, and which has prose before its code."""
    text = (EXAMPLES / name).read_text()
    assert "format_name: percent" in text.split("# ---", 2)[1]
    cells = [line for line in text.splitlines() if line.startswith("# %%")]
    assert cells[0] == "# %% [markdown]"
    n_markdown = sum(cell == "# %% [markdown]" for cell in cells)
    assert n_markdown >= len(cells) - n_markdown  # at least as many prose cells as code cells
