"""Save and load models as safetensors files, the config travelling in the file's metadata.

One file loads into either implementation (torch_transformer.checkpoint reads the same format):

    save_checkpoint("model.safetensors", model, metadata={"step": 1000})
    model = load_checkpoint("model.safetensors")             # a Transformer, TransformerLM or EncoderModel
    load_into(other_model, "model.safetensors")              # checks the config matches first

Needs the `safetensors` package (the `examples` extra); the rest of numpy_transformer does not.
"""

from __future__ import annotations

import os

import numpy as np

from .config import check_checkpoint_fits, checkpoint_metadata, parse_checkpoint_metadata
from .model import EncoderModel, Transformer, TransformerLM


def _safetensors():
    try:
        import safetensors.numpy
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("checkpoints need the safetensors package: pip install safetensors") from None
    return safetensors


def save_checkpoint(path, model, metadata: dict | None = None) -> None:
    """Write every parameter (state-dict names, the model's dtype) and the config to `path`."""
    if not isinstance(model, (Transformer, TransformerLM, EncoderModel)):
        raise TypeError(
            f"model must be a numpy_transformer Transformer, TransformerLM or EncoderModel, got {type(model).__name__}"
        )
    state = {k: np.ascontiguousarray(v) for k, v in model.params.items()}
    _safetensors().numpy.save_file(
        state, os.fspath(path), metadata=checkpoint_metadata(model.config, type(model).__name__, metadata)
    )


def read_checkpoint(path) -> tuple[dict, object, str, dict]:
    """(state dict of arrays, config, model class name, extra metadata). A missing file raises
    FileNotFoundError; a truncated, corrupted or foreign file raises ValueError saying which."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    safetensors = _safetensors()
    try:
        with safetensors.safe_open(path, framework="numpy") as f:
            metadata = f.metadata()
            state = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as error:  # safetensors raises its own error types for bad headers and short files
        raise ValueError(f"{path}: not a readable safetensors file (truncated or corrupted?): {error}") from None
    config, model_class, extra = parse_checkpoint_metadata(metadata, path)
    return state, config, model_class, extra


def load_checkpoint(path, dtype=None):
    """Rebuild the saved model: its class and config from the metadata, then its weights.
    dtype: np.float32 or np.float64; default, the dtype the weights were saved in."""
    state, config, model_class, _ = read_checkpoint(path)
    if dtype is None:
        dtype = next(iter(state.values())).dtype
    classes = {"Transformer": Transformer, "TransformerLM": TransformerLM, "EncoderModel": EncoderModel}
    model = classes[model_class](config, dtype=dtype)
    model.load_state_dict(state)
    return model


def load_into(model, path) -> dict:
    """Load a checkpoint's weights into an existing model whose config must match the file's.
    Returns the extra metadata."""
    state, config, model_class, extra = read_checkpoint(path)
    check_checkpoint_fits(model, config, model_class, path)
    model.load_state_dict(state)
    return extra
