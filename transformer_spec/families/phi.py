"""Phi-2 (PhiForCausalLM, model_type phi; Phi-1 and Phi-1.5 share it): GPT-J's and Falcon's parallel block, attention
and the MLP both reading one LayerNorm's output and both added to the stream (`parallel_residual` with `shared_norm`),
partial rotary (partial_rotary_factor -> `rotary_dim`: RoPE on the first fraction of each head), biases on q, k, v,
the output projection `dense` and the MLP's fc1 and fc2, tanh GELU (gelu_new), a final LayerNorm, and lm_head with a
bias, untied."""

from __future__ import annotations

from .core import ACTIVATION_KEY, ANY, ConfigMap, Key, Rule, activation_to_hf, declared, refuse, renamed, special_token
from .llama import kv_heads
from .phi3 import rope_parameters, rotary_dim
from .rope import effective_rope, rope_theta_of

# config.json's dropout rates -> our sites (core.dropout_from_hf): after the embeddings, on each branch's output, on
# the attention probabilities (the MLP has none inside)
PHI_DROPOUT = {
    "embd_pdrop": (("embedding",), 0.0),
    "resid_pdrop": (("residual",), 0.0),
    "attention_dropout": (("attention",), 0.0),
}


def plain_rope_theta(value, c: dict) -> float:
    """RoPE's base (rope_parameters', else the top-level rope_theta); a scaled RoPE (a rope_type other than
    "default") is refused: not read here beside partial rotary."""
    where, rope = effective_rope(c)
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        refuse(f"{where}.rope_type", rope.get("rope_type", rope.get("type")), ("default",))
    return rope_theta_of(c)


PHI_CONFIG = ConfigMap(
    model_type="phi",
    keys=(
        Key("vocab_size", ("tgt_vocab_size", "src_vocab_size")),
        Key("hidden_size", "d_model"),
        Key("num_attention_heads", "n_heads"),
        Key("num_key_value_heads", "n_kv_heads", None, kv_heads, source="kv_heads"),
        Key("intermediate_size", "d_ff"),
        Key("num_hidden_layers", "n_decoder_layers"),
        Key("hidden_act", "activation", "gelu_new", write=activation_to_hf, **ACTIVATION_KEY),
        Key("max_position_embeddings", "max_len", 2048),
        Key("layer_norm_eps", "layer_norm_eps", 1e-5),
        # one RoPE: a top-level rope_theta and partial_rotary_factor (the released files'), or rope_parameters
        Key("rope_theta", "rope_theta", 10000.0, lambda value, c: float(value), written=False),
        Key("rope_parameters", "rope_theta", None, plain_rope_theta, written=False),
        Key(
            "rope_parameters",
            "rotary_dim",
            None,
            rotary_dim("partial_rotary_factor", 0.5),
            source=rope_parameters,
            spelled=True,
        ),
        Key("rope_scaling", None, None, allowed=(None,), written=False),  # a scaled RoPE beside partial rotary
        Key("qk_layernorm", None, False, allowed=(False,)),  # LayerNorms of each head's q and k: not computed here
        Key("head_dim", None, None, allowed=(None,), written=False),  # PhiConfig has none: hidden_size / heads
        Key("tie_word_embeddings", "tie_embeddings", False),
        Key("pad_token_id", "pad_id", None, special_token("pad_token_id")),
        Key("bos_token_id", "bos_id", 1, special_token("bos_token_id")),
        Key("eos_token_id", "eos_id", 2, special_token("eos_token_id")),
        # embed_tokens: nn.Embedding(padding_idx=pad), so the pad row gets no gradient from lookups
        Key("pad_token_id", "embedding_padding_idx", None, lambda value, c: value is not None, written=False),
    ),
    dropout=PHI_DROPOUT,
    supports={
        "activation": ("gelu_tanh", "gelu", "relu", "silu"),
        "norm": "layer",
        "norm_first": True,
        "positional": "rope",
        "rope_theta": ANY,
        "rotary_dim": ANY,
        "parallel_residual": True,
        "shared_norm": True,
        "n_kv_heads": ANY,
        "bias": True,
        "qkv_bias": (None, True),
        "tie_embeddings": ANY,
        "scale_embeddings": False,
        "output_bias": True,
    },  # fmt: skip
    fixed={"n_encoder_layers": 0},
)

PHI = declared(
    PHI_CONFIG,
    model_class="TransformerLM",
    architecture="PhiForCausalLM",
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
                ("self_attn.out_proj", "self_attn.dense"),
                ("ffn.linear1", "mlp.fc1"),
                ("ffn.linear2", "mlp.fc2"),
            ),
        ),
        Rule("decoder.final_norm.weight", "final_layernorm.weight"),
        Rule("decoder.final_norm.bias", "final_layernorm.bias"),
        Rule("output_proj.weight", "lm_head.weight", head=True),  # only when untied
        Rule("output_proj.bias", "lm_head.bias", head=True),
    ),
    skipped=(r"lm_head\.weight",),  # when tied: a copy of embed_tokens.weight
    tied=(("lm_head.weight", "model.embed_tokens.weight", "tie_embeddings"),),
)

# what this file adds to transformer_spec.families.FAMILIES (found by the package, no list to edit)
REGISTER = (PHI,)
