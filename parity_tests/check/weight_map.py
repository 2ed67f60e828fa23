"""The weight map as the result gives it, and back: built once from the links (mapping.Link) as data.

`result.mapping` is {user parameter: MapEntry}: the pair (reference name(s), layout note) carrying what it was made
from (the Link, a reference bias held at zero, a fixed table matched by its values). Passed back as `mapping=`,
entries are read from that data (the CLI's JSON writes it as a third element); only a map written by hand,
(reference name, layout note) pairs, is read from its notes, in the syntax the report prints.
"""

from __future__ import annotations

import dataclasses
import re

from .mapping import Link, gather, rows_of

HELD = "held at zero: the user's layer has no bias; gradient not compared"
HELD_SINK = "held at zero: the user's softmax has a 1 in its denominator, a sink at logit 0; gradient not compared"
FIXED = "equal to float32 precision; overwritten in float64"


class MapEntry(tuple):
    """(reference name(s), layout note), with `link` (a Link, or None) and `kind`: "link", "zero" or "fixed"."""

    link: Link | None
    kind: str

    def __new__(cls, reference: str, note: str, link: Link | None = None, kind: str = "link"):
        entry = super().__new__(cls, (reference, note))
        entry.link, entry.kind = link, kind
        return entry

    def __getnewargs__(self):  # copies and pickles keep the data
        return (self[0], self[1], self.link, self.kind)

    def data(self) -> dict:
        """The JSON form of what the entry was made from."""
        link = dataclasses.asdict(self.link) if self.link is not None else {}
        return {"kind": self.kind} | {k: v for k, v in link.items() if k != "user"}


def note(link: Link) -> str:
    """The link's layout as the report prints it and _from_note reads back: "as is", "rows a:b", "fused rows q, k, v",
    "after N unread rows", "minus 1 (...)"; then ", columns a:b:s" (Link.columns; b blank: to the end), ", transposed",
    ", split into H heads" (a 3-axis tensor; ", each transposed": (H, in, Dh); ", stored in the axis order a b c":
    Link.axes), ", RoPE pairs interleaved (head size Dh)" or ", q/k features of each head in the order o_0 o_1 ..."
    (Link.rope_order). Rows of several units (a projection sliced per layer): "fused rows" and each part's full
    name."""
    roles = [n.split(".")[-2].removesuffix("_proj") for n, _ in link.parts if "." in n]
    if len({_unit(n) for n, _ in link.parts}) > 1:  # several units' (a projection sliced per layer)
        text = "fused rows " + ", ".join(n.rpartition(".")[0] for n, _ in link.parts)
    elif len(set(roles)) > 1 and len(roles) > 3 and roles == roles[:3] * (len(roles) // 3):  # GPT-NeoX's, head by head
        text = f"fused rows {', '.join(roles[:3])}, head by head"
    elif len(set(roles)) == 2 < len(roles) and roles == roles[:2] * (len(roles) // 2):  # gate, up interleaved
        text = f"fused rows {', '.join(roles[:2])}, row by row"
    elif len(set(roles)) > 1:
        text = "fused rows " + ", ".join(roles)
    elif link.parts[0][1] is not None:  # of one tensor (several runs: MLA's kv_b_proj's keys and values reordered)
        text = "rows " + ", ".join("{}:{}".format(*rows) for _, rows in link.parts)
    elif link.offset:
        text = f"after {link.offset} unread rows"
    else:
        text = "minus 1 (scaled by 1 + weight)" if link.minus_one else ""
    split = f"split into {link.heads} heads" + ", each transposed" * link.each_transposed if link.heads else ""
    split += f", stored in the axis order {' '.join(map(str, link.axes))}" * bool(link.axes)
    columns = "columns {0}:{2}:{1}".format(*link.columns, "") if link.columns else ""
    text = ", ".join(t for t in (text, columns, "transposed" * link.transposed, split) if t) or "as is"
    order = f", q/k features of each head in the order {' '.join(map(str, link.rope_order))}" * bool(link.rope_order)
    return text + (f", RoPE pairs interleaved (head size {link.rope_pairs})" if link.rope_pairs else order)


def _unit(name: str) -> str:
    """The reference unit a tensor name is of: its path less the tensor and its projection ("" at the top)."""
    return ".".join(name.split(".")[:-2])


def _reference_name(link: Link) -> str:
    """One reference name, or a fused projection's as {q,k,v}_proj.weight."""
    names = list(dict.fromkeys(n for n, _ in link.parts))
    if len(names) == 1:
        return names[0]
    split = [n.split(".") for n in names]
    if len(set(map(_unit, names))) > 1 and len(set(map(len, split))) == 1:  # several units': braced
        words = (list(dict.fromkeys(c)) for c in zip(*split, strict=True))
        return ".".join(f"{{{','.join(w)}}}" if len(w) > 1 else w[0] for w in words)
    parts = names[0].split(".")
    prefix = ".".join(parts[:-2]) + "." if len(parts) > 2 else ""
    stems = list(dict.fromkeys(n.split(".")[-2] for n in names))  # head by head: each role once
    suffix = "_proj" if all(s.endswith("_proj") for s in stems) else ""  # {q,k,v}_proj; a block's {gate,linear1}
    return f"{prefix}{{{','.join(s.removesuffix(suffix) for s in stems)}}}{suffix}.{parts[-1]}"


def table(links: list, model, layout: str) -> dict:
    """The map as the result gives it: user name -> MapEntry; the reference biases `model` (session.Model) holds at
    zero, and its fixed tables (matched like weights, and said so: in `layout`)."""
    out: dict = {}
    for link in links:  # a tensor linked again (a module run at several depths): its first link
        out.setdefault(link.user, MapEntry(_reference_name(link), note(link), link))
    for name in model.zero:
        out[f"(no parameter: {name})"] = MapEntry(name, HELD_SINK if name.endswith("sinks") else HELD, kind="zero")
    fixed = MapEntry(f"(the fixed sinusoid table, {layout})", FIXED, kind="fixed")
    return out | dict.fromkeys(model.overwrite, fixed)


def links_from(given: dict) -> tuple[list, list]:
    """A user's mapping= read back into links and zero-held biases."""
    read = {user: _read(user, value) for user, value in given.items()}
    zero = [given[user][0] for user, (kind, _) in read.items() if kind == "zero"]
    return [link for kind, link in read.values() if kind == "link"], zero


def _read(user: str, value) -> tuple[str, Link | None]:
    """(kind, Link or None) from an entry's data (a MapEntry, the JSON's third element), else from its note."""
    if isinstance(value, MapEntry):
        return value.kind, value.link
    if isinstance(value, (list, tuple)) and len(value) == 3 and isinstance(value[2], dict):
        data = value[2]
        if "parts" not in data:
            return data.get("kind", "link"), None
        parts = [(name, tuple(rows) if rows is not None else None) for name, rows in data["parts"]]
        given = {f.name: type(f.default)(data[f.name]) for f in dataclasses.fields(Link)[2:] if f.name in data}
        return "link", Link(user, parts, **given)
    ref, note = (value, "as is") if isinstance(value, str) else tuple(value)
    if ref.startswith("(the fixed"):
        return "fixed", None
    return ("zero", None) if "held at zero" in note else ("link", _from_note(user, ref, note))


def _from_note(user: str, ref: str, note: str) -> Link:
    """A hand-written entry: reference name and layout note in the syntax the report prints (note)."""
    heads = re.search(r"split into (\d+) heads(, each transposed)?", note)  # 3 axes
    offset = int(note.split()[1]) if note.startswith("after ") and note.endswith(" unread rows") else 0
    note, _, order = note.partition(", q/k features of each head in the order ")
    note, _, size = note.partition(", RoPE pairs interleaved (head size ")
    pairs = int(size.rstrip(")")) if size else 0
    if "head by head" in note or "row by row" in note:
        raise ValueError(
            f"mapping[{user!r}]: an interleaved layout ({note!r}) is read back from the entry's data only: pass the "
            "result's mapping entry itself, or the JSON's third element, not the printed note"
        )
    if note.startswith("fused rows"):
        prefix, kind = ref.split("{")[0], ref.rsplit(".", 1)[-1]
        roles = [r.strip() for r in note.removeprefix("fused rows").split(",") if r.strip() != "transposed"]
        suffix = "_proj" if "}_proj." in ref else ""
        parts: list = [(f"{r}.{kind}" if "." in r else f"{prefix}{r}{suffix}.{kind}", None) for r in roles]
    elif note.startswith("rows"):
        parts = [(ref, (int(start), int(stop))) for start, stop in re.findall(r"(\d+):(\d+)", note)]
    else:
        parts = [(ref, None)]
    transposed = "transposed" in (note.replace(heads[0], "") if heads else note)
    layout: dict = dict(heads=int(heads[1]), each_transposed=bool(heads[2])) if heads else {}
    axes = re.search(r"stored in the axis order ([\d ]+)", note)
    layout |= {"axes": tuple(map(int, axes[1].split()))} if axes else {}
    layout |= {"rope_order": tuple(map(int, order.split()))} if order else {}
    columns = re.search(r"columns (\d+):(\d*):(\d+)", note)
    stop = (int(columns[2]),) if columns and columns[2] else ()  # a run of columns, not to the end
    layout |= {"columns": (int(columns[1]), int(columns[3]), *stop)} if columns else {}
    return Link(user, parts, transposed, pairs, offset, note.startswith("minus 1"), **layout)


def refuse_unknown(links: list, zero: list, reference: dict, tensors: dict, level: str) -> None:
    """A ValueError naming the first entry of a given map naming a tensor the module or the reference (`reference`,
    by name) lacks, rows past a reference tensor's end, or a user tensor of another size than it is gathered from."""
    names = ", ".join(list(reference)[:6]) + (", ..." if len(reference) > 6 else "")
    for link in links:
        if link.user not in tensors:
            raise ValueError(f"mapping[{link.user!r}]: the module has no parameter or buffer of that name")
        for name, rows in link.parts:
            if name not in reference:
                raise ValueError(
                    f"mapping[{link.user!r}] names {name!r}, which the reference {level!r} does not have as "
                    f"configured here ({names})"
                )
            if rows is not None and not 0 <= rows[0] < rows[1] <= (n := len(rows_of(reference[name]))):
                raise ValueError(f"mapping[{link.user!r}]: rows {rows[0]}:{rows[1]} of {name!r}, which has {n}")
        size = gather(link, reference).size
        if size != tensors[link.user].numel():
            raise ValueError(
                f"mapping[{link.user!r}]: {[n for n, _ in link.parts]} hold {size} numbers, the module's "
                f"{link.user!r} {tuple(tensors[link.user].shape)} holds {tensors[link.user].numel()}"
            )
    for name in zero:
        if name not in reference:
            raise ValueError(f"mapping holds {name!r} at zero, which the reference {level!r} does not have ({names})")
