"""How a block's parts are wired, read from the recorded forward (dataflow.Flow.calls) and compared with the
reference's layer: where each part of a layer computes the reference's on what it is given (judged in situ) and the
layer still diverges, what differs is what each part is given, said in the user's terms (a residual left out, a
part applied to its own output, a part never called, the residual added from another tensor), else the first op of
the block's own forward that is neither a sum nor a view.

Each part's input (and the block's output) is read back through sums and views to the block's input x and the parts'
outputs: a multiset of names. The reference's, pre-norm: norm(x) -> sublayer, x + sublayer -> the next; post-norm:
x -> sublayer, norm(x + sublayer) -> the next."""

from __future__ import annotations

from . import dataflow as DF

SUBLAYERS = {"self_attn": "the attention", "cross_attn": "the cross-attention", "ffn": "the feed-forward"}
ROLES = {*SUBLAYERS, *(f"{s}_norm" for s in SUBLAYERS)}
PASSING = DF.VIEWS | {"dropout", "alpha_dropout", "feature_alpha_dropout"}


def rewired(flow, block: str, unit: str, links, norm_first: bool) -> str | None:
    """What the user's `block` (the reference's layer `unit`, weights `links`) computes otherwise than the reference's
    layer of its norm order, in words; None where its wiring is the reference's or cannot be read."""
    call = next((c for c in flow.calls if c.path == block), None) if flow else None
    held = _roles(block, unit, links)
    if call is None or not call.inputs or call.inputs[0] is None or call.output is None or held is None:
        return None
    label, role = {p: p[len(block) + 1 :] for p in held}, {p[len(block) + 1 :]: r for p, r in held.items()}
    x, y = call.inputs[0], call.output
    parts = [c for c in flow.calls if c.caller == block and c.path in label and c.output]
    parts = [c for c in parts if x.index < c.output.index <= y.index]
    made = {c.output.index: label[c.path] for c in parts}
    read: dict = {}  # each part's (first) input, then the block's output: the names it sums
    for c in parts:
        given = c.inputs[0] if c.inputs else None
        name, seen = label[c.path], None if given is None else _sum(given, x, made, block)
        if seen == (name,):
            return f"{name} is applied twice (to its own output): {name}({name}(...))"
        read.setdefault(name, seen)
    used = {n.param for n in flow.nodes if n.param}  # a part whose weights are read (F.linear(h, self.attn["wq"])) runs
    skipped = [n for n in role if n not in read and not any(f"{u}.".startswith(f"{block}.{n}.") for u in used)]
    if skipped:
        return f"{skipped[0]} ({_what(role[skipped[0]])}) is never called in the block"
    read["output"] = _sum(y, x, made, block)
    want = _reference({r: n for n, r in role.items()}, norm_first)
    for name, got in read.items():
        if isinstance(got, DF.Node):
            return _own(got, block, name, made, x)
        if got is not None and name in want and got != want[name]:
            return _said(name, got, want[name], role)
    return None


def _own(node, block: str, name: str, made: dict, x) -> str:
    """An op of the block's own forward met on the way to `name`'s input: a part's output times a number or a learned
    tensor before it joins the residual (Granite's residual_multiplier), or the block's input x (the stream) times one
    (DeepNorm's alpha, Admin's omega per feature), said with its number or parameter; else the op (with its number
    where it has one)."""
    c, part = DF._factor(node), next((made[p.index] for p in node.parents if p.index in made), None)
    learned = [r for p in node.parents if (r := DF.root(p)).param] if node.op in DF.MULS else []
    by = DF.scaled_by(node) or (f"multiplied by the learned {learned[0].param} {learned[0].shape}" if learned else None)
    if by is not None and part is not None:
        how = f"{node.op} in {block}'s own forward, before it joins the residual"
        return f"{part}'s output is {by} ({how}), where the reference's layer adds it as it is"
    if by is not None and x in node.parents:
        how = f"{node.op} in {block}'s own forward, on its way to {name}"
        return (
            f"the residual stream (the block's input) is {by} ({how}), where the reference's layer carries it as it is"
        )
    op = node.op if c is None else f"{node.op} by {c:.4g}"
    return f"{op} in {block}'s own forward computes what the reference's layer does not ({name} reads it)"


def _roles(block: str, unit: str, links) -> dict | None:
    """The user's parts of `block` (their paths, below it) -> the one reference role whose weights each holds
    (self_attn, ffn_norm, ...); None where a part holds two, or the layer has another role."""
    label: dict = {}
    for link in links:
        for ref, _ in link.parts:
            if ref.startswith(unit + ".") and link.user.startswith(block + "."):
                role = ref[len(unit) + 1 :].split(".")[0]
                path = block + "." + link.user[len(block) + 1 :].split(".")[0]
                if role not in ROLES or label.setdefault(path, role) != role:
                    return None
    return label


def _sum(node, x, made: dict, block: str):
    """The names `node` sums ("x": the block's input, else a part's name; x first, then sorted), read back through
    sums, views and dropout; the first other op of the block's own met (a Node); None: made elsewhere."""
    if node is x or node.index in made:
        return ("x",) if node is x else (made[node.index],)
    if node.op in DF.ADDS and len(node.parents) == 2 or node.op in PASSING and node.parents:
        terms = [_sum(p, x, made, block) for p in node.parents[: None if node.op in DF.ADDS else 1]]
        stop = next((t for t in terms if not isinstance(t, tuple)), ())
        return stop if stop != () else _sorted(sum(terms, ()))
    return node if node.module == block and node.index > x.index else None


def _sorted(names) -> tuple:
    return tuple(sorted(names, key=lambda n: (n != "x", n)))


def _reference(name: dict, norm_first: bool) -> dict:
    """What the reference's layer gives each part (by the user's names `name`: role -> name) and returns."""
    want, stream = {}, ("x",)
    for sub in (s for s in SUBLAYERS if s in name):
        norm = name.get(f"{sub}_norm", "")
        if norm_first:
            want[norm], want[name[sub]], stream = stream, (norm,), _sorted((*stream, name[sub]))
        else:
            want[name[sub]], want[norm], stream = stream, _sorted((*stream, name[sub])), (norm,)
    return want | {"output": stream}


def _said(name: str, got: tuple, want: tuple, role: dict) -> str:
    """What `name` (a part, or "output") reads (`got`) where the reference's layer gives it `want`, in words."""
    missing, extra = [t for t in want if t not in got], [t for t in got if t not in want]
    shown = " + ".join(missing)
    if len(got) == 1 and role.get(got[0]) in SUBLAYERS and got[0] in want:
        kind = SUBLAYERS[role[got[0]]]
        return f"{kind}'s output ({got[0]}) replaces {shown} instead of being added to it (no residual around {kind})"
    if len(missing) == len(extra) == 1:
        normed = " (the normed x)" if role.get(extra[0], "").endswith("_norm") else ""
        return f"the residual adds {extra[0]}'s output{normed} where the reference's layer adds {shown}"
    reads = "the block returns" if name == "output" else f"{name} reads"
    return f"{reads} {' + '.join(got)} where the reference's layer has {' + '.join(want)}"


def _what(role: str) -> str:
    return SUBLAYERS[role] if role in SUBLAYERS else f"{SUBLAYERS[role[:-5]]}'s norm"
