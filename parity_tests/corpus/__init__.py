"""Whole models written the way people publish them, each with mistakes put in on purpose: the judge's corpus.

Each file is one style (nanoGPT, minGPT, the Annotated Transformer, a Llama-style single file, PyTorch's
nn.TransformerEncoder tutorial, d2l, Hugging Face-style BERT and GPT-2 returning ModelOutputs, a bentrevett-style
seq2seq, a "large language model from scratch" book's GPT, a timm Vision Transformer's blocks, a Phi-3 with fused
projections), written here from what those styles look like, not copied. A file reads like a user's own (it
imports torch, and transformers for the Hugging Face styles; never the judge), and gives

- `model()`: a zero-argument factory for the clean model (tiny sizes, seeded);
- `LEVEL`: the reference it is judged as, `check.module(model(), LEVEL, call=CALL)` with nothing else;
- `ALSO_CLEAN` (optional): other factories of models that are right and must pass (another code path);
- `CALL`: the author's own call where masks come from the caller (their helpers build them), else None;
- `MISTAKES`: `(factory, id, where)` triples: a zero-argument factory for the same model with one mistake put in,
  the catalogue id the judge must name first, and the user's submodule where it must name it. That submodule is
  the innermost module holding weights or tables (parameters, buffers, tensor attributes) whose own code holds the
  mistaken line (d2l's DotProductAttention holds none: its MultiHeadAttention is named), or, for a mistake made
  outside every such module (a mask built by the model's forward), the first of them whose output it changes.

`parity_tests/test_corpus.py` runs the judge on every one of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

STYLES = (
    "nanogpt",
    "mingpt",
    "annotated",
    "llama",
    "pytorch_tutorial",
    "d2l",
    "hf_style",
    "bentrevett",
    "hf_gpt",
    "llms_from_scratch",
    "book_gpt",
    "lecture_gpt",
    "qwen3",
    "jadore",
    "word_language_model",
    "hf_marian",
    "hf_bart",
    "timm_vit",
    "phi3",
)


@dataclass(frozen=True)
class Mistake:
    """One injected mistake: the factory of the model that holds it, its catalogue id, the submodule it sits in."""

    style: str
    factory: Callable
    id: str
    where: str

    @property
    def name(self) -> str:
        return f"{self.style}.{self.factory.__name__}"


def load(style: str) -> ModuleType:
    """The corpus file of `style` (one of STYLES), imported."""
    if style not in STYLES:
        raise ValueError(f"style must be one of {', '.join(STYLES)}; got {style!r}")
    return importlib.import_module(f"{__name__}.{style}")


def clean(style: str) -> list[Callable]:
    """The factories of the clean models of `style`: `model`, then any ALSO_CLEAN."""
    corpus = load(style)
    return [corpus.model, *getattr(corpus, "ALSO_CLEAN", [])]


def mistakes(style: str) -> list[Mistake]:
    """The mistakes put into the model of `style`."""
    return [Mistake(style, *entry) for entry in load(style).MISTAKES]
