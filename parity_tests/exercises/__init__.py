"""A workbook of backward passes for teachers: `write_workbook` writes it, `grade` marks it.

Each exercise is a file `NAME.py` whose forward is given (NumPy, with a cache whose contents its docstring states)
and whose backward is a stub saying what to derive; beside it `notebooks/NAME.py`, a jupytext "percent" notebook
that explains the exercise and runs the grader on it. `grade(directory)` imports each file and judges its pair with
parity_tests.check.pair (the reference pair and central finite differences, on several shapes and the edge cases:
padding, fully masked rows, T_q != T_k, large scores), and returns a scorecard; the CLI exits 1 when any fails.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from .templates import EXERCISES, notebook

__all__ = ["EXERCISES", "write_workbook", "grade"]


def write_workbook(directory, only=None) -> list:
    """Write the exercises named in `only` (default: all, in EXERCISES' order) and their notebooks into
    `directory` (created if missing). Refuses to overwrite a file that exists. Returns the paths written."""
    names = list(EXERCISES) if only is None else list(only)
    unknown = [n for n in names if n not in EXERCISES]
    if unknown:
        raise ValueError(f"unknown exercise(s) {unknown}; choose among {', '.join(EXERCISES)}")
    root = Path(directory)
    paths = [p for n in names for p in (root / f"{n}.py", root / "notebooks" / f"{n}.py")]
    existing = [str(p) for p in paths if p.exists()]
    if existing:
        raise ValueError(f"refusing to overwrite {existing}: choose an empty directory")
    (root / "notebooks").mkdir(parents=True, exist_ok=True)
    for name in names:
        (root / f"{name}.py").write_text(EXERCISES[name])
        (root / "notebooks" / f"{name}.py").write_text(notebook(name))
    return paths


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"workbook_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.pop(spec.name, None)
    spec.loader.exec_module(module)
    return module


def grade(directory) -> dict:
    """Grade every exercise file found in `directory`. Returns the scorecard: {"passed": bool, "passed_count": n,
    "exercises": {name: {"passed", "summary", "diagnoses", "worst" (tensor -> worst error), "report"}}}."""
    from parity_tests import check

    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"no such directory: {directory}")
    found = [n for n in EXERCISES if (root / f"{n}.py").is_file()]
    if not found:
        raise ValueError(
            f"{directory} holds no exercise file (expected some of {', '.join(f'{n}.py' for n in EXERCISES)})"
        )
    card = {}
    for name in found:
        try:
            module = _load(root / f"{name}.py")
            result = check.pair(module.forward, module.backward, name)
        except Exception as exc:  # a file that does not even import: it fails, with the reason
            card[name] = {
                "passed": False,
                "summary": f"cannot be graded: {type(exc).__name__}: {exc}",
                "diagnoses": [],
                "worst": {},
                "report": "",
            }
            continue
        worst = {}
        for row in result.rows:
            tensor = row.name.split(": ", 1)[-1]
            worst[tensor] = max(worst.get(tensor, 0.0), row.error)
        if result.passed:
            summary = f"worst error {max(worst.values(), default=0.0):.1e} over {len(result.rows)} comparisons"
        elif result.unexplained and result.unexplained.startswith("not implemented"):
            summary = f"backward {result.unexplained}"
        else:
            summary = "; ".join([str(d) for d in result.diagnoses] + [result.unexplained or ""]).strip("; ")
        card[name] = {
            "passed": result.passed,
            "summary": summary,
            "diagnoses": [d.id for d in result.diagnoses],
            "worst": worst,
            "report": str(result),
        }
    passed = sum(entry["passed"] for entry in card.values())
    return {"passed": passed == len(card), "passed_count": passed, "exercises": card}
