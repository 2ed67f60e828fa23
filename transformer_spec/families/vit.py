"""ViT (ViTModel, model_type vit; google/vit-base-patch16-224): an image cut into patches by a strided convolution,
each patch a token, a learned class token in front, learned positions, pre-norm encoder layers (layernorm_before,
layernorm_after, exact GELU), a final layernorm and the pooler (dense + tanh on the class token).

Not a `TransformerConfig` family: the model has no token table and its state-dict names are transformers' own (the
names of the released files), so this file holds its own config (`ViTConfig`, read from and written to config.json,
a value it does not compute refused by name), the parameter shapes, and the names of the files against the names of
transformers 5's ViTModel class (which renames `encoder.layer.{i}.attention.attention.query` to
`layers.{i}.attention.q_proj` on loading and back on saving). Both numpy_transformer.vision and torch_transformer.vision
read it. Nothing is registered in REGISTER: hf.load's families are the text ones; `vision.load` reads these.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from .core import is_finite_number, is_int, refuse

# hidden_act values computed here (ACT2FN's names): exact GELU (ViT) and QuickGELU, x * sigmoid(1.702 x) (CLIP)
ACTIVATIONS = ("gelu", "quick_gelu")


def positive_int(c: dict, name: str, default):
    """config.json's `name` (or `default`), which must be a positive int."""
    value = c.get(name, default)
    if not is_int(value) or value < 1:
        refuse(name, value, "a positive integer")
    return value


def positive_float(c: dict, name: str, default) -> float:
    value = c.get(name, default)
    if not is_finite_number(value) or value <= 0:
        refuse(name, value, "a positive finite number")
    return float(value)


def rate(c: dict, name: str, default=0.0) -> float:
    """A dropout rate: kept to be written back; the models here compute as in evaluation mode (no dropout)."""
    value = c.get(name, default)
    if not is_finite_number(value) or not 0 <= value < 1:
        refuse(name, value, "a rate in [0, 1)")
    return float(value)


def one_of(c: dict, name: str, default, allowed: tuple):
    value = c.get(name, default)
    if value not in allowed or isinstance(value, bool) != isinstance(allowed[0], bool):
        refuse(name, value, allowed)
    return value


def check_heads(hidden_size: int, heads: int, where: str = "") -> None:
    if hidden_size % heads:
        refuse(f"{where}num_attention_heads", heads, f"a divisor of hidden_size={hidden_size}")


def grid(image_size: int, patch_size: int, where: str = "") -> int:
    """Patches along one side: image_size // patch_size (the convolution's output size), at least one."""
    if patch_size > image_size:
        refuse(f"{where}patch_size", patch_size, f"at most image_size={image_size}")
    return image_size // patch_size


@dataclass(frozen=True)
class ViTConfig:
    hidden_size: int = 768  # D
    num_hidden_layers: int = 12
    num_attention_heads: int = 12  # H; head width D / H
    intermediate_size: int = 3072  # F
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    image_size: int = 224  # square images, image_size pixels a side
    patch_size: int = 16  # square patches: (image_size // patch_size)**2 tokens, plus the class token
    num_channels: int = 3  # C
    qkv_bias: bool = True
    pooler: bool = True  # ViTModel's add_pooling_layer: not in config.json, found from the checkpoint's tensors
    pooler_output_size: int = 768  # P, the pooler's width (ViTConfig: hidden_size when absent)
    pooler_act: str = "tanh"
    encoder_stride: int = 16  # the masked-image-modelling head's; no part of ViTModel, written back as read
    hidden_dropout_prob: float = 0.0  # rates written back; the models compute as in evaluation mode
    attention_probs_dropout_prob: float = 0.0

    def __post_init__(self):
        check_heads(self.hidden_size, self.num_attention_heads)
        grid(self.image_size, self.patch_size)
        if self.hidden_act not in ACTIVATIONS:
            refuse("hidden_act", self.hidden_act, ACTIVATIONS)
        if self.pooler_act != "tanh":
            refuse("pooler_act", self.pooler_act, ("tanh",))

    @property
    def n_patches(self) -> int:
        """N = (image_size // patch_size)**2: the tokens of an image, the class token not counted."""
        return grid(self.image_size, self.patch_size) ** 2


def vit_config_from_hf(c: dict, pooler: bool = True) -> ViTConfig:
    """config.json (a ViTModel's, ViTForImageClassification's) -> ViTConfig; ValueError naming a value not
    computed here (image_size or patch_size given as a pair, an activation other than gelu / quick_gelu, a pooler_act
    other than tanh, a head_dim other than hidden_size / heads)."""
    if c.get("model_type", "vit") != "vit":
        refuse("model_type", c.get("model_type"), ("vit",))
    hidden = positive_int(c, "hidden_size", 768)
    heads = positive_int(c, "num_attention_heads", 12)
    check_heads(hidden, heads)
    if c.get("head_dim", hidden // heads) != hidden // heads:
        refuse("head_dim", c["head_dim"], f"hidden_size / num_attention_heads = {hidden // heads}")
    image, patch = positive_int(c, "image_size", 224), positive_int(c, "patch_size", 16)
    grid(image, patch)
    return ViTConfig(
        hidden_size=hidden,
        num_hidden_layers=positive_int(c, "num_hidden_layers", 12),
        num_attention_heads=heads,
        intermediate_size=positive_int(c, "intermediate_size", 3072),
        hidden_act=one_of(c, "hidden_act", "gelu", ACTIVATIONS),
        layer_norm_eps=positive_float(c, "layer_norm_eps", 1e-12),
        image_size=image,
        patch_size=patch,
        num_channels=positive_int(c, "num_channels", 3),
        qkv_bias=one_of(c, "qkv_bias", True, (True, False)),
        pooler=pooler,
        pooler_output_size=positive_int(c, "pooler_output_size", hidden) if c.get("pooler_output_size") else hidden,
        pooler_act=one_of(c, "pooler_act", "tanh", ("tanh",)),
        encoder_stride=positive_int(c, "encoder_stride", 16),
        hidden_dropout_prob=rate(c, "hidden_dropout_prob"),
        attention_probs_dropout_prob=rate(c, "attention_probs_dropout_prob"),
    )


def vit_config_to_hf(config: ViTConfig) -> dict:
    """ViTConfig -> config.json's fields (ViTModel's)."""
    out = {k: v for k, v in asdict(config).items() if k != "pooler"}
    return out | {"model_type": "vit", "architectures": ["ViTModel"]}


def encoder_layer_shapes(prefix: str, names: dict, D: int, F: int, qkv_bias: bool) -> dict:
    """The shapes of one pre-norm encoder layer's tensors under `prefix`, its sublayers named by `names`
    (norm1, q, k, v, out, norm2, fc1, fc2: ViT_LAYER or clip.CLIP_LAYER)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for part in ("norm1", "norm2"):
        shapes |= {f"{prefix}{names[part]}.weight": (D,), f"{prefix}{names[part]}.bias": (D,)}
    for part in ("q", "k", "v"):
        shapes[f"{prefix}{names[part]}.weight"] = (D, D)
        if qkv_bias:
            shapes[f"{prefix}{names[part]}.bias"] = (D,)
    shapes |= {f"{prefix}{names['out']}.weight": (D, D), f"{prefix}{names['out']}.bias": (D,)}
    shapes |= {f"{prefix}{names['fc1']}.weight": (F, D), f"{prefix}{names['fc1']}.bias": (F,)}
    shapes |= {f"{prefix}{names['fc2']}.weight": (D, F), f"{prefix}{names['fc2']}.bias": (D,)}
    return shapes


# Where a ViT layer's tensors live below encoder.layer.{i}. (the released files' names)
VIT_LAYER = {
    "norm1": "layernorm_before",
    "q": "attention.attention.query",
    "k": "attention.attention.key",
    "v": "attention.attention.value",
    "out": "attention.output.dense",
    "norm2": "layernorm_after",
    "fc1": "intermediate.dense",
    "fc2": "output.dense",
}


def vit_shapes(config: ViTConfig) -> dict:
    """Every parameter's name (the released files') and shape, in the order of the forward pass."""
    D, C, p = config.hidden_size, config.num_channels, config.patch_size
    shapes = {
        "embeddings.cls_token": (1, 1, D),
        "embeddings.position_embeddings": (1, config.n_patches + 1, D),
        "embeddings.patch_embeddings.projection.weight": (D, C, p, p),
        "embeddings.patch_embeddings.projection.bias": (D,),
    }
    for i in range(config.num_hidden_layers):
        shapes |= encoder_layer_shapes(f"encoder.layer.{i}.", VIT_LAYER, D, config.intermediate_size, config.qkv_bias)
    shapes |= {"layernorm.weight": (D,), "layernorm.bias": (D,)}
    if config.pooler:
        shapes |= {
            "pooler.dense.weight": (config.pooler_output_size, D),
            "pooler.dense.bias": (config.pooler_output_size,),
        }
    return shapes


# The names of transformers 5's ViTModel class (its state_dict, named_parameters) against the files' names: the
# class renames on loading and back on saving, so both spellings are read and the files' are written. The first
# template that matches a name renames it.
CLASS_NAMES = (
    ("encoder.layer.{i}.attention.attention.query.", "layers.{i}.attention.q_proj."),
    ("encoder.layer.{i}.attention.attention.key.", "layers.{i}.attention.k_proj."),
    ("encoder.layer.{i}.attention.attention.value.", "layers.{i}.attention.v_proj."),
    ("encoder.layer.{i}.attention.output.dense.", "layers.{i}.attention.o_proj."),
    ("encoder.layer.{i}.intermediate.dense.", "layers.{i}.mlp.fc1."),
    ("encoder.layer.{i}.output.dense.", "layers.{i}.mlp.fc2."),
    ("encoder.layer.{i}.", "layers.{i}."),
)


def _renamed(name: str, source: int) -> str:
    """`name` with the first matching template of CLASS_NAMES' column `source` replaced by the other column's."""
    for pair in CLASS_NAMES:
        pattern = "^" + re.escape(pair[source]).replace(re.escape("{i}"), r"(\d+)")
        found = re.match(pattern, name)
        if found:
            return pair[1 - source].replace("{i}", found.group(1)) + name[found.end() :]
    return name


def class_name(name: str) -> str:
    """A file name (ours) -> the name transformers 5's ViTModel gives that parameter."""
    return _renamed(name, 0)


def file_name(name: str) -> str:
    """transformers 5's ViTModel parameter name -> the files' name (ours); other names as they are."""
    return _renamed(name, 1)


VIT_PREFIXES = ("vit.",)  # ViTForImageClassification's base model
VIT_SKIPPED = (r"^classifier\.", r"^embeddings\.mask_token$")  # heads and the masked-image token: not ViTModel's


def state_in_our_names(
    tensors: dict, shapes: dict, prefixes: tuple, skipped: tuple, rename=lambda name: name, where="model.safetensors"
) -> dict:
    """The checkpoint's tensors under our names (prefixes stripped, a class spelling `rename`d to the files'),
    every tensor of `shapes` present with its shape, the `skipped` ones dropped. ValueError listing every missing,
    mis-shaped and unknown tensor."""
    state, unknown = {}, []
    for name, array in tensors.items():
        relative = next((name[len(p) :] for p in prefixes if name.startswith(p)), name)
        relative = rename(relative)
        if relative in shapes:
            state[relative] = array
        elif not any(re.search(pattern, relative) for pattern in skipped):
            unknown.append(name)
    missing = [name for name in shapes if name not in state]
    misshaped = [
        f"{name} {tuple(state[name].shape)} (expected {shape})"
        for name, shape in shapes.items()
        if name in state and tuple(state[name].shape) != tuple(shape)
    ]
    if missing or misshaped or unknown:
        problems = [f"missing {missing}"] * bool(missing) + [f"mis-shaped {misshaped}"] * bool(misshaped)
        problems += [f"unknown {unknown}"] * bool(unknown)
        raise ValueError(f"{where}: tensors do not fit config.json: {'; '.join(problems)}")
    return state


def vit_pooler_in(tensors: dict) -> bool:
    """Whether a ViT checkpoint holds the pooler (ViTModel's add_pooling_layer; ViTForImageClassification has none)."""
    return any(name.endswith("pooler.dense.weight") for name in tensors)


def read_folder(directory, family: str) -> tuple[dict, dict]:
    """(config.json, tensors) of a checkpoint folder, through the checks every family's reading shares."""
    from .. import checkpoints  # here, not at the top: checkpoints imports this package

    directory = Path(directory)
    hf_config = checkpoints.read_config(directory)
    if hf_config.get("model_type") != family:
        raise ValueError(f"{directory}/config.json: model_type={hf_config.get('model_type')!r}, expected {family!r}")
    return hf_config, checkpoints.read_tensors(directory)


def write_folder(directory, hf_config: dict, params: dict, overwrite: bool) -> None:
    """config.json and model.safetensors (`params`: name -> NumPy array) into `directory`, through the writer every
    family's save shares (a folder holding another checkpoint refused unless overwrite)."""
    import numpy as np
    from safetensors.numpy import save_file

    from .. import checkpoints

    write = lambda path, arrays: save_file(arrays, path, metadata={"format": "pt"})  # noqa: E731
    tensors = {k: np.asarray(v).copy(order="C") for k, v in params.items()}  # 0-d logit_scale stays 0-d
    checkpoints.write_checkpoint(directory, hf_config, None, tensors, write, overwrite)


def param_count(shapes: dict) -> int:
    return sum(math.prod(shape) for shape in shapes.values())


__all__ = [
    "ViTConfig",
    "vit_config_from_hf",
    "vit_config_to_hf",
    "vit_shapes",
    "VIT_LAYER",
    "class_name",
    "file_name",
    "state_in_our_names",
]
