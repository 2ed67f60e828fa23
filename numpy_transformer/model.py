"""Encoder and decoder layers, the stacks, and the three model objects, forward and backward.

Composite pairs take a params dict keyed by the state-dict names below their prefix and return a
grads dict with the same keys. Every composite forward takes params first, then the arrays it transforms, then
the config, then its options; every backward takes (dout, cache) and returns a fixed number of values. Each pair's
cache is a frozen dataclass named after it (EmbedCache, FfnCache, SublayerOutCache, LayerCache, EncoderStackCache,
DecoderStackCache, and one per model class: TransformerCache, LMCache, EncoderModelCache), read by its backward
only. Where a pair chooses between pairs (the norm, the feed-forward block, the sublayer's join), one table beside
them (NORM_PAIRS, FFN_PAIRS, JOIN_PAIRS) is read by its forward, and its backward reads the chosen entry back by the
name the cache kept. `Transformer`, `TransformerLM` and `EncoderModel` are the only stateful objects: they hold
`params` and `grads` keyed by the full state-dict names.

Shape letters: B batch, T_src / T_tgt sequence lengths, D d_model, H heads, V vocabulary.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Self, TypeVar

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from transformer_spec.config import GenerationRules, TransformerConfig
from transformer_spec.shapes import parameter_shapes

from .attention import (
    AttentionCache,
    KVCache,
    MemoryCache,
    ScaledDotProductAttentionCache,
    multi_head_attention_backward,
    multi_head_attention_forward,
    rope_angles,
)
from .deepseek_moe import DeepseekMoeCache, deepseek_moe_backward, deepseek_moe_forward
from .gpt_oss_moe import GptOssMoeCache, gpt_oss_moe_backward, gpt_oss_moe_forward
from .latent_attention import LatentAttentionCache, LatentCache, latent_attention_backward, latent_attention_forward
from .layers import (
    ACTIVATIONS,
    ActivationPair,
    AddPositionsCache,
    Dropout,
    DropoutCache,
    EmbeddingCache,
    FeedForwardCache,
    GatedFeedForwardCache,
    LayerNormCache,
    LinearCache,
    NormCache,
    ResidualInCache,
    ResidualOutCache,
    SandwichOutCache,
    SoftcapCache,
    TanhCache,
    add_positions_backward,
    add_positions_forward,
    dropout_backward,
    dropout_site,
    embedding_backward,
    embedding_forward,
    feed_forward_backward,
    feed_forward_forward,
    gated_feed_forward_backward,
    gated_feed_forward_forward,
    layer_norm_backward,
    layer_norm_forward,
    linear_backward,
    linear_forward,
    norm_backward,
    norm_forward,
    residual_in_backward,
    residual_in_forward,
    residual_out_backward,
    residual_out_forward,
    sandwich_out_backward,
    sandwich_out_forward,
    sinusoidal_table,
    softcap_backward,
    softcap_forward,
    tanh_backward,
    tanh_forward,
)
from .moe import (
    LoadBalancingCache,
    SparseMoeCache,
    load_balancing_loss_backward,
    load_balancing_loss_forward,
    sparse_moe_backward,
    sparse_moe_forward,
)
from .scores import ScoreMod, alibi_slopes
from .sinks import SinkAttentionCache
from .validation import (
    check_attention_mask,
    check_bool,
    check_float_array,
    check_ids,
    check_ndim,
    mask_positions,
    pad_offset_positions,
)


def sub(params: dict, prefix: str) -> dict:
    """The entries of `params` below `prefix`, with the prefix removed: sub(p, "ffn")["linear1.bias"]."""
    start = len(prefix) + 1
    return {k[start:]: v for k, v in params.items() if k.startswith(prefix + ".")}


def prefixed(grads: dict, prefix: str) -> dict:
    """The inverse of `sub`: put `prefix.` in front of every key."""
    return {f"{prefix}.{k}": v for k, v in grads.items()}


# ----------------------------------------------------------------------------------------------
# Masks: boolean, True = may attend, broadcastable to (B, H, T_q, T_k).


def padding_mask(ids: np.ndarray, pad_id: int | None) -> np.ndarray | None:
    """Keys that hold pad_id are masked out for every query. (B, T) -> (B, 1, 1, T); None (nothing
    masked) when there is no padding token (pad_id None, as in GPT-2)."""
    if pad_id is None:
        return None
    return (ids != pad_id)[:, None, None, :]


def source_mask(ids: np.ndarray, attention_mask: np.ndarray | None, pad_id: int | None) -> np.ndarray | None:
    """The keys an encoder's attention and cross-attention may read, (B, 1, 1, S): the real tokens of
    attention_mask (B, S) when given (transformers' meaning, whatever ids they hold), else those not holding pad_id
    (padding_mask); None when neither masks anything."""
    if attention_mask is None:
        return padding_mask(ids, pad_id)
    return attention_mask[:, None, None, :]


def rope_for(
    config: TransformerConfig,
    T: int,
    dtype: DTypeLike,
    start: int = 0,
    positions: np.ndarray | None = None,
    layer: int | None = None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """The rotary (cos, sin) tables of positions start .. start + T - 1, each (T, R/2), or of each row's own
    `positions` (B, T) (a padded batch), each (B, 1, T, R/2), broadcast over the heads, of layer `layer` (its base,
    config.layer_rope_theta, and its scaling, config.layer_rope_scaling; None: rope_theta and rope_scaling); None
    unless the config's positions are rotary. R = config.rope_dim, the features of a head RoPE turns (Dh, or fewer:
    partial rotary)."""
    if config.positional != "rope":
        return None
    theta = config.rope_theta if layer is None else config.layer_rope_theta(layer)
    scaling = config.rope_scaling if layer is None else config.layer_rope_scaling(layer)
    where = np.arange(start, start + T) if positions is None else positions
    cos, sin = rope_angles(where, config.rope_dim, theta, dtype, scaling, config.max_len)  # (T or B, T, R/2) each
    return (cos, sin) if positions is None else (cos[:, None], sin[:, None])


def rope_by_layer(
    config: TransformerConfig,
    n_layers: int,
    T: int,
    dtype: DTypeLike,
    start: int = 0,
    positions: np.ndarray | None = None,
) -> list[tuple[np.ndarray, np.ndarray] | None]:
    """Each layer's rotary tables (rope_for), at its kind's base and scaling (config.layer_rope_theta and
    layer_rope_scaling: Gemma 3's and ModernBERT's sliding layers have their own base and scaling), computed once per
    kind; Nones unless the positions are rotary, and None for a layer without positions (config.layer_uses_rope
    False: SmolLM3's NoPE layers, whose attention then rotates nothing)."""
    tables: dict = {}
    kinds = [(config.layer_rope_theta(i), config.layer_rope_scaling(i)) for i in range(n_layers)]
    for i, kind in enumerate(kinds):
        if kind not in tables:
            tables[kind] = rope_for(config, T, dtype, start, positions, layer=i)
    return [tables[kind] if config.layer_uses_rope(i) else None for i, kind in enumerate(kinds)]  # NoPE: None


# ----------------------------------------------------------------------------------------------
# Embeddings: x = scale * E[ids] + P[:T], then dropout.


@functools.lru_cache(maxsize=8)  # tables of at most twice the positions a call used (sinusoid_rows): bounded
def _fixed_sinusoids(max_len: int, d_model: int, dtype_name: str, layout: str = "interleaved") -> np.ndarray:
    table = sinusoidal_table(max_len, d_model, np.dtype(dtype_name), layout)
    table.flags.writeable = False  # shared between calls
    return table


def sinusoid_rows(used: int, max_len: int) -> int:
    """Rows of the sinusoid table to build for `used` positions: the next power of two (so that decoding step by
    step builds a few tables, not one per step), never more than max_len. A table for max_len itself could be huge
    (Marian's max_position_embeddings may say 10**9) while an input uses a few positions."""
    return min(max_len, 1 << max(used - 1, 0).bit_length())


@dataclass(frozen=True, slots=True)
class EmbedCache:
    tokens: EmbeddingCache  # the token table's lookup
    positions: AddPositionsCache | None  # PE[start : start + T] added (sinusoidal or learned), or None
    position_rows: EmbeddingCache | None  # PE[positions], each row its own positions (a padded batch), or None
    learned: bool  # the position table is a parameter (position_embedding.weight)
    types: EmbeddingCache | None  # BERT's token types, or None
    norm: LayerNormCache | None  # the embedding norm (BERT), or None
    norm_bias: bool  # the embedding norm has a bias
    dropout: DropoutCache


def embed_forward(
    params: dict,
    ids: np.ndarray,
    config: TransformerConfig,
    dropout: Dropout | None = None,
    site: str = "encoder",
    *,
    token_type_ids: np.ndarray | None = None,
    start: int = 0,
    positions: np.ndarray | None = None,
) -> tuple[np.ndarray, EmbedCache]:
    r"""ids (B, T) -> x (B, T, D): the token table E read at the ids, the positions PE of start .. start + T - 1
    and (BERT) the token types' table added, then the embedding norm (if any), then dropout:

    .. math::

        x = \mathrm{drop}\Big(\mathrm{Norm}\big(\sqrt{D}\, E[\mathrm{ids}] + PE[\mathrm{start} : \mathrm{start} + T]
        + E_{\mathrm{type}}[\mathrm{token\_type\_ids}]\big)\Big)

    The factor :math:`\sqrt{D}` only when config.scale_embeddings (the paper's section 3.4), else 1. The positions
    are the paper's sinusoids (in config.sinusoid_layout) or the learned table position_embedding.weight;
    rotary positions (config.positional "rope") add nothing here: attention rotates queries and keys; nor does
    ALiBi ("alibi"), a bias on attention's scores.
    Token types (BERT) are added when params hold token_type_embedding.weight; token_type_ids None
    means type 0 everywhere. `start` > 0 embeds positions further on (decoding one step at a time). `positions`
    (B, T): each row's own positions instead (a padded batch), PE read at them as a token table is read at ids.
    """
    embedding = params["token_embedding.weight"]
    scale = math.sqrt(config.d_model) if config.scale_embeddings else 1.0
    padding_idx = config.pad_id if config.embedding_padding_idx else None  # lookups of pad: no gradient
    x, token_cache = embedding_forward(ids, embedding, scale, padding_idx)  # (B, T, D)
    position_cache = rows_cache = None
    if config.positional in ("sinusoidal", "learned"):  # rotary positions and ALiBi act inside attention, not here
        if config.positional == "learned":
            table = params["position_embedding.weight"]
        else:
            used = start + ids.shape[1] if positions is None else int(positions.max(initial=0)) + 1
            rows = sinusoid_rows(used, config.max_len)  # built for the positions used, not for max_len
            table = _fixed_sinusoids(rows, config.d_model, embedding.dtype.name, config.sinusoid_layout)
        if positions is None:
            x, position_cache = add_positions_forward(x, table[start:] if start else table)
        else:  # every row its own positions: PE[positions], a lookup like the tokens'
            # RoBERTa's pad tokens read row pad_id, which takes no gradient (nn.Embedding(padding_idx=pad_id))
            pad = config.pad_id if config.positions_after_pad else None
            pe, rows_cache = embedding_forward(positions, table, 1.0, pad)  # (B, T, D)
            x = x + pe
    type_cache = None
    if "token_type_embedding.weight" in params:
        if token_type_ids is None:
            token_type_ids = np.zeros(ids.shape, dtype=np.int64)
        types, type_cache = embedding_forward(token_type_ids, params["token_type_embedding.weight"])  # (B, T, D)
        x += types
    norm_cache, b = None, None
    if config.embedding_norm:  # BERT's LayerNorm of the sum
        w, b = params["embedding_norm.weight"], params.get("embedding_norm.bias")  # no bias: config.norm_bias False
        x, norm_cache = layer_norm_forward(x, w, b, config.layer_norm_eps)
    x, drop_cache = dropout_site(dropout, f"{site}.embedding_dropout", x)
    cache = EmbedCache(
        tokens=token_cache,
        positions=position_cache,
        position_rows=rows_cache,
        learned=config.positional == "learned",
        types=type_cache,
        norm=norm_cache,
        norm_bias=b is not None,
        dropout=drop_cache,
    )
    return x, cache


def embed_backward(dout: np.ndarray, cache: EmbedCache) -> dict:
    r"""Backward of the embedding, its forward lines in reverse: dropout, the embedding norm, then the
    sum x = tokens + positions + types, whose gradient dx reaches each of the three tables unchanged, added into
    the rows that were read (:math:`\sqrt{D}` when config.scale_embeddings; the padding_idx row gets none):

    .. math::

        dE[v] = \sqrt{D} \sum_{\mathrm{ids}_{bt} = v} dx_{bt}, \qquad dPE[t] = \sum_b dx_{bt}, \qquad
        dE_{\mathrm{type}}[v] = \sum_{\mathrm{types}_{bt} = v} dx_{bt}
    """
    grads = {}
    dx = dropout_backward(dout, cache.dropout)
    if cache.norm is not None:
        dx, grads["embedding_norm.weight"], dbias = layer_norm_backward(dx, cache.norm)
        if cache.norm_bias:
            grads["embedding_norm.bias"] = dbias
    if cache.types is not None:
        grads["token_type_embedding.weight"] = embedding_backward(dx, cache.types)
    dtable = None
    if cache.position_rows is not None:  # x + PE[positions]: dPE[p] sums dx over the tokens at position p
        dtable = embedding_backward(dx, cache.position_rows)
    elif cache.positions is not None:  # x + PE[start : start + T]
        dx, dtable = add_positions_backward(dx, cache.positions)
    if cache.learned and dtable is not None:
        grads["position_embedding.weight"] = dtable
    grads["token_embedding.weight"] = embedding_backward(dx, cache.tokens)
    return grads


# The options a layer is built from, each chosen in one place: attention with the config's K/V heads
# and rotary positions, the plain or gated feed-forward block, and the residual sublayer around them
# with the config's norm (layer norm or RMSNorm) in the config's place (pre- or post-norm).


def score_mod(config: TransformerConfig, causal: bool, layer: int = 0) -> ScoreMod:
    """The scores' rules of layer `layer`'s self-attention, from the config: a decoder's is causal; a sliding layer's
    window (config.layer_window) is causal in a decoder (keys i - window < j <= i) and, in an encoder of
    layer_types, a band |i - j| <= window // 2 (ModernBERT's local layers); ALiBi (positional "alibi") biases every
    self-attention; T5's buckets are bidirectional in an encoder; Gemma 2's soft cap (attn_softcap) squashes every
    score. Cross-attention gets none of these but the cap."""
    relative = None
    if config.has_relative_bias:  # T5, MPNet: bidirectional buckets in the encoder, causal ones in the decoder
        relative = (config.relative_buckets, config.relative_max_distance, not causal)
    window = config.layer_window(layer)
    band = window // 2 if window is not None and not causal and config.layer_types is not None else None
    return ScoreMod(
        scale=config.layer_attention_scale(layer),
        causal=causal,
        window=window if causal else None,
        band=band,
        alibi_slopes=alibi_slopes(config.n_heads) if config.positional == "alibi" else None,
        relative=relative,
        softcap=config.attn_softcap,
    )


def cross_score_mod(config: TransformerConfig) -> ScoreMod:
    """Cross-attention's score rules: the config's scale and soft cap, nothing else (no causality, window or
    bias)."""
    return ScoreMod(scale=config.attention_scale, softcap=config.attn_softcap)


def attention_forward(
    params: dict,
    query: np.ndarray,
    memory: np.ndarray,
    config: TransformerConfig,
    *,
    mod: ScoreMod,
    cross: bool,
    mask: np.ndarray | None = None,
    dropout: Dropout | None = None,
    site: str = "attn",
    rope: tuple[np.ndarray, np.ndarray] | None = None,
    q_pos: np.ndarray | None = None,
    kv_cache: KVCache | MemoryCache | LatentCache | None = None,
    bias_table: np.ndarray | None = None,
    key_padding: np.ndarray | None = None,
) -> tuple[np.ndarray, AttentionCache | LatentAttentionCache]:
    """Multi-head attention of query (B, T_q, D) over memory (B, T_k, D), both keys and values (memory is
    query in self-attention), with config.n_kv_heads K/V heads and the score rules `mod` (score_mod for
    self-attention: causal, sliding window, ALiBi, T5's bias; cross_score_mod for cross-attention). cross: the
    memory is another sequence (cross-attention). rope: rotary (cos, sin), or None. Decoding: q_pos, the queries'
    positions, and kv_cache; bias_table: T5's table of the stack (self-attention); key_padding (B, P): the real
    tokens by key position. With config.kv_lora_rank, self-attention is DeepSeek's latent attention
    (latent_attention.latent_attention_forward; kv_cache a LatentCache)."""
    if config.kv_lora_rank is not None and not cross:
        assert rope is not None and not isinstance(kv_cache, (KVCache, MemoryCache))
        return latent_attention_forward(
            params, query, config.n_heads, rope, mod=mod, mask=mask, dropout=dropout, site=site, q_pos=q_pos,
            kv_cache=kv_cache, key_padding=key_padding,
        )  # fmt: skip
    assert not isinstance(kv_cache, LatentCache)
    return multi_head_attention_forward(
        params, query, memory, memory, config.n_heads, mask, dropout, site,
        n_kv_heads=config.n_kv_heads, rope=rope, kernel=config.attention, mod=mod, cross=cross, q_pos=q_pos,
        kv_cache=kv_cache, bias_table=bias_table, key_padding=key_padding, qk_norm_eps=config.layer_norm_eps,
        qk_norm_kind="rms_offset" if config.norm == "rms_offset" else "rms",
        qk_norm_projection=config.qk_norm_projection,
    )  # fmt: skip


# The three feed-forward blocks on one signature, ffn_forward's (params, x, config, dropout, site, activations) and
# ffn_backward's (dout, cache, drouter_logits): what FFN_PAIRS chooses between.


def plain_ffn_forward(
    params: dict,
    x: np.ndarray,
    config: TransformerConfig,
    dropout: Dropout | None,
    site: str,
    activations: dict[str, ActivationPair],
) -> tuple[np.ndarray, FeedForwardCache]:
    """layers.feed_forward_forward with config.activation."""
    return feed_forward_forward(params, x, config.activation, dropout, site, activations)


def plain_ffn_backward(
    dout: np.ndarray, cache: FeedForwardCache, drouter_logits: np.ndarray | None
) -> tuple[np.ndarray, dict]:
    """layers.feed_forward_backward (drouter_logits must be None: the block has no router)."""
    check_no_router(drouter_logits)
    return feed_forward_backward(dout, cache)


def gated_ffn_forward(
    params: dict,
    x: np.ndarray,
    config: TransformerConfig,
    dropout: Dropout | None,
    site: str,
    activations: dict[str, ActivationPair],
) -> tuple[np.ndarray, GatedFeedForwardCache]:
    """layers.gated_feed_forward_forward with config.activation."""
    return gated_feed_forward_forward(params, x, config.activation, dropout, site, activations)


def gated_ffn_backward(
    dout: np.ndarray, cache: GatedFeedForwardCache, drouter_logits: np.ndarray | None
) -> tuple[np.ndarray, dict]:
    """layers.gated_feed_forward_backward (drouter_logits must be None: the block has no router)."""
    check_no_router(drouter_logits)
    return gated_feed_forward_backward(dout, cache)


def check_no_router(drouter_logits: np.ndarray | None) -> None:
    """A dense block's backward takes no router gradient: ValueError when one is given."""
    if drouter_logits is not None:
        raise ValueError("ffn_backward: drouter_logits given for a dense feed-forward block, which has no router")


MOE_NAMES = {"gate.weight": "router.weight"}  # moe.py's (transformers') name of the router -> ours below `ffn.`


def moe_params(params: dict) -> dict:
    """A layer's MoE params (below `ffn.`) under moe.py's names: our ffn.router.weight is transformers' mlp.gate.weight
    (ours is not `gate`: a dense gated block's ffn.gate.weight is another tensor, and Qwen3-MoE mixes both kinds)."""
    ours = {v: k for k, v in MOE_NAMES.items()}
    return {ours.get(k, k): v for k, v in params.items()}


def moe_ffn_forward(
    params: dict,
    x: np.ndarray,
    config: TransformerConfig,
    dropout: Dropout | None,
    site: str,
    activations: dict[str, ActivationPair],
) -> tuple[np.ndarray, SparseMoeCache]:
    """moe.sparse_moe_forward on ffn_forward's arguments (its experts use layers.ACTIVATIONS; no dropout)."""
    return sparse_moe_forward(moe_params(params), x, config.top_k, config.norm_topk_prob, config.activation)


def moe_ffn_backward(
    dout: np.ndarray, cache: SparseMoeCache, drouter_logits: np.ndarray | None
) -> tuple[np.ndarray, dict]:
    """moe.sparse_moe_backward, its grads under our names (router.weight)."""
    dx, grads = sparse_moe_backward(dout, cache, drouter_logits)
    return dx, {MOE_NAMES.get(k, k): v for k, v in grads.items()}


def gpt_oss_ffn_forward(
    params: dict,
    x: np.ndarray,
    config: TransformerConfig,
    dropout: Dropout | None,
    site: str,
    activations: dict[str, ActivationPair],
) -> tuple[np.ndarray, GptOssMoeCache]:
    """gpt_oss_moe.gpt_oss_moe_forward on ffn_forward's arguments (config.expert_kind "gpt_oss": the experts' own
    clamped SwiGLU, swiglu_limit and swiglu_alpha; no dropout)."""
    return gpt_oss_moe_forward(params, x, config.top_k, config.swiglu_limit, config.swiglu_alpha)


def gpt_oss_ffn_backward(
    dout: np.ndarray, cache: GptOssMoeCache, drouter_logits: np.ndarray | None
) -> tuple[np.ndarray, dict]:
    """gpt_oss_moe.gpt_oss_moe_backward (its grads already under our names below `ffn.`)."""
    return gpt_oss_moe_backward(dout, cache, drouter_logits)


def deepseek_moe_ffn_forward(
    params: dict,
    x: np.ndarray,
    config: TransformerConfig,
    dropout: Dropout | None,
    site: str,
    activations: dict[str, ActivationPair],
) -> tuple[np.ndarray, DeepseekMoeCache]:
    """deepseek_moe.deepseek_moe_forward with the config's router (scoring, groups, scaling; no dropout)."""
    return deepseek_moe_forward(
        params, x, config.top_k, scoring=config.router_scoring, n_groups=config.router_groups,
        topk_groups=config.router_topk_groups, norm_topk_prob=config.norm_topk_prob, scaling=config.routed_scaling,
        activation=config.activation,
    )  # fmt: skip


def deepseek_moe_ffn_backward(
    dout: np.ndarray, cache: DeepseekMoeCache, drouter_logits: np.ndarray | None
) -> tuple[np.ndarray, dict]:
    """deepseek_moe.deepseek_moe_backward (no load-balancing gradient: DeepSeek's auxiliary losses are not here)."""
    check_no_router(drouter_logits)
    return deepseek_moe_backward(dout, cache)


FfnCaches = FeedForwardCache | GatedFeedForwardCache | SparseMoeCache | GptOssMoeCache | DeepseekMoeCache
FfnPair = tuple[
    Callable[[dict, np.ndarray, TransformerConfig, Dropout | None, str, dict], tuple[np.ndarray, FfnCaches]],
    Callable[[np.ndarray, Any, np.ndarray | None], tuple[np.ndarray, dict]],
]

# The one place that chooses the feed-forward block, read by ffn_forward and ffn_backward: the paper's, the gated
# one (config.gated_ffn) or a mixture of experts (the layer's params hold a router: config.is_moe_layer).
FFN_PAIRS: dict[str, FfnPair] = {
    "feed_forward": (plain_ffn_forward, plain_ffn_backward),
    "gated": (gated_ffn_forward, gated_ffn_backward),
    "moe": (moe_ffn_forward, moe_ffn_backward),
    "gpt_oss_moe": (gpt_oss_ffn_forward, gpt_oss_ffn_backward),
    "deepseek_moe": (deepseek_moe_ffn_forward, deepseek_moe_ffn_backward),
}


def ffn_kind(params: dict, config: TransformerConfig) -> str:
    """The FFN_PAIRS entry of a layer: "gpt_oss_moe" when its router has a bias (GPT-OSS's), "deepseek_moe" or "moe"
    when its params hold a router (config.deepseek_router), "gated" with config.gated_ffn."""
    if "router.bias" in params:
        return "gpt_oss_moe"
    if "router.weight" in params:
        return "deepseek_moe" if config.deepseek_router else "moe"
    return "gated" if config.gated_ffn else "feed_forward"


@dataclass(frozen=True, slots=True)
class FfnCache:
    kind: str  # the FFN_PAIRS entry ffn_forward ran, whose backward ffn_backward runs
    block: FfnCaches  # that pair's cache


def ffn_forward(
    params: dict,
    x: np.ndarray,
    config: TransformerConfig,
    dropout: Dropout | None,
    site: str,
    activations: dict[str, ActivationPair] = ACTIVATIONS,
) -> tuple[np.ndarray, FfnCache]:
    r"""The feed-forward block the config asks for: the paper's :math:`\phi(x W_1^\top + b_1)\, W_2^\top + b_2`, or
    the gated :math:`\big(\phi(x W_g^\top + b_g) \odot (x W_1^\top + b_1)\big) W_2^\top + b_2` (config.gated_ffn,
    Llama's SwiGLU), or, when the layer's params hold a router (config.is_moe_layer), the sparse mixture of experts
    :math:`\sum_{j < k} g_j\, \mathrm{FFN}_{S_j}(x)` (moe.sparse_moe_forward; Mixtral, Qwen3-MoE).
    x (B, T, D) -> (B, T, D); :math:`\phi` is activations[config.activation] (the experts': layers.ACTIVATIONS')."""
    kind = ffn_kind(params, config)
    forward, _ = FFN_PAIRS[kind]
    out, block = forward(params, x, config, dropout, site, activations)
    return out, FfnCache(kind, block)


def ffn_backward(
    dout: np.ndarray, cache: FfnCache, drouter_logits: np.ndarray | None = None
) -> tuple[np.ndarray, dict]:
    """Backward of ffn_forward, the backward of the block it ran: dx (B, T, D) and the grads dict keyed like its
    params. drouter_logits (N, E): a mixture of experts' router logits' gradient from the load-balancing loss,
    added to the gates' (None for a dense block)."""
    _, backward = FFN_PAIRS[cache.kind]
    return backward(dout, cache.block, drouter_logits)


def sublayer_in(
    params: dict, x: np.ndarray, config: TransformerConfig, name: str, normed: bool = True
) -> tuple[np.ndarray, ResidualInCache]:
    """The input of the residual sublayer `name` ("self_attn", "cross_attn", "ffn"): Norm(x) in pre-norm (its
    norm's params are `{name}_norm.*`), x in post-norm, and x where the layer has no such norm (normed False:
    ModernBERT's first layer, config.first_attn_norm False; every sublayer without config.input_norm: OLMo 2's,
    whose sublayers read the stream itself and normalise only their outputs, sublayer_out's sandwich)."""
    if not normed or not config.input_norm:
        return x, ResidualInCache(None)  # residual_in_backward passes dh through
    norm = sub(params, f"{name}_norm")
    return residual_in_forward(norm, x, config.norm_first, config.layer_norm_eps, config.norm)


def residual_join(
    norm: dict, x: np.ndarray, y: np.ndarray, config: TransformerConfig, dropout: Dropout | None, site: str
) -> tuple[np.ndarray, ResidualOutCache]:
    """layers.residual_out_forward: x + drop(y), then Norm in post-norm (norm: the sublayer's norm's params)."""
    return residual_out_forward(norm, x, y, config.norm_first, config.layer_norm_eps, dropout, site, config.norm)


def sandwich_join(
    norm: dict, x: np.ndarray, y: np.ndarray, config: TransformerConfig, dropout: Dropout | None, site: str
) -> tuple[np.ndarray, SandwichOutCache]:
    """layers.sandwich_out_forward: x + drop(Norm_post(y)) (norm: the sublayer's post-norm's params)."""
    return sandwich_out_forward(norm, x, y, config.layer_norm_eps, dropout, site, config.norm)


JoinPair = tuple[
    Callable[[dict, np.ndarray, np.ndarray, TransformerConfig, Dropout | None, str], tuple[np.ndarray, Any]],
    Callable[[np.ndarray, Any], tuple[np.ndarray, np.ndarray, dict]],
    str,
]

# The one place that chooses how a sublayer's output joins the stream, read by sublayer_out and its backward:
# (forward, backward, the norm it holds below the layer, {} the sublayer's name). Gemma's sandwich with
# config.sandwich_norm, else the residual (whose norm is the post-norm's, or in pre-norm unused).
JOIN_PAIRS: dict[str, JoinPair] = {
    "residual": (residual_join, residual_out_backward, "{}_norm"),
    "sandwich": (sandwich_join, sandwich_out_backward, "{}_post_norm"),
}


@dataclass(frozen=True, slots=True)
class SublayerOutCache:
    kind: str  # the JOIN_PAIRS entry sublayer_out ran, whose backward sublayer_out_backward runs
    norm_name: str  # the norm it holds, below the layer: "{name}_norm" (residual), "{name}_post_norm" (sandwich)
    join: ResidualOutCache | SandwichOutCache  # that pair's cache


def sublayer_out(
    params: dict,
    x: np.ndarray,
    y: np.ndarray,
    config: TransformerConfig,
    name: str,
    dropout: Dropout | None,
    site: str,
) -> tuple[np.ndarray, SublayerOutCache]:
    """The sublayer `name`'s output y joined to the stream x: x + drop(y), then Norm in post-norm (dropout site
    `{site}.{name}_dropout`); with config.sandwich_norm (Gemma) x + drop(Norm_post(y)), its norm `{name}_post_norm`."""
    kind = "sandwich" if config.sandwich_norm else "residual"
    forward, _, norm_name = JOIN_PAIRS[kind]
    norm_name = norm_name.format(name)
    out, join = forward(sub(params, norm_name), x, y, config, dropout, f"{site}.{name}_dropout")
    return out, SublayerOutCache(kind, norm_name, join)


def sublayer_out_backward(dout: np.ndarray, cache: SublayerOutCache) -> tuple[np.ndarray, np.ndarray, dict]:
    """Backward of sublayer_out, the backward of the join it ran: dx along the residual path, dy into the sublayer,
    and the grads of the norm it holds (none in pre-norm; the post-norm's in the sandwich), named below the layer."""
    _, backward, _ = JOIN_PAIRS[cache.kind]
    dx, dy, grads = backward(dout, cache.join)
    return dx, dy, {f"{cache.norm_name}.{k}": v for k, v in grads.items()}


def norm_grads(name: str, *parts: dict) -> dict:
    """The sublayer `name`'s norm grads (from residual_in or residual_out, whichever holds its norm), named."""
    return {f"{name}_norm.{k}": v for part in parts for k, v in part.items()}


@dataclass(frozen=True, slots=True)
class CrossAttnCache:
    """A decoder layer's cross-attention sublayer: its three caches, in the order the forward ran them."""

    attn_in: ResidualInCache
    attn: AttentionCache
    attn_out: SublayerOutCache


@dataclass(frozen=True, slots=True)
class LayerCache:
    """One layer's caches, three per sublayer in the order the forward ran them (in: residual_in's, the sublayer's
    own, out: sublayer_out's). cross: the cross-attention sublayer's, None in a layer without one (the encoder's,
    the decoder-only model's, GPT-NeoX's parallel layer)."""

    self_attn_in: ResidualInCache
    self_attn: AttentionCache | LatentAttentionCache
    self_attn_out: SublayerOutCache
    ffn_in: ResidualInCache
    ffn: FfnCache
    ffn_out: SublayerOutCache
    cross: CrossAttnCache | None = None

    def attentions(self) -> dict[str, AttentionCache | LatentAttentionCache]:
        """The layer's attention caches by sublayer name: "self_attn", and "cross_attn" in a layer with one."""
        cross = {} if self.cross is None else {"cross_attn": self.cross.attn}
        return {"self_attn": self.self_attn} | cross


# ----------------------------------------------------------------------------------------------
# Encoder layer: self-attention sublayer, then feed-forward sublayer. Forward and backward are flat lists, one
# call per line; the backward reads the forward bottom to top.


def encoder_layer_forward(
    params: dict,
    x: np.ndarray,
    config: TransformerConfig,
    *,
    mask: np.ndarray | None = None,
    dropout: Dropout | None = None,
    site: str = "encoder.layers.0",
    rope: tuple | None = None,
    bias_table: np.ndarray | None = None,
    activations: dict[str, ActivationPair] = ACTIVATIONS,
    layer: int = 0,
) -> tuple[np.ndarray, LayerCache]:
    """x (B, T, D) -> (B, T, D): x = Sublayer(x, SelfAttention); x = Sublayer(x, FeedForward).
    mask: padding, broadcastable to (B, H, T, T); rope: rotary (cos, sin) of positions 0 .. T - 1, or None;
    bias_table: the stack's T5 relative position bias (n_buckets, H), or None; layer: the layer's index, whose
    kind (config.layer_types) chooses its score rules (and layer 0 has no self-attention norm when
    config.first_attn_norm is False: ModernBERT's)."""
    h, attn_in = sublayer_in(params, x, config, "self_attn", normed=layer > 0 or config.first_attn_norm)
    y, attn = attention_forward(
        sub(params, "self_attn"), h, h, config, mod=score_mod(config, causal=False, layer=layer), cross=False,
        mask=mask, dropout=dropout, site=f"{site}.self_attn", rope=rope, bias_table=bias_table,
    )  # fmt: skip
    x, attn_out = sublayer_out(params, x, y, config, "self_attn", dropout, site)
    h, ffn_in = sublayer_in(params, x, config, "ffn")
    y, ffn = ffn_forward(sub(params, "ffn"), h, config, dropout, f"{site}.ffn", activations)
    x, ffn_out = sublayer_out(params, x, y, config, "ffn", dropout, site)
    return x, LayerCache(attn_in, attn, attn_out, ffn_in, ffn, ffn_out)


def encoder_layer_backward(dout: np.ndarray, cache: LayerCache) -> tuple[np.ndarray, dict]:
    r"""The forward in reverse. Each sublayer's x reaches its output twice, along the residual path and through the
    sublayer: the two gradients add. Self-attention read h as query, key and value: those three add too.

    .. math::

        dx = dx_{\text{residual}} + dx_{\text{sublayer}}, \qquad dh = dX_q + dX_k + dX_v

    Returns dx (B, T, D) and the layer's grads dict."""
    c = cache
    dx, dy, ffn_out = sublayer_out_backward(dout, c.ffn_out)
    dh, ffn_grads = ffn_backward(dy, c.ffn)
    dx_ffn, ffn_in = residual_in_backward(dh, c.ffn_in)
    dx = dx + dx_ffn  # residual path + path through the feed-forward block
    dx, dy, attn_out = sublayer_out_backward(dx, c.self_attn_out)
    dh, attn_grads = self_attention_backward(dy, c.self_attn)  # h was the query, the key and the value
    dx_attn, attn_in = residual_in_backward(dh, c.self_attn_in)
    dx = dx + dx_attn  # residual path + path through self-attention
    grads = norm_grads("ffn", ffn_in) | ffn_out | norm_grads("self_attn", attn_in) | attn_out
    return dx, grads | prefixed(ffn_grads, "ffn") | prefixed(attn_grads, "self_attn")


# ----------------------------------------------------------------------------------------------
# Decoder layer: masked self-attention, cross-attention over the encoder output, feed-forward.
# With memory=None (the decoder-only TransformerLM) there is no cross-attention sublayer.


def decoder_layer_forward(
    params: dict,
    x: np.ndarray,
    memory: np.ndarray | None,
    config: TransformerConfig,
    *,
    self_mask: np.ndarray | None = None,
    memory_mask: np.ndarray | None = None,
    dropout: Dropout | None = None,
    site: str = "decoder.layers.0",
    activations: dict[str, ActivationPair] = ACTIVATIONS,
    rope: tuple[np.ndarray, np.ndarray] | None = None,
    q_pos: np.ndarray | None = None,
    caches: tuple[KVCache, MemoryCache | None] | None = None,
    bias_table: np.ndarray | None = None,
    key_padding: np.ndarray | None = None,
    layer: int = 0,
) -> tuple[np.ndarray, LayerCache]:
    """x (B, T_tgt, D), memory (B, T_src, D) or None -> (B, T_tgt, D).

    Self-attention is causal (and rotary when rope is given); self_mask, broadcastable to
    (B, H, T_tgt, T_tgt), masks more on top of that (None: nothing more; the stack passes None).
    Cross-attention masks the source's padding (memory_mask, broadcastable to (B, H, T_tgt, T_src)).
    Decoding: q_pos, the positions of x's rows, and caches, the layer's (KVCache, MemoryCache or None), which
    attention reads and extends (a forward-only call). bias_table: the stack's T5 relative position bias, read by
    self-attention, or None. key_padding (B, P): the real tokens of a padded batch by key position (True = real),
    masked out of self-attention where False, or None. layer: the layer's index, whose kind (config.layer_types)
    chooses its self-attention's window.
    """
    self_cache, memory_cache = (None, None) if caches is None else caches
    h, attn_in = sublayer_in(params, x, config, "self_attn")
    y, attn = attention_forward(
        sub(params, "self_attn"), h, h, config, mod=score_mod(config, causal=True, layer=layer), cross=False,
        mask=self_mask, dropout=dropout, site=f"{site}.self_attn", rope=rope, q_pos=q_pos, kv_cache=self_cache,
        bias_table=bias_table, key_padding=key_padding,
    )  # fmt: skip
    x, attn_out = sublayer_out(params, x, y, config, "self_attn", dropout, site)
    cross = None
    if memory is not None:
        h, cross_in = sublayer_in(params, x, config, "cross_attn")
        y, cross_attn = attention_forward(
            sub(params, "cross_attn"), h, memory, config, mod=cross_score_mod(config), cross=True, mask=memory_mask,
            dropout=dropout, site=f"{site}.cross_attn", kv_cache=memory_cache,
        )  # fmt: skip
        x, cross_out = sublayer_out(params, x, y, config, "cross_attn", dropout, site)
        assert isinstance(cross_attn, AttentionCache)  # cross-attention is never latent
        cross = CrossAttnCache(cross_in, cross_attn, cross_out)
    h, ffn_in = sublayer_in(params, x, config, "ffn")
    y, ffn = ffn_forward(sub(params, "ffn"), h, config, dropout, f"{site}.ffn", activations)
    x, ffn_out = sublayer_out(params, x, y, config, "ffn", dropout, site)
    return x, LayerCache(attn_in, attn, attn_out, ffn_in, ffn, ffn_out, cross)


def decoder_layer_backward(
    dout: np.ndarray, cache: LayerCache, drouter_logits: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray | None, dict]:
    r"""The forward in reverse (see encoder_layer_backward); cross-attention read the memory as key and value, so
    the memory's two gradients add, :math:`d\mathrm{memory} = dX_k + dX_v`. drouter_logits (N, E): the gradient
    the load-balancing loss sends to a mixture-of-experts layer's router logits, or None. Returns dx (B, T_tgt, D),
    dmemory (B, T_src, D) or None, and grads."""
    c = cache
    dx, dy, ffn_out = sublayer_out_backward(dout, c.ffn_out)
    dh, ffn_grads = ffn_backward(dy, c.ffn, drouter_logits)
    dx_ffn, ffn_in = residual_in_backward(dh, c.ffn_in)
    dx = dx + dx_ffn  # residual path + path through the feed-forward block
    grads = norm_grads("ffn", ffn_in) | ffn_out | prefixed(ffn_grads, "ffn")
    dmemory = None
    if c.cross is not None:  # the layer read a memory
        dx, dy, cross_out = sublayer_out_backward(dx, c.cross.attn_out)
        dh, dkey, dvalue, cross_grads = multi_head_attention_backward(dy, c.cross.attn)
        dmemory = dkey + dvalue  # the memory was the key and the value
        dx_cross, cross_in = residual_in_backward(dh, c.cross.attn_in)
        dx = dx + dx_cross  # residual path + path through cross-attention
        grads |= norm_grads("cross_attn", cross_in) | cross_out | prefixed(cross_grads, "cross_attn")
    dx, dy, attn_out = sublayer_out_backward(dx, c.self_attn_out)
    dh, attn_grads = self_attention_backward(dy, c.self_attn)
    dx_attn, attn_in = residual_in_backward(dh, c.self_attn_in)
    dx = dx + dx_attn  # residual path + path through self-attention
    grads |= norm_grads("self_attn", attn_in) | attn_out | prefixed(attn_grads, "self_attn")
    return dx, dmemory, grads


def self_attention_backward(dout: np.ndarray, cache: AttentionCache | LatentAttentionCache) -> tuple[np.ndarray, dict]:
    """Self-attention's backward: dh, the gradient of the one input that was query, key and value
    (:math:`dX_q + dX_k + dX_v`; latent attention's own backward adds its paths), and its grads."""
    if isinstance(cache, LatentAttentionCache):
        return latent_attention_backward(dout, cache)
    dquery, dkey, dvalue, grads = multi_head_attention_backward(dout, cache)
    return dquery + dkey + dvalue, grads  # h was the query, the key and the value


# ----------------------------------------------------------------------------------------------
# GPT-NeoX's parallel layer (config.parallel_residual): attention and feed-forward both read the layer's input, and
# both outputs join the stream at once. Decoder-only, pre-norm.


def parallel_layer_forward(
    params: dict,
    x: np.ndarray,
    memory: np.ndarray | None,
    config: TransformerConfig,
    *,
    self_mask: np.ndarray | None = None,
    memory_mask: np.ndarray | None = None,
    dropout: Dropout | None = None,
    site: str = "decoder.layers.0",
    activations: dict[str, ActivationPair] = ACTIVATIONS,
    rope: tuple[np.ndarray, np.ndarray] | None = None,
    q_pos: np.ndarray | None = None,
    caches: tuple[KVCache, MemoryCache | None] | None = None,
    bias_table: np.ndarray | None = None,
    key_padding: np.ndarray | None = None,
    layer: int = 0,
) -> tuple[np.ndarray, LayerCache]:
    """x (B, T, D) -> x + drop(SelfAttention(Norm1(x))) + drop(FeedForward(Norm2(x))) (B, T, D), Norm1 the
    self_attn_norm, Norm2 the ffn_norm. The arguments are decoder_layer_forward's; there is no cross-attention
    (memory must be None)."""
    if memory is not None:
        raise ValueError("parallel_residual is a decoder-only layer: it has no cross-attention (memory must be None)")
    self_cache = None if caches is None else caches[0]
    h, attn_in = sublayer_in(params, x, config, "self_attn")  # Norm1(x)
    y_attn, attn = attention_forward(
        sub(params, "self_attn"), h, h, config, mod=score_mod(config, causal=True, layer=layer), cross=False,
        mask=self_mask, dropout=dropout, site=f"{site}.self_attn", rope=rope, q_pos=q_pos, kv_cache=self_cache,
        bias_table=bias_table, key_padding=key_padding,
    )  # fmt: skip
    g, ffn_in = sublayer_in(params, x, config, "ffn")  # Norm2(x): the layer's input, not x + attention
    y_ffn, ffn = ffn_forward(sub(params, "ffn"), g, config, dropout, f"{site}.ffn", activations)
    x_attn, attn_out = sublayer_out(params, x, y_attn, config, "self_attn", dropout, site)
    out, ffn_out = sublayer_out(params, x_attn, y_ffn, config, "ffn", dropout, site)
    return out, LayerCache(attn_in, attn, attn_out, ffn_in, ffn, ffn_out)


def parallel_layer_backward(
    dout: np.ndarray, cache: LayerCache, drouter_logits: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray | None, dict]:
    r"""The layer's input x reaches its output three times: along the residual path, through attention and through
    the feed-forward block, so the three gradients add (the sequential layer instead sends the feed-forward's
    share through attention too):

    .. math::

        y = x + \mathrm{Attn}(N_1(x)) + \mathrm{FFN}(N_2(x)), \qquad
        dx = dy + J_{N_1}^\top J_{\mathrm{Attn}}^\top dy + J_{N_2}^\top J_{\mathrm{FFN}}^\top dy

    drouter_logits: as decoder_layer_backward's. Returns dx (B, T, D), None (no memory) and the layer's grads dict."""
    c = cache
    dx, dy, ffn_out = sublayer_out_backward(dout, c.ffn_out)  # dx = dout: the stream after attention
    dg, ffn_grads = ffn_backward(dy, c.ffn, drouter_logits)
    dx_ffn, ffn_in = residual_in_backward(dg, c.ffn_in)  # through Norm2, to the layer's input
    dx, dy, attn_out = sublayer_out_backward(dx, c.self_attn_out)
    dh, attn_grads = self_attention_backward(dy, c.self_attn)  # h was the query, the key and the value
    dx_attn, attn_in = residual_in_backward(dh, c.self_attn_in)
    dx = dx + dx_attn + dx_ffn  # residual path + path through attention + path through the feed-forward block
    grads = norm_grads("ffn", ffn_in) | ffn_out | norm_grads("self_attn", attn_in) | attn_out
    return dx, None, grads | prefixed(ffn_grads, "ffn") | prefixed(attn_grads, "self_attn")


# Phi-2's parallel block (config.shared_norm, with parallel_residual; GPT-J's and Falcon's layout): one norm, whose
# output both attention and the feed-forward read.


def parallel_block_forward(
    params: dict,
    x: np.ndarray,
    memory: np.ndarray | None,
    config: TransformerConfig,
    *,
    self_mask: np.ndarray | None = None,
    memory_mask: np.ndarray | None = None,
    dropout: Dropout | None = None,
    site: str = "decoder.layers.0",
    activations: dict[str, ActivationPair] = ACTIVATIONS,
    rope: tuple[np.ndarray, np.ndarray] | None = None,
    q_pos: np.ndarray | None = None,
    caches: tuple[KVCache, MemoryCache | None] | None = None,
    bias_table: np.ndarray | None = None,
    key_padding: np.ndarray | None = None,
    layer: int = 0,
) -> tuple[np.ndarray, LayerCache]:
    """x (B, T, D) -> x + drop(SelfAttention(h)) + drop(FeedForward(h)) (B, T, D), h = Norm(x) the layer's one norm
    (self_attn_norm). The arguments are decoder_layer_forward's; there is no cross-attention (memory must be None).
    The cache's ffn_in is empty: the feed-forward's input is the attention's."""
    if memory is not None:
        raise ValueError("parallel_residual is a decoder-only layer: it has no cross-attention (memory must be None)")
    self_cache = None if caches is None else caches[0]
    h, attn_in = sublayer_in(params, x, config, "self_attn")  # Norm(x), read by both branches
    y_attn, attn = attention_forward(
        sub(params, "self_attn"), h, h, config, mod=score_mod(config, causal=True, layer=layer), cross=False,
        mask=self_mask, dropout=dropout, site=f"{site}.self_attn", rope=rope, q_pos=q_pos, kv_cache=self_cache,
        bias_table=bias_table, key_padding=key_padding,
    )  # fmt: skip
    y_ffn, ffn = ffn_forward(sub(params, "ffn"), h, config, dropout, f"{site}.ffn", activations)
    x_attn, attn_out = sublayer_out(params, x, y_attn, config, "self_attn", dropout, site)
    out, ffn_out = sublayer_out(params, x_attn, y_ffn, config, "ffn", dropout, site)
    return out, LayerCache(attn_in, attn, attn_out, ResidualInCache(None), ffn, ffn_out)


def parallel_block_backward(
    dout: np.ndarray, cache: LayerCache, drouter_logits: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray | None, dict]:
    r"""The norm's output h feeds attention (as its query, key and value) and the feed-forward block, so its gradient
    is the sum of theirs, and the norm's backward runs once on that sum; the residual path adds dy:

    .. math::

        y = x + \mathrm{Attn}(h) + \mathrm{FFN}(h), \quad h = N(x)

        dh = J_{\mathrm{Attn}}^\top dy + J_{\mathrm{FFN}}^\top dy, \qquad dx = dy + J_N^\top dh

    drouter_logits: as decoder_layer_backward's. Returns dx (B, T, D), None (no memory) and the layer's grads dict."""
    c = cache
    dx, dy, ffn_out = sublayer_out_backward(dout, c.ffn_out)  # dx = dout: the stream after attention
    dh_ffn, ffn_grads = ffn_backward(dy, c.ffn, drouter_logits)
    dx, dy, attn_out = sublayer_out_backward(dx, c.self_attn_out)
    dh, attn_grads = self_attention_backward(dy, c.self_attn)
    dh = dh + dh_ffn  # h was the query, the key, the value and the feed-forward's input
    dx_norm, attn_in = residual_in_backward(dh, c.self_attn_in)
    dx = dx + dx_norm  # residual path + path through the norm (both branches)
    grads = ffn_out | norm_grads("self_attn", attn_in) | attn_out
    return dx, None, grads | prefixed(ffn_grads, "ffn") | prefixed(attn_grads, "self_attn")


LayerForward = Callable[..., tuple[np.ndarray, LayerCache]]
LayerBackward = Callable[[np.ndarray, LayerCache, "np.ndarray | None"], tuple[np.ndarray, "np.ndarray | None", dict]]


def decoder_layer(config: TransformerConfig) -> tuple[LayerForward, LayerBackward]:
    """The (forward, backward) pair of the config's decoder layer: Phi-2's parallel block of one norm, GPT-NeoX's
    parallel layer of two, or the sequential one."""
    if config.parallel_residual and config.shared_norm:
        return parallel_block_forward, parallel_block_backward
    if config.parallel_residual:
        return parallel_layer_forward, parallel_layer_backward
    return decoder_layer_forward, decoder_layer_backward


# ----------------------------------------------------------------------------------------------
# The stacks: embeddings, N layers, and (pre-norm only) a final norm.


def final_norm_forward(params: dict, x: np.ndarray, config: TransformerConfig) -> tuple[np.ndarray, NormCache | None]:
    """Pre-norm layers leave their output un-normalised: the stack ends with final_norm (config.has_final_norm:
    norm_first, unless final_norm says otherwise). Without one: nothing (the cache is None)."""
    if not config.has_final_norm:
        return x, None
    return norm_forward(sub(params, "final_norm"), x, config.norm, config.layer_norm_eps)


def final_norm_backward(dout: np.ndarray, cache: NormCache | None) -> tuple[np.ndarray, dict]:
    """Backward of final_norm_forward: dx and the norm's grads, named final_norm.* (empty without one)."""
    if cache is None:
        return dout, {}
    dx, norm_grads = norm_backward(dout, cache)
    return dx, prefixed(norm_grads, "final_norm")


@dataclass(frozen=True, slots=True)
class EncoderStackCache:
    embed: EmbedCache
    layers: list[LayerCache]
    final_norm: NormCache | None  # the final norm's cache; None without one
    hidden: list[np.ndarray]  # the embeddings and every layer's output, (B, T, D) each (model.activations)


@dataclass(frozen=True, slots=True)
class DecoderStackCache:
    embed: EmbedCache
    layers: list[LayerCache]
    final_norm: NormCache | None
    hidden: list[np.ndarray]
    memory_shape: tuple[int, ...] | None  # the encoder output's (B, T_src, D), or None (no cross-attention)
    layer_backward: LayerBackward  # the config's layer's backward (decoder_layer)


def encoder_forward(
    params: dict,
    src_ids: np.ndarray,
    config: TransformerConfig,
    dropout: Dropout | None = None,
    *,
    token_type_ids: np.ndarray | None = None,
    attention_mask: np.ndarray | None = None,
    activations: dict[str, ActivationPair] = ACTIVATIONS,
    keep: bool = True,
) -> tuple[np.ndarray, EncoderStackCache | None]:
    """src_ids (B, T_src) -> memory (B, T_src, D). Padding keys (pad_id; or, when given, those attention_mask (B,
    T_src) marks False) are masked out. token_type_ids (B, T_src) or None (type 0) when params hold
    token_type_embedding.weight. activations: the feed-forward blocks' table of activation functions (name ->
    (forward, backward)). keep=False: inference; no cache (None), and each layer's activations are freed before the
    next layer allocates its own."""
    mask = source_mask(src_ids, attention_mask, config.pad_id)  # (B, 1, 1, T_src), or None: nothing masked
    positions = None  # (B, T_src) RoBERTa's, or None (the config requires pad_id with positions_after_pad)
    if config.positions_after_pad and config.pad_id is not None:
        positions = pad_offset_positions(src_ids, config.pad_id)
    x, embed_cache = embed_forward(
        params, src_ids, config, dropout, "encoder", token_type_ids=token_type_ids, positions=positions
    )  # (B, T_src, D)
    ropes = rope_by_layer(config, config.n_encoder_layers, src_ids.shape[1], x.dtype)  # rotary (cos, sin), or None
    hidden, layer_caches = [x], []
    for i in range(config.n_encoder_layers):
        x, layer_cache = encoder_layer_forward(
            sub(params, f"layers.{i}"), x, config, mask=mask, dropout=dropout, site=f"encoder.layers.{i}",
            rope=ropes[i], bias_table=params.get("relative_bias.weight"),  # T5: one table for every layer of the stack
            activations=activations, layer=i,  # its kind (config.layer_types) chooses its score rules
        )  # fmt: skip
        if keep:
            hidden.append(x)
            layer_caches.append(layer_cache)
        del layer_cache  # unkept, this layer's activations go now, not when the next layer returns
    x, norm_cache = final_norm_forward(params, x, config)
    if not keep:
        return x, None
    return x, EncoderStackCache(embed_cache, layer_caches, norm_cache, hidden)


TABLE_SHARE = "self_attn.relative_bias.weight"  # a layer's share of T5's table's gradient, below the layer


def add_table_share(grads: dict, layer_grads: dict, prefix: str) -> dict:
    """T5's relative bias table belongs to the stack and every layer's self-attention reads it: the stack's grads
    (a new dict) with layer `prefix`'s grads added under its prefix, and the layer's share of the table's gradient
    added to the stack's relative_bias.weight, where the shares add. Neither argument is changed."""
    merged = grads | prefixed({k: v for k, v in layer_grads.items() if k != TABLE_SHARE}, prefix)
    share = layer_grads.get(TABLE_SHARE)  # T5's layers return it; others have no share
    if share is not None:
        total = grads.get("relative_bias.weight")
        merged["relative_bias.weight"] = share if total is None else total + share
    return merged


def encoder_backward(dout: np.ndarray, cache: EncoderStackCache) -> dict:
    """dmemory (B, T_src, D) -> grads of every encoder parameter (keys below "encoder.")."""
    dx, grads = final_norm_backward(dout, cache.final_norm)
    for i in reversed(range(len(cache.layers))):
        dx, layer_grads = encoder_layer_backward(dx, cache.layers[i])
        grads = add_table_share(grads, layer_grads, f"layers.{i}")
    return grads | embed_backward(dx, cache.embed)


def decoder_forward(
    params: dict,
    tgt_ids: np.ndarray,
    memory: np.ndarray | None,
    config: TransformerConfig,
    dropout: Dropout | None = None,
    *,
    memory_mask: np.ndarray | None = None,
    activations: dict[str, ActivationPair] = ACTIVATIONS,
    caches: list | None = None,
    start: int = 0,
    attention_mask: np.ndarray | None = None,
    keep: bool = True,
) -> tuple[np.ndarray, DecoderStackCache | None]:
    """tgt_ids (B, T_tgt), memory (B, T_src, D) or None -> x (B, T_tgt, D), before the output projection.

    Decoding runs this on the new positions only: tgt_ids are the tokens at positions start .. start + T_tgt - 1,
    and caches holds each layer's (KVCache, MemoryCache or None), read and extended by attention. activations: the
    feed-forward blocks' table of activation functions (name -> (forward, backward)). keep=False: inference; no
    cache (None), and each layer's activations are freed before the next layer allocates its own.

    Self-attention masks nothing but the future (causal), as Hugging Face's decoders do: the target's
    padding sits at the end, where causality already hides it from every real position, and the loss
    ignores padded targets; a decoder input that starts with pad_id (Marian's decoder start token) is
    read as a token like any other. Cross-attention ignores padding in the source (memory_mask).

    attention_mask (B, start + T_tgt) bool, True = a real token (a left-padded batch of the decoder-only model, as
    transformers' attention_mask): padded keys are masked out, and each token's position is its row's count of
    real tokens before it (validation.mask_positions), for the learned and rotary positions. Causality, a sliding
    window and ALiBi read the index distance i - j, which equals the distance of those positions between the real
    tokens of a left-padded row.
    """
    positions = None
    if attention_mask is not None:
        positions = mask_positions(attention_mask)[:, start:]  # (B, T_tgt)
    x, embed_cache = embed_forward(params, tgt_ids, config, dropout, "decoder", start=start, positions=positions)
    ropes = rope_by_layer(config, config.n_decoder_layers, tgt_ids.shape[1], x.dtype, start, positions)
    q_pos = np.arange(start, start + tgt_ids.shape[1])
    layer_forward, layer_backward = decoder_layer(config)
    hidden, layer_caches = [x], []
    for i in range(config.n_decoder_layers):
        x, layer_cache = layer_forward(
            sub(params, f"layers.{i}"), x, memory, config, memory_mask=memory_mask, dropout=dropout,
            activations=activations,
            site=f"decoder.layers.{i}", rope=ropes[i], q_pos=q_pos, caches=None if caches is None else caches[i],
            bias_table=params.get("relative_bias.weight"),  # T5: one table for every layer of the stack
            key_padding=attention_mask, layer=i,  # its kind (config.layer_types) chooses its window
        )  # fmt: skip
        if keep:
            hidden.append(x)
            layer_caches.append(layer_cache)
        del layer_cache  # unkept, this layer's activations go now, not when the next layer returns
    x, norm_cache = final_norm_forward(params, x, config)
    if not keep:
        return x, None
    memory_shape = None if memory is None else memory.shape
    return x, DecoderStackCache(embed_cache, layer_caches, norm_cache, hidden, memory_shape, layer_backward)


def decoder_backward(
    dout: np.ndarray, cache: DecoderStackCache, drouter_logits: dict | None = None
) -> tuple[np.ndarray | None, dict]:
    r"""dx (B, T_tgt, D) -> dmemory (B, T_src, D) or None, and grads (keys below "decoder."). Every layer's
    cross-attention reads the same memory: :math:`d\mathrm{memory} = \sum_{\text{layers}} d\mathrm{memory}_l`.
    drouter_logits: {layer index: (N, E)}, the load-balancing loss's gradient of the MoE layers' router logits."""
    drouter_logits = drouter_logits or {}
    dx, grads = final_norm_backward(dout, cache.final_norm)
    dmemory = None
    if cache.memory_shape is not None:
        dmemory = np.zeros(cache.memory_shape, dtype=dout.dtype)
    for i in reversed(range(len(cache.layers))):
        dx, dmemory_i, layer_grads = cache.layer_backward(dx, cache.layers[i], drouter_logits.get(i))
        if dmemory is not None and dmemory_i is not None:
            dmemory += dmemory_i  # every decoder layer reads the same memory: the gradients add
        grads = add_table_share(grads, layer_grads, f"layers.{i}")
    return dmemory, grads | embed_backward(dx, cache.embed)


# ----------------------------------------------------------------------------------------------
# Parameters: names and shapes (docs/conventions.md; transformer_spec.shapes.parameter_shapes, shared with the
# checkpoint readers), and the initialisation.


def init_params(shapes: dict, seed: int, dtype: DTypeLike, d_model: int, norm_gain_offset: bool = False) -> dict:
    r"""Deterministic initialisation from `seed`, drawn in float64 and cast to `dtype`.

    - linear weights: Xavier-uniform, :math:`\mathcal U(-a, a)` with :math:`a = \sqrt{6 / (\mathrm{fan_{in}} +
      \mathrm{fan_{out}})}`, as the paper's reference code (tensor2tensor) and nn.Transformer do; biases zero;
    - layer norms: weight one, bias zero (with norm_gain_offset, Gemma's RMSNorms of gain 1 + weight: weight zero,
      the same unit gain; BERT's embedding LayerNorm keeps one);
    - token embeddings: :math:`\mathcal N(0, 1/D)`, so that after the :math:`\sqrt{D}` scale they have unit
      variance, and so that a tied output projection starts with logits of order one;
    - learned positions and token types: :math:`\mathcal N(0, 0.02^2)`.
    """
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            offset = norm_gain_offset and not name.endswith("embedding_norm.weight")
            value = np.zeros(shape) if offset else np.ones(shape)
        # GPT-OSS's experts' biases and attention sinks; DeepSeek-V3's router.score_bias starts at zero (transformers')
        elif name.endswith((".bias", "_proj_bias", ".sinks", "score_bias")):
            value = np.zeros(shape)
        elif name.endswith("token_embedding.weight"):
            value = rng.normal(0.0, d_model**-0.5, size=shape)
        elif name.endswith(("position_embedding.weight", "token_type_embedding.weight")):
            value = rng.normal(0.0, 0.02, size=shape)
        else:
            fan_out, fan_in = shape[-2:]  # an expert's weights (E, out, in): each expert's own fans
            bound = math.sqrt(6.0 / (fan_in + fan_out))
            value = rng.uniform(-bound, bound, size=shape)
        params[name] = value.astype(dtype)
    return params


# ----------------------------------------------------------------------------------------------
# The model objects.


# What each model's forward keeps for its backward and its inspection methods (attention_maps, activations,
# router_logits): one cache type per model class, every field set by that class's forward.


@dataclass(frozen=True, slots=True)
class HeadCache:
    """The output projection, x (B, T, D) -> logits (B, T, V), of a model with one (Transformer, TransformerLM)."""

    output: LinearCache  # z = (c x) W^T + b
    softcap: SoftcapCache | None  # Gemma's final soft-capping, or None (config.logit_softcap None: no cap)
    logits: np.ndarray  # (B, T, V)


@dataclass(frozen=True, slots=True)
class TransformerCache:
    encoder: EncoderStackCache
    memory: np.ndarray  # the encoder's output (B, T_src, D)
    decoder: DecoderStackCache
    decoder_out: np.ndarray  # (B, T_tgt, D), before the output projection
    head: HeadCache

    def stacks(self) -> dict[str, tuple[EncoderStackCache | DecoderStackCache, np.ndarray]]:
        """Each stack's cache and output, by name."""
        return {"encoder": (self.encoder, self.memory), "decoder": (self.decoder, self.decoder_out)}

    def outputs(self) -> dict[str, np.ndarray]:
        """The forward's outputs after the stacks: the logits."""
        return {"logits": self.head.logits}


@dataclass(frozen=True, slots=True)
class LMCache:
    decoder: DecoderStackCache
    decoder_out: np.ndarray  # (B, T, D), before the output projection
    head: HeadCache

    def stacks(self) -> dict[str, tuple[EncoderStackCache | DecoderStackCache, np.ndarray]]:
        """The decoder's cache and output."""
        return {"decoder": (self.decoder, self.decoder_out)}

    def outputs(self) -> dict[str, np.ndarray]:
        """The forward's outputs after the stack: the logits."""
        return {"logits": self.head.logits}


@dataclass(frozen=True, slots=True)
class EncoderModelCache:
    encoder: EncoderStackCache
    hidden: np.ndarray  # the encoder's output (B, T, D), the forward's

    def stacks(self) -> dict[str, tuple[EncoderStackCache | DecoderStackCache, np.ndarray]]:
        """The encoder's cache and output."""
        return {"encoder": (self.encoder, self.hidden)}

    def outputs(self) -> dict[str, np.ndarray]:
        """Nothing after the stack: the hidden states are the forward's output."""
        return {}


CacheT = TypeVar("CacheT", bound="TransformerCache | LMCache | EncoderModelCache")


@dataclass(frozen=True, slots=True)
class PoolCache:
    hidden_shape: tuple[int, ...]  # (B, T, D)
    dense: LinearCache
    tanh: TanhCache


class _Model(Generic[CacheT]):
    """What the models share: parameters, gradients, modes, state dicts, the output projection, the last forward
    pass's cache (of the type CacheT its class's forward makes, None before any forward), and what a
    checkpoint says of the model (set by numpy_transformer.hf.load; a model built here has the defaults):

    - generation_rules: the GenerationRules of its generation_config.json, which decoding applies instead of
      our own rule (pad is never generated); None: a model of our own;
    - hf_model_type: the transformers model_type it was read as ("bert", "distilbert", ...), which `hf.save`
      writes back; None: the family is found from the config;
    - hf_config: its config.json, whose fields `hf.save` keeps; {}: none.
    """

    decoder_only = False
    encoder_only = False
    generation_rules: GenerationRules | None
    hf_model_type: str | None
    hf_config: dict

    def __init__(self, config: TransformerConfig, seed: int = 0, dtype: DTypeLike = np.float64) -> None:
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise TypeError(f"dtype must be float32 or float64, got {dtype}")
        if config.parallel_residual and not self.decoder_only:
            raise ValueError(
                f"parallel_residual=True is a decoder-only layer (TransformerLM), not a {type(self).__name__}"
            )
        if config.positions_after_pad and not self.encoder_only:
            kind = type(self).__name__
            raise ValueError(f"positions_after_pad (RoBERTa's positions) is an EncoderModel's, not a {kind}'s")
        self.config = config
        self.dtype = dtype
        self.generation_rules = None
        self.hf_model_type = None
        self.hf_config = {}
        self.params = init_params(self.shapes(config), seed, dtype, config.d_model, config.norm == "rms_offset")
        self.zero_grad()  # self.grads: name -> gradient array, like params
        self.training = True
        self.rng = np.random.default_rng([seed, 1])  # dropout masks; independent of the init stream
        self.dropout_masks: dict = {}  # the keep-masks of the last forward pass, by site
        self.activation_table = ACTIVATIONS  # the feed-forward blocks' functions: name -> (forward, backward)
        self._own_dropout: Dropout | None = None  # a replica's Dropout, drawn from instead of self.rng
        self._cache: CacheT | None = None
        self._held: CacheT | None = None  # in training mode, the last pass's cache while the next one runs
        self._kept_nothing = False  # the last forward ran with keep_cache=False
        self._aux_cache: LoadBalancingCache | None = None  # the load-balancing loss of the last forward
        self._pool_cache: PoolCache | None = None
        self._mlm_cache: MlmHeadCache | None = None

    # -- modes and gradients ---------------------------------------------------------------

    @classmethod
    def shapes(cls, config: TransformerConfig, buffers: bool = False) -> dict:
        """name -> shape of every parameter this model class holds for `config`; buffers: also the fixed tensors its
        state dict and checkpoints hold (none here; SpeechTransformer's position table)."""
        return parameter_shapes(config, cls.decoder_only, cls.encoder_only)

    def train(self, mode: bool = True) -> Self:
        self.training = bool(mode)
        return self

    def eval(self) -> Self:
        return self.train(False)

    def zero_grad(self) -> None:
        """Set every gradient to zero. The arrays are replaced by fresh zeros (which cost nothing until
        written), and the next backward takes the gradients it computes as they are, instead of adding
        them to zeros: one pass over the parameters' memory fewer, twice, per step."""
        # One zeroed block, cut into the gradients: a large block is fresh memory from the kernel, zero
        # without being written (separate arrays may be reused memory, which calloc must clear first).
        block = np.zeros(sum(v.size for v in self.params.values()), self.dtype)
        self.grads, start = {}, 0
        for k, v in self.params.items():
            self.grads[k] = block[start : start + v.size].reshape(v.shape).astype(v.dtype, copy=False)
            start += v.size
        self._zero = set(self.grads)  # names whose gradient is still exactly zero

    def accumulate_grads(self, grads: dict) -> None:
        """Add grads (name -> array, some of the params) into self.grads, as backward does: an array arriving
        first since zero_grad() is kept as it is (not copied), the next ones are added to it."""
        for name, g in grads.items():
            if name in self._zero:
                self.grads[name] = g  # the first contribution since zero_grad(): keep the array
                self._zero.discard(name)
            else:
                self.grads[name] += g  # accumulate, as autograd does, until zero_grad()

    def _begin_forward(self, dropout_masks: dict | None, keep_cache: bool) -> Dropout | None:
        """Start a forward pass whose inputs are checked. The last pass's cache is gone for backward and the inspection
        methods from here on, so a pass that fails leaves nothing stale to differentiate. When its arrays are freed
        is a matter of speed only, measured on a 2-core AMD EPYC under glibc's default allocator:
        - evaluation mode: now, before this pass allocates its own: inference holds one pass's activations, and
          repeated forwards reuse that memory (the plain all-MiniLM-L6-v2 forward beside BertModel: 1.71-1.74 x its
          time, 3.10-4.07 x when the last cache lived until this pass had built its own);
        - training mode: when this pass has finished, so that each step allocates into memory the step before freed
          (freed first, it sits at the top of the heap, which glibc hands back to the kernel, and every step faults
          it in again: 6,300 page faults a step instead of about 100 for a d_model 128 model on 64 x 24 tokens, and
          8-13% fewer steps a minute for examples/train_numbers.py).
        Returns the dropout of this pass: None in eval mode or with p = 0 (masks are then ignored)."""
        check_bool("keep_cache", keep_cache)
        self._held = self._cache if self.training else None  # freed when this pass finishes (or the next one does)
        self._cache = self._aux_cache = None
        self._kept_nothing = False
        if not self.training or not self.config.has_dropout:
            return None
        if dropout_masks is not None:
            return Dropout(self.config.dropout_rates, masks=dict(dropout_masks))
        if self._own_dropout is not None:
            return self._own_dropout
        return Dropout(self.config.dropout_rates, rng=self.rng)

    def replica(self, dropout: Dropout | None = None, activation_table: dict | None = None) -> Self:
        """A model for one part of a batch, to run in a thread of its own: the same params (the arrays themselves,
        so an optimizer's step is seen by both), config, dtype and mode; its own caches, dropout masks and grads.
        Its grads start empty: each backward adds what it computes (a name is absent until then).

        dropout: the Dropout its training forward passes draw their masks from (None: self.rng, shared with this
        model, so draws in several threads come in no fixed order). activation_table: its feed-forward blocks'
        functions, name -> (forward, backward) (None: this model's).
        The forward pass now lives in the replicas: this model's cache is dropped, so that its backward cannot
        differentiate an older forward pass."""
        replica = copy.copy(self)
        replica.grads, replica._zero = {}, set(self.params)
        replica.dropout_masks, replica._cache, replica._held = {}, None, None
        replica._own_dropout = dropout
        if activation_table is not None:
            replica.activation_table = activation_table
        self._cache = None
        return replica

    # -- the encoder's token table, optionally shared with the decoder ---------------------

    def _shares_embeddings(self) -> bool:
        return self.config.share_embeddings and not (self.decoder_only or self.encoder_only)

    def encoder_params(self) -> dict:
        """The encoder's params below "encoder.", its token table included even when it is the decoder's."""
        params = sub(self.params, "encoder")
        if self._shares_embeddings():
            params["token_embedding.weight"] = self.params["decoder.token_embedding.weight"]
        return params

    def _encoder_grads(self, grads: dict) -> dict:
        """The encoder's grads under their full names; a shared token table's share goes to the decoder's name."""
        grads = prefixed(grads, "encoder")
        if self._shares_embeddings():
            grads["decoder.token_embedding.weight"] = grads.pop("encoder.token_embedding.weight")
        return grads

    # -- the output projection, optionally tied to the decoder's token embedding ------------

    def output_weight(self) -> np.ndarray:
        """The output projection's weight (V, D): decoder.token_embedding.weight when tied, else output_proj.weight."""
        if self.config.tie_embeddings:
            return self.params["decoder.token_embedding.weight"]
        return self.params["output_proj.weight"]

    def output_bias(self) -> np.ndarray | None:
        """The output projection's bias (V,), or None when the model has none (config.output_bias False)."""
        return self.params.get("output_proj.bias")

    def scale_output(self, x: np.ndarray) -> np.ndarray:
        r"""x times config.output_scale (T5's tied head reads :math:`d_{model}^{-1/2}` times the final hidden
        states)."""
        return x if self.config.output_scale == 1.0 else x * self.config.output_scale

    def softcap(self, logits: np.ndarray) -> tuple[np.ndarray, SoftcapCache | None]:
        """Gemma's final soft-capping, cap * tanh(logits / cap) with cap = config.logit_softcap (softcap_forward),
        and its cache; the logits and None when the config sets no cap."""
        if self.config.logit_softcap is None:
            return logits, None
        return softcap_forward(logits, self.config.logit_softcap)

    def _head_forward(self, x: np.ndarray) -> HeadCache:
        """x (B, T, D) -> the output projection's cache, whose logits (B, T, V) the forward returns."""
        logits, out_cache = linear_forward(self.scale_output(x), self.output_weight(), self.output_bias())  # (B, T, V)
        logits, cap_cache = self.softcap(logits)
        return HeadCache(out_cache, cap_cache, logits)

    def _finish_forward(self, dropout: Dropout | None, cache: CacheT | None) -> None:
        """The bookkeeping of a finished forward pass: the dropout masks it used, and the cache the backward pass
        and the inspection methods will read (None: a pass with keep_cache=False kept nothing)."""
        if dropout is not None:
            dropout.check_all_used()
        self.dropout_masks = dropout.masks if dropout is not None else {}
        self._cache, self._held = cache, None  # the last pass's arrays are freed here in training mode
        self._kept_nothing = cache is None
        self._aux_cache = None  # the load-balancing loss of this forward, once computed

    # -- mixture of experts: the router logits of the last forward pass and the load-balancing loss -----------------

    def _moe_layers(self) -> list[tuple[int, SparseMoeCache | GptOssMoeCache]]:
        """(index, SparseMoeCache) of each mixture-of-experts decoder layer of the last forward pass."""
        stacks = self._last_forward("router_logits").stacks()
        layers = enumerate(stacks["decoder"][0].layers if "decoder" in stacks else [])  # an encoder has no router
        moe_caches = (SparseMoeCache, GptOssMoeCache)
        return [(i, layer.ffn.block) for i, layer in layers if isinstance(layer.ffn.block, moe_caches)]

    def router_logits(self) -> list[np.ndarray]:
        """The router logits (N, E), N = B * T, of every mixture-of-experts layer in the last forward pass, in layer
        order (transformers' router_logits with output_router_logits=True); [] for a dense model."""
        return [cache.router_logits for _, cache in self._moe_layers()]

    def load_balancing_loss(self, attention_mask: np.ndarray | None = None) -> np.ndarray:
        r"""The load-balancing loss of the last forward pass's router logits (moe.load_balancing_loss_forward, as
        transformers' aux_loss), its padding left out by attention_mask (B, T) when given:
        :math:`\mathcal L_{\text{aux}} = E \sum_e f_e P_e`. A training objective adds router_aux_loss_coef times it;
        backward(dlogits, daux_loss=router_aux_loss_coef) then adds its gradient."""
        logits = self.router_logits()
        if not logits:
            raise ValueError("load_balancing_loss: this model has no mixture-of-experts layer (config.n_experts=0)")
        c = self.config
        loss, self._aux_cache = load_balancing_loss_forward(logits, c.n_experts, c.top_k, attention_mask)
        return loss

    def _router_grads(self, daux_loss: float | None) -> dict | None:
        """{layer index: the load-balancing loss's gradient of its router logits (N, E)} for daux_loss (the
        loss's upstream gradient, a float), or None when daux_loss is None."""
        if daux_loss is None:
            return None
        if isinstance(daux_loss, bool) or not isinstance(daux_loss, (int, float, np.floating)):
            raise TypeError(f"daux_loss must be a float (the aux loss's weight in the objective), got {daux_loss!r}")
        if self._aux_cache is None:
            raise ValueError("backward: daux_loss given, but load_balancing_loss() was not called after the forward")
        drouter = load_balancing_loss_backward(self._aux_cache, float(daux_loss))
        return {i: d for (i, _), d in zip(self._moe_layers(), drouter, strict=True)}

    def _head_backward(self, dlogits: np.ndarray, head: HeadCache) -> tuple[np.ndarray, dict]:
        """dlogits (B, T, V) -> dx (B, T, D) and the projection's grads, in a dict."""
        grads = {}
        if head.softcap is not None:
            dlogits = softcap_backward(dlogits, head.softcap)
        dx, dweight, dbias = linear_backward(dlogits, head.output)
        dx = self.scale_output(dx)  # y = c x: dx = c dy
        if dbias is not None:
            grads["output_proj.bias"] = dbias
        if self.config.tie_embeddings:
            grads["decoder.token_embedding.weight"] = dweight  # added to the embedding's own gradient below
        else:
            grads["output_proj.weight"] = dweight
        return dx, grads

    def _last_forward(self, caller: str) -> CacheT:
        """The last forward pass's cache; ValueError naming `caller` when there is none."""
        if self._cache is None and self._kept_nothing:
            raise ValueError(
                f"{caller} called after a forward with keep_cache=False, which kept nothing to read "
                "(run forward with keep_cache=True first)"
            )
        if self._cache is None:
            raise ValueError(f"{caller} called before forward: no forward pass has been run yet (call forward first)")
        return self._cache

    # -- state dicts -----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """A copy of every parameter, keyed by its state-dict name (docs/conventions.md)."""
        return {k: v.copy() for k, v in self.params.items()}

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Copy `state` into the parameters (cast to the model's dtype).

        Mis-shaped keys always raise ValueError; with strict=True so do missing and unexpected keys.
        Every offending key is listed in the message.
        """
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict of name -> array, got {type(state).__name__}")
        missing = [k for k in self.params if k not in state]
        unexpected = [k for k in state if k not in self.params]
        values, misshaped = {}, []
        for k in self.params.keys() & state.keys():
            value = np.asarray(state[k])
            if not (np.issubdtype(value.dtype, np.floating) or np.issubdtype(value.dtype, np.integer)):
                raise TypeError(f"state[{k!r}] must be a numeric array, got dtype {value.dtype}")
            if value.shape != self.params[k].shape:
                misshaped.append(f"{k}: got {value.shape}, expected {self.params[k].shape}")
            values[k] = value
        problems = []
        if strict and missing:
            problems.append(f"missing keys {missing}")
        if strict and unexpected:
            problems.append(f"unexpected keys {unexpected}")
        if misshaped:
            problems.append(f"mis-shaped keys [{'; '.join(misshaped)}]")
        if problems:
            raise ValueError("load_state_dict: state does not fit this model: " + ", ".join(problems))
        # Narrowing casts first, writes after: one that warns (float64 overflowing float32) and so raises under
        # -W error leaves every parameter as it was. Safe casts (float32 -> float64, same dtype) cannot fail
        # and are not copied.
        values = {k: v if np.can_cast(v.dtype, self.dtype) else v.astype(self.dtype) for k, v in values.items()}
        for k, value in values.items():
            self.params[k][...] = value  # in place: anything holding the arrays sees the new values

    # -- inspection --------------------------------------------------------------------------

    def attention_maps(self) -> dict:
        """Attention probabilities of the last forward pass, (B, H, T_q, T_k) each, keyed by module name
        ("encoder.layers.0.self_attn", "decoder.layers.1.cross_attn", ...)."""
        if self.config.attention == "flash":
            raise ValueError(
                "attention_maps: this model uses attention='flash', which never holds the (T_q, T_k) probabilities; "
                "build it with attention='plain' (the same weights load into either) to read them"
            )
        maps = {}
        for name, (stack, _) in self._last_forward("attention_maps").stacks().items():
            for i, layer in enumerate(stack.layers):
                for kind, attn in layer.attentions().items():
                    if isinstance(attn.attn, (ScaledDotProductAttentionCache, SinkAttentionCache)):  # sinks: GPT-OSS
                        maps[f"{name}.layers.{i}.{kind}"] = attn.attn.probs
        return maps

    def activations(self) -> dict:
        """Hidden states of the last forward pass, keyed "encoder.embedding", "encoder.layers.0", ...,
        "encoder" (the memory), likewise for the decoder, and "logits" (not in an EncoderModel)."""
        cache = self._last_forward("activations")
        acts = {}
        for name, (stack, out) in cache.stacks().items():
            acts[f"{name}.embedding"] = stack.hidden[0]
            for i, h in enumerate(stack.hidden[1:]):
                acts[f"{name}.layers.{i}"] = h
            acts[name] = out
        return acts | cache.outputs()


class Transformer(_Model[TransformerCache]):
    """The encoder-decoder Transformer of "Attention Is All You Need".

    forward(src_ids (B, T_src), tgt_ids (B, T_tgt)) -> logits (B, T_tgt, V_tgt). tgt_ids are the
    decoder's inputs (targets shifted right, starting with bos_id). Source padding (config.pad_id) is
    masked out of the encoder and of cross-attention; the decoder's self-attention masks only the future.
    """

    def forward(
        self,
        src_ids: ArrayLike,
        tgt_ids: ArrayLike,
        dropout_masks: dict | None = None,
        attention_mask: ArrayLike | None = None,
        *,
        keep_cache: bool = True,
    ) -> np.ndarray:
        """In training mode with dropout > 0, keep-masks are drawn from self.rng (and kept in
        self.dropout_masks), or taken from `dropout_masks` (site name -> bool array) when given.
        attention_mask (B, T_src): 1/True = a real source token (transformers' meaning); given, it says which
        source keys the encoder and cross-attention read, instead of config.pad_id.
        keep_cache=False: inference (torch.no_grad's counterpart): nothing is kept for backward or the inspection
        methods, and each layer's activations are freed as soon as the next layer has its input."""
        cfg = self.config
        src_ids = check_ids("src_ids", src_ids, cfg.src_vocab_size, cfg.position_limit)
        tgt_ids = check_ids("tgt_ids", tgt_ids, cfg.tgt_vocab_size, cfg.position_limit)
        if src_ids.shape[0] != tgt_ids.shape[0]:
            raise ValueError(
                f"src_ids and tgt_ids must have the same batch size, got {src_ids.shape[0]} and {tgt_ids.shape[0]}"
            )
        mask = check_attention_mask(attention_mask, src_ids)  # (B, T_src) bool, or None
        dropout = self._begin_forward(dropout_masks, keep_cache)
        acts = self.activation_table
        memory, enc_cache = encoder_forward(
            self.encoder_params(), src_ids, cfg, dropout, attention_mask=mask, activations=acts, keep=keep_cache
        )  # (B, T_src, D)
        memory_mask = source_mask(src_ids, mask, cfg.pad_id)  # (B, 1, 1, T_src), or None
        x, dec_cache = decoder_forward(
            sub(self.params, "decoder"), tgt_ids, memory, cfg, dropout, memory_mask=memory_mask, activations=acts,
            keep=keep_cache,
        )  # fmt: skip
        head = self._head_forward(x)  # (B, T_tgt, V) logits
        kept = None
        if enc_cache is not None and dec_cache is not None:
            kept = TransformerCache(enc_cache, memory, dec_cache, x, head)
        self._finish_forward(dropout, kept)
        return head.logits

    __call__ = forward

    def backward(self, dlogits: np.ndarray, daux_loss: float | None = None) -> None:
        r"""Accumulate the gradient of the loss with respect to every parameter into self.grads, given dlogits =
        :math:`\partial \mathcal{L} / \partial z` (B, T_tgt, V) and, for a mixture of experts whose objective adds
        the load-balancing loss (load_balancing_loss, called after forward), daux_loss, its weight there."""
        cache = self._last_forward("backward")
        dlogits = check_float_array("dlogits", dlogits, self.dtype, cache.head.logits.shape)
        drouter = self._router_grads(daux_loss)
        dx, grads = self._head_backward(dlogits, cache.head)
        dmemory, dec_grads = decoder_backward(dx, cache.decoder, drouter)
        if dmemory is None:  # decoder_forward was given the memory, so its backward returns the memory's gradient
            raise RuntimeError("Transformer.backward: the decoder's backward returned no gradient for the memory")
        enc_grads = encoder_backward(dmemory, cache.encoder)
        self.accumulate_grads(grads)  # with tied embeddings: the output projection's share of the table ...
        self.accumulate_grads(prefixed(dec_grads, "decoder"))  # ... plus the decoder's embedding lookup's share ...
        self.accumulate_grads(self._encoder_grads(enc_grads))  # ... plus, with shared embeddings, the encoder's


class TransformerLM(_Model[LMCache]):
    """A decoder-only (GPT-style) language model: causal self-attention, no cross-attention.

    forward(ids (B, T), attention_mask (B, T) or None) -> logits (B, T, V_tgt). Uses config.tgt_vocab_size and
    n_decoder_layers; parameters are the "decoder.*" and "output_proj.*" entries of the state dict.
    """

    decoder_only = True

    def forward(
        self,
        ids: ArrayLike,
        attention_mask: ArrayLike | None = None,
        dropout_masks: dict | None = None,
        *,
        keep_cache: bool = True,
    ) -> np.ndarray:
        """attention_mask: 1/True = a real token, 0/False = padding (transformers' meaning), for a left-padded
        batch: padded keys are masked out and positions count the real tokens (decoder_forward). The logits
        at padded positions are of no token (their rows attend to nothing). keep_cache=False: inference, as
        Transformer.forward's."""
        cfg = self.config
        ids = check_ids("ids", ids, cfg.tgt_vocab_size, cfg.position_limit)
        mask = check_attention_mask(attention_mask, ids)  # (B, T) bool, or None
        dropout = self._begin_forward(dropout_masks, keep_cache)
        acts = self.activation_table
        x, dec_cache = decoder_forward(
            sub(self.params, "decoder"), ids, None, cfg, dropout, attention_mask=mask, activations=acts, keep=keep_cache
        )  # (B, T, D)
        head = self._head_forward(x)  # (B, T, V) logits
        self._finish_forward(dropout, None if dec_cache is None else LMCache(dec_cache, x, head))
        return head.logits

    __call__ = forward

    def backward(self, dlogits: np.ndarray, daux_loss: float | None = None) -> None:
        r"""Accumulate the gradient of the loss with respect to every parameter into self.grads, given dlogits =
        :math:`\partial \mathcal{L} / \partial z` (B, T, V) and, for a mixture of experts whose objective adds the
        load-balancing loss (load_balancing_loss, called after forward), daux_loss, its weight there
        (transformers' router_aux_loss_coef): :math:`\mathcal L + c\, \mathcal L_{\text{aux}}` has daux_loss = c."""
        cache = self._last_forward("backward")
        dlogits = check_float_array("dlogits", dlogits, self.dtype, cache.head.logits.shape)
        drouter = self._router_grads(daux_loss)
        dx, grads = self._head_backward(dlogits, cache.head)
        _, dec_grads = decoder_backward(dx, cache.decoder, drouter)
        self.accumulate_grads(grads)  # with tied embeddings: the output projection's share of the table ...
        self.accumulate_grads(prefixed(dec_grads, "decoder"))  # ... plus the embedding lookup's share


class EncoderModel(_Model[EncoderModelCache]):
    """An encoder-only (BERT-style) model: the encoder stack and nothing after it.

    forward(ids (B, T), token_type_ids (B, T) or None) -> hidden states (B, T, D), the encoder's output
    (after final_norm when config.has_final_norm). Uses config.src_vocab_size and n_encoder_layers; parameters are
    the "encoder.*" entries of the state dict. Keys holding pad_id are masked out of attention, as
    BERT's attention mask does; token_type_ids default to zeros (needs config.type_vocab_size > 0).
    With config.pooler, BERT's pooler too (pooler.dense.*): pool(hidden) -> (B, D), pool_backward(dpooled) -> the
    gradient to add to backward's dhidden.
    """

    encoder_only = True

    def forward(
        self,
        ids: ArrayLike,
        token_type_ids: ArrayLike | None = None,
        dropout_masks: dict | None = None,
        attention_mask: ArrayLike | None = None,
        *,
        keep_cache: bool = True,
    ) -> np.ndarray:
        """attention_mask (B, T): 1/True = a real token (transformers' meaning); given, it says which keys are read,
        instead of config.pad_id. keep_cache=False: inference, as Transformer.forward's."""
        cfg = self.config
        ids = check_ids("ids", ids, cfg.src_vocab_size, cfg.position_limit)
        cfg.check_length("ids", ids.shape[1])
        token_type_ids = check_token_type_ids(token_type_ids, ids, cfg.type_vocab_size)
        mask = check_attention_mask(attention_mask, ids)  # (B, T) bool, or None
        dropout = self._begin_forward(dropout_masks, keep_cache)
        acts = self.activation_table
        hidden, enc_cache = encoder_forward(
            self.encoder_params(),
            ids,
            cfg,
            dropout,
            token_type_ids=token_type_ids,
            attention_mask=mask,
            activations=acts,
            keep=keep_cache,
        )  # (B, T, D)
        self._finish_forward(dropout, None if enc_cache is None else EncoderModelCache(enc_cache, hidden))
        return hidden

    __call__ = forward

    def backward(self, dhidden: np.ndarray) -> None:
        r"""Accumulate the gradient of the loss with respect to every parameter into self.grads, given dhidden =
        :math:`\partial \mathcal{L} / \partial x` of the hidden states x (B, T, D)."""
        cache = self._last_forward("backward")
        dhidden = check_float_array("dhidden", dhidden, self.dtype, cache.hidden.shape)
        self.accumulate_grads(self._encoder_grads(encoder_backward(dhidden, cache.encoder)))

    def pool(self, hidden: np.ndarray) -> np.ndarray:
        r"""BERT's pooler (config.pooler): hidden states h (B, T, D), as forward returns them -> pooled (B, D),

        .. math::

            p = \tanh\big(h_{:, 0}\, W^\top + b\big)

        W = pooler.dense.weight (D, D), b = pooler.dense.bias (D,): the [CLS] position, through a dense layer and
        tanh (BertModel's pooler_output). pool_backward gives its gradient."""
        if not self.config.pooler:
            raise ValueError("pool: this model has no pooler (config.pooler=False)")
        hidden = check_float_array("hidden", hidden, self.dtype)
        check_ndim("hidden", hidden, 3, "(B, T, D)")
        z, linear_cache = linear_forward(
            hidden[:, 0], self.params["pooler.dense.weight"], self.params["pooler.dense.bias"]
        )
        pooled, tanh_cache = tanh_forward(z)  # (B, D)
        self._pool_cache = PoolCache(hidden.shape, linear_cache, tanh_cache)
        return pooled

    def mlm_logits(self, hidden: np.ndarray) -> np.ndarray:
        """ModernBERT's masked-LM head (config.mlm_head; mlm_head_forward): hidden states (B, T, D), as forward
        returns them -> logits (B, T, V). mlm_logits_backward gives its gradient."""
        if not self.config.mlm_head:
            raise ValueError("mlm_logits: this model has no masked-LM head (config.mlm_head=False)")
        hidden = check_float_array("hidden", hidden, self.dtype)
        check_ndim("hidden", hidden, 3, "(B, T, D)")
        logits, self._mlm_cache = mlm_head_forward(self.params, hidden, self.config, self.activation_table)
        return logits

    def mlm_logits_backward(self, dlogits: np.ndarray) -> np.ndarray:
        """Gradients of mlm_logits, given dlogits (B, T, V): accumulates the head's (and the tied token table's)
        into self.grads and returns dhidden (B, T, D), to add to backward's."""
        if self._mlm_cache is None:
            raise ValueError(
                "mlm_logits_backward called before mlm_logits: no logits to differentiate (call mlm_logits first)"
            )
        dlogits = check_float_array("dlogits", dlogits, self.dtype, self._mlm_cache.logits_shape)
        dhidden, grads = mlm_head_backward(dlogits, self._mlm_cache)
        self.accumulate_grads(grads)
        return dhidden

    def pool_backward(self, dpooled: np.ndarray) -> np.ndarray:
        r"""Gradients of pool, given dpooled = :math:`\partial \mathcal{L} / \partial p` (B, D): accumulates dW and db
        into self.grads and returns dh (B, T, D), zero but at position 0 (add it to backward's dhidden):

        .. math::

            dz = dp\,(1 - p^2), \qquad dW = dz^\top h_{:, 0}, \qquad db = \textstyle\sum_B dz, \qquad
            dh_{:, 0} = dz\, W
        """
        if self._pool_cache is None:
            raise ValueError(
                "pool_backward called before pool: there is no pooled output to differentiate (call pool first)"
            )
        shape = self._pool_cache.hidden_shape
        dpooled = check_float_array("dpooled", dpooled, self.dtype, (shape[0], shape[2]))
        dz = tanh_backward(dpooled, self._pool_cache.tanh)  # (B, D)
        dfirst, dweight, dbias = linear_backward(dz, self._pool_cache.dense)
        self.accumulate_grads({"pooler.dense.weight": dweight, "pooler.dense.bias": dbias})
        dhidden = np.zeros(shape, dtype=self.dtype)
        dhidden[:, 0] = dfirst  # only the [CLS] position feeds the pooler
        return dhidden


@dataclass(frozen=True, slots=True)
class MlmHeadCache:
    dense: LinearCache  # z = h W^T + b_W
    activation_backward: Callable[[np.ndarray, object], np.ndarray]  # phi's backward
    activation: object  # phi's own cache
    norm: LayerNormCache  # n = LN(a)
    norm_bias: bool  # the LayerNorm has a bias
    out: LinearCache  # logits = n E^T + b
    logits_shape: tuple[int, ...]  # (B, T, V)


def mlm_head_forward(
    params: dict, h: np.ndarray, config: TransformerConfig, activations: dict[str, ActivationPair] = ACTIVATIONS
) -> tuple[np.ndarray, MlmHeadCache]:
    r"""ModernBERT's masked-LM head (ModernBertForMaskedLM's head and decoder): hidden states h (B, T, D) ->
    logits (B, T, V), through a dense layer, the activation, a LayerNorm, and the token table E (tied):

    .. math::

        z = h\, W^\top + b_W, \qquad a = \phi(z), \qquad n = \mathrm{LN}(a), \qquad
        \mathrm{logits} = n\, E^\top + b

    W = mlm_head.dense.weight (D, D) (b_W only with config.bias), LN = mlm_head.norm (no bias with
    config.norm_bias False), E = encoder.token_embedding.weight (V, D), b = mlm_head.bias (V,) (config.output_bias);
    :math:`\phi` is activations[config.activation]."""
    act_forward, act_backward = activations[config.activation]
    z, dense_cache = linear_forward(h, params["mlm_head.dense.weight"], params.get("mlm_head.dense.bias"))  # (B,T,D)
    a, act_cache = act_forward(z)
    norm_weight, norm_bias = params["mlm_head.norm.weight"], params.get("mlm_head.norm.bias")
    n, norm_cache = layer_norm_forward(a, norm_weight, norm_bias, config.layer_norm_eps)  # (B, T, D)
    logits, out_cache = linear_forward(n, params["encoder.token_embedding.weight"], params.get("mlm_head.bias"))
    has_bias = norm_bias is not None
    return logits, MlmHeadCache(dense_cache, act_backward, act_cache, norm_cache, has_bias, out_cache, logits.shape)


def mlm_head_backward(dlogits: np.ndarray, cache: MlmHeadCache) -> tuple[np.ndarray, dict]:
    r"""Backward of mlm_head_forward, its lines in reverse: dlogits (B, T, V) -> dh (B, T, D) and the grads (the
    token table's share under encoder.token_embedding.weight, to add to the encoder's):

    .. math::

        \begin{gathered}
        dn = d\mathrm{logits}\, E, \quad dE = d\mathrm{logits}^\top n, \quad db = \textstyle\sum d\mathrm{logits},
        \\ da = J_{\mathrm{LN}}^\top dn, \quad dz = \phi'(z) \odot da, \quad dh = dz\, W, \quad dW = dz^\top h
        \end{gathered}
    """
    dn, dtable, dbias = linear_backward(dlogits, cache.out)
    da, dnorm_weight, dnorm_bias = layer_norm_backward(dn, cache.norm)
    dz = cache.activation_backward(da, cache.activation)
    dh, ddense, ddense_bias = linear_backward(dz, cache.dense)
    grads = {
        "encoder.token_embedding.weight": dtable, "mlm_head.bias": dbias, "mlm_head.dense.weight": ddense,
        "mlm_head.dense.bias": ddense_bias, "mlm_head.norm.weight": dnorm_weight,
        "mlm_head.norm.bias": dnorm_bias if cache.norm_bias else None,
    }  # fmt: skip
    return dh, {k: v for k, v in grads.items() if v is not None}


def check_token_type_ids(token_type_ids: ArrayLike | None, ids: np.ndarray, type_vocab_size: int) -> np.ndarray | None:
    """Validate BERT's token types against ids (B, T): an integer array of the same shape, values in
    [0, type_vocab_size). None stays None (type 0 everywhere, when the model has token types)."""
    if token_type_ids is None:
        return None
    if type_vocab_size == 0:
        raise ValueError(
            "token_type_ids given, but this model has no token-type embedding (config.type_vocab_size=0); "
            "pass token_type_ids=None or build the model with type_vocab_size > 0"
        )
    token_type_ids = check_ids("token_type_ids", token_type_ids, type_vocab_size)
    if token_type_ids.shape != ids.shape:
        raise ValueError(f"token_type_ids must have the shape of ids {ids.shape}, got {token_type_ids.shape}")
    return token_type_ids
