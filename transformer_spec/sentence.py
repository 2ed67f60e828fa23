"""A sentence-transformers folder read as data, shared by both sides: which modules follow the transformer (Pooling
with its modes, Dense layers, Normalize), the prompts, and the tokenizer as `SentenceTransformer.encode` calls it.
No math here: numpy_transformer.sentence and torch_transformer.sentence compute the embeddings.

    folder = read_folder("all-MiniLM-L6-v2/")
    folder.pooling.modes             # ("mean",)
    batch = folder.tokenizer.batch(["A cat.", "Hello!"], prompt=None)
    batch.ids, batch.attention_mask  # (B, T) each, padded to the longest text

What is read, and how sentence-transformers (6.x) reads it:

- modules.json: the modules in order, each a folder (`path`) and a class (`type`, its last word decides:
  Transformer, Pooling, Dense, Normalize). The Transformer comes first and only once; any other module is refused.
- The Transformer's folder: config.json and model.safetensors (the backbone: `hf.load`), tokenizer.json (read with
  the `tokenizers` package), tokenizer_config.json (the special tokens, `model_max_length`, `padding_side`) and
  sentence_bert_config.json (`max_seq_length`, which wins over `model_max_length`, as sentence-transformers passes it
  to the tokenizer; `do_lower_case` true is refused).
- Pooling's config.json: `pooling_mode` (a mode or a list; the files sentence-transformers 6 writes) or the older
  booleans `pooling_mode_cls_token`, ... (the modes read in the fixed order cls, max, mean, mean_sqrt_len_tokens,
  weightedmean, lasttoken; none true means mean), and `include_prompt` (default true).
- Dense's config.json (`in_features`, `out_features`, `bias`, `activation_function` as a torch class path,
  default Tanh, `use_residual`) and model.safetensors (`linear.weight`, `linear.bias`, `residual.weight`).
- config_sentence_transformers.json: `prompts` ({name: text}) and `default_prompt_name`.

The tokenizer pads each batch to its longest text and truncates at the maximum length, as transformers' tokenizer
does with padding=True and truncation="longest_first" (the folder's tokenizer.json may pad to a fixed length: that
setting is replaced). A prompt is prepended to each text; its length in tokens, for pooling that leaves the prompt
out, is that of the prompt tokenized alone, less a trailing special token ([SEP], </s>), so it counts the leading
[CLS] or <s>.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Pooling modes in the order sentence-transformers concatenates the old boolean keys.
LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
POOLING_MODES = tuple(LEGACY_POOLING_KEYS.values())

# Dense activations: the torch class path a config.json names -> our name (each side has the pair or module).
ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.GELU": "gelu",
    "torch.nn.modules.activation.SiLU": "silu",
}
DEFAULT_ACTIVATION = "torch.nn.modules.activation.Tanh"  # Dense's default when the config names none

MODULE_KINDS = ("Transformer", "Pooling", "Dense", "Normalize")


@dataclass(frozen=True)
class PoolingSpec:
    name: str  # the module's name in modules.json ("1")
    modes: tuple[str, ...]  # ("mean",), ("cls", "mean"), ...: concatenated in this order
    include_prompt: bool  # False: the prompt's tokens are left out of the pooling
    dimension: int  # the token embeddings' width D


@dataclass(frozen=True)
class DenseSpec:
    name: str  # the module's name in modules.json ("2"): its parameters are "{name}.linear.weight", ...
    in_features: int
    out_features: int
    bias: bool
    activation: str  # a key of ACTIVATIONS' values: "identity", "tanh", ...
    use_residual: bool
    weights: dict  # "linear.weight" (out, in), "linear.bias" (out,), "residual.weight" (out, in): NumPy arrays


@dataclass(frozen=True)
class NormalizeSpec:
    name: str


@dataclass(frozen=True)
class Batch:
    ids: np.ndarray  # (B, T) int64
    attention_mask: np.ndarray  # (B, T) int64, 1 = a real token
    token_type_ids: np.ndarray  # (B, T) int64
    prompt_length: int  # tokens of the prompt at the start of each text (its [CLS] included); 0: no prompt


class SentenceTokenizer:
    """The folder's tokenizer as sentence-transformers calls it: `batch(texts, prompt)` pads to the longest text,
    truncates at max_length and measures the prompt."""

    def __init__(self, backend, max_length: int | None, special_ids: set[int], pad_id: int, pad_token: str, side: str):
        self.backend = backend  # a tokenizers.Tokenizer, padding and truncation set here
        self.max_length = max_length
        self.special_ids = special_ids
        self.pad_id = pad_id
        backend.no_padding()
        backend.no_truncation()
        if max_length is not None:
            backend.enable_truncation(max_length=max_length, strategy="longest_first")
        backend.enable_padding(pad_id=pad_id, pad_token=pad_token, direction=side)  # to the longest of a batch
        self._prompt_lengths: dict[str, int] = {}

    def prompt_length(self, prompt: str) -> int:
        """The prompt's tokens as sentence-transformers counts them: the prompt tokenized alone, less its last
        token when that one is special (the [SEP] or </s> that closes it)."""
        if prompt not in self._prompt_lengths:
            ids = self.backend.encode(prompt).ids
            self._prompt_lengths[prompt] = len(ids) - (1 if ids and ids[-1] in self.special_ids else 0)
        return self._prompt_lengths[prompt]

    def batch(self, texts, prompt: str | None = None) -> Batch:
        """texts (a list of str), each after `prompt` when one is given -> ids, attention mask and token types,
        (B, T) each, padded to the longest."""
        texts = check_texts(texts)
        if not texts:
            raise ValueError("texts must hold at least one text to tokenize, got an empty list")
        if prompt:  # an empty prompt is no prompt, as in sentence-transformers
            texts = [prompt + text for text in texts]
        encodings = self.backend.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)  # (B, T)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)  # (B, T)
        types = np.array([e.type_ids for e in encodings], dtype=np.int64)  # (B, T)
        return Batch(ids, mask, types, self.prompt_length(prompt) if prompt else 0)


@dataclass(frozen=True)
class SentenceFolder:
    path: Path
    transformer_path: Path  # the backbone's folder (config.json, model.safetensors)
    modules: tuple  # PoolingSpec, DenseSpec and NormalizeSpec, in the order they run after the transformer
    prompts: dict  # name -> text
    default_prompt_name: str | None
    tokenizer: SentenceTokenizer

    def resolve_prompt(self, prompt_name: str | None) -> str | None:
        """The text of prompt `prompt_name`; None: the default prompt, if the folder names one."""
        if prompt_name is None:
            return None if self.default_prompt_name is None else self.prompts.get(self.default_prompt_name)
        if not isinstance(prompt_name, str):
            raise TypeError(f"prompt_name must be a str or None, got {type(prompt_name).__name__}")
        if prompt_name not in self.prompts:
            raise ValueError(f"prompt_name {prompt_name!r} is not among the folder's prompts {sorted(self.prompts)}")
        return self.prompts[prompt_name]

    @property
    def pooling(self) -> PoolingSpec:
        return next(m for m in self.modules if isinstance(m, PoolingSpec))


def check_texts(texts) -> list[str]:
    """A list of str; TypeError for a bare str (pass [text]) or anything else."""
    if isinstance(texts, str):
        raise TypeError(f"texts must be a list of str; got a single str {texts!r:.60} (pass [text])")
    if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
        raise TypeError(f"texts must be a list of str, got {texts!r:.80}")
    return list(texts)


def length_order(texts: list[str]) -> np.ndarray:
    """The order sentence-transformers encodes texts in: longest first, by characters (np.argsort of minus the
    lengths, as it calls it, so ties fall the same way). Batches are cut from this order."""
    return np.argsort([-len(text) for text in texts])


def read_json(path: Path, default=None):
    if not path.is_file():
        if default is not None:
            return default
        raise ValueError(f"{path}: missing (a sentence-transformers folder needs it)")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: not readable JSON ({error})") from None


def read_folder(folder) -> SentenceFolder:
    """Read a sentence-transformers folder (see the module docstring). ValueError naming the file and what it
    found for anything it does not compute: a module other than Transformer, Pooling, Dense or Normalize, a pooling
    mode it does not know, a Dense activation outside ACTIVATIONS, weights that do not fit the config."""
    path = Path(folder)
    if not path.is_dir():
        raise ValueError(f"folder {str(folder)!r} is not a directory (a sentence-transformers folder)")
    entries = read_json(path / "modules.json")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path / 'modules.json'}: expected a list of modules, got {entries!r:.80}")
    kinds = [str(entry.get("type", "")).rsplit(".", 1)[-1] for entry in entries]
    unknown = [k for k in kinds if k not in MODULE_KINDS]
    if unknown or kinds[0] != "Transformer" or kinds.count("Transformer") != 1:
        raise ValueError(f"{path / 'modules.json'}: modules {kinds}; supported: one Transformer first, then Pooling, "
                         f"Dense and Normalize")  # fmt: skip
    if kinds.count("Pooling") != 1 or kinds.index("Pooling") != 1:
        raise ValueError(f"{path / 'modules.json'}: modules {kinds}; expected one Pooling right after the Transformer")
    transformer_path = path / entries[0].get("path", "")
    modules: list = []
    for entry, kind in zip(entries[1:], kinds[1:], strict=True):
        name, where = str(entry.get("name", entry.get("idx"))), path / entry.get("path", "")
        if kind == "Pooling":
            modules.append(read_pooling(name, where))
        elif kind == "Dense":
            modules.append(read_dense(name, where))
        else:
            modules.append(NormalizeSpec(name))
    settings = read_json(path / "config_sentence_transformers.json", default={})
    prompts = dict(settings.get("prompts") or {})
    default_prompt_name = settings.get("default_prompt_name")
    if default_prompt_name is not None and default_prompt_name not in prompts:
        raise ValueError(f"{path / 'config_sentence_transformers.json'}: default_prompt_name {default_prompt_name!r} "
                         f"is not among its prompts {sorted(prompts)}")  # fmt: skip
    tokenizer = read_tokenizer(transformer_path)
    return SentenceFolder(path, transformer_path, tuple(modules), prompts, default_prompt_name, tokenizer)


def read_pooling(name: str, where: Path) -> PoolingSpec:
    config = read_json(where / "config.json")
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    else:
        modes = tuple(m for key, m in LEGACY_POOLING_KEYS.items() if config.get(key, False)) or ("mean",)
    bad = [m for m in modes if m not in POOLING_MODES]
    if bad or not modes:
        raise ValueError(f"{where / 'config.json'}: pooling modes {list(modes)}; supported: {list(POOLING_MODES)}")
    dimension = config.get("embedding_dimension", config.get("word_embedding_dimension"))
    return PoolingSpec(name, modes, bool(config.get("include_prompt", True)), int(dimension))


def read_dense(name: str, where: Path) -> DenseSpec:
    config = read_json(where / "config.json")
    activation = config.get("activation_function", DEFAULT_ACTIVATION)
    if activation not in ACTIVATIONS:
        raise ValueError(f"{where / 'config.json'}: activation_function {activation!r}; supported: "
                         f"{sorted(ACTIVATIONS)}")  # fmt: skip
    if config.get("module_input_name", "sentence_embedding") != "sentence_embedding" or config.get(
        "module_output_name", "sentence_embedding"
    ) not in (None, "sentence_embedding"):
        raise ValueError(f"{where / 'config.json'}: a Dense reading or writing other than the sentence embedding")
    file = where / "model.safetensors"
    if not file.is_file():
        raise ValueError(f"{file}: missing (a Dense layer's weights are read from safetensors only)")
    from safetensors.numpy import load_file

    weights = load_file(str(file))
    n_in, n_out, bias = int(config["in_features"]), int(config["out_features"]), bool(config.get("bias", True))
    use_residual = bool(config.get("use_residual", False))
    expected: dict[str, tuple[int, ...]] = {"linear.weight": (n_out, n_in)}
    if bias:
        expected["linear.bias"] = (n_out,)
    if use_residual and n_in != n_out:
        expected["residual.weight"] = (n_out, n_in)
    found = {k: tuple(v.shape) for k, v in weights.items()}
    if found != expected:
        raise ValueError(f"{file}: tensors {found}, expected {expected} from its config.json")
    return DenseSpec(name, n_in, n_out, bias, ACTIVATIONS[activation], use_residual, weights)


def read_tokenizer(folder: Path) -> SentenceTokenizer:
    from tokenizers import Tokenizer

    file = folder / "tokenizer.json"
    if not file.is_file():
        raise ValueError(f"{file}: missing (the tokenizer is read from tokenizer.json with the tokenizers package)")
    backend = Tokenizer.from_file(str(file))
    settings = read_json(folder / "tokenizer_config.json", default={}) | read_json(
        folder / "special_tokens_map.json", default={}
    )
    st_config = read_json(folder / "sentence_bert_config.json", default={})
    if st_config.get("do_lower_case"):
        raise ValueError(f"{folder / 'sentence_bert_config.json'}: do_lower_case true is not supported")
    max_length = st_config.get("max_seq_length", settings.get("model_max_length"))
    if max_length is not None and max_length >= 10**18:  # transformers' "no limit" (VERY_LARGE_INTEGER)
        max_length = None
    special = {i for i, token in backend.get_added_tokens_decoder().items() if token.special}
    for role in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        token = token_text(settings.get(role))
        token_id = None if token is None else backend.token_to_id(token)
        if token_id is not None:
            special.add(token_id)
    padding = backend.padding or {}
    pad_token = token_text(settings.get("pad_token")) or padding.get("pad_token")
    pad_id = backend.token_to_id(pad_token) if pad_token is not None else None
    if pad_token is None or pad_id is None:
        raise ValueError(f"{folder}: no pad token (tokenizer_config.json's pad_token, or tokenizer.json's padding)")
    side = settings.get("padding_side", "right")
    if side not in ("right", "left"):
        raise ValueError(f"{folder / 'tokenizer_config.json'}: padding_side {side!r}, expected 'right' or 'left'")
    return SentenceTokenizer(backend, None if max_length is None else int(max_length), special, pad_id, pad_token, side)


def token_text(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a str, or a dict with its "content"."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None
