"""BLOOM (BloomForCausalLM): pre-norm LayerNorm decoder with ALiBi instead of a position table, a LayerNorm after the
token embeddings, tanh GELU in a 4D MLP, biases everywhere, a fused query_key_value interleaved head by head, and an
output projection tied to the embeddings.
"""

from __future__ import annotations

from .core import ANY, ConfigMap, Key, Rule, declared, fused_qkv, pretraining_tp, renamed, special_token

BLOOM_DROPOUT = {"hidden_dropout": (("residual",), 0.0), "attention_dropout": (("attention",), 0.0)}


def hidden_size(c: dict) -> int:
    """hidden_size, or n_embed in older BLOOM configs (64 when neither: BloomConfig's default)."""
    return c.get("hidden_size", c.get("n_embed", 64))


BLOOM_CONFIG = ConfigMap(
    model_type="bloom",
    keys=(
        Key("vocab_size", ("tgt_vocab_size", "src_vocab_size")),
        Key("hidden_size", "d_model", None, lambda value, c: c.get("hidden_size", c.get("n_embed", 64))),
        Key(
            "hidden_size", "d_ff", None, lambda value, c: 4 * c.get("hidden_size", c.get("n_embed", 64)), written=False
        ),
        Key("n_head", "n_heads"),
        Key("n_layer", "n_decoder_layers"),
        Key("layer_norm_epsilon", "layer_norm_eps", 1e-5),
        # ALiBi has no table: the longest sequence decoding may run
        Key("seq_length", "max_len", None, lambda value, c: value or 2048),
        Key("apply_residual_connection_post_layernorm", None, False, allowed=(False,)),
        Key("pretraining_tp", None, 1, read=pretraining_tp),
        Key("tie_word_embeddings", "tie_embeddings", True),
        Key("pad_token_id", "pad_id", None, special_token("pad_token_id")),
        Key("bos_token_id", "bos_id", None, special_token("bos_token_id")),
        Key("eos_token_id", "eos_id", None, special_token("eos_token_id")),
    ),
    dropout=BLOOM_DROPOUT,
    supports={
        "activation": "gelu_tanh",
        "norm_first": True,
        "positional": "alibi",
        "scale_embeddings": False,
        "embedding_norm": True,
        "tie_embeddings": ANY,
        "output_bias": False,
        "qkv_bias": (None, True),
    },  # fmt: skip
    fixed={"n_encoder_layers": 0},
    tied={"d_ff": lambda config: 4 * config.d_model},  # BLOOM's MLP is 4 x hidden_size, not a field of its own
)


BLOOM = declared(
    BLOOM_CONFIG,
    model_class="TransformerLM",
    architecture="BloomForCausalLM",
    prefixes=("transformer.", ""),
    rules=(
        Rule("decoder.token_embedding.weight", "word_embeddings.weight"),
        Rule("decoder.embedding_norm.weight", "word_embeddings_layernorm.weight"),
        Rule("decoder.embedding_norm.bias", "word_embeddings_layernorm.bias"),
        *fused_qkv("decoder.layers.{i}.self_attn", "h.{i}.self_attention.query_key_value", per_head=True),
        *renamed(
            "decoder.layers.{i}",
            "h.{i}",
            (
                ("self_attn_norm", "input_layernorm"),
                ("self_attn.out_proj", "self_attention.dense"),
                ("ffn_norm", "post_attention_layernorm"),
                ("ffn.linear1", "mlp.dense_h_to_4h"),
                ("ffn.linear2", "mlp.dense_4h_to_h"),
            ),
        ),
        Rule("decoder.final_norm.weight", "ln_f.weight"),
        Rule("decoder.final_norm.bias", "ln_f.bias"),
        Rule("output_proj.weight", "lm_head.weight", head=True),  # only when untied
    ),
    skipped=(r"lm_head\.weight",),  # when tied: a copy of word_embeddings.weight
    tied=(("lm_head.weight", "transformer.word_embeddings.weight", "tie_embeddings"),),
)

# what this file adds to transformer_spec.families.FAMILIES (found by the package, no list to edit)
REGISTER = (BLOOM,)
