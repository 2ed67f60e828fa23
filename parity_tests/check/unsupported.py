"""Math the reference has no pair for, named in the user's terms: "differs at <submodule>: <op> computes <what>,
which the reference has no pair for" (Result.unsupported).

The recorded forward (dataflow.Flow, each op's output kept) is read for what no reference level computes, one finder
per kind (FINDS: a norm without a weight, F.glu, a term on the scores, LayerScale, ...); an activation none of the
reference's (ReLU squared, tanh, ...) is told apart by its values. QuickGELU's x * sigmoid(c x) at another constant
than 1.702 is a catalogued mistake instead (activation.quick_gelu_constant): explain returns its Diagnosis."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import re

import numpy as np
import torch
import torch.nn.functional as F

from numpy_transformer.scores import alibi_slopes, relative_buckets

from . import dataflow as DF
from .diagnosis import Diagnosis, relative
from .wiring import PASSING


def differs(where: str, what: str) -> str:
    return f"differs at {where or '(the module)'}: {what}, which the reference has no pair for"


class NoPair(ValueError):
    """Raised where reading the module meets math the reference does not have: `where` (the user's submodule) and
    `what` it computes (`place`); check.module answers it (`answer`) as Result.unsupported."""

    def __init__(self, where: str, what: str, level: str = ""):
        said = f"the reference {level!r}" if level else "the reference"
        super().__init__(f"{where} computes {what}: {said} has none, so this is math it does not have")
        self.answer, self.place = differs(where, what), (where, what)
        self.flow: DF.Flow | None = None  # the recorded forward, where it was read before this was raised


NORMS = {"rms_norm", "layer_norm", "group_norm", "normalize"}  # F.normalize: x / max(|x|, eps)

# element-wise activations, in the user's terms: (what it computes, the function, whether the reference has it)
ACTIVATIONS = (
    ("relu(x)", F.relu, True),
    ("gelu(x) (erf)", F.gelu, True),
    ("gelu(x) (tanh approximation)", lambda x: F.gelu(x, approximate="tanh"), True),
    ("silu(x) = x * sigmoid(x)", F.silu, True),
    ("relu(x)^2 (ReLU squared)", lambda x: F.relu(x) ** 2, False),
    ("x * sigmoid(1.702 x) (QuickGELU)", lambda x: x * torch.sigmoid(1.702 * x), True),
    ("tanh(x)", torch.tanh, False),
    ("sigmoid(x)", torch.sigmoid, False),
    ("leaky_relu(x, 0.01)", F.leaky_relu, False),
    ("elu(x)", F.elu, False),
    ("softplus(x)", F.softplus, False),
    ("mish(x)", F.mish, False),
    ("x (no activation)", lambda x: x, False),
)


def explain(flow, since: str | None = None, met: tuple | None = None) -> str | Diagnosis | None:
    """The finders' answer on `flow` at the submodule that runs first (of a tie, FINDS' order): the no-pair text, or
    the Diagnosis of QuickGELU's constant mistyped; None where it computes nothing this module names (or was not
    recorded). `since`: the submodule the outputs first diverge at; those that ran before it agreed with the
    reference, so what they compute is no cause: a finder that answers there reads again from `since`'s first op.
    `met`: the (where, what) of a NoPair reading the module raised, said where it runs before every finder's."""
    if not flow:
        return None
    start = _ran(flow, since) if since and since != "(the module)" else 0
    after = dataclasses.replace(flow, nodes=flow.nodes[start:]) if start else flow

    def kept(f) -> bool:  # found where it can be the cause: from `since` on, in a submodule holding it or inside it,
        where = _where(f) if f is not None else ""  # or in one no weight is compared at (it holds none)
        inside = f"{where}.".startswith(f"{since}.") or str(since).startswith(f"{where}.")
        unweighed = bool(where) and not any(f"{o}.".startswith(f"{where}.") for o in flow.owners)
        return f is not None and (_ran(flow, where) >= start or inside or unweighed)

    found = [f if kept(f := find(flow)) or f is None else find(after) for find in FINDS]
    first = min((f for f in found if kept(f)), key=lambda f: _rank(flow, f), default=None)
    if met is not None and (first is None or _ran(flow, met[0]) < _rank(flow, first)):
        return differs(*met)
    return first if first is None or isinstance(first, Diagnosis) else differs(*first[:2])


def _rank(flow, found) -> int:
    """Where a finding runs in data flow: the op it names where it gives one (a third item), else the first op of
    its submodule."""
    return found[2] if isinstance(found, tuple) and len(found) > 2 else _ran(flow, _where(found))


def _where(found) -> str:
    return found.where if isinstance(found, Diagnosis) else found[0]


def _ran(flow, where: str) -> int:
    """The index of the first op recorded in submodule `where` (inside it, where none ran in it directly); the
    parameters it reads and the inputs it is given are no op run."""
    inside = (n.index for n in flow.nodes if n.module == where and n.op not in ("param", "input"))
    return next(inside, next((n.index for n in flow.nodes if n.module.startswith(f"{where}.")), len(flow.nodes)))


# between the scores' product and the softmax: the scale, the masks, a soft cap, and what the reference lacks
SCORES_PATH = DF.ADDS | DF.MULS | DF.DIVS | DF.VIEWS | {"masked_fill", "where", "sub", "__sub__", "tanh"}


def _to_scores(node, depth: int = 12) -> bool:
    """Whether `node` is the scores q k^T (a product of no weight) or computed from them on the way to the softmax."""
    if node.op in DF.PRODUCTS:
        return DF.projection(node) is None
    return depth > 0 and node.op in SCORES_PATH and any(_to_scores(p, depth - 1) for p in node.parents)


def _terms(rec):
    """(node, term, value) for each term joining an attention's scores before the softmax (torch's, or exp(s - max s)
    written out; SDPA's float attn_mask) that is not the scores: multiplied, added or subtracted (a second product:
    value None), or the tensor baddbmm adds (BLOOM's ALiBi: where it was recorded, and beta is not 0), value its
    float64 as added (_read). A row constant (the max a softmax by hand subtracts, any (..., 1) term) is none: the
    normalisation along the keys cancels it; nor is the scores' own logsumexp subtracted (_normaliser: a softmax,
    over its axis)."""
    for s in (n for n in rec.nodes if n.op in DF.SOFTMAX and n.parents):
        seen = rec.keys_seen(s)
        for node in DF.walk(s.parents[:1], lambda n: n.parents if n.op in SCORES_PATH else []):
            if node.op in DF.MULS and _to_scores(node):
                yield from ((node, p, _read(rec, p, 1.0, seen)) for p in node.parents if not _to_scores(p))
            elif node.op in DF.ADDS | DF.SUBS and _to_scores(node):
                products = [p for p in node.parents if p.op in DF.PRODUCTS and _to_scores(p)]
                yield from ((node, p, None) for p in products[1:])  # a second product: Transformer-XL's position
                for k, p in enumerate(node.parents):
                    if not _to_scores(p) and tuple(p.shape[-1:]) != (1,) and not _normaliser(node, p):
                        yield node, p, _read(rec, p, -1.0 if k and node.op in DF.SUBS else 1.0, seen)
            elif node.op == "baddbmm" and node.value and node.parents[0].index in rec.values:  # a recorded tensor added
                yield node, node.parents[0], _read(rec, node.parents[0], 1.0, seen)
    for s in (n for n in rec.nodes if n.op == DF.SDPA and len(n.parents) > 3):  # a float attn_mask: added to scores
        value = rec.values.get(s.parents[3].index)
        if value is not None and value.is_floating_point():
            yield s, s.parents[3], _read(rec, s.parents[3], 1.0, rec.keys_seen(s))


def _normaliser(node, term) -> bool:
    """Whether `term` is the logsumexp of the scores `node` subtracts it from: exp(s - logsumexp(s, dim)) is
    softmax(s, dim), over whichever axis (the catalogue's search names a wrong one), no term on the scores."""
    lse = DF.root(term)
    return node.op in DF.SUBS and lse.op == "logsumexp" and DF.root(lse.parents[0]) is DF.root(node.parents[0])


def _read(rec, term, sign: float, seen):
    """sign times the term's recorded value in float64, NaN at the (query, key) pairs no sequence nor head reads
    (`seen` (T, S), its softmax's); None where it was not recorded."""
    value = rec.values.get(term.index)
    value = None if value is None else sign * value.detach().double()
    fits = value is not None and seen is not None and value.ndim >= 2 and value.shape[-2] in (1, seen.shape[0])
    return torch.where(seen, value, math.nan) if fits and value.shape[-1] == seen.shape[1] else value


def reference_alibi(rec) -> bool:
    """Whether the scores get a bias, and each the reference's ALiBi (its slopes; on the keys read, the same
    softmax as -m |i - j|): positional "alibi"."""
    values = [v for n, t, v in _terms(rec) if n.op not in DF.MULS]
    biases = [v for v in values if v is None or not _mask(v)]
    causal = _causal(values)
    return bool(biases) and all(v is not None and _alibi(v, causal) == "reference" for v in biases)


def score_terms(rec) -> tuple | None:
    """A term added to an attention's scores before the softmax that is no mask (_bias: ALiBi's, T5's, another), or
    a factor multiplying them computed from a parameter (a learned temperature) that is not 1 at every key read
    (_keeps: a mask's keep side); T5's bias read as the reference's (_t5) is none, unless each layer reads a table
    of its own (the reference: one a stack)."""
    terms = list(_terms(rec))
    causal, reads = _causal([v for n, _, v in terms if n.op not in DF.MULS]), t5_relative(rec, whole=False)
    for node, term, value in terms:
        if node.op in DF.MULS:
            learned = [n.param for n in DF.walk([term], lambda n: n.parents) if n.param is not None]
            if learned and not _keeps(value):
                return node.module, f"the scores are multiplied by a learned factor of {learned[0]} (a temperature)"
            continue
        if term.op in DF.PRODUCTS:
            return node.module, f"the scores get a second product added before the softmax, {_product(term)}"
        t5 = _t5(rec, node, term, value)
        if isinstance(t5, tuple) and isinstance(reads, str):
            return node.module, f"the scores get T5's relative position bias, {reads}"
        if isinstance(t5, tuple):
            continue  # the reference's
        said = _bias(value, causal) if value is not None else "a learned bias"
        said = f"T5's relative position bias from {t5}" if t5 else said
        if said and not t5 and value is not None and _per_input(value):
            up = DF.walk([term], lambda n: n.parents if n.op not in DF.PRODUCTS else [])
            ops = sorted((n for n in up if n.op not in DF.VIEWS | {"param", "input"}), key=lambda n: n.index)
            said += f" computed from the input ({' -> '.join(dict.fromkeys(n.op for n in ops))})"
        if said:
            return node.module, f"the scores get {said} added before the softmax"
    return None


def _cross_mask(rec) -> tuple | None:
    """A mask on a cross-attention's scores (its keys projected from another tensor than its queries) that is not
    the same for every query (a causal triangle over the memory): the reference masks a cross-attention's keys by
    the source's padding alone."""
    for s in (n for n in rec.nodes if n.op in DF.SOFTMAX and n.parents):
        seen, walked = rec.keys_seen(s), DF.walk(s.parents[:1], _down)
        scores = next((n for n in walked if n.op in DF.PRODUCTS and not DF.projection(n)), None)
        q, k = (_inputs(p) for p in scores.parents[:2]) if scores is not None else ([], [])
        if seen is None or seen.ndim != 2 or not _apart(q, k) or bool((seen == seen[:1]).all()):
            continue
        causal = bool((seen == torch.ones(seen.shape, dtype=torch.bool).tril()).all())
        how = ": query i reads memory positions 0 .. i alone (a causal triangle)" if causal else ""
        said = f"the cross-attention's scores get a mask that differs from query to query{how}"
        return s.module, f"{said} (the reference masks a cross-attention's keys by the source's padding alone)"
    return None


def _down(node) -> list:
    """Back from a term's sum along the scores' side (SCORES_PATH) to their product."""
    return [p for p in node.parents if _to_scores(p)] if node.op in SCORES_PATH else []


def _inputs(node) -> list:
    """The tensors the nearest projections behind `node` read (through element-wise ops and views)."""
    found = DF.walk([node], lambda n: [] if DF.projection(n) or n.op in DF.PRODUCTS else n.parents)
    return [DF.root(p) for n in found if DF.projection(n) for p in n.parents if DF.root(p).param is None]


def _apart(q: list, k: list) -> bool:
    """Whether the queries' and the keys' projections read tensors computed from nothing in common (parameters
    aside): a cross-attention's. The module's own inputs (a leaf each time a product reads one) tell nothing alone."""
    if not q or not k or all(n.op == "input" for n in q + k):
        return False
    up = [{id(n) for n in DF.walk(side, lambda n: n.parents) if n.param is None} for side in (q, k)]
    return not up[0] & up[1]


def _product(node) -> str:
    """A product of two operands in the user's terms: each one's projection weights (and the learned tensors added
    to it), and "a table the forward computes" where nothing the module was called on (its inputs, its ids' lookups)
    flows into it."""

    def operand(n) -> str:
        weights, _, learned = DF.back(n)
        fixed = not any(m.op in ("input", "embedding") for m in DF.walk([n], lambda m: m.parents))  # ids' too
        said = " and ".join(dict.fromkeys(weights)) or _rows(n) or "the states"
        said += f" (with {', '.join(learned)} added)" if learned else ""
        return said + " of a table the forward computes (not the input: a positional term)" * fixed

    return " times ".join(operand(p) for p in node.parents[:2])


def _rows(node) -> str:
    """The rows of a table `node` is (through views and element-wise ops, no product), in the user's terms: the
    table's name and what picks them (key - query where the ids are a function of it alone: relative positions);
    "" where it is no lookup."""
    met = DF.walk([node], lambda n: [] if n.op in DF.PRODUCTS or isinstance(n.value, np.ndarray) else n.parents)
    for n in (n for n in met if isinstance(n.value, np.ndarray) and n.op in ("embedding", "__getitem__")):
        table, ids = DF.weight_of(n.parents[-(n.op == "embedding")]), np.asarray(n.value)
        square = ids.ndim >= 2 and ids.shape[-1] == ids.shape[-2] > 1 and ids.min() < ids.max()
        by = "key - query (relative positions)" if square and (ids[..., 1:, 1:] == ids[..., :-1, :-1]).all() else "ids"
        return f"the rows of {table} picked by {by}" if table else ""
    return ""


def _macaron(flow) -> tuple | None:
    """A feed-forward block summed into the stream (times a number, where one scales it) before the first attention
    reads that stream (Conformer's macaron half-step, x + 0.5 ffn(x), before its attention): the reference's layers
    run their feed-forward after the attention. Said at the outermost submodule whose output is the block's."""
    weights = flow.attentions[0].q if flow.attentions and flow.blocks else []
    reads = [n for n in flow.nodes if n.param in weights][:1]  # the first attention's queries' weight
    ahead = DF.walk(reads and reads[0].children, lambda n: [] if DF.projection(n) or n.op in DF.MHA else n.children)
    attention = next((n for n in ahead if DF.projection(n) or n.op in DF.MHA), None)
    ends = [next((n for n in flow.nodes if DF.projection(n) == w), None) for w in flow.blocks[0][::-1]] if reads else []
    if attention is None or None in ends or ends[0].index > attention.index:
        return None
    out, first = ends[0], ends[-1]
    stream = {id(n) for n in DF.walk([p for p in first.parents if DF.root(p).param is None], lambda n: n.parents)}
    path = list(DF.walk(out.children, lambda n: n.children if n.op in ELEMENTWISE | DF.VIEWS | {"dropout"} else []))
    stream |= set(map(id, path))
    inward = set(map(id, DF.walk([attention], lambda n: n.parents)))
    sums = [n for n in path if n.op in DF.ADDS and id(n) in inward and all(id(p) in stream for p in n.parents)]
    if not sums:
        return None
    c = math.prod(f for n in path if (f := DF._factor(n)) is not None and n.index < sums[0].index)
    where = min((k.path for k in flow.calls if k.output is out and k.path), key=len, default=out.module)
    times = f"{c:g} * " if c != 1 else ""
    what = f"a feed-forward summed into the stream before the attention (x + {times}ffn(x), a macaron half-step)"
    return where, f"{what}; the reference's layer runs its feed-forward after the attention"


def _projected(node) -> bool:
    """Computed from a projection's output (q, k or v)."""
    return bool(DF.back(node)[0])


# what a softmax over the keys (by torch, or by hand), with its scale, masks, soft cap, sinks and dropout, is made of
SOFTMAX_MADE = SCORES_PATH | DF.SOFTMAX | {
    "sum", "amax", "max", "logsumexp", "logaddexp", "cat", "clamp", "clamp_min", "dropout", "neg", "__neg__",
    "__rsub__", "rsub", "masked_fill_", "eq", "ne", "__eq__", "isinf", "isfinite", "isnan", "logical_not",
}  # fmt: skip


def _weights(rec) -> tuple | None:
    """An attention whose weights are not a softmax over the keys: on the path from the scores (a product of two
    projections' outputs, no weight) to the product with the values (no weight, its other operand a projection's),
    an op no softmax is made of (SOFTMAX_MADE): Apple's sigmoid(s - log n), stick-breaking's logsigmoid and cumsum,
    softpick's relu(exp(s) - 1) / sum |exp(s) - 1|, a conv2d over the scores; said with those ops, in order. Where
    that path holds no softmax and only the ops a softmax is made around (RetNet's decay gamma^(n - m) times the
    scores), the weights are the scores so changed: said with what makes each operand off the path (_factor)."""
    for s in (n for n in rec.nodes if n.op in DF.PRODUCTS and DF.projection(n) is None and len(n.parents) >= 2):
        if not all(map(_projected, s.parents[:2])):
            continue
        ahead = list(DF.walk(s.children, lambda n: [] if n.op in DF.PRODUCTS else n.children))
        fed = [n for n in ahead if n.op in DF.PRODUCTS and DF.projection(n) is None]
        on = {id(n) for n in DF.walk([p for f in fed for p in f.parents], lambda n: n.parents) if n in ahead}
        path = [n for n in ahead if id(n) in on and n.op not in DF.PRODUCTS]
        shown = [n for n in sorted(path, key=lambda n: n.index) if n.op not in SOFTMAX_MADE - DF.SOFTMAX]
        values = [p for f in fed for p in f.parents if id(p) not in on]  # the weights' other operand
        odd = [n for n in shown if n.op not in DF.SOFTMAX]
        bare = not any(n.op in DF.SOFTMAX for n in path) and any(_summed(f) in _sequence(rec) for f in fed)
        if bare and not odd and any(map(_projected, values)):  # RetNet's decay times the scores: no softmax at all
            said = "".join(_factor(rec, n, on | {id(s)}) for n in sorted(path, key=lambda n: n.index))
            return s.module, f"the attention's weights are the scores q k^T{said}, with no softmax over the keys"
        if odd and any(map(_projected, values)):
            writes = {n.module for n in odd if n.op == "__setitem__"}
            if len(odd) == len(writes) == 1 and odd[0].module.startswith(f"{s.module}."):  # a hook's, after them
                return odd[0].module, f"{_written(rec, odd[0])} (the reference's: a softmax over the keys, kept)"
            ops = dict.fromkeys(n.op + (f" ({n.module})" if n.module != s.module else "") for n in shown)
            said = f"the attention's weights are computed from the scores by {', '.join(ops)}"
            return s.module, f"{_feature_map(s)}{said} (the reference's: a softmax over the keys)"
    return None


def _renormalised(rec) -> tuple | None:
    """A softmax's weights (a number added to them or not) divided by their own sum over an axis along which the
    softmax's do not already sum to 1 (PCT's each column over its queries, Slot Attention's each slot's weights over
    the inputs): the reference's weights are the softmax's as they are. Said at the division."""
    for d in (n for n in rec.nodes if n.op in DF.DIVS and len(n.parents) == 2):
        top, below = (_unshifted(p) for p in d.parents)
        s, summed = DF.root(top), below.parents[0] if below.op == "sum" and below.parents else None
        if s.op not in ("softmax", "_softmax") or summed is None or _unshifted(summed) is not top:
            continue
        weights, out = rec.values.get(s.index), rec.values.get(d.index)
        if weights is None or out is None or weights.shape != out.shape:
            continue
        one = torch.ones((), dtype=weights.dtype, device=weights.device)
        axis = next((i for i in range(weights.ndim) if torch.allclose(weights.sum(i), one)), None)
        if axis is not None and not torch.allclose(out.sum(axis).to(one), one, atol=1e-6):
            over = [i for i, (a, b) in enumerate(zip(below.shape, summed.shape, strict=False)) if a == 1 != b]
            dim = f"dim {over[0]}" if len(below.shape) == len(summed.shape) and over else "another axis"
            said = f"the softmax's weights (over dim {axis}) are divided by their sum over {dim}, renormalised along"
            return d.module, f"{said} another axis than the softmax's (the reference's: the softmax's, as they are)"
    return None


def _coupled(rec) -> tuple | None:
    """A sublayer (an attention, a feed-forward block) whose output joins a residual sum with a tensor r (scaled or
    not) that its input is not computed from (through no product), nor is computed from its input, nor equals in
    value the first tensor of its shape its input is computed from (RevNet's coupling, the Reformer's
    y2 = x2 + feed_forward(norm(y1)) on the stream split in equal halves): the reference adds each sublayer's output
    to the stream it reads. Said at the sum."""
    if rec.parallel:
        return None
    subs = [(a.out_node, a.q[0], "the attention") for a in rec.attentions if a.out_node is not None and a.q]
    subs += [(rec._product(b[-1]), b[0], f"the feed-forward ({_common(b)})") for b in rec.blocks]
    for out, weight, kind in sorted((t for t in subs if t[0] is not None), key=lambda t: t[0].index):
        first = rec._product(weight)
        x = next((p for p in first.parents if DF.weight_of(p) is None), None) if first is not None else None
        joins = DF.walk(out.children, lambda n: n.children if n.op in PASSING or _biased(n) else [])
        add = next((n for n in joins if n.op in DF.ADDS and not _biased(n)), None)
        if x is None or add is None or len(add.parents) != 2:
            continue
        r = _unscaled(add.parents[0] if out in DF.walk([add.parents[1]], lambda n: n.parents) else add.parents[1])
        behind = list(DF.walk([x], lambda n: [] if n.op in DF.PRODUCTS | DF.MHA | {DF.SDPA} else n.parents))
        ahead = {id(n) for n in DF.walk([x], lambda n: n.children)}
        stream = next((n for n in behind[1:] if n.shape == r.shape and n.param is None), None)  # the norm's input
        if r.param is not None or id(r) in ahead or any(n is r for n in behind) or _equal(rec, stream, r):
            continue
        said = "is added to a tensor its input is not computed from: r + f(norm(s)), where the reference's layer adds"
        return add.module or "(the module)", f"the output of {kind} {said} it to the stream it reads, s + f(norm(s))"
    return None


def _unscaled(node):
    """`node` seen back through products by a number or a parameter (the stream scaled before the sum: Granite's
    residual multiplier on it, DeepNorm's alpha, Admin's omega)."""
    while node.op in DF.MULS | DF.DIVS and len(computed := [p for p in node.parents if DF.root(p).param is None]) == 1:
        node = computed[0]
    return node


def _biased(node) -> bool:
    """A bias (a parameter of one axis) added."""
    return node.op in DF.ADDS and any(n.param is not None and len(n.shape) == 1 for n in map(DF.root, node.parents))


def _equal(rec, a, b) -> bool:
    """Whether two recorded tensors hold the same values (the Reformer's halves, a stream copied)."""
    u, v = (None, None) if a is None else (_value(rec, a), _value(rec, b))
    return u is not None and v is not None and u.shape == v.shape and bool(torch.equal(u, v))


def _value(rec, node):
    """A node's recorded value; a chunk's or split's part (not kept) taken again from the call that made it."""
    whole = node.parents[0] if node.op in DF.SPLITS and node.parents and isinstance(node.value, int) else None
    if node.index in rec.values or whole is None or whole.call is None:
        return rec.values.get(node.index)
    func, args, kwargs = whole.call
    return func(*args, **kwargs)[node.value]


def _common(block: list) -> str:
    """The module path holding a feed-forward block's weights."""
    parts = zip(*(w.split(".")[:-1] for w in block), strict=False)
    common = [p[0] for p in itertools.takewhile(lambda p: len(set(p)) == 1, parts)]
    return ".".join(common) or "the module"


def _unshifted(node):
    """`node` seen back through views and a number added (Slot Attention's softmax + eps)."""
    while node.parents and (node.op in DF.VIEWS or node.op in DF.ADDS and len(node.parents) == 1):
        node = node.parents[0]
    return node


def _factor(rec, node, on: set) -> str:
    """What the op `node` on the scores' way to the values does with its operands off that way (`on`: the ids of the
    scores and of the nodes on it): " multiplied by a 4 x 5 x 5 tensor made by sub, pow, masked_fill from gammas"."""
    verb = "multiplied by" if node.op in DF.MULS else "divided by" if node.op in DF.DIVS else f"{node.op} with"
    said = ""
    for operand in (p for p in node.parents if id(p) not in on):
        made = sorted(DF.walk([operand], lambda n: n.parents), key=lambda n: n.index)
        ops = ", ".join(dict.fromkeys(n.op for n in made if n.op not in DF.VIEWS | {"param", "input"}))
        read = ", ".join(dict.fromkeys(str(n.param) for n in made if n.param))
        shape = " x ".join(map(str, operand.shape))
        said += f" {verb} a {shape} tensor" + (f" made by {ops}" if ops else "") + (f" from {read}" if read else "")
    return said


def _feature_map(scores) -> str:
    """The ops, in order, between the projections and the product `scores` reads, where an activation is among them
    (linear attention's elu(x) + 1 on its queries and keys): said first; "" where none is."""
    up = DF.walk(scores.parents[:2], lambda n: [] if DF.projection(n) or n.op in DF.PRODUCTS else n.parents)
    ops = [n for n in sorted(up, key=lambda n: n.index) if not DF.projection(n) and n.op not in DF.VIEWS | {"param"}]
    if not any(n.op in DF.ACTIVATIONS for n in ops):
        return ""
    said = ", ".join(dict.fromkeys(n.op for n in ops))
    return f"the attention maps its product's operands by {said} (a feature map); "


def _written(rec, node) -> str:
    """What a write into the attention's weights (t[...] = c, a hook's ablation) set, read from the values: the slices
    of an axis it left all zero (a head's, where the axis holds the heads), else that values were written."""
    value = rec.values.get(node.index)
    heads = {a.heads for a in rec.attentions if a.heads}
    for k in range(1, value.ndim if isinstance(value, torch.Tensor) else 0):
        zeros = [i for i in range(value.shape[k]) if not value.select(k, i).any()]
        if zeros and len(zeros) < value.shape[k]:
            which = ", ".join(map(str, zeros))
            head = value.shape[k] in heads and value.ndim == 4 and k == 1  # (batch, head, query, key)
            of = f"head {which}'s attention weights" if head else f"the attention weights at {which} of axis {k}"
            return f"__setitem__ sets {of} to 0 (a zero-ablation)"
    return "__setitem__ writes values over the attention weights"


def _per_input(value: torch.Tensor) -> bool:
    """A term that differs between the batch's sequences: computed from the input (FoX's forget gate), where a
    table's or a parameter's alone is the same for each."""
    return value.ndim > 2 and value.shape[0] > 1 and not torch.allclose(value, value[:1].expand_as(value))


def t5_relative(rec, whole: bool = True) -> tuple | str | None:
    """T5's bias where every bias on the scores is the reference's (_t5), one table for the bidirectional attentions
    and one for the causal ones, read at one max_distance (128 where the probe leaves it open, as T5's, else the
    least that fits): (n_buckets, max_distance, the attentions reading it, {bidirectional: table}); what differs
    where the tables are one a layer or no max_distance fits all; None: no T5 bias (`whole`: every term T5's)."""
    reads = [_t5(rec, n, t, v) for n, t, v in _terms(rec) if n.op not in DF.MULS and (v is None or not _mask(v))]
    if whole and not all(isinstance(r, tuple) for r in reads):
        return None
    reads = [r for r in reads if isinstance(r, tuple)]
    if not reads:
        return None
    tables = {(both, table) for table, _, _, both in reads}
    if len(tables) > len({both for both, _ in tables}):
        names = ", ".join(sorted({t for _, t in tables}))
        return f"a table in each layer ({names}), where the reference reads one table a stack in every layer"
    fits = set.intersection(*(set(r[2]) for r in reads))
    sizes = {r[1] for r in reads}
    if len(sizes) > 1 or not fits and whole:
        return None
    if not fits:  # each read T5's at some max_distance, no one for all
        spans = "; ".join(f"{t}: {min(m)} to {max(m)}" for t, m in {t: m for t, _, m, _ in reads}.items())
        return f"read at T5's buckets of no one max_distance (the ones each table's buckets fit, {spans})"
    return sizes.pop(), 128 if 128 in fits else min(fits), len(reads), {both: table for both, table in tables}


def _t5(rec, node, term, value) -> tuple | str | None:
    """A term on the scores read from a (n, H) table at ids (T, S) (nn.Embedding, or P[ids]): (table, n, the
    max_distances whose buckets of key - query (numpy_transformer.scores.relative_buckets) are those ids on the
    pairs read, bidirectional where keys after the query are read and the ids are no causal buckets there: bucket 0
    for every key after its query is the reference's causal bias with its mask dropped, attention.not_causal); what
    differs where the ids are no such buckets or the rows are scaled; None: no such lookup."""
    lookups = (n for n in DF.walk([term], lambda n: n.parents) if n.op in ("embedding", "__getitem__"))
    look = next((n for n in lookups if isinstance(n.value, np.ndarray) and n.value.ndim == 2 and n.parents), None)
    table = DF.weight_of(look.parents[0 if look.op == "__getitem__" else -1]) if look is not None else None
    seen = (value.isfinite() & (value > -1e3)).reshape(-1, *value.shape[-2:]).any(0) if value is not None else None
    if table is None or seen is None or look.value.shape != tuple(seen.shape) or seen.shape[0] != seen.shape[1]:
        return None
    ids, T = torch.as_tensor(look.value), seen.shape[0]
    n = DF.root(look.parents[-1 if look.op == "embedding" else 0]).shape[0]
    if n < 4 or ids.diagonal().any():  # T5's distance 0 is bucket 0: a table of another kind (one row a distance)
        return None
    onward = lambda n: n.children if n.op in SCORES_PATH and n.op not in DF.ADDS else []  # noqa: E731
    ahead = [] if node.op == DF.SDPA else DF.walk(node.children, onward)  # SDPA's scale: before its mask
    c = math.prod(f for n in ahead if (f := DF._factor(n)) is not None)  # a number the sum is scaled by after it
    if abs(c - 1) > 1e-9:
        return f"{table} scaled by {c:.4g} with the scores it is added to (the reference adds it after the scale)"
    both = bool(seen.triu(1).any())
    fits = _fitting(ids, seen, n, both)
    causal = [] if fits or not both else _fitting(ids, seen, n, False)
    if fits or causal:  # causal buckets with keys after the query read (at bucket 0): the reference's, unmasked
        return table, n, fits or causal, both and not causal
    if not both and _fitting(ids, seen, n, True):
        return f"{table} read at bidirectional buckets (an encoder's) in a causal attention"
    q = 0 if both else T - 1  # a query whose keys show the buckets read: all after it, or all before
    row = ", ".join(f"{j - q}: {int(b)}" for j, b in enumerate(ids[q].tolist()))
    return f"{table} read at buckets none of T5's log-spaced ones (key - query: bucket, for query {q}: {row})"


def _fitting(ids: torch.Tensor, seen: torch.Tensor, n: int, both: bool) -> list[int]:
    """The max_distances, n / 2 (n / 4 bidirectional) + 1 to 1024, whose T5 buckets of n (bidirectional: `both`) are
    `ids` on the pairs `seen`."""
    distances, buckets = _buckets(n, both, *seen.shape)
    return distances[(buckets == ids.numpy())[:, seen.numpy()].all(1)].tolist()


@functools.lru_cache(maxsize=32)
def _buckets(n: int, both: bool, T: int, S: int) -> tuple[np.ndarray, np.ndarray]:
    """(max_distances, T5's buckets (M, T, S) at each): computed once for every lookup of one shape."""
    distances = np.arange(n // (2 + 2 * both) + 1, 1025)
    at = [relative_buckets((n, int(m), both), np.arange(T), np.arange(S)) for m in distances]
    return distances, np.stack(at)


def _causal(values: list) -> bool:
    """Whether a term on the scores (T, T), T > 1, is read on causal rows alone (no key after its query): the
    model's attention is causal."""
    square = [v for v in values if v is not None and v.ndim > 1 and v.shape[-1] == v.shape[-2] > 1]
    return any(not v.isfinite().triu(1).any() for v in square)


def _alibi(b, causal: bool = False) -> str | None:
    """A bias (..., T or 1, T), NaN or -inf at the keys not read, that is on each row's keys read a per-head slope m
    times -|j - i| plus the row's constant (the reference's form; on causal rows that is m (j - i)): "reference" with
    the reference's slopes (repeated over a batch), else what it is, m (j - i) read on both sides said as such;
    None: no such bias. `causal` (the model's attention is, _causal): m (j - i) with the reference's slopes read on
    both sides is its ALiBi too, read past a mask's mistake (a mask after the softmax)."""
    T = b.shape[-1] if b.ndim >= 2 else 0
    if T < 2 or b.shape[-2] not in (1, T):
        return None
    heads = b.expand(*b.shape[:-2], T, T).reshape(-1, T, T)
    d = (torch.arange(T)[None, :] - torch.arange(T)[:, None]).double()  # key - query
    slopes = heads[:, 1, 1] - heads[:, 1, 0]  # row 1: key 0 at distance 1, itself at 0
    if not slopes.any() or not torch.isfinite(slopes).all():
        return None
    both = bool(torch.isfinite(heads).triu(1).any())  # a key after its query read: -|j - i| and j - i differ there
    forms = (("-|key - query|", -d.abs()), ("key - query on both sides: the reference's times -|key - query|", d))
    n = len(slopes)
    ours = [torch.tensor(alibi_slopes(h), dtype=torch.float64).repeat(n // h) for h in range(1, n + 1) if n % h == 0]
    for k, (form, distance) in enumerate(forms[: 1 + both]):
        rows = heads - slopes[:, None, None] * distance - heads.diagonal(dim1=1, dim2=2)[:, :, None]
        if not torch.allclose(rows[torch.isfinite(rows)], torch.tensor(0.0, dtype=rows.dtype), atol=1e-6):
            continue
        if (not k or causal) and any(torch.allclose(slopes, s, atol=1e-6) for s in ours):
            return "reference"
        return f"(a per-head slope, {float(slopes[0]):.4g} for the first head, times {form if both else 'key - query'})"
    return None


def _keeps(factor) -> bool:
    """Whether a factor multiplying the scores is 1 at every (query, key) read (NaN where not read): a mask's
    keep side (GPT-1's w * b + -1e9 * (1 - b), b a 0/1 buffer; the keys it zeroes are hidden by the term added), no
    temperature."""
    return factor is not None and factor.ndim >= 2 and bool(((factor == 1) | factor.isnan()).all())


def _mask(b) -> bool:
    """Whether a term added to the scores is a mask: 0 and large negatives."""
    finite = b[torch.isfinite(b)]
    return bool(((finite == 0) | (finite < -1e3)).all())


def _bias(b, causal: bool = False) -> str | None:
    """What a term added to the scores is, from its values (None: a mask, 0 or large negatives, or the reference's
    ALiBi, _alibi's with `causal`); one position (T = 1) has no distance to read it by."""
    alibi = _alibi(b, causal)
    if _mask(b) or alibi == "reference" or b.ndim < 2:
        return None
    if alibi:
        return f"ALiBi's bias {alibi}"
    heads = b.reshape(-1, *b.shape[-2:])
    if b.shape[-1] == b.shape[-2] > 1 and torch.allclose(heads[:, 1:, 1:], heads[:, :-1, :-1], 0, 1e-6, True):
        return "a bias of the relative position alone (key - query: T5's relative position bias)"
    return f"a bias of shape {tuple(b.shape)}"


def _weightless_norm(rec) -> tuple | None:
    """A norm no learned scale multiplies: torch's given no weight, or one by hand (x * rsqrt(m + eps), x / (sqrt(m)
    + eps): Llama 4's q and k norms) nothing learned scales after (through views) nor before (T5's w * x * rsqrt).
    A learned number after it is its scale only where it is the normed x's one use (the speedrun's lambdas[0] times
    its normed embeddings, which are read unscaled too, is no weight of that norm). A product with a projection's
    output instead (DiT's 1 + scale from adaLN_modulation(c)) is said as that modulation, where it is taken."""
    for node in rec.nodes:
        if node.op in NORMS and any(DF.root(p).param is not None for p in node.parents):
            continue
        normed = node if node.op in NORMS else _normalised(node) if node.op in ("rsqrt", "sqrt") else None
        after = DF.walk(normed.children, lambda n: n.children if n.op in DF.VIEWS else []) if normed else []
        before = DF.walk(normed.parents, lambda n: n.parents if n.op in DF.MULS | DF.VIEWS else []) if normed else []
        uses = [n for n in after if n.op not in DF.VIEWS]  # a number scales it where it is the norm's one use
        scales = [p for n in uses if n.op not in DF.PRODUCTS for p in n.parents if len(uses) == 1 or _per_feature(p)]
        scales += _scaled_before(node, list(before)) if normed and node.op not in NORMS else []
        if normed is not None and not any(map(_learned, scales)):
            made = [
                (n, w)
                for n in uses
                if n.op in DF.MULS
                for p in n.parents
                if _modulation(p, node) and (w := DF.back(p)[0])
            ]
            if made:  # 1 + scale projected from a conditioning (DiT's adaLN): where the product is taken
                n, weights = made[0]
                what = f"the output of {_by_hand(node, normed)} is scaled by a tensor {', '.join(weights)} computes"
                return (
                    n.module,
                    f"{what} (a modulation of the norm, adaLN's), where the reference's norms learn a weight",
                )
            if node.op == "normalize":  # x / max(|x|_2, eps)
                return node.module, "F.normalize(x) scales each vector to unit length (L2), without a weight"
            return node.module, f"{_by_hand(node, normed)} normalises without a weight (no learned scale)"
    return None


def _scaled_before(root_op, before: list) -> list:
    """The factors of the products `before` a root taken by hand (T5's w * x * rsqrt(mean(x^2))) whose moment the root
    does not read: one it reads (BitNet's x * rsqrt(mean(x^2)) of an x a norm's weight scaled) is what it normalises."""
    first = min((n.index for n in before), default=root_op.index)
    read = {id(n) for n in DF.walk([root_op], lambda n: [p for p in n.parents if p.index >= first])}
    return [p for n in before if n.op in DF.MULS and id(n) not in read for p in n.parents]


def _modulation(factor, normed) -> bool:
    """Whether `factor` is a scale per feature of the normed (..., T, D), one for every position (DiT's 1 + scale,
    (B, 1, D)): not a mask or a weight per position."""
    f, x = factor.shape, normed.shape
    return len(f) > 0 and f[-1] == x[-1] > 1 and (len(f) < len(x) or len(f) > 1 and f[-2] == 1 < x[-2])


def _by_hand(root_op, normed) -> str:
    """A norm as written: torch's op by name, else x (x - mean(x) where the mean is subtracted first: a LayerNorm's)
    multiplied or divided by the root."""
    if root_op.op in NORMS:
        return f"{root_op.op}(x)"
    centred = any(p.op in DF.SUBS and any(q.op == "mean" for q in p.parents) for p in normed.parents)
    x, m = ("(x - mean(x))", "var(x)") if centred else ("x", "mean(x^2)")
    return f"{x} {'*' if normed.op in DF.MULS else '/'} {root_op.op}({m} + eps)"


def _centred_head_norm(rec) -> tuple | None:
    """A q or k norm (a 1-D parameter between a projection and the scores, in a submodule of its own) whose forward
    subtracts the mean (a LayerNorm: Persimmon's) or that adds a learned shift: the reference's are RMSNorms."""
    for a in rec.attentions:
        for scale, role in ((s, r) for s, r in a.norms.items() if getattr(a, r)):  # a projection's, not the input's
            module = scale.rpartition(".")[0]
            centred = module != a.module and any(n.module == module and n.op in DF.CENTRING for n in rec.nodes)
            shifted = module != a.module and sum(s.rpartition(".")[0] == module for s in a.norms) > 1
            if centred or shifted:
                size = next(n.shape for n in rec.nodes if n.param == scale)
                how = ["the mean subtracted"] * centred + ["a learned bias added"] * shifted
                heads = "each head's" if size == (a.head_dim,) else "the"
                whose = f"{heads} {'queries' if role == 'q' else 'keys'}"
                kind = "a LayerNorm" if centred else "an RMSNorm with a bias"
                return module, f"{kind} normalises {whose} ({', '.join(how)}; the reference's q/k norms are RMSNorms)"
    return None


def _normalised_weight(rec) -> tuple | None:
    """A weight (2 or more axes) normalised before a product reads it (Baichuan 2's NormHead: F.normalize(W), each
    row over its length): said at the module holding it."""
    for node in (n for n in rec.nodes if n.op in NORMS and n.parents and DF.weight_of(n.parents[0])):
        weight = DF.weight_of(node.parents[0])
        value = rec.values.get(node.index)
        rows = value is not None and torch.allclose(value.detach().double().norm(dim=-1), torch.tensor(1.0).double())
        ahead = DF.walk(node.children, lambda n: n.children if n.op in DF.VIEWS else [])
        if any(n.op in DF.PRODUCTS and DF.projection(n) in (None, weight) for n in ahead):  # as a weight, not an input
            said = f"scales each row of {weight} to unit length" if rows else f"normalises {weight}"
            return weight.rpartition(".")[0], f"{node.op}({weight}) {said} before a product reads it"
    return None


def _unit_length(rec) -> tuple | None:
    """x / x.norm() by hand (nGPT's q and k, each head's, after RoPE; its hidden states; ScaleNorm's g * x /
    max(x.norm(), eps)): the first, its divisor as written (floored by a clamp or an eps added, or not), with the
    learned scale the quotient or its dividend is multiplied by, and RoPE where cos / sin turned x before (not the
    reference's q/k norm, x * rsqrt(mean(x^2) + eps) * w before RoPE)."""
    floors = DF.VIEWS | {"clamp", "clamp_min", "maximum"}
    floored = lambda n: [c for c in n.children if c.op in floors or c.op in DF.ADDS and c.value]  # noqa: E731
    for node in (n for n in rec.nodes if n.op in ("norm", "linalg_vector_norm") and n.parents):
        x = node.parents[0]
        below = list(DF.walk([node], floored))
        over = {id(n): n for n in DF.walk([x], lambda n: [c for c in n.children if c.op in DF.MULS | DF.VIEWS])}
        unit = next((c for d in below for c in d.children if c.op in DF.DIVS and id(c.parents[0]) in over), None)
        if unit is None:
            continue
        up = DF.walk([x], lambda n: n.parents if n.op not in DF.PRODUCTS else [])
        turned = " after RoPE" * any(n.op in ("cos", "sin") for n in up)
        ahead = DF.walk(unit.children, lambda n: n.children if n.op in DF.MULS | DF.VIEWS else [])
        scores = next((n for n in ahead if n.op in DF.PRODUCTS and not any(map(DF.weight_of, n.parents))), None)
        back = DF.walk(scores.parents if scores else [], lambda n: n.parents if n.op in DF.MULS | DF.VIEWS else [])
        qk = sum(n.op in DF.DIVS and n.parents[1].op == node.op for n in back) == 2  # q·k of two unit lengths
        heads = "q and k each, per head," if qk else "each head's vectors" if len(x.shape) == 4 else "x"
        before = [p for n in over.values() if n.op in DF.MULS for p in n.parents]
        scales = [p for c in unit.children if c.op in DF.MULS for p in c.parents if p is not unit]
        scales = [s for s in before + scales if DF.root(s).param and s is not x and id(s) not in over][:1]
        floor = next((n.op for n in below if n is not node and n.op not in DF.VIEWS), "")
        divisor = "max(x.norm(), eps)" if floor.startswith(("clamp", "max")) else "(x.norm() + eps)" if floor else ""
        times = "".join(f", times {DF.root(s).param} (learned, {tuple(s.shape)})" for s in scales)
        if scales and math.prod(scales[0].shape) == 1:  # one number: ScaleNorm's g
            times = f", times one learned number {DF.root(scales[0]).param} (ScaleNorm)"
        what = f"x / {divisor or 'x.norm()'} divides {heads} by its L2 norm over the features{turned}"
        return node.module, f"{what} (to unit length{', no eps' * (not floor)}){times}"
    return None


def _per_feature(node) -> bool:
    """More than one number along the last axis (a scale per feature, not one learned number, nor a weight per
    stream of hyper-connections' (N, 1))."""
    return bool(node.shape) and node.shape[-1] > 1


def _gain(rec) -> tuple | None:
    """A projection's output (a sublayer's) multiplied by a learned vector and added to the stream: LayerScale."""
    for node in (n for n in rec.nodes if n.op in DF.MULS and len(n.parents) == 2):
        summed = any(c.op in DF.ADDS for c in DF.walk(node.children, lambda n: n.children if n.op in DF.VIEWS else []))
        vectors = [DF.root(p) for p in node.parents if _per_feature(p) and len(DF.root(p).shape) == 1]
        gain = next((v for v in vectors if v.param), None)
        if summed and gain is not None and any(DF.projection(_kept(p)) for p in node.parents):
            return node.module, f"a sublayer's output is multiplied by a learned gain per feature, {gain.param}"
    return None


def _value_embedding(rec) -> tuple | None:
    """An attention's values (scaled_dot_product_attention's v) computed from a projection and, through element-wise
    ops, from a table the ids read (modded-nanogpt's v = l0 v + l1 ve, ve a second token embedding)."""
    for lookup in (n for n in rec.nodes if n.op == "embedding" and n.parents):
        reached = list(DF.walk(lookup.children, lambda n: n.children if n.op in ELEMENTWISE | DF.VIEWS | AS else []))
        for v in (p for n in reached if n.op == DF.SDPA for p in n.parents[2:3] if p in reached and DF.back(p)[0]):
            path = DF.walk([v], lambda n, mixed=reached: [p for p in n.parents if p in mixed])
            learned = [DF.root(p).param for n in path if n.op in DF.MULS for p in n.parents if DF.root(p).param]
            by = f", by the learned {', '.join(dict.fromkeys(learned))}" if learned else ""
            what = f"the values mix {DF.back(v)[0][0]} x with {DF.weight_of(lookup.parents[-1])}[ids]"
            return v.module, f"{what}, a second token embedding read by the ids (value embeddings){by}"
    return None


def _value_residual(rec) -> tuple | None:
    """An attention's values computed from its own projection and an earlier attention's value projection (ResFormer's
    v = l1 v + l2 v_1, the first layer's values handed on to every later one): said where they are mixed, with the
    learned weights the other layer's values are multiplied by on the way."""
    for i, a in enumerate(rec.attentions):
        others = [(b, w) for b in rec.attentions[:i] for w in b.v if w in a.v]
        own = [w for w in a.v if all(w != o for _, o in others)]
        if not others or not own:
            continue
        b, w = others[0]
        made = [n for n in rec.nodes if DF.projection(n) == w]
        mixed = DF.walk(made, lambda n, made=made: n.children if n.op in ELEMENTWISE | DF.VIEWS or n in made else [])
        learned = [DF.root(p).param or "" for n in mixed if n.op in DF.MULS and n.module == a.module for p in n.parents]
        by = ", ".join(dict.fromkeys(p for p in learned if p))
        what = f"the values mix {own[0]} x with {b.module}'s values ({w} x){f' by the learned {by}' * bool(by)}"
        return a.module, f"{what} (a value residual: a layer's value mixed with another layer's value)"
    return None


def _depth_weights(rec) -> tuple | None:
    """A sum of whole states (B, T, D) each multiplied by one number of the same learned vector (DenseFormer's
    depth-weighted average of the embeddings and every block's output so far): said where they are summed."""
    for node in (n for n in rec.nodes if n.op in DF.ADDS and len(n.parents) == 2):
        terms = DF.walk(node.parents, lambda n: n.parents if n.op in DF.ADDS else [])
        weighed = [(w, x) for n in terms if n.op in DF.MULS for w, x in _by_number(n)]
        vectors = {w for w, _ in weighed}
        if len(weighed) > 1 and len(vectors) == 1:
            states = ", ".join(_made_by(rec, x) for _, x in sorted(weighed, key=lambda t: t[1].index))
            what = f"a weighted sum of {len(weighed)} states ({states}), each times one number of {vectors.pop()}"
            return node.module, f"{what} (a learned weight per state, not per feature: a depth-weighted average)"
    return None


def _by_number(node) -> list:
    """[(vector, state)] of a product of a computed state of 3 or more axes and one number of a learned vector."""
    if len(node.parents) != 2:
        return []
    number, x = sorted(node.parents, key=lambda p: len(p.shape))
    w = DF.root(number)
    one = not number.shape and w.param and len(w.shape) == 1 and w.shape[0] > 1
    return [(w.param, x)] if one and DF.root(x).param is None and len(x.shape) >= 3 else []


def _made_by(rec, node) -> str:
    """The outermost submodule whose output `node` is ("blocks.0's output"), else the op that made it."""
    paths = [k.path for k in rec.calls if k.output is not None and DF.root(k.output) is DF.root(node) and k.path]
    return f"{min(paths, key=len)}'s output" if paths else f"the {DF.root(node).op} in {node.module or 'the module'}"


def _streams(rec) -> tuple | None:
    """Learned weights along an axis of the states other than the features: the positions (Linformer's keys and
    values projected along the sequence, gMLP's spatial weights), or streams (hyper-connections: N copies of the
    residual stream (B, T, N, D), each sublayer reading their weighted sum, the streams mixed by an N x N matrix, the
    sublayer's output weighed into each): said where the first weighs them, with what each weight does there."""
    found = [(n, w) for n in rec.nodes for w in [_across(rec, n)] if w]
    if not found:
        return None
    (n, _), where = found[0][1], found[0][0].module
    said = "; ".join(what for node, (_, what) in found if node.module == where)
    if "positions" in said:
        return where, f"learned weights along the sequence's {n} positions (not the features): {said}"
    return where, f"the states are held as {n} streams, weighed by learned weights (a weight per stream): {said}"


def _sequence(rec) -> set:
    """The sequence's lengths on the recording: the ids' last axis, a float input's positions (B, T, D)."""
    ids = {np.shape(n.value)[-1] for n in rec.nodes if n.op == "embedding" and np.ndim(n.value) == 2}
    return ids | {n.shape[-2] for n in rec.nodes if n.op == "input" and len(n.shape) == 3}


def _across(rec, node) -> tuple | None:
    """(streams, what) a product of a learned tensor and a state does along a stream axis (not the last, the
    features): sums the streams into one, mixes them, or weighs a tensor into each (where that axis alone of the
    state's is the sequence's length: a projection of the positions); None where it does none."""
    if len(node.parents) != 2 or node.op not in DF.MULS | {"einsum"}:
        return None
    w, x = node.parents
    w, x = (x, w) if DF.root(w).param is None else (w, x)
    param = DF.root(w).param
    if param is None or DF.root(x).param is not None or len(x.shape) < 3:
        return None
    match = DF._two(node.extra) if node.op == "einsum" else None
    if match is not None:
        mine, theirs, out = match if node.parents[0] is w else (match[1], match[0], match[2])
        axis = next((theirs.index(c) for c in mine if c in theirs), None)
        if axis is None or theirs[-1] in mine or len(mine) > 2:
            return None
        n, shape = x.shape[axis], " x ".join(map(str, DF.root(w).shape))
        if list(x.shape).count(n) == 1 and n in _sequence(rec):
            m = node.shape[out.index(mine.replace(theirs[axis], ""))] if len(mine) == 2 else 1
            return n, f"{param} ({shape}) projects {_read_as(rec, node, x)} along the positions ({n} -> {m})"
        if len(mine) == 1:
            return (n, f"{param} sums them into one") if mine not in out else None
        return n, f"{param} ({shape}) mixes them"
    if node.op in DF.MULS and len(w.shape) > 1 and w.shape[-1] == 1 and math.prod(w.shape) > 1 and x.shape[-2] == 1:
        return math.prod(w.shape), f"{param} weighs {_made_by(rec, x)} into each"
    return None


def _read_as(rec, node, x) -> str:
    """What the product `node` (of the state `x`) is to the product it feeds: the keys (of scores a softmax reads),
    the values (beside weights a softmax made), else `x` as made (_made_by)."""
    for fed in DF._forward(node):
        ahead = DF.walk(fed.children, lambda n: [] if n.op in DF.PRODUCTS else n.children)
        beside = DF.walk([p for p in fed.parents if p not in DF.walk([node], lambda n: n.children)], DF._behind)
        if any(n.op in DF.SOFTMAX for n in ahead):
            return "the keys"
        if any(n.op in DF.SOFTMAX for n in beside):
            return "the values"
    return _made_by(rec, x)


def _token_choice(rec) -> tuple | None:
    """A top-k over the positions of the scores a projection computes (mixture of depths: Linear(D, 1) scores each
    token, the top k of the T run through a block, the others skip it), where a router's picks experts (its top-k
    over the projection's output features): said at the scoring projection's module, with the part the picked
    tokens run through."""
    for node in (n for n in rec.nodes if n.op == "topk" and n.parents):
        scores = DF.walk([node], lambda n: [] if DF.projection(n) else DF._behind(n, True))
        product = next((n for n in scores if DF.projection(n)), None)
        weight = DF.projection(product) if product is not None else None
        x = next((p for p in product.parents if DF.weight_of(p) is None), None) if product is not None else None
        if product is None or weight is None or x is None or len(x.shape) < 3 or node.value is None:
            continue
        n, E, T = node.parents[0].shape[node.value], product.shape[-1], x.shape[-2]
        if E == 1 or n != E and n == T:
            through = _picked_run(rec, node)
            what = f"topk picks the {node.shape[node.value]} of the {T} positions whose score ({weight} x) is highest"
            return weight.rpartition(".")[0], f"{what}{through} (a mixture of depths: tokens routed past a block)"
    return None


def _picked_run(rec, topk) -> str:
    """ ", and only those run through <part>, ...": the outermost part inside the top-k's module called on what the
    top-k's module makes from its choice (the tokens gathered); "" where none is."""
    own = {id(m) for m in DF.walk(topk.children, lambda m: m.children if m.module == topk.module else [])}
    inside = [k for k in rec.calls if k.path.startswith(f"{topk.module}.") or not topk.module]
    runs = [k.path for k in inside if any(i is not None and id(i) in own for i in k.inputs)]
    return f", and only those run through {min(runs, key=len)}, the others skipping it" if runs else ""


def _biased_gates(rec) -> tuple | None:
    """A router's choice bias (DeepSeek-V3's e_score_correction_bias, a 1-D tensor added to the scores before the
    top-k) in the gates too: the top-k's values (the biased scores) summed, scaled or normalised on their way to the
    experts, where the reference's bias only chooses (the gates gathered from the unbiased scores)."""
    for node, *_, bias, _ in rec.routers.values():
        read = [c for c in node.children if c.op in DF.MULS | DF.DIVS | DF.SOFTMAX | {"sum"}]
        if bias is not None and read:
            what = f"{bias} is added to the scores that weigh the experts' outputs, not only to those the top-k "
            return node.module, what + "chooses by (the reference's bias chooses, the unbiased scores weigh)"
    return None


def _row_added(rec) -> tuple | None:
    """A table's row read by one number (a 0-d index or one id everywhere, no ids of the sequence) added to the
    stream after a layer ran on it (a universal transformer's step embedding, a vector per pass): the reference
    adds rows (BERT's token type) to the embeddings alone. Said at the table's module, where it is first read."""
    for lookup in (n for n in rec.nodes if n.op == "embedding" and isinstance(n.value, np.ndarray) and n.parents):
        ids = lookup.value
        ahead = list(DF.walk(lookup.children, lambda n: n.children if n.op in DF.VIEWS else []))
        later = [p for n in ahead if n.op in DF.ADDS for p in n.parents if p not in ahead and DF.back(p)[0]]
        if ids.size and (ids == ids.flat[0]).all() and later:
            table = DF.weight_of(lookup.parents[-1]) or "a table"
            what = f"{table}[{ids.flat[0]}] is added to the stream after {later[0].module or 'a layer'} ran"
            return lookup.module, f"{what} (a row per pass: a step embedding)"
    return None


TABLE_OPS = ("arange", "linspace", "exp", "pow", "outer", "sin", "cos")  # a fixed table's making, said in this order


def _signal_added(rec) -> tuple | None:
    """A table the forward computes from nothing it was given (no input, no parameter or buffer: a sinusoid of an
    arange) added to the stream after an attention ran on it (a universal transformer's timing signal, before each
    pass of its one layer): the reference adds positions to the embeddings alone. Said at the module that adds it."""
    made = lambda n: n.op in ("input", "embedding") or n.param is not None  # noqa: E731
    for node in (n for n in rec.nodes if n.op in DF.ADDS and len(n.parents) == 2):
        fixed = [p for p in node.parents if len(p.shape) and p.shape[-1] == node.shape[-1] > 1]
        fixed = [p for p in fixed if not any(map(made, DF.walk([p], lambda n: n.parents)))]
        stream = [p for p in node.parents if p not in fixed and DF.back(p)[0]]
        ran = [n for p in stream for n in DF.walk([p], lambda n: n.parents) if n.op in DF.SOFTMAX | DF.MHA | {DF.SDPA}]
        if fixed and ran:
            ops = {n.op for n in DF.walk(fixed[:1], lambda n: n.parents)}
            ops = ", ".join(o for o in TABLE_OPS if o in ops)
            what = f"a table the forward computes from no input or weight ({ops})"
            return node.module, f"{what} is added to the stream after {ran[0].module or 'an attention'} ran"
    return None


COMPARED = {"lt", "__lt__", "le", "__le__", "gt", "__gt__", "ge", "__ge__"}


def _running_sum(rec) -> tuple | None:
    """torch.cumsum or cumprod of what a projection made (through element-wise ops): a running sum or product over
    an axis (a state-space scan's decays accumulated along the positions, its recurrence in closed form); the
    reference accumulates nothing. A cumsum of the scores (stick-breaking's) or of a mask (positions) is none; one of
    a router's choice compared to a number counts each expert's tokens in order (Switch's capacity, the tokens past it
    dropped; not grouped experts' offsets)."""
    for node in (n for n in rec.nodes if n.op in ("cumsum", "cumprod") and n.parents):
        made = DF.back(node.parents[0])[0]
        if made:
            return node.module, f"{node.op} accumulates what {made[0]} makes along an axis (a running scan)"
        compared = any(n.op in COMPARED for n in DF.walk(node.children, lambda n: n.children))  # to a capacity
        if compared and any(n.op == "topk" for n in DF.walk(node.parents, lambda n: DF._behind(n, True))):
            what = "cumsum counts the tokens a router's top-k sends to each expert, in order (an expert's capacity"
            return node.module, f"{what}: the tokens past it dropped, where the reference's experts take every one)"
    return None


AS = {"view_as", "reshape_as", "expand_as"}  # views shaped as another tensor


def _kept(node):
    """`node` seen through views and dropout (the identity in evaluation: timm's proj_drop before its LayerScale)."""
    node = DF.root(node)
    return _kept(node.parents[0]) if node.op == "dropout" and node.parents else node


def _learned_scale(rec) -> tuple | None:
    """A tensor multiplied or divided by a learned number (a parameter of one element), or by an activation of one
    (Flamingo's tanh(attn_gate) on its cross-attention's output)."""
    for node in (n for n in rec.nodes if n.op in DF.MULS | DF.DIVS and len(n.parents) == 2):
        number = next((said for p in node.parents if (said := _number(DF.root(p)))), None)
        if number is not None:
            how = "multiplied" if node.op in DF.MULS else "divided"
            return node.module, f"a tensor is {how} by a learned scale, {number} (one number)"
    return None


def _number(node) -> str:
    """A learned number as read: its parameter's name, or an activation of it (tanh(attn_gate)); else ""."""
    if node.param and math.prod(node.shape) == 1:
        return node.param
    inner = _number(DF.root(node.parents[0])) if node.op in DF.ACTIVATIONS and len(node.parents) == 1 else ""
    return f"{node.op}({inner})" if inner else ""


def _conditioned(rec) -> tuple | None:
    """The stream (what the ids' rows reach) multiplied by a tensor projected from one they never reach (FiLM's
    gamma x + beta from a style vector, a modulation from a conditioning input): said where the product is taken."""
    stream = DF.stream(rec.nodes)
    for node in (n for n in rec.nodes if n.op in DF.MULS and len(n.parents) == 2 and id(n) in stream):
        weights = [w for p in node.parents if id(p) not in stream for w in DF.back(p)[0]]
        if weights:
            what = f"the stream is multiplied by a tensor {', '.join(weights)} computes from an input the ids do not"
            return node.module, f"{what} reach (a conditioning: FiLM's scale and shift)"
    return None


def _renormed(rec) -> tuple | None:
    """An embedding that renormalises the rows it reads (nn.Embedding(max_norm=m)): in place, on its weights."""
    node = next((n for n in rec.nodes if n.op == "embedding" and n.extra.startswith("max_norm")), None)
    what = "embedding(ids, {}) rescales each row it reads to a norm of at most {} (in place, on the table)"
    return None if node is None else (node.module, what.format(node.extra, node.extra.partition("=")[2]))


def _batch_norm(rec) -> tuple | None:
    """F.batch_norm (nn.BatchNorm1d, PatchTST's norm between two transposes): each feature normalised by statistics
    over the batch (in evaluation, its running ones: a fixed affine map per feature), not over the features."""
    node = next((n for n in rec.nodes if n.op == "batch_norm"), None)
    what = "batch_norm(x) normalises each feature by its statistics over the batch (running ones in evaluation)"
    return None if node is None else (node.module, f"{what}, not each position over its features")


def _read_ids(node) -> bool:
    """A table lookup whose ids vary along the sequence and are no positions (0 .. T - 1 from some start on every
    row): ids the module was given, not made."""
    read = node.op == "embedding" and isinstance(node.value, np.ndarray) and node.value.size
    ids = np.atleast_1d(node.value) if read else None  # a 0-d index: one id
    steps = None if ids is None else np.diff(ids.reshape(-1, ids.shape[-1]), axis=-1)
    return steps is not None and steps.size > 0 and not (steps == 1).all() and not (steps == 0).all()


def _given(node) -> frozenset:
    """The module's inputs `node` is computed from: the float tensors it was given, the tables its ids read."""
    up = DF.walk([node], lambda n: n.parents)
    return frozenset(n.index for n in up if n.op == "input" or _read_ids(n))


def _joined(rec) -> tuple | None:
    """Tensors computed from separate inputs of the module (a Decision Transformer's returns, states and actions, each
    embedded; LLaVA's projected image features and the text's embeddings) stacked or concatenated into one sequence:
    the reference embeds one sequence of ids."""
    for node in (n for n in rec.nodes if n.op in ("stack", "cat") and len(n.parents) > 1):
        given = [_given(p) for p in node.parents]
        if all(given) and len(set(given)) == len(given):
            what = "; ".join(f"[{', '.join(_embedded_by(p)) or 'the input'}]" for p in node.parents)
            return node.module, f"{node.op} joins tensors embedded from separate inputs ({what}) into one sequence"
    return None


def _offset_ids(rec) -> tuple | None:
    """A table read at the ids the module was given plus a buffer or parameter of an offset per position
    (TabTransformer's categories_offset into one table of every column's values): each position reads its own block
    of rows, a row per (position, value), where the reference reads a token's row by its id alone."""
    for node in (n for n in rec.nodes if n.op == "embedding" and _read_ids(n)):
        ids = DF.root(node.parents[0])
        held = [p for p in ids.parents if DF.root(p).param is not None and p.shape and p.shape[-1] > 1]
        if ids.op in DF.ADDS and held:
            table = DF.weight_of(node.parents[-1]) or "a table"
            what = f"{table} read at the ids plus {DF.root(held[0]).param} (an offset per position {held[0].shape})"
            return ids.module, f"{what}: a block of rows per position, a row per (position, value)"
    return None


def _embedded_by(node) -> list:
    """The weights of the nearest projections and table lookups behind `node`, in the order they ran."""
    ends = DF.walk([node], lambda n: [] if DF.projection(n) or n.op == "embedding" else n.parents)
    weights = [(n.index, DF.projection(n) or n.op == "embedding" and DF.weight_of(n.parents[-1])) for n in ends]
    return [w for _, w in sorted(weights) if w]


def _tables_summed(rec) -> tuple | None:
    """The rows of several token tables of one shape, each read by ids the module was given, summed (MusicGen's
    codebooks): the reference reads its tokens from one table (its position table, of another shape, read at given
    positions: a tree's, is none)."""

    def tables(node) -> list:  # those the sums up to `node` read, in the order they were read, of one shape
        looked = DF.walk([node], lambda n: n.parents if n.op in DF.ADDS | DF.VIEWS else [])
        found = sorted((n.index, n.parents[-1]) for n in looked if _read_ids(n) and DF.weight_of(n.parents[-1]))
        shapes = [DF.root(t).shape for _, t in found]
        return list(dict.fromkeys(DF.weight_of(t) for _, t in found)) if len(set(shapes)) == 1 else []

    for node in (n for n in rec.nodes if n.op in DF.ADDS and len(tables(n)) > 1):
        last = max(DF.walk([node], lambda n: [c for c in n.children if c.op in DF.ADDS]), key=lambda n: n.index)
        return node.module, f"the rows of {', '.join(tables(last))}, each read by the ids, are summed"
    return None


def _windows(rec) -> tuple | None:
    """Tensor.unfold cutting the module's input itself into overlapping windows (PatchTST's patches, stride < patch
    length): the reference's patches (a ViT's) are disjoint. An unfold of computed keys (a sliding window) is none."""
    for node in (n for n in rec.nodes if n.op == "unfold" and n.parents and DF.root(n.parents[0]).op == "input"):
        before, size = node.parents[0].shape, node.shape[-1]
        axis = next((i for i, (a, b) in enumerate(zip(node.shape[:-1], before, strict=False)) if a != b), None)
        count = node.shape[axis] if axis is not None else 0
        if count * size > before[axis or 0]:
            said = f"{count} overlapping windows of {size} along an axis of {before[axis]}"
            return node.module, f"unfold cuts the input into {said} (patches that overlap)"
    return None


def _shifted_copies(rec) -> tuple | None:
    """A tensor padded along its positions (F.pad) and read as 2 or more windows of its own length, each multiplied
    by a learned tensor, the products summed: a convolution over neighbouring positions written out (a canon layer's,
    a short convolution's); causal where the zeros go before the first position; said where it is weighted."""
    for pad in (n for n in rec.nodes if n.op in ("pad", "constant_pad_nd") and n.parents and len(n.shape) >= 2):
        x, padded = pad.parents[0], rec.values.get(pad.index)
        grown = [i for i, (a, b) in enumerate(zip(x.shape, pad.shape, strict=False)) if a != b]
        if len(x.shape) != len(pad.shape) or grown != [len(x.shape) - 2]:  # longer along the positions only
            continue
        windows = [c for c in pad.children if c.op == "__getitem__" and tuple(c.shape) == tuple(x.shape)]
        weights = [p for w in windows for m in w.children if m.op in DF.MULS for p in m.parents if p is not w]
        if len(windows) < 2 or len(weights) < 2 or not all(map(_learned, weights)) or padded is None:
            continue
        K = pad.shape[-2] - x.shape[-2] + 1
        unpadded = rec.values.get(x.index)
        causal = "causal " * (unpadded is not None and torch.equal(padded[..., K - 1 :, :], unpadded))
        depthwise = ", one weight per feature (depthwise)" * all(w.shape[-1:] == x.shape[-1:] for w in weights)
        what = f"a {causal}convolution over neighbouring positions of width {K}, written out: {len(windows)} shifted"
        return weights[0].module, f"{what} copies of x each times a learned weight{depthwise}, summed", pad.index
    return None


def _token_shift(rec) -> tuple | None:
    """F.pad(x, widths) adding k zeros before one axis and cutting k after it (or the reverse), x's shape kept
    (x-transformers' shift_tokens, RWKV's time shift: F.pad(x, (0, 0, 1, -1))): each row along that axis reads the
    k-th before it; said where it is padded."""
    for pad in (n for n in rec.nodes if n.op == "pad" and n.call is not None):
        _, args, kwargs = pad.call
        widths = list(args[1] if len(args) > 1 else kwargs.get("pad", ()))
        pairs = [(a, b) for a, b in zip(widths[::2], widths[1::2], strict=False) if (a, b) != (0, 0)]
        if len(pairs) == 1 and pairs[0][0] == -pairs[0][1] and kwargs.get("mode", "constant") == "constant":
            k, axis = pairs[0][0], -1 - widths[::2].index(pairs[0][0])
            what = f"the one {abs(k)} {'before' if k > 0 else 'after'} it (zeros at the {'first' if k > 0 else 'last'})"
            return pad.module, f"F.pad{tuple(widths)} shifts x along axis {axis}: each row reads {what}", pad.index
    return None


def _recurrence(rec) -> tuple | None:
    """States joined over the positions (stack or cat of 3 or more) where the third is computed from the second, by
    ops of its own that read no weight (a loop over the positions: Griffin's RG-LRU, a selective scan, a delta rule
    written out): said where they are joined, the gated linear form h_t = a_t * h_(t-1) + b_t where the states are
    it, with the functions its gates and inputs are made by; ranked at the first state, not at its submodule."""
    for node in (n for n in rec.nodes if n.op in ("stack", "cat") and len(n.parents) > 2):
        s, last = node.parents, node.parents[1].index
        if any(a.index >= b.index for a, b in zip(s, s[1:], strict=False)):
            continue
        own = list(DF.walk([s[2]], lambda n, last=last: n.parents if n.index > last else []))
        if any(DF.projection(n) for n in own) or not any(s[0].index < n.index <= s[1].index for n in own):
            continue
        made = DF.walk(s[:1], lambda n: [] if DF.projection(n) else n.parents)
        funcs = sorted({n.op: n.index for n in made if n.op in DF.ACTIVATIONS | {"exp"}}.items(), key=lambda f: f[1])
        linear = s[2].op in DF.ADDS and any(p.op in DF.MULS and s[1] in p.parents for p in s[2].parents)
        form = "a gated linear recurrence h_t = a_t * h_(t-1) + b_t" if linear else "a recurrence, each state"
        what = f"{form} over the positions, {len(s)} states each computed from the one before (a loop)"
        made_by = f", its gates and inputs made by {', '.join(op for op, _ in funcs)}" * bool(funcs)
        return node.module, f"{what}{made_by}: an RNN's or a state-space scan's", s[0].index
    return None


def _glu(rec) -> tuple | None:
    node = next((n for n in rec.nodes if n.op == "glu"), None)  # F.glu, nn.GLU: one op, no activation of the reference
    return None if node is None else (node.module, "glu(x) computes a * sigmoid(b) of x's two halves (a sigmoid GLU)")


MOMENTS = {"mean", "sum", "var", "std", "var_mean", "std_mean", "norm", "linalg_vector_norm"}  # a norm's root reads


def _normalised(root_op):
    """The product or quotient a root taken by hand normalises x with (x * rsqrt(...), x / (sqrt(...) + eps)), where
    the root reads a mean or sum (through sums, products and views): not a root of a gate (Griffin's sqrt(1 - a^2))."""
    arithmetic = DF.ADDS | DF.SUBS | DF.MULS | DF.DIVS | DF.VIEWS
    if not any(n.op in MOMENTS for n in DF.walk(root_op.parents, lambda n: n.parents if n.op in arithmetic else [])):
        return None
    ahead = DF.walk(root_op.children, lambda n: n.children if n.op in DF.ADDS else [])
    return next((n for n in ahead if n.op in DF.MULS | DF.DIVS), None)


def _learned(node) -> bool:
    """A parameter, seen through views or with a number added (Gemma's 1 + weight)."""
    seen = DF.root(node)
    return seen.param is not None or seen.op in DF.ADDS and any(DF.root(p).param is not None for p in seen.parents)


def _output_gate(flow) -> tuple | None:
    """The heads' output multiplied, before or after the output projection, by an activation of a projection of the
    input (Qwen3-Next's gated attention: o_proj(attn * sigmoid(gate_proj(x))), its gate rows in q_proj or their own):
    the reference multiplies the heads' output by nothing."""
    for a in flow.attentions:
        x = next((p for p in a.out_node.parents if DF.weight_of(p) is None), None) if a.out_node else None
        sides = [("before", DF.root(x))] if x is not None else []
        after = DF.walk(a.out_node.children, lambda n: n.children if n.op in DF.VIEWS else []) if a.out_node else []
        sides += [("after", n) for n in after]
        for side, product in ((s, n) for s, n in sides if n.op in DF.MULS):
            for act in (DF.root(g) for g in product.parents):
                gate = DF.projection(DF.root(act.parents[0])) if act.op in DF.ACTIVATIONS and act.parents else None
                if gate is not None:
                    what = "the heads' output" if side == "before" else "the attention's output"
                    return a.module, f"{what} is multiplied by {act.op}({gate} x) {side} {a.out[0]} (a gate)"
    return None


def _clamped(rec) -> tuple | None:
    """A projection's outputs clamped to a range (GPT-OSS's SwiGLU clamps its gate and up projections), but on the
    way into a routed expert's down projection, where the reference's GPT-OSS experts clamp them too."""
    downs = [n for b in rec.blocks if rec.weighed(b[-1]) for n in rec._products(b[-1])]
    routed = {id(n) for down in downs for n in DF._activations(down)}
    fed = {w for b in rec.blocks for w in b[:-1]}  # the feed-forward blocks' input projections
    for node in rec.nodes:
        weight = DF.projection(DF.root(node.parents[0])) if node.op in CLAMPS and node.parents else None
        if weight is not None and id(node) not in routed and not _discarded(rec, node):
            like = " (as GPT-OSS's clamped SwiGLU)" if weight in fed else ""
            return node.module, f"{node.op} limits the outputs of {weight} to a range{like}"
    return None


CLAMPS = {"clamp", "clamp_", "clamp_min", "clamp_max", "clip", "hardtanh"}
ROUNDS = {"round", "round_", "floor", "ceil", "trunc", "fix", "sign"}  # sign: a grid of -1, 0, 1 (1-bit weights)
QUANTISING = DF.MULS | DF.DIVS | DF.VIEWS | DF.ADDS | DF.SUBS | CLAMPS  # scale, clip, unscale; x + (q - x).detach()


def _rounded(rec) -> tuple | None:
    """A tensor rounded to a grid that a projection multiplies, through scalings, clips, views and the
    straight-through sum x + (q - x).detach() (W8A8's activations, round(x * 127 / absmax) * absmax / 127; BitNet's
    weights, round(w / mean|w|) or sign(w - mean w), read as the weight's projection: dataflow.weight_of): the
    reference's products read their inputs and weights unrounded."""
    for node in (n for n in rec.nodes if n.op in ROUNDS and n.parents):
        on = DF.walk(node.children, lambda n: n.children if n.op in QUANTISING else [])
        weight = next((w for n in on if (w := DF.projection(n)) is not None), None)
        if weight is not None and weight in (node.made or ()):
            return node.module, f"torch.{node.op} rounds {weight} to a grid before it multiplies (weights quantized)"
        if weight is not None:
            return node.module, f"torch.{node.op} rounds what {weight} multiplies to a grid (inputs quantized)"
    return None


def _discarded(rec, node) -> bool:
    """Whether what `node` changes never reaches the output: every path on from it meets a `where` as one branch,
    and each such `where` takes its other branch wherever `node` moved a value past rounding (xIELU's
    expm1(min(x, eps)), in the branch taken only for x <= 0: a guard of the branch, not a range)."""
    reached = {id(n) for n in DF.walk(node.children, lambda n: [] if n.op == "where" else n.children)}
    wheres = [n for n in rec.nodes if n.op == "where" and id(n) in reached]
    ends = [n for n in rec.nodes if id(n) in reached and not n.children and n.op != "where"]
    before, after = (rec.values.get(n.index) for n in (node.parents[0], node))
    before, after = (None if t is None else t.detach() for t in (before, after))
    if not wheres or ends or before is None or after is None:
        return False
    moved = (after - before).abs() > 1e-9 * max(float(before.abs().max()), 1.0)
    for w in wheres:
        fed = [i for i, p in enumerate(w.parents) if p is node or id(p) in reached]
        condition = rec.values.get(w.parents[0].index) if len(w.parents) == 3 else None
        if fed not in ([1], [2]) or condition is None:
            return False
        taken = condition.bool() if fed == [1] else ~condition.bool()
        try:
            if bool(torch.logical_and(*torch.broadcast_tensors(moved, taken)).any()):
                return False
        except RuntimeError:  # shapes that do not broadcast: not read
            return False
    return True


def clamped_scores(rec) -> tuple | None:
    """The scores q k^T clamped (clamp, clip, hardtanh) on their way to the softmax at a bound a score can reach
    (|b| < 1e30: not a guard at the dtype's extreme): the reference's are not clipped, so once a trained model's
    scores pass the bounds its attention differs, whether or not the probes' small scores reach them."""
    for s in (n for n in rec.nodes if n.op in DF.SOFTMAX and n.parents):
        for node in DF.walk(s.parents[:1], lambda n: n.parents if n.op in SCORES_PATH | CLAMPS else []):
            lo, hi = DF.bounds(node) if node.op in CLAMPS and _to_scores(node.parents[0]) else (math.inf, math.inf)
            if min(abs(lo), abs(hi)) < 1e30:
                said = f"{node.op} limits the scores q k^T to [{lo:g}, {hi:g}] before the softmax (a clip: where a "
                return node.module, said + "trained model's scores pass it, its attention differs)"
    return None


def _shifted(node) -> bool:
    """x[:, :-1] of a computed (B, T, ...) tensor: the previous positions."""
    if node.op != "__getitem__" or node.call is None or DF.root(node).param is not None:
        return False
    index = node.call[1][1] if len(node.call[1]) > 1 else None
    return isinstance(index, tuple) and len(index) > 1 and isinstance(index[1], slice) and index[1].stop == -1


def _previous_gate(rec) -> tuple | None:
    for node in rec.nodes:
        if node.op in ("mul", "__mul__", "__rmul__") and len(node.parents) == 2 and any(map(_shifted, node.parents)):
            gate = next((p for p in node.parents if not _shifted(p)), None)
            weight = next(iter(DF.back(gate)[0]), "") if gate is not None else ""  # the gate's projection
            where = weight.rsplit(".", 1)[0] if "." in weight else (gate.module if gate else node.module)
            return where, "a gate mixes the previous position into each one (x[t] + g(x[t]) * x[t - 1])"
    return None


def _activated(rec):
    """(x, h, a, convolved) for each product whose input x holds a, an element-wise function of h, another product's
    output of the same shape (the activation between two projections), at h's finite entries (flat); convolved: one
    of the two is a convolution."""
    for second in (n for n in rec.nodes if DF.projection(n)):
        x = next((p for p in second.parents if DF.weight_of(p) is None), None)
        sources = _sources(x) if x is not None and x.index in rec.values else set()
        first = sources.pop() if len(sources) == 1 else None  # the product x is computed from, value by value
        if first is None or first is x or not DF.projection(first) or first.index not in rec.values:
            continue
        h, a = rec.values[first.index].detach().double(), rec.values[x.index].detach().double()
        seen = h.isfinite() if h.shape == a.shape else None  # not the rows a mask left empty (NaN): no value to read
        if seen is not None and seen.any():
            yield x, h[seen], a[seen], "conv1d" in (first.op, second.op)


def _activation(rec) -> tuple | Diagnosis | None:
    """A product whose input is an element-wise function of another's output (same shape) the reference lacks, told
    apart by its values: (where, what it computes); QuickGELU's form at another constant: the catalogue's Diagnosis.
    Between linears, the reference has one activation per model: where two of its own are, the first computing
    another than the most common one is said (GELU's tanh form in one layer of exact GELU's)."""
    ours: list = []  # (where, name, h, a) of each activation between linears the reference has
    for x, h, a, convolved in _activated(rec):
        scale = max(float(a.abs().max()), 1e-12)
        fits = [(name, known) for name, f, known in ACTIVATIONS if float((f(h) - a).abs().max()) <= 1e-5 * scale]
        if fits and fits[0][1]:
            ours += [(x.module, fits[0][0], h, a)] * (not convolved)
            continue  # one the reference has
        c = None if fits else _sigmoid_constant(h, a)
        if c is not None:
            return _quick_gelu(x.module, h, a, c)
        return x.module, f"the activation computes {fits[0][0] if fits else _unknown(x, h, a)}"
    names = [name for _, name, *_ in ours]
    common = max(names, key=names.count, default="")
    where, odd, h, a = next((o for o in ours if o[1] != common), (None,) * 4)
    if odd is not None and "QuickGELU" in common and odd.startswith("silu"):  # its constant mistyped as 1
        return _quick_gelu(where, h, a, 1.0)
    return where and (where, f"the activation computes {odd} where the others compute {common} (one per model)")


def quick_gelu_constant(rec) -> Diagnosis | None:
    """In a model whose activation is QuickGELU (its other layers' x * sigmoid(1.702 x)), the first activation of its
    form at another constant c, SiLU's c = 1 included (which _activation passes, the reference having SiLU)."""
    found = ((x, h, a, _sigmoid_constant(h, a)) for x, h, a, _ in _activated(rec))
    return next((_quick_gelu(x.module, h, a, c) for x, h, a, c in found if c and abs(c - 1.702) > 1e-3), None)


def _quick_gelu(where: str, h, a, c: float) -> Diagnosis:
    said = f"the activation computes x * sigmoid({c:.4g} x): QuickGELU's form with {c:.4g} for 1.702"
    return Diagnosis("activation.quick_gelu_constant", said, where, relative(h * torch.sigmoid(c * h), a, 1e-12))


# ops computed value by value (an activation written out by hand is made of these), and the views between them
ELEMENTWISE = DF.ACTIVATIONS | {
    "mul", "__mul__", "__rmul__", "add", "__add__", "__radd__", "sub", "__sub__", "__rsub__", "div", "__truediv__",
    "pow", "__pow__", "square", "neg", "__neg__", "exp", "expm1", "where", "abs", "to", "type_as", "float", "double",
    "contiguous", "__get__", "gt", "__gt__", "lt", "__lt__", "ge", "__ge__", "le", "__le__",
}  # fmt: skip


def _sources(node, depth: int = 16) -> set:
    """The nodes `node` is computed from value by value (through element-wise ops, at most `depth` deep); a number
    (a 0-dim tensor: xIELU's learned alphas) is none."""
    if not node.shape:
        return set()
    if depth == 0 or node.op not in ELEMENTWISE or not node.parents:
        return {node}
    return set().union(*(_sources(p, depth - 1) for p in node.parents))


def _sigmoid_constant(h, a) -> float | None:
    """c where a = h * sigmoid(c h) (QuickGELU's form, c fitted from the values), else None."""
    ratio = a / torch.where(h == 0, torch.ones_like(h), h)
    usable = (h.abs() > 0.1) & (ratio > 1e-6) & (ratio < 1 - 1e-6)
    if int(usable.sum()) < 4:
        return None
    c = float((torch.logit(ratio[usable]) / h[usable]).median())
    return c if math.isfinite(c) and relative(h * torch.sigmoid(c * h), a, 1e-12) <= 1e-6 else None


def _unknown(x, h, a) -> str:
    """An activation `x` none of ACTIVATIONS fits: the ops it is built of (but arithmetic) and two of its values."""
    plain = {"mul", "__mul__", "__rmul__", "add", "__add__", "__radd__", "sub", "__sub__", "__rsub__", "neg", "__neg__"}
    inside = DF.walk([x], lambda n: n.parents if n.op in ELEMENTWISE else [])
    ops = {n.op: n.index for n in inside if n.op in ELEMENTWISE - plain - DF.VIEWS and n.shape}
    of = f" (its ops: {', '.join(sorted(ops, key=lambda op: ops[op]))})" * bool(ops)
    h, a = h.flatten(), a.flatten()
    near = (int(h.abs().argmin()), int((h - 1.0).abs().argmin()))  # the inputs nearest 0 and 1
    shown = ", ".join(f"f({float(h[k]):.2f}) = {float(a[k]):.3g}" for k in near if math.isfinite(float(a[k])))
    return f"an element-wise function{of} none of the reference's activations is ({shown})"


def _pooled(rec) -> tuple | None:
    """The states (B, T, D) summed or averaged over their positions (a masked mean: sentence-transformers') into
    (B, D) that the module's last projection reads, or that is its output (timm's average pool): a classifier's
    pooling, which no reference level computes."""
    last = DF.projection(rec.nodes[-1]) if rec.nodes else None
    for node in (n for n in rec.nodes if n.op in ("sum", "mean") and n.parents and len(n.parents[0].shape) == 3):
        (B, _, D), onward = node.parents[0].shape, lambda n: n.children if n.op in ELEMENTWISE | {"normalize"} else []
        reaches = any(n is rec.nodes[-1] for n in DF.walk([node, *node.children], onward))
        if tuple(node.shape) == (B, D) and reaches:  # the output's, maybe through F.normalize
            said = f"{node.op} over the positions pools the states (B, T, D) into (B, D)"
            return node.module, f"{said} before {last}" if last else f"{said}, the module's output"
    return None


def _feature_head(rec) -> tuple | None:
    """The module's output (through element-wise ops, views and F.normalize) a projection of the states (B, T, D)
    that no attention or block reads, to a width neither D nor a table's rows (ColBERT's per-token Linear D -> 16):
    a head no reference level has (its heads: BERT's pooler, D -> D; the masked-LM head, D -> V)."""
    looked = [n.parents[-(n.op == "embedding")] for n in rec.nodes if isinstance(n.value, np.ndarray) and n.parents]
    tables = {DF.root(p).shape[0] for p in looked if DF.weight_of(p)}  # rows of the tables ids read (embedding, P[ids])
    onward = ELEMENTWISE | DF.VIEWS | {"normalize"}
    for node in DF.walk(rec.nodes[-1:], lambda n: n.parents if n.op in onward else []):
        weight = DF.projection(node)
        x = node.parents[0] if weight is not None else None
        D = x.shape[-1] if x is not None else None
        if x is not None and len(x.shape) == 3 and weight not in rec.roles and node.shape[-1] not in {*tables, D}:
            return node.module, f"a projection of every position's state ({x.shape[-1]} -> {node.shape[-1]} features)"
    return None


def _prepended(rec) -> tuple | None:
    """A table's rows, looked up with ids shared by every sequence (arange(P)), joined by a cat with what the inputs
    make: prompt tuning's virtual tokens beside the token embeddings, prefix tuning's learned keys and values beside
    an attention's own; positions no reference level has, said where they are joined, naming the table."""
    for node in (n for n in rec.nodes if n.op == "cat" and len(n.shape) > 2 and len(n.parents) > 1):
        tokens = any(_read_ids(n) for n in DF.walk(node.parents, lambda n: n.parents))  # ids the module was given
        shared = [_learned_rows(p, tokens) for p in node.parents]
        if any(shared) and not all(shared):
            return node.module, f"{next(filter(None, shared))} put beside {_cat_made(node)} (a cat)"
    return None


def _learned_rows(node, tokens: bool) -> str:
    """What `node` is where it is the same learned rows for every sequence, in the user's terms: a table's rows
    looked up with one row list (prompt tuning's arange(P)), or, beside what the given ids make (`tokens`: not a
    ViT's class token beside its patches), a parameter of 2+ axes itself (a soft prompt's, expanded over the
    batch); "" for anything else."""
    seen = DF.root(node)
    table = DF.weight_of(seen.parents[-1]) if seen.op == "embedding" else None
    if table and getattr(seen.value, "ndim", 0) == 1:
        return f"{table.rpartition('.')[0]}'s rows"
    views = DF.walk([node], lambda n: n.parents[:1] if n.param is None and n.op in DF.VIEWS else [])
    whole = not any(n.op == "__getitem__" and isinstance(n.value, np.ndarray) for n in views)  # not W[ids]
    if tokens and whole and seen.param is not None and len(seen.shape) >= 2:
        return f"the {seen.shape[-2]} learned rows of {seen.param} (a parameter)"
    return ""


def _learned_queries(rec) -> tuple | None:
    """An attention whose queries read none of the module's inputs, only a parameter's rows (a Perceiver
    resampler's or a Q-Former's learned latents): the reference's queries are the sequence's own states."""
    for a in rec.attentions:
        read = next((n for n in rec.nodes if a.q and DF.projection(n) == a.q[0]), None)
        x = next((p for p in read.parents if DF.weight_of(p) is None), None) if read is not None else None
        mha = a.out_node if a.out_node is not None and a.out_node.op in DF.MHA else None
        x = mha.parents[0] if mha is not None and mha.parents else x  # nn.MultiheadAttention's query
        up = list(DF.walk([x], lambda n: n.parents)) if x is not None else []
        rows = [n for n in up if n.param is not None and len(n.shape) >= 2]
        looked = any(n.op in ("embedding", "__getitem__") and isinstance(n.value, np.ndarray) for n in up)  # W_E[ids]
        if rows and not looked and not _given(x):
            name = rows[0].param or ""
            what = f"the {rows[0].shape[-2]} learned rows of {name} (a parameter), no input of the module"
            return name.rpartition(".")[0], f"the queries of the attention in {a.module or 'it'} are {what}"
    return None


def _argument_added(rec) -> tuple | None:
    """A tensor the forward is given beside its input (DETR's `pos`, `query_pos`) added to the states a projection or
    nn.MultiheadAttention reads (DETR's queries and keys, its values without it): positions added inside the module,
    where the reference adds them once, to the embeddings, and gives its layers no such argument."""
    for node in rec.nodes:
        reader = next((c for c in node.children if c.op in DF.MHA or DF.projection(c)), None) if node.extra else None
        if node.op not in DF.ADDS or reader is None:
            continue
        mha = reader.op in DF.MHA  # its query, key and value, in order
        where = reader.module if mha else reader.module.rpartition(".")[0]
        read = [r for r, p in zip(("queries", "keys", "values"), reader.parents, strict=False) if p is node and mha]
        how = f" as its {' and '.join(read)}" if mha else f" by {DF.projection(reader)}"
        alone = ", its values the states without it" if read and "values" not in read else ""
        return where, f"the states + {node.extra} (an argument of the forward) are read{how}{alone}"
    return None


def batch_attended(rec, choice) -> tuple | None:
    """nn.MultiheadAttention left sequence-first (batch_first=False) and given the batch-first states (B, T, D) it reads
    as (T, B, D): each position attends across the examples of the batch, which no reference does. Read on a
    recording passed the probe as the module is judged (`choice`'s layout), the batch size that of the probe."""
    B, batch_first = rec.batch or (0, None)
    for node in rec.nodes if batch_first == choice.caller.batch_first else ():
        shape = node.parents[0].shape if node.op == "multi_head_attention_forward" else ()
        if len(shape) == 3 and shape[0] == B > 1 and shape[1] != B:
            what = f"nn.MultiheadAttention (sequence-first) given states (B, T, D) = {shape} reads them as (T, B, D)"
            return node.module, f"{what}: each of the {shape[1]} positions attends across the {B} examples of the batch"
    return None


def _cat_made(node) -> str:
    """What the cat `node` makes is read as: an attention's keys (its product reaches a softmax), its values (another
    product of no weight), else the sequence of token states."""
    ahead = list(DF.walk([node], lambda n: n.children if n.op in DF.VIEWS or n is node else []))
    products = [n for n in ahead if n.op in DF.PRODUCTS and DF.projection(n) is None]
    onward = DF.walk(products, lambda n: n.children if n.op in SCORES_PATH or n in products else [])
    if not products:
        return "the tokens' embeddings"
    return "the keys" if any(n.op in DF.SOFTMAX for n in onward) else "the values"


def past_output(flow, level: str, widths: set) -> NoPair | None:
    """Where the module's output has none of the reference's shapes: a projection of every position's state
    (B, T, D) to other features than the reference's output of D `widths` (an encoder's states), through
    element-wise ops and views, is a head the level lacks (LLaDA's vocabulary head on a bidirectional trunk): said
    where it projects; None where the output is no such projection."""
    last = [n for n in (flow.nodes if flow else []) if n.op != "unreached"][-1:]
    for node in DF.walk(last, lambda n: n.parents if n.op in ELEMENTWISE | DF.VIEWS else []):
        x = next((p for p in node.parents if DF.weight_of(p) is None), None) if DF.projection(node) else None
        if x is not None and len(x.shape) == 3 and x.shape[-1] in widths and node.shape[-1] not in widths:
            what = f"a projection of every position's state ({x.shape[-1]} -> {node.shape[-1]} features) makes the "
            return NoPair(node.module, f"{what}module's output, where the reference's output is the states", level)
    return None


SAME_ROWS = DF.VIEWS | {"repeat"}  # a parameter's rows repeated over the batch: the same rows


def shortened(flow, level: str) -> NoPair | None:
    """Where the module's output holds fewer positions than its input (B, T, D): the first op computed from the input
    whose output, on the way to the module's, holds fewer (a Funnel's pooled queries, a PMA's learned seeds
    attending to the set), which no reference level makes; said where it runs, or where the learned rows it reads
    are held. None where the output holds as many."""
    given = next((n for n in flow.nodes if n.op == "input" and len(n.shape) == 3), None) if flow else None
    last = [n for n in (flow.nodes if flow else []) if n.op != "unreached"][-1:]
    if given is None or not last or len(last[0].shape) != 3 or last[0].shape[1] >= given.shape[1]:
        return None
    (B, T, D), before = given.shape, {id(n) for n in DF.walk(last, lambda n: n.parents)}
    made = [n for n in DF.walk([given], lambda n: n.children) if id(n) in before and len(n.shape) == 3]
    made = [n for n in made if n.shape[0] == B and n.shape[1] < T and n.shape[2] == D]
    if not made:
        return None
    made = DF.root(min(made, key=lambda n: n.index))
    reads = [DF.root(p) for p in made.parents if id(p) in before and p.made is None and T in p.shape]
    from_ = f" from the {T} that {reads[0].module or 'the module'} computes" if reads else f" from {T}"
    up = DF.walk([p for p in made.parents if len(p.shape) == 3], lambda n: n.parents if n.op in SAME_ROWS else [])
    rows = [n for n in up if n.param and len(n.shape) >= 2]
    held = f", its queries the learned rows of {rows[0].param}" if rows else ""
    what = f"{made.op} in {made.module or 'the module'} makes {last[0].shape[1]} positions{from_}{held}"
    return NoPair(rows[0].param.rpartition(".")[0] if held else made.module, what, level)


def example_read(flow) -> tuple | None:
    """Where the level's probe could not stand for an example's inputs (session.own_call): its first float input
    that is no (B, T, D) sequence of the width the attentions read, and the first op that reads it so: of more axes
    (a video's (B, F, N, D)), a cat beside its tokens or a product of two computed tensors (scores over a group of
    them); of another width (a point's xyz), the projection that widens it."""
    given = [n for n in (flow.nodes if flow else []) if n.op == "input" and len(n.shape) >= 3]
    given = [n for n in given if not isinstance(v := flow.values.get(n.index), torch.Tensor) or v.is_floating_point()]
    if not given:
        return None
    queries = [n for n in flow.nodes if flow.attentions and DF.projection(n) in flow.attentions[0].q]
    width = next((p.shape[-1] for n in queries for p in n.parents if DF.weight_of(p) is None), None)
    if width is None or len(given[0].shape) == 3 and given[0].shape[-1] == width:
        return None
    shape = tuple(given[0].shape)
    for node in sorted(DF.walk(given[:1], lambda n: n.children), key=lambda n: n.index):
        if len(shape) == 3 and DF.projection(node) is not None:
            return node.module, f"a projection of the {shape} input's {shape[-1]} features to {node.shape[-1]}"
        joined = node.op in ("cat", "stack") and len(node.parents) > 1 and len(shape) > 3
        if joined and all(len(p.shape) > 1 and p.shape[-1] == node.shape[-1] for p in node.parents):
            rows = ", ".join(r.param for p in node.parents if (r := DF.root(p)).param) or "computed rows"
            return node.module, f"{node.op} puts {rows} beside the tokens of the {shape} input, in groups"
        if len(shape) > 3 and node.op in DF.PRODUCTS and DF.projection(node) is None and len(node.parents) == 2:
            return node.module, f"the scores read the {shape} input's tokens in groups of {node.shape[-1]}"
    return None


def _picked(rec) -> tuple | None:
    """The states (B, T, D) read at one position per sequence into (B, D) (a reward model's hidden[:, -1]) by the
    projection the module's output comes from (through element-wise ops and views): a head on one position, which no
    reference level has, where an activation follows its projection (BERT's pooler, tanh(dense(h[:, 0]))) or its
    width is not D at another row than the first (the towers read a class token's into a plain projection); said
    where the row is picked."""
    walked = list(DF.walk(rec.nodes[-1:], lambda n: n.parents if n.op in ELEMENTWISE | DF.VIEWS else []))
    for node in walked:
        x = node.parents[0] if DF.projection(node) is not None else None
        if x is None or x.op not in DF.VIEWS | {"index_select", "gather"} or not x.parents:
            continue
        whole, after = x.parents[0], [n.op for n in walked if n.op in DF.ACTIVATIONS and n.index > node.index]
        if len(whole.shape) != 3 or tuple(x.shape) != (whole.shape[0], whole.shape[2]):
            continue
        if after or node.shape[-1] != whole.shape[2] and not _first_row(rec, x, whole):
            what = f"the state at one position per sequence, (B, T, D) -> (B, D), fed to {node.module or 'a head'}"
            then = f", then {' and '.join(dict.fromkeys(after))}" if after else ""
            return x.module, f"{what}: a head of {whole.shape[2]} -> {node.shape[-1]} feature(s){then}"
    return None


def _positions_kept(rec) -> tuple | None:
    """The states (B, T, D) read at fewer positions than they hold by an index tensor (MAE's x[:, keep], a subset of
    the patches): the sequence shortened by a choice of positions, which no reference level makes; a slice (no
    index tensor) or a permutation of every position is none."""
    for node in (n for n in rec.nodes if n.op in ("__getitem__", "index_select") and len(n.parents) > 1):
        whole, index = node.parents[0], node.parents[1]
        B, T, D = whole.shape if len(whole.shape) == 3 else (0, 0, 0)
        if len(node.shape) == 3 and node.shape[0] == B and node.shape[2] == D and 0 < node.shape[1] < T:
            held = DF.root(index).param or "an index"
            return node.module, f"the states (B, {T}, D) read at {node.shape[1]} of their positions by {held}"
    return None


def _first_row(rec, x, whole) -> bool:
    """Whether the picked states `x` are each sequence's first row of `whole` (a class token's: the towers' pool and
    BERT's pooler read it, the reference's too)."""
    picked, states = rec.values.get(x.index), rec.values.get(whole.index)
    return picked is not None and states is not None and torch.equal(picked, states[:, 0])


def _uncalled(flow) -> tuple | None:
    """The parts of a block, holding weights, that the block never calls where another block calls its own
    (blocks.1.ln_2 left out of blocks.1's forward, blocks.0.ln_2 not): said at the first such block; a part inside
    a part (an expert a router never picks) is none."""
    called, found = {c.path for c in flow.calls}, {}
    for path in (p for p in flow.owners if p not in called):
        block = re.match(r"(.*?\.)(\d+)\.", path)  # the first stack's: blocks.1.
        if block is None or block[0][:-1] not in called:
            continue
        while path.rpartition(".")[0] not in called:
            path = path.rpartition(".")[0]
        part = path[block.end() :]
        if "." not in part and any(re.fullmatch(re.escape(block[1]) + r"\d+\." + re.escape(part), c) for c in called):
            found.setdefault(block[0][:-1], {})[part] = None
    where, parts = next(iter(found.items()), ("", {}))
    said = " and ".join(parts) + (" are" if len(parts) > 1 else " is")
    return (where, f"{said} never called in the block (the other blocks call theirs)") if parts else None


def _embedding_scale(rec) -> tuple | None:
    """A token lookup (B, T, D) multiplied by a number c other than 1 and sqrt(D) (the reference's scale_embeddings)
    and D (the catalogue's embedding.double_scale): Granite's embedding_multiplier, MiniCPM's scale_emb, ESM-2's token
    dropout (after a masked_fill zeroing the <mask> rows, as a table's zero row would); said where it is multiplied."""
    for lookup in (n for n in rec.nodes if n.op == "embedding" and n.shape):
        ahead = DF.walk(lookup.children, lambda n: n.children if n.op in DF.VIEWS | {"dropout", "masked_fill"} else [])
        node, D = next((n for n in ahead if DF._factor(n) is not None), None), lookup.shape[-1]
        c = DF._factor(node) if node is not None else None
        usual = c is None or any(math.isclose(c, s, rel_tol=1e-3) for s in (1.0, math.sqrt(D), D))
        if node is not None and not usual:
            table = DF.root(lookup.parents[-1]).param or "the token table"
            what = f"the embeddings ({table}) are {DF.scaled_by(node)}, where the reference scales them by sqrt(D)"
            return node.module, f"{what} = {math.sqrt(D):.4g} or not at all"
    return None


def _pattern(rec) -> tuple | None:
    """A self-attention's mask (keys_seen; each query reads itself) that is none of the reference's (causal, a
    causal window: Flow.width; no mask, a band |i - j| <= w either side), said as the keys each query reads
    (_form): the first keys every query reads (StreamingLLM's sinks) or the first positions that also read every
    key (Longformer's global tokens), besides a window, a band or a block of its own (Llama 4's chunks,
    block-local attention); else later keys read besides such a causal mask, else each query's keys listed
    (strided, dilated, a speculative tree's ancestors). Keys no query reads (padding) are left out."""
    for node in (n for n in rec.nodes if n.op in DF.SOFTMAX | DF.MHA | {DF.SDPA}):
        seen = rec.keys_seen(node)
        if seen is None or seen.ndim != 2 or seen.shape[0] != seen.shape[1] or not bool(seen.diagonal().all()):
            continue
        T = seen.shape[0]
        d = torch.arange(T)[:, None] - torch.arange(T)[None]  # query - key
        causal = not bool(seen[d < 0].any())
        real = seen.any(0) | causal  # a bidirectional mask: the positions padded in every sequence left out
        seen, d = seen[real][:, real], d[real][:, real]
        band = torch.equal(seen, d.abs() <= int(d.abs()[seen].max()))  # no mask, or the reference encoder's band
        if (rec.width(node) is not None or bool(seen[d >= 0].all())) if causal else band:
            continue
        said = _form(seen, d, causal)
        if said:
            return node.module, f"the mask lets each query read {said}"
        past = None if causal else _form(seen & (d >= 0), d, True, reference=True)
        if past:
            later = _listed(seen & (d < 0))
            return node.module, f"the mask lets queries read later keys (query: keys after it: {later}) besides {past}"
        what = "earlier keys otherwise than a causal window" if causal else "keys otherwise than a band either side"
        return node.module, f"the mask hides {what} (each query's keys: {_listed(seen)})"
    return None


def _listed(keys: torch.Tensor) -> str:
    """The keys each query of `keys` (T, T) reads, "query: key, key; ...", for the queries that read any."""
    return "; ".join(
        f"{q}: {', '.join(map(str, row.nonzero().flatten().tolist()))}" for q, row in enumerate(keys) if row.any()
    )


def _form(seen: torch.Tensor, d: torch.Tensor, causal: bool, reference: bool = False) -> str | None:
    """The words for a mask `seen` (T, T) of distances `d` (query - key): a local part (a causal window of the
    last w keys, a band |i - j| <= w either side, its own block of c positions) besides the first n keys every
    query reads and, bidirectional, the first m positions that read every key (n = m: global positions); None
    where none fits. `reference`: the local part alone, or every earlier key (the past of a mask that reads
    later keys too)."""
    T = len(seen)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None]
    allowed = d >= 0 if causal else torch.ones(T, T, dtype=torch.bool)
    if reference and bool(seen[allowed].all()):
        return "every earlier key (causal)"
    local = [(f"a window of its last {w}" if causal else f"the keys within {w} positions either side (|i - j| <= {w})",
              d < w if causal else d.abs() <= w) for w in range(1, T)]  # fmt: skip
    local += [(f"only the {'causal ' * causal}keys of its own block (chunk) of {c} positions", i // c == j // c)
              for c in range(2, T)]  # fmt: skip
    tops = sorted(((n, m) for n in range(T) for m in ([0] if causal else range(T))), key=sum)
    for n, m in tops if not reference else [(0, 0)]:
        said = next((s for s, keep in local if torch.equal(seen, allowed & (keep | (j < n) | (i < m)))), None)
        if said:
            return " besides ".join([*_globals(n, m, causal), said])
    return None


def _globals(n: int, m: int, causal: bool) -> list:
    """The words for the first `n` keys every query reads and the first `m` positions that read every key."""
    if not (n or m):
        return []
    if n == m:
        return [f"global position{'s' * (n > 1)} {', '.join(map(str, range(n)))} (it reads every key, every query "
                "reads it)"]  # fmt: skip
    keys = [f"the first {n} keys ({'sink tokens' if causal else 'read by every query'})"] if n else []
    return keys + ([f"every key at the first {m} positions (global queries)"] if m else [])


def _read_back(rec) -> tuple | None:
    """A projection's output written into a buffer by index (t[i] = x: a cache's slots) and read back (by index and
    views) at its own shape, holding other positions than it wrote (a paged cache's blocks gathered in another order
    than its block table's): said with the positions each sequence reads."""
    for w in (n for n in rec.nodes if n.op == "__setitem__" and len(n.parents) > 1):
        written = DF.root(w.parents[-1])
        x, role = rec.values.get(written.index), rec.roles.get(next(iter(DF.back(written)[0]), ""))
        reads = DF.walk(w.children, lambda n: n.children if n.op in DF.VIEWS | {"__setitem__"} else [])
        for y in (rec.values.get(r.index) for r in reads if r.op == "__getitem__"):
            if x is not None and role and y is not None and y.shape == x.shape and x.ndim > 2 and not torch.equal(x, y):
                what = {"q": "queries", "k": "keys", "v": "values"}.get(role, f"outputs of {role}")
                return w.module, f"the {what} written into a buffer by index (a cache) are read back at other " + (
                    f"positions: {_positions(x, y)}"
                )
    return None


def _positions(x: torch.Tensor, y: torch.Tensor) -> str:
    """The positions (axis 1) of `x` each sequence of `y` holds, for the sequences that hold others than their own
    in order ("-": a slot holding none of them)."""
    said = []
    for b in range(x.shape[0]):
        held = [(y[b, t] == x[b]).flatten(1).all(1).nonzero().flatten().tolist()[:1] for t in range(y.shape[1])]
        if held != [[t] for t in range(y.shape[1])]:
            said.append(f"sequence {b} reads positions {', '.join(str(h[0]) if h else '-' for h in held)}")
    return "; ".join(said) + " ('-': a slot it did not write)" * any("-" in p for p in said)


def _mask_by_row(rec) -> tuple | None:
    """A mask that hides the same keys from every query of a sequence, keys of several ids (a padding mask hides one
    id's), some key read: one made from the batch's row, not the ids (Equinox's tril of the ids' shape, vmapped
    along with them: sequence b reads keys 0 .. b). Each sequence's ids are its token lookup's (one per sequence
    where the batch runs as a loop, else one for the batch), its softmaxes those run after it, over the heads."""
    lookups = [n for n in rec.nodes if n.op in ("embedding", "__getitem__") and isinstance(n.value, np.ndarray)]
    tables = [DF.root(n.parents[-1 if n.op == "embedding" else 0]).param for n in lookups]
    looked = [n for n, t in zip(lookups, tables, strict=True) if t is not None and t == tables[0]]
    rows = [(n.index, row) for n in looked for row in np.atleast_2d(n.value)]
    softmaxes = [n for n in rec.nodes if n.op in DF.SOFTMAX and n.index in rec.values and len(n.shape) >= 2]
    softmaxes = softmaxes if rows else []  # no ids read: none to tell a padding mask by
    for n in softmaxes:
        probabilities = rec.values[n.index].detach()
        before = [b for b, (i, _) in enumerate(rows) if i < n.index]
        batched = len(looked) == 1 and probabilities.ndim > 2 and probabilities.shape[0] == len(rows)
        seen = (probabilities > 0).reshape(len(rows) if batched else 1, -1, *probabilities.shape[-2:]).any(1)
        for k, keys in enumerate(seen):
            ids = rows[k if batched else before[-1] if before else 0][1]
            read = keys[-1]
            hidden = ids[~read.numpy()] if len(ids) == len(read) else ids[:0]
            if bool((keys == read).all()) and bool(read.any()) and len(set(hidden.tolist())) > 1:
                what = f"the attention's mask lets every query read keys {_spans(read)} alone"
                return n.module, f"{what}, hiding tokens of {len(set(hidden.tolist()))} ids (no padding's: one id)"
    return None


def _spans(keys) -> str:
    """The positions where `keys` (booleans) is True, as runs: "0 .. 2, 5"."""
    where = torch.nonzero(keys).flatten().tolist()
    starts, ends = [i for i in where if i - 1 not in where], [i for i in where if i + 1 not in where]
    return ", ".join(f"{a}" if a == b else f"{a} .. {b}" for a, b in zip(starts, ends, strict=True)) or "none"


def _norm_after_rotary(rec) -> tuple | None:
    """A q or k norm whose gain per feature meets the features after the rotary turned them (Hunyuan's query_layernorm
    on the turned queries, torchtune's q_norm): g (R x) / rms, where the reference's q/k norm gives R (g x) / rms,
    before the rotation. Turned: a cos, sin or polar op behind the gain, or a product with a cos or sin table the
    module keeps (_trig_table)."""
    for a in rec.attentions:
        for scale, role in ((s, r) for s, r in a.norms.items() if s in rec.order):
            use = next((n for n in rec.nodes if n.index == rec.order[scale]), None)  # its first use: x times the gain
            if use is None:
                continue
            behind = list(DF.walk(use.parents, lambda n: [] if n.op in DF.PRODUCTS else n.parents))  # to the projection
            gain = any(DF.root(p).param == scale and _per_feature(p) for p in use.parents)
            tables = (rec.values.get(p.index) for n in behind if n.op in DF.MULS for p in n.parents)
            if gain and (any(n.op in DF.TURNS for n in behind) or any(map(_trig_table, tables))):
                what = f"{scale} (a gain per feature) normalises the {'queries' if role == 'q' else 'keys'} after"
                return a.module, f"{what} the rotary turns them, where the reference's q/k norm comes before it"
    return None


def _trig_table(value) -> bool:
    """Whether `value` (a tensor the forward computed, or None) is a cos or sin table by position: every number within
    [-1, 1], not all of them -1, 0 or 1, and its first row (positions on the second last axis) all 1 or all 0."""
    if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.ndim < 2:
        return False
    first = value.detach().reshape(-1, *value.shape[-2:])[0][0]
    fractional = bool((value.detach() != value.detach().round()).any())
    return fractional and bool(value.abs().max() <= 1) and bool((first == 1).all() or (first == 0).all())


def _summed(node) -> int | None:
    """The size of the axis a product of two computed tensors sums over (a matmul's last of its first operand, an
    einsum's letter in both operands and not the result); None for a projection or any other product."""
    if DF.projection(node) is not None or len(node.parents) != 2 or min(len(p.shape) for p in node.parents) < 2:
        return None
    match = DF._two(node.extra) if node.op == "einsum" else None
    if match is not None:
        summed = [c for c in match[0] if c in match[1] and c not in match[2]]
        return node.parents[0].shape[match[0].index(summed[0])] if len(summed) == 1 else None
    return node.parents[0].shape[-1] if node.op in ("matmul", "__matmul__", "bmm") else None


def _scored(node) -> bool:
    """Whether a scores product (of two computed tensors, no weight) lies behind `node` through element-wise ops:
    the weights of an attention (softmax or not), or such a product itself."""
    behind = DF.walk([node], lambda n: [] if n.op in DF.PRODUCTS else DF._behind(n))
    return any(n.op in DF.PRODUCTS and DF.projection(n) is None and _summed(n) is not None for n in behind)


def _mixed(rec) -> tuple | None:
    """Positions mixed with no attention's weights: the first product of two computed tensors (no weight) that sums
    over the sequence's positions where no operand is computed from scores q k^T (Performer's and cosFormer's
    phi(k)^T v, a Synthesizer's softmax of a learned table times v), in a submodule where no attention was read:
    said there, with the ops and the parameters its operands are made by in that submodule, in order."""
    attentions, T = {a.module for a in rec.attentions}, _sequence(rec)
    for node in (n for n in rec.nodes if n.op in DF.PRODUCTS and n.module not in attentions):
        if _summed(node) not in T or any(map(_scored, node.parents)):
            continue
        behind = DF.walk(node.parents, lambda n, at=node.module: n.parents if n.module == at else [])
        made = sorted((n for n in behind if n.module == node.module), key=lambda n: n.index)
        ops = [n.op for n in made if n.op not in DF.VIEWS | {"param", "input"}]
        read = [str(DF.root(p).param) for n in made for p in n.parents if DF.root(p).param]
        said = f"a {node.op} of computed tensors sums over the {_summed(node)} positions, with no softmax over scores "
        said += f"q k^T: its operands made by {', '.join(dict.fromkeys(ops)) or 'views'}"
        return node.module, said + (f" from {', '.join(dict.fromkeys(read))}" if read else "")
    return None


FOREIGN = ("fft_", "linalg_")  # torch.fft's and torch.linalg's ops (a norm aside): no reference level computes one


def _foreign(rec) -> tuple | None:
    """An op of torch.fft or torch.linalg (FNet's fft2 over the tokens and features, Nystromformer's pinv), none of
    which the reference computes (linalg's norms aside): said at the first's submodule, as torch names it."""
    for node in (n for n in rec.nodes if n.op.startswith(FOREIGN) and n.op not in MOMENTS):
        name = node.op.replace("_", ".", 1)
        shape = " x ".join(map(str, node.parents[0].shape)) if node.parents else ""
        return node.module, f"torch.{name} of a {shape} tensor (no reference level computes torch.fft's or linalg's)"
    return None


RNN_OPS = ("gru_cell", "lstm_cell", "rnn_tanh_cell", "rnn_relu_cell", "gru", "lstm", "rnn_tanh", "rnn_relu")


def _rnn(rec) -> tuple | None:
    """A torch recurrent op (nn.GRUCell's, nn.LSTM's, ...: learned gates updating a state from an input;
    x-transformers' GRU-gated residual in place of the addition): said at the first's submodule, as torch names it."""
    node = next((n for n in rec.nodes if n.op in RNN_OPS), None)
    return None if node is None else (node.module, f"torch's {node.op}: an RNN's state updated by learned gates")


def _turned_then_scaled(rec) -> tuple | None:
    """The queries, once the rotary's cos and sin turn them, multiplied or divided by a table the forward makes from
    no parameter, input, cos or sin, whose numbers change (xPos's decay zeta_i^(t / s), a pow): said at the
    attention with the op that makes the table; the reference's RoPE only turns them."""
    stops = DF.PRODUCTS | DF.SOFTMAX | {DF.SDPA}
    for a in rec.attentions:
        onward = DF.walk(a.turned, lambda n: [] if n.op in stops else n.children)
        for node in (n for n in onward if n.op in DF.MULS | DF.DIVS and len(n.parents) == 2):
            for table in node.parents:
                value = rec.values.get(table.index)
                made = DF.walk([table], lambda n: n.parents)
                if not isinstance(value, torch.Tensor) or value.is_complex() or value.numel() < 2:
                    continue  # a number, or a complex rotation (Meta's)
                if bool((value == value.max()).all()):
                    continue  # the same everywhere
                if not any(n.param is not None or n.op in DF.TURNS or n.op == "input" for n in made):
                    by = f"{'multiplied' if node.op in DF.MULS else 'divided'} by a table {tuple(value.shape)}"
                    span = f"{float(value.min()):.4g} to {float(value.max()):.4g}"
                    what = f"the queries, once the rotary's cos and sin turn them, {by} the forward makes with "
                    what += f"{DF.root(table).op} (numbers from {span} by position and feature), where the reference's "
                    return a.module, what + "RoPE only turns them", node.index
    return None


# the finders; of two found, the one whose submodule runs first is the answer (of a tie, the earlier here)
FINDS = (
    _joined, _offset_ids, _tables_summed, _windows, _renormed, _embedding_scale, _pattern, _read_back, _mask_by_row,
    _norm_after_rotary, _weightless_norm, _unit_length, _centred_head_norm, _normalised_weight, _batch_norm, _glu,
    _previous_gate, score_terms, clamped_scores, _cross_mask, _macaron, _weights, _renormalised, _coupled, _gain,
    _output_gate, _clamped, _rounded, _activation, _value_embedding, _value_residual, _depth_weights, _streams,
    _token_choice, _biased_gates, _row_added, _signal_added, _running_sum, _learned_scale, _conditioned, _pooled,
    _picked, _positions_kept, _feature_head, _uncalled, _prepended, _shifted_copies, _token_shift, _recurrence,
    _learned_queries, _foreign, _rnn, _mixed, _turned_then_scaled, _argument_added,
)  # fmt: skip
