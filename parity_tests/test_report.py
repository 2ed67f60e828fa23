"""The parity report (the project's main command) runs, writes JSON, and fails when parity fails."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

from parity_tests import components as C  # noqa: E402
from parity_tests import report  # noqa: E402


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
        "multi_head_attention",
        "nn.TransformerDecoderLayer (pre-norm, gelu)",
    } <= names
    assert all(r["fd_rel_error"] is not None and r["fd_rel_error"] <= C.FD_BAR for r in data["records"])
    assert "rows pass" in printed and "FAIL" not in printed


def test_report_exits_non_zero_on_a_wrong_gradient(monkeypatch, capsys):
    original = C.run_case

    def broken(case, device, seed=0):
        result = original(case, device, seed)
        for name, (ours, theirs) in result.grads.items():
            result.grads[name] = (ours * 1.001, theirs)
        return result

    monkeypatch.setattr(C, "run_case", broken)
    status = report.main(["--dtype", "float32", "--device", "cpu", "--layers", "1", "--no-fd", "--dropout", "0"])
    assert status == 1
    assert "FAIL linear [float32, cpu]" in capsys.readouterr().out


def test_console_entry_point_prints_json():
    out = subprocess.run(
        [sys.executable, "-m", "parity_tests", "--dtype", "float32", "--device", "cpu", "--no-fd", "--json", "-"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    data = json.loads(out)
    assert data["passed"]
    assert {r["dtype"] for r in data["records"]} == {"float32"}
    assert max(r["grad_rel_error"] for r in data["records"]) <= C.BAR[np.dtype(np.float32)]
