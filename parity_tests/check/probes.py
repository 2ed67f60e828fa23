"""The reference's inputs at each level (levels.py names each level's builder): random inputs with padding,
batch-first, as the reference takes them, tiny (SIZES: three sequences, 5 queries, 6 keys; an example call's own
where check.module is given one): a check runs in a second."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Sizes:
    B: int = 3  # three sequences: a (B, 1, T) mask read as (1, B, 1, T) against two heads fails, not broadcasts
    T_Q: int = 5  # T_q != T_k where a level has two sequences
    T_K: int = 6
    pads: bool = True  # False: token ids padded nowhere (an example that pads nothing, to a model masking no pad)


SIZES = Sizes()
B = SIZES.B


@dataclass(frozen=True)
class Probe:
    """The reference's inputs, batch-first: `floats` differentiated, `ids` token ids, `src_keep` / `tgt_keep` (B, T)
    True at real positions, `causal` whether the self-attention is causal, `valid` (B, T_out) the outputs compared."""

    floats: dict = field(default_factory=dict)
    ids: dict = field(default_factory=dict)
    src_keep: np.ndarray | None = None
    tgt_keep: np.ndarray | None = None
    causal: bool = False
    valid: np.ndarray | None = None
    self_attention: bool = False

    def astype(self, dtype) -> Probe:
        return dataclasses.replace(self, floats={k: v.astype(dtype) for k, v in self.floats.items()})


def keep(B: int, T: int, row: int = 1, n_pad: int = 2) -> np.ndarray:
    """(B, T) True at real positions; the sequence `row` ends with n_pad padding positions."""
    kept = np.ones((B, T), dtype=bool)
    kept[row, T - n_pad :] = False
    return kept


def token_ids(rng, kept, vocab: int, pad_id: int | None) -> np.ndarray:
    """Random ids (B, T) below `vocab`, pad_id at the padding positions and nowhere else."""
    low = 0 if pad_id is None else pad_id + 1
    ids = rng.integers(low, vocab, size=kept.shape)
    if pad_id is not None:
        ids[~kept] = pad_id
    return ids


def keep_mask(p: Probe, kind: str, window: int | None = None) -> np.ndarray | None:
    """The reference's boolean mask (True = may attend) for one attention, broadcastable to (B, H, T_q, T_k):
    kind "src" (padding of the keys; with a `window`, an encoder's band |i - j| <= window // 2 too: ModernBERT's
    local layers), "self" (the decoder's: causal, within a sliding `window`: keys i - window < j <= i), "cross" (the
    source's padding), "tgt" (the target's padding)."""
    if kind in ("src", "cross", "tgt"):
        kept = p.tgt_keep if kind == "tgt" else p.src_keep
        keep = None if kept is None else kept[:, None, None, :]
        if window is None:
            return keep
        i = np.arange(kept.shape[1] if kept is not None else p.floats["x"].shape[1])
        band = (np.abs(i[:, None] - i[None, :]) <= window // 2)[None, None]
        return band if keep is None else keep & band
    if kind == "self":
        T = p.tgt_keep.shape[1] if p.tgt_keep is not None else p.floats["x"].shape[1]
        band = np.triu(np.ones((T, T), dtype=bool), 1 - window) if window else True
        return (np.tril(np.ones((T, T), dtype=bool)) & band)[None, None]  # query i sees keys j <= i
    raise ValueError(f"kind must be 'src', 'self', 'cross' or 'tgt', got {kind!r}")


# -- one builder per kind of input: (cfg, rng, self_attention, causal, sizes) -> Probe ---------------------------


def heads(cfg, rng, self_attention=False, causal=False, sizes=SIZES) -> Probe:
    """q (B, H, T_q, Dh), k and v (B, H, T_k, Dh): heads already split; the keys padded."""
    B, H, Dh = sizes.B, cfg.n_heads, cfg.d_head
    shapes = {"q": (B, H, sizes.T_Q, Dh), "k": (B, H, sizes.T_K, Dh), "v": (B, H, sizes.T_K, Dh)}
    return Probe(floats={n: rng.standard_normal(s) for n, s in shapes.items()}, src_keep=keep(B, sizes.T_K))


def attention(cfg, rng, self_attention=False, causal=False, sizes=SIZES) -> Probe:
    """query, key, value (B, T, D), or one input for a self-attention; the keys padded, every output compared. A
    causal self-attention (Llama's) has no padding mask: its third sequence's last position is not compared."""
    if causal:
        return dataclasses.replace(_builder({"query": "T_K"}, tgt="T_K")(cfg, rng, sizes=sizes), self_attention=True)
    inputs = {"query": "T_K"} if self_attention else {"query": "T_Q", "key": "T_K", "value": "T_K"}
    p = _builder(inputs, src=True)(cfg, rng, sizes=sizes)
    return dataclasses.replace(p, valid=None, self_attention=self_attention)


def _builder(floats: dict, ids: dict | None = None, src: bool = False, tgt: str | None = None):
    """The builder of a probe of floats (B, T, D) (`floats`: name -> the Sizes field of its T) and token ids (B, T)
    (`ids`: name -> "src" or "tgt", whose padding and vocabulary they take): the keys (T_K) padded where `src`; where
    `tgt` names the queries' length, causal, its third sequence ending in padding. Token ids alone are padded only
    where the model has a pad id. The outputs compared: the queries' real ones (the keys' where nothing is causal)."""

    def build(cfg, rng, self_attention=False, causal=False, sizes=SIZES) -> Probe:
        made = {n: rng.standard_normal((sizes.B, getattr(sizes, T), cfg.d_model)) for n, T in floats.items()}
        padded = bool(floats) or cfg.pad_id is not None and sizes.pads
        kept = {"src": keep(sizes.B, sizes.T_K, n_pad=2 * padded) if src else None}
        kept["tgt"] = keep(sizes.B, getattr(sizes, tgt), 2, int(padded)) if tgt is not None else None
        vocab = {"src": cfg.src_vocab_size, "tgt": cfg.tgt_vocab_size}
        made_ids = {n: token_ids(rng, kept[s], vocab[s], cfg.pad_id) for n, s in (ids or {}).items()}
        valid = kept["tgt"] if tgt is not None else kept["src"]
        return Probe(made, made_ids, kept["src"], kept["tgt"], tgt is not None, valid)

    return build


features = _builder({"x": "T_K"})  # a position-wise component (a norm, a feed-forward, positions added)
padded_features = _builder({"x": "T_K"}, src=True)  # an encoder layer or stack (bidirectional self-attention)
causal_features = _builder({"x": "T_K"}, tgt="T_K")  # a causal self-attention only: one sequence ends in padding
# a decoder layer (causal self-, padded cross-attention); torch.nn.Transformer's two stacks (embeddings in)
features_and_memory = _builder({"x": "T_Q", "memory": "T_K"}, src=True, tgt="T_Q")
source_and_target = _builder({"src": "T_K", "tgt": "T_Q"}, src=True, tgt="T_Q")
source_and_target_ids = _builder({}, {"src": "src", "tgt": "tgt"}, src=True, tgt="T_K")  # an encoder-decoder model
target_ids = _builder({}, {"ids": "tgt"}, tgt="T_K")  # a language model
source_ids = _builder({}, {"ids": "src"}, src=True)  # an encoder model (bidirectional)
target_ids_and_memory = _builder({"memory": "T_K"}, {"tgt": "tgt"}, src=True, tgt="T_Q")  # a decoder stack


def vocabulary(cfg, rng, self_attention=False, causal=False, sizes=SIZES) -> Probe:
    """ids (B, T) over the whole (source) vocabulary: an embedding."""
    return Probe(ids={"ids": rng.integers(0, cfg.src_vocab_size, size=(sizes.B, sizes.T_K))})


def model_ids(inputs: list, tables: list, B: int, T: int | None = None) -> Probe:
    """A model's probe where its forward is recorded: small ids (T long: by default at most 6; a longer check's or an
    example's length) for each of `inputs` (a memory: floats), nothing padded, no id a table's padding_idx (RoBERTa
    numbers its positions from the ids that are not padding)."""
    # rows: the smallest table's beyond a handful (BERT's two token types are not the vocabulary)
    rows = min((t.rows for t in tables if t.rows > 4), default=min(t.rows for t in tables))
    T = min(SIZES.T_K, rows) if T is None else T
    low = max([t.padding_idx + 1 for t in tables if t.padding_idx is not None and t.padding_idx < 4] + [1])
    ids = dict.fromkeys(inputs, np.random.default_rng(0).integers(low, max(rows, low + 1), size=(B, T)))
    memory = ids.pop("memory", None) is not None  # the decoder's memory is a float input
    floats = {"memory": np.random.default_rng(1).standard_normal((B, T, tables[0].width))} if memory else {}
    return Probe(floats, ids, np.ones((B, T), bool), np.ones((B, T), bool))
