"""The code a coding assistant writes in 2026 when a learner asks "write me a GPT / a Llama / a BERT in PyTorch"
(issue 46, round 16), in this project's own words: verbose, typed, defensive. The judge meets it here first
(measured with the judge frozen).

- `@dataclass` configs with `__post_init__` asserts; `nn.ModuleDict(dict(wte=..., wpe=..., h=..., ln_f=...))`;
  `forward(input_ids, attention_mask=None, labels=None) -> dict(logits=..., loss=...)` with `@torch.no_grad()
  generate` beside it and an assertion on the sequence length;
- a GPT whose attention keeps `register_buffer("causal_mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1),
  persistent=False)` and calls `F.scaled_dot_product_attention(..., attn_mask=mask, dropout_p=self.dropout if
  self.training else 0.0, is_causal=mask is None)`;
- the same GPT passing its keep-mask AND `is_causal=True` (SDPA in torch 2.13 intersects the two, measured: causal
  and causal is causal, so the model is right);
- a GPT of `nn.MultiheadAttention(batch_first=True)` with a boolean `attn_mask` (True = hidden) and
  `need_weights=False`;
- a Llama of a `RotaryEmbedding` module whose cos/sin cache is rebuilt when the sequence grows (`_update_cache`),
  `torch.nn.RMSNorm`, grouped K/V heads widened by `expand` + `reshape`, SwiGLU, init by `nn.init.normal_(std=0.02)`
  with a scaled residual init, an optional `KVCache` dataclass returned;
- a BERT-style encoder of `nn.MultiheadAttention` with `key_padding_mask` (True = padding) read from the
  HF-style `attention_mask` (1 = real token).
- mistakes assistants make, each in the second block: the causal buffer (True = future) handed to SDPA, whose
  boolean mask means True = attend (the mask inverted); `scale=1 / head_dim` (wrong scale); `dropout_p=self.dropout`
  not gated on training (dropout active in eval); the `expand` + `reshape` done with the repeat axis before the K/V
  heads (tiled heads); an RMSNorm of eps outside the root; the MHA's boolean mask given as ~causal (True = keep,
  the polarity MHA reads inverted) and the BERT's key_padding_mask given as `attention_mask.bool()` (inverted);
  the BERT's 0/1 attention_mask given to MHA as a float mask (added to the scores: +1 on the real tokens, 0 on the
  padding, so the padding is read: the mask is not applied, the nearest catalogued id is attention.mask_ignored).
- an encoder-decoder of SDPA everywhere, HF-style `forward(input_ids, decoder_input_ids, attention_mask=None,
  decoder_attention_mask=None)`, its masks built when not passed: all ones (no pad token: the reference's
  pad_id=None, nothing masked), or `ids != pad_token_id` with pad_token_id=0; the mistake in its second decoder
  layer: `is_causal=mask is None` where a mask is always built (the self-attention sees the future: not_causal).

Expected verdicts decided from the math before the judge ran. torch 2.13's SDPA given a boolean attn_mask AND
is_causal=True computes the intersection (measured: equal to attn_mask=causal & mask), so "mask_and_is_causal" is
right. The 0/1 float mask: softmax(S + m), m = 1 on real keys, 0 on padding, so the padding is read at e^-1 of
a real key's weight: the padding is not hidden (checked by hand against MHA's output to 6e-17).

First met: 15 of 18 right. Wrong:
- assistant_bert.padding_added_as_0_1_second_layer: no id, no op: "unexplained: encoder.layer.1.attention ...
  diverges ...; not expressible by the config and no catalogue variant reproduces it" (place right; neither the
  mask_ignored variant, whose softmax(S) over every key differs from softmax(S + m) by the +1 on the real keys,
  nor a named op).
- assistant_seq2seq (no pad token: masks nothing, the reference at pad_id=None, which passes when pad_id=None is
  given): attention.mask_ignored at encoder.layers.0.self_attn (the judge assumed pad_id=0 and did not try None).
- assistant_seq2seq.is_causal_if_no_mask_second_decoder_layer: the same attention.mask_ignored at
  encoder.layers.0.self_attn, the pad_id assumption hiding the decoder's not_causal (found on the pad_0 twin).

Fixed since: the judge tries no padding token (pad_id=None) where a model of ids, passed no mask, matches nothing
under the pad id it assumed (0), hides no key on ids ending in 0, and lies closer so; attention.mask_ignored holds
a variant softmax(S + m) for the 0/1 keep mask added to the scores.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

D, H, V, T_MAX = 32, 4, 26, 16
HD = D // H
KV = 2


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases moved off their 1s and 0s, so that a trained model's values are checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


@dataclass
class GPTConfig:
    vocab_size: int = V
    block_size: int = T_MAX
    n_layer: int = 2
    n_head: int = H
    n_embd: int = D
    dropout: float = 0.1
    bias: bool = True

    def __post_init__(self) -> None:
        assert self.n_embd % self.n_head == 0, "n_embd must be divisible by n_head"
        assert 0.0 <= self.dropout < 1.0


class CausalSelfAttention(nn.Module):
    """`mode`: "sdpa" (is_causal when no padding mask), "both" (keep-mask and is_causal), "buffer" (the mistake:
    the True-is-future buffer given as SDPA's mask, True = attend there), "head_dim" (scale 1 / d_head),
    "dropout" (dropout_p not gated on self.training)."""

    mode = "sdpa"

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head, self.dropout = config.n_head, config.dropout
        T = config.block_size
        self.register_buffer("causal_mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1), persistent=False)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        mask: torch.Tensor | None = None
        if attention_mask is not None:
            mask = ~self.causal_mask[:T, :T] & attention_mask[:, None, None, :].bool()
        p = self.dropout if self.training else 0.0
        if self.mode == "both":
            mask = ~self.causal_mask[:T, :T] if mask is None else mask
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=True)
        elif self.mode == "buffer":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.causal_mask[:T, :T], dropout_p=p)
        elif self.mode == "head_dim":
            scale = 1.0 / (C // self.n_head)
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=p, is_causal=mask is None, scale=scale
            )
        elif self.mode == "dropout":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout, is_causal=mask is None)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=mask is None)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class BothMasks(CausalSelfAttention):
    mode = "both"


class BufferAsKeepMask(CausalSelfAttention):
    mode = "buffer"


class ScaledByHeadDim(CausalSelfAttention):
    mode = "head_dim"


class DropoutAlwaysOn(CausalSelfAttention):
    mode = "dropout"


class MHACausalAttention(nn.Module):
    """nn.MultiheadAttention, batch_first, its boolean attn_mask True where the key is hidden; `keep_polarity`: the
    mistake, ~causal (True = keep) given, which MHA reads as hiding the past and the diagonal."""

    keep_polarity = False

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(config.n_embd, config.n_head, dropout=config.dropout, batch_first=True)
        T = config.block_size
        self.register_buffer("causal_mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1), persistent=False)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        T = x.shape[1]
        mask = ~self.causal_mask[:T, :T] if self.keep_polarity else self.causal_mask[:T, :T]
        out, _ = self.mha(x, x, x, attn_mask=mask, need_weights=False)
        return out


class MHAKeepPolarity(MHACausalAttention):
    keep_polarity = True


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, attention: type[nn.Module]) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = attention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), attention_mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig, first: type[nn.Module], second: type[nn.Module]) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config, first), Block(config, second)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor | None]:
        B, T = input_ids.shape
        assert T <= self.config.block_size, f"sequence of {T} longer than block_size {self.config.block_size}"
        pos = torch.arange(T, dtype=torch.long, device=input_ids.device)
        x = self.transformer.drop(self.transformer.wte(input_ids) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x, attention_mask)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1))
        return dict(logits=logits, loss=loss)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0) -> torch.Tensor:
        for _ in range(max_new_tokens):
            logits = self(input_ids[:, -self.config.block_size :])["logits"]
            assert logits is not None
            probs = F.softmax(logits[:, -1] / temperature, dim=-1)
            input_ids = torch.cat([input_ids, torch.multinomial(probs, 1)], dim=1)
        return input_ids


def gpt(first: type[nn.Module] = CausalSelfAttention, second: type[nn.Module] | None = None) -> GPT:
    torch.manual_seed(0)
    return _jitter(GPT(GPTConfig(), first, second or first))  # type: ignore[return-value]


# -- a Llama: RotaryEmbedding with a growing cache, nn.RMSNorm, GQA by expand + reshape, SwiGLU --------------------


@dataclass
class LlamaConfig:
    vocab_size: int = V
    dim: int = D
    n_layers: int = 2
    n_heads: int = H
    n_kv_heads: int = KV
    hidden_dim: int = 64
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    max_seq_len: int = T_MAX

    def __post_init__(self) -> None:
        assert self.dim % self.n_heads == 0
        assert self.n_heads % self.n_kv_heads == 0, "n_heads must be a multiple of n_kv_heads"
        assert (self.dim // self.n_heads) % 2 == 0, "rotary needs an even head_dim"


@dataclass
class KVCache:
    k: torch.Tensor
    v: torch.Tensor


class RotaryEmbedding(nn.Module):
    """cos/sin of the halves' layout (i, i + d / 2), cached; the cache rebuilt when a longer sequence comes."""

    def __init__(self, head_dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._seq_len_cached = 0
        self._cos: torch.Tensor | None = None
        self._sin: torch.Tensor | None = None

    def _update_cache(self, seq_len: int, dtype: torch.dtype) -> None:
        if seq_len > self._seq_len_cached or self._cos is None or self._cos.dtype != dtype:
            self._seq_len_cached = seq_len
            t = torch.arange(seq_len, dtype=torch.float64)
            freqs = torch.outer(t, self.inv_freq.double())
            emb = torch.cat((freqs, freqs), dim=-1)
            self._cos, self._sin = emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, x: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        self._update_cache(seq_len, x.dtype)
        assert self._cos is not None and self._sin is not None
        return self._cos[:seq_len], self._sin[:seq_len]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x: torch.Tensor, n_rep: int, tiled: bool = False) -> torch.Tensor:
    """(B, KV, T, HD) -> (B, KV * n_rep, T, HD), head h reading K/V head h // n_rep; `tiled`: the mistake, the
    repeat axis put before the K/V heads (head h reads h % KV, as .repeat would)."""
    B, kv, T, hd = x.shape
    if tiled:
        return x[:, None].expand(B, n_rep, kv, T, hd).reshape(B, kv * n_rep, T, hd)
    return x[:, :, None].expand(B, kv, n_rep, T, hd).reshape(B, kv * n_rep, T, hd)


class LlamaAttention(nn.Module):
    """`tiled`: the K/V heads widened in the wrong order; `rotate_values`: the mistake, v turned as well."""

    tiled = False
    rotate_values = False

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = config.n_heads, config.n_kv_heads
        self.head_dim = config.dim // config.n_heads
        self.q_proj = nn.Linear(config.dim, config.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.dim, config.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.dim, config.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(config.n_heads * self.head_dim, config.dim, bias=False)
        self.rotary = RotaryEmbedding(self.head_dim, config.rope_theta)

    def forward(self, x: torch.Tensor, use_cache: bool = False) -> tuple[torch.Tensor, KVCache | None]:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.rotary(x, T)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if self.rotate_values:
            v = v * cos + rotate_half(v) * sin
        cache = KVCache(k, v) if use_cache else None
        n_rep = self.n_heads // self.n_kv_heads
        k, v = repeat_kv(k, n_rep, self.tiled), repeat_kv(v, n_rep, self.tiled)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1)), cache


class TiledLlamaAttention(LlamaAttention):
    tiled = True


class RotaryOnValues(LlamaAttention):
    rotate_values = True


class EpsOutsideRMSNorm(nn.Module):
    """The mistake: x / (sqrt(mean(x^2)) + eps) * weight, eps outside the root."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.eps) * self.weight


class LlamaBlock(nn.Module):
    def __init__(self, config: LlamaConfig, attention: type[LlamaAttention], norm: type[nn.Module]) -> None:
        super().__init__()
        self.input_layernorm = norm(config.dim, eps=config.norm_eps)
        self.self_attn = attention(config)
        self.post_attention_layernorm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.gate_proj = nn.Linear(config.dim, config.hidden_dim, bias=False)
        self.up_proj = nn.Linear(config.dim, config.hidden_dim, bias=False)
        self.down_proj = nn.Linear(config.hidden_dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor, use_cache: bool = False) -> tuple[torch.Tensor, KVCache | None]:
        h, cache = self.self_attn(self.input_layernorm(x), use_cache)
        x = x + h
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h)), cache


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig, second: type[LlamaAttention], second_norm: type[nn.Module]) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(
            [LlamaBlock(config, LlamaAttention, nn.RMSNorm), LlamaBlock(config, second, second_norm)]
        )
        self.norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = (
                    0.02 / math.sqrt(2 * config.n_layers)
                    if name.endswith(("o_proj.weight", "down_proj.weight"))
                    else 0.02
                )
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, use_cache: bool = False
    ) -> dict[str, object]:
        assert input_ids.shape[1] <= self.config.max_seq_len, "sequence longer than max_seq_len"
        x = self.embed_tokens(input_ids)
        caches: list[KVCache | None] = []
        for layer in self.layers:
            x, cache = layer(x, use_cache)
            caches.append(cache)
        logits = self.lm_head(self.norm(x))
        loss = None if labels is None else F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return dict(logits=logits, loss=loss, past_key_values=caches if use_cache else None)


def llama(second: type[LlamaAttention] = LlamaAttention, second_norm: type[nn.Module] = nn.RMSNorm) -> Llama:
    torch.manual_seed(0)
    return _jitter(Llama(LlamaConfig(), second, second_norm))  # type: ignore[return-value]


# -- a BERT-style encoder of nn.MultiheadAttention with key_padding_mask ----------------------------------------------


@dataclass
class BertConfig:
    vocab_size: int = V
    hidden_size: int = D
    num_attention_heads: int = H
    num_hidden_layers: int = 2
    intermediate_size: int = 4 * D
    max_position_embeddings: int = T_MAX
    layer_norm_eps: float = 1e-12
    dropout: float = 0.1

    def __post_init__(self) -> None:
        assert self.hidden_size % self.num_attention_heads == 0


class BertLayer(nn.Module):
    """Post-LN; `padding`: "keep" (key_padding_mask = attention_mask == 0, True = padding), "inverted" (the
    mistake: attention_mask.bool(), True = real token), "float" (the mistake: the 0/1 mask given as a float mask,
    added to the scores)."""

    padding = "keep"

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(
            config.hidden_size, config.num_attention_heads, dropout=config.dropout, batch_first=True
        )
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.output_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.padding == "inverted":
            key_padding_mask = attention_mask.bool()
        elif self.padding == "float":
            key_padding_mask = attention_mask.to(x.dtype)
        else:
            key_padding_mask = attention_mask == 0
        h, _ = self.attention(x, x, x, key_padding_mask=key_padding_mask, need_weights=False)
        x = self.attention_norm(x + h)
        return self.output_norm(x + self.output(F.gelu(self.intermediate(x))))


class InvertedPadding(BertLayer):
    padding = "inverted"


class FloatPadding(BertLayer):
    padding = "float"


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig, second: type[BertLayer]) -> None:
        super().__init__()
        self.config = config
        self.embeddings = nn.ModuleDict(
            dict(
                word_embeddings=nn.Embedding(config.vocab_size, config.hidden_size),
                position_embeddings=nn.Embedding(config.max_position_embeddings, config.hidden_size),
                LayerNorm=nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps),
            )
        )
        self.encoder = nn.ModuleDict(dict(layer=nn.ModuleList([BertLayer(config), second(config)])))

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        B, T = input_ids.shape
        assert T <= self.config.max_position_embeddings
        if attention_mask is None:
            attention_mask = torch.ones(B, T, dtype=torch.long, device=input_ids.device)
        e = self.embeddings
        x = e.LayerNorm(e.word_embeddings(input_ids) + e.position_embeddings(torch.arange(T, device=input_ids.device)))
        for layer in self.encoder.layer:
            x = layer(x, attention_mask)
        return dict(last_hidden_state=x)


def bert(second: type[BertLayer] = BertLayer) -> BertEncoder:
    torch.manual_seed(0)
    return _jitter(BertEncoder(BertConfig(), second))  # type: ignore[return-value]


# -- an encoder-decoder ("Attention Is All You Need"), SDPA everywhere, HF-style forward -------------------------------


@dataclass
class Seq2SeqConfig:
    vocab_size: int = V
    d_model: int = D
    n_heads: int = H
    n_layers: int = 2
    d_ff: int = 64
    max_len: int = T_MAX
    dropout: float = 0.1
    pad_token_id: int | None = None  # given: the masks not passed are built from the ids (id != pad)

    def __post_init__(self) -> None:
        assert self.d_model % self.n_heads == 0 and self.d_model % 2 == 0


class SDPAAttention(nn.Module):
    """Self- or cross-attention by F.scaled_dot_product_attention; `keep` (B, T_k) boolean, True = real key.
    `causal`: "always" (the keep-mask and is_causal=True, intersected), "if_no_mask" (the mistake, the assistant's
    `is_causal=mask is None` where a mask is always built: the decoder's self-attention sees the future), "no"."""

    def __init__(self, config: Seq2SeqConfig, causal: str = "no") -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(config.d_model, config.d_model) for _ in range(4)
        )
        self.n_heads, self.dropout, self.causal = config.n_heads, config.dropout, causal

    def forward(self, x: torch.Tensor, memory: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, -1).transpose(1, 2)
        k = self.k_proj(memory).view(B, memory.shape[1], self.n_heads, -1).transpose(1, 2)
        v = self.v_proj(memory).view(B, memory.shape[1], self.n_heads, -1).transpose(1, 2)
        mask = keep[:, None, None, :]
        is_causal = self.causal == "always" or (self.causal == "if_no_mask" and mask is None)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=is_causal)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, C))


class EncoderLayer(nn.Module):
    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        self.self_attn = SDPAAttention(config)
        self.norm1, self.norm2 = nn.LayerNorm(config.d_model), nn.LayerNorm(config.d_model)
        self.ff = nn.Sequential(
            nn.Linear(config.d_model, config.d_ff), nn.ReLU(), nn.Linear(config.d_ff, config.d_model)
        )

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.self_attn(x, x, keep))
        return self.norm2(x + self.ff(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: Seq2SeqConfig, causal: str = "always") -> None:
        super().__init__()
        self.self_attn, self.cross_attn = SDPAAttention(config, causal), SDPAAttention(config)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(config.d_model) for _ in range(3))
        self.ff = nn.Sequential(
            nn.Linear(config.d_model, config.d_ff), nn.ReLU(), nn.Linear(config.d_ff, config.d_model)
        )

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, keep: torch.Tensor, src_keep: torch.Tensor
    ) -> torch.Tensor:
        x = self.norm1(x + self.self_attn(x, x, keep))
        x = self.norm2(x + self.cross_attn(x, memory, src_keep))
        return self.norm3(x + self.ff(x))


class Seq2SeqTransformer(nn.Module):
    def __init__(self, config: Seq2SeqConfig, second_causal: str) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        position = torch.arange(config.max_len, dtype=torch.float64)[:, None]
        div = torch.exp(torch.arange(0, config.d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / config.d_model))
        pe = torch.zeros(config.max_len, config.d_model)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(position * div), torch.cos(position * div)
        self.register_buffer("pe", pe, persistent=False)
        self.encoder = nn.ModuleDict(dict(layers=nn.ModuleList([EncoderLayer(config) for _ in range(2)])))
        self.decoder = nn.ModuleDict(
            dict(layers=nn.ModuleList([DecoderLayer(config), DecoderLayer(config, second_causal)]))
        )
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.embed.weight

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        assert ids.shape[1] <= self.config.max_len
        return self.embed(ids) * math.sqrt(self.config.d_model) + self.pe[: ids.shape[1]].to(self.embed.weight.dtype)

    def _keep(self, ids: torch.Tensor) -> torch.Tensor:
        """True on the real tokens: all of them without a pad_token_id."""
        pad = self.config.pad_token_id
        return torch.ones_like(ids, dtype=torch.bool) if pad is None else ids != pad

    def forward(
        self,
        input_ids: torch.Tensor,
        decoder_input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        src_keep = self._keep(input_ids) if attention_mask is None else attention_mask.bool()
        tgt_keep = self._keep(decoder_input_ids) if decoder_attention_mask is None else decoder_attention_mask.bool()
        memory = self._embed(input_ids)
        for layer in self.encoder.layers:
            memory = layer(memory, src_keep)
        x = self._embed(decoder_input_ids)
        for layer in self.decoder.layers:
            x = layer(x, memory, tgt_keep, src_keep)
        return dict(logits=self.lm_head(x))


def seq2seq(second_causal: str = "always", pad_token_id: int | None = None) -> Seq2SeqTransformer:
    torch.manual_seed(0)
    return _jitter(Seq2SeqTransformer(Seq2SeqConfig(pad_token_id=pad_token_id), second_causal))  # type: ignore[return-value]


CASES = [
    ("assistant_gpt", gpt, "transformer_lm", {}, "pass"),
    ("assistant_gpt.mask_and_is_causal", lambda: gpt(BothMasks), "transformer_lm", {}, "pass"),
    (
        "assistant_gpt.causal_buffer_as_keep_mask_second_block",
        lambda: gpt(CausalSelfAttention, BufferAsKeepMask),
        "transformer_lm",
        {},
        ("mistake", "attention.mask_inverted", "transformer.h.1.attn"),
    ),
    (
        "assistant_gpt.scaled_by_head_dim_second_block",
        lambda: gpt(CausalSelfAttention, ScaledByHeadDim),
        "transformer_lm",
        {},
        ("mistake", "attention.wrong_scale", "transformer.h.1.attn"),
    ),
    (
        "assistant_gpt.dropout_p_ungated_second_block",
        lambda: gpt(CausalSelfAttention, DropoutAlwaysOn),
        "transformer_lm",
        {},
        ("mistake", "dropout.active_in_eval", "transformer.h.1.attn"),
    ),
    ("assistant_mha_gpt", lambda: gpt(MHACausalAttention), "transformer_lm", {}, "pass"),
    (
        "assistant_mha_gpt.keep_polarity_second_block",
        lambda: gpt(MHACausalAttention, MHAKeepPolarity),
        "transformer_lm",
        {},
        ("mistake", "attention.mask_inverted", "transformer.h.1.attn.mha"),
    ),
    ("assistant_llama", llama, "transformer_lm", {}, "pass"),
    (
        "assistant_llama.kv_expand_tiled_second_layer",
        lambda: llama(TiledLlamaAttention),
        "transformer_lm",
        {},
        ("mistake", "attention.kv_heads_tiled", "layers.1.self_attn"),
    ),
    (
        "assistant_llama.rms_eps_outside_root_second_layer",
        lambda: llama(second_norm=EpsOutsideRMSNorm),
        "transformer_lm",
        {},
        ("mistake", "rms_norm.eps_outside_sqrt", "layers.1.input_layernorm"),
    ),
    (
        "assistant_llama.rotary_on_values_second_layer",
        lambda: llama(RotaryOnValues),
        "transformer_lm",
        {},
        ("mistake", "rope.applied_to_v", "layers.1.self_attn"),
    ),
    ("assistant_bert", bert, "encoder_model", {}, "pass"),
    (
        "assistant_bert.padding_polarity_inverted_second_layer",
        lambda: bert(InvertedPadding),
        "encoder_model",
        {},
        ("mistake", "attention.mask_inverted", "encoder.layer.1.attention"),
    ),
    (
        "assistant_bert.padding_added_as_0_1_second_layer",
        lambda: bert(FloatPadding),
        "encoder_model",
        {},
        ("mistake", "attention.mask_ignored", "encoder.layer.1.attention"),
    ),
    ("assistant_seq2seq", seq2seq, "transformer", {}, "pass"),
    (
        "assistant_seq2seq.is_causal_if_no_mask_second_decoder_layer",
        lambda: seq2seq("if_no_mask"),
        "transformer",
        {},
        ("mistake", "attention.not_causal", "decoder.layers.1.self_attn"),
    ),
    ("assistant_seq2seq.pad_0", lambda: seq2seq(pad_token_id=0), "transformer", {}, "pass"),
    (
        "assistant_seq2seq.pad_0.is_causal_if_no_mask_second_decoder_layer",
        lambda: seq2seq("if_no_mask", pad_token_id=0),
        "transformer",
        {},
        ("mistake", "attention.not_causal", "decoder.layers.1.self_attn"),
    ),
]
