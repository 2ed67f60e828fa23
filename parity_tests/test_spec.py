"""transformer_spec: the shared config, families and checkpoint files, imported by both sides, importing neither.

Each check runs in a fresh interpreter, so what another test imported cannot hide an import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def imported_after(statement: str) -> set[str]:
    """The top-level packages in sys.modules after running `statement` in a fresh interpreter (this checkout first
    on the path)."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, cwd=ROOT)
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_torch_side_imports_no_numpy_math():
    """import torch_transformer (and its hf module) imports transformer_spec, never numpy_transformer nor SciPy."""
    found = imported_after("import torch_transformer, torch_transformer.hf, torch_transformer.checkpoint")
    assert "torch_transformer" in found and "transformer_spec" in found
    assert "numpy_transformer" not in found
    assert "scipy" not in found


def test_spec_imports_neither_side():
    """transformer_spec and its checkpoint files import neither implementation, nor torch or SciPy."""
    found = imported_after("import transformer_spec, transformer_spec.checkpoints, transformer_spec.families")
    assert "transformer_spec" in found
    assert not found & {"numpy_transformer", "torch_transformer", "torch", "scipy"}


def test_old_config_path_is_the_shared_module():
    """numpy_transformer.config and `from numpy_transformer import TransformerConfig` are transformer_spec's."""
    import numpy_transformer.config
    from numpy_transformer.config import GenerationRules

    import numpy_transformer
    import torch_transformer
    import transformer_spec.config

    assert numpy_transformer.config is transformer_spec.config
    assert numpy_transformer.TransformerConfig is transformer_spec.config.TransformerConfig
    assert torch_transformer.TransformerConfig is transformer_spec.config.TransformerConfig
    assert GenerationRules is transformer_spec.config.GenerationRules
