"""GPT-OSS (GptOssForCausalLM, model_type gpt_oss): Llama's pre-norm RMSNorm decoder with grouped-query attention
whose projections have biases (attention_bias) and whose softmax has a learned sink logit per head in its
denominator (self_attn.sinks: `attn_sinks`), sliding and full layers alternating (layer_types; GptOssConfig's rule
when absent: layer i slides when i is even, sliding_window keys), YaRN RoPE (GptOssConfig's default when the file
names no RoPE: factor 32 over 4096 positions, beta_fast 32, beta_slow 1, truncate false), and every feed-forward
block a mixture of experts of GPT-OSS's own kind (`expert_kind` "gpt_oss"): a router with a bias whose top-k logits
are softmaxed (num_experts_per_tok of num_local_experts), experts with biases, their gate and up columns interleaved
in gate_up_proj (E, D, 2F), F = intermediate_size, and a clamped SwiGLU (swiglu_limit, swiglu_alpha). The tensors
keep transformers' names and layouts (mlp.router.*, mlp.experts.* below each layer; ours ffn.router.*, ffn.experts.*).

Refused by name: quantization_config (the released files' MXFP4 expert blocks: dequantising them is not computed
here), output_router_logits true (transformers then adds the load-balancing loss to its loss: ours computes it on
request, load_balancing_loss), a hidden_act other than silu (transformers' experts never read it; it is kept as
written). Not computed by transformers either, and read without effect: the released file's initial_context_length
and experts_per_token (the original release's own names; transformers reads rope_scaling and num_experts_per_tok).
"""

from __future__ import annotations

from dataclasses import replace

from ..config import LAYER_TYPES, RopeScaling
from .core import ANY, Key, Rule, declared, is_finite_number, is_int, refuse
from .llama import LLAMA, LLAMA_CONFIG, rope_parameters_json, rope_scaling_json
from .rope import effective_rope, read_scaling, rope_theta_of

# GptOssConfig's RoPE when config.json names none (its __post_init__), and its base (default_theta)
GPT_OSS_DEFAULT_ROPE = {
    "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
    "original_max_position_embeddings": 4096,
}  # fmt: skip
GPT_OSS_THETA = 150000.0


def gpt_oss_rope(c: dict) -> tuple[str, dict]:
    """(where, the RoPE object) transformers reads: rope_scaling or rope_parameters, as Llama's; GptOssConfig's YaRN
    when the file has neither (or a rope_parameters that names no kind)."""
    where, rope = effective_rope(c)
    if "rope_type" not in rope and "type" not in rope:
        return where, GPT_OSS_DEFAULT_ROPE | rope
    return where, rope


def rope_theta(value, c: dict) -> float:
    """The base: the RoPE object's rope_theta, else the top-level one, else GptOssConfig's 150000."""
    return rope_theta_of(c, GPT_OSS_THETA)


def rope_scaling(value, c: dict) -> RopeScaling | None:
    """The scaled RoPE: the file's, or GptOssConfig's YaRN when it names none."""
    where, rope = gpt_oss_rope(c)
    return read_scaling(rope, where)


def layer_types(value, c: dict) -> tuple:
    """layer_types -> each layer's kind: as listed, or GptOssConfig's rule (layers 0, 2, 4, ... slide)."""
    if value is None:
        value = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(c["num_hidden_layers"])]
    if not isinstance(value, list):
        refuse("layer_types", value, f"a list of {LAYER_TYPES}")
    return tuple(value)


def sliding_window(value, c: dict) -> int | None:
    """sliding_window -> the window of the sliding layers (GptOssConfig's 128 when absent); a positive int."""
    if value is None:
        return None
    if not (is_int(value) and value >= 1):
        refuse("sliding_window", value, "a positive int or null")
    return int(value)


def positive(name: str):
    """The reader of a finite positive number `name` (swiglu_limit, swiglu_alpha)."""

    def read(value, c: dict) -> float:
        if not (is_finite_number(value) and value > 0):
            refuse(name, value, "a finite positive number")
        return float(value)

    return read


def written_layer_types(config) -> list | None:
    """layer_types for config.json: the list (every layer said)."""
    return None if config.layer_types is None else list(config.layer_types)


GPT_OSS_CONFIG = LLAMA_CONFIG.variant(
    "gpt_oss",
    without=(
        "mlp_bias",
        "rope_theta",
        "rope_parameters",
        "rope_scaling",
        "hidden_act",
        "max_position_embeddings",
        "rms_norm_eps",
        "attention_bias",
    ),  # fmt: skip
    keys=(
        Key("max_position_embeddings", "max_len", 131072),
        Key("rms_norm_eps", "layer_norm_eps", 1e-5),
        Key("attention_bias", "bias", True, lambda value, c: bool(value)),
        # the experts' clamped SwiGLU reads no activation: transformers keeps hidden_act unread, so do we (silu only)
        Key("hidden_act", None, "silu", allowed=("silu",)),
        Key("rope_theta", "rope_theta", GPT_OSS_THETA, lambda value, c: float(value), written=False),
        Key("rope_parameters", "rope_theta", None, rope_theta, source=rope_parameters_json, spelled=True),
        Key("rope_scaling", "rope_scaling", None, rope_scaling, source=rope_scaling_json, spelled=True),
        Key("sliding_window", "sliding_window", 128, sliding_window),
        Key("layer_types", "layer_types", None, layer_types, source=written_layer_types),
        Key("num_local_experts", "n_experts", 128),
        Key("num_experts_per_tok", "top_k", 4),
        Key("router_aux_loss_coef", "router_aux_loss_coef", 0.001, lambda value, c: float(value)),
        Key("swiglu_limit", "swiglu_limit", 7.0, positive("swiglu_limit")),
        Key("swiglu_alpha", "swiglu_alpha", 1.702, positive("swiglu_alpha")),
        Key("output_router_logits", None, False, allowed=(False, None)),
        Key("quantization_config", None, None, allowed=(None,), written=False),
    ),
    supports={
        "bias": ANY,
        "qkv_bias": None,
        "ffn_bias": None,
        "sliding_window": ANY,
        "layer_types": ANY,
        "n_experts": ANY,
        "top_k": ANY,
        "router_aux_loss_coef": ANY,
        "expert_kind": "gpt_oss",
        "swiglu_limit": ANY,
        "swiglu_alpha": ANY,
        "attn_sinks": True,
        "activation": "silu",
    },  # fmt: skip
)

GPT_OSS_RULES = (
    Rule("decoder.layers.{i}.self_attn.sinks", "layers.{i}.self_attn.sinks"),
    Rule("decoder.layers.{i}.ffn.router.weight", "layers.{i}.mlp.router.weight"),
    Rule("decoder.layers.{i}.ffn.router.bias", "layers.{i}.mlp.router.bias"),
    *(
        Rule(f"decoder.layers.{{i}}.ffn.experts.{name}", f"layers.{{i}}.mlp.experts.{name}")
        for name in ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")
    ),
)

GPT_OSS = declared(
    GPT_OSS_CONFIG,
    model_class="TransformerLM",
    architecture="GptOssForCausalLM",
    prefixes=LLAMA.prefixes,
    rules=LLAMA.rules + GPT_OSS_RULES,
    skipped=LLAMA.skipped,
    tied=LLAMA.tied,
)
GPT_OSS = replace(GPT_OSS, supports=GPT_OSS_CONFIG.supports)

# what this file adds to transformer_spec.families.FAMILIES (found by the package, no list to edit)
REGISTER = (GPT_OSS,)
