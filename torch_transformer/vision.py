"""ViT in PyTorch, written as a PyTorch user would (nn.Conv2d for the patches, nn.LayerNorm,
scaled_dot_product_attention), with the parameter names of the released checkpoints, so that
numpy_transformer.vision's state dict loads unchanged.

    from torch_transformer import vision
    model = vision.load("vit-folder/", dtype=torch.float64)
    hidden = model(pixel_values)          # (B, C, H, W) -> (B, 1 + N, D)
    pooled = model.pool(hidden)           # (B, P)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

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
    write_folder,
)

from .layers import ACTIVATIONS  # ViT's gelu and CLIP's quick_gelu among them


def attach(root: nn.Module, dotted: str, child: nn.Module) -> None:
    """root.<a>.<b>.<c> = child, making the plain containers a and b on the way (a family's dotted names)."""
    *path, last = dotted.split(".")
    module = root
    for part in path:
        if not hasattr(module, part):
            module.add_module(part, nn.Module())
        module = getattr(module, part)
    module.add_module(last, child)


class PreNormLayer(nn.Module):
    """x = x + Attn(LN1(x)); x = x + fc2(act(fc1(LN2(x)))), its modules at the dotted names `names` gives
    (ViT: layernorm_before, attention.attention.query, ...; CLIP: layer_norm1, self_attn.q_proj, ...)."""

    def __init__(self, names: dict, D: int, F_: int, n_heads: int, eps: float, activation: str, qkv_bias: bool = True):
        super().__init__()
        self.names, self.n_heads, self.act = names, n_heads, ACTIVATIONS[activation]
        for part in ("norm1", "norm2"):
            attach(self, names[part], nn.LayerNorm(D, eps=eps))
        for part in ("q", "k", "v"):
            attach(self, names[part], nn.Linear(D, D, bias=qkv_bias))
        attach(self, names["out"], nn.Linear(D, D))
        attach(self, names["fc1"], nn.Linear(D, F_))
        attach(self, names["fc2"], nn.Linear(F_, D))

    def part(self, name: str) -> nn.Module:
        return self.get_submodule(self.names[name])

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, D = x.shape
        h = self.part("norm1")(x)
        q, k, v = (
            self.part(n)(h).view(B, T, self.n_heads, -1).transpose(1, 2) for n in ("q", "k", "v")
        )  # (B, H, T, Dh)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, Dh)
        x = x + self.part("out")(a.transpose(1, 2).reshape(B, T, D))
        return x + self.part("fc2")(self.act(self.part("fc1")(self.part("norm2")(x))))


def refuse_interpolation(interpolate_pos_encoding) -> None:
    if interpolate_pos_encoding:
        raise ValueError(
            "interpolate_pos_encoding=True is not supported (the bicubic resampling of the position table to "
            "another image size is not computed here): pass images of the configured image_size"
        )


def check_pixels(pixel_values: torch.Tensor, channels: int, size: int) -> None:
    if not isinstance(pixel_values, torch.Tensor) or not pixel_values.is_floating_point():
        raise TypeError(f"pixel_values must be a float tensor, got {type(pixel_values).__name__}")
    if pixel_values.ndim != 4 or tuple(pixel_values.shape[1:]) != (channels, size, size):
        raise ValueError(
            f"pixel_values must have shape (B, {channels}, {size}, {size}), got {tuple(pixel_values.shape)}"
        )


class ViTModel(nn.Module):
    """transformers' ViTModel: forward(pixel_values) -> last_hidden_state (B, 1 + N, D); pool(hidden) ->
    pooler_output."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.config = c = config
        D, p = c.hidden_size, c.patch_size
        self.embeddings: Any = nn.Module()
        self.embeddings.cls_token = nn.Parameter(0.02 * torch.randn(1, 1, D))
        self.embeddings.position_embeddings = nn.Parameter(0.02 * torch.randn(1, c.n_patches + 1, D))
        self.embeddings.patch_embeddings = nn.Module()
        self.embeddings.patch_embeddings.projection = nn.Conv2d(c.num_channels, D, kernel_size=p, stride=p)
        self.encoder: Any = nn.Module()
        self.encoder.layer = nn.ModuleList(
            PreNormLayer(VIT_LAYER, D, c.intermediate_size, c.num_attention_heads, c.layer_norm_eps, c.hidden_act,
                         c.qkv_bias)
            for _ in range(c.num_hidden_layers)
        )  # fmt: skip
        self.layernorm = nn.LayerNorm(D, eps=c.layer_norm_eps)
        if c.pooler:
            self.pooler: Any = nn.Module()
            self.pooler.dense = nn.Linear(D, c.pooler_output_size)

    def forward(self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool = False) -> torch.Tensor:
        refuse_interpolation(interpolate_pos_encoding)
        check_pixels(pixel_values, self.config.num_channels, self.config.image_size)
        e = self.embeddings
        x = e.patch_embeddings.projection(pixel_values).flatten(2).transpose(1, 2)  # (B, N, D)
        x = torch.cat([e.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # (B, 1 + N, D)
        x = x + e.position_embeddings
        for layer in self.encoder.layer:
            x = layer(x)
        return self.layernorm(x)

    def pool(self, hidden: torch.Tensor) -> torch.Tensor:
        if not self.config.pooler:
            raise ValueError("pool: this model has no pooler (its checkpoint had no pooler.dense tensors)")
        return torch.tanh(self.pooler.dense(hidden[:, 0]))


def load(directory, dtype=torch.float32, device=None) -> ViTModel:
    """A ViT checkpoint folder as the torch ViTModel (as numpy_transformer.vision.load reads it)."""
    hf_config, tensors = read_folder(directory, "vit")
    config = vit_config_from_hf(hf_config, pooler=vit_pooler_in(tensors))
    model = ViTModel(config).to(dtype=dtype, device=device)  # the dtype first: filled without rounding
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    state = state_in_our_names(tensors, shapes, VIT_PREFIXES, VIT_SKIPPED, file_name)
    model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in state.items()})
    return model.eval()


def save(model: ViTModel, directory, overwrite: bool = False) -> None:
    """`model` as a ViTModel checkpoint folder that transformers' from_pretrained reads."""
    params = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    dtype = next(model.parameters()).dtype
    write_folder(directory, vit_config_to_hf(model.config) | {"dtype": str(dtype).removeprefix("torch.")}, params,
                 overwrite)  # fmt: skip
