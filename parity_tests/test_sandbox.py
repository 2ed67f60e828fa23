"""parity_tests.sandbox: code we did not write runs in a child with a time limit, and nothing it does (exit,
crash, hang, print) passes for an answer."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from parity_tests import sandbox

HERE = "parity_tests.test_sandbox"


def give(value):
    return value


def exit_with(code):
    sys.exit(code)


def hard_exit(code):
    os._exit(code)


def fail():
    raise ValueError("the user's message")


def hang():
    while True:
        time.sleep(0.05)


def segfault():
    os.kill(os.getpid(), signal.SIGSEGV)


def forge(token_guess="0" * 32):
    print(token_guess + "an answer printed by the user's code")
    os._exit(0)


def chatty_then_return():
    print("x" * 100_000)
    return "done"


def test_a_returned_value_comes_back():
    outcome = sandbox.call(f"{HERE}:give", {"a": [1, 2.5]}, timeout=60)
    assert outcome.ok and outcome.status == "ok" and outcome.value == {"a": [1, 2.5]} and outcome.reason is None


def test_a_large_answer_and_long_output_do_not_block():
    big = "y" * 3_000_000
    outcome = sandbox.call(f"{HERE}:give", big, timeout=60)
    assert outcome.ok and outcome.value == big
    outcome = sandbox.call(f"{HERE}:chatty_then_return", timeout=60)
    assert outcome.ok and outcome.value == "done" and len(outcome.output) == sandbox.OUTPUT_TAIL


@pytest.mark.parametrize("code", [0, 1, "bye"])
def test_sys_exit_is_not_an_answer(code):
    outcome = sandbox.call(f"{HERE}:exit_with", code, timeout=60)
    assert not outcome.ok and outcome.status == "exited"
    assert f"sys.exit({code!r})" in outcome.reason


@pytest.mark.parametrize("code", [0, 3])
def test_os_exit_is_not_an_answer(code):
    outcome = sandbox.call(f"{HERE}:hard_exit", code, timeout=60)
    assert not outcome.ok and outcome.status == "exited" and f"status {code}" in outcome.reason


def test_an_exception_is_reported_with_its_message():
    outcome = sandbox.call(f"{HERE}:fail", timeout=60)
    assert outcome.status == "raised" and outcome.reason == "raised ValueError: the user's message"


def test_a_hang_is_stopped_at_the_time_limit():
    start = time.perf_counter()
    outcome = sandbox.call(f"{HERE}:hang", timeout=3)
    assert outcome.status == "timeout" and "3 s" in outcome.reason
    assert time.perf_counter() - start < 30


def test_a_crash_is_named():
    outcome = sandbox.call(f"{HERE}:segfault", timeout=60)
    assert outcome.status == "crashed" and "SIGSEGV" in outcome.reason


def test_printed_text_is_not_taken_for_an_answer():
    outcome = sandbox.call(f"{HERE}:forge", timeout=60)
    assert not outcome.ok and outcome.status == "exited"
    assert "an answer printed" in outcome.output


@pytest.mark.parametrize(
    ("timeout", "error"), [(0, ValueError), (-1, ValueError), (float("nan"), ValueError), ("5", TypeError)]
)
def test_bad_time_limits_are_refused(timeout, error):
    with pytest.raises(error, match="timeout"):
        sandbox.call(f"{HERE}:give", 1, timeout=timeout)


def test_bad_target_is_refused():
    with pytest.raises(ValueError, match="target"):
        sandbox.call("no_colon_here", timeout=5)


def daemon_then_return(pid_file):
    if os.fork() == 0:  # a daemon in a session of its own, holding the output for 20 s
        os.setsid()
        Path(pid_file).write_text(str(os.getpid()))
        time.sleep(20)
        os._exit(0)
    return "done"


def test_a_daemon_holding_the_output_does_not_keep_the_caller_waiting(tmp_path):
    start = time.monotonic()
    outcome = sandbox.call(f"{HERE}:daemon_then_return", str(tmp_path / "pid"), timeout=60)
    seconds = time.monotonic() - start
    for _ in range(50):
        if (tmp_path / "pid").exists() and (tmp_path / "pid").read_text():
            break
        time.sleep(0.1)
    os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)
    assert outcome.ok and outcome.value == "done" and seconds < 15, (outcome, seconds)
