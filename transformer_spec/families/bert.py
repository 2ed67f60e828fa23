"""BERT (BertModel; all-MiniLM-L6-v2): post-norm encoder, learned positions, token types, embedding norm."""

from __future__ import annotations

from .core import ACTIVATION_KEY, ANY, ConfigMap, Key, Rule, activation_to_hf, declared, renamed, special_token

# config.json's dropout rates -> our sites (core.dropout_from_hf)
BERT_DROPOUT = {
    "hidden_dropout_prob": (("embedding", "residual"), 0.1),
    "attention_probs_dropout_prob": (("attention",), 0.1),
}


BERT_CONFIG = ConfigMap(
    model_type="bert",
    keys=(
        Key("vocab_size", ("src_vocab_size", "tgt_vocab_size")),
        Key("hidden_size", "d_model"),
        Key("num_attention_heads", "n_heads"),
        Key("intermediate_size", "d_ff"),
        Key("num_hidden_layers", "n_encoder_layers"),
        Key("hidden_act", "activation", "gelu", write=activation_to_hf, **ACTIVATION_KEY),
        Key("max_position_embeddings", "max_len"),
        Key("layer_norm_eps", "layer_norm_eps", 1e-12),
        Key("type_vocab_size", "type_vocab_size", 2),
        Key("pad_token_id", "pad_id", None, special_token("pad_token_id")),
        Key("bos_token_id", "bos_id", None, special_token("bos_token_id"), written=False),
        Key("eos_token_id", "eos_id", None, special_token("eos_token_id"), written=False),
        # word_embeddings is nn.Embedding(padding_idx=pad): [PAD]'s row gets no gradient from lookups
        Key("pad_token_id", "embedding_padding_idx", None, lambda value, c: value is not None, written=False),
        Key("position_embedding_type", None, "absolute", allowed=("absolute",)),
        Key("is_decoder", None, False, allowed=(False, None), written=False),  # only the encoder, never a decoder
        Key("add_cross_attention", None, False, allowed=(False, None), written=False),
    ),
    dropout=BERT_DROPOUT,
    supports={  # an encoder: no output projection, so its fields take any value
        "activation": ANY,
        "norm_first": False,
        "positional": "learned",
        "scale_embeddings": False,
        "embedding_norm": True,
        "type_vocab_size": ANY,
        "qkv_bias": (None, True),
        "tie_embeddings": ANY,
        "share_embeddings": ANY,
        "output_bias": ANY,
        "pooler": ANY,
    },  # fmt: skip
    fixed={"n_decoder_layers": 0},
)


BERT_LAYER = "encoder.layer.{i}"
BERT = declared(
    BERT_CONFIG,
    model_class="EncoderModel",
    architecture="BertModel",
    prefixes=("", "bert."),
    rules=(
        Rule("encoder.token_embedding.weight", "embeddings.word_embeddings.weight"),
        Rule("encoder.position_embedding.weight", "embeddings.position_embeddings.weight"),
        Rule("encoder.token_type_embedding.weight", "embeddings.token_type_embeddings.weight"),
        Rule("encoder.embedding_norm.weight", "embeddings.LayerNorm.weight"),
        Rule("encoder.embedding_norm.bias", "embeddings.LayerNorm.bias"),
        *renamed(
            "encoder.layers.{i}",
            BERT_LAYER,
            (
                ("self_attn.q_proj", "attention.self.query"),
                ("self_attn.k_proj", "attention.self.key"),
                ("self_attn.v_proj", "attention.self.value"),
                ("self_attn.out_proj", "attention.output.dense"),
                ("self_attn_norm", "attention.output.LayerNorm"),
                ("ffn.linear1", "intermediate.dense"),
                ("ffn.linear2", "output.dense"),
                ("ffn_norm", "output.LayerNorm"),
            ),
        ),
        *(Rule(f"pooler.dense.{w}", f"pooler.dense.{w}", when=("pooler", True)) for w in ("weight", "bias")),
    ),
    skipped=(
        r"embeddings\.position_ids",  # a buffer: 0 .. max_len - 1
        r"embeddings\.token_type_ids",  # a buffer of zeros
        r"pooler\..*",  # the [CLS] pooler, when the config says none (config.pooler: set when the file has one)
        r"cls\..*",  # the pre-training heads (masked LM, next sentence) of BertForPreTraining / MaskedLM
    ),
    detected=(("pooler", r"pooler\.dense\.weight"),),
)

# what this file adds to transformer_spec.families.FAMILIES (found by the package, no list to edit)
REGISTER = (BERT,)
