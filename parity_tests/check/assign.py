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

import numpy as np
from torch import nn

from numpy_transformer import TransformerConfig

from . import levels as LV
from .level_table import STACKS_OF
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


def infer(level: str, found, module, given: dict) -> tuple:
    """(config, links, zero, tables) for the user's module at `level`; see the module docstring."""
    cfg = given.get("config")
    fields = {k: v for k, v in given.items() if k != "config" and v is not None}
    pieces, norms, tables = list(found.pieces), list(found.norms), list(found.tables)
    D = fields.get("d_model") or (cfg.d_model if cfg else None)
    if D is None and pieces and not norms:
        widths = [p.in_features for p in pieces]
        D = max(widths, key=widths.count)  # the most common input width (a gated block: gate and up read D)
    if D is None:
        D = norms[0].size if norms else (tables[0].width if tables else None)
    if D is None and level != "scaled_dot_product_attention":
        raise ValueError(f"cannot tell d_model from the module's parameters at level {level!r}: pass d_model=")
    H = fields.get("n_heads") or (cfg.n_heads if cfg else None) or find_heads(module)
    if H is None and level in ("multi_head_attention", LV.STACKS) + LV.LAYERS + LV.MODELS:
        raise ValueError(f"the number of heads cannot be read from the module: pass n_heads= (level {level!r})")
    sizes = dict(d_model=D or 8, n_heads=H or 2)
    ffn_in = [p for p in pieces if p.in_features not in (D,)]
    F = ffn_in[0].in_features if ffn_in else 4 * (D or 8)
    sizes["d_ff"] = F
    token_tables = [t for t in tables if not t.position and t.width == D]
    position_tables = [t for t in tables if t.position and t.width == D]
    type_table = token_type_table(level, token_tables)
    if type_table is not None:
        token_tables.remove(type_table)
    links, zero, fixed = [], [], []

    # The output projection: a linear D -> V whose V is the (target) token table's rows.
    out_piece = None
    if level in ("transformer", "transformer_lm") and token_tables:
        V_tgt = token_tables[-1].rows
        candidates = [p for p in pieces if p.in_features == D and p.out_features == V_tgt and p.out_features != F]
        out_piece = candidates[-1] if candidates else None
        if out_piece is not None:
            pieces.remove(out_piece)
    if level == "decoder" and token_tables:
        extra = [p for p in pieces if p.in_features == D and p.out_features == token_tables[-1].rows]
        if extra:
            raise ValueError(
                f"the module has an output projection ({extra[-1].weight}); the reference 'decoder' is the stack "
                "before it: check the whole model as 'transformer', or pass call= returning the decoder's hidden states"
            )
    attention = [p for p in pieces if p.in_features == D and p.out_features != F]
    ffn = [p for p in pieces if p not in attention]
    if level == "gated_feed_forward":
        attention, ffn = [], pieces
    kv = kv_width(attention, D, H) if H and D else D
    chunks = _chunks(attention, D, kv) if level in ("multi_head_attention", LV.STACKS) + LV.LAYERS + LV.MODELS else []
    gated = gated_groups(ffn, D, F)
    if level == "gated_feed_forward" and gated is None:
        listed = ", ".join(f"{p.weight} ({p.in_features} -> {p.out_features})" for p in pieces)
        raise ValueError(
            f"cannot read {listed} as a gated feed-forward block: expected two D -> F linears (gate and up) and "
            "one F -> D (down), D the input width; a two-linear block is checked as 'feed_forward'"
        )
    ffn_pairs = gated if gated is not None else [ffn[i : i + 2] for i in range(0, len(ffn), 2)]
    has_bias = any(p.bias is not None for p in attention + ffn) if attention + ffn else True

    n_enc = n_dec = 0
    if level in ("transformer", LV.STACKS):
        n_dec = len(chunks) - len(ffn_pairs)
        n_enc = len(ffn_pairs) - n_dec
    elif level == "transformer_lm":
        n_dec = len(chunks)
    elif level == "decoder":
        n_dec = len(chunks) // 2
    elif level == "encoder_model":
        n_enc = len(chunks)
    elif level in LV.LAYERS:
        n_enc = n_dec = 1
    layer_norms = 2 * n_enc + 3 * n_dec if level in ("transformer",) else 2 * (n_enc or n_dec)
    rms = bool(norms) and all(n.kind == "rms" for n in norms)
    if level == "transformer_lm":
        layer_norms = 2 * n_dec
    if level == "decoder":
        layer_norms = 3 * n_dec
    embedding_norm = level == "encoder_model" and _embedding_norm(norms, layer_norms, token_tables)
    if embedding_norm:
        layer_norms += 1
    final = level in LV.MODELS and len(norms) > layer_norms
    base = dict(
        src_vocab_size=token_tables[0].rows if token_tables else 32,
        tgt_vocab_size=token_tables[-1].rows if token_tables else 32,
        n_encoder_layers=n_enc,
        n_decoder_layers=n_dec,
        bias=bool(has_bias),
        output_bias=out_piece is not None and out_piece.bias is not None or bool(found.orphans),
        tie_embeddings=level in ("transformer", "transformer_lm") and out_piece is None,
        share_embeddings=level == "transformer" and len(token_tables) == 1,
        positional="learned" if any(t.trainable for t in position_tables) else "sinusoidal",
        max_len=max((t.rows for t in position_tables), default=64),
        layer_norm_eps=next((n.eps for n in norms if n.eps is not None), 1e-6 if rms else 1e-5),
        norm="rms" if rms or level == "rms_norm" else "layer",
        gated_ffn=gated is not None,
        n_kv_heads=kv // (D // H) if H and kv != D else None,
        type_vocab_size=type_table.rows if type_table is not None else 0,
        embedding_norm=embedding_norm,
    )
    if gated is not None:
        base["activation"] = "silu"
    if final:
        base["norm_first"] = True
    base |= sizes
    if cfg is not None:
        cfg = dataclasses.replace(
            cfg, **{k: v for k, v in fields.items() if k in TransformerConfig.__dataclass_fields__}
        )
    else:
        known = {k: v for k, v in fields.items() if k in TransformerConfig.__dataclass_fields__}
        cfg = TransformerConfig(**(base | known))

    def norm_link(norm, prefix):
        links.append(Link(norm.weight, [(f"{prefix}weight", None)]))
        if norm.bias is not None:
            links.append(Link(norm.bias, [(f"{prefix}bias", None)]))

    def ffn_link(pair, prefix):
        if gated is not None:
            names = ("gate", "linear1", "linear2")
        elif len(pair) != 2 or pair[0].out_features != F or pair[1].in_features != F:
            raise ValueError(
                f"cannot read {[p.weight for p in pair]} as a feed-forward block {D} -> {F} -> {D}; pass mapping="
            )
        else:
            names = ("linear1", "linear2")
        for p, name in zip(pair, names, strict=True):
            links.append(
                Link(
                    p.weight,
                    [(f"{prefix}{name}.weight", None)],
                    p.transposed,
                    "transposed" if p.transposed else "as is",
                )
            )
            if p.bias is not None:
                links.append(Link(p.bias, [(f"{prefix}{name}.bias", None)]))
            elif cfg.bias:
                zero.append(f"{prefix}{name}.bias")

    def attn_link(chunk, prefix):
        got, held = attention_links(chunk, prefix.rstrip("."), D, cfg.n_heads, cfg.bias, kv)
        links.extend(got)
        zero.extend(held)

    def layer(prefix, i, decoder, chunk_iter, norm_iter, ffn_iter):
        attn_link(next(chunk_iter), f"{prefix}self_attn.")
        names = ["self_attn_norm"] + (["cross_attn_norm"] if decoder else []) + ["ffn_norm"]
        if decoder:
            attn_link(next(chunk_iter), f"{prefix}cross_attn.")
        ffn_link(next(ffn_iter), f"{prefix}ffn.")
        for name in names:
            norm_link(next(norm_iter), f"{prefix}{name}.")

    def count(what, got, expected):
        if got != expected:
            raise ValueError(f"found {got} {what} in the module, the reference {level!r} has {expected}; pass mapping=")

    if level == "multi_head_attention":
        count("attentions", len(chunks), 1)
        attn_link(chunks[0], "")
    elif level in ("layer_norm", "rms_norm"):
        count("norms", len(norms), 1)
        norm_link(norms[0], "")
    elif level == "feed_forward":
        if gated is not None:
            raise ValueError(
                f"{[p.weight for p in pieces]} is a gated feed-forward block (gate, up and down); check it as "
                "'gated_feed_forward'"
            )
        count("feed-forward pieces", len(ffn) + len(attention), 2)
        ffn_link(sorted(pieces, key=lambda p: p.in_features != D), "")
    elif level == "gated_feed_forward":
        count("gated feed-forward blocks", len(gated), 1)
        ffn_link(gated[0], "")
    elif level == "embedding":
        count("token tables", len(token_tables), 1)
        links.append(Link(token_tables[0].name, [("token_embedding.weight", None)]))
    elif level == "positional_encoding":
        if cfg.positional == "learned":
            links.append(Link(position_tables[0].name, [("position_embedding.weight", None)]))
    elif level == LV.STACKS:
        count("norms", len(norms), 2 * n_enc + 3 * n_dec + 2)
        chunk_iter, norm_iter, ffn_iter = iter(chunks), iter(norms), iter(ffn_pairs)
        for stack, n in zip(STACKS_OF[LV.STACKS], (n_enc, n_dec), strict=True):
            for i in range(n):
                layer(f"{stack}.layers.{i}.", i, stack == "decoder", chunk_iter, norm_iter, ffn_iter)
            norm_link(next(norm_iter), f"{stack}.final_norm.")
    elif level in LV.LAYERS:
        decoder = level == "decoder_layer"
        count("attentions", len(chunks), 2 if decoder else 1)
        count("norms", len(norms), 3 if decoder else 2)
        layer("", 0, decoder, iter(chunks), iter(norms), iter(ffn_pairs))
    elif level in LV.MODELS:
        chunk_iter, norm_iter, ffn_iter = iter(chunks), iter(norms), iter(ffn_pairs)
        token_iter = iter(token_tables)
        learned = iter([t for t in position_tables if t.trainable])
        expected_norms = layer_norms + (len(STACKS_OF[level]) if cfg.norm_first else 0)
        count("norms", len(norms), expected_norms)
        for stack in STACKS_OF[level]:
            if not (stack == "encoder" and cfg.share_embeddings):
                table = next(token_iter, None)
                if table is None:
                    raise ValueError(f"no token table found for the {stack}; pass mapping=")
                links.append(Link(table.name, [(f"{stack}.token_embedding.weight", None)]))
            if cfg.positional == "learned":
                links.append(Link(next(learned).name, [(f"{stack}.position_embedding.weight", None)]))
            if stack == "encoder" and type_table is not None:
                links.append(Link(type_table.name, [("encoder.token_type_embedding.weight", None)]))
            if stack == "encoder" and embedding_norm:
                norm_link(next(norm_iter), "encoder.embedding_norm.")
            n = cfg.n_encoder_layers if stack == "encoder" else cfg.n_decoder_layers
            for i in range(n):
                layer(
                    f"{stack}.layers.{i}.",
                    i,
                    stack == "decoder" and level in ("transformer", "decoder"),
                    chunk_iter,
                    norm_iter,
                    ffn_iter,
                )
            if cfg.norm_first:
                norm_link(next(norm_iter), f"{stack}.final_norm.")
        if level in ("transformer", "transformer_lm"):
            if out_piece is not None:
                links.append(
                    Link(
                        out_piece.weight,
                        [("output_proj.weight", None)],
                        out_piece.transposed,
                        "transposed" if out_piece.transposed else "as is",
                    )
                )
                if out_piece.bias is not None:
                    links.append(Link(out_piece.bias, [("output_proj.bias", None)]))
            elif found.orphans:
                links.append(Link(found.orphans[0], [("output_proj.bias", None)]))
            if cfg.tie_embeddings:
                links.append(Link("(tied)", [("decoder.token_embedding.weight", None)], note="tied output projection"))
    fixed = [t for t in position_tables if not t.trainable]
    return cfg, [link for link in links if link.user != "(tied)"], zero, fixed


TYPE_WORDS = re.compile(r"(token_?type|segment|type_emb|tok_type|seg_emb)")


def token_type_table(level: str, token_tables: list):
    """BERT's token-type table among an encoder model's token tables: the one named for types or segments
    (token_type_embeddings, segment_embedding), else, of two tables, the second when it has fewer rows than the
    first (a handful of types against a vocabulary). None for other levels and for models without one."""
    if level != "encoder_model" or len(token_tables) < 2:
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
