"""ModernBERT (ModernBertModel; ModernBertForMaskedLM's base): a pre-norm encoder with rotary positions, every
global_attn_every_n_layers-th layer global and the others a bidirectional local band (keys |i - j| <=
local_attention // 2) with a rotary base of their own, scaled RoPE of any kind transformers computes (per layer
kind: rope_parameters[kind], or a rope_scaling on both), a fused Wqkv, GeGLU from a fused Wi, LayerNorms without
biases (norm_bias), no linear biases, no attention norm on the first layer, a norm on the token embeddings (no
positions) and a final norm.

transformers' ModernBertMLP reads `input, gate = Wi(x).chunk(2)` and computes Wo(act(input) * gate): Wi's first half
is our activated `ffn.gate`, its second our `ffn.linear1` (Llama's names: act(gate(x)) * up(x))."""

from __future__ import annotations

from ..config import LAYER_TYPES, RopeScaling, TransformerConfig
from .core import (
    ANY,
    OMITTED,
    ConfigMap,
    Key,
    Rule,
    declared,
    fused_qkv,
    is_finite_number,
    is_int,
    mlp_bias,
    refuse,
    renamed,
    special_token,
)
from .rope import in_rope_scaling, kind_rope, local_rope, read_scaling, scaling_to_hf

# config.json's dropout rates -> our sites (core.dropout_from_hf). Its attention_dropout drops the attention
# probabilities and the attention's output but not the MLP's, which no site of ours expresses: refused unless 0.
MODERNBERT_DROPOUT = {"embedding_dropout": (("embedding",), 0.0), "mlp_dropout": (("activation",), 0.0)}
# each kind of layer's rotary base: rope_parameters[kind]["rope_theta"], or the key older files hold, or the default
THETA = {"full_attention": ("global_rope_theta", 160_000.0), "sliding_attention": ("local_rope_theta", 10_000.0)}


def layer_kinds(value, c: dict) -> tuple[str, ...]:
    """layer_types -> each layer's kind: as listed, or (older files) ModernBertConfig's rule: layer i is global
    ("full_attention") when i % global_attn_every_n_layers == 0, local ("sliding_attention") otherwise."""
    n = c["num_hidden_layers"]
    if value is None:
        every = c.get("global_attn_every_n_layers", 3)
        if not is_int(every) or every < 1:
            refuse("global_attn_every_n_layers", every, "a positive integer")
        value = ["sliding_attention" if i % every else "full_attention" for i in range(n)]
    if not isinstance(value, list) or len(value) != n or any(kind not in LAYER_TYPES for kind in value):
        refuse("layer_types", value, f"a list of {n} kinds, one per layer, each one of {LAYER_TYPES}")
    return tuple(value)


def has_local_layers(c: dict) -> bool:
    return "sliding_attention" in layer_kinds(c.get("layer_types"), c)


def theta(c: dict, kind: str) -> float:
    """The rotary base of `kind`'s layers: its RoPE object's (rope_parameters[kind], a top-level rope_scaling merged
    in: kind_rope), or the key older files hold (global_rope_theta, local_rope_theta), or ModernBertConfig's default
    (THETA)."""
    old_key, default = THETA[kind]
    where, rope = kind_rope(c, kind, LAYER_TYPES)
    value = rope.get("rope_theta", c.get(old_key, default))
    if not is_finite_number(value) or value <= 0:
        refuse(f"{where}.rope_theta", value, "a positive number")
    return float(value)


def scaling(c: dict, kind: str) -> RopeScaling | None:
    """The scaled RoPE of `kind`'s layers (any kind transformers computes: ModernBertRotaryEmbedding initialises
    each layer kind from its own RoPE object, a top-level rope_scaling merged into both); None: plain."""
    where, rope = kind_rope(c, kind, LAYER_TYPES)
    return read_scaling(rope, where)


def own_local_rope(c: dict) -> bool:
    """Whether the local layers' RoPE differs from the global ones' (base or scaling): then it is a config field of
    its own (rope_local_theta, rope_local_scaling)."""
    kinds = ("full_attention", "sliding_attention")
    return has_local_layers(c) and len({(theta(c, kind), scaling(c, kind)) for kind in kinds}) == 2


def local_theta(value, c: dict) -> float | None:
    """The local layers' base (rope_local_theta): None without local layers, or when their RoPE is the global one."""
    return theta(c, "sliding_attention") if own_local_rope(c) else None


def local_scaling(value, c: dict) -> RopeScaling | None:
    """The local layers' scaled RoPE (rope_local_scaling), when their RoPE is their own (local_theta)."""
    return scaling(c, "sliding_attention") if own_local_rope(c) else None


def local_window(value, c: dict) -> int | None:
    """local_attention -> our sliding_window (an encoder's band |i - j| <= sliding_window // 2, ModernBERT's
    local_attention // 2); None without local layers."""
    if not has_local_layers(c):
        return None
    if not is_int(value) or value < 1:
        refuse("local_attention", value, "a positive integer")
    return value


def top_level_scaling(config: TransformerConfig, as_read: dict) -> RopeScaling | None:
    """The scaling written as a top-level rope_scaling (which transformers merges into both kinds): the global one,
    where config.json as read held it there and the local layers share it."""
    global_scaling = config.rope_scaling
    if global_scaling is None or not in_rope_scaling(as_read):
        return None
    return global_scaling if local_rope(config)[1] == global_scaling else None


def rope_parameters(config: TransformerConfig, as_read: dict) -> dict:
    """Each kind's base, as ModernBertConfig writes them, with its scaling unless that goes in rope_scaling."""
    top = top_level_scaling(config, as_read)

    def kind(base: float, kind_scaling: RopeScaling | None) -> dict:
        if kind_scaling is None or top is not None:  # plain, or scaled by the top-level rope_scaling
            return {"rope_type": "default", "rope_theta": base}
        return scaling_to_hf(kind_scaling) | {"rope_theta": base}

    return {
        "full_attention": kind(config.rope_theta, config.rope_scaling),
        "sliding_attention": kind(*local_rope(config)),
    }


def rope_scaling_json(config: TransformerConfig, as_read: dict) -> dict | object:
    top = top_level_scaling(config, as_read)
    return OMITTED if top is None else scaling_to_hf(top)


MODERNBERT_CONFIG = ConfigMap(
    model_type="modernbert",
    keys=(
        Key("vocab_size", ("src_vocab_size", "tgt_vocab_size")),
        Key("hidden_size", "d_model"),
        Key("num_attention_heads", "n_heads"),
        Key("intermediate_size", "d_ff"),
        Key("num_hidden_layers", "n_encoder_layers"),
        Key(
            "hidden_activation",
            "activation",
            "gelu",
            lambda value, c: {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu", "silu": "silu"}[value],
            lambda value: {"gelu_tanh": "gelu_pytorch_tanh"}.get(value, value),
            allowed=("gelu", "gelu_pytorch_tanh", "relu", "silu"),
        ),
        Key("max_position_embeddings", "max_len", 8192),
        Key("norm_eps", "layer_norm_eps", 1e-5),
        Key("norm_bias", "norm_bias", False, lambda value, c: bool(value)),
        Key("attention_bias", "bias", False, lambda value, c: bool(value)),
        Key("mlp_bias", "ffn_bias", False, mlp_bias, source="has_ffn_bias"),
        Key("attention_dropout", None, 0.0, allowed=(0, 0.0, None)),
        Key("pad_token_id", "pad_id", None, special_token("pad_token_id")),
        Key("bos_token_id", "bos_id", None, special_token("bos_token_id")),
        Key("eos_token_id", "eos_id", None, special_token("eos_token_id")),
        Key("cls_token_id", None, None, source="bos_id", read_too=False),  # [CLS] is the start token, [SEP] the end
        Key("sep_token_id", None, None, source="eos_id", read_too=False),
        Key(
            "layer_types",
            "layer_types",
            None,
            layer_kinds,
            list,
            source=lambda config: config.layer_types or ("full_attention",) * config.n_encoder_layers,
        ),
        Key("local_attention", "sliding_window", 128, local_window, source=lambda config: config.sliding_window or 128),
        Key(
            "rope_parameters",
            "rope_theta",
            None,
            lambda value, c: theta(c, "full_attention"),
            source=rope_parameters,
            spelled=True,
        ),
        Key("rope_parameters", "rope_local_theta", None, local_theta, written=False),
        Key(
            "rope_scaling",
            "rope_scaling",
            None,
            lambda value, c: scaling(c, "full_attention"),
            source=rope_scaling_json,
            spelled=True,
        ),
        Key("rope_parameters", "rope_local_scaling", None, local_scaling, written=False),
        # tok_embeddings: nn.Embedding(padding_idx=pad), so the pad row gets no gradient from lookups
        Key("pad_token_id", "embedding_padding_idx", None, lambda value, c: value is not None, written=False),
    ),
    dropout=MODERNBERT_DROPOUT,
    supports={  # an encoder: no output projection, so its fields take any value
        "activation": ("gelu", "gelu_tanh", "relu", "silu"),
        "norm_first": True,
        "positional": "rope",
        "rope_theta": ANY,
        "scale_embeddings": False,
        "gated_ffn": True,
        "bias": ANY,
        "ffn_bias": ANY,
        "embedding_norm": True,
        "norm_bias": ANY,
        "first_attn_norm": False,
        "layer_types": ANY,
        "sliding_window": lambda c: ANY if c.layer_types is not None else None,  # read only by local layers
        "rope_local_theta": ANY,
        "rope_scaling": ANY,
        "rope_local_scaling": ANY,
        "tie_embeddings": ANY,
        "share_embeddings": ANY,
        "output_bias": ANY,
    },  # fmt: skip
    fixed={"n_decoder_layers": 0},
)


LAYER = "layers.{i}"
MODERNBERT = declared(
    MODERNBERT_CONFIG,
    model_class="EncoderModel",
    architecture="ModernBertModel",
    prefixes=("", "model."),
    rules=(
        Rule("encoder.token_embedding.weight", "embeddings.tok_embeddings.weight"),
        *(Rule(f"encoder.embedding_norm.{w}", f"embeddings.norm.{w}") for w in ("weight", "bias")),
        *fused_qkv("encoder.layers.{i}.self_attn", f"{LAYER}.attn.Wqkv"),  # Wqkv = [q; k; v], each H * Dh rows
        *renamed(
            "encoder.layers.{i}",
            LAYER,
            (
                ("self_attn_norm", "attn_norm"),  # none on layer 0 (first_attn_norm False)
                ("self_attn.out_proj", "attn.Wo"),
                ("ffn_norm", "mlp_norm"),
                ("ffn.linear2", "mlp.Wo"),
            ),
        ),
        *(  # Wi = [input; gate], act(input) * gate: ours act(gate) * linear1
            Rule(f"encoder.layers.{{i}}.ffn.{ours}.{w}", f"{LAYER}.mlp.Wi.{w}", part=(k, 2))
            for k, ours in enumerate(("gate", "linear1"))
            for w in ("weight", "bias")
        ),
        *(Rule(f"encoder.final_norm.{w}", f"final_norm.{w}") for w in ("weight", "bias")),
    ),
    skipped=(
        r"head\..*",  # ModernBertForMaskedLM's prediction head (dense, act, norm) and its decoder
        r"decoder\..*",
    ),
)


# ----------------------------------------------------------------------------------------------
# ModernBertForMaskedLM: the same encoder under "model.", and its head: logits = decoder(norm(act(dense(h)))), the
# decoder tied to tok_embeddings (config.mlm_head; the head's activation is the encoder's, its dense bias `bias`).


def check_equal(c: dict, key: str, other: str, default):
    """config.json's `key` (the head's), refused unless it equals `other`'s (the encoder's): our head reuses it."""
    value, expected = c.get(key, default), c.get(other, default)
    if value != expected:
        refuse(key, value, f"the value of {other} ({expected!r}): the head uses the encoder's")
    return value


def activation_to_modernbert(value: str) -> str:
    return {"gelu_tanh": "gelu_pytorch_tanh"}.get(value, value)


MODERNBERT_MLM_CONFIG = MODERNBERT_CONFIG.variant(
    "modernbert",
    keys=(
        Key(
            "classifier_activation",
            None,
            "gelu",
            lambda value, c: check_equal(c, "classifier_activation", "hidden_activation", "gelu"),
            source=lambda config: activation_to_modernbert(config.activation),
        ),
        Key(
            "classifier_bias",
            None,
            False,
            lambda value, c: check_equal(c, "classifier_bias", "attention_bias", False),
            source="bias",
        ),
        Key("decoder_bias", "output_bias", True, lambda value, c: bool(value)),
        Key("tie_word_embeddings", None, True, allowed=(True,)),
    ),
    supports={"mlm_head": True, "output_bias": ANY},
)
MODERNBERT_MLM = declared(
    MODERNBERT_MLM_CONFIG,
    model_class="EncoderModel",
    architecture="ModernBertForMaskedLM",
    prefixes=("model.",),
    rules=(
        *MODERNBERT.rules,
        *(
            Rule(f"mlm_head.{ours}.{w}", f"head.{ours}.{w}", head=True)
            for ours in ("dense", "norm")
            for w in ("weight", "bias")
        ),
        Rule("mlm_head.bias", "decoder.bias", head=True),
    ),
    skipped=(r"decoder\.weight",),  # tied: tok_embeddings itself (tie_word_embeddings False is refused)
)

# what this file adds to transformer_spec.families.FAMILIES (found by the package, no list to edit), and the masked-LM
# class, read by its architecture
REGISTER = (MODERNBERT,)
REGISTER_BY_ARCHITECTURE = (MODERNBERT_MLM,)
