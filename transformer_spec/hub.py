"""A checkpoint by Hub id or by folder, shared by both sides' hf.load and by load_tokenizer.

    folder = checkpoint_folder("Qwen/Qwen2.5-0.5B-Instruct")   # downloaded (or found in the Hub cache) -> a Path
    folder = checkpoint_folder("path/to/checkpoint")            # an existing folder is itself

An existing folder always wins; otherwise a string of the form "org/name" is a Hub id, fetched with the optional
`huggingface_hub` package (`pip install "transformer-parity[hub]"`): only the files our loader and tokenizer read
(WEIGHT_FILES, TOKENIZER_FILES), with huggingface_hub's progress bars, into its cache (HF_HUB_CACHE), which it reads
without the network when HF_HUB_OFFLINE=1. Anything else is returned as a Path, for the loader to say what is
missing there. Not math: plain Python.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# "org/name": the Hub's repository ids (letters, digits, '-', '_', '.'; neither part starts with '.' or '-')
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9_][\w.-]{0,95}")

WEIGHT_FILES = ("config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "config.json",
)


def is_hub_id(name) -> bool:
    """True when `name` is a string of the form "org/name" that is not an existing folder (a folder always wins)."""
    if not isinstance(name, str) or Path(name).expanduser().exists():
        return False
    return HUB_ID.fullmatch(name) is not None and not name.endswith(".") and ".." not in name


def checkpoint_folder(name_or_path, files: tuple[str, ...] = WEIGHT_FILES + TOKENIZER_FILES) -> Path:
    """The folder of a checkpoint: `name_or_path` itself when it is a folder (or not a Hub id: the loader then says
    what is missing there), else the Hub id's snapshot, fetched (only `files`, glob patterns) or found in the cache.

    TypeError for something that is neither a string nor a path; ValueError naming the id when huggingface_hub is
    not installed, or when the Hub (or the cache, offline) does not have it."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"expected a checkpoint folder or a Hub id (str or path), got {type(name_or_path).__name__}")
    if not is_hub_id(name_or_path):
        return Path(name_or_path).expanduser()
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ValueError(
            f"{name_or_path!r} is not a folder here, and reading it from the Hugging Face Hub needs huggingface_hub: "
            f'pip install "transformer-parity[hub]" (or give the path of a downloaded checkpoint folder)'
        ) from None
    try:
        return Path(snapshot_download(str(name_or_path), allow_patterns=list(files)))
    except Exception as error:  # huggingface_hub's own errors (not found, offline, gated, network): said by id
        offline = " (HF_HUB_OFFLINE is set: only the local cache is read)" if os.environ.get("HF_HUB_OFFLINE") else ""
        raise ValueError(
            f"{name_or_path!r} is not a folder here and could not be read from the Hugging Face Hub{offline}: "
            f"{type(error).__name__}: {error}"
        ) from None
