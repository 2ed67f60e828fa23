"""DistilBERT (DistilBertModel): BERT's post-norm encoder without token types or pooler, its own tensor names, its
LayerNorm eps fixed at 1e-12 in its code (config.json has no field for it), learned positions only (a frozen
sinusoid table, sinusoidal_pos_embds, is refused). Its `dropout` acts after the embeddings and after the
feed-forward block; ours (residual) after the attention block too: in training mode with dropout > 0 the two drop
different units (evaluation mode, and hf.load(dropout=0), are exact)."""

from __future__ import annotations

from .core import ACTIVATION_KEY, ANY, ConfigMap, Key, Rule, activation_to_hf, declared, renamed, special_token

DISTILBERT_DROPOUT = {
    "dropout": (("embedding", "residual"), 0.1),  # see above: DistilBERT has none after its attention block
    "attention_dropout": (("attention",), 0.1),
}
DISTILBERT_EPS = 1e-12  # nn.LayerNorm(dim, eps=1e-12) everywhere

DISTILBERT_CONFIG = ConfigMap(
    model_type="distilbert",
    keys=(
        Key("vocab_size", ("src_vocab_size", "tgt_vocab_size")),
        Key("dim", "d_model"),
        Key("n_heads", "n_heads"),
        Key("hidden_dim", "d_ff"),
        Key("n_layers", "n_encoder_layers"),
        Key("activation", "activation", "gelu", write=activation_to_hf, **ACTIVATION_KEY),
        Key("max_position_embeddings", "max_len"),
        Key("pad_token_id", "pad_id", None, special_token("pad_token_id")),
        Key("bos_token_id", "bos_id", None, special_token("bos_token_id"), written=False),
        Key("eos_token_id", "eos_id", None, special_token("eos_token_id"), written=False),
        # word_embeddings is nn.Embedding(padding_idx=pad_token_id)
        Key("pad_token_id", "embedding_padding_idx", None, lambda value, c: value is not None, written=False),
        Key("sinusoidal_pos_embds", None, False, allowed=(False,)),
    ),
    dropout=DISTILBERT_DROPOUT,
    supports={  # an encoder: no output projection, so its fields take any value
        "activation": ANY,
        "norm_first": False,
        "positional": "learned",
        "scale_embeddings": False,
        "embedding_norm": True,
        "qkv_bias": (None, True),
        "tie_embeddings": ANY,
        "share_embeddings": ANY,
        "output_bias": ANY,
    },  # fmt: skip
    fixed={"n_decoder_layers": 0, "layer_norm_eps": DISTILBERT_EPS},
    tied={"layer_norm_eps": lambda config: DISTILBERT_EPS},  # no key: checked when writing
)

DISTILBERT_LAYER = "transformer.layer.{i}"
DISTILBERT = declared(
    DISTILBERT_CONFIG,
    model_class="EncoderModel",
    architecture="DistilBertModel",
    prefixes=("", "distilbert."),
    rules=(
        Rule("encoder.token_embedding.weight", "embeddings.word_embeddings.weight"),
        Rule("encoder.position_embedding.weight", "embeddings.position_embeddings.weight"),
        Rule("encoder.embedding_norm.weight", "embeddings.LayerNorm.weight"),
        Rule("encoder.embedding_norm.bias", "embeddings.LayerNorm.bias"),
        *renamed(
            "encoder.layers.{i}",
            DISTILBERT_LAYER,
            (
                ("self_attn.q_proj", "attention.q_lin"),
                ("self_attn.k_proj", "attention.k_lin"),
                ("self_attn.v_proj", "attention.v_lin"),
                ("self_attn.out_proj", "attention.out_lin"),
                ("self_attn_norm", "sa_layer_norm"),
                ("ffn.linear1", "ffn.lin1"),
                ("ffn.linear2", "ffn.lin2"),
                ("ffn_norm", "output_layer_norm"),
            ),
        ),
    ),
    skipped=(
        r"embeddings\.position_ids",  # a buffer: 0 .. max_len - 1
        r"vocab_(transform|layer_norm|projector)\..*",  # DistilBertForMaskedLM's head
        r"(pre_classifier|classifier|qa_outputs)\..*",  # the classification and question-answering heads
    ),
)

# what this file adds to transformer_spec.families.FAMILIES (found by the package, no list to edit)
REGISTER = (DISTILBERT,)
