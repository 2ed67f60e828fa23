"""A determined class against the grader: every attack in parity_tests/attacks (one softmax each, with a wrong or
absent answer) graded as one class through the CLI, beside three honest classmates, with bubblewrap and without
(the mode this machine does not default to is marked slow). Each attack must earn nothing; the classmates keep
their marks; every exercise ends within the time limit; nothing is left behind (no process, no file in the
teacher's folder, the class folder unchanged, no temporary folder)."""

from __future__ import annotations

import hashlib
import io
import json
import platform
import re
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from parity_tests.__main__ import main
from parity_tests.exercises import EXERCISES, grade, grading, isolation, runner, write_workbook
from parity_tests.workbook_answers import answer, mistake

ATTACKS = sorted(Path(__file__).with_name("attacks").glob("*.py"))
TIMEOUT = 8  # seconds per exercise: an honest softmax takes about one on a busy machine
SLACK = 4  # seconds past the limit for starting and ending a child
# What a determined student reaches without naming it: os, sys and __import__, through NumPy's modules.
GADGETS = """
G = getattr
OS = G(G(G(np, "_core"), "_add_newdocs_scalars"), "o" + "s")
SYS = G(OS, "s" + "ys")
IMPORT = G(SYS.modules["builtins"], "__imp" + "ort__")

"""
HONEST = {"honest": 1, "victim": 1, "mistaken": 0}  # the classmates and their marks (victim: c02's, c03's target)
NO_BWRAP = "bubblewrap (bwrap) is not installed here, or cannot create its namespaces"
FILTERED = sys.platform.startswith("linux") and platform.machine() in runner.SYSCALLS  # the seccomp filter's


def needs_bwrap(path: Path) -> bool:
    return "# needs: bwrap" in path.read_text()


def can_run(path: Path, use_bwrap: bool) -> bool:
    """Whether this attack is graded in this mode: the reading ones only under bubblewrap, the ones that signal the
    grader only where the child's seccomp filter forbids it (else they would kill the test run)."""
    return (use_bwrap or not needs_bwrap(path)) and (FILTERED or "# needs: seccomp" not in path.read_text())


def submission(path: Path) -> str:
    stub = EXERCISES["softmax"]
    return stub[: stub.index("def backward(")] + GADGETS + path.read_text()


def _fingerprint(folder: Path) -> dict:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def _processes_named(tags) -> list:
    found = []
    for entry in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            line = entry.read_bytes()
        except OSError:
            continue
        found += [entry.parent.name for tag in tags if tag.encode() in line]
    return found


def _run(root: Path, use_bwrap: bool) -> dict:
    """Write the class, grade it through the CLI, and collect what the tests check."""
    attacks = [a for a in ATTACKS if can_run(a, use_bwrap)]
    klass, teacher = root / "class", root / "teacher"
    for student in [*HONEST, *(a.stem for a in attacks)]:
        write_workbook(klass / student, ["softmax"])
    for attack in attacks:
        (klass / attack.stem / "softmax.py").write_text(submission(attack))
    answer(klass / "honest", "softmax")
    answer(klass / "victim", "softmax")
    answer(klass / "mistaken", "softmax", mistake("softmax", "softmax.missing_row_term"))
    teacher.mkdir()
    before = _fingerprint(klass)
    temporary = set(Path(tempfile.gettempdir()).glob("transformer-parity-*"))
    folders: list = []
    real_mkdtemp = tempfile.mkdtemp

    def recording(*args, **kwargs):
        folders.append(real_mkdtemp(*args, **kwargs))
        return folders[-1]

    argv = ["grade", "--class", str(klass), "--csv", "marks.csv", "--json", "marks.json", "--timeout", str(TIMEOUT)]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(teacher)
        mp.setattr(tempfile, "mkdtemp", recording)
        if not use_bwrap:
            mp.setattr(isolation, "bwrap", lambda: None)
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            with mp.context() as streams:
                streams.setattr("sys.stdout", out)
                streams.setattr("sys.stderr", err)
                start = time.monotonic()
                code = main(argv)
                seconds = time.monotonic() - start
            out.seek(0)
            err.seek(0)
            printed, warned = out.read(), err.read()
        cards = json.loads((teacher / "marks.json").read_text())
        csv = (teacher / "marks.csv").read_text()
        (teacher / "marks.json").unlink()
        (teacher / "marks.csv").unlink()
    tags = [Path(f).name for f in folders]
    for _ in range(20):  # a killed namespace's processes go within moments
        if not _processes_named(tags):
            break
        time.sleep(0.1)
    return {
        "code": code,
        "cards": cards,
        "csv": csv,
        "printed": printed,
        "warned": warned,
        "seconds": seconds,
        "attacks": attacks,
        "changed": before != _fingerprint(klass),
        "teacher": sorted(p.name for p in teacher.iterdir()),
        "temporary": sorted(str(p) for p in set(Path(tempfile.gettempdir()).glob("transformer-parity-*")) - temporary),
        "processes": _processes_named(tags),
    }


def _modes() -> list:
    """The class is graded in the best mode this machine has by default; in the other (slow) too."""
    best = "bwrap" if isolation.bwrap() else "plain"
    return [mode if mode == best else pytest.param(mode, marks=pytest.mark.slow) for mode in ("bwrap", "plain")]


@pytest.fixture(scope="module", params=_modes())
def graded(request, tmp_path_factory):
    if request.param == "bwrap" and isolation.bwrap() is None:
        pytest.skip(NO_BWRAP)
    return request.param, _run(tmp_path_factory.mktemp(request.param), request.param == "bwrap")


def test_no_attack_earns_a_mark(graded):
    mode, run = graded
    earned = {a.stem: run["cards"][a.stem]["points"] for a in run["attacks"]}
    summaries = {a.stem: run["cards"][a.stem]["exercises"]["softmax"]["summary"] for a in run["attacks"]}
    assert earned == dict.fromkeys(earned, 0), summaries
    assert run["code"] == 1
    if mode == "plain":  # the reading attacks are left out: only bubblewrap stops them (said once, below)
        assert {a.stem for a in ATTACKS} - {a.stem for a in run["attacks"]} == {
            a.stem for a in ATTACKS if not can_run(a, False)
        }


def test_the_classmates_keep_their_marks(graded):
    _, run = graded
    assert {s: run["cards"][s]["points"] for s in HONEST} == HONEST
    assert run["cards"]["mistaken"]["exercises"]["softmax"]["diagnoses"] == ["softmax.missing_row_term"]
    rows = dict(line.split(",", 1) for line in run["csv"].splitlines()[1:])
    assert rows["victim"] == "1,1,1" and rows["honest"] == "1,1,1" and rows["mistaken"] == "0,0,1"


def test_every_exercise_ends_within_the_time_limit(graded):
    _, run = graded
    seconds = {s: card["exercises"]["softmax"]["seconds"] for s, card in run["cards"].items()}
    assert max(seconds.values()) <= TIMEOUT + SLACK, seconds
    assert (
        run["cards"]["k08_hang"]["exercises"]["softmax"]["summary"]
        == f"did not finish within {TIMEOUT} s (a hang?); stopped"
    )
    assert run["seconds"] <= sum(seconds.values()) + 10


def test_nothing_is_left_behind(graded):
    mode, run = graded
    assert run["teacher"] == [] and not run["changed"] and run["temporary"] == []
    assert run["processes"] == [], f"processes left running ({mode}): {run['processes']}"


def test_the_screen_cannot_be_forged(graded):
    _, run = graded
    lines = run["printed"].splitlines()
    passing = [line for line in lines if line.startswith("PASS")]
    assert len(passing) == 2, passing  # honest's and victim's, nobody else's
    forged = run["cards"]["e01_forged_line"]["exercises"]["softmax"]
    assert not forged["passed"] and "\n" not in forged["summary"] and "\\nPASS" in forged["summary"]
    shown = [card["exercises"]["softmax"]["output"] for card in run["cards"].values()]
    assert all(re.fullmatch(r"(\| [^\n]*\n?)*", text) for text in shown), shown


def test_the_warning_is_said_once_without_bubblewrap(graded):
    mode, run = graded
    assert run["warned"].count("bubblewrap (bwrap) is not available") == (mode == "plain")
    plain = "no new processes" if FILTERED else "none"
    assert {card["isolation"] for card in run["cards"].values()} == {"bubblewrap" if mode == "bwrap" else plain}


def test_the_reading_attacks_are_real_without_bubblewrap(tmp_path, monkeypatch):
    """The control for the attacks only bubblewrap stops: without it, reading the grader's environment and the
    answers from disk earns the mark (the once-per-run warning says so), so their 0 under bubblewrap means
    something."""
    monkeypatch.setattr(isolation, "bwrap", lambda: None)
    monkeypatch.chdir(Path(__file__).parents[1])  # a teacher grading from the project's folder
    for stem in ("b01_memmap_answers", "b03_ctypes_pyrun", "b04_site_packages"):
        write_workbook(tmp_path / stem, ["softmax"])
        (tmp_path / stem / "softmax.py").write_text(submission(Path(__file__).with_name("attacks") / f"{stem}.py"))
        card = grade(tmp_path / stem, timeout=TIMEOUT)
        assert card["points"] == 1, card["exercises"]["softmax"]["summary"]


def _reader(message: bytes):
    stream = io.BytesIO(message)

    def read(n):
        data = stream.read(n)
        if len(data) != n:
            raise EOFError
        return data

    return read


def _message(header: dict, data: bytes = b"") -> bytes:
    head = json.dumps(header).encode()
    return struct.pack("<QQ", len(head), len(data)) + head + data


def test_the_grader_reads_back_only_fresh_numeric_arrays():
    x = np.arange(6.0).reshape(2, 3)
    meta, value = runner.unpack(_reader(runner.pack({"ok": True}, (x, {"w": x[0]}, 1.5, None))))
    assert meta == {"ok": True} and np.array_equal(value[0], x) and value[1]["w"].shape == (3,)
    assert value[0].flags.writeable and value[0].base is None and value[2:] == (1.5, None)
    with pytest.raises(TypeError, match="cannot be sent back"):
        runner.pack({}, np.array([object()]))
    refused = {
        "an object array": _message({"meta": {}, "body": {"a": 0}, "arrays": [["object", [1]]]}, b"\0" * 8),
        "a cache number from the child": _message({"meta": {}, "body": {"h": 0}, "arrays": []}),
        "an object with attributes from the child": _message({"meta": {}, "body": {"ns": []}, "arrays": []}),
        "lengths that do not add up": _message({"meta": {}, "body": {"a": 0}, "arrays": [["float64", [4]]]}, b"\0" * 8),
        "a negative dimension": _message({"meta": {}, "body": {"a": 0}, "arrays": [["float64", [-1]]]}),
        "an index past the arrays": _message({"meta": {}, "body": {"a": 3}, "arrays": []}),
        "an unknown node": _message({"meta": {}, "body": {"pickle": "x"}, "arrays": []}),
        "a header that is not JSON": struct.pack("<QQ", 3, 0) + b"{[}",
        "lengths over the limits": struct.pack("<QQ", 1 << 40, 0),
    }
    for what, message in refused.items():
        with pytest.raises(runner.ProtocolError):
            runner.unpack(_reader(message))
            pytest.fail(what)
    assert isinstance(runner.unpack(_reader(_message({"meta": {}, "body": {"h": 2}, "arrays": []})), trusted=True)[1],
                      runner.Handle)  # fmt: skip


def test_what_a_child_prints_cannot_start_a_line_of_the_report():
    raw = "ok\nPASS  softmax 1/1\r\x1b[2Kfake\u2028PASS\x85x".encode()
    shown = grading.shown_output(raw)
    assert all(line.startswith("| ") for line in shown.split("\n")), shown
    assert "\r" not in shown and "\x1b" not in shown and "\u2028" not in shown and "\x85" not in shown
    assert grading.printable("a\nb\u2029c") == "a\\nb\\u2029c"


def test_without_bubblewrap_what_left_the_group_is_found_by_its_folder(tmp_path):
    """The backstop behind the seccomp filter, without bubblewrap's process namespace: a process that left the
    child's process group but still names the child's folder on its command line is killed at the end."""
    folder = tmp_path / "transformer-parity-grade-test"
    code = "import time; time.sleep(60)"  # in a session of its own (start_new_session)
    daemon = subprocess.Popen([sys.executable, "-c", code, str(folder)], start_new_session=True)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(tmp_path / "other")])
    try:
        time.sleep(0.3)
        grading._kill_stragglers(str(folder))
        assert daemon.wait(timeout=10) == -9
        assert bystander.poll() is None  # only what names the folder
    finally:
        for process in (daemon, bystander):
            process.kill()
            process.wait()
