"""PyTorch models ported from other frameworks by 2025-26 learners, each keeping the idioms of the framework it came
from (issue 46), in this project's own words. The judge meets them here first (measured with the judge frozen).

- a Flax/NNX port: ONE nested `nn.ParameterDict` named like Flax's paths (`params["layers_0"]["attn"]["query"]
  ["kernel"]`), DenseGeneral kernels (D, N, H) with (N, H) biases and an out kernel (N, H, D), einsum with named
  axes ("BTD,DNH->BTNH", "BTNH,NHD->BTD"), the query scaled before the scores, LayerNorm epsilon 1e-6 and the tanh
  GELU (Flax's defaults), the head tied to the embedder;
- an Equinox port: every layer takes ONE sequence (T, D) with no batch axis, its Linear (out, in) called on one
  vector and vmapped over the positions, the head function vmapped over the heads, the model `torch.vmap`-ing the
  whole sequence function over the batch; its causal mask (T, T) given unbatched, or built (B, T, T) for the batch
  and vmapped along with the ids;
- a Keras port of the miniature-GPT tutorial: Dense kernels (in, out), `LayerNormalization` written out with
  epsilon 1e-3 (Keras' default, inside the root), `MultiHeadAttention(num_heads, key_dim, output_shape)` with
  EinsumDense kernels (D, N, key_dim) and (N, key_dim) biases, Keras' own einsum equations and a (B, T, T) keep
  mask (1 = attend) lowered by 1e9; post-LN, no final norm;
- a tinygrad port: raw (in, out) weights, only elementwise ops and `.matmul`, softmax as exp(x - max) / sum and
  layer norm and GELU by hand, a -inf triu(1) mask added to the scores, the head tied to the token table;
- a TensorFlow port of the TF tutorial's encoder: weights stored (D_out, D_in) and applied by `torch.tensordot`
  over their axis 1 (x @ W.T), embeddings times sqrt(d_model) plus interleaved sinusoids, the padding mask
  (1 = pad) times -1e9 added to the logits, post-LN with epsilon 1e-6.

Mistakes, each in the second layer, and the verdicts decided from the math before the judge ran:

- the Flax port's scores einsum written "BTNH,BSNH->BNST" (the key axis where the query's goes): the scores are
  K Q^T, and with no rotary and no q/k norm that is the same function as Q' K'^T with the query and key kernels
  (and biases) exchanged, so the model is right: a pass (measured: its attention equals softmax(K Q^T) V with
  the causal mask to 7e-16), not attention.q_k_swapped, which is a mistake only where the two sides differ (RoPE, q/k
  norms);
- the Flax port's pre-scaled query divided by sqrt(d_head) once more (scores / d_head): attention.wrong_scale;
- the Equinox head's softmax over axis 0 of one head's (T, T) logits, the queries: attention.softmax_wrong_axis;
- the Equinox model's mask built as tril of ones of the ids' shape, (B, T), and vmapped along with the ids: sequence
  b gets one row keeping keys 0 .. b for every query (broadcast over the queries), in both blocks; no catalogued
  mask is that (it depends on the batch row), so the honest answer names the mask at blocks.0.attn;
- the Keras port's LayerNormalization with epsilon outside the root, (x - mean) / (sqrt(var) + 1e-3): at 1e-3 the
  two differ by about 5e-4 relative, plain in float64: layer_norm.eps_outside_sqrt;
- the Keras port's second block given the TF tutorial's look-ahead mask (1 - tril, 1 on the future) as Keras'
  keep mask, so that each query sees only the future (the last row nothing: its keys all lowered alike), which is
  attention.mask_inverted;
- the tinygrad port's softmax without the max subtracted: equal in float64 at ordinary scores (measured 7e-15 on
  the logits), but it overflows in float32 once the scores reach ~1e2, which the judge's scaled-scores probe
  reaches: attention.no_max_subtraction;
- the tinygrad port's second-block wo read as x.matmul(wo.T), an (in, out) kernel used as (out, in): a square
  weight read the other way round is another linear map, the same model family: a pass (only loading someone
  else's weights would tell);
- the TF port's second-layer wv applied by tensordot over axis 0 (the (D_out, D_in) weight read as (in, out)): a
  pass, for the same reason;
- the TF port's padding mask inverted, (1 - mask) * -1e9 (the real keys lowered, the padding kept), which is
  attention.mask_inverted;
- the TF port's padding put on the queries' rows (mask[:, None, :, None]) and ADDED: a row lowered by 1e9
  everywhere is the same row after the softmax, so no key is hidden anywhere (measured: equal to the model with
  no mask in its second layer to 3e-8, the rounding of s - 1e9): attention.mask_ignored, not padding_on_queries
  (whose masked rows the reference fills).

First met: 2 of 17 right (eqx_vmap_lm and its batch-built mask). Wrong:

- the four Flax cases: FAILED, "unexplained: (the module)" at layers_0's query kernel with no id: the (N, H)
  biases of the query, key and value are not read (mapped "held at zero: the user's layer has no bias"), and
  F.layer_norm's eps=1e-6 is not read (1e-5 assumed); with the biases zeroed and layer_norm_eps=1e-6 given, the
  model and the exchanged-axes one pass (the map exchanging query and key);
- the three Keras cases: FAILED, "unexplained", the same unread (N, key_dim) biases; with them zeroed the model
  passes and both mistakes are named (eps 1e-3 read from the hand-written norm);
- the Equinox softmax over axis 0 and the mask of the ids' shape: "could not judge: RuntimeError: Either your
  tensor may have escaped from inside a function being vmapped" (divergence.scan turns a hooked submodule's
  output, captured inside torch.vmap, into NumPy);
- the three tinygrad cases: "could not judge: ... cannot reshape array of size 26 into shape (32,)": the hand
  layer norm's bias h.0.ln_1_b is linked to the reference's output_proj.bias (measured after: the hand norm in a
  module of its own still fails so; F.layer_norm on the block's loose ln_1_w / ln_1_b is said as "the layer has no
  norm with a learned scale": neither the hand formula nor loose norm parameters are read as a norm);
- the four TF cases: "differs at enc_layers.0: the attention's queries and keys and values are no projection's
  output: ... read as it is": torch.tensordot is not read as a projection (nor is x @ w.T + b: "matmul ...
  computes what the reference's layer does not"); with F.linear in its place the model and the wv case pass and
  the two mask mistakes are named as expected above.

Fixed since: all 17 right. torch.tensordot is recorded as the einsum it is; a parameter of any shape added to a
projection's output, laid out as its trailing axes, is that projection's bias (Keras' and Flax's (N, Dh) biases, TF's
`bdense` that no name pairs, x @ w.T + b alike); F.layer_norm's eps is read from the call; a shift added to a scaled
normalised x is that norm's bias (the hand layer norm on loose ln_1_w / ln_1_b); the parts' outputs are captured
with torch.vmap run as its loop (a part called per sequence: its calls stacked); an attention whose weights sit in a
container no code calls (Flax's params tree) is read from the recorded forward; and a mask that hides the same keys
of several ids from every query (one made from the batch's row, not the ids) is said at its attention.

CASES lists (name, factory, level, keywords for check.module, expected), as parity_tests/corpus/unseen.py's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

D, H, V, T_MAX = 32, 4, 26, 16
HD = D // H
FF = 4 * D


def _jitter(model: nn.Module) -> nn.Module:
    """Norm gains and biases moved off their 1s and 0s, so that a trained model's values are checked."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _normal(*shape: int, fan_in: int) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape) / math.sqrt(fan_in))


# -- a Flax/NNX port: one nested ParameterDict named like Flax's paths, (in, out) kernels, einsum with named axes --


def _tree(node: dict) -> nn.ParameterDict:
    """A nested dict of tensors as nested nn.ParameterDicts: params["layers_0"]["attn"]["query"]["kernel"]."""
    return nn.ParameterDict({k: _tree(v) if isinstance(v, dict) else nn.Parameter(v) for k, v in node.items()})


def _flax_layer() -> dict:
    def norm() -> dict:
        return {"scale": torch.ones(D), "bias": torch.zeros(D)}

    def heads_in() -> dict:  # DenseGeneral(features=(N, H)): kernel (D, N, H), bias (N, H)
        return {"kernel": torch.randn(D, H, HD) / math.sqrt(D), "bias": 0.1 * torch.randn(H, HD)}

    return {
        "pre_attention_norm": norm(),
        "attn": {
            "query": heads_in(),
            "key": heads_in(),
            "value": heads_in(),
            "out": {"kernel": torch.randn(H, HD, D) / math.sqrt(D), "bias": torch.zeros(D)},
        },
        "pre_mlp_norm": norm(),
        "mlp": {
            "fc1": {"kernel": torch.randn(D, FF) / math.sqrt(D), "bias": torch.zeros(FF)},
            "fc2": {"kernel": torch.randn(FF, D) / math.sqrt(FF), "bias": torch.zeros(D)},
        },
    }


class FlaxLM(nn.Module):
    """Pre-LN GPT, LayerNorm epsilon 1e-6 (Flax's default), nn.gelu (tanh, Flax's default), the query scaled before
    the scores as flax.linen.dot_product_attention does, the head tied to the embedder (embedder.attend).
    `second`: "plain", "swapped" (the scores' einsum names the key axis where the query's goes, "BTNH,BSNH->BNST":
    K Q^T, which without rotary or q/k norms is the same model with the query and key kernels exchanged), "twice"
    (the mistake: the pre-scaled query divided by sqrt(d_head) again)."""

    def __init__(self, second: str = "plain") -> None:
        super().__init__()
        self.second = second
        self.params = _tree(
            {
                "embedder": {"embedding": torch.randn(V, D)},
                "pos_embedding": {"embedding": 0.1 * torch.randn(T_MAX, D)},
                "layers_0": _flax_layer(),
                "layers_1": _flax_layer(),
                "final_norm": {"scale": torch.ones(D), "bias": torch.zeros(D)},
            }
        )

    @staticmethod
    def _norm(x: torch.Tensor, p: nn.ParameterDict) -> torch.Tensor:
        return F.layer_norm(x, (D,), p["scale"], p["bias"], eps=1e-6)

    def _attention(self, x: torch.Tensor, p: nn.ParameterDict, how: str) -> torch.Tensor:
        q = torch.einsum("BTD,DNH->BTNH", x, p["query"]["kernel"]) + p["query"]["bias"]
        k = torch.einsum("BSD,DNH->BSNH", x, p["key"]["kernel"]) + p["key"]["bias"]
        v = torch.einsum("BSD,DNH->BSNH", x, p["value"]["kernel"]) + p["value"]["bias"]
        q = q / math.sqrt(HD)
        if how == "twice":
            q = q / math.sqrt(HD)
        spec = "BTNH,BSNH->BNST" if how == "swapped" else "BTNH,BSNH->BNTS"
        logits = torch.einsum(spec, q, k)
        T = x.shape[1]
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))
        logits = torch.where(causal, logits, torch.finfo(logits.dtype).min)
        weights = torch.softmax(logits, dim=-1)
        y = torch.einsum("BNTS,BSNH->BTNH", weights, v)
        return torch.einsum("BTNH,NHD->BTD", y, p["out"]["kernel"]) + p["out"]["bias"]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        p = self.params
        x = p["embedder"]["embedding"][tokens] + p["pos_embedding"]["embedding"][: tokens.shape[1]]
        for i in range(2):
            layer = p[f"layers_{i}"]
            x = x + self._attention(self._norm(x, layer["pre_attention_norm"]), layer["attn"], self.second * i)
            h = self._norm(x, layer["pre_mlp_norm"])
            h = F.gelu(h @ layer["mlp"]["fc1"]["kernel"] + layer["mlp"]["fc1"]["bias"], approximate="tanh")
            x = x + h @ layer["mlp"]["fc2"]["kernel"] + layer["mlp"]["fc2"]["bias"]
        x = self._norm(x, p["final_norm"])
        return torch.einsum("BTD,VD->BTV", x, p["embedder"]["embedding"])


def flax_lm(second: str = "plain") -> FlaxLM:
    torch.manual_seed(0)
    return _jitter(FlaxLM(second))  # type: ignore[return-value]


# -- an Equinox port: each layer takes ONE sequence (T, D), the model vmaps it over the batch ---------------------


class EqxLinear(nn.Module):
    """eqx.nn.Linear: weight (out, in), called on one vector (in,) -> (out,)."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = _normal(n_out, n_in, fan_in=n_in)
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight @ x + self.bias


class EqxLayerNorm(nn.Module):
    """eqx.nn.LayerNorm(shape=D): one vector."""

    def __init__(self) -> None:
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(D)), nn.Parameter(torch.zeros(D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (D,), self.weight, self.bias, eps=1e-5)


def _eqx_head(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, axis: int) -> torch.Tensor:
    """One head of one sequence, (T, HD) x3 and a keep mask -> (T, HD); softmax over `axis` (the keys: -1)."""
    logits = q @ k.T / math.sqrt(q.shape[-1])
    logits = torch.where(mask, logits, -torch.inf)
    return torch.softmax(logits, dim=axis) @ v


class EqxAttention(nn.Module):
    """eqx.nn.MultiheadAttention on one sequence: the projections vmapped over the positions, the head function
    over the heads. `axis`: the softmax's (the mistake: 0, the queries of one head's (T, T) logits)."""

    axis = -1

    def __init__(self) -> None:
        super().__init__()
        self.query_proj, self.key_proj, self.value_proj, self.output_proj = (EqxLinear(D, D) for _ in range(4))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        T = x.shape[0]
        q, k, v = (torch.vmap(proj)(x).view(T, H, HD) for proj in (self.query_proj, self.key_proj, self.value_proj))
        head = torch.vmap(_eqx_head, in_dims=(1, 1, 1, None, None), out_dims=1)
        return torch.vmap(self.output_proj)(head(q, k, v, mask, self.axis).reshape(T, D))


class EqxSoftmaxOverQueries(EqxAttention):
    axis = 0


class EqxMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = EqxLinear(D, FF), EqxLinear(FF, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class EqxBlock(nn.Module):
    def __init__(self, attention: type[EqxAttention] = EqxAttention) -> None:
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = EqxLayerNorm(), attention(), EqxLayerNorm(), EqxMLP()

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(torch.vmap(self.ln1)(x), mask)
        return x + torch.vmap(self.mlp)(torch.vmap(self.ln2)(x))


class EqxLM(nn.Module):
    """`mask`: "sequence" (one (T, T) causal mask, in_dims None), "batch" (a (B, T, T) causal mask vmapped along
    with the ids: each sequence gets its own copy, right), "ids_shape" (the mistake: tril of ones of the ids' shape,
    (B, T), vmapped along: sequence b gets the row (T,) keeping keys 0 .. b for every query)."""

    def __init__(self, mask: str = "sequence", second: type[EqxAttention] = EqxAttention) -> None:
        super().__init__()
        self.mask = mask
        self.token_embedding = nn.Parameter(torch.randn(V, D))
        self.position_embedding = nn.Parameter(0.1 * torch.randn(T_MAX, D))
        self.blocks = nn.ModuleList([EqxBlock(), EqxBlock(second)])
        self.ln_f = EqxLayerNorm()
        self.lm_head = EqxLinear(D, V)

    def _sequence(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.token_embedding[tokens] + self.position_embedding[: tokens.shape[0]]
        for block in self.blocks:
            x = block(x, mask)
        return torch.vmap(self.lm_head)(torch.vmap(self.ln_f)(x))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        B, T = ids.shape
        if self.mask == "batch":
            mask, dims = torch.ones(B, T, T, dtype=torch.bool, device=ids.device).tril(), 0
        elif self.mask == "ids_shape":
            mask, dims = torch.ones(ids.shape, dtype=torch.bool, device=ids.device).tril(), 0
        else:
            mask, dims = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril(), None
        return torch.vmap(self._sequence, in_dims=(0, dims))(ids, mask)


def eqx_lm(mask: str = "sequence", second: type[EqxAttention] = EqxAttention) -> EqxLM:
    torch.manual_seed(0)
    return _jitter(EqxLM(mask, second))  # type: ignore[return-value]


# -- a Keras port: Dense kernels (in, out), LayerNormalization(epsilon=1e-3), MultiHeadAttention(key_dim, ...) ---


class Dense(nn.Module):
    def __init__(self, units: int, n_in: int, activation: str | None = None) -> None:
        super().__init__()
        self.kernel, self.bias, self.activation = (
            _normal(n_in, units, fan_in=n_in),
            nn.Parameter(torch.zeros(units)),
            activation,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.matmul(x, self.kernel) + self.bias
        return F.relu(y) if self.activation == "relu" else y


class LayerNormalization(nn.Module):
    """keras.layers.LayerNormalization: gamma, beta, epsilon 1e-3 (Keras' default) inside the root; `eps_outside`
    (the mistake): (x - mean) / (sqrt(variance) + epsilon)."""

    def __init__(self, epsilon: float = 1e-3, eps_outside: bool = False) -> None:
        super().__init__()
        self.gamma, self.beta = nn.Parameter(torch.ones(D)), nn.Parameter(torch.zeros(D))
        self.epsilon, self.eps_outside = epsilon, eps_outside

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        variance = ((x - mean) ** 2).mean(-1, keepdim=True)
        if self.eps_outside:
            return (x - mean) / (torch.sqrt(variance) + self.epsilon) * self.gamma + self.beta
        return (x - mean) * torch.rsqrt(variance + self.epsilon) * self.gamma + self.beta


class MultiHeadAttention(nn.Module):
    """keras.layers.MultiHeadAttention(num_heads, key_dim, output_shape): EinsumDense kernels (D, N, key_dim) and
    (N, key_dim, output_shape), the query scaled by 1 / sqrt(key_dim), Keras' einsum equations, attention_mask
    (B, T_q, T_k) with 1 where a query may attend, the rest lowered by 1e9 before the softmax."""

    def __init__(self, num_heads: int, key_dim: int, output_shape: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.num_heads, self.key_dim, self.dropout = num_heads, key_dim, dropout
        for name in ("query", "key", "value"):
            setattr(self, f"{name}_kernel", _normal(D, num_heads, key_dim, fan_in=D))
            setattr(self, f"{name}_bias", nn.Parameter(0.1 * torch.randn(num_heads, key_dim)))
        self.output_kernel = _normal(num_heads, key_dim, output_shape, fan_in=num_heads * key_dim)
        self.output_bias = nn.Parameter(torch.zeros(output_shape))

    def forward(self, query: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        q = torch.einsum("abc,cde->abde", query, self.query_kernel) + self.query_bias
        k = torch.einsum("abc,cde->abde", value, self.key_kernel) + self.key_bias
        v = torch.einsum("abc,cde->abde", value, self.value_kernel) + self.value_bias
        q = q * (1.0 / math.sqrt(self.key_dim))
        scores = torch.einsum("aecd,abcd->acbe", k, q)
        scores = scores + (1.0 - attention_mask[:, None].to(scores.dtype)) * -1e9
        probs = F.dropout(torch.softmax(scores, dim=-1), self.dropout, training=self.training)
        out = torch.einsum("acbe,aecd->abcd", probs, v)
        return torch.einsum("abcd,cde->abe", out, self.output_kernel) + self.output_bias


class KerasBlock(nn.Module):
    """The Keras miniature-GPT block: post-LN, attention then a Dense(relu) / Dense feed-forward."""

    def __init__(self, eps_outside: bool = False) -> None:
        super().__init__()
        self.att = MultiHeadAttention(H, HD, D)
        self.ffn = nn.Sequential(Dense(FF, D, "relu"), Dense(D, FF))
        self.layernorm1, self.layernorm2 = LayerNormalization(eps_outside=eps_outside), LayerNormalization()

    def forward(self, inputs: torch.Tensor, causal_mask: torch.Tensor) -> torch.Tensor:
        attention_output = F.dropout(self.att(inputs, inputs, causal_mask), 0.1, training=self.training)
        out1 = self.layernorm1(inputs + attention_output)
        return self.layernorm2(out1 + F.dropout(self.ffn(out1), 0.1, training=self.training))


class KerasGPT(nn.Module):
    """TokenAndPositionEmbedding, two blocks, a Dense to the vocabulary (no final norm, as the tutorial). `second`:
    "keep" (the causal_attention_mask, 1 = attend), "look_ahead" (the mistake: the second block given the TF
    tutorial's look-ahead mask, 1 - tril: 1 on the future, which Keras reads as the keys to attend)."""

    def __init__(self, second: str = "keep", eps_outside: bool = False) -> None:
        super().__init__()
        self.second = second
        self.token_emb = nn.Parameter(torch.randn(V, D))
        self.pos_emb = nn.Parameter(0.1 * torch.randn(T_MAX, D))
        self.blocks = nn.ModuleList([KerasBlock(), KerasBlock(eps_outside)])
        self.output_dense = Dense(V, D)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        B, T = ids.shape
        causal_mask = torch.tril(torch.ones(T, T, device=ids.device)).expand(B, T, T)  # causal_attention_mask
        x = self.token_emb[ids] + self.pos_emb[:T]
        x = self.blocks[0](x, causal_mask)
        x = self.blocks[1](x, 1.0 - causal_mask if self.second == "look_ahead" else causal_mask)
        return self.output_dense(x)


def keras_gpt(second: str = "keep", eps_outside: bool = False) -> KerasGPT:
    torch.manual_seed(0)
    return _jitter(KerasGPT(second, eps_outside))  # type: ignore[return-value]


# -- a tinygrad port: raw (in, out) weights, only elementwise ops and .matmul, softmax and layer norm by hand ------


def _softmax(x: torch.Tensor, subtract_max: bool = True) -> torch.Tensor:
    e = (x - x.max(-1, keepdim=True).values).exp() if subtract_max else x.exp()
    return e / e.sum(-1, keepdim=True)


def _layernorm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    centred = x - mean
    return centred * ((centred * centred).mean(-1, keepdim=True) + eps).rsqrt() * weight + bias


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())


class TinyAttention(nn.Module):
    """wq, wk, wv, wo (in, out) with biases; scores plus a -inf triu(1) mask, the softmax by hand. `max_subtracted`
    False: the mistake, exp(s) / sum(exp(s)); `wo_transposed`: wo applied as x.matmul(wo.T) (a square weight read
    the other way round: a different linear map, a model as valid as the other)."""

    def __init__(self, max_subtracted: bool = True, wo_transposed: bool = False) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (_normal(D, D, fan_in=D) for _ in range(4))
        self.bq, self.bk, self.bv, self.bo = (nn.Parameter(torch.zeros(D)) for _ in range(4))
        self.max_subtracted, self.wo_transposed = max_subtracted, wo_transposed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = (
            (x.matmul(w) + b).reshape(B, T, H, HD).permute(0, 2, 1, 3)
            for w, b in ((self.wq, self.bq), (self.wk, self.bk), (self.wv, self.bv))
        )
        mask = torch.full((1, 1, T, T), float("-inf"), dtype=x.dtype, device=x.device).triu(1)
        scores = q.matmul(k.transpose(-2, -1)) * (1.0 / math.sqrt(HD)) + mask
        y = _softmax(scores, self.max_subtracted).matmul(v).permute(0, 2, 1, 3).reshape(B, T, D)
        return y.matmul(self.wo.T if self.wo_transposed else self.wo) + self.bo


class TinyBlock(nn.Module):
    def __init__(self, **attention: bool) -> None:
        super().__init__()
        self.attn = TinyAttention(**attention)
        self.ln_1_w, self.ln_1_b = nn.Parameter(torch.ones(D)), nn.Parameter(torch.zeros(D))
        self.ln_2_w, self.ln_2_b = nn.Parameter(torch.ones(D)), nn.Parameter(torch.zeros(D))
        self.c_fc, self.c_fc_b = _normal(D, FF, fan_in=D), nn.Parameter(torch.zeros(FF))
        self.c_proj, self.c_proj_b = _normal(FF, D, fan_in=FF), nn.Parameter(torch.zeros(D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(_layernorm(x, self.ln_1_w, self.ln_1_b))
        return (
            h
            + _gelu(_layernorm(h, self.ln_2_w, self.ln_2_b).matmul(self.c_fc) + self.c_fc_b).matmul(self.c_proj)
            + self.c_proj_b
        )


class TinyGPT(nn.Module):
    def __init__(self, **second: bool) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Parameter(torch.randn(V, D)), nn.Parameter(0.1 * torch.randn(T_MAX, D))
        self.h = nn.ModuleList([TinyBlock(), TinyBlock(**second)])
        self.ln_f_w, self.ln_f_b = nn.Parameter(torch.ones(D)), nn.Parameter(torch.zeros(D))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte[tokens] + self.wpe[: tokens.shape[1]]
        for block in self.h:
            x = block(x)
        return _layernorm(x, self.ln_f_w, self.ln_f_b).matmul(self.wte.T)


def tiny_gpt(**second: bool) -> TinyGPT:
    torch.manual_seed(0)
    return _jitter(TinyGPT(**second))  # type: ignore[return-value]


# -- a TensorFlow port: weights stored (D_out, D_in), applied by torch.tensordot; the TF tutorial's encoder --------


def _tf_dense(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, axis: int = 1) -> torch.Tensor:
    """tf.tensordot(x, w, axes=[[2], [axis]]) + b: axis 1 reads w as (D_out, D_in), x @ w.T."""
    return torch.tensordot(x, w, dims=([-1], [axis])) + b


def _sinusoids(n: int, d: int) -> torch.Tensor:
    """The TF tutorial's positional_encoding: angle pos / 10000^(2 (i // 2) / d), sin on even, cos on odd."""
    i = torch.arange(d, dtype=torch.float64)
    angles = torch.arange(n, dtype=torch.float64)[:, None] / 10000 ** (2 * (i // 2) / d)
    angles[:, 0::2], angles[:, 1::2] = angles[:, 0::2].sin(), angles[:, 1::2].cos()
    return angles.float()


class TFEncoderLayer(nn.Module):
    """Post-LN, LayerNormalization(epsilon=1e-6), the padding mask (1 = padding) times -1e9 added to the logits.
    `mask_on`: "keys" (mask[:, None, None, :]), "queries" (the mistake: mask[:, None, :, None], the padded rows
    lowered instead of the padded columns); `inverted`: the mistake, (1 - mask) * -1e9; `wv_in_out`: wv read by
    tensordot over its axis 0 (a square weight read as (in, out): a different linear map, as valid)."""

    def __init__(self, mask_on: str = "keys", inverted: bool = False, wv_in_out: bool = False) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.dense = (_normal(D, D, fan_in=D) for _ in range(4))
        self.bq, self.bk, self.bv, self.bdense = (nn.Parameter(torch.zeros(D)) for _ in range(4))
        self.ffn_1, self.ffn_1_b = _normal(FF, D, fan_in=D), nn.Parameter(torch.zeros(FF))
        self.ffn_2, self.ffn_2_b = _normal(D, FF, fan_in=FF), nn.Parameter(torch.zeros(D))
        self.layernorm1, self.layernorm2 = nn.LayerNorm(D, eps=1e-6), nn.LayerNorm(D, eps=1e-6)
        self.mask_on, self.inverted, self.wv_in_out = mask_on, inverted, wv_in_out

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], -1, H, HD).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k = self._split(_tf_dense(x, self.wq, self.bq)), self._split(_tf_dense(x, self.wk, self.bk))
        v = self._split(_tf_dense(x, self.wv, self.bv, 0 if self.wv_in_out else 1))
        logits = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(HD)
        mask = padding[:, None, :, None] if self.mask_on == "queries" else padding[:, None, None, :]
        logits = logits + ((1.0 - mask) if self.inverted else mask) * -1e9
        attn = torch.matmul(F.dropout(torch.softmax(logits, -1), 0.1, self.training), v)
        attn = _tf_dense(attn.permute(0, 2, 1, 3).reshape(B, T, D), self.dense, self.bdense)
        out1 = self.layernorm1(x + F.dropout(attn, 0.1, self.training))
        ffn = _tf_dense(F.relu(_tf_dense(out1, self.ffn_1, self.ffn_1_b)), self.ffn_2, self.ffn_2_b)
        return self.layernorm2(out1 + F.dropout(ffn, 0.1, self.training))


class TFEncoder(nn.Module):
    """Embedding times sqrt(d_model) plus the sinusoids, two layers; the padding mask made from the ids (0 = pad)."""

    def __init__(self, **second: object) -> None:
        super().__init__()
        self.embedding = nn.Parameter(torch.randn(V, D) / math.sqrt(D))
        self.register_buffer("pos_encoding", _sinusoids(T_MAX, D), persistent=False)
        self.enc_layers = nn.ModuleList([TFEncoderLayer(), TFEncoderLayer(**second)])  # type: ignore[arg-type]

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        padding = (inp == 0).to(self.embedding.dtype)  # create_padding_mask: 1 where the id is the pad
        T = inp.shape[1]
        x = self.embedding[inp] * math.sqrt(D) + self.pos_encoding[:T].to(self.embedding.dtype)
        for layer in self.enc_layers:
            x = layer(x, padding)
        return x


def tf_encoder(**second: object) -> TFEncoder:
    torch.manual_seed(0)
    return _jitter(TFEncoder(**second))  # type: ignore[return-value]


CASES = [
    ("flax_nnx_lm", flax_lm, "transformer_lm", {}, "pass"),
    ("flax_nnx_lm.scores_einsum_axes_exchanged_second_layer", lambda: flax_lm("swapped"), "transformer_lm", {}, "pass"),
    (
        "flax_nnx_lm.query_scaled_twice_second_layer",
        lambda: flax_lm("twice"),
        "transformer_lm",
        {},
        ("mistake", "attention.wrong_scale", "params.layers_1.attn"),
    ),
    ("eqx_vmap_lm", eqx_lm, "transformer_lm", {}, "pass"),
    ("eqx_vmap_lm.batch_mask_vmapped", lambda: eqx_lm("batch"), "transformer_lm", {}, "pass"),
    (
        "eqx_vmap_lm.softmax_axis_0_second_block",
        lambda: eqx_lm(second=EqxSoftmaxOverQueries),
        "transformer_lm",
        {},
        ("mistake", "attention.softmax_wrong_axis", "blocks.1.attn"),
    ),
    (
        "eqx_vmap_lm.mask_of_ids_shape",
        lambda: eqx_lm("ids_shape"),
        "transformer_lm",
        {},
        ("no pair", "blocks.0.attn", "mask"),
    ),
    ("keras_gpt", keras_gpt, "transformer_lm", {}, "pass"),
    (
        "keras_gpt.eps_outside_root_second_block",
        lambda: keras_gpt(eps_outside=True),
        "transformer_lm",
        {},
        ("mistake", "layer_norm.eps_outside_sqrt", "blocks.1.layernorm1"),
    ),
    (
        "keras_gpt.look_ahead_mask_second_block",
        lambda: keras_gpt("look_ahead"),
        "transformer_lm",
        {},
        ("mistake", "attention.mask_inverted", "blocks.1.att"),
    ),
    ("tinygrad_gpt", tiny_gpt, "transformer_lm", {}, "pass"),
    (
        "tinygrad_gpt.wo_read_transposed_second_block",
        lambda: tiny_gpt(wo_transposed=True),
        "transformer_lm",
        {},
        "pass",
    ),
    (
        "tinygrad_gpt.softmax_without_max_second_block",
        lambda: tiny_gpt(max_subtracted=False),
        "transformer_lm",
        {},
        ("mistake", "attention.no_max_subtraction", "h.1.attn"),
    ),
    ("tf_encoder", tf_encoder, "encoder_model", {}, "pass"),
    ("tf_encoder.wv_read_in_out_second_layer", lambda: tf_encoder(wv_in_out=True), "encoder_model", {}, "pass"),
    (
        "tf_encoder.padding_mask_inverted_second_layer",
        lambda: tf_encoder(inverted=True),
        "encoder_model",
        {},
        ("mistake", "attention.mask_inverted", "enc_layers.1"),
    ),
    (
        "tf_encoder.padding_added_on_queries_second_layer",
        lambda: tf_encoder(mask_on="queries"),
        "encoder_model",
        {},
        ("mistake", "attention.mask_ignored", "enc_layers.1"),
    ),
]
