"""The training example runs end to end in its quick mode, on both backends and with both models (the
encoder-decoder and the Llama-style LM), writes what it promises, and scores decoded numbers correctly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from examples import plotting, tasks, train_numbers  # noqa: E402
from numpy_transformer import TransformerConfig


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_train_numbers_quick(backend, tmp_path):
    metrics = train_numbers.main(["--quick", "--backend", backend, "--out", str(tmp_path)])
    written = json.loads((tmp_path / "metrics.json").read_text())
    for key in ("test_exact_match", "test_token_accuracy", "n_test", "train_seconds", "backend"):
        assert key in written
    assert written["backend"] == backend and written["n_test"] == 40 and metrics["steps"] == 30
    assert 0.0 <= written["test_exact_match"] <= 1.0 and 0.0 <= written["test_token_accuracy"] <= 1.0
    assert written["history"]["loss"][-1] < written["history"]["loss"][0]  # it learned something
    assert (tmp_path / "checkpoint.safetensors").stat().st_size > 0
    assert (tmp_path / "loss_curve.png").stat().st_size > 0
    maps = sorted(p.name for p in tmp_path.glob("attention_*.png"))
    assert maps == [
        "attention_decoder_layers_0_cross_attn.png",
        "attention_decoder_layers_0_self_attn.png",
        "attention_encoder_layers_0_self_attn.png",
    ]


def test_checkpoint_of_the_example_loads_into_the_other_backend(tmp_path):
    from numpy_transformer.checkpoint import read_checkpoint
    from torch_transformer.checkpoint import load_checkpoint

    train_numbers.main(["--quick", "--out", str(tmp_path)])
    _, config, _, extra = read_checkpoint(tmp_path / "checkpoint.safetensors")
    assert json.loads(extra["tgt_vocab"])["tokens"][:3] == ["<pad>", "<bos>", "<eos>"]
    torch_model = load_checkpoint(tmp_path / "checkpoint.safetensors")
    assert torch_model.config == config


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_train_numbers_llama_quick(backend, tmp_path):
    """--model llama: a decoder-only TransformerLM with Llama's components, trained on prompt -> words."""
    from numpy_transformer.checkpoint import read_checkpoint
    from torch_transformer.checkpoint import load_checkpoint

    metrics = train_numbers.main(["--quick", "--model", "llama", "--backend", backend, "--out", str(tmp_path)])
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert written["model"] == "llama" and written["backend"] == backend
    assert written["n_test"] == 40 and metrics["steps"] == 30
    assert 0.0 <= written["test_exact_match"] <= 1.0 and 0.0 < written["test_token_accuracy"] <= 1.0
    assert written["history"]["loss"][-1] < written["history"]["loss"][0]
    assert (tmp_path / "loss_curve.png").stat().st_size > 0
    assert sorted(p.name for p in tmp_path.glob("attention_*.png")) == ["attention_decoder_layers_0_self_attn.png"]

    _, config, model_class, extra = read_checkpoint(tmp_path / "checkpoint.safetensors")
    # metrics.json holds the config as JSON (tuples such as dense_layers become lists): it reads back as the same config
    assert model_class == "TransformerLM" and TransformerConfig.from_dict(written["config"]) == config
    assert (config.norm, config.positional, config.activation, config.gated_ffn) == ("rms", "rope", "silu", True)
    assert config.n_kv_heads < config.n_heads and not config.bias and not config.output_bias
    assert config.norm_first and not config.scale_embeddings and config.pad_id == 0
    assert json.loads(extra["vocab"])["tokens"] == tasks.build_lm_vocab().tokens
    assert load_checkpoint(tmp_path / "checkpoint.safetensors").config == config  # loads into the other backend


SPLITS = tasks.make_numbers_dataset(60, 0, 30, seed=1)


class Oracle:
    """A backend whose greedy decoding reads each number right (by calling number_to_words), minus the
    last `drop` words: `evaluate` must give it exact match 1.0 with drop=0 and 0.0 with drop=1."""

    name = "oracle"

    def __init__(self, data, drop: int = 0):
        self.data, self.drop = data, drop

    def decode(self, ids, max_len: int) -> np.ndarray:
        lm = isinstance(self.data, train_numbers.LanguageModelData)
        source_vocab = self.data.vocab if lm else self.data.src_vocab
        rows = []
        for row in ids:
            source = "".join(source_vocab.decode(row))  # stops at the source's <eos>; the LM's prompt has none
            words = tasks.number_to_words(source).split()
            continuation = self.data.vocab.encode(words[: len(words) - self.drop])  # words, <eos>
            rows.append((row.tolist() if lm else [self.data.vocab.bos_id]) + continuation)
        out = np.full((len(rows), max(map(len, rows))), self.data.vocab.pad_id, dtype=np.int64)
        for b, row in enumerate(rows):
            out[b, : len(row)] = row
        return out


@pytest.mark.parametrize("data_class", [train_numbers.EncoderDecoderData, train_numbers.LanguageModelData])
def test_evaluate_scores_decoded_numbers(data_class):
    """Prompts of every length in one call: the LM's are decoded in groups of one length, and its output is
    compared from <bos> on, as the encoder-decoder's."""
    data = data_class(SPLITS)
    assert len({len(src) for src, _ in SPLITS.test}) > 3
    assert train_numbers.evaluate(Oracle(data), data, SPLITS.test, batch_size=7) == (1.0, 1.0)
    exact, accuracy = train_numbers.evaluate(Oracle(data, drop=1), data, SPLITS.test, batch_size=7)
    assert exact == 0.0 and 0.5 < accuracy < 1.0  # every word right up to the early <eos>


@pytest.mark.slow
def test_train_numbers_reaches_the_target(tmp_path):
    """The issue's bar with the defaults: >= 0.95 exact match on >= 1,000 held-out numbers within 15 minutes
    of float32 NumPy training. Minutes long: run with `pytest -m slow`."""
    metrics = train_numbers.main(["--out", str(tmp_path)])
    assert metrics["n_test"] >= 1000
    assert metrics["train_seconds"] <= 15 * 60
    assert metrics["test_exact_match"] >= 0.95


@pytest.mark.slow
def test_train_numbers_llama_reaches_the_target(tmp_path):
    """The same bar for the Llama-style decoder-only LM with its defaults (--model llama), pure NumPy float32."""
    metrics = train_numbers.main(["--model", "llama", "--out", str(tmp_path)])
    assert metrics["model"] == "llama" and metrics["config"]["positional"] == "rope"
    assert metrics["n_test"] >= 1000
    assert metrics["train_seconds"] <= 15 * 60
    assert metrics["test_exact_match"] >= 0.95


def test_examples_is_not_an_installed_package():
    """examples/ is a folder of scripts in the checkout; an installed top-level package named `examples`
    would collide with every other project that ships one."""
    import importlib.metadata
    import importlib.util
    from pathlib import Path

    top_level = (importlib.metadata.distribution("transformer-parity").read_text("top_level.txt") or "").split()
    assert "examples" not in top_level and "numpy_transformer" in top_level
    checkout = Path(__file__).resolve().parents[1]
    assert Path(importlib.util.find_spec("examples").origin).resolve().is_relative_to(checkout)


def test_shipped_checkpoint_carries_its_loss_history():
    """Walkthrough 04 draws the shipped checkpoint's real loss curve from the history in its metadata."""
    from numpy_transformer.checkpoint import read_checkpoint

    path = Path(__file__).resolve().parents[1] / "examples" / "data" / "numbers_small.safetensors"
    made = read_checkpoint(path)[3]
    history = json.loads(made["loss_history"])
    steps = int(made["steps"])
    assert history["steps"] == list(range(history["every"], steps + 1, history["every"]))
    assert len(history["train_loss"]) == len(history["steps"]) and len(history["val_loss"]) == len(history["val_steps"])
    assert len(history["val_steps"]) >= 3 and history["val_steps"][-1] == steps
    train, val = np.array(history["train_loss"]), np.array(history["val_loss"])
    assert np.isfinite(train).all() and np.isfinite(val).all()
    assert train[-1] < train[0] / 3 and val[-1] < val[0]


def test_plot_loss_curve_with_validation_losses(tmp_path):
    steps, losses = list(range(1, 101)), list(np.linspace(5.0, 1.0, 100))
    path = tmp_path / "curve.png"
    plotting.plot_loss_curve(steps, losses, path, val_steps=[50, 100], val_losses=[2.0, 0.9], floor=0.8, smooth=False)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="val_losses has 1 points but val_steps has 2"):
        plotting.plot_loss_curve(steps, losses, path, val_steps=[50, 100], val_losses=[2.0])
    with pytest.raises(ValueError, match="not both"):
        plotting.plot_loss_curve(steps, losses, path, val_steps=[50], val_scores=[0.5], val_losses=[2.0])


def test_computation_graph_refuses_overlapping_labels(tmp_path):
    """Two arrows leaving one node at a narrow angle put their labels on each other (walkthrough 01b's graph had
    it): the graph names the clash instead of saving the figure; labels placed apart draw cleanly."""
    nodes = {"X": (0.0, 0.6, "$X$"), "A": (1.6, 1.2, "A"), "B": (1.6, 0.0, "B")}
    crowded = [("X", "A", "X", "(3, 4)"), ("X", "B", "X", "(3, 4)")]
    path = tmp_path / "graph.png"
    with pytest.raises(ValueError, match=r"labels overlap: X->A dX / X->B"):
        plotting.plot_computation_graph(nodes, crowded, path, "crowded", size=(3.0, 2.0))
    assert not path.exists()
    nodes = {"X": (0.0, 1.0, "$X$"), "A": (1.6, 1.0, "A"), "B": (3.2, 1.0, "B")}
    apart = [("X", "A", "X", "(3, 4)"), ("A", "B", "A", "(3, 4)", 0.6)]
    plotting.plot_computation_graph(nodes, apart, path, "apart", size=(4.0, 2.0))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
