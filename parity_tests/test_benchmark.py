"""The benchmark keeps working: its quick mode runs and reports every figure the README quotes.
(The full benchmark is a command, not a test: python benchmarks/bench.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench.py"


def test_benchmark_quick_mode(tmp_path):
    out = tmp_path / "bench.json"
    printed = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json", str(out)], capture_output=True, text=True, check=True
    ).stdout
    report = json.loads(out.read_text())
    for backend in ("numpy", "torch"):
        assert report["train_step_seconds"][backend] > 0
        assert report["forward_seconds"][backend] > 0
        assert report["peak_memory_mib"][backend] >= 0
    assert report["matmul_ceiling_gflops"]["numpy"] > 0
    assert set(report["decode_seconds_per_token"]) == {
        "numpy cached",
        "numpy recomputed",
        "torch cached",
        "torch recomputed",
    }
    assert report["machine"]["numpy_blas"], "the BLAS in use must be reported"
    assert "OPENBLAS_CORETYPE" in report["machine"]
    breakdown = report["numpy_step_breakdown_seconds"]
    assert breakdown["matrix products (linear layers)"] > 0
    assert "training step ms" in printed and "cache speed-up" in printed
    compiled = report["compiled_train_step_seconds"]  # --quick compiles with aot_eager: the path, not the speed
    assert compiled["backend"] == "aot_eager"
    assert compiled["cpu"]["eager"] > 0 and compiled["cpu"]["compiled"] > 0 and compiled["cpu"]["compile_seconds"] > 0
    ddp = report["ddp_train_step_seconds"]
    assert ddp["processes"] == 2 and ddp["ddp"] > 0 and ddp["one_process_1_thread"] > 0 and ddp["gradient_mib"] > 0
    assert "torch.compile" in printed and "DDP training step" in printed
