"""Optimizers: the NumPy model and torch_transformer trained side by side from one state dict.

float64, the same batches, label smoothing on, dropout on with the same units dropped on both
sides, gradient clipping and the paper's schedule: every step's loss within 1e-10 and every
weight within 1e-10 (the conventions' relative error) after the last step.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import numpy_transformer as nt  # noqa: E402
import torch_transformer as tt  # noqa: E402
from numpy_transformer import optim  # noqa: E402
from parity_tests import components as C  # noqa: E402

STEPS = 24
CONFIG = nt.TransformerConfig(
    src_vocab_size=13,
    tgt_vocab_size=15,
    d_model=16,
    n_heads=2,
    d_ff=32,
    n_encoder_layers=1,
    n_decoder_layers=2,
    dropout=0.1,
    max_len=12,
)

OPTIMIZERS = {
    "sgd-momentum": (
        lambda p: optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-3),
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-3),
    ),
    "sgd-nesterov": (
        lambda p: optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
    ),
    "adam": (
        lambda p: optim.Adam(p, lr=3e-3, betas=(0.9, 0.98), eps=1e-9, weight_decay=1e-4),
        lambda p: torch.optim.Adam(p, lr=3e-3, betas=(0.9, 0.98), eps=1e-9, weight_decay=1e-4),
    ),
    "adamw": (
        lambda p: optim.AdamW(p, lr=3e-3, weight_decay=0.05),
        lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.05),
    ),
    "adam-noam": (
        lambda p: optim.Adam(p, lr=1.0, betas=(0.9, 0.98), eps=1e-9),
        lambda p: torch.optim.Adam(p, lr=1.0, betas=(0.9, 0.98), eps=1e-9),
    ),
}


def train_side_by_side(name: str, device: str, lm: bool = False, max_norm: float | None = 0.5):
    np_make, torch_make = OPTIMIZERS[name]
    np_model = (nt.TransformerLM if lm else nt.Transformer)(CONFIG, seed=3).train()
    torch_model = (tt.TransformerLM if lm else tt.Transformer)(CONFIG).to(device=device, dtype=torch.float64).train()
    torch_model.load_state_dict({k: torch.from_numpy(v) for k, v in np_model.state_dict().items()})
    params = dict(torch_model.named_parameters())
    # The key projection's bias is left out of training. Its exact gradient is zero (softmax ignores
    # a shift shared by a whole row), so all it gets is rounding noise (~1e-17), different on each
    # side; Adam divides by sqrt(v) + eps and turns that noise into steps of lr * noise / eps, and
    # with coupled weight decay into an oscillation of amplitude ~lr. Training it would compare two
    # random walks. Left out, it stays exactly at its loaded value on both sides (compared below).
    trained = [name for name in params if not name.endswith("k_proj.bias")]
    np_opt = np_make({name: np_model.params[name] for name in trained})
    torch_opt = torch_make([params[name] for name in trained])
    np_sched = torch_sched = None
    if name.endswith("noam"):
        np_sched = optim.NoamLR(np_opt, CONFIG.d_model, warmup=8)
        torch_sched = torch.optim.lr_scheduler.LambdaLR(
            torch_opt, lambda n: optim.noam_rate(n + 1, CONFIG.d_model, warmup=8)
        )
    rng = np.random.default_rng(7)
    losses, norms = [], []
    for _ in range(STEPS):
        src, tgt_in, tgt_out = C.make_batch(CONFIG, rng, batch=3, src_len=7, tgt_len=6, scenario="padding")
        ids = (tgt_in,) if lm else (src, tgt_in)
        # NumPy: forward (drawing dropout masks), loss, backward, clip, step.
        logits = np_model.forward(*ids)
        loss, cache = nt.cross_entropy_forward(logits, tgt_out, CONFIG.pad_id, label_smoothing=0.1)
        np_model.zero_grad()
        np_model.backward(nt.cross_entropy_backward(cache))
        np_norm = optim.clip_grad_norm(np_model.grads, max_norm) if max_norm else None
        np_opt.step(np_model.grads)
        # torch: the same batch and the same dropped units.
        masks = {k: torch.from_numpy(v).to(device) for k, v in np_model.dropout_masks.items()}
        t_ids = tuple(torch.from_numpy(a).to(device) for a in ids)
        t_logits = torch_model(*t_ids, dropout_masks=masks)
        t_loss = tt.cross_entropy(t_logits, torch.from_numpy(tgt_out).to(device), CONFIG.pad_id, label_smoothing=0.1)
        torch_opt.zero_grad()
        t_loss.backward()
        t_norm = torch.nn.utils.clip_grad_norm_(params.values(), max_norm).item() if max_norm else None
        torch_opt.step()
        if np_sched is not None:
            np_sched.step()
            torch_sched.step()
            assert np_opt.lr == pytest.approx(torch_opt.param_groups[0]["lr"], rel=1e-15)
        losses.append((float(loss), t_loss.item()))
        norms.append((np_norm, t_norm))
    weights = {k: (np_model.params[k], C.to_numpy(p)) for k, p in params.items()}
    return losses, norms, weights


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_training_steps_match_torch_optim(name, device):
    losses, norms, weights = train_side_by_side(name, device)
    for step, (ours, theirs) in enumerate(losses):
        assert abs(ours - theirs) <= 1e-10 * max(1.0, abs(theirs)), f"step {step}: loss {ours!r} vs {theirs!r}"
    for step, (ours, theirs) in enumerate(norms):
        assert abs(ours - theirs) <= 1e-10 * theirs, f"step {step}: gradient norm {ours} vs {theirs}"
    assert any(ours > 0.5 for ours, _ in norms), "clipping never engaged: the test would not notice it"
    errors = C.relative_errors(weights, np.float64)
    worst = max(errors, key=lambda k: errors[k][1])
    assert errors[worst][1] <= 1e-10, f"{worst}: weights differ by relative {errors[worst][1]:.2e}"
    assert losses[-1][0] < losses[0][0], "the loss did not go down: nothing was trained"


def test_lm_training_matches_with_adamw(device):
    losses, _, weights = train_side_by_side("adamw", device, lm=True, max_norm=None)
    assert max(abs(a - b) for a, b in losses) <= 1e-10
    errors = C.relative_errors(weights, np.float64)
    assert max(e for _, e in errors.values()) <= 1e-10


def test_noam_schedule_is_the_papers_formula():
    d, warmup = 512, 4000
    assert optim.noam_rate(warmup, d, warmup) == pytest.approx(d**-0.5 * warmup**-0.5)
    assert optim.noam_rate(100, d, warmup) == pytest.approx(d**-0.5 * 100 * warmup**-1.5)
    assert optim.noam_rate(10_000, d, warmup) == pytest.approx(d**-0.5 * 10_000**-0.5)
    rates = [optim.noam_rate(s, d, warmup) for s in range(1, 10_000, 50)]
    peak = int(np.argmax(rates))
    assert abs(peak * 50 + 1 - warmup) <= 50  # rises to the peak at warmup, then decays


def test_clip_grad_norm_matches_torch():
    rng = np.random.default_rng(0)
    grads = {"a": rng.standard_normal((3, 4)), "b": rng.standard_normal(5)}
    tensors = [torch.tensor(g, requires_grad=True) for g in grads.values()]
    for t, g in zip(tensors, grads.values(), strict=True):
        t.grad = torch.from_numpy(g.copy())
    total = optim.clip_grad_norm(grads, 1.0)
    assert total == pytest.approx(torch.nn.utils.clip_grad_norm_(tensors, 1.0).item(), rel=1e-14)
    for t, g in zip(tensors, grads.values(), strict=True):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-14)
    assert np.sqrt(sum(float(np.vdot(g, g)) for g in grads.values())) == pytest.approx(1.0, rel=1e-5)


def test_optimizers_keep_float32():
    model = nt.Transformer(CONFIG, dtype=np.float32)
    for make in (lambda p: optim.SGD(p, lr=0.1, momentum=0.9), lambda p: optim.AdamW(p)):
        opt = make(model.params)
        model.grads = {k: np.ones_like(v) for k, v in model.params.items()}
        opt.step(model.grads)
        assert all(p.dtype == np.float32 for p in model.params.values())
        assert all(a.dtype == np.float32 for s in opt.state.values() for a in s.values())


def test_optimizer_errors():
    params = {"w": np.zeros(3)}
    with pytest.raises(ValueError, match="lr"):
        optim.SGD(params, lr=-1.0)
    with pytest.raises(TypeError, match="params"):
        optim.Adam([np.zeros(3)])
    with pytest.raises(ValueError, match="betas"):
        optim.Adam(params, betas=(1.0, 0.999))
    with pytest.raises(ValueError, match="nesterov"):
        optim.SGD(params, lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="missing entries"):
        optim.Adam(params).step({})
    strided = {"w": np.zeros((4, 6))[:, ::2]}
    with pytest.raises(ValueError, match="C-contiguous"):
        optim.SGD(strided, lr=0.1).step({"w": np.ones((4, 3))})
