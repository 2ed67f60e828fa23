"""Whisper's audio front end and the encoder-decoder that reads it (WhisperForConditionalGeneration), by hand.

The encoder reads log-mel frames instead of token ids: two 1-D convolutions over time (kernel 3, padding 1; the
second with stride 2, which halves the frames), each followed by exact GELU, then the fixed sinusoids of Whisper's
`embed_positions` added. Everything after that is the project's pre-norm encoder and decoder (model.py): the
encoder's layers and final norm, the decoder with learned positions, causal self-attention, cross-attention over
the encoder's output and an output projection tied to the decoder's token table. Whisper's key projections have no
bias (softmax ignores a shift shared by all keys, so a bias there would have no gradient anyway).

Shape letters: B batch, M mel bins (config.n_mels), N frames (2 * config.source_positions), S = N / 2 encoder
positions, D d_model, K kernel width (3), C_in / C_out a convolution's channels, T_out its output length.

    model = SpeechTransformer(config)                  # config.n_mels > 0, config.source_positions > 0
    logits = model.forward(input_features, tgt_ids)    # (B, M, N) floats, (B, T) ids -> (B, T, V)
    model.backward(dlogits)                            # fills model.grads
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from transformer_spec.config import TransformerConfig
from transformer_spec.shapes import SPEECH_POSITION_TABLE, check_speech_config, speech_parameter_shapes

from .layers import (
    ACTIVATIONS,
    Dropout,
    DropoutCache,
    GeluCache,
    dropout_backward,
    dropout_site,
    gelu_backward,
    gelu_forward,
)
from .model import (
    EncoderStackCache,
    HeadCache,
    LayerCache,
    Transformer,
    TransformerCache,
    add_table_share,
    decoder_backward,
    decoder_forward,
    encoder_layer_backward,
    encoder_layer_forward,
    final_norm_backward,
    final_norm_forward,
    prefixed,
    sub,
)
from .validation import check_float_array, check_ids

# ----------------------------------------------------------------------------------------------
# A 1-D convolution as a matrix product: the K shifted copies of the (padded) input side by side ("unfold", or
# im2col), times the kernel flattened to (C_out, C_in * K).


@dataclass(frozen=True, slots=True)
class Conv1dCache:
    cols: np.ndarray  # the unfolded input (B, T_out, C_in * K)
    weight: np.ndarray  # (C_out, C_in, K)
    stride: int
    padding: int
    length: int  # T, the input's length before padding
    has_bias: bool


def unfold(xp: np.ndarray, kernel: int, stride: int, t_out: int) -> np.ndarray:
    """xp (B, C, T_p), padded -> (B, T_out, C * K): row t holds xp[:, :, t s + k] for k = 0 .. K - 1, channel-major
    (c K + k), the order of the kernel's (C_out, C_in, K) flattened."""
    taps = [xp[:, :, k : k + stride * (t_out - 1) + 1 : stride] for k in range(kernel)]  # K of (B, C, T_out)
    cols = np.stack(taps, axis=-1)  # (B, C, T_out, K)
    return cols.transpose(0, 2, 1, 3).reshape(xp.shape[0], t_out, -1)  # (B, T_out, C * K)


def conv1d_forward(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, stride: int = 1, padding: int = 0
) -> tuple[np.ndarray, Conv1dCache]:
    r"""x (B, C_in, T) -> y (B, C_out, T_out), as torch.nn.Conv1d (cross-correlation, zero padding), with
    :math:`T_{out} = \lfloor (T + 2p - K) / s \rfloor + 1`:

    .. math::

        y_{b,o,t} = b_o + \sum_{c,k} W_{o,c,k}\, x^{p}_{b,c,\,t s + k}

    computed as one matrix product of the unfolded input, :math:`Y = X_{\mathrm{cols}} W_{\mathrm{flat}}^T + b`."""
    B, C_in, T = x.shape
    C_out, _, K = weight.shape
    t_out = (T + 2 * padding - K) // stride + 1
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding)))  # (B, C_in, T + 2p)
    cols = unfold(xp, K, stride, t_out)  # (B, T_out, C_in * K)
    y = cols @ weight.reshape(C_out, C_in * K).T  # (B, T_out, C_out)
    if bias is not None:
        y += bias
    cache = Conv1dCache(cols, weight, stride, padding, T, bias is not None)
    return np.ascontiguousarray(y.transpose(0, 2, 1)), cache  # (B, C_out, T_out)


def conv1d_backward(dout: np.ndarray, cache: Conv1dCache) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    r"""Backward of conv1d_forward: dout (B, C_out, T_out) -> dx (B, C_in, T), dweight (C_out, C_in, K), dbias
    (C_out,) or None. The forward is a linear layer on the unfolded input, so its three gradients are a linear
    layer's; then each column of dX_cols goes back to the input position it was copied from, and copies add
    (a position read by several taps, t s + k = t' s + k', gets each tap's share):

    .. math::

        dW_{\mathrm{flat}} = dY^T X_{\mathrm{cols}}, \qquad db = \sum_{b,t} dY_{b,:,t}

        dX_{\mathrm{cols}} = dY\, W_{\mathrm{flat}}

        dx^{p}_{b,c,j} = \sum_{t s + k = j} dX_{\mathrm{cols}\, b,t,(c,k)}

    and dx is dx^p without its padding."""
    c = cache
    C_out, C_in, K = c.weight.shape
    B, _, t_out = dout.shape
    dy = dout.transpose(0, 2, 1)  # (B, T_out, C_out)
    dweight = (dy.reshape(-1, C_out).T @ c.cols.reshape(-1, C_in * K)).reshape(C_out, C_in, K)
    dbias = dout.sum(axis=(0, 2)) if c.has_bias else None
    dcols = (dy @ c.weight.reshape(C_out, C_in * K)).reshape(B, t_out, C_in, K)  # (B, T_out, C_in, K)
    dxp = np.zeros((B, C_in, c.length + 2 * c.padding), dtype=dout.dtype)  # (B, C_in, T + 2p)
    for k in range(K):  # tap k read xp[:, :, t s + k]: its gradient goes back there, added
        dxp[:, :, k : k + c.stride * (t_out - 1) + 1 : c.stride] += dcols[:, :, :, k].transpose(0, 2, 1)
    return dxp[:, :, c.padding : c.padding + c.length], dweight, dbias


# ----------------------------------------------------------------------------------------------
# Whisper's positions: fixed sinusoids, all sines then all cosines, the timescales spaced by log(10000) / (D/2 - 1)
# (the last frequency is exactly 1/10000, unlike the paper's D/2 spacing).


def whisper_sinusoids(length: int, channels: int, dtype: DTypeLike = np.float64) -> np.ndarray:
    r"""The table (length, channels) of Whisper's encoder positions (transformers' `sinusoids`, which initialises
    `embed_positions`), computed in float64 and cast to dtype:

    .. math::

        PE[t, i] = \sin(t\, \omega_i), \qquad PE[t, D/2 + i] = \cos(t\, \omega_i)

        \omega_i = \exp\!\big(-i \log(10000) / (D/2 - 1)\big), \qquad i = 0 .. D/2 - 1
    """
    if channels % 2 or channels < 4:
        raise ValueError(f"whisper_sinusoids: channels must be even and at least 4, got {channels}")
    half = channels // 2
    inv_timescales = np.exp(-math.log(10000.0) / (half - 1) * np.arange(half))  # (D/2,)
    scaled_time = np.arange(length)[:, None] * inv_timescales[None, :]  # (length, D/2)
    return np.concatenate([np.sin(scaled_time), np.cos(scaled_time)], axis=1).astype(dtype)


# ----------------------------------------------------------------------------------------------
# The front end: features (B, M, N) -> the encoder's input (B, S, D).


@dataclass(frozen=True, slots=True)
class AudioEmbedCache:
    conv1: Conv1dCache
    gelu1: GeluCache
    conv2: Conv1dCache
    gelu2: GeluCache
    dropout: DropoutCache


def audio_embed_forward(
    params: dict, features: np.ndarray, table: np.ndarray, dropout: Dropout | None = None
) -> tuple[np.ndarray, AudioEmbedCache]:
    r"""features (B, M, N) -> x (B, S, D), S = N / 2; params keyed below "encoder." (conv1.*, conv2.*), table
    the positions (S, D) (Whisper's embed_positions: fixed, no gradient):

    .. math::

        x = \mathrm{drop}\Big(\mathrm{gelu}\big(\mathrm{conv}_2(\mathrm{gelu}(\mathrm{conv}_1(f)))\big)^T
        + PE\Big)

    conv1: kernel 3, padding 1 (N frames stay N); conv2: kernel 3, padding 1, stride 2 (N -> N / 2)."""
    h, conv1 = conv1d_forward(features, params["conv1.weight"], params.get("conv1.bias"), stride=1, padding=1)
    h, gelu1 = gelu_forward(h)  # (B, D, N)
    h, conv2 = conv1d_forward(h, params["conv2.weight"], params.get("conv2.bias"), stride=2, padding=1)
    h, gelu2 = gelu_forward(h)  # (B, D, S)
    x = h.transpose(0, 2, 1) + table  # (B, S, D): frames become positions
    x, drop = dropout_site(dropout, "encoder.embedding_dropout", x)
    return x, AudioEmbedCache(conv1, gelu1, conv2, gelu2, drop)


def audio_embed_backward(dout: np.ndarray, cache: AudioEmbedCache) -> dict:
    r"""dx (B, S, D) -> grads of conv1.* and conv2.* (keys below "encoder."), the forward in reverse. The sum
    x = h^T + PE passes dx to h unchanged (transposed back to (B, D, S)); the table is fixed and takes none:

    .. math::

        dh_2 = (d\,\mathrm{drop})^T, \qquad dz_2 = \mathrm{gelu}'(z_2) \odot dh_2

        dh_1 = \mathrm{conv}_2^T(dz_2), \qquad dz_1 = \mathrm{gelu}'(z_1) \odot dh_1

    with :math:`z_1 = \mathrm{conv}_1(f)`, :math:`z_2 = \mathrm{conv}_2(\mathrm{gelu}(z_1))` and
    :math:`\mathrm{conv}^T` conv1d_backward's input gradient. The features' own gradient (conv1's) is not needed by
    the model and is dropped."""
    c = cache
    dx = dropout_backward(dout, c.dropout)
    dh = np.ascontiguousarray(dx.transpose(0, 2, 1))  # (B, D, S): x = h^T + PE
    dh = gelu_backward(dh, c.gelu2)
    dh, dw2, db2 = conv1d_backward(dh, c.conv2)  # (B, D, N)
    dh = gelu_backward(dh, c.gelu1)
    _, dw1, db1 = conv1d_backward(dh, c.conv1)  # the features' gradient: unused
    grads = {"conv1.weight": dw1, "conv2.weight": dw2}
    if db1 is not None and db2 is not None:
        grads |= {"conv1.bias": db1, "conv2.bias": db2}
    return grads


# ----------------------------------------------------------------------------------------------
# The audio encoder: the front end, then the project's encoder layers and final norm (model.py).


def audio_encoder_forward(
    params: dict,
    features: np.ndarray,
    table: np.ndarray,
    config: TransformerConfig,
    dropout: Dropout | None = None,
    *,
    activations: dict = ACTIVATIONS,
    keep: bool = True,
) -> tuple[np.ndarray, EncoderStackCache | None]:
    """features (B, M, N) -> memory (B, S, D): audio_embed_forward, every encoder layer (no mask: every frame is
    read), the final norm. params keyed below "encoder."; keep=False: inference, no cache."""
    x, embed_cache = audio_embed_forward(params, features, table, dropout)  # (B, S, D)
    hidden, layer_caches = [x], []
    for i in range(config.n_encoder_layers):
        x, layer_cache = encoder_layer_forward(
            sub(params, f"layers.{i}"), x, config, dropout=dropout, site=f"encoder.layers.{i}", layer=i,
            activations=activations,
        )  # fmt: skip
        if keep:
            hidden.append(x)
            layer_caches.append(layer_cache)
        del layer_cache
    x, norm_cache = final_norm_forward(params, x, config)
    if not keep:
        return x, None
    return x, EncoderStackCache(embed_cache, layer_caches, norm_cache, hidden)  # type: ignore[arg-type]


def audio_encoder_backward(dout: np.ndarray, cache: EncoderStackCache) -> dict:
    """dmemory (B, S, D) -> grads of every encoder parameter (keys below "encoder."), the forward in reverse."""
    dx, grads = final_norm_backward(dout, cache.final_norm)
    for i in reversed(range(len(cache.layers))):
        layer: LayerCache = cache.layers[i]
        dx, layer_grads = encoder_layer_backward(dx, layer)
        grads = add_table_share(grads, layer_grads, f"layers.{i}")
    embed: AudioEmbedCache = cache.embed  # type: ignore[assignment]
    return grads | audio_embed_backward(dx, embed)


# ----------------------------------------------------------------------------------------------
# The model.

POSITION_TABLE = SPEECH_POSITION_TABLE  # Whisper's encoder.embed_positions.weight: fixed, not a parameter


class SpeechTransformer(Transformer):
    """Whisper's encoder-decoder: forward(input_features (B, M, N), tgt_ids (B, T)) -> logits (B, T, V_tgt), with
    N = 2 * config.source_positions frames (as transformers' WhisperEncoder requires). The decoder is the
    Transformer's; generate() takes the features in place of src_ids.

    The encoder's position table (Whisper's embed_positions, fixed) is held in `buffers` under POSITION_TABLE,
    not in params: it has no gradient and no optimizer touches it. state_dict() includes it, and load_state_dict
    reads it when given (a checkpoint's table is used as stored, as transformers uses it)."""

    def __init__(self, config: TransformerConfig, seed: int = 0, dtype: DTypeLike = np.float64) -> None:
        check_speech_config(config)
        super().__init__(config, seed, dtype)
        D = config.d_model
        rng = np.random.default_rng([seed, 2])
        for name, fan_in in (("encoder.conv1.weight", config.n_mels * 3), ("encoder.conv2.weight", D * 3)):
            bound = 1.0 / math.sqrt(fan_in)  # torch's Conv1d default: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
            self.params[name] = rng.uniform(-bound, bound, size=self.params[name].shape).astype(self.dtype)
        self.zero_grad()
        self.buffers = {POSITION_TABLE: whisper_sinusoids(config.source_positions, D, self.dtype)}

    @classmethod
    def shapes(cls, config: TransformerConfig, buffers: bool = False) -> dict:
        """The Transformer's parameters with the audio front end in place of the source token table; buffers: also
        the fixed position table (POSITION_TABLE), which the state dict and checkpoints hold."""
        return speech_parameter_shapes(config, buffers)

    @property
    def n_frames(self) -> int:
        """N, the frames input_features must hold: twice the encoder's positions (conv2's stride)."""
        return 2 * self.config.source_positions

    def check_source(self, input_features: ArrayLike) -> np.ndarray:
        """input_features as an array of the model's dtype (B, n_mels, N); TypeError / ValueError naming it."""
        features = check_float_array("input_features", input_features)
        expected = (self.config.n_mels, self.n_frames)
        if features.ndim != 3 or features.shape[1:] != expected or features.shape[0] < 1:
            raise ValueError(
                f"input_features must have shape (B, {expected[0]}, {expected[1]}) (B >= 1: n_mels, then "
                f"2 * source_positions frames), got {features.shape}"
            )
        if not np.isfinite(features).all():
            raise ValueError("input_features must be finite (no NaN or inf)")
        return features.astype(self.dtype, copy=False)

    def encode_source(self, features: np.ndarray, attention_mask=None, keep: bool = False):
        """The encoder's output (B, S, D) of checked features, and the cross-attention mask (None: every frame)."""
        if attention_mask is not None:
            raise ValueError("attention_mask: Whisper's encoder reads every frame; pass None")
        memory, _ = audio_encoder_forward(
            sub(self.params, "encoder"), features, self.buffers[POSITION_TABLE], self.config, keep=keep,
            activations=self.activation_table,
        )  # fmt: skip
        return memory, None

    def forward(  # type: ignore[override]
        self,
        input_features: ArrayLike,
        tgt_ids: ArrayLike,
        dropout_masks: dict | None = None,
        attention_mask: ArrayLike | None = None,
        *,
        keep_cache: bool = True,
    ) -> np.ndarray:
        """input_features (B, n_mels, N), tgt_ids (B, T) -> logits (B, T, V). attention_mask must be None (Whisper
        masks no frame); dropout_masks and keep_cache as Transformer.forward."""
        cfg = self.config
        features = self.check_source(input_features)
        tgt_ids = check_ids("tgt_ids", tgt_ids, cfg.tgt_vocab_size, cfg.position_limit)
        if features.shape[0] != tgt_ids.shape[0]:
            raise ValueError(
                f"input_features and tgt_ids must have the same batch size, got {features.shape[0]} and "
                f"{tgt_ids.shape[0]}"
            )
        if attention_mask is not None:
            raise ValueError("attention_mask: Whisper's encoder reads every frame; pass None")
        dropout = self._begin_forward(dropout_masks, keep_cache)
        memory, enc_cache = audio_encoder_forward(
            sub(self.params, "encoder"), features, self.buffers[POSITION_TABLE], cfg, dropout,
            activations=self.activation_table, keep=keep_cache,
        )  # (B, S, D)  # fmt: skip
        x, dec_cache = decoder_forward(
            sub(self.params, "decoder"), tgt_ids, memory, cfg, dropout, activations=self.activation_table,
            keep=keep_cache,
        )  # (B, T, D)  # fmt: skip
        head: HeadCache = self._head_forward(x)  # (B, T, V) logits
        kept = None
        if enc_cache is not None and dec_cache is not None:
            kept = TransformerCache(enc_cache, memory, dec_cache, x, head)
        self._finish_forward(dropout, kept)
        return head.logits

    __call__ = forward  # type: ignore[assignment]

    def backward(self, dlogits: np.ndarray, daux_loss: float | None = None) -> None:
        """Accumulate every parameter's gradient into self.grads, given dlogits (B, T, V): the head, the decoder,
        then the encoder (its memory's gradient summed over every cross-attention), the forward in reverse."""
        cache = self._last_forward("backward")
        dlogits = check_float_array("dlogits", dlogits, self.dtype, cache.head.logits.shape)
        if daux_loss is not None:
            raise ValueError("backward: daux_loss is for a mixture of experts; this model has none")
        dx, grads = self._head_backward(dlogits, cache.head)
        dmemory, dec_grads = decoder_backward(dx, cache.decoder)
        if dmemory is None:
            raise RuntimeError("SpeechTransformer.backward: the decoder's backward returned no memory gradient")
        enc_grads = audio_encoder_backward(dmemory, cache.encoder)
        self.accumulate_grads(grads)  # the tied output projection's share of the token table ...
        self.accumulate_grads(prefixed(dec_grads, "decoder"))  # ... plus the decoder's lookup's share
        self.accumulate_grads(prefixed(enc_grads, "encoder"))

    def state_dict(self) -> dict:
        """A copy of every parameter and of the position table (POSITION_TABLE), keyed by state-dict name."""
        return super().state_dict() | {k: v.copy() for k, v in self.buffers.items()}

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Transformer.load_state_dict on the parameters; the position table, when `state` holds it, replaces the
        computed one (a checkpoint's stored values: transformers uses those). Its shape must be (S, D)."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict of name -> array, got {type(state).__name__}")
        table = state.get(POSITION_TABLE)
        if table is not None:
            table = np.asarray(table)
            expected = self.buffers[POSITION_TABLE].shape
            if table.shape != expected or not np.issubdtype(table.dtype, np.floating):
                raise ValueError(
                    f"load_state_dict: {POSITION_TABLE} must be a float array {expected}, got {table.shape}"
                )
        super().load_state_dict({k: v for k, v in state.items() if k != POSITION_TABLE}, strict)
        if table is not None:
            self.buffers[POSITION_TABLE] = table.astype(self.dtype)


__all__ = [
    "POSITION_TABLE",
    "SpeechTransformer",
    "audio_embed_backward",
    "audio_embed_forward",
    "audio_encoder_backward",
    "audio_encoder_forward",
    "conv1d_backward",
    "conv1d_forward",
    "whisper_sinusoids",
]
