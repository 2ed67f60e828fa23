"""Hugging Face checkpoints for torch_transformer: the same three functions as numpy_transformer.hf.

    from torch_transformer import hf
    model = hf.load("gpt2-dir/", dtype=torch.float32, device="cuda")
    hf.save(model, "out/")
    theirs = hf.to_hf(model, {name: p.grad for name, p in model.named_parameters()})

The tables that say which checkpoint tensor becomes which parameter are transformer_spec.families
(data, shared by both sides); the files are read and checked by transformer_spec.checkpoints.read_checkpoint and
written by its write_checkpoint (reading and checking a file is not math: both sides share it, so both refuse the
same folders before building anything). Nothing here imports numpy_transformer.
"""

from __future__ import annotations

import numpy as np
import torch
from safetensors.torch import save_file
from torch import Tensor

from transformer_spec import checkpoints
from transformer_spec.families import family_for_model, tied_copies, to_hf_tensors, write_layout

from .audio import SpeechTransformer
from .model import EncoderModel, Transformer, TransformerLM

CLASSES = {
    "EncoderModel": EncoderModel,
    "TransformerLM": TransformerLM,
    "Transformer": Transformer,
    "SpeechTransformer": SpeechTransformer,
}


def load(
    directory,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    dropout=None,
    max_bytes: int = checkpoints.MAX_BYTES,
):
    """The model of a Hugging Face checkpoint directory, in `dtype` on `device`, in evaluation mode; see
    numpy_transformer.hf.load. The directory is read and checked by the same code as the NumPy side's
    (transformer_spec.checkpoints.read_checkpoint: files, config values, memory, ties, every tensor's name, dtype
    and shape)
    before the model is built; `max_bytes` bounds its parameters in `dtype`."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    found = checkpoints.read_checkpoint(directory, shapes, dropout, max_bytes, bytes_per_parameter=itemsize)
    model = CLASSES[found.family.model_class](found.config).to(device=device, dtype=dtype)
    state = {name: torch.from_numpy(np.array(array)) for name, array in found.state.items()}  # writable copies
    model.load_state_dict(state)  # copies (and casts) into the parameters; checks every shape
    model.hf_model_type, model.hf_config = found.family.model_type, found.hf_config
    model.generation_rules = found.generation_rules  # what generation_config.json asks of decoding
    return model.eval()  # as from_pretrained returns it: no dropout until model.train()


def shapes(config, model_class: str) -> dict:
    """The state-dict names and shapes of our `model_class` ("Transformer", "TransformerLM", "EncoderModel",
    "SpeechTransformer") built from `config` (transformer_spec.checkpoints.Shapes), from the config alone: the
    class's own `shapes`, buffers included (Whisper's fixed position table is read too); the torch models hold the
    same parameters as the NumPy ones (the parity suite checks it)."""
    return CLASSES[model_class].shapes(config, buffers=True)


def save(model, directory, overwrite: bool = False) -> None:
    """Write `model` as config.json, model.safetensors and generation_config.json that transformers'
    from_pretrained loads; see numpy_transformer.hf.save (the same files, the same refusal of a directory holding
    another checkpoint unless overwrite=True, no temporary file left by a failed save)."""
    family = family_for_model(model)
    dtype = next(model.parameters()).dtype
    hf_config = dict(model.hf_config)
    hf_config |= family.config_json(model.config, model.hf_config)  # RoPE spelled as the file it was read from
    hf_config |= {"model_type": family.model_type, "architectures": [family.architecture], "dtype": str(dtype)[6:]}
    tensors = to_hf(model, model.state_dict(), tied=False)
    tensors |= tied_copies(family, model.config, tensors, hf_config)
    tensors = {k: v.detach().cpu().clone().contiguous() for k, v in tensors.items()}  # copies: no shared storage
    write = lambda path, ts: save_file(ts, path, metadata={"format": "pt"})  # noqa: E731
    checkpoints.write_checkpoint(directory, hf_config, checkpoints.generation_config(model), tensors, write, overwrite)


def to_hf(model, tensors: dict, tied: bool = True) -> dict:
    """Our tensors (state_dict, parameter gradients, ...) under the transformers class's names and layouts."""
    n_heads = model.config.n_heads
    write = lambda ts, rule: _to_hf_layout(ts, rule, n_heads)  # noqa: E731
    return to_hf_tensors(family_for_model(model), model.config, tensors, tensors, write, tied)


def _to_hf_layout(ts: list[Tensor], rule, n_heads: int) -> Tensor:
    """Ours -> theirs (transformer_spec.families.write_layout), contiguous."""
    zeros = lambda shape, like: like.new_zeros(shape)  # noqa: E731
    return write_layout(ts, rule, n_heads, lambda parts, axis: torch.cat(parts, dim=axis), zeros).contiguous()
