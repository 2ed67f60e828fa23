"""One submitted exercise graded honestly: read before it runs, and run with the reference out of its reach.

`grade_file(path, name, seed)` is what `grade` runs in a child Python (parity_tests.sandbox) for each exercise
file, so that `sys.exit`, a crash or a hang in a student's code ends that child, not the grader. In the child:

1. The source is read first (`source_problems`): a submission may import numpy, math and scipy (the encoder
   layer's exercise also the reference pairs it chains, by name), and may not name the escape hatches of Python
   (`__import__`, `exec`, `eval`, `open`, `globals`, `__globals__`, ...). Importing numpy_transformer,
   parity_tests or torch would let it recompute the answer with the reference or with autograd.
2. While the student's code runs (its import, then every call of its forward and backward) the reference's
   modules and torch are hidden from `sys.modules`, an import hook refuses them, and the module's builtins lack
   exec, eval, open, compile, input, exit and quit. An import refused at run time fails the exercise even when
   the code catches the ImportError and carries on.
3. The pair is judged by parity_tests.check.pair on cases drawn from `seed`: the default seed is public (the
   notebook shows its cases), a teacher's seed draws cases no student has seen.

This keeps a student from borrowing the answer; it is not a security boundary against hostile code (a process
can still write files): grade code you do not trust inside a container or a throwaway account.
"""

from __future__ import annotations

import ast
import builtins
import importlib.abc
import importlib.util
import sys
from contextlib import contextmanager
from pathlib import Path

__all__ = ["BARS", "REFERENCE_MODULES", "ALLOWED_IMPORTS", "source_problems", "grade_file"]

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
REMOVED_BUILTINS = ("exec", "eval", "compile", "open", "breakpoint", "input", "exit", "quit")


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


class _Refuser(importlib.abc.MetaPathFinder):
    """An import hook that refuses the reference and torch, and remembers each refusal. (Other modules are refused
    by reading the source only: numpy and scipy import what they need, ctypes and shutil among them, lazily.)"""

    def __init__(self):
        self.refused = []

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in REFERENCE_MODULES:
            self.refused.append(fullname)
            raise ImportError(f"{fullname} may not be imported by a submission")
        return None


class Guard:
    """Hides the reference from the student's code while it runs (see the module docstring)."""

    def __init__(self, name: str):
        self.refuser = _Refuser()
        self.facades = {}
        for module, members in CHAINED.get(name, {}).items():  # only the named pairs, not the whole reference
            real = importlib.import_module(module)
            facade = type(sys)(module, f"the reference's {', '.join(members)}")
            facade.__path__ = []  # a package still: its other submodules reach the import hook, which refuses them
            for member in members:
                setattr(facade, member, getattr(real, member))
            self.facades[module] = facade

    @contextmanager
    def active(self):
        hidden = {k: sys.modules.pop(k) for k in list(sys.modules) if k.split(".")[0] in REFERENCE_MODULES}
        sys.modules.update(self.facades)
        sys.meta_path.insert(0, self.refuser)
        try:
            yield
        finally:
            sys.meta_path.remove(self.refuser)
            for k in [k for k in sys.modules if k.split(".")[0] in REFERENCE_MODULES]:
                del sys.modules[k]  # whatever the student's code left there, facades included
            sys.modules.update(hidden)

    def wrap(self, function):
        def guarded(*args, **kwargs):
            with self.active():
                return function(*args, **kwargs)

        return guarded


def _load(path: Path, guard: Guard):
    spec = importlib.util.spec_from_file_location(f"submission_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    module.__dict__["__builtins__"] = {k: v for k, v in vars(builtins).items() if k not in REMOVED_BUILTINS}
    with guard.active():
        spec.loader.exec_module(module)
    return module


def failed(summary: str, report: str = "") -> dict:
    return {"passed": False, "summary": summary, "diagnoses": [], "mistakes": [], "worst": {}, "report": report}


def _named(diagnoses) -> list:
    """One sentence per mistake, naming every gradient it makes wrong: "id at dq, dk: message"."""
    where = {}
    for d in diagnoses:
        where.setdefault((d.id, d.message), []).append(d.where)
    return [f"{vid} at {', '.join(w)}: {message}" for (vid, message), w in where.items()]


def grade_file(path: str, name: str, seed: int = 0, check_source: bool = True) -> dict:
    """Grade the exercise file `path` as exercise `name` on the cases of `seed` (see the module docstring).
    Returns {"passed", "summary", "diagnoses" (catalogue ids), "mistakes" ({"id", "at" (the gradient), "message"}
    each), "worst" (tensor -> worst error), "report"}.
    `check_source=False` skips step 1 (the tests use it to reach the run-time guard)."""
    from parity_tests import check

    path = Path(path)
    if check_source:
        problems = source_problems(path.read_text(), name)
        if problems:
            return failed("refused: " + "; ".join(problems))
    guard = Guard(name)
    try:
        module = _load(path, guard)
        forward, backward = module.forward, module.backward
    except Exception as exc:  # a file that does not even import: it fails, with the reason
        return failed(f"cannot be graded: {type(exc).__name__}: {exc}")
    result = check.pair(guard.wrap(forward), guard.wrap(backward), name, seed=seed)
    if guard.refuser.refused:
        tried = ", ".join(dict.fromkeys(guard.refuser.refused))
        return failed(f"refused: tried to import {tried} while running (a submission may not)", str(result))
    worst = {}
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
        "summary": summary,
        "diagnoses": list(dict.fromkeys(d.id for d in result.diagnoses)),
        "mistakes": [{"id": d.id, "at": d.where, "message": d.message} for d in result.diagnoses],
        "worst": worst,
        "report": str(result),
    }
