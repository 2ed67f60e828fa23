"""Hugging Face checkpoints in plain arrays: load a `transformers` model directory into our models,
write ours back as one, and translate our gradients into the layout of the `transformers` class.

    from numpy_transformer import hf
    model = hf.load("all-MiniLM-L6-v2/", dtype=np.float32)   # config.json + model.safetensors
    hidden = model.forward(ids)                                # BERT -> EncoderModel (B, T, D)
    hf.save(model, "out/")                                     # transformers' from_pretrained reads it
    theirs = hf.to_hf(model, model.grads)                      # our names -> the HF class's names and layouts

Supported model types: "bert" (-> EncoderModel), "gpt2" and "llama" (-> TransformerLM), "marian" and
"bart" (-> Transformer). What each
checkpoint tensor becomes is a table in `hf_families` (shared with torch_transformer.hf); this module
only reads files and moves arrays. It needs json and the safetensors package (its NumPy API), not
torch or transformers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .hf_families import FAMILIES, Family, family_for_model, family_of, match, writing_plan
from .model import EncoderModel, Transformer, TransformerLM

CLASSES = {"EncoderModel": EncoderModel, "TransformerLM": TransformerLM, "Transformer": Transformer}
SUPPORTED = f"supported model types: {', '.join(sorted(FAMILIES))}"


def load(directory, dtype=np.float32, dropout: float | None = None):
    """The model of a Hugging Face checkpoint directory (config.json, and model.safetensors or a sharded
    model.safetensors.index.json), as an EncoderModel, TransformerLM or Transformer in `dtype`.

    dropout: the rate to use where the checkpoint's dropout rates disagree (this project has one).
    Raises ValueError for a missing file, an unsupported model_type, or tensors that do not fit the
    config (every one listed). The model remembers its family (`hf_model_type`) and config.json
    (`hf_config`), so that `save` writes the same kind of checkpoint back.
    """
    directory = Path(directory)
    hf_config = read_config(directory)
    family = family_of(hf_config.get("model_type"))
    config = family.from_hf(hf_config, dropout)
    tensors = read_tensors(directory)
    model = CLASSES[family.model_class](config, dtype=dtype)
    state = {}
    for rule, name in match(family, config, tensors, model.params):
        state[rule.ours] = from_hf_layout(tensors[name], rule, name)
    model.load_state_dict(state)  # one copy into the model's arrays, cast to its dtype; checks every shape
    model.hf_model_type, model.hf_config = family.model_type, hf_config
    return model


def save(model, directory) -> None:
    """Write `model` as a Hugging Face checkpoint: config.json and model.safetensors in the layout of
    the family's transformers class (BertModel, GPT2LMHeadModel, LlamaForCausalLM, MarianMTModel,
    BartForConditionalGeneration), which
    `from_pretrained` loads. ValueError if no supported family can express the model."""
    family = family_for_model(model)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    hf_config = dict(getattr(model, "hf_config", {}))
    hf_config |= family.to_hf(model.config)
    hf_config |= {"model_type": family.model_type, "architectures": [family.architecture], "dtype": model.dtype.name}
    tensors = to_hf(model, model.params, tied=False)
    from safetensors.numpy import save_file

    save_file(tensors, os.fspath(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")


def to_hf(model, tensors: dict, tied: bool = True) -> dict:
    """Our tensors (model.params, model.grads, or any dict keyed like them) under the names and in the
    layouts of the family's transformers class: fused tensors merged (GPT-2's c_attn), Conv1D weights
    transposed. With tied embeddings the class's state_dict also lists the tied copy (lm_head.weight);
    `tied` includes it, the same array. Returns contiguous arrays."""
    family = family_for_model(model)
    out = {}
    for name, rules in writing_plan(family, model.config, model.params).items():
        out[name] = to_hf_layout([tensors[rule.ours] for rule in rules], rules[0])
    if tied:
        for alias, source, field in family.tied:
            if getattr(model.config, field) and source in out and alias not in out:
                out[alias] = out[source]  # the same array: tied in the HF class too
    return out


# ----------------------------------------------------------------------------------------------
# Layouts: a rule's transforms, reading (theirs -> ours) and writing (ours -> theirs).


def from_hf_layout(array: np.ndarray, rule, name: str) -> np.ndarray:
    """Theirs -> ours: drop `offset` rows, squeeze the leading axis (`row`), transpose (`conv1d`), take
    slice `part` of the first axis. Views, no copy."""
    if rule.offset:
        array = array[rule.offset :]
    if rule.row:
        if array.ndim < 2 or array.shape[0] != 1:
            raise ValueError(f"{name}: expected a leading axis of size 1, got shape {array.shape}")
        array = array[0]
    if rule.conv1d:
        array = array.T
    if rule.part:
        k, n = rule.part
        if array.shape[0] % n:
            raise ValueError(f"{name}: a fused tensor of {n} parts, but its shape {array.shape} does not split in {n}")
        size = array.shape[0] // n
        array = array[k * size : (k + 1) * size]
    return array


def to_hf_layout(arrays: list, rule) -> np.ndarray:
    """Ours -> theirs, the inverse of from_hf_layout: join the parts, transpose, add the leading axis,
    put `offset` rows of zeros in front (positions the model never reads)."""
    array = np.concatenate(arrays, axis=0) if rule.part else arrays[0]
    if rule.conv1d:
        array = array.T
    if rule.row:
        array = array[None]
    if rule.offset:
        array = np.concatenate([np.zeros((rule.offset, *array.shape[1:]), dtype=array.dtype), array])
    return np.ascontiguousarray(array)


# ----------------------------------------------------------------------------------------------
# Files.


def read_config(directory: Path) -> dict:
    path = directory / "config.json"
    if not path.is_file():
        raise ValueError(f"{directory}: no config.json (a Hugging Face checkpoint directory has config.json and "
                         f"model.safetensors; {SUPPORTED})")  # fmt: skip
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None


def read_tensors(directory: Path) -> dict:
    """name -> array of every tensor in model.safetensors, or in the shards model.safetensors.index.json lists."""
    single, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = [directory / shard for shard in sorted(set(weight_map.values()))]
    else:
        found = sorted(p.name for p in directory.iterdir())
        raise ValueError(
            f"{directory}: no model.safetensors (or model.safetensors.index.json); found {found}. Only safetensors "
            "checkpoints are read (convert a pytorch_model.bin with transformers' save_pretrained)"
        )
    tensors = {}
    for path in files:
        tensors |= read_safetensors(path)
    return tensors


def read_safetensors(path: Path) -> dict:
    """Every tensor of one safetensors file, through the safetensors package's NumPy API. bfloat16 (which
    NumPy has no dtype for) is widened exactly to float32 from its raw bits."""
    from safetensors import safe_open

    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    tensors = {}
    try:
        with safe_open(os.fspath(path), framework="numpy") as f:
            for name in f.keys():
                if f.get_slice(name).get_dtype() == "BF16":
                    tensors[name] = read_bfloat16(path, name)
                else:
                    tensors[name] = f.get_tensor(name)
    except (OSError, ValueError, TypeError, RuntimeError) as error:
        raise ValueError(f"{path}: not a readable safetensors file ({error})") from None
    return tensors


def read_bfloat16(path: Path, name: str) -> np.ndarray:
    """A bfloat16 tensor as float32. bfloat16 is the top half of a float32: shift its 16 bits up.
    (The file: an 8-byte little-endian header size, a JSON header of dtype, shape and byte offsets, the data.)"""
    with open(path, "rb") as f:
        header_size = int.from_bytes(f.read(8), "little")
        entry = json.loads(f.read(header_size))[name]
    start, end = entry["data_offsets"]
    bits = np.fromfile(path, dtype="<u2", count=(end - start) // 2, offset=8 + header_size + start)
    return (bits.astype(np.uint32) << 16).view(np.float32).reshape(entry["shape"])


__all__ = ["load", "save", "to_hf", "Family"]
