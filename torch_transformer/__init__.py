"""The Transformer of "Attention Is All You Need" as a PyTorch user would write it.

The same model as `numpy_transformer`, with the same state-dict names, so one state dict loads into
either; autograd does the backward pass. Runs on any device and in float32 or float64, under bfloat16
autocast, and as one graph under `torch.compile(model, fullgraph=True)` (no value is read back from the
device in forward: `model.check_inputs` checks token ids on the CPU). Data-parallel training through
torchrun and DistributedDataParallel: `torch_transformer.distributed` (imported on its own).
"""

from transformer_spec.config import TransformerConfig
from transformer_spec.generation import GenerationConfig

from .attention import MultiHeadAttention, causal_mask, padding_mask
from .audio import SpeechTransformer
from .decoding import generate
from .deepseek_moe import DeepseekMoe, DeepseekRouter
from .gpt_oss_moe import GptOssExperts, GptOssFeedForward, GptOssRouter
from .latent_attention import LatentAttention
from .layers import Dropout, FeedForward, sinusoidal_table
from .loss import cross_entropy, multiple_negatives_ranking_loss
from .model import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    EncoderModel,
    Transformer,
    TransformerLM,
    dropout_site_shapes,
)
from .moe import Experts, SparseMoeBlock, TopKRouter, load_balancing_loss
from .sinks import sink_softmax

__all__ = [
    "TransformerConfig",
    "Transformer",
    "TransformerLM",
    "EncoderModel",
    "SpeechTransformer",
    "Encoder",
    "Decoder",
    "EncoderLayer",
    "DecoderLayer",
    "MultiHeadAttention",
    "FeedForward",
    "Dropout",
    "cross_entropy",
    "multiple_negatives_ranking_loss",
    "SparseMoeBlock",
    "TopKRouter",
    "Experts",
    "load_balancing_loss",
    "sink_softmax",
    "GptOssFeedForward",
    "GptOssRouter",
    "GptOssExperts",
    "LatentAttention",
    "DeepseekMoe",
    "DeepseekRouter",
    "sinusoidal_table",
    "dropout_site_shapes",
    "padding_mask",
    "causal_mask",
    "generate",
    "GenerationConfig",
]
