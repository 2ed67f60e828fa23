"""Run code the project did not write in a child process, with a time limit.

The judge (`transformer-parity check`) and the grader (`transformer-parity grade`) run a user's module or a
student's backward pass. That code may call `sys.exit`, `os._exit`, crash the interpreter, loop forever or print
pages of output; none of that may reach the parent or pass for a verdict. `call(target, *args, timeout=...)`
runs one of *our* functions (named "package.module:function", which then loads the user's code) in a fresh
Python, and returns an `Outcome`:

    outcome = sandbox.call("parity_tests.check.cli:judge", spec, "transformer", timeout=120)
    outcome.ok        # True when the function returned; outcome.value is what it returned (pickled back)
    outcome.status    # "ok", "raised", "exited", "timeout" or "crashed"
    outcome.reason    # one sentence saying what went wrong, None when ok
    outcome.output    # the tail of what the child printed (stdout and stderr together)

The request travels on the child's standard input and the answer in a file of its own, tagged with a random
token the child reads before any user code runs: what the user's code prints cannot be taken for an answer.
The child starts its own process group, so a time limit ends whatever the user's code started too.
"""

from __future__ import annotations

import importlib
import os
import pickle
import secrets
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Outcome", "call", "DEFAULT_TIMEOUT"]

DEFAULT_TIMEOUT = 120.0  # seconds: a tiny model's float64 and float32 checks take a few; a hang is caught
OUTPUT_TAIL = 2000  # characters of the child's output kept for the report


@dataclass(frozen=True)
class Outcome:
    status: str  # "ok" | "raised" | "exited" | "timeout" | "crashed"
    value: Any = None
    reason: str | None = None
    output: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _check_timeout(timeout) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout: expected a number of seconds, got {type(timeout).__name__} {timeout!r}")
    if not timeout > 0 or timeout == float("inf"):
        raise ValueError(f"timeout: expected a positive, finite number of seconds, got {timeout!r}")
    return float(timeout)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"crashed ({name}) before returning a result"
    return f"exited with status {code} before returning a result (sys.exit, os._exit or exit() in the code run)"


def call(target: str, *args, timeout: float = DEFAULT_TIMEOUT, **kwargs) -> Outcome:
    """Run `target(*args, **kwargs)` in a child Python and return its Outcome. `target` is "module:function"
    (importable in the child, as it is here); arguments and the return value must pickle."""
    if not isinstance(target, str) or ":" not in target:
        raise ValueError(f"target: expected 'module:function', got {target!r}")
    timeout = _check_timeout(timeout)
    token = secrets.token_hex(16)
    request = pickle.dumps((token, target, args, kwargs))
    answer_file = tempfile.TemporaryFile()  # a file, not a pipe: a long answer never blocks the child
    env = dict(os.environ)
    # The child imports what this process imports: the checkout this package came from first, then the
    # directory the user stands in (as `python -m` would), then the rest of our path.
    here = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([here, os.getcwd(), *[p for p in sys.path if p]]))
    env["PARITY_SANDBOX_FD"] = str(answer_file.fileno())
    output_file = tempfile.TemporaryFile()  # a file, not a pipe: a process left holding it cannot keep us waiting
    proc = subprocess.Popen(
        [sys.executable, "-m", "parity_tests.sandbox"],
        stdin=subprocess.PIPE,
        stdout=output_file,
        stderr=subprocess.STDOUT,
        pass_fds=(answer_file.fileno(),),
        env=env,
        start_new_session=True,
    )
    try:
        try:
            proc.communicate(request, timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
    finally:
        _kill_group(proc)
    with answer_file:
        answer_file.seek(0)
        answer = answer_file.read()
    with output_file:
        output_file.seek(max(0, os.fstat(output_file.fileno()).st_size - 4 * OUTPUT_TAIL))
        output = output_file.read()
    text = output.decode(errors="replace")[-OUTPUT_TAIL:]
    if timed_out:
        return Outcome("timeout", reason=f"did not finish within {timeout:g} s (a hang?); stopped", output=text)
    if answer.startswith(token.encode()):
        status, value, reason = pickle.loads(answer[len(token) :])
        return Outcome(status, value, reason, text)
    return Outcome("crashed" if proc.returncode < 0 else "exited", reason=describe_exit(proc.returncode), output=text)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _child() -> None:
    """The child's side: read the request, run it, write one tagged answer to the answer file."""
    fd = int(os.environ.pop("PARITY_SANDBOX_FD"))
    token, target, args, kwargs = pickle.loads(sys.stdin.buffer.read())
    sys.stdin.close()
    module_name, function_name = target.split(":", 1)
    try:
        function = getattr(importlib.import_module(module_name), function_name)
        answer = ("ok", function(*args, **kwargs), None)
    except SystemExit as exc:
        answer = ("exited", None, f"called sys.exit({exc.code!r}) instead of returning")
    except KeyboardInterrupt:
        answer = ("raised", None, "raised KeyboardInterrupt")
    except Exception as exc:
        answer = ("raised", None, f"raised {type(exc).__name__}: {exc}")
    try:
        payload = pickle.dumps(answer)
    except Exception as exc:  # a value that does not pickle is our bug, but say so rather than hang
        payload = pickle.dumps(("raised", None, f"returned a value that cannot be sent back: {exc}"))
    with os.fdopen(fd, "wb") as answer_file:
        answer_file.write(token.encode() + payload)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no atexit hook of the user's code runs after the answer is sent


if __name__ == "__main__":
    _child()
