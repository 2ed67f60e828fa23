"""The stages before judging, each a frozen record returned by a function: the recording (the module read once, its
forward recorded once), the Model it implies (`inferred`), the Check prepared on it (`prepare`: the reference's
weights and probes, the callers, weight maps and configs to try); then how a Check runs the user's module:
`probe_of`, `copy_of` (copies holding the reference's weights) and `run_user`."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from numpy_transformer import TransformerConfig
from transformer_spec.config import RopeScaling

from . import calling as C
from . import dataflow as DF
from . import levels as LV
from . import mapping as MP
from . import probes as PR
from . import reference as R
from . import tables as TB
from . import units as U
from . import weight_map as WM
from .running import Float32Islands, copy_module, find_islands, lifted, output_head, vectors

TORCH = {np.float64: torch.float64, np.float32: torch.float32}
# the activations searched, in order, for a gated feed-forward (SwiGLU's silu first) and for a plain one
ACTIVATIONS = {
    True: ("silu", "gelu", "gelu_tanh", "relu", "quick_gelu"),
    False: ("relu", "gelu", "gelu_tanh", "silu", "quick_gelu"),
}
# the ops each records in a forward (written out: erf's GELU, tanh's, x * sigmoid(x)): those a block applies first
RECORDED = {
    "relu": {"relu"}, "gelu": {"gelu", "erf"}, "gelu_tanh": {"gelu", "tanh"}, "silu": {"silu", "sigmoid"},
    "quick_gelu": {"sigmoid"},
}  # fmt: skip


def stated(given: dict) -> dict:
    """What the caller fixed: the keyword fields, and every field of a config= given."""
    return given | (vars(given["config"]) if given.get("config") is not None else {})


@dataclass(frozen=True)
class Model:
    """The model the recording implies: config, weight map (mapping.Link), the reference biases held at zero (the
    user's linears lack them), each norm's eps, the fixed tables overwritten in float64 (`wrong_table`: sinusoids
    at wrong frequencies) and the RoPE bases the module states (`thetas`)."""

    cfg: TransformerConfig
    links: list
    zero: list
    norm_eps: dict
    overwrite: dict
    wrong_table: bool
    rope_overwrite: dict
    thetas: list
    scale_overwrite: dict  # sqrt(d_model) kept in float32 (tables.scales)
    rope_orders: dict = field(default_factory=dict)  # {pairing: each head's q/k order} (tables.relabelled)


def inferred(user, level: str, found: MP.Structure, given: dict, mapped, notes: list) -> Model:
    """The Model `found` reads (units.infer) with its fixed tables (tables.py, its notes into `notes`); `mapped`: the
    (links, zero) of a mapping= given."""
    entry, is_module = LV.LEVELS[level], isinstance(user, nn.Module)
    cfg, links, zero, fixed = U.infer(level, found, given, mapped)
    overwrite, layout, wrong_table = TB.fixed_tables(user, fixed, notes, found.flow) if is_module else ({}, None, False)
    if layout is not None:
        cfg = dataclasses.replace(cfg, sinusoid_layout=layout)
    rope = is_module and entry.heads and entry.group != "stacks"  # RoPE tables read (and overwritten)
    flow = found.flow  # the cos, sin or complex tables the forward computed give their base too
    computed = [flow.values[n.index] for n in flow.nodes if n.op in ("cos", "sin", "polar")] if flow else []
    scaled = TB.stated_scaling(user) if rope and "rope_scaling" not in given else None
    source = "as the module's config states"
    if scaled is None and rope and "rope_scaling" not in given:  # none stated: Llama 3.1's, read from a table
        scaled, source = TB.fitted_scaling(user, cfg.d_head, computed, flow), "as its table's frequencies read"
    if scaled is not None:  # transformers' config states a scaled RoPE (DeepSeek's YaRN, Llama 3.1's llama3)
        theta, scaling = given.get("rope_theta", scaled[0]), scaled[1]
        reads = scaling.depends_on_length or None in (scaling.factor, scaling.original_max_position_embeddings)
        max_len = given.get("max_len", scaled[2] if scaled[2] and reads else cfg.max_len)  # where its math reads it
        cfg = dataclasses.replace(cfg, positional="rope", rope_theta=theta, rope_scaling=scaling, max_len=max_len)
        notes.append(f"RoPE scaled {source}: {scaling.rope_type}, base {theta:g}, max_len {max_len}")
    first = cfg.rope_theta if scaled is not None else given.get("rope_theta")
    rope64, thetas, rotary, orders = (
        TB.rope(user, cfg.d_head, first, notes, computed, cfg.rope_scaling if scaled else None, flow)
        if rope
        else ({}, [], None, {})
    )
    thetas = thetas[:1] if scaled is not None else thetas
    orders = orders or (TB.sliced_orders(DF.turned_features(flow, cfg.d_head), cfg.d_head) if rope and flow else {})
    if rotary is not None and "rotary_dim" not in stated(given):
        cfg = dataclasses.replace(cfg, rotary_dim=rotary)
    factors = (
        [a.factor for a in flow.attentions] if flow and cfg.kv_lora_rank and "attention_scale" not in given else []
    )
    if is_module and (yarn := TB.yarn_scale(user, cfg.d_head, factors)) is not None:  # DeepSeek's YaRN mscale
        cfg = dataclasses.replace(cfg, attention_scale=yarn)
        notes.append(
            f"the scores' scale {yarn:.6g}: d_head^-1/2 times the squared mscale of the YaRN the module states"
        )
    norm_eps = {n.module: n.eps for n in [*found.norms, *found.qk_norms.values()]}  # q/k norms (Qwen3, OLMo 2) too
    scales = TB.scales(user, (cfg.d_model, cfg.d_head), notes) if is_module else {}
    return Model(cfg, links, zero, norm_eps, overwrite, wrong_table, rope64, thetas, scales, orders)


@dataclass(frozen=True)
class Layout:
    """A weight map to judge under, and the RoPE pairing it reads the q and k rows in (None: not in question)."""

    links: list
    rope_pairing: str | None = None


@dataclass(frozen=True)
class Check:
    """One check prepared: what the caller gave, the Model and Flow read, the reference's shapes, weights and probes
    (by (self_attention, causal), "unpadded" added: probe_of), the candidate callers, Layouts and configs, most
    likely first, and the model's own output head. `cache` keeps what runs find: the copies by (layout, dtype), the
    float32 islands (running.find_islands), the reference's stages (divergence.py)."""

    user: Any
    level: str
    entry: LV.Level
    is_module: bool
    given: dict
    mask: str | None
    seed: int
    model: Model
    flow: Any
    shapes: dict
    params: dict
    probes: dict
    callers: tuple
    layouts: tuple
    configs: tuple
    head: str | None
    notes: tuple
    cache: dict = field(default_factory=dict, compare=False, repr=False)


def prepare(user, level: str, given: dict, mapped, found: MP.Structure, seed: int, sizes=None, **conventions) -> Check:
    """The Check of `user` at `level`, recorded as `found`, probed at `sizes` (by default probe_sizes'); `mapped`: the
    (links, zero) of a mapping= given. What the judge cannot read raises (check.module answers "could not judge: ...",
    or Result.unsupported)."""
    entry, notes, is_module = LV.LEVELS[level], [], isinstance(user, nn.Module)
    model = inferred(user, level, found, given, mapped, notes)
    shapes = R.shapes(entry, model.cfg)
    params = MP.tied(model.links, LV.init_reference(shapes, np.random.default_rng(seed), model.zero))
    if mapped is not None and is_module:  # a given map: every name it holds exists, every size agrees
        tensors = dict(user.named_parameters(remove_duplicate=False)) | dict(user.named_buffers())
        WM.refuse_unknown(model.links, model.zero, params, tensors, level)
    sizes = sizes or probe_sizes(user, level, **conventions)
    sizes = unpadded(user, level, found, model.cfg.pad_id, sizes, **conventions)
    probes = probes_at(entry, model.cfg, seed, sizes, found.flow, model)
    rope = rope_options(entry, model, stated(given), found.flow)
    head = output_head(user, model.links) if is_module and entry.group == "model" else None
    return Check(
        user, level, entry, is_module, given, conventions["mask"], seed, model, found.flow, shapes, params, probes,
        tuple(C.callers(user, level, **conventions)), tuple(layouts(model, rope, mapped is None and is_module)),
        tuple(config_candidates(entry, model, found.flow, rope, stated(given))), head, tuple(notes),
    )  # fmt: skip


def probes_at(entry: LV.Level, cfg, seed: int, sizes: PR.Sizes, flow=None, model: Model | None = None) -> dict:
    """The level's probes at `sizes`, by (self_attention, causal); each padded one also without the keys' padding
    (key + ("unpadded",)), for a caller that passes no mask (probe_of); a model's token types read at an input of its
    own (`types`: as the recorded `flow` read them, shaped as the ids) carried to the reference."""
    probes = {}
    for key in [(False, False)] + ([(True, False), (True, True)] if entry.self_attention_probes else []):
        p = probes[key] = _typed(entry.probe(cfg, np.random.default_rng(seed + 1), *key, sizes=sizes), flow, model)
        if p.src_keep is not None:
            probes[key + ("unpadded",)] = dataclasses.replace(
                p, src_keep=None, valid=None if p.valid is p.src_keep else p.valid
            )
    return probes


def _typed(p: PR.Probe, flow, model: Model | None) -> PR.Probe:
    """`p` with the ids the user's token-type table read (`flow.read_at`) as "types" where they are the ids' shape."""
    links = model.links if model is not None and flow is not None else []
    table = next((k.user for k in links if k.parts[0][0].endswith("token_type_embedding.weight")), None)
    types = flow.read_at.get(table) if table else None
    if types is None or "ids" not in p.ids or types.shape != p.ids["ids"].shape:
        return p
    return dataclasses.replace(p, ids=p.ids | {"types": types})


def probe_of(check: Check, caller) -> LV.Probe:
    """The probe `caller` is run on (cross-, self- or causal self-attention); without the keys' padding where it passes
    no source mask (nothing could hide it): a layer's, a component's, or a model's whose padded source is a float
    memory (a model builds its masks from the ids' padding); without a value where it passes the key alone."""
    key, entry = (caller.self_attention, caller.causal), check.entry
    built = entry.group == "model" and "memory" not in entry.inputs
    masked = any(m[0] == "src" for m in caller.masks.values()) or caller.call is not None or built
    p = check.probes[key] if masked else check.probes.get(key + ("unpadded",), check.probes[key])
    if caller.order == ("query", "key"):  # a cross-attention of one memory: the value is the key (run_attention)
        return dataclasses.replace(p, floats={n: v for n, v in p.floats.items() if n != "value"})
    return p


def config_candidates(entry, model: Model, flow, rope: list, given: dict) -> list:
    """The inferred config, and what the shapes cannot tell (pre- or post-norm, the activation, the embedding scale,
    RoPE and its base) varied where the caller did not fix it; the activations whose ops the feed-forward blocks
    apply first."""
    base = model.cfg
    options: list = [{}]
    if "norm_first" in entry.searches and "norm_first" not in given:  # told by a final norm (pre-norm's) or the flow
        told = entry.final_norms == "pre-norm" or flow is not None and flow.norm_first is not None
        options = [{"norm_first": v} for v in ([base.norm_first] if told else [False, True])]
    if "activation" in entry.searches and "activation" not in given:
        applied = flow.activations if flow is not None else set()
        activations = sorted(ACTIVATIONS[base.gated_ffn], key=lambda a: not RECORDED[a] & applied)
        options = [o | {"activation": a} for o in options for a in activations]
    options = [o | r for o in options for r in rope or [{}]]
    scale = flow.position_scale if flow is not None and "rope_scaling" not in given else None
    if scale is not None and scale != 1:  # RoPE's positions divided by a factor: linear scaling, tried first
        linear = {"rope_scaling": RopeScaling("linear", scale)}
        options = [o | linear for o in options if o.get("positional", base.positional) == "rope"] + options
    if "scale_embeddings" in entry.searches and "scale_embeddings" not in given:
        scales = (False, True) if rope and rope[0].get("positional") == "rope" else (True, False)
        options = [o | {"scale_embeddings": s} for o in options for s in scales]
    if entry.output_head and base.tie_embeddings and "output_scale" not in given and base.output_scale == 1:
        # the paper's sharing may scale the tied logits by d_model^-0.5 instead of the embeddings by sqrt(d)
        options = options + [o | {"output_scale": base.d_model**-0.5} for o in options]
    return [dataclasses.replace(base, **o) for o in options]


def rope_options(entry, model: Model, given: dict, flow=None) -> list:
    """Rotary positions at each base the module states, where nothing else gives positions; tried first when the
    module keeps RoPE tables or several bases; tried last, rotary positions on no layer (SmolLM3's NoPE layers
    everywhere: no positions at all) where the forward turns no attention's queries and computes no table."""
    own_table = entry.group == "model" and (model.cfg.positional in ("learned", "relative") or model.overwrite)
    if not model.thetas or not entry.rope or own_table or given.get("positional") not in (None, "rope"):
        return []
    thetas = [given["rope_theta"]] if "rope_theta" in given else model.thetas
    rope = [{"positional": "rope", "rope_theta": float(t)} for t in thetas]
    if given.get("positional") == "rope":
        return rope
    layers = model.cfg.n_decoder_layers or model.cfg.n_encoder_layers
    unturned = flow is not None and 0 < len(flow.attentions) == layers and not model.rope_overwrite
    if unturned and not any(a.turned for a in flow.attentions) and not any(n.op in DF.TURNS for n in flow.nodes):
        rope.append(rope[0] | {"rope_layers": (False,) * len(flow.attentions)})
    return rope + [{}] if model.rope_overwrite or len(model.thetas) > 1 else [{}] + rope


def copy_of(check: Check, layout: Layout, dtype):
    """The user's module (a deep copy) in `dtype`, evaluation mode, holding the reference's weights under `layout`."""
    key = (id(layout), dtype)
    if check.is_module and key not in check.cache:
        module = copy_module(check.user)._apply(lambda t: _cast(t, TORCH[dtype])).eval()
        module.requires_grad_(True)  # frozen parameters too: every gradient is compared
        MP.load(module, layout.links, check.params, TORCH[dtype])
        tensors = dict(module.named_buffers()) | dict(module.named_parameters())
        with torch.no_grad():
            for name, table in (
                check.model.overwrite | check.model.rope_overwrite | check.model.scale_overwrite
            ).items():
                if name in tensors:
                    tensors[name].copy_(torch.from_numpy(table.reshape(tensors[name].shape)).to(tensors[name].dtype))
                elif dtype == np.float64:  # a plain tensor attribute (.to() leaves it): replaced, widened
                    path, _, attr = name.rpartition(".")
                    owner = module.get_submodule(path)
                    old = getattr(owner, attr)  # the table is float64 or complex128 already
                    setattr(owner, attr, torch.from_numpy(table.reshape(old.shape)).to(old.device))
        check.cache[key] = module
    return check.cache.get(key, check.user)  # a plain function: itself


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`t` in `dtype`, or a complex `t` in the complex dtype of its precision (Module.to(dtype) would make Meta's
    complex freqs_cis real)."""
    if t.is_complex():
        return t.to(torch.complex128 if dtype == torch.float64 else torch.complex64)
    return t.to(dtype) if t.is_floating_point() else t


def run_user(check: Check, layout: Layout, caller, dtype, grad=False, scale=1.0, probe=None):
    """The user's output (batch-first) on `probe` (by default probe_of's) and the input tensors. In float64 the
    float32 islands (found on its first float64 run that completes) run in float64 (Float32Islands)."""
    p, module = probe or probe_of(check, caller), copy_of(check, layout, dtype)

    def run():
        device = next(iter(module.parameters()), torch.empty(0)).device if check.is_module else torch.device("cpu")
        tensors = as_tensors(p, TORCH[dtype], device, grad, scale)
        with torch.set_grad_enabled(grad), lifted(torch.no_grad):  # a forward under no_grad records its gradients
            out = caller(module, tensors, p, TORCH[dtype])
            ids = p.ids.get("tgt", p.ids.get("ids"))
            if check.entry.output_head and out.ndim == 2 and ids is not None and out.shape[0] == ids.size > len(ids):
                out = out.reshape(*ids.shape, -1)  # logits flattened to (B * T, V), as a loss takes them
            cfg = check.model.cfg
            if check.head is not None and out.shape[-1] == cfg.d_model != cfg.tgt_vocab_size:
                out = module.get_submodule(check.head)(out)  # hidden states out: the model's own head applied
        return out, tensors

    if dtype != np.float64 or not check.is_module:
        return run()
    if check.cache.get("islands") is None:
        check.cache["islands"] = find_islands(module, run)
    with Float32Islands(module) if check.cache["islands"] else contextlib.nullcontext():
        return run()


def layouts(model: Model, rope: list, inferred: bool) -> list:
    """The inferred Layout and, where rotary positions may be used, the same with the q and k rows in RoPE's
    interleaved pairing (Meta's (2i, 2i + 1), not the reference's halves (i, i + Dh/2): the features reordered); with
    rotary tables holding features at frequency 0 (tables.relabelled), or turning other features of each head than its
    first R (tables.sliced_orders), the q and k features in each order read."""
    Dh, links = model.cfg.d_head, model.links
    paired = any(MP.rope_paired(n, 2) for link in links for n, _ in link.parts)
    if inferred and rope and model.cfg.kv_lora_rank:
        return latent_layouts(model)
    if not inferred or not rope or Dh % 2 or not paired:
        return [Layout(links)]

    def reordered(**order) -> list:  # the q and k rows, and their norms', in another order
        return [dataclasses.replace(x, **order) if any(MP.rope_paired(n, Dh) for n, _ in x.parts) else x for x in links]

    if model.rope_orders:
        unturned = "the features not turned after those turned: q and k features of each head read in the order"
        return [
            Layout(reordered(rope_order=o), f"{p}, {unturned} {' '.join(map(str, o))}")
            for p, o in model.rope_orders.items()
        ]
    halves = "halves (i, i + Dh/2), as Hugging Face's rotate_half (the reference's)"
    pairs = "interleaved pairs (2i, 2i + 1), as Meta's code: q and k rows read in that order, head by head"
    return [Layout(links, halves), Layout(reordered(rope_pairs=Dh, rope_rotary=model.cfg.rotary_dim or 0), pairs)]


def latent_layouts(model: Model) -> list:
    """Latent attention's Layouts: the reference's, turning the rotary rows (the last R of each head's queries, of
    kv_a_proj's shared key) in pairs (2i, 2i + 1) as DeepSeek's code, and the same with those rows read in halves
    (i, i + R/2), as rotate_half turns them: each head's rotary row u the reference's argsort(pair_order)[u]."""
    cfg, links = model.cfg, model.links
    R = cfg.rotary_dim or 0
    if R % 2 or not R:
        return [Layout(links)]
    halves = np.argsort(MP.pair_order(R, R))
    widths = {"q_proj": cfg.d_head, "q_b_proj": cfg.d_head, "kv_a_proj": (cfg.kv_lora_rank or 0) + R}  # per head

    def reordered(link: MP.Link) -> MP.Link:  # a link of one of those tensors: each head's rotary rows in halves
        width = {widths.get(n.rsplit(".", 2)[-2], 0) for n, _ in link.parts if "." in n}
        w = width.pop() if len(width) == 1 else 0
        return dataclasses.replace(link, rope_order=(*range(w - R), *(w - R + halves).tolist())) if w else link

    pairs = "interleaved pairs (2i, 2i + 1) on the rotary part, as DeepSeek's code (the reference's)"
    halves_read = "halves (i, i + R/2) on the rotary part, as rotate_half: its q and k rows read in that order"
    return [Layout(links, pairs), Layout([reordered(x) for x in links], halves_read)]


def unpadded(user, level: str, found: MP.Structure, pad, sizes: PR.Sizes, example=None, **_) -> PR.Sizes:
    """`sizes` padding no ids where a table's padding_idx says the `pad` id (judge.no_pad_token reads the others),
    the `example` holds no `pad` in its integer tensors, passes no mask and the forward, called as it calls it, hides
    no key at a pad id: a model the example shows run without padding."""
    said = any(t.padding_idx == pad for t in found.tables) and pad is not None
    if example is None or not said or LV.LEVELS[level].group != "model":
        return sizes
    tensors = [(n, v) for _, n, v in C._slots(user, example) if isinstance(v, torch.Tensor)]
    masked = any("mask" in n.lower() or v.dtype == torch.bool for n, v in tensors)
    if masked or any(not v.is_floating_point() and bool((v == pad).any()) for _, v in tensors):
        return sizes
    return sizes if hides_id(user, level, found.tables, pad, example) else dataclasses.replace(sizes, pads=False)


def probe_sizes(user, level: str, example=None, batch_first=None, **_) -> PR.Sizes:
    """The probe's batch and lengths: the example's where one is given (calling.sizes)."""
    return C.sizes(user, level, example, batch_first) if example is not None else PR.SIZES


def recording(user, level: str, given: dict, seed: int, sizes=None, **conventions) -> MP.Structure:
    """The user's module read once (mapping.structure) and its forward recorded once (read_flow): a model holding
    tables on small ids (at most 16 conventions; as long as `sizes`' keys where given, else an example's length, which
    its other tensors share), else on the level's probe at its parameters' sizes (sized_config) and at `sizes` (by
    default probe_sizes')."""
    if not isinstance(user, nn.Module):
        return MP.Structure()
    entry, found, flow, raised = LV.LEVELS[level], MP.structure(user), None, ""
    given_length = sizes is not None or conventions.get("example") is not None
    sizes = sizes or probe_sizes(user, level, **conventions)
    length = sizes.T_K if given_length else None
    tables = found.tables or _matrices(user) if entry.group == "model" else []
    if tables:
        ids = PR.model_ids(entry.inputs, tables, sizes.B, length)
        called = {k: conventions[k] for k in ("call", "example")}  # as the caller's call or example calls it
        flow, raised = read_flow(user, level, lambda caller: ids, 16, **called)
        if flow is not None and sizes.B > 1 and flow.repeated:  # B runs of one module: once per sequence?
            one = PR.model_ids(entry.inputs, tables, 1, length)
            alone = read_flow(user, level, lambda caller: one, 16, **called)[0]
            flow = alone if alone is not None and len(alone.attentions) < len(flow.attentions) else flow
    recorded = entry.heads or entry.unit in ("feed_forward", "gated_feed_forward", "rms_norm", "layer_norm")
    widths: list[dict] = [{}] + [{"d_model": w} for w in dict.fromkeys(p.out_features for p in found.pieces)]
    seen: set = set()  # the widths tried: the parameters' own first (bare (out, in) weights are read (in, out))
    for width in widths if flow is None and recorded else []:  # the width the forward runs at: the input's last axis
        sized = U.sized_config(level, found, given | width)
        if sized.d_model in seen:
            continue
        seen.add(sized.d_model)

        def probe(caller, sized=sized):  # self-attention callers: one sequence
            return entry.probe(sized, np.random.default_rng(seed + 1), caller.self_attention, caller.causal, sizes)

        flow, tried = read_flow(user, level, probe, **conventions)
        raised = raised if len(seen) > 1 else tried  # what the parameters' own width raised is said
        if flow is not None or stated(given).get("d_model"):
            break
    if found.lacking is not None:  # raised with the recorded forward: an earlier op may be what it lacks first
        found.lacking.flow = flow
        raise found.lacking
    own = own_call(user, conventions["example"]) if flow is None and conventions.get("example") else None
    probed = flow is None and conventions.get("example") is None and conventions.get("call") is None
    return dataclasses.replace(MP.with_flow(found, user, flow, raised), own=own, probed=probed)


def _matrices(user: nn.Module) -> list:
    """Where no parameter is a table by its module or name, each 2-D one as a table the ids may index (a raw
    parameter read by F.embedding): the recording's ids fit the fewest rows among them; the flow then says which.
    Where all are vectors (running.vectors: a flat vector's views), ids of two rows: the forward runs once so, its
    views held as parameters (running.computing), and is recorded again on their tables."""
    matrices = [(n, p) for n, p in user.named_parameters() if p.ndim == 2]
    if not matrices and vectors(user):
        return [MP.Table("", 2, 1, True, False)]
    return [MP.Table(n, p.shape[0], p.shape[1], p.requires_grad, False) for n, p in matrices]


def own_call(user: nn.Module, example: tuple) -> DF.Flow | None:
    """The example's own call recorded (a copy in float64, its float tensors widened), where the level's probe could
    not be put in the place of its inputs (a Decision Transformer's states, a series, codebooks, image features): what
    the module computes there is read for math the reference lacks (unsupported.explain); None where it raises."""
    model = copy_module(user).double().eval()
    args, kwargs = (
        [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in part]
        for part in (example[0], example[1].values())
    )
    try:
        return DF.record(lambda: model(*args, **dict(zip(example[1], kwargs, strict=True))), model)
    except Exception:  # the example does not run either: what the probe's tries raised is said
        return None


def hides_id(user, level: str, tables: list, pad: int, example=None) -> bool:
    """Whether the forward (called with ids alone, or as the `example` calls it), recorded on small ids ending in
    `pad` in every sequence, hides a key from every query of an attention (a padding mask built from the ids); unread
    (no recording) counts as hiding."""
    sizes = probe_sizes(user, level, example) if example is not None else None  # the sizes its other inputs take
    p = PR.model_ids(LV.LEVELS[level].inputs, tables, sizes.B if sizes else 2, sizes.T_K if sizes else None)
    ids = {n: np.concatenate([v[:, :-1], np.full_like(v[:, -1:], pad)], 1) for n, v in p.ids.items()}
    flow = read_flow(user, level, lambda caller: dataclasses.replace(p, ids=ids), 16, call=None, example=example)[0]
    seen = [] if flow is None else [s for n in flow.nodes if (s := flow.keys_seen(n)) is not None]
    return flow is None or any(not bool(s.any(0).all()) for s in seen)


def read_flow(user, level: str, probe_of, limit: int | None = None, **conventions) -> tuple:
    """(the Flow of a copy's forward under the first caller (of `limit`) that runs, ""), else (None, what the last one
    raised, or why no caller is made). Gradients stay on: torch's fused inference paths hide the ops. A bfloat16 or
    float16 model is recorded in float64, as the judge runs it (unsupported.py tells functions apart at float64's
    precision)."""
    model = copy_module(user).eval()
    weight = next(model.parameters(), None)
    if weight is None:
        return None, ""
    if weight.is_floating_point() and weight.dtype.itemsize < 4:
        weight = next(model.to(torch.float64).parameters())
    try:
        callers = C.callers(model, level, **conventions)[:limit]
    except (TypeError, ValueError) as error:  # a forward that cannot take the level's inputs (keyword-only ones)
        return None, str(error)
    raised = ""
    for caller in callers:
        probe = probe_of(caller)
        tensors = as_tensors(probe, weight.dtype, weight.device)
        try:  # only a run that completes is read: a convention the model does not take leaves half a graph
            flow = DF.record(lambda: caller(model, tensors, probe, weight.dtype), model)  # noqa: B023
            flow.batch = (next(iter(tensors.values())).shape[0], caller.batch_first)
            return flow, ""
        except Exception as error:  # a convention the module does not take; the check proper reports it
            raised = f"its forward raised {type(error).__name__}: {str(error)[:200]}"
    return None, raised


def as_tensors(p: LV.Probe, dtype, device, grad: bool = False, scale: float = 1.0) -> dict:
    """The probe's inputs as tensors on `device`: its floats (times `scale`) in `dtype`, its ids as longs."""
    floats = {n: torch.tensor(v * scale, dtype=dtype, device=device, requires_grad=grad) for n, v in p.floats.items()}
    return floats | {n: torch.tensor(v, dtype=torch.long, device=device) for n, v in p.ids.items()}
