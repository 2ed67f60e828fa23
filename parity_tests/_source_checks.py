"""What the tests read in the source of a module: the private names it reaches for."""

from __future__ import annotations

import ast
from pathlib import Path


def private_attributes(path: str | Path, owner: str) -> list[str]:
    """Every `x._name` the module at `path` reads ("line N: code"), leaving out dunders and attributes of the name
    `owner` (the module's own `self`, or a library whose underscored API is documented)."""
    tree = ast.parse(Path(path).read_text())
    return [
        f"line {node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id == owner)
    ]
