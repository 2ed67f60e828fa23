"""Save and load torch_transformer models in the project's safetensors checkpoint format.

The same files as numpy_transformer.checkpoint: state-dict names, the config in the metadata. A file is
checked in full before a model is built or a parameter written: a missing file raises FileNotFoundError,
anything else wrong with it ValueError naming the file and the problem. safetensors validates the header
(its length within the file, every tensor's byte range inside the data and consistent with its dtype and
shape), so a hostile header cannot make it allocate more than the file holds; here the tensors' names,
dtypes and shapes are checked against the model (load_into's, or, for load_checkpoint, the one the metadata
describes, built on the meta device: shapes, no memory) before any tensor data is read.
"""

from __future__ import annotations

import os

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from transformer_spec.config import (
    check_checkpoint_fits,
    check_checkpoint_tensors,
    check_layer_count,
    checkpoint_metadata,
    parse_checkpoint_metadata,
)

from .audio import SpeechTransformer
from .model import EncoderModel, Transformer, TransformerLM

CLASSES = {
    "Transformer": Transformer,
    "TransformerLM": TransformerLM,
    "EncoderModel": EncoderModel,
    "SpeechTransformer": SpeechTransformer,
}


def save_checkpoint(path, model: Transformer | TransformerLM | EncoderModel, metadata: dict | None = None) -> None:
    """Write the state dict (moved to the CPU) and the config to `path`."""
    if not isinstance(model, (Transformer, TransformerLM, EncoderModel)):
        raise TypeError(
            f"model must be a torch_transformer Transformer, TransformerLM or EncoderModel, got {type(model).__name__}"
        )
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.fspath(path), metadata=checkpoint_metadata(model.config, type(model).__name__, metadata))


def read_checkpoint(path, device: torch.device | str = "cpu"):
    """(state dict of tensors on `device`, config, model class name, extra metadata). FileNotFoundError for a
    missing file; ValueError for a truncated, corrupted or foreign one, or one whose tensors do not fit the
    model its metadata describes.

    The tensors are the caller's own: safetensors hands out CPU tensors that are views of the file mapped into
    memory, which change if the file is rewritten in place and kill the interpreter with SIGBUS if it is
    truncated; so CPU tensors are copied (load_checkpoint and load_into copy them into the parameters anyway)."""
    state, config, model_class, extra = _read(path, device, _meta_shapes)
    return {k: v.clone() if v.device.type == "cpu" else v for k, v in state.items()}, config, model_class, extra


def load_checkpoint(path, device: torch.device | str = "cpu", dtype: torch.dtype | None = None):
    """Rebuild the saved model on `device` (dtype: default, the dtype the weights were saved in)."""
    path = os.fspath(path)
    state, config, model_class, _ = _read(path, device, _meta_shapes)
    if dtype is None:
        dtypes = sorted({str(v.dtype) for v in state.values()})
        if len(dtypes) != 1:
            raise ValueError(f"{path}: holds tensors of dtypes {dtypes}; pass dtype= to choose the model's")
        dtype = next(iter(state.values())).dtype
    model = CLASSES[model_class](config)  # built only now, when the file is known to fit it
    model.to(device=device, dtype=dtype)
    model.load_state_dict(state)
    return model


def load_into(model: Transformer | TransformerLM | EncoderModel, path) -> dict:
    """Load a checkpoint's weights into an existing model whose config must match. Returns the extra metadata.
    When it raises, the model is as it was: nothing is written before the whole file has been read and checked
    (torch's load_state_dict itself copies tensor by tensor and reports mis-shaped ones only at the end)."""
    path = os.fspath(path)
    device = next(model.parameters()).device

    def expected(config, model_class):
        check_checkpoint_fits(model, config, model_class, path)
        return {name: tuple(t.shape) for name, t in model.state_dict().items()}

    state, _, _, extra = _read(path, device, expected)
    model.load_state_dict(state)
    return extra


# ----------------------------------------------------------------------------------------------
# Reading: the header (safetensors checks it), the metadata, the tensors' names, dtypes and shapes against
# the model the metadata describes, and only then the tensor data.


def _read(path, device, expected):
    """read_checkpoint; `expected(config, model_class)` gives the state dict's shapes (name -> tuple), or raises
    ValueError, before any tensor data is read."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        f = safe_open(path, framework="pt", device=str(device))
    except Exception as error:  # safetensors raises its own error type (SafetensorError) for bad headers and sizes
        raise ValueError(f"{path}: not a readable safetensors file (truncated or corrupted?): {error}") from None
    with f:
        config, model_class, extra = parse_checkpoint_metadata(f.metadata(), path)
        slices = {name: f.get_slice(name) for name in f.keys()}
        header = {name: (s.get_dtype(), tuple(s.get_shape())) for name, s in slices.items()}
        check_layer_count(config, len(header), path)  # before building a model of the layers it claims
        try:
            shapes = expected(config, model_class)
        except ValueError as error:
            raise error if str(error).startswith(f"{path}:") else ValueError(f"{path}: {error}") from None
        check_checkpoint_tensors(header, shapes, model_class, path)
        try:
            state = {name: f.get_tensor(name) for name in header}
        except Exception as error:  # the header was valid; only a file changed under us gets here
            raise ValueError(f"{path}: cannot read its tensors: {error}") from None
    return state, config, model_class, extra


def _meta_shapes(config, model_class: str) -> dict:
    """name -> shape of every tensor in the state dict of a `model_class` of `config`, from a model built on
    the meta device: shapes, no memory, so a config claiming a vocabulary of 10**12 costs nothing. (The first
    normal_ on the meta device imports torch's meta kernels: a second or two, once per process.)"""
    try:
        with torch.device("meta"):
            model = CLASSES[model_class](config)
    except (RuntimeError, ValueError, TypeError, OverflowError) as error:
        raise ValueError(f"cannot build a {model_class} of the config in the metadata ({error})") from None
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}
