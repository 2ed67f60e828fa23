"""check.module: a user's torch module judged by the NumPy reference, with the mistake named when it has a name.

One pass over frozen stages (session.recording, session.prepare: a Check); `choose` runs the candidate callers,
weight maps and configs until the user's float64 output reproduces the reference's (a Choice); `verdict` compares
the output and every parameter and input gradient under it (one random upstream gradient, zero at padded target
positions) in float64 and float32, and names what fails (divergence.diagnose; a gradient wrong under a matching
output: the hand-written backward, an autograd.Function or custom op, that is not its own forward's derivative,
wrong_backward). Copies of the user's module hold the reference's random weights; the module itself is never touched.
"""

from __future__ import annotations

import dataclasses
import re
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from numpy_transformer import TransformerConfig

from . import calling as C
from . import dataflow as DF
from . import divergence as DV
from . import graphs as GR
from . import levels as LV
from . import mapping as MP
from . import mistakes as MK
from . import running as RN
from . import session as SE
from . import speech as SP
from . import towers as TW
from . import unsupported as US
from . import weight_map as WM
from .diagnosis import MATCH, Diagnosis, _error, _valid, relative
from .matchers import match
from .pair_table import PAIRS
from .probes import Sizes
from .report import FLOAT32_FLOOR, FLOAT32_RATIO, Result
from .running import COARSER, at_positions, holds_float32, island_message, lifted, own_errors, positions_held, rows
from .session import Check, Layout, copy_of, hides_id, prepare, probe_of, recording, run_user, stated


def output_kind(out: np.ndarray) -> str:
    """ "log_probs" when every row's logsumexp is 0, "probs" when rows are non-negative and sum to 1, else "logits"."""
    if out.ndim < 3:
        return "logits"
    if np.all(out >= 0) and np.allclose(out.sum(-1), 1.0, atol=1e-6):
        return "probs"
    top = out.max(-1, keepdims=True)
    if np.all(out <= 1e-9) and np.allclose(np.log(np.exp(out - top).sum(-1)) + top[..., 0], 0.0, atol=1e-6):
        return "log_probs"
    return "logits"


def from_logits(logits: np.ndarray, kind: str) -> np.ndarray:
    if kind == "logits":
        return logits
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return logp if kind == "log_probs" else np.exp(logp)


def dlogits_from(dout: np.ndarray, logits: np.ndarray, kind: str) -> np.ndarray:
    """The upstream gradient on the reference's logits for an upstream gradient `dout` on the user's output:
    log_softmax: dz = g - p sum(g); softmax: dz = p (g - sum(g p))."""
    if kind == "logits":
        return dout
    p = from_logits(logits, "probs")
    if kind == "log_probs":
        return dout - p * dout.sum(-1, keepdims=True)
    return p * (dout - (dout * p).sum(-1, keepdims=True))


@dataclass(frozen=True)
class Choice:
    """What the module is judged under (positions: those its output holds, None: all); matched when a run reproduced
    the reference's output under them, else the closest that ran; runnable: the callers it ran under, in order."""

    caller: Any
    cfg: TransformerConfig
    kind: str
    layout: Layout
    probe: LV.Probe
    positions: Any = None
    matched: bool = False
    error: float = 0.0
    runnable: tuple = ()


def choose(check: Check) -> Choice:
    """The first Choice under which the user's float64 output matches the reference's; else the closest that runs, or
    where parts are hooked the one whose first divergence lies latest (divergence.latest_divergence)."""
    errors, runnable, outs = [], list[Any](), {}  # outs: the reference's outputs, by (probe, config)
    best: Choice | None = None  # the closest miss
    callers = own_kinds(check)
    for n, layout in enumerate(check.layouts):
        for caller in callers:
            if caller.fallback and runnable:  # a call passing no mask only where every call passing one raised
                continue
            p = probe_of(check, caller)
            try:
                out = run_user(check, layout, caller, np.float64, probe=p)[0].detach().cpu().numpy()
            except Exception as exc:  # a convention the module does not take: try the next one
                errors.append(f"{caller.conventions()}: {type(exc).__name__}: {exc}")
                continue
            if n == 0:  # the callers that run, counted under the first layout
                runnable.append(caller)
            kind = output_kind(out) if check.entry.output_head else "logits"
            for error, cfg, index in _errors(check, outs, caller, p, out, kind):
                choice = Choice(caller, cfg, kind, layout, p, index, error <= MATCH, error, tuple(runnable))
                if choice.matched:
                    return choice
                best = choice if best is None or error < best.error else best
    if best is None and outs:  # it ran, but its output holds none of the reference's positions
        raise unheld(check, out, outs)
    if best is None:
        raise ValueError(
            f"the module could not be called as the reference {check.level!r} is; tried {len(errors)} "
            "conventions, the first few failed with:\n  " + "\n  ".join(list(dict.fromkeys(errors))[:4])
        )
    best = dataclasses.replace(best, runnable=tuple(runnable))  # nothing matches: the closest, to diagnose from
    return DV.latest_divergence(check, best) if check.entry.hooked and check.is_module else best


def unheld(check: Check, out: np.ndarray, outs: dict) -> ValueError:
    """What stops the judge where the module's output holds none of the reference's outputs `outs`: a head past
    the reference's output (unsupported.past_output: the layers before it are judged alone, before_head), else
    the shapes."""
    head = US.past_output(check.flow, check.level, {o.shape[-1] for o in outs.values()})
    head = head or US.shortened(check.flow, check.level)
    theirs = " or ".join(sorted({str(o.shape) for o in outs.values()}))
    return head or ValueError(f"the module's output has shape {tuple(out.shape)}, the reference's {theirs}")


def own_kinds(check: Check) -> tuple:
    """The callers to try: where the module may be passed no mask (it builds its own, BERT's from ids != pad) and
    passed none computes on the padded probe what it computes passed masks of some kinds, only the callers passing
    those kinds (its default tells its argument's convention) and the one passing none; all where no kind does."""
    unmasked = [c for c in check.callers if not c.masks and c.call is None and c.template is None and not c.fallback]
    if not unmasked or not check.is_module or all(not c.masks for c in check.callers):
        return check.callers

    def output(caller) -> np.ndarray | None:
        try:
            return run_user(check, check.layouts[0], caller, np.float64)[0].detach().cpu().numpy()
        except Exception:  # a shape the module does not take
            return None

    own, p = output(unmasked[0]), probe_of(check, unmasked[0])
    if own is None:
        return check.callers
    same: set = set()
    for caller in check.callers:
        kinds = frozenset(kind for _, kind, _ in caller.masks.values())
        out = output(caller) if caller.masks and kinds not in same else None
        if out is not None and match(out, own, p.valid) <= MATCH:
            same.add(kinds)
    return tuple(
        c for c in check.callers if not same or frozenset(k for _, k, _ in c.masks.values()) in same | {frozenset()}
    )


def _errors(check: Check, outs: dict, caller, p, out: np.ndarray, kind: str) -> list:
    """(error, config, positions held) of the user's float64 output `out` on probe `p` against the reference's under
    each config that applies, until one matches; the reference's outputs are kept in `outs`."""
    found = []
    for i, cfg in enumerate(check.configs):
        if cfg.positional == "rope" and not p.self_attention and check.entry.self_attention_probes:
            continue  # rotary positions need one sequence
        key = (caller.self_attention, caller.causal, i)
        if key not in outs:
            outs[key] = LV.run_reference(check.level, check.params, p, cfg, np.float64)[0]
        index = positions_held(outs[key].shape, out.shape)
        if index is False:
            continue
        ref, valid = at_positions(from_logits(outs[key], kind), index), at_positions(p.valid, index)
        with np.errstate(all="ignore"):
            found.append((_error(np.nan_to_num(_valid(out, valid), nan=1e300), _valid(ref, valid)), cfg, index))
        if found[-1][0] <= MATCH:
            break
    return found


def compare(check: Check, choice: Choice, dtype) -> list:
    """Rows for the output and every gradient in `dtype`; in float32 (or with a float32 island held) each bar from
    the reference's own float32 error on that tensor (report.FLOAT32_RATIO), times bfloat16's epsilon over float32's
    where the float32 run computes in bfloat16 (running.COARSER)."""
    p, kind, links = choice.probe, choice.kind, choice.layout.links
    out, tensors = run_user(check, choice.layout, choice.caller, dtype, grad=True)  # float64: islands in float64
    run = LV.run_reference(check.level, check.params, p, choice.cfg, dtype)
    index = positions_held(run[0].shape, out.shape)
    if index is False:
        raise ValueError(f"the module's output has shape {tuple(out.shape)}, the reference's {run[0].shape}")
    valid = at_positions(p.valid, index)
    dout = _valid(np.random.default_rng(check.seed + 2).standard_normal(tuple(out.shape)), valid)
    params = dict(copy_of(check, choice.layout, dtype).named_parameters()) if check.is_module else {}
    for t in params.values():
        t.grad = None
    out.backward(torch.from_numpy(dout).to(out.device, out.dtype))
    user_grads = {n: t.grad.detach().cpu().double().numpy() for n, t in params.items() if t.grad is not None}
    user_params = MP.scatter(links, user_grads, check.shapes)
    ref = MP.summed_over_ties(links, reference_tensors(run, p, kind, index, dout))
    pairs = {output_name(kind): (_valid(out.detach().cpu().double().numpy(), valid), ref[output_name(kind)])}
    grads = {}
    for n, g in ref.items():
        if n.startswith("d") and n[1:] in tensors and tensors[n[1:]].grad is not None:
            grads[n] = (tensors[n[1:]].grad.double().cpu().numpy(), g)
        elif n.startswith("d ") and n[2:] not in check.model.zero and n[2:] in check.shapes:
            grads[n] = (user_params.get(n[2:], np.zeros_like(g)), g)
    own = None
    if dtype == np.float32 or holds_float32(check.cache.get("islands")):  # a float32 tensor held: float64 no better
        twin = np.float64 if dtype == np.float32 else np.float32  # the reference in the other dtype: its own error
        twin_run = LV.run_reference(check.level, check.params, p, choice.cfg, twin)
        again = MP.summed_over_ties(links, reference_tensors(twin_run, p, kind, index, dout))
        ref32, ref64 = (ref, again) if dtype == np.float32 else (again, ref)
        own = own_errors({n: ref32[n] for n in [*pairs, *grads]}, ref64)
    coarser = COARSER.get(RN.narrowest(check.flow), 1.0) if dtype == np.float32 else 1.0  # a run in bfloat16
    return rows([pairs, grads], dtype, own, coarser=coarser)


def output_name(kind: str) -> str:
    return "output" if kind == "logits" else f"output ({kind})"


def reference_tensors(run: tuple, p, kind, index, dout) -> dict:
    """The reference's output (output_name), input gradients ("dquery", ...) and parameter gradients ("d name") from
    `run` (run_reference's) for the upstream gradient `dout` on the positions the module's output holds."""
    ref_out, backward = run
    dref = np.zeros(ref_out.shape)  # the upstream gradient on every position: zero where the module gives none
    dref[(slice(None), index if index is not None else slice(None))] = dout
    dref_in, dref_params = backward(dlogits_from(dref, ref_out, kind).astype(ref_out.dtype))
    valid = at_positions(p.valid, index)
    tensors = {output_name(kind): _valid(at_positions(from_logits(ref_out, kind), index), valid)}
    return tensors | {f"d{n}": g for n, g in dref_in.items()} | {f"d {n}": g for n, g in dref_params.items()}


def float32_basis(rows: list) -> str:
    """The report's line on how the float32 bars were derived, with their range and the closest call."""
    own, epsilons = [r.own for r in rows], FLOAT32_FLOOR / float(np.finfo(np.float32).eps)
    text = (
        f"float32 bars, per tensor: {FLOAT32_RATIO:g} x the reference's own float32 error on that tensor (the "
        f"reference run in float32 against itself in float64, same inputs, weights and upstream gradient: "
        f"{min(own):.1e} to {max(own):.1e} here), at least {FLOAT32_FLOOR:.1e} ({epsilons:g} float32 epsilons): "
        f"bars {min(r.bar for r in rows):.1e} to {max(r.bar for r in rows):.1e}"
    )
    over = [r for r in rows if not r.ok]
    if over:
        return text + "; over their bars: " + ", ".join(f"{r.name} {r.error:.1e} > {r.bar:.1e}" for r in over[:4])
    closest = max(rows, key=lambda r: r.error / r.bar)
    return text + f"; the closest, {closest.name} at {closest.error:.1e} = {closest.error / closest.bar:.2f} of its bar"


def module(
    user_module,
    reference: str,
    *,
    config=None,
    mapping: dict | None = None,
    call=None,
    batch_first: bool | None = None,
    mask: str | None = None,
    dtypes=("float64", "float32"),
    seed: int = 0,
    example: tuple | None = None,
    **fields,
) -> Result:
    """Judge `user_module` (a torch.nn.Module, or a function for scaled_dot_product_attention) against the
    reference `reference`; see docs/howto/check_your_model.md, and print(result) for the report.

    config: a TransformerConfig, or its fields as keywords (n_heads=, pad_id=, ...) for what the shapes cannot
    tell. mapping: the printed map (user name -> reference name, or (name, layout note)) to use instead of the
    inferred one. call: call(module, src, tgt) or call(module, ids) (batch-first long tensors) -> output.
    batch_first, mask ("bool_keep", "bool_masked", "int_keep", "additive", "none"): fixed instead of detected.
    dtypes: which of float64 and float32 to compare. example: (args, kwargs), one real call of the part: the judge
    calls it as that call does (its inputs, masks and extra arguments), at its sizes (calling.example_callers).
    Never modifies user_module (it works on copies)."""
    user_module, wrapped = RN.unwrapped(user_module)  # the model inside torch.compile's or DataParallel's
    if reference not in LV.REFERENCES:
        raise ValueError(f"reference must be one of {', '.join(LV.REFERENCES)}; got {reference!r}")
    if not isinstance(user_module, nn.Module) and not (
        LV.LEVELS[LV.standing_for(reference, user_module)].takes_function and callable(user_module)
    ):
        raise TypeError(f"user_module must be a torch.nn.Module, got {type(user_module).__name__}")
    if mask not in (None, "detect", "none", *C.MASK_KINDS):
        raise ValueError(f"mask must be one of {C.MASK_KINDS + ('none',)} or None (detect), got {mask!r}")
    if not dtypes or not all(d in ("float64", "float32") for d in dtypes):
        raise ValueError(f"dtypes must name float64 and/or float32, got {dtypes!r}")
    if example is not None:
        C.validate(example)
        if call is not None:
            raise TypeError("pass example= (one real call) or call= (an adapter), not both")
    unknown = [k for k in fields if k not in TransformerConfig.__dataclass_fields__]
    if unknown:
        raise TypeError(f"unknown keyword(s) {unknown}: expected TransformerConfig fields such as n_heads, pad_id")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors, one op at a time: a thread pool only adds latency
    found = MP.Structure()  # the recording: read again where the judge stops (unsupported.explain)
    try:
        # the caller's random state left as it was; torch's fused attention off (RN.slow_paths)
        with torch.random.fork_rng(), lifted(torch.inference_mode), RN.slow_paths():
            # an alias's level ("encoder"), or the level judged in place of the named one for torch's own module
            level = LV.standing_for(reference, user_module if call is None else None)
            base = [] if example is None or "rope_theta" in fields else C.thetas(example)[:1]  # its cos/sin tables'
            given = fields | {"config": config} | dict(zip(["rope_theta"], base, strict=False))  # the RoPE base first
            mapped = WM.links_from(mapping) if mapping is not None else None  # read first: nothing dealt refuses it
            conventions = dict(call=call, batch_first=batch_first, mask=mask, example=example)
            # weight_norm's and spectral_norm's weights as the forward uses them: plain parameters of a copy
            plain, scripted = RN.unscripted(user_module)  # torch.jit.script's modules: the Python ones
            plain, parametrized = RN.plain_weights(plain)
            plain, adapted = RN.merged_adapters(plain)  # LoRA: base + s B A judged as the one linear it is (a note)
            plain, graphed = GR.ungraphed(plain, lambda m: recording(m, level, given, seed, **conventions))
            plain, found = computing(plain, lambda m: recording(m, level, given, seed, **conventions))
            plain, computed = RN.computed_weights(plain)  # int8 weights dequantized in the forward: what it computes
            plain, linear = RN.linear_maps(plain, found.flow)  # DoRA, an adapter over a computed base: the linear
            found = recording(plain, level, given, seed, **conventions) if computed or linear else found
            check = prepare(plain, level, given, mapped, found, seed, **conventions)
            again = lambda g: prepare(plain, level, g, mapped, found, seed, **conventions)  # noqa: E731
            check, choice = no_pad_token(check, choose(check), found, again, example)
            result = verdict(check, choice, reference, dtypes)
            sizes = SE.probe_sizes(plain, level, **conventions)
            longer = longer_sizes(check, choice, sizes) if result.passed else None
            if longer is not None:  # the same at a probe's length, the outputs differing further on: judged there
                found = recording(plain, level, check.given, seed, sizes=longer, **conventions)
                check = prepare(plain, level, check.given, mapped, found, seed, sizes=longer, **conventions)
                result = verdict(check, choose(check), reference, dtypes)
                result.notes.append(
                    f"judged at {longer.T_K} positions: at the probe's {sizes.T_K}, under what was read there, the "
                    "outputs agreed with the reference's, further on they differed"
                )
            result.notes += wrapped + scripted + parametrized + adapted + graphed + computed + linear
            return result
    except (SystemExit, Exception) as exc:  # never an exception out of the judge, never an exit
        return could_not_judge(user_module, reference, found.flow or found.own, exc, found.flow is None)
    finally:
        torch.set_num_threads(threads)


def computing(plain, record) -> tuple:
    """(running.computing's copy of `plain`, its recording `record(copy)`), recorded again with the whole forward run
    so where the recording shows a weight a product made from parameters alone (a hypernetwork's: DF.generated)."""
    found = record(made := RN.computing(plain))
    if found.flow is not None and DF.generated(found.flow):
        found = record(made := RN.computing(plain, grown=True))
    return made, found


LONGER = 24  # a mask, window or table may part from the reference's only past the probe's


def longer_sizes(check: Check, choice: Choice, sizes: Sizes) -> Sizes | None:
    """`sizes` (the probe's) made LONGER positions long (3 x the config's sliding window where more; never past its
    position table's max_len, nor 64) where the user's float64 output under `choice`, which matched at the probe's
    length, differs from the reference's there (outputs only): a sink, a window, a block or a table beyond the probe.
    None where it agrees, where the level computes each position alone (Level.across_positions), or where the module
    cannot run that long."""
    cfg = choice.cfg
    T = min(max(LONGER, 3 * (cfg.sliding_window or 0)), 64, cfg.max_len)
    if not check.entry.across_positions or T <= sizes.T_K:
        return None
    longer = dataclasses.replace(sizes, T_Q=T - (sizes.T_K - sizes.T_Q), T_K=T)
    probes = SE.probes_at(check.entry, cfg, check.seed, longer, check.flow, check.model)
    at = dataclasses.replace(check, probes=probes, configs=(cfg,))
    p = probe_of(at, choice.caller)
    try:
        out = run_user(at, choice.layout, choice.caller, np.float64, probe=p)[0].detach().cpu().numpy()
        errors = _errors(at, {}, choice.caller, p, out, choice.kind)
    except Exception:  # the module (or its cached tables) cannot take that length: nothing more to tell
        return None
    return longer if errors and errors[0][0] > MATCH else None


def no_pad_token(check: Check, choice: Choice, found: MP.Structure, again, example=None) -> tuple[Check, Choice]:
    """A model of ids reproducing nothing while passed no mask, its pad id assumed (no table's padding_idx, nor the
    caller's) and masked nowhere (no key hidden where the ids end in it): judged again (`again(given)`, a Check) with
    no padding token (pad_id=None: ids without padding), kept where its output lies closer (all-ones masks built);
    the model recorded as the `example` calls it where one is given."""
    pad, tables = check.model.cfg.pad_id, found.tables
    if (
        choice.matched
        or choice.caller.masks
        or choice.caller.call is not None  # a call= passes the padding (d2l's valid_lens): a pad token meant
        or check.entry.group != "model"
        or pad is None
        or "pad_id" in stated(check.given)
        or any(t.padding_idx is not None for t in tables)
        or hides_id(check.user, check.level, tables, pad, example)
    ):
        return check, choice
    try:
        other = again(check.given | {"pad_id": None})
        alt = choose(other)
    except Exception:  # the reading without padding does not run: the first stands
        return check, choice
    if alt.error >= choice.error:
        return check, choice
    said = f"no padding token (pad_id=None, closer than {pad}: the module masks no id {pad}); else pass pad_id="
    return dataclasses.replace(other, notes=(*other.notes, said)), alt


def could_not_judge(user_module, reference: str, flow, exc: BaseException, own: bool = False) -> Result:
    """The answer where the judge stopped on `exc`: math the recorded `flow` shows the reference lacks (unsupported.py),
    on an example's own call (`own`) where its first input reads otherwise than the level's (example_read), else
    "could not judge: <what stopped it>; pass <the argument that settles it>", or the user's sys.exit."""
    if isinstance(exc, SystemExit):
        where = "its forward" if isinstance(user_module, nn.Module) else "the function"
        return Result(reference=reference, error=f"the user's code called sys.exit({exc.code!r}) in {where}")
    speech = SP.judge_speech(user_module, reference, module)  # Whisper's whole encoder-decoder (speech.py)
    if speech is not None:
        return speech
    tower = TW.judge_tower(user_module, reference, module)
    if tower is not None and tower.error is None:  # a ViT, a CLIP tower or Whisper's encoder (towers.py)
        return tower
    result = Result(reference=reference)
    flow = flow or getattr(exc, "flow", None)  # a module read as lacking (mapping.structure), its forward recorded
    met = exc.place if isinstance(exc, US.NoPair) and tower is None else None
    found = US.explain(flow, met=met) or (met and US.differs(*met))  # the first in data flow
    found = found or own and tower is None and (example := US.example_read(flow)) and US.differs(*example)
    earlier = before_head(user_module, reference, flow, found) if flow and isinstance(found, str) else None
    explained(result, found)  # else what it met
    if earlier is not None:
        return earlier
    if result.diagnoses or result.unsupported:
        return result
    if tower is not None:  # an image or audio model towers.py could not read: said so
        return tower
    said = str(exc) if isinstance(exc, (ValueError, TypeError)) else f"{type(exc).__name__}: {exc}"
    settles = "" if "pass " in said else "; pass call= (how to call it) or mapping= (the weight map)"
    if re.search(r"got Double|not implemented for 'Double'", said):  # call= would not help: an op refuses float64
        settles = (
            "; the judge runs the module in float64, which an op of its forward refuses: pass a module whose ops all "
            'run in float64 (transformers\' mixtures of experts: experts_implementation="eager")'
        )
    if "does not support backward on CPU" in said:  # FlexAttention's on CPU: no call= or mapping= runs its backward
        said = said.replace("; pass call= (how to call it) or mapping= (the weight map)", "")
        settles = "; the judge compares gradients, so it needs that backward: judge the model on CUDA, where it has "
        settles += "one, or pass it with scaled_dot_product_attention in that op's place"
    result.error = f"could not judge: {said}{settles}"
    return result


def _alone(user_module, reference: str, part: str) -> Result | None:
    """The user's layer `part` judged on its own at the reference's layer level, its diagnoses placed in the whole
    module; None where the reference has no such level or the module no such part."""
    layers = {"transformer_lm": "decoder_only_layer", "encoder_model": "encoder_layer"}  # each model's layer
    level = layers.get(LV.standing_for(reference, user_module))
    layer = dict(user_module.named_modules()).get(part) if isinstance(user_module, nn.Module) else None
    if level is None or layer is None:
        return None
    found = module(layer, level)
    for d in found.diagnoses:
        d.where = f"{part}.{d.where}" if d.where and d.where != "(the module)" else part
    return found


def before_head(user_module, reference: str, flow, answer: str) -> Result | None:
    """Where the no-pair `answer` is said at a part that runs after one of the model's layers (a later layer's
    mixer, a classifier's head), each layer that ends before it judged on its own at the reference's layer level in
    the order they ran: the first catalogued mistake named there (the computation diverges there first); None where
    none is."""
    where = answer.removeprefix("differs at ").partition(": ")[0]
    at = US._ran(flow, "" if where == "(the module)" else where)
    runs = (re.match(r"(.*?\.\d+)\.", a.module) for a in flow.attentions)  # the stack's layers: {stack}.N
    layers = list(dict.fromkeys(m[1] for m in runs if m))
    ends = {part: max(n.index for n in flow.nodes if n.module.startswith(f"{part}.")) for part in layers}
    for part in (p for p in layers if ends[p] < at):
        found = _alone(user_module, reference, part)
        if found is not None and found.diagnoses:
            note = f"{part} judged on its own as the reference's {found.reference!r}: it runs before {where}, "
            note += "what the reference has no pair for"
            where = found.diagnoses[0].where
            return Result(reference=reference, first_divergence=where, diagnoses=found.diagnoses, notes=[note])
    return None


def beside(check: Check) -> list:
    """A note naming the parameters the forward reads where the judged output is not computed (Medusa's draft
    heads beside its logits: dataflow._reaching), or never reads, which are not the reference's: a module where all
    of those it holds are, else the parameter (a layer's unused mixing weight); [] where there are none. The tensors
    of a module computing weights (running.computed_weights: log_w of exp(log_w), a hypernetwork's) are read there."""
    held = dict(check.user.named_parameters()) if check.is_module and check.flow is not None else {}
    computing = [m for m, sub in check.user.named_modules() if getattr(sub, "computed_names", 0)] if held else []
    held = {n: p for n, p in held.items() if not any(m == "" or n.startswith(f"{m}.") for m in computing)}
    unread = [p for p in (check.flow.beside if held else ()) if p in held]
    whole = lambda m: m and all(q in unread for q in held if q.startswith(f"{m}."))  # noqa: E731
    said = ", ".join(dict.fromkeys(m if whole(m := p.rpartition(".")[0]) else p for p in unread))
    return [f"not judged: {said}, which the judged output is not computed from (not the reference's)"] if said else []


def explained(result: Result, found) -> None:
    """unsupported.explain's answer into `result`: a catalogued mistake (QuickGELU's constant) or the no-pair text."""
    if isinstance(found, US.Diagnosis):  # named: what diverges is no longer unexplained
        result.diagnoses, result.first_divergence, result.unexplained = [found], found.where, None
    elif found is not None:  # else what the divergence said stays (divergence._own_eps)
        result.unsupported = found


@dataclass
class Part:
    """One call of a hand-written backward in the user's float64 run: `call` (an autograd.Function's apply, or a
    custom op) on `args` (tensors detached; parameters themselves), run in the forward of the submodule `where`;
    `grad`: the upstream gradient its output got."""

    call: Any
    name: str
    args: list
    wrt: list  # the indices of the float tensors it differentiates
    labels: list  # theirs: a parameter's own name (weight, bias), else "x"
    where: str
    grad: Any = None

    def run(self) -> torch.Tensor:
        return self.call(*self.args)


def _held(a, parameter: bool):
    """A part's argument as kept: a parameter itself (a checkpointed block reads its own), a tensor copied."""
    copied = isinstance(a, torch.Tensor) and not parameter
    return a.detach().clone(memory_format=torch.contiguous_format) if copied else a


@contextmanager
def hand_written(module: nn.Module, parts: list):
    """While open, every autograd.Function applied and every custom op called (not aten's) whose output needs a
    gradient, noted in `parts` with the submodule of `module` whose forward runs it (forward hooks' stack)."""
    path, names = [""], {id(m): n for n, m in module.named_modules()}
    params = {id(p): n.rpartition(".")[2] for n, p in module.named_parameters()}
    hooks = [m.register_forward_pre_hook(lambda m, a: path.append(names[id(m)])) for m in module.modules()]
    hooks += [m.register_forward_hook(lambda m, a, o: None if path.pop() else None) for m in module.modules()]
    base = torch.autograd.Function.__dict__["apply"]

    def noted(call, name: str, args: tuple, out):
        if isinstance(out, torch.Tensor) and out.requires_grad:
            held = [_held(a, id(a) in params) for a in args]
            wrt = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point()]
            wrt = [i for i in wrt if args[i].requires_grad]
            part = Part(call, name, held, wrt, [params.get(id(args[i]), "x") for i in wrt], path[-1])
            out.register_hook(partial(setattr, part, "grad"))
            parts.append(part)
        return out

    def apply(cls, *args, **kwargs):
        call = partial(base.__func__, cls)
        return noted(call, cls.__name__, args, call(*args, **kwargs)) if not kwargs else call(*args, **kwargs)

    class Ops(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            own = isinstance(func, torch._ops.OpOverload) and func.namespace not in ("aten", "prims") and not kwargs
            return noted(func, func.name(), args, out) if own else out

    torch.autograd.Function.apply = classmethod(apply)  # type: ignore[method-assign,assignment]
    try:
        with Ops():
            yield
    finally:
        torch.autograd.Function.apply = base  # type: ignore[method-assign]
        for h in hooks:
            h.remove()


def _against(part: Part, t: torch.Tensor, direction: torch.Tensor, h: float = 1e-5) -> float:
    """<grad, d output> along `direction` on the part's input `t`, by central differences of its own forward."""
    with torch.no_grad():
        saved = t.detach().clone()
        t.copy_(saved + h * direction)
        up = float((part.grad * part.run()).sum())
        t.copy_(saved - h * direction)
        down = float((part.grad * part.run()).sum())
        t.copy_(saved)
    return (up - down) / (2 * h)


def _gradients(part: Part) -> list:
    """The part's own backward: the gradients of its inputs `wrt` for its upstream gradient (zeros where none)."""
    ts = [part.args[i].requires_grad_(True) for i in part.wrt]
    with torch.enable_grad():
        got = torch.autograd.grad(part.run(), ts, part.grad, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g.detach() for t, g in zip(ts, got, strict=True)]


def _wrong(part: Part) -> bool:
    """Whether the part's backward disagrees with its forward's own derivative along one random direction."""
    if part.grad is None or not part.wrt:
        return False
    ts, got = [part.args[i] for i in part.wrt], _gradients(part)
    rng = torch.Generator().manual_seed(0)
    directions = [torch.randn(t.shape, generator=rng, dtype=t.dtype).to(t.device) * t.isfinite() for t in ts]
    slope = sum(float((g * v).sum()) for g, v in zip(got, directions, strict=True))
    diff = sum(_against(part, t, v) for t, v in zip(ts, directions, strict=True))
    return abs(slope - diff) > 1e-6 * max(abs(slope), abs(diff), 1e-12)


def _expected(part: Part, t: torch.Tensor) -> np.ndarray:
    """The right gradient of the part's input `t` for its upstream gradient: central differences, entry by entry."""
    out, finite = np.zeros(t.numel()), t.detach().isfinite().reshape(-1).tolist()
    for j in range(t.numel()):
        one = torch.zeros(t.numel(), dtype=t.dtype, device=t.device)
        one[j] = 1.0
        out[j] = _against(part, t, one.view(t.shape)) if finite[j] else 0.0
    return out.reshape(t.shape)


def _as_pair(part: Part) -> tuple:
    """(reference pair, its names of the part's inputs `wrt`, its arguments) for the first pair whose forward gives
    the part's output on its inputs; else ("", each parameter's own name or "x", {"x": the first input})."""
    xs = [part.args[i].detach().cpu().numpy() for i in part.wrt]
    out = part.run().detach().cpu().numpy()
    T = xs[0].shape[-2] if xs[0].ndim > 1 else 1
    causal = np.tril(np.ones((T, T), bool))[None, None]
    floats = [a for a in part.args if isinstance(a, float)] or [1e-5]
    tries: list[tuple[str, str, dict]] = [("layer_norm", "x weight bias", dict(eps=eps)) for eps in floats]
    tries += [("softmax", "x", {}), ("linear", "x weight bias", {}), ("linear", "x weight", dict(bias=None))]
    tries += [("scaled_dot_product_attention", "q k v", dict(mask=m)) for m in (None, causal)]
    for pair, names, extra in tries:
        args = dict(zip(names.split(), xs, strict=False)) | extra
        try:
            if len(names.split()) == len(xs) and relative(PAIRS[pair].forward(**args)[0], out) <= MATCH:
                return pair, names.split(), args
        except (ValueError, TypeError):  # shapes no such pair takes
            continue
    return "", part.labels, {"x": xs[0]}


def wrong_backward(check: Check, choice: Choice) -> Diagnosis | str | None:
    """Where the output matches but a gradient does not: the innermost hand-written backward (an autograd.Function,
    a custom op) whose gradients are not its own forward's derivative for the upstream gradient it got, its wrong
    gradients put to the catalogue's backward tests (check.pair's), named at the submodule that runs it; said as
    no pair where none names it; None where every hand-written backward is right (or the model has none)."""
    module, parts = copy_of(check, choice.layout, np.float64), list[Part]()
    try:
        with hand_written(module, parts):
            out, _ = run_user(check, choice.layout, choice.caller, np.float64, grad=True)
            dout = np.random.default_rng(check.seed + 2).standard_normal(tuple(out.shape))
            out.backward(torch.from_numpy(dout).to(out.device, out.dtype))
        wrong = [p for p in parts if _wrong(p)]
        inner = [p for p in wrong if not any(q.where != p.where and _under(q.where, p.where) for q in wrong)]
        return _named(inner[0]) if inner else None
    except Exception:  # a forward or backward that will not run again, or under the recorder: not judged here
        return None
    finally:
        module.zero_grad(set_to_none=True)


def _under(where: str, part: str) -> bool:
    return not part or where.startswith(f"{part}.")


FD_ENTRIES = 2048  # the most entries a part's gradients are taken by central differences (two forwards each)


def _reference_gradients(pair: str, args: dict, dout: np.ndarray) -> dict:
    """The reference pair's own gradients (exact) of its inputs for the upstream gradient `dout`; {} for no pair."""
    if not pair:
        return {}
    spec = PAIRS[pair]
    _, cache = spec.forward(**args)
    grads = spec.call_backward(spec.backward, dout, cache)
    return dict(zip(spec.wrt, (grads,) if len(spec.wrt) == 1 else grads, strict=False))


def _named(part: Part) -> Diagnosis | str:
    """The wrong part's gradients against the right ones (the reference pair's its forward equals, _as_pair; else
    central differences of its own forward, for a part of at most FD_ENTRIES entries), put to the catalogue's backward
    tests; the first id found, else the no-pair text."""
    pair, names, args = _as_pair(part)
    worst, dout = (0.0, ""), part.grad.detach().cpu().numpy()
    right = _reference_gradients(pair, args, dout)
    small = sum(part.args[i].numel() for i in part.wrt) <= FD_ENTRIES
    for i, name, got in zip(part.wrt, names, _gradients(part), strict=True):
        expected = right[name] if name in right else _expected(part, part.args[i]) if small else None
        if expected is None:  # too large to take entry by entry: said from the one direction _wrong tried
            break
        got = got.cpu().numpy()
        error = relative(got, expected)
        for d in MK.diagnose_backward(pair, name, got, expected, args, dout) if error > 1e-6 else []:
            return dataclasses.replace(d, where=part.where)
        worst = max(worst, (error, name))
    said = f"the hand-written backward of your {part.name}, its d{worst[1]} not the derivative of its own forward "
    said += f"(relative error {worst[0]:.2e}; " if worst[1] else "(along a random direction; "
    said += "no catalogued backward mistake reproduces it)"
    return f"differs at {part.where or '(the module)'}: {said}, which the reference has no pair for"


def said_why(check: Check, choice: Choice, result: Result) -> None:
    """A failure no catalogued mistake names: the user's op the reference has no pair for (unsupported.py), else what
    diverges and where; never a failure with nothing said."""
    failed = not all(r.ok for r in result.rows) or result.first_divergence is not None
    if not failed or result.diagnoses:
        return
    output = all(r.ok for r in result.rows if r.name.startswith("output"))  # a gradient alone: a wrong backward?
    explained(result, output and wrong_backward(check, choice) or US.explain(check.flow, result.first_divergence))
    if not (result.unsupported or result.unexplained or result.diagnoses):
        worst = max((r for r in result.rows if not r.ok), key=lambda r: r.error, default=None)
        said = f"{worst.name} diverges (relative error {worst.error:.2e} in {worst.dtype})" if worst else "it diverges"
        users = {f"d {ref}": link.user for link in choice.layout.links for ref, _ in link.parts}
        said += f": the gradient of your {users[worst.name]}" if worst and worst.name in users else ""
        result.unexplained = f"{result.first_divergence or '(the module)'}: {said}; no catalogue variant reproduces it"


def caveats(check: Check, choice: Choice) -> list:
    """(catalogue id, message) for each convention a pass rests on that is also a catalogued mistake (the judge cannot
    tell them apart; the user's callers can): True = hidden masks, no embedding scale in a model of the paper's kind."""
    out = []
    torch_own = tuple(builtin[0] for builtin in C.TORCH_BUILTINS.values())  # their masks are documented
    if check.mask in (None, "detect") and not isinstance(check.user, torch_own):
        for name, (_, kind, shape) in choice.caller.masks.items():
            if kind == "bool_masked":
                out.append((
                    "attention.mask_inverted",
                    f"passes if True means hidden in {name} {shape} (the polarity read from the outputs); if your "
                    "callers pass True = keep, this is attention.mask_inverted",
                ))  # fmt: skip
    scaled = choice.cfg.scale_embeddings or "scale_embeddings" in stated(check.given)  # read so, or stated
    if check.entry.scale_caveat and not scaled and MK.BY_ID["embedding.missing_scale"].caveated(choice.cfg):
        out.append((
            "embedding.missing_scale",
            "passes with the token embeddings not multiplied by sqrt(d_model) (scale_embeddings=False, read "
            "from the outputs); the paper's Transformer scales them: if yours means to, this is "
            "embedding.missing_scale",
        ))  # fmt: skip
    return out


def fully_padded_source(check: Check, choice: Choice, result: Result) -> None:
    """A source sequence that is all padding (docs/conventions.md): the reference attends to nothing there (a zero
    context), a -1e9 fill averages the padding, a -inf fill gives NaN. A note, not a failure: a loss over real
    targets sees it only when a batch holds an empty source."""
    caller, cfg = choice.caller, choice.cfg
    if not check.entry.padded_source or cfg.pad_id is None and check.entry.group == "model":
        return  # no padding token: no padded sentence
    saved = check.probes[(caller.self_attention, caller.causal)]
    if choice.probe is not saved or saved.src_keep is None or saved.self_attention:
        return  # judged without padding (the module takes no mask), or no source to pad
    kept = saved.src_keep.copy()
    kept[0] = False  # the first sequence: padding only
    ids = saved.ids | ({"src": np.where(kept, saved.ids["src"], cfg.pad_id)} if "src" in saved.ids else {})
    p = dataclasses.replace(saved, src_keep=kept, ids=ids)
    try:
        out, _ = run_user(check, choice.layout, caller, np.float64, probe=p)
        ref = from_logits(LV.run_reference(check.level, check.params, p, cfg, np.float64)[0], choice.kind)
    except Exception as exc:  # the module cannot take an empty source at all: say so
        result.notes.append(f"a fully padded source sequence: the module raised {type(exc).__name__}: {exc}")
        return
    row = _valid(out.detach().cpu().numpy(), p.valid)[:1], _valid(ref, p.valid)[:1]
    if np.isnan(row[0]).any():
        result.notes.append(
            "a fully padded source sequence gives NaN in the module's output (a -inf fill: softmax of "
            "nothing); the reference attends to nothing there (a zero context)"
        )
    elif _error(*row) > MATCH:
        result.notes.append(
            f"a fully padded source sequence: the module's output there differs from the reference's "
            f"by {_error(*row):.2e} (a finite fill such as -1e9 averages the padding; the reference "
            "attends to nothing, a zero context); not counted as a failure"
        )


TIED = "judged as reference layers holding the same weights, each of its gradients against the sum of theirs"


def _tied_within(links: list) -> list:
    """A note for each user tensor the links tie within one reference unit (W_q = W_k: read as both q and k)."""
    within = [(a, b) for a, b in MP.ties(links) if DV.unit_of(a[0]) == DV.unit_of(b[0])]
    users = {b: link.user for link in links for b in link.parts}
    return [
        f"{users[b]} is {a[0]} and {b[0]} at once (one tensor read twice): judged with the two equal, its gradient "
        "against the sum of theirs"
        for a, b in within
    ]


def _run_again(links: list) -> list:
    """[the module holding every user tensor the links tie across layers (their common path)], or [] where none is."""
    tied = {b for a, b in MP.ties(links) if DV.unit_of(a[0]) != DV.unit_of(b[0])}
    paths = [u.split(".")[:-1] for u in dict.fromkeys(k.user for k in links if tied & set(k.parts))]
    common = []
    for parts in zip(*paths, strict=False):
        if len(set(parts)) > 1:
            break
        common.append(parts[0])
    return [".".join(common) or "(the module)"] if paths else []


def verdict(check: Check, choice: Choice, reference: str, dtypes) -> Result:
    """The Result under `choice`: its conventions (confirmed or assumed), the map, every tensor's rows in `dtypes`,
    what names a failure (divergence.diagnose, said_why) and the notes."""
    caller, cfg, kind, layout, entry = choice.caller, choice.cfg, choice.kind, choice.layout, check.entry
    fixed = "wrong frequencies" if check.model.wrong_table else cfg.sinusoid_layout  # the fixed tables' layout
    result = Result(reference=reference, mapping=WM.table(layout.links, check.model, fixed), config=cfg)
    output = entry.group == "model" or entry.stands_for is not None  # a model, or in its place
    conventions = caller.conventions() | ({"output": kind} if output else {})
    if choice.probe is not check.probes[(caller.self_attention, caller.causal)]:
        conventions["mask"] = (  # a target mask only: the source unpadded
            f"{conventions['mask']}; no source mask: compared on sources without padding"
            if caller.masks
            else "none (the module takes no mask): compared on sequences without padding"
        )
    if choice.positions is not None:  # nanoGPT's forward(idx): logits[:, [-1], :]
        conventions["positions"] = "the last position only (compared there; the gradients flow from it)"
    if layout.rope_pairing is not None and cfg.positional == "rope":
        conventions["rope_pairing"] = layout.rope_pairing
    if choice.matched:  # a run confirmed them: the user's output reproduced under them
        result.conventions = conventions
        result.caveats += caveats(check, choice)
    else:  # nothing reproduced the reference: the closest, said as such
        result.assumed, result.confirmed = conventions, False
    result.notes += check.notes
    result.notes += [f"{part} runs again with the same weights: {TIED}" for part in _run_again(layout.links)]
    result.notes += _tied_within(layout.links)
    if entry.stands_for is not None:
        result.notes.append(
            "torch.nn.Transformer: judged as the reference's encoder and decoder stacks on "
            "embeddings, each ending in a layer norm (as nn.Transformer's always do)"
        )
    islands = check.cache.get("islands")
    if islands:
        result.caveats.append(("dtype.float32_island", island_message(islands)))
    for dtype in dtypes:
        result.rows += compare(check, choice, np.dtype(dtype).type)
    narrow = RN.narrowest(check.flow)
    if narrow is not None and "float32" in [np.dtype(d).name for d in dtypes]:
        result.notes.append(
            f"the float32 run computes in {str(narrow).removeprefix('torch.')} in places (torch.autocast, or casts): "
            f"its float32 bars are {COARSER[narrow]:g} x wider ({str(narrow).removeprefix('torch.')}'s epsilon over "
            "float32's); the float64 comparison judges the math"
        )
    derived = [r for r in result.rows if r.own is not None and r.dtype == "float32"]
    if derived:
        result.notes.append(float32_basis(derived))
    result.notes += DV.unreached(check, choice)
    result.notes += beside(check)
    DV.diagnose(check, choice, result)
    said_why(check, choice, result)
    fully_padded_source(check, choice, result)
    result.passed = all(r.ok for r in result.rows) and not result.diagnoses and result.first_divergence is None
    return result
