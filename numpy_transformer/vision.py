"""Transformers that see: an image as a sequence of patch tokens (ViT), every piece a forward/backward pair.

    from numpy_transformer.vision import ViTModel, load
    model = load("vit-folder/", dtype=np.float64)       # config.json + model.safetensors (ViTModel's names)
    hidden = model.forward(pixel_values)                 # (B, C, H, W) -> (B, 1 + N, D), the class token first
    pooled = model.pool(hidden)                          # tanh(dense(hidden[:, 0])): ViTModel's pooler_output
    model.zero_grad()
    model.backward(dhidden + model.pool_backward(dpooled))

Shape letters: B batch, C channels, H and W pixels, p the patch side, N = (H/p)(W/p) patches, K = C p p the
numbers in one patch, D hidden size, F intermediate size, P the pooler's width. The pairs here are the new math of
the vision families (the convolution as patch extraction and a matrix product, the class token, pooling at one
position, QuickGELU, the pre-norm layer under any of transformers' names); attention, layer norm, GELU and the linear
layers are the pairs of `layers` and `attention`. numpy_transformer.clip builds CLIP from the same pieces.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from transformer_spec.families.vit import (
    VIT_LAYER,
    VIT_PREFIXES,
    VIT_SKIPPED,
    ViTConfig,
    file_name,
    read_folder,
    state_in_our_names,
    vit_config_from_hf,
    vit_config_to_hf,
    vit_pooler_in,
    vit_shapes,
    write_folder,
)

from .attention import AttentionCache, multi_head_attention_backward, multi_head_attention_forward
from .layers import (
    ACTIVATIONS,
    AddPositionsCache,
    LayerNormCache,
    LinearCache,
    add_positions_backward,
    add_positions_forward,
    layer_norm_backward,
    layer_norm_forward,
    linear_backward,
    linear_forward,
    tanh_backward,
    tanh_forward,
)
from .validation import check_float_array

# every activation of layers' table (ViT's gelu and CLIP's quick_gelu among them; the judge reads others in a ViT)
ACTIVATION_PAIRS: dict[str, tuple[Callable, Callable]] = ACTIVATIONS


# ----------------------------------------------------------------------------------------------
# Patch embedding: nn.Conv2d(C, D, kernel_size=p, stride=p) is, patch by patch, one linear map of the K = C p p
# numbers of a patch; the patches do not overlap, so the convolution is a reshape and one matrix product.


@dataclass(frozen=True, slots=True)
class PatchEmbeddingCache:
    linear: LinearCache  # patches (B, N, K) through the flattened kernel (D, K)
    pixels_shape: tuple[int, ...]  # (B, C, H, W)
    weight_shape: tuple[int, ...]  # (D, C, p, p)


def patches_of(pixel_values: np.ndarray, p: int) -> np.ndarray:
    """(B, C, H, W) -> (B, N, C p p): the p x p patches, row by row (left to right, then down: the order of
    flatten(2) on the convolution's (B, D, H/p, W/p) output), each flattened channel first, as the kernel
    (D, C, p, p) is. Pixels past the last whole patch are not read (the convolution's floor)."""
    B, C, H, W = pixel_values.shape
    gh, gw = H // p, W // p
    x = pixel_values[:, :, : gh * p, : gw * p].reshape(B, C, gh, p, gw, p)
    return x.transpose(0, 2, 4, 1, 3, 5).reshape(B, gh * gw, C * p * p)  # (B, N, K)


def patch_embedding_forward(
    pixel_values: np.ndarray, weight: np.ndarray, bias: np.ndarray | None
) -> tuple[np.ndarray, PatchEmbeddingCache]:
    r"""A strided convolution with kernel and stride p = weight.shape[-1]: pixel_values (B, C, H, W), weight
    (D, C, p, p), bias (D,) or None -> one token per patch, (B, N, D):

    .. math::

        y_{bn} = \mathrm{vec}(X_{b, n})\, \mathrm{vec}(W)^\top + b

    with :math:`X_{b, n}` patch n of image b (C, p, p) and vec the row-major flattening."""
    D, p = weight.shape[0], weight.shape[-1]
    patches = patches_of(pixel_values, p)  # (B, N, K)
    out, linear = linear_forward(patches, weight.reshape(D, -1), bias)  # (B, N, D)
    return out, PatchEmbeddingCache(linear, pixel_values.shape, weight.shape)


def patch_embedding_backward(
    dout: np.ndarray, cache: PatchEmbeddingCache
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    r"""Gradients of the patch embedding, dy (B, N, D): the linear layer's, then each patch's gradient put back where
    the patch was read (the patches do not overlap, so nothing adds up):

    .. math::

        d\,\mathrm{vec}(W) = \textstyle\sum_{b, n} dy_{bn}^\top\, \mathrm{vec}(X_{bn}), \qquad
        db = \textstyle\sum_{b, n} dy_{bn}

        d\,\mathrm{vec}(X_{bn}) = dy_{bn}\, \mathrm{vec}(W)

    dpixel_values (B, C, H, W) (zero past the last whole patch), dweight (D, C, p, p), dbias (D,) or None."""
    dpatches, dweight, dbias = linear_backward(dout, cache.linear)  # (B, N, K), (D, K), (D,)
    B, C, H, W = cache.pixels_shape
    p = cache.weight_shape[-1]
    gh, gw = H // p, W // p
    dpixels = np.zeros(cache.pixels_shape, dtype=dout.dtype)
    # patches_of: x.reshape(B, C, gh, p, gw, p).transpose(0, 2, 4, 1, 3, 5); undone in reverse
    dpixels[:, :, : gh * p, : gw * p] = (
        dpatches.reshape(B, gh, gw, C, p, p).transpose(0, 3, 1, 4, 2, 5).reshape(B, C, gh * p, gw * p)
    )
    return dpixels, dweight.reshape(cache.weight_shape), dbias


# ----------------------------------------------------------------------------------------------
# The class token: one learned vector put in front of every image's patch tokens; what it gathers is the image's.


@dataclass(frozen=True, slots=True)
class ClassTokenCache:
    token_shape: tuple[int, ...]  # (D,) (CLIP's class_embedding) or (1, 1, D) (ViT's cls_token)


def prepend_class_token_forward(tokens: np.ndarray, class_token: np.ndarray) -> tuple[np.ndarray, ClassTokenCache]:
    r"""tokens (B, N, D), class_token (D,) or (1, 1, D) -> :math:`[c; x_1; \dots; x_N]`, (B, 1 + N, D)."""
    B, _, D = tokens.shape
    front = np.broadcast_to(class_token.reshape(1, 1, D), (B, 1, D))
    return np.concatenate([front, tokens], axis=1), ClassTokenCache(class_token.shape)


def prepend_class_token_backward(dout: np.ndarray, cache: ClassTokenCache) -> tuple[np.ndarray, np.ndarray]:
    r"""Gradients of :math:`y = [c; x]` along the sequence: :math:`dx = dy_{:, 1:}`, and the class token, read by
    every image, gets the sum :math:`dc = \sum_b dy_{b, 0}`. dtokens (B, N, D), dclass_token in its own shape."""
    return dout[:, 1:], dout[:, 0].sum(axis=0).reshape(cache.token_shape)


# ----------------------------------------------------------------------------------------------
# Pooling at one position per sequence: the class token (ViT's pooler, CLIP's vision tower) or the end token
# (CLIP's text tower: clip.end_token_positions says where it is).


@dataclass(frozen=True, slots=True)
class TokenPoolCache:
    positions: np.ndarray  # (B,) the position read in each sequence
    hidden_shape: tuple[int, ...]  # (B, T, D)


def token_pool_forward(hidden: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, TokenPoolCache]:
    r"""hidden (B, T, D), positions (B,) integers -> :math:`y_b = h_{b, t_b}`, (B, D)."""
    positions = np.asarray(positions)
    return hidden[np.arange(hidden.shape[0]), positions], TokenPoolCache(positions, hidden.shape)


def token_pool_backward(dout: np.ndarray, cache: TokenPoolCache) -> np.ndarray:
    r"""Gradient of :math:`y_b = h_{b, t_b}`: :math:`dh_{b, t_b} = dy_b`, zero at every other position, (B, T, D)."""
    dhidden = np.zeros(cache.hidden_shape, dtype=dout.dtype)
    dhidden[np.arange(cache.hidden_shape[0]), cache.positions] = dout
    return dhidden


def class_token_pool_forward(hidden: np.ndarray) -> tuple[np.ndarray, TokenPoolCache]:
    r"""The class token's hidden state, :math:`y_b = h_{b, 0}`: hidden (B, 1 + N, D) -> (B, D)."""
    return token_pool_forward(hidden, np.zeros(hidden.shape[0], dtype=np.int64))


def class_token_pool_backward(dout: np.ndarray, cache: TokenPoolCache) -> np.ndarray:
    r"""Gradient of :math:`y_b = h_{b, 0}`: dy at position 0, zero elsewhere, (B, 1 + N, D)."""
    return token_pool_backward(dout, cache)


# ----------------------------------------------------------------------------------------------
# One pre-norm encoder layer, its tensors under the names a family gives them (`names`: norm1, q, k, v, out, norm2,
# fc1, fc2; ViT_LAYER or clip.CLIP_LAYER):  x = x + Attn(LN1(x)),  x = x + fc2(act(fc1(LN2(x)))).


@dataclass(frozen=True, slots=True)
class PreNormLayerCache:
    names: dict
    present: frozenset  # the layer's parameter names (a zero bias held for a missing one gets no gradient)
    activation: str
    norm1: LayerNormCache
    attention: AttentionCache
    norm2: LayerNormCache
    fc1: LinearCache
    act: object  # the activation pair's cache
    fc2: LinearCache


def _attention_params(params: dict, names: dict) -> dict:
    """The layer's attention tensors under the keys multi_head_attention_forward reads (q_proj.weight, ...). ViT with
    qkv_bias false has an output bias only, which the attention pair does not take: q, k and v get zero biases, whose
    gradients the backward drops."""
    keys = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "out": "out_proj"}
    out = {
        f"{ours}.{kind}": params[f"{names[part]}.{kind}"]
        for part, ours in keys.items()
        for kind in ("weight", "bias")
        if f"{names[part]}.{kind}" in params
    }
    if "out_proj.bias" in out and "q_proj.bias" not in out:
        for ours in ("q_proj", "k_proj", "v_proj"):
            out[f"{ours}.bias"] = np.zeros(out[f"{ours}.weight"].shape[0], out[f"{ours}.weight"].dtype)
    return out


def pre_norm_layer_forward(
    params: dict,
    x: np.ndarray,
    names: dict,
    n_heads: int,
    eps: float,
    activation: str,
    is_causal: bool = False,
    key_padding: np.ndarray | None = None,
) -> tuple[np.ndarray, PreNormLayerCache]:
    r"""One pre-norm encoder layer, x (B, T, D) -> (B, T, D):

    .. math::

        x' = x + \mathrm{MHA}(\mathrm{LN}_1(x))

        y = x' + W_2\, \mathrm{act}(W_1\, \mathrm{LN}_2(x') + b_1) + b_2

    params: the layer's tensors, keyed below its prefix by `names` (ViT: layernorm_before, attention.attention.query,
    ...; CLIP: layer_norm1, self_attn.q_proj, ...). activation: a key of layers.ACTIVATIONS ("gelu", "quick_gelu",
    ...). is_causal: CLIP's text tower; key_padding (B, T) bool, True = a real token (its attention_mask)."""
    act_forward = ACTIVATION_PAIRS[activation][0]
    n = names
    h, norm1 = layer_norm_forward(x, params[f"{n['norm1']}.weight"], params[f"{n['norm1']}.bias"], eps)
    a, attention = multi_head_attention_forward(
        _attention_params(params, names), h, h, h, n_heads, is_causal=is_causal, key_padding=key_padding
    )
    x = x + a  # the first residual
    h, norm2 = layer_norm_forward(x, params[f"{n['norm2']}.weight"], params[f"{n['norm2']}.bias"], eps)
    f, fc1 = linear_forward(h, params[f"{n['fc1']}.weight"], params[f"{n['fc1']}.bias"])  # (B, T, F)
    g, act = act_forward(f)
    o, fc2 = linear_forward(g, params[f"{n['fc2']}.weight"], params[f"{n['fc2']}.bias"])  # (B, T, D)
    return x + o, PreNormLayerCache(names, frozenset(params), activation, norm1, attention, norm2, fc1, act, fc2)


def pre_norm_layer_backward(dout: np.ndarray, cache: PreNormLayerCache) -> tuple[np.ndarray, dict]:
    r"""Gradients of the pre-norm layer, dy (B, T, D): the forward in reverse, each residual passing dy straight on
    and adding the sublayer's input gradient,

    .. math::

        dx' = dy + \mathrm{LN}_2^\top\big(W_1^\top\, \mathrm{act}'\!\odot (W_2^\top dy)\big)

        dx = dx' + \mathrm{LN}_1^\top\big(dq + dk + dv\big)

    (self-attention reads one input three times: its three input gradients add). Returns dx (B, T, D) and the
    layer's grads under the names of params."""
    n, grads = cache.names, {}  # type: dict, dict[str, Any]
    act_backward = ACTIVATION_PAIRS[cache.activation][1]
    # y = x' + o
    dg, grads[f"{n['fc2']}.weight"], grads[f"{n['fc2']}.bias"] = linear_backward(dout, cache.fc2)
    df = act_backward(dg, cache.act)
    dh, grads[f"{n['fc1']}.weight"], grads[f"{n['fc1']}.bias"] = linear_backward(df, cache.fc1)
    dx_norm2, grads[f"{n['norm2']}.weight"], grads[f"{n['norm2']}.bias"] = layer_norm_backward(dh, cache.norm2)
    dx = dout + dx_norm2  # x' feeds the residual and the second norm: the two gradients add
    # x' = x + a
    dq, dk, dv, attention_grads = multi_head_attention_backward(dx, cache.attention)
    dh = dq + dk + dv  # self-attention: query, key and value are one input
    keys = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "out_proj": "out"}
    for key, g in attention_grads.items():
        ours, kind = key.split(".")
        if f"{n[keys[ours]]}.{kind}" in cache.present:
            grads[f"{n[keys[ours]]}.{kind}"] = g
    dx_norm1, grads[f"{n['norm1']}.weight"], grads[f"{n['norm1']}.bias"] = layer_norm_backward(dh, cache.norm1)
    return dx + dx_norm1, grads


# ----------------------------------------------------------------------------------------------
# ViTModel.


def refuse_interpolation(interpolate_pos_encoding) -> None:
    if interpolate_pos_encoding:
        raise ValueError(
            "interpolate_pos_encoding=True is not supported (the bicubic resampling of the position table to "
            "another image size is not computed here): pass images of the configured image_size"
        )


def check_pixels(pixel_values, dtype, channels: int, size: int) -> np.ndarray:
    """pixel_values as a float (B, C, size, size) array of the model's dtype, or ValueError/TypeError naming it."""
    pixel_values = check_float_array("pixel_values", pixel_values, dtype)
    expected = f"(B, {channels}, {size}, {size})"
    if pixel_values.ndim != 4 or pixel_values.shape[1:] != (channels, size, size) or pixel_values.shape[0] < 1:
        raise ValueError(f"pixel_values must have shape {expected}, got {pixel_values.shape}")
    return pixel_values


def random_params(shapes: dict, seed: int, dtype) -> dict:
    """Initial weights: norms' weights one and biases zero, everything else N(0, 0.02^2) (the families' init)."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in shapes.items():
        if name.endswith(".bias"):
            params[name] = np.zeros(shape, dtype)
        elif len(shape) == 1 and "norm" in name:
            params[name] = np.ones(shape, dtype)
        else:
            params[name] = np.asarray(0.02 * rng.standard_normal(shape), dtype=dtype)
    return params


class StateMixin:
    """params / grads bookkeeping shared by ViTModel and CLIPModel."""

    params: dict
    grads: dict
    dtype: np.dtype

    def zero_grad(self) -> None:
        self.grads = {k: np.zeros_like(v) for k, v in self.params.items()}

    def accumulate(self, grads: dict[str, Any], prefix: str = "") -> None:
        for k, g in grads.items():
            self.grads[prefix + k] += g

    def state_dict(self) -> dict:
        return {k: v.copy() for k, v in self.params.items()}

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Copy `state` into the parameters, cast to the model's dtype; ValueError listing mis-shaped keys (and with
        strict, missing and unexpected ones)."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict of name -> array, got {type(state).__name__}")
        missing = [k for k in self.params if k not in state] if strict else []
        unexpected = [k for k in state if k not in self.params] if strict else []
        misshaped = [
            f"{k} {np.shape(state[k])} (expected {self.params[k].shape})"
            for k in self.params
            if k in state and np.shape(state[k]) != self.params[k].shape
        ]
        if missing or unexpected or misshaped:
            raise ValueError(f"load_state_dict: missing {missing}, unexpected {unexpected}, mis-shaped {misshaped}")
        for k in self.params.keys() & state.keys():
            self.params[k][...] = np.asarray(state[k], dtype=self.dtype)

    def eval(self):
        return self  # no dropout is computed: evaluation mode is the only mode


class ViTModel(StateMixin):
    """transformers' ViTModel in plain arrays: `forward(pixel_values)` -> last_hidden_state (B, 1 + N, D), `pool`
    -> pooler_output (B, P), `backward(dhidden)` and `pool_backward(dpooled)` filling `grads`. Parameters are
    keyed by the released checkpoints' names (transformer_spec.families.vit.vit_shapes)."""

    def __init__(self, config: ViTConfig, seed: int = 0, dtype=np.float64):
        self.config, self.dtype = config, np.dtype(dtype)
        self.params = random_params(vit_shapes(config), seed, self.dtype)
        self.zero_grad()
        self._caches: dict | None = None
        self._pool_cache: tuple | None = None

    def layer_params(self, i: int) -> dict:
        prefix = f"encoder.layer.{i}."
        return {k[len(prefix) :]: v for k, v in self.params.items() if k.startswith(prefix)}

    def forward(self, pixel_values: np.ndarray, interpolate_pos_encoding: bool = False) -> np.ndarray:
        """pixel_values (B, C, H, W), H = W = image_size -> last_hidden_state (B, 1 + N, D), the class token first."""
        refuse_interpolation(interpolate_pos_encoding)
        c, P = self.config, self.params
        pixel_values = check_pixels(pixel_values, self.dtype, c.num_channels, c.image_size)
        x, patch = patch_embedding_forward(
            pixel_values,
            P["embeddings.patch_embeddings.projection.weight"],
            P["embeddings.patch_embeddings.projection.bias"],
        )  # (B, N, D)
        x, cls = prepend_class_token_forward(x, P["embeddings.cls_token"])  # (B, 1 + N, D)
        x, positions = add_positions_forward(x, P["embeddings.position_embeddings"][0])
        layers = []
        for i in range(c.num_hidden_layers):
            x, layer = pre_norm_layer_forward(
                self.layer_params(i), x, VIT_LAYER, c.num_attention_heads, c.layer_norm_eps, c.hidden_act
            )
            layers.append(layer)
        out, final = layer_norm_forward(x, P["layernorm.weight"], P["layernorm.bias"], c.layer_norm_eps)
        self._caches = {"patch": patch, "cls": cls, "positions": positions, "layers": layers, "final": final}
        return out

    def backward(self, dhidden: np.ndarray) -> None:
        """Gradients of every parameter given dhidden = dL/d last_hidden_state (B, 1 + N, D), added to `grads`; the
        pixels' gradient is kept as `dpixel_values`."""
        if self._caches is None:
            raise ValueError("backward called before forward")
        cache = self._caches
        dhidden = check_float_array("dhidden", dhidden, self.dtype, cache["final"].x_hat.shape)
        dx, dw, db = layer_norm_backward(dhidden, cache["final"])
        self.accumulate({"layernorm.weight": dw, "layernorm.bias": db})
        for i in reversed(range(self.config.num_hidden_layers)):
            dx, grads = pre_norm_layer_backward(dx, cache["layers"][i])
            self.accumulate(grads, f"encoder.layer.{i}.")
        positions: AddPositionsCache = cache["positions"]
        dx, dtable = add_positions_backward(dx, positions)
        self.grads["embeddings.position_embeddings"] += dtable[None]
        dx, dcls = prepend_class_token_backward(dx, cache["cls"])
        self.grads["embeddings.cls_token"] += dcls
        self.dpixel_values, dkernel, dkernel_bias = patch_embedding_backward(dx, cache["patch"])
        projection = "embeddings.patch_embeddings.projection"
        self.accumulate({f"{projection}.weight": dkernel, f"{projection}.bias": dkernel_bias})

    def pool(self, hidden: np.ndarray) -> np.ndarray:
        r"""ViT's pooler: :math:`p = \tanh(h_{:, 0} W^\top + b)`, hidden (B, 1 + N, D) -> pooler_output (B, P)."""
        if not self.config.pooler:
            raise ValueError("pool: this model has no pooler (its checkpoint had no pooler.dense tensors)")
        hidden = check_float_array("hidden", hidden, self.dtype)
        first, first_cache = class_token_pool_forward(hidden)  # (B, D)
        z, dense = linear_forward(first, self.params["pooler.dense.weight"], self.params["pooler.dense.bias"])
        out, tanh = tanh_forward(z)
        self._pool_cache = (first_cache, dense, tanh)
        return out

    def pool_backward(self, dpooled: np.ndarray) -> np.ndarray:
        r"""Gradients of pool: :math:`dz = dp (1 - p^2)`, then the dense layer's (added to grads); returns dh (B, 1 + N,
        D), zero but at the class token (add it to backward's dhidden)."""
        if self._pool_cache is None:
            raise ValueError("pool_backward called before pool")
        first_cache, dense, tanh = self._pool_cache
        dz = tanh_backward(check_float_array("dpooled", dpooled, self.dtype, tanh.out.shape), tanh)
        dfirst, dw, db = linear_backward(dz, dense)
        self.accumulate({"pooler.dense.weight": dw, "pooler.dense.bias": db})
        return class_token_pool_backward(dfirst, first_cache)


def load(directory, dtype=np.float32) -> ViTModel:
    """A ViT checkpoint folder (ViTModel's, or ViTForImageClassification's: its `vit.` prefix dropped, its
    classifier skipped, no pooler) as a ViTModel in `dtype`. ValueError naming a config value not computed here or
    the tensors that do not fit."""
    hf_config, tensors = read_folder(directory, "vit")
    config = vit_config_from_hf(hf_config, pooler=vit_pooler_in(tensors))
    state = state_in_our_names(tensors, vit_shapes(config), VIT_PREFIXES, VIT_SKIPPED, file_name)
    model = ViTModel(config, dtype=dtype)
    model.load_state_dict(state)
    return model


def save(model: ViTModel, directory, overwrite: bool = False) -> None:
    """`model` as a ViTModel checkpoint folder (config.json, model.safetensors in the released names) that
    transformers' ViTModel.from_pretrained reads."""
    hf_config = vit_config_to_hf(model.config) | {"dtype": model.dtype.name}
    write_folder(directory, hf_config, model.params, overwrite)
