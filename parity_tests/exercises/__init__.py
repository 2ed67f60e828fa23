"""A workbook of backward passes for teachers: `write_workbook` writes it, `grade` marks it.

Each exercise is a file `NAME.py` whose forward is given (NumPy, with a cache whose contents its docstring states)
and whose backward is a stub saying what to derive; beside it `notebooks/NAME.py`, a jupytext "percent" notebook
that explains the exercise and runs the grader on it. `grade(directory, seed=...)` runs each file's functions in a
child Python with a time limit, isolated (parity_tests.exercises.grading, .isolation), and judges its pair here with
parity_tests.check.pair (the reference pair and central finite differences, on several shapes and the edge cases:
padding, fully masked rows, T_q != T_k, large scores, drawn from the seed), naming a known mistake per gradient;
it returns a scorecard with the points each exercise is worth (POINTS). `grade_class(root)` grades every student
folder under `root`. The CLI exits 1 when any exercise fails.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import isolation
from .grading import grade_file
from .templates import EXERCISES, POINTS, notebook

__all__ = [
    "EXERCISES",
    "POINTS",
    "PUBLIC_SEED",
    "DEFAULT_TIMEOUT",
    "write_workbook",
    "grade",
    "grade_class",
    "class_csv",
]

PUBLIC_SEED = 0  # the cases the notebooks show, for self-study; a teacher grades with a seed of their own
DEFAULT_TIMEOUT = 60.0  # seconds per exercise: a right answer takes well under one; a hang is stopped


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


def grade(directory, *, seed: int = PUBLIC_SEED, timeout: float = DEFAULT_TIMEOUT, only=None, jobs: int = 1) -> dict:
    """Grade every exercise file found in `directory` (or the exercises named in `only`: a missing file then fails
    as "not handed in"), each in a child Python with `timeout` seconds (parity_tests.exercises.grading says what
    a submission may not do), `jobs` of them at a time, on the cases drawn from `seed` (PUBLIC_SEED: the cases
    the notebooks show). Returns the scorecard: {"passed": bool, "passed_count": n, "points": earned,
    "max_points": total, "seed", "exercises": {name: {"passed", "points", "max_points", "summary", "diagnoses",
    "mistakes", "worst" (tensor -> worst error), "report", "output" (what the code printed, each line "| ",
    escaped), "seconds"}}, "isolation": "bubblewrap", "no new processes" or "none"}. Without bubblewrap it says
    once, on standard error, what it cannot stop (parity_tests.exercises.isolation)."""
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"directory: no such directory: {directory}")
    names = [n for n in EXERCISES if (root / f"{n}.py").is_file()] if only is None else list(only)
    _check_arguments(seed, jobs, names)
    if not names:
        raise ValueError(
            f"{directory} holds no exercise file (expected some of {', '.join(f'{n}.py' for n in EXERCISES)})"
        )
    _say_isolation()
    return _scorecard(root, names, seed, timeout, jobs)


def _check_arguments(seed, jobs, names) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs: expected a positive integer, got {jobs!r}")
    unknown = [n for n in names if n not in EXERCISES]
    if unknown:
        raise ValueError(f"only: unknown exercise(s) {unknown}; choose among {', '.join(EXERCISES)}")


def _say_isolation() -> None:
    """Once per run (a workbook or a class): what the grader cannot stop without bubblewrap."""
    if isolation.warning():
        print(f"transformer-parity grade: {isolation.warning()}", file=sys.stderr)


def _scorecard(root: Path, names: list, seed: int, timeout: float, jobs: int) -> dict:
    with ThreadPoolExecutor(max_workers=jobs) as pool:  # each job waits on its own child process
        card = dict(zip(names, pool.map(lambda n: _grade_one(root / f"{n}.py", n, seed, timeout), names), strict=True))
    passed = sum(entry["passed"] for entry in card.values())
    return {
        "passed": passed == len(card),
        "passed_count": passed,
        "points": sum(e["points"] for e in card.values()),
        "max_points": sum(e["max_points"] for e in card.values()),
        "seed": seed,
        "isolation": isolation.level(),
        "exercises": card,
    }


def _grade_one(path: Path, name: str, seed: int, timeout: float) -> dict:
    """One exercise's scorecard entry: refused from its source, or run in a child (grading.grade_file)."""
    start = time.monotonic()
    entry = grade_file(path, name, seed, timeout=timeout)
    points = POINTS[name] if entry["passed"] else 0
    return entry | {"points": points, "max_points": POINTS[name], "seconds": round(time.monotonic() - start, 2)}


def grade_class(root, *, seed: int = PUBLIC_SEED, timeout: float = DEFAULT_TIMEOUT, only=None, jobs: int = 1) -> dict:
    """Grade every sub-folder of `root` as one student's workbook (hidden folders skipped), on the same cases.
    The exercises graded are `only`, or every exercise any student handed in; one a student lacks scores 0.
    Returns {student folder name: scorecard} in name order."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"root: no such directory: {root}")
    students = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    if not students:
        raise ValueError(f"root: {root} holds no student folder (expected one sub-folder per student)")
    if only is None:
        only = [n for n in EXERCISES if any((s / f"{n}.py").is_file() for s in students)]
        if not only:
            raise ValueError(f"root: no student folder under {root} holds an exercise file")
    _check_arguments(seed, jobs, only)
    _say_isolation()
    with tempfile.TemporaryDirectory(prefix="transformer-parity-class-") as snapshot:
        cards = {}
        for student in students:  # every file copied before anyone's code runs: nobody can change a classmate's
            mine = Path(snapshot) / student.name
            mine.mkdir()
            for name in only:
                if (student / f"{name}.py").is_file():
                    shutil.copyfile(student / f"{name}.py", mine / f"{name}.py")
        for student in students:
            cards[student.name] = _scorecard(Path(snapshot) / student.name, list(only), seed, timeout, jobs)
    return cards


def class_csv(cards: dict) -> str:
    """The class's scorecards (grade_class) as CSV: a row per student, a column per exercise (its points), the
    total, and the points possible."""
    import csv
    import io

    names = list(next(iter(cards.values()))["exercises"]) if cards else []
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["student", *(f"{n} ({POINTS[n]})" for n in names), "total", "out_of"])
    for student, card in cards.items():
        points = [card["exercises"][n]["points"] for n in names]
        writer.writerow([student, *points, card["points"], card["max_points"]])
    return buffer.getvalue()
