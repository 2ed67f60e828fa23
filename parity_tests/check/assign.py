"""Dealing the user's pieces to the reference's units, and the config their shapes imply.

`infer(level, structure, given)` returns the config the user's module is judged as (its sizes read from the
shapes, its heads from the recorded forward, the rest from `given` or the reference's defaults) and the links
(mapping.Link) from every user parameter to the reference's tensors. Reference biases the user's linears lack are
returned as `zero`: held at zero, their gradients not compared. Llama's parts are read here too: grouped-query
attention from the k/v width (kv_width), SwiGLU's gate, up and down (gated_groups), RMSNorm from a norm without a
shift. The links are made unit by unit by the level's linker (linking.py); the tables built in float32 are read
in tables.py.
"""

from __future__ import annotations

import dataclasses
import re

from numpy_transformer import TransformerConfig

from .level_table import LEVELS
from .linking import LINKS, Dealt, Linker


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
    each F -> D one (Llama's SwiGLU), dealt three at a time in the order of first use; None for plain blocks. The
    down projection is the F -> D one; gate and up by their roles: the recorded forward's (the gate the one the
    activation reads) unless names say (gate/up, Meta's w1/w3); in order (gate first) only where neither tells."""
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


def sized_config(level: str, found, given: dict):
    """The config the shapes alone give (nothing dealt): what sizes the probe a component's forward is recorded
    on before its roles are read from it (one head where none is given: the probe does not depend on it)."""
    entry = LEVELS[level]
    fields = {"n_heads": 1} | {k: v for k, v in given.items() if k != "config" and v is not None}
    dealt = _sizes(entry, found, given.get("config"), fields)
    _tables(entry, found, dealt)
    return _config(entry, found, dealt, given.get("config"), fields)


def infer(level: str, found, given: dict, mapped: tuple | None = None) -> tuple:
    """(config, links, zero, tables) for the user's module at `level`; see the module docstring. `mapped`: the
    (links, zero) of a caller's mapping=, which replace the dealt ones; the layers are then counted from it where
    the pieces cannot be dealt."""
    entry = LEVELS[level]
    fields = {k: v for k, v in given.items() if k != "config" and v is not None}
    dealt = _sizes(entry, found, given.get("config"), fields)
    _tables(entry, found, dealt)
    try:
        _pieces(entry, list(found.pieces), dealt)
        _layers(entry, dealt)
    except ValueError:
        if mapped is None:
            raise
        _counted(entry, dealt, mapped[0])  # the caller's map says where each parameter goes: the layers from it
    cfg = _config(entry, found, dealt, given.get("config"), fields)
    fixed = [t for t in dealt.position_tables if not t.trainable]
    if mapped is not None:  # read before anything dealt could refuse: the caller's map is the map
        return cfg, *mapped, fixed
    linker = Linker(entry, cfg, dealt)
    LINKS[entry.unit or entry.group](linker, dealt, found)
    return cfg, [link for link in linker.links if link.user != "(tied)"], linker.zero, fixed


def _sizes(entry, found, cfg, fields: dict) -> Dealt:
    """d_model, heads and d_ff: as given, else read from the shapes (d_model the most common input width, or a
    norm's or a table's width; d_ff the other input width), heads from the recorded forward (dataflow.Flow)."""
    pieces, norms, tables = found.pieces, found.norms, found.tables
    D = fields.get("d_model") or (cfg.d_model if cfg else None)
    if D is None and pieces and not norms:
        widths = [p.in_features for p in pieces]
        D = max(widths, key=widths.count)  # the most common input width (a gated block: gate and up read D)
    if D is None:
        D = norms[0].size if norms else (tables[0].width if tables else None)
    if D is None and entry.unit != "heads":
        raise ValueError(f"cannot tell d_model from the module's parameters at level {entry.name!r}: pass d_model=")
    H = fields.get("n_heads") or (cfg.n_heads if cfg else None) or _flow_heads(found.flow, D)
    if H is None and entry.heads:
        raise ValueError(
            f"the number of heads cannot be read from the recorded forward: pass n_heads= ({entry.name!r})"
        )
    ffn_in = [p for p in pieces if p.in_features not in (D,)]
    F = ffn_in[0].in_features if ffn_in else 4 * (D or 8)
    return Dealt(D, H, F, D, norms=list(norms), flow=found.flow, qk_norms=found.qk_norms)


def _flow_heads(flow, D) -> int | None:
    """The head count the recorded forward shows: the query's head axis, else d_model over the head width."""
    if flow is None:
        return None
    if flow.heads:
        return flow.heads
    return D // flow.head_dim if D and flow.head_dim and D % flow.head_dim == 0 else None


ATTENTION_ROLES = ("q", "k", "v", "out", "qkv")


def _tables(entry, found, dealt: Dealt) -> None:
    """Token and position tables of width d_model, and BERT's token-type table among the token tables."""
    dealt.token_tables = [t for t in found.tables if not t.position and t.width == dealt.D]
    dealt.position_tables = [t for t in found.tables if t.position and t.width == dealt.D]
    if entry.group == "model" and entry.encoder_only and dealt.flow is not None:
        # BERT's token types: the table looked up with one id everywhere (the model's default token_type_ids)
        types = [t for t in dealt.token_tables if t.name in dealt.flow.constant_lookups]
        dealt.type_table = types[0] if len(types) == 1 and len(dealt.token_tables) > 1 else None
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
    roles = dealt.flow.roles if dealt.flow is not None else {}
    if pieces and all(p.weight in roles for p in pieces):  # the recorded forward says which projections attend
        dealt.attention = [p for p in pieces if roles[p.weight] in ATTENTION_ROLES]
    else:
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
    if entry.group == "model" and dealt.flow is not None and len(dealt.norms) > dealt.layer_norms:
        _extra_norms(entry, dealt)


def _extra_norms(entry, dealt: Dealt) -> None:
    """Norms beyond the layers', read from the flow: norms of the embeddings (those that read only lookups, less
    a pre-norm first layer's own: BERT's embeddings.LayerNorm, BART's layernorm_embedding); the rest are final
    norms, after pre- or post-norm layers (nn.TransformerEncoder(norm=...) on post-norm layers)."""
    flow, stacks = dealt.flow, len(entry.stacks)
    first = [n for n in dealt.norms if not flow.computed_from_projections(n.weight)]
    dealt.embedding_norm = len(first) - (stacks if flow.norm_first else 0) == stacks
    dealt.layer_norms += stacks * dealt.embedding_norm


def _counted(entry, dealt: Dealt, links: list) -> None:
    """The layers a caller's map names ({stack}.layers.N....), their norms, and a gated block where it names one."""
    names = [n for link in links for n, _ in link.parts]
    for stack in ("encoder", "decoder"):
        layers = {int(m.group(1)) for n in names if (m := re.match(rf"{stack}\.layers\.(\d+)\.", n))}
        setattr(dealt, "n_enc" if stack == "encoder" else "n_dec", max(layers, default=-1) + 1)
    dealt.layer_norms = entry.layer_norm_count(dealt.n_enc, dealt.n_dec)
    dealt.gated = [] if any(".gate." in n or n.startswith("gate.") for n in names) else None


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
        max_len=max((t.rows - t.offset for t in dealt.position_tables), default=64),
        layer_norm_eps=next((n.eps for n in norms if n.eps is not None), 1e-6 if rms else 1e-5),
        norm="rms" if rms or entry.unit == "rms_norm" else "layer",
        gated_ffn=dealt.gated is not None,
        n_kv_heads=kv // (D // H) if H and kv != D else None,
        qk_norm=bool(found.qk_norms),
        type_vocab_size=dealt.type_table.rows if dealt.type_table is not None else 0,
        embedding_norm=dealt.embedding_norm,
        d_model=D or 8,
        n_heads=H or 2,
        d_ff=dealt.F,
    )
    if dealt.gated is not None:
        base["activation"] = "silu"
    pads = {t.padding_idx for t in token_tables if t.padding_idx is not None}
    if len(pads) == 1:  # the pad id the model's tables say (BART's 1)
        base["pad_id"] = pads.pop()
    finals = len(norms) > dealt.layer_norms  # norms after the last layer
    if dealt.flow is not None and dealt.flow.norm_first is not None:  # where the flow applies the layers' norms
        base["norm_first"] = dealt.flow.norm_first
        if entry.final_norms == "pre-norm" and finals != base["norm_first"]:
            base["final_norm"] = finals  # post-norm layers and a final norm, or pre-norm layers without one
    elif entry.final_norms == "pre-norm" and finals:
        base["norm_first"] = True  # a final norm: pre-norm layers
    return TransformerConfig(**(base | known))
