"""The data side of the training examples (examples/tasks.py): the numbers-to-words converter against
hand-checked readings, vocabularies, dataset splits, batching, the toy tasks and the evaluation metrics.
Fast: no model is trained here.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from examples.tasks import (
    ENGLISH_SPANISH,
    NUMBER_SOURCE_SYMBOLS,
    Vocab,
    batches,
    build_lm_vocab,
    build_vocabs,
    copy_task_vocab,
    encode_batch,
    encode_lm_batch,
    english_spanish_vocabs,
    exact_match,
    make_copy_task,
    make_numbers_dataset,
    max_lengths,
    number_target_words,
    number_to_words,
    token_accuracy,
)
from numpy_transformer import TransformerConfig

# ----------------------------------------------------------------------------------------------------
# number_to_words
# ----------------------------------------------------------------------------------------------------

# Each reading checked by hand (American English, no "and", decimals digit by digit).
READINGS = [
    ("0", "zero"),
    ("7", "seven"),
    ("10", "ten"),
    ("11", "eleven"),
    ("13", "thirteen"),
    ("14", "fourteen"),
    ("19", "nineteen"),
    ("20", "twenty"),
    ("21", "twenty-one"),
    ("40", "forty"),
    ("90", "ninety"),
    ("99", "ninety-nine"),
    ("100", "one hundred"),
    ("105", "one hundred five"),
    ("110", "one hundred ten"),
    ("115", "one hundred fifteen"),
    ("999", "nine hundred ninety-nine"),
    ("1,000", "one thousand"),
    ("1,001", "one thousand one"),
    ("1,010", "one thousand ten"),
    ("2,500", "two thousand five hundred"),
    ("12,345", "twelve thousand three hundred forty-five"),
    ("29,284.30", "twenty-nine thousand two hundred eighty-four point three zero"),
    ("100,000", "one hundred thousand"),
    ("101,101", "one hundred one thousand one hundred one"),
    ("999,999", "nine hundred ninety-nine thousand nine hundred ninety-nine"),
    ("1,000,000", "one million"),
    ("2,300,000", "two million three hundred thousand"),
    ("2,000,001", "two million one"),
    ("10,000,010", "ten million ten"),
    ("40,018,000", "forty million eighteen thousand"),
    (
        "123,456,789",
        "one hundred twenty-three million four hundred fifty-six thousand seven hundred eighty-nine",
    ),
    (
        "999,999,999",
        "nine hundred ninety-nine million nine hundred ninety-nine thousand nine hundred ninety-nine",
    ),
    ("0.5", "zero point five"),
    ("3.05", "three point zero five"),
    ("0.05", "zero point zero five"),
    ("7.00", "seven point zero zero"),
    ("80.8", "eighty point eight"),
    ("1,000,000.01", "one million point zero one"),
    ("0.123", "zero point one two three"),
]


@pytest.mark.parametrize(("text", "words"), READINGS, ids=[text for text, _ in READINGS])
def test_number_to_words_hand_checked(text, words):
    assert number_to_words(text) == words


def test_reading_table_is_large_enough():
    assert len(READINGS) >= 25


MALFORMED = [
    "1,23",  # a group of two
    "12,",  # dangling separator
    ".5",  # no integer part
    "1.",  # no decimal digits
    "abc",
    "12a",
    "1234",  # separators are required
    "1,0000",  # a group of four
    ",100",
    "1,,000",
    "007",  # leading zeros
    "01",
    "0,000",
    "-3",
    "+3",
    " 5",
    "5 ",
    "",
    "1.2.3",
    "1,000.5,0",
    "1_000",
    "1e3",
    "\u0661\u0662",  # Arabic-Indic digits: \d would accept them
    "1,000,000,000",  # above 999,999,999
]


@pytest.mark.parametrize("text", MALFORMED)
def test_number_to_words_rejects_malformed(text):
    with pytest.raises(ValueError):
        number_to_words(text)


@pytest.mark.parametrize("value", [5, 5.0, None, b"5"])
def test_number_to_words_rejects_non_strings(value):
    with pytest.raises(TypeError):
        number_to_words(value)


def test_target_words_are_exactly_what_the_converter_produces():
    """The vocabulary enumerated from the tables holds every word the converter produces, and
    nothing it cannot produce: 0..999 give every group word, the scales and "point" the rest."""
    produced = {w for n in range(1000) for w in number_to_words(f"{n:,}").split(" ")}
    produced |= set(number_to_words("1,001,000.5").split(" "))  # adds "million", "thousand", "point"
    assert produced == set(number_target_words())
    assert len(number_target_words()) == 104
    assert "twenty-nine" in number_target_words()  # hyphenated compounds are single tokens


# ----------------------------------------------------------------------------------------------------
# Vocab
# ----------------------------------------------------------------------------------------------------


def test_special_ids_match_the_model_config():
    config = TransformerConfig()
    vocab = Vocab(["x"])
    assert (vocab.pad_id, vocab.bos_id, vocab.eos_id) == (config.pad_id, config.bos_id, config.eos_id) == (0, 1, 2)
    assert vocab.tokens[:3] == ["<pad>", "<bos>", "<eos>"]


def test_vocab_sorted_and_order_independent():
    a = Vocab(["dog", "cat", "cat", "ant"])
    b = Vocab(["ant", "dog", "cat"])
    assert a.tokens == ["<pad>", "<bos>", "<eos>", "ant", "cat", "dog"]
    assert a == b and len(a) == 6
    assert "cat" in a and "cow" not in a


def test_vocab_encode_decode_round_trip():
    vocab = Vocab(["the", "cat", "sleeps"], level="word")
    ids = vocab.encode("the cat sleeps", add_bos=True, add_eos=True)
    assert ids[0] == vocab.bos_id and ids[-1] == vocab.eos_id
    assert vocab.encode(["the", "cat"], add_eos=False) == ids[1:3]
    assert vocab.decode(ids) == ["the", "cat", "sleeps"]
    assert vocab.detokenize(vocab.decode(ids)) == "the cat sleeps"
    # decode stops at eos and skips pad and bos
    cat, the = vocab.id_of("cat"), vocab.id_of("the")
    assert vocab.decode([1, the, 0, cat, 2, the, 0]) == ["the", "cat"]
    assert vocab.decode(np.array([the, cat, 2, 0], dtype=np.int64)) == ["the", "cat"]
    with pytest.raises(ValueError, match="dog"):
        vocab.encode("the dog")
    with pytest.raises(ValueError):
        vocab.decode([len(vocab)])


def test_char_vocab_tokenizes_characters():
    src_vocab, _ = build_vocabs()
    assert src_vocab.level == "char"
    assert src_vocab.tokenize("29,284.30") == list("29,284.30")
    ids = src_vocab.encode("29,284.30")
    assert len(ids) == len("29,284.30") + 1
    assert src_vocab.detokenize(src_vocab.decode(ids)) == "29,284.30"
    with pytest.raises(ValueError):
        Vocab(["ab"], level="char")


def test_vocab_rejects_bad_tokens():
    for bad in (["<pad>"], [""], ["two words"], [3]):
        with pytest.raises(ValueError):
            Vocab(bad)
    with pytest.raises(ValueError):
        Vocab(["a"], level="byte")


def test_vocab_to_dict_from_dict_round_trip():
    for vocab in (*build_vocabs(), *english_spanish_vocabs(), copy_task_vocab(12)):
        saved = json.loads(json.dumps(vocab.to_dict()))
        restored = Vocab.from_dict(saved)
        assert restored == vocab
        assert restored.tokens == vocab.tokens and restored.level == vocab.level
    tampered = Vocab(["a", "b"]).to_dict()
    tampered["tokens"] = ["<pad>", "<bos>", "<eos>", "b", "a"]  # ids would change
    with pytest.raises(ValueError):
        Vocab.from_dict(tampered)
    with pytest.raises(ValueError):
        Vocab.from_dict({"tokens": ["a", "<pad>", "<bos>", "<eos>"]})


def test_number_vocab_sizes():
    src_vocab, tgt_vocab = build_vocabs()
    assert len(src_vocab) == 3 + len(NUMBER_SOURCE_SYMBOLS) == 15
    assert len(tgt_vocab) == 3 + 104 == 107
    with pytest.raises(ValueError):
        build_vocabs([("12", "twelve apples")])


# ----------------------------------------------------------------------------------------------------
# Numbers dataset
# ----------------------------------------------------------------------------------------------------


def test_splits_are_disjoint_deterministic_and_correct():
    splits = make_numbers_dataset(2000, 300, 300, seed=3)
    assert [len(s) for s in splits] == [2000, 300, 300]
    sources = [src for split in splits for src, _ in split]
    assert len(set(sources)) == len(sources)
    train, val, test = ({src for src, _ in split} for split in splits)
    assert not (train & val) and not (train & test) and not (val & test)
    for src, tgt in splits.train[:200] + splits.test:
        assert tgt == number_to_words(src)
    assert make_numbers_dataset(2000, 300, 300, seed=3) == splits
    assert make_numbers_dataset(2000, 300, 300, seed=4) != splits


def test_sampling_covers_every_magnitude_and_decimals():
    train = make_numbers_dataset(3000, 0, 0, max_value=999_999_999, decimals_fraction=0.3, seed=0).train
    integer_parts = [src.split(".")[0] for src, _ in train]
    n_digits = Counter(len(part.replace(",", "")) for part in integer_parts)
    assert sorted(n_digits) == list(range(1, 10))
    # Roughly uniform over the number of digits. One- and two-digit numbers have few distinct strings
    # (0..9 bare: 10), so repeated draws of them are rejected and those counts come out lower.
    assert min(n_digits[d] for d in range(3, 10)) > 3000 / 9 * 0.8
    assert {str(d) for d in range(10)} <= set(integer_parts)
    decimals = [src.split(".")[1] for src, _ in train if "." in src]
    assert {len(d) for d in decimals} == {1, 2}
    # About decimals_fraction of the draws get decimals; among the smallest numbers more of the kept
    # samples have them (their bare forms ran out), so judge the fraction where nothing runs out.
    large = [src for src, _ in train if len(src.split(".")[0].replace(",", "")) >= 3]
    assert 0.26 < sum("." in src for src in large) / len(large) < 0.34
    assert max(int(p.replace(",", "")) for p in integer_parts) <= 999_999_999

    small = make_numbers_dataset(500, 0, 0, max_value=999, decimals_fraction=0.0, seed=0).train
    assert all("." not in src and int(src) <= 999 for src, _ in small)


def test_capacity_is_checked():
    everything = make_numbers_dataset(6, 2, 2, max_value=9, decimals_fraction=0.0, seed=0)
    assert sorted(src for split in everything for src, _ in split) == [str(d) for d in range(10)]
    with pytest.raises(ValueError):
        make_numbers_dataset(9, 1, 1, max_value=9, decimals_fraction=0.0)
    for bad in ({"max_value": 1_000_000_000}, {"decimals_fraction": 1.5}, {"n_train": -1}):
        kwargs = {"n_train": 1, "n_val": 1, "n_test": 1} | bad
        with pytest.raises(ValueError):
            make_numbers_dataset(**kwargs)


def test_large_sample_has_no_out_of_vocabulary_word():
    splits = make_numbers_dataset(20_000, 1000, 1000, max_value=999_999_999, seed=1)
    src_vocab, tgt_vocab = build_vocabs()
    pairs = [p for split in splits for p in split]
    src_words = {c for src, _ in pairs for c in src}
    tgt_words = {w for _, tgt in pairs for w in tgt.split(" ")}
    assert src_words <= set(src_vocab.tokens) and tgt_words <= set(tgt_vocab.tokens)
    build_vocabs(pairs)  # checks every token, raises on an unknown one


def test_worst_case_lengths():
    src_vocab, tgt_vocab = build_vocabs()
    # Longest source: most digits plus two decimals; longest target: 3 words per group + scales + 3.
    six = [(s, number_to_words(s)) for s in ("999,999.99", "777,777.77")]
    nine = [(s, number_to_words(s)) for s in ("999,999,999.99", "777,777,777.77")]
    assert max_lengths(six, src_vocab, tgt_vocab) == (11, 11)
    assert max_lengths(nine, src_vocab, tgt_vocab) == (15, 15)
    sample = [p for split in make_numbers_dataset(5000, 0, 0, seed=0) for p in split]
    S, T = max_lengths(sample, src_vocab, tgt_vocab)
    assert S <= 11 and T <= 11


# ----------------------------------------------------------------------------------------------------
# encode_batch and batches
# ----------------------------------------------------------------------------------------------------


def test_encode_batch_shapes_padding_and_shift():
    pairs = [("29,284.30", number_to_words("29,284.30")), ("7", "seven"), ("1,001", "one thousand one")]
    src_vocab, tgt_vocab = build_vocabs(pairs)
    src_ids, tgt_in, tgt_out = encode_batch(pairs, src_vocab, tgt_vocab)
    assert src_ids.dtype == tgt_in.dtype == tgt_out.dtype == np.int64
    assert src_ids.shape == (3, len("29,284.30") + 1)
    n_words = [len(tgt.split(" ")) for _, tgt in pairs]
    assert tgt_in.shape == tgt_out.shape == (3, max(n_words) + 1)
    for b, (src, tgt) in enumerate(pairs):
        S, n = len(src), n_words[b]
        assert src_ids[b, :S].tolist() == src_vocab.encode(src, add_eos=False)
        assert src_ids[b, S] == src_vocab.eos_id and np.all(src_ids[b, S + 1 :] == src_vocab.pad_id)
        assert tgt_in[b, 0] == tgt_vocab.bos_id and tgt_out[b, n] == tgt_vocab.eos_id
        assert np.array_equal(tgt_in[b, 1 : n + 1], tgt_out[b, :n])  # shifted by one
        assert np.all(tgt_in[b, n + 1 :] == tgt_vocab.pad_id) and np.all(tgt_out[b, n + 1 :] == tgt_vocab.pad_id)
        assert tgt_vocab.detokenize(tgt_vocab.decode(tgt_out[b])) == tgt
        assert src_vocab.detokenize(src_vocab.decode(src_ids[b])) == src
    assert (tgt_in != 0).sum() == (tgt_out != 0).sum()  # same number of real positions
    with pytest.raises(ValueError):
        encode_batch([], src_vocab, tgt_vocab)


def test_batches_cover_each_example_once_per_epoch():
    pairs = make_numbers_dataset(1037, 0, 0, seed=0).train
    rng = np.random.default_rng(0)
    epochs = []
    for _ in range(2):
        epoch = list(batches(pairs, 32, rng, chunk_batches=5))
        assert all(1 <= len(batch) <= 32 for batch in epoch)
        flat = [p for batch in epoch for p in batch]
        assert Counter(flat) == Counter(pairs)
        epochs.append(flat)
    assert epochs[0] != epochs[1]  # a new shuffle each epoch
    again = [p for batch in batches(pairs, 32, np.random.default_rng(0), chunk_batches=5) for p in batch]
    assert again == epochs[0]  # deterministic for a seed
    # duplicates are kept: each copy once
    doubled = ENGLISH_SPANISH * 2
    flat = [p for batch in batches(doubled, 3, np.random.default_rng(1)) for p in batch]
    assert Counter(flat) == Counter(doubled)
    with pytest.raises(ValueError):
        next(batches(pairs, 0, rng))


def test_bucketing_reduces_padding():
    pairs = make_numbers_dataset(3200, 0, 0, max_value=999_999_999, seed=0).train
    src_vocab, tgt_vocab = build_vocabs()

    def padding(batch_list):
        total = 0
        for batch in batch_list:
            src_ids, tgt_in, _ = encode_batch(batch, src_vocab, tgt_vocab)
            total += (src_ids == 0).sum() + (tgt_in == 0).sum()
        return total

    rng = np.random.default_rng(0)
    order = rng.permutation(len(pairs))
    random_batches = [[pairs[i] for i in order[k : k + 32]] for k in range(0, len(pairs), 32)]
    bucketed = list(batches(pairs, 32, rng))
    assert padding(bucketed) < 0.5 * padding(random_batches)


# ----------------------------------------------------------------------------------------------------
# The decoder-only LM's view: one vocabulary, prompt then continuation
# ----------------------------------------------------------------------------------------------------


def test_lm_vocab_holds_the_symbols_and_the_words_once():
    vocab = build_lm_vocab()
    src_vocab, tgt_vocab = build_vocabs()
    assert len(vocab) == 3 + 12 + 104 == 119 and vocab.tokens[:3] == ["<pad>", "<bos>", "<eos>"]
    assert set(vocab.tokens) == set(src_vocab.tokens) | set(tgt_vocab.tokens)
    assert build_lm_vocab() == vocab  # the same ids every time
    tokens = ["2", "9", ".", "twenty-nine", "point"]
    assert vocab.decode(vocab.encode(tokens)) == tokens


def test_encode_lm_batch_by_hand():
    vocab = build_lm_vocab()
    ids, targets = encode_lm_batch([("29.3", "twenty-nine point three"), ("5", "five")], vocab)
    tokens = [[vocab.tokens[i] for i in row] for row in ids]
    assert tokens == [
        ["2", "9", ".", "3", "<bos>", "twenty-nine", "point", "three"],
        ["5", "<bos>", "five", "<pad>", "<pad>", "<pad>", "<pad>", "<pad>"],
    ]
    assert [[vocab.tokens[i] for i in row] for row in targets] == [
        ["<pad>", "<pad>", "<pad>", "<pad>", "twenty-nine", "point", "three", "<eos>"],
        ["<pad>", "five", "<eos>", "<pad>", "<pad>", "<pad>", "<pad>", "<pad>"],
    ]
    assert ids.dtype == targets.dtype == np.int64
    with pytest.raises(ValueError):
        encode_lm_batch([], vocab)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        encode_lm_batch([("12", "twelve apples")], vocab)


def test_encode_lm_batch_is_the_sequence_shifted_with_the_prompt_ignored():
    """targets is ids shifted left by one wherever the next token is a word or <eos>, pad (ignored) elsewhere;
    from column n on (n characters) a batch of one source length lines up with encode_batch's tgt_out."""
    pairs = make_numbers_dataset(300, 0, 0, seed=2).train
    vocab = build_lm_vocab()
    src_vocab, tgt_vocab = build_vocabs()
    ids, targets = encode_lm_batch(pairs, vocab)
    for b, (src, tgt) in enumerate(pairs):
        n, words = len(src), tgt.split(" ")
        sequence = list(src) + ["<bos>"] + words + ["<eos>"]
        assert [vocab.tokens[i] for i in ids[b, : len(sequence) - 1]] == sequence[:-1]
        assert np.all(ids[b, len(sequence) - 1 :] == vocab.pad_id)
        assert np.all(targets[b, :n] == vocab.pad_id)  # the prompt is never a target
        assert [vocab.tokens[i] for i in targets[b, n : n + len(words) + 1]] == words + ["<eos>"]
        assert np.all(targets[b, n + len(words) + 1 :] == vocab.pad_id)
        # each word is the next input token; <eos> is predicted and never read
        assert np.array_equal(targets[b, n : n + len(words)], ids[b, n + 1 : n + 1 + len(words)])
    assert int((targets != vocab.pad_id).sum()) == sum(len(tgt.split(" ")) + 1 for _, tgt in pairs)

    same_length = [pair for pair in pairs if len(pair[0]) == 7]
    n = 7
    ids, targets = encode_lm_batch(same_length, vocab)
    _, _, tgt_out = encode_batch(same_length, src_vocab, tgt_vocab)
    as_words = np.vectorize(lambda i: vocab.tokens[i])(targets[:, n:])
    assert np.array_equal(as_words, np.vectorize(lambda i: tgt_vocab.tokens[i])(tgt_out))
    assert np.all(ids[:, n] == vocab.bos_id)  # every prompt ends at column n: ids[:, : n + 1]


# ----------------------------------------------------------------------------------------------------
# Toy tasks
# ----------------------------------------------------------------------------------------------------


def test_english_spanish_pairs_encode():
    assert len(ENGLISH_SPANISH) == 8
    assert len({src for src, _ in ENGLISH_SPANISH}) == 8
    src_vocab, tgt_vocab = english_spanish_vocabs()
    for src, tgt in ENGLISH_SPANISH:
        assert src == src.lower() and tgt == tgt.lower()
        assert tgt_vocab.decode(tgt_vocab.encode(tgt)) == tgt.split(" ")
        assert src_vocab.decode(src_vocab.encode(src)) == src.split(" ")
    src_ids, tgt_in, tgt_out = encode_batch(ENGLISH_SPANISH, src_vocab, tgt_vocab)
    assert src_ids.shape[0] == 8 and tgt_in.shape == tgt_out.shape
    assert "gatos" in tgt_vocab and "cats" in src_vocab


@pytest.mark.parametrize("reverse", [False, True])
def test_copy_task(reverse):
    pairs = make_copy_task(500, length_range=(2, 6), vocab_size=12, seed=0, reverse=reverse)
    vocab = copy_task_vocab(12)
    assert len(vocab) == 12
    assert all(int(token) == vocab.id_of(token) for token in vocab.tokens[3:])  # name = id
    lengths = set()
    for src, tgt in pairs:
        seq = src.split(" ")
        lengths.add(len(seq))
        assert tgt.split(" ") == (seq[::-1] if reverse else seq)
        ids = vocab.encode(src, add_eos=False)
        assert all(3 <= i < 12 for i in ids)
    assert lengths == {2, 3, 4, 5, 6}
    assert make_copy_task(500, (2, 6), 12, seed=0, reverse=reverse) == pairs
    assert make_copy_task(500, (2, 6), 12, seed=1, reverse=reverse) != pairs
    src_ids, tgt_in, tgt_out = encode_batch(pairs[:4], vocab, vocab)
    for b in range(4):
        n = int((src_ids[b] != 0).sum()) - 1
        expected = src_ids[b, :n][::-1] if reverse else src_ids[b, :n]
        assert np.array_equal(tgt_out[b, :n], expected)
    with pytest.raises(ValueError):
        copy_task_vocab(3)
    with pytest.raises(ValueError):
        make_copy_task(5, length_range=(0, 3))


# ----------------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------------


@pytest.fixture
def abc():
    vocab = Vocab(["a", "b", "c", "d"])
    a, b, c, d = (vocab.id_of(t) for t in "abcd")
    # references: "a b c" and "a b"
    tgt_out = np.array([[a, b, c, 2], [a, b, 2, 0]])
    return vocab, tgt_out, (a, b, c, d)


def test_metrics_perfect_prediction(abc):
    vocab, tgt_out, (a, b, c, d) = abc
    pred = np.array([[1, a, b, c, 2, 0, 0], [1, a, b, 2, 0, 0, 0]])  # longer array, pad after eos
    assert exact_match(pred, tgt_out, vocab) == 1.0
    assert token_accuracy(pred, tgt_out, vocab.pad_id) == 1.0


def test_metrics_prediction_shorter_than_reference(abc):
    vocab, tgt_out, (a, b, c, d) = abc
    # the array is narrower than the target: row 0 misses "c" and eos, row 1 misses eos
    pred = np.array([[1, a, b], [1, a, b]])
    assert exact_match(pred, tgt_out, vocab) == 0.5  # row 1 has all its tokens (it ran out of room)
    assert token_accuracy(pred, tgt_out, vocab.pad_id) == pytest.approx(4 / 7)
    # ended early with eos, then padded
    pred = np.array([[1, a, 2, 0, 0], [1, a, b, 2, 0]])
    assert exact_match(pred, tgt_out, vocab) == 0.5
    assert token_accuracy(pred, tgt_out, vocab.pad_id) == pytest.approx((1 + 3) / 7)


def test_metrics_prediction_longer_than_reference(abc):
    vocab, tgt_out, (a, b, c, d) = abc
    pred = np.array([[1, a, b, c, d, 2], [1, a, b, c, 2, 0]])
    assert exact_match(pred, tgt_out, vocab) == 0.0
    # row 0: a b c right, d instead of eos wrong; row 1: a b right, c instead of eos wrong
    assert token_accuracy(pred, tgt_out, vocab.pad_id) == pytest.approx(5 / 7)


def test_metrics_wrong_tokens_and_stray_pad(abc):
    vocab, tgt_out, (a, b, c, d) = abc
    pred = np.array([[1, a, c, c, 2], [1, a, 0, b, 2]])  # a stray <pad> before eos is wrong
    assert vocab.decode(pred[1]) == ["a", "b"]  # decode (for display) would hide it
    assert exact_match(pred, tgt_out, vocab) == 0.0
    assert token_accuracy(pred, tgt_out, vocab.pad_id) == pytest.approx((3 + 1) / 7)


def test_metrics_validate_shapes(abc):
    vocab, tgt_out, _ = abc
    with pytest.raises(ValueError):
        exact_match(np.ones((3, 4), dtype=np.int64), tgt_out, vocab)
    with pytest.raises(ValueError):
        token_accuracy(np.ones(4, dtype=np.int64), tgt_out)
    with pytest.raises(ValueError):
        token_accuracy(np.ones((2, 3), dtype=np.int64), np.zeros((2, 3), dtype=np.int64))
