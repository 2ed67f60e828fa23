"""The parity report (the project's main command) runs, writes JSON, and fails when parity fails."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from parity_tests import components as C
from parity_tests import report


def test_report_passes_and_writes_json(tmp_path, capsys):
    path = tmp_path / "parity.json"
    status = report.main(["--dtype", "float64", "--device", "cpu", "--layers", "1", "--json", str(path)])
    printed = capsys.readouterr().out
    assert status == 0, printed
    data = json.loads(path.read_text())
    assert data["passed"] and data["records"]
    names = {r["component"] for r in data["records"]}
    assert {
        "Transformer",
        "TransformerLM",
        report.ENCODER_ROW,
        report.LLAMA_ROW,
        f"{report.LLAMA_ROW} (train, shared dropout)",
        "multi_head_attention",
        "nn.TransformerDecoderLayer (pre-norm, gelu)",
        "rms_norm",
        "silu",
        "gated_feed_forward (SwiGLU)",
        "rope",
        "multi_head_attention (GQA 2 of 4, rope, causal, padding)",
        "multi_head_attention (MQA, rope, causal, no bias)",
    } <= names
    assert set(C.CASES) <= names  # every component, the new ones included
    llama = [r for r in data["records"] if r["component"] == report.LLAMA_ROW]
    assert llama and all(r["n_gradients"] > 0 and r["grad_rel_error"] <= C.BAR[np.dtype(np.float64)] for r in llama)
    ours = [r for r in data["records"] if not is_hf(r)]
    assert all(r["fd_rel_error"] is not None and r["fd_rel_error"] <= C.FD_BAR for r in ours)
    hf = {r["component"] for r in data["records"] if is_hf(r)}
    for model in (
        "BertModel", "RobertaModel", "XLMRobertaModel", "DistilBertModel", "MPNetModel", "GPT2LMHeadModel",
        "LlamaForCausalLM", "Qwen3ForCausalLM", "Phi3ForCausalLM", "GPTNeoXForCausalLM", "MixtralForCausalLM",
        "Qwen3MoeForCausalLM", "MarianMTModel", "BartForConditional", "MiniLM", "ModernBertModel",
        "ModernBertForMaskedLM", "Gemma3ForCausalLM",
    ):  # fmt: skip
        assert any(model in name for name in hf), f"no row against {model}"
    assert all(r["n_gradients"] > 10 for r in data["records"] if is_hf(r))
    assert "rows pass" in printed and "FAIL" not in printed


def is_hf(record) -> bool:
    """A row against Hugging Face transformers (no finite-difference column: the NumPy side is checked there
    by its own rows)."""
    return record["component"].startswith(("HF ", "all-MiniLM"))


def test_report_exits_non_zero_on_a_wrong_gradient(monkeypatch, capsys):
    original = C.run_case

    def broken(case, device, seed=0):
        result = original(case, device, seed)
        for name, (ours, theirs) in result.grads.items():
            result.grads[name] = (ours * 1.001, theirs)
        return result

    monkeypatch.setattr(C, "run_case", broken)
    status = report.main(
        ["--dtype", "float32", "--device", "cpu", "--layers", "1", "--no-fd", "--dropout", "0", "--no-hf"]
    )
    assert status == 1
    assert "FAIL linear [float32, cpu]" in capsys.readouterr().out


def test_console_entry_point_prints_json():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "parity_tests",
            "--dtype",
            "float32",
            "--device",
            "cpu",
            "--no-fd",
            "--no-hf",
            "--json",
            "-",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    data = json.loads(out)
    assert data["passed"]
    assert {r["dtype"] for r in data["records"]} == {"float32"}
    assert max(r["grad_rel_error"] for r in data["records"]) <= C.BAR[np.dtype(np.float32)]


@pytest.mark.parametrize(("heads", "d_model"), [(4, 32), (3, 18), (5, 15), (1, 6)])
def test_llama_row_config_is_valid_for_any_report_size(heads, d_model):
    """The Llama-style row follows --heads and --d-model: rotary positions need an even head size (made even
    when it is not), the K/V heads divide the query heads."""
    args = report.parse_args(["--heads", str(heads), "--d-model", str(d_model)])
    config = report.llama_config(report.build_config(args))
    assert config.d_head % 2 == 0 and config.n_heads == heads and heads % config.n_kv_heads == 0
    assert config.n_kv_heads < heads or heads == 1
    assert (config.norm, config.positional, config.activation) == ("rms", "rope", "silu")
    assert config.gated_ffn and not config.bias and not config.output_bias and config.norm_first
