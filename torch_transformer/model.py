"""The encoder-decoder `Transformer`, the decoder-only `TransformerLM` and the encoder-only `EncoderModel`.

Shape letters: B batch, S source length, T target length, D d_model, H heads, F d_ff, V vocabulary.
State-dict names follow docs/conventions.md exactly; the NumPy reference uses the same names.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_spec.config import GenerationRules, TransformerConfig
from transformer_spec.shapes import parameter_shapes

from .attention import MultiHeadAttention, padding_mask
from .deepseek_moe import DeepseekMoe
from .gpt_oss_moe import GptOssFeedForward
from .latent_attention import LatentAttention
from .layers import (
    ACTIVATIONS,
    Dropout,
    FeedForward,
    init_linear,
    make_norm,
    masks_under,
    residual,
    rope_cos_sin,
    rope_cos_sin_at,
    sinusoidal_table,
)
from .moe import MoeFeedForward, load_balancing_loss


class _Layer(nn.Module):
    """Base of the encoder and decoder layers: the residual sublayer `name` uses the norm `{name}_norm`
    (layer norm or RMSNorm) and the dropout site `{name}_dropout`, the names of the state dict and of
    the sites."""

    norm_first: bool

    def _sublayer(self, name: str, config: TransformerConfig, normed: bool = True) -> None:
        """Add the residual sublayer `name`'s norm (nn.Identity when not `normed` or without config.input_norm,
        OLMo 2's: no parameters) and output dropout."""
        setattr(self, f"{name}_norm", make_norm(config) if normed and config.input_norm else nn.Identity())
        if config.sandwich_norm:  # Gemma: the sublayer's output normalised too, x + f(Norm(x)) -> x + Norm_post(...)
            setattr(self, f"{name}_post_norm", make_norm(config))
        setattr(self, f"{name}_dropout", Dropout(config.dropout_rates["residual"]))

    @staticmethod
    def _attention(
        config: TransformerConfig, causal: bool = False, cross: bool = False, layer: int = 0
    ) -> MultiHeadAttention | LatentAttention:
        """Self-attention of layer `layer` (ALiBi in every one; T5's bias, bidirectional in an encoder; its window,
        config.layer_window, causal in a decoder, and in an encoder of layer_types a band |i - j| <= window // 2,
        ModernBERT's) or cross-attention (no score rules): the score rules of numpy_transformer.model.score_mod."""
        c = config
        if c.kv_lora_rank is not None and not cross:  # DeepSeek's latent attention
            return LatentAttention(c, c.layer_attention_scale(layer))
        window = None if cross else c.layer_window(layer)
        relative = None
        if c.has_relative_bias and not cross:  # T5, MPNet: the stack's table, read at this layer's buckets
            relative = (c.relative_buckets, c.relative_max_distance, not causal)
        return MultiHeadAttention(
            c.d_model, c.n_heads, c.dropout_rates["attention"], c.n_kv_heads, c.bias,
            qkv_bias=c.has_qkv_bias,
            window=window if causal else None,
            band=window // 2 if window is not None and not causal and c.layer_types is not None else None,
            alibi=c.positional == "alibi" and not cross,
            scale=c.attention_scale if cross else c.layer_attention_scale(layer),
            head_dim=c.d_head,
            qk_norm_eps=c.layer_norm_eps if c.qk_norm else None,
            qk_norm_kind="rms_offset" if c.norm == "rms_offset" else "rms",
            qk_norm_projection=c.qk_norm_projection,
            causal=causal and not cross,
            relative=relative,
            softcap=c.attn_softcap,
            sinks=c.attn_sinks,
        )  # fmt: skip

    @staticmethod
    def _feed_forward(
        config: TransformerConfig, moe: bool = False
    ) -> FeedForward | MoeFeedForward | GptOssFeedForward | DeepseekMoe:
        """The dense (or gated) feed-forward block, or (moe: config.is_moe_layer) a sparse mixture of experts
        (GPT-OSS's with config.expert_kind "gpt_oss", DeepSeek's with config.deepseek_router)."""
        c = config
        if moe and c.expert_kind == "gpt_oss":
            return GptOssFeedForward(c.d_model, c.expert_width, c.n_experts, c.top_k, c.swiglu_limit, c.swiglu_alpha)
        if moe and c.deepseek_router:
            return DeepseekMoe(c)
        if moe:
            return MoeFeedForward(c.d_model, c.expert_width, c.n_experts, c.top_k, c.norm_topk_prob, c.activation)
        rate = c.dropout_rates["activation"]
        return FeedForward(c.d_model, c.d_ff, c.activation, rate, gated=c.gated_ffn, bias=c.has_ffn_bias)

    def _residual(self, name: str, x: Tensor, sublayer: Callable[[Tensor], Tensor], masks: Mapping) -> Tensor:
        norm, dropout = getattr(self, f"{name}_norm"), getattr(self, f"{name}_dropout")
        post = getattr(self, f"{name}_post_norm", None)
        return residual(x, sublayer, norm, dropout, self.norm_first, masks.get(f"{name}_dropout"), post)


class EncoderLayer(_Layer):
    """Self-attention then feed-forward, each in a residual sublayer. x (B, S, D) -> (B, S, D)."""

    def __init__(self, config: TransformerConfig, layer: int = 0):
        """layer: the index whose kind (config.layer_types) chooses the score rules; layer 0 has no self-attention
        norm (nn.Identity) when config.first_attn_norm is False (ModernBERT's)."""
        super().__init__()
        if config.parallel_residual:
            raise ValueError("parallel_residual=True is a decoder-only layer (TransformerLM), not an encoder's")
        self.norm_first = config.norm_first
        self.self_attn = self._attention(config, layer=layer)
        self._sublayer("self_attn", config, normed=layer > 0 or config.first_attn_norm)
        self.ffn = self._feed_forward(config)
        self._sublayer("ffn", config)

    def forward(
        self,
        x: Tensor,
        self_mask: Tensor | None,
        need_weights: bool = False,
        dropout_masks: Mapping | None = None,
        rope: tuple[Tensor, Tensor] | None = None,
        bias_table: Tensor | None = None,
    ) -> Tensor:
        """x (B, S, D), self_mask broadcastable to (B, H, S, S) or None; dropout_masks keyed below this
        layer; rope the rotary (cos, sin) of positions 0 .. S - 1, or None; bias_table (n_buckets, H): the stack's
        T5 table, or None."""
        masks = dropout_masks or {}

        def self_attention(h: Tensor) -> Tensor:
            keep = masks.get("self_attn.dropout")
            return self.self_attn(h, h, h, self_mask, need_weights, keep, rope, bias_table=bias_table)[0]

        def feed_forward(h: Tensor) -> Tensor:
            return self.ffn(h, masks.get("ffn.dropout"))

        x = self._residual("self_attn", x, self_attention, masks)
        return self._residual("ffn", x, feed_forward, masks)  # (B, S, D)


class DecoderLayer(_Layer):
    """Masked self-attention, cross-attention to the encoder's output (left out in the LM), then
    feed-forward, each in a residual sublayer. x (B, T, D), memory (B, S, D) -> (B, T, D)."""

    # the sublayers' norms and dropouts, set by _sublayer under the state dict's names
    self_attn_norm: nn.Module
    self_attn_dropout: Dropout
    ffn_norm: nn.Module
    ffn_dropout: Dropout

    def __init__(self, config: TransformerConfig, cross_attention: bool = True, layer: int = 0):
        super().__init__()
        if config.parallel_residual and cross_attention:
            raise ValueError(
                "parallel_residual=True is a decoder-only layer (TransformerLM): it has no cross-attention"
            )
        self.norm_first = config.norm_first
        self.parallel_residual = config.parallel_residual  # GPT-NeoX: x + Attn(Norm1(x)) + FFN(Norm2(x))
        self.self_attn = self._attention(config, causal=True, layer=layer)
        self._sublayer("self_attn", config)
        self.has_cross_attention = cross_attention
        if cross_attention:
            self.cross_attn = self._attention(config, cross=True)
            self._sublayer("cross_attn", config)
        self.ffn = self._feed_forward(config, config.is_moe_layer(layer))
        self._sublayer("ffn", config, normed=not config.shared_norm)  # Phi-2: the feed-forward reads self_attn_norm
        self.shared_norm = config.shared_norm

    def forward(
        self,
        x: Tensor,
        self_mask: Tensor | None = None,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        need_weights: bool = False,
        dropout_masks: Mapping | None = None,
        rope: tuple[Tensor, Tensor] | None = None,
        bias_table: Tensor | None = None,
        caches: tuple | None = None,
        key_padding: Tensor | None = None,
        q_pos: Tensor | None = None,
    ) -> Tensor:
        """x (B, T, D), memory (B, S, D), memory_mask broadcastable to (B, H, T, S); dropout_masks keyed
        below this layer; rope the rotary (cos, sin) of x's positions, or None; bias_table (n_buckets, H): the
        stack's T5 table, or None. Self-attention is causal; self_mask (broadcastable to (B, H, T, T)) masks more
        on top of that, None nothing more. caches, in decoding: the layer's (KVCache, MemoryCache or None), read and
        extended by attention, with q_pos (T,) x's positions. key_padding (B, P): a padded batch's real tokens by
        key position, or None."""
        masks = dropout_masks or {}
        self_cache, memory_cache = (None, None) if caches is None else caches

        def self_attention(h: Tensor) -> Tensor:
            keep = masks.get("self_attn.dropout")
            return self.self_attn(
                h, h, h, self_mask, need_weights, keep, rope, is_causal=True, bias_table=bias_table,
                kv_cache=self_cache, key_padding=key_padding, q_pos=q_pos,
            )[0]  # fmt: skip

        def cross_attention(h: Tensor) -> Tensor:
            # Queries from the decoder; keys and values from the encoder's output.
            keep = masks.get("cross_attn.dropout")
            return self.cross_attn(h, memory, memory, memory_mask, need_weights, keep, kv_cache=memory_cache)[0]

        def feed_forward(h: Tensor) -> Tensor:
            return self.ffn(h, masks.get("ffn.dropout"))

        if self.parallel_residual:  # both sublayers read the layer's input; their outputs join the stream at once
            h = self.self_attn_norm(x)
            y = self.self_attn_dropout(self_attention(h), masks.get("self_attn_dropout"))
            g = h if self.shared_norm else self.ffn_norm(x)  # Phi-2: one norm for both (ffn_norm is nn.Identity)
            return x + y + self.ffn_dropout(feed_forward(g), masks.get("ffn_dropout"))
        x = self._residual("self_attn", x, self_attention, masks)
        if self.has_cross_attention:
            x = self._residual("cross_attn", x, cross_attention, masks)
        return self._residual("ffn", x, feed_forward, masks)  # (B, T, D)


class RelativeBiasTable(nn.Module):
    """T5's relative position bias W (n_buckets, H), one per stack (state-dict name `relative_bias.weight`): every
    self-attention of the stack reads it at its own positions (scores.position_bias), and autograd sums the
    gradient over them."""

    def __init__(self, n_buckets: int, n_heads: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_buckets, n_heads))
        nn.init.normal_(self.weight, std=0.02)


class _Stack(nn.Module):
    """What the encoder and the decoder share: token and position embeddings (token types and an
    embedding norm when the config asks), a list of layers, and (pre-norm only) a final layer norm,
    since pre-norm layers leave their output un-normalised.

    `own_token_embedding` False leaves out the token table: the stack reads one that is passed to
    `embed` (the encoder of a model with shared embeddings reads the decoder's)."""

    def __init__(
        self,
        config: TransformerConfig,
        vocab_size: int,
        layers: Sequence[nn.Module],
        token_types: bool = False,
        own_token_embedding: bool = True,
    ):
        super().__init__()
        d = config.d_model
        self.d_model = d
        self.pad_id = config.pad_id
        self.scale_embeddings = config.scale_embeddings
        self.sinusoid_layout = config.sinusoid_layout
        # padding_idx: lookups of pad_id pass no gradient to the table (config.embedding_padding_idx, Marian)
        padding_idx = config.pad_id if config.embedding_padding_idx else None
        self.token_embedding: nn.Embedding | None = None
        if own_token_embedding:
            table = nn.Embedding(vocab_size, d, padding_idx)
            nn.init.normal_(table.weight, std=d**-0.5)
            self.token_embedding = table
        self.positional = config.positional
        self.rope_dim = config.rope_dim  # the features of each head RoPE turns: Dh, or fewer (partial rotary)
        # each layer's rotary base and scaling (Gemma 3's, ModernBERT's local layers: a base and scaling of their own)
        self.rope_kinds = [(config.layer_rope_theta(i), config.layer_rope_scaling(i)) for i in range(len(layers))]
        self.rope_layers = [config.layer_uses_rope(i) for i in range(len(layers))]  # SmolLM3's NoPE layers: False
        self.max_len = config.max_len  # max_position_embeddings: dynamic NTK scales past it
        self.learned_positions = config.positional == "learned"
        # RoBERTa's positions (config.positions_after_pad): computed from the ids; row pad_id takes no gradient
        self.positions_after_pad = config.pad_id if config.positions_after_pad else None
        if self.learned_positions:
            self.position_embedding = nn.Embedding(config.max_len, d)
            nn.init.normal_(self.position_embedding.weight, std=0.02)
        self.token_type_embedding = None
        if token_types and config.type_vocab_size > 0:
            self.token_type_embedding = nn.Embedding(config.type_vocab_size, d)
            nn.init.normal_(self.token_type_embedding.weight, std=0.02)
        # nn.Identity has no parameters: without the option there are no embedding_norm.* keys.
        norm = nn.LayerNorm(d, eps=config.layer_norm_eps, bias=config.norm_bias)  # BERT's, BART's, ModernBERT's
        self.embedding_norm = norm if config.embedding_norm else nn.Identity()
        self.embedding_dropout = Dropout(config.dropout_rates["embedding"])
        self.layers = nn.ModuleList(layers)
        self.relative_bias = None  # T5: one bias table for every self-attention of the stack
        if config.has_relative_bias:  # T5's positional "relative", or MPNet's relative_bias
            self.relative_bias = RelativeBiasTable(config.relative_buckets, config.n_heads)
        # nn.Identity has no parameters, so a stack without a final norm has no final_norm.* keys.
        self.final_norm = make_norm(config) if config.has_final_norm else nn.Identity()

    def embed(
        self,
        ids: Tensor,
        dropout_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        token_embedding: nn.Embedding | None = None,
        start: int = 0,
        positions: Tensor | None = None,
    ) -> Tensor:
        """ids (B, T) -> dropout(norm(token_embedding(ids) * sqrt(D) + PE[start : start + T] + types)), (B, T, D).

        token_type_ids None means type 0 everywhere (when the stack has token types); token_embedding
        is the table to read when the stack has none of its own; start > 0 embeds later positions
        (decoding one step at a time); positions (B, T): each row's own positions instead (a padded batch)."""
        tokens = self.token_embedding if token_embedding is None else token_embedding
        if tokens is None:
            raise ValueError("embed: this stack has no token table of its own: pass token_embedding, the shared one")
        x = tokens(ids.long())  # (B, T, D)
        if self.scale_embeddings:
            x = x * math.sqrt(self.d_model)  # a Python float keeps x's dtype
        end = start + ids.shape[1]
        if self.learned_positions:
            table = self.position_embedding.weight
            if positions is None:
                x = x + table[start:end]  # (T, D)
            else:  # each row its own positions (a padded batch; RoBERTa's, whose pad row takes no gradient)
                x = x + F.embedding(positions, table, self.positions_after_pad)  # (B, T, D)
        elif self.positional == "sinusoidal":
            # Computed on the fly in x's dtype: a float64 model gets a float64 table, and nothing
            # has to follow the model across devices.
            last = end if positions is None else int(positions.max()) + 1
            table = sinusoidal_table(last, self.d_model, x.dtype, x.device, self.sinusoid_layout)
            x = x + (table[start:] if positions is None else table[positions])  # (T, D) or (B, T, D)
        # rotary positions ("rope") add nothing here: attention rotates queries and keys (see `rope`); nor does
        # ALiBi ("alibi"): attention biases its scores
        if self.token_type_embedding is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(ids, dtype=torch.long)
            x = x + self.token_type_embedding(token_type_ids.long())  # (B, T, D)
        return self.embedding_dropout(self.embedding_norm(x), dropout_mask)

    def token_table(self) -> Tensor:
        """The stack's own token table (V, D); ValueError for a stack that reads a shared one."""
        if self.token_embedding is None:
            raise ValueError("this stack has no token table of its own (it reads the decoder's)")
        return self.token_embedding.weight

    def bias_table(self) -> Tensor | None:
        """T5's table (n_buckets, H), which every self-attention of the stack reads; None without one."""
        return None if self.relative_bias is None else self.relative_bias.weight

    def ropes(self, start: int, end: int, x: Tensor, positions: Tensor | None = None) -> list:
        """Each layer's rotary (cos, sin) of positions start .. end - 1, each (T, R), or of each row's own
        `positions` (B, T), each (B, 1, T, R) (R = config.rope_dim: Dh, or fewer with partial rotary), in x's dtype
        and on its device, at the layer's base and scaling (computed once per kind); Nones unless the positions are
        rotary, and None for a layer without positions (SmolLM3's NoPE layers, config.layer_uses_rope False)."""
        if self.positional != "rope":
            return [None] * len(self.rope_kinds)
        tables = {}
        for theta, scaling in set(self.rope_kinds):
            if positions is not None:
                table = rope_cos_sin_at(positions, self.rope_dim, theta, x.dtype, scaling, self.max_len)
            else:
                table = rope_cos_sin(start, end, self.rope_dim, theta, x.dtype, x.device, scaling, self.max_len)
            tables[theta, scaling] = table
        return [tables[kind] if uses else None for kind, uses in zip(self.rope_kinds, self.rope_layers, strict=True)]


class Encoder(_Stack):
    """Source ids (B, S) -> memory (B, S, D)."""

    def __init__(self, config: TransformerConfig, own_token_embedding: bool = True):
        layers = [EncoderLayer(config, i) for i in range(config.n_encoder_layers)]
        super().__init__(config, config.src_vocab_size, layers, True, own_token_embedding)

    def forward(
        self,
        ids: Tensor,
        need_weights: bool = False,
        dropout_masks: Mapping | None = None,
        token_type_ids: Tensor | None = None,
        token_embedding: nn.Embedding | None = None,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """token_type_ids (B, S) or None; token_embedding: the shared table, when the encoder has none;
        attention_mask (B, S) bool, True = a real token: the keys read, instead of those not holding pad_id."""
        self_mask = source_mask(ids, attention_mask, self.pad_id)  # (B, 1, 1, S), or None: nothing masked
        positions = None
        if self.positions_after_pad is not None:  # RoBERTa: pad_id + the count of real tokens so far; pad_id at pads
            real = ids != self.positions_after_pad
            positions = torch.cumsum(real, dim=1) * real + self.positions_after_pad  # (B, S)
        masks = (dropout_masks or {}).get("embedding_dropout")
        x = self.embed(ids, masks, token_type_ids, token_embedding, positions=positions)
        ropes = self.ropes(0, ids.shape[1], x)
        table = self.bias_table()  # T5: each layer's self-attention reads the bias at its positions
        for i, layer in enumerate(self.layers):
            x = layer(x, self_mask, need_weights, masks_under(dropout_masks, f"layers.{i}."), ropes[i], table)
        return self.final_norm(x)


def source_mask(ids: Tensor, attention_mask: Tensor | None, pad_id: int | None) -> Tensor | None:
    """The keys an encoder's attention and cross-attention may read, (B, 1, 1, S): attention_mask's real tokens
    when given (transformers' meaning, whatever ids they hold), else those not holding pad_id; None: all."""
    if attention_mask is None:
        return padding_mask(ids, pad_id)
    return attention_mask[:, None, None, :]


class Decoder(_Stack):
    """Target ids (B, T) and memory (B, S, D) -> hidden states (B, T, D).

    Self-attention masks only the future (causal), as Hugging Face's decoders do: the target's padding
    sits at the end, where causality hides it from every real position, and a start token equal to
    pad_id (Marian's) is read like any other. Cross-attention (absent when `cross_attention` is False,
    as in the LM) skips padded source positions via `memory_mask`.
    """

    def __init__(self, config: TransformerConfig, cross_attention: bool = True):
        if config.positions_after_pad:
            raise ValueError("positions_after_pad (RoBERTa's positions) is an EncoderModel's, not a decoder's")
        layers = [DecoderLayer(config, cross_attention, i) for i in range(config.n_decoder_layers)]
        super().__init__(config, config.tgt_vocab_size, layers)
        self.cross_attention = cross_attention

    def forward(
        self,
        ids: Tensor,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        need_weights: bool = False,
        dropout_masks: Mapping | None = None,
        caches: list | None = None,
        start: int = 0,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """ids (B, T) at positions start .. start + T - 1 -> hidden states (B, T, D). Decoding runs only the new
        positions, with caches (each layer's (KVCache, MemoryCache or None)) that attention reads and extends.
        attention_mask (B, start + T) bool, True = a real token (a left-padded batch): padded keys are masked out
        and each token's position is the count of real tokens before it in its row, as transformers' generate()
        computes it (cumsum - 1; 0 for padding), for the learned and rotary positions; causality, the window and
        ALiBi read index distances, equal to those positions' distances between the real tokens of a left-padded
        row."""
        if self.cross_attention and memory is None:
            raise ValueError("memory must be the encoder's output (B, S, D) for a decoder with cross-attention")
        end = start + ids.shape[1]
        positions = None
        if attention_mask is not None:
            positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(~attention_mask, 0)[:, start:]  # (B, T)
        x = self.embed(ids, (dropout_masks or {}).get("embedding_dropout"), start=start, positions=positions)
        ropes = self.ropes(start, end, x, positions)
        table = self.bias_table()  # T5: each layer's self-attention reads the bias at its positions
        q_pos = None if caches is None else torch.arange(start, end, device=x.device)  # (T,): the cache's slots
        for i, layer in enumerate(self.layers):
            masks = masks_under(dropout_masks, f"layers.{i}.")
            layer_caches = None if caches is None else caches[i]
            x = layer(
                x, None, memory, memory_mask, need_weights, masks, ropes[i], table, layer_caches, attention_mask, q_pos
            )
        return self.final_norm(x)


class _OutputBias(nn.Module):
    """The output projection of a tied model with an output bias: only the bias is its own; the weight
    is `decoder.token_embedding.weight`. Gives the state-dict key `output_proj.bias` and no weight."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(vocab_size))


def dropout_site_shapes(
    config: TransformerConfig, *, batch_size: int, tgt_len: int | None = None, src_len: int | None = None
) -> dict[str, tuple[int, ...]]:
    """Every dropout site of a model whose rate is above zero, in forward order, with the shape of its keep-mask.

    `src_len` None describes a `TransformerLM` (decoder only, no cross-attention), `tgt_len` None an
    `EncoderModel` (encoder only). Sites, by kind (config.dropout_rates): the embedding output (B, T, D);
    attention probabilities (B, H, T_q, T_k); the FFN hidden (B, T, F), "activation"; each sublayer's output
    before the residual add (B, T, D), "residual". A site whose rate is 0 is the identity and has no mask.
    """
    b, d, h, f = batch_size, config.d_model, config.n_heads, config.d_ff
    if tgt_len is None and src_len is None:
        raise ValueError("dropout_site_shapes: give tgt_len (a model with a decoder), src_len (an encoder), or both")

    rates = config.dropout_rates

    def stack(prefix: str, n_layers: int, length: int, memory_len: int | None) -> dict:
        sites: list[tuple[str, str, tuple[int, ...]]] = [(f"{prefix}.embedding_dropout", "embedding", (b, length, d))]
        for i in range(n_layers):
            layer = f"{prefix}.layers.{i}"
            sites += [(f"{layer}.self_attn.dropout", "attention", (b, h, length, length))]
            sites += [(f"{layer}.self_attn_dropout", "residual", (b, length, d))]
            if memory_len is not None:
                sites += [(f"{layer}.cross_attn.dropout", "attention", (b, h, length, memory_len))]
                sites += [(f"{layer}.cross_attn_dropout", "residual", (b, length, d))]
            if not (prefix == "decoder" and config.is_moe_layer(i)):  # the experts have no dropout site
                sites += [(f"{layer}.ffn.dropout", "activation", (b, length, f))]
            sites += [(f"{layer}.ffn_dropout", "residual", (b, length, d))]
        return {site: shape for site, kind, shape in sites if rates[kind] > 0}

    sites: dict[str, tuple[int, ...]] = {}
    if src_len is not None:
        sites |= stack("encoder", config.n_encoder_layers, src_len, None)
    if tgt_len is not None:
        sites |= stack("decoder", config.n_decoder_layers, tgt_len, src_len)
    return sites


def values_checked_in_forward(ids: Tensor) -> bool:
    """Whether `forward` reads the values of `ids` to check them: in eager mode on the CPU only, where that
    costs nothing. Under `torch.compile` reading a value would break the graph (`Tensor.item()`), and on an
    accelerator it would make the host wait for the device once per check, so there `forward` checks types
    and shapes only: call the model's `check_inputs` (on the CPU batch, before it moves) for the rest."""
    return isinstance(ids, Tensor) and ids.device.type == "cpu" and not torch.compiler.is_compiling()


def check_ids(name: str, ids: Tensor, vocab_size: int, max_len: int, values: bool | None = True) -> None:
    """Raise a clear error unless `ids` is an integer tensor (B, T), 0 < T <= max_len, ids in [0, V).

    values False checks types and shapes only (nothing is read from the device); None: as `forward` does,
    see `values_checked_in_forward`."""
    if not isinstance(ids, Tensor):
        raise TypeError(f"{name} must be an integer tensor, got {type(ids).__name__}")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {ids.dtype}")
    if ids.dim() != 2:
        raise ValueError(f"{name} must have shape (B, T), got shape {tuple(ids.shape)}")
    if ids.numel() == 0:
        raise ValueError(f"{name} must not be empty: got shape {tuple(ids.shape)}, expected B >= 1 and T >= 1")
    if ids.shape[1] > max_len:
        raise ValueError(f"{name} has length T={ids.shape[1]}, longer than config.max_len={max_len}")
    if values is None:
        values = values_checked_in_forward(ids)
    if not values:
        return
    low, high = torch.stack([ids.min(), ids.max()]).tolist()  # one read from the device, not two
    if low < 0 or high >= vocab_size:
        raise ValueError(f"{name} must hold token ids in [0, {vocab_size}), got min {low} and max {high}")


def check_attention_mask(attention_mask: Tensor | None, ids: Tensor) -> Tensor | None:
    """attention_mask as a bool tensor (True = a real token), after checking that it is a bool or integer tensor
    of 0/1 shaped like ids, with a real token in every row; None stays None."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, Tensor):
        raise TypeError(f"attention_mask must be a bool or integer tensor, got {type(attention_mask).__name__}")
    if attention_mask.dtype.is_floating_point or attention_mask.dtype.is_complex:
        raise TypeError(f"attention_mask must be a bool or integer tensor of 0/1, got {attention_mask.dtype}")
    if attention_mask.shape != ids.shape:
        raise ValueError(
            f"attention_mask must have the shape of the ids {tuple(ids.shape)}, got {tuple(attention_mask.shape)}"
        )
    if attention_mask.dtype != torch.bool and not ((attention_mask == 0) | (attention_mask == 1)).all():
        raise ValueError("attention_mask must hold 0 (padding) and 1 (a real token)")
    mask = attention_mask.to(device=ids.device, dtype=torch.bool)
    if not mask.any(dim=1).all():
        raise ValueError(
            f"attention_mask: rows {torch.nonzero(~mask.any(dim=1)).flatten().tolist()} have no real token"
        )
    return mask


def _check_token_type_ids(
    token_type_ids: Tensor | None, ids: Tensor, type_vocab_size: int, values: bool | None = True
) -> None:
    """Raise a clear error unless token_type_ids is None or an integer tensor shaped like ids, in
    [0, type_vocab_size), for a model that has token types. `values` as in `check_ids`."""
    if token_type_ids is None:
        return
    if type_vocab_size == 0:
        raise ValueError(
            "token_type_ids given, but this model has no token-type embedding (config.type_vocab_size=0); "
            "pass token_type_ids=None or build the model with type_vocab_size > 0"
        )
    if not isinstance(token_type_ids, Tensor):
        raise TypeError(f"token_type_ids must be an integer tensor, got {type(token_type_ids).__name__}")
    if token_type_ids.dtype.is_floating_point or token_type_ids.dtype.is_complex or token_type_ids.dtype == torch.bool:
        raise TypeError(f"token_type_ids must be an integer tensor, got {token_type_ids.dtype}")
    if token_type_ids.shape != ids.shape:
        raise ValueError(
            f"token_type_ids must have the shape of ids {tuple(ids.shape)}, got {tuple(token_type_ids.shape)}"
        )
    check_ids("token_type_ids", token_type_ids, type_vocab_size, ids.shape[1], values)


class _Model(nn.Module):
    """What the three models share: the config, the output projection (not in `EncoderModel`), the attention
    maps, keep-mask checking, a `load_state_dict` that names what does not fit, and what a checkpoint says of
    the model (set by torch_transformer.hf.load; a model built here has the defaults):

    - generation_rules: the GenerationRules of its generation_config.json, which decoding applies instead of
      our own rule (pad is never generated); None: a model of our own;
    - hf_model_type: the transformers model_type it was read as ("bert", "distilbert", ...), which `hf.save`
      writes back; None: the family is found from the config;
    - hf_config: its config.json, whose fields `hf.save` keeps; {}: none.
    """

    config: TransformerConfig
    decoder: Decoder
    generation_rules: GenerationRules | None
    hf_model_type: str | None
    hf_config: dict
    output_proj: nn.Linear | _OutputBias | None
    decoder_only = False  # the layout of transformer_spec.shapes.parameter_shapes this class holds
    encoder_only = False

    def __init__(self, config: TransformerConfig):
        super().__init__()
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
        self.config = config
        self.generation_rules = None
        self.hf_model_type = None
        self.hf_config = {}

    @classmethod
    def shapes(cls, config: TransformerConfig, buffers: bool = False) -> dict:
        """name -> shape of every parameter this model class holds for `config`, from the config alone (the NumPy
        class's `shapes`); buffers: also the fixed tensors its state dict holds (none here; SpeechTransformer's
        position table)."""
        return parameter_shapes(config, cls.decoder_only, cls.encoder_only)

    def _build_output_proj(self) -> None:
        """output_proj: a Linear (untied), only a bias (tied, with config.output_bias), or nothing at all
        (tied without an output bias, as GPT-2)."""
        c = self.config
        if not c.tie_embeddings:
            self.output_proj = init_linear(nn.Linear(c.d_model, c.tgt_vocab_size, bias=c.output_bias))
        elif c.output_bias:
            self.output_proj = _OutputBias(c.tgt_vocab_size)
        else:
            self.output_proj = None

    def output_logits(self, x: Tensor) -> Tensor:
        """The output projection: x (..., D) -> logits (..., V)."""
        if isinstance(self.output_proj, nn.Linear):  # untied
            weight = self.output_proj.weight
        else:  # tied: the token table
            weight = self.decoder.token_table()
        bias = None if self.output_proj is None else self.output_proj.bias
        if self.config.output_scale != 1.0:  # T5's tied head reads d_model^-0.5 times the hidden states
            x = x * self.config.output_scale
        logits = F.linear(x, weight, bias)  # (..., V)
        cap = self.config.logit_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)  # Gemma's final soft-capping

    def _masks_in_use(
        self, dropout_masks: Mapping[str, Tensor] | None, expected: dict[str, tuple[int, ...]]
    ) -> Mapping[str, Tensor] | None:
        """The keep-masks if they take effect (training with p > 0), after checking them; else None."""
        if dropout_masks is None or not self.training or not self.config.has_dropout:
            return None
        for site, shape in expected.items():
            if site not in dropout_masks:
                raise ValueError(f"dropout_masks: missing site {site!r} (expected a keep-mask of shape {shape})")
            got = tuple(dropout_masks[site].shape)
            if got != shape:
                raise ValueError(f"dropout_masks[{site!r}]: got shape {got}, expected {shape}")
        unknown = sorted(set(dropout_masks) - set(expected))
        if unknown:
            raise ValueError(f"dropout_masks: unknown sites {unknown}; expected exactly {list(expected)}")
        return dropout_masks

    def router_logits(self) -> tuple[Tensor | None, ...]:
        """The router logits (B * T, E) of every mixture-of-experts decoder layer in the last forward, in layer
        order, part of its graph (transformers' router_logits with output_router_logits=True); () for a dense model."""
        moe = (MoeFeedForward, GptOssFeedForward)
        return tuple(layer.ffn.router_logits for layer in self.decoder.layers if isinstance(layer.ffn, moe))

    def load_balancing_loss(self, attention_mask: Tensor | None = None) -> Tensor:
        """The load-balancing loss of the last forward's router logits (transformers' aux_loss), padding left out by
        attention_mask (B, T) when given. A training objective adds config.router_aux_loss_coef times it."""
        logits = self.router_logits()
        if not logits:
            raise ValueError("load_balancing_loss: this model has no mixture-of-experts layer (config.n_experts=0)")
        found = [z for z in logits if z is not None]
        if len(found) < len(logits):
            raise ValueError("load_balancing_loss: no forward pass has been run yet")
        return load_balancing_loss(found, self.config.n_experts, self.config.top_k, attention_mask)

    def attention_maps(self) -> dict[str, Tensor]:
        """Attention probabilities (B, H, T_q, T_k), before dropout, of every attention module, keyed
        by module name ("decoder.layers.0.cross_attn"), from the last forward with need_weights=True."""
        maps = {
            name: module.attn_probs
            for name, module in self.named_modules()
            if isinstance(module, (MultiHeadAttention, LatentAttention)) and module.attn_probs is not None
        }
        if not maps:
            raise RuntimeError("no attention maps recorded: call forward(..., need_weights=True) first")
        return maps

    def load_state_dict(self, state_dict: Mapping, strict: bool = True, assign: bool = False):
        """`nn.Module.load_state_dict`, after checking names and shapes with errors that list them.

        strict=True: missing, unexpected or mis-shaped keys raise ValueError. strict=False: missing
        and unexpected keys are allowed (as in torch), mis-shaped keys still raise ValueError.
        """
        expected = {name: tuple(t.shape) for name, t in self.state_dict().items()}
        missing = [name for name in expected if name not in state_dict]
        unexpected = [name for name in state_dict if name not in expected]
        misshaped = [
            f"{name}: got {tuple(state_dict[name].shape)}, expected {shape}"
            for name, shape in expected.items()
            if name in state_dict and tuple(state_dict[name].shape) != shape
        ]
        problems = []
        if strict and missing:
            problems.append(f"missing keys {missing}")
        if strict and unexpected:
            problems.append(f"unexpected keys {unexpected}")
        if misshaped:
            problems.append(f"mis-shaped keys [{'; '.join(misshaped)}]")
        if problems:
            raise ValueError(f"load_state_dict({type(self).__name__}): " + "; ".join(problems))
        return super().load_state_dict(state_dict, strict=strict, assign=assign)


class Transformer(_Model):
    """The encoder-decoder Transformer of "Attention Is All You Need".

    forward: src_ids (B, S), tgt_ids (B, T) -> logits (B, T, V_tgt). Source padding (`config.pad_id`)
    is masked out of the encoder and of cross-attention; the decoder's self-attention masks only the future.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__(config)
        # With shared embeddings the encoder has no table of its own: it reads decoder.token_embedding.
        self.encoder = Encoder(config, own_token_embedding=not config.share_embeddings)
        self.decoder = Decoder(config, cross_attention=True)
        self._build_output_proj()

    def forward(
        self,
        src_ids: Tensor,
        tgt_ids: Tensor,
        dropout_masks: Mapping[str, Tensor] | None = None,
        need_weights: bool = False,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """src_ids (B, S), tgt_ids (B, T) -> logits (B, T, V_tgt).

        dropout_masks: keep-masks by site name (see `dropout_site_shapes`), used in training mode
        with dropout > 0. need_weights: record attention maps (see `attention_maps`). attention_mask (B, S):
        1/True = a real source token (transformers' meaning): the source keys read, instead of those not holding
        pad_id.

        One graph under `torch.compile(model, fullgraph=True)`, and nothing read back from the device: the
        check that ids lie in [0, V) runs here in eager mode on the CPU only (`check_inputs` runs it anywhere).
        """
        self._check_inputs(src_ids, tgt_ids, values=None)  # ids in [0, V) only in eager mode on the CPU
        attention_mask = check_attention_mask(attention_mask, src_ids)
        masks = self._masks_in_use(dropout_masks, self._site_shapes(src_ids, tgt_ids))
        memory = self.encode(src_ids, need_weights, masks_under(masks, "encoder."), attention_mask)  # (B, S, D)
        memory_mask = source_mask(src_ids, attention_mask, self.config.pad_id)  # (B, 1, 1, S), or None
        x = self.decoder(tgt_ids, memory, memory_mask, need_weights, masks_under(masks, "decoder."))  # (B, T, D)
        return self.output_logits(x)  # (B, T, V)

    def encode(
        self, src_ids: Tensor, need_weights: bool = False, dropout_masks: Mapping | None = None, attention_mask=None
    ) -> Tensor:
        """The encoder's output (B, S, D), reading the decoder's token table when embeddings are shared;
        attention_mask (B, S) bool: the real source tokens, or None (those not holding pad_id)."""
        shared = self.decoder.token_embedding if self.config.share_embeddings else None
        return self.encoder(src_ids, need_weights, dropout_masks, token_embedding=shared, attention_mask=attention_mask)

    def dropout_site_shapes(self, src_ids: Tensor, tgt_ids: Tensor) -> dict[str, tuple[int, ...]]:
        """Site name -> keep-mask shape for every dropout site of this model on these inputs."""
        self._check_inputs(src_ids, tgt_ids, values=None)
        return self._site_shapes(src_ids, tgt_ids)

    def _site_shapes(self, src_ids: Tensor, tgt_ids: Tensor) -> dict[str, tuple[int, ...]]:
        return dropout_site_shapes(
            self.config, batch_size=src_ids.shape[0], tgt_len=tgt_ids.shape[1], src_len=src_ids.shape[1]
        )

    def check_inputs(self, src_ids: Tensor, tgt_ids: Tensor) -> None:
        """Every check of `forward`'s inputs, token ids in [0, V) included, with the errors `forward` raises
        in eager mode on the CPU. `forward` skips the value checks under `torch.compile` and on an
        accelerator (see `values_checked_in_forward`): call this on the batch before it moves there."""
        self._check_inputs(src_ids, tgt_ids, values=True)

    def _check_inputs(self, src_ids: Tensor, tgt_ids: Tensor, values: bool | None) -> None:
        c = self.config
        check_ids("src_ids", src_ids, c.src_vocab_size, c.position_limit, values)
        check_ids("tgt_ids", tgt_ids, c.tgt_vocab_size, c.position_limit, values)
        if src_ids.shape[0] != tgt_ids.shape[0]:
            raise ValueError(
                f"src_ids and tgt_ids must have the same batch size B, got {src_ids.shape[0]} "
                f"(src_ids) and {tgt_ids.shape[0]} (tgt_ids)"
            )


class TransformerLM(_Model):
    """Decoder-only (GPT-style) language model: causal self-attention, no cross-attention.

    Reads `tgt_vocab_size` and `n_decoder_layers` from the config. forward: ids (B, T) -> logits (B, T, V).
    """

    decoder_only = True

    def __init__(self, config: TransformerConfig):
        super().__init__(config)
        self.decoder = Decoder(config, cross_attention=False)
        self._build_output_proj()

    def forward(
        self,
        ids: Tensor,
        attention_mask: Tensor | None = None,
        dropout_masks: Mapping[str, Tensor] | None = None,
        need_weights: bool = False,
    ) -> Tensor:
        """ids (B, T) -> logits (B, T, V). attention_mask (B, T): 1/True = a real token, 0/False = padding
        (transformers' meaning), for a left-padded batch (see `Decoder.forward`); the logits at padded positions
        are of no token. The other arguments as in `Transformer.forward`."""
        self._check_inputs(ids, values=None)  # ids in [0, V) only in eager mode on the CPU
        attention_mask = check_attention_mask(attention_mask, ids)
        masks = self._masks_in_use(dropout_masks, self._site_shapes(ids))
        x = self.decoder(
            ids, need_weights=need_weights, dropout_masks=masks_under(masks, "decoder."), attention_mask=attention_mask
        )  # (B, T, D)
        return self.output_logits(x)  # (B, T, V)

    def dropout_site_shapes(self, ids: Tensor) -> dict[str, tuple[int, ...]]:
        """Site name -> keep-mask shape for every dropout site of this model on these inputs."""
        self._check_inputs(ids, values=None)
        return self._site_shapes(ids)

    def _site_shapes(self, ids: Tensor) -> dict[str, tuple[int, ...]]:
        return dropout_site_shapes(self.config, batch_size=ids.shape[0], tgt_len=ids.shape[1])

    def check_inputs(self, ids: Tensor) -> None:
        """Every check of `forward`'s input, values included: see `Transformer.check_inputs`."""
        self._check_inputs(ids, values=True)

    def _check_inputs(self, ids: Tensor, values: bool | None) -> None:
        check_ids("ids", ids, self.config.tgt_vocab_size, self.config.position_limit, values)


class Pooler(nn.Module):
    """BERT's pooler: dense (D, D), read at the [CLS] position, then tanh (EncoderModel.pool)."""

    def __init__(self, d_model: int):
        super().__init__()
        self.dense = init_linear(nn.Linear(d_model, d_model))


class MlmHead(nn.Module):
    """ModernBERT's masked-LM head: norm(act(dense(hidden))), then the tied token table and (config.output_bias)
    the decoder's bias (EncoderModel.mlm_logits)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        d = config.d_model
        self.dense = init_linear(nn.Linear(d, d, bias=config.bias))
        self.norm = nn.LayerNorm(d, eps=config.layer_norm_eps, bias=config.norm_bias)
        self.bias = nn.Parameter(torch.zeros(config.src_vocab_size)) if config.output_bias else None


class EncoderModel(_Model):
    """Encoder-only (BERT-style) model: the encoder stack and nothing after it.

    Reads `src_vocab_size` and `n_encoder_layers` from the config; state-dict keys are "encoder.*".
    forward: ids (B, T), token_type_ids (B, T) or None (type 0) -> hidden states (B, T, D), after
    final_norm when config.has_final_norm. Keys holding pad_id are masked out, as BERT's attention mask does.
    """

    encoder_only = True

    def __init__(self, config: TransformerConfig):
        super().__init__(config)
        self.encoder = Encoder(config)
        if config.pooler:  # BERT's [CLS] pooler: pool(hidden)
            self.pooler = Pooler(config.d_model)
        if config.mlm_head:  # ModernBERT's masked-LM head: mlm_logits(hidden)
            self.mlm_head = MlmHead(config)

    def mlm_logits(self, hidden: Tensor) -> Tensor:
        """ModernBERT's masked-LM head (config.mlm_head): hidden states (B, T, D) -> logits (B, T, V),
        norm(act(dense(hidden))) through the token table (tied), plus the bias."""
        if not self.config.mlm_head:
            raise ValueError("mlm_logits: this model has no masked-LM head (config.mlm_head=False)")
        if hidden.dim() != 3:
            raise ValueError(f"hidden must have shape (B, T, D), got shape {tuple(hidden.shape)}")
        head = self.mlm_head
        n = head.norm(ACTIVATIONS[self.config.activation](head.dense(hidden)))  # (B, T, D)
        return F.linear(n, self.encoder.token_table(), head.bias)  # (B, T, V)

    def pool(self, hidden: Tensor) -> Tensor:
        """BERT's pooler (config.pooler): hidden states (B, T, D) -> tanh(dense(hidden[:, 0])) (B, D)."""
        if not self.config.pooler:
            raise ValueError("pool: this model has no pooler (config.pooler=False)")
        if hidden.dim() != 3:
            raise ValueError(f"hidden must have shape (B, T, D), got shape {tuple(hidden.shape)}")
        return torch.tanh(self.pooler.dense(hidden[:, 0]))  # (B, D)

    def forward(
        self,
        ids: Tensor,
        token_type_ids: Tensor | None = None,
        dropout_masks: Mapping[str, Tensor] | None = None,
        need_weights: bool = False,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """ids (B, T) -> hidden states (B, T, D). dropout_masks and need_weights as in `Transformer.forward`;
        attention_mask (B, T): 1/True = a real token, the keys read instead of those not holding pad_id."""
        self._check_inputs(ids, token_type_ids, values=None)  # ids in [0, V) only in eager mode on the CPU
        attention_mask = check_attention_mask(attention_mask, ids)
        masks = self._masks_in_use(dropout_masks, self._site_shapes(ids))
        return self.encoder(
            ids, need_weights, masks_under(masks, "encoder."), token_type_ids, attention_mask=attention_mask
        )  # (B, T, D)

    def dropout_site_shapes(self, ids: Tensor) -> dict[str, tuple[int, ...]]:
        """Site name -> keep-mask shape for every dropout site of this model on these inputs."""
        self._check_inputs(ids, None, values=None)
        return self._site_shapes(ids)

    def _site_shapes(self, ids: Tensor) -> dict[str, tuple[int, ...]]:
        return dropout_site_shapes(self.config, batch_size=ids.shape[0], src_len=ids.shape[1])

    def check_inputs(self, ids: Tensor, token_type_ids: Tensor | None = None) -> None:
        """Every check of `forward`'s inputs, values included: see `Transformer.check_inputs`."""
        self._check_inputs(ids, token_type_ids, values=True)

    def _check_inputs(self, ids: Tensor, token_type_ids: Tensor | None, values: bool | None) -> None:
        check_ids("ids", ids, self.config.src_vocab_size, self.config.position_limit, values)
        self.config.check_length("ids", ids.shape[1])
        _check_token_type_ids(token_type_ids, ids, self.config.type_vocab_size, values)
