"""The configuration shared by both implementations.

`numpy_transformer` and `torch_transformer` both import this module (it imports neither), so one
config object describes one model on either side.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "quick_gelu")
POSITIONALS = ("sinusoidal", "learned", "rope", "alibi", "relative")
NORMS = ("layer", "rms", "rms_offset")
DROPOUT_KINDS = ("embedding", "attention", "activation", "residual")  # the config's {kind}_dropout fields
SINUSOID_LAYOUTS = ("interleaved", "split")
ATTENTIONS = ("plain", "flash")
LAYER_TYPES = ("full_attention", "sliding_attention")  # transformers' names for a layer's kind of self-attention
ROPE_TYPES = ("linear", "dynamic", "yarn", "longrope", "llama3")  # RopeScaling.rope_type: transformers' scaled kinds
# TransformerConfig.expert_kind: Mixtral's SwiGLU experts and softmax-then-top-k router, or GPT-OSS's (see the field)
EXPERT_KINDS = ("swiglu", "gpt_oss")
# the config's switches, each a bool (pooler and qkv_bias are checked on their own, qkv_bias may be None)
BOOL_FIELDS = (
    "norm_first",
    "tie_embeddings",
    "scale_embeddings",
    "gated_ffn",
    "bias",
    "output_bias",
    "embedding_norm",
    "share_embeddings",
    "embedding_padding_idx",
    "parallel_residual",
    "shared_norm",
    "qk_norm",
    "sandwich_norm",
    "input_norm",
    "qk_norm_projection",
    "positions_after_pad",
    "relative_bias",
    "norm_bias",
    "first_attn_norm",
    "mlm_head",
    "attention_scale_by_layer",
    "rope_cache_remade",
    "attn_sinks",
)


# the fields each kind of RopeScaling needs (yarn's factor may be left out: max_len / original)
ROPE_NEEDS = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": (),
    "longrope": ("short_factor", "long_factor"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
}


@dataclass(frozen=True)
class RopeScaling:
    """A scaled RoPE: what changes in the inverse frequencies :math:`\\theta_i = \\mathrm{base}^{-2i/R}` and the
    factor on cos and sin (the fields are transformers' names for them). None in a field: transformers' default
    applies (original_max_position_embeddings None is max_len). The math only: how a config.json spells it
    (`rope_scaling` or `rope_parameters`, `rope_type` or the older `type`, Phi-3's "su") is read and written by the
    families (transformer_spec.families.rope), and whether decoding makes a LongRoPE cache again is the model's
    (TransformerConfig.rope_cache_remade).

    - "linear": every frequency divided by `factor` (positions squeezed: t / factor);
    - "dynamic": NTK-aware: for a sequence of T > max_len positions the base grows to
      base (factor T / max_len - (factor - 1))^(R / (R - 2)); unchanged up to max_len;
    - "yarn": low frequencies divided by `factor`, high ones kept, a linear ramp between (beta_fast, beta_slow
      rotations over original_max_position_embeddings); cos and sin times attention_factor (by default
      0.1 ln(factor) + 1, or the ratio of the mscale and mscale_all_dim versions);
    - "longrope": frequency i divided by short_factor[i], or long_factor[i] for a sequence longer than
      original_max_position_embeddings; cos and sin times attention_factor (by default
      sqrt(1 + ln(factor) / ln(original)), factor max_len / original when absent);
    - "llama3": wavelengths above original / low_freq_factor divided by `factor`, below original / high_freq_factor
      kept, a smooth blend between."""

    rope_type: str
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None  # llama3
    high_freq_factor: float | None = None  # llama3
    beta_fast: float | None = None  # yarn (None: 32)
    beta_slow: float | None = None  # yarn (None: 1)
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    truncate: bool | None = None  # yarn: floor/ceil the ramp's ends (None: True)
    attention_factor: float | None = None  # yarn, longrope: the factor on cos and sin (None: derived, above)
    short_factor: tuple[float, ...] | None = None  # longrope: one divisor per frequency (R/2 of them)
    long_factor: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        """The kind known, each field it needs present, every factor positive."""
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_scaling.rope_type must be one of {ROPE_TYPES}, got {self.rope_type!r}")
        for name in ("short_factor", "long_factor"):
            if isinstance(getattr(self, name), list):  # a checkpoint's JSON metadata holds the tuple as a list
                object.__setattr__(self, name, tuple(getattr(self, name)))
        missing = [name for name in ROPE_NEEDS[self.rope_type] if getattr(self, name) is None]
        if missing:
            raise ValueError(f"rope_scaling of rope_type {self.rope_type!r} needs {missing}")
        self._check_values()

    def _check_values(self) -> None:
        for name in ("factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "attention_factor"):
            value = getattr(self, name)
            if value is not None and not _is_positive_float(value):
                raise ValueError(f"rope_scaling.{name} must be a positive float, got {value!r}")
        for name in ("short_factor", "long_factor"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, tuple) or not all(map(_is_positive_float, value))):
                raise ValueError(f"rope_scaling.{name} must be a tuple of positive floats, got {short_repr(value)}")
        if self.original_max_position_embeddings is not None:
            _check_int("rope_scaling.original_max_position_embeddings", self.original_max_position_embeddings, 1)
        if self.rope_type == "llama3" and self.high_freq_factor == self.low_freq_factor:
            raise ValueError(
                f"rope_scaling: llama3 needs high_freq_factor != low_freq_factor, both {self.low_freq_factor}"
            )

    @property
    def depends_on_length(self) -> bool:
        """Whether the frequencies depend on the sequence's length (dynamic NTK, LongRoPE's two factor lists): only
        then must the length be known where they are computed (torch reads it from the positions, on the host)."""
        return self.rope_type in ("dynamic", "longrope")

    def original_length(self, max_len: int) -> int:
        """original_max_position_embeddings, or max_len (max_position_embeddings) when absent, as transformers."""
        return max_len if self.original_max_position_embeddings is None else self.original_max_position_embeddings

    def length_factor(self, max_len: int) -> float:
        """`factor`, or (yarn, longrope without one) max_len / original_max_position_embeddings."""
        return max_len / self.original_length(max_len) if self.factor is None else self.factor


@dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of the three model families: the encoder-decoder `Transformer`, the decoder-only
    `TransformerLM` and the encoder-only `EncoderModel`.

    The defaults are a small model that trains in seconds on a CPU; the paper's base model is
    `TransformerConfig(d_model=512, n_heads=8, d_ff=2048, n_encoder_layers=6, n_decoder_layers=6,
    dropout=0.1, scale_embeddings=True, tie_embeddings=True)`. The fields after `scale_embeddings`
    describe the models that came after the paper (BERT, GPT-2, Llama, Marian, BART); their defaults
    keep the paper's model.
    """

    src_vocab_size: int = 32  # source token ids are in [0, src_vocab_size)
    tgt_vocab_size: int = 32  # target ids; also the LM's vocabulary
    d_model: int = 32  # width D of every residual stream
    n_heads: int = 4  # H; each head has width Dh = head_dim, or d_model // n_heads when that is None
    d_ff: int = 64  # hidden width F of the position-wise feed-forward block
    n_encoder_layers: int = 2
    n_decoder_layers: int = 2
    dropout: float = 0.0  # the one-number shorthand: the rate of every dropout site below left at None
    # "relu" (the paper), "gelu" (exact, erf), "gelu_tanh", "silu" (x * sigmoid(x)), "quick_gelu" (x * sigmoid(1.702 x))
    activation: str = "relu"
    norm_first: bool = False  # False: the paper's post-norm LN(x + f(x)); True: pre-norm x + f(LN(x))
    # a norm after each stack's last layer, {stack}.final_norm.*: None: as norm_first (pre-norm stacks end with one,
    # post-norm ones do not); True / False: said outright (nn.TransformerEncoder(norm=LayerNorm) over post-norm
    # layers has one). Read through `has_final_norm`
    final_norm: bool | None = None
    # "sinusoidal" (the paper), "learned", "rope" (rotary, in attention), "alibi" (a per-head linear bias on
    # the scores, BLOOM's) or "relative" (T5's learned bias per bucket of distance, one table per stack,
    # {stack}.relative_bias.weight (relative_buckets, H)); the last three add no position table to the embeddings
    positional: str = "sinusoidal"
    max_len: int = 64  # longest sequence the position table covers
    layer_norm_eps: float = 1e-5  # inside the square root, as torch.nn.LayerNorm
    pad_id: int | None = 0  # keys holding pad_id are masked out of attention; None: no padding token (GPT-2)
    bos_id: int | None = 1  # the decoder's start token in decoding (a Transformer's); None: the vocabulary has none
    # decoding stops after it; a tuple: after any of them (Llama 3 lists several); None: the vocabulary has none,
    # decoding runs to max_len
    eos_id: int | tuple[int, ...] | None = 2
    tie_embeddings: bool = False  # output projection reuses decoder.token_embedding.weight
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model), as in the paper
    # -- after the paper ----------------------------------------------------------------------
    # "layer" (LayerNorm), "rms" (RMSNorm: x / sqrt(mean(x^2) + eps) * weight, no bias) or "rms_offset" (Gemma's
    # RMSNorm: the gain is 1 + weight); q_norm and k_norm (qk_norm) take the same kind
    norm: str = "layer"
    rope_theta: float = 10000.0  # rotary base, when positional == "rope"
    # partial rotary (GPT-NeoX's rotary_pct, Phi-3's partial_rotary_factor): RoPE turns the first rotary_dim
    # features of each head and passes the rest through; None: all Dh of them
    rotary_dim: int | None = None
    # GPT-NeoX's parallel residual (pre-norm, decoder): x + Attn(Norm1(x)) + FFN(Norm2(x)), both read the layer's
    # input; False: the sequential x = x + Attn(Norm1(x)); x = x + FFN(Norm2(x))
    parallel_residual: bool = False
    # Phi-2's parallel block (GPT-J's, Falcon's): with parallel_residual, the feed-forward reads the attention's norm,
    # x + Attn(Norm(x)) + FFN(Norm(x)): one norm a layer (self_attn_norm), no ffn_norm
    shared_norm: bool = False
    # Qwen3's q_norm and k_norm: RMSNorm (eps layer_norm_eps, weight (Dh,) shared by the heads) of each head's
    # queries and keys, before RoPE: {attn}.q_norm.weight, {attn}.k_norm.weight in every attention block
    qk_norm: bool = False
    # OLMo 2's q_norm and k_norm (with qk_norm): one RMSNorm over each whole projection, before the head split and
    # RoPE: {attn}.q_norm.weight (H*Dh,), {attn}.k_norm.weight (H_kv*Dh,); False: per head, weight (Dh,)
    qk_norm_projection: bool = False
    gated_ffn: bool = False  # y = linear2(act(gate(x)) * linear1(x)), as Llama's SwiGLU
    n_kv_heads: int | None = None  # grouped-query attention: K/V heads, each serving n_heads / n_kv_heads
    bias: bool = True  # biases in the attention and feed-forward linears (Llama has none)
    qkv_bias: bool | None = None  # biases on the q, k, v projections (None: as `bias`); Qwen2: bias False, this True
    # biases on the feed-forward's linears (None: as `bias`): Llama's mlp_bias apart from its attention_bias (Llama
    # conversions of other families: attention_bias true, mlp_bias false), Qwen3's attention_bias (no MLP bias)
    ffn_bias: bool | None = None
    # causal self-attention sees only the last `sliding_window` keys: query i attends to keys i - window < j <= i
    # (Mistral); None: every earlier key. Without layer_types it applies to every decoder layer; with it, to the
    # "sliding_attention" layers of either stack (in an encoder bidirectional: |i - j| <= window // 2, ModernBERT's)
    sliding_window: int | None = None
    # each layer's self-attention, transformers' layer_types: "full_attention" or "sliding_attention" (the window
    # above); one entry per layer of each stack the model has (a Transformer's two stacks share the list);
    # None: every layer alike (the window, when set, on every decoder layer)
    layer_types: tuple[str, ...] | None = None
    # each decoder layer's positions, SmolLM3's no_rope_layers: True, the layer turns its queries and keys by RoPE;
    # False, the layer has no positions at all (NoPE: causal attention alone orders it); None: every layer rotary.
    # One entry per layer of each stack the model has (a Transformer's two stacks share the list, as layer_types).
    # Read through `layer_uses_rope`; only beside positional "rope"
    rope_layers: tuple[bool, ...] | None = None
    # the rotary base of the "sliding_attention" layers (Gemma 3's rope_local_base_freq, ModernBERT's
    # local_rope_theta); None: rope_theta, as the full layers
    rope_local_theta: float | None = None
    # a scaled RoPE (RopeScaling: transformers' linear, dynamic, yarn, longrope, llama3), on every layer that reads
    # rope_theta (not on the layers with a base of their own, rope_local_theta: Gemma 3's local layers); None: plain
    rope_scaling: RopeScaling | None = None
    # the scaled RoPE of the layers with a base of their own (rope_local_theta: Gemma 3's and ModernBERT's local
    # layers, which transformers scales from their own RoPE object); None: plain
    rope_local_scaling: RopeScaling | None = None
    # decoding beside a LongRoPE rope_scaling, at the step the sequence first outgrows original_max_position_embeddings
    # (every cached key was turned with the short factors): True, the cache is made again from the whole prefix
    # (Phi-3's generate(), and the default: the cache then equals a full forward); False, it is kept (transformers'
    # generic generate(): the Llama, GPT-NeoX and Gemma 3 families read False from a LongRoPE file). See cache_outgrown
    rope_cache_remade: bool = True
    relative_buckets: int = 32  # positional "relative": buckets of distance (half per direction in an encoder)
    relative_max_distance: int = 128  # positional "relative": distances from here on share the last bucket
    attention_scale: float | None = None  # the factor on q . k: None is 1 / sqrt(d_head); T5 uses 1.0
    # layer i's factor on q . k is attention_scale / (i + 1) (GPT-2's scale_attn_by_inverse_layer_idx, the Stanford
    # CRFM runs), in every self-attention of either stack
    attention_scale_by_layer: bool = False
    # Dh, each head's width, when it is not d_model // n_heads (Qwen3, Gemma): q_proj (H*Dh, D), k_proj and v_proj
    # (H_kv*Dh, D), out_proj (D, H*Dh); None: d_model // n_heads. The resolved width is `d_head`.
    head_dim: int | None = None
    output_scale: float = 1.0  # the final hidden states are multiplied by this before the output projection (T5's
    # tied head: d_model ** -0.5)
    output_bias: bool = True  # output_proj.bias (GPT-2 and Llama have none; Marian/BART's final_logits_bias)
    type_vocab_size: int = 0  # BERT token types: encoder.token_type_embedding.weight (type_vocab_size, D)
    embedding_norm: bool = False  # a LayerNorm after the summed embeddings (BERT, BART)
    sinusoid_layout: str = "interleaved"  # "interleaved" (the paper: sin even, cos odd) or "split" (Marian)
    share_embeddings: bool = False  # encoder and decoder read one table, decoder.token_embedding.weight
    attention: str = "plain"  # "plain" (the (T_q, T_k) pair) or "flash" (tiled, online softmax; no dropout)
    # lookups of pad_id pass no gradient to the token tables, as nn.Embedding(padding_idx=pad_id) (Marian)
    embedding_padding_idx: bool = False
    # EncoderModel: BERT's [CLS] pooler, pooled = tanh(h[:, 0] W^T + b) (pool / pool_backward), pooler.dense.*
    pooler: bool = False
    # Gemma's sandwich (pre-norm only): each sublayer's output is normalised too before it joins the stream,
    # x + Norm_post(f(Norm(x))), the second norm {name}_post_norm.* of the layer
    sandwich_norm: bool = False
    # the norm before each sublayer ({name}_norm); False (OLMo 2's, with sandwich_norm): the sublayers read the stream
    # itself and only their outputs are normalised, x + Norm_post(f(x)): no {name}_norm, only {name}_post_norm
    input_norm: bool = True
    # Gemma's final logit soft-capping: logits = cap * tanh(z / cap) of the projection's z; None: the plain z
    logit_softcap: float | None = None
    # Gemma 2's attention soft-capping: every attention score s = c q.k (+ bias) becomes cap * tanh(s / cap) before
    # the mask and the softmax (transformers' attn_logit_softcapping); None: the plain scores
    attn_softcap: float | None = None
    # RoBERTa's learned positions (an encoder's): a real token sits at pad_id + the count of real (not pad_id) tokens
    # up to and including it, a pad_id token at pad_id, whose row of the table takes no gradient (transformers'
    # create_position_ids_from_input_ids); the longest input is then max_len - pad_id - 1 (`longest_input`). An
    # EncoderModel's only (the Transformer and TransformerLM refuse it)
    positions_after_pad: bool = False
    # T5's bucketed bias on the self-attention scores ({stack}.relative_bias.weight, relative_buckets and
    # relative_max_distance as for positional "relative") beside another positional: MPNet's learned positions and
    # a bias table shared by every layer
    relative_bias: bool = False
    # EncoderModel: ModernBERT's masked-LM head, logits = LN(act(h W^T [+ b_W])) E^T [+ b] with E the token table
    # (mlm_logits / mlm_logits_backward): mlm_head.dense.* (its bias: `bias`), mlm_head.norm.*, mlm_head.bias (V,)
    # (output_bias)
    mlm_head: bool = False
    norm_bias: bool = True  # LayerNorms with a bias (False: weight only, every LayerNorm of the model: ModernBERT)
    # the first encoder layer's self-attention norm (False: none, its input is the embeddings as they are: ModernBERT)
    first_attn_norm: bool = True
    # -- mixture of experts (Mixtral, Qwen3-MoE): the decoder's feed-forward blocks are sparse MoE blocks (a router
    # picks top_k of n_experts SwiGLU experts per token; numpy_transformer.moe), state-dict names ffn.router.weight
    # (E, D), ffn.experts.gate_up_proj (E, 2 F_e, D), ffn.experts.down_proj (E, D, F_e) -----------------------------
    n_experts: int = 0  # E; 0: every feed-forward block is dense
    top_k: int = 2  # experts run per token (transformers' num_experts_per_tok)
    norm_topk_prob: bool = True  # renormalise the k chosen probabilities to sum to 1 (Mixtral; Qwen3-MoE's flag)
    d_expert: int | None = None  # F_e, an expert's hidden width; None: d_ff
    dense_layers: tuple[int, ...] = ()  # decoder layers that keep the dense feed-forward (Qwen3-MoE's mlp_only_layers)
    router_aux_loss_coef: float = 0.0  # the checkpoint's weight of the load-balancing loss (read by the training loop)
    # the experts' and router's kind: "swiglu" (Mixtral's, above) or "gpt_oss" (GPT-OSS's: a router with a bias whose
    # top-k logits are softmaxed, experts with biases, their gate and up columns interleaved in gate_up_proj (E, D, 2F)
    # and a clamped SwiGLU (up + 1) * g sigmoid(alpha g), g = min(gate, limit), up clamped to [-limit, limit];
    # ffn.router.{weight,bias}, ffn.experts.{gate_up_proj,gate_up_proj_bias,down_proj,down_proj_bias};
    # numpy_transformer.gpt_oss_moe)
    expert_kind: str = "swiglu"
    swiglu_limit: float = 7.0  # "gpt_oss" experts: the clamp of the gate (above) and the up projection (both sides)
    swiglu_alpha: float = 1.702  # "gpt_oss" experts: the sigmoid's gain
    # GPT-OSS's attention sinks: each attention has a learned logit per head ({attn}.sinks (H,)) that joins every
    # softmax's denominator, taking probability mass but adding no value (numpy_transformer.sinks)
    attn_sinks: bool = False
    # -- DeepSeek (V2, V3): multi-head latent attention (numpy_transformer.latent_attention) and its routing
    # (numpy_transformer.deepseek_moe) -----------------------------------------------------------------------------
    # MLA: every head's keys and values from one latent of kv_lora_rank features per token (self_attn.kv_a_proj ->
    # kv_a_norm -> kv_b_proj), beside a rotary key part shared by the heads; head_dim is then the query/key head's
    # width (qk_nope_head_dim + qk_rope_head_dim) and rotary_dim its rotary part (its last rotary_dim features,
    # turned in interleaved pairs); the decoding cache holds the latent and the rotary key. None: ordinary attention
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None  # MLA's queries through q_a_proj (R_q, D) -> q_a_norm -> q_b_proj; None: q_proj
    v_head_dim: int | None = None  # MLA's value head width (None: head_dim)
    router_scoring: str = "softmax"  # DeepSeek's router: "softmax" (V2) or "sigmoid" (V3) scores of the experts
    router_score_bias: bool = False  # V3's e_score_correction_bias (E,), ffn.router.score_bias: chooses, never weighs
    router_groups: int = 1  # V3's n_group: experts in groups, the choice limited to the router_topk_groups best
    router_topk_groups: int = 1  # V3's topk_group
    routed_scaling: float = 1.0  # routed_scaling_factor: the routed experts' weights times this
    n_shared_experts: int = 0  # shared experts, one SwiGLU block n_shared_experts * d_expert wide (ffn.shared.*)
    # -- dropout by site (None: `dropout`); real models name their own (GPT-2: embd_pdrop, attn_pdrop, resid_pdrop;
    # Marian and BART: dropout, attention_dropout, activation_dropout) -------------------------------------------
    embedding_dropout: float | None = None  # after the summed embeddings (and their norm)
    attention_dropout: float | None = None  # on the attention probabilities
    activation_dropout: float | None = None  # on the feed-forward's hidden activation
    residual_dropout: float | None = None  # on each sublayer's output, before it joins the residual stream
    # -- Whisper's audio front end (numpy_transformer.audio.SpeechTransformer; 0: none, the token table) -----------
    n_mels: int = 0  # mel bins of the input features (B, n_mels, 2 * source_positions): conv1's input channels
    source_positions: int = 0  # the encoder's positions (max_source_positions), its sinusoid table's rows

    def __post_init__(self) -> None:
        """Validate every field, one group of fields at a time: TypeError for a wrong type, ValueError for a value
        out of range or fields that contradict each other, each naming the field, what it got and what it needs."""
        for check in (
            self._check_sizes,
            self._check_heads,
            self._check_choices,
            self._check_dropout_rates,
            self._check_positions,
            self._check_windows,
            self._check_scales,
            self._check_flags,
            self._check_layer_layout,
            self._check_embeddings,
            self._check_experts,
            self._check_gpt_oss,
            self._check_latent,
            self._check_router,
            self._check_special_tokens,
        ):
            check()

    def _check_sizes(self) -> None:
        """Vocabularies, widths and max_len: ints >= 1; layer counts and type_vocab_size: ints >= 0."""
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff", "max_len"):
            _check_int(name, getattr(self, name), minimum=1)
        for name in ("n_encoder_layers", "n_decoder_layers", "type_vocab_size"):
            _check_int(name, getattr(self, name), minimum=0)

    def _check_heads(self) -> None:
        """Dh: head_dim >= 1, or d_model divisible by n_heads; n_kv_heads divides n_heads."""
        if self.head_dim is not None:
            _check_int("head_dim", self.head_dim, minimum=1)
        elif self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model must be divisible by n_heads: got d_model={self.d_model}, "
                f"n_heads={self.n_heads} (d_model % n_heads = {self.d_model % self.n_heads}, expected 0), "
                "or head_dim set"
            )
        if self.n_kv_heads is not None:
            _check_int("n_kv_heads", self.n_kv_heads, minimum=1)
            if self.n_heads % self.n_kv_heads != 0:
                raise ValueError(
                    f"n_heads must be a multiple of n_kv_heads (each K/V head serves n_heads / n_kv_heads query "
                    f"heads): got n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}"
                )

    def _check_choices(self) -> None:
        """The fields that name a variant: one of the names this module lists."""
        for name, allowed in (
            ("activation", ACTIVATIONS),
            ("positional", POSITIONALS),
            ("norm", NORMS),
            ("sinusoid_layout", SINUSOID_LAYOUTS),
            ("attention", ATTENTIONS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")

    def _check_dropout_rates(self) -> None:
        """dropout and each site's rate (None: `dropout`) in [0, 1); flash attention has no attention dropout."""
        for name in ("dropout", *(f"{kind}_dropout" for kind in DROPOUT_KINDS)):
            value = getattr(self, name)
            if value is None and name != "dropout":
                continue  # the site takes `dropout`
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a float, got {type(value).__name__}")
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value}")
        if self.attention == "flash" and self.dropout_rates["attention"] != 0.0:
            raise ValueError(
                "attention='flash' has no attention dropout: set attention_dropout=0.0 (or dropout=0.0), got "
                f"{self.dropout_rates['attention']}"
            )

    def _check_positions(self) -> None:
        """RoPE turns pairs of features (an even head, an even rotary_dim <= Dh) at a positive base; T5's buckets:
        relative_buckets >= 2, relative_max_distance >= 1."""
        if self.positional == "rope" and self.d_head % 2 != 0:
            raise ValueError(
                "positional='rope' rotates pairs of features, so the head size (head_dim, or d_model / n_heads) "
                "must be even: got "
                + (f"{self.d_model} / {self.n_heads} = {self.d_head}" if self.head_dim is None else f"{self.head_dim}")
            )
        if self.rotary_dim is not None:
            _check_int("rotary_dim", self.rotary_dim, minimum=2)
            if self.rotary_dim % 2 or self.rotary_dim > self.d_head:
                raise ValueError(
                    f"rotary_dim rotates pairs of a head's features: it must be even and at most the head size "
                    f"{self.d_head}, got {self.rotary_dim}"
                )
        if not _is_positive_float(self.rope_theta):
            raise ValueError(f"rope_theta must be a positive float, got {self.rope_theta!r}")
        self._check_rope_scaling()
        _check_int("relative_buckets", self.relative_buckets, minimum=2)
        _check_int("relative_max_distance", self.relative_max_distance, minimum=1)

    def _without_legacy_spelling(self, field_name: str, scaling: dict) -> dict:
        """A checkpoint's JSON metadata written before RopeScaling held the math only: its config.json spelling
        (written_as, type_key) dropped, its remake_cache moved to rope_cache_remade (the global scaling's)."""
        own = {name: value for name, value in scaling.items() if name not in ("written_as", "type_key", "remake_cache")}
        if field_name == "rope_scaling" and scaling.get("remake_cache") is False:
            object.__setattr__(self, "rope_cache_remade", False)
        return own

    def _check_rope_scaling(self) -> None:
        """rope_scaling and rope_local_scaling: None or a RopeScaling (a dict, from a checkpoint's JSON metadata, is
        read as one) on rotary positions; longrope's factors: one per frequency, R/2; rope_local_scaling only on
        layers with a base of their own (rope_local_theta)."""
        for field_name in ("rope_scaling", "rope_local_scaling"):
            scaling = getattr(self, field_name)
            if isinstance(scaling, dict):
                scaling = RopeScaling(**self._without_legacy_spelling(field_name, scaling))
                object.__setattr__(self, field_name, scaling)
            if scaling is None:
                continue
            if not isinstance(scaling, RopeScaling):
                raise TypeError(f"{field_name} must be a RopeScaling or None, got {type(scaling).__name__}")
            if self.positional != "rope":
                raise ValueError(
                    f"{field_name} scales rotary positions: it needs positional='rope', got {self.positional!r}"
                )
            for name in ("short_factor", "long_factor"):
                value = getattr(scaling, name)
                if value is not None and len(value) != self.rope_dim // 2:
                    raise ValueError(
                        f"{field_name}.{name} needs one factor per rotary frequency, rope_dim / 2 = "
                        f"{self.rope_dim // 2}, got {len(value)}"
                    )
        if self.rope_local_scaling is not None and self.rope_local_theta is None:
            raise ValueError(
                "rope_local_scaling scales the layers with a base of their own: it needs rope_local_theta, got None"
            )

    def _check_windows(self) -> None:
        """sliding_window >= 1 or None, layer_types (one kind per layer), rope_local_theta positive or None."""
        if self.sliding_window is not None:
            _check_int("sliding_window", self.sliding_window, minimum=1)
        self._check_layer_types()
        self._check_rope_layers()
        if self.rope_local_theta is not None and not _is_positive_float(self.rope_local_theta):
            raise ValueError(f"rope_local_theta must be a positive float or None, got {self.rope_local_theta!r}")

    def _check_scales(self) -> None:
        """The factors and the norm's epsilon: positive floats (attention_scale and the soft caps may be None)."""
        for name in ("attention_scale", "output_scale", "logit_softcap", "attn_softcap"):
            value = getattr(self, name)
            if value is None and name in ("attention_scale", "logit_softcap", "attn_softcap"):
                continue
            if not _is_positive_float(value):
                raise ValueError(f"{name} must be a positive float, got {value!r}")
            if name.endswith("softcap") and not math.isfinite(value):  # cap * tanh(s / cap) is NaN for an inf cap
                raise ValueError(f"{name} must be a finite positive float, got {value!r}")
        if not (isinstance(self.layer_norm_eps, (int, float)) and self.layer_norm_eps > 0):
            raise ValueError(f"layer_norm_eps must be a positive float, got {self.layer_norm_eps!r}")

    def _check_flags(self) -> None:
        """The switches: bools (qkv_bias and final_norm: a bool or None)."""
        if not isinstance(self.pooler, bool):
            raise TypeError(f"pooler must be a bool, got {type(self.pooler).__name__}")
        for name in ("qkv_bias", "ffn_bias", "final_norm"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool or None, got {type(getattr(self, name)).__name__}")
        for name in BOOL_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")

    def _check_layer_layout(self) -> None:
        """The pre-norm layouts (parallel residual, no first attention norm, Gemma's sandwich) need norm_first;
        the sandwich and the parallel residual exclude each other."""
        if self.parallel_residual and self.norm_first is not True:
            raise ValueError(
                f"parallel_residual=True is a pre-norm layer: it needs norm_first=True, got {self.norm_first!r}"
            )
        if self.first_attn_norm is False and not self.norm_first:
            raise ValueError(
                "first_attn_norm=False leaves out a pre-norm (the first encoder layer's self-attention norm): it "
                "needs norm_first=True, got norm_first=False"
            )
        if self.sandwich_norm and not self.norm_first:
            raise ValueError(
                "sandwich_norm=True needs norm_first=True (Gemma's pre- and post-norm), got norm_first=False"
            )
        if self.shared_norm and not self.parallel_residual:
            raise ValueError(
                "shared_norm=True is the parallel block's one norm (Phi-2's): it needs parallel_residual=True, got "
                "False"
            )
        if not self.input_norm and not self.sandwich_norm:
            raise ValueError(
                "input_norm=False leaves each sublayer only the norm of its output (OLMo 2's): it needs "
                "sandwich_norm=True, got sandwich_norm=False"
            )
        if self.qk_norm_projection and not self.qk_norm:
            raise ValueError("qk_norm_projection=True says how the q/k norms read: it needs qk_norm=True, got False")
        if self.sandwich_norm and self.parallel_residual:
            raise ValueError("sandwich_norm=True and parallel_residual=True: no layer has both; set one of them False")

    def _check_embeddings(self) -> None:
        """One vocabulary for shared tables; RoBERTa's positions after pad_id need learned positions and room in
        the table; relative_bias sits beside another positional."""
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                f"share_embeddings needs one vocabulary: got src_vocab_size={self.src_vocab_size}, "
                f"tgt_vocab_size={self.tgt_vocab_size}"
            )
        if self.positions_after_pad:
            wrong = [] if self.positional == "learned" else [f"positional={self.positional!r} (needs 'learned')"]
            if self.pad_id is None or self.pad_id + 1 >= self.max_len:
                wrong.append(f"pad_id={self.pad_id!r} (needs a token id below max_len - 1 = {self.max_len - 1})")
            if wrong:
                raise ValueError(f"positions_after_pad (RoBERTa's encoder positions) needs: {', '.join(wrong)}")
        if self.relative_bias and self.positional == "relative":
            raise ValueError("relative_bias adds T5's bias beside another positional: positional='relative' has it")

    def _check_special_tokens(self) -> None:
        """pad_id, bos_id and each eos id: None, or a token id below both vocabularies; eos_id not ()."""
        if isinstance(self.eos_id, list):  # a checkpoint's JSON metadata holds the tuple as a list
            object.__setattr__(self, "eos_id", tuple(self.eos_id))
        if isinstance(self.eos_id, tuple) and not self.eos_id:
            raise ValueError("eos_id must be a token id, a non-empty tuple of token ids, or None; got ()")
        special = [("pad_id", self.pad_id), ("bos_id", self.bos_id)]
        special += [("eos_id", token) for token in (self.eos_id if isinstance(self.eos_id, tuple) else (self.eos_id,))]
        for name, value in special:
            if value is None:
                continue  # no such token (pad_id None: no id is ever masked)
            _check_int(name, value, minimum=0)
            for vocab in ("src_vocab_size", "tgt_vocab_size"):
                if value >= getattr(self, vocab):
                    raise ValueError(
                        f"{name} must be a valid token id below {vocab}={getattr(self, vocab)}, got {value}"
                    )

    def _check_experts(self) -> None:
        """The mixture-of-experts fields: E >= 0; with experts, 1 <= top_k <= E and dense_layers decoder layers."""
        _check_int("n_experts", self.n_experts, minimum=0)
        if isinstance(self.dense_layers, list):  # a checkpoint's JSON metadata holds the tuple as a list
            object.__setattr__(self, "dense_layers", tuple(self.dense_layers))
        if not isinstance(self.dense_layers, tuple):
            raise TypeError(f"dense_layers must be a tuple of decoder layer indices, got {self.dense_layers!r}")
        for layer in self.dense_layers:
            _check_int("dense_layers entry", layer, minimum=0)
            if layer >= self.n_decoder_layers:
                raise ValueError(f"dense_layers must index decoder layers [0, {self.n_decoder_layers}), got {layer}")
        if self.d_expert is not None:
            _check_int("d_expert", self.d_expert, minimum=1)
        if not isinstance(self.norm_topk_prob, bool):
            raise TypeError(f"norm_topk_prob must be a bool, got {type(self.norm_topk_prob).__name__}")
        coef = self.router_aux_loss_coef
        if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not coef >= 0:
            raise ValueError(f"router_aux_loss_coef must be a float >= 0, got {coef!r}")
        _check_int("top_k", self.top_k, minimum=1)
        if self.n_experts == 0:
            return
        if self.top_k > self.n_experts:  # the experts have no dropout site: activation dropout skips their layers
            raise ValueError(f"top_k must be in [1, n_experts={self.n_experts}], got {self.top_k}")

    def _check_gpt_oss(self) -> None:
        """GPT-OSS's fields: expert_kind one of EXPERT_KINDS, the clamp and gain positive finite floats; sinks only
        with the plain attention kernel (the tiled one has no sink)."""
        if self.expert_kind not in EXPERT_KINDS:
            raise ValueError(f"expert_kind must be one of {EXPERT_KINDS}, got {self.expert_kind!r}")
        for name in ("swiglu_limit", "swiglu_alpha"):
            value = getattr(self, name)
            if not _is_positive_float(value) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite positive float, got {value!r}")
        if self.attn_sinks and self.attention == "flash":
            raise ValueError("attn_sinks=True needs attention='plain': the tiled kernel has no sink, got 'flash'")

    def _check_latent(self) -> None:
        """DeepSeek's attention fields: kv_lora_rank, q_lora_rank, v_head_dim ints >= 1 or None; latent attention needs
        rotary positions, a rotary part (rotary_dim) narrower than the head, no biases, none of the options it does
        not compute."""
        for name in ("kv_lora_rank", "q_lora_rank", "v_head_dim"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), minimum=1)
        if self.kv_lora_rank is not None:
            if self.positional != "rope" or self.rotary_dim is None or self.rotary_dim >= self.d_head:
                raise ValueError(
                    "kv_lora_rank (latent attention) needs positional='rope' and rotary_dim (qk_rope_head_dim) below "
                    f"head_dim, got positional={self.positional!r}, rotary_dim={self.rotary_dim}, "
                    f"head_dim={self.d_head}"
                )
            if self.bias or self.has_qkv_bias:
                raise ValueError("kv_lora_rank (latent attention) has no biases here: set bias=False, qkv_bias None")
            found = self._beside_latent()
            if found:
                raise ValueError(
                    f"kv_lora_rank (latent attention) computes none of {sorted(found)} here, got {found}: leave them "
                    "at their defaults"
                )
        elif self.q_lora_rank is not None or self.v_head_dim is not None:
            raise ValueError("q_lora_rank and v_head_dim belong to latent attention: set kv_lora_rank too")

    def _check_router(self) -> None:
        """DeepSeek's router: its scoring one of ("softmax", "sigmoid"), its groups dividing the experts, a positive
        scaling, shared experts >= 0."""
        if self.router_scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"router_scoring must be one of ('softmax', 'sigmoid'), got {self.router_scoring!r}")
        _check_int("router_groups", self.router_groups, minimum=1)
        _check_int("router_topk_groups", self.router_topk_groups, minimum=1)
        _check_int("n_shared_experts", self.n_shared_experts, minimum=0)
        if self.router_topk_groups > self.router_groups or (self.n_experts and self.n_experts % self.router_groups):
            raise ValueError(
                f"router_groups must divide n_experts={self.n_experts} and router_topk_groups be at most it, got "
                f"{self.router_groups}, {self.router_topk_groups}"
            )
        if not _is_positive_float(self.routed_scaling):
            raise ValueError(f"routed_scaling must be a positive float, got {self.routed_scaling!r}")

    def _beside_latent(self) -> dict:
        """The attention options set beside kv_lora_rank, which latent attention does not compute: name -> value."""
        others = {
            "n_kv_heads": self.n_kv_heads, "qk_norm": self.qk_norm or None, "sliding_window": self.sliding_window,
            "layer_types": self.layer_types, "attn_softcap": self.attn_softcap,
            "attn_sinks": self.attn_sinks or None, "relative_bias": self.relative_bias or None,
            "rope_layers": self.rope_layers,
        }  # fmt: skip
        return {name: value for name, value in others.items() if value is not None}

    @property
    def deepseek_router(self) -> bool:
        """The MoE layers are DeepSeek's (numpy_transformer.deepseek_moe): sigmoid scores, a score bias, groups, a
        scaling or shared experts; False: Mixtral's block."""
        return (
            self.router_scoring != "softmax" or self.router_score_bias or self.router_groups > 1
            or self.routed_scaling != 1.0 or self.n_shared_experts > 0
        )  # fmt: skip

    @property
    def value_dim(self) -> int:
        """An attention head's value width: v_head_dim (latent attention), or Dh."""
        return self.d_head if self.v_head_dim is None else self.v_head_dim

    def is_moe_layer(self, i: int) -> bool:
        """Whether decoder layer i's feed-forward block is a sparse mixture of experts."""
        return self.n_experts > 0 and i not in self.dense_layers

    @property
    def expert_width(self) -> int:
        """F_e, an expert's hidden width: d_expert, or d_ff when that is None."""
        return self.d_ff if self.d_expert is None else self.d_expert

    @property
    def has_relative_bias(self) -> bool:
        """Whether the self-attentions read a stack's T5 bias table: positional "relative", or relative_bias."""
        return self.positional == "relative" or self.relative_bias

    @property
    def longest_input(self) -> int:
        """The longest sequence the position table covers: max_len, less the pad_id + 1 rows that RoBERTa's
        positions skip (positions_after_pad)."""
        if not self.positions_after_pad or self.pad_id is None:  # (a valid config with positions_after_pad has one)
            return self.max_len
        return self.max_len - (self.pad_id + 1)

    @property
    def position_limit(self) -> int:
        """The longest sequence a model of this config reads (inputs, and prompt plus generated tokens): max_len,
        or with dynamic NTK RoPE (made to run past max_position_embeddings) on any layer kind, max_len x its factor,
        the context the factor stretches the base for (the larger, when both kinds have one)."""
        scalings = (self.rope_scaling, self.rope_local_scaling if self.rope_local_theta is not None else None)
        factors = [s.length_factor(self.max_len) for s in scalings if s is not None and s.rope_type == "dynamic"]
        return int(self.max_len * max(factors)) if factors and max(factors) > 1 else self.max_len

    def cache_outgrown(self, cached: int, total: int) -> bool:
        """Whether a decoding cache of `cached` positions must be made again for a sequence of `total`: LongRoPE's
        rotations switch to the long factors for the whole sequence once it passes the original length, so every
        cached key and value (of every layer) computed with the short ones is stale. Phi-3's generate() recomputes
        its cache at that step (`cached` <= original < `total`), the other families' generate() keeps it
        (rope_cache_remade); dynamic NTK's cache, as transformers', is kept."""
        scaling = self.rope_scaling
        if scaling is None or scaling.rope_type != "longrope" or not self.rope_cache_remade or cached == 0:
            return False
        return cached <= scaling.original_length(self.max_len) < total

    def check_length(self, name: str, length: int) -> None:
        """ValueError when an input of `length` positions reads past the position table (longest_input)."""
        if self.positions_after_pad and length > self.longest_input:
            raise ValueError(
                f"{name} has {length} positions, but RoBERTa's positions start after pad_id={self.pad_id}: the "
                f"table of config.max_len={self.max_len} rows covers T <= {self.longest_input}"
            )

    def _check_rope_layers(self) -> None:
        if self.rope_layers is None:
            return
        if isinstance(self.rope_layers, list):  # a checkpoint's JSON metadata holds the tuple as a list
            object.__setattr__(self, "rope_layers", tuple(self.rope_layers))
        if not isinstance(self.rope_layers, tuple) or not all(isinstance(v, bool) for v in self.rope_layers):
            raise TypeError(f"rope_layers must be a tuple of bools (one per layer) or None, got {self.rope_layers!r}")
        for stack in ("n_encoder_layers", "n_decoder_layers"):
            n_layers = getattr(self, stack)
            if n_layers and len(self.rope_layers) != n_layers:
                raise ValueError(
                    f"rope_layers must list one entry per layer: got {len(self.rope_layers)}, {stack}={n_layers}"
                )
        if self.positional != "rope":
            raise ValueError(
                f"rope_layers says which layers are rotary: it needs positional='rope', got {self.positional!r}"
            )

    def _check_layer_types(self) -> None:
        if self.layer_types is None:
            return
        if isinstance(self.layer_types, list):  # a checkpoint's JSON metadata holds the tuple as a list
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if not isinstance(self.layer_types, tuple):
            raise TypeError(
                f"layer_types must be a tuple of {LAYER_TYPES} or None, got {type(self.layer_types).__name__}"
            )
        wrong = [kind for kind in self.layer_types if kind not in LAYER_TYPES]
        if wrong:
            raise ValueError(f"layer_types must hold only {LAYER_TYPES}, got {wrong}")
        for stack in ("n_encoder_layers", "n_decoder_layers"):
            n_layers = getattr(self, stack)
            if n_layers and len(self.layer_types) != n_layers:
                raise ValueError(
                    f"layer_types must list one kind per layer: got {len(self.layer_types)} kinds, {stack}={n_layers}"
                )
        if "sliding_attention" in self.layer_types and self.sliding_window is None:
            raise ValueError("layer_types has 'sliding_attention' layers: sliding_window must be set, got None")

    def layer_window(self, layer: int) -> int | None:
        """The window of layer `layer`'s self-attention: sliding_window on a "sliding_attention" layer (on every
        layer when layer_types is None), None on a "full_attention" one."""
        if self.layer_types is not None and self.layer_types[layer] == "full_attention":
            return None
        return self.sliding_window

    def layer_uses_rope(self, layer: int) -> bool:
        """Whether layer `layer` turns its queries and keys by RoPE: rope_layers' entry (SmolLM3's NoPE layers say
        False), True when that is None."""
        return self.rope_layers is None or self.rope_layers[layer]

    def layer_rope_theta(self, layer: int) -> float:
        """The rotary base of layer `layer`: rope_local_theta on a "sliding_attention" layer when set, else
        rope_theta."""
        local = self.layer_types is not None and self.layer_types[layer] == "sliding_attention"
        return self.rope_local_theta if local and self.rope_local_theta is not None else self.rope_theta

    def layer_rope_scaling(self, layer: int) -> RopeScaling | None:
        """The RoPE scaling of layer `layer`: rope_scaling, except on a layer with a base of its own
        (rope_local_theta), which has rope_local_scaling (Gemma 3's and ModernBERT's local layers)."""
        local = self.layer_types is not None and self.layer_types[layer] == "sliding_attention"
        return self.rope_local_scaling if local and self.rope_local_theta is not None else self.rope_scaling

    @property
    def d_head(self) -> int:
        """Dh, the width of one attention head: head_dim, or d_model // n_heads when that is None."""
        return self.d_model // self.n_heads if self.head_dim is None else self.head_dim

    @property
    def rope_dim(self) -> int:
        """The features of each head that RoPE rotates: rotary_dim, or Dh when that is None."""
        return self.d_head if self.rotary_dim is None else self.rotary_dim

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """Every end-of-sequence id: eos_id as a tuple (empty when None)."""
        if self.eos_id is None:
            return ()
        return self.eos_id if isinstance(self.eos_id, tuple) else (self.eos_id,)

    @property
    def kv_heads(self) -> int:
        """The number of K/V heads: n_kv_heads, or n_heads when that is None (plain multi-head attention)."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def has_final_norm(self) -> bool:
        """Whether each stack ends with a norm ({stack}.final_norm.*): final_norm, or norm_first when that is None."""
        return self.norm_first if self.final_norm is None else self.final_norm

    @property
    def has_qkv_bias(self) -> bool:
        """Whether the q, k and v projections have biases: qkv_bias, or `bias` when that is None."""
        return self.bias if self.qkv_bias is None else self.qkv_bias

    @property
    def has_ffn_bias(self) -> bool:
        """Whether the feed-forward's linears have biases: ffn_bias, or `bias` when that is None."""
        return self.bias if self.ffn_bias is None else self.ffn_bias

    def layer_attention_scale(self, layer: int) -> float | None:
        """The factor on q . k of layer `layer`'s self-attention: attention_scale (None: 1 / sqrt(d_head)), divided
        by layer + 1 with attention_scale_by_layer (GPT-2's scale_attn_by_inverse_layer_idx)."""
        if not self.attention_scale_by_layer:
            return self.attention_scale
        scale = self.d_head**-0.5 if self.attention_scale is None else self.attention_scale
        return scale / float(layer + 1)

    @property
    def dropout_rates(self) -> dict:
        """{kind: rate} for the four kinds of dropout site (DROPOUT_KINDS), `dropout` where a kind is None."""
        rates = {kind: getattr(self, f"{kind}_dropout") for kind in DROPOUT_KINDS}
        return {kind: float(self.dropout if rate is None else rate) for kind, rate in rates.items()}

    @property
    def has_dropout(self) -> bool:
        """True when any dropout site has a rate above zero."""
        return any(rate > 0 for rate in self.dropout_rates.values())

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> TransformerConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"config: unknown fields {unknown}; expected a subset of {sorted(known)}")
        return cls(**values)


@dataclass(frozen=True)
class GenerationRules:
    """What a checkpoint's generation_config.json asks of decoding (stopping at eos aside). hf.load reads them; a
    model of our own has none, and decoding it keeps its own rule instead: pad is never generated (its settings are
    then transformers' defaults, the values below). A model with rules bans only what they ban (the pad id too, only
    when bad_words_ids lists it), as generate() does. Applied as transformers' logits processors apply them, at the
    same steps and in the same order (numpy_transformer.logits_processors states each formula):

    - repetition_penalty: the scores of tokens already in the row divided by it (multiplied when negative);
    - no_repeat_ngram_size: a token that would repeat an n-gram already in the row is banned;
    - bad_words: token sequences never to complete: a sequence's last token is banned wherever the tokens before
      it end the row (a one-token sequence is banned everywhere);
    - min_length / min_new_tokens: the end tokens banned while the row (decoder ids: prompt, or start token, and
      what was generated) is shorter than min_length, or fewer than min_new_tokens were generated;
    - forced_bos_id: the token at position 1 (the first generated token of an encoder-decoder; mBART's language);
    - forced_eos_id: the token at the last step, when a row gets there without eos (Marian's, BART's); a tuple of
      ids (generation_config.json's list, or the caller's): each of them left at 0, every other token -inf;
    - eos_ids: the end tokens decoding stops at and min_length bans (the caller's eos_token_id); None: the config's;
    - pad_id: generation_config.json's pad_token_id (what fill_id and beam_fill_id come from, kept so that a caller's
      eos_token_id can remake them as generate() does); None: none in the file;
    - start_id: the caller's decoder_start_token_id, an encoder-decoder's first decoder token; None: config.bos_id;
    - do_sample, temperature, top_k, top_p, min_p: sampling and its warpers (top_k 0 or None: off; min_p None: off);
    - num_beams, length_penalty, early_stopping: what beam search and generate() use unless the caller says;
    - max_length (None: not in the file, generate()'s 20 new tokens) and max_new_tokens: generate()'s length;
    - beam_fill_id: what pads a finished beam-search hypothesis shorter than the best: generate()'s
      `pad_token_id or eos_token_id` (so eos when the pad id is 0, as T5's); None: pad_id, as greedy search;
    - fill_id: what follows a row's end token in greedy search: generate()'s pad_token_id, or its first
      eos_token_id without one; None: the config's pad_id (eos_id without one);
    - suppress_tokens: ids banned at every step (SuppressTokensLogitsProcessor); begin_suppress_tokens: ids banned
      at the first generated step only (SuppressTokensAtBeginLogitsProcessor; Whisper's blank and end token);
    - decoder_prompt: the ids an encoder-decoder's decoder reads after start_id before it generates (Whisper's
      language, task and no-timestamps tokens, from forced_decoder_ids); they are in the returned rows;
    - prompt_settings: the generation_config.json keys the decoder_prompt was made from (Whisper's lang_to_id,
      task_to_id, ...), as (key, value) pairs, so that a caller's language= / task= can make it again.
    - stop_strings: generation_config.json's stop strings (transformers' StopStringCriteria), applied when generate()
      is given tokenizer= (as transformers does) unless the caller passes its own; without one, warned about.
    """

    forced_bos_id: int | None = None
    forced_eos_id: int | tuple | None = None  # an id, or a tuple of ids
    bad_words: tuple = ()  # tuple of tuples of ids
    eos_ids: tuple | None = None  # tuple of ids
    pad_id: int | None = None
    start_id: int | None = None
    beam_fill_id: int | None = None
    fill_id: int | None = None
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    min_length: int = 0
    min_new_tokens: int | None = None
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = 50
    top_p: float = 1.0
    min_p: float | None = None
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    max_length: int | None = None
    max_new_tokens: int | None = None
    suppress_tokens: tuple = ()  # tuple of ids
    begin_suppress_tokens: tuple = ()  # tuple of ids
    decoder_prompt: tuple = ()  # tuple of ids
    prompt_settings: tuple = ()  # ((key, value), ...): the generation_config.json keys decoder_prompt came from
    stop_strings: tuple = ()  # tuple of str: generation_config.json's, applied when generate() gets a tokenizer

    def __post_init__(self) -> None:
        for name in ("forced_bos_id", "beam_fill_id", "fill_id", "pad_id", "start_id"):
            value = getattr(self, name)
            if value is not None:
                _check_int(name, value, minimum=0)
        for name in ("forced_eos_id", "eos_ids"):
            value = getattr(self, name)
            if isinstance(value, tuple) and not value:
                raise ValueError(f"{name} must be an id or a non-empty tuple of ids, got ()")
            for token in value if isinstance(value, tuple) else () if value is None else (value,):
                _check_int(name, token, minimum=0)
        for words in self.bad_words:
            if not isinstance(words, tuple) or not words:
                raise ValueError(f"bad_words must be non-empty tuples of token ids, got {words!r}")
            for token in words:
                _check_int("bad_words token", token, minimum=0)
        self._check_settings()

    def _check_settings(self) -> None:
        """The decoding settings: ints and floats in transformers' ranges."""
        for name, minimum in (("no_repeat_ngram_size", 0), ("min_length", 0), ("num_beams", 1)):
            _check_int(name, getattr(self, name), minimum)
        for name, minimum in (("min_new_tokens", 0), ("top_k", 0), ("max_length", 1), ("max_new_tokens", 1)):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), minimum)
        self._check_floats()

    def _check_floats(self) -> None:
        if not (_is_positive_float(self.repetition_penalty) and math.isfinite(self.repetition_penalty)):
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty!r}")
        if not (_is_positive_float(self.temperature) or self.temperature == 0) or not math.isfinite(self.temperature):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")  # 0: not sampling
        for name in ("top_p", "min_p"):
            value = getattr(self, name)
            if value is None and name == "min_p":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
        if isinstance(self.length_penalty, bool) or not isinstance(self.length_penalty, (int, float)):
            raise TypeError(
                f"length_penalty must be a float, got {type(self.length_penalty).__name__} ({self.length_penalty!r})"
            )
        if not math.isfinite(self.length_penalty):
            raise ValueError(f"length_penalty must be finite, got {self.length_penalty}")
        if self.early_stopping not in (True, False, "never") or not isinstance(self.early_stopping, (bool, str)):
            raise ValueError(f"early_stopping must be True, False or 'never', got {self.early_stopping!r}")
        if not isinstance(self.do_sample, bool):
            raise TypeError(f"do_sample must be True or False, got {self.do_sample!r}")


def _is_positive_float(value: object) -> bool:
    """A number above zero (an int counts, a bool does not)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value > 0


def short_repr(value: object, limit: int = 80) -> str:
    """repr(value), cut to about `limit` characters (longrope's factor lists run to dozens of numbers), saying how
    many values a cut list held."""
    text = repr(value)
    if len(text) <= limit:
        return text
    count = f", {len(value)} values" if isinstance(value, (list, tuple, dict)) else ""
    return f"{text[: limit - 20]}...{count}"


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


# ----------------------------------------------------------------------------------------------
# Checkpoints (safetensors files) carry the config in their metadata, so one file rebuilds the
# model in either implementation. Both packages' checkpoint modules use these two functions.

CHECKPOINT_FORMAT = "transformer-parity/1"
MODEL_CLASSES = ("Transformer", "TransformerLM", "EncoderModel", "SpeechTransformer")


def checkpoint_metadata(config: TransformerConfig, model_class: str, extra: dict | None = None) -> dict:
    """The safetensors metadata (str -> str) that identifies a checkpoint and carries its config."""
    if model_class not in MODEL_CLASSES:
        raise ValueError(f"model_class must be one of {MODEL_CLASSES}, got {model_class!r}")
    metadata = {"format": CHECKPOINT_FORMAT, "model_class": model_class, "config": json.dumps(config.to_dict())}
    for key, value in (extra or {}).items():
        if key in metadata:
            raise ValueError(f"metadata key {key!r} is reserved")
        metadata[key] = value if isinstance(value, str) else json.dumps(value)
    return metadata


def parse_checkpoint_metadata(metadata: dict | None, path) -> tuple[TransformerConfig, str, dict]:
    """(config, model_class, extra metadata) from a checkpoint's metadata; ValueError naming the problem."""
    if not metadata or metadata.get("format") != CHECKPOINT_FORMAT:
        got = None if not metadata else metadata.get("format")
        raise ValueError(f"{path}: not a checkpoint of this project (format {got!r}, expected {CHECKPOINT_FORMAT!r})")
    model_class = metadata.get("model_class")
    if model_class not in MODEL_CLASSES:
        raise ValueError(f"{path}: model_class {model_class!r} is not one of {MODEL_CLASSES}")
    try:
        config = TransformerConfig.from_dict(json.loads(metadata["config"]))
    except (KeyError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: the config in the metadata is missing or unreadable ({error})") from None
    except (ValueError, TypeError, RecursionError) as error:  # a field out of range, JSON nested too deep, an
        # integer too long to parse: whatever a hostile file holds, the message names the file
        raise ValueError(f"{path}: the config in the metadata is invalid ({type(error).__name__}: {error})") from None
    extra = {k: v for k, v in metadata.items() if k not in ("format", "model_class", "config")}
    return config, model_class, extra


def check_checkpoint_fits(model, config: TransformerConfig, model_class: str, path) -> None:
    """Raise ValueError unless a checkpoint (its config and model class) fits `model`."""
    if type(model).__name__ != model_class:
        raise ValueError(f"{path}: holds a {model_class}, cannot load into a {type(model).__name__}")
    a, b = model.config.to_dict(), config.to_dict()
    differences = [f"{k}: model {a[k]!r}, checkpoint {b[k]!r}" for k in a if a[k] != b[k]]
    if differences:
        raise ValueError(f"{path}: the checkpoint's config differs from the model's: {'; '.join(differences)}")


def check_layer_count(config: TransformerConfig, n_tensors: int, where) -> None:
    """ValueError unless a checkpoint of `n_tensors` tensors could hold the layers `config` claims: every layer
    has tensors, so a hostile config claiming a billion layers is refused before anything (parameter names,
    a model) is built from it."""
    n_layers = config.n_encoder_layers + config.n_decoder_layers
    if n_layers > n_tensors:
        raise ValueError(f"{where}: the config claims {n_layers} layers, the checkpoint holds only {n_tensors} tensors")


# safetensors dtypes a parameter may be stored in (the loaders cast to the model's dtype)
CHECKPOINT_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")


def check_checkpoint_tensors(header: dict, expected: dict, model_class: str, path) -> None:
    """ValueError listing every way a checkpoint's tensors (name -> (safetensors dtype, shape), read from its
    header before any data) differ from the `expected` state dict (name -> shape) of the `model_class` its
    metadata describes: missing, unexpected, mis-shaped, not floating point. At most ten of each are named."""

    def listed(items: list) -> str:
        return f"{items}" if len(items) <= 10 else f"{items[:10]} and {len(items) - 10} more"

    missing = [k for k in expected if k not in header]
    unexpected = [k for k in header if k not in expected]
    misshaped = [
        f"{k}: got {s}, expected {expected[k]}" for k, (_, s) in header.items() if k in expected and s != expected[k]
    ]
    not_float = [f"{k}: {dtype}" for k, (dtype, _) in header.items() if dtype not in CHECKPOINT_FLOAT_DTYPES]
    problems = []
    for what, items in (
        ("missing tensors", missing),
        ("unexpected tensors", unexpected),
        ("mis-shaped tensors", misshaped),
        (f"tensors that are not floating point ({', '.join(CHECKPOINT_FLOAT_DTYPES)})", not_float),
    ):
        if items:
            problems.append(f"{what} {listed(items)}")
    if problems:
        raise ValueError(f"{path}: does not fit the {model_class} its metadata describes: " + "; ".join(problems))
