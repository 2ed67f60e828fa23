"""The registry of levels a user's module is judged at: one entry each, named once here.

An entry gives the level's name, its group ("component", "layer", "model"; the judge's matchers, stages and
mapping read the group, not the name), its data inputs in the order the reference takes them (what a caller
passes the user's module, calling.callers), and, for a model, its stacks in forward order (the prefixes of its
parameters, "encoder" and "decoder", which the mapping deals the layers to and the stages hook), and the config
fields the report shows (what the level's reference reads). What each level computes, and its probe, are in
levels.py.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Level:
    name: str
    group: str  # "component", "layer", "model", or "stacks" (torch.nn.Transformer's two stacks on embeddings)
    inputs: tuple  # the reference's data inputs, in calling order
    stacks: tuple = ()  # a model's stacks, in forward order
    shown: tuple | None = None  # the config fields the report shows (what the level's reference reads); None: a
    # model's (MODEL_SHOWN)


LAYER_SHOWN = ("d_model", "n_heads", "d_ff", "norm_first", "activation", "layer_norm_eps", "bias")
DECODER_ONLY_SHOWN = (
    "d_model", "n_heads", "n_kv_heads", "d_ff", "norm_first", "norm", "activation", "gated_ffn", "positional",
    "rope_theta", "layer_norm_eps", "bias",
)  # fmt: skip
MODEL_SHOWN = (
    "src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff", "n_encoder_layers", "n_decoder_layers",
    "norm_first", "norm", "activation", "gated_ffn", "n_kv_heads", "positional", "rope_theta", "max_len",
    "scale_embeddings", "tie_embeddings", "share_embeddings", "bias", "output_bias", "layer_norm_eps", "pad_id",
)  # fmt: skip

LEVELS = {
    level.name: level
    for level in (
        Level("scaled_dot_product_attention", "component", ("q", "k", "v"), shown=()),
        Level(
            "multi_head_attention",
            "component",
            ("query", "key", "value"),
            shown=("d_model", "n_heads", "n_kv_heads", "positional", "rope_theta"),
        ),
        Level("layer_norm", "component", ("x",), shown=("d_model", "layer_norm_eps")),
        Level("rms_norm", "component", ("x",), shown=("d_model", "layer_norm_eps")),
        Level("feed_forward", "component", ("x",), shown=("d_model", "d_ff", "activation")),
        Level("gated_feed_forward", "component", ("x",), shown=("d_model", "d_ff", "activation", "bias")),
        Level(
            "positional_encoding", "component", ("x",), shown=("d_model", "positional", "max_len", "sinusoid_layout")
        ),
        Level("embedding", "component", ("ids",), shown=("d_model", "src_vocab_size", "scale_embeddings")),
        Level("encoder_layer", "layer", ("x",), shown=LAYER_SHOWN),
        Level("decoder_layer", "layer", ("x", "memory"), shown=LAYER_SHOWN),
        Level("decoder_only_layer", "layer", ("x",), shown=DECODER_ONLY_SHOWN),  # a GPT or Llama block, no memory
        Level("transformer", "model", ("src", "tgt"), ("encoder", "decoder")),
        Level("transformer_lm", "model", ("ids",), ("decoder",)),
        Level("encoder_model", "model", ("ids",), ("encoder",)),
        Level("decoder", "model", ("tgt", "memory"), ("decoder",)),  # ids and a memory in
        # torch.nn.Transformer checked as "transformer": its two stacks on embeddings, each with its final norm
        Level("transformer_stacks", "stacks", ("src", "tgt"), ("encoder", "decoder")),
    )
}


def named(group: str) -> tuple:
    """The levels of `group`, in registry order."""
    return tuple(name for name, level in LEVELS.items() if level.group == group)


DATA = {name: level.inputs for name, level in LEVELS.items()}
STACKS_OF = {name: level.stacks for name, level in LEVELS.items() if level.stacks}


def shown(reference: str) -> tuple:
    """The config fields the report shows for a check against `reference` (a model's for "encoder", its alias)."""
    level = LEVELS.get(reference)
    return MODEL_SHOWN if level is None or level.shown is None else level.shown
