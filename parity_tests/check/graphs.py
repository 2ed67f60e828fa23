"""A torch.fx GraphModule judged as the model it was made of: torch.fx.symbolic_trace inlines each custom module's
forward into the root's graph, torch.export's `.module()` every module's, so no submodule of the user's runs its own
ops and the judge could place neither a norm nor an attention. Each node still names the modules it ran in
(`node.meta["nn_module_stack"]`); re-exported with those names, torch.export.unflatten rebuilds the hierarchy: one
module per path, each running the ops the graph ran there, holding the same parameters under the same names.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import io

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree


def _inlined(user) -> bool:
    """Whether `user` is a GraphModule with an op (not a module call) the graph says ran inside a submodule."""
    if not isinstance(user, fx.GraphModule):
        return False
    return any(
        n.op != "call_module" and any(path for path, _ in (n.meta.get("nn_module_stack") or {}).values())
        for n in user.graph.nodes
    )


def _named_stacks(graph: fx.GraphModule) -> None:
    """Each node's module stack as torch.export writes it: the root ("") first, then (path, class name) outward-in
    (symbolic_trace's stacks leave out the root and hold the classes)."""
    for node in graph.graph.nodes:
        stack = [(p, c if isinstance(c, str) else f"{c.__module__}.{c.__qualname__}") for p, c in
                 (node.meta.get("nn_module_stack") or {}).values() if p]  # fmt: skip
        root = {"L__self__": ("", type(graph).__name__)}
        node.meta["nn_module_stack"] = root | {f"L__self__{p}": (p, c) for p, c in stack}
    graph.recompile()


def _signed(cls: type, signature: inspect.Signature) -> type:
    """A subclass of `cls` whose forward shows `signature` (the graph's: unflatten's forward takes *args, **kwargs,
    which the callers cannot read)."""

    def forward(self, *args, **kwargs):
        return cls.forward(self, *args, **kwargs)

    self = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    forward.__signature__ = signature.replace(parameters=[self, *signature.parameters.values()])  # type: ignore
    return type(cls.__name__, (cls,), {"forward": forward})


def ungraphed(user, run_once) -> tuple:
    """(`user`, []), or where it is a GraphModule whose submodules' ops were inlined (the unflattened module, [the
    report's note]): re-exported (non-strict, every dimension of every input dynamic) on the inputs of the first
    call `run_once(module)` completes, then torch.export.unflatten. Raises ValueError where the export fails."""
    if not _inlined(user):
        return user, []
    calls: list = []  # the copies run_once makes drop their hooks (GraphModule.__deepcopy__): a global hook sees them

    def seen(module, args, kwargs, out):
        if not calls and isinstance(module, fx.GraphModule) and module.code == user.code:
            calls.append((args, kwargs))

    with torch.nn.modules.module.register_module_forward_hook(seen, with_kwargs=True):
        run_once(user)
    if not calls:  # its forward takes none of the level's calls: the judge says so, as of any module
        return user, []
    args, kwargs = pytree.tree_map_only(torch.Tensor, lambda t: t.detach(), calls[0])
    bound = inspect.signature(user.forward).bind(*args, **kwargs).arguments
    dynamic = pytree.tree_map(lambda v: dict.fromkeys(range(v.dim()), torch.export.Dim.AUTO)
                              if isinstance(v, torch.Tensor) else None, dict(bound))  # fmt: skip
    graph = copy.deepcopy(user)
    _named_stacks(graph)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # torch.export.unflatten prints as it checks mutations
            program = torch.export.export(graph, args, kwargs, dynamic_shapes=dynamic, strict=False)
            model: nn.Module = torch.export.unflatten(program)
    except Exception as exc:
        raise ValueError(
            f"the traced graph's submodules could not be rebuilt from its nodes ({type(exc).__name__}: "
            f"{str(exc)[:200]}); pass the module before torch.fx.symbolic_trace / torch.export"
        ) from exc
    for sub in model.modules():  # the export's fake tensors and symbols would stop the judge's copies (deepcopy)
        vars(sub).pop("meta", None)
        for node in sub.graph.nodes if isinstance(getattr(sub, "graph", None), fx.Graph) else ():
            node.meta.clear()
    model.__class__ = _signed(type(model), inspect.signature(user.forward))
    return model.train(user.training), [
        "judged the module hierarchy the traced graph's nodes name (node.meta['nn_module_stack'], rebuilt by "
        "torch.export.unflatten): torch.fx / torch.export had inlined the submodules' forwards into the root"
    ]
