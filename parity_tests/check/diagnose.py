"""Naming the mistake: probes a plain comparison cannot see, the first divergent submodule, and the variants.

- Dropout in evaluation mode: two calls on the same input differ.
- No max subtraction: queries and keys scaled up until the scores reach ~1e3; the reference's softmax stays finite,
  exp(scores) overflows.
- For a layer or a model: the first divergent submodule, and the variants there (divergence.py).
- For a component: each catalogue variant (matchers.py) run on the component's own probe; one that reproduces the
  user's output to float64 precision (judge.MATCH) is a diagnosis.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from . import calling as C
from . import levels as LV
from . import variants as VR
from .divergence import first_divergence, hook_targets, run_hooked, unit_of
from .judge import _error
from .matchers import _np, match_attention, match_embedding, match_unit
from .report import Diagnosis

BIG = 30.0  # inputs scaled by this: scores grow by its square, ~1e3, past exp's float32 range


def dropout_probe(session, caller, result) -> bool:
    """Two evaluation-mode calls on the same input: a difference is dropout left on. Names the user's submodule
    whose inputs agree between the two calls and whose output does not (the one that draws the randomness)."""
    module = session.copy(np.float64)
    records, handles = [], []
    if session.is_module:
        for name, mod in module.named_modules():
            handles.append(mod.register_forward_hook(lambda m, a, o, name=name: records.append((name, a, o))))
    try:
        with torch.random.fork_rng():  # the caller's random state is left as it was
            torch.manual_seed(0)
            first, _ = session.run_user(caller, np.float64)
            n = len(records)
            torch.manual_seed(1)
            second, _ = session.run_user(caller, np.float64)
    finally:
        for h in handles:
            h.remove()

    def same(a, b) -> bool:
        try:
            return torch.equal(C.first_tensor(a).nan_to_num(nan=0.5), C.first_tensor(b).nan_to_num(nan=0.5))
        except (TypeError, IndexError):
            return True

    if same(first, second):
        return False
    where = "(the module)" if session.is_module else ""
    for (name, a1, o1), (_, a2, o2) in zip(records[:n], records[n:], strict=False):
        if (not a1 or same(a1, a2)) and not same(o1, o2):
            where = name or where
            break
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
            out, _ = session.run_user(caller, np.float32, scale=BIG)
            before = int((~torch.isfinite(session.run_user(caller, np.float32)[0])).sum())
        calls = [("" if not session.is_module else "(the module)", out, before)]
    elif session.entry.hooked and session.is_module:
        calls = _attention_calls_scaled(session, caller)
    else:
        return
    for where, out, before in calls:
        more = int((~torch.isfinite(out)).sum()) - before
        if more > 0:
            message = (
                f"with scores of ~{BIG**2:.0e} the output holds {more} more inf/NaN in float32; the reference's "
                "softmax (row maximum subtracted) stays finite"
            )
            result.diagnoses.append(Diagnosis("attention.no_max_subtraction", message, where, math.inf))
            return


def _attention_calls_scaled(session, caller) -> list:
    """(user module path, output) of each attention submodule called again with its float inputs scaled by BIG."""
    attention = {unit_of(ref)[0] for link in session.links for ref, _ in link.parts if unit_of(ref)[1] == "attention"}
    targets = {u: path for u, path in hook_targets(session).items() if u in attention and path}
    captured = run_hooked(session, caller, np.float32, targets, lambda m, a, k, o: (m, a, k))
    D = session.cfg.d_model

    def scaled(t):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.ndim >= 2 and t.shape[-1] == D:
            return t * BIG
        return t

    out = []
    with torch.no_grad():
        for unit, (mod, args, kwargs) in captured.items():
            try:
                y = mod(*[scaled(a) for a in args], **{k: scaled(v) for k, v in kwargs.items()})
                before = int((~torch.isfinite(C.first_tensor(mod(*args, **kwargs)))).sum())
            except Exception:  # an attention that cannot run again on its own inputs (a decoding cache it extends)
                continue
            out.append((targets[unit], C.first_tensor(y), before))
    return out


def component_variants(session, caller, cfg, result) -> None:
    """The catalogue's variants of a component, on the component's own probe: under the chosen convention, config
    and weight map, else under the first other convention (a mask's kind and shape, causal or not), config
    (rotary or not, its base) or map (RoPE's pairing, gate and up) under which one matches."""
    chosen = session.layout
    layouts = [chosen] + [x for x in session.layouts if x is not chosen]
    configs = [cfg] + [c for c in session.config_candidates() if c != cfg]
    for layout in layouts:
        session.use(layout)
        for config in configs:
            for candidate in [caller] + [c for c in getattr(session, "runnable", []) if c is not caller]:
                if config.positional == "rope" and not session.probe(candidate).self_attention:
                    continue
                found = _component_variants(session, candidate, config)
                if found:
                    result.diagnoses += found
                    if candidate is not caller or config != cfg or layout is not chosen:
                        result.notes.append(f"diagnosed under the convention {candidate.conventions()}")
                    return
    session.use(chosen)


def _heads_variants(session, p, user, cfg) -> list:
    f = p.floats
    keep = LV.keep_mask(p, "src")
    return match_attention(user, None, f["q"], (f["k"], f["v"]), cfg.n_heads, keep, "", self_attention=False)


def _attention_variants(session, p, user, cfg) -> list:
    q = p.floats["query"]
    kv = q if p.self_attention else (p.floats["key"], p.floats["value"])
    context = {"causal": True} if p.causal else {"self_attention": p.self_attention}
    keep = LV.keep_mask(p, "self" if p.causal else "src")
    knobs = VR.rope_knobs(cfg)
    return match_attention(user, session.params, q, kv, cfg.n_heads, keep, "", p.valid, **knobs, **context)


def _unit_variants(session, p, user, cfg) -> list:
    """A norm's, a gated feed-forward's or a fixed position table's variants (a layer norm's eps its module's)."""
    unit = session.entry.unit
    if unit == "positions" and cfg.positional == "learned":
        return []
    own = next(iter(session.norm_eps.values()), None) if unit == "layer_norm" else None
    return match_unit(unit, user, p.floats["x"], session.params, own or cfg.layer_norm_eps, cfg.activation, "")


def _embedding_variants(session, p, user, cfg) -> list:
    table = session.params["token_embedding.weight"]
    return match_embedding(user, p.ids["ids"], table, None, cfg.d_model, "", scale_expected=cfg.scale_embeddings)


# a component's catalogue variants, by its unit (level_table.Level.unit): (session, probe, user output, cfg) -> list
COMPONENT_VARIANTS = {
    "heads": _heads_variants,
    "attention": _attention_variants,
    "layer_norm": _unit_variants,
    "rms_norm": _unit_variants,
    "gated_feed_forward": _unit_variants,
    "embedding": _embedding_variants,
    "positions": _unit_variants,
}


def _component_variants(session, caller, cfg) -> list:
    match = COMPONENT_VARIANTS.get(session.entry.unit)
    if match is None:
        return []
    user, _ = session.run_user(caller, np.float64)
    return match(session, session.probe(caller), _np(user), cfg)


def diagnose(session, caller, cfg, kind, result) -> None:
    """Fill result.diagnoses, first_divergence and unexplained (see the module docstring)."""
    if dropout_probe(session, caller, result):
        return
    overflow_probe(session, caller, result)
    failing = [r for r in result.rows if not r.ok]
    if not failing:
        return
    if session.entry.hooked and session.is_module:
        first_divergence(session, caller, cfg, result)
    else:
        component_variants(session, caller, cfg, result)
        if not result.diagnoses:
            worst = max(failing, key=lambda r: r.error)
            result.unexplained = (
                f"{worst.name} diverges (relative error {worst.error:.2e} in {worst.dtype}); not expressible by the "
                "config and no catalogue variant reproduces the output"
            )
