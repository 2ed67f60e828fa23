"""The workbook's grader as a Gradescope autograder: `write_bundle` writes the zip, `run` is what it runs.

Gradescope builds an Ubuntu image from the zip (it runs `setup.sh` there once, with the zip's contents in
/autograder/source), then for each submission puts the student's files in /autograder/submission, runs
/autograder/run_autograder from /autograder and reads /autograder/results/results.json. The bundle holds:

- `setup.sh`: bubblewrap (apt), then a virtual environment with this project installed from its own source, which
  the zip carries (`transformer-parity/`: the four packages and pyproject.toml; the project is not on PyPI) and
  torch's CPU build (parity_tests.check, the judge, imports torch);
- `run_autograder`: `python -m parity_tests.exercises.gradescope`, which is `run` below;
- `config.json`: what the teacher chose: the exercises, the seed, the time limit, the visibility settings.

`run(root)` finds each exercise file (`NAME.py`, the shallowest one outside a `notebooks` folder; else a Jupyter
notebook `NAME.ipynb`, of which only the definitions are kept: `notebook_source`) in root/submission, copies it
into a private folder, grades it with parity_tests.exercises.grade on the teacher's seed (each exercise in its own
child process, under bubblewrap where it runs) and writes root/results/results.json in Gradescope's format: one
test per exercise worth its points (all or none, as `grade` gives them), its output the summary (each named mistake
with its formula) and what the student's code printed; then one test per case group of that exercise (the shapes
and edge cases check.pair draws: padding, a fully masked row, ...), worth nothing, passed or failed, saying which
tensor missed its bar. The root is /autograder unless AUTOGRADER_ROOT names another
folder laid out the same way (how the bundle is tried on one's own machine).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from . import DEFAULT_TIMEOUT, EXERCISES, grade
from .grading import BARS

__all__ = ["VISIBILITIES", "write_bundle", "run", "results", "find_submission", "notebook_source"]

VISIBILITIES = ("hidden", "after_due_date", "after_published", "visible")  # Gradescope's
PACKAGES = ("numpy_transformer", "torch_transformer", "transformer_spec", "parity_tests")
SOURCE = "transformer-parity"  # the project's source, in the zip
SKIPPED = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")
MAX_NOTEBOOK = 32 << 20  # bytes of a notebook read (its outputs, figures included)

SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, as root, while it builds the autograder's image (the zip's contents in
# /autograder/source): bubblewrap, which isolates each student's code, and this project with its dependencies.
set -euo pipefail
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv python3-pip bubblewrap
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install --upgrade pip
# torch's CPU build: parity_tests.check imports it (the judge); the grader runs none of it on a GPU
/autograder/venv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu
/autograder/venv/bin/pip install /autograder/source/transformer-parity
"""

RUN = """#!/usr/bin/env bash
# Gradescope runs this from /autograder for each submission: grade /autograder/submission with the course's
# seed (config.json) and write /autograder/results/results.json. AUTOGRADER_ROOT names another folder laid out
# the same way, and AUTOGRADER_PYTHON another Python with the project installed, to try the bundle locally.
set -euo pipefail
root="${AUTOGRADER_ROOT:-/autograder}"
cd "$root"
exec "${AUTOGRADER_PYTHON:-$root/venv/bin/python}" -m parity_tests.exercises.gradescope "$root"
"""


def _visibility(value, what: str) -> str:
    if value not in VISIBILITIES:
        raise ValueError(f"{what}: expected one of {', '.join(VISIBILITIES)}, got {value!r}")
    return value


def _project_root() -> Path:
    """The checkout this package runs from (its pyproject.toml beside the packages), whose source the zip carries."""
    root = Path(__file__).resolve().parents[2]
    missing = [p for p in (*PACKAGES, "pyproject.toml") if not (root / p).exists()]
    if missing:
        raise ValueError(
            f"a Gradescope bundle carries the project's source, and {root} lacks {', '.join(missing)}: "
            "write it from a checkout of transformer-parity"
        )
    return root


def write_bundle(
    path,
    *,
    seed: int,
    only=None,
    timeout: float = DEFAULT_TIMEOUT,
    visibility: str = "visible",
    stdout_visibility: str = "hidden",
) -> Path:
    """Write the Gradescope autograder zip to `path` (refusing to overwrite a file): it grades the exercises in
    `only` (default: all) on the cases drawn from `seed`, `timeout` seconds each; `visibility` is the tests' and
    the result's (Gradescope's "hidden", "after_due_date", "after_published" or "visible"), `stdout_visibility`
    that of what the grader printed (the teacher's log). Returns the path."""
    path = Path(path)
    names = list(EXERCISES) if only is None else list(only)
    unknown = [n for n in names if n not in EXERCISES]
    if unknown or not names:
        raise ValueError(f"only: unknown exercise(s) {unknown}; choose among {', '.join(EXERCISES)}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < float("inf"):
        raise ValueError(f"timeout: expected a positive number of seconds, got {timeout!r}")
    config = {
        "exercises": names,
        "seed": seed,
        "timeout": float(timeout),
        "visibility": _visibility(visibility, "visibility"),
        "stdout_visibility": _visibility(stdout_visibility, "stdout_visibility"),
    }
    if path.exists():
        raise ValueError(f"refusing to overwrite {path}")
    root = _project_root()
    with tempfile.TemporaryDirectory(prefix="transformer-parity-bundle-") as folder:
        source = Path(folder) / SOURCE
        for package in PACKAGES:
            shutil.copytree(root / package, source / package, ignore=SKIPPED)
        for name in ("pyproject.toml", "README.md"):
            if (root / name).is_file():
                shutil.copyfile(root / name, source / name)
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as bundle:
            for name, text in (("setup.sh", SETUP), ("run_autograder", RUN)):
                info = zipfile.ZipInfo(name)
                info.external_attr = 0o100755 << 16  # executable, as Gradescope runs them
                info.compress_type = zipfile.ZIP_DEFLATED
                bundle.writestr(info, text)
            bundle.writestr("config.json", json.dumps(config, indent=1) + "\n")
            for file in sorted(p for p in source.rglob("*") if p.is_file()):
                bundle.write(file, file.relative_to(folder).as_posix())
    return path


def find_submission(folder: Path, name: str) -> Path | None:
    """The student's `name`.py in `folder` (a zip Gradescope unpacked may nest it): the shallowest one outside a
    `notebooks` folder (the workbook's notebooks share the exercises' names), else the shallowest `name`.ipynb
    (a Jupyter notebook holding the answer: notebook_source); links are not followed."""
    found: dict = {".py": [], ".ipynb": []}
    for where, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "notebooks" and not d.startswith("."))
        for suffix, paths in found.items():
            if f"{name}{suffix}" in files and not os.path.islink(os.path.join(where, f"{name}{suffix}")):
                paths.append(Path(where) / f"{name}{suffix}")
    return min(found[".py"] or found[".ipynb"], key=lambda p: (len(p.relative_to(folder).parts), str(p)), default=None)


KEPT = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)


def notebook_source(path: Path) -> str:
    """The exercise a student wrote in a Jupyter notebook, as the module the grader grades: of its code cells only
    the definitions (imports, functions, classes, assignments), in order; nothing else of the notebook runs (its
    calls and prints, IPython's % and ! lines, a cell that does not parse, the import of this package a self-check
    cell makes). What is kept is then checked and run as an exercise file is."""
    if path.stat().st_size > MAX_NOTEBOOK:
        return f"raise SyntaxError('a notebook of {path.stat().st_size} bytes; at most {MAX_NOTEBOOK} are read')\n"
    try:
        cells = json.loads(path.read_text(errors="replace"))["cells"]
    except (ValueError, KeyError, TypeError):
        return "raise SyntaxError('not a Jupyter notebook')\n"
    kept = []
    for cell in cells if isinstance(cells, list) else []:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        text = "".join(source) if isinstance(source, list) else str(source)
        lines = [line for line in text.splitlines() if not line.lstrip().startswith(("%", "!"))]
        try:
            tree = ast.parse("\n".join(lines))
        except SyntaxError:
            continue
        kept += [node for node in tree.body if isinstance(node, KEPT) and not _imports_this_package(node)]
    kept.sort(key=lambda node: not (isinstance(node, ast.ImportFrom) and node.module == "__future__"))  # first
    return ast.unparse(ast.Module(body=kept, type_ignores=[])) + "\n"


def _imports_this_package(node) -> bool:
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] == "parity_tests" for alias in node.names)
    return isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "parity_tests"


def _exercise_test(number: int, name: str, entry: dict, visibility: str) -> dict:
    """The exercise's test: its points (all or none); its output the grader's summary (each named mistake at the
    gradients it breaks, with the formula it misses, then the worst errors) and what the student's code printed."""
    lines = [entry["summary"]]
    if entry.get("output"):
        lines += ["", "What your code printed:", entry["output"]]
    return {
        "name": name,
        "number": str(number),
        "score": entry["points"],
        "max_score": entry["max_points"],
        "status": "passed" if entry["passed"] else "failed",
        "output": "\n".join(lines),
        "visibility": visibility,
    }


def _case_tests(number: int, name: str, entry: dict, visibility: str) -> list:
    """One test per case group of the exercise, worth nothing: passed, or which tensors missed their bars."""
    return [
        {
            "name": f"{name}: {case}",
            "number": f"{number}.{i}",
            "score": 0,
            "max_score": 0,
            "status": "passed" if verdict["passed"] else "failed",
            "output": "every tensor within its bar"
            if verdict["passed"]
            else "\n".join(["missed its bar:", *verdict["failed"]]),
            "visibility": visibility,
        }
        for i, (case, verdict) in enumerate(entry["cases"].items(), start=1)
    ]


def results(card: dict, config: dict, seconds: float, missing: list) -> dict:
    """Gradescope's results.json for one scorecard (parity_tests.exercises.grade) under the teacher's config."""
    tests = []
    for number, (name, entry) in enumerate(card["exercises"].items(), start=1):
        tests.append(_exercise_test(number, name, entry, config["visibility"]))
        tests += _case_tests(number, name, entry, config["visibility"])
    summary = [
        f"{card['passed_count']} of {len(card['exercises'])} exercises passed, "
        f"{card['points']} of {card['max_points']} points.",
        f"Each exercise scores all of its points or none: every case, in float64 and float32. The cases are drawn "
        f"from the course's seed, not the notebooks' public one; {BARS}.",
    ]
    if missing:
        summary.append(f"Not found in your submission: {', '.join(f'{n}.py' for n in missing)}.")
    return {
        "score": card["points"],
        "execution_time": round(seconds),
        "output": "\n".join(summary),
        "visibility": config["visibility"],
        "stdout_visibility": config["stdout_visibility"],
        "extra_data": {"seed": card["seed"], "isolation": card["isolation"]},
        "tests": tests,
    }


def run(root) -> dict:
    """Grade root/submission as the bundle's config.json (in root/source) says and write root/results/results.json.
    Returns what it wrote."""
    start = time.monotonic()
    root = Path(root)
    config = json.loads((root / "source" / "config.json").read_text())
    names = config["exercises"]
    (root / "results").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="transformer-parity-gradescope-") as folder:
        missing = []
        for name in names:  # only the exercise files are copied: nothing else of the submission is read
            found = find_submission(root / "submission", name)
            if found is None:
                missing.append(name)
            elif found.suffix == ".ipynb":
                (Path(folder) / f"{name}.py").write_text(notebook_source(found))
            else:
                shutil.copyfile(found, Path(folder) / f"{name}.py")
        card = grade(folder, seed=config["seed"], timeout=config["timeout"], only=names)
    written = results(card, config, time.monotonic() - start, missing)
    (root / "results" / "results.json").write_text(json.dumps(written, indent=1, allow_nan=False) + "\n")
    print(f"cases drawn from seed {config['seed']}; isolation: {card['isolation']}")
    for name, entry in card["exercises"].items():
        print(f"{'PASS' if entry['passed'] else 'FAIL'}  {name:<30} {entry['points']}/{entry['max_points']}")
    print(f"{card['points']} of {card['max_points']} points; wrote {root / 'results' / 'results.json'}")
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m parity_tests.exercises.gradescope",
        description="What the bundle's run_autograder runs: grade ROOT/submission, write ROOT/results/results.json.",
    )
    parser.add_argument("root", nargs="?", default=os.environ.get("AUTOGRADER_ROOT", "/autograder"))
    args = parser.parse_args(argv)
    run(args.root)
    return 0  # a failed exercise is a score, not an error: Gradescope shows an error instead of results otherwise


if __name__ == "__main__":
    sys.exit(main())
