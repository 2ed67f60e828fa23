"""One check's stages, each returned by a function: the recording (the user's module read once and its forward
recorded once: `recording`), the model it implies (config, weight map, biases held at zero, fixed tables:
`inferred`, a frozen Model), the weight maps it may be judged under (`layouts`, frozen Layouts); and the Session
holding them with the reference's weights and probes, the ways of calling the module and its float64 and float32
copies. judge.choose picks the convention, config and layout (a frozen Choice) and judges under them."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from numpy_transformer import TransformerConfig

from . import calling as C
from . import dataflow as DF
from . import example as EX
from . import levels as LV
from . import mapping as MP
from . import probes as PR
from . import tables as TB
from . import units as U
from . import weight_map as WM
from .levels import LEVELS
from .running import Float32Islands, copy_module, find_islands, lifted, output_head

TORCH = {np.float64: torch.float64, np.float32: torch.float32}
# the activations searched, in order, for a gated feed-forward (SwiGLU's silu first) and for a plain one
ACTIVATIONS = {
    True: ("silu", "gelu", "gelu_tanh", "relu", "quick_gelu"),
    False: ("relu", "gelu", "gelu_tanh", "silu", "quick_gelu"),
}


class Session:
    """One check: the level, the user's module, its map, config candidates, probe and chosen convention."""

    def __init__(self, user, level, given, mapping, call, batch_first, mask, seed, example=None):
        """The module read (its roles, config and map). What the judge cannot read raises, and check.module
        answers it as "could not judge: ...; pass ..." or, for math the reference lacks, as Result.unsupported."""
        self.user, self.level, self.seed, self.mask_given, self.given = user, level, seed, mask, given
        self.entry = entry = LEVELS[level]
        self.notes: list = []
        self.is_module = isinstance(user, nn.Module)
        mapped = WM.links_from(mapping) if mapping is not None else None  # read first: nothing dealt refuses it
        # the probe's batch and lengths: the example's where one is given
        self.sizes = EX.sizes(user, level, example, batch_first) if example is not None else PR.SIZES
        found = recording(
            user, level, given, seed, self.sizes, batch_first=batch_first, mask=mask, call=call, example=example
        )
        self.flow = found.flow
        self.model = inferred(user, level, found, given, mapped, self.notes)
        self.shapes = entry.shapes(self.model.cfg)
        self.params = LV.init_reference(self.shapes, np.random.default_rng(seed), self.model.zero)
        if mapped is not None and self.is_module:  # a given map: every name it holds exists, every size agrees
            tensors = dict(user.named_parameters(remove_duplicate=False)) | dict(user.named_buffers())
            WM.refuse_unknown(self.model.links, self.model.zero, self.params, tensors, level)
        kinds = [(False, False)] + ([(True, False), (True, True)] if entry.self_attention_probes else [])
        rng = np.random.default_rng
        self.probes = {key: entry.probe(self.model.cfg, rng(seed + 1), *key, sizes=self.sizes) for key in kinds}
        self.callers = callers_of(user, level, batch_first, mask, call, example)
        self.copies: dict = {}  # (id of the layout, dtype) -> the user's module copied, loaded under that layout
        self.islands = None  # the submodules that compute in float32 inside the float64 copy (find_islands)
        self.stages: dict = {}  # the reference's stages of a layer or a model, by config and probe (divergence.py)
        self.head = output_head(user, self.model.links) if self.is_module and entry.group == "model" else None
        self.layouts = layouts(self, mapping is None)
        self.layout = self.layouts[0]

    def probe(self, caller) -> LV.Probe:
        """The probe `caller` is run on: cross-attention, self-attention, or causal self-attention; without the
        keys' padding where the caller passes no mask to a layer or component (nothing it is given could hide it:
        a vision block, an attention without a mask argument). A model builds its masks from the ids' padding."""
        key = (caller.self_attention, caller.causal)
        if caller.masks or caller.call is not None or self.entry.group == "model" or self.probes[key].src_keep is None:
            return self.probes[key]
        p = self.probes[key]
        unpadded = dataclasses.replace(p, src_keep=None, valid=None if p.valid is p.src_keep else p.valid)
        return self.probes.setdefault(key + ("unpadded",), unpadded)

    def under(self, layout: Layout) -> Session:
        """This check under `layout` (one of self.layouts): a view sharing everything else (the probes, the copies
        kept per layout, the stages); the session itself under its own layout."""
        if layout is self.layout:
            return self
        view = copy.copy(self)
        view.layout = layout
        return view

    @property
    def links(self) -> list:
        """The weight map judged under: the layout's."""
        return self.layout.links

    def copy(self, dtype):
        """The user's module (a deep copy) in `dtype`, evaluation mode, holding the reference's weights."""
        key = (id(self.layout), dtype)
        if self.is_module and key not in self.copies:
            module = copy_module(self.user).to(TORCH[dtype]).eval()
            for t in module.parameters():  # frozen ones too (loaded for inference): every gradient is compared
                t.requires_grad_(True)
            MP.load(module, self.links, self.params, TORCH[dtype])
            tensors = dict(module.named_buffers()) | dict(module.named_parameters())
            with torch.no_grad():
                for name, table in (self.model.overwrite | self.model.rope_overwrite).items():
                    if name in tensors:
                        tensors[name].copy_(torch.from_numpy(table.reshape(tensors[name].shape)).to(TORCH[dtype]))
                    elif dtype == np.float64:  # a plain tensor attribute (.to() leaves it): replaced, widened
                        path, _, attr = name.rpartition(".")
                        owner = module.get_submodule(path)
                        old = getattr(owner, attr)  # the table is float64 or complex128 already
                        setattr(owner, attr, torch.from_numpy(table.reshape(old.shape)).to(old.device))
            self.copies[key] = module
        return self.copies.get(key, self.user)  # a plain function: itself

    def config_candidates(self) -> list:
        """The configs the user's module may be: the inferred one, and what the shapes cannot tell (pre- or
        post-norm, the activation, the embedding scale) varied where the caller did not fix it."""
        base = self.model.cfg
        options: list = [{}]
        given = self.stated()
        if "norm_first" in self.entry.searches and "norm_first" not in given:
            final_norms_tell = self.entry.final_norms == "pre-norm"  # a final norm only when pre-norm
            flow_tells = self.flow is not None and self.flow.norm_first is not None  # where the sums are normed
            norm_first = [base.norm_first] if final_norms_tell or flow_tells else [False, True]
            options = [o | {"norm_first": v} for o in options for v in norm_first]
        if "activation" in self.entry.searches and "activation" not in given:
            options = [o | {"activation": a} for o in options for a in ACTIVATIONS[base.gated_ffn]]
        rope = self.rope_options(given)
        options = [o | r for o in options for r in rope or [{}]]
        if "scale_embeddings" in self.entry.searches and "scale_embeddings" not in given:
            scales = (False, True) if rope and rope[0].get("positional") == "rope" else (True, False)
            options = [o | {"scale_embeddings": s} for o in options for s in scales]
        if self.entry.output_head and base.tie_embeddings and "output_scale" not in given:
            # the paper's sharing may scale the tied logits by d_model^-0.5 instead of the embeddings by sqrt(d)
            options = options + [o | {"output_scale": base.d_model**-0.5} for o in options]
        return [dataclasses.replace(base, **o) for o in options]

    def stated(self) -> dict:
        return stated(self.given)

    def rope_options(self, given: dict) -> list:
        """Rotary positions at each base the module states (and 10000), where nothing else gives positions: an
        attention, or a model without position tables. Tried first when the module keeps RoPE tables or a base."""
        own_table = self.entry.group == "model" and (
            self.model.cfg.positional == "learned" or self.model.overwrite
        )  # not rotary
        if not self.model.thetas or not self.entry.rope or own_table or given.get("positional") not in (None, "rope"):
            return []
        thetas = [given["rope_theta"]] if "rope_theta" in given else self.model.thetas
        rope = [{"positional": "rope", "rope_theta": float(t)} for t in thetas]
        if given.get("positional") == "rope":
            return rope
        return rope + [{}] if self.model.rope_overwrite or len(self.model.thetas) > 1 else [{}] + rope

    def run_user(self, caller, dtype, grad=False, scale=1.0, probe=None):
        """The user's output (batch-first) on `probe` (by default the caller's, Session.probe), and the input
        tensors (for gradients). In float64 a module with float32 islands runs them in float64 (Float32Islands):
        they are found on its first float64 run that completes."""
        p, module = probe or self.probe(caller), self.copy(dtype)
        if dtype != np.float64 or not self.is_module:
            return self._run(module, caller, p, dtype, grad, scale)
        if self.islands is None:
            self.islands = find_islands(module, lambda: self._run(module, caller, p, dtype))
        with Float32Islands(module) if self.islands else contextlib.nullcontext():
            return self._run(module, caller, p, dtype, grad, scale)

    def _run(self, module, caller, p: LV.Probe, dtype, grad=False, scale=1.0):
        """The module called by `caller` on probe `p`, as written (see run_user)."""
        device = next(iter(module.parameters()), torch.empty(0)).device if self.is_module else torch.device("cpu")
        tensors = as_tensors(p, TORCH[dtype], device, grad, scale)
        with torch.set_grad_enabled(grad), lifted(torch.no_grad):  # a forward under no_grad records its gradients
            out = caller(module, tensors, p, TORCH[dtype])
            ids = p.ids.get("tgt", p.ids.get("ids"))
            if self.entry.output_head and out.ndim == 2 and ids is not None and out.shape[0] == ids.size > len(ids):
                out = out.reshape(*ids.shape, -1)  # logits flattened to (B * T, V), as a loss takes them
            if self.head is not None and out.shape[-1] == self.model.cfg.d_model != self.model.cfg.tgt_vocab_size:
                out = module.get_submodule(self.head)(out)  # hidden states out: the model's own head applied
        return out, tensors


def stated(given: dict) -> dict:
    """What the caller fixed: the keyword fields, and every field of a config= given."""
    return given | (vars(given["config"]) if given.get("config") is not None else {})


@dataclass(frozen=True)
class Model:
    """The model the recording implies: its config; its weight map (links, mapping.Link), the reference biases the
    user's linears lack held at zero (`zero`); each norm module's eps; the fixed tables overwritten in float64
    (sinusoids: `overwrite`, `wrong_table` where their frequencies are wrong; RoPE's: `rope_overwrite`) and the
    RoPE bases the module states (`thetas`)."""

    cfg: TransformerConfig
    links: list
    zero: list
    norm_eps: dict
    overwrite: dict
    wrong_table: bool
    rope_overwrite: dict
    thetas: list


def inferred(user, level: str, found: MP.Structure, given: dict, mapped, notes: list) -> Model:
    """The Model of the user's module as `found` reads it (units.infer), with its fixed tables (tables.py, whose
    notes go to `notes`); `mapped`: the (links, zero) of a mapping= given."""
    entry, is_module = LEVELS[level], isinstance(user, nn.Module)
    cfg, links, zero, fixed = U.infer(level, found, given, mapped)
    overwrite, layout, wrong_table = TB.fixed_tables(user, fixed, notes) if is_module else ({}, None, False)
    if layout is not None:
        cfg = dataclasses.replace(cfg, sinusoid_layout=layout)
    rope_overwrite: dict = {}
    thetas: list = []
    if is_module and entry.heads and entry.group != "stacks":  # RoPE tables read (and overwritten)
        bases = TB.rope_thetas(user, cfg.d_head, given.get("rope_theta"))  # the caller's base first
        rope_overwrite, thetas = TB.rope_buffers(user, cfg.d_head, bases, notes)
        rotary = TB.rotary_dim(user, cfg.d_head)  # partial rotary: read from the inverse frequencies
        if rotary is not None and "rotary_dim" not in stated(given):
            cfg = dataclasses.replace(cfg, rotary_dim=rotary)
    norm_eps = {n.module: n.eps for n in found.norms}
    return Model(cfg, links, zero, norm_eps, overwrite, wrong_table, rope_overwrite, thetas)


@dataclass(frozen=True)
class Layout:
    """A weight map the user's module may be judged under: its links (mapping.Link), and the RoPE pairing it reads
    the q and k rows in, where rotary positions may be used (None: not in question)."""

    links: list
    rope_pairing: str | None = None


def layouts(session, inferred: bool) -> list:
    """The Layouts the user's module may be judged under: the inferred one and, where rotary positions may be used,
    the same with the q and k rows in RoPE's interleaved pairing (Meta's (2i, 2i + 1) instead of the reference's
    halves (i, i + Dh/2): the same rotation with the features of every head in another order). The check keeps the
    first under which the module agrees with the reference."""
    Dh = session.model.cfg.d_head
    links = session.model.links
    paired = any(MP.rope_paired(n, 2) for link in links for n, _ in link.parts)
    if not inferred or not session.is_module or not session.rope_options(session.stated()) or Dh % 2 or not paired:
        return [Layout(links)]
    halves = "halves (i, i + Dh/2), as Hugging Face's rotate_half (the reference's)"
    pairs = "interleaved pairs (2i, 2i + 1), as Meta's code: q and k rows read in that order, head by head"
    return [Layout(links, halves), Layout(MP.interleave_rope(links, Dh, session.model.cfg.rotary_dim or 0), pairs)]


def callers_of(module, level: str, batch_first=None, mask=None, call=None, example=None) -> list:
    """The candidate calls of `module` at `level`: as the example calls it where one is given (example.callers),
    else calling.callers."""
    if example is not None:
        return EX.callers(module, level, example, batch_first)
    return C.callers(module, level, batch_first, mask, call)


def recording(user, level: str, given: dict, seed: int, sizes: PR.Sizes, **conventions) -> MP.Structure:
    """The user's module read once (mapping.structure) and its forward recorded once (read_flow): a model holding
    tables on small ids (under at most 16 conventions: a has_mask flag), else, where the roles are read from the
    computation, on the level's probe at the sizes its parameters give (sized_config). Not a module: nothing read."""
    if not isinstance(user, nn.Module):
        return MP.Structure()
    entry, found, flow, raised = LEVELS[level], MP.structure(user), None, ""
    if entry.group == "model" and found.tables:
        ids = _ids_probe(level, found, sizes.B)
        flow, raised = read_flow(user, level, lambda caller: ids, 16, call=conventions["call"])
    recorded = entry.heads or entry.unit in ("feed_forward", "gated_feed_forward", "rms_norm", "layer_norm")
    if flow is None and recorded:
        sized = U.sized_config(level, found, given)

        def probe(caller):  # self-attention callers: one sequence
            return entry.probe(sized, np.random.default_rng(seed + 1), caller.self_attention, caller.causal, sizes)

        flow, raised = read_flow(user, level, probe, **conventions)
    found.unrecorded = raised
    return found if flow is None else MP.with_flow(found, user, flow)


def read_flow(user, level: str, probe_of, limit: int | None = None, **conventions) -> tuple:
    """The user's forward recorded (dataflow.record), on a copy, under the first of its conventions (calling.callers,
    at most `limit` tried) that runs, on `probe_of(caller)`: (its Flow, ""), or (None, what the last try raised, or
    "" where nothing was tried) where none runs (the check proper then says why). Gradients stay on: torch's fused
    inference paths (nn.TransformerEncoderLayer's) hide the ops."""
    model = copy_module(user).eval()
    weight = next(model.parameters(), None)
    if weight is None:
        return None, ""
    try:
        callers = callers_of(model, level, **conventions)[:limit]
    except (TypeError, ValueError):  # a forward that cannot take the level's inputs: the check proper says so
        return None, ""
    raised = ""
    for caller in callers:
        probe = probe_of(caller)
        tensors = as_tensors(probe, weight.dtype, weight.device)
        try:  # only a run that completes is read: a convention the model does not take leaves half a graph
            rec = DF.record(lambda: caller(model, tensors, probe, weight.dtype), model)  # noqa: B023
        except Exception as error:  # a convention the module does not take; the check proper reports it
            raised = f"{type(error).__name__}: {str(error)[:200]}"
            continue
        return DF.read(rec.nodes), ""
    return None, raised


def as_tensors(p: LV.Probe, dtype, device, grad: bool = False, scale: float = 1.0) -> dict:
    """The probe's inputs as tensors on `device`: its floats (times `scale`) in `dtype`, its ids as longs."""
    floats = {n: torch.tensor(v * scale, dtype=dtype, device=device, requires_grad=grad) for n, v in p.floats.items()}
    return floats | {n: torch.tensor(v, dtype=torch.long, device=device) for n, v in p.ids.items()}


def _ids_probe(level: str, found, B: int) -> LV.Probe:
    """A model's probe: small ids (T at most 6) for each of the level's inputs (a memory: floats), nothing
    padded: no id is a table's padding_idx (RoBERTa numbers its positions from the ids that are not padding)."""
    rows = min((t.rows for t in found.tables if t.rows > 4), default=min(t.rows for t in found.tables))
    T = min(6, rows)  # rows: the smallest table's beyond a handful (BERT's two token types are not the vocabulary)
    low = max([t.padding_idx + 1 for t in found.tables if t.padding_idx is not None and t.padding_idx < 4] + [1])
    probe = LV.Probe(src_keep=np.ones((B, T), bool), tgt_keep=np.ones((B, T), bool))
    ids = np.random.default_rng(0).integers(low, max(rows, low + 1), size=(B, T))
    probe.ids = dict.fromkeys(LEVELS[level].inputs, ids)
    if probe.ids.pop("memory", None) is not None:  # the decoder's memory is a float input
        probe.floats = {"memory": np.random.default_rng(1).standard_normal((B, T, found.tables[0].width))}
    return probe
