"""A tiny tokenizer and language model for the text tests and walkthrough 10, built offline in a second.

    tokenizer_folder(directory)          # tokenizer.json and tokenizer_config.json (ChatML template)
    tiny_lm(directory, "qwen2", seed=0)  # a tiny random Qwen2 / Llama written with save_pretrained beside it

tokenizer.json holds a byte-level BPE trained here on SENTENCES; tokenizer_config.json a ChatML chat template, as
Qwen's checkpoints lay it out.

The BPE starts from the 256 byte symbols (so it encodes any text) and learns merges up to VOCAB_SIZE ids; its
special tokens are SPECIAL (ids 0, 1, 2): END ends a turn and a text, so it is the model's eos.
"""

from __future__ import annotations

import json
from pathlib import Path

SENTENCES = [
    "The cat sat on the mat and looked at the dog.",
    "The dog sat by the door and waited for the cat.",
    "Attention lets every token look at every other token.",
    "A language model predicts the next token from the tokens before it.",
    "Keys and values are cached so that each new token costs one position.",
    "Rotary embeddings turn positions into angles between queries and keys.",
    "Grouped-query attention shares each key and value head between several query heads.",
    "Hello! How are you today? I am fine, thank you.",
]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
END = "<|im_end|>"
VOCAB_SIZE = 384
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer():
    """A byte-level BPE trained on SENTENCES (tokenizers' Tokenizer), VOCAB_SIZE ids, SPECIAL first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )  # fmt: skip
    tokenizer.train_from_iterator(SENTENCES, trainer)
    return tokenizer


def tokenizer_folder(directory) -> Path:
    """Write tokenizer.json and tokenizer_config.json (ChatML template, eos END) into `directory`; return it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    train_tokenizer().save(str(directory / "tokenizer.json"))
    settings = {"eos_token": END, "pad_token": "<|endoftext|>", "chat_template": CHAT_TEMPLATE,
                "tokenizer_class": "PreTrainedTokenizerFast"}  # fmt: skip
    (directory / "tokenizer_config.json").write_text(json.dumps(settings, indent=2))
    return directory


def tiny_lm(directory, family: str = "qwen2", seed: int = 0, **overrides):
    """A tiny random `family` model (parity_tests.hf_compare.build_tiny) with the tokenizer's vocabulary and END as its
    eos, written to `directory` beside the tokenizer; returns the transformers model (evaluation mode)."""
    from parity_tests.hf_compare import build_tiny

    tokenizer_folder(directory)
    end = SPECIAL.index(END)
    settings = dict(vocab_size=VOCAB_SIZE, max_position_embeddings=128, bos_token_id=None, eos_token_id=end,
                    pad_token_id=SPECIAL.index("<|endoftext|>"))  # fmt: skip
    return build_tiny(family, directory, seed=seed, **(settings | overrides))
