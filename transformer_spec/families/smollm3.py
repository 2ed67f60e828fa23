"""SmolLM3 (SmolLM3ForCausalLM, model_type smollm3): Llama's decoder (RMSNorm pre-norm, SwiGLU, grouped-query
attention, a tied head in the released files) in which some layers have no positions at all: no_rope_layers lists
one 0 / 1 per layer (1: the layer turns its queries and keys by RoPE; 0: NoPE, causal attention alone), by default
every no_rope_layer_interval-th layer without (SmolLM3Config: layer i is rotary unless (i + 1) % interval == 0), read
into `rope_layers`. Llama's tensor table as is. The sliding window (use_sliding_window, on the NoPE layers by default)
is off in the released files and refused here by name."""

from __future__ import annotations

from ..config import TransformerConfig
from .core import ANY, Key, declared, is_int, refuse, special_token
from .llama import LLAMA, LLAMA_CONFIG

# SmolLM3Config's defaults, where they differ from Llama's (a config.json that leaves them out reads them)
SMOLLM3_DEFAULTS = {"pad_token_id": 128004, "bos_token_id": 128000, "eos_token_id": 128001, "tie_word_embeddings": True}


def rope_layers(value, c: dict) -> tuple[bool, ...] | None:
    """no_rope_layers -> rope_layers, one bool per layer (True: rotary): as listed, or SmolLM3Config's rule from
    no_rope_layer_interval (layer i without RoPE when (i + 1) % interval == 0); None when every layer is rotary."""
    n = c["num_hidden_layers"]
    if value is None:
        interval = c.get("no_rope_layer_interval", 4)
        if not (is_int(interval) and interval >= 1):
            refuse("no_rope_layer_interval", interval, "a positive integer")
        value = [int((i + 1) % interval != 0) for i in range(n)]
    if not isinstance(value, list) or len(value) != n or any(not is_int(v) or v not in (0, 1) for v in value):
        refuse("no_rope_layers", value, f"a list of {n} entries, each 0 (no positions) or 1 (RoPE)")
    flags = tuple(bool(v) for v in value)
    return None if all(flags) else flags


def no_rope_layers_json(config: TransformerConfig) -> list[int]:
    """rope_layers -> no_rope_layers: 1 for each rotary layer, 0 for each without positions."""
    return [int(config.layer_uses_rope(i)) for i in range(config.n_decoder_layers)]


def full_layer_types(value, c: dict) -> None:
    """layer_types: read only to check that every layer attends in full (no window here): None or "full_attention"s."""
    if value is not None and (not isinstance(value, list) or any(kind != "full_attention" for kind in value)):
        refuse("layer_types", value, "None or a list of 'full_attention' (the sliding window is not computed here)")


SMOLLM3_CONFIG = LLAMA_CONFIG.variant(
    "smollm3",
    without=("pad_token_id", "bos_token_id", "eos_token_id", "tie_word_embeddings", "head_dim"),
    keys=(
        Key("pad_token_id", "pad_id", SMOLLM3_DEFAULTS["pad_token_id"], special_token("pad_token_id")),
        Key("bos_token_id", "bos_id", SMOLLM3_DEFAULTS["bos_token_id"], special_token("bos_token_id")),
        Key("eos_token_id", "eos_id", SMOLLM3_DEFAULTS["eos_token_id"], special_token("eos_token_id")),
        # embed_tokens: nn.Embedding(padding_idx=pad), so the pad row gets no gradient from lookups
        Key("pad_token_id", "embedding_padding_idx", SMOLLM3_DEFAULTS["pad_token_id"],
            lambda value, c: value is not None, written=False),
        Key("tie_word_embeddings", "tie_embeddings", SMOLLM3_DEFAULTS["tie_word_embeddings"]),
        Key("head_dim", None, None, allowed=(None,), written=False),  # SmolLM3Config has none: hidden_size / heads
        Key("no_rope_layers", "rope_layers", None, rope_layers, source=no_rope_layers_json),
        Key("no_rope_layer_interval", None, 4, written=False),  # read by rope_layers when no_rope_layers is absent
        Key("use_sliding_window", None, False, allowed=(False,)),  # a window on the NoPE layers: not computed here
        Key("sliding_window", None, None, written=False),  # read by transformers only with use_sliding_window
        Key("layer_types", None, None, full_layer_types, written=False),
        Key("max_window_layers", None, None, written=False),  # older files' key: SmolLM3Config does not read it
    ),
    supports={"rope_layers": ANY, "head_dim": None},
)  # fmt: skip

SMOLLM3 = declared(
    SMOLLM3_CONFIG, model_class="TransformerLM", architecture="SmolLM3ForCausalLM", prefixes=LLAMA.prefixes,
    rules=LLAMA.rules, skipped=LLAMA.skipped, tied=LLAMA.tied,
)  # fmt: skip

# what this file adds to transformer_spec.families.FAMILIES (found by the package, no list to edit)
REGISTER = (SMOLLM3,)
