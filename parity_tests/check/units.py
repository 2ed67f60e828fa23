"""The user's module read as the reference's units, and the config they imply.

`infer(level, found, given)` returns the config the user's module is judged as and the links (mapping.Link) from
every user parameter to the reference's tensors. Every unit comes from the recorded forward (dataflow.Flow): each
attention's projections (separate, fused, or one per head), each feed-forward block's, the layers and norms in the
order they run; the sizes from the shapes. Reference biases the user's linears lack are returned as `zero`: held
at zero, their gradients not compared.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field

import numpy as np

from numpy_transformer import TransformerConfig

from . import dataflow as DF
from . import tables as TB
from .levels import LEVELS
from .mapping import NORMING, Link, Piece, Table, role_of
from .unsupported import NoPair, clamped_scores, reference_alibi, t5_relative

ROLES = ("q", "k", "v", "out")


@dataclass
class Units:
    """The user's pieces as the reference's units: sizes (d_model D, heads H, d_ff F, the k/v width kv), the
    attentions ({"q", "k", "v", "out": [Piece]}) and feed-forward blocks ([(gate,) in, out]) in the order they run."""

    D: int
    H: int
    F: int
    kv: int
    Dh: int  # a head's width, as the flow reads it or head_dim= says (0: D / H)
    attentions: list = field(default_factory=list)
    blocks: list = field(default_factory=list)
    gated: bool = False
    out_piece: Piece | None = None
    token_tables: list = field(default_factory=list)
    position_tables: list = field(default_factory=list)
    type_table: Table | None = None
    norms: list = field(default_factory=list)
    n_enc: int = 0
    n_dec: int = 0
    layer_norms: int = 0
    embedding_norm: bool = False
    first_attn_norm: bool = True  # False: the first encoder layer's attention reads the stream itself (ModernBERT's)
    parallel: bool = False  # Phi-2's, GPT-J's, GPT-NeoX's parallel layers: attention and feed-forward side by side
    shared_norm: bool = False  # the parallel block's one norm (Phi-2's), read by both
    sandwich: bool = False  # Gemma's norms after each sublayer too (OLMo 2's: only after, input_norm False)
    input_norm: bool = True
    again: bool = False  # modules run again with the same weights: one reference layer per call (_by_call)
    mlm: tuple | None = None  # an encoder's masked-LM head: (its dense piece, its norm)

    @property
    def width(self) -> int:  # the queries': H heads of Dh where the flow or a given head_dim says Dh, else D
        return self.H * self.Dh or self.D


def sized_config(level: str, found, given: dict):
    """The config the shapes give, to size the recording's probe (one head unless given: the probe does not need it)."""
    units, fields = _sized(LEVELS[level], found, given, {"n_heads": 1})
    return _config(LEVELS[level], found, units, given.get("config"), fields)


def infer(level: str, found, given: dict, mapped: tuple | None = None) -> tuple:
    """(config, links, zero, fixed tables) for the user's module at `level`. `mapped`: the (links, zero) of a
    caller's mapping=, which replace the inferred ones (and count the layers where the units cannot be read)."""
    entry = LEVELS[level]
    units, fields = _sized(entry, found, given, {})
    try:
        _units(entry, found, units)
    except ValueError:
        if mapped is None:
            raise
        _counted(entry, units, mapped[0])  # the caller's map says where each parameter goes: the layers from it
    cfg = _config(entry, found, units, given.get("config"), fields)
    fixed = [t for t in units.position_tables if not t.trainable]
    if mapped is not None:  # the caller's map is the map
        return cfg, *mapped, fixed
    linker = Linker(entry, cfg, units, found)
    _link(linker)
    linker.unread()
    _refuse_unlinked(entry, found, linker.links)
    return cfg, linker.links, linker.zero, fixed


def _refuse_unlinked(entry, found, links: list) -> None:
    """NoPair at a projection run before the first attention that no link holds (ALBERT's embeddings projected to the
    layers' width): the reference has no place for its weights, and nothing it judges runs before it. (One after,
    or one of an input beside the ids, is left to the comparison: a mistake upstream of it is named first.)"""
    held, flow = {link.user for link in links}, found.flow
    order = flow.order if flow is not None else {}
    start = min((order[w] for a in flow.attentions for w in a.q if w in order), default=0) if flow else 0
    aside = flow.aside if flow is not None else set()  # an input beside the ids projected: read where it is used
    piece = next((p for p in found.pieces if order.get(p.weight, start) < start and p.weight not in held | aside), None)
    if piece is not None:
        what = f"{piece.weight} projects {piece.in_features} -> {piece.out_features} features in no attention or "
        what += "feed-forward block (a linear no unit of the reference holds)"
        raise NoPair(piece.weight.rpartition(".")[0] or "(the module)", what, entry.name)


def _sized(entry, found, given: dict, default: dict) -> tuple:
    """(units with their sizes and tables, the fields given over `default`). Sizes as given, else d_model a norm's
    width or the most common input width (or a table's), d_ff the first block's last projection's input width, heads
    from the flow; BERT's token types (the table looked up with one id everywhere) set apart."""
    fields = default | {k: v for k, v in given.items() if k != "config" and (v is not None or k == "pad_id")}
    cfg, pieces, norms, tables, flow = given.get("config"), found.pieces, found.norms, found.tables, found.flow
    D = fields.get("d_model") or (cfg.d_model if cfg else None)
    widths = [p.in_features for p in pieces]  # the most common one: d_model (a gated block: gate and up read D)
    outs = [p.out_features for p in pieces]  # a tie broken by the outputs (a packed in_proj read (in, out): 3D in)
    common = max(widths, key=lambda w: (widths.count(w), outs.count(w)), default=None)
    D = D or (norms[0].size if norms else common or (tables[0].width if tables else None))
    if D is None and entry.unit != "heads" and not found.names:  # tensors registered nowhere: no size helps
        raise ValueError(
            "the module holds no parameters (its weights are registered nowhere, so none can be read or compared): "
            "register them (nn.Parameter attributes, an nn.ParameterDict) and pass that module"
        )
    if D is None and entry.unit != "heads":
        raise ValueError(f"cannot tell d_model from the module's parameters at level {entry.name!r}: pass d_model=")
    D = D or 8  # scaled dot-product attention: no parameter says it, and its probe's width is free
    H = fields.get("n_heads") or (cfg.n_heads if cfg else None) or (flow.heads(D) if flow is not None else None)
    if H is None and entry.heads and not found.unrecorded:  # unrecorded: _units says why
        raise ValueError(
            f"the number of heads cannot be read from the recorded forward: pass n_heads= ({entry.name!r})"
        )
    by = {p.weight: p for p in pieces}
    F = _input_width(flow, by, flow.blocks[0][-1]) if flow and flow.blocks else 4 * D
    H = H or 2  # two heads where the level has none (their number is free)
    read = next((a.head_dim for a in flow.attentions if a.heads == H and not a.latent), 0) if flow else 0
    Dh = fields.get("head_dim") or read  # Qwen3's heads: H * Dh > D
    units = Units(D, H, F, H * Dh or D, Dh, norms=list(norms))
    units.token_tables = [t for t in tables if not t.position and t.width == D]
    units.position_tables = [t for t in tables if t.position and t.width == D]
    types = [t for t in units.token_tables if flow is not None and _typed(flow, t.name, units.token_tables[0])]
    if entry.group == "model" and entry.encoder_only and len(types) == 1 and len(units.token_tables) > 1:
        units.type_table = types[0]
        units.token_tables.remove(types[0])
    return units, fields


def _typed(flow, table: str, first) -> bool:
    """Whether `table` reads token types beside the ids `first` (the first token table) reads: one id everywhere
    (BERT's), or ids of the same shape from another input (Graphormer's degrees)."""
    ids, own = flow.read_at.get(first.name), flow.read_at.get(table)
    other = ids is not None and own is not None and own.shape == ids.shape and not np.array_equal(own, ids)
    return table in flow.constant_lookups or other


def _input_width(flow, by: dict, weight: str) -> int:
    """The width `weight` projects from: its piece's, or (experts stacked, where a router runs) as the flow read it."""
    if flow.routers and flow.axes(weight) == 3:
        return flow.operand_width(weight)
    return _pieces(by, [weight], "a feed-forward block")[0].in_features


def _units(entry, found, units: Units) -> None:
    """The attentions and feed-forward blocks the flow read (names settle a gate and up), the output projection (a
    linear D -> V, V the target token table's rows, that neither holds), and the layers and norms they make."""
    flow, by = found.flow, {p.weight: p for p in found.pieces}
    if flow is None and found.pieces and (entry.heads or entry.unit in ("feed_forward", "gated_feed_forward")):
        listed = ", ".join(f"{p.weight} ({p.in_features} -> {p.out_features})" for p in found.pieces)
        raise ValueError(
            f"the module's forward could not be recorded on the inputs of {entry.name!r}, so the roles of its "
            f"projections cannot be read from the computation: {listed}"
            + (f" ({found.unrecorded})" if found.unrecorded else "")
            + "; pass call= (how to call it)"
            + (", example= (one real call, at sizes it runs at)" if found.probed else "")
            + " or mapping= (the weight map)"
        )
    if flow is not None:
        units.attentions = [
            {r: _pieces(by, getattr(a, r), a.module) for r in ROLES}
            | {"columns": a.columns, "sinks": _sinks(flow, a, found.names), "latent": _latent(by, a, units)}
            | {"sliced": _sliced(flow.attentions, a), "tied": a.tied}
            for a in flow.attentions
        ]
        _queries_first(units.attentions)
        blocks = flow.blocks[:-1] if _mlm_head(entry, flow, units, by) else flow.blocks
        units.blocks = _mixtures(flow, by, blocks)
        chooses = {b.score_bias for b in units.blocks if isinstance(b, Mixture)}  # a router's choice bias: no orphan
        found.orphans[:] = [n for n in found.orphans if n not in chooses]
        units.parallel = entry.decoder_only and flow.parallel
        _refuse_unpaired(entry, flow, units.parallel)
        _refuse_inner_norm(entry, flow, units.norms)
        _by_call(flow, units)
        units.shared_norm = units.parallel and flow.shared_input  # Phi-2's one norm, read by both
    units.gated = bool(units.blocks) and all(len(b) == 3 for b in experts(units.blocks))
    shared = [s for b in units.blocks if isinstance(b, Mixture) for s in [b.shared, *b.more_shared] if len(s) == 3]
    for block in experts(units.blocks) + shared if units.gated else []:  # names settle gate and up: silu on up is one
        if role_of(block[0].weight) == "up" or role_of(block[1].weight) == "gate":
            block[:2] = block[1::-1]
    if units.attentions:
        first = units.attentions[0]
        units.kv = 0 if first["latent"] else sum(_rows(first, p, units.width).get("k", 0) for p in _qkv(first))
    if units.token_tables and entry.group == "model":
        _output_head(entry, found, units)
    _refuse_missing(entry, flow, units)
    units.n_enc, units.n_dec = entry.n_layers(len(units.attentions), len(units.blocks))
    units.layer_norms = entry.layer_norm_count(units.n_enc, units.n_dec) - units.n_dec * units.shared_norm
    _sandwich(entry, flow, units)
    encoder = entry.stacks[:1] == ("encoder",) or entry.group == "layer" and not entry.causal
    if encoder and flow is not None and flow.norm_first:  # ModernBERT's, the FT-Transformer's first layer
        units.first_attn_norm = not flow.stream_read
        units.layer_norms -= flow.stream_read
    if entry.group == "model" and flow is not None:
        _model_norms(entry, flow, units)


def _by_call(flow, units: Units) -> None:
    """Modules run again with the same weights (flow.repeated: a looped or ALBERT-style stack) read as one reference
    layer per call: each feed-forward block and norm taken once per call, in the order the calls ran (the flow's
    attentions are one per call already); the reference's layers then hold the same weights (mapping.ties)."""
    units.again = flow.repeated
    if not units.again:
        return
    last = lambda b: b.router if isinstance(b, Mixture) else b[-1]  # noqa: E731
    blocks = [(n.index, b) for b in units.blocks for n in flow._products(last(b).weight)]
    norms = [(n.index, norm) for norm in units.norms for n in flow.uses(norm.weight)]
    units.blocks = [b for _, b in sorted(blocks, key=lambda x: x[0])]
    units.norms = [n for _, n in sorted(norms, key=lambda x: x[0])]


def _model_norms(entry, flow, units: Units) -> None:
    """A model's norms beyond the layers' (less the first attention's where it reads the stream itself: _units):
    the embeddings' (those that read only lookups, less a pre-norm first layer's own: BERT's embeddings.LayerNorm),
    the rest final norms."""
    if len(units.norms) > units.layer_norms:
        stacks = len(entry.stacks)
        first = list(dict.fromkeys(n.weight for n in units.norms if not flow.computed_from_projections(n.weight)))
        own = stacks * (2 - units.shared_norm) if units.parallel else stacks if flow.norm_first else 0  # layer 0's
        own -= not units.first_attn_norm
        units.embedding_norm = len(first) - own == stacks
        units.layer_norms += stacks * units.embedding_norm


def _output_head(entry, found, units: Units) -> None:
    """The output projection: a linear D -> V (V the last token table's rows) that no attention or block holds; a
    second one the forward applies to the same hidden state is a head the reference has no pair for (multi-token
    prediction's)."""
    flow, V = found.flow, units.token_tables[-1].rows
    used = set(flow.roles) if flow is not None else set()  # the attentions' and blocks' weights
    heads = [p for p in found.pieces if p.weight not in used and (p.in_features, p.out_features) == (units.D, V)]
    read = [p for p in heads if flow is not None and p.weight in flow.order]
    fed = [next(n.parents[0] for n in flow.nodes if DF.projection(n) == p.weight) for p in read]  # their inputs
    if len(read) > 1 and entry.output_head and fed[0] is fed[1]:  # two heads on one hidden state
        what = f"a second output head ({read[1].weight}, beside {read[0].weight}: logits of its own)"
        raise NoPair(read[1].weight.rpartition(".")[0] or "(the module)", what, entry.name)
    if heads and entry.output_head:  # the one the judged output reads (not Medusa's draft heads: dataflow._reaching)
        units.out_piece = (read or heads)[-1]
    elif heads and entry.cross:  # a decoder stack with an output projection
        raise ValueError(
            f"the module has an output projection ({heads[-1].weight}); the reference {entry.name!r} is the "
            "stack before it: check the whole model as 'transformer', or pass call= returning the decoder's "
            "hidden states"
        )


@dataclass
class Mixture:
    """A mixture of experts in a feed-forward block's place: its router (a piece), its experts' blocks in the order
    they ran (or `stacked`: the reference's experts.* name -> the user's stacked tensor, GPT-OSS's), the k experts
    each row takes, whether their k gates are renormalised to sum to 1, GPT-OSS's clamped experts or not, an expert's
    hidden width and DeepSeek's shared experts (a block run on every row, its output added unweighed)."""

    router: Piece
    k: int
    renorm: bool
    clamped: float | None  # GPT-OSS's swiglu_limit, else None
    width: int = 0
    experts: list = field(default_factory=list)
    stacked: dict = field(default_factory=dict)
    shared: list = field(default_factory=list)
    more_shared: list = field(default_factory=list)  # further shared experts (blocks), summed: one wide block
    router_fields: dict = field(default_factory=dict)  # DeepSeek's: router_scoring, routed_scaling, groups, ...
    score_bias: str | None = None  # V3's e_score_correction_bias: added to the scores for the choice only


def experts(blocks: list) -> list:
    """The feed-forward blocks, each mixture's experts (of pieces) in its place."""
    return [e for b in blocks for e in (b.experts if isinstance(b, Mixture) else [b])]


def _mixtures(flow, by: dict, blocks: list) -> list:
    """The flow's blocks as pieces, those run after a router (and before the next attention) its Mixture's experts;
    experts stacked in tensors the router's choice picks from (GPT-OSS's) read as they are, with their biases."""
    routers = sorted((flow.order[w], w) for w in flow.routers)
    queries = [flow.order[a.q[0]] for a in flow.attentions if a.q]
    out: list = []
    for block in blocks:
        at = flow.order[block[0]]
        start, router = max((r for r in routers if r[0] < at), default=(at, None))
        if router is None or any(start < q < at for q in queries):
            out.append(_pieces(by, block, "a feed-forward block"))
            continue
        if not (out and isinstance(out[-1], Mixture) and out[-1].router is by[router]):
            node, renorm, fields, bias, _ = flow.routers[router]
            out.append(
                Mixture(by[router], node.shape[-1], renorm, flow.clamped(block[-1]), flow.operand_width(block[-1]))
            )
            out[-1].router_fields, out[-1].score_bias = fields, bias
        if _shared(flow, by, out[-1], block):  # a second one (DeepSeekMoE's, summed): more rows of one block
            pieces = _pieces(by, block, "a shared expert")
            out[-1].more_shared += [pieces] if out[-1].shared else []
            out[-1].shared = out[-1].shared or pieces
        elif len(block) == 3 and block[0] == block[1] and flow.axes(block[0]) == 3:  # stacked: (gate_up, down)
            names = {"gate_up_proj": block[0], "down_proj": block[2]}
            out[-1].stacked = names | {f"{n}_bias": b for n, w in names.items() if (b := flow.picked_bias(w))}
        elif len(block) == 3 and flow.axes(block[-1]) == 3:  # stacked: gate, up and down apart (Mixtral's by bmm)
            swap = role_of(block[0]) == "up" or role_of(block[1]) == "gate"  # names settle them: silu on up is one
            out[-1].stacked = dict(zip(("up", "gate", "down") if swap else ("gate", "up", "down"), block, strict=True))
        else:
            out[-1].experts.append(_pieces(by, block, "a feed-forward block"))
    for mixture in out:
        if isinstance(mixture, Mixture) and 1 < len(mixture.experts) < mixture.router.out_features:
            _unchosen(by, mixture)
    return out


def _shared(flow, by: dict, mixture: Mixture, block: list) -> bool:
    """Whether `block`, run after `mixture`'s routed experts (their outputs times their gates), is DeepSeek's shared
    experts: its output not weighed by the router, its width a multiple of an expert's (S experts in one block, or
    in several blocks summed)."""
    routed = mixture.stacked or mixture.experts and flow.weighed(mixture.experts[0][-1].weight)
    down = by.get(block[-1])
    return bool(routed and not flow.weighed(block[-1]) and down) and down.in_features % mixture.width == 0


def _unchosen(by: dict, mixture: Mixture) -> None:
    """The experts the router never chose on the probe (never run, so not in the flow), from the module's structure:
    the pieces named as a run expert's with another number in the one place the run ones' names differ (experts.3
    beside experts.0 .. 2); with them all, the experts in their numbers' order (router row e picks expert e)."""
    names = [[p.weight.split(".") for p in e] for e in mixture.experts]
    if any(len(w) != len(names[0][0]) for e in names for w in e):
        return
    at = [i for i, same in enumerate(zip(*[e[-1] for e in names], strict=True)) if len(set(same)) > 1]  # downs
    if len(at) != 1 or not all(w[at[0]].isdigit() for e in names for w in e):
        return
    template, i = names[0], at[0]
    found = {int(e[0][i]): expert for e, expert in zip(names, mixture.experts, strict=True)}
    for n in set(range(mixture.router.out_features)) - set(found):
        weights = [".".join(w[:i] + [str(n)] + w[i + 1 :]) for w in template]
        if all(w in by for w in weights):
            found[n] = [by[w] for w in weights]
    if sorted(found) == list(range(mixture.router.out_features)):
        mixture.experts = [found[n] for n in sorted(found)]


def _sliced(attentions: list, attention) -> set:
    """The fused weights of `attention` whose rows it reads are not those another attention reads of the same weight
    (columns_held): one projection sliced per layer (the keys and values of every decoder layer's cross-attention
    projected once from the memory), each attention's part its rows alone."""
    held = lambda a, w: {c for cols in a.columns.get(w, {}).values() for c in cols}  # noqa: E731
    return {w for w in attention.columns for a in attentions if a is not attention and held(a, w) - held(attention, w)}


def _queries_first(attentions: list) -> None:
    """Queries narrower than the keys they score are K Q^T of grouped keys: q and k exchanged, as the reference's
    (not latent attention's, whose keys are its up projection's). A fused or sliced projection's width for a role:
    the rows that role reads of it (columns_held; to_kv's keys are half its rows)."""
    width = lambda a, p, role: len(a["columns"].get(p.weight, {}).get(role, ())) or p.out_features  # noqa: E731
    for a in attentions:
        if len(a["q"]) == len(a["k"]) == 1 and not a["latent"]:
            if width(a, a["q"][0], "q") < width(a, a["k"][0], "k"):
                a["q"], a["k"] = a["k"], a["q"]


def _mlm_head(entry, flow, units: Units, by: dict) -> bool:
    """An encoder model's masked-LM head (BERT's, ModernBERT's): the last block the flow read runs a dense piece,
    its activation and a LayerNorm into the token table (a decoder tied to it). Set apart in units.mlm, its norm out of
    the layers'."""
    if not (entry.group == "model" and entry.encoder_only and flow.blocks and units.token_tables):
        return False
    *first, last = flow.blocks[-1]
    after = [n for n in units.norms if first and flow.order[n.weight] > flow.order[first[0]] and n.kind == "layer"]
    if last != units.token_tables[0].name or len(first) != 1 or first[0] not in by or len(after) != 1:
        return False
    units.mlm, units.norms = (by[first[0]], after[0]), [n for n in units.norms if n is not after[0]]
    return True


def _refuse_inner_norm(entry, flow, norms: list) -> None:
    """NoPair at the submodule that applies a norm whose output reaches an attention's output projection or a
    feed-forward block's last one (through element-wise ops and views: Sub-LN's norm before out_proj, NormFormer's
    on the hidden activations): each of the reference's norms feeds a unit's input or the stream."""
    block = ("the feed-forward block's hidden activations", "its last projection", "them")
    inner = {"out": ("the attention's output", "its output projection", "it"), "ffn_out": block, "down": block}
    for norm in norms:
        fed = [w for u in flow.uses(norm.weight)[:1] for n in DF._forward(u) if (w := DF.projection(n)) in flow.roles]
        fed = [w for w in fed if flow.roles[w] in inner]
        if fed:
            caller = next((c.caller for c in flow.calls if c.path == norm.module), norm.module)
            kind = {"layer": "a LayerNorm", "rms": "an RMSNorm"}.get(norm.kind, "a norm")
            what, by, them = inner[flow.roles[fed[0]]]
            said = f"{norm.module} ({kind}) normalises {what} before {by} ({fed[0]}) reads {them}"
            raise NoPair(caller or "(the module)", f"{said}, where the reference's norms feed a unit or the stream")


def _refuse_missing(entry, flow, units: Units) -> None:
    """NoPair at the first layer of a stack or model whose layers hold no norm with a learned scale (a weightless
    one is unsupported.py's): each of the reference's layers has one."""
    if flow is None or entry.group == "component" or not flow.attentions or units.norms:
        return
    layer = flow.attentions[0].module.rpartition(".")[0] or "(the module)"
    what = "the layer has no norm with a learned scale, where each of the reference's has one"
    done = flow._first_sum
    ahead = list(DF.walk(done.children, lambda n: [] if n.op in DF.PRODUCTS else n.children)) if done else []
    until = min((n.index for n in ahead if n.op in DF.PRODUCTS), default=0)
    ops = sorted((n for n in ahead if n.index < until and n.op not in DF.VIEWS), key=lambda n: n.index)
    if ops:  # what the stream goes through where a post-norm layer's norm stands (Autoformer's series decomposition)
        said = ", ".join(dict.fromkeys(f"{n.op} ({n.module or 'the layer'})" for n in ops))
        layer, what = ops[0].module or layer, f"the attention's sum goes through {said} before the next unit; {what}"
    raise NoPair(layer, what, entry.name)


def _sandwich(entry, flow, units: Units) -> None:
    """Gemma's sandwich: a norm after each sublayer too, and one before each where a norm is applied before the
    first attention's output (OLMo 2's has none: input_norm False)."""
    units.sandwich = entry.group != "component" and flow is not None and flow.sandwich
    if units.sandwich:
        first_out = next(a.out_node for a in flow.attentions if a.out_node is not None)
        units.input_norm = bool(units.norms) and flow.order[units.norms[0].weight] < first_out.index
        units.layer_norms *= 1 + units.input_norm


def _rotary(flow, n_layers: int, Dh: int) -> dict:
    """What each layer's cos and sin tables say: the layers that turn the queries where only some do (SmolLM3's
    NoPE layers: rope_layers), the sliding layers' base where it is not the others' (Gemma 3's, ModernBERT's
    rope_local_theta), in the one stack of `n_layers` layers; an attention whose mask hid every key on the recording
    (Attention.blind) given the sliding layers' window where it has their base."""
    if not 0 < len(flow.attentions) == n_layers:
        return {}
    turned = [a.turned for a in flow.attentions]
    found: dict = {"rope_layers": tuple(map(bool, turned))} if any(turned) and not all(turned) else {}
    read = [next((r for n in t if (r := TB.base_of(flow.values[n.index], Dh)) is not None), None) for t in turned]
    bases = [r and r[0] for r in read]  # (base, rotary width) or None
    local = {b for a, b in zip(flow.attentions, bases, strict=True) if a.window and b}
    full = {b for a, b in zip(flow.attentions, bases, strict=True) if not a.window and not a.blind and b}
    if len(local) == len(full) == 1 and local != full:
        window = flow.window
        for a, b in zip(flow.attentions, bases, strict=True):
            a.window = window if a.blind and b in local else a.window  # its band known by its base
        found |= {"rope_theta": full.pop(), "rope_local_theta": local.pop()}
    return found | {"positional": "rope"} if found else {}


def _refuse_unpaired(entry, flow, parallel: bool) -> None:
    """NoPair for what the flow shows the reference has no pair for: a top-k no router's, the scores clamped, a
    parallel block not read as one (`parallel`)."""
    routers = [node for node, *_ in flow.routers.values()]
    limits = {n for *_, fields, _, groups in flow.routers.values() if "router_groups" in fields for n in groups}
    for node in flow.nodes:  # a top-k read with nothing beside its input, no router's
        if node.op == "topk" and len(node.parents) == 1 and node not in routers and node not in limits:
            what = "topk computes a router's top-k choice of experts (a mixture of experts, as Mixtral's)"
            if node in flow.picks_tokens:  # expert choice: each expert its top tokens
                (weight, E), n = flow.picks_tokens[node], node.parents[0].shape[node.value]
                what = f"topk picks the top {node.shape[node.value]} of {n} along an axis other than the {E} scores "
                what += f"{weight} makes for each token (each choosing its tokens, not each token its experts)"
            if any(node in groups for *_, groups in flow.routers.values()):  # V2's group_limited_greedy: the best
                what = "topk limits a router's choice to groups ranked otherwise than by their two best scores' sum"
            raise NoPair(node.module or "(the module)", what, entry.name)
    for a in flow.attentions if entry.heads else ():  # keys (or queries, values) no projection computes
        words = {"q": "queries", "k": "keys", "v": "values"}
        roles = " and ".join(words[r] for r in a.unprojected)
        read = ", ".join(dict.fromkeys(t for r in a.unprojected for t in a.unprojected[r]))
        mixed = [f"{b.module}'s {words[r]}" for b in flow.attentions for r in words if a.mixed & set(vars(b)[r])]
        if roles:  # mixed: another attention's mixed in (ResFormer's value residual)
            taken = f"{read} read" if read else "the attention's input (or a tensor made outside the forward) taken"
            what = f"a sum that mixes in {mixed[0]} (a residual across layers)" if mixed else f"{taken} as it is"
            raise NoPair(a.module, f"the attention's {roles} are no projection's output: {what}", entry.name)
    clipped = clamped_scores(flow)  # a clip the probes' small scores may never reach: said from the op
    if clipped:
        raise NoPair(*clipped, entry.name)
    spliced = next(filter(None, (_unsummed(flow, b) for b in flow.blocks)), None)
    if spliced is not None and entry.group != "component":
        raise NoPair(spliced[0], spliced[1], entry.name)
    if flow.parallel and not parallel and entry.group != "component":
        what = (
            "the feed-forward block does not read the attention's output: both read the layer's input and their "
            "outputs are summed (a parallel block, as GPT-J, Phi-2 and GPT-NeoX's use_parallel_residual compute it)"
        )
        raise NoPair(flow.blocks[0][0].rsplit(".", 2)[0], what, entry.name)


def _unsummed(flow, block: list) -> tuple | None:
    """(where, what) for a feed-forward `block` on the stream itself (no norm on the way back to the products
    before it: an autoencoder spliced in, not a layer's feed-forward, whose dropped residual wiring.py says) whose
    output replaces the stream that later products read: no sum, before the next product, adds it to a tensor not
    computed from it (x + ffn(x): the reference's residual), else None."""
    down = next((n for n in flow.nodes if n.op in DF.PRODUCTS and DF.projection(n) == block[-1]), None)
    up = next((n for n in flow.nodes if n.op in DF.PRODUCTS and DF.projection(n) == block[0]), None)
    if down is None or up is None:
        return None
    read = DF.walk(
        [p for p in up.parents if DF.weight_of(p) is None], lambda n: [] if n.op in DF.PRODUCTS else n.parents
    )
    if any(n.op in NORMING for n in read):
        return None
    later = list(DF.walk([down], lambda n: n.children))  # all computed from its output
    if not any(n.op in DF.PRODUCTS for n in later[1:]):  # a head (an MLM head's dense, gelu, decoder): no stream
        return None
    made = set(map(id, later))
    ahead = DF.walk([down], lambda n: n.children if n is down or n.op not in DF.PRODUCTS else [])
    for n in (n for n in ahead if n.op in DF.ADDS):
        others = [p for p in n.parents if id(p) not in made and DF.root(p).param is None]
        if others or len(n.parents) == 1 and n.value is None:  # the stream it came from (recorded or not)
            return None
    acts = ", ".join(dict.fromkeys(a.op for a in DF._activations(down))) or "no activation"
    what = f"{block[0]}, {acts} and {block[-1]} compute a tensor that replaces the stream (no residual sum adds it"
    return down.module or "(the module)", f"{what} to its input, as a sparse autoencoder's reconstruction does)"


def _latent(by: dict, attention, units: Units) -> tuple:
    """Multi-head latent attention's (kv down projection, its latent's norm, and V3's q_a_proj and its norm), the
    norms set apart from the layers'; () for any other attention."""
    found: list = []
    for weight, scale in zip(attention.latent[::2], attention.latent[1::2], strict=True):
        norm = next((n for n in units.norms if n.weight == scale), None)
        if norm is None:
            raise ValueError(f"{scale} scales the latent of {attention.module} but is no norm; pass mapping=")
        units.norms.remove(norm)
        found += [_pieces(by, [weight], attention.module)[0], norm]
    return tuple(found)


def _sinks(flow, attention, names: set) -> list:
    """An attention's sink logits (GPT-OSS's): those it reads, else its parameter named as the first reading
    attention's (where it leaves its own unread); [] where there is none."""
    first = next((a for a in flow.attentions if a.sinks), None)
    if attention.sinks or first is None or not first.sinks[0].startswith(f"{first.module}."):
        return attention.sinks
    unread = f"{attention.module}.{first.sinks[0][len(first.module) + 1 :]}"
    return [unread] if unread in names else []


def _pieces(by: dict, weights: list, where: str) -> list:
    """The pieces of the recorded weights; a ValueError naming the one not read as a linear."""
    missing = [w for w in weights if w not in by]
    if missing:
        raise ValueError(
            f"{missing[0]} acts as a projection in {where or 'the module'} but is not a linear weight the judge "
            "reads (nn.Linear, a 1x1 nn.Conv1d, a 2-D nn.Parameter, a 3-D one einsum or @ reads as stored); pass "
            "mapping="
        )
    return [by[w] for w in weights]


def _counted(entry, units: Units, links: list) -> None:
    """The layers a caller's map names ({stack}.layers.N....), their norms, and a gated block where it names one."""
    names = [n for link in links for n, _ in link.parts]
    for stack in ("encoder", "decoder"):
        layers = {int(m.group(1)) for n in names if (m := re.match(rf"{stack}\.layers\.(\d+)\.", n))}
        setattr(units, "n_enc" if stack == "encoder" else "n_dec", max(layers, default=-1) + 1)
    units.layer_norms = entry.layer_norm_count(units.n_enc, units.n_dec)
    units.gated = any(".gate." in n or n.startswith("gate.") for n in names)


def _config(entry, found, units: Units, cfg, fields: dict):
    """The given config with the given fields, else the one the units imply with them."""
    known = {k: v for k, v in fields.items() if k in TransformerConfig.__dataclass_fields__}
    if cfg is not None:
        return dataclasses.replace(cfg, **known)
    norms, D, H, kv, Dh = units.norms, units.D, units.H, units.kv, units.Dh or units.D // units.H
    rms = bool(norms) and all(n.kind == "rms" for n in norms)
    epsilons = [n.eps for n in norms if n.eps is not None]  # one eps for all: a norm of another is said (divergence)
    token_tables, out_piece = units.token_tables, units.out_piece
    pieces = [p for a in units.attentions for r in ROLES for p in a[r]] + [p for b in experts(units.blocks) for p in b]
    base = dict(
        src_vocab_size=token_tables[0].rows if token_tables else 32,
        tgt_vocab_size=token_tables[-1].rows if token_tables else 32,
        n_encoder_layers=units.n_enc,
        n_decoder_layers=units.n_dec,
        bias=any(p.bias is not None for p in pieces) if pieces else True,
        output_bias=out_piece is not None and out_piece.bias is not None or bool(found.orphans),
        tie_embeddings=entry.output_head and out_piece is None,
        share_embeddings=entry.output_head and len(entry.stacks) == 2 and len(token_tables) == 1,
        positional="learned" if any(t.trainable for t in units.position_tables) else "sinusoidal",
        max_len=max((t.rows - t.offset for t in units.position_tables), default=64),
        layer_norm_eps=max(epsilons, key=epsilons.count) if epsilons else 1e-6 if rms else 1e-5,  # the most common
        norm="rms" if rms or entry.unit == "rms_norm" else "layer",
        gated_ffn=units.gated,
        n_kv_heads=kv // Dh if kv and kv != units.width else None,
        qk_norm=bool(found.qk_norms),
        qk_norm_projection=any(n.size != Dh for n in found.qk_norms.values()),  # OLMo 2's, of all the heads
        type_vocab_size=units.type_table.rows if units.type_table is not None else 0,
        embedding_norm=units.embedding_norm,
        first_attn_norm=units.first_attn_norm,
        mlm_head=units.mlm is not None,
        d_model=D,
        n_heads=H,
        head_dim=Dh if units.width != D else None,
        d_ff=units.F,
    )
    if units.gated:
        base["activation"] = "silu"
    base |= _mixture_fields(units.blocks, units.F)
    pads = {t.padding_idx for t in token_tables if t.padding_idx is not None}
    if len(pads) == 1:  # the pad id the model's tables say (BART's 1)
        base["pad_id"] = pads.pop()
    finals = len(norms) > units.layer_norms  # norms after the last layer
    if found.flow is not None and found.flow.norm_first is not None:  # where the flow applies the layers' norms
        base["norm_first"] = found.flow.norm_first
        if entry.final_norms == "pre-norm" and finals != base["norm_first"]:
            base["final_norm"] = finals  # post-norm layers and a final norm, or pre-norm layers without one
    elif entry.final_norms == "pre-norm" and finals:
        base["norm_first"] = True  # a final norm: pre-norm layers
    if units.parallel:  # a parallel layer (issue 49's): pre-norm layers, however the sums read
        base |= {"norm_first": True, "parallel_residual": True, "shared_norm": units.shared_norm}
    if units.sandwich:  # Gemma's sandwich is the reference's with pre-norm layers
        base |= {"norm_first": True, "sandwich_norm": True, "input_norm": units.input_norm}
    if found.flow is not None:
        base = _from_flow(entry, found.flow, units, base | _rotary(found.flow, units.n_dec or units.n_enc, Dh))
    return _built(base | _latent_sizes(units), known)


def _latent_sizes(units: Units) -> dict:
    """Multi-head latent attention's sizes ({} without it): the latent's (its norm's width), the rotary key part's
    beside it in the down projection, a query head's (q_proj's rows) and a value head's (o_proj's inputs) widths."""
    a = next((a for a in units.attentions[:1] if a["latent"]), None)
    if a is None:
        return {}
    (down, norm, *low_rank), H = a["latent"], units.H
    R = a["k"][-1].out_features if len(a["k"]) > 1 else down.out_features - norm.size  # the paper's W_KR, or beside
    sizes = dict(kv_lora_rank=norm.size, rotary_dim=R, positional="rope", n_kv_heads=None)
    sizes["q_lora_rank"] = low_rank[1].size if low_rank else None
    return sizes | {"head_dim": sum(q.out_features for q in a["q"]) // H, "v_head_dim": a["out"][0].in_features // H}


def _paper_rows(attention: dict, prefix: str, H: int) -> dict:
    """Latent attention held in the paper's separate matrices (dataflow: the rotary ones last): {weight: parts}, the
    rows of the reference's fused ones each holds: of each head in q_b_proj (W_UQ's, then W_QR's) and in kv_b_proj
    (W_UK's, then W_UV's), of kv_a_proj (W_DKV's latent, then W_KR's shared rotary key); {} for the fused layout."""
    latent, (*ups, key), v = attention["latent"], attention["k"], attention["v"]
    if not latent or not ups or len({id(p) for p in ups + v}) < len(ups + v):
        return {}
    C, kv_a = latent[1].size, f"{prefix}kv_a_proj"
    rows = {latent[0].weight: [(kv_a, (0, C))], key.weight: [(kv_a, (C, C + key.out_features))]}
    for stem, pieces in (("q_b" if latent[2:] else "q", attention["q"]), ("kv_b", ups + v)):
        ends = [0, *(sum(p.out_features // H for p in pieces[: i + 1]) for i in range(len(pieces)))]
        for i, p in enumerate(pieces):  # head h's rows of this piece: after those of the pieces before it
            rows[p.weight] = [
                (f"{prefix}{stem}_proj", (h * ends[-1] + ends[i], h * ends[-1] + ends[i + 1])) for h in range(H)
            ]
    return rows


def _built(base: dict, known: dict) -> TransformerConfig:
    """The config of the fields inferred (`base`) and given (`known`), rotary where a field only RoPE has is given;
    where the given ones cannot hold, a refusal that names them (call= or mapping= would not help)."""
    if {"rope_scaling", "rope_local_scaling", "rope_layers"} & known.keys():
        base["positional"] = "rope"
    try:
        return TransformerConfig(**(base | known))
    except (ValueError, TypeError) as exc:
        if not known:
            raise
        raise ValueError(f"{exc}; pass config fields that agree with it (given: {', '.join(known)})") from exc


def _mixture_fields(blocks: list, F: int) -> dict:
    """The first mixture's router and experts as the config's fields (d_expert where an expert's width is not the
    dense blocks' `F`); the layers whose block is none keep a dense one."""
    first = next((b for b in blocks if isinstance(b, Mixture)), None)
    if first is None:
        return {}
    dense = tuple(i for i, b in enumerate(blocks) if not isinstance(b, Mixture))
    kind = "gpt_oss" if first.clamped is not None else "swiglu"
    limit = {"swiglu_limit": first.clamped} if first.clamped is not None and math.isfinite(first.clamped) else {}
    shared = sum(b[-1].in_features for b in [first.shared, *first.more_shared] if b) // first.width  # S F_e wide
    return (
        dict(n_experts=first.router.out_features, top_k=first.k, norm_topk_prob=first.renorm, expert_kind=kind)
        | {"dense_layers": dense, "d_expert": first.width if first.width != F else None, "n_shared_experts": shared}
        | first.router_fields
        | limit
    )


def _from_flow(entry, flow, units: Units, base: dict) -> dict:
    """The config fields only the recorded forward says: sink logits, soft caps, a sliding window, a scale of the
    scores by layer (GPT-2's), a scale of the logits (Cohere's), ALiBi's bias on the scores (BLOOM's)."""
    base = dict(base, attn_sinks=any(a.sinks for a in flow.attentions))
    base["positional"] = "alibi" if reference_alibi(flow) else base["positional"]
    t5 = t5_relative(flow) if entry.heads else None  # T5's bias in every self-attention, its q k^T unscaled or not
    if isinstance(t5, tuple) and entry.group in ("model", "stacks") and t5[2] != units.n_enc + units.n_dec:
        what = f"T5's relative position bias in {t5[2]} of its {units.n_enc + units.n_dec} self-attentions"
        raise NoPair(flow.attentions[0].module, what + " (the reference's in every one)", entry.name)
    if isinstance(t5, tuple) and entry.group in ("model", "stacks"):
        learned = base["positional"] == "learned"  # MPNet's: learned positions beside it
        base |= {"relative_bias": True} if learned else {"positional": "relative"}
        base |= {"relative_buckets": t5[0], "relative_max_distance": t5[1]}
        base["attention_scale"] = 1.0 if all(abs(a.factor - 1) < 1e-9 for a in flow.attentions) else None
    caps = flow.softcaps
    base |= {k: v for k, v in caps.items() if k == "attn_softcap" and entry.heads or entry.output_head}
    causal = entry.causal or "decoder" in entry.stacks or entry.self_attention_probes  # where a window applies
    banded = [a for a in flow.attentions if a.window] if entry.heads else []
    other = next((a for a in banded if a.window != banded[0].window), None)  # the reference: one sliding_window
    if other is not None:
        what = f"a sliding window of {other.window} keys where {banded[0].module}'s is {banded[0].window}"
        raise NoPair(other.module, f"{what} (the reference has one window for its windowed layers)", entry.name)
    base["sliding_window"] = flow.window if entry.heads and causal else None  # a band built by hand
    kinds = ["sliding_attention" if a.window else "full_attention" for a in flow.attentions]
    if base["sliding_window"] and "full_attention" in kinds and len(kinds) == units.n_dec and not units.n_enc:
        base["layer_types"] = kinds  # windowed layers and full ones (Gemma 2's alternation)
    elif flow.window and entry.group == "model" and len(kinds) == units.n_enc and not units.n_dec:
        causal_band = next((a.module for a in flow.attentions if a.causal_band), None)
        if causal_band:  # the reference's encoder band is |i - j| <= w / 2, both sides
            raise NoPair(causal_band, "a causal band in an encoder: the keys after each query hidden", entry.name)
        # an encoder's band |i - j| < W: the reference's |i - j| <= window // 2 (ModernBERT's local layers)
        base |= {"sliding_window": 2 * (flow.window - 1), "layer_types": kinds}
    factors = [a.factor for a in flow.attentions]  # GPT-2's scale_attn_by_inverse_layer_idx: 1 / (i + 1),
    # read from three layers on (two: a second layer scaled by half is as likely attention.wrong_scale)
    by_layer = len(factors) > 2 and all(abs(f * (i + 1) / factors[0] - 1) < 1e-9 for i, f in enumerate(factors))
    base["attention_scale_by_layer"] = by_layer and len(entry.stacks) == 1 and not entry.cross
    scale = flow.output_scale  # logits times a number: the reference's scale of the hidden states
    if entry.output_head and scale is not None and not base["output_bias"]:
        base["output_scale"] = scale
    return base


# -- one attention's rows: separate, fused (q, k, v or k, v) or one piece per head --------------------------------


def _qkv(attention: dict) -> list:
    """The attention's q, k and v pieces, each once (a fused one holds several roles)."""
    return list({id(p): p for r in "qkv" for p in attention[r]}.values())


def _rows(attention: dict, piece, width: int) -> dict:
    """{role: rows} of `piece` in `attention`: those the flow saw each role take, else the queries' `width` (H * Dh)
    / (query pieces) for the query and the rest split evenly between the key and value it holds (narrower with
    grouped-query attention)."""
    roles = [r for r in "qkv" if any(p is piece for p in attention[r])]
    if piece.weight in attention["tied"]:  # W_q = W_k: all its rows each role's
        return dict.fromkeys(roles, piece.out_features)
    held = attention["columns"].get(piece.weight, {})
    first = sorted(c for cols in held.values() for c in cols) == list(range(sum(map(len, held.values()))))
    first = first or piece.weight in attention["sliced"]  # a sliced projection's rows: as read, wherever they sit
    if set(held) == set(roles) and first and sum(map(len, held.values())) <= piece.out_features:
        return {r: len(held[r]) for r in roles}  # the rows after them a feed-forward block's (PaLM's fused projection)
    width = piece.out_features if attention["latent"] else width  # MLA's queries: H (nope + rope) rows
    q = width // len(attention["q"]) if "q" in roles else 0
    kv = [r for r in roles if r != "q"]
    rest = piece.out_features - q
    rows = {r: q if r == "q" else rest // len(kv) for r in roles}
    if rest < 0 or kv and (rest % len(kv) or rest == 0) or sum(rows.values()) != piece.out_features:
        raise ValueError(
            f"cannot read {piece.weight} ({piece.out_features} rows) as the {', '.join(roles)} projection(s) of "
            f"an attention of width {width} ({len(attention['q'])} query piece(s)); pass mapping="
        )
    return rows


def _runs(held: dict, names: dict, rows: int, heads: int = 0) -> list:
    """A fused piece's parts from the output features each role holds (dataflow.columns_held): its rows in order,
    runs of one role's consecutive rows merged (q | k | v: three parts; GPT-NeoX's: three per head), each as (its
    first row, name, rows). With `heads`: MLA's up projection, each of the reference's heads its k rows then its v
    rows (kv_b_proj)."""
    width = {r: len(cols) // heads for r, cols in held.items()} if heads else {}
    parts: list = []
    for c, r, j in sorted((c, r, j) for r, cols in held.items() for j, c in enumerate(cols))[:rows]:  # row c
        j = j // width[r] * sum(width.values()) + width["k"] * (r == "v") + j % width[r] if heads else j
        if parts and parts[-1][1] == names[r] and parts[-1][2][1] == j:
            parts[-1] = (parts[-1][0], names[r], (parts[-1][2][0], j + 1))
        else:
            parts.append((c, names[r], (j, j + 1)))
    return parts


# -- the links, unit by unit, each of the user's units taken in the order the forward runs them -------------------


class Linker:
    """Links from the user's parameters to the reference's names, unit by unit; `zero` the biases held at zero."""

    def __init__(self, entry, cfg, units: Units, found):
        self.entry, self.cfg, self.units, self.found = entry, cfg, units, found
        self.links: list = []
        self.zero: list = []
        self.since = 0  # the index in `links` where the layer being linked begins
        self.placed: dict = {}  # a sliced projection's weight -> the runs of its rows linked so far (_place)
        learned = [t for t in units.position_tables if t.trainable]
        self.left = {
            "attention": iter(units.attentions), "norm": iter(units.norms), "feed-forward block": iter(units.blocks),
            "token table": iter(units.token_tables), "learned position table": iter(learned),
        }  # fmt: skip

    def count(self, what: str, got: int, expected: int) -> None:
        if got != expected:
            how = " (an attention: a softmax reading a product of projections)" * (what == "attentions")
            raise ValueError(
                f"found {got} {what} in the module, the reference {self.entry.name!r} has {expected}{how}; "
                "pass mapping="
            )

    def take(self, what: str, where: str):
        """The next of the user's units of kind `what` for the reference's `where`; a ValueError when none is left."""
        unit = next(self.left[what], None)
        if unit is None:
            raise ValueError(
                f"no {what} of the module is left for the reference's {where}: the recorded forward gives fewer than "
                "the layers need; pass mapping="
            )
        return unit

    def piece(self, piece, parts: list, hold_bias: bool, again: bool = False) -> None:
        """One user piece holding the reference's `parts` ((name, rows or None), stacked in that order): its weight
        and bias; the reference biases held at zero where it has none (`hold_bias`: the reference has biases).
        `again`: the piece linked once more, a tie (mapping.ties), not parts stacked after its first link's."""
        layout = dict(transposed=piece.transposed, heads=piece.heads, each_transposed=piece.each_transposed)
        layout |= dict(axes=piece.axes)
        add = self.links.append if again else self._stack
        add(Link(piece.weight, [(f"{n}.weight", r) for n, r in parts], **layout))
        if piece.bias is not None:  # a bias shared by several pieces (a packed q, k, v one): their parts stacked
            add(Link(piece.bias, [(f"{n}.bias", r) for n, r in parts]))
        elif hold_bias:  # held once, however many pieces (one per head) lack it
            self.zero += [b for b in dict.fromkeys(f"{n}.bias" for n, _ in parts) if b not in self.zero]

    def _stack(self, link: Link) -> None:
        """`link`, or its parts stacked after those of the link its user tensor already has in this layer (a
        projection one unit links rows of and another the rows after them: PaLM's q, k, v and feed-forward in one);
        where modules run again (Units.again), a tensor an earlier layer links too is that layer's module run
        again: a link of its own (mapping.ties)."""
        held = next((k for k in self.links[self.since :] if k.user == link.user), None)
        if held is None:
            self.links.append(link)
        else:
            held.parts += link.parts

    def norm(self, norm, prefix: str) -> None:
        """A norm's scale (held as the reference's minus 1 where the module scales by 1 + weight) and shift; the
        reference's shift held at zero where a layer norm has none (nn.LayerNorm(bias=False))."""
        self.links.append(Link(norm.weight, [(f"{prefix}weight", None)], minus_one=norm.plus_one))
        if norm.bias is not None:
            self.links.append(Link(norm.bias, [(f"{prefix}bias", None)]))
        elif self.cfg.norm == "layer" and f"{prefix}bias" not in self.zero:
            self.zero.append(f"{prefix}bias")

    def table(self, table, ref: str) -> None:
        """A table (mapping.Table) as is, or after its `offset` rows the model never reads (BART's positions)."""
        self.links.append(Link(table.name, [(ref, None)], offset=table.offset))

    def ffn(self, block, prefix: str) -> None:
        """A block's linears; a gate and up in one projection (Phi-3's) as two parts, in the order the flow read in the
        first such block (a model stores its layers alike: another layer's activation on its up half is a mistake); a
        mixture's router, and each expert's gate, up and down as its rows of the experts' stacked weights."""
        if isinstance(block, Mixture):
            self.piece(block.router, [(f"{prefix}router", None)], self.cfg.expert_kind == "gpt_oss")
            F, D = self.cfg.expert_width, self.cfg.d_model
            if "gate" in block.stacked:
                self._stacked(block, prefix, F, D)
            else:
                self.links += [Link(user, [(f"{prefix}experts.{ref}", None)]) for ref, user in block.stacked.items()]
            if block.more_shared:
                self._shared(block, f"{prefix}shared.")
            elif block.shared:
                self.ffn(block.shared, f"{prefix}shared.")
            if block.score_bias:
                self.links.append(Link(block.score_bias, [(f"{prefix}router.score_bias", None)]))
            if block.stacked:
                return
            self.count(f"experts run after {block.router.weight}", len(block.experts), block.router.out_features)
            for e, expert in enumerate(block.experts):
                (self._clamped_expert if self.cfg.expert_kind == "gpt_oss" else self._expert)(expert, e, prefix, F, D)
            return
        if len(block) == 3 and block[0] is block[1]:
            first = next(b[0].weight for b in experts(self.units.blocks) if len(b) == 3 and b[0] is b[1])
            halves = ["linear1", "gate"] if first in self.found.flow.up_first else ["gate", "linear1"]
            rows = self._interleaved(block[0], prefix)
            self.piece(block[0], rows or [(f"{prefix}{h}", None) for h in halves], self.cfg.bias)
            block = block[2:]
        names = ("gate", "linear1", "linear2")[-len(block) :]
        for p, name in zip(block, names, strict=True):
            self.piece(p, [(f"{prefix}{name}", None)], self.cfg.bias)

    def _shared(self, block: Mixture, prefix: str) -> None:
        """Shared experts run apart and summed as the reference's one wide shared block: each one's gate and up its
        run of that block's rows, its down the same run of the down's columns (the block's hidden units in order)."""
        start = 0
        for *ins, down in [block.shared, *block.more_shared]:
            n = down.in_features
            for p, name in zip(ins, ("gate", "linear1")[-len(ins) :], strict=True):
                self.piece(p, [(f"{prefix}{name}", (start, start + n))], self.cfg.bias)
            columns = (start, 1, start + n)
            self._stack(Link(down.weight, [(f"{prefix}linear2.weight", None)], down.transposed, columns=columns))
            start += n

    def _expert(self, expert: list, e: int, prefix: str, F: int, D: int) -> None:
        """Expert e as its own gate, up and down pieces: its (out, in) rows of the reference's gate_up_proj (the gate
        first) and of down_proj."""
        gate, up, down = expert
        rows = [(gate, "gate_up", 2 * e * F, F), (up, "gate_up", (2 * e + 1) * F, F), (down, "down", e * D, D)]
        for p, name, start, n in rows:
            part = (f"{prefix}experts.{name}_proj", (start, start + n))
            self._stack(Link(p.weight, [part], transposed=p.transposed))

    def _clamped_expert(self, expert: list, e: int, prefix: str, F: int, D: int) -> None:
        """GPT-OSS's expert e as its own gate, up and down pieces: its (in, out) rows of the reference's gate_up_proj
        (the gate its even columns, the up its odd ones) and of down_proj, with its rows of their biases (held at
        zero where a piece has none)."""
        gate, up, down = expert
        for p, name, rows, columns in ((gate, "gate_up", D, (0, 2)), (up, "gate_up", D, (1, 2)), (down, "down", F, ())):
            ref = f"{prefix}experts.{name}_proj"
            self._stack(Link(p.weight, [(ref, (e * rows, (e + 1) * rows))], not p.transposed, columns=columns))
            if p.bias is not None:
                self._stack(Link(p.bias, [(f"{ref}_bias", (e, e + 1))], columns=columns))
            elif f"{ref}_bias" not in self.zero:
                self.zero.append(f"{ref}_bias")

    def _stacked(self, block: Mixture, prefix: str, F: int, D: int) -> None:
        """Gate, up and down each stacked in one (E, in, out) tensor (or (E, out, in), where its second axis is not
        the width its product reads): expert e's rows of the reference's gate_up_proj (gate first) and down_proj."""
        rows = {"gate": ("gate_up", 2 * F, 0, F), "up": ("gate_up", 2 * F, F, F), "down": ("down", D, 0, D)}
        flow, E = self.found.flow, block.router.out_features
        for role, user in block.stacked.items():
            name, step, first, n = rows[role]
            parts = [(f"{prefix}experts.{name}_proj", (e * step + first, e * step + first + n)) for e in range(E)]
            each = next(x.shape for x in flow.nodes if x.param == user)[1] == flow.operand_width(user)
            self.links.append(Link(user, parts, heads=E, each_transposed=each))

    def _interleaved(self, piece, prefix: str) -> list:
        """A fused gate-and-up piece's rows where the first such block's are interleaved (gate and up row by row, as
        the flow read them: dataflow._halves), that layout read for each (a model stores its layers alike: one
        reading its rows otherwise swaps its gate and up, a mistake judged there); [] for halves."""
        held = next(iter(self.found.flow.gate_up.values()), {})
        if set(held) != {"gate", "up"} or sum(map(len, held.values())) != piece.out_features:
            return []
        runs = _runs(held, {"gate": f"{prefix}gate", "up": f"{prefix}linear1"}, piece.out_features)
        return [run[1:] for run in runs] if len(runs) > 2 else []

    def attention(self, attention: dict, prefix: str) -> None:
        """One attention's pieces linked to the reference's {q,k,v,out}_proj under `prefix`, then its per-head q and
        k norms (Qwen3's). A piece holding several roles is their rows stacked, q | k | v (another order is
        attention.q_k_swapped) or head by head as the flow read it (GPT-NeoX's); a role's per-head piece its rows."""
        latent = attention["latent"]
        stems = {"k": "kv_b", "v": "kv_b", "q": "q_b" if latent[2:] else "q"} if latent else {}  # MLA's
        names = {r: f"{prefix}{stems.get(r, r)}_proj" for r in ROLES}
        paper = _paper_rows(attention, prefix, self.cfg.n_heads)  # MLA's separate matrices: the fused rows each holds
        for piece in _qkv(attention):
            self.piece(piece, paper[piece.weight], False) if paper else self._projection(attention, piece, names)
        for name, down, norm in zip(("kv_a", "q_a"), latent[::2], latent[1::2], strict=False):  # MLA's, and norms
            self.piece(down, paper.get(down.weight, [(f"{prefix}{name}_proj", None)]), False)  # the latent, rotary key
            self.norm(norm, f"{prefix}{name}_norm.")
        if len(attention["out"]) != 1:
            raise ValueError(
                f"expected one output projection after the attention of {[p.weight for p in _qkv(attention)]}, "
                f"the flow shows {len(attention['out'])}; pass mapping="
            )
        self.piece(attention["out"][0], [(names["out"], None)], self.cfg.bias)
        sinks = attention.get("sinks") if self.cfg.attn_sinks else None  # GPT-OSS's sink logit per head
        if sinks == [DF.SINK_AT_ZERO]:  # softmax-plus-one: held at zero, as a bias the user's layer lacks
            self.zero.append(f"{prefix}sinks")
        elif sinks:
            self.links.append(Link(sinks[0], [(f"{prefix}sinks", None)]))
        for role in "qk":
            w, qk = attention[role][0].weight, self.found.qk_norms  # a fused q, k: by role; else the weight's one
            norm = qk.get((w, role)) or next((n for (x, _), n in qk.items() if x == w), None)
            if norm is not None and (norm.bias or norm.kind != "rms"):  # the reference's q/k norms: RMSNorms alone
                what = f"a {'LayerNorm' if norm.kind != 'rms' else 'norm with a bias'} normalises queries or keys"
                raise NoPair(norm.module, what, self.entry.name)
            if norm is not None:
                self.norm(norm, f"{prefix}{role}_norm.")

    def _projection(self, attention: dict, piece, names: dict) -> None:
        """One q, k or v piece of `attention` (a fused one's roles' rows as the flow read them), linked to `names`."""
        latent, heads = attention["latent"], self.cfg.n_heads
        if piece.weight in attention["tied"]:  # W_q = W_k: the one tensor linked to q_proj, then again to k_proj
            for again, r in enumerate("qk"):
                self.piece(piece, [(names[r], None)], self.cfg.bias, bool(again))
            return
        parts, rows = [], _rows(attention, piece, self.units.width)
        for r, n in rows.items():
            i, many = next(i for i, p in enumerate(attention[r]) if p is piece), len(attention[r]) > 1
            parts.append((names[r], (i * n, (i + 1) * n) if many else None))
        held = attention["columns"].get(piece.weight, {})
        runs = _runs(held, names, piece.out_features, heads * bool(latent)) if set(held) == set(rows) else []
        if piece.weight in attention["sliced"] and runs:
            self._place(piece, runs)
            return
        ordered = [run[1:] for run in runs] if len(runs) > 3 or runs and latent else list(dict.fromkeys(parts))
        self.piece(piece, ordered, self.cfg.bias)

    def _place(self, piece, runs: list) -> None:
        """A sliced projection's parts (_sliced): this attention's `runs` among those other attentions took, all in
        the order of the user's rows (each layer's keys and values wherever the user's layout puts them)."""
        self.placed.setdefault(piece.weight, []).extend(runs)
        self.links = [k for k in self.links if k.user not in (piece.weight, piece.bias)]
        self.piece(piece, [run[1:] for run in sorted(self.placed[piece.weight])], self.cfg.bias)

    def unread(self) -> None:
        """A ValueError where a sliced projection has rows no attention read (the reference has no place for them)."""
        for weight, runs in self.placed.items():
            rows = next(p.out_features for p in self.found.pieces if p.weight == weight)
            read = sum(stop - start for _, _, (start, stop) in runs)
            if read != rows:
                raise ValueError(
                    f"{weight} ({rows} rows) is sliced among the attentions, which read {read} of its rows: the "
                    "reference has no place for the others; pass mapping="
                )

    def layer(self, prefix: str, decoder: bool) -> None:
        """A layer's attentions (a decoder's two), feed-forward block and norms, in the order they run."""
        self.since = len(self.links) if self.units.again else 0
        for name in ["self_attn"] + ["cross_attn"] * decoder:
            self.attention(self.take("attention", f"{prefix}{name}"), f"{prefix}{name}.")
        self.ffn(self.take("feed-forward block", f"{prefix}ffn"), f"{prefix}ffn.")
        kinds = ["_norm"] * self.cfg.input_norm + ["_post_norm"] * self.cfg.sandwich_norm  # in the order applied
        first = ["self_attn"] * (self.cfg.first_attn_norm or prefix not in ("", "encoder.layers.0."))
        for sub in first + ["cross_attn"] * decoder + ["ffn"] * (not self.cfg.shared_norm):
            for name in (sub + kind for kind in kinds):
                self.norm(self.take("norm", f"{prefix}{name}"), f"{prefix}{name}.")

    def embeddings(self, stack: str) -> None:
        """A model stack's tables: its token table (the encoder's shared with the decoder's when share_embeddings),
        its learned positions, BERT's type table and embedding norm."""
        if not (stack == "encoder" and self.cfg.share_embeddings):
            self.table(self.take("token table", stack), f"{stack}.token_embedding.weight")
        if self.cfg.positional == "learned":
            self.table(self.take("learned position table", stack), f"{stack}.position_embedding.weight")
        if stack == "encoder" and self.units.type_table is not None:
            self.table(self.units.type_table, "encoder.token_type_embedding.weight")
        if self.units.embedding_norm:
            self.norm(self.take("norm", f"{stack}.embedding_norm"), f"{stack}.embedding_norm.")


def _link(lk: Linker) -> None:
    """The links of the level's unit: a component's one unit (scaled dot-product attention has no parameters), one
    layer, or layers on embeddings and whole models (_link_stacks)."""
    u, unit, cross = lk.units, lk.entry.unit or lk.entry.group, lk.entry.cross
    if unit in ("feed_forward", "gated_feed_forward") and u.blocks and u.gated != (unit == "gated_feed_forward"):
        listed = ", ".join(f"{p.weight} ({p.in_features} -> {p.out_features})" for p in u.blocks[0])
        right = "gated_feed_forward" if u.gated else "feed_forward"
        raise ValueError(f"{listed} is a {'gated ' * u.gated}feed-forward block: check it as {right!r}")
    one = {  # a component's unit: (what the module holds one of, those it holds, how it is linked)
        "attention": ("attentions", u.attentions, lk.attention),
        "layer_norm": ("norms", u.norms, lk.norm),
        "rms_norm": ("norms", u.norms, lk.norm),
        "feed_forward": ("feed-forward blocks", u.blocks, lk.ffn),
        "gated_feed_forward": ("gated feed-forward blocks", u.blocks, lk.ffn),
        "embedding": ("token tables", u.token_tables, lambda table, _: lk.table(table, "token_embedding.weight")),
    }
    if unit in one:
        what, held, link = one[unit]
        lk.count(what, len(held), 1)
        link(held[0], "")
    elif unit == "positions" and lk.cfg.positional == "learned":
        lk.table(u.position_tables[0], "position_embedding.weight")
    elif unit == "layer":
        _refuse_attention_alone(lk)
        lk.count("attentions", len(u.attentions), 2 if cross else 1)
        norms = (3 if cross else 2) - lk.cfg.shared_norm - (not lk.cfg.first_attn_norm)  # Phi-2's block: one
        lk.count("norms", len(u.norms), norms)
        lk.layer("", cross)
    elif unit in ("stacks", "model"):
        _link_stacks(lk)


def _refuse_attention_alone(lk: Linker) -> None:
    """A ValueError where the module runs attentions and no feed-forward block (an attention-only model): each of the
    reference's layers has one, and no map stands for math the module lacks."""
    if lk.units.attentions and not lk.units.blocks:
        flow = lk.found.flow
        lone = _lone_projection(flow) if flow is not None else None
        if lone is not None:
            raise NoPair(*lone, lk.entry.name)
        where = ", ".join(dict.fromkeys(a.module for a in flow.attentions)) if flow is not None else ""
        raise ValueError(
            f"no feed-forward block in the module's layers (attention alone{': ' * bool(where)}{where}), where each "
            f"layer of the reference {lk.entry.name!r} has one, and no mapping= stands for math the module lacks; "
            "pass a model whose layers run one, or each attention alone at the 'multi_head_attention' level"
        )


def _lone_projection(flow) -> tuple | None:
    """(where, what) for an activation after the first attention that reads one projection no attention holds, no
    feed-forward block having been read: a feed-forward of one linear (the Set Transformer authors' relu(fc_o(O))),
    where each of the reference's has a second projection after its activation; else None."""
    start = min((a.out_node.index for a in flow.attentions if a.out_node is not None), default=0)
    for act in (n for n in flow.nodes if n.op in DF.ACTIVATIONS and n.index > start and n.parents):
        weights = DF.back(act.parents[0])[0]
        if len(weights) == 1 and weights[0] not in flow.roles:
            product = next(n for n in flow.nodes if DF.projection(n) == weights[0])
            where = [m.split(".") for m in (product.module, act.module)]
            what = f"{act.op}({weights[0].rpartition('.')[0]}(x)) with no projection after it: a feed-forward block "
            return ".".join(os.path.commonprefix(where)) or "(the module)", what + "of one linear (the reference's two)"
    return None


def _link_stacks(lk: Linker) -> None:
    """Each stack's tables (a model's), layers and final norm (where it has one), then a model's output projection:
    the user's linear, an output bias alone, or the tied token table."""
    cfg, entry, u = lk.cfg, lk.entry, lk.units
    finals = entry.final_norms == "always" or cfg.has_final_norm
    _refuse_attention_alone(lk)
    lk.count("norms", len(u.norms), u.layer_norms + (len(entry.stacks) if finals else 0))
    t5 = t5_relative(lk.found.flow) if cfg.has_relative_bias and lk.found.flow is not None else None
    for stack in entry.stacks:
        if entry.group == "model":
            lk.embeddings(stack)
        if isinstance(t5, tuple):  # T5's: one table a stack, bidirectional in the encoder
            lk.links.append(Link(t5[3][stack == "encoder"], [(f"{stack}.relative_bias.weight", None)]))
        for i in range(cfg.n_encoder_layers if stack == "encoder" else cfg.n_decoder_layers):
            lk.layer(f"{stack}.layers.{i}.", stack == "decoder" and entry.cross)
        if finals:
            lk.norm(lk.take("norm", f"{stack}.final_norm"), f"{stack}.final_norm.")
    if entry.output_head and u.out_piece is not None:
        lk.piece(u.out_piece, [("output_proj", None)], False)  # none: output_bias=False
    elif entry.output_head and lk.found.orphans:
        lk.links.append(Link(lk.found.orphans[0], [("output_proj.bias", None)]))
    if u.mlm is not None:  # an encoder's masked-LM head: its dense piece and norm, the tied decoder's bias
        lk.piece(u.mlm[0], [("mlm_head.dense", None)], cfg.bias)
        lk.norm(u.mlm[1], "mlm_head.norm.")
        lk.links += [Link(bias, [("mlm_head.bias", None)]) for bias in lk.found.orphans[:1]]
