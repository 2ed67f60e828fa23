"""The cost of attention's batched matrix products, written two ways, on a quiet and on a busy machine.

    python benchmarks/attention_products.py                    # (32, 12, 128, 32) float32, 3 rounds of 5
    python benchmarks/attention_products.py --rounds 1 --reps 3 --shape 4 2 16 8

Attention multiplies a (B, H) stack of small matrices six times per step: S = Q K^T and O = P V forward,
dV = P^T dO, dP = dO V^T, dQ = dS K and dK = dS^T Q backward. Q, K, V and dO are laid out as split_heads leaves them
(views of (B, T, H, Dh)). Three ways, interleaved repetition by repetition in one process:

- "matmul": every product as @ over the stacks (the plain path before);
- "einsum": every product as np.einsum(..., optimize=True);
- "plain path": what attention.py and scores.py do: the two products with a transposed second operand (Q K^T and
  dO V^T) as einsum, the other four as @.

Each round times them "quiet" (no process of this script competing; the machine may have other users: the load
average is printed) and "loaded" (with a subprocess multiplying 1000 x 1000 matrices in a loop on every core).
Prints, per round and condition, the median forward (S, O) and backward (dV, dP, dQ, dK) times in ms.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

HOG = "import numpy as np\na = np.random.rand(1000, 1000)\nwhile True:\n    a @ a"


def operands(B: int, H: int, T: int, Dh: int, dtype) -> dict:
    """q, k, v, dout (B, H, T, Dh) as split_heads leaves them; p (probabilities) and ds (B, H, T, T)."""
    rng = np.random.default_rng(0)

    def heads():
        return rng.standard_normal((B, T, H, Dh)).astype(dtype).transpose(0, 2, 1, 3)  # (B, H, T, Dh), a view

    q, k, v, dout = heads(), heads(), heads(), heads()
    p = rng.random((B, H, T, T)).astype(dtype)
    ds = rng.standard_normal((B, H, T, T)).astype(dtype)
    return {"q": q, "k": k, "v": v, "dout": dout, "p": p, "ds": ds}


def einsum(eq: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum(eq, a, b, optimize=True)


def variants(x: dict) -> dict:
    """name -> (forward, backward): each a function returning its products."""
    q, k, v, dout, p, ds = (x[n] for n in ("q", "k", "v", "dout", "p", "ds"))
    return {
        "matmul": (
            lambda: (q @ k.swapaxes(-1, -2), p @ v),
            lambda: (p.swapaxes(-1, -2) @ dout, dout @ v.swapaxes(-1, -2), ds @ k, ds.swapaxes(-1, -2) @ q),
        ),
        "einsum": (
            lambda: (einsum("bhqd,bhkd->bhqk", q, k), einsum("bhqk,bhkd->bhqd", p, v)),
            lambda: (
                einsum("bhqk,bhqd->bhkd", p, dout),
                einsum("bhqd,bhkd->bhqk", dout, v),
                einsum("bhqk,bhkd->bhqd", ds, k),
                einsum("bhqk,bhqd->bhkd", ds, q),
            ),
        ),
        "plain path": (
            lambda: (einsum("bhqd,bhkd->bhqk", q, k), p @ v),
            lambda: (p.swapaxes(-1, -2) @ dout, einsum("bhqd,bhkd->bhqk", dout, v), ds @ k, ds.swapaxes(-1, -2) @ q),
        ),
    }


def check_agree(ways: dict, rtol: float) -> None:
    reference = [y for fn in ways["matmul"] for y in fn()]
    for name, fns in ways.items():
        got = [y for fn in fns for y in fn()]
        for i, (a, b) in enumerate(zip(reference, got, strict=True)):
            if not np.allclose(a, b, rtol=rtol, atol=rtol * float(np.abs(a).max())):
                raise AssertionError(f"{name}: product {i} differs from matmul's")


def milliseconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def measure(ways: dict, reps: int) -> dict:
    """name -> (median forward ms, median backward ms), the ways interleaved repetition by repetition."""
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in ways}
    for _ in range(reps):
        for name, (forward, backward) in ways.items():
            times[name][0].append(milliseconds(forward))
            times[name][1].append(milliseconds(backward))
    return {name: (statistics.median(f), statistics.median(b)) for name, (f, b) in times.items()}


def report(label: str, result: dict) -> None:
    cells = "   ".join(f"{name} {f:6.1f} + {b:6.1f}" for name, (f, b) in result.items())
    print(f"{label:6s} (load {os.getloadavg()[0]:4.1f}): {cells}", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=4, default=(32, 12, 128, 32), metavar=("B", "H", "T", "Dh"))
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    B, H, T, Dh = args.shape
    ways = variants(operands(B, H, T, Dh, np.dtype(args.dtype)))
    check_agree(ways, 1e-4 if args.dtype == "float32" else 1e-10)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, NumPy {np.__version__}, "
          f"shape {tuple(args.shape)} {args.dtype}; forward + backward, medians of {args.reps}, ms")  # fmt: skip
    for _ in range(args.rounds):
        report("quiet", measure(ways, args.reps))
        hog = subprocess.Popen([sys.executable, "-c", HOG])
        try:
            time.sleep(1.0)  # let it start multiplying
            report("loaded", measure(ways, args.reps))
        finally:
            hog.kill()
            hog.wait()


if __name__ == "__main__":
    main()
