"""From a Hub id or a folder to text: hf.load and load_tokenizer resolve a Hub id through huggingface_hub (here from a
local folder laid out as the Hub cache, offline), the chat template renders as transformers renders it, and
generate_text writes, token for token, what transformers' generate() writes on the same tiny model (greedy, both
sides), streaming the same text piece by piece and stopping at eos. Nothing touches the network: the tokenizer is a
byte-level BPE trained here (parity_tests.tiny_text), the models tiny random ones written with save_pretrained."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import torch_transformer.text
from numpy_transformer import hf
from numpy_transformer.text import generate_text, load_tokenizer
from parity_tests.tiny_text import CHAT_TEMPLATE, tiny_lm
from torch_transformer import hf as torch_hf
from transformer_spec import hub
from transformer_spec.text import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello! How are you?"}]
STEPS = 12


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    """family -> (folder, the transformers model in float64)."""
    found = {}
    for family in ("qwen2", "llama"):
        folder = tmp_path_factory.mktemp(family)
        found[family] = (folder, tiny_lm(folder, family, seed=1).double())
    return found


def their_new_tokens(theirs, ids: list[int], steps: int = STEPS) -> list[int]:
    out = theirs.generate(torch.tensor([ids]), max_new_tokens=steps, do_sample=False)
    return out[0, len(ids) :].tolist()


def load_side(side: str, folder):
    if side == "numpy":
        return hf.load(folder, dtype=np.float64), generate_text
    return torch_hf.load(folder, dtype=torch.float64), torch_transformer.text.generate_text


@pytest.mark.parametrize("side", ["numpy", "torch"])
@pytest.mark.parametrize("family", ["qwen2", "llama"])
@pytest.mark.parametrize("chat", [True, False])
def test_generate_text_equals_transformers_generate(checkpoints, family, side, chat):
    folder, theirs = checkpoints[family]
    tokenizer = load_tokenizer(folder)
    prompt = MESSAGES if chat else "The cat sat on"
    ids = tokenizer.prompt_ids(prompt)
    expected = their_new_tokens(theirs, ids)
    assert len(set(expected)) > 3  # a model that says something, not one token over and over
    model, generate = load_side(side, folder)
    pieces: list[str] = []
    text = generate(model, tokenizer, prompt, max_new_tokens=STEPS, stream=pieces.append)
    assert text == tokenizer.decode(expected)
    assert "".join(pieces) == text and len(pieces) > 1  # streamed as it came, nothing lost or repeated


@pytest.mark.parametrize("side", ["numpy", "torch"])
def test_generate_text_stops_at_eos(checkpoints, tmp_path, side):
    """The third token the model writes made its eos: both stop there. (That token is not a special one, so its text
    stays in the text, as in tokenizer.decode(generate(...)); a checkpoint's special eos is left out.)"""
    _, theirs = checkpoints["qwen2"]
    tokenizer = load_tokenizer(checkpoints["qwen2"][0])
    ids = tokenizer.prompt_ids(MESSAGES)
    third = their_new_tokens(theirs, ids)[2]
    theirs_eos = tiny_lm(tmp_path, "qwen2", seed=1, eos_token_id=third).double()
    expected = their_new_tokens(theirs_eos, ids)
    assert len(expected) == 3 and expected[-1] == third  # generate() stopped at it
    model, generate = load_side(side, tmp_path)
    pieces: list[str] = []
    text = generate(model, tokenizer, MESSAGES, max_new_tokens=STEPS, stream=pieces.append)
    assert text == tokenizer.decode(expected) == "".join(pieces)
    assert text != tokenizer.decode(their_new_tokens(theirs, ids))  # the model without that eos writes on


def test_chat_template_renders_as_transformers(checkpoints, tmp_path):
    """The ChatML template, and one that reads bos_token and raises on a bad role, give transformers' ids."""
    from transformers import AutoTokenizer

    folder, _ = checkpoints["qwen2"]
    ours, theirs = load_tokenizer(folder), AutoTokenizer.from_pretrained(folder)
    expected = theirs.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    assert ours.prompt_ids(MESSAGES) == list(getattr(expected, "input_ids", expected))
    assert ours.encode("The cat sat on") == theirs.encode("The cat sat on")
    strict = ("{{ bos_token }}{% for m in messages %}{% if m['role'] not in ['system', 'user'] %}"
              "{{ raise_exception('bad role ' + m['role']) }}{% endif %}{{ m['role'] | tojson }}: {{ m['content'] }}\n"
              "{% endfor %}")  # fmt: skip
    with_bos = Tokenizer(ours.backend, strict, {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"})
    rendered = '<|im_start|>"system": You are terse.\n"user": Hello! How are you?\n'
    assert with_bos.apply_chat_template(MESSAGES) == rendered
    with pytest.raises(Exception, match="bad role robot"):
        with_bos.apply_chat_template([{"role": "robot", "content": "x"}])
    assert CHAT_TEMPLATE in (folder / "tokenizer_config.json").read_text().encode().decode("unicode_escape")


def hub_cache(root: Path, source: Path, repo: str) -> Path:
    """`source`'s files laid out as huggingface_hub's cache holds a snapshot of `repo`: models--org--name/
    snapshots/<commit>/... and refs/main naming the commit. Returns the cache folder."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    entry = root / ("models--" + repo.replace("/", "--"))
    shutil.copytree(source, entry / "snapshots" / commit)
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text(commit)
    return root


def test_hub_id_resolves_from_the_cache_offline(checkpoints, tmp_path, monkeypatch):
    """hf.load("org/name") on both sides and load_tokenizer find the snapshot in the cache (HF_HUB_OFFLINE), equal to
    loading the folder; an id the cache lacks is a ValueError naming it."""
    import huggingface_hub.constants

    folder, _ = checkpoints["qwen2"]
    cache = hub_cache(tmp_path / "hub", folder, "org/tiny-chat")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)  # no folder named org/tiny-chat here
    by_id, by_folder = hf.load("org/tiny-chat", dtype=np.float64), hf.load(folder, dtype=np.float64)
    assert by_id.params.keys() == by_folder.params.keys()
    assert all(np.array_equal(by_id.params[k], by_folder.params[k]) for k in by_id.params)
    torch_model = torch_hf.load("org/tiny-chat", dtype=torch.float64)
    theirs = {k: v.numpy() for k, v in torch_model.state_dict().items()}
    assert theirs.keys() == by_folder.params.keys()
    assert all(np.array_equal(theirs[k], by_folder.params[k]) for k in theirs)
    assert load_tokenizer("org/tiny-chat").prompt_ids(MESSAGES) == load_tokenizer(folder).prompt_ids(MESSAGES)
    with pytest.raises(ValueError, match="'org/missing' is not a folder here and could not be read"):
        hf.load("org/missing")


def test_cli_generate_from_a_hub_id_offline(checkpoints, tmp_path):
    """transformer-parity generate org/name PROMPT --chat [--torch] prints generate_text's text, from the cache."""
    folder, _ = checkpoints["qwen2"]
    cache = hub_cache(tmp_path / "hub", folder, "org/tiny-chat")
    expected = generate_text(hf.load(folder), load_tokenizer(folder), [MESSAGES[1]], max_new_tokens=8)
    env = os.environ | {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    for extra in ([], ["--torch"]):
        command = [sys.executable, "-m", "parity_tests", "generate", "org/tiny-chat", MESSAGES[1]["content"], "--chat",
                   "--max-new-tokens", "8", *extra]  # fmt: skip
        run = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
        assert run.returncode == 0, run.stderr[-3000:]
        assert run.stdout == expected + "\n"
    run = subprocess.run([sys.executable, "-m", "parity_tests", "generate", "org/missing", "hi"], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=120)  # fmt: skip
    assert run.returncode == 2 and "'org/missing' is not a folder here" in run.stderr


def test_hub_id_without_huggingface_hub_says_to_install_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails as if it were not installed
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r'needs huggingface_hub: pip install "transformer-parity\[hub\]"'):
        hf.load("Qwen/Qwen2.5-0.5B-Instruct")
    with pytest.raises(ValueError, match="needs huggingface_hub"):
        load_tokenizer("Qwen/Qwen2.5-0.5B-Instruct")


def test_a_folder_wins_over_a_hub_id(checkpoints, tmp_path, monkeypatch):
    """An existing folder named like org/name is that folder (no Hub look-up: huggingface_hub made unimportable);
    what is not of the form org/name is a path, for the loader to say what is missing there."""
    folder, _ = checkpoints["llama"]
    shutil.copytree(folder, tmp_path / "org" / "tiny")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    assert hf.load("org/tiny").config.d_model == hf.load(folder).config.d_model
    names = ("org/tiny", "Qwen/Qwen2.5-0.5B-Instruct", "a/b/c", "./x", "/abs", "gpt2", 3)
    assert [hub.is_hub_id(s) for s in names] == [False, True, False, False, False, False, False]
    with pytest.raises(ValueError, match="no config.json"):
        hf.load("not/../a-hub-id")
    with pytest.raises(TypeError, match="checkpoint folder or a Hub id"):
        hub.checkpoint_folder(3)


def test_generate_text_refuses_bad_arguments(checkpoints):
    folder, _ = checkpoints["qwen2"]
    model, tokenizer = hf.load(folder), load_tokenizer(folder)
    plain = Tokenizer(tokenizer.backend)  # no chat template
    with pytest.raises(ValueError, match="no chat template"):
        generate_text(model, plain, MESSAGES)
    with pytest.raises(TypeError, match=r"messages\[0\] must be a dict with a str 'role'"):
        generate_text(model, tokenizer, [{"content": "x"}])
    with pytest.raises(TypeError, match="messages must be a non-empty list"):
        generate_text(model, tokenizer, [])
    with pytest.raises(ValueError, match="max_new_tokens must be a positive int, got 0"):
        generate_text(model, tokenizer, "hi", max_new_tokens=0)
    with pytest.raises(TypeError, match="stream must be a callable"):
        generate_text(model, tokenizer, "hi", stream="print")
    with pytest.raises(TypeError, match="tokenizer must be a Tokenizer"):
        generate_text(model, tokenizer.backend, "hi")
    with pytest.raises(ValueError, match="the prompt encodes to no tokens"):
        generate_text(model, tokenizer, "")


@pytest.mark.parametrize("side", ["numpy", "torch"])
def test_generate_text_beam_search_equals_transformers(checkpoints, side):
    """num_beams > 1: the winning hypothesis's text, as tokenizer.decode(generate(num_beams=3)), passed to the stream
    once beam search has chosen it (generate() streams nothing from a beam search)."""
    folder, theirs = checkpoints["llama"]
    tokenizer = load_tokenizer(folder)
    ids = tokenizer.prompt_ids("The cat sat on")
    out = theirs.generate(torch.tensor([ids]), max_new_tokens=STEPS, do_sample=False, num_beams=3)
    expected = tokenizer.decode(out[0, len(ids) :].tolist())
    assert expected != tokenizer.decode(their_new_tokens(theirs, ids))  # beam search chose other tokens than greedy
    model, generate = load_side(side, folder)
    pieces: list[str] = []
    text = generate(model, tokenizer, "The cat sat on", max_new_tokens=STEPS, stream=pieces.append, num_beams=3)
    assert text == expected == "".join(pieces)


def test_generate_text_samples_reproducibly(checkpoints):
    """do_sample with a seed: the same text for the same seed, the tokens of decoding.generate under that seed, and
    other text for other seeds (a sampler that ignored its rng, or fell back to greedy, fails)."""
    from numpy_transformer.decoding import generate as np_generate

    folder, theirs = checkpoints["qwen2"]
    tokenizer, model = load_tokenizer(folder), hf.load(folder, dtype=np.float64)
    ids = tokenizer.prompt_ids("The cat sat on")
    settings = dict(do_sample=True, temperature=1.5, top_k=0)
    texts = [generate_text(model, tokenizer, "The cat sat on", STEPS, rng=seed, **settings) for seed in (7, 7, 8, 9)]
    assert texts[0] == texts[1]
    tokens = np_generate(model, np.array([ids]), max_new_tokens=STEPS, rng=7, **settings)[0, len(ids) :].tolist()
    assert texts[0] == tokenizer.decode(tokens)
    greedy = tokenizer.decode(their_new_tokens(theirs, ids))
    assert len({*texts[1:], greedy}) == 4


def test_cli_generate_decoding_flags(checkpoints, tmp_path):
    """--sample, --greedy, --seed and the warpers reach decoding: a seeded sampled run repeats, another seed differs,
    --greedy gives greedy decoding's text; a bad value exits 2 naming the setting."""
    folder, _ = checkpoints["qwen2"]
    env = os.environ | {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}

    def run(*flags):
        command = [sys.executable, "-m", "parity_tests", "generate", str(folder), "The cat sat on",
                   "--max-new-tokens", "10", "--dtype", "float64", *flags]  # fmt: skip
        return subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)

    sampled = [run("--sample", "--temperature", "1.5", "--top-k", "0", "--seed", str(seed)) for seed in (3, 3, 4)]
    assert all(r.returncode == 0 for r in sampled), sampled[0].stderr[-3000:]
    assert sampled[0].stdout == sampled[1].stdout != sampled[2].stdout
    expected = generate_text(hf.load(folder, dtype=np.float64), load_tokenizer(folder), "The cat sat on", 10)
    greedy = run("--greedy", "--temperature", "1.5")
    assert greedy.returncode == 0 and greedy.stdout == expected + "\n"
    bad = run("--sample", "--top-p", "2.0", "--seed", "1")
    assert bad.returncode == 2 and "top_p" in bad.stderr


def test_cli_generate_min_new_tokens_and_end_tokens(checkpoints, capsys):
    """--eos-token-id, --min-new-tokens and --bad-words-ids reach generate() (run in process: no interpreter start):
    the first token the model writes made the end token stops the text at once; --min-new-tokens 6 bans it for six
    tokens, giving transformers' generate(eos_token_id=, min_new_tokens=) text; with --num-beams 2 a beam ends at the
    caller's end token as in generate(num_beams=2, eos_token_id=); --bad-words-ids bans a token."""
    from parity_tests.__main__ import generate_main

    folder, theirs = checkpoints["qwen2"]
    tokenizer = load_tokenizer(folder)
    ids = tokenizer.prompt_ids("The cat sat on")
    first = their_new_tokens(theirs, ids)[0]

    def run(*flags) -> str:
        argv = [str(folder), "The cat sat on", "--max-new-tokens", "8", "--dtype", "float64", *flags]
        assert generate_main(argv) == 0
        return capsys.readouterr().out

    assert run("--eos-token-id", str(first)) == tokenizer.decode([first]) + "\n"
    out = theirs.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=first, min_new_tokens=6)
    expected = out[0, len(ids) :].tolist()
    assert len(expected) >= 6 and first not in expected[:5]
    assert run("--eos-token-id", str(first), "--min-new-tokens", "6") == tokenizer.decode(expected) + "\n"
    second = their_new_tokens(theirs, ids)[1]
    out = theirs.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, num_beams=2, eos_token_id=second)
    assert out.shape[1] < len(ids) + 8  # a beam ended at the caller's end token
    beams = run("--eos-token-id", str(second), "--num-beams", "2")
    assert beams == tokenizer.decode(out[0, len(ids) :].tolist()) + "\n"
    out = theirs.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, bad_words_ids=[[first]])
    banned = out[0, len(ids) :].tolist()
    assert first not in banned and run("--bad-words-ids", str(first)) == tokenizer.decode(banned) + "\n"
