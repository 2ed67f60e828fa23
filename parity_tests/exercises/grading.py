"""One submitted exercise graded honestly: read before it runs, run where it cannot reach its verdict.

`grade_file(path, name, seed, timeout=...)` grades one exercise file:

1. The source is read first (`source_problems`): a submission may import numpy, math and scipy (the encoder
   layer's exercise also the reference pairs it chains, by name), and may not name the escape hatches of Python
   (`__import__`, `exec`, `eval`, `open`, `globals`, `__globals__`, ...). Importing numpy_transformer,
   parity_tests or torch would let it recompute the answer with the reference or with autograd. This catches the
   honest mistake; what stops a determined student is step 2.
2. The student's functions run in a child (`Child`: runner.py, started by parity_tests.exercises.isolation from a
   private copy of the file, in a fresh working folder, under bubblewrap where it runs): a Python that imports
   NumPy, SciPy and the student's module and nothing else, and forbids itself to start or signal processes. The
   grader sends it the inputs and it sends back arrays (runner.pack, runner.unpack: no pickle), which are checked
   and copied here. An import of the reference or torch refused at run time fails the exercise even when the code
   catches the ImportError and carries on. An exit, a crash, a hang or a message that is not an answer ends the
   child (SubmissionEnded) and fails the exercise with the reason.
3. Here, in the grader, which never imports the student's code, parity_tests.check.pair judges the pair (the
   reference's forward and backward, its cache, the comparison, the diagnoses and the verdict) on cases drawn from
   `seed`: the default seed is public (the notebook shows its cases), a teacher's seed draws cases no student has
   seen. What the child printed, and the messages of its exceptions, are escaped (`printable`, `shown_output`):
   nothing it writes can start a line of the report.
"""

from __future__ import annotations

import ast
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from parity_tests.sandbox import describe_exit as _describe_exit

from . import isolation, runner

__all__ = ["BARS", "REFERENCE_MODULES", "ALLOWED_IMPORTS", "source_problems", "grade_file", "printable", "shown_output"]

BARS = (
    "bars: float64 1e-10 against the reference and 1e-06 against finite differences of your forward, "
    "float32 against the reference 8 x the reference's own float32 error on that tensor, at least 3.8e-06 "
    "(relative to each tensor's largest value)"
)

# What would hand a student the answer: the reference (and its twin), this package, and autograd.
REFERENCE_MODULES = ("numpy_transformer", "torch_transformer", "parity_tests", "torch")
ALLOWED_IMPORTS = ("numpy", "math", "scipy", "__future__", "functools", "itertools", "typing", "dataclasses")
# The encoder layer's exercise chains the reference's pairs: these names, and only these, may be imported.
CHAINED = {
    "encoder_layer": {
        "numpy_transformer": ("multi_head_attention_backward", "multi_head_attention_forward"),
        "numpy_transformer.layers": (
            "feed_forward_backward",
            "feed_forward_forward",
            "layer_norm_backward",
            "layer_norm_forward",
        ),
    }
}
FORBIDDEN_NAMES = (
    "__import__",
    "exec",
    "eval",
    "compile",
    "open",
    "breakpoint",
    "input",
    "globals",
    "locals",
    "vars",
    "exit",
    "quit",
    "__builtins__",
    "__globals__",
    "__subclasses__",
    "__code__",
    "__closure__",
    "__loader__",
    "__spec__",
)
OUTPUT_TAIL = 2000  # characters of the child's output kept for the teacher
MAX_SOURCE = 1 << 20  # bytes an exercise file may have
# The child's whole environment: one BLAS thread, nothing of the grader's (tokens, paths).
CHILD_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp"}
CHILD_ENV |= {f"{lib}_NUM_THREADS": "1" for lib in ("OPENBLAS", "OMP", "MKL")}


def source_problems(source: str, name: str) -> list:
    """What the source of exercise `name` may not do, one sentence each (empty: nothing found)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [f"does not parse: {exc.msg} (line {exc.lineno})"]
    chained = CHAINED.get(name, {})
    problems = []
    for node in ast.walk(tree):
        problems += _forbidden_name(node)
        for line, module, member in _imported(node):
            if member is None or member not in chained.get(module, ()):
                problems += _import_problem(line, module, member)
    return problems


def _forbidden_name(node) -> list:
    """A name or an attribute a backward pass has no need of (FORBIDDEN_NAMES)."""
    if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
        return [f"line {node.lineno} uses {node.id}, which a backward pass has no need of"]
    if isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_NAMES:
        return [f"line {node.lineno} reads .{node.attr}, which a backward pass has no need of"]
    return []


def _imported(node) -> list:
    """(line, module, member or None) for each name an import statement brings in."""
    if isinstance(node, ast.Import):
        return [(node.lineno, alias.name, None) for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        module = "." * node.level + (node.module or "")
        return [(node.lineno, module, alias.name) for alias in node.names]
    return []


def _import_problem(line: int, module: str, member: str | None) -> list:
    """An import of the reference, this package or torch, or of a module outside ALLOWED_IMPORTS."""
    top = module.split(".")[0]
    if top in REFERENCE_MODULES:
        what = f"{module}.{member}" if member else module
        return [
            f"line {line} imports {what}: a submission may not use the reference, this package or "
            "torch (that would recompute the answer instead of deriving it)"
        ]
    if top not in ALLOWED_IMPORTS:
        allowed = ", ".join(m for m in ALLOWED_IMPORTS if not m.startswith("_"))
        return [f"line {line} imports {module or '.'}: a submission may import only {allowed}"]
    return []


class SubmissionEnded(BaseException):
    """The child exited, crashed, ran out of time or broke the protocol: the exercise fails with this reason.
    (A BaseException, so that check.pair's handling of an exception raised by the student's code lets it by.)"""


def printable(text: str) -> str:
    """`text` with every character that is not printable (newlines, carriage returns, escapes, the Unicode line
    separators) written as its escape: one line, which cannot start a line of the report."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def shown_output(raw: bytes, limit: int = OUTPUT_TAIL) -> str:
    """The tail of what the child printed, each line prefixed "| " and escaped (printable)."""
    text = raw.decode(errors="replace")[-limit:]
    return "\n".join(f"| {printable(line)}" for line in text.splitlines())


def _raised(kind, message) -> Exception:
    """The student's exception, rebuilt here from its name and message (escaped): NotImplementedError stays itself
    (the stub, "not implemented yet"); any other is an Exception of the same name."""
    message = printable(str(message))
    if kind == "NotImplementedError":
        return NotImplementedError(message)
    name = kind if isinstance(kind, str) and kind.isidentifier() and len(kind) <= 60 else "Exception"
    return type(name, (Exception,), {"__module__": "submission"})(message)


class Child:
    """A student's submission running in the grader's child (runner.py, isolated by parity_tests.exercises.isolation)
    from a private copy in a fresh working folder, reached only through `request`. All of it must be done by
    `deadline` (time.monotonic()); `close` ends every process it started and removes the folder."""

    def __init__(self, path: Path, name: str, timeout: float):
        self.timeout, self.deadline = timeout, time.monotonic() + timeout
        self.folder = Path(tempfile.mkdtemp(prefix="transformer-parity-grade-"))
        self.refused: list = []
        self.output = tempfile.TemporaryFile()  # a file, not a pipe: nothing the child leaves running holds us
        answers, self._answers_end = os.pipe()
        self.answers = answers
        try:
            copy = self.folder / f"{name}.py"
            shutil.copyfile(path, copy)
            site = isolation.site_folder(self.folder, name)
            argv = isolation.command(self.folder, site, copy, name, self._answers_end, ",".join(REFERENCE_MODULES))
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=self.output,
                stderr=subprocess.STDOUT,
                pass_fds=(self._answers_end,),
                cwd=self.folder,
                env=CHILD_ENV,
                start_new_session=True,
                preexec_fn=isolation.limits(timeout),
            )
        except BaseException:  # nothing of ours left behind when the child cannot even start
            os.close(self._answers_end)
            os.close(self.answers)
            self.output.close()
            shutil.rmtree(self.folder, ignore_errors=True)
            raise
        os.close(self._answers_end)
        os.set_blocking(self.proc.stdin.fileno(), False)

    def request(self, op: str, *args, **kwargs):
        """Ask the child to run `op` ("load", "forward" or "backward") on these arguments; (meta, value) of its
        answer, checked. The student's exception is raised here as _raised builds it; anything else that goes
        wrong raises SubmissionEnded."""
        try:
            self._write(runner.pack({"op": op}, {"args": list(args), "kwargs": kwargs}))
            meta, value = runner.unpack(self._read)
        except runner.ProtocolError as exc:
            raise SubmissionEnded(f"sent back something that is not an answer: {printable(str(exc))}") from None
        refused = meta.get("refused", [])
        if isinstance(refused, list):
            self.refused += [printable(str(r))[:200] for r in refused[:20]]
        if "exit" in meta:
            raise SubmissionEnded(printable(str(meta["exit"])))
        if "error" in meta:
            raise _raised(meta["error"], meta.get("message", ""))
        if meta.get("ok") is not True:
            raise SubmissionEnded("sent back something that is not an answer: no ok, error or exit")
        return meta, value

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise SubmissionEnded(f"did not finish within {self.timeout:g} s (a hang?); stopped")
        return left

    def _ended(self) -> SubmissionEnded:
        code = self.proc.wait(timeout=self._left())
        if isolation.bwrap() is not None and code > 128:  # bubblewrap reports a signal as 128 + its number
            code = 128 - code
        return SubmissionEnded(_describe_exit(code))

    def _write(self, data: bytes) -> None:
        stdin = self.proc.stdin.fileno()
        view = memoryview(data)
        while view:
            _, ready, _ = select.select([], [stdin], [], min(self._left(), 0.5))
            if self.proc.poll() is not None:
                raise self._ended()
            if ready:
                try:
                    view = view[os.write(stdin, view[: 1 << 16]) :]
                except BlockingIOError:
                    continue
                except BrokenPipeError:
                    raise self._ended() from None

    def _read(self, n: int) -> bytes:
        chunks, got = [], 0
        while got < n:
            ready, _, _ = select.select([self.answers], [], [], min(self._left(), 0.5))
            if not ready:
                if self.proc.poll() is not None:
                    raise self._ended()
                continue
            chunk = os.read(self.answers, min(n - got, 1 << 20))
            if not chunk:
                raise self._ended()
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def close(self) -> str:
        """End the child and everything it started; its output, shown (shown_output)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        if isolation.bwrap() is None:  # without a process namespace: what left the group, found by its folder
            _kill_stragglers(str(self.folder))
        try:
            self.proc.stdin.close()
        except OSError:  # what was left unsent
            pass
        os.close(self.answers)
        self.output.seek(max(0, os.fstat(self.output.fileno()).st_size - 4 * OUTPUT_TAIL))
        shown = shown_output(self.output.read(4 * OUTPUT_TAIL))
        self.output.close()
        shutil.rmtree(self.folder, ignore_errors=True)
        return shown


def _kill_stragglers(folder: str) -> None:
    """Kill every process whose command line names `folder` (the child's copies that left its process group,
    unless they rewrote their command line; bubblewrap's process namespace needs no such search)."""
    for entry in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if folder.encode() in entry.read_bytes():
                os.kill(int(entry.parent.name), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def _checked(value, what: str, depth: int = 0):
    """What the student's function returned, as check.pair may take it: arrays of floating point numbers (or
    Python numbers), in tuples and dicts; anything else raises TypeError naming it."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind != "f":
            raise TypeError(f"{what} is an array of {value.dtype}; expected floating point numbers")
        return value
    if value is None or type(value) in (int, float):
        return value
    if isinstance(value, tuple) and depth == 0:
        return tuple(_checked(v, f"{what}[{i}]", 1) for i, v in enumerate(value))
    if isinstance(value, dict) and depth <= 1:
        return {k: _checked(v, f"{what}[{k!r}]", 2) for k, v in value.items()}
    raise TypeError(f"{what} is a {type(value).__name__}; expected arrays")


def _proxies(child: Child):
    """forward and backward as check.pair calls them, each a request to the child; a cache is the child's number."""

    def forward(**args):
        meta, out = child.request("forward", **args)
        if type(meta.get("cache")) is not int:
            raise SubmissionEnded("sent back something that is not an answer: a forward without its cache")
        if isinstance(out, tuple | dict):
            raise TypeError(f"forward's output is a {type(out).__name__}; expected an array")
        return _checked(out, "forward's output"), runner.Handle(meta["cache"])

    def backward(*args):
        return _checked(child.request("backward", *args)[1], "backward's result")

    return forward, backward


def failed(summary: str, report: str = "") -> dict:
    return {
        "passed": False,
        "summary": summary,
        "diagnoses": [],
        "mistakes": [],
        "worst": {},
        "cases": {},
        "report": report,
    }


def _cases(rows) -> dict:
    """Each case of check.pair's, in its order: {"passed", "failed" (what missed its bar, one line each)}."""
    cases: dict = {}
    for row in rows:
        case = cases.setdefault(row.case or row.name.split(": ", 1)[0], {"passed": True, "failed": []})
        if not row.ok:
            case["passed"] = False
            what = f"{row.tensor or row.name} ({row.dtype}, against {row.against})"
            case["failed"].append(f"{what}: {row.error:.2e}, bar {row.bar:.1e}")
    return cases


def _named(diagnoses) -> list:
    """One sentence per mistake, naming every gradient it makes wrong: "id at dq, dk: message"."""
    where = {}
    for d in diagnoses:
        where.setdefault((d.id, d.message), []).append(d.where)
    return [f"{vid} at {', '.join(w)}: {message}" for (vid, message), w in where.items()]


def grade_file(path, name: str, seed: int = 0, check_source: bool = True, timeout: float = 60.0) -> dict:
    """Grade the exercise file `path` as exercise `name` on the cases of `seed` within `timeout` seconds (see the
    module docstring). Returns {"passed", "summary", "diagnoses" (catalogue ids), "mistakes" ({"id", "at" (the
    gradient), "message"} each), "worst" (tensor -> worst error), "cases" (case -> {"passed", "failed": what
    missed its bar}; empty when nothing ran), "report", "output" (what the code printed,
    shown_output)}. `check_source=False` skips step 1 (the tests use it to reach the run-time refusal)."""
    from parity_tests import check

    path = Path(path)
    if not path.is_file():
        return failed("not handed in") | {"output": ""}
    if path.stat().st_size > MAX_SOURCE:
        return failed(f"is {path.stat().st_size} bytes; an exercise file is at most {MAX_SOURCE}") | {"output": ""}
    if check_source and (problems := source_problems(path.read_text(errors="replace"), name)):
        return failed("refused: " + "; ".join(problems)) | {"output": ""}
    child = Child(path, name, timeout)
    try:
        entry = _judged(child, name, seed, check)
    except SubmissionEnded as exc:
        entry = failed(str(exc))
    finally:
        output = child.close()
    if child.refused:
        tried = ", ".join(dict.fromkeys(child.refused))
        entry = failed(f"refused: tried to import {tried} while running (a submission may not)", entry["report"])
    return entry | {"output": output}


def _judged(child: Child, name: str, seed: int, check) -> dict:
    """The child's pair judged by check.pair here, in the grader: the scorecard entry."""
    try:
        child.request("load")
    except Exception as exc:  # a file that does not even import: it fails, with the reason
        return failed(f"cannot be graded: {type(exc).__name__}: {exc}")
    result = check.pair(*_proxies(child), name, seed=seed)
    worst: dict = {}
    for row in result.rows:
        tensor = row.name.split(": ", 1)[-1]
        worst[tensor] = max(worst.get(tensor, 0.0), row.error)
    if result.passed:
        summary = f"worst error {max(worst.values(), default=0.0):.1e} over {len(result.rows)} comparisons"
    elif result.unexplained and result.unexplained.startswith("not implemented"):
        summary = f"backward {result.unexplained}"
    else:
        raised = [
            f"{r.name.replace(': raised ', ': your code raised ')}: {r.note}"
            for r in result.rows
            if ": raised " in r.name
        ]
        summary = "; ".join([*_named(result.diagnoses), *dict.fromkeys(raised), result.unexplained or ""]).strip("; ")
    return {
        "passed": result.passed,
        "summary": printable(summary),
        "diagnoses": list(dict.fromkeys(d.id for d in result.diagnoses)),
        "mistakes": [{"id": d.id, "at": d.where, "message": d.message} for d in result.diagnoses],
        "worst": worst,
        "cases": _cases(result.rows),
        "report": str(result),
    }
