"""Checkpoints that load as the file says and save what they loaded, on both sides.

- Ties as the file says: transformers 5 writes an untied T5 as `tie_word_embeddings: true, scale_decoder_outputs:
  false`, an untied BART or Marian with `encoder/decoder.embed_tokens` apart from `shared`; a Hub-style T5 v1.1 says
  `tie_word_embeddings: false` and holds its own `lm_head.weight`. Each loads to transformers' logits and every
  gradient (float64, 1e-10), and a tied copy that differs from its source is used, never skipped.
- Saves: hf.save writes every tensor from_pretrained expects (no missing, no unexpected keys), the generation
  rules (generation_config.json), refuses a folder holding another checkpoint unless overwrite=True, and a failed
  write leaves no temporary file.
- Tiny transformers models built here (save_pretrained), never downloaded.
"""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import numpy_transformer as nt
import torch_transformer as tt
from numpy_transformer import hf as np_hf
from parity_tests import components as C
from parity_tests.hf_compare import (
    VARIANTS,
    build_seq2seq,
    build_tiny,
    compare_seq2seq,
    make_inputs,
    seq2seq_batch,
    seq2seq_patch,
    seq2seq_reference,
    tiny_config,
)
from torch_transformer import hf as torch_hf

transformers.logging.set_verbosity_error()

# variant -> (the model type hf_compare knows it as, build overrides, expected (share_embeddings, tie_embeddings,
# output_scale is d^-0.5))
UNTIED = {
    "t5 untied": ("t5 v1.1", dict(tie_word_embeddings=False), (True, True, False)),
    "t5 hub-style": ("t5 v1.1", dict(tie_word_embeddings=False), (True, False, False)),
    "bart untied": ("bart", dict(tie_word_embeddings=False), (False, False, False)),
    "marian untied": ("marian", dict(tie_word_embeddings=False), (False, False, False)),
}


def hub_style_t5(directory) -> None:
    """What a T5 v1.1 on the Hub holds: tie_word_embeddings false (no scale_decoder_outputs) and an lm_head.weight
    of its own, different from shared.weight."""
    config = json.loads((directory / "config.json").read_text())
    config.pop("scale_decoder_outputs", None)
    config["tie_word_embeddings"] = False
    (directory / "config.json").write_text(json.dumps(config))
    tensors = load_file(directory / "model.safetensors")
    generator = torch.Generator().manual_seed(7)
    tensors["lm_head.weight"] = 0.3 * torch.randn(tensors["shared.weight"].shape, generator=generator)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    """variant -> directory of a trained tiny untied checkpoint, as transformers 5 writes it."""
    out = {}
    for variant, (model_type, overrides, _) in UNTIED.items():
        directory = tmp_path_factory.mktemp(variant.replace(" ", "_"))
        build_seq2seq(model_type, steps=20, **overrides).save_pretrained(directory)
        if variant == "t5 hub-style":
            hub_style_t5(directory)
        out[variant] = directory
    return out


def load(side: str, directory, dtype=np.float64):
    if side == "numpy":
        return np_hf.load(directory, dtype=dtype)
    return torch_hf.load(directory, dtype={np.float64: torch.float64, np.float32: torch.float32}[dtype])


@pytest.mark.parametrize("side", ["numpy", "torch"])
@pytest.mark.parametrize("variant", UNTIED)
def test_untied_checkpoints_match_transformers(untied, variant, side):
    """Logits and every gradient within 1e-10 of transformers' in float64, with the ties the file keeps."""
    model_type, _, (share, tie, scaled) = UNTIED[variant]
    model = load(side, untied[variant])
    config = model.config
    assert (config.share_embeddings, config.tie_embeddings, config.output_scale != 1.0) == (share, tie, scaled)
    result = compare_seq2seq(untied[variant], model_type, np.float64, side)
    problems = C.failures(result, np.float64)
    assert not problems, "\n".join(problems)
    assert len(result.grads) >= 30 and all(np.any(ours) for ours, _ in result.grads.values())


def test_a_tied_copy_is_checked_not_skipped(untied, tmp_path):
    """The copies a tied config skips are compared with their source: with the file's untied tables put back as
    copies of `shared` (and lm_head of the decoder's table), the same directory loads tied."""
    directory = tmp_path / "retied"
    directory.mkdir()
    for name in ("config.json", "generation_config.json"):
        (directory / name).write_bytes((untied["bart untied"] / name).read_bytes())
    tensors = load_file(untied["bart untied"] / "model.safetensors")
    for name in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"):
        tensors[name] = tensors["model.shared.weight"].clone()
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | {"tie_word_embeddings": True}))
    model = np_hf.load(directory)
    assert model.config.share_embeddings and model.config.tie_embeddings
    tensors["lm_head.weight"][0, 0] += 1.0  # one value off: the head is its own
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    model = np_hf.load(directory)
    assert model.config.share_embeddings and not model.config.tie_embeddings
    np.testing.assert_array_equal(model.params["output_proj.weight"], tensors["lm_head.weight"].numpy())


DECODER_VARIANTS = ("bert", "roberta", "xlm-roberta relu", "distilbert", "mpnet", "gpt2 tied", "gpt2 untied",
                    "llama GQA 4/2 untied theta=500",
                    "llama MQA 4/1 tied theta=10000", "mistral window=3 GQA 4/2", "qwen2 qkv biases GQA 4/2",
                    "bloom ALiBi 4 heads tied", "bloom ALiBi 8 heads untied")  # fmt: skip
SEQ2SEQ = ("marian", "bart", "t5", "t5 v1.1")


@pytest.fixture(scope="module")
def every_family(untied, tmp_path_factory):
    """Every family's tiny checkpoint, tied and untied: hf_compare.VARIANTS, the seq2seq models, UNTIED."""
    out = dict(untied)
    for variant in DECODER_VARIANTS:
        family, overrides = VARIANTS[variant]
        out[variant] = tmp_path_factory.mktemp(family)
        build_tiny(family, out[variant], **overrides)
    for model_type in SEQ2SEQ:
        out[model_type] = tmp_path_factory.mktemp(model_type.replace(" ", "_"))
        build_seq2seq(model_type, steps=0).save_pretrained(out[model_type])
    return out


def transformers_class(directory):
    architecture = json.loads((directory / "config.json").read_text())["architectures"][0]
    return getattr(transformers, architecture)


def reference_outputs(model, seed: int = 3):
    """Outputs of a transformers model on a fixed batch: logits (or hidden states of an encoder)."""
    config = model.config
    rng = np.random.default_rng(seed)
    ids = torch.from_numpy(rng.integers(3, 20, size=(2, 6)))
    with torch.no_grad():
        if config.is_encoder_decoder:
            start = config.decoder_start_token_id
            tgt = torch.cat([torch.full((2, 1), start), ids[:, :4]], dim=1)
            return model(input_ids=ids, decoder_input_ids=tgt).logits
        out = model(input_ids=ids)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


ROUND_TRIP = (*DECODER_VARIANTS, *SEQ2SEQ, *UNTIED)


@pytest.mark.parametrize("side", ["numpy", "torch"])
@pytest.mark.parametrize("name", ROUND_TRIP)
def test_round_trip_writes_every_tensor_from_pretrained_expects(every_family, name, side, tmp_path):
    """Ours (float64) saved, then from_pretrained: no missing and no unexpected tensor, the same outputs as the
    original checkpoint to 1e-12, and our loader reads back the same ties."""
    directory = every_family[name]
    cls = transformers_class(directory)
    original = cls.from_pretrained(directory, dtype=torch.float64).eval()
    model = load(side, directory)
    (np_hf if side == "numpy" else torch_hf).save(model, tmp_path / "saved")
    reloaded, info = cls.from_pretrained(tmp_path / "saved", dtype=torch.float64, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    expected, got = reference_outputs(original), reference_outputs(reloaded.eval())
    assert torch.abs(expected).max() > 0.1
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    again = load(side, tmp_path / "saved")
    for field in ("share_embeddings", "tie_embeddings", "output_scale"):
        assert getattr(again.config, field) == getattr(model.config, field), field


# ----------------------------------------------------------------------------------------------
# Saves that keep what they load.


@pytest.fixture(scope="module")
def bart(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bart_rules")
    build_seq2seq("bart", steps=20).save_pretrained(directory)
    path = directory / "generation_config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"bad_words_ids": [[6]], "forced_bos_token_id": 7}))
    return directory


SIDES = {"numpy": (np_hf, nt.generate, np.asarray), "torch": (torch_hf, tt.generate, torch.from_numpy)}


@pytest.mark.parametrize("side", ["numpy", "torch"])
def test_a_save_keeps_the_generation_rules(bart, side, tmp_path):
    """BART with bad_words_ids [[6]] and a forced first token, loaded, saved and loaded again: the same rules, the
    same greedy output, and generate() reading the saved folder agrees."""
    hf, greedy, to = SIDES[side]
    model = hf.load(bart, dtype=torch.float32) if side == "torch" else hf.load(bart)
    hf.save(model, tmp_path / "saved")
    again = hf.load(tmp_path / "saved")
    assert again.generation_rules == model.generation_rules
    assert again.generation_rules.bad_words == ((6,),) and again.generation_rules.forced_bos_id == 7
    src, _, _ = seq2seq_batch(model.config, np.random.default_rng(2))
    first, second = (np.asarray(greedy(m, to(src), max_new_tokens=8, num_beams=1)) for m in (model, again))
    np.testing.assert_array_equal(first, second)
    reference = seq2seq_reference(tmp_path / "saved", "bart", np.float32)
    expected = reference.generate(
        input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(src != model.config.pad_id),
        do_sample=False, num_beams=1, max_new_tokens=8,
    ).numpy()  # fmt: skip
    np.testing.assert_array_equal(second, expected)


@pytest.mark.parametrize("side", ["numpy", "torch"])
def test_a_folder_holding_another_checkpoint_is_refused_unless_overwrite(bart, side, tmp_path):
    """Saving over another model's folder: refused, naming the files; overwrite=True replaces it and removes the
    checkpoint files this save does not write (another model's shards, index and generation config)."""
    hf = SIDES[side][0]
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "notes.txt").write_text("not a checkpoint file: kept")
    (folder / "model.safetensors.index.json").write_text("{}")
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"old")
    (folder / "generation_config.json").write_text(json.dumps({"bad_words_ids": [[3], [4]]}))
    build_tiny("bert", tmp_path / "bert")
    encoder = hf.load(tmp_path / "bert")
    with pytest.raises(ValueError, match=r"holds another checkpoint \(generation_config.json, model-00001"):
        hf.save(encoder, folder)
    assert (folder / "model-00001-of-00002.safetensors").read_bytes() == b"old"  # untouched
    (folder / ".hf-save-model.safetensors.k1ll3d").write_bytes(b"\0" * 100)  # what a killed save leaves behind
    hf.save(encoder, folder, overwrite=True)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors", "notes.txt"]
    hf.save(hf.load(bart), folder, overwrite=True)  # a model that generates writes its own generation config
    assert "generation_config.json" in {p.name for p in folder.iterdir()}
    with pytest.raises(ValueError, match="holds another checkpoint"):
        hf.save(encoder, folder)  # its own previous save is a checkpoint too


@pytest.mark.parametrize("side", ["numpy", "torch"])
def test_a_failed_save_leaves_no_temporary_file(bart, side, tmp_path, monkeypatch):
    """The tensor file's write fails halfway (a full disk): the error comes out, the previous checkpoint is intact,
    and no temporary file is left in the folder."""
    hf = SIDES[side][0]
    model = hf.load(bart)
    folder = tmp_path / "folder"
    hf.save(model, folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def failing(tensors, path, metadata=None):
        with open(path, "wb") as f:
            f.write(b"\0" * 1000)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hf, "save_file", failing) if side == "torch" else monkeypatch.setattr(
        "safetensors.numpy.save_file", failing
    )
    with pytest.raises(OSError, match="No space left"):
        hf.save(model, folder, overwrite=True)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


# ----------------------------------------------------------------------------------------------
# Hostile folders, refused on both sides by the one validation that runs before anything is allocated, each
# error naming the file and the field.


def edit_config(**fields):
    def edit(directory):
        path = directory / "config.json"
        text = json.dumps(json.loads(path.read_text()) | fields)
        path.write_text(text.replace('"<NaN>"', "NaN").replace('"<Infinity>"', "Infinity"))

    return edit


def retype(name: str, dtype):
    def edit(directory):
        tensors = load_file(directory / "model.safetensors")
        tensors[name] = tensors[name].to(dtype)
        save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})

    return edit


def shards(where):
    """model.safetensors split in two shards listed by an index; where(names) -> the weight map to write."""

    def edit(directory):
        tensors = load_file(directory / "model.safetensors")
        (directory / "model.safetensors").unlink()
        names = sorted(tensors)
        for shard, part in (("a.safetensors", names[::2]), ("b.safetensors", names[1::2])):
            save_file({n: tensors[n] for n in part}, directory / shard, metadata={"format": "pt"})
        save_file(tensors, directory.parent / "outside.safetensors", metadata={"format": "pt"})
        weight_map = where(names, directory)
        (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    return edit


def twice(names, directory):
    save_file(
        load_file(directory / "a.safetensors") | load_file(directory / "b.safetensors"), directory / "b.safetensors"
    )
    return {n: "a.safetensors" if i % 2 == 0 else "b.safetensors" for i, n in enumerate(names)}


LLAMA_LAYER = "model.layers.0.self_attn.q_proj.weight"
# case -> (the family's tiny checkpoint (hf_compare.TINY), the edit, the error expected: file and field)
HOSTILE = {
    "rope_theta NaN": ("llama", edit_config(rope_theta="<NaN>"), r"config.json: rope_theta=nan"),
    'rope_theta "nan"': ("llama", edit_config(rope_theta="nan"), r"config.json: rope_theta='nan' \(str\)"),
    "rope_theta Infinity": ("llama", edit_config(rope_theta="<Infinity>"), r"config.json: rope_theta=inf"),
    "rope_parameters.rope_theta NaN": (
        "llama", edit_config(rope_parameters={"rope_type": "default", "rope_theta": "<NaN>"}),
        r"config.json: rope_parameters.rope_theta=nan",
    ),
    "rms_norm_eps Infinity": ("llama", edit_config(rms_norm_eps="<Infinity>"), r"config.json: rms_norm_eps=inf"),
    "layer_norm_epsilon -1": ("gpt2", edit_config(layer_norm_epsilon=-1.0), r"config.json: layer_norm_epsilon=-1"),
    "attention_dropout NaN": ("llama", edit_config(attention_dropout="<NaN>"), r"config.json: attention_dropout=nan"),
    "resid_pdrop 1.5": ("gpt2", edit_config(resid_pdrop=1.5), r"config.json: resid_pdrop=1.5"),
    "sliding_window 2.7": ("mistral", edit_config(sliding_window=2.7), r"config.json: sliding_window=2.7 \(float\)"),
    'hidden_size "32"': ("llama", edit_config(hidden_size="32"), r"config.json: hidden_size='32' \(str\)"),
    "n_layer true": ("gpt2", edit_config(n_layer=True), r"config.json: n_layer=True \(bool\)"),
    "vocab_size 0": ("gpt2", edit_config(vocab_size=0), r"config.json: vocab_size=0"),
    'pad_token_id "0"': ("llama", edit_config(pad_token_id="0"), r"config.json: pad_token_id='0'"),
    "intermediate_size 10**9": (
        "llama", edit_config(intermediate_size=10**9),
        r"config.json: the model it describes would claim (715|1.43e\+03) GiB, more than",  # torch: no gradients
    ),
    "num_hidden_layers 10**5": (
        "llama", edit_config(num_hidden_layers=10**5), r"config.json: the config claims 100000 layers",
    ),
    "a shard outside the folder": (
        "llama", shards(lambda names, d: dict.fromkeys(names, "../outside.safetensors")),
        r"index.json: shard '../outside.safetensors' is not a file name in the checkpoint's directory",
    ),
    "a shard at an absolute path": (
        "llama", shards(lambda names, d: dict.fromkeys(names, str(d.parent / "outside.safetensors"))),
        r"index.json: shard '/.*outside.safetensors' is not a file name in the checkpoint's directory",
    ),
    "a tensor in two shards": ("llama", shards(twice), r"b.safetensors: holds tensors another shard holds too"),
    "an int32 tensor": (
        "llama", retype(LLAMA_LAYER, torch.int32), rf"model.safetensors: {LLAMA_LAYER}: dtype int32, not floating",
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """family -> a tiny checkpoint of hf_compare.TINY."""
    out = {}
    for family in ("llama", "gpt2", "mistral"):
        out[family] = tmp_path_factory.mktemp(family) / "checkpoint"
        build_tiny(family, out[family])
    return out


def hostile(tiny, case, tmp_path):
    family, edit, expected = HOSTILE[case]
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    for path in tiny[family].iterdir():
        (directory / path.name).write_bytes(path.read_bytes())
    edit(directory)
    return directory, expected


@pytest.mark.parametrize("side", ["numpy", "torch"])
@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_folders_are_refused_naming_the_file_and_the_field(tiny, case, side, tmp_path):
    directory, expected = hostile(tiny, case, tmp_path)
    with pytest.raises(ValueError, match=expected) as error:
        load(side, directory, np.float32)
    assert str(directory) in str(error.value)


@pytest.mark.parametrize("side", ["numpy", "torch"])
def test_the_memory_limit_is_the_users_to_raise(tiny, side, tmp_path):
    """max_bytes bounds the memory the model claims (parameters, and the NumPy side's gradients, in the dtype
    asked for); a larger one loads the same folder."""
    with pytest.raises(ValueError, match=r"would claim .* GiB, more than max_bytes=1000 .* pass a larger max_bytes"):
        (np_hf if side == "numpy" else torch_hf).load(tiny["llama"], max_bytes=1000)
    model = (np_hf if side == "numpy" else torch_hf).load(tiny["llama"], max_bytes=10**6)
    assert model.config.d_model == 32
    for bad in (0, -1, 2.5, "1e9", None):
        with pytest.raises(ValueError, match="max_bytes must be a positive int"):
            (np_hf if side == "numpy" else torch_hf).load(tiny["llama"], max_bytes=bad)


@pytest.mark.parametrize("side", ["numpy", "torch"])
def test_a_bad_dropout_argument_is_blamed_on_the_argument(tiny, side):
    hf = np_hf if side == "numpy" else torch_hf
    for bad, kind in (("0.1", TypeError), (True, TypeError), (1.5, ValueError), (-0.1, ValueError),
                      (float("nan"), ValueError)):  # fmt: skip
        with pytest.raises(kind, match=r"^dropout must be None or a float in \[0, 1\), got") as error:
            hf.load(tiny["gpt2"], dropout=bad)
        assert "config.json" not in str(error.value)
    assert hf.load(tiny["gpt2"], dropout=0.25).config.dropout_rates["attention"] == 0.25


# ----------------------------------------------------------------------------------------------
# Tables built for the positions used.


@pytest.mark.parametrize("side", ["numpy", "torch"])
def test_a_marian_of_a_billion_positions_runs_a_short_input_in_little_memory(side, tmp_path):
    """max_position_embeddings 10**9: the sinusoids are computed for the positions an input uses (a table for
    max_len would be 7.45 GiB in float64); the logits equal those of the same model with 32 positions. The NumPy
    side's allocations are traced (under 4 MiB for this model), the torch side's table is built per call."""
    model = build_seq2seq("marian", steps=0)
    model.save_pretrained(tmp_path / "small")
    model.config.max_position_embeddings = 10**9
    model.save_pretrained(tmp_path / "huge")
    src, tgt = np.array([[5, 6, 7, 0]]), np.array([[23, 5, 6]])
    outputs = []
    for name in ("small", "huge"):
        if side == "numpy":
            tracemalloc.start()
            ours = np_hf.load(tmp_path / name, dtype=np.float64)
            outputs.append(ours.forward(src, tgt))
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert peak < 4 * 2**20, f"{peak} bytes"
        else:
            ours = torch_hf.load(tmp_path / name, dtype=torch.float64)
            outputs.append(ours(torch.from_numpy(src), torch.from_numpy(tgt)).detach().numpy())
    assert ours.config.max_len == 10**9
    np.testing.assert_array_equal(outputs[0], outputs[1])


# ----------------------------------------------------------------------------------------------
# Base checkpoints (a transformers class without its head).


def base_checkpoint(kind: str, directory) -> None:
    if kind == "LlamaModel":
        transformers.LlamaModel(tiny_config("llama")).save_pretrained(directory)
    elif kind == "GPT2Model":
        transformers.GPT2Model(tiny_config("gpt2")).save_pretrained(directory)
    elif kind == "BartModel":
        transformers.BartModel(build_seq2seq("bart", steps=0).config).save_pretrained(directory)
    else:
        transformers.T5EncoderModel(build_seq2seq("t5", steps=0).config).save_pretrained(directory)


@pytest.mark.parametrize("side", ["numpy", "torch"])
@pytest.mark.parametrize("kind", ["LlamaModel"])  # its untied lm_head, transformers draws at random (BartModel loads:
def test_a_base_model_without_a_head_is_refused_as_such(kind, side, tmp_path):  # test_hf_options)
    base_checkpoint(kind, tmp_path)
    with pytest.raises(ValueError, match=rf"this is a base model without a head \({kind}\)"):
        load(side, tmp_path)


@pytest.mark.parametrize("side", ["numpy", "torch"])
def test_a_tied_gpt2_base_model_loads_as_its_head_class_does(side, tmp_path):
    """GPT2Model holds every tensor GPT2LMHeadModel reads (its head is the token table): ours equals
    GPT2LMHeadModel.from_pretrained on that folder."""
    base_checkpoint("GPT2Model", tmp_path)
    reference = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, dtype=torch.float64).eval()
    ids = np.random.default_rng(0).integers(3, 40, size=(2, 5))
    with torch.no_grad():
        expected = reference(torch.from_numpy(ids)).logits.numpy()
    model = load(side, tmp_path)
    got = model.forward(ids) if side == "numpy" else model(torch.from_numpy(ids)).detach().numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def test_a_tie_the_family_cannot_undo_is_refused_naming_both_tensors():
    """resolve_ties with a family whose checkpoints cannot hold separate tables (BART's table, restricted to shared
    embeddings): a differing copy is refused, never skipped."""
    from dataclasses import replace

    from transformer_spec import families as hf_families

    strict = replace(hf_families.BART, supports=hf_families.BART.supports | {"share_embeddings": True})
    config = strict.from_hf(build_seq2seq("bart", steps=0).config.to_dict())
    names = ["model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"]
    with pytest.raises(ValueError, match=r"model.encoder.embed_tokens.weight differs from model.shared.weight.*cannot"):
        hf_families.resolve_ties(strict, config, names, lambda a, b: False)
    assert hf_families.resolve_ties(strict, config, names, lambda a, b: True) == (config, {})


# ----------------------------------------------------------------------------------------------
# BERT's pooler.


@pytest.mark.parametrize("side", ["numpy", "torch"])
def test_bert_pooler_and_every_gradient_match_transformers(side, tmp_path):
    """A BertModel checkpoint holds a pooler: ours has it (config.pooler), pool(hidden) equals pooler_output, and with
    random upstream gradients on both the hidden states and the pooled output every gradient (the pooler's and the
    encoder's through the [CLS] position) agrees with transformers' autograd in float64."""
    build_tiny("bert", tmp_path)
    reference = transformers.BertModel.from_pretrained(tmp_path, dtype=torch.float64).eval()
    ids, types = make_inputs("bert")
    rng = np.random.default_rng(5)
    D = reference.config.hidden_size
    up_hidden, up_pooled = rng.standard_normal((*ids.shape, D)), rng.standard_normal((ids.shape[0], D))
    t_ids, t_types = torch.from_numpy(ids), torch.from_numpy(types)
    out = reference(input_ids=t_ids, attention_mask=(t_ids != 0).long(), token_type_ids=t_types)
    loss = (out.last_hidden_state * torch.from_numpy(up_hidden)).sum() + (
        out.pooler_output * torch.from_numpy(up_pooled)
    ).sum()
    loss.backward()
    theirs = {name: p.grad.numpy() for name, p in reference.named_parameters()}
    model = load(side, tmp_path)
    assert model.config.pooler
    if side == "numpy":
        model.zero_grad()
        hidden = model.forward(ids, types)
        pooled = model.pool(hidden)
        model.backward(up_hidden + model.pool_backward(up_pooled))
        ours = np_hf.to_hf(model, model.grads, tied=False)
    else:
        hidden = model(t_ids, t_types)
        pooled = model.pool(hidden)
        ((hidden * torch.from_numpy(up_hidden)).sum() + (pooled * torch.from_numpy(up_pooled)).sum()).backward()
        grads = {name: p.grad for name, p in model.named_parameters()}
        ours = {k: v.numpy() for k, v in torch_hf.to_hf(model, grads, tied=False).items()}
        hidden, pooled = hidden.detach().numpy(), pooled.detach().numpy()
    assert sorted(ours) == sorted(theirs) and {"pooler.dense.weight", "pooler.dense.bias"} <= set(ours)
    result = C.Result(
        outputs={"hidden": (hidden, out.last_hidden_state.detach().numpy()),
                 "pooled": (pooled, out.pooler_output.detach().numpy())},
        grads={name: (ours[name], theirs[name]) for name in theirs},
    )  # fmt: skip
    problems = C.failures(result, np.float64)
    assert not problems, "\n".join(problems)
    assert all(np.any(g) for g, _ in result.grads.values())


def test_pool_is_refused_without_a_pooler_and_pool_backward_before_pool(tmp_path):
    config = nt.TransformerConfig(src_vocab_size=11, d_model=8, n_heads=2, d_ff=12, n_decoder_layers=0, pooler=True)
    model = nt.EncoderModel(config, dtype=np.float64)
    with pytest.raises(ValueError, match="pool_backward called before pool"):
        model.pool_backward(np.zeros((1, 8)))
    with pytest.raises(ValueError, match="this model has no pooler"):
        nt.EncoderModel(nt.TransformerConfig(d_model=8, n_heads=2, n_decoder_layers=0)).pool(np.zeros((1, 2, 8)))
    with pytest.raises(ValueError, match="this model has no pooler"):
        tt.EncoderModel(nt.TransformerConfig(d_model=8, n_heads=2, n_decoder_layers=0)).pool(torch.zeros(1, 2, 8))
    with pytest.raises(ValueError, match=r"hidden must have shape \(B, T, D\)"):
        model.pool(np.zeros((2, 8)))


@pytest.mark.parametrize("side", ["numpy", "torch"])
@pytest.mark.parametrize("model_type", ["t5", "t5 v1.1"])
def test_a_t5_encoder_checkpoint_loads_as_an_encoder_model(model_type, side, tmp_path):
    """T5EncoderModel (the encoder stack alone: sentence-T5 and the like) loads as an EncoderModel: hidden states
    after the final RMS norm and every gradient (shared.weight, the relative bias, each layer) within the float64 bar
    of transformers', padded rows masked as its attention_mask masks them; saved, it loads back into
    T5EncoderModel with every tensor."""
    trained = build_seq2seq(model_type, steps=20)
    encoder = transformers.T5EncoderModel(trained.config)
    encoder.load_state_dict(trained.state_dict(), strict=False)
    encoder.save_pretrained(tmp_path / "encoder")
    reference = transformers.T5EncoderModel.from_pretrained(tmp_path / "encoder", dtype=torch.float64).eval()
    model = load(side, tmp_path / "encoder")
    assert type(model).__name__ == "EncoderModel" and model.config.positional == "relative"
    ids = np.array([[5, 9, 7, 12, 4, 1], [8, 3, 6, 1, 0, 0]])
    upstream = np.random.default_rng(3).standard_normal((*ids.shape, reference.config.d_model))
    t_ids = torch.from_numpy(ids)
    with seq2seq_patch(model_type, np.float64):
        out = reference(input_ids=t_ids, attention_mask=(t_ids != 0).long()).last_hidden_state
    (out * torch.from_numpy(upstream)).sum().backward()
    theirs = {name: p.grad.numpy() for name, p in reference.named_parameters()}
    if side == "numpy":
        model.zero_grad()
        hidden = model.forward(ids)
        model.backward(upstream)
        ours = np_hf.to_hf(model, model.grads, tied=False)
    else:
        hidden_t = model(t_ids)
        (hidden_t * torch.from_numpy(upstream)).sum().backward()
        ours = {k: v.numpy() for k, v in torch_hf.to_hf(model, {n: p.grad for n, p in model.named_parameters()},
                                                         tied=False).items()}  # fmt: skip
        hidden = hidden_t.detach().numpy()
    assert sorted(ours) == sorted(theirs)
    result = C.Result(
        outputs={"hidden": (hidden, out.detach().numpy())}, grads={k: (ours[k], theirs[k]) for k in theirs}
    )
    problems = C.failures(result, np.float64)
    assert not problems, "\n".join(problems)
    assert all(np.any(g) for g, _ in result.grads.values())
    (np_hf if side == "numpy" else torch_hf).save(model, tmp_path / "saved")
    _, info = transformers.T5EncoderModel.from_pretrained(tmp_path / "saved", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info


@pytest.mark.parametrize(
    "cls, layers", [(nt.Transformer, (3, 5)), (nt.TransformerLM, (0, 4)), (nt.EncoderModel, (3, 0))]
)
def test_the_memory_estimate_counts_every_parameter_without_listing_them(cls, layers):
    """hf.parameter_count (from three small configs: the count is linear in each stack's layers) equals the count
    of the model built; a billion layers are counted at once, without a name for each."""
    config = nt.TransformerConfig(n_encoder_layers=layers[0], n_decoder_layers=layers[1], gated_ffn=True, pooler=False)
    assert np_hf.parameter_count(config, cls) == sum(v.size for v in cls(config).params.values())
    huge = nt.TransformerConfig(n_encoder_layers=layers[0] and 10**9, n_decoder_layers=layers[1] and 10**9)
    assert np_hf.parameter_count(huge, cls) > 10**12
