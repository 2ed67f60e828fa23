"""ViT and CLIP against transformers' ViTModel and CLIPModel, both sides, in float64: outputs and every parameter's
gradient under random upstream gradients (non-zero asserted), the DESIGN.md measure with its 1e-10 bar; finite
differences of the new pairs; checkpoints in and out; the refusals by name.

Tiny models keep the released config.json's options (google/vit-base-patch16-224: exact GELU, layer_norm_eps 1e-12,
qkv_bias, a 14x14 grid of 16-pixel patches shrunk to 4x4 of 4; openai/clip-vit-base-patch32: quick_gelu, 1e-5, the
legacy text eos_token_id 2, a 7x7 grid of 32-pixel patches shrunk to 2x2 of 8), with random weights, built and saved
here (never downloaded). transformers runs its sdpa attention: its eager attention takes the softmax in float32.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import transformers

from numpy_transformer import clip as np_clip
from numpy_transformer import gradcheck
from numpy_transformer import hf as numpy_hf
from numpy_transformer import vision as np_vision
from parity_tests.components import devices, relative_errors
from torch_transformer import clip as torch_clip
from torch_transformer import vision as torch_vision
from transformer_spec.families.clip import clip_config_from_hf
from transformer_spec.families.vit import class_name, vit_config_from_hf

BAR = 1e-10

# google/vit-base-patch16-224's config.json, its sizes shrunk (its keys and options as released)
VIT_RELEASED = {
    "architectures": ["ViTForImageClassification"], "attention_probs_dropout_prob": 0.0, "encoder_stride": 16,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.0, "hidden_size": 16, "image_size": 16, "initializer_range": 0.02,
    "intermediate_size": 24, "layer_norm_eps": 1e-12, "model_type": "vit", "num_attention_heads": 4,
    "num_channels": 3, "num_hidden_layers": 2, "patch_size": 4, "qkv_bias": True,
}  # fmt: skip
# openai/clip-vit-base-patch32's config.json, shrunk: the legacy special ids of its text_config kept (eos 2)
CLIP_RELEASED = {
    "architectures": ["CLIPModel"], "initializer_factor": 1.0, "logit_scale_init_value": 2.6592,
    "model_type": "clip", "projection_dim": 10,
    "text_config": {
        "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1, "hidden_act": "quick_gelu", "hidden_size": 16,
        "intermediate_size": 24, "layer_norm_eps": 1e-05, "max_position_embeddings": 9, "num_attention_heads": 4,
        "num_hidden_layers": 2, "vocab_size": 50, "dropout": 0.0, "attention_dropout": 0.0,
    },
    "vision_config": {
        "hidden_act": "quick_gelu", "hidden_size": 12, "image_size": 16, "intermediate_size": 20,
        "layer_norm_eps": 1e-05, "num_attention_heads": 3, "num_hidden_layers": 2, "patch_size": 8,
        "dropout": 0.0, "attention_dropout": 0.0,
    },
}  # fmt: skip


def perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random weights everywhere, the same every run (the init leaves biases zero and norms one, which would hide
    their errors; vectors near one, so that norms' gains stay gains)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=generator, dtype=p.dtype) + (1 if p.ndim == 1 else 0))
    return model.eval()


def build_vit(tmp_path, pooler=True, **changes):
    c = {k: v for k, v in VIT_RELEASED.items() if k not in ("architectures", "model_type")} | changes
    config = transformers.ViTConfig(**c, attn_implementation="sdpa")
    theirs = perturbed(transformers.ViTModel(config, add_pooling_layer=pooler).double(), 0)
    theirs.save_pretrained(tmp_path)
    return theirs


def build_clip(tmp_path, eos_token_id=2):
    c = {k: v for k, v in CLIP_RELEASED.items() if k not in ("architectures", "model_type")}
    c["text_config"] = c["text_config"] | {"eos_token_id": eos_token_id}
    theirs = perturbed(transformers.CLIPModel(transformers.CLIPConfig(**c, attn_implementation="sdpa")).double(), 1)
    theirs.save_pretrained(tmp_path)
    return theirs


def check(pairs: dict) -> float:
    """The worst DESIGN.md error over `pairs` (name -> (ours, theirs)); asserts it is under the bar, no NaN."""
    errors = relative_errors(pairs, np.float64)
    worst = max(e for _, e in errors.values())
    assert worst <= BAR, {k: e for k, (_, e) in errors.items() if not e <= BAR}
    return worst


def nonzero(grads: dict) -> None:
    zeros = [k for k, g in grads.items() if not np.abs(g).max() > 0]
    assert not zeros or all(".key.bias" in k or "k_proj.bias" in k for k in zeros), zeros  # softmax ignores b_K


# ----------------------------------------------------------------------------------------------
# ViT


def vit_theirs(theirs, pixels, dhidden, dpooled):
    x = torch.tensor(pixels, requires_grad=True)
    out = theirs(pixel_values=x)
    total = (out.last_hidden_state * torch.tensor(dhidden)).sum() + (out.pooler_output * torch.tensor(dpooled)).sum()
    theirs.zero_grad()
    total.backward()
    grads = {name: p.grad.numpy() for name, p in theirs.named_parameters()}
    return out.last_hidden_state.detach().numpy(), out.pooler_output.detach().numpy(), grads, x.grad.numpy()


# a variant of the options the released file keeps at their defaults: no q/k/v biases, a narrower pooler, QuickGELU
VIT_VARIANT = {"qkv_bias": False, "pooler_output_size": 6, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-6}


@pytest.mark.parametrize("variant", ["released", "variant"])
@pytest.mark.parametrize("side", ["numpy", *(f"torch-{device}" for device in devices())])
def test_vit_equals_transformers(tmp_path, side, variant):
    theirs = build_vit(tmp_path, **(VIT_VARIANT if variant == "variant" else {}))
    P = theirs.config.pooler_output_size
    rng = np.random.default_rng(0)
    pixels = rng.standard_normal((2, 3, 16, 16))
    dhidden, dpooled = rng.standard_normal((2, 17, 16)), rng.standard_normal((2, P))
    hidden_ref, pooled_ref, grads_ref, _ = vit_theirs(theirs, pixels, dhidden, dpooled)
    if side == "numpy":
        ours = np_vision.load(tmp_path, dtype=np.float64)
        hidden = ours.forward(pixels)
        pooled = ours.pool(hidden)
        ours.zero_grad()
        ours.backward(dhidden + ours.pool_backward(dpooled))
        grads = ours.grads
    else:
        device = side.removeprefix("torch-")
        model = torch_vision.load(tmp_path, dtype=torch.float64, device=device)
        h = model(torch.tensor(pixels, device=device))
        p = model.pool(h)
        ((h * torch.tensor(dhidden, device=device)).sum() + (p * torch.tensor(dpooled, device=device)).sum()).backward()
        hidden, pooled = h.detach().cpu().numpy(), p.detach().cpu().numpy()
        grads = {k: v.grad.cpu().numpy() for k, v in model.named_parameters()}
    assert set(map(class_name, grads)) == set(grads_ref)
    nonzero(grads)
    check({"last_hidden_state": (hidden, hidden_ref), "pooler_output": (pooled, pooled_ref)})
    check({k: (g, grads_ref[class_name(k)]) for k, g in grads.items()})


def test_vit_classification_checkpoint_and_save(tmp_path):
    """A ViTForImageClassification folder (vit. prefix, a classifier, no pooler) loads as ViTModel without pooler;
    hf.save's folder from either side loads into transformers' ViTModel with the same outputs."""
    config = transformers.ViTConfig(**VIT_RELEASED | {"num_labels": 3}, attn_implementation="sdpa")
    classifier = perturbed(transformers.ViTForImageClassification(config).double(), 2)
    classifier.save_pretrained(tmp_path / "cls")
    ours = np_vision.load(tmp_path / "cls", dtype=np.float64)
    assert not ours.config.pooler and "pooler.dense.weight" not in ours.params
    pixels = np.random.default_rng(1).standard_normal((1, 3, 16, 16))
    with torch.no_grad():
        ref = classifier.vit(pixel_values=torch.tensor(pixels)).last_hidden_state.numpy()
    check({"last_hidden_state": (ours.forward(pixels), ref)})
    with pytest.raises(ValueError, match="no pooler"):
        ours.pool(ours.forward(pixels))
    with pytest.raises(ValueError, match="numpy_transformer.vision.load"):
        numpy_hf.load(tmp_path / "cls")  # hf.load's families are TransformerConfig ones: it says where to go
    np_vision.save(ours, tmp_path / "np")
    torch_vision.save(torch_vision.load(tmp_path / "cls", dtype=torch.float64), tmp_path / "torch")
    for folder in ("np", "torch"):
        back = transformers.ViTModel.from_pretrained(tmp_path / folder, add_pooling_layer=False).double().eval()
        with torch.no_grad():
            check({folder: (back(pixel_values=torch.tensor(pixels)).last_hidden_state.numpy(), ref)})


# ----------------------------------------------------------------------------------------------
# CLIP

OUTPUTS = ("logits_per_image", "logits_per_text", "text_embeds", "image_embeds")


def clip_inputs(eos_token_id: int, rng):
    """3 texts of 7 tokens and 3 images; the texts end where the config says (the largest id for the legacy eos 2,
    else eos_token_id followed by padding), at different positions."""
    ids = rng.integers(3, 40, (3, 7))
    mask = np.ones_like(ids)
    for row, end in enumerate((4, 6, 2)):
        if eos_token_id == 2:
            ids[row, end] = 45 + row  # the row's largest id
        else:
            ids[row, end] = eos_token_id
            ids[row, end + 1 :] = 1  # padding after the end, masked out
            mask[row, end + 1 :] = 0
    return ids, mask, rng.standard_normal((3, 3, 16, 16))


@pytest.mark.parametrize(
    "side, eos_token_id",
    [("numpy", 2), ("numpy", 49), *((f"torch-{device}", 2) for device in devices())]
    + [pytest.param(f"torch-{device}", 49, marks=pytest.mark.slow) for device in devices()],
)
def test_clip_equals_transformers(tmp_path, side, eos_token_id):
    theirs = build_clip(tmp_path, eos_token_id)
    rng = np.random.default_rng(eos_token_id)
    ids, mask, pixels = clip_inputs(eos_token_id, rng)
    upstream = {name: rng.standard_normal((3, 10) if "embeds" in name else (3, 3)) for name in OUTPUTS}
    dloss = 0.7
    out = theirs(
        input_ids=torch.tensor(ids), pixel_values=torch.tensor(pixels), attention_mask=torch.tensor(mask),
        return_loss=True,
    )  # fmt: skip
    total = dloss * out.loss + sum((getattr(out, k) * torch.tensor(g)).sum() for k, g in upstream.items())
    total.backward()
    grads_ref = {name: p.grad.numpy() for name, p in theirs.named_parameters()}
    outputs_ref = {k: getattr(out, k).detach().numpy() for k in OUTPUTS} | {"loss": out.loss.detach().numpy()}
    if side == "numpy":
        ours = np_clip.load(tmp_path, dtype=np.float64)
        o = ours.forward(ids, pixels, attention_mask=mask, return_loss=True)
        ours.zero_grad()
        ours.backward(**{f"d{k}": g for k, g in upstream.items()}, dloss=dloss)
        outputs, grads = {k: getattr(o, k) for k in (*OUTPUTS, "loss")}, ours.grads
    else:
        device = side.removeprefix("torch-")
        model = torch_clip.load(tmp_path, dtype=torch.float64, device=device)
        on = lambda a: torch.tensor(a, device=device)  # noqa: E731
        o = model(on(ids), on(pixels), on(mask), return_loss=True)
        (dloss * o.loss + sum((getattr(o, k) * on(g)).sum() for k, g in upstream.items())).backward()
        outputs = {k: getattr(o, k).detach().cpu().numpy() for k in (*OUTPUTS, "loss")}
        grads = {k: v.grad.cpu().numpy() for k, v in model.named_parameters()}
    assert set(grads) == set(grads_ref)
    nonzero(grads)
    check({k: (np.asarray(outputs[k]), outputs_ref[k]) for k in outputs})
    check({k: (g, grads_ref[k]) for k, g in grads.items()})


def test_clip_left_padding_equals_transformers(tmp_path):
    """Left-padded texts: the causal mask and the padding leave the first queries nothing to attend to (all-zero
    probabilities, never NaN, on both sides); the loss and every gradient still equal transformers'."""
    theirs = build_clip(tmp_path, 49)
    ids, mask = np.array([[1, 1, 5, 6, 49], [3, 4, 49, 1, 1]]), np.array([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    pixels = np.random.default_rng(5).standard_normal((2, 3, 16, 16))
    out = theirs(input_ids=torch.tensor(ids), pixel_values=torch.tensor(pixels), attention_mask=torch.tensor(mask),
                 return_loss=True)  # fmt: skip
    out.loss.backward()
    grads_ref = {name: p.grad.numpy() for name, p in theirs.named_parameters()}
    ours = np_clip.load(tmp_path, dtype=np.float64)
    loss = ours.forward(ids, pixels, attention_mask=mask, return_loss=True).loss
    ours.zero_grad()
    ours.backward(dloss=1.0)
    model = torch_clip.load(tmp_path, dtype=torch.float64)
    loss_torch = model(torch.tensor(ids), torch.tensor(pixels), torch.tensor(mask), return_loss=True).loss
    loss_torch.backward()
    reference = out.loss.detach().numpy()
    check({"numpy loss": (np.asarray(loss), reference), "torch loss": (loss_torch.detach().numpy(), reference)})
    nonzero(ours.grads)
    check({k: (g, grads_ref[k]) for k, g in ours.grads.items()})
    check({k: (p.grad.numpy(), grads_ref[k]) for k, p in model.named_parameters()})


def test_clip_pooling_positions():
    """The two rules of CLIPTextTransformer: legacy eos 2 pools at the largest id, otherwise at the first eos."""
    ids = np.array([[5, 9, 7, 9, 3], [4, 8, 8, 1, 1]])
    assert np_clip.end_token_positions(ids, 2).tolist() == [1, 1]
    assert np_clip.end_token_positions(ids, 8).tolist() == [0, 1]  # row 0 has no 8: position 0, as torch's argmax
    assert torch_clip.end_token_positions(torch.tensor(ids), 8).tolist() == [0, 1]
    assert torch_clip.end_token_positions(torch.tensor(ids), 2).tolist() == [1, 1]


def test_clip_save_load_round_trip(tmp_path):
    theirs = build_clip(tmp_path / "hf")
    ours = np_clip.load(tmp_path / "hf", dtype=np.float64)
    np_clip.save(ours, tmp_path / "np")
    torch_clip.save(torch_clip.load(tmp_path / "hf", dtype=torch.float64), tmp_path / "torch")
    ids, mask, pixels = clip_inputs(2, np.random.default_rng(3))
    with torch.no_grad():
        ref = theirs(input_ids=torch.tensor(ids), pixel_values=torch.tensor(pixels)).logits_per_image.numpy()
    for folder in ("np", "torch"):
        back = transformers.CLIPModel.from_pretrained(tmp_path / folder, attn_implementation="sdpa").double().eval()
        with torch.no_grad():
            got = back(input_ids=torch.tensor(ids), pixel_values=torch.tensor(pixels)).logits_per_image.numpy()
        check({folder: (got, ref)})
    with pytest.raises(ValueError, match="holds another checkpoint"):
        np_clip.save(ours, tmp_path / "np")


# ----------------------------------------------------------------------------------------------
# Finite differences of the new pairs (float64, DESIGN.md's per-coordinate bar 1e-6)


def fd(forward, backward, args, wrt):
    result = gradcheck.check_pair(forward, backward, args, wrt, max_coords=30)
    assert result.worst <= 1e-6, str(result)
    assert all(v > 0 for v in result.max_abs_grad.values()), str(result)


def test_finite_differences_of_the_new_pairs():
    rng = np.random.default_rng(0)
    fd(*np_vision.ACTIVATION_PAIRS["quick_gelu"], {"x": 3 * rng.standard_normal((4, 5))}, ["x"])
    fd(
        np_vision.patch_embedding_forward, np_vision.patch_embedding_backward,
        {"pixel_values": rng.standard_normal((2, 3, 9, 8)), "weight": rng.standard_normal((5, 3, 4, 4)),
         "bias": rng.standard_normal(5)},
        ["pixel_values", "weight", "bias"],
    )  # fmt: skip
    fd(
        np_vision.prepend_class_token_forward, np_vision.prepend_class_token_backward,
        {"tokens": rng.standard_normal((2, 3, 4)), "class_token": rng.standard_normal((1, 1, 4))},
        ["tokens", "class_token"],
    )  # fmt: skip
    fd(np_vision.class_token_pool_forward, np_vision.class_token_pool_backward,
       {"hidden": rng.standard_normal((2, 5, 3))}, ["hidden"])  # fmt: skip
    fd(np_clip.end_token_pool_forward, np_clip.end_token_pool_backward,
       {"hidden": rng.standard_normal((3, 5, 4)), "positions": np.array([4, 1, 2])}, ["hidden"])  # fmt: skip
    text, image = rng.standard_normal((3, 6)), rng.standard_normal((4, 6))
    fd(np_clip.cosine_logits_forward, np_clip.cosine_logits_backward,
       {"text_embeds": text, "image_embeds": image, "logit_scale": np.array(0.8)},
       ["text_embeds", "image_embeds", "logit_scale"])  # fmt: skip
    loss_backward = lambda dout, cache: np_clip.contrastive_loss_backward(cache, dout)  # noqa: E731
    fd(np_clip.contrastive_loss_forward, loss_backward, {"logits_per_text": 3 * rng.standard_normal((4, 4))},
       ["logits_per_text"])  # fmt: skip


def test_whole_tiny_models_by_finite_differences():
    """Every parameter of a tiny ViT (pooled) and CLIP (loss and logits) against central differences."""
    from transformer_spec.families.clip import CLIPConfig, CLIPTextConfig, CLIPVisionConfig
    from transformer_spec.families.vit import ViTConfig

    rng = np.random.default_rng(0)
    vit = np_vision.ViTModel(ViTConfig(8, 1, 2, 12, image_size=8, patch_size=4, pooler_output_size=6), seed=1)
    for v in vit.params.values():
        v += 0.1 * rng.standard_normal(v.shape)
    pixels = rng.standard_normal((2, 3, 8, 8))
    dh, dp = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 6))

    def f_vit():
        h = vit.forward(pixels)
        return np.sum(h * dh) + np.sum(vit.pool(h) * dp)

    f_vit()
    vit.zero_grad()
    vit.backward(dh + vit.pool_backward(dp))
    result = gradcheck.gradcheck(f_vit, vit.params, {k: g.copy() for k, g in vit.grads.items()}, max_coords=4)
    assert result.worst <= 1e-6, str(result)

    text = CLIPTextConfig(vocab_size=12, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                          num_attention_heads=2, max_position_embeddings=5, eos_token_id=11)  # fmt: skip
    vision = CLIPVisionConfig(hidden_size=6, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
                              image_size=8, patch_size=4)  # fmt: skip
    model = np_clip.CLIPModel(CLIPConfig(text, vision, projection_dim=5), seed=2)
    for v in model.params.values():
        v += 0.1 * rng.standard_normal(v.shape)
    ids = np.array([[3, 4, 11, 0], [5, 6, 7, 11]])
    pixels = rng.standard_normal((2, 3, 8, 8))
    dlogits = rng.standard_normal((2, 2))

    def f_clip():
        out = model.forward(ids, pixels, return_loss=True)
        return 0.5 * out.loss + np.sum(out.logits_per_image * dlogits)

    f_clip()
    model.zero_grad()
    model.backward(dlogits_per_image=dlogits, dloss=0.5)
    result = gradcheck.gradcheck(f_clip, model.params, {k: g.copy() for k, g in model.grads.items()}, max_coords=4)
    assert result.worst <= 1e-6, str(result)


# ----------------------------------------------------------------------------------------------
# Refusals by name


@pytest.mark.parametrize(
    "change, named",
    [
        ({"hidden_act": "gelu_new"}, "hidden_act"),
        ({"pooler_act": "relu"}, "pooler_act"),
        ({"image_size": [16, 24]}, "image_size"),
        ({"num_attention_heads": 5}, "num_attention_heads"),
        ({"layer_norm_eps": float("nan")}, "layer_norm_eps"),
    ],
)
def test_vit_config_refusals(change, named):
    with pytest.raises(ValueError, match=named):
        vit_config_from_hf(VIT_RELEASED | change)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"text_config": CLIP_RELEASED["text_config"] | {"eos_token_id": [2, 3]}}, "text_config.eos_token_id"),
        ({"vision_config": CLIP_RELEASED["vision_config"] | {"hidden_act": "relu"}}, "hidden_act"),
        ({"vision_config": CLIP_RELEASED["vision_config"] | {"patch_size": 32}}, "vision_config.patch_size"),
        ({"projection_dim": 0}, "projection_dim"),
    ],
)
def test_clip_config_refusals(change, named):
    with pytest.raises(ValueError, match=named):
        clip_config_from_hf(CLIP_RELEASED | change)


def test_clip_old_config_dict_wins_whole():
    """An old config.json's text_config_dict replaces text_config, its missing keys at CLIPTextConfig's defaults, as
    CLIPConfig reads it (not merged key by key)."""
    c = CLIP_RELEASED | {
        "text_config_dict": {"hidden_size": 16, "num_attention_heads": 4, "max_position_embeddings": 9}
    }
    ours = clip_config_from_hf(c).text
    given = copy.deepcopy({k: v for k, v in c.items() if k not in ("architectures", "model_type")})
    theirs = transformers.CLIPConfig(**given)  # which updates the text_config dict it is given in place
    for key in (
        "hidden_size",
        "max_position_embeddings",
        "vocab_size",
        "eos_token_id",
        "hidden_act",
        "intermediate_size",
    ):
        assert getattr(ours, key) == getattr(theirs.text_config, key), key


def test_call_refusals(tmp_path):
    model = np_vision.ViTModel(vit_config_from_hf(VIT_RELEASED))
    pixels = np.zeros((1, 3, 16, 16))
    with pytest.raises(ValueError, match="interpolate_pos_encoding"):
        model.forward(pixels, interpolate_pos_encoding=True)
    with pytest.raises(ValueError, match="pixel_values"):
        model.forward(np.zeros((1, 3, 8, 8)))
    with pytest.raises(ValueError, match="interpolate_pos_encoding"):
        torch_vision.ViTModel(model.config).double()(torch.zeros(1, 3, 16, 16, dtype=torch.float64), True)
    with pytest.raises(ValueError, match="square"):
        np_clip.contrastive_loss_forward(np.zeros((2, 3)))
    clip_model = np_clip.CLIPModel(clip_config_from_hf(CLIP_RELEASED))
    with pytest.raises(ValueError, match="input_ids"):
        clip_model.forward(np.full((1, 3), 50), np.zeros((1, 3, 16, 16)))
    with pytest.raises(ValueError, match="return_loss"):
        clip_model.forward(np.ones((1, 3), dtype=np.int64), np.zeros((1, 3, 16, 16)))
        clip_model.backward(dloss=1.0)


def test_float32_stays_float32():
    """dtype in = dtype out: a float32 ViT and CLIP give float32 outputs, gradients and pixel gradients."""
    from transformer_spec.families.clip import CLIPConfig, CLIPTextConfig, CLIPVisionConfig
    from transformer_spec.families.vit import ViTConfig

    rng = np.random.default_rng(0)
    pixels = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    vit = np_vision.ViTModel(ViTConfig(8, 1, 2, 12, image_size=8, patch_size=4, pooler_output_size=6), dtype=np.float32)
    hidden = vit.forward(pixels)
    pooled = vit.pool(hidden)
    vit.zero_grad()
    vit.backward(rng.standard_normal(hidden.shape).astype(np.float32) + vit.pool_backward(np.ones_like(pooled)))
    assert {hidden.dtype, pooled.dtype, vit.dpixel_values.dtype} | {g.dtype for g in vit.grads.values()} == {
        np.dtype(np.float32)
    }
    text = CLIPTextConfig(vocab_size=12, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                          num_attention_heads=2, max_position_embeddings=5, eos_token_id=11)  # fmt: skip
    vision = CLIPVisionConfig(hidden_size=6, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
                              image_size=8, patch_size=4)  # fmt: skip
    model = np_clip.CLIPModel(CLIPConfig(text, vision, projection_dim=5), dtype=np.float32)
    out = model.forward(np.array([[3, 4, 11, 0], [5, 6, 7, 11]]), pixels, return_loss=True)
    model.zero_grad()
    model.backward(dloss=1.0, dlogits_per_image=np.ones((2, 2), np.float32))
    found = {np.asarray(out.loss).dtype, out.logits_per_image.dtype, out.text_embeds.dtype, out.image_embeds.dtype}
    assert found | {g.dtype for g in model.grads.values()} == {np.dtype(np.float32)}


# ----------------------------------------------------------------------------------------------
# Float32: judged against transformers in float64, each tensor allowed SELF_RATIO times transformers' own float32
# error on it (never less than the float32 bar, never more than FLOAT32_CAP), as compare_hf judges the text families


def float32_run(kind: str, side: str, folder, theirs64, inputs: dict, upstream: dict):
    """(outputs, grads keyed by the transformers class's names) of one float32 run: "theirs" (transformers' model
    cast to float32), "numpy" or "torch" (ours loaded from `folder` in float32)."""
    t32 = {
        k: torch.tensor(v, dtype=torch.float32) if v.dtype.kind == "f" else torch.tensor(v) for k, v in inputs.items()
    }
    up32 = {k: torch.tensor(v, dtype=torch.float32) for k, v in upstream.items()}
    if side == "numpy":
        a32 = {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in inputs.items()}
        if kind == "vit":
            model = np_vision.load(folder, dtype=np.float32)
            hidden = model.forward(a32["pixel_values"])
            pooled = model.pool(hidden)
            outputs = {"last_hidden_state": hidden, "pooler_output": pooled}
            model.zero_grad()
            model.backward(
                upstream["last_hidden_state"].astype(np.float32)
                + model.pool_backward(upstream["pooler_output"].astype(np.float32))
            )
            return outputs, {class_name(k): g for k, g in model.grads.items()}
        model = np_clip.load(folder, dtype=np.float32)
        o = model.forward(a32["input_ids"], a32["pixel_values"], a32["attention_mask"], return_loss=True)
        model.zero_grad()
        model.backward(**{f"d{k}": v.astype(np.float32) for k, v in upstream.items()}, dloss=1.0)
        return {k: np.asarray(getattr(o, k)) for k in (*OUTPUTS, "loss")}, model.grads
    if side == "theirs":
        model = copy.deepcopy(theirs64).float()
        model.zero_grad()
        if kind == "vit":
            o = model(pixel_values=t32["pixel_values"])
        else:
            o = model(**t32, return_loss=True)
    else:
        model = (torch_vision if kind == "vit" else torch_clip).load(folder, dtype=torch.float32)
        if kind == "vit":
            h = model(t32["pixel_values"])
            o = transformers.modeling_outputs.BaseModelOutputWithPooling(
                last_hidden_state=h, pooler_output=model.pool(h)
            )
        else:
            o = model(t32["input_ids"], t32["pixel_values"], t32["attention_mask"], return_loss=True)
    names = list(upstream) + ([] if kind == "vit" else ["loss"])
    total = sum((getattr(o, k) * up32[k]).sum() for k in upstream) + (0 if kind == "vit" else o.loss)
    total.backward()
    outputs = {k: getattr(o, k).detach().numpy() for k in names}
    grads = {k: p.grad.numpy() for k, p in model.named_parameters()}
    return outputs, {class_name(k) if kind == "vit" else k: g for k, g in grads.items()}


@pytest.mark.parametrize("kind", ["vit", "clip"])
def test_float32_judged_by_transformers_own_float32_error(tmp_path, kind):
    from parity_tests.components import FLOAT32_CAP, SELF_RATIO

    rng = np.random.default_rng(7)
    if kind == "vit":
        theirs = build_vit(tmp_path)
        inputs = {"pixel_values": rng.standard_normal((2, 3, 16, 16))}
        upstream = {
            "last_hidden_state": rng.standard_normal((2, 17, 16)),
            "pooler_output": rng.standard_normal((2, 16)),
        }
    else:
        theirs = build_clip(tmp_path, 49)
        ids, mask, pixels = clip_inputs(49, rng)
        inputs = {"input_ids": ids, "pixel_values": pixels, "attention_mask": mask}
        upstream = {name: rng.standard_normal((3, 10) if "embeds" in name else (3, 3)) for name in OUTPUTS}
    reference = float32_run(kind, "theirs", tmp_path, theirs, inputs, upstream)  # float32, to measure its error
    theirs.zero_grad()
    t64 = {k: torch.tensor(v) for k, v in inputs.items()}
    o = theirs(**t64, **({} if kind == "vit" else {"return_loss": True}))
    total = sum((getattr(o, k) * torch.tensor(v)).sum() for k, v in upstream.items()) + (0 if kind == "vit" else o.loss)
    total.backward()
    exact_outputs = {k: getattr(o, k).detach().numpy() for k in reference[0]}
    exact_grads = {k: p.grad.numpy() for k, p in theirs.named_parameters()}
    exact = (exact_outputs, exact_grads)
    for side in ("numpy", "torch"):
        ours = float32_run(kind, side, tmp_path, theirs, inputs, upstream)
        for ours_part, reference_part, exact_part in zip(ours, reference, exact, strict=True):
            own = relative_errors({k: (reference_part[k], exact_part[k]) for k in exact_part}, np.float32)
            errors = relative_errors({k: (ours_part[k], exact_part[k]) for k in exact_part}, np.float32)
            over = {
                k: (e, own[k][1])
                for k, (_, e) in errors.items()
                if not e <= min(FLOAT32_CAP, max(1e-5, SELF_RATIO * own[k][1]))
            }
            assert not over, (side, over)
