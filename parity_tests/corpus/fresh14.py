"""The PyTorch APIs of 2025-26 as people use them in training code (issue 46, round 9), in this project's own words:
styles none of the other corpus files uses. The judge meets them here first (measured with the judge frozen: what it
said when it first met each is in parity_tests/test_unseen.py's TODAY).

- a GPT whose attention is FlexAttention (`torch.nn.attention.flex_attention.flex_attention`), with a causal
  `score_mod` and with a `block_mask` from `create_block_mask`. In this torch it runs eagerly on CPU in float64 and
  float32 (unfused, the full scores materialised; it matches SDPA's causal attention to 4e-16 in float64), but its
  backward raises on CPU ("FlexAttention does not support backward on CPU"): a judge that compares gradients
  cannot judge it here, and a demanding user expects to be told so, naming the backward, not a mistake;
- a GPT handed over as the GraphModule `torch.fx.symbolic_trace` made of it (every custom module's forward inlined
  into the root's graph, only the nn.Linear / nn.LayerNorm / nn.Embedding leaves still called as modules);
- a Llama handed over as `torch.export.export(model, (ids,), dynamic_shapes=...).module()` (batch and length
  dynamic; every op, the Linears' included, inlined into one graph; the parameters kept under their names);
- an LM built of `nn.TransformerEncoderLayer(norm_first=True, batch_first=True)` layers called with a causal mask
  (`is_causal=True`) and a final LayerNorm; and one of `batch_first=False`, `activation="gelu"`, post-norm layers
  fed (T, B, D) with a float causal mask;
- a weight-only int8 Llama: each projection holds an int8 `qweight` buffer and a per-row `scale` buffer, and the
  forward computes `F.linear(x, self.qweight.to(x.dtype) * self.scale)`. A demanding user expects the judge to read
  the dequantized weight as the projection's weight (it is exactly what the forward multiplies by) and to pass
  it: the reference's weights are set to those values; the projections hold no parameters, so only the embeddings' and
  norms' gradients are compared;
- a GPT whose positions are added by a forward hook on its token table (`wte.register_forward_hook`) and whose
  final norm is applied by a forward pre-hook on its head: the math is the plain GPT's;
- a Llama whose forward is `forward(ids, past_key_values=None, use_cache=True)` and returns (logits, cache), the
  rotary positions counted from the cache's length (0 with no cache);
- a GPT whose attention calls `F.multi_head_attention_forward` directly with separate q/k/v weights held as
  Parameters (`use_separate_proj_weight=True`), one packed in-proj bias, and the causal mask as `attn_mask`;
- a Llama whose attention projections are under `parametrizations.spectral_norm` and whose MLP under
  `parametrizations.weight_norm`: in eval the effective weight (W / sigma from the stored power-iteration vectors,
  g v / |v|) is what the forward multiplies by, and what a demanding user expects judged (pass);
- catalogued mistakes put inside these whole models, each named where it sits: a wrong scale in the traced GPT's
  second block (the place a user names is `blocks.1.attn`, though fx has inlined its forward), the softmax over the
  queries in the exported Llama's second layer, the second encoder layer called without the causal mask, silu on
  up and K/V heads tiled in the int8 Llama's second layer, attention dropout left on in eval in the hooked GPT's
  second block, RoPE on the values in the cached Llama's second layer, eps outside the root in the spectral
  Llama's second input norm, the second MHA-forward block given no mask.

First met: 14 of 20 right. Wrong then:
- fx_traced_gpt.wrong_scale_second_block: FAILED, "unexplained: (the module): ... no catalogue variant reproduces
  it", no id and no named op (the traced GPT itself passes: fx leaves the judge the Linears' and norms' modules, but
  the attention's ops now run in the root GraphModule, so no hook places them at blocks.1.attn);
- exported_llama and its softmax over the queries: "could not judge: the number of heads cannot be read from the
  recorded forward: pass n_heads=" (with n_heads=4 given: "found 5 norms in the module, the reference
  'transformer_lm' has 1; pass mapping=": every op of the exported graph runs in the root, no submodule is called);
- int8_llama and its two mistakes: "differs at layers.0.self_attn: the attention's queries and keys and values are
  no projection's output ..., which the reference has no pair for": F.linear of a weight the forward computes
  (`qweight.to(x.dtype) * scale`) is not read as a projection.

The two FlexAttention cases are counted right: "could not judge: the module's forward could not be recorded ... (its
forward raised NotImplementedError: FlexAttention does not support backward on CPU ...)"; its closing advice "pass
call= (how to call it) or mapping= (the weight map)" would not help (no call or map makes the backward run on CPU).

Since (check/graphs.py): a GraphModule whose nodes name the modules their ops ran in (node.meta["nn_module_stack"],
fx's and export's) is re-exported with dynamic sizes and unflattened (torch.export.unflatten), and judged as that
hierarchy: the traced GPT's scale and the exported Llama's softmax are named at blocks.1.attn and
layers.1.self_attn, the exported Llama passes. FlexAttention's answer now says what would settle it: its backward
(on CUDA), or the model with scaled_dot_product_attention in its place.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations

D, H, KV, V, T_MAX = 32, 4, 2, 26, 16
HD = D // H
F_FF = 64


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases moved off their 1s and 0s, so that trained values are what is checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def _rope(x: torch.Tensor, start: int = 0, base: float = 10000.0) -> torch.Tensor:
    """Rotary in halves (rotate_half) of x (B, h, T, Dh) at positions start .. start + T - 1."""
    T, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=x.dtype) / d)
    angles = torch.outer(torch.arange(start, start + T, dtype=x.dtype), inv)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], -1) * sin


class RMSNorm(nn.Module):
    def __init__(self, eps_outside=False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(D))
        self.eps = 1e-6
        self.eps_outside = eps_outside  # the mistake: x / (sqrt(mean x^2) + eps)

    def forward(self, x):
        if self.eps_outside:
            return self.weight * x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.eps)
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


# -- a plain pre-LN GPT, its attention chosen: hand-written, FlexAttention, MHA-forward -------------------------------


class HandAttention(nn.Module):
    """Causal attention from a fused c_attn; written for fx (no unpacking of shapes), `scale` and dropout chosen."""

    def __init__(self, scale=HD**-0.5, dropout_in_eval=False):
        super().__init__()
        self.c_attn = nn.Linear(D, 3 * D)
        self.c_proj = nn.Linear(D, D)
        self.scale, self.dropout_in_eval = scale, dropout_in_eval

    def forward(self, x):
        B, T = x.shape[0], x.shape[1]
        q, k, v = self.c_attn(x).split(D, dim=2)
        q, k, v = (t.view(B, T, H, HD).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * self.scale
        keep = torch.ones_like(att[0, 0], dtype=torch.bool).tril()  # made from the scores: fx traces it
        att = att.masked_fill(~keep, float("-inf")).softmax(dim=-1)
        att = F.dropout(att, 0.1, training=True) if self.dropout_in_eval else att  # the mistake: on in eval
        return self.c_proj((att @ v).transpose(1, 2).reshape(B, T, D))


def _causal_score(score, b, h, q_idx, kv_idx):
    return torch.where(q_idx >= kv_idx, score, -float("inf"))


def _causal_keep(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


class FlexAttention(nn.Module):
    """Causal attention by FlexAttention: a score_mod, or a block mask built for the length."""

    def __init__(self, block_mask=False):
        super().__init__()
        self.c_attn = nn.Linear(D, 3 * D)
        self.c_proj = nn.Linear(D, D)
        self.block_mask = block_mask

    def forward(self, x):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        B, T, _ = x.shape
        q, k, v = (t.view(B, T, H, HD).transpose(1, 2) for t in self.c_attn(x).split(D, dim=2))
        if self.block_mask:
            mask = create_block_mask(_causal_keep, None, None, T, T, device=x.device.type)
            out = flex_attention(q, k, v, block_mask=mask)
        else:
            out = flex_attention(q, k, v, score_mod=_causal_score)
        return self.c_proj(out.transpose(1, 2).reshape(B, T, D))


class MhaForwardAttention(nn.Module):
    """`F.multi_head_attention_forward` on separate q/k/v weights held as Parameters, (T, B, D) inside."""

    def __init__(self, causal=True):
        super().__init__()
        self.q_proj_weight = nn.Parameter(torch.randn(D, D) / math.sqrt(D))
        self.k_proj_weight = nn.Parameter(torch.randn(D, D) / math.sqrt(D))
        self.v_proj_weight = nn.Parameter(torch.randn(D, D) / math.sqrt(D))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * D))
        self.out_proj = nn.Linear(D, D)
        self.causal = causal  # the mistake (False): no attn_mask given

    def forward(self, x):
        T = x.shape[1]
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1) if self.causal else None
        seq = x.transpose(0, 1)
        out, _ = F.multi_head_attention_forward(
            seq, seq, seq, D, H, None, self.in_proj_bias, None, None, False, 0.0,
            self.out_proj.weight, self.out_proj.bias, training=self.training, need_weights=False,
            attn_mask=mask, use_separate_proj_weight=True, q_proj_weight=self.q_proj_weight,
            k_proj_weight=self.k_proj_weight, v_proj_weight=self.v_proj_weight,
        )  # fmt: skip
        return out.transpose(0, 1)


class Block(nn.Module):
    def __init__(self, attn: nn.Module):
        super().__init__()
        self.ln_1 = nn.LayerNorm(D)
        self.attn = attn
        self.ln_2 = nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, first: nn.Module, second: nn.Module):
        super().__init__()
        self.wte = nn.Embedding(V, D)
        self.wpe = nn.Embedding(T_MAX, D)
        self.blocks = nn.ModuleList([Block(first), Block(second)])
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def flex_gpt(block_mask=False) -> GPT:
    torch.manual_seed(0)
    return _jitter(GPT(FlexAttention(block_mask), FlexAttention(block_mask)))


def traced_gpt(second_scale=HD**-0.5) -> nn.Module:
    """The GPT through `torch.fx.symbolic_trace`: a GraphModule."""
    torch.manual_seed(0)
    model = _jitter(GPT(HandAttention(), HandAttention(second_scale)))
    return torch.fx.symbolic_trace(model)


def mha_forward_gpt(second_causal=True) -> GPT:
    torch.manual_seed(0)
    return _jitter(GPT(MhaForwardAttention(), MhaForwardAttention(second_causal)))


# -- a GPT with hooks: positions added by a forward hook on wte, the final norm by a pre-hook on the head ----------


class HookedGPT(nn.Module):
    def __init__(self, dropout_second=False):
        super().__init__()
        self.wte = nn.Embedding(V, D)
        self.wpe = nn.Parameter(0.02 * torch.randn(T_MAX, D))
        self.blocks = nn.ModuleList([Block(HandAttention()), Block(HandAttention(dropout_in_eval=dropout_second))])
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)
        self.wte.register_forward_hook(self._add_positions)
        self.head.register_forward_pre_hook(self._final_norm)

    def _add_positions(self, module, inputs, out):
        return out + self.wpe[: out.shape[1]]

    def _final_norm(self, module, args):
        return (self.ln_f(args[0]),)

    def forward(self, idx):
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def hooked_gpt(dropout_second=False) -> HookedGPT:
    torch.manual_seed(0)
    return _jitter(HookedGPT(dropout_second))


# -- Llamas: exported, int8 weight-only, with a cache, under spectral_norm --------------------------------------------


class QuantLinear(nn.Module):
    """Weight-only int8: an int8 qweight and a per-row scale, dequantized in the forward."""

    def __init__(self, d_in, d_out):
        super().__init__()
        w = torch.randn(d_out, d_in) / math.sqrt(d_in)
        scale = w.abs().amax(1, keepdim=True) / 127
        self.register_buffer("qweight", torch.round(w / scale).to(torch.int8))
        self.register_buffer("scale", scale)

    def forward(self, x):
        return F.linear(x, self.qweight.to(x.dtype) * self.scale)


def _linear(d_in, d_out, kind="plain"):
    if kind == "int8":
        return QuantLinear(d_in, d_out)
    linear = nn.Linear(d_in, d_out, bias=False)
    if kind == "spectral":
        return parametrizations.spectral_norm(linear)
    if kind == "weight":
        return parametrizations.weight_norm(linear)
    return linear


class LlamaAttention(nn.Module):
    """GQA (KV heads repeat_interleave'd), RoPE in halves at positions from `start`; the mistakes chosen by flags."""

    def __init__(self, kind="plain", tiled=False, over_queries=False, rope_v=False):
        super().__init__()
        self.q_proj, self.o_proj = _linear(D, D, kind), _linear(D, D, kind)
        self.k_proj, self.v_proj = _linear(D, KV * HD, kind), _linear(D, KV * HD, kind)
        self.tiled, self.over_queries, self.rope_v = tiled, over_queries, rope_v

    def forward(self, x, past=None):
        B, T = x.shape[0], x.shape[1]
        start = 0 if past is None else past[0].shape[2]
        q = _rope(self.q_proj(x).view(B, T, H, HD).transpose(1, 2), start)
        k = _rope(self.k_proj(x).view(B, T, KV, HD).transpose(1, 2), start)
        v = self.v_proj(x).view(B, T, KV, HD).transpose(1, 2)
        v = _rope(v, start) if self.rope_v else v  # the mistake: the values turned too
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        cache = (k, v)
        if self.tiled:  # the mistake: .repeat tiles the K/V heads (0, 1, 0, 1) instead of (0, 0, 1, 1)
            k, v = k.repeat(1, H // KV, 1, 1), v.repeat(1, H // KV, 1, 1)
        else:
            k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(HD)
        S = k.shape[2]
        hidden = torch.ones(T, S, dtype=torch.bool, device=x.device).triu(S - T + 1)
        weights = scores.masked_fill(hidden, float("-inf")).softmax(-2 if self.over_queries else -1)
        return self.o_proj((weights @ v).transpose(1, 2).reshape(B, T, D)), cache


class LlamaMLP(nn.Module):
    def __init__(self, kind="plain", on_up=False):
        super().__init__()
        self.gate_proj, self.up_proj = _linear(D, F_FF, kind), _linear(D, F_FF, kind)
        self.down_proj = _linear(F_FF, D, kind)
        self.on_up = on_up  # the mistake: silu on up instead of the gate

    def forward(self, x):
        if self.on_up:
            return self.down_proj(self.gate_proj(x) * F.silu(self.up_proj(x)))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    def __init__(self, attn: LlamaAttention, mlp: LlamaMLP, eps_outside=False):
        super().__init__()
        self.input_layernorm = RMSNorm(eps_outside)
        self.self_attn = attn
        self.post_attention_layernorm = RMSNorm()
        self.mlp = mlp

    def forward(self, x, past=None):
        a, cache = self.self_attn(self.input_layernorm(x), past)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), cache


class Llama(nn.Module):
    def __init__(self, first: LlamaLayer, second: LlamaLayer):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([first, second])
        self.norm = RMSNorm()
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x, _ = layer(x)
        return self.lm_head(self.norm(x))


class CachedLlama(Llama):
    """forward(ids, past_key_values=None, use_cache=True) -> (logits, cache or None)."""

    def forward(self, input_ids, past_key_values=None, use_cache=True):
        x = self.embed_tokens(input_ids)
        caches = []
        for i, layer in enumerate(self.layers):
            x, cache = layer(x, None if past_key_values is None else past_key_values[i])
            caches.append(cache)
        return self.lm_head(self.norm(x)), (tuple(caches) if use_cache else None)


def _llama(cls=Llama, kind="plain", eps_outside_second=False, on_up=False, **second) -> Llama:
    """Two layers; `second` the flags of the second attention (its mistakes), `on_up` its MLP's."""
    torch.manual_seed(0)
    mlp_kind = "weight" if kind == "spectral" else kind
    first = LlamaLayer(LlamaAttention(kind), LlamaMLP(mlp_kind))
    second_layer = LlamaLayer(LlamaAttention(kind, **second), LlamaMLP(mlp_kind, on_up), eps_outside_second)
    return _jitter(cls(first, second_layer))


def int8_llama(on_up=False, tiled=False) -> Llama:
    return _llama(kind="int8", on_up=on_up, tiled=tiled)


def cached_llama(rope_v=False) -> Llama:
    return _llama(CachedLlama, rope_v=rope_v)


def spectral_llama(eps_outside=False) -> Llama:
    model = _llama(kind="spectral", eps_outside_second=eps_outside)
    with torch.no_grad():  # a few training-mode forwards, so the power iteration's vectors have settled
        model.train()
        for _ in range(3):
            model(torch.randint(0, V, (2, 5)))
    return model.eval()


def exported_llama(over_queries=False) -> nn.Module:
    """The Llama through `torch.export.export(...).module()`, batch and length dynamic."""
    model = _llama(over_queries=over_queries)
    batch, length = torch.export.Dim("batch", max=64), torch.export.Dim("length", min=2, max=T_MAX)
    ids = torch.randint(0, V, (2, 5))
    program = torch.export.export(model, (ids,), dynamic_shapes=({0: batch, 1: length},))
    return program.module()


# -- LMs of nn.TransformerEncoderLayer ---------------------------------------------------------------------------------


class EncoderLayerLM(nn.Module):
    """norm_first=True, batch_first=True layers called with a causal mask, a final LayerNorm; `unmasked_second`:
    the mistake, the second layer called without the mask."""

    def __init__(self, unmasked_second=False):
        super().__init__()
        self.tok = nn.Embedding(V, D)
        self.pos = nn.Embedding(T_MAX, D)
        self.layers = nn.ModuleList(
            [nn.TransformerEncoderLayer(D, H, 4 * D, 0.1, batch_first=True, norm_first=True) for _ in range(2)]
        )
        self.norm = nn.LayerNorm(D)
        self.out = nn.Linear(D, V)
        self.unmasked_second = unmasked_second

    def forward(self, ids):
        T = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(T, device=ids.device))
        mask = nn.Transformer.generate_square_subsequent_mask(T, device=ids.device, dtype=x.dtype)
        for i, layer in enumerate(self.layers):
            if i == 1 and self.unmasked_second:
                x = layer(x)
            else:
                x = layer(x, src_mask=mask, is_causal=True)
        return self.out(self.norm(x))


class SeqFirstLM(nn.Module):
    """batch_first=False, activation="gelu", post-norm layers on (T, B, D), a float causal mask."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(V, D)
        self.pos = nn.Parameter(0.02 * torch.randn(T_MAX, 1, D))
        self.layers = nn.ModuleList([nn.TransformerEncoderLayer(D, H, 4 * D, 0.1, activation="gelu") for _ in range(2)])
        self.out = nn.Linear(D, V)

    def forward(self, ids):
        T = ids.shape[1]
        x = self.tok(ids.t()) + self.pos[:T]
        mask = torch.full((T, T), float("-inf"), device=ids.device).triu(1).to(x.dtype)
        for layer in self.layers:
            x = layer(x, src_mask=mask)
        return self.out(x).transpose(0, 1)


def encoder_layer_lm(unmasked_second=False) -> EncoderLayerLM:
    torch.manual_seed(0)
    return _jitter(EncoderLayerLM(unmasked_second))


def seq_first_lm() -> SeqFirstLM:
    torch.manual_seed(0)
    return _jitter(SeqFirstLM())


CASES = [
    ("flex_gpt", flex_gpt, "transformer_lm", {}, ("could not judge", "", "backward")),
    ("flex_gpt.block_mask", lambda: flex_gpt(True), "transformer_lm", {}, ("could not judge", "", "backward")),
    ("fx_traced_gpt", traced_gpt, "transformer_lm", {}, "pass"),
    (
        "fx_traced_gpt.wrong_scale_second_block",
        lambda: traced_gpt(1 / D),
        "transformer_lm",
        {},
        ("mistake", "attention.wrong_scale", "blocks.1.attn"),
    ),
    ("exported_llama", exported_llama, "transformer_lm", {}, "pass"),
    (
        "exported_llama.softmax_wrong_axis_second_layer",
        lambda: exported_llama(True),
        "transformer_lm",
        {},
        ("mistake", "attention.softmax_wrong_axis", "layers.1.self_attn"),
    ),
    ("encoder_layer_lm", encoder_layer_lm, "transformer_lm", {}, "pass"),
    (
        "encoder_layer_lm.not_causal_second_layer",
        lambda: encoder_layer_lm(True),
        "transformer_lm",
        {},
        ("mistake", "attention.not_causal", "layers.1.self_attn"),
    ),
    ("seq_first_gelu_lm", seq_first_lm, "transformer_lm", {}, "pass"),
    ("int8_llama", int8_llama, "transformer_lm", {}, "pass"),
    (
        "int8_llama.activation_on_up_second_layer",
        lambda: int8_llama(on_up=True),
        "transformer_lm",
        {},
        ("mistake", "gated_feed_forward.activation_on_up", "layers.1.mlp"),
    ),
    (
        "int8_llama.kv_heads_tiled_second_layer",
        lambda: int8_llama(tiled=True),
        "transformer_lm",
        {},
        ("mistake", "attention.kv_heads_tiled", "layers.1.self_attn"),
    ),
    ("hooked_gpt", hooked_gpt, "transformer_lm", {}, "pass"),
    (
        "hooked_gpt.dropout_active_in_eval_second_block",
        lambda: hooked_gpt(True),
        "transformer_lm",
        {},
        ("mistake", "dropout.active_in_eval", "blocks.1.attn"),
    ),
    ("cached_llama", cached_llama, "transformer_lm", {}, "pass"),
    (
        "cached_llama.rope_applied_to_v_second_layer",
        lambda: cached_llama(True),
        "transformer_lm",
        {},
        ("mistake", "rope.applied_to_v", "layers.1.self_attn"),
    ),
    ("mha_forward_gpt", mha_forward_gpt, "transformer_lm", {}, "pass"),
    (
        "mha_forward_gpt.not_causal_second_block",
        lambda: mha_forward_gpt(False),
        "transformer_lm",
        {},
        ("mistake", "attention.not_causal", "blocks.1.attn"),
    ),
    ("spectral_llama", spectral_llama, "transformer_lm", {}, "pass"),
    (
        "spectral_llama.rms_eps_outside_sqrt_second_layer",
        lambda: spectral_llama(True),
        "transformer_lm",
        {},
        ("mistake", "rms_norm.eps_outside_sqrt", "layers.1.input_layernorm"),
    ),
]
