"""transformers' own MarianMTModel as a user's model: a tiny random config (two layers each side, d_model 16),
the embeddings shared by the encoder, the decoder and the tied `lm_head` (`model.shared`), scaled by sqrt(d_model),
split-layout sinusoid positions, post-norm layers whose attentions register k_proj, v_proj, q_proj in that order,
`final_logits_bias` as a buffer, and `forward(input_ids, attention_mask, decoder_input_ids)` returning a
`Seq2SeqLMOutput`."""

import torch
from transformers import MarianConfig, MarianMTModel

LEVEL = "transformer"
CALL = None

CONFIG = dict(vocab_size=30, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
              decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
              pad_token_id=0, decoder_start_token_id=0, eos_token_id=2, scale_embedding=True,
              activation_function="swish")  # fmt: skip


def model() -> MarianMTModel:
    torch.manual_seed(0)
    return MarianMTModel(MarianConfig(**CONFIG))


# --- mistakes put in on purpose ---------------------------------------------------------------------------------


def wrong_scale() -> MarianMTModel:
    marian = model()
    marian.model.decoder.layers[0].encoder_attn.scaling = 8**-1  # 1 / head_dim, not 1 / sqrt(head_dim)
    return marian


def missing_scale() -> MarianMTModel:
    marian = model()
    marian.model.encoder.embed_scale = 1.0  # the encoder's embeddings not scaled by sqrt(d_model)
    return marian


MISTAKES = [
    (wrong_scale, "attention.wrong_scale", "model.decoder.layers.0.encoder_attn"),
    (missing_scale, "embedding.missing_scale", "model.encoder"),
]
