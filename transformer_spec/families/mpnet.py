"""MPNet (MPNetModel; all-mpnet-base-v2): BERT's post-norm layer under its own names, RoBERTa's positions (its
padding index is 1 in MPNet's code, so config.json's pad_token_id must be 1), no token types, and T5's
bidirectional bucketed bias beside them (config.relative_bias: one table, encoder.relative_attention_bias, read by
every layer at 32 buckets and a maximum distance of 128, the defaults MPNet's code calls it with); the pooler when
the file holds one."""

from __future__ import annotations

from dataclasses import replace

from .bert import BERT
from .core import Key, Rule, declared, renamed
from .roberta import ROBERTA_CONFIG

MPNET_PAD = 1  # MPNetEmbeddings.padding_idx
MPNET_BUCKETS, MPNET_MAX_DISTANCE = 32, 128  # MPNetEncoder.compute_position_bias's defaults

MPNET_CONFIG = ROBERTA_CONFIG.variant(
    "mpnet",
    without=("type_vocab_size", "position_embedding_type", "pad_token_id"),
    keys=(
        Key("pad_token_id", "pad_id", MPNET_PAD, allowed=(MPNET_PAD,)),
        Key("relative_attention_num_buckets", "relative_buckets", MPNET_BUCKETS, allowed=(MPNET_BUCKETS,)),
    ),
    supports={
        "type_vocab_size": 0,
        "relative_bias": True,
        "relative_buckets": MPNET_BUCKETS,
        "relative_max_distance": MPNET_MAX_DISTANCE,
    },
    fixed={"embedding_padding_idx": True},  # word_embeddings is nn.Embedding(padding_idx=1)
)
MPNET_CONFIG = replace(MPNET_CONFIG, tied={"pad_id": lambda config: MPNET_PAD})  # checked when writing

MPNET_LAYER = "encoder.layer.{i}"
MPNET = declared(
    MPNET_CONFIG,
    model_class="EncoderModel",
    architecture="MPNetModel",
    prefixes=("", "mpnet."),
    rules=(
        Rule("encoder.token_embedding.weight", "embeddings.word_embeddings.weight"),
        Rule("encoder.position_embedding.weight", "embeddings.position_embeddings.weight"),
        Rule("encoder.embedding_norm.weight", "embeddings.LayerNorm.weight"),
        Rule("encoder.embedding_norm.bias", "embeddings.LayerNorm.bias"),
        Rule("encoder.relative_bias.weight", "encoder.relative_attention_bias.weight"),
        *renamed(
            "encoder.layers.{i}",
            MPNET_LAYER,
            (
                ("self_attn.q_proj", "attention.attn.q"),
                ("self_attn.k_proj", "attention.attn.k"),
                ("self_attn.v_proj", "attention.attn.v"),
                ("self_attn.out_proj", "attention.attn.o"),
                ("self_attn_norm", "attention.LayerNorm"),
                ("ffn.linear1", "intermediate.dense"),
                ("ffn.linear2", "output.dense"),
                ("ffn_norm", "output.LayerNorm"),
            ),
        ),
        *(r for r in BERT.rules if r.ours.startswith("pooler.")),
    ),
    skipped=(
        r"embeddings\.position_ids",  # a buffer: 0 .. max_len - 1
        r"pooler\..*",  # the pooler, when the config says none (config.pooler: set when the file has one)
        r"lm_head\..*",  # MPNetForMaskedLM's head
        r"classifier\..*",  # the classification heads
    ),
    detected=BERT.detected,
)

# what this file adds to transformer_spec.families.FAMILIES (found by the package, no list to edit)
REGISTER = (MPNET,)
