"""Every parameter of our models by state-dict name and shape, from the config alone: what a checkpoint must hold.
Both sides' models have these names and shapes (the parity suite checks it), so checkpoint files are read and checked
against this one list before either side builds anything.
"""

from __future__ import annotations

from .config import TransformerConfig


def parameter_shapes(config: TransformerConfig, decoder_only: bool = False, encoder_only: bool = False) -> dict:
    """Every state-dict name and its shape, in a fixed order: the Transformer's, the TransformerLM's
    (decoder_only: "decoder.*" and "output_proj.*") or the EncoderModel's (encoder_only: "encoder.*").

    With share_embeddings (and both stacks) the encoder has no token table of its own: it reads
    decoder.token_embedding.weight."""
    if decoder_only and encoder_only:
        raise ValueError("parameter_shapes: a model cannot be both decoder_only and encoder_only")
    D, F = config.d_model, config.d_ff
    kv = config.kv_heads * config.d_head  # width of the key and value projections (grouped-query attention)
    shapes = {}

    def linear(prefix, out_features, in_features, bias=config.bias):
        shapes[f"{prefix}.weight"] = (out_features, in_features)
        if bias:
            shapes[f"{prefix}.bias"] = (out_features,)

    def attention(prefix):
        width = config.n_heads * config.d_head  # H * Dh: D unless head_dim says otherwise
        for proj, out_features in (("q_proj", width), ("k_proj", kv), ("v_proj", kv)):
            linear(f"{prefix}.{proj}", out_features, D, bias=config.has_qkv_bias)
        linear(f"{prefix}.out_proj", D, width)
        if config.qk_norm:  # Qwen3, Gemma 3: RMSNorm of each head's queries and keys, one weight (Dh,) for every head
            shapes[f"{prefix}.q_norm.weight"] = shapes[f"{prefix}.k_norm.weight"] = (config.d_head,)

    def norm(prefix, kind=config.norm):
        shapes[f"{prefix}.weight"] = (D,)
        if kind == "layer" and config.norm_bias:  # RMSNorm has no bias, nor ModernBERT's LayerNorm
            shapes[f"{prefix}.bias"] = (D,)

    def sublayer_norms(prefix):  # the sublayer's norm, and Gemma's second norm of its output (sandwich_norm)
        norm(f"{prefix}_norm")
        if config.sandwich_norm:
            norm(f"{prefix}_post_norm")

    def stack(name, vocab, n_layers, cross):
        shared = name == "encoder" and config.share_embeddings and not encoder_only
        if not shared:
            shapes[f"{name}.token_embedding.weight"] = (vocab, D)
        if config.positional == "learned":
            shapes[f"{name}.position_embedding.weight"] = (config.max_len, D)
        if config.has_relative_bias:  # T5, MPNet: one bias table per stack, read by every self-attention
            shapes[f"{name}.relative_bias.weight"] = (config.relative_buckets, config.n_heads)
        if name == "encoder" and config.type_vocab_size > 0:
            shapes[f"{name}.token_type_embedding.weight"] = (config.type_vocab_size, D)
        if config.embedding_norm:
            norm(f"{name}.embedding_norm", "layer")  # BERT's and BART's: always a LayerNorm
        for i in range(n_layers):
            layer = f"{name}.layers.{i}"
            attention(f"{layer}.self_attn")
            if i > 0 or config.first_attn_norm or name != "encoder":  # ModernBERT's first layer has none
                norm(f"{layer}.self_attn_norm")
            if config.sandwich_norm:  # Gemma's second norm, of the sublayer's output
                norm(f"{layer}.self_attn_post_norm")
            if cross:
                attention(f"{layer}.cross_attn")
                sublayer_norms(f"{layer}.cross_attn")
            if name == "decoder" and config.is_moe_layer(i):  # router (E, D); experts' fused gate/up and down
                E, F_e = config.n_experts, config.expert_width
                shapes[f"{layer}.ffn.router.weight"] = (E, D)
                shapes[f"{layer}.ffn.experts.gate_up_proj"] = (E, 2 * F_e, D)
                shapes[f"{layer}.ffn.experts.down_proj"] = (E, D, F_e)
            else:
                if config.gated_ffn:
                    linear(f"{layer}.ffn.gate", F, D)
                linear(f"{layer}.ffn.linear1", F, D)
                linear(f"{layer}.ffn.linear2", D, F)
            sublayer_norms(f"{layer}.ffn")
        if config.norm_first:
            norm(f"{name}.final_norm")

    if not decoder_only:
        stack("encoder", config.src_vocab_size, config.n_encoder_layers, cross=False)
    if encoder_only:
        if config.pooler:
            linear("pooler.dense", D, D, bias=True)
        if config.mlm_head:  # ModernBERT's: dense, norm, and a bias on the tied decoder's logits
            linear("mlm_head.dense", D, D)
            norm("mlm_head.norm", "layer")
            if config.output_bias:
                shapes["mlm_head.bias"] = (config.src_vocab_size,)
        return shapes
    stack("decoder", config.tgt_vocab_size, config.n_decoder_layers, cross=not decoder_only)
    if not config.tie_embeddings:
        shapes["output_proj.weight"] = (config.tgt_vocab_size, D)
    if config.output_bias:
        shapes["output_proj.bias"] = (config.tgt_vocab_size,)
    return shapes
