"""Resumable training on both sides: optimizers' state_dict() as torch.optim spells it, the training checkpoint
folder (numpy_transformer.training, torch_transformer.training, transformer_spec.training), and
examples/train_numbers.py --resume.

A run stopped and resumed must equal the run never stopped bit for bit (np.array_equal on every loss and every
weight), with dropout on and a shuffled data stream, so that a random state or a data position restored wrongly
shows. Torn and foreign checkpoints are refused with ValueError, the model, the optimizer and the previous
checkpoint untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from copy import deepcopy
from pathlib import Path

import numpy as np
import pytest
import torch

import numpy_transformer as nt
from examples import tasks, train_numbers
from numpy_transformer import optim
from numpy_transformer.training import load_training_checkpoint, save_training_checkpoint
from transformer_spec import training

ROOT = Path(__file__).resolve().parent.parent

# name -> (NumPy optimizer, torch optimizer), each given its parameters
OPTIMIZERS = {
    "adamw": (
        lambda p: optim.AdamW(p, lr=3e-3, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.05),
        lambda p: torch.optim.AdamW(p, lr=3e-3, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.05),
    ),
    "adam": (
        lambda p: optim.Adam(p, lr=3e-3, weight_decay=1e-3),
        lambda p: torch.optim.Adam(p, lr=3e-3, weight_decay=1e-3),
    ),
    "sgd": (
        lambda p: optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-3),
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-3),
    ),
}
SHAPES = {"w": (4, 5), "b": (5,), "e": (3, 2, 2)}


def random_params(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s) for k, s in SHAPES.items()}


def random_grads(rng: np.random.Generator) -> dict:
    return {k: rng.standard_normal(s) for k, s in SHAPES.items()}


def copy(params: dict) -> dict:
    return {k: v.copy() for k, v in params.items()}


# ----------------------------------------------------------------------------------------------
# Optimizers' state dicts


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_numpy_optimizer_state_dict_round_trip(name):
    """k steps, state_dict(), a fresh optimizer on copies of the weights loads it: the next steps are the same bits."""
    make = OPTIMIZERS[name][0]
    params, rng = random_params(0), np.random.default_rng(1)
    opt = make(params)
    for _ in range(3):
        opt.step(random_grads(rng))
    state = opt.state_dict()
    assert list(state["state"]) == [0, 1, 2] and state["param_groups"][0]["params"] == [0, 1, 2]
    if name != "sgd":
        assert set(state["state"][0]) == {"step", "exp_avg", "exp_avg_sq"} and float(state["state"][0]["step"]) == 3
    resumed_params = copy(params)
    resumed = make(resumed_params)
    resumed.lr = 99.0  # the loaded group's settings win
    resumed.load_state_dict(state)
    assert resumed.lr == opt.lr
    for _ in range(2):
        grads = random_grads(rng)
        opt.step(grads)
        resumed.step(copy(grads))
    for k in params:
        assert np.array_equal(params[k], resumed_params[k]), k
        assert not np.array_equal(params[k], random_params(0)[k]), f"{k} never moved"
    state["state"][0][next(iter(state["state"][0]))][...] = 0.0  # state_dict() holds copies
    assert all(np.any(v != 0) for v in opt.state["w"].values())


def to_torch_state(state: dict) -> dict:
    return {
        "state": {i: {k: torch.from_numpy(np.array(v)) for k, v in s.items()} for i, s in state["state"].items()},
        "param_groups": state["param_groups"],
    }


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_torch_optimizer_state_into_numpy_and_back(name):
    """torch's state loads into the NumPy optimizer, whose next step matches torch's (float64, the parity bar 1e-10:
    the two implementations round differently, torch's lerp and fused kernels against NumPy's separate operations);
    the NumPy optimizer's state_dict() loads back into torch and gives torch's next step bit for bit."""
    np_make, torch_make = OPTIMIZERS[name]
    rng = np.random.default_rng(2)
    start = random_params(3)
    tensors = [torch.nn.Parameter(torch.from_numpy(v.copy())) for v in start.values()]
    torch_opt = torch_make(tensors)
    for _ in range(4):
        for t, g in zip(tensors, random_grads(rng).values(), strict=True):
            t.grad = torch.from_numpy(g)
        torch_opt.step()
    before = {k: t.detach().numpy().copy() for k, t in zip(SHAPES, tensors, strict=True)}
    saved = deepcopy(torch_opt.state_dict())  # state_dict() holds the live tensors, which step() updates

    np_params = copy(before)
    np_opt = np_make(np_params)
    np_opt.load_state_dict(saved)  # torch's tensors, read as arrays
    grads = random_grads(rng)
    np_opt.step(copy(grads))
    for t, g in zip(tensors, grads.values(), strict=True):
        t.grad = torch.from_numpy(g.copy())
    torch_opt.step()  # torch's next step from its own state
    for k, t in zip(SHAPES, tensors, strict=True):
        theirs = t.detach().numpy()
        assert not np.array_equal(theirs, before[k])
        error = np.max(np.abs(np_params[k] - theirs)) / max(np.max(np.abs(theirs)), 1e-3)
        assert error <= 1e-10, f"{k}: the NumPy step from torch's state differs by {error:.2e}"

    # back: torch's state -> NumPy -> torch is lossless, so a torch optimizer loading it steps exactly as torch did
    round_trip = make_numpy_from(np_make, before, saved).state_dict()
    again = [torch.nn.Parameter(torch.from_numpy(v.copy())) for v in before.values()]
    torch_again = torch_make(again)
    torch_again.load_state_dict(to_torch_state(round_trip))
    for i, buffers in saved["state"].items():
        for key, value in buffers.items():
            assert torch.equal(torch_again.state_dict()["state"][i][key], value), (i, key)
    for t, g in zip(again, grads.values(), strict=True):
        t.grad = torch.from_numpy(g.copy())
    torch_again.step()
    for t, u in zip(again, tensors, strict=True):
        assert torch.equal(t, u)


def make_numpy_from(make, params: dict, state: dict):
    opt = make(copy(params))
    opt.load_state_dict(state)
    return opt


def test_optimizer_state_refused_with_what_is_wrong():
    params = random_params(0)
    adam, sgd = OPTIMIZERS["adam"][0](copy(params)), OPTIMIZERS["sgd"][0](copy(params))
    adam.step(random_grads(np.random.default_rng(0)))
    state = adam.state_dict()
    group = state["param_groups"][0]
    with pytest.raises(ValueError, match="state_dict is Adam's .*this optimizer is AdamW"):
        optim.AdamW(copy(params)).load_state_dict(state)
    with pytest.raises(ValueError, match="holds 2 parameters, this optimizer 3"):
        optim.Adam(copy(params)).load_state_dict({**state, "param_groups": [{**group, "params": [0, 1]}]})
    with pytest.raises(ValueError, match="amsgrad"):
        optim.Adam(copy(params)).load_state_dict({**state, "param_groups": [{**group, "amsgrad": True}]})
    with pytest.raises(ValueError, match="momentum"):
        optim.SGD(copy(params), lr=0.1).load_state_dict(sgd.state_dict())
    misshaped = {**state, "state": {**state["state"], 1: {**state["state"][1], "exp_avg": np.zeros(7)}}}
    fresh = optim.Adam(copy(params))
    with pytest.raises(ValueError, match=r"parameter 1 \('b'\): exp_avg is float64 \(7,\), expected floating \(5,\)"):
        fresh.load_state_dict(misshaped)
    assert fresh.step_count == 0 and not any(fresh.state.values())  # nothing loaded
    steps = {**state, "state": {**state["state"], 2: {**state["state"][2], "step": np.float32(7.0)}}}
    with pytest.raises(ValueError, match="different steps"):
        fresh.load_state_dict(steps)


# ----------------------------------------------------------------------------------------------
# train_numbers' loop in this process: stopped, checkpointed, resumed with fresh objects


def run_steps(backend_name: str, out: Path, max_steps: int, resume: Path | None = None):
    """train_numbers' training loop, in this process: (losses, final weights as arrays)."""
    flags = ["--quick", "--backend", backend_name, "--out", str(out), "--max-steps", str(max_steps)]
    flags += ["--save-every", "5", "--minutes", "10", "--eval-every", "1000"]
    args = train_numbers.parse_args(flags + (["--resume", str(resume)] if resume else []))
    splits = tasks.make_numbers_dataset(args.n_train, args.n_val, args.n_test, max_value=args.max_value, seed=args.seed)
    data = train_numbers.EncoderDecoderData(splits)
    config = data.config(args)
    assert config.dropout > 0  # dropout on: the random state must come back
    backend = (train_numbers.NumpyBackend if backend_name == "numpy" else train_numbers.TorchBackend)(config, args)
    lines: list = []
    steps, _, history, _ = train_numbers.train_steps(args, None, backend, data, splits, lines.append)
    assert steps == max_steps
    weights = backend.model.state_dict()
    return (
        history["loss"],
        {k: v.detach().numpy().copy() if isinstance(v, torch.Tensor) else v for k, v in weights.items()},
        lines,
    )


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_resumed_training_equals_the_uninterrupted_run(backend, tmp_path):
    """12 steps straight; 8 steps, then fresh objects resume from the checkpoint and take 4 more: every loss and
    every weight the same bits. 400 numbers in batches of 64: the stop falls inside the second epoch."""
    losses, weights, _ = run_steps(backend, tmp_path / "straight", 12)
    first, _, _ = run_steps(backend, tmp_path / "stopped", 8)
    trainer = json.loads((tmp_path / "stopped" / "training_state" / "trainer.json").read_text())
    assert trainer["step"] == 8 and trainer["data"] == {"epoch": 1, "batches": 1}
    resumed, resumed_weights, lines = run_steps(backend, tmp_path / "stopped", 12, resume=tmp_path / "stopped")
    assert lines[0].startswith("resumed from step 8")
    assert first == losses[:8] and resumed == losses, "the resumed run's losses differ"
    assert weights.keys() == resumed_weights.keys()
    for k in weights:
        assert np.array_equal(weights[k], resumed_weights[k]), f"{k} differs after resuming"


# ----------------------------------------------------------------------------------------------
# Torn and foreign checkpoints

CONFIG = nt.TransformerConfig(
    src_vocab_size=11, tgt_vocab_size=13, d_model=8, n_heads=2, d_ff=16, n_encoder_layers=1, n_decoder_layers=1,
    dropout=0.1, max_len=10,
)  # fmt: skip


def trained(seed: int, config=CONFIG):
    model = nt.Transformer(config, seed=seed)
    opt = optim.AdamW(model.params, lr=1e-2)
    schedule = optim.NoamLR(opt, config.d_model, warmup=4)
    rng = np.random.default_rng(seed)
    model.zero_grad()
    model.grads = {k: rng.standard_normal(v.shape) for k, v in model.params.items()}
    opt.step(model.grads)
    schedule.step()
    return model, opt, schedule


def folder_bytes(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def tear(folder: Path, how: str) -> None:
    if how == "missing file":
        (folder / "optimizer.safetensors").unlink()
    elif how == "bad json":
        text = (folder / "trainer.json").read_text()
        (folder / "trainer.json").write_text(text[: len(text) // 2])
    elif how == "version":
        trainer = json.loads((folder / "trainer.json").read_text())
        (folder / "trainer.json").write_text(json.dumps({**trainer, "version": 99}))
    elif how == "truncated arrays":
        data = (folder / "optimizer.safetensors").read_bytes()
        (folder / "optimizer.safetensors").write_bytes(data[: len(data) - 100])
    elif how == "foreign model":
        other, other_opt, _ = trained(5, _wider())
        save_training_checkpoint(folder.parent / "other", other, other_opt, 1)
        shutil.copy(folder.parent / "other" / "model.safetensors", folder / "model.safetensors")
    elif how == "optimizer settings":
        trainer = json.loads((folder / "trainer.json").read_text())
        trainer["param_groups"][0]["amsgrad"] = True
        (folder / "trainer.json").write_text(json.dumps(trainer))
    elif how == "mis-shaped weights":  # the config fits, a tensor does not: found once the optimizer is loaded
        from safetensors import safe_open
        from safetensors.numpy import save_file

        with safe_open(folder / "model.safetensors", "numpy") as f:
            tensors, metadata = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
        tensors[sorted(k for k in tensors if k.endswith(".bias"))[0]] = np.ones(99)
        save_file(tensors, folder / "model.safetensors", metadata=metadata)
    elif how == "foreign optimizer":
        other, other_opt, _ = trained(5, _wider())
        save_training_checkpoint(folder.parent / "other", other, other_opt, 1)
        for name in ("optimizer.safetensors", "trainer.json"):
            shutil.copy(folder.parent / "other" / name, folder / name)


def _wider():
    from dataclasses import replace

    return replace(CONFIG, d_ff=24)


TORN = {
    "missing file": "optimizer.safetensors missing",
    "bad json": "unreadable JSON",
    "version": "format version 99",
    "truncated arrays": "not a readable safetensors file",
    "foreign model": "config differs from the model's: d_ff",
    "foreign optimizer": r"optimizer.safetensors: does not fit the parameters|shape \(24,\)",
    "optimizer settings": "amsgrad=True",
    "mis-shaped weights": r"mis-shaped tensors .*bias: got \(99,\)",
}


@pytest.mark.parametrize("how", list(TORN))
def test_torn_or_foreign_checkpoint_refused(how, tmp_path):
    """Each refused with ValueError naming what is wrong; the model, optimizer and schedule keep their state."""
    model, opt, schedule = trained(0)
    folder = tmp_path / "state"
    save_training_checkpoint(folder, model, opt, 1, schedule)
    tear(folder, how)
    target, target_opt, target_schedule = trained(1)
    weights, state = target.state_dict(), target_opt.state_dict()
    rng_state = target.rng.bit_generator.state
    with pytest.raises(ValueError, match=TORN[how]):
        load_training_checkpoint(folder, target, target_opt, target_schedule)
    assert all(np.array_equal(weights[k], target.params[k]) for k in weights)
    assert all(np.array_equal(v, target_opt.state_dict()["state"][i]["exp_avg"]) for i, v in
               ((i, s["exp_avg"]) for i, s in state["state"].items()))  # fmt: skip
    assert target.rng.bit_generator.state == rng_state and target_schedule.last_step == 1


def test_failed_save_leaves_the_previous_checkpoint(tmp_path):
    model, opt, schedule = trained(0)
    folder = tmp_path / "state"
    save_training_checkpoint(folder, model, opt, 1, schedule)
    before = folder_bytes(folder)
    with pytest.raises(TypeError, match="not JSON serializable"):
        save_training_checkpoint(folder, model, opt, 2, schedule, extra={"bad": object()})
    opt.step({k: np.ones_like(v) for k, v in model.params.items()})

    def broken(path):
        Path(path).write_bytes(b"half a file")
        raise OSError("disk full")

    from unittest import mock

    with mock.patch("numpy_transformer.training.save_checkpoint", side_effect=lambda p, *a: broken(p)):
        with pytest.raises(OSError, match="disk full"):
            save_training_checkpoint(folder, model, opt, 2, schedule)
    assert folder_bytes(folder) == before and sorted(p.name for p in tmp_path.iterdir()) == ["state"]
    # killed between the two renames: the previous checkpoint waits beside it as .state.old, and is read
    os.rename(folder, tmp_path / ".state.old")
    target, target_opt, target_schedule = trained(1)
    assert load_training_checkpoint(folder, target, target_opt, target_schedule)["step"] == 1
    with pytest.raises(FileNotFoundError, match="no training checkpoint"):
        load_training_checkpoint(tmp_path / "nothing", target, target_opt)


def test_torch_training_checkpoint_refuses_a_foreign_one(tmp_path):
    import torch_transformer as tt
    from torch_transformer.training import load_training_checkpoint as torch_load
    from torch_transformer.training import save_training_checkpoint as torch_save

    def build(config):
        model = tt.Transformer(config).double()
        opt = torch.optim.AdamW(model.parameters())
        return model, opt

    model, opt = build(CONFIG)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    torch_save(tmp_path / "state", model, opt, 1)
    other, other_opt = build(_wider())
    with pytest.raises(ValueError, match="does not fit|differ"):
        torch_load(tmp_path / "state", other, other_opt)
    assert not other_opt.state  # nothing loaded
    again, again_opt = build(CONFIG)
    assert torch_load(tmp_path / "state", again, again_opt)["step"] == 1
    assert torch.equal(again_opt.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    assert training.FORMAT == json.loads((tmp_path / "state" / "trainer.json").read_text())["format"]


# ----------------------------------------------------------------------------------------------
# train_numbers.py killed in another process and resumed: every kill point, both sides

# Runs train_numbers.main(argv) with a deterministic kill: SIGTERM after a given step (between saves), SIGKILL
# inside the n-th save once its files are written (before they are renamed into place), or SIGKILL between the
# n-th save's two renames (the previous checkpoint moved aside, the new one not yet in place).
KILLER = """
import os, signal, sys
from transformer_spec import training
from examples import train_numbers
how, at, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
count = {"steps": 0, "saves": 0}
if how == "sigterm-after-step":
    for cls in (train_numbers.NumpyBackend, train_numbers.TorchBackend):
        def step(self, *a, _step=cls.train_step):
            loss = _step(self, *a)
            count["steps"] += 1
            if count["steps"] == at:
                os.kill(os.getpid(), signal.SIGTERM)
            return loss
        cls.train_step = step
else:
    write = training.write
    def counted(*a, **k):
        count["saves"] += 1
        return write(*a, **k)
    training.write = counted
    if how == "sigkill-in-save":
        fsync = training._fsync
        def killing_fsync(path):
            if count["saves"] == at:
                os.kill(os.getpid(), signal.SIGKILL)
            fsync(path)
        training._fsync = killing_fsync
    else:
        rename = os.rename
        def killing_rename(src, dst):
            if count["saves"] == at and ".tmp-" in str(src):
                os.kill(os.getpid(), signal.SIGKILL)
            rename(src, dst)
        os.rename = killing_rename
train_numbers.main(argv)
"""
KILLS = {  # kill point -> (how, at, the signal, the step of the checkpoint left)
    "SIGTERM at step 13, between saves": ("sigterm-after-step", 13, signal.SIGTERM, 10),
    "SIGKILL inside the save of step 15": ("sigkill-in-save", 3, signal.SIGKILL, 10),
    "SIGKILL between the renames of step 15's save": ("sigkill-between-renames", 3, signal.SIGKILL, 10),
}


def run_script(args: list, kill: tuple | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    command = (
        [sys.executable, "-c", KILLER, kill[0], str(kill[1])]
        if kill
        else [sys.executable, "-m", "examples.train_numbers"]
    )
    return subprocess.run(command + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def final_run(out: Path) -> tuple[list, dict]:
    from safetensors.numpy import load_file

    return json.loads((out / "metrics.json").read_text())["history"]["loss"], load_file(out / "checkpoint.safetensors")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_train_numbers_killed_and_resumed(backend, tmp_path):
    """Each kill point: the process dies; `--resume` picks up the last complete checkpoint (step 10) and the run
    ends with the uninterrupted run's losses and weights, bit for bit."""
    flags = ["--quick", "--backend", backend, "--max-steps", "20", "--save-every", "5", "--minutes", "10"]
    straight = run_script(flags + ["--out", str(tmp_path / "straight")])
    assert straight.returncode == 0, straight.stderr
    losses, weights = final_run(tmp_path / "straight")
    table = []
    for i, (point, (how, at, sig, left)) in enumerate(KILLS.items()):
        out = tmp_path / f"killed{i}"
        killed = run_script(flags + ["--out", str(out)], kill=(how, at))
        assert killed.returncode == -sig, (point, killed.returncode, killed.stderr[-2000:])
        assert not (out / "metrics.json").exists()
        left_behind = sorted(p.name.split("-")[0] for p in out.glob(".training_state*"))
        assert (
            left_behind
            == {  # where the kill landed: what the folder shows
                "sigterm-after-step": [],
                "sigkill-in-save": [".training_state.tmp"],
                "sigkill-between-renames": [".training_state.old", ".training_state.tmp"],
            }[how]
        ), (point, left_behind)
        previous = training.locate(out / "training_state")
        assert json.loads((previous / "trainer.json").read_text())["step"] == left
        resumed = run_script(flags + ["--out", str(out), "--resume", str(out)])
        assert resumed.returncode == 0, (point, resumed.stderr[-3000:])
        assert f"resumed from step {left} " in resumed.stdout, resumed.stdout
        got_losses, got_weights = final_run(out)
        same_losses = got_losses == losses
        same_weights = got_weights.keys() == weights.keys() and all(
            np.array_equal(got_weights[k], weights[k]) for k in weights
        )
        table.append((point, backend, same_losses, same_weights))
        assert sorted(p.name for p in out.glob(".training_state*")) == []  # the next save cleared what the kill left
    print(
        "\n".join(
            f"| {p} | {b} | {'identical' if l else 'DIFFERENT'} | {'identical' if w else 'DIFFERENT'} |"
            for p, b, l, w in table
        )
    )
    assert all(l and w for _, _, l, w in table), table


def test_resume_refuses_other_settings(tmp_path):
    run_steps("numpy", tmp_path, 3)
    flags = ["--quick", "--out", str(tmp_path), "--max-steps", "6", "--save-every", "5", "--resume", str(tmp_path)]
    with pytest.raises(ValueError, match="--batch-size 64 there, 32 here"):
        train_numbers.main(flags + ["--batch-size", "32"])
