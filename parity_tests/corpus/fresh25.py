"""Encoders for retrieval and embeddings as 2025-26 code writes them by hand (issue 46, round 15), in this project's
own words: styles none of the other corpus files uses. The judge meets them here first (measured with the judge
frozen: what it said when it first met each is in parity_tests/test_unseen.py's TODAY).

- a ModernBERT by hand at the size of a masked-LM: `nn.LayerNorm(bias=False)` everywhere, an embedding norm, no
  norm before the first layer's attention, one fused `Wqkv` without bias, a global layer (RoPE base 160000) then
  two local ones (every third global; |i - j| <= 2, base 10000), the band and the padding joined in one boolean
  keep-mask handed to SDPA, a GeGLU of exact GELU out of one `Wi` chunked in two, a final norm, and its masked-LM
  head (dense, GELU, a bias-free norm, the token table read back with a bias of its own); the same encoder
  returning its hidden states;
- a NomicBERT-style encoder: post-norm, LayerNorms written out (with bias, eps 1e-5), a token-type table of one
  row (read at type 0 for every token; and without it) and an embedding norm, no learned positions but rotary on
  interleaved pairs (base 1000) turned in real arithmetic, a fused `Wqkv` without bias, a SwiGLU of `fc11` (up)
  and `fc12` (gate) without biases;
- the sentence-transformers pipeline written out around it: the encoder's states, mean pooling under the attention
  mask, L2 normalisation (the reference's sentence.py has these, but no level of the judge's reads them: math it
  has no pair for at the pooling), and the same pooling dividing by T (the padded tokens counted);
- a BGE-style encoder: BERT's learned positions and post-norm GELU layers, the [CLS] state taken and scaled to unit
  length (no dense + tanh pooler: no pair, said at the normalisation);
- a ColBERT-style encoder: the same BERT layers, every token's state through a bias-free Linear to 16 features, put
  at unit length and zeroed at the padding (no pair, said at the projection);
- a Jina-BERT-v2-style encoder: ALiBi on both sides (-m |i - j|, the reference's slopes), no position table,
  post-norm, a GeGLU out of one `gated_layers` Linear (up then gate), `wo` back;
- mistakes put into them, each named where it sits: GeGLU's GELU on the up half in ModernBERT's second layer, its
  padding mask inverted there, its band one-sided (keys after the query hidden: a causal window in an encoder, no
  pair), the Nomic encoder's second output norm with eps outside the root, Jina's second attention scaled by
  d_model ** -0.5 and its attention dropout left on in evaluation.

First met: 7 of 16 right (the ModernBERT MLM and its states, the Nomic encoder without its token-type table and its
norm's mistake there, the Jina encoder and both its mistakes). Wrong then:
- the Nomic encoder with its token-type table of one row, and its norm's mistake inside it: "could not judge: bos_id
  must be a valid token id below tgt_vocab_size=1, got 1" (the one-row table read as a second vocabulary);
- the sentence pipeline, with and without the padded tokens counted: no pair said at `normalize` ("normalize(x)
  normalises without a weight"), not at the pooling that runs before it;
- ColBERT's per-token projection: no pair said at `normalize` (as a norm without a weight), after it;
- BGE's [CLS] at unit length: said at `normalize` as a norm without a weight, not as scaling to unit length;
- ModernBERT's GELU on the up half of the second layer's `Wi`: a pass (that layer's halves read the other way round,
  though the first layer fixes which half of `Wi` is activated);
- ModernBERT's padding mask inverted in its second layer, and its band one-sided there: an "unexplained" divergence
  at model.layers.1.attn (the right place, nothing named).

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

D, H, V, FF, T_MAX, PAD = 32, 4, 26, 48, 32, 0
HD = D // H


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases moved off their 1s and 0s, so that trained values are what is checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _heads(x: torch.Tensor) -> torch.Tensor:
    """(B, T, D) -> (B, H, T, Dh)."""
    return x.unflatten(-1, (H, HD)).transpose(1, 2)


def _merge(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, Dh) -> (B, T, D)."""
    return x.transpose(1, 2).flatten(2)


def _keep(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """(B, T) bool, True at real tokens: the given mask, else the non-padding ids."""
    return (input_ids != PAD) if attention_mask is None else attention_mask.bool()


# -- ModernBERT by hand ---------------------------------------------------------------------------------------------


def _rope_halves(x: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary in halves (rotate_half) on x (B, H, T, Dh)."""
    T = x.shape[-2]
    inv = base ** -(torch.arange(0, HD, 2, dtype=x.dtype) / HD)
    angles = torch.arange(T, dtype=x.dtype)[:, None] * inv
    angles = torch.cat([angles, angles], -1)
    first, second = x.chunk(2, -1)
    return x * angles.cos() + torch.cat([-second, first], -1) * angles.sin()


class ModernAttention(nn.Module):
    def __init__(self, local: bool, invert_padding=False, one_sided=False):
        super().__init__()
        self.Wqkv = nn.Linear(D, 3 * D, bias=False)
        self.Wo = nn.Linear(D, D, bias=False)
        self.local, self.base = local, 10000.0 if local else 160000.0
        self.invert_padding, self.one_sided = invert_padding, one_sided  # the mistakes

    def forward(self, x, keep):
        T = x.shape[1]
        q, k, v = (_heads(t) for t in self.Wqkv(x).chunk(3, -1))
        q, k = _rope_halves(q, self.base), _rope_halves(k, self.base)
        padding = ~keep if self.invert_padding else keep
        allowed = padding[:, None, None, :]  # (B, 1, 1, T)
        if self.local:  # local_attention = 4: a band of |i - j| <= 2 around each query
            offset = torch.arange(T)[None, :] - torch.arange(T)[:, None]  # key - query
            band = (offset.abs() <= 2) if not self.one_sided else (offset <= 0) & (offset >= -2)
            allowed = allowed & band
        return self.Wo(_merge(F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)))


class ModernMLP(nn.Module):
    def __init__(self, act_on_gate=False):
        super().__init__()
        self.Wi = nn.Linear(D, 2 * FF, bias=False)
        self.Wo = nn.Linear(FF, D, bias=False)
        self.act_on_gate = act_on_gate  # the mistake: the GELU on the second half, the up projection

    def forward(self, x):
        activated, gate = self.Wi(x).chunk(2, -1)
        if self.act_on_gate:
            return self.Wo(activated * F.gelu(gate))
        return self.Wo(F.gelu(activated) * gate)


class ModernLayer(nn.Module):
    def __init__(self, index: int, mistake: str = ""):
        super().__init__()
        self.attn_norm = nn.LayerNorm(D, bias=False) if index else nn.Identity()
        self.attn = ModernAttention(index % 3 != 0, mistake == "invert", mistake == "one_sided")
        self.mlp_norm = nn.LayerNorm(D, bias=False)
        self.mlp = ModernMLP(mistake == "gate")

    def forward(self, x, keep):
        x = x + self.attn(self.attn_norm(x), keep)
        return x + self.mlp(self.mlp_norm(x))


class ModernEncoder(nn.Module):
    def __init__(self, mistake: str = ""):
        super().__init__()
        self.tok_embeddings = nn.Embedding(V, D)
        self.norm = nn.LayerNorm(D, bias=False)
        self.layers = nn.ModuleList([ModernLayer(i, mistake if i == 1 else "") for i in range(3)])
        self.final_norm = nn.LayerNorm(D, bias=False)

    def forward(self, input_ids, attention_mask=None):
        keep = _keep(input_ids, attention_mask)
        x = self.norm(self.tok_embeddings(input_ids))
        for layer in self.layers:
            x = layer(x, keep)
        return self.final_norm(x)


class ModernForMaskedLM(nn.Module):
    def __init__(self, mistake: str = ""):
        super().__init__()
        self.model = ModernEncoder(mistake)
        self.head_dense = nn.Linear(D, D, bias=False)
        self.head_norm = nn.LayerNorm(D, bias=False)
        self.decoder_bias = nn.Parameter(torch.zeros(V))

    def forward(self, input_ids, attention_mask=None):
        h = self.head_norm(F.gelu(self.head_dense(self.model(input_ids, attention_mask))))
        return h @ self.model.tok_embeddings.weight.T + self.decoder_bias


def modernbert_mlm(mistake: str = "") -> ModernForMaskedLM:
    torch.manual_seed(0)
    return _jitter(ModernForMaskedLM(mistake))


def modernbert_states() -> ModernEncoder:
    torch.manual_seed(1)
    return _jitter(ModernEncoder())


# -- NomicBERT-style: post-norm, rotary on interleaved pairs, SwiGLU ---------------------------------------------------


class HandLayerNorm(nn.Module):
    def __init__(self, eps=1e-5, eps_outside=False):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(D)), nn.Parameter(torch.zeros(D))
        self.eps, self.eps_outside = eps, eps_outside  # the mistake: sqrt(var) + eps

    def forward(self, x):
        centred = x - x.mean(-1, keepdim=True)
        var = centred.pow(2).mean(-1, keepdim=True)
        scale = var.sqrt() + self.eps if self.eps_outside else (var + self.eps).sqrt()
        return self.weight * centred / scale + self.bias


def _rope_pairs(x: torch.Tensor, base: float = 1000.0) -> torch.Tensor:
    """Rotary on interleaved pairs (features 2i, 2i + 1) of x (B, H, T, Dh), in real arithmetic."""
    T = x.shape[-2]
    inv = 1.0 / base ** (torch.arange(0, HD, 2, dtype=x.dtype) / HD)
    angles = torch.arange(T, dtype=x.dtype)[:, None] * inv  # (T, Dh/2)
    cos, sin = angles.cos(), angles.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], -1).flatten(-2)


class NomicAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.Wqkv = nn.Linear(D, 3 * D, bias=False)
        self.out_proj = nn.Linear(D, D, bias=False)

    def forward(self, x, keep):
        q, k, v = self.Wqkv(x).view(*x.shape[:2], 3, H, HD).permute(2, 0, 3, 1, 4)
        q, k = _rope_pairs(q), _rope_pairs(k)
        scores = q @ k.transpose(-1, -2) / math.sqrt(HD)
        scores = scores.masked_fill(~keep[:, None, None, :], torch.finfo(x.dtype).min)
        return self.out_proj(_merge(scores.softmax(-1) @ v))


class NomicBlock(nn.Module):
    def __init__(self, eps_outside=False):
        super().__init__()
        self.attn = NomicAttention()
        self.norm1 = HandLayerNorm()
        self.fc11 = nn.Linear(D, FF, bias=False)
        self.fc12 = nn.Linear(D, FF, bias=False)
        self.fc2 = nn.Linear(FF, D, bias=False)
        self.norm2 = HandLayerNorm(eps_outside=eps_outside)

    def forward(self, x, keep):
        x = self.norm1(x + self.attn(x, keep))
        return self.norm2(x + self.fc2(self.fc11(x) * F.silu(self.fc12(x))))


class NomicEncoder(nn.Module):
    def __init__(self, eps_outside_second=False, token_types=True):
        super().__init__()
        self.word_embeddings = nn.Embedding(V, D, padding_idx=PAD)
        self.token_type_embeddings = nn.Embedding(1, D) if token_types else None
        self.emb_ln = HandLayerNorm()
        self.layers = nn.ModuleList([NomicBlock(), NomicBlock(eps_outside_second)])

    def forward(self, input_ids, attention_mask=None):
        keep = _keep(input_ids, attention_mask)
        x = self.word_embeddings(input_ids)
        if self.token_type_embeddings is not None:  # one row: every token's type 0
            x = x + self.token_type_embeddings.weight[0]
        x = self.emb_ln(x)
        for layer in self.layers:
            x = layer(x, keep)
        return x


def nomic_embed(eps_outside_second=False, token_types=True) -> NomicEncoder:
    torch.manual_seed(2)
    return _jitter(NomicEncoder(eps_outside_second, token_types))


class MeanPooling(nn.Module):
    def __init__(self, count_padding=False):
        super().__init__()
        self.count_padding = count_padding  # the mistake: divided by T, the padded tokens counted

    def forward(self, states, attention_mask):
        m = attention_mask[..., None].to(states.dtype)
        summed = (states * m).sum(1)
        count = torch.full_like(summed, states.shape[1]) if self.count_padding else m.sum(1).clamp(min=1e-9)
        return summed / count


class Normalize(nn.Module):
    def forward(self, embeddings):
        return F.normalize(embeddings, p=2, dim=-1)


class SentencePipeline(nn.Module):
    def __init__(self, count_padding=False):
        super().__init__()
        self.transformer = NomicEncoder()
        self.pooling = MeanPooling(count_padding)
        self.normalize = Normalize()

    def forward(self, input_ids, attention_mask=None):
        mask = _keep(input_ids, attention_mask)
        return self.normalize(self.pooling(self.transformer(input_ids, mask), mask))


def nomic_sentence(count_padding=False) -> SentencePipeline:
    torch.manual_seed(2)
    return _jitter(SentencePipeline(count_padding))


# -- BGE-style: BERT layers, the [CLS] state at unit length ------------------------------------------------------------


class BertLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.dense = nn.Linear(D, D)
        self.attention_norm = nn.LayerNorm(D, eps=1e-12)
        self.intermediate = nn.Linear(D, FF)
        self.output = nn.Linear(FF, D)
        self.output_norm = nn.LayerNorm(D, eps=1e-12)

    def forward(self, x, keep):
        q, k, v = (_heads(t) for t in self.qkv(x).chunk(3, -1))
        bias = (1.0 - keep[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        x = self.attention_norm(x + self.dense(_merge(context)))
        return self.output_norm(x + self.output(F.gelu(self.intermediate(x))))


class BgeEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.word_embeddings = nn.Embedding(V, D)
        self.position_embeddings = nn.Embedding(T_MAX, D)
        self.embeddings_norm = nn.LayerNorm(D, eps=1e-12)
        self.layers = nn.ModuleList([BertLayer(), BertLayer()])
        self.normalize = Normalize()

    def forward(self, input_ids, attention_mask=None):
        keep = _keep(input_ids, attention_mask)
        positions = torch.arange(input_ids.shape[1])
        x = self.embeddings_norm(self.word_embeddings(input_ids) + self.position_embeddings(positions))
        for layer in self.layers:
            x = layer(x, keep)
        return self.normalize(x[:, 0])


def bge_cls() -> BgeEncoder:
    torch.manual_seed(3)
    return _jitter(BgeEncoder())


class ColbertEncoder(BgeEncoder):
    """ColBERT's late interaction side: every token's state projected to 16 features and put at unit length."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(D, 16, bias=False)

    def forward(self, input_ids, attention_mask=None):
        keep = _keep(input_ids, attention_mask)
        positions = torch.arange(input_ids.shape[1])
        x = self.embeddings_norm(self.word_embeddings(input_ids) + self.position_embeddings(positions))
        for layer in self.layers:
            x = layer(x, keep)
        return self.normalize(self.linear(x)) * keep[..., None]


def colbert() -> ColbertEncoder:
    torch.manual_seed(5)
    return _jitter(ColbertEncoder())


# -- Jina-BERT-v2-style: symmetric ALiBi, post-norm, GeGLU -----------------------------------------------------------


def _slopes() -> torch.Tensor:
    """The geometric slopes 2^(-8 i / H), i = 1 .. H."""
    return 2.0 ** (-8.0 * torch.arange(1, H + 1) / H)


class JinaAttention(nn.Module):
    def __init__(self, scale=HD, dropout_in_eval=False):
        super().__init__()
        self.query, self.key, self.value = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.out = nn.Linear(D, D)
        self.scale, self.dropout_in_eval = scale, dropout_in_eval  # the mistakes: sqrt(D), dropout left on

    def forward(self, x, keep):
        T = x.shape[1]
        q, k, v = _heads(self.query(x)), _heads(self.key(x)), _heads(self.value(x))
        distance = (torch.arange(T)[None, :] - torch.arange(T)[:, None]).abs().to(x.dtype)
        alibi = -_slopes().to(x.dtype)[:, None, None] * distance  # (H, T, T)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.scale) + alibi
        scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
        weights = F.dropout(scores.softmax(-1), 0.1, training=self.training or self.dropout_in_eval)
        return self.out(_merge(weights @ v))


class JinaLayer(nn.Module):
    def __init__(self, mistake: str = ""):
        super().__init__()
        self.attention = JinaAttention(D if mistake == "scale" else HD, mistake == "dropout")
        self.attention_ln = nn.LayerNorm(D)
        self.gated_layers = nn.Linear(D, 2 * FF, bias=False)
        self.wo = nn.Linear(FF, D)
        self.layernorm = nn.LayerNorm(D)

    def forward(self, x, keep):
        x = self.attention_ln(x + self.attention(x, keep))
        up, gated = self.gated_layers(x).chunk(2, -1)
        return self.layernorm(x + self.wo(up * F.gelu(gated)))


class JinaEncoder(nn.Module):
    def __init__(self, mistake: str = ""):
        super().__init__()
        self.word_embeddings = nn.Embedding(V, D)
        self.emb_norm = nn.LayerNorm(D)
        self.layer = nn.ModuleList([JinaLayer(), JinaLayer(mistake)])

    def forward(self, input_ids, attention_mask=None):
        keep = _keep(input_ids, attention_mask)
        x = self.emb_norm(self.word_embeddings(input_ids))
        for layer in self.layer:
            x = layer(x, keep)
        return x


def jina_bert(mistake: str = "") -> JinaEncoder:
    torch.manual_seed(4)
    return _jitter(JinaEncoder(mistake))


_MLM, _ENC = "encoder_model", "encoder_model"
CASES = [
    ("modernbert_mlm", modernbert_mlm, _MLM, {}, "pass"),
    ("modernbert_mlm.states", modernbert_states, _ENC, {}, "pass"),
    (
        "modernbert_mlm.gelu_on_up_half_second_layer",
        lambda: modernbert_mlm("gate"),
        _MLM,
        {},
        ("mistake", "gated_feed_forward.activation_on_up", "model.layers.1.mlp"),
    ),
    (
        "modernbert_mlm.padding_inverted_second_layer",
        lambda: modernbert_mlm("invert"),
        _MLM,
        {},
        ("mistake", "attention.mask_inverted", "model.layers.1.attn"),
    ),
    # keys after the query hidden in a local band: a causal window inside an encoder, which the reference's encoder
    # layers never have (their band is |i - j| <= w / 2): math it has no pair for, said at that attention
    (
        "modernbert_mlm.band_one_sided_second_layer",
        lambda: modernbert_mlm("one_sided"),
        _MLM,
        {},
        ("no pair", "model.layers.1.attn", "causal"),
    ),
    ("nomic_embed", nomic_embed, _ENC, {}, "pass"),
    (
        "nomic_embed.eps_outside_root_second_layer",
        lambda: nomic_embed(eps_outside_second=True),
        _ENC,
        {},
        ("mistake", "layer_norm.eps_outside_sqrt", "layers.1.norm2"),
    ),
    ("nomic_embed.no_token_types", lambda: nomic_embed(token_types=False), _ENC, {}, "pass"),
    (
        "nomic_embed.no_token_types.eps_outside_root_second_layer",
        lambda: nomic_embed(eps_outside_second=True, token_types=False),
        _ENC,
        {},
        ("mistake", "layer_norm.eps_outside_sqrt", "layers.1.norm2"),
    ),
    ("nomic_embed.sentence", nomic_sentence, _ENC, {}, ("no pair", "pooling", "pool")),
    (
        "nomic_embed.sentence_counting_padding",
        lambda: nomic_sentence(count_padding=True),
        _ENC,
        {},
        ("no pair", "pooling", "pool"),
    ),
    ("bge_cls", bge_cls, _ENC, {}, ("no pair", "normalize", "unit length")),
    # a per-token projection the reference's encoder has no head for (its heads: BERT's pooler, the masked-LM head)
    ("colbert", colbert, _ENC, {}, ("no pair", "linear", "linear")),
    ("jina_bert", jina_bert, _ENC, {}, "pass"),
    (
        "jina_bert.scaled_by_d_model_second_layer",
        lambda: jina_bert("scale"),
        _ENC,
        {},
        ("mistake", "attention.wrong_scale", "layer.1.attention"),
    ),
    (
        "jina_bert.dropout_in_eval_second_layer",
        lambda: jina_bert("dropout"),
        _ENC,
        {},
        ("mistake", "dropout.active_in_eval", "layer.1.attention"),
    ),
]
