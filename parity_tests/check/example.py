"""check.module's example=(args, kwargs): one real call of a part, read for how the judge should call it.

The call's tensors are read in order: its data (the level's inputs: the first float tensors of one rank and width,
or the first integer tensors, as many as the level takes; one for a self-attention), its masks (an argument named
for a mask, or a boolean tensor: kind, shape and polarity from its dtype, rank and values; None stays None), and
everything else passed as given (start positions, caches, flags), except cos/sin tables of rotary positions, which
are recomputed in the run's dtype. The probe takes its sequence lengths (and batch size, three at least) from the
data; a tensor of the example's batch size on its first axis is repeated to the probe's.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from . import probes as PR
from .calling import TARGET_WORDS, Caller
from .levels import LEVELS

OPPOSITE = {"bool_keep": "bool_masked", "bool_masked": "bool_keep"}


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
    """The slots holding the level's inputs, in the example's order."""
    entry = LEVELS[level]
    tensors = [s for s in slots if isinstance(s[2], torch.Tensor) and "mask" not in s[1].lower()]
    floats = [s for s in tensors if s[2].is_floating_point()]
    first = floats[0] if floats else next((s for s in tensors if not s[2].dtype.is_floating_point), None)
    if first is None:
        raise TypeError(
            f"the example passes no tensor the reference {level!r} could take as {list(entry.inputs)}; pass "
            "example=(args, kwargs) whose first tensors are those inputs"
        )
    if first[2].is_floating_point():
        alike = [s for s in floats if s[2].ndim == first[2].ndim and s[2].shape[-1] == first[2].shape[-1]]
    else:
        alike = [s for s in tensors if s[2].dtype == first[2].dtype and s[2].ndim == first[2].ndim]
    if "memory" in entry.inputs and len(alike) < len(entry.inputs):  # ids and a memory (a decoder): in their order
        alike = tensors
    data = alike[: len(entry.inputs)]
    if len(data) < len(entry.inputs) and not (entry.self_attention_probes and len(data) == 1):
        raise TypeError(
            f"the example passes {len(data)} input tensor(s); the reference {level!r} takes {list(entry.inputs)}; pass "
            "example=(args, kwargs) whose first tensors are those inputs"
        )
    return data


def _mask_of(value: torch.Tensor, name: str, roles: tuple) -> tuple:
    """(role, kinds in the order tried, shape) of an example's mask, read from its dtype, rank and values."""
    v = value.detach().cpu()
    square = v.ndim >= 2 and v.shape[-1] == v.shape[-2] > 1
    tril = torch.ones(v.shape[-2:], dtype=torch.bool).tril() if square else None
    keep_like = v if v.dtype == torch.bool else (v >= 0 if v.is_floating_point() else v != 0)
    causal = square and (bool((keep_like == tril).all()) or bool((keep_like == ~tril).all()))
    named = [r for r in roles if r == "tgt"] if any(w in name.lower() for w in TARGET_WORDS) else []
    role = "tgt" if causal or named or roles == ("tgt",) else "src"
    if v.dtype == torch.bool:
        if causal:
            kinds = ["bool_keep" if bool((v == tril).all()) else "bool_masked"]
        else:
            kinds = ["bool_keep" if v.float().mean() >= 0.5 else "bool_masked"]
        if v.all() or not v.any():  # every position the same: the polarity is not shown
            kinds.append(OPPOSITE[kinds[0]])
    else:
        kinds = ["additive" if v.is_floating_point() else "int_keep"]
    if role == "tgt":
        shape = {2: "(T, T)", 3: "(B, T, T)"}.get(v.ndim, "(B, 1, T, T)")
    else:
        shape = {2: "(B, T)", 3: "(B, 1, T)"}.get(v.ndim, "(B, 1, 1, T)")
    return role, kinds, shape


def callers(module, level: str, example, batch_first=None) -> list:
    """The callers that call `module` as `example` does (calling.Caller with a template), most likely first."""
    entry = LEVELS[level]
    slots = _slots(module, example)
    data = _data(slots, level)
    names = ("query",) if len(data) < len(entry.inputs) else entry.inputs
    by_slot = {s[0]: n for s, n in zip(data, names, strict=False)}
    masks = {}
    for place, name, value in slots:
        is_mask = isinstance(value, torch.Tensor) and ("mask" in name.lower() or value.dtype == torch.bool)
        if place not in by_slot and is_mask:
            masks[name] = (place, *_mask_of(value, name, entry.masks))
    mask_at = {m[0]: name for name, m in masks.items()}

    def slot(place, value):
        if place in by_slot:
            return "data", by_slot[place]
        return ("mask", mask_at[place]) if place in mask_at else _extra(value, data, B)

    B = sizes(module, level, example, batch_first).B
    tmpl = (tuple(slot(i, v) for i, v in enumerate(example[0])), {k: slot(k, v) for k, v in example[1].items()})
    self_attention = names == ("query",)
    causal_given = any(m[1] == "tgt" for m in masks.values())
    kind_lists = [[(name, kind) for kind in m[2]] for name, m in masks.items()]
    combos: list = [[]]
    for options in kind_lists:
        combos = [c + [o] for c in combos for o in options]
    layouts = [batch_first] if batch_first is not None else ([True, False] if entry.sequence_first else [True])
    found = []
    for bf in layouts:
        for combo in combos:
            chosen = {name: (masks[name][1], kind, masks[name][3]) for name, kind in combo}
            causals = [causal_given] if causal_given or not self_attention else [False, True]
            found += [
                Caller(bf, names, chosen, self_attention, causal=c and self_attention, template=tmpl) for c in causals
            ]
    return found


def _extra(value, data, probe_B: int) -> tuple:
    """How an argument that is neither data nor mask is passed: ("fixed", itself), or ("made", a function of
    (dtype, device)) for rotary tables (recomputed in the run's dtype) and a tensor of the example's batch size on its
    first axis (repeated to the probe's, `probe_B`)."""
    if not isinstance(value, torch.Tensor):
        return "fixed", value
    table = _rope_match(value)
    if table is not None:
        return "made", lambda dtype, device: table[0].to(dtype=dtype, device=device)
    B = data[0][2].shape[0]
    if value.ndim >= 1 and value.shape[0] == B > 1 and B != probe_B:
        rows = torch.arange(probe_B) % B
        return "made", lambda dtype, device: value[rows].to(device)
    return "fixed", value


THETAS = (10000.0, 500000.0, 1000000.0, 100.0)


def _rope_match(value: torch.Tensor):
    """(the table in float64, its base) where `value` is a cos or sin table of rotary positions (positions along its
    second-to-last axis, frequencies in halves, interleaved, or once each), else None."""
    if not value.is_floating_point() or value.ndim < 2 or value.shape[-2] < 2 or value.shape[-1] < 2:
        return None
    v = value.detach().cpu().double()
    T, n = v.shape[-2:]
    flat = v.reshape(-1, T, n)[0]
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    for theta in THETAS:
        for dim in (2 * n, n):
            if dim % 2:
                continue
            a = pos * theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
            for angles in (a, torch.cat([a, a], -1), a.repeat_interleave(2, -1)):
                for f in (torch.cos, torch.sin):
                    if angles.shape == flat.shape and torch.allclose(f(angles), flat, atol=1e-5):
                        return f(angles).expand(v.shape).clone(), theta
    return None


def thetas(example) -> list:
    """The rotary bases of the example's cos/sin tables (the judge tries them first)."""
    found = [_rope_match(v) for v in [*example[0], *example[1].values()] if isinstance(v, torch.Tensor)]
    return list(dict.fromkeys(m[1] for m in found if m is not None))


def sizes(module, level: str, example, batch_first=None) -> PR.Sizes:
    """The probe's sizes, the example's: its lengths (three positions at least: the probe pads two; the first
    input's as the queries', the last's as the keys') and batch size (three at least); else the probe's own."""
    data = [v for _, _, v in _data(_slots(module, example), level)]
    axis = [0 if batch_first is False else v.ndim - 2 if v.is_floating_point() else 1 for v in data]
    lengths = [int(v.shape[a]) for v, a in zip(data, axis, strict=True)]
    if min(lengths) < 3:
        return PR.SIZES
    first, last = (-1, 0) if LEVELS[level].inputs[0] == "src" else (0, -1)  # src: the keys
    return PR.Sizes(max(3, int(data[0].shape[1 if batch_first is False else 0])), lengths[first], lengths[last])
