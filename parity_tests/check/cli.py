"""`transformer-parity check`'s side in the child process: load the user's target and judge it there.

The parent (parity_tests/__main__.py) runs `judge` through parity_tests.sandbox, so nothing the user's code does at
import, in its factory or in its forward (sys.exit, os._exit, a crash, a hang, pages of output) reaches the command
or passes for a verdict. `judge` returns a plain dict: either the verdict ({"status": "judged", ...}) or why the
user's code could not be judged ({"status": "unrunnable", "reason": ...}), each reason saying what went wrong.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

from torch import nn

from .judge import module as check_module
from .levels import LEVELS


class Unrunnable(Exception):
    """The user's code could not be loaded or run (not a failed comparison): the command exits 2."""


class BadArgument(ValueError):
    """A command-line argument that names nothing usable: the command exits 2."""


def import_user_module(name: str):
    """A module of the user's: a dotted name, imported from where the user stands (as `python -m` does), or a path
    to a .py file, executed into a module registered under its stem (as an import would: @dataclass and pickle look
    the module up there) with its folder on the path."""
    if not (name.endswith(".py") or "/" in name):
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        return _importing(name, importlib.import_module, name)
    path = Path(name)
    if not path.is_file():
        raise BadArgument(f"no such file: {name}")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise BadArgument(f"cannot load {name} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        _importing(name, spec.loader.exec_module, module)
    finally:
        sys.path.pop(0)
    return module


def _importing(name: str, load, *args):
    """load(*args), importing the user's `name`: what it raises as BadArgument (no such module) or Unrunnable."""
    try:
        return load(*args)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            raise BadArgument(f"no module named {name!r} (from {os.getcwd()})") from None
        raise Unrunnable(f"importing {name} raised ModuleNotFoundError: {exc}") from None
    except SyntaxError as exc:
        where = f"{exc.filename}, line {exc.lineno}"
        raise Unrunnable(f"{name} does not compile: SyntaxError: {exc.msg} ({where})") from None
    except SystemExit as exc:
        raise Unrunnable(f"importing {name} called sys.exit({exc.code!r}) instead of defining the module") from None
    except Exception as exc:
        raise Unrunnable(f"importing {name} raised {type(exc).__name__}: {exc}") from None


def load_attribute(spec: str, what: str, function: bool = False):
    """MODULE:ATTR -> the attribute (a function where `function` says so); `what` names the argument in messages."""
    if not isinstance(spec, str) or ":" not in spec:
        example = "as mypkg.models:MyModel or path/to/file.py:model"
        raise BadArgument(f"{what}: expected MODULE:ATTR ({example}), got {spec!r}")
    name, attr = spec.rsplit(":", 1)
    module = import_user_module(name)
    if not hasattr(module, attr):
        raise BadArgument(f"{what}: {name} has no attribute {attr!r}")
    found = getattr(module, attr)
    if function and not callable(found):
        raise BadArgument(f"{what}: {spec} is of type {type(found).__name__}, not a function")
    return found


def load_target(spec: str, reference: str | None = None):
    """MODULE:ATTR -> the object to judge: a torch module instance, or what a zero-argument factory (a class, a
    function) returns; for scaled_dot_product_attention a plain function is judged as it is."""
    target = load_attribute(spec, "target")
    takes_function = reference in LEVELS and LEVELS[reference].takes_function
    if isinstance(target, nn.Module) or (takes_function and callable(target) and not isinstance(target, type)):
        return target
    if not callable(target):
        kind = type(target).__name__
        raise Unrunnable(f"{spec} is of type {kind}, neither a torch.nn.Module nor a zero-argument factory of one")
    made = run_user(target, f"the factory {spec}()", "returning a module")
    if not isinstance(made, nn.Module):
        kind = type(made).__name__
        raise Unrunnable(f"the factory {spec}() returned an object of type {kind}, not a torch.nn.Module")
    return made


def run_user(function, what: str, instead: str):
    """function() of the user's; what it raises, or a sys.exit, as Unrunnable saying `what` did it."""
    try:
        return function()
    except SystemExit as exc:
        raise Unrunnable(f"{what} called sys.exit({exc.code!r}) instead of {instead}") from None
    except Exception as exc:
        raise Unrunnable(f"{what} raised {type(exc).__name__}: {exc}") from None


def judge(
    target: str, reference: str, fields: dict, mapping: dict | None, call: str | None, options: dict | None = None
) -> dict:
    """Load and judge, in this (child) process; see the module docstring for what comes back. `options`: check.module's
    batch_first, mask, dtypes, seed and example (FUNC, called here, -> (args, kwargs)), where the command gave them."""
    try:
        module = load_target(target, reference)
        function = load_attribute(call, "--call", True) if call is not None else None  # check.module's call=
        options = dict(options or {})
        if options.get("example") is not None:
            example = options["example"]
            what = f"--example: {example}()"
            options["example"] = run_user(load_attribute(example, "--example", True), what, "returning (args, kwargs)")
    except BadArgument as exc:
        return {"status": "bad_argument", "reason": str(exc)}
    except Unrunnable as exc:
        return {"status": "unrunnable", "reason": str(exc)}
    try:
        result = check_module(module, reference, mapping=mapping, call=function, **options, **fields)
    except (TypeError, ValueError) as exc:
        return {"status": "unrunnable", "reason": f"the judge could not run {target}: {exc}"}
    status = "unrunnable" if result.error else "judged"
    return {"status": status, "reason": result.error, "passed": result.passed, "report": str(result),
            "result": result.to_dict()}  # fmt: skip
