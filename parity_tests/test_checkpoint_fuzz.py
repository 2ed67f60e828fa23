"""Hostile checkpoint files: hypothesis truncates them, flips their bits, rewrites their header lengths, header
entries (dtypes, shapes, offsets), metadata and config.json, and re-saves them with tensors missing, extra,
re-typed or re-shaped. Every bad file must

- raise ValueError whose message names the file (a missing file is FileNotFoundError, as before: the
  project's format says "no checkpoint at ..."; `hf.load` says ValueError for a missing file, per docs/conventions.md);
- leave the model it was loading into bitwise as it was (`load_into`, both sides), and `hf.load` returns a
  model only when every one of its tensors is the file's;
- allocate no more than the file's size plus a small constant (tracemalloc, NumPy side: safetensors hands
  NumPy its tensors as Python buffers, which tracemalloc sees; a config.json, and the header that
  `hf.read_bfloat16` parses itself, count twice, bytes and text;
  the torch side is measured as the growth of a subprocess's peak resident size);
- never crash the interpreter: one test runs a hypothesis-made corpus in a subprocess and requires it to exit
  normally (a segfault or abort would be a negative return code).

A file that survives its mutation (a bit flipped in the tensor data is still a valid checkpoint) must load,
and exactly: the model then holds what an independent reader (safetensors' torch API) finds in the file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load, save

import numpy_transformer as nt
import torch_transformer as tt
from numpy_transformer import checkpoint as np_ckpt
from numpy_transformer import hf
from parity_tests import components as C
from torch_transformer import checkpoint as torch_ckpt
from torch_transformer import hf as torch_hf

ROOT = Path(__file__).resolve().parents[1]
# What a failed load may allocate beyond the file's size: the parsed metadata and config, the error message.
SLACK = 128 * 1024
FUZZ = settings(
    max_examples=200, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)

CONFIG = nt.TransformerConfig(
    src_vocab_size=11, tgt_vocab_size=13, d_model=8, n_heads=2, d_ff=12, n_decoder_layers=2, max_len=10
)
LLAMA = nt.TransformerConfig(
    tgt_vocab_size=13,
    d_model=8,
    n_heads=2,
    n_kv_heads=1,
    d_ff=12,
    n_decoder_layers=2,
    **C.LLAMA_OPTIONS,
    norm_first=True,
    scale_embeddings=False,
    pad_id=None,
    max_len=16,
)
GPT2 = nt.TransformerConfig(  # fused c_attn (split in three), Conv1D (transposed), tied embeddings
    tgt_vocab_size=13,
    d_model=8,
    n_heads=2,
    d_ff=32,
    n_decoder_layers=2,
    activation="gelu_tanh",
    positional="learned",
    norm_first=True,
    scale_embeddings=False,
    tie_embeddings=True,
    output_bias=False,
    pad_id=None,
    max_len=16,
)


# ----------------------------------------------------------------------------------------------
# The intact files, and what hypothesis does to them.


class Intact:
    """One intact safetensors file: its bytes, parsed header, header length and tensors (as torch tensors)."""

    def __init__(self, path: Path):
        self.path = path
        self.data = path.read_bytes()
        self.header_len = int.from_bytes(self.data[:8], "little")
        self.header = json.loads(self.data[8 : 8 + self.header_len])
        self.names = sorted(k for k in self.header if k != "__metadata__")
        self.tensors = load(path.read_bytes())
        self.metadata = self.header.get("__metadata__")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Intact files: our format (float32 TransformerLM) and two Hugging Face directories (llama, gpt2)."""
    root = tmp_path_factory.mktemp("intact")
    np_ckpt.save_checkpoint(root / "ours.safetensors", nt.TransformerLM(CONFIG, seed=1, dtype=np.float32))
    out = {"ours": Intact(root / "ours.safetensors")}
    for name, config in (("llama", LLAMA), ("gpt2", GPT2)):
        hf.save(nt.TransformerLM(config, seed=2, dtype=np.float32), root / name)
        out[name] = Intact(root / name / "model.safetensors")
        out[name].config_json = (root / name / "config.json").read_bytes()
    return out


DTYPES = ["F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2", "C64", "F32 "]
BIG = [2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**12, 10**30, -1, -(2**63)]
some_ints = st.one_of(st.integers(-2, 40), st.sampled_from(BIG))
json_scalars = st.one_of(
    st.none(), st.booleans(), some_ints, st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6)
)
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
)
shapes = st.one_of(st.lists(some_ints, max_size=4), json_values)


def with_header(header, length: int | None = None, data: bytes = b"") -> bytes:
    """A safetensors file from a header (dict or raw bytes) and data; `length` overrides the length field."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    length = len(raw) if length is None else length
    return (length % 2**64).to_bytes(8, "little") + raw + data


@st.composite
def mutated(draw, intact: Intact) -> bytes:
    """A damaged copy of an intact safetensors file."""
    # the well-formed files that no longer fit ("resave", "metadata") reach the checks after safetensors' own
    kinds = ["truncate", "flip", "flip", "length", "grow", "entry", "entry", "metadata", "metadata"] + ["resave"] * 4
    return MUTATIONS[draw(st.sampled_from(kinds))](draw, intact)


def truncated(draw, intact: Intact) -> bytes:
    """The file cut short anywhere."""
    return intact.data[: draw(st.integers(0, len(intact.data) - 1))]


def flipped(draw, intact: Intact) -> bytes:
    """Up to 8 bits flipped, half the positions in the length field and header, where a flip matters most."""
    data, n = intact.data, intact.header_len
    out = bytearray(data)
    positions = st.one_of(st.integers(0, 7 + n), st.integers(0, len(data) - 1))
    for position, bit in draw(st.lists(st.tuples(positions, st.integers(0, 7)), min_size=1, max_size=8)):
        out[position] ^= 1 << bit
    return bytes(out)


def relengthed(draw, intact: Intact) -> bytes:
    """The 8-byte header length: huge, past the end, a little off."""
    data, n = intact.data, intact.header_len
    value = draw(st.one_of(st.sampled_from(BIG + [0, 1, 2]), st.integers(0, len(data) + 64), st.integers(n - 8, n + 8)))
    return with_header(data[8 : 8 + n], value, data[8 + n :])


def grown(draw, intact: Intact) -> bytes:
    """Bytes after the data, or a header padded far beyond what it needs."""
    data, n = intact.data, intact.header_len
    if draw(st.booleans()):
        return data + draw(st.binary(min_size=1, max_size=64))
    return with_header(data[8 : 8 + n] + b" " * draw(st.integers(1, 200_000)), None, data[8 + n :])


def entry_changed(draw, intact: Intact) -> bytes:
    """One tensor's dtype, shape or offsets; or the entry gone, or replaced; or a tensor claiming a huge size, its
    bytes nowhere."""
    data, n = intact.data, intact.header_len
    header = json.loads(data[8 : 8 + n])
    name = draw(st.sampled_from(intact.names))
    field = draw(st.sampled_from(["dtype", "shape", "data_offsets", "remove", "replace", "add"]))
    if field == "dtype":
        header[name]["dtype"] = draw(st.one_of(st.sampled_from(DTYPES), json_values))
    elif field == "shape":
        header[name]["shape"] = draw(shapes)
    elif field == "data_offsets":
        header[name]["data_offsets"] = draw(st.one_of(st.lists(some_ints, min_size=2, max_size=2), json_values))
    elif field == "remove":
        del header[name]
    elif field == "replace":
        header[name] = draw(json_values)
    else:
        header["extra"] = {"dtype": "F32", "shape": draw(st.lists(some_ints, max_size=3)), "data_offsets": [0, 2**40]}
    return with_header(header, data=data[8 + n :])


def metadata_changed(draw, intact: Intact) -> bytes:
    """The metadata's format, model class, config (whole, or one field), an extra key; or the metadata gone, or
    replaced."""
    data, n = intact.data, intact.header_len
    header = json.loads(data[8 : 8 + n])
    metadata = header.setdefault("__metadata__", {})
    key = draw(st.sampled_from(["format", "model_class", "config", "config field", "extra", "remove", "replace"]))
    if key == "config field" and "config" in metadata:
        config = json.loads(metadata["config"])
        config[draw(st.sampled_from(sorted(config) + ["unknown"]))] = draw(json_values)
        metadata["config"] = json.dumps(config)
    elif key == "remove":
        del header["__metadata__"]
    elif key == "replace":
        header["__metadata__"] = draw(json_values)
    else:
        metadata[key] = draw(st.one_of(st.text(max_size=20), json_values.map(json.dumps), json_values))
    return with_header(header, data=data[8 + n :])


def resaved(draw, intact: Intact) -> bytes:
    """A well-formed safetensors file whose tensors no longer fit the model: one dropped, added, retyped, reshaped
    or resized, or all in float64."""
    tensors = dict(intact.tensors)
    name = draw(st.sampled_from(intact.names))
    change = draw(st.sampled_from(["drop", "add", "retype", "reshape", "resize", "all float64"]))
    if change == "drop":
        del tensors[name]
    elif change == "add":
        tensors["decoder.layers.9.unknown.weight"] = torch.zeros(2, 3)
    elif change == "retype":
        dtype = draw(
            st.sampled_from([torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int8, torch.bool])
        )
        tensors[name] = tensors[name].to(dtype)
    elif change == "reshape":
        tensors[name] = tensors[name].reshape(-1) if tensors[name].dim() > 1 else tensors[name].reshape(1, -1)
    elif change == "resize":
        tensors[name] = torch.zeros(draw(st.lists(st.integers(0, 9), max_size=3)))
    else:
        tensors = {k: v.double() for k, v in tensors.items()}
    return save({k: v.contiguous() for k, v in tensors.items()}, metadata=intact.metadata)


MUTATIONS = {
    "truncate": truncated,
    "flip": flipped,
    "length": relengthed,
    "grow": grown,
    "entry": entry_changed,
    "metadata": metadata_changed,
    "resave": resaved,
}


@st.composite
def mutated_config(draw, original: bytes) -> bytes:
    """A damaged copy of a config.json."""
    kind = draw(st.sampled_from(["truncate", "flip", "field", "remove", "not an object", "deep", "not utf-8"]))
    if kind == "truncate":
        return original[: draw(st.integers(0, len(original) - 1))]
    if kind == "flip":
        out = bytearray(original)
        for position, bit in draw(st.lists(st.tuples(st.integers(0, len(out) - 1), st.integers(0, 7)), min_size=1)):
            out[position] ^= 1 << bit
        return bytes(out)
    if kind == "not an object":
        return json.dumps(draw(json_values)).encode()
    if kind == "deep":
        depth = draw(st.integers(1, 100_000))
        return b'{"model_type": "llama", "x": ' + b"[" * depth + b"]" * depth + b"}"
    if kind == "not utf-8":
        return original[:20] + b"\xff\xfe\x80" + original[20:]
    config = json.loads(original)
    key = draw(st.sampled_from(sorted(config)))
    if kind == "remove":
        del config[key]
    else:
        config[key] = draw(json_values)
    return json.dumps(config).encode()


# ----------------------------------------------------------------------------------------------
# What must hold, for one hostile file.


def expected_values(path: Path, dtype) -> dict:
    """What an independent reader (safetensors' torch API) finds in the file, as NumPy arrays of `dtype`.
    Read from bytes: load_file's CPU tensors are views of the file mapped into memory (SIGBUS once it is
    truncated)."""
    to = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}[np.dtype(dtype)]
    return {k: v.to(to).numpy() for k, v in load(path.read_bytes()).items()}


def write(path: Path, data: bytes) -> None:
    """A new file (a new inode) at `path`: anything still mapping the previous file keeps its pages."""
    path.unlink(missing_ok=True)
    path.write_bytes(data)


def same(a, b) -> bool:
    """Equal values, NaN where NaN, and the same signs (a flipped sign bit of a zero counts)."""
    a, b = np.asarray(a), np.asarray(b)
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and np.array_equal(a, b, equal_nan=True)
        and np.array_equal(np.signbit(a), np.signbit(b))
    )


def traced(load):
    """(result or the exception raised, peak bytes allocated by Python and NumPy while loading)."""
    tracemalloc.start()
    try:
        try:
            result = load()
        except Exception as error:  # noqa: BLE001 - judged by the caller: only ValueError is allowed
            result = error
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def check_numpy(path: Path) -> None:
    size = path.stat().st_size
    model = nt.TransformerLM(CONFIG, seed=5, dtype=np.float32)
    before = {k: v.tobytes() for k, v in model.params.items()}
    result, peak = traced(lambda: np_ckpt.load_into(model, path))
    if isinstance(result, Exception):
        assert isinstance(result, ValueError), f"{type(result).__name__}: {result}"
        assert str(path) in str(result), f"the message does not name the file: {result}"
        assert {k: v.tobytes() for k, v in model.params.items()} == before, "a failed load_into changed the model"
        assert peak <= size + SLACK, f"a failed load allocated {peak} bytes for a file of {size}"
    else:
        # bfloat16 is widened to float32 (twice the file's bytes); nothing else is copied
        assert peak <= 3 * size + SLACK, f"loading allocated {peak} bytes for a file of {size}"
        theirs = expected_values(path, np.float32)
        assert all(same(v, theirs[k]) for k, v in model.params.items()), "load_into did not load the file's values"
    result, peak = traced(lambda: np_ckpt.load_checkpoint(path))
    if isinstance(result, Exception):
        assert isinstance(result, ValueError) and str(path) in str(result), f"{type(result).__name__}: {result}"
        assert peak <= size + SLACK, f"a failed load allocated {peak} bytes for a file of {size}"
    else:
        assert type(result) is nt.TransformerLM
        theirs = expected_values(path, result.dtype)
        assert all(same(v, theirs[k]) for k, v in result.params.items()), "load_checkpoint: not the file's values"


def check_torch(path: Path) -> None:
    model = tt.TransformerLM(CONFIG)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        torch_ckpt.load_into(model, path)
    except ValueError as error:
        assert str(path) in str(error), f"the message does not name the file: {error}"
        after = model.state_dict()
        assert all(torch.equal(after[k], v) for k, v in before.items()), "a failed load_into changed the model"
    else:
        theirs = expected_values(path, np.float32)
        assert all(same(v.numpy(), theirs[k]) for k, v in model.state_dict().items()), "not the file's values"
    try:
        again = torch_ckpt.load_checkpoint(path, dtype=torch.float64)
    except ValueError as error:
        assert str(path) in str(error), f"the message does not name the file: {error}"
    else:
        theirs = expected_values(path, np.float64)
        assert all(same(v.numpy(), theirs[k]) for k, v in again.state_dict().items()), "not the file's values"


def check_hf(directory: Path, side: str = "numpy") -> None:
    """One hostile Hugging Face directory, loaded by `side`'s hf.load: a ValueError naming it, within the memory
    bound (both sides read and check the folder with the same code before building anything), or every tensor the
    file's."""
    size = sum(p.stat().st_size for p in directory.iterdir())
    loader = hf.load if side == "numpy" else torch_hf.load
    result, peak = traced(lambda: loader(directory))
    if isinstance(result, Exception):
        assert isinstance(result, ValueError), f"{type(result).__name__}: {result}"
        assert str(directory) in str(result), f"the message does not name the checkpoint: {result}"
        # config.json is held twice for a moment: the bytes read, and the text JSON parses
        bound = size + (directory / "config.json").stat().st_size + SLACK
        assert peak <= bound, f"a failed load allocated {peak} bytes for files of {size}"
        return
    theirs = expected_values(directory / "model.safetensors", np.float32)
    if side == "numpy":
        ours = hf.to_hf(result, result.params, tied=False)
    else:
        ours = {k: v.numpy() for k, v in torch_hf.to_hf(result, result.state_dict(), tied=False).items()}
    assert ours.keys() <= theirs.keys()
    for name, value in ours.items():  # not a partial model: every tensor is the file's
        assert same(value, theirs[name]), name


# ----------------------------------------------------------------------------------------------
# The fuzz tests.


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("hostile")


def test_the_intact_files_load(files, scratch):
    """The checks below pass vacuously unless an intact file passes them as a success."""
    for name in ("llama", "gpt2"):
        directory = scratch / f"intact-{name}"
        directory.mkdir()
        (directory / "model.safetensors").write_bytes(files[name].data)
        (directory / "config.json").write_bytes(files[name].config_json)
        check_hf(directory)
        check_hf(directory, "torch")
    path = scratch / "intact.safetensors"
    path.write_bytes(files["ours"].data)
    check_numpy(path)
    check_torch(path)


@FUZZ
@given(data=st.data())
def test_hostile_checkpoints_numpy(files, scratch, data):
    path = scratch / "numpy.safetensors"
    write(path, data.draw(mutated(files["ours"])))
    check_numpy(path)


@settings(FUZZ, max_examples=150)
@given(data=st.data())
def test_hostile_checkpoints_torch(files, scratch, data):
    path = scratch / "torch.safetensors"
    write(path, data.draw(mutated(files["ours"])))
    check_torch(path)


@pytest.mark.parametrize("side", ["numpy", "torch"])
@FUZZ
@given(data=st.data(), family=st.sampled_from(["llama", "gpt2"]), damaged=st.sampled_from(["tensors", "config"]))
def test_hostile_hugging_face_checkpoints(files, scratch, data, family, damaged, side):
    directory = scratch / f"hf-{side}"
    directory.mkdir(exist_ok=True)
    intact = files[family]
    tensors = data.draw(mutated(intact)) if damaged == "tensors" else intact.data
    config = data.draw(mutated_config(intact.config_json)) if damaged == "config" else intact.config_json
    write(directory / "model.safetensors", tensors)
    write(directory / "config.json", config)
    check_hf(directory, side)


@pytest.fixture(scope="module")
def bfloat16_file(tmp_path_factory):
    """An intact file of bfloat16 tensors (what a torch bfloat16 model saves; NumPy has no such dtype)."""
    path = tmp_path_factory.mktemp("bf16") / "bf16.safetensors"
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "w": torch.randn(4, 6, generator=generator),
        "b": torch.randn(6, generator=generator),
        "s": torch.ones(()),
    }
    path.write_bytes(save({k: v.bfloat16() for k, v in tensors.items()}, metadata={"format": "pt"}))
    return Intact(path)


@FUZZ
@given(data=st.data(), name=st.sampled_from(["w", "b", "s", "absent"]))
def test_hostile_bfloat16_headers(bfloat16_file, scratch, data, name):
    """read_bfloat16 parses the header itself (safetensors' NumPy API cannot give bfloat16), so it must check
    what safetensors checks: the header length within the file, the entry's dtype, shape and offsets."""
    raw = data.draw(mutated(bfloat16_file))
    path = scratch / "bf16.safetensors"
    write(path, raw)
    result, peak = traced(lambda: hf.read_bfloat16(path, name))
    if isinstance(result, Exception):
        assert isinstance(result, ValueError), f"{type(result).__name__}: {result}"
        assert str(path) in str(result) and repr(name) in str(result), str(result)
        # json.loads(header bytes) holds the bytes and their decoded text at once: a refused header costs
        # twice its length (as a config.json does), never what the header claims
        assert peak <= 2 * len(raw) + SLACK, f"a failed read allocated {peak} bytes for a file of {len(raw)}"
        return
    assert peak <= 3 * len(raw) + SLACK  # the 16 bits read, then widened to 32
    # the entry's bytes, widened by hand: the top half of each float32
    n = int.from_bytes(raw[:8], "little")
    entry = json.loads(raw[8 : 8 + n])[name]
    start, end = entry["data_offsets"]
    bits = np.frombuffer(raw[8 + n + start : 8 + n + end], dtype="<u2")
    expected = (bits.astype("<u4") * 65536).view("<f4").reshape(entry["shape"])
    assert result.dtype == np.float32 and same(result, expected)


def test_the_intact_bfloat16_file_reads_exactly(bfloat16_file):
    path = Path(bfloat16_file.path)
    for name, tensor in bfloat16_file.tensors.items():
        assert same(hf.read_bfloat16(path, name), tensor.float().numpy()), name


def test_missing_files(tmp_path):
    """A missing checkpoint is FileNotFoundError in the project's format (both sides, as before), ValueError for a
    Hugging Face directory (a missing file raises ValueError)."""
    for loader in (np_ckpt.load_checkpoint, np_ckpt.read_checkpoint, torch_ckpt.load_checkpoint):
        with pytest.raises(FileNotFoundError, match="no checkpoint at"):
            loader(tmp_path / "nope.safetensors")
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        torch_ckpt.load_into(tt.TransformerLM(CONFIG), tmp_path / "nope.safetensors")
    with pytest.raises(ValueError, match="no config.json"):
        hf.load(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="config.json: expected a JSON object, got list"):
        hf.load(tmp_path)


@pytest.mark.parametrize("side", ["numpy", "torch"])
def test_a_sharded_index_cannot_point_outside_its_directory(files, tmp_path, side):
    """model.safetensors.index.json names shard files; "../x" or "/abs/x" would read files anywhere."""
    hf_load = hf.load if side == "numpy" else torch_hf.load
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes(files["llama"].data)
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    (directory / "config.json").write_bytes(files["llama"].config_json)
    index = directory / "model.safetensors.index.json"
    for shard in ("../outside.safetensors", str(outside), "", ".."):
        index.write_text(json.dumps({"weight_map": {name: shard for name in files["llama"].names}}))
        with pytest.raises(ValueError, match="is not a file name in the checkpoint's directory"):
            hf_load(directory)
    # two shards, as an index names them, load as the single file does
    names = files["llama"].names
    halves = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
    for shard, part in halves.items():
        (directory / shard).write_bytes(save({n: files["llama"].tensors[n] for n in part}, metadata={"format": "pt"}))
    index.write_text(json.dumps({"weight_map": {n: shard for shard, part in halves.items() for n in part}}))
    model = hf_load(directory)
    params = model.params if side == "numpy" else model.state_dict()
    ours = {k: np.asarray(v) for k, v in (hf if side == "numpy" else torch_hf).to_hf(model, params, tied=False).items()}
    assert sorted(ours) == names and all(same(v, files["llama"].tensors[k].numpy()) for k, v in ours.items())
    # the same tensors in two shards, or a shard without the tensors the index puts there
    (directory / "a.safetensors").write_bytes(files["llama"].data)
    (directory / "b.safetensors").write_bytes(files["llama"].data)
    index.write_text(
        json.dumps({"weight_map": {n: "a.safetensors" if i % 2 else "b.safetensors" for i, n in enumerate(names)}})
    )
    with pytest.raises(ValueError, match="holds tensors another shard holds too"):
        hf_load(directory)
    index.write_text(json.dumps({"weight_map": {"nowhere": "a.safetensors"}}))
    with pytest.raises(ValueError, match=r"a.safetensors: lacks tensors .*\['nowhere'\]"):
        hf_load(directory)
    for text in ("{", "[]", '{"weight_map": [1]}', '{"weight_map": {"x": 3}}'):
        index.write_text(text)
        with pytest.raises(ValueError, match="model.safetensors.index.json"):
            hf_load(directory)


# ----------------------------------------------------------------------------------------------
# Out of process: no hostile file crashes the interpreter, and none makes the torch side allocate.

SUBPROCESS = r"""
import faulthandler, json, resource, sys
from pathlib import Path
faulthandler.enable()
import numpy as np
import numpy_transformer as nt, torch_transformer as tt
from numpy_transformer import checkpoint as np_ckpt, hf
from torch_transformer import checkpoint as torch_ckpt
from torch_transformer import hf as torch_hf

config = nt.TransformerConfig(**json.loads(sys.argv[2]))
corpus = Path(sys.argv[1])
torch_ckpt.load_checkpoint(corpus / "intact.safetensors")  # warm up: torch's meta kernels, first allocations
start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
outcomes = []
for entry in sorted(corpus.iterdir()):
    if entry.name == "intact.safetensors":
        continue
    if entry.is_dir():
        loads = [("hf.load", lambda e=entry: hf.load(e)), ("torch hf.load", lambda e=entry: torch_hf.load(e))]
    else:
        loads = [
            ("numpy load_into", lambda e=entry: np_ckpt.load_into(nt.TransformerLM(config, dtype=np.float32), e)),
            ("numpy load_checkpoint", lambda e=entry: np_ckpt.load_checkpoint(e)),
            ("torch load_into", lambda e=entry: torch_ckpt.load_into(tt.TransformerLM(config), e)),
            ("torch load_checkpoint", lambda e=entry: torch_ckpt.load_checkpoint(e)),
        ]
    for name, load in loads:
        try:
            load()
            outcomes.append([entry.name, name, "ok", ""])
        except ValueError as error:
            outcomes.append([entry.name, name, "ValueError" if str(entry) in str(error) else "unnamed", str(error)])
        except Exception as error:
            outcomes.append([entry.name, name, type(error).__name__, str(error)])
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start

# read_checkpoint's tensors are the caller's: truncating the file afterwards (safetensors maps it into memory)
# must not kill the interpreter with SIGBUS when they are read
copy = corpus / "intact.safetensors"
state, _, _, _ = torch_ckpt.read_checkpoint(copy)
with open(copy, "r+b") as f:
    f.truncate(8)
total = float(sum(t.double().sum() for t in state.values()))
print(json.dumps({"outcomes": outcomes, "maxrss_growth_kib": grown, "total": total}))
"""


def test_hostile_files_never_crash_the_interpreter(files, tmp_path):
    """Hypothesis makes a corpus; a fresh interpreter loads every file with every loader, both sides. A crash
    (segfault, abort) is a non-zero exit; the peak resident size may not grow by more than 64 MiB (a header
    claiming 2**40 bytes that some reader believed would show)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "intact.safetensors").write_bytes(files["ours"].data)
    count = iter(range(10**6))

    @settings(FUZZ, max_examples=40)
    @given(data=st.data(), where=st.sampled_from(["ours", "hf tensors", "hf config"]))
    def make(data, where):
        i = next(count)
        if where == "ours":
            (corpus / f"{i:03d}.safetensors").write_bytes(data.draw(mutated(files["ours"])))
            return
        intact = files["llama"]
        directory = corpus / f"{i:03d}-hf"
        directory.mkdir()
        (directory / "model.safetensors").write_bytes(
            data.draw(mutated(intact)) if where == "hf tensors" else intact.data
        )
        (directory / "config.json").write_bytes(
            data.draw(mutated_config(intact.config_json)) if where == "hf config" else intact.config_json
        )

    make()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [sys.executable, "-c", SUBPROCESS, str(corpus), json.dumps(CONFIG.to_dict())],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, f"the interpreter died (return code {run.returncode}):\n{run.stderr[-4000:]}"
    report = json.loads(run.stdout.strip().splitlines()[-1])
    wrong = [o for o in report["outcomes"] if o[2] not in ("ok", "ValueError")]
    assert not wrong, f"not a ValueError naming the file: {wrong[:5]}"
    assert sum(o[2] == "ValueError" for o in report["outcomes"]) > len(report["outcomes"]) // 2  # mostly rejected
    assert report["maxrss_growth_kib"] < 64 * 1024, f"peak resident size grew by {report['maxrss_growth_kib']} KiB"
    print(f"{len(report['outcomes'])} loads, peak resident size grew by {report['maxrss_growth_kib']} KiB")
