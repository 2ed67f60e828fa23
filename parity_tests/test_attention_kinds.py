"""Attention's shape and kinds beyond the paper's: a head width independent of d_model / n_heads (Qwen3, Gemma),
and per-layer attention kinds (full or sliding: a causal window in a decoder, a band |i - j| <= window // 2 in an
encoder, ModernBERT's) with a rotary base per kind (Gemma 3, ModernBERT). NumPy against torch_transformer, outputs
and every gradient (random upstream gradients), float64 and float32; finite differences through the band; cached
decoding with per-layer windows. (Against transformers: test_hf.py's "head_dim" and layer_types variants of Llama
and Qwen2.)
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import numpy_transformer as nt
import numpy_transformer.decoding as nd
import torch_transformer as tt
import torch_transformer.hf as torch_hf
from numpy_transformer import TransformerConfig
from numpy_transformer import hf as numpy_hf
from numpy_transformer.attention import multi_head_attention_backward, multi_head_attention_forward
from numpy_transformer.checkpoint import load_checkpoint, save_checkpoint
from numpy_transformer.model import score_mod
from numpy_transformer.scores import ScoreMod, attention_scores
from parity_tests import components as C
from parity_tests import hf_compare as H

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
    np.testing.assert_allclose(cache.attn.probs, probs / probs.sum(-1, keepdims=True), rtol=1e-12)
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


# ----------------------------------------------------------------------------------------------
# Per-layer attention kinds: full or sliding (a causal window in a decoder, a band |i - j| <= window // 2 in an
# encoder, ModernBERT's), each kind with its own rotary base.

KINDS = {
    "LM sliding/full/sliding, window 3, local base 10, head_dim 6": TransformerConfig(
        **{**SMALL, "n_decoder_layers": 3, "n_encoder_layers": 0}, positional="rope", head_dim=6, n_kv_heads=2,
        layer_types=("sliding_attention", "full_attention", "sliding_attention"), sliding_window=3,
        rope_local_theta=10.0, norm_first=True,
    ),
    "Transformer full/sliding, window 4 (encoder band 2), alibi": TransformerConfig(
        **SMALL, positional="alibi", layer_types=("full_attention", "sliding_attention"), sliding_window=4
    ),
}  # fmt: skip
ENCODERS = {
    "full/sliding/sliding, window 2 (band 1), rope local base 10": TransformerConfig(
        **{**SMALL, "n_encoder_layers": 3, "n_decoder_layers": 0}, positional="rope", norm_first=True,
        layer_types=("full_attention", "sliding_attention", "sliding_attention"), sliding_window=2,
        rope_theta=160.0, rope_local_theta=10.0,
    ),
}  # fmt: skip
ENCODERS["the same, flash"] = dataclasses.replace(
    ENCODERS["full/sliding/sliding, window 2 (band 1), rope local base 10"], attention="flash"
)


def test_band_follows_its_definition_on_both_sides():
    """ScoreMod(band=b): query i sees keys |i - j| <= b, on either side; torch's position_mask, the same."""
    q_pos, k_pos = np.arange(3, 8), np.arange(0, 10)
    _, allowed = attention_scores(np.zeros((1, 1, 5, 2)), np.zeros((1, 1, 10, 2)), ScoreMod(band=2), q_pos, k_pos)
    for a, i in enumerate(q_pos):
        for b, j in enumerate(k_pos):
            assert allowed[a, b] == (abs(i - j) <= 2)
    mha = tt.attention.MultiHeadAttention(8, 2, band=2)
    theirs = tt.scores.position_mask(mha.score_mod, torch.arange(3, 8), torch.arange(10))
    np.testing.assert_array_equal(theirs.numpy(), allowed)


def test_each_layer_gets_its_kinds_rules_and_base():
    config = KINDS["LM sliding/full/sliding, window 3, local base 10, head_dim 6"]
    assert [config.layer_window(i) for i in range(3)] == [3, None, 3]
    assert [config.layer_rope_theta(i) for i in range(3)] == [10.0, 10000.0, 10.0]
    assert [score_mod(config, causal=True, layer=i).window for i in range(3)] == [3, None, 3]
    encoder = ENCODERS["full/sliding/sliding, window 2 (band 1), rope local base 10"]
    assert [score_mod(encoder, causal=False, layer=i).band for i in range(3)] == [None, 1, 1]
    assert [score_mod(encoder, causal=False, layer=i).window for i in range(3)] == [None, None, None]
    twin = tt.EncoderModel(encoder)
    assert [(layer.self_attn.band, layer.self_attn.window) for layer in twin.encoder.layers] == [
        (None, None), (1, None), (1, None)
    ]  # fmt: skip
    lm = tt.TransformerLM(config)
    assert [layer.self_attn.window for layer in lm.decoder.layers] == [3, None, 3]
    # without layer_types, as before: the window on every decoder layer, none in an encoder
    plain = TransformerConfig(**SMALL, sliding_window=3)
    assert score_mod(plain, causal=True, layer=1).window == 3 and score_mod(plain, causal=False).band is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", list(KINDS.values()), ids=list(KINDS))
def test_layer_kinds_models_match(config, dtype):
    lm = config.n_encoder_layers == 0
    result = C.compare_models(config, dtype, "cpu", lm=lm, scenario="padding", src_len=7, tgt_len=7)
    assert_parity(result, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", list(ENCODERS.values()), ids=list(ENCODERS))
def test_layer_kinds_encoder_matches(config, dtype):
    assert_parity(C.compare_encoder_models(config, dtype, "cpu", length=7), dtype)


def lm_logits(config, ids):
    return nt.TransformerLM(config, seed=3).forward(ids)


def test_kinds_and_local_base_are_not_no_ops():
    """Each layer's kind matters: all-full, all-sliding and the mix give other logits; the local base changes
    them only where a sliding layer reads it."""
    config = KINDS["LM sliding/full/sliding, window 3, local base 10, head_dim 6"]
    ids = np.random.default_rng(1).integers(3, 17, (2, 8))
    mixed = lm_logits(config, ids)
    for other in (
        dataclasses.replace(config, layer_types=("full_attention",) * 3),
        dataclasses.replace(config, layer_types=("sliding_attention",) * 3),
        dataclasses.replace(config, rope_local_theta=None),
    ):
        assert not np.allclose(lm_logits(other, ids), mixed)
    all_full = dataclasses.replace(config, layer_types=("full_attention",) * 3)
    np.testing.assert_array_equal(
        lm_logits(all_full, ids), lm_logits(dataclasses.replace(all_full, rope_local_theta=None), ids)
    )


def test_finite_differences_through_the_band():
    """The NumPy backward of an encoder whose local layers read the band, against central differences (float64),
    with a random upstream gradient."""
    config = ENCODERS["full/sliding/sliding, window 2 (band 1), rope local base 10"]
    model = nt.EncoderModel(config, seed=5)
    ids = np.random.default_rng(6).integers(3, 13, (2, 7))
    dhidden = np.random.default_rng(7).standard_normal((2, 7, 16))

    def loss(key, value):
        saved = model.params[key]
        model.params[key] = value
        out = float((model.forward(ids) * dhidden).sum())
        model.params[key] = saved
        return out

    model.zero_grad()
    model.forward(ids)
    model.backward(dhidden)
    for key in ("encoder.layers.1.self_attn.q_proj.weight", "encoder.layers.2.self_attn.k_proj.weight"):
        assert np.any(model.grads[key])
        for index in [(0, 0), (3, 5), (7, 11)]:
            plus, minus = model.params[key].copy(), model.params[key].copy()
            plus[index] += 1e-5
            minus[index] -= 1e-5
            fd = (loss(key, plus) - loss(key, minus)) / 2e-5
            an = model.grads[key][index]
            assert abs(fd - an) / max(abs(fd), abs(an), 1e-2) <= 1e-6, (key, index, fd, an)


def test_decoding_with_layer_windows_is_recomputation_on_both_sides():
    """A prompt longer than the window: the sliding layers' caches hold `window` positions, the full layer's every
    position; greedy and beam search with the caches equal recomputing the prefix, and torch's equal NumPy's."""
    config = dataclasses.replace(
        KINDS["LM sliding/full/sliding, window 3, local base 10, head_dim 6"], max_len=30, pad_id=0, eos_id=None
    )
    model = nt.TransformerLM(config, seed=8)
    prompt = np.random.default_rng(9).integers(3, 17, (2, 6))
    cache = nd.new_cache(model, None, 2, 30)
    assert [self_cache.keys.shape[2] for self_cache, _ in cache.layers] == [3, 30, 3]
    out = nd.generate(model, prompt, max_new_tokens=12, return_dict_in_generate=True)
    tokens, logits = out.sequences, out.logits
    out = nd.generate(model, prompt, max_new_tokens=12, use_cache=False, return_dict_in_generate=True)
    again, relogits = out.sequences, out.logits
    np.testing.assert_array_equal(tokens, again)
    np.testing.assert_allclose(logits, relogits, rtol=0, atol=1e-12)
    beams = nd.generate(model, prompt, num_beams=3, max_new_tokens=12)
    np.testing.assert_array_equal(beams, nd.generate(model, prompt, num_beams=3, max_new_tokens=12, use_cache=False))
    twin = tt.TransformerLM(config).double()
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    with torch.no_grad():
        torch_cache = tt.decoding.new_cache(twin, None, 2, 30)
    assert [self_cache.keys.shape[2] for self_cache, _ in torch_cache.layers] == [3, 30, 3]
    np.testing.assert_array_equal(tt.generate(twin, torch.from_numpy(prompt), max_new_tokens=12).numpy(), tokens)
    np.testing.assert_array_equal(
        tt.generate(twin, torch.from_numpy(prompt), num_beams=3, max_new_tokens=12).numpy(), beams
    )


def test_layer_types_bad_values_are_named():
    with pytest.raises(ValueError, match=r"layer_types must list one kind per layer: got 1 kinds, n_encoder_layers=2"):
        TransformerConfig(**SMALL, layer_types=("full_attention",))
    with pytest.raises(ValueError, match=r"layer_types must hold only .*got \['global'\]"):
        TransformerConfig(**SMALL, layer_types=("global", "full_attention"), sliding_window=2)
    with pytest.raises(ValueError, match=r"'sliding_attention' layers: sliding_window must be set, got None"):
        TransformerConfig(**SMALL, layer_types=("sliding_attention", "full_attention"))
    with pytest.raises(TypeError, match=r"layer_types must be a tuple.*got str"):
        TransformerConfig(**SMALL, layer_types="full_attention")
    with pytest.raises(ValueError, match=r"rope_local_theta must be a positive float or None, got -1.0"):
        TransformerConfig(**SMALL, rope_local_theta=-1.0)


def test_layer_types_survive_a_checkpoint_round_trip(tmp_path):
    config = KINDS["LM sliding/full/sliding, window 3, local base 10, head_dim 6"]
    model = nt.TransformerLM(config, seed=1)
    save_checkpoint(tmp_path / "m.safetensors", model)
    again = load_checkpoint(tmp_path / "m.safetensors")
    assert again.config == config and again.config.layer_types == config.layer_types


# ----------------------------------------------------------------------------------------------
# Against transformers: Qwen2 with layer_types mixing full and sliding layers and head_dim != d_model / n_heads.

QWEN2_KINDS = {"use_sliding_window": True, "sliding_window": 2, "head_dim": 6}
QWEN2_KINDS["layer_types"] = ["sliding_attention", "full_attention"]


@pytest.mark.parametrize("side", ["numpy", "torch"])
def test_qwen2_layer_kinds_greedy_decode_equals_generate(side, tmp_path):
    """Prompts longer than the sliding layer's window of 2, ten new tokens: the rolling cache drops keys on that
    layer only, as transformers' sliding-window mask does."""
    prompts = np.array([[5, 9, 7, 21], [12, 4, 30, 8]])
    ours, theirs = H.greedy_pair("qwen2", side, prompts, 10, tmp_path, eos_token_id=None, **QWEN2_KINDS)
    np.testing.assert_array_equal(ours, theirs)
    assert ours.shape == (2, 14)


@pytest.mark.parametrize("side", ["numpy", "torch"])
def test_qwen2_layer_kinds_round_trip_through_from_pretrained(side, tmp_path):
    """A model of our own with layer_types and head_dim, written with hf.save and read by from_pretrained: the same
    logits (float64), every weight used, and the kinds read back from config.json."""
    config = dataclasses.replace(
        H.NATIVE["qwen2"], head_dim=6, sliding_window=3, layer_types=("full_attention", "sliding_attention")
    )
    model = nt.TransformerLM(config, seed=2) if side == "numpy" else tt.TransformerLM(config).double()
    result, info = H.round_trip(model, "qwen2", tmp_path)
    assert not any(info.values()), info
    assert not C.failures(result, np.float64), C.failures(result, np.float64)
    again = (numpy_hf if side == "numpy" else torch_hf).load(tmp_path)
    assert again.config.layer_types == config.layer_types and again.config.head_dim == 6
    assert again.config.sliding_window == 3
