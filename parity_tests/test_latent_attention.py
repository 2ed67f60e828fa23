"""DeepSeek's pairs by hand: the interleaved RoPE, multi-head latent attention and DeepSeek's mixture of experts,
each backward against central finite differences; the NumPy and torch models with both in float64 (logits and every
gradient); the decoding cache holding the latent (C + R numbers per token and layer) and decoding by it equal to the
whole forward; the config's refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import numpy_transformer as nt
import torch_transformer as tt
from numpy_transformer.attention import rope_angles
from numpy_transformer.deepseek_moe import deepseek_moe_backward, deepseek_moe_forward
from numpy_transformer.gradcheck import check_model, check_pair
from numpy_transformer.latent_attention import (
    LatentCache,
    latent_attention_backward,
    latent_attention_forward,
    rope_interleaved_backward,
    rope_interleaved_forward,
)
from numpy_transformer.scores import ScoreMod
from torch_transformer import latent_attention as torch_latent
from transformer_spec.config import RopeScaling

B, T, D, H, C, R, DN, DV, RQ = 2, 5, 16, 3, 6, 4, 6, 7, 8
FD_BAR = 1e-6


def latent_params(rng, low_rank: bool) -> dict:
    params = {}
    if low_rank:
        params["q_a_proj.weight"] = 0.3 * rng.standard_normal((RQ, D))
        params["q_a_norm.weight"] = 1 + 0.1 * rng.standard_normal(RQ)
        params["q_b_proj.weight"] = 0.3 * rng.standard_normal((H * (DN + R), RQ))
    else:
        params["q_proj.weight"] = 0.3 * rng.standard_normal((H * (DN + R), D))
    params["kv_a_proj.weight"] = 0.3 * rng.standard_normal((C + R, D))
    params["kv_a_norm.weight"] = 1 + 0.1 * rng.standard_normal(C)
    params["kv_b_proj.weight"] = 0.3 * rng.standard_normal((H * (DN + DV), C))
    params["out_proj.weight"] = 0.3 * rng.standard_normal((D, H * DV))
    return params


def test_rope_interleaved_pair_finite_differences():
    rng = np.random.default_rng(0)
    cos, sin = rope_angles(np.arange(T), R, 100.0)
    result = check_pair(
        lambda x: rope_interleaved_forward(x, cos, sin), rope_interleaved_backward,
        {"x": rng.standard_normal((B, H, T, R))}, wrt=["x"],
    )  # fmt: skip
    assert result.worst <= FD_BAR, str(result)


@pytest.mark.parametrize("low_rank", [True, False], ids=["q_lora (V3)", "q_proj (V2-Lite)"])
def test_the_judges_variant_at_its_defaults_is_latent_attention(low_rank):
    """check/variants.py's attention on latent attention's weights (where the judge looks for a mistake in it), its
    knobs at their defaults, is latent_attention_forward (causal, RoPE base 10000); its softmax over the queries is
    not."""
    from parity_tests.check import variants as VR

    rng = np.random.default_rng(5)
    params, x = latent_params(rng, low_rank), rng.standard_normal((B, T, D))
    rope, keep = rope_angles(np.arange(T), R, 10000.0), np.tril(np.ones((T, T), bool))[None, None]
    want, _ = latent_attention_forward(params, x, H, rope, mod=ScoreMod(causal=True))
    got = VR.multi_head_attention(params, x, x, x, H, keep, theta=10000.0, rotary=R)
    assert np.abs(got - want).max() < 1e-12
    wrong = VR.multi_head_attention(params, x, x, x, H, keep, theta=10000.0, rotary=R, axis=-2)
    assert np.abs(wrong - want).max() > 1e-3


@pytest.mark.parametrize("low_rank", [True, False], ids=["q_lora (V3)", "q_proj (V2-Lite)"])
def test_latent_attention_finite_differences(low_rank):
    """Every weight and the input, causal scores, a padded key in the second row."""
    rng = np.random.default_rng(1)
    rope = rope_angles(np.arange(T), R, 100.0)
    padding = np.ones((B, T), dtype=bool)
    padding[1, 0] = False

    def forward(params, x):
        return latent_attention_forward(params, x, H, rope, mod=ScoreMod(scale=0.37, causal=True), key_padding=padding)

    args = {"params": latent_params(rng, low_rank), "x": rng.standard_normal((B, T, D))}
    result = check_pair(forward, latent_attention_backward, args, wrt=["x", "params"])
    assert result.worst <= FD_BAR, str(result)
    assert all(v > 0 for v in result.max_abs_grad.values())


@pytest.mark.parametrize(
    ("scoring", "groups", "norm"), [("sigmoid", 4, True), ("softmax", 1, False)], ids=["V3", "V2-Lite"]
)
def test_deepseek_moe_finite_differences(scoring, groups, norm):
    """The weights' gradient reaches the router through the chosen scores only; the score bias gets none."""
    rng = np.random.default_rng(2)
    E, F = 8, 5
    params = {
        "router.weight": 0.5 * rng.standard_normal((E, D)), "router.score_bias": 0.1 * rng.standard_normal(E),
        "experts.gate_up_proj": 0.3 * rng.standard_normal((E, 2 * F, D)),
        "experts.down_proj": 0.3 * rng.standard_normal((E, D, F)),
        "shared.gate.weight": 0.3 * rng.standard_normal((2 * F, D)),
        "shared.linear1.weight": 0.3 * rng.standard_normal((2 * F, D)),
        "shared.linear2.weight": 0.3 * rng.standard_normal((D, 2 * F)),
    }  # fmt: skip

    def forward(params, x):
        return deepseek_moe_forward(
            params, x, 3, scoring=scoring, n_groups=groups, topk_groups=groups // 2 or 1, norm_topk_prob=norm,
            scaling=2.5,
        )  # fmt: skip

    args = {"params": params, "x": rng.standard_normal((B, T, D))}
    result = check_pair(forward, deepseek_moe_backward, args, wrt=["x", "params"], max_coords=12)
    assert result.worst <= FD_BAR, str(result)
    assert result.max_abs_grad["params.router.score_bias"] == 0.0
    assert result.max_abs_grad["params.router.weight"] > 0


def tiny_config(low_rank: bool = True, **fields) -> nt.TransformerConfig:
    """A tiny DeepSeek-like LM: latent attention, layer 0 dense, two MoE layers (V3's router, or V2's)."""
    router = {"router_scoring": "sigmoid", "router_score_bias": True, "router_groups": 4, "router_topk_groups": 2}
    router = router | {"routed_scaling": 2.5} if low_rank else {"norm_topk_prob": False}
    base = dict(
        src_vocab_size=50, tgt_vocab_size=50, d_model=D, n_heads=H, d_ff=24, n_encoder_layers=0, n_decoder_layers=3,
        dropout=0.0, activation="silu", norm="rms", norm_first=True, positional="rope", max_len=64, gated_ffn=True,
        bias=False, scale_embeddings=False, output_bias=False, pad_id=None, head_dim=DN + R, rotary_dim=R,
        kv_lora_rank=C, q_lora_rank=RQ if low_rank else None, v_head_dim=DV, attention_scale=0.3, n_experts=8,
        top_k=3, d_expert=6, dense_layers=(0,), n_shared_experts=1,
    )  # fmt: skip
    return nt.TransformerConfig(**base | router | fields)


@pytest.mark.parametrize("low_rank", [True, False], ids=["V3-like", "V2-Lite-like"])
def test_numpy_and_torch_models_agree_float64(low_rank, device):
    config = tiny_config(low_rank)
    ours = nt.TransformerLM(config, seed=0)
    rng = np.random.default_rng(3)
    for name in ours.params:
        if name.endswith("score_bias"):
            ours.params[name][:] = 0.1 * rng.standard_normal(ours.params[name].shape)
    model = tt.TransformerLM(config).double().to(device)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})
    ids = rng.integers(0, 50, (2, 7))
    logits = ours.forward(ids)
    upstream = rng.standard_normal(logits.shape)
    ours.zero_grad()
    ours.backward(upstream)
    theirs = model(torch.from_numpy(ids).to(device))
    theirs.backward(torch.from_numpy(upstream).to(device))
    assert np.abs(logits - theirs.detach().cpu().numpy()).max() <= 1e-10 * np.abs(logits).max()
    params = dict(model.named_parameters())
    for name, grad in ours.grads.items():
        if name.endswith("score_bias"):  # a buffer on the torch side: it chooses, it gets no gradient
            assert name not in params and not np.any(grad)
            continue
        other = params[name].grad.cpu().numpy()
        assert np.any(grad), name
        assert np.abs(grad - other).max() <= 1e-10 * max(np.abs(other).max(), 1e-3), name


# YaRN as DeepSeek-V3 sets it (factor 40, mscale and mscale_all_dim 1), over an original length of 16 so that the tiny
# model's two rotary frequencies are one interpolated and one on the ramp; the softmax scale is V3's:
# (DN + R)^-1/2 mscale^2 with mscale = 0.1 ln(40) + 1 (transformer_spec.families.deepseek_v3.latent_scale)
V3_YARN = RopeScaling("yarn", factor=40.0, original_max_position_embeddings=16, beta_fast=32, beta_slow=1,
                      mscale=1.0, mscale_all_dim=1.0)  # fmt: skip
V3_SCALE = (DN + R) ** -0.5 * (0.1 * np.log(40.0) + 1.0) ** 2


@pytest.mark.parametrize(
    ("low_rank", "coords"),
    [(True, 4), pytest.param(True, 24, marks=pytest.mark.slow), pytest.param(False, 24, marks=pytest.mark.slow)],
    ids=["V3-like", "V3-like-fuller", "V2-Lite-like-fuller"],
)
def test_deepseek_lm_finite_differences(low_rank, coords):
    """A whole DeepSeek-like LM in float64 (latent attention, YaRN with its mscale on the softmax scale, layer 0 dense,
    two routed MoE layers with a shared expert, V3's sigmoid group-limited router with its correction bias):
    central differences on `coords` random entries of every parameter tensor under a random upstream gradient
    (numpy_transformer.gradcheck.check_model), every gradient non-zero but the correction bias's, which is exactly
    zero (it chooses the experts, it weighs nothing) although it does change the choice and so the logits."""
    config = tiny_config(low_rank, n_decoder_layers=3, tgt_vocab_size=11, max_len=16, rope_scaling=V3_YARN,
                         attention_scale=V3_SCALE)  # fmt: skip
    rng = np.random.default_rng(11)
    model = nt.TransformerLM(config, seed=4).eval()
    for name, value in model.params.items():
        if name.endswith(("norm.weight", "score_bias")):
            value += 0.3 * rng.standard_normal(value.shape)
    ids = rng.integers(0, 11, (2, 5))
    result = check_model(model, ids, seed=12, max_coords=coords)
    assert set(result.errors) == set(model.params)
    assert result.worst <= FD_BAR, str(result)
    biases = [name for name in model.params if name.endswith("router.score_bias")]
    assert len(biases) == (2 if low_rank else 0)
    largest = max(result.max_abs_grad.values())
    for name, g in result.max_abs_grad.items():
        if name in biases:
            assert g == 0.0 and result.errors[name] == 0.0, name  # analytic zero, and the differences agree
        else:
            assert g >= 1e-6 * largest, f"{name} has (nearly) no gradient: {g:.2e} vs {largest:.2e}"
    if biases:  # the bias does choose: without it the routing, and so the logits, differ
        logits = model.forward(ids)
        for name in biases:
            model.params[name][:] = 0.0
        assert np.abs(model.forward(ids) - logits).max() > 1e-3 * np.abs(logits).max()


def test_an_encoder_of_latent_attention_attends_both_ways():
    """Outside a decoder latent attention is not causal, on both sides (EncoderModel, float64)."""
    config = tiny_config(n_experts=0, dense_layers=(), n_shared_experts=0, router_score_bias=False, router_groups=1,
                         router_topk_groups=1, routed_scaling=1.0, n_encoder_layers=2, n_decoder_layers=0,
                         router_scoring="softmax")  # fmt: skip
    ours = nt.EncoderModel(config, seed=0)
    model = tt.EncoderModel(config).double()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})
    ids = np.random.default_rng(5).integers(1, 50, (2, 6))
    hidden = ours.forward(ids)
    np.testing.assert_allclose(model(torch.from_numpy(ids)).detach().numpy(), hidden, rtol=0, atol=1e-12)
    changed = ids.copy()
    changed[:, -1] = changed[:, -1] % 49 + 1  # another id in [1, 50)
    assert np.abs(ours.forward(changed)[:, 0] - hidden[:, 0]).max() > 1e-6  # the first token sees the last


def test_the_cache_holds_the_latent_and_decodes_as_the_whole_forward():
    """Run one token at a time through a LatentCache (NumPy) and torch's: the outputs equal the whole sequence's,
    and each layer keeps (N, P, C) latents and (N, P, R) rotary keys: C + R numbers per token, whatever H."""
    rng = np.random.default_rng(4)
    params = latent_params(rng, low_rank=True)
    x = rng.standard_normal((B, T, D))
    rope = rope_angles(np.arange(T), R, 100.0)
    mod = ScoreMod(scale=0.37, causal=True)
    whole, _ = latent_attention_forward(params, x, H, rope, mod=mod)
    cache = LatentCache(B, T, C, R, np.float64)
    steps = [
        latent_attention_forward(
            params, x[:, t : t + 1], H, (rope[0][t : t + 1], rope[1][t : t + 1]), mod=mod, q_pos=np.array([t]),
            kv_cache=cache,
        )[0]
        for t in range(T)
    ]  # fmt: skip
    np.testing.assert_allclose(np.concatenate(steps, axis=1), whole, rtol=0, atol=1e-12)
    assert cache.latents.shape == (B, T, C) and cache.rope_keys.shape == (B, T, R) and cache.length == T
    # torch: the same through its own cache
    config = tiny_config()
    module = torch_latent.LatentAttention(
        nt.TransformerConfig(**{**config.to_dict(), "n_heads": H}), scale=0.37
    ).double()  # fmt: skip
    names = {"q_a_norm.weight", "kv_a_norm.weight"}
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.from_numpy(params[name] if name in params or name in names else params[name]))
    cos, sin = (torch.from_numpy(np.concatenate([t, t], axis=-1)) for t in rope)
    x_t = torch.from_numpy(x)
    with torch.no_grad():
        torch_whole = module(x_t, x_t, x_t, rope=(cos, sin), is_causal=True)[0].numpy()
        torch_cache = torch_latent.LatentCache(B, T, C, R, x_t)
        torch_steps = [
            module(x_t[:, t : t + 1], None, None, rope=(cos[t : t + 1], sin[t : t + 1]), kv_cache=torch_cache,
                   is_causal=True, q_pos=torch.tensor([t]))[0].numpy()
            for t in range(T)
        ]  # fmt: skip
    np.testing.assert_allclose(torch_whole, whole, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.concatenate(torch_steps, axis=1), whole, rtol=0, atol=1e-12)
    assert tuple(torch_cache.latents.shape) == (B, T, C) and tuple(torch_cache.rope_keys.shape) == (B, T, R)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"positional": "learned"}, "kv_lora_rank"),
        ({"bias": True}, "kv_lora_rank"),
        ({"kv_lora_rank": None}, "q_lora_rank"),
        ({"router_scoring": "relu"}, "router_scoring"),
        ({"router_groups": 3}, "router_groups"),
        ({"routed_scaling": 0.0}, "routed_scaling"),
        ({"n_kv_heads": 1}, "n_kv_heads"),
        ({"sliding_window": 3}, "sliding_window"),
        ({"attn_softcap": 5.0}, "attn_softcap"),
    ],
)
def test_config_refuses_what_latent_attention_and_the_router_cannot_be(fields, named):
    with pytest.raises(ValueError, match=named):
        tiny_config(**fields)


def test_our_checkpoints_keep_the_deepseek_fields(tmp_path):
    """A DeepSeek-like LM saved by the NumPy side and read by both: the same config (every new field) and logits."""
    from numpy_transformer.checkpoint import load_checkpoint, save_checkpoint
    from torch_transformer.checkpoint import load_checkpoint as torch_load_checkpoint

    ours = nt.TransformerLM(tiny_config(), seed=1)
    save_checkpoint(tmp_path / "lm.safetensors", ours)
    back = load_checkpoint(tmp_path / "lm.safetensors")
    model = torch_load_checkpoint(tmp_path / "lm.safetensors", dtype=torch.float64)
    assert back.config == ours.config == model.config
    ids = np.random.default_rng(6).integers(0, 50, (2, 5))
    logits = ours.eval().forward(ids)
    np.testing.assert_array_equal(back.eval().forward(ids), logits)
    with torch.no_grad():
        np.testing.assert_allclose(model.eval()(torch.from_numpy(ids)).numpy(), logits, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mistake", [None, "scale 1/d"], ids=["as released", "layer 1 scaled by 1/d"])
def test_the_judge_reads_transformers_deepseek_v2(mistake, tmp_path):
    """transformers' DeepseekV2ForCausalLM (every layer dense, plain RoPE), whose keys are written into a new_empty
    tensor by slices (key_states[..., :n].copy_(k_nope)): the recorder follows the writes to kv_a_proj_with_mqa, so
    the latent attention is read and the model passes; layer 1's scores scaled by 1/d (not d^-1/2) are found there."""
    from parity_tests import check
    from parity_tests import hf_compare as H

    rope = {"rope_type": "default", "rope_theta": 10000.0}
    model = H.build_tiny("deepseek_v2", tmp_path, first_k_dense_replace=3, rope_parameters=rope)
    if mistake:
        attention = model.model.layers[1].self_attn
        attention.scaling = 1 / attention.qk_head_dim
    result = check.module(model, "transformer_lm")
    if mistake is None:
        assert result.passed, str(result)
        return
    assert not result.passed and result.diagnoses, str(result)
    assert (result.diagnoses[0].id, result.diagnoses[0].where) == ("attention.wrong_scale", "model.layers.1.self_attn")


def _experts_activation_on_up(self, hidden_states, top_k_index, top_k_weights, only=None):
    """transformers' DeepseekV2Experts / DeepseekV3Experts.forward with silu on the up half: down(gate * silu(up)),
    in every expert or in expert `only` alone."""
    out = torch.zeros_like(hidden_states)
    for e in range(self.num_experts):
        rows, slot = torch.where(top_k_index == e)
        gate, up = torch.nn.functional.linear(hidden_states[rows], self.gate_up_proj[e]).chunk(2, dim=-1)
        on_up = only is None or e == only
        h = torch.nn.functional.linear(gate * self.act_fn(up) if on_up else self.act_fn(gate) * up, self.down_proj[e])
        out.index_add_(0, rows, h * top_k_weights[rows, slot, None])
    return out


def _shared_activation_on_up(self, x):
    """transformers' DeepseekV3MLP.forward (DeepSeek's shared experts) with silu on the up projection."""
    return self.down_proj(self.gate_proj(x) * self.act_fn(self.up_proj(x)))


# a mistake -> (its catalogue id, where it is named, the end of its message)
MISTAKES = {
    "scale 1/d": ("attention.wrong_scale", "model.layers.1.self_attn", ""),
    "activation on up": ("gated_feed_forward.activation_on_up", "model.layers.2.mlp.experts", "(every routed expert)"),
    "expert 3 on up": ("gated_feed_forward.activation_on_up", "model.layers.2.mlp.experts", "(expert 3)"),
    "shared on up": ("gated_feed_forward.activation_on_up", "model.layers.2.mlp.shared_experts", "(up(x)))"),
}


@pytest.mark.parametrize("mistake", [None, *MISTAKES])
@pytest.mark.parametrize("family", ["deepseek_v2", "deepseek_v3"])
def test_the_judge_reads_transformers_deepseek_as_shipped(family, mistake, tmp_path):
    """transformers' DeepSeek-V2 and V3 as hf_compare.TINY builds them: YaRN (factor 40) with its mscale on the
    softmax scale (read from the scores' scale, the YaRN the module states), layer 0 dense, then mixtures with their
    experts F_e = 12 wide (not d_ff), shared experts beside them and DeepSeek's routers (V2: softmax, greedy; V3:
    sigmoid, a correction bias for the choice, 2 of 4 groups, routed_scaling 2.5, renormalised) pass; layer 1's scores
    scaled by 1/d is named there; the activation on the up half in every routed expert of layer 2, in its expert 3
    alone (at the stacked experts, the message naming expert 3), or in its shared experts (gate_proj and up_proj
    settled by their names, as the routed experts' are: the shared experts' own module), is named too."""
    import functools
    import types

    from parity_tests import check
    from parity_tests import hf_compare as H

    model = H.build_tiny(family, tmp_path)
    mlp = model.model.layers[2].mlp
    if mistake == "scale 1/d":
        attention = model.model.layers[1].self_attn
        attention.scaling = 1 / attention.qk_head_dim
    if mistake in ("activation on up", "expert 3 on up"):
        on_up = functools.partial(_experts_activation_on_up, only=3 if mistake == "expert 3 on up" else None)
        mlp.experts.forward = types.MethodType(on_up, mlp.experts)
    if mistake == "shared on up":
        mlp.shared_experts.forward = types.MethodType(_shared_activation_on_up, mlp.shared_experts)
    result = check.module(model, "transformer_lm")
    if mistake is None:
        assert result.passed, str(result)
        cfg = result.config
        assert (cfg.d_expert, cfg.n_shared_experts) == (12, H.TINY[family]["n_shared_experts"]), str(result)
        assert cfg.router_scoring == ("sigmoid" if family == "deepseek_v3" else "softmax"), str(result)
        return
    assert not result.passed and result.diagnoses, str(result)
    named, where, said = MISTAKES[mistake]
    assert (result.diagnoses[0].id, result.diagnoses[0].where) == (named, where), str(result)
    assert result.diagnoses[0].message.endswith(said), str(result)


def test_the_judge_says_deepseek_v2_group_limited_greedy_has_no_pair(tmp_path):
    """DeepSeek-V2's group_limited_greedy ranks each group by its best score (V3's, the reference's, by the sum of its
    two best): said at the router as a top-k the reference has no pair for, never a reshape error."""
    from parity_tests import check
    from parity_tests import hf_compare as H

    groups = dict(topk_method="group_limited_greedy", n_group=4, topk_group=2)
    result = check.module(H.build_tiny("deepseek_v2", tmp_path, **groups), "transformer_lm")
    assert not result.passed and result.unsupported is not None, str(result)
    assert "groups ranked otherwise" in str(result) and "model.layers.1.mlp.gate" in str(result), str(result)


class _Expert(torch.nn.Module):
    """One expert as DeepSeek's own code writes it (a DeepseekMLP in a ModuleList): gate_proj, up_proj, down_proj,
    its weights expert e's rows of transformers' stacked ones; on_up: silu on the up projection."""

    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor, on_up: bool):
        super().__init__()
        F, self.on_up = down.shape[-1], on_up
        self.gate_proj, self.up_proj = (torch.nn.Linear(gate_up.shape[1], F, bias=False) for _ in range(2))
        self.down_proj = torch.nn.Linear(F, down.shape[0], bias=False)
        with torch.no_grad():
            linears = (self.gate_proj, self.up_proj, self.down_proj)
            for linear, weight in zip(linears, (*gate_up.chunk(2), down), strict=True):
                linear.weight.copy_(weight)

    def forward(self, x):
        gate, up = self.gate_proj(x), self.up_proj(x)
        act = torch.nn.functional.silu
        return self.down_proj(gate * act(up) if self.on_up else act(gate) * up)


def _moe_of_a_module_list(self, hidden_states):
    """DeepseekV3MoE.forward with its experts a ModuleList, each run on the rows that chose it."""
    _, weights, chosen = self.gate(hidden_states)
    x = hidden_states.view(-1, hidden_states.shape[-1])
    out = torch.zeros_like(x)
    for e, expert in enumerate(self.experts):
        rows, slot = torch.where(chosen == e)
        out.index_add_(0, rows, expert(x[rows]) * weights[rows, slot, None])
    return out.view(hidden_states.shape) + self.shared_experts(hidden_states)


@pytest.mark.parametrize("family", ["deepseek_v2", "deepseek_v3"])
def test_a_mistake_in_one_expert_of_deepseeks_module_list_is_named_at_it(family, tmp_path):
    """DeepSeek's experts as its own modeling code keeps them (a ModuleList of gated blocks, not transformers' stacked
    tensors): as released it passes; silu on the up projection of expert 3 of layer 2 is named at that expert's
    module (model.layers.2.mlp.experts.3)."""
    import types

    from parity_tests import check
    from parity_tests import hf_compare as H

    def built(on_up: int | None):
        model = H.build_tiny(family, tmp_path)
        for i, layer in enumerate(model.model.layers[1:], start=1):
            stacked = layer.mlp.experts
            del layer.mlp.experts
            layer.mlp.experts = torch.nn.ModuleList(
                _Expert(stacked.gate_up_proj[e].detach(), stacked.down_proj[e].detach(), (i, e) == (2, on_up))
                for e in range(stacked.num_experts)
            )
            layer.mlp.forward = types.MethodType(_moe_of_a_module_list, layer.mlp)
        return model

    released = check.module(built(None), "transformer_lm")
    assert released.passed, str(released)
    result = check.module(built(3), "transformer_lm")
    got = [(d.id, d.where) for d in result.diagnoses]
    assert got == [("gated_feed_forward.activation_on_up", "model.layers.2.mlp.experts.3")], str(result)
