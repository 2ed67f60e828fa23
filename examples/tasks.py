"""Small sequence-to-sequence tasks to train the Transformer on, generated locally and deterministically.

Everything a training script needs on the data side, in NumPy and the standard library only:

* `Vocab`: tokens <-> ids, with `<pad>`=0, `<bos>`=1, `<eos>`=2 first (the ids `TransformerConfig`
  expects by default), then the task's tokens in sorted order. A vocabulary also knows how its text
  is split into tokens (`level="char"` or `level="word"`), so one pipeline serves every task.
* Numbers to words, the task of the UPC "Build your own Transformer" lab: `number_to_words("29,284.30")
  == "twenty-nine thousand two hundred eighty-four point three zero"`. `make_numbers_dataset` samples
  train / val / test splits with no number shared between them, `build_vocabs` builds the vocabularies
  from the converter's own tables (so no word of the test split is ever out of vocabulary).
* Batching: `encode_batch` turns (source, target) text pairs into padded int64 arrays
  (`src_ids`, `tgt_in`, `tgt_out`), `batches` shuffles an epoch and groups examples of similar length.
* The same pairs for a decoder-only language model: `build_lm_vocab` (one vocabulary for the source
  symbols and the target words) and `encode_lm_batch` (the number's characters, `<bos>`, then the words,
  with the loss on the words only).
* Toys that train in seconds: `ENGLISH_SPANISH` (eight sentence pairs) and `make_copy_task`
  (copy or reverse a random token sequence).
* Evaluation: `exact_match` and `token_accuracy` of decoded predictions against `tgt_out`.

A training step, end to end::

    splits = make_numbers_dataset(20_000, 1_000, 1_000, seed=0)
    src_vocab, tgt_vocab = build_vocabs(splits.train)
    rng = np.random.default_rng(0)
    for epoch in range(n_epochs):
        for batch in batches(splits.train, 64, rng):
            src_ids, tgt_in, tgt_out = encode_batch(batch, src_vocab, tgt_vocab)
            logits = model.forward(src_ids, tgt_in)                   # (B, T, V)
            loss, cache = cross_entropy_forward(logits, tgt_out, ignore_index=tgt_vocab.pad_id)
            ...
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import numpy as np

__all__ = [
    "BOS",
    "ENGLISH_SPANISH",
    "EOS",
    "MAX_NUMBER",
    "NUMBER_SOURCE_SYMBOLS",
    "PAD",
    "SPECIAL_TOKENS",
    "Splits",
    "Vocab",
    "batches",
    "build_lm_vocab",
    "build_vocabs",
    "copy_task_vocab",
    "encode_batch",
    "encode_lm_batch",
    "english_spanish_vocabs",
    "exact_match",
    "make_copy_task",
    "make_numbers_dataset",
    "max_lengths",
    "number_target_words",
    "number_to_words",
    "token_accuracy",
    "vocabs_from_pairs",
]

# ----------------------------------------------------------------------------------------------------
# Vocabulary
# ----------------------------------------------------------------------------------------------------

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIAL_TOKENS = (PAD, BOS, EOS)  # ids 0, 1, 2: TransformerConfig's pad_id, bos_id, eos_id
LEVELS = ("char", "word")


class Vocab:
    """A fixed mapping between tokens (strings) and ids (ints).

    Ids 0, 1, 2 are `<pad>`, `<bos>`, `<eos>`; the task's tokens follow in sorted order, so the same
    token set always gives the same ids, whatever order the tokens were seen in.

    `level` says how a text of this vocabulary is cut into tokens: `"char"` (every character is a
    token: "29,284" -> ["2", "9", ",", "2", "8", "4"]) or `"word"` (split on spaces:
    "twenty-nine thousand" -> ["twenty-nine", "thousand"]).

    >>> v = Vocab(["b", "a"], level="word")
    >>> v.tokens
    ['<pad>', '<bos>', '<eos>', 'a', 'b']
    >>> v.encode("b a", add_bos=True)
    [1, 4, 3, 2]
    >>> v.decode([1, 4, 3, 2, 0, 0])
    ['b', 'a']
    """

    # Ids of the special tokens, named as in TransformerConfig.
    pad_id = 0
    bos_id = 1
    eos_id = 2

    def __init__(self, tokens: Iterable[str], level: str = "word") -> None:
        if level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
        tokens = list(tokens)
        for token in tokens:
            if not isinstance(token, str) or token == "":
                raise ValueError(f"tokens must be non-empty strings, got {token!r}")
            if token in SPECIAL_TOKENS:
                raise ValueError(f"{token!r} is a special token; it is added by Vocab itself")
            if level == "char" and len(token) != 1:
                raise ValueError(f"a char-level vocabulary holds single characters, got {token!r}")
            if level == "word" and any(c.isspace() for c in token):
                raise ValueError(f"a word-level token cannot contain whitespace, got {token!r}")
        self.level = level
        self.tokens: list[str] = list(SPECIAL_TOKENS) + sorted(set(tokens))
        self._ids = {token: i for i, token in enumerate(self.tokens)}

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: object) -> bool:
        return token in self._ids

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Vocab):
            return NotImplemented
        return self.level == other.level and self.tokens == other.tokens

    def __hash__(self) -> int:
        return hash((self.level, tuple(self.tokens)))

    def __repr__(self) -> str:
        return f"Vocab(size={len(self)}, level={self.level!r})"

    def tokenize(self, text: str) -> list[str]:
        """Cut a text into this vocabulary's tokens (characters, or words split on single spaces)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return list(text) if self.level == "char" else text.split()

    def detokenize(self, tokens: Sequence[str]) -> str:
        """The inverse of `tokenize`: join characters, or words with spaces."""
        return ("" if self.level == "char" else " ").join(tokens)

    def id_of(self, token: str) -> int:
        """The id of one token; ValueError names the token when it is not in the vocabulary."""
        try:
            return self._ids[token]
        except KeyError:
            raise ValueError(f"token {token!r} is not in the vocabulary ({len(self)} tokens)") from None

    def encode(self, tokens: Sequence[str] | str, add_bos: bool = False, add_eos: bool = True) -> list[int]:
        """Token ids of `tokens` (a list of tokens, or a text that is tokenized first).

        `add_bos` puts `<bos>` in front (a decoder input), `add_eos` appends `<eos>` (an encoder input,
        a decoder target). Unknown tokens raise ValueError: the tasks here have no `<unk>`.
        """
        if isinstance(tokens, str):
            tokens = self.tokenize(tokens)
        ids = [self.id_of(token) for token in tokens]
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Tokens of `ids` for display: stops at the first `<eos>`, skips `<pad>` and `<bos>`."""
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.tokens):
                raise ValueError(f"id {i} is out of range for a vocabulary of {len(self)} tokens")
            if i == self.eos_id:
                break
            if i in (self.pad_id, self.bos_id):
                continue
            out.append(self.tokens[i])
        return out

    def to_dict(self) -> dict:
        """A JSON-able description, to save next to a checkpoint; `Vocab.from_dict` reads it back."""
        return {"level": self.level, "tokens": list(self.tokens)}

    @classmethod
    def from_dict(cls, data: dict) -> Vocab:
        """Rebuild a vocabulary saved by `to_dict`, checking that every id comes back the same."""
        tokens = list(data["tokens"])
        if tuple(tokens[: len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise ValueError(f"a saved vocabulary must start with {SPECIAL_TOKENS}, got {tokens[:3]}")
        vocab = cls(tokens[len(SPECIAL_TOKENS) :], level=data.get("level", "word"))
        if vocab.tokens != tokens:
            raise ValueError("saved tokens are not unique and sorted after the special tokens; ids would change")
        return vocab


def vocabs_from_pairs(pairs: Iterable[tuple[str, str]], src_level: str = "word", tgt_level: str = "word"):
    """Source and target vocabularies holding every token that occurs in `pairs` (for the toy tasks,
    whose data *is* the whole task). Returns (src_vocab, tgt_vocab)."""
    pairs = list(pairs)
    src_vocab = Vocab([], level=src_level)  # only used to tokenize
    tgt_vocab = Vocab([], level=tgt_level)
    src_tokens = {t for src, _ in pairs for t in src_vocab.tokenize(src)}
    tgt_tokens = {t for _, tgt in pairs for t in tgt_vocab.tokenize(tgt)}
    return Vocab(src_tokens, level=src_level), Vocab(tgt_tokens, level=tgt_level)


# ----------------------------------------------------------------------------------------------------
# Numbers to words
# ----------------------------------------------------------------------------------------------------

MAX_NUMBER = 999_999_999  # the converter reads integer parts 0 .. MAX_NUMBER

ONES = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
    "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
)  # fmt: skip
TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
HUNDRED = "hundred"
SCALES = ((1_000_000, "million"), (1_000, "thousand"))  # largest first
POINT = "point"

# The source alphabet: digits, the thousands separator and the decimal point.
NUMBER_SOURCE_SYMBOLS = tuple("0123456789") + (",", ".")

# "0", or 1-3 digits without a leading zero followed by comma groups of exactly three digits;
# then optionally "." and at least one digit. [0-9], not \d: \d also matches other scripts' digits.
_NUMBER_RE = re.compile(r"(0|[1-9][0-9]{0,2}(?:,[0-9]{3})*)(?:\.([0-9]+))?")


def _below_thousand(n: int) -> list[str]:
    """Words of 1 <= n <= 999: "seven hundred seventy-seven" -> ["seven", "hundred", "seventy-seven"]."""
    words = []
    hundreds, rest = divmod(n, 100)
    if hundreds:
        words += [ONES[hundreds], HUNDRED]
    if rest >= 20:
        tens, units = divmod(rest, 10)
        words.append(TENS[tens] + (f"-{ONES[units]}" if units else ""))  # "twenty-nine" is one token
    elif rest:
        words.append(ONES[rest])
    return words


def _integer_words(n: int) -> list[str]:
    """Words of an integer 0 <= n <= MAX_NUMBER, American style (no "and")."""
    if n == 0:
        return [ONES[0]]
    words = []
    for scale, name in SCALES:
        group, n = divmod(n, scale)
        if group:  # a zero group says nothing: 2,000,001 -> "two million one"
            words += _below_thousand(group) + [name]
    if n:
        words += _below_thousand(n)
    return words


def number_to_words(text: str) -> str:
    """Read a number written with digits in English words.

    The input has thousands separators (a comma before every group of three digits, required from
    1,000 on) and an optional decimal part; the integer part is 0 .. 999,999,999. Decimals are read
    digit by digit after "point". American English: no "and"; tens and units are joined by a hyphen
    into one word.

    >>> number_to_words("29,284.30")
    'twenty-nine thousand two hundred eighty-four point three zero'
    >>> number_to_words("1,001")
    'one thousand one'
    >>> number_to_words("3.05")
    'three point zero five'

    Raises TypeError for a non-string and ValueError for malformed text ("1,23", "12,", ".5", "1.",
    "1234", "007", "-3", " 5", "12a") or a number above 999,999,999.
    """
    if not isinstance(text, str):
        raise TypeError(f"number_to_words takes a str, got {type(text).__name__}")
    match = _NUMBER_RE.fullmatch(text)
    if match is None:
        raise ValueError(
            f"malformed number {text!r}: expected digits with a comma before every group of three "
            "(e.g. '29,284'), no leading zeros, and an optional '.' followed by at least one digit"
        )
    integer_part, decimals = match.groups()
    value = int(integer_part.replace(",", ""))
    if value > MAX_NUMBER:
        raise ValueError(f"number {text!r} is out of range: the integer part must be at most {MAX_NUMBER:,}")
    words = _integer_words(value)
    if decimals is not None:
        words += [POINT] + [ONES[int(d)] for d in decimals]
    return " ".join(words)


def number_target_words() -> list[str]:
    """Every word `number_to_words` can produce, enumerated from its tables (sorted).

    ONES (zero .. nineteen), TENS (twenty .. ninety), each tens-units compound ("twenty-one" ..
    "ninety-nine"), "hundred", the scale words and "point": 20 + 8 + 72 + 1 + 2 + 1 = 104 words.
    """
    words = set(ONES) | {t for t in TENS if t}
    words |= {f"{TENS[t]}-{ONES[u]}" for t in range(2, 10) for u in range(1, 10)}
    words |= {HUNDRED, POINT} | {name for _, name in SCALES}
    return sorted(words)


def build_vocabs(pairs: Iterable[tuple[str, str]] = ()) -> tuple[Vocab, Vocab]:
    """(src_vocab, tgt_vocab) of the numbers-to-words task.

    Built from the task's complete symbol sets, not from data: a char-level source vocabulary of
    the digits, "," and "." (15 ids with the specials) and a word-level target vocabulary of every
    word the converter can produce (107 ids). The vocabularies are therefore the same for every
    dataset and seed. `pairs`, when given, is checked: a token outside the vocabularies raises
    ValueError (the pairs do not come from this task).
    """
    src_vocab = Vocab(NUMBER_SOURCE_SYMBOLS, level="char")
    tgt_vocab = Vocab(number_target_words(), level="word")
    for src, tgt in pairs:
        src_vocab.encode(src)  # raises ValueError on an unknown token
        tgt_vocab.encode(tgt)
    return src_vocab, tgt_vocab


class Splits(NamedTuple):
    """Train / validation / test lists of (source_text, target_text) pairs."""

    train: list[tuple[str, str]]
    val: list[tuple[str, str]]
    test: list[tuple[str, str]]


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")


def make_numbers_dataset(
    n_train: int,
    n_val: int,
    n_test: int,
    max_value: int = 999_999,
    decimals_fraction: float = 0.3,
    seed: int = 0,
) -> Splits:
    """Sample numbers-to-words pairs, e.g. ("29,284.30", "twenty-nine thousand ... point three zero").

    Sampling covers every magnitude evenly: the number of integer digits is drawn uniformly from
    1 .. digits(max_value), then the integer uniformly among the numbers with that many digits (at
    most max_value; one digit includes 0). With probability `decimals_fraction` a decimal part of
    1 or 2 digits (equally likely, any digits, so "7.05" and "7.50" both occur) is appended.
    Uniform sampling of the integer would instead make almost every number six digits long.

    Every source string is unique across the three splits, so no test number is seen in training.
    Repeated draws are rejected; small magnitudes have few distinct strings (0-9 bare or with 1-2
    decimals: 1,110), so in a large dataset they run out and the larger magnitudes fill the gap.
    Samples are drawn in one stream and dealt out in order (train, then val, then test), so all
    three splits follow the same distribution. The same arguments give the same splits.
    Returns `Splits(train, val, test)`.
    """
    for name, value in (("n_train", n_train), ("n_val", n_val), ("n_test", n_test), ("max_value", max_value)):
        _check_count(name, value)
    if max_value > MAX_NUMBER:
        raise ValueError(f"max_value must be at most {MAX_NUMBER:,}, got {max_value:,}")
    if not 0.0 <= decimals_fraction <= 1.0:
        raise ValueError(f"decimals_fraction must be in [0, 1], got {decimals_fraction}")
    n_total = n_train + n_val + n_test
    # How many distinct strings the sampler can produce: each integer bare, and with every 1- or
    # 2-digit decimal part (10 + 100). Asking for more unique samples could never finish.
    variants = (1 if decimals_fraction < 1 else 0) + (110 if decimals_fraction > 0 else 0)
    capacity = (max_value + 1) * variants
    if n_total > capacity:
        raise ValueError(
            f"asked for {n_total} unique numbers but max_value={max_value} and "
            f"decimals_fraction={decimals_fraction} allow only {capacity} distinct strings"
        )

    rng = np.random.default_rng(seed)
    max_digits = len(str(max_value))
    seen: dict[str, None] = {}  # insertion-ordered set: the order of first draw is kept
    max_draws = 100 * n_total + 100_000  # guard against a request close to `capacity`
    draws = 0
    while len(seen) < n_total:
        if draws > max_draws:
            raise RuntimeError(
                f"found only {len(seen)} of {n_total} unique numbers after {draws} draws; "
                "raise max_value or ask for fewer samples"
            )
        m = max(1024, 2 * (n_total - len(seen)))  # draw in vectorised chunks
        digits = rng.integers(1, max_digits + 1, size=m)
        low = np.where(digits == 1, 0, 10 ** (digits - 1))
        high = np.minimum(10**digits - 1, max_value)
        values = rng.integers(low, high + 1)  # inclusive of high
        has_decimals = rng.random(m) < decimals_fraction
        n_decimals = rng.integers(1, 3, size=m)
        decimal_values = rng.integers(0, 10**n_decimals)
        draws += m
        for value, has_dec, n_dec, dec in zip(
            values.tolist(), has_decimals.tolist(), n_decimals.tolist(), decimal_values.tolist(), strict=True
        ):
            source = f"{value:,}" + (f".{dec:0{n_dec}d}" if has_dec else "")
            seen.setdefault(source, None)
            if len(seen) == n_total:
                break

    sources = list(seen)
    pairs = [(source, number_to_words(source)) for source in sources]
    splits = Splits(pairs[:n_train], pairs[n_train : n_train + n_val], pairs[n_train + n_val :])
    train_src, val_src, test_src = ({src for src, _ in split} for split in splits)
    assert not (train_src & val_src or train_src & test_src or val_src & test_src), "splits overlap"
    assert len(train_src) + len(val_src) + len(test_src) == n_total, "duplicate source strings"
    return splits


# ----------------------------------------------------------------------------------------------------
# Batching
# ----------------------------------------------------------------------------------------------------


def encode_batch(
    pairs: Sequence[tuple[str, str]], src_vocab: Vocab, tgt_vocab: Vocab
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Padded int64 arrays for a batch of (source_text, target_text) pairs.

    * `src_ids` (B, S): source tokens + `<eos>`, the encoder input.
    * `tgt_in`  (B, T): `<bos>` + target tokens, the decoder input (teacher forcing).
    * `tgt_out` (B, T): target tokens + `<eos>`, what the decoder must predict: `tgt_in` shifted left
      by one, so the logits at position t are scored against the token after `tgt_in[:, t]`.

    S and T are the longest lengths in this batch; shorter rows are filled with `pad_id` (0), which
    the model masks out of attention and the loss ignores (`ignore_index=pad_id`).
    """
    if len(pairs) == 0:
        raise ValueError("encode_batch needs at least one pair")
    src_rows = [src_vocab.encode(src, add_eos=True) for src, _ in pairs]
    tgt_rows = [tgt_vocab.encode(tgt, add_bos=True, add_eos=True) for _, tgt in pairs]  # bos ... eos
    B = len(pairs)
    S = max(len(row) for row in src_rows)
    T = max(len(row) for row in tgt_rows) - 1
    src_ids = np.full((B, S), src_vocab.pad_id, dtype=np.int64)
    tgt_in = np.full((B, T), tgt_vocab.pad_id, dtype=np.int64)
    tgt_out = np.full((B, T), tgt_vocab.pad_id, dtype=np.int64)
    for b, (src_row, tgt_row) in enumerate(zip(src_rows, tgt_rows, strict=True)):
        src_ids[b, : len(src_row)] = src_row
        tgt_in[b, : len(tgt_row) - 1] = tgt_row[:-1]  # <bos> w1 ... wn
        tgt_out[b, : len(tgt_row) - 1] = tgt_row[1:]  # w1 ... wn <eos>
    return src_ids, tgt_in, tgt_out


def max_lengths(pairs: Iterable[tuple[str, str]], src_vocab: Vocab, tgt_vocab: Vocab) -> tuple[int, int]:
    """(S, T): the widest `src_ids` and `tgt_in`/`tgt_out` that `encode_batch` makes from `pairs`
    (source tokens + eos, target tokens + 1). The model's `max_len` must be at least max(S, T)."""
    S = T = 0
    for src, tgt in pairs:
        S = max(S, len(src_vocab.tokenize(src)) + 1)
        T = max(T, len(tgt_vocab.tokenize(tgt)) + 1)
    return S, T


def batches(
    pairs: Sequence[tuple[str, str]],
    batch_size: int,
    rng: np.random.Generator,
    chunk_batches: int = 50,
) -> Iterator[list[tuple[str, str]]]:
    """One epoch of `pairs` in batches (lists of pairs), every example exactly once.

    Bucketing by length, the simple way: shuffle all examples, cut the shuffled list into chunks
    of `chunk_batches` batches, sort each chunk by (source length, target length), cut it into
    batches, and shuffle the order of all batches. Examples in a batch then have similar lengths,
    so little of each padded array is padding, while each epoch still sees a different grouping.
    Call it once per epoch with the same `rng` for a new shuffle each time; the last batch of a
    chunk may be smaller than `batch_size`.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if chunk_batches < 1:
        raise ValueError(f"chunk_batches must be a positive int, got {chunk_batches!r}")
    order = rng.permutation(len(pairs))
    chunk = batch_size * chunk_batches
    groups: list[list[int]] = []
    for start in range(0, len(order), chunk):
        # sorted() is stable, so equal lengths keep their shuffled order.
        part = sorted(order[start : start + chunk].tolist(), key=lambda i: (len(pairs[i][0]), len(pairs[i][1])))
        groups += [part[k : k + batch_size] for k in range(0, len(part), batch_size)]
    for g in rng.permutation(len(groups)):
        yield [pairs[i] for i in groups[g]]


# ----------------------------------------------------------------------------------------------------
# The same task for a decoder-only language model
# ----------------------------------------------------------------------------------------------------


def build_lm_vocab() -> Vocab:
    """The one vocabulary of a decoder-only LM on numbers to words: `<pad>`, `<bos>`, `<eos>`, then the
    source symbols (digits, "," and ".") and every word `number_to_words` can produce, sorted as always
    (3 + 12 + 104 = 119 ids). The symbols and the words are disjoint, so each keeps its own id.

    Word level: a text of this vocabulary is a list of tokens, the number's characters then the words;
    `encode_lm_batch` builds it, and `Vocab.decode` of a generated continuation gives back its words.
    """
    return Vocab(NUMBER_SOURCE_SYMBOLS + tuple(number_target_words()), level="word")


def encode_lm_batch(pairs: Sequence[tuple[str, str]], vocab: Vocab) -> tuple[np.ndarray, np.ndarray]:
    """Padded int64 arrays (ids, targets) of (source_text, target_text) pairs for a decoder-only LM.

    A pair becomes one sequence: the prompt (the source's characters, then `<bos>`, the separator that
    says "the words start here"), then the continuation (the target's words and `<eos>`):

        ("29.3", "twenty-nine point three") -> 2 9 . 3 <bos> twenty-nine point three <eos>

    * `ids` (B, L): the sequence without its last token, the model's input.
    * `targets` (B, L): the token after each position of `ids` (the sequence shifted left by one), but
      `pad_id` wherever that next token is still prompt: with `ignore_index=pad_id` the loss is on the
      continuation only. The position of `<bos>` predicts the first word.

    L is the longest sequence in the batch minus one; shorter rows are filled with `pad_id` at the end,
    where causal attention already hides them from every real position (no mask is needed). For a
    batch whose sources all have n characters, `ids[:, : n + 1]` is the prompt to decode from, and
    `targets[:, n:]` is laid out as `encode_batch`'s `tgt_out` (words, `<eos>`, padding), ready for
    `exact_match` and `token_accuracy` next to a decoded `[<bos>, words...]`.
    """
    if len(pairs) == 0:
        raise ValueError("encode_lm_batch needs at least one pair")
    rows = []
    for src, tgt in pairs:
        prompt = vocab.encode(list(src), add_eos=False) + [vocab.bos_id]  # characters <bos>
        rows.append((prompt, vocab.encode(tgt, add_eos=True)))  # words <eos>
    B = len(rows)
    L = max(len(prompt) + len(continuation) for prompt, continuation in rows) - 1
    ids = np.full((B, L), vocab.pad_id, dtype=np.int64)
    targets = np.full((B, L), vocab.pad_id, dtype=np.int64)
    for b, (prompt, continuation) in enumerate(rows):
        sequence = prompt + continuation
        ids[b, : len(sequence) - 1] = sequence[:-1]
        targets[b, len(prompt) - 1 : len(sequence) - 1] = continuation  # from <bos>'s position on
    return ids, targets


# ----------------------------------------------------------------------------------------------------
# Toy tasks
# ----------------------------------------------------------------------------------------------------

# Eight short present-tense sentences, lower case, word level (as in the UPC lab's toy set).
ENGLISH_SPANISH: list[tuple[str, str]] = [
    ("i like cats", "me gustan los gatos"),
    ("i like dogs", "me gustan los perros"),
    ("the cat sleeps", "el gato duerme"),
    ("the dog runs", "el perro corre"),
    ("she drinks water", "ella bebe agua"),
    ("we eat bread", "nosotros comemos pan"),
    ("they have a house", "ellos tienen una casa"),
    ("my brother reads books", "mi hermano lee libros"),
]


def english_spanish_vocabs() -> tuple[Vocab, Vocab]:
    """Word-level (src_vocab, tgt_vocab) holding every word of `ENGLISH_SPANISH`."""
    return vocabs_from_pairs(ENGLISH_SPANISH, src_level="word", tgt_level="word")


def copy_task_vocab(vocab_size: int) -> Vocab:
    """The word-level vocabulary of `make_copy_task`: `vocab_size` ids in all, the three special
    tokens then symbols named by their own id, zero-padded so that sorting keeps them in id order
    ("03", "04", ..., "11" for vocab_size=12; the symbol "07" has id 7)."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < 4:
        raise ValueError(f"vocab_size counts the 3 special tokens and must be at least 4, got {vocab_size!r}")
    width = len(str(vocab_size - 1))
    vocab = Vocab([f"{i:0{width}d}" for i in range(len(SPECIAL_TOKENS), vocab_size)], level="word")
    assert all(vocab.id_of(vocab.tokens[i]) == i for i in range(len(vocab)))
    return vocab


def make_copy_task(
    n: int,
    length_range: tuple[int, int] = (1, 10),
    vocab_size: int = 16,
    seed: int = 0,
    reverse: bool = False,
) -> list[tuple[str, str]]:
    """`n` pairs (source_text, target_text) of random symbol sequences and their copies (or reversals).

    Lengths are uniform in `length_range` (both ends included); symbols are uniform among the
    `vocab_size - 3` non-special symbols of `copy_task_vocab(vocab_size)` (so `vocab_size` is the
    config's `src_vocab_size` and `tgt_vocab_size`). Texts are space-separated: ("05 11 03", "03 11 05").
    Copying tests that attention can point at the right source position; reversing makes the
    alignment anti-diagonal, which the attention maps show nicely.
    """
    _check_count("n", n)
    low, high = length_range
    if not 1 <= low <= high:
        raise ValueError(f"length_range must be (low, high) with 1 <= low <= high, got {length_range}")
    symbols = copy_task_vocab(vocab_size).tokens[len(SPECIAL_TOKENS) :]
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        length = int(rng.integers(low, high + 1))
        seq = [symbols[i] for i in rng.integers(0, len(symbols), size=length)]
        out = seq[::-1] if reverse else seq
        pairs.append((" ".join(seq), " ".join(out)))
    return pairs


# ----------------------------------------------------------------------------------------------------
# Evaluation
# ----------------------------------------------------------------------------------------------------


def _check_pred_and_target(pred_ids: np.ndarray, tgt_out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pred_ids, tgt_out = np.asarray(pred_ids), np.asarray(tgt_out)
    if pred_ids.ndim != 2 or tgt_out.ndim != 2:
        raise ValueError(f"pred_ids and tgt_out must be 2-D (B, T), got {pred_ids.shape} and {tgt_out.shape}")
    if pred_ids.shape[0] != tgt_out.shape[0]:
        raise ValueError(f"batch sizes differ: pred_ids {pred_ids.shape}, tgt_out {tgt_out.shape}")
    if pred_ids.shape[0] == 0:
        raise ValueError("empty batch")
    if pred_ids.shape[1] < 1:
        raise ValueError("pred_ids must start with <bos>; got rows of length 0")
    return pred_ids, tgt_out


def _until_eos(ids: np.ndarray, eos_id: int) -> list[int]:
    """The ids before the first eos (all of them when there is none)."""
    ids = ids.tolist()
    return ids[: ids.index(eos_id)] if eos_id in ids else ids


def exact_match(pred_ids: np.ndarray, tgt_out: np.ndarray, vocab: Vocab) -> float:
    """Fraction of sequences whose prediction equals the reference exactly.

    `pred_ids` (B, T_pred) is what `generate` returns (greedy or beam search): `<bos>` first (stripped
    here), then tokens, maybe `<eos>` and padding. `tgt_out` (B, T) is `encode_batch`'s target.
    Both are cut at their first `<eos>` and compared as token lists. The comparison is stricter than
    `Vocab.decode` (which drops `<pad>`/`<bos>` for display): a `<pad>` or `<bos>` the model emits
    before its `<eos>` is a wrong token here. A prediction that runs to the end of the array without
    `<eos>` is judged on the tokens it has.
    """
    pred_ids, tgt_out = _check_pred_and_target(pred_ids, tgt_out)
    hits = sum(
        _until_eos(pred[1:], vocab.eos_id) == _until_eos(ref, vocab.eos_id)
        for pred, ref in zip(pred_ids, tgt_out, strict=True)
    )
    return hits / len(tgt_out)


def token_accuracy(pred_ids: np.ndarray, tgt_out: np.ndarray, pad_id: int = 0) -> float:
    """Fraction of the non-pad positions of `tgt_out` (the tokens and the `<eos>`) predicted correctly.

    Position by position: after stripping `<bos>`, `pred_ids[:, 1 + t]` is compared with
    `tgt_out[:, t]`. A prediction shorter than the target (its array is narrower, or it ended
    early and is padded) counts the missing positions as wrong; positions past the target's end
    (where `tgt_out` is pad) are not counted, so a longer prediction is judged on the target's span.
    """
    pred_ids, tgt_out = _check_pred_and_target(pred_ids, tgt_out)
    pred = pred_ids[:, 1:]  # strip <bos>
    T = tgt_out.shape[1]
    aligned = np.full(tgt_out.shape, pad_id, dtype=np.int64)  # pad never equals a counted target
    width = min(T, pred.shape[1])
    aligned[:, :width] = pred[:, :width]
    counted = tgt_out != pad_id
    n_counted = int(counted.sum())
    if n_counted == 0:
        raise ValueError("tgt_out holds no non-pad position to score")
    return float(((aligned == tgt_out) & counted).sum() / n_counted)


if __name__ == "__main__":  # pragma: no cover - a quick look at the data
    splits = make_numbers_dataset(5, 2, 2, seed=0)
    src_vocab, tgt_vocab = build_vocabs(splits.train)
    print(f"source vocabulary: {len(src_vocab)} ids, target vocabulary: {len(tgt_vocab)} ids")
    for src, tgt in splits.train:
        print(f"{src:>16}  ->  {tgt}")
    src_ids, tgt_in, tgt_out = encode_batch(splits.train[:2], src_vocab, tgt_vocab)
    print("src_ids", src_ids, "tgt_in", tgt_in, "tgt_out", tgt_out, sep="\n")
    print("max lengths (S, T):", max_lengths(splits.train, src_vocab, tgt_vocab))
