"""Naming the mistake: probes a plain comparison cannot see (dropout in evaluation mode, a softmax without the max
subtraction), then for a layer or a model the first divergent submodule and the variants there (divergence.py),
for a component each catalogue variant (matchers.py) run on its own probe; one that reproduces the user's output
to float64 precision (diagnosis.MATCH) is a diagnosis."""

from __future__ import annotations

import math

import numpy as np
import torch

from . import calling as C
from . import levels as LV
from . import variants as VR
from .dataflow import hooked
from .diagnosis import _error
from .divergence import capture, first_divergence, hook_targets, run_hooked, unit_of
from .matchers import _np, match_attention, match_embedding, match_unit
from .report import Diagnosis

BIG = 30.0  # inputs scaled by this: scores grow by its square, ~1e3, past exp's float32 range


def dropout_probe(session, caller, result) -> bool:
    """Two evaluation-mode calls on the same input: a difference is dropout left on. Names the user's submodule
    whose inputs agree between the two calls and whose output does not (the one that draws the randomness)."""
    records: list = []
    modules = session.copy(np.float64).named_modules() if session.is_module else []
    with hooked(modules, lambda name, m, a, k, o: records.append((name, a, o))), torch.random.fork_rng():
        torch.manual_seed(0)  # the caller's random state is left as it was (fork_rng)
        first, _ = session.run_user(caller, np.float64)
        n = len(records)
        torch.manual_seed(1)
        second, _ = session.run_user(caller, np.float64)

    def same(a, b) -> bool:
        try:
            return torch.equal(C.first_tensor(a).nan_to_num(nan=0.5), C.first_tensor(b).nan_to_num(nan=0.5))
        except (TypeError, IndexError):
            return True

    if same(first, second):
        return False
    pairs = zip(records[:n], records[n:], strict=False)
    drawn = (name for (name, a1, o1), (_, a2, o2) in pairs if (not a1 or same(a1, a2)) and not same(o1, o2))
    where = next(drawn, "") or ("(the module)" if session.is_module else "")
    error = _error(_np(first), _np(second))
    message = f"two evaluation-mode calls differ by {error:.2e}: dropout runs with training=True (F.dropout's default)"
    result.diagnoses.append(Diagnosis("dropout.active_in_eval", message, where, error))
    return True


def overflow_probe(session, caller, result) -> None:
    """Scores of ~1e3 (queries and keys scaled by BIG): a softmax without the max subtraction overflows in float32.
    A component is called on scaled inputs; in a layer or a model each attention submodule is called again on
    its own inputs, scaled (masks, integer or of another width, are left as they are)."""
    if session.entry.unit in ("heads", "attention"):
        with np.errstate(all="ignore"):
            out, plain = (session.run_user(caller, np.float32, scale=s)[0] for s in (BIG, 1.0))
        calls = [("(the module)" if session.is_module else "", out, plain)]
    elif session.entry.hooked and session.is_module:
        calls = _attention_calls_scaled(session, caller)
    else:
        return
    for where, out, plain in calls:
        more = int((~torch.isfinite(out)).sum()) - int((~torch.isfinite(plain)).sum())
        if more > 0:
            message = (
                f"with scores of ~{BIG**2:.0e} the output holds {more} more inf/NaN in float32; the reference's "
                "softmax (row maximum subtracted) stays finite"
            )
            result.diagnoses.append(Diagnosis("attention.no_max_subtraction", message, where, math.inf))
            return


def _attention_calls_scaled(session, caller) -> list:
    """(user module path, output, output unscaled) of each attention submodule called again with its float inputs
    scaled by BIG, and as they were."""
    attention = {unit_of(ref)[0] for link in session.links for ref, _ in link.parts if unit_of(ref)[1] == "attention"}
    targets = {u: path for u, path in hook_targets(session).items() if u in attention and path}
    captured = run_hooked(session, caller, np.float32, targets, lambda m, a, k, o: (m, a, k))
    D = session.model.cfg.d_model

    def scaled(t):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.ndim >= 2 and t.shape[-1] == D:
            return t * BIG
        return t

    out = []
    with torch.no_grad():
        for unit, (mod, args, kwargs) in captured.items():
            try:
                y = mod(*[scaled(a) for a in args], **{k: scaled(v) for k, v in kwargs.items()})
                out.append((targets[unit], C.first_tensor(y), C.first_tensor(mod(*args, **kwargs))))
            except Exception:  # an attention that cannot run again on its own inputs (a decoding cache it extends)
                continue
    return out


def component_variants(session, caller, cfg, result, runnable: tuple = ()) -> None:
    """The catalogue's variants of a component, on the component's own probe: under the chosen convention, config
    and weight map, else under the first other convention (a mask's kind and shape, causal or not), config
    (rotary or not, its base) or map (RoPE's pairing, gate and up) under which one matches."""
    chosen = session.layout
    layouts = [chosen] + [x for x in session.layouts if x is not chosen]
    configs = [cfg] + [c for c in session.config_candidates() if c != cfg]
    for layout in layouts:
        under = session.under(layout)
        for config in configs:
            for candidate in [caller] + [c for c in runnable if c is not caller]:
                if config.positional == "rope" and not under.probe(candidate).self_attention:
                    continue
                found = _component_variants(under, candidate, config)
                if found:
                    result.diagnoses += found
                    if candidate is not caller or config != cfg or layout is not chosen:
                        result.notes.append(f"diagnosed under the convention {candidate.conventions()}")
                    return


# the units of the components that have catalogue variants (levels.Level.unit)
VARIANT_UNITS = ("heads", "attention", "layer_norm", "rms_norm", "gated_feed_forward", "embedding", "positions")


def _component_variants(session, caller, cfg) -> list:
    """A component's catalogue variants on its probe, by its unit: an attention's (its heads already split or not),
    an embedding's, a norm's (a layer norm's eps its module's), a gated feed-forward's or a fixed position table's."""
    unit, p = session.entry.unit, session.probe(caller)
    if unit not in VARIANT_UNITS or (unit == "positions" and cfg.positional == "learned"):
        return []
    user, f = _np(session.run_user(caller, np.float64)[0]), p.floats
    if unit == "heads":
        keep = LV.keep_mask(p, "src")
        return match_attention(user, None, f["q"], (f["k"], f["v"]), cfg.n_heads, keep, "", self_attention=False)
    if unit == "attention":
        kv = f["query"] if p.self_attention else (f["key"], f["value"])
        context = {"causal": True} if p.causal else {"self_attention": p.self_attention}
        keep = LV.keep_mask(p, "self" if p.causal else "src")
        knobs = VR.rope_knobs(cfg) | context
        return match_attention(user, session.params, f["query"], kv, cfg.n_heads, keep, "", p.valid, **knobs)
    if unit == "embedding":
        table = session.params["token_embedding.weight"]
        return match_embedding(user, p.ids["ids"], table, None, cfg.d_model, "", scale_expected=cfg.scale_embeddings)
    own = next(iter(session.model.norm_eps.values()), None) if unit == "layer_norm" else None
    return match_unit(unit, user, f["x"], session.params, own or cfg.layer_norm_eps, cfg.activation, "")


def diagnose(session, caller, cfg, kind, result, runnable: tuple = ()) -> None:
    """Fill result.diagnoses, first_divergence and unexplained (see the module docstring)."""
    if dropout_probe(session, caller, result):
        return
    overflow_probe(session, caller, result)
    failing = [r for r in result.rows if not r.ok]
    if not failing:
        return
    if session.entry.hooked and session.is_module:
        first_divergence(session, caller, cfg, result, capture(session, caller))
    else:
        component_variants(session, caller, cfg, result, runnable)
        if not result.diagnoses:
            worst = max(failing, key=lambda r: r.error)
            result.unexplained = (
                f"{worst.name} diverges (relative error {worst.error:.2e} in {worst.dtype}); not expressible by the "
                "config and no catalogue variant reproduces the output"
            )
