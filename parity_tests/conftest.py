"""Shared fixtures: the devices every parity test runs on."""

from __future__ import annotations

import importlib.util
import os

# Nothing may come from a hub at run time: a forgotten download fails at once instead of hanging.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest

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
