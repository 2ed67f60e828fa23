"""T5 (T5ForConditionalGeneration; the original ReLU model and v1.1's gated GELU): pre-norm RMSNorm encoder-decoder
without biases, no position table but one learned relative position bias per stack (stored on block 0, read by every
layer), attention without the 1/sqrt(d) scale, one token table for both stacks, and a tied head that reads
d_model^-0.5 times the hidden states.
"""

from __future__ import annotations

from dataclasses import replace

from .core import ANY, ConfigMap, Key, Rule, declared, is_int, refuse, special_token, token_id

T5_DROPOUT = {"dropout_rate": (("embedding", "attention", "activation", "residual"), 0.1)}
T5_ACTIVATIONS = {"relu": ("relu", False), "gated-gelu": ("gelu_tanh", True), "gated-relu": ("relu", True)}


def feed_forward_proj(config) -> str:
    """config.json's feed_forward_proj for our (activation, gated_ffn); ValueError for a pair T5 does not have."""
    proj = {(a, g): name for name, (a, g) in T5_ACTIVATIONS.items()}.get((config.activation, config.gated_ffn))
    if proj is None:
        raise ValueError(
            f"this model cannot be written as a 't5' checkpoint: activation={config.activation!r} with "
            f"gated_ffn={config.gated_ffn} (T5 has relu, gated gelu_tanh, gated relu)"
        )
    return proj


def d_kv(value, c: dict) -> int | None:
    """d_kv -> head_dim: None when it is d_model / num_heads (or null, absent); else its own width, as flan-t5-small's
    6 heads of 64 in a d_model of 512 (q, k, v project to heads x d_kv, o back to d_model)."""
    heads = c["num_heads"]
    if value is None or value * heads == c["d_model"]:
        return None
    if not (is_int(value) and value >= 1):
        refuse("d_kv", value, "a positive integer")
    return int(value)


def output_scale(value, c: dict) -> float:
    """transformers 5 always ties T5's head to `shared` (unless the file holds a different lm_head.weight: then
    resolve_ties unties it) and reads the d_model^-0.5 rescaling from scale_decoder_outputs; older configs said both
    with tie_word_embeddings (false: v1.1's own head, unscaled)."""
    scaled = c.get("scale_decoder_outputs", c.get("tie_word_embeddings", True) is not False)
    return c["d_model"] ** -0.5 if scaled else 1.0


def start_token(value, c: dict) -> int | None:
    """The decoder's start token, our bos_id: decoder_start_token_id, else T5's pad."""
    return token_id({"start": c.get("decoder_start_token_id", c.get("pad_token_id", 0))}, "start", c["vocab_size"])


def scaled(config) -> bool:
    return config.output_scale != 1.0


T5_CONFIG = ConfigMap(
    model_type="t5",
    keys=(
        Key("vocab_size", ("tgt_vocab_size", "src_vocab_size")),
        Key("d_model", "d_model"),
        Key("d_kv", "head_dim", None, d_kv, source="d_head"),
        Key("d_ff", "d_ff"),
        Key("num_heads", "n_heads"),
        Key("num_layers", "n_encoder_layers"),
        Key("num_decoder_layers", "n_decoder_layers", None, lambda value, c: value or c["num_layers"]),
        Key(
            "feed_forward_proj",
            "activation",
            "relu",
            lambda value, c: T5_ACTIVATIONS[value][0],
            source=feed_forward_proj,
            allowed=tuple(T5_ACTIVATIONS),
        ),
        Key("feed_forward_proj", "gated_ffn", "relu", lambda value, c: T5_ACTIVATIONS[value][1], written=False),
        Key("relative_attention_num_buckets", "relative_buckets", 32),
        Key("relative_attention_max_distance", "relative_max_distance", 128),
        Key("n_positions", "max_len", None, lambda value, c: value or 512, written=False),  # no table: decoding's
        Key("layer_norm_epsilon", "layer_norm_eps", 1e-6),
        # transformers 5 reads the scale from scale_decoder_outputs, older versions from tie_word_embeddings; an
        # untied head is written as lm_head.weight (transformers keeps a tied copy that differs apart)
        Key("scale_decoder_outputs", "output_scale", None, output_scale, source=scaled),
        Key("tie_word_embeddings", None, source=scaled, read_too=False),
        Key("pad_token_id", "pad_id", None, special_token("pad_token_id")),
        Key("eos_token_id", "eos_id", None, special_token("eos_token_id")),
        Key("decoder_start_token_id", "bos_id", None, start_token),
        Key("is_encoder_decoder", None, True, read_too=False),
    ),  # fmt: skip
    dropout=T5_DROPOUT,
    supports={
        "activation": ("relu", "gelu_tanh"),
        "gated_ffn": ANY,
        "norm": "rms",
        "norm_first": True,
        "positional": "relative",
        "relative_buckets": ANY,
        "relative_max_distance": ANY,
        "attention_scale": 1.0,  # T5 folds 1/sqrt(d) into its initialisation
        "output_scale": lambda c: (1.0, c.d_model**-0.5),
        "bias": False,
        "qkv_bias": (None, False),
        "output_bias": False,
        "scale_embeddings": False,
        "share_embeddings": ANY,
        "tie_embeddings": ANY,
        "head_dim": ANY,
    },  # fmt: skip
    fixed={"tie_embeddings": True, "share_embeddings": True},
)


def t5_rules() -> tuple[Rule, ...]:
    attention = (("q", "q"), ("k", "k"), ("v", "v"), ("out", "o"))
    shared, separate = ("share_embeddings", True), ("share_embeddings", False)
    rules = [
        Rule("decoder.token_embedding.weight", "shared.weight", when=shared),
        Rule("encoder.token_embedding.weight", "encoder.embed_tokens.weight", when=separate),
        Rule("decoder.token_embedding.weight", "decoder.embed_tokens.weight", when=separate),
        Rule("encoder.relative_bias.weight", "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
        Rule("decoder.relative_bias.weight", "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
        Rule("encoder.final_norm.weight", "encoder.final_layer_norm.weight"),
        Rule("decoder.final_norm.weight", "decoder.final_layer_norm.weight"),
        Rule("output_proj.weight", "lm_head.weight", head=True),  # only when untied
    ]
    for stack, sublayers in (("encoder", ("self_attn", "ffn")), ("decoder", ("self_attn", "cross_attn", "ffn"))):
        for n, sublayer in enumerate(sublayers):
            block = f"{stack}.block.{{i}}.layer.{n}"
            rules.append(Rule(f"{stack}.layers.{{i}}.{sublayer}_norm.weight", f"{block}.layer_norm.weight"))
            if sublayer == "ffn":
                dense = f"{block}.DenseReluDense"
                rules += [
                    Rule(f"{stack}.layers.{{i}}.ffn.gate.weight", f"{dense}.wi_0.weight", when=("gated_ffn", True)),
                    Rule(f"{stack}.layers.{{i}}.ffn.linear1.weight", f"{dense}.wi_1.weight", when=("gated_ffn", True)),
                    Rule(f"{stack}.layers.{{i}}.ffn.linear1.weight", f"{dense}.wi.weight", when=("gated_ffn", False)),
                    Rule(f"{stack}.layers.{{i}}.ffn.linear2.weight", f"{dense}.wo.weight"),
                ]
            else:
                module = "SelfAttention" if sublayer == "self_attn" else "EncDecAttention"
                rules += [
                    Rule(f"{stack}.layers.{{i}}.{sublayer}.{ours}_proj.weight", f"{block}.{module}.{theirs}.weight")
                    for ours, theirs in attention
                ]
    return tuple(rules)


T5 = declared(
    T5_CONFIG,
    model_class="Transformer",
    architecture="T5ForConditionalGeneration",
    prefixes=("",),
    rules=t5_rules(),
    skipped=(
        r"(encoder|decoder)\.embed_tokens\.weight",  # the stacks' views of shared.weight (checked equal)
        r"shared\.weight",  # with separate tables: unused
        r"lm_head\.weight",  # when tied: shared.weight again (checked equal)
    ),
    tied=(
        ("encoder.embed_tokens.weight", "shared.weight", "share_embeddings"),
        ("decoder.embed_tokens.weight", "shared.weight", "share_embeddings"),
        ("lm_head.weight", "shared.weight", "tie_embeddings"),
        ("lm_head.weight", "decoder.embed_tokens.weight", "tie_embeddings"),  # separate tables, tied output
    ),
)


# T5EncoderModel: T5's encoder stack alone, read as an EncoderModel (hidden states after the final RMS norm).


T5_ENCODER_CONFIG = T5_CONFIG.variant(
    "t5",
    without=("num_decoder_layers",),
    # the decoder's: read (bos_id) or ignored, not written (config.json keeps what the checkpoint said)
    unwritten=("decoder_start_token_id", "tie_word_embeddings", "scale_decoder_outputs"),
    fixed={"n_decoder_layers": 0, "tie_embeddings": False, "output_scale": 1.0},
)


T5_ENCODER = replace(
    T5,
    model_class="EncoderModel",
    architecture="T5EncoderModel",
    rules=(
        Rule("encoder.token_embedding.weight", "shared.weight", when=("share_embeddings", True)),
        Rule("encoder.token_embedding.weight", "encoder.embed_tokens.weight", when=("share_embeddings", False)),
        *(r for r in T5.rules if r.ours.startswith("encoder.") and r.ours != "encoder.token_embedding.weight"),
    ),
    skipped=(r"encoder\.embed_tokens\.weight", r"shared\.weight"),  # a copy of shared (checked equal); unused
    from_hf=T5_ENCODER_CONFIG.from_hf,
    to_hf=T5_ENCODER_CONFIG.to_hf,
    supports=T5.supports | {"output_scale": 1.0, "tie_embeddings": False},
    tied=(("encoder.embed_tokens.weight", "shared.weight", "share_embeddings"),),
)

# what this file adds to transformer_spec.families.FAMILIES (found by the package, no list to edit)
REGISTER = (T5,)
# checkpoints of another class of a family's model_type, told apart by config.json's "architectures"
REGISTER_BY_ARCHITECTURE = (T5_ENCODER,)
