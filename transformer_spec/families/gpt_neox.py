"""GPT-NeoX (GPTNeoXForCausalLM; Pythia): pre-norm LayerNorm decoder, biases everywhere, the parallel residual
(config.parallel_residual: attention and MLP both read the layer's input, x + Attn(LN1(x)) + MLP(LN2(x))), partial
rotary (`rotary_pct`: RoPE on the first fraction of each head's features), scaled RoPE of every kind transformers
computes (`rope_scaling` / `rope_parameters`: linear, dynamic, yarn, longrope, llama3, on the turned features), a
fused `query_key_value` laid out head by head [q_h, k_h, v_h] (BLOOM's layout), and an untied head its files call
`embed_out`.
"""

from __future__ import annotations

from ..config import TransformerConfig
from .core import (
    ACTIVATION_KEY,
    ANY,
    OMITTED,
    ConfigMap,
    Key,
    Rule,
    activation_to_hf,
    declared,
    fused_qkv,
    refuse,
    renamed,
    special_token,
)
from .llama import kept_longrope_cache, rope_scaling, rope_scaling_json
from .phi3 import partial_rotary_factor, rope_parameters, rotary_dim
from .rope import effective_rope, in_rope_scaling

NEOX_DROPOUT = {"hidden_dropout": (("embedding", "residual"), 0.0), "attention_dropout": (("attention",), 0.0)}


def rope_theta(value, c: dict) -> float:
    """RoPE's base from the RoPE object transformers reads (rope_scaling, else rope_parameters), else the older
    rotary_emb_base (GPTNeoXConfig sets it there before a top-level rope_theta could count)."""
    return float(effective_rope(c)[1].get("rope_theta", c.get("rotary_emb_base", 10000.0)))


def neox_rope_parameters(config: TransformerConfig, as_read: dict) -> dict | object:
    """rope_parameters for config.json (Phi-3's, the scaling's original length kept in it); beside a rope_scaling,
    the base and the fraction go in rotary_emb_base and rotary_pct instead."""
    return rope_parameters(config, as_read, without=())


def beside_rope_scaling(value):
    """The writer of GPT-NeoX's older top-level keys (rotary_emb_base, rotary_pct): `value` of the config, beside
    a rope_scaling only (where config.json as read held the scaling)."""

    def write(config: TransformerConfig, as_read: dict):
        return value(config) if config.rope_scaling is not None and in_rope_scaling(as_read) else OMITTED

    return write


def strict_bool(name: str):
    """The reader of a key that must be true or false (a string "false" is not False)."""

    def read(value, c: dict) -> bool:
        if not isinstance(value, bool):
            refuse(name, value, "true or false")
        return value

    return read


GPT_NEOX_CONFIG = ConfigMap(
    model_type="gpt_neox",
    keys=(
        Key("vocab_size", ("tgt_vocab_size", "src_vocab_size")),
        Key("hidden_size", "d_model"),
        Key("num_attention_heads", "n_heads"),
        Key("intermediate_size", "d_ff"),
        Key("num_hidden_layers", "n_decoder_layers"),
        Key("hidden_act", "activation", "gelu", write=activation_to_hf, **ACTIVATION_KEY),
        Key("max_position_embeddings", "max_len", 2048),
        Key("layer_norm_eps", "layer_norm_eps", 1e-5),
        Key("rope_parameters", "rope_theta", None, rope_theta, written=False),
        Key(
            "rope_parameters",
            "rotary_dim",
            None,
            rotary_dim("rotary_pct", 0.25),
            source=neox_rope_parameters,
            spelled=True,
        ),
        Key("rope_scaling", "rope_scaling", None, rope_scaling, source=rope_scaling_json, spelled=True),
        Key("rope_scaling", "rope_cache_remade", None, kept_longrope_cache, written=False),
        *(
            Key(key, None, None, read_too=False, source=beside_rope_scaling(value), spelled=True)
            for key, value in (("rotary_emb_base", lambda c: c.rope_theta), ("rotary_pct", partial_rotary_factor))
        ),
        Key("use_parallel_residual", "parallel_residual", True, strict_bool("use_parallel_residual")),
        # biases on the attention's and the MLP's linears alike: `bias` covers both, so False is refused
        Key("attention_bias", None, True, allowed=(True,)),
        Key("tie_word_embeddings", "tie_embeddings", False),
        Key("pad_token_id", "pad_id", None, special_token("pad_token_id")),
        Key("bos_token_id", "bos_id", None, special_token("bos_token_id")),
        Key("eos_token_id", "eos_id", None, special_token("eos_token_id")),
    ),
    dropout=NEOX_DROPOUT,
    supports={
        "activation": ANY,
        "norm_first": True,
        "positional": "rope",
        "rope_theta": ANY,
        "rotary_dim": ANY,
        "rope_scaling": ANY,
        "parallel_residual": ANY,
        "tie_embeddings": ANY,
        "scale_embeddings": False,
        "output_bias": False,
        "qkv_bias": (None, True),
    },  # fmt: skip
    fixed={"n_encoder_layers": 0},
)

GPT_NEOX = declared(
    GPT_NEOX_CONFIG,
    model_class="TransformerLM",
    architecture="GPTNeoXForCausalLM",
    prefixes=("gpt_neox.", ""),
    rules=(
        Rule("decoder.token_embedding.weight", "embed_in.weight"),
        *fused_qkv("decoder.layers.{i}.self_attn", "layers.{i}.attention.query_key_value", per_head=True),
        *renamed(
            "decoder.layers.{i}",
            "layers.{i}",
            (
                ("self_attn_norm", "input_layernorm"),
                ("self_attn.out_proj", "attention.dense"),
                ("ffn_norm", "post_attention_layernorm"),
                ("ffn.linear1", "mlp.dense_h_to_4h"),
                ("ffn.linear2", "mlp.dense_4h_to_h"),
            ),
        ),
        Rule("decoder.final_norm.weight", "final_layer_norm.weight"),
        Rule("decoder.final_norm.bias", "final_layer_norm.bias"),
        Rule("output_proj.weight", "lm_head.weight", head=True),  # only when untied
    ),
    skipped=(
        r"layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)",  # buffers of older checkpoints
        r"lm_head\.weight",  # when tied: a copy of embed_in.weight
    ),
    tied=(("lm_head.weight", "gpt_neox.embed_in.weight", "tie_embeddings"),),
    renamed=(("embed_out.weight", "lm_head.weight"),),  # save_pretrained writes the head as embed_out
)

REGISTER = (GPT_NEOX,)
