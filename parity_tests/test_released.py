"""The released-config table (parity_tests.released) as a test: every released config.json shape (sizes shrunk, every
option kept) loads on both sides and equals transformers' class in float64, outputs and every gradient (a random
upstream gradient), none of them zero; none silently different. The default run measures the rows issue 47 opened
on (once refused, or once silently off); the whole table is slow. Runs under both ends of the tested transformers range
(.ci/hf_tests.txt)."""

from __future__ import annotations

import pytest
import transformers

from parity_tests import released as R

pytestmark = pytest.mark.filterwarnings("ignore")
R.fill_released_files()
FAST = ("Phi-3-mini-128k (longrope", "Qwen3-MoE with attention_bias", "Llama conversion")
# transformers 5.20's Phi3Config refuses Phi-3's first longrope spelling ("type": "su": its standardisation does not
# reach the top-level original_max_position_embeddings); 5.25 reads it, and so do we, as 5.25 computes it
REFUSED_BY_THEM = {"Phi-3-mini-128k first release (type su, T 14)": ("5.20.",)}


def marks(row: R.Row) -> tuple:
    return () if row.name.startswith(FAST) else (pytest.mark.slow,)


@pytest.mark.parametrize("row", [pytest.param(row, id=row.name, marks=marks(row)) for row in R.ROWS])
def test_released_config_loads_and_equals_transformers(row):
    record = R.measure(row)
    if record["status"].startswith("transformers refuses"):
        assert transformers.__version__.startswith(REFUSED_BY_THEM.get(row.name, ("none",))), record["status"]
        return
    assert record["status"] == "loaded", record
    assert record["output_error"] <= 1e-12 and record["gradient_error"] <= 1e-10, record
    assert record["gradients"] > 5 and not record["zero_gradients"], record


def test_a_refusal_is_reported_by_its_key():
    from parity_tests.test_hf_options import GEMMA2_2B_RELEASED

    row = R.Row("gemma-2-2b with attention_bias", "gemma2", GEMMA2_2B_RELEASED | {"attention_bias": True})
    assert R.measure(row)["status"] == "refused: attention_bias"
