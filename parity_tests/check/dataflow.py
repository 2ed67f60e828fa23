"""The user's forward run once under an op recorder: which parameter plays which role, read from the dataflow.

`record(run, module)` runs `run()` under a TorchFunctionMode that sees every torch call, and forward hooks that say
which submodule runs it. Every tensor made is a Node whose parents are the Nodes of its tensor arguments; a
parameter is a leaf named by its (first registered) name, whatever view of it an op reads; a tensor written in place
(t[i] = x, copy_ or index_put_ into it or into a view of it) is read later as computed from what was written too. What
`Flow` reads:

- a projection is a product (linear, matmul, einsum (tensordot as one), conv1d, addmm, ...) that reads a parameter of
  2 or more axes;
- attention: the scores are the product a softmax reads (through scaling, masking, casts); Q and K its two
  operands, V the other operand of the product the probabilities feed (scaled_dot_product_attention names the
  three), each traced back through reshapes, rotations and norms to its projections (a 1-D parameter met on the
  way: a per-head q/k norm; DeepSeek's latent attention: a key projection on another's normed output, _latent); the
  output projection is the first one the result reaches; attentions whose probabilities reach one output
  projection through one op are one attention's heads (a module per head);
- a feed-forward is a projection whose input comes from other projections only through element-wise ops, an
  activation among them: from one, a plain block (or a gated one whose gate and up are one projection split,
  Phi-3's gate_up_proj); from two, a gated block, the gate the one an activation reads; a router: the one
  projection a topk reads (through a softmax or not), its experts the blocks run after it;
- an attention's sliding window: the keys its probabilities (or SDPA's mask) let each query see; its RoPE: the cos
  and sin tables its queries are turned by; a sandwich: a norm between the attention's output and the stream;
- order: each parameter's first use; positions: the tables looked up with c, c + 1, ..., c + T - 1 (c = 2: BART's),
  their rows added (concatenated, prompt tuning's, they are none);
  a scale first read as 1 + weight (Gemma's norms). Registration order decides nothing; names only label.
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

# ops through which a tensor is the same numbers seen another way (a parameter read as a projection's weight)
VIEWS = {
    "t", "transpose", "permute", "view", "reshape", "contiguous", "to", "type_as", "float", "double", "half",
    "__get__", "detach", "clone", "expand", "unsqueeze", "squeeze", "flatten", "__getitem__", "type", "chunk",
    "split", "unbind", "narrow", "unflatten",
}  # fmt: skip
PRODUCTS = {
    "linear", "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "einsum", "conv1d", "addmm", "baddbmm", "_grouped_mm",
}  # fmt: skip
WEIGHT_OPERAND = {"linear": 1, "matmul": 1, "__matmul__": 1, "mm": 1, "bmm": 1}  # x @ W, F.linear(x, W)
SOFTMAX = {"softmax", "_softmax", "exp"}  # exp: a softmax written by hand, e / e.sum()
ACTIVATIONS = {
    "relu", "gelu", "silu", "sigmoid", "tanh", "erf", "softplus", "relu_", "elu", "mish", "leaky_relu", "clamp",
    "clamp_min", "hardtanh",
}  # fmt: skip
SDPA = "scaled_dot_product_attention"
MHA = {"multi_head_attention_forward", "_native_multi_head_attention"}  # nn.MultiheadAttention, one op
ADDS = {"add", "__add__", "__radd__", "__iadd__", "add_"}
MULS = {"mul", "__mul__", "__rmul__", "mul_", "__imul__"}
DIVS = {"div", "__truediv__", "div_", "__itruediv__"}
SUBS = {"sub", "__sub__", "sub_", "__isub__"}
SPLITS = {"chunk", "split", "unbind"}
SINK_AT_ZERO = "(a sink logit at 0: a 1 in the softmax's denominator)"
TURNS = {"cos", "sin", "polar"}  # the ops that make RoPE's tables
CENTRING = {"sub", "__sub__", "__rsub__", "sub_", "var", "std", "var_mean", "std_mean", "layer_norm"}  # x - mean(x)


@dataclass(eq=False)
class Node:
    index: int
    op: str
    module: str
    parents: list
    shape: tuple = ()
    param: str | None = None  # a parameter's (or buffer's) name: a leaf
    extra: str = ""  # an einsum's equation; an embedding's "max_norm=m" where it renormalises the rows it reads; an
    # add's: the name of the forward's argument it adds (unrecorded: DETR's `pos`, Recorder.arguments)
    children: list = field(default_factory=list)
    value: object = None  # an embedding's ids (numpy); an attention op's: _attention_args; a part: its index
    call: tuple | None = None  # a view's (func, args, kwargs), to replay it on indices (columns_held); a clamp's
    tid: int = 0  # the id of the tensor it made
    named: dict = field(default_factory=dict)  # F.multi_head_attention_forward's: {argument: the parameter it is}
    made: frozenset | None = None  # made from parameters alone: those of 2+ axes (_made_of); else None
    grown: bool = False  # made so through a product (a hypernetwork's W = gen(e).view(d_out, d_in))
    as_weight: bool = False  # read as a product's weight (F.linear's, the right of x @ W: WEIGHT_OPERAND)


def _axis(name: str, args: tuple, kwargs: dict) -> int | None:
    """The axis a topk (or max, argmax over an axis) picks along, counted from the first; None for one over all."""
    dim = kwargs.get("dim", args[2 if name == "topk" else 1] if len(args) > (2 if name == "topk" else 1) else None)
    dim = -1 if dim is None and name == "topk" else dim
    return dim % max(args[0].dim(), 1) if isinstance(dim, int) and isinstance(args[0], torch.Tensor) else None


class _Recorder(TorchFunctionMode):
    def __init__(self, names: dict, constants: set):
        super().__init__()
        self.names = names  # id(tensor) -> parameter or buffer name
        self.constants = constants  # the ids of one-number buffers: a number where an op adds, multiplies or divides
        self.nodes: list[Node] = []
        self.of: dict = {}  # id(tensor) -> Node
        self.keep: list = []  # the tensors seen, kept alive so that their ids stay theirs
        self.path: list[str] = [""]
        self.values: dict = {}  # node index -> the tensor it made (unsupported.py reads them)
        self.calls: list[Called] = []  # each submodule call, as it returns
        self.arguments: dict = {}  # id(tensor) -> its name, the judged forward's tensor arguments past its first

    def node(self, t: torch.Tensor) -> Node | None:
        found = self.of.get(id(t))
        if found is None and id(t) in self.names:
            found = self._add(Node(len(self.nodes), "param", "", [], tuple(t.shape), self.names[id(t)]))
            self.of[id(t)] = found
            self.keep.append(t)
        return found

    def _add(self, node: Node) -> Node:
        """`node` appended, and made a child of its parents."""
        node.made = _made_of(node)
        node.grown = node.made is not None and (node.op in PRODUCTS or any(p.grown for p in node.parents))
        if (w := _weight_operand(node)) is not None:
            w.as_weight = root(w).as_weight = True
        self.nodes.append(node)
        for p in node.parents:
            p.children.append(node)
        return node

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        flat, _ = tree_flatten((args, kwargs))
        name = getattr(func, "__name__", str(func))
        if isinstance(func, torch._ops.OpOverload):  # an exported graph's aten.view.default: "view" (aten's order);
            name = func.overloadpacket.__name__ if func.namespace == "aten" else func.name()  # a custom op: its own
            args = (args[1], args[0], *args[2:]) if name == "embedding" else args  # aten's (weight, ids)
        if name == "tensordot":  # read as the einsum it is: tensordot(x, w, ([2], [1])) is "abc,dc->abd"
            name, args, kwargs = "einsum", (_tensordot_equation(*args, **kwargs), *args[:2]), {}
        number = name in ADDS | MULS | DIVS  # a one-number buffer there is read as the number it holds
        parents = self._parents(
            name, [a for a in flat if isinstance(a, torch.Tensor) and not (number and self._held(a))]
        )
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        outs = [args[0]] if name == "__setitem__" else outs  # t[i] = x: reading t later reads what was written
        if not outs or not parents and name not in ("arange",):
            return out
        if name in VIEWS and all(any(o is a for a in flat) for o in outs):
            return out  # x.float() of a float32 x, x.contiguous() of a contiguous one: x itself, nothing new
        axis = _axis(name, args, kwargs) if name in ("topk", "max", "argmax") else None
        top_one = name in ("max", "argmax") and axis is not None and len(parents) == 1
        top_one = top_one and parents[0].op in SOFTMAX | {"sigmoid"}
        top_one = top_one and args[0].shape[axis] > 1  # over one expert: its probability 1, no choice (a dense block)
        shape = list(outs[0].shape)
        if top_one and len(shape) < args[0].dim():  # as topk's, the axis kept
            shape.insert(axis, 1)
        name = "topk" if top_one else name  # torch.max (argmax) over probabilities: a router's top-1 (Switch's)
        node = Node(len(self.nodes), name, self.path[-1], parents, tuple(shape))
        parts = name in SPLITS and len(outs) > 1  # the parts of a chunk or split, each its own node
        node.tid = id(out) if parts else id(outs[0])  # a split's: its tuple's (kept alive below)
        node.extra = args[0] if name == "einsum" and args and isinstance(args[0], str) else ""
        max_norm = kwargs.get("max_norm", args[3] if len(args) > 3 else None) if name == "embedding" else None
        node.extra = f"max_norm={max_norm:g}" if max_norm is not None else node.extra  # its rows renormalised
        added = (self.arguments.get(id(a)) for a in flat if isinstance(a, torch.Tensor) and self.node(a) is None)
        node.extra = next((a for a in added if a), node.extra) if name in ADDS else node.extra
        kept = name in VIEWS or name == "pad" or name.startswith(("clamp", "clip", "hardtanh"))  # a pad's: its widths
        node.call = (func, args, kwargs) if kept else None
        self.keep.append(out)  # and the tensors it holds
        node.value = axis if name == "topk" else self._value(name, args, kwargs, len(parents))
        node.named = self._named(func, args, kwargs) if name in MHA else {}  # its weights and biases, by argument
        self.values[self._add(node).index] = outs[0]
        for i, o in enumerate(outs):
            self.of[id(o)] = self._part(node, o, i) if parts else node  # which part is read
        base = args[0]._base if _in_place(name) and isinstance(args[0], torch.Tensor) else None
        if base is not None:  # written through a view (t[..., :n].copy_(x)): reading t later reads x too
            held = [n for n in (self.node(base), node) if n is not None]
            self.of[id(base)] = self._add(Node(len(self.nodes), name, self.path[-1], held, tuple(base.shape)))
            self.keep.append(base)
        return out

    def given(self, module, args: tuple, kwargs: dict) -> None:
        """The module's first argument where it is a float tensor (a layer's x), a leaf of its own ("input"): what
        its forward does to it (a norm first in a layer: x - mean(x)) is recorded too. Masks and memory stay
        unrecorded (products and attentions give them leaves of their own, _parents); the other tensor arguments
        are named (arguments), by the forward's parameters."""
        try:
            bound = inspect.signature(module.forward).bind(*args, **kwargs).arguments
        except (TypeError, ValueError):
            bound = {}
        named = [(n, t) for n, t in list(bound.items())[1:] if isinstance(t, torch.Tensor) and t.is_floating_point()]
        self.arguments |= {id(t): n for n, t in named}
        for t in tree_flatten(args[:1])[0]:
            if isinstance(t, torch.Tensor) and t.is_floating_point() and self.node(t) is None:
                self.of[id(t)] = self._add(Node(len(self.nodes), "input", "", [], tuple(t.shape)))
                self.keep.append(t)

    def _value(self, name: str, args: tuple, kwargs: dict, parents: int) -> object:
        """What a node of op `name` keeps besides its parents (Node.value), None for most ops."""
        if name == "embedding" and isinstance(args[0], torch.Tensor):
            return args[0].detach().cpu().numpy()
        if name == "__getitem__" and id(args[0]) in self.names and len(args) > 1:  # a parameter's rows read
            return _rows_read(args[1], args[0].shape)
        if name in MHA | {SDPA}:
            return _attention_args(name, args, kwargs)
        if name in ("softmax", "_softmax"):  # the axis it normalises
            return kwargs.get("dim", args[1] if len(args) > 1 else None)
        if name in ("layer_norm", "rms_norm"):  # the eps it was called with (F.layer_norm's default 1e-5)
            eps = kwargs.get("eps", args[4] if len(args) > 4 else 1e-5 if name == "layer_norm" else None)
            return float(eps) if eps is not None else None
        if name == "baddbmm":  # how much of the tensor it adds (0: none, HF's scores on an empty tensor)
            return float(kwargs.get("beta", 1))
        if name in ADDS | MULS | DIVS and parents == 1:  # a number added (Gemma's 1 + weight), multiplied by
            found = (a for a in args if isinstance(a, (int, float)) or self._held(a))  # or divided by (a soft cap's)
            return next((float(a) for a in found), None)
        return None

    def _held(self, t) -> bool:
        return isinstance(t, torch.Tensor) and id(t) in self.constants

    def _parents(self, name: str, tensors: list) -> list:
        """The Nodes of an op's tensor arguments; an operand of a product or of an attention made before the forward
        (its input) or outside it: a leaf of its own ("input"), in its place."""
        nodes = [self.node(t) for t in tensors]
        if name not in PRODUCTS | {SDPA} or all(n is None for n in nodes):
            return [n for n in nodes if n is not None]
        return [
            n if n is not None else self._add(Node(len(self.nodes), "input", self.path[-1], [], tuple(t.shape)))
            for n, t in zip(nodes, tensors, strict=True)
        ]

    def _named(self, func, args: tuple, kwargs: dict) -> dict:
        """{argument: parameter name} of the op's (views of) parameters; {} where its signature cannot be read."""
        try:
            bound = inspect.signature(func).bind(*args, **kwargs).arguments
        except (TypeError, ValueError):
            return {}
        nodes = {k: self.of.get(id(v)) for k, v in bound.items() if isinstance(v, torch.Tensor)}
        return {k: root(n).param for k, n in nodes.items() if n is not None and root(n).param is not None}

    def _part(self, node: Node, o: torch.Tensor, i: int) -> Node:
        return self._add(Node(len(self.nodes), node.op, node.module, [node], tuple(o.shape), value=i, tid=id(o)))


def _made_of(node: Node) -> frozenset | None:
    """The parameters of 2+ axes a tensor is made of where it is computed from parameters (and buffers) alone (w +
    (round(w / s) * s - w).detach(), BitNet's quantised weight); else None."""
    if node.param is not None:
        return frozenset([node.param] if len(node.shape) >= 2 else [])
    made = [p.made for p in node.parents]
    looked = node.op == "__getitem__" and isinstance(node.value, np.ndarray)  # rows read by ids: a lookup
    if node.op in ("embedding", "input") or looked or not made or any(m is None for m in made):
        return None
    return frozenset().union(*made)  # type: ignore[arg-type]


def _tensordot_equation(a: torch.Tensor, b: torch.Tensor, dims=2, **_) -> str:
    """The einsum equation of torch.tensordot(a, b, dims): `dims` a count (a's last axes with b's first) or two
    lists of axes paired in order; the result a's free axes, then b's."""
    if isinstance(dims, torch.Tensor):
        dims = dims.tolist()
    pairs = (range(a.dim() - dims, a.dim()), range(dims)) if isinstance(dims, int) else dims
    axes = [[ds] if isinstance(ds, int) else list(ds) for ds in pairs]
    left, right = [d % a.dim() for d in axes[0]], [d % b.dim() for d in axes[1]]
    x, y = list("abcdefghijklm"[: a.dim()]), list("nopqrstuvwxyz"[: b.dim()])
    for i, j in zip(left, right, strict=True):
        y[j] = x[i]
    free = [c for k, c in enumerate(x) if k not in left] + [c for k, c in enumerate(y) if k not in right]
    return f"{''.join(x)},{''.join(y)}->{''.join(free)}"


def _in_place(name: str) -> bool:
    """An op writing into its first argument: copy_, index_put_, add_, ..., t[i] = x."""
    return name == "__setitem__" or name.endswith("_") and not name.startswith("_")


def record(run, module: nn.Module) -> Flow:
    """One call of `run()` (which calls `module`) recorded and read: its Flow (see the module docstring)."""
    names: dict = {}
    for name, t in [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]:
        names.setdefault(id(t), name)
    constants = {id(t) for _, t in module.named_buffers() if t.numel() == 1 and t.is_floating_point()}
    rec = _Recorder(names, constants)

    def leave(key, _, args, kwargs, out) -> None:
        rec.path.pop()
        given = [rec.of.get(id(t)) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        made = next((rec.of.get(id(t)) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)), None)
        rec.calls.append(Called(key, rec.path[-1], given, made))

    given = module.register_forward_pre_hook(rec.given, with_kwargs=True)
    try:
        with hooked(module.named_modules(), leave, rec.path.append), unscripted(module), unvmapped(), rec:
            out = run()
    finally:
        given.remove()
    beside = _reaching(rec.nodes, rec.of.get(id(out)) if isinstance(out, torch.Tensor) else None, names.values())
    flow = read(rec.nodes, rec.values)
    flow.beside = beside
    flow.calls = rec.calls
    flow.owners = [n for n, m in module.named_modules() if next(m.parameters(False), None) is not None]
    return flow


def _reaching(nodes: list, out: Node | None, held) -> list:
    """The parameters (of `held`) read only where the judged output `out` is not computed, or not read at all (none
    where `out` is unrecorded), the nodes off its path left inert (no op, parents or parameter; the list keeps its
    indices): parts whose outputs never reach it (Medusa's draft heads beside the logits, a loss, a layer an early
    exit skips in evaluation) are not the reference's."""
    kept = {id(n) for n in walk([out], lambda n: n.parents)} if out is not None else {id(n) for n in nodes}
    read = {n.param for n in nodes if n.param and id(n) in kept}
    beside = sorted(set(held if out is not None else (n.param for n in nodes if n.param)) - read)
    for n in nodes:
        n.children = [c for c in n.children if id(c) in kept]
        if id(n) not in kept:
            n.op, n.parents, n.param = "unreached", [], None
    return beside


@dataclass
class Called:
    """One call of a submodule: its path, its caller's, the Nodes of its tensor arguments (None: made unrecorded)
    and of its (first) output."""

    path: str
    caller: str
    inputs: list
    output: Node | None


@contextmanager
def unscripted(module: nn.Module) -> Iterator[None]:
    """While inside, each TorchScript function in the namespaces that define the module's classes (Megatron's fused
    bias-GELU) is the Python function it was scripted from: the recorder sees no op a ScriptFunction runs."""
    spaces = {id(v): vars(v) for v in (sys.modules.get(type(m).__module__) for m in module.modules()) if v is not None}
    swapped = [(space, name, f) for space in spaces.values() for name, f in list(space.items()) if _scripted(f)]
    for space, name, f in swapped:
        space[name] = f._torchdynamo_inline
    try:
        yield
    finally:
        for space, name, f in swapped:
            space[name] = f


@contextmanager
def unvmapped() -> Iterator[None]:
    """While inside, torch.vmap (and torch.func.vmap) runs its function on each slice in turn and stacks the
    results: the recorder sees no op inside a vmap (heads written for one head and lifted over the batch)."""
    saved = torch.vmap, torch.func.vmap
    torch.vmap = torch.func.vmap = _looped
    try:
        yield
    finally:
        torch.vmap, torch.func.vmap = saved


def _looped(func, in_dims=0, out_dims=0, randomness="error", *, chunk_size=None):
    """torch.vmap's meaning as a loop over the mapped axis (in_dims: one for all inputs or one each, None unmapped)."""

    def run(*args):
        dims = in_dims if isinstance(in_dims, tuple) else (in_dims,) * len(args)
        n = next(a.shape[d] for a, d in zip(args, dims, strict=True) if d is not None)
        outs = [func(*(a if d is None else a.select(d, i) for a, d in zip(args, dims, strict=True))) for i in range(n)]
        if isinstance(outs[0], tuple):
            return tuple(torch.stack(o, out_dims) for o in zip(*outs, strict=True))
        return torch.stack(outs, out_dims)

    return run


def _scripted(f) -> bool:
    return isinstance(f, torch.jit.ScriptFunction) and callable(getattr(f, "_torchdynamo_inline", None))


@contextmanager
def hooked(modules, after, before=None) -> Iterator[None]:
    """While inside, for each (key, module) of `modules`: `before(key)` before each call of the module and
    `after(key, module, args, kwargs, output)` after it; both must return None (the module's output stays its own)."""
    handles = []
    for key, mod in modules:
        if before is not None:
            handles.append(mod.register_forward_pre_hook(lambda m, a, key=key: before(key)))
        handles.append(mod.register_forward_hook(lambda m, a, k, o, key=key: after(key, m, a, k, o), with_kwargs=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def root(node: Node) -> Node:
    """`node` seen through views: the parameter it is (an expert's of stacked ones, picked by a router), else the
    first node that computes."""
    while node.param is None and node.op in VIEWS and (len(node.parents) == 1 or picked(node)):
        node = node.parents[0]
    return node


def picked(node: Node) -> bool:
    """A parameter's rows picked by a router's top-k choice (GPT-OSS's experts' weights gathered per row), or one
    row of it by one number, an int or a 0-dim tensor (an expert's of stacked ones, in a loop over the experts)."""
    if node.op != "__getitem__" or node.parents[0].param is None:
        return False
    index, shape = node.parents[1:], node.parents[0].shape
    one = all(n.shape == () for n in index) and len(shape) > 1 and shape[0] > 1 and node.shape == shape[1:]
    return one or any(n.op == "topk" for n in walk(index, lambda n: n.parents))


def weight_of(node: Node) -> str | None:
    """The parameter (2 or more axes) `node` is, seen through views, or the one it is made of where it is computed
    from it alone, element-wise (a quantised weight: BitNet's, whose rounding unsupported.py says); None for anything
    else computed."""
    seen = root(node)
    if seen.param is not None:
        return seen.param if len(seen.shape) >= 2 else None
    one = seen.made and len(seen.made) == 1 and not seen.grown and len(seen.shape) >= 2 and seen.as_weight
    return next(iter(seen.made)) if one else None  # type: ignore[arg-type]


def _weight_operand(node: Node) -> Node | None:
    """The operand a product reads as its weight (F.linear's, the right of x @ W) where its other one is computed
    from the inputs (not from parameters alone: learned queries' q k^T is no product by a weight); else None."""
    i = WEIGHT_OPERAND.get(node.op)
    if i is None or len(node.parents) <= i or node.parents[1 - i].made is not None:
        return None
    return node.parents[i]


def generated(flow: Flow) -> bool:
    """Whether a product reads as its weight a tensor of 2+ axes a product made from parameters alone (a
    hypernetwork's weight)."""
    return any((w := _weight_operand(n)) is not None and w.grown and len(w.shape) >= 2 for n in flow.nodes)


def projection(node: Node) -> str | None:
    """The weight a product reads along its other operand's features (a projection), else None."""
    if node.op not in PRODUCTS or across(node) is not None:
        return None
    return next((w for w in map(weight_of, node.parents) if w is not None), None)


def across(node: Node) -> Node | None:
    """The computed operand of an einsum that reads a weight (2 or more axes) along an axis of it other than its last,
    the features (Linformer's keys projected along the positions, hyper-connections' streams mixed); else None."""
    match = _two(node.extra) if node.op == "einsum" and len(node.parents) == 2 else None
    if match is None or [weight_of(p) is None for p in node.parents].count(True) != 1:
        return None
    w, x = (0, 1) if weight_of(node.parents[0]) is not None else (1, 0)
    summed = set(match[w]) & set(match[x]) - set(match[2])
    return node.parents[x] if summed and match[x][-1] not in summed else None


def walk(starts: list, onward) -> Iterator[Node]:
    """Each node reached from `starts` once, breadth first; `onward(node)`: the nodes to go on to from it."""
    seen, todo = set(), list(starts)
    while todo:
        node = todo.pop(0)
        if id(node) not in seen:
            seen.add(id(node))
            yield node
            todo.extend(onward(node))


def _behind(node: Node, choices: bool = False) -> list:
    """Back from `node` through anything but a product or a parameter (to a picked parameter, not its index), nor
    into a top-k unless `choices` (a router's choice: what it picked, not values that flow)."""
    if node.op in PRODUCTS or node.param is not None:
        return [across(node)] if across(node) is not None else []
    joined = _cat_input(node)
    if joined is not None:
        return [joined]
    return [p for p in node.parents[: 1 if picked(node) else None] if choices or p.op != "topk"]


def _cat_input(node: Node) -> Node | None:
    """The input of a cat that the split part `node` gives back whole (k, v = cat((to_k(x), to_v(x))).chunk(2):
    k is to_k(x)), its parts as many as the cat's inputs and of their shapes; else None."""
    i, split = node.value, node.parents[0] if node.op in SPLITS and node.parents else None
    if not isinstance(i, int) or split is None or split.op not in SPLITS or not split.parents:
        return None
    joined, parts = split.parents[0], [c for c in split.children if c.op in SPLITS]
    if joined.op != "cat" or len(parts) != len(joined.parents) or i >= len(parts):
        return None
    return joined.parents[i] if all(a.shape == b.shape for a, b in zip(parts, joined.parents, strict=True)) else None


def back(start: Node, residual: bool = True) -> tuple[list, list, list]:
    """From `start` back through element-wise ops and views to the nearest products (not past a residual sum unless
    `residual`): (the weights met, the 1-D parameters met (norm scales), those of 2+ axes read as they are)."""
    ends = SOFTMAX | MHA | {SDPA, "embedding"}
    stop = (lambda n: False) if residual else _residual
    met = list(walk([start], lambda n: [] if n.op in ends or projection(n) or stop(n) else _behind(n)))
    weights = [w for w in (projection(n) or (_mha_weights(n) or [None])[-1] for n in met) if w is not None]
    params = [n for n in met if n.param is not None]
    return weights, [n.param for n in params if len(n.shape) == 1], [n.param for n in params if len(n.shape) > 1]


def _residual(node: Node) -> bool:
    """A residual sum x + f(x): two computed operands, one computed from the other."""
    if node.op not in ADDS or len(node.parents) != 2 or any(root(p).param is not None for p in node.parents):
        return False
    first, later = sorted(node.parents, key=lambda n: n.index)
    return any(n is first for n in walk([later], lambda n: n.parents if n.index > first.index else []))


def _stream_sum(node: Node) -> bool:
    """A sum of two computed tensors (a table's rows read by ids, W[ids], among them), not a projection's bias
    added (Falcon's) nor a number (a norm's eps)."""

    def computed(p: Node) -> bool:
        seen = walk([p], lambda n: n.parents[:1] if n.op in VIEWS else [])
        return root(p).param is None or any(n.op == "__getitem__" and np.ndim(n.value) > 1 for n in seen)

    two = len(node.parents) == 2 or node.value is None  # the stream may be a layer's input, never recorded
    return node.op in ADDS and two and all(map(computed, node.parents))


def _factor(node: Node) -> float | None:
    """The number `node` multiplies by (a division's: 1 / its number), else None (0 too)."""
    if node.op not in MULS | DIVS or not isinstance(node.value, (int, float)) or not node.value:
        return None
    return node.value if node.op in MULS else 1 / node.value


def scaled_by(node: Node) -> str | None:
    """How `node` scales by a number, in the user's words: "multiplied by c", or "divided by c" for a division by
    one; else None."""
    if _factor(node) is None:
        return None
    return f"divided by {node.value:.4g}" if node.op in DIVS else f"multiplied by {node.value:.4g}"


def _forward(start: Node) -> list:
    """From `start` forward through element-wise ops and views to the nearest products (Nodes)."""
    stops = PRODUCTS | {SDPA}
    return [n for n in walk(start.children, lambda n: [] if n.op in stops else n.children) if n.op in stops]


def terms(equation) -> tuple[list[str], str] | None:
    """An einsum equation's operand terms and its result term (implicit: "..." if any operand has it, then the
    letters met once, in alphabetical order); None for no equation (operands given with axis lists)."""
    inputs, arrow, result = equation.replace(" ", "").partition("->") if isinstance(equation, str) else ("", "", "")
    operands = inputs.split(",")
    if not inputs or not all(t.replace("...", "").isalpha() or t == "..." for t in operands):
        return None
    implicit = "..." * ("..." in inputs) + "".join(sorted(c for c in inputs if c.isalpha() and inputs.count(c) == 1))
    return operands, result if arrow else implicit


def _two(equation) -> tuple[str, str, str] | None:
    """A two-operand einsum's three terms (first, second, result), each of letters alone; None for any other."""
    found = terms(equation)
    if found is None or len(found[0]) != 2:
        return None
    (first, second), result = found
    return (first, second, result) if all(t.isalpha() for t in (first, second, result)) else None


def _keys_axis(softmax: Node, fed: Node | None) -> int | None:
    """The scores' axis holding the keys where an einsum says it: the axis the softmax normalises, if the einsum the
    probabilities feed sums it away (labml's "ijbh,jbhd->ibhd", softmax over j), else None."""
    dim = softmax.value
    match = _two(fed.extra) if fed is not None and fed.op == "einsum" and isinstance(dim, int) else None
    if fed is None or match is None or not isinstance(dim, int):
        return None
    held = [i for i, p in enumerate(fed.parents[:2]) if softmax in walk([p], _behind)]
    letters = match[held[0]] if len(held) == 1 else ""
    if len(letters) != len(softmax.shape) or not -len(letters) <= dim < len(letters):
        return None
    return dim % len(letters) if letters[dim] not in match[2] else None


def _query_first(product: Node, keys: int | None = None) -> list:
    """A scores product's two operands, the query's first (an einsum's: the one without the index at the scores'
    `keys` axis (_keys_axis); else the key the one alone holding the output's last index (an unfolded window's
    "bhtd,bhtdw->bhtw"); else the query the one holding the rows'; a baddbmm's the two after the tensor it adds,
    BLOOM's ALiBi, where that tensor was recorded)."""
    operands = [p for p in product.parents if p.param is None]
    operands = operands[int(product.op in ("baddbmm", "addmm") and len(operands) > 2) :]  # a zeros made unrecorded
    a, b = operands[:2] if len(operands) >= 2 else (None, None)
    match = _two(product.extra) if product.op == "einsum" else None
    if not match or len(match[2]) < 2:
        return [a, b]
    first, second, out = match
    if keys is not None and keys < len(out):
        return [b, a] if out[keys] in first and out[keys] not in second else [a, b]
    if (out[-1] in first) != (out[-1] in second):
        return [b, a] if out[-1] in first else [a, b]
    return [b, a] if out[-2] in second else [a, b]


@dataclass
class Attention:
    """One attention read from the flow: its projections' weights per role, the q/k norms, the head width."""

    module: str
    q: list
    k: list
    v: list
    out: list
    norms: dict  # 1-D parameter name -> "q" or "k"
    head_dim: int
    heads: int | None  # the query's head axis where it has one
    out_node: Node | None = None  # the output projection's op
    columns: dict = field(default_factory=dict)  # a fused weight -> {role: its features, in (head, feature) order}
    sinks: list = field(default_factory=list)  # GPT-OSS's sink logits: a 1-D parameter joined to the scores (cat)
    # or [SINK_AT_ZERO]: a 1 in the denominator (softmax-plus-one)
    window: int | None = None  # a sliding window its mask applies (Flow.width)
    causal_band: bool = False  # and no key after the query seen: a causal window
    blind: bool = False  # its mask hid every key on the recording: no band to read
    unprojected: dict = field(default_factory=dict)  # q, k or v of no projection -> the tensors it reads as they are
    mixed: set = field(default_factory=set)  # and the weights met past a sum (another attention's values mixed in)
    factor: float = 1.0  # the numbers the scores are multiplied (or divided) by on their way to the softmax
    turned: list = field(default_factory=list)  # the cos, sin or polar ops the queries are turned by (RoPE) in forward
    latent: list = field(default_factory=list)  # MLA's: kv down projection's weight, its norm's scale (and q's: V3's)
    tied: set = field(default_factory=set)  # weights q and k each read by a product of its own (W_q = W_k: a tie)


@dataclass
class Flow:
    """What the recorded forward says: roles, first uses, attentions, feed-forward blocks, position lookups."""

    nodes: list
    values: dict = field(default_factory=dict)  # node index -> the tensor it made
    order: dict = field(default_factory=dict)  # parameter name -> the index of its first use
    roles: dict = field(default_factory=dict)  # weight name -> q, k, v, out, gate, up, down, ffn_in, ffn_out
    attentions: list = field(default_factory=list)  # in the order they run
    blocks: list = field(default_factory=list)  # feed-forward blocks as they run: [in, out] or [gate, up, down]
    up_first: set = field(default_factory=set)  # fused gate-and-up projections whose first part is the up
    gate_up: dict = field(default_factory=dict)  # a fused gate-and-up weight -> {"gate", "up": its rows} (_halves)
    plus_one: set = field(default_factory=set)  # 1-D parameters read as 1 + weight (Gemma's norm scales)
    qk_norms: dict = field(default_factory=dict)  # norm scale name -> [(the q or k projection's weight, its role)]
    positions: dict = field(default_factory=dict)  # table -> c: looked up with c, c + 1, ..., c + T - 1
    constant_lookups: set = field(default_factory=set)  # tables looked up with one id everywhere (BERT's types)
    read_at: dict = field(default_factory=dict)  # table -> the ids of its first lookup (not its positions)
    lookups: set = field(default_factory=set)  # raw 2-D parameters indexed by rows and no product's weight: tables
    # a router's weight -> (its top-k node, its k gates renormalised, DeepSeek's router fields, its choice bias, the
    # top-k's over groups before the choice)
    routers: dict = field(default_factory=dict)
    picks_tokens: dict = field(default_factory=dict)  # a top-k along no router's axis -> (the weight it reads, outputs)
    calls: list = field(default_factory=list)  # each submodule's calls (Called), in the order they return
    owners: list = field(default_factory=list)  # the paths of the modules that hold parameters of their own
    aside: set = field(default_factory=set)  # projections of inputs no table's rows reach, where ids are read (_aside)
    beside: list = field(default_factory=list)  # parameters read where the judged output is not computed (_reaching)
    batch: tuple = ()  # (the probe's batch size, whether passed batch-first) where session.read_flow recorded it

    def _products(self, weight: str) -> list:  # the products that read `weight`
        return [n for n in self.nodes if projection(n) == weight]

    def axes(self, param: str) -> int:
        return next(len(n.shape) for n in self.nodes if n.param == param)

    def operand_width(self, weight: str) -> int:
        """The width of the input the first product reading `weight` multiplies it with."""
        return next(p.shape[-1] for p in self._products(weight)[0].parents if weight_of(p) is None)

    def weighed(self, weight: str) -> bool:
        """Whether what a product reading `weight` makes is multiplied (through views) by something a router's top-k
        chose: a routed expert's output by its gate, not a shared expert's, added as it is."""
        after = [c for n in self._products(weight) for c in walk(n.children, lambda c: c.children * (c.op in VIEWS))]
        chose = lambda n: [] if n.op in PRODUCTS or n.op == "topk" else n.parents  # noqa: E731
        gates = [p for c in after if c.op in MULS for p in c.parents]
        return any(n.op == "topk" for n in walk(gates, chose))

    def clamped(self, weight: str) -> float | None:
        """The bound the input of a product reading `weight` is clamped to on its way (GPT-OSS's clamped SwiGLU: its
        swiglu_limit, read from the op; inf where it bounds nothing above); None where it is not clamped."""
        uppers = [bounds(n)[1] for n in _activations(self._products(weight)[0]) if n.op.startswith("clamp")]
        return min(uppers) if uppers else None

    def picked_bias(self, weight: str) -> str | None:
        """The parameter (through views: its rows picked, or all of it broadcast) added to the products reading
        `weight` (a stacked expert's bias, in a loop over the experts or on all of them at once)."""
        sums = [n for n in self.nodes if n.op in ADDS and set(n.parents) & set(self._products(weight))]
        return next((root(p).param for n in sums for p in n.parents if root(p).param is not None), None)

    def heads(self, D: int | None) -> int | None:
        """The head count the first attention's query shows, else d_model `D` over its head width, else None."""
        heads = next((a.heads for a in self.attentions if a.heads), None)
        Dh = next((a.head_dim for a in self.attentions), None)
        return heads or (D // Dh if D and Dh and D % Dh == 0 else None)

    @property
    def _first_out(self) -> Node | None:  # the first attention's output projection op
        return next((a.out_node for a in self.attentions if a.out_node is not None), None)

    def _product(self, weight: str) -> Node | None:  # the first product that reads `weight`
        return next((n for n in self.nodes if projection(n) == weight), None)

    @property
    def norm_first(self) -> bool | None:
        """Pre-norm (True) or post-norm (False), read where the first attention's output joins the stream: the
        sum is read by the next residual sum too (pre-norm, x + f(Norm(x))), or only by the norm's own ops
        (post-norm, Norm(x + f(x))); None where no attention was read."""

        add = self._first_sum
        if add is None:
            return None
        readers = [n for n in walk(add.children, lambda n: n.children if n.op in VIEWS else []) if n.op not in VIEWS]
        # OPT reshapes it first; a block calling F.layer_norm itself: the next residual sum in the same module
        return len({n.module for n in readers}) > 1 or any(_stream_sum(n) for n in readers)

    @property
    def _first_sum(self) -> Node | None:
        """The sum the first attention's output joins the stream by."""
        out = self._first_out
        ahead = walk(out.children, lambda n: [] if _stream_sum(n) or n.op in PRODUCTS else n.children) if out else []
        return next((n for n in ahead if _stream_sum(n)), None)

    @property
    def stream_read(self) -> bool:
        """Whether the first attention's query reads the stream its output joins as it is: no norm before it in the
        first layer (ModernBERT's, whose embeddings are normed instead)."""
        add, q = self._first_sum, self._product(self.attentions[0].q[0]) if self.attentions else None
        x = next((p for p in q.parents if weight_of(p) is None), None) if q is not None else None
        return add is not None and x is not None and any(root(p) is root(x) for p in add.parents)

    @property
    def sandwich(self) -> bool:
        """Gemma's sandwich (OLMo 2's post-norms): the first attention's output is normalised (a root taken, or a
        norm op) before it joins the stream, a sum with another tensor (a bias or a number added is no join; the
        stream may be a layer's input, never recorded)."""
        out = self._first_out

        def joins(n: Node) -> bool:
            other = len(n.parents) == 2 or n.value is None
            return n.op in ADDS and other and not any(len(root(p).shape) == 1 for p in n.parents)

        ahead = walk(out.children, lambda n: [] if joins(n) or n.op in PRODUCTS else n.children) if out else []
        return any(n.op in ("rsqrt", "sqrt", "rms_norm", "layer_norm", "var", "std") for n in ahead)

    @property
    def parallel(self) -> bool:
        """The first feed-forward block does not read the first attention's output: both read the layer's input and
        their outputs are summed (GPT-J's, Phi-2's, GPT-NeoX's use_parallel_residual)."""
        out = self._first_out
        block = self._product(self.blocks[0][0]) if self.blocks else None
        if out is None or block is None:
            return False
        later = walk([out], lambda n: n.children if n.index < block.index else [])
        return block.index < out.index or all(n is not block for n in later)  # it ran before the output existed

    @property
    def shared_input(self) -> bool:
        """Whether the first feed-forward block and the first attention's query read one tensor (Phi-2's one norm)."""

        def read(weight: str) -> Node | None:
            node = self._product(weight)
            x = next((p for p in node.parents if weight_of(p) is None), None) if node is not None else None
            return root(x) if x is not None else None

        q = read(self.attentions[0].q[0])
        return q is not None and q is read(self.blocks[0][0])

    @property
    def softcaps(self) -> dict:
        """Gemma 2's soft caps, cap * tanh(x / cap) (x alone inside: a mistake, still the user's cap), the first of
        each kind: {"attn_softcap": cap} inside an attention (a softmax, or a product of no weight, follows before
        any projection), {"logit_softcap": cap} where no product follows (the logits')."""
        caps: dict = {}
        for node in self.nodes:  # cap * tanh(...): the tanh's output multiplied by a number (its input: any)
            outer = [c for c in node.children if c.op in MULS and isinstance(c.value, (int, float)) and c.value > 0]
            if node.op != "tanh" or len(node.parents) != 1 or not outer:
                continue
            cap = float(outer[0].value)
            ahead = list(walk(node.children, lambda n: [] if n.op in PRODUCTS | SOFTMAX else n.children))
            if any(n.op in SOFTMAX or n.op in PRODUCTS and projection(n) is None for n in ahead):
                caps.setdefault("attn_softcap", cap)
            elif not any(n.op in PRODUCTS for n in walk(node.children, lambda n: n.children)):
                caps.setdefault("logit_softcap", cap)
        return caps

    @property
    def window(self) -> int | None:
        """The sliding window of the attentions that have one (width), where they agree; else None."""
        widths = {a.window for a in self.attentions if a.window}
        return widths.pop() if len(widths) == 1 else None

    def width(self, node: Node) -> int | None:
        """The sliding window (Mistral's) the mask of a softmax or an attention op applies (keys_seen), read from the
        keys before each query (distance i - j >= 1, after a cache's S - T keys): W where those at distance 1 .. W - 1
        are seen and farther ones not, whatever the diagonal and the future (the causal mask's mistakes); 1 where each
        query sees itself alone; None where no earlier key is hidden (causality alone), or not so. Fewer columns S
        than queries T, query i seeing the last min(i + 1, S): each query's own window of S keys ending at itself
        (unfolded from keys padded on the left, Longformer's way): W = S."""
        seen = self.keys_seen(node)
        if seen is None:
            return None
        T, S = seen.shape
        if S < T:
            own = torch.arange(S)[None, :] >= S - 1 - torch.arange(T)[:, None]  # the padding's columns hidden
            return S if torch.equal(seen, own) else None
        distance = torch.arange(S - T, S)[:, None] - torch.arange(S)[None, :]  # query - key
        keys = seen.any(0)  # keys no query sees (padding, where a padding mask's polarity is flipped) left out
        seen, distance = (seen[:, keys], distance[:, keys]) if bool(keys.any()) else (seen, distance)
        past = distance >= 1
        if not bool((past & ~seen).any()):
            return None
        if not bool((past & seen).any()):  # no earlier key: itself alone, where the future is hidden
            return 1 if bool(seen[distance == 0].all()) and not bool(seen[distance < 0].any()) else None
        width = int(distance[seen & past].max()) + 1
        return width if torch.equal(seen[past], distance[past] < width) else None

    def keys_seen(self, node: Node) -> torch.Tensor | None:
        """The keys (T, S) each query of a softmax or an attention op sees in some sequence and head: a score above
        -1e3 (GPT-OSS's sink column left out); the op's mask (_attention_args), below the diagonal with is_causal."""
        scores = node.parents[0] if node.op in SOFTMAX and node.parents else None
        behind = walk([scores] if scores is not None else [], lambda n: n.parents[:1] if n.op in VIEWS | SUBS else [])
        joined = next((n for n in behind if n.op == "cat"), None)  # (GPT-OSS's, its row maximum taken off)
        scores = max(joined.parents, key=lambda n: n.shape[-1:]) if joined is not None and joined.parents else scores
        if scores is not None and scores.index in self.values:
            seen = self.values[scores.index].detach() > -1e3
            seen = self._in_sequence(node, seen) if seen.ndim > 4 else seen  # the positions cut in chunks
        elif node.op in MHA | {SDPA} and isinstance(node.value, tuple):
            _, mask, causal, T, S, *_ = node.value
            seen = torch.ones(T, S, dtype=torch.bool).tril() if causal else torch.ones(T, S, dtype=torch.bool)
            fits = isinstance(mask, torch.Tensor) and mask.ndim >= 2 and mask.shape[-2] in (1, T)
            if fits and mask.shape[-1] in (1, S):
                mask = mask.detach().cpu()  # a mask of another shape (a 1-D key padding): no band read
                seen = seen & (mask if mask.dtype == torch.bool else mask > -1e3)
        else:
            return None
        return seen.reshape(-1, *seen.shape[-2:]).any(0) if seen.ndim >= 2 else None

    def _in_sequence(self, node: Node, seen: torch.Tensor) -> torch.Tensor:
        """The (T, T) keys each query position sees, where the scores (..., W, S) of the softmax `node` hold the
        positions in chunks or blocks (Longformer's sliding chunks, block-local attention): each row of the scores'
        query and key operands found by value among the rows of the view that split their heads (..., T, H, Dh); a
        padding row (all zero) is no position. `seen` as it is where a row is found nowhere."""
        product = next((n for n in walk([node.parents[0]], _behind) if n.op in PRODUCTS), None)
        q, k = _query_first(product) if product is not None else (None, None)
        qv, kv = (self.values.get(t.index) if t is not None else None for t in (q, k))
        W, S = seen.shape[-2:]
        if qv is None or kv is None or qv.shape[:-1] != seen.shape[:-1]:
            return seen
        kv = kv.transpose(-1, -2) if kv.shape[:-2] == seen.shape[:-2] and kv.shape[-1] == S else kv  # k^T
        if kv.shape[:-1] != (*seen.shape[:-2], S):
            return seen
        (T, qp), (Tk, kp) = self._positions(q, qv), self._positions(k, kv)  # type: ignore[arg-type]
        if T != Tk or qp is None or kp is None:
            return seen
        qp, kp = qp.reshape(-1, W, 1).expand(-1, W, S), kp.reshape(-1, 1, S).expand(-1, W, S)
        hit = seen.reshape(-1, W, S) & (qp >= 0) & (kp >= 0)
        out = torch.zeros(T, T, dtype=torch.bool)
        out[qp[hit], kp[hit]] = True
        return out

    def _positions(self, t: Node, value: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """(T, the position of each row of `value`, -1 for a row of zeros) by value among the rows of the view
        that split `t`'s heads (..., T, H, Dh); (T, None) where a row is found nowhere."""
        split = _head_split(t, value.shape[-1])
        held = self.values.get(split.index) if split is not None else None
        if held is None:
            return 0, None
        T, Dh = held.shape[-3], held.shape[-1]
        table = {r.numpy().tobytes(): p for p in range(T) for r in held.detach().select(-3, p).reshape(-1, Dh).cpu()}
        rows = value.detach().reshape(-1, Dh).cpu()
        found = [table.get(r.numpy().tobytes(), -1 if not r.any() else None) for r in rows]
        return T, None if None in found else torch.tensor(found, dtype=torch.long)

    @property
    def output_scale(self) -> float | None:
        """The number the logits (the last projection's) are multiplied by, no soft cap after (Cohere's logit_scale)."""
        head = next((n for n in reversed(self.nodes) if projection(n)), None)
        if head is None or any(n.op == "tanh" for n in walk(head.children, lambda n: n.children)):
            return None
        after = walk(head.children, lambda n: n.children if n.op in VIEWS else [])
        by = next((f for n in after if (f := _factor(n)) is not None), None)
        return None if by is None else float(by)

    @property
    def position_scale(self) -> float | None:
        """The number positions (an arange) are divided by on their way to a cos or sin (RoPE's linear scaling, as
        transformers' LlamaLinearScalingRotaryEmbedding: t / factor); None where there is none."""
        onward = VIEWS | MULS | {"outer", "einsum", "matmul", "__matmul__", "cat", "stack", "repeat_interleave"}
        for node in (n for n in self.nodes if (_factor(n) or 0) > 0):  # a positive number
            arange = any(n.op == "arange" for n in walk(node.parents, lambda n: n.parents if n.op in VIEWS else []))
            ahead = walk(node.children, lambda n: n.children if n.op in onward else [])  # as angles, not exp's input
            if arange and any(n.op in ("cos", "sin") for n in ahead):
                return 1 / node.value if node.op in MULS else float(node.value)
        return None

    @property
    def activations(self) -> set:
        """The ops of the activations met back from each feed-forward block's last projection."""
        return {n.op for b in self.blocks for p in self._products(b[-1])[:1] for n in _activations(p)}

    def added(self, param: str) -> bool:
        """Whether the forward first combines the kept table `param` (seen through views) with sums only: positions
        added to the stream, not RoPE's tables, which multiply q and k."""
        return summed([n for n in self.nodes if n.param == param])

    @property
    def repeated(self) -> bool:
        """Whether an attention's queries come from a projection an earlier attention's came from: the same weights
        run again (a looped or ALBERT-style stack; or a call= running the model once per sequence)."""
        earlier = lambda i: {q for b in self.attentions[:i] for q in b.q}  # noqa: E731
        return any(a.q and set(a.q) <= earlier(i) for i, a in enumerate(self.attentions))

    def uses(self, param: str) -> list:
        """The ops that read `param` (seen through views), in the order they ran: one a call of a norm's scale."""
        return [n for n in self.nodes if n.op not in VIEWS and any(root(p).param == param for p in n.parents)]

    def computed_from_projections(self, param: str) -> bool:
        """Whether `param`'s first use reads what projections made (a final norm), not tables only (an embedding's)."""
        index = self.order.get(param)
        return index is not None and bool(back(self.nodes[index])[0])


def read(nodes: list, values: dict) -> Flow:
    """The Flow of recorded Nodes and the tensors they made (see the module docstring)."""
    flow = Flow(nodes, values)
    _uses(flow)
    found = [(a, node) for node in nodes if (a := _attention(node)) is not None]
    for a, node in found:
        a.window = flow.width(node)
        seen = flow.keys_seen(node)
        a.causal_band = bool(a.window and seen is not None and not seen.triu(1).any())
        a.blind = seen is not None and not bool(seen.any())
        a.sinks = a.sinks or [SINK_AT_ZERO] * _sink_at_zero(node, values)
    flow.attentions = _heads_merged([a for a, _ in found])
    for a in flow.attentions:
        down = {"k": a.latent[:1], "q": a.latent[2:3]}  # MLA's down projections
        for role in ("q", "k", "v", "out"):  # a fused projection: its first role
            flow.roles |= {w: role for w in getattr(a, role) + down.get(role, []) if w not in flow.roles}
        for scale, role in a.norms.items():
            flow.qk_norms[scale] = [(w, role) for w in getattr(a, role)[:1]]
    topks: dict = {}  # a router: one projection's outputs, maybe softmaxed, top-k'd (its last top-k the choice)
    for node in (n for n in nodes if n.op == "topk"):
        met = list(walk([node], lambda n: [] if projection(n) else _behind(n, True)))
        weights = {projection(n) for n in met} - {None}
        if len(weights) == 1:
            topks.setdefault(weights.pop(), []).append((node, met))
    for weight, found in topks.items():
        node, met = found[-1]
        outputs = next(n for n in met if projection(n)).shape[-1]  # a router's: one score per expert
        if node.value is not None and node.parents[0].shape[node.value] != outputs:  # each expert its tokens (expert
            flow.picks_tokens[node] = (weight, outputs)  # choice), or tokens past a block (mixture of depths)
            continue
        limits = [n for n, _ in found[:-1]]
        flow.routers[weight] = (node, *_router(node, met, limits), limits)
    _feed_forwards(flow)
    return flow


def _router(node: Node, met: list, limits: list) -> tuple[bool, dict, str | None]:
    """(whether the k gates are renormalised to sum to 1, DeepSeek's router fields, its choice bias) of the router
    whose choice is the top-k `node` (`met`: the ops back to its projection; `limits`: the top-k's before it, over
    groups). Renormalised: a softmax after the top-k, or the gates divided by a tensor (their sum) on their way to the
    experts. A sigmoid scores (V3's); a 1-D tensor added before the choice biases it only; groups: a top-2 over
    (N, G, E/G), then a top-k of the G groups' sums; the numbers the gates are multiplied by: routed_scaling."""
    stop = lambda n: [] if n.op in PRODUCTS or any(projection(p) for p in n.parents) else n.children  # noqa: E731
    path = list(walk(node.children, stop))  # to the experts' outputs the gates multiply
    divided = any(n.op in DIVS and _factor(n) is None for n in path)
    sigmoid = any(n.op == "sigmoid" for n in met)
    renorm = not sigmoid and not any(n.op in SOFTMAX for n in met) or divided
    bias = next((n.param for n in met if n.param is not None and len(n.shape) == 1), None)
    grouped = len(limits) == 2 and len(limits[0].parents[0].shape) == 3 and limits[0].shape[-1] == 2
    scaling = float(np.prod([f for n in path if (f := _factor(n)) is not None]))
    if not (sigmoid or bias or grouped or scaling != 1):
        return renorm, {}, None
    fields = dict(router_scoring="sigmoid" if sigmoid else "softmax", router_score_bias=bias is not None)
    fields["routed_scaling"] = scaling
    if grouped:
        fields |= {"router_groups": limits[0].parents[0].shape[-2], "router_topk_groups": limits[1].shape[-1]}
    return renorm, fields, bias


def _heads_merged(attentions: list) -> list:
    """One Attention per output projection op: modules per head merged as they ran; a softmax seen twice, once."""
    merged: list = []
    for a in attentions:
        last = merged[-1] if merged else None
        if last is None or a.out_node is None or a.out_node is not last.out_node:
            merged.append(a)
        elif not set(a.q) <= set(last.q):  # else the same scores read twice (a softmax by hand: exp(s) / exp(s).sum())
            last.q, last.k, last.v = last.q + a.q, last.k + a.k, last.v + a.v
            last.norms |= a.norms
            last.heads = len(last.q)
    return merged


def summed(starts: list) -> bool:
    """Whether what `starts` make (seen through views) is first combined with sums only: a table added to the
    stream, not concatenated to it (prompt tuning's virtual tokens) nor multiplying it (RoPE's)."""
    ahead = walk(starts, lambda n: n.children if n.op in VIEWS or n.param or n in starts else [])
    met = [n for n in ahead if n.op not in VIEWS and n.param is None and n not in starts]
    return bool(met) and all(n.op in ADDS for n in met)


def _uses(flow: Flow) -> None:
    """Each parameter's first use (through views), and the tables looked up: with positions, with one id, or (a raw
    parameter indexed, P[ids], P[:T] or F.embedding(ids, P), and no product's weight) with any ids."""
    indexed: set = set()  # P[ids]
    embedded: set = set()  # F.embedding(ids, P)
    for node in flow.nodes:
        for seen in map(root, node.parents):
            if seen.param is not None and seen.param not in flow.order:
                flow.order[seen.param] = node.index
                if node.op in ADDS and node.value == 1 and len(seen.shape) == 1:
                    flow.plus_one.add(seen.param)
        lookup = node.op in ("embedding", "__getitem__") and isinstance(node.value, np.ndarray) and node.parents
        lookup = lookup and not picked(node)  # an expert's bias is no table
        table = weight_of(node.parents[0 if node.op == "__getitem__" else -1]) if lookup else None
        if table is not None:
            (indexed if node.op == "__getitem__" else embedded).add(table)
            offset = _position_offset(node.value)
            if offset is not None and summed([node]):  # rows concatenated ahead of the tokens: no positions
                flow.positions.setdefault(table, offset)
            elif np.all(node.value == node.value.flat[0]) and (
                node.value.size > 1 or root(node.parents[0]).shape[0] < 2
            ):
                flow.constant_lookups.add(table)  # one id everywhere; a one-row table's row read by any id
            else:
                flow.read_at.setdefault(table, node.value)
    weights = {projection(n) for n in flow.nodes}  # an indexed weight (a fused one's rows) is no table
    for table in indexed & weights:
        flow.positions.pop(table, None)
        flow.constant_lookups.discard(table)
    flow.lookups = (indexed - weights) | embedded  # F.embedding's table read by a product too: a head tied to it
    for table in _added_whole(flow) - weights - flow.lookups:  # read at 0 .. T - 1 by adding it: positions
        flow.positions.setdefault(table, 0)
        flow.lookups.add(table)


def _added_whole(flow: Flow) -> set:
    """The parameters of two axes over 1, (T, D) or (1, T, D), added whole to the rows of a table read by ids (B, T,
    D), one row to each position: a board's 64 squares' table (`x + self.square_table`), read as positions 0 ..
    T - 1 though no arange looks it up."""
    found = set()
    for node in (n for n in flow.nodes if n.op in ADDS and len(n.parents) == 2 and len(n.shape) == 3):
        for table, other in (node.parents, node.parents[::-1]):
            seen, met = root(table), list(walk([other], _behind))
            whole = seen.param is not None and seen.shape[-2:] == node.shape[-2:] and math.prod(seen.shape[:-2]) == 1
            looked = any(n.op in ("embedding", "__getitem__") and np.ndim(n.value) == 2 for n in met)
            if whole and looked and not any(map(projection, met)) and seen.shape[-2] > 2:
                found.add(seen.param)
    return found


def _attention_args(name: str, args: tuple, kwargs: dict):
    """(head count or None, mask (True or above -1e3 where a key is seen), is_causal, the queries' and the keys'
    lengths, the scale on the scores where given) of nn.MultiheadAttention's op (query, key, value, embed_dim,
    num_heads, ...; sequence-first) or of scaled_dot_product_attention (query, key, value, attn_mask, dropout_p,
    is_causal, scale)."""
    if name in MHA:  # its attn_mask True where hidden: turned to True where seen
        mask = kwargs.get("attn_mask", args[16] if name == "multi_head_attention_forward" and len(args) > 16 else None)
        seen = ~mask if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool else mask
        return args[4], seen, False, args[0].shape[0], args[1].shape[0], None
    given = dict(zip(("attn_mask", "dropout_p", "is_causal", "scale"), args[3:7], strict=False)) | kwargs
    causal, scale = bool(given.get("is_causal", False)), given.get("scale")
    return None, given.get("attn_mask"), causal, args[0].shape[-2], args[1].shape[-2], scale


def _rows_read(index, shape: tuple) -> np.ndarray | None:
    """The rows of a parameter an index reads whole: ids (an integer tensor), or 0 .. T - 1 for [:T] (a slice of
    the first axis, or of the first axis after leading singleton axes: P[:, :T] of a (1, T_max, D) table); None
    for any other index; [0] for P[0] of a one-row table (a token-type table of type_vocab_size 1)."""
    if type(index) is int and index in (0, -1) and shape[0] == 1:
        return np.zeros(1, dtype=np.int64)
    if isinstance(index, tuple):  # leading axes of size 1 read whole (: or 0), the rows, the rest whole
        whole = [isinstance(i, slice) and i == slice(None) for i in index]
        lead = next((k for k, i in enumerate(index) if not whole[k] and not (type(i) is int and i == 0)), len(index))
        if lead >= min(len(index), len(shape)) or any(n != 1 for n in shape[:lead]) or not all(whole[lead + 1 :]):
            return None
        index = index[lead]
    if isinstance(index, torch.Tensor) and not index.is_floating_point() and index.dtype != torch.bool:
        return index.detach().cpu().numpy()
    if isinstance(index, slice) and index.step in (None, 1) and isinstance(index.stop, int):
        return np.arange(index.start or 0, index.stop)
    return None


def _mha_weights(node: Node) -> list:
    """nn.MultiheadAttention's op's weights (in_proj_weight or q, k, v, then out_proj.weight), by argument if read."""
    if node.op not in MHA:
        return []
    inputs = ("q_proj", "k_proj", "v_proj") if "q_proj_weight" in node.named else ("in_proj",)  # separate: those
    named = [node.named.get(f"{a}_weight") for a in (*inputs, "out_proj")]
    return [w for w in named if w is not None] or [w for w in map(weight_of, node.parents) if w is not None]


def _attention(node: Node) -> Attention | None:
    """The attention whose softmax, scaled_dot_product_attention or nn.MultiheadAttention op `node` is, else None."""
    weights = _mha_weights(node)
    if len(weights) in (2, 4):  # fused q, k, v and out; or q, k, v and out
        *qkv, out = weights
        q, k, v = qkv * 3 if len(qkv) == 1 else qkv
        return Attention(node.module, [q], [k], [v], [out], {}, 0, node.value[0], node)  # type: ignore[index]
    if node.op == SDPA and len(node.parents) >= 3:
        (q, k, v), fed = node.parents[:3], node
    elif node.op in SOFTMAX and node.parents:
        # the scores: the nearest product behind the softmax, one without parameters; q and k its operands
        scores = next((n for n in walk([node.parents[0]], _behind) if n.op in PRODUCTS), None)
        fed = next(iter(_forward(node)), None)  # the product the probabilities feed
        keys = _keys_axis(node, fed)
        q, k = _query_first(scores, keys) if scores is not None and not projection(scores) else (None, None)
        # v: its operand not computed from the probabilities (dropped out or masked) through element-wise ops
        v = next((p for p in fed.parents if p.param is None and node not in walk([p], _behind)), None) if fed else None
        if q is None or k is None or v is None:
            return None
    else:
        return None
    (qw, qs, qr), (kw, ks, kr), (vw, _, vr) = back(q, False), back(k, False), back(v, False)  # within the layer
    latent = _latent(k, kw)
    latent += _latent(q, qw, shared=False) if latent else []  # DeepSeek-V3's low-rank queries
    if latent and latent[0] not in kw:  # the paper's W_UQ and W_QR, W_UK and W_KR: the rotary ones last, as turned
        qw, kw = sorted(qw, key=lambda w: _turned(q, w)), sorted(kw, key=lambda w: _turned(k, w))
    outs = [n for n in _forward(fed) if projection(n) is not None][:1]
    norms = dict.fromkeys(qs, "q") | dict.fromkeys(ks, "k")
    heads = _heads(q, node)
    out = [projection(n) for n in outs]
    kw = [w for w in kw if w not in latent]  # MLA's: its up projection (kv_b_proj), keys and values
    found = Attention(node.module, qw, kw, vw, out, norms, q.shape[-1] if q.shape else 0, heads, *outs, latent=latent)
    found.unprojected = {r: read for r, w, read in (("q", qw, qr), ("k", kw, kr), ("v", vw, vr)) if not w}
    found.mixed = {w for t, r in ((q, qw), (k, kw), (v, vw)) if not r for w in back(t)[0]}
    found.turned = [n for n in walk([q], lambda n: [] if n.op in PRODUCTS else n.parents) if n.op in TURNS]
    if node.op in SOFTMAX and node.parents:  # a sink per head: a column joined to the scores, or to their logsumexp
        behind = list(walk([node.parents[0]], _behind))
        if any(n.op in ("cat", "logaddexp") for n in behind):
            found.sinks = [n.param for n in behind if n.param is not None and len(n.shape) == 1]
        scaled = [n for n in behind if _factor(n) is not None and any(m.op in PRODUCTS for m in walk([n], _behind))]
        found.factor = float(np.prod([_factor(n) for n in scaled]))  # on the scores' path, not a term's (T5's log)
    elif node.op == SDPA and isinstance(node.value, tuple):  # its scale, given or 1 / sqrt(Dh)
        found.factor = float(node.value[5] if node.value[5] is not None else q.shape[-1] ** -0.5)
    found.tied = _tied(q, k, set(qw) & set(kw))
    for w in {w for w in qw + kw + vw if (qw + kw + vw).count(w) > 1} - found.tied:  # a fused one: its layout read
        found.columns[w] = columns_held(w, {"q": q, "k": k, "v": v})
    return found


def _tied(q: Node, k: Node, weights: set) -> set:
    """Those of `weights` the queries and the keys each reach by a product of their own that reads all of it: one
    tensor projecting the input twice (PCT's q_conv and k_conv, W_q = W_k), a tie, not a fused projection whose rows
    the two split (in one product, or each its chunk)."""
    nearest = lambda n: [] if projection(n) else _behind(n)  # noqa: E731
    ends = lambda t: {n.index: n for n in walk([t], nearest) if projection(n) in weights}  # noqa: E731
    at_q, at_k = ends(q), ends(k)
    whole = lambda n: all(np.prod(p.shape) == np.prod(root(p).shape) for p in n.parents if weight_of(p))  # noqa: E731
    return weights - {projection(n) for i, n in (at_q | at_k).items() if i in at_q.keys() & at_k.keys() or not whole(n)}


def _heads(q: Node, node: Node) -> int | None:
    """The query's head count: the axis beside the query positions of the softmax (or SDPA) `node`, (B, H, T, Dh)
    or einsum's (B, T, H, Dh); where the positions are cut into chunks or blocks (more axes: (B, H, n, W, Dh)), the
    axis its features are split into (_head_split)."""
    split = _head_split(q) if len(q.shape) > 4 else None
    if split is not None:
        return split.shape[-2]
    T = node.shape[-2] if len(node.shape) >= 2 else None
    before, at = q.shape[-3:-1] if len(q.shape) >= 4 else (None, None)  # (H, T), or einsum's (T, H)
    return before if at == T else at if before == T else None


def _head_split(t: Node, Dh: int = 0) -> Node | None:
    """The nearest view behind `t` that splits its features into heads: (..., H * Dh) as (..., H, Dh), or as
    (..., H, 3 Dh) of a fused layout, Dh the last axis of `t` unless given; None where none does."""
    Dh = Dh or (t.shape[-1] if t.shape else 0)
    for n in walk([t], _behind):
        into, whole = n.shape, n.parents[0].shape if n.op in VIEWS and n.parents else ()
        if len(into) >= 2 and whole and into[:-2] == whole[:-1] and into[-2] * into[-1] == whole[-1] != into[-1]:
            if Dh and into[-1] % Dh == 0:
                return n
    return None


def _sink_at_zero(node: Node, values: dict) -> bool:
    """A sink logit of 0 in the softmax `node`: a column of zeros joined to its scores at either end (cat, F.pad),
    or a 1 beside the sum of its exps in their denominator (_plus_one)."""
    joined = node.parents[0] if node.op in SOFTMAX and node.parents else None
    if node.op == "exp" or joined is None or joined.op not in ("cat", "pad") or joined.index not in values:
        return node.op == "exp" and _plus_one(node)
    scores = max(joined.parents, key=lambda p: p.shape[-1] if p.shape else 0)
    held = values[joined.index].detach()
    return joined.shape[-1:] == (scores.shape[-1] + 1,) and any(bool((held[..., i] == 0).all()) for i in (0, -1))


def _plus_one(node: Node) -> bool:
    """exp(s) / (1 + sum exp(s)), or exp(s - m) / (exp(-m) + sum exp(s - m)): a 1 (exp(0), in units of the shift m)
    added to the sum of the exp `node` in its denominator: GPT-OSS's sink at logit 0."""
    shift = node.parents[0].parents[1:] if node.parents and node.parents[0].op in ("sub", "__sub__") else []
    for add in (a for t in node.children if t.op == "sum" for a in t.children if a.op in ADDS):
        other = [p for p in add.parents if p.op != "sum"]
        if not other and add.value == 1.0 or other and other[0].op == "exp" and _negated(other[0]) == shift:
            return True
    return False


def _negated(node: Node) -> list:
    """[x] of exp(-x), else []."""
    return node.parents[0].parents if node.parents and node.parents[0].op in ("neg", "__neg__") else []


def _latent(start: Node, ws: list, shared: bool = True) -> list:
    """[down projection, norm scale] of multi-head latent attention: a key (or query) projection of `ws` reads the
    normed output of another, which (`shared`) also gives the keys their shared rotary part, or beside which a second
    key projection gives it: DeepSeek's kv_b_proj on kv_a_proj's latent, the paper's W_UK on W_DKV's beside W_KR
    (V3's q_b_proj on q_a_proj's, not `shared`); else []."""
    for node in walk([start], _behind):
        x = next((p for p in node.parents if weight_of(p) is None), None) if projection(node) in ws else None
        weights, scales, _ = back(x, False) if x is not None else ([], [], [])
        if len(weights) == len(scales) == 1 and (weights[0] in ws or not shared or len(ws) == 2):
            return [weights[0], scales[0]]
    return []


def _turned(start: Node, weight: str) -> bool:
    """True where `weight`'s projection reaches `start` through a product with a rotary table (cos, sin or polar
    behind its other operand): RoPE turns that projection's output."""
    behind = {id(n): n for n in walk([start], _behind)}
    ahead = lambda n: [c for c in n.children if id(c) in behind]  # noqa: E731
    on_way = (n for p in behind.values() if projection(p) == weight for n in walk([p], ahead))
    tables = lambda n: any(m.op in TURNS for p in n.parents for m in walk([p], _through_views))  # noqa: E731
    return any(n.op in MULS and tables(n) for n in on_way)


def columns_held(weight: str, operands: dict) -> dict:
    """{role: the output features of `weight`'s projection that role's operand holds, in its (head, feature)
    order}: the views and splits between the projection and each operand (view(B, T, H, 3 Dh), chunk, ...)
    replayed on the outputs' indices (token * C + feature), read at the first token. GPT-NeoX's per-head q, k, v
    rows and the usual q | k | v blocks alike. A role whose operand is not reached through views alone is left out."""
    product = next((n for op in operands.values() for n in walk([op], _behind) if projection(n) == weight), None)
    if product is None or not product.shape:
        return {}
    C = product.shape[-1]
    replayed = {product.tid: torch.arange(int(np.prod(product.shape))).reshape(product.shape)}  # token * C + feature
    for node in walk(product.children, lambda n: n.children if n.op in VIEWS else []):
        parent = node.parents[0]
        if node.op not in VIEWS or parent.tid not in replayed:
            continue
        try:  # a part of a chunk or split (no call): its parent replayed gave the parts
            replayed[node.tid] = _replay(node, replayed) if node.call else replayed[parent.tid][node.value]
        except Exception:  # a view that does not replay on indices: the usual layout is kept
            continue
    met = {r: {id(n): n for n in walk([op], _behind) if n.tid in replayed} for r, op in operands.items()}
    out = {}
    for role, nodes in met.items():  # the role's own tensor: the earliest met by it alone (a split's part)
        own = [n for key, n in nodes.items() if all(key not in met[r] for r in met if r != role)]
        codes = replayed[min(own, key=lambda n: n.index).tid] if own else None
        if isinstance(codes, torch.Tensor):  # the first token's features; expanded k/v heads': each once
            out[role] = list(dict.fromkeys(codes[codes < C].tolist()))
    return out


def _replay(node: Node, replayed: dict):
    """`node`'s view applied to the replayed indices of its inputs."""
    func, args, kwargs = node.call  # type: ignore[misc]
    swap = {tid: t for tid, t in replayed.items() if isinstance(t, torch.Tensor)}
    args, kwargs = tree_map(lambda a: swap.get(id(a), a) if isinstance(a, torch.Tensor) else a, (args, kwargs))
    return func(*args, **kwargs)


def _feed_forwards(flow: Flow) -> None:
    """The feed-forward blocks (the module docstring's): plain (ffn_in, ffn_out) or gated (gate, up, down); none of
    the projections aside from the stream (_aside)."""
    flow.aside = _aside(flow)
    for node in flow.nodes:
        w = projection(node)
        operand = next((p for p in node.parents if weight_of(p) is None and p.param is None), None)
        if w is None or w in flow.roles or w in flow.routers or operand is None or w in flow.aside:
            continue
        acted = {projection(n) for n in walk(_activations(node), _behind)}  # those an activation reads, on the way
        shared = {i for i in acted if flow.roles.get(i) in ("q", "k", "v")}  # PaLM's: q, k, v, and the block's in
        ins = [i for i in dict.fromkeys(back(operand)[0]) if flow.roles.get(i, "ffn_out") == "ffn_out" or i in shared]
        ins = [i for i in ins if i not in flow.routers]  # a router's scores reach the next block only as gates
        if len(ins) == 1 and flow.roles.get(ins[0]) != "ffn_out" and ins[0] in acted:
            flow.roles |= {w: "ffn_out"} | ({} if ins[0] in shared else {ins[0]: "ffn_in"})
            width = next(n.shape[-1] for n in flow.nodes if projection(n) == ins[0])
            held = sum(len(c) for a in flow.attentions for c in a.columns.get(ins[0], {}).values())
            fused = width - held == 2 * operand.shape[-1]  # Phi-3's gate_up_proj (PaLM's: after q, k and v)
            flow.blocks.append([ins[0], ins[0], w] if fused else [ins[0], w])
            if fused and _gate_part(node) == 1:
                flow.up_first.add(ins[0])
            flow.gate_up |= {ins[0]: _halves(node, ins[0])} if fused else {}
        elif len(ins) == 2 and (gate := _gate(node, ins, acted)):
            up = next(i for i in ins if i != gate)
            flow.roles |= {gate: "gate", up: "up", w: "down"}
            flow.blocks.append([gate, up, w])


def _aside(flow: Flow) -> set:
    """Where the ids are read through tables, the weights of the projections no table's rows reach: those of an input
    beside the ids (a diffusion model's noise level embedded by an MLP, image features projected, a style vector),
    which condition the stream rather than compute it."""
    reached = stream(flow.nodes)
    return {w for n in flow.nodes if (w := projection(n)) and reached and id(n) not in reached}


def stream(nodes: list) -> set:
    """The ids of the nodes a table lookup's rows reach (the ids' stream); empty where no table is read."""
    return {id(n) for n in walk([n for n in nodes if n.op == "embedding"], lambda n: n.children)}


def _halves(product: Node, weight: str) -> dict:
    """The rows of a fused gate-and-up `weight` each part takes (columns_held), read back from the down projection
    `product`: the gate's those its activation reads, the up's the other factor of the product they meet in (halves,
    or rows interleaved one by one: [..., ::2] and [..., 1::2]); {} where that is not read."""
    act = next(iter(_activations(product)), None)
    operands = [p for p in product.parents if p.param is None and weight_of(p) is None]
    mul = next((n for n in walk(operands, _behind) if n.op in MULS and len(n.parents) == 2), None)
    if act is None or mul is None:
        return {}
    up = [p for p in mul.parents if all(n is not act for n in walk([p], _behind))]
    return columns_held(weight, {"gate": act, "up": up[0]}) if len(up) == 1 else {}


def _activations(product: Node) -> list:
    """The activations on the way back from `product`'s computed operands (not a parameter or a view of one)."""
    operands = [p for p in product.parents if p.param is None and weight_of(p) is None]
    return [n for n in walk(operands, _behind) if n.op in ACTIVATIONS]


def _gate(product: Node, ins: list, acted: set) -> str | None:
    """Of the two inputs `ins` of a gated block whose down projection is `product`, the gate: the one an activation
    reads on the way (`acted`); where both are (GPT-OSS's SwiGLU clamps its gate and its up), the one an activation
    other than a clamp reads; None where that is not one."""
    gates = [i for i in ins if i in acted]
    if len(gates) == 2:
        bends = [n for n in _activations(product) if n.op not in ("clamp", "clamp_min", "hardtanh")]
        gates = [i for i in ins if i in {projection(n) for n in walk(bends, _behind)}]
    return gates[0] if len(gates) == 1 else None


def _gate_part(product: Node) -> int:
    """The part of a fused gate-and-up the activation before `product` reads: its chunk's index (0: the gate)."""
    walks = (walk([act], _behind) for act in _activations(product))
    return next((n.value for walk in walks for n in walk if n.op in SPLITS and isinstance(n.value, int)), 0)


def _position_offset(values: np.ndarray) -> int | None:
    """c where the ids are c, c + 1, ..., c + T - 1 along the positions, batch-first or sequence-first (T > 2, c
    >= 0: 0 for most tables, 2 for BART's); None for any other ids."""
    v = values.reshape([s for s in values.shape if s > 1] or [1])
    for w in (v, v.T) if v.ndim == 2 else (v,):  # positions along the last axis, or along the first
        if w.shape[-1] > 2 and w.min() >= 0 and np.all(w == np.arange(w.shape[-1]) + w.flat[0]):
            return int(w.flat[0])
    return None


def bounds(node: Node) -> tuple:
    """(lower, upper) a clamp, clip or hardtanh call limits to; -inf / inf where it sets none (or a tensor)."""
    _, args, kwargs = node.call or (None, (), {})
    op = node.op.rstrip("_")
    positional = {"clamp_min": ["min"], "clamp_max": ["max"]}.get(op, ["min", "max"])
    named = dict(zip(positional, args[1:], strict=False))
    named |= {k.removesuffix("_val"): v for k, v in kwargs.items()}  # hardtanh's min_val, max_val
    one = lambda b: isinstance(b, (int, float)) or isinstance(b, torch.Tensor) and b.numel() == 1  # noqa: E731
    return tuple(float(named[k]) if one(named.get(k)) else sign * math.inf for k, sign in (("min", -1), ("max", 1)))


def turned_features(flow: Flow, Dh: int) -> list | None:
    """The features of each head the rotary tables multiply where they multiply one slice of the Dh a head holds (a
    partial rotary: x[..., :R] * cos, or x[..., Dh - R:]): the slice's view replayed on the feature indices; None
    where no table multiplies such a slice, or they multiply several (x[..., ::2] and x[..., 1::2]: pairs)."""
    slices = {tuple(s) for s in _sliced(flow, Dh)}
    return list(slices.pop()) if len(slices) == 1 else None


def _sliced(flow: Flow, Dh: int) -> Iterator[list]:
    """The features of each slice of a head's Dh a rotary table multiplies (turned_features)."""
    for node in (n for n in flow.nodes if n.op in MULS and len(n.parents) == 2):
        tables = [p for p in node.parents if any(m.op in TURNS for m in walk([p], _through_views))]
        part = next((p for p in node.parents if p not in tables and p.op in VIEWS and p.call and p.parents), None)
        if not tables or part is None or not part.parents[0].shape or part.shape[-1] >= Dh:
            continue
        whole = part.parents[0]
        try:  # the view replayed on each feature's index
            read = _replay(part, {whole.tid: torch.arange(Dh).expand(whole.shape)}) if whole.shape[-1] == Dh else None
        except Exception:  # a view that does not replay on indices
            read = None
        if isinstance(read, torch.Tensor) and read.shape[-1] == part.shape[-1]:
            yield read.reshape(-1, read.shape[-1])[0].tolist()


def _through_views(node: Node) -> list:
    """Back from a view to what it shows."""
    return node.parents if node.op in VIEWS else []
