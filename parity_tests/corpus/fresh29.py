"""Library code the corpus had not met (issue 46, round 18), in this project's own words, as a learner who copies
from these libraries writes it. The judge meets it here first (measured with the judge frozen).

- a LitGPT-style LM: one fused `attn.attn` whose rows are laid out per query group (for each of the
  `n_query_groups` groups its `q_per_kv` query heads, then its key head, then its value head), split by
  `view(B, T, n_query_groups, q_per_kv + 2, head_size)`, the K/V heads widened by `expand`, a partial rotary on the
  first `rope_n_elem = rotary_percentage * head_size` features of each head (LitGPT's `build_rope_cache` and
  `apply_rope`, halves), and its `LLaMAMLP` (`fc_1`, `fc_2`, `proj`);
- a labml.ai-annotated style encoder in which every tensor is sequence-first: ids (seq_len, batch), features
  (seq_len, batch, d_model), a `PrepareForMultiHeadAttention` module per q / k / v, scores by
  `einsum("ibhd,jbhd->ijbh")`, a softmax over dim 1 (the keys), a mask of shape (seq_len_q, seq_len_k, batch)
  given as (1, seq_len_k, batch) for the padding; and its attention alone, called with keyword-only arguments;
- an OpenNMT-py-style encoder-decoder: `MultiHeadedAttention(key, value, query, mask)` (keys first) with
  `linear_keys` / `linear_values` / `linear_query` / `final_linear`, the query divided by sqrt(d_head) before the
  product, `-1e18` on the hidden scores; a `PositionwiseFeedForward` whose layer norm (eps 1e-6) sits inside it, with
  its own residual; a `PositionalEncoding` that scales the embedding by sqrt(d) and adds the sinusoids; masks of
  shape (B, 1, T), True = padding, the padding id 1 (OpenNMT's blank), given as pad_id=1; a log-softmax generator;
- an ESPnet-style encoder layer `forward(x, mask) -> (x, mask)`, mask (B, 1, T) True = keep, its optional macaron
  feed-forward and convolution module off (None), `concat_after` off, `finfo.min` on the hidden scores and the
  probabilities zeroed there after the softmax; a stack of two with `after_norm`, judged as an encoder stack;
- an xformers-style attention function taking BMHK tensors (batch, seq, heads, head_dim) and an `attn_bias` object
  (a `LowerTriangularMask`-like class written here, materialised as an additive -inf bias), in plain torch, used by
  a small GPT and judged alone as a function;
- mistakes put into them, each in the second layer or block: LitGPT's fused rows split as [all q, all k, all v]
  while the weight is laid out per group; LitGPT's K/V heads widened by `repeat` (tiled); labml's padding mask
  broadcast over the wrong axis (seq_len_k, 1, batch), so it hides query rows; OpenNMT's key padding put on the
  queries (`mask.unsqueeze(-1)` for `unsqueeze(1)`); ESPnet's mask polarity inverted (`eq(1)` for `eq(0)`); the
  xformers bias materialised as upper triangular; the xformers GPT's dropout `p` not gated on training.

Expected verdicts decided from the math before the judge ran.

- The [all q, all k, all v] split of a weight laid out per group is no different model: a fused Linear's rows are
  parameters, and reading them in another order only gives each row another name (query head, key head, value
  head). Both layouts compute grouped-query attention with some assignment of rows, so a freshly initialised model
  of either is a correct model; only loading a LitGPT checkpoint would tell them apart, and the judge has none. The
  honest verdict is a pass (with its own weight map), not a catalogued id.
- labml's mask (seq_len_k, 1, batch) against the scores (seq_len_q, seq_len_k, batch, heads) hides the rows of the
  padded queries and no key: the padding on the queries (attention.padding_on_queries); those rows are all -inf
  (labml's fill), so the softmax there is NaN, at padded positions only.
- OpenNMT's (B, 1, T).unsqueeze(-1) is (B, 1, T, 1): the same padding on the queries, filled with -1e18 (rows
  uniform, no NaN).
- ESPnet's `eq(1)` hides the real keys and keeps the padding (attention.mask_inverted); a row with no padded key is
  hidden everywhere and zeroed after the softmax.
- the bias read as upper triangular keeps each query's own key and the future (triu for tril), catalogued as
  attention.mask_inverted's flipped triangle.
- ESPnet's layer with `eq(1)`, judged alone, is a correct layer under the other convention (its mask True =
  hidden): only its caller knows which it meant, so a pass is honest there (the judge says it read "bool_masked");
  with mask="bool_keep" given it is attention.mask_inverted. The stack's first layer fixes the convention, so its
  second layer's inversion is a mistake.
- labml's attention alone reads its mask as (seq_len_q or 1, seq_len_k, batch) with keyword-only arguments: with
  nothing given, "could not judge; pass call=" is honest; with one real call given (example=), a pass.
- The correct models were checked by hand: the per-group split with `expand` equals the flat split's attention with
  the rows permuted and repeat_interleave (float64, to 1e-15); the xformers function equals SDPA with is_causal on
  the transposed tensors (6.7e-16); labml's attention equals a plain one (1.7e-16).

First met: 11 of 19 right. Wrong:

- lit_groups and its two mistakes: no id, no op: "unexplained: transformer.h.0.attn ... diverges (positions 1, 2,
  3, 4, 5 differ, the others agree); not expressible by the config and no catalogue variant reproduces it", the
  rotary read as full-width interleaved pairs. LitGPT's partial rotary (`cat(apply_rope(q[..., :n]), q[..., n:])`)
  is not read, whatever the qkv layout (the same with a flat [q, k, v] split in both blocks); the per-group layout
  itself is read (at rotary_percentage 1 the correct model and the flat split pass and the tiled K/V heads are
  named). Given rotary_dim=4 it still fails, by 8.7e-09 in float64: LitGPT's cos/sin cache is float32 (at full
  width the same float32 tables pass); with float64 tables and rotary_dim=4 it passes.
- labml_encoder and its mistake: attention.q_k_swapped at encoder.layers.0.self_attn (variant error 6.7e-16): the
  map puts `key.linear` on q_proj and `query.linear` on k_proj; the scores einsum("ibhd,jbhd->ijbh") with the
  softmax over dim 1 (the keys, sequence-first) are read as K Q^T. The model equals a plain attention to 1.7e-16;
  given the map with q and k the right way round (mapping=), the encoder passes and its mistake is
  attention.padding_on_queries at the second layer.
- labml_attention: "could not judge: the number of heads cannot be read from the recorded forward: pass n_heads=",
  though the heads are in PrepareForMultiHeadAttention's view: the keyword-only forward was never recorded, and
  with n_heads=4 given the judge says that, "pass call= ... or mapping=" (the answer expected here at once).
- labml_attention.example: "could not judge: the module's forward could not be recorded ... (its forward raised
  AssertionError: )": the judge's masks are not built in the example's (1, seq_len_k, batch) layout at its sizes.
- xformers_function (example= of BMHK tensors): no id, no op: "unexplained: (the module): output diverges (relative
  error 1.89e+00)": the (batch, seq, heads, head_dim) layout of the example is not read (without the example:
  could not judge, its calls raising on the shapes).

Fixed since: a RoPE table a module keeps narrower than its heads is read at its own width (twice it) too, so
LitGPT's float32 cos/sin of its `rope_n_elem` features give the rotary width and are overwritten in float64; an
einsum's scores take the key from the axis the softmax normalises where the values' product sums it away (labml's
"ijbh" over j); a forward no caller can take (keyword-only) is said so, with call=, before any n_heads=; an
example's padding mask is built in its own axes' order ((1, T, B)); and an example's 4-D heads are read as (batch,
seq, heads, head_dim) where changing axis 1's first index changes the output past it (a position reaching the
other queries), in and out.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

D, H, KV, V, T_MAX, HD = 32, 4, 2, 26, 16, 8
PAD_ONMT = 1


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases moved off their 1s and 0s, so that a trained model's values are checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


# -- LitGPT: qkv laid out per query group, partial rotary, LLaMAMLP ------------------------------------------------


@dataclass
class LitConfig:
    block_size: int = T_MAX
    padded_vocab_size: int = V
    n_layer: int = 2
    n_embd: int = D
    n_head: int = H
    n_query_groups: int = KV
    head_size: int = HD
    rotary_percentage: float = 0.5
    rope_base: int = 10000
    norm_eps: float = 1e-5
    intermediate_size: int = 64

    @property
    def rope_n_elem(self) -> int:
        return int(self.rotary_percentage * self.head_size)


def build_rope_cache(seq_len: int, n_elem: int, base: int = 10000) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (seq_len, n_elem) of theta_i = base^(-2i / n_elem), each angle twice (the halves' layout)."""
    theta = 1.0 / (base ** (torch.arange(0, n_elem, 2, dtype=torch.float64) / n_elem))
    idx_theta = torch.outer(torch.arange(seq_len, dtype=torch.float64), theta).repeat(1, 2)
    return torch.cos(idx_theta).float(), torch.sin(idx_theta).float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The halves' rotation: x cos + (-x2, x1) sin."""
    half = x.size(-1) // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class LitRMSNorm(nn.Module):
    def __init__(self, size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm_x = torch.mean(x * x, dim=-1, keepdim=True)
        return x * torch.rsqrt(norm_x + self.eps) * self.weight


class LitCausalSelfAttention(nn.Module):
    """`split`: "groups" (LitGPT's, the rows per query group), "flat" (the rows read as [all q, all k, all v]),
    "tiled" (per group, but the K/V heads widened by `repeat`: head h reads group h % n_query_groups)."""

    split = "groups"

    def __init__(self, config: LitConfig) -> None:
        super().__init__()
        shape = (config.n_head + 2 * config.n_query_groups) * config.head_size
        self.attn = nn.Linear(config.n_embd, shape, bias=False)
        self.proj = nn.Linear(config.n_head * config.head_size, config.n_embd, bias=False)
        self.config = config

    def _heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c = self.config
        B, T, _ = qkv.shape
        q_per_kv = c.n_head // c.n_query_groups
        if self.split == "flat":
            kv_size = c.n_query_groups * c.head_size
            q, k, v = qkv.split((c.n_head * c.head_size, kv_size, kv_size), dim=-1)
            q = q.view(B, T, c.n_head, c.head_size).transpose(1, 2)
            k = k.view(B, T, c.n_query_groups, c.head_size).transpose(1, 2).repeat_interleave(q_per_kv, dim=1)
            v = v.view(B, T, c.n_query_groups, c.head_size).transpose(1, 2).repeat_interleave(q_per_kv, dim=1)
            return q, k, v
        qkv = qkv.view(B, T, c.n_query_groups, q_per_kv + 2, c.head_size).permute(0, 2, 3, 1, 4)
        q, k, v = qkv.split((q_per_kv, 1, 1), dim=2)  # (B, groups, q_per_kv | 1 | 1, T, hs)
        if self.split == "tiled":
            k = k.reshape(B, c.n_query_groups, T, c.head_size).repeat(1, q_per_kv, 1, 1)
            v = v.reshape(B, c.n_query_groups, T, c.head_size).repeat(1, q_per_kv, 1, 1)
        else:
            k = k.expand(B, c.n_query_groups, q_per_kv, T, c.head_size)
            v = v.expand(B, c.n_query_groups, q_per_kv, T, c.head_size)
        return (t.reshape(B, -1, T, c.head_size) for t in (q, k, v))  # type: ignore[return-value]

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None = None):
        B, T, _ = x.shape
        q, k, v = self._heads(self.attn(x))
        n = self.config.rope_n_elem
        q = torch.cat((apply_rope(q[..., :n], cos, sin), q[..., n:]), dim=-1)
        k = torch.cat((apply_rope(k[..., :n], cos, sin), k[..., n:]), dim=-1)
        scale = 1.0 / math.sqrt(self.config.head_size)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=scale, is_causal=mask is None)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


class FlatSplit(LitCausalSelfAttention):
    split = "flat"


class TiledGroups(LitCausalSelfAttention):
    split = "tiled"


class LLaMAMLP(nn.Module):
    def __init__(self, config: LitConfig) -> None:
        super().__init__()
        self.fc_1 = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.fc_2 = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.silu(self.fc_1(x)) * self.fc_2(x))


class LitBlock(nn.Module):
    def __init__(self, config: LitConfig, attention: type[LitCausalSelfAttention]) -> None:
        super().__init__()
        self.norm_1 = LitRMSNorm(config.n_embd, eps=config.norm_eps)
        self.attn = attention(config)
        self.norm_2 = LitRMSNorm(config.n_embd, eps=config.norm_eps)
        self.mlp = LLaMAMLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = self.attn(self.norm_1(x), cos, sin) + x
        return self.mlp(self.norm_2(x)) + x


class LitGPT(nn.Module):
    def __init__(self, config: LitConfig, second: type[LitCausalSelfAttention]) -> None:
        super().__init__()
        self.config = config
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.padded_vocab_size, config.n_embd),
                h=nn.ModuleList([LitBlock(config, LitCausalSelfAttention), LitBlock(config, second)]),
                ln_f=LitRMSNorm(config.n_embd, eps=config.norm_eps),
            )
        )
        cos, sin = build_rope_cache(config.block_size, config.rope_n_elem, config.rope_base)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.size(1)
        if T > self.config.block_size:
            raise ValueError(f"Cannot forward sequence of length {T}, max seq length is only {self.config.block_size}.")
        x = self.transformer["wte"](idx)
        for block in self.transformer["h"]:
            x = block(x, self.cos[:T], self.sin[:T])
        return self.lm_head(self.transformer["ln_f"](x))


def lit_gpt(second: type[LitCausalSelfAttention] = LitCausalSelfAttention) -> LitGPT:
    torch.manual_seed(0)
    return _jitter(LitGPT(LitConfig(), second))  # type: ignore[return-value]


# -- labml.ai style: sequence-first everywhere, PrepareForMultiHeadAttention, masks (seq_q, seq_k, batch) -----------


class PrepareForMultiHeadAttention(nn.Module):
    """A linear, then the last axis split into heads: (seq_len, batch, d_model) -> (seq_len, batch, heads, d_k)."""

    def __init__(self, d_model: int, heads: int, d_k: int, bias: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(d_model, heads * d_k, bias=bias)
        self.heads, self.d_k = heads, d_k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        head_shape = x.shape[:-1]
        return self.linear(x).view(*head_shape, self.heads, self.d_k)


class LabmlMultiHeadAttention(nn.Module):
    def __init__(self, heads: int, d_model: int, dropout_prob: float = 0.1, bias: bool = True) -> None:
        super().__init__()
        self.d_k, self.heads = d_model // heads, heads
        self.query = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias=bias)
        self.key = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias=bias)
        self.value = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias=True)
        self.softmax = nn.Softmax(dim=1)
        self.output = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout_prob)
        self.scale = 1 / math.sqrt(self.d_k)
        self.attn: torch.Tensor | None = None

    def get_scores(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        return torch.einsum("ibhd,jbhd->ijbh", query, key)

    def prepare_mask(self, mask: torch.Tensor, query_shape: torch.Size, key_shape: torch.Size) -> torch.Tensor:
        """(seq_len_q or 1, seq_len_k, batch or 1) -> broadcast over the heads."""
        assert mask.shape[0] == 1 or mask.shape[0] == query_shape[0]
        assert mask.shape[1] == key_shape[0]
        assert mask.shape[2] == 1 or mask.shape[2] == query_shape[1]
        return mask.unsqueeze(-1)

    def forward(
        self, *, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        seq_len, batch_size, _ = query.shape
        if mask is not None:
            mask = self.prepare_mask(mask, query.shape, key.shape)
        query, key, value = self.query(query), self.key(key), self.value(value)
        scores = self.get_scores(query, key) * self.scale
        if mask is not None:
            scores = scores.masked_fill(mask == 0, float("-inf"))
        attn = self.dropout(self.softmax(scores))
        self.attn = attn.detach()
        x = torch.einsum("ijbh,jbhd->ibhd", attn, value)
        return self.output(x.reshape(seq_len, batch_size, -1))


class KeysFirstMask(LabmlMultiHeadAttention):
    """The mistake: the (1, seq_len_k, batch) padding mask read as keys-first and put as (seq_len_k, 1, batch)."""

    def prepare_mask(self, mask: torch.Tensor, query_shape: torch.Size, key_shape: torch.Size) -> torch.Tensor:
        return mask.transpose(0, 1).unsqueeze(-1)


class LabmlFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.layer1 = nn.Linear(d_model, d_ff)
        self.layer2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer2(self.dropout(self.activation(self.layer1(x))))


class LabmlTransformerLayer(nn.Module):
    def __init__(self, d_model: int, self_attn: nn.Module, feed_forward: nn.Module, dropout_prob: float) -> None:
        super().__init__()
        self.size = d_model
        self.self_attn, self.feed_forward = self_attn, feed_forward
        self.dropout = nn.Dropout(dropout_prob)
        self.norm_self_attn = nn.LayerNorm([d_model])
        self.norm_ff = nn.LayerNorm([d_model])

    def forward(self, *, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        z = self.norm_self_attn(x)
        x = x + self.dropout(self.self_attn(query=z, key=z, value=z, mask=mask))
        z = self.norm_ff(x)
        return x + self.dropout(self.feed_forward(z))


def get_positional_encoding(d_model: int, max_len: int = 5000) -> torch.Tensor:
    """(max_len, 1, d_model): sin in the even features, cos in the odd, at 10000^(-2i / d_model)."""
    encodings = torch.zeros(max_len, d_model)
    position = torch.arange(0, max_len, dtype=torch.float32).unsqueeze(1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)
    div_term = torch.exp(two_i * -(math.log(10000.0) / d_model))
    encodings[:, 0::2] = torch.sin(position * div_term)
    encodings[:, 1::2] = torch.cos(position * div_term)
    return encodings.unsqueeze(1).requires_grad_(False)


class EmbeddingsWithPositionalEncoding(nn.Module):
    def __init__(self, d_model: int, n_vocab: int, max_len: int = 5000) -> None:
        super().__init__()
        self.linear = nn.Embedding(n_vocab, d_model)
        self.d_model = d_model
        self.register_buffer("positional_encodings", get_positional_encoding(d_model, max_len), False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pe = self.positional_encodings[: x.shape[0]].requires_grad_(False)
        return self.linear(x) * math.sqrt(self.d_model) + pe.to(self.linear.weight.dtype)


class LabmlEncoder(nn.Module):
    def __init__(self, layer: LabmlTransformerLayer, n_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([copy.deepcopy(layer) for _ in range(n_layers)])
        self.norm = nn.LayerNorm([layer.size])

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x=x, mask=mask)
        return self.norm(x)


class LabmlEncoderModel(nn.Module):
    """ids (seq_len, batch) -> (seq_len, batch, d_model); the padding (id 0) hidden as keys by a (1, seq_k, batch)
    mask."""

    def __init__(self, second: type[LabmlMultiHeadAttention]) -> None:
        super().__init__()
        layer = LabmlTransformerLayer(D, LabmlMultiHeadAttention(H, D, 0.1), LabmlFeedForward(D, 64), 0.1)
        self.src_embed = EmbeddingsWithPositionalEncoding(D, V, T_MAX)
        self.encoder = LabmlEncoder(layer, 2)
        self.encoder.layers[1].self_attn = second(H, D, 0.1)

    def forward(self, src: torch.Tensor) -> torch.Tensor:
        mask = (src != 0).unsqueeze(0)  # (1, seq_len_k, batch)
        return self.encoder(self.src_embed(src), mask)


def labml_encoder(second: type[LabmlMultiHeadAttention] = LabmlMultiHeadAttention) -> LabmlEncoderModel:
    torch.manual_seed(0)
    return _jitter(LabmlEncoderModel(second))  # type: ignore[return-value]


def labml_attention() -> LabmlMultiHeadAttention:
    torch.manual_seed(0)
    return _jitter(LabmlMultiHeadAttention(H, D, 0.1))  # type: ignore[return-value]


# -- OpenNMT-py style: keys-first attention, the feed-forward's norm inside it, masks True = padding ------------------


class OnmtPositionalEncoding(nn.Module):
    def __init__(self, dropout: float, dim: int, max_len: int = 5000) -> None:
        super().__init__()
        pe = torch.zeros(max_len, dim)
        position = torch.arange(0, max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, dim, 2, dtype=torch.float) * -(math.log(10000.0) / dim))
        pe[:, 0::2] = torch.sin(position.float() * div_term)
        pe[:, 1::2] = torch.cos(position.float() * div_term)
        self.register_buffer("pe", pe.unsqueeze(0))  # (1, max_len, dim)
        self.dropout = nn.Dropout(p=dropout)
        self.dim = dim

    def forward(self, emb: torch.Tensor) -> torch.Tensor:
        emb = emb * math.sqrt(self.dim)
        return self.dropout(emb + self.pe[:, : emb.size(1)].to(emb.dtype))


class OnmtEmbeddings(nn.Module):
    def __init__(self, dim: int, vocab: int, padding_idx: int, dropout: float) -> None:
        super().__init__()
        self.word_padding_idx = padding_idx
        self.word_lut = nn.Embedding(vocab, dim, padding_idx=padding_idx)
        self.pe = OnmtPositionalEncoding(dropout, dim, T_MAX)

    def forward(self, source: torch.Tensor) -> torch.Tensor:
        return self.pe(self.word_lut(source))


class MultiHeadedAttention(nn.Module):
    """forward(key, value, query, mask): mask (B, 1 or T_q, T_k), True = hidden; returns (output, attention)."""

    def __init__(self, head_count: int, model_dim: int, dropout: float = 0.1) -> None:
        super().__init__()
        assert model_dim % head_count == 0
        self.dim_per_head = model_dim // head_count
        self.model_dim, self.head_count = model_dim, head_count
        self.linear_keys = nn.Linear(model_dim, head_count * self.dim_per_head)
        self.linear_values = nn.Linear(model_dim, head_count * self.dim_per_head)
        self.linear_query = nn.Linear(model_dim, head_count * self.dim_per_head)
        self.softmax = nn.Softmax(dim=-1)
        self.dropout = nn.Dropout(dropout)
        self.final_linear = nn.Linear(model_dim, model_dim)

    def _broadcast(self, mask: torch.Tensor) -> torch.Tensor:
        return mask.unsqueeze(1)  # [B, 1, 1 or T_q, T_k]

    def forward(self, key, value, query, mask=None):
        batch_size, head_count, dim_per_head = key.size(0), self.head_count, self.dim_per_head

        def shape(x):
            return x.view(batch_size, -1, head_count, dim_per_head).transpose(1, 2)

        def unshape(x):
            return x.transpose(1, 2).contiguous().view(batch_size, -1, head_count * dim_per_head)

        key, value = shape(self.linear_keys(key)), shape(self.linear_values(value))
        query = shape(self.linear_query(query)) / math.sqrt(dim_per_head)
        scores = torch.matmul(query, key.transpose(2, 3))
        if mask is not None:
            scores = scores.masked_fill(self._broadcast(mask), -1e18)
        attn = self.softmax(scores)
        context = unshape(torch.matmul(self.dropout(attn), value))
        return self.final_linear(context), attn[:, 0]


class PaddingOnQueries(MultiHeadedAttention):
    """The mistake: the (B, 1, T) key padding unsqueezed at the end, (B, 1, T, 1): it hides the padded queries' rows."""

    def _broadcast(self, mask: torch.Tensor) -> torch.Tensor:
        return mask.unsqueeze(-1)


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.layer_norm = nn.LayerNorm(d_model, eps=1e-6)
        self.dropout_1, self.dropout_2 = nn.Dropout(dropout), nn.Dropout(dropout)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inter = self.dropout_1(self.relu(self.w_1(self.layer_norm(x))))
        return self.dropout_2(self.w_2(inter)) + x


class OnmtEncoderLayer(nn.Module):
    def __init__(self, attention: type[MultiHeadedAttention] = MultiHeadedAttention) -> None:
        super().__init__()
        self.self_attn = attention(H, D, dropout=0.1)
        self.feed_forward = PositionwiseFeedForward(D, 64, 0.1)
        self.layer_norm = nn.LayerNorm(D, eps=1e-6)
        self.dropout = nn.Dropout(0.1)

    def forward(self, inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        input_norm = self.layer_norm(inputs)
        context, _ = self.self_attn(input_norm, input_norm, input_norm, mask=mask)
        return self.feed_forward(self.dropout(context) + inputs)


class OnmtDecoderLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = MultiHeadedAttention(H, D, dropout=0.1)
        self.context_attn = MultiHeadedAttention(H, D, dropout=0.1)
        self.feed_forward = PositionwiseFeedForward(D, 64, 0.1)
        self.layer_norm_1 = nn.LayerNorm(D, eps=1e-6)
        self.layer_norm_2 = nn.LayerNorm(D, eps=1e-6)
        self.drop = nn.Dropout(0.1)

    def forward(self, inputs, memory_bank, src_pad_mask, tgt_pad_mask):
        tgt_len = tgt_pad_mask.size(-1)
        future_mask = torch.ones(tgt_len, tgt_len, dtype=torch.bool, device=inputs.device).triu_(1)
        dec_mask = tgt_pad_mask | future_mask.view(1, tgt_len, tgt_len)
        input_norm = self.layer_norm_1(inputs)
        query, _ = self.self_attn(input_norm, input_norm, input_norm, mask=dec_mask)
        query = self.drop(query) + inputs
        query_norm = self.layer_norm_2(query)
        mid, attn = self.context_attn(memory_bank, memory_bank, query_norm, mask=src_pad_mask)
        return self.feed_forward(self.drop(mid) + query), attn


class OnmtEncoder(nn.Module):
    def __init__(self, second: type[MultiHeadedAttention]) -> None:
        super().__init__()
        self.embeddings = OnmtEmbeddings(D, V, PAD_ONMT, 0.1)
        self.transformer = nn.ModuleList([OnmtEncoderLayer(), OnmtEncoderLayer(second)])
        self.layer_norm = nn.LayerNorm(D, eps=1e-6)

    def forward(self, src: torch.Tensor) -> torch.Tensor:
        out = self.embeddings(src)
        mask = src.eq(self.embeddings.word_padding_idx).unsqueeze(1)  # [B, 1, T]
        for layer in self.transformer:
            out = layer(out, mask)
        return self.layer_norm(out)


class OnmtDecoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embeddings = OnmtEmbeddings(D, V, PAD_ONMT, 0.1)
        self.transformer_layers = nn.ModuleList([OnmtDecoderLayer(), OnmtDecoderLayer()])
        self.layer_norm = nn.LayerNorm(D, eps=1e-6)

    def forward(self, tgt: torch.Tensor, memory_bank: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        pad = self.embeddings.word_padding_idx
        src_pad_mask, tgt_pad_mask = src.eq(pad).unsqueeze(1), tgt.eq(pad).unsqueeze(1)
        output = self.embeddings(tgt)
        for layer in self.transformer_layers:
            output, _ = layer(output, memory_bank, src_pad_mask, tgt_pad_mask)
        return self.layer_norm(output)


class NMTModel(nn.Module):
    def __init__(self, second: type[MultiHeadedAttention]) -> None:
        super().__init__()
        self.encoder = OnmtEncoder(second)
        self.decoder = OnmtDecoder()
        self.generator = nn.Sequential(nn.Linear(D, V), nn.LogSoftmax(dim=-1))

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        memory_bank = self.encoder(src)
        return self.generator(self.decoder(tgt, memory_bank, src))


def onmt(second: type[MultiHeadedAttention] = MultiHeadedAttention) -> NMTModel:
    torch.manual_seed(0)
    return _jitter(NMTModel(second))  # type: ignore[return-value]


# -- ESPnet style: forward(x, mask) -> (x, mask), mask (B, 1, T) True = keep, macaron and conv off ------------------


class EspnetLayerNorm(nn.LayerNorm):
    def __init__(self, nout: int) -> None:
        super().__init__(nout, eps=1e-12)


class EspnetMultiHeadedAttention(nn.Module):
    hidden = 0  # mask.eq(hidden) is True where a key is hidden: 0 (ESPnet's); the mistake: 1

    def __init__(self, n_head: int, n_feat: int, dropout_rate: float) -> None:
        super().__init__()
        self.d_k, self.h = n_feat // n_head, n_head
        self.linear_q = nn.Linear(n_feat, n_feat)
        self.linear_k = nn.Linear(n_feat, n_feat)
        self.linear_v = nn.Linear(n_feat, n_feat)
        self.linear_out = nn.Linear(n_feat, n_feat)
        self.attn: torch.Tensor | None = None
        self.dropout = nn.Dropout(p=dropout_rate)

    def forward_qkv(self, query, key, value):
        n_batch = query.size(0)
        q = self.linear_q(query).view(n_batch, -1, self.h, self.d_k).transpose(1, 2)
        k = self.linear_k(key).view(n_batch, -1, self.h, self.d_k).transpose(1, 2)
        v = self.linear_v(value).view(n_batch, -1, self.h, self.d_k).transpose(1, 2)
        return q, k, v

    def forward_attention(self, value, scores, mask):
        n_batch = value.size(0)
        if mask is not None:
            mask = mask.unsqueeze(1).eq(self.hidden)  # (batch, 1, *, time2)
            min_value = torch.finfo(scores.dtype).min
            scores = scores.masked_fill(mask, min_value)
            self.attn = torch.softmax(scores, dim=-1).masked_fill(mask, 0.0)
        else:
            self.attn = torch.softmax(scores, dim=-1)
        x = torch.matmul(self.dropout(self.attn), value)
        return self.linear_out(x.transpose(1, 2).contiguous().view(n_batch, -1, self.h * self.d_k))

    def forward(self, query, key, value, mask):
        q, k, v = self.forward_qkv(query, key, value)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)
        return self.forward_attention(v, scores, mask)


class InvertedKeep(EspnetMultiHeadedAttention):
    hidden = 1


class EspnetFeedForward(nn.Module):
    def __init__(self, idim: int, hidden_units: int, dropout_rate: float) -> None:
        super().__init__()
        self.w_1 = nn.Linear(idim, hidden_units)
        self.w_2 = nn.Linear(hidden_units, idim)
        self.dropout = nn.Dropout(dropout_rate)
        self.activation = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.dropout(self.activation(self.w_1(x))))


class EspnetEncoderLayer(nn.Module):
    """Conformer-style layer with its optional parts off: no macaron feed-forward, no convolution module."""

    def __init__(
        self, size, self_attn, feed_forward, feed_forward_macaron=None, conv_module=None, dropout_rate=0.1,
        normalize_before=True, concat_after=False,
    ):  # fmt: skip
        super().__init__()
        self.self_attn, self.feed_forward = self_attn, feed_forward
        self.feed_forward_macaron, self.conv_module = feed_forward_macaron, conv_module
        self.norm_ff, self.norm_mha = EspnetLayerNorm(size), EspnetLayerNorm(size)
        if feed_forward_macaron is not None:
            self.norm_ff_macaron = EspnetLayerNorm(size)
            self.ff_scale = 0.5
        else:
            self.ff_scale = 1.0
        if conv_module is not None:
            self.norm_conv, self.norm_final = EspnetLayerNorm(size), EspnetLayerNorm(size)
        self.dropout = nn.Dropout(dropout_rate)
        self.size, self.normalize_before, self.concat_after = size, normalize_before, concat_after
        if concat_after:
            self.concat_linear = nn.Linear(size + size, size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.feed_forward_macaron is not None:
            residual = x
            x = self.norm_ff_macaron(x) if self.normalize_before else x
            x = residual + self.ff_scale * self.dropout(self.feed_forward_macaron(x))
        residual = x
        if self.normalize_before:
            x = self.norm_mha(x)
        x_att = self.self_attn(x, x, x, mask)
        if self.concat_after:
            x = residual + self.concat_linear(torch.cat((x, x_att), dim=-1))
        else:
            x = residual + self.dropout(x_att)
        if not self.normalize_before:
            x = self.norm_mha(x)
        residual = x
        if self.normalize_before:
            x = self.norm_ff(x)
        x = residual + self.ff_scale * self.dropout(self.feed_forward(x))
        if not self.normalize_before:
            x = self.norm_ff(x)
        return x, mask


def _espnet_layer(attention: type[EspnetMultiHeadedAttention]) -> EspnetEncoderLayer:
    return EspnetEncoderLayer(D, attention(H, D, 0.1), EspnetFeedForward(D, 64, 0.1), dropout_rate=0.1)


class EspnetEncoderStack(nn.Module):
    """Two layers on features (B, T, D) and the after_norm; forward(xs, masks) -> (xs, masks)."""

    def __init__(self, second: type[EspnetMultiHeadedAttention]) -> None:
        super().__init__()
        self.encoders = nn.ModuleList([_espnet_layer(EspnetMultiHeadedAttention), _espnet_layer(second)])
        self.after_norm = EspnetLayerNorm(D)

    def forward(self, xs: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for layer in self.encoders:
            xs, masks = layer(xs, masks)
        return self.after_norm(xs), masks


def espnet_layer(attention: type[EspnetMultiHeadedAttention] = EspnetMultiHeadedAttention) -> EspnetEncoderLayer:
    torch.manual_seed(0)
    return _jitter(_espnet_layer(attention))  # type: ignore[return-value]


def espnet_stack(second: type[EspnetMultiHeadedAttention] = EspnetMultiHeadedAttention) -> EspnetEncoderStack:
    torch.manual_seed(0)
    return _jitter(EspnetEncoderStack(second))  # type: ignore[return-value]


# -- xformers style: BMHK tensors, an attn_bias object, in plain torch --------------------------------------------


class LowerTriangularMask:
    """A causal bias: materialised as 0 on and below the diagonal, -inf above it. `upper`: the mistake, the bias
    read as upper triangular (-inf below the diagonal)."""

    def __init__(self, upper: bool = False) -> None:
        self.upper = upper

    def materialize(self, shape, dtype=torch.float32, device="cpu") -> torch.Tensor:
        full = torch.full(shape[-2:], float("-inf"), dtype=dtype, device=device)
        return full.tril(-1) if self.upper else full.triu(1)


def memory_efficient_attention(query, key, value, attn_bias=None, p: float = 0.0, scale: float | None = None):
    """query, key, value (batch, seq, heads, head_dim) -> (batch, seq_q, heads, head_dim)."""
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    q, k, v = (query * scale).transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    attn = q @ k.transpose(-2, -1)
    if attn_bias is not None:
        attn = attn + attn_bias.materialize(attn.shape, attn.dtype, attn.device)
    attn = F.dropout(attn.softmax(-1), p)
    return (attn @ v).transpose(1, 2)


class XformersAttention(nn.Module):
    upper = False
    gated = True  # the dropout's p zero in evaluation

    def __init__(self, dropout: float = 0.1) -> None:
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.attn_drop = dropout
        self.attn_bias = LowerTriangularMask(upper=self.upper)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, M, _ = x.shape
        q, k, v = self.qkv(x).view(B, M, 3, H, D // H).unbind(2)  # each BMHK
        p = self.attn_drop if (self.training or not self.gated) else 0.0
        y = memory_efficient_attention(q, k, v, attn_bias=self.attn_bias, p=p)
        return self.proj(y.reshape(B, M, D))


class UpperBias(XformersAttention):
    upper = True


class UngatedDropout(XformersAttention):
    gated = False


class XformersBlock(nn.Module):
    def __init__(self, attention: type[XformersAttention]) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = attention()
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class XformersGPT(nn.Module):
    def __init__(self, second: type[XformersAttention]) -> None:
        super().__init__()
        self.tok_emb, self.pos_emb = nn.Embedding(V, D), nn.Parameter(0.02 * torch.randn(1, T_MAX, D))
        self.blocks = nn.ModuleList([XformersBlock(XformersAttention), XformersBlock(second)])
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(idx) + self.pos_emb[:, : idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def xformers_gpt(second: type[XformersAttention] = XformersAttention) -> XformersGPT:
    torch.manual_seed(0)
    return _jitter(XformersGPT(second))  # type: ignore[return-value]


def _bmhk_example() -> tuple:
    """One real call of the function: BMHK tensors (2, 5, 4, 8), no bias."""
    g = torch.Generator().manual_seed(1)
    return tuple(torch.randn(2, 5, H, HD, generator=g) for _ in range(3)), {}


def _labml_example() -> tuple:
    """One real call of labml's attention: keyword-only, features (5, 2, D), a padding mask (1, 5, 2) hiding the
    last two keys of the second sequence."""
    x = torch.randn(5, 2, D, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(1, 5, 2, dtype=torch.bool)
    mask[0, 3:, 1] = False
    return (), dict(query=x, key=x, value=x, mask=mask)


CASES = [
    ("lit_groups", lit_gpt, "transformer_lm", {}, "pass"),
    ("lit_groups.qkv_split_flat_second_block", lambda: lit_gpt(FlatSplit), "transformer_lm", {}, "pass"),
    (
        "lit_groups.kv_repeat_tiled_second_block",
        lambda: lit_gpt(TiledGroups),
        "transformer_lm",
        {},
        ("mistake", "attention.kv_heads_tiled", "transformer.h.1.attn"),
    ),
    ("labml_encoder", labml_encoder, "encoder_model", {}, "pass"),
    (
        "labml_encoder.mask_over_keys_axis_second_layer",
        lambda: labml_encoder(KeysFirstMask),
        "encoder_model",
        {},
        ("mistake", "attention.padding_on_queries", "encoder.layers.1.self_attn"),
    ),
    (
        "labml_attention",
        labml_attention,
        "multi_head_attention",
        {},
        ("could not judge", None, "pass call="),
    ),
    ("labml_attention.example", labml_attention, "multi_head_attention", {"example": _labml_example()}, "pass"),
    ("onmt_nmt", onmt, "transformer", {"pad_id": PAD_ONMT}, "pass"),
    (
        "onmt_nmt.key_padding_on_queries_second_encoder_layer",
        lambda: onmt(PaddingOnQueries),
        "transformer",
        {"pad_id": PAD_ONMT},
        ("mistake", "attention.padding_on_queries", "encoder.transformer.1.self_attn"),
    ),
    ("onmt_decoder_layer", lambda: onmt().decoder.transformer_layers[0], "decoder_layer", {}, "pass"),
    ("espnet_layer", espnet_layer, "encoder_layer", {}, "pass"),
    ("espnet_layer.keep_mask_inverted", lambda: espnet_layer(InvertedKeep), "encoder_layer", {}, "pass"),
    (
        "espnet_layer.keep_mask_inverted.mask_given",
        lambda: espnet_layer(InvertedKeep),
        "encoder_layer",
        {"mask": "bool_keep"},
        ("mistake", "attention.mask_inverted", "self_attn"),
    ),
    ("espnet_stack", espnet_stack, "encoder_stack", {}, "pass"),
    (
        "espnet_stack.keep_mask_inverted_second_layer",
        lambda: espnet_stack(InvertedKeep),
        "encoder_stack",
        {},
        ("mistake", "attention.mask_inverted", "encoders.1.self_attn"),
    ),
    ("xformers_gpt", xformers_gpt, "transformer_lm", {}, "pass"),
    (
        "xformers_gpt.bias_upper_triangular_second_block",
        lambda: xformers_gpt(UpperBias),
        "transformer_lm",
        {},
        ("mistake", "attention.mask_inverted", "blocks.1.attn"),
    ),
    (
        "xformers_gpt.dropout_p_ungated_second_block",
        lambda: xformers_gpt(UngatedDropout),
        "transformer_lm",
        {},
        ("mistake", "dropout.active_in_eval", "blocks.1.attn"),
    ),
    (
        "xformers_function",
        lambda: memory_efficient_attention,
        "scaled_dot_product_attention",
        {"example": _bmhk_example()},
        "pass",
    ),
]
