"""transformers' own BartForConditionalGeneration as a user's model: a tiny random config (two layers each side,
d_model 16), the token table shared by the encoder, the decoder and the tied `lm_head`, learned positions offset
by 2, a LayerNorm on the embeddings (`layernorm_embedding`), post-norm GELU layers whose attentions register
k_proj, v_proj, q_proj in that order, and `forward(input_ids, attention_mask, decoder_input_ids)` returning a
`Seq2SeqLMOutput`."""

import torch
from torch import nn
from transformers import BartConfig, BartForConditionalGeneration

LEVEL = "transformer"
CALL = None

CONFIG = dict(vocab_size=30, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
              decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
              pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)  # fmt: skip


def model() -> BartForConditionalGeneration:
    torch.manual_seed(0)
    return BartForConditionalGeneration(BartConfig(**CONFIG))


# --- mistakes put in on purpose ---------------------------------------------------------------------------------


def wrong_scale() -> BartForConditionalGeneration:
    bart = model()
    bart.model.encoder.layers[1].self_attn.scaling = 1.0  # the scores not scaled at all
    return bart


class UnbiasedLayerNorm(nn.LayerNorm):
    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True)  # n - 1
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


def unbiased_variance() -> BartForConditionalGeneration:
    bart = model()
    bart.model.decoder.layers[0].final_layer_norm.__class__ = UnbiasedLayerNorm
    return bart


MISTAKES = [
    (wrong_scale, "attention.wrong_scale", "model.encoder.layers.1.self_attn"),
    (unbiased_variance, "layer_norm.unbiased_variance", "model.decoder.layers.0.final_layer_norm"),
]
