"""Transformers outside text language models that learners study in 2026, written by hand as a course or a blog
writes them (issue 46, round 35), in this project's own words. The judge meets them here first (measured with the
judge frozen; this corpus is not fixed afterwards: it measures the judge on code no one wrote fixes for).

- a Decision Transformer: three Linear embedders (return-to-go, state, action) and an nn.Embedding of timesteps
  added to each, the three interleaved into one sequence of 3 T tokens by `torch.stack(..., dim=1).permute(0, 2, 1,
  3).reshape(B, 3 * T, D)`, an `embed_ln`, GPT-2 blocks (pre-norm, a fused c_attn, a causal buffer of -inf by
  `masked_fill`), the action head reading the state tokens (`x[:, 1]` after the reshape back);
- a PatchTST-style encoder of a time series: overlapping patches by `x.unfold(-1, patch_len, stride)`, a Linear patch
  embedding W_P, learned positions W_pos (N, D), channel independence (B * C series), post-norm encoder layers of
  W_Q / W_K / W_V, the scale kept as a frozen 0-dim nn.Parameter, a LayerNorm or PatchTST's BatchNorm between two
  transposes, a flatten head (`nn.Flatten(start_dim=-2)` and a Linear of N D numbers to the horizon);
- an ESM-2-style protein LM: a pre-norm BERT, no token types, no position table, rotary positions on the halves,
  the queries scaled before the rotation, `padding_idx=1`, padded rows zeroed after the embedding,
  `emb_layer_norm_after`; with its token dropout, the <mask> rows zeroed and the embeddings multiplied by
  (1 - 0.15 * 0.8) / (1 - the share of <mask> tokens in each sequence), in eval as in training;
- a MusicGen-style decoder over K = 4 codebooks: the rows of four nn.Embedding tables summed, fixed sinusoids (cos
  then sin), pre-norm layers of a causal self-attention (SDPA, no biases), a cross-attention to the text encoder's
  states with a boolean keep mask (skipped when none is given, as unconditional generation does), a GELU MLP, a final
  norm and four lm_heads stacked to (B, K, T, V);
- a DiT block with adaLN-Zero: `adaLN_modulation = Sequential(SiLU, Linear(D, 6 D))` of the conditioning vector c,
  chunked into shift / scale / gate for each sub-layer, `modulate(norm(x), shift, scale) = x (1 + scale) + shift`
  after a LayerNorm without affine, the gate multiplying each branch (the modulation's Linear drawn nonzero, as a
  trained one is: at adaLN-Zero's zero init the block is the identity);
- a LLaVA-style model: a projector MLP (Linear, GELU, Linear) from vision features whose outputs are concatenated
  before the text tokens' embeddings of a small Llama (RMSNorm, GQA, rotary, SwiGLU) that takes `inputs_embeds`;
  `forward(input_ids, image_features=None)`, text alone when no image is given.

Expected verdicts, decided from the math before the judge ran:

- the Decision Transformer's GPT-2 blocks are the reference's decoder-only layer: a pass at decoder_only_layer, and
  its second block's mask applied after the softmax (`softmax(S).masked_fill(future, 0)`, rows not renormalised)
  is attention.mask_after_softmax at `attn`. The whole model given one real call (example=): its front end is three
  Linear embeddings of floats interleaved token by token, which the reference (one sequence of table rows) has no
  pair for: the interleave is its `stack` in the model's own forward, "differs at (the module)". Without the example,
  the forward cannot be called on ids (states, actions, returns and timesteps wanted): "could not judge", naming
  the arguments it lacks (returns_to_go).
- PatchTST's encoder (a module of `layers` taking the patch embeddings) is the reference's encoder stack of
  post-norm layers without a final norm: a pass at encoder_stack, its scale a frozen parameter or a float; its
  second layer's softmax over the queries (dim=-2) is attention.softmax_wrong_axis at `layers.1.self_attn`; its
  BatchNorm (in eval an affine map per feature from the running statistics, which are set off 0 and 1 as a trained
  model's are) normalises nothing over the features: no pair at `layers.0.norm_attn.1`, the BatchNorm1d, naming
  batch_norm. The whole model given a real series: the overlapping patches (stride 4 < patch_len 8) of a 1-D series
  by `unfold` in its forward have no pair (the reference's patches are a ViT's, disjoint, of an image): "differs at
  (the module)", naming unfold.
- ESM-2 without token dropout is a pre-norm encoder with rotary positions and a final norm: a pass at
  encoder_model (the zeroed padded rows change only the padded positions' outputs, which are not compared: their
  keys are hidden from every real query); its second layer's attention not hiding the padding is
  attention.mask_ignored at `layers.1.self_attn`. With its token dropout (ESM-2's checkpoints run it in eval too)
  the embeddings are multiplied by 0.88 / (1 - ratio): a factor of each sequence, no embedding scale of the
  reference (sqrt(D) or none), and the table cannot absorb it (the ratio depends on the sequence): no pair at the
  module whose forward does it, its `mul` (the `masked_fill` before it zeroes the <mask> token's rows, as a table
  whose <mask> row is zero would: a table the reference has).
- the MusicGen decoder layer (causal self-attention, cross-attention on a keep mask, GELU MLP, pre-norm) is the
  reference's decoder layer: a pass at decoder_layer; its self-attention made non-causal (`is_causal=False`) in the
  second layer, judged alone, is attention.not_causal at `self_attn`. The whole decoder given codes (B, K, T): the
  four tables' rows summed per position have no pair (one table in the reference), said at the module naming
  embed_tokens.
- the DiT block given (x, c) by example=: the scale and shift it puts on norm1's output come from c, which the
  reference's encoder layer has no input for: no pair at the block (where modulate is called), naming
  adaLN_modulation.
- the LLaVA model on text alone is the reference's Llama: a pass at transformer_lm; the K/V heads of its second
  layer widened by `.repeat` (tiled) is attention.kv_heads_tiled at `language_model.layers.1.self_attn`; given an
  image too (example=), the projected image tokens are concatenated before the text's: no pair at the module,
  naming cat.

Checked by hand: the DT's masked_fill attention and the ESM rotary attention (q k rotated, then SDPA with the keep
mask) equal SDPA to 2e-16 in float64; the PatchTST attention to 3e-9 (its frozen parameter holds 8^-0.5 rounded to
float32, as PatchTST's own checkpoints hold it: a pass, the reference's scale; a course's copy keeping the scale as
a Python float, `FloatScale`, is the mistake cases' base); the DiT block's output and the LLaVA text positions'
logits depend on c and on the image features (a change of each changes them); ESM-2's token dropout changes the
output (0.22 at most on random ids).

First met: 9 of 19 right. Wrong:

- decision_transformer (example= given): "could not judge: the module's forward could not be recorded on the inputs
  of 'transformer_lm' ... (its forward raised RuntimeError: mat1 and mat2 must have the same dtype, but got Long and
  Float); pass call= ...": the judge's ids put in the example's first float tensor (the states), the example's own
  call never recorded (check/calling.py's example callers substitute the level's data), so the interleave is unread.
- patchtst (example= given): the same kind: "(its forward raised ValueError: not enough values to unpack (expected
  3, got 2)); pass call= ...": (B, T) ids given where the series (B, C, L) was.
- musicgen (example= given): the same kind: "(its forward raised IndexError: index 3 is out of bounds for dimension
  1 with size 3)".
- llava.image (example= given): the same kind: "(its forward raised RuntimeError: mat1 and mat2 must have the same
  dtype, but got Long and Float)": the image features (the example's first float tensor) replaced by ids.
- patchtst_encoder: "differs at layers.0.self_attn: the scores are multiplied by a learned factor of
  layers.0.self_attn.scale (a temperature), which the reference has no pair for": a frozen 0-dim parameter holding
  8^-0.5 (float32) read as a learned temperature, its value and requires_grad=False not read
  (check/unsupported.py's temperature rule).
- patchtst_encoder.float_scale.batch_norm: no id, no op: "unexplained: layers.0 (reference encoder.layers.0)
  diverges with relative error 1.51e+00 ...; not expressible by the config and no catalogue variant reproduces it"
  (BatchNorm1d between transposes, an affine map per feature in eval, not named).
- esm2.token_dropout: no id, no op: "unexplained: embed_tokens (reference encoder.embedding) diverges with relative
  error 1.20e-01 (its output is the reference's times 0.88); not expressible by the config ...": the factor
  measured, the mul that makes it not said as math the reference lacks.
- musicgen.layer and musicgen.layer.not_causal_second_layer: "could not judge: ... (the module's forward takes
  ['hidden_states'] positionally (without defaults), but the reference 'decoder_layer' gives ['x', 'memory']: pass
  call=lambda module, ... to adapt it)": the memory's parameter `encoder_hidden_states=None` (a default) not taken
  as the memory's slot (check/calling.py), so the not-causal mistake is never reached.
- dit_block: "differs at norm1: layer_norm(x) normalises without a weight (no learned scale), which the reference
  has no pair for": a no pair (the project's rule on weightless norms), but at the LayerNorm whose gain and shift are
  the modulation's 1 + scale and shift from c; adaLN_modulation, the conditioning, not named.

Fixed since: all 19 right. Where an example is given and the level's probe cannot be put in the place of its inputs,
the judge records the example's own call and reads what the model computes there: tensors embedded from separate
inputs joined by `stack` or `cat`, the rows of several token tables of one shape summed, and `unfold` cutting the
input itself into overlapping windows are said where they run. A parameter with a default takes a slot the level
gives (the memory of a decoder layer). Frozen float32 scalars equal to a square root of d_model or d_head (or its
inverse) to float32 precision are the scale, overwritten with the exact value; `batch_norm` is said where it runs; a
number the embeddings are multiplied by is read past a `masked_fill`; a norm without a weight whose output is scaled
by a projection's output is said as that modulation, where the product is taken.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

D, H, V, T_MAX = 32, 4, 26, 16
HD = D // H
KV = 2
STATE, ACT, EPISODE = 5, 3, 20  # the Decision Transformer's sizes
SERIES, PATCH, STRIDE, HORIZON, CHANNELS = 32, 8, 4, 6, 3  # PatchTST's
N_PATCHES = (SERIES - PATCH) // STRIDE + 1
K_BOOKS = 4  # MusicGen's codebooks
VISION, N_IMAGE = 24, 4  # LLaVA's vision features and image tokens


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases moved off their 1s and 0s, so that a trained model's values are checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


# -- a Decision Transformer: (R, s, a) interleaved, GPT-2 blocks, the action read from the state tokens -------------


class DTSelfAttention(nn.Module):
    """GPT-2's attention over the interleaved tokens: a fused c_attn, scores masked by a lower-triangular buffer.
    `after_softmax`: the mistake, the future zeroed after the softmax (rows no longer sum to 1)."""

    after_softmax = False

    def __init__(self, n_positions: int = 3 * T_MAX) -> None:
        super().__init__()
        self.c_attn = nn.Linear(D, 3 * D)
        self.c_proj = nn.Linear(D, D)
        self.register_buffer("bias", torch.tril(torch.ones(n_positions, n_positions, dtype=torch.bool)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.c_attn(x).split(D, dim=2)
        q, k, v = (t.view(B, T, H, HD).transpose(1, 2) for t in (q, k, v))
        att = q @ k.transpose(-2, -1) / math.sqrt(HD)
        future = ~self.bias[:T, :T]
        if self.after_softmax:
            att = F.softmax(att, dim=-1).masked_fill(future, 0.0)
        else:
            att = F.softmax(att.masked_fill(future, float("-inf")), dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(B, T, D))


class MaskAfterSoftmax(DTSelfAttention):
    after_softmax = True


class DTBlock(nn.Module):
    def __init__(self, attention: type[nn.Module] = DTSelfAttention) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(D)
        self.attn = attention()
        self.ln_2 = nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class DecisionTransformer(nn.Module):
    def __init__(self, second: type[nn.Module] = DTSelfAttention) -> None:
        super().__init__()
        self.embed_timestep = nn.Embedding(EPISODE, D)
        self.embed_return = nn.Linear(1, D)
        self.embed_state = nn.Linear(STATE, D)
        self.embed_action = nn.Linear(ACT, D)
        self.embed_ln = nn.LayerNorm(D)
        self.blocks = nn.ModuleList([DTBlock(), DTBlock(second)])
        self.ln_f = nn.LayerNorm(D)
        self.predict_action = nn.Sequential(nn.Linear(D, ACT), nn.Tanh())

    def forward(
        self, states: torch.Tensor, actions: torch.Tensor, returns_to_go: torch.Tensor, timesteps: torch.Tensor
    ) -> torch.Tensor:
        B, T = states.shape[:2]
        time = self.embed_timestep(timesteps)
        r = self.embed_return(returns_to_go) + time
        s = self.embed_state(states) + time
        a = self.embed_action(actions) + time
        x = torch.stack((r, s, a), dim=1).permute(0, 2, 1, 3).reshape(B, 3 * T, D)  # R_1, s_1, a_1, R_2, ...
        x = self.embed_ln(x)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x).reshape(B, T, 3, D).permute(0, 2, 1, 3)
        return self.predict_action(x[:, 1])  # each action predicted from its state's token


def decision_transformer(second: type[nn.Module] = DTSelfAttention) -> DecisionTransformer:
    torch.manual_seed(0)
    return _jitter(DecisionTransformer(second))  # type: ignore[return-value]


def dt_block(second: bool = False) -> nn.Module:
    """A block of the Decision Transformer: the first, or the second with the mask after the softmax."""
    model = decision_transformer(MaskAfterSoftmax if second else DTSelfAttention)
    return model.blocks[1 if second else 0]


def dt_example() -> tuple:
    """One real call: a batch of 2 trajectories of 5 steps."""
    g = torch.Generator().manual_seed(1)
    B, T = 2, 5
    states, actions = torch.randn(B, T, STATE, generator=g), torch.randn(B, T, ACT, generator=g).tanh()
    returns = torch.rand(B, T, 1, generator=g) * 10
    return (states, actions, returns, torch.arange(T).repeat(B, 1)), {}


# -- PatchTST: overlapping patches by unfold, post-norm encoder layers, a flatten head -----------------------------


class Transpose(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2)


class TSTAttention(nn.Module):
    """W_Q, W_K, W_V and to_out; the scale a frozen 0-dim parameter (PatchTST's learnable-scale option off).
    `axis`: the softmax's axis (-2: the mistake, over the queries)."""

    axis = -1

    def __init__(self) -> None:
        super().__init__()
        self.W_Q, self.W_K, self.W_V = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.to_out = nn.Linear(D, D)
        self.scale = nn.Parameter(torch.tensor(HD**-0.5), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, _ = x.shape
        q = self.W_Q(x).view(B, N, H, HD).transpose(1, 2)
        k = self.W_K(x).view(B, N, H, HD).permute(0, 2, 3, 1)  # (B, H, HD, N): ready for q @ k
        v = self.W_V(x).view(B, N, H, HD).transpose(1, 2)
        weights = F.softmax(torch.matmul(q, k) * self.scale, dim=self.axis)
        return self.to_out(torch.matmul(weights, v).transpose(1, 2).contiguous().view(B, N, D))


class FloatScale(TSTAttention):
    """A course's copy: the same scale kept as a Python float."""

    def __init__(self) -> None:
        super().__init__()
        del self.scale
        self.scale = HD**-0.5


class SoftmaxOverQueries(FloatScale):
    axis = -2


def _norm(batch: bool) -> nn.Module:
    return nn.Sequential(Transpose(), nn.BatchNorm1d(D), Transpose()) if batch else nn.LayerNorm(D)


class TSTEncoderLayer(nn.Module):
    def __init__(self, attention: type[nn.Module] = TSTAttention, batch_norm: bool = False) -> None:
        super().__init__()
        self.self_attn = attention()
        self.dropout_attn = nn.Dropout(0.1)
        self.norm_attn = _norm(batch_norm)
        self.ff = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Dropout(0.1), nn.Linear(2 * D, D))
        self.dropout_ffn = nn.Dropout(0.1)
        self.norm_ffn = _norm(batch_norm)

    def forward(self, src: torch.Tensor) -> torch.Tensor:
        src = self.norm_attn(src + self.dropout_attn(self.self_attn(src)))
        return self.norm_ffn(src + self.dropout_ffn(self.ff(src)))


class TSTEncoder(nn.Module):
    def __init__(
        self, first: type[nn.Module] = TSTAttention, second: type[nn.Module] | None = None, batch_norm: bool = False
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList([TSTEncoderLayer(first, batch_norm), TSTEncoderLayer(second or first, batch_norm)])

    def forward(self, src: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            src = layer(src)
        return src


class PatchTST(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.W_P = nn.Linear(PATCH, D)
        self.W_pos = nn.Parameter(torch.empty(N_PATCHES, D).uniform_(-0.02, 0.02))
        self.dropout = nn.Dropout(0.1)
        self.encoder = TSTEncoder()
        self.head = nn.Sequential(nn.Flatten(start_dim=-2), nn.Linear(N_PATCHES * D, HORIZON))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, C, L) -> (B, C, HORIZON), each channel its own series."""
        B, C, _ = x.shape
        z = x.unfold(dimension=-1, size=PATCH, step=STRIDE)  # (B, C, N, PATCH), patches overlapping
        z = self.W_P(z).reshape(B * C, N_PATCHES, D)
        z = self.encoder(self.dropout(z + self.W_pos))
        return self.head(z.reshape(B, C, N_PATCHES, D))


def _trained_statistics(model: nn.Module) -> nn.Module:
    """BatchNorm's running statistics set as a trained model's (off 0 and 1)."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm1d):
            m.running_mean.copy_(0.3 * torch.randn(D))
            m.running_var.copy_(0.5 + torch.rand(D))
    return model


def patchtst_encoder(
    first: type[nn.Module] = TSTAttention, second: type[nn.Module] | None = None, batch_norm: bool = False
) -> TSTEncoder:
    torch.manual_seed(0)
    return _trained_statistics(_jitter(TSTEncoder(first, second, batch_norm)))  # type: ignore[return-value]


def patchtst() -> PatchTST:
    torch.manual_seed(0)
    return _jitter(PatchTST())  # type: ignore[return-value]


def series_example() -> tuple:
    return (torch.randn(2, CHANNELS, SERIES, generator=torch.Generator().manual_seed(1)),), {}


# -- ESM-2: a pre-norm BERT with rotary positions, no token types, its token dropout --------------------------------

PAD, MASK = 1, V - 1


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class ESMRotary(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, HD, 2).float() / HD), persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = torch.arange(q.shape[-2], dtype=self.inv_freq.dtype)
        emb = torch.cat([torch.outer(t, self.inv_freq)] * 2, dim=-1).to(q.dtype)
        cos, sin = emb.cos(), emb.sin()
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class ESMAttention(nn.Module):
    """q scaled by head_dim^-0.5 before the rotation; `hides_padding`: False is the mistake (padding read)."""

    hides_padding = True

    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.out_proj = nn.Linear(D, D)
        self.rot_emb = ESMRotary()

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None) -> torch.Tensor:
        B, T, _ = x.shape
        q = (self.q_proj(x) * HD**-0.5).view(B, T, H, HD).transpose(1, 2)
        k = self.k_proj(x).view(B, T, H, HD).transpose(1, 2)
        v = self.v_proj(x).view(B, T, H, HD).transpose(1, 2)
        q, k = self.rot_emb(q, k)
        scores = q @ k.transpose(-1, -2)
        if padding_mask is not None and self.hides_padding:
            scores = scores.masked_fill(padding_mask[:, None, None, :], float("-inf"))
        return self.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D))


class PaddingRead(ESMAttention):
    hides_padding = False


class ESMLayer(nn.Module):
    def __init__(self, attention: type[nn.Module] = ESMAttention) -> None:
        super().__init__()
        self.self_attn_layer_norm = nn.LayerNorm(D)
        self.self_attn = attention()
        self.final_layer_norm = nn.LayerNorm(D)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), padding_mask)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class ESM2(nn.Module):
    def __init__(self, second: type[nn.Module] = ESMAttention, token_dropout: bool = False) -> None:
        super().__init__()
        self.token_dropout = token_dropout
        self.embed_tokens = nn.Embedding(V, D, padding_idx=PAD)
        self.layers = nn.ModuleList([ESMLayer(), ESMLayer(second)])
        self.emb_layer_norm_after = nn.LayerNorm(D)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        padding_mask = tokens.eq(PAD)
        x = self.embed_tokens(tokens)
        if self.token_dropout:  # ESM-2's: <mask> rows zeroed, the rest rescaled to the share masked in training
            x = x.masked_fill((tokens == MASK).unsqueeze(-1), 0.0)
            mask_ratio_train = 0.15 * 0.8
            src_lengths = (~padding_mask).sum(-1)
            mask_ratio_observed = (tokens == MASK).sum(-1).to(x.dtype) / src_lengths
            x = x * (1 - mask_ratio_train) / (1 - mask_ratio_observed)[:, None, None]
        x = x * (1 - padding_mask.unsqueeze(-1).type_as(x))
        mask = padding_mask if padding_mask.any() else None
        for layer in self.layers:
            x = layer(x, mask)
        return self.emb_layer_norm_after(x)


def esm2(second: type[nn.Module] = ESMAttention, token_dropout: bool = False) -> ESM2:
    torch.manual_seed(0)
    return _jitter(ESM2(second, token_dropout))  # type: ignore[return-value]


# -- MusicGen: K codebooks summed, causal self-attention, cross-attention to the text, K heads out ------------------


class MGAttention(nn.Module):
    """No biases; self-attention causal by SDPA's is_causal (`causal`: False is the mistake), or a
    cross-attention on the text's states with a boolean keep mask (B, S)."""

    causal = True

    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj = nn.Linear(D, D, bias=False), nn.Linear(D, D, bias=False)
        self.v_proj, self.out_proj = nn.Linear(D, D, bias=False), nn.Linear(D, D, bias=False)

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor | None = None, keep: torch.Tensor | None = None
    ) -> torch.Tensor:
        B, T, _ = x.shape
        source = x if memory is None else memory

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(B, -1, H, HD).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(source)), heads(self.v_proj(source))
        if memory is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        else:
            mask = None if keep is None else keep[:, None, None, :].bool()
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, D))


class MGNotCausal(MGAttention):
    causal = False


class MusicGenLayer(nn.Module):
    def __init__(self, attention: type[nn.Module] = MGAttention) -> None:
        super().__init__()
        self.self_attn_layer_norm = nn.LayerNorm(D)
        self.self_attn = attention()
        self.encoder_attn_layer_norm = nn.LayerNorm(D)
        self.encoder_attn = MGAttention()
        self.final_layer_norm = nn.LayerNorm(D)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D, bias=False), nn.Linear(4 * D, D, bias=False)

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = hidden_states + self.self_attn(self.self_attn_layer_norm(hidden_states))
        if encoder_hidden_states is not None:
            x = x + self.encoder_attn(self.encoder_attn_layer_norm(x), encoder_hidden_states, encoder_attention_mask)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


def _sinusoids(n: int) -> torch.Tensor:
    """MusicGen's table: cosines then sines."""
    inv = torch.exp(torch.arange(D // 2, dtype=torch.float32) * -(math.log(10000.0) / (D // 2 - 1)))
    angles = torch.arange(n, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=1)


class MusicGenDecoder(nn.Module):
    def __init__(self, second: type[nn.Module] = MGAttention) -> None:
        super().__init__()
        self.embed_tokens = nn.ModuleList([nn.Embedding(V + 1, D) for _ in range(K_BOOKS)])  # + 1: the pad code
        self.register_buffer("embed_positions", _sinusoids(T_MAX), persistent=False)
        self.layers = nn.ModuleList([MusicGenLayer(), MusicGenLayer(second)])
        self.layer_norm = nn.LayerNorm(D)
        self.lm_heads = nn.ModuleList([nn.Linear(D, V, bias=False) for _ in range(K_BOOKS)])

    def forward(self, codes: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None) -> torch.Tensor:
        """codes (B, K, T) -> logits (B, K, T, V)."""
        x = sum(table(codes[:, k]) for k, table in enumerate(self.embed_tokens))
        x = x + self.embed_positions[: codes.shape[-1]]
        for layer in self.layers:
            x = layer(x, encoder_hidden_states)
        x = self.layer_norm(x)
        return torch.stack([head(x) for head in self.lm_heads], dim=1)


def musicgen(second: type[nn.Module] = MGAttention) -> MusicGenDecoder:
    torch.manual_seed(0)
    return _jitter(MusicGenDecoder(second))  # type: ignore[return-value]


def musicgen_layer(second: bool = False) -> nn.Module:
    model = musicgen(MGNotCausal if second else MGAttention)
    return model.layers[1 if second else 0]


def codes_example() -> tuple:
    return (torch.randint(0, V, (2, K_BOOKS, 6), generator=torch.Generator().manual_seed(1)),), {}


# -- a DiT block with adaLN-Zero modulation ----------------------------------------------------------------------


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class DiTAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, _ = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, H, HD).permute(2, 0, 3, 1, 4).unbind(0)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, D))


class DiTBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)
        self.attn = DiTAttention()
        self.norm2 = nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(approximate="tanh"), nn.Linear(4 * D, D))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(D, 6 * D))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))
        return x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))


def dit_block() -> DiTBlock:
    torch.manual_seed(0)
    return _jitter(DiTBlock())  # type: ignore[return-value]


def dit_example() -> tuple:
    g = torch.Generator().manual_seed(1)
    return (torch.randn(2, 6, D, generator=g), torch.randn(2, D, generator=g)), {}


# -- LLaVA: projected image features concatenated before a small Llama's text tokens ------------------------------


class LlamaAttention(nn.Module):
    """GQA, rotary on the halves, SDPA causal; `tiled`: the mistake, K/V heads widened by .repeat (head h reads
    K/V head h % KV)."""

    tiled = False

    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(D, D, bias=False)
        self.k_proj, self.v_proj = nn.Linear(D, KV * HD, bias=False), nn.Linear(D, KV * HD, bias=False)
        self.o_proj = nn.Linear(D, D, bias=False)
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, HD, 2).float() / HD), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, H, HD).transpose(1, 2)
        k = self.k_proj(x).view(B, T, KV, HD).transpose(1, 2)
        v = self.v_proj(x).view(B, T, KV, HD).transpose(1, 2)
        angles = torch.outer(torch.arange(T, dtype=x.dtype), self.inv_freq.to(x.dtype))
        cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if self.tiled:
            k, v = k.repeat(1, H // KV, 1, 1), v.repeat(1, H // KV, 1, 1)
        else:
            k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, D))


class TiledKV(LlamaAttention):
    tiled = True


class LlamaLayer(nn.Module):
    def __init__(self, attention: type[nn.Module] = LlamaAttention) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(D, eps=1e-6)
        self.self_attn = attention()
        self.post_attention_layernorm = nn.RMSNorm(D, eps=1e-6)
        self.gate_proj, self.up_proj = nn.Linear(D, 64, bias=False), nn.Linear(D, 64, bias=False)
        self.down_proj = nn.Linear(64, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class TinyLlama(nn.Module):
    def __init__(self, second: type[nn.Module] = LlamaAttention) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([LlamaLayer(), LlamaLayer(second)])
        self.norm = nn.RMSNorm(D, eps=1e-6)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, inputs_embeds: torch.Tensor) -> torch.Tensor:
        x = inputs_embeds
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


class Llava(nn.Module):
    def __init__(self, second: type[nn.Module] = LlamaAttention) -> None:
        super().__init__()
        self.multi_modal_projector = nn.Sequential(nn.Linear(VISION, D), nn.GELU(), nn.Linear(D, D))
        self.language_model = TinyLlama(second)

    def forward(self, input_ids: torch.Tensor, image_features: torch.Tensor | None = None) -> torch.Tensor:
        x = self.language_model.embed_tokens(input_ids)
        if image_features is not None:  # the image's tokens first, then the text's
            x = torch.cat([self.multi_modal_projector(image_features), x], dim=1)
        return self.language_model(inputs_embeds=x)


def llava(second: type[nn.Module] = LlamaAttention) -> Llava:
    torch.manual_seed(0)
    return _jitter(Llava(second))  # type: ignore[return-value]


def llava_example() -> tuple:
    g = torch.Generator().manual_seed(1)
    return (torch.randint(0, V, (2, 6), generator=g), torch.randn(2, N_IMAGE, VISION, generator=g)), {}


CASES = [
    ("decision_transformer.block", dt_block, "decoder_only_layer", {}, "pass"),
    (
        "decision_transformer.block.mask_after_softmax_second_block",
        lambda: dt_block(second=True),
        "decoder_only_layer",
        {},
        ("mistake", "attention.mask_after_softmax", "attn"),
    ),
    (
        "decision_transformer",
        decision_transformer,
        "transformer_lm",
        {"example": dt_example()},
        ("no pair", "", "stack"),
    ),
    (
        "decision_transformer.no_example",
        decision_transformer,
        "transformer_lm",
        {},
        ("could not judge", None, "returns_to_go"),
    ),
    ("patchtst_encoder", patchtst_encoder, "encoder_stack", {}, "pass"),
    ("patchtst_encoder.float_scale", lambda: patchtst_encoder(FloatScale), "encoder_stack", {}, "pass"),
    (
        "patchtst_encoder.float_scale.softmax_over_queries_second_layer",
        lambda: patchtst_encoder(FloatScale, SoftmaxOverQueries),
        "encoder_stack",
        {},
        ("mistake", "attention.softmax_wrong_axis", "layers.1.self_attn"),
    ),
    (
        "patchtst_encoder.float_scale.batch_norm",
        lambda: patchtst_encoder(FloatScale, batch_norm=True),
        "encoder_stack",
        {},
        ("no pair", "layers.0.norm_attn.1", "batch_norm"),
    ),
    ("patchtst", patchtst, "encoder_model", {"example": series_example()}, ("no pair", "", "unfold")),
    ("esm2", esm2, "encoder_model", {}, "pass"),
    (
        "esm2.padding_not_masked_second_layer",
        lambda: esm2(PaddingRead),
        "encoder_model",
        {},
        ("mistake", "attention.mask_ignored", "layers.1.self_attn"),
    ),
    ("esm2.token_dropout", lambda: esm2(token_dropout=True), "encoder_model", {}, ("no pair", "", "mul")),
    ("musicgen.layer", musicgen_layer, "decoder_layer", {}, "pass"),
    (
        "musicgen.layer.not_causal_second_layer",
        lambda: musicgen_layer(second=True),
        "decoder_layer",
        {},
        ("mistake", "attention.not_causal", "self_attn"),
    ),
    (
        "musicgen",
        musicgen,
        "transformer_lm",
        {"example": codes_example()},
        ("no pair", "", "embed_tokens"),
    ),
    ("dit_block", dit_block, "encoder_layer", {"example": dit_example()}, ("no pair", "", "adaLN_modulation")),
    ("llava", llava, "transformer_lm", {}, "pass"),
    (
        "llava.kv_heads_tiled_second_layer",
        lambda: llava(TiledKV),
        "transformer_lm",
        {},
        ("mistake", "attention.kv_heads_tiled", "language_model.layers.1.self_attn"),
    ),
    ("llava.image", llava, "transformer_lm", {"example": llava_example()}, ("no pair", "", "cat")),
]
