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

import os
import re

import numpy as np
import torch
import torch.nn.functional as F

from numpy_transformer import attention, layers, loss

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


def op_pairs(s: dict, d: dict, rng: np.random.Generator) -> list[tuple[str, str, str, object, object]]:
    """Every timed pair: (op, pass, shape, numpy function, torch function), on shared float32 arrays."""

    def array(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    N, D, Fh, B, H, T, Dh = (s[k] for k in ("N", "D", "F", "B", "H", "T", "Dh"))
    pairs: list = []

    def add(op, pass_, shape, np_fn, torch_fn):
        pairs.append((op, pass_, shape, np_fn, torch_fn))

    # Linear layers, y = x W^T + b: MiniLM's four shapes (QKV are three of the first)
    for d_in, d_out in ((D, D), (D, Fh), (Fh, D)):
        x, w, b = array(N, d_in), array(d_out, d_in, scale=d_in**-0.5), array(d_out)
        tx, tw, tb = map(torch.from_numpy, (x, w, b))
        _, cache = layers.linear_forward(x, w, b)
        dy = array(N, d_out)
        shape = f"({N}, {d_in}) -> {d_out}"
        add(
            "linear",
            "forward",
            shape,
            lambda x=x, w=w, b=b: layers.linear_forward(x, w, b),
            lambda tx=tx, tw=tw, tb=tb: F.linear(tx, tw, tb),
        )
        add(
            "linear",
            "backward",
            shape,
            lambda dy=dy, cache=cache: layers.linear_backward(dy, cache),
            _backward_of(F.linear, tx, tw, tb),
        )

    # Few-row products of decoding: y = x W^T with few rows x, in each layout NumPy could run it, and as
    # linear_forward runs it (up to layers.FEW_ROWS rows, (W x^T)^T)
    for d_in, d_out in ((d["D"], d["F"]), (d["F"], d["D"])):
        w = array(d_out, d_in, scale=d_in**-0.5)
        tw = torch.from_numpy(w)
        for rows in d["rows"]:
            x = array(rows, d_in)
            tx = torch.from_numpy(x)
            shape = f"({rows}, {d_in}) -> {d_out}"
            add("few rows x @ W.T", "forward", shape, lambda x=x, w=w: x @ w.T, lambda tx=tx, tw=tw: F.linear(tx, tw))
            add(
                "few rows (W @ x.T).T",
                "forward",
                shape,
                lambda x=x, w=w: (w @ x.T).T,
                lambda tx=tx, tw=tw: F.linear(tx, tw),
            )
            add(
                "few rows linear_forward",
                "forward",
                shape,
                lambda x=x, w=w: layers.linear_forward(x, w, None),
                lambda tx=tx, tw=tw: F.linear(tx, tw),
            )
            if rows == 1:
                v, tv = x[0], tx[0]
                add("matrix-vector W @ v", "forward", shape, lambda v=v, w=w: w @ v, lambda tv=tv, tw=tw: tw @ tv)

    # Element-wise activations on the feed-forward's hidden units (N, d_ff)
    h = array(N, Fh)
    th = torch.from_numpy(h)
    dh = array(N, Fh)
    for op, (forward, backward), torch_fn in (
        ("gelu (exact)", layers.ACTIVATIONS["gelu"], F.gelu),
        ("gelu (tanh)", layers.ACTIVATIONS["gelu_tanh"], lambda t: F.gelu(t, approximate="tanh")),
        ("silu", layers.ACTIVATIONS["silu"], F.silu),
    ):
        _, cache = forward(h)
        shape = f"({N}, {Fh})"
        add(op, "forward", shape, lambda f=forward: f(h), lambda f=torch_fn: f(th))
        add(op, "backward", shape, lambda b=backward, c=cache: b(dh, c), _backward_of(torch_fn, th))

    # Attention: softmax of the scores (B, H, T, T) and the products around it
    scores = array(B, H, T, T, scale=2.0)
    ts = torch.from_numpy(scores)
    dp = array(B, H, T, T)
    _, sm_cache = layers.softmax_forward(scores)
    shape = f"({B}, {H}, {T}, {T})"
    add("softmax", "forward", shape, lambda: layers.softmax_forward(scores), lambda: torch.softmax(ts, -1))
    add(
        "softmax",
        "backward",
        shape,
        lambda: layers.softmax_backward(dp, sm_cache),
        _backward_of(lambda t: torch.softmax(t, -1), ts),
    )
    logits = array(N, 4 * D)
    tl = torch.from_numpy(logits)
    add(
        "log-softmax", "forward", f"({N}, {4 * D})", lambda: loss.log_softmax(logits), lambda: torch.log_softmax(tl, -1)
    )

    q, k, v = array(B, H, T, Dh), array(B, H, T, Dh), array(B, H, T, Dh)
    tq, tk, tv = map(torch.from_numpy, (q, k, v))
    probs = layers.softmax_forward(scores)[0]
    tp = torch.from_numpy(probs)
    dsc, dctx = array(B, H, T, T), array(B, H, T, Dh)
    add("attention scores q k^T", "forward", shape, lambda: q @ k.swapaxes(-1, -2), lambda: tq @ tk.transpose(-1, -2))
    add(
        "attention scores q k^T",
        "backward",
        shape,
        lambda: (dsc @ k, dsc.swapaxes(-1, -2) @ q),
        _backward_of(lambda a, b: a @ b.transpose(-1, -2), tq, tk),
    )
    cshape = f"({B}, {H}, {T}, {Dh})"
    add("attention context p v", "forward", cshape, lambda: probs @ v, lambda: tp @ tv)
    add(
        "attention context p v",
        "backward",
        cshape,
        lambda: (dctx @ v.swapaxes(-1, -2), probs.swapaxes(-1, -2) @ dctx),
        _backward_of(lambda a, b: a @ b, tp, tv),
    )

    # RoPE on the queries (B, H, T, Dh)
    cos, sin = attention.rope_angles(np.arange(T), Dh, 10000.0, dtype=np.float32)
    tcos, tsin = torch.from_numpy(cos), torch.from_numpy(sin)
    _, rope_cache = attention.rope_forward(q, cos, sin)

    def torch_rope(t):
        t1, t2 = t[..., : Dh // 2], t[..., Dh // 2 :]
        return torch.cat([t1 * tcos - t2 * tsin, t1 * tsin + t2 * tcos], dim=-1)

    add("rope", "forward", cshape, lambda: attention.rope_forward(q, cos, sin), lambda: torch_rope(tq))
    add("rope", "backward", cshape, lambda: attention.rope_backward(dctx, rope_cache), _backward_of(torch_rope, tq))

    # Norms over the model width (N, D)
    x, w, b = array(N, D), 1 + array(D, scale=0.1), array(D, scale=0.1)
    tx, tw, tb = map(torch.from_numpy, (x, w, b))
    dy = array(N, D)
    shape = f"({N}, {D})"
    _, ln_cache = layers.layer_norm_forward(x, w, b, 1e-12)
    add(
        "layer norm",
        "forward",
        shape,
        lambda: layers.layer_norm_forward(x, w, b, 1e-12),
        lambda: F.layer_norm(tx, (D,), tw, tb, 1e-12),
    )
    add(
        "layer norm",
        "backward",
        shape,
        lambda: layers.layer_norm_backward(dy, ln_cache),
        _backward_of(lambda a, g, c: F.layer_norm(a, (D,), g, c, 1e-12), tx, tw, tb),
    )
    _, rms_cache = layers.rms_norm_forward(x, w, 1e-6)
    add(
        "rms norm",
        "forward",
        shape,
        lambda: layers.rms_norm_forward(x, w, 1e-6),
        lambda: F.rms_norm(tx, (D,), tw, 1e-6),
    )
    add(
        "rms norm",
        "backward",
        shape,
        lambda: layers.rms_norm_backward(dy, rms_cache),
        _backward_of(lambda a, g: F.rms_norm(a, (D,), g, 1e-6), tx, tw),
    )
    return pairs


def ops_table(quick: bool, interleaved, reps: int) -> dict:
    """Median seconds of each pair, NumPy and torch interleaved (bench.interleaved), and their ratio."""
    rng = np.random.default_rng(0)
    pairs = op_pairs(QUICK if quick else MINILM, QUICK_DECODE if quick else DECODE, rng)
    rows = []
    load_before = os.getloadavg()[0]
    with torch.no_grad():  # the forwards build no graph (the backward closures hold theirs already)
        for op, pass_, shape, np_fn, torch_fn in pairs:
            times = interleaved({"numpy": np_fn, "torch": torch_fn}, reps, pause=0.01)
            rows.append(
                {
                    "op": op,
                    "pass": pass_,
                    "shape": shape,
                    **times,
                    "ratio_numpy_over_torch": times["numpy"] / times["torch"],
                }
            )
    return {"ops": rows, "load_average": [load_before, os.getloadavg()[0]], "torch_blas": torch_blas()}


def print_ops(report: dict) -> None:
    print(f"{'op':26s} {'pass':9s} {'shape':24s} {'numpy ms':>9s} {'torch ms':>9s} {'numpy/torch':>11s}")
    for r in report["ops"]:
        print(
            f"{r['op']:26s} {r['pass']:9s} {r['shape']:24s} {r['numpy'] * 1e3:9.3f} {r['torch'] * 1e3:9.3f} "
            f"{r['ratio_numpy_over_torch']:11.2f}"
        )
    print(f"load average before/after: {report['load_average'][0]:.2f} / {report['load_average'][1]:.2f}")
