"""How the judge runs the user's module and measures it: copies whose closures run the copy, the float32 islands of a
float64 copy (found, and run in float64), the model's own output head, the positions its output holds, and rows of
errors against bars."""

from __future__ import annotations

import copy
import functools
import itertools
import math
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parametrize
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from parity_tests.components import BAR, relative_errors

from .dataflow import ADDS, MULS, PRODUCTS, VIEWS, hooked
from .report import FLOAT32_FLOOR, FLOAT32_RATIO, Row


def positions_held(ref_shape: tuple, shape: tuple):
    """The reference output's positions the user's output holds: all (None), or the last (a slice, or -1 with that
    axis dropped: nanoGPT's `forward(idx)` without targets); False when the shapes do not correspond."""
    if tuple(shape) == tuple(ref_shape):
        return None
    if len(ref_shape) != 3 or ref_shape[1] < 2:
        return False
    B, _, V = ref_shape
    return {(B, 1, V): slice(-1, None), (B, V): -1}.get(tuple(shape), False)


def rows(groups: list, dtype, own: dict | None = None, vacuous: bool = True, coarser: float = 1.0) -> list:
    """The Rows of each group (name -> (the module's, the reference's), relative errors measured together) in `dtype`
    against BAR[dtype], or FLOAT32_RATIO x `own` (own_errors) x `coarser` (COARSER: a run in bfloat16), at least
    FLOAT32_FLOOR. A gradient zero on both sides is said so; with `vacuous`, every gradient of the module zero is a
    failing row (check.pair's cases need none)."""
    label, found = np.dtype(dtype).name, []
    for group in groups:
        for n, (_, e) in relative_errors(group, dtype).items():
            zero = n.startswith("d") and not np.any(group[n][0]) and not np.any(group[n][1])
            bar = BAR[np.dtype(dtype)] if own is None else max(FLOAT32_FLOOR, FLOAT32_RATIO * own[n] * coarser)
            found.append(Row(n, label, e, bar, "all zero" if zero else "", own=None if own is None else own[n]))
    grads = [mine for group in groups for n, (mine, _) in group.items() if n.startswith("d")]
    if vacuous and grads and not any(np.any(g) for g in grads):
        found.append(Row("(every gradient is zero: vacuous)", label, math.inf, 0.0))
    return found


def own_errors(ref32: dict, ref64: dict) -> dict:
    """name -> the reference's own float32 error: its float32 run against its float64 run, the float32 bars' basis."""
    return {n: e for n, (_, e) in relative_errors({n: (ref32[n], ref64[n]) for n in ref32}, np.float32).items()}


def reference_rows(mine: dict, reference, dtype, vacuous: bool = True) -> list:
    """rows of `mine` (name -> the module's tensor) against `reference(dtype)`; in float32 on own_errors' bars."""
    ref = reference(dtype)
    own = own_errors({n: ref[n] for n in mine}, reference(np.float64)) if dtype == np.float32 else None
    return rows([{n: (mine[n], ref[n]) for n in mine}], dtype, own, vacuous)


def at_positions(array, index):
    """`array` (B, T, ...) at the positions `positions_held` found (None: all)."""
    return array if index is None or array is None else array[:, index]


DOWNCAST = {torch.float64: torch.float32, torch.complex128: torch.complex64}
WIDEN = {
    torch.float32: torch.float64, torch.bfloat16: torch.float64, torch.float16: torch.float64,
    torch.complex64: torch.complex128,
}  # fmt: skip
CAST = "a float64 tensor cast to float32 (x.float(), .to(torch.float32), .to(cfg['dtype'])) or narrower (bfloat16)"
MIXED = "{} with a float32 operand (a constant or table made in float32, as torch.tensor(2.0 / torch.pi) is)"
HELD = "with a float32 tensor the module holds (made before the check: widened, its values already rounded)"
TYPED = "with a float32 constant made in the forward with its dtype given (torch.tensor(..., dtype=torch.float32))"
MADE = (
    "a table made in float32 in the forward, then widened (torch.arange(n, dtype=torch.float32), .float() of integers)"
)
SKIPPED = (torch.ops.aten.copy_.default, torch.ops.aten._to_copy.default)  # a copy into a float32 tensor: its own


class Float32Islands(TorchDispatchMode):
    """While the user's float64 copy runs, each op computing in float32 is recorded in `seen` as (the innermost user
    submodule, op) and widened: a cast to float32 (or complex64) makes a float64 copy, an op mixing float64 and
    float32 operands runs on widened ones, a float32 tensor of rounded values widened into the run is MADE. With
    `exact`, what forward makes (default dtype, dtype=float32) is float64: a mistake inside is matched exactly."""

    def __init__(self, module: nn.Module, exact: bool = True):
        super().__init__()
        self.module, self.exact = module, exact
        self.seen: list = []
        self.owned: set = set()  # the records whose float32 operand is a tensor the module holds (or a view of one)
        self.stack: list = []  # the paths of the user's submodules running, the innermost last

    def __enter__(self):
        self.hooks, self.storages = [], set()
        for path, mod in self.module.named_modules():
            self.hooks.append(mod.register_forward_pre_hook(lambda m, a, p=path: self.stack.append(p)))
            self.hooks.append(mod.register_forward_hook(self._leave, always_call=True))
            held = [*mod.parameters(recurse=False), *mod.buffers(recurse=False), *vars(mod).values()]
            self.storages |= {_storage(t) for t in held if isinstance(t, torch.Tensor) and t.dtype in WIDEN}
        self.default = torch.get_default_dtype()
        if self.exact:
            torch.set_default_dtype(torch.float64)
        return super().__enter__()

    def __exit__(self, *exc):
        for hook in self.hooks:
            hook.remove()
        torch.set_default_dtype(self.default)
        return super().__exit__(*exc)

    def _leave(self, module, args, output) -> None:  # a forward hook: returns None, the output unchanged
        if self.stack:
            self.stack.pop()

    def _record(self, op: str | None, narrow: list) -> None:
        if self.stack:
            self.seen.append((self.stack[-1] or "(the module)", op))
            if any(_storage(t) in self.storages for t in narrow):
                self.owned.add(self.seen[-1])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        narrow = [t for t in leaves if t.dtype in WIDEN]
        if _widened(func, args, kwargs):
            self._record(MADE, narrow)
        cast = func is torch.ops.aten._to_copy.default and isinstance(args[0], torch.Tensor)
        if cast and kwargs.get("dtype") is not None and WIDEN.get(kwargs["dtype"]) == args[0].dtype:
            self._record(None, [])  # a cast, made a copy in the wider dtype
            kwargs = dict(kwargs, dtype=args[0].dtype)
        elif func not in SKIPPED and narrow and any(t.dtype in DOWNCAST for t in leaves):
            self._record(f"torch.{func.overloadpacket.__name__}", narrow)
            args, kwargs = tree_map(_widen, (args, kwargs))
        if self.exact and kwargs.get("dtype") in WIDEN and not _narrow(args):
            kwargs = dict(kwargs, dtype=WIDEN[kwargs["dtype"]])  # made in float32 in forward: made in float64
        return func(*args, **kwargs)


def _storage(t: torch.Tensor) -> int:
    """The address of `t`'s storage (a view shares its base's)."""
    return t.untyped_storage().data_ptr()


def _narrow(args) -> bool:
    return bool(args) and isinstance(args[0], torch.Tensor) and args[0].dtype in WIDEN


def _widened(func, args, kwargs) -> bool:
    """Whether the op widens a float32 tensor into a float64 one (`.to(x.dtype)`, or written into a float64
    tensor) whose values float32 has rounded: a mask's or positions' whole numbers and infinities widen exactly."""
    if func is torch.ops.aten._to_copy.default and _narrow(args) and kwargs.get("dtype") == WIDEN[args[0].dtype]:
        narrow = args[0]
    elif func is torch.ops.aten.copy_.default and _narrow(args[1:]) and args[0].dtype == WIDEN[args[1].dtype]:
        narrow = args[1]
    else:
        return False
    values = torch.view_as_real(narrow) if narrow.is_complex() else narrow
    finite = values[torch.isfinite(values)]
    return bool((finite != finite.round()).any())


def _widen(value):
    return value.to(WIDEN[value.dtype]) if isinstance(value, torch.Tensor) and value.dtype in WIDEN else value


def find_islands(module: nn.Module, run) -> list | None:
    """(innermost submodule, what) for each op of `run()` computing in float32 (Float32Islands), each once; None when
    it raises. A second run is as the float64 comparison's: a float32 operand met then is HELD or TYPED."""
    runs = []
    for exact in (False, True):
        try:
            with Float32Islands(module, exact=exact) as mode, torch.no_grad():
                run()
        except Exception:
            return None
        runs.append(list(dict.fromkeys(mode.seen)))
        if not runs[0]:
            return []
    kept = {seen: HELD if seen in mode.owned else TYPED for seen in runs[1] if seen[1] is not None}
    return [(path, _what(op, kept.get((path, op)))) for path, op in runs[0]]


def _what(op: str | None, kept: str | None) -> str:
    """What an island's op computes, in the caveat's words; `kept`: HELD or TYPED (rounded in the float64 run too)."""
    if op is None:
        return CAST
    if op == MADE:
        return f"a float32 tensor widened {kept}" if kept else MADE
    return f"{op} {kept}" if kept else MIXED.format(op)


# float32's epsilon over a narrower dtype's: how much coarser a float32 run computing in it may be
COARSER = {d: float(torch.finfo(d).eps / torch.finfo(torch.float32).eps) for d in (torch.float16, torch.bfloat16)}


def narrowest(flow) -> torch.dtype | None:
    """The coarsest dtype narrower than float32 (bfloat16, float16: torch.autocast, or casts) an op of the recorded
    forward (dataflow's Flow, the tensors it made) computes in, else None (also where none was recorded)."""
    dtypes = {t.dtype for t in flow.values.values()} if flow is not None else set()
    return max((d for d in dtypes if d in COARSER), key=COARSER.get, default=None)


def holds_float32(islands: list | None) -> bool:
    """Whether any island has a float32 operand the float64 run cannot widen (HELD, TYPED): it cannot be exact."""
    return any(what.endswith((HELD, TYPED)) for _, what in islands or [])


def island_message(islands: list) -> str:
    """The caveat on float32 islands: where the first is, and each kind of op with the submodules it runs in."""
    groups: dict = {}
    for path, op in islands:
        groups.setdefault(op, []).append(path)
    parts = [
        f"{op} in {', '.join(paths[:4])}" + (f" and {len(paths) - 4} more" if len(paths) > 4 else "")
        for op, paths in groups.items()
    ]
    held = "; with a float32 operand the float64 run cannot widen, the float64 comparison is judged on the float32 bars"
    return (
        f"at {islands[0][0]}: computes in float32 inside the float64 model: {'; '.join(parts)}; the float64 "
        "comparison and the search for a mistake run those ops in float64 (the float32 comparison as written)"
        + (held if holds_float32(islands) else "")
    )


def output_head(user: nn.Module, links) -> str | None:
    """The path of the submodule holding the output projection (the Annotated Transformer's `generator`), applied
    when the forward returns hidden states; None where it is no module of its own (a tied table)."""
    for link in links:
        if any(name == "output_proj.weight" for name, _ in link.parts) and "." in link.user:
            path = link.user.rsplit(".", 1)[0]
            head = user.get_submodule(path)
            if not isinstance(head, nn.Embedding) and type(head).forward is not nn.Module.forward:
                return path
    return None


def copy_module(user: nn.Module) -> nn.Module:
    """A deep copy of the user's module whose function attributes (alone or in a list, tuple or dict) run the copy:
    copy.deepcopy shares functions, so minGPT's `self.mlpf = lambda x: m.dropout(m.c_proj(...))` would call the
    original; each is rebuilt with its closure's cells pointing at the copies."""
    memo: dict = {}
    module = copy.deepcopy(user, memo)
    for sub in module.modules():
        for name, value in list(vars(sub).items()):
            vars(sub)[name] = _rebind(value, memo)  # the same object where nothing under it changed
    return module


def unwrapped(user) -> tuple:
    """(the model inside torch.compile's OptimizedModule (`_orig_mod`) and nn.DataParallel's or
    DistributedDataParallel's `.module`, [the report's note]): a wrapper changes how it runs, not what it computes."""
    wrappers: list = []
    while isinstance(user, (nn.DataParallel, nn.parallel.DistributedDataParallel)) or hasattr(user, "_orig_mod"):
        inner = user._orig_mod if type(user).__name__ == "OptimizedModule" else getattr(user, "module", None)
        if not isinstance(inner, nn.Module):
            break
        wrappers.append(type(user).__name__)
        user = inner
    said = f"judged the model inside {' inside '.join(wrappers)}: the wrapper changes how it runs, not what it computes"
    return user, [f"{said}; the names are the inner model's"] if wrappers else []


def unscripted(user) -> tuple:
    """(`user`, []), or where torch.jit.script made modules of it RecursiveScriptModules, whose ops the recording
    cannot see (a copy with each the Python module it was scripted from, [the report's note])."""
    plain = _unscripted(user, "") if isinstance(user, nn.Module) else user
    said = "judged the Python modules torch.jit.script compiled (their classes, holding the scripted modules' tensors)"
    said += ": TorchScript runs the same forward, with ops the recording cannot see"
    return plain, [said] if plain is not user else []


def _unscripted(module: nn.Module, path: str) -> nn.Module:
    """`module` with each RecursiveScriptModule in it its Python class's (without its __init__) holding the scripted
    module's parameters, buffers, attributes and constants; the modules above them shallow copies."""
    if not any(isinstance(m, torch.jit.RecursiveScriptModule) for m in module.modules()):
        return module
    kind = getattr(getattr(module, "_concrete_type", None), "py_class", None)  # a scripted module's class
    if isinstance(module, torch.jit.RecursiveScriptModule) and kind is None:
        raise ValueError(
            f"{path or 'the module'} is a TorchScript module without its Python class (as torch.jit.load gives it), "
            "whose ops the recording cannot see; pass the module before torch.jit.script"
        )
    plain = copy.copy(module) if kind is None else kind.__new__(kind)
    if kind is not None:
        nn.Module.__init__(plain)
        plain._parameters = dict(module.named_parameters(recurse=False))
        plain._buffers = dict(module.named_buffers(recurse=False))
        for name in [*module._concrete_type.get_attributes(), *module._concrete_type.get_constants()]:
            if not name.startswith("_") and not hasattr(plain, name) or name == "training":
                setattr(plain, name, getattr(module, name))
    plain._modules = {n: c and _unscripted(c, f"{path}.{n}".lstrip(".")) for n, c in module._modules.items()}
    return plain


def plain_weights(user) -> tuple:
    """(`user`, []), or where weights are parametrized (weight_norm, spectral_norm, ...) (a copy with each such weight
    its current value as a plain parameter, [the report's note]): judged on the weights the forward uses."""
    if not isinstance(user, nn.Module) or not any(map(parametrize.is_parametrized, user.modules())):
        return user, []
    model, names = copy_module(user), []
    held = {id(p): p for p in model.parameters()}
    for path, module in model.named_modules():
        for name in list(getattr(module, "parametrizations", {})):
            shared = held.get(id(getattr(module, name)))  # a parametrization returning another tensor held: a tie
            parametrize.remove_parametrizations(module, name, leave_parametrized=True)
            if shared is not None:
                setattr(module, name, shared)
            names.append(f"{path}.{name}" if path else name)
    listed = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return model, [
        f"judged on the weights the parametrizations compute ({listed}): their gradients are compared, not the "
        "parametrizations' own tensors'"
    ]


def computing(user, grown: bool = False):
    """`user`, or a copy where a leaf module holds no parameter of 2+ axes but a buffer of 2+ axes (int8 weights and
    their scales) or a parameter (a norm's log_w) with each such module's forward run under _Computing: a weight it
    computes (`qweight.to(x.dtype) * scale`, `exp(log_w)`) is kept as the forward computes it, and read from the
    parameter computed_weights gives it. `grown` (the recording shows a weight a product made from parameters alone:
    dataflow.generated): the whole forward run so too, each such weight (a hypernetwork's) the module's own. A module
    whose parameters are all vectors (one flat vector sliced into views, `flat[a:b].view(d_out, d_in)`): the whole
    forward run so, each view of them that an op other than a view reads, a parameter of the submodule running it."""
    vector = isinstance(user, nn.Module) and vectors(user)
    if not isinstance(user, nn.Module) or not grown and not vector and not any(map(_computes, user.modules())):
        return user
    model = copy_module(user)
    for m in (m for m in model.modules() if _computes(m) or (grown or vector) and m is model):
        cls = type(m)

        @functools.wraps(cls.forward)  # its signature the user's (calling.py reads it)
        def forward(self, *args, cls=cls, whole=grown and m is model, sliced=vector and m is model, **kwargs):
            with _Computing(self, grown=whole, vector=sliced):
                return cls.forward(self, *args, **kwargs)

        kept = {"forward": forward, "seen": {}, "places": {}, "roles": {}, "__module__": cls.__module__}
        m.__class__ = type(cls.__name__, (cls,), kept)
    return model


def vectors(user: nn.Module) -> bool:
    """Whether `user` holds parameters and none of 2+ axes (its matrices are views of a vector: a flat one's)."""
    params = [*user.parameters()]
    return bool(params) and all(p.ndim < 2 for p in params) and bool(user._modules)


def _computes(m: nn.Module) -> bool:
    """A leaf holding no parameter of 2+ axes, but a buffer of 2+ axes or a parameter (a log-scale norm's log_w)."""
    params = [*m.parameters(recurse=False)]
    wide = any(b.ndim >= 2 for b in m.buffers(recurse=False))
    return not m._modules and all(p.ndim < 2 for p in params) and (wide or bool(params))


def computed_weights(model) -> tuple:
    """(`model`, []), or where computing's modules computed a weight from their own parameters and buffers alone, no
    input (a dequantized int8 weight, exp(log_w)), (`model` with each such weight a parameter holding the value it
    was computed at (`weight`, else `weight_computed<k>`), [the note]): the judge reads it as the weight. A module
    that computed none runs its own class again."""
    names = []
    for path, m in model.named_modules() if isinstance(model, nn.Module) else []:
        seen = getattr(type(m), "seen", {}) if not getattr(m, "computed_names", None) else {}
        if "seen" in vars(type(m)) and not seen and not getattr(m, "computed_names", None):
            m.__class__ = type(m).__bases__[0]  # it computed nothing: its own class again
        for k in sorted(seen):  # in the dtype the product read it in (the run's), whatever its scales are stored in
            place = type(m).places.get(k, "")  # type: ignore[attr-defined]  # the submodule whose product reads it
            owner = m.get_submodule(place)
            name = type(m).roles.get(k) or ("weight" if not hasattr(owner, "weight") else f"weight_computed{k}")  # type: ignore[attr-defined]
            owner.register_parameter(name, nn.Parameter(seen[k]))
            m.computed_names = [*getattr(m, "computed_names", []), f"{place}.{name}".lstrip(".")]
            names.append(f"{path}.{m.computed_names[-1]}".lstrip("."))
    if not names:
        return model, []
    listed = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    grown = any(getattr(type(m), "places", {}).get(k) for m in model.modules() for k in getattr(type(m), "seen", {}))
    generated = "; those a product makes from parameters (a hypernetwork's) are compared in place of those parameters"
    if any(getattr(type(m), "roles", {}) for m in model.modules()):  # views of a vector read as weights
        generated = "; views of a vector the module holds (a flat one's slices) are compared in place of the vector"
    return model, [
        f"judged on the weights the forward computes from the module's own tensors ({listed}), each a parameter "
        "holding the value it is computed at: their gradients are compared; the tensors they are computed from "
        f"(a norm's log_w of exp(log_w), int8 weights, scales) have none{generated if grown else ''}"
    ]


class _Computing(TorchFunctionMode):
    """Within one forward of a module: the tensors computed from its own parameters and buffers alone (an op whose
    tensor arguments are all such; `to` and `type_as` read their first only). The k-th operand of a product so
    computed by an op other than a view (or a cast of integers: `qweight.to(x.dtype)`), of 2+ axes, is the module's
    k-th computed weight: its parameter where computed_weights registered one, else kept (its class's `seen`) and used
    as it is; so is a vector (one number per feature) multiplying a tensor not so computed (a norm's exp(log_w)
    times the normed x; 1 + w, an offset the recording reads, is not computed); a scale multiplying the product after
    it is folded into that weight (_scaled). `grown`: the tensors computed from all the module's parameters and
    buffers, its submodules' too, and of those only the ones a product took part in (a hypernetwork's weights)."""

    def __init__(self, module: nn.Module, grown: bool = False, vector: bool = False):
        super().__init__()
        self.module, self.k, self.computed, self.used = module, 0, set(), None
        held = [*module.parameters(recurse=grown or vector), *module.buffers(recurse=grown or vector)]
        self.pure = {id(t): t for t in held}
        self.grown: set | None = set() if grown else None
        computed = {id(module.get_parameter(n)) for n in getattr(module, "computed_names", [])} if vector else set()
        vectors = [p for p in module.parameters() if id(p) not in computed]  # the vectors sliced, not their views
        self.views: dict | None = {id(p): p for p in vectors} if vector else None
        self.unnamed: dict = {}  # id(a held view) -> (its k, it), till an op reads it (_named)
        self.paths, self.path = {id(m): p for p, m in module.named_modules()} if grown or vector else {}, [""]
        self.hooks: list = []
        self.products: dict[int, tuple] = {}  # id(a product's output) -> (it, the computed weight's k, the op)

    def __enter__(self):
        """The submodule running each op followed (`path`) where the module's submodules' products are read too."""
        if self.paths:
            self.hooks = [
                nn.modules.module.register_module_forward_pre_hook(self._enter_module),
                nn.modules.module.register_module_forward_hook(self._leave_module),
            ]
        return super().__enter__()

    def __exit__(self, *exc):
        for hook in self.hooks:
            hook.remove()
        return super().__exit__(*exc)

    def _enter_module(self, m, *_) -> None:
        self.path.append(self.paths.get(id(m), self.path[-1]))

    def _leave_module(self, *_) -> None:
        self.path.pop()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if self.views is not None:
            return self._sliced(func, name, args, kwargs)
        if name in MULS and len(args) == 2 and not kwargs and (done := self._scaled(*args)) is not None:
            return done
        self.used = None
        if name in PRODUCTS:
            args, kwargs = tree_map(self._weight, (args, kwargs))
        elif name in MULS and len(args) == 2 and sum(id(t) in self.pure for t in args if torch.is_tensor(t)) == 1:
            args = tuple(self._weight(t, 1) if torch.is_tensor(t) and t.ndim == 1 else t for t in args)  # x * exp(w)
        out = func(*args, **kwargs)
        if self.used is not None and isinstance(out, torch.Tensor):
            self.products[id(out)] = (out, self.used, name)
        read = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        read = read[:1] if name in ("to", "type_as") else read
        if read and all(id(t) in self.pure for t in read):
            made = name not in VIEWS or any(id(t) in self.computed or not t.is_floating_point() for t in read)
            made = made and not (name in ADDS and len(read) == 1)  # 1 + w: an offset the recording reads (Gemma's)
            grown = self.grown is not None and (name in PRODUCTS or any(id(t) in self.grown for t in read))
            for o in (o for o in tree_leaves(out) if isinstance(o, torch.Tensor)):
                self.pure[id(o)] = o
                self.computed |= {id(o)} if made else set()
                if grown and self.grown is not None:
                    self.grown.add(id(o))
        return out

    def _sliced(self, func, name: str, args, kwargs):
        """An op of a module whose parameters are vectors: a view of them is followed while it has one axis and held
        (_held) once it has more (`flat[a:b].view(d_out, d_in)`) or once an op other than a view reads it (a gain,
        a bias); a parameter itself read so is left as it is."""
        views = self.views if self.views is not None else {}
        sliced = lambda t: isinstance(t, torch.Tensor) and id(t) in views and not isinstance(t, nn.Parameter)  # noqa: E731
        if name not in VIEWS or not args or not isinstance(args[0], torch.Tensor) or id(args[0]) not in views:
            args, kwargs = tree_map(lambda t: self._held(t) if sliced(t) else t, (args, kwargs))
            self._named([t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)])
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if not isinstance(out, torch.Tensor):
            return out
        if out.ndim >= 2:
            return self._held(out)
        views[id(out)] = out
        return out

    def _named(self, read: list) -> None:
        """The held tensors an op reads named as its weight and bias (`w<k>_weight`, `w<k>_bias`: a linear's or a
        norm's pair, k the first's), where it is the first op reading them."""
        roles = type(self.module).roles  # type: ignore[attr-defined]
        unnamed = [self.unnamed.pop(id(t))[0] for t in read if id(t) in self.unnamed]
        for k, role in zip(unnamed, ("weight", "bias"), strict=False):
            roles[k] = f"w{unnamed[0]}_{role}"

    def _weight(self, t, least: int = 2):
        if not isinstance(t, torch.Tensor) or id(t) not in self.computed or t.ndim < least:
            return t
        if self.grown is not None and id(t) not in self.grown:
            return t
        return self._held(t)

    def _held(self, t):
        """The module's next computed weight: its parameter where computed_weights registered one, else `t` kept
        (its class's `seen`) with the submodule running it (`places`)."""
        k, self.k, names = self.k, self.k + 1, getattr(self.module, "computed_names", [])
        self.used = k
        if k < len(names):
            return self.module.get_parameter(names[k])
        type(self.module).seen[k] = t.detach().clone()  # type: ignore[attr-defined]
        type(self.module).places[k] = self.path[-1]  # type: ignore[attr-defined]
        self.unnamed[id(t)] = (k, t)  # t kept: its id not taken by another tensor
        return t

    def _scaled(self, a, b):
        """A product by a computed weight scaled after it, `F.linear(x, q) * s` (s of the module's own: one number or
        one per output feature): the weight is q scaled by s. Where computed_weights holds that weight the product
        is returned as it is; while it is being found s is folded into it (None: the op runs as written)."""
        found, s = (self.products.get(id(a)), b) if isinstance(a, torch.Tensor) else (None, b)
        found, s = (found, s) if found else (self.products.get(id(b)) if isinstance(b, torch.Tensor) else None, a)
        if not found or not isinstance(s, torch.Tensor) or id(s) not in self.pure:
            return None
        out, k, op = found
        if s.numel() not in (1, out.shape[-1]):
            return None
        if k < len(getattr(self.module, "computed_names", [])):
            return out
        seen = type(self.module).seen  # type: ignore[attr-defined]
        axis = 0 if op == "linear" else -1
        if s.numel() > 1 and seen[k].shape[axis] != s.numel():
            return None
        seen[k] = seen[k] * s.detach().reshape((-1, 1) if axis == 0 else (1, -1)).to(seen[k].dtype)
        return None


def linear_maps(model, flow) -> tuple:
    """(`model`, []), or where a submodule holding a tensor of 2+ axes but no such parameter of its own is a linear map
    of its one input, y = x W^T + b, whose W no tensor it holds is (as it is or transposed): DoRA's m V / |V|, an
    adapter over a computed base (_measured), (a copy with each such outermost submodule an nn.Linear of W and b,
    [the note]): the linear the reference has; the gradients of what W and b are computed from follow by the chain
    rule, checked by finite differences first. The input's width is the one the recorded forward (`flow`) gave it."""
    widths = {c.path: c.inputs[0].shape[-1] for c in getattr(flow, "calls", []) if _one_input(c)}
    found: dict = {}
    for path, m in model.named_modules() if isinstance(model, nn.Module) else []:
        held = [*m.parameters(), *m.buffers()]
        if not path or path not in widths or any(path.startswith(f"{p}.") for p in found):
            continue
        if any(t.ndim >= 2 for t in [*m.parameters(False), *m.buffers(False)]) or all(t.ndim < 2 for t in held):
            continue
        if (measured := _measured(m, widths[path])) is not None:
            found[path] = measured
    if not found:
        return model, []
    model, dtype = copy_module(model), next(model.parameters()).dtype
    for path, (w, b) in found.items():
        linear = nn.Linear(w.shape[1], w.shape[0], bias=b is not None, dtype=dtype)
        with torch.no_grad():
            linear.weight.copy_(w)
            if b is not None:
                linear.bias.copy_(b)
        owner, _, name = path.rpartition(".")
        setattr(model.get_submodule(owner), name, linear)
    return model, [
        f"judged with each module computing a linear map of its input as the linear it computes, y = x W^T + b "
        f"({', '.join(list(found)[:3])}{', ...' if len(found) > 3 else ''}): W and b measured on random inputs; dW "
        "and db are compared, the gradients of what they are computed from (checked by finite differences) follow"
    ]


def _one_input(call) -> bool:
    return len(call.inputs) == 1 and call.inputs[0] is not None and len(call.inputs[0].shape) >= 2


def _measured(module: nn.Module, width: int) -> tuple | None:
    """(W, b or None) where `module` (a float64 copy, evaluation mode) gives x W^T + b on a random x to 1e-9, W held
    by none of its tensors, and its parameters' gradients agree with central differences along a random direction;
    None otherwise (b None where it is 0 and the module holds no vector of its width)."""
    module = copy.deepcopy(module).double().eval()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, width, generator=gen, dtype=torch.float64)
    try:
        with torch.no_grad():
            b = module(torch.zeros(1, 1, width, dtype=torch.float64))
            w = (module(torch.eye(width, dtype=torch.float64)[None]) - b)[0].mT
            y = module(x)
        b = b.reshape(-1)
        gap = (y - x @ w.mT - b).abs().max() if isinstance(y, torch.Tensor) else math.nan
        if not gap <= 1e-9 * max(float(y.abs().max()), 1e-3) or not w.abs().max() > 0:
            return None  # not affine (or not finite: 0 / 0 of an input rounded at its own absmax), or constant
        held = [v for t in [*module.parameters(), *module.buffers()] if t.ndim == 2 for v in (t, t.T)]
        if any(v.shape == w.shape and (v - w).abs().max() <= 1e-12 * float(w.abs().max()) for v in held):
            return None
        if not _chain_rule(module, x, torch.randn(y.shape, generator=gen, dtype=torch.float64), gen):
            return None
    except Exception:  # not a one-tensor call, or not an output of the input's shape
        return None
    kept = b.abs().max() > 0 or any(t.shape == (w.shape[0],) for t in [*module.parameters(), *module.buffers()])
    return w, b if kept else None


def _chain_rule(module: nn.Module, x: torch.Tensor, g: torch.Tensor, gen: torch.Generator) -> bool:
    """Whether the gradient of sum(module(x) g) along a random direction of its floating parameters is the central
    difference of that sum along it (the backward is the forward's chain rule), to 1e-6."""
    params = [p for p in module.parameters() if p.is_floating_point()]
    if not params:
        return True
    for p in params:
        p.requires_grad_(True)
    grads = torch.autograd.grad((module(x) * g).sum(), params, allow_unused=True)
    steps = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in params]
    slope = sum(float((d * s).sum()) for d, s in zip(grads, steps, strict=True) if d is not None)
    eps = 1e-6

    def moved(by: float) -> float:  # sum(module(x) g) with each parameter moved `by` eps along its step
        with torch.no_grad():
            for p, s in zip(params, steps, strict=True):
                p.add_(by * eps * s)
            return float((module(x) * g).sum())

    sums = [moved(1), moved(-2)]
    moved(1)
    return abs((sums[0] - sums[1]) / (2 * eps) - slope) <= 1e-6 * max(abs(slope), 1.0)


def merged_adapters(user) -> tuple:
    """(`user`, []), or where a submodule computes a linear plus a low-rank adapter (LoRA: base(x) + s B(A(x)), read
    from its outputs and gradients on random inputs, not its names), (a copy with each such submodule one linear of
    weight W + s B A, [the note saying so]): a linear the reference has; the adapters' gradients then follow by the
    chain rule (dA = s B^T dW, dB = s dW A^T), checked on each submodule alone before it is merged."""
    if not isinstance(user, nn.Module):
        return user, []
    found: dict = {}  # path -> its parts' names and s
    for path, module in user.named_modules():
        if path and not any(path.startswith(f"{p}.") for p in found) and (parts := _low_rank(module)) is not None:
            found[path] = parts
    if not found:
        return user, []
    model = copy_module(user)
    for path, (*names, s) in found.items():
        base, a, b = (model.get_submodule(f"{path}.{name}") for name in names)
        merged = copy.deepcopy(base)  # the base's own class and bias
        with torch.no_grad():
            merged.weight += s * b.weight @ a.weight
        owner, _, name = path.rpartition(".")
        setattr(model.get_submodule(owner), name, merged)
    return model, [
        f"judged with each low-rank adapter merged into its linear, W + s B A ({', '.join(list(found)[:3])}"
        f"{', ...' if len(found) > 3 else ''}): the merged weight's gradient dW is compared; the adapters' gradients "
        "(s B^T dW, s dW A^T) were checked on each part alone"
    ]


def _low_rank(module: nn.Module) -> tuple | None:
    """(the names of base, A and B in `module`, s) where it computes base(x) + s B(A(x)) (A: in -> r, B: r -> out, r
    below both, neither with a bias) with the gradients of that sum, in float64 on a copy; None otherwise."""
    linears = {name: m for name, m in module.named_modules() if isinstance(m, nn.Linear)}
    if "" in linears or not 3 <= len(linears) <= 6:
        return None
    for names in itertools.permutations(linears, 3):
        base, a, b = (linears[name] for name in names)
        r = a.out_features
        shapes = (a.in_features, b.in_features, b.out_features) == (base.in_features, r, base.out_features)
        if shapes and r < min(base.in_features, base.out_features) and a.bias is None and b.bias is None:
            s = _scaling(module, base, a, b)
            if s is not None:
                return (*names, s)
    return None


def _scaling(module: nn.Module, base: nn.Linear, a: nn.Linear, b: nn.Linear) -> float | None:
    """s where `module` (a float64 copy, evaluation mode) gives base(x) + s B A x and A's and B's gradients
    s B^T dW and s dW A^T (dW = g^T x) on random x and upstream g, to 1e-9; None where it does not (A zero)."""
    memo: dict = {}
    module = copy.deepcopy(module, memo).double().eval()
    base, a, b = (memo[id(m)] for m in (base, a, b))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, base.in_features, generator=gen, dtype=torch.float64)
    g = torch.randn(2, 3, base.out_features, generator=gen, dtype=torch.float64)
    for t in (a.weight, b.weight):
        t.requires_grad_(True)
    try:
        y = module(x)
        da, db = torch.autograd.grad(y, (a.weight, b.weight), g)
    except Exception:  # not a one-tensor call, or no gradient reaches the adapters
        return None
    dw = g.reshape(-1, g.shape[-1]).T @ x.reshape(-1, x.shape[-1])  # (out, in)
    with torch.no_grad():  # s from dB = s dW A^T (B may be zero, a fresh adapter; A is not)
        plain, low, want = base(x), b(a(x)), dw @ a.weight.T
        s = float((db * want).sum() / (want * want).sum())
        pairs = ((y.detach(), plain + s * low), (da, s * b.weight.T @ dw), (db, s * dw @ a.weight.T))
        near = all(float((u - w).abs().max()) <= 1e-9 * max(float(w.abs().max()), 1e-3) for u, w in pairs)
    return s if near else None


def _rebind(value, memo: dict, depth: int = 0):
    """`value` with every closure under it reading the deep copy's objects (memo: id(original) -> copy)."""
    if depth > 4:
        return value
    if isinstance(value, (list, tuple)):
        items = [_rebind(v, memo, depth + 1) for v in value]
        return type(value)(items) if any(a is not b for a, b in zip(items, value, strict=True)) else value
    if isinstance(value, dict):
        entries = {k: _rebind(v, memo, depth + 1) for k, v in value.items()}
        if all(entries[k] is v for k, v in value.items()):
            return value
        kept = copy.copy(value)  # its own type (a module's hooks: an OrderedDict, which a hook handle refers to)
        kept.update(entries)
        return kept
    if not isinstance(value, types.FunctionType) or not value.__closure__:
        return value
    cells, changed = [], False
    for cell in value.__closure__:
        try:
            held = cell.cell_contents
        except ValueError:  # an empty cell (a name not yet bound when the function was made)
            cells.append(types.CellType())
            continue
        new = memo[id(held)] if id(held) in memo else _rebind(held, memo, depth + 1)
        changed = changed or new is not held
        cells.append(types.CellType(new))
    if not changed:
        return value
    function = types.FunctionType(value.__code__, value.__globals__, value.__name__, value.__defaults__, tuple(cells))
    function.__kwdefaults__, function.__dict__ = value.__kwdefaults__, dict(value.__dict__)
    return function


@contextmanager
def lifted(mode) -> Iterator[None]:
    """`mode` (torch.inference_mode or torch.no_grad, as a block or a decorator) a no-op while inside, so that the
    user's forward records the gradients the check compares."""
    saved = mode.__enter__, mode.__exit__
    mode.__enter__ = lambda self: None  # type: ignore[method-assign, assignment]
    mode.__exit__ = lambda self, *exc: None  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        mode.__enter__, mode.__exit__ = saved  # type: ignore[method-assign]


@contextmanager
def slow_paths() -> Iterator[None]:
    """torch's fused fast path of its attention modules off while inside: in eval under no_grad it packs a padded
    batch into nested tensors (whose sizes the recording cannot read) and reads a float mask as hidden/shown, where
    the module's own math, under grad, adds it; every run of the check then computes what the module says."""
    saved = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(saved)


@dataclass(frozen=True)
class Call:
    """A part's first call in the user's run, as its parent made it: the module, its arguments and its output."""

    module: nn.Module
    args: tuple
    kwargs: dict
    output: Any

    @property
    def inputs(self) -> tuple:
        return (*self.args, *self.kwargs.values())


@contextmanager
def first_calls(modules, order: list | None = None) -> Iterator[dict]:
    """While inside, key -> the Call of each (key, module) of `modules` when first called, copied then (as returned,
    though changed in place later: `q += residual`); with `order`, the keys in first-call order."""
    calls: dict = {}

    def first(key, module, *call) -> None:
        if key not in calls:
            calls[key] = Call(module, *tree_map(lambda t: t.detach().clone() if torch.is_tensor(t) else t, call))

    with hooked(modules, first, None if order is None else lambda key: None if key in order else order.append(key)):
        yield calls
