"""The per-op table of bench.py --ops (this module, imported by it): each op of the benchmarked models, NumPy
(numpy_transformer's own function) against torch (torch's own op), on the same float32 arrays and the same threads,
interleaved, forward and backward.

    python benchmarks/bench.py --ops --json docs/data/ops.json

The whole-model ratios of bench.py are sums of these: a model is as far from torch as the ops its time goes to.
Shapes are all-MiniLM-L6-v2's at batch 32 x 128 tokens (N = 4096 rows, D 384, 12 heads of 32, d_ff 1536) and, for the
few-row products of decoding, Qwen2-0.5B's (D 896, d_ff 4864) at 1, 8 and 64 rows. A backward is timed on its own:
NumPy's backward on the cache of one forward, torch's autograd.grad on the graph of one forward (retained).
"""

from __future__ import annotations

import functools
import math
import os
import re
import time

import numpy as np
import torch
import torch.nn.functional as F

from numpy_transformer import attention, layers, loss, parallel

MINILM = dict(N=4096, D=384, F=1536, B=32, H=12, T=128, Dh=32)
DECODE = dict(D=896, F=4864, rows=(1, 8, 64))
QUICK = dict(N=64, D=32, F=64, B=2, H=2, T=16, Dh=16)
QUICK_DECODE = dict(D=64, F=128, rows=(1, 8))


def torch_blas() -> str:
    """The BLAS torch was built with (its build settings' BLAS_INFO), with MKL's version when it is MKL."""
    config = torch.__config__.show()
    found = re.search(r"BLAS_INFO=(\w+)", config)
    name = found.group(1) if found else "unknown"
    mkl = re.search(r"Math Kernel Library Version ([\w.-]+)", config)
    return f"{name} {mkl.group(1)}" if name == "mkl" and mkl else name


def _backward_of(torch_fn, *inputs):
    """(a function timing torch's backward of torch_fn on inputs, its upstream gradient's shape): the graph of one
    forward, kept, and autograd.grad on it with a fixed random upstream gradient."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = torch_fn(*leaves)
    dout = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)


class _Pairs:
    """The timed ops as they are added, and what they are made of: float32 arrays drawn from rng, and the fast
    path's version of a NumPy function (n_parts parts)."""

    def __init__(self, rng: np.random.Generator, n_parts: int):
        self.rng, self.n_parts, self.rows = rng, n_parts, []

    def array(self, *shape, scale=1.0):
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)

    def add(self, op, pass_, shape, np_fn, fast_fn, torch_fn):
        self.rows.append((op, pass_, shape, np_fn, fast_fn, torch_fn))

    def parts(self, *arrays):
        """The rows (axis 0) of the arrays, cut into the fast path's parts: [(rows of each array), ...]."""
        return [tuple(a[lo:hi] for a in arrays) for lo, hi in parallel.split_rows(len(arrays[0]), self.n_parts)]

    def fast(self, fn, *arrays):
        """fn on the rows of a part per core, as the fast path runs it."""
        work = self.parts(*arrays)
        return lambda: parallel.map_parts(fn, work)

    def fast_backward(self, forward, backward, arrays, dout):
        """backward on each part's own cache (forward on its rows), then the parameter gradients of the parts (all
        a backward returns after the input's gradient) added in part order."""
        work = [(d, forward(*rows)[1]) for (d,), rows in zip(self.parts(dout), self.parts(*arrays), strict=True)]

        def run():
            results = parallel.map_parts(backward, work)
            if isinstance(results[0], tuple):
                for grads in zip(*(r[1:] for r in results), strict=True):
                    if grads[0] is not None:
                        functools.reduce(np.add, grads)
            return results

        return run


def op_pairs(
    s: dict, d: dict, rng: np.random.Generator, n_parts: int = parallel.CORES
) -> list[tuple[str, str, str, object, object, object]]:
    """Every timed op: (op, pass, shape, numpy function, fast-path function or None, torch function), on shared
    float32 arrays. The fast path's function runs the same NumPy function on the rows of a part per core
    (parallel.map_parts, n_parts parts, one BLAS thread each), as DataParallel runs it inside a model: each part
    keeps its outputs (nothing is concatenated) and a backward's parameter gradients are added in part order. Its
    GELU is the fast path's float32 kernel (parallel.FLOAT32_KERNELS). Decoding's few-row products, which have no
    batch to cut, cut the weight's rows instead (one row of the table)."""
    pairs = _Pairs(rng, n_parts)
    for section in (_linear_pairs, _few_row_pairs, _activation_pairs, _attention_pairs, _norm_pairs):
        section(pairs, s, d)
    return pairs.rows


def _linear_pairs(p: _Pairs, s: dict, d: dict) -> None:
    """MiniLM's linear layers, forward and backward."""
    N, D, Fh, B, H, T, Dh = (s[k] for k in ("N", "D", "F", "B", "H", "T", "Dh"))
    # Linear layers, y = x W^T + b: MiniLM's four shapes (QKV are three of the first)
    for d_in, d_out in ((D, D), (D, Fh), (Fh, D)):
        x, w, b = p.array(N, d_in), p.array(d_out, d_in, scale=d_in**-0.5), p.array(d_out)
        tx, tw, tb = map(torch.from_numpy, (x, w, b))
        _, cache = layers.linear_forward(x, w, b)
        dy = p.array(N, d_out)
        shape = f"({N}, {d_in}) -> {d_out}"

        def linear(x, w=w, b=b):
            return layers.linear_forward(x, w, b)

        p.add(
            "linear",
            "forward",
            shape,
            lambda x=x, linear=linear: linear(x),
            p.fast(linear, x),
            lambda tx=tx, tw=tw, tb=tb: F.linear(tx, tw, tb),
        )
        p.add(
            "linear",
            "backward",
            shape,
            lambda dy=dy, cache=cache: layers.linear_backward(dy, cache),
            p.fast_backward(linear, layers.linear_backward, (x,), dy),
            _backward_of(F.linear, tx, tw, tb),
        )


def _few_row_pairs(p: _Pairs, s: dict, d: dict) -> None:
    """Decoding's few-row products, in each layout. The fast column of x @ W.T cuts W's rows (the output features)
    into a part per core, each part one BLAS thread: the one way a decoding step (which has no batch to cut) could
    use the cores other than BLAS's own threading, timed to show whether it would pay."""
    # Few-row products of decoding: y = x W^T with few rows x, in each layout NumPy could run it, and as
    # linear_forward runs it (up to layers.FEW_ROWS rows, (W x^T)^T)
    for d_in, d_out in ((d["D"], d["F"]), (d["F"], d["D"])):
        w = p.array(d_out, d_in, scale=d_in**-0.5)
        tw = torch.from_numpy(w)
        for rows in d["rows"]:
            x = p.array(rows, d_in)
            tx = torch.from_numpy(x)
            shape = f"({rows}, {d_in}) -> {d_out}"
            torch_fn = lambda tx=tx, tw=tw: F.linear(tx, tw)  # noqa: E731
            by_features = p.fast(lambda w_part, x=x: x @ w_part.T, w)
            p.add("few rows x @ W.T", "forward", shape, lambda x=x, w=w: x @ w.T, by_features, torch_fn)
            p.add("few rows (W @ x.T).T", "forward", shape, lambda x=x, w=w: (w @ x.T).T, None, torch_fn)
            p.add(
                "few rows linear_forward",
                "forward",
                shape,
                lambda x=x, w=w: layers.linear_forward(x, w, None),
                None,
                torch_fn,
            )
            if rows == 1:
                v, tv = x[0], tx[0]
                p.add(
                    "matrix-vector W @ v", "forward", shape, lambda v=v, w=w: w @ v, None, lambda tv=tv, tw=tw: tw @ tv
                )


def _activation_pairs(p: _Pairs, s: dict, d: dict) -> None:
    """GELU (exact and tanh) and SiLU on the feed-forward's hidden units."""
    N, D, Fh, B, H, T, Dh = (s[k] for k in ("N", "D", "F", "B", "H", "T", "Dh"))
    # Element-wise activations on the feed-forward's hidden units (N, d_ff)
    h = p.array(N, Fh)
    th = torch.from_numpy(h)
    dh = p.array(N, Fh)
    for name, op, torch_fn in (
        ("gelu", "gelu (exact)", F.gelu),
        ("gelu_tanh", "gelu (tanh)", lambda t: F.gelu(t, approximate="tanh")),
        ("silu", "silu", F.silu),
    ):
        forward, backward = layers.ACTIVATIONS[name]
        fast_forward, fast_backward_fn = parallel.FLOAT32_KERNELS.get(name, (forward, backward))
        _, cache = forward(h)
        shape = f"({N}, {Fh})"
        p.add(op, "forward", shape, lambda f=forward: f(h), p.fast(fast_forward, h), lambda f=torch_fn: f(th))
        p.add(
            op,
            "backward",
            shape,
            lambda b=backward, c=cache: b(dh, c),
            p.fast_backward(fast_forward, fast_backward_fn, (h,), dh),
            _backward_of(torch_fn, th),
        )


def _attention_pairs(p: _Pairs, s: dict, d: dict) -> None:
    """Softmax, log-softmax, the attention products and RoPE."""
    N, D, Fh, B, H, T, Dh = (s[k] for k in ("N", "D", "F", "B", "H", "T", "Dh"))
    # Attention: softmax of the scores (B, H, T, T) and the products around it
    scores = p.array(B, H, T, T, scale=2.0)
    ts = torch.from_numpy(scores)
    dp = p.array(B, H, T, T)
    _, sm_cache = layers.softmax_forward(scores)
    shape = f"({B}, {H}, {T}, {T})"
    p.add(
        "softmax",
        "forward",
        shape,
        lambda: layers.softmax_forward(scores),
        p.fast(layers.softmax_forward, scores),
        lambda: torch.softmax(ts, -1),
    )
    p.add(
        "softmax",
        "backward",
        shape,
        lambda: layers.softmax_backward(dp, sm_cache),
        p.fast_backward(layers.softmax_forward, layers.softmax_backward, (scores,), dp),
        _backward_of(lambda t: torch.softmax(t, -1), ts),
    )
    logits = p.array(N, 4 * D)
    tl = torch.from_numpy(logits)
    p.add(
        "log-softmax",
        "forward",
        f"({N}, {4 * D})",
        lambda: loss.log_softmax(logits),
        p.fast(loss.log_softmax, logits),
        lambda: torch.log_softmax(tl, -1),
    )

    q, k, v = p.array(B, H, T, Dh), p.array(B, H, T, Dh), p.array(B, H, T, Dh)
    tq, tk, tv = map(torch.from_numpy, (q, k, v))
    probs = layers.softmax_forward(scores)[0]
    tp = torch.from_numpy(probs)
    dsc, dctx = p.array(B, H, T, T), p.array(B, H, T, Dh)

    def scores_forward(q, k):
        return q @ k.swapaxes(-1, -2)

    def scores_backward(dsc, q, k):
        return dsc @ k, dsc.swapaxes(-1, -2) @ q

    def context_forward(p, v):
        return p @ v

    def context_backward(dctx, p, v):
        return dctx @ v.swapaxes(-1, -2), p.swapaxes(-1, -2) @ dctx

    p.add(
        "attention scores q k^T",
        "forward",
        shape,
        lambda: scores_forward(q, k),
        p.fast(scores_forward, q, k),
        lambda: tq @ tk.transpose(-1, -2),
    )
    p.add(
        "attention scores q k^T",
        "backward",
        shape,
        lambda: scores_backward(dsc, q, k),
        p.fast(scores_backward, dsc, q, k),
        _backward_of(lambda a, b: a @ b.transpose(-1, -2), tq, tk),
    )
    cshape = f"({B}, {H}, {T}, {Dh})"
    p.add(
        "attention context p v",
        "forward",
        cshape,
        lambda: context_forward(probs, v),
        p.fast(context_forward, probs, v),
        lambda: tp @ tv,
    )
    p.add(
        "attention context p v",
        "backward",
        cshape,
        lambda: context_backward(dctx, probs, v),
        p.fast(context_backward, dctx, probs, v),
        _backward_of(lambda a, b: a @ b, tp, tv),
    )

    # RoPE on the queries (B, H, T, Dh)
    cos, sin = attention.rope_angles(np.arange(T), Dh, 10000.0, dtype=np.float32)
    tcos, tsin = torch.from_numpy(cos), torch.from_numpy(sin)
    _, rope_cache = attention.rope_forward(q, cos, sin)

    def rope(q):
        return attention.rope_forward(q, cos, sin)

    def torch_rope(t):
        t1, t2 = t[..., : Dh // 2], t[..., Dh // 2 :]
        return torch.cat([t1 * tcos - t2 * tsin, t1 * tsin + t2 * tcos], dim=-1)

    p.add("rope", "forward", cshape, lambda: rope(q), p.fast(rope, q), lambda: torch_rope(tq))
    p.add(
        "rope",
        "backward",
        cshape,
        lambda: attention.rope_backward(dctx, rope_cache),
        p.fast_backward(rope, attention.rope_backward, (q,), dctx),
        _backward_of(torch_rope, tq),
    )


def _norm_pairs(p: _Pairs, s: dict, d: dict) -> None:
    """Layer norm and RMSNorm over the model width."""
    N, D, Fh, B, H, T, Dh = (s[k] for k in ("N", "D", "F", "B", "H", "T", "Dh"))
    # Norms over the model width (N, D)
    x, w, b = p.array(N, D), 1 + p.array(D, scale=0.1), p.array(D, scale=0.1)
    tx, tw, tb = map(torch.from_numpy, (x, w, b))
    dy = p.array(N, D)
    shape = f"({N}, {D})"
    _, ln_cache = layers.layer_norm_forward(x, w, b, 1e-12)

    def layer_norm(x):
        return layers.layer_norm_forward(x, w, b, 1e-12)

    def rms_norm(x):
        return layers.rms_norm_forward(x, w, 1e-6)

    p.add(
        "layer norm",
        "forward",
        shape,
        lambda: layer_norm(x),
        p.fast(layer_norm, x),
        lambda: F.layer_norm(tx, (D,), tw, tb, 1e-12),
    )
    p.add(
        "layer norm",
        "backward",
        shape,
        lambda: layers.layer_norm_backward(dy, ln_cache),
        p.fast_backward(layer_norm, layers.layer_norm_backward, (x,), dy),
        _backward_of(lambda a, g, c: F.layer_norm(a, (D,), g, c, 1e-12), tx, tw, tb),
    )
    _, rms_cache = layers.rms_norm_forward(x, w, 1e-6)
    p.add(
        "rms norm", "forward", shape, lambda: rms_norm(x), p.fast(rms_norm, x), lambda: F.rms_norm(tx, (D,), tw, 1e-6)
    )
    p.add(
        "rms norm",
        "backward",
        shape,
        lambda: layers.rms_norm_backward(dy, rms_cache),
        p.fast_backward(rms_norm, layers.rms_norm_backward, (x,), dy),
        _backward_of(lambda a, g: F.rms_norm(a, (D,), g, 1e-6), tx, tw),
    )


# An op is timed as this many seconds of calls in a row (at least one call, at most MAX_CALLS), the time per call
# reported: after the pause before each timing the cores' idle threads sleep, and waking them (the fast path's pool
# thread, torch's workers; on a virtual machine an idle virtual CPU) costs up to a millisecond or two, which a
# model's step pays once, not once an op. Quiet, 2 cores (load 0.1-0.9): layer norm's fast forward on (4096, 384) took
# 3.8 ms as one call after a 10 ms pause, 2.7 ms a call as three in a row, 1.9 ms as ten in a row (its plain call
# 3.6-4.2 ms); the longer the pause, the slower the first calls (three in a row after 0.3 s: 5.3 ms a call).
SECONDS_PER_TIMING = 0.03
MAX_CALLS = 30


def calls_per_timing(fn) -> int:
    """Calls in a row for one timing of an op whose plain call is fn: enough for SECONDS_PER_TIMING (one call
    measured to see)."""
    start = time.perf_counter()
    fn()
    return max(1, min(MAX_CALLS, math.ceil(SECONDS_PER_TIMING / max(time.perf_counter() - start, 1e-9))))


def repeated(fn, calls: int):
    """fn called `calls` times in a row."""

    def run():
        for _ in range(calls):
            fn()

    return run


def ops_table(quick: bool, interleaved, reps: int, n_parts: int = parallel.CORES, only: list | None = None) -> dict:
    """Median seconds of each op, NumPy's plain call, the fast path's (n_parts parts) and torch's interleaved
    (bench.interleaved), and the ratios over torch. only: the ops whose name contains one of these (default: all)."""
    rng = np.random.default_rng(0)
    pairs = op_pairs(QUICK if quick else MINILM, QUICK_DECODE if quick else DECODE, rng, n_parts)
    pairs = [pair for pair in pairs if not only or any(name in pair[0] for name in only)]
    rows = []
    load_before = os.getloadavg()[0]
    with torch.no_grad():  # the forwards build no graph (the backward closures hold theirs already)
        for op, pass_, shape, np_fn, fast_fn, torch_fn in pairs:
            calls = calls_per_timing(np_fn)
            fns = {"numpy": np_fn, "fast": fast_fn, "torch": torch_fn}
            fns = {k: repeated(f, calls) for k, f in fns.items() if f is not None}
            times = {k: t / calls for k, t in interleaved(fns, reps, pause=0.01).items()}
            fast_time = times.get("fast")
            rows.append(
                {
                    "op": op,
                    "pass": pass_,
                    "shape": shape,
                    "calls_per_timing": calls,
                    "numpy": times["numpy"],
                    "fast": fast_time,
                    "torch": times["torch"],
                    "ratio_numpy_over_torch": times["numpy"] / times["torch"],
                    "ratio_fast_over_torch": None if fast_time is None else fast_time / times["torch"],
                }
            )
    return {
        "ops": rows,
        "fast_path_parts": n_parts,
        "load_average": [load_before, os.getloadavg()[0]],
        "torch_blas": torch_blas(),
    }


def print_ops(report: dict) -> None:
    print(
        "numpy: the plain call; fast: the fast path's, the same function on the rows of a part per core "
        f"({report['fast_path_parts']} parts, parallel.map_parts); -: the fast path does not run it"
    )
    print(
        f"{'op':26s} {'pass':9s} {'shape':24s} {'numpy ms':>9s} {'fast ms':>9s} {'torch ms':>9s} "
        f"{'numpy/torch':>11s} {'fast/torch':>10s}"
    )
    for r in report["ops"]:
        fast = "-" if r["fast"] is None else f"{r['fast'] * 1e3:.3f}"
        fast_ratio = "-" if r["ratio_fast_over_torch"] is None else f"{r['ratio_fast_over_torch']:.2f}"
        print(
            f"{r['op']:26s} {r['pass']:9s} {r['shape']:24s} {r['numpy'] * 1e3:9.3f} {fast:>9s} {r['torch'] * 1e3:9.3f} "
            f"{r['ratio_numpy_over_torch']:11.2f} {fast_ratio:>10s}"
        )
    print(f"load average before/after: {report['load_average'][0]:.2f} / {report['load_average'][1]:.2f}")
