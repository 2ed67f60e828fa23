"""The benchmark keeps working: its quick mode runs and reports every figure the README quotes. Marked slow (about
40 s on 2 cores, the default run's longest test): python -m pytest parity_tests/test_benchmark.py -m slow. (The full
benchmark is a command, not a test: python benchmarks/bench.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench.py"


@pytest.mark.slow
def test_benchmark_quick_mode(tmp_path):
    out = tmp_path / "bench.json"
    run = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, f"bench.py --quick exited {run.returncode}:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    printed = run.stdout
    report = json.loads(out.read_text())
    for backend in ("numpy", "numpy_parallel", "torch"):  # the plain path, the fast path, torch_transformer
        assert report["train_step_seconds"][backend] > 0
        assert report["forward_seconds"][backend] > 0
        assert report["peak_memory_mib"][backend] >= 0
        assert report["train_step_fraction_of_ceiling"][backend] > 0
    assert report["train_step_ratio_numpy_parallel_over_torch"] > 0
    assert report["forward_ratio_numpy_parallel_over_torch"] > 0
    assert all(report["matmul_ceiling_gflops"][k] > 0 for k in ("numpy", "numpy_parallel", "torch"))
    assert report["machine"]["cpu_model"] and "allocator, the same for every implementation" in printed
    phases = report["numpy_parallel_step_phases_seconds"]
    assert {"optimizer (Adam)", "sum of the parts' gradients"} <= set(phases) and all(v > 0 for v in phases.values())
    minilm = report["minilm_forward_seconds"]  # all-MiniLM-L6-v2 against transformers' BertModel (--quick: 2 x 16)
    assert minilm["batch"] == 2 and minilm["tokens"] == 16
    assert minilm["numpy"] > 0 and minilm["numpy_parallel"] > 0 and minilm["torch"] > 0
    assert minilm["ratio_numpy_parallel_over_torch"] > 0
    assert minilm["max_abs_difference"] < 1e-4  # the same hidden states: the comparison times the same work
    assert set(report["decode_seconds_per_token"]) == {
        "numpy cached",
        "numpy recomputed",
        "torch cached",
        "torch recomputed",
    }
    assert report["machine"]["numpy_blas"], "the BLAS in use must be reported"
    # every BLAS thread is back at the end (the plain path was timed with all of them, like torch)
    assert (
        report["machine"]["numpy_blas"][0]["num_threads"]
        == report["machine"]["cpus"]
        == report["machine"]["torch_threads"]
    )
    assert "OPENBLAS_CORETYPE" in report["machine"]
    breakdown = report["numpy_step_breakdown_seconds"]
    assert breakdown["matrix products (linear layers)"] > 0
    assert "training step ms" in printed and "cache speed-up" in printed and "all-MiniLM-L6-v2 forward" in printed
    compiled = report["compiled_train_step_seconds"]  # --quick compiles with aot_eager: the path, not the speed
    assert compiled["backend"] == "aot_eager"
    assert compiled["cpu"]["eager"] > 0 and compiled["cpu"]["compiled"] > 0 and compiled["cpu"]["compile_seconds"] > 0
    ddp = report["ddp_train_step_seconds"]
    assert ddp["processes"] == 2 and ddp["ddp"] > 0 and ddp["one_process_1_thread"] > 0 and ddp["gradient_mib"] > 0
    assert "torch.compile" in printed and "DDP training step" in printed


@pytest.mark.slow
def test_targets_quick_mode(tmp_path):
    """bench.py --targets (issue 50's whole-model figures in one process) on the quick shapes (about 25 s): every
    target's figure is measured and judged, the load average is recorded at each stage."""
    out = tmp_path / "targets.json"
    command = [sys.executable, str(BENCH), "--targets", "--quick", "--json", str(out)]
    run = subprocess.run(command, capture_output=True, text=True)
    assert run.returncode == 0, (
        f"bench.py --targets exited {run.returncode}:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    )
    report = json.loads(out.read_text())
    assert len(report["targets"]) == 8 and all(row["value"] > 0 for row in report["targets"]), report["targets"]
    assert all(row["met"] in (True, False) for row in report["targets"] if row["target"])
    assert set(report["load_average"]) == {"start", "after the MiniLM forward", "after the training step", "end"}
    assert set(report["stage_seconds"]) == {"MiniLM forward", "training step", "LLM decoding"}
    assert report["minilm_forward"]["max_abs_difference"] < 1e-4
    assert report["llm_decode"]["batch 8"]["same_tokens"] == 8
    assert "met" in run.stdout and "of the bandwidth ceiling" in run.stdout


def test_targets_are_judged_by_their_bounds():
    """bench.py --targets's verdicts: a ratio at most its bound (a time over torch's), a rate at least its bound; a
    figure without a bound, or not measured, is reported with no verdict."""
    bench = load_bench()
    report = {"a": {"b": 1.1}, "c": 0.5}
    assert bench.target_row(report, "x", ("a", "b"), 1.2, "<=")["met"] is True
    assert bench.target_row(report, "x", ("a", "b"), 1.0, "<=")["met"] is False
    assert bench.target_row(report, "x", ("c",), 0.4, ">=") == {
        "figure": "x",
        "value": 0.5,
        "target": ">= 0.4",
        "met": True,
    }
    assert bench.target_row(report, "x", ("c",), 0.75, ">=")["met"] is False
    assert bench.target_row(report, "x", ("a", "b"), None, "<=")["met"] is None
    assert bench.target_row(report, "x", ("a", "missing"), 1.0, "<=") == {
        "figure": "x",
        "value": None,
        "target": "<= 1",
        "met": None,
    }
    assert {path[0] for _, path, _, _ in bench.TARGETS} == {"minilm_forward", "train_step", "llm_decode"}


def test_the_benchmark_reads_nothing_private():
    """bench.py uses the package's public API only: no attribute with a leading underscore read from anything
    but torch (torch._dynamo.reset is torch's documented way to drop compiled graphs)."""
    from parity_tests._source_checks import private_attributes

    private = private_attributes(BENCH, owner="torch")
    assert not private, private


def load_bench():
    """benchmarks/bench.py as a module (it is a script, not part of the package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_llm_decoding_on_a_tiny_qwen2(capsys):
    """bench.py --llm-decode's measurement on a tiny Qwen2 (LLM_QUICK): tokens/s of both contenders at each batch
    size, the same greedy tokens (float32, a tiny model: no near ties), fractions of a measured bandwidth ceiling."""
    bench = load_bench()
    report = bench.llm_decoding(bench.LLM_QUICK)
    q = bench.LLM_QUICK
    assert report["parameters"] > 0
    assert report["bytes_per_token_batch_1"] > 4 * report["parameters"]  # the weights, and the cache besides
    for B in q["batches"]:
        r = report[f"batch {B}"]
        assert r["tokens_per_second"]["numpy"] > 0 and r["tokens_per_second"]["generate"] > 0
        assert 0 < r["fraction_of_bandwidth_ceiling"]["numpy"] and r["speedup_over_generate"] > 0
        assert r["matvec_gb_per_second"] > 0
        assert r["same_tokens"] == B
    bench.print_llm_decoding(report)
    assert "of the bandwidth ceiling" in capsys.readouterr().out


def test_interleaved_rotates_the_order_and_skips_the_warm_up():
    """bench.py's timing loop: a warm-up round in the given order (not timed), then each round rotated by one, so that
    no contender always runs right after the same one; medians of the timed rounds."""
    import time

    bench = load_bench()
    calls: list[str] = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    medians = bench.interleaved(fns, reps=3, pause=0.0)
    assert calls == list("abc" + "bca" + "cab" + "abc")  # warm-up, then rounds 1, 2, 3
    assert set(medians) == set("abc")
    slow = bench.interleaved({"sleep": lambda: time.sleep(0.05), "none": lambda: None}, reps=2, pause=0.0)
    assert slow["sleep"] >= 0.05 > slow["none"]


def test_ops_table_pairs_compute_the_same_thing():
    """bench.py --ops times NumPy's function, the fast path's (the same on a part of the rows per core) and torch's
    op: on the quick shapes, every forward gives the same numbers (float32, loosely: the table is about time; the fast
    path's parts put back together), every backward runs, and torch's BLAS is named."""
    import numpy as np

    bench = load_bench()
    ops_table = bench.ops_table
    pairs = ops_table.op_pairs(ops_table.QUICK, ops_table.QUICK_DECODE, np.random.default_rng(0), n_parts=2)
    assert {op for op, *_ in pairs} >= {"linear", "gelu (exact)", "softmax", "layer norm", "rms norm", "rope"}
    with_fast = {op for op, _, _, _, fast_fn, _ in pairs if fast_fn is not None}
    assert with_fast >= {
        "softmax",
        "log-softmax",
        "layer norm",
        "rms norm",
        "gelu (exact)",
        "linear",
        "few rows x @ W.T",
    }
    for op, pass_, shape, np_fn, fast_fn, torch_fn in pairs:
        ours, theirs = np_fn(), torch_fn()
        fast = None if fast_fn is None else fast_fn()
        if pass_ == "forward":
            ours = ours[0] if isinstance(ours, tuple) else ours
            theirs = theirs.detach().numpy()
            assert ours.shape == theirs.shape, (op, shape)
            assert np.abs(ours - theirs).max() <= 1e-4 * max(1.0, np.abs(theirs).max()), (op, shape)
            if fast is not None:
                assert len(fast) == 2, (op, shape)  # one result per part
                axis = -1 if op.startswith("few rows") else 0  # a decoding product's parts are output features
                fast = np.concatenate([f[0] if isinstance(f, tuple) else f for f in fast], axis=axis)
                assert np.abs(fast - theirs).max() <= 1e-4 * max(1.0, np.abs(theirs).max()), (op, shape)
        else:
            assert all(np.isfinite(t.numpy()).all() for t in theirs), (op, shape)
            assert fast is None or len(fast) == 2, (op, shape)
    assert ops_table.torch_blas() != "unknown"


def test_ops_table_rows_and_the_op_filter():
    """ops_table's rows: NumPy, the fast path (None where it does not run the op) and torch, with their ratios; --op
    keeps the ops whose name contains one of the names given."""
    bench = load_bench()

    def timed(fns, reps, pause):  # each function once, fixed times: the table's arithmetic, not the machine's
        for fn in fns.values():
            fn()
        return {name: {"numpy": 4.0, "fast": 2.0, "torch": 1.0}[name] for name in fns}

    report = bench.ops_table.ops_table(True, timed, 1, n_parts=2, only=["softmax", "few rows"])
    assert {r["op"] for r in report["ops"]} == {
        "softmax",
        "log-softmax",
        "few rows x @ W.T",
        "few rows (W @ x.T).T",
        "few rows linear_forward",
    }
    for r in report["ops"]:  # a timing of several calls in a row counts per call
        calls = r["calls_per_timing"]
        assert 1 <= calls <= bench.ops_table.MAX_CALLS and r["numpy"] == 4.0 / calls
        assert r["ratio_numpy_over_torch"] == 4.0
        if r["op"] in ("few rows (W @ x.T).T", "few rows linear_forward"):
            assert r["fast"] is None and r["ratio_fast_over_torch"] is None
        else:
            assert r["fast"] == 2.0 / calls and r["ratio_fast_over_torch"] == 2.0
    assert report["fast_path_parts"] == 2
