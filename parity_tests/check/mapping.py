"""From a user's parameters to the reference's state dict: found by structure and shape, stated as data.

`structure` reads a module as pieces (linear weights, read (out, in)), norms (a weight and a bias of width D) and
tables (embeddings, positions) from torch's classes and, for any other module, its own tensors' shapes and names;
`with_flow` then reads them as the recorded forward does (dataflow.py): F.linear's weights (out, in), a 3-axis one
as einsum or @ reads it, the shifts it adds, the rows it indexes (a table whatever its name), all in the order of
first use. units.py groups them into the reference's units.

A map entry is a `Link`: one rule for a plain linear, a transposed raw weight, a fused projection, a per-head slice
and a head tensor (H, in, Dh); with RoPE in interleaved pairs (Meta's) the q and k rows in that pairing's order.
"""

from __future__ import annotations

import inspect
import math
import re
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch import nn

from . import dataflow as DF
from .unsupported import NoPair


@dataclass
class Piece:
    """One linear weight of the user's, read (out, in); `bias` is its bias's name, or None."""

    weight: str
    bias: str | None
    out_features: int
    in_features: int
    transposed: bool  # stored (in, out), applied as x @ W
    heads: int = 0  # 3 axes: its head axis's size; rows or columns split per head (Link.heads)
    each_transposed: bool = False  # (H, in, out / H) (TransformerLens's W_Q): each head's rows transposed
    axes: tuple = ()  # stored in another order of its axes than the layout above says (Link.axes)


NORMING = {"rsqrt", "sqrt", "rms_norm", "layer_norm", "var", "std", "norm", "normalize"}  # x over a root or norm


@dataclass
class Norm:
    weight: str
    bias: str | None
    size: int
    eps: float | None
    module: str
    kind: str = "layer"  # "layer" (a weight and a bias, or nn.LayerNorm) or "rms" (a weight alone, or nn.RMSNorm)
    plus_one: bool = False  # it scales by 1 + weight (Gemma's)


@dataclass
class Table:
    name: str
    rows: int
    width: int
    trainable: bool
    position: bool  # its name says positions (pos, pe, wpe, position), or the flow looked it up with positions
    offset: int = 0  # positions: the row position 0 reads (BART's 2; the rows before it never read)
    padding_idx: int | None = None  # nn.Embedding's padding_idx: the pad id the model says


@dataclass(frozen=True)
class Structure:
    pieces: list = field(default_factory=list)
    norms: list = field(default_factory=list)
    tables: list = field(default_factory=list)
    orphans: list = field(default_factory=list)  # 1-D parameters that fit nothing above (an output bias)
    qk_norms: dict = field(default_factory=dict)  # (q or k projection's weight, role) -> its per-head Norm (Qwen3)
    flow: DF.Flow | None = None  # what the recorded forward said, or None where it could not run
    unrecorded: str = ""  # where the forward could not be recorded: what its last try raised
    own: DF.Flow | None = None  # then, the example's own call recorded (session.own_call), or None
    probed: bool = False  # then, run on the judge's own probe only (neither example= nor call= given)
    names: set = field(default_factory=set)  # every parameter's name (one the forward leaves unread included)
    lacking: NoPair | None = None  # the first module whose math the reference lacks (raised once the forward is read)


@dataclass
class Link:
    """user tensor = transpose?(concat_i(reference[parts[i]][rows[i]])), after `offset` rows the reference never
    reads (BART's learned positions start at row 2: zeros on loading, their gradient not compared)."""

    user: str
    parts: list  # [(reference name, (start, stop) or None)]
    transposed: bool = False
    rope_pairs: int = 0  # head size Dh when the user's q/k rows pair RoPE features (2i, 2i + 1), not (i, i + Dh/2)
    offset: int = 0
    minus_one: bool = False  # the user's tensor is the reference's minus 1 (a norm scaling by 1 + weight)
    rope_rotary: int = 0  # with rope_pairs: the features of each head RoPE turns, when fewer than Dh (GPT-J's)
    heads: int = 0  # a 3-axis user tensor (einsum or @): its rows or columns (after any transpose) split into heads,
    each_transposed: bool = False  # and each head's rows transposed: (H, in, out / H) (TransformerLens's W_Q)
    rope_order: tuple = ()  # q/k rows (and q/k norms) of each head: row u the reference's rope_order[u] (relabelled)
    axes: tuple = ()  # a 3-axis user tensor: its axis i the laid-out tensor's axes[i] (an einsum reading it so)
    columns: tuple = ()  # (start, step[, stop]): each part's columns start:stop:step (GPT-OSS's gate, up interleaved)


ROLE_WORDS = {  # a gated feed-forward's gate and up (Hugging Face's names, Meta's w1 / w3)
    "gate": {"gate", "gate_proj", "w1", "w_gate", "wg", "fc_gate", "gate_linear", "linear_gate"},
    "up": {"up", "up_proj", "w3", "w_up", "wu", "fc_up", "up_linear", "linear_up"},
}
POSITION_WORDS = re.compile(r"(^|[_.])(pos|pe|wpe|position|positions|positional|pos_embedding|pos_emb|pos_enc)($|[_.])")
EMBEDDING_WORDS = re.compile(r"(emb|embed|embedding|wte|tok|token|lut)")


def role_of(name: str) -> str:
    """The role a parameter's or module's name gives (its last word before .weight), or ""."""
    parts = [p for p in name.lower().split(".") if p not in ("weight", "bias") and not p.isdigit()]
    last = parts[-1] if parts else ""
    stem = re.sub(r"_?(weight|w|b|bias)$", "", last) or last
    return next((role for role, words in ROLE_WORDS.items() if {last, stem} & words), "")


def structure(module: nn.Module) -> Structure:
    """The module's pieces, norms and tables: torch's modules read by their class, any other by its own tensors."""
    found = Structure(names={n for n, _ in module.named_parameters()})
    lacking = []
    for path, mod in module.named_modules():
        prefix = f"{path}." if path else ""
        try:
            if not _read_builtin(mod, path, prefix, found):
                _read_own(mod, path, prefix, found)
        except NoPair as exc:
            lacking.append(exc)
    return replace(_untied(module, found), lacking=next(iter(lacking), None))


def with_flow(found: Structure, module: nn.Module, flow, unrecorded: str = "") -> Structure:
    """`found` as the recorded forward (dataflow.Flow) reads `module`'s parameters (the module docstring), per-head
    q/k norms set apart; no flow: `found` with what its last try raised (`unrecorded`)."""
    if flow is None:
        return replace(found, unrecorded=unrecorded)
    found.norms[:] = [n for n in found.norms if _normalises(flow, n.weight)]  # a name said norm, its math did not
    _scales_read(found, module, flow)
    _as_read(found, module, flow)
    _indexed(found, module, flow)
    found.norms[:] = [n for n in found.norms if n.weight in flow.order]  # unread where the judged output is made
    last = len(flow.nodes)
    found.pieces.sort(key=lambda p: flow.order.get(p.weight, last))
    found.norms.sort(key=lambda n: flow.order.get(n.weight, last))
    found.tables.sort(key=lambda t: flow.order.get(t.name, last))
    for norm in found.norms:
        norm.plus_one = norm.weight in flow.plus_one
        floor = _floor(flow, norm.weight)  # x / max(|x|, eps): no eps under the root, whatever the module holds
        norm.eps = floor or (_eps_added(flow, norm.weight) if norm.eps is None else norm.eps)  # no module says it
        own = [n for n, _ in module.get_submodule(norm.module).named_parameters()]
        alone = own == [norm.weight.removeprefix(f"{norm.module}.")]  # its path "" at the root
        if norm.kind == "rms" and alone and any(n.op in DF.CENTRING for n in flow.nodes if n.module == norm.module):
            norm.kind = "layer"  # a module of one scale whose forward subtracts the mean: a LayerNorm (Cohere's)
    for t in found.tables:
        t.position = t.position or t.name in flow.positions
        t.offset = flow.positions.get(t.name, 0)
    qk_norms = dict(found.qk_norms)
    for norm in [n for n in found.norms if n.weight in flow.qk_norms]:  # per-head q/k norms, set apart
        qk_norms |= dict.fromkeys(flow.qk_norms[norm.weight], norm)
        found.norms.remove(norm)
    return replace(found, qk_norms=qk_norms, flow=flow)


def _scales_read(found: Structure, module: nn.Module, flow) -> None:
    """1-D parameters that no name placed, read as norm scales (RMSNorm's) where the forward multiplies them by a
    normalised x (_scales_normed)."""
    placed = {n for x in found.norms + found.pieces for n in (x.weight, x.bias)} | set(found.orphans)
    unplaced = {n: p for n, p in module.named_parameters() if p.ndim == 1 and n not in placed}
    for node in flow.nodes:
        names = [r.param for r in map(DF.root, node.parents) if r.param in unplaced]
        if names and _scales_normed(node):
            path, size = names[0].rpartition(".")[0], len(unplaced.pop(names[0]))
            found.norms.append(Norm(names[0], None, size, _eps(module.get_submodule(path)), path, "rms"))


def _scales_normed(node: DF.Node) -> bool:
    """Whether `node` is a factor of a product (or F.rms_norm, F.layer_norm) among whose factors is a root, a
    variance or a norm, seen through views, a number added (+ eps), a floor (norm(x).clamp(min=eps)) and a
    reciprocal (1 / (sqrt(m) + eps)): it scales a normalised x."""
    factors = DF.MULS | DF.DIVS | DF.VIEWS | {"rms_norm", "layer_norm"}
    through = DF.VIEWS | {"__rtruediv__", "__rdiv__", "reciprocal", "clamp", "clamp_min"}  # a floor: max(|x|, eps)
    scaled = lambda m: m is not node and m.op in factors - DF.MULS - DF.DIVS - DF.VIEWS and len(m.parents) > 1  # noqa: E731

    def normed(n: DF.Node) -> bool:
        seen = DF.walk([n], lambda m: m.parents if m.op in through or m.op in DF.ADDS and m.value is not None else [])
        return any(m.op in NORMING and not scaled(m) for m in seen)

    product = DF.walk([node], lambda m: [c for c in m.children + m.parents if c.op in factors and not scaled(c)])
    return node.op in factors and any(normed(p) for m in product for p in m.parents + [m])


def _normalises(flow, weight: str) -> bool:
    """Whether the forward reads the 1-D `weight` as a norm's scale: the weight torch's norm op takes, or a factor
    of a normalised x (_scales_normed), directly or as 1 + weight (Gemma's); a weighted sum of whole states
    (DenseFormer's depth weights) is none."""
    uses = [n for n in flow.nodes if weight in {DF.root(p).param for p in n.parents}]
    uses += [c for n in uses if n.op in DF.ADDS and n.value is not None for c in n.children]
    torch_own = {"layer_norm", "rms_norm", "batch_norm", "group_norm", "instance_norm"}
    weighs = any(n.op in DF.MULS | DF.PRODUCTS for n in uses)  # a custom op reading it (a norm's own kernel): kept
    return not weighs or any(n.op in torch_own or _scales_normed(n) for n in uses)


def _eps_added(flow, weight: str) -> float | None:
    """The number a norm scaled by `weight` adds under its root, as the forward ran it: F.layer_norm's (or
    F.rms_norm's) eps, x * rsqrt(mean(x^2) + eps) * weight, x / sqrt(var + eps) * weight (a plain function's default
    eps that no module holds); else None."""
    norms = [n for n in flow.nodes if n.op in ("layer_norm", "rms_norm") and len(n.parents) > 1]
    called = next((n.value for n in norms if DF.root(n.parents[1]).param == weight), None)
    if isinstance(called, float):
        return called
    scaled = next((n for n in flow.nodes if n.op in DF.MULS and weight in {DF.root(p).param for p in n.parents}), None)
    factors = DF.MULS | DF.DIVS | DF.VIEWS | {"rsqrt", "sqrt"}
    near = DF.walk([scaled] if scaled else [], lambda n: [p for p in n.parents if p.op in factors])
    roots = [n for n in near if n.op in ("rsqrt", "sqrt")]
    added = [p.value for n in roots for p in n.parents if p.op in DF.ADDS and isinstance(p.value, float)]
    return added[0] if added else None


def _floor(flow, weight: str) -> float | None:
    """The square of the floor of the L2 norm a norm scaled by `weight` divides x by (x / norm(x).clamp(min=e),
    F.normalize's e = 1e-12): x / max(|x|, e) * sqrt(D) is an RMSNorm of an eps under e^2 / D, read as e^2 (its root
    adds none); None where x is not divided by a floored norm."""
    scaled = next((n for n in flow.nodes if n.op in DF.MULS and weight in {DF.root(p).param for p in n.parents}), None)
    near = DF.walk([scaled] if scaled else [], lambda n: [p for p in n.parents if p.op in DF.MULS | DF.DIVS | DF.VIEWS])
    met = [p for n in near for p in n.parents]
    floors = [DF.bounds(p)[0] for p in met if p.op.startswith("clamp") and p.parents[0].op == "norm"]
    floors += [1e-12 for p in met if p.op == "normalize"]
    return floors[0] ** 2 if floors and floors[0] > 0 else None


def _as_read(found: Structure, module: nn.Module, flow) -> None:
    """The pieces as the forward reads them: a weight F.linear or F.multi_head_attention_forward applies (out, in)
    with the bias the op adds, a raw 3-axis one as einsum or @ reads it (dropped where neither reads it as stored)."""
    linears = [n.parents[1:3] for n in flow.nodes if n.op == "linear" and len(n.parents) > 1]
    as_linear = {DF.weight_of(w[0]): _shift_of(w[1:]) for w in linears}  # F.linear(x, W, b): b is W's bias
    for n in [n for n in flow.nodes if n.op in DF.MHA]:  # F.multi_head_attention_forward's: (out, in), its biases
        bias = {k: n.named.get("out_proj_bias" if k.startswith("out") else "in_proj_bias") for k in n.named}
        as_linear |= {w: bias[k] for k, w in n.named.items() if k.endswith("proj_weight")}
    for piece in [p for p in found.pieces if not p.heads and p.weight not in flow.lookups]:  # 2-D: as first read
        stored = tuple(module.get_parameter(piece.weight).shape)
        rows = _rows_summed(flow, piece.weight, stored) if len(stored) == 2 else None
        rows = False if rows is None and piece.weight in as_linear else rows  # F.multi_head_attention_forward's
        if rows is not None:
            piece.out_features, piece.in_features = stored[::-1] if rows else stored
            piece.transposed = rows
    for piece in [p for p in found.pieces if p.heads]:  # a raw 3-axis weight, as einsum or @ reads it
        shape = tuple(module.get_parameter(piece.weight).shape)
        layout = _flattened(flow, piece.weight, shape) or head_layout(flow, piece.weight, shape)
        if layout is None:
            found.pieces.remove(piece)  # not read as a projection: refused where a unit needs it (units._pieces)
        else:
            piece.out_features, piece.in_features, piece.transposed, piece.heads, piece.each_transposed = layout[:5]
            piece.axes = layout[5]
    placed = {n for x in found.norms + found.pieces for n in (x.weight, x.bias)} | set(found.orphans)
    loose = {n for n, p in module.named_parameters() if p.ndim == 1 and n not in placed}  # no name paired them
    products = {DF.projection(n) for n in flow.nodes if n.op in DF.PRODUCTS}
    unread = {p.weight for p in found.pieces if p.weight not in products | flow.lookups}  # Keras' (N, Dh) bias
    _shifts_as_added(found, flow, {w: b for w, b in as_linear.items() if b is not None}, loose | unread)
    biases = {p.bias for p in found.pieces}
    found.pieces[:] = [p for p in found.pieces if p.weight not in biases]


def _rows_summed(flow, weight: str, shape: tuple) -> bool | None:
    """Whether the first product reading the 2-D `weight` sums over its stored rows (stored (in, out): x @ W) or
    over its columns (stored (out, in): F.linear(x, W), x @ W.T, einsum("...i,oi->...o")): the views between the
    parameter and the product replayed on the weight's indices, then read along the axis the product sums over.
    None where no product reads it, or its views or its sum cannot be read."""
    node = next((n for n in flow.nodes if n.op in DF.PRODUCTS and DF.projection(n) == weight), None)
    i = next((i for i, p in enumerate(node.parents) if DF.weight_of(p) == weight), 0) if node else 0
    axis = _summed_axis(node, i) if node else None
    chain = list(DF.walk([node.parents[i]], lambda n: n.parents[:1] if n.param is None else []))[:-1] if node else []
    if axis is None or any(n.call is None for n in chain):
        return None
    codes = torch.arange(math.prod(shape), dtype=torch.float64).reshape(shape)
    try:
        replayed = {id(chain[-1].call[1][0]): codes} if chain else {}  # the first view's argument: the parameter
        for n in reversed(chain):
            replayed[n.tid] = DF._replay(n, replayed)
        seen = replayed[chain[0].tid] if chain else codes
        line = seen.movedim(axis, 0).reshape(seen.shape[axis], -1)[:, 0]
    except Exception:  # a view that does not replay on indices
        return None
    rows, columns = len(set((line // shape[1]).tolist())) > 1, len(set((line % shape[1]).tolist())) > 1
    return rows if rows != columns else None


def _summed_axis(node, i: int) -> int | None:
    """The axis of the product `node`'s `i`-th operand that it sums over: F.linear's weight its last; matmul's
    right operand (addmm's mat2) its second last, its left one its last; an einsum's the one letter of the operand's
    term not in the result. None for any other."""
    if node.op == "linear":
        return -1 if i == 1 else None
    right = {"matmul": 1, "__matmul__": 1, "mm": 1, "bmm": 1, "__rmatmul__": 0, "addmm": 2, "baddbmm": 2}.get(node.op)
    if right is not None:
        return -2 if i == right else -1
    found = DF.terms(node.extra) if node.op == "einsum" else None
    term, result = (found[0][i], found[1]) if found is not None and i < len(found[0]) else ("", "")
    summed = [k for k, c in enumerate(term) if c not in result]
    return summed[0] if len(summed) == 1 else None


def _shift_of(nodes: list) -> str | None:
    """The 1-D parameter `nodes` (an op's bias argument, or none) is, seen through views; else None."""
    seen = DF.root(nodes[0]) if nodes else None
    return seen.param if seen is not None and seen.param is not None and len(seen.shape) == 1 else None


def _shifts_as_added(found: Structure, flow, named: dict, loose: set) -> None:
    """The 1-D shifts as the forward uses them, where the names left them paired otherwise (a ParameterDict's sorted
    keys, a `_kernel` and its `_bias`) or not at all (`loose`: TF's `bdense`): F.multi_head_attention_forward's bias
    arguments (`named`: {weight: bias}, a packed one q, k and v's, however named), F.layer_norm's weight with its
    bias, a projection's output plus a bias of any shape laid out as the output's trailing axes, a scaled output plus
    a shift (a norm written out: x / sqrt(var + eps) * w + b, whatever the two are named)."""
    pairs: dict = dict(named)
    size: dict = {}
    for n in flow.nodes:
        seen = [r for r in map(DF.root, n.parents) if r.param is not None]
        params = [r.param for r in seen if len(r.shape) == 1]
        if n.op == "layer_norm" and len(params) == 2:
            pairs.setdefault(params[0], params[1])
        summed = DF.walk(n.parents, lambda t: t.parents if t.op in DF.ADDS else []) if n.op in DF.ADDS else []
        weight = next(filter(None, map(DF.projection, summed)), None)  # the nearest term of the sum: (x + h W) + b
        trailing = [r for r in seen if r.shape == n.shape[len(n.shape) - len(r.shape) :]]  # laid out as the output
        if weight is not None and len(trailing) == 1:
            pairs.setdefault(weight, trailing[0].param)
            size[trailing[0].param] = math.prod(trailing[0].shape)
        scales = [r.param for p in n.parents if p.op in DF.MULS for r in map(DF.root, p.parents) if r.param]
        if n.op in DF.ADDS and len(params) == 1 and len(scales) == 1:  # a hand norm's x_hat * weight + bias
            pairs.setdefault(scales[0], params[0])
    free = set(found.orphans) | {n.bias for n in found.norms if n.bias} | {p.bias for p in found.pieces if p.bias}
    free |= loose
    free |= set(named.values()) - {n.weight for n in found.norms}
    fits = {p.weight for p in found.pieces if size.get(pairs.get(p.weight), p.out_features) == p.out_features}
    fits |= {n.weight for n in found.norms}
    held = [x for x in found.norms + found.pieces if x.weight in pairs and pairs[x.weight] in free and x.weight in fits]
    claimed = {pairs[x.weight] for x in held}
    for x in found.norms + found.pieces:
        x.bias = pairs[x.weight] if x in held else None if x.bias in claimed else x.bias
    for norm in found.norms:
        norm.kind = "layer" if norm.bias or norm.kind == "layer" and norm.weight in pairs else norm.kind
    found.orphans[:] = sorted(free - loose - {x.bias for x in found.norms + found.pieces})  # the loose stay unread


def _indexed(found: Structure, module: nn.Module, flow) -> None:
    """The parameters the forward indexes by rows, tables: a 2-D one (F.linear's weight too: a head tied to it), or
    one of 3 axes with two over 1."""
    for piece in [p for p in found.pieces if p.weight in flow.lookups]:  # indexed: a table
        found.pieces.remove(piece)
        trainable = module.get_parameter(piece.weight).requires_grad
        rows, width = (piece.in_features, piece.out_features)[:: 1 if piece.transposed else -1]
        found.tables.append(Table(piece.weight, rows, width, trainable, False))
    tensors = dict(module.named_parameters())  # a (1, T, D) or (T, 1, D) parameter indexed by rows: a table too
    for name in sorted(flow.lookups - {t.name for t in found.tables} - {p.weight for p in found.pieces}):
        sizes = [s for s in tensors[name].shape if s > 1] if name in tensors else []
        if len(sizes) == 2 and tensors[name].shape[-1] == sizes[1]:
            found.tables.append(Table(name, *sizes, tensors[name].requires_grad, False))


def _flattened(flow, weight: str, shape: tuple) -> tuple | None:
    """(out, in, False, 0, False) where F.linear reads the 3-axis `weight` (a, b, in) as (a b, in) through views that
    keep its order (flatten(end_dim=1), view(a b, in): the speedrun's stacked (3, D, D) q, k, v), else None."""
    rows = (math.prod(shape[:-1]), shape[-1])
    for node in (n for n in flow.nodes if n.op == "linear" and len(n.parents) > 1 and n.parents[1].shape == rows):
        seen = node.parents[1]
        while seen.param is None and seen.op in DF.VIEWS and seen.op not in ("t", "transpose", "permute"):
            seen = seen.parents[0]
        if seen.param == weight:
            return (*rows, False, 0, False, ())
    return None


def head_layout(flow, weight: str, shape: tuple) -> tuple | None:
    """(out_features, in_features, transposed, heads, each_transposed, axes) of a 3-axis `weight` as the first
    einsum (or x @ W, as _as_einsum writes it) reading it uses it: the axes it sums over are the inputs, the others
    the outputs, in the order the other operand and the result keep them (the heads the first of two). Outputs then
    inputs ((H, Dh, D), (D, H, Dh)): (out, in) rows; inputs then outputs: transposed; an input between two outputs
    ((H, D, Dh), TransformerLens's W_Q): each head's rows transposed; an output between two inputs: the same,
    transposed. Two inputs (or outputs) stored in the other order than the operands keep them ((Dh, H, D) read as
    "hd" by "bphd,dhm->bpm"): the same map, its entries stored in another order (`axes`, Link.axes). None where no
    product reads it as stored (a transpose on the way)."""
    node = next(
        (n for n in flow.nodes if n.op in ("einsum", "matmul", "__matmul__") and DF.projection(n) == weight), None
    )
    if node is None:
        return None
    i = next(i for i, p in enumerate(node.parents) if DF.weight_of(p) == weight)
    seen = node.parents[i]
    while seen.param is None:  # through casts and copies only: its axes as stored
        if seen.shape != shape or seen.op in ("t", "transpose", "permute"):
            return None
        seen = seen.parents[0]
    found = DF.terms(node.extra if node.op == "einsum" else _as_einsum(node, i, flow.roles.get(weight)))
    if found is None:  # einsum(x, [0, 1], w, [1, 2]): operands without an equation; W @ x
        return None
    terms, result = found
    axes = terms[i]
    kept, summed = [c for c in axes if c in result], [c for c in axes if c not in result]
    other = next((t for j, t in enumerate(terms) if j != i and set(summed) <= set(t)), "")
    if len(axes) != 3 or not kept or not other or len(set(axes)) != 3:
        return None
    ordered = iter(sorted(kept, key=result.index)), iter(sorted(summed, key=other.index))
    laid = "".join(next(ordered[c not in result]) for c in axes)  # each group's axes in the operands' order
    size = dict(zip(axes, shape, strict=True))
    heads = size[(kept if len(kept) == 2 else summed)[0]]
    each = (axes[0] in result) == (axes[2] in result)  # outputs around an input, or inputs around an output
    moved = tuple(map(laid.index, axes)) if laid != axes else ()
    return math.prod(size[c] for c in kept), math.prod(size[c] for c in summed), laid[0] in summed, heads, each, moved


def _as_einsum(node, i: int, role: str | None) -> str:
    """x @ W of a 3-axis W (its `i`-th parent; "" where it is the left operand) as an einsum: W's first axis the
    heads, kept for a query, key or value, summed after it for an output projection ((x @ W_o).sum(1))."""
    batch = "abcfg"[: len(node.shape) - 3]
    if i != 1 or len(node.shape) < 3:
        return ""
    return f"{batch}hmk,hkn->{batch}{'' if role == 'out' else 'h'}mn"


def _untied(module: nn.Module, found: Structure) -> Structure:
    """A tied tensor under the name it was first registered (named_parameters'): a table held by several modules is
    one table, and a linear tied to a table (the table stands for both) or to an earlier linear is not read again."""
    first: dict = {}
    alias = {name: first.setdefault(id(p), name) for name, p in module.named_parameters(remove_duplicate=False)}
    for item in found.pieces + found.norms:
        item.weight, item.bias = alias.get(item.weight, item.weight), item.bias and alias.get(item.bias, item.bias)
    tables: dict = {}
    for t in found.tables:
        t.name = alias.get(t.name, t.name)
        tables.setdefault(t.name, t)
    pieces: dict = {}
    for piece in found.pieces:
        if piece.weight not in tables:
            pieces.setdefault(piece.weight, piece)
        elif piece.bias is not None:  # a head tied to the token table with a bias of its own: an output bias
            found.orphans.append(piece.bias)
    return replace(found, tables=list(tables.values()), pieces=list(pieces.values()))


def _read_builtin(mod: nn.Module, path: str, prefix: str, found: Structure) -> bool:
    """torch's own modules by their class (nn.MultiheadAttention, nn.Linear or a 1x1 nn.Conv1d, nn.LayerNorm and
    nn.RMSNorm (eps None: float64's machine epsilon, as torch takes it), nn.Embedding); False for any other."""
    weight = getattr(mod, "weight", None)
    bias = f"{prefix}bias" if isinstance(getattr(mod, "bias", None), torch.Tensor) else None
    if isinstance(mod, nn.MultiheadAttention):  # its packed in_proj_weight (3D, D), or q, k and v's own
        fused = mod.in_proj_weight is not None
        for name in ["in_proj_weight"] if fused else ["q_proj_weight", "k_proj_weight", "v_proj_weight"]:
            packed = f"{prefix}in_proj_bias" if fused and mod.in_proj_bias is not None else None
            found.pieces.append(Piece(prefix + name, packed, *getattr(mod, name).shape, False))
    elif isinstance(mod, nn.Conv1d) and (mod.kernel_size != (1,) or mod.groups != 1):  # no position-wise linear
        across = f"of kernel {mod.kernel_size[0]}, a convolution over neighbouring positions"
        raise NoPair(path, f"nn.Conv1d {across if mod.kernel_size != (1,) else 'of groups, a block-diagonal linear'}")
    elif isinstance(mod, (nn.Linear, nn.Conv1d)):
        found.pieces.append(Piece(f"{prefix}weight", bias, *mod.weight.shape[:2], False))
    elif isinstance(mod, (nn.LayerNorm, getattr(nn, "RMSNorm", ()))):
        if weight is not None:
            eps = mod.eps if mod.eps is not None else float(torch.finfo(torch.float64).eps)
            kind = "layer" if isinstance(mod, nn.LayerNorm) else "rms"
            found.norms.append(Norm(f"{prefix}weight", bias, weight.shape[-1], eps, path, kind))
    elif isinstance(mod, nn.Embedding):
        position = bool(POSITION_WORDS.search(path.lower()))
        found.tables.append(Table(f"{prefix}weight", *weight.shape, weight.requires_grad, position, 0, mod.padding_idx))
    else:
        return False
    return True


def _linear_of_own(mod: nn.Module, name: str) -> bool:
    """Whether `mod`'s forward applies its parameter `name` as F.linear's weight (stored (out, in)), as a custom
    Linear class does: read from its source; the recorded flow settles it after (structure)."""
    try:
        source = inspect.getsource(type(mod).forward)
    except (OSError, TypeError):
        return False
    return re.search(rf"\blinear\(\s*[^,()]+,\s*self\.{re.escape(name)}\b", source) is not None


def _read_own(mod: nn.Module, path: str, prefix: str, found: Structure) -> None:
    """Any other module by its own tensors: 2-D parameters tables where named for positions or embeddings, else raw
    (in, out) linear weights with the bias named after them; 3-D ones weights (d_model their widest axis till the
    flow reads them); 1-D ones left norms (a scale and a shift of one width; a scale alone: RMSNorm), the shifts
    left over orphans (an output bias); fixed tables 2-D float buffers and plain tensor attributes (d2l's `self.P`)."""
    own = dict(mod.named_parameters(recurse=False))
    used: set = set()
    for name, p in sorted(own.items(), key=lambda item: -item[1].ndim):  # 3-axis weights first: their biases 2-D
        if p.ndim not in (2, 3) or name in used:
            continue
        full = f"{prefix}{name}"
        position = bool(POSITION_WORDS.search(full.lower()))
        if p.ndim == 2 and (position or EMBEDDING_WORDS.search(full.lower())):
            found.tables.append(Table(full, *p.shape, p.requires_grad, position))
            continue
        partners = (re.sub("weight$", "bias", name), re.sub(r"^[Ww]", "b", name), re.sub(r"^[Ww]", "B", name))
        bias = next((b for b in partners if b != name and b in own), None)  # weight -> bias, W_q -> b_q, w1 -> b1
        used |= {name} | ({bias} if bias is not None else set())
        as_linear = _linear_of_own(mod, name)  # F.linear(x, self.weight): stored (out, in), as nn.Linear's
        shape = (p.shape if as_linear else p.shape[::-1]) if p.ndim == 2 else (p.numel() // max(p.shape), max(p.shape))
        heads = p.shape[0] if p.ndim == 3 else 0  # till the flow says
        found.pieces.append(Piece(full, f"{prefix}{bias}" if bias else None, *shape, not as_linear, heads))
    ones = [n for n, p in own.items() if p.ndim == 1 and n not in used]
    scales = [n for n in ones if re.search(r"(weight|gamma|a_2|^g$|_g$|scale|alpha)", n)]  # ln_1_g
    shifts = [n for n in ones if re.search(r"(bias|beta|b_2|^b$|_b$|shift)", n)]  # ln_1_b
    eps = _eps(mod)
    for w in scales:
        b = next((s for s in shifts if own[s].shape == own[w].shape), None)
        if b is not None:
            shifts.remove(b)
        kind = "layer" if b else "rms"  # a scale without a shift: RMSNorm (Llama's)
        found.norms.append(Norm(f"{prefix}{w}", b and f"{prefix}{b}", own[w].shape[0], eps, path, kind))
    found.orphans.extend(f"{prefix}{n}" for n in shifts)
    kept = [(n, t) for n, t in vars(mod).items() if isinstance(t, torch.Tensor) and not isinstance(t, nn.Parameter)]
    for name, buf in list(mod.named_buffers(recurse=False)) + kept:
        if buf.is_floating_point() and buf.ndim >= 2 and sum(s > 1 for s in buf.shape) == 2:
            rows, width = [s for s in buf.shape if s > 1]
            found.tables.append(Table(f"{prefix}{name}", rows, width, False, True))


def _eps(mod: nn.Module) -> float | None:
    """The module's own eps, where it names one."""
    values = (getattr(mod, attr, None) for attr in ("eps", "variance_epsilon", "epsilon", "layer_norm_eps"))
    return next((v for v in values if isinstance(v, float)), None)


def pair_order(n: int, Dh: int, rotary: int = 0, order: tuple = ()) -> np.ndarray:
    """user rows = reference rows[order] for q or k rows (n, heads of Dh) paired (2i, 2i + 1) as Meta's code rotates
    them, against Hugging Face's halves (i, i + Dh/2): a head's row 2i is the reference's i, row 2i + 1 its
    i + Dh/2; with `rotary` < Dh (GPT-J's partial rotary) within the first `rotary` rows only; `order`: each head's."""
    u, r = np.arange(Dh), rotary or Dh
    head = np.asarray(order) if order else np.where(u < r, u // 2 + (u % 2) * (r // 2), u)
    return (np.arange(0, n, Dh)[:, None] + head).reshape(-1)


def rope_paired(name: str, Dh: int) -> bool:
    """True when the reference tensor `name` is a query or key projection's (or its norm's: the same features; latent
    attention's q_b_proj and kv_a_proj, whose last rows per head are the rotary ones) and the q/k features are read
    in another order (interleaved pairs, or relabelled)."""
    parts = name.rsplit(".", 2)
    return Dh > 0 and len(parts) > 1 and parts[-2] in ("q_proj", "k_proj", "q_norm", "k_norm", "q_b_proj", "kv_a_proj")


def rows_of(tensor: np.ndarray) -> np.ndarray:
    """A reference tensor's rows: a stacked one's (experts') leading axes merged."""
    return tensor.reshape(-1, tensor.shape[-1]) if tensor.ndim > 2 else tensor


def gather(link: Link, reference: dict) -> np.ndarray:
    """The user's tensor (before any transpose): the rows of the reference tensors its link names stacked (leading
    axes merged: an expert's rows of the experts' stacked weights; of them the link's columns; q and k rows in the
    link's RoPE pairing) after
    `offset` rows of zeros, minus 1 where the user scales by 1 + weight."""
    blocks, Dh = [], link.rope_pairs or len(link.rope_order)
    for n, rows in link.parts:
        whole = reference[n] if rows is None else rows_of(reference[n])
        whole = whole[pair_order(len(whole), Dh, link.rope_rotary, link.rope_order)] if rope_paired(n, Dh) else whole
        block = whole if rows is None else whole[rows[0] : rows[1]]  # a part's rows of the reordered tensor
        start, step, *stop = link.columns or (0, 1)
        blocks.append(block[:, start : (stop + [None])[0] : step] if link.columns else block)
    zeros = np.zeros((link.offset, *blocks[0].shape[1:]), blocks[0].dtype)
    return np.concatenate([zeros, *blocks]) - link.minus_one


def _laid_out(link: Link, reference: dict, shape: tuple) -> np.ndarray:
    """The user's tensor of `shape` as `link` lays the reference's out: gathered, transposed, heads transposed."""
    value = gather(link, reference)
    value = value.T if link.transposed else value
    if link.each_transposed:
        value = value.reshape(link.heads, -1, value.shape[-1]).transpose(0, 2, 1)
    if link.axes:  # laid out in the order the einsum reads it, then stored in the user's order
        laid = [shape[link.axes.index(k)] for k in range(len(shape))]
        value = value.reshape(laid).transpose(link.axes)
    return np.ascontiguousarray(value).reshape(shape)


def ties(links: list) -> list:
    """((name, rows), (name, rows)) for each part of a user tensor linked again, paired with its first link's: a
    module run at several depths, whose reference layers hold the same weights (units.Linker._stack). Parts of
    other rows are no tie."""
    first: dict = {}
    pairs = [
        pair
        for link in links
        if first.setdefault(link.user, link) is not link and len(link.parts) == len(first[link.user].parts)
        for pair in zip(first[link.user].parts, link.parts, strict=True)
    ]
    return [(a, b) for a, b in pairs if a[1] == b[1]]


def _at(tensor: np.ndarray, rows) -> np.ndarray:
    return tensor if rows is None else rows_of(tensor)[rows[0] : rows[1]]


def tied(links: list, reference: dict) -> dict:
    """The reference's tensors with each tied part (ties) a copy of the part it is tied to."""
    out = dict(reference)
    for (a, rows_a), (b, rows_b) in ties(links):
        out[b] = out[b].copy()
        _at(out[b], rows_b)[...] = _at(out[a], rows_a)
    return out


def summed_over_ties(links: list, grads: dict) -> dict:
    """The reference's gradients ("d name") with each part and the parts tied to it (ties) replaced by their sum:
    the gradient of the one user tensor that stands for them all."""
    out: dict = dict(grads)
    groups: dict = {}
    for a, b in ties(links):
        groups.setdefault(a, [a]).append(b)
    for parts in groups.values():
        if all(f"d {n}" in out for n, _ in parts):
            total = sum(_at(out[f"d {n}"], rows) for n, rows in parts)
            for n, rows in parts:
                out[f"d {n}"] = out[f"d {n}"].copy()
                _at(out[f"d {n}"], rows)[...] = total
    return out


def load(module: nn.Module, links: list, reference: dict, dtype) -> None:
    """Copy the reference's tensors into the user's parameters and buffers, as the links say."""
    tensors = dict(module.named_parameters(remove_duplicate=False)) | dict(module.named_buffers())
    with torch.no_grad():
        for link in links:
            target = tensors[link.user]
            target.copy_(torch.from_numpy(_laid_out(link, reference, tuple(target.shape))).to(dtype))


def scatter(links: list, grads: dict, shapes: dict) -> dict:
    """The user's gradients (user name -> array) in the reference's names and shapes, the inverse of `load`: the
    reference's numbers, numbered from 1 and laid out as `load` lays them, say where each user number goes (0: an
    unread row); those no link reads stay zero."""
    out: dict = {}
    for link in links:
        if link.user not in grads:
            continue
        g, names = grads[link.user], list(dict.fromkeys(n for n, _ in link.parts))
        starts = np.cumsum([1] + [math.prod(shapes[n]) for n in names])
        spans = list(zip(names, starts[:-1], starts[1:], strict=True))
        numbered = {n: np.arange(a, b).reshape(shapes[n]) for n, a, b in spans}
        placed = _laid_out(replace(link, minus_one=False), numbered, g.shape)
        for n, a, b in spans:
            held = (placed >= a) & (placed < b)
            out.setdefault(n, np.zeros(shapes[n])).flat[placed[held] - a] = g[held]
    return out
