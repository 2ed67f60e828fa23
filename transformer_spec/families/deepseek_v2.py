"""DeepSeek-V2 and V2-Lite (DeepseekV2ForCausalLM, model_type deepseek_v2): V3's decoder (families/deepseek_v3.py:
latent attention, shared experts, the first first_k_dense_replace layers dense) with V2's router: a softmax over the
routed experts and the plain top k of it (topk_method "greedy"), the chosen probabilities not renormalised, times
routed_scaling_factor; no score bias. V2-Lite's queries come through one q_proj (q_lora_rank null). transformers' V2
turns the rotary part as complex numbers in place (V3 writes the turned pairs de-interleaved): the same scores.

Refused by name: topk_method "group_limited_greedy" (DeepSeek-V2's 236B router: not computed here), a scoring_func
other than softmax, norm_topk_prob true (transformers' V2 router does not read it), and V3's refusals
(quantization_config, moe_layer_freq, attention_bias, num_key_value_heads). Read and not computed by transformers
either: n_group and topk_group (the greedy choice ignores them), aux_loss_alpha, seq_aux, ep_size."""

from __future__ import annotations

from dataclasses import replace

from .core import Key, declared, special_token
from .deepseek_v3 import DEEPSEEK_V3, LATENT_SUPPORTS, latent_keys
from .llama import LLAMA_CONFIG

V2_DEFAULTS = {
    "kv_lora_rank": 512, "q_lora_rank": 1536, "n_routed_experts": 64, "num_experts_per_tok": None,
    "moe_intermediate_size": 1407, "n_shared_experts": 2, "routed_scaling_factor": 1.0, "first_k_dense_replace": 0,
}  # fmt: skip

DEEPSEEK_V2_CONFIG = LLAMA_CONFIG.variant(
    "deepseek_v2",
    without=("num_key_value_heads", "head_dim", "attention_bias", "mlp_bias", "bos_token_id", "eos_token_id"),
    keys=(
        *latent_keys(V2_DEFAULTS),
        Key("bos_token_id", "bos_id", 1, special_token("bos_token_id")),
        Key("eos_token_id", "eos_id", 2, special_token("eos_token_id")),
        Key("norm_topk_prob", None, False, allowed=(False,)),  # V2's router never renormalises
        Key("topk_method", None, "greedy", allowed=("greedy",)),
        Key("scoring_func", None, "softmax", allowed=("softmax",)),
        Key("n_group", None, None, written=False),  # read by group_limited_greedy only
        Key("topk_group", None, None, written=False),
        Key("seq_aux", None, True, written=False),  # a training loss's option
    ),
    supports=LATENT_SUPPORTS | {"norm_topk_prob": False, "router_scoring": "softmax"},
)

DEEPSEEK_V2 = replace(
    declared(DEEPSEEK_V2_CONFIG, model_class="TransformerLM", architecture="DeepseekV2ForCausalLM",
             prefixes=DEEPSEEK_V3.prefixes, rules=DEEPSEEK_V3.rules, skipped=DEEPSEEK_V3.skipped,
             tied=DEEPSEEK_V3.tied),
    legacy=DEEPSEEK_V3.legacy,
)  # fmt: skip

# what this file adds to transformer_spec.families.FAMILIES (found by the package, no list to edit)
REGISTER = (DEEPSEEK_V2,)
