"""Training checkpoints, shared by both sides: the folder format, written atomically and checked before use.

A training checkpoint is a folder of three files:

- `model.safetensors`: the weights, in the project's checkpoint format (the config in its metadata), written
  by the side's `checkpoint.save_checkpoint`;
- `optimizer.safetensors`: the optimizer's buffers, one tensor `state.{index}.{name}` per parameter and buffer,
  spelled as torch.optim's state_dict() spells them ("step", "exp_avg", "exp_avg_sq"; "momentum_buffer");
- `trainer.json`: everything else: the format and its version, the parameters' names in the optimizer's order,
  the optimizer's param_groups, and what the training loop hands over (the step, the schedule's position, the
  random generators' states, the data position).

`write` fills a new folder beside the target (`.NAME.tmp-*`), flushes every file to disk, then renames it into
place: the previous checkpoint is moved to `.NAME.old` first and removed only once the new one stands, so a
process killed at any moment leaves a complete checkpoint (`read` falls back to `.NAME.old` when it is killed
between the two renames). `read` checks the whole folder, and that it fits the model and optimizer it is to be
loaded into, before either side touches a parameter: a torn folder (a file missing, unreadable JSON, another
format version, buffers that do not match the parameters) or a foreign one (another model's config or
parameters) raises ValueError naming the folder and what is wrong.

Nothing here is math and nothing imports either side: arrays are NumPy arrays (the torch side converts).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .config import check_checkpoint_fits, parse_checkpoint_metadata

FORMAT = "transformer-parity-training"
VERSION = 1
MODEL_FILE, OPTIMIZER_FILE, TRAINER_FILE = "model.safetensors", "optimizer.safetensors", "trainer.json"
FILES = (MODEL_FILE, OPTIMIZER_FILE, TRAINER_FILE)
RESERVED = ("format", "version", "param_names", "param_groups")  # trainer.json keys this module writes


def _safe_open(path: Path):
    from safetensors import safe_open

    try:
        return safe_open(os.fspath(path), framework="numpy")
    except Exception as error:  # safetensors raises its own error type (SafetensorError) for bad headers and sizes
        raise ValueError(f"{path}: not a readable safetensors file (torn or corrupted?): {error}") from None


# ----------------------------------------------------------------------------------------------
# An optimizer's state_dict as files: its arrays into optimizer.safetensors, its groups into trainer.json.


def optimizer_arrays(state_dict: dict) -> tuple[dict, list]:
    """(arrays named `state.{index}.{buffer}`, the param_groups) of a torch.optim-spelled state_dict whose
    buffers are NumPy arrays (a scalar step becomes a 0-d array)."""
    arrays = {
        f"state.{index}.{key}": np.asarray(value, order="C")  # (ascontiguousarray would make a 0-d step 1-d)
        for index, buffers in state_dict["state"].items()
        for key, value in buffers.items()
    }
    return arrays, [dict(group) for group in state_dict["param_groups"]]


def optimizer_state(arrays: dict, param_groups: list) -> dict:
    """The state_dict that optimizer_arrays split: {"state": {index: {buffer: array}}, "param_groups"}."""
    state: dict = {}
    for name, value in arrays.items():
        _, index, key = name.split(".", 2)
        state.setdefault(int(index), {})[key] = value
    groups = [{**g, "betas": tuple(g["betas"])} if "betas" in g else dict(g) for g in param_groups]
    return {"state": dict(sorted(state.items())), "param_groups": groups}


def generator_state(generator: np.random.Generator) -> dict:
    """A NumPy Generator's state, as JSON can hold it (Python ints)."""
    return dict(generator.bit_generator.state)


def set_generator_state(generator: np.random.Generator, state: dict, where: str) -> None:
    try:
        generator.bit_generator.state = state
    except (TypeError, ValueError, KeyError) as error:
        raise ValueError(f"{where}: not a state of this random generator ({error})") from None


# ----------------------------------------------------------------------------------------------
# Writing: a complete folder beside the target, then renamed into place.


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(
    directory: str | os.PathLike,
    write_model: Callable[[Path], None],
    optimizer: dict,
    param_names: list,
    trainer: dict,
) -> Path:
    """Write a training checkpoint to `directory`, replacing the one there only once the new one is complete.

    write_model(path): writes model.safetensors (the side's save_checkpoint). optimizer: the optimizer's
    state_dict() with NumPy arrays. param_names: the parameters' names in the optimizer's order. trainer: the
    training loop's JSON-serialisable state (step, schedule, random generators, data position)."""
    directory = Path(directory)
    reserved = [k for k in trainer if k in RESERVED]
    if reserved:
        raise ValueError(f"trainer keys {reserved} are reserved (written by the checkpoint itself)")
    arrays, groups = optimizer_arrays(optimizer)
    text = json.dumps(
        {"format": FORMAT, "version": VERSION, "param_names": list(param_names), "param_groups": groups, **trainer}
    )
    parent = directory.parent
    parent.mkdir(parents=True, exist_ok=True)
    for stale in parent.glob(f".{directory.name}.tmp-*"):  # left by a process killed while writing
        shutil.rmtree(stale, ignore_errors=True)
    temporary = Path(tempfile.mkdtemp(dir=parent, prefix=f".{directory.name}.tmp-"))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o777 & ~umask)  # mkdtemp's folder is the owner's alone; a checkpoint folder is not
        write_model(temporary / MODEL_FILE)
        from safetensors.numpy import save_file

        save_file(arrays, os.fspath(temporary / OPTIMIZER_FILE), metadata={"format": FORMAT})
        (temporary / TRAINER_FILE).write_text(text)  # last: a folder with trainer.json had its arrays written
        for name in FILES:
            _fsync(temporary / name)
        _fsync(temporary)
        old = parent / f".{directory.name}.old"
        if directory.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.rename(directory, old)  # the previous checkpoint stays whole until the new one stands
        os.rename(temporary, directory)
        _fsync(parent)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return directory


# ----------------------------------------------------------------------------------------------
# Reading: every file checked, and checked against the model and the optimizer's parameters, before anything
# is loaded.


def locate(directory: str | os.PathLike) -> Path:
    """The checkpoint folder to read: `directory`, or the previous checkpoint `.NAME.old` beside it when a
    process was killed between write's two renames. FileNotFoundError when there is neither."""
    directory = Path(directory)
    if directory.is_dir():
        return directory
    old = directory.parent / f".{directory.name}.old"
    if old.is_dir() and (old / TRAINER_FILE).exists():
        return old
    raise FileNotFoundError(f"no training checkpoint at {directory}")


def read(directory: str | os.PathLike, model, param_shapes: dict) -> tuple[Path, dict, dict]:
    """Check the training checkpoint in `directory` against `model` (its class and config; either side's) and
    the optimizer's parameters (`param_shapes`: name -> shape, in the optimizer's order), and read it.

    Returns (the path of model.safetensors, the optimizer's state_dict with NumPy arrays, the trainer dict as
    written). ValueError naming the folder and the problem for a torn or foreign checkpoint."""
    directory = locate(directory)
    missing = [name for name in FILES if not (directory / name).is_file()]
    if missing:
        raise ValueError(f"{directory}: not a complete training checkpoint: {', '.join(missing)} missing")
    trainer = _read_trainer(directory)
    names, shapes = list(param_shapes), {k: tuple(v) for k, v in param_shapes.items()}
    if trainer["param_names"] != names:
        theirs = trainer["param_names"]
        diff = [n for n in names if n not in theirs][:5] + [n for n in theirs if n not in names][:5]
        raise ValueError(
            f"{directory}: the optimizer's parameters differ from this run's ({len(theirs)} saved, {len(names)} here"
            + (f"; not in both: {diff}" if diff else "; in another order")
            + ")"
        )
    with _safe_open(directory / MODEL_FILE) as f:  # the model's config before any of the optimizer's data
        config, model_class, _ = parse_checkpoint_metadata(f.metadata(), directory / MODEL_FILE)
    check_checkpoint_fits(model, config, model_class, directory / MODEL_FILE)
    with _safe_open(directory / OPTIMIZER_FILE) as f:
        if (f.metadata() or {}).get("format") != FORMAT:
            raise ValueError(f"{directory / OPTIMIZER_FILE}: not a training checkpoint's optimizer state")
        problems = []
        for key in f.keys():
            parts = key.split(".", 2)
            if len(parts) != 3 or parts[0] != "state" or not parts[1].isdigit() or int(parts[1]) >= len(names):
                problems.append(f"{key}: not a buffer of one of the {len(names)} parameters")
                continue
            shape, name = tuple(f.get_slice(key).get_shape()), names[int(parts[1])]
            if parts[2] != "step" and shape != shapes[name]:
                problems.append(f"{key} ({name}): shape {shape}, the parameter's {shapes[name]}")
        if problems:
            raise ValueError(f"{directory / OPTIMIZER_FILE}: does not fit the parameters: {'; '.join(problems[:10])}")
        arrays = {key: f.get_tensor(key) for key in f.keys()}
    optimizer = optimizer_state(arrays, trainer.pop("param_groups"))
    return directory / MODEL_FILE, optimizer, trainer


def _read_trainer(directory: Path) -> dict:
    path = directory / TRAINER_FILE
    try:
        trainer = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise ValueError(f"{path}: unreadable JSON (torn or corrupted?): {error}") from None
    if not isinstance(trainer, dict) or trainer.get("format") != FORMAT:
        got = trainer.get("format") if isinstance(trainer, dict) else type(trainer).__name__
        raise ValueError(f"{path}: not a training checkpoint (format {got!r}, expected {FORMAT!r})")
    if trainer.get("version") != VERSION:
        raise ValueError(f"{path}: format version {trainer.get('version')!r}; this version reads version {VERSION}")
    groups = trainer.get("param_groups")
    if not isinstance(trainer.get("param_names"), list) or not isinstance(groups, list):
        raise ValueError(f"{path}: param_names or param_groups missing")
    return trainer
