"""GPT-OSS's new pairs (numpy_transformer.sinks, numpy_transformer.gpt_oss_moe): finite-difference checks of each
backward, what each forward must mean, and the NumPy model against the torch one in float64."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch

import numpy_transformer as nt
import torch_transformer as tt
from numpy_transformer import TransformerLM
from numpy_transformer import attention as A
from numpy_transformer import gpt_oss_moe as G
from numpy_transformer import moe as MOE
from numpy_transformer import sinks as SK
from numpy_transformer.gradcheck import check_model, check_pair
from numpy_transformer.scores import ScoreMod
from parity_tests.test_numpy_gradcheck import assert_passes, make_ids, perturb, rand, rotated_blocks
from transformer_spec.config import RopeScaling, TransformerConfig
from transformer_spec.shapes import parameter_shapes

# A GPT-OSS-like LM: sinks, GQA 4/2 with head_dim 4 (not 12 / 4), biases on the attention, a sliding layer (window 2)
# then a full one, YaRN, 4 experts of which 2 run, a clamp of 1 (reached by the tiny model's values)
GPT_OSS = dict(
    src_vocab_size=13, tgt_vocab_size=13, d_model=12, n_heads=4, n_kv_heads=2, head_dim=4, d_ff=6, n_encoder_layers=0,
    n_decoder_layers=2, max_len=8, norm_first=True, positional="rope", norm="rms", bias=True, output_bias=False,
    scale_embeddings=False, activation="silu", layer_types=("sliding_attention", "full_attention"), sliding_window=2,
    n_experts=4, top_k=2, expert_kind="gpt_oss", attn_sinks=True, swiglu_limit=1.0, pad_id=0, rope_theta=150000.0,
    rope_scaling=RopeScaling("yarn", factor=8.0, original_max_position_embeddings=4, truncate=False),
)  # fmt: skip


def gpt_oss_config(**overrides) -> TransformerConfig:
    return TransformerConfig(**(GPT_OSS | overrides))


def moe_params(rng, E=4, D=6, F=5) -> dict:
    """A GPT-OSS expert block's params, every bias off zero."""
    return {
        "router.weight": rand(rng, E, D), "router.bias": rand(rng, E, scale=0.5),
        "experts.gate_up_proj": rand(rng, E, D, 2 * F, scale=0.8), "experts.gate_up_proj_bias": rand(rng, E, 2 * F),
        "experts.down_proj": rand(rng, E, F, D), "experts.down_proj_bias": rand(rng, E, D),
    }  # fmt: skip


# ----------------------------------------------------------------------------------------------
# The sink softmax and attention with it.


def test_sink_softmax():
    """Scores with hidden entries, a row with none allowed, sinks of both signs: dS and the sinks' own gradient."""
    rng = np.random.default_rng(90)
    scores = 2.0 * rand(rng, 2, 3, 4, 5)
    allowed = rng.random((2, 1, 4, 5)) > 0.3
    allowed[1, 0, 2] = False  # a row that may read no key: its mass all goes to the sink
    args = dict(scores=scores, sinks=np.array([-1.0, 0.5, 2.0]), allowed=allowed)
    result = check_pair(SK.sink_softmax_forward, SK.sink_softmax_backward, args, wrt=["scores", "sinks"],
                        max_coords=None)  # fmt: skip
    assert_passes(result, "sink-softmax")
    probs, cache = SK.sink_softmax_forward(**args)
    np.testing.assert_allclose(probs.sum(-1, keepdims=True) + cache.sink, 1.0, atol=1e-15)
    assert (probs[~np.broadcast_to(allowed, probs.shape)] == 0).all() and (probs[1, :, 2] == 0).all()
    assert (cache.sink > 0).all() and (cache.sink < 1).any()


def test_sink_softmax_against_the_plain_one():
    """A sink of -inf-like logit is the plain softmax; one far above the scores takes (nearly) everything."""
    from numpy_transformer.layers import softmax_forward

    rng = np.random.default_rng(91)
    scores = rand(rng, 1, 2, 3, 4)
    plain, _ = softmax_forward(scores)
    low, _ = SK.sink_softmax_forward(scores, np.full(2, -800.0))
    np.testing.assert_allclose(low, plain, rtol=1e-15, atol=0)
    high, cache = SK.sink_softmax_forward(scores, np.full(2, 50.0))
    assert high.max() < 1e-15 and np.allclose(cache.sink, 1.0)
    with pytest.raises(ValueError, match="sinks must"):
        SK.sink_softmax_forward(scores, np.full(3, 0.0))


def test_torch_sink_softmax_equals_the_numpy_pair():
    """torch_transformer.sinks.sink_softmax (exported as tt.sink_softmax) against nt.sink_softmax_forward/backward,
    float64: the shares and, under a random upstream gradient, the gradients of the scores and of the sinks; a row
    with every key hidden gives all to the sink on both sides."""
    rng = np.random.default_rng(94)
    scores = 2.0 * rand(rng, 2, 3, 4, 5)
    allowed = rng.random((2, 1, 4, 5)) > 0.3
    allowed[1, 0, 2] = False
    sinks = np.array([-1.0, 0.5, 2.0])
    probs, cache = nt.sink_softmax_forward(scores, sinks, allowed)
    upstream = rand(rng, *probs.shape)
    dscores, dsinks = nt.sink_softmax_backward(upstream, cache)
    scores_t = torch.from_numpy(scores).masked_fill(~torch.from_numpy(allowed), float("-inf")).requires_grad_()
    sinks_t = torch.from_numpy(sinks).requires_grad_()
    probs_t = tt.sink_softmax(scores_t, sinks_t)
    (probs_t * torch.from_numpy(upstream)).sum().backward()
    assert np.abs(probs - probs_t.detach().numpy()).max() <= 1e-15
    assert (probs_t[1, :, 2] == 0).all()
    for ours, theirs in ((dscores, scores_t.grad.numpy()), (dsinks, sinks_t.grad.numpy())):
        assert np.abs(ours).max() > 0 and np.isfinite(theirs).all()
        assert np.abs(ours - theirs).max() <= 1e-14 * np.abs(theirs).max()
    assert tt.sink_softmax.__module__ == "torch_transformer.sinks"


@pytest.mark.parametrize("dropout_p", [0.0, 0.3], ids=["no-dropout", "dropout"])
def test_sink_attention(dropout_p):
    """The sink attention pair with a causal window of 2, a left-padded row and dropout: q, k, v and the sinks."""
    rng = np.random.default_rng(92)
    B, H, T, Dh = 2, 3, 5, 4
    mask = np.ones((B, 1, 1, T), dtype=bool)
    mask[1, ..., :2] = False
    keep = rng.random((B, H, T, T)) > dropout_p if dropout_p else None
    mod = ScoreMod(scale=0.8, causal=True, window=2)
    args = dict(q=rand(rng, B, H, T, Dh), k=rand(rng, B, H, T, Dh), v=rand(rng, B, H, T, Dh),
                sinks=rand(rng, H), mask=mask)  # fmt: skip
    forward = functools.partial(SK.sink_attention_forward, mod=mod, dropout_p=dropout_p, keep_mask=keep)
    result = check_pair(
        lambda q, k, v, sinks, mask: forward(q, k, v, sinks, mask),
        lambda dout, cache: (lambda g: (g[0], g[1], g[2], g[4]))(SK.sink_attention_backward(dout, cache)),
        args, wrt=["q", "k", "v", "sinks"], max_coords=None,
    )  # fmt: skip
    assert_passes(result, f"sink-attention-{dropout_p}")


def test_multi_head_attention_reads_the_sinks():
    """params['sinks'] turns the sink on (its gradient returned as 'sinks'); the tiled kernel refuses it."""
    rng = np.random.default_rng(93)
    D, H = 8, 2
    params = {f"{p}_proj.weight": rand(rng, D, D, scale=0.4) for p in ("q", "k", "v", "out")}
    x = rand(rng, 2, 4, D)
    plain, _ = A.multi_head_attention_forward(params, x, x, x, H, is_causal=True)
    sunk, cache = A.multi_head_attention_forward(params | {"sinks": np.array([0.3, -0.2])}, x, x, x, H, is_causal=True)
    assert np.abs(sunk - plain).max() > 1e-2
    _, _, _, grads = A.multi_head_attention_backward(rand(rng, 2, 4, D), cache)
    assert grads["sinks"].shape == (H,) and np.abs(grads["sinks"]).min() > 0
    with pytest.raises(ValueError, match="sinks"):
        A.multi_head_attention_forward(params | {"sinks": np.zeros(H)}, x, x, x, H, kernel="flash")
    with pytest.raises(ValueError, match="attn_sinks"):
        gpt_oss_config(attention="flash")


# ----------------------------------------------------------------------------------------------
# GPT-OSS's experts.


def test_top_k_softmax():
    """The softmax over the k kept logits; equal to Mixtral's softmax, top-k, renormalise; gradient only to the
    kept."""
    rng = np.random.default_rng(94)
    logits = rand(rng, 6, 5)
    args = dict(logits=logits, top_k=3)
    result = check_pair(lambda logits, top_k: (lambda out: (out[0][0], out[1]))(G.top_k_softmax_forward(logits, top_k)),
                        G.top_k_softmax_backward, args, wrt=["logits"], max_coords=None)  # fmt: skip
    assert result.worst <= 1e-6 and result.max_abs_grad["logits"] > 0
    (gates, selected), _ = G.top_k_softmax_forward(logits, 3)
    (mixtral, chosen), _ = MOE.top_k_gates_forward(logits, 3, True)
    np.testing.assert_array_equal(selected, chosen)
    np.testing.assert_allclose(gates, mixtral, rtol=1e-14)


@pytest.mark.parametrize("limit", [1.0, 7.0], ids=["clamped", "released-limit"])
def test_clamped_swiglu(limit):
    """(clamp(up) + 1) * a sigma(alpha a), a = min(gate, L): values past the clamp on both sides (L = 1) and the
    released L = 7, far above them."""
    rng = np.random.default_rng(95)
    gate_up = 2.0 * rand(rng, 5, 8)
    args = dict(gate_up=gate_up, limit=limit, alpha=1.702)
    result = check_pair(G.clamped_swiglu_forward, G.clamped_swiglu_backward, args, wrt=["gate_up"], max_coords=None)
    assert_passes(result, f"clamped-swiglu-{limit}")
    y, _ = G.clamped_swiglu_forward(gate_up, limit, 1.702)
    gate, up = gate_up[:, 0::2], gate_up[:, 1::2]
    a, u = np.minimum(gate, limit), np.clip(up, -limit, limit)
    np.testing.assert_allclose(y, (u + 1) * a / (1 + np.exp(-1.702 * a)), rtol=1e-14)
    if limit == 1.0:
        assert (gate > limit).any() and (np.abs(up) > limit).any()


def test_gpt_oss_moe_block():
    """The whole block: router (weight and bias), the interleaved gate/up weight and its bias, down and its bias, and
    x (through the router and the experts); the load-balancing loss's gradient added at the router logits."""
    rng = np.random.default_rng(96)
    params = moe_params(rng)
    x = rand(rng, 2, 4, 6)
    daux = rand(rng, 8, 4)
    args = dict(params=params, x=x)
    result = check_pair(
        lambda params, x: G.gpt_oss_moe_forward(params, x, 2, limit=1.0),
        G.gpt_oss_moe_backward,
        args, wrt=["x", "params"], max_coords=None,
    )  # fmt: skip
    assert_passes(result, "gpt-oss-moe")
    _, cache = G.gpt_oss_moe_forward(params, x, 2, limit=1.0)
    used = {r.expert for r in cache.routed}
    assert used == set(range(4))
    dx_aux, grads_aux = G.gpt_oss_moe_backward(np.zeros_like(x), cache, daux)
    np.testing.assert_allclose(grads_aux["router.weight"], daux.T @ x.reshape(-1, 6), rtol=1e-13)
    with pytest.raises(ValueError, match="missing"):
        G.gpt_oss_moe_forward({k: v for k, v in params.items() if k != "router.bias"}, x, 2)


# ----------------------------------------------------------------------------------------------
# A whole GPT-OSS-like LM: finite differences, and NumPy against torch.


@pytest.mark.parametrize("coords", [3, pytest.param(24, marks=pytest.mark.slow)], ids=["3-each", "24-each"])
def test_gpt_oss_lm_finite_differences(coords):
    """Every parameter of the GPT-OSS-like LM (sinks, the experts' biases, the router's bias) by finite differences,
    `coords` random entries of each tensor (3 in the default run, 0.3 s)."""
    cfg = gpt_oss_config()
    rng = np.random.default_rng(97)
    model = TransformerLM(cfg, seed=5).eval()
    perturb(model, rng)
    for name, value in model.params.items():
        if name.endswith(("sinks", "_proj_bias")):
            value += 0.5 * rng.standard_normal(value.shape)
    result = check_model(model, make_ids(rng, ["......", "__...."], cfg.tgt_vocab_size, cfg.pad_id), seed=7,
                         max_coords=coords)  # fmt: skip
    assert set(result.errors) == set(model.params)
    assert_passes(result, "gpt-oss-lm", rotated_blocks(cfg))


def to_torch(model: TransformerLM) -> tt.TransformerLM:
    theirs = tt.TransformerLM(model.config).double().eval()
    theirs.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in model.params.items()})
    return theirs


def test_numpy_equals_torch_in_float64():
    """The same GPT-OSS-like LM on both sides, a padded batch: logits and every gradient within 1e-12; the torch
    side's parameters are the shapes' list, in order; the router logits and the load-balancing loss agree."""
    cfg = gpt_oss_config()
    rng = np.random.default_rng(98)
    ours = TransformerLM(cfg, seed=3).eval()
    for value in ours.params.values():
        value += 0.3 * rng.standard_normal(value.shape)
    theirs = to_torch(ours)
    assert [n for n, _ in theirs.named_parameters()] == list(parameter_shapes(cfg, decoder_only=True))
    ids = make_ids(rng, ["......", "__...."], cfg.tgt_vocab_size, cfg.pad_id)
    mask = (ids != 0).astype(np.int64)
    upstream = rng.standard_normal((*ids.shape, cfg.tgt_vocab_size))
    logits = ours.forward(ids, attention_mask=mask)
    aux = ours.load_balancing_loss(mask)
    ours.backward(upstream, daux_loss=0.9)
    logits_t = theirs(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    aux_t = theirs.load_balancing_loss(torch.from_numpy(mask))
    ((logits_t * torch.from_numpy(upstream)).sum() + 0.9 * aux_t).backward()
    scale = np.abs(logits).max()
    assert np.abs(logits - logits_t.detach().numpy()).max() <= 1e-12 * scale
    assert abs(float(aux) - aux_t.item()) <= 1e-13
    for name, p in theirs.named_parameters():
        g, g_t = ours.grads[name], p.grad.numpy()
        assert np.abs(g).max() > 0, name
        assert np.abs(g - g_t).max() <= 1e-12 * max(np.abs(g_t).max(), 1e-3), name


def test_greedy_decoding_numpy_equals_torch():
    """The GPT-OSS-like LM decodes the same tokens on both sides (a rolling window of 2 on layer 0, the sinks in every
    step's softmax)."""
    cfg = gpt_oss_config(max_len=16, pad_id=None, eos_id=None)
    ours = TransformerLM(cfg, seed=4).eval()
    rng = np.random.default_rng(99)
    for value in ours.params.values():
        value += 0.5 * rng.standard_normal(value.shape)
    prompts = np.array([[5, 9, 7], [12, 4, 8]])
    mine = nt.generate(ours, prompts, max_new_tokens=8, do_sample=False, num_beams=1)
    theirs = tt.generate(
        to_torch(ours), torch.from_numpy(prompts), max_new_tokens=8, do_sample=False, num_beams=1
    ).numpy()
    np.testing.assert_array_equal(mine, theirs)
    assert len(set(mine[0, 3:].tolist())) > 1


def test_config_checks():
    """expert_kind, swiglu_limit and swiglu_alpha are checked by name."""
    with pytest.raises(ValueError, match="expert_kind"):
        gpt_oss_config(expert_kind="deepseek")
    with pytest.raises(ValueError, match="swiglu_limit"):
        gpt_oss_config(swiglu_limit=0.0)
    with pytest.raises(ValueError, match="swiglu_alpha"):
        gpt_oss_config(swiglu_alpha=float("inf"))
    assert dataclasses.replace(gpt_oss_config(), attn_sinks=False).attn_sinks is False
