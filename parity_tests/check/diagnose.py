"""Naming the mistake: probes a plain comparison cannot see, the first divergent submodule, and the variants.

- Dropout in evaluation mode: two calls on the same input differ.
- No max subtraction: queries and keys scaled up until the scores reach ~1e3; the reference's softmax stays finite,
  exp(scores) overflows.
- For a layer or a model: forward hooks on the user's submodules, each matched (through the weight map) to a unit of
  the reference (an attention, a norm, a feed-forward block, the embeddings); the reference's activations are
  computed unit by unit from the same inputs; the first unit whose output leaves the bar is the first divergence.
- There (or on the component itself) each catalogue variant (variants.py) is run on the reference's inputs to that
  unit; one that reproduces the user's output to float64 precision (judge.MATCH) is a diagnosis.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from numpy_transformer import model as M

from . import calling as C
from . import levels as LV
from . import mistakes as MK
from . import reference as R
from . import variants as VR
from .judge import MATCH, _error, _valid
from .report import Diagnosis, Result

BIG = 30.0  # inputs scaled by this: scores grow by its square, ~1e3, past exp's float32 range


def _np(t) -> np.ndarray:
    return C.first_tensor(t).detach().cpu().double().numpy()


def _rows_without_keys(keep, shape) -> np.ndarray | None:
    """(B, T_q) True where a query row has no key left to attend to (the variant's output there is excluded: the
    user's may be NaN (-inf fill) or uniform (-1e9 fill), either way not the reference's zeros)."""
    if keep is None:
        return None
    B, T_q, T_k = shape
    full = np.broadcast_to(keep, (np.broadcast_shapes(np.shape(keep), (B, 1, T_q, T_k))))
    return ~full.any(-1).all(1)  # (B, T_q)


def _match(user: np.ndarray, variant: np.ndarray, valid, empty) -> float:
    if np.shape(user) != np.shape(variant):  # e.g. a module that returns its query (T_q) for a (T_k) variant
        return math.inf
    user, variant = _valid(user, valid), _valid(variant, valid)
    if empty is not None and user.ndim >= 2 and user.shape[:2] == empty.shape:
        user, variant = _valid(user, ~empty), _valid(variant, ~empty)
    user = np.nan_to_num(user, nan=1e300)
    return _error(user, variant)


def attention_variants(
    D: int, Dh: int, keep, causal=False, pad=None, swap=None, self_attention=True, rope=False, gqa=False
) -> list:
    """(id, message, knobs) for every registered attention mistake (mistakes.MISTAKES) given its reference mask
    `keep`; for a causal self-attention `pad` is its keys' padding (B, 1, 1, T) or None, `swap` the
    cross-attention's mask (masks_swapped). `rope`: rotary positions' mistakes too; `gqa`: grouped-query
    attention's."""
    return MK.attention_variants(MK.Site(D, Dh, keep, causal, pad, swap, self_attention, rope, gqa))


def match_attention(user_out, params, query, kv, H, keep, where, valid=None, n_kv=None, theta=None, **context) -> list:
    """The attention variants that reproduce `user_out` (B, T_q, D), on the reference's inputs (`kv`: the key and
    value input, or a (key, value) pair; with params None, q, k, v already split into heads): at the valid
    positions, and, where several do, those that also reproduce it at the padded ones (padding on queries and an
    ignored mask agree everywhere but there), and of those the ones that need no row left out."""
    found, tiers = [], ([], [], [])  # reproduced: everywhere; except rows with no key; at the valid positions
    D = query.shape[-1]
    gqa = n_kv is not None and n_kv != H
    for vid, message, knobs in attention_variants(D, D // H, keep, rope=theta is not None, gqa=gqa, **context):
        knobs = dict(knobs)
        k = knobs.pop("keep", keep)
        transpose = knobs.pop("transpose", True)
        if params is None:  # scaled dot-product attention on heads already split
            variant = VR.attention_heads(query, kv[0], kv[1], k, **knobs)
            shape = (query.shape[0], query.shape[2], kv[0].shape[2])
            empty = _rows_without_keys(k, shape)
            if empty is not None:
                empty = np.broadcast_to(empty[:, None, :, None], variant.shape).any(-1)[:, 0]
            error = _match(user_out.transpose(0, 2, 1, 3), variant.transpose(0, 2, 1, 3), None, empty)
        else:
            key, value = kv if isinstance(kv, tuple) else (kv, kv)
            variant = VR.multi_head_attention(params, query, key, value, H, k, transpose, n_kv, theta, **knobs)
            empty = _rows_without_keys(k, (query.shape[0], query.shape[1], key.shape[1]))
            error = _match(user_out, variant, valid, empty)
        if error <= MATCH and vid not in {d.id for d in found}:
            found.append(Diagnosis(vid, message, where, error))
            strict = _match(user_out, variant, None, None) <= MATCH
            tiers[0 if strict else 1 if _match(user_out, variant, None, empty) <= MATCH else 2].append(found[-1])
    return next((tier for tier in tiers if tier), [])


def _formatted(found: list, **context) -> list:
    return [(vid, message.format(**context), knobs) for vid, message, knobs in found]


def match_norm(user_out, x, weight, bias, eps, where, valid=None) -> list:
    """The layer-norm variants (mistakes.MISTAKES, unit "layer_norm") that reproduce `user_out`: each mistake
    alone, then those that combine together (the Annotated Transformer's LayerNorm, x.std() + eps, makes two)."""
    site = MK.Site(x.shape[-1], x.shape[-1])
    alone = _formatted(MK.variants("layer_norm", site), eps=eps)
    for combination in [[v] for v in alone] + [_formatted(MK.variants("layer_norm", site, combining=True), eps=eps)]:
        knobs = {k: v for _, _, variant in combination for k, v in variant.items()}
        error = _match(user_out, VR.layer_norm(x, weight, bias, eps, **knobs), valid, None)
        if error <= MATCH:
            return [Diagnosis(vid, message, where, error) for vid, message, _ in combination]
    return []


def match_rms_norm(user_out, x, weight, eps, where, valid=None) -> list:
    """The RMSNorm variants (mistakes.MISTAKES, unit "rms_norm") that reproduce `user_out`."""
    for vid, message, knobs in _formatted(MK.variants("rms_norm", MK.Site(x.shape[-1], x.shape[-1])), eps=eps):
        error = _match(user_out, VR.rms_norm(x, weight, eps, **knobs), valid, None)
        if error <= MATCH:
            return [Diagnosis(vid, message, where, error)]
    return []


def match_gated(user_out, x, params, activation, where, valid=None) -> list:
    """The gated feed-forward's variants (unit "gated_feed_forward"), e.g. the activation on the up projection."""
    site = MK.Site(x.shape[-1], x.shape[-1])
    for vid, message, knobs in _formatted(MK.variants("gated_feed_forward", site), activation=activation):
        error = _match(user_out, VR.gated_feed_forward(params, x, activation, **knobs), valid, None)
        if error <= MATCH:
            return [Diagnosis(vid, message, where, error)]
    return []


def match_embedding(user_x, ids, table, positions, D, where, valid=None, scale_expected=True) -> list:
    """Variants of the embedding sum scale * E[ids] + P[:T] (units "embedding" and "positions"): a wrong scale,
    a wrong position table, or both."""
    site = MK.Site(D, D)
    scales = [("", "", math.sqrt(D) if scale_expected else 1.0)]
    scales += [(vid, message, knobs["scale"]) for vid, message, knobs in MK.variants("embedding", site)]
    tables = [("", "", positions)]
    if positions is not None:
        options = VR.sinusoid_tables(len(positions), D)
        tables += [(vid, message, options[knobs["table"]]) for vid, message, knobs in MK.variants("positions", site)]
    found = []
    T = ids.shape[1]
    for sid, scale_message, scale in scales:
        for tid, table_message, pos in tables:
            if not sid and not tid:
                continue
            error = _match(user_x, scale * table[ids] + (0.0 if pos is None else pos[:T]), valid, None)
            if error <= MATCH:
                named = ((sid, scale_message), (tid, table_message))
                found += [Diagnosis(vid, message, where, error) for vid, message in named if vid]
    return found


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
    result.diagnoses.append(
        Diagnosis(
            "dropout.active_in_eval",
            f"two evaluation-mode calls differ by {error:.2e}: dropout runs with training=True (F.dropout's default)",
            where,
            error,
        )
    )
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
        if (~torch.isfinite(out)).sum() > before:
            result.diagnoses.append(
                Diagnosis(
                    "attention.no_max_subtraction",
                    f"with scores of ~{BIG**2:.0e} the output holds {int((~torch.isfinite(out)).sum()) - before} more "
                    "inf/NaN in float32; the reference's softmax (row maximum subtracted) stays finite",
                    where,
                    math.inf,
                )
            )
            return


def _attention_calls_scaled(session, caller) -> list:
    """(user module path, output) of each attention submodule called again with its float inputs scaled by BIG."""
    targets = hook_targets(session.links, _modules(session))
    targets = {u: p for u, p in targets.items() if unit_kind(session.links, u) == "attention"}
    module = session.copy(np.float32)
    modules = dict(module.named_modules())
    captured, handles = {}, []
    for unit, path in targets.items():
        if path in modules and path:
            handles.append(
                modules[path].register_forward_hook(
                    lambda m, a, k, o, unit=unit: captured.setdefault(unit, (m, a, k)) and None, with_kwargs=True
                )
            )
    try:
        session.run_user(caller, np.float32)
    finally:
        for h in handles:
            h.remove()
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


def unit_kind(links, unit: str) -> str | None:
    for link in links:
        for ref, _ in link.parts:
            if unit_of(ref)[0] == unit:
                return unit_of(ref)[1]
    return None


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


def _layer_norm_variants(session, p, user, cfg) -> list:
    eps = next(iter(session.norm_eps.values()), None) or cfg.layer_norm_eps
    return match_norm(user, p.floats["x"], session.params["weight"], session.params["bias"], eps, "")


def _rms_norm_variants(session, p, user, cfg) -> list:
    return match_rms_norm(user, p.floats["x"], session.params["weight"], cfg.layer_norm_eps, "")


def _gated_variants(session, p, user, cfg) -> list:
    return match_gated(user, p.floats["x"], session.params, cfg.activation, "")


def _embedding_variants(session, p, user, cfg) -> list:
    table = session.params["token_embedding.weight"]
    return match_embedding(user, p.ids["ids"], table, None, cfg.d_model, "", scale_expected=cfg.scale_embeddings)


def _positions_variants(session, p, user, cfg) -> list:
    if cfg.positional == "learned":
        return []
    x = p.floats["x"]
    tables = VR.sinusoid_tables(cfg.max_len, cfg.d_model)
    for vid, message, knobs in MK.variants("positions", MK.Site(cfg.d_model, cfg.d_head)):
        error = _match(user, x + tables[knobs["table"]][: x.shape[1]], None, None)
        if error <= MATCH:
            return [Diagnosis(vid, message, "", error)]
    return []


# a component's catalogue variants, by its unit (level_table.Level.unit): (session, probe, user output, cfg) -> list
COMPONENT_VARIANTS = {
    "heads": _heads_variants,
    "attention": _attention_variants,
    "layer_norm": _layer_norm_variants,
    "rms_norm": _rms_norm_variants,
    "gated_feed_forward": _gated_variants,
    "embedding": _embedding_variants,
    "positions": _positions_variants,
}


def _component_variants(session, caller, cfg) -> list:
    match = COMPONENT_VARIANTS.get(session.entry.unit)
    if match is None:
        return []
    user, _ = session.run_user(caller, np.float64)
    return match(session, session.probe(caller), _np(user), cfg)


# -- layers and models: hooks, the first divergence, and the variants there -------------------------------------


def unit_of(ref: str) -> tuple[str, str]:
    """(unit prefix, kind) of a reference tensor name: attention, ffn, norm or table."""
    base = ref.rsplit(".", 1)[0]
    last = base.rsplit(".", 1)[-1]
    if last in ("q_proj", "k_proj", "v_proj", "out_proj"):
        return base.rsplit(".", 1)[0] if "." in base else "", "attention"
    if last in ("linear1", "linear2", "gate"):
        return base.rsplit(".", 1)[0] if "." in base else "", "ffn"
    if last.endswith("embedding"):
        return base, "table"
    return base, "norm"


def _lca(paths: list) -> str:
    split = [p.split(".") if p else [] for p in paths]
    common = []
    for parts in zip(*split, strict=False):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return ".".join(common)


def _module_path(user_name: str) -> str:
    return user_name.rsplit(".", 1)[0] if "." in user_name else ""


def _inside(path: str, owner: str) -> bool:
    return owner == "" or path == owner or path.startswith(owner + ".")


def _modules(session) -> dict:
    return dict(session.user.named_modules()) if session.is_module else {}


def hook_targets(links, modules: dict | None = None) -> dict:
    """reference unit (or layer) prefix -> the user's module path that computes exactly it (the deepest module
    holding all its parameters and none of another unit's, and one that runs: a ModuleList or ModuleDict, such as
    the Annotated Transformer's `linears`, is never called, so its owner is taken); units without one are left
    out. `modules`: the user's named modules, to tell containers."""
    paths = {}
    for link in links:
        for ref, _ in link.parts:
            unit, _ = unit_of(ref)
            paths.setdefault(unit, set()).add(_module_path(link.user))
            parts = unit.split(".")
            for i in range(len(parts)):
                if parts[i] == "layers" and i + 1 < len(parts):
                    paths.setdefault(".".join(parts[: i + 2]), set()).add(_module_path(link.user))
    targets = {}
    for unit, own in paths.items():
        owner = _lca(sorted(own))
        while owner and isinstance((modules or {}).get(owner), (nn.ModuleList, nn.ModuleDict)):
            owner = owner.rsplit(".", 1)[0] if "." in owner else ""
        others = [
            p
            for u, ps in paths.items()
            if u != unit and not u.startswith(unit + ".") and not unit.startswith(u + ".")
            for p in ps
        ]
        if not any(_inside(p, owner) for p in others):
            targets[unit] = owner
    for unit, path in _out_projections(links).items():
        if unit not in targets and isinstance((modules or {}).get(path), nn.Linear):
            targets[unit] = path  # its output is the attention's (BERT's attention.output.dense beside the norm)
    return targets


def _out_projections(links) -> dict:
    """attention unit -> the user's module path of its output projection."""
    found = {}
    for link in links:
        for ref, _ in link.parts:
            if ref.rsplit(".", 2)[-2:-1] == ["out_proj"]:
                found[unit_of(ref)[0]] = _module_path(link.user)
    return found


def attention_place(links, unit: str, target: str) -> str:
    """Where an attention unit's divergence is named: its hooked module, or, where only its output projection
    could be hooked (the projection's module sits beside another unit's, as BERT's attention.output holds the
    dense layer and the LayerNorm), the module holding its q, k and v projections (BERT's attention.self)."""
    if _out_projections(links).get(unit) != target:
        return target
    inputs = {
        _module_path(link.user)
        for link in links
        for ref, _ in link.parts
        if unit_of(ref) == (unit, "attention") and ".out_proj." not in ref
    }
    return _lca(sorted(inputs)) or target


def model_stages(session, cfg, caller):
    """The reference's stages in forward order for a layer or a model: (unit prefix, kind, inputs, output, valid,
    extra) with extra the masks the attention read."""
    entry, params = session.entry, session.params
    p = session.probes[(False, False)]
    stages = []
    if entry.group == "layer":
        decoder = entry.causal  # a causal self-attention
        x, memory = p.floats["x"], p.floats.get("memory")
        self_keep = LV.keep_mask(p, "self") if decoder else LV.keep_mask(p, "src")
        trace = LV.layer_trace(params, x, memory, self_keep, LV.keep_mask(p, "cross"), cfg, decoder)
        for unit, kind, inputs, out in trace:
            stages.append((unit, kind, inputs, out, p.valid, _masks(unit, decoder, p)))
        return stages
    if entry.activations is not None:  # a stack composed from the reference's pairs
        acts = entry.activations(params, p, cfg)
    else:  # a whole model: its object's
        acts = LV.run_reference(entry.name, params, p, cfg, np.float64)[1].model.activations()
    for stack in entry.stacks:
        stages += _stack_stages(entry, stack, p, params, cfg, acts)
    return stages


def _stack_stages(entry, stack: str, p, params: dict, cfg, acts: dict) -> list:
    """One stack's stages: its embeddings (a model's; BERT's embedding norm before them), then, layer by layer,
    the units inside the layer and the layer's output. A stack of layers on embeddings starts from its input."""
    stages: list = []
    if entry.group == "model":
        first = acts[f"{stack}.embedding"]
        stages += _embedding_stages(stack, p, params, cfg, acts)
    else:
        first = p.floats[entry.inputs[0]]
    valid = p.src_keep if stack == "encoder" else p.tgt_keep
    decoder = stack == "decoder"
    memory = acts.get("encoder") if entry.cross and decoder else None
    n = cfg.n_encoder_layers if stack == "encoder" else cfg.n_decoder_layers
    for i in range(n):
        x = first if i == 0 else acts[f"{stack}.layers.{i - 1}"]
        layer = M.sub(params, f"{stack}.layers.{i}")
        self_keep = np.tril(np.ones((x.shape[1],) * 2, bool))[None, None] if decoder else _pad(p.src_keep)
        trace = LV.layer_trace(layer, x, memory, self_keep, _pad(p.src_keep), cfg, decoder)
        for unit, kind, inputs, out in trace:
            masks = _masks(unit, decoder, p)
            stages.append((f"{stack}.layers.{i}.{unit}", kind, inputs, out, valid, masks))
        stages.append((f"{stack}.layers.{i}", "layer", (x,), acts[f"{stack}.layers.{i}"], valid, None))
    return stages


def _embedding_stages(stack: str, p, params: dict, cfg, acts: dict) -> list:
    """A model stack's embedding stage, after BERT's embedding norm's."""
    stages = []
    valid = p.src_keep if stack == "encoder" else p.tgt_keep
    ids = p.ids["src"] if stack == "encoder" and "src" in p.ids else (p.ids.get("tgt", p.ids.get("ids")))
    if stack == "encoder" and cfg.embedding_norm:  # BERT's: the summed embeddings normed, before the layers
        summed = R.summed_embeddings(M.sub(params, stack), ids, cfg)
        stages.append((f"{stack}.embedding_norm", "norm", (summed,), acts[f"{stack}.embedding"], valid, None))
    stages.append((f"{stack}.embedding", "embedding", (ids, stack), acts[f"{stack}.embedding"], valid, None))
    return stages


def _pad(keep):
    return None if keep is None else keep[:, None, None, :]


def _masks(unit: str, decoder: bool, p) -> dict | None:
    if not unit.endswith("attn"):
        return None
    if unit.endswith("self_attn") and decoder:
        return {"causal": True, "pad": _pad(p.tgt_keep), "swap": _pad(p.src_keep)}
    return {"self_attention": unit.endswith("self_attn")}


def capture(session, caller) -> dict:
    """Run the user's float64 copy once with forward hooks on the modules hook_targets finds; unit -> (args, out)."""
    targets = hook_targets(session.links, _modules(session))
    module = session.copy(np.float64)
    modules = dict(module.named_modules())
    captured, handles = {}, []
    for unit, path in targets.items():
        if path in modules:
            handles.append(
                modules[path].register_forward_hook(
                    lambda m, a, o, unit=unit: captured.setdefault(unit, (a, o)) and None
                )
            )
    try:
        session.run_user(caller, np.float64)
    finally:
        for h in handles:
            h.remove()
    return captured


def scan(session, caller, cfg, captured) -> tuple:
    """(number of stages that agree before the first that diverges, that stage, the user's output there, error);
    the stage is None when every hooked stage agrees."""
    done = 0

    def batch_first(t):
        t = _np(t)
        return t if caller.batch_first or t.ndim < 3 else t.transpose(1, 0, 2)

    key = repr(cfg)
    cache = session.__dict__.setdefault("stages", {})
    if key not in cache:
        cache[key] = model_stages(session, cfg, caller)
    for stage in cache[key]:
        unit, kind, inputs, ref_out, valid, masks = stage
        if kind == "embedding":
            layer0 = unit.split(".")[0] + ".layers.0"
            args = captured.get(layer0, ((),))[0]
            if not args:
                continue
            user = batch_first(args[0])
        elif unit in captured:
            user = batch_first(captured[unit][1])
        else:
            continue
        if user.shape != ref_out.shape:
            continue
        with np.errstate(all="ignore"):
            error = _match(user, ref_out, valid, None)
        if error > 1e-10:
            return done, stage, user, error
        done += 1
    return done, None, None, 0.0


def first_divergence(session, caller, cfg, result, captured=None) -> None:
    """The first reference stage whose user output leaves the bar (hooks), and the variants that explain it."""
    captured = capture(session, caller) if captured is None else captured
    _, stage, user_out, error = scan(session, caller, cfg, captured)
    if stage is None:
        return
    unit, kind, inputs, ref_out, valid, masks = stage
    targets = hook_targets(session.links, _modules(session))
    if kind == "embedding":
        stack = unit.split(".")[0]
        where = _table_module(session, f"{stack}.token_embedding.weight") or f"the {stack}'s embeddings"
        result.first_divergence = where
        positions = None
        if cfg.positional == "sinusoidal":
            positions = VR.sinusoid_tables(cfg.max_len, cfg.d_model)[cfg.sinusoid_layout]
        elif cfg.positional == "learned":
            positions = session.params[f"{stack}.position_embedding.weight"]
        table = session.params.get(
            f"{stack}.token_embedding.weight", session.params.get("decoder.token_embedding.weight")
        )
        found = match_embedding(user_out, inputs[0], table, positions, cfg.d_model, where, valid, cfg.scale_embeddings)
        tables = [name.rsplit(".", 1)[0] for name in session.overwrite if "." in name]
        for d in found:  # wrong frequencies sit in the module that keeps the fixed table, not the token table
            if d.id == "positions.wrong_frequencies" and tables:
                d.where = result.first_divergence = max(tables, key=lambda t: len(_lca([t, where])))
            elif d.id.startswith("embedding.") and session.is_module:  # the scale: in the table's own wrapper
                d.where = result.first_divergence = _scaling_module(session, where)
    else:
        where = targets[unit] or "(the module)"
        if kind == "attention":
            where = attention_place(session.links, unit, where)
        result.first_divergence = where
        if kind == "attention":
            params = M.sub(session.params, unit) if unit else session.params
            query, kv, keep = inputs
            context = masks or {}
            if context.get("causal"):  # a decoder's self-attention: its causal and padding masks, maybe swapped
                options = dict(causal=True, pad=context["pad"], swap=context["swap"])
            else:
                options = dict(self_attention=context.get("self_attention", True))
            rope = VR.rope_knobs(cfg, rotary=unit.endswith("self_attn"))
            found = match_attention(user_out, params, query, kv, cfg.n_heads, keep, where, valid, **rope, **options)
        elif kind == "norm" and cfg.norm == "rms":
            eps = session.norm_eps.get(where, None) or cfg.layer_norm_eps
            found = match_rms_norm(user_out, inputs[0], session.params[f"{unit}.weight"], eps, where, valid)
        elif kind == "norm":
            eps = session.norm_eps.get(where, None) or cfg.layer_norm_eps
            found = match_norm(
                user_out,
                inputs[0],
                session.params[f"{unit}.weight"],
                session.params.get(f"{unit}.bias", 0.0),
                eps,
                where,
                valid,
            )
        elif kind == "ffn" and cfg.gated_ffn:
            found = match_gated(user_out, inputs[0], M.sub(session.params, unit), cfg.activation, where, valid)
        else:
            found = []
    result.diagnoses += found
    if not found:
        result.unexplained = (
            f"{where} (reference {unit or session.level}) diverges with relative error "
            f"{error:.2e}; not expressible by the config and no catalogue variant reproduces it"
        )
        if error < 1e-5:  # float32's rounding, in a float64 run
            result.unexplained += (
                "; an error this small is typically float32 rounding: the submodule may compute in float32 inside "
                "a float64 model (an upcast such as .float(), or transformers' RMSNorm and rotary tables)"
            )


def latest_divergence(session, runnable: list) -> tuple:
    """Among (caller, config) pairs, the one whose first divergence comes latest (the mistake is in one place; the
    conventions and config are right everywhere before it); of those that tie, the first whose divergence a
    catalogue variant explains, else the one closest there. Returns (caller, config)."""
    scored = []
    for layout in session.layouts:  # the weight maps too: RoPE's pairing, gate and up
        session.use(layout)
        for caller in runnable:
            captured = capture(session, caller)
            for cfg in session.config_candidates():
                done, _, _, error = scan(session, caller, cfg, captured)
                scored.append((-done, error, len(scored), caller, cfg, captured, layout))
    scored.sort(key=lambda s: s[:3])
    tied = [s for s in scored if s[0] == scored[0][0]]
    for _, _, _, caller, cfg, captured, layout in tied:
        session.use(layout)
        trial = Result(reference=session.level)
        first_divergence(session, caller, cfg, trial, captured)
        if trial.diagnoses:
            return caller, cfg
    session.use(tied[0][6])
    return tied[0][3], tied[0][4]


def _scaling_module(session, path: str) -> str:
    """The module that scales the token table at `path`: the table's nearest wrapper holding no tensor but the
    table (the Annotated Transformer's Embeddings around its nn.Embedding `lut`), else the table's own module."""
    modules = dict(session.user.named_modules())
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


def _table_module(session, ref_name: str) -> str | None:
    for link in session.links:
        if any(n == ref_name for n, _ in link.parts):
            return _module_path(link.user) or link.user
    return None


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
