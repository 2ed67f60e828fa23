"""Naming the mistake: probes a plain comparison cannot see (dropout in evaluation mode, a softmax without the max
subtraction), then for a layer or a model the first divergent submodule and the catalogue's variants there, for a
component each catalogue variant (matchers.py) run on its own probe; one that reproduces the user's output to
float64 precision (diagnosis.MATCH) is a diagnosis.

The first divergent submodule: forward hooks on the user's submodules, each matched (through the weight map) to a
unit of the reference (an attention, a norm, a feed-forward block, the embeddings); each unit is judged in situ,
the reference unit run on the inputs the user's parent gave the submodule; the first unit whose output leaves the
bar is the first divergence, and each catalogue variant is run on that unit's inputs there."""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from numpy_transformer import model as M

from . import calling as C
from . import reference as R
from . import variants as VR
from .dataflow import hooked
from .diagnosis import MATCH, Diagnosis, _error
from .matchers import match, match_attention, match_embedding, match_unit
from .probes import keep_mask
from .running import Call, first_calls
from .session import copy_of, probe_of, run_user
from .unsupported import differs


def unit_of(ref: str) -> tuple[str, str]:
    """(unit prefix, kind) of a reference tensor name: attention, ffn, norm or table."""
    base = ref.rsplit(".", 1)[0]
    last = base.rsplit(".", 1)[-1]
    if last in ("q_proj", "k_proj", "v_proj", "out_proj", "linear1", "linear2", "gate"):
        return _module_path(base), "ffn" if last in ("linear1", "linear2", "gate") else "attention"
    return base, "table" if last.endswith("embedding") else "norm"


def _lca(paths: list) -> str:
    """The deepest module path holding all of `paths` (commonprefix compares the lists of names item by item)."""
    return ".".join(os.path.commonprefix([p.split(".") if p else [] for p in paths]))


def _called(owner: str, modules: dict) -> str:
    """`owner`, or the nearest module above it that runs (a container of modules or parameters is never called)."""
    while owner and isinstance(modules.get(owner), (nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)):
        owner = _module_path(owner)
    return owner


def _module_path(user_name: str) -> str:
    return user_name.rsplit(".", 1)[0] if "." in user_name else ""


def _inside(path: str, owner: str) -> bool:
    return owner == "" or path == owner or path.startswith(owner + ".")


def _modules(check) -> dict:
    return dict(check.user.named_modules()) if check.is_module else {}


def hook_targets(check, links) -> dict:
    """reference unit (or layer) prefix -> the user's module path that computes exactly it, for the units that
    have one: the deepest module that runs (not a ModuleList or ModuleDict) holding all its parameters and none of
    another unit's."""
    modules = _modules(check)
    paths: dict = {}
    for link in links:
        for ref, _ in link.parts:
            parts = unit_of(ref)[0].split(".")
            layers = [".".join(parts[: i + 2]) for i, part in enumerate(parts[:-1]) if part == "layers"]
            for unit in [".".join(parts), *layers]:  # the unit, and the layers holding it
                paths.setdefault(unit, set()).add(_module_path(link.user))
    targets = {}
    for unit, own in paths.items():
        owner = _called(_lca(sorted(own)), modules)
        others = [p for u, ps in paths.items() if not _inside(u, unit) and not _inside(unit, u) for p in ps]
        if not any(_inside(p, owner) for p in others):
            targets[unit] = owner
    for unit, path in _out_projections(links).items():
        if unit not in targets and isinstance(modules.get(path), nn.Linear):
            targets[unit] = path  # its output is the attention's (BERT's attention.output.dense beside the norm)
    return targets


def _out_projections(links) -> dict:
    """attention unit -> the user's module path of its output projection."""
    refs = ((ref, link.user) for link in links for ref, _ in link.parts)
    return {unit_of(ref)[0]: _module_path(user) for ref, user in refs if ref.rsplit(".", 2)[-2:-1] == ["out_proj"]}


def attention_place(links, unit: str, target: str) -> str:
    """Where an attention unit's divergence is named: its hooked module, or, where only its output projection
    could be hooked (the projection's module sits beside another unit's, as BERT's attention.output holds the
    dense layer and the LayerNorm), the module holding its q, k and v projections (BERT's attention.self), or where
    that module holds another unit's rows too (PaLM's, shared with the feed-forward), the one around it and the
    output projection."""
    if _out_projections(links).get(unit) != target:
        return target
    refs = [(ref, link.user) for link in links for ref, _ in link.parts]
    qkv = [_module_path(user) for ref, user in refs if unit_of(ref) == (unit, "attention") and ".out_proj." not in ref]
    shared = {_module_path(user) for ref, user in refs if unit_of(ref)[0] != unit} & set(qkv)  # PaLM's, with the FFN
    return _lca(qkv + [target] * bool(shared)) or target


def capture(check, choice, dtype=np.float64) -> dict:
    """Run the user's copy in `dtype` once with forward hooks on the modules hook_targets finds: unit -> its Call."""
    modules = dict(copy_of(check, choice.layout, dtype).named_modules())
    targets = hook_targets(check, choice.layout.links)
    with first_calls([(u, modules[p]) for u, p in targets.items() if p in modules]) as captured:
        run_user(check, choice.layout, choice.caller, dtype)
    return captured


def situated(stage: R.Stage, call: Call | None, batch_first: bool) -> R.Stage:
    """`stage` in situ: its float inputs those the user's parent gave the part (`call`), in order and by shape (a
    self-attention's key input its query), its output the reference part's on them. The stage as the reference ran
    it where the part's inputs cannot be read: an embedding (its ids are the probe's), a part hooked at its output
    projection, a call with no input of the first one's shape."""
    if call is None or stage.rerun is None or type(call.module) is nn.Linear:
        return stage
    tensors = [t for t in call.inputs if isinstance(t, torch.Tensor) and t.is_floating_point() and t.ndim == 3]
    floats = (C.as_numpy(t if batch_first else t.transpose(0, 1)) for t in tensors)
    inputs: list = []
    for i, ref in enumerate(stage.inputs):
        if not (isinstance(ref, np.ndarray) and ref.dtype.kind == "f" and ref.ndim == 3):
            inputs.append(ref)
            continue
        same = next((j for j, other in enumerate(stage.inputs[:i]) if other is ref), None)
        turned = (C.batch_first(f, ref.shape) for f in floats)  # a part given time-first inputs (fairseq's)
        user = inputs[same] if same is not None else next((f for f in turned if f.shape == ref.shape), None)
        if user is None and i == 0:
            return stage
        inputs.append(ref if user is None else user)
    try:
        with np.errstate(all="ignore"):
            return dataclasses.replace(stage, inputs=tuple(inputs), output=stage.rerun(*inputs))
    except (ValueError, IndexError):  # the part's inputs read otherwise than the reference's
        return stage


# Below this a part's divergence may be float32 rounding (a constant made in float32 in a float64 model); a part
# judged in situ after it that diverges by more is the mistake (in situ, a part downstream computes on the inputs it
# was given: the rounding before it is not its own).
ROUNDING = 1e-5


@dataclass(frozen=True)
class Divergence:
    """Where a run of the user's module first leaves the reference: the number of stages that agree before it, the
    stage in situ (None: every hooked stage agrees), the user's output there and its relative error."""

    agree: int
    stage: R.Stage | None = None
    user: Any = None
    error: float = 0.0


def scan(check, choice, captured) -> Divergence:
    """The Divergence of the user's run (`captured`) under `choice`. Each part is judged in situ: the reference part
    on the inputs the user's parent gave it (situated); a divergence of a rounding's size gives way to a later
    part's larger one judged in situ (ROUNDING)."""
    done, small, caller, p, adds = 0, None, choice.caller, choice.probe, False
    key = ("stages", repr(choice.cfg), id(p))
    if key not in check.cache:
        check.cache[key] = R.stages(check.entry, check.params, p, choice.cfg)
    for chained in check.cache[key]:
        embedding = chained.kind == "embedding"  # the user's embeddings: its first layer's input
        call = captured.get(chained.unit.split(".")[0] + ".layers.0" if embedding else chained.unit)
        hooked = (call.inputs[:1] if embedding else (call.output,)) if call is not None else ()
        user = C.as_numpy(hooked[0]) if hooked else None
        if user is not None and not caller.batch_first and user.ndim >= 3:
            user = user.transpose(1, 0, 2)
        user = user if user is None else C.batch_first(user, chained.output.shape)  # a part's time-first output
        if user is None or user.shape != chained.output.shape:
            continue
        stage = situated(chained, captured.get(chained.unit), caller.batch_first)
        with np.errstate(all="ignore"):
            error = match(user, stage.output, stage.valid, None)
            if error > ROUNDING and stage.kind == "layer" and isinstance(stage.inputs[0], np.ndarray):
                whole = user + stage.inputs[0]  # a block returning its sublayers alone: its parent adds x (PaLM's)
                if adds or match(whole, stage.output, stage.valid, None) <= ROUNDING:
                    adds, user, error = True, whole, match(whole, stage.output, stage.valid, None)
        if error > ROUNDING and (small is None or stage is not chained):
            return Divergence(done, stage, user, error)
        if error > 1e-10 and small is None:
            small = Divergence(done, stage, user, error)
        done += small is None
    return small or Divergence(done)


def first_divergence(check, choice, result, diverged: Divergence) -> None:
    """The first reference stage whose user output leaves the bar (`diverged`), and the variants that explain it."""
    stage, error = diverged.stage, diverged.error
    if stage is None:
        return
    where, found = explained(check, choice, diverged)
    # a mistake placed more precisely than its unit (the module that keeps or scales a table) is named there
    result.first_divergence = found[-1].where if found else where
    result.diagnoses += found
    result.unsupported = None if found else _own_eps(check, choice, diverged, where)
    if not found and not result.unsupported:
        result.unexplained = (
            f"{where} (reference {stage.unit or check.level}) diverges with relative error "
            f"{error:.2e}; not expressible by the config and no catalogue variant reproduces it"
        )
        if error < 1e-5:  # float32's rounding, in a float64 run
            result.unexplained += (
                "; an error this small is typically float32 rounding: the submodule may compute in float32 inside "
                "a float64 model (an upcast such as .float(), or transformers' RMSNorm and rotary tables)"
            )


def _own_eps(check, choice, diverged: Divergence, where: str) -> str | None:
    """A norm that computes the reference's norm at an eps of its own, not the other norms' (the config holds one
    layer_norm_eps, the most common): "differs at <the norm>: ... eps ..."; None for any other divergence."""
    stage, cfg, own = diverged.stage, choice.cfg, check.model.norm_eps.get(where)
    if stage.kind != "norm" or own is None or math.isclose(own, cfg.layer_norm_eps, rel_tol=1e-9):
        return None
    params, x = M.sub(check.params, stage.unit), stage.inputs[0]
    if cfg.norm == "rms":
        norm = VR.rms_norm(x, params["weight"], own)
    else:
        norm = VR.layer_norm(x, params["weight"], params.get("bias", 0.0), own)
    if match(diverged.user, norm, stage.valid, None) > MATCH:
        return None
    return differs(where, f"the norm takes eps {own:g} where the model's other norms take {cfg.layer_norm_eps:g} "
                   "(the reference has one layer_norm_eps for every norm)")  # fmt: skip


def explained(check, choice, diverged: Divergence) -> tuple[str, list]:
    """(where, diagnoses) at the stage where the user's run diverged: at the embeddings or at a unit."""
    at = _at_embedding if diverged.stage.kind == "embedding" else _at_unit
    return at(check, choice, diverged.stage, diverged.user)


def _at_embedding(check, choice, stage, user_out) -> tuple[str, list]:
    """(where, diagnoses) at a stack's embeddings: the scale (named at the table's own wrapper) and the position
    table (named at the module that keeps the fixed table)."""
    unit, inputs, valid, cfg, links = stage.unit, stage.inputs, stage.valid, choice.cfg, choice.layout.links
    stack = unit.split(".")[0]
    token = f"{stack}.token_embedding.weight"
    holding = (_module_path(link.user) or link.user for link in links if token in dict(link.parts))
    where = next(holding, f"the {stack}'s embeddings")
    positions = None
    if cfg.positional == "sinusoidal":
        positions = VR.sinusoid_tables(cfg.max_len, cfg.d_model)[cfg.sinusoid_layout]
    elif cfg.positional == "learned":
        positions = check.params[f"{stack}.position_embedding.weight"]
    table = check.params.get(token, check.params.get("decoder.token_embedding.weight"))
    found = match_embedding(user_out, inputs[0], table, positions, cfg.d_model, where, valid, cfg.scale_embeddings)
    tables = [name.rsplit(".", 1)[0] if "." in name else "(the module)" for name in check.model.overwrite]
    for d in found:
        if d.id == "positions.wrong_frequencies" and tables:
            d.where = max(tables, key=lambda t: len(_lca([t, where])))
        elif d.id.startswith("embedding.") and check.is_module:
            d.where = _scaling_module(check, where)
    if not found and stack == "decoder" and not cfg.scale_embeddings and "encoder" in check.entry.stacks:
        found = _encoder_unscaled(check, choice, stage, user_out, table, positions)
    return where, found


def _encoder_unscaled(check, choice, stage, user_out, table, positions) -> list:
    """The decoder scales its embeddings by sqrt(d_model) where the encoder, judged first and agreeing without a
    scale, does not (Marian's encoder with embed_scale 1 on a shared table): embedding.missing_scale, named at the
    module holding the encoder."""
    ids, valid = stage.inputs[0], stage.valid
    scaled = math.sqrt(choice.cfg.d_model) * table[ids] + (0.0 if positions is None else positions[: ids.shape[1]])
    error = match(user_out, scaled, valid, None)
    if error > MATCH:
        return []
    encoder = [_module_path(link.user) for link in choice.layout.links if link.parts[0][0].startswith("encoder.")]
    message = "the encoder's token embeddings are not multiplied by sqrt(d_model); the decoder's are"
    where = _called(_lca(encoder), _modules(check)) or "the encoder's embeddings"
    return [Diagnosis("embedding.missing_scale", message, where, error)]


def _at_unit(check, choice, stage, user_out) -> tuple[str, list]:
    """(where, diagnoses) at an attention, a norm or a feed-forward block: its hooked module, and the catalogue's
    variants of that unit run on the reference's inputs to it (an attention's with the masks it read: a decoder's
    self-attention its causal and padding masks, maybe swapped with the cross-attention's; RoPE's where it rotates)."""
    unit, kind, inputs, valid, masks = stage.unit, stage.kind, stage.inputs, stage.valid, stage.masks
    cfg, links = choice.cfg, choice.layout.links
    where = hook_targets(check, links)[unit] or "(the module)"
    params = M.sub(check.params, unit)
    if kind == "attention":
        where = attention_place(links, unit, where)
        query, kv, keep = inputs
        knobs = VR.rope_knobs(cfg, rotary=unit.endswith("self_attn"), layer=R.layer_of(unit)) | masks
        return where, match_attention(user_out, params, query, kv, cfg.n_heads, keep, where, valid, **knobs)
    if kind == "layer":
        return where, _in_layer(check, choice, stage, user_out, where)
    if kind not in ("norm", "ffn") or (kind == "ffn" and not cfg.gated_ffn):
        return where, []
    name = "gated_feed_forward" if kind == "ffn" else "rms_norm" if cfg.norm == "rms" else "layer_norm"
    eps = check.model.norm_eps.get(where, None) or cfg.layer_norm_eps
    return where, match_unit(name, user_out, inputs[0], params, eps, cfg.activation, where, valid)


def _in_layer(check, choice, stage, user_out, where) -> list:
    """A layer that diverges where its attention is no module of its own (written inline in the block, beside its
    norms and feed-forward): the catalogue's attention variants put in that attention's place inside the reference
    layer, run on the layer's input in situ, compared on the layer's output."""
    cfg, prefix, targets = choice.cfg, stage.unit + ".", hook_targets(check, choice.layout.links)
    inner = check.cache.get(("stages", repr(cfg), id(choice.probe)), []) if stage.rerun is not None else []
    for attention in (s for s in inner if s.kind == "attention" and s.unit.startswith(prefix)):
        if attention.unit in targets:
            continue  # a module of its own: judged in situ there
        name, (query, kv, keep) = attention.unit[len(prefix) :], attention.inputs
        knobs = VR.rope_knobs(cfg, rotary=name == "self_attn", layer=R.layer_of(stage.unit)) | (attention.masks or {})

        def through(attend, name=name):
            return stage.rerun(*stage.inputs, attend={name: attend})

        params = M.sub(check.params, attention.unit)
        found = match_attention(
            user_out, params, query, kv, cfg.n_heads, keep, where, stage.valid, through=through, **knobs
        )
        if found:
            return found
    return []


def latest_divergence(check, choice):
    """Among the weight maps, the callers under which the module ran and the configs, the Choice whose first
    divergence comes latest (the mistake is in one place; the conventions and config are right everywhere before
    it); of those that tie, the first whose divergence a catalogue variant explains, else the one closest there."""
    scored: list = []
    for layout in check.layouts:  # the weight maps too: RoPE's pairing, gate and up
        for caller in choice.runnable:
            called = dataclasses.replace(choice, layout=layout, caller=caller, probe=probe_of(check, caller))
            captured = capture(check, called)
            for cfg in check.configs:
                trial = dataclasses.replace(called, cfg=cfg)
                found = scan(check, trial, captured)
                scored.append((-found.agree, found.error, len(scored), trial, found))
    scored.sort(key=lambda s: s[:3])
    tied = [s for s in scored if s[0] == scored[0][0]]
    explains = (trial for *_, trial, found in tied if found.stage is not None and explained(check, trial, found)[1])
    return next(explains, tied[0][3])


def _scaling_module(check, path: str) -> str:
    """The module that scales the token table at `path`: the table's nearest wrapper holding no tensor but the
    table (the Annotated Transformer's Embeddings around its nn.Embedding `lut`), else the table's own module."""
    modules = _modules(check)
    if path not in modules:
        return path

    def held(module) -> set:
        return {id(t) for t in (*module.parameters(), *module.buffers())}

    table = held(modules[path])
    while "." in path:
        parent = path.rsplit(".", 1)[0]
        if isinstance(modules[parent], (nn.ModuleList, nn.ModuleDict, nn.Sequential)) or held(modules[parent]) != table:
            break
        path = parent
    return path


BIG = 30.0  # inputs scaled by this: scores grow by its square, ~1e3, past exp's float32 range


def dropout_probe(check, choice, result) -> bool:
    """Two evaluation-mode calls on the same input: a difference is dropout left on. Names the user's submodule
    whose inputs agree between the two calls and whose output does not (the one that draws the randomness)."""
    records: list = []
    modules = copy_of(check, choice.layout, np.float64).named_modules() if check.is_module else []
    with hooked(modules, lambda name, m, a, k, o: records.append((name, a, o))), torch.random.fork_rng():
        torch.manual_seed(0)  # the caller's random state is left as it was (fork_rng)
        first, _ = run_user(check, choice.layout, choice.caller, np.float64)
        n = len(records)
        torch.manual_seed(1)
        second, _ = run_user(check, choice.layout, choice.caller, np.float64)

    def same(a, b) -> bool:
        try:
            return torch.equal(C.first_tensor(a).nan_to_num(nan=0.5), C.first_tensor(b).nan_to_num(nan=0.5))
        except (TypeError, IndexError):
            return True

    if same(first, second):
        return False
    pairs = zip(records[:n], records[n:], strict=False)
    drawn = (name for (name, a1, o1), (_, a2, o2) in pairs if (not a1 or same(a1, a2)) and not same(o1, o2))
    where = next(drawn, "") or ("(the module)" if check.is_module else "")
    error = _error(C.as_numpy(first), C.as_numpy(second))
    message = f"two evaluation-mode calls differ by {error:.2e}: dropout runs with training=True (F.dropout's default)"
    result.diagnoses.append(Diagnosis("dropout.active_in_eval", message, where, error))
    return True


def overflow_probe(check, choice, result) -> None:
    """Scores of ~1e3 (queries and keys scaled by BIG): a softmax without the max subtraction overflows in float32.
    A component is called on scaled inputs; in a layer or a model each attention submodule is called again on
    its own inputs, scaled (masks, integer or of another width, are left as they are)."""
    if check.entry.unit in ("heads", "attention"):
        with np.errstate(all="ignore"):
            out, plain = (run_user(check, choice.layout, choice.caller, np.float32, scale=s)[0] for s in (BIG, 1.0))
        calls = [("(the module)" if check.is_module else "", out, plain)]
    elif check.entry.hooked and check.is_module:
        calls = _attention_calls_scaled(check, choice)
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


def _attention_calls_scaled(check, choice) -> list:
    """(user module path, output, output unscaled) of each attention submodule called again with its inputs scaled."""
    targets = hook_targets(check, choice.layout.links)
    D = check.model.cfg.d_model

    def scaled(t):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.ndim >= 2 and t.shape[-1] == D:
            return t * BIG
        return t

    out = []
    with torch.no_grad():
        for unit, call in capture(check, choice, np.float32).items():
            if not unit.endswith("_attn") or not targets[unit]:  # an attention's unit: self_attn, cross_attn
                continue
            try:
                y = call.module(*[scaled(a) for a in call.args], **{k: scaled(v) for k, v in call.kwargs.items()})
                out.append((targets[unit], C.first_tensor(y), C.first_tensor(call.module(*call.args, **call.kwargs))))
            except Exception:  # an attention that cannot run again on its own inputs (a decoding cache it extends)
                continue
    return out


def component_variants(check, choice, result) -> None:
    """The catalogue's variants of a component, on the component's own probe: under the chosen convention, config
    and weight map, else under the first other convention (a mask's kind and shape, causal or not), config
    (rotary or not, its base) or map (RoPE's pairing, gate and up) under which one matches."""
    layouts = [choice.layout] + [x for x in check.layouts if x is not choice.layout]
    configs = [choice.cfg] + [c for c in check.configs if c != choice.cfg]
    callers = [choice.caller] + [c for c in choice.runnable if c is not choice.caller]
    for layout, cfg, caller in itertools.product(layouts, configs, callers):
        p = probe_of(check, caller)
        if cfg.positional == "rope" and not p.self_attention:
            continue
        found = _component_variants(check, dataclasses.replace(choice, layout=layout, cfg=cfg, caller=caller, probe=p))
        if found:
            result.diagnoses += found
            if caller is not choice.caller or cfg != choice.cfg or layout is not choice.layout:
                result.notes.append(f"diagnosed under the convention {caller.conventions()}")
            return


# the units of the components that have catalogue variants (levels.Level.unit)
VARIANT_UNITS = ("heads", "attention", "layer_norm", "rms_norm", "gated_feed_forward", "embedding", "positions")


def _component_variants(check, choice) -> list:
    """A component's catalogue variants on its probe, by its unit: an attention's (its heads already split or not),
    an embedding's, a norm's (a layer norm's eps its module's), a gated feed-forward's or a fixed position table's."""
    unit, p, cfg, params = check.entry.unit, choice.probe, choice.cfg, check.params
    if unit not in VARIANT_UNITS or (unit == "positions" and cfg.positional == "learned"):
        return []
    user, f = C.as_numpy(run_user(check, choice.layout, choice.caller, np.float64)[0]), p.floats
    if unit == "heads":
        keep = keep_mask(p, "src")
        return match_attention(user, None, f["q"], (f["k"], f["v"]), cfg.n_heads, keep, "", self_attention=False)
    if unit == "attention":
        kv = f["query"] if p.self_attention else (f["key"], f["value"])
        context = {"causal": True} if p.causal else {"self_attention": p.self_attention}
        keep = keep_mask(p, "self" if p.causal else "src", cfg.sliding_window)
        knobs = VR.rope_knobs(cfg) | context
        return match_attention(user, params, f["query"], kv, cfg.n_heads, keep, "", p.valid, **knobs)
    if unit == "embedding":
        table = params["token_embedding.weight"]
        return match_embedding(user, p.ids["ids"], table, None, cfg.d_model, "", scale_expected=cfg.scale_embeddings)
    own = next(iter(check.model.norm_eps.values()), None) if unit == "layer_norm" else None
    return match_unit(unit, user, f["x"], params, own or cfg.layer_norm_eps, cfg.activation, "")


def diagnose(check, choice, result) -> None:
    """Fill result.diagnoses, and first_divergence and unexplained where a layer or a model diverges (see the module
    docstring); what fails with nothing named is said by judge.said_why."""
    if dropout_probe(check, choice, result):
        return
    overflow_probe(check, choice, result)
    if all(r.ok for r in result.rows):
        return
    if check.entry.hooked and check.is_module:
        first_divergence(check, choice, result, scan(check, choice, capture(check, choice)))
    else:
        component_variants(check, choice, result)
