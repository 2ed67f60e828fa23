"""Text in and out of a checkpoint, shared by both sides: the tokenizer, the chat template, and the streaming loop
around a side's decoding. Not math: numpy_transformer.text and torch_transformer.text each pass their own decoding.

    tokenizer = load_tokenizer("Qwen/Qwen2.5-0.5B-Instruct")   # or a folder holding tokenizer.json
    ids = tokenizer.encode("The cat")                          # list of int
    tokenizer.decode(ids)                                      # str
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])   # the checkpoint's template

The tokenizer is the checkpoint's tokenizer.json read by the `tokenizers` package (no transformers needed); a folder
without one (a SentencePiece-only checkpoint) is read by transformers' AutoTokenizer when transformers is installed.
The chat template is tokenizer_config.json's `chat_template` (or the chat_template.jinja / chat_template.json file
that newer transformers writes beside it), rendered with jinja2 in a sandbox as transformers renders it (trim_blocks,
lstrip_blocks, the tojson filter without HTML escaping, raise_exception, strftime_now), with the checkpoint's special
tokens (bos_token, eos_token, ...) as variables.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

from .hub import TOKENIZER_FILES, checkpoint_folder

Messages = Sequence[dict]  # [{"role": "system" | "user" | "assistant", "content": str}, ...]


class Tokenizer:
    """A checkpoint's tokenizer: encode, decode, and its chat template (None when the checkpoint has none).

    backend: a tokenizers.Tokenizer, or a transformers tokenizer; special: the special tokens by role
    ({"bos_token": "<s>", "eos_token": "</s>", ...}), the chat template's variables."""

    def __init__(self, backend, chat_template: str | None = None, special: dict | None = None):
        self.backend = backend
        self.chat_template = chat_template
        self.special = dict(special or {})

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids of `text`; add_special_tokens adds what the tokenizer's post-processor adds (Llama 3's bos)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        encoded = self.backend.encode(text, add_special_tokens=add_special_tokens)
        return list(getattr(encoded, "ids", encoded))  # tokenizers: an Encoding; transformers: a list

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Messages, add_generation_prompt: bool = True) -> str:
        """The conversation as the checkpoint's template writes it, ending with the assistant's turn opened
        (add_generation_prompt). ValueError when the checkpoint has no template; TypeError for messages that are
        not a list of {"role": ..., "content": ...}."""
        check_messages(messages)
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template (tokenizer_config.json has no chat_template): "
                             "give a plain prompt (a str) instead of messages")  # fmt: skip
        template = compile_template(self.chat_template)
        return template.render(messages=list(messages), add_generation_prompt=add_generation_prompt, **self.special)

    def prompt_ids(self, prompt: str | Messages) -> list[int]:
        """A prompt's ids: a str encoded as it is (with the tokenizer's own special tokens), or chat messages
        rendered with the chat template and encoded without adding any (the template writes them), as transformers'
        apply_chat_template(tokenize=True) does."""
        if isinstance(prompt, str):
            return self.encode(prompt)
        return self.encode(self.apply_chat_template(prompt), add_special_tokens=False)


def check_messages(messages) -> None:
    """TypeError unless messages is a non-empty list of dicts, each with a str "role" and "content"."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise TypeError(f"messages must be a non-empty list of {{'role': ..., 'content': ...}}, got {messages!r:.80}")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or "content" not in message:
            raise TypeError(f"messages[{i}] must be a dict with a str 'role' and a 'content', got {message!r:.80}")


def compile_template(source: str):
    """A chat template compiled as transformers compiles it (a sandboxed, immutable jinja2 environment)."""
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ValueError('rendering a chat template needs jinja2: pip install "transformer-parity[hub]"') from None

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def load_tokenizer(name_or_path) -> Tokenizer:
    """The tokenizer of a checkpoint folder or Hub id (see the module docstring). ValueError naming the folder when
    it holds neither tokenizer.json nor anything transformers' AutoTokenizer reads."""
    folder = checkpoint_folder(name_or_path, TOKENIZER_FILES + ("tokenizer.model", "vocab.json", "merges.txt"))
    settings = read_json(folder / "tokenizer_config.json")
    special = special_tokens(settings | read_json(folder / "special_tokens_map.json"))
    template = chat_template(folder, settings)
    if (folder / "tokenizer.json").is_file():
        from tokenizers import Tokenizer as Backend

        return Tokenizer(Backend.from_file(str(folder / "tokenizer.json")), template, special)
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ValueError(
            f"{folder}: no tokenizer.json (the tokenizers package reads only that file); reading this tokenizer "
            f"needs transformers' AutoTokenizer: pip install transformers"
        ) from None
    try:
        backend = AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError, TypeError) as error:
        raise ValueError(f"{folder}: no tokenizer.json, and AutoTokenizer cannot read it ({error})") from None
    return Tokenizer(backend, template, special)


def read_json(path: Path) -> dict:
    """A JSON object file as a dict ({} when the file is absent); ValueError naming it when it is not one."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: cannot read it as JSON ({error})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def special_tokens(settings: dict) -> dict:
    """{"bos_token": "<s>", ...}: the *_token entries of tokenizer_config.json / special_tokens_map.json, each a str
    or an AddedToken written as {"content": ...}."""
    found = {}
    for key, value in settings.items():
        if key.endswith("_token") and isinstance(value, dict):
            value = value.get("content")
        if key.endswith("_token") and isinstance(value, str):
            found[key] = value
    return found


def chat_template(folder: Path, settings: dict) -> str | None:
    """The checkpoint's chat template: chat_template.jinja, chat_template.json's, or tokenizer_config.json's (a str,
    or a list of {"name", "template"}: the one named "default"); None when it has none."""
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    template = read_json(folder / "chat_template.json").get("chat_template", settings.get("chat_template"))
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise ValueError(f"{folder}: chat_template must be a str, got {type(template).__name__}")
    return template


class TextStream:
    """Turns generated ids into text as they come: `put(id)` calls `write(piece)` with the text the ids so far add,
    holding it back while it ends in an incomplete character (a byte-level token may carry half a UTF-8 sequence);
    `end()` writes what is left and returns the whole text."""

    def __init__(self, tokenizer: Tokenizer, write: Callable[[str], object] | None):
        self.tokenizer, self.write = tokenizer, write
        self.ids: list[int] = []
        self.written = 0  # characters written so far

    def put(self, token: int) -> None:
        self.ids.append(int(token))
        text = self.tokenizer.decode(self.ids)
        if not text.endswith("\ufffd"):
            self.flush(text)

    def flush(self, text: str) -> None:
        if self.write is not None and len(text) > self.written:
            self.write(text[self.written :])
        self.written = max(self.written, len(text))

    def end(self) -> str:
        text = self.tokenizer.decode(self.ids)
        self.flush(text)
        return text


# decode(model, prompt_ids, max_new_tokens, on_token, **decoding_kwargs) -> None: one side's decoding of one prompt,
# calling on_token(id) for each generated token, eos included, as it is chosen
Decode = Callable[..., None]


def token_streamer(model, on_token, decoding_kwargs: dict):
    """The streamer a side's generate() is given for one prompt: each step's tokens (1,) passed on as an int; None
    when decoding will be a beam search (num_beams > 1, the caller's or else the checkpoint's), which chooses its
    tokens only at the end (generate() refuses a streamer there, as transformers' does)."""
    beams = decoding_kwargs.get("num_beams")
    if beams is None:
        beams = getattr(model.generation_rules, "num_beams", None) or 1
    if beams > 1:
        return None
    return lambda new: on_token(int(new[0]))


def end_tokens(model, decoding_kwargs: dict) -> tuple:
    """The end tokens of one decoding call: the caller's eos_token_id (an id or a list) when given, else the
    model's config.eos_ids."""
    given = decoding_kwargs.get("eos_token_id")
    if given is None:
        return model.config.eos_ids
    return tuple(given) if isinstance(given, (list, tuple)) else (given,)


def replay(tokens: list, eos_ids, on_token) -> None:
    """A beam search's generated tokens passed to on_token one by one, up to and including the first end token (what
    follows it is fill)."""
    for token in tokens:
        on_token(int(token))
        if token in eos_ids:
            return


def generate_text(
    model, tokenizer: Tokenizer, prompt, decode: Decode, max_new_tokens: int, stream=None, **decoding_kwargs
) -> str:
    """The shared body of both sides' generate_text: the prompt's ids (a str as it is; chat messages through the
    chat template), `decode` on them, each new token's text passed to `stream` (a callable taking a str, or None)
    as it comes. Returns the generated text (special tokens such as eos left out)."""
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"tokenizer must be a Tokenizer (load_tokenizer's), got {type(tokenizer).__name__}")
    if stream is not None and not callable(stream):
        raise TypeError(f"stream must be a callable taking each piece of text (print, say) or None, got {stream!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    ids = tokenizer.prompt_ids(prompt)
    if not ids:
        raise ValueError("the prompt encodes to no tokens: give some text")
    decoding_kwargs.setdefault("tokenizer", tokenizer)  # stop strings (the caller's, the checkpoint's) are read on it
    text = TextStream(tokenizer, stream)
    decode(model, ids, max_new_tokens, text.put, **decoding_kwargs)
    return text.end()
