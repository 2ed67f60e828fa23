"""stop_strings, as transformers' generate(stop_strings=..., tokenizer=...) stops: a row ends once its text ends with
one of the strings (transformers' StopStringCriteria), on both sides.

- transformer_spec.stop_strings.StopStrings decides as StopStringCriteria does, row for row, on 2000 random rows of
  three tiny tokenizers built here (a GPT-2-style byte-level one, a Llama-style one with byte tokens, a plain
  Metaspace one): overhangs off either end, a character split over two byte tokens, "\\n\\n" over two "\\n";
- generate(stop_strings=...) on a tiny random GPT-2 with the byte-level tokenizer equals transformers' generate()
  token for token (greedy on both sides; sampling on the torch side under one torch seed), rows stopping at
  different steps; beam search on both sides (a candidate ending with a stop string is a finished hypothesis, as
  _beam_search decides) and beam sampling on the torch side under one seed; `--stop` on the generate command line;
- a checkpoint's own stop_strings (generation_config.json): applied with tokenizer=, warned about without, saved;
- stop_strings without a tokenizer, or empty: refused naming the argument.

Nothing is downloaded: the tokenizers are made with the `tokenizers` package and the model with save_pretrained.
"""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest
import torch
import transformers
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import decoders, models, pre_tokenizers
from transformers.generation.stopping_criteria import StopStringCriteria

import numpy_transformer as nt
import torch_transformer as tt
from numpy_transformer import hf as numpy_hf
from parity_tests import hf_compare as H
from torch_transformer import hf as torch_hf
from transformer_spec.generation import GenerationConfig
from transformer_spec.stop_strings import StopStrings
from transformer_spec.text import Tokenizer

transformers.logging.set_verbosity_error()

SIDES = ["numpy", "torch"]
# 40 tokens, the tiny GPT-2's vocabulary: GPT-2's byte alphabet (Ġ a space, Ċ a newline, "Ã" "©" the two bytes of é)
BYTE_LEVEL = [
    "<|endoftext|>", "a", "b", "c", "d", "e", "f", "s", "t", "o", "p", "st", "op", "sto", "stop", "pped", "las",
    "topper", "at", "Ġ", "Ġst", "Ġstop", "Ġat", "Ċ", "ĊĊ", "Ã", "©", "Ã©", "x", "y", "xy", "ion", "opera", "tion",
    "!", "er", "Ġthe", "the", "pper", "to",
]  # fmt: skip
# Llama's way: "▁" a word start, "<0x0A>" a byte token (ByteFallback), é also as its two bytes
BYTE_FALLBACK = [
    "<unk>", "<s>", "</s>", "<0x0A>", "<0xC3>", "<0xA9>", "▁", "a", "b", "c", "d", "e", "f", "s", "t", "o", "p",
    "st", "op", "stop", "▁st", "▁stop", "é", "▁at", "at", "las", "topper", "pped", "x", "y",
]  # fmt: skip
STOPS = {"byte_level": ["stop", "é", "\n\n", " at", "pp"], "byte_fallback": ["stop", "é", "\n", " at"],
         "metaspace": ["stop", " at", "ya"]}  # fmt: skip


def raw_tokenizer(kind: str) -> RawTokenizer:
    """A tokenizers.Tokenizer over one of the vocabularies above (no merges: encoding goes character by
    character; stop strings read only the vocabulary and the decoder)."""
    vocab = BYTE_LEVEL if kind == "byte_level" else BYTE_FALLBACK
    raw = RawTokenizer(models.BPE(vocab={t: i for i, t in enumerate(vocab)}, merges=[], unk_token=vocab[0]))
    if kind == "byte_level":
        raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        raw.decoder = decoders.ByteLevel()
    elif kind == "byte_fallback":
        raw.pre_tokenizer = pre_tokenizers.Metaspace()
        raw.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
    else:
        raw.pre_tokenizer = pre_tokenizers.Metaspace()
        raw.decoder = decoders.Metaspace()
    return raw


def both_tokenizers(kind: str):
    """(ours: transformer_spec.text.Tokenizer, theirs: transformers' fast tokenizer) over one tokenizers object."""
    raw = raw_tokenizer(kind)
    theirs = transformers.PreTrainedTokenizerFast(tokenizer_object=raw)
    return Tokenizer(raw), theirs


@pytest.mark.parametrize("kind", ["byte_level", "byte_fallback", "metaspace"])
def test_stop_strings_decide_as_stop_string_criteria(kind):
    """2000 random rows of 6 ids: StopStrings.hits equals StopStringCriteria's verdict row for row (with our
    Tokenizer, and with transformers' tokenizer passed in its place); both verdicts occur."""
    ours_tokenizer, theirs_tokenizer = both_tokenizers(kind)
    vocab_size = theirs_tokenizer.backend_tokenizer.get_vocab_size()
    rows = np.random.default_rng(0).integers(0, vocab_size, size=(2000, 6))
    expected = StopStringCriteria(theirs_tokenizer, STOPS[kind])(torch.from_numpy(rows), None).tolist()
    assert 20 < sum(expected) < 1980, sum(expected)  # the test can fail both ways
    for tokenizer in (ours_tokenizer, theirs_tokenizer):
        got = StopStrings(tuple(STOPS[kind]), tokenizer).hits(rows.tolist())
        assert got == expected, [r for r, (g, e) in enumerate(zip(got, expected, strict=True)) if g != e][:10]


def test_the_documented_cases():
    """transformers' own examples: ["st", "op"], ["stop"], ["st", "opera"], ["sto", "pper"], ["las", "topper"],
    ["s", "to", "pped"] stop at "stop"; ["stop", "at"], ["st", "op", "at"], ["st", "opera", "tion"] do not; a
    character over two byte tokens and "\\n\\n" over two newlines do."""
    ids = {token: i for i, token in enumerate(BYTE_LEVEL)}
    stop = StopStrings(("stop", "é", "\n\n"), both_tokenizers("byte_level")[0])
    hits = [["st", "op"], ["stop"], ["st", "opera"], ["sto", "pper"], ["las", "topper"], ["s", "to", "pped"],
            ["x", "Ã", "©"], ["Ã©"], ["Ċ", "Ċ"], ["a", "ĊĊ"]]  # fmt: skip
    misses = [["stop", "at"], ["st", "op", "at"], ["st", "opera", "tion"], ["Ã"], ["©", "Ã"], ["Ċ", "a"]]
    assert stop.hits([[ids[t] for t in row] for row in hits]) == [True] * len(hits)
    assert stop.hits([[ids[t] for t in row] for row in misses]) == [False] * len(misses)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """(transformers' tiny GPT-2 in float64, its folder, our tokenizer, theirs)."""
    folder = tmp_path_factory.mktemp("gpt2")
    model = H.build_tiny("gpt2", folder).double()
    assert model.config.vocab_size == len(BYTE_LEVEL)
    return model, folder, *both_tokenizers("byte_level")


PROMPTS = np.array([[5, 9, 7, 21], [12, 4, 30, 8], [3, 3, 17, 1]])


def stops_of(tokens: np.ndarray, tokenizer: Tokenizer) -> list[str]:
    """Stop strings that the plain continuation of each row reaches at a different step: the last character of
    generated token k and the first of token k + 1 (k = 1, 2, 3 in rows 0, 1, 2, or the next pair whose tokens
    are whole characters), overhanging both tokens."""
    out = []
    for row, start in zip(tokens[:, PROMPTS.shape[1] :], (1, 2, 3), strict=False):
        texts = [tokenizer.decode([t]) for t in row]
        k = next(k for k in range(start, len(row) - 1) if "\ufffd" not in texts[k] + texts[k + 1])
        out.append(texts[k][-1:] + texts[k + 1][:1])
    return out


def theirs_generate(model, tokenizer, **kwargs) -> np.ndarray:
    with torch.no_grad():
        return model.generate(
            torch.from_numpy(PROMPTS), attention_mask=torch.ones(PROMPTS.shape, dtype=torch.long),
            max_new_tokens=8, tokenizer=tokenizer, **kwargs,
        ).numpy()  # fmt: skip


@pytest.mark.parametrize("side", SIDES)
def test_generate_stops_at_stop_strings_as_transformers(side, gpt2):
    """Greedy, 8 new tokens: stop strings picked from the plain continuation stop rows at different steps; ours
    equals transformers' generate() (the fill after a stop is generate()'s), given as an argument or in a
    GenerationConfig, with our tokenizer or transformers'."""
    model, folder, ours_tokenizer, theirs_tokenizer = gpt2
    mine = H.load_ours(side, folder, np.float64)
    plain = theirs_generate(model, theirs_tokenizer, do_sample=False)
    stops = stops_of(plain, ours_tokenizer)
    expected = theirs_generate(model, theirs_tokenizer, do_sample=False, stop_strings=stops)
    # every row stopped before 8 new tokens (here after 3, 6 and 6), the first filled after its stop
    assert expected.shape[1] < plain.shape[1] and (expected[0] != plain[0, : expected.shape[1]]).any(), expected
    lib, ids = (nt, PROMPTS) if side == "numpy" else (tt, torch.from_numpy(PROMPTS))
    config = GenerationConfig(max_new_tokens=8, do_sample=False, stop_strings=stops)
    for got in (
        lib.generate(mine, ids, max_new_tokens=8, do_sample=False, stop_strings=stops, tokenizer=ours_tokenizer),
        lib.generate(mine, ids, config, tokenizer=theirs_tokenizer),
    ):
        np.testing.assert_array_equal(np.asarray(got), expected)


def test_torch_sampling_stops_as_transformers(gpt2):
    """do_sample under one torch seed: the torch side draws and stops as transformers' generate()."""
    model, folder, ours_tokenizer, theirs_tokenizer = gpt2
    mine = H.load_ours("torch", folder, np.float64)
    stops = ["st", "a", "Ã"]
    torch.manual_seed(3)
    expected = theirs_generate(model, theirs_tokenizer, do_sample=True, stop_strings=stops)
    torch.manual_seed(3)
    got = tt.generate(
        mine, torch.from_numpy(PROMPTS), max_new_tokens=8, do_sample=True, stop_strings=stops, tokenizer=ours_tokenizer
    )
    np.testing.assert_array_equal(got.numpy(), expected)


# Beam search: (stop strings, length_penalty, num_beams, eos_token_id). Without generate()'s -1e9 on the candidates
# that ended yet go on (fewer than K of the (1 + n_eos) K did not end), the second and fourth decode otherwise.
BEAM_CASES = [
    (["pt", "xc", "p "], -1.0, 3, None),
    (["o"], 2.0, 3, None),
    (["o", "x"], 1.0, 2, [33, 25]),
    (["y", "t", " ", "p"], 1.0, 4, None),
    (list("abcdefstop"), 1.0, 3, None),  # every candidate of every row ends at the first step: the search stops
]


@pytest.mark.parametrize("side", SIDES)
def test_beam_search_stops_at_stop_strings_as_transformers(side, gpt2):
    """generate(num_beams=K, stop_strings=...): a candidate whose text then ends with a stop string is a finished
    hypothesis, as one ending with eos (normalised by its length ** length_penalty), and goes on no further; ours
    equals transformers' generate() token for token on BEAM_CASES, and the stops changed what plain beam search
    writes."""
    model, folder, ours_tokenizer, theirs_tokenizer = gpt2
    mine = H.load_ours(side, folder, np.float64)
    lib, ids = (nt, PROMPTS) if side == "numpy" else (tt, torch.from_numpy(PROMPTS))
    for stops, length_penalty, num_beams, eos in BEAM_CASES:
        settings = dict(do_sample=False, num_beams=num_beams, length_penalty=length_penalty)
        settings |= {} if eos is None else {"eos_token_id": eos}  # None passed to generate() would drop its eos
        plain = theirs_generate(model, theirs_tokenizer, **settings)
        expected = theirs_generate(model, theirs_tokenizer, stop_strings=stops, **settings)
        assert plain.shape != expected.shape or (plain != expected).any(), stops
        got = lib.generate(mine, ids, max_new_tokens=8, stop_strings=stops, tokenizer=ours_tokenizer, **settings)
        np.testing.assert_array_equal(np.asarray(got), expected, err_msg=str(stops))


def test_torch_beam_sampling_stops_as_transformers(gpt2, monkeypatch):
    """do_sample with 3 beams under one torch seed (float32 on both sides, as generate()'s beam search scores in
    float32): the torch side draws and stops as transformers' generate() (5.20 to 5.23 ranked as 5.24 ranks)."""
    from parity_tests.test_generate_arguments import SORTS_SAMPLED_BEAMS, ranked_by_score

    if not SORTS_SAMPLED_BEAMS:
        mixin = transformers.generation.utils.GenerationMixin
        monkeypatch.setattr(mixin, "_get_top_k_continuations", ranked_by_score(mixin._get_top_k_continuations))
    model, folder, ours_tokenizer, theirs_tokenizer = gpt2
    theirs_model = copy.deepcopy(model).float()
    mine = H.load_ours("torch", folder, np.float32)
    settings = dict(do_sample=True, num_beams=3, temperature=0.8, top_k=12, stop_strings=["o", "x"])
    for seed in (0, 1):
        torch.manual_seed(seed)
        expected = theirs_generate(theirs_model, theirs_tokenizer, **settings)
        torch.manual_seed(seed)
        got = tt.generate(mine, torch.from_numpy(PROMPTS), max_new_tokens=8, tokenizer=ours_tokenizer, **settings)
        np.testing.assert_array_equal(got.numpy(), expected)


@pytest.mark.parametrize("side", SIDES)
def test_a_checkpoints_own_stop_strings(side, gpt2, tmp_path):
    """generation_config.json's "stop_strings" (3 beams; "o" ends hypotheses): with tokenizer= ours decodes as
    transformers' generate() on the same folder (AutoModelForCausalLM reads the file); a caller's stop_strings
    replace them; without a tokenizer a UserWarning names them (transformers refuses) and decoding ignores them;
    hf.save writes them back, and the saved folder decodes the same."""
    model, folder, ours_tokenizer, theirs_tokenizer = gpt2
    stops = ["o", "x"]
    for name in ("config.json", "model.safetensors"):
        shutil.copy(folder / name, tmp_path / name)
    generation = json.loads((folder / "generation_config.json").read_text()) | {"num_beams": 3, "stop_strings": stops}
    (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    theirs_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64)
    assert theirs_model.generation_config.stop_strings == stops
    expected = theirs_generate(theirs_model, theirs_tokenizer, do_sample=False)
    plain = theirs_generate(model, theirs_tokenizer, do_sample=False, num_beams=3)
    assert plain.shape != expected.shape or (plain != expected).any()
    mine = H.load_ours(side, tmp_path, np.float64)
    assert mine.generation_rules.stop_strings == tuple(stops)
    lib, ids = (nt, PROMPTS) if side == "numpy" else (tt, torch.from_numpy(PROMPTS))
    got = lib.generate(mine, ids, max_new_tokens=8, do_sample=False, tokenizer=ours_tokenizer)
    np.testing.assert_array_equal(np.asarray(got), expected)
    other = theirs_generate(theirs_model, theirs_tokenizer, do_sample=False, stop_strings=["pt"])
    got = lib.generate(mine, ids, max_new_tokens=8, do_sample=False, stop_strings=["pt"], tokenizer=ours_tokenizer)
    np.testing.assert_array_equal(np.asarray(got), other)
    with pytest.warns(UserWarning, match=r"stop_strings=\['o', 'x'\], not applied without tokenizer="):
        got = lib.generate(mine, ids, max_new_tokens=8, do_sample=False)
    np.testing.assert_array_equal(np.asarray(got), plain)
    (numpy_hf if side == "numpy" else torch_hf).save(mine, tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "generation_config.json").read_text())["stop_strings"] == stops
    again = H.load_ours(side, tmp_path / "saved", np.float64)
    assert again.generation_rules.stop_strings == tuple(stops)
    got = lib.generate(again, ids, max_new_tokens=8, do_sample=False, tokenizer=ours_tokenizer)
    np.testing.assert_array_equal(np.asarray(got), expected)


@pytest.mark.parametrize("side", SIDES)
def test_stop_strings_refused_where_not_applied(side, gpt2):
    """Without a tokenizer, empty, or not strings: an error naming stop_strings."""
    _, folder, ours_tokenizer, _ = gpt2
    mine = H.load_ours(side, folder, np.float64)
    lib, ids = (nt, PROMPTS) if side == "numpy" else (tt, torch.from_numpy(PROMPTS))
    with pytest.raises(ValueError, match="stop_strings needs tokenizer="):
        lib.generate(mine, ids, stop_strings=["a"])
    with pytest.raises(ValueError, match="stop_strings must hold non-empty strings"):
        lib.generate(mine, ids, stop_strings=[""], tokenizer=ours_tokenizer)
    with pytest.raises(TypeError, match="stop_strings must be a str or a non-empty list of str"):
        GenerationConfig(stop_strings=5)
    with pytest.raises(TypeError, match="tokenizer must be"):
        lib.generate(mine, ids, stop_strings="a", tokenizer=object())


def test_cli_generate_stop(gpt2, capsys):
    """`transformer-parity generate FOLDER PROMPT --stop TEXT` (run in process) prints the text transformers'
    generate(stop_strings=[TEXT]) writes: it ends where the stop string is complete, shorter than without it."""
    from parity_tests.__main__ import generate_main

    model, folder, ours_tokenizer, theirs_tokenizer = gpt2
    theirs_tokenizer.save_pretrained(folder)
    prompt = "stop at"
    ids = torch.tensor([ours_tokenizer.encode(prompt)])

    def theirs_text(**kwargs) -> str:
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=8, do_sample=False, tokenizer=theirs_tokenizer, **kwargs)
        return ours_tokenizer.decode(out[0, ids.shape[1] :].tolist())

    def run(*flags) -> str:
        argv = [str(folder), prompt, "--max-new-tokens", "8", "--dtype", "float64", "--greedy", *flags]
        assert generate_main(argv) == 0
        return capsys.readouterr().out

    plain = theirs_text()
    assert run() == plain + "\n"
    stop = plain[13:15]  # " stop stoptiontion...": "nt" over the fourth and fifth tokens
    expected = theirs_text(stop_strings=[stop])
    assert stop in expected and 13 < len(expected) < len(plain), (plain, stop, expected)  # the token holding "t"
    assert run("--stop", stop) == expected + "\n"
    assert run("--stop", "never written", "--stop", stop) == expected + "\n"
