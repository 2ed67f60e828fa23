"""Qwen3 (Qwen3ForCausalLM): Llama's layout with an RMSNorm of each head's queries and keys before RoPE (q_norm,
k_norm: config.qk_norm, one weight (Dh,) shared by the heads), no biases, a head_dim of its own (128 in the released
models) and Qwen2's sliding layers (use_sliding_window, max_window_layers, layer_types).
"""

from __future__ import annotations

from dataclasses import replace

from .core import ANY, Key, Rule
from .llama import LLAMA, QWEN2_CONFIG


def no_mlp_bias(value, c: dict) -> bool | None:
    """attention_bias -> ffn_bias: Qwen3's MLP has no biases, so False beside biases on q, k, v and o (else None)."""
    return False if value else None


QWEN3_CONFIG = QWEN2_CONFIG.variant(
    "qwen3",
    # attention_bias: biases on q, k, v and o, none on the MLP (ffn_bias False)
    keys=(
        Key("attention_bias", "bias", False, lambda value, c: bool(value)),
        Key("attention_bias", "ffn_bias", False, no_mlp_bias, written=False),
    ),
    supports={
        "bias": ANY,
        "qkv_bias": lambda c: (None, c.bias),
        "ffn_bias": lambda c: (False,) if c.bias else (None, False),
        "qk_norm": True,
    },
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
