"""The float32 bars hold under every BLAS kernel this CPU can run, not only the one the suite runs under.

OpenBLAS picks a matrix-product kernel for the CPU it finds; OPENBLAS_CORETYPE forces another (an older one on
a newer CPU). Kernels sum in different orders and with or without fused multiply-adds, so float32 results differ
from one to the next in their last bits, and a real model's float32 gradients by up to ~2e-5. A float32 bar that
one kernel meets and another misses would pass here and fail on a user's machine; so the parity report, the judge
on the clean corpus and (under -m slow) every float32 test run again here, in subprocesses, under
OPENBLAS_CORETYPE unset, Haswell, SkylakeX and Sandybridge: the ones this CPU can run (an AVX-512 kernel needs an
AVX-512 CPU), each kernel once (unset is one of the others on most CPUs), and the float32 tests not again under the
kernel this run itself uses. With a BLAS other than OpenBLAS, the variable means nothing and only the default
kernel is run.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from parity_tests import components as C

ROOT = Path(__file__).resolve().parent.parent
# OPENBLAS_CORETYPE -> the CPU flag (/proc/cpuinfo) its instructions need
KERNELS = {"Haswell": "avx2", "SkylakeX": "avx512f", "Sandybridge": "avx"}


def numpy_blas() -> str | None:
    """The internal API of the BLAS NumPy loaded ('openblas', 'mkl', ...)."""
    import numpy  # noqa: F401  (loaded before threadpoolctl looks)

    apis = [i["internal_api"] for i in threadpool_info() if i["user_api"] == "blas"]
    return apis[0] if apis else None


def cpu_flags() -> set:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


def runnable_kernels() -> list:
    """'default' (OPENBLAS_CORETYPE unset), then each forced kernel this CPU can run under NumPy's OpenBLAS."""
    if numpy_blas() != "openblas" or platform.machine() not in ("x86_64", "AMD64"):
        return ["default"]
    flags = cpu_flags()
    return ["default"] + [kernel for kernel, flag in KERNELS.items() if flag in flags]


def this_process_kernel() -> str | None:
    """The kernel this process's NumPy OpenBLAS runs (lower case), or None under another BLAS."""
    archs = [i.get("architecture") for i in threadpool_info() if i.get("internal_api") == "openblas"]
    return archs[0].lower() if archs and archs[0] else None


def distinct_kernels(including_this_process: bool) -> list:
    """runnable_kernels(), each kernel once: OpenBLAS's own choice (unset) is often one of the forced ones (Haswell
    on an AVX2 CPU, SkylakeX on an AVX-512 one). With including_this_process=False, the kernel this test run itself
    runs under is left out too: its tests have run already, here. Never empty (another BLAS: ["default"])."""
    here, runnable = this_process_kernel(), runnable_kernels()
    if here is None or runnable == ["default"]:
        return ["default"]
    seen = set() if including_this_process else {here}
    kernels = []
    for kernel in runnable:
        if kernel != "default":
            architecture = kernel.lower()
        elif "OPENBLAS_CORETYPE" not in os.environ:
            architecture = here  # unset, as this process
        else:
            architecture = kernel_in_use(kernel_env(kernel)).strip().lower()
        if architecture not in seen:
            seen.add(architecture)
            kernels.append(kernel)
    return kernels or ["default"]


def kernel_env(kernel: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    if kernel != "default":
        env["OPENBLAS_CORETYPE"] = kernel
    env["OPENBLAS_VERBOSE"] = "0"
    return env


def kernel_in_use(env: dict) -> str:
    """The kernel NumPy's OpenBLAS reports in a fresh process with `env` (proves the setting took effect)."""
    code = (
        "import numpy, threadpoolctl; "
        "print([i.get('architecture') for i in threadpoolctl.threadpool_info() if i['internal_api'] == 'openblas'][0])"
    )
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout


def test_each_kernel_is_run_once_and_every_kernel_is_run():
    """The kernels OpenBLAS really runs (as it reports them in a fresh process) under the settings chosen above:
    no kernel twice, none missing, and this process's own left out of the float32 tests' second run."""
    if numpy_blas() != "openblas":
        assert distinct_kernels(True) == distinct_kernels(False) == ["default"]
        return
    in_use = {kernel: kernel_in_use(kernel_env(kernel)).strip().lower() for kernel in runnable_kernels()}
    report = [in_use[kernel] for kernel in distinct_kernels(including_this_process=True)]
    assert len(set(report)) == len(report) and set(report) == set(in_use.values()), (in_use, report)
    rerun = [in_use[kernel] for kernel in distinct_kernels(including_this_process=False)]
    others = set(report) - {this_process_kernel()}
    assert len(set(rerun)) == len(rerun) and set(rerun) == (others or {this_process_kernel()}), (in_use, rerun)


@pytest.mark.parametrize("kernel", distinct_kernels(including_this_process=True))
def test_parity_report_passes_in_reduced_precision_under_kernel(kernel, tmp_path):
    """`transformer-parity --dtype float32` (every component, model and Hugging Face row, the real
    all-MiniLM-L6-v2 included) exits 0 under this kernel, every row within its bar."""
    env = kernel_env(kernel)
    if kernel != "default":
        assert kernel_in_use(env).strip().lower() == kernel.lower()
    path = tmp_path / "report.json"
    run = subprocess.run(
        [sys.executable, "-m", "parity_tests", "--dtype", "float32", "--device", "cpu", "--no-fd", "--json", str(path)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, f"OPENBLAS_CORETYPE={kernel}:\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}"
    records = json.loads(path.read_text())["records"]
    assert len(records) > 40 and all(r["passed"] for r in records)
    minilm = [r for r in records if r["component"].startswith("all-MiniLM")]
    assert len(minilm) == 1 and minilm[0]["reference_float32"] is not None  # judged by what float32 can do there
    assert max(r["grad_rel_error"] for r in records if r["reference_float32"] is None) <= C.BAR[np.dtype(np.float32)]


@pytest.mark.slow
@pytest.mark.parametrize("kernel", distinct_kernels(including_this_process=False))
def test_every_reduced_precision_test_passes_under_kernel(kernel):
    """Every test with float32 in its name (NumPy vs torch, vs torch.nn, vs transformers, the tiled attention,
    the fast path, extreme inputs), run again under this kernel. Marked slow (35-40 s a kernel on 2 cores, which
    took the default run past 10 minutes); the parity report and the judge's clean corpus run under every kernel
    in the default run."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "float32",
            "parity_tests",
            f"--ignore={Path(__file__).relative_to(ROOT)}",
        ],  # fmt: skip
        env=kernel_env(kernel),
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, f"OPENBLAS_CORETYPE={kernel}:\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}"
    summary = run.stdout.strip().splitlines()[-1]
    assert " passed" in summary and " failed" not in summary, summary
    assert int(summary.split(" passed")[0].split()[-1]) > 150, summary


# Every clean model of the judge's corpus, judged in a fresh process: its verdict, and the closest float32 call (the
# worst error / bar ratio over the float32 rows, with that tensor's bar and the range of bars).
JUDGE_CORPUS = """
import json
import torch
from parity_tests import check
from parity_tests.corpus import STYLES, clean, load
from parity_tests.test_corpus import TODAY
out = {}
for style in STYLES:
    for factory in clean(style):
        if style + "." + factory.__name__ in TODAY:
            continue  # known not to pass yet: test_corpus.py holds it as a strict xfail
        torch.manual_seed(0)
        result = check.module(factory(), load(style).LEVEL, call=load(style).CALL)
        rows = [r for r in result.rows if r.dtype == "float32"]
        worst = max(rows, key=lambda r: r.error / r.bar)
        bars = sorted(r.bar for r in rows)
        out[style + "." + factory.__name__] = dict(
            passed=result.passed, ratio=worst.error / worst.bar, tensor=worst.name, bars=(bars[0], bars[-1]),
            derived=all(r.own is not None for r in rows),
        )
print(json.dumps(out))
"""


@pytest.mark.parametrize("kernel", distinct_kernels(including_this_process=False))
def test_judge_passes_every_clean_corpus_model_under_kernel(kernel):
    """check.module's float32 bars, derived per tensor from the reference's own float32 error, hold under this
    kernel: every clean model of the corpus passes (d2l's attention weight gradients, 1.05e-5 and 1.13e-5 under
    Haswell, failed the fixed bar of 1e-5). This run's own kernel is left out: test_corpus.py judged them under it."""
    run = subprocess.run(
        [sys.executable, "-c", JUDGE_CORPUS], env=kernel_env(kernel), cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0, f"OPENBLAS_CORETYPE={kernel}:\n{run.stderr[-4000:]}"
    models = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(models) >= 10 and all(m["derived"] for m in models.values()), models
    failed = {name: m for name, m in models.items() if not m["passed"] or not m["ratio"] <= 1.0}
    assert not failed, f"OPENBLAS_CORETYPE={kernel}: {failed}"
