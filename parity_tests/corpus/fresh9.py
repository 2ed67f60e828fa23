"""Training-loop shapes, weight sharing and attention written the way HF ports write it (issue 46, round 5), in
this project's own words: styles none of the other corpus files uses. The judge meets them here first (measured with
the judge frozen: what it said when it first met each is in parity_tests/test_unseen.py's TODAY).

- a Lightning-style LM whose forward takes the batch as a dict, `forward(batch)` reading `batch["input_ids"]`
  (alone, and with `call=` saying how it is called); the same LM called on the ids, its logits divided by a
  `temperature` buffer of 0.7 at the end (the reference's `output_scale` of 1 / 0.7 before a bias-free head);
- a BERT-ish encoder whose output is a [CLS]-pooled classification head (the first position's state through a
  dense + tanh pooler, then a Linear to C classes: logits (B, C)), and one of its layers alone;
- a decoder whose blocks return `(x, attn_weights)` tuples, the model collecting every block's weights and returning
  `(logits, all_weights)`;
- an attention that upcasts the scores to float32 for the softmax and casts back, `softmax(s.float(), dim=-1)
  .to(q.dtype)`, which in a float64 check computes the softmax in float32;
- a GPT with multi-query attention (one K/V head) and one with grouped-query attention (two), their K/V heads
  widened by `expand` + `reshape`, not by `repeat_interleave`;
- a Llama whose RoPE is a precomputed complex `freqs_cis` buffer indexed by `position_ids` gathered per batch row
  (`freqs_cis[position_ids]`, (B, T, HD/2)), applied by `view_as_complex`;
- GPT-2 as transformers' port writes it: `Conv1D` modules holding (in, out) weights applied by `torch.addmm`;
- an LM whose token embeddings are multiplied by a learned scalar (an nn.Parameter, started at sqrt(d)): a
  parameter the reference has no pair for;
- an ALBERT-style decoder: one layer object applied N times (weights shared across layers; first expected as math
  the reference has no pair for, since read as its layers holding the same weights: see below);
- GPT-J's parallel block with one shared LayerNorm and no bias anywhere;
- mistakes put into them, each named where it sits: softmax over the queries in the tuple decoder's second block,
  the K/V heads tiled by `expand` on the wrong axis in the expand GPT's second block, eps outside the root of the
  freqs_cis Llama's second feed-forward norm, the causal mask letting the next token in (off by one) in the Conv1D
  GPT-2's second block, the shared ALBERT layer's scores divided by sqrt(d_model), the attention dropout left on in
  evaluation in the bias-free GPT-J's second block.

First met: 14 of 20 right. Wrong then: the batch-dict forward without call=, the temperature buffer, both freqs_cis
Llamas, the learned embedding scalar, and the mistake inside the ALBERT-shared layer; all are judged right since.

Expectation changed since (round 40): the ALBERT-style decoder was expected "no pair" at the shared layer's
attention. Its math is a stack of two pre-norm layers whose weights are equal, which the reference computes when
each of its layers is given the same weights; the one shared tensor's gradient is the sum of the layers'. The judge
now reads it so, and the model passes (its scaled-scores mistake is still named at layer.attn).

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

D, H, KV, V, C, T_MAX = 32, 4, 2, 26, 3, 32
HD = D // H
ROOT_HD = math.sqrt(HD)


def _causal(T, shift=0):
    """True where a query may not look: keys after it (shift 1: the next key is let in, the off-by-one mistake)."""
    return torch.ones(T, T, dtype=torch.bool).triu(1 + shift)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6, eps_outside=False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.eps_outside = eps, eps_outside

    def forward(self, x):
        if self.eps_outside:  # the mistake: eps added to the root, not inside it
            return self.weight * x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.eps)
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class Attention(nn.Module):
    """q, k and v Linears, written-out scores; `axis` and `divisor` let a subclass put a mistake in."""

    axis = -1

    def __init__(self, bias=True, divisor=ROOT_HD):
        super().__init__()
        self.q = nn.Linear(D, D, bias=bias)
        self.k = nn.Linear(D, D, bias=bias)
        self.v = nn.Linear(D, D, bias=bias)
        self.o = nn.Linear(D, D, bias=bias)
        self.divisor = divisor

    def weights(self, x):
        B, T, _ = x.shape
        q, k = (p(x).view(B, T, H, HD).transpose(1, 2) for p in (self.q, self.k))
        scores = (q @ k.transpose(-1, -2) / self.divisor).masked_fill(_causal(T), float("-inf"))
        return scores.softmax(dim=self.axis)

    def forward(self, x):
        B, T, _ = x.shape
        v = self.v(x).view(B, T, H, HD).transpose(1, 2)
        return self.o((self.weights(x) @ v).transpose(1, 2).reshape(B, T, D))


def _mlp(bias=True):
    return nn.Sequential(nn.Linear(D, 4 * D, bias=bias), nn.GELU(), nn.Linear(4 * D, D, bias=bias))


class PreNormBlock(nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(D), attention, nn.LayerNorm(D), _mlp()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


# -- a Lightning-style module: forward(batch) of a dict, logits / a temperature buffer ------------------------------


class LitLM(nn.Module):
    """As a LightningModule's `forward(batch)` reads it: the ids under batch["input_ids"] (a collator's dict)."""

    def __init__(self, temperature=1.0):
        super().__init__()
        self.tok = nn.Embedding(V, D)
        self.pos = nn.Embedding(T_MAX, D)
        self.blocks = nn.ModuleList([PreNormBlock(Attention()) for _ in range(2)])
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)
        self.register_buffer("temperature", torch.tensor(temperature))

    def forward(self, batch):
        ids = batch["input_ids"]
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)) / self.temperature

    def training_step(self, batch, batch_idx):
        logits = self(batch)
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), batch["input_ids"][:, 1:].flatten())


def lit_lm() -> LitLM:
    torch.manual_seed(0)
    return LitLM()


def batch_call(module, ids):
    """The `call=` that says how the batch-dict forward is called: the ids under "input_ids"."""
    return module({"input_ids": ids})


class TemperatureLM(LitLM):
    """The same LM called on the ids, its logits divided by a temperature of 0.7 (a buffer)."""

    def __init__(self):
        super().__init__(temperature=0.7)

    def forward(self, ids):
        return super().forward({"input_ids": ids})


def temperature_lm() -> TemperatureLM:
    torch.manual_seed(0)
    return TemperatureLM()


# -- an encoder with a [CLS]-pooled classification head: logits (B, C) ----------------------------------------------


class PostNormLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = nn.MultiheadAttention(D, H, batch_first=True)
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.ffn = _mlp()

    def forward(self, x):
        x = self.norm1(x + self.attention(x, x, x, need_weights=False)[0])
        return self.norm2(x + self.ffn(x))


class Pooler(nn.Module):
    """BERT's pooler: the first position's ([CLS]) state through a dense layer and tanh."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(D, D)

    def forward(self, hidden):
        return torch.tanh(self.dense(hidden[:, 0]))


class ClsClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.word = nn.Embedding(V, D)
        self.position = nn.Embedding(T_MAX, D)
        self.embed_norm = nn.LayerNorm(D)
        self.layers = nn.ModuleList([PostNormLayer() for _ in range(2)])
        self.pooler = Pooler()
        self.classifier = nn.Linear(D, C)

    def forward(self, input_ids):
        x = self.embed_norm(self.word(input_ids) + self.position.weight[: input_ids.shape[1]])
        for layer in self.layers:
            x = layer(x)
        return self.classifier(self.pooler(x))  # (B, C)


def cls_classifier() -> ClsClassifier:
    torch.manual_seed(0)
    return ClsClassifier()


def cls_layer() -> PostNormLayer:
    return cls_classifier().layers[0]


# -- blocks returning (x, attn_weights), the model collecting them --------------------------------------------------


class WeightsAttention(Attention):
    def forward(self, x):
        B, T, _ = x.shape
        v = self.v(x).view(B, T, H, HD).transpose(1, 2)
        weights = self.weights(x)
        return self.o((weights @ v).transpose(1, 2).reshape(B, T, D)), weights


class OverQueries(WeightsAttention):
    axis = -2


class TupleBlock(PreNormBlock):
    def forward(self, x):
        mixed, weights = self.attn(self.ln_1(x))
        x = x + mixed
        return x + self.mlp(self.ln_2(x)), weights


class TupleDecoder(nn.Module):
    def __init__(self, second):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.positions = nn.Parameter(torch.randn(T_MAX, D) * 0.02)
        self.blocks = nn.ModuleList([TupleBlock(WeightsAttention()), TupleBlock(second())])
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, ids):
        x = self.embed(ids) + self.positions[: ids.shape[1]]
        all_weights = []
        for block in self.blocks:
            x, weights = block(x)
            all_weights.append(weights)
        return self.lm_head(self.ln_f(x)), tuple(all_weights)


def tuple_decoder(second=WeightsAttention) -> TupleDecoder:
    torch.manual_seed(0)
    return TupleDecoder(second)


# -- the softmax upcast to float32 and cast back ---------------------------------------------------------------------


class UpcastAttention(Attention):
    def weights(self, x):
        B, T, _ = x.shape
        q, k = (p(x).view(B, T, H, HD).transpose(1, 2) for p in (self.q, self.k))
        scores = (q @ k.transpose(-1, -2) / self.divisor).masked_fill(_causal(T), float("-inf"))
        return F.softmax(scores.float(), dim=-1).to(q.dtype)


class UpcastLM(LitLM):
    def __init__(self):
        super().__init__(temperature=1.0)
        self.blocks = nn.ModuleList([PreNormBlock(UpcastAttention()) for _ in range(2)])

    def forward(self, ids):
        return super().forward({"input_ids": ids})


def upcast_lm() -> UpcastLM:
    torch.manual_seed(0)
    return UpcastLM()


# -- grouped-query attention by expand -------------------------------------------------------------------------------


class ExpandAttention(nn.Module):
    tiled = False  # the mistake: the groups axis put before the K/V heads, so the heads come out tiled
    kv = KV  # 1: multi-query attention (one key and value head for every query head)

    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(D, D, bias=False)
        self.kv_proj = nn.Linear(D, 2 * self.kv * HD, bias=False)
        self.out_proj = nn.Linear(D, D, bias=False)

    def widen(self, t):
        B, _, T, _ = t.shape
        if self.tiled:
            return t[:, None].expand(B, H // self.kv, self.kv, T, HD).reshape(B, H, T, HD)
        return t[:, :, None].expand(B, self.kv, H // self.kv, T, HD).reshape(B, H, T, HD)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, H, HD).transpose(1, 2)
        k, v = self.kv_proj(x).view(B, T, 2, self.kv, HD).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, self.widen(k), self.widen(v), is_causal=True)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, D))


class TiledAttention(ExpandAttention):
    tiled = True


class MultiQueryAttention(ExpandAttention):
    kv = 1


class ExpandGPT(nn.Module):
    def __init__(self, second, first=ExpandAttention):
        super().__init__()
        self.wte = nn.Embedding(V, D)
        self.wpe = nn.Embedding(T_MAX, D)
        self.h = nn.ModuleList([PreNormBlock(first()), PreNormBlock(second())])
        self.ln_f = nn.LayerNorm(D)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.T


def expand_gpt(second=ExpandAttention, first=ExpandAttention) -> ExpandGPT:
    torch.manual_seed(0)
    return ExpandGPT(second, first)


# -- a Llama whose freqs_cis buffer is indexed by position_ids per batch row -----------------------------------------


def _freqs_cis(n, width, base=10000.0):
    inv = 1.0 / base ** (torch.arange(0, width, 2, dtype=torch.float64) / width)
    return torch.polar(torch.ones(n, width // 2, dtype=torch.float64), torch.outer(torch.arange(n).double(), inv))


class CisAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq = nn.Linear(D, D, bias=False)
        self.wk = nn.Linear(D, KV * HD, bias=False)
        self.wv = nn.Linear(D, KV * HD, bias=False)
        self.wo = nn.Linear(D, D, bias=False)

    def forward(self, x, freqs):
        B, T, _ = x.shape
        q, k = self.wq(x).view(B, T, H, HD), self.wk(x).view(B, T, KV, HD)
        rotated = []
        for t in (q, k):  # freqs (B, T, HD/2), one row of angles a token, broadcast over the heads
            z = torch.view_as_complex(t.double().reshape(B, T, -1, HD // 2, 2).contiguous())
            rotated.append(torch.view_as_real(z * freqs[:, :, None]).flatten(-2).to(x.dtype))
        q, k = (t.transpose(1, 2) for t in rotated)
        v = self.wv(x).view(B, T, KV, HD).transpose(1, 2)
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, D))


class CisBlock(nn.Module):
    def __init__(self, eps_outside=False):
        super().__init__()
        self.attention_norm = RMSNorm(D)
        self.attention = CisAttention()
        self.ffn_norm = RMSNorm(D, eps_outside=eps_outside)
        self.w1, self.w3 = nn.Linear(D, 64, bias=False), nn.Linear(D, 64, bias=False)
        self.w2 = nn.Linear(64, D, bias=False)

    def forward(self, x, freqs):
        x = x + self.attention(self.attention_norm(x), freqs)
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class CisLlama(nn.Module):
    def __init__(self, eps_outside):
        super().__init__()
        self.tok_embeddings = nn.Embedding(V, D)
        self.layers = nn.ModuleList([CisBlock(), CisBlock(eps_outside)])
        self.norm = RMSNorm(D)
        self.output = nn.Linear(D, V, bias=False)
        self.register_buffer("freqs_cis", _freqs_cis(T_MAX, HD), persistent=False)

    def forward(self, tokens):
        B, T = tokens.shape
        position_ids = torch.arange(T)[None].expand(B, T)
        freqs = self.freqs_cis[position_ids]  # gathered per batch row: (B, T, HD/2)
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, freqs)
        return self.output(self.norm(x))


def cis_llama(eps_outside=False) -> CisLlama:
    torch.manual_seed(0)
    return CisLlama(eps_outside)


# -- GPT-2 of Conv1D modules: (in, out) weights by torch.addmm --------------------------------------------------------


class Conv1D(nn.Module):
    """transformers' GPT-2 linear: weight (nx, nf), y = bias + x @ weight, by addmm on the flattened rows."""

    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        out = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return out.view(*x.shape[:-1], -1)


class Conv1DAttention(nn.Module):
    shift = 0  # 1: the mistake, the next token let in

    def __init__(self):
        super().__init__()
        self.c_attn = Conv1D(3 * D, D)
        self.c_proj = Conv1D(D, D)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, H, HD).transpose(1, 2) for t in self.c_attn(x).split(D, dim=-1))
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(HD)
        w = torch.where(_causal(T, self.shift), torch.finfo(w.dtype).min, w)
        return self.c_proj((w.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D))


class ShowsNext(Conv1DAttention):
    shift = 1


class Conv1DMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc, self.c_proj = Conv1D(4 * D, D), Conv1D(D, 4 * D)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Conv1DBlock(nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(D), attention(), nn.LayerNorm(D), Conv1DMLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Conv1DGPT2(nn.Module):
    def __init__(self, second):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T_MAX, D)
        self.h = nn.ModuleList([Conv1DBlock(Conv1DAttention), Conv1DBlock(second)])
        self.ln_f = nn.LayerNorm(D)

    def forward(self, input_ids):
        x = self.wte(input_ids) + self.wpe(torch.arange(input_ids.shape[1])[None])
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def conv1d_gpt2(second=Conv1DAttention) -> Conv1DGPT2:
    torch.manual_seed(0)
    return Conv1DGPT2(second)


# -- token embeddings times a learned scalar --------------------------------------------------------------------------


class ScaledEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(V, D)
        self.scale = nn.Parameter(torch.tensor(math.sqrt(D)))

    def forward(self, ids):
        return self.table(ids) * self.scale


class ScalarEmbedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = ScaledEmbedding()
        self.pos = nn.Parameter(torch.randn(T_MAX, D) * 0.02)
        self.blocks = nn.ModuleList([PreNormBlock(Attention()) for _ in range(2)])
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, ids):
        x = self.embed(ids) + self.pos[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def scalar_embed_lm() -> ScalarEmbedLM:
    torch.manual_seed(0)
    return ScalarEmbedLM()


# -- ALBERT-style sharing: one layer applied N times ----------------------------------------------------------------


class SharedLayerLM(nn.Module):
    def __init__(self, divisor, n_layers=2):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.pos = nn.Embedding(T_MAX, D)
        self.layer = PreNormBlock(Attention(divisor=divisor))
        self.n_layers = n_layers
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, ids):
        x = self.embed(ids) + self.pos(torch.arange(ids.shape[1]))
        for _ in range(self.n_layers):
            x = self.layer(x)
        return self.head(self.norm(x))


def shared_layer_lm(divisor=ROOT_HD) -> SharedLayerLM:
    torch.manual_seed(0)
    return SharedLayerLM(divisor)


# -- GPT-J's parallel block: one shared LayerNorm, no biases -------------------------------------------------------


class DropoutAttention(Attention):
    """Attention dropout as `F.dropout(weights, p)`: `training=` left at its default True (the mistake), or gated."""

    gated = True

    def weights(self, x):
        return F.dropout(super().weights(x), p=0.1, training=self.training if self.gated else True)


class AlwaysDropout(DropoutAttention):
    gated = False


class ParallelBlock(nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.ln = nn.LayerNorm(D, bias=False)
        self.attn = attention(bias=False)
        self.mlp = _mlp(bias=False)

    def forward(self, x):
        h = self.ln(x)
        return x + self.attn(h) + self.mlp(h)


class BiasFreeGPTJ(nn.Module):
    def __init__(self, second):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T_MAX, D)
        self.h = nn.ModuleList([ParallelBlock(DropoutAttention), ParallelBlock(second)])
        self.ln_f = nn.LayerNorm(D, bias=False)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe.weight[: ids.shape[1]]
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def bias_free_gptj(second=DropoutAttention) -> BiasFreeGPTJ:
    torch.manual_seed(0)
    return BiasFreeGPTJ(second)


CASES = [
    ("batch_dict_lm", lit_lm, "transformer_lm", {}, "pass"),
    ("batch_dict_lm.call_given", lit_lm, "transformer_lm", {"call": batch_call}, "pass"),
    ("temperature_lm", temperature_lm, "transformer_lm", {}, "pass"),
    ("cls_classifier", cls_classifier, "encoder_model", {}, ("no pair", "pooler", "pooler")),
    ("cls_classifier.layer", cls_layer, "encoder_layer", {}, "pass"),
    ("tuple_decoder", tuple_decoder, "transformer_lm", {}, "pass"),
    (
        "tuple_decoder.softmax_wrong_axis_second_block",
        lambda: tuple_decoder(OverQueries),
        "transformer_lm",
        {},
        ("mistake", "attention.softmax_wrong_axis", "blocks.1.attn"),
    ),
    ("upcast_softmax_lm", upcast_lm, "transformer_lm", {}, "pass"),
    ("expand_gqa_gpt", expand_gpt, "transformer_lm", {}, "pass"),
    (
        "expand_mqa_gpt",
        lambda: expand_gpt(MultiQueryAttention, first=MultiQueryAttention),
        "transformer_lm",
        {},
        "pass",
    ),
    (
        "expand_gqa_gpt.kv_heads_tiled_second_block",
        lambda: expand_gpt(TiledAttention),
        "transformer_lm",
        {},
        ("mistake", "attention.kv_heads_tiled", "h.1.attn"),
    ),
    ("freqs_cis_llama", cis_llama, "transformer_lm", {}, "pass"),
    (
        "freqs_cis_llama.rms_eps_outside_sqrt_second_block",
        lambda: cis_llama(eps_outside=True),
        "transformer_lm",
        {},
        ("mistake", "rms_norm.eps_outside_sqrt", "layers.1.ffn_norm"),
    ),
    ("conv1d_gpt2", conv1d_gpt2, "transformer_lm", {}, "pass"),
    (
        "conv1d_gpt2.causal_shows_next_second_block",
        lambda: conv1d_gpt2(ShowsNext),
        "transformer_lm",
        {},
        ("mistake", "attention.causal_shows_next", "h.1.attn"),
    ),
    ("scalar_embed_lm", scalar_embed_lm, "transformer_lm", {}, ("no pair", "embed", "scale")),
    ("shared_layer_lm", shared_layer_lm, "transformer_lm", {}, "pass"),
    (
        "shared_layer_lm.scaled_by_model_width",
        lambda: shared_layer_lm(math.sqrt(D)),
        "transformer_lm",
        {},
        ("mistake", "attention.wrong_scale", "layer.attn"),
    ),
    ("bias_free_gptj", bias_free_gptj, "transformer_lm", {}, "pass"),
    (
        "bias_free_gptj.dropout_active_in_eval_second_block",
        lambda: bias_free_gptj(AlwaysDropout),
        "transformer_lm",
        {},
        ("mistake", "dropout.active_in_eval", "h.1.attn"),
    ),
]
