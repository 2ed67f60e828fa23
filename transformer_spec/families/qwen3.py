"""Qwen3 (Qwen3ForCausalLM): Llama's layout with an RMSNorm of each head's queries and keys before RoPE (q_norm,
k_norm: config.qk_norm, one weight (Dh,) shared by the heads), no biases, a head_dim of its own (128 in the released
models) and Qwen2's sliding layers (use_sliding_window, max_window_layers, layer_types).
"""

from __future__ import annotations

from dataclasses import replace

from .core import Key, Rule
from .llama import LLAMA, QWEN2_CONFIG

QWEN3_CONFIG = QWEN2_CONFIG.variant(
    "qwen3",
    # biases on q, k, v and o but none on the MLP: no config of this project has that, so only False is read
    keys=(Key("attention_bias", None, False, allowed=(False,)),),
    supports={"bias": False, "qkv_bias": (None, False), "qk_norm": True},
)
QWEN3 = replace(
    LLAMA,
    model_type="qwen3",
    architecture="Qwen3ForCausalLM",
    rules=(
        *LLAMA.rules,
        *(
            Rule(f"decoder.layers.{{i}}.self_attn.{norm}.weight", f"layers.{{i}}.self_attn.{norm}.weight")
            for norm in ("q_norm", "k_norm")
        ),
    ),
    from_hf=QWEN3_CONFIG.from_hf,
    to_hf=QWEN3_CONFIG.to_hf,
    supports=QWEN3_CONFIG.supports,
)

REGISTER = (QWEN3,)
