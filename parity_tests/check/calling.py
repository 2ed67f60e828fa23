"""How a user's module is called: layout, argument order, and the masks in the user's own convention.

A `Caller` turns the reference's probe (batch-first arrays, masks as "which positions are real") into one call of
the user's module and returns its output batch-first. `callers` lists the candidates its signature (or an example
call) allows; the check keeps the first that matches the reference, else the closest that runs, and diagnoses there.

Mask kinds: "bool_keep" (True = may attend), "bool_masked" (True = masked), "int_keep" (1 = may attend, 0/1
integers), "additive" (0 where allowed, -1e9 where masked, added to the scores). Shapes: a padding mask as (B, T_k),
(B, 1, T_k) or (B, 1, 1, T_k); a causal target mask as (T, T), or with the target's padding as (B, T, T) or
(B, 1, T, T).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import itertools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from . import probes as PR
from . import tables as TB
from .levels import LEVELS

MASK_KINDS = ("bool_keep", "bool_masked", "int_keep", "additive")
PAD_SHAPES = ("(B, 1, 1, T)", "(B, 1, T)", "(B, T)")
CAUSAL_SHAPES = ("(B, 1, T, T)", "(B, T, T)", "(T, T)")
SOURCE_WORDS = ("source", "memory", "enc", "cross", "src")
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
    template: tuple | None = None  # (args, kwargs) of slots as an example call passes them (example_callers)
    time_first_output: bool = False  # a batch-first call whose output came back (T, B, ...): read turned
    positions: tuple = ()  # required arguments named for positions (position_ids): given 0 .. T - 1, (B, T)
    position_start: int = 0  # where those positions start: an example's counted from 1 are given 1 .. T
    batch: bool = False  # the keyword arguments passed as one dict, forward(batch) reading batch["input_ids"]
    bmhk: bool = False  # heads split as (B, T, H, Dh), the sequence before the heads (xformers'), in and out
    fallback: bool = False  # no mask passed to optional mask arguments: tried only where every call passing one raised

    def conventions(self) -> dict:
        out: dict = {"batch_first": self.batch_first}
        if self.masks:
            out["mask"] = "; ".join(f"{name}: {kind} {shape}" for name, (_, kind, shape) in self.masks.items())
        elif self.call is None:
            out["mask"] = "none passed (built inside the module, or none)"
        if self.order and self.order not in (("query", "key", "value"), ("query",) * 3) and len(self.order) == 3:
            out["argument_order"] = ", ".join(self.order)
        attention = (
            "causal self-attention: one input, the future masked"
            if self.causal
            else "self-attention: one input (query = key = value)"
            if self.self_attention
            else "cross-attention: the query and one memory (key = value)"
            if self.order == ("query", "key")
            else ""
        )
        out |= {"attention": attention} if attention else {}
        if self.positions:
            first = self.position_start
            out["position_ids"] = f"{', '.join(self.positions)}: the positions {first} .. T - {1 - first}, (B, T)"
        if self.time_first_output:
            out["output_layout"] = "time-first (T, B, ...), read batch-first"
        if self.batch:
            keys = ", ".join(f"{k!r}: ..." for k in (*self.keywords, *self.masks, *self.positions))
            out["call"] = f"one dict, forward({{{keys}}})"
        out |= {"layout": "(batch, seq, heads, head_dim): the sequence before the heads (BMHK)"} if self.bmhk else {}
        if self.call is not None or self.template is not None:  # exclusive: call= or example=
            out["call"] = "the call= adapter" if self.call is not None else "as the example calls it"
        return out

    def __call__(self, module, tensors: dict, probe, dtype):
        """Run the module on `tensors` (name -> batch-first tensor); return its output batch-first. Its arguments are
        slots (kind, what): the example's template, else the data in the module's order (by name where `keywords`
        says so), the fixed keywords and the masks."""
        if self.call is not None:  # the data in the reference's order: call(module, src, tgt), call(module, ids), ...
            return first_tensor(self.call(module, *[tensors[n] for n in self.order]))
        data = {n: tensors[n] if self.batch_first else tensors[n].transpose(0, 1) for n in self.order}
        data = {n: t.transpose(1, 2) for n, t in data.items()} if self.bmhk else data
        device = next(iter(data.values())).device
        values = {"data": data.__getitem__, "fixed": lambda v: v, "made": lambda f: f(dtype, device)}
        values["mask"] = lambda n: user_mask(probe, *self.masks[n], dtype, device)
        B, T = tensors[self.order[0]].shape[:2]
        values["positions"] = lambda _: torch.arange(T, device=device).expand(B, T) + self.position_start
        named = dict(zip(self.keywords, self.order, strict=False))
        args, kwargs = self.template or (
            tuple(("data", d) for d in self.order[len(named) :]),
            {k: ("fixed", v) for k, v in self.extra.items()}
            | {k: ("data", d) for k, d in named.items()}
            | {name: ("mask", name) for name in self.masks}
            | {name: ("positions", name) for name in self.positions},
        )
        kwargs = {n: values[k](v) for n, (k, v) in kwargs.items()}
        out = first_tensor(module(kwargs) if self.batch else module(*[values[k](v) for k, v in args], **kwargs))
        out = out if self.batch_first or out.ndim < 2 else out.transpose(0, 1)
        out = out.transpose(1, 2) if self.bmhk and out.ndim == 4 else out
        turned = next((t for n in self.order if (t := batch_first(out, tensors[n].shape[:2])) is not out), out)
        self.time_first_output = self.time_first_output or turned is not out
        return turned


def batch_first(t, shape):
    """`t` (a tensor or an array) as `shape` (B, T, ...) says: as it is, or turned where it holds (T, B, ...), as a
    fairseq model (or part) hands its time-first output on."""
    if t.ndim < 3 or tuple(t.shape[: len(shape)]) == tuple(shape) or tuple(t.shape[1::-1]) != tuple(shape[:2]):
        return t
    return t.swapaxes(0, 1)


def first_tensor(out):
    """A module's output: the tensor itself, the first tensor of a tuple (nn.MultiheadAttention's `(out, weights)`,
    minGPT's `(logits, loss)` with loss None), or a mapping's or a dataclass's "logits" (transformers' ModelOutput, a
    dict, a dataclass of the user's), else its first value that is not None."""
    while isinstance(out, (tuple, list, Mapping)) or (dataclasses.is_dataclass(out) and not isinstance(out, type)):
        if not isinstance(out, (tuple, list, Mapping)):  # a dataclass instance: its fields, in order, by name
            out = {f.name: getattr(out, f.name) for f in dataclasses.fields(out)}
        values = [v for v in (out.values() if isinstance(out, Mapping) else out) if v is not None]
        if not values:
            break
        out = out["logits"] if isinstance(out, Mapping) and out.get("logits") is not None else values[0]
    if not isinstance(out, torch.Tensor):
        raise TypeError(
            f"the module returned {type(out).__name__}, expected a tensor, a tuple starting with one, a dict or a "
            "dataclass holding one"
        )
    return out


def as_numpy(out) -> np.ndarray:
    """A module's output (its first tensor) as a float64 NumPy array."""
    return first_tensor(out).detach().cpu().double().numpy()


def user_mask(probe, role, kind, shape, dtype, device) -> torch.Tensor:
    """The reference's mask for one role as the user's `kind` and `shape` say: "src" the keys' padding, "tgt" the
    causal mask (with the target's padding on the keys, as tutorials build it, where the shape has a batch axis), or
    the target's padding alone where the shape is a padding mask's (HF's (B, T) attention_mask of a causal LM)."""
    kept = probe.src_keep if role == "src" else probe.tgt_keep
    if kept is None and role == "tgt":  # unpadded: its first input's batch and length
        kept = np.ones(next(iter(probe.floats.values())).shape[:2], dtype=bool)
    if shape not in CAUSAL_SHAPES:  # (B, T) with as many axes of size 1 as the shape says, in its order ((1, T, B))
        axes = shape.strip("()").split(", ")
        keep = kept if axes.index("B") < axes.index("T") else kept.T
        keep = keep.reshape([dict(zip("BT", kept.shape, strict=True)).get(a, 1) for a in axes])
    else:
        keep = np.tril(np.ones((kept.shape[1], kept.shape[1]), dtype=bool))
        if shape != "(T, T)":
            keep = keep[None] & kept[:, None, :]
            keep = keep[:, None] if shape == "(B, 1, T, T)" else keep
    keep = torch.from_numpy(np.ascontiguousarray(keep)).to(device)
    if kind == "additive":  # 0 where allowed, -1e9 where masked
        return torch.zeros(keep.shape, dtype=dtype, device=device).masked_fill(~keep, -1e9)
    return {"bool_keep": keep, "bool_masked": ~keep, "int_keep": keep.long()}[kind]


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


POSITION_NAMES = ("position_ids", "positions", "pos_ids", "input_pos", "pos")


def _signature(module, n_data: int) -> tuple:
    """The user's forward as the callers read it: (its positional parameters, the names of those named for masks,
    the names of the data parameters: without defaults, then optional ones up to n_data; the
    required ones named for positions, POSITION_NAMES); a forward(batch) of a dict: its keys (_batch_keys)."""
    forward = module.forward if isinstance(module, nn.Module) else module
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = [p for p in inspect.signature(forward).parameters.values() if p.kind in kinds]
    params = _batch_keys(forward, params) or params
    masks = [p.name for p in params if "mask" in p.name.lower()]
    positions = [p.name for p in params if p.name.lower() in POSITION_NAMES and p.default is p.empty]
    unmasked = [p for p in params if p.name not in masks + positions]
    # those without defaults, then optional ones where the level gives more (forward(x, memory=None): a decoder layer
    # run alone when no memory is given; transformers' forward(input_ids=None, ...))
    data = [p.name for p in unmasked if p.default is p.empty]
    data += [p.name for p in unmasked if p.default is not p.empty][: max(0, n_data - len(data))]
    return params, masks, data, positions


def _batch_keys(forward, params: list) -> list:
    """A forward(batch) reading its one argument as a dict (a LightningModule's, a collator's batch), batch["input_ids"]
    among what it reads: the keys its source subscripts it with, as the parameters of a forward taking them (by
    keyword, in one dict: Caller.batch); else []."""
    try:
        source = inspect.getsource(forward) if len(params) == 1 else ""
    except (OSError, TypeError):
        return []
    keys = dict.fromkeys(re.findall(rf"\b{params[0].name}\[\s*[\"'](\w+)[\"']\s*\]", source) if source else [])
    return [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY) for k in keys] if "input_ids" in keys else []


def _orders(entry, level: str, data_params: list, required: int) -> list:
    """The orders the reference's data inputs may be passed in: as the reference takes them, reversed when there
    are three (value first where the module names it so), or, for an attention, one input (self-attention: first
    where one is all it requires, forward(x, kv=None)) or two (a cross-attention's forward(x, memory): the query,
    and the key that is the value too)."""
    data = entry.inputs
    single = [("query",)] if entry.self_attention_probes and min(len(data_params), required) == 1 else []
    pair = [("query", "key")] if entry.self_attention_probes and len(data_params) == 2 else []
    if len(data_params) < len(data) and (single or pair):
        return single + pair
    if len(data_params) < len(data):
        raise TypeError(
            f"the module's forward takes {data_params} positionally (without defaults), but the reference {level!r} "
            f"gives {list(data)}: pass call=lambda module, ... to adapt it"
        )
    orders = [data]
    if len(data) == 3:
        orders.insert(0 if data_params[0].lower() in ("value", "v", "values") else 1, data[::-1])
    if entry.self_attention_probes:  # last resort: self-attention, the one input passed three times
        orders.append(("query", "query", "query"))
    return orders


def _assigned(mask_params: list, roles: list) -> dict:
    """Each mask argument's role ("src", "tgt"), one per role: the level's only one, else read from its name; the
    keys' padding ("src") first to one named for padding (torch's `src_key_padding_mask` beside its `src_mask`)."""
    assigned: dict = {}
    padding = [n for n in mask_params if "pad" in n.lower()]
    for i, name in enumerate(padding + mask_params):
        words = name.lower()
        named = (
            "src" if any(w in words for w in SOURCE_WORDS) else "tgt" if any(w in words for w in TARGET_WORDS) else None
        )
        role = roles[0] if len(roles) == 1 else named
        if role is not None and role not in assigned.values() and (i >= len(padding) or role == "src"):
            assigned[name] = role
    return assigned


def _unnamed_masks(entry, mask_params: list, data: list) -> tuple:
    """A layer's masks under names that say no mask (forward(x, keep), forward(x, memory, pad)): the required
    arguments after its data, each in each of the level's roles in turn; (mask params, data params, placings)."""
    if not (entry.masks and entry.group == "layer" and not mask_params and len(data) > len(entry.inputs)):
        return mask_params, data, []
    masks = data[len(entry.inputs) :][: len(entry.masks)]
    placings = [dict(zip(masks, roles, strict=False)) for roles in itertools.permutations(entry.masks)]
    return masks, data[: len(entry.inputs)], placings


def _mask_options(assigned: dict, kinds) -> list:
    """The masks one layout and order may be given, {name: (role, kind, shape)}: every kind, and every shape of
    each mask (several masks: the same position of each one's shapes first)."""
    if not assigned or not kinds:
        return [{}]
    lists = [CAUSAL_SHAPES if role == "tgt" else PAD_SHAPES for role in assigned.values()]
    shapes = sorted(itertools.product(*lists), key=lambda c: max(lists[i].index(s) for i, s in enumerate(c)))
    return [{n: (r, kind, s) for (n, r), s in zip(assigned.items(), c, strict=True)} for kind in kinds for c in shapes]


def callers(module, level: str, batch_first=None, mask=None, call=None, example=None) -> list:
    """Every candidate way of calling `module` at `level` (see the module docstring), most likely first; as the
    `example` call does where one is given (example_callers)."""
    if example is not None:
        return example_callers(module, level, example, batch_first)
    entry = LEVELS[level]
    if call is not None:
        found = [Caller(True, entry.inputs, call=call)]
        if entry.self_attention_probes:  # call(module, x): one input, bidirectional or causal
            found += [Caller(True, ("query",), {}, True, call=call, causal=c) for c in (False, True)]
        return found
    builtin = TORCH_BUILTINS.get(level)
    if builtin is not None and isinstance(module, builtin[0]):  # torch.nn's own: batch_first as the module says
        owner = module.layers[0] if isinstance(module, (nn.TransformerEncoder, nn.TransformerDecoder)) else module
        bf = bool(getattr(getattr(owner, "self_attn", owner), "batch_first", False))
        return [Caller(bf, entry.inputs, dict(builtin[1]), extra=dict(builtin[2]))]
    hf = any(c.__name__ == "PreTrainedModel" for c in type(module).__mro__)  # transformers' (no import needed)
    params, mask_params, data, positions = _signature(module, len(entry.inputs))
    mask_params, data, placings = _unnamed_masks(entry, mask_params, data)
    orders = _orders(entry, level, data, sum(p.default is p.empty for p in params if p.name in data))
    assigned = _assigned(mask_params, list(entry.masks))
    if hf and ("decoder_attention_mask" in mask_params or entry.masks == ("tgt",)):
        # transformers' encoder-decoders: attention_mask is the source's padding; the decoder builds its causal
        # mask itself (decoder_attention_mask only pads the target, whose outputs are not compared); a decoder-only
        # model builds its causal mask and any sliding window (a (B, 1, T, T) attention_mask would replace them)
        assigned = {"attention_mask": "src"} if "attention_mask" in mask_params and "src" in entry.masks else {}
    detect = mask in (None, "detect")  # the mask kinds tried: all (detected from the outputs), the one given, or none
    kinds = MASK_KINDS if detect else (mask,) if mask != "none" else ()
    if detect and set(assigned) == {"attention_mask"} and hf:
        kinds = HF_MASK_KINDS  # the library's documented polarity, not read from the outputs
    # a whole model whose masks are all optional (transformers' attention_mask=None) builds what it needs itself;
    # an attention or a layer given none would only look like one that ignores its mask
    skippable = all(p.default is not p.empty for p in params if p.name in assigned)
    optional = detect and entry.builds_masks and skippable
    # (B, H, T, Dh) has no sequence-first form
    layouts = [True] if not entry.sequence_first else [batch_first] if batch_first is not None else [True, False]
    options = [o for a in placings or [assigned] for o in _mask_options(a, kinds)]
    options += [{}] * (optional and bool(assigned and kinds))  # none: last
    found = [
        Caller(bf, o, m, set(o) == {"query"}, positions=tuple(positions))
        for bf in layouts
        for o in orders
        for m in options
    ]
    if entry.self_attention_probes:  # the one input and, where the module takes a mask, the causal mask (its first)
        options = _mask_options({mask_params[0]: "tgt"} if mask_params else {}, kinds)
        single = [order for order in orders if set(order) == {"query"}]
        found += [Caller(bf, o, m, True, causal=True) for bf in layouts for o in single for m in options]
    # optional masks in another form than the level's (a layer's (B, S) padding mask): the simplest call, last
    spare = detect and skippable and bool(assigned and kinds) and not entry.builds_masks
    found += [
        Caller(bf, o, {}, set(o) == {"query"}, positions=tuple(positions), fallback=True)
        for bf in layouts * spare
        for o in orders
    ]
    positional = [p.name for p in params if p.kind != p.KEYWORD_ONLY]  # a batch dict's keys: by name
    for caller in found:  # forward(input_ids, attention_mask, decoder_input_ids, ...): the data by name
        n = len(caller.order)
        if positional[:n] != data[:n] and len(data) >= n:
            caller.keywords, caller.batch = tuple(data[:n]), len(positional) < len(params)
    return found


# transformers' `attention_mask` is documented as 1 for tokens to attend to, 0 for padding: a model that hides the
# ones has its polarity inverted (attention.mask_inverted), not another convention.
HF_MASK_KINDS = ("int_keep", "bool_keep")


# -- check.module's example=(args, kwargs): one real call of a part, read for how the judge should call it --------
# Its tensors, in order: the data (the level's inputs), the masks (kind, shape and polarity read from dtype, rank and
# values), everything else passed as given (start positions, caches, flags) but rotary tables, remade in the run's
# dtype, and tensors of the example's batch size, repeated to the probe's (which takes the data's sizes).


def validate(example) -> None:
    """example must be (args, kwargs): a tuple and a dict."""
    if not (isinstance(example, tuple) and len(example) == 2 and isinstance(example[0], tuple)):
        raise TypeError(f"example must be (args, kwargs), a tuple and a dict; got {type(example).__name__}")
    if not isinstance(example[1], dict):
        raise TypeError(f"example must be (args, kwargs) with kwargs a dict; got {type(example[1]).__name__}")


def _slots(module, example) -> list:
    """(place, name, value) of every argument: place an int (positional) or the keyword; name its parameter's."""
    args, kwargs = example
    forward = module.forward if isinstance(module, nn.Module) else module
    try:
        names = [p.name for p in inspect.signature(forward).parameters.values()]
    except (TypeError, ValueError):
        names = []
    slots = [(i, names[i] if i < len(names) else f"argument {i}", v) for i, v in enumerate(args)]
    return slots + [(k, k, v) for k, v in kwargs.items()]


def _data(slots: list, level: str) -> list:
    """The slots holding the level's inputs, in the level's order: where the level takes token ids and the example
    passes integer tensors, those (the first of one dtype and rank, a decoder's memory its first float tensor), the
    float ones (media, states, a style) kept as the example gives them; else the first float tensors of one rank and
    width, else the first integer tensors (a decoder's ids and memory: the first tensors), as many as the level takes
    (one for a self-attention)."""
    entry = LEVELS[level]
    tensors = [s for s in slots if isinstance(s[2], torch.Tensor) and "mask" not in s[1].lower()]
    floats = [s for s in tensors if s[2].is_floating_point()]
    integers = [s for s in tensors if not s[2].is_floating_point() and s[2].dtype != torch.bool]
    first = (integers if entry.ids and integers else floats or tensors or [None])[0]
    if first is None:
        raise TypeError(
            f"the example passes no tensor the reference {level!r} could take as {list(entry.inputs)}; pass "
            "example=(args, kwargs) whose first tensors are those inputs"
        )
    if first[2].is_floating_point():
        alike = [s for s in floats if s[2].ndim == first[2].ndim and s[2].shape[-1] == first[2].shape[-1]]
    else:
        alike = [s for s in tensors if s[2].dtype == first[2].dtype and s[2].ndim == first[2].ndim]
    if entry.ids and integers:  # the ids, then a decoder's memory (its first float tensor)
        alike = alike[: len(entry.ids)] + floats[: len(entry.inputs) - len(entry.ids)]
    elif "memory" in entry.inputs and len(alike) < len(entry.inputs):  # ids and a memory (a decoder): in their order
        alike = tensors
    data = alike[: len(entry.inputs)]
    if len(data) < len(entry.inputs) and not (entry.self_attention_probes and len(data) in (1, 2)):
        raise TypeError(
            f"the example passes {len(data)} input tensor(s); the reference {level!r} takes {list(entry.inputs)}; pass "
            "example=(args, kwargs) whose first tensors are those inputs"
        )
    return data


def _mask_of(value: torch.Tensor, name: str, roles: tuple, B: int, T: int) -> tuple:
    """(role, kinds in the order tried, shape) of an example's mask, read from its dtype, rank and values; a padding
    mask's shape by rank, or its axes named by their sizes where they read otherwise (`B` the example's batch, `T`
    its keys: labml's (1, T, B))."""
    v = value.detach().cpu()
    square = v.ndim >= 2 and v.shape[-1] == v.shape[-2] > 1
    tril = torch.ones(v.shape[-2:], dtype=torch.bool).tril() if square else None
    keep_like = v if v.dtype == torch.bool else (v >= 0 if v.is_floating_point() else v != 0)
    causal = square and (bool((keep_like == tril).all()) or bool((keep_like == ~tril).all()))
    named = "tgt" in roles and any(w in name.lower() for w in TARGET_WORDS)
    role = "tgt" if causal or named or roles == ("tgt",) else "src"
    if v.dtype == torch.bool:
        d = v.diagonal(dim1=-2, dim2=-1) if square else None  # a query reads itself: its diagonal tells
        keeps = bool(d.all()) if d is not None and (d.all() or not d.any()) else v.float().mean() >= 0.5
        kinds = ["bool_keep", "bool_masked"][:: 1 if keeps else -1]
        kinds = kinds if v.all() or not v.any() else kinds[:1]  # every position the same: the polarity not shown
    else:
        kinds = ["additive" if v.is_floating_point() else "int_keep"]
    # the target's padding alone (HF's (B, T) attention_mask of a causal LM): one row of keys, or (B, T) not causal
    padding = v.ndim < 2 or v.shape[-2] == 1 or v.ndim == 2 and v.shape[0] == B and not causal
    shape = (PAD_SHAPES if role == "src" or padding else CAUSAL_SHAPES)[{2: 2, 3: 1}.get(v.ndim, 0)]  # by rank: 4, 3, 2
    axes = ["B" if n == B else "T" if n == T else "1" if n == 1 else "?" for n in v.shape]
    if role == "src" and 1 < B != T > 1 and sorted(axes) == sorted(shape.strip("()").split(", ")):
        shape = f"({', '.join(axes)})"
    return role, kinds, shape


def _own_pattern(value: torch.Tensor) -> bool:
    """Whether an example's (T, T) mask (no batch axis) is a pattern no mask the judge makes is: not every key read,
    not the causal triangle nor a causal band (a sliding window), the keys read told by its diagonal (a query reads
    itself): a speculative tree's ancestors. Passed as given, so that what it computes is judged."""
    v = value.detach().cpu()
    if v.dtype != torch.bool or v.ndim < 2 or math.prod(v.shape[:-2]) != 1 or v.shape[-1] != v.shape[-2]:
        return False
    keep = v.reshape(v.shape[-2:])
    keep = keep if bool(keep.diagonal().all()) else ~keep
    i, j = torch.arange(len(keep))[:, None], torch.arange(len(keep))[None]
    return not any(torch.equal(keep, (j <= i) & (i - j < w)) for w in range(1, len(keep) + 1)) and not keep.all()


def example_callers(module, level: str, example, batch_first=None) -> list:
    """The callers that call `module` as `example` does (calling.Caller with a template), most likely first."""
    entry = LEVELS[level]
    slots = _slots(module, example)
    data = _data(slots, level)
    names = entry.inputs if len(data) == len(entry.inputs) else ("query", "key")[: len(data)]  # key = value: 2
    kept = {s[0]: ("data", n) for s, n in zip(data, names, strict=False)}  # place -> slot; the rest _extra's
    masks = [  # (place, name, value) of each
        (place, name, value)
        for place, name, value in slots
        if place not in kept
        and isinstance(value, torch.Tensor)
        and ("mask" in name.lower() or value.dtype == torch.bool)
        and not _own_pattern(value)
    ]
    kept |= {place: ("mask", name) for place, name, _ in masks}
    starts = {p: _counted(v, masks) for p, n, v in slots if p not in kept and n.lower() in POSITION_NAMES}
    counted = [(p, n) for p, n, _ in slots if starts.get(p) is not None]
    kept |= {place: ("positions", name) for place, name in counted}  # given first .. T - 1 + first (Caller.positions)
    at, first = tuple(name for _, name in counted), next((starts[p] or 0 for p, _ in counted), 0)
    B = sizes(module, level, example, batch_first).B
    args, kwargs = example
    self_attention, bmhk = names == ("query",), _bmhk(module, example, data, entry)
    layouts = [True] if not entry.sequence_first else [batch_first] if batch_first is not None else [True, False]
    found = []
    for bf in layouts:  # the example's batch and keys as the layout reads them; its other tensors widened along it
        tmpl = (
            tuple(kept.get(i) or _extra(v, data, B, int(not bf)) for i, v in enumerate(args)),
            {k: kept.get(k) or _extra(v, data, B, int(not bf)) for k, v in kwargs.items()},
        )
        sizes_at = (data[0][2].shape[1 - bf], data[-1][2].shape[int(bf)]) if data[0][2].ndim > 1 else (0, 0)
        read = {name: _mask_of(value, name, entry.masks, *sizes_at) for _, name, value in masks}
        causal_given = any(m[0] == "tgt" for m in read.values())
        options = itertools.product(*[[(n, (m[0], kind, m[2])) for kind in m[1]] for n, m in read.items()])
        causals = [causal_given] if causal_given or not self_attention else [False, True]
        found += [
            Caller(
                bf,
                names,
                dict(m),
                self_attention,
                causal=c and self_attention,
                template=tmpl,
                bmhk=bmhk,
                positions=at,
                position_start=first,
            )
            for m in options
            for c in causals
        ]
    return found


def _counted(value, masks: list) -> int | None:
    """Where an example's position ids (B, T) start if they count each sequence's real positions from one number
    alike in every sequence, the real positions being the keys some query reads in its masks (`masks`: (place, name,
    value)): 0 .. T - 1 unpadded, HF's cumulative sum of a left-padded mask minus one (0), the bare sum (1); else None.
    Made for the probe as first .. T - 1 + first, which count its real positions alike (its padding is at the end)."""
    if not isinstance(value, torch.Tensor) or value.is_floating_point() or value.is_complex() or value.ndim != 2:
        return None
    real = torch.ones(value.shape, dtype=torch.bool)
    for _, _, m in masks:
        m = m.detach().cpu()
        seen = m if m.dtype == torch.bool else m >= 0 if m.is_floating_point() else m != 0
        if seen.ndim >= 2 and seen.shape[0] == value.shape[0] and seen.shape[-1] == value.shape[-1]:
            real &= seen.reshape(seen.shape[0], -1, seen.shape[-1]).any(1)
    count = real.long().cumsum(-1) - 1
    first = int((value.cpu() - count)[real][0]) if real.any() else 0
    return first if bool((value.cpu() == count + first)[real].all()) else None


def _bmhk(module, example, data: list, entry) -> bool:
    """Whether the example's heads are (B, T, H, Dh) (xformers' BMHK), read from one more call: its values changed at
    index 0 of axis 1 change the output past index 0 there (a position's values reach the other queries), where in
    (B, H, T, Dh) they stay in head 0."""
    if entry.unit != "heads" or any(d[2].ndim != 4 or not d[2].is_floating_point() for d in data):
        return False
    place, _, value = data[-1]
    args, kwargs = list(example[0]), dict(example[1])
    changed = value.detach().clone()
    changed[:, 0] += 1
    (args.__setitem__ if isinstance(place, int) else kwargs.__setitem__)(place, changed)
    module = copy.deepcopy(module).eval() if isinstance(module, nn.Module) else module
    try:
        with torch.no_grad():
            before, again = (first_tensor(module(*example[0], **example[1])) for _ in range(2))
            after = first_tensor(module(*args, **kwargs))
    except Exception:  # a call the check proper makes, and reports
        return False
    same = before.shape == after.shape and before.ndim == 4 and torch.equal(before, again)  # no dropout drawn
    return same and bool((before[:, 1:] != after[:, 1:]).any())


def _extra(value, data, probe_B: int, axis: int = 0) -> tuple:
    """How an argument that is neither data nor mask is passed: ("fixed", itself), or ("made", a function of
    (dtype, device)) for rotary tables (recomputed in the run's dtype), a float tensor (in the run's dtype) and a
    tensor of the example's batch size on the layout's batch `axis` (repeated to the probe's, `probe_B`: DETR's
    (T, B, D) positions along their second)."""
    if not isinstance(value, torch.Tensor):
        return "fixed", value
    table = _rope_match(value)
    if table is not None:
        return "made", lambda dtype, device: table[0].to(dtype=dtype, device=device)
    B = data[0][2].shape[axis] if data[0][2].ndim > axis else 0
    rows = torch.arange(probe_B) % B if value.ndim > axis and value.shape[axis] == B > 1 and B != probe_B else None
    if rows is not None or value.is_floating_point():  # a float input (media, a style) in the run's dtype
        kept = value if rows is None else value.index_select(axis, rows)
        return "made", lambda dtype, device: kept.to(dtype=dtype if kept.is_floating_point() else None, device=device)
    return "fixed", value


def _rope_match(value: torch.Tensor):
    """(the table in float64, its base) where `value` is a cos or sin table of rotary positions (positions along its
    second-to-last axis, frequencies in halves, interleaved, or once each: tables.rope_table), else None."""
    if not value.is_floating_point() or value.ndim < 2:
        return None
    T, n = value.shape[-2:]
    flat = value.detach().cpu().double().reshape(-1, T, n)[0].numpy()
    found = next((m for m in (TB.rope_table(flat, Dh) for Dh in (2 * n, n)) if m is not None), None)
    return None if found is None else (torch.from_numpy(found[1]).expand(value.shape).clone(), found[0])


def thetas(example) -> list:
    """The rotary bases of the example's cos/sin tables (the judge tries them first)."""
    found = [_rope_match(v) for v in [*example[0], *example[1].values()] if isinstance(v, torch.Tensor)]
    return list(dict.fromkeys(m[1] for m in found if m is not None))


def sizes(module, level: str, example, batch_first=None) -> PR.Sizes:
    """The probe's sizes, the example's: its lengths (three positions at least: the probe pads two; the first
    input's as the queries', the last's as the keys') and batch size (three at least), read sequence-first where the
    layout is not given and (B, T, D) reads fewer (DETR's (T, B, D) of a batch of 2); else the probe's own."""
    data = [v for _, _, v in _data(_slots(module, example), level)]
    for bf in [batch_first is not False] + [False] * (batch_first is None and all(v.ndim == 3 for v in data)):
        lengths = [int(v.shape[v.ndim - 2 if v.is_floating_point() else 1] if bf else v.shape[0]) for v in data]
        if min(lengths) >= 3:
            first, last = (-1, 0) if LEVELS[level].inputs[0] == "src" else (0, -1)  # src: the keys
            return PR.Sizes(max(3, int(data[0].shape[int(not bf)])), lengths[first], lengths[last])
    return PR.SIZES
