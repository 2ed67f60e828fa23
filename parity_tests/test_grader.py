"""The grader as a teacher uses it: cases drawn from a seed, each exercise in a child with a time limit, cheats
refused (the reference recomputed, torch's autograd, sys.exit, a hang, a shell command), a class graded to a CSV."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

from parity_tests import check
from parity_tests.__main__ import main
from parity_tests.check.report import FLOAT32_FLOOR, FLOAT32_RATIO
from parity_tests.exercises import POINTS, class_csv, grade, grade_class, write_workbook
from parity_tests.exercises.grading import BARS, grade_file, source_problems
from parity_tests.workbook_answers import MISTAKES, answer, mistake

RECOMPUTE = """
    from numpy_transformer import layers
    _, c = layers.softmax_forward(**cache["inputs"])
    return layers.softmax_backward(dout, c)
"""
AUTOGRAD = """
    import torch
    x = torch.tensor(cache["x"], requires_grad=True)
    w = torch.tensor(cache["weight"], requires_grad=True)
    b = torch.tensor(cache["inputs"]["bias"], requires_grad=True)
    (x @ w.T + b).backward(torch.tensor(dout))
    return x.grad.numpy(), w.grad.numpy(), b.grad.numpy()
"""
CAUGHT = """
    try:
        from numpy_transformer import layers
        _, c = layers.softmax_forward(**cache["inputs"])
        return layers.softmax_backward(dout, c)
    except ImportError:
        p = cache["p"]
        return p * (dout - (dout * p).sum(axis=-1, keepdims=True))
"""
HANG = """
    while True:
        pass
"""
SHELL = """
    import os
    os.system("touch pwned")
    return cache["p"] * dout
"""


def replace_stub(path, body: str) -> None:
    text = path.read_text()
    start = text.index("    raise NotImplementedError(")
    end = text.index("\n", start)
    path.write_text(text[:start] + body.strip("\n") + text[end:])


def test_the_bars_stated_are_the_bars_applied():
    from parity_tests.components import BAR, FD_BAR

    assert f"float64 {BAR[np.dtype('float64')]:.0e} against the reference" in BARS
    assert f"{FD_BAR:.0e} against finite differences" in BARS
    assert f"float32 against the reference {FLOAT32_RATIO:g} x the reference's own float32 error" in BARS
    assert f"at least {FLOAT32_FLOOR:.1e}" in BARS


def test_a_teachers_seed_draws_cases_the_notebook_does_not_show():
    """Every case's inputs, and the upstream gradients, come from the seed: answers kept from the public cases
    (seed 0, the notebooks') are wrong on a teacher's seed."""
    spec = check.PAIRS["softmax"]
    remembered = {}

    def replay(dout, cache):  # the public cases' answers, looked up by the upstream gradient's shape
        return remembered[dout.shape]

    def remember(dout, cache):
        return remembered.setdefault(dout.shape, spec.backward(dout, cache))

    check.pair(spec.forward, remember, "softmax", seed=0, dtypes=("float64",))
    for name, make in spec.cases.items():
        assert not np.allclose(make(np.random.default_rng(0))["x"], make(np.random.default_rng(5))["x"]), name
    assert check.pair(spec.forward, spec.backward, "softmax", seed=5).passed
    assert not check.pair(spec.forward, replay, "softmax", seed=5).passed


def test_source_problems_name_the_line_and_the_import():
    assert source_problems("import numpy as np\nfrom scipy.special import erf\nimport math\n", "softmax") == []
    (problem,) = source_problems("import numpy as np\nfrom numpy_transformer import layers\n", "softmax")
    assert problem.startswith("line 2 imports numpy_transformer.layers: a submission may not use the reference")
    assert "imports torch" in source_problems("import torch.nn.functional as F", "linear")[0]
    assert "imports os: a submission may import only numpy" in source_problems("import os", "linear")[0]
    assert "uses __import__" in source_problems("m = __import__('torch')", "linear")[0]
    assert "reads .__globals__" in source_problems("g = f.__globals__", "encoder_layer")[0]
    assert "does not parse" in source_problems("def f(:\n", "linear")[0]
    chained = "from numpy_transformer import multi_head_attention_backward\n"
    assert source_problems(chained, "encoder_layer") == []
    assert source_problems(chained, "multi_head_attention") != []  # only where the exercise chains them
    assert source_problems("from numpy_transformer.model import encoder_layer_backward", "encoder_layer") != []


def test_cheats_and_crashes_fail_with_the_reason(tmp_path):
    write_workbook(tmp_path, ["softmax", "linear", "layer_norm", "embedding", "scaled_dot_product_attention"])
    replace_stub(tmp_path / "softmax.py", RECOMPUTE)
    replace_stub(tmp_path / "linear.py", AUTOGRAD)
    text = (tmp_path / "layer_norm.py").read_text()
    (tmp_path / "layer_norm.py").write_text("import sys\nsys.exit(0)\n" + text)  # would make the grader exit 0
    (tmp_path / "embedding.py").write_text("raise SystemExit(0)\n" + (tmp_path / "embedding.py").read_text())
    replace_stub(tmp_path / "scaled_dot_product_attention.py", HANG)
    card = grade(tmp_path, seed=4, timeout=60, only=["softmax", "linear", "layer_norm", "embedding"])
    hang = grade(tmp_path, timeout=3, only=["scaled_dot_product_attention"])  # stopped, however far it got
    summaries = {name: entry["summary"] for name, entry in (card["exercises"] | hang["exercises"]).items()}
    assert card["passed_count"] == hang["passed_count"] == 0 and card["points"] == 0, summaries
    assert summaries["softmax"].startswith("refused: line ") and "imports numpy_transformer" in summaries["softmax"]
    assert "imports torch" in summaries["linear"]
    assert "imports sys: a submission may import only" in summaries["layer_norm"]
    assert summaries["embedding"] == "called sys.exit(0) instead of returning"
    assert summaries["scaled_dot_product_attention"] == "did not finish within 3 s (a hang?); stopped"


def test_a_shell_command_is_refused_before_it_runs(tmp_path):
    write_workbook(tmp_path, ["softmax"])
    replace_stub(tmp_path / "softmax.py", SHELL)
    entry = grade(tmp_path)["exercises"]["softmax"]
    assert "imports os" in entry["summary"] and not entry["passed"]
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    "body, tried",
    [(RECOMPUTE, "numpy_transformer"), (AUTOGRAD, "torch"), (CAUGHT, "numpy_transformer")],
    ids=["reference", "autograd", "import-error-caught"],
)
def test_the_run_time_guard_refuses_what_the_source_check_missed(tmp_path, body, tried):
    """With the source check skipped, the imports fail inside the student's code, and an attempt fails the exercise
    even when the code catches the ImportError and falls back to a right answer."""
    name = "linear" if tried == "torch" else "softmax"
    write_workbook(tmp_path, [name])
    replace_stub(tmp_path / f"{name}.py", body)
    entry = grade_file(tmp_path / f"{name}.py", name, check_source=False)
    assert not entry["passed"]
    assert f"tried to import {tried}" in entry["summary"], entry["summary"]
    import torch  # noqa: F401

    import numpy_transformer  # noqa: F401  the grader's own modules are back in place afterwards


def test_the_encoder_layer_may_chain_only_the_pairs_it_names(tmp_path):
    write_workbook(tmp_path, ["encoder_layer"])
    answer(tmp_path, "encoder_layer")
    assert grade_file(tmp_path / "encoder_layer.py", "encoder_layer", seed=2)["passed"]
    replace_path = tmp_path / "encoder_layer.py"
    text = replace_path.read_text()
    cheat = text.replace(
        "    grads = {}\n\n    def put",
        "    from numpy_transformer.model import encoder_layer_backward\n    grads = {}\n\n    def put",
        1,
    )
    replace_path.write_text(cheat)
    entry = grade_file(replace_path, "encoder_layer", check_source=False)
    assert not entry["passed"] and "tried to import numpy_transformer.model" in entry["summary"], entry["summary"]


def test_a_class_is_graded_to_a_csv(tmp_path, capsys):
    """Three students: ada right, bob with a mistake and no embedding handed in, cy recomputing with the reference."""
    root = tmp_path / "class"
    for student in ("ada", "bob", "cy"):
        write_workbook(root / student, ["softmax"])
    write_workbook(root / "ada", ["embedding"])
    answer(root / "ada", "embedding")
    answer(root / "ada", "softmax")
    answer(root / "bob", "softmax", mistake("softmax", "softmax.missing_row_term"))
    replace_stub(root / "cy" / "softmax.py", RECOMPUTE)
    out, details = tmp_path / "grades.csv", tmp_path / "grades.json"
    argv = ["grade", "--class", str(root), "--csv", str(out), "--json", str(details), "--seed", "9", "--jobs", "2"]
    assert main(argv) == 1
    rows = list(csv.reader(io.StringIO(out.read_text())))
    assert rows[0] == ["student", f"softmax ({POINTS['softmax']})", f"embedding ({POINTS['embedding']})", "total",
                       "out_of"]  # fmt: skip
    full = str(POINTS["softmax"] + POINTS["embedding"])
    assert rows[1:] == [
        ["ada", str(POINTS["softmax"]), str(POINTS["embedding"]), full, full],
        ["bob", "0", "0", "0", full],
        ["cy", "0", "0", "0", full],
    ]
    cards = json.loads(details.read_text())
    assert cards["bob"]["exercises"]["embedding"]["summary"] == "not handed in"
    assert cards["bob"]["exercises"]["softmax"]["diagnoses"] == ["softmax.missing_row_term"]
    assert "imports numpy_transformer" in cards["cy"]["exercises"]["softmax"]["summary"]
    printed = capsys.readouterr().out
    assert f"ada: {full} of {full} points" in printed and f"bob: 0 of {full} points" in printed
    assert class_csv({"dee": cards["ada"]}).splitlines()[1] == f"dee,1,1,{full},{full}"


def test_grade_arguments_are_checked(tmp_path, capsys):
    with pytest.raises(ValueError, match="directory: no such directory"):
        grade(tmp_path / "nope")
    with pytest.raises(ValueError, match="seed: expected a non-negative integer"):
        grade(tmp_path, seed=-1)
    with pytest.raises(ValueError, match="jobs: expected a positive integer, got 0"):
        grade(tmp_path, jobs=0)
    with pytest.raises(ValueError, match="root: .* holds no student folder"):
        grade_class(tmp_path)
    assert main(["grade", str(tmp_path), "--only", "attention"]) == 2
    assert "only: unknown exercise" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["grade"])  # neither a directory nor --class
    with pytest.raises(SystemExit):
        main(["grade", str(tmp_path), "--csv", "x.csv"])  # --csv without --class


@pytest.mark.parametrize(
    "name, vid, wrong, right_text, wrong_text", MISTAKES, ids=[f"{m[0]}-{m[1]}-{i}" for i, m in enumerate(MISTAKES)]
)
def test_each_backward_mistake_is_named_at_the_gradient_it_breaks(tmp_path, name, vid, wrong, right_text, wrong_text):
    write_workbook(tmp_path, [name])
    path = answer(tmp_path, name, (right_text, wrong_text))
    entry = grade_file(path, name, seed=6)
    assert not entry["passed"]
    named = {(m["id"], m["at"]) for m in entry["mistakes"]}
    assert {(one, tensor) for one in vid.split("+") for tensor in wrong} <= named, entry["summary"]
    assert set(entry["diagnoses"]) == set(vid.split("+")), entry["summary"]
    assert "raised" not in entry["summary"], entry["summary"]  # a wrong shape is named, not an exception


def test_a_pair_report_states_both_float64_bars_and_the_derived_float32_ones():
    """float64: the reference's bar and finite differences'; float32: per tensor, FLOAT32_RATIO x the reference
    pair's own float32 error (its float32 run against its float64 run on the same inputs), at least the floor."""
    spec = check.PAIRS["linear"]
    result = check.pair(spec.forward, spec.backward, "linear")
    text = str(result)
    assert "float64 (bar 1e-10 / 1e-06)" in text and "float32 (bar" in text
    assert "reference's own float32 error" in result.conventions["bars"]
    rows = [r for r in result.rows if r.dtype == "float32"]
    assert rows and all(r.own is not None and r.bar == max(FLOAT32_FLOOR, FLOAT32_RATIO * r.own) for r in rows)
    assert any(r.own > 0 for r in rows)  # the reference's float32 run does differ from its float64 one


def test_an_unknown_wrong_shape_says_what_was_expected(tmp_path):
    write_workbook(tmp_path, ["dropout"])
    replace_stub(tmp_path / "dropout.py", "\n    return dout.reshape(-1)[:3]\n")
    entry = grade_file(tmp_path / "dropout.py", "dropout")
    assert "your code raised ValueError: backward's dx has shape (3,), expected (2, 5, 8)" in entry["summary"]


def test_your_turn_checks_tensor_by_tensor_and_names_the_mistake(capsys):
    from numpy_transformer import layers as L
    from parity_tests.check.your_turn import checker

    rng = np.random.default_rng(1)
    x, weight, bias = rng.standard_normal((5, 4)), rng.standard_normal((3, 4)), rng.standard_normal(3)
    dout = rng.standard_normal((5, 3))
    dx, dweight, dbias = L.linear_backward(dout, L.linear_forward(x, weight, bias)[1])
    assert np.abs(dweight).max() > 0 and np.abs(dx).max() > 0
    check = checker(
        {"dx": dx, "dW": dweight, "db": dbias},
        reference="linear",
        args={"x": x, "weight": weight, "bias": bias},
        dout=dout,
        wrt={"dx": "x", "dW": "weight", "db": "bias"},
        exercise="linear",
    )
    assert check("dx, dW, db", (dout @ weight, dout.T @ x, dout.sum(axis=0)))
    assert "dW: right" in capsys.readouterr().out
    assert not check("dx, dW, db", None)
    assert capsys.readouterr().out.count("not written yet") == 3
    assert not check("dx, dW, db", (dout @ weight, x.T @ dout, dout))
    out = capsys.readouterr().out
    assert "dx: right" in out and "dW: wrong, shape (4, 3) instead of (3, 4): linear.weight_grad_transposed" in out
    assert "db: wrong, shape (5, 3) instead of (3,): linear.bias_not_summed" in out
    assert "--only linear" in out
    assert not check("dx", 0.5 * dx)
    assert "backward.scaled: 0.5 times the right gradient" in capsys.readouterr().out
    assert not check("dx", dout @ weight + 1e-3)
    assert "not a mistake the catalogue knows" in capsys.readouterr().out
    assert not check("dx, dW", (dx,))
    with pytest.raises(ValueError, match=r"name: \['dy'\] not among"):
        check("dy", dx)
    with pytest.raises(TypeError, match="ours: expected a dict"):
        checker([dx])


def test_scipy_imported_late_is_not_taken_for_a_cheat(tmp_path):
    """scipy imports ctypes and the like lazily: only the reference and torch are refused while a submission runs."""
    write_workbook(tmp_path, ["linear"])
    path = answer(tmp_path, "linear")
    path.write_text("from scipy import integrate, optimize  # noqa: F401\n" + path.read_text())
    entry = grade(tmp_path, seed=1)["exercises"]["linear"]  # a fresh process: nothing of scipy's imported yet
    assert entry["passed"], entry["summary"]
