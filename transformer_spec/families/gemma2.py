"""Gemma 2 (Gemma2ForCausalLM, model_type gemma2): Gemma 3's decoder without its q/k norms, and with the attention
scores soft-capped: every score c q . k becomes attn_logit_softcapping * tanh(score / attn_logit_softcapping) before
the mask (`attn_softcap`), the final logits likewise by final_logit_softcapping (`logit_softcap`). As Gemma 3: every
RMSNorm of gain 1 + w (norm "rms_offset"), four norms a layer (input_layernorm, post_attention_layernorm,
pre_feedforward_layernorm, post_feedforward_layernorm: the sandwich), GeGLU with tanh GELU, embeddings times
sqrt(hidden_size), the scale query_pre_attn_scalar^-1/2; local layers (the sliding window) and global ones by
`layer_types`, every other layer local by default (Gemma2Config's rule: layer i slides when i is even), all of them
at one rotary base (rope_theta; Gemma 2 has no local base)."""

from __future__ import annotations

from dataclasses import replace

from ..config import LAYER_TYPES
from .core import ANY, Key, declared, refuse
from .gemma3 import GEMMA3_CONFIG, GEMMA3_TEXT, positive_or_none, written_layer_types
from .llama import rope_parameters_json, rope_scaling, rope_scaling_json, rope_theta

# Gemma2Config's defaults, for a config.json that leaves the keys out (the released ones write them all)
GEMMA2_SOFTCAPS = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}


def layer_types(value, c: dict) -> tuple:
    """layer_types -> each layer's kind: as listed, or Gemma2Config's rule (layers 0, 2, 4, ... local, the others
    global)."""
    if value is None:
        value = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(c["num_hidden_layers"])]
    if not isinstance(value, list):
        refuse("layer_types", value, f"a list of {LAYER_TYPES}")
    return tuple(value)


GEMMA2_CONFIG = GEMMA3_CONFIG.variant(
    "gemma2",
    without=(
        "rope_parameters",
        "rope_scaling",
        "layer_types",
        "final_logit_softcapping",
        "attn_logit_softcapping",
        "max_position_embeddings",
    ),
    keys=(
        Key("max_position_embeddings", "max_len", 8192),
        # one RoPE for every layer, Llama's keys: a top-level rope_theta (the released files'), rope_parameters
        Key("rope_theta", "rope_theta", 10000.0, lambda value, c: float(value), written=False),
        Key("rope_parameters", "rope_theta", None, rope_theta, source=rope_parameters_json, spelled=True),
        Key("rope_scaling", "rope_scaling", None, rope_scaling, source=rope_scaling_json, spelled=True),
        Key("layer_types", "layer_types", None, layer_types, source=written_layer_types),
        Key(
            "final_logit_softcapping",
            "logit_softcap",
            GEMMA2_SOFTCAPS["final_logit_softcapping"],
            positive_or_none("final_logit_softcapping"),
        ),
        Key(
            "attn_logit_softcapping",
            "attn_softcap",
            GEMMA2_SOFTCAPS["attn_logit_softcapping"],
            positive_or_none("attn_logit_softcapping"),
        ),
    ),  # fmt: skip
    supports={"qk_norm": False, "attn_softcap": ANY},
)
# without Gemma 3's local rotary base and scaling: Gemma 2 turns every layer by one RoPE
GEMMA2_CONFIG = replace(
    GEMMA2_CONFIG,
    supports={k: v for k, v in GEMMA2_CONFIG.supports.items() if k not in ("rope_local_theta", "rope_local_scaling")},
)

GEMMA2 = declared(
    GEMMA2_CONFIG,
    model_class="TransformerLM",
    architecture="Gemma2ForCausalLM",
    prefixes=GEMMA3_TEXT.prefixes,
    rules=tuple(rule for rule in GEMMA3_TEXT.rules if not rule.ours.endswith(("q_norm.weight", "k_norm.weight"))),
    skipped=GEMMA3_TEXT.skipped,
    tied=GEMMA3_TEXT.tied,
)

# what this file adds to transformer_spec.families.FAMILIES (found by the package, no list to edit)
REGISTER = (GEMMA2,)
