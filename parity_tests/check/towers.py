"""A ViT judged by the reference's vision pairs (numpy_transformer/vision.py), read from its structure.

The judge's levels are the text Transformer's (TransformerConfig); a ViT is a model class of its own in the
reference. Read here from the user's module: a patch front end (a Conv2d whose stride is its kernel, a class-token
parameter of D numbers, a learned position table of 1 + N rows), pre-norm encoder blocks (the submodules holding two
LayerNorms each), a final LayerNorm, and what the forward returns: the hidden states, the class token's, or a
Linear head on it. Each block's tensors are read in the order its forward calls them (norm, q k v or one fused
projection or nn.MultiheadAttention, the output projection, norm, fc1, fc2); the activation and the head count are
those under which the outputs agree. The user's module (a copy, weights drawn here) and the reference built from
the same weights are compared: the output, the pixels' gradient and every parameter's, in float64 and float32.

Where it fails, the first block whose output differs is judged on its own recorded call by the judge's
encoder_layer level (`judge`: check.module, passed in), and its catalogued mistake is named at the block's place.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from numpy_transformer import layers as L
from numpy_transformer import vision as V
from parity_tests.components import BAR, relative_errors

from .report import Result, Row, float32_bar
from .running import copy_module

CALLED = (nn.LayerNorm, nn.Linear, nn.MultiheadAttention)  # what a block's parts are read from, in call order
PARTS = ("norm1", "q", "k", "v", "out", "norm2", "fc1", "fc2")  # one block's, in the reference's forward order
MATCH = 1e-8  # float64 outputs this close are the same computation
# the reference's names (ViTModel's, and head.* for a classifier on the class token)
PATCH, CLS, POSITIONS = (
    "embeddings.patch_embeddings.projection",
    "embeddings.cls_token",
    "embeddings.position_embeddings",
)


def judge_vit(user: nn.Module, reference: str, judge) -> Result | None:
    """The verdict on `user` as a ViT, or None where it is not one this module reads (the caller then says why it
    could not judge)."""
    model = copy_module(user).double().eval()
    vit = _read(model)
    if vit is None:
        return None
    _draw(model, np.random.default_rng(0))
    result = Result(reference=f"{reference}, read as a ViT (numpy_transformer/vision.py's pairs)")
    pixels = np.random.default_rng(1).standard_normal((2, vit["channels"], vit["side"], vit["side"]))
    fit = _fit(model, vit, pixels)
    if fit is None:
        return None
    read = {k: str(fit[k]) for k in ("activation", "n_heads", "eps", "output")}
    if fit["error"] <= MATCH:
        result.conventions = read
    else:
        result.assumed, result.confirmed = read, False
    result.mapping = {u: (", ".join(ours), "its rows in this order" if len(ours) > 1 else "as is")
                      for u, ours in vit["links"].items()}  # fmt: skip
    dout = np.random.default_rng(2).standard_normal(fit["shape"])
    for dtype in (np.float64, np.float32):
        result.rows += _compare(model, vit, fit, pixels, dout, dtype)
    result.passed = all(r.ok for r in result.rows)
    if not result.passed:
        _place(model, vit, fit, pixels, result, judge)
    return result


def _read(model: nn.Module) -> dict | None:
    """The ViT's parts: conv, class token and positions (parameter names), blocks (in call order), final norm,
    head, and links (user parameter -> the reference names its rows hold, in order); None where a part is missing."""
    conv = next((n for n, m in model.named_modules() if isinstance(m, nn.Conv2d) and m.stride == m.kernel_size), None)
    if conv is None:
        return None
    D, C, p = (getattr(model.get_submodule(conv), k) for k in ("out_channels", "in_channels", "stride"))
    owned = (*CALLED, nn.Conv2d)
    loose = {n: t for n, t in model.named_parameters() if not isinstance(model.get_submodule(_up(n)), owned)}
    cls = next((n for n, t in loose.items() if t.numel() == D), None)
    pos = next((n for n, t in loose.items() if t.numel() > D and _square(t.numel() // D - 1)), None)
    if cls is None or pos is None:
        return None
    side = p[0] * math.isqrt(loose[pos].numel() // D - 1)
    order = _call_order(model, torch.zeros(1, C, side, side, dtype=torch.float64))

    def norms(name):
        return sum(isinstance(m, nn.LayerNorm) for m in model.get_submodule(name).modules())

    blocks = [n for n in order if n and norms(n) == 2 and norms(_up(n)) > 2]
    inside = [n for n in order if any(n.startswith(b + ".") for b in blocks)]
    outside = [n for n in order if isinstance(model.get_submodule(n), CALLED) and n not in inside]
    final = next((n for n in outside if isinstance(model.get_submodule(n), nn.LayerNorm)), None)
    head = next((n for n in outside if isinstance(model.get_submodule(n), nn.Linear)), None)
    if not blocks or final is None:
        return None
    links = {f"{conv}.weight": [PATCH + ".weight"], f"{conv}.bias": [PATCH + ".bias"], cls: [CLS], pos: [POSITIONS]}
    for i, block in enumerate(blocks):
        parts = _block_parts(model, [n for n in inside if n.startswith(block + ".")])
        if parts is None:
            return None
        links |= {f"{block}.{u}": [f"encoder.layer.{i}.{V.VIT_LAYER[o.split('.')[0]]}.{o.split('.')[1]}" for o in ours]
                  for u, ours in parts.items()}  # fmt: skip
    links |= {f"{final}.weight": ["layernorm.weight"], f"{final}.bias": ["layernorm.bias"]}
    if head is not None:
        links |= {f"{head}.weight": ["head.weight"], f"{head}.bias": ["head.bias"]}
    held = dict(model.named_parameters())
    links = {u: ours for u, ours in links.items() if u in held}
    return dict(conv=conv, blocks=blocks, final=final, head=head, links=links, D=D, channels=C, side=side)


def _up(name: str) -> str:
    return name.rpartition(".")[0]


def _square(n: int) -> bool:
    return n > 0 and math.isqrt(n) ** 2 == n


def _call_order(model: nn.Module, pixels) -> list:
    """The submodules' names in the order the forward first calls them ([] where it does not run)."""
    order: list = []
    handles = [m.register_forward_pre_hook(lambda m, a, name=name: order.append(name) if name not in order else None)
               for name, m in model.named_modules()]  # fmt: skip
    try:
        with torch.no_grad():
            model(pixels)
    except Exception:
        return []
    finally:
        for h in handles:
            h.remove()
    return order


def _calls(model: nn.Module, names: list) -> list:
    """The norms, linears and attentions among `names` (not the linears inside an nn.MultiheadAttention)."""
    calls = [n for n in names if isinstance(model.get_submodule(n), CALLED)]
    mha = [c for c in calls if isinstance(model.get_submodule(c), nn.MultiheadAttention)]
    return [n for n in calls if not any(n.startswith(c + ".") for c in mha)]


def _block_parts(model: nn.Module, names: list) -> dict | None:
    """A block's parameters (named below the block) -> the reference's parts ("q.weight", ...) their rows hold,
    from the order its forward calls them; None where it is not norm, attention, norm, fc1, fc2."""
    calls = _calls(model, names)
    cut = len(_up(names[0])) + 1 if _up(names[0]) else 0
    kinds = [type(model.get_submodule(n)) for n in calls]
    if kinds.count(nn.LayerNorm) != 2 or kinds[0] is not nn.LayerNorm:
        return None
    second = kinds.index(nn.LayerNorm, 1)
    attention, mlp = calls[1:second], calls[second + 1 :]
    if len(mlp) != 2:
        return None
    if len(attention) == 1 and kinds[1] is nn.MultiheadAttention:  # in_proj (3D, D) then out_proj
        attention = [f"{attention[0]}.in_proj_", f"{attention[0]}.out_proj."]
    else:
        attention = [f"{n}." for n in attention]
    roles = {2: (("q", "k", "v"), ("out",)), 4: (("q",), ("k",), ("v",), ("out",))}  # fused q k v, or each its own
    if len(attention) not in roles:
        return None
    sources = [calls[0] + ".", *attention, calls[second] + ".", *(n + "." for n in mlp)]
    ours = [("norm1",), *roles[len(attention)], ("norm2",), ("fc1",), ("fc2",)]
    return {f"{s[cut:]}{k}": [f"{o}.{k}" for o in parts] for s, parts in zip(sources, ours, strict=True)
            for k in ("weight", "bias")}  # fmt: skip


def _draw(model: nn.Module, rng) -> None:
    """Weights drawn for the check (as the judge's levels do): matrices ~ N(0, 1/fan_in), norm scales near 1, the
    rest small, so that no part is an identity that hides a mistake."""
    with torch.no_grad():
        for name, t in model.named_parameters():
            if t.ndim >= 2 and t.shape[0] > 1:
                values = rng.standard_normal(t.shape) / math.sqrt(t[0].numel())
            elif name.endswith("weight") and isinstance(model.get_submodule(_up(name)), nn.LayerNorm):
                values = 1.0 + 0.2 * rng.standard_normal(t.shape)
            else:
                values = 0.2 * rng.standard_normal(t.shape)
            t.copy_(torch.from_numpy(values))


def _params(model: nn.Module, vit: dict, dtype) -> dict:
    """The reference's tensors (our names) from the module's: fused ones split by rows, missing biases zero."""
    params = {}
    for user_name, ours in vit["links"].items():
        value = model.get_parameter(user_name).detach().double().numpy().astype(dtype)
        for name, piece in zip(ours, np.split(value, len(ours)), strict=True):
            params[name] = piece
    params[POSITIONS] = params[POSITIONS].reshape(-1, vit["D"])
    for i in range(len(vit["blocks"])):
        for part in PARTS:
            rows = params[f"encoder.layer.{i}.{V.VIT_LAYER[part]}.weight"].shape[0]
            params.setdefault(f"encoder.layer.{i}.{V.VIT_LAYER[part]}.bias", np.zeros(rows, dtype))
    return params | {k: np.zeros(vit["D"], dtype) for k in (PATCH + ".bias",) if k not in params}


def _reference(P: dict, pixels, vit: dict, fit: dict):
    """The reference ViT's forward: (output, backward, the hidden states after each block); backward(dout) -> the
    gradients by our names, and "pixels"."""
    n_layers, eps = len(vit["blocks"]), fit["eps"]
    x, patch = V.patch_embedding_forward(pixels, P[PATCH + ".weight"], P[PATCH + ".bias"])  # (B, N, D)
    x, cls = V.prepend_class_token_forward(x, P[CLS])  # (B, 1 + N, D)
    x, positions = L.add_positions_forward(x, P[POSITIONS])
    layers, hidden = [], [x]
    for i in range(n_layers):
        prefix = f"encoder.layer.{i}."
        layer = {k[len(prefix) :]: v for k, v in P.items() if k.startswith(prefix)}
        x, cache = V.pre_norm_layer_forward(layer, x, V.VIT_LAYER, fit["n_heads"], eps, fit["activation"])
        layers.append(cache)
        hidden.append(x)
    out, final = L.layer_norm_forward(x, P["layernorm.weight"], P["layernorm.bias"], eps)
    if fit["output"] != "hidden":
        out, pool = V.class_token_pool_forward(out)  # (B, D)
    if fit["output"] == "head":
        out, head = L.linear_forward(out, P["head.weight"], P.get("head.bias"))  # (B, classes)

    def backward(dout) -> dict:
        grads: dict = {}
        if fit["output"] == "head":
            dout, grads["head.weight"], grads["head.bias"] = L.linear_backward(dout, head)
        if fit["output"] != "hidden":
            dout = V.class_token_pool_backward(dout, pool)
        dx, grads["layernorm.weight"], grads["layernorm.bias"] = L.layer_norm_backward(dout, final)
        for i in reversed(range(n_layers)):
            dx, layer_grads = V.pre_norm_layer_backward(dx, layers[i])
            grads |= {f"encoder.layer.{i}.{k}": g for k, g in layer_grads.items()}
        dx, grads[POSITIONS] = L.add_positions_backward(dx, positions)
        dx, grads[CLS] = V.prepend_class_token_backward(dx, cls)
        grads["pixels"], grads[PATCH + ".weight"], grads[PATCH + ".bias"] = V.patch_embedding_backward(dx, patch)
        return grads

    return out, backward, hidden


def _record(model: nn.Module, vit: dict, pixels) -> tuple:
    """The module's float64 output, and each block's first call: block -> (args, kwargs, output)."""
    calls: dict = {}

    def keep(block):
        return lambda module, args, kwargs, out: calls.setdefault(block, (args, kwargs, out)) and None

    hooks = [model.get_submodule(b).register_forward_hook(keep(b), with_kwargs=True) for b in vit["blocks"]]
    try:
        with torch.no_grad():
            return model(torch.from_numpy(pixels)).numpy(), calls
    finally:
        for h in hooks:
            h.remove()


def _fit(model: nn.Module, vit: dict, pixels) -> dict | None:
    """The activation, head count and output (hidden states, class token, head) under which the reference agrees
    with the module: its output, else the most blocks in a row, then the closest output (error kept); None where no
    output shape corresponds."""
    out, calls = _record(model, vit, pixels)
    eps = next(m.eps for m in model.modules() if isinstance(m, nn.LayerNorm))
    mha = [m.num_heads for m in model.modules() if isinstance(m, nn.MultiheadAttention)]
    D, P, best, rank = vit["D"], _params(model, vit, np.float64), None, None
    shapes = {"hidden": out.ndim == 3, "class token": out.shape == (2, D), "head": vit["head"] and out.ndim == 2}
    for output in [o for o, fits in shapes.items() if fits]:
        for activation in L.ACTIVATIONS:
            for n_heads in mha[:1] or [h for h in range(1, D + 1) if D % h == 0]:
                fit = dict(output=output, activation=activation, n_heads=n_heads, eps=eps)
                ref, _, hidden = _reference(P, pixels, vit, fit)
                if ref.shape != out.shape:
                    continue
                error = relative_errors({"out": (out, ref)}, np.float64)["out"][1]
                agree = next(
                    (
                        i
                        for i, (b, h) in enumerate(zip(vit["blocks"], hidden[1:], strict=True))
                        if _differs(calls[b][2], h)
                    ),
                    len(hidden),
                )
                if rank is None or (-agree, error) < rank:
                    best, rank = fit | {"error": error, "shape": out.shape, "calls": calls}, (-agree, error)
                if error <= MATCH:
                    return best
    return best


def _compare(model: nn.Module, vit: dict, fit: dict, pixels, dout, dtype) -> list:
    """Rows for the output, the pixels' gradient and every parameter's in `dtype`; float32 bars from the
    reference's own float32 error on each tensor (report.float32_bar)."""
    user = copy_module(model).to(torch.float64 if dtype == np.float64 else torch.float32)
    x = torch.from_numpy(pixels.astype(dtype)).requires_grad_(True)
    out = user(x)
    out.backward(torch.from_numpy(dout.astype(dtype)))
    mine = {"output": out, "dpixel_values": x.grad}
    mine |= {f"d {n}": t.grad for n, t in user.named_parameters() if n in vit["links"]}
    mine = {n: t.detach().double().numpy() for n, t in mine.items()}

    def reference(d):
        ref_out, backward, _ = _reference(_params(model, vit, d), pixels.astype(d), vit, fit)
        grads = backward(dout.astype(d))
        ours = {"output": ref_out, "dpixel_values": grads["pixels"]}
        for n, names in vit["links"].items():
            ours[f"d {n}"] = np.concatenate([grads[k] for k in names]).reshape(mine[f"d {n}"].shape)
        return ours

    ref = reference(dtype)
    label = np.dtype(dtype).name
    errors = relative_errors({n: (mine[n], ref[n]) for n in mine}, dtype)
    if dtype == np.float64:
        return [Row(n, label, e, BAR[np.dtype(dtype)]) for n, (_, e) in errors.items()]
    own = relative_errors({n: (ref[n], r) for n, r in reference(np.float64).items()}, np.float32)
    return [Row(n, label, e, float32_bar(own[n][1]), own=own[n][1]) for n, (_, e) in errors.items()]


def _place(model: nn.Module, vit: dict, fit: dict, pixels, result: Result, judge) -> None:
    """The first part whose output differs (front end, a block, the final norm or head), and a catalogued mistake
    inside that block where the judge's encoder_layer level names one on the block's own recorded call."""
    calls = fit["calls"]
    hidden = _reference(_params(model, vit, np.float64), pixels, vit, fit)[2]  # block 0's input first
    where = vit["final"] if vit["head"] is None else f"{vit['final']} / {vit['head']}"
    if _differs(calls[vit["blocks"][0]][0][0], hidden[0]):
        where = f"{vit['conv']} (the patches, the class token and the positions before the first block)"
    diverging = (b for b, h in zip(vit["blocks"], hidden[1:], strict=True) if _differs(calls[b][2], h))
    block = next(diverging, None) if not where.startswith(vit["conv"]) else None
    if block is not None:
        args, kwargs, _ = calls[block]
        verdict = judge(model.get_submodule(block), "encoder_layer", example=(args, kwargs), norm_first=True,
                        activation=fit["activation"], n_heads=fit["n_heads"], dtypes=("float64",))  # fmt: skip
        for d in verdict.diagnoses:
            d.where = f"{block}.{d.where}" if d.where else block
        where, result.diagnoses = block, list(verdict.diagnoses)
    result.first_divergence = result.diagnoses[0].where if result.diagnoses else where
    if not result.diagnoses:
        result.unexplained = f"{where}: diverges from the reference ViT; no catalogue variant reproduces it"


def _differs(mine: torch.Tensor, ours: np.ndarray) -> bool:
    return relative_errors({"x": (mine.detach().numpy(), ours)}, np.float64)["x"][1] > MATCH
