"""Whisper's encoder-decoder (WhisperForConditionalGeneration) the way a PyTorch user writes it: two nn.Conv1d with
GELU over the log-mel frames, Whisper's fixed sinusoids as a buffer, then the project's pre-norm encoder layers;
the Transformer's decoder (learned positions, cross-attention) and an output projection tied to its token table.
Key projections without bias, as Whisper's. The NumPy twin is numpy_transformer.audio.

Shape letters: B batch, M mel bins, N frames (2 * source_positions), S = N / 2, D d_model, T target length.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_spec.config import TransformerConfig
from transformer_spec.shapes import check_speech_config, speech_parameter_shapes

from .layers import Dropout, make_norm
from .model import Decoder, EncoderLayer, Transformer, _Model, check_ids

POSITION_TABLE = "encoder.position_table"  # Whisper's encoder.embed_positions.weight: a buffer, no gradient


def whisper_sinusoids(length: int, channels: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """Whisper's encoder positions (length, channels): sin(t w_i) for the first half of the channels, cos(t w_i)
    for the second, w_i = 10000^(-i / (channels / 2 - 1))."""
    half = channels // 2
    frequencies = torch.exp(torch.arange(half, dtype=torch.float64) * (-math.log(10000.0) / (half - 1)))  # (D/2,)
    angles = torch.outer(torch.arange(length, dtype=torch.float64), frequencies)  # (length, D/2)
    return torch.cat([angles.sin(), angles.cos()], dim=1).to(dtype)


def drop_key_bias(module: nn.Module) -> None:
    """Every attention's k_proj replaced by one without bias (Whisper's), its weight kept."""
    for child in module.modules():
        k_proj = getattr(child, "k_proj", None)
        if isinstance(k_proj, nn.Linear) and k_proj.bias is not None:
            plain = nn.Linear(k_proj.in_features, k_proj.out_features, bias=False)
            plain.weight = k_proj.weight
            child.k_proj = plain


class AudioEncoder(nn.Module):
    """input_features (B, M, N) -> memory (B, S, D): conv1 and conv2 (stride 2), each followed by exact GELU, the
    frames turned into positions, the fixed sinusoids added, the encoder layers (no mask), the final LayerNorm."""

    position_table: Tensor  # (S, D), a buffer

    def __init__(self, config: TransformerConfig):
        super().__init__()
        D = config.d_model
        self.conv1 = nn.Conv1d(config.n_mels, D, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(D, D, kernel_size=3, stride=2, padding=1)
        self.register_buffer("position_table", whisper_sinusoids(config.source_positions, D))  # (S, D)
        self.embedding_dropout = Dropout(config.dropout_rates["embedding"])
        self.layers = nn.ModuleList([EncoderLayer(config, i) for i in range(config.n_encoder_layers)])
        self.final_norm = make_norm(config)

    def forward(self, input_features: Tensor, need_weights: bool = False) -> Tensor:
        h = F.gelu(self.conv1(input_features))  # (B, D, N)
        h = F.gelu(self.conv2(h))  # (B, D, S)
        x = self.embedding_dropout(h.transpose(1, 2) + self.position_table, None)  # (B, S, D)
        for layer in self.layers:
            x = layer(x, None, need_weights)
        return self.final_norm(x)


class SpeechTransformer(Transformer):
    """forward(input_features (B, n_mels, N), tgt_ids (B, T)) -> logits (B, T, V), N = 2 * config.source_positions
    (as transformers' WhisperEncoder requires). generate() takes the features in place of
    src_ids. The position table is the buffer `encoder.position_table` (in the state dict, without gradient)."""

    def __init__(self, config: TransformerConfig):
        check_speech_config(config)
        _Model.__init__(self, config)  # not Transformer's: the encoder reads features, not a token table
        self.encoder = AudioEncoder(config)  # type: ignore[assignment]
        self.decoder = Decoder(config, cross_attention=True)
        self._build_output_proj()
        drop_key_bias(self)

    @classmethod
    def shapes(cls, config: TransformerConfig, buffers: bool = False) -> dict:
        """The Transformer's parameters with the audio front end in place of the source token table; buffers: also
        the fixed position table (the buffer `encoder.position_table`)."""
        return speech_parameter_shapes(config, buffers)

    def check_source(self, input_features: Tensor) -> Tensor:
        """input_features checked: a floating tensor (B, n_mels, N); TypeError / ValueError naming it."""
        if not isinstance(input_features, Tensor) or not input_features.is_floating_point():
            raise TypeError(f"input_features must be a floating-point tensor, got {type(input_features).__name__}")
        expected = (self.config.n_mels, 2 * self.config.source_positions)
        if input_features.ndim != 3 or tuple(input_features.shape[1:]) != expected or input_features.shape[0] < 1:
            raise ValueError(
                f"input_features must have shape (B, {expected[0]}, {expected[1]}) (n_mels, then 2 * "
                f"source_positions frames), got {tuple(input_features.shape)}"
            )
        return input_features

    def encode_source(self, input_features: Tensor, attention_mask=None) -> tuple[Tensor, None]:
        """The encoder's output (B, S, D) and the cross-attention mask (None: every frame is read)."""
        if attention_mask is not None:
            raise ValueError("attention_mask: Whisper's encoder reads every frame; pass None")
        return self.encoder(input_features), None

    def forward(  # type: ignore[override]
        self,
        input_features: Tensor,
        tgt_ids: Tensor,
        dropout_masks=None,
        need_weights: bool = False,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """input_features (B, n_mels, N), tgt_ids (B, T) -> logits (B, T, V). dropout_masks and attention_mask must
        be None (dropout, when training, draws its own masks; Whisper masks no frame)."""
        self.check_source(input_features)
        check_ids("tgt_ids", tgt_ids, self.config.tgt_vocab_size, self.config.position_limit, None)
        if input_features.shape[0] != tgt_ids.shape[0]:
            raise ValueError(
                f"input_features and tgt_ids must have the same batch size, got {input_features.shape[0]} and "
                f"{tgt_ids.shape[0]}"
            )
        if dropout_masks is not None or attention_mask is not None:
            raise ValueError("dropout_masks and attention_mask: a SpeechTransformer takes neither; pass None")
        memory = self.encoder(input_features, need_weights)  # (B, S, D)
        x = self.decoder(tgt_ids, memory, None, need_weights)  # (B, T, D)
        return self.output_logits(x)  # (B, T, V)


__all__ = ["POSITION_TABLE", "AudioEncoder", "SpeechTransformer", "whisper_sinusoids"]
