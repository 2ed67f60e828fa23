"""Resumable training with torch_transformer: the training checkpoint of numpy_transformer.training (the same
folder format, transformer_spec.training), written from and loaded into torch objects.

    save_training_checkpoint("run/state", model, optimizer, step, schedule, generators={"data": data_rng})
    trainer = load_training_checkpoint("run/state", model, optimizer, schedule, generators={"data": data_rng})

model.safetensors holds the weights (torch_transformer.checkpoint's format), optimizer.safetensors the buffers of
the torch.optim optimizer's state_dict(), trainer.json the step, the LambdaLR schedule's state_dict(), torch's
random states (the CPU generator, and each CUDA device's when CUDA is in use: dropout draws from them) and the
NumPy generators passed (such as the one that shuffles the data), with whatever `extra` the loop adds.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import numpy as np
import torch

from transformer_spec import training

from .checkpoint import load_into, save_checkpoint


def _param_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list:
    """The names of the optimizer's parameters, in the order its state_dict() indexes them."""
    names = {id(p): name for name, p in model.named_parameters()}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    unknown = [i for i, p in enumerate(params) if id(p) not in names]
    if unknown:
        raise ValueError(f"optimizer parameters {unknown[:10]} are not parameters of the model")
    return [names[id(p)] for p in params]


def _rng_bytes(state: torch.Tensor) -> str:
    return state.numpy().tobytes().hex()


def _rng_tensor(text: str, where: str) -> torch.Tensor:
    try:
        return torch.from_numpy(np.frombuffer(bytes.fromhex(text), dtype=np.uint8).copy())
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: not a torch random state ({error})") from None


def save_training_checkpoint(
    directory: str | os.PathLike,
    model,
    optimizer: torch.optim.Optimizer,
    step: int,
    schedule=None,
    generators: dict[str, np.random.Generator] | None = None,
    extra: dict | None = None,
    metadata: dict | None = None,
) -> Path:
    """Write the training state to the folder `directory` (replaced whole, atomically). extra: JSON-serialisable
    state of the training loop; metadata: model.safetensors' extra metadata (as save_checkpoint's)."""
    names = _param_names(model, optimizer)
    state = optimizer.state_dict()
    arrays = {
        "state": {
            i: {k: v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v) for k, v in s.items()}
            for i, s in state["state"].items()
        },
        "param_groups": state["param_groups"],
    }
    rng: dict = {"torch": _rng_bytes(torch.get_rng_state())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["torch_cuda"] = [_rng_bytes(s) for s in torch.cuda.get_rng_state_all()]
    rng.update({name: training.generator_state(g) for name, g in (generators or {}).items()})
    trainer = {
        "step": int(step),
        "schedule": None if schedule is None else schedule.state_dict(),
        "rng": rng,
        **(extra or {}),
    }
    return training.write(directory, lambda path: save_checkpoint(path, model, metadata), arrays, names, trainer)


def load_training_checkpoint(
    directory: str | os.PathLike,
    model,
    optimizer: torch.optim.Optimizer,
    schedule=None,
    generators: dict[str, np.random.Generator] | None = None,
) -> dict:
    """Load a training checkpoint into `model`, `optimizer` (built on the model's parameters), `schedule`, torch's
    random states and the NumPy `generators` saved under the same names. Returns trainer.json's content. A torn
    or foreign checkpoint raises ValueError before anything is loaded."""
    where = training.locate(directory)
    shapes = {name: tuple(p.shape) for name, p in zip(_param_names(model, optimizer), _params(optimizer), strict=True)}
    model_path, state, trainer = training.read(where, model, shapes)
    rng = trainer.get("rng", {})
    missing = [name for name in ["torch", *(generators or {})] if name not in rng]
    if missing:
        raise ValueError(f"{where}: trainer.json has no state for the random generators {missing}")
    if (schedule is None) != (trainer.get("schedule") is None):
        raise ValueError(f"{where}: saved {'with' if trainer.get('schedule') else 'without'} a schedule; pass the same")
    cpu_state = _rng_tensor(rng["torch"], f"{where}: rng 'torch'")
    previous = copy.deepcopy(optimizer.state_dict())  # state_dict() holds the live tensors
    optimizer.load_state_dict(  # checks the groups before it changes anything
        {
            "state": {i: {k: torch.from_numpy(np.array(v)) for k, v in s.items()} for i, s in state["state"].items()},
            "param_groups": state["param_groups"],
        }
    )
    try:
        load_into(model, model_path)  # checks the file against the model before it writes a parameter
    except BaseException:
        optimizer.load_state_dict(previous)
        raise
    if schedule is not None:
        schedule.load_state_dict(trainer["schedule"])
    torch.set_rng_state(cpu_state)
    if "torch_cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_rng_tensor(s, f"{where}: rng 'torch_cuda'") for s in rng["torch_cuda"]])
    for name, generator in (generators or {}).items():
        training.set_generator_state(generator, rng[name], f"{where}: rng {name!r}")
    return trainer


def _params(optimizer: torch.optim.Optimizer) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]
