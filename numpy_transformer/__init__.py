"""The Transformer of "Attention Is All You Need" in plain NumPy, every backward pass by hand.

from numpy_transformer import TransformerConfig, Transformer, cross_entropy_forward, cross_entropy_backward

model = Transformer(TransformerConfig(), seed=0)
logits = model.forward(src_ids, tgt_in)                  # (B, T, V)
loss, cache = cross_entropy_forward(logits, tgt_out, ignore_index=config.pad_id)
model.zero_grad()
model.backward(cross_entropy_backward(cache))            # fills model.grads
"""

import sys

from transformer_spec import config

# The config lives in transformer_spec (shared with torch_transformer, no math); numpy_transformer.config is the
# same module under its old name, kept for code that imports it from there.
sys.modules[f"{__name__}.config"] = config

from transformer_spec.config import TransformerConfig
from transformer_spec.generation import GenerationConfig

from . import gradcheck
from .attention import (
    multi_head_attention_backward,
    multi_head_attention_forward,
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)
from .audio import SpeechTransformer
from .decoding import generate
from .deepseek_moe import deepseek_moe_backward, deepseek_moe_forward
from .flash_attention import flash_attention_backward, flash_attention_forward
from .gpt_oss_moe import (
    clamped_swiglu_backward,
    clamped_swiglu_forward,
    gpt_oss_moe_backward,
    gpt_oss_moe_forward,
    top_k_softmax_backward,
    top_k_softmax_forward,
)
from .latent_attention import latent_attention_backward, latent_attention_forward
from .loss import (
    cross_entropy_backward,
    cross_entropy_forward,
    multiple_negatives_ranking_loss_backward,
    multiple_negatives_ranking_loss_forward,
)
from .model import EncoderModel, Transformer, TransformerLM, parameter_shapes
from .moe import (
    load_balancing_loss_backward,
    load_balancing_loss_forward,
    sparse_moe_backward,
    sparse_moe_forward,
)
from .sinks import sink_attention_backward, sink_attention_forward, sink_softmax_backward, sink_softmax_forward

__all__ = [
    "TransformerConfig",
    "Transformer",
    "TransformerLM",
    "EncoderModel",
    "SpeechTransformer",
    "parameter_shapes",
    "multi_head_attention_forward",
    "multi_head_attention_backward",
    "scaled_dot_product_attention_forward",
    "scaled_dot_product_attention_backward",
    "flash_attention_forward",
    "flash_attention_backward",
    "cross_entropy_forward",
    "cross_entropy_backward",
    "multiple_negatives_ranking_loss_forward",
    "multiple_negatives_ranking_loss_backward",
    "sparse_moe_forward",
    "sparse_moe_backward",
    "load_balancing_loss_forward",
    "load_balancing_loss_backward",
    "sink_softmax_forward",
    "sink_softmax_backward",
    "sink_attention_forward",
    "sink_attention_backward",
    "top_k_softmax_forward",
    "top_k_softmax_backward",
    "clamped_swiglu_forward",
    "clamped_swiglu_backward",
    "gpt_oss_moe_forward",
    "gpt_oss_moe_backward",
    "latent_attention_forward",
    "latent_attention_backward",
    "deepseek_moe_forward",
    "deepseek_moe_backward",
    "generate",
    "GenerationConfig",
    "gradcheck",
]
