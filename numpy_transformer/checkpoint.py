"""Save and load models as safetensors files, the config travelling in the file's metadata.

One file loads into either implementation (torch_transformer.checkpoint reads the same format):

    save_checkpoint("model.safetensors", model, metadata={"step": 1000})
    model = load_checkpoint("model.safetensors")             # a Transformer, TransformerLM or EncoderModel
    load_into(other_model, "model.safetensors")              # checks the config matches first

Needs the `safetensors` package (the `examples` extra); the rest of numpy_transformer does not.

A file is checked in full before a single parameter is touched: a missing file raises FileNotFoundError,
anything else wrong with it raises ValueError naming the file and the problem. Hostile files are safe to
read: safetensors validates the header before any tensor is read (the header length within the file and
under 100 MB, every tensor's byte range inside the data and consistent with its dtype and shape, no overlaps,
no gaps, no bytes left over), so a header cannot make it allocate more than the file holds. Here the metadata,
the names, dtypes and shapes of the tensors are checked against the model the metadata describes before any
tensor data is read, and a model is built (load_checkpoint) or written (load_into) only after that.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
from numpy.typing import DTypeLike

from transformer_spec.checkpoints import read_tensor
from transformer_spec.config import (
    TransformerConfig,
    check_checkpoint_fits,
    check_checkpoint_tensors,
    check_layer_count,
    checkpoint_metadata,
    parse_checkpoint_metadata,
)

from .audio import SpeechTransformer
from .model import EncoderModel, Transformer, TransformerLM

Model = Transformer | TransformerLM | EncoderModel
CLASSES: dict[str, type[Model]] = {
    "Transformer": Transformer,
    "TransformerLM": TransformerLM,
    "EncoderModel": EncoderModel,
    "SpeechTransformer": SpeechTransformer,
}
# Parameters are floating point. NumPy holds F16, F32 and F64; a BF16 tensor (a torch bfloat16 model's)
# is widened exactly to float32.


def _safetensors() -> ModuleType:
    try:
        import safetensors.numpy
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("checkpoints need the safetensors package: pip install safetensors") from None
    return safetensors


def save_checkpoint(path: str | os.PathLike, model: Model, metadata: dict | None = None) -> None:
    """Write every parameter (state-dict names, the model's dtype) and the config to `path`."""
    if not isinstance(model, (Transformer, TransformerLM, EncoderModel)):
        raise TypeError(
            f"model must be a numpy_transformer Transformer, TransformerLM or EncoderModel, got {type(model).__name__}"
        )
    tensors = model.params | getattr(model, "buffers", {})  # Whisper's fixed position table too
    state = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    _safetensors().numpy.save_file(
        state, os.fspath(path), metadata=checkpoint_metadata(model.config, type(model).__name__, metadata)
    )


def read_checkpoint(path: str | os.PathLike) -> tuple[dict, TransformerConfig, str, dict]:
    """(state dict of arrays, config, model class name, extra metadata). A missing file raises
    FileNotFoundError; a truncated, corrupted or foreign file, or one whose tensors do not fit the model
    its metadata describes, raises ValueError saying which."""
    return _read(path)


def load_checkpoint(path: str | os.PathLike, dtype: DTypeLike | None = None) -> Model:
    """Rebuild the saved model: its class and config from the metadata, then its weights.
    dtype: np.float32 or np.float64; default, the dtype the weights were saved in."""
    path = os.fspath(path)
    state, config, model_class, _ = _read(path)
    if dtype is None:
        dtypes = sorted({v.dtype.name for v in state.values()})
        if len(dtypes) != 1 or dtypes[0] not in ("float32", "float64"):
            raise ValueError(
                f"{path}: holds tensors of dtypes {dtypes}; pass dtype=np.float32 or np.float64 to choose the model's"
            )
        dtype = next(iter(state.values())).dtype
    model = CLASSES[model_class](config, dtype=dtype)  # built only now, when the file is known to fit it
    model.load_state_dict(state)
    return model


def load_into(model: Model, path: str | os.PathLike) -> dict:
    """Load a checkpoint's weights into an existing model whose config must match the file's.
    Returns the extra metadata. When it raises, the model is as it was: nothing is written before
    the whole file has been read and checked."""
    path = os.fspath(path)
    state, _, _, extra = _read(
        path, fits=lambda config, model_class: check_checkpoint_fits(model, config, model_class, path)
    )
    model.load_state_dict(state)  # checks every key and shape again, then writes; all-or-nothing
    return extra


# ----------------------------------------------------------------------------------------------
# Reading, in the order that keeps a hostile file harmless: the header (safetensors checks it), the
# metadata, the tensors' names, dtypes and shapes against the model the metadata describes, and only then
# the tensor data.


def _read(
    path: str | os.PathLike, fits: Callable[[TransformerConfig, str], object] | None = None
) -> tuple[dict, TransformerConfig, str, dict]:
    """read_checkpoint; `fits(config, model_class)` may raise ValueError before any tensor data is read."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        f = _safetensors().safe_open(path, framework="numpy")
    except Exception as error:  # safetensors raises its own error type (SafetensorError) for bad headers and sizes
        raise ValueError(f"{path}: not a readable safetensors file (truncated or corrupted?): {error}") from None
    with f:
        config, model_class, extra = parse_checkpoint_metadata(f.metadata(), path)
        if fits is not None:
            fits(config, model_class)
        slices = {name: f.get_slice(name) for name in f.keys()}
        header = {name: (s.get_dtype(), tuple(s.get_shape())) for name, s in slices.items()}
        check_layer_count(config, len(header), path)  # before listing the parameter names the config implies
        expected = CLASSES[model_class].shapes(config, buffers=True)  # Whisper's fixed position table too
        check_checkpoint_tensors(header, expected, model_class, path)
        state = {name: read_tensor(f, Path(path), name, dtype) for name, (dtype, _) in header.items()}
    return state, config, model_class, extra
