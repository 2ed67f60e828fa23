"""Hugging Face style, decoder side: a small GPT-2 written as a `transformers` model. `Conv1D` layers (weights
stored (in, out), the transpose of nn.Linear's) with a fused `c_attn`, GPT-2's `gelu_new`, a registered causal
`bias` buffer filled with the dtype's minimum where masked, transformers' `attention_mask` (1 = a real token) widened
to an additive mask, the head tied to `wte`, and `forward(input_ids, attention_mask=None, labels=None)` returning a
`CausalLMOutput` (loss only when labels are given)."""

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_outputs import CausalLMOutput
from transformers.pytorch_utils import Conv1D

LEVEL = "transformer_lm"
CALL = None


class TinyGPT2Config(PretrainedConfig):
    model_type = "tiny-gpt2-corpus"

    def __init__(
        self,
        vocab_size=28,
        n_positions=32,
        n_embd=16,
        n_layer=2,
        n_head=2,
        activation_function="gelu_new",
        resid_pdrop=0.1,
        embd_pdrop=0.1,
        attn_pdrop=0.1,
        layer_norm_epsilon=1e-5,
        initializer_range=0.02,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.n_positions = n_positions
        self.n_embd = n_embd
        self.n_layer = n_layer
        self.n_head = n_head
        self.activation_function = activation_function
        self.resid_pdrop = resid_pdrop
        self.embd_pdrop = embd_pdrop
        self.attn_pdrop = attn_pdrop
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer_range = initializer_range


class TinyGPT2Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        max_positions = config.n_positions
        causal = torch.tril(torch.ones((max_positions, max_positions), dtype=torch.bool))
        self.register_buffer("bias", causal.view(1, 1, max_positions, max_positions), persistent=False)
        self.embed_dim = config.n_embd
        self.num_heads = config.n_head
        self.head_dim = self.embed_dim // self.num_heads
        self.c_attn = Conv1D(3 * self.embed_dim, self.embed_dim)
        self.c_proj = Conv1D(self.embed_dim, self.embed_dim)
        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

    def _split_heads(self, tensor):
        new_shape = tensor.size()[:-1] + (self.num_heads, self.head_dim)
        return tensor.view(new_shape).permute(0, 2, 1, 3)  # (batch, head, seq_length, head_features)

    def _merge_heads(self, tensor):
        tensor = tensor.permute(0, 2, 1, 3).contiguous()
        return tensor.view(tensor.size()[:-2] + (self.num_heads * self.head_dim,))

    def _scale(self, value):
        return value.size(-1) ** 0.5

    def _attn(self, query, key, value, attention_mask=None):
        attn_weights = torch.matmul(query, key.transpose(-1, -2)) / self._scale(value)
        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = self.bias[:, :, key_length - query_length : key_length, :key_length]
        mask_value = torch.finfo(attn_weights.dtype).min
        attn_weights = torch.where(causal_mask, attn_weights, torch.full([], mask_value, dtype=attn_weights.dtype))
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_weights = self.attn_dropout(attn_weights)
        return torch.matmul(attn_weights, value)

    def forward(self, hidden_states, attention_mask=None):
        query, key, value = self.c_attn(hidden_states).split(self.embed_dim, dim=2)
        query, key, value = self._split_heads(query), self._split_heads(key), self._split_heads(value)
        attn_output = self._merge_heads(self._attn(query, key, value, attention_mask))
        return self.resid_dropout(self.c_proj(attn_output))


class TinyGPT2MLP(nn.Module):
    def __init__(self, intermediate_size, config):
        super().__init__()
        self.c_fc = Conv1D(intermediate_size, config.n_embd)
        self.c_proj = Conv1D(config.n_embd, intermediate_size)
        self.act = ACT2FN[config.activation_function]
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, hidden_states):
        return self.dropout(self.c_proj(self.act(self.c_fc(hidden_states))))


class TinyGPT2Block(nn.Module):
    def __init__(self, config, attention=TinyGPT2Attention, norm=nn.LayerNorm):
        super().__init__()
        self.ln_1 = norm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = attention(config)
        self.ln_2 = norm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = TinyGPT2MLP(4 * config.n_embd, config)

    def forward(self, hidden_states, attention_mask=None):
        hidden_states = hidden_states + self.attn(self.ln_1(hidden_states), attention_mask)
        return hidden_states + self.mlp(self.ln_2(hidden_states))


class TinyGPT2PreTrainedModel(PreTrainedModel):
    config_class = TinyGPT2Config
    base_model_prefix = "transformer"

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, Conv1D, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=self.config.initializer_range)
            if getattr(module, "bias", None) is not None and not isinstance(module, nn.Embedding):
                module.bias.data.zero_()
        elif isinstance(module, nn.LayerNorm):
            module.bias.data.zero_()
            module.weight.data.fill_(1.0)


class TinyGPT2Model(nn.Module):
    def __init__(self, config, **parts):
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList([TinyGPT2Block(config, **parts) for _ in range(config.n_layer)])
        self.ln_f = parts.get("norm", nn.LayerNorm)(config.n_embd, eps=config.layer_norm_epsilon)

    def forward(self, input_ids, attention_mask=None):
        position_ids = torch.arange(input_ids.size(-1), device=input_ids.device).unsqueeze(0)
        hidden_states = self.drop(self.wte(input_ids) + self.wpe(position_ids))
        if attention_mask is not None:  # (batch, seq) 1/0 -> (batch, 1, 1, seq) 0/min, added to the scores
            attention_mask = attention_mask[:, None, None, :].to(dtype=hidden_states.dtype)
            attention_mask = (1.0 - attention_mask) * torch.finfo(hidden_states.dtype).min
        for block in self.h:
            hidden_states = block(hidden_states, attention_mask)
        return self.ln_f(hidden_states)


class TinyGPT2LMHeadModel(TinyGPT2PreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}

    def __init__(self, config, **parts):
        super().__init__(config)
        self.transformer = TinyGPT2Model(config, **parts)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.post_init()
        self.lm_head.weight = self.transformer.wte.weight  # tied, as GPT-2's

    def forward(self, input_ids=None, attention_mask=None, labels=None):
        logits = self.lm_head(self.transformer(input_ids, attention_mask))
        loss = None
        if labels is not None:  # shift so that tokens < n predict n
            shift_logits = logits[..., :-1, :].contiguous()
            shift_labels = labels[..., 1:].contiguous()
            loss = nn.functional.cross_entropy(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1))
        return CausalLMOutput(loss=loss, logits=logits)


def model(**parts) -> TinyGPT2LMHeadModel:
    """The clean model: two layers, two heads, n_embd 16, vocabulary 28, 32 positions."""
    torch.manual_seed(0)
    return TinyGPT2LMHeadModel(TinyGPT2Config(), **parts).eval()


# --- mistakes put in on purpose ---------------------------------------------------------------------------------


class ScaledByHeadSize(TinyGPT2Attention):
    def _scale(self, value):
        return value.size(-1)  # the head size, not its square root


class NoCausalMask(TinyGPT2Attention):
    def __init__(self, config):
        super().__init__(config)
        self.bias.fill_(True)  # every position may see every other: the future included


class UnbiasedLayerNorm(nn.LayerNorm):
    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True)  # unbiased: / (n - 1)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


def wrong_scale() -> TinyGPT2LMHeadModel:
    return model(attention=ScaledByHeadSize)


def not_causal() -> TinyGPT2LMHeadModel:
    return model(attention=NoCausalMask)


def unbiased_variance() -> TinyGPT2LMHeadModel:
    return model(norm=UnbiasedLayerNorm)


# (factory, the catalogue id the judge must name first, the submodule it must name)
MISTAKES = [
    (wrong_scale, "attention.wrong_scale", "transformer.h.0.attn"),
    (not_causal, "attention.not_causal", "transformer.h.0.attn"),
    (unbiased_variance, "layer_norm.unbiased_variance", "transformer.h.0.ln_1"),
]
