"""OLMo 2 (Olmo2ForCausalLM, model_type olmo2): Llama's decoder (SwiGLU, RoPE, grouped-query attention, an untied head
in the released files) with its norms moved: no norm before a sublayer, an RMSNorm of each sublayer's output before
it joins the stream, x + Norm_post(f(x)) (post_attention_layernorm, post_feedforward_layernorm: `sandwich_norm`
without `input_norm`), a final norm; and q_norm, k_norm over each whole projection, (H*Dh,) and (H_kv*Dh,), before the
head split and RoPE (`qk_norm_projection`, not Qwen3's per-head (Dh,)). attention_bias puts biases on q, k, v and o;
the MLP has none."""

from __future__ import annotations

from .core import Key, Rule, declared, special_token
from .llama import LLAMA, LLAMA_CONFIG
from .qwen3 import QWEN3_CONFIG

# Olmo2Config's defaults differ from Llama's for these keys (a config.json that leaves them out reads them)
OLMO2_DEFAULTS = {"rms_norm_eps": 1e-5, "pad_token_id": 1, "eos_token_id": 50279}

OLMO2_CONFIG = LLAMA_CONFIG.variant(
    "olmo2",
    # Olmo2Config has neither head_dim (hidden_size / heads) nor mlp_bias (its MLP has no biases)
    without=("head_dim", "mlp_bias", "attention_bias", "rms_norm_eps", "pad_token_id", "eos_token_id"),
    keys=(
        *(key for key in QWEN3_CONFIG.keys if key.theirs == "attention_bias"),  # q, k, v, o biases; none in the MLP
        Key("rms_norm_eps", "layer_norm_eps", OLMO2_DEFAULTS["rms_norm_eps"]),
        Key("pad_token_id", "pad_id", OLMO2_DEFAULTS["pad_token_id"], special_token("pad_token_id")),
        Key("eos_token_id", "eos_id", OLMO2_DEFAULTS["eos_token_id"], special_token("eos_token_id")),
        # embed_tokens: nn.Embedding(padding_idx=pad), so the pad row gets no gradient from lookups
        Key(
            "pad_token_id",
            "embedding_padding_idx",
            OLMO2_DEFAULTS["pad_token_id"],
            lambda value, c: value is not None,
            written=False,
        ),
        Key("head_dim", None, None, allowed=(None,), written=False),  # Olmo2Config has none: hidden_size / heads
    ),
    supports={
        "bias": QWEN3_CONFIG.supports["bias"],
        "qkv_bias": QWEN3_CONFIG.supports["qkv_bias"],
        "ffn_bias": QWEN3_CONFIG.supports["ffn_bias"],
        "head_dim": None,
        "sandwich_norm": True,
        "input_norm": False,
        "qk_norm": True,
        "qk_norm_projection": True,
    },
)

# Llama's table without its two pre-norms; the norms of the sublayers' outputs and the q/k norms instead
OLMO2_RULES = (
    *(rule for rule in LLAMA.rules if not rule.ours.endswith(("self_attn_norm.weight", "ffn_norm.weight"))),
    Rule("decoder.layers.{i}.self_attn_post_norm.weight", "layers.{i}.post_attention_layernorm.weight"),
    Rule("decoder.layers.{i}.ffn_post_norm.weight", "layers.{i}.post_feedforward_layernorm.weight"),
    *(
        Rule(f"decoder.layers.{{i}}.self_attn.{norm}.weight", f"layers.{{i}}.self_attn.{norm}.weight")
        for norm in ("q_norm", "k_norm")
    ),
)

OLMO2 = declared(
    OLMO2_CONFIG, model_class="TransformerLM", architecture="Olmo2ForCausalLM", prefixes=LLAMA.prefixes,
    rules=OLMO2_RULES, skipped=LLAMA.skipped, tied=LLAMA.tied,
)  # fmt: skip

# what this file adds to transformer_spec.families.FAMILIES (found by the package, no list to edit)
REGISTER = (OLMO2,)
