"""Transformers in other domains as 2025-26 learners write them by hand from the papers (issue 46, round 56), in
this project's own words. The judge meets them here first (measured with the judge frozen).

- an FT-Transformer (Gorishniy et al. 2021) as rtdl writes it: a feature tokenizer (numeric column j to
  ``weight[j] x_j + bias[j]``, categorical columns through one table of offset ids plus a bias per column, the CLS
  token appended last), pre-LN layers of ``W_q`` / ``W_k`` / ``W_v`` / ``W_out`` and a ReGLU feed-forward (one
  Linear chunked in two, ``a relu(b)``), the paper's first layer with its attention norm removed (``nn.Identity``),
  the head's LayerNorm closing the backbone; the layer alone, the backbone (its layers and last norm) with and
  without the removed norm, the whole model on ``(x_num, x_cat)``;
- a TabTransformer (Huang et al. 2020): one table of every column's values read at ``x_categ +
  categories_offset``, a post-norm encoder over the categorical columns only, its output flattened and joined to
  the LayerNorm-ed numeric features, an MLP on top; the encoder alone and the whole model;
- a Graphormer (Ying et al. 2021): atom and degree embeddings summed, pre-LN layers whose scores get
  ``spatial_pos_encoder(spatial_pos)`` (one learned scalar per shortest-path distance and head) added; the whole
  model on ``(node_type, degree, spatial_pos)``, the same without the spatial bias (degrees only), and without an
  example;
- HuBERT's position convolution: a grouped ``Conv1d`` (kernel 8, 4 groups) under ``weight_norm(dim=2)``, the last
  frame dropped (even kernel), GELU, added to the features, a LayerNorm, post-norm layers;
- a BEiT layer: a ``relative_position_bias_table`` of (2 G - 1)^2 + 3 rows per head read at BEiT's index over the
  3 x 3 patch grid and the class token, added to the scores;
- a Q-Former (BLIP-2): post-norm layers of a bidirectional self-attention over the queries, a cross-attention to
  the image features and a GELU feed-forward; a layer alone, and the stack of 8 learned ``query_tokens``;
- an MAE: the encoder (Conv2d patches, fixed 2D sin-cos table with a zero row for the CLS, the patches at a fixed
  ``keep`` index gathered, pre-LN blocks) and its decoder (``decoder_embed``, a learned ``mask_token`` put back at
  a fixed ``ids_restore``, the table, two blocks, a norm and the pixel head);
- mistakes, each in the second layer of a correct model: the softmax over the queries (the FT-Transformer's
  backbone with every norm, the Graphormer layer), scale 1 / d_head (the TabTransformer's encoder, the degrees-only
  Graphormer).

Expected verdicts decided from the math. The attention equals a head-by-head rewrite to 1e-16 in float64, the
FT-Transformer's first layer and the Graphormer to 4e-16 and 0 against a plain rewrite; BEiT's index equals ``(dy + G -
1)(2 G - 1) + dx + G - 1`` on the grid; the decoder's ``ids_restore`` puts the kept tokens back at 0, 2, 5, 7. A pre-LN
layer without its attention norm is ``x + attn(x)``: the reference's first encoder layer computes it with
``first_attn_norm=False`` (ModernBERT's), so the first layer alone and the backbone are passes (first written as no pair
at the attention, put right after the run: that setting was missed). The Graphormer's degree table is the reference's
token-type table read at the degrees (BERT's ``token_type_embedding``), with no position table: that part has a pair, so
the degrees-only Graphormer is a pass, and the full one differs first at its spatial bias: a learned scalar per head
indexed by the graph's shortest-path distance is none of the reference's relative schemes (T5's buckets and ALiBi are
functions of i - j, the distance here is not): no pair at the attention. BEiT's 2D table is not a function of i - j in
one dimension either: no pair at the attention. The Q-Former's self-attention is bidirectional by design, but judged as
a ``decoder_layer`` it computes exactly the reference's decoder layer with its causal mask left off, which the judge
cannot tell from the mistake (fresh6's hand_bart.decoder_layer.not_causal expects that id of the same math):
``attention.not_causal`` at the attention (first written as no pair, changed by the maintainer after the run for that
reason). The TabTransformer's ``ids + offset`` reads a row per (column, value), which a token table plus a position
table cannot (no pair at the module). The MAE's ``keep`` gathers a subset of positions (no pair at the module); its
decoder first projects its input by ``decoder_embed`` (no pair there: first written as "mask_token at the module", put
right after the run, the judge having read the order right).

First met: 14 of 20 right (f56_qformer.layer counted right, see above). Wrong:

- f56_ft.first_block: "could not judge: found 1 norms in the module, the reference 'encoder_layer' has 2; pass
  mapping=" (a layer of one norm fewer is math, not a missing map).
- f56_ft.backbone: FAILED with no id and no op ("unexplained: (the module): d encoder.layers.1.ffn_norm.bias
  diverges"): the removed norm mapped onto the reference's pre-LN stack and never named.
- f56_tab: no pair at mlp.1, "relu(x) where the others compute gelu(x)": the right class, past the first
  departure (the offset ids into one table, then the flatten and concatenation).
- f56_graphormer.degrees_only and its wrong_scale_second_layer twin: FAILED with no id and no op; the degree
  table is not mapped to the token types (``degree_encoder`` left out of the map, positional assumed sinusoidal).
- f56_mae.encoder: "could not judge: the module's forward could not be recorded on the inputs of
  'transformer_lm' ... (its forward raised RuntimeError: Input type (long int) and bias type (float) should be the
  same)" though the image example was passed.

Fixed since: the first encoder layer's attention reading the stream itself is read at the layer and stack
levels as at a model's (``first_attn_norm=False``, one norm fewer, shown in the config; the reference's stack hands
each layer its index); a table read at the ids plus an offset per position (``categories_offset``) is said at the
add; the states read at fewer positions than they hold by an index tensor (``x[:, keep]``) are said where they are
read, on the example's own call. A second table read at ids of another input (the Graphormer's degrees) is the
token-type table, the ids it read carried to the reference's ``token_type_ids``; a model whose example pads nothing
and passes no mask, and whose forward masks no pad id, is probed without padding (its ``padding_idx`` kept).

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

D, H = 32, 4
HD = D // H
N_NUM, CARDS = 3, (4, 5)  # the FT-Transformer's numeric columns and categorical cardinalities
TAB_COLS, TAB_CARD = 5, 6  # TabTransformer's categorical columns, each of 6 values
ATOMS, NODES, MAX_DEG, MAX_DIST = 10, 6, 5, 6  # the Graphormer's
CONV_K, CONV_G = 8, 4  # HuBERT's positional convolution: kernel and groups


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases moved off their 1s and 0s, so that a trained model's values are checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _heads(x: torch.Tensor) -> torch.Tensor:
    B, T, _ = x.shape
    return x.view(B, T, H, HD).transpose(1, 2)


class Attention(nn.Module):
    """rtdl's MultiheadAttention as the FT-Transformer paper's code has it: W_q, W_k, W_v, W_out, scores by matmul;
    `bias` (B, H, T, T) added to the scores when given (the Graphormer's spatial encoding, BEiT's relative position
    bias). `mistake`: "wrong_scale" (scores divided by the head size), "softmax_over_queries" (softmax along dim
    -2)."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.W_q, self.W_k, self.W_v, self.W_out = (nn.Linear(D, D) for _ in range(4))
        self.mistake = mistake

    def forward(self, x_q: torch.Tensor, x_kv: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = _heads(self.W_q(x_q)), _heads(self.W_k(x_kv)), _heads(self.W_v(x_kv))
        scale = HD if self.mistake == "wrong_scale" else math.sqrt(HD)
        scores = q @ k.transpose(-1, -2) / scale
        if bias is not None:
            scores = scores + bias
        attn = scores.softmax(dim=-2 if self.mistake == "softmax_over_queries" else -1)
        B, _, T, _ = q.shape
        return self.W_out((attn @ v).transpose(1, 2).reshape(B, T, D))


def plain_attention(m: Attention, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The same attention written head by head, for the float64 check of the factories' models."""
    q, k, v = m.W_q(x), m.W_k(x), m.W_v(x)
    outs = []
    for h in range(H):
        s = slice(h * HD, (h + 1) * HD)
        sc = torch.einsum("btd,bsd->bts", q[..., s], k[..., s]) / math.sqrt(HD)
        sc = sc if bias is None else sc + bias[:, h]
        outs.append(torch.softmax(sc, -1) @ v[..., s])
    return m.W_out(torch.cat(outs, -1))


# -- FT-Transformer (Gorishniy et al. 2021): feature tokenizer, CLS, pre-LN, the first attention norm removed -----


class ReGLU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=-1)
        return a * F.relu(b)


class FTBlock(nn.Module):
    """Pre-LN: x + attention(norm(x)), x + ffn(norm(x)), the FFN of ReGLU; `first`: the paper's first layer, whose
    attention norm is removed (nn.Identity, as rtdl's `prenormalization` with the first layer's norm skipped)."""

    def __init__(self, first: bool = False, mistake: str = "") -> None:
        super().__init__()
        self.attention_normalization = nn.Identity() if first else nn.LayerNorm(D)
        self.attention = Attention(mistake)
        self.ffn_normalization = nn.LayerNorm(D)
        self.ffn = nn.Sequential(nn.Linear(D, 2 * 2 * D), ReGLU(), nn.Dropout(0.1), nn.Linear(2 * D, D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attention_normalization(x)
        x = x + self.attention(h, h)
        return x + self.ffn(self.ffn_normalization(x))


class FTBackbone(nn.Module):
    """The layers and the head's LayerNorm (the last norm of a pre-LN stack)."""

    def __init__(self, remove_first_norm: bool = True, mistake: str = "") -> None:
        super().__init__()
        self.layers = nn.ModuleList([FTBlock(first=remove_first_norm), FTBlock(mistake=mistake)])
        self.normalization = nn.LayerNorm(D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.normalization(x)


class FeatureTokenizer(nn.Module):
    """Numeric column j -> weight[j] * x_j + bias[j]; categorical column -> its embedding row plus a bias per column;
    the CLS token appended at the end (rtdl's `CLSToken`)."""

    def __init__(self) -> None:
        super().__init__()
        self.num_weight = nn.Parameter(torch.randn(N_NUM, D) / math.sqrt(D))
        self.num_bias = nn.Parameter(torch.randn(N_NUM, D) / math.sqrt(D))
        self.register_buffer("category_offsets", torch.tensor([0, *CARDS[:-1]]).cumsum(0), persistent=False)
        self.cat_embeddings = nn.Embedding(sum(CARDS), D)
        self.cat_bias = nn.Parameter(torch.randn(len(CARDS), D) / math.sqrt(D))
        self.cls = nn.Parameter(torch.randn(D) / math.sqrt(D))

    def forward(self, x_num: torch.Tensor, x_cat: torch.Tensor) -> torch.Tensor:
        num = self.num_weight[None] * x_num[..., None] + self.num_bias[None]
        cat = self.cat_embeddings(x_cat + self.category_offsets[None]) + self.cat_bias[None]
        x = torch.cat([num, cat], dim=1)
        return torch.cat([x, self.cls.expand(len(x), 1, D)], dim=1)


class FTTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.feature_tokenizer = FeatureTokenizer()
        self.backbone = FTBackbone()
        self.head = nn.Linear(D, 1)

    def forward(self, x_num: torch.Tensor, x_cat: torch.Tensor) -> torch.Tensor:
        x = self.backbone(self.feature_tokenizer(x_num, x_cat))
        return self.head(F.relu(x[:, -1]))


def ft_block(first: bool = False) -> FTBlock:
    torch.manual_seed(0)
    return _jitter(FTBlock(first=first)).eval()  # type: ignore[return-value]


def ft_backbone(remove_first_norm: bool = True, mistake: str = "") -> FTBackbone:
    torch.manual_seed(0)
    return _jitter(FTBackbone(remove_first_norm, mistake)).eval()  # type: ignore[return-value]


def ft_transformer() -> FTTransformer:
    torch.manual_seed(0)
    return _jitter(FTTransformer()).eval()  # type: ignore[return-value]


def ft_example() -> tuple:
    g = torch.Generator().manual_seed(1)
    x_cat = torch.stack([torch.randint(0, c, (2,), generator=g) for c in CARDS], 1)
    return (torch.randn(2, N_NUM, generator=g), x_cat), {}


# -- TabTransformer (Huang et al. 2020): a post-norm encoder over the categorical columns' embeddings only ----------


class TabLayer(nn.Module):
    """Post-norm: norm(x + attn(x)), norm(x + ff(x)), the feed-forward of GELU."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.attn = Attention(mistake)
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.ff = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attn(x, x))
        return self.norm2(x + self.ff(x))


class TabEncoder(nn.Module):
    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.layers = nn.ModuleList([TabLayer(), TabLayer(mistake)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class TabTransformer(nn.Module):
    """One table of every column's values, ids offset by column (lucidrains' `categories_offset`); the contextual
    embeddings flattened and joined to the LayerNorm-ed numeric features, an MLP on top."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("categories_offset", torch.arange(TAB_COLS) * TAB_CARD, persistent=False)
        self.category_embed = nn.Embedding(TAB_COLS * TAB_CARD, D)
        self.transformer = TabEncoder()
        self.norm = nn.LayerNorm(N_NUM)
        self.mlp = nn.Sequential(nn.Linear(TAB_COLS * D + N_NUM, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x_categ: torch.Tensor, x_cont: torch.Tensor) -> torch.Tensor:
        x = self.transformer(self.category_embed(x_categ + self.categories_offset))
        return self.mlp(torch.cat([x.flatten(1), self.norm(x_cont)], dim=-1))


def tab_encoder(mistake: str = "") -> TabEncoder:
    torch.manual_seed(0)
    return _jitter(TabEncoder(mistake)).eval()  # type: ignore[return-value]


def tab_transformer() -> TabTransformer:
    torch.manual_seed(0)
    return _jitter(TabTransformer()).eval()  # type: ignore[return-value]


def tab_example() -> tuple:
    g = torch.Generator().manual_seed(1)
    return (torch.randint(0, TAB_CARD, (2, TAB_COLS), generator=g), torch.randn(2, N_NUM, generator=g)), {}


# -- Graphormer (Ying et al. 2021): degree embeddings, a spatial-encoding bias per head from the shortest path -----


class GraphormerLayer(nn.Module):
    """Pre-LN; the attention's scores plus `attn_bias` (B, H, N, N) when given."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.self_attention_layer_norm = nn.LayerNorm(D)
        self.self_attn = Attention(mistake)
        self.final_layer_norm = nn.LayerNorm(D)
        self.fc1, self.fc2 = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor | None = None) -> torch.Tensor:
        h = self.self_attention_layer_norm(x)
        x = x + self.self_attn(h, h, attn_bias)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class Graphormer(nn.Module):
    """`forward(node_type, degree, spatial_pos)`: atom embedding plus the degree's embedding (`degrees=False`: none),
    the bias b[spatial_pos] (one learned scalar per distance and head) added to every layer's scores."""

    def __init__(self, degrees: bool = True, spatial: bool = True, mistake: str = "") -> None:
        super().__init__()
        self.atom_encoder = nn.Embedding(ATOMS, D, padding_idx=0)
        self.degree_encoder = nn.Embedding(MAX_DEG, D, padding_idx=0) if degrees else None
        self.spatial_pos_encoder = nn.Embedding(MAX_DIST, H, padding_idx=0) if spatial else None
        self.layers = nn.ModuleList([GraphormerLayer(), GraphormerLayer(mistake)])
        self.final_ln = nn.LayerNorm(D)

    def forward(self, node_type: torch.Tensor, degree: torch.Tensor, spatial_pos: torch.Tensor) -> torch.Tensor:
        x = self.atom_encoder(node_type)
        if self.degree_encoder is not None:
            x = x + self.degree_encoder(degree)
        bias = None if self.spatial_pos_encoder is None else self.spatial_pos_encoder(spatial_pos).permute(0, 3, 1, 2)
        for layer in self.layers:
            x = layer(x, bias)
        return self.final_ln(x)


def graphormer(degrees: bool = True, spatial: bool = True, mistake: str = "") -> Graphormer:
    torch.manual_seed(0)
    return _jitter(Graphormer(degrees, spatial, mistake)).eval()  # type: ignore[return-value]


def graphormer_layer(mistake: str = "") -> GraphormerLayer:
    torch.manual_seed(0)
    return _jitter(GraphormerLayer(mistake)).eval()  # type: ignore[return-value]


def graph_example() -> tuple:
    """A path graph 1-2-3-4-5-6 and a star on 6 nodes: node types, degrees (+1, 0 is padding), distances (+1)."""
    n = torch.arange(NODES)
    path = (n[:, None] - n[None]).abs() + 1
    star = torch.where(n[:, None] == n[None], 1, torch.where((n[:, None] == 0) | (n[None] == 0), 2, 3))
    spatial = torch.stack([path.clamp(max=MAX_DIST - 1), star])
    deg_path = torch.tensor([1, 2, 2, 2, 2, 1]) + 1
    deg_star = torch.tensor([NODES - 1, 1, 1, 1, 1, 1]).clamp(max=MAX_DEG - 2) + 1
    types = torch.tensor([[1, 2, 3, 1, 2, 3], [4, 5, 6, 7, 8, 9]])
    return (types, torch.stack([deg_path, deg_star]), spatial), {}


# -- HuBERT / wav2vec 2.0: a grouped, weight-normed Conv1d position embedding added before the encoder ------------


class SamePad(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :, :-1] if CONV_K % 2 == 0 else x


class PositionalConvEmbedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        conv = nn.Conv1d(D, D, CONV_K, padding=CONV_K // 2, groups=CONV_G)
        self.conv = nn.utils.parametrizations.weight_norm(conv, name="weight", dim=2)
        self.padding, self.activation = SamePad(), nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.padding(self.conv(x.transpose(1, 2)))).transpose(1, 2)


class HubertLayer(nn.Module):
    """HuBERT base's post-norm layer: attention, layer_norm, feed_forward, final_layer_norm."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.attention = Attention(mistake)
        self.layer_norm = nn.LayerNorm(D, eps=1e-5)
        self.feed_forward = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        self.final_layer_norm = nn.LayerNorm(D, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer_norm(x + self.attention(x, x))
        return self.final_layer_norm(x + self.feed_forward(x))


class HubertEncoder(nn.Module):
    """`conv=False`: the position convolution left out (the layers alone, as a study of them)."""

    def __init__(self, conv: bool = True, mistake: str = "") -> None:
        super().__init__()
        self.pos_conv_embed = PositionalConvEmbedding() if conv else None
        self.layer_norm = nn.LayerNorm(D)
        self.layers = nn.ModuleList([HubertLayer(), HubertLayer(mistake)])

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.pos_conv_embed is not None:
            hidden_states = hidden_states + self.pos_conv_embed(hidden_states)
        hidden_states = self.layer_norm(hidden_states)
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        return hidden_states


def hubert_encoder(conv: bool = True, mistake: str = "") -> HubertEncoder:
    torch.manual_seed(0)
    return _jitter(HubertEncoder(conv, mistake)).eval()  # type: ignore[return-value]


# -- BEiT: a relative position bias table per layer over the 2D patch grid (and the class token) ------------------

GRID = 3  # patches per side


def beit_relative_index() -> torch.Tensor:
    """BEiT's index of (N + 1, N + 1) pairs into (2 G - 1)^2 + 3 rows: the grid offsets, then cls->patch, patch->cls
    and cls->cls."""
    coords = torch.stack(torch.meshgrid(torch.arange(GRID), torch.arange(GRID), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + GRID - 1
    n, rows = GRID * GRID, (2 * GRID - 1) ** 2
    index = torch.zeros(n + 1, n + 1, dtype=torch.long)
    index[1:, 1:] = rel[..., 0] * (2 * GRID - 1) + rel[..., 1]
    index[0, 1:], index[1:, 0], index[0, 0] = rows, rows + 1, rows + 2
    return index


class BeitLayer(nn.Module):
    """Pre-LN ViT block whose attention adds table[index] (per head) to the scores; no layer scale."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(D, eps=1e-6), nn.LayerNorm(D, eps=1e-6)
        self.attn = Attention()
        self.relative_position_bias_table = nn.Parameter(0.2 * torch.randn((2 * GRID - 1) ** 2 + 3, H))
        self.register_buffer("relative_position_index", beit_relative_index(), persistent=False)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        bias = self.relative_position_bias_table[self.relative_position_index[:T, :T]].permute(2, 0, 1)[None]
        h = self.norm1(x)
        x = x + self.attn(h, h, bias)
        return x + self.mlp(self.norm2(x))


def beit_layer() -> BeitLayer:
    torch.manual_seed(0)
    return _jitter(BeitLayer()).eval()  # type: ignore[return-value]


def beit_example() -> tuple:
    return (torch.randn(2, GRID * GRID + 1, D, generator=torch.Generator().manual_seed(1)),), {}


# -- a Q-Former layer (BLIP-2): the queries' self-attention, cross-attention to the image, post-norm ---------------


class QFormerLayer(nn.Module):
    """BERT-style post-norm: norm(q + self_attn(q)), norm(q + cross(q, image)), norm(q + ffn(q)); the self-attention
    over the queries is bidirectional."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.attention = Attention()
        self.attention_norm = nn.LayerNorm(D, eps=1e-12)
        self.crossattention = Attention(mistake)
        self.crossattention_norm = nn.LayerNorm(D, eps=1e-12)
        self.intermediate, self.output = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.output_norm = nn.LayerNorm(D, eps=1e-12)

    def forward(self, query: torch.Tensor, image_embeds: torch.Tensor) -> torch.Tensor:
        q = self.attention_norm(query + self.attention(query, query))
        q = self.crossattention_norm(q + self.crossattention(q, image_embeds))
        return self.output_norm(q + self.output(F.gelu(self.intermediate(q))))


class QFormer(nn.Module):
    """Eight learned query tokens through two layers; `forward(image_embeds) -> (B, 8, D)`."""

    def __init__(self) -> None:
        super().__init__()
        self.query_tokens = nn.Parameter(0.5 * torch.randn(1, 8, D))
        self.layernorm = nn.LayerNorm(D, eps=1e-12)
        self.layers = nn.ModuleList([QFormerLayer(), QFormerLayer()])

    def forward(self, image_embeds: torch.Tensor) -> torch.Tensor:
        q = self.layernorm(self.query_tokens.expand(len(image_embeds), -1, -1))
        for layer in self.layers:
            q = layer(q, image_embeds)
        return q


def qformer_layer(mistake: str = "") -> QFormerLayer:
    torch.manual_seed(0)
    return _jitter(QFormerLayer(mistake)).eval()  # type: ignore[return-value]


def qformer() -> QFormer:
    torch.manual_seed(0)
    return _jitter(QFormer()).eval()  # type: ignore[return-value]


def image_features() -> tuple:
    return (torch.randn(2, 7, D, generator=torch.Generator().manual_seed(1)),), {}


# -- an MAE encoder: patches, fixed 2D sin-cos positions, a fixed subset of patches kept, CLS, pre-LN blocks --------


class MAEEncoder(nn.Module):
    """`forward(imgs)`: Conv2d patches (3 x 12 x 12 image, 4 x 4 patches, 9 of them) plus the sin-cos table, the
    patches at `keep` (4 of 9, fixed so the model is deterministic) gathered, the CLS (plus its zero position)
    prepended, two pre-LN blocks and a final norm."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, D, 4, stride=4)
        self.cls_token = nn.Parameter(0.02 * torch.randn(1, 1, D))
        self.register_buffer("pos_embed", self._sincos(), persistent=False)
        self.register_buffer("keep", torch.tensor([0, 2, 5, 7]), persistent=False)
        self.blocks = nn.ModuleList([FTBlock(), FTBlock(mistake=mistake)])
        self.norm = nn.LayerNorm(D)

    @staticmethod
    def _sincos() -> torch.Tensor:
        omega = 1.0 / 10000 ** (torch.arange(D // 4, dtype=torch.float64) / (D // 4))
        g = torch.arange(GRID, dtype=torch.float64)
        gy, gx = torch.meshgrid(g, g, indexing="ij")
        parts = [f(a.flatten()[:, None] * omega) for a in (gy, gx) for f in (torch.sin, torch.cos)]
        return torch.cat([torch.zeros(1, D, dtype=torch.float64), torch.cat(parts, 1)]).float()[None]

    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(imgs).flatten(2).transpose(1, 2) + self.pos_embed[:, 1:]
        x = x[:, self.keep]
        cls = (self.cls_token + self.pos_embed[:, :1]).expand(len(x), -1, -1)
        x = torch.cat([cls, x], dim=1)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


def mae_encoder(mistake: str = "") -> MAEEncoder:
    torch.manual_seed(0)
    return _jitter(MAEEncoder(mistake)).eval()  # type: ignore[return-value]


def mae_example() -> tuple:
    return (torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(1)),), {}


class MAEDecoder(nn.Module):
    """`forward(latent)`: the encoder's (B, 1 + 4, D) tokens embedded to the decoder's width, a learned mask token
    put where the 5 dropped patches were (`ids_restore` fixed, as `keep` is), the sin-cos table added, two pre-LN
    blocks, a norm and the pixel prediction (4 x 4 x 3 numbers per patch)."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.decoder_embed = nn.Linear(D, D)
        self.mask_token = nn.Parameter(0.02 * torch.randn(1, 1, D))
        self.register_buffer("decoder_pos_embed", MAEEncoder._sincos(), persistent=False)
        kept, dropped = [0, 2, 5, 7], [1, 3, 4, 6, 8]
        self.register_buffer("ids_restore", torch.tensor(kept + dropped).argsort(), persistent=False)
        self.decoder_blocks = nn.ModuleList([FTBlock(), FTBlock(mistake=mistake)])
        self.decoder_norm = nn.LayerNorm(D)
        self.decoder_pred = nn.Linear(D, 4 * 4 * 3)

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        x = self.decoder_embed(latent)
        n = GRID * GRID
        mask_tokens = self.mask_token.expand(len(x), n + 1 - x.shape[1], -1)
        patches = torch.cat([x[:, 1:], mask_tokens], dim=1)[:, self.ids_restore]
        x = torch.cat([x[:, :1], patches], dim=1) + self.decoder_pos_embed
        for block in self.decoder_blocks:
            x = block(x)
        return self.decoder_pred(self.decoder_norm(x))[:, 1:]


def mae_decoder(mistake: str = "") -> MAEDecoder:
    torch.manual_seed(0)
    return _jitter(MAEDecoder(mistake)).eval()  # type: ignore[return-value]


def latent_example() -> tuple:
    return (torch.randn(2, 5, D, generator=torch.Generator().manual_seed(1)),), {}


CASES = [
    ("f56_ft.block", ft_block, "encoder_layer", {}, "pass"),
    ("f56_ft.first_block", lambda: ft_block(first=True), "encoder_layer", {}, "pass"),
    ("f56_ft.backbone", ft_backbone, "encoder_stack", {}, "pass"),
    ("f56_ft.backbone.all_norms", lambda: ft_backbone(False), "encoder_stack", {}, "pass"),
    (
        "f56_ft.backbone.all_norms.softmax_over_queries_second_layer",
        lambda: ft_backbone(False, "softmax_over_queries"),
        "encoder_stack",
        {},
        ("mistake", "attention.softmax_wrong_axis", "layers.1.attention"),
    ),
    ("f56_ft", ft_transformer, "encoder_model", {"example": ft_example()}, ("no pair", "feature_tokenizer", "cat")),
    ("f56_tab.encoder", tab_encoder, "encoder_stack", {}, "pass"),
    (
        "f56_tab.encoder.wrong_scale_second_layer",
        lambda: tab_encoder("wrong_scale"),
        "encoder_stack",
        {},
        ("mistake", "attention.wrong_scale", "layers.1.attn"),
    ),
    ("f56_tab", tab_transformer, "encoder_model", {"example": tab_example()}, ("no pair", "", "categories_offset")),
    (
        "f56_graphormer.layer.softmax_over_queries",
        lambda: graphormer_layer("softmax_over_queries"),
        "encoder_layer",
        {},
        ("mistake", "attention.softmax_wrong_axis", "self_attn"),
    ),
    (
        "f56_graphormer",
        graphormer,
        "encoder_model",
        {"example": graph_example()},
        ("no pair", "layers.0.self_attn", "bias"),
    ),
    (
        "f56_graphormer.degrees_only",
        lambda: graphormer(spatial=False),
        "encoder_model",
        {"example": graph_example()},
        "pass",
    ),
    (
        "f56_graphormer.degrees_only.wrong_scale_second_layer",
        lambda: graphormer(spatial=False, mistake="wrong_scale"),
        "encoder_model",
        {"example": graph_example()},
        ("mistake", "attention.wrong_scale", "layers.1.self_attn"),
    ),
    ("f56_graphormer.no_example", graphormer, "encoder_model", {}, ("could not judge", None, "spatial_pos")),
    ("f56_hubert", hubert_encoder, "encoder_stack", {}, ("no pair", "pos_conv_embed.conv", "Conv1d")),
    ("f56_beit.layer", beit_layer, "encoder_layer", {"example": beit_example()}, ("no pair", "attn", "bias")),
    ("f56_qformer.layer", qformer_layer, "decoder_layer", {}, ("mistake", "attention.not_causal", "attention")),
    ("f56_qformer", qformer, "encoder_stack", {"example": image_features()}, ("no pair", "", "query_tokens")),
    ("f56_mae.encoder", mae_encoder, "transformer_lm", {"example": mae_example()}, ("no pair", "", "keep")),
    (
        "f56_mae.decoder",
        mae_decoder,
        "encoder_stack",
        {"example": latent_example()},
        ("no pair", "decoder_embed", "decoder_embed"),
    ),
]
