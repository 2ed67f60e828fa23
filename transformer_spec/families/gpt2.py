"""GPT-2 (GPT2LMHeadModel): pre-norm decoder, learned positions, tanh GELU, fused c_attn, Conv1D layout, tied output
projection without a bias, no padding token.
"""

from __future__ import annotations

from .core import ACTIVATION_KEY, ANY, ConfigMap, Key, Rule, activation_to_hf, declared, fused_qkv, special_token

# config.json's dropout rates -> our sites (core.dropout_from_hf)
GPT2_DROPOUT = {
    "embd_pdrop": (("embedding",), 0.1), "attn_pdrop": (("attention",), 0.1), "resid_pdrop": (("residual",), 0.1),
}  # fmt: skip


def scale_attn_weights(value, c: dict) -> float | None:
    """scale_attn_weights -> attention_scale: None (1 / sqrt(d_head)) when true, 1 (no scaling) when false."""
    return None if value else 1.0


GPT2_CONFIG = ConfigMap(
    model_type="gpt2",
    keys=(
        Key("vocab_size", ("tgt_vocab_size", "src_vocab_size")),
        Key("n_embd", "d_model"),
        Key("n_head", "n_heads"),
        Key("n_inner", "d_ff", None, lambda value, c: value or 4 * c["n_embd"]),  # null: 4 n_embd
        Key("n_layer", "n_decoder_layers"),
        Key("n_positions", "max_len"),
        Key("activation_function", "activation", "gelu_new", write=activation_to_hf, **ACTIVATION_KEY),
        Key("layer_norm_epsilon", "layer_norm_eps", 1e-5),
        Key("tie_word_embeddings", "tie_embeddings", True),
        Key("pad_token_id", "pad_id", None, special_token("pad_token_id")),
        Key("bos_token_id", "bos_id", None, special_token("bos_token_id")),
        Key("eos_token_id", "eos_id", None, special_token("eos_token_id")),
        # the Stanford CRFM runs: layer i's scores also divided by i + 1; and computed in float32 with the scale
        # folded into the product (transformers' eager attention only: the same product, a float32 island of
        # mixed precision that a float64 or float32 model computes alike), read and kept as the file has it
        Key("scale_attn_by_inverse_layer_idx", "attention_scale_by_layer", False, lambda value, c: bool(value)),
        Key("reorder_and_upcast_attn", None, False, allowed=(False, True), written=False),
        Key("scale_attn_weights", "attention_scale", True, scale_attn_weights, lambda scale: scale is None),
        Key("add_cross_attention", None, False, allowed=(False,), written=False),
    ),
    dropout=GPT2_DROPOUT,
    supports={
        "activation": ANY,
        "norm_first": True,
        "positional": "learned",
        "scale_embeddings": False,
        "tie_embeddings": ANY,
        "output_bias": False,
        "qkv_bias": (None, True),
        "attention_scale": (None, 1.0),
        "attention_scale_by_layer": ANY,
    },  # fmt: skip
    fixed={"n_encoder_layers": 0},
)


GPT2 = declared(
    GPT2_CONFIG,
    model_class="TransformerLM",
    architecture="GPT2LMHeadModel",
    prefixes=("transformer.", ""),
    rules=(
        Rule("decoder.token_embedding.weight", "wte.weight"),
        Rule("decoder.position_embedding.weight", "wpe.weight"),
        Rule("decoder.layers.{i}.self_attn_norm.weight", "h.{i}.ln_1.weight"),
        Rule("decoder.layers.{i}.self_attn_norm.bias", "h.{i}.ln_1.bias"),
        *fused_qkv("decoder.layers.{i}.self_attn", "h.{i}.attn.c_attn", ("weight",), conv1d=True),
        *fused_qkv("decoder.layers.{i}.self_attn", "h.{i}.attn.c_attn", ("bias",)),
        Rule("decoder.layers.{i}.self_attn.out_proj.weight", "h.{i}.attn.c_proj.weight", conv1d=True),
        Rule("decoder.layers.{i}.self_attn.out_proj.bias", "h.{i}.attn.c_proj.bias"),
        Rule("decoder.layers.{i}.ffn_norm.weight", "h.{i}.ln_2.weight"),
        Rule("decoder.layers.{i}.ffn_norm.bias", "h.{i}.ln_2.bias"),
        Rule("decoder.layers.{i}.ffn.linear1.weight", "h.{i}.mlp.c_fc.weight", conv1d=True),
        Rule("decoder.layers.{i}.ffn.linear1.bias", "h.{i}.mlp.c_fc.bias"),
        Rule("decoder.layers.{i}.ffn.linear2.weight", "h.{i}.mlp.c_proj.weight", conv1d=True),
        Rule("decoder.layers.{i}.ffn.linear2.bias", "h.{i}.mlp.c_proj.bias"),
        Rule("decoder.final_norm.weight", "ln_f.weight"),
        Rule("decoder.final_norm.bias", "ln_f.bias"),
        Rule("output_proj.weight", "lm_head.weight", head=True),  # only when untied
    ),
    skipped=(
        r"h\.\d+\.attn\.(bias|masked_bias)",  # causal-mask buffers of older checkpoints
        r"lm_head\.weight",  # when tied: a copy of wte.weight (used as output_proj.weight when untied)
    ),
    tied=(("lm_head.weight", "transformer.wte.weight", "tie_embeddings"),),
)

# what this file adds to transformer_spec.families.FAMILIES (found by the package, no list to edit)
REGISTER = (GPT2,)
