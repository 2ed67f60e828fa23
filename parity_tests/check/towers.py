"""A ViT, a CLIP tower or Whisper's audio encoder judged by the reference's vision pairs (numpy_transformer/vision.py)
and audio front end (audio.py), read from its structure (a Tower): the judge's levels are the text Transformer's, and
these are model classes of their own.

Read from the user's module: the front end (a ViT's patches, by a Conv2d whose stride is its kernel or by F.unfold
and a Linear of C p p numbers, flattened channel first or pixel-major (p p C: vit-pytorch's, read from the Linear's
input), a class token of D numbers and a position table of 1 + N rows, a parameter or an nn.Embedding; Whisper's two
Conv1d over mel frames, fixed sinusoids; a text tower's token nn.Embedding and a learned position table), a LayerNorm
called before the blocks (CLIP's ln_pre), pre-norm blocks (the submodules holding two LayerNorms each, called
batch-first or sequence-first, or an uncalled nn.ModuleList of two halves with a norm each, x + half(x) in turn), a
final LayerNorm after them, and what the forward returns: the hidden
states, the class token's (a text tower's: the end token's, the largest id, or the last position's), or that
through a head (a Linear, or a (D, W) parameter as x @ P). Each block's tensors are read in the order its forward
calls them (norm, q k v fused or not, the output projection, norm, fc1, fc2); the activation, head count and
causality are those under which the outputs agree (a Fit). A copy with weights drawn here and the reference on the
same weights are compared (running.rows) in float64 and float32. Where it fails, the first block that differs is
judged on its own recorded call by the judge's encoder_layer (decoder_only_layer where causal) level (`judge`:
check.module, passed in), and its catalogued mistake is named at the block's place; where none is, the recorded
forward is read for math the reference lacks (unsupported.explain, as a text model's: LayerScale's gain, ...; a
ViT's rotary). A ViT whose tokens are not the class token and the patches (DeiT's distillation token, registers, no
class token and a probe pooling the patches: SigLIP's) is said as no pair where it does not read (_tokens).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from itertools import product

import numpy as np
import torch
from torch import nn

from numpy_transformer import audio as A
from numpy_transformer import layers as L
from numpy_transformer import vision as V
from transformer_spec.families.clip import CLIP_LAYER

from . import dataflow as DF
from . import unsupported as US
from .calling import first_tensor
from .diagnosis import MATCH, Diagnosis, _error
from .report import Result
from .running import Call, Float32Islands, copy_module, find_islands, first_calls, island_message, reference_rows

CALLED = (nn.LayerNorm, nn.Linear, nn.MultiheadAttention)  # what a block's parts are read from, in call order
# the reference's names: ViTModel's, CLIPTextModel's (and head.* for a classifier, text_projection for x @ P)
PATCH, CLS, TOKENS = "embeddings.patch_embeddings.projection", "embeddings.cls_token", "embeddings.token_embedding"
POSITIONS_VIT, PRE = "embeddings.position_embeddings", "pre_layrnorm"  # CLIP's vision tower's norm before the blocks
AUDIO = {"norm1": "self_attn_norm", "q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
         "out": "self_attn.out_proj", "norm2": "ffn_norm", "fc1": "ffn.linear1", "fc2": "ffn.linear2"}  # fmt: skip
NAMES = {
    "vit": (POSITIONS_VIT, "encoder.layer.{}.", V.VIT_LAYER, "layernorm"),
    "text": ("embeddings.position_embedding.weight", "encoder.layers.{}.", CLIP_LAYER, "final_layer_norm"),
    "audio": ("encoder.position_table", "encoder.layers.{}.", AUDIO, "encoder.final_norm"),  # a fixed buffer
}
READ_AS = {"vit": "a ViT", "text": "a CLIP text tower", "audio": "Whisper's audio encoder"}
FRONTS = {"vit": "cuts an image into patches", "audio": "reads mel frames by convolutions"}


@dataclass(frozen=True)
class Tower:
    """A tower as read from its structure: kind ("vit", "text" or "audio"), its inputs (pixels, ids or mel frames),
    the front end's module, the positions' tensor, a norm before the blocks, the blocks (in call order), the final
    norm, links (user parameter -> the reference names its rows hold, in order), width D and head ("head": a Linear,
    "projection": x @ P, None); its output on the inputs (weights drawn: _draw) and each submodule's first call there
    (name -> (args, kwargs, output))."""

    kind: str
    inputs: np.ndarray
    front: str
    positions: str  # a parameter; Whisper's, a buffer
    pre: str | None  # CLIP's ln_pre
    blocks: list
    final: str
    links: dict
    D: int
    head: str | None
    output: np.ndarray
    calls: dict  # submodule name -> its first call (running.Call)
    pixels_last: bool = False  # patches flattened (p p C), pixel-major (vit-pytorch's), not (C p p) as a kernel is


@dataclass(frozen=True)
class Fit:
    """What the reference is run under: output ("hidden", "pooled", "head"), the pooled position, causal or not, the
    activation, head count and eps; the module's error against the reference under them."""

    output: str
    pool: str
    causal: bool
    activation: str
    n_heads: int
    eps: float
    error: float = 0.0


def judge_tower(user: nn.Module, reference: str, judge) -> Result | None:
    """The verdict on `user` as a ViT, a CLIP tower or Whisper's audio encoder; could not judge where its front end
    is an image's or audio's but the rest does not read; None where it is none of them as this module reads them
    (the caller then says why it could not judge)."""
    front, fit, stopped, model = ("text",), None, "no reading of its output agrees in shape", user
    try:  # a module this reading does not fit raises: said where its front end is an image's or audio's
        model = copy_module(user).double().eval()
        _draw(model, np.random.default_rng(0))
        front = _front(model)
        with Float32Islands(model):  # a mask or table made in float32 in the forward computed in float64
            tower = _read(model, front)
        islands = find_islands(model, lambda: model(torch.from_numpy(tower.inputs)))
        P = _params(model, tower)
        fit = _fit(model, tower, P)  # on its own table; judged on Whisper's where its frequencies are all 1
        _whisper_table(tower, P)
    except Exception as exc:
        stopped = _tokens(model, front) or getattr(exc, "answer", None) or f"{type(exc).__name__}: {exc}"
    if fit is None:
        return _unread(reference, front, stopped)
    pairs = "audio.py's and vision.py's" if tower.kind == "audio" else "vision.py's"
    result = Result(reference=f"{reference}, read as {READ_AS[tower.kind]} (numpy_transformer/{pairs} pairs)")
    shown = ("activation", "n_heads", "eps", "output") + ("pool",) * (fit.output != "hidden")
    read = {k: str(getattr(fit, k)) for k in shown + ("causal",) * (tower.kind == "text")}
    read |= {"positions": str(_sinusoids(P[NAMES["audio"][0]]))} if tower.kind == "audio" else {}
    if tower.kind == "text" and not fit.causal:
        said = "passes as a bidirectional encoder (no causal mask); CLIP's text tower is causal: if yours means to be"
        result.caveats.append(("attention.not_causal", f"{said}, this is attention.not_causal"))
    if islands:
        result.caveats.append(("dtype.float32_island", island_message(islands)))
    if fit.error <= MATCH:
        result.conventions = read
    else:
        result.assumed, result.confirmed = read, False
    result.mapping = {u: (", ".join(ours), "its rows in this order" if len(ours) > 1 else "as is")
                      for u, ours in tower.links.items()}  # fmt: skip
    dout = np.random.default_rng(2).standard_normal(tower.output.shape)
    for dtype in (np.float64, np.float32):
        result.rows += _compare(model, tower, P, fit, dout, dtype)
    result.passed = all(r.ok for r in result.rows)
    if not result.passed:
        _place(model, tower, P, fit, result, judge)
    if not (result.passed or result.diagnoses):  # math the reference lacks, read from the forward as an LM's
        with contextlib.suppress(Exception):  # a forward the recorder cannot follow: what _place said stands
            _explain(DF.record(lambda: model(torch.from_numpy(tower.inputs)), model), tower, fit, result)
    return result


def _explain(flow, tower: Tower, fit: Fit, result: Result) -> None:
    """Math the reference lacks in the recorded `flow` (unsupported.explain, a ViT's rotary), or QuickGELU's constant
    mistyped in one layer of a tower whose activation is QuickGELU (SiLU's x sigmoid(x) included), put in `result`."""
    said = US.explain(flow) or (fit.activation == "quick_gelu" and US.quick_gelu_constant(flow))
    said = said or (_rotary(flow) if tower.kind == "vit" else None)
    if isinstance(said, str):
        result.unsupported, result.unexplained = said, None
    elif said:
        result.diagnoses, result.first_divergence, result.unexplained = [said], said.where, None


def _unread(reference: str, front: tuple, stopped: str) -> Result | None:
    """The answer on a tower that did not read: None for a text front end (the caller says why), the no-pair text
    where `stopped` is one (_tokens), else could not judge, naming the front end and what it stopped on."""
    if front[0] == "text" or stopped.startswith("differs at "):
        return None if front[0] == "text" else Result(reference=reference, unsupported=stopped)
    return Result(reference=reference, error=(
        f"could not judge: {front[2]} {FRONTS[front[0]]}, but the rest is not {READ_AS[front[0]]} as check/"
        "towers.py reads it (pre-norm blocks of norm, attention, norm, two linears, a final norm); the judge's "
        f"levels are the text Transformer's (it stopped on: {stopped[:200]})"))  # fmt: skip


def _rotary(flow) -> str | None:
    """A rotary's rotate_half in a ViT, whose reference has positions by its table only: cat (or stack) of -x2 and
    x1, two parts of one tensor (x cos + rotate_half(x) sin), said at the submodule computing it; else None."""
    for node in (n for n in flow.nodes if n.op in ("cat", "stack") and len(n.parents) == 2):
        neg, other = node.parents
        halves = [p for x2 in neg.parents[:1] for p in x2.parents]  # -x2's and x1's source: one tensor
        if neg.op in ("neg", "__neg__") and any(p is q for p in halves for q in other.parents):
            said = "a rotary (x cos + rotate_half(x) sin, rotate_half = cat(-x2, x1)) turns features by angles"
            return US.differs(node.module, f"{said}; the reference ViT's positions are its learned table only")
    return None


def _patches(model: nn.Module, loose: dict) -> tuple | None:
    """(path, channels C, side p) of a ViT's patch embedding: the first Conv2d whose stride is its kernel (larger than
    1 x 1), else a Linear from C p p numbers (C 3 or 1) to a width a loose parameter has (a class token): patches
    cut by F.unfold, each flattened channel first, as a kernel (D, C, p, p) is."""
    for n, m in model.named_modules():
        if isinstance(m, nn.Conv2d) and m.stride == m.kernel_size != (1, 1):
            return n, m.in_channels, m.stride[0]
    widths = {t.numel() for t in loose.values()}
    for n, m in model.named_modules():
        if isinstance(m, nn.Linear) and m.out_features in widths and m.in_features != m.out_features:
            C = next((C for C in (3, 1) if m.in_features % C == 0 and _square(m.in_features // C)), None)
            if C is not None and m.in_features > C:
                return n, C, math.isqrt(m.in_features // C)
    return None


def _front(model: nn.Module) -> tuple:
    """(kind, inputs, front end's module, D, links, positions' parameter, loose parameters) of a ViT (patches, a class
    token and 1 + N positions), Whisper's audio encoder (two Conv1d over mel frames, the second of stride 2, and a
    (frames, D) buffer of positions) or a text tower (one nn.Embedding and a learned position table)."""
    owned = (*CALLED, nn.Conv1d, nn.Conv2d, nn.Embedding)
    loose = {n: t for n, t in model.named_parameters() if not isinstance(model.get_submodule(_up(n)), owned)}
    patches = _patches(model, loose)
    convs = [n for n, m in model.named_modules() if isinstance(m, nn.Conv1d) and m.kernel_size != (1,)]
    tables = [n for n, m in model.named_modules() if isinstance(m, nn.Embedding)]
    placed = [n for n in tables if "pos" in n.rsplit(".", 1)[-1]]  # a position table as an nn.Embedding (CLIP's)
    if patches is not None:
        name, C, p = patches
        D = model.get_submodule(name).weight.shape[0]
        cls = next((n for n, t in loose.items() if t.numel() == D), None)
        embedded = {f"{n}.weight": model.get_submodule(n).weight for n in placed}
        held = loose | embedded  # a (rows, D) matrix is a table with a class token's row only: not a projection's
        grids = {n: _grid(t.numel() // D, t.ndim != 2 or n in embedded) for n, t in held.items() if t.shape[-1] == D}
        pos = max((n for n, g in grids.items() if g), key=lambda n: held[n].numel(), default=None)
        if cls is None or pos is None:
            raise ValueError("patches without a class token of D numbers or a table of 1 + N positions")
        side = p * math.isqrt(grids[pos])
        inputs = np.random.default_rng(1).standard_normal((2, C, side, side))
        links = {f"{name}.weight": [f"{PATCH}.weight"], f"{name}.bias": [f"{PATCH}.bias"], cls: [CLS]}
        return "vit", inputs, name, D, links, pos, loose
    if len(convs) == 2 and model.get_submodule(convs[1]).stride == (2,):
        conv = model.get_submodule(convs[0])
        D = conv.out_channels
        table = next((n for n, b in model.named_buffers() if b.ndim == 2 and b.shape[1] == D), None)
        if conv.in_channels == D or table is None:
            raise ValueError("two Conv1d without mel bins in or a (frames, D) buffer of positions")
        inputs = np.random.default_rng(1).standard_normal((2, conv.in_channels, 2 * len(model.get_buffer(table))))
        links = {f"{c}.{k}": [f"encoder.conv{i}.{k}"] for i, c in enumerate(convs, 1) for k in ("weight", "bias")}
        return "audio", inputs, convs[0], D, links, table, loose
    tokens = [n for n in tables if n not in placed]
    if len(tokens) != 1 or len(placed) > 1:
        raise ValueError(f"{len(tokens)} token tables and {len(placed)} position tables, not one and at most one")
    vocab, D = model.get_submodule(tokens[0]).weight.shape
    loose = loose | {f"{n}.weight": model.get_submodule(n).weight for n in placed}
    pos = next((n for n, t in loose.items() if t.ndim >= 2 and t.shape[-1] == D and t.numel() // D > 2), None)
    if pos is None:
        raise ValueError(f"no learned position table of width {D}")
    T = min(8, loose[pos].numel() // D)
    inputs = np.random.default_rng(1).integers(1, vocab - 1, (2, T))
    inputs[0, T // 2], inputs[1, T - 2] = vocab - 1, vocab - 1  # the end token (the largest id), not last
    return "text", inputs, tokens[0], D, {f"{tokens[0]}.weight": [f"{TOKENS}.weight"]}, pos, loose


def _read(model: nn.Module, front: tuple) -> Tower:
    """The Tower `model` is, as its structure reads from its front end (_front); raises ValueError where a part is
    missing."""
    kind, inputs, first, D, links, pos, loose = front
    positions, layer, names, final_name = NAMES[kind]
    links[pos] = [positions]
    order: list = []  # the submodules' names in the order the forward first calls them
    with first_calls(model.named_modules(), order) as calls, torch.no_grad():
        output = first_tensor(model(torch.from_numpy(inputs))).numpy()

    def norms(name):
        return sum(isinstance(m, nn.LayerNorm) for m in model.get_submodule(name).modules())

    early = [n for n in order[: order.index(first)] if isinstance(model.get_submodule(n), nn.LayerNorm)]
    if early:  # vit-pytorch's norm over each patch's pixels: the reference's first op on them is the patch kernel
        raise US.NoPair(early[0], f"a LayerNorm over the inputs before {first}, the front end, normalises them")
    blocks = [n for n in order if n and norms(n) == 2 and norms(_up(n)) > 2 and not first.startswith(f"{n}.")]
    blocks = blocks or _halves(model, order, calls, norms)
    inside = [n for n in order if any(n.startswith(b + ".") for b in blocks)]
    outside = [n for n in order if isinstance(model.get_submodule(n), CALLED) and n not in inside]
    start = order.index(blocks[0]) if blocks else 0
    if first not in order[:start]:
        raise ValueError(f"no blocks of two LayerNorms each, or {first} not called before them")

    def called(kind, before=False):  # the first part of `kind` called outside the blocks, before them or after
        found = (n for n in outside if isinstance(model.get_submodule(n), kind) and (order.index(n) < start) == before)
        return next(found, None)

    pre, final, head = called(nn.LayerNorm, before=True), called(nn.LayerNorm), called(nn.Linear)
    if final is None:
        raise ValueError("no final LayerNorm after the blocks")
    for i, block in enumerate(blocks):
        links |= _block_parts(model, [n for n in inside if n.startswith(block + ".")], layer.format(i), names)
    for name, ours in ((pre, PRE), (final, final_name), (head, "head")):
        links |= {f"{name}.{k}": [f"{ours}.{k}"] for k in ("weight", "bias")} if name else {}
    projection = next((n for n, t in loose.items() if t.ndim == 2 and t.shape[0] == D and n != pos), None)
    if head is None and projection is not None:  # x @ P, P (D, W)
        links[projection] = ["text_projection (x @ P)"]
    held = dict(model.named_parameters())
    links = {u: ours for u, ours in links.items() if u in held}
    head = "head" if head else "projection" if projection else None
    last = _pixels_last(model.get_submodule(first), inputs, calls.get(first))
    return Tower(kind, inputs, first, pos, pre, blocks, final, links, D, head, output, calls, last)


def _pixels_last(module: nn.Module, inputs: np.ndarray, call) -> bool:
    """Whether a patch Linear's recorded input holds each patch flattened pixel-major, channel last ((p1 p2 c):
    vit-pytorch's Rearrange), its weight then the kernel (D, C, p, p) viewed (D, p, p, C)."""
    if not isinstance(module, nn.Linear) or call is None or inputs.ndim != 4:
        return False
    (B, C, S, _), p = inputs.shape, math.isqrt(module.in_features // inputs.shape[1])
    g = S // p
    last = inputs.reshape(B, C, g, p, g, p).transpose(0, 2, 4, 3, 5, 1).reshape(B, g * g, p * p * C)
    return torch.is_tensor(call.args[0]) and call.args[0].shape == last.shape and not _differs(call.args[0], last)


class _Halves(nn.ModuleList):
    """A block held as its two halves (attention, feed-forward), each with its norm inside, called by the parent as
    x = half(x) + x in turn (vit-pytorch's `for attn, ff in self.layers`): run as one block."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for half in self:
            x = half(x) + x
        return x


def _halves(model: nn.Module, order: list, calls: dict, norms) -> list:
    """The blocks of a tower whose block is an nn.ModuleList never called, of two called halves with a LayerNorm
    each, the second reading x + first(x) (read from the recorded calls): each made a _Halves, its call (run on the
    first half's input) put in `calls` and its name in `order` before its halves'."""
    blocks = []
    for name in [n for n in order if n and norms(n) == 1]:
        parent, halves = _up(name), [calls[n] for n in order if _up(n) == _up(name)]
        container = model.get_submodule(parent)
        if parent in blocks or type(container) is not nn.ModuleList or len(halves) != 2 or norms(parent) != 2:
            continue
        (first, second), x = halves, halves[0].args[0] if halves[0].args else None
        if not torch.is_tensor(x) or _differs(second.args[0], (x + first.output).numpy()):
            continue
        container.__class__ = _Halves
        with torch.no_grad():
            calls[parent] = Call(container, (x,), {}, container(x))
        order.insert(order.index(name), parent)
        blocks.append(parent)
    return blocks


def _up(name: str) -> str:
    return name.rpartition(".")[0]


def _grid(rows: int, other: bool) -> int:
    """The patches N a table of `rows` positions is read for: rows - 1 (a class token's row first), else where `other`
    rows (none) or rows - 2 (a second token's: DeiT's; both refused later: _tokens); 0 where none is a square."""
    return next((n for n in (rows - 1, rows, rows - 2)[: 1 + 2 * other] if rows > 1 and _square(n)), 0)


def _tokens(model: nn.Module, front: tuple) -> str | None:
    """The no-pair answer on a ViT whose tokens are not the reference's (its class token and patches): learned tokens
    (1, k, D) put in beside the class token (DeiT's distillation token, registers), or a table of N rows, none for a
    class token, and a learned (1, 1, D) parameter pooling the patches in its place (SigLIP's probe); else None."""
    if front[0] != "vit":
        return None
    D, pos, loose = front[3], front[5], front[6]
    shaped = [n for n, t in loose.items() if t.ndim == 3 and t.shape[0] == 1 and t.shape[-1] == D and n != pos]
    rows, cls = model.state_dict()[pos].numel() // D, next((n for n, t in loose.items() if t.numel() == D), None)
    if _square(rows) and cls in shaped:
        what = f"{cls} ({D} numbers) pools the patches, where {pos} holds {rows} rows, one per patch, no class token"
        return US.differs(_up(cls), f"{what} (the reference reads the class token's row)")
    extra = [n for n in shaped if n != cls]
    if not extra:
        return None
    what = f"{extra[0]} puts {loose[extra[0]].shape[1]} learned token(s) in the sequence beside the class token {cls}"
    return US.differs(_up(extra[0]), f"{what} (the reference's sequence is its class token and the patches)")


def _square(n: int) -> bool:
    return n > 0 and math.isqrt(n) ** 2 == n


def _block_parts(model: nn.Module, names: list, layer: str, ours: dict) -> dict:
    """A block's parameters -> the reference's tensors (`layer` + `ours`' name of each part, "q.weight", ...) their
    rows hold, from the order its forward calls the submodules `names`; raises where it is not norm, attention,
    norm, fc1, fc2."""
    calls = [n for n in names if isinstance(model.get_submodule(n), CALLED)]
    mha = [c for c in calls if isinstance(model.get_submodule(c), nn.MultiheadAttention)]
    calls = [n for n in calls if not any(n.startswith(c + ".") for c in mha)]  # not an nn.MultiheadAttention's linears
    kinds = [next(k for k in CALLED if isinstance(model.get_submodule(n), k)) for n in calls]  # a subclass as its base
    if kinds.count(nn.LayerNorm) != 2 or kinds[0] is not nn.LayerNorm:
        raise ValueError(f"a block calling {[k.__name__ for k in kinds]}, not norm, attention, norm, fc1, fc2")
    second = kinds.index(nn.LayerNorm, 1)
    attention, mlp = calls[1:second], calls[second + 1 :]
    if len(mlp) != 2:
        raise ValueError(f"{len(mlp)} linears after a block's second norm, not fc1 and fc2")
    if len(attention) == 1 and kinds[1] is nn.MultiheadAttention:  # in_proj (3D, D) then out_proj
        attention = [f"{attention[0]}.in_proj_", f"{attention[0]}.out_proj."]
    else:
        attention = [f"{n}." for n in attention]
    roles = {2: (("q", "k", "v"), ("out",)), 4: (("q",), ("k",), ("v",), ("out",))}  # fused q k v, or each its own
    if len(attention) not in roles:
        raise ValueError(f"{len(attention)} linears in a block's attention, not q k v fused or not and out")
    sources = [calls[0] + ".", *attention, calls[second] + ".", *(n + "." for n in mlp)]
    parts = [("norm1",), *roles[len(attention)], ("norm2",), ("fc1",), ("fc2",)]
    return {f"{s}{k}": [f"{layer}{ours[o]}.{k}" for o in held] for s, held in zip(sources, parts, strict=True)
            for k in ("weight", "bias")}  # fmt: skip


def _draw(model: nn.Module, rng) -> None:
    """Weights drawn for the check: matrices ~ N(0, 1/fan_in), norm scales near 1, the rest small (no identity)."""
    with torch.no_grad():
        for name, t in model.named_parameters():
            if isinstance(model.get_submodule(_up(name)), nn.Embedding):
                values = rng.standard_normal(t.shape)
            elif t.ndim >= 2 and t.shape[0] > 1:
                values = rng.standard_normal(t.shape) / math.sqrt(t[0].numel())
            elif name.endswith("weight") and isinstance(model.get_submodule(_up(name)), nn.LayerNorm):
                values = 1.0 + 0.2 * rng.standard_normal(t.shape)
            else:
                values = 0.2 * rng.standard_normal(t.shape)
            t.copy_(torch.from_numpy(values))


def _params(model: nn.Module, tower: Tower) -> dict:
    """The reference's tensors (our names, float64) from the module's: fused ones split by rows, each weight's
    missing bias zero."""
    params = {}
    for user_name, ours in tower.links.items():
        value = model.get_parameter(user_name).detach().double().numpy()
        params |= dict(zip(ours, np.split(value, len(ours)), strict=True))
    positions = NAMES[tower.kind][0]  # a parameter, or Whisper's buffer
    params[positions] = model.state_dict()[tower.positions].double().numpy().reshape(-1, tower.D)
    if tower.kind == "audio" and _sinusoids(params[positions]) is None:
        raise ValueError(f"{tower.positions}: positions neither Whisper's sinusoids nor the paper's")
    if tower.kind == "vit":  # an unfold's Linear (D, C p p) as the kernel (D, C, p, p)
        C, side = tower.inputs.shape[1], math.isqrt(params[f"{PATCH}.weight"][0].size // tower.inputs.shape[1])
        kernel = params[f"{PATCH}.weight"].reshape(tower.D, -1, side, side)  # (C p p)
        if tower.pixels_last:  # (p p C)
            kernel = params[f"{PATCH}.weight"].reshape(tower.D, side, side, C).transpose(0, 3, 1, 2)
        params[f"{PATCH}.weight"] = kernel
    for name, value in list(params.items()):
        if name.endswith(".weight"):
            params.setdefault(name.removesuffix("weight") + "bias", np.zeros(len(value)))
    return params


def _embedded(P: dict, tower: Tower, eps: float):
    """The front end's forward on the tensors `P` (in the dtype wanted): (the first block's input, backward(dx) -> the
    front end's gradients by our names, and "inputs" (a ViT's pixels'))."""
    positions_name, kind = NAMES[tower.kind][0], tower.kind
    inputs = tower.inputs if kind == "text" else tower.inputs.astype(P[positions_name].dtype)
    if kind == "vit":
        x, patch = V.patch_embedding_forward(inputs, P[f"{PATCH}.weight"], P[f"{PATCH}.bias"])  # (B, N, D)
        x, cls = V.prepend_class_token_forward(x, P[CLS])  # (B, 1 + N, D)
    elif kind == "text":
        x, tokens = L.embedding_forward(inputs, P[f"{TOKENS}.weight"])  # (B, T, D)
    else:  # Whisper's front end: conv1, GELU, conv2 (stride 2), GELU, its fixed table of S rows (_params) added
        convs = {k.removeprefix("encoder."): v for k, v in P.items() if k.startswith("encoder.conv")}
        x, audio = A.audio_embed_forward(convs, inputs, P[positions_name])  # (B, S, D)
    if kind != "audio":
        x, positions = L.add_positions_forward(x, P[positions_name])
    if tower.pre:  # CLIP's ln_pre
        x, pre = L.layer_norm_forward(x, P[f"{PRE}.weight"], P[f"{PRE}.bias"], eps)

    def backward(dx) -> dict:
        grads: dict = {}
        if tower.pre:
            dx, grads[f"{PRE}.weight"], grads[f"{PRE}.bias"] = L.layer_norm_backward(dx, pre)
        if kind == "audio":
            return {f"encoder.{k}": g for k, g in A.audio_embed_backward(dx, audio).items()} | grads
        dx, grads[positions_name] = L.add_positions_backward(dx, positions)
        if kind == "text":
            return grads | {f"{TOKENS}.weight": L.embedding_backward(dx, tokens)}
        dx, grads[CLS] = V.prepend_class_token_backward(dx, cls)
        grads["inputs"], grads[f"{PATCH}.weight"], grads[f"{PATCH}.bias"] = V.patch_embedding_backward(dx, patch)
        return grads

    return x, backward


def _reference(P: dict, tower: Tower, fit: Fit, dtype=np.float64):
    """The reference's forward in `dtype` on the tensors `P` (_params): (output, backward, the hidden states before
    and after each block); backward(dout) -> the gradients by our names, and "inputs" (a ViT's pixels')."""
    _, layer, names, final_name = NAMES[tower.kind]
    n_layers, eps, inputs = len(tower.blocks), fit.eps, tower.inputs
    P = {k: v.astype(dtype) for k, v in P.items()}
    x, front = _embedded(P, tower, eps)
    layers, hidden = [], [x]
    for i in range(n_layers):
        own = {k[len(layer.format(i)) :]: v for k, v in P.items() if k.startswith(layer.format(i))}
        x, cache = V.pre_norm_layer_forward(own, x, names, fit.n_heads, eps, fit.activation, fit.causal)
        layers.append(cache)
        hidden.append(x)
    out, final = L.layer_norm_forward(x, P[f"{final_name}.weight"], P[f"{final_name}.bias"], eps)
    if fit.output not in ("hidden", "frames"):
        at = {"class token": 0, "last": out.shape[1] - 1}
        where = inputs.argmax(-1) if fit.pool.startswith("end") else np.full(len(inputs), at[fit.pool])  # (B,)
        out, pool = V.token_pool_forward(out, where)  # (B, D)
    if fit.output in ("head", "frames"):
        weight = P["head.weight"] if tower.head == "head" else P["text_projection (x @ P)"].T
        out, head = L.linear_forward(out, weight, P.get("head.bias"))  # (B, classes), or (B, S, classes)
    if fit.pool == "log_softmax":  # out - logsumexp(out)
        out = out - np.logaddexp.reduce(out, axis=-1, keepdims=True)

    def backward(dout) -> dict:
        grads: dict = {}
        if fit.pool == "log_softmax":  # dz = g - softmax(z) sum(g)
            dout = dout - np.exp(out) * dout.sum(-1, keepdims=True)
        if fit.output in ("head", "frames"):
            dout, dw, grads["head.bias"] = L.linear_backward(dout, head)
            grads["head.weight"], grads["text_projection (x @ P)"] = dw, dw.T
        if fit.output not in ("hidden", "frames"):
            dout = V.token_pool_backward(dout, pool)
        dx, grads[f"{final_name}.weight"], grads[f"{final_name}.bias"] = L.layer_norm_backward(dout, final)
        for i in reversed(range(n_layers)):
            dx, layer_grads = V.pre_norm_layer_backward(dx, layers[i])
            grads |= {f"{layer.format(i)}{k}": g for k, g in layer_grads.items()}
        return grads | front(dx)

    return out, backward, hidden


def _fit(model: nn.Module, tower: Tower, P: dict) -> Fit | None:
    """The Fit under which the reference agrees with the module: its output, else the most blocks in a row, then
    the closest output; None where no output shape corresponds."""
    out, calls = tower.output, tower.calls
    eps = next(m.eps for m in model.modules() if isinstance(m, nn.LayerNorm))
    mha = [m.num_heads for m in model.modules() if isinstance(m, nn.MultiheadAttention)]
    D, best, rank = tower.D, None, None
    shapes = {"hidden": out.ndim == 3, "pooled": out.shape == (2, D), "head": tower.head and out.ndim == 2,
              "frames": tower.kind == "audio" and tower.head == "head" and out.ndim == 3}  # fmt: skip
    text = tower.kind == "text"
    pools = ("end token (the largest id)", "last") if text else ("class token",)
    masks = (True, False) if text else (False,)  # a text tower causal (CLIP's) or not; a ViT never
    heads = mha[:1] or [h for h in range(1, D + 1) if D % h == 0]
    outputs = [o for o, fits in shapes.items() if fits]
    for output, pool, causal, activation, n_heads in product(outputs, pools, masks, L.ACTIVATIONS, heads):
        if output in ("hidden", "frames") and pool != pools[0]:
            continue  # nothing pooled
        if output == "frames":  # a head on every position, its logits or their log_softmax (CTC's)
            pool = "log_softmax" if np.allclose(np.logaddexp.reduce(out, axis=-1), 0.0) else "logits"
        fit = Fit(output, pool, causal, activation, n_heads, eps)
        ref, _, hidden = _reference(P, tower, fit)
        if ref.shape != out.shape:
            continue
        error = _error(out, ref)
        agree = next((i for i, b in enumerate(tower.blocks) if _differs(calls[b].output, hidden[i + 1])), len(hidden))
        if rank is None or (-agree, error) < rank:
            best, rank = dataclasses.replace(fit, error=error), (-agree, error)
        if error <= MATCH:
            return best
    return best


def _compare(model: nn.Module, tower: Tower, P: dict, fit: Fit, dout, dtype) -> list:
    """Rows for the output, a ViT's pixels' gradient and every parameter's in `dtype` (running.reference_rows)."""
    user = copy_module(model).to(torch.float64 if dtype == np.float64 else torch.float32)
    x = torch.from_numpy(tower.inputs)
    x = x.to(next(user.parameters()).dtype).requires_grad_(True) if x.is_floating_point() else x
    with Float32Islands(user) if dtype == np.float64 else contextlib.nullcontext():
        out = first_tensor(user(x))
    out.backward(torch.from_numpy(dout.astype(dtype)))
    mine = {"output": out} | ({"dpixel_values": x.grad} if tower.kind == "vit" else {})
    mine |= {f"d {n}": torch.zeros_like(t) if t.grad is None else t.grad  # not reached by the output: zero
             for n, t in user.named_parameters() if n in tower.links}  # fmt: skip
    mine = {n: t.detach().double().numpy() for n, t in mine.items()}

    def reference(d):
        ref_out, backward, _ = _reference(P, tower, fit, d)
        grads = backward(dout.astype(d))
        if tower.pixels_last:  # the kernel's gradient (D, C, p, p) in the Linear's order (D, p, p, C)
            grads[f"{PATCH}.weight"] = grads[f"{PATCH}.weight"].transpose(0, 2, 3, 1)
        ours = {"output": ref_out} | ({"dpixel_values": grads["inputs"]} if "inputs" in grads else {})
        for n, names in tower.links.items():
            flat = np.concatenate([grads.get(k, np.zeros(0)) for k in names]).reshape(-1)
            ours[f"d {n}"] = flat.reshape(mine[f"d {n}"].shape) if flat.size else np.zeros(mine[f"d {n}"].shape)
        return ours

    return reference_rows(mine, reference, dtype)


def _place(model: nn.Module, tower: Tower, P: dict, fit: Fit, result: Result, judge) -> None:
    """The first part whose output differs (front end, a block, the final norm or head), and a catalogued mistake
    inside that block where the judge's layer level names one on the block's own recorded call."""
    calls, blocks = tower.calls, tower.blocks
    hidden = _reference(P, tower, fit)[2]  # block 0's input first
    where = tower.final
    if _differs(calls[blocks[0]].args[0], hidden[0]):
        where = f"{tower.front} (the front end: its table, tokens and positions before the first block)"
        result.diagnoses = _front_mistakes(tower, P, calls[blocks[0]].args[0]) if tower.kind == "vit" else []
        result.diagnoses += _table_mistakes(model, tower, P, calls[blocks[0]].args[0]) if tower.kind == "audio" else []
    diverging = (b for i, b in enumerate(blocks) if _differs(calls[b].output, hidden[i + 1]))
    block = next(diverging, None) if where == tower.final else None
    if block is not None:
        level = "decoder_only_layer" if fit.causal else "encoder_layer"
        read = dict(norm_first=True, activation=fit.activation, n_heads=fit.n_heads, dtypes=("float64",))
        verdict = judge_block(model, block, blocks[0], calls, lambda b, **kw: judge(b, level, **read, **kw))
        for d in verdict.diagnoses:
            d.where = f"{block}.{d.where}" if d.where else block
        where, result.diagnoses = block, list(verdict.diagnoses)
    result.first_divergence = result.diagnoses[0].where if result.diagnoses else where
    if not result.diagnoses:
        result.unexplained = f"{where}: diverges from the reference tower; no catalogue variant reproduces it"


def judge_block(model: nn.Module, block: str, first: str, calls: dict, judge) -> Result:
    """The verdict on `block` on its own recorded call (`calls`) by `judge` (module, **kw), under the map the `first`
    block passes by where `block` is a later one holding parameters of the same names: a model stores its layers
    alike, so a block computing with them otherwise (its queries by the keys' projection) is judged as that."""

    def held(name: str) -> list:
        return [n for n, _ in model.get_submodule(name).named_parameters()]

    def given(name: str, **kw) -> Result:
        return judge(model.get_submodule(name), example=(calls[name].args, calls[name].kwargs), **kw)

    earlier = given(first) if block != first and held(block) == held(first) else None
    return given(block, mapping=earlier.mapping if earlier is not None and earlier.passed else None)


def _front_mistakes(tower: Tower, P: dict, mine: torch.Tensor) -> list:
    """The catalogue's ViT front-end mistake where it reproduces the first block's input `mine`: positions added
    before the class token is put in front (patch n gets row n - 1, the class token none)."""
    x, _ = V.patch_embedding_forward(tower.inputs, P[f"{PATCH}.weight"], P[f"{PATCH}.bias"])  # (B, N, D)
    x, _ = V.prepend_class_token_forward(x + P[POSITIONS_VIT][: x.shape[1]], P[CLS])  # (B, 1 + N, D)
    if _differs(mine, x):
        return []
    pos = next(u for u, ours in tower.links.items() if ours == [POSITIONS_VIT])
    said = "the positions added to the patch tokens before the class token is put in front (patch n gets row n - 1)"
    return [Diagnosis("positions.added_before_class_token", said, pos, _error(mine.numpy(), x))]


def _table_mistakes(model: nn.Module, tower: Tower, P: dict, mine: torch.Tensor) -> list:
    """positions.wrong_frequencies where the module's table is Whisper's at frequency 1 in every channel (sin t, then
    cos t) and the first block's input `mine` is the front end's with it."""
    table = model.state_dict()[tower.positions].double().numpy().reshape(-1, tower.D)
    convs = {k.removeprefix("encoder."): v for k, v in P.items() if k.startswith("encoder.conv")}
    x, _ = A.audio_embed_forward(convs, tower.inputs, table)
    if _sinusoids(table) != ALL_ONES or _differs(mine, x):
        return []
    said = "Whisper's sinusoids at frequency 1 in every channel, not exp(-i log(10000) / (D/2 - 1))"
    return [Diagnosis("positions.wrong_frequencies", said, _up(tower.positions), _error(mine.numpy(), x))]


def _whisper_table(tower: Tower, P: dict) -> None:
    """Whisper's sinusoids put in `P` where the module's table is them at frequency 1 in every channel (ALL_ONES)."""
    if tower.kind == "audio" and _sinusoids(table := P[NAMES["audio"][0]]) == ALL_ONES:
        P[NAMES["audio"][0]] = A.whisper_sinusoids(*table.shape)


ALL_ONES = "Whisper's layout at frequency 1 in every channel"


def _all_ones(S: int, D: int) -> np.ndarray:
    """(S, D): sin(t) in the first half of the channels, cos(t) in the second (every frequency 1)."""
    t = np.arange(S, dtype=np.float64)[:, None].repeat(D // 2, axis=1)
    return np.concatenate([np.sin(t), np.cos(t)], axis=1)


def _sinusoids(table: np.ndarray) -> str | None:
    """Which of the reference's fixed tables of positions `table` (S, D) holds, to float32's rounding, or None (the
    catalogue's frequencies all 1: ALL_ONES)."""
    S, D = table.shape
    known = {"Whisper's sinusoids (sines, then cosines)": A.whisper_sinusoids(S, D),
             "the paper's sinusoids (interleaved)": L.sinusoidal_table(S, D), ALL_ONES: _all_ones(S, D)}  # fmt: skip
    return next((said for said, ours in known.items() if _error(table, ours) <= 1e-6), None)


def _differs(mine: torch.Tensor, ours: np.ndarray) -> bool:
    """Whether a hidden state differs from the reference's (B, T, D), read sequence-first (T, B, D) where so shaped."""
    mine = mine.transpose(0, 1) if mine.shape != ours.shape and mine.ndim == 3 else mine
    return _error(mine.detach().numpy(), ours) > MATCH
