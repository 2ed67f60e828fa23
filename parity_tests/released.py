"""The released-config table: for each family, the config.json of a released checkpoint as the Hub holds it (its keys
and option values as written, the sizes shrunk: a few layers, heads of 8 features, a vocabulary of 40), loaded by
transformers (its class, float64, the float32 islands patched as hf_compare's comparisons patch them) and by us (both
sides), one forward and one backward with a random upstream gradient; printed: name, what changed since issue 47
opened, loaded or refused (by which key), the largest relative output and gradient error over both sides.

    python -m parity_tests.released                  # the table (about a minute on 2 cores)
    python -m parity_tests.released --json out.json  # and its rows

A row is "DIFFERENT" when it loads and misses the float64 bars (components.failures): none may be. Each checkpoint's
weights are drawn as hf_compare.build_tiny draws them (matrices N(0, 0.3^2), biases and norm weights off 0 and 1),
written by save_pretrained, then config.json replaced by the released one (so both sides read the file's own
spelling: rope_scaling with "type", top-level rope_theta, keys no layer reads).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import transformers

from parity_tests import components as C
from parity_tests import hf_compare as H
from parity_tests import modernbert_compare as M

SIDES = ("numpy", "torch")
# a released file's keys that describe the file, not the model: kept as the file has them
META = {"transformers_version": "4.45.0", "torch_dtype": "bfloat16", "use_cache": True, "initializer_range": 0.02}

LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "head_dim": 8, "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 128,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama", "num_attention_heads": 4,
    "num_hidden_layers": 2, "num_key_value_heads": 1, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "vocab_size": 40,
} | META  # fmt: skip
LLAMA_2_7B = {
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 32, "intermediate_size": 88, "max_position_embeddings": 4096, "model_type": "llama",
    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 4, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": None, "tie_word_embeddings": False, "vocab_size": 40,
} | META  # fmt: skip
# a Llama-architecture conversion of a family with q, k, v and o biases (InternLM's, Qwen-1's): mlp_bias false beside
# attention_bias true
LLAMA_CONVERTED = LLAMA_2_7B | {"attention_bias": True, "mlp_bias": False, "rope_theta": 1000000.0}
VICUNA_16K = LLAMA_2_7B | {"max_position_embeddings": 16, "rope_scaling": {"factor": 4.0, "type": "dynamic"}}
MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 32, "intermediate_size": 112, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0, "sliding_window": 3, "tie_word_embeddings": False, "vocab_size": 40,
} | META  # fmt: skip
QWEN2_5_0_5B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 176, "max_position_embeddings": 32768,
    "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
    "tie_word_embeddings": True, "use_sliding_window": False, "vocab_size": 40,
} | META  # fmt: skip
# Qwen2.5-7B-Instruct with the rope_scaling block its model card adds for long inputs (YaRN 4 over 32768)
QWEN2_5_YARN = QWEN2_5_0_5B | {
    "tie_word_embeddings": False,
    "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},
}
QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "head_dim": 16, "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 96,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 4,
    "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True, "use_sliding_window": False,
    "vocab_size": 40,
} | META  # fmt: skip
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
    "decoder_sparse_step": 1, "eos_token_id": 2, "head_dim": 16, "hidden_act": "silu", "hidden_size": 32,
    "intermediate_size": 96, "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
    "model_type": "qwen3_moe", "moe_intermediate_size": 12, "norm_topk_prob": True, "num_attention_heads": 4,
    "num_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_key_value_heads": 1,
    "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001, "sliding_window": None, "tie_word_embeddings": False, "use_sliding_window": False,
    "vocab_size": 40,
} | META  # fmt: skip
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 112, "max_position_embeddings": 32768,
    "model_type": "mixtral", "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": 2,
    "num_key_value_heads": 1, "num_local_experts": 4, "output_router_logits": False, "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02, "sliding_window": None, "tie_word_embeddings": False,
    "vocab_size": 40,
} | META  # fmt: skip
BLOOM_560M = {
    "apply_residual_connection_post_layernorm": False, "architectures": ["BloomForCausalLM"],
    "attention_dropout": 0.0, "attention_softmax_in_fp32": True, "bias_dropout_fusion": True, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_dropout": 0.0, "hidden_size": 16, "layer_norm_epsilon": 1e-05,
    "masked_softmax_fusion": True, "model_type": "bloom", "n_head": 4, "n_inner": None, "n_layer": 2,
    "offset_alibi": 100, "pad_token_id": 3, "pretraining_tp": 1, "skip_bias_add": True, "skip_bias_add_qkv": False,
    "slow_but_exact": False, "unk_token_id": 0, "vocab_size": 40,
} | META  # fmt: skip
PHI3_MINI_4K = {
    "architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
    "embd_pdrop": 0.0, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 88,
    "max_position_embeddings": 4096, "model_type": "phi3", "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 4, "original_max_position_embeddings": 4096, "pad_token_id": 0, "resid_pdrop": 0.0,
    "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0, "sliding_window": 5,
    "tie_word_embeddings": False, "vocab_size": 40,
} | META  # fmt: skip
# Phi-3-mini-128k-instruct: longrope over an original length shrunk to 8 (14 tokens run past it), a window far past
PHI3_MINI_128K = PHI3_MINI_4K | {
    "max_position_embeddings": 131072, "original_max_position_embeddings": 8, "sliding_window": 262144,
    "rope_scaling": {"long_factor": [1.0700000524520874, 1.1200000047683716, 3.25, 9.8],
                     "short_factor": [1.0, 1.01, 1.02, 1.05], "type": "longrope"},
}  # fmt: skip
PHI3_MINI_128K_SU = PHI3_MINI_128K | {"rope_scaling": PHI3_MINI_128K["rope_scaling"] | {"type": "su"}}
GPT_NEOX_PYTHIA = {
    "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "gelu",
    "hidden_size": 64, "intermediate_size": 256, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
    "model_type": "gpt_neox", "num_attention_heads": 2, "num_hidden_layers": 2, "rotary_emb_base": 10000,
    "rotary_pct": 0.25, "tie_word_embeddings": False, "use_parallel_residual": True, "vocab_size": 40,
} | META  # fmt: skip
GEMMA3_1B = {
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 39],
    "final_logit_softcapping": None, "head_dim": 8, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 36,
    "intermediate_size": 216, "max_position_embeddings": 32768, "model_type": "gemma3_text",
    "num_attention_heads": 4, "num_hidden_layers": 6, "num_key_value_heads": 1, "pad_token_id": 0,
    "query_pre_attn_scalar": 8, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": None,
    "rope_theta": 1000000, "sliding_window": 3, "sliding_window_pattern": 6, "vocab_size": 40,
} | META  # fmt: skip
# gemma-3-4b-it's text config: its global layers' linear 8, a top-level rope_scaling with rope_type
GEMMA3_4B = GEMMA3_1B | {"rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "num_key_value_heads": 2}
EMBEDDING_GEMMA = {
    "architectures": ["Gemma3TextModel"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": None, "bos_token_id": 2, "eos_token_id": 1, "final_logit_softcapping": None,
    "head_dim": 8, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 24, "intermediate_size": 36,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"], "max_position_embeddings": 2048,
    "model_type": "gemma3_text", "num_attention_heads": 3, "num_hidden_layers": 6, "num_key_value_heads": 1,
    "pad_token_id": 0, "query_pre_attn_scalar": 8, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0,
    "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": 4, "use_bidirectional_attention": True,
    "vocab_size": 40,
} | META  # fmt: skip
GPT2 = {
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1, "bos_token_id": 1,
    "embd_pdrop": 0.1, "eos_token_id": 2, "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 24,
    "n_embd": 16, "n_head": 4, "n_layer": 2, "n_positions": 24, "resid_pdrop": 0.1, "summary_activation": None,
    "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
    "summary_use_proj": True, "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
    "vocab_size": 40,
} | META  # fmt: skip
# stanford-crfm's GPT-2 runs (mistral): both attention options on
GPT2_CRFM = GPT2 | {"scale_attn_by_inverse_layer_idx": True, "reorder_and_upcast_attn": True}
BERT_BASE = {
    "architectures": ["BertForMaskedLM"], "attention_probs_dropout_prob": 0.1, "gradient_checkpointing": False,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 16, "intermediate_size": 64,
    "layer_norm_eps": 1e-12, "max_position_embeddings": 16, "model_type": "bert", "num_attention_heads": 4,
    "num_hidden_layers": 2, "pad_token_id": 0, "position_embedding_type": "absolute", "type_vocab_size": 2,
    "vocab_size": 40,
} | META  # fmt: skip
ROBERTA_BASE = {
    "architectures": ["RobertaForMaskedLM"], "attention_probs_dropout_prob": 0.1, "bos_token_id": 0,
    "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 16, "intermediate_size": 64,
    "layer_norm_eps": 1e-05, "max_position_embeddings": 18, "model_type": "roberta", "num_attention_heads": 4,
    "num_hidden_layers": 2, "pad_token_id": 1, "type_vocab_size": 1, "vocab_size": 40,
} | META  # fmt: skip
XLM_ROBERTA_BASE = ROBERTA_BASE | {"model_type": "xlm-roberta", "architectures": ["XLMRobertaForMaskedLM"],
                                   "output_past": True}  # fmt: skip
DISTILBERT_BASE = {
    "activation": "gelu", "architectures": ["DistilBertForMaskedLM"], "attention_dropout": 0.1, "dim": 16,
    "dropout": 0.1, "hidden_dim": 64, "max_position_embeddings": 16, "model_type": "distilbert", "n_heads": 4,
    "n_layers": 2, "pad_token_id": 0, "qa_dropout": 0.1, "seq_classif_dropout": 0.2, "sinusoidal_pos_embds": False,
    "tie_weights_": True, "vocab_size": 40,
} | META  # fmt: skip
ALL_MPNET_BASE_V2 = {
    "architectures": ["MPNetForMaskedLM"], "attention_probs_dropout_prob": 0.1, "bos_token_id": 0, "eos_token_id": 2,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 16, "intermediate_size": 64,
    "layer_norm_eps": 1e-05, "max_position_embeddings": 18, "model_type": "mpnet", "num_attention_heads": 4,
    "num_hidden_layers": 2, "pad_token_id": 1, "relative_attention_num_buckets": 32, "vocab_size": 40,
} | META  # fmt: skip
MODERNBERT_BASE = {
    "architectures": ["ModernBertForMaskedLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 1, "classifier_activation": "gelu", "classifier_bias": False, "classifier_dropout": 0.0,
    "classifier_pooling": "mean", "cls_token_id": 1, "decoder_bias": True, "deterministic_flash_attn": False,
    "embedding_dropout": 0.0, "eos_token_id": 2, "global_attn_every_n_layers": 3, "global_rope_theta": 160000.0,
    "gradient_checkpointing": False, "hidden_activation": "gelu", "hidden_size": 32, "initializer_cutoff_factor": 2.0,
    "intermediate_size": 48, "layer_norm_eps": 1e-05, "local_attention": 4, "local_rope_theta": 10000.0,
    "max_position_embeddings": 8192, "mlp_bias": False, "mlp_dropout": 0.0, "model_type": "modernbert",
    "norm_bias": False, "norm_eps": 1e-05, "num_attention_heads": 4, "num_hidden_layers": 3, "pad_token_id": 0,
    "position_embedding_type": "absolute", "sep_token_id": 2, "vocab_size": 40,
} | META  # fmt: skip
# the encoder-decoders: hf_compare's seq2seq sizes (a vocabulary of 24, d_model 32, 2 + 2 layers)
T5_SMALL = {
    "architectures": ["T5ForConditionalGeneration"], "d_ff": 64, "d_kv": 8, "d_model": 32, "decoder_start_token_id": 0,
    "dropout_rate": 0.1, "eos_token_id": 1, "feed_forward_proj": "relu", "initializer_factor": 1.0,
    "is_encoder_decoder": True, "layer_norm_epsilon": 1e-06, "model_type": "t5", "n_positions": 512,
    "num_decoder_layers": 2, "num_heads": 4, "num_layers": 2, "output_past": True, "pad_token_id": 0,
    "relative_attention_max_distance": 10, "relative_attention_num_buckets": 8, "vocab_size": 24,
} | META  # fmt: skip
FLAN_T5_SMALL = T5_SMALL | {
    "d_model": 24,
    "feed_forward_proj": "gated-gelu",
    "num_decoder_layers": 3,
    "tie_word_embeddings": False,
    "architectures": ["T5ForConditionalGeneration"],
}  # flan-t5-small: d_kv x heads (32) != d_model, untied, gated GELU, more decoder layers
BART_BASE = {
    "activation_dropout": 0.1, "activation_function": "gelu", "add_bias_logits": False, "add_final_layer_norm": False,
    "architectures": ["BartModel"], "attention_dropout": 0.1, "bos_token_id": 0, "classif_dropout": 0.1,
    "classifier_dropout": 0.0, "d_model": 32, "decoder_attention_heads": 4, "decoder_ffn_dim": 64,
    "decoder_layerdrop": 0.0, "decoder_layers": 2, "decoder_start_token_id": 2, "dropout": 0.1,
    "early_stopping": True, "encoder_attention_heads": 4, "encoder_ffn_dim": 64, "encoder_layerdrop": 0.0,
    "encoder_layers": 2, "eos_token_id": 2, "forced_bos_token_id": 0, "forced_eos_token_id": 2,
    "gradient_checkpointing": False, "init_std": 0.02, "is_encoder_decoder": True, "max_position_embeddings": 32,
    "model_type": "bart", "no_repeat_ngram_size": 3, "normalize_before": False, "normalize_embedding": True,
    "num_beams": 4, "num_hidden_layers": 2, "pad_token_id": 1, "scale_embedding": False, "vocab_size": 24,
} | META  # fmt: skip
OPUS_MT = {
    "activation_dropout": 0.0, "activation_function": "swish", "add_bias_logits": False, "add_final_layer_norm": False,
    "architectures": ["MarianMTModel"], "attention_dropout": 0.0, "bad_words_ids": [[23]], "bos_token_id": 0,
    "classif_dropout": 0.0, "d_model": 32, "decoder_attention_heads": 4, "decoder_ffn_dim": 64,
    "decoder_layerdrop": 0.0, "decoder_layers": 2, "decoder_start_token_id": 23, "dropout": 0.1,
    "encoder_attention_heads": 4, "encoder_ffn_dim": 64, "encoder_layerdrop": 0.0, "encoder_layers": 2,
    "eos_token_id": 0, "extra_pos_embeddings": 24, "is_encoder_decoder": True, "max_length": 512,
    "max_position_embeddings": 32, "model_type": "marian", "normalize_before": False, "normalize_embedding": False,
    "num_beams": 4, "num_hidden_layers": 2, "pad_token_id": 23, "scale_embedding": True,
    "static_position_embeddings": True, "vocab_size": 24,
} | META  # fmt: skip


@dataclass
class Row:
    """One released config.json: `family` names how it runs (hf_compare's family, "modernbert", "embedding" or a
    seq2seq type), `cls` transformers' class it is compared with, `length` the input's."""

    name: str
    family: str
    config: dict
    changed: str = "-"  # what changed since issue 47 opened
    cls: str | None = None  # None: hf_compare's class of the family
    length: int = 7
    options: dict = field(default_factory=dict)  # from_pretrained's


ROWS = [
    Row("bert-base-uncased", "bert", BERT_BASE),
    Row("roberta-base", "roberta", ROBERTA_BASE),
    Row("xlm-roberta-base", "xlm-roberta", XLM_ROBERTA_BASE),
    Row("distilbert-base-uncased", "distilbert", DISTILBERT_BASE),
    Row("all-mpnet-base-v2", "mpnet", ALL_MPNET_BASE_V2),
    Row(
        "ModernBERT-base (masked-LM head)",
        "modernbert",
        MODERNBERT_BASE,
        cls="ModernBertForMaskedLM",
        length=9,
        options={"attn_implementation": "eager"},
    ),
    Row("gpt2", "gpt2", GPT2),
    Row(
        "stanford-crfm GPT-2 (scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn)",
        "gpt2",
        GPT2_CRFM,
        "was refused (scale_attn_by_inverse_layer_idx); loaded",
    ),
    Row("Llama-2-7b", "llama", LLAMA_2_7B),
    Row("Llama-3.2-1B (llama3 32)", "llama", LLAMA_3_2_1B),
    Row("vicuna-16k-like (dynamic 4, T 20 > max 16)", "llama", VICUNA_16K, length=20),
    Row(
        "Llama conversion: attention_bias true, mlp_bias false",
        "llama",
        LLAMA_CONVERTED,
        "was refused (mlp_bias); loaded",
    ),
    Row("Mistral-7B-v0.1 (window 3)", "mistral", MISTRAL_7B),
    Row("Qwen2.5-0.5B", "qwen2", QWEN2_5_0_5B),
    Row("Qwen2.5-7B-Instruct + its yarn block", "qwen2", QWEN2_5_YARN),
    Row("Qwen3-0.6B (head_dim 16 of hidden 32 / 4)", "qwen3", QWEN3_0_6B),
    Row("Qwen3-30B-A3B (4 experts, top-2)", "qwen3_moe", QWEN3_30B_A3B),
    Row(
        "Qwen3-MoE with attention_bias true",
        "qwen3_moe",
        QWEN3_30B_A3B | {"attention_bias": True},
        "was refused (attention_bias); loaded",
    ),
    Row("Mixtral-8x7B (4 experts, top-2)", "mixtral", MIXTRAL_8X7B),
    Row("bloom-560m", "bloom", BLOOM_560M),
    Row("Phi-3-mini-4k (window 5)", "phi3", PHI3_MINI_4K),
    Row(
        "Phi-3-mini-128k (longrope, original 8, T 14)",
        "phi3",
        PHI3_MINI_128K,
        "was 5.1e-7 / 2.5e-6 off on 5.25 (float32 long table); equal",
        length=14,
    ),
    Row("Phi-3-mini-128k first release (type su, T 14)", "phi3", PHI3_MINI_128K_SU, length=14),
    Row("phi-2", "phi", None),  # filled below from test_hf_options' released file
    Row("pythia-160m (rotary_pct 0.25)", "gpt_neox", GPT_NEOX_PYTHIA),
    Row("gemma-3-1b (5 local : 1 global)", "gemma3_text", GEMMA3_1B),
    Row("gemma-3-4b text (linear 8 global)", "gemma3_text", GEMMA3_4B),
    Row(
        "EmbeddingGemma-300m (bidirectional)",
        "embedding",
        EMBEDDING_GEMMA,
        "was refused (use_bidirectional_attention); loaded",
        cls="Gemma3TextModel",
        length=9,
        options={"attn_implementation": "eager"},
    ),
    Row("gemma-2-2b (caps 50, 30)", "gemma2", None),
    Row("OLMo-2-0425-1B", "olmo2", None),
    Row("SmolLM3-3B (NoPE every 4th layer)", "smollm3", None),
    Row("t5-small", "t5", T5_SMALL, cls="T5ForConditionalGeneration"),
    Row("flan-t5-small (d_kv x heads != d_model)", "t5", FLAN_T5_SMALL, cls="T5ForConditionalGeneration"),
    Row("bart-base", "bart", BART_BASE, cls="BartForConditionalGeneration"),
    Row("opus-mt-en-de", "marian", OPUS_MT, cls="MarianMTModel"),
]


def fill_released_files() -> None:
    """The rows whose released file test_hf_options already holds (phi-2, gemma-2-2b, OLMo 2, SmolLM3)."""
    from parity_tests import test_hf_options as O

    files = {"phi": O.PHI2_RELEASED, "gemma2": O.GEMMA2_2B_RELEASED} | O.RELEASED_2026
    for row in ROWS:
        if row.config is None:
            row.config = files[row.family]


def transformers_class(row: Row):
    return getattr(transformers, row.cls) if row.cls else H.CLASSES[row.family]


def build(row: Row, directory: Path, seed: int = 0):
    """The checkpoint of a row: transformers reads the released config.json, builds its class, draws the weights
    (hf_compare.build_tiny's way), save_pretrained writes them; config.json is then the released one again."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(row.config))
    config = transformers.AutoConfig.from_pretrained(directory)
    torch.manual_seed(seed)
    model = transformers_class(row)._from_config(config).float().eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
            p.copy_(1 + 0.2 * noise if name.endswith("weight") and p.ndim == 1 else 0.2 * noise if p.ndim == 1 else
                    H.STD * noise)  # fmt: skip
    model.save_pretrained(directory)
    (directory / "config.json").write_text(json.dumps(row.config))


def refused_key(message: str) -> str:
    """The config.json key a refusal names ("config.json: key=value is not supported"), else its first line."""
    found = re.search(r"config\.json: ([\w.\[\]-]+)=", message)
    return found.group(1) if found else message.splitlines()[0][:80]


def compare(row: Row, side: str, directory: Path) -> C.Result:
    """One side against transformers on the row's inputs: outputs and every gradient, a random upstream gradient."""
    if row.family in ("t5", "bart", "marian"):
        return H.compare_seq2seq(directory, row.family, np.float64, side)
    options = row.options | ({"experts_implementation": "eager"} if row.family in H.MOE_FAMILIES else {})
    theirs = transformers_class(row).from_pretrained(directory, dtype=torch.float64, **options).eval()
    if row.family in ("modernbert", "embedding"):  # a padded batch, its mask given; compared at the real tokens
        ours = M.load_ours(side, directory, np.float64)
        ids, mask = M.make_inputs(0, length=row.length)
        mlm = row.family == "modernbert"
        width = row.config["vocab_size" if mlm else "hidden_size"]
        upstream = np.random.default_rng(1000).standard_normal((*ids.shape, width)) * mask[..., None]
        with M.modernbert_in_float64() if mlm else H.gemma3_in_float64():
            theirs.zero_grad(set_to_none=True)
            out = theirs(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long())
            out = out.logits if mlm else out.last_hidden_state
            (out * torch.from_numpy(upstream)).sum().backward()
        theirs_out, theirs_grads = C.to_numpy(out), {n: C.to_numpy(p.grad) for n, p in theirs.named_parameters()}
        ours_out, ours_grads = (M.run_ours_mlm if mlm else M.run_ours)(ours, side, ids, mask, upstream)
        real = mask.astype(bool)
        return H.pair(ours_out[real], theirs_out[real], ours_grads, theirs_grads, "logits" if mlm else "hidden")
    ours = H.load_ours(side, directory, np.float64)
    ids, token_types = H.make_inputs(row.family, 0, length=row.length)
    width = row.config.get("hidden_size", row.config.get("dim")) if row.family in H.ENCODERS else 40
    upstream = np.random.default_rng(1000).standard_normal((*ids.shape, width))
    with H.patch_for(row.family, np.float64):
        theirs_out, theirs_grads = H.run_transformers(theirs, row.family, ids, token_types, upstream)
    run = H.run_numpy if side == "numpy" else H.run_torch
    ours_out, ours_grads = run(ours, row.family, ids, token_types, upstream)
    return H.pair(ours_out, theirs_out, ours_grads, theirs_grads, "hidden" if row.family in H.ENCODERS else "logits")


def measure(row: Row) -> dict:
    """The row's record: status ("loaded", "refused: KEY", "DIFFERENT", "transformers refuses: ..."), the largest
    relative output and gradient error over both sides, the number of gradients compared and of those all zero."""
    record = {"name": row.name, "changed": row.changed, "transformers": transformers.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        try:
            build(row, directory)
        except Exception as error:  # noqa: BLE001 (a file transformers itself cannot read: said in the table)
            return record | {"status": f"transformers refuses: {str(error).splitlines()[0][:80]}"}
        out_err = grad_err = 0.0
        different = []
        for side in SIDES:
            try:
                result = compare(row, side, directory)
            except ValueError as error:
                return record | {"status": f"refused: {refused_key(str(error))}", "message": str(error)[:300]}
            _, out_rel, _, grad_rel = C.worst(result, np.float64)
            out_err, grad_err = max(out_err, out_rel), max(grad_err, grad_rel)
            zero = [name for name, (ours, theirs) in result.grads.items() if not np.any(theirs)]
            different += C.failures(result, np.float64)
            record |= {"gradients": len(result.grads), "zero_gradients": zero}
    status = "DIFFERENT" if different or not np.isfinite([out_err, grad_err]).all() else "loaded"
    return record | {"status": status, "output_error": out_err, "gradient_error": grad_err}


def format_table(records: list[dict]) -> str:
    lines = [
        f"transformers {records[0]['transformers']}, float64, both sides (largest relative error over NumPy and torch)",
        "| released config.json (shrunk) | what changed since | loaded or refused | output error | gradient error |",
        "|---|---|---|---|---|",
    ]
    for r in records:
        errors = [f"{r[k]:.1e}" if k in r else "-" for k in ("output_error", "gradient_error")]
        lines.append(f"| {r['name']} | {r['changed']} | {r['status']} | {errors[0]} | {errors[1]} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("-k", help="only the rows whose name contains this")
    args = parser.parse_args(argv)
    fill_released_files()
    rows = [row for row in ROWS if args.k is None or args.k in row.name]
    records = [measure(row) for row in rows]
    print(format_table(records))
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1) + "\n")
    return int(any(r["status"] == "DIFFERENT" or r.get("zero_gradients") for r in records))


if __name__ == "__main__":
    sys.exit(main())
