"""Library and tutorial idioms none of the other corpus files uses (issue 46, round 4), in this project's own words:
the judge meets them here for the first time.

- a GPT built of wrappers, as many research repositories write it: `Residual(PreNorm(dim, fn))` around an attention
  of one bias-free `to_qkv` chunked in three (einsum scores, a `-finfo.max` fill) and around an nn.Sequential
  feed-forward, the pairs kept in an nn.ModuleList of nn.ModuleLists, the logits from an nn.Sequential(norm, linear);
- a fairseq-style encoder run time-first (T, B, D) throughout: embeddings scaled by sqrt(D), the batch transposed
  once, an attention that scales its queries before the product, folds the heads into the batch (`bmm` on
  (B * H, T, Dh)) and masks with a `key_padding_mask` (B, T) of True at the padding, post-norm layers, and the
  hidden states returned time-first;
- an attention that is handed the parent's rotary-embedding MODULE (an `inv_freq` buffer, cos and sin made on each
  call) and calls it inside; the same attention handed a plain callable (a closure over the parent's tables);
- Falcon's multi-query attention: one fused `query_key_value` of H query heads and ONE key and value head, viewed as
  (B, T, H + 2, Dh) and sliced, the single K/V head broadcast by `.expand`, in a parallel block of one shared norm;
- GPT-J's parallel block: one `ln_1` read by attention and MLP, rotary on the first half of each head in
  interleaved pairs (`rotate_every_two`) from a float32 (sin | cos) buffer made at init, a registered `tril` bias;
- a Cohere-style LM: a LayerNorm with a weight and no bias written out in float32, a parallel block with a SwiGLU,
  interleaved rotary, the head tied to the embeddings and the logits multiplied by a `logit_scale` of 1/16 (and
  the same without the scale);
- torch's nn.MultiheadAttention left at batch_first=False in an encoder that transposes once (a `key_padding_mask`);
- a BERT-ish encoder called the Hugging Face 1.x way: the caller widens the 1/0 attention mask to a (B, 1, 1, T)
  additive "extended attention mask" of 0 and -10000 and the layers add it to the scores;
- a lecture GPT of single-head `Head` modules (bias-free key, query, value, a `tril` buffer) concatenated from an
  nn.ModuleList, a tanh GELU, and each block run through `torch.utils.checkpoint.checkpoint(use_reentrant=False)`;
- Megatron's feed-forward: the first projection's bias kept apart and added inside a `@torch.jit.script` fused
  bias-GELU (sqrt(2 / pi) to float64's digits);
- PaLM's parallel block (a research repository's): one bias-free projection split into the queries, ONE key and value
  head and the SwiGLU's two halves, rotary on q and k, a LayerNorm whose shift is a zero buffer, a tied head;
- fairseq's decoder-only LM: time-first, `q *= self.scaling` and `x += residual` in place, a float future mask
  cached lazily on the module (`torch.empty(0)` until the first call), the token table read back by F.linear;
- GPT-NeoX's attention arithmetic as transformers writes it: `torch.baddbmm` of a zeros tensor with the scale as
  `alpha`, the mask value a tensor of finfo.min; a Llama of torch's `F.rms_norm` and an HF-style rotary module with
  linear position scaling (t / factor); GPT-2 (three layers) with `scale_attn_by_inverse_layer_idx`, a (B, T)
  padding mask joined to the causal one; GPT-1's post-norm decoder (no final norm); SDPA handed a (B, 1, T, T) float
  mask of 0 and finfo.min (transformers' "sdpa" path); grouped-query attention left to SDPA's `enable_gqa=True`;
- math the reference lacks: LayerScale (timm's, CaiT's), each sublayer's output times a learned per-feature `gamma`;
  a feed-forward of `F.glu` (the first half times the sigmoid of the second);
- mistakes put into them, each named where it sits: the wrapper GPT's second attention scaled by dim ** -0.5 (the
  model width, not the head's), the fairseq encoder's second attention never applying its key_padding_mask, the
  values rotated too in the rotary-module model's second attention, the Cohere LayerNorm's eps outside the root in
  the second block, the extended mask built inverted by the caller (mask * -10000), the causal `tril` of the
  checkpointed GPT's second-block heads hiding the diagonal, SDPA's `scale=` of 1 / Dh in Falcon's second block, the
  keys rotated one position ahead in GPT-J's second block, the causal mask left off PaLM's second block.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/fresh.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

D, H, V, T_MAX = 32, 4, 26, 32
HD = D // H
PAD = 1  # fairseq's padding index


# -- wrappers: Residual(PreNorm(dim, fn)) ---------------------------------------------------------------------------


class Residual(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x, **kwargs):
        return self.fn(x, **kwargs) + x


class PreNorm(nn.Module):
    def __init__(self, dim, fn):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fn = fn

    def forward(self, x, **kwargs):
        return self.fn(self.norm(x), **kwargs)


class WrappedAttention(nn.Module):
    def __init__(self, dim, heads=H, dim_head=HD, scale=None):
        super().__init__()
        inner = heads * dim_head
        self.heads = heads
        self.scale = dim_head**-0.5 if scale is None else scale
        self.to_qkv = nn.Linear(dim, inner * 3, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, dim), nn.Dropout(0.0))

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, n, self.heads, -1).permute(0, 2, 1, 3) for t in (q, k, v))
        dots = torch.einsum("bhid,bhjd->bhij", q, k) * self.scale
        future = torch.ones(n, n, device=x.device, dtype=torch.bool).triu(1)
        dots = dots.masked_fill(future, -torch.finfo(dots.dtype).max)
        out = torch.einsum("bhij,bhjd->bhid", dots.softmax(dim=-1), v)
        return self.to_out(out.permute(0, 2, 1, 3).reshape(b, n, -1))


class WrappedTransformer(nn.Module):
    def __init__(self, dim, depth, last_scale=None):
        super().__init__()
        self.layers = nn.ModuleList([])
        for i in range(depth):
            attention = WrappedAttention(dim, scale=last_scale if i == depth - 1 else None)
            ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Dropout(0.0), nn.Linear(4 * dim, dim))
            self.layers.append(nn.ModuleList([Residual(PreNorm(dim, attention)), Residual(PreNorm(dim, ff))]))

    def forward(self, x):
        for attn, ff in self.layers:
            x = attn(x)
            x = ff(x)
        return x


class WrapperLM(nn.Module):
    def __init__(self, last_scale=None):
        super().__init__()
        self.token_emb = nn.Embedding(V, D)
        self.pos_emb = nn.Embedding(T_MAX, D)
        self.transformer = WrappedTransformer(D, 2, last_scale)
        self.to_logits = nn.Sequential(nn.LayerNorm(D), nn.Linear(D, V))

    def forward(self, x):
        n = x.shape[1]
        x = self.token_emb(x) + self.pos_emb(torch.arange(n, device=x.device))
        return self.to_logits(self.transformer(x))


def wrapper_lm(last_scale=None) -> WrapperLM:
    torch.manual_seed(0)
    return WrapperLM(last_scale)


# -- fairseq style: time-first (T, B, D), key_padding_mask (B, T) True at the padding -------------------------------


class TimeFirstAttention(nn.Module):
    def __init__(self, applies_padding: bool = True):
        super().__init__()
        self.k_proj, self.v_proj, self.q_proj = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.out_proj = nn.Linear(D, D)
        self.scaling = HD**-0.5
        self.applies_padding = applies_padding

    def forward(self, query, key, value, key_padding_mask=None):
        tgt_len, bsz, embed_dim = query.size()
        src_len = key.size(0)
        q = self.q_proj(query) * self.scaling
        k, v = self.k_proj(key), self.v_proj(value)
        q = q.contiguous().view(tgt_len, bsz * H, HD).transpose(0, 1)  # (B * H, T, Dh)
        k = k.contiguous().view(src_len, bsz * H, HD).transpose(0, 1)
        v = v.contiguous().view(src_len, bsz * H, HD).transpose(0, 1)
        attn_weights = torch.bmm(q, k.transpose(1, 2))  # (B * H, T, S)
        if key_padding_mask is not None and self.applies_padding:
            attn_weights = attn_weights.view(bsz, H, tgt_len, src_len)
            attn_weights = attn_weights.masked_fill(key_padding_mask.unsqueeze(1).unsqueeze(2), float("-inf"))
            attn_weights = attn_weights.view(bsz * H, tgt_len, src_len)
        attn = torch.bmm(F.softmax(attn_weights, dim=-1), v)  # (B * H, T, Dh)
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
        return self.out_proj(attn), None


class TimeFirstLayer(nn.Module):
    def __init__(self, applies_padding: bool = True):
        super().__init__()
        self.self_attn = TimeFirstAttention(applies_padding)
        self.self_attn_layer_norm = nn.LayerNorm(D)
        self.fc1, self.fc2 = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)
        self.final_layer_norm = nn.LayerNorm(D)

    def forward(self, x, encoder_padding_mask):
        residual = x
        x, _ = self.self_attn(query=x, key=x, value=x, key_padding_mask=encoder_padding_mask)
        x = self.self_attn_layer_norm(residual + x)
        residual = x
        x = self.fc2(F.relu(self.fc1(x)))
        return self.final_layer_norm(residual + x)


class TimeFirstEncoder(nn.Module):
    def __init__(self, last_applies_padding: bool = True):
        super().__init__()
        self.padding_idx = PAD
        self.embed_tokens = nn.Embedding(V, D, padding_idx=PAD)
        self.embed_scale = math.sqrt(D)
        self.embed_positions = nn.Embedding(T_MAX, D)
        self.layers = nn.ModuleList([TimeFirstLayer(), TimeFirstLayer(last_applies_padding)])

    def forward(self, src_tokens):
        positions = torch.arange(src_tokens.size(1), device=src_tokens.device)
        x = self.embed_scale * self.embed_tokens(src_tokens) + self.embed_positions(positions)
        encoder_padding_mask = src_tokens.eq(self.padding_idx)
        x = x.transpose(0, 1)  # B x T x C -> T x B x C
        for layer in self.layers:
            x = layer(x, encoder_padding_mask)
        return x  # T x B x C


def time_first_encoder(last_applies_padding: bool = True) -> TimeFirstEncoder:
    torch.manual_seed(0)
    return TimeFirstEncoder(last_applies_padding)


class TorchMHALayer(nn.Module):
    """Pre-norm, torch's nn.MultiheadAttention left at its default batch_first=False: (T, B, D) in and out."""

    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, H)
        self.ff = nn.Sequential(nn.Linear(D, 2 * D), nn.ReLU(), nn.Linear(2 * D, D))

    def forward(self, x, key_padding_mask):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, key_padding_mask=key_padding_mask, need_weights=False)[0]
        return x + self.ff(self.norm2(x))


class TorchMHAEncoder(nn.Module):
    """Ids (B, T) in, run time-first inside, hidden states handed back batch-first."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, D, padding_idx=PAD)
        self.positions = nn.Embedding(T_MAX, D)
        self.layers = nn.ModuleList([TorchMHALayer(), TorchMHALayer()])
        self.norm = nn.LayerNorm(D)

    def forward(self, src_tokens):
        x = self.embed(src_tokens) + self.positions(torch.arange(src_tokens.size(1), device=src_tokens.device))
        x = x.transpose(0, 1)  # (T, B, D)
        for layer in self.layers:
            x = layer(x, src_tokens.eq(PAD))
        return self.norm(x).transpose(0, 1)


def torch_mha_encoder() -> TorchMHAEncoder:
    torch.manual_seed(0)
    return TorchMHAEncoder()


# -- an attention handed the parent's rotary MODULE (or a callable) ------------------------------------------------


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    def __init__(self, dim, base=10000):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)), persistent=False)

    def forward(self, t):
        """cos and sin for the positions of t (B, H, T, Dh), each (1, 1, T, Dh)."""
        positions = torch.arange(t.shape[-2], device=t.device, dtype=self.inv_freq.dtype)
        freqs = torch.einsum("i,j->ij", positions, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[None, None].to(t.dtype), emb.sin()[None, None].to(t.dtype)


class HandedRotaryAttention(nn.Module):
    def __init__(self, rotate_values: bool = False):
        super().__init__()
        self.wq, self.wk, self.wv = (
            nn.Linear(D, D, bias=False),
            nn.Linear(D, D, bias=False),
            nn.Linear(D, D, bias=False),
        )
        self.wo = nn.Linear(D, D, bias=False)
        self.rotate_values = rotate_values

    def forward(self, x, rotary):
        """rotary: the parent's RotaryEmbedding (called for cos and sin) or a callable rotating one tensor."""
        B, T, _ = x.shape
        q, k, v = (w(x).view(B, T, H, HD).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        if isinstance(rotary, RotaryEmbedding):
            cos, sin = rotary(q)
            turn = lambda t: t * cos + rotate_half(t) * sin  # noqa: E731
        else:
            turn = rotary
        q, k = turn(q), turn(k)
        if self.rotate_values:
            v = turn(v)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, D))


class HandedRotaryBlock(nn.Module):
    def __init__(self, rotate_values: bool = False):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = HandedRotaryAttention(rotate_values)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x, rotary):
        x = x + self.attn(self.ln1(x), rotary)
        return x + self.mlp(self.ln2(x))


class RotaryModuleLM(nn.Module):
    def __init__(self, last_rotates_values: bool = False, as_callable: bool = False):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.rotary = RotaryEmbedding(HD)
        self.blocks = nn.ModuleList([HandedRotaryBlock(), HandedRotaryBlock(last_rotates_values)])
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)
        self.as_callable = as_callable

    def forward(self, ids):
        x = self.embed(ids)
        rotary = self.rotary
        if self.as_callable:  # a closure over this call's tables, as a positional function
            cos, sin = self.rotary(x[:, None])

            def rotary(t):
                return t * cos + rotate_half(t) * sin

        for block in self.blocks:
            x = block(x, rotary)
        return self.head(self.norm(x))


def rotary_module_lm(last_rotates_values: bool = False, as_callable: bool = False) -> RotaryModuleLM:
    torch.manual_seed(0)
    return RotaryModuleLM(last_rotates_values, as_callable)


# -- Falcon's multi-query attention: fused query_key_value, one K/V head, a parallel block ------------------------


class MultiQueryAttention(nn.Module):
    def __init__(self, scale: float | None = None):
        super().__init__()
        self.query_key_value = nn.Linear(D, D + 2 * HD, bias=False)
        self.dense = nn.Linear(D, D, bias=False)
        self.scale = scale  # None: SDPA's own 1 / sqrt(Dh)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        fused = self.query_key_value(x).view(B, T, H + 2, HD)
        q = fused[:, :, :-2].transpose(1, 2)  # (B, H, T, Dh)
        k = fused[:, :, [-2]].transpose(1, 2)  # (B, 1, T, Dh)
        v = fused[:, :, [-1]].transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.expand(B, H, T, HD), v.expand(B, H, T, HD)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return self.dense(y.transpose(1, 2).reshape(B, T, D))


class FalconLayer(nn.Module):
    def __init__(self, scale: float | None = None):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(D)
        self.self_attention = MultiQueryAttention(scale)
        self.dense_h_to_4h = nn.Linear(D, 4 * D, bias=False)
        self.dense_4h_to_h = nn.Linear(4 * D, D, bias=False)

    def forward(self, x, cos, sin):
        h = self.input_layernorm(x)
        mlp = self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(h)))
        return x + self.self_attention(h, cos, sin) + mlp


class FalconLM(nn.Module):
    def __init__(self, last_scale: float | None = None):
        super().__init__()
        self.word_embeddings = nn.Embedding(V, D)
        self.h = nn.ModuleList([FalconLayer(), FalconLayer(last_scale)])
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, V, bias=False)
        self.lm_head.weight = self.word_embeddings.weight

    def forward(self, input_ids):
        x = self.word_embeddings(input_ids)
        T = input_ids.shape[1]
        inv_freq = 1.0 / 10000 ** (torch.arange(0, HD, 2, dtype=x.dtype, device=x.device) / HD)
        freqs = torch.outer(torch.arange(T, dtype=x.dtype, device=x.device), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        for layer in self.h:
            x = layer(x, emb.cos(), emb.sin())
        return self.lm_head(self.ln_f(x))


def falcon_lm(last_scale: float | None = None) -> FalconLM:
    torch.manual_seed(0)
    return FalconLM(last_scale)


# -- GPT-J's parallel block: partial rotary in interleaved pairs from a float32 (sin | cos) buffer ------------------

ROTARY = HD // 2  # GPT-J turns 64 of each head's 256 features; here 4 of 8 (2 would be one pair: no pairing)


def rotate_every_two(x):
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


class GPTJAttention(nn.Module):
    def __init__(self, key_offset: int = 0):
        super().__init__()
        self.key_offset = key_offset
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(D, D, bias=False) for _ in range(3))
        self.out_proj = nn.Linear(D, D, bias=False)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, ROTARY, 2, dtype=torch.float32) / ROTARY))
        angles = torch.outer(torch.arange(T_MAX + 1, dtype=torch.float32), inv_freq)
        self.register_buffer("rotary_table", torch.cat((angles.sin(), angles.cos()), dim=-1), persistent=False)
        self.register_buffer("bias", torch.tril(torch.ones(T_MAX, T_MAX, dtype=torch.bool)), persistent=False)

    def rotate(self, x, start, T):
        """x (B, T, H, Dh): its first ROTARY features turned in pairs (2i, 2i + 1) at positions start, ...,
        start + T - 1, the rest passed through."""
        sin, cos = self.rotary_table[start : start + T].to(x.dtype).chunk(2, dim=-1)  # each (T, ROTARY / 2)
        sin = sin.repeat_interleave(2, dim=-1)[None, :, None, :]
        cos = cos.repeat_interleave(2, dim=-1)[None, :, None, :]
        turned, kept = x[..., :ROTARY], x[..., ROTARY:]
        turned = turned * cos + rotate_every_two(turned) * sin
        return torch.cat((turned, kept), dim=-1)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (p(x).view(B, T, H, HD) for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = self.rotate(q, 0, T), self.rotate(k, self.key_offset, T)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        w = (q @ k.transpose(-1, -2)) / math.sqrt(HD)
        w = torch.where(self.bias[:T, :T], w, torch.finfo(w.dtype).min)
        y = w.softmax(dim=-1) @ v
        return self.out_proj(y.transpose(1, 2).reshape(B, T, D))


class GPTJBlock(nn.Module):
    def __init__(self, key_offset: int = 0):
        super().__init__()
        self.ln_1 = nn.LayerNorm(D)
        self.attn = GPTJAttention(key_offset)
        self.fc_in, self.fc_out = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x):
        h = self.ln_1(x)
        return x + self.attn(h) + self.fc_out(F.gelu(self.fc_in(h), approximate="tanh"))


class GPTJ(nn.Module):
    def __init__(self, last_key_offset: int = 0):
        super().__init__()
        self.wte = nn.Embedding(V, D)
        self.h = nn.ModuleList([GPTJBlock(), GPTJBlock(last_key_offset)])
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, V)

    def forward(self, input_ids):
        x = self.wte(input_ids)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gptj(last_key_offset: int = 0) -> GPTJ:
    torch.manual_seed(0)
    return GPTJ(last_key_offset)


# -- Cohere style: a LayerNorm of weight only in float32, parallel SwiGLU block, tied head times logit_scale -------


class WeightOnlyLayerNorm(nn.Module):
    def __init__(self, eps: float = 1e-5, eps_outside: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(D))
        self.variance_epsilon = eps
        self.eps_outside = eps_outside

    def forward(self, hidden_states):
        dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        mean = h.mean(-1, keepdim=True)
        variance = (h - mean).pow(2).mean(-1, keepdim=True)
        if self.eps_outside:
            h = (h - mean) / (torch.sqrt(variance) + self.variance_epsilon)
        else:
            h = (h - mean) * torch.rsqrt(variance + self.variance_epsilon)
        return (self.weight.to(torch.float32) * h).to(dtype)


class InterleavedRopeAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(D, D, bias=False) for _ in range(3))
        self.o_proj = nn.Linear(D, D, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q, k, v = (p(x).view(B, T, H, HD).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = q * cos + rotate_every_two(q) * sin, k * cos + rotate_every_two(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, D))


class CohereMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(D, 2 * D, bias=False), nn.Linear(D, 2 * D, bias=False)
        self.down_proj = nn.Linear(2 * D, D, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class CohereLayer(nn.Module):
    def __init__(self, eps_outside: bool = False):
        super().__init__()
        self.input_layernorm = WeightOnlyLayerNorm(eps_outside=eps_outside)
        self.self_attn = InterleavedRopeAttention()
        self.mlp = CohereMLP()

    def forward(self, x, cos, sin):
        h = self.input_layernorm(x)
        return x + self.self_attn(h, cos, sin) + self.mlp(h)


class CohereLM(nn.Module):
    def __init__(self, last_eps_outside: bool = False, logit_scale: float = 0.0625):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([CohereLayer(), CohereLayer(last_eps_outside)])
        self.norm = WeightOnlyLayerNorm()
        self.lm_head = nn.Linear(D, V, bias=False)
        self.lm_head.weight = self.embed_tokens.weight
        self.logit_scale = logit_scale

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        T = input_ids.shape[1]
        inv_freq = 1.0 / 10000 ** (torch.arange(0, HD, 2, dtype=x.dtype, device=x.device) / HD)
        freqs = torch.outer(torch.arange(T, dtype=x.dtype, device=x.device), inv_freq)
        emb = freqs.repeat_interleave(2, dim=-1)  # (T, Dh): pair (2i, 2i + 1) turns at frequency i
        for layer in self.layers:
            x = layer(x, emb.cos(), emb.sin())
        return self.lm_head(self.norm(x)) * self.logit_scale


def cohere_lm(last_eps_outside: bool = False, logit_scale: float = 0.0625) -> CohereLM:
    torch.manual_seed(0)
    return CohereLM(last_eps_outside, logit_scale)


# -- Hugging Face 1.x: the caller's (B, 1, 1, T) additive "extended attention mask" of 0 and -10000 ---------------


class ExtendedMaskSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.query, self.key, self.value = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)

    def transpose_for_scores(self, x):
        return x.view(x.size()[:-1] + (H, HD)).permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask):
        q = self.transpose_for_scores(self.query(hidden_states))
        k = self.transpose_for_scores(self.key(hidden_states))
        v = self.transpose_for_scores(self.value(hidden_states))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(HD)
        probs = nn.Softmax(dim=-1)(scores + attention_mask)
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return context.view(context.size()[:-2] + (D,))


class ExtendedMaskLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attention = ExtendedMaskSelfAttention()
        self.dense = nn.Linear(D, D)
        self.attention_norm = nn.LayerNorm(D, eps=1e-12)
        self.intermediate = nn.Linear(D, 4 * D)
        self.output = nn.Linear(4 * D, D)
        self.output_norm = nn.LayerNorm(D, eps=1e-12)

    def forward(self, hidden_states, attention_mask):
        x = self.attention_norm(hidden_states + self.dense(self.self_attention(hidden_states, attention_mask)))
        return self.output_norm(x + self.output(F.gelu(self.intermediate(x))))


class ExtendedMaskEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.word_embeddings = nn.Embedding(V, D, padding_idx=0)
        self.position_embeddings = nn.Embedding(T_MAX, D)
        self.embeddings_norm = nn.LayerNorm(D, eps=1e-12)
        self.layer = nn.ModuleList([ExtendedMaskLayer(), ExtendedMaskLayer()])

    def forward(self, input_ids, extended_attention_mask):
        positions = torch.arange(input_ids.size(1), device=input_ids.device)[None]
        x = self.embeddings_norm(self.word_embeddings(input_ids) + self.position_embeddings(positions))
        for layer in self.layer:
            x = layer(x, extended_attention_mask)
        return x


def extended_mask_encoder() -> ExtendedMaskEncoder:
    torch.manual_seed(0)
    return ExtendedMaskEncoder()


def extended_call(model, input_ids):
    """The author's call, as transformers 1.x widened the mask: (B, T) of 1 and 0 -> (B, 1, 1, T) of 0 and -10000."""
    attention_mask = (input_ids != 0).long()
    extended = attention_mask[:, None, None, :].to(dtype=next(model.parameters()).dtype)
    return model(input_ids, (1.0 - extended) * -10000.0)


def inverted_extended_call(model, input_ids):
    """The same call with the widening inverted: the real tokens get -10000 and the padding 0."""
    attention_mask = (input_ids != 0).long()
    extended = attention_mask[:, None, None, :].to(dtype=next(model.parameters()).dtype)
    return model(input_ids, extended * -10000.0)


# -- single-head Head modules concatenated, tanh GELU, blocks through torch.utils.checkpoint ------------------------


class Head(nn.Module):
    def __init__(self, head_size, diagonal: int = 0):
        super().__init__()
        self.key = nn.Linear(D, head_size, bias=False)
        self.query = nn.Linear(D, head_size, bias=False)
        self.value = nn.Linear(D, head_size, bias=False)
        self.register_buffer("tril", torch.tril(torch.ones(T_MAX, T_MAX), diagonal=diagonal))

    def forward(self, x):
        B, T, C = x.shape
        k, q = self.key(x), self.query(x)
        wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5  # (B, T, T)
        wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))
        return F.softmax(wei, dim=-1) @ self.value(x)


class MultiHead(nn.Module):
    def __init__(self, diagonal: int = 0):
        super().__init__()
        self.heads = nn.ModuleList([Head(HD, diagonal) for _ in range(H)])
        self.proj = nn.Linear(D, D, bias=False)

    def forward(self, x):
        return self.proj(torch.cat([h(x) for h in self.heads], dim=-1))


class CheckpointedBlock(nn.Module):
    def __init__(self, diagonal: int = 0):
        super().__init__()
        self.sa = MultiHead(diagonal)
        self.ffwd = nn.Sequential(
            nn.Linear(D, 4 * D, bias=False), nn.GELU(approximate="tanh"), nn.Linear(4 * D, D, bias=False)
        )
        self.ln1, self.ln2 = nn.LayerNorm(D, bias=False), nn.LayerNorm(D, bias=False)

    def forward(self, x):
        x = x + self.sa(self.ln1(x))
        return x + self.ffwd(self.ln2(x))


class CheckpointedGPT(nn.Module):
    def __init__(self, last_diagonal: int = 0):
        super().__init__()
        self.token_embedding_table = nn.Embedding(V, D)
        self.position_embedding_table = nn.Embedding(T_MAX, D)
        self.blocks = nn.ModuleList([CheckpointedBlock(), CheckpointedBlock(last_diagonal)])
        self.ln_f = nn.LayerNorm(D, bias=False)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        x = self.token_embedding_table(idx) + self.position_embedding_table(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))
        return logits, loss


def checkpointed_gpt(last_diagonal: int = 0) -> CheckpointedGPT:
    torch.manual_seed(0)
    return CheckpointedGPT(last_diagonal)


# -- LayerScale (timm's, CaiT's): each sublayer's output times a learned per-feature gain before the residual sum -----


class LayerScale(nn.Module):
    def __init__(self, dim, init_values=1e-1):
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x):
        return x * self.gamma


class LayerScaleBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = HandedRotaryAttention()
        self.ls1, self.ls2 = LayerScale(D), LayerScale(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x, rotary):
        x = x + self.ls1(self.attn(self.norm1(x), rotary))
        return x + self.ls2(self.mlp(self.norm2(x)))


class LayerScaleLM(RotaryModuleLM):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([LayerScaleBlock(), LayerScaleBlock()])


def layer_scale_lm() -> LayerScaleLM:
    torch.manual_seed(0)
    return LayerScaleLM()


# -- Megatron style: the feed-forward's bias and GELU fused in a TorchScript function -------------------------------


@torch.jit.script
def bias_gelu(bias, y):
    x = bias + y  # sqrt(2 / pi) to float64's digits (Megatron's 0.79788456 is 1e-9 off: 2e-10 in the outputs)
    return x * 0.5 * (1.0 + torch.tanh(0.7978845608028654 * x * (1 + 0.044715 * x * x)))


class FusedBiasMLP(nn.Module):
    """Megatron's ParallelMLP on one device: the first projection's bias kept apart and added inside the fused GELU."""

    def __init__(self):
        super().__init__()
        self.dense_h_to_4h = nn.Linear(D, 4 * D, bias=False)
        self.bias = nn.Parameter(torch.zeros(4 * D))
        self.dense_4h_to_h = nn.Linear(4 * D, D)

    def forward(self, x):
        return self.dense_4h_to_h(bias_gelu(self.bias, self.dense_h_to_4h(x)))


def megatron_lm() -> WrapperLM:
    """The wrapper GPT with Megatron's fused bias-GELU feed-forward in each block."""
    model = wrapper_lm()
    for _, ff in model.transformer.layers:
        ff.fn.fn = FusedBiasMLP()
    return model


# -- PaLM style (a research repository's): one fused projection for q, the single K/V head and the SwiGLU's halves --


class BufferShiftLayerNorm(nn.Module):
    """A LayerNorm whose shift is a zero buffer (no learned bias), applied by F.layer_norm."""

    def __init__(self, dim):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))
        self.register_buffer("beta", torch.zeros(dim))

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.gamma, self.beta)


class ParallelTransformerBlock(nn.Module):
    def __init__(self, dim, dim_head=HD, heads=H, ff_mult=2, causal: bool = True):
        super().__init__()
        self.norm = BufferShiftLayerNorm(dim)
        attn_inner, ff_inner = dim_head * heads, dim * ff_mult
        self.fused_dims = (attn_inner, dim_head, dim_head, ff_inner * 2)
        self.heads, self.scale, self.causal = heads, dim_head**-0.5, causal
        self.rotary = RotaryEmbedding(dim_head)
        self.fused_attn_ff_proj = nn.Linear(dim, sum(self.fused_dims), bias=False)
        self.attn_out = nn.Linear(attn_inner, dim, bias=False)
        self.ff_out = nn.Linear(ff_inner, dim, bias=False)

    def forward(self, x):
        n = x.shape[1]
        x = self.norm(x)
        q, k, v, ff = self.fused_attn_ff_proj(x).split(self.fused_dims, dim=-1)
        q = q.view(*q.shape[:2], self.heads, -1).transpose(1, 2)  # (B, H, T, Dh); k and v: (B, T, Dh), one head
        cos, sin = self.rotary(q)
        q = q * cos + rotate_half(q) * sin
        k = k * cos[0] + rotate_half(k) * sin[0]
        sim = torch.einsum("b h i d, b j d -> b h i j", q * self.scale, k)
        if self.causal:
            sim = sim.masked_fill(
                torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1), -torch.finfo(sim.dtype).max
            )
        out = torch.einsum("b h i j, b j d -> b h i d", sim.softmax(dim=-1), v)
        ff, gate = ff.chunk(2, dim=-1)
        return self.attn_out(out.transpose(1, 2).flatten(2)) + self.ff_out(F.silu(gate) * ff)


class PaLM(nn.Module):
    def __init__(self, last_causal: bool = True):
        super().__init__()
        self.token_emb = nn.Embedding(V, D)
        self.blocks = nn.ModuleList([ParallelTransformerBlock(D), ParallelTransformerBlock(D, causal=last_causal)])
        self.norm = BufferShiftLayerNorm(D)
        self.to_logits = nn.Linear(D, V, bias=False)
        self.to_logits.weight = self.token_emb.weight

    def forward(self, x):
        x = self.token_emb(x)
        for block in self.blocks:
            x = block(x) + x
        return self.to_logits(self.norm(x))


def palm(last_causal: bool = True) -> PaLM:
    torch.manual_seed(0)
    return PaLM(last_causal)


# -- fairseq's decoder-only LM: time-first, a lazily cached float future mask, in-place ops, the table read back ----


class InPlaceTimeFirstAttention(TimeFirstAttention):
    def forward(self, query, key, value, attn_mask=None):
        tgt_len, bsz, embed_dim = query.size()
        q = self.q_proj(query)
        q *= self.scaling
        k, v = self.k_proj(key), self.v_proj(value)
        q = q.contiguous().view(tgt_len, bsz * H, HD).transpose(0, 1)  # (B * H, T, Dh)
        k = k.contiguous().view(-1, bsz * H, HD).transpose(0, 1)
        v = v.contiguous().view(-1, bsz * H, HD).transpose(0, 1)
        attn_weights = torch.bmm(q, k.transpose(1, 2))
        if attn_mask is not None:
            attn_weights += attn_mask.unsqueeze(0)
        attn = torch.bmm(F.softmax(attn_weights, dim=-1), v)
        return self.out_proj(attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)), None


class TimeFirstDecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = InPlaceTimeFirstAttention()
        self.self_attn_layer_norm = nn.LayerNorm(D)
        self.fc1, self.fc2 = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)
        self.final_layer_norm = nn.LayerNorm(D)

    def forward(self, x, self_attn_mask):
        residual = x
        x = self.self_attn_layer_norm(x)  # normalize_before
        x, _ = self.self_attn(query=x, key=x, value=x, attn_mask=self_attn_mask)
        x += residual
        residual = x
        x = self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))
        x += residual
        return x


class TimeFirstLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D, padding_idx=PAD)
        self.embed_scale = math.sqrt(D)
        self.embed_positions = nn.Embedding(T_MAX, D)
        self.layers = nn.ModuleList([TimeFirstDecoderLayer(), TimeFirstDecoderLayer()])
        self.layer_norm = nn.LayerNorm(D)
        self._future_mask = torch.empty(0)

    def buffered_future_mask(self, tensor):
        dim = tensor.size(0)
        if self._future_mask.size(0) < dim or self._future_mask.dtype != tensor.dtype:
            self._future_mask = torch.triu(torch.full([dim, dim], float("-inf"), dtype=tensor.dtype), 1)
        return self._future_mask.to(tensor)[:dim, :dim]

    def forward(self, prev_output_tokens):
        positions = self.embed_positions(torch.arange(prev_output_tokens.size(1), device=prev_output_tokens.device))
        x = self.embed_scale * self.embed_tokens(prev_output_tokens) + positions
        x = x.transpose(0, 1)  # B x T x C -> T x B x C
        for layer in self.layers:
            x = layer(x, self.buffered_future_mask(x))
        x = self.layer_norm(x).transpose(0, 1)  # T x B x C -> B x T x C
        return F.linear(x, self.embed_tokens.weight)


def time_first_lm() -> TimeFirstLM:
    torch.manual_seed(0)
    return TimeFirstLM()


# -- HF GPT-NeoX's attention arithmetic: baddbmm with the scale as alpha, the mask value a tensor of finfo.min -------


class BaddbmmAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.query_key_value = nn.Linear(D, 3 * D)
        self.dense = nn.Linear(D, D)
        self.norm_factor = math.sqrt(HD)
        self.register_buffer("bias", torch.tril(torch.ones(T_MAX, T_MAX, dtype=torch.bool)).view(1, 1, T_MAX, T_MAX))

    def forward(self, x):
        B, T, _ = x.shape
        qkv = self.query_key_value(x).view(B, T, H, 3 * HD).permute(0, 2, 1, 3)
        q, k, v = qkv[..., :HD], qkv[..., HD : 2 * HD], qkv[..., 2 * HD :]
        q, k = q.reshape(B * H, T, HD), k.reshape(B * H, T, HD)
        scores = torch.zeros(B * H, T, T, dtype=q.dtype, device=q.device)
        scores = torch.baddbmm(scores, q, k.transpose(1, 2), beta=1.0, alpha=1.0 / self.norm_factor)
        scores = scores.view(B, H, T, T)
        mask_value = torch.tensor(torch.finfo(scores.dtype).min, dtype=scores.dtype, device=scores.device)
        scores = torch.where(self.bias[:, :, :T, :T], scores, mask_value)
        out = (nn.functional.softmax(scores, dim=-1) @ v).permute(0, 2, 1, 3).reshape(B, T, D)
        return self.dense(out)


class GLUFeedForward(nn.Module):
    """A GLU feed-forward: one projection to twice the width, F.glu (the first half times sigmoid of the second)."""

    def __init__(self):
        super().__init__()
        self.w_in = nn.Linear(D, 4 * D)
        self.w_out = nn.Linear(2 * D, D)

    def forward(self, x):
        return self.w_out(F.glu(self.w_in(x), dim=-1))


class NeoXBlock(nn.Module):
    def __init__(self, glu: bool = False):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attention = BaddbmmAttention()
        self.mlp = GLUFeedForward() if glu else nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        x = x + self.attention(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class NeoXLM(nn.Module):
    def __init__(self, glu: bool = False):
        super().__init__()
        self.embed_in = nn.Embedding(V, D)
        self.embed_pos = nn.Embedding(T_MAX, D)
        self.layers = nn.ModuleList([NeoXBlock(glu), NeoXBlock(glu)])
        self.final_layer_norm = nn.LayerNorm(D)
        self.embed_out = nn.Linear(D, V, bias=False)

    def forward(self, input_ids):
        x = self.embed_in(input_ids) + self.embed_pos(torch.arange(input_ids.shape[1], device=input_ids.device))
        for layer in self.layers:
            x = layer(x)
        return self.embed_out(self.final_layer_norm(x))


def neox_lm(glu: bool = False) -> NeoXLM:
    torch.manual_seed(0)
    return NeoXLM(glu)


# -- a Llama of torch's own F.rms_norm and an HF-style RoPE module with linear position scaling --------------------


class LinearScaledRotary(nn.Module):
    """transformers' LlamaLinearScalingRotaryEmbedding, in the user's words: positions divided by a factor."""

    def __init__(self, dim, base=10000.0, scaling_factor=1.0):
        super().__init__()
        self.scaling_factor = scaling_factor
        self.register_buffer("inv_freq", 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)), persistent=False)

    def forward(self, x, position_ids):
        t = position_ids.to(self.inv_freq.dtype) / self.scaling_factor
        freqs = torch.outer(t, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class FunctionalRMSNorm(nn.Module):
    def __init__(self, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(D))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, (D,), self.weight, self.eps)


class RotaryDecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = FunctionalRMSNorm(), FunctionalRMSNorm()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(D, D, bias=False) for _ in range(4))
        self.mlp = CohereMLP()

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        h = self.input_layernorm(x)
        q, k, v = (p(h).view(B, T, H, HD).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
        x = x + self.o_proj(y)
        return x + self.mlp(self.post_attention_layernorm(x))


class ScaledRopeLlama(nn.Module):
    def __init__(self, scaling_factor=1.0):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.rotary_emb = LinearScaledRotary(HD, scaling_factor=scaling_factor)
        self.layers = nn.ModuleList([RotaryDecoderLayer(), RotaryDecoderLayer()])
        self.norm = FunctionalRMSNorm()
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(x, torch.arange(input_ids.shape[1], device=input_ids.device))
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


class NativeGQALayer(RotaryDecoderLayer):
    """Grouped-query attention left to SDPA (`enable_gqa=True`, torch 2.5 on): two K/V heads, never repeated by hand."""

    def __init__(self):
        super().__init__()
        self.k_proj, self.v_proj = nn.Linear(D, 2 * HD, bias=False), nn.Linear(D, 2 * HD, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, H, HD).transpose(1, 2)
        k, v = (p(h).view(B, T, 2, HD).transpose(1, 2) for p in (self.k_proj, self.v_proj))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o_proj(y.transpose(1, 2).reshape(B, T, D))
        return x + self.mlp(self.post_attention_layernorm(x))


def native_gqa_llama() -> ScaledRopeLlama:
    model = scaled_rope_llama()
    model.layers = nn.ModuleList([NativeGQALayer(), NativeGQALayer()])
    return model


def scaled_rope_llama(scaling_factor=1.0) -> ScaledRopeLlama:
    torch.manual_seed(0)
    return ScaledRopeLlama(scaling_factor)


# -- GPT-2 variants: scores scaled by the inverse layer index; GPT-1's post-norm; a padding mask joined to the causal --


class LayerIndexedAttention(nn.Module):
    over_queries = False  # the mistake: the softmax over the queries (gpt2_third_over_queries)

    def __init__(self, layer_idx: int, by_layer: bool):
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.divisor = math.sqrt(HD) * (layer_idx + 1 if by_layer else 1)  # scale_attn_by_inverse_layer_idx

    def forward(self, x, keep=None):
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, H, HD).transpose(1, 2) for t in self.c_attn(x).split(D, dim=2))
        w = q @ k.transpose(-1, -2) / self.divisor
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        keep = causal if keep is None else causal & keep[:, None, None, :]
        y = w.masked_fill(~keep, float("-inf")).softmax(-2 if self.over_queries else -1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(B, T, D))


class GPT2Block(nn.Module):
    def __init__(self, layer_idx: int, by_layer: bool = False, post_norm: bool = False):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = LayerIndexedAttention(layer_idx, by_layer)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(approximate="tanh"), nn.Linear(4 * D, D))
        self.post_norm = post_norm

    def forward(self, x, keep=None):
        if self.post_norm:  # GPT-1's: the sum normed
            x = self.ln_1(x + self.attn(x, keep))
            return self.ln_2(x + self.mlp(x))
        x = x + self.attn(self.ln_1(x), keep)
        return x + self.mlp(self.ln_2(x))


class GPT2Variant(nn.Module):
    def __init__(self, by_layer: bool = False, post_norm: bool = False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T_MAX, D)
        self.h = nn.ModuleList([GPT2Block(i, by_layer, post_norm) for i in range(3 if by_layer else 2)])
        self.ln_f = None if post_norm else nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, V, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, input_ids, attention_mask=None):
        keep = None if attention_mask is None else attention_mask.bool()
        x = self.wte(input_ids) + self.wpe(torch.arange(input_ids.shape[1], device=input_ids.device))
        for block in self.h:
            x = block(x, keep)
        return self.lm_head(x if self.ln_f is None else self.ln_f(x))


class FloatMaskAttention(LayerIndexedAttention):
    """transformers' "sdpa" path: a (B, 1, T, T) float mask of 0 and finfo.min handed to SDPA as attn_mask."""

    def forward(self, x, additive):
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, H, HD).transpose(1, 2) for t in self.c_attn(x).split(D, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=additive)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, D))


class FloatMaskGPT(GPT2Variant):
    def __init__(self):
        super().__init__()
        for block in self.h:
            block.attn = FloatMaskAttention(0, False)

    def forward(self, input_ids, attention_mask=None):
        B, T = input_ids.shape
        x = self.wte(input_ids) + self.wpe(torch.arange(T, device=input_ids.device))
        low = torch.finfo(x.dtype).min
        additive = torch.full((T, T), low, dtype=x.dtype, device=x.device).triu(1)[None, None].expand(B, 1, T, T)
        if attention_mask is not None:  # the padded keys too, kept finite (min, not min + min)
            additive = additive.masked_fill(attention_mask[:, None, None, :] == 0, low)
        for block in self.h:
            x = block(x, additive)
        return self.lm_head(self.ln_f(x))


def float_mask_gpt() -> FloatMaskGPT:
    torch.manual_seed(0)
    return FloatMaskGPT()


def gpt2_variant(by_layer: bool = False, post_norm: bool = False) -> GPT2Variant:
    torch.manual_seed(0)
    return GPT2Variant(by_layer, post_norm)


def gpt2_third_over_queries() -> GPT2Variant:
    """Scaled by the inverse layer index, the third block's softmax over the queries: the in-situ rerun of the
    second block's attention must divide by 2 sqrt(d_head), as the whole model's does."""
    model = gpt2_variant(by_layer=True)
    model.h[2].attn.over_queries = True
    return model


CASES = [
    ("wrapper_lm", wrapper_lm, "transformer_lm", {}, "pass"),
    (
        "wrapper_lm.scaled_by_model_width_second_block",
        lambda: wrapper_lm(last_scale=D**-0.5),
        "transformer_lm",
        {},
        ("mistake", "attention.wrong_scale", "transformer.layers.1.0.fn.fn"),
    ),
    ("time_first_encoder", time_first_encoder, "encoder", {}, "pass"),
    (
        "time_first_encoder.padding_ignored_second_layer",
        lambda: time_first_encoder(last_applies_padding=False),
        "encoder",
        {},
        ("mistake", "attention.mask_ignored", "layers.1.self_attn"),
    ),
    ("rotary_module_lm", rotary_module_lm, "transformer_lm", {}, "pass"),
    ("rotary_module_lm.callable", lambda: rotary_module_lm(as_callable=True), "transformer_lm", {}, "pass"),
    (
        "rotary_module_lm.values_rotated_second_block",
        lambda: rotary_module_lm(last_rotates_values=True),
        "transformer_lm",
        {},
        ("mistake", "rope.applied_to_v", "blocks.1.attn"),
    ),
    ("torch_mha_encoder", torch_mha_encoder, "encoder", {}, "pass"),
    ("falcon_lm", falcon_lm, "transformer_lm", {}, "pass"),
    (
        "falcon_lm.sdpa_scale_by_head_width_second_block",
        lambda: falcon_lm(last_scale=1 / HD),
        "transformer_lm",
        {},
        ("mistake", "attention.wrong_scale", "h.1.self_attention"),
    ),
    ("gptj", gptj, "transformer_lm", {}, "pass"),
    (
        "gptj.keys_one_position_ahead_second_block",
        lambda: gptj(last_key_offset=1),
        "transformer_lm",
        {},
        ("mistake", "rope.position_offset", "h.1.attn"),
    ),
    ("cohere_lm", cohere_lm, "transformer_lm", {}, "pass"),
    ("cohere_lm.no_logit_scale", lambda: cohere_lm(logit_scale=1.0), "transformer_lm", {}, "pass"),
    (
        "cohere_lm.eps_outside_sqrt_second_block",
        lambda: cohere_lm(last_eps_outside=True),
        "transformer_lm",
        {},
        ("mistake", "layer_norm.eps_outside_sqrt", "layers.1.input_layernorm"),
    ),
    ("extended_mask_encoder", extended_mask_encoder, "encoder", {"call": extended_call}, "pass"),
    (
        "extended_mask_encoder.inverted_by_the_caller",
        extended_mask_encoder,
        "encoder",
        {"call": inverted_extended_call},
        ("mistake", "attention.mask_inverted", "layer.0.self_attention"),
    ),
    ("checkpointed_gpt", checkpointed_gpt, "transformer_lm", {}, "pass"),
    ("megatron_lm", megatron_lm, "transformer_lm", {}, "pass"),
    ("palm", palm, "transformer_lm", {}, "pass"),
    (
        "palm.not_causal_second_block",
        lambda: palm(last_causal=False),
        "transformer_lm",
        {},
        ("mistake", "attention.not_causal", "blocks.1"),
    ),
    ("time_first_lm", time_first_lm, "transformer_lm", {}, "pass"),
    ("neox_lm", neox_lm, "transformer_lm", {}, "pass"),
    ("functional_rms_llama", scaled_rope_llama, "transformer_lm", {}, "pass"),
    ("functional_rms_llama.linear_rope_scaling", lambda: scaled_rope_llama(2.0), "transformer_lm", {}, "pass"),
    ("functional_rms_llama.sdpa_enable_gqa", native_gqa_llama, "transformer_lm", {}, "pass"),
    ("gpt2_padding_mask", gpt2_variant, "transformer_lm", {}, "pass"),
    ("gpt2_padding_mask.scaled_by_inverse_layer", lambda: gpt2_variant(by_layer=True), "transformer_lm", {}, "pass"),
    (  # added later: attention.wrong_scale at h.1.attn while the in-situ rerun left the scale by layer out
        "gpt2_padding_mask.scaled_by_inverse_layer.softmax_wrong_axis_third_block",
        gpt2_third_over_queries,
        "transformer_lm",
        {},
        ("mistake", "attention.softmax_wrong_axis", "h.2.attn"),
    ),
    ("gpt1_post_norm", lambda: gpt2_variant(post_norm=True), "transformer_lm", {}, "pass"),
    ("gpt2_sdpa_float_mask", float_mask_gpt, "transformer_lm", {}, "pass"),
    ("neox_lm.glu", lambda: neox_lm(glu=True), "transformer_lm", {}, ("no pair", "layers.0.mlp", "sigmoid")),
    (
        "layer_scale_lm",
        layer_scale_lm,
        "transformer_lm",
        {},
        ("no pair", "blocks.0.ls1", "gamma"),
    ),
    (
        "checkpointed_gpt.causal_hides_diagonal_second_block",
        lambda: checkpointed_gpt(last_diagonal=-1),
        "transformer_lm",
        {},
        ("mistake", "attention.causal_hides_diagonal", "blocks.1.sa"),
    ),
]
