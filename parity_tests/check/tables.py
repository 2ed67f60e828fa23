"""The fixed tables a user's module builds in float32 (sinusoid position tables, RoPE's), read against the
reference's: each equal to it to float32 precision (the rounding of its angles) is overwritten with its float64
values for the float64 comparison, and a note says so."""

from __future__ import annotations

import numpy as np
import torch

from numpy_transformer.attention import rope_frequencies, yarn_mscale
from transformer_spec.config import RopeScaling
from transformer_spec.families.rope import read_scaling

from . import dataflow as DF
from .unsupported import NoPair
from .variants import sinusoid_tables

LAYOUTS = ("interleaved", "split")  # the reference's sinusoid layouts (config.sinusoid_layout)


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


def fixed_tables(module, fixed: list, notes: list, flow=None) -> tuple[dict, str | None, bool]:
    """Each fixed position table of the user's read against the reference's sinusoids, a note added for each: ({user
    name: float64 table to overwrite it with}, the layout found, whether a table has the wrong frequencies). NoPair
    for one the forward reads (`flow`) that is sinusoids at frequencies neither the reference's nor all 1 (the
    catalogue's positions.wrong_frequencies): fairseq's 10000^(-i / (D/2 - 1))."""
    tensors = dict(module.named_parameters()) | dict(_tensors_kept(module))
    overwrite, layout, wrong = {}, None, False
    for t in fixed:
        value = _squeezed(tensors[t.name]).reshape(t.rows, t.width)
        tolerance = float32_angle_tolerance(np.arange(t.rows, dtype=np.float64)[:, None])  # angles <= position
        tables = {
            (n, order): table for order in LAYOUTS for n, table in sinusoid_tables(t.rows, t.width, order).items()
        }
        found = next((key for key, table in tables.items() if _within(value, table, tolerance)), None)
        if found is None:
            _other_sinusoids(t, value, flow)
            continue
        name, order = found
        overwrite[t.name] = tables[found]
        if name == "wrong_frequencies":
            wrong, layout = True, order
            notes.append(
                f"{t.name}: a sinusoid table ({order}) whose frequencies are all 1 (to float32 precision; "
                "overwritten with that table in float64)"
            )
        else:
            layout = name
            notes.append(
                f"{t.name}: the reference's {name} sinusoids to float32 precision; overwritten with the float64 "
                "table for the float64 comparison"
            )
    return overwrite, layout, wrong


def _other_sinusoids(t, value: np.ndarray, flow) -> None:
    """NoPair at the module keeping table `t` (its float64 `value`) where the forward reads it and its rows r (all
    zero: a padding row, never read) are sin(r w_i) and cos(r w_i), sines then cosines or in pairs, w_i (fitted at
    the first row r > 0 not zero) neither the reference's 10000^(-2i/D) nor all 1; said with the row position 0 is
    read at (fairseq's padding_idx + 1)."""
    reads = [n for n in flow.nodes if any(DF.root(p).param == t.name for p in n.parents)] if flow else []
    live = np.flatnonzero(np.abs(value).sum(1) > 0)
    r, D = next((int(r) for r in live if r > 0), 0), t.width
    if not reads or not r or D % 2:
        return
    tolerance = float32_angle_tolerance(np.arange(t.rows, dtype=np.float64)[live, None])
    for pairs in (False, True):
        s, c = (value[:, ::2], value[:, 1::2]) if pairs else np.split(value, 2, 1)
        w = np.arctan2(s[r], c[r]) / r
        fitted = _sines(np.arange(t.rows)[:, None] * w, pairs)
        if not _within(value[live], fitted[live], tolerance) or np.allclose(w, 1) or w[0] <= 0:
            continue
        if np.allclose(w, 10000.0 ** (-2 * np.arange(D // 2) / D), rtol=1e-5):
            return
        k = np.arange(1, D // 2) / (-np.log(w[1:]) / np.log(10000.0))  # w_i = 10000^(-i / k)
        said = f"10000^(-i/{k[0]:.4g})" if np.allclose(k, k[0], rtol=1e-4) else f"{', '.join(f'{f:.3g}' for f in w)}"
        first = flow.values[reads[0].index].detach().double().reshape(-1, D)[0].cpu().numpy()
        row = next((q for q in range(t.rows) if np.allclose(value[q], first, atol=1e-6)), None)
        at = f", position t read at row t + {row}" if row else ""
        layout = "in pairs" if pairs else "sines, then cosines"
        what = f"a fixed position table of sinusoids ({layout}) at frequencies {said}, i < {D // 2}{at}, not the "
        raise NoPair(t.name.rpartition(".")[0] or "(the module)", what + f"reference's 10000^(-i/{D // 2})")


def _sines(angles: np.ndarray, pairs: bool) -> np.ndarray:
    """sin and cos of `angles` (rows, D/2) side by side: in pairs (sin, cos, sin, cos, ...) or sines, then cosines."""
    if pairs:
        return np.stack([np.sin(angles), np.cos(angles)], -1).reshape(len(angles), -1)
    return np.concatenate([np.sin(angles), np.cos(angles)], 1)


THETA_ATTRS = ("rope_theta", "theta", "base", "rope_base", "rotary_base")


def _theta_from(inv_freq: np.ndarray, Dh: int, exact: bool = False) -> float | None:
    """The RoPE base of an inverse-frequency vector theta^(-2i/Dh), i < Dh/2, rounded to an integer where it is
    one to float32 precision (a float32 buffer), unless `exact`."""
    if inv_freq.shape != (Dh // 2,) or Dh < 4 or not 0 < inv_freq[1] < 1 - 1e-6:  # all 1 (base 1): one pair's
        return None
    theta = float(inv_freq[1] ** (-Dh / 2))
    return float(round(theta)) if abs(theta - round(theta)) <= 1e-4 * theta and not exact else theta


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
    coarsely, so the base rounded to three digits, then to an integer, is tried first), then the whole table checked
    at that base: first to float64's precision (a table computed in float64 gives its base exactly, 10000 4^(4/3)
    unrounded), then to float32's."""
    if value.ndim != 2 or Dh < 4 or Dh % 2 or value.shape[0] < 2 or value.shape[1] not in (Dh // 2, Dh):
        return None
    v = value.imag if np.iscomplexobj(value) else value
    read = np.arcsin if not v[0].any() else np.arccos if np.all(v[0] == 1) else None
    if read is None:
        return None
    rows = (v[1][: Dh // 2], v[1][::2])  # halves; pairs
    read_off = [_theta_from(read(np.clip(row, -1, 1)), Dh, exact) for row in rows for exact in (False, True)]
    bases = dict.fromkeys(b for t in read_off if t is not None for b in (float(f"{t:.3g}"), t))
    tried = [(theta, table, tol) for theta in bases for table, tol in rope_tables(theta, Dh, len(value)).values()]
    for precision in (1e-7, 1.0):  # float64's, float32's
        found = next(((theta, table) for theta, table, tol in tried if _within(value, table, tol * precision)), None)
        if found is not None:
            return found
    return None


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


def relabelled(value: np.ndarray, Dh: int, theta: float | None = None) -> tuple | str | None:
    """A cos, sin, angle or complex table (T, Dh/2), or (T, Dh) in halves or pairs, some of whose columns never turn
    (the same at every position: frequency 0, the speedrun's half-zero rotary), read as the reference's partial
    rotary on relabelled q/k features: (base, R, {pairing: each head's order (mapping.Link.rope_order)}, the float64
    table) where the n turning columns, by decreasing frequency, are base^(-2i/R) at R = 2n (R = 2: frequency 1, base
    None). The orders put the user's features of the i-th turning column j ((j, j + Dh/2) in halves, (2j, 2j + 1) in
    pairs) at the reference's (i, i + n), or (i + n, i) (turned backwards: R(-t) is R(t) on the pair swapped), the
    others from R on. `theta`: a base tried first (a sine's, read finely; a cos table is read only at one: in float32
    the cos of a small angle is 1). None: no column at frequency 0, or none turns; a str: the frequencies no such
    rotary has."""
    if value.ndim != 2 or value.shape[0] < 3 or Dh % 2 or value.shape[1] not in (Dh // 2, Dh):
        return None
    half, pairings, widen = Dh // 2, ("halves", "pairs"), lambda t: t
    if value.shape[1] == Dh and np.array_equal(value[:, :half], value[:, half:]):
        value, pairings, widen = value[:, :half], ("halves",), lambda t: np.concatenate([t, t], axis=1)
    elif value.shape[1] == Dh and np.array_equal(value[:, ::2], value[:, 1::2]):
        value, pairings, widen = value[:, ::2], ("pairs",), lambda t: np.repeat(t, 2, axis=1)
    still, ones = np.all(value == value[0], axis=0), bool(np.all(value[0] == 1))
    if value.shape[1] != half or still.all() or not still.any() or not (ones or not value[0].any()):
        return None
    if ones and not np.iscomplexobj(value) and theta is None:  # a cos of a tiny angle is 1 in float32: a sine's base
        return None
    turning = np.flatnonzero(~still)  # by decreasing frequency: a cos (real part) rises as it falls, the rest fall
    turning = turning[np.argsort(value[1, turning].real * (1 if ones else -1), kind="stable")]
    n, sub = len(turning), value[:, turning]
    tried = [
        (b, t, tol)
        for b in ([theta] if n > 1 and theta else [1.0])
        for t, tol in rope_tables(b, 2 * n, len(value)).values()
    ]
    read = next(((b if n > 1 else None, t) for b, t, tol in tried if _within(sub, t, tol)), None)  # one pair: any base
    read = read or (rope_table(sub, 2 * n) if n > 1 else None)
    if read is None:
        return (
            f"rotary tables whose features at columns {turning.tolist()} turn ({np.round(value[1, turning], 6)} "
            f"at position 1) and the others never: the reference's partial rotary turns its first R = {2 * n} at "
            f"base^(-2i/R), i < {n} (the first at frequency 1), not these"
        )
    table = value.astype(np.complex128 if np.iscomplexobj(value) else np.float64)
    table[:, turning] = read[1]
    orders = {}
    for pairing in pairings:
        a, b = (turning, turning + half) if pairing == "halves" else (2 * turning, 2 * turning + 1)
        for backwards in (False, True):
            order = np.full(Dh, -1)
            order[a], order[b] = np.arange(n) + n * backwards, np.arange(n) + n * (1 - backwards)
            order[order < 0] = np.arange(2 * n, Dh)
            orders[f"{pairing}{', turned backwards' * backwards}"] = tuple(order.tolist())
    return read[0], 2 * n, orders, widen(table)


def sliced_orders(turned: list | None, Dh: int) -> dict:
    """{pairing: each head's q/k order (mapping.Link.rope_order)} where the rotary tables turn R features of each
    head other than its first R (`turned`, dataflow.turned_features: Phi-4-mini's written on the last R): the
    reference's partial rotary on relabelled features, the turned ones first, in halves (i, i + R/2) or pairs
    (2i, 2i + 1) of the slice, the others after; {} where they turn the first R (the reference's own) or all."""
    if not turned or len(turned) % 2 or turned == list(range(len(turned))) or len(set(turned)) != len(turned):
        return {}
    R, orders = len(turned), {}
    for pairing, at in (("halves", list(range(R))), ("pairs", [*range(0, R, 2), *range(1, R, 2)])):
        order = np.full(Dh, -1)
        order[[turned[j] for j in at]] = np.arange(R)
        order[order < 0] = np.arange(R, Dh)
        orders[pairing] = tuple(order.tolist())
    return orders


def rope_tables(theta: float, Dh: int, T: int, scaling: RopeScaling | None = None) -> dict:
    """The tables a module may keep for RoPE at base theta (its frequencies scaled by `scaling`, the reference's
    rope_frequencies), {what: (float64 table, how far one built in float32 may be from it)}: the inverse frequencies
    (Dh/2,); for positions 0 .. T - 1 the angles, cos and sin (T, Dh/2), or (T, Dh) for the halves (Hugging Face's
    cat) or the pairs (interleaved); GPT-J's sin and cos side by side; torchtune's cos and sin stacked (T, Dh/2, 2);
    Meta's complex e^(i m theta_j). Trig tables within their angles' float32 rounding, the rest 1e-6 relative and
    absolute."""
    inv = theta ** (-np.arange(0, Dh, 2, dtype=np.float64) / Dh)
    if scaling is not None:
        inv = rope_frequencies(Dh, theta, scaling, T, T)[0]
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
    kind = "RoPE" if scaling is None else f"{scaling.rope_type}-scaled RoPE"
    return {what.replace("RoPE", kind, 1): v for what, v in tables.items()}


def scales(module, sizes: tuple, notes: list) -> dict:
    """The float32 scalar buffers and frozen parameters equal to the square root of one of `sizes` (d_model, d_head)
    or its inverse to float32 precision (transformers' Gemma's embed_scale, PatchTST's frozen scale of the scores;
    .double() widens them rounded): {name: the float64 value to overwrite it with}, a note for each. A plain tensor
    attribute stays a float32 island (running.py)."""
    found, roots = {}, [e for n in sizes if n for e in (n**0.5, n**-0.5)]
    frozen = [(n, p) for n, p in module.named_parameters() if not p.requires_grad]
    for name, t in [*module.named_buffers(), *frozen]:
        value = float(t) if t.is_floating_point() and t.numel() == 1 and t.dtype != torch.float64 else None
        exact = next((e for e in roots if value is not None and abs(value - e) <= 1e-7 * e), None)
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
    s = (stated_scaling(module) or (None, None))[1]
    if s is None or s.rope_type != "yarn" or not s.mscale_all_dim or (s.factor or 1.0) <= 1:
        return None
    scale = Dh**-0.5 * yarn_mscale(s.factor or 1.0, s.mscale_all_dim) ** 2
    return scale if abs(common / scale - 1) < 1e-6 else None


LENGTHS = ("max_position_embeddings", "original_max_position_embeddings")  # a transformers config's


def stated_scaling(module) -> tuple[float, RopeScaling, int | None] | None:
    """(base, scaling, max_position_embeddings or None) of the scaled RoPE a transformers module's config states
    (rope_parameters or rope_scaling of one kind: yarn, llama3, linear, dynamic, longrope; Phi-3's top-level
    original_max_position_embeddings where the scaling lacks one), the first found; None where none states one it
    can read. The length matters to dynamic NTK and LongRoPE, whose frequencies change past it."""
    for _, mod in module.named_modules():
        config = getattr(mod, "config", None)
        rope = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None)
        if isinstance(rope, dict) and rope.get("rope_type", rope.get("type", "default")) != "default":
            base = rope.get("rope_theta", getattr(config, "rope_theta", None)) or 10000.0
            lengths = {k: v for k in LENGTHS if type(v := getattr(config, k, None)) is int and v > 0}
            original = {k: v for k, v in lengths.items() if k == LENGTHS[1]}  # Phi-3's, where the scaling has none
            try:
                scaling = read_scaling(original | rope, "rope_parameters", aliases={"su": "longrope"})
            except ValueError:
                return None
            return (float(base), scaling, lengths.get(LENGTHS[0])) if scaling is not None else None
    return None


def fitted_scaling(module, Dh: int, computed=(), flow=None) -> tuple[float, RopeScaling, None] | None:
    """(base, scaling, None) of Llama 3.1's scaled RoPE read from the frequencies of a table the module keeps (Meta's
    complex freqs_cis, gpt-fast's cos and sin) or its forward computed (`computed`, a batch's first), where no config
    states it: the first table whose frequencies _llama3 fits and rope_tables at that fit gives back to float32's
    precision; None where none does. A table the forward adds (`flow`) is none of RoPE's."""
    kept = [t for name, t in _tensors_kept(module) if flow is None or not flow.added(name)]
    batches = [c.reshape(-1, *c.shape[-2:])[0] for c in computed if c.ndim >= 2]
    for tensor in [t for t in kept + batches if t.is_complex() or t.is_floating_point()]:
        value = _squeezed(tensor)
        rows = value.shape[0] if value.ndim >= 2 else 1
        for w in _row_frequencies(value, Dh):
            for theta, scaling in _llama3(w, Dh):
                tables = rope_tables(theta, Dh, rows, scaling).values()
                if any(_within(value, table, tol) for table, tol in tables):
                    return theta, scaling, None
    return None


def _row_frequencies(value: np.ndarray, Dh: int) -> list:
    """The inverse frequencies (Dh/2,) a RoPE table's position 1 may be read as: an inv_freq itself; the angle of a
    complex table; of (cos, sin) stacked last; of GPT-J's sin and cos side by side; an angles or a sin table's row,
    in halves or pairs (its arcsin). Candidates only: rope_tables checks each."""
    h = Dh // 2
    if value.shape == (h,):
        return [value]
    row = value[1].reshape(-1) if value.ndim >= 2 and len(value) > 1 else np.zeros(0)
    if np.iscomplexobj(row):
        return [np.angle(row)] if row.size == h else []
    cuts = [row] if row.size == h else [row[:h], row[::2]] if row.size == Dh else []
    stacked = [np.arctan2(row[1::2], row[::2]), np.arctan2(row[:h], row[h:])] if row.size == Dh else []
    return stacked + cuts + [np.arcsin(np.clip(c, -1, 1)) for c in cuts]


def _llama3(w: np.ndarray, Dh: int) -> list:
    """(base, llama3 scaling) candidates for inverse frequencies `w` read as Llama 3.1's: the base from the high
    end, w_1 = base^(-2/Dh) where it is kept, or from the low end, w_{n-2} / w_{n-1} = base^(2/Dh) where both are
    divided, each rounded to three digits, then as read; the factor from the lowest (divided by it); the original
    length (at low_freq_factor 1: a common factor of the three cancels) and high_freq_factor (4 where one frequency
    alone is blended) from the blended ones, whose share of the unscaled frequency is s = (original / wavelength -
    1) / (high - 1). The factors rounded to three digits, then as read; the length to an integer."""
    if len(w) < 3 or not np.all(np.isfinite(w) & (w > 0)) or abs(w[0] - 1) > 1e-6:
        return []
    read = (w[1] ** (-Dh / 2), (w[-2] / w[-1]) ** (Dh / 2))
    found = []
    for theta in dict.fromkeys(b for t in read for b in (float(f"{t:.3g}"), float(t))):
        plain = theta ** (-np.arange(0, Dh, 2) / Dh)
        ratio = w / plain
        blended = ~np.isclose(ratio, 1, rtol=1e-5) & ~np.isclose(ratio, ratio[-1], rtol=1e-5)
        if ratio[-1] >= 1 - 1e-5 or not blended.any() or np.any(np.diff(ratio) > 1e-5):
            continue
        factor = 1 / ratio[-1]
        share = (ratio[blended] - ratio[-1]) / (1 - ratio[-1])
        inverse = plain[blended] / (2 * np.pi)  # 1 / wavelength
        k, original = 3.0, (1 + 3 * share[0]) / inverse[0]
        if blended.sum() > 1:  # share (high - 1) - original / wavelength = -1, for high - 1 and original
            (k, original), *_ = np.linalg.lstsq(np.stack([share, -inverse], 1), -np.ones_like(share), rcond=None)
        if round(original) >= 1:
            for f, high in dict.fromkeys(((float(f"{factor:.3g}"), float(f"{1 + k:.3g}")), (factor, 1 + k))):
                found.append((theta, RopeScaling("llama3", float(f), int(round(original)), 1.0, float(high))))
    return found


def _tensors_kept(module):
    """(name, tensor) for every buffer and every plain tensor attribute (Meta's `self.freqs_cis`, which .to() does
    not convert), named by its dotted path; none that is empty (a cache made in the forward: fairseq's future mask)."""
    yield from ((name, b) for name, b in module.named_buffers() if b.numel())
    for path, mod in module.named_modules():
        for attr, value in vars(mod).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) and value.numel():
                yield (f"{path}.{attr}" if path else attr), value


def rope(
    module, Dh: int, first: float | None, notes: list, computed=(), scaling: RopeScaling | None = None, flow=None
) -> tuple[dict, list, int | None]:
    """The user's RoPE as its module keeps it. The bases tried: `first` (the caller's), those of the tables its
    forward computed (`computed`, a batch's first), those the module states (a base attribute, transformers' config,
    an inv_freq buffer, a table rope_table reads), then 10000. Each RoPE table kept in float32 equal to one of
    rope_tables at one of them is overwritten with its float64 values. The rotary width where fewer than Dh features
    turn (GPT-NeoX's rotary_pct): twice a shorter inv_freq's length, else GPT-J's sin-and-cos table's width or that
    of the tables the forward computed (Phi-2's). A table the forward (`flow`) adds (Marian's sin | cos positions
    buffer) is none of RoPE's. Returns ({name: float64 values}, the bases with the module's tables' first, that
    rotary width or None)."""
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
    kept = [(name, t) for name, t in kept if flow is None or not flow.added(name)]
    relabel64, relabel_base, relabel_width, orders = _relabelled_kept(kept, Dh, notes)
    kept = [(name, t) for name, t in kept if name not in relabel64]
    found += [t[0] for t in (rope_table(_squeezed(t), Dh) for _, t in kept) if t is not None]
    thetas = list(dict.fromkeys(found + [10000.0]))
    overwrite: dict = {}
    bases: list = []
    widths = {_squeezed(t).shape[-1] for _, t in kept if _sin_cos_table(t)} | {R for _, R in read}
    for name, buf in kept:
        value = _squeezed(buf)
        rows = value.shape[0] if value.ndim >= 2 else 1
        # a rotary part's tables: GPT-J's sin and cos, an inv_freq, LitGPT's cos and sin of its first R features
        at = (R for R in dict.fromkeys((Dh, value.shape[-1], 2 * value.shape[-1])) if 2 <= R <= Dh and R % 2 == 0)
        tables = ((R, t, rope_tables(t, R, rows, scaling)) for R in at for t in thetas)
        tried = ((R, t, what, table, tol) for R, t, at in tables for what, (table, tol) in at.items())
        match = next(((R, t, what, table) for R, t, what, table, tol in tried if _within(value, table, tol)), None)
        if match is not None:
            width, theta, what, overwrite[name] = match
            widths |= {width} if width < Dh and value.ndim >= 2 else set()
            bases.append(theta)
            notes.append(
                f"{name}: {what} (base {theta:g}{f', Dh read as the {width} rotary features' * (width < Dh)}) to "
                f"float32 precision; overwritten with the {overwrite[name].dtype} values for the float64 comparison"
            )
    rotary = 2 * min(lengths) if len(lengths) == 1 and 0 < 2 * min(lengths) < Dh else None
    if rotary is None and len(widths) == 1 and widths != {Dh}:
        rotary = widths.pop()  # GPT-J's embed_positions (T, rotary_dim), Phi-2's or LitGPT's tables of its rotary part
    bases = [b for b in [relabel_base] if b is not None] + bases[:1]
    return overwrite | relabel64, list(dict.fromkeys(bases + thetas)), relabel_width or rotary, orders


def _relabelled_kept(kept: list, Dh: int, notes: list) -> tuple[dict, float | None, int | None, dict]:
    """The kept tables `relabelled` reads (sines first, their base tried on the cosines): ({name: float64 table},
    the base, the rotary width, the orders of the first), a note for each; NoPair where it reads no rotary of the
    reference's."""
    overwrite: dict = {}
    base, width, orders = None, None, {}
    for name, t in sorted(kept, key=lambda item: bool(_squeezed(item[1]).flat[0] == 1)):
        read = relabelled(_squeezed(t), Dh, 1.0 if width == 2 else base)  # one pair: at frequency 1, any base
        if isinstance(read, str):
            raise NoPair(name.rpartition(".")[0] or "(the module)", read)
        if read is not None:
            base, width, orders = read[0] if base is None else base, read[1], orders or read[2]
            overwrite[name] = read[3].reshape(t.shape)
            at = "any base" if read[0] is None else f"base {read[0]:.10g}"
            notes.append(
                f"{name}: a rotary table with features at frequency 0: the reference's partial rotary (rotary_dim "
                f"{width}, {at}) on the q/k features relabelled; overwritten with its float64 values"
            )
    return overwrite, base, width, orders
