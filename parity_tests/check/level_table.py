"""The registry of levels a user's module is judged at: one entry each, named once here.

An entry gives the level's name, its group ("component", "layer", "model"; the judge's matchers, stages and
mapping read the group, not the name), its data inputs in the order the reference takes them (what a caller
passes the user's module, calling.callers), and, for a model, its stacks in forward order (the prefixes of its
parameters, "encoder" and "decoder", which the mapping deals the layers to and the stages hook). What each level
computes, and its probe, are in levels.py.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Level:
    name: str
    group: str  # "component", "layer", "model", or "stacks" (torch.nn.Transformer's two stacks on embeddings)
    inputs: tuple  # the reference's data inputs, in calling order
    stacks: tuple = ()  # a model's stacks, in forward order


LEVELS = {
    level.name: level
    for level in (
        Level("scaled_dot_product_attention", "component", ("q", "k", "v")),
        Level("multi_head_attention", "component", ("query", "key", "value")),
        Level("layer_norm", "component", ("x",)),
        Level("rms_norm", "component", ("x",)),
        Level("feed_forward", "component", ("x",)),
        Level("gated_feed_forward", "component", ("x",)),
        Level("positional_encoding", "component", ("x",)),
        Level("embedding", "component", ("ids",)),
        Level("encoder_layer", "layer", ("x",)),
        Level("decoder_layer", "layer", ("x", "memory")),
        Level("decoder_only_layer", "layer", ("x",)),  # a GPT or Llama block, no memory
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
