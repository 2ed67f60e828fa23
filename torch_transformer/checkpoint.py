"""Save and load torch_transformer models in the project's safetensors checkpoint format.

The same files as numpy_transformer.checkpoint: state-dict names, the config in the metadata.
"""

from __future__ import annotations

import os

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from numpy_transformer.config import check_checkpoint_fits, checkpoint_metadata, parse_checkpoint_metadata

from .model import EncoderModel, Transformer, TransformerLM


def save_checkpoint(path, model: Transformer | TransformerLM | EncoderModel, metadata: dict | None = None) -> None:
    """Write the state dict (moved to the CPU) and the config to `path`."""
    if not isinstance(model, (Transformer, TransformerLM, EncoderModel)):
        raise TypeError(
            f"model must be a torch_transformer Transformer, TransformerLM or EncoderModel, got {type(model).__name__}"
        )
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.fspath(path), metadata=checkpoint_metadata(model.config, type(model).__name__, metadata))


def read_checkpoint(path, device: torch.device | str = "cpu"):
    """(state dict of tensors on `device`, config, model class name, extra metadata)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        with safe_open(path, framework="pt", device=str(device)) as f:
            metadata = f.metadata()
            state = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as error:  # safetensors raises its own error types for bad headers and short files
        raise ValueError(f"{path}: not a readable safetensors file (truncated or corrupted?): {error}") from None
    config, model_class, extra = parse_checkpoint_metadata(metadata, path)
    return state, config, model_class, extra


def load_checkpoint(path, device: torch.device | str = "cpu", dtype: torch.dtype | None = None):
    """Rebuild the saved model on `device` (dtype: default, the dtype the weights were saved in)."""
    state, config, model_class, _ = read_checkpoint(path, device)
    classes = {"Transformer": Transformer, "TransformerLM": TransformerLM, "EncoderModel": EncoderModel}
    model = classes[model_class](config)
    dtype = dtype or next(iter(state.values())).dtype
    model.to(device=device, dtype=dtype)
    model.load_state_dict(state)
    return model


def load_into(model: Transformer | TransformerLM | EncoderModel, path) -> dict:
    """Load a checkpoint's weights into an existing model whose config must match. Returns the extra metadata."""
    device = next(model.parameters()).device
    state, config, model_class, extra = read_checkpoint(path, device)
    check_checkpoint_fits(model, config, model_class, path)
    model.load_state_dict(state)
    return extra
