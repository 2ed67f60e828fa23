"""The catalogue's variants (mistakes.py) run on a unit's inputs (an attention, a norm, a gated feed-forward, the
embeddings): those that reproduce the user's output far better than the reference does (diagnosis.named)."""

from __future__ import annotations

import itertools
import math

import numpy as np

from . import mistakes as MK
from . import variants as VR
from .diagnosis import MATCH, Diagnosis, _error, _valid, named


def _rows_without_keys(keep, shape) -> np.ndarray | None:
    """(B, T_q) True where a query row has no key left in `keep` broadcast to `shape` (B, 1, T_q, T_k): the variant's
    output there is excluded (the user's may be NaN (-inf fill) or uniform (-1e9 fill), not the reference's zeros)."""
    return None if keep is None else ~(keep | np.zeros(shape, bool)).any(-1).all(1)


def match(user: np.ndarray, variant: np.ndarray, valid, empty=None, finite: bool = False) -> float:
    """The relative error of `variant` from `user` at the `valid` positions but the `empty` ones (and, where `finite`,
    but those where the user's output is NaN); NaN counts as far off."""
    if np.shape(user) != np.shape(variant):  # e.g. a module that returns its query (T_q) for a (T_k) variant
        return math.inf
    user, variant = _valid(user, valid), _valid(variant, valid)
    if empty is not None and user.ndim >= 2 and user.shape[:2] == empty.shape:
        user, variant = _valid(user, ~empty), _valid(variant, ~empty)
    lost = _nan_rows(user) if finite else None  # NaN (a -inf fill's softmax of nothing): compared elsewhere
    if lost is not None:
        user, variant = _valid(user, ~lost), _valid(variant, ~lost)
    return _error(np.nan_to_num(user, nan=1e300), variant)


def _nan_rows(user: np.ndarray) -> np.ndarray | None:
    """(B, T) True at the positions whose output holds NaN, where some but not all do; else None."""
    rows = np.isnan(user).reshape(*user.shape[:2], -1).any(-1) if user.ndim >= 2 else None
    return rows if rows is not None and rows.any() and not rows.all() else None


def match_attention(
    user_out, params, query, kv, H, keep, where, valid=None, n_kv=None, theta=None, qk_eps=1e-6, softcap=None,
    rotary=None, scaling=None, order=None, divisor=None, alibi=None, relative=None, **context,
) -> list:  # fmt: skip
    """The attention variants that reproduce `user_out` (B, T_q, D) on the reference's inputs (`kv`: the key and
    value input, or a (key, value) pair; params None: q, k, v split into heads) at the valid positions; where several
    do, those that also do at the padded ones (padding on queries and an ignored mask differ only there), then those
    that need no row left out. `through` in `context`: compare through(attend), attend the variant as a function of
    (query, key/value input, mask), in the place of an attention that is no module of its own."""
    tiers: tuple = ([], [], [])  # reproduced: everywhere; except rows with no key; at the valid positions
    D = query.shape[-1] * (H if params is None else 1)  # heads already split: (B, H, T, Dh)
    read = dict(rope=theta is not None, gqa=n_kv not in (None, H), softcap=softcap, sinks="sinks" in (params or {}))
    read |= {"scaling": scaling if theta is not None else None}
    through = context.pop("through", None)
    queries = [len(params[n]) for n in ("q_proj.weight", "q_b_proj.weight") if n in (params or {})]  # V3's: q_b
    Dh = queries[0] // H if queries else D // H  # Qwen3's, latent attention's: H * Dh > D
    site = MK.Site(D, Dh, keep, **read, **context, H=H, divisor=divisor)

    def run(knobs: dict, finite: bool = False) -> tuple:  # (the variant's output, its rows without keys, its error)
        knobs = {"softcap": softcap, "divisor": divisor, "alibi": alibi} | dict(knobs)
        k, transpose = knobs.pop("keep", keep), knobs.pop("transpose", True)
        if params is None:  # scaled dot-product attention on heads already split
            variant = VR.attention_heads(query, kv[0], kv[1], k, **knobs)
            empty = _rows_without_keys(k, (query.shape[0], 1, query.shape[2], kv[0].shape[2]))
            by_rows = user_out.transpose(0, 2, 1, 3), variant.transpose(0, 2, 1, 3)
            return variant, empty, match(*by_rows, None, empty, finite)
        key, value = kv if isinstance(kv, tuple) else (kv, kv)
        options = dict(qk_eps=qk_eps, rotary=rotary, scaling=scaling, order=order, relative=relative) | knobs
        if through is None:
            variant = VR.multi_head_attention(params, query, key, value, H, k, transpose, n_kv, theta, **options)
        else:  # in the layer: the sublayer's query and key/value input, the variant's mask (`k`) for the layer's
            variant = through(
                lambda q, x, _: VR.multi_head_attention(params, q, x, x, H, k, transpose, n_kv, theta, **options)
            )
        empty = _rows_without_keys(k, (query.shape[0], 1, query.shape[1], key.shape[1]))
        return variant, empty, match(user_out, variant, valid, empty, finite)

    for finite in (False, True)[: 1 + (_nan_rows(user_out) is not None)]:  # NaN left out only where none matches
        unmatched = run({}, finite)[2]  # the reference's own
        for vid, message, knobs in MK.variants(MK.ATTENTION, site):
            variant, empty, error = run(knobs, finite)
            if named(error, unmatched) and vid not in {d.id for tier in tiers for d in tier}:
                strict = match(user_out, variant, None, None, finite) <= MATCH
                tier = 0 if strict else 1 if match(user_out, variant, None, empty, finite) <= MATCH else 2
                lost = " (the output NaN at some positions: compared where finite)" * finite
                tiers[tier].append(Diagnosis(vid, message + lost, where, error))
        if any(tiers):
            break
    return next((tier for tier in tiers if tier), [])


def match_unit(
    unit: str,
    user_out,
    x,
    params: dict,
    eps: float,
    activation: str,
    where: str,
    valid=None,
    through=None,
    layout="interleaved",
) -> list:
    """The variants of a norm, a gated feed-forward or a position table (`unit`; `params` its own; `layout` a
    sinusoid table's) that reproduce `user_out` on its input `x`: each alone, then those that combine (the Annotated
    Transformer's x.std() + eps). `through`: compare through(variant), the variant a function of its input (a unit
    that is no module of its own)."""
    site = MK.Site(x.shape[-1], x.shape[-1])
    forward = {
        "layer_norm": lambda x, knobs, p: VR.layer_norm(x, p["weight"], p.get("bias", 0.0), eps, **knobs),
        "rms_norm": lambda x, knobs, p: VR.rms_norm(x, p["weight"], eps, **knobs),
        "gated_feed_forward": lambda x, knobs, p: VR.gated_feed_forward(p, x, activation, **knobs),
        "positions": lambda x, knobs, p: x + VR.sinusoid_tables(x.shape[1], x.shape[-1], layout)[knobs["table"]],
    }[unit]

    def run(knobs: dict):  # through's variant takes the unit's own parameters, or another unit's of its kind
        return forward(x, knobs, params) if through is None else through(lambda h, p=params: forward(h, knobs, p))

    references = [{"table": t} for t in ("interleaved", "split")] if unit == "positions" else [{}]  # either layout
    unmatched = min(match(user_out, run(knobs), valid) for knobs in references)
    for combination in [[v] for v in MK.variants(unit, site)] + [MK.variants(unit, site, combining=True)]:
        knobs = {k: v for _, _, variant in combination for k, v in variant.items()}
        if not knobs:
            continue
        error = match(user_out, run(knobs), valid)
        if named(error, unmatched):
            return [Diagnosis(i, m.format(eps=eps, activation=activation), where, error) for i, m, _ in combination]
    return []


def match_embedding(
    user_x, ids, table, positions, D, where, valid=None, scale_expected=True, layout="interleaved"
) -> list:
    """Variants of the embedding sum scale * E[ids] + P[:T] (units "embedding" and "positions"): a wrong scale,
    a wrong position table (in the sinusoids' `layout`), or both."""
    site = MK.Site(D, D)
    scales = [("", "", math.sqrt(D) if scale_expected else 1.0)]
    scales += [(vid, message, knobs["scale"]) for vid, message, knobs in MK.variants("embedding", site)]
    tables = [("", "", positions)]
    if positions is not None:
        options = VR.sinusoid_tables(len(positions), D, layout)
        tables += [(vid, message, options[knobs["table"]]) for vid, message, knobs in MK.variants("positions", site)]
    found, unmatched = [], math.inf
    for (sid, scale_message, scale), (tid, table_message, pos) in itertools.product(scales, tables):
        error = match(user_x, scale * table[ids] + (0.0 if pos is None else pos[: ids.shape[1]]), valid)
        unmatched = error if not (sid or tid) else unmatched  # the first: the reference's own
        if (sid or tid) and named(error, unmatched):
            both = ((sid, scale_message), (tid, table_message))
            found += [Diagnosis(vid, message, where, error) for vid, message in both if vid]
    return found
