"""Shared fixtures: the devices every parity test runs on; the checkout's examples/ on the import path;
and, when the CI environment variable is set, no skips except for a missing GPU."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Hypothesis profiles: "dev" (the local default, quick) and "ci" (more examples; chosen when the CI
# environment variable is set, or by HYPOTHESIS_PROFILE=ci). Tests that do not fix max_examples themselves
# take the profile's. Both are derandomized: a run is reproducible, and CI explores more of the same stream.
settings.register_profile("dev", max_examples=60, deadline=None, derandomize=True)
settings.register_profile(
    "ci", max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

# examples/ is a folder of scripts in the checkout, not an installed package: the tests import its
# modules (`from examples import tasks`) from the checkout itself.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Nothing may come from a hub at run time: a forgotten download fails at once instead of hanging.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

HAS_TORCH = importlib.util.find_spec("torch") is not None


def _cuda_available() -> bool:
    if not HAS_TORCH:
        return False
    import torch

    return torch.cuda.is_available()


# CPU always; CUDA when present (skipped, with the reason, otherwise).
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(not _cuda_available(), reason="CUDA is not available")),
]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


# ----------------------------------------------------------------------------------------------
# In CI a skip may only mean "this machine has no GPU". Any other skip (a missing dependency the project
# declares, a forgotten importorskip) would hide a broken install behind a green run: it fails instead.


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    return longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


def _fail_dishonest_skip(report) -> None:
    if not os.environ.get("CI") or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    if "CUDA" not in reason:
        report.outcome = "failed"
        report.longrepr = f"skipped in CI for a reason other than a missing GPU: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_dishonest_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_dishonest_skip(outcome.get_result())
