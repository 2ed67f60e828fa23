"""The fixed tables a user's module builds in float32 (sinusoid position tables, RoPE's), read against the
reference's: each equal to it to float32 precision (the rounding of its angles) is overwritten with its float64
values for the float64 comparison, and a note says so."""

from __future__ import annotations

import math

import numpy as np
import torch

from .variants import sinusoid_tables


def float32_angle_tolerance(angles: np.ndarray) -> np.ndarray:
    """How far sin or cos of `angles` (float64) may be from the same computed in float32: the argument itself is
    rounded to float32 (a few units of 2^-24 relative, so ~1.5e-4 at position 5000), then the result (1e-6 floor)."""
    return 1e-6 + 8 * np.finfo(np.float32).eps * np.abs(angles)


def _within(value: np.ndarray, table: np.ndarray, tolerance) -> bool:
    """`value` (built in float32) equal to the float64 or complex128 `table` to `tolerance`, entry by entry."""
    if value.shape != table.shape or np.iscomplexobj(value) != np.iscomplexobj(table):
        return False
    error = np.maximum(np.abs(value.real - table.real), np.abs(value.imag - table.imag))
    return bool(np.all(error <= tolerance))


def _squeezed(tensor) -> np.ndarray:
    """`tensor` in float64 (complex128), its axes of size 1 dropped."""
    value = tensor.detach().cpu().to(torch.complex128 if tensor.is_complex() else torch.float64).numpy()
    return value.reshape([s for s in value.shape if s > 1] or [1])


def fixed_tables(module, fixed: list, notes: list) -> tuple[dict, str | None, bool]:
    """Each fixed position table of the user's read against the reference's sinusoids, a note added for each: ({user
    name: float64 table to overwrite it with}, the layout found, whether a table has the wrong frequencies)."""
    tensors = dict(module.named_parameters()) | dict(_tensors_kept(module))
    overwrite, layout, wrong = {}, None, False
    for t in fixed:
        value = _squeezed(tensors[t.name]).reshape(t.rows, t.width)
        tolerance = float32_angle_tolerance(np.arange(t.rows, dtype=np.float64)[:, None])  # angles <= position
        tables = sinusoid_tables(t.rows, t.width)
        name = next((n for n, table in tables.items() if _within(value, table, tolerance)), None)
        if name is None:
            continue
        overwrite[t.name] = tables[name]
        if name == "wrong_frequencies":
            wrong = True
            notes.append(
                f"{t.name}: a sinusoid table whose frequencies are all 1 (to float32 precision; overwritten with "
                "that table in float64)"
            )
        else:
            layout = name
            notes.append(
                f"{t.name}: the reference's {name} sinusoids to float32 precision; overwritten with the float64 "
                "table for the float64 comparison"
            )
    return overwrite, layout, wrong


THETA_ATTRS = ("rope_theta", "theta", "base", "rope_base", "rotary_base")


def _theta_from(inv_freq: np.ndarray, Dh: int) -> float | None:
    """The RoPE base of an inverse-frequency vector theta^(-2i/Dh), i < Dh/2, rounded to an integer where it is
    one to float32 precision (a float32 buffer)."""
    if inv_freq.shape != (Dh // 2,) or Dh < 4 or not 0 < inv_freq[1] < 1 - 1e-6:  # all 1 (base 1): one pair's
        return None
    theta = float(inv_freq[1] ** (-Dh / 2))
    return float(round(theta)) if abs(theta - round(theta)) <= 1e-4 * theta else theta


def _sin_cos_table(tensor) -> bool:
    """Whether `tensor` is a table of sines and cosines side by side (T, w) (GPT-J's): sin^2 + cos^2 = 1, and
    position 0 holds sin 0 = 0 and cos 0 = 1."""
    if not tensor.is_floating_point() or tensor.ndim < 2:
        return False
    value = _squeezed(tensor)
    if value.ndim != 2 or value.shape[1] % 2 or value.shape[0] < 3:
        return False
    sin, cos = np.split(value, 2, axis=1)
    return bool(np.all(sin[0] == 0) and np.all(cos[0] == 1) and np.allclose(sin**2 + cos**2, 1, atol=1e-6))


def rope_table(value: np.ndarray, Dh: int) -> tuple[float, np.ndarray] | None:
    """(base, float64 table) where `value` (float64, axes of size 1 dropped) is one of rope_tables' sin, cos or
    complex tables for heads of Dh features, else None: the base read from position 1's row (a cos near 1 reads it
    coarsely, so the base rounded to three digits is tried first), then the whole table checked at that base."""
    if value.ndim != 2 or Dh < 4 or Dh % 2 or value.shape[0] < 2 or value.shape[1] not in (Dh // 2, Dh):
        return None
    v = value.imag if np.iscomplexobj(value) else value
    read = np.arcsin if not v[0].any() else np.arccos if np.all(v[0] == 1) else None
    if read is None:
        return None
    read_off = [_theta_from(read(np.clip(row, -1, 1)), Dh) for row in (v[1][: Dh // 2], v[1][::2])]  # halves; pairs
    bases = dict.fromkeys(b for t in read_off if t is not None for b in (float(f"{t:.3g}"), t))
    tried = ((theta, table, tol) for theta in bases for table, tol in rope_tables(theta, Dh, len(value)).values())
    return next(((theta, table) for theta, table, tol in tried if _within(value, table, tol)), None)


def base_of(computed: torch.Tensor, Dh: int) -> tuple[float | None, int] | None:
    """(base, rotary width R) of a cos, sin or complex table a forward computed (rope_table on a batch's first) for
    heads of Dh features, or of R < Dh (partial rotary: a table of R or R/2 columns), else None. One pair turned
    (R = 2) turns at frequency 1 whatever the base: (None, 2)."""
    if computed.ndim < 2:
        return None
    value = _squeezed(computed.reshape(-1, *computed.shape[-2:])[0])
    widths = dict.fromkeys(R for R in (Dh, value.shape[-1], 2 * value.shape[-1]) if R <= Dh)
    for R in widths:
        if R == 2 and any(_within(value, *table) for table in rope_tables(1.0, 2, len(value)).values()):
            return None, 2
        if (table := rope_table(value, R)) is not None:
            return table[0], R
    return None


def rope_tables(theta: float, Dh: int, T: int) -> dict:
    """The tables a module may keep for RoPE at base theta, {what: (float64 table, how far one built in float32 may
    be from it)}: the inverse frequencies (Dh/2,); for positions 0 .. T - 1 the angles, cos and sin (T, Dh/2), or
    (T, Dh) for the halves (Hugging Face's cat) or the pairs (interleaved); GPT-J's sin and cos side by side;
    torchtune's cos and sin stacked (T, Dh/2, 2); Meta's complex e^(i m theta_j). Trig tables within their angles'
    float32 rounding, the rest 1e-6 relative and absolute."""
    inv = theta ** (-np.arange(0, Dh, 2, dtype=np.float64) / Dh)
    angles = np.arange(T, dtype=np.float64)[:, None] * inv
    rounding = float32_angle_tolerance(angles)
    tables = {"RoPE inverse frequencies": (inv, 1e-6 + 1e-6 * inv)}
    for name, f in (("angles", angles), ("cos", np.cos(angles)), ("sin", np.sin(angles))):
        tol = 1e-6 + 1e-6 * angles if name == "angles" else rounding
        tables[f"RoPE {name} (T, Dh/2)"] = f, tol
        tables[f"RoPE {name} (T, Dh), halves"] = np.concatenate([f, f], axis=-1), np.concatenate([tol, tol], axis=-1)
        tables[f"RoPE {name} (T, Dh), pairs"] = np.repeat(f, 2, axis=-1), np.repeat(tol, 2, axis=-1)
    tables["RoPE sin and cos side by side (T, Dh), GPT-J's"] = (
        np.concatenate([np.sin(angles), np.cos(angles)], axis=-1),
        np.concatenate([rounding, rounding], axis=-1),
    )
    tables["RoPE cos and sin stacked on a last axis (T, Dh/2, 2), torchtune's"] = (
        np.stack([np.cos(angles), np.sin(angles)], axis=-1),
        np.stack([rounding, rounding], axis=-1),
    )
    tables["RoPE's complex rotations e^(i m theta_j)"] = np.exp(1j * angles), rounding
    return tables


def scales(module, D: int, notes: list) -> dict:
    """The float32 scalar buffers equal to sqrt(d_model) or its inverse to float32 precision (transformers' Gemma's
    embed_scale; .double() widens it rounded): {name: the float64 value to overwrite it with}, a note for each. A
    plain tensor attribute stays a float32 island (running.py)."""
    found = {}
    for name, t in module.named_buffers():
        value = float(t) if t.is_floating_point() and t.numel() == 1 and t.dtype != torch.float64 else None
        exact = next((e for e in (D**0.5, D**-0.5) if value is not None and abs(value - e) <= 1e-7 * e), None)
        if exact is not None and value != exact:
            found[name] = np.array(exact)
            notes.append(
                f"{name}: {value:.8g} is {exact:.17g} to float32 precision; overwritten with the float64 value"
            )
    return found


def yarn_scale(module, Dh: int, factors: list) -> float | None:
    """The softmax scale DeepSeek's latent attention takes under the YaRN its module states: Dh^-1/2 times mscale^2,
    mscale = 0.1 mscale_all_dim ln(factor) + 1 (transformers' yarn_get_mscale), where most of the recorded layers'
    `factors` (the numbers on their scores) are that scale; else None."""
    common = max(factors, key=factors.count, default=None)
    if common is None or 2 * factors.count(common) <= len(factors):
        return None
    for _, mod in module.named_modules():
        rope = getattr(getattr(mod, "config", None), "rope_parameters", None) or {}
        factor, dim = rope.get("factor") or 1.0, rope.get("mscale_all_dim")
        if rope.get("rope_type") == "yarn" and dim and factor > 1:
            scale = Dh**-0.5 * (0.1 * dim * math.log(factor) + 1) ** 2
            return scale if abs(common / scale - 1) < 1e-6 else None
    return None


def _tensors_kept(module):
    """(name, tensor) for every buffer and every plain tensor attribute (Meta's `self.freqs_cis`, which .to() does
    not convert), named by its dotted path; none that is empty (a cache made in the forward: fairseq's future mask)."""
    yield from ((name, b) for name, b in module.named_buffers() if b.numel())
    for path, mod in module.named_modules():
        for attr, value in vars(mod).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) and value.numel():
                yield (f"{path}.{attr}" if path else attr), value


def rope(module, Dh: int, first: float | None, notes: list, computed=()) -> tuple[dict, list, int | None]:
    """The user's RoPE as its module keeps it. The bases tried: `first` (the caller's), those of the tables its
    forward computed (`computed`, a batch's first), those the module states (a base attribute, transformers' config,
    an inv_freq buffer, a table rope_table reads), then 10000. Each RoPE table kept in float32 equal to one of
    rope_tables at one of them is overwritten with its float64 values. The rotary width where fewer than Dh features
    turn (GPT-NeoX's rotary_pct): twice a shorter inv_freq's length, else GPT-J's sin-and-cos table's width or that
    of the tables the forward computed (Phi-2's). Returns ({name: float64 values}, the bases with the module's
    tables' first, that rotary width or None)."""
    found = [] if first is None else [float(first)]
    read = [r for r in (base_of(v, Dh) for v in computed) if r is not None]
    found += [base for base, _ in read if base is not None]
    lengths = set()
    for _, mod in module.named_modules():
        config = getattr(mod, "config", None)
        values = [getattr(mod, a, None) for a in THETA_ATTRS] + [getattr(config, "rope_theta", None)]
        values.append((getattr(config, "rope_parameters", None) or {}).get("rope_theta"))
        for name, buf in mod.named_buffers(recurse=False):
            if "inv_freq" in name and buf.is_floating_point():
                values.append(_theta_from(buf.detach().double().cpu().numpy(), 2 * buf.numel()))
                lengths |= {buf.numel()} if buf.ndim == 1 else set()
        found += [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 1]
    kept = [(name, t) for name, t in _tensors_kept(module) if t.is_complex() or t.is_floating_point()]
    found += [t[0] for t in (rope_table(_squeezed(t), Dh) for _, t in kept) if t is not None]
    thetas = list(dict.fromkeys(found + [10000.0]))
    overwrite: dict = {}
    bases: list = []
    for name, buf in kept:
        value = _squeezed(buf)
        width = value.shape[-1] if _sin_cos_table(buf) else Dh  # GPT-J's rotates its first value.shape[-1] features
        width = 2 * value.size if value.ndim == 1 and 2 <= value.size < Dh // 2 else width  # a rotary part's inv_freq
        if Dh % 2 or buf.numel() < width // 2:
            continue
        rows = value.shape[0] if value.ndim >= 2 else 1
        tried = ((t, what, table, tol) for t in thetas for what, (table, tol) in rope_tables(t, width, rows).items())
        match = next(((t, what, table) for t, what, table, tol in tried if _within(value, table, tol)), None)
        if match is not None:
            theta, what, overwrite[name] = match
            bases.append(theta)
            notes.append(
                f"{name}: {what} (base {theta:g}) to float32 precision; overwritten with the "
                f"{overwrite[name].dtype} values for the float64 comparison"
            )
    rotary = 2 * min(lengths) if len(lengths) == 1 and 0 < 2 * min(lengths) < Dh else None
    widths = {_squeezed(t).shape[-1] for _, t in kept if _sin_cos_table(t)} | {R for _, R in read}
    if rotary is None and len(widths) == 1 and widths != {Dh}:
        rotary = widths.pop()  # GPT-J's embed_positions (T, rotary_dim), Phi-2's tables of its rotary features
    return overwrite, list(dict.fromkeys(bases[:1] + thetas)), rotary
