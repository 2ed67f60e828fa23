r"""Sentence embeddings as sentence-transformers computes them, every step after tokenisation in NumPy, with its
backward pass by hand.

    from numpy_transformer import sentence
    model = sentence.load("all-MiniLM-L6-v2/")                    # a sentence-transformers folder
    embeddings = model.encode(["A cat sat.", "Hello!"])            # (N, D), as SentenceTransformer.encode
    batch = model.tokenizer.batch(texts)                           # ids, attention mask (B, T)
    e = model.forward(batch.ids, batch.attention_mask)             # (B, D), the same embeddings, cache kept
    model.backward(de)                                             # fills model.grads (encoder and Dense layers)

A sentence-transformers model is a pipeline (its modules.json): the transformer's last hidden states h (B, T, D),
then Pooling (one vector per text, under the attention mask), Dense layers (a linear layer and an activation) and
Normalize (unit length). Each is a forward/backward pair here; the transformer is our EncoderModel (hf.load), and
the folder is read by transformer_spec.sentence (shared with torch_transformer.sentence).

Pooling. With m (B, T) the positions pooled (the attention mask, less the prompt's tokens when include_prompt is
false), every mode but max is a weighted sum of the hidden states, :math:`e_b = \sum_t w_{bt}\, h_{bt}`:

- mean: :math:`w_{bt} = m_{bt} / \max(\sum_t m_{bt}, 10^{-9})`; mean_sqrt_len_tokens: divided by the root of
  that count instead;
- weightedmean: :math:`w_{bt} \propto m_{bt}\,(t + 1 - f_b)`, with :math:`f_b` the first real token of the row
  (left padding shifts the weights, a left-out prompt does not), normalised to sum 1;
- cls: 1 at the first pooled position; lasttoken: 1 at the last one (0 if the row pools nothing);

and max takes, per feature, the largest value over the pooled positions (-inf where none). Its gradient goes to the
position it took; the others' is :math:`dh_{bt} = w_{bt}\, de_b`. Several modes are concatenated in order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

from transformer_spec.sentence import (
    Batch,
    DenseSpec,
    NormalizeSpec,
    PoolingSpec,
    SentenceFolder,
    check_texts,
    length_order,
    read_folder,
)

from .layers import (
    LinearCache,
    gelu_backward,
    gelu_forward,
    l2_normalize_backward,
    l2_normalize_forward,
    linear_backward,
    linear_forward,
    relu_backward,
    relu_forward,
    silu_backward,
    silu_forward,
    tanh_backward,
    tanh_forward,
)
from .model import EncoderModel
from .validation import check_attention_mask, check_float_array

# ----------------------------------------------------------------------------------------------
# Pooling under the attention mask: (B, T, D) -> (B, len(modes) * D).


@dataclass(frozen=True, slots=True)
class PoolingCache:
    hidden_shape: tuple[int, ...]  # (B, T, D)
    weights: tuple  # per mode: the (B, T) weights of a weighted-sum mode, or None for max
    taken: tuple  # per mode: the (B, D) positions max took, or None


def pooled_positions(attention_mask: np.ndarray, prompt_length: int = 0) -> np.ndarray:
    """The positions pooled, (B, T) bool: the real tokens, less the first `prompt_length` of each row (counted from
    its first real token, so left padding is skipped), as sentence-transformers leaves a prompt out."""
    mask = attention_mask.astype(bool)
    if not prompt_length:
        return mask
    first = mask.argmax(axis=1)  # (B,): the first real token
    positions = np.arange(mask.shape[1])
    return mask & (positions[None, :] >= (first + prompt_length)[:, None])


def pooling_weights(mode: str, attention_mask: np.ndarray, pooled: np.ndarray, dtype) -> np.ndarray:
    """The (B, T) weights w of a weighted-sum mode, e_b = sum_t w_bt h_bt (see the module docstring)."""
    B, T = pooled.shape
    m = pooled.astype(dtype)
    rows = np.arange(B)
    if mode in ("mean", "mean_sqrt_len_tokens"):
        count = np.maximum(m.sum(axis=1, keepdims=True), dtype.type(1e-9))  # (B, 1)
        return m / (count if mode == "mean" else np.sqrt(count))
    if mode == "weightedmean":
        first = attention_mask.astype(bool).argmax(axis=1)  # (B,): positions count from the first real token
        w = m * (np.arange(1, T + 1)[None, :] - first[:, None]).astype(dtype)  # (B, T)
        return w / np.maximum(w.sum(axis=1, keepdims=True), dtype.type(1e-9))
    w = np.zeros((B, T), dtype)
    if mode == "cls":
        w[rows, pooled.argmax(axis=1)] = 1  # the first pooled position (0 when there is none)
    else:  # lasttoken: the last pooled position, and nothing when the row pools nothing
        last = T - 1 - pooled[:, ::-1].argmax(axis=1)
        w[rows, last] = pooled[rows, last]
    return w


def pooling_forward(
    hidden: np.ndarray, attention_mask: np.ndarray, modes=("mean",), prompt_length: int = 0
) -> tuple[np.ndarray, PoolingCache]:
    """hidden (B, T, D), attention_mask (B, T) 1 = a real token -> sentence vectors (B, len(modes) * D), the modes
    concatenated in order; the first prompt_length tokens of each row are left out (include_prompt false)."""
    pooled = pooled_positions(attention_mask, prompt_length)  # (B, T) bool
    outs: list[np.ndarray] = []
    weights: list[np.ndarray | None] = []
    taken: list[np.ndarray | None] = []
    for mode in modes:
        if mode == "max":
            masked = np.where(pooled[..., None], hidden, -np.inf)  # (B, T, D)
            index = masked.argmax(axis=1)  # (B, D): the position each feature is taken from
            outs.append(np.take_along_axis(masked, index[:, None, :], axis=1)[:, 0])  # (B, D)
            weights.append(None)
            taken.append(index)
        else:
            w = pooling_weights(mode, attention_mask, pooled, hidden.dtype)  # (B, T)
            outs.append((w[:, None, :] @ hidden)[:, 0])  # (B, 1, T) @ (B, T, D) -> (B, D)
            weights.append(w)
            taken.append(None)
    return np.concatenate(outs, axis=1), PoolingCache(hidden.shape, tuple(weights), tuple(taken))


def pooling_backward(dpooled: np.ndarray, cache: PoolingCache) -> np.ndarray:
    r"""Gradient of the pooling, dpooled (B, len(modes) * D) -> dhidden (B, T, D), each mode's slice of dpooled
    sent back through its own rule and the contributions added:

    .. math::

        dh_{bt} \mathrel{+}= w_{bt}\, de_b \quad \text{(weighted sums)}

        dh_{b, \tau(b, d), d} \mathrel{+}= de_{bd} \quad \text{(max, } \tau \text{ the position it took)}
    """
    B, T, D = cache.hidden_shape
    dhidden = np.zeros(cache.hidden_shape, dpooled.dtype)
    for k, (w, index) in enumerate(zip(cache.weights, cache.taken, strict=True)):
        de = dpooled[:, k * D : (k + 1) * D]  # (B, D)
        if w is not None:
            # forward: e = (w[:, None, :] @ h)[:, 0]
            dhidden += w[:, :, None] * de[:, None, :]  # (B, T, D)
        else:
            # forward: e = masked[b, index[b, d], d]
            routed = np.zeros(cache.hidden_shape, dpooled.dtype)
            np.put_along_axis(routed, index[:, None, :], de[:, None, :], axis=1)
            dhidden += routed
    return dhidden


# ----------------------------------------------------------------------------------------------
# Dense: y = act(x W^T + b) (+ x, or + x R^T, with use_residual).


def identity_forward(x: np.ndarray) -> tuple[np.ndarray, None]:
    return x, None


def identity_backward(dout: np.ndarray, cache: None) -> np.ndarray:
    return dout


DENSE_ACTIVATIONS: dict[str, tuple[Callable, Callable]] = {
    "identity": (identity_forward, identity_backward),
    "tanh": (tanh_forward, tanh_backward),
    "relu": (relu_forward, relu_backward),
    "gelu": (gelu_forward, gelu_backward),
    "silu": (silu_forward, silu_backward),
}


@dataclass(frozen=True, slots=True)
class DenseCache:
    linear: LinearCache
    activation: object  # the activation's own cache
    activation_name: str
    residual: LinearCache | None  # the residual projection's, when it has one
    identity_residual: bool  # use_residual with in == out: y += x


def dense_forward(
    x: np.ndarray, params: dict, activation: str = "tanh", use_residual: bool = False
) -> tuple[np.ndarray, DenseCache]:
    r"""sentence-transformers' Dense: x (N, in) -> y (N, out),

    .. math::

        y = \phi(x W^\top + b) \; [+\, x \text{ or } x R^\top]

    params: linear.weight W (out, in), linear.bias b (out,) when it has one, residual.weight R (out, in) when
    use_residual and in != out; activation: a key of DENSE_ACTIVATIONS."""
    act_forward, _ = DENSE_ACTIVATIONS[activation]
    z, lin_cache = linear_forward(x, params["linear.weight"], params.get("linear.bias"))  # (N, out)
    y, act_cache = act_forward(z)
    res_cache, identity = None, False
    if use_residual:
        if "residual.weight" in params:
            r, res_cache = linear_forward(x, params["residual.weight"], None)  # (N, out)
            y = y + r
        else:
            y, identity = y + x, True
    return y, DenseCache(lin_cache, act_cache, activation, res_cache, identity)


def dense_backward(dout: np.ndarray, cache: DenseCache) -> tuple[np.ndarray, dict]:
    r"""Gradients of the Dense layer: dout (N, out) -> dx (N, in), grads {linear.weight, linear.bias,
    residual.weight} (those it has). With :math:`dz = dy \odot \phi'(z)`:

    .. math::

        dx = dz\, W \;[+\, dy \text{ or } dy\, R], \qquad dW = dz^\top x, \qquad db = \textstyle\sum_n dz_n,
        \qquad dR = dy^\top x
    """
    _, act_backward = DENSE_ACTIVATIONS[cache.activation_name]
    dz = act_backward(dout, cache.activation)  # y = act(z)
    dx, dweight, dbias = linear_backward(dz, cache.linear)  # z = x W^T + b
    grads = {"linear.weight": dweight}
    if dbias is not None:
        grads["linear.bias"] = dbias
    if cache.residual is not None:  # y += x R^T: the input's second path
        dx_res, grads["residual.weight"], _ = linear_backward(dout, cache.residual)
        dx = dx + dx_res
    elif cache.identity_residual:  # y += x
        dx = dx + dout
    return dx, grads


# ----------------------------------------------------------------------------------------------
# The model: the encoder, then the folder's modules in order.


@dataclass(frozen=True, slots=True)
class SentenceCache:
    steps: tuple  # per module after the transformer: its cache (PoolingCache, DenseCache, L2NormalizeCache)
    batch_shape: tuple[int, ...]  # (B, T)


class SentenceModel:
    """A sentence-transformers model in NumPy: `encoder` (an EncoderModel), then `modules` (the folder's Pooling,
    Dense and Normalize specs, in order); `tokenizer` the folder's (transformer_spec.sentence.SentenceTokenizer).

    params: the encoder's parameters under its names ("encoder.layers.0...", BERT's pooler left out: the embedding
    never reads it) and each Dense layer's as
    sentence-transformers' state dict names them ("2.linear.weight"): the arrays themselves, so an optimizer
    stepping params steps the model. grads: the same keys, filled by backward (added up until zero_grad)."""

    def __init__(self, encoder: EncoderModel, folder: SentenceFolder) -> None:
        if not isinstance(encoder, EncoderModel):
            kind = type(encoder).__name__
            raise ValueError(f"{folder.transformer_path}: the backbone is a {kind}; sentence embeddings here read "
                             f"an encoder's hidden states (BERT, RoBERTa, MPNet, ...)")  # fmt: skip
        self.encoder = encoder
        self.folder = folder
        self.tokenizer = folder.tokenizer
        self.modules = folder.modules
        self.dtype = encoder.dtype
        width = encoder.config.d_model
        dense_params: dict[str, np.ndarray] = {}
        for module in self.modules:
            if isinstance(module, PoolingSpec):
                if module.dimension != width:
                    raise ValueError(f"{folder.path}: Pooling expects width {module.dimension}, the transformer "
                                     f"gives {width}")  # fmt: skip
                width *= len(module.modes)
            elif isinstance(module, DenseSpec):
                if module.in_features != width:
                    raise ValueError(f"{folder.path}: Dense {module.name} takes {module.in_features} features, the "
                                     f"module before gives {width}")  # fmt: skip
                width = module.out_features
                for key, array in module.weights.items():
                    dense_params[f"{module.name}.{key}"] = np.ascontiguousarray(array, dtype=self.dtype)
        self.dimension = width  # D of the embeddings
        self.dense_params = dense_params
        # BERT's pooler (pooler.*, kept by hf.load) is not read by the sentence embedding: it is no parameter here,
        # as sentence-transformers' optimizer skips it (its gradient stays None there).
        encoder_params = {k: v for k, v in encoder.params.items() if not k.startswith("pooler.")}
        self.params = {**encoder_params, **dense_params}
        self.dense_grads: dict[str, np.ndarray] = {}
        self._cache: SentenceCache | None = None
        self.zero_grad()

    @property
    def grads(self) -> dict:
        """name -> gradient, the keys of params (the encoder's gradients and the Dense layers')."""
        return {**{k: g for k, g in self.encoder.grads.items() if k in self.params}, **self.dense_grads}

    def zero_grad(self) -> None:
        self.encoder.zero_grad()
        self.dense_grads = {k: np.zeros_like(v) for k, v in self.dense_params.items()}

    def train(self, mode: bool = True) -> SentenceModel:
        self.encoder.train(mode)
        return self

    def eval(self) -> SentenceModel:
        return self.train(False)

    def forward(
        self,
        ids: ArrayLike,
        attention_mask: ArrayLike,
        token_type_ids: ArrayLike | None = None,
        prompt_length: int = 0,
        *,
        keep_cache: bool = True,
    ) -> np.ndarray:
        """ids (B, T), attention_mask (B, T) 1 = a real token -> sentence embeddings (B, D): the encoder's hidden
        states through each module. prompt_length: the prompt's tokens at the start of each row (Batch.prompt_length),
        left out of the pooling when the folder's Pooling has include_prompt false. token_type_ids: given to an
        encoder with token types (zeros when None). keep_cache=False: inference, nothing kept for backward."""
        ids = np.asarray(ids)
        mask = check_attention_mask(attention_mask, ids)
        if mask is None:
            raise TypeError("attention_mask must be a (B, T) array of 0/1, got None")
        if isinstance(prompt_length, bool) or not isinstance(prompt_length, (int, np.integer)) or prompt_length < 0:
            raise ValueError(f"prompt_length must be an int >= 0, got {prompt_length!r}")
        types = None
        if self.encoder.config.type_vocab_size > 0:
            types = np.zeros_like(ids) if token_type_ids is None else token_type_ids
        self._cache = None
        x = self.encoder.forward(ids, types, attention_mask=mask, keep_cache=keep_cache)  # (B, T, D)
        caches: list = []
        cache: object
        for module in self.modules:
            if isinstance(module, PoolingSpec):
                left_out = 0 if module.include_prompt else int(prompt_length)
                x, cache = pooling_forward(x, mask, module.modes, left_out)  # (B, len(modes) * D)
            elif isinstance(module, DenseSpec):
                params = {k: self.dense_params[f"{module.name}.{k}"] for k in module.weights}
                x, cache = dense_forward(x, params, module.activation, module.use_residual)  # (B, out)
            else:
                x, cache = l2_normalize_forward(x)  # (B, D)
            caches.append(cache)
        if keep_cache:
            self._cache = SentenceCache(tuple(caches), ids.shape)
        return x

    __call__ = forward

    def backward(self, dembeddings: np.ndarray) -> None:
        """Accumulate into grads the gradient of the loss, given dembeddings (B, D) = dL/d(embeddings) of the last
        forward: each module's backward in reverse order, then the encoder's."""
        if self._cache is None:
            raise RuntimeError("backward needs a forward pass with keep_cache=True first (encode keeps nothing)")
        dx = check_float_array("dembeddings", dembeddings, self.dtype, (self._cache.batch_shape[0], self.dimension))
        for module, cache in zip(reversed(self.modules), reversed(self._cache.steps), strict=True):
            if isinstance(module, NormalizeSpec):
                dx = l2_normalize_backward(dx, cache)
            elif isinstance(module, DenseSpec):
                dx, grads = dense_backward(dx, cache)
                for key, g in grads.items():
                    self.dense_grads[f"{module.name}.{key}"] += g
            else:
                dx = pooling_backward(dx, cache)  # (B, T, D)
        self.encoder.backward(dx)

    def batch(self, texts, prompt_name: str | None = None) -> Batch:
        """texts tokenized as encode tokenizes them (the prompt prepended): ids, attention mask, token types."""
        return self.tokenizer.batch(texts, self.folder.resolve_prompt(prompt_name))

    def encode(self, texts, batch_size: int = 32, prompt_name: str | None = None) -> np.ndarray:
        """The embeddings of texts (a list of str), (N, D) in the model's dtype, as SentenceTransformer.encode
        computes them: the prompt `prompt_name` (or the folder's default prompt) before each text, the texts in
        batches of batch_size taken longest first (the embeddings returned in the texts' order), the model in
        evaluation mode (encode leaves it there, as sentence-transformers does)."""
        texts = check_texts(texts)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        prompt = self.folder.resolve_prompt(prompt_name)
        self.eval()
        out = np.empty((len(texts), self.dimension), self.dtype)
        order = length_order(texts)
        for start in range(0, len(texts), batch_size):
            rows = order[start : start + batch_size]
            batch = self.tokenizer.batch([texts[i] for i in rows], prompt)
            out[rows] = self.forward(
                batch.ids, batch.attention_mask, batch.token_type_ids, batch.prompt_length, keep_cache=False
            )
        return out


def load(folder, dtype=np.float32) -> SentenceModel:
    """The sentence-transformers model in `folder` (modules.json, the transformer's files, 1_Pooling, Dense
    layers, Normalize, config_sentence_transformers.json), in `dtype` (float32 or float64), in evaluation mode.
    ValueError naming the file for anything it does not compute (transformer_spec.sentence.read_folder)."""
    from . import hf  # here: hf imports the models, which need nothing of this module

    spec = read_folder(folder)
    encoder = hf.load(Path(spec.transformer_path), dtype=dtype)
    return SentenceModel(encoder, spec).eval()


__all__ = [
    "load",
    "SentenceModel",
    "pooling_forward",
    "pooling_backward",
    "dense_forward",
    "dense_backward",
    "pooled_positions",
]
