"""Every parameter of our models by state-dict name and shape, from the config alone: what a checkpoint must hold.
Both sides' models have these names and shapes (the parity suite checks it), so checkpoint files are read and checked
against this one list before either side builds anything.
"""

from __future__ import annotations

from .config import TransformerConfig

Shape = tuple[int, ...]


def parameter_shapes(
    config: TransformerConfig, decoder_only: bool = False, encoder_only: bool = False
) -> dict[str, Shape]:
    """Every state-dict name and its shape, in a fixed order: the Transformer's, the TransformerLM's
    (decoder_only: "decoder.*" and "output_proj.*") or the EncoderModel's (encoder_only: "encoder.*").

    With share_embeddings (and both stacks) the encoder has no token table of its own: it reads
    decoder.token_embedding.weight."""
    if decoder_only and encoder_only:
        raise ValueError("parameter_shapes: a model cannot be both decoder_only and encoder_only")
    shapes = _Shapes(config)
    if not decoder_only:
        own_table = not config.share_embeddings or encoder_only
        shapes.stack("encoder", config.src_vocab_size, config.n_encoder_layers, cross=False, own_table=own_table)
    if encoder_only:
        shapes.encoder_heads()
        return shapes.shapes
    shapes.stack("decoder", config.tgt_vocab_size, config.n_decoder_layers, cross=not decoder_only)
    shapes.output_projection()
    return shapes.shapes


class _Shapes:
    """The list being written, name -> shape in the order the models register their parameters, one method per
    kind of block."""

    def __init__(self, config: TransformerConfig) -> None:
        self.config = config
        self.shapes: dict[str, Shape] = {}

    def linear(self, prefix: str, out_features: int, in_features: int, bias: bool | None = None) -> None:
        """weight (out, in), and bias (out,) when `bias` (None: the config's)."""
        self.shapes[f"{prefix}.weight"] = (out_features, in_features)
        if self.config.bias if bias is None else bias:
            self.shapes[f"{prefix}.bias"] = (out_features,)

    def attention(self, prefix: str) -> None:
        """GPT-OSS's sinks; q, k, v (grouped-query: H_kv * Dh wide) and out projections; Qwen3's and Gemma 3's q_norm
        and k_norm."""
        config, D = self.config, self.config.d_model
        if config.kv_lora_rank is not None and not prefix.endswith("cross_attn"):  # DeepSeek's latent self-attention
            self.latent_attention(prefix)
            return
        width = config.n_heads * config.d_head  # H * Dh: D unless head_dim says otherwise
        kv = config.kv_heads * config.d_head  # width of the key and value projections (grouped-query attention)
        if config.attn_sinks:  # GPT-OSS: one sink logit per head (a module's own parameter: listed before its children)
            self.shapes[f"{prefix}.sinks"] = (config.n_heads,)
        for proj, out_features in (("q_proj", width), ("k_proj", kv), ("v_proj", kv)):
            self.linear(f"{prefix}.{proj}", out_features, D, bias=config.has_qkv_bias)
        self.linear(f"{prefix}.out_proj", D, width)
        if config.qk_norm_projection:  # OLMo 2: RMSNorm of each whole projection, before the head split
            self.shapes[f"{prefix}.q_norm.weight"], self.shapes[f"{prefix}.k_norm.weight"] = (width,), (kv,)
        elif config.qk_norm:  # Qwen3, Gemma 3: RMSNorm of each head's queries and keys, one weight (Dh,) for every head
            self.shapes[f"{prefix}.q_norm.weight"] = self.shapes[f"{prefix}.k_norm.weight"] = (config.d_head,)

    def latent_attention(self, prefix: str) -> None:
        """DeepSeek's MLA (numpy_transformer.latent_attention): the queries' q_proj, or q_a_proj, q_a_norm, q_b_proj;
        kv_a_proj (the latent and the shared rotary key), kv_a_norm, kv_b_proj (every head's keys and values), out_proj;
        no biases."""
        config, D, H = self.config, self.config.d_model, self.config.n_heads
        C, R, Dqk, Dv = config.kv_lora_rank, config.rope_dim, config.d_head, config.value_dim
        assert C is not None
        if config.q_lora_rank is None:
            self.shapes[f"{prefix}.q_proj.weight"] = (H * Dqk, D)
        else:
            self.shapes[f"{prefix}.q_a_proj.weight"] = (config.q_lora_rank, D)
            self.shapes[f"{prefix}.q_a_norm.weight"] = (config.q_lora_rank,)
            self.shapes[f"{prefix}.q_b_proj.weight"] = (H * Dqk, config.q_lora_rank)
        self.shapes[f"{prefix}.kv_a_proj.weight"] = (C + R, D)
        self.shapes[f"{prefix}.kv_a_norm.weight"] = (C,)
        self.shapes[f"{prefix}.kv_b_proj.weight"] = (H * (Dqk - R + Dv), C)
        self.shapes[f"{prefix}.out_proj.weight"] = (D, H * Dv)

    def norm(self, prefix: str, kind: str | None = None) -> None:
        """weight (D,), and bias (D,) for a LayerNorm with norm_bias; `kind` None: the config's norm."""
        D = self.config.d_model
        self.shapes[f"{prefix}.weight"] = (D,)
        if (kind or self.config.norm) == "layer" and self.config.norm_bias:  # RMSNorm has none, nor ModernBERT's
            self.shapes[f"{prefix}.bias"] = (D,)

    def sublayer_norms(self, prefix: str) -> None:
        """The sublayer's norm (none without input_norm: OLMo 2's), and Gemma's second norm of its output
        (sandwich_norm)."""
        if self.config.input_norm:
            self.norm(f"{prefix}_norm")
        if self.config.sandwich_norm:
            self.norm(f"{prefix}_post_norm")

    def embeddings(self, name: str, vocab: int, own_table: bool) -> None:
        """A stack's tables before its layers: tokens (unless shared), learned positions, T5's bias, BERT's token
        types (an encoder's), the embeddings' norm."""
        config, D = self.config, self.config.d_model
        if own_table:
            self.shapes[f"{name}.token_embedding.weight"] = (vocab, D)
        if config.positional == "learned":
            self.shapes[f"{name}.position_embedding.weight"] = (config.max_len, D)
        if config.has_relative_bias:  # T5, MPNet: one bias table per stack, read by every self-attention
            self.shapes[f"{name}.relative_bias.weight"] = (config.relative_buckets, config.n_heads)
        if name == "encoder" and config.type_vocab_size > 0:
            self.shapes[f"{name}.token_type_embedding.weight"] = (config.type_vocab_size, D)
        if config.embedding_norm:
            self.norm(f"{name}.embedding_norm", "layer")  # BERT's and BART's: always a LayerNorm

    def feed_forward(self, layer: str, moe: bool) -> None:
        """A sparse MoE block (router (E, D); the experts' fused gate/up and down) or the dense (gated) one."""
        config, D, F = self.config, self.config.d_model, self.config.d_ff
        if moe and config.expert_kind == "gpt_oss":  # a router with a bias; experts (E, in, out) with biases
            E, F_e = config.n_experts, config.expert_width
            self.shapes[f"{layer}.ffn.router.weight"], self.shapes[f"{layer}.ffn.router.bias"] = (E, D), (E,)
            self.shapes[f"{layer}.ffn.experts.gate_up_proj"] = (E, D, 2 * F_e)  # gate and up columns interleaved
            self.shapes[f"{layer}.ffn.experts.gate_up_proj_bias"] = (E, 2 * F_e)
            self.shapes[f"{layer}.ffn.experts.down_proj"] = (E, F_e, D)
            self.shapes[f"{layer}.ffn.experts.down_proj_bias"] = (E, D)
            return
        if moe:
            E, F_e = config.n_experts, config.expert_width
            self.shapes[f"{layer}.ffn.router.weight"] = (E, D)
            self.shapes[f"{layer}.ffn.experts.gate_up_proj"] = (E, 2 * F_e, D)
            self.shapes[f"{layer}.ffn.experts.down_proj"] = (E, D, F_e)
            if config.router_score_bias:  # DeepSeek-V3's e_score_correction_bias
                self.shapes[f"{layer}.ffn.router.score_bias"] = (E,)
            if config.n_shared_experts:  # DeepSeek's shared experts: one SwiGLU block S * F_e wide
                F_s = config.n_shared_experts * F_e
                self.linear(f"{layer}.ffn.shared.gate", F_s, D, False)
                self.linear(f"{layer}.ffn.shared.linear1", F_s, D, False)
                self.linear(f"{layer}.ffn.shared.linear2", D, F_s, False)
            return
        bias = config.has_ffn_bias
        if config.gated_ffn:
            self.linear(f"{layer}.ffn.gate", F, D, bias)
        self.linear(f"{layer}.ffn.linear1", F, D, bias)
        self.linear(f"{layer}.ffn.linear2", D, F, bias)

    def layer(self, name: str, i: int, cross: bool) -> None:
        """Layer i of stack `name`: self-attention and its norms, cross-attention and its norms, the feed-forward
        and its norms."""
        config, layer = self.config, f"{name}.layers.{i}"
        self.attention(f"{layer}.self_attn")
        if config.input_norm and (i > 0 or config.first_attn_norm or name != "encoder"):  # ModernBERT's first: none
            self.norm(f"{layer}.self_attn_norm")
        if config.sandwich_norm:  # Gemma's second norm, of the sublayer's output
            self.norm(f"{layer}.self_attn_post_norm")
        if cross:
            self.attention(f"{layer}.cross_attn")
            self.sublayer_norms(f"{layer}.cross_attn")
        self.feed_forward(layer, moe=name == "decoder" and config.is_moe_layer(i))
        if not config.shared_norm:  # Phi-2's parallel block: the feed-forward reads the attention's norm
            self.sublayer_norms(f"{layer}.ffn")

    def stack(self, name: str, vocab: int, n_layers: int, cross: bool, own_table: bool = True) -> None:
        """An encoder or decoder stack: its embeddings, its layers, its final norm (config.has_final_norm)."""
        self.embeddings(name, vocab, own_table)
        for i in range(n_layers):
            self.layer(name, i, cross)
        if self.config.has_final_norm:
            self.norm(f"{name}.final_norm")

    def encoder_heads(self) -> None:
        """An EncoderModel's heads: BERT's pooler; ModernBERT's masked-LM head (dense, norm, a bias on the tied
        decoder's logits)."""
        config, D = self.config, self.config.d_model
        if config.pooler:
            self.linear("pooler.dense", D, D, bias=True)
        if config.mlm_head:
            self.linear("mlm_head.dense", D, D)
            self.norm("mlm_head.norm", "layer")
            if config.output_bias:
                self.shapes["mlm_head.bias"] = (config.src_vocab_size,)

    def output_projection(self) -> None:
        """output_proj.weight (V, D) unless tied to the decoder's table; its bias (V,) with output_bias."""
        config = self.config
        if not config.tie_embeddings:
            self.shapes["output_proj.weight"] = (config.tgt_vocab_size, config.d_model)
        if config.output_bias:
            self.shapes["output_proj.bias"] = (config.tgt_vocab_size,)


SPEECH_POSITION_TABLE = "encoder.position_table"  # Whisper's encoder.embed_positions.weight: fixed, a buffer


def speech_parameter_shapes(config: TransformerConfig, buffers: bool = False) -> dict[str, Shape]:
    """The SpeechTransformer's (Whisper's) names and shapes: the two convolutions of its audio front end first, then
    the Transformer's (pre-norm, learned decoder positions) without the encoder's token and position tables and
    without any key bias. buffers: also its fixed position table (S, D), which checkpoints hold."""
    D, M = config.d_model, config.n_mels
    shapes: dict[str, Shape] = {"encoder.conv1.weight": (D, M, 3), "encoder.conv1.bias": (D,)}
    shapes |= {"encoder.conv2.weight": (D, D, 3), "encoder.conv2.bias": (D,)}
    if buffers:
        shapes[SPEECH_POSITION_TABLE] = (config.source_positions, D)
    for name, shape in parameter_shapes(config).items():
        if name.startswith(("encoder.token_embedding.", "encoder.position_embedding.")) or name.endswith("k_proj.bias"):
            continue
        shapes[name] = shape
    return shapes


def check_speech_config(config: TransformerConfig) -> None:
    """What the audio encoder-decoder needs of a TransformerConfig; ValueError naming the field otherwise."""
    for name in ("n_mels", "source_positions"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"a SpeechTransformer needs config.{name} >= 1 (an int), got {value!r}")
    needs = {"norm_first": True, "positional": "learned", "norm": "layer", "share_embeddings": False}
    for name, value in needs.items():
        if getattr(config, name) != value:
            raise ValueError(f"a SpeechTransformer needs config.{name}={value!r}, got {getattr(config, name)!r}")
    if config.d_model % 2 or config.d_model < 4:
        raise ValueError(f"a SpeechTransformer needs an even config.d_model >= 4 (its sinusoids), got {config.d_model}")
