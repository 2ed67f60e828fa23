"""Hugging Face checkpoints in plain arrays: load a `transformers` model directory into our models,
write ours back as one, and translate our gradients into the layout of the `transformers` class.

    from numpy_transformer import hf
    model = hf.load("all-MiniLM-L6-v2/", dtype=np.float32)   # config.json + model.safetensors
    hidden = model.forward(ids)                                # BERT -> EncoderModel (B, T, D)
    hf.save(model, "out/")                                     # transformers' from_pretrained reads it
    theirs = hf.to_hf(model, model.grads)                      # our names -> the HF class's names and layouts

Supported model types: "bert", "roberta", "xlm-roberta", "distilbert", "mpnet" (-> EncoderModel), "gpt2" and
"llama" (-> TransformerLM), "marian" and "bart" (-> Transformer). What each
checkpoint tensor becomes is a table in `transformer_spec.families`, and the files are read, checked and written by
`transformer_spec.checkpoints` (both shared with torch_transformer.hf); this module builds the NumPy model and moves
arrays. It needs the safetensors package (its NumPy API), not torch or transformers.
"""

from __future__ import annotations

import numpy as np

from transformer_spec import checkpoints
from transformer_spec.checkpoints import MAX_BYTES, Checkpoint, generation_config, read_bfloat16
from transformer_spec.families import Family, family_for_model, tied_copies, to_hf_tensors, write_layout

from .audio import SpeechTransformer
from .model import EncoderModel, Transformer, TransformerLM

ModelClass = type[EncoderModel] | type[TransformerLM] | type[Transformer]
CLASSES: dict[str, ModelClass] = {
    "EncoderModel": EncoderModel,
    "TransformerLM": TransformerLM,
    "Transformer": Transformer,
    "SpeechTransformer": SpeechTransformer,
}


def load(directory, dtype=np.float32, dropout: float | None = None, max_bytes: int = MAX_BYTES):
    """The model of a Hugging Face checkpoint directory (config.json, and model.safetensors or a sharded
    model.safetensors.index.json), as an EncoderModel, TransformerLM or Transformer in `dtype`.

    dropout: None (the default) reads each dropout site's rate from config.json, as the family names them
    (GPT-2's embd_pdrop, attn_pdrop and resid_pdrop, say: the families' *_DROPOUT tables); a float sets that one
    rate for every site instead.
    max_bytes: the most memory the model may claim (parameters and gradients, in `dtype`); a config.json asking
    for more is refused before anything is allocated.
    Raises ValueError, naming the file (and the field), for a missing or unreadable file, an unsupported
    model_type, a config it cannot translate (sizes that are not positive integers, floats that are not finite),
    tensors that do not fit the config (every one listed), or a tied copy that the model cannot hold apart from
    its source. Everything is checked before the model is built (read_checkpoint, which torch_transformer.hf
    shares), so a bad checkpoint costs no more memory than its files and returns no half-loaded model. The model
    is returned in evaluation mode, as transformers' from_pretrained returns its own (call model.train() to
    fine-tune with the checkpoint's dropout). The model remembers its family (`hf_model_type`) and config.json
    (`hf_config`), so that `save` writes the same kind of checkpoint back.
    """
    itemsize = np.dtype(dtype).itemsize
    found = read_checkpoint(directory, dropout, max_bytes, bytes_per_parameter=2 * itemsize)  # params and grads
    model = CLASSES[found.family.model_class](found.config, dtype=dtype)  # built only now: every tensor fits
    model.load_state_dict(found.state)  # one copy into the model's arrays, cast to its dtype
    model.hf_model_type, model.hf_config = found.family.model_type, found.hf_config
    model.generation_rules = found.generation_rules  # what generation_config.json asks of decoding
    return model.eval()  # as from_pretrained returns it: no dropout until model.train()


def shapes(config, model_class: str) -> dict:
    """The state-dict names and shapes of our NumPy `model_class` ("Transformer", "TransformerLM", "EncoderModel",
    "SpeechTransformer") built from `config` (transformer_spec.checkpoints.Shapes), nothing allocated: the class's
    own `shapes`, buffers included (Whisper's fixed position table is read too)."""
    return CLASSES[model_class].shapes(config, buffers=True)


def read_checkpoint(directory, dropout=None, max_bytes: int = MAX_BYTES, bytes_per_parameter: int = 8) -> Checkpoint:
    """transformer_spec.checkpoints.read_checkpoint with the NumPy models' parameter shapes: the directory read and
    checked, every tensor in our names and layouts, no model built."""
    return checkpoints.read_checkpoint(directory, shapes, dropout, max_bytes, bytes_per_parameter)


def parameter_count(config, model_class) -> int:
    """The number of parameters of the NumPy `model_class` (the class or its name) built from `config`, without
    building it (transformer_spec.checkpoints.parameter_count)."""
    name = model_class if isinstance(model_class, str) else model_class.__name__
    return checkpoints.parameter_count(config, shapes, name)


def save(model, directory, overwrite: bool = False) -> None:
    """Write `model` as a Hugging Face checkpoint: config.json, model.safetensors and (a model that generates)
    generation_config.json, in the layout of the family's transformers class (BertModel, GPT2LMHeadModel,
    LlamaForCausalLM, MarianMTModel, BartForConditionalGeneration, ...), which `from_pretrained` loads with every
    tensor it expects (ties the model does not keep written as copies of their own).

    A directory that holds another checkpoint is refused unless overwrite=True; then the checkpoint files this
    save does not write (other shards, an index, a generation_config.json of another model) are removed. Each file
    is written to a temporary file beside it and renamed into place: a failed save leaves no temporary file, and
    the previous files until the new ones are complete. ValueError if no supported family can express the model."""
    family = family_for_model(model)
    hf_config = dict(model.hf_config)
    hf_config |= family.config_json(model.config, model.hf_config)  # RoPE spelled as the file it was read from
    hf_config |= {"model_type": family.model_type, "architectures": [family.architecture], "dtype": model.dtype.name}
    tensors = to_hf(model, model.params | getattr(model, "buffers", {}), tied=False)  # Whisper's fixed table too
    tensors |= tied_copies(family, model.config, tensors, hf_config)
    from safetensors.numpy import save_file  # looked up at each save (a test replaces it to fail a write)

    write = lambda path, arrays: save_file(arrays, path, metadata={"format": "pt"})  # noqa: E731
    checkpoints.write_checkpoint(directory, hf_config, generation_config(model), tensors, write, overwrite)


def to_hf(model, tensors: dict, tied: bool = True) -> dict:
    """Our tensors (model.params, model.grads, or any dict keyed like them) under the names and in the
    layouts of the family's transformers class: fused tensors merged (GPT-2's c_attn), Conv1D weights
    transposed. With tied embeddings the class's state_dict also lists the tied copy (lm_head.weight);
    `tied` includes it, the same array. Returns contiguous arrays."""
    n_heads = model.config.n_heads
    write = lambda arrays, rule: to_hf_layout(arrays, rule, n_heads)  # noqa: E731
    names = model.params | {k: v for k, v in getattr(model, "buffers", {}).items() if k in tensors}  # Whisper's table
    return to_hf_tensors(family_for_model(model), model.config, tensors, names, write, tied)


def to_hf_layout(arrays: list, rule, n_heads: int) -> np.ndarray:
    """Ours -> theirs (transformer_spec.families.write_layout), contiguous."""
    zeros = lambda shape, like: np.zeros(shape, dtype=like.dtype)  # noqa: E731
    return np.ascontiguousarray(write_layout(arrays, rule, n_heads, lambda a, axis: np.concatenate(a, axis), zeros))


__all__ = ["load", "save", "to_hf", "Family", "read_checkpoint", "parameter_count", "read_bfloat16"]
