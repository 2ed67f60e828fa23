"""The paper's encoder-decoder: Marian (MarianMTModel, opus-mt) and BART (BartForConditionalGeneration). Both post-
norm, one token table shared by encoder, decoder and output projection, and a final_logits_bias as the output bias.
Marian: the split-layout sinusoids (computed, not stored). BART: learned positions stored with an offset of 2 rows,
and a LayerNorm after each stack's embeddings.
"""

from __future__ import annotations

from collections.abc import Callable

from .core import ACTIVATION_KEY, ANY, ConfigMap, Key, Rule, activation_to_hf, declared, end_token_ids, refuse, token_id

# config.json's dropout rates -> our sites (core.dropout_from_hf)
SEQ2SEQ_DROPOUT = {
    "dropout": (("embedding", "residual"), 0.1),
    "attention_dropout": (("attention",), 0.0),
    "activation_dropout": (("activation",), 0.0),
}


def same_as(name: str, other: str) -> Callable:
    """The reader of decoder key `name`, which must equal its encoder key `other` (one value for both stacks)."""

    def read(value, c: dict):
        if value != c[other]:
            refuse(name, value, f"{other}'s value, {c[other]!r}: this project has one value for both stacks")
        return value

    return read


def shared(c: dict) -> bool:
    return c.get("share_encoder_decoder_embeddings", True)


def target_vocabulary(c: dict) -> int:
    """The decoder's vocabulary: Marian's decoder_vocab_size when the tables are separate, else vocab_size."""
    return c["vocab_size"] if shared(c) else c.get("decoder_vocab_size") or c["vocab_size"]


def pad_id(value, c: dict) -> int | None:
    """pad_token_id: an id of both vocabularies."""
    return token_id(c, "pad_token_id", min(c["vocab_size"], target_vocabulary(c)))


def seq2seq_config(model_type: str) -> ConfigMap:
    """The config map both families share; `model_type` picks the positions, the embedding norm and Marian's
    separate vocabularies."""
    marian = model_type == "marian"
    keys: tuple[Key, ...] = (
        Key("vocab_size", "src_vocab_size"),
        Key("vocab_size", "tgt_vocab_size", read=lambda value, c: target_vocabulary(c), written=False),
        Key("d_model", "d_model"),
        Key("encoder_attention_heads", "n_heads"),
        Key("decoder_attention_heads", "n_heads", read=same_as("decoder_attention_heads", "encoder_attention_heads")),
        Key("encoder_ffn_dim", "d_ff"),
        Key("decoder_ffn_dim", "d_ff", read=same_as("decoder_ffn_dim", "encoder_ffn_dim")),
        Key("encoder_layers", "n_encoder_layers"),
        Key("decoder_layers", "n_decoder_layers"),
        Key("activation_function", "activation", "gelu", write=activation_to_hf, **ACTIVATION_KEY),
        Key("max_position_embeddings", "max_len"),
        Key("pad_token_id", "pad_id", None, pad_id),
        # the decoder's start token is our bos_id (config.json's bos_token_id is the vocabulary's)
        Key("decoder_start_token_id", "bos_id", None,
            lambda value, c: None if value is None else token_id(c, "decoder_start_token_id", target_vocabulary(c))),
        Key("eos_token_id", "eos_id", None, lambda value, c: end_token_ids(c, target_vocabulary(c))),
        Key("forced_eos_token_id", None, source="eos_id", read_too=False),
        Key("tie_word_embeddings", "tie_embeddings", True),
        Key("scale_embedding", "scale_embeddings", False, lambda value, c: bool(value)),
        Key("share_encoder_decoder_embeddings", "share_embeddings", True, written=False),
        Key("is_encoder_decoder", None, True, read_too=False),
        Key("normalize_before", None, False, allowed=(False, None), written=False),  # pre-norm variants: refused
        Key("add_final_layer_norm", None, False, allowed=(False, None), written=False),
        # Marian's tables are nn.Embedding(padding_idx=pad): its lookups (the decoder start token too) pass no
        # gradient; BART's are not (transformers 5).
        Key("pad_token_id", "embedding_padding_idx", None, lambda v, c: marian and v is not None, written=False),
    )  # fmt: skip
    if marian:
        keys += (  # one vocabulary: the class keeps `shared` (separate tables are then written as untied copies)
            Key("share_encoder_decoder_embeddings", None, source=lambda config: config.share_embeddings
                or config.src_vocab_size == config.tgt_vocab_size, read_too=False),
            Key("decoder_vocab_size", None, source="tgt_vocab_size", read_too=False),
        )  # fmt: skip
    supports: dict[str, object] = {
        "activation": ANY, "scale_embeddings": ANY, "tie_embeddings": ANY, "share_embeddings": ANY,
        "qkv_bias": (None, True),
    }  # fmt: skip
    if marian:
        supports |= {"sinusoid_layout": "split"}
    else:
        supports |= {"positional": "learned", "embedding_norm": True, "sinusoid_layout": ANY}
    fixed = {"layer_norm_eps": 1e-5, "sinusoid_layout": "split"}  # nn.LayerNorm's default, which both use
    return ConfigMap(model_type, keys, SEQ2SEQ_DROPOUT, supports, fixed)


def seq2seq_rules(model_type: str) -> tuple[Rule, ...]:
    """The table Marian and BART share, with BART's stored positions and embedding norms added."""
    shared, separate = ("share_embeddings", True), ("share_embeddings", False)
    rules = [
        Rule("decoder.token_embedding.weight", "shared.weight", when=shared),
        Rule("encoder.token_embedding.weight", "encoder.embed_tokens.weight", when=separate),
        Rule("decoder.token_embedding.weight", "decoder.embed_tokens.weight", when=separate),
    ]
    sublayers = {
        "encoder": (("self_attn", "self_attn"), ("self_attn_norm", "self_attn_layer_norm")),
        "decoder": (
            ("self_attn", "self_attn"),
            ("self_attn_norm", "self_attn_layer_norm"),
            ("cross_attn", "encoder_attn"),
            ("cross_attn_norm", "encoder_attn_layer_norm"),
        ),
    }
    for stack in ("encoder", "decoder"):
        if model_type == "bart":
            rules.append(Rule(f"{stack}.position_embedding.weight", f"{stack}.embed_positions.weight", offset=2))
            rules += [
                Rule(f"{stack}.embedding_norm.{w}", f"{stack}.layernorm_embedding.{w}") for w in ("weight", "bias")
            ]
        layer = f"{stack}.layers.{{i}}"
        for ours, theirs in sublayers[stack]:
            if ours.endswith("norm"):
                rules += [Rule(f"{layer}.{ours}.{w}", f"{layer}.{theirs}.{w}") for w in ("weight", "bias")]
            else:
                rules += [
                    Rule(f"{layer}.{ours}.{p}_proj.{w}", f"{layer}.{theirs}.{p}_proj.{w}")
                    for p in ("q", "k", "v", "out")
                    for w in ("weight", "bias")
                ]
        for ours, theirs in (("ffn.linear1", "fc1"), ("ffn.linear2", "fc2"), ("ffn_norm", "final_layer_norm")):
            rules += [Rule(f"{layer}.{ours}.{w}", f"{layer}.{theirs}.{w}") for w in ("weight", "bias")]
    rules += [
        Rule("output_proj.weight", "lm_head.weight", head=True),  # only when untied
        Rule("output_proj.bias", "final_logits_bias", head=True, row=True),  # a (1, V) buffer
    ]
    return tuple(rules)


SEQ2SEQ_SKIPPED = (
    r"(encoder|decoder)\.embed_tokens\.weight",  # with shared embeddings: copies of shared.weight (checked equal)
    r"shared\.weight",  # with separate tables: unused
    r"lm_head\.weight",  # when tied: a copy of the decoder's table (checked equal)
)
SEQ2SEQ_TIED = (
    ("model.encoder.embed_tokens.weight", "model.shared.weight", "share_embeddings"),
    ("model.decoder.embed_tokens.weight", "model.shared.weight", "share_embeddings"),
    ("lm_head.weight", "model.shared.weight", "tie_embeddings"),
    ("lm_head.weight", "model.decoder.embed_tokens.weight", "tie_embeddings"),  # separate tables, tied output
)

MARIAN = declared(
    seq2seq_config("marian"),
    model_class="Transformer",
    architecture="MarianMTModel",
    prefixes=("model.", ""),
    rules=seq2seq_rules("marian"),
    # the sinusoids: computed from the config (some checkpoints store them; they are not parameters)
    skipped=(*SEQ2SEQ_SKIPPED, r"(encoder|decoder)\.embed_positions\.weight"),
    tied=SEQ2SEQ_TIED,
)

BART = declared(
    seq2seq_config("bart"),
    model_class="Transformer",
    architecture="BartForConditionalGeneration",
    prefixes=("model.", ""),
    rules=seq2seq_rules("bart"),
    skipped=SEQ2SEQ_SKIPPED,
    tied=SEQ2SEQ_TIED,
)

# what this file adds to transformer_spec.families.FAMILIES (found by the package, no list to edit)
REGISTER = (MARIAN, BART)
