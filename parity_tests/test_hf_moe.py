"""Mixtral and Qwen3-MoE, and the mixture-of-experts decoder layer, against transformers' MixtralForCausalLM and
Qwen3MoeForCausalLM beyond what hf_compare's variants check in test_hf.py (logits and every gradient of
sum(logits * R), round trip, greedy search):

- the load-balancing loss in the objective, as transformers' output_router_logits=True and router_aux_loss_coef add
  it: the loss, the router logits and every gradient of sum(logits * R) + c * aux_loss equal transformers' in float64
  at 1e-10, both sides, top-2 and top-1 (where Mixtral's router's one gradient is the aux loss's), renormalised and raw
  gates, with a dense layer between the sparse ones, and on a left-padded batch whose padding the loss leaves out;
- beam search equal to generate(num_beams=3), cached and not, both sides;
- the files: save_pretrained's per-expert layout (Mixtral's w1, w2, w3; Qwen3-MoE's gate_proj, up_proj, down_proj)
  and transformers 5's fused tensors load the same; an
  incomplete set of experts is refused naming what is missing;
- NumPy against torch_transformer, with the aux loss, in evaluation and in training mode: dense layers between the
  MoE layers, an expert width of its own, raw gates, post-norm and gelu_tanh experts (no family expresses these),
  and an encoder-decoder whose decoder is a mixture of experts; finite differences of the whole model;
- the config's and the API's errors.

Tiny random models written with save_pretrained in the test (hf_compare.build_tiny); nothing is downloaded.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

import numpy_transformer as nt
import torch_transformer as tt
from numpy_transformer import checkpoint
from numpy_transformer import hf as numpy_hf
from parity_tests import components as C
from parity_tests import hf_compare as H
from parity_tests.test_generate_rules import left_padded_batch, ours_decode, theirs_decode
from torch_transformer import hf as torch_hf

one_torch_thread = pytest.fixture(autouse=True)(C.one_torch_thread)

SIDES = ["numpy", "torch"]
COEF = 0.3  # the aux loss's weight in the objective: large, so that its share of every gradient shows
VOCAB = H.TINY["mixtral"]["vocab_size"]
assert H.TINY["qwen3_moe"]["vocab_size"] == VOCAB


def theirs_run(model, family: str, ids, mask, upstream):
    """transformers: logits, aux_loss, router logits and every parameter gradient of
    sum(logits * upstream) + COEF * aux_loss (positions from the mask, as generate() makes them)."""
    model.zero_grad(set_to_none=True)
    ids_t = torch.from_numpy(ids)
    kwargs = {}
    if mask is not None:
        mask_t = torch.from_numpy(mask)
        kwargs = {"attention_mask": mask_t, "position_ids": (mask_t.cumsum(-1) - 1).masked_fill(mask_t == 0, 0)}
    with H.patch_for(family, np.float64):
        out = model(input_ids=ids_t, use_cache=False, output_router_logits=True, **kwargs)
        ((out.logits * torch.from_numpy(upstream)).sum() + COEF * out.aux_loss).backward()
    outputs = {"logits": out.logits, "aux_loss": out.aux_loss}
    outputs |= {f"router_logits {i}": z for i, z in enumerate(out.router_logits)}
    grads = {name: p.grad for name, p in model.named_parameters()}
    return {k: H.to_numpy(v) for k, v in outputs.items()}, {k: H.to_numpy(v) for k, v in grads.items()}


def ours_run(model, side: str, ids, mask, upstream):
    """Ours: the same outputs and gradients (transformers' names): the NumPy model's load_balancing_loss and
    backward(dlogits, daux_loss=COEF); torch_transformer's load_balancing_loss under autograd."""
    if side == "numpy":
        model.eval().zero_grad()
        logits = model.forward(ids, attention_mask=mask)
        aux = model.load_balancing_loss(mask)
        model.backward(upstream, daux_loss=COEF)
        outputs = {"logits": logits, "aux_loss": np.asarray(aux)}
        outputs |= {f"router_logits {i}": z for i, z in enumerate(model.router_logits())}
        return outputs, numpy_hf.to_hf(model, model.grads, tied=False)
    model.eval().zero_grad(set_to_none=True)
    mask_t = None if mask is None else torch.from_numpy(mask)
    logits = model(torch.from_numpy(ids), attention_mask=mask_t)
    aux = model.load_balancing_loss(mask_t)
    ((logits * torch.from_numpy(upstream)).sum() + COEF * aux).backward()
    outputs = {"logits": logits, "aux_loss": aux} | {
        f"router_logits {i}": z for i, z in enumerate(model.router_logits())
    }
    grads = torch_hf.to_hf(model, {n: p.grad for n, p in model.named_parameters()}, tied=False)
    return {k: H.to_numpy(v) for k, v in outputs.items()}, {k: H.to_numpy(v) for k, v in grads.items()}


def relative_error(ours, theirs) -> float:
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


CASES = {
    "mixtral top-2 of 4": ("mixtral", {}),
    "mixtral top-1 of 3, tied": (
        "mixtral", {"num_local_experts": 3, "num_experts_per_tok": 1, "tie_word_embeddings": True}
    ),
    "qwen3_moe top-2 of 4, dense layer 1": ("qwen3_moe", {}),
    "qwen3_moe raw gates top-1 of 3": (
        "qwen3_moe", {"norm_topk_prob": False, "num_experts": 3, "num_experts_per_tok": 1}
    ),
}  # fmt: skip


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize(("family", "overrides"), list(CASES.values()), ids=list(CASES))
@pytest.mark.parametrize("side", SIDES)
def test_aux_loss_and_every_gradient_equal_transformers(side, family, overrides, padded, tmp_path):
    """float64: logits (real positions), the aux loss, the router logits (real rows) and every gradient of
    sum(logits * R) + c * aux_loss within 1e-10 of transformers', none of them zero. With Mixtral's top-1 the
    renormalised gate is 1 whatever the logits: the router's gradient is the aux loss's alone, and it must match too.
    Qwen3-MoE's raw gates send the gates' gradient to every logit; its dense layer has no router."""
    theirs_model = H.build_tiny(family, tmp_path, **overrides).double()
    ours_model = H.load_ours(side, tmp_path, np.float64)
    if padded:
        ids, mask = left_padded_batch(VOCAB)
    else:
        ids, mask = H.make_inputs(family)[0], None
    real = np.ones(ids.shape, bool) if mask is None else mask.astype(bool)
    upstream = np.random.default_rng(1).standard_normal((*ids.shape, VOCAB)) * real[..., None]
    theirs, theirs_grads = theirs_run(theirs_model, family, ids, mask, upstream)
    ours, ours_grads = ours_run(ours_model, side, ids, mask, upstream)
    config = ours_model.config
    moe_layers = sum(config.is_moe_layer(i) for i in range(config.n_decoder_layers))
    assert sorted(ours) == sorted(theirs) and len(theirs) == 2 + moe_layers
    for name, value in theirs.items():
        keep = real if name == "logits" else real.reshape(-1) if name.startswith("router") else ...
        assert relative_error(ours[name][keep], value[keep]) <= 1e-10, name
    assert set(ours_grads) == set(theirs_grads)
    for name, theirs_grad in theirs_grads.items():
        assert np.any(theirs_grad) and np.isfinite(ours_grads[name]).all(), f"{name}: zero or not finite"
        assert relative_error(ours_grads[name], theirs_grad) <= 1e-10, name
    router = "model.layers.0.mlp.gate.weight"
    without_aux = H.compare_hf(family, np.float64, side, **overrides) if not padded else None
    if without_aux is not None:  # the aux loss's share of the router's gradient is there, and not small
        share = np.abs(ours_grads[router] - without_aux.grads[router][0]).max() / np.abs(ours_grads[router]).max()
        assert share > 1e-2


@pytest.mark.parametrize("family", H.MOE_FAMILIES)
@pytest.mark.parametrize("side", SIDES)
def test_beam_search_equals_generate(side, family, tmp_path):
    """Beam search (3 beams) and greedy search, cached and not, equal generate()'s on a tiny Mixtral / Qwen3-MoE."""
    theirs_model = H.build_tiny(family, tmp_path, eos_token_id=None).double()
    ours_model = H.load_ours(side, tmp_path, np.float64)
    prompts = np.array([[5, 9, 7, 21], [12, 4, 30, 8]])
    for num_beams in (1, 3):
        theirs = theirs_decode(theirs_model, family, prompts, num_beams, 8)
        for use_cache in (True, False):
            np.testing.assert_array_equal(ours_decode(ours_model, prompts, side, num_beams, 8, use_cache), theirs)


# ----------------------------------------------------------------------------------------------
# The files.


# a tensor of each family's per-expert files (save_pretrained's layout)
PER_EXPERT = {
    "mixtral": "model.layers.1.block_sparse_moe.experts.2.w3.weight",
    "qwen3_moe": "model.layers.2.mlp.experts.2.up_proj.weight",
}


@pytest.mark.parametrize("family", H.MOE_FAMILIES)
def test_fused_and_per_expert_files_load_the_same(family, tmp_path):
    """save_pretrained writes each expert's tensors (Mixtral's w1, w2, w3; Qwen3-MoE's gate_proj, up_proj,
    down_proj); hf.save writes transformers 5's fused tensors: both load to the same parameters, and those are the
    transformers model's own."""
    theirs_model = H.build_tiny(family, tmp_path / "hf")
    assert PER_EXPERT[family] in load_file(tmp_path / "hf/model.safetensors")
    ours = numpy_hf.load(tmp_path / "hf", dtype=np.float64)
    numpy_hf.save(ours, tmp_path / "ours")
    written = load_file(tmp_path / "ours/model.safetensors")
    assert "model.layers.0.mlp.experts.gate_up_proj" in written and not any(".experts.0." in k for k in written)
    again = numpy_hf.load(tmp_path / "ours", dtype=np.float64)
    for name, value in ours.params.items():
        np.testing.assert_array_equal(again.params[name], value)
    state = {k: H.to_numpy(v) for k, v in theirs_model.state_dict().items()}
    for name, value in numpy_hf.to_hf(ours, ours.params).items():
        np.testing.assert_array_equal(value, state[name].astype(np.float64))


@pytest.mark.parametrize("family", H.MOE_FAMILIES)
def test_an_incomplete_set_of_experts_is_refused_naming_it(family, tmp_path):
    H.build_tiny(family, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors[PER_EXPERT[family]]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    layer = PER_EXPERT[family].split(".")[2]
    for load in (numpy_hf.load, torch_hf.load):
        with pytest.raises(ValueError, match=rf"model\.layers\.{layer} are incomplete: missing .*{PER_EXPERT[family]}"):
            load(tmp_path)


# ----------------------------------------------------------------------------------------------
# NumPy against torch_transformer, and finite differences: options beyond the two families' tiny checkpoints.

MOE_LM = nt.TransformerConfig(
    src_vocab_size=20, tgt_vocab_size=20, d_model=16, n_heads=4, d_ff=24, n_encoder_layers=0, n_decoder_layers=3,
    norm_first=True, norm="rms", positional="rope", gated_ffn=True, activation="silu", bias=False, output_bias=False,
    pad_id=None, n_experts=4, top_k=2,
)  # fmt: skip
TWIN_CASES = {
    "dense layer 1 (mlp_only_layers), expert width 12": dict(dense_layers=(1,), d_expert=12),
    "raw gates (norm_topk_prob False), top-3": dict(norm_topk_prob=False, top_k=3),
    "post-norm, gelu_tanh experts, tied, sliding window 3": dict(
        norm_first=False, activation="gelu_tanh", tie_embeddings=True, sliding_window=3
    ),
}


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("changes", list(TWIN_CASES.values()), ids=list(TWIN_CASES))
def test_numpy_matches_torch_with_the_aux_loss(changes, dtype):
    """Logits, aux loss and every gradient of sum(logits * R) + c * aux_loss (left padding masked out of the loss),
    NumPy against torch_transformer; no gradient zero. Float64 at its bar; float32 against torch's float64 run on the
    same weights, each tensor allowed the bar or SELF_RATIO times torch's own float32 error on it (measured here, not a
    number from one host: BLAS kernels and product layouts round differently)."""
    config = dataclasses.replace(MOE_LM, **changes)
    model = nt.TransformerLM(config, seed=0, dtype=dtype)
    rng = np.random.default_rng(0)
    for value in model.params.values():
        # weights moved off their initialisation so the routing differs between tokens
        value += (0.2 * rng.standard_normal(value.shape)).astype(dtype)
    ids, mask = left_padded_batch(20)
    upstream = (rng.standard_normal((*ids.shape, 20)) * mask[..., None]).astype(dtype)
    ours, ours_grads = ours_run_native(model, ids, mask, upstream)
    real = mask.astype(bool)

    def torch_run(torch_dtype) -> tuple[dict, dict]:
        twin = tt.TransformerLM(config).to(torch_dtype)
        twin.load_state_dict({k: torch.from_numpy(v).to(torch_dtype) for k, v in model.state_dict().items()})
        logits = twin(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
        aux = twin.load_balancing_loss(torch.from_numpy(mask))
        ((logits * torch.from_numpy(upstream).to(torch_dtype)).sum() + COEF * aux).backward()
        assert len(twin.router_logits()) == len(model.router_logits())
        outputs = {"logits": H.to_numpy(logits)[real], "aux_loss": H.to_numpy(aux)}
        return outputs, {name: H.to_numpy(p.grad) for name, p in twin.named_parameters()}

    theirs, theirs_grads = torch_run(C.TORCH_DTYPE[np.dtype(dtype)])
    ours_outputs = {"logits": ours["logits"][real], "aux_loss": ours["aux_loss"]}
    result = C.Result(outputs={name: (ours_outputs[name], theirs[name]) for name in theirs})
    for name, grad in theirs_grads.items():
        result.grads[name] = (ours_grads[name], grad)
        assert np.any(ours_grads[name]), f"{name}: zero gradient"
    if np.dtype(dtype) == np.float32:  # the reference: torch in float64 on the same float32 weights
        exact, exact_grads = torch_run(torch.float64)
        result = C.Result(
            outputs={name: (ours_outputs[name], exact[name]) for name in exact},
            grads={name: (ours_grads[name], exact_grads[name]) for name in exact_grads},
            reference_float32=C.self_errors(
                C.Result(
                    outputs={name: (theirs[name], exact[name]) for name in exact},
                    grads={name: (theirs_grads[name], exact_grads[name]) for name in exact_grads},
                )
            ),
        )
    assert not C.failures(result, dtype), C.failures(result, dtype)
    assert len(model.router_logits()) == len([i for i in range(3) if config.is_moe_layer(i)])


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("lm", [True, False], ids=["TransformerLM", "Transformer with an MoE decoder"])
def test_training_mode_drops_the_same_units_on_both_sides(lm, dtype, device):
    """Dropout 0.2 at every site (activation dropout too: only the dense layer 1 has that site, the experts none):
    outputs, the loss, every hidden state and every gradient, NumPy against torch, the same units dropped."""
    config = dataclasses.replace(MOE_LM, dense_layers=(1,), dropout=0.2, n_encoder_layers=0 if lm else 2)
    result = C.compare_models(config, dtype, device, lm=lm, train=True)
    assert not C.failures(result, dtype), C.failures(result, dtype)
    assert all(np.any(ours) for ours, _ in result.grads.values())
    sites = tt.model.dropout_site_shapes(config, batch_size=2, tgt_len=5, src_len=None if lm else 6)
    assert "decoder.layers.1.ffn.dropout" in sites and "decoder.layers.0.ffn.dropout" not in sites


def ours_run_native(model, ids, mask, upstream):
    model.eval().zero_grad()
    logits = model.forward(ids, attention_mask=mask)
    aux = model.load_balancing_loss(mask)
    model.backward(upstream, daux_loss=COEF)
    return {"logits": logits, "aux_loss": np.asarray(aux)}, model.grads


@pytest.mark.parametrize("changes", list(TWIN_CASES.values()), ids=list(TWIN_CASES))
def test_finite_differences_of_the_model_with_the_aux_loss(changes):
    """Every parameter tensor of a float64 MoE TransformerLM (8 coordinates each), the objective
    sum(logits * R) + c * aux_loss: the wiring of the router's two gradients (gates and aux loss) through the model.
    The expert choice is piecewise constant: every row's k-th and (k+1)-th probabilities are first checked to be
    far apart (a step of 1e-5 cannot swap them)."""
    config = dataclasses.replace(MOE_LM, **changes)
    model = nt.TransformerLM(config, seed=1).eval()
    rng = np.random.default_rng(2)
    for value in model.params.values():
        value += 0.3 * rng.standard_normal(value.shape)
    ids, mask = left_padded_batch(20)
    upstream = rng.standard_normal((*ids.shape, 20))

    def objective():
        logits = model.forward(ids, attention_mask=mask)
        return np.sum(logits * upstream) + COEF * model.load_balancing_loss(mask)

    objective()
    for z in model.router_logits():
        p = np.sort(nt.moe.softmax_forward(z)[0], axis=-1)[:, ::-1]
        if config.top_k < config.n_experts:
            assert (p[:, config.top_k - 1] - p[:, config.top_k]).min() > 1e-4, "a row near a tie: pick another seed"
    model.zero_grad()
    model.backward(upstream, daux_loss=COEF)
    grads = {k: g.copy() for k, g in model.grads.items()}
    result = nt.gradcheck.gradcheck(objective, model.params, grads, max_coords=8)
    assert result.worst <= C.FD_BAR, str(result)
    assert all(np.any(g) for g in grads.values())


def test_dense_layers_have_the_dense_block_and_its_names():
    config = dataclasses.replace(MOE_LM, dense_layers=(0, 2), d_expert=10)
    names = nt.model.parameter_shapes(config, decoder_only=True)
    assert names["decoder.layers.1.ffn.router.weight"] == (4, 16)
    assert names["decoder.layers.1.ffn.experts.gate_up_proj"] == (4, 20, 16)
    assert names["decoder.layers.1.ffn.experts.down_proj"] == (4, 16, 10)
    assert "decoder.layers.0.ffn.gate.weight" in names and "decoder.layers.0.ffn.router.weight" not in names
    twin = tt.TransformerLM(config)
    assert {k: tuple(v.shape) for k, v in twin.state_dict().items()} == names


# ----------------------------------------------------------------------------------------------
# Errors.


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        (dict(top_k=5), ValueError, r"top_k must be in \[1, n_experts=4\], got 5"),
        (dict(top_k=0), ValueError, r"top_k must be >= 1, got 0"),
        (dict(n_experts=-1), ValueError, r"n_experts must be >= 0, got -1"),
        (dict(dense_layers=(3,)), ValueError, r"dense_layers must index decoder layers \[0, 3\), got 3"),
        (dict(dense_layers=[1.0]), TypeError, r"dense_layers entry must be an int, got float"),
        (dict(d_expert=0), ValueError, r"d_expert must be >= 1, got 0"),
        (dict(norm_topk_prob=1), TypeError, r"norm_topk_prob must be a bool, got int"),
        (dict(router_aux_loss_coef=-0.1), ValueError, r"router_aux_loss_coef must be a float >= 0, got -0.1"),
    ],
)
def test_bad_expert_fields_are_refused_naming_them(changes, error, match):
    with pytest.raises(error, match=match):
        dataclasses.replace(MOE_LM, **changes)


def test_dense_lists_round_trip_through_a_checkpoint(tmp_path):
    """dense_layers is a tuple; a checkpoint's JSON metadata holds a list, read back as the tuple."""
    config = dataclasses.replace(MOE_LM, dense_layers=(1,))
    model = nt.TransformerLM(config)
    checkpoint.save_checkpoint(tmp_path / "m.safetensors", model)
    assert checkpoint.load_checkpoint(tmp_path / "m.safetensors").config == config


def test_aux_loss_errors_name_the_problem():
    dense = nt.TransformerLM(dataclasses.replace(MOE_LM, n_experts=0))
    ids = np.array([[3, 4, 5]])
    dense.forward(ids)
    with pytest.raises(ValueError, match=r"no mixture-of-experts layer \(config.n_experts=0\)"):
        dense.load_balancing_loss()
    twin = tt.TransformerLM(dense.config)
    twin(torch.from_numpy(ids))
    with pytest.raises(ValueError, match=r"no mixture-of-experts layer"):
        twin.load_balancing_loss()
    model = nt.TransformerLM(MOE_LM)
    with pytest.raises(ValueError, match=r"no forward pass"):
        model.load_balancing_loss()
    logits = model.forward(ids)
    with pytest.raises(ValueError, match=r"daux_loss given, but load_balancing_loss\(\) was not called"):
        model.backward(np.ones_like(logits), daux_loss=0.1)
    model.load_balancing_loss()
    with pytest.raises(TypeError, match=r"daux_loss must be a float"):
        model.backward(np.ones_like(logits), daux_loss="0.1")
    model.forward(ids)  # a new forward: the loss of the last one no longer applies
    with pytest.raises(ValueError, match=r"load_balancing_loss\(\) was not called"):
        model.backward(np.ones_like(logits), daux_loss=0.1)
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(B, T\)"):
        model.load_balancing_loss(np.ones((1, 4)))
    with pytest.raises(ValueError, match=r"no forward pass has been run yet"):
        tt.TransformerLM(MOE_LM).load_balancing_loss()
