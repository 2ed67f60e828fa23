"""How a user's module is called: layout, argument order, and the masks in the user's own convention.

A `Caller` turns the reference's probe (batch-first arrays, masks as "which positions are real") into one call of
the user's module and returns its output batch-first. `callers` lists the candidates a module's signature allows;
the check keeps the first whose output matches the reference (and says which it used), or, when none matches, the
first that runs, and diagnoses from there.

Mask kinds: "bool_keep" (True = may attend), "bool_masked" (True = masked), "int_keep" (1 = may attend, 0/1
integers), "additive" (0 where allowed, -1e9 where masked, added to the scores). Shapes: a padding mask as (B, T_k),
(B, 1, T_k) or (B, 1, 1, T_k); a causal target mask as (T, T), or with the target's padding as (B, T, T) or
(B, 1, T, T).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from .levels import LEVELS

MASK_KINDS = ("bool_keep", "bool_masked", "int_keep", "additive")
PAD_SHAPES = ("(B, 1, 1, T)", "(B, 1, T)", "(B, T)")
CAUSAL_SHAPES = ("(B, 1, T, T)", "(B, T, T)", "(T, T)")
TARGET_WORDS = ("tgt", "trg", "target", "self", "dec", "causal", "look_ahead", "subsequent", "attn_mask")


@dataclass
class Caller:
    """One way of calling the user's module; `conventions` says it in words for the result."""

    batch_first: bool
    order: tuple  # the probe's data names in the order the module takes them
    masks: dict = field(default_factory=dict)  # parameter name -> (role "src"/"tgt", kind, shape)
    self_attention: bool = False
    extra: dict = field(default_factory=dict)  # fixed keyword arguments (need_weights=False, ...)
    call: Callable | None = None  # a user's call= adapter
    causal: bool = False  # a self-attention that masks the future (itself, or by the causal mask it is given)
    keywords: tuple = ()  # the data passed by these names (a mask parameter sits between them: transformers')
    template: tuple | None = None  # (args, kwargs) of slots as an example call passes them (example.py)

    def conventions(self) -> dict:
        out: dict = {"batch_first": self.batch_first}
        if self.masks:
            out["mask"] = "; ".join(f"{name}: {kind} {shape}" for name, (_, kind, shape) in self.masks.items())
        elif self.call is None:
            out["mask"] = "none passed (built inside the module, or none)"
        if self.order and self.order not in (("query", "key", "value"), ("query",) * 3) and len(self.order) == 3:
            out["argument_order"] = ", ".join(self.order)
        if self.causal:
            out["attention"] = "causal self-attention: one input, the future masked"
        elif self.self_attention:
            out["attention"] = "self-attention: one input (query = key = value)"
        if self.call is not None:
            out["call"] = "the call= adapter"
        if self.template is not None:
            out["call"] = "as the example calls it"
        return out

    def __call__(self, module, tensors: dict, probe, dtype):
        """Run the module on `tensors` (name -> batch-first tensor); return its output batch-first."""
        if self.call is not None:  # the data in the reference's order: call(module, src, tgt), call(module, ids), ...
            return first_tensor(self.call(module, *[tensors[n] for n in self.order]))
        args = [tensors[n] if self.batch_first else tensors[n].transpose(0, 1) for n in self.order]
        kwargs = dict(self.extra)
        device = args[0].device
        if self.template is not None:  # as the example calls it: its data, its masks, the rest as given (or made)
            values = {"data": lambda n: args[self.order.index(n)], "fixed": lambda v: v}
            values |= {
                "mask": lambda n: user_mask(probe, *self.masks[n], dtype, device),
                "made": lambda f: f(dtype, device),
            }
            args_t, kwargs_t = self.template
            args, kwargs = [values[k](v) for k, v in args_t], {n: values[k](v) for n, (k, v) in kwargs_t.items()}
        else:
            if self.keywords:
                kwargs |= dict(zip(self.keywords, args, strict=False))
                args = args[len(self.keywords) :]
            for name, (role, kind, shape) in self.masks.items():
                kwargs[name] = user_mask(probe, role, kind, shape, dtype, device)
        out = first_tensor(module(*args, **kwargs))
        return out if self.batch_first or out.ndim < 2 else out.transpose(0, 1)


def first_tensor(out):
    """A module's output: the tensor itself, the first tensor of a tuple (nn.MultiheadAttention's `(out, weights)`,
    minGPT's `(logits, loss)` with loss None), or a mapping's "logits" (transformers' ModelOutput, a dict), else
    its first value that is not None."""
    while isinstance(out, (tuple, list, Mapping)):
        if isinstance(out, Mapping):
            values = [out["logits"]] if out.get("logits") is not None else [v for v in out.values() if v is not None]
        else:
            values = [v for v in out if v is not None]
        if not values:
            break
        out = values[0]
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"the module returned {type(out).__name__}, expected a tensor or a tuple starting with one")
    return out


def logical_mask(probe, role: str, shape: str) -> np.ndarray:
    """The reference's mask for one role in `shape`, True = may attend: role "src" the keys' padding, "tgt" the
    causal mask (with the target's padding on the keys, as tutorials build it, where the shape has a batch axis)."""
    if role == "src":
        keep = probe.src_keep
        return {"(B, 1, 1, T)": keep[:, None, None, :], "(B, 1, T)": keep[:, None, :], "(B, T)": keep}[shape]
    T = probe.tgt_keep.shape[1] if probe.tgt_keep is not None else next(iter(probe.floats.values())).shape[1]
    causal = np.tril(np.ones((T, T), dtype=bool))
    if shape == "(T, T)":
        return causal
    keep = causal[None] & (probe.tgt_keep[:, None, :] if probe.tgt_keep is not None else True)
    return keep[:, None] if shape == "(B, 1, T, T)" else keep


def user_mask(probe, role, kind, shape, dtype, device) -> torch.Tensor:
    keep = torch.from_numpy(np.ascontiguousarray(logical_mask(probe, role, shape))).to(device)
    if kind == "bool_keep":
        return keep
    if kind == "bool_masked":
        return ~keep
    if kind == "int_keep":
        return keep.long()
    return torch.zeros(keep.shape, dtype=dtype, device=device).masked_fill(~keep, -1e9)


PAD_KEYS = ("src", "bool_masked", "(B, T)")  # torch's key-padding masks: (B, T), True = masked
CAUSAL = ("tgt", "bool_masked", "(T, T)")  # torch's causal masks: (T, T), True = masked
# torch.nn's own modules, by the level they are checked at (their data inputs: the level's, in its order):
# (class, masks by argument name, fixed keyword arguments)
TORCH_BUILTINS = {
    "multi_head_attention": (nn.MultiheadAttention, {"key_padding_mask": PAD_KEYS}, {"need_weights": False}),
    "transformer_stacks": (
        nn.Transformer,
        {"tgt_mask": CAUSAL, "src_key_padding_mask": PAD_KEYS, "memory_key_padding_mask": PAD_KEYS},
        {},
    ),
    "encoder_layer": (nn.TransformerEncoderLayer, {"src_key_padding_mask": PAD_KEYS}, {}),
    "decoder_layer": (nn.TransformerDecoderLayer, {"tgt_mask": CAUSAL, "memory_key_padding_mask": PAD_KEYS}, {}),
    "encoder_stack": (nn.TransformerEncoder, {"src_key_padding_mask": PAD_KEYS}, {}),
    "decoder_stack": (nn.TransformerDecoder, {"tgt_mask": CAUSAL, "memory_key_padding_mask": PAD_KEYS}, {}),
}


def torch_builtin_callers(module, level) -> list | None:
    """The call of torch.nn's own attention, layer or stack (TORCH_BUILTINS), batch_first as the module says."""
    builtin = TORCH_BUILTINS.get(level)
    if builtin is None or not isinstance(module, builtin[0]):
        return None
    _, masks, extra = builtin
    owner = module.layers[0] if isinstance(module, (nn.TransformerEncoder, nn.TransformerDecoder)) else module
    bf = bool(getattr(getattr(owner, "self_attn", owner), "batch_first", False))
    return [Caller(bf, LEVELS[level].inputs, dict(masks), extra=dict(extra))]


def _signature(module, n_data: int) -> tuple:
    """The user's forward as the callers read it: (its positional parameters, the names of those named for masks,
    the names of the data parameters: without defaults; or, when every one is optional, the first n_data)."""
    forward = module.forward if isinstance(module, nn.Module) else module
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = [p for p in inspect.signature(forward).parameters.values() if p.kind in kinds]
    masks = [p.name for p in params if "mask" in p.name.lower()]
    data = [p.name for p in params if "mask" not in p.name.lower() and p.default is p.empty]
    if not data:  # every argument optional (transformers' forward(input_ids=None, ...)): the first ones
        data = [p.name for p in params if "mask" not in p.name.lower()][:n_data]
    return params, masks, data


def _orders(entry, level: str, data_params: list) -> list:
    """The orders the reference's data inputs may be passed in: as the reference takes them, reversed when there
    are three (value first where the module names it so), or, for an attention, one input (self-attention)."""
    data = entry.inputs
    if entry.self_attention_probes and len(data_params) == 1:
        return [("query",)]
    if len(data_params) < len(data):
        raise TypeError(
            f"the module's forward takes {data_params} (without defaults), but the reference {level!r} gives "
            f"{list(data)}: pass call=lambda module, ... to adapt it"
        )
    orders = [data]
    if len(data) == 3:
        reverse = (data[2], data[1], data[0])
        orders.insert(0 if data_params[0].lower() in ("value", "v", "values") else 1, reverse)
    if entry.self_attention_probes:  # last resort: self-attention, the one input passed three times
        orders.append(("query", "query", "query"))
    return orders


def _assigned(mask_params: list, roles: list) -> dict:
    """Each mask argument's role ("src", "tgt"), one per role: the level's only one, else read from its name."""
    assigned: dict = {}
    for name in mask_params:
        if len(roles) == 1:
            role = roles[0]
        elif any(w in name.lower() for w in ("source", "memory", "enc", "cross", "src")):
            role = "src"
        elif any(w in name.lower() for w in TARGET_WORDS):
            role = "tgt"
        else:
            continue
        if role not in assigned.values():
            assigned[name] = role
    return assigned


def _mask_kinds(mask, assigned: dict, module) -> tuple:
    """The mask kinds tried: all (detected from the outputs), the one given, or none."""
    if mask not in (None, "detect"):
        return (mask,) if mask != "none" else ()
    if set(assigned) == {"attention_mask"} and _transformers_model(module):
        return HF_MASK_KINDS  # the library's documented polarity, not read from the outputs
    return MASK_KINDS


def _masked_callers(bf, order, assigned: dict, kinds, optional: bool, causal: bool = False) -> list:
    """The callers of one layout and order: every kind and shape of the masks, then (optional) none. causal: a
    self-attention that masks the future (Llama's, GPT's), given the causal mask where it takes one."""
    self_attention = set(order) == {"query"}
    if not assigned or not kinds:
        return [Caller(bf, order, {}, self_attention, causal=causal)]
    found = []
    for kind in kinds:
        shape_lists = [CAUSAL_SHAPES if role == "tgt" else PAD_SHAPES for role in assigned.values()]
        for shapes in _product(shape_lists):
            masks = {n: (r, kind, s) for (n, r), s in zip(assigned.items(), shapes, strict=True)}
            found.append(Caller(bf, order, masks, self_attention, causal=causal))
    if optional:  # left out, last
        found.append(Caller(bf, order, {}, self_attention, causal=causal))
    return found


def callers(module, level: str, batch_first=None, mask=None, call=None) -> list:
    """Every candidate way of calling `module` at `level` (see the module docstring), most likely first (an example
    call given: example.callers instead)."""
    entry = LEVELS[level]
    if call is not None:
        found = [Caller(True, entry.inputs, call=call)]
        if entry.self_attention_probes:  # call(module, x): one input, bidirectional or causal
            found += [Caller(True, ("query",), {}, True, call=call, causal=c) for c in (False, True)]
        return found
    builtin = torch_builtin_callers(module, level)
    if builtin is not None:
        return builtin
    params, mask_params, data = _signature(module, len(entry.inputs))
    orders = _orders(entry, level, data)
    assigned = _assigned(mask_params, list(entry.masks))
    if _transformers_model(module) and "decoder_attention_mask" in mask_params:
        # transformers' encoder-decoders: attention_mask is the source's padding; the decoder builds its causal
        # mask itself (decoder_attention_mask only pads the target, whose outputs are not compared)
        assigned = {"attention_mask": "src"} if "attention_mask" in mask_params else {}
    kinds = _mask_kinds(mask, assigned, module)
    # a whole model whose masks are all optional (transformers' attention_mask=None) builds what it needs itself;
    # an attention or a layer given none would only look like one that ignores its mask
    optional = entry.builds_masks and all(p.default is not p.empty for p in params if p.name in assigned)
    optional = optional and mask in (None, "detect")
    layouts = [batch_first] if batch_first is not None else [True, False]
    if not entry.sequence_first:
        layouts = [True]  # (B, H, T, Dh) has no sequence-first form
    found = [c for bf in layouts for order in orders for c in _masked_callers(bf, order, assigned, kinds, optional)]
    if entry.self_attention_probes:  # the one input and, where the module takes a mask, the causal mask (its first)
        causal = {mask_params[0]: "tgt"} if mask_params else {}
        single = [order for order in orders if set(order) == {"query"}]
        found += [c for bf in layouts for o in single for c in _masked_callers(bf, o, causal, kinds, False, True)]
    positional = [p.name for p in params]
    for caller in found:  # forward(input_ids, attention_mask, decoder_input_ids, ...): the data by name
        n = len(caller.order)
        if positional[:n] != data[:n] and len(data) >= n:
            caller.keywords = tuple(data[:n])
    return found


# transformers' `attention_mask` is documented as 1 for tokens to attend to, 0 for padding: a model that hides the
# ones has its polarity inverted (attention.mask_inverted), not another convention.
HF_MASK_KINDS = ("int_keep", "bool_keep")


def _transformers_model(module) -> bool:
    """A transformers PreTrainedModel (read from its classes' names: no import of transformers needed)."""
    return any(c.__name__ == "PreTrainedModel" for c in type(module).__mro__)


def _product(lists):
    """Shape choices for several masks (one at least): each mask's shapes in order, the same position for all first."""
    combos: list = [()]
    for options in lists:
        combos = [c + (o,) for c in combos for o in options]
    return sorted(combos, key=lambda c: max(lists[i].index(s) for i, s in enumerate(c)))
