"""The walkthroughs' "your turn" cells: the learner's gradient against the walkthrough's own, tensor by tensor.

In a walkthrough:

    check = checker({"dS": dS}, reference="softmax", args={"x": S, "mask": mask}, dout=dP, wrt={"dS": "x"},
                    exercise="softmax")
    check("dS", your_dS(dP, P))     # prints one line per tensor: right, wrong (and the mistake's name), not written

A learner's gradient passes at the float64 bar against the walkthrough's own; a wrong one is run through the
catalogue's tests of a backward pass (check/backward_mistakes.py) with the pair `reference` as context (`args`:
its inputs, `dout`: the upstream gradient, `wrt`: which of its inputs each gradient is of), so that the mistake is
named: the missing row term, a transposed weight gradient, a constant factor and where it comes from, ...
"""

from __future__ import annotations

import numpy as np

from . import mistakes as MK
from .diagnosis import relative

__all__ = ["checker"]

BAR = 1e-10  # float64, relative to the largest value of the walkthrough's own gradient


def checker(ours: dict, *, reference=None, args=None, dout=None, wrt=None, exercise=None):
    """A `check(name, yours)` for the walkthrough's own gradients `ours` (name -> array): `yours` is one array,
    or a tuple of arrays in the order of the names joined by ", " in `name` ("dC, dW_O, db_O"). Returns True when
    every tensor is right; prints what it found. `exercise` names the workbook exercise that goes further."""
    if not isinstance(ours, dict) or not ours:
        raise TypeError(f"ours: expected a dict name -> the walkthrough's gradient, got {type(ours).__name__}")

    def check(name: str, yours) -> bool:
        names = [n.strip() for n in name.split(",")]
        unknown = [n for n in names if n not in ours]
        if unknown:
            raise ValueError(f"name: {unknown} not among the walkthrough's gradients {list(ours)}")
        if yours is not None and len(names) > 1 and (not isinstance(yours, (tuple, list)) or len(yours) != len(names)):
            print(f"{name}: expected {len(names)} arrays ({name}), got {type(yours).__name__}")
            return False
        values = [yours] if len(names) == 1 else (list(yours) if yours is not None else [None] * len(names))
        verdicts = [_verdict(n, v, ours[n], reference, args, dout, (wrt or {}).get(n, n)) for n, v in zip(
            names, values, strict=True)]  # fmt: skip
        print("\n".join(line for line, _ in verdicts))
        if exercise:
            print(f"Further: the workbook's `{exercise}` exercise (transformer-parity exercises DIR --only {exercise})")
        return all(ok for _, ok in verdicts)

    return check


def _verdict(name, yours, ours, reference, args, dout, tensor) -> tuple:
    if yours is None:
        return f"{name}: not written yet (your function returns None)", False
    got, want = np.asarray(yours, dtype=np.float64), np.asarray(ours, dtype=np.float64)
    found = MK.diagnose_backward(reference, tensor, got, want, args or {}, dout) if reference else []
    named = "; ".join(f"{d.id}: {d.message}" for d in found)
    if got.shape != want.shape:
        return f"{name}: wrong, shape {got.shape} instead of {want.shape}" + (f": {named}" if named else ""), False
    error = relative(got, want)
    if error <= BAR:
        return f"{name}: right (relative error {error:.1e})", True
    what = named or "not a mistake the catalogue knows: compare your lines with the derivation, term by term"
    return f"{name}: wrong (relative error {error:.1e}): {what}", False
