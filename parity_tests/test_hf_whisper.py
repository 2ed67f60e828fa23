"""Whisper (WhisperForConditionalGeneration) against transformers, and its audio front end by finite differences.

A tiny model of openai/whisper-tiny's shape (pre-norm, 6 heads, exact GELU, 80 mel bins, tied proj_out, pad = bos =
eos and a separate decoder start token), shrunk: d_model 24, 2 + 2 layers, 8 encoder positions (16 frames), 24
decoder positions, 120 tokens. Built and saved here with save_pretrained, loaded with our hf.load on both sides.
Required: float64 logits and every parameter gradient within 1e-10 of transformers' (a random upstream gradient;
gradients not all zero), in evaluation mode on both sides and in training mode on the NumPy side (transformers
replaying our dropout masks); greedy and beam search equal to generate() on input_features. Slow: the same at
whisper-tiny's full sizes.

generate() for Whisper is WhisperGenerationMixin's: on these 16-frame (short-form) features it starts from
decoder_start_token_id, the language, task and <|notimestamps|> tokens (forced_decoder_ids, or the generation
config's language and task) and returns the tokens after them; our decoders return that prompt first. With a
generation_config.json shaped like whisper-tiny's (forced_decoder_ids, suppress_tokens, begin_suppress_tokens,
lang_to_id, task_to_id, no_timestamps_token_id) greedy and beam search equal generate()'s, the language detected
as generate() detects it when the file names none (each row's own). Not computed: timestamps (a file that asks for
them warns by name).
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
import transformers

import numpy_transformer as nt
import torch_transformer as tt
from numpy_transformer import audio, gradcheck
from numpy_transformer import checkpoint as np_checkpoint
from numpy_transformer import hf as np_hf
from parity_tests import components as C
from torch_transformer import audio as torch_audio
from torch_transformer import checkpoint as torch_checkpoint
from torch_transformer import hf as torch_hf

transformers.logging.set_verbosity_error()

# whisper-tiny's config.json, its sizes shrunk (d_model 384, 4 + 4 layers, 1500 / 448 positions, 51865 tokens there)
WHISPER_TINY_SHRUNK = dict(
    vocab_size=120, num_mel_bins=80, d_model=24, encoder_layers=2, decoder_layers=2, encoder_attention_heads=6,
    decoder_attention_heads=6, encoder_ffn_dim=48, decoder_ffn_dim=48, max_source_positions=8,
    max_target_positions=24, pad_token_id=110, bos_token_id=110, eos_token_id=110, decoder_start_token_id=111,
    activation_function="gelu", scale_embedding=False, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
    encoder_layerdrop=0.0, decoder_layerdrop=0.0, apply_spec_augment=False, use_cache=True, tie_word_embeddings=True,
    begin_suppress_tokens=None, suppress_tokens=None,
    init_std=0.3,  # initialisation only: weights spread enough that greedy and beam search take varied paths
)  # fmt: skip


def build_whisper(directory, **overrides) -> None:
    torch.manual_seed(0)
    config = transformers.WhisperConfig(**WHISPER_TINY_SHRUNK | overrides)
    transformers.WhisperForConditionalGeneration(config).eval().save_pretrained(directory)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("whisper")
    build_whisper(directory)
    return directory


def reference(directory) -> transformers.WhisperForConditionalGeneration:
    model = transformers.WhisperForConditionalGeneration.from_pretrained(directory, dtype=torch.float64)
    return model.eval()


def features(batch: int = 2, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 80, 16))  # (B, n_mels, 2 * max_source_positions)


@pytest.mark.parametrize("side", ["numpy", "torch", "torch-cuda"])
def test_whisper_equals_transformers_in_float64(checkpoint, side):
    if side == "torch-cuda" and not torch.cuda.is_available():
        pytest.skip("CUDA is not available")
    result = compare_whisper(checkpoint, side)
    assert all(np.any(ours_grad) for ours_grad, _ in result.grads.values())  # no gradient vacuously zero
    assert not C.failures(result, np.float64)


def compare_whisper(checkpoint, side: str) -> C.Result:
    """Logits and every parameter gradient, ours (hf.load on `side`: "numpy", "torch" or "torch-cuda", the torch model
    on the GPU) vs transformers' on the CPU, in float64, one random upstream gradient of the logits."""
    rng = np.random.default_rng(1)
    x = features()
    tgt = np.array([[111, 5, 110, 7, 9, 3], [111, 110, 2, 8, 64, 110]])  # pad (= eos) read as a token
    R = rng.standard_normal((*tgt.shape, 120))  # the upstream gradient of the logits
    theirs = reference(checkpoint)
    out = theirs(input_features=torch.from_numpy(x), decoder_input_ids=torch.from_numpy(tgt)).logits
    (out * torch.from_numpy(R)).sum().backward()
    if side == "numpy":
        ours = np_hf.load(checkpoint, dtype=np.float64)
        assert isinstance(ours, audio.SpeechTransformer)
        logits = ours.forward(x, tgt)
        ours.backward(R)
        grads = np_hf.to_hf(ours, ours.grads)
    else:
        device = "cuda" if side == "torch-cuda" else "cpu"
        ours = torch_hf.load(checkpoint, dtype=torch.float64, device=device)
        assert isinstance(ours, torch_audio.SpeechTransformer)
        t_logits = ours(torch.from_numpy(x).to(device), torch.from_numpy(tgt).to(device))
        (t_logits * torch.from_numpy(R).to(device)).sum().backward()
        logits = C.to_numpy(t_logits)
        grads = torch_hf.to_hf(ours, {n: p.grad for n, p in ours.named_parameters()})
    result = C.Result()
    result.outputs["logits"] = (logits, C.to_numpy(out))
    for name, p in theirs.named_parameters():
        if name == "model.encoder.embed_positions.weight":
            # fixed sinusoids: a buffer here. WhisperEncoder freezes them (requires_grad_(False)), but a model from
            # from_pretrained (transformers 5) holds them trainable again; they are not compared as a gradient
            continue
        assert p.grad is not None, name
        result.grads[name] = (C.to_numpy(torch.as_tensor(grads[name])), C.to_numpy(p.grad))
    assert len(result.grads) == len(ours_parameters(ours))  # every parameter of ours compared
    return result


def ours_parameters(model) -> list:
    if isinstance(model, torch.nn.Module):
        return list(model.parameters())
    return [torch.from_numpy(v) for v in model.params.values()]


def test_whisper_decoding_equals_generate(checkpoint):
    """Greedy (cached and recomputed) and beam search, both sides, equal to generate() on input_features."""
    x = features(batch=3, seed=2)
    theirs = reference(checkpoint)
    t_x = torch.from_numpy(x)
    greedy = theirs.generate(input_features=t_x, max_new_tokens=10, do_sample=False, num_beams=1).numpy()
    beam = theirs.generate(input_features=t_x, max_new_tokens=10, do_sample=False, num_beams=3).numpy()
    ours_np = np_hf.load(checkpoint, dtype=np.float64)
    ours_torch = torch_hf.load(checkpoint, dtype=torch.float64)
    found = {
        "numpy greedy": nt.generate(ours_np, x, max_new_tokens=10, do_sample=False, num_beams=1),
        "numpy greedy, no cache": nt.generate(
            ours_np, x, max_new_tokens=10, do_sample=False, num_beams=1, use_cache=False
        ),
        "torch greedy": tt.generate(ours_torch, t_x, max_new_tokens=10, do_sample=False, num_beams=1).numpy(),
    }
    for name, tokens in found.items():
        assert (tokens[:, 0] == 111).all(), name  # the decoder start token first; generate() returns what follows
        np.testing.assert_array_equal(tokens[:, 1:], greedy, err_msg=name)
    assert len({tuple(row) for row in greedy}) > 1  # the rows took different paths: the comparison means something
    for name, tokens in {
        "numpy beam": nt.generate(ours_np, x, max_new_tokens=10, do_sample=False, num_beams=3),
        "torch beam": tt.generate(ours_torch, t_x, max_new_tokens=10, do_sample=False, num_beams=3).numpy(),
    }.items():
        np.testing.assert_array_equal(tokens[:, 1:], beam, err_msg=name)


def test_whisper_saves_load_in_transformers(checkpoint, tmp_path):
    x, tgt = features(), np.array([[111, 4, 5], [111, 6, 7]])
    expected = reference(checkpoint)(input_features=torch.from_numpy(x), decoder_input_ids=torch.from_numpy(tgt))
    np_hf.save(np_hf.load(checkpoint, dtype=np.float64), tmp_path / "numpy")
    torch_hf.save(torch_hf.load(checkpoint, dtype=torch.float64), tmp_path / "torch")
    for side in ("numpy", "torch"):
        again = reference(tmp_path / side)(input_features=torch.from_numpy(x), decoder_input_ids=torch.from_numpy(tgt))
        np.testing.assert_allclose(C.to_numpy(again.logits), C.to_numpy(expected.logits), rtol=0, atol=1e-12)
    # a model of our own (float64 sinusoids) writes its table: transformers reads exactly the values we use
    config = np_hf.load(checkpoint, dtype=np.float64).config
    own = audio.SpeechTransformer(config, seed=3)
    np_hf.save(own, tmp_path / "own")
    loaded = reference(tmp_path / "own")
    np.testing.assert_array_equal(
        C.to_numpy(loaded.model.encoder.embed_positions.weight), own.buffers[audio.POSITION_TABLE]
    )
    mine = own.forward(x, tgt)
    theirs = loaded(input_features=torch.from_numpy(x), decoder_input_ids=torch.from_numpy(tgt)).logits
    ((_, error),) = C.relative_errors({"logits": (mine, C.to_numpy(theirs))}, np.float64).values()
    assert error <= 1e-10


@pytest.mark.parametrize(
    ("key", "value"),
    [("scale_embedding", True), ("apply_spec_augment", True), ("encoder_layerdrop", 0.1), ("decoder_layerdrop", 0.1)],
)
def test_whisper_options_not_computed_are_refused_by_name(checkpoint, tmp_path, key, value):
    directory = tmp_path / "changed"
    directory.mkdir()
    for name in ("model.safetensors", "generation_config.json"):
        (directory / name).write_bytes((checkpoint / name).read_bytes())
    config = json.loads((checkpoint / "config.json").read_text()) | {key: value}
    (directory / "config.json").write_text(json.dumps(config))
    for load in (np_hf.load, torch_hf.load):
        with pytest.raises(ValueError, match=key):
            load(directory)


def test_whisper_input_features_are_checked(checkpoint):
    ours = np_hf.load(checkpoint, dtype=np.float64)
    tgt = np.array([[111, 4]])
    with pytest.raises(ValueError, match="input_features must have shape \\(B, 80, 16\\)"):
        ours.forward(np.zeros((1, 80, 15)), tgt)  # transformers' WhisperEncoder refuses it too
    with pytest.raises(TypeError, match="input_features"):
        ours.forward(np.zeros((1, 80, 16), dtype=np.int64), tgt)
    t_ours = torch_hf.load(checkpoint, dtype=torch.float64)
    with pytest.raises(ValueError, match="input_features must have shape"):
        t_ours(torch.zeros(1, 80, 15, dtype=torch.float64), torch.tensor(tgt))


def test_conv1d_pair_and_front_end_by_finite_differences():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 7))
    for stride in (1, 2):
        args = dict(x=x, weight=rng.standard_normal((4, 3, 3)), bias=rng.standard_normal(4), stride=stride, padding=1)
        fd = gradcheck.check_pair(audio.conv1d_forward, audio.conv1d_backward, args, ["x", "weight", "bias"])
        assert fd.worst <= 1e-6, str(fd)
        y, _ = audio.conv1d_forward(**args)
        t_args = {k: torch.from_numpy(v) for k, v in args.items() if isinstance(v, np.ndarray)}
        expected = torch.nn.functional.conv1d(t_args["x"], t_args["weight"], t_args["bias"], stride=stride, padding=1)
        np.testing.assert_allclose(y, expected.numpy(), rtol=0, atol=1e-13)
    params = {
        "conv1.weight": rng.standard_normal((6, 3, 3)),
        "conv1.bias": rng.standard_normal(6),
        "conv2.weight": rng.standard_normal((6, 6, 3)),
        "conv2.bias": rng.standard_normal(6),
    }
    table = audio.whisper_sinusoids(4, 6)
    args = dict(params=params, features=rng.standard_normal((2, 3, 8)), table=table)
    fd = gradcheck.check_pair(audio.audio_embed_forward, audio.audio_embed_backward, args, ["params"])
    assert fd.worst <= 1e-6, str(fd)


def test_whisper_sinusoids_are_transformers_table():
    from transformers.models.whisper.modeling_whisper import sinusoids

    theirs = sinusoids(12, 24).numpy()  # computed in float32 there
    for ours in (audio.whisper_sinusoids(12, 24), torch_audio.whisper_sinusoids(12, 24).numpy()):
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)


def test_speech_transformer_config_needs_are_named():
    config = nt.TransformerConfig(n_mels=8, source_positions=4, norm_first=True, positional="sinusoidal")
    for build in (audio.SpeechTransformer, torch_audio.SpeechTransformer):
        with pytest.raises(ValueError, match="positional"):
            build(config)
    with pytest.raises(ValueError, match="n_mels"):
        audio.SpeechTransformer(nt.TransformerConfig(norm_first=True, positional="learned"))
    with pytest.raises(ValueError, match="source_positions"):
        torch_audio.SpeechTransformer(nt.TransformerConfig(n_mels=8, norm_first=True, positional="learned"))


@pytest.mark.slow
@pytest.mark.parametrize("side", ["numpy", "torch"])
def test_whisper_tiny_full_shape_equals_transformers_in_float64(tmp_path, side):
    """whisper-tiny's own sizes (WhisperConfig's defaults: d_model 384, 4 + 4 layers, 6 heads, 1536 hidden, 80 mel
    bins, 1500 encoder positions from 3000 frames, 448 decoder positions, 51865 tokens), random weights."""
    torch.manual_seed(0)
    config = transformers.WhisperConfig(begin_suppress_tokens=None, suppress_tokens=None)
    transformers.WhisperForConditionalGeneration(config).eval().save_pretrained(tmp_path)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 80, 3000))
    tgt = np.array([[50258, 50259, 50359, 50363, 400, 50257]])
    R = rng.standard_normal((*tgt.shape, 51865))
    theirs = reference(tmp_path)
    out = theirs(input_features=torch.from_numpy(x), decoder_input_ids=torch.from_numpy(tgt)).logits
    (out * torch.from_numpy(R)).sum().backward()
    if side == "numpy":
        ours = np_hf.load(tmp_path, dtype=np.float64)
        logits = ours.forward(x, tgt)
        ours.backward(R)
        grads = np_hf.to_hf(ours, ours.grads)
    else:
        t_ours = torch_hf.load(tmp_path, dtype=torch.float64)
        t_logits = t_ours(torch.from_numpy(x), torch.from_numpy(tgt))
        (t_logits * torch.from_numpy(R)).sum().backward()
        logits = C.to_numpy(t_logits)
        grads = torch_hf.to_hf(t_ours, {n: p.grad for n, p in t_ours.named_parameters()})
    result = C.Result()
    result.outputs["logits"] = (logits, C.to_numpy(out))
    for name, p in theirs.named_parameters():
        if name != "model.encoder.embed_positions.weight":  # fixed sinusoids (see compare_whisper)
            result.grads[name] = (C.to_numpy(torch.as_tensor(grads[name])), C.to_numpy(p.grad))
    assert all(np.any(ours_grad) for ours_grad, _ in result.grads.values())
    assert not C.failures(result, np.float64), C.worst(result, np.float64)


# openai/whisper-tiny's config.json as released (its keys and option values; sizes and token ids shrunk to the tiny
# model above: d_model 384 -> 24, 4 + 4 layers -> 2 + 2, 1500 / 448 positions -> 8 / 24, 51865 tokens -> 120, the
# special ids 50257 -> 110, 50258 -> 111, the forced language / task / no-timestamps ids -> 112, 113, 114)
WHISPER_TINY_RELEASED = {
    "_name_or_path": "openai/whisper-tiny", "activation_dropout": 0.0, "activation_function": "gelu",
    "apply_spec_augment": False, "architectures": ["WhisperForConditionalGeneration"], "attention_dropout": 0.0,
    "begin_suppress_tokens": [100, 110], "bos_token_id": 110, "classifier_proj_size": 256, "d_model": 24,
    "decoder_attention_heads": 6, "decoder_ffn_dim": 48, "decoder_layerdrop": 0.0, "decoder_layers": 2,
    "decoder_start_token_id": 111, "dropout": 0.0, "encoder_attention_heads": 6, "encoder_ffn_dim": 48,
    "encoder_layerdrop": 0.0, "encoder_layers": 2, "eos_token_id": 110,
    "forced_decoder_ids": [[1, 112], [2, 113], [3, 114]], "init_std": 0.02, "is_encoder_decoder": True,
    "mask_feature_length": 10, "mask_feature_min_masks": 0, "mask_feature_prob": 0.0, "mask_time_length": 10,
    "mask_time_min_masks": 2, "mask_time_prob": 0.05, "max_length": 24, "max_source_positions": 8,
    "max_target_positions": 24, "median_filter_width": 7, "model_type": "whisper", "num_hidden_layers": 2,
    "num_mel_bins": 80, "pad_token_id": 110, "scale_embedding": False, "suppress_tokens": [1, 2, 7],
    "torch_dtype": "float32", "transformers_version": "4.27.0.dev0", "use_cache": True,
    "use_weighted_layer_sum": False, "vocab_size": 120,
}  # fmt: skip
# keys no layer of WhisperForConditionalGeneration computes with (initialisation, SpecAugment's settings while
# apply_spec_augment is false, the audio classifier's, word timestamps', bookkeeping) and generation settings
# (forced_decoder_ids, suppress_tokens, begin_suppress_tokens, max_length: decoding's, applied by generate())
WHISPER_NOT_COMPUTED = {
    "_name_or_path", "architectures", "model_type", "torch_dtype", "transformers_version", "use_cache", "init_std",
    "num_hidden_layers", "bos_token_id", "classifier_proj_size", "median_filter_width", "mask_feature_length",
    "mask_feature_min_masks", "mask_feature_prob", "mask_time_length", "mask_time_min_masks", "mask_time_prob",
    "forced_decoder_ids", "suppress_tokens", "begin_suppress_tokens", "max_length",
}  # fmt: skip


@pytest.mark.parametrize("side", ["numpy", "torch"])
def test_whisper_tiny_released_config_json_reads_whole(checkpoint, side, tmp_path):
    """Every key whisper-tiny's config.json sets is read by the family's map or computed by no layer of transformers'
    class; a checkpoint carrying it equals transformers' in float64, outputs and every gradient."""
    from transformer_spec.families.whisper import WHISPER_CONFIG

    read = {key.theirs for key in WHISPER_CONFIG.keys} | set(WHISPER_CONFIG.dropout)
    assert set(WHISPER_TINY_RELEASED) - read == WHISPER_NOT_COMPUTED
    (tmp_path / "model.safetensors").write_bytes((checkpoint / "model.safetensors").read_bytes())
    (tmp_path / "config.json").write_text(json.dumps(WHISPER_TINY_RELEASED))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # forced_decoder_ids, suppress_tokens, begin_suppress_tokens: all applied now
        result = compare_whisper(tmp_path, side)
    assert not C.failures(result, np.float64)


def test_whisper_in_training_mode_drops_the_units_transformers_drops(tmp_path):
    """The NumPy model in training mode with the checkpoint's dropout rates (0.1 after the embeddings and on each
    sublayer's output, 0.2 on the attention probabilities, 0.3 on the feed-forward's hidden units); transformers'
    model (eager attention) replays our keep-masks (hf_compare.replayed_dropout, each checked for its shape and
    rate): logits and every gradient equal in float64."""
    from parity_tests.hf_compare import replayed_dropout

    build_whisper(tmp_path, dropout=0.1, attention_dropout=0.2, activation_dropout=0.3)
    rng = np.random.default_rng(4)
    x, tgt = features(), np.array([[111, 5, 6, 7], [111, 8, 9, 10]])
    R = rng.standard_normal((*tgt.shape, 120))
    ours = np_hf.load(tmp_path, dtype=np.float64).train()
    logits = ours.forward(x, tgt)
    ours.backward(R)
    grads = np_hf.to_hf(ours, ours.grads)
    theirs = transformers.WhisperForConditionalGeneration.from_pretrained(
        tmp_path, dtype=torch.float64, attn_implementation="eager"
    ).train()
    with replayed_dropout(ours):
        out = theirs(input_features=torch.from_numpy(x), decoder_input_ids=torch.from_numpy(tgt)).logits
    (out * torch.from_numpy(R)).sum().backward()
    result = C.Result()
    result.outputs["logits"] = (logits, C.to_numpy(out))
    for name, p in theirs.named_parameters():
        if name != "model.encoder.embed_positions.weight":  # fixed sinusoids (see compare_whisper)
            result.grads[name] = (C.to_numpy(torch.as_tensor(grads[name])), C.to_numpy(p.grad))
    assert len(ours.dropout_masks) == 1 + 2 * 4 + 1 + 2 * 6  # embeddings; per encoder / decoder layer
    assert all(np.any(ours_grad) for ours_grad, _ in result.grads.values())
    assert not C.failures(result, np.float64), C.worst(result, np.float64)


def test_speech_transformer_checkpoints_of_our_own_cross_sides(checkpoint, tmp_path):
    """save_checkpoint / load_checkpoint (our safetensors format, the position table included) round trips, NumPy to
    torch and back, with the same logits."""
    ours = np_hf.load(checkpoint, dtype=np.float64)
    x, tgt = features(), np.array([[111, 4, 5], [111, 6, 7]])
    expected = ours.forward(x, tgt)
    np_checkpoint.save_checkpoint(tmp_path / "numpy.safetensors", ours)
    t_model = torch_checkpoint.load_checkpoint(tmp_path / "numpy.safetensors")
    assert isinstance(t_model, torch_audio.SpeechTransformer)
    t_logits = C.to_numpy(t_model(torch.from_numpy(x), torch.from_numpy(tgt)))
    torch_checkpoint.save_checkpoint(tmp_path / "torch.safetensors", t_model)
    again = np_checkpoint.load_checkpoint(tmp_path / "torch.safetensors")
    assert isinstance(again, audio.SpeechTransformer)
    for logits in (t_logits, again.forward(x, tgt)):
        np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-12)


# openai/whisper-tiny's generation_config.json as released, shrunk as WHISPER_TINY_RELEASED (two languages, en 112 and
# de 115; transcribe 113, translate 117; <|notimestamps|> 114), its language given in forced_decoder_ids (the release
# leaves it null: language detection). The suppressed ids are filled in by the test.
WHISPER_TINY_GENERATION = {
    "alignment_heads": [[1, 0], [1, 3]], "begin_suppress_tokens": None, "bos_token_id": 110,
    "decoder_start_token_id": 111, "eos_token_id": 110, "forced_decoder_ids": [[1, 112], [2, 113], [3, 114]],
    "is_multilingual": True, "lang_to_id": {"<|en|>": 112, "<|de|>": 115}, "max_initial_timestamp_index": 50,
    "max_length": 24, "no_timestamps_token_id": 114, "pad_token_id": 110, "prev_sot_token_id": 116,
    "return_timestamps": False, "suppress_tokens": None, "task_to_id": {"transcribe": 113, "translate": 117},
    "transformers_version": "4.31.0.dev0",
}  # fmt: skip


def whisper_with_generation(checkpoint, directory, **generation):
    """The tiny checkpoint with a whisper-tiny-shaped generation_config.json (WHISPER_TINY_GENERATION | generation)."""
    directory.mkdir()
    for name in ("model.safetensors", "config.json"):
        (directory / name).write_bytes((checkpoint / name).read_bytes())
    (directory / "generation_config.json").write_text(json.dumps(WHISPER_TINY_GENERATION | generation))
    return directory


GERMAN = {"language": "de", "task": "translate"}


@pytest.mark.parametrize(
    ("settings", "call", "prompt"),
    [({}, {}, [111, 112, 113, 114]), (GERMAN, {}, [111, 115, 117, 114]), ({}, GERMAN, [111, 115, 117, 114])],
)
def test_whisper_generation_config_decodes_as_generate(checkpoint, tmp_path, settings, call, prompt):
    """forced_decoder_ids (or language and task, in the file or generate()'s arguments), no_timestamps_token_id,
    suppress_tokens and begin_suppress_tokens of a whisper-tiny-shaped generation_config.json: greedy and beam
    search, both sides, equal generate() on input_features (it returns the tokens after the prompt; ours, the prompt
    first). The suppressed ids are tokens generate() picks without them (at the first step and later), so that the
    comparison means something."""
    x = features(batch=3, seed=2)
    t_x = torch.from_numpy(x)
    plain = whisper_with_generation(checkpoint, tmp_path / "plain", **settings)
    unsuppressed = reference(plain).generate(input_features=t_x, max_new_tokens=8, **call).numpy()
    begin = sorted({int(t) for t in unsuppressed[:, 0]} | {110})  # the first tokens generate() picks, and eos
    later = sorted({int(t) for t in unsuppressed[:, 1:].ravel()} - set(begin))[:3]  # tokens it picks later
    directory = whisper_with_generation(
        checkpoint, tmp_path / "whisper", suppress_tokens=later, begin_suppress_tokens=begin, **settings
    )
    theirs = reference(directory)
    ours_np = np_hf.load(directory, dtype=np.float64)
    ours_torch = torch_hf.load(directory, dtype=torch.float64)
    for beams in (1, 3):
        expected = theirs.generate(input_features=t_x, max_new_tokens=8, num_beams=beams, **call).numpy()
        if beams == 1:
            assert not np.isin(expected[:, 0], begin).any() and not np.isin(expected, later).any()
            assert (expected != unsuppressed).any()  # suppression changed what generate() picks
        for name, tokens in {
            "numpy": nt.generate(ours_np, x, max_new_tokens=8, num_beams=beams, **call),
            "torch": tt.generate(ours_torch, t_x, max_new_tokens=8, num_beams=beams, **call).numpy(),
        }.items():
            assert (tokens[:, :4] == prompt).all(), (name, beams)
            np.testing.assert_array_equal(tokens[:, 4:], expected, err_msg=f"{name}, num_beams={beams}")
    # a save writes the prompt as forced_decoder_ids and the suppressed ids: transformers and ours decode the same again
    np_hf.save(ours_np, tmp_path / "saved")
    again = reference(tmp_path / "saved").generate(input_features=t_x, max_new_tokens=8, **call).numpy()
    np.testing.assert_array_equal(again, theirs.generate(input_features=t_x, max_new_tokens=8, **call).numpy())
    ours_again = nt.generate(np_hf.load(tmp_path / "saved", dtype=np.float64), x, max_new_tokens=8, **call)
    np.testing.assert_array_equal(ours_again[:, 4:], again)


def test_whisper_timestamps_warn(checkpoint, tmp_path):
    """return_timestamps true asks generate() for timestamp tokens: not computed here, warned about by name; a file
    whose language is to be detected loads without a warning (the language is detected)."""
    detect = whisper_with_generation(checkpoint, tmp_path / "detect", forced_decoder_ids=[[1, None], [2, 113]])
    timestamps = whisper_with_generation(checkpoint, tmp_path / "timestamps", return_timestamps=True)
    for load in (np_hf.load, torch_hf.load):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            load(detect)
        with pytest.warns(UserWarning, match="return_timestamps"):
            load(timestamps)


# generate()'s language detection: the released whisper-tiny's forced_decoder_ids (a null language), a file with no
# forced_decoder_ids, and generate(task=...) with no language (forced_decoder_ids then not read); the prompt generate()
# makes, with each row's detected language in position 1 ("L")
DETECTION = {
    "released: [[1, null], [2, transcribe]]": ({"forced_decoder_ids": [[1, None], [2, 113]]}, {}, [111, "L", 113, 114]),
    "no forced_decoder_ids": ({"forced_decoder_ids": None}, {}, [111, "L", 114]),
    "task='translate', no language": ({}, {"task": "translate"}, [111, "L", 117, 114]),
}


@pytest.mark.parametrize(("settings", "call", "prompt"), list(DETECTION.values()), ids=list(DETECTION))
def test_whisper_detects_the_language_as_generate(checkpoint, tmp_path, settings, call, prompt):
    """A multilingual file with no language: each row's language is the lang_to_id token with the largest logit after
    the start token (transformers' detect_language), both sides, greedy and beam search equal to generate(). The
    tiny model's languages (each row's largest and smallest logit after the start token among the ordinary ids) are
    chosen so that the rows detect different ones."""
    x = features(batch=4, seed=0)
    t_x = torch.from_numpy(x)
    plain = reference(checkpoint)
    with torch.no_grad():
        first = plain(input_features=t_x, decoder_input_ids=torch.full((4, 1), 111)).logits[:, -1]  # (B, V)
    ordinary = first[:, :110]  # the ids below the special ones (110 and up)
    best = sorted({int(t) for t in ordinary.argmax(-1)} | {int(t) for t in ordinary.argmin(-1)})
    languages = {f"<|l{i}|>": t for i, t in enumerate(best)}
    directory = whisper_with_generation(checkpoint, tmp_path / "whisper", lang_to_id=languages, **settings)
    theirs = reference(directory)
    detected = theirs.detect_language(input_features=t_x).numpy()
    assert len(set(detected)) > 1 and set(detected) <= set(best)  # the rows detect different languages
    expected_prompt = np.array([[detected[r] if t == "L" else t for t in prompt] for r in range(4)])
    ours_np = np_hf.load(directory, dtype=np.float64)
    ours_torch = torch_hf.load(directory, dtype=torch.float64)
    T_p = len(prompt)
    for beams in (1, 3):
        expected = theirs.generate(input_features=t_x, max_new_tokens=5, num_beams=beams, **call).numpy()
        for name, tokens in {
            "numpy": nt.generate(ours_np, x, max_new_tokens=5, num_beams=beams, **call),
            "torch": tt.generate(ours_torch, t_x, max_new_tokens=5, num_beams=beams, **call).numpy(),
        }.items():
            np.testing.assert_array_equal(tokens[:, :T_p], expected_prompt, err_msg=f"{name}, num_beams={beams}")
            np.testing.assert_array_equal(tokens[:, T_p:], expected, err_msg=f"{name}, num_beams={beams}")


@pytest.mark.parametrize("side", ["numpy", "torch"])
def test_whisper_language_and_task_arguments_are_checked(checkpoint, tmp_path, side):
    """generate(language=..., task=...): ValueError naming a language or task the file's tables do not hold, and
    either on a checkpoint without Whisper's prompt keys."""
    lib, load = (nt, np_hf.load) if side == "numpy" else (tt, torch_hf.load)
    x = features().astype(np.float32)
    x = x if side == "numpy" else torch.from_numpy(x)
    model = load(whisper_with_generation(checkpoint, tmp_path / "whisper"))
    with pytest.raises(ValueError, match=r"language='xx' is not in lang_to_id"):
        lib.generate(model, x, language="xx", max_new_tokens=2)
    with pytest.raises(ValueError, match=r"task='sing' is not one of task_to_id's"):
        lib.generate(model, x, language="en", task="sing", max_new_tokens=2)
    with pytest.raises(ValueError, match=r"language='en' needs a Whisper checkpoint's generation_config.json"):
        lib.generate(load(checkpoint), x, language="en", max_new_tokens=2)
