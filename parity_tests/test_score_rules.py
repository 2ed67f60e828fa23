"""The score rules (numpy_transformer/scores.py and torch_transformer/scores.py): a sliding
window and ALiBi, in the plain pair, the tiled pair, cached decoding, and against each other.

Each test can fail: the window test compares against a model that ignores the window, ALiBi against explicit
slopes, the tiled pair against the plain one block by block, the cache against recomputation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import numpy_transformer as nt
import torch_transformer as tt
from numpy_transformer import decoding as nd
from numpy_transformer import flash_attention as fa
from numpy_transformer.attention import KVCache
from numpy_transformer.scores import ScoreMod, alibi_slopes, attention_scores, positions
from parity_tests import components as C
from parity_tests import hf_compare as H

BASE = dict(
    src_vocab_size=29, tgt_vocab_size=29, d_model=24, n_heads=6, d_ff=32, n_encoder_layers=2, n_decoder_layers=2,
    max_len=40, pad_id=0, norm_first=True,
)  # fmt: skip
RULES = {
    "alibi": dict(positional="alibi"),
    "window 3, rope, GQA": dict(positional="rope", sliding_window=3, n_kv_heads=2),
    "alibi + window 4": dict(positional="alibi", sliding_window=4),
    "alibi + window 4, flash": dict(positional="alibi", sliding_window=4, attention="flash"),
    "qkv biases only": dict(positional="rope", bias=False, qkv_bias=True),
    # T5's bias: 8 buckets up to distance 6, so 11 positions reach the logarithmic and the shared last buckets
    "t5 relative, no scale": dict(
        positional="relative", relative_buckets=8, relative_max_distance=6, attention_scale=1.0
    ),
    "t5 relative, flash": dict(positional="relative", relative_buckets=8, relative_max_distance=6, attention="flash"),
}


def test_alibi_slopes_follow_the_paper() -> None:
    """Powers of two: 2^(-8h/H); 6 heads: the 4 slopes of H=4, then the odd powers of 2^(-1) (H=8's odd slopes);
    the torch side computes the same numbers its own way."""
    assert alibi_slopes(8) == tuple(2.0 ** (-h) for h in range(1, 9))
    assert alibi_slopes(4) == (2**-2, 2**-4, 2**-6, 2**-8)
    assert alibi_slopes(6) == (2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3)
    for n in (1, 3, 5, 6, 12, 16):
        np.testing.assert_allclose(tt.scores.alibi_slopes(n), alibi_slopes(n), rtol=1e-15)


def test_scores_follow_each_rule() -> None:
    """Against the definition, entry by entry: scale * q.k - m_h |i - j|, hidden where j > i or i - j >= window."""
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((1, 2, 5, 4)), rng.standard_normal((1, 2, 7, 4))
    mod = ScoreMod(scale=0.5, causal=True, window=3, alibi_slopes=(0.25, 0.125))
    q_pos, k_pos = positions(5, start=2), positions(7)
    scores, allowed = attention_scores(q, k, mod, q_pos, k_pos)
    for h in range(2):
        for a, i in enumerate(q_pos):
            for b, j in enumerate(k_pos):
                expected = 0.5 * q[0, h, a] @ k[0, h, b] - mod.alibi_slopes[h] * abs(i - j)
                assert scores[0, h, a, b] == pytest.approx(expected, abs=1e-14)
                assert allowed[a, b] == (j <= i and i - j < 3)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "f32"])
@pytest.mark.parametrize("name", list(RULES))
def test_numpy_and_torch_agree_with_each_rule(name, dtype) -> None:
    """A TransformerLM and a Transformer (encoder self-attention with ALiBi, no window; cross-attention with
    neither) with padding: outputs and every gradient within the conventions' bars."""
    config = nt.TransformerConfig(**BASE, **RULES[name])
    rng = np.random.default_rng(1)
    for cls in ("TransformerLM", "Transformer"):
        model = getattr(nt, cls)(config, seed=2, dtype=dtype)
        twin = getattr(tt, cls)(config).to(C.TORCH_DTYPE[np.dtype(dtype)])
        twin.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
        ids = rng.integers(3, 29, (3, 11))
        ids[1, 8:] = 0  # padding
        args = (ids,) if cls == "TransformerLM" else (ids[:, :9], ids)
        out = model.forward(*args)
        dout = rng.standard_normal(out.shape).astype(dtype)
        model.zero_grad()
        model.backward(dout)
        theirs = twin(*(torch.from_numpy(a) for a in args))
        theirs.backward(torch.from_numpy(dout))
        result = C.Result(
            outputs={"logits": (out, C.to_numpy(theirs))},
            grads={k: (model.grads[k], C.to_numpy(p.grad)) for k, p in twin.named_parameters()},
        )
        assert not C.failures(result, dtype), C.failures(result, dtype)[:3]
        assert all(np.any(g) for k, (g, _) in result.grads.items() if not k.endswith("k_proj.bias"))


def test_the_window_changes_the_output() -> None:
    """The window is not a no-op: the same weights without it give other logits from position `window` on, and
    the same logits before (no query there has a key outside its window)."""
    config = nt.TransformerConfig(**BASE, positional="rope", sliding_window=3)
    ids = np.random.default_rng(2).integers(3, 29, (2, 9))
    windowed = nt.TransformerLM(config, seed=4)
    unwindowed = nt.TransformerLM(dataclasses.replace(config, sliding_window=None), seed=4)
    a, b = windowed.forward(ids), unwindowed.forward(ids)
    np.testing.assert_allclose(a[:, :3], b[:, :3], rtol=0, atol=1e-12)
    assert np.abs(a[:, 3:] - b[:, 3:]).min(axis=-1).max() > 1e-3


def test_mistral_without_its_window_disagrees_with_transformers(tmp_path) -> None:
    """The Mistral comparison can fail: our model loaded from the checkpoint but with the window taken away."""
    H.build_tiny("mistral", tmp_path)
    model = nt.hf.load(tmp_path, dtype=np.float64)
    assert model.config.sliding_window == 3
    ids, _ = H.make_inputs("mistral")
    good = model.forward(ids)
    model.config = dataclasses.replace(model.config, sliding_window=None)
    assert np.abs(model.forward(ids) - good).max() > 1e-2


@pytest.mark.parametrize("window", [1, 5, 33])
def test_tiled_pair_skips_the_blocks_outside_the_window(monkeypatch, window) -> None:
    """Equal to the plain pair (outputs and gradients, 1e-12) with causal + window + ALiBi, and each pass visits
    exactly the blocks that hold some (i, j) with i - window < j <= i."""
    visits = []
    block_scores = fa._block_scores

    def counting(q_i, k_j, *rest):
        visits.append(1)
        return block_scores(q_i, k_j, *rest)

    monkeypatch.setattr(fa, "_block_scores", counting)
    rng = np.random.default_rng(3)
    T, bq, bk = 70, 16, 8
    q, k, v = (rng.standard_normal((2, 3, T, 4)) for _ in range(3))
    mod = ScoreMod(causal=True, window=window, alibi_slopes=(0.5, 0.25, 0.125))
    out, cache = fa.flash_attention_forward(q, k, v, block_q=bq, block_k=bk, mod=mod)
    forward = len(visits)
    dout = rng.standard_normal(out.shape)
    visits.clear()
    grads = fa.flash_attention_backward(dout, cache)
    backward = len(visits)
    plain, plain_cache = nt.scaled_dot_product_attention_forward(q, k, v, mod=mod)
    plain_grads = nt.attention.scaled_dot_product_attention_backward(dout, plain_cache)
    np.testing.assert_allclose(out, plain, rtol=0, atol=1e-12)
    assert grads[3] is None and plain_grads[3] is None  # dtable: no T5 table was read
    for name, a, b in zip("qkv", grads[:3], plain_grads[:3], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
        # a window of 1: each query sees itself only, a softmax of one entry, whose scores get no gradient
        assert (np.abs(b).max() > 0) == (window > 1 or name == "v")
    needed = sum(
        any(i - window < j <= i for i in range(i0, min(i0 + bq, T)) for j in range(j0, min(j0 + bk, T)))
        for i0 in range(0, T, bq)
        for j0 in range(0, T, bk)
    )
    assert forward == backward == needed


@pytest.mark.parametrize("name", ["alibi + window 4", "window 3, rope, GQA", "t5 relative, no scale"])
def test_finite_differences_through_the_rules(name) -> None:
    """The NumPy backward of multi-head attention with the rules against central differences (float64)."""
    config = nt.TransformerConfig(**BASE, **RULES[name])
    model = nt.TransformerLM(config, seed=5)
    ids = np.random.default_rng(6).integers(3, 29, (2, 8))
    dlogits = np.random.default_rng(7).standard_normal((2, 8, 29))

    def loss(params):
        model.params.update(params)
        return float((model.forward(ids) * dlogits).sum())

    model.zero_grad()
    model.forward(ids)
    model.backward(dlogits)
    keys = ["decoder.layers.0.self_attn.q_proj.weight", "decoder.layers.1.self_attn.k_proj.weight"]
    if config.positional == "relative":  # the table every layer reads: its gradient sums over them
        keys.append("decoder.relative_bias.weight")
    for key in keys:
        base = model.params[key].copy()
        for index in [(0, 0), (3, 5), (7, 11)] if key.endswith("proj.weight") else [(0, 0), (2, 3), (5, 1), (7, 5)]:
            step = 1e-5
            plus, minus = base.copy(), base.copy()
            plus[index] += step
            minus[index] -= step
            fd = (loss({key: plus}) - loss({key: minus})) / (2 * step)
            model.params[key] = base
            an = model.grads[key][index]
            assert abs(fd - an) / max(abs(fd), abs(an), 1e-2) <= 1e-6, (key, index, fd, an)


def test_t5_buckets_follow_the_definition() -> None:
    """Worked by hand. Bidirectional, 8 buckets (4 each way), max distance 6: distances 0, 1 have their own bucket;
    from 2 on, bucket 2 + floor(2 ln(d / 2) / ln 3): d = 2, 3 -> 2, d = 4, 5 -> 3, capped at 3; keys after the
    query take the upper half (+4). Causal, 8 buckets of i - j: 0 .. 3 exact, then 4 + floor(4 ln(d / 4) / ln 1.5):
    d = 4 -> 4, 5 -> 6, 6 and beyond -> 7 (capped); later keys (masked anyway) in bucket 0."""
    from numpy_transformer.scores import relative_buckets

    q = np.array([10])
    k = np.arange(0, 21)
    got = relative_buckets((8, 6, True), q, k)[0]  # distance j - i = -10 .. 10
    expected = [3, 3, 3, 3, 3, 3, 3, 2, 2, 1, 0, 5, 6, 6, 7, 7, 7, 7, 7, 7, 7]
    np.testing.assert_array_equal(got, expected)
    causal = relative_buckets((8, 6, False), q, k)[0]
    np.testing.assert_array_equal(causal[:11], [7, 7, 7, 7, 7, 6, 4, 3, 2, 1, 0])
    assert (causal[11:] == 0).all()
    torch_buckets = tt.scores.relative_buckets((8, 6, True), torch.tensor(q), torch.tensor(k))
    np.testing.assert_array_equal(torch_buckets[0].numpy(), got)


def test_rolling_cache_stays_the_windows_size_and_decodes_as_recomputation() -> None:
    """A prompt longer than the window, then 12 steps: every layer's cache holds `window` positions, and greedy
    and beam search with the cache equal recomputing the whole prefix each step."""
    config = nt.TransformerConfig(**BASE, positional="alibi", sliding_window=4)
    model = nt.TransformerLM(config, seed=8)
    prompt = np.random.default_rng(9).integers(3, 29, (2, 7))
    cache = nd.new_cache(model, None, 2, 40)
    for self_cache, _ in cache.layers:
        assert isinstance(self_cache, KVCache) and self_cache.keys.shape[2] == 4
    out = nd.generate(model, prompt, max_new_tokens=12, return_dict_in_generate=True)
    tokens, logits = out.sequences, out.logits
    out = nd.generate(model, prompt, max_new_tokens=12, use_cache=False, return_dict_in_generate=True)
    again, relogits = out.sequences, out.logits
    np.testing.assert_array_equal(tokens, again)
    np.testing.assert_allclose(logits, relogits, rtol=0, atol=1e-12)
    beams = nd.generate(model, prompt, num_beams=3, max_new_tokens=12)
    np.testing.assert_array_equal(beams, nd.generate(model, prompt, num_beams=3, max_new_tokens=12, use_cache=False))
    torch_twin = tt.TransformerLM(config).double()
    torch_twin.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    torch_prompt = torch.from_numpy(prompt)
    with torch.no_grad():
        cache = tt.decoding.new_cache(torch_twin, None, 2, 40)
        tt.decoding.decoder_step(torch_twin, cache, torch_prompt)
    for self_cache, _ in cache.layers:
        assert self_cache.keys.shape[2] == 4 and sorted(self_cache.positions.tolist()) == [3, 4, 5, 6]
    np.testing.assert_array_equal(tt.generate(torch_twin, torch_prompt, max_new_tokens=12).numpy(), tokens)
    np.testing.assert_array_equal(tt.generate(torch_twin, torch_prompt, num_beams=3, max_new_tokens=12).numpy(), beams)


def _assert_same_mod(theirs, ours) -> None:
    """Two ScoreMods (torch's, NumPy's) of the same rules: equal fields, the ALiBi slopes to rounding (each side
    computes them its own way)."""
    a, b = dataclasses.asdict(theirs), dataclasses.asdict(ours)
    slopes = a.pop("alibi_slopes"), b.pop("alibi_slopes")
    assert a == b
    assert (slopes[0] is None) == (slopes[1] is None)
    if slopes[1] is not None:
        np.testing.assert_allclose(slopes[0], slopes[1], rtol=1e-15)


@pytest.mark.parametrize("name", ["alibi + window 4", "t5 relative, no scale", "window 3, rope, GQA"])
def test_each_torch_layer_holds_the_numpy_layers_score_mod(name) -> None:
    """torch_transformer/scores.py's ScoreMod has the NumPy one's fields, and every torch self-attention holds the
    rules numpy_transformer.model.score_mod gives that layer (causal in the decoder, bidirectional T5 buckets in
    the encoder); cross-attention holds none but the scale."""
    assert [f.name for f in dataclasses.fields(tt.scores.ScoreMod)] == [f.name for f in dataclasses.fields(ScoreMod)]
    config = nt.TransformerConfig(**BASE, **RULES[name])
    twin = tt.Transformer(config)
    for i, layer in enumerate(twin.encoder.layers):
        _assert_same_mod(layer.self_attn.score_mod, nt.model.score_mod(config, causal=False, layer=i))
    for i, layer in enumerate(twin.decoder.layers):
        _assert_same_mod(layer.self_attn.score_mod, nt.model.score_mod(config, causal=True, layer=i))
        _assert_same_mod(layer.cross_attn.score_mod, ScoreMod(scale=config.attention_scale))


MODS = {
    "causal, window 3, ALiBi": dict(causal=True, window=3, alibi_slopes=alibi_slopes(4)),
    "band 2, ALiBi of 3 heads": dict(band=2, alibi_slopes=alibi_slopes(3)),
    "T5 decoder buckets": dict(causal=True, relative=(8, 6, False)),
    "T5 encoder buckets": dict(relative=(8, 6, True)),
}


@pytest.mark.parametrize("name", list(MODS))
def test_torch_position_mask_and_bias_equal_numpys(name) -> None:
    """The same rule through both scores.py files, by name: position_mask and position_bias at decoding-like
    positions (queries 9 .. 13 over keys 0 .. 13), T5's read from one random table."""
    q_pos, k_pos = positions(5, start=9), positions(14)
    table = np.random.default_rng(3).standard_normal((8, 4))
    ours_mod, theirs_mod = ScoreMod(**MODS[name]), tt.scores.ScoreMod(**MODS[name])
    tq, tk = torch.from_numpy(q_pos), torch.from_numpy(k_pos)
    allowed = nt.scores.position_mask(ours_mod, q_pos, k_pos)
    theirs = tt.scores.position_mask(theirs_mod, tq, tk)
    assert (allowed is None) == (theirs is None)
    if allowed is not None:
        assert not allowed.all() and allowed.any()  # the rule hides some pairs and shows others
        np.testing.assert_array_equal(theirs.numpy(), allowed)
    bias = nt.scores.position_bias(ours_mod, q_pos, k_pos, np.float64, table)
    theirs_bias = tt.scores.position_bias(theirs_mod, tq, tk, torch.float64, torch.from_numpy(table))
    assert bias is not None and np.abs(bias).max() > 0
    np.testing.assert_allclose(theirs_bias.numpy(), bias, rtol=1e-15, atol=0)


@pytest.mark.parametrize("window", [None, 3])
def test_torch_kv_cache_updates_as_numpys(window) -> None:
    """KVCache.update(k, v, k_pos) -> (keys, values, positions) on both sides, step by step: a 4-token prompt (longer
    than the window), then single positions; a beam reorder in between."""
    rng = np.random.default_rng(4)
    ours = KVCache(2, 1, 9, 3, np.float64, window)
    theirs = tt.attention.KVCache(2, 1, 9, 3, torch.zeros((), dtype=torch.float64), window)
    start = 0
    for step, T_new in enumerate([4, 1, 1, 1]):
        k, v = rng.standard_normal((2, 1, T_new, 3)), rng.standard_normal((2, 1, T_new, 3))
        k_pos = positions(T_new, start)
        got = theirs.update(torch.from_numpy(k), torch.from_numpy(v), torch.from_numpy(k_pos))
        for mine, other in zip(ours.update(k, v, k_pos), got, strict=True):
            np.testing.assert_array_equal(other.numpy(), mine)
        start += T_new
        if step == 1:
            ours.reorder(np.array([1, 1]))
            theirs.reorder(torch.tensor([1, 1]))
    assert ours.keys.shape[2] == (9 if window is None else 3)
    np.testing.assert_array_equal(theirs.positions.numpy(), ours.positions)
