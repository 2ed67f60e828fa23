"""Language-model variants of 2019-2023 that 2025-26 courses still teach, written by hand from the papers (issue 46,
round 59), in this project's own words. The judge meets them here first (measured with the judge frozen).

Transformer-XL and the old blog posts' styles are fresh20's and fresh39's; fresh40's looped transformer (a learned
step vector) and its mixture of depths (top half, sigmoid weights) are not repeated.

- ELECTRA (Clark et al. 2020): word, position and token-type tables of `embedding_size` 8, summed and normed, then
  `embeddings_project` (8 to the hidden 16) before a post-norm BERT encoder (`encoder.layer`, `query` / `key` /
  `value` / `dense`); the encoder alone, the whole discriminator (its replaced-token head of one logit a token), the
  whole generator (its `generator_predictions` back to 8 and an LM head tied to the word table);
- a Universal Transformer (Dehghani et al. 2019): one post-norm `layer` applied T_steps = 3 times, tensor2tensor's
  timing signal of the positions plus the same sinusoid read at the step added before each step
  (`coordinate_embedding`); the same with the signal off; the same whose forward takes `n_steps` as a required
  argument; and a decoder-only looped GPT (one pre-LN `block` applied twice, learned positions);
- a Funnel-Transformer (Dai et al. 2020): two blocks of two post-norm layers, the first layer of the second block
  reading queries mean-pooled by stride 2 (`F.avg_pool1d`, the encoder's `pool_tensor`) and the unpooled states as
  keys and values, its residual the pooled states: T = 8 in, 4 out;
- a Reformer LM (Kitaev et al. 2020): the stream duplicated into two halves (`torch.cat([x, x], -1)`), reversible
  layers y1 = x1 + attention(norm(x2)), y2 = x2 + feed_forward(norm(y1)), the halves joined under a LayerNorm of
  2 D; its attention shared-QK (one `query_key` projection, keys the queries normalised by `F.normalize`, a
  query's own key at -1e5 so it is read only when alone), and the same model with an ordinary causal attention;
- Mixture-of-Depths (Raposo et al. 2024): a GPT whose second layer's `router` (Linear(D, 1)) picks the top k tokens
  (kept in order) to go through the block, each update multiplied by its raw router weight, the others skipping it;
  k = T here, so every token passes;
- BigBird (Zaheer et al. 2020): block-sparse attention on T = 8 in blocks of 2 (the first block global, each block
  its neighbours, one fixed "random" block each), applied as a mask on the dense scores of a post-norm layer; with
  random blocks that happen to cover every pair, and with block 3 never reading block 1;
- mistakes: scale 1 / d_head in ELECTRA's second layer and in the Universal Transformer's shared layer, the causal
  mask widened by one in the looped GPT's shared block, the causal mask left off in the MoD GPT's plain first layer,
  the softmax over the queries in the covering BigBird layer.

Expected verdicts decided from the math, each correct model against a head-by-head rewrite in float64: the ELECTRA
encoder, the signal-free Universal Transformer (the shared layer run three times), the looped GPT and the covering
BigBird layer (its mask all True) agree to 0; the Funnel encoder against the rewrite with the pooled query
(x[0::2] + x[1::2]) / 2 to 0. The reference has no projection between the embeddings and the first layer (ALBERT's
`embedding_hidden_mapping_in` is said there): both whole ELECTRA models differ first at `embeddings_project`. The
coordinate signal is a vector added between layers, at step 0 the positions plus a constant, neither the
reference's frequencies 10000^(-2i/D) nor any of its tables: no pair at `coordinate_embedding`. With the signal off
the loop is a three-layer stack of shared weights: a pass, and its wrong scale named at the shared `layer.attention`.
A required `n_steps` the judge cannot guess: could not judge, naming it. The Funnel's pooled query makes the
layer's output half as long, which no reference layer does: no pair, said where the pooling runs (the encoder's
forward). In the Reformer the duplicated halves are equal, so y1 is the pre-LN attention sublayer up to the
attention itself: shared-QK keys are the normalised queries (no pair at `layers.0.attention`); with an ordinary
attention y1 agrees, and y2 = x2 + feed_forward(norm(y1)) adds the feed-forward to the layer's input, not to y1
(the reference's x + ffn(norm(x)) on the sublayer's output), differing by 0.86: no pair at `layers.0`. MoD with
k = T equals x + w (block(x) - x) to 0 and the plain block by 1.4: the router's weight multiplies, no pair at
`layers.1.router`. The sparse BigBird hides 4 (query, key) pairs (rows 6, 7, keys 2, 3): a mask the reference
lacks (neither causal nor a window), no pair at `attention`. The words each "no pair" expects were chosen after the
run where the judge named the place; where it did not, they are the op the message should name.

First met: 14 of 18 right. Wrong:

- f59_ut: FAILED with no id and no op (output 1.12 off, the loop read as three shared layers, the coordinate
  signal never named).
- f59_funnel: "could not judge: the module's output has shape (2, 8, 16), the reference's (3, 8, 16); pass call=
  ... or mapping=" though the example was passed and nothing is missing.
- f59_reformer.plain_attention: "could not judge: the module could not be called as the reference
  'transformer_lm' is; ... ValueError: cannot reshape array of size 16 into shape (32,)".
- f59_mod: "differs at lm_head: every part agrees in situ, the output departs after the last: linear in lm_head",
  past the first departure (the router's weight on the update at layers.1).

Fixed since: a table the forward computes from no input and no weight (a sinusoid of an arange) added to the stream
after an attention ran on it is said where it is added (unsupported._signal_added), and a finding in a submodule that
holds no weight is no longer set aside for lying before the first part that diverges (no part there is compared): f59_ut
is said at `coordinate_embedding`. A top-k records the axis it picks along, so that a mixture of depths whose k is every
position (the top-k's output as long as its input) is still read as tokens routed past a block, said at its router. A
module's output holding fewer positions than its input is said at the op that first makes fewer from it (the Funnel's
``avg_pool1d``, in the encoder's forward). A sublayer whose output is added to a tensor its input is not computed from
(and that differs from the stream it reads) is said at the sum, naming the sublayer: the Reformer's y2 = x2 +
feed_forward(norm(y1)), the first departure on equal halves (a split's parts read again from the call that made them).

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

D, H = 16, 4
HD = D // H
E = 8  # ELECTRA's embedding_size, projected to the hidden size D
V, T_MAX, T = 48, 16, 8
STEPS = 3  # the Universal Transformer's T_steps
BLOCK = 2  # BigBird's block size: T = 8 is 4 blocks


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases moved off their 1s and 0s, so that a trained model's values are checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _causal(t: int) -> torch.Tensor:
    return torch.ones(t, t, dtype=torch.bool).tril()


class SelfAttention(nn.Module):
    """BERT's self-attention as ELECTRA's code writes it: `query`, `key`, `value`, `dense`, scores by matmul over
    sqrt(head size). `allowed` (T, T) bool: the keys each query may read (None: all). `queries`: the states the
    queries are made from, when not the keys' (the Funnel-Transformer's pooled query). `mistake`: "wrong_scale"
    (over the head size), "softmax_over_queries", "not_causal" (the `allowed` mask left off), "shows_next" (a
    causal `allowed` widened by one)."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.query, self.key, self.value, self.dense = (nn.Linear(D, D) for _ in range(4))
        self.mistake = mistake

    def forward(
        self, x: torch.Tensor, allowed: torch.Tensor | None = None, queries: torch.Tensor | None = None
    ) -> torch.Tensor:
        B, S, _ = x.shape
        q_in = x if queries is None else queries
        Tq = q_in.shape[1]
        q = self.query(q_in).view(B, Tq, H, HD).transpose(1, 2)
        k = self.key(x).view(B, S, H, HD).transpose(1, 2)
        v = self.value(x).view(B, S, H, HD).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / (HD if self.mistake == "wrong_scale" else math.sqrt(HD))
        if self.mistake == "shows_next" and allowed is not None:
            allowed = torch.ones_like(allowed).tril(1)
        if allowed is not None and self.mistake != "not_causal":
            scores = scores.masked_fill(~allowed, float("-inf"))
        probs = scores.softmax(dim=-2 if self.mistake == "softmax_over_queries" else -1)
        return self.dense((probs @ v).transpose(1, 2).reshape(B, Tq, D))


class BertLayer(nn.Module):
    """Post-norm: norm(x + attention(x)), norm(x + output(gelu(intermediate(x))))."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.attention = SelfAttention(mistake)
        self.attention_norm = nn.LayerNorm(D, eps=1e-12)
        self.intermediate, self.output = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.output_norm = nn.LayerNorm(D, eps=1e-12)

    def forward(
        self, x: torch.Tensor, allowed: torch.Tensor | None = None, queries: torch.Tensor | None = None
    ) -> torch.Tensor:
        residual = x if queries is None else queries
        x = self.attention_norm(residual + self.attention(x, allowed, queries))
        return self.output_norm(x + self.output(F.gelu(self.intermediate(x))))


# -- ELECTRA (Clark et al. 2020): a factorised embedding projected to the hidden size, a post-norm BERT encoder ----


class ElectraEncoder(nn.Module):
    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(), BertLayer(mistake)])

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        for layer_module in self.layer:
            hidden_states = layer_module(hidden_states)
        return hidden_states


class ElectraEmbeddings(nn.Module):
    """Word, position and token-type tables of `embedding_size` E, summed and normed (ELECTRA's own)."""

    def __init__(self) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(V, E, padding_idx=0)
        self.position_embeddings = nn.Embedding(T_MAX, E)
        self.token_type_embeddings = nn.Embedding(2, E)
        self.LayerNorm = nn.LayerNorm(E, eps=1e-12)
        self.dropout = nn.Dropout(0.1)
        self.register_buffer("position_ids", torch.arange(T_MAX)[None], persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = self.position_ids[:, : input_ids.shape[1]]
        types = torch.zeros_like(input_ids)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions) + self.token_type_embeddings(types)
        return self.dropout(self.LayerNorm(x))


class ElectraDiscriminator(nn.Module):
    """`forward(input_ids) -> (B, T)`: the embeddings, `embeddings_project` (E to D), the encoder, and the replaced-
    token head (dense, gelu, `dense_prediction` to one logit per token)."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.embeddings = ElectraEmbeddings()
        self.embeddings_project = nn.Linear(E, D)
        self.encoder = ElectraEncoder(mistake)
        self.dense = nn.Linear(D, D)
        self.dense_prediction = nn.Linear(D, 1)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden_states = self.encoder(self.embeddings_project(self.embeddings(input_ids)))
        return self.dense_prediction(F.gelu(self.dense(hidden_states))).squeeze(-1)


class ElectraGenerator(nn.Module):
    """`forward(input_ids) -> (B, T, V)`: the same factorised embeddings and `embeddings_project`, the encoder, then
    `generator_predictions` (dense D to E, gelu, LayerNorm of E) and `generator_lm_head` (E to V) whose weight is
    the word table (tied, as ELECTRA's generator shares its embeddings)."""

    def __init__(self) -> None:
        super().__init__()
        self.embeddings = ElectraEmbeddings()
        self.embeddings_project = nn.Linear(E, D)
        self.encoder = ElectraEncoder()
        self.generator_predictions = nn.Sequential(nn.Linear(D, E), nn.GELU(), nn.LayerNorm(E, eps=1e-12))
        self.generator_lm_head = nn.Linear(E, V)
        self.generator_lm_head.weight = self.embeddings.word_embeddings.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden_states = self.encoder(self.embeddings_project(self.embeddings(input_ids)))
        return self.generator_lm_head(self.generator_predictions(hidden_states))


def electra_generator() -> ElectraGenerator:
    torch.manual_seed(0)
    return _jitter(ElectraGenerator()).eval()  # type: ignore[return-value]


def electra_encoder(mistake: str = "") -> ElectraEncoder:
    torch.manual_seed(0)
    return _jitter(ElectraEncoder(mistake)).eval()  # type: ignore[return-value]


def electra_discriminator() -> ElectraDiscriminator:
    torch.manual_seed(0)
    return _jitter(ElectraDiscriminator()).eval()  # type: ignore[return-value]


# -- Universal Transformer (Dehghani et al. 2019): one layer applied T_steps times, a coordinate signal each step ---


def timing_signal(length: int, channels: int = D) -> torch.Tensor:
    """tensor2tensor's `get_timing_signal_1d`: sines then cosines at timescales 1 .. 10^4, spaced geometrically."""
    n = channels // 2
    inv_timescales = torch.exp(torch.arange(n, dtype=torch.float32) * -(math.log(1e4) / (n - 1)))
    scaled = torch.arange(length, dtype=torch.float32)[:, None] * inv_timescales[None]
    return torch.cat([scaled.sin(), scaled.cos()], dim=1)


class CoordinateEmbedding(nn.Module):
    """The paper's coordinate embedding: the position signal plus the step's signal (the same sinusoid read at the
    step), added to the state before each step."""

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        return x + timing_signal(x.shape[1]).to(x)[None] + timing_signal(STEPS)[step].to(x)


class UniversalEncoder(nn.Module):
    """`forward(x)`: for each of STEPS steps, the coordinate signal added (`signal=False`: none), then the one shared
    post-norm `layer`; `n_steps` other than STEPS where given."""

    def __init__(self, signal: bool = True, mistake: str = "") -> None:
        super().__init__()
        self.coordinate_embedding = CoordinateEmbedding() if signal else None
        self.layer = BertLayer(mistake)

    def forward(self, x: torch.Tensor, n_steps: int | None = None) -> torch.Tensor:
        for step in range(STEPS if n_steps is None else n_steps):
            if self.coordinate_embedding is not None:
                x = self.coordinate_embedding(x, step)
            x = self.layer(x)
        return x


class UniversalEncoderSteps(UniversalEncoder):
    """The same encoder whose forward takes the number of steps as a required argument (UT code without ACT that
    sets the depth per call)."""

    def forward(self, x: torch.Tensor, n_steps: int) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x, n_steps)


def universal_encoder(signal: bool = True, mistake: str = "") -> UniversalEncoder:
    torch.manual_seed(0)
    return _jitter(UniversalEncoder(signal, mistake)).eval()  # type: ignore[return-value]


def universal_encoder_steps() -> UniversalEncoderSteps:
    torch.manual_seed(0)
    return _jitter(UniversalEncoderSteps(signal=False)).eval()  # type: ignore[return-value]


class PreLNBlock(nn.Module):
    """A GPT block: x + attn(ln_1(x)) under the causal mask, x + mlp(ln_2(x))."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = SelfAttention(mistake)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), _causal(x.shape[1]).to(x.device))
        return x + self.mlp(self.ln_2(x))


class LoopedGPT(nn.Module):
    """A decoder-only Universal Transformer without the step signal: learned positions, one `block` applied twice,
    `ln_f`, an untied `lm_head`."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T_MAX, D)
        self.block = PreLNBlock(mistake)
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for _ in range(2):
            x = self.block(x)
        return self.lm_head(self.ln_f(x))


def looped_gpt(mistake: str = "") -> LoopedGPT:
    torch.manual_seed(0)
    return _jitter(LoopedGPT(mistake)).eval()  # type: ignore[return-value]


# -- Funnel-Transformer (Dai et al. 2020): the query mean-pooled by stride 2, keys and values unpooled ------------


class FunnelEncoder(nn.Module):
    """Two blocks of two post-norm layers; the first layer of the second block reads queries pooled by stride-2 mean
    pooling (HF's `pool_tensor`, mode "mean") and the unpooled states as keys and values; `forward(x)` is
    (B, T / 2, D)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.ModuleList([BertLayer(), BertLayer()]) for _ in range(2)])

    @staticmethod
    def pool_tensor(x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool1d(x.transpose(1, 2), kernel_size=2, stride=2, ceil_mode=True).transpose(1, 2)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        for block_index, block in enumerate(self.blocks):
            for layer_index, layer in enumerate(block):
                if block_index > 0 and layer_index == 0:
                    hidden = layer(hidden, queries=self.pool_tensor(hidden))
                else:
                    hidden = layer(hidden)
        return hidden


def funnel_encoder() -> FunnelEncoder:
    torch.manual_seed(0)
    return _jitter(FunnelEncoder()).eval()  # type: ignore[return-value]


# -- Reformer (Kitaev et al. 2020): shared-QK attention, reversible residual layers --------------------------------


class SharedQKAttention(nn.Module):
    """One `query_key` projection: the keys are the queries normalised to unit length; a query does not read its own
    key (its score set to -1e5, HF's `self_mask_value`) unless it has no other (the first position); causal."""

    def __init__(self) -> None:
        super().__init__()
        self.query_key, self.value = nn.Linear(D, D, bias=False), nn.Linear(D, D, bias=False)
        self.dense = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        q = self.query_key(x).view(B, S, H, HD).transpose(1, 2)
        k = F.normalize(q, dim=-1)
        v = self.value(x).view(B, S, H, HD).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(HD)
        scores = scores.masked_fill(torch.eye(S, dtype=torch.bool, device=x.device), -1e5)
        scores = scores.masked_fill(~_causal(S).to(x.device), float("-inf"))
        return self.dense((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, S, D))


class CausalAttention(SelfAttention):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x, _causal(x.shape[1]).to(x.device))


class ReversibleLayer(nn.Module):
    """y1 = x1 + attention(norm(x2)), y2 = x2 + feed_forward(norm(y1)) (RevNet's coupling, as HF's
    `ReformerLayer.forward(prev_attn_output, hidden_states)`)."""

    def __init__(self, shared_qk: bool = True) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(D, eps=1e-12)
        self.attention = SharedQKAttention() if shared_qk else CausalAttention()
        self.feed_forward_norm = nn.LayerNorm(D, eps=1e-12)
        self.feed_forward = nn.Sequential(nn.Linear(D, 4 * D), nn.ReLU(), nn.Linear(4 * D, D))

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y1 = x1 + self.attention(self.attention_norm(x2))
        y2 = x2 + self.feed_forward(self.feed_forward_norm(y1))
        return y1, y2


class ReformerLM(nn.Module):
    """`forward(input_ids)`: word plus learned positions, the stream duplicated into two halves (HF's
    `torch.cat([hidden_states, hidden_states], dim=-1)`), two reversible layers, the halves joined, a LayerNorm of
    2 D and the `lm_head` from 2 D."""

    def __init__(self, shared_qk: bool = True) -> None:
        super().__init__()
        self.word_embeddings, self.position_embeddings = nn.Embedding(V, D), nn.Embedding(T_MAX, D)
        self.layers = nn.ModuleList([ReversibleLayer(shared_qk) for _ in range(2)])
        self.layer_norm = nn.LayerNorm(2 * D, eps=1e-12)
        self.lm_head = nn.Linear(2 * D, V)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + self.position_embeddings(torch.arange(input_ids.shape[1]))
        x1, x2 = torch.cat([x, x], dim=-1).chunk(2, dim=-1)
        for layer in self.layers:
            x1, x2 = layer(x1, x2)
        return self.lm_head(self.layer_norm(torch.cat([x1, x2], dim=-1)))


def reformer(shared_qk: bool = True) -> ReformerLM:
    torch.manual_seed(0)
    return _jitter(ReformerLM(shared_qk)).eval()  # type: ignore[return-value]


# -- Mixture-of-Depths (Raposo et al. 2024): a router's top-k tokens go through the block, the rest skip it --------


class MoDBlock(nn.Module):
    """`router` (Linear(D, 1)) scores the tokens; the top `capacity` of them, kept in order, go through the block
    (attention among themselves, causal in their order); each one's update is multiplied by its router weight and
    scattered back; the others are returned as they came."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.router = nn.Linear(D, 1)
        self.block = PreLNBlock()
        self.capacity = capacity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.router(x).squeeze(-1)
        chosen = weights.topk(self.capacity, dim=-1).indices.sort(dim=-1).values
        index = chosen[..., None].expand(-1, -1, D)
        picked = x.gather(1, index)
        update = (self.block(picked) - picked) * weights.gather(1, chosen)[..., None]
        return x.scatter(1, index, picked + update)


class MoDGPT(nn.Module):
    """Learned positions, a plain block then a MoD block, `ln_f`, an untied head."""

    def __init__(self, capacity: int = T, mistake: str = "") -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T_MAX, D)
        self.layers = nn.ModuleList([PreLNBlock(mistake), MoDBlock(capacity)])
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_f(x))


def mod_gpt(mistake: str = "") -> MoDGPT:
    torch.manual_seed(0)
    return _jitter(MoDGPT(T, mistake)).eval()  # type: ignore[return-value]


def mod_example() -> tuple:
    """Eight tokens, so that the capacity T = 8 sends every token through the block."""
    return (torch.randint(1, V, (2, T), generator=torch.Generator().manual_seed(1)),), {}


# -- BigBird (Zaheer et al. 2020): block-sparse attention, a global first block, sliding and "random" blocks -------


def bigbird_allowed(random_blocks: dict[int, int]) -> torch.Tensor:
    """(T, T) bool of the keys each query reads: block 0 global (reads and is read by all), each block its
    neighbours, and one fixed "random" block per other block."""
    n = T // BLOCK
    b = torch.arange(n)
    blocks = ((b[:, None] - b[None]).abs() <= 1) | (b[:, None] == 0) | (b[None] == 0)
    for row, col in random_blocks.items():
        blocks[row, col] = True
    return blocks.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)


COVERING = {1: 3, 2: 0, 3: 1}  # block 3's random block is 1: every block reads every block
SPARSE = {1: 3, 2: 0, 3: 0}  # block 3 never reads block 1


class BigBirdLayer(BertLayer):
    """BigBird's post-norm layer with the block-sparse pattern applied as a mask on the dense scores."""

    def __init__(self, random_blocks: dict[int, int], mistake: str = "") -> None:
        super().__init__(mistake)
        self.register_buffer("allowed", bigbird_allowed(random_blocks), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        S = x.shape[1]
        return super().forward(x, self.allowed[:S, :S])


def bigbird_layer(random_blocks: dict[int, int] = COVERING, mistake: str = "") -> BigBirdLayer:
    torch.manual_seed(0)
    return _jitter(BigBirdLayer(random_blocks, mistake)).eval()  # type: ignore[return-value]


def states_example() -> tuple:
    return (torch.randn(2, T, D, generator=torch.Generator().manual_seed(1)),), {}


ENC, LM = "encoder_stack", "transformer_lm"
PROJECTED = ("no pair", "embeddings_project", "projects 8 -> 16")

CASES = [
    ("f59_electra.encoder", electra_encoder, ENC, {}, "pass"),
    (
        "f59_electra.encoder.wrong_scale_second_layer",
        lambda: electra_encoder("wrong_scale"),
        ENC,
        {},
        ("mistake", "attention.wrong_scale", "layer.1.attention"),
    ),
    ("f59_electra.discriminator", electra_discriminator, "encoder_model", {}, PROJECTED),
    ("f59_electra.generator", electra_generator, "encoder_model", {}, PROJECTED),
    ("f59_ut", universal_encoder, ENC, {}, ("no pair", "coordinate_embedding", "add")),
    ("f59_ut.no_signal", lambda: universal_encoder(False), ENC, {}, "pass"),
    (
        "f59_ut.no_signal.wrong_scale",
        lambda: universal_encoder(False, "wrong_scale"),
        ENC,
        {},
        ("mistake", "attention.wrong_scale", "layer.attention"),
    ),
    ("f59_ut.steps_argument", universal_encoder_steps, ENC, {}, ("could not judge", None, "n_steps")),
    ("f59_looped_gpt", looped_gpt, LM, {}, "pass"),
    (
        "f59_looped_gpt.shows_next",
        lambda: looped_gpt("shows_next"),
        LM,
        {},
        ("mistake", "attention.causal_shows_next", "block.attn"),
    ),
    ("f59_funnel", funnel_encoder, ENC, {"example": states_example()}, ("no pair", "", "pool")),
    ("f59_reformer", reformer, LM, {}, ("no pair", "layers.0.attention", "normalize")),
    ("f59_reformer.plain_attention", lambda: reformer(False), LM, {}, ("no pair", "layers.0", "feed_forward")),
    ("f59_mod", mod_gpt, LM, {"example": mod_example()}, ("no pair", "layers.1.router", "router")),
    (
        "f59_mod.not_causal_first_layer",
        lambda: mod_gpt("not_causal"),
        LM,
        {"example": mod_example()},
        ("mistake", "attention.not_causal", "layers.0.attn"),
    ),
    ("f59_bigbird.covering", bigbird_layer, "encoder_layer", {"example": states_example()}, "pass"),
    (
        "f59_bigbird.sparse",
        lambda: bigbird_layer(SPARSE),
        "encoder_layer",
        {"example": states_example()},
        ("no pair", "attention", "mask"),
    ),
    (
        "f59_bigbird.covering.softmax_over_queries",
        lambda: bigbird_layer(COVERING, "softmax_over_queries"),
        "encoder_layer",
        {"example": states_example()},
        ("mistake", "attention.softmax_wrong_axis", "attention"),
    ),
]
