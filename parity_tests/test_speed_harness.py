"""The second speed harness (parity_tests/speed_harness.py) against bench.py's figures, quiet and beside a
competing process.

The slow tests measure (several minutes each on 2 cores) and assert what holds on any host: the contenders compute
the same thing, every time and ratio is finite and positive, and bench.py's own figure of each ratio, measured in
the same process between the harness's runs, lies within the harness's range of it widened by BENCH_FACTOR. The
issue's absolute targets (an AVX-512 host, quiet) are asserted only when PARITY_SPEED_TARGETS=1 asks, since hosts
differ. PARITY_SPEED_REPS sets the repetitions per run (5), PARITY_SPEED_JSON a file to write the measurement to.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from parity_tests import speed_harness as harness

# How far bench.py's figure may lie outside the harness's min..max of the same ratio, as a factor each way. With
# three runs, a fourth measurement of the same ratio falls outside their range half the time by chance alone, by
# up to about the runs' own spread (max / min). Measured on a 2-core AMD EPYC (AVX-512), three runs each: nearly
# quiet (load average 0.5 before, 1.9 after, this process included), the harness's runs spread by up to 1.31 and
# bench.py's figures lay outside their range by up to 1.21; beside a competing process, with other users' jobs on
# the machine too (load 5 to 7), by up to 1.92 and 1.34. 1.5 still catches a disagreement like the one that made
# this harness (MiniLM fast / BertModel 1.35 from one harness, 0.81 from bench.py: 1.67 apart). On a machine whose
# load changes between runs no factor holds: there bench.py's figure once lay 1.8 times below the harness's runs.
BENCH_FACTOR = {"quiet": 1.5, "competing": 2.0}
REPS = int(os.environ.get("PARITY_SPEED_REPS", "5"))
TARGETS = os.environ.get("PARITY_SPEED_TARGETS") == "1"


def test_alternate_rotates_the_order_and_keeps_medians():
    calls: list[str] = []

    def call(name: str) -> Callable[[], None]:
        return lambda: calls.append(name)

    fns = {name: call(name) for name in "abc"}
    medians = harness.alternate(fns, reps=3)
    assert calls == list("abc" + "bca" + "cab")
    assert set(medians) == set("abc") and all(0 <= s < harness.SETTLE for s in medians.values())
    slow = harness.alternate({"sleep": lambda: time.sleep(0.05), "none": lambda: None}, reps=3)
    assert slow["sleep"] >= 0.05 > slow["none"]


def test_the_competing_process_runs_during_the_block_and_is_gone_after():
    with harness.competing_process() as pid:
        os.kill(pid, 0)  # alive
        time.sleep(0.5)
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # from the state on: utime and stime are 11 and 12
        assert fields[0] in ("R", "S") and int(fields[11]) + int(fields[12]) > 0  # it has been computing
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_the_host_is_named():
    h = harness.host()
    assert h["cpu_model"] and h["cores"] >= 1 and isinstance(h["avx512f"], bool)
    assert h["blas_threads"] and all(n >= 1 for n in h["blas_threads"])
    assert harness.host_lines(h)[0].startswith(f"CPU: {h['cpu_model']}")


def test_the_judgements_read_the_runs():
    """Targets and bench.py's agreement judged from a made-up measurement: each can fail."""

    def runs(plain, fast):
        return [{"seconds": {}, "ratios": {"plain": p, "fast": f}} for p, f in zip(plain, fast, strict=True)]

    quiet = {
        "harness": {"minilm": runs([1.9, 2.1, 2.0], [0.9, 0.95, 0.99]), "step": runs([0.9] * 3, [0.7, 0.8, 0.75])},
        "bench": {"minilm": [{"plain": 2.0, "fast": 1.3}], "step": [{"plain": 0.9, "fast": 0.75}]},
    }
    met = {name: ok for name, (ok, _) in harness.quiet_targets(quiet).items()}
    assert list(met.values()) == [False, True, True]  # MiniLM plain reached 2.1 in one run
    assert harness.bench_outside(quiet, 1.25) == [
        "all-MiniLM-L6-v2 forward, 32 x 128, fast / torch: bench.py 1.30, outside 0.72-1.24"
    ]
    loaded = {"harness": {q: runs([x * 1.6 for x in (2, 2, 2)], [1.0] * 3) for q in ("minilm", "step")}}
    judged = harness.loaded_targets(quiet, loaded)
    assert [ok for ok, _ in judged.values()] == [False, True, False, True]  # plain 3.2 against 2.0 and 0.9


def check_measurement(result: dict, condition: str) -> None:
    """What holds on any host: the same computation, finite positive figures, bench.py within the range."""
    agreement = result["agreement"]
    assert all(0 <= d < 1e-4 for d in agreement["minilm"].values()), agreement  # float32 hidden states
    assert all(0 <= d < 1e-5 for d in agreement["step"].values()), agreement  # the loss, relative
    for quantity in harness.QUANTITIES:
        assert len(result["harness"][quantity]) == len(result["bench"][quantity]) == 3
        for run in result["harness"][quantity]:
            figures = [*run["seconds"].values(), *run["ratios"].values()]
            assert all(math.isfinite(x) and x > 0 for x in figures), run
        assert all(math.isfinite(x) and x > 0 for run in result["bench"][quantity] for x in run.values())
    assert not harness.bench_outside(result, BENCH_FACTOR[condition]), harness.bench_outside(
        result, BENCH_FACTOR[condition]
    )


def record(result: dict) -> None:
    path = os.environ.get("PARITY_SPEED_JSON")
    if path:
        previous = json.loads(Path(path).read_text()) if Path(path).exists() else {"conditions": []}
        previous["host"] = harness.host()
        previous["conditions"].append(result)
        Path(path).write_text(json.dumps(previous, indent=2))


@pytest.mark.slow
def test_quiet_both_harnesses_agree():
    result = harness.measure(runs=3, reps=REPS)
    record(result)
    print("\n".join(harness.host_lines(harness.host()) + harness.condition_lines(result)))
    check_measurement(result, "quiet")
    if TARGETS:
        missed = {name: got for name, (met, got) in harness.quiet_targets(result).items() if not met}
        assert not missed, missed


@pytest.mark.slow
def test_beside_a_competing_process_both_harnesses_agree():
    result = harness.measure(runs=3, reps=REPS, competing=True)
    record(result)
    print("\n".join(harness.host_lines(harness.host()) + harness.condition_lines(result)))
    check_measurement(result, "competing")
    if TARGETS:
        quiet = harness.measure(runs=3, reps=REPS, with_bench=False)
        missed = {name: got for name, (met, got) in harness.loaded_targets(quiet, result).items() if not met}
        assert not missed, missed
