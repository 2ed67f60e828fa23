"""The levels a user's module is judged at: the registry, one entry (Level) each, saying what the reference
computes there, what is inferred and probed, and how it relates to other levels (the judge reads the entry's
fields, never the level's name: a new level is one entry here, a new kind of math its runner in reference.py); then
the reference's random weights, and its forward and hand-written backward on a probe (probes.py)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn

from . import probes as P
from . import reference as R
from .probes import Probe


@dataclass(frozen=True)
class Level:
    name: str
    group: str  # "component", "layer", "model", or "stacks" (layers on embeddings, no embedding or output head)
    inputs: tuple  # the reference's data inputs, in calling order
    probe: Callable  # (cfg, rng, self_attention, causal, sizes) -> probes.Probe
    unit: str | None = None  # a component's math: "heads", "attention", "layer_norm", "rms_norm", "feed_forward",
    # "gated_feed_forward", "positions", "embedding"; None for layers, stacks and models (dealt layer by layer)
    stacks: tuple = ()  # a model's stacks, in forward order (its parameters' prefixes)
    shown: tuple | None = None  # the config fields the report shows; None: a model's (MODEL_SHOWN)
    masks: tuple = ()  # the masks its attentions read: "src" (padding of the keys), "tgt" (causal)
    cross: bool = False  # its decoder layers cross-attend to a memory
    causal: bool = False  # a layer whose self-attention is causal
    heads: bool = False  # multi-head attentions from projections: n_heads needed, attention pieces dealt
    rope: bool = False  # rotary positions may be tried
    searches: tuple = ()  # config fields the outputs decide: "norm_first", "activation", "scale_embeddings"
    output_head: bool = False  # an output projection to logits (the output may be logits, log-probs or probs)
    final_norms: str = ""  # "always", "pre-norm" (when the layers are pre-norm, or as the flow shows), "" (none)
    self_attention_probes: bool = False  # also probed as a self-attention, causal or not (an attention's)
    padded_source: bool = False  # a cross-attention on a padded source: the fully padded source is probed
    scale_caveat: bool = False  # a model of the paper's kind: no embedding scale is caveated as a mistake
    stands_for: tuple | None = None  # (level, torch class): judged in place of that level for that torch module
    takes_function: bool = False  # the user may give a plain function, not a module
    sequence_first: bool = True  # the user's module may take sequence-first inputs (T, B, D)

    @property
    def hooked(self) -> bool:
        """A layer, a model or one stack: its submodules are compared with the reference's stages (reference.stages)."""
        return self.group in ("layer", "model") or (self.group == "stacks" and len(self.stacks) == 1)

    @property
    def across_positions(self) -> bool:
        """Whether an output may read other positions or its own index (attentions, position tables, layers, models):
        what only a longer sequence may show; a norm, a feed-forward or an embedding computes each position alone."""
        return self.heads or self.unit in ("heads", "positions") or self.group != "component"

    @property
    def encoder_only(self) -> bool:
        return self.stacks == ("encoder",)

    @property
    def decoder_only(self) -> bool:
        """A decoder-only layer or model: causal, no cross-attention (its layers may be parallel blocks)."""
        causal = self.causal if self.group == "layer" else self.group == "model" and self.stacks == ("decoder",)
        return causal and not self.cross

    @property
    def ids(self) -> tuple:
        """The inputs its probe gives as token ids: a model's (a decoder's memory is floats), an embedding's."""
        named = self.group == "model" or self.unit == "embedding"
        return tuple(n for n in self.inputs if n != "memory") if named else ()

    @property
    def builds_masks(self) -> bool:
        """A whole model on token ids alone may build its own masks (its mask arguments optional)."""
        return self.group == "model" and "memory" not in self.inputs

    def n_layers(self, n_attentions: int, n_ffns: int) -> tuple[int, int]:
        """(encoder layers, decoder layers) of a stack or model holding these attentions and feed-forwards: an
        encoder layer has one of each, a decoder layer two attentions (cross: self and cross) and one block."""
        if self.group == "layer":
            return 1, 1
        if self.stacks == ("encoder", "decoder"):  # its decoder layers cross-attend: one attention more each
            return 2 * n_ffns - n_attentions, n_attentions - n_ffns
        if self.stacks == ("decoder",):
            return 0, n_attentions // (2 if self.cross else 1)
        return (n_attentions, 0) if self.encoder_only else (0, 0)

    def layer_norm_count(self, n_enc: int, n_dec: int) -> int:
        """The norms inside the layers: two per encoder layer, three per cross-attending decoder layer."""
        return 2 * n_enc + (3 if self.cross else 2) * n_dec


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
LAYER: dict[str, Any] = dict(heads=True, searches=("norm_first", "activation"))
MODEL: dict[str, Any] = dict(
    heads=True, rope=True, searches=("norm_first", "activation", "scale_embeddings"), final_norms="pre-norm"
)

LEVELS = {
    level.name: level
    for level in (
        Level(
            "scaled_dot_product_attention", "component", ("q", "k", "v"), P.heads, unit="heads", shown=(),
            masks=("src",), takes_function=True, sequence_first=False,
        ),
        Level(
            "multi_head_attention", "component", ("query", "key", "value"), P.attention, unit="attention",
            shown=("d_model", "n_heads", "n_kv_heads", "positional", "rope_theta"), masks=("src",), heads=True,
            rope=True, self_attention_probes=True, padded_source=True,
        ),
        Level("layer_norm", "component", ("x",), P.features, unit="layer_norm", shown=("d_model", "layer_norm_eps")),
        Level("rms_norm", "component", ("x",), P.features, unit="rms_norm", shown=("d_model", "layer_norm_eps")),
        Level(
            "feed_forward", "component", ("x",), P.features, unit="feed_forward",
            shown=("d_model", "d_ff", "activation"), searches=("activation",),
        ),
        Level(
            "gated_feed_forward", "component", ("x",), P.features, unit="gated_feed_forward",
            shown=("d_model", "d_ff", "activation", "bias"), searches=("activation",),
        ),
        Level(
            "positional_encoding", "component", ("x",), P.features, unit="positions",
            shown=("d_model", "positional", "max_len", "sinusoid_layout"),
        ),
        Level(
            "embedding", "component", ("ids",), P.vocabulary, unit="embedding",
            shown=("d_model", "src_vocab_size", "scale_embeddings"),
        ),
        Level(  # a BERT or bidirectional Llama block (rotary where its tables say)
            "encoder_layer", "layer", ("x",), P.padded_features, shown=LAYER_SHOWN, masks=("src",), rope=True, **LAYER
        ),
        Level(
            "decoder_layer", "layer", ("x", "memory"), P.features_and_memory, shown=LAYER_SHOWN, masks=("tgt", "src"),
            cross=True, causal=True, padded_source=True, **LAYER,
        ),
        Level(  # a GPT or Llama block, no memory
            "decoder_only_layer", "layer", ("x",), P.causal_features, shown=DECODER_ONLY_SHOWN, masks=("tgt",),
            causal=True, rope=True, **LAYER,
        ),
        Level(
            "transformer", "model", ("src", "tgt"), P.source_and_target_ids, stacks=("encoder", "decoder"),
            masks=("tgt", "src"), cross=True, output_head=True, padded_source=True, scale_caveat=True, **MODEL,
        ),
        Level(
            "transformer_lm", "model", ("ids",), P.target_ids, stacks=("decoder",), masks=("tgt",), output_head=True,
            **MODEL,
        ),
        Level(
            "encoder_model", "model", ("ids",), P.source_ids, stacks=("encoder",), masks=("src",), scale_caveat=True,
            **MODEL,
        ),
        Level(  # ids and a memory in: an encoder-decoder's decoder stack, before its output projection
            "decoder", "model", ("tgt", "memory"), P.target_ids_and_memory, stacks=("decoder",), masks=("tgt", "src"),
            cross=True, scale_caveat=True, **MODEL,
        ),
        Level(  # torch.nn.Transformer: its two stacks on embeddings, each with its final norm
            "transformer_stacks", "stacks", ("src", "tgt"), P.source_and_target, stacks=("encoder", "decoder"),
            cross=True, heads=True, searches=("norm_first", "activation"), final_norms="always", padded_source=True,
            stands_for=("transformer", nn.Transformer),
        ),
        Level(  # nn.TransformerEncoder, the Annotated Transformer's Encoder(layer, N): layers on embeddings
            "encoder_stack", "stacks", ("x",), P.padded_features, stacks=("encoder",), masks=("src",), heads=True,
            searches=("activation",), final_norms="pre-norm", shown=LAYER_SHOWN + ("n_encoder_layers",),
        ),
        Level(  # nn.TransformerDecoder, the Annotated Transformer's Decoder(layer, N): cross-attending layers
            "decoder_stack", "stacks", ("x", "memory"), P.features_and_memory, stacks=("decoder",),
            masks=("tgt", "src"), cross=True, heads=True, searches=("activation",), final_norms="pre-norm",
            padded_source=True, shown=LAYER_SHOWN + ("n_decoder_layers",),
        ),
    )
}  # fmt: skip
ALIASES = {"encoder": "encoder_model"}  # the same math: ids -> the encoder's output


def standing_for(level: str, module) -> str:
    """The level `module` is judged at when its check names `level`: the entry that stands for `level` when the
    module is torch's own class of it (torch.nn.Transformer for "transformer"), else `level` (or its alias's)."""
    level = ALIASES.get(level, level)
    for entry in LEVELS.values():
        if entry.stands_for is not None and entry.stands_for[0] == level and isinstance(module, entry.stands_for[1]):
            return entry.name
    return level


# the levels a user names, by group (the alias before the models): all but the stacks judged in another's place
REFERENCES = tuple(name for name, level in LEVELS.items() if level.group in ("component", "layer")) + tuple(ALIASES)
REFERENCES += tuple(
    name for name, level in LEVELS.items() if level.group in ("model", "stacks") and not level.stands_for
)


def run_reference(level: str, params: dict, p: Probe, cfg, dtype):
    """The reference's forward at `level` on probe `p`, in `dtype`: (out, backward), where backward(dout) -> (input
    gradients by name, parameter gradients by name), from the hand-written backward passes."""
    params = {k: v.astype(dtype) for k, v in params.items()}
    return R.runner(LEVELS[level])(params, p.astype(dtype), cfg, dtype)


def init_reference(shapes: dict, rng, zero: list) -> dict:
    """Random float64 reference parameters: weights ~ N(0, 1/fan_in), norm scales near 1, biases small;
    the biases the user's linears lack (`zero`) held at zero."""
    params = {}
    for name, shape in shapes.items():
        if len(shape) == 2:
            params[name] = rng.standard_normal(shape) / math.sqrt(shape[1] if "embedding" not in name else 1.0)
        elif name.endswith("norm.weight") or name == "weight":
            params[name] = 1.0 + 0.2 * rng.standard_normal(shape)
        else:
            params[name] = 0.2 * rng.standard_normal(shape)
        if name in zero:
            params[name] = np.zeros(shape)
    return params
