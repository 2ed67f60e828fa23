"""Hugging Face checkpoint files, shared by both sides: read and check a checkpoint directory (config.json,
generation_config.json, model.safetensors or its shards) and write one, before and after any model exists.
Reading and checking a file is not math: numpy_transformer.hf and torch_transformer.hf both call read_checkpoint
before building anything (so both refuse the same folders) and write_checkpoint to save. Each side passes the
parameter shapes of its model classes (`shapes(config, model_class) -> {name: shape}`); nothing here imports
either side's math. It needs json and the safetensors package (its NumPy API), not torch or transformers.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .config import GenerationRules, TransformerConfig, check_layer_count
from .families import (
    FAMILIES,
    Family,
    Rule,
    check_config_values,
    family_of,
    is_int,
    match,
    parse_json_config,
    read_generation_rules,
    read_layout,
    relative,
    resolve_ties,
)
from .generation import APPLIED
from .hub import checkpoint_folder

SUPPORTED = f"supported model types: {', '.join(sorted(FAMILIES))}"

# shapes(config, model_class) -> {state-dict name: shape}: the parameters of model_class ("Transformer",
# "TransformerLM", "EncoderModel") built from config, as the side that will build it lays them out
Shapes = Callable[[TransformerConfig, str], dict]

# The default ceiling on the memory a loaded model may claim (its parameters, and the NumPy side's gradients):
# a config.json that asks for more is refused before anything is allocated. Raise it with load(..., max_bytes=).
MAX_BYTES = 64 * 2**30

# transformers' base classes: a stack without the head (lm_head, final_logits_bias, the decoder) the families read
BASE_CLASSES = ("LlamaModel", "MistralModel", "Qwen2Model", "GPT2Model", "BloomModel", "BartModel", "MarianModel",
                "T5Model")  # fmt: skip


class Checkpoint(NamedTuple):
    """A checkpoint directory, read and checked: everything a model is built from, nothing built yet."""

    family: Family
    config: TransformerConfig
    hf_config: dict  # config.json as read
    generation_rules: GenerationRules
    state: dict  # our state-dict name -> array (views of the file's tensors where the layout allows)


def check_dropout_argument(dropout) -> None:
    """load's dropout=: None or a rate in [0, 1). TypeError/ValueError naming the argument."""
    if dropout is None:
        return
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float, np.floating, np.integer)):
        raise TypeError(f"dropout must be None or a float in [0, 1), got {dropout!r} ({type(dropout).__name__})")
    if not 0 <= float(dropout) < 1:  # NaN fails this too
        raise ValueError(f"dropout must be None or a float in [0, 1), got {dropout!r}")


def read_checkpoint(
    directory, shapes: Shapes, dropout=None, max_bytes: int = MAX_BYTES, bytes_per_parameter: int = 8
) -> Checkpoint:
    """Read and check a checkpoint directory, in this order, each failure a ValueError naming the file: the
    arguments; config.json (JSON, then every number it holds: families.check_config_values) and its translation;
    generation_config.json; the memory the model would claim (parameters times `bytes_per_parameter`) against
    `max_bytes`; the tensors' files (shards inside the directory, each tensor in one shard); the layer count
    against the tensors; the ties the file keeps (families.resolve_ties); then every tensor's name, dtype, shape.
    `shapes`: the parameters of the side's model classes (Shapes). Both sides' hf.load call it before building
    anything (checking a file is not math)."""
    check_dropout_argument(dropout)
    if not is_int(max_bytes) or max_bytes <= 0:
        raise ValueError(f"max_bytes must be a positive int (bytes), got {max_bytes!r}")
    directory = checkpoint_folder(directory)  # a folder, or a Hub id's snapshot (fetched with huggingface_hub)
    config_path = directory / "config.json"
    hf_config, family, config = read_family_config(directory, dropout)
    config, generation_rules = read_generation_rules(directory, hf_config, config, family)
    model_class = family.model_class
    check_memory(config, shapes, model_class, bytes_per_parameter, max_bytes, config_path)  # before reading any tensor
    tensors = read_tensors(directory)
    check_layer_count(config, len(tensors), config_path)  # before expanding the names of the layers it claims
    config, tensors = read_family_layout(directory, family, config, tensors)
    tensors = with_base_model_head(directory, family, config, hf_config, tensors)
    expected = shapes(config, model_class)
    try:
        plan = match(family, config, tensors, expected)
    except ValueError as error:
        raise ValueError(f"{directory}: {base_model_note(hf_config)}{error}") from None
    state = state_from_plan(directory, family, config, tensors, plan, expected)
    return Checkpoint(family, config, hf_config, generation_rules, state)


def read_family_config(directory: Path, dropout: float | None) -> tuple[dict, Family, TransformerConfig]:
    """config.json as read (every number checked: families.check_config_values), the family it names, and its
    translation to our config; a config.json that does not translate is a ValueError naming the file."""
    hf_config = read_config(directory)
    config_path = directory / "config.json"
    check_config_values(hf_config, config_path)
    try:
        family = family_of(hf_config.get("model_type"), hf_config.get("architectures"), hf_config)
        return hf_config, family, family.from_hf(hf_config, dropout)
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError, ZeroDivisionError) as error:
        # a hostile config.json reaches the translation with any types: a missing field, a string for a size
        problem = f"missing field {error}" if isinstance(error, KeyError) else f"{error}"
        raise ValueError(f"{config_path}: cannot translate it ({problem})") from None


def read_family_layout(
    directory: Path, family: Family, config: TransformerConfig, tensors: dict
) -> tuple[TransformerConfig, dict]:
    """The tensors under the family's current names (an older layout converted), the tied names filled from
    the tensors they share (families.resolve_ties), and the config with the ties and the parts the file holds
    but config.json does not mention (BERT's pooler)."""
    if family.legacy is not None:  # an older layout of the family's files (Mixtral's experts one by one)
        try:
            tensors = family.legacy(tensors)
        except ValueError as error:
            raise ValueError(f"{directory}: {error}") from None
    try:
        config, fills = resolve_ties(family, config, tensors, lambda a, b: same_values(tensors[a], tensors[b]))
    except ValueError as error:
        raise ValueError(f"{directory}: {error}") from None
    tensors = tensors | {alias: tensors[source] for alias, source in fills.items()}
    for name, pattern in family.detected:  # parts the config does not mention, present in the file (BERT's pooler)
        if any(re.fullmatch(pattern, relative(family, tensor)) for tensor in tensors):
            present: dict[str, Any] = {name: True}
            config = replace(config, **present)
    return config, tensors


def state_from_plan(
    directory: Path,
    family: Family,
    config: TransformerConfig,
    tensors: dict,
    plan: list[tuple[Rule, str]],
    expected: dict,
) -> dict:
    """Our state dict from the matched (rule, file tensor name) pairs, each tensor in our layout; ValueError
    listing every tensor that is not floating point, is a scalar, or has the wrong shape."""
    state, problems = {}, []
    for rule, name in plan:
        try:
            array = tensor_in_our_layout(tensors[name], rule, name, config)
        except ValueError as error:
            problems.append(f"{tensor_file(directory, name)}: {error}")
            continue
        if array.shape != expected[rule.ours]:
            problems.append(
                f"{tensor_file(directory, name)}: mis-shaped {name} (for {rule.ours}): got {array.shape}, "
                f"expected {expected[rule.ours]}"
            )
        state[rule.ours] = array
    if problems:
        raise ValueError(
            f"{directory}: the checkpoint does not fit its config.json ({family.model_type}): " + "; ".join(problems)
        )
    return state


def tensor_in_our_layout(tensor: np.ndarray, rule: Rule, name: str, config: TransformerConfig) -> np.ndarray:
    """A file's tensor `name` in our layout (from_hf_layout); ValueError (the message without the file) when it is
    not floating point or is a scalar."""
    if not np.issubdtype(tensor.dtype, np.floating):
        raise ValueError(f"{name}: dtype {tensor.dtype}, not floating point")
    if tensor.ndim == 0:  # every parameter has an axis; the layouts index the first
        raise ValueError(f"{name}: a scalar, expected a tensor for {rule.ours}")
    return from_hf_layout(tensor, rule, name, config.n_heads, config.kv_heads)


def parameter_count(config: TransformerConfig, shapes: Shapes, model_class: str) -> int:
    """The number of parameters of `model_class` built from `config`, without listing them: the count is linear in
    each stack's layer count (c + a n_enc + b n_dec), so three small configs give it for any number of layers. A
    mixture of experts' dense layers (config.dense_layers) each differ from a sparse one by a constant: a fourth."""

    def count(n_encoder: int, n_decoder: int, dense: tuple = ()) -> int:
        # layer_types=None, rope_layers=None: the layer kinds have no parameters, and one list cannot fit every count
        small = replace(
            config,
            n_encoder_layers=n_encoder,
            n_decoder_layers=n_decoder,
            layer_types=None,
            rope_layers=None,
            dense_layers=dense,
        )
        return sum(math.prod(shape) for shape in shapes(small, model_class).values())

    one = count(1, 1)
    per_encoder_layer, per_decoder_layer = count(2, 1) - one, count(1, 2) - one
    total = one + per_encoder_layer * (config.n_encoder_layers - 1) + per_decoder_layer * (config.n_decoder_layers - 1)
    return total + len(config.dense_layers) * (count(1, 1, (0,)) - one)


def check_memory(config, shapes: Shapes, model_class: str, bytes_per_parameter: int, max_bytes: int, path) -> None:
    """ValueError when the model `config` describes would claim more than max_bytes (its parameters at
    `bytes_per_parameter`), checked from the config alone, before any tensor is read."""
    claimed = parameter_count(config, shapes, model_class) * bytes_per_parameter
    if claimed > max_bytes:
        raise ValueError(
            f"{path}: the model it describes would claim {claimed / 2**30:.3g} GiB, more than max_bytes={max_bytes} "
            f"({max_bytes / 2**30:.3g} GiB); pass a larger max_bytes to load it"
        )


def same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether a tied copy holds exactly its source's values (NaN where NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(np.array_equal(a, b, equal_nan=np.issubdtype(a.dtype, np.floating)))


# Head tensors a base checkpoint lacks that transformers' head class creates the same way every time, when it loads
# those weights (BartForConditionalGeneration.from_pretrained of bart-base's BartModel): name -> how (zeros). A tied
# lm_head needs nothing (it is the token table); an untied one would be random: still refused (base_model_note).
BASE_MODEL_FILLS = {"final_logits_bias": "zeros"}


def with_base_model_head(directory: Path, family: Family, config: TransformerConfig, hf_config: dict, tensors: dict):
    """The tensors of a base-model checkpoint (architectures: BartModel, MarianModel) with the head tensors
    transformers' head class creates on loading it (BASE_MODEL_FILLS: final_logits_bias, zeros), each said in a
    warning naming it; any other checkpoint's tensors as they are."""
    architectures = hf_config.get("architectures")
    if not (isinstance(architectures, list) and any(a in BASE_CLASSES for a in architectures)):
        return tensors
    added = {}
    for rule in family.rules:
        if rule.head and rule.theirs in BASE_MODEL_FILLS and rule.theirs not in tensors:
            shape = (1, config.tgt_vocab_size) if rule.row else (config.tgt_vocab_size,)
            added[rule.theirs] = np.zeros(shape, dtype=np.float32)
    if added:
        warnings.warn(
            f"{directory}: a {architectures[0]} checkpoint (no head) loaded as {family.architecture}, as transformers "
            f"loads it: {sorted(added)} created as zeros",
            stacklevel=4,
        )
    return tensors | added


def base_model_note(hf_config: dict) -> str:
    """For a checkpoint of a transformers base class (architectures: LlamaModel, BartModel...) that lacks what the
    family's head class reads (an untied lm_head, BART's final_logits_bias): a note
    that says so, put before the list of missing tensors. (A base checkpoint that holds everything, such as a tied
    GPT2Model, loads as the head class, as that class's from_pretrained loads it; T5EncoderModel loads as an
    EncoderModel.)"""
    architectures = hf_config.get("architectures")
    names = [a for a in architectures if a in BASE_CLASSES] if isinstance(architectures, list) else []
    if not names:
        return ""
    return (f"this is a base model without a head ({names[0]}), which this loader does not read: it loads the "
            "classes with their head (ForCausalLM, LMHeadModel, ForConditionalGeneration); ")  # fmt: skip


# The files of a transformers checkpoint: what makes a directory "hold a checkpoint", and what overwrite removes.
CHECKPOINT_FILES = (
    "config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
    "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack",
)  # fmt: skip
CHECKPOINT_PATTERNS = ("model-*.safetensors", "pytorch_model-*.bin")
TEMPORARY_PREFIX = ".hf-save-"  # a temporary file of a save: left behind only by a killed process


def checkpoint_files(directory: Path) -> list[Path]:
    """The checkpoint files (CHECKPOINT_FILES, shards, temporary files of a killed save) in `directory`."""
    found = [directory / name for name in CHECKPOINT_FILES if (directory / name).is_file()]
    found += [path for pattern in CHECKPOINT_PATTERNS for path in directory.glob(pattern) if path.is_file()]
    found += [path for path in directory.glob(TEMPORARY_PREFIX + "*") if path.is_file()]
    return sorted(set(found))


def write_checkpoint(directory, hf_config: dict, generation: dict | None, tensors: dict, write, overwrite: bool):
    """Both sides' hf.save: config.json, generation_config.json (when `generation` is a dict) and model.safetensors
    (write(path, tensors): the side's safetensors writer) into `directory`; see numpy_transformer.hf.save."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"{directory}: not a directory")
    directory.mkdir(parents=True, exist_ok=True)
    existing = checkpoint_files(directory)
    if existing and not overwrite:
        raise ValueError(
            f"{directory}: holds another checkpoint ({', '.join(p.name for p in existing)}); pass overwrite=True to "
            "replace it (its files this save does not write are removed)"
        )
    texts = {"config.json": json.dumps(hf_config, indent=2, sort_keys=True) + "\n"}
    if generation is not None:
        texts["generation_config.json"] = json.dumps(generation, indent=2, sort_keys=True) + "\n"
    written = {}  # final name -> temporary path, renamed into place only when every file is complete
    try:
        for name, writer in [("model.safetensors", lambda path: write(path, tensors))] + [
            (name, lambda path, text=text: Path(path).write_text(text)) for name, text in texts.items()
        ]:
            handle, temporary = tempfile.mkstemp(dir=directory, prefix=TEMPORARY_PREFIX + name + ".")
            os.close(handle)
            written[name] = temporary
            writer(temporary)
        for name, temporary in written.items():
            os.replace(temporary, directory / name)
    finally:
        for temporary in written.values():
            Path(temporary).unlink(missing_ok=True)  # renamed already, or left by a failure: never kept
    for path in existing:
        if path.name not in written:
            path.unlink(missing_ok=True)


def generation_config(model) -> dict | None:
    """generation_config.json for a model that generates (a Transformer or TransformerLM; None for an encoder):
    its special ids and the generation rules it decodes with (model.generation_rules: forced tokens, bad words,
    the fill of finished beams, the decoding settings that differ from transformers' defaults), so that a
    checkpoint loaded, saved and loaded again decodes the same."""
    config = model.config
    if getattr(model, "encoder_only", False) or config.n_decoder_layers == 0:
        return None
    rules = model.generation_rules or GenerationRules()
    seq2seq = not getattr(model, "decoder_only", False)
    out = {"pad_token_id": config.pad_id, "eos_token_id": config.eos_id}
    if seq2seq:  # config.bos_id is the decoder's start token; config.json keeps the vocabulary's bos
        out |= {
            "decoder_start_token_id": config.bos_id,
            "bos_token_id": model.hf_config.get("bos_token_id"),
        }
    else:
        out["bos_token_id"] = config.bos_id
    if rules.beam_fill_id is not None and rules.beam_fill_id != (config.pad_id or config.eos_id):
        out["pad_token_id"] = rules.beam_fill_id  # generate() fills finished beams with `pad_token_id or eos`
    if rules.forced_bos_id is not None:
        out["forced_bos_token_id"] = rules.forced_bos_id
    if rules.forced_eos_id is not None:
        out["forced_eos_token_id"] = rules.forced_eos_id
    if rules.bad_words:
        out["bad_words_ids"] = [list(words) for words in rules.bad_words]
    out |= prompt_settings(rules)
    defaults = GenerationRules()
    for name in APPLIED:  # the decoding settings, where they differ from transformers' defaults
        if getattr(rules, name) != getattr(defaults, name):
            out[name] = getattr(rules, name)
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in out.items() if v is not None}


def prompt_settings(rules: GenerationRules) -> dict:
    """Whisper's decoder prompt in generation_config.json: the keys it was read from (the tables language= and task=
    need), else as the forced_decoder_ids generate() reads it from; {} without one."""
    if rules.prompt_settings:
        return dict(rules.prompt_settings)
    return (
        {"forced_decoder_ids": [[i + 1, t] for i, t in enumerate(rules.decoder_prompt)]} if rules.decoder_prompt else {}
    )


def from_hf_layout(array: np.ndarray, rule, name: str, n_heads: int, n_kv_heads: int | None = None) -> np.ndarray:
    """Theirs -> ours (families.read_layout). Views where the layout allows, no copy."""
    return read_layout(array, rule, name, n_heads, n_kv_heads)


# ----------------------------------------------------------------------------------------------
# Files.


def read_config(directory: Path) -> dict:
    """config.json as a dict; ValueError naming the file when it is missing, unreadable or not a JSON object."""
    path = directory / "config.json"
    if not path.is_file():
        raise ValueError(f"{directory}: no config.json (a Hugging Face checkpoint directory has config.json and "
                         f"model.safetensors; {SUPPORTED})")  # fmt: skip
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise ValueError(f"{path}: cannot read it ({error})") from None
    return parse_json_config(raw, path)


def tensor_file(directory: Path, name: str) -> str:
    """The file of `directory` that holds tensor `name` (for an error message): model.safetensors, or the shard
    the index names."""
    if (directory / "model.safetensors").is_file():
        return "model.safetensors"
    return read_weight_map(directory / "model.safetensors.index.json").get(name, "model.safetensors.index.json")


def read_tensors(directory: Path) -> dict:
    """name -> array of every tensor in model.safetensors, or in the shards model.safetensors.index.json lists."""
    single, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
    if single.is_file():
        return read_safetensors(single)
    if not index.is_file():
        found = sorted(p.name for p in directory.iterdir())
        raise ValueError(
            f"{directory}: no model.safetensors (or model.safetensors.index.json); found {found}. Only safetensors "
            "checkpoints are read (convert a pytorch_model.bin with transformers' save_pretrained)"
        )
    weight_map = read_weight_map(index)
    tensors: dict[str, np.ndarray] = {}
    for shard in sorted(set(weight_map.values())):
        path = directory / shard
        in_shard = read_safetensors(path)
        twice = sorted(in_shard.keys() & tensors.keys())
        if twice:
            raise ValueError(f"{path}: holds tensors another shard holds too: {twice}")
        absent = sorted(name for name, where in weight_map.items() if where == shard and name not in in_shard)
        if absent:
            raise ValueError(f"{path}: lacks tensors {index.name} puts there: {absent}")
        tensors |= in_shard
    return tensors


def read_weight_map(index: Path) -> dict:
    """The index's weight_map (tensor name -> shard file name). A shard must be a plain file name in the
    checkpoint's directory: an index cannot send the reader anywhere else ("../../x", "/etc/x")."""
    try:
        weight_map = json.loads(index.read_bytes()).get("weight_map")
    except (OSError, ValueError, RecursionError, AttributeError) as error:
        raise ValueError(f"{index}: not a readable index ({type(error).__name__}: {error})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{index}: weight_map must be an object of tensor name -> shard file name")
    for shard in set(weight_map.values()):
        if shard in ("", ".", "..") or Path(shard).name != shard or "\\" in shard:
            raise ValueError(f"{index}: shard {shard!r} is not a file name in the checkpoint's directory")
    return weight_map


# What NumPy can hold of safetensors' dtypes (BF16 widened to float32); F8_* and the like it cannot.
NUMPY_DTYPES = ("F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL")


def read_safetensors(path: Path) -> dict:
    """Every tensor of one safetensors file, through the safetensors package's NumPy API. bfloat16 (which
    NumPy has no dtype for) is widened exactly to float32 from its raw bits.

    safetensors checks the header before reading any tensor (its length within the file, every tensor's
    byte range inside the data and consistent with its dtype and shape, no overlaps, no gaps), so a hostile
    header cannot make it read or allocate more than the file holds; any failure is a ValueError naming the file."""
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        f = safe_open(os.fspath(path), framework="numpy")
    except (SafetensorError, OSError, ValueError) as error:  # SafetensorError: a bad header, a short file
        raise ValueError(f"{path}: not a readable safetensors file ({error})") from None
    with f:
        dtypes = {name: f.get_slice(name).get_dtype() for name in f.keys()}
        foreign = [f"{name}: {dtype}" for name, dtype in dtypes.items() if dtype not in NUMPY_DTYPES]
        if foreign:
            raise ValueError(f"{path}: tensors of dtypes NumPy cannot hold: {foreign[:10]}")
        return {name: read_tensor(f, path, name, dtype) for name, dtype in dtypes.items()}


def read_tensor(f, path: Path, name: str, dtype: str) -> np.ndarray:
    """Tensor `name` of the safetensors file `path`, open as `f` (safe_open, NumPy API), whose header gives
    it `dtype`: BF16 widened exactly to float32 (read_bfloat16), anything else as the file holds it."""
    from safetensors import SafetensorError

    if dtype == "BF16":
        return read_bfloat16(path, name)
    try:
        return f.get_tensor(name)
    except (SafetensorError, OSError, ValueError, TypeError) as error:  # the header was valid: only a file
        raise ValueError(f"{path}: cannot read tensor {name!r} ({error})") from None  # changed under us


def read_bfloat16(path: Path, name: str) -> np.ndarray:
    """A bfloat16 tensor as float32. bfloat16 is the top half of a float32: shift its 16 bits up.
    (The file: an 8-byte little-endian header size, a JSON header of dtype, shape and byte offsets, the data.)

    This parses the header itself, so it checks what safetensors would before reading a byte of data or
    allocating anything a header claims: the header length within the file, the entry's dtype, a shape of
    non-negative ints, offsets inside the data whose span is exactly 2 bytes per element. ValueError otherwise."""
    path = Path(path)

    def bad(problem: str) -> ValueError:
        return ValueError(f"{path}: tensor {name!r}: {problem}")

    header, header_size, size = read_header(path, bad)
    data_size = size - 8 - header_size
    shape, (start, end) = bfloat16_entry(header, name, data_size, bad)
    count = math.prod(shape)
    if end - start != 2 * count:
        raise bad(f"data_offsets {[start, end]} span {end - start} bytes, shape {shape} in BF16 needs {2 * count}")
    bits = np.fromfile(path, dtype="<u2", count=count, offset=8 + header_size + start)
    if bits.size != count:
        raise bad(f"the file ended after {bits.size} of {count} elements")
    widened = bits.astype(np.uint32)
    widened <<= 16  # in place: float32 bits, the low half zero
    return widened.view(np.float32).reshape(shape)


def read_header(path: Path, bad: Callable[[str], ValueError]) -> tuple[object, int, int]:
    """(the JSON header, its length in bytes, the file's size) of the safetensors file `path`, the length checked
    against the file before the header is read; `bad(problem)` makes the ValueError for a problem."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            header_size = int.from_bytes(head, "little")
            if len(head) < 8 or header_size > size - 8:  # before f.read(header_size) allocates that many bytes
                raise bad(f"the header length {header_size} does not fit in a file of {size} bytes")
            header = json.loads(f.read(header_size))
    except OSError as error:
        raise bad(f"cannot read the file ({error})") from None
    except (ValueError, RecursionError) as error:
        if str(error).startswith(f"{path}:"):
            raise
        raise bad(f"the header is not valid JSON ({type(error).__name__}: {error})") from None
    return header, header_size, size


def bfloat16_entry(
    header: object, name: str, data_size: int, bad: Callable[[str], ValueError]
) -> tuple[list[int], tuple[int, int]]:
    """(shape, (start, end)) of tensor `name` in a safetensors header: a BF16 entry, a shape of non-negative ints,
    byte offsets inside the `data_size` bytes of data; `bad(problem)` makes the ValueError otherwise."""
    entry = header.get(name) if isinstance(header, dict) else None
    if not isinstance(entry, dict):
        raise bad("not in the header")
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if entry.get("dtype") != "BF16":
        raise bad(f"dtype {entry.get('dtype')!r}, not 'BF16'")
    if not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)):
        raise bad(f"shape {shape!r} is not a list of non-negative ints")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(n) is int for n in offsets)):
        raise bad(f"data_offsets {offsets!r} is not a pair of ints")
    start, end = offsets
    if not 0 <= start <= end <= data_size:
        raise bad(f"data_offsets {offsets} lie outside the {data_size} bytes of data")
    return shape, (start, end)
