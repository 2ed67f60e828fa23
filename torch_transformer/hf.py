"""Hugging Face checkpoints for torch_transformer: the same three functions as numpy_transformer.hf.

    from torch_transformer import hf
    model = hf.load("gpt2-dir/", dtype=torch.float32, device="cuda")
    hf.save(model, "out/")
    theirs = hf.to_hf(model, {name: p.grad for name, p in model.named_parameters()})

The tables that say which checkpoint tensor becomes which parameter are numpy_transformer.hf_families
(data, shared by both sides); the files are read with safetensors' torch API (bfloat16 included).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from numpy_transformer.hf_families import (
    FAMILIES,
    family_for_model,
    family_of,
    match,
    parse_json_config,
    read_generation_rules,
    read_layout,
    to_hf_tensors,
    write_layout,
)

from .model import EncoderModel, Transformer, TransformerLM

CLASSES = {"EncoderModel": EncoderModel, "TransformerLM": TransformerLM, "Transformer": Transformer}


def load(directory, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", dropout=None):
    """The model of a Hugging Face checkpoint directory, in `dtype` on `device`, in evaluation mode; see
    numpy_transformer.hf.load."""
    directory = Path(directory)
    hf_config = _read_config(directory)
    family = family_of(hf_config.get("model_type"))
    config = family.from_hf(hf_config, dropout)
    config, generation_rules = read_generation_rules(directory, hf_config, config)
    tensors = _read_tensors(directory, device)
    model = CLASSES[family.model_class](config).to(device=device, dtype=dtype)
    names = dict(model.state_dict())
    state = {
        rule.ours: _from_hf_layout(tensors[name], rule, name, config.n_heads)
        for rule, name in match(family, config, tensors, names)
    }
    model.load_state_dict(state)  # copies (and casts) into the parameters; checks every shape
    model.hf_model_type, model.hf_config = family.model_type, hf_config
    model.generation_rules = generation_rules  # what generation_config.json asks of decoding
    return model.eval()  # as from_pretrained returns it: no dropout until model.train()


def save(model, directory) -> None:
    """Write `model` as config.json + model.safetensors that transformers' from_pretrained loads."""
    family = family_for_model(model)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    dtype = next(model.parameters()).dtype
    hf_config = dict(getattr(model, "hf_config", {}))
    hf_config |= family.config_json(model.config)
    hf_config |= {"model_type": family.model_type, "architectures": [family.architecture], "dtype": str(dtype)[6:]}
    tensors = {k: v.detach().cpu().contiguous() for k, v in to_hf(model, model.state_dict(), tied=False).items()}
    save_file(tensors, os.fspath(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")


def to_hf(model, tensors: dict, tied: bool = True) -> dict:
    """Our tensors (state_dict, parameter gradients, ...) under the transformers class's names and layouts."""
    n_heads = model.config.n_heads
    write = lambda ts, rule: _to_hf_layout(ts, rule, n_heads)  # noqa: E731
    return to_hf_tensors(family_for_model(model), model.config, tensors, tensors, write, tied)


def _from_hf_layout(t: Tensor, rule, name: str, n_heads: int) -> Tensor:
    """Theirs -> ours (hf_families.read_layout, the interpreter both sides share)."""
    return read_layout(t, rule, name, n_heads)


def _to_hf_layout(ts: list[Tensor], rule, n_heads: int) -> Tensor:
    """Ours -> theirs (hf_families.write_layout), contiguous."""
    zeros = lambda shape, like: like.new_zeros(shape)  # noqa: E731
    return write_layout(ts, rule, n_heads, lambda parts, axis: torch.cat(parts, dim=axis), zeros).contiguous()


def _read_config(directory: Path) -> dict:
    path = directory / "config.json"
    if not path.is_file():
        raise ValueError(
            f"{directory}: no config.json (a Hugging Face checkpoint directory has config.json and model.safetensors; "
            f"supported model types: {', '.join(sorted(FAMILIES))})"
        )
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise ValueError(f"{path}: cannot read it ({error})") from None
    return parse_json_config(raw, path)


def _read_tensors(directory: Path, device) -> dict:
    single, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        files = [directory / s for s in sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))]
    else:
        found = sorted(p.name for p in directory.iterdir())
        raise ValueError(
            f"{directory}: no model.safetensors (or model.safetensors.index.json); found {found}. Only safetensors "
            "checkpoints are read (convert a pytorch_model.bin with transformers' save_pretrained)"
        )
    tensors = {}
    for path in files:
        try:
            tensors |= load_file(os.fspath(path), device=str(device))
        except (OSError, ValueError, RuntimeError) as error:
            raise ValueError(f"{path}: not a readable safetensors file ({error})") from None
    return tensors
