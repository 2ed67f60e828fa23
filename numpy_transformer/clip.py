"""CLIP in plain arrays: a text tower, a vision tower, and the contrastive loss that ties them, every backward by hand.

    from numpy_transformer import clip
    model = clip.load("clip-folder/", dtype=np.float64)
    out = model.forward(input_ids, pixel_values, return_loss=True)   # (B_t, T) ids, (B_i, C, H, W) pixels
    out.logits_per_image                                              # (B_i, B_t): exp(logit_scale) * cosines
    model.zero_grad()
    model.backward(dloss=1.0)                                         # or dlogits_per_image=..., dtext_embeds=...

Shape letters as in `vision`, with B_t texts of T tokens, B_i images, D_t and D_v the towers' widths and P the
shared space (projection_dim). New pairs here: the end token's position (no gradient: an index), the scaled cosine
logits with their temperature, and CLIP's symmetric contrastive loss; the towers are `vision`'s pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from transformer_spec.families.clip import (
    CLIP_LAYER,
    CLIP_PREFIXES,
    CLIP_SKIPPED,
    LEGACY_EOS,
    CLIPConfig,
    clip_config_from_hf,
    clip_config_to_hf,
    clip_shapes,
)
from transformer_spec.families.vit import state_in_our_names

from .layers import (
    add_positions_backward,
    add_positions_forward,
    embedding_backward,
    embedding_forward,
    l2_normalize_backward,
    l2_normalize_forward,
    layer_norm_backward,
    layer_norm_forward,
    linear_backward,
    linear_forward,
)
from .loss import log_softmax
from .validation import check_float_array
from .vision import (
    StateMixin,
    check_pixels,
    class_token_pool_backward,
    class_token_pool_forward,
    patch_embedding_backward,
    patch_embedding_forward,
    pre_norm_layer_backward,
    pre_norm_layer_forward,
    prepend_class_token_backward,
    prepend_class_token_forward,
    random_params,
    read_folder,
    refuse_interpolation,
    token_pool_backward,
    token_pool_forward,
    write_folder,
)

# ----------------------------------------------------------------------------------------------
# The end token: where the text tower reads a sentence's meaning (its causal mask lets only the last token see all).


def end_token_positions(input_ids: np.ndarray, eos_token_id: int) -> np.ndarray:
    """(B, T) ids -> (B,) the position each text is pooled at, as CLIPTextTransformer picks it: with eos_token_id == 2
    (the early releases' value) the largest id of the row (the end-of-text token is the vocabulary's last; the first
    such position on a tie); otherwise the first position holding eos_token_id (position 0 when none does)."""
    if eos_token_id == LEGACY_EOS:
        return input_ids.argmax(axis=-1)
    return (input_ids == eos_token_id).argmax(axis=-1)


def end_token_pool_forward(hidden: np.ndarray, positions: np.ndarray):
    r"""hidden (B, T, D), positions (B,) (end_token_positions) -> :math:`y_b = h_{b, t_b}`, (B, D)."""
    return token_pool_forward(hidden, positions)


def end_token_pool_backward(dout: np.ndarray, cache) -> np.ndarray:
    r"""Gradient of :math:`y_b = h_{b, t_b}`: dy at each end token, zero elsewhere, (B, T, D)."""
    return token_pool_backward(dout, cache)


# ----------------------------------------------------------------------------------------------
# Scaled cosine logits: unit text and image embeddings, their dot products times a learned temperature exp(s).


@dataclass(frozen=True, slots=True)
class CosineLogitsCache:
    text: np.ndarray  # unit text embeddings t (B_t, P)
    image: np.ndarray  # unit image embeddings i (B_i, P)
    scale: np.ndarray  # exp(s), a 0-d array
    logits: np.ndarray  # L (B_t, B_i)


def cosine_logits_forward(
    text_embeds: np.ndarray, image_embeds: np.ndarray, logit_scale: np.ndarray
) -> tuple[np.ndarray, CosineLogitsCache]:
    r"""text_embeds (B_t, P) and image_embeds (B_i, P), unit rows, logit_scale s (a 0-d array) -> logits_per_text

    .. math::

        L = e^{s}\, T I^\top, \quad (B_t, B_i)

    (logits_per_image is its transpose)."""
    scale = np.exp(logit_scale)
    logits = (text_embeds @ image_embeds.T) * scale  # (B_t, B_i)
    return logits, CosineLogitsCache(text_embeds, image_embeds, scale, logits)


def cosine_logits_backward(dout: np.ndarray, cache: CosineLogitsCache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Gradients of :math:`L = e^s T I^\top`, dL (B_t, B_i):

    .. math::

        dT = e^s\, dL\, I, \qquad dI = e^s\, dL^\top T

        ds = \textstyle\sum_{jk} dL_{jk}\, L_{jk}

    (the derivative of :math:`e^s` is itself, so ds is the upstream gradient against the logits). dtext (B_t, P),
    dimage (B_i, P), dlogit_scale 0-d."""
    dcos = dout * cache.scale  # (B_t, B_i): the gradient of the cosines
    dtext = dcos @ cache.image  # (B_t, P)
    dimage = dcos.T @ cache.text  # (B_i, P)
    dscale = np.asarray((dout * cache.logits).sum(), dtype=dout.dtype)
    return dtext, dimage, dscale


# ----------------------------------------------------------------------------------------------
# CLIP's contrastive loss: in a batch of N matching image-text pairs, each text should pick its image among the N
# images and each image its text among the N texts; the mean of the two cross-entropies.


@dataclass(frozen=True, slots=True)
class ContrastiveLossCache:
    by_row: np.ndarray  # softmax of each row of L (texts choosing images), (N, N)
    by_column: np.ndarray  # softmax of each column of L (images choosing texts), (N, N)


def contrastive_loss_forward(logits_per_text: np.ndarray) -> tuple[np.floating, ContrastiveLossCache]:
    r"""logits_per_text L (N, N), the matching pairs on the diagonal -> the scalar loss of CLIPModel(return_loss=True):

    .. math::

        \mathcal{L} = \frac{1}{2N} \sum_k \Big[ \Big( \log \sum_j e^{L_{kj}} - L_{kk} \Big)
        + \Big( \log \sum_j e^{L_{jk}} - L_{kk} \Big) \Big]

    the cross-entropy of each row against the diagonal (each text's image) and of each column (each image's text)."""
    check_float_array("logits_per_text", logits_per_text)
    if logits_per_text.ndim != 2 or logits_per_text.shape[0] != logits_per_text.shape[1]:
        raise ValueError(
            f"logits_per_text must be square (N, N), as many texts as images (pair k is text k with image k), got "
            f"shape {logits_per_text.shape}"
        )
    n = logits_per_text.shape[0]
    by_row = log_softmax(logits_per_text)  # (N, N): log p(image j | text k)
    by_column = log_softmax(logits_per_text.T).T  # (N, N): log p(text j | image k), column k
    diagonal = np.arange(n)
    loss = -(by_row[diagonal, diagonal].mean() + by_column[diagonal, diagonal].mean()) / 2
    return loss, ContrastiveLossCache(np.exp(by_row), np.exp(by_column))


def contrastive_loss_backward(cache: ContrastiveLossCache, dloss: float = 1.0) -> np.ndarray:
    r"""Gradient of the contrastive loss with respect to L (N, N): each cross-entropy gives softmax minus one-hot,
    one along rows and one along columns,

    .. math::

        dL = \frac{d\mathcal{L}}{2N} \big( P^{\mathrm{row}} - I + P^{\mathrm{col}} - I \big)

    where :math:`P^{\mathrm{row}}` holds each row's softmax and :math:`P^{\mathrm{col}}` each column's."""
    n = cache.by_row.shape[0]
    dlogits = cache.by_row + cache.by_column
    dlogits[np.arange(n), np.arange(n)] -= 2.0
    dlogits *= float(dloss) / (2 * n)
    return dlogits


# ----------------------------------------------------------------------------------------------
# CLIPModel.


@dataclass
class CLIPOutput:
    """CLIPModel's output, transformers' names: loss (None without return_loss), logits_per_image (B_i, B_t),
    logits_per_text (B_t, B_i), text_embeds (B_t, P) and image_embeds (B_i, P), the unit rows of the shared space."""

    loss: np.floating | None
    logits_per_image: np.ndarray
    logits_per_text: np.ndarray
    text_embeds: np.ndarray
    image_embeds: np.ndarray


def check_ids(input_ids, vocab_size: int, max_len: int) -> np.ndarray:
    ids = np.asarray(input_ids)
    if ids.dtype == np.bool_ or not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"input_ids must be an integer array, got dtype {ids.dtype}")
    if ids.ndim != 2 or ids.shape[0] < 1 or not 1 <= ids.shape[1] <= max_len:
        raise ValueError(f"input_ids must have shape (B, T) with 1 <= T <= {max_len}, got {ids.shape}")
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise ValueError(f"input_ids must be in [0, {vocab_size}), got values from {ids.min()} to {ids.max()}")
    return ids


class CLIPModel(StateMixin):
    """transformers' CLIPModel in plain arrays, keyed by its state-dict names (transformer_spec.families.clip)."""

    def __init__(self, config: CLIPConfig, seed: int = 0, dtype=np.float64):
        self.config, self.dtype = config, np.dtype(dtype)
        self.params = random_params(clip_shapes(config), seed, self.dtype)
        self.params["logit_scale"][...] = config.logit_scale_init_value
        self.zero_grad()
        self._caches: dict | None = None

    def _layer(self, tower: str, i: int) -> dict:
        prefix = f"{tower}.encoder.layers.{i}."
        return {k[len(prefix) :]: v for k, v in self.params.items() if k.startswith(prefix)}

    def text_features(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None):
        """The text tower and text_projection: ids (B_t, T) -> (B_t, P) (get_text_features), and its caches."""
        c, P = self.config.text, self.params
        ids = check_ids(input_ids, c.vocab_size, c.max_position_embeddings)
        padding = None
        if attention_mask is not None:
            padding = np.asarray(attention_mask).astype(bool)
            if padding.shape != ids.shape:
                raise ValueError(f"attention_mask must have input_ids' shape {ids.shape}, got {padding.shape}")
        x, tokens = embedding_forward(ids, P["text_model.embeddings.token_embedding.weight"])  # (B_t, T, D_t)
        x, positions = add_positions_forward(x, P["text_model.embeddings.position_embedding.weight"])
        layers = []
        for i in range(c.num_hidden_layers):
            x, layer = pre_norm_layer_forward(
                self._layer("text_model", i), x, CLIP_LAYER, c.num_attention_heads, c.layer_norm_eps, c.hidden_act,
                is_causal=True, key_padding=padding,
            )  # fmt: skip
            layers.append(layer)
        w, b = P["text_model.final_layer_norm.weight"], P["text_model.final_layer_norm.bias"]
        x, final = layer_norm_forward(x, w, b, c.layer_norm_eps)
        pooled, pool = end_token_pool_forward(x, end_token_positions(ids, c.eos_token_id))  # (B_t, D_t)
        features, projection = linear_forward(pooled, P["text_projection.weight"], None)  # (B_t, P)
        return features, {"tokens": tokens, "positions": positions, "layers": layers, "final": final, "pool": pool,
                          "projection": projection}  # fmt: skip

    def image_features(self, pixel_values: np.ndarray):
        """The vision tower and visual_projection: pixels (B_i, C, H, W) -> (B_i, P) (get_image_features)."""
        c, P = self.config.vision, self.params
        pixel_values = check_pixels(pixel_values, self.dtype, c.num_channels, c.image_size)
        x, patch = patch_embedding_forward(pixel_values, P["vision_model.embeddings.patch_embedding.weight"], None)
        x, cls = prepend_class_token_forward(x, P["vision_model.embeddings.class_embedding"])  # (B_i, 1 + N, D_v)
        x, positions = add_positions_forward(x, P["vision_model.embeddings.position_embedding.weight"])
        x, pre = layer_norm_forward(
            x, P["vision_model.pre_layrnorm.weight"], P["vision_model.pre_layrnorm.bias"], c.layer_norm_eps
        )
        layers = []
        for i in range(c.num_hidden_layers):
            x, layer = pre_norm_layer_forward(
                self._layer("vision_model", i), x, CLIP_LAYER, c.num_attention_heads, c.layer_norm_eps, c.hidden_act
            )
            layers.append(layer)
        pooled, pool = class_token_pool_forward(x)  # (B_i, D_v)
        w, b = P["vision_model.post_layernorm.weight"], P["vision_model.post_layernorm.bias"]
        pooled, post = layer_norm_forward(pooled, w, b, c.layer_norm_eps)
        features, projection = linear_forward(pooled, P["visual_projection.weight"], None)  # (B_i, P)
        return features, {"patch": patch, "cls": cls, "positions": positions, "pre": pre, "layers": layers,
                          "pool": pool, "post": post, "projection": projection}  # fmt: skip

    def forward(
        self,
        input_ids: np.ndarray,
        pixel_values: np.ndarray,
        attention_mask: np.ndarray | None = None,
        return_loss: bool = False,
        interpolate_pos_encoding: bool = False,
    ) -> CLIPOutput:
        """input_ids (B_t, T), pixel_values (B_i, C, H, W), attention_mask (B_t, T) (1 = a real token) -> CLIPOutput;
        with return_loss the contrastive loss of the pairs (text k with image k: B_t = B_i)."""
        refuse_interpolation(interpolate_pos_encoding)
        text, text_caches = self.text_features(input_ids, attention_mask)
        image, image_caches = self.image_features(pixel_values)
        text_embeds, text_norm = l2_normalize_forward(text)  # (B_t, P), unit rows
        image_embeds, image_norm = l2_normalize_forward(image)  # (B_i, P)
        logits_per_text, logits = cosine_logits_forward(text_embeds, image_embeds, self.params["logit_scale"])
        loss, loss_cache = None, None
        if return_loss:
            loss, loss_cache = contrastive_loss_forward(logits_per_text)
        self._caches = {"text": text_caches, "image": image_caches, "text_norm": text_norm, "image_norm": image_norm,
                        "logits": logits, "loss": loss_cache}  # fmt: skip
        return CLIPOutput(loss, logits_per_text.T, logits_per_text, text_embeds, image_embeds)

    def backward(
        self,
        dlogits_per_image: np.ndarray | None = None,
        dlogits_per_text: np.ndarray | None = None,
        dtext_embeds: np.ndarray | None = None,
        dimage_embeds: np.ndarray | None = None,
        dloss: float | None = None,
    ) -> None:
        """Gradients of every parameter given the gradients of any of forward's outputs (by their names), added to
        `grads`; each output's gradient that is given adds to the paths it takes back."""
        if self._caches is None:
            raise ValueError("backward called before forward")
        cache = self._caches
        logits: np.ndarray = cache["logits"].logits
        dlogits = np.zeros_like(logits)  # (B_t, B_i): logits_per_text's gradient, from every output that reads it
        if dlogits_per_text is not None:
            dlogits += check_float_array("dlogits_per_text", dlogits_per_text, self.dtype, logits.shape)
        if dlogits_per_image is not None:
            dlogits += check_float_array("dlogits_per_image", dlogits_per_image, self.dtype, logits.T.shape).T
        if dloss is not None:
            if cache["loss"] is None:
                raise ValueError("dloss given, but forward ran without return_loss=True: there is no loss")
            dlogits += contrastive_loss_backward(cache["loss"], dloss)
        dtext, dimage, dscale = cosine_logits_backward(dlogits, cache["logits"])
        self.grads["logit_scale"] += dscale
        if dtext_embeds is not None:  # text_embeds is an output too: its gradient joins the logits'
            dtext = dtext + check_float_array("dtext_embeds", dtext_embeds, self.dtype, dtext.shape)
        if dimage_embeds is not None:
            dimage = dimage + check_float_array("dimage_embeds", dimage_embeds, self.dtype, dimage.shape)
        self._text_backward(l2_normalize_backward(dtext, cache["text_norm"]), cache["text"])
        self._image_backward(l2_normalize_backward(dimage, cache["image_norm"]), cache["image"])

    def _text_backward(self, dfeatures: np.ndarray, cache: dict) -> None:
        dpooled, dw, _ = linear_backward(dfeatures, cache["projection"])
        self.grads["text_projection.weight"] += dw
        dx = end_token_pool_backward(dpooled, cache["pool"])  # (B_t, T, D_t)
        dx, dw, db = layer_norm_backward(dx, cache["final"])
        self.accumulate({"text_model.final_layer_norm.weight": dw, "text_model.final_layer_norm.bias": db})
        for i in reversed(range(self.config.text.num_hidden_layers)):
            dx, grads = pre_norm_layer_backward(dx, cache["layers"][i])
            self.accumulate(grads, f"text_model.encoder.layers.{i}.")
        dx, dtable = add_positions_backward(dx, cache["positions"])
        self.grads["text_model.embeddings.position_embedding.weight"] += dtable
        self.grads["text_model.embeddings.token_embedding.weight"] += embedding_backward(dx, cache["tokens"])

    def _image_backward(self, dfeatures: np.ndarray, cache: dict) -> None:
        dpooled, dw, _ = linear_backward(dfeatures, cache["projection"])
        self.grads["visual_projection.weight"] += dw
        dpooled, dw, db = layer_norm_backward(dpooled, cache["post"])
        self.accumulate({"vision_model.post_layernorm.weight": dw, "vision_model.post_layernorm.bias": db})
        dx = class_token_pool_backward(dpooled, cache["pool"])  # (B_i, 1 + N, D_v)
        for i in reversed(range(self.config.vision.num_hidden_layers)):
            dx, grads = pre_norm_layer_backward(dx, cache["layers"][i])
            self.accumulate(grads, f"vision_model.encoder.layers.{i}.")
        dx, dw, db = layer_norm_backward(dx, cache["pre"])
        self.accumulate({"vision_model.pre_layrnorm.weight": dw, "vision_model.pre_layrnorm.bias": db})
        dx, dtable = add_positions_backward(dx, cache["positions"])
        self.grads["vision_model.embeddings.position_embedding.weight"] += dtable
        dx, dcls = prepend_class_token_backward(dx, cache["cls"])
        self.grads["vision_model.embeddings.class_embedding"] += dcls
        self.dpixel_values, dw, _ = patch_embedding_backward(dx, cache["patch"])
        self.grads["vision_model.embeddings.patch_embedding.weight"] += dw


def load(directory, dtype=np.float32) -> CLIPModel:
    """A CLIPModel checkpoint folder as a CLIPModel in `dtype`; ValueError naming a config value not computed here or
    the tensors that do not fit."""
    hf_config, tensors = read_folder(directory, "clip")
    config = clip_config_from_hf(hf_config)
    state = state_in_our_names(tensors, clip_shapes(config), CLIP_PREFIXES, CLIP_SKIPPED)
    model = CLIPModel(config, dtype=dtype)
    model.load_state_dict(state)
    return model


def save(model: CLIPModel, directory, overwrite: bool = False) -> None:
    """`model` as a CLIPModel checkpoint folder that transformers' CLIPModel.from_pretrained reads."""
    write_folder(directory, clip_config_to_hf(model.config) | {"dtype": model.dtype.name}, model.params, overwrite)
