"""How 2026 training code wraps and runs its models (issue 46, round 6), in this project's own words: styles none of
the other corpus files uses. The judge meets them here first (measured with the judge frozen: what it said when it
first met each is in parity_tests/test_unseen.py's TODAY).

- a GPT whose blocks run under `torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)` when training,
  and also in evaluation while its `gradient_checkpointing` flag is on (the flag on here);
- a GPT whose attention core (scores, causal mask, softmax, values) is a `torch.jit.script`ed function, and a
  self-attention module scripted whole (`torch.jit.script(module)`, a RecursiveScriptModule), judged alone;
- a GPT whose every Linear weight is a `torch.nn.utils.parametrize` parametrization of two tensors: one learned
  number (the scale) times a unit-Frobenius-norm direction, equal to a plain Linear with the product as its weight;
- an LM held as an `nn.ParameterDict` (names with "__" for ".") and run by `torch.func.functional_call` on an
  architecture module that is not a registered submodule;
- a forward returning a dict {"logits", "hidden_states"}, and one returning a dataclass of its own;
- a remote-code-style Hugging Face model: its own `PretrainedConfig` and `PreTrainedModel` subclasses (a Llama-like
  decoder with its own names: backbone.token_table, backbone.stack.i.mixer.to_q ...), saved by `save_pretrained`
  and judged as the object `from_pretrained` gives back;
- a decoder-only model of `nn.MultiheadAttention` left at batch_first=False (run time-first) with the float
  additive causal mask of `nn.Transformer.generate_square_subsequent_mask`;
- multi-token prediction: one trunk, two heads (the next token, the one after), logits stacked (B, T, 2, V);
- value-residual attention (each later block's values averaged with the first block's) and differential attention
  (two softmaxes of half-width heads, the second taken off times a learned lambda): math the reference lacks;
- mistakes put into them, each at a second block: the checkpointed GPT's mask left off, the scripted core's softmax
  over the queries, the parametrized GPT's scores divided by sqrt(d_model), the dataclass LM's attention dropout on
  in evaluation, the remote-code Llama's K/V heads tiled, the time-first decoder's mask not passed.

(T5's relative bucket bias is left out: other corpus files hold it, and no level or keyword asks for it.)

First met: 14 of 19 right. Wrong then: the self-attention scripted whole (torch's own AttributeError from reading
the scripted class's source), both remote-code Llamas (an RMSNorm whose scale is named `gain` is not read as a norm,
so its layers are said to have none, the tiled K/V heads never reached), the two-head model (a "could not be called"
naming no failure, not the second head), the value residual (the right place, but its values said to be an input
"taken as it is"; blocks.0.attn not named). test_unseen.py's TODAY holds each with its cause.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from torch.nn.utils import parametrize
from torch.utils.checkpoint import checkpoint
from transformers import PretrainedConfig, PreTrainedModel

D, H, KV, V, T_MAX = 32, 4, 2, 26, 32
HD = D // H


def _future(T, device=None):
    """True where a query may not look: the keys after it."""
    return torch.ones(T, T, dtype=torch.bool, device=device).triu(1)


class Attention(nn.Module):
    """q, k, v and o Linears, written-out scores; the class attributes let a subclass put a mistake in."""

    causal, divisor, dropout_always = True, math.sqrt(HD), False

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))

    def heads(self, t):
        B, T, _ = t.shape
        return t.view(B, T, H, HD).transpose(1, 2)

    def mix(self, q, k, v):
        scores = q @ k.transpose(-1, -2) / self.divisor
        if self.causal:
            scores = scores.masked_fill(_future(q.shape[-2], q.device), float("-inf"))
        weights = F.dropout(scores.softmax(-1), 0.1, training=self.training or self.dropout_always)
        return weights @ v

    def forward(self, x):
        B, T, _ = x.shape
        y = self.mix(self.heads(self.q(x)), self.heads(self.k(x)), self.heads(self.v(x)))
        return self.o(y.transpose(1, 2).reshape(B, T, D))


class NotCausal(Attention):
    causal = False


class ByModelWidth(Attention):
    divisor = math.sqrt(D)


class AlwaysDropout(Attention):
    dropout_always = True


def _mlp():
    return nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))


class Block(nn.Module):
    def __init__(self, attention=Attention):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(D), attention(), nn.LayerNorm(D), _mlp()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Learned positions, two pre-norm blocks (the second's attention `second`), a final norm, an untied head."""

    def __init__(self, second=Attention, first=Attention):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T_MAX, D)
        self.blocks = nn.ModuleList([Block(first), Block(second)])
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)

    def run_block(self, block, x):
        return block(x)

    def states(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        states = [x]
        for block in self.blocks:
            states.append(self.run_block(block, states[-1]))
        return states

    def forward(self, ids):
        return self.head(self.ln_f(self.states(ids)[-1]))


# -- blocks under gradient checkpointing, in training and while a flag says so ---------------------------------------


class CheckpointedGPT(GPT):
    def __init__(self, second=Attention):
        super().__init__(second)
        self.gradient_checkpointing = True  # as `model.gradient_checkpointing_enable()` sets it

    def run_block(self, block, x):
        if self.training or self.gradient_checkpointing:
            return checkpoint(block, x, use_reentrant=False)
        return block(x)


def checkpointed_gpt(second=Attention) -> CheckpointedGPT:
    torch.manual_seed(0)
    return CheckpointedGPT(second)


# -- a torch.jit.script'ed attention core, and a module scripted whole ---------------------------------------------


@torch.jit.script
def scripted_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, dim: int) -> torch.Tensor:
    T = q.size(-2)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return torch.matmul(torch.softmax(scores.masked_fill(future, float("-inf")), dim=dim), v)


class ScriptedCoreAttention(Attention):
    axis = -1

    def mix(self, q, k, v):
        return scripted_core(q, k, v, HD**-0.5, self.axis)


class ScriptedOverQueries(ScriptedCoreAttention):
    axis = -2


def scripted_core_gpt(second=ScriptedCoreAttention) -> GPT:
    torch.manual_seed(0)
    return GPT(second, first=ScriptedCoreAttention)


class SelfAttention(nn.Module):
    """Query, key and value inputs (batch-first), no mask: scripted whole by its factory."""

    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(D, D) for _ in range(4))
        self.n_heads, self.head_dim = H, HD

    def split(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(t.shape[0], t.shape[1], self.n_heads, self.head_dim).transpose(1, 2)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.q_proj(query)), self.split(self.k_proj(key)), self.split(self.v_proj(value))
        weights = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim), dim=-1)
        return self.out_proj(torch.matmul(weights, v).transpose(1, 2).flatten(2))


def scripted_attention() -> torch.jit.ScriptModule:
    torch.manual_seed(0)
    return torch.jit.script(SelfAttention())


# -- every Linear weight a parametrization: one learned number times a unit-norm direction ---------------------------


class ScaleTimesDirection(nn.Module):
    """weight = scale * direction / ||direction|| (Frobenius): stored as `original0` (the scale, one number) and
    `original1` (the direction)."""

    def forward(self, scale, direction):
        return scale * direction / direction.norm()

    def right_inverse(self, weight):
        norm = weight.norm()
        return norm, weight / norm


def parametrized_gpt(second=Attention) -> GPT:
    torch.manual_seed(0)
    model = GPT(second)
    for module in model.blocks.modules():
        if isinstance(module, nn.Linear):
            parametrize.register_parametrization(module, "weight", ScaleTimesDirection())
    return model


# -- a parameter dict run by torch.func.functional_call ---------------------------------------------------------------


class FunctionalLM(nn.Module):
    """The weights are an nn.ParameterDict; the architecture a GPT kept outside the module tree (its own weights are
    never read: functional_call swaps every one for the dict's)."""

    def __init__(self):
        super().__init__()
        architecture = GPT()
        self.params = nn.ParameterDict(
            {n.replace(".", "__"): nn.Parameter(p.detach().clone()) for n, p in architecture.named_parameters()}
        )
        self.__dict__["architecture"] = architecture  # not a submodule

    def forward(self, ids):
        self.architecture.train(self.training)  # outside the tree, so .eval() does not reach it
        return functional_call(self.architecture, {n.replace("__", "."): p for n, p in self.params.items()}, (ids,))


def functional_lm() -> FunctionalLM:
    torch.manual_seed(0)
    return FunctionalLM()


# -- outputs: a dict, a dataclass ------------------------------------------------------------------------------------


class DictOutputGPT(GPT):
    hidden_first = False  # True: the dict's first key "hidden_states", the logits after them

    def forward(self, ids):
        states = self.states(ids)
        logits, hidden = self.head(self.ln_f(states[-1])), tuple(states)
        if self.hidden_first:
            return {"hidden_states": hidden, "logits": logits}
        return {"logits": logits, "hidden_states": hidden}


def dict_output_gpt(hidden_first=False) -> DictOutputGPT:
    torch.manual_seed(0)
    model = DictOutputGPT()
    model.hidden_first = hidden_first
    return model


@dataclass
class LMOutput:
    """As transformers orders its outputs: the loss first (None without labels)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


class DataclassGPT(GPT):
    def forward(self, ids, labels=None):
        states = self.states(ids)
        logits = self.head(self.ln_f(states[-1]))
        loss = None if labels is None else F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        return LMOutput(logits=logits, hidden_states=tuple(states), loss=loss)


def dataclass_gpt(second=Attention) -> DataclassGPT:
    torch.manual_seed(0)
    return DataclassGPT(second)


# -- remote code: a PretrainedConfig and a PreTrainedModel of its own, loaded by from_pretrained -----------------------


class TinyLlamaishConfig(PretrainedConfig):
    model_type = "tiny-llamaish-corpus"

    def __init__(
        self, vocab=V, width=D, n_head=H, n_kv=KV, depth=2, ffn=64, eps=1e-6, theta=10000.0, tiled_at=-1, **kwargs
    ):
        super().__init__(**kwargs)
        self.vocab, self.width, self.n_head, self.n_kv, self.depth = vocab, width, n_head, n_kv, depth
        self.ffn, self.eps, self.theta = ffn, eps, theta
        self.tiled_at = tiled_at  # the layer whose K/V heads are tiled (the mistake), -1: none


class Norm(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(config.width))
        self.eps = config.eps

    def forward(self, x):
        return self.gain * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def _rotate(x, theta):
    """Rotate-half RoPE over the last axis of (B, heads, T, HD), positions 0 .. T - 1."""
    half = x.shape[-1] // 2
    inv = 1.0 / theta ** (torch.arange(half, dtype=x.dtype, device=x.device) / half)
    angles = torch.arange(x.shape[-2], dtype=x.dtype, device=x.device)[:, None] * inv
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class Mixer(nn.Module):
    def __init__(self, config, tiled):
        super().__init__()
        self.to_q = nn.Linear(config.width, config.width, bias=False)
        self.to_k = nn.Linear(config.width, config.n_kv * HD, bias=False)
        self.to_v = nn.Linear(config.width, config.n_kv * HD, bias=False)
        self.to_o = nn.Linear(config.width, config.width, bias=False)
        self.n_head, self.n_kv, self.theta, self.tiled = config.n_head, config.n_kv, config.theta, tiled

    def forward(self, x):
        B, T, _ = x.shape
        q = _rotate(self.to_q(x).view(B, T, self.n_head, HD).transpose(1, 2), self.theta)
        k = _rotate(self.to_k(x).view(B, T, self.n_kv, HD).transpose(1, 2), self.theta)
        v = self.to_v(x).view(B, T, self.n_kv, HD).transpose(1, 2)
        group = self.n_head // self.n_kv
        widen = (lambda t: t.repeat(1, group, 1, 1)) if self.tiled else (lambda t: t.repeat_interleave(group, 1))
        y = F.scaled_dot_product_attention(q, widen(k), widen(v), is_causal=True)
        return self.to_o(y.transpose(1, 2).reshape(B, T, -1))


class Layer(nn.Module):
    def __init__(self, config, index):
        super().__init__()
        self.pre_mix_norm, self.mixer = Norm(config), Mixer(config, index == config.tiled_at)
        self.pre_ffn_norm = Norm(config)
        self.gate = nn.Linear(config.width, config.ffn, bias=False)
        self.up = nn.Linear(config.width, config.ffn, bias=False)
        self.down = nn.Linear(config.ffn, config.width, bias=False)

    def forward(self, x):
        x = x + self.mixer(self.pre_mix_norm(x))
        h = self.pre_ffn_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Backbone(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.token_table = nn.Embedding(config.vocab, config.width)
        self.stack = nn.ModuleList([Layer(config, i) for i in range(config.depth)])
        self.out_norm = Norm(config)

    def forward(self, input_ids):
        x = self.token_table(input_ids)
        for layer in self.stack:
            x = layer(x)
        return self.out_norm(x)


class TinyLlamaishForCausalLM(PreTrainedModel):
    config_class = TinyLlamaishConfig
    base_model_prefix = "backbone"

    def __init__(self, config):
        super().__init__(config)
        self.backbone = Backbone(config)
        self.lm_out = nn.Linear(config.width, config.vocab, bias=False)
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=0.02)

    def forward(self, input_ids, attention_mask=None):
        return {"logits": self.lm_out(self.backbone(input_ids))}


def remote_llama(tiled_at=-1) -> TinyLlamaishForCausalLM:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as directory:
        TinyLlamaishForCausalLM(TinyLlamaishConfig(tiled_at=tiled_at)).save_pretrained(directory)
        return TinyLlamaishForCausalLM.from_pretrained(directory)


# -- time-first: nn.MultiheadAttention(batch_first=False), generate_square_subsequent_mask ---------------------------


class TimeFirstBlock(nn.Module):
    def __init__(self, masked=True):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(D), nn.MultiheadAttention(D, H)  # batch_first=False: (T, B, D)
        self.ln_2, self.mlp = nn.LayerNorm(D), _mlp()
        self.masked = masked  # False: the mistake, the mask not passed

    def forward(self, x, mask):
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask if self.masked else None, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class TimeFirstLM(nn.Module):
    def __init__(self, second_masked=True):
        super().__init__()
        self.embed, self.pos = nn.Embedding(V, D), nn.Embedding(T_MAX, D)
        self.blocks = nn.ModuleList([TimeFirstBlock(), TimeFirstBlock(second_masked)])
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, V)

    def forward(self, ids):
        T = ids.shape[1]
        x = (self.embed(ids) + self.pos(torch.arange(T, device=ids.device))).transpose(0, 1)
        mask = nn.Transformer.generate_square_subsequent_mask(T, device=ids.device, dtype=x.dtype)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln_f(x)).transpose(0, 1)


def time_first_lm(second_masked=True) -> TimeFirstLM:
    torch.manual_seed(0)
    return TimeFirstLM(second_masked)


# -- multi-token prediction: one trunk, a head for the next token and one for the token after ------------------------


class TwoHeadGPT(GPT):
    def __init__(self):
        super().__init__()
        del self.head
        self.heads = nn.ModuleList([nn.Linear(D, V, bias=False) for _ in range(2)])

    def forward(self, ids):
        h = self.ln_f(self.states(ids)[-1])
        return torch.stack([head(h) for head in self.heads], dim=2)  # (B, T, 2, V): t + 1, t + 2


def two_head_gpt() -> TwoHeadGPT:
    torch.manual_seed(0)
    return TwoHeadGPT()


# -- value residual, differential attention ---------------------------------------------------------------------------


class ValueResidualAttention(Attention):
    """ResFormer's value residual: given the first block's values, this block's are averaged with them."""

    def forward(self, x, first=None):
        B, T, _ = x.shape
        v = self.heads(self.v(x))
        y = self.mix(self.heads(self.q(x)), self.heads(self.k(x)), v if first is None else (v + first) / 2)
        return self.o(y.transpose(1, 2).reshape(B, T, D)), v


class ValueResidualBlock(Block):
    def forward(self, x, first=None):
        mixed, v = self.attn(self.ln_1(x), first)
        x = x + mixed
        return x + self.mlp(self.ln_2(x)), v


class ValueResidualGPT(GPT):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([ValueResidualBlock(ValueResidualAttention) for _ in range(2)])

    def states(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        states, first = [x], None
        for block in self.blocks:
            x, v = block(states[-1], first)
            first = v if first is None else first
            states.append(x)
        return states


def value_residual_gpt() -> ValueResidualGPT:
    torch.manual_seed(0)
    return ValueResidualGPT()


class DifferentialAttention(Attention):
    """Each head's q and k split in halves: softmax(q1 k1) - lam * softmax(q2 k2), applied to the head's values."""

    def __init__(self):
        super().__init__()
        self.lam = nn.Parameter(torch.tensor(0.8))

    def mix(self, q, k, v):
        future = _future(q.shape[-2], q.device)
        q1, q2 = q.chunk(2, -1)
        k1, k2 = k.chunk(2, -1)
        w1, w2 = ((a @ b.transpose(-1, -2) / math.sqrt(HD // 2)).masked_fill(future, float("-inf")) for a, b in
                  ((q1, k1), (q2, k2)))  # fmt: skip
        return (w1.softmax(-1) - self.lam * w2.softmax(-1)) @ v


def differential_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(DifferentialAttention, first=DifferentialAttention)


CASES = [
    ("flagged_checkpoint_gpt", checkpointed_gpt, "transformer_lm", {}, "pass"),
    (
        "flagged_checkpoint_gpt.not_causal_second_block",
        lambda: checkpointed_gpt(NotCausal),
        "transformer_lm",
        {},
        ("mistake", "attention.not_causal", "blocks.1.attn"),
    ),
    ("scripted_core_gpt", scripted_core_gpt, "transformer_lm", {}, "pass"),
    (
        "scripted_core_gpt.softmax_wrong_axis_second_block",
        lambda: scripted_core_gpt(ScriptedOverQueries),
        "transformer_lm",
        {},
        ("mistake", "attention.softmax_wrong_axis", "blocks.1.attn"),
    ),
    ("scripted_attention", scripted_attention, "multi_head_attention", {}, "pass"),
    ("parametrized_gpt", parametrized_gpt, "transformer_lm", {}, "pass"),
    (
        "parametrized_gpt.scaled_by_model_width_second_block",
        lambda: parametrized_gpt(ByModelWidth),
        "transformer_lm",
        {},
        ("mistake", "attention.wrong_scale", "blocks.1.attn"),
    ),
    ("functional_call_lm", functional_lm, "transformer_lm", {}, "pass"),
    ("dict_output_gpt", dict_output_gpt, "transformer_lm", {}, "pass"),
    (
        "dict_output_gpt.hidden_states_first",
        lambda: dict_output_gpt(hidden_first=True),
        "transformer_lm",
        {},
        "pass",
    ),
    ("dataclass_gpt", dataclass_gpt, "transformer_lm", {}, "pass"),
    (
        "dataclass_gpt.dropout_active_in_eval_second_block",
        lambda: dataclass_gpt(AlwaysDropout),
        "transformer_lm",
        {},
        ("mistake", "dropout.active_in_eval", "blocks.1.attn"),
    ),
    ("remote_llama", remote_llama, "transformer_lm", {}, "pass"),
    (
        "remote_llama.kv_heads_tiled_second_block",
        lambda: remote_llama(tiled_at=1),
        "transformer_lm",
        {},
        ("mistake", "attention.kv_heads_tiled", "backbone.stack.1.mixer"),
    ),
    ("time_first_mha_lm", time_first_lm, "transformer_lm", {}, "pass"),
    (
        "time_first_mha_lm.not_causal_second_block",
        lambda: time_first_lm(second_masked=False),
        "transformer_lm",
        {},
        ("mistake", "attention.not_causal", "blocks.1.attn"),
    ),
    ("two_head_gpt", two_head_gpt, "transformer_lm", {}, ("no pair", "heads.1", "heads.1")),
    ("value_residual_gpt", value_residual_gpt, "transformer_lm", {}, ("no pair", "blocks.1.attn", "blocks.0.attn")),
    ("differential_gpt", differential_gpt, "transformer_lm", {}, ("no pair", "blocks.0.attn", "lam")),
]
