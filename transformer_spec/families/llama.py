"""Llama (LlamaForCausalLM): pre-norm RMSNorm decoder, rotary positions, SwiGLU, grouped-query attention, no biases."""

from __future__ import annotations

from dataclasses import replace

from ..config import LAYER_TYPES, RopeScaling, TransformerConfig
from .core import (
    ACTIVATION_KEY,
    ANY,
    OMITTED,
    ConfigMap,
    Key,
    Rule,
    activation_to_hf,
    declared,
    mlp_bias,
    pretraining_tp,
    refuse,
    renamed,
    special_token,
)
from .rope import effective_rope, in_rope_scaling, read_scaling, rope_theta_of, scaling_to_hf, type_key

# config.json's dropout rates -> our sites (core.dropout_from_hf)
LLAMA_DROPOUT = {"attention_dropout": (("attention",), 0.0)}


def rope_theta(value, c: dict) -> float:
    """RoPE's base from the RoPE object transformers reads (rope_scaling when the file has one, else
    rope_parameters), else the top-level rope_theta."""
    return rope_theta_of(c)


def rope_scaling(value, c: dict) -> RopeScaling | None:
    """The scaled RoPE of config.json (rope_scaling, else rope_parameters): linear, dynamic, yarn, longrope or
    llama3; None for plain RoPE."""
    return read_scaling(*reversed(effective_rope(c)))


def kept_longrope_cache(value, c: dict) -> bool:
    """rope_cache_remade: False beside a LongRoPE scaling (transformers' generic generate(), every family's but
    Phi-3's, keeps the keys it cached with the short factors past the original length), else True (nothing to
    remake)."""
    scaling = rope_scaling(value, c)
    return scaling is None or scaling.rope_type != "longrope"


def rope_parameters_json(config: TransformerConfig, as_read: dict) -> dict | object:
    """rope_parameters for config.json: the base, and the scaling unless config.json as read held it in a
    rope_scaling (not written beside one, which transformers would read instead)."""
    scaling = config.rope_scaling
    if scaling is None:
        return {"rope_type": "default", "rope_theta": config.rope_theta}
    if in_rope_scaling(as_read):
        return OMITTED
    return scaling_to_hf(scaling, kind_key=type_key(as_read)) | {"rope_theta": config.rope_theta}


def rope_scaling_json(config: TransformerConfig, as_read: dict) -> dict | object:
    """rope_scaling for config.json, when config.json as read held the scaling there (its kind under the file's key);
    null there when the scaling was taken off after loading (hf.save starts from the file as read)."""
    if not in_rope_scaling(as_read):
        return OMITTED
    scaling = config.rope_scaling
    return None if scaling is None else scaling_to_hf(scaling, kind_key=type_key(as_read))


def kv_heads(value, c: dict) -> int | None:
    """num_key_value_heads -> n_kv_heads: None (every head its own keys and values) when it equals the heads."""
    heads = c["num_attention_heads"]
    return None if (value or heads) == heads else value


def head_dim(value, c: dict) -> int | None:
    """head_dim -> the config's head_dim: config.json's, when it differs from hidden_size / num_attention_heads
    (Qwen3's); else None (the heads split d_model evenly)."""
    if value is None or value * c["num_attention_heads"] == c["hidden_size"]:
        return None
    return int(value)  # a positive int: the value checks read it first


LLAMA_CONFIG = ConfigMap(
    model_type="llama",
    keys=(
        Key("vocab_size", ("tgt_vocab_size", "src_vocab_size")),
        Key("hidden_size", "d_model"),
        Key("num_attention_heads", "n_heads"),
        Key("num_key_value_heads", "n_kv_heads", None, kv_heads, source="kv_heads"),
        Key("head_dim", "head_dim", None, head_dim, source="d_head"),
        Key("intermediate_size", "d_ff"),
        Key("num_hidden_layers", "n_decoder_layers"),
        Key("hidden_act", "activation", "silu", write=activation_to_hf, **ACTIVATION_KEY),
        Key("max_position_embeddings", "max_len", 2048),
        Key("rms_norm_eps", "layer_norm_eps", 1e-6),
        Key("rope_theta", "rope_theta", 10000.0, lambda value, c: float(value)),
        Key("rope_parameters", "rope_theta", None, rope_theta, source=rope_parameters_json, spelled=True),
        Key("rope_scaling", "rope_scaling", None, rope_scaling, source=rope_scaling_json, spelled=True),
        Key("rope_scaling", "rope_cache_remade", None, kept_longrope_cache, written=False),
        Key("attention_bias", "bias", False, lambda value, c: bool(value)),
        Key("mlp_bias", "ffn_bias", False, mlp_bias, source="has_ffn_bias"),
        Key("tie_word_embeddings", "tie_embeddings", False),
        Key("pad_token_id", "pad_id", None, special_token("pad_token_id")),
        Key("bos_token_id", "bos_id", None, special_token("bos_token_id")),
        Key("eos_token_id", "eos_id", None, special_token("eos_token_id")),
        # embed_tokens: nn.Embedding(padding_idx=pad), so the pad row gets no gradient from lookups
        Key("pad_token_id", "embedding_padding_idx", None, lambda value, c: value is not None, written=False),
        Key("pretraining_tp", None, 1, read=pretraining_tp, written=False),
    ),
    dropout=LLAMA_DROPOUT,
    supports={
        "activation": ("silu", "relu", "gelu"),
        "norm": "rms",
        "norm_first": True,
        "positional": "rope",
        "rope_theta": ANY,
        "rope_scaling": ANY,
        "gated_ffn": True,
        "n_kv_heads": ANY,
        "bias": ANY,
        "qkv_bias": lambda c: (None, c.bias),
        "ffn_bias": ANY,
        "tie_embeddings": ANY,
        "scale_embeddings": False,
        "output_bias": False,
        "head_dim": ANY,
    },  # fmt: skip
    fixed={"n_encoder_layers": 0},
)
LLAMA_SUPPORTS = LLAMA_CONFIG.supports
LLAMA = declared(
    LLAMA_CONFIG,
    model_class="TransformerLM",
    architecture="LlamaForCausalLM",
    prefixes=("model.", ""),
    rules=(
        Rule("decoder.token_embedding.weight", "embed_tokens.weight"),
        Rule("decoder.layers.{i}.self_attn_norm.weight", "layers.{i}.input_layernorm.weight"),
        *(
            Rule(
                f"decoder.layers.{{i}}.self_attn.{p}_proj.{w}",
                f"layers.{{i}}.self_attn.{p if p != 'out' else 'o'}_proj.{w}",
            )
            for p in ("q", "k", "v", "out")
            for w in ("weight", "bias")
        ),
        Rule("decoder.layers.{i}.ffn_norm.weight", "layers.{i}.post_attention_layernorm.weight"),
        *renamed(
            "decoder.layers.{i}.ffn",
            "layers.{i}.mlp",
            (("gate", "gate_proj"), ("linear1", "up_proj"), ("linear2", "down_proj")),
        ),
        Rule("decoder.final_norm.weight", "norm.weight"),
        Rule("output_proj.weight", "lm_head.weight", head=True),  # only when untied
    ),
    skipped=(
        r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq",  # a buffer of older checkpoints: recomputed
        r"lm_head\.weight",  # when tied: a copy of embed_tokens.weight
    ),
    tied=(("lm_head.weight", "model.embed_tokens.weight", "tie_embeddings"),),
)


# ----------------------------------------------------------------------------------------------
# Mistral (MistralForCausalLM): Llama with a sliding window on its causal self-attention (query i sees the
# keys i - window < j <= i), and no biases. Qwen2 (Qwen2ForCausalLM): Llama with biases on q, k and v but not
# on the output projection nor the MLP. Both read and write Llama's table: only the config translation differs.


MISTRAL_CONFIG = LLAMA_CONFIG.variant(
    "mistral",
    without=("attention_bias", "mlp_bias"),  # MistralConfig has neither: no biases anywhere
    keys=(Key("sliding_window", "sliding_window", None, lambda value, c: None if value is None else int(value)),),
    supports={"sliding_window": ANY, "bias": False, "qkv_bias": (None, False), "ffn_bias": None},
)


def qwen2_window(value, c: dict) -> int | None:
    """sliding_window -> the window: only when use_sliding_window (Qwen2Config: else no layer slides)."""
    return int(value) if c.get("use_sliding_window", False) and value is not None else None


def qwen2_layer_types(value, c: dict) -> tuple | None:
    """layer_types -> each layer's kind, when a window is in use: as listed, or Qwen2Config's rule (the layers
    from max_window_layers on slide); None without a window."""
    if qwen2_window(c.get("sliding_window"), c) is None:
        return None
    if value is None:
        first = c.get("max_window_layers", 28)
        value = ["sliding_attention" if i >= first else "full_attention" for i in range(c["num_hidden_layers"])]
    if not isinstance(value, list):
        refuse("layer_types", value, f"a list of {LAYER_TYPES}")
    return tuple(value)


def first_sliding_layer(config: TransformerConfig) -> int:
    """max_window_layers as Qwen2Config reads it: the first layer that slides (every layer, without layer_types)."""
    kinds = config.layer_types or ("sliding_attention",) * config.n_decoder_layers
    return next((i for i, kind in enumerate(kinds) if kind == "sliding_attention"), config.n_decoder_layers)


QWEN2_CONFIG = LLAMA_CONFIG.variant(
    "qwen2",
    without=("attention_bias", "mlp_bias"),  # Qwen2Config: q, k, v biases always, nothing else
    keys=(
        Key("use_sliding_window", None, False, source=lambda config: config.sliding_window is not None),
        Key("sliding_window", "sliding_window", None, qwen2_window),
        Key("layer_types", "layer_types", None, qwen2_layer_types, lambda kinds: kinds and list(kinds)),
        Key("max_window_layers", None, 28, source=first_sliding_layer),
    ),
    supports={"bias": False, "qkv_bias": True, "ffn_bias": None, "sliding_window": ANY, "layer_types": ANY},
)
MISTRAL = replace(
    LLAMA, model_type="mistral", architecture="MistralForCausalLM", from_hf=MISTRAL_CONFIG.from_hf,
    to_hf=MISTRAL_CONFIG.to_hf, supports=MISTRAL_CONFIG.supports,
)  # fmt: skip
QWEN2 = replace(
    LLAMA, model_type="qwen2", architecture="Qwen2ForCausalLM", from_hf=QWEN2_CONFIG.from_hf,
    to_hf=QWEN2_CONFIG.to_hf, supports=QWEN2_CONFIG.supports,
)  # fmt: skip

# what this file adds to transformer_spec.families.FAMILIES (found by the package, no list to edit)
REGISTER = (LLAMA, MISTRAL, QWEN2)
