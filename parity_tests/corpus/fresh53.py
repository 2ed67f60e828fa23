"""Meta-lineage Llama code as learners copy it in 2025-26 (issue 46, round 53), in this project's own words: the
reference repository's ``model.py``, torchtune's components, torchtitan's model and gpt-fast's, each rewritten small.
The judge meets them here first (measured with the judge frozen).

- the reference ``model.py``: a ``ModelArgs`` dataclass, model-parallel layers written as stand-ins at world size 1
  (``ColumnParallelLinear`` with ``gather_output=False``, ``RowParallelLinear`` with ``input_is_parallel=True``,
  ``VocabParallelEmbedding``, each a small module of its own holding an (out, in) ``weight`` read by ``F.linear`` or
  ``F.embedding``), ``precompute_freqs_cis`` as complex numbers of interleaved pairs, ``n_local_heads``, K/V cache
  tensors written at ``start_pos`` and read back up to ``start_pos + seqlen``, ``repeat_kv`` by expand + reshape, a
  FeedForward of ``hidden_dim = multiple_of * ceil(...)`` after ``ffn_dim_multiplier``, and an additive ``-inf``
  mask made in ``Transformer.forward(tokens, start_pos)`` (its user passes ``call=`` with ``start_pos=0``); the same
  with Llama 3.1's ``apply_scaling`` of the frequencies (factor 8, low 1, high 4, an original context of 8192: with
  a head of 8 at base 500000 one frequency is kept, one blended, one divided by 8);
- torchtune's components: a ``MultiHeadAttention`` handed its q/k/v/output projections and its ``pos_embeddings``
  module (a rotary cache of (cos, sin) pairs, turned in interleaved pairs on [b, s, h, d]), optional ``q_norm`` /
  ``k_norm``, K/V heads widened by unsqueeze + expand + flatten, SDPA; ``TransformerSelfAttentionLayer(attn, mlp,
  sa_norm, mlp_norm, sa_scale=None)``; a ``TransformerDecoder(tok_embeddings, layers, max_seq_len, num_heads,
  head_dim, norm, output)`` whose output is a ``TiedLinear`` (a plain object, not a module, reading the embedding's
  weight), built by a ``llama3_builder(...)`` function;
- torchtitan's model: ``init_weights`` methods (depth-scaled std, truncated normals), ``layers`` an nn.ModuleDict
  keyed "0", "1", ``freqs_cis`` a non-persistent complex buffer, ``repeat_kv`` by expand + reshape, ``nn.RMSNorm``;
- gpt-fast's model: ``setup_caches(max_batch_size, max_seq_length)``, a ``KVCache`` module whose ``update`` writes
  at ``input_pos``, ``Transformer.forward(idx, input_pos)`` under a causal-mask buffer indexed by ``input_pos``, and
  Llama 3.1's scaling applied to its frequencies (``apply_rope_scaling``);
- mistakes put in the second layer, one each: the reference's K/V heads tiled (expand on the wrong axis), its
  rotation put on v, its scores over head_dim, the 3.1 model's attention_norm of eps outside the root; torchtune's
  keys turned in halves while the queries are turned in pairs, its second attention not causal; torchtitan's
  ffn_norm of eps outside the root and its SDPA given scale 1 / head_dim; gpt-fast's keys turned at ``input_pos +
  1`` (the queries at ``input_pos``);
- the reference model called without ``start_pos`` (no ``call=``): its forward cannot run on ids alone, so the
  honest answer is could not judge, naming ``call=``;
- the two Llama 3.1 models also with ``rope_theta`` and ``rope_scaling`` given (the judge reads a scaled table only
  from a transformers config, and Meta's code states it as ``use_scaled_rope`` alone);
- torchtune's q_norm / k_norm as its MultiHeadAttention applies them, after the rotation: an RMSNorm's gain per
  feature after the pairs are turned, which no rotation of the reference's gives back (no pair, said at the first
  attention); the same norms put before the rotation (as Qwen3's reference code has them) are the reference's
  qk_norm: a pass.

Expected verdicts decided from the math before the judge ran: the correct models are the reference's Llama (grouped
K/V heads, interleaved or llama3-scaled rotary, RMSNorm, SwiGLU), the tied torchtune head its tied embeddings. The
``.float()`` casts the originals write around the rotation, the softmax and the norm are left out (in a float64 run
they are a float32 island, fresh12's case). ``max_plain_error()`` measures each correct model against one plain
per-head Llama written here (its weights read out by hand) in float64: at most 7e-15 on all five.

One case was replaced after the judge's first run, on the math: gpt-fast's mask buffer built with ``tril(...,
diagonal=1)`` was meant as the catalogue's causal_shows_next; but gpt-fast reads its whole cache, so the last
position also sees an empty cache slot (a zero key and value), which the catalogue's slip on a T-long sequence does
not: not the catalogued mistake to the letter (the judge said unexplained at layers.1.attention). The keys turned one
position on took its place.

First met: 15 of 19 right (the judge frozen). Wrong:

- f53_meta_llama31 and f53_fast_llama31 (Llama 3.1's scaled frequencies at an original context of 8192, nothing
  given): "unexplained: layers.0.attention ... not expressible by the config", judged at rope_theta 10000; the
  scaled table is read only from a transformers config's rope_scaling (tables.stated_scaling), not fitted from the
  numbers a kept table (Meta's plain ``freqs_cis`` attribute, gpt-fast's (cos, sin) buffer) holds. Given
  ``rope_theta`` and ``rope_scaling``, both pass and gpt-fast's mistake is named;
- f53_meta_llama31.attention_norm_eps_outside_root_second_layer: the same, unexplained at layers.0.attention,
  before its second layer is reached;
- f53_tune_llama3.qk_norm_after_rotation: "unexplained: layers.0.attn ... no catalogue variant reproduces it", the
  place right but neither an id nor the op said (fresh23's Hunyuan q/k norms after the rotation, the same class).

Fixed since: where no config states a scaled RoPE, Llama 3.1's scaling is read from the frequencies of a table the
module keeps or its forward computes (tables.fitted_scaling: the base from the high end, kept, or from the two
lowest, both divided; the factor from the lowest; the original length and high_freq_factor from the blended ones),
then checked by building the table again at that fit; the q/k norms' gain met after the queries are multiplied by a
cos or sin table the module keeps (torchtune's cache, not only the cos and sin the forward computes, Hunyuan's) is
said as no pair at the attention (unsupported._norm_after_rotary).

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from transformer_spec.config import RopeScaling

D, H, KV, V, T_MAX = 32, 4, 2, 26, 16
HD = D // H
LM = "transformer_lm"


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains moved off their 1s, so that trained values are what is checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def scaled_freqs(freqs: torch.Tensor, factor=8.0, low=1.0, high=4.0, old_len=8192) -> torch.Tensor:
    """Llama 3.1's frequencies: long wavelengths divided by `factor`, short ones kept, a blend between."""
    wavelen = 2 * math.pi / freqs
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * freqs / factor + smooth * freqs
    out = torch.where(wavelen > old_len / low, freqs / factor, blended)
    return torch.where(wavelen < old_len / high, freqs, out)


def inv_freqs(dim: int, theta: float, scaled: bool) -> torch.Tensor:
    freqs = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64)[: dim // 2] / dim)
    return scaled_freqs(freqs) if scaled else freqs


def precompute_freqs_cis(dim: int, end: int, theta: float = 500000.0, use_scaled: bool = False) -> torch.Tensor:
    """Complex rotations e^(i t w) for t < end (built in float64: complex128)."""
    angles = torch.outer(torch.arange(end, dtype=torch.float64), inv_freqs(dim, theta, use_scaled))
    return torch.polar(torch.ones_like(angles), angles)


def apply_rotary_emb(xq, xk, freqs_cis):
    """Interleaved pairs (2i, 2i + 1) read as complex numbers, times freqs_cis (seqlen, d/2)."""
    xq_ = torch.view_as_complex(xq.reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.reshape(*xk.shape[:-1], -1, 2))
    f = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    return torch.view_as_real(xq_ * f).flatten(3).type_as(xq), torch.view_as_real(xk_ * f).flatten(3).type_as(xk)


def repeat_kv(x: torch.Tensor, n_rep: int, tiled: bool = False) -> torch.Tensor:
    """(bs, slen, n_kv, hd) -> (bs, slen, n_kv * n_rep, hd), each K/V head n_rep times in a row; `tiled`: the
    mistake, the new axis put before the heads (the heads' list repeated whole)."""
    bs, slen, n_kv, hd = x.shape
    if n_rep == 1:
        return x
    if tiled:
        return x[:, :, None].expand(bs, slen, n_rep, n_kv, hd).reshape(bs, slen, n_kv * n_rep, hd)
    return x[:, :, :, None, :].expand(bs, slen, n_kv, n_rep, hd).reshape(bs, slen, n_kv * n_rep, hd)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight; `eps_outside`: the mistake, x / (sqrt(mean(x^2)) + eps)."""

    def __init__(self, dim: int, eps: float = 1e-5, eps_outside: bool = False):
        super().__init__()
        self.eps, self.eps_outside = eps, eps_outside
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        if self.eps_outside:
            return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self._norm(x) * self.weight


# -- the reference model.py, model-parallel layers at world size 1 ------------------------------------------------


class ColumnParallelLinear(nn.Module):
    """The output features split over the ranks; at world size 1 the whole (out, in) weight, `gather_output` moot."""

    def __init__(self, in_features, out_features, bias=False, gather_output=True, init_method=None):
        super().__init__()
        self.gather_output = gather_output
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        nn.init.normal_(self.weight, std=in_features**-0.5)

    def forward(self, x):
        return F.linear(x, self.weight)


class RowParallelLinear(nn.Module):
    """The input features split over the ranks, the partial products all-reduced; at world size 1 a plain linear."""

    def __init__(self, in_features, out_features, bias=False, input_is_parallel=False, init_method=None):
        super().__init__()
        self.input_is_parallel = input_is_parallel
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        nn.init.normal_(self.weight, std=in_features**-0.5)

    def forward(self, x):
        return F.linear(x, self.weight)


class VocabParallelEmbedding(nn.Module):
    """The vocabulary split over the ranks; at world size 1 the whole table."""

    def __init__(self, num_embeddings, embedding_dim, init_method=None):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(num_embeddings, embedding_dim))

    def forward(self, ids):
        return F.embedding(ids, self.weight)


@dataclass
class ModelArgs:
    dim: int = D
    n_layers: int = 2
    n_heads: int = H
    n_kv_heads: int | None = KV
    vocab_size: int = V
    multiple_of: int = 16
    ffn_dim_multiplier: float | None = 1.3
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    use_scaled_rope: bool = False
    max_batch_size: int = 8
    max_seq_len: int = T_MAX
    # the second layer's mistake: "tiled", "rope_v", "head_dim", "eps" or ""
    second: str = ""


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, mistake: str = ""):
        super().__init__()
        self.n_kv_heads = args.n_heads if args.n_kv_heads is None else args.n_kv_heads
        model_parallel_size = 1
        self.n_local_heads = args.n_heads // model_parallel_size
        self.n_local_kv_heads = self.n_kv_heads // model_parallel_size
        self.n_rep = self.n_local_heads // self.n_local_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.mistake = mistake
        self.wq = ColumnParallelLinear(args.dim, args.n_heads * self.head_dim, gather_output=False)
        self.wk = ColumnParallelLinear(args.dim, self.n_kv_heads * self.head_dim, gather_output=False)
        self.wv = ColumnParallelLinear(args.dim, self.n_kv_heads * self.head_dim, gather_output=False)
        self.wo = RowParallelLinear(args.n_heads * self.head_dim, args.dim, input_is_parallel=True)
        shape = (args.max_batch_size, args.max_seq_len, self.n_local_kv_heads, self.head_dim)
        self.cache_k = torch.zeros(shape)
        self.cache_v = torch.zeros(shape)

    def forward(self, x, start_pos: int, freqs_cis, mask):
        bsz, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        xq = xq.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        xk = xk.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)
        xv = xv.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        if self.mistake == "rope_v":
            _, xv = apply_rotary_emb(xv, xv, freqs_cis)
        # (detached: a training step must not chain through the graph of the call before)
        self.cache_k = self.cache_k.detach().to(xq)
        self.cache_v = self.cache_v.detach().to(xq)
        self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk
        self.cache_v[:bsz, start_pos : start_pos + seqlen] = xv
        keys = self.cache_k[:bsz, : start_pos + seqlen]
        values = self.cache_v[:bsz, : start_pos + seqlen]
        keys = repeat_kv(keys, self.n_rep, tiled=self.mistake == "tiled")
        values = repeat_kv(values, self.n_rep, tiled=self.mistake == "tiled")
        xq, keys, values = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        scale = self.head_dim if self.mistake == "head_dim" else math.sqrt(self.head_dim)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / scale
        if mask is not None:
            scores = scores + mask
        scores = F.softmax(scores, dim=-1)
        output = torch.matmul(scores, values).transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.wo(output)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, multiple_of: int, ffn_dim_multiplier: float | None):
        super().__init__()
        hidden_dim = int(2 * hidden_dim / 3)
        if ffn_dim_multiplier is not None:
            hidden_dim = int(ffn_dim_multiplier * hidden_dim)
        hidden_dim = multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)
        self.w1 = ColumnParallelLinear(dim, hidden_dim, gather_output=False)
        self.w2 = RowParallelLinear(hidden_dim, dim, input_is_parallel=True)
        self.w3 = ColumnParallelLinear(dim, hidden_dim, gather_output=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: ModelArgs):
        super().__init__()
        mistake = args.second if layer_id == 1 else ""
        self.n_heads, self.dim = args.n_heads, args.dim
        self.head_dim = args.dim // args.n_heads
        self.attention = Attention(args, mistake)
        self.feed_forward = FeedForward(args.dim, 4 * args.dim, args.multiple_of, args.ffn_dim_multiplier)
        self.layer_id = layer_id
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps, eps_outside=mistake == "eps")
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)

    def forward(self, x, start_pos: int, freqs_cis, mask):
        h = x + self.attention(self.attention_norm(x), start_pos, freqs_cis, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, params: ModelArgs):
        super().__init__()
        self.params = params
        self.vocab_size, self.n_layers = params.vocab_size, params.n_layers
        self.tok_embeddings = VocabParallelEmbedding(params.vocab_size, params.dim)
        self.layers = nn.ModuleList(TransformerBlock(i, params) for i in range(params.n_layers))
        self.norm = RMSNorm(params.dim, eps=params.norm_eps)
        self.output = ColumnParallelLinear(params.dim, params.vocab_size)
        self.freqs_cis = precompute_freqs_cis(
            params.dim // params.n_heads, params.max_seq_len * 2, params.rope_theta, params.use_scaled_rope
        )

    def forward(self, tokens: torch.Tensor, start_pos: int):
        _bsz, seqlen = tokens.shape
        h = self.tok_embeddings(tokens)
        freqs_cis = self.freqs_cis[start_pos : start_pos + seqlen]
        mask = None
        if seqlen > 1:
            mask = torch.triu(torch.full((seqlen, seqlen), float("-inf")), diagonal=1)
            mask = torch.hstack([torch.zeros((seqlen, start_pos)), mask]).type_as(h)
        for layer in self.layers:
            h = layer(h, start_pos, freqs_cis, mask)
        return self.output(self.norm(h))


def meta_llama(second: str = "", use_scaled_rope: bool = False) -> Transformer:
    torch.manual_seed(0)
    return _jitter(Transformer(ModelArgs(second=second, use_scaled_rope=use_scaled_rope)))  # type: ignore[return-value]


def meta_call(model: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    """The prompt at once, from the start of the cache."""
    return model(tokens, 0)


# -- torchtune's components --------------------------------------------------------------------------------------


class RotaryPositionalEmbeddings(nn.Module):
    """A cache (max_seq_len, dim / 2, 2) of (cos, sin); x (b, s, n_h, h_d) turned in interleaved pairs; `halves`:
    the mistake, the pairs (i, i + h_d / 2)."""

    def __init__(self, dim: int, max_seq_len: int = T_MAX, base: float = 500000.0, halves: bool = False):
        super().__init__()
        self.dim, self.base, self.max_seq_len, self.halves = dim, base, max_seq_len, halves
        theta = inv_freqs(dim, base, False)
        idx_theta = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), theta)
        self.register_buffer("cache", torch.stack([idx_theta.cos(), idx_theta.sin()], dim=-1), persistent=False)

    def forward(self, x: torch.Tensor, *, input_pos: torch.Tensor | None = None) -> torch.Tensor:
        seq_len = x.size(1)
        rope_cache = self.cache[:seq_len] if input_pos is None else self.cache[input_pos]
        rope_cache = rope_cache.view(-1, seq_len, 1, x.size(-1) // 2, 2).to(x)
        cos, sin = rope_cache[..., 0], rope_cache[..., 1]
        if self.halves:
            a, b = x.chunk(2, dim=-1)
            return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
        xshaped = x.reshape(*x.shape[:-1], -1, 2)
        x0, x1 = xshaped[..., 0], xshaped[..., 1]
        return torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], -1).flatten(3)


class MultiHeadAttention(nn.Module):
    """q, k, v (b, s, h, d): rotated by pos_embeddings, then q_norm / k_norm where given (`norm_first`: the norms
    before the rotation); K/V heads widened; SDPA; `k_pos_embeddings`: the keys' own rotation where it differs."""

    def __init__(
        self,
        *,
        embed_dim,
        num_heads,
        num_kv_heads,
        head_dim,
        q_proj,
        k_proj,
        v_proj,
        output_proj,
        pos_embeddings=None,
        q_norm=None,
        k_norm=None,
        max_seq_len=T_MAX,
        is_causal=True,
        attn_dropout=0.0,
        norm_first=False,
        k_pos_embeddings=None,
    ):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.embed_dim, self.head_dim = num_heads, num_kv_heads, embed_dim, head_dim
        self.is_causal, self.attn_dropout, self.max_seq_len = is_causal, attn_dropout, max_seq_len
        self.q_proj, self.k_proj, self.v_proj, self.output_proj = q_proj, k_proj, v_proj, output_proj
        self.pos_embeddings, self.q_norm, self.k_norm = pos_embeddings, q_norm, k_norm
        self.k_pos_embeddings, self.norm_first = k_pos_embeddings, norm_first

    def forward(self, x, y=None, *, mask=None, input_pos=None):
        b, s_x, _ = x.shape
        y = x if y is None else y
        q_per_kv = self.num_heads // self.num_kv_heads
        q = self.q_proj(x).view(b, s_x, self.num_kv_heads * q_per_kv, self.head_dim)
        k = self.k_proj(y).view(b, y.shape[1], -1, self.head_dim)
        v = self.v_proj(y).view(b, y.shape[1], -1, self.head_dim)
        if self.norm_first and self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.pos_embeddings is not None:
            q = self.pos_embeddings(q, input_pos=input_pos)
            k = (self.k_pos_embeddings or self.pos_embeddings)(k, input_pos=input_pos)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if not self.norm_first and self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.num_heads != self.num_kv_heads:
            expand_shape = (b, self.num_kv_heads, q_per_kv, -1, self.head_dim)
            k = k.unsqueeze(2).expand(expand_shape).flatten(1, 2)
            v = v.unsqueeze(2).expand(expand_shape).flatten(1, 2)
        output = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.attn_dropout if self.training else 0.0, is_causal=self.is_causal
        )
        return self.output_proj(output.transpose(1, 2).contiguous().view(b, s_x, -1))


class TuneRMSNorm(nn.Module):
    """torchtune's RMSNorm: its gain named `scale`."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.scale


class TuneFeedForward(nn.Module):
    def __init__(self, *, gate_proj, down_proj, up_proj, activation=None):
        super().__init__()
        self.w1, self.w2, self.w3 = gate_proj, down_proj, up_proj
        self.activation = activation or nn.SiLU()

    def forward(self, x):
        return self.w2(self.activation(self.w1(x)) * self.w3(x))


class TransformerSelfAttentionLayer(nn.Module):
    def __init__(self, attn, mlp, *, sa_norm=None, mlp_norm=None, sa_scale=None, mlp_scale=None):
        super().__init__()
        self.attn, self.mlp = attn, mlp
        self.sa_norm, self.mlp_norm = sa_norm or nn.Identity(), mlp_norm or nn.Identity()
        self.sa_scale, self.mlp_scale = sa_scale or nn.Identity(), mlp_scale or nn.Identity()

    def forward(self, x, *, mask=None, input_pos=None):
        h = self.sa_norm(x)
        h = self.sa_scale(self.attn(h, h, mask=mask, input_pos=input_pos)) + x
        return h + self.mlp_scale(self.mlp(self.mlp_norm(h)))


class TiedLinear:
    """Not a module: the embedding's weight read back as the head, so nothing is registered twice."""

    def __init__(self, tied_module: nn.Module):
        self.tied_module = tied_module

    def __call__(self, x):
        return F.linear(x, self.tied_module.weight)


class TransformerDecoder(nn.Module):
    def __init__(self, *, tok_embeddings, layers, max_seq_len, num_heads, head_dim, norm, output):
        super().__init__()
        self.tok_embeddings, self.layers, self.norm, self.output = tok_embeddings, nn.ModuleList(layers), norm, output
        self.max_seq_len, self.num_heads, self.head_dim = max_seq_len, num_heads, head_dim

    def forward(self, tokens, *, mask=None, input_pos=None):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, mask=mask, input_pos=input_pos)
        return self.output(self.norm(h))


def llama3_builder(
    vocab_size=V,
    num_layers=2,
    num_heads=H,
    num_kv_heads=KV,
    embed_dim=D,
    max_seq_len=T_MAX,
    intermediate_dim=80,
    norm_eps=1e-5,
    rope_base=500000.0,
    qk_norm=False,
    norm_first=False,
    second="",
) -> TransformerDecoder:
    """A tied Llama 3 of torchtune's parts; `second`: "halves" (the keys turned in halves) or "not_causal"."""
    head_dim = embed_dim // num_heads
    rope = RotaryPositionalEmbeddings(head_dim, max_seq_len, rope_base)
    layers = []
    for i in range(num_layers):
        mistake = second if i == 1 else ""
        attn = MultiHeadAttention(
            embed_dim=embed_dim,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            q_proj=nn.Linear(embed_dim, num_heads * head_dim, bias=False),
            k_proj=nn.Linear(embed_dim, num_kv_heads * head_dim, bias=False),
            v_proj=nn.Linear(embed_dim, num_kv_heads * head_dim, bias=False),
            output_proj=nn.Linear(embed_dim, embed_dim, bias=False),
            pos_embeddings=rope,
            q_norm=TuneRMSNorm(head_dim, norm_eps) if qk_norm else None,
            k_norm=TuneRMSNorm(head_dim, norm_eps) if qk_norm else None,
            max_seq_len=max_seq_len,
            is_causal=mistake != "not_causal",
            norm_first=norm_first,
            k_pos_embeddings=RotaryPositionalEmbeddings(head_dim, max_seq_len, rope_base, True)
            if mistake == "halves"
            else None,
        )
        mlp = TuneFeedForward(
            gate_proj=nn.Linear(embed_dim, intermediate_dim, bias=False),
            down_proj=nn.Linear(intermediate_dim, embed_dim, bias=False),
            up_proj=nn.Linear(embed_dim, intermediate_dim, bias=False),
        )
        layers.append(
            TransformerSelfAttentionLayer(
                attn, mlp, sa_norm=TuneRMSNorm(embed_dim, norm_eps), mlp_norm=TuneRMSNorm(embed_dim, norm_eps)
            )
        )
    tok_embeddings = nn.Embedding(vocab_size, embed_dim)
    return TransformerDecoder(
        tok_embeddings=tok_embeddings,
        layers=layers,
        max_seq_len=max_seq_len,
        num_heads=num_heads,
        head_dim=head_dim,
        norm=TuneRMSNorm(embed_dim, eps=norm_eps),
        output=TiedLinear(tok_embeddings),
    )


def tune_llama3(**kw) -> TransformerDecoder:
    torch.manual_seed(0)
    return _jitter(llama3_builder(**kw))  # type: ignore[return-value]


# -- torchtitan ---------------------------------------------------------------------------------------------------


class TitanAttention(nn.Module):
    def __init__(self, dim=D, n_heads=H, n_kv_heads=KV, head_dim_scale=False):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.n_rep = n_heads // n_kv_heads
        self.head_dim_scale = head_dim_scale
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def init_weights(self, init_std: float):
        for linear in (self.wq, self.wk, self.wv):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=0.02)
        nn.init.trunc_normal_(self.wo.weight, mean=0.0, std=init_std)

    def forward(self, x, freqs_cis):
        bs, seqlen, _ = x.shape
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis[:seqlen])
        keys, values = repeat_kv(xk, self.n_rep), repeat_kv(xv, self.n_rep)
        xq, xk, xv = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        scale = 1.0 / self.head_dim if self.head_dim_scale else None
        output = F.scaled_dot_product_attention(xq, xk, xv, is_causal=True, scale=scale)
        return self.wo(output.transpose(1, 2).contiguous().view(bs, seqlen, -1))


class TitanFeedForward(nn.Module):
    def __init__(self, dim=D, hidden_dim=4 * D, multiple_of=16, ffn_dim_multiplier=None):
        super().__init__()
        hidden_dim = int(2 * hidden_dim / 3)
        if ffn_dim_multiplier is not None:
            hidden_dim = int(ffn_dim_multiplier * hidden_dim)
        hidden_dim = multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def init_weights(self, init_std: float):
        nn.init.trunc_normal_(self.w1.weight, mean=0.0, std=0.02)
        for linear in (self.w2, self.w3):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=init_std)


class TitanBlock(nn.Module):
    def __init__(self, layer_id: int, mistake: str = ""):
        super().__init__()
        self.attention = TitanAttention(head_dim_scale=mistake == "head_dim")
        self.feed_forward = TitanFeedForward()
        self.attention_norm = nn.RMSNorm(D, eps=1e-5)
        self.ffn_norm = RMSNorm(D, eps=1e-5, eps_outside=True) if mistake == "eps" else nn.RMSNorm(D, eps=1e-5)
        self.weight_init_std = 0.02 / (2 * (layer_id + 1)) ** 0.5

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))

    def init_weights(self):
        for norm in (self.attention_norm, self.ffn_norm):
            nn.init.ones_(norm.weight)
        self.attention.init_weights(self.weight_init_std)
        self.feed_forward.init_weights(self.weight_init_std)


class TitanTransformer(nn.Module):
    def __init__(self, n_layers: int = 2, second: str = ""):
        super().__init__()
        self.tok_embeddings = nn.Embedding(V, D)
        self.register_buffer("freqs_cis", self._precompute_freqs_cis(), persistent=False)
        self.layers = nn.ModuleDict({str(i): TitanBlock(i, second if i == 1 else "") for i in range(n_layers)})
        self.norm = nn.RMSNorm(D, eps=1e-5)
        self.output = nn.Linear(D, V, bias=False)
        self.init_weights()

    def _precompute_freqs_cis(self) -> torch.Tensor:
        return precompute_freqs_cis(HD, 2 * T_MAX, 500000.0)

    def init_weights(self, buffer_device: torch.device | None = None):
        with torch.device(buffer_device or self.freqs_cis.device):
            self.freqs_cis = self._precompute_freqs_cis()
        nn.init.normal_(self.tok_embeddings.weight)
        for layer in self.layers.values():
            layer.init_weights()
        self.norm.reset_parameters()
        nn.init.trunc_normal_(self.output.weight, mean=0.0, std=D**-0.5, a=-3 * D**-0.5, b=3 * D**-0.5)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens) if self.tok_embeddings else tokens
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis)
        h = self.norm(h) if self.norm else h
        return self.output(h) if self.output else h


def titan_llama3(second: str = "") -> TitanTransformer:
    torch.manual_seed(0)
    return _jitter(TitanTransformer(second=second))  # type: ignore[return-value]


# -- gpt-fast, Llama 3.1's scaled frequencies ----------------------------------------------------------------------


class KVCache(nn.Module):
    def __init__(self, max_batch_size, max_seq_length, n_heads, head_dim):
        super().__init__()
        shape = (max_batch_size, n_heads, max_seq_length, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape))
        self.register_buffer("v_cache", torch.zeros(shape))

    def update(self, input_pos, k_val, v_val):
        """Writes (B, H, S, D) at input_pos and returns the caches whole (as out-of-place copies)."""
        b = k_val.shape[0]
        k_out = self.k_cache.detach()[:b].to(k_val).index_copy(2, input_pos, k_val)
        v_out = self.v_cache.detach()[:b].to(v_val).index_copy(2, input_pos, v_val)
        return k_out, v_out


class FastAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.n_head, self.n_local_heads, self.head_dim = H, KV, HD
        self.wqkv = nn.Linear(D, (H + 2 * KV) * HD, bias=False)
        self.wo = nn.Linear(D, D, bias=False)
        self.kv_cache: KVCache | None = None

    def forward(self, x, freqs_cis, mask, input_pos=None, freqs_k=None):
        bsz, seqlen, _ = x.shape
        kv_size = self.n_local_heads * self.head_dim
        q, k, v = self.wqkv(x).split([D, kv_size, kv_size], dim=-1)
        q = q.view(bsz, seqlen, self.n_head, self.head_dim)
        k = k.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        v = v.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        q, k = fast_rope(q, freqs_cis), fast_rope(k, freqs_cis if freqs_k is None else freqs_k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.kv_cache is not None:
            k, v = self.kv_cache.update(input_pos, k, v)
        k = k.repeat_interleave(self.n_head // self.n_local_heads, dim=1)
        v = v.repeat_interleave(self.n_head // self.n_local_heads, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0)
        return self.wo(y.transpose(1, 2).contiguous().view(bsz, seqlen, D))


def fast_rope(x, freqs_cis):
    """freqs_cis (seqlen, d/2, 2) of (cos, sin); x turned in interleaved pairs."""
    xshaped = x.reshape(*x.shape[:-1], -1, 2)
    f = freqs_cis.view(1, xshaped.size(1), 1, xshaped.size(3), 2)
    out = torch.stack(
        [
            xshaped[..., 0] * f[..., 0] - xshaped[..., 1] * f[..., 1],
            xshaped[..., 1] * f[..., 0] + xshaped[..., 0] * f[..., 1],
        ],
        -1,
    )
    return out.flatten(3).type_as(x)


class FastBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = FastAttention()
        self.feed_forward = TitanFeedForward(hidden_dim=4 * D, ffn_dim_multiplier=1.3)
        self.ffn_norm, self.attention_norm = RMSNorm(D), RMSNorm(D)

    def forward(self, x, input_pos, freqs_cis, mask, freqs_k=None):
        h = x + self.attention(self.attention_norm(x), freqs_cis, mask, input_pos, freqs_k)
        return h + self.feed_forward(self.ffn_norm(h))


class FastTransformer(nn.Module):
    def __init__(self, keys_ahead_second: bool = False):
        super().__init__()
        self.tok_embeddings = nn.Embedding(V, D)
        self.layers = nn.ModuleList(FastBlock() for _ in range(2))
        self.norm = RMSNorm(D)
        self.output = nn.Linear(D, V, bias=False)
        self.keys_ahead_second = keys_ahead_second
        self.max_batch_size, self.max_seq_length = -1, -1

    def setup_caches(self, max_batch_size: int, max_seq_length: int):
        self.max_batch_size, self.max_seq_length = max_batch_size, max_seq_length
        for b in self.layers:
            b.attention.kv_cache = KVCache(max_batch_size, max_seq_length, KV, HD)
        angles = torch.outer(torch.arange(2 * max_seq_length, dtype=torch.float64), inv_freqs(HD, 500000.0, True))
        self.register_buffer("freqs_cis", torch.stack([angles.cos(), angles.sin()], -1), persistent=False)
        ones = torch.ones(max_seq_length, max_seq_length, dtype=torch.bool)
        self.register_buffer("causal_mask", torch.tril(ones), persistent=False)

    def forward(self, idx, input_pos):
        mask = self.causal_mask[None, None, input_pos]
        freqs_cis = self.freqs_cis[input_pos].to(self.tok_embeddings.weight)
        x = self.tok_embeddings(idx)
        ahead = self.freqs_cis[input_pos + 1].to(freqs_cis)  # the mistake's: the keys turned one position on
        for i, layer in enumerate(self.layers):
            x = layer(x, input_pos, freqs_cis, mask, ahead if i == 1 and self.keys_ahead_second else None)
        return self.output(self.norm(x))


def fast_llama31(keys_ahead_second: bool = False) -> FastTransformer:
    torch.manual_seed(0)
    model = FastTransformer(keys_ahead_second)
    model.setup_caches(max_batch_size=8, max_seq_length=T_MAX)
    return _jitter(model)  # type: ignore[return-value]


def fast_call(model: FastTransformer, ids: torch.Tensor) -> torch.Tensor:
    """The prefill: input_pos 0 .. T - 1."""
    return model(ids, torch.arange(ids.shape[1]))


# -- one plain Llama, for measuring the correct models ------------------------------------------------------------


def plain_llama(ids, emb, layers, norm_w, head, freqs, eps):
    """A per-head loop: layers a list of (n1, wq, wk, wv, wo, n2, w1, w3, w2); heads h reads K/V head h // rep;
    interleaved rotary at `freqs`; the causal softmax written out."""

    def rms(x, w):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rot(x):  # (T, HD)
        t = torch.arange(x.shape[0], dtype=x.dtype)[:, None] * freqs
        a, b = x[:, 0::2], x[:, 1::2]
        return torch.stack([a * t.cos() - b * t.sin(), a * t.sin() + b * t.cos()], -1).flatten(1)

    out = []
    for row in ids:
        x, T = emb[row], len(row)
        for n1, wq, wk, wv, wo, n2, w1, w3, w2 in layers:
            a = rms(x, n1)
            heads = []
            for h in range(H):
                g = h // (H // KV)
                q = rot(a @ wq[h * HD : (h + 1) * HD].T)
                k = rot(a @ wk[g * HD : (g + 1) * HD].T)
                v = a @ wv[g * HD : (g + 1) * HD].T
                s = q @ k.T / math.sqrt(HD)
                s = s.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
                heads.append(torch.softmax(s, -1) @ v)
            x = x + torch.cat(heads, -1) @ wo.T
            b = rms(x, n2)
            x = x + (F.silu(b @ w1.T) * (b @ w3.T)) @ w2.T
        out.append(rms(x, norm_w) @ head.T)
    return torch.stack(out)


def max_plain_error() -> dict[str, float]:
    """Each correct model against plain_llama in float64, on ids (2, 12)."""
    torch.manual_seed(1)
    ids = torch.randint(0, V, (2, 12))
    said = {}
    with torch.no_grad():
        for name, model in (("meta", meta_llama()), ("meta31", meta_llama(use_scaled_rope=True))):
            model.double()
            layers = [
                (b.attention_norm.weight, b.attention.wq.weight, b.attention.wk.weight, b.attention.wv.weight,
                 b.attention.wo.weight, b.ffn_norm.weight, b.feed_forward.w1.weight, b.feed_forward.w3.weight,
                 b.feed_forward.w2.weight)
                for b in model.layers
            ]  # fmt: skip
            freqs = inv_freqs(HD, 500000.0, name == "meta31")
            want = plain_llama(
                ids, model.tok_embeddings.weight, layers, model.norm.weight, model.output.weight, freqs, 1e-5
            )
            said[name] = (meta_call(model, ids) - want).abs().max().item()
        tune = tune_llama3().double()
        layers = [
            (l.sa_norm.scale, l.attn.q_proj.weight, l.attn.k_proj.weight, l.attn.v_proj.weight,
             l.attn.output_proj.weight, l.mlp_norm.scale, l.mlp.w1.weight, l.mlp.w3.weight, l.mlp.w2.weight)
            for l in tune.layers
        ]  # fmt: skip
        emb = tune.tok_embeddings.weight
        want = plain_llama(ids, emb, layers, tune.norm.scale, emb, inv_freqs(HD, 500000.0, False), 1e-5)
        said["tune"] = (tune(ids) - want).abs().max().item()
        titan = titan_llama3().double()
        layers = [
            (b.attention_norm.weight, b.attention.wq.weight, b.attention.wk.weight, b.attention.wv.weight,
             b.attention.wo.weight, b.ffn_norm.weight, b.feed_forward.w1.weight, b.feed_forward.w3.weight,
             b.feed_forward.w2.weight)
            for b in titan.layers.values()
        ]  # fmt: skip
        want = plain_llama(ids, titan.tok_embeddings.weight, layers, titan.norm.weight, titan.output.weight,
                           inv_freqs(HD, 500000.0, False), 1e-5)  # fmt: skip
        said["titan"] = (titan(ids) - want).abs().max().item()
        fast = fast_llama31().double()
        layers = []
        for b in fast.layers:
            wq, wk, wv = b.attention.wqkv.weight.split([D, KV * HD, KV * HD])
            layers.append((b.attention_norm.weight, wq, wk, wv, b.attention.wo.weight, b.ffn_norm.weight,
                           b.feed_forward.w1.weight, b.feed_forward.w3.weight, b.feed_forward.w2.weight))  # fmt: skip
        want = plain_llama(ids, fast.tok_embeddings.weight, layers, fast.norm.weight, fast.output.weight,
                           inv_freqs(HD, 500000.0, True), 1e-5)  # fmt: skip
        said["fast"] = (fast_call(fast, ids) - want).abs().max().item()
    return said


META = {"call": meta_call}
FAST = {"call": fast_call}
LLAMA31 = RopeScaling(
    "llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)
SCALED = {"rope_theta": 500000.0, "rope_scaling": LLAMA31}
CASES = [
    ("f53_meta_llama", meta_llama, LM, META, "pass"),
    ("f53_meta_llama.start_pos_not_given", meta_llama, LM, {}, ("could not judge", None, "call=")),
    (
        "f53_meta_llama.kv_heads_tiled_second_layer",
        lambda: meta_llama("tiled"),
        LM,
        META,
        ("mistake", "attention.kv_heads_tiled", "layers.1.attention"),
    ),
    (
        "f53_meta_llama.rope_on_v_second_layer",
        lambda: meta_llama("rope_v"),
        LM,
        META,
        ("mistake", "rope.applied_to_v", "layers.1.attention"),
    ),
    (
        "f53_meta_llama.scores_over_head_dim_second_layer",
        lambda: meta_llama("head_dim"),
        LM,
        META,
        ("mistake", "attention.wrong_scale", "layers.1.attention"),
    ),
    ("f53_meta_llama31", lambda: meta_llama(use_scaled_rope=True), LM, META, "pass"),
    (
        "f53_meta_llama31.attention_norm_eps_outside_root_second_layer",
        lambda: meta_llama("eps", use_scaled_rope=True),
        LM,
        META,
        ("mistake", "rms_norm.eps_outside_sqrt", "layers.1.attention_norm"),
    ),
    ("f53_meta_llama31.scaling_given", lambda: meta_llama(use_scaled_rope=True), LM, META | SCALED, "pass"),
    ("f53_tune_llama3", tune_llama3, LM, {}, "pass"),
    (
        "f53_tune_llama3.keys_in_halves_second_layer",
        lambda: tune_llama3(second="halves"),
        LM,
        {},
        ("mistake", "rope.mixed_pairing", "layers.1.attn"),
    ),
    (
        "f53_tune_llama3.not_causal_second_layer",
        lambda: tune_llama3(second="not_causal"),
        LM,
        {},
        ("mistake", "attention.not_causal", "layers.1.attn"),
    ),
    ("f53_tune_llama3.qk_norm_before_rotation", lambda: tune_llama3(qk_norm=True, norm_first=True), LM, {}, "pass"),
    (
        "f53_tune_llama3.qk_norm_after_rotation",
        lambda: tune_llama3(qk_norm=True),
        LM,
        {},
        ("no pair", "layers.0.attn", "norm"),
    ),
    ("f53_titan_llama3", titan_llama3, LM, {}, "pass"),
    (
        "f53_titan_llama3.ffn_norm_eps_outside_root_second_layer",
        lambda: titan_llama3("eps"),
        LM,
        {},
        ("mistake", "rms_norm.eps_outside_sqrt", "layers.1.ffn_norm"),
    ),
    (
        "f53_titan_llama3.sdpa_scale_over_head_dim_second_layer",
        lambda: titan_llama3("head_dim"),
        LM,
        {},
        ("mistake", "attention.wrong_scale", "layers.1.attention"),
    ),
    ("f53_fast_llama31", fast_llama31, LM, FAST, "pass"),
    ("f53_fast_llama31.scaling_given", fast_llama31, LM, FAST | SCALED, "pass"),
    (
        "f53_fast_llama31.scaling_given.keys_one_position_on_second_layer",
        lambda: fast_llama31(keys_ahead_second=True),
        LM,
        FAST | SCALED,
        ("mistake", "rope.position_offset", "layers.1.attention"),
    ),
]
