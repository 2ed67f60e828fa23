"""The fast path: everything that makes a NumPy step fast lives here, and only here.

The reference (layers, attention, model, loss, optim) is written to be read: one batch, one Python
thread. NumPy's BLAS spreads each matrix product over the cores, but every element-wise operation
(softmax, norms, dropout, the loss, the optimizer's arithmetic) runs on one core per call. This
module runs the same reference code, unchanged, on every core:

    runner = DataParallel(model)                  # one part of each batch per core
    model.zero_grad()
    loss = runner.forward_backward((src_ids, tgt_in), tgt_out, ignore_index=config.pad_id, label_smoothing=0.1)
    optimizer.step(model.grads)                   # model.grads holds the whole batch's gradient

- DataParallel: the batch is cut into one part per core (along the batch axis). Each part's forward,
  loss and backward runs in its own thread, with BLAS limited to one thread, on a replica of the model
  that shares the parameter arrays and keeps its own caches and gradients. NumPy releases the GIL inside
  its array loops and BLAS calls, so the parts run at the same time and every operation, matrix product
  or element-wise, is spread over the cores. The loss of part k is weighted by n_k / n (its share of the
  targets that are not ignored), so the parts' gradients add up to exactly the gradient of the whole
  batch's mean loss.
- map_parts: how DataParallel runs its parts, and how any single op runs on its rows, a part per core: NumPy's
  element-wise ops (softmax, norms, activations) run one thread per call, so in the fast path each core runs
  the op on its own rows. benchmarks/ops_table.py (bench.py --ops) times every op so, beside the plain call.
- map_chunks: the thread pool behind the optimizer's step and the sum of the parts' gradients. An
  element-wise update touches each element alone, so cutting a tensor into chunks changes no result.

The plain path (model.forward, cross_entropy_*, model.backward) stays the reference:
parity_tests/test_parallel.py checks that both give the same loss, outputs and gradients (float64: to
1e-12; a part's rows take the same arithmetic, and only the sums over the batch split differently),
that a seeded fast step repeats bit for bit, and that its dropout masks replay into the plain path.

Determinism: the parts and their order are fixed by the batch size and n_parts, each part's dropout masks
come from its own generator seeded from model.rng, BLAS runs one thread per part, and the gradients are
added in part order. A seeded run repeats bitwise for a given n_parts (default: the number of cores);
its dropout masks differ from the plain path's (another stream), and are kept, by site, in
model.dropout_masks for the whole batch, so torch (or the plain path) can replay them.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import math
import os
import platform
import threading
import time
import weakref
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import layers
from .layers import Dropout
from .loss import cross_entropy_backward, cross_entropy_forward
from .model import EncoderModel, Transformer, TransformerLM, check_token_type_ids
from .special import horner
from .validation import check_bool, check_float_array, check_ids


def available_cores() -> int:
    """The cores this process may use: the CPUs it may run on (its affinity), fewer where a cgroup CPU quota
    (a container's --cpus) allows less. A part per visible CPU on a machine whose quota is smaller would put
    several parts' threads on each allowed core."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpu_quota()
    return max(1, min(cpus, quota) if quota else cpus)


def cgroup_cpu_quota() -> int | None:
    """The CPU quota of this process's cgroup in whole cores (rounded up), or None when there is none."""
    try:
        limit, period = _read("/sys/fs/cgroup/cpu.max").split()  # cgroup v2: "max 100000" or "200000 100000"
    except (OSError, ValueError):
        try:  # cgroup v1
            limit = _read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").strip()
            period = _read("/sys/fs/cgroup/cpu/cpu.cfs_period_us").strip()
        except OSError:
            return None
    try:
        return None if limit in ("max", "-1") else max(1, math.ceil(int(limit) / int(period)))
    except (ValueError, ZeroDivisionError):
        return None


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


CORES = available_cores()


@functools.cache
def pool() -> ThreadPoolExecutor:
    """The threads of the fast path, one per core, made on first use."""
    return ThreadPoolExecutor(max_workers=CORES, thread_name_prefix="numpy_transformer")


# glibc's mallopt settings (malloc.h), each skipped when its environment variable chose otherwise.
MALLOPT = {
    "MALLOC_ARENA_MAX": (-8, 1),  # every thread allocates from the main heap
    "MALLOC_MMAP_THRESHOLD_": (-3, 32 << 20),  # arrays below 32 MiB come from the heap (glibc's upper limit)...
    "MALLOC_TRIM_THRESHOLD_": (-1, 1 << 30),  # ... which keeps up to 1 GiB of freed memory for the next step
}


def keep_freed_memory() -> dict:
    """On glibc, let freed arrays be reused instead of handed back to the kernel, for the whole process
    (returns what was set). Opt-in: nothing here calls it. Call it once, at the start of a program, before
    threads allocate; it cannot be undone.

    It changes the allocator of the whole process, so every library in it feels it, torch included (a torch
    training step measured at 224 ms took 162 ms once these settings were in force): compare implementations
    either all with it or all without (benchmarks/bench.py --keep-freed-memory does the former).

    Why: a training step allocates and frees hundreds of MiB of activations and gradients. By default glibc
    serves most of them with mmap (its threshold rises to 32 MiB only as it learns), gives each thread an
    arena of its own, and unmaps or trims what is freed; every page of the next step is then faulted in and
    zeroed again by the kernel, and unmapping interrupts the other core (a TLB shoot-down), which the two
    parts of a step feel. With one arena, a 32 MiB mmap threshold and a 1 GiB trim threshold, a fast step's
    kernel page clearing falls from 3% of its cycles to under 1% and its time by about 5-10%. The cost: the
    process keeps its peak heap resident between steps. Results are not affected."""
    if platform.libc_ver()[0] != "glibc":
        return {}
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no mallopt in this C library after all
        return {}
    return {name: value for name, (param, value) in MALLOPT.items() if name not in os.environ and mallopt(param, value)}


# Element-wise work is cut into chunks of this many elements: large enough that the Python overhead of
# a chunk is small, small enough (1 MiB of float32) that the several passes of an update run in cache.
CHUNK = 1 << 18


def map_chunks(fn, groups: list) -> None:
    """fn(*chunks) for every chunk of every group, on every core.

    groups: tuples of flat arrays, the arrays of a tuple of one size; each tuple is cut into chunks of CHUNK
    elements at the same places, and fn gets the chunks of one place. fn must be element-wise (an element's
    result may not depend on another element), so that the chunking changes no result.
    """
    chunk = CHUNK
    work = [tuple(a[lo : lo + chunk] for a in group) for group in groups for lo in range(0, group[0].size, chunk)]
    if len(work) == 1:
        fn(*work[0])
        return
    for _ in pool().map(lambda args: fn(*args), work):
        pass


# ----------------------------------------------------------------------------------------------
# BLAS threads: one per part while the parts run (two BLAS pools of every core on two parts would
# fight over the cores). threadpoolctl finds the BLAS NumPy loaded, whichever it is.


@functools.cache
def _blas_controller():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


_OPENBLAS_AFFIXES = [(prefix, suffix) for prefix in ("", "scipy_") for suffix in ("", "64_", "_64")]


@functools.cache
def blas_thread_setters() -> list:
    """(get, set) of the thread count of every BLAS library loaded. OpenBLAS on its own threads keeps one
    count for the whole process, and threadpoolctl lets only the first Python thread that changed it change it
    again (the others' calls do nothing, which would leave the parts of a runner in another thread on every
    core): for it, OpenBLAS's own openblas_get/set_num_threads; threadpoolctl's controller for the rest."""
    setters = []
    for lib in _blas_controller().select(user_api="blas").lib_controllers:
        own = None
        if lib.internal_api == "openblas" and lib.threading_layer != "openmp":
            for prefix, suffix in _OPENBLAS_AFFIXES:
                name = f"{prefix}openblas_{{}}_num_threads{suffix}"
                get, set_ = (getattr(lib.dynlib, name.format(op), None) for op in ("get", "set"))
                if get is not None and set_ is not None:
                    own = (get, set_)
                    break
        setters.append(own or (lambda lib=lib: lib.num_threads, lib.set_num_threads))
    return setters


class _PartsRunning:
    """The state of the process while parts run: BLAS on one thread, no cycle collection. Counted, so that calls
    may nest and overlap in any order (two runners in two threads, one inside another's limit): the first to enter
    saves the process's settings and sets them, the last to leave restores them, however each left."""

    def __init__(self):
        self._lock = threading.Lock()
        self._inside = 0
        self._saved: list = []  # the BLAS libraries' thread counts before the first entry
        self._collecting = False

    def __enter__(self):
        with self._lock:
            if self._inside == 0:
                self._saved = [get() for get, _ in blas_thread_setters()]
                for _, set_threads in blas_thread_setters():
                    set_threads(1)
                self._collecting = gc.isenabled()
                gc.disable()  # the parts' caches are thousands of dicts and tuples: no cycle collection halfway
            self._inside += 1
        return self

    def __exit__(self, *exc):
        with self._lock:
            self._inside -= 1
            if self._inside == 0:
                for (_, set_threads), n in zip(blas_thread_setters(), self._saved, strict=True):
                    set_threads(n)
                if self._collecting:
                    gc.enable()

    def swap_outside_counts(self, counts: list) -> list:
        """Set the BLAS libraries' thread counts outside the parts (now, or, while parts run, when the last of them
        leaves) and return the ones they replace."""
        with self._lock:
            if self._inside:
                previous, self._saved = self._saved, list(counts)
                return previous
            previous = [get() for get, _ in blas_thread_setters()]
            for (_, set_threads), n in zip(blas_thread_setters(), counts, strict=True):
                set_threads(n)
            return previous


_PARTS_RUNNING = _PartsRunning()


def one_blas_thread() -> _PartsRunning:
    """A context manager: inside it, every BLAS call runs on the calling thread only (and the cycle collector
    waits). It nests, and overlaps with itself in other threads: the settings from before the first entry come
    back when the last one leaves."""
    return _PARTS_RUNNING


def blas_thread_counts() -> list[int]:
    """The thread count of every BLAS library loaded (NumPy's first), as BLAS calls outside the fast path's parts
    run them."""
    return [get() for get, _ in blas_thread_setters()]


@contextlib.contextmanager
def blas_threads(n: int | np.integer) -> Iterator[list[int]]:
    """A context manager: inside it, BLAS calls outside the fast path's parts run on n threads (every BLAS library
    loaded); the earlier counts, which it yields, come back when it exits, however it exits. While parts run (in
    any thread) they keep their one thread each, and the new count applies once they finish. For a program's
    setup or a benchmark's, which gives NumPy and torch the same threads:

        with parallel.blas_threads(parallel.CORES):
            torch.set_num_threads(parallel.CORES)
            ...
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n must be an int (BLAS threads), got {type(n).__name__} ({n!r})")
    if n < 1:
        raise ValueError(f"n must be >= 1 (BLAS threads), got {n}")
    previous = _PARTS_RUNNING.swap_outside_counts([int(n)] * len(blas_thread_setters()))
    try:
        yield previous
    finally:
        _PARTS_RUNNING.swap_outside_counts(previous)


# ----------------------------------------------------------------------------------------------
# Float32 kernels of the parts' threads: the same functions as the reference's, computed faster where
# float32 allows it. The reference's float32 GELU takes erf within one unit in the last place (special.erf,
# float32 below |x| = 0.8, float64 beyond); this one computes the normal distribution function Phi in float32, in
# fewer passes, within 1.5e-7: its GELU forward 1.7 times as fast as the reference's (36 against 63 ms of CPU on
# (4096, 1536), one EPYC core; three times as fast against the earlier float64 erf): a part of the fast path's
# all-MiniLM-L6-v2 forward spends 0.05 s of its 0.63 s in it (0.07 s with the float32 erf it replaced). Float64
# always runs the reference.

# Phi(x) = 1 / (1 + exp(-l(x))), with l = log(Phi / (1 - Phi)) its logit, which is odd and close to a cubic
# (the logistic GELU approximation takes l(x) ~ 1.702 x); here l(x) ~ x G(x^2), G of degree 6, a polynomial fit of
# ours (iteratively reweighted least squares on [0, 6], each error weighted by how far it moves Phi and x Phi:
# (1 + x) x Phi(x) Phi(-x)). In float32 its Phi is within 1.5e-7 of the true value (the reference's, rounded from
# the exact erf, within 6e-8); x is clipped to +-6 first, where Phi rounds to 1 and Phi(-6) = 1e-9 (ours:
# 3e-11), so exp never overflows. One exp and one division replace the erf's two polynomials.
_LOGIT_G = (
    1.5957696133173578, 0.0726662329309404, -6.48011793709085e-05, -0.0001108723010708451,
    7.98781504547701e-06, -2.6976835833248916e-07, 3.6720697059255534e-09,
)  # fmt: skip
_MINUS_G = tuple(-c for c in _LOGIT_G)  # -G: exp(-l) straight from Horner's rule, without a negation pass
_CDF_CLIP = np.float32(6.0)
_KERNEL_CHUNK = 1 << 17  # elements (512 KiB of float32): few enough calls that two parts seldom wait for the GIL


def normal_cdf_float32(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Phi(x) of a float32 array into `out`, within 1.5e-7: 1 / (1 + exp(-x G(x^2))), Horner's rule on x^2, all in
    float32. NaN stays NaN; Phi(+inf) = 1, Phi(-inf) = 3e-11."""
    xc = np.clip(x, -_CDF_CLIP, _CDF_CLIP)
    minus_logit = horner(_MINUS_G, xc * xc)  # float32 throughout: xc is
    minus_logit *= xc
    e = np.exp(minus_logit, out=minus_logit)
    e += np.float32(1.0)
    return np.divide(np.float32(1.0), e, out=out)


def gelu_forward(x: np.ndarray):
    """layers.gelu_forward, x Phi(x), with normal_cdf_float32 for a float32 x, in chunks that stay in cache; the
    same returns (out, layers.GeluCache(x, cdf)), so layers.gelu_backward is its backward."""
    if x.dtype != np.float32:
        return layers.gelu_forward(x)
    out, cdf = np.empty_like(x), np.empty_like(x)
    flat_x, flat_out, flat_cdf = x.reshape(-1), out.reshape(-1), cdf.reshape(-1)
    for lo in range(0, x.size, _KERNEL_CHUNK):
        part = slice(lo, lo + _KERNEL_CHUNK)
        np.multiply(flat_x[part], normal_cdf_float32(flat_x[part], flat_cdf[part]), out=flat_out[part])
    return out, layers.GeluCache(x, cdf)


# The activations the parts' feed-forward blocks use instead of the model's (model.replica(activation_table=...)).
FLOAT32_KERNELS = {"gelu": (gelu_forward, layers.gelu_backward)}


# ----------------------------------------------------------------------------------------------
# Dropout of one part: its rows of the whole batch's keep-masks, drawn from the part's own generator.


class _BatchMasks:
    """The keep-masks of one forward pass of the whole batch, by site: each part writes its rows."""

    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self.masks: dict = {}
        self._lock = threading.Lock()

    def rows(self, site: str, part_shape: tuple, lo: int) -> np.ndarray:
        with self._lock:  # the first part to reach a site allocates the batch's mask
            if site not in self.masks:
                self.masks[site] = np.empty((self.batch_size, *part_shape[1:]), dtype=np.bool_)
        return self.masks[site][lo : lo + part_shape[0]]


class PartDropout(Dropout):
    """Dropout of the rows lo .. lo + B_k of a batch, from this part's generator, written straight into its rows
    of the batch's mask (no copy, no concatenation).

    Cheaper draws than Dropout's, with the same meaning: a unit is kept when a uniform 32-bit integer u is at
    least ceil(p * 2^32), so P(keep) = 1 - ceil(p * 2^32) / 2^32, within 2^-32 of 1 - p (Dropout's float32
    uniforms are within 2^-24). Two 32-bit words come from each raw 64-bit output of the generator, instead of
    one float per call: about twice as fast."""

    rng: np.random.Generator  # always given (Dropout's may be None)

    def __init__(self, p: float | dict, rng: np.random.Generator, batch_masks: _BatchMasks, lo: int):
        super().__init__(p, rng=rng)
        self.batch_masks, self.lo = batch_masks, lo

    def keep_mask(self, site: str, shape: tuple) -> np.ndarray:
        self.used.add(site)
        mask = self.batch_masks.rows(site, tuple(shape), self.lo)
        threshold = math.ceil(self.rate(site) * 2**32)  # keep iff u >= threshold; 2^32 (p = 1) keeps nothing
        if threshold >= 2**32:
            mask[...] = False
        else:
            n = mask.size
            words = self.rng.bit_generator.random_raw((n + 1) // 2).view(np.uint32)[:n]  # n uniform 32-bit ints
            np.greater_equal(words.reshape(mask.shape), threshold, out=mask)
        self.masks[site] = mask
        return mask


# ----------------------------------------------------------------------------------------------
# Data parallelism over the batch, in threads.


def split_rows(batch_size: int, n_parts: int) -> list:
    """Row bounds [(lo, hi), ...] of min(n_parts, batch_size) parts whose sizes differ by at most one."""
    n = max(1, min(n_parts, batch_size))
    edges = [batch_size * k // n for k in range(n + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))


def map_parts(fn, parts: list) -> list:
    """[fn(*part) for part in parts], the parts at once: the first on this thread, the others on the pool, every
    BLAS call on its calling thread only (one_blas_thread). Returns the results in part order; the first error is
    raised once all parts have finished.

    The fast path's one way of running work on every core: DataParallel runs a model's forward and backward on
    one part of the batch per core with it, and any single op runs the same way on its rows (benchmarks/ops_table.py
    times each op so, as the fast path runs it: the rows of a part stay in its thread, nothing is concatenated):

        parts = [(x[lo:hi],) for lo, hi in split_rows(len(x), CORES)]
        outputs = [out for out, cache in map_parts(layers.softmax_forward, parts)]  # row k's softmax in part k
    """
    if not parts:
        return []
    with one_blas_thread():
        futures = [pool().submit(fn, *part) for part in parts[1:]]
        try:
            first = fn(*parts[0])
        finally:
            errors = [f.exception() for f in futures]  # wait for every part before leaving the BLAS limit
        for error in errors:
            if error is not None:
                raise error
    return [first] + [f.result() for f in futures]


def _rows(x, lo: int, hi: int):
    return None if x is None else x[lo:hi]


class DataParallel:
    """Runs a model's forward and backward on parts of the batch at once, one thread per part.

    model: a Transformer, TransformerLM or EncoderModel (its params are shared, never copied).
    n_parts: parts per batch (default: the number of cores). Results depend on it only through rounding.
    float32_kernels: in float32, compute the activations of FLOAT32_KERNELS (GELU) with their faster kernels
    (within 1e-6 of the reference's); False: exactly the reference's functions. Float64 always runs those.

    forward(*inputs, dropout_masks=None) -> outputs, as model.forward (the parts' outputs concatenated);
    backward(doutputs) accumulates into model.grads, as model.backward;
    forward_backward(inputs, targets, ignore_index, label_smoothing) -> the whole batch's mean
    cross-entropy, with its gradient accumulated into model.grads (forward, loss and backward all in
    the parts' threads).
    After a forward, model.dropout_masks holds the batch's keep-masks by site (as after model.forward);
    the caches live in the replicas, so model.attention_maps() and model.activations() need the plain path.

    Threads: several runners may share one model and run in several threads at once; their additions into
    model.grads take turns (one lock per model), so the result is the sum of all their batches' gradients.
    One runner is one forward-then-backward sequence, like the model itself: use one per thread.

    phase_seconds: the seconds of the last call's phases, for a profile of the fast path: "parts" (the parts'
    work, in their threads) and, after a call that adds gradients, "sum of the parts' gradients".
    """

    def __init__(self, model, n_parts: int | np.integer | None = None, float32_kernels: bool = True):
        if not isinstance(model, (Transformer, TransformerLM, EncoderModel)):
            kinds = "a numpy_transformer Transformer, TransformerLM or EncoderModel"
            raise TypeError(f"model must be {kinds}, got {type(model).__name__}")
        if n_parts is not None:
            if isinstance(n_parts, bool) or not isinstance(n_parts, (int, np.integer)):
                raise TypeError(f"n_parts must be an int, got {type(n_parts).__name__} ({n_parts!r})")
            if n_parts < 1:
                raise ValueError(f"n_parts must be >= 1, got {n_parts}")
        self.model = model
        self.n_parts = CORES if n_parts is None else int(n_parts)
        self.activation_table = {**model.activation_table, **FLOAT32_KERNELS} if float32_kernels else None
        self.replicas: list = []
        self.bounds: list = []
        self.output_shape: tuple | None = None
        self.phase_seconds: dict[str, float] = {}
        self._kept_nothing = False  # the last forward ran with keep_cache=False

    # -- the parts -------------------------------------------------------------------------

    def _replicas(self, batch_size: int, dropout_masks: dict | None) -> list:
        """One replica per part: the model's params (shared) and mode, its own grads, cache and dropout."""
        model = self.model
        self.bounds = split_rows(batch_size, self.n_parts)
        drawing = model.training and model.config.has_dropout and dropout_masks is None
        if drawing:  # one generator per part, seeded from the model's stream: the same seed, the same masks
            seeds = model.rng.integers(0, 2**63, size=len(self.bounds))
            batch_masks = _BatchMasks(batch_size)
        replicas = []
        for k, (lo, _) in enumerate(self.bounds):
            dropout = None
            if drawing:
                dropout = PartDropout(model.config.dropout_rates, np.random.default_rng(seeds[k]), batch_masks, lo)
            replicas.append(model.replica(dropout=dropout, activation_table=self.activation_table))
        if drawing:
            model.dropout_masks = batch_masks.masks
        elif dropout_masks is not None and model.training and model.config.has_dropout:
            model.dropout_masks = dict(dropout_masks)
        else:
            model.dropout_masks = {}
        return replicas

    def _run(self, fn, args: list) -> list:
        """fn(k, *args[k]) for every part k at once (map_parts). Returns the results in part order."""
        start = time.perf_counter()
        results = map_parts(fn, [(k, *a) for k, a in enumerate(args)])
        self.phase_seconds = {"parts": time.perf_counter() - start}  # a new call: its phases only
        return results

    def _sum_grads(self, part_grads: list) -> None:
        """Add the parts' gradients (one dict per part), in part order ((g_0 + g_1) + g_2 ...), into the first
        part's arrays (its own, fresh from its backward), chunk by chunk on every core; then accumulate the sums
        into model.grads as model.backward does, one runner at a time."""
        start = time.perf_counter()
        total = {}
        for name in self.model.params:
            parts = [grads[name] for grads in part_grads if name in grads]
            if parts:
                first = parts[0] if parts[0].flags.c_contiguous else np.ascontiguousarray(parts[0])
                total[name] = [first, *parts[1:]]
        for j in range(1, max((len(parts) for parts in total.values()), default=0)):
            pairs = [(parts[0].reshape(-1), parts[j].reshape(-1)) for parts in total.values() if len(parts) > j]
            map_chunks(_add_in_place, pairs)
        with grads_lock(self.model):
            self.model.accumulate_grads({name: parts[0] for name, parts in total.items()})
        self.phase_seconds["sum of the parts' gradients"] = time.perf_counter() - start

    def _split(self, arrays) -> list:
        return [tuple(_rows(x, lo, hi) for x in arrays) for lo, hi in self.bounds]

    # -- the public steps ------------------------------------------------------------------

    def forward(self, *inputs, dropout_masks: dict | None = None, keep_cache: bool = True) -> np.ndarray:
        """model.forward(*inputs) on the parts at once; the outputs of the parts, concatenated (B, ...).
        keep_cache=False: inference, as model.forward's (backward then has nothing to differentiate)."""
        check_bool("keep_cache", keep_cache)
        inputs = _check_inputs(self.model, inputs)
        self.replicas, self.output_shape, self._kept_nothing = [], None, False  # until this forward has succeeded
        replicas = self._replicas(len(inputs[0]), dropout_masks)

        masks: list[dict | None] = [None] * len(self.bounds)
        if dropout_masks is not None:  # replay: each part reads its rows of the batch's masks
            masks = [{site: np.asarray(m)[lo:hi] for site, m in dropout_masks.items()} for lo, hi in self.bounds]

        def part(k, *rows):
            return replicas[k].forward(*rows, dropout_masks=masks[k], keep_cache=keep_cache)

        outputs = np.concatenate(self._run(part, self._split(inputs)), axis=0)
        if keep_cache:
            self.replicas, self.output_shape = replicas, outputs.shape
        self._kept_nothing = not keep_cache
        return outputs

    def backward(self, doutputs: np.ndarray) -> None:
        """model.backward(doutputs) on the parts of the last forward: accumulates into model.grads."""
        if not self.replicas and self._kept_nothing:
            raise ValueError("backward called after a forward with keep_cache=False: it kept nothing to differentiate")
        if not self.replicas:
            raise ValueError("backward called before forward: there is no forward pass to differentiate")
        name = "dhidden" if isinstance(self.model, EncoderModel) else "dlogits"
        doutputs = check_float_array(name, doutputs, self.model.dtype, self.output_shape)

        def part(k, drows):
            self.replicas[k].backward(drows)
            return self.replicas[k].grads

        self._sum_grads(self._run(part, self._split([doutputs])))

    def forward_backward(self, inputs: tuple, targets, ignore_index: int = -100, label_smoothing: float = 0.0):
        """The whole batch's mean cross-entropy (as cross_entropy_forward of model.forward(*inputs)), with its
        gradient accumulated into model.grads; forward, loss and backward of each part in its own thread.

        Part k's loss is the mean over its n_k kept targets, so the batch's mean over all n of them is
        sum_k (n_k / n) loss_k, and part k's backward starts from dloss = n_k / n."""
        inputs = _check_inputs(self.model, tuple(inputs))
        targets = _check_targets(self.model, inputs, targets)
        replicas = self._replicas(len(inputs[0]), None)
        self.replicas, self._kept_nothing = [], False  # nothing to differentiate again: each replica goes with its part
        kept = [int((targets[lo:hi] != ignore_index).sum()) for lo, hi in self.bounds]
        n = sum(kept)
        if n == 0:
            raise ValueError(f"targets: every target equals ignore_index={ignore_index}; the mean loss is undefined")

        def part(k, part_targets, *rows):
            replica, replicas[k] = replicas[k], None  # freed, activations and all, when the part returns
            outputs = replica.forward(*rows)
            if kept[k] == 0:  # nothing to learn from these rows: zero gradient, nothing added to the loss
                replica.backward(np.zeros_like(outputs))
                return 0.0, replica.grads
            loss, cache = cross_entropy_forward(outputs, part_targets, ignore_index, label_smoothing)
            replica.backward(cross_entropy_backward(cache, dloss=kept[k] / n))
            return loss * (kept[k] / n), replica.grads

        args = [(t, *rows) for (t,), rows in zip(self._split([targets]), self._split(inputs), strict=True)]
        losses, part_grads = zip(*self._run(part, args), strict=True)
        self._sum_grads(list(part_grads))
        return sum(losses[1:], losses[0])


_GRADS_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_GRADS_LOCKS_LOCK = threading.Lock()


def grads_lock(model) -> threading.Lock:
    """The lock that runners on `model`, in any thread, hold while they add into model.grads."""
    with _GRADS_LOCKS_LOCK:
        return _GRADS_LOCKS.setdefault(model, threading.Lock())


def _add_in_place(total: np.ndarray, other: np.ndarray) -> None:
    np.add(total, other, out=total)


def _check_inputs(model, inputs: tuple) -> tuple:
    """The inputs checked as model.forward checks them, on the whole batch (so that a message quotes the shapes
    the caller gave, not a part's); the first must be batched (B, ...), and all share its batch size."""
    cfg = model.config
    inputs = tuple(None if x is None else np.asarray(x) for x in inputs)
    if not inputs or inputs[0] is None:
        raise ValueError("DataParallel needs batched inputs (B, ...), the first one an array")
    if isinstance(model, Transformer):
        names: tuple[tuple[str, int], ...] = (("src_ids", cfg.src_vocab_size), ("tgt_ids", cfg.tgt_vocab_size))
    else:
        names = (("ids", cfg.tgt_vocab_size if isinstance(model, TransformerLM) else cfg.src_vocab_size),)
    checked: list = [
        check_ids(name, x, vocab, cfg.position_limit) for (name, vocab), x in zip(names, inputs, strict=False)
    ]
    if isinstance(model, EncoderModel) and len(inputs) > 1:
        checked.append(check_token_type_ids(inputs[1], checked[0], cfg.type_vocab_size))
    inputs = (*checked, *inputs[len(checked) :])
    sizes = {len(x) for x in inputs if x is not None and x.ndim > 0}
    if len(sizes) != 1:
        raise ValueError(f"the inputs must share one batch size (axis 0), got shapes {[np.shape(x) for x in inputs]}")
    return inputs


def _check_targets(model, inputs: tuple, targets) -> np.ndarray:
    """targets (B, T): integer class ids, one per output position (those of tgt_ids for a Transformer)."""
    targets = np.asarray(targets)
    if targets.dtype == np.bool_ or not np.issubdtype(targets.dtype, np.integer):
        raise TypeError(f"targets must be an integer array of class ids, got dtype {targets.dtype}")
    positions = inputs[1] if isinstance(model, Transformer) else inputs[0]
    if targets.shape != positions.shape:
        raise ValueError(f"targets must have shape {positions.shape} (one per output position), got {targets.shape}")
    return targets
