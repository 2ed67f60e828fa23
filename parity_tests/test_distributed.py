"""Data parallelism through torch.distributed: DistributedDataParallel, launched by torchrun, gloo on the CPU.

Two processes, each on its half of a batch, end a step with the gradients of one process on the whole batch
and of the NumPy reference (float64, within 1e-12), because the loss of each half is its share of the whole
batch's mean over non-ignored targets (torch_transformer.distributed.cross_entropy_share); gradient
accumulation under DDP's no_sync gives the same; and examples/train_numbers.py under torchrun takes the same
steps (the same losses) as in one process, with rank 0 alone writing.

The worker half of this file runs under torchrun: `python -m torch.distributed.run --standalone
--nproc-per-node 2 -m parity_tests.test_distributed OUT_DIR` (every test here launches it itself).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from numpy_transformer import TransformerConfig

ROOT = Path(__file__).resolve().parents[1]
BAR = 1e-12  # float64: DDP's average of two halves against one process and against NumPy
CONFIG = TransformerConfig(
    src_vocab_size=13,
    tgt_vocab_size=17,
    d_model=16,
    n_heads=4,
    d_ff=24,
    n_encoder_layers=1,
    n_decoder_layers=2,
    max_len=12,
    norm_first=True,
)
LABEL_SMOOTHING = 0.1


def batch():
    """src (4, 6), tgt_in (4, 5), tgt_out (4, 5) and the random upstream gradient R (4, 5, V) of the
    objective J = mean cross-entropy + sum(logits * R). Padding is uneven: rows 2 and 3 (the second
    process's half) hold more ignored targets than rows 0 and 1."""
    from parity_tests.components import make_batch

    rng = np.random.default_rng(7)
    src, tgt_in, tgt_out = make_batch(CONFIG, rng, batch=4, src_len=6, tgt_len=5, scenario="padding")
    tgt_in[2, 2:], tgt_out[2, 1:] = CONFIG.pad_id, CONFIG.pad_id
    R = rng.standard_normal((4, 5, CONFIG.tgt_vocab_size)) / 5
    return src, tgt_in, tgt_out, R


def numpy_reference():
    """The NumPy model (float64) on the whole batch: its state dict, loss and every gradient."""
    import numpy_transformer as nt

    src, tgt_in, tgt_out, R = batch()
    model = nt.Transformer(CONFIG, seed=0)
    logits = model.forward(src, tgt_in)
    loss, cache = nt.cross_entropy_forward(logits, tgt_out, CONFIG.pad_id, LABEL_SMOOTHING)
    model.zero_grad()
    model.backward(nt.cross_entropy_backward(cache) + R)
    return model.state_dict(), float(loss), dict(model.grads)


def torch_model(state):
    import torch_transformer as tt

    model = tt.Transformer(CONFIG).double()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    return model


# ----------------------------------------------------------------------------------------------
# The worker: runs under torchrun, one process per rank, and saves what it ends the step with.


def worker(out_dir: Path) -> None:
    """Three steps of DDP on this rank's rows (a fresh model each), saved as grads_{kind}_{rank}.npz:
    "share": the objective's share, W * (local cross-entropy sum / all targets + sum(logits * R));
    "no_sync": the same, the rows as two micro-batches, the first one's backward under no_sync;
    "own_mean": each rank's own mean cross-entropy (what the share replaces), to show it differs."""
    from torch_transformer import distributed

    ctx = distributed.init("cpu")
    state, _, _ = numpy_reference()
    src, tgt_in, tgt_out, R = (torch.from_numpy(a) for a in batch())
    rows = distributed.shard(len(src), ctx)
    W = ctx.world_size
    losses = {}

    def objective(model, part: slice, n_targets) -> torch.Tensor:
        logits = model(src[part], tgt_in[part])
        if n_targets is None:  # each rank's own mean: the naive average
            ce = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1),
                tgt_out[part].flatten(),
                ignore_index=CONFIG.pad_id,
                label_smoothing=LABEL_SMOOTHING,
            )
        else:
            ce = distributed.cross_entropy_share(logits, tgt_out[part], n_targets, CONFIG.pad_id, LABEL_SMOOTHING)
        losses.setdefault("ce", 0.0)
        losses["ce"] = losses["ce"] + ce.detach()
        return ce + W * (logits * R[part]).sum()

    for kind in ("share", "no_sync", "own_mean"):
        model = distributed.wrap(torch_model(state), ctx)
        losses.clear()
        n_targets = None if kind == "own_mean" else distributed.count_targets(tgt_out[rows], CONFIG.pad_id)
        if kind == "no_sync":
            first, second = slice(rows.start, rows.start + 1), slice(rows.start + 1, rows.stop)
            with model.no_sync():  # gradients add up locally, no all-reduce
                objective(model, first, n_targets).backward()
            objective(model, second, n_targets).backward()  # the all-reduce of the accumulated sum
        else:
            objective(model, rows, n_targets).backward()
        grads = {name: p.grad.numpy() for name, p in distributed.unwrap(model).named_parameters()}
        loss = distributed.global_loss(losses["ce"]).item()
        np.savez(out_dir / f"grads_{kind}_{ctx.rank}.npz", **grads)
        (out_dir / f"loss_{kind}_{ctx.rank}.json").write_text(json.dumps(loss))
    del model  # DDP's reducer must go before its process group (distributed.shutdown)
    distributed.shutdown()


# ----------------------------------------------------------------------------------------------
# The tests.


def torchrun(args: list[str], nproc: int = 2, timeout: float = 120) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


def worst_error(ours: dict, reference: dict) -> float:
    """The measure of docs/conventions.md over every gradient: max |a - b| / max(max |b|, 1e-3 * largest |b| of all)."""
    from parity_tests.components import relative_errors

    pairs = {name: (ours[name], reference[name]) for name in reference}
    return max(err for _, err in relative_errors(pairs, np.float64).values())


def test_two_processes_on_halves_give_the_whole_batch_gradient(tmp_path):
    torchrun(["-m", "parity_tests.test_distributed", str(tmp_path)])
    state, np_loss, np_grads = numpy_reference()
    assert all(np.any(g) for g in np_grads.values())

    # One process, the whole batch, the same objective.
    src, tgt_in, tgt_out, R = (torch.from_numpy(a) for a in batch())
    model = torch_model(state)
    logits = model(src, tgt_in)
    ce = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), tgt_out.flatten(), ignore_index=CONFIG.pad_id, label_smoothing=LABEL_SMOOTHING
    )
    (ce + (logits * R).sum()).backward()
    one = {name: p.grad.numpy() for name, p in model.named_parameters()}
    assert worst_error(one, np_grads) <= BAR
    errors = {}
    for kind in ("share", "no_sync", "own_mean"):
        ranks = [dict(np.load(tmp_path / f"grads_{kind}_{rank}.npz")) for rank in (0, 1)]
        for name in one:  # DDP leaves the same average on both ranks
            np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=name)
        errors[kind] = (worst_error(ranks[0], one), worst_error(ranks[0], np_grads))
        loss = json.loads((tmp_path / f"loss_{kind}_0.json").read_text())
        if kind != "own_mean":
            assert abs(loss - np_loss) <= BAR * abs(np_loss), (kind, loss, np_loss)
    print(f"DDP (2 gloo processes) gradient error, against one process / against NumPy: {errors}")
    assert errors["share"][0] <= BAR and errors["share"][1] <= BAR
    assert errors["no_sync"][0] <= BAR and errors["no_sync"][1] <= BAR
    # Averaging each rank's own mean weighs the targets of the more padded half more: a real difference.
    assert errors["own_mean"][0] > 1e-4


def train_numbers_args(out: Path, *extra: str) -> list[str]:
    """A small float32 run without dropout (so one process and two draw no random numbers to differ in)."""
    return [
        "--backend=torch",
        f"--out={out}",
        "--max-steps=8",
        "--n-train=256",
        "--n-val=8",
        "--n-test=8",
        "--d-model=32",
        "--d-ff=64",
        "--layers=1",
        "--batch-size=16",
        "--warmup=4",
        "--eval-every=4",
        "--dropout=0",
        "--minutes=5",
        *extra,
    ]


@pytest.mark.slow  # 26 s; DDP's gradients stay in the default run (test_two_processes_on_halves_...)
def test_train_numbers_under_torchrun_takes_the_steps_of_one_process(tmp_path):
    """Two processes (and two processes with two micro-batches each) train with the losses of one process,
    to float32 rounding; only rank 0 prints and writes."""
    from examples import train_numbers

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = train_numbers.main(train_numbers_args(tmp_path / "one"))["history"]
    finally:
        torch.set_num_threads(threads)
    for name, extra in (("two", ()), ("two_accumulating", ("--accumulate=2",))):
        out = tmp_path / name
        printed = torchrun(["examples/train_numbers.py", *train_numbers_args(out, *extra)]).stdout
        assert printed.count("wrote ") == 1 and printed.count("numbers to words") == 1, printed
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["world_size"] == 2 and metrics["steps"] == 8
        assert len(metrics["history"]["val_exact_match"]) == 2  # evaluated by rank 0 alone, at steps 4 and 8
        np.testing.assert_allclose(metrics["history"]["loss"], one["loss"], rtol=1e-5, err_msg=name)
        assert sorted(p.name for p in out.iterdir() if not p.name.startswith("attention_")) == [
            "checkpoint.safetensors",
            "loss_curve.png",
            "metrics.json",
        ]


@pytest.mark.slow
def test_compiled_train_numbers_under_torchrun_takes_the_steps_of_one_process(tmp_path):
    """torch.compile (inductor) inside DDP, with accumulation: the losses of one eager process, to float32
    rounding (measured 2.3e-7 relative). A minute or more: the two processes compile forward and backward."""
    from examples import train_numbers

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = train_numbers.main(train_numbers_args(tmp_path / "one"))["history"]
    finally:
        torch.set_num_threads(threads)
    out = tmp_path / "compiled"
    torchrun(["examples/train_numbers.py", *train_numbers_args(out, "--compile", "--accumulate=2")], timeout=600)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["compiled"] and metrics["world_size"] == 2
    np.testing.assert_allclose(metrics["history"]["loss"], one["loss"], rtol=1e-5)


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
