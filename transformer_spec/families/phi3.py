"""Phi-3 (Phi3ForCausalLM): Llama's math with a fused `qkv_proj` (q, k and v blocks of H, H_kv and H_kv heads: split
on load, merged on save) and a fused `gate_up_proj` (gate, then up), no biases, partial rotary
(`partial_rotary_factor`: RoPE on the first fraction of each head's features) and an optional sliding window.
"""

from __future__ import annotations

from dataclasses import replace

from ..config import RopeScaling, TransformerConfig
from .core import ANY, OMITTED, Key, Rule, declared, fused_qkv, is_finite_number, refuse
from .llama import LLAMA_CONFIG
from .rope import effective_rope, in_rope_scaling, read_scaling, scaling_to_hf, type_key

PHI3_DROPOUT = {"resid_pdrop": (("residual",), 0.0), "attention_dropout": (("attention",), 0.0)}  # embd_pdrop: unused


def rotary_dim(legacy: str, default: float):
    """The reader of rotary_dim: the fraction of each head RoPE turns (rope_parameters' partial_rotary_factor, else
    the family's older top-level key `legacy`, else `default`) times the head size, int() as transformers computes
    it; None when it is the whole head. Refused: a fraction outside (0, 1], an odd number of features."""

    def read(value, c: dict) -> int | None:
        factor = effective_rope(c)[1].get("partial_rotary_factor", c.get(legacy, default))
        if not is_finite_number(factor) or not 0 < factor <= 1:
            refuse("partial_rotary_factor", factor, "a number in (0, 1]")
        head = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        rotary = int(head * factor)
        if rotary == head:
            return None
        if rotary < 2 or rotary % 2:
            refuse("partial_rotary_factor", factor, f"a fraction turning an even number >= 2 of the {head} features")
        return rotary

    return read


def partial_rotary_factor(config: TransformerConfig) -> float:
    """The fraction of each head RoPE turns, checked to give back rotary_dim under transformers' int(head_dim *
    fraction)."""
    factor = config.rope_dim / config.d_head
    if int(config.d_head * factor) != config.rope_dim:
        raise ValueError(f"rotary_dim={config.rotary_dim} of head size {config.d_head} has no exact fraction")
    return factor


# Phi-3 keeps the original length at the top level (Phi3Config's original_max_position_embeddings, 4096 by default),
# and transformers reads it there before the one in the RoPE object; an older file's kind "su" (or "yarn") is longrope.
PHI3_OWN_KEYS = ("original_max_position_embeddings",)
PHI3_ORIGINAL = 4096


def rope_parameters(
    config: TransformerConfig, as_read: dict, without: tuple[str, ...] = PHI3_OWN_KEYS
) -> dict | object:
    """rope_parameters for config.json: the base, the fraction of each head RoPE turns and the scaling unless
    config.json as read held it in a rope_scaling (less `without`: Phi-3's original length, written at the top
    level); not written beside a rope_scaling (which transformers would read instead)."""
    scaling = config.rope_scaling
    if scaling is not None and in_rope_scaling(as_read):
        return OMITTED
    plain = {"rope_type": "default"} if scaling is None else scaling_to_hf(scaling, without, type_key(as_read))
    return plain | {"rope_theta": config.rope_theta, "partial_rotary_factor": partial_rotary_factor(config)}


def is_longrope(scaling: RopeScaling | None) -> bool:
    return scaling is None or scaling.rope_type == "longrope"


def phi3_scaling(value, c: dict) -> RopeScaling | None:
    """Phi-3's scaled RoPE: longrope only (as Phi3Config validates), its original length from the top level."""
    where, rope = effective_rope(c)
    original = c.get("original_max_position_embeddings", PHI3_ORIGINAL)
    aliases = {"su": "longrope", "yarn": "longrope"}
    return read_scaling(rope, where, ("longrope",), aliases, original_max_position_embeddings=original)


def remade_cache(value, c: dict) -> bool:
    """rope_cache_remade: Phi-3's generate() (its prepare_inputs_for_generation) makes the cache again, from the whole
    sequence, at the step the sequence first outgrows original_max_position_embeddings, where LongRoPE switches every
    position to the long factors (the generic generate() of the other families keeps the keys cached with the short
    ones)."""
    return True


def phi3_scaling_json(config: TransformerConfig, as_read: dict) -> dict | object:
    """rope_scaling for config.json (without the original length, written at the top level), when config.json as read
    held the scaling there."""
    if not in_rope_scaling(as_read):
        return OMITTED
    scaling = config.rope_scaling  # None: taken off after loading, null in the file
    return None if scaling is None else scaling_to_hf(scaling, PHI3_OWN_KEYS, type_key(as_read))


def top_level_fraction(config: TransformerConfig, as_read: dict):
    """partial_rotary_factor at the top level, beside a rope_scaling (transformers then reads it there), when RoPE
    turns part of each head."""
    beside = config.rope_scaling is not None and in_rope_scaling(as_read) and config.rotary_dim is not None
    return partial_rotary_factor(config) if beside else OMITTED


def original_length(config: TransformerConfig):
    """original_max_position_embeddings at the top level, with a scaling."""
    return OMITTED if config.rope_scaling is None else config.rope_scaling.original_length(config.max_len)


PHI3_CONFIG = replace(
    LLAMA_CONFIG.variant(
        "phi3",
        without=("attention_bias", "mlp_bias", "head_dim", "rope_scaling"),  # Phi3Config: no biases, no head_dim
        unwritten=("rope_parameters",),  # Llama's reading of the base stays; written below with the fraction
        keys=(
            Key("rope_scaling", "rope_scaling", None, phi3_scaling, source=phi3_scaling_json, spelled=True),
            Key("rope_scaling", "rope_cache_remade", None, remade_cache, written=False),
            Key("partial_rotary_factor", None, None, read_too=False, source=top_level_fraction, spelled=True),
            Key("original_max_position_embeddings", None, None, read_too=False, source=original_length),
            Key(
                "rope_parameters",
                "rotary_dim",
                None,
                rotary_dim("partial_rotary_factor", 1.0),
                source=rope_parameters,
                spelled=True,
            ),
            Key("sliding_window", "sliding_window", None, lambda value, c: None if value is None else int(value)),
        ),
        supports={
            "bias": False,
            "qkv_bias": (None, False),
            "ffn_bias": None,
            "sliding_window": ANY,
            "rotary_dim": ANY,
            "head_dim": None,
            "rope_scaling": lambda c: (c.rope_scaling,) if is_longrope(c.rope_scaling) else (None,),
        },  # fmt: skip
    ),
    dropout=PHI3_DROPOUT,
)

PHI3 = declared(
    PHI3_CONFIG,
    model_class="TransformerLM",
    architecture="Phi3ForCausalLM",
    prefixes=("model.", ""),
    rules=(
        Rule("decoder.token_embedding.weight", "embed_tokens.weight"),
        Rule("decoder.layers.{i}.self_attn_norm.weight", "layers.{i}.input_layernorm.weight"),
        *fused_qkv("decoder.layers.{i}.self_attn", "layers.{i}.self_attn.qkv_proj", ("weight",), gqa=True),
        Rule("decoder.layers.{i}.self_attn.out_proj.weight", "layers.{i}.self_attn.o_proj.weight"),
        Rule("decoder.layers.{i}.ffn_norm.weight", "layers.{i}.post_attention_layernorm.weight"),
        Rule("decoder.layers.{i}.ffn.gate.weight", "layers.{i}.mlp.gate_up_proj.weight", part=(0, 2)),
        Rule("decoder.layers.{i}.ffn.linear1.weight", "layers.{i}.mlp.gate_up_proj.weight", part=(1, 2)),
        Rule("decoder.layers.{i}.ffn.linear2.weight", "layers.{i}.mlp.down_proj.weight"),
        Rule("decoder.final_norm.weight", "norm.weight"),
        Rule("output_proj.weight", "lm_head.weight", head=True),  # only when untied
    ),
    skipped=(r"lm_head\.weight",),  # when tied: a copy of embed_tokens.weight
    tied=(("lm_head.weight", "model.embed_tokens.weight", "tie_embeddings"),),
)

REGISTER = (PHI3,)
