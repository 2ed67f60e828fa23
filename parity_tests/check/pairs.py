"""check.pair: a user's NumPy forward/backward pair against the reference pair and central finite differences.

The user's pair follows the reference's protocol (docs/conventions.md): `out, cache = forward(**args)`, and
`backward(dout, cache)` returns the gradients of the inputs named below, in the forward's order (a single array
when there is one; a composite's params dict gets a grads dict). cross_entropy's backward is
`backward(cache, dloss)`, as the reference's. Each pair is run on several cases (shapes, padding, a fully masked
row, T_q != T_k, large scores) in float64 and float32; each output and gradient is compared with the reference's,
and the user's backward with central differences of the user's own forward (so a wrong gradient of a right forward
and a right gradient of a wrong forward are told apart).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from numpy_transformer import gradcheck
from parity_tests.components import BAR, FD_BAR, flatten_into

from . import mistakes as MK
from . import variants as VR
from .diagnosis import MATCH, _error
from .matchers import match_attention, match_unit
from .pair_table import LARGE, PAIRS, H, Pair
from .report import FLOAT32_FLOOR, FLOAT32_RATIO, Diagnosis, Result, Row
from .running import reference_rows


def _fresh(value, dtype):
    """A copy of a case's arguments (a forward may write to them) with every floating array, also a params dict's,
    in `dtype`."""
    if isinstance(value, dict):
        return {k: _fresh(v, dtype) for k, v in value.items()}
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return value.astype(dtype)
    return value


def _grads(pair: Pair, backward, dout, cache) -> dict:
    grads = pair.call_backward(backward, dout, cache)
    if len(pair.wrt) == 1:
        grads = (grads,)
    if not isinstance(grads, (tuple, list)) or len(grads) != len(pair.wrt):
        raise TypeError(f"backward must return the gradients of {pair.wrt} in that order, got {type(grads).__name__}")
    out: dict = {}
    for name, g in zip(pair.wrt, grads, strict=True):
        flatten_into(name, g, out)
    return out


@dataclass
class Case:
    """One case of one pair in one dtype: the reference pair (spec), the user's, the case's inputs, and where what
    _judge_case finds goes (the result; matches: the backward mistakes that reproduce a gradient here)."""

    spec: Pair
    forward: Callable
    backward: Callable
    name: str
    args: dict
    dtype: np.dtype
    seed: int
    result: Result
    matches: list  # (case, Diagnosis)

    def row(self, tensor: str, error: float, bar: float, note="", against="the reference", own=None) -> Row:
        name = f"{self.name}: {tensor}" + (" vs finite differences" if against == "finite differences" else "")
        return Row(name, self.dtype.name, error, bar, note, self.name, tensor, against, own)

    def diagnose(self, name: str, got, expected, dout) -> list:
        """The known backward mistakes that reproduce the user's gradient `got` of input `name`, noted in matches."""
        found = MK.diagnose_backward(self.result.reference, name, got, expected, self.args, dout)
        self.matches += [(self.name, d) for d in found]
        return found


def pair(forward, backward, reference: str, *, dtypes=("float64", "float32"), seed: int = 0) -> Result:
    """Judge a user's NumPy pair (forward, backward) against the reference pair `reference` (one of PAIRS) and
    against central differences of the user's own forward; see the module docstring. print(result) for the report."""
    if reference not in PAIRS:
        raise ValueError(f"reference must be one of {', '.join(PAIRS)}; got {reference!r}")
    if not callable(forward) or not callable(backward):
        raise TypeError(
            f"forward and backward must be callables, got {type(forward).__name__} and {type(backward).__name__}"
        )
    spec = PAIRS[reference]
    result = Result(reference=reference)
    result.conventions = {
        "protocol": "out, cache = forward(**args); grads = backward(dout, cache)",
        "bars": f"float64 {BAR[np.dtype('float64')]:.0e} against the reference and {FD_BAR:.0e} against finite "
        f"differences of your forward; float32 against the reference, per tensor {FLOAT32_RATIO:g} x the "
        f"reference's own float32 error there (its float32 run against its float64 run on the same inputs), at "
        f"least {FLOAT32_FLOOR:.1e}",
    }
    matches: list = []  # (case, Diagnosis): a known backward mistake that reproduces one gradient in one case
    for name, make in spec.cases.items():
        for dtype in map(np.dtype, dtypes):
            args = _fresh(make(np.random.default_rng(seed)), dtype)
            case = Case(spec, forward, backward, name, args, dtype, seed, result, matches)
            try:
                with np.errstate(all="ignore"):  # a user's overflow is reported, not warned about
                    _judge_case(case)
            except NotImplementedError as exc:  # the check stops there
                result.rows.append(case.row("(not implemented)", math.inf, 0.0))
                result.unexplained = f"not implemented yet: {exc}" if str(exc) else "not implemented yet"
                result.passed = False
                return result
            except Exception as exc:  # the user's code failed: report it, the case fails
                result.rows.append(case.row(f"raised {type(exc).__name__}", math.inf, 0.0, str(exc)[:80]))
    _verdict(result, matches)
    return result


def _verdict(result: Result, matches: list) -> None:
    """The diagnoses (an overflow only at large scores; a backward mistake where it reproduces a gradient in every
    float64 case where that gradient fails) and the verdict."""
    failing_outputs = {r.case for r in result.rows if not r.ok and r.tensor == "output"}
    if failing_outputs == {"large scores"} and not result.diagnoses:  # right until the scores are large
        message = f"right on ordinary inputs, wrong at scores of ~{LARGE:g}: exp overflows without subtracting each "
        message += "row's maximum"
        result.diagnoses.append(Diagnosis("attention.no_max_subtraction", message, "forward", math.inf))
    failing: dict = {}  # gradient -> the float64 cases where it fails against the reference
    for r in result.rows:
        if r.dtype == "float64" and not r.ok and r.tensor.startswith("d") and r.against == "the reference":
            failing.setdefault(r.tensor, set()).add(r.case)
    found: dict = {}  # (id, gradient) -> (the diagnosis, the cases where it reproduces that gradient)
    for case, d in matches:
        found.setdefault((d.id, d.where), (d, set()))[1].add(case)
    result.diagnoses += [d for d, cases in found.values() if cases >= failing.get(d.where, set())]
    unique: dict = {}
    for d in result.diagnoses:
        unique.setdefault((d.id, d.where), d)
    result.diagnoses = list(unique.values())
    result.passed = all(r.ok for r in result.rows) and not result.diagnoses
    if not result.passed and result.unexplained is None:
        result.unexplained = _worst_gradients(result.rows)


def _worst_gradients(rows) -> str:
    """Which gradient is wrong and by how much: each failing tensor's worst error (float64), against the reference
    and against finite differences of the user's own forward."""
    worst: dict = {}
    for r in rows:
        if r.ok or r.dtype != "float64" or not r.case:
            continue
        seen = worst.setdefault(r.tensor, {}).get(r.against, 0.0)
        worst[r.tensor][r.against] = r.error if not r.error <= seen else seen  # NaN kept: max(seen, nan) drops it
    parts = [f"{k}: " + ", ".join(f"{e:.2e} against {kind}" for kind, e in v.items()) for k, v in worst.items()]
    return "wrong: " + "; ".join(parts) if parts else "only float32 fails"


def _judge_case(case: Case) -> None:
    """The user's output and gradients against the reference pair's (running.reference_rows); the known backward
    mistakes of each wrong gradient; the forward's variants; the user's backward against central differences of the
    user's own forward."""
    spec, bar = case.spec, BAR[case.dtype]
    ref_out, ref_cache = spec.forward(**_fresh(case.args, case.dtype))
    out, cache = case.forward(**_fresh(case.args, case.dtype))
    out = np.asarray(out)
    if out.shape != np.shape(ref_out):
        raise ValueError(f"forward returned shape {out.shape}, expected {np.shape(ref_out)}")
    if not np.all(np.isfinite(out)) and np.all(np.isfinite(ref_out)):
        _overflowed(case)
        return
    dout = np.random.default_rng(case.seed + 1).standard_normal(np.shape(ref_out)).astype(case.dtype)
    dout = float(dout) if np.ndim(ref_out) == 0 else dout
    ref_grads = _grads(spec, spec.backward, dout, ref_cache)
    grads = _grads(spec, case.backward, dout, cache)
    misshapen = _misshapen(case, grads, ref_grads, dout)
    mine = {"output": out} | {f"d{n}": grads[n] for n in ref_grads if n not in misshapen}

    def reference(dtype) -> dict:  # the reference pair's output and gradients in `dtype` on the same inputs and dout
        out_d, cache_d = spec.forward(**_fresh(case.args, dtype))
        grads_d = _grads(spec, spec.backward, _fresh(dout, dtype), cache_d)
        return {"output": out_d} | {f"d{n}": g for n, g in grads_d.items()}

    rows = reference_rows(mine, reference, case.dtype, vacuous=False)
    found = [case.row(r.name, r.error, r.bar, r.note, own=r.own) for r in rows]
    case.result.rows += found + list(misshapen.values())
    errors = {r.tensor: r.error for r in found}
    if case.dtype != np.float64:
        return
    for name, g in ref_grads.items():  # each wrong gradient: is it a known mistake?
        if errors.get(f"d{name}", 0.0) > bar:
            case.diagnose(name, grads[name], g, dout)
    if misshapen:
        return  # central differences need gradients of the inputs' shapes
    if errors["output"] > bar:  # the catalogue's forward mistakes that reproduce the output, in this case
        for d in _forward(case.result.reference, case.args, out):
            case.result.diagnoses.append(Diagnosis(d.id, f"{case.name}: {d.message}", "forward", d.error))
    backward = partial(spec.call_backward, case.backward)  # (dout, cache) -> the gradients
    fd = gradcheck.check_pair(
        case.forward, backward, _fresh(case.args, case.dtype), spec.wrt, seed=case.seed, max_coords=12
    )
    case.result.rows += [case.row(f"d{n}", e, FD_BAR, against="finite differences") for n, e in fd.errors.items()]


def _overflowed(case: Case) -> None:
    """An output of inf/NaN where the reference's is finite: at large scores, the missing max subtraction."""
    if case.name == "large scores":
        message = f"{case.name}: the forward overflows to inf/NaN; subtract each row's maximum before exp"
        case.result.diagnoses.append(Diagnosis("attention.no_max_subtraction", message, "forward", math.inf))
    case.result.rows.append(case.row("output", math.inf, BAR[case.dtype], "inf/NaN"))


def _forward(reference: str, a: dict, out) -> list:
    """The catalogue's forward mistakes (matchers) that reproduce the user's output `out` on the pair's inputs `a`."""
    if reference == "softmax" and _error(out, VR.softmax(a["x"], a.get("mask"), -2)) <= MATCH:  # over the queries
        return [Diagnosis("attention.softmax_wrong_axis", "softmax over axis -2 instead of the last", "", 0.0)]
    if reference == "layer_norm":
        return match_unit("layer_norm", out, a["x"], a, a["eps"], "", "")
    if reference == "scaled_dot_product_attention":  # heads already split: no transpose can be missing
        return match_attention(out, None, a["q"], (a["k"], a["v"]), H, a.get("mask"), "", self_attention=False)
    if reference == "multi_head_attention":
        kv, keep = (a["key"], a["value"]), a.get("attn_mask")
        return match_attention(out, a["params"], a["query"], kv, a["n_heads"], keep, "", self_attention=False)
    return []


def _misshapen(case: Case, grads: dict, ref_grads: dict, dout) -> dict:
    """{input name: row} for each gradient of the wrong shape, which a known mistake must explain (else raises)."""
    out = {}
    for name, g in ref_grads.items():
        if name not in grads or grads[name] is None:
            raise ValueError(f"backward gave no gradient for {name}")
        if np.shape(grads[name]) == np.shape(g):
            continue
        if not case.diagnose(name, grads[name], g, dout):
            raise ValueError(f"backward's d{name} has shape {np.shape(grads[name])}, expected {np.shape(g)}")
        out[name] = case.row(f"d{name}", math.inf, BAR[case.dtype], f"shape {np.shape(grads[name])}")
    return out
