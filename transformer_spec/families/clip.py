"""CLIP (CLIPModel, model_type clip; openai/clip-vit-base-patch32): two towers and a shared space.

The text tower: token and learned position embeddings, pre-norm layers (layer_norm1, self_attn with a causal mask,
layer_norm2, an MLP with QuickGELU), final_layer_norm, pooled at the end token. The vision tower: ViT's patches by a
strided convolution without bias, a class embedding in front, learned positions, `pre_layrnorm` (sic) before the
layers, post_layernorm on the class token. text_projection and visual_projection (no bias) map both into
projection_dim; the logits are the cosines times exp(logit_scale), and the loss is the symmetric cross-entropy of the
image-text pairs.

Where the text tower pools (CLIPTextTransformer): with text_config.eos_token_id == 2 (the value of the configs
released before transformers' PR 24773, openai/clip-vit-base-patch32's among them) at the largest id of each row
(argmax of the ids: the end-of-text token is the vocabulary's last); otherwise at the first position holding
eos_token_id. Both are computed (`end_token_positions` in numpy_transformer.clip and torch_transformer.clip).

As vit.py, a family of its own config (`CLIPConfig` of a `CLIPTextConfig` and a `CLIPVisionConfig`) and of
transformers' names; nothing registered in REGISTER.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .core import is_int, refuse
from .vit import ACTIVATIONS, check_heads, encoder_layer_shapes, grid, one_of, positive_float, positive_int, rate

# Where a CLIP layer's tensors live below {text,vision}_model.encoder.layers.{i}.
CLIP_LAYER = {
    "norm1": "layer_norm1",
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "out": "self_attn.out_proj",
    "norm2": "layer_norm2",
    "fc1": "mlp.fc1",
    "fc2": "mlp.fc2",
}

LEGACY_EOS = 2  # text_config.eos_token_id of the early releases: pooled at the argmax of the ids


@dataclass(frozen=True)
class CLIPTextConfig:
    vocab_size: int = 49408  # V
    hidden_size: int = 512  # D_t
    intermediate_size: int = 2048
    num_hidden_layers: int = 12
    num_attention_heads: int = 8
    max_position_embeddings: int = 77
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5
    pad_token_id: int | None = 1
    bos_token_id: int | None = 49406
    eos_token_id: int = 49407  # where the text is pooled (LEGACY_EOS: at the largest id)
    dropout: float = 0.0  # rates written back; the models compute as in evaluation mode
    attention_dropout: float = 0.0


@dataclass(frozen=True)
class CLIPVisionConfig:
    hidden_size: int = 768  # D_v
    intermediate_size: int = 3072
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    num_channels: int = 3
    image_size: int = 224
    patch_size: int = 32
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5
    dropout: float = 0.0
    attention_dropout: float = 0.0

    @property
    def n_patches(self) -> int:
        return grid(self.image_size, self.patch_size) ** 2


@dataclass(frozen=True)
class CLIPConfig:
    text: CLIPTextConfig = CLIPTextConfig()
    vision: CLIPVisionConfig = CLIPVisionConfig()
    projection_dim: int = 512  # P, the shared space
    logit_scale_init_value: float = 2.6592  # log(1 / 0.07): the initial logit_scale (the checkpoint holds its own)


def _token_id(c: dict, name: str, default, where: str, optional: bool = True):
    value = c.get(name, default)
    if value is None and optional:
        return None
    if not is_int(value) or value < 0:
        refuse(f"{where}{name}", value, "a non-negative integer" + (" or null" if optional else ""))
    return value


def _tower(c: dict, name: str) -> dict:
    """text_config (or vision_config), as CLIPConfig reads it: an old file's text_config_dict, when present, wins
    whole (CLIPConfig fills it with CLIPTextConfig's defaults and writes every value over text_config's)."""
    tower, old = c.get(name, {}), c.get(f"{name}_dict")
    if old is not None:
        tower, name = old, f"{name}_dict"
    if not isinstance(tower, dict):
        refuse(name, tower, "an object")
    return tower


def _common(t: dict, where: str, defaults) -> dict:
    hidden = positive_int(t, "hidden_size", defaults.hidden_size)
    heads = positive_int(t, "num_attention_heads", defaults.num_attention_heads)
    check_heads(hidden, heads, where)
    return dict(
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=positive_int(t, "intermediate_size", defaults.intermediate_size),
        num_hidden_layers=positive_int(t, "num_hidden_layers", defaults.num_hidden_layers),
        hidden_act=one_of(t, "hidden_act", defaults.hidden_act, ACTIVATIONS),
        layer_norm_eps=positive_float(t, "layer_norm_eps", defaults.layer_norm_eps),
        dropout=rate(t, "dropout"),
        attention_dropout=rate(t, "attention_dropout"),
    )


def clip_config_from_hf(c: dict) -> CLIPConfig:
    """config.json (CLIPModel's) -> CLIPConfig; ValueError naming a value not computed here (an activation other than
    quick_gelu / gelu, an eos_token_id list, sizes that are not positive integers)."""
    if c.get("model_type", "clip") != "clip":
        refuse("model_type", c.get("model_type"), ("clip",))
    t, v = _tower(c, "text_config"), _tower(c, "vision_config")
    d = CLIPTextConfig()
    text = CLIPTextConfig(
        vocab_size=positive_int(t, "vocab_size", d.vocab_size),
        max_position_embeddings=positive_int(t, "max_position_embeddings", d.max_position_embeddings),
        pad_token_id=_token_id(t, "pad_token_id", d.pad_token_id, "text_config."),
        bos_token_id=_token_id(t, "bos_token_id", d.bos_token_id, "text_config."),
        eos_token_id=_token_id(t, "eos_token_id", d.eos_token_id, "text_config.", optional=False),
        **_common(t, "text_config.", d),
    )
    dv = CLIPVisionConfig()
    image, patch = positive_int(v, "image_size", dv.image_size), positive_int(v, "patch_size", dv.patch_size)
    grid(image, patch, "vision_config.")
    vision = CLIPVisionConfig(
        num_channels=positive_int(v, "num_channels", dv.num_channels),
        image_size=image,
        patch_size=patch,
        **_common(v, "vision_config.", dv),
    )
    return CLIPConfig(
        text=text,
        vision=vision,
        projection_dim=positive_int(c, "projection_dim", 512),
        logit_scale_init_value=positive_float(c, "logit_scale_init_value", 2.6592),
    )


def clip_config_to_hf(config: CLIPConfig) -> dict:
    """CLIPConfig -> config.json (CLIPModel's)."""
    return {
        "model_type": "clip",
        "architectures": ["CLIPModel"],
        "projection_dim": config.projection_dim,
        "logit_scale_init_value": config.logit_scale_init_value,
        "text_config": asdict(config.text) | {"model_type": "clip_text_model", "projection_dim": config.projection_dim},
        "vision_config": asdict(config.vision)
        | {"model_type": "clip_vision_model", "projection_dim": config.projection_dim},
    }


def clip_shapes(config: CLIPConfig) -> dict:
    """Every parameter's name (transformers' CLIPModel's, the files' too) and shape."""
    t, v, P = config.text, config.vision, config.projection_dim
    shapes: dict = {
        "text_model.embeddings.token_embedding.weight": (t.vocab_size, t.hidden_size),
        "text_model.embeddings.position_embedding.weight": (t.max_position_embeddings, t.hidden_size),
    }
    for i in range(t.num_hidden_layers):
        prefix = f"text_model.encoder.layers.{i}."
        shapes |= encoder_layer_shapes(prefix, CLIP_LAYER, t.hidden_size, t.intermediate_size, True)
    shapes |= {
        "text_model.final_layer_norm.weight": (t.hidden_size,),
        "text_model.final_layer_norm.bias": (t.hidden_size,),
    }
    D, p = v.hidden_size, v.patch_size
    shapes |= {
        "vision_model.embeddings.class_embedding": (D,),
        "vision_model.embeddings.patch_embedding.weight": (D, v.num_channels, p, p),
        "vision_model.embeddings.position_embedding.weight": (v.n_patches + 1, D),
        "vision_model.pre_layrnorm.weight": (D,),
        "vision_model.pre_layrnorm.bias": (D,),
    }
    for i in range(v.num_hidden_layers):
        shapes |= encoder_layer_shapes(f"vision_model.encoder.layers.{i}.", CLIP_LAYER, D, v.intermediate_size, True)
    shapes |= {"vision_model.post_layernorm.weight": (D,), "vision_model.post_layernorm.bias": (D,)}
    shapes |= {"visual_projection.weight": (P, D), "text_projection.weight": (P, t.hidden_size), "logit_scale": ()}
    return shapes


CLIP_PREFIXES = ()
CLIP_SKIPPED = (r"\.position_ids$",)  # the towers' position buffers, which older files hold

__all__ = [
    "CLIPConfig",
    "CLIPTextConfig",
    "CLIPVisionConfig",
    "CLIP_LAYER",
    "LEGACY_EOS",
    "clip_config_from_hf",
    "clip_config_to_hf",
    "clip_shapes",
]
