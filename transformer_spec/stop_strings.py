"""Stop strings: a row stops once its text ends with one of them, as transformers' StopStringCriteria decides.

    stop = StopStrings(("\\n\\n", "User:"), tokenizer)   # text.Tokenizer, or a transformers tokenizer
    stop.hits([[5, 17, 9], [4, 4, 2]])                # [False, True]: which rows stop after their last token

A stop string matches when it occurs in the text of the row's last tokens and ends inside the text of the very last
one (it may start anywhere before): tokens ["st", "op"], ["las", "topper"] or ["xstopy"] stop at "stop"; ["stop",
"at"] does not, since the match ends before the last token (that token was checked when it came). Each token's text
is what the tokenizer's decoder makes of it after a fixed prefix ("abcdef"), so a "Ġ" or "▁" word start reads as a
space, and a byte-level vocabulary (GPT-2's, Llama 3's) or SentencePiece's byte tokens ("<0x0A>") compare bytes, not
characters, so that a character split over two tokens is still found. Only the last max(len(stop string)) tokens are
looked at (transformers' window; every token has a text of one character or more, so a match fits in it). A token id
the tokenizer does not know matches nothing. Plain Python lists: both sides hand their rows over as lists.
"""

from __future__ import annotations

import json

from .text import Tokenizer

PREFIX = "abcdef"  # decoded before each token so that the decoder treats it as a token inside a text


class StopStrings:
    """The stop strings (a tuple of str) read against a tokenizer's vocabulary: each token id's text, as str, or as
    bytes when the tokenizer's decoder works on bytes."""

    def __init__(self, stop_strings: tuple, tokenizer):
        self.stop_strings = stop_strings
        backend = tokenizer_api(tokenizer)
        self.mode = matching_mode(backend.decoder)
        self.targets = tuple(s.encode("utf-8") if self.mode else s for s in stop_strings)
        self.texts = token_texts(backend, self.mode)  # token id -> str or bytes
        self.window = max(len(s) for s in self.targets)

    def hits(self, rows: list[list[int]]) -> list[bool]:
        """For each row of token ids, whether a stop string ends inside the text of its last token."""
        return [self.row_hits(row[-self.window :]) for row in rows]

    def row_hits(self, ids: list[int]) -> bool:
        texts: list = [self.texts.get(i) for i in ids]
        if texts[-1] is None:
            return False
        known: list = (
            texts[len(texts) - texts[::-1].index(None) :] if None in texts else texts
        )  # after the last unknown id
        empty = b"" if self.mode else ""
        text = empty.join(known)
        last_start = len(text) - len(known[-1])  # where the last token's text starts
        for target in self.targets:
            at = text.find(target)
            while at >= 0:
                if last_start < at + len(target):  # ends inside the last token (it ends within text by construction)
                    return True
                at = text.find(target, at + 1)
        return False


class TokenizerAPI:
    """The four things stop strings read from a tokenizer, whichever library it comes from."""

    def __init__(self, vocab: dict, prefix_tokens: list, to_string, decoder):
        self.vocab = vocab  # token -> id
        self.prefix_tokens = prefix_tokens  # PREFIX's tokens
        self.to_string = to_string  # list of tokens -> text
        self.decoder = decoder  # the tokenizers decoder, or None


def tokenizer_api(tokenizer) -> TokenizerAPI:
    """A TokenizerAPI from transformer_spec.text.Tokenizer (its `tokenizers` backend, or the transformers tokenizer
    it wraps) or a transformers tokenizer. TypeError for anything else."""
    backend = tokenizer.backend if isinstance(tokenizer, Tokenizer) else tokenizer
    if hasattr(backend, "convert_tokens_to_string") and hasattr(backend, "get_vocab"):  # transformers
        prefix = backend.convert_ids_to_tokens(backend(PREFIX, add_special_tokens=False)["input_ids"])
        decoder = getattr(getattr(backend, "backend_tokenizer", None), "decoder", None)
        return TokenizerAPI(backend.get_vocab(), prefix, backend.convert_tokens_to_string, decoder)
    if hasattr(backend, "id_to_token") and hasattr(backend, "get_vocab"):  # a tokenizers.Tokenizer
        decoder = backend.decoder

        def to_string(tokens: list) -> str:
            return decoder.decode(tokens) if decoder is not None else " ".join(tokens)

        prefix = [backend.id_to_token(i) for i in backend.encode(PREFIX, add_special_tokens=False).ids]
        return TokenizerAPI(backend.get_vocab(with_added_tokens=True), prefix, to_string, decoder)
    raise TypeError(
        "tokenizer must be a transformer_spec.text.Tokenizer or a transformers tokenizer, "
        f"got {type(tokenizer).__name__}"
    )


def matching_mode(decoder) -> str | None:
    """ "byte_level" (GPT-2's byte-to-character table), "byte_fallback" (SentencePiece's "<0xAB>" tokens) or None
    (characters), from the tokenizer's decoder, as transformers decides it."""
    if decoder is None:
        return None
    if type(decoder).__name__ == "ByteLevel":
        return "byte_level"
    state = getattr(decoder, "__getstate__", lambda: None)()
    try:
        description = json.loads(state) if isinstance(state, (str, bytes)) else None
    except json.JSONDecodeError:
        description = None
    if has_type(description, "ByteFallback"):
        return "byte_fallback"
    if has_type(description, "ByteLevel"):
        return "byte_level"
    return None


def has_type(description, name: str) -> bool:
    """Whether a decoder's JSON description (nested dicts and lists) holds a part of type `name`."""
    if isinstance(description, dict):
        return description.get("type") == name or any(has_type(v, name) for v in description.values())
    if isinstance(description, list):
        return any(has_type(v, name) for v in description)
    return False


def byte_characters() -> dict:
    """GPT-2's byte-level alphabet read backwards: character -> byte. The printable bytes ("!".."~", "¡".."¬",
    "®".."ÿ") stand for themselves; the other 68, in order, for the characters from chr(256) on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable}
    table |= {chr(256 + n): b for n, b in enumerate(others)}
    return table


def token_texts(api: TokenizerAPI, mode: str | None) -> dict:
    """Every token id's text: in byte_level mode a token of the byte alphabet is its bytes; in byte_fallback mode a
    "<0xAB>" token is its byte; any other token is what the decoder writes for it after PREFIX (utf-8 bytes in the
    byte modes)."""
    characters = byte_characters() if mode == "byte_level" else {}
    texts: dict = {}
    for token, index in api.vocab.items():
        if mode == "byte_level" and token and all(c in characters for c in token):
            texts[index] = bytes(characters[c] for c in token)
            continue
        if mode == "byte_fallback" and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            try:
                texts[index] = bytes([int(token[3:5], 16)])
                continue
            except ValueError:
                pass
        text = api.to_string(api.prefix_tokens + [token])
        text = text[text.index(PREFIX) + len(PREFIX) :]
        texts[index] = text.encode("utf-8") if mode else text
    return texts
