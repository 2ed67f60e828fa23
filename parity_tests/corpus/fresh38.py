"""Hybrid models learners write by hand in 2026 (issue 46, round 38): attention layers interleaved with recurrent or
state-space layers, in this project's own words. The judge meets them here first (measured with the judge frozen).

- a Jamba-style LM (`model.layers[i].mixer`, RMSNorm written out, SwiGLU feed-forward, no positions, as Jamba has
  none): most layers a Mamba-like selective SSM (in_proj to u and z, a causal depthwise Conv1d, x_proj to dt, B and
  C, softplus(dt_proj), A = -exp(A_log), the scan written as a plain loop over the positions, + D u, times
  silu(z), out_proj), one grouped-query attention layer in the middle (2 K/V heads, a hand-written softmax);
- the same stack with the attention layer first, and an attention-only model in the same code (every layer
  attention);
- a Zamba-style LM: two Mamba layers whose scan is a cumulative one (the decays summed by `cumsum` and the states
  read as exp(c_t - c_s) weighted sums, no convolution), and ONE shared attention block (RoPE) applied after each,
  the same module object at two depths;
- a Griffin / RecurrentGemma-style LM: embeddings times sqrt(D), Gemma's RMSNorm of (1 + w), two recurrent blocks
  (a GeLU(tanh) branch times an RG-LRU branch: sigmoid input and recurrence gates, a = exp(-8 r softplus(lambda)),
  h_t = a_t h_(t-1) + sqrt(1 - a_t^2) (i_t x_t) as a loop; the temporal Conv1d left out) then a local attention
  block: multi-query attention (one K/V head), RoPE, a causal sliding window of 4 keys (keys i - 4 < j <= i);
- a Qwen3-Next-style pair: a gated DeltaNet layer (q and k normalised to unit length, beta = sigmoid, a decay
  g = -exp(A_log) softplus(a_proj x), the delta rule's state written as a loop) next to a softmax attention layer.

Expected verdicts, decided from the math before the judge ran:

- a whole hybrid model: the reference has no pair for a selective scan, an RG-LRU or a delta rule, so the honest
  answer is "no pair" at the first recurrent submodule in data-flow order, its op named: the Mamba mixer's
  Conv1d (its first op the reference lacks, computed in `mixer.conv1d`: "conv"), the cumulative scan's cumsum,
  the RG-LRU's sigmoid gates (the GeLU branch and the linear projections before it have a pair), the DeltaNet's
  unit-length q and k ("norm");
- the attention layers judged alone (decoder_only_layer; the local attention also at multi_head_attention) pass
  when right, and name their catalogued mistake when one is put in: K/V heads tiled (`repeat` where
  `repeat_interleave` is meant), RoPE on the values too, Gemma's RMSNorm of eps outside the root. The reference
  holds a causal window (config sliding_window: keys i - window < j <= i), so Griffin's local attention has a pair;
- a mistake in a hybrid whole model's attention: where the attention layer is layer 0 (its input the embeddings,
  which the reference has), its output already differs from the reference's before any recurrence runs, so a
  demanding user expects the mistake named there (attention.wrong_scale at model.layers.0.mixer), not hidden
  behind the later SSM's no pair. Where the attention layer sits after an SSM, its input is the scan's output,
  which the reference cannot compute: the first divergence in data flow is the scan, and "no pair" there is the
  honest whole-model answer (the attention's mistake is then found by judging that layer alone, as above).

Checked by hand in float64: the cumulative scan equals the plain loop scan to 3e-15; the hand-written grouped
attention equals SDPA (with `enable_gqa`, the causal or windowed keep-mask) to 1e-15; the tiled K/V heads differ.

The attention-only model has no positions at all: the reference's config expresses it as positional "rope" with
every layer a NoPE layer (rope_layers all False, SmolLM3's field), and with those fields given the judge passes it
and names the second layer's missing causal mask (measured), so both verdicts are the reference's math.

First met: 12 of 18 right. Wrong:

- jamba_hand and jamba_hand.wrong_scale_middle_attention: "differs at model.layers.0.mixer.x_proj: a feed-forward
  summed into the stream before the attention (x + ffn(x), a macaron half-step)": the place is inside the right
  mixer, but after its Conv1d (the first op in data flow the reference lacks, which the same judge names at
  model.layers.1.mixer.conv1d when the attention layer comes first) and the op is misread as a macaron
  feed-forward;
- jamba_hand.attention_only and its .not_causal_second_layer: a bare FAILED, "unexplained: model.layers.0.mixer
  ... positions 1, 2, 3, 4, 5 differ ...; not expressible by the config": a model of no positions judged under
  RoPE in every layer (rope_layers all False not read from the flow, though the same model passes with it given);
- zamba_hand: "differs at shared_transformer.mixer: the attention runs again with the same weights (layers that
  share their parameters, as ALBERT's)": true of the model, but not the first op in data flow the reference
  lacks (mamba_layers.0.mixer's cumsum scan runs before the shared block);
- griffin_hand: the place right (blocks.0.temporal_block.rg_lru), the op misnamed: "x * sqrt(mean(x^2) + eps)
  normalises without a weight": the RG-LRU's sqrt(1 - a_t^2) input scale read as an RMS norm, its sigmoid gates
  and its recurrence unsaid.

Fixed since: a no pair met while reading the module (the Mamba mixer's Conv1d) and the finders' answers are ranked
by where they run in data flow, so the Conv1d is said before the feed-forward read at x_proj; a finding may name
the op it ranks at (a loop's first state, a padded tensor) instead of its submodule's first op. Where no attention
turns its queries and the forward computes no cos, sin or polar table, RoPE on no layer (rope_layers all False) is
tried last, so the attention-only model passes and its second layer's missing mask is named. A root taken by hand
is a norm only where it reads a mean or a sum, so Griffin's sqrt(1 - a^2) is none; states joined over the positions,
each computed from the one before by ops that read no weight, are said as a recurrence ("a gated linear recurrence
h_t = a_t * h_(t-1) + b_t", with the sigmoid, softplus and exp its gates are made by) where they are joined.
zamba_hand (weight sharing) is left to its own fix.

Fixed since (zamba_hand): the shared block is read as reference layers holding the same weights (no refusal while
the config is read), and a cumsum of what a projection makes (a scan's decays accumulated) is said where it runs:
mamba_layers.0.mixer, the first op in data flow the reference lacks.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

D, H, KV, V, T_MAX = 32, 4, 2, 26, 16
HD = D // H
D_INNER, D_STATE, DT_RANK, D_CONV = 2 * D, 4, 4, 4


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases moved off their 1s and 0s, so that a trained model's values are checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * w; `gemma`: times (1 + w), w starting at 0; `eps_outside`: the mistake,
    x / (sqrt(mean(x^2)) + eps)."""

    def __init__(self, dim: int, eps: float = 1e-5, gemma: bool = False, eps_outside: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim) if gemma else torch.ones(dim))
        self.eps, self.gemma, self.eps_outside = eps, gemma, eps_outside

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ms = x.pow(2).mean(-1, keepdim=True)
        x = x / (ms.sqrt() + self.eps) if self.eps_outside else x * torch.rsqrt(ms + self.eps)
        return x * (1 + self.weight if self.gemma else self.weight)


def rotate(x: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """RoPE on (B, heads, T, HD), the halves rotated (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
    T, hd = x.shape[-2], x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angles = torch.outer(torch.arange(T, dtype=torch.float64), inv).to(x.dtype)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Attention(nn.Module):
    """Grouped-query attention written by hand: q/k/v/o projections without bias, the K/V heads widened by
    repeat_interleave, causal (and a window of `window` keys), softmax, values. `mistake`: "tiled" (K/V widened by
    repeat: head h reads K/V head h % KV), "rope_v" (RoPE on the values too), "wrong_scale" (1 / HD),
    "not_causal" (no mask)."""

    def __init__(self, n_kv: int = KV, rope: bool = False, window: int | None = None, mistake: str = "") -> None:
        super().__init__()
        self.q_proj = nn.Linear(D, H * HD, bias=False)
        self.k_proj = nn.Linear(D, n_kv * HD, bias=False)
        self.v_proj = nn.Linear(D, n_kv * HD, bias=False)
        self.o_proj = nn.Linear(H * HD, D, bias=False)
        self.n_kv, self.rope, self.window, self.mistake = n_kv, rope, window, mistake

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, H, HD).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv, HD).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv, HD).transpose(1, 2)
        if self.rope:
            q, k = rotate(q), rotate(k)
            v = rotate(v) if self.mistake == "rope_v" else v
        if self.mistake == "tiled":
            k, v = k.repeat(1, H // self.n_kv, 1, 1), v.repeat(1, H // self.n_kv, 1, 1)
        else:
            k, v = k.repeat_interleave(H // self.n_kv, 1), v.repeat_interleave(H // self.n_kv, 1)
        scale = 1.0 / HD if self.mistake == "wrong_scale" else 1.0 / math.sqrt(HD)
        scores = (q @ k.transpose(-1, -2)) * scale
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        hidden = j > i
        if self.window is not None:
            hidden = hidden | (j <= i - self.window)
        if self.mistake != "not_causal":
            scores = scores.masked_fill(hidden, float("-inf"))
        out = scores.softmax(-1) @ v
        return self.o_proj(out.transpose(1, 2).reshape(B, T, H * HD))


class MambaMixer(nn.Module):
    """A selective SSM as learners write it from the Mamba paper: in_proj to (u, z), causal depthwise conv, silu,
    x_proj to (dt, B, C), dt = softplus(dt_proj(dt)), A = -exp(A_log), the scan as a plain loop over positions;
    `cumulative`: no conv, the scan as a cumsum of the log decays (h_t = sum_{s <= t} exp(c_t - c_s) dt_s B_s u_s)."""

    def __init__(self, cumulative: bool = False) -> None:
        super().__init__()
        self.in_proj = nn.Linear(D, 2 * D_INNER, bias=False)
        if not cumulative:
            self.conv1d = nn.Conv1d(D_INNER, D_INNER, D_CONV, groups=D_INNER, padding=D_CONV - 1)
        self.x_proj = nn.Linear(D_INNER, DT_RANK + 2 * D_STATE, bias=False)
        self.dt_proj = nn.Linear(DT_RANK, D_INNER)
        self.A_log = nn.Parameter(torch.log(torch.arange(1.0, D_STATE + 1).repeat(D_INNER, 1)))
        self.D = nn.Parameter(torch.ones(D_INNER))
        self.out_proj = nn.Linear(D_INNER, D, bias=False)
        self.cumulative = cumulative

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        u, z = self.in_proj(x).chunk(2, -1)
        if not self.cumulative:
            u = self.conv1d(u.transpose(1, 2))[..., :T].transpose(1, 2)
        u = F.silu(u)
        dt, b, c = self.x_proj(u).split([DT_RANK, D_STATE, D_STATE], -1)
        dt = F.softplus(self.dt_proj(dt))  # (B, T, D_INNER)
        A = -torch.exp(self.A_log)  # (D_INNER, N)
        y = self.cumsum_scan(u, dt, A, b, c) if self.cumulative else self.loop_scan(u, dt, A, b, c)
        return self.out_proj((y + u * self.D) * F.silu(z))

    @staticmethod
    def loop_scan(u, dt, A, b, c) -> torch.Tensor:
        """h_t = exp(dt_t A) h_(t-1) + dt_t B_t u_t, y_t = h_t C_t, one position at a time."""
        h = u.new_zeros(u.shape[0], D_INNER, D_STATE)
        ys = []
        for t in range(u.shape[1]):
            h = torch.exp(dt[:, t, :, None] * A) * h + dt[:, t, :, None] * b[:, t, None, :] * u[:, t, :, None]
            ys.append((h @ c[:, t, :, None]).squeeze(-1))
        return torch.stack(ys, 1)

    @staticmethod
    def cumsum_scan(u, dt, A, b, c) -> torch.Tensor:
        """The same recurrence in closed form: c_t = sum_{l <= t} dt_l A, h_t = sum_{s <= t} exp(c_t - c_s) x_s."""
        T = u.shape[1]
        logs = torch.cumsum(dt[..., None] * A, 1)  # (B, T, D_INNER, N)
        gaps = logs[:, :, None] - logs[:, None, :]  # (B, t, s, D_INNER, N)
        later = (torch.arange(T)[None, :] > torch.arange(T)[:, None])[None, :, :, None, None]
        weights = torch.exp(gaps.masked_fill(later, float("-inf")))
        inputs = dt[..., None] * b[:, :, None, :] * u[..., None]  # (B, s, D_INNER, N)
        h = torch.einsum("btsdn,bsdn->btdn", weights, inputs)
        return torch.einsum("btdn,btn->btd", h, c)


class SwiGLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(D, 2 * D, bias=False)
        self.up_proj = nn.Linear(D, 2 * D, bias=False)
        self.down_proj = nn.Linear(2 * D, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class HybridLayer(nn.Module):
    """Pre-norm residual layer around any token mixer (attention or SSM) and a SwiGLU feed-forward."""

    def __init__(self, mixer: nn.Module) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(D)
        self.mixer = mixer
        self.pre_ff_layernorm = RMSNorm(D)
        self.feed_forward = SwiGLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mixer(self.input_layernorm(x))
        return x + self.feed_forward(self.pre_ff_layernorm(x))


def _mixer(kind: str) -> nn.Module:
    """'mamba', 'scan' (the cumulative one), 'attn', or 'attn:<mistake>'."""
    if kind.startswith("attn"):
        return Attention(mistake=kind.partition(":")[2])
    return MambaMixer(cumulative=kind == "scan")


class Backbone(nn.Module):
    def __init__(self, kinds: tuple[str, ...]) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([HybridLayer(_mixer(k)) for k in kinds])
        self.final_layernorm = RMSNorm(D)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.final_layernorm(x)


class JambaLM(nn.Module):
    def __init__(self, kinds: tuple[str, ...]) -> None:
        super().__init__()
        self.model = Backbone(kinds)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(input_ids))


def jamba(*kinds: str) -> JambaLM:
    torch.manual_seed(0)
    return _jitter(JambaLM(kinds or ("mamba", "attn", "mamba")))  # type: ignore[return-value]


def jamba_attention_layer(mistake: str = "") -> nn.Module:
    """The Jamba's middle layer (attention, no positions), taken out of the model."""
    return jamba("mamba", "attn:" + mistake if mistake else "attn", "mamba").model.layers[1]


class ZambaLM(nn.Module):
    """Mamba layers, and one shared attention block (RoPE) applied after each: the same weights at two depths."""

    def __init__(self, shared_mistake: str = "") -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(V, D)
        self.mamba_layers = nn.ModuleList([HybridLayer(MambaMixer(cumulative=True)) for _ in range(2)])
        self.shared_transformer = HybridLayer(Attention(rope=True, mistake=shared_mistake))
        self.final_norm = RMSNorm(D)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.mamba_layers:
            x = self.shared_transformer(layer(x))
        return self.lm_head(self.final_norm(x))


def zamba(shared_mistake: str = "") -> ZambaLM:
    torch.manual_seed(0)
    return _jitter(ZambaLM(shared_mistake))  # type: ignore[return-value]


class RGLRU(nn.Module):
    """Griffin's real-gated linear recurrent unit: r = sigmoid(W_a x), i = sigmoid(W_x x), log a = -8 r
    softplus(lambda), h_t = a_t h_(t-1) + sqrt(1 - a_t^2) (i_t x_t), a loop over the positions."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.input_gate = nn.Linear(width, width)
        self.a_gate = nn.Linear(width, width)
        self.a_param = nn.Parameter(torch.linspace(0.5, 2.0, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_x = torch.sigmoid(self.input_gate(x))
        gate_a = torch.sigmoid(self.a_gate(x))
        log_a = -8.0 * gate_a * F.softplus(self.a_param)
        a = torch.exp(log_a)
        normed = x * gate_x * torch.sqrt(1 - torch.exp(2 * log_a))
        h, hs = torch.zeros_like(x[:, 0]), []
        for t in range(x.shape[1]):
            h = a[:, t] * h + normed[:, t]
            hs.append(h)
        return torch.stack(hs, 1)


class RecurrentBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear_y = nn.Linear(D, D)
        self.linear_x = nn.Linear(D, D)
        self.rg_lru = RGLRU(D)
        self.linear_out = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.gelu(self.linear_y(x), approximate="tanh")
        return self.linear_out(self.rg_lru(self.linear_x(x)) * y)


class GeGLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(D, 3 * D)
        self.up = nn.Linear(D, 3 * D)
        self.down = nn.Linear(3 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.gate(x), approximate="tanh") * self.up(x))


class ResidualBlock(nn.Module):
    """RecurrentGemma's residual block: temporal_pre_norm, a temporal block (recurrent or local attention),
    channel_pre_norm, the GeGLU MLP."""

    def __init__(self, temporal: nn.Module, eps_outside: bool = False) -> None:
        super().__init__()
        self.temporal_pre_norm = RMSNorm(D, 1e-6, gemma=True, eps_outside=eps_outside)
        self.temporal_block = temporal
        self.channel_pre_norm = RMSNorm(D, 1e-6, gemma=True)
        self.mlp_block = GeGLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.temporal_block(self.temporal_pre_norm(x))
        return x + self.mlp_block(self.channel_pre_norm(x))


WINDOW = 4


def local_attention(mistake: str = "") -> Attention:
    """Griffin's local attention: multi-query (one K/V head), RoPE, a causal window of WINDOW keys."""
    return Attention(n_kv=1, rope=True, window=WINDOW, mistake=mistake)


class GriffinLM(nn.Module):
    def __init__(self, eps_outside: bool = False) -> None:
        super().__init__()
        self.embedder = nn.Embedding(V, D)
        self.blocks = nn.ModuleList(
            [ResidualBlock(RecurrentBlock()), ResidualBlock(RecurrentBlock())]
            + [ResidualBlock(local_attention(), eps_outside)]
        )
        self.final_norm = RMSNorm(D, 1e-6, gemma=True)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embedder(input_ids) * math.sqrt(D)
        for block in self.blocks:
            x = block(x)
        return self.final_norm(x) @ self.embedder.weight.T  # tied


def griffin(eps_outside: bool = False) -> GriffinLM:
    torch.manual_seed(0)
    return _jitter(GriffinLM(eps_outside))  # type: ignore[return-value]


class GatedDeltaNet(nn.Module):
    """The gated delta rule by hand: q, k to unit length per head, beta = sigmoid(b_proj x), g = -exp(A_log)
    softplus(a_proj x); S_t = exp(g_t) S_(t-1) + k_t (beta_t (v_t - S^T k_t))^T, o_t = S_t^T q_t / sqrt(HD)."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(D, D, bias=False)
        self.k_proj = nn.Linear(D, D, bias=False)
        self.v_proj = nn.Linear(D, D, bias=False)
        self.b_proj = nn.Linear(D, H, bias=False)
        self.a_proj = nn.Linear(D, H, bias=False)
        self.A_log = nn.Parameter(torch.zeros(H))
        self.o_proj = nn.Linear(D, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = F.normalize(self.q_proj(x).view(B, T, H, HD), dim=-1) / math.sqrt(HD)
        k = F.normalize(self.k_proj(x).view(B, T, H, HD), dim=-1)
        v = self.v_proj(x).view(B, T, H, HD)
        beta = torch.sigmoid(self.b_proj(x))
        g = -torch.exp(self.A_log) * F.softplus(self.a_proj(x))
        state, outs = x.new_zeros(B, H, HD, HD), []
        for t in range(T):
            state = state * torch.exp(g[:, t])[..., None, None]
            delta = (v[:, t] - torch.einsum("bhkv,bhk->bhv", state, k[:, t])) * beta[:, t, :, None]
            state = state + k[:, t, :, :, None] * delta[:, :, None, :]
            outs.append(torch.einsum("bhkv,bhk->bhv", state, q[:, t]))
        return self.o_proj(torch.stack(outs, 1).reshape(B, T, D))


class DeltaHybridLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.layers = nn.ModuleList([HybridLayer(GatedDeltaNet()), HybridLayer(Attention(rope=True))])
        self.norm = RMSNorm(D)
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def delta_hybrid() -> DeltaHybridLM:
    torch.manual_seed(0)
    return _jitter(DeltaHybridLM())  # type: ignore[return-value]


LM, LAYER, MHA = "transformer_lm", "decoder_only_layer", "multi_head_attention"

CASES = [
    ("jamba_hand", jamba, LM, {}, ("no pair", "model.layers.0.mixer.conv1d", "conv")),
    ("jamba_hand.attention_layer", jamba_attention_layer, LAYER, {}, "pass"),
    (
        "jamba_hand.attention_layer.kv_heads_tiled",
        lambda: jamba_attention_layer("tiled"),
        LAYER,
        {},
        ("mistake", "attention.kv_heads_tiled", "mixer"),
    ),
    (
        "jamba_hand.wrong_scale_middle_attention",
        lambda: jamba("mamba", "attn:wrong_scale", "mamba"),
        LM,
        {},
        ("no pair", "model.layers.0.mixer.conv1d", "conv"),
    ),
    (
        "jamba_hand.attention_first",
        lambda: jamba("attn", "mamba", "mamba"),
        LM,
        {},
        ("no pair", "model.layers.1.mixer.conv1d", "conv"),
    ),
    (
        "jamba_hand.attention_first.wrong_scale_first_layer",
        lambda: jamba("attn:wrong_scale", "mamba", "mamba"),
        LM,
        {},
        ("mistake", "attention.wrong_scale", "model.layers.0.mixer"),
    ),
    ("jamba_hand.attention_only", lambda: jamba("attn", "attn"), LM, {}, "pass"),
    (
        "jamba_hand.attention_only.rope_layers_given",
        lambda: jamba("attn", "attn"),
        LM,
        dict(positional="rope", rope_layers=(False, False)),
        "pass",
    ),
    (
        "jamba_hand.attention_only.not_causal_second_layer",
        lambda: jamba("attn", "attn:not_causal"),
        LM,
        {},
        ("mistake", "attention.not_causal", "model.layers.1.mixer"),
    ),
    ("zamba_hand", zamba, LM, {}, ("no pair", "mamba_layers.0.mixer", "cumsum")),
    ("zamba_hand.shared_block", lambda: zamba().shared_transformer, LAYER, {}, "pass"),
    (
        "zamba_hand.shared_block.rope_on_values",
        lambda: zamba("rope_v").shared_transformer,
        LAYER,
        {},
        ("mistake", "rope.applied_to_v", "mixer"),
    ),
    ("griffin_hand", griffin, LM, {}, ("no pair", "blocks.0.temporal_block.rg_lru", "sigmoid")),
    ("griffin_hand.local_block", lambda: griffin().blocks[2], LAYER, {}, "pass"),
    ("griffin_hand.local_attention", lambda: griffin().blocks[2].temporal_block, MHA, {}, "pass"),
    (
        "griffin_hand.local_block.eps_outside_sqrt",
        lambda: griffin(eps_outside=True).blocks[2],
        LAYER,
        {},
        ("mistake", "rms_norm.eps_outside_sqrt", "temporal_pre_norm"),
    ),
    ("delta_hybrid", delta_hybrid, LM, {}, ("no pair", "layers.0.mixer", "norm")),
    ("delta_hybrid.attention_layer", lambda: delta_hybrid().layers[1], LAYER, {}, "pass"),
]
