"""Gemma 3, text only (Gemma3ForCausalLM, model_type gemma3_text): Llama's decoder with every RMSNorm of gain 1 + w
(norm "rms_offset": the checkpoint's w is our weight, unchanged), a second norm on each sublayer's output (the
sandwich: post_attention_layernorm, post_feedforward_layernorm), q/k norms per head, GeGLU with tanh GELU, embeddings
times sqrt(hidden_size), the attention scale query_pre_attn_scalar^-1/2, the final logits soft-capped, and local
layers (a sliding window, rope_local_base_freq) among global ones (rope_theta) by `layer_types`, 5:1 by default."""

from __future__ import annotations

from dataclasses import replace

from ..config import LAYER_TYPES, RopeScaling, TransformerConfig
from .core import (
    ACTIVATIONS_FROM_HF,
    ANY,
    OMITTED,
    ConfigMap,
    Key,
    Rule,
    declared,
    is_finite_number,
    refuse,
    renamed,
    special_token,
)
from .llama import LLAMA_DROPOUT, head_dim, kv_heads
from .rope import in_rope_scaling, kind_rope, local_rope, read_scaling, scaling_to_hf

GEMMA3_HEAD_DIM = 256  # Gemma3TextConfig's defaults, when config.json leaves a key out
GEMMA3_BASES = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}
LEGACY_BASE_KEYS = {"full_attention": "rope_theta", "sliding_attention": "rope_local_base_freq"}


def positive_or_none(name: str):
    """The reader of an optional positive number (a soft cap): None, or the number as a float."""

    def read(value, c: dict):
        if value is not None and not (is_finite_number(value) and value > 0):
            refuse(name, value, "a positive number or null")
        return None if value is None else float(value)

    return read


def rope_base(kind: str):
    """The reader of one layer kind's rotary base: its RoPE object's (kind_rope), else the older rope_theta /
    rope_local_base_freq, else Gemma's default."""

    def read(value, c: dict) -> float:
        where, rope = kind_rope(c, kind)
        base = rope.get("rope_theta", c.get(LEGACY_BASE_KEYS[kind], GEMMA3_BASES[kind]))
        if not (is_finite_number(base) and base > 0):
            refuse(f"{where}.rope_theta", base, "a positive number")
        return float(base)

    return read


def global_scaling(value, c: dict) -> RopeScaling | None:
    """The global layers' scaled RoPE (a top-level rope_scaling merged into theirs, as Gemma 3 4B and up ship it)."""
    return read_scaling(*reversed(kind_rope(c, "full_attention")))


def local_scaling(value, c: dict) -> RopeScaling | None:
    """The local layers' scaled RoPE, from rope_parameters.sliding_attention only (transformers' Gemma3RotaryEmbedding
    initialises each kind from its own object; a top-level rope_scaling reaches the global kind alone)."""
    return read_scaling(*reversed(kind_rope(c, "sliding_attention")))


def kept_longrope_cache(value, c: dict) -> bool:
    """rope_cache_remade: False beside a global LongRoPE scaling (Gemma 3's generate(), transformers' generic one,
    keeps the keys it cached with the short factors), else True (nothing to remake)."""
    scaling = global_scaling(value, c)
    return scaling is None or scaling.rope_type != "longrope"


def rope_parameters(config: TransformerConfig, as_read: dict) -> dict:
    """Both kinds' rotary bases, as config.json's rope_parameters (the local one is the global one when unset), each
    kind's scaling with its base unless it goes in a top-level rope_scaling (the global one, where config.json as read
    held it there; the local layers' never does)."""
    kinds = {"full_attention": (config.rope_theta, config.rope_scaling), "sliding_attention": local_rope(config)}
    out = {}
    for kind, (base, scaling) in kinds.items():
        out[kind] = {"rope_type": "default", "rope_theta": base}
        if scaling is not None and not (kind == "full_attention" and in_rope_scaling(as_read)):
            out[kind] = scaling_to_hf(scaling) | {"rope_theta": base}
    return out


def rope_scaling_json(config: TransformerConfig, as_read: dict) -> dict | object:
    """The global layers' scaling as a top-level rope_scaling, where config.json as read held it there; its kind
    under rope_type (transformers merges the object into {"rope_type": "default", ...}: an older "type" would leave
    the layers plain)."""
    if not in_rope_scaling(as_read):
        return OMITTED
    scaling = config.rope_scaling  # None: taken off after loading (or an older "type", read as plain RoPE): null
    return None if scaling is None else scaling_to_hf(scaling)


def layer_types(value, c: dict) -> tuple:
    """layer_types -> each layer's kind: as listed, or Gemma3TextConfig's rule (every sliding_window_pattern-th
    layer global, the others local: 5:1)."""
    if value is None:
        every = c.get("sliding_window_pattern", 6)
        value = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(c["num_hidden_layers"])]
    if not isinstance(value, list):
        refuse("layer_types", value, f"a list of {LAYER_TYPES}")
    return tuple(value)


def written_layer_types(config: TransformerConfig) -> list:
    """Our layer_types as config.json lists them; without them, every layer is of one kind: local with a window."""
    if config.layer_types is not None:
        return list(config.layer_types)
    return ["sliding_attention" if config.sliding_window is not None else "full_attention"] * config.n_decoder_layers


def attention_scale(value, c: dict) -> float | None:
    """query_pre_attn_scalar -> the factor on q . k, its inverse square root; None when that is 1/sqrt(head_dim)."""
    if not (is_finite_number(value) and value > 0):
        refuse("query_pre_attn_scalar", value, "a positive number")
    return None if value == c.get("head_dim", GEMMA3_HEAD_DIM) else float(value) ** -0.5


def query_pre_attn_scalar(config: TransformerConfig) -> int | float:
    """The inverse of attention_scale: the scale's inverse square, an int where it is one (Gemma's 256)."""
    scalar = config.d_head if config.attention_scale is None else config.attention_scale**-2
    return round(scalar) if abs(scalar - round(scalar)) <= 1e-9 * scalar else scalar


GEMMA3_CONFIG = ConfigMap(
    model_type="gemma3_text",
    keys=(
        Key("vocab_size", ("tgt_vocab_size", "src_vocab_size")),
        Key("hidden_size", "d_model"),
        Key("num_attention_heads", "n_heads"),
        Key("num_key_value_heads", "n_kv_heads", None, kv_heads, source="kv_heads"),
        Key("head_dim", "head_dim", GEMMA3_HEAD_DIM, head_dim, source="d_head"),
        Key("intermediate_size", "d_ff"),
        Key("num_hidden_layers", "n_decoder_layers"),
        Key(
            "hidden_activation",
            "activation",
            "gelu_pytorch_tanh",
            read=lambda value, c: ACTIVATIONS_FROM_HF[value],
            allowed=tuple(ACTIVATIONS_FROM_HF),
            write=lambda value: {"gelu_tanh": "gelu_pytorch_tanh"}.get(value, value),
        ),  # fmt: skip
        Key("max_position_embeddings", "max_len", 131_072),
        Key("rms_norm_eps", "layer_norm_eps", 1e-6),
        Key("rope_parameters", "rope_theta", None, rope_base("full_attention"), source=rope_parameters, spelled=True),
        Key("rope_parameters", "rope_local_theta", None, rope_base("sliding_attention"), written=False),
        Key("rope_scaling", "rope_scaling", None, global_scaling, source=rope_scaling_json, spelled=True),
        Key("rope_scaling", "rope_cache_remade", None, kept_longrope_cache, written=False),
        Key("rope_parameters", "rope_local_scaling", None, local_scaling, written=False),
        Key("layer_types", "layer_types", None, layer_types, source=written_layer_types),
        Key(
            "sliding_window",
            "sliding_window",
            4096,
            lambda value, c: None if value is None else int(value),
            source=lambda config: config.max_len if config.sliding_window is None else config.sliding_window,
        ),  # fmt: skip
        Key("query_pre_attn_scalar", "attention_scale", GEMMA3_HEAD_DIM, attention_scale, source=query_pre_attn_scalar),
        Key("final_logit_softcapping", "logit_softcap", None, positive_or_none("final_logit_softcapping")),
        Key("attn_logit_softcapping", None, None, allowed=(None,)),
        Key("attention_bias", None, False, allowed=(False,)),
        Key("use_bidirectional_attention", None, False, allowed=(False, None)),
        Key("tie_word_embeddings", "tie_embeddings", True),
        Key("pad_token_id", "pad_id", 0, special_token("pad_token_id")),
        Key("bos_token_id", "bos_id", 2, special_token("bos_token_id")),
        Key("eos_token_id", "eos_id", 1, special_token("eos_token_id")),
        # embed_tokens: nn.Embedding(padding_idx=pad), so the pad row gets no gradient from lookups
        Key("pad_token_id", "embedding_padding_idx", 0, lambda value, c: value is not None, written=False),
    ),
    dropout=LLAMA_DROPOUT,
    supports={
        "activation": ("gelu_tanh", "gelu", "silu", "relu"),
        "norm": "rms_offset",
        "norm_first": True,
        "positional": "rope",
        "rope_theta": ANY,
        "rope_local_theta": ANY,
        "rope_scaling": ANY,
        "rope_local_scaling": ANY,
        "qk_norm": True,
        "gated_ffn": True,
        "n_kv_heads": ANY,
        "bias": False,
        "qkv_bias": (None, False),
        "sliding_window": ANY,
        "layer_types": ANY,
        "attention_scale": ANY,
        "head_dim": ANY,
        "tie_embeddings": ANY,
        "scale_embeddings": True,
        "output_bias": False,
        "sandwich_norm": True,
        "logit_softcap": ANY,
    },  # fmt: skip
    fixed={"n_encoder_layers": 0},
)

GEMMA3_TEXT = declared(
    GEMMA3_CONFIG,
    model_class="TransformerLM",
    architecture="Gemma3ForCausalLM",
    prefixes=("model.", ""),
    rules=(
        Rule("decoder.token_embedding.weight", "embed_tokens.weight"),
        *renamed(
            "decoder.layers.{i}",
            "layers.{i}",
            (
                ("self_attn_norm", "input_layernorm"),
                ("self_attn.q_proj", "self_attn.q_proj"),
                ("self_attn.k_proj", "self_attn.k_proj"),
                ("self_attn.v_proj", "self_attn.v_proj"),
                ("self_attn.out_proj", "self_attn.o_proj"),
                ("self_attn.q_norm", "self_attn.q_norm"),
                ("self_attn.k_norm", "self_attn.k_norm"),
                ("self_attn_post_norm", "post_attention_layernorm"),
                ("ffn_norm", "pre_feedforward_layernorm"),
                ("ffn.gate", "mlp.gate_proj"),
                ("ffn.linear1", "mlp.up_proj"),
                ("ffn.linear2", "mlp.down_proj"),
                ("ffn_post_norm", "post_feedforward_layernorm"),
            ),
            params=("weight",),
        ),
        Rule("decoder.final_norm.weight", "norm.weight"),
        Rule("output_proj.weight", "lm_head.weight", head=True),  # only when untied
    ),
    skipped=(r"lm_head\.weight",),  # when tied: a copy of embed_tokens.weight
    tied=(("lm_head.weight", "model.embed_tokens.weight", "tie_embeddings"),),
)


# EmbeddingGemma: Gemma3TextModel with use_bidirectional_attention, Gemma 3 as an encoder (hidden states after the
# final norm), read as an EncoderModel. transformers' global layers then see every key (its causal mask OR true),
# its local ones a band: Gemma3TextConfig keeps sliding_window // 2 + 1 of the file's window W and the mask is
# |i - j| < that, so |i - j| <= W // 2, our encoder band of a window W (config.layer_window, score_mod). The file's W
# is read and written as it is (transformers writes back 2 (W // 2), the same band).

GEMMA3_ENCODER_CONFIG = replace(
    GEMMA3_CONFIG.variant(
        "gemma3_text",
        without=("use_bidirectional_attention", "num_hidden_layers"),
        keys=(
            Key("num_hidden_layers", "n_encoder_layers"),
            Key("use_bidirectional_attention", None, True, allowed=(True,)),
        ),
        supports={"tie_embeddings": ANY},  # no output projection: the key is kept for writing back
    ),
    fixed={"n_decoder_layers": 0},
)


GEMMA3_ENCODER = declared(
    GEMMA3_ENCODER_CONFIG,
    model_class="EncoderModel",
    architecture="Gemma3TextModel",
    prefixes=("", "model."),
    rules=tuple(
        replace(rule, ours="encoder." + rule.ours.removeprefix("decoder."))
        for rule in GEMMA3_TEXT.rules
        if rule.ours.startswith("decoder.")
    ),
    skipped=(),
    flag="use_bidirectional_attention",
)

# what this file adds to transformer_spec.families.FAMILIES (found by the package, no list to edit)
REGISTER = (GEMMA3_TEXT,)
# a class of the model_type read differently: told apart by config.json's use_bidirectional_attention (Family.flag)
REGISTER_BY_ARCHITECTURE = (GEMMA3_ENCODER,)
