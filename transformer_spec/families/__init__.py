"""Hugging Face model families as data, one file per family: for each `model_type`, how its config.json translates
to a `TransformerConfig` and back, and a table that maps every tensor of its checkpoint to one of our state-dict names
(`core`: the Rule and Family types, the rule interpreter and the config checks every family shares). Both
`numpy_transformer.hf` and `torch_transformer.hf` read these tables, so a new family is a new file here, not a new
code path there: every module of this package but `core` is imported below, and the families it lists in `REGISTER`
(and `REGISTER_BY_ARCHITECTURE`, a class of a family's model_type read differently) are registered, in module order.
"""

from __future__ import annotations

import importlib
import pkgutil

from .bert import BERT, BERT_DROPOUT
from .bloom import BLOOM
from .core import (
    ACTIVATIONS_FROM_HF,
    ANY,
    FREE_FIELDS,
    MAX_JSON_DEPTH,
    NON_NEGATIVE_FLOATS,
    NON_NEGATIVE_INTS,
    OPTIONAL_POSITIVE_INTS,
    POSITIVE_FLOATS,
    POSITIVE_INTS,
    RATES,
    TOKEN_IDS,
    Family,
    Rule,
    check_config_values,
    check_supported,
    dropout_from_hf,
    dropout_to_hf,
    end_token_ids,
    expand,
    full_name,
    generation_rules_from_hf,
    is_finite_number,
    is_int,
    is_skipped,
    match,
    parse_json_config,
    read_generation_rules,
    read_layout,
    relative,
    require,
    resolve_ties,
    tied_copies,
    to_hf_tensors,
    token_id,
    write_layout,
    writing_plan,
)
from .gpt2 import GPT2, GPT2_DROPOUT
from .llama import LLAMA, LLAMA_DROPOUT, MISTRAL, QWEN2
from .seq2seq import BART, MARIAN, SEQ2SEQ_DROPOUT
from .t5 import T5, T5_ENCODER


def registered() -> tuple[dict[str, Family], dict[str, Family]]:
    """(model_type -> Family, architecture -> Family) of every family module of this package (each but `core`),
    in the order of the modules' names. ValueError when two files register the same model_type or class."""
    families: dict[str, Family] = {}
    by_architecture: dict[str, Family] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name):
        if info.name == "core":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for table, key, found in (
            (families, "model_type", getattr(module, "REGISTER", ())),
            (by_architecture, "architecture", getattr(module, "REGISTER_BY_ARCHITECTURE", ())),
        ):
            for family in found:
                name = getattr(family, key)
                if name in table:
                    raise ValueError(f"{module.__name__} registers {key} {name!r}, which another family file has")
                table[name] = family
    return families, by_architecture


FAMILIES, BY_ARCHITECTURE = registered()
# Families with models of their own (not a TransformerConfig), read by their own loaders
READ_ELSEWHERE = {
    "vit": "numpy_transformer.vision.load (torch_transformer.vision.load)",
    "clip": "numpy_transformer.clip.load (torch_transformer.clip.load)",
}


def family_of(model_type, architectures=None, c: dict | None = None) -> Family:
    """The family of a checkpoint: its model_type's, or the family of a class read differently, found by `c`'s flag
    (config.json: Family.flag true, EmbeddingGemma's use_bidirectional_attention) or by `architectures` (config.json's
    list: T5EncoderModel, an EncoderModel; a family with a flag only when the flag is true)."""
    if model_type in READ_ELSEWHERE:
        raise ValueError(f"model_type {model_type!r} is read by {READ_ELSEWHERE[model_type]}, not hf.load")
    if model_type not in FAMILIES:
        raise ValueError(f"model_type {model_type!r} is not supported; supported: {sorted(FAMILIES)}")
    flags = c if isinstance(c, dict) else {}
    for family in BY_ARCHITECTURE.values():
        if family.model_type == model_type and family.flag is not None and flags.get(family.flag) is True:
            return family
    for name in architectures if isinstance(architectures, list) else []:
        found = BY_ARCHITECTURE.get(name) if isinstance(name, str) else None
        if found is not None and found.model_type == model_type and found.flag is None:
            return found
    return FAMILIES[model_type]


def family_for_model(model) -> Family:
    """The family a model can be written as: the one it was loaded from, else the first whose config
    translation accepts its class and config. ValueError listing why each family does not fit."""
    loaded = model.hf_model_type
    if loaded is not None:
        for family in BY_ARCHITECTURE.values():  # a class read differently (T5EncoderModel: an EncoderModel)
            if family.model_type == loaded and family.model_class == type(model).__name__ and fits(family, model):
                return family
        return family_of(loaded)
    reasons = []
    for family in FAMILIES.values():
        if type(model).__name__ != family.model_class:
            reasons.append(f"{family.model_type}: a {family.model_class}, not a {type(model).__name__}")
            continue
        try:
            family.config_json(model.config)
        except ValueError as error:
            reasons.append(f"{family.model_type}: {error}")
            continue
        return family
    for family in BY_ARCHITECTURE.values():  # a class of a family read differently (ModernBertForMaskedLM)
        if family.model_class == type(model).__name__ and fits(family, model):
            return family
    raise ValueError("no Hugging Face family fits this model: " + "; ".join(reasons))


def fits(family: Family, model) -> bool:
    """Whether a checkpoint of `family` can express the model's config (check_supported passes)."""
    try:
        check_supported(family, model.config)
    except ValueError:
        return False
    return True


__all__ = [
    "ACTIVATIONS_FROM_HF",
    "ANY",
    "BART",
    "BERT",
    "BERT_DROPOUT",
    "BLOOM",
    "BY_ARCHITECTURE",
    "FAMILIES",
    "registered",
    "FREE_FIELDS",
    "Family",
    "GPT2",
    "GPT2_DROPOUT",
    "LLAMA",
    "LLAMA_DROPOUT",
    "MARIAN",
    "MAX_JSON_DEPTH",
    "MISTRAL",
    "NON_NEGATIVE_FLOATS",
    "NON_NEGATIVE_INTS",
    "OPTIONAL_POSITIVE_INTS",
    "POSITIVE_FLOATS",
    "POSITIVE_INTS",
    "QWEN2",
    "RATES",
    "Rule",
    "SEQ2SEQ_DROPOUT",
    "T5",
    "T5_ENCODER",
    "TOKEN_IDS",
    "check_config_values",
    "check_supported",
    "dropout_from_hf",
    "dropout_to_hf",
    "end_token_ids",
    "expand",
    "family_for_model",
    "family_of",
    "full_name",
    "generation_rules_from_hf",
    "is_finite_number",
    "is_int",
    "is_skipped",
    "match",
    "parse_json_config",
    "read_generation_rules",
    "read_layout",
    "relative",
    "require",
    "resolve_ties",
    "tied_copies",
    "to_hf_tensors",
    "token_id",
    "write_layout",
    "writing_plan",
]
