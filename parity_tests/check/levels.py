"""The levels a user's module is judged at, read through the registry (level_table.py): the reference's random
weights, its forward and hand-written backward on a probe (probes.py), and the intermediate activations inside a
layer that the user's submodules are matched against."""

from __future__ import annotations

import math

import numpy as np

from numpy_transformer import layers as L
from numpy_transformer import model as M

from . import reference as R
from . import variants as V
from .level_table import ALIASES, LEVELS, named
from .probes import B, Probe, keep_mask

__all__ = ["B", "keep_mask", "REFERENCES", "run_reference", "init_reference", "layer_trace", "layer_output"]

# the levels a user names: every one but the stacks judged in another's place (torch.nn.Transformer's)
REFERENCES = named("component") + named("layer") + tuple(ALIASES) + named("model")
REFERENCES += tuple(name for name in named("stacks") if LEVELS[name].stands_for is None)


def run_reference(level: str, params: dict, p: Probe, cfg, dtype):
    """The reference's forward at `level` on probe `p`, in `dtype`. Returns (out, backward), where
    backward(dout) -> (input gradients by name, parameter gradients by name), all from the hand-written
    backward passes."""
    params = {k: v.astype(dtype) for k, v in params.items()}
    return LEVELS[level].run(params, p.astype(dtype), cfg, dtype)


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


def layer_trace(params: dict, x, memory, self_keep, cross_keep, cfg, decoder: bool) -> list:
    """The reference's intermediate activations inside one layer, in forward order, float64: a list of
    (unit, kind, inputs, output) with unit the name below the layer ("self_attn", "self_attn_norm", ...),
    kind "attention", "norm" or "ffn", and inputs what that unit read (for attention: query, key/value, mask)."""
    trace: list = []
    sublayers = [("self_attn", self_keep)] + ([("cross_attn", cross_keep)] if decoder and memory is not None else [])
    sublayers.append(("ffn", None))
    shared = cfg.parallel_residual and cfg.shared_norm  # Phi-2's block: the feed-forward reads the attention's norm
    for name, keep in sublayers:
        weights = M.sub(params, "self_attn_norm" if shared else f"{name}_norm")
        h = L.norm_forward(weights, x, cfg.norm, cfg.layer_norm_eps)[0] if cfg.norm_first else x  # the unit's input
        if name == "ffn":
            y = R.feed_forward_output(M.sub(params, "ffn"), h, cfg)
            unit = (name, "ffn", (h,), y)
        else:
            kv = h if name == "self_attn" else memory
            rope = V.rope_knobs(cfg, rotary=name == "self_attn")
            y = V.multi_head_attention(M.sub(params, name), h, kv, kv, cfg.n_heads, keep, **rope)
            unit = (name, "attention", (h, kv, keep), y)
        if cfg.norm_first:
            trace += ([] if shared and name == "ffn" else [(f"{name}_norm", "norm", (x,), h)]) + [unit]
            x = x if cfg.parallel_residual else x + y  # parallel: every sublayer reads the layer's input
        else:
            s = x + y
            x = L.norm_forward(weights, s, cfg.norm, cfg.layer_norm_eps)[0]
            trace += [unit, (f"{name}_norm", "norm", (s,), x)]
    return trace


def layer_output(trace: list, x, cfg):
    """A layer's output from its trace (layer_trace) on input `x`: post-norm, the last norm's; pre-norm, x plus
    each sublayer's output (the residual stream)."""
    if not cfg.norm_first:
        return trace[-1][3]
    return x + sum(out for _, kind, _, out in trace if kind != "norm")
