"""Phi-3 (Phi3ForCausalLM): Llama's math with a fused `qkv_proj` (q, k and v blocks of H, H_kv and H_kv heads: split
on load, merged on save) and a fused `gate_up_proj` (gate, then up), no biases, partial rotary
(`partial_rotary_factor`: RoPE on the first fraction of each head's features) and an optional sliding window.
"""

from __future__ import annotations

from dataclasses import replace

from ..config import TransformerConfig
from .core import ANY, Key, Rule, declared, fused_qkv, is_finite_number, refuse
from .llama import LLAMA_CONFIG

PHI3_DROPOUT = {"resid_pdrop": (("residual",), 0.0), "attention_dropout": (("attention",), 0.0)}  # embd_pdrop: unused


def rotary_dim(legacy: str, default: float):
    """The reader of rotary_dim: the fraction of each head RoPE turns (rope_parameters' partial_rotary_factor, else
    the family's older top-level key `legacy`, else `default`) times the head size, int() as transformers computes
    it; None when it is the whole head. Refused: a fraction outside (0, 1], an odd number of features."""

    def read(value, c: dict) -> int | None:
        factor = (value or {}).get("partial_rotary_factor", c.get(legacy, default))
        if not is_finite_number(factor) or not 0 < factor <= 1:
            refuse("partial_rotary_factor", factor, "a number in (0, 1]")
        head = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        rotary = int(head * factor)
        if rotary == head:
            return None
        if rotary < 2 or rotary % 2:
            refuse("partial_rotary_factor", factor, f"a fraction turning an even number >= 2 of the {head} features")
        return rotary

    return read


def rope_parameters(config: TransformerConfig) -> dict:
    """rope_parameters for config.json: the base, and the fraction of each head RoPE turns (checked to give back
    rotary_dim under transformers' int(head_dim * fraction))."""
    factor = config.rope_dim / config.d_head
    if int(config.d_head * factor) != config.rope_dim:
        raise ValueError(f"rotary_dim={config.rotary_dim} of head size {config.d_head} has no exact fraction")
    return {"rope_type": "default", "rope_theta": config.rope_theta, "partial_rotary_factor": factor}


PHI3_CONFIG = replace(
    LLAMA_CONFIG.variant(
        "phi3",
        without=("attention_bias", "mlp_bias", "head_dim"),  # Phi3Config: no biases, no head_dim
        unwritten=("rope_parameters",),  # Llama's reading of the base stays; written below with the fraction
        keys=(
            Key(
                "rope_parameters", "rotary_dim", None, rotary_dim("partial_rotary_factor", 1.0), source=rope_parameters
            ),
            Key("sliding_window", "sliding_window", None, lambda value, c: None if value is None else int(value)),
        ),
        supports={"bias": False, "qkv_bias": (None, False), "sliding_window": ANY, "rotary_dim": ANY, "head_dim": None},
    ),
    dropout=PHI3_DROPOUT,
)

PHI3 = declared(
    PHI3_CONFIG,
    model_class="TransformerLM",
    architecture="Phi3ForCausalLM",
    prefixes=("model.", ""),
    rules=(
        Rule("decoder.token_embedding.weight", "embed_tokens.weight"),
        Rule("decoder.layers.{i}.self_attn_norm.weight", "layers.{i}.input_layernorm.weight"),
        *fused_qkv("decoder.layers.{i}.self_attn", "layers.{i}.self_attn.qkv_proj", ("weight",), gqa=True),
        Rule("decoder.layers.{i}.self_attn.out_proj.weight", "layers.{i}.self_attn.o_proj.weight"),
        Rule("decoder.layers.{i}.ffn_norm.weight", "layers.{i}.post_attention_layernorm.weight"),
        Rule("decoder.layers.{i}.ffn.gate.weight", "layers.{i}.mlp.gate_up_proj.weight", part=(0, 2)),
        Rule("decoder.layers.{i}.ffn.linear1.weight", "layers.{i}.mlp.gate_up_proj.weight", part=(1, 2)),
        Rule("decoder.layers.{i}.ffn.linear2.weight", "layers.{i}.mlp.down_proj.weight"),
        Rule("decoder.final_norm.weight", "norm.weight"),
        Rule("output_proj.weight", "lm_head.weight", head=True),  # only when untied
    ),
    skipped=(r"lm_head\.weight",),  # when tied: a copy of embed_tokens.weight
    tied=(("lm_head.weight", "model.embed_tokens.weight", "tie_embeddings"),),
)

REGISTER = (PHI3,)
