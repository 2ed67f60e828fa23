"""A diagnosis: a known mistake (mistakes.py) that reproduces what the user's code computes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Diagnosis:
    """A known mistake that reproduces the user's output: its catalogue id, a readable message, the user's
    submodule where it sits, and the relative error between the user's output and the variant (float64)."""

    id: str
    message: str
    where: str
    error: float

    def __str__(self) -> str:
        return f"{self.id} at {self.where or '(the module)'}: {self.message} (variant error {self.error:.1e})"
