"""Tiled attention (flash_attention_*) vs the plain pair (scaled_dot_product_attention_*) vs torch's SDPA, on the CPU:
peak memory and time of one forward + backward, B = 1, H = 8, Dh = 64, float32, full and causal.

    python benchmarks/flash_attention.py                       # T = 256 .. 8192, a few minutes
    python benchmarks/flash_attention.py --quick               # small T, seconds (the test suite runs this)
    python benchmarks/flash_attention.py --json out.json --out figures/

How each figure is measured:
- NumPy peak memory: tracemalloc's peak over one forward + backward (NumPy reports its array allocations to
  tracemalloc), the inputs and the upstream gradient excluded: what the pass itself allocates, outputs and
  gradients included.
- torch peak memory: tracemalloc cannot see torch's CPU allocator, so it is the growth of the resident set
  (VmHWM, the kernel's high-water mark, reset with /proc/self/clear_refs just before the pass) in a fresh
  process, inputs already allocated, after one pass that is not counted (torch's start-up, its code paged in),
  whose freed memory is handed back with malloc_trim. Page- and allocator-granular: an order of magnitude.
- Time: the best of a few forward + backward passes (one at the largest T): on a shared machine other processes
  only ever add time, so the minimum is the steadiest figure. torch gets one pass first that is not timed.
- The plain pair is skipped where its (B, H, T, T) arrays would need more than --plain-limit-gb (it holds
  about three at once: probabilities, their gradient and the scores' gradient; causal adds a T x T bool mask).
The machine is shared: the load average before and after is printed, and timings are only as steady as it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from threadpoolctl import threadpool_info  # noqa: E402

from numpy_transformer.attention import (  # noqa: E402
    causal_mask,
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)
from numpy_transformer.flash_attention import flash_attention_backward, flash_attention_forward  # noqa: E402

B, H, DH = 1, 8, 64
FULL = dict(lengths=(256, 512, 1024, 2048, 4096, 8192), sweep_T=2048, sweep_blocks=(32, 64, 128, 256), reps=3)
QUICK = dict(lengths=(128, 256, 512), sweep_T=256, sweep_blocks=(32, 64, 128), reps=1)
MIB = 2**20


def inputs(T: int, seed: int = 0):
    """q, k, v and an upstream gradient dout, each (B, H, T, Dh) float32."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((B, H, T, DH), dtype=np.float32) for _ in range(4)]


def plain_pass(q, k, v, dout, causal: bool, **_):
    out, cache = scaled_dot_product_attention_forward(q, k, v, causal_mask(q.shape[2], k.shape[2]) if causal else None)
    return out, scaled_dot_product_attention_backward(dout, cache)


def tiled_pass(q, k, v, dout, causal: bool, block_q: int = 64, block_k: int = 64):
    out, cache = flash_attention_forward(q, k, v, None, causal, block_q, block_k)
    return out, flash_attention_backward(dout, cache)


def torch_pass(q, k, v, dout, causal: bool, **_):
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out.backward(dout)
    return out


def torch_inputs(arrays):
    q, k, v, dout = (torch.from_numpy(a) for a in arrays)
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), dout


def tracemalloc_peak(fn) -> float:
    """MiB allocated at the peak of fn(), as tracemalloc counts (NumPy arrays included)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / MIB
    finally:
        tracemalloc.stop()


def seconds(fn, reps: int, warm_up: bool = False) -> float:
    if warm_up:  # not timed: torch's start-up (the NumPy pairs were just run once under tracemalloc)
        fn()
    times = []
    for _ in range(reps):
        time.sleep(0.1)  # let BLAS/OpenMP worker threads stop spinning after the previous pass
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


TORCH_RSS = """
import ctypes, re, sys, resource
import numpy as np, torch, torch.nn.functional as F
T, causal, B, H, DH = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rng = np.random.default_rng(0)
q, k, v, dout = (torch.from_numpy(rng.standard_normal((B, H, T, DH), dtype=np.float32)) for _ in range(4))
q.requires_grad_(); k.requires_grad_(); v.requires_grad_()
F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(dout)  # start-up and code pages: not counted
q.grad = k.grad = v.grad = None
ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand what the first pass freed back to the kernel
def kib(field):
    return int(re.search(field + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1))
try:
    open("/proc/self/clear_refs", "w").write("5")  # reset the high-water mark to the current resident set
    before = kib("VmRSS")
except OSError:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(dout)
print((kib("VmHWM") - before) / 1024)
"""


def torch_rss_peak(T: int, causal: bool) -> float:
    """MiB of resident-set growth over one torch forward + backward, in a fresh process."""
    args = [str(T), "1" if causal else "0", str(B), str(H), str(DH)]
    out = subprocess.run([sys.executable, "-c", TORCH_RSS, *args], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def plain_estimate_mib(T: int, causal: bool) -> float:
    """About three float32 (B, H, T, T) arrays live at once in the plain pair, plus the causal bool mask."""
    return (3 * B * H * T * T * 4 + (T * T if causal else 0)) / MIB


def run(p: dict, block_q: int, block_k: int, plain_limit_gb: float, torch_memory: bool) -> dict:
    rows = []
    for causal in (False, True):
        for T in p["lengths"]:
            arrays = inputs(T)
            reps = 1 if T == max(p["lengths"]) else p["reps"]
            blocks = dict(block_q=block_q, block_k=block_k)
            for kernel, fn in (("plain", plain_pass), ("tiled", tiled_pass)):
                row = dict(T=T, causal=causal, kernel=kernel, memory="tracemalloc", skipped="")
                if kernel == "plain" and plain_estimate_mib(T, causal) > plain_limit_gb * 1024:
                    estimate = plain_estimate_mib(T, causal)
                    row |= dict(seconds=None, peak_mib=None, estimate_mib=estimate)
                    row["skipped"] = f"would need ~{_size(estimate)} > {_size(plain_limit_gb * 1024)}"
                else:
                    one_pass = functools.partial(fn, *arrays, causal, **blocks)
                    row["peak_mib"] = tracemalloc_peak(one_pass)
                    row["seconds"] = seconds(one_pass, reps)
                rows.append(row)
                print_row(row)
            row = dict(T=T, causal=causal, kernel="torch", skipped="")
            one_pass = functools.partial(torch_pass, *torch_inputs(arrays), causal)
            row["seconds"] = seconds(one_pass, reps, warm_up=True)
            row["peak_mib"] = torch_rss_peak(T, causal) if torch_memory else None
            row["memory"] = "RSS growth, fresh process" if torch_memory else "not measured (--quick)"
            rows.append(row)
            print_row(row)
    return rows


def block_sweep(p: dict) -> list:
    """The tiled pair at one T with several square block sizes: what the default is chosen from."""
    arrays, out = inputs(p["sweep_T"]), []
    for size in p["sweep_blocks"]:
        for causal in (False, True):
            blocks = dict(block_q=size, block_k=size)
            one_pass = functools.partial(tiled_pass, *arrays, causal, **blocks)
            peak, secs = tracemalloc_peak(one_pass), seconds(one_pass, p["reps"])
            out.append(dict(T=p["sweep_T"], causal=causal, block=size, peak_mib=peak, seconds=secs))
    return out


def _size(mib: float) -> str:
    return f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib:.0f} MiB"


HEADER = f"{'T':>6} {'causal':>6} {'kernel':>6} {'peak MiB':>10} {'seconds':>9}  memory / note"


def print_row(row: dict) -> None:
    peak = "-" if row.get("peak_mib") is None else f"{row['peak_mib']:10.1f}"
    secs = "-" if row.get("seconds") is None else f"{row['seconds']:9.3f}"
    note = f"skipped: {row['skipped']}" if row["skipped"] else row["memory"]
    print(f"{row['T']:>6} {str(row['causal']):>6} {row['kernel']:>6} {peak:>10} {secs:>9}  {note}", flush=True)


def targets(rows: list, block_q: int, block_k: int) -> dict:
    """The issue's targets, where this run has the lengths they name."""

    def get(T, causal, kernel):
        return next((r for r in rows if r["T"] == T and r["causal"] == causal and r["kernel"] == kernel), None)

    out = {}
    for causal in (False, True):
        tiled, plain = get(2048, causal, "tiled"), get(2048, causal, "plain")
        if tiled and plain and plain["peak_mib"]:
            key = "causal" if causal else "full"
            out[f"T=2048 {key}: tiled peak / plain peak <= 0.1"] = tiled["peak_mib"] / plain["peak_mib"]
            out[f"T=2048 {key}: tiled time / plain time <= 2"] = tiled["seconds"] / plain["seconds"]
        tiled, plain = get(8192, causal, "tiled"), get(8192, causal, "plain")
        if tiled and plain:
            key = "causal" if causal else "full"
            out[f"T=8192 {key}: tiled runs, plain skipped"] = bool(tiled["seconds"] and plain["skipped"])
    out["block sizes"] = f"block_q={block_q}, block_k={block_k}"
    return out


def machine() -> dict:
    blas = [lib for lib in threadpool_info() if lib.get("user_api") == "blas"]
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "numpy": np.__version__,
        "numpy_blas": [{k: lib.get(k) for k in ("internal_api", "version", "num_threads")} for lib in blas],
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "load_average": list(os.getloadavg()),
    }


def plot(rows: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_mem, ax_time) = plt.subplots(1, 2, figsize=(11, 4.2))
    styles = {"plain": ("C0", "o"), "tiled": ("C1", "s"), "torch": ("C2", "^")}
    for kernel, (color, marker) in styles.items():
        for causal, line in ((False, "-"), (True, "--")):
            sel = [r for r in rows if r["kernel"] == kernel and r["causal"] == causal]
            label = f"{kernel}{' causal' if causal else ''}"
            mem = [(r["T"], r["peak_mib"]) for r in sel if r.get("peak_mib")]
            tim = [(r["T"], r["seconds"]) for r in sel if r.get("seconds")]
            if mem:
                ax_mem.plot(*zip(*mem, strict=True), line, color=color, marker=marker, label=label)
            if tim:
                ax_time.plot(*zip(*tim, strict=True), line, color=color, marker=marker, label=label)
    ax_mem.set_title("peak memory of forward + backward\n(NumPy: tracemalloc; torch: RSS growth)")
    ax_mem.set_ylabel("MiB")
    ax_time.set_title(f"time of forward + backward (B={B}, H={H}, Dh={DH}, float32)")
    ax_time.set_ylabel("seconds")
    for ax in (ax_mem, ax_time):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small lengths, one repetition: seconds")
    parser.add_argument("--json", type=Path, help="write the table and the machine here")
    parser.add_argument("--out", type=Path, help="write flash_attention.png into this directory")
    parser.add_argument("--block-q", type=int, default=64)
    parser.add_argument("--block-k", type=int, default=64)
    parser.add_argument(
        "--plain-limit-gb", type=float, help="skip the plain pair above this estimate (default 4; 0.02 with --quick)"
    )
    args = parser.parse_args(argv)
    p = QUICK if args.quick else FULL
    limit = args.plain_limit_gb if args.plain_limit_gb is not None else (0.02 if args.quick else 4.0)

    info = machine()
    print(f"B={B}, H={H}, Dh={DH}, float32; numpy {info['numpy']} {info['numpy_blas']}; torch {info['torch']}")
    print(f"torch threads {info['torch_threads']}; {info['cpus_usable']} CPUs; load average {info['load_average']}")
    print(HEADER)
    rows = run(p, args.block_q, args.block_k, limit, torch_memory=not args.quick)
    print(f"\nblock sizes, tiled pair at T={p['sweep_T']}:")
    print(f"{'block':>6} {'causal':>6} {'peak MiB':>10} {'seconds':>9}")
    sweep = block_sweep(p)
    for r in sweep:
        print(f"{r['block']:>6} {str(r['causal']):>6} {r['peak_mib']:10.1f} {r['seconds']:9.3f}")
    goals = targets(rows, args.block_q, args.block_k)
    if len(goals) > 1:
        print("\ntargets:")
        for name, value in goals.items():
            print(f"  {name}: {value if isinstance(value, (bool, str)) else f'{value:.3f}'}")
    info["load_average_after"] = list(os.getloadavg())
    print(f"\nload average after: {info['load_average_after']} (other processes share these CPUs: timings are noisy)")

    report = dict(machine=info, shape=dict(B=B, H=H, Dh=DH, dtype="float32"), plain_limit_gb=limit, rows=rows,
                  block_sweep=sweep, targets=goals)  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        plot(rows, args.out / "flash_attention.png")
        print(f"plot: {args.out / 'flash_attention.png'}")


if __name__ == "__main__":
    main()
