"""What the registry of mistakes (mistakes.py) is made of: a Mistake, the Site its variants are made for, a Diagnosis
(a known mistake that reproduces what the user's code computes), and the error measures a diagnosis is judged by."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from parity_tests.components import relative_errors

MATCH = 1e-8  # a variant (or a convention) reproduces the user's output when within this (float64)
# `named`: a variant names its mistake only at most SHARPER times the reference's error from the user's output, and
# only where that is over FLOOR, float64's bar (a rounding's size, as a constant made in float32 leaves, names none)
SHARPER = 1e-2
FLOOR = 1e-10


@dataclass
class Diagnosis:
    """A known mistake that reproduces the user's output: its catalogue id, a readable message, the user's
    submodule where it sits, and the relative error between the user's output and the variant (float64)."""

    id: str
    message: str
    where: str
    error: float

    def __str__(self) -> str:
        return f"{self.id} at {self.where or '(the module)'}: {self.message} (variant error {self.error:.1e})"


@dataclass(frozen=True)
class Site:
    """An attention as its variants see it: d_model D, head size Dh, the reference's mask `keep` (True = may attend,
    broadcastable to (B, H, T_q, T_k), or None); a causal self-attention's keys' padding `pad` (B, 1, 1, T) or None
    and the cross-attention's mask `swap`; whether it rotates queries and keys (`rope`), has fewer K/V heads than
    query heads (`gqa`), Gemma 2's cap on its scores (None: none), the divisor of its scores the config states."""

    D: int
    Dh: int
    keep: np.ndarray | None = None
    causal: bool = False
    pad: np.ndarray | None = None
    swap: np.ndarray | None = None
    self_attention: bool = True
    rope: bool = False
    gqa: bool = False
    softcap: float | None = None
    sinks: bool = False  # GPT-OSS's sink logit per head in every softmax's denominator
    band: np.ndarray | None = None  # an encoder's local band (T, T), True within, where its config has local layers
    H: int = 0  # the query heads, where known (a head_dim other than D / H: Mistral-Small's)
    divisor: float | None = None  # the scores' divisor the config states (1 / attention_scale; None: sqrt(Dh))
    scaling: tuple | None = None  # a scaled RoPE's (RopeScaling, max_len), where it turns queries and keys


@dataclass(frozen=True)
class Mistake:
    id: str
    line: str  # the line of math it changes (the catalogue)
    unit: str | None = None  # the unit it is looked for at (see the module docstring); None: by a probe
    variants: Callable[[Site], list] | None = None  # Site -> [(message template, knobs)]
    pairs: tuple = ()  # "backward": the check.pair references it applies to (empty: every one)
    combines: bool = False  # also tried together with its unit's other combining mistakes (x.std() + eps)
    tests: tuple = ()  # "backward": (stage, test) pairs, test(backward_mistakes.Gradient) -> Diagnosis(es) or None
    plausible: Callable | None = None  # cfg -> whether it is plausible for a model of that family (None: always)

    def caveated(self, cfg) -> bool:
        """Whether a pass under the convention that is also this mistake is caveated, for a model read as `cfg`."""
        return self.plausible is None or bool(self.plausible(cfg))

    def applies(self, unit: str, site: Site) -> list:
        """[(message template, knobs)] of this mistake at a `unit` described by `site` (none elsewhere)."""
        return self.variants(site) if self.unit == unit and self.variants is not None else []


def _valid(out: np.ndarray, valid) -> np.ndarray:
    """out with the positions a loss ignores (padded targets) set to zero."""
    if valid is None or out.ndim < 2 or out.shape[:2] != valid.shape:
        return out
    return np.where(valid.reshape(valid.shape + (1,) * (out.ndim - 2)), out, 0.0)


def _error(a, b) -> float:
    return relative_errors({"x": (a, b)}, np.float64)["x"][1]


def relative(a, b, floor: float = 0.0) -> float:
    """max |a - b| relative to max(max |b|, floor) (a and b float64 arrays of one shape); inf where that is zero
    and a differs from b."""
    a, b = np.asarray(a), np.asarray(b)  # NumPy arrays, or CPU tensors without gradients
    scale = max(float(np.abs(b).max(initial=0.0)), floor)
    diff = float(np.abs(a - b).max(initial=0.0))
    return diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)


def named(error: float, unmatched: float) -> bool:
    """Whether a variant at relative error `error` from the user's output names its mistake, the reference's own
    output being at `unmatched` from it: within MATCH, under SHARPER * unmatched, and unmatched over FLOOR."""
    return error <= MATCH and error <= SHARPER * unmatched and unmatched > FLOOR


def departs(user: np.ndarray, ref: np.ndarray, valid, heads: int, bar: float = 1e-5) -> str:
    """What differs between a part's output (B, T, D) and the reference's, at the valid positions: the reference's
    times a number, else the positions and the heads' features off by more than `bar` (relative to max |ref|) while
    the others agree, else the largest difference's place; "" for another shape."""
    if user.ndim != 3 or user.shape != ref.shape:
        return ""
    u, r = _valid(np.nan_to_num(user, nan=1e300), valid), _valid(ref, valid)
    heads = heads if heads and u.shape[-1] % heads == 0 else 1
    c = float((u * r).sum() / max(float((r * r).sum()), 1e-300))
    if c and relative(u, c * r, 1e-12) <= bar:
        return f"its output is the reference's times {c:.4g}"
    off = np.abs(u - r) > bar * max(float(np.abs(r).max()), 1e-12)
    rows, cols = off.any(axis=(0, 2)), off.reshape(*off.shape[:2], heads, -1).any(axis=(0, 1, 3))
    said = [f"positions {_indices(rows)}"] if not rows.all() else []
    said += [f"the features of heads {_indices(cols)} (of {heads})"] if not cols.all() else []
    b, t, f = np.unravel_index(int(np.abs(u - r).argmax()), u.shape)
    most = f"most at position {t}, feature {f} ({u[b, t, f]:.4g} for {r[b, t, f]:.4g})"
    return f"{' and '.join(said)} differ, the others agree" if said else f"every position differs, {most}"


def _indices(flags: np.ndarray) -> str:
    shown = [str(i) for i in np.flatnonzero(flags)]
    return ", ".join(shown[:6]) + (", ..." if len(shown) > 6 else "")
