"""The paper's encoder-decoder against `transformers`' own Marian and BART.

Tiny `MarianMTModel` and `BartForConditionalGeneration` models are built here and trained for a few
seconds on a reversal task (random weights with tied, post-norm embeddings just repeat one token,
which would make the decoding comparisons vacuous), written with `save_pretrained`, then loaded
with our `hf.load` on both sides. Required: float64 logits and every parameter gradient within
1e-10 of transformers' (through `hf.to_hf`), float32 within 1e-5, with padded sources; greedy search
equal to `generate(num_beams=1)` and beam search equal to `generate(num_beams=4)` with the same
length penalty; `hf.save` loads back into `from_pretrained`.

One float32 island: Marian computes its sinusoids with `torch.FloatTensor`, so a float64 Marian
holds positions rounded to float32 (~6e-8). The float64 comparisons replace exactly that table with
the float64 one (ours is computed in the model's dtype), and one test checks the unmodified model
within the float32 bar.

`final_logits_bias` is a buffer in transformers (never trained there); ours is `output_proj.bias`, a
parameter with a gradient. It is compared as an output bias, and its gradient is checked against
the sum of the logits' upstream gradient over positions (what it would be), not against theirs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from transformers import BartConfig, BartForConditionalGeneration, MarianConfig, MarianMTModel

import numpy_transformer as nt
import torch_transformer as tt
from numpy_transformer import hf as np_hf
from numpy_transformer.layers import sinusoidal_table
from parity_tests import components as C
from torch_transformer import hf as torch_hf

transformers.logging.set_verbosity_error()

V, MAX_LEN = 24, 32
COMMON = dict(
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=MAX_LEN,
    dropout=0.0,
    attention_dropout=0.0,
    activation_dropout=0.0,
)
# Marian: pad = decoder start (the last id), eos = 0, SiLU ("swish", as opus-mt), scaled embeddings.
MARIAN = dict(pad_token_id=V - 1, eos_token_id=0, decoder_start_token_id=V - 1, activation_function="swish")
# BART's usual special ids: bos 0, pad 1, eos 2 = decoder start; GELU; learned positions offset by 2.
BART = dict(bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2)


def build(model_type: str, seed: int = 0, steps: int = 60, **overrides) -> transformers.PreTrainedModel:
    """A tiny transformers model, trained `steps` Adam steps on reversing sequences of 2-5 tokens."""
    torch.manual_seed(seed)
    if model_type == "marian":
        config = MarianConfig(vocab_size=V, **COMMON, **(MARIAN | {"scale_embedding": True} | overrides))
        model = MarianMTModel(config)
    else:
        model = BartForConditionalGeneration(BartConfig(vocab_size=V, **COMMON, **(BART | overrides)))
    pad, eos = model.config.pad_token_id, model.config.eos_token_id
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.3)  # a non-zero output bias (it is a buffer: training keeps it)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    model.train()
    for _ in range(steps):
        lengths = torch.randint(2, 6, (32,), generator=generator)
        src, labels = torch.full((32, 6), pad), torch.full((32, 6), -100)
        for b, n in enumerate(lengths.tolist()):
            seq = torch.randint(3, V - 1, (n,), generator=generator)
            src[b, :n], src[b, n] = seq, eos
            labels[b, :n], labels[b, n] = seq.flip(0), eos
        loss = model(input_ids=src, attention_mask=src != pad, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """model_type -> directory of a trained tiny checkpoint (float32, as save_pretrained writes it)."""
    out = {}
    for model_type in ("marian", "bart"):
        directory = tmp_path_factory.mktemp(model_type)
        build(model_type).save_pretrained(directory)
        out[model_type] = directory
    return out


def theirs(directory, model_type: str, dtype, float64_positions: bool = True):
    """transformers' model from the directory, in `dtype`; for a float64 Marian, with float64 sinusoids."""
    cls = MarianMTModel if model_type == "marian" else BartForConditionalGeneration
    model = cls.from_pretrained(directory, dtype=C.TORCH_DTYPE[np.dtype(dtype)]).eval()
    if model_type == "marian" and float64_positions and np.dtype(dtype) == np.float64:
        # transformers builds this table through torch.FloatTensor: rounded to float32 even in a float64
        # model. Replace exactly that piece with the float64 table (the split layout, as Marian's).
        table = torch.from_numpy(sinusoidal_table(MAX_LEN, COMMON["d_model"], np.float64, "split"))
        with torch.no_grad():
            for stack in (model.model.encoder, model.model.decoder):
                stack.embed_positions.weight.copy_(table)
    return model


def batch(config, rng):
    """A padded source batch (B=3, the last two padded, one of them to a single real token plus eos),
    decoder inputs starting with the decoder start token, and targets (pad ignored)."""
    pad, eos, start = config.pad_id, config.eos_id, config.bos_id
    src = np.full((3, 7), pad)
    for b, n in enumerate((6, 4, 1)):
        src[b, :n] = rng.integers(3, V - 1, size=n)
        src[b, n] = eos
    tgt = rng.integers(3, V - 1, size=(3, 6))
    tgt[:, 0] = start
    labels = np.roll(tgt, -1, axis=1)
    labels[:, -1] = eos
    labels[2, 3:] = -100
    return src, tgt, labels


def compare(directory, model_type: str, dtype, side: str, seed: int = 0) -> C.Result:
    """Logits and every parameter gradient: ours (hf.load) vs transformers', one random upstream gradient.

    Objective J = cross_entropy(logits, labels) + sum(logits * R). transformers' gradients are read
    from its named_parameters (tied tables once: model.shared.weight); ours go through hf.to_hf.
    """
    dtype = np.dtype(dtype)
    reference = theirs(directory, model_type, dtype)
    if side == "numpy":
        ours = np_hf.load(directory, dtype=dtype).eval()
    else:
        ours = torch_hf.load(directory, dtype=C.TORCH_DTYPE[dtype]).eval()
    config = ours.config
    rng = np.random.default_rng(seed)
    src, tgt, labels = batch(config, rng)
    R = (rng.standard_normal((*tgt.shape, config.tgt_vocab_size)) / tgt.shape[1]).astype(dtype)

    t_src, t_tgt, t_labels = (torch.from_numpy(a) for a in (src, tgt, labels))
    out = reference(input_ids=t_src, attention_mask=t_src != config.pad_id, decoder_input_ids=t_tgt)
    t_loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), t_labels.flatten(), ignore_index=-100)
    (t_loss + (out.logits * torch.from_numpy(R)).sum()).backward()

    if side == "numpy":
        logits = ours.forward(src, tgt)
        loss, cache = nt.cross_entropy_forward(logits, labels, ignore_index=-100)
        ours.zero_grad()
        ours.backward(nt.cross_entropy_backward(cache) + R)
        grads = np_hf.to_hf(ours, ours.grads)
    else:
        t_logits = ours(t_src, t_tgt)
        our_loss = tt.cross_entropy(t_logits, t_labels, ignore_index=-100)
        (our_loss + (t_logits * torch.from_numpy(R)).sum()).backward()
        logits, loss = C.to_numpy(t_logits), C.to_numpy(our_loss)
        grads = torch_hf.to_hf(ours, {n: p.grad for n, p in ours.named_parameters()})

    result = C.Result()
    result.outputs["logits"] = (logits, C.to_numpy(out.logits))
    result.outputs["loss"] = (np.asarray(loss), C.to_numpy(t_loss))
    for name, p in reference.named_parameters():
        if model_type == "marian" and name.endswith("embed_positions.weight"):
            assert p.grad is None  # Marian's sinusoids: computed under no_grad, not parameters (ours or theirs)
            continue
        result.grads[name] = (C.to_numpy(torch.as_tensor(grads[name])), C.to_numpy(p.grad))
    # final_logits_bias is a buffer there (no gradient); ours, output_proj.bias, is a parameter that has one.
    assert "final_logits_bias" not in dict(reference.named_parameters())
    assert np.any(C.to_numpy(torch.as_tensor(grads["final_logits_bias"])))
    return result


@pytest.mark.parametrize("side", ["numpy", "torch"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("model_type", ["marian", "bart"])
def test_logits_and_every_gradient_match_transformers(checkpoints, model_type, dtype, side):
    result = compare(checkpoints[model_type], model_type, dtype, side)
    problems = C.failures(result, dtype)
    assert not problems, "\n".join(problems)
    assert len(result.grads) >= 30 and all(np.any(ours) for ours, _ in result.grads.values())


def test_unmodified_float64_marian_is_within_the_float32_bar(checkpoints):
    """Without replacing its float32-rounded sinusoids, a float64 Marian differs from ours by about the
    float32 rounding of the positions: inside the float32 bar, outside the float64 one."""
    directory = checkpoints["marian"]
    reference = theirs(directory, "marian", np.float64, float64_positions=False)
    ours = np_hf.load(directory, dtype=np.float64).eval()
    src, tgt, _ = batch(ours.config, np.random.default_rng(1))
    t_src = torch.from_numpy(src)
    expected = reference(
        input_ids=t_src, attention_mask=t_src != ours.config.pad_id, decoder_input_ids=torch.from_numpy(tgt)
    )
    ((_, error),) = C.relative_errors(
        {"logits": (ours.forward(src, tgt), C.to_numpy(expected.logits))}, np.float32
    ).values()
    assert 1e-12 < error <= 1e-5


@pytest.mark.parametrize("side", ["numpy", "torch"])
@pytest.mark.parametrize("model_type", ["marian", "bart"])
def test_greedy_search_equals_generate(checkpoints, model_type, side):
    """Greedy decoding from the checkpoint's decoder start token, never emitting pad (as
    bad_words_ids=[[pad]] in Marian's generation configs), stopping at eos."""
    directory = checkpoints[model_type]
    reference = theirs(directory, model_type, np.float32)
    src, _, _ = batch(np_hf.load(directory).config, np.random.default_rng(2))
    pad = reference.config.pad_token_id
    expected = reference.generate(
        input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(src != pad), do_sample=False, num_beams=1,
        max_new_tokens=10, bad_words_ids=[[pad]], forced_eos_token_id=None,
    ).numpy()  # fmt: skip
    if side == "numpy":
        got = nt.greedy_decode(np_hf.load(directory, dtype=np.float32).eval(), src, max_len=10)
    else:
        got = tt.greedy_decode(torch_hf.load(directory).eval(), torch.from_numpy(src), max_len=10).numpy()
    np.testing.assert_array_equal(got, expected)
    assert len({tuple(row) for row in got}) == len(got), "the rows should differ: a degenerate model proves little"


@pytest.mark.parametrize("side", ["numpy", "torch"])
@pytest.mark.parametrize("model_type", ["marian", "bart"])
def test_round_trip_through_from_pretrained(checkpoints, model_type, side, tmp_path):
    """hf.save writes a directory that from_pretrained loads to the same logits (and the same keys)."""
    directory = checkpoints[model_type]
    if side == "numpy":
        model = np_hf.load(directory, dtype=np.float64).eval()
        np_hf.save(model, tmp_path)
    else:
        model = torch_hf.load(directory, dtype=torch.float64).eval()
        torch_hf.save(model, tmp_path)
    original, reloaded = theirs(directory, model_type, np.float64), theirs(tmp_path, model_type, np.float64)
    src, tgt, _ = batch(model.config, np.random.default_rng(3))
    t_src = torch.from_numpy(src)
    kwargs = dict(input_ids=t_src, attention_mask=t_src != model.config.pad_id, decoder_input_ids=torch.from_numpy(tgt))
    np.testing.assert_allclose(
        reloaded(**kwargs).logits.detach(), original(**kwargs).logits.detach(), rtol=0, atol=1e-12
    )


def test_separate_token_tables_and_an_untied_output(tmp_path):
    """Marian with share_encoder_decoder_embeddings=False (two tables, a target vocabulary of its own)
    and tie_word_embeddings=False: the encoder reads encoder.embed_tokens, the decoder its own table,
    the output projection lm_head.weight."""
    model = build(
        "marian", steps=0, share_encoder_decoder_embeddings=False, decoder_vocab_size=V, tie_word_embeddings=False
    )
    model.save_pretrained(tmp_path)
    ours = np_hf.load(tmp_path, dtype=np.float64)
    assert not ours.config.share_embeddings and not ours.config.tie_embeddings
    assert {"encoder.token_embedding.weight", "decoder.token_embedding.weight", "output_proj.weight"} <= set(
        ours.params
    )
    result = compare(tmp_path, "marian", np.float64, "numpy")
    assert not C.failures(result, np.float64)
