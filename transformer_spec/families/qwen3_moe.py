"""Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3's attention (q/k norm) with Mixtral's experts: the router's gates
renormalised only when norm_topk_prob, experts of their own width (moe_intermediate_size), and dense layers between the
sparse ones: layer i is sparse unless mlp_only_layers lists it or (i + 1) % decoder_sparse_step != 0 (ours:
dense_layers; a dense layer's MLP is Qwen3's, intermediate_size wide). The files hold each expert's gate_proj, up_proj
and down_proj under mlp.experts.{e}: fused on loading (mixtral.fuse_experts). With use_sliding_window, every layer
slides (Qwen3MoeConfig has no max_window_layers). attention_bias: biases on q, k, v and o (Qwen3's), none on the
router, the experts or a dense layer's MLP."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from .core import ANY, Key, is_int, refuse
from .mixtral import MOE_RULES, MOE_SUPPORTS, fuse_experts
from .qwen3 import QWEN3, QWEN3_CONFIG


def n_experts(value, c: dict) -> int:
    """num_local_experts (transformers 5 writes it), or the older num_experts."""
    return value if "num_local_experts" in c else c.get("num_experts", value)


def dense_layers(value, c: dict) -> tuple:
    """mlp_only_layers and decoder_sparse_step -> the layers that keep the dense MLP: layer i is sparse unless listed
    or (i + 1) % decoder_sparse_step != 0 (Qwen3MoeDecoderLayer's rule); none without experts."""
    n_layers, step = c["num_hidden_layers"], c.get("decoder_sparse_step", 1)
    only = value or []
    if not isinstance(only, list) or not all(is_int(i) and 0 <= i < n_layers for i in only):
        refuse("mlp_only_layers", only, f"a list of layer indices in [0, {n_layers})")
    if not is_int(step) or step < 1:
        refuse("decoder_sparse_step", step, "a positive int")
    if not n_experts(c.get("num_local_experts", 128), c):
        return ()
    return tuple(i for i in range(n_layers) if i in only or (i + 1) % step != 0)


QWEN3_MOE_CONFIG = QWEN3_CONFIG.variant(
    "qwen3_moe",
    # Qwen3MoeConfig has neither layer_types nor max_window_layers: with use_sliding_window every layer slides
    # (transformers 5's Qwen3MoeAttention reads config.sliding_window in every layer), not Qwen2's rule
    # (attention_bias: Qwen3's reading, biases on q, k, v and o; the dense MLP, the router and the experts have none)
    without=("layer_types", "max_window_layers"),
    keys=(
        Key("num_local_experts", "n_experts", 128, n_experts),
        Key("num_experts_per_tok", "top_k", 8),
        Key("norm_topk_prob", "norm_topk_prob", False, lambda value, c: bool(value)),
        Key("moe_intermediate_size", "d_expert", 768, source="expert_width"),
        Key("mlp_only_layers", "dense_layers", None, dense_layers, list),
        Key("decoder_sparse_step", None, 1),  # written as 1: dense_layers lists every dense layer
        Key("router_aux_loss_coef", "router_aux_loss_coef", 0.001, lambda value, c: float(value)),
    ),
    supports=MOE_SUPPORTS
    | {"ffn_bias": lambda c: (False,) if c.bias else (None, False)}
    | {"norm_topk_prob": ANY, "d_expert": ANY, "dense_layers": ANY, "layer_types": None},
)
QWEN3_MOE = replace(
    QWEN3, model_type="qwen3_moe", architecture="Qwen3MoeForCausalLM", rules=QWEN3.rules + MOE_RULES,
    from_hf=QWEN3_MOE_CONFIG.from_hf, to_hf=QWEN3_MOE_CONFIG.to_hf, supports=QWEN3_MOE_CONFIG.supports,
    legacy=partial(fuse_experts, block="mlp", gate="gate_proj", up="up_proj", down="down_proj"),
)  # fmt: skip

# what this file adds to transformer_spec.families.FAMILIES
REGISTER = (QWEN3_MOE,)
