"""Conditioning inside transformers as 2025-26 learners write it by hand in small models (issue 46, round 44), in
this project's own words. The judge meets them here first (measured with the judge frozen; this corpus is not fixed
afterwards). New beside fresh35 (a lone DiT block) and fresh36 (PEFT's prompt and prefix tables).

- Flamingo: a small GPT (learned positions, pre-norm layers of a hand-written q/k/v/o attention, a GELU MLP) with
  a gated cross-attention block before each layer: ``x + tanh(attn_gate) xattn(norm(x), media)``, then ``x +
  tanh(ff_gate) ff(norm(x))``, the gates drawn nonzero (0.6 and -0.4, jittered) as trained ones are;
  ``forward(input_ids, media=None)`` skips the blocks where no media are given (text alone). The cross-attention is
  a module of its own, ``MaskedCrossAttention.forward(x, media)``, wrapping an ``Attention.forward(x, kv=None)``.
- Llama-3.2-Vision style: a cross-attention decoder layer of its own (no self-attention, two tanh gates) between
  two GPT layers, ``forward(input_ids, cross_attention_states)`` with the states required.
- a masked-diffusion LM's DiT backbone (SEDD / MDLM style): the noise level sigma (B,) embedded by sinusoids and an
  MLP into c, adaLN blocks (LayerNorm without affine, ``norm(x) (1 + scale) + shift`` and a gate on each branch, all
  from ``adaLN_modulation(silu(c))``), a modulated output head; ``forward(indices, sigma)``.
- FiLM: a post-norm BERT of the hand-written attention whose hidden states are scaled and shifted after each layer
  by ``gamma, beta = proj(style)``; ``forward(input_ids, style)``.
- a Perceiver resampler: three learned latents whose queries read keys and values of ``cat(norm(media),
  norm(latents))``, a feed-forward, a final norm; ``forward(media) -> (B, 3, D)``.
- a soft prompt in a BERT: four learned vectors (an ``nn.Parameter``) concatenated ahead of the embedded tokens,
  their rows dropped from the output, so that the output has the ids' shape.
- an encoder-decoder whose decoder's cross-attention keys and values are projected once for every layer: one
  ``memory_kv`` Linear of D -> 2 L D features, viewed (B, S, L, 2, H, HD) and permuted to (L, 2, B, H, S, HD), each
  layer's cross-attention holding only its query and output Linears, its scores by einsum with an additive
  finfo.min padding bias (pad id 0).
- mistakes, each in a second layer or in the cross-attention: scale 1 / d_head in the GPT's second self-attention,
  the softmax over the queries in the second cross-attention, a hand-written LayerNorm of unbiased variance (over
  D - 1) in the FiLM encoder's second layer, scale 1 / d_head in the seq2seq's second cross-attention, the causal
  mask left out of its second decoder self-attention.

Expected verdicts decided from the math before the judge ran:

- Flamingo on text alone computes exactly the GPT (the gated blocks are not run): a pass at transformer_lm, and
  the wrong scale named at ``layers.1.self_attn``; one of its GPT layers alone at decoder_only_layer passes. Given
  media by example=, ``tanh(attn_gate)`` times a cross-attention on media is math the decoder-only reference has no
  pair for: no pair at ``gated_xattn.0``, naming tanh. The cross-attention module and its inner attention at
  multi_head_attention are the reference's attention (key = value = media; the inner one with kv omitted a
  self-attention): a pass, and the softmax over the queries named at the inner attention.
- The Mllama-style LM and the diffusion LM cannot be called on ids alone (cross_attention_states, sigma required);
  "could not judge", naming the argument; the Mllama-style LM given its states by example= has no pair at its
  cross-attention layer ``layers.1``, naming tanh (a layer of no self-attention, its branches gated). The
  diffusion LM given (ids, sigma) by example=: the LayerNorm's output scaled and shifted by numbers computed from
  sigma has no pair, at ``blocks.0`` naming adaLN_modulation.
- FiLM given (ids, style) by example=: gamma x + beta from the style has no pair, at ``films.0`` naming its proj;
  its BERT layer alone at encoder_layer passes, and its unbiased variance is layer_norm.unbiased_variance at norm1
  (the norm whose weight and bias the hand-written code reads).
- The resampler's learned latents as the queries, and the soft prompt's rows ahead of the tokens, are math the
  reference lacks: no pair at the module, naming latents and soft_prompt.
- The cached-cross encoder-decoder computes the reference's transformer (each layer's keys and values are a slice
  of memory_kv: a Linear's rows): a pass, and the two mistakes named at ``decoder.1.cross_attn`` and
  ``decoder.1.self_attn``.

Checked by hand in float64: the hand-written attention equals SDPA (causal, and with a keep mask) to 2e-16; a
layer's keys and values read from memory_kv equal its rows' Linear to 4e-16; media change Flamingo's logits (0.24),
sigma the diffusion LM's (0.03), the style the FiLM encoder's output (5.3).

First met: 9 of 19 right. Wrong:

- f44_flamingo.media, f44_mllama.states and f44_film_encoder (example= given): "could not judge: the module's
  forward could not be recorded on the inputs of ... (its forward raised RuntimeError: mat1 and mat2 must have
  the same dtype, but got Long and Float); pass call= ... or mapping=": a Long tensor reached a Linear of the
  media, states or style (the level's ids, it seems, put in a float input's place by check/calling.py's example
  callers), the example's own call not recorded; the diffusion LM's example, whose float input is a (B,) vector,
  was read (its sigma case right). Not traced further.
- f44_flamingo.cross_attn: "could not judge: ... (the module's forward takes ['x', 'media'] positionally (without
  defaults), but the reference 'multi_head_attention' gives ['query', 'key', 'value']: pass call=...)": no caller
  of a two-input cross-attention (query, memory) with key = value; defensible as a could-not-judge, but call= would
  not help where the probes' keys and values differ.
- f44_flamingo.cross_attn.inner and its softmax_over_queries mistake: the same, "takes ['x', 'kv'] positionally
  (without defaults)", though kv defaults to None and the module called with x alone is a self-attention (the
  level's self-attention probes not tried; check/calling.py's signature reading).
- f44_film_encoder.layer.unbiased_variance: no id, no op: "unexplained: (the module): d self_attn_norm.bias
  diverges (relative error 1.95e-02 in float64): the gradient of your norm1.bias; no catalogue variant reproduces
  it": the norm computed in the layer's own method from norm1's parameters (norm1's forward never runs), so the
  catalogue's variants, tried at a norm module's output, are not reached (measured: the same norm written as an
  nn.LayerNorm subclass's forward, put in as norm1, is named layer_norm.unbiased_variance at norm1).
- f44_cached_cross_seq2seq and its two mistakes: FAILED, "unexplained: decoder.0.cross_attn.o_proj (reference
  decoder.layers.0.cross_attn) diverges with relative error 8.03e-01 ...": the map gives memory_kv to layer 0's
  cross-attention as fused q and v rows and the layer's own q_proj as its k_proj (check/'s mapping of fused
  projections reads one Linear as one layer's; a projection shared by every layer, sliced per layer, not met).

Right, but worth a look: f44_resampler's no pair says "layer_norm(latents) normalises latents before a product reads
it" (the latents named, the reason not the queries being learned) and f44_soft_prompt_bert's "soft_prompt projects
4 -> 32 features in no attention or feed-forward block (a linear no unit of the reference holds)" (the parameter
named, read as a Linear's weight rather than rows joined by a cat).

Fixed since: an example's call puts the level's probe only in the place of the inputs it takes (a model's ids in
its integer tensors), the other inputs kept as given (float ones in the run's dtype, repeated to the probe's
batch), the padding read on that call too; projections of an input the ids' rows never reach (media, states, a
style, a noise level) are read as conditioning, no feed-forward of a layer, and a product of the stream with one
(FiLM's scale) or with an activation of a learned number (tanh(attn_gate)) is no pair where it is taken. An
attention's forward(x, kv=None) is called with x alone first (a self-attention), and a forward(x, media) as the
query and one memory, the reference's value its key.

Also fixed since: one projection whose output is sliced per layer is read from the columns each attention takes of it
(dataflow.columns_held): every layer's cross-attention holds its own k and v rows of ``memory_kv``, linked in the
order of the user's rows and printed as such; the keys are measured by those rows, not by the whole projection, so
the queries are no longer exchanged with them; a mistake is named at the module around the rest
(``decoder.1.cross_attn``). A norm whose module never runs, its weight and bias read by its parent's own code, is
judged in situ at the last op reading them in the recorded forward, so its catalogue variants are reached and named
at ``norm1``. The resampler's no pair now says its attention's queries are the learned rows of ``latents`` (no input
of the module), and the soft prompt's that its rows are put beside the tokens' embeddings by a cat.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

D, H, V, T_MAX = 32, 4, 26, 16
HD = D // H
S_MEDIA, N_LATENTS, N_PROMPT = 5, 3, 4


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases (and the tanh gates) moved off their 1s and 0s, so that a trained model's are checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() <= 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _gate(value: float) -> nn.Parameter:
    """A Flamingo tanh gate, drawn nonzero as a trained one is (at its zero init the block adds nothing)."""
    return nn.Parameter(torch.tensor(value))


class Attention(nn.Module):
    """Hand-written multi-head attention of q/k/v/o Linears, self (kv None) or cross; `causal` hides the future,
    `keep` (B, S) True on the real keys. `mistake`: "scale" (1 / d_head), "axis" (softmax over the queries), "open"
    (the causal mask left out)."""

    def __init__(self, causal: bool = False, mistake: str = "") -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(D, D) for _ in range(4))
        self.causal, self.mistake = causal, mistake

    def heads(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(t.shape[0], t.shape[1], H, HD).transpose(1, 2)

    def attend(self, q, k, v, keep=None) -> torch.Tensor:
        """q (B, H, T, HD), k and v (B, H, S, HD) -> (B, T, D)."""
        scale = 1.0 / HD if self.mistake == "scale" else HD**-0.5
        scores = q @ k.transpose(-2, -1) * scale
        if self.causal and self.mistake != "open":
            T, S = scores.shape[-2:]
            scores = scores.masked_fill(torch.ones(T, S, dtype=torch.bool).triu(1), float("-inf"))
        if keep is not None:
            scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
        weights = scores.softmax(dim=-2 if self.mistake == "axis" else -1)
        y = (weights @ v).transpose(1, 2)
        return self.o_proj(y.reshape(y.shape[0], y.shape[1], D))

    def forward(self, x: torch.Tensor, kv: torch.Tensor | None = None) -> torch.Tensor:
        kv = x if kv is None else kv
        return self.attend(self.heads(self.q_proj(x)), self.heads(self.k_proj(kv)), self.heads(self.v_proj(kv)))


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))


# -- Flamingo: gated cross-attention blocks interleaved with a frozen GPT's layers ---------------------------------


class GPTLayer(nn.Module):
    """A pre-norm GPT layer: causal self-attention and a GELU MLP."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.self_attn, self.mlp = Attention(causal=True, mistake=mistake), _mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class MaskedCrossAttention(nn.Module):
    """The text's queries on the media's keys and values: forward(x, media)."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.attn = Attention(mistake=mistake)

    def forward(self, x: torch.Tensor, media: torch.Tensor) -> torch.Tensor:
        return self.attn(x, media)


class GatedCrossAttentionBlock(nn.Module):
    """Flamingo's block: x + tanh(attn_gate) xattn(norm(x), media), then x + tanh(ff_gate) ff(norm(x))."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.norm, self.ff_norm = nn.LayerNorm(D), nn.LayerNorm(D)
        self.xattn, self.ff = MaskedCrossAttention(mistake), _mlp()
        self.attn_gate, self.ff_gate = _gate(0.6), _gate(-0.4)

    def forward(self, x: torch.Tensor, media: torch.Tensor) -> torch.Tensor:
        x = x + self.attn_gate.tanh() * self.xattn(self.norm(x), media)
        return x + self.ff_gate.tanh() * self.ff(self.ff_norm(x))


class FlamingoLM(nn.Module):
    """A small GPT with a gated cross-attention block before each of its layers; forward(input_ids, media=None):
    the blocks are skipped when no media are given (text alone), as Flamingo's are where no image precedes."""

    def __init__(self, mistakes: dict[int, str]) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T_MAX, D)
        self.layers = nn.ModuleList([GPTLayer(mistakes.get(i, "")) for i in range(2)])
        self.gated_xattn = nn.ModuleList([GatedCrossAttentionBlock(mistakes.get(10 + i, "")) for i in range(2)])
        self.ln_f, self.lm_head = nn.LayerNorm(D), nn.Linear(D, V, bias=False)

    def forward(self, input_ids: torch.Tensor, media: torch.Tensor | None = None) -> torch.Tensor:
        x = self.wte(input_ids) + self.wpe(torch.arange(input_ids.shape[1]))
        for block, layer in zip(self.gated_xattn, self.layers, strict=True):
            x = layer(x if media is None else block(x, media))
        return self.lm_head(self.ln_f(x))


def flamingo(mistakes: dict[int, str] | None = None) -> FlamingoLM:
    torch.manual_seed(0)
    return _jitter(FlamingoLM(mistakes or {})).eval()  # type: ignore[return-value]


def flamingo_example() -> tuple:
    torch.manual_seed(1)
    return (torch.randint(0, V, (2, 6)), torch.randn(2, S_MEDIA, D)), {}


# -- Llama-3.2-Vision style: cross-attention decoder layers of their own between the self-attention layers ---------


class CrossAttentionDecoderLayer(nn.Module):
    """Mllama's cross-attention layer: no self-attention; x + tanh(gate) xattn(norm(x), states), a gated MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = nn.LayerNorm(D), nn.LayerNorm(D)
        self.cross_attn, self.mlp = Attention(), _mlp()
        self.cross_attn_attn_gate, self.cross_attn_mlp_gate = _gate(0.3), _gate(0.7)

    def forward(self, x: torch.Tensor, cross_attention_states: torch.Tensor) -> torch.Tensor:
        x = x + self.cross_attn_attn_gate.tanh() * self.cross_attn(self.input_layernorm(x), cross_attention_states)
        return x + self.cross_attn_mlp_gate.tanh() * self.mlp(self.post_attention_layernorm(x))


class MllamaStyleLM(nn.Module):
    """Layers [self, cross, self]; forward(input_ids, cross_attention_states) always runs the cross layer."""

    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T_MAX, D)
        self.layers = nn.ModuleList([GPTLayer(), CrossAttentionDecoderLayer(), GPTLayer()])
        self.ln_f, self.lm_head = nn.LayerNorm(D), nn.Linear(D, V, bias=False)

    def forward(self, input_ids: torch.Tensor, cross_attention_states: torch.Tensor) -> torch.Tensor:
        x = self.wte(input_ids) + self.wpe(torch.arange(input_ids.shape[1]))
        for layer in self.layers:
            is_cross = isinstance(layer, CrossAttentionDecoderLayer)
            x = layer(x, cross_attention_states) if is_cross else layer(x)
        return self.lm_head(self.ln_f(x))


def mllama() -> MllamaStyleLM:
    torch.manual_seed(0)
    return _jitter(MllamaStyleLM()).eval()  # type: ignore[return-value]


def mllama_example() -> tuple:
    torch.manual_seed(1)
    return (torch.randint(0, V, (2, 6)), torch.randn(2, S_MEDIA, D)), {}


# -- a masked-diffusion LM's DiT backbone: adaLN from a timestep embedding of the noise level ----------------------


class TimestepEmbedder(nn.Module):
    """Sinusoids of sigma (B,) -> an MLP -> the conditioning vector c (B, D)."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(D, D), nn.SiLU(), nn.Linear(D, D))

    def forward(self, sigma: torch.Tensor) -> torch.Tensor:
        dtype = self.mlp[0].weight.dtype
        freqs = torch.exp(-math.log(10000.0) * torch.arange(D // 2, dtype=dtype) / (D // 2))
        angles = sigma[:, None].to(dtype) * freqs[None]
        return self.mlp(torch.cat([angles.cos(), angles.sin()], dim=-1))


class AdaLNBlock(nn.Module):
    """A DiT block: LayerNorm without affine, then x (1 + scale) + shift from c, the branch times a gate."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(D, elementwise_affine=False)
        self.norm2 = nn.LayerNorm(D, elementwise_affine=False)
        self.attn, self.mlp = Attention(), _mlp()
        self.adaLN_modulation = nn.Linear(D, 6 * D)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        mods = self.adaLN_modulation(F.silu(c))[:, None].chunk(6, dim=-1)
        shift1, scale1, gate1, shift2, scale2, gate2 = mods
        x = x + gate1 * self.attn(self.norm1(x) * (1 + scale1) + shift1)
        return x + gate2 * self.mlp(self.norm2(x) * (1 + scale2) + shift2)


class DiffusionLM(nn.Module):
    """forward(indices, sigma): token embeddings, rotary-free learned positions, adaLN blocks, a modulated head."""

    def __init__(self) -> None:
        super().__init__()
        self.vocab_embed, self.pos = nn.Embedding(V, D), nn.Embedding(T_MAX, D)
        self.sigma_map = TimestepEmbedder()
        self.blocks = nn.ModuleList([AdaLNBlock() for _ in range(2)])
        self.norm_final = nn.LayerNorm(D, elementwise_affine=False)
        self.output_modulation, self.output = nn.Linear(D, 2 * D), nn.Linear(D, V)

    def forward(self, indices: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        c = F.silu(self.sigma_map(sigma))
        x = self.vocab_embed(indices) + self.pos(torch.arange(indices.shape[1]))
        for block in self.blocks:
            x = block(x, c)
        shift, scale = self.output_modulation(c)[:, None].chunk(2, dim=-1)
        return self.output(self.norm_final(x) * (1 + scale) + shift)


def diffusion_lm() -> DiffusionLM:
    torch.manual_seed(0)
    return _jitter(DiffusionLM()).eval()  # type: ignore[return-value]


def diffusion_example() -> tuple:
    torch.manual_seed(1)
    return (torch.randint(0, V, (2, 6)), torch.rand(2) * 5), {}


# -- FiLM: a style vector scales and shifts the hidden states between BERT layers ----------------------------------


class PostNormLayer(nn.Module):
    """A post-norm BERT layer of the hand-written attention; `mistake` "unbiased" (its first norm's variance over
    D - 1) or an attention mistake."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.attn = Attention(mistake="" if mistake == "unbiased" else mistake)
        self.norm1, self.norm2, self.ff = nn.LayerNorm(D), nn.LayerNorm(D), _mlp()
        self.unbiased = mistake == "unbiased"

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        if not self.unbiased:
            return self.norm1(x)
        mu, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=True)
        return (x - mu) / torch.sqrt(var + self.norm1.eps) * self.norm1.weight + self.norm1.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x + self.attn(x))
        return self.norm2(x + self.ff(x))


class FiLM(nn.Module):
    """gamma, beta = proj(c); gamma x + beta, per feature."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, 2 * D)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        gamma, beta = self.proj(c)[:, None].chunk(2, dim=-1)
        return gamma * x + beta


class FiLMEncoder(nn.Module):
    """forward(input_ids, style): style (B, D), a FiLM after each layer."""

    def __init__(self, mistakes: dict[int, str]) -> None:
        super().__init__()
        self.embed, self.pos, self.emb_norm = nn.Embedding(V, D), nn.Embedding(T_MAX, D), nn.LayerNorm(D)
        self.layers = nn.ModuleList([PostNormLayer(mistakes.get(i, "")) for i in range(2)])
        self.films = nn.ModuleList([FiLM() for _ in range(2)])

    def forward(self, input_ids: torch.Tensor, style: torch.Tensor) -> torch.Tensor:
        x = self.emb_norm(self.embed(input_ids) + self.pos(torch.arange(input_ids.shape[1])))
        for layer, film in zip(self.layers, self.films, strict=True):
            x = film(layer(x), style)
        return x


def film_encoder(mistakes: dict[int, str] | None = None) -> FiLMEncoder:
    torch.manual_seed(0)
    return _jitter(FiLMEncoder(mistakes or {})).eval()  # type: ignore[return-value]


def film_example() -> tuple:
    torch.manual_seed(1)
    return (torch.randint(0, V, (2, 6)), torch.randn(2, D)), {}


# -- a Perceiver resampler: learned latents attend to the media and to themselves -----------------------------------


class ResamplerLayer(nn.Module):
    """Flamingo's PerceiverAttention: the latents' queries on keys and values of cat(media, latents)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm_media, self.norm_latents = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn, self.ff_norm, self.ff = Attention(), nn.LayerNorm(D), _mlp()

    def forward(self, media: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        x, lat = self.norm_media(media), self.norm_latents(latents)
        kv = torch.cat([x, lat], dim=1)
        a = self.attn
        latents = latents + a.attend(a.heads(a.q_proj(lat)), a.heads(a.k_proj(kv)), a.heads(a.v_proj(kv)))
        return latents + self.ff(self.ff_norm(latents))


class PerceiverResampler(nn.Module):
    """forward(media (B, S, D)) -> (B, N_LATENTS, D)."""

    def __init__(self) -> None:
        super().__init__()
        self.latents = nn.Parameter(torch.randn(N_LATENTS, D))
        self.layers = nn.ModuleList([ResamplerLayer() for _ in range(2)])
        self.norm = nn.LayerNorm(D)

    def forward(self, media: torch.Tensor) -> torch.Tensor:
        latents = self.latents.expand(media.shape[0], -1, -1)
        for layer in self.layers:
            latents = layer(media, latents)
        return self.norm(latents)


def resampler() -> PerceiverResampler:
    torch.manual_seed(0)
    return _jitter(PerceiverResampler()).eval()  # type: ignore[return-value]


# -- soft prompt in a BERT: learned vectors prepended, dropped from the output --------------------------------------


class SoftPromptEncoder(nn.Module):
    """N_PROMPT learned vectors concatenated ahead of the embedded tokens; the encoder's output at the tokens'
    positions returned (the prompt's rows dropped), so the output has the ids' shape."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.pos, self.emb_norm = nn.Embedding(V, D), nn.Embedding(T_MAX, D), nn.LayerNorm(D)
        self.soft_prompt = nn.Parameter(0.5 * torch.randn(N_PROMPT, D))
        self.layers = nn.ModuleList([PostNormLayer() for _ in range(2)])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.emb_norm(self.embed(input_ids) + self.pos(torch.arange(input_ids.shape[1])))
        x = torch.cat([self.soft_prompt.expand(x.shape[0], -1, -1), x], dim=1)
        for layer in self.layers:
            x = layer(x)
        return x[:, N_PROMPT:]


def soft_prompt_bert() -> SoftPromptEncoder:
    torch.manual_seed(0)
    return _jitter(SoftPromptEncoder()).eval()  # type: ignore[return-value]


# -- an encoder-decoder whose decoder's cross-attention keys and values are projected once, for every layer --------


class CrossFromCache(nn.Module):
    """Cross-attention reading its keys and values from the model's one projection of the memory."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.q_proj, self.o_proj = nn.Linear(D, D), nn.Linear(D, D)
        self.mistake = mistake

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """x (B, T, D); k, v (B, H, S, HD); keep (B, S)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, H, HD).transpose(1, 2)
        scale = 1.0 / HD if self.mistake == "scale" else HD**-0.5
        scores = torch.einsum("bhtd,bhsd->bhts", q, k) * scale
        bias = torch.zeros(keep.shape, dtype=scores.dtype).masked_fill(~keep, torch.finfo(scores.dtype).min)
        scores = scores + bias[:, None, None, :]
        y = torch.einsum("bhts,bhsd->bthd", scores.softmax(-1), v)
        return self.o_proj(y.reshape(B, T, D))


class Seq2SeqDecoderLayer(nn.Module):
    def __init__(self, self_mistake: str = "", cross_mistake: str = "") -> None:
        super().__init__()
        self.self_attn, self.cross_attn = Attention(causal=True, mistake=self_mistake), CrossFromCache(cross_mistake)
        self.norm1, self.norm2, self.norm3, self.ff = nn.LayerNorm(D), nn.LayerNorm(D), nn.LayerNorm(D), _mlp()

    def forward(self, x, k, v, src_keep):
        x = self.norm1(x + self.self_attn(x))
        x = self.norm2(x + self.cross_attn(x, k, v, src_keep))
        return self.norm3(x + self.ff(x))


class CachedCrossSeq2Seq(nn.Module):
    """Post-norm encoder-decoder; `memory_kv` projects the encoder's output once to every decoder layer's keys and
    values (2 L D features), split per layer and head; pad id 0 hidden from the encoder and the cross-attention."""

    def __init__(self, self_mistakes: dict[int, str], cross_mistakes: dict[int, str]) -> None:
        super().__init__()
        self.embed, self.src_pos, self.tgt_pos = nn.Embedding(V, D), nn.Embedding(T_MAX, D), nn.Embedding(T_MAX, D)
        self.encoder = nn.ModuleList([PostNormLayer() for _ in range(2)])
        self.memory_kv = nn.Linear(D, 2 * 2 * D)
        self.decoder = nn.ModuleList(
            [Seq2SeqDecoderLayer(self_mistakes.get(i, ""), cross_mistakes.get(i, "")) for i in range(2)]
        )
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        keep = src != 0
        memory = self.embed(src) + self.src_pos(torch.arange(src.shape[1]))
        for layer in self.encoder:
            memory = layer.norm(memory + self._encoder_attention(layer, memory, keep))
            memory = layer.norm2(memory + layer.ff(memory))
        B, S, _ = memory.shape
        kv = self.memory_kv(memory).view(B, S, 2, 2, H, HD).permute(2, 3, 0, 4, 1, 5)  # (L, 2, B, H, S, HD)
        x = self.embed(tgt) + self.tgt_pos(torch.arange(tgt.shape[1]))
        for i, layer in enumerate(self.decoder):
            x = layer(x, kv[i, 0], kv[i, 1], keep)
        return self.lm_head(x)

    @staticmethod
    def _encoder_attention(layer: PostNormLayer, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        a = layer.attn
        return a.attend(a.heads(a.q_proj(x)), a.heads(a.k_proj(x)), a.heads(a.v_proj(x)), keep)


def cached_cross_seq2seq(self_mistakes=None, cross_mistakes=None) -> CachedCrossSeq2Seq:
    torch.manual_seed(0)
    return _jitter(CachedCrossSeq2Seq(self_mistakes or {}, cross_mistakes or {})).eval()  # type: ignore[return-value]


LM = "transformer_lm"
MHA = "multi_head_attention"

CASES = [
    ("f44_flamingo", flamingo, LM, {}, "pass"),
    (
        "f44_flamingo.wrong_scale_second_layer",
        lambda: flamingo({1: "scale"}),
        LM,
        {},
        ("mistake", "attention.wrong_scale", "layers.1.self_attn"),
    ),
    ("f44_flamingo.media", flamingo, LM, {"example": flamingo_example()}, ("no pair", "gated_xattn.0", "tanh")),
    ("f44_flamingo.cross_attn", lambda: flamingo().gated_xattn[1].xattn, MHA, {}, "pass"),
    ("f44_flamingo.cross_attn.inner", lambda: flamingo().gated_xattn[1].xattn.attn, MHA, {}, "pass"),
    (
        "f44_flamingo.cross_attn.inner.softmax_over_queries",
        lambda: flamingo({11: "axis"}).gated_xattn[1].xattn.attn,
        MHA,
        {},
        ("mistake", "attention.softmax_wrong_axis", ""),
    ),
    ("f44_flamingo.layer", lambda: flamingo().layers[1], "decoder_only_layer", {}, "pass"),
    ("f44_mllama", mllama, LM, {}, ("could not judge", None, "cross_attention_states")),
    ("f44_mllama.states", mllama, LM, {"example": mllama_example()}, ("no pair", "layers.1", "tanh")),
    ("f44_diffusion_lm", diffusion_lm, "encoder_model", {}, ("could not judge", None, "sigma")),
    (
        "f44_diffusion_lm.sigma",
        diffusion_lm,
        "encoder_model",
        {"example": diffusion_example()},
        ("no pair", "blocks.0", "adaLN_modulation"),
    ),
    ("f44_film_encoder", film_encoder, "encoder_model", {"example": film_example()}, ("no pair", "films.0", "proj")),
    ("f44_film_encoder.layer", lambda: film_encoder().layers[1], "encoder_layer", {}, "pass"),
    (
        "f44_film_encoder.layer.unbiased_variance",
        lambda: film_encoder({1: "unbiased"}).layers[1],
        "encoder_layer",
        {},
        ("mistake", "layer_norm.unbiased_variance", "norm1"),
    ),
    ("f44_resampler", resampler, "encoder_stack", {}, ("no pair", "", "latents")),
    ("f44_soft_prompt_bert", soft_prompt_bert, "encoder_model", {}, ("no pair", "", "soft_prompt")),
    ("f44_cached_cross_seq2seq", cached_cross_seq2seq, "transformer", {}, "pass"),
    (
        "f44_cached_cross_seq2seq.wrong_scale_second_cross",
        lambda: cached_cross_seq2seq(cross_mistakes={1: "scale"}),
        "transformer",
        {},
        ("mistake", "attention.wrong_scale", "decoder.1.cross_attn"),
    ),
    (
        "f44_cached_cross_seq2seq.not_causal_second_decoder_layer",
        lambda: cached_cross_seq2seq(self_mistakes={1: "open"}),
        "transformer",
        {},
        ("mistake", "attention.not_causal", "decoder.1.self_attn"),
    ),
]
