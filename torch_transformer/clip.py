"""CLIP in PyTorch (torch's own ops: nn.Embedding, nn.Conv2d, nn.LayerNorm, scaled_dot_product_attention,
F.normalize, F.cross_entropy), with transformers' CLIPModel parameter names, numpy_transformer.clip's twin.

    from torch_transformer import clip
    model = clip.load("clip-folder/", dtype=torch.float64)
    out = model(input_ids, pixel_values, return_loss=True)
    out.loss.backward()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from transformer_spec.families.clip import (
    CLIP_LAYER,
    CLIP_PREFIXES,
    CLIP_SKIPPED,
    LEGACY_EOS,
    CLIPConfig,
    clip_config_from_hf,
    clip_config_to_hf,
)
from transformer_spec.families.vit import read_folder, state_in_our_names, write_folder

from .vision import PreNormLayer, check_pixels, refuse_interpolation


@dataclass
class CLIPOutput:
    loss: torch.Tensor | None
    logits_per_image: torch.Tensor
    logits_per_text: torch.Tensor
    text_embeds: torch.Tensor
    image_embeds: torch.Tensor


def end_token_positions(input_ids: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """Where each text is pooled: the largest id's position with the legacy eos_token_id 2, else the first eos."""
    if eos_token_id == LEGACY_EOS:
        return input_ids.argmax(dim=-1)
    return (input_ids == eos_token_id).int().argmax(dim=-1)


def layers(config, names=CLIP_LAYER) -> nn.ModuleList:
    return nn.ModuleList(
        PreNormLayer(names, config.hidden_size, config.intermediate_size, config.num_attention_heads,
                     config.layer_norm_eps, config.hidden_act)
        for _ in range(config.num_hidden_layers)
    )  # fmt: skip


class CLIPModel(nn.Module):
    """transformers' CLIPModel: forward(input_ids, pixel_values, attention_mask=None, return_loss=False) ->
    CLIPOutput."""

    def __init__(self, config: CLIPConfig):
        super().__init__()
        self.config = config
        t, v = config.text, config.vision
        self.text_model: Any = nn.Module()
        text = self.text_model
        text.embeddings = nn.Module()
        text.embeddings.token_embedding = nn.Embedding(t.vocab_size, t.hidden_size)
        text.embeddings.position_embedding = nn.Embedding(t.max_position_embeddings, t.hidden_size)
        text.encoder = nn.Module()
        text.encoder.layers = layers(t)
        text.final_layer_norm = nn.LayerNorm(t.hidden_size, eps=t.layer_norm_eps)
        self.vision_model: Any = nn.Module()
        vision = self.vision_model
        vision.embeddings = nn.Module()
        vision.embeddings.class_embedding = nn.Parameter(0.02 * torch.randn(v.hidden_size))
        vision.embeddings.patch_embedding = nn.Conv2d(
            v.num_channels, v.hidden_size, kernel_size=v.patch_size, stride=v.patch_size, bias=False
        )
        vision.embeddings.position_embedding = nn.Embedding(v.n_patches + 1, v.hidden_size)
        vision.pre_layrnorm = nn.LayerNorm(v.hidden_size, eps=v.layer_norm_eps)
        vision.encoder = nn.Module()
        vision.encoder.layers = layers(v)
        vision.post_layernorm = nn.LayerNorm(v.hidden_size, eps=v.layer_norm_eps)
        self.visual_projection = nn.Linear(v.hidden_size, config.projection_dim, bias=False)
        self.text_projection = nn.Linear(t.hidden_size, config.projection_dim, bias=False)
        self.logit_scale = nn.Parameter(torch.tensor(config.logit_scale_init_value))

    def text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        t, m = self.config.text, self.text_model
        T = input_ids.shape[1]
        if T > t.max_position_embeddings:
            raise ValueError(f"input_ids: {T} tokens, more than max_position_embeddings={t.max_position_embeddings}")
        x = m.embeddings.token_embedding(input_ids) + m.embeddings.position_embedding.weight[:T]  # (B_t, T, D_t)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()  # causal: key j <= query i
        if attention_mask is not None:
            mask = mask & attention_mask.bool()[:, None, None, :]  # (B_t, 1, T, T): padded keys hidden too
        for layer in m.encoder.layers:
            x = layer(x, mask)
        x = m.final_layer_norm(x)
        pooled = x[torch.arange(x.shape[0], device=x.device), end_token_positions(input_ids, t.eos_token_id)]
        return self.text_projection(pooled)  # (B_t, P)

    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        v, m = self.config.vision, self.vision_model
        check_pixels(pixel_values, v.num_channels, v.image_size)
        x = m.embeddings.patch_embedding(pixel_values).flatten(2).transpose(1, 2)  # (B_i, N, D_v)
        cls = m.embeddings.class_embedding.expand(x.shape[0], 1, -1)
        x = torch.cat([cls, x], dim=1) + m.embeddings.position_embedding.weight  # (B_i, 1 + N, D_v)
        x = m.pre_layrnorm(x)
        for layer in m.encoder.layers:
            x = layer(x)
        return self.visual_projection(m.post_layernorm(x[:, 0]))  # (B_i, P)

    def forward(
        self,
        input_ids: torch.Tensor,
        pixel_values: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        return_loss: bool = False,
        interpolate_pos_encoding: bool = False,
    ) -> CLIPOutput:
        refuse_interpolation(interpolate_pos_encoding)
        text_embeds = F.normalize(self.text_features(input_ids, attention_mask), dim=-1)
        image_embeds = F.normalize(self.image_features(pixel_values), dim=-1)
        logits_per_text = self.logit_scale.exp() * text_embeds @ image_embeds.T  # (B_t, B_i)
        loss = None
        if return_loss:
            if logits_per_text.shape[0] != logits_per_text.shape[1]:
                raise ValueError(f"return_loss needs as many texts as images, got {tuple(logits_per_text.shape)}")
            target = torch.arange(logits_per_text.shape[0], device=logits_per_text.device)
            loss = (F.cross_entropy(logits_per_text, target) + F.cross_entropy(logits_per_text.T, target)) / 2
        return CLIPOutput(loss, logits_per_text.T, logits_per_text, text_embeds, image_embeds)


def load(directory, dtype=torch.float32, device=None) -> CLIPModel:
    """A CLIPModel checkpoint folder as the torch CLIPModel."""
    hf_config, tensors = read_folder(directory, "clip")
    model = CLIPModel(clip_config_from_hf(hf_config)).to(dtype=dtype, device=device)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    state = state_in_our_names(tensors, shapes, CLIP_PREFIXES, CLIP_SKIPPED)
    model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in state.items()})
    return model.eval()


def save(model: CLIPModel, directory, overwrite: bool = False) -> None:
    """`model` as a CLIPModel checkpoint folder that transformers' from_pretrained reads."""
    params = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    write_folder(directory, clip_config_to_hf(model.config) | {"dtype": dtype}, params, overwrite)
