"""DeepSeek-V3 (DeepseekV3ForCausalLM, model_type deepseek_v3; R1's files too): Llama's pre-norm RMSNorm decoder with
DeepSeek's multi-head latent attention (kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim:
numpy_transformer.latent_attention) and mixture of experts (numpy_transformer.deepseek_moe: sigmoid scores,
e_score_correction_bias that chooses and does not weigh, n_group / topk_group group-limited top-k, norm_topk_prob,
routed_scaling_factor, n_shared_experts; the first first_k_dense_replace layers dense, intermediate_size wide, the
experts moe_intermediate_size wide). Ours: head_dim = qk_nope_head_dim + qk_rope_head_dim, rotary_dim =
qk_rope_head_dim (the head's last features, turned in interleaved pairs, rope_interleave), attention_scale =
head_dim^-1/2 times YaRN's mscale(factor, mscale_all_dim) squared (transformers' yarn_apply_mscale).

Read and not computed by transformers either: aux_loss_alpha, ep_size, num_nextn_predict_layers (the multi-token
prediction layer, model.layers.61 in the released files: skipped, as transformers skips it), initializer_range.
Refused by name: quantization_config (the released files are fp8, block-quantised: not read here), a scoring_func
other than sigmoid, a topk_method other than noaux_tc, moe_layer_freq other than 1, rope_interleave false,
attention_bias true, num_key_value_heads other than the heads."""

from __future__ import annotations

import math
from functools import partial

from .core import ANY, Key, Rule, declared, is_int, refuse, renamed, special_token
from .llama import LLAMA, LLAMA_CONFIG
from .mixtral import fuse_experts
from .rope import effective_rope


def qk_head_dim(value, c: dict) -> int:
    """qk_nope_head_dim -> our head_dim, the query/key head's whole width: qk_nope_head_dim + qk_rope_head_dim."""
    rope = c.get("qk_rope_head_dim", 64)
    if not (is_int(value) and value >= 1 and is_int(rope) and rope >= 2 and rope % 2 == 0):
        refuse("qk_nope_head_dim", value, "a positive int beside an even qk_rope_head_dim")
    return value + rope


def latent_scale(value, c: dict) -> float | None:
    """The softmax scale of latent attention: (qk_nope_head_dim + qk_rope_head_dim)^-1/2, times mscale^2 with
    mscale = 0.1 mscale_all_dim ln(factor) + 1 (1 for factor <= 1) when the RoPE object is scaled and sets
    mscale_all_dim (transformers' yarn_apply_mscale); None (the plain head_dim^-1/2) otherwise."""
    _, rope = effective_rope(c)
    kind = rope.get("rope_type", rope.get("type", "default"))
    scale = (c.get("qk_nope_head_dim", 128) + c.get("qk_rope_head_dim", 64)) ** (-0.5)
    if kind == "default" or not rope.get("mscale_all_dim"):
        return None
    factor = rope["factor"]
    mscale = 1.0 if factor <= 1 else 0.1 * rope["mscale_all_dim"] * math.log(factor) + 1.0
    return scale * mscale * mscale


def dense_first(value, c: dict) -> tuple[int, ...]:
    """first_k_dense_replace -> dense_layers: the first k layers keep the dense MLP (intermediate_size wide)."""
    if value is None:
        value = 0
    if not is_int(value) or value < 0:
        refuse("first_k_dense_replace", value, "an int >= 0")
    return tuple(range(min(value, c["num_hidden_layers"])))


def experts_per_token(value, c: dict) -> int:
    """num_experts_per_tok: a positive int (DeepseekV2Config's default, None, runs no router)."""
    if not (is_int(value) and value >= 1):
        refuse("num_experts_per_tok", value, "a positive int")
    return value


def same_heads(value, c: dict) -> None:
    """num_key_value_heads: latent attention expands the latent into every head's keys and values; the count must be
    the heads' (or absent)."""
    if value is not None and value != c["num_attention_heads"]:
        refuse("num_key_value_heads", value, f"None or num_attention_heads={c['num_attention_heads']}")


def rope_head_dim(value, c: dict) -> None:
    """head_dim (written by transformers' config: qk_rope_head_dim, the rotary part): absent or that."""
    if value is not None and value != c.get("qk_rope_head_dim", 64):
        refuse("head_dim", value, f"None or qk_rope_head_dim={c.get('qk_rope_head_dim', 64)}")


def latent_keys(defaults: dict) -> tuple[Key, ...]:
    """The keys of latent attention and of DeepSeek's experts common to V2 and V3 (defaults: the config class's)."""
    return (
        Key("num_key_value_heads", None, None, same_heads, source=lambda config: config.n_heads),
        Key("head_dim", None, None, rope_head_dim, written=False),
        Key("qk_head_dim", None, None, written=False),  # transformers' config writes nope + rope: ours is head_dim
        Key("kv_lora_rank", "kv_lora_rank", defaults["kv_lora_rank"]),
        Key("q_lora_rank", "q_lora_rank", defaults["q_lora_rank"]),
        Key("qk_nope_head_dim", "head_dim", 128, qk_head_dim, source=lambda config: config.d_head - config.rope_dim),
        Key("qk_rope_head_dim", "rotary_dim", 64, source="rope_dim"),
        Key("v_head_dim", "v_head_dim", 128, source="value_dim"),
        Key("rope_scaling", "attention_scale", None, latent_scale, written=False),  # YaRN's mscale on the scores
        Key("attention_bias", None, False, allowed=(False,)),
        Key("n_routed_experts", "n_experts", defaults["n_routed_experts"]),
        Key("num_experts_per_tok", "top_k", defaults["num_experts_per_tok"], experts_per_token),
        Key("moe_intermediate_size", "d_expert", defaults["moe_intermediate_size"], source="expert_width"),
        Key("n_shared_experts", "n_shared_experts", defaults["n_shared_experts"], lambda value, c: value or 0),
        Key("routed_scaling_factor", "routed_scaling", defaults["routed_scaling_factor"], lambda v, c: float(v)),
        Key("first_k_dense_replace", "dense_layers", defaults["first_k_dense_replace"], dense_first, len),
        Key("moe_layer_freq", None, 1, allowed=(1,)),  # every layer after the dense ones is sparse
        Key("aux_loss_alpha", None, 0.001, written=False),  # a training loss's weight: computed by no forward
        Key("ep_size", None, 1, written=False),  # expert parallelism over devices: the same numbers
        Key("quantization_config", None, None, allowed=(None,), written=False),  # fp8 weights: not read here
    )


V3_DEFAULTS = {
    "kv_lora_rank": 512, "q_lora_rank": 1536, "n_routed_experts": 256, "num_experts_per_tok": 8,
    "moe_intermediate_size": 2048, "n_shared_experts": 1, "routed_scaling_factor": 2.5, "first_k_dense_replace": 3,
}  # fmt: skip
LATENT_SUPPORTS = {
    "kv_lora_rank": ANY, "q_lora_rank": ANY, "v_head_dim": ANY, "rotary_dim": ANY, "head_dim": ANY,
    "attention_scale": ANY, "bias": False, "qkv_bias": None, "ffn_bias": (None, False), "n_kv_heads": None,
    "n_experts": ANY, "top_k": ANY, "d_expert": ANY, "n_shared_experts": ANY, "routed_scaling": ANY,
    "norm_topk_prob": ANY, "dense_layers": lambda config: (tuple(range(len(config.dense_layers))),),  # a prefix
}  # fmt: skip

DEEPSEEK_V3_CONFIG = LLAMA_CONFIG.variant(
    "deepseek_v3",
    without=("num_key_value_heads", "head_dim", "attention_bias", "mlp_bias", "bos_token_id", "eos_token_id"),
    keys=(
        *latent_keys(V3_DEFAULTS),
        Key("bos_token_id", "bos_id", 0, special_token("bos_token_id")),
        Key("eos_token_id", "eos_id", 1, special_token("eos_token_id")),
        Key("n_group", "router_groups", 8, lambda value, c: value or 1),
        Key("topk_group", "router_topk_groups", 4, lambda value, c: value or 1),
        Key("norm_topk_prob", "norm_topk_prob", True, lambda value, c: bool(value)),
        Key("rope_interleave", None, True, allowed=(True,)),  # False: the rotary part in rotate_half's layout
        Key("scoring_func", None, "sigmoid", allowed=("sigmoid",)),  # transformers' V3 router: sigmoid only
        Key("topk_method", None, "noaux_tc", allowed=("noaux_tc",)),  # the biased, group-limited choice
        Key("num_nextn_predict_layers", None, 1, written=False),  # the MTP layer: not part of the causal LM
    ),
    supports=LATENT_SUPPORTS
    | {"router_scoring": "sigmoid", "router_score_bias": True, "router_groups": ANY, "router_topk_groups": ANY},
)

# The Llama table without q/k/v/o, with latent attention's projections and DeepSeek's experts
LATENT_RULES = (
    *(rule for rule in LLAMA.rules if ".self_attn." not in rule.ours),
    *renamed(
        "decoder.layers.{i}.self_attn",
        "layers.{i}.self_attn",
        (
            ("q_proj", "q_proj"), ("q_a_proj", "q_a_proj"), ("q_a_norm", "q_a_layernorm"), ("q_b_proj", "q_b_proj"),
            ("kv_a_proj", "kv_a_proj_with_mqa"), ("kv_a_norm", "kv_a_layernorm"), ("kv_b_proj", "kv_b_proj"),
            ("out_proj", "o_proj"),
        ),
        ("weight",),
    ),
    Rule("decoder.layers.{i}.ffn.router.weight", "layers.{i}.mlp.gate.weight"),
    Rule("decoder.layers.{i}.ffn.router.score_bias", "layers.{i}.mlp.gate.e_score_correction_bias"),
    Rule("decoder.layers.{i}.ffn.experts.gate_up_proj", "layers.{i}.mlp.experts.gate_up_proj"),
    Rule("decoder.layers.{i}.ffn.experts.down_proj", "layers.{i}.mlp.experts.down_proj"),
    *renamed(
        "decoder.layers.{i}.ffn.shared",
        "layers.{i}.mlp.shared_experts",
        (("gate", "gate_proj"), ("linear1", "up_proj"), ("linear2", "down_proj")),
        ("weight",),
    ),
)  # fmt: skip

DEEPSEEK_V3 = declared(
    DEEPSEEK_V3_CONFIG, model_class="TransformerLM", architecture="DeepseekV3ForCausalLM", prefixes=LLAMA.prefixes,
    rules=LATENT_RULES, skipped=(*LLAMA.skipped, r"layers\.61\..*"), tied=LLAMA.tied,
    legacy=partial(fuse_experts, block="mlp", gate="gate_proj", up="up_proj", down="down_proj"),
)  # fmt: skip


# what this file adds to transformer_spec.families.FAMILIES (found by the package, no list to edit)
REGISTER = (DEEPSEEK_V3,)
