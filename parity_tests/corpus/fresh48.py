"""Models whose numbers are scaled by constants, written by hand as 2025-26 blog posts and reference code write them
(issue 46, round 48), in this project's own words. The judge meets them here first (measured with the judge
frozen; this corpus is not fixed afterwards).

- IBM Granite style: a Llama decoder (RMSNorm, rotate-half RoPE, a SwiGLU MLP, no biases) whose token embeddings
  are multiplied by ``embedding_multiplier``, every sublayer output by ``residual_multiplier`` before the add, whose
  scores take ``attention_multiplier`` in place of 1 / sqrt(d_head) and whose logits are divided by
  ``logits_scaling``.
- MiniCPM style: the same decoder with ``scale_emb`` on the embeddings, each sublayer output scaled by
  ``scale_depth / sqrt(n_layers)`` and the final hidden states divided by ``d_model / dim_model_base``.
- Cohere Command-R style: a parallel block (one LayerNorm without bias read by the attention and the MLP, both added
  to the stream), a tied head and the logits multiplied by ``logit_scale``.
- a muP-style attention alone: the scores scaled by 1 / d_head.
- OLMo 2 style: no norm on a sublayer's input, an RMSNorm on its output before the residual add, and q_norm and
  k_norm RMSNorms over all heads' features (before the head split).
- Gemma's embedding normaliser: ``sqrt(d)`` made a tensor of the embedding's dtype before the product.
- a T5-style attention alone: the scores not scaled at all.

Expected verdicts decided from the math before the judge ran. The reference (transformer_spec.config) has a
factor on q . k of any value (attention_scale), a factor on the final hidden states before the output projection
(output_scale: with a head of no bias, the same as one on the logits), the sqrt(d_model) embedding factor
(scale_embeddings), the parallel block with one shared norm (parallel_residual, shared_norm), LayerNorm without
bias (norm_bias), OLMo 2's layout (input_norm False with sandwich_norm) and its projection-wide q/k norms
(qk_norm_projection). It has no factor on the embeddings other than sqrt(d_model) and none on a sublayer's output.
So:

- the Granite and MiniCPM decoders whose embedding and residual factors are 1, their attention and logit factors
  stated by keywords (attention_scale=, output_scale=), pass; with embedding_multiplier 12 (Granite) or scale_emb 12
  (MiniCPM): no pair naming 12 at the model itself (the product is taken in its own forward, on the output of
  ``embed_tokens``; first written down as ``embed_tokens``, corrected after the run on reading the rule that a no pair
  is said at the module whose forward computes the op, as the residual's at ``layers.0``); with residual_multiplier
  0.22 alone: no pair at ``layers.0`` naming 0.22, and so for the multiplier put on the stream instead (``0.22 x +
  attn(x)``, a mistake no catalogue id describes: still a product the reference lacks). Granite's second attention
  scaled by 1 / sqrt(d_head) where attention_multiplier is stated: attention.wrong_scale at ``layers.1.self_attn``.
  The logits multiplied by logits_scaling instead of divided, output_scale stated 1 / 4: no id fits (the catalogue has
  no logits entry) and the model is the reference at output_scale 4, so the answer expected is a no pair naming the
  factor 4 at the model (whose forward multiplies; first written down at ``lm_head``, corrected with the embeddings').
- Cohere given norm_first, parallel_residual, shared_norm, norm_bias False and output_scale 1 / 16 by keywords: a
  pass (its layer alone at decoder_only_layer too), and attention.wrong_scale at ``layers.1.self_attn`` for
  1 / d_head in its second attention.
- the muP attention at multi_head_attention with attention_scale 1 / d_head stated: a pass; unstated, the default
  1 / sqrt(d_head) is what the user claims, so attention.wrong_scale at the module itself.
- OLMo 2 given input_norm False, sandwich_norm, qk_norm and qk_norm_projection: a pass, and its second attention
  at 1 / d_head attention.wrong_scale at ``layers.1.self_attn``.
- Gemma's normaliser computes sqrt(d) in the embedding's dtype (exactly the float64 factor in float64): a pass
  with scale_embeddings; the normaliser left out while scale_embeddings is stated: embedding.missing_scale at
  ``embed_tokens``.
- T5's attention with attention_scale 1.0 stated: a pass.

Checked by hand in float64: the hand-written attention equals SDPA (causal) to 1e-15; the head of no bias scaled
after equals the head on scaled hidden states to 1e-15.

First met: 12 of 18 right. Wrong:

- f48_granite.residual_multiplier_on_stream: "differs at layers.0: mul in layers.0's own forward computes what the
  reference's layer does not (post_attention_layernorm reads it)": the right class and place, but the factor 0.22
  is not named (the residual_multiplier case's answer says "self_attn's output is multiplied by 0.22"; a product
  of the stream itself is described only by its op).
- f48_granite.wrong_scale_second_layer: "unexplained: layers.1.self_attn ... diverges with relative error
  2.53e-01 ...; not expressible by the config and no catalogue variant reproduces it": with attention_scale 1 / 8
  stated, a second attention at 1 / sqrt(8) is not tried as attention.wrong_scale (the variant, it seems, is
  measured from the default 1 / sqrt(d_head) only), so neither an id nor an op.
- f48_granite.logits_multiplied: "unexplained: (the module): every part agrees in situ, the output departs after
  the last: mul in (the module)": the op found but said as unexplained, no id and no "differs at".
- f48_cohere.layer: "differs at mlp: the feed-forward block does not read the attention's output ... (a parallel
  block ...), which the reference has no pair for", though parallel_residual and shared_norm are given and the
  whole Cohere LM passes under them: the decoder_only_layer level does not judge the reference's parallel layer.
- f48_mup_attention and f48_t5_attention: correct attentions (the same modules pass at 1 / sqrt(d_head)) FAILED
  with "unexplained: (the module): d q_proj.weight diverges ...; no catalogue variant reproduces it" under
  attention_scale 1 / 8 and 1.0 stated (shown in "config assumed"): check/reference.py's run_attention builds its
  ScoreMod from the causal flag and the window only, not from cfg.attention_scale.

Fixed since: the attention-level reference (reference.run_attention) puts the config's attention_scale and
attn_softcap on its scores; attention.wrong_scale is tried against the divisor the config states (the default
sqrt(d_head) then among the mistakes); ops past every part, where the output departs after the last, are said as
no pair at the module that runs the first, a product by a number with its number and what it multiplies; a block's
own product of its input (the stream) by a number is said with that number; the decoder_only_layer level reads a
parallel block as the reference's parallel layer (its one or two norms) and runs it. 18 of 18 right.

Right, but worth a look: the embedding multipliers are said at the model itself (the product in its forward),
"the embeddings (embed_tokens.weight) are multiplied by 12, where the reference scales them by sqrt(D) = 5.657 or
not at all".

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

D, H, V, F_MLP, L = 32, 4, 26, 64, 2
HD = D // H


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains moved off their 1s, so that a trained model's are checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() <= 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _rope(x: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of base 10000 on x (B, H, T, HD)."""
    T = x.shape[-2]
    inv = 10000.0 ** (-torch.arange(0, HD, 2, dtype=torch.float64) / HD)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1).to(x.dtype)
    x1, x2 = x[..., : HD // 2], x[..., HD // 2 :]
    return x * ang.cos() + torch.cat([-x2, x1], dim=-1) * ang.sin()


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last `n` features."""

    def __init__(self, n: int = D, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(n)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class SelfAttention(nn.Module):
    """Causal RoPE attention of bias-free q/k/v/o Linears; scores times `scale` (None: 1 / sqrt(HD)); `qk_norm`:
    OLMo 2's RMSNorms over the whole q and k projections; `rope` False: no positions (a lone attention)."""

    def __init__(self, scale: float | None = None, qk_norm: bool = False, rope: bool = True) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(D, D, bias=False) for _ in range(4))
        self.scale = HD**-0.5 if scale is None else scale
        self.rope = rope
        if qk_norm:
            self.q_norm, self.k_norm = RMSNorm(), RMSNorm()
        self.qk_norm = qk_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.view(B, T, H, HD).transpose(1, 2) for t in (q, k, v))
        if self.rope:
            q, k = _rope(q), _rope(k)
        scores = (q @ k.transpose(-2, -1)) * self.scale
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D)
        return self.o_proj(y)


class SwiGLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(D, F_MLP, bias=False), nn.Linear(D, F_MLP, bias=False)
        self.down_proj = nn.Linear(F_MLP, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


# -- Granite / MiniCPM: a Llama decoder scaled by constants ---------------------------------------------------------


class ScaledLayer(nn.Module):
    """Pre-norm layer: x + r attn(norm(x)), then x + r mlp(norm(x)); `on_stream`: r x + attn(norm(x)) (the
    multiplier put on the residual by mistake)."""

    def __init__(self, r: float, scale: float | None, on_stream: bool = False) -> None:
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(), RMSNorm()
        self.self_attn, self.mlp = SelfAttention(scale), SwiGLU()
        self.r, self.on_stream = r, on_stream

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.on_stream:
            x = self.r * x + self.self_attn(self.input_layernorm(x))
            return self.r * x + self.mlp(self.post_attention_layernorm(x))
        x = x + self.self_attn(self.input_layernorm(x)) * self.r
        return x + self.mlp(self.post_attention_layernorm(x)) * self.r


class GraniteLM(nn.Module):
    """Granite's scaled decoder: embeddings times embedding_multiplier, sublayers times residual_multiplier,
    scores times attention_multiplier, logits divided by logits_scaling (multiplied with `logits_times`)."""

    def __init__(self, emb=1.0, res=1.0, attn=1.0 / HD, logits_scaling=4.0, scales=None, on_stream=False,
                 logits_times=False) -> None:  # fmt: skip
        super().__init__()
        scales = scales or {}
        self.embedding_multiplier, self.logits_scaling, self.logits_times = emb, logits_scaling, logits_times
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([ScaledLayer(res, scales.get(i, attn), on_stream) for i in range(L)])
        self.norm, self.lm_head = RMSNorm(), nn.Linear(D, V, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids) * self.embedding_multiplier
        for layer in self.layers:
            x = layer(x)
        logits = self.lm_head(self.norm(x))
        return logits * self.logits_scaling if self.logits_times else logits / self.logits_scaling


def granite(**kw) -> GraniteLM:
    torch.manual_seed(0)
    return _jitter(GraniteLM(**kw)).eval()  # type: ignore[return-value]


class MiniCPMLM(nn.Module):
    """MiniCPM's: embeddings times scale_emb, sublayers times scale_depth / sqrt(n_layers), the final hidden states
    divided by d_model / dim_model_base before the head."""

    def __init__(self, scale_emb: float = 1.0, scale_depth: float = math.sqrt(L), dim_model_base: int = 8) -> None:
        super().__init__()
        self.scale_emb, self.dim_model_base = scale_emb, dim_model_base
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([ScaledLayer(scale_depth / math.sqrt(L), None) for _ in range(L)])
        self.norm, self.lm_head = RMSNorm(), nn.Linear(D, V, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids) * self.scale_emb
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x) / (D / self.dim_model_base))


def minicpm(**kw) -> MiniCPMLM:
    torch.manual_seed(0)
    return _jitter(MiniCPMLM(**kw)).eval()  # type: ignore[return-value]


# -- Cohere Command-R: a parallel block, LayerNorm without bias, logit_scale ----------------------------------------


class CohereLayer(nn.Module):
    def __init__(self, scale: float | None = None) -> None:
        super().__init__()
        self.input_layernorm = nn.LayerNorm(D, eps=1e-5, bias=False)
        self.self_attn, self.mlp = SelfAttention(scale), SwiGLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.input_layernorm(x)
        return x + self.self_attn(h) + self.mlp(h)


class CohereLM(nn.Module):
    """Tied embeddings, a final LayerNorm without bias, logits times logit_scale."""

    def __init__(self, scales: dict[int, float] | None = None, logit_scale: float = 0.0625) -> None:
        super().__init__()
        scales = scales or {}
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([CohereLayer(scales.get(i)) for i in range(L)])
        self.norm = nn.LayerNorm(D, eps=1e-5, bias=False)
        self.logit_scale = logit_scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return (self.norm(x) @ self.embed_tokens.weight.T) * self.logit_scale


def cohere(**kw) -> CohereLM:
    torch.manual_seed(0)
    return _jitter(CohereLM(**kw)).eval()  # type: ignore[return-value]


# -- OLMo 2: norms on the sublayers' outputs, projection-wide q/k norms ---------------------------------------------


class Olmo2Layer(nn.Module):
    def __init__(self, scale: float | None = None) -> None:
        super().__init__()
        self.self_attn, self.mlp = SelfAttention(scale, qk_norm=True), SwiGLU()
        self.post_attention_layernorm, self.post_feedforward_layernorm = RMSNorm(), RMSNorm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(x))
        return x + self.post_feedforward_layernorm(self.mlp(x))


class Olmo2LM(nn.Module):
    def __init__(self, scales: dict[int, float] | None = None) -> None:
        super().__init__()
        scales = scales or {}
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([Olmo2Layer(scales.get(i)) for i in range(L)])
        self.norm, self.lm_head = RMSNorm(), nn.Linear(D, V, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def olmo2(**kw) -> Olmo2LM:
    torch.manual_seed(0)
    return _jitter(Olmo2LM(**kw)).eval()  # type: ignore[return-value]


# -- Gemma's normaliser ---------------------------------------------------------------------------------------------


class GemmaStyleLM(nn.Module):
    """A Llama decoder whose embeddings are multiplied by sqrt(D) as a tensor of their dtype (`normalise` False:
    left out)."""

    def __init__(self, normalise: bool = True) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([ScaledLayer(1.0, None) for _ in range(L)])
        self.norm, self.lm_head = RMSNorm(), nn.Linear(D, V, bias=False)
        self.normalise = normalise

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        if self.normalise:
            x = x * torch.tensor(D**0.5, dtype=x.dtype)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def gemma(**kw) -> GemmaStyleLM:
    torch.manual_seed(0)
    return _jitter(GemmaStyleLM(**kw)).eval()  # type: ignore[return-value]


def attention(scale: float) -> SelfAttention:
    """A lone causal attention (no positions) whose scores are multiplied by `scale`."""
    torch.manual_seed(0)
    return SelfAttention(scale, rope=False).eval()


LM = "transformer_lm"
MHA = "multi_head_attention"
GRANITE = {"positional": "rope", "attention_scale": 1.0 / HD, "output_scale": 0.25}
COHERE = {"positional": "rope", "norm_first": True, "parallel_residual": True, "shared_norm": True, "norm_bias": False}
OLMO2 = {"positional": "rope", "input_norm": False, "sandwich_norm": True, "qk_norm": True, "qk_norm_projection": True}

CASES = [
    ("f48_granite", granite, LM, GRANITE, "pass"),
    ("f48_granite.embedding_multiplier", lambda: granite(emb=12.0), LM, GRANITE, ("no pair", "", "12")),
    ("f48_granite.residual_multiplier", lambda: granite(res=0.22), LM, GRANITE, ("no pair", "layers.0", "0.22")),
    (
        "f48_granite.residual_multiplier_on_stream",
        lambda: granite(res=0.22, on_stream=True),
        LM,
        GRANITE,
        ("no pair", "layers.0", "0.22"),
    ),
    (
        "f48_granite.wrong_scale_second_layer",
        lambda: granite(scales={1: HD**-0.5}),
        LM,
        GRANITE,
        ("mistake", "attention.wrong_scale", "layers.1.self_attn"),
    ),
    ("f48_granite.logits_multiplied", lambda: granite(logits_times=True), LM, GRANITE, ("no pair", "", "4")),
    ("f48_minicpm", minicpm, LM, {"positional": "rope", "output_scale": 0.25}, "pass"),
    (
        "f48_minicpm.scale_emb",
        lambda: minicpm(scale_emb=12.0, scale_depth=1.4),
        LM,
        {"positional": "rope", "output_scale": 0.25},
        ("no pair", "", "12"),
    ),
    ("f48_cohere", cohere, LM, COHERE | {"output_scale": 0.0625}, "pass"),
    (
        "f48_cohere.wrong_scale_second_layer",
        lambda: cohere(scales={1: 1.0 / HD}),
        LM,
        COHERE | {"output_scale": 0.0625},
        ("mistake", "attention.wrong_scale", "layers.1.self_attn"),
    ),
    ("f48_cohere.layer", lambda: cohere().layers[1], "decoder_only_layer", COHERE, "pass"),
    ("f48_mup_attention", lambda: attention(1.0 / HD), MHA, {"attention_scale": 1.0 / HD}, "pass"),
    ("f48_mup_attention.unstated", lambda: attention(1.0 / HD), MHA, {}, ("mistake", "attention.wrong_scale", "")),
    ("f48_olmo2", olmo2, LM, OLMO2, "pass"),
    (
        "f48_olmo2.wrong_scale_second_layer",
        lambda: olmo2(scales={1: 1.0 / HD}),
        LM,
        OLMO2,
        ("mistake", "attention.wrong_scale", "layers.1.self_attn"),
    ),
    ("f48_gemma_normaliser", gemma, LM, {"positional": "rope", "scale_embeddings": True}, "pass"),
    (
        "f48_gemma_normaliser.missing",
        lambda: gemma(normalise=False),
        LM,
        {"positional": "rope", "scale_embeddings": True},
        ("mistake", "embedding.missing_scale", "embed_tokens"),
    ),
    ("f48_t5_attention", lambda: attention(1.0), MHA, {"attention_scale": 1.0}, "pass"),
]
