"""Hugging Face style: a small BERT-like encoder written as a `transformers` model. A `PretrainedConfig` subclass,
a `PreTrainedModel` with `_init_weights` and `post_init`, modules named as modeling_bert names them (embeddings with
word, position and token-type tables and a LayerNorm; `attention.self` with query/key/value, `attention.output`
with the residual and LayerNorm; `intermediate` / `output`), the padding mask as transformers' `attention_mask`
(1 = a real token) widened to an additive mask by the model, and `forward` returning a `BaseModelOutput`."""

import math

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_outputs import BaseModelOutput

LEVEL = "encoder"
CALL = None


class TinyBertConfig(PretrainedConfig):
    model_type = "tiny-bert-corpus"

    def __init__(
        self,
        vocab_size=30,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        hidden_act="gelu",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        max_position_embeddings=64,
        type_vocab_size=2,
        initializer_range=0.02,
        layer_norm_eps=1e-12,
        pad_token_id=0,
        **kwargs,
    ):
        super().__init__(pad_token_id=pad_token_id, **kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps


class TinyBertEmbeddings(nn.Module):
    """Construct the embeddings from word, position and token_type embeddings."""

    def __init__(self, config, norm=nn.LayerNorm):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = norm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        position_ids = torch.arange(config.max_position_embeddings).expand((1, -1))
        self.register_buffer("position_ids", position_ids, persistent=False)

    def forward(self, input_ids, token_type_ids=None):
        seq_length = input_ids.size(1)
        position_ids = self.position_ids[:, :seq_length]
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        embeddings = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        embeddings = embeddings + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(embeddings))


class TinyBertSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = int(config.hidden_size / config.num_attention_heads)
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.query = nn.Linear(config.hidden_size, self.all_head_size)
        self.key = nn.Linear(config.hidden_size, self.all_head_size)
        self.value = nn.Linear(config.hidden_size, self.all_head_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def transpose_for_scores(self, x):
        new_x_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        return x.view(new_x_shape).permute(0, 2, 1, 3)  # (batch, heads, seq, head size)

    def scale(self):
        return math.sqrt(self.attention_head_size)

    def forward(self, hidden_states, attention_mask=None):
        query_layer = self.transpose_for_scores(self.query(hidden_states))
        key_layer = self.transpose_for_scores(self.key(hidden_states))
        value_layer = self.transpose_for_scores(self.value(hidden_states))
        attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
        attention_scores = attention_scores / self.scale()
        if attention_mask is not None:
            attention_scores = attention_scores + attention_mask  # precomputed for all layers in the model's forward
        attention_probs = nn.functional.softmax(attention_scores, dim=-1)
        attention_probs = self.dropout(attention_probs)
        context_layer = torch.matmul(attention_probs, value_layer)
        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        new_context_layer_shape = context_layer.size()[:-2] + (self.all_head_size,)
        return context_layer.view(new_context_layer_shape)


class TinyBertSelfOutput(nn.Module):
    def __init__(self, config, norm=nn.LayerNorm):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = norm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dropout(self.dense(hidden_states))
        return self.LayerNorm(hidden_states + input_tensor)


class TinyBertAttention(nn.Module):
    def __init__(self, config, norm=nn.LayerNorm, self_attention=TinyBertSelfAttention):
        super().__init__()
        self.self = self_attention(config)
        self.output = TinyBertSelfOutput(config, norm)

    def forward(self, hidden_states, attention_mask=None):
        return self.output(self.self(hidden_states, attention_mask), hidden_states)


class TinyBertIntermediate(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states):
        return self.intermediate_act_fn(self.dense(hidden_states))


class TinyBertOutput(nn.Module):
    def __init__(self, config, norm=nn.LayerNorm):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = norm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dropout(self.dense(hidden_states))
        return self.LayerNorm(hidden_states + input_tensor)


class TinyBertLayer(nn.Module):
    def __init__(self, config, **parts):
        super().__init__()
        self.attention = TinyBertAttention(config, **parts)
        self.intermediate = TinyBertIntermediate(config)
        self.output = TinyBertOutput(config, parts.get("norm", nn.LayerNorm))

    def forward(self, hidden_states, attention_mask=None):
        attention_output = self.attention(hidden_states, attention_mask)
        return self.output(self.intermediate(attention_output), attention_output)


class TinyBertEncoder(nn.Module):
    def __init__(self, config, **parts):
        super().__init__()
        self.layer = nn.ModuleList([TinyBertLayer(config, **parts) for _ in range(config.num_hidden_layers)])

    def forward(self, hidden_states, attention_mask=None):
        for layer_module in self.layer:
            hidden_states = layer_module(hidden_states, attention_mask)
        return hidden_states


class TinyBertPreTrainedModel(PreTrainedModel):
    config_class = TinyBertConfig
    base_model_prefix = "bert"

    def _init_weights(self, module):
        """Initialize the weights"""
        if isinstance(module, nn.Linear):
            module.weight.data.normal_(mean=0.0, std=self.config.initializer_range)
            if module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.data.normal_(mean=0.0, std=self.config.initializer_range)
            if module.padding_idx is not None:
                module.weight.data[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            module.bias.data.zero_()
            module.weight.data.fill_(1.0)


class TinyBertModel(TinyBertPreTrainedModel):
    def __init__(self, config, **parts):
        super().__init__(config)
        self.config = config
        self.embeddings = TinyBertEmbeddings(config, parts.get("norm", nn.LayerNorm))
        self.encoder = TinyBertEncoder(config, **parts)
        self.post_init()

    def get_extended_attention_mask(self, attention_mask, dtype):
        """(batch, seq) with 1 = a real token -> (batch, 1, 1, seq), 0 where attended, dtype's min where not."""
        extended = attention_mask[:, None, None, :].to(dtype=dtype)
        return (1.0 - extended) * torch.finfo(dtype).min

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, return_dict=None):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        embedding_output = self.embeddings(input_ids, token_type_ids)
        extended_attention_mask = self.get_extended_attention_mask(attention_mask, embedding_output.dtype)
        sequence_output = self.encoder(embedding_output, extended_attention_mask)
        return BaseModelOutput(last_hidden_state=sequence_output)


def model(**parts) -> TinyBertModel:
    """The clean model: two layers, two heads, hidden 32, intermediate 64, vocabulary 30, two token types."""
    torch.manual_seed(0)
    return TinyBertModel(TinyBertConfig(), **parts).eval()


# --- mistakes put in on purpose ---------------------------------------------------------------------------------


class MaskPolarityFlipped(TinyBertModel):
    def get_extended_attention_mask(self, attention_mask, dtype):
        extended = attention_mask[:, None, None, :].to(dtype=dtype)
        return extended * torch.finfo(dtype).min  # the "1 -" forgotten: real tokens hidden, padding attended


class ScaledByHeadSize(TinyBertSelfAttention):
    def scale(self):
        return self.attention_head_size  # not its square root


class UnbiasedLayerNorm(nn.LayerNorm):
    """The old `BertLayerNorm` written by hand, with torch's unbiased variance."""

    def forward(self, x):
        u = x.mean(-1, keepdim=True)
        s = x.var(-1, keepdim=True)  # unbiased: / (n - 1)
        return self.weight * (x - u) / torch.sqrt(s + self.eps) + self.bias


def mask_inverted() -> TinyBertModel:
    torch.manual_seed(0)
    return MaskPolarityFlipped(TinyBertConfig()).eval()


def wrong_scale() -> TinyBertModel:
    return model(self_attention=ScaledByHeadSize)


def unbiased_variance() -> TinyBertModel:
    return model(norm=UnbiasedLayerNorm)


# (factory, the catalogue id the judge must name first, the submodule it must name)
MISTAKES = [
    (mask_inverted, "attention.mask_inverted", "encoder.layer.0.attention.self"),
    (wrong_scale, "attention.wrong_scale", "encoder.layer.0.attention.self"),
    (unbiased_variance, "layer_norm.unbiased_variance", "embeddings.LayerNorm"),
]
