"""Whisper (WhisperForConditionalGeneration, model_type whisper): a pre-norm encoder-decoder whose encoder reads
log-mel frames (numpy_transformer.audio.SpeechTransformer). Two convolutions and Whisper's fixed sinusoids
(encoder.embed_positions.weight, stored in the checkpoint and read as stored: our buffer encoder.position_table) in
place of a token table; the decoder's learned positions, its token table nn.Embedding(padding_idx=pad), the output
projection proj_out tied to it (no bias); key projections without bias; nn.LayerNorm's eps.

Refused by name, because transformers does not compute them or we do not: scale_embedding true (WhisperDecoder keeps
an embed_scale it never multiplies by), apply_spec_augment true (random masking of the features in training),
layerdrop above 0, use_weighted_layer_sum (audio classification's)."""

from __future__ import annotations

from .core import ACTIVATION_KEY, ANY, ConfigMap, Key, Rule, activation_to_hf, declared, end_token_ids, token_id
from .seq2seq import SEQ2SEQ_DROPOUT, same_as


def whisper_token(name: str):
    """The reader of special token id `name`, an id of config.json's vocabulary."""
    return lambda value, c: token_id(c, name, c.get("vocab_size", 51865))


WHISPER_CONFIG = ConfigMap(
    "whisper",
    (
        Key("vocab_size", ("src_vocab_size", "tgt_vocab_size"), 51865),
        Key("num_mel_bins", "n_mels", 80),
        Key("d_model", "d_model", 384),
        Key("encoder_attention_heads", "n_heads", 6),
        Key("decoder_attention_heads", "n_heads", 6, same_as("decoder_attention_heads", "encoder_attention_heads")),
        Key("encoder_ffn_dim", "d_ff", 1536),
        Key("decoder_ffn_dim", "d_ff", 1536, same_as("decoder_ffn_dim", "encoder_ffn_dim")),
        Key("encoder_layers", "n_encoder_layers", 4),
        Key("decoder_layers", "n_decoder_layers", 4),
        Key("activation_function", "activation", "gelu", write=activation_to_hf, **ACTIVATION_KEY),
        Key("max_source_positions", "source_positions", 1500),
        Key("max_target_positions", "max_len", 448),
        Key("pad_token_id", "pad_id", 50256, whisper_token("pad_token_id")),
        # embed_tokens is nn.Embedding(padding_idx=pad): lookups of pad pass no gradient to the table
        Key("pad_token_id", "embedding_padding_idx", 50256, lambda value, c: value is not None, written=False),
        # the decoder's start token is our bos_id (config.json's bos_token_id is the vocabulary's, kept as read)
        Key("decoder_start_token_id", "bos_id", 50257, whisper_token("decoder_start_token_id")),
        Key("eos_token_id", "eos_id", 50256, lambda value, c: end_token_ids(c, c.get("vocab_size", 51865))),
        Key("tie_word_embeddings", "tie_embeddings", True),
        Key("is_encoder_decoder", None, True, allowed=(True,)),
        Key("scale_embedding", None, False, allowed=(False, None)),  # transformers never applies its embed_scale
        Key("apply_spec_augment", None, False, allowed=(False, None)),  # SpecAugment's random masks: not computed
        Key("encoder_layerdrop", None, 0.0, allowed=(0, 0.0, None)),  # dropping whole layers: not computed
        Key("decoder_layerdrop", None, 0.0, allowed=(0, 0.0, None)),
        Key("use_weighted_layer_sum", None, False, allowed=(False, None), written=False),  # a classifier's
    ),
    SEQ2SEQ_DROPOUT,
    supports={
        "n_mels": ANY,
        "source_positions": ANY,
        "activation": ANY,
        "tie_embeddings": ANY,
        "norm_first": True,
        "positional": "learned",
        "scale_embeddings": False,
        "output_bias": False,
    },  # fmt: skip
    fixed={"layer_norm_eps": 1e-5},  # nn.LayerNorm's default, which every norm of Whisper uses
)


def whisper_rules() -> tuple[Rule, ...]:
    """Our names -> WhisperModel's (below "model."), and proj_out (the head's own, when untied)."""
    rules = [
        Rule(f"encoder.{conv}.{w}", f"encoder.{conv}.{w}") for conv in ("conv1", "conv2") for w in ("weight", "bias")
    ]
    rules += [
        Rule("encoder.position_table", "encoder.embed_positions.weight"),  # fixed, read as stored
        Rule("decoder.token_embedding.weight", "decoder.embed_tokens.weight"),
        Rule("decoder.position_embedding.weight", "decoder.embed_positions.weight"),
    ]
    attention = (("self_attn", "self_attn"), ("cross_attn", "encoder_attn"))
    for stack in ("encoder", "decoder"):
        layer = f"{stack}.layers.{{i}}"
        for ours, theirs in attention if stack == "decoder" else attention[:1]:
            rules += [Rule(f"{layer}.{ours}.k_proj.weight", f"{layer}.{theirs}.k_proj.weight")]  # no key bias
            rules += [
                Rule(f"{layer}.{ours}.{p}_proj.{w}", f"{layer}.{theirs}.{p}_proj.{w}")
                for p in ("q", "v", "out")
                for w in ("weight", "bias")
            ]
            rules += [Rule(f"{layer}.{ours}_norm.{w}", f"{layer}.{theirs}_layer_norm.{w}") for w in ("weight", "bias")]
        for ours, theirs in (("ffn.linear1", "fc1"), ("ffn.linear2", "fc2"), ("ffn_norm", "final_layer_norm")):
            rules += [Rule(f"{layer}.{ours}.{w}", f"{layer}.{theirs}.{w}") for w in ("weight", "bias")]
        rules += [Rule(f"{stack}.final_norm.{w}", f"{stack}.layer_norm.{w}") for w in ("weight", "bias")]
    rules.append(Rule("output_proj.weight", "proj_out.weight", head=True))  # only when untied
    return tuple(rules)


WHISPER = declared(
    WHISPER_CONFIG,
    model_class="SpeechTransformer",
    architecture="WhisperForConditionalGeneration",
    prefixes=("model.", ""),
    rules=whisper_rules(),
    skipped=(r"proj_out\.weight",),  # when tied: a copy of the decoder's table (checked equal)
    tied=(("proj_out.weight", "model.decoder.embed_tokens.weight", "tie_embeddings"),),
)

# what this file adds to transformer_spec.families.FAMILIES (found by the package, no list to edit)
REGISTER = (WHISPER,)
