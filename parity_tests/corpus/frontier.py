"""Models of the kinds issue 49 added to the reference, written here in this project's own words: each a tiny model
the judge must pass with zero glue, or a mistake in its new math it must name where it sits.

- Gemma 2's soft caps: the attention scores squashed by cap * tanh(scores / cap) before the mask and the softmax,
  and the final logits by their own cap;
- Phi-2's parallel block (GPT-J's, Falcon's): one norm, whose output both the attention and the feed-forward read,
  their outputs added to the layer's input; GPT-NeoX's parallel layer of two norms; a mistake in a parallel block;
- mistakes in them: the cap's tanh without the division (cap * tanh(scores)), the cap applied after the softmax;
- GPT-OSS's attention sinks (a logit per head joined to the scores, dropped after the softmax), and the sink left
  out of the denominator in the second block;
- QuickGELU with its constant mistyped (x * sigmoid(1.72 x)): named activation.quick_gelu_constant at the activation
  (QuickGELU itself is an activation of TransformerConfig since issue 49, so a correct one passes);
- CLIP's text tower (token and learned positions, causal pre-norm blocks with QuickGELU, the final norm's output at
  the end token, the largest id, times a projection): read and judged by check/towers.py; QuickGELU's constant
  mistyped and the causal mask left out in its second block, each named there;
- a ViT (patches by a strided convolution, a class token, learned positions), as nn.TransformerEncoder layers and as
  blocks of its own: a model class of its own in the reference (numpy_transformer/vision.py), read and judged by
  check/towers.py; softmax over the queries in its second block named there, and the positions added before the
  class token is put in front named at the position table.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .unseen import HD, T_MAX, D, GemmaLM, SoftmaxOverQueries, TableAttention, TableBlock, TableLM

ATTN_CAP, LOGIT_CAP = 5.0, 3.0  # smaller than Gemma 2's 50 and 30, so that tiny random scores reach the bend


# -- Gemma 2's soft caps -----------------------------------------------------------------------------------------


class CappedAttention(TableAttention):
    """Scores squashed into (-cap, cap) before the mask: cap * tanh(scores / cap)."""

    def cap(self, scores):
        return ATTN_CAP * torch.tanh(scores / ATTN_CAP)

    def forward(self, x, cos, sin, mask=None):
        B, T, _ = x.shape
        q, k, v = self.heads(self.q_proj(x)), self.heads(self.k_proj(x)), self.heads(self.v_proj(x))
        q, k = self.turn(q, cos, sin), self.turn(k, cos, sin)
        scores = self.cap(q @ k.transpose(-2, -1) / math.sqrt(HD))
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = self.probabilities(scores)
        return self.o_proj((probs @ v).transpose(1, 2).reshape(B, T, D))

    def probabilities(self, scores):
        return scores.softmax(dim=-1)


class CapWithoutDivision(CappedAttention):
    def cap(self, scores):
        return ATTN_CAP * torch.tanh(scores)  # the division by the cap forgotten


class CapAfterSoftmax(CappedAttention):
    def cap(self, scores):
        return scores

    def probabilities(self, scores):
        return ATTN_CAP * torch.tanh(scores.softmax(dim=-1) / ATTN_CAP)  # the probabilities squashed instead


class CappedLM(GemmaLM):
    """Gemma-like (1 + w) RMSNorms and a gated MLP, every attention capped, and the logits capped."""

    def __init__(self, attention=CappedAttention, last=None):
        super().__init__()
        for block in self.blocks:
            block.self_attn = attention()
        if last is not None:
            self.blocks[1].self_attn = last()

    def forward(self, ids):
        logits = super().forward(ids)
        return LOGIT_CAP * torch.tanh(logits / LOGIT_CAP)


def capped_lm(attention=CappedAttention, last=None) -> CappedLM:
    torch.manual_seed(0)
    return CappedLM(attention, last)


# -- Phi-2's parallel block -----------------------------------------------------------------------------------------


class ParallelBlock(TableBlock):
    """One norm; the attention and the feed-forward both read its output, both added to the input."""

    def __init__(self, attention):
        super().__init__(attention)
        del self.ln_2

    def forward(self, x, cos, sin, mask):
        h = self.ln_1(x)
        return x + self.attn(h, cos, sin, mask) + self.mlp(h)


class TwoNormParallelBlock(TableBlock):
    """GPT-NeoX's parallel layer: each sublayer its own norm of the layer's input, both outputs added to it."""

    def forward(self, x, cos, sin, mask):
        return x + self.attn(self.ln_1(x), cos, sin, mask) + self.mlp(self.ln_2(x))


class ParallelLM(TableLM):
    def __init__(self, block=ParallelBlock, last=TableAttention):
        super().__init__()
        self.blocks = nn.ModuleList([block(TableAttention()), block(last())])


def parallel_lm(block=ParallelBlock, last=TableAttention) -> ParallelLM:
    torch.manual_seed(0)
    return ParallelLM(block, last)


# -- GPT-OSS's attention sinks ------------------------------------------------------------------------------------


class SinkAttention(CappedAttention):
    """A learned logit per head joins every softmax's denominator and is dropped after it."""

    def __init__(self, rotary: int = HD):
        super().__init__(rotary)
        self.sinks = nn.Parameter(0.5 * torch.randn(D // HD))

    def cap(self, scores):
        return scores

    def probabilities(self, scores):
        sink = self.sinks.reshape(1, -1, 1, 1).expand(*scores.shape[:3], 1)
        return torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]


class SinkLeftOut(SinkAttention):
    def probabilities(self, scores):
        return scores.softmax(dim=-1)  # the sink parameter kept, but out of the denominator


class SinkLM(TableLM):
    def __init__(self, last=SinkAttention):
        super().__init__()
        self.blocks = nn.ModuleList([TableBlock(SinkAttention()), TableBlock(last())])


def sink_lm(last=SinkAttention) -> SinkLM:
    torch.manual_seed(0)
    return SinkLM(last)


# -- QuickGELU at the wrong constant ---------------------------------------------------------------------------------


class SigmoidGELU(nn.Module):
    """QuickGELU's x * sigmoid(c x), its constant mistyped (1.72 for 1.702)."""

    def forward(self, x):
        return x * torch.sigmoid(1.72 * x)


def quick_gelu_wrong_constant_mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, 4 * D), SigmoidGELU(), nn.Linear(4 * D, D))


# -- a ViT: a model class of its own in the reference ---------------------------------------------------------------


class TinyViT(nn.Module):
    """Patches of 4 x 4 by a strided convolution, a class token, learned positions, pre-norm encoder layers."""

    def __init__(self, image: int = 8, patch: int = 4, classes: int = 5):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, D, kernel_size=patch, stride=patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, D) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, D) * 0.02)
        layer = nn.TransformerEncoderLayer(D, 4, 2 * D, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, classes)

    def forward(self, pixels):
        x = self.patch_embed(pixels).flatten(2).transpose(1, 2)  # (B, N, D)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.encoder(x))[:, 0])


def tiny_vit() -> TinyViT:
    torch.manual_seed(0)
    return TinyViT()


class PatchAttention(nn.Module):
    """Bidirectional multi-head attention over the patch tokens, q, k, v and o each a Linear."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (f(x).view(B, T, -1, HD).transpose(1, 2) for f in (self.q, self.k, self.v))
        probs = self.probabilities(q @ k.transpose(-2, -1) / math.sqrt(HD))
        return self.o((probs @ v).transpose(1, 2).reshape(B, T, D))

    def probabilities(self, scores):
        return scores.softmax(dim=-1)


class PatchAttentionOverQueries(PatchAttention):
    def probabilities(self, scores):
        return scores.softmax(dim=-2)  # normalised over the queries, not the keys


class ViTBlock(nn.Module):
    def __init__(self, attention=PatchAttention):
        super().__init__()
        self.norm1, self.attn, self.norm2 = nn.LayerNorm(D, eps=1e-6), attention(), nn.LayerNorm(D, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class BlockViT(nn.Module):
    """timm's layout written out: its own blocks, the class token and positions as (1, 1, D) and (1, 1 + N, D)
    parameters, the final norm's output returned at every position."""

    def __init__(self, last=PatchAttention, image: int = 8, patch: int = 4):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, D, kernel_size=patch, stride=patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, D) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, D) * 0.02)
        self.blocks = nn.ModuleList([ViTBlock(), ViTBlock(last)])
        self.norm = nn.LayerNorm(D, eps=1e-6)

    def forward(self, pixels):
        x = self.patch_embed(pixels).flatten(2).transpose(1, 2)  # (B, N, D)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


class PositionsFirstViT(BlockViT):
    def forward(self, pixels):
        x = self.patch_embed(pixels).flatten(2).transpose(1, 2)  # (B, N, D)
        x = x + self.pos_embed[:, : x.shape[1]]  # the positions added before the class token is put in front
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


def block_vit(last=PatchAttention) -> BlockViT:
    torch.manual_seed(0)
    return BlockViT(last)


def positions_first_vit() -> BlockViT:
    torch.manual_seed(0)
    return PositionsFirstViT()


# -- CLIP's text tower: QuickGELU, a causal mask, pooled at the end token ------------------------------------------


class QuickGELU(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


class ClipTextBlock(nn.Module):
    def __init__(self, activation=QuickGELU, causal: bool = True):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = TableAttention()
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), activation(), nn.Linear(4 * D, D))
        self.causal = causal

    def forward(self, x, mask):
        T = x.shape[1]
        zeros = torch.zeros(T, HD, dtype=x.dtype)  # no rotation: cos 1, sin 0
        x = x + self.attn(self.ln_1(x), zeros + 1, zeros, mask if self.causal else None)
        return x + self.mlp(self.ln_2(x))


class ClipTextTower(nn.Module):
    """Learned positions, causal pre-norm blocks with QuickGELU, the final norm's output at the end token (the
    largest id) projected: one embedding per sentence."""

    def __init__(self, last=ClipTextBlock, vocab: int = 26, width: int = 16):
        super().__init__()
        self.token_embedding, self.positional_embedding = (
            nn.Embedding(vocab, D),
            nn.Parameter(0.02 * torch.randn(T_MAX, D)),
        )
        self.blocks = nn.ModuleList([ClipTextBlock(), last()])
        self.ln_final = nn.LayerNorm(D)
        self.text_projection = nn.Parameter(torch.randn(D, width) / math.sqrt(D))

    def forward(self, ids):
        T = ids.shape[1]
        x = self.token_embedding(ids) + self.positional_embedding[:T]
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        for block in self.blocks:
            x = block(x, mask)
        x = self.ln_final(x)
        return x[torch.arange(x.shape[0]), ids.argmax(dim=-1)] @ self.text_projection


def clip_text_tower(last=ClipTextBlock) -> ClipTextTower:
    torch.manual_seed(0)
    return ClipTextTower(last)


CASES = [
    ("capped_lm", capped_lm, "transformer_lm", {}, "pass"),
    (
        "capped_lm.cap_without_division",
        lambda: capped_lm(last=CapWithoutDivision),
        "transformer_lm",
        {},
        ("mistake", "attention.softcap_without_division", "blocks.1.self_attn"),
    ),
    (
        "capped_lm.cap_after_softmax",
        lambda: capped_lm(CapAfterSoftmax),
        "transformer_lm",
        {},
        ("mistake", "attention.softcap_after_softmax", "blocks.0.self_attn"),
    ),
    ("parallel_lm", parallel_lm, "transformer_lm", {}, "pass"),
    ("parallel_lm.two_norms", lambda: parallel_lm(TwoNormParallelBlock), "transformer_lm", {}, "pass"),
    (
        "parallel_lm.softmax_wrong_axis_second_block",
        lambda: parallel_lm(last=SoftmaxOverQueries),
        "transformer_lm",
        {},
        ("mistake", "attention.softmax_wrong_axis", "blocks.1.attn"),
    ),
    ("sink_lm", sink_lm, "transformer_lm", {}, "pass"),
    (
        "sink_lm.sink_missing_second_block",
        lambda: sink_lm(SinkLeftOut),
        "transformer_lm",
        {},
        ("mistake", "attention.sink_missing", "blocks.1.attn"),
    ),
    (
        "quick_gelu.wrong_constant",
        quick_gelu_wrong_constant_mlp,
        "feed_forward",
        {},
        ("mistake", "activation.quick_gelu_constant", "1"),
    ),
    ("clip_text_tower", clip_text_tower, "transformer_lm", {}, "pass"),
    (
        "clip_text_tower.quick_gelu_constant_second_block",
        lambda: clip_text_tower(lambda: ClipTextBlock(SigmoidGELU)),
        "transformer_lm",
        {},
        ("mistake", "activation.quick_gelu_constant", "blocks.1.mlp.1"),
    ),
    (
        "clip_text_tower.not_causal_second_block",
        lambda: clip_text_tower(lambda: ClipTextBlock(causal=False)),
        "transformer_lm",
        {},
        ("mistake", "attention.not_causal", "blocks.1.attn"),
    ),
    ("vit", tiny_vit, "transformer_lm", {}, "pass"),
    ("vit.own_blocks", block_vit, "transformer_lm", {}, "pass"),
    (
        "vit.positions_before_class_token",
        positions_first_vit,
        "transformer_lm",
        {},
        ("mistake", "positions.added_before_class_token", "pos_embed"),
    ),
    (
        "vit.softmax_wrong_axis_second_block",
        lambda: block_vit(PatchAttentionOverQueries),
        "transformer_lm",
        {},
        ("mistake", "attention.softmax_wrong_axis", "blocks.1.attn"),
    ),
]
