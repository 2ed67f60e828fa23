"""Checkpoints: one safetensors file loads into either implementation, exactly, with its config;
broken or foreign files raise errors that say what is wrong."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import numpy_transformer as nt  # noqa: E402
import torch_transformer as tt
from numpy_transformer import checkpoint as np_ckpt  # noqa: E402
from numpy_transformer import hf as np_hf
from torch_transformer import checkpoint as torch_ckpt  # noqa: E402
from torch_transformer import hf as torch_hf

CONFIG = nt.TransformerConfig(
    src_vocab_size=11,
    tgt_vocab_size=13,
    d_model=8,
    n_heads=2,
    d_ff=12,
    max_len=10,
    norm_first=True,
    positional="learned",
    tie_embeddings=True,
)


@pytest.mark.parametrize("cls", ["Transformer", "TransformerLM"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_round_trip_numpy_to_torch_and_back(tmp_path, cls, dtype):
    model = getattr(nt, cls)(CONFIG, seed=4, dtype=dtype)
    path = tmp_path / "model.safetensors"
    np_ckpt.save_checkpoint(path, model, metadata={"step": 12, "note": "hello"})
    again = np_ckpt.load_checkpoint(path)
    assert type(again) is type(model) and again.config == CONFIG and again.dtype == np.dtype(dtype)
    for k, v in model.params.items():
        np.testing.assert_array_equal(again.params[k], v)  # exact
    torch_model = torch_ckpt.load_checkpoint(path)
    assert type(torch_model).__name__ == cls and torch_model.config == CONFIG
    for k, v in torch_model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), model.params[k])
    # torch -> file -> numpy
    path2 = tmp_path / "from_torch.safetensors"
    torch_ckpt.save_checkpoint(path2, torch_model)
    back = getattr(nt, cls)(CONFIG, seed=99, dtype=dtype)
    extra = np_ckpt.load_into(back, path2)
    assert extra == {}
    for k, v in model.params.items():
        np.testing.assert_array_equal(back.params[k], v)
    _, _, _, extra = np_ckpt.read_checkpoint(path)
    assert extra == {"step": "12", "note": "hello"}


SPEECH = nt.TransformerConfig(
    src_vocab_size=11, tgt_vocab_size=13, d_model=8, n_heads=2, d_ff=12, max_len=10, norm_first=True,
    positional="learned", n_mels=4, source_positions=3,
)  # fmt: skip


@pytest.mark.parametrize("cls", ["Transformer", "TransformerLM", "EncoderModel", "SpeechTransformer"])
def test_each_class_names_its_own_shapes(cls):
    """cls.shapes(config) is what a built model holds, on both sides: its parameters, and with buffers=True its state
    dict (Whisper's fixed position table besides them); the checkpoint readers (hf.shapes) ask the class."""
    config = SPEECH if cls == "SpeechTransformer" else CONFIG
    ours, theirs = getattr(nt, cls)(config, seed=0), getattr(tt, cls)(config)
    expected = {name: value.shape for name, value in ours.params.items()}
    assert getattr(nt, cls).shapes(config) == expected == getattr(tt, cls).shapes(config)
    assert expected == {name: tuple(p.shape) for name, p in theirs.named_parameters()}
    state = {name: tuple(value.shape) for name, value in theirs.state_dict().items()}
    assert state == {name: value.shape for name, value in ours.state_dict().items()}
    assert getattr(nt, cls).shapes(config, buffers=True) == state == getattr(tt, cls).shapes(config, buffers=True)
    assert np_hf.shapes(config, cls) == state == torch_hf.shapes(config, cls)
    assert (len(state) > len(expected)) == (cls == "SpeechTransformer")


def test_same_logits_after_loading_on_both_sides(tmp_path):
    model = nt.Transformer(CONFIG, seed=1).eval()
    path = tmp_path / "m.safetensors"
    np_ckpt.save_checkpoint(path, model)
    torch_model = torch_ckpt.load_checkpoint(path).eval()
    src, tgt = np.array([[3, 4, 5, 0]]), np.array([[1, 6, 7]])
    theirs = torch_model(torch.from_numpy(src), torch.from_numpy(tgt)).detach().numpy()
    np.testing.assert_allclose(model.forward(src, tgt), theirs, rtol=0, atol=1e-13)


def test_truncated_file(tmp_path):
    path = tmp_path / "m.safetensors"
    np_ckpt.save_checkpoint(path, nt.Transformer(CONFIG))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    for reader in (np_ckpt.read_checkpoint, torch_ckpt.read_checkpoint):
        with pytest.raises(ValueError, match="truncated or corrupted"):
            reader(path)


def test_corrupted_header(tmp_path):
    path = tmp_path / "m.safetensors"
    np_ckpt.save_checkpoint(path, nt.Transformer(CONFIG))
    data = bytearray(path.read_bytes())
    data[8:20] = b"not json!!!!"
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="truncated or corrupted"):
        np_ckpt.read_checkpoint(path)


def test_not_a_checkpoint_of_this_project(tmp_path):
    from safetensors.numpy import save_file

    path = tmp_path / "other.safetensors"
    save_file({"w": np.zeros(3)}, str(path))
    with pytest.raises(ValueError, match="not a checkpoint of this project"):
        np_ckpt.read_checkpoint(path)
    with pytest.raises(ValueError, match="not a checkpoint of this project"):
        torch_ckpt.load_checkpoint(path)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        np_ckpt.load_checkpoint(tmp_path / "nope.safetensors")


def test_file_for_another_configuration(tmp_path):
    path = tmp_path / "m.safetensors"
    np_ckpt.save_checkpoint(path, nt.Transformer(CONFIG))
    other = nt.Transformer(nt.TransformerConfig(**{**CONFIG.to_dict(), "d_model": 16}))
    with pytest.raises(ValueError, match="config differs.*d_model: model 16, checkpoint 8"):
        np_ckpt.load_into(other, path)
    import torch_transformer as tt

    with pytest.raises(ValueError, match="config differs.*d_model"):
        torch_ckpt.load_into(tt.Transformer(other.config), path)
    with pytest.raises(ValueError, match="holds a Transformer, cannot load into a TransformerLM"):
        np_ckpt.load_into(nt.TransformerLM(CONFIG), path)
