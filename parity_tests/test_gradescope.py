"""The Gradescope autograder: the bundle `transformer-parity exercises --gradescope` writes, unpacked into a folder
laid out as Gradescope's (source/, submission/, results/; AUTOGRADER_ROOT points run_autograder at it), run on
honest, mistaken and cheating submissions, its results.json checked against Gradescope's documented format
(gradescope-autograders.readthedocs.io, "Autograder Specifications") and against the marks `grade` gives.

The bundle runs from the source it carries (PYTHONPATH: source/transformer-parity), with this machine's Python
standing in for the virtual environment its setup.sh builds (AUTOGRADER_PYTHON). The default run grades one
submission of three exercises (one right, one with a named mistake, one attacking the grader); the four-student
class and the attack class are slow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import pytest

from parity_tests.__main__ import main
from parity_tests.exercises import EXERCISES, POINTS, isolation, write_workbook
from parity_tests.exercises.gradescope import VISIBILITIES, find_submission, notebook_source
from parity_tests.test_grader import RECOMPUTE, replace_stub
from parity_tests.test_grader_attacks import ATTACKS, GADGETS, can_run, submission
from parity_tests.workbook_answers import answer, mistake

SEED = 2026
TEST = {
    "type": "object",
    "properties": {
        "score": {"type": "number"},
        "max_score": {"type": "number"},
        "status": {"enum": ["passed", "failed"]},
        "name": {"type": "string"},
        "name_format": {"enum": ["text", "html", "simple_format", "md", "ansi"]},
        "number": {"type": "string"},
        "output": {"type": "string"},
        "output_format": {"enum": ["text", "html", "simple_format", "md", "ansi"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "visibility": {"enum": list(VISIBILITIES)},
        "extra_data": {"type": "object"},
    },
    "additionalProperties": False,
}
# Gradescope's results.json: a score on the whole, or on every test
RESULTS = {
    "type": "object",
    "properties": {
        "score": {"type": "number"},
        "execution_time": {"type": "number"},
        "output": {"type": "string"},
        "output_format": {"enum": ["text", "html", "simple_format", "md", "ansi"]},
        "test_output_format": {"enum": ["text", "html", "simple_format", "md", "ansi"]},
        "test_name_format": {"enum": ["text", "html", "simple_format", "md", "ansi"]},
        "visibility": {"enum": list(VISIBILITIES)},
        "stdout_visibility": {"enum": list(VISIBILITIES)},
        "extra_data": {"type": "object"},
        "tests": {"type": "array", "items": TEST},
        "leaderboard": {"type": "array"},
    },
    "additionalProperties": False,
    "anyOf": [
        {"required": ["score"]},
        {"required": ["tests"], "properties": {"tests": {"items": {"required": ["score"]}}}},
    ],
}
# The forged result a student writes from inside their backward, were the results folder in reach
FORGE = """
def backward(dout, cache):
    try:
        f = G(IMPORT("io"), "open")(PATH, "w")
        f.write('{"score": 100, "tests": []}')
        f.close()
    except Exception:
        pass
    return dout
"""


def checked(results: dict, exercises: list) -> dict:
    """results.json valid (Gradescope's schema; each test's score within its maximum; the score their sum), one
    test per exercise worth its points, each followed by its case groups worth nothing. {exercise: its test}."""
    jsonschema.validate(results, RESULTS)
    tests = results["tests"]
    assert all(0 <= t["score"] <= t["max_score"] for t in tests)
    assert results["score"] == sum(t["score"] for t in tests)
    graded = {t["name"]: t for t in tests if ":" not in t["name"]}
    assert list(graded) == exercises
    for number, name in enumerate(exercises, start=1):
        assert graded[name]["max_score"] == POINTS[name] and graded[name]["number"] == str(number)
        cases = [t for t in tests if t["name"].startswith(f"{name}: ")]
        assert all(t["max_score"] == 0 and t["number"].startswith(f"{number}.") for t in cases)
    assert results["extra_data"]["seed"] == SEED
    return graded


def bundle(folder: Path, only: list) -> Path:
    path = folder / "autograder.zip"
    argv = ["exercises", "--gradescope", str(path), "--seed", str(SEED), "--only", ",".join(only), "--timeout", "20"]
    assert main(argv) == 0
    return path


def unpacked(zip_path: Path, root: Path) -> Path:
    """A folder laid out as Gradescope's /autograder: the zip in source/, run_autograder beside it, an empty
    submission/ and results/."""
    with zipfile.ZipFile(zip_path) as bundle:
        bundle.extractall(root / "source")
        modes = {info.filename: info.external_attr >> 16 for info in bundle.infolist()}
    assert modes["run_autograder"] & 0o111 and modes["setup.sh"] & 0o111  # Gradescope runs them as they are
    (root / "run_autograder").write_bytes((root / "source" / "run_autograder").read_bytes())
    (root / "submission").mkdir()
    (root / "results").mkdir()
    return root


def run_autograder(root: Path) -> dict:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(root),
        "AUTOGRADER_ROOT": str(root),
        "AUTOGRADER_PYTHON": sys.executable,
        "PYTHONPATH": str(root / "source" / "transformer-parity"),  # the source the bundle carries
        "HF_HUB_OFFLINE": "1",
    } | {f"{lib}_NUM_THREADS": "1" for lib in ("OMP", "MKL", "OPENBLAS")}
    done = subprocess.run(
        ["bash", str(root / "run_autograder")], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((root / "results" / "results.json").read_text())


def test_a_submission_is_graded_into_results_json(tmp_path):
    """One submission: linear right, layer norm with its mean term missing, softmax forging results.json from
    inside the grader. 1 of 4 points, the mistake named with its formula, the forgery without effect."""
    only = ["softmax", "linear", "layer_norm"]
    root = unpacked(bundle(tmp_path, only), tmp_path / "autograder")
    handed_in = root / "submission" / "hw"  # a zip the student uploaded, unpacked with its folder
    write_workbook(handed_in, only)
    answer(handed_in, "linear")
    answer(handed_in, "layer_norm", mistake("layer_norm", "layer_norm.missing_mean_term"))
    forged = root / "results" / "results.json"
    stub = EXERCISES["softmax"]
    path = f"\nPATH = {str(forged)!r}\n"
    (handed_in / "softmax.py").write_text(stub[: stub.index("def backward(")] + GADGETS + path + FORGE)
    results = run_autograder(root)
    graded = checked(results, only)
    assert [graded[n]["score"] for n in only] == [0, POINTS["linear"], 0] and results["score"] == 1
    assert graded["linear"]["status"] == "passed" and graded["softmax"]["status"] == "failed"
    ln = graded["layer_norm"]["output"]
    assert "layer_norm.missing_mean_term at dx:" in ln and "dx = rstd * (g - mean(g) - x_hat" in ln, ln
    cases = [t for t in results["tests"] if t["name"].startswith("layer_norm: ")]
    assert cases and any(t["status"] == "failed" and "dx (float64" in t["output"] for t in cases), cases
    assert results["visibility"] == "visible" and results["stdout_visibility"] == "hidden"
    assert results["extra_data"]["isolation"] == isolation.level()


def test_the_bundle_holds_what_gradescope_runs(tmp_path):
    path = bundle(tmp_path, ["softmax"])
    with zipfile.ZipFile(path) as zipped:
        names = set(zipped.namelist())
        setup = zipped.read("setup.sh").decode()
        config = json.loads(zipped.read("config.json"))
    assert {"setup.sh", "run_autograder", "transformer-parity/pyproject.toml"} <= names
    assert "transformer-parity/parity_tests/exercises/runner.py" in names
    assert not any("__pycache__" in n for n in names)
    assert "bubblewrap" in setup and "pip install /autograder/source/transformer-parity" in setup
    assert config == {
        "exercises": ["softmax"],
        "seed": SEED,
        "timeout": 20.0,
        "visibility": "visible",
        "stdout_visibility": "hidden",
    }
    assert main(["exercises", "--gradescope", str(path), "--seed", "1"]) == 2  # never overwritten
    with pytest.raises(SystemExit):
        main(["exercises", "--gradescope", str(tmp_path / "b.zip")])  # no seed
    with pytest.raises(SystemExit):
        main(["exercises", str(tmp_path / "wb"), "--gradescope", str(tmp_path / "c.zip"), "--seed", "1"])


def test_the_exercise_file_is_found_where_a_student_puts_it(tmp_path):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "softmax.py").write_text("# the notebook")
    assert find_submission(tmp_path, "softmax") is None
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "softmax.py").write_text("deep")
    (tmp_path / "z").mkdir()
    (tmp_path / "z" / "softmax.py").write_text("shallow")
    assert find_submission(tmp_path, "softmax") == tmp_path / "z" / "softmax.py"
    (tmp_path / "softmax.py").symlink_to(tmp_path / "a" / "b" / "softmax.py")
    assert find_submission(tmp_path, "softmax") == tmp_path / "z" / "softmax.py"  # a link is not followed


def as_notebook(exercise: Path) -> Path:
    """The student's exercise file written as a Jupyter notebook beside it (and the file removed): a markdown
    cell, IPython magic, the file's code, a self-check cell importing this package, a shell command."""

    def cell(kind: str, text: str) -> dict:
        return {"cell_type": kind, "metadata": {}, "source": text.splitlines(keepends=True)} | (
            {"outputs": [], "execution_count": None} if kind == "code" else {}
        )

    cells = [
        cell("markdown", "# My softmax\n$dx = p (dout - \\sum dout\\, p)$"),
        cell("code", "%matplotlib inline\nimport numpy as np"),
        cell("code", "from __future__ import annotations"),  # not the first line: moved there
        cell("code", exercise.read_text()),
        cell("code", "from parity_tests import check\nprint(check.pair(forward, backward, 'softmax'))"),
        cell("code", "!touch pwned\nopen('pwned', 'w')"),
    ]
    notebook = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = exercise.with_suffix(".ipynb")
    path.write_text(json.dumps(notebook))
    exercise.unlink()
    return path


def test_a_notebook_yields_its_definitions_and_nothing_else(tmp_path):
    write_workbook(tmp_path, ["softmax"])
    answer(tmp_path, "softmax")
    path = as_notebook(tmp_path / "softmax.py")
    assert find_submission(tmp_path, "softmax") == path
    source = notebook_source(path)
    assert "def backward(dout, cache):" in source and "import numpy as np" in source
    for left_out in ("parity_tests", "print(", "pwned", "matplotlib"):
        assert left_out not in source, left_out
    (tmp_path / "broken.ipynb").write_text("{not json")
    assert notebook_source(tmp_path / "broken.ipynb") == "raise SyntaxError('not a Jupyter notebook')\n"


@pytest.mark.slow
def test_the_four_student_class(tmp_path):
    """The whole workbook, one Gradescope run per student: ada right everywhere (16 of 16; her softmax written in
    a Jupyter notebook), bob with layer norm's mean term missing (14), cy recomputing each answer with the
    reference (0), dee handing in the stubs (0)."""
    names = list(EXERCISES)
    zipped = bundle(tmp_path, names)
    scores = {}
    for student in ("ada", "bob", "cy", "dee"):
        root = unpacked(zipped, tmp_path / student)
        folder = root / "submission"
        write_workbook(folder, names)
        for name in names if student in ("ada", "bob") else ():
            wrong = student == "bob" and name == "layer_norm"
            answer(folder, name, mistake(name, "layer_norm.missing_mean_term") if wrong else None)
        if student == "ada":
            as_notebook(folder / "softmax.py")
        if student == "cy":
            for name in names:
                text = (folder / f"{name}.py").read_text()
                (folder / f"{name}.py").write_text("import numpy_transformer  # noqa: F401\n" + text)
            replace_stub(folder / "softmax.py", RECOMPUTE)
        results = run_autograder(root)
        graded = checked(results, names)
        scores[student] = results["score"]
        assert sum(t["max_score"] for t in graded.values()) == 16
    assert scores == {"ada": 16, "bob": 14, "cy": 0, "dee": 0}


@pytest.mark.slow
def test_the_attack_class_earns_nothing(tmp_path):
    """Every attack of parity_tests/attacks this machine grades (all of them under bubblewrap), each its own
    Gradescope run of a softmax submission: 0 each, results.json valid."""
    zipped = bundle(tmp_path, ["softmax"])
    attacks = [a for a in ATTACKS if can_run(a, isolation.bwrap() is not None)]
    assert attacks
    earned = {}
    for attack in attacks:
        root = unpacked(zipped, tmp_path / attack.stem)
        (root / "submission" / "softmax.py").write_text(submission(attack))
        results = run_autograder(root)
        checked(results, ["softmax"])
        earned[attack.stem] = results["score"]
    assert earned == dict.fromkeys(earned, 0), earned
