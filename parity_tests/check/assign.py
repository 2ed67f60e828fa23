"""Dealing the user's pieces to the reference's units, and the config their shapes imply.

`infer(level, structure, module, given)` returns the config the user's module is judged as (its sizes read from the
shapes, the rest from `given` or the reference's defaults) and the links (mapping.Link) from every user parameter to
the reference's tensors. Reference biases the user's linears lack are returned as `zero`: held at zero, their
gradients not compared. Llama's parts are read here too: grouped-query attention from the k/v width (kv_width),
SwiGLU's gate, up and down (gated_groups), RMSNorm from a norm without a shift, and the RoPE bases the module states
and the RoPE tables it built in float32 (rope_thetas, rope_buffers).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

import numpy as np
from torch import nn

from numpy_transformer import TransformerConfig

from .level_table import LEVELS
from .mapping import Link, attention_links
from .variants import sinusoid_tables

HEAD_ATTRS = ("num_heads", "n_heads", "n_head", "nhead", "heads", "h", "num_attention_heads")


def find_heads(module) -> int | None:
    """A head count the user's module states (nn.MultiheadAttention's num_heads, a tutorial's n_heads, ...)."""
    if not isinstance(module, nn.Module):
        return None
    for _, mod in module.named_modules():
        for owner in (mod, getattr(mod, "config", None)):  # transformers' modules keep theirs in .config
            for attr in HEAD_ATTRS:
                value = getattr(owner, attr, None)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
    return None


def kv_width(pieces: list, D: int, H: int) -> int:
    """The key and value projections' width: D, or n_kv_heads * Dh with grouped-query attention, read from the
    first attention laid out as q (D), k and v (equal, narrower), out (D), or as a fused D + 2 kv and an out."""
    Dh = D // H
    for i, p in enumerate(pieces):
        width = p.out_features
        if D < width < 3 * D and (width - D) % (2 * Dh) == 0:
            return (width - D) // 2
        window = [q.out_features for q in pieces[i : i + 4]]
        if width == D and len(window) == 4 and window[1] == window[2] < D == window[3] and window[1] % Dh == 0:
            return window[1]
    return D


def gated_groups(ffn: list, D: int, F: int) -> list | None:
    """The gated feed-forward blocks' pieces, (gate, up, down) per block, when there are two D -> F linears for
    each F -> D one (Llama's SwiGLU), dealt three at a time in registration order; None for plain blocks. The
    down projection is the F -> D one; gate and up are told apart by name (gate/up, Meta's w1/w3), else taken
    in order (gate first), and the check tries the other order too (judge.layouts)."""
    ups = [p for p in ffn if p.in_features == D and p.out_features == F]
    downs = [p for p in ffn if p.in_features == F]
    if not downs or len(ups) != 2 * len(downs) or len(ffn) != 3 * len(downs):
        return None
    groups = []
    for i in range(0, len(ffn), 3):
        block = ffn[i : i + 3]
        down = [p for p in block if p.in_features == F]
        pair = [p for p in block if p.in_features == D]
        if len(down) != 1 or len(pair) != 2:
            raise ValueError(
                f"cannot read {[p.weight for p in block]} as a gated feed-forward block (two {D} -> {F} linears, "
                f"gate and up, and one {F} -> {D}, down); pass mapping="
            )
        if pair[1].role == "gate" or pair[0].role == "up":
            pair.reverse()
        groups.append((pair[0], pair[1], down[0]))
    return groups


def _chunks(pieces: list, D: int, kv: int) -> list:
    """Consecutive attention pieces grouped into attentions of 2D + 2kv rows (q, k, v, out; kv = D but with
    grouped-query attention)."""
    chunks, current, rows = [], [], 0
    for p in pieces:
        current.append(p)
        rows += p.out_features
        if rows == 2 * D + 2 * kv:
            chunks.append(current)
            current, rows = [], 0
        elif rows > 2 * D + 2 * kv:
            raise ValueError(
                f"the attention pieces {[q.weight for q in current]} add up to {rows} rows, not 2 x d_model + 2 x "
                f"the k/v width = {2 * D + 2 * kv}: cannot split them into q, k, v and output projections; "
                "pass mapping="
            )
    if current:
        raise ValueError(f"attention pieces left over: {[q.weight for q in current]}; pass mapping=")
    return chunks


@dataclass
class Dealt:
    """The user's pieces sorted for the reference's units: sizes (d_model D, heads H, d_ff F, the k/v width kv),
    the attention pieces grouped per attention (chunks), the feed-forward blocks (gated: (gate, up, down) each),
    the output projection, the tables and the norms, and the layer counts they imply."""

    D: int | None
    H: int | None
    F: int
    kv: int | None = None
    attention: list = field(default_factory=list)
    ffn: list = field(default_factory=list)
    chunks: list = field(default_factory=list)
    gated: list | None = None
    ffn_pairs: list = field(default_factory=list)
    out_piece: object = None
    token_tables: list = field(default_factory=list)
    position_tables: list = field(default_factory=list)
    type_table: object = None
    norms: list = field(default_factory=list)
    n_enc: int = 0
    n_dec: int = 0
    layer_norms: int = 0
    embedding_norm: bool = False


def infer(level: str, found, module, given: dict) -> tuple:
    """(config, links, zero, tables) for the user's module at `level`; see the module docstring."""
    entry = LEVELS[level]
    fields = {k: v for k, v in given.items() if k != "config" and v is not None}
    dealt = _sizes(entry, found, module, given.get("config"), fields)
    _tables(entry, found, dealt)
    _pieces(entry, list(found.pieces), dealt)
    _layers(entry, dealt)
    cfg = _config(entry, found, dealt, given.get("config"), fields)
    linker = Linker(entry, cfg, dealt)
    LINKS[entry.unit or entry.group](linker, dealt, found)
    fixed = [t for t in dealt.position_tables if not t.trainable]
    return cfg, [link for link in linker.links if link.user != "(tied)"], linker.zero, fixed


def _sizes(entry, found, module, cfg, fields: dict) -> Dealt:
    """d_model, heads and d_ff: as given, else read from the shapes (d_model the most common input width, or a
    norm's or a table's width; d_ff the other input width), heads from what the module states."""
    pieces, norms, tables = found.pieces, found.norms, found.tables
    D = fields.get("d_model") or (cfg.d_model if cfg else None)
    if D is None and pieces and not norms:
        widths = [p.in_features for p in pieces]
        D = max(widths, key=widths.count)  # the most common input width (a gated block: gate and up read D)
    if D is None:
        D = norms[0].size if norms else (tables[0].width if tables else None)
    if D is None and entry.unit != "heads":
        raise ValueError(f"cannot tell d_model from the module's parameters at level {entry.name!r}: pass d_model=")
    H = fields.get("n_heads") or (cfg.n_heads if cfg else None) or find_heads(module)
    if H is None and entry.heads:
        raise ValueError(f"the number of heads cannot be read from the module: pass n_heads= (level {entry.name!r})")
    ffn_in = [p for p in pieces if p.in_features not in (D,)]
    F = ffn_in[0].in_features if ffn_in else 4 * (D or 8)
    return Dealt(D, H, F, norms=list(norms))


def _tables(entry, found, dealt: Dealt) -> None:
    """Token and position tables of width d_model, and BERT's token-type table among the token tables."""
    dealt.token_tables = [t for t in found.tables if not t.position and t.width == dealt.D]
    dealt.position_tables = [t for t in found.tables if t.position and t.width == dealt.D]
    dealt.type_table = token_type_table(entry, dealt.token_tables)
    if dealt.type_table is not None:
        dealt.token_tables.remove(dealt.type_table)


def _pieces(entry, pieces: list, dealt: Dealt) -> None:
    """The output projection (a linear D -> V, V the target token table's rows), the attention pieces (D -> not
    d_ff) in chunks of one attention each, and the feed-forward pieces in blocks."""
    D, F, H = dealt.D, dealt.F, dealt.H
    if dealt.token_tables and entry.group == "model":
        V = dealt.token_tables[-1].rows
        heads = [p for p in pieces if p.in_features == D and p.out_features == V and p.out_features != F]
        if heads and entry.output_head:
            dealt.out_piece = heads[-1]
            pieces.remove(dealt.out_piece)
        elif heads and entry.cross:  # a decoder stack with an output projection
            raise ValueError(
                f"the module has an output projection ({heads[-1].weight}); the reference {entry.name!r} is the stack "
                "before it: check the whole model as 'transformer', or pass call= returning the decoder's hidden states"
            )
    dealt.attention = [p for p in pieces if p.in_features == D and p.out_features != F]
    dealt.ffn = [p for p in pieces if p not in dealt.attention]
    if entry.unit == "gated_feed_forward":
        dealt.attention, dealt.ffn = [], pieces
    dealt.kv = kv_width(dealt.attention, D, H) if H and D else D
    dealt.chunks = _chunks(dealt.attention, D, dealt.kv) if entry.heads else []
    dealt.gated = gated_groups(dealt.ffn, D, F)
    if entry.unit == "gated_feed_forward" and dealt.gated is None:
        listed = ", ".join(f"{p.weight} ({p.in_features} -> {p.out_features})" for p in pieces)
        raise ValueError(
            f"cannot read {listed} as a gated feed-forward block: expected two D -> F linears (gate and up) and "
            "one F -> D (down), D the input width; a two-linear block is checked as 'feed_forward'"
        )
    ffn = dealt.ffn
    dealt.ffn_pairs = dealt.gated if dealt.gated is not None else [ffn[i : i + 2] for i in range(0, len(ffn), 2)]


def _layers(entry, dealt: Dealt) -> None:
    """The encoder and decoder layers the attentions and blocks make, the norms inside them, and an encoder
    model's embedding norm (BERT's)."""
    dealt.n_enc, dealt.n_dec = entry.n_layers(len(dealt.chunks), len(dealt.ffn_pairs))
    dealt.layer_norms = entry.layer_norm_count(dealt.n_enc, dealt.n_dec)
    if entry.group == "model" and entry.encoder_only:
        dealt.embedding_norm = _embedding_norm(dealt.norms, dealt.layer_norms, dealt.token_tables)
        dealt.layer_norms += dealt.embedding_norm


def _config(entry, found, dealt: Dealt, cfg, fields: dict):
    """The config: the given one with the given fields, else the one the dealt pieces imply (with the fields)."""
    known = {k: v for k, v in fields.items() if k in TransformerConfig.__dataclass_fields__}
    if cfg is not None:
        return dataclasses.replace(cfg, **known)
    norms, D, H = dealt.norms, dealt.D, dealt.H
    rms = bool(norms) and all(n.kind == "rms" for n in norms)
    token_tables, out_piece, kv = dealt.token_tables, dealt.out_piece, dealt.kv
    pieces = dealt.attention + dealt.ffn
    base = dict(
        src_vocab_size=token_tables[0].rows if token_tables else 32,
        tgt_vocab_size=token_tables[-1].rows if token_tables else 32,
        n_encoder_layers=dealt.n_enc,
        n_decoder_layers=dealt.n_dec,
        bias=any(p.bias is not None for p in pieces) if pieces else True,
        output_bias=out_piece is not None and out_piece.bias is not None or bool(found.orphans),
        tie_embeddings=entry.output_head and out_piece is None,
        share_embeddings=entry.output_head and len(entry.stacks) == 2 and len(token_tables) == 1,
        positional="learned" if any(t.trainable for t in dealt.position_tables) else "sinusoidal",
        max_len=max((t.rows for t in dealt.position_tables), default=64),
        layer_norm_eps=next((n.eps for n in norms if n.eps is not None), 1e-6 if rms else 1e-5),
        norm="rms" if rms or entry.unit == "rms_norm" else "layer",
        gated_ffn=dealt.gated is not None,
        n_kv_heads=kv // (D // H) if H and kv != D else None,
        type_vocab_size=dealt.type_table.rows if dealt.type_table is not None else 0,
        embedding_norm=dealt.embedding_norm,
        d_model=D or 8,
        n_heads=H or 2,
        d_ff=dealt.F,
    )
    if dealt.gated is not None:
        base["activation"] = "silu"
    if entry.final_norms == "pre-norm" and len(norms) > dealt.layer_norms:
        base["norm_first"] = True  # a final norm: pre-norm layers
    return TransformerConfig(**(base | known))


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

    def table(self, name: str, ref: str) -> None:
        self.links.append(Link(name, [(ref, None)]))

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

    def layer(self, prefix: str, decoder: bool, chunks, norms, ffns) -> None:
        """One layer's attentions (a cross-attending decoder's two), feed-forward block and norms, in the
        user's registration order."""
        self.attention(next(chunks), f"{prefix}self_attn.")
        if decoder:
            self.attention(next(chunks), f"{prefix}cross_attn.")
        self.ffn(next(ffns), f"{prefix}ffn.")
        for name in ["self_attn_norm"] + (["cross_attn_norm"] if decoder else []) + ["ffn_norm"]:
            self.norm(next(norms), f"{prefix}{name}.")

    def stack(self, stack: str, n: int, decoder: bool, chunks, norms, ffns) -> None:
        for i in range(n):
            self.layer(f"{stack}.layers.{i}.", decoder, chunks, norms, ffns)


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
        lk.table(d.position_tables[0].name, "position_embedding.weight")


def _link_layer(lk: Linker, d: Dealt, found) -> None:
    cross = lk.entry.cross
    lk.count("attentions", len(d.chunks), 2 if cross else 1)
    lk.count("norms", len(d.norms), 3 if cross else 2)
    lk.layer("", cross, iter(d.chunks), iter(d.norms), iter(d.ffn_pairs))


def _link_stacks(lk: Linker, d: Dealt, found) -> None:
    """Layers on embeddings: each stack's layers, then its final norm (always, or when pre-norm)."""
    finals = lk.entry.final_norms == "always" or lk.cfg.norm_first
    lk.count("norms", len(d.norms), d.layer_norms + (len(lk.entry.stacks) if finals else 0))
    chunks, norms, ffns = iter(d.chunks), iter(d.norms), iter(d.ffn_pairs)
    for stack in lk.entry.stacks:
        n = d.n_enc if stack == "encoder" else d.n_dec
        lk.stack(stack, n, stack == "decoder" and lk.entry.cross, chunks, norms, ffns)
        if finals:
            lk.norm(next(norms), f"{stack}.final_norm.")


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
        lk.table(next(learned).name, f"{stack}.position_embedding.weight")
    if stack == "encoder" and d.type_table is not None:
        lk.table(d.type_table.name, "encoder.token_type_embedding.weight")
    if stack == "encoder" and d.embedding_norm:
        lk.norm(next(norms), "encoder.embedding_norm.")


def _link_output(lk: Linker, d: Dealt, found) -> None:
    """The output projection: the user's linear, an output bias alone, or the tied token table."""
    if d.out_piece is not None:
        lk.linear(d.out_piece, "output_proj", hold_missing_bias=False)  # none: output_bias=False
    elif found.orphans:
        lk.table(found.orphans[0], "output_proj.bias")
    if lk.cfg.tie_embeddings:
        lk.links.append(Link("(tied)", [("decoder.token_embedding.weight", None)], note="tied output projection"))


def _link_model(lk: Linker, d: Dealt, found) -> None:
    cfg, entry = lk.cfg, lk.entry
    chunks, norms, ffns = iter(d.chunks), iter(d.norms), iter(d.ffn_pairs)
    tokens, learned = iter(d.token_tables), iter([t for t in d.position_tables if t.trainable])
    lk.count("norms", len(d.norms), d.layer_norms + (len(entry.stacks) if cfg.norm_first else 0))
    for stack in entry.stacks:
        _link_embeddings(lk, d, stack, tokens, learned, norms)
        n = cfg.n_encoder_layers if stack == "encoder" else cfg.n_decoder_layers
        lk.stack(stack, n, stack == "decoder" and entry.cross, chunks, norms, ffns)
        if cfg.norm_first:
            lk.norm(next(norms), f"{stack}.final_norm.")
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
    "model": _link_model,
}


TYPE_WORDS = re.compile(r"(token_?type|segment|type_emb|tok_type|seg_emb)")


def token_type_table(entry, token_tables: list):
    """BERT's token-type table among an encoder model's token tables: the one named for types or segments
    (token_type_embeddings, segment_embedding), else, of two tables, the second when it has fewer rows than the
    first (a handful of types against a vocabulary). None for other levels and for models without one."""
    if entry.group != "model" or not entry.encoder_only or len(token_tables) < 2:
        return None
    named = [t for t in token_tables if TYPE_WORDS.search(t.name.lower())]
    if len(named) == 1:
        return named[0]
    if len(token_tables) == 2 and token_tables[1].rows < token_tables[0].rows:
        return token_tables[1]
    return None


def _embedding_norm(norms: list, layer_norms: int, token_tables: list) -> bool:
    """An encoder model's embedding norm (BERT's embeddings.LayerNorm): one norm more than its layers hold, the
    first in registration order, kept beside the token table (the same parent module) or named for embeddings.
    A pre-norm encoder's extra norm is its last (a final norm), which this does not take."""
    if not norms or len(norms) not in (layer_norms + 1, layer_norms + 2) or norms[0].kind != "layer":
        return False
    parent = norms[0].module.rsplit(".", 1)[0] if "." in norms[0].module else ""
    beside = any(t.module.rsplit(".", 1)[0] == parent for t in token_tables if "." in t.module)
    return beside or "emb" in norms[0].module.lower()


def float32_angle_tolerance(angles: np.ndarray) -> np.ndarray:
    """How far sin or cos of `angles` (float64) may be from the same computed in float32: the argument itself is
    rounded to float32 (a few units of 2^-24 relative, so ~1.5e-4 at position 5000), then the result (1e-6 floor)."""
    return 1e-6 + 8 * np.finfo(np.float32).eps * np.abs(angles)


def fixed_tables(module, fixed: list, notes: list) -> tuple[dict, str | None, bool]:
    """Read each fixed position table of the user's against the reference's sinusoids. Returns ({user name:
    float64 table to overwrite it with}, the layout found, whether a table has the wrong frequencies), and adds
    a note for each."""
    import torch

    tensors = dict(module.named_parameters()) | dict(_tensors_kept(module))
    overwrite, layout, wrong = {}, None, False
    for t in fixed:
        value = tensors[t.name].detach().to(torch.float64).cpu().numpy().reshape(t.rows, t.width)
        tolerance = float32_angle_tolerance(np.arange(t.rows, dtype=np.float64)[:, None])  # angles <= position
        for name, table in sinusoid_tables(t.rows, t.width).items():
            if np.all(np.abs(value - table) <= tolerance):
                overwrite[t.name] = table
                if name == "wrong_frequencies":
                    wrong = True
                    notes.append(
                        f"{t.name}: a sinusoid table whose frequencies are all 1 (to float32 precision; "
                        "overwritten with that table in float64)"
                    )
                    break
                layout = name
                notes.append(
                    f"{t.name}: the reference's {name} sinusoids to float32 precision; overwritten with "
                    "the float64 table for the float64 comparison"
                )
                break
    return overwrite, layout, wrong


THETA_ATTRS = ("rope_theta", "theta", "base", "rope_base", "rotary_base")


def _theta_from(inv_freq: np.ndarray, Dh: int) -> float | None:
    """The RoPE base of an inverse-frequency vector theta^(-2i/Dh), i < Dh/2, rounded to an integer where it is
    one to float32 precision (a float32 buffer)."""
    if inv_freq.shape != (Dh // 2,) or Dh < 4 or not 0 < inv_freq[1] < 1:
        return None
    theta = float(inv_freq[1] ** (-Dh / 2))
    return float(round(theta)) if abs(theta - round(theta)) <= 1e-4 * theta else theta


def rope_thetas(module, Dh: int) -> list:
    """The RoPE bases the user's module states: a base attribute (theta, rope_theta, base, ...; transformers'
    in .config), or an inverse-frequency buffer (inv_freq). 10000 (the paper's, Llama 2's) is always tried last."""
    found = []
    if isinstance(module, nn.Module):
        for _, mod in module.named_modules():
            config = getattr(mod, "config", None)
            values = [getattr(mod, a, None) for a in THETA_ATTRS] + [getattr(config, "rope_theta", None)]
            values.append((getattr(config, "rope_parameters", None) or {}).get("rope_theta"))
            for name, buf in mod.named_buffers(recurse=False):
                if "inv_freq" in name and buf.is_floating_point():
                    values.append(_theta_from(buf.detach().double().cpu().numpy(), Dh))
            found += [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 1]
    return list(dict.fromkeys(found + [10000.0]))


def rope_tables(theta: float, Dh: int, T: int) -> dict:
    """The tables a user's module may keep for RoPE at base theta, float64: the inverse frequencies (Dh/2,), and
    for positions 0 .. T - 1 the angles, cos and sin, (T, Dh/2), or (T, Dh) repeated for the two halves
    (Hugging Face's cat) or for the pairs (interleaved)."""
    inv = theta ** (-np.arange(0, Dh, 2, dtype=np.float64) / Dh)
    angles = np.arange(T, dtype=np.float64)[:, None] * inv
    tables = {"inverse frequencies": inv}
    for name, f in (("angles", angles), ("cos", np.cos(angles)), ("sin", np.sin(angles))):
        tables[f"{name} (T, Dh/2)"] = f
        tables[f"{name} (T, Dh), halves"] = np.concatenate([f, f], axis=-1)
        tables[f"{name} (T, Dh), pairs"] = np.repeat(f, 2, axis=-1)
    return tables


def _float32_equal(value: np.ndarray, table: np.ndarray, kind: str, theta: float, Dh: int) -> bool:
    """`value` (built in float32) equal to the float64 RoPE table `table` of rope_tables' `kind`: cos and sin to
    float32 rounding of their angles (the largest, position x frequency, at each entry), the rest to 1e-6."""
    if not kind.startswith(("cos", "sin")):
        return np.allclose(value, table, rtol=1e-6, atol=1e-6)
    angles = rope_tables(theta, Dh, table.shape[0])[kind.replace(kind.split(" ")[0], "angles", 1)]
    return bool(np.all(np.abs(value - table) <= float32_angle_tolerance(angles)))


def _tensors_kept(module):
    """(name, tensor) for every buffer and every plain tensor attribute (Meta's `self.freqs_cis`, which .to() does
    not convert), named by its dotted path."""
    import torch

    yield from module.named_buffers()
    for path, mod in module.named_modules():
        for attr, value in vars(mod).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                yield (f"{path}.{attr}" if path else attr), value


def _complex_rope_table(table, Dh: int, thetas: list):
    """(complex128 values, base) when `table` (complex, (T, Dh/2)) is torch.polar(1, m theta_j) to float32
    rounding of its angles (Meta's precompute_freqs_cis), else None."""
    import torch

    value = torch.view_as_real(table.detach().cpu()).double().numpy()
    value = value.reshape([s for s in value.shape[:-1] if s > 1] + [2])
    if value.ndim != 3 or value.shape[1] != Dh // 2:
        return None
    for theta in thetas:
        angles = rope_tables(theta, Dh, value.shape[0])["angles (T, Dh/2)"]
        tolerance = float32_angle_tolerance(angles)
        if np.all(np.abs(value[..., 0] - np.cos(angles)) <= tolerance) and np.all(
            np.abs(value[..., 1] - np.sin(angles)) <= tolerance
        ):
            return np.exp(1j * angles), theta
    return None


def rope_buffers(module, Dh: int, thetas: list, notes: list) -> tuple[dict, float | None]:
    """The user's RoPE tables built in float32 (inverse frequencies, cos and sin tables, Meta's complex rotations),
    buffers or plain tensor attributes: each one equal to a table of rope_tables to float32 precision is
    overwritten with its float64 values for the float64 comparison, as fixed sinusoid tables are. Returns
    ({name: float64 values}, the base they were built with)."""
    overwrite, base = {}, None
    if not isinstance(module, nn.Module) or Dh % 2:
        return overwrite, base
    for name, buf in _tensors_kept(module):
        if buf.is_complex() and buf.numel() >= Dh // 2:
            match = _complex_rope_table(buf, Dh, thetas)
            if match is not None:
                overwrite[name], theta = match
                base = base or theta
                notes.append(
                    f"{name}: RoPE's complex rotations e^(i m theta_j) (base {theta:g}) to float32 precision; "
                    "overwritten with the complex128 values for the float64 comparison"
                )
            continue
        if not buf.is_floating_point() or buf.numel() < Dh // 2:
            continue
        value = buf.detach().double().cpu().numpy()
        value = value.reshape([s for s in value.shape if s > 1] or [1])
        rows = value.shape[0] if value.ndim == 2 else 0
        for theta in thetas:
            match = next(
                (k for k, t in rope_tables(theta, Dh, max(rows, 1)).items() if t.shape == value.shape
                 and _float32_equal(value, t, k, theta, Dh)),
                None,
            )  # fmt: skip
            if match is not None:
                overwrite[name], base = rope_tables(theta, Dh, max(rows, 1))[match], base or theta
                notes.append(
                    f"{name}: RoPE {match} (base {theta:g}) to float32 precision; overwritten with the float64 "
                    "values for the float64 comparison"
                )
                break
    return overwrite, base
