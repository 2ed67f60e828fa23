"""Scaled RoPE in config.json, read and written as the file spells it: transformers reads `rope_scaling` when the file
has one (an object, not null), else `rope_parameters`; the kind under `rope_type`, or the older `type`. Each family's
table calls these (Llama and its kin, Phi-3, Gemma 3's global layers); the math is numpy_transformer's and
torch_transformer's (RopeScaling in transformer_spec.config says what each kind changes, and holds nothing else). The
spelling is the file's, not the config's: a writer reads it off config.json as the model was loaded from it
(`as_read`, the model's hf_config: in_rope_scaling, type_key), and a model of our own is written as transformers 5
writes it (rope_parameters, rope_type)."""

from __future__ import annotations

from dataclasses import fields

from ..config import ROPE_TYPES, RopeScaling, TransformerConfig
from .core import is_finite_number, refuse

# RopeScaling's fields that config.json spells the same (transformers' names), in the order they are written (its kind,
# rope_type, goes under the file's own key: type_key)
SCALING_KEYS = tuple(f.name for f in fields(RopeScaling) if f.name != "rope_type")
# keys of the same object that other fields read (the base, partial rotary) or that name the kind
OTHER_KEYS = ("rope_theta", "partial_rotary_factor", "rope_type", "type")


def effective_rope(c: dict) -> tuple[str, dict]:
    """(the key, its object) transformers reads RoPE from: rope_scaling when the file holds a non-empty one (it then
    replaces rope_parameters), else rope_parameters (an empty object when neither)."""
    scaling = c.get("rope_scaling")
    if scaling:
        if not isinstance(scaling, dict):
            refuse("rope_scaling", scaling, "an object or null")
        return "rope_scaling", scaling
    return "rope_parameters", c.get("rope_parameters") or {}


def kind_rope(c: dict, kind: str, merged: tuple[str, ...] = ("full_attention",)) -> tuple[str, dict]:
    """(where config.json holds it, the RoPE object) of one layer kind: rope_parameters[kind] (transformers 5), into
    which, for the kinds in `merged`, transformers merges a top-level rope_scaling (Gemma 3 4B and up: linear, factor
    8, on the global layers; ModernBERT's on both kinds). Without rope_parameters[kind] the object transformers
    merges into is {"rope_type": "default"}: a rope_scaling spelled with the older "type" then stays plain RoPE."""
    rope = dict((c.get("rope_parameters") or {}).get(kind) or {"rope_type": "default"})
    scaling = c.get("rope_scaling") if kind in merged else None
    if scaling:
        if not isinstance(scaling, dict):
            refuse("rope_scaling", scaling, "an object or null")
        return "rope_scaling", rope | scaling
    return f"rope_parameters.{kind}", rope


def rope_theta_of(c: dict, default: float = 10000.0) -> float:
    """The base of the RoPE object transformers reads (effective_rope), else the top-level rope_theta."""
    where, rope = effective_rope(c)
    base = rope.get("rope_theta", c.get("rope_theta", default))
    if not (is_finite_number(base) and base > 0):
        refuse(f"{where}.rope_theta", base, "a positive number")
    return float(base)


def read_scaling(
    rope: dict, where: str, kinds: tuple[str, ...] = ROPE_TYPES, aliases: dict | None = None, **overrides
) -> RopeScaling | None:
    """The RopeScaling of config.json's RoPE object `rope` found under the key `where` (said in every refusal, as the
    file spells it): None for plain RoPE ("default"); refused: a kind outside `kinds` (after `aliases`, Phi-3's "su"
    for "longrope"), a key no kind reads, a value out of range (long lists shortened). `overrides`: values another
    key of the file sets (Phi-3's top-level original_max_position_embeddings)."""
    kind_key = object_type_key(rope)
    kind = rope.get(kind_key, "default")
    kind = (aliases or {}).get(kind, kind)
    if kind == "default":
        return None
    if kind not in kinds:
        refuse(f"{where}.{kind_key}", kind, (*kinds, "default"))
    unknown = sorted(set(rope) - set(SCALING_KEYS) - set(OTHER_KEYS))
    if unknown:
        refuse(f"{where}.{unknown[0]}", rope[unknown[0]], f"no such key in a {kind} scaling")
    values = {name: tuple(v) if isinstance(v, list) else v for name, v in rope.items() if name in SCALING_KEYS}
    try:
        return RopeScaling(kind, **values | overrides)
    except (ValueError, TypeError) as error:
        raise ValueError(f"config.json: {where}: {error}") from None


def local_rope(config: TransformerConfig) -> tuple[float, RopeScaling | None]:
    """The local layers' (base, scaling), Gemma 3's and ModernBERT's: their own, or the global layers' when
    rope_local_theta is None."""
    if config.rope_local_theta is None:
        return config.rope_theta, config.rope_scaling
    return config.rope_local_theta, config.rope_local_scaling


def object_type_key(rope: dict) -> str:
    """The key a RoPE object names its kind under: the older "type" when it has that and no rope_type."""
    return "type" if "type" in rope and "rope_type" not in rope else "rope_type"


def in_rope_scaling(as_read: dict) -> bool:
    """Whether config.json as read held its scaled RoPE in a top-level rope_scaling (an object, not null: transformers
    then reads it there, and the scaling is written back there); else it goes in rope_parameters."""
    return isinstance(as_read.get("rope_scaling"), dict) and bool(as_read["rope_scaling"])


def type_key(as_read: dict) -> str:
    """The key config.json as read named its scaling's kind under (object_type_key of the RoPE object transformers
    reads: effective_rope): "type" in the older files, else (and for a model of our own) rope_type."""
    return object_type_key(effective_rope(as_read)[1])


def scaling_to_hf(scaling: RopeScaling, without: tuple[str, ...] = (), kind_key: str = "rope_type") -> dict:
    """config.json's object for `scaling`: its kind under `kind_key` (rope_type, or type_key's "type"), and the fields
    it has (lists for longrope's factors), less `without`."""
    out: dict = {kind_key: scaling.rope_type}
    for name in SCALING_KEYS:
        value = getattr(scaling, name)
        if value is not None and name not in without:
            out[name] = list(value) if isinstance(value, tuple) else value
    return out
