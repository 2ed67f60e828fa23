"""The links (mapping.Link) from a user's parameters to the reference's names, made unit by unit from the pieces
assign.py dealt (Dealt): one linker per component's unit and per group of levels (a layer, layers on
embeddings, a whole model), chosen by the level's entry in the registry (level_table.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .mapping import Link


@dataclass
class Dealt:
    """The user's pieces sorted for the reference's units: sizes (d_model D, heads H, d_ff F, the k/v width kv),
    the attention pieces grouped per attention (chunks), the feed-forward blocks (gated: (gate, up, down) each),
    the output projection, the tables and the norms, and the layer counts they imply."""

    D: Any  # int; None only where no attention or table is read (scaled dot-product attention)
    H: Any  # int; None likewise
    F: int
    kv: Any = None
    attention: list = field(default_factory=list)
    ffn: list = field(default_factory=list)
    chunks: list = field(default_factory=list)
    gated: list | None = None
    ffn_pairs: list = field(default_factory=list)
    out_piece: Any = None
    token_tables: list = field(default_factory=list)
    position_tables: list = field(default_factory=list)
    type_table: Any = None
    norms: list = field(default_factory=list)
    n_enc: int = 0
    n_dec: int = 0
    layer_norms: int = 0
    embedding_norm: bool = False
    flow: Any = None  # dataflow.Flow, or None
    qk_norms: dict = field(default_factory=dict)  # q or k weight name -> its per-head Norm


class Linker:
    """Links (mapping.Link) from the user's parameters to the reference's names, built unit by unit; `zero` the
    reference biases the user's linears lack (held at zero)."""

    def __init__(self, entry, cfg, dealt: Dealt):
        self.entry, self.cfg, self.dealt = entry, cfg, dealt
        self.links: list = []
        self.zero: list = []

    def count(self, what: str, got: int, expected: int) -> None:
        if got != expected:
            raise ValueError(
                f"found {got} {what} in the module, the reference {self.entry.name!r} has {expected}; pass mapping="
            )

    def linear(self, piece, name: str, hold_missing_bias: bool = True) -> None:
        """A linear's weight (as is or transposed) and bias; a missing bias held at zero where the reference has
        one (`hold_missing_bias`)."""
        note = "transposed" if piece.transposed else "as is"
        self.links.append(Link(piece.weight, [(f"{name}.weight", None)], piece.transposed, note))
        if piece.bias is not None:
            self.links.append(Link(piece.bias, [(f"{name}.bias", None)]))
        elif self.cfg.bias and hold_missing_bias:
            self.zero.append(f"{name}.bias")

    def norm(self, norm, prefix: str) -> None:
        self.links.append(Link(norm.weight, [(f"{prefix}weight", None)]))
        if norm.bias is not None:
            self.links.append(Link(norm.bias, [(f"{prefix}bias", None)]))

    def table(self, name: str, ref: str, offset: int = 0) -> None:
        """A table as is, or after `offset` rows the model never reads (BART's positions)."""
        note = f"after {offset} unread rows" if offset else "as is"
        self.links.append(Link(name, [(ref, None)], note=note, offset=offset))

    def ffn(self, pair: list, prefix: str) -> None:
        D, F = self.dealt.D, self.dealt.F
        if self.dealt.gated is not None:
            names: tuple = ("gate", "linear1", "linear2")
        elif len(pair) != 2 or pair[0].out_features != F or pair[1].in_features != F:
            raise ValueError(
                f"cannot read {[p.weight for p in pair]} as a feed-forward block {D} -> {F} -> {D}; pass mapping="
            )
        else:
            names = ("linear1", "linear2")
        for p, name in zip(pair, names, strict=True):
            self.linear(p, f"{prefix}{name}")

    def attention(self, chunk: list, prefix: str) -> None:
        d = self.dealt
        got, held = attention_links(chunk, prefix.rstrip("."), d.D, self.cfg.n_heads, self.cfg.bias, d.kv)
        self.links.extend(got)
        self.zero.extend(held)
        for link in got:  # Qwen3's per-head q and k norms, after their projections
            norm = d.qk_norms.get(link.user)
            if norm is not None:
                role = link.parts[0][0].rsplit(".", 2)[-2][0]  # q_proj -> q, k_proj -> k
                self.norm(norm, f"{prefix}{role}_norm.")

    def layer(self, prefix: str, decoder: bool, chunks, norms, ffns) -> None:
        """One layer's attentions (a cross-attending decoder's two), feed-forward block and norms, in the
        user's registration order."""
        self.attention(take(chunks, "attention", f"{prefix}self_attn"), f"{prefix}self_attn.")
        if decoder:
            self.attention(take(chunks, "attention", f"{prefix}cross_attn"), f"{prefix}cross_attn.")
        self.ffn(take(ffns, "feed-forward block", f"{prefix}ffn"), f"{prefix}ffn.")
        for name in ["self_attn_norm"] + (["cross_attn_norm"] if decoder else []) + ["ffn_norm"]:
            self.norm(take(norms, "norm", f"{prefix}{name}"), f"{prefix}{name}.")


def take(pieces, what: str, where: str):
    """The next of the user's pieces for the reference's `where`; a ValueError saying so when none is left."""
    piece = next(pieces, None)
    if piece is None:
        raise ValueError(
            f"no {what} of the module is left for the reference's {where}: the recorded forward and the shapes "
            "give fewer than the layers need; pass mapping="
        )
    return piece


# -- one linker per component's unit and per group: (linker, dealt, found) -> None --------------------------------


def _link_attention(lk: Linker, d: Dealt, found) -> None:
    lk.count("attentions", len(d.chunks), 1)
    lk.attention(d.chunks[0], "")


def _link_norm(lk: Linker, d: Dealt, found) -> None:
    lk.count("norms", len(d.norms), 1)
    lk.norm(d.norms[0], "")


def _link_feed_forward(lk: Linker, d: Dealt, found) -> None:
    pieces = d.attention + d.ffn
    if d.gated is not None:
        raise ValueError(
            f"{[p.weight for p in found.pieces]} is a gated feed-forward block (gate, up and down); check it as "
            "'gated_feed_forward'"
        )
    lk.count("feed-forward pieces", len(pieces), 2)
    lk.ffn(sorted(found.pieces, key=lambda p: p.in_features != d.D), "")


def _link_gated(lk: Linker, d: Dealt, found) -> None:
    lk.count("gated feed-forward blocks", len(d.gated or []), 1)
    lk.ffn(d.gated[0], "")  # type: ignore[index]  # counted above: one block


def _link_embedding(lk: Linker, d: Dealt, found) -> None:
    lk.count("token tables", len(d.token_tables), 1)
    lk.table(d.token_tables[0].name, "token_embedding.weight")


def _link_positions(lk: Linker, d: Dealt, found) -> None:
    if lk.cfg.positional == "learned":
        lk.table(d.position_tables[0].name, "position_embedding.weight", d.position_tables[0].offset)


def _link_layer(lk: Linker, d: Dealt, found) -> None:
    cross = lk.entry.cross
    lk.count("attentions", len(d.chunks), 2 if cross else 1)
    lk.count("norms", len(d.norms), 3 if cross else 2)
    lk.layer("", cross, iter(d.chunks), iter(d.norms), iter(d.ffn_pairs))


def _link_embeddings(lk: Linker, d: Dealt, stack: str, tokens, learned, norms) -> None:
    """A model stack's tables: its token table (the encoder's shared with the decoder's when share_embeddings),
    its learned positions, BERT's type table and embedding norm."""
    cfg = lk.cfg
    if not (stack == "encoder" and cfg.share_embeddings):
        table = next(tokens, None)
        if table is None:
            raise ValueError(f"no token table found for the {stack}; pass mapping=")
        lk.table(table.name, f"{stack}.token_embedding.weight")
    if cfg.positional == "learned":
        table = take(learned, "learned position table", stack)
        lk.table(table.name, f"{stack}.position_embedding.weight", table.offset)
    if stack == "encoder" and d.type_table is not None:
        lk.table(d.type_table.name, "encoder.token_type_embedding.weight")
    if d.embedding_norm:
        lk.norm(take(norms, "norm", f"{stack}.embedding_norm"), f"{stack}.embedding_norm.")


def _link_output(lk: Linker, d: Dealt, found) -> None:
    """The output projection: the user's linear, an output bias alone, or the tied token table."""
    if d.out_piece is not None:
        lk.linear(d.out_piece, "output_proj", hold_missing_bias=False)  # none: output_bias=False
    elif found.orphans:
        lk.table(found.orphans[0], "output_proj.bias")
    if lk.cfg.tie_embeddings:
        lk.links.append(Link("(tied)", [("decoder.token_embedding.weight", None)], note="tied output projection"))


def _link_stacks(lk: Linker, d: Dealt, found) -> None:
    """Layers on embeddings, or a whole model: each stack's tables (a model's), layers and final norm (always, or
    config.has_final_norm), then a model's output projection."""
    cfg, entry = lk.cfg, lk.entry
    finals = entry.final_norms == "always" or cfg.has_final_norm
    chunks, norms, ffns = iter(d.chunks), iter(d.norms), iter(d.ffn_pairs)
    tokens, learned = iter(d.token_tables), iter([t for t in d.position_tables if t.trainable])
    lk.count("norms", len(d.norms), d.layer_norms + (len(entry.stacks) if finals else 0))
    for stack in entry.stacks:
        if entry.group == "model":
            _link_embeddings(lk, d, stack, tokens, learned, norms)
        n = cfg.n_encoder_layers if stack == "encoder" else cfg.n_decoder_layers
        for i in range(n):
            lk.layer(f"{stack}.layers.{i}.", stack == "decoder" and entry.cross, chunks, norms, ffns)
        if finals:
            lk.norm(take(norms, "norm", f"{stack}.final_norm"), f"{stack}.final_norm.")
    if entry.output_head:
        _link_output(lk, d, found)


LINKS = {
    "heads": lambda lk, d, found: None,  # no parameters
    "attention": _link_attention,
    "layer_norm": _link_norm,
    "rms_norm": _link_norm,
    "feed_forward": _link_feed_forward,
    "gated_feed_forward": _link_gated,
    "embedding": _link_embedding,
    "positions": _link_positions,
    "layer": _link_layer,
    "stacks": _link_stacks,
    "model": _link_stacks,
}


# -- one attention's pieces: fused, separate or per head ----------------------------------------------------------


def attention_links(pieces: list, prefix: str, D: int, H: int, bias_names: bool, kv: int | None = None):
    """The links of one attention's pieces (registration order) to the reference's `prefix`.{q,k,v,out}_proj;
    returns (links, zero-bias reference names). `kv`: the key and value projections' width (n_kv_heads * Dh with
    grouped-query attention; None: D). Raises ValueError when the roles cannot be told apart."""
    kv = D if kv is None else kv
    names = {r: f"{prefix}.{r}_proj" if prefix else f"{r}_proj" for r in ("q", "k", "v", "out")}
    shapes = [p.out_features for p in pieces]
    if shapes in ([3 * D, D], [D + 2 * kv, D]):  # fused q, k, v (narrower k, v with grouped-query attention)
        dealt = [(pieces[0], [(names[r], None) for r in "qkv"]), (pieces[1], [(names["out"], None)])]
    elif shapes == [D, kv, kv, D]:
        dealt = _separate(pieces, names)
    elif sorted(shapes) == sorted([D // H] * (3 * H) + [D]) and H > 1:
        dealt = _per_head(pieces, names, prefix, D, H)
    else:
        raise ValueError(
            f"cannot read the pieces {[p.weight for p in pieces]} (rows {shapes}) as one attention of width {D} with "
            f"{H} heads; expected q, k, v, out ({D}, {kv}, {kv}, {D}), a fused {D + 2 * kv} and an output {D}, or "
            f"{3 * H} heads of {D // H} and an output; pass mapping= to map them"
        )
    links: list = []
    zero: list = []
    for piece, parts in dealt:
        links.append(Link(piece.weight, [(f"{n}.weight", r) for n, r in parts], piece.transposed,
                          _layout_note(parts, piece.transposed)))  # fmt: skip
        if piece.bias is not None:
            links.append(Link(piece.bias, [(f"{n}.bias", r) for n, r in parts], False, _layout_note(parts, False)))
        elif bias_names:
            zero.extend(f"{n}.bias" for n, _ in parts if f"{n}.bias" not in zero)
    return links, zero


def _separate(pieces: list, names: dict) -> list:
    """q, k, v and out as four pieces, by the roles the recorded forward (or, where it could not run, their
    names) gave them, one left unnamed taking the role left; never by the order they were registered in."""
    roles = [p.role for p in pieces]
    left = sorted({"q", "k", "v", "out"} - set(roles))
    if len(left) == 1 and roles.count("") == 1:
        roles[roles.index("")] = left[0]
    if sorted(roles) != sorted(["q", "k", "v", "out"]):
        listed = ", ".join(f"{p.weight} ({p.role or 'no role read'})" for p in pieces)
        raise ValueError(
            f"cannot tell the query, key, value and output projections apart among {listed}: no softmax read "
            "their products in the recorded forward and no name says; pass mapping="
        )
    return [(p, [(names[r], None)]) for p, r in zip(pieces, roles, strict=True)]


def _per_head(pieces: list, names: dict, prefix: str, D: int, H: int) -> list:
    """One piece per head and role (told apart by name), each the rows of its head in the reference's projection,
    and the output projection."""
    Dh = D // H
    heads = [p for p in pieces if p.out_features == Dh]
    roles = [p.role for p in heads]
    if sorted(roles) != sorted(["q", "k", "v"] * H):
        raise ValueError(
            f"the {H} heads' pieces of {prefix} cannot be told apart by name (q, k, v): "
            + ", ".join(p.weight for p in heads)
            + "; pass mapping= to say which is which"
        )
    count = dict.fromkeys("qkv", 0)
    dealt = []
    for p, r in zip(heads, roles, strict=True):
        h = count[r]
        count[r] += 1
        dealt.append((p, [(names[r], (h * Dh, (h + 1) * Dh))]))
    out = next(p for p in pieces if p.out_features == D)
    return dealt + [(out, [(names["out"], None)])]


def _layout_note(parts: list, transposed: bool) -> str:
    """How the user's tensor holds the reference's: "as is", "rows a:b", "fused rows q, k, v", "..., transposed"."""
    text = "as is" if len(parts) == 1 and parts[0][1] is None else ""
    if len(parts) > 1:
        text = "fused rows " + ", ".join(n.rsplit(".", 1)[-1].removesuffix("_proj") for n, _ in parts)
    elif parts[0][1] is not None:
        text = f"rows {parts[0][1][0]}:{parts[0][1][1]}"
    if transposed:
        return "transposed" if text == "as is" else text + ", transposed"
    return text
