"""Attention's shape and kinds beyond the paper's: a head width independent of d_model / n_heads (Qwen3, Gemma),
NumPy against torch_transformer, outputs and every gradient (random upstream gradients), float64 and float32.
(Against transformers: test_hf.py's "head_dim" variants of Llama and Qwen2.)
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import numpy_transformer as nt
import torch_transformer as tt
from numpy_transformer import TransformerConfig
from numpy_transformer.attention import multi_head_attention_backward, multi_head_attention_forward
from parity_tests import components as C

one_torch_thread = pytest.fixture(autouse=True)(C.one_torch_thread)

DTYPES = [pytest.param(np.float64, id="float64"), pytest.param(np.float32, id="float32")]
SMALL = dict(
    src_vocab_size=13, tgt_vocab_size=17, d_model=16, n_heads=4, d_ff=24, n_encoder_layers=2, n_decoder_layers=2,
    max_len=12,
)  # fmt: skip
HEAD_DIMS = {
    "head_dim 6 > D/H (rope, GQA 4/2, pre-norm)": TransformerConfig(
        **SMALL, head_dim=6, positional="rope", n_kv_heads=2, norm_first=True, norm="rms", gated_ffn=True
    ),
    "head_dim 2 < D/H (learned, post-norm)": TransformerConfig(**SMALL, head_dim=2, positional="learned"),
    "head_dim 5, odd (sinusoidal, attention_scale 0.3)": TransformerConfig(**SMALL, head_dim=5, attention_scale=0.3),
}


def assert_parity(result, dtype):
    problems = C.failures(result, dtype)
    assert not problems, "first disagreement: " + problems[0] + "\nall:\n" + "\n".join(problems)
    zero = sorted(name for name, (ours, _) in result.grads.items() if not np.any(ours))
    assert not zero, f"zero gradients: {zero}"


# ----------------------------------------------------------------------------------------------
# head_dim independent of d_model / n_heads.


def test_head_dim_sets_the_projection_shapes_on_both_sides():
    config = HEAD_DIMS["head_dim 6 > D/H (rope, GQA 4/2, pre-norm)"]
    shapes = {k: v.shape for k, v in nt.TransformerLM(config).state_dict().items()}
    torch_shapes = {k: tuple(v.shape) for k, v in tt.TransformerLM(config).state_dict().items()}
    assert shapes == torch_shapes
    attn = "decoder.layers.1.self_attn"
    assert shapes[f"{attn}.q_proj.weight"] == (4 * 6, 16)  # (H * Dh, D)
    assert shapes[f"{attn}.k_proj.weight"] == shapes[f"{attn}.v_proj.weight"] == (2 * 6, 16)  # (H_kv * Dh, D)
    assert shapes[f"{attn}.out_proj.weight"] == (16, 4 * 6)  # (D, H * Dh)
    assert config.d_head == 6 and TransformerConfig(**SMALL).d_head == 4 and TransformerConfig(**SMALL).head_dim is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lm", [False, True], ids=["Transformer", "TransformerLM"])
@pytest.mark.parametrize("config", list(HEAD_DIMS.values()), ids=list(HEAD_DIMS))
def test_head_dim_models_match(config, lm, dtype):
    assert_parity(C.compare_models(config, dtype, "cpu", lm=lm, scenario="padding"), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_head_dim_encoder_matches(dtype):
    config = dataclasses.replace(HEAD_DIMS["head_dim 6 > D/H (rope, GQA 4/2, pre-norm)"], n_decoder_layers=0)
    assert_parity(C.compare_encoder_models(config, dtype, "cpu"), dtype)


def test_default_scale_is_one_over_root_head_dim():
    """attention_scale None: 1 / sqrt(head_dim), the head_dim the config sets, not d_model / n_heads."""
    rng = np.random.default_rng(0)
    D, H, Dh = 8, 2, 3
    params = {
        "q_proj.weight": rng.standard_normal((H * Dh, D)),
        "k_proj.weight": rng.standard_normal((H * Dh, D)),
        "v_proj.weight": rng.standard_normal((H * Dh, D)),
        "out_proj.weight": rng.standard_normal((D, H * Dh)),
    }
    x = rng.standard_normal((1, 4, D))
    _, cache = multi_head_attention_forward(params, x, x, x, H)
    q = (x @ params["q_proj.weight"].T).reshape(1, 4, H, Dh).transpose(0, 2, 1, 3)
    k = (x @ params["k_proj.weight"].T).reshape(1, 4, H, Dh).transpose(0, 2, 1, 3)
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(Dh)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    np.testing.assert_allclose(cache.attn["probs"], probs / probs.sum(-1, keepdims=True), rtol=1e-12)
    dx, *_ = multi_head_attention_backward(rng.standard_normal((1, 4, D)), cache)
    assert dx.shape == x.shape and np.any(dx)


def test_head_dim_bad_values_are_named():
    with pytest.raises(ValueError, match=r"head_dim must be >= 1, got 0"):
        TransformerConfig(**SMALL, head_dim=0)
    with pytest.raises(TypeError, match=r"head_dim must be an int, got float"):
        TransformerConfig(**SMALL, head_dim=4.0)
    with pytest.raises(ValueError, match=r"positional='rope'.*even: got 5"):
        TransformerConfig(**SMALL, head_dim=5, positional="rope")
    # head_dim set: d_model need not divide by n_heads
    assert TransformerConfig(**{**SMALL, "d_model": 18}, head_dim=4).d_head == 4
