"""Naming the mistake: probes a plain comparison cannot see (dropout in evaluation mode, a softmax without the max
subtraction), then the catalogue's variants (matchers.py) that reproduce the user's output to float64 precision: a
component's on its own probe; a layer's or a model's at its first divergent submodule. Forward hooks on the user's
submodules, each matched (through the weight map) to a reference unit, judge each unit in situ (the reference unit
run on the inputs the user's parent gave the submodule); the first that leaves the bar is the first divergence."""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from numpy_transformer import model as M
from numpy_transformer.attention import rope_frequencies

from . import calling as C
from . import dataflow as DF
from . import reference as R
from . import variants as VR
from .dataflow import DIVS, MULS, VIEWS, hooked, root, unvmapped, walk
from .diagnosis import MATCH, Diagnosis, _error, departs
from .mapping import pair_order
from .matchers import match, match_attention, match_embedding, match_unit
from .probes import keep_mask
from .running import Call
from .session import copy_of, probe_of, run_user
from .unsupported import batch_attended, differs, score_terms
from .wiring import rewired

PROJECTIONS = (
    "q_proj", "k_proj", "v_proj", "out_proj", "linear1", "linear2", "gate", "router", "experts", "q_b_proj",
    "kv_a_proj", "kv_b_proj",
)  # fmt: skip
CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)  # never called: a module above runs


def unit_of(ref: str) -> str:
    """The reference unit (or table) prefix of a reference tensor name: a projection's block, else its owner."""
    base = ref.rpartition(".")[0]
    block, _, last = base.rpartition(".")
    return block if last in PROJECTIONS else base


def _lca(paths: list) -> str:
    """The deepest module path holding all of `paths` (commonprefix compares the lists of names item by item)."""
    return ".".join(os.path.commonprefix([p.split(".") if p else [] for p in paths]))


def _called(owner: str, modules: dict) -> str:
    """`owner`, or the nearest module above it that runs (a container of modules or parameters is never called)."""
    while owner and isinstance(modules.get(owner), CONTAINERS):
        owner = owner.rpartition(".")[0]
    return owner


def _inside(path: str, owner: str) -> bool:
    return owner == "" or path == owner or path.startswith(owner + ".")


def _modules(check) -> dict:
    return dict(check.user.named_modules()) if check.is_module else {}


def _held(links, check=None) -> list:
    """(reference tensor name, the user's module path holding it) of each tensor of the weight map: its module's,
    or as the recorded flow of `check` reads it, the module whose code reads it where its own is a container (a
    ParameterList handed to torch.func.functional_call) or it is linked again (tied across reference layers,
    MP.ties) and as many modules read it: its n-th link held by the n-th of them (a layer is the module that runs,
    not where its Parameter objects were made: ALBERT's layers sharing layer 0's weights), unless that module holds
    it (Flax's tree, read by the model's own code: the container stands)."""
    modules, flow = (_modules(check), check.flow) if check is not None else ({}, None)
    seen: dict = {}
    held = []
    for link in links:
        n = seen[link.user] = seen.get(link.user, -1) + 1
        count, path = sum(k.user == link.user for k in links), link.user.rpartition(".")[0]
        if flow is not None and (count > 1 or isinstance(modules.get(path), CONTAINERS)):
            readers = _readers(flow, link.user)
            path = readers[n] if len(readers) == count and not _inside(path, readers[n]) else path
        held += [(ref, path) for ref, _ in link.parts]
    return held


def _readers(flow, name: str) -> list:
    """The module paths whose code reads the parameter `name` in `flow`, in the order they first do."""
    nodes = [n for n in flow.nodes if n.param == name]
    return list(dict.fromkeys(c.module for n in nodes for c in n.children))


def hook_targets(check, links) -> dict:
    """reference unit (or layer) prefix -> the user's module path that computes exactly it, for the units that
    have one: the deepest module that runs holding all its parameters and none of another unit's; else an
    attention's output projection (BERT's attention.output.dense beside the norm), else the container holding the
    attention's parameters alone."""
    modules, paths = _modules(check), {}
    for ref, path in _held(links, check):
        parts = unit_of(ref).split(".")
        layers = [".".join(parts[: i + 2]) for i, part in enumerate(parts[:-1]) if part == "layers"]
        for unit in [".".join(parts), *layers]:  # the unit, and the layers holding it
            paths.setdefault(unit, set()).add(path)
    targets = {}
    for unit, own in paths.items():
        owner = _called(_lca(sorted(own)), modules)
        others = [p for u, ps in paths.items() if not _inside(u, unit) and not _inside(unit, u) for p in ps]
        if not any(_inside(p, owner) for p in others):
            targets[unit] = owner
    for unit, path in _out_projections(links, check).items():
        if unit not in targets and isinstance(modules.get(path), nn.Linear):
            targets[unit] = path
    for unit, own in paths.items():  # an attention in a container no code calls (Flax's tree): capture reads the flow
        others = [p for u, ps in paths.items() if not _inside(u, unit) and not _inside(unit, u) for p in ps]
        if unit.endswith("_attn") and unit not in targets and not any(_inside(p, _lca(sorted(own))) for p in others):
            targets[unit] = _lca(sorted(own))
    return targets


def _out_projections(links, check=None) -> dict:
    """attention unit -> the user's module path of its output projection."""
    return {unit_of(ref): path for ref, path in _held(links, check) if ref.split(".")[-2:-1] == ["out_proj"]}


def attention_place(links, unit: str, target: str, check=None) -> str:
    """Where an attention unit's divergence is named: its hooked module, or where that is its output projection
    (BERT's attention.output holds the dense layer and the LayerNorm) the module holding its q, k and v projections
    (BERT's attention.self), or where that holds another unit's too (PaLM's, with the feed-forward) the one around
    it and the output projection. A projection other attentions read too (every layer's keys and values projected
    once, sliced per layer) is none's: the place is around the rest."""
    if _out_projections(links, check).get(unit) != target:
        return target
    held = _held(links, check)
    qkv = [path for ref, path in held if unit_of(ref) == unit and ref.split(".")[-2] in PROJECTIONS[:3]]
    others = {path for ref, path in held if unit_of(ref) != unit and unit_of(ref).endswith("_attn")}
    qkv = [path for path in qkv if path not in others] or qkv
    shared = {path for ref, path in held if unit_of(ref) != unit} & set(qkv)
    if len(set(qkv)) == 1 and not shared:  # one Linear holds q, k and v (vit-pytorch's to_qkv): the module around
        return _lca(qkv + [target]) or qkv[0]  # it and the output projection, where that is not the whole module
    return _lca(qkv + [target] * bool(shared)) or target


def capture(check, choice, dtype=np.float64) -> dict:
    """Run the user's copy in `dtype` once with forward hooks on the modules hook_targets finds: unit -> its Call;
    torch.vmap run as the loop it means (a part called on one sequence at a time: its calls stacked, `batched`)."""
    modules = dict(copy_of(check, choice.layout, dtype).named_modules())
    targets = hook_targets(check, choice.layout.links)
    calls: dict = {}

    def keep(key, module, *call) -> None:
        calls.setdefault(key, []).append(
            Call(module, *tree_map(lambda t: t.detach().clone() if torch.is_tensor(t) else t, call))
        )

    with hooked([(u, modules[p]) for u, p in targets.items() if p in modules], keep), unvmapped():
        run_user(check, choice.layout, choice.caller, dtype)
    B, T = next(iter(choice.probe.ids.values())).shape if choice.probe.ids else (0, 0)
    norms = {s.unit for s in _stages(check, choice) if s.kind == "norm"}
    uncalled = {u: p for u, p in targets.items() if u not in calls and p in modules}
    uncalled = {u: p for u, p in uncalled.items() if isinstance(modules[p], CONTAINERS) or u in norms}
    if uncalled:  # containers no code calls (Flax's params tree), norms whose parameters another module's code reads
        flow = DF.record(lambda: run_user(check, choice.layout, choice.caller, dtype), modules[""])
        read = [(u, (_norm_call if u in norms else _attention_call)(flow, p, modules[p])) for u, p in uncalled.items()]
        calls |= {u: [c] for u, c in read if c is not None}
    return {u: batched(c, B, T, choice.caller.batch_first) for u, c in calls.items()}


def _norm_call(flow, path: str, module) -> Call | None:
    """The Call of a norm whose module never runs (its weight and bias read by its parent's own code): its output
    the last op reading its parameters (the bias added); its input left to the reference's (situated)."""
    out = next((n for n in reversed(flow.nodes) if any(_inside(DF.root(p).param or "", path) for p in n.parents)), None)
    if out is None or out.index not in flow.values:
        return None
    return Call(module, (), {}, flow.values[out.index])


def _attention_call(flow, path: str, module) -> Call | None:
    """The Call of the attention whose weights sit in the container at `path`, as the recorded forward ran it: its
    input the tensor its query projection reads, its output its output projection's (plus the bias added to it)."""
    held = {id(a): _lca([w.rpartition(".")[0] for w in a.q + a.k + a.v + a.out]) for a in flow.attentions}
    mine = next((a for a in flow.attentions if a.out_node is not None and held[id(a)] == path), None)
    if mine is None or not mine.q:
        return None
    read = next((n for n in flow.nodes if n.op in DF.PRODUCTS and DF.projection(n) == mine.q[0]), None)
    given = [p for p in read.parents if DF.weight_of(p) != mine.q[0]] if read is not None else []
    out = mine.out_node
    bias = [
        c for c in out.children if c.op in DF.ADDS and any(_inside(DF.root(p).param or "", path) for p in c.parents)
    ]
    out = bias[0] if bias else out
    if not given or given[0].index not in flow.values or out.index not in flow.values:
        return None
    return Call(module, (flow.values[given[0].index],), {}, flow.values[out.index])


def batched(calls: list, B: int, T: int, batch_first: bool) -> Call:
    """A part's calls as one call on the batch: a flat request's float rows (N, ...) as (B, T, ...) (or (T, B, ...)),
    where it ran once on the batch packed (N = B T: SGLang's) or once per sequence (B calls, N = T: vLLM's, stacked);
    else its first call (a part run again on other rows, as ALBERT's layers, is judged on its first)."""
    trees = [tree_flatten((c.args, c.kwargs, c.output)) for c in calls]
    flat = [t for leaves, _ in trees for t in leaves if _rows(t)]
    if B < 2 or not flat or any(t.shape[0] != flat[0].shape[0] for t in flat):
        return calls[0]
    shape = (B, T) if batch_first else (T, B)
    if len(calls) == 1 and flat[0].shape[0] == B * T:
        leaves = [t.reshape(*shape, *t.shape[1:]) if _rows(t) else t for t in trees[0][0]]
    elif len(calls) == B and flat[0].shape[0] == T and all(spec == trees[0][1] for _, spec in trees):
        leaves = [
            torch.stack(ts, dim=1 - batch_first) if _rows(ts[0]) else ts[0]
            for ts in zip(*(t for t, _ in trees), strict=True)
        ]
    else:
        return calls[0]
    return Call(calls[0].module, *tree_unflatten(leaves, trees[0][1]))


def _rows(t) -> bool:
    """A float tensor of rows (N, features): a flat request's."""
    return torch.is_tensor(t) and t.is_floating_point() and t.ndim == 2


def situated(stage: R.Stage, call: Call | None, batch_first: bool) -> R.Stage:
    """`stage` in situ: its float inputs those the user's parent gave the part (`call`), in order and by shape (a
    self-attention's key input its query), its output the reference part's on them; as the reference ran it where
    the inputs cannot be read (an embedding, a part hooked at its output projection, no input of the first's shape)."""
    if call is None or stage.rerun is None or type(call.module) is nn.Linear:
        return stage
    tensors = [t for t in call.inputs if isinstance(t, torch.Tensor) and t.is_floating_point() and t.ndim == 3]
    floats = (C.as_numpy(t if batch_first else t.transpose(0, 1)) for t in tensors)
    given: dict = {}  # id of a reference input -> the user's in its place (None: none of its shape)
    for i, ref in enumerate(stage.inputs):
        if isinstance(ref, np.ndarray) and ref.dtype.kind == "f" and ref.ndim == 3 and id(ref) not in given:
            turned = (C.batch_first(f, ref.shape) for f in floats)  # a part given time-first inputs (fairseq's)
            given[id(ref)] = next((f for f in turned if f.shape == ref.shape), None)
            if given[id(ref)] is None and i == 0:
                return stage
    inputs = [ref if given.get(id(ref)) is None else given[id(ref)] for ref in stage.inputs]
    try:
        with np.errstate(all="ignore"):
            return dataclasses.replace(stage, inputs=tuple(inputs), output=stage.rerun(*inputs))
    except (ValueError, IndexError):  # the part's inputs read otherwise than the reference's
        return stage


# Below this a part's divergence may be float32 rounding (a constant made in float32 in a float64 model); a part
# judged in situ after it that diverges by more is the mistake (the rounding before it is not its own).
ROUNDING = 1e-5


@dataclass(frozen=True)
class Divergence:
    """Where a run of the user's module first leaves the reference: the number of stages that agree before it, the
    stage in situ (None: every hooked stage agrees), the user's output there and its relative error."""

    agree: int
    stage: R.Stage | None = None
    user: np.ndarray | None = None
    error: float = 0.0
    said: str | None = None  # what the reference has no pair for, read at the stage (_fused)
    earlier: Divergence | None = None  # one of a rounding's size before it, that gave way to it (scan)


def _stages(check, choice) -> list:
    """The reference's stages on the probe under `choice` (R.stages), computed once."""
    key = ("stages", repr(choice.cfg), id(choice.probe))
    if key not in check.cache:
        check.cache[key] = R.stages(check.entry, check.params, choice.probe, choice.cfg)
    return check.cache[key]


def scan(check, choice, captured) -> Divergence:
    """The Divergence of the user's run (`captured`) under `choice`, each part judged in situ (situated); one of a
    rounding's size gives way to a later part's larger one (ROUNDING)."""
    done, small, batch_first, adds = 0, None, choice.caller.batch_first, False
    for chained in _stages(check, choice):
        embedding = chained.kind == "embedding"  # the user's embeddings: its first layer's input
        call = captured.get(chained.unit.split(".")[0] + ".layers.0" if embedding else chained.unit)
        call, said = _fused(call, chained)
        if said:
            return Divergence(done, chained, said=said)
        seen = () if call is None else (call.output,)  # an unflattened graph's layer takes its sizes first (graphs)
        seen = [t for t in call.inputs if torch.is_tensor(t)][:1] if embedding and call else seen
        if not seen:
            continue
        user = C.as_numpy(seen[0])
        user = C.batch_first(user if batch_first or user.ndim < 3 else user.transpose(1, 0, 2), chained.output.shape)
        if user.shape != chained.output.shape:
            continue
        stage = situated(chained, call, batch_first)
        with np.errstate(all="ignore"):
            error = match(user, stage.output, stage.valid)
            if error > ROUNDING and stage.kind == "layer" and isinstance(stage.inputs[0], np.ndarray):
                whole = user + stage.inputs[0]  # a block returning its sublayers alone: its parent adds x (PaLM's)
                if adds or match(whole, stage.output, stage.valid) <= ROUNDING:
                    adds, user, error = True, whole, match(whole, stage.output, stage.valid)
        if error > ROUNDING and (small is None or stage is not chained):
            return Divergence(done, stage, user, error, earlier=small)
        if error > 1e-10 and small is None:
            small = Divergence(done, stage, user, error)
        done += small is None
    return small or Divergence(done)


def _fused(call: Call | None, stage: R.Stage) -> tuple:
    """(call, None), or where a norm or a layer hands on the stream as a (hidden, residual) pair, the reference's
    part one stream (vLLM's fused add-norm: norm(x, r) -> (normed(x + r), x + r)), the call read with each pair
    summed (a norm's output its first); a fused norm handing on other than the sum: (None, what it does)."""
    streams = [r for r in stage.inputs if isinstance(r, np.ndarray) and r.dtype.kind == "f" and r.ndim == 3]
    if call is None or stage.kind not in ("norm", "layer") or len(streams) != 1:
        return call, None
    ins, outs = _pair(call.inputs), _pair(call.output if isinstance(call.output, tuple) else ())
    if outs is None:  # a pair taken alone (modded-nanogpt's blocks take x and x0): no residual handed on
        return call, None
    if stage.kind == "norm" and ins:
        handed = "its residual input, before the add" if torch.equal(outs[1], ins[1]) else "another tensor"
        if not torch.allclose(outs[1], ins[0] + ins[1], rtol=1e-9, atol=1e-12):
            return None, f"the norm adds the residual to its input but hands on {handed}, not their sum (the stream)"
    output = outs[0] + outs[1] if stage.kind == "layer" else call.output
    return Call(call.module, (ins[0] + ins[1],) if ins else call.args, {} if ins else call.kwargs, output), None


def _pair(tensors) -> tuple | None:
    """The two float tensors of one shape (B, T, D) in `tensors`, where there are exactly two such."""
    found = [t for t in tensors if torch.is_tensor(t) and t.is_floating_point() and t.ndim == 3]
    return (found[0], found[1]) if len(found) == 2 and found[0].shape == found[1].shape else None


def first_divergence(check, choice, result, diverged: Divergence) -> None:
    """The first reference stage whose user output leaves the bar (`diverged`), and the variants that explain it."""
    if diverged.stage is None:
        every = diverged.agree == len(check.cache[("stages", repr(choice.cfg), id(choice.probe))])
        output = any(not r.ok for r in result.rows if r.name == "output")  # not the gradients alone
        after = _after_parts(check, choice) if every and output else None
        if after:  # an op the reference has no pair for, past every part it has (unsupported.explain may say more)
            result.unsupported = differs(*after)
        return
    if diverged.said:
        where = hook_targets(check, choice.layout.links)[diverged.stage.unit] or "(the module)"
        result.first_divergence, result.unsupported = where, differs(where, diverged.said)
        return
    where, found = explained(check, choice, diverged)
    if not found and diverged.earlier is not None:  # a smaller departure before it that a variant reproduces: first
        where, found = next((e for e in [explained(check, choice, diverged.earlier)] if e[1]), (where, found))
    # a mistake placed more precisely than its unit (the module that keeps or scales a table) is named there
    result.first_divergence = found[-1].where if found else where
    result.diagnoses += found
    own = None if found else _own_eps(check, choice, diverged, where)
    result.unsupported = None if found else own or _rewired(check, choice, diverged, where)
    result.unsupported = result.unsupported or (None if found else _other_angles(check, choice, diverged, where))
    result.unsupported = result.unsupported or (None if found else _added_to_qk(check, choice, diverged, where))
    if not found and not result.unsupported:
        how = departs(diverged.user, diverged.stage.output, diverged.stage.valid, choice.cfg.n_heads)
        result.unexplained = (
            f"{where} (reference {diverged.stage.unit or check.level}) diverges with relative error "
            f"{diverged.error:.2e}{f' ({how})' if how else ''}; not expressible by the config and no "
            "catalogue variant reproduces it"
        )
        if diverged.error < 1e-5:  # float32's rounding, in a float64 run
            result.unexplained += (
                "; an error this small is typically float32 rounding: the submodule may compute in float32 inside "
                "a float64 model (an upcast such as .float(), or transformers' RMSNorm and rotary tables)"
            )


def _after_parts(check, choice) -> tuple[str, str] | None:
    """Every hooked part agrees in situ, the output does not: (the module that runs the first, the ops the user's
    forward computes after the last part, read back from its output; a product by a number said with it and what it
    multiplies); None where there are none."""
    paths, flow = set(hook_targets(check, choice.layout.links).values()), check.flow
    ends = [c.output.index for c in flow.calls if c.path in paths and c.output] if flow and flow.nodes else []
    if not ends:
        return None
    after = [n for n in walk([flow.nodes[-1]], lambda n: [p for p in n.parents if p.index > max(ends)])]
    ops = sorted((n for n in after if n.op not in VIEWS | {"input", "param"}), key=lambda n: n.index)
    made = {c.output.index: c.path for c in flow.calls if c.output}
    said = []
    for n in ops:
        at, by = f"{n.op} in {n.module or '(the module)'}", DF.scaled_by(n)
        of = next((f"{made[p.index]}'s output" for p in n.parents if p.index in made), "a tensor")
        said.append(at if by is None else f"{of} is {by} ({at})")
    if not said:
        return None
    return ops[0].module, f"every part agrees in situ, the output departs after the last: {', '.join(said)}"


def _rewired(check, choice, diverged: Divergence, where: str) -> str | None:
    """A layer whose parts each agree in situ, wired otherwise than the reference's (wiring.py): said at the layer."""
    cfg, stage = choice.cfg, diverged.stage
    if stage.kind != "layer" or cfg.parallel_residual or cfg.sandwich_norm or not where:
        return None
    said = rewired(check.flow, where, stage.unit, choice.layout.links, cfg.norm_first)
    return differs(where, said) if said else None


def _own_eps(check, choice, diverged: Divergence, where: str) -> str | None:
    """A norm that computes the reference's norm at an eps of its own (the config holds one layer_norm_eps, the
    most common): the diverged norm, or an attention's q/k RMSNorms (no stage of their own: _own_qk_eps), the stage
    recomputed at their own eps and matched: "differs at <the norm>: ... eps ..."; None for any other divergence."""
    stage, cfg, eps = diverged.stage, choice.cfg, check.model.norm_eps
    if stage is None:
        return None
    if stage.kind == "attention":
        at, redone = _own_qk_eps(check, choice, stage)
    elif stage.kind == "norm" and _other_eps(eps.get(where), cfg):
        params, x, at = M.sub(check.params, stage.unit), stage.inputs[0], where
        weight, bias, own = params["weight"], params.get("bias", 0.0), eps[where]
        redone = VR.rms_norm(x, weight, own) if cfg.norm == "rms" else VR.layer_norm(x, weight, bias, own)
    else:
        return None
    if redone is None or match(diverged.user, redone, stage.valid) > MATCH:
        return None
    return differs(at, f"the norm takes eps {eps[at]:g} where the model's other norms take {cfg.layer_norm_eps:g} "
                   "(the reference has one layer_norm_eps for every norm)")  # fmt: skip


def _other_eps(eps: float | None, cfg) -> bool:
    return eps is not None and not math.isclose(eps, cfg.layer_norm_eps, rel_tol=1e-9)


def _own_qk_eps(check, choice, attention: R.Stage) -> tuple:
    """(the user's first q or k norm of `attention` whose own eps is not the config's, the reference's attention
    run with each q/k RMSNorm at its module's own eps); ("", None) where none has an eps of its own."""
    params, targets, eps = R.unit_params(check.params, attention.unit), hook_targets(check, choice.layout.links), {}
    for role in (r for r in "qk" if f"{r}_norm.weight" in params):
        at = targets.get(f"{attention.unit}.{role}_norm", "")
        eps[role] = (at, check.model.norm_eps.get(at) or choice.cfg.layer_norm_eps)
    odd = [at for at, e in eps.values() if _other_eps(e, choice.cfg)]
    if not odd:
        return "", None
    heads = {k: v for k, v in _attention_knobs(check, choice, attention).items() if k in HEAD_KNOBS}
    norms = {r: lambda x, r=r: VR.rms_norm(x, params[f"{r}_norm.weight"], eps[r][1]) for r in eps}
    query, kv, keep = attention.inputs
    return odd[0], VR.multi_head_attention(params, query, kv, kv, choice.cfg.n_heads, keep, norms=norms, **heads)


def _other_angles(check, choice, diverged: Divergence, where: str) -> str | None:
    """An attention whose forward turns q and k by the cos and sin (or polar) of angles t w_i (the recorded table, in
    halves or pairs; position t from 0) at frequencies w none of the reference's RoPE under the config (its base,
    scaling and max_len, for a sequence as long as the table or the recorded queries) in any order: said at `where`
    with both, each as base^(-2i/R) times or divided by what; None for any other divergence."""
    flow, cfg, unit = check.flow, choice.cfg, diverged.stage.unit if diverged.stage else ""
    held = [a for a in (flow.attentions if flow else []) if f"{a.module}.".startswith(f"{where}.") or not where]
    if cfg.positional != "rope" or not held or not held[0].turned or not cfg.layer_uses_rope(R.layer_of(unit)):
        return None
    turn, out = held[0].turned[0], held[0].out_node
    value = flow.values.get(turn.parents[-1].index if turn.parents else -1)  # polar(abs, angle), cos(angle)
    if not isinstance(value, torch.Tensor) or value.ndim < 2 or value.shape[-2] < 3 or value.is_complex():
        return None
    angles = value.detach().double().cpu().numpy().reshape(-1, *value.shape[-2:])[0]  # (T, columns)
    half = angles.shape[-1] // 2  # one column per frequency: halves (cat) or pairs (repeat_interleave)
    if np.array_equal(angles[:, :half], angles[:, half:]):
        angles = angles[:, :half]
    elif np.array_equal(angles[:, ::2], angles[:, 1::2]):
        angles = angles[:, ::2]
    T, w = len(angles), angles[1]
    if not np.allclose(angles, np.arange(T)[:, None] * w, rtol=1e-9, atol=1e-12) or not w.any():
        return None
    theta, scaling, R_ = cfg.layer_rope_theta(R.layer_of(unit)), cfg.layer_rope_scaling(R.layer_of(unit)), 2 * len(w)
    lengths = list(dict.fromkeys([int(out.shape[-2])] * (out is not None and len(out.shape) > 2) + [T]))
    refs = [rope_frequencies(R_, theta, scaling, cfg.max_len, L)[0] for L in lengths]
    if any(np.allclose(np.sort(w), np.sort(ref), rtol=1e-9) for ref in refs):
        return None
    plain, scaled = rope_frequencies(R_, theta)[0], f"{scaling.rope_type}-scaled " if scaling else ""
    return differs(
        where,
        f"the queries turned by the {turn.op} of angles t w_i, w = ({_listed(w)}) = {theta:g}^(-2i/{R_}) "
        f"{_relation(w / plain)}; the reference's {scaled}RoPE (max_len {cfg.max_len}), for a sequence of "
        f"{lengths[0]}, turns at w = ({_listed(refs[0])}) = {theta:g}^(-2i/{R_}) {_relation(refs[0] / plain)}",
    )


def _added_to_qk(check, choice, diverged: Divergence, where: str) -> str | None:
    """An attention whose queries and keys read its values' input plus a term (DETR's q = k = src + pos, the value
    src), where the reference's reads one input for all three: said at the attention, the term by the keyword the
    example's call passes it as (else its parameter's name); None for any other divergence."""
    flow = check.flow if diverged.stage is not None and diverged.stage.kind == "attention" else None
    call = next((c for c in flow.calls if c.path == where), None) if flow else None
    q, k, v = (*call.inputs, None, None, None)[:3] if call else (None,) * 3
    if q is None or q is not k or v is None or q.op not in DF.ADDS or v not in q.parents:
        return None
    term = next((p for p in q.parents if p is not v), None)
    name = root(term).param if term is not None else _given_as(choice.caller, flow.values, q, v)
    said = f"the queries and keys read the values' input + {name or 'a tensor the forward is given'}"
    return differs(where, f"{said} ({q.op} in {q.module or 'the module'}), the values that input alone")


def _given_as(caller, values: dict, q, v) -> str | None:
    """The keyword of the example's call whose tensor `q` adds to `v`: the one float tensor of q's shape it passes
    that is their recorded values' difference (where v's value is recorded: not the module's own input)."""
    if caller.template is None:
        return None
    made = {n: g(torch.float64, "cpu") if kind == "made" else g for n, (kind, g) in caller.template[1].items()}
    found = [n for n, g in made.items() if torch.is_tensor(g) and g.is_floating_point() and g.shape == q.shape]
    if q.index in values and v.index in values:
        added = (values[q.index] - values[v.index]).double().cpu()
        found = [n for n in found if torch.allclose(made[n].double(), added, rtol=1e-6, atol=1e-6)]
    return found[0] if len(found) == 1 else None


def _listed(values: np.ndarray) -> str:
    return ", ".join(f"{v:.4g}" for v in values)


def _relation(ratios: np.ndarray) -> str:
    """How frequencies relate to plain RoPE's at their `ratios`: as they are, times or divided by one number, or
    divided by one each."""
    if np.allclose(ratios, 1, rtol=1e-9):
        return "as they are"
    if np.allclose(ratios, ratios[0], rtol=1e-9):
        return f"times {ratios[0]:.4g}" if ratios[0] > 1 else f"divided by {1 / ratios[0]:.4g}"
    return f"divided by ({_listed(1 / ratios)})"


def _at_embedding(check, choice, stage, user_out) -> tuple[str, list]:
    """(where, diagnoses) at a stack's embeddings: the scale (named at the table's own wrapper) and the position
    table (named at the module that keeps the fixed table)."""
    cfg, stack = choice.cfg, stage.unit.split(".")[0]
    token = f"{stack}.token_embedding.weight"
    users = [link.user for link in choice.layout.links if token in dict(link.parts)]
    where = next((u.rpartition(".")[0] or u for u in users), f"the {stack}'s embeddings")
    positions = None
    if cfg.positional == "sinusoidal":
        positions = VR.sinusoid_tables(cfg.max_len, cfg.d_model)[cfg.sinusoid_layout]
    elif cfg.positional == "learned":
        positions = check.params[f"{stack}.position_embedding.weight"]
    table = check.params.get(token, check.params.get("decoder.token_embedding.weight"))
    ids, scaled = stage.inputs[0], cfg.scale_embeddings
    found = match_embedding(
        user_out, ids, table, positions, cfg.d_model, where, stage.valid, scaled, cfg.sinusoid_layout
    )
    tables = [name.rpartition(".")[0] or "(the module)" for name in check.model.overwrite]
    for d in found:
        if d.id == "positions.wrong_frequencies" and tables:
            d.where = max(tables, key=lambda t: len(_lca([t, where])))
        elif d.id.startswith("embedding.") and check.is_module:
            d.where = _multiplied_at(check.flow, users) or _scaling_module(check, where)
    if not found and stack == "decoder" and not cfg.scale_embeddings and "encoder" in check.entry.stacks:
        found = _encoder_unscaled(check, choice, stage, user_out, table, positions)
    return where, found


def _encoder_unscaled(check, choice, stage, user_out, table, positions) -> list:
    """embedding.missing_scale where the decoder scales by sqrt(d_model) and the encoder, judged first and agreeing
    unscaled, does not (Marian's encoder with embed_scale 1 on a shared table): named at the encoder's module."""
    ids = stage.inputs[0]
    scaled = math.sqrt(choice.cfg.d_model) * table[ids] + (0.0 if positions is None else positions[: ids.shape[1]])
    error = match(user_out, scaled, stage.valid)
    if error > MATCH:
        return []
    encoder = [link.user.rpartition(".")[0] for link in choice.layout.links if link.parts[0][0].startswith("encoder.")]
    message = "the encoder's token embeddings are not multiplied by sqrt(d_model); the decoder's are"
    where = _called(_lca(encoder), _modules(check)) or "the encoder's embeddings"
    return [Diagnosis("embedding.missing_scale", message, where, error)]


def explained(check, choice, diverged: Divergence) -> tuple[str, list]:
    """(where, diagnoses) at the stage where the user's run diverged: at the embeddings, or at a unit's hooked module
    the catalogue's variants of that unit run on the reference's inputs to it."""
    stage, user_out, links = diverged.stage, diverged.user, choice.layout.links
    if stage.kind == "embedding":
        return _at_embedding(check, choice, stage, user_out)
    where = hook_targets(check, links)[stage.unit] or "(the module)"
    if stage.kind == "attention":
        where = attention_place(links, stage.unit, where, check)
        return where, _attention_variants(check, choice, stage, user_out, where, stage.valid)
    if stage.kind == "layer":
        return where, _in_layer(check, choice, stage, user_out, where)
    return where, _unit_variants(check, choice, stage, user_out, where, stage.valid)


def _unit_variants(check, choice, stage: R.Stage, user_out, where: str, valid, through=None) -> list:
    """match_unit at a reference norm or gated feed-forward stage (a plain feed-forward has no catalogue)."""
    cfg, kind = choice.cfg, stage.kind
    if kind not in ("norm", "ffn") or (kind == "ffn" and not cfg.gated_ffn):
        return []
    if kind == "ffn" and f"{stage.unit}.router.weight" in check.params:
        return _expert_variants(check, choice, stage, user_out, where, valid)
    name = "gated_feed_forward" if kind == "ffn" else "rms_norm" if cfg.norm == "rms" else "layer_norm"
    eps = check.model.norm_eps.get(where, None) or cfg.layer_norm_eps
    params = M.sub(check.params, stage.unit)
    return match_unit(name, user_out, stage.inputs[0], params, eps, cfg.activation, where, valid, through)


def _expert_variants(check, choice, stage: R.Stage, user_out, where: str, valid) -> list:
    """A mixture's experts one at a time (Mixtral's, Qwen3-MoE's): expert e's gated-block variants on the rows the
    reference routes to it, y + sum_j [S_j = e] g_j (FFN'_e(x) - FFN_e(x)), named at that expert's module (the
    experts' where they are stacked in one tensor)."""
    params, x = M.sub(check.params, stage.unit), stage.inputs[0]
    y, cache = M.ffn_forward(params, x, choice.cfg, None, "ffn")
    if cache.kind not in ("moe", "deepseek_moe", "gpt_oss_moe"):
        return []
    top_k = cache.block.router if cache.kind == "deepseek_moe" else cache.block.top_k  # DeepSeek's: its gates the
    x2, S, g = (  # experts'
        x.reshape(-1, x.shape[-1]),
        top_k.selected,
        cache.block.experts.gates if cache.kind == "deepseek_moe" else top_k.gates,
    )
    E, D, activation = len(params["experts.gate_up_proj"]), y.shape[-1], _expert_activation(choice.cfg)
    shared = {
        n: params[f"shared.{n}"] for n in ("gate.weight", "linear1.weight", "linear2.weight") if f"shared.{n}" in params
    }
    for e in range(E + bool(shared)):  # the shared experts last: every row, weighed 1
        rows, slot = np.nonzero(S == e) if e < E else (np.arange(len(x2)), None)
        if not len(rows):
            continue
        own = _expert(params, e, choice.cfg) if slot is not None else shared
        ref = VR.gated_feed_forward(own, x2[rows], activation)

        def through(expert, rows=rows, slot=slot, ref=ref):
            out = y.reshape(-1, D).copy()
            np.add.at(out, rows, (1 if slot is None else g[rows, slot, None]) * (expert(x2[rows]) - ref))
            return out.reshape(y.shape)

        at, own_module = _expert_at(check, choice, stage.unit, e, where)
        found = match_unit("gated_feed_forward", user_out, x2[rows], own, 0, activation, at, valid, through)
        if found:
            return [dataclasses.replace(d, message=d.message + f" (expert {e})" * (not own_module)) for d in found]
    return _every_expert(check, choice, stage, user_out, where, valid, (x2, S, g, y))


def _every_expert(check, choice, stage: R.Stage, user_out, where: str, valid, run: tuple) -> list:
    """The routed experts' gated-block variants all at once (one forward for every expert, as transformers' stacked
    experts run): y + sum_e sum_j [S_j = e] g_j (FFN'_e(x) - FFN_e(x)), named at the experts' module."""
    (x2, S, g, y), params = run, M.sub(check.params, stage.unit)
    own: dict = {}
    activation = _expert_activation(choice.cfg)

    def through(expert):
        out = y.reshape(-1, y.shape[-1]).copy()
        for e in range(len(params["experts.gate_up_proj"])):  # `expert` reads `own`, set to expert e's weights
            rows, slot = np.nonzero(S == e)
            own.update(_expert(params, e, choice.cfg))
            ref = VR.gated_feed_forward(own, x2[rows], activation)
            np.add.at(out, rows, g[rows, slot, None] * (expert(x2[rows]) - ref))
        return out.reshape(y.shape)

    at, own_module = _expert_at(check, choice, stage.unit, 0, where)
    found = match_unit(
        "gated_feed_forward", user_out, x2, own, 0, activation, where if own_module else at, valid, through
    )
    return [dataclasses.replace(d, message=d.message + " (every routed expert)") for d in found]


def _expert(params: dict, e: int, cfg) -> dict:
    """Expert e of stacked experts as a gated block of the reference's names: its rows of gate_up_proj (gate first,
    up second), of down_proj; GPT-OSS's (in, out), gate and up interleaved in the columns, with biases and its clamp."""
    gate_up, down = params["experts.gate_up_proj"][e], params["experts.down_proj"][e]
    if cfg.expert_kind != "gpt_oss":
        F = down.shape[-1]
        return {"gate.weight": gate_up[:F], "linear1.weight": gate_up[F:], "linear2.weight": down}
    W, b = gate_up.T, params["experts.gate_up_proj_bias"][e]
    return {"gate.weight": W[::2], "gate.bias": b[::2], "linear1.weight": W[1::2], "linear1.bias": b[1::2],
            "linear2.weight": down.T, "linear2.bias": params["experts.down_proj_bias"][e],
            "limit": cfg.swiglu_limit, "alpha": cfg.swiglu_alpha}  # fmt: skip


def _expert_activation(cfg) -> str:
    """The experts' activation as said: GPT-OSS's clamped a sigmoid(alpha a) ("clamped swish"), else the config's."""
    return "clamped swish" if cfg.expert_kind == "gpt_oss" else cfg.activation


def _expert_at(check, choice, unit: str, e: int, where: str) -> tuple[str, bool]:
    """(the user's module of expert e of the reference's mixture `unit`, whether it is the expert's own): the module
    holding its rows of the experts' weights (and no other's), else (the experts stacked in one tensor, or in one
    tensor each of gate, up and down) the experts', else `where`."""
    F, D, E = (choice.cfg.expert_width, choice.cfg.d_model, choice.cfg.n_experts)
    starts = {f"{unit}.experts.gate_up_proj": {2 * e * F, (2 * e + 1) * F}, f"{unit}.experts.down_proj": {e * D}}
    if choice.cfg.expert_kind == "gpt_oss":  # (in, out) rows: the gate's and up's columns of the same D rows
        starts = {f"{unit}.experts.gate_up_proj": {e * D}, f"{unit}.experts.down_proj": {e * F}}
    users = [k.user for k in choice.layout.links if all(r and r[0] in starts.get(n, ()) for n, r in k.parts)]
    users += [k.user for k in choice.layout.links if e == E and k.parts[0][0].startswith(f"{unit}.shared.")]
    stacked = [k.user for k in choice.layout.links if k.parts[0][0] in starts]
    return _called(_lca([u.rpartition(".")[0] for u in users or stacked]), _modules(check)) or where, bool(users)


def unreached(check, choice) -> list:
    """A note for each mixture whose router (the reference's, under the judge's weights) chooses some expert for no
    compared position of the judge's inputs: that expert's math never ran, so a mistake inside it cannot be seen."""
    if not choice.cfg.n_experts or not check.entry.hooked:
        return []
    notes, targets = [], hook_targets(check, choice.layout.links) if check.is_module else {}
    for stage in (s for s in _stages(check, choice) if s.kind == "ffn" and f"{s.unit}.router.weight" in check.params):
        x = stage.inputs[0]
        block = M.ffn_forward(M.sub(check.params, stage.unit), x, choice.cfg, None, "ffn")[1].block
        chosen = (getattr(block, "top_k", None) or block.router).selected.reshape(*x.shape[:-1], -1)
        valid = stage.valid if stage.valid is not None and stage.valid.shape == x.shape[:-1] else ...
        missing = sorted(set(range(choice.cfg.n_experts)) - set(chosen[valid].flat))
        at = [_expert_at(check, choice, stage.unit, e, targets.get(stage.unit) or stage.unit)[0] for e in missing]
        if missing:
            notes.append(
                f"expert{'s' * (len(missing) > 1)} {', '.join(map(str, missing))} of {_lca(at)} "
                "chosen by the router for no token of the judge's inputs: never run, so a mistake inside cannot be seen"
            )
    return notes


def _attention_variants(check, choice, attention: R.Stage, user_out, where: str, valid, **context) -> list:
    """match_attention at a reference attention stage: its inputs and masks (a decoder's self-attention its causal
    and padding masks, maybe swapped with the cross-attention's), RoPE's knobs where it rotates (and the order the
    map reads q and k rows in, where not the reference's)."""
    query, kv, keep = attention.inputs
    knobs = _attention_knobs(check, choice, attention) | context
    params = R.unit_params(check.params, attention.unit)
    found = match_attention(user_out, params, query, kv, choice.cfg.n_heads, keep, where, valid, **knobs)
    return found or _qk_norm_variants(check, choice, attention, user_out, where, valid, knobs)


def _attention_knobs(check, choice, attention: R.Stage) -> dict:
    """The knobs of the reference's attention stage: its masks, RoPE's and the scores' terms under the config, the
    order the map reads q and k rows in (where not the reference's), an encoder's band of sliding layers."""
    causal = (attention.masks or {}).get("causal", False)
    rope = VR.rope_knobs(choice.cfg, attention.unit.endswith("self_attn"), R.layer_of(attention.unit), causal)
    paired = [pair_order(x.rope_pairs, x.rope_pairs, x.rope_rotary) for x in choice.layout.links if x.rope_pairs]
    knobs = rope | {"order": paired[0] if paired else None} | (attention.masks or {})
    cfg, T = choice.cfg, attention.inputs[0].shape[1]
    if not causal and cfg.layer_types and "sliding_attention" in cfg.layer_types and cfg.sliding_window:
        knobs["band"] = np.abs(np.arange(T)[:, None] - np.arange(T)[None, :]) <= cfg.sliding_window // 2  # probes'
    return knobs


HEAD_KNOBS = ("n_kv", "theta", "rotary", "scaling", "qk_eps", "softcap", "divisor", "alibi", "relative", "order")


def _qk_norm_variants(check, choice, attention: R.Stage, user_out, where: str, valid, knobs: dict) -> list:
    """An attention's q or k RMSNorm (Qwen3's of each head: inside the reference's attention, no stage of its own):
    the rms_norm variants put in its place in the reference attention (in the layer's where `through` is given),
    named at the user's norm module (its eps the module's)."""
    params, (query, kv, keep) = R.unit_params(check.params, attention.unit), attention.inputs
    heads, through = {k: knobs[k] for k in HEAD_KNOBS if k in knobs}, knobs.get("through")
    targets = hook_targets(check, choice.layout.links)
    for role in (r for r in "qk" if f"{r}_norm.weight" in params):
        at = targets.get(f"{attention.unit}.{role}_norm") or where
        eps = check.model.norm_eps.get(at) or heads["qk_eps"]

        def varied(norm, role=role):
            def attend(q, x, _):
                return VR.multi_head_attention(params, q, x, x, choice.cfg.n_heads, keep, norms={role: norm}, **heads)

            return through(attend) if through else attend(query, kv, keep)

        own = M.sub(params, f"{role}_norm")
        found = match_unit("rms_norm", user_out, own["weight"][None], own, eps, "", at, valid, varied)
        if found:
            return found
    return []


def _in_layer(check, choice, stage, user_out, where) -> list:
    """A layer whose attention or feed-forward is no module of its own (inline, or Linears the layer holds): the
    unit's variants put in its place in the reference layer, run on its input in situ, compared on its output."""
    prefix, targets = stage.unit + ".", hook_targets(check, choice.layout.links)
    inner = check.cache.get(("stages", repr(choice.cfg), id(choice.probe)), []) if stage.rerun is not None else []
    for unit in inner:
        if unit.kind not in ("attention", "ffn") or not unit.unit.startswith(prefix) or unit.unit in targets:
            continue  # a module of its own is judged in situ there
        name = unit.unit[len(prefix) :]

        def through(attend, name=name):
            return stage.rerun(*stage.inputs, attend={name: attend})

        variants = _attention_variants if unit.kind == "attention" else _unit_variants
        found = variants(check, choice, unit, user_out, where, stage.valid, through=through)
        if found:
            return found
    return _inline_norms(check, choice, stage, user_out, where, [u for u in inner if u.unit not in targets])


def _inline_norms(check, choice, stage, user_out, where, inner: list) -> list:
    """A layer's norms that are no module of their own (written in its forward): the catalogue's variants of each
    alone in its place, then of every one (one norm written once, used twice), run on the layer's input in situ."""
    prefix = stage.unit + "."
    norms = [u for u in inner if u.kind == "norm" and u.unit.startswith(prefix) and "." not in u.unit[len(prefix) :]]
    for group in [[u] for u in norms] + [norms] * (len(norms) > 1):

        def through(variant, group=group):
            own = {u.unit[len(prefix) :]: M.sub(check.params, u.unit) for u in group}
            return stage.rerun(*stage.inputs, attend={n: lambda h, p=p: variant(h, p) for n, p in own.items()})

        found = _unit_variants(check, choice, group[0], user_out, where, stage.valid, through=through)
        if found:
            return found
    return []


def latest_divergence(check, choice):
    """Of the weight maps, callers the module ran under and configs, the Choice whose first divergence comes latest
    (the conventions are right everywhere before the one mistake); of a tie, the first a variant explains."""
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
    searched: set = set()

    def explains(trial, found) -> bool:
        key = _searched_on(trial, found)
        if found.stage is None or key in searched:  # a search of the same inputs explained nothing before
            return False
        searched.add(key)
        return bool(explained(check, trial, found)[1])

    return next((trial for *_, trial, found in tied if explains(trial, found)), tied[0][3])


def _searched_on(trial, found) -> tuple:
    """What the catalogue's search at an attention divergence reads: the weight map, the caller, the stage's inputs,
    the user's output there and the config but for what acts only outside the attention (the activation; the
    embeddings' scale, already in the inputs). Tied trials that differ in those alone search the same (a mistake in
    the first attention ties every activation); other stages are searched for each trial."""
    stage = found.stage
    if stage is None or stage.kind != "attention":
        return (id(trial),)
    cfg = {k: v for k, v in vars(trial.cfg).items() if k not in ("activation", "scale_embeddings")}
    arrays = [*stage.inputs, found.user]
    held = tuple(a.tobytes() if isinstance(a, np.ndarray) else repr(a) for a in arrays)
    return (id(trial.layout), id(trial.caller), id(trial.probe), stage.unit, repr(cfg), held)


def _multiplied_at(flow, tables: list) -> str:
    """The submodule, not the module itself, that last multiplies the lookup of one of `tables` by a number (through
    views and dropout): where a second scale is applied (Gemma 3's model forward after its scaled lookup); "" where
    none, or the module itself does."""
    lookups = [n for n in flow.nodes if n.op == "embedding" and root(n.parents[-1]).param in tables] if flow else []
    onward = walk(lookups, lambda n: n.children if n in lookups or n.op in VIEWS | {"dropout"} or _scales(n) else [])
    last = max((n for n in onward if _scales(n)), key=lambda n: n.index, default=None)
    return last.module if last is not None else ""


def _scales(node) -> bool:
    """A product of `node`'s one recorded operand and a number (a Python one or a tensor made in the forward)."""
    return node.op in MULS | DIVS and len(node.parents) == 1


def _scaling_module(check, path: str) -> str:
    """The module that scales the token table at `path`: the table's nearest wrapper holding no tensor but the
    table (the Annotated Transformer's Embeddings around its nn.Embedding `lut`), else the table's own module."""
    modules = _modules(check)
    if path not in modules:  # a table that is a parameter of the module itself
        return path

    def held(module) -> set:
        return {id(t) for t in (*module.parameters(), *module.buffers())}

    table = held(modules[path])
    while "." in path:
        parent = path.rpartition(".")[0]
        if isinstance(modules[parent], (*CONTAINERS, nn.Sequential)) or held(modules[parent]) != table:
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
        except (TypeError, IndexError):  # no tensor in it: an argument or output nothing random is read from
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
    A component is called on scaled inputs, a layer's or a model's attention submodules again on theirs, scaled."""
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
    targets, D = hook_targets(check, choice.layout.links), check.model.cfg.d_model

    def scaled(t):
        wide = isinstance(t, torch.Tensor) and t.is_floating_point() and t.ndim >= 2 and t.shape[-1] == D
        return t * BIG if wide else t

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
    """The catalogue's variants of a component on its own probe, under the chosen convention, config and weight
    map, else under the first other convention (a mask's kind), config (RoPE's) or map under which one matches."""
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
    """A component's catalogue variants on its probe, by its unit (a layer norm's eps its module's)."""
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
        knobs = VR.rope_knobs(cfg, causal=p.causal) | context
        return match_attention(user, params, f["query"], kv, cfg.n_heads, keep, "", p.valid, **knobs)
    if unit == "embedding":
        table = params["token_embedding.weight"]
        return match_embedding(user, p.ids["ids"], table, None, cfg.d_model, "", scale_expected=cfg.scale_embeddings)
    own = next(iter(check.model.norm_eps.values()), None) if unit == "layer_norm" else None
    return match_unit(
        unit, user, f["x"], params, own or cfg.layer_norm_eps, cfg.activation, "", layout=cfg.sinusoid_layout
    )


def diagnose(check, choice, result) -> None:
    """Fill result.diagnoses, and first_divergence and unexplained where a layer or a model diverges (see the module
    docstring); what fails with nothing named is said by judge.said_why. Where no convention matched, a term on the
    scores first: a mistake read under the closest miss may hide it (a mask leaving no key hides the scores)."""
    terms = score_terms(check.flow) or batch_attended(check.flow, choice) if check.flow and not choice.matched else None
    if terms is not None:
        result.unsupported = differs(*terms)
        return
    if dropout_probe(check, choice, result):
        return
    overflow_probe(check, choice, result)
    if all(r.ok for r in result.rows):
        return
    if check.entry.hooked and check.is_module:
        first_divergence(check, choice, result, scan(check, choice, capture(check, choice)))
    else:
        component_variants(check, choice, result)
