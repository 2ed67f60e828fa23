"""Resumable training: save and load a training checkpoint (transformer_spec.training's folder format).

    save_training_checkpoint("run/state", model, opt, step, schedule, generators={"data": data_rng})
    trainer = load_training_checkpoint("run/state", model, opt, schedule, generators={"data": data_rng})

The folder holds the weights (model.safetensors, numpy_transformer.checkpoint's format, so it also loads as a
model), the optimizer's buffers (optimizer.safetensors, spelled as torch.optim spells them) and trainer.json:
the step, the schedule's position, the random generators' states (the model's dropout generator `model.rng` and
the `generators` passed, such as the one that shuffles the data) and whatever `extra` the training loop adds
(its data position, its history). Loading all of it back and running on gives the same steps, bit for bit, as
a run never stopped. A torn or foreign folder raises ValueError before the model or optimizer is touched.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from transformer_spec import training

from .checkpoint import Model, load_into, save_checkpoint
from .optim import LambdaLR, Optimizer


def save_training_checkpoint(
    directory: str | os.PathLike,
    model: Model,
    optimizer: Optimizer,
    step: int,
    schedule: LambdaLR | None = None,
    generators: dict[str, np.random.Generator] | None = None,
    extra: dict | None = None,
    metadata: dict | None = None,
) -> Path:
    """Write the training state to the folder `directory` (replaced whole, atomically). extra: JSON-serialisable
    state of the training loop; metadata: model.safetensors' extra metadata (as save_checkpoint's)."""
    generators = {"dropout": model.rng, **(generators or {})}
    trainer = {
        "step": int(step),
        "schedule": None if schedule is None else schedule.state_dict(),
        "rng": {name: training.generator_state(g) for name, g in generators.items()},
        **(extra or {}),
    }
    return training.write(
        directory,
        lambda path: save_checkpoint(path, model, metadata),
        optimizer.state_dict(),
        list(optimizer.params),
        trainer,
    )


def load_training_checkpoint(
    directory: str | os.PathLike,
    model: Model,
    optimizer: Optimizer,
    schedule: LambdaLR | None = None,
    generators: dict[str, np.random.Generator] | None = None,
) -> dict:
    """Load a training checkpoint into `model` (its params, and model.rng), `optimizer` (built on model.params),
    `schedule` and the `generators` saved under the same names. Returns trainer.json's content (step, extra).
    Everything is checked first: a torn or foreign checkpoint raises ValueError and changes nothing."""
    where = training.locate(directory)
    shapes = {name: p.shape for name, p in optimizer.params.items()}
    model_path, state, trainer = training.read(where, model, shapes)
    generators = {"dropout": model.rng, **(generators or {})}
    missing = [name for name in generators if name not in trainer.get("rng", {})]
    if missing:
        raise ValueError(f"{where}: trainer.json has no state for the random generators {missing}")
    if (schedule is None) != (trainer.get("schedule") is None):
        raise ValueError(f"{where}: saved {'with' if trainer.get('schedule') else 'without'} a schedule; pass the same")
    previous = optimizer.state_dict()
    optimizer.load_state_dict(state)  # checks everything before it changes anything
    try:
        load_into(model, model_path)  # likewise
    except BaseException:
        optimizer.load_state_dict(previous)
        raise
    if schedule is not None:
        schedule.load_state_dict(trainer["schedule"])
    for name, generator in generators.items():
        training.set_generator_state(generator, trainer["rng"][name], f"{where}: rng {name!r}")
    return trainer
