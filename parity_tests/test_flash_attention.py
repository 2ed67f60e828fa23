"""The tiled attention pair (flash_attention_forward / _backward) against the plain pair, finite
differences and torch's fused scaled_dot_product_attention; its memory and its causal block skipping;
the models built with attention="flash"; the benchmark's quick mode.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import numpy_transformer as nt
from numpy_transformer import flash_attention as fa
from numpy_transformer.attention import (
    ScaledDotProductAttentionCache,
    causal_mask,
    multi_head_attention_backward,
    multi_head_attention_forward,
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)
from numpy_transformer.gradcheck import check_pair
from numpy_transformer.layers import Dropout

from .components import (
    BAR,
    TORCH_DTYPE,
    compare_encoder_models,
    compare_models,
    failures,
    make_batch,
    make_encoder_batch,
    relative_errors,
    to_numpy,
)

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "flash_attention.py"
# Tiled vs plain NumPy: the same sums in another order, so rounding apart (the conventions' error measure).
PLAIN_BAR = {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 1e-5}
DTYPES = [np.float64, np.float32]


def _inputs(rng, dtype, B, H, T_q, T_k, Dh):
    q = rng.standard_normal((B, H, T_q, Dh)).astype(dtype)
    k = rng.standard_normal((B, H, T_k, Dh)).astype(dtype)
    v = rng.standard_normal((B, H, T_k, Dh)).astype(dtype)
    return q, k, v


def _mask(kind: str, rng, B, H, T_q, T_k):
    """None, a padding mask (B, 1, 1, T_k), a full random mask (B, H, T_q, T_k), or one with fully masked rows."""
    if kind == "none":
        return None
    if kind == "padding":
        mask = np.ones((B, 1, 1, T_k), dtype=bool)
        mask[-1, :, :, T_k // 2 :] = False  # the last sequence is padded at the end
        return mask
    mask = rng.random((B, H, T_q, T_k)) > 0.3
    if kind == "fully_masked":
        mask[0, 0, 0] = False  # one query with nothing to attend to ...
        mask[-1, -1, T_q // 2 :] = False  # ... and a run of them
    return mask


def _plain_mask(mask, is_causal, T_q, T_k):
    if not is_causal:
        return mask
    causal = causal_mask(T_q, T_k)
    return causal if mask is None else causal & mask


def _assert_within(pairs: dict, dtype, bar: float) -> None:
    errors = relative_errors(pairs, dtype)
    bad = {k: e for k, (_, e) in errors.items() if not e <= bar}
    assert not bad, f"relative errors over {bar:.0e}: {bad}"


# (T_q, T_k, mask, is_causal, block_q, block_k): T_q != T_k both ways, lengths that are not multiples of the
# blocks, a single query (decoding), blocks larger than the sequence, blocks of one row, fully masked rows.
SCENARIOS = {
    "no mask": (37, 37, "none", False, 16, 8),
    "causal": (37, 37, "none", True, 16, 8),
    "padding": (37, 41, "padding", False, 16, 8),
    "padding and causal": (41, 41, "padding", True, 8, 16),
    "random mask": (20, 33, "random", False, 8, 8),
    "fully masked rows": (20, 33, "fully_masked", False, 8, 16),
    "fully masked rows, causal": (33, 33, "fully_masked", True, 16, 16),
    "T_q < T_k, causal": (19, 50, "padding", True, 8, 16),
    "T_q > T_k, causal": (50, 19, "none", True, 16, 8),
    "single query": (1, 29, "padding", False, 64, 8),
    "single query, causal": (1, 29, "none", True, 64, 8),
    "blocks larger than the sequence": (10, 12, "padding", True, 64, 64),
    "blocks of one row": (6, 7, "random", True, 1, 1),
    "square blocks, exact multiples": (32, 32, "none", True, 16, 16),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_matches_the_plain_pair(scenario: str, dtype) -> None:
    T_q, T_k, kind, is_causal, block_q, block_k = SCENARIOS[scenario]
    B, H, Dh = 2, 3, 8
    rng = np.random.default_rng(0)
    q, k, v = _inputs(rng, dtype, B, H, T_q, T_k, Dh)
    mask = _mask(kind, rng, B, H, T_q, T_k)
    dout = rng.standard_normal((B, H, T_q, Dh)).astype(dtype)

    out, cache = nt.flash_attention_forward(q, k, v, mask, is_causal, block_q, block_k)
    dq, dk, dv, dtable = nt.flash_attention_backward(dout, cache)
    ref, ref_cache = scaled_dot_product_attention_forward(q, k, v, _plain_mask(mask, is_causal, T_q, T_k))
    rdq, rdk, rdv, rdtable = scaled_dot_product_attention_backward(dout, ref_cache)
    assert dtable is None and rdtable is None  # no T5 table was read: the fourth gradient is None

    for name, x in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv), ("lse", cache.lse)):
        assert x.dtype == np.dtype(dtype), f"{name} is {x.dtype}, expected {np.dtype(dtype)}"
    assert all(np.isfinite(x).all() for x in (out, dq, dk, dv))
    _assert_within({"out": (out, ref)}, dtype, PLAIN_BAR[np.dtype(dtype)])
    _assert_within({"dq": (dq, rdq), "dk": (dk, rdk), "dv": (dv, rdv)}, dtype, PLAIN_BAR[np.dtype(dtype)])
    assert all(np.abs(g).max() > 0 for g in (dq, dk, dv))
    # The cache keeps q, k, v, out and L (B, H, T_q), nothing of size (T_q, T_k).
    assert cache.lse.shape == (B, H, T_q)
    fields = [getattr(cache, f.name) for f in dataclasses.fields(cache)]
    assert not any(isinstance(x, np.ndarray) and x.shape[-2:] == (T_q, T_k) for x in fields if x is not mask)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_fully_masked_rows_give_exact_zeros(is_causal: bool) -> None:
    rng = np.random.default_rng(1)
    B, H, T, Dh = 2, 2, 9, 4
    q, k, v = _inputs(rng, np.float64, B, H, T, T, Dh)
    mask = np.ones((B, 1, 1, T), dtype=bool)
    mask[1] = False  # every key of the second sequence is padding: all its rows attend to nothing
    out, cache = nt.flash_attention_forward(q, k, v, mask, is_causal, 4, 4)
    dq, dk, dv, _ = nt.flash_attention_backward(rng.standard_normal(out.shape), cache)
    assert (out[1] == 0).all() and (dq[1] == 0).all() and (dk[1] == 0).all() and (dv[1] == 0).all()
    assert np.isfinite(cache.lse[0]).all() and np.isinf(cache.lse[1]).all()  # L = +inf marks an empty row
    assert np.abs(dq[0]).max() > 0


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_finite_differences(is_causal: bool) -> None:
    """The conventions' bar, every coordinate, float64, several blocks each way, a padding mask and a fully masked
    row."""
    rng = np.random.default_rng(2)
    B, H, T_q, T_k, Dh = 1, 2, 5, 7, 3
    q, k, v = _inputs(rng, np.float64, B, H, T_q, T_k, Dh)
    mask = rng.random((B, H, T_q, T_k)) > 0.2
    mask[0, 1, 2] = False
    result = check_pair(
        nt.flash_attention_forward,
        lambda dout, cache: nt.flash_attention_backward(dout, cache)[:3],  # dtable: None, no T5 table
        dict(q=q, k=k, v=v, attn_mask=mask, is_causal=is_causal, block_q=2, block_k=3),
        wrt=["q", "k", "v"],
        max_coords=None,
        eps=1e-5,
    )
    assert result.worst <= 1e-6, str(result)
    assert all(g > 0 for g in result.max_abs_grad.values()), str(result)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize(
    "T_q, T_k, kind, is_causal",
    [(37, 37, "none", False), (37, 37, "none", True), (21, 45, "padding", False), (45, 21, "padding", True),
     (1, 29, "padding", False)],
    ids=["full", "causal", "padding, T_q < T_k", "padding and causal, T_q > T_k", "single query"],
)  # fmt: skip
def test_matches_torch_sdpa(device: str, dtype, T_q, T_k, kind, is_causal) -> None:
    """Against F.scaled_dot_product_attention, forward and backward (autograd), one random upstream gradient.
    torch takes either attn_mask or is_causal: with both, its mask is the two combined (top-left aligned)."""
    rng = np.random.default_rng(3)
    B, H, Dh = 2, 3, 16
    q, k, v = _inputs(rng, dtype, B, H, T_q, T_k, Dh)
    mask = _mask(kind, rng, B, H, T_q, T_k)
    dout = rng.standard_normal((B, H, T_q, Dh)).astype(dtype)
    out, cache = nt.flash_attention_forward(q, k, v, mask, is_causal, 16, 8)
    dq, dk, dv, _ = nt.flash_attention_backward(dout, cache)

    tq, tk, tv = (torch.from_numpy(x).to(device).requires_grad_() for x in (q, k, v))
    if mask is None:
        t_out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=is_causal)
    else:
        t_mask = torch.from_numpy(_plain_mask(mask, is_causal, T_q, T_k)).to(device)
        t_out = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=t_mask)
    t_out.backward(torch.from_numpy(dout).to(device))
    assert t_out.dtype == TORCH_DTYPE[np.dtype(dtype)]

    pairs = {"out": (out, to_numpy(t_out))}
    _assert_within(pairs, dtype, BAR[np.dtype(dtype)])
    grads = {"dq": (dq, to_numpy(tq.grad)), "dk": (dk, to_numpy(tk.grad)), "dv": (dv, to_numpy(tv.grad))}
    _assert_within(grads, dtype, BAR[np.dtype(dtype)])
    assert all(np.abs(g).max() > 0 for g in (dq, dk, dv))


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_no_array_of_size_T_q_by_T_k(is_causal: bool) -> None:
    """Forward + backward at T = 1024: the tiled pair's peak is a small fraction of one (B, H, T_q, T_k) array
    (its blocks are (B, H, 64, 64)), while the plain pair's is several of them (which shows tracemalloc sees
    NumPy's arrays at all)."""
    rng = np.random.default_rng(4)
    B, H, T, Dh = 1, 2, 1024, 16
    q, k, v = _inputs(rng, np.float64, B, H, T, T, Dh)
    dout = rng.standard_normal(q.shape)
    one_scores = B * H * T * T * q.itemsize  # 16 MiB

    def tiled():
        out, cache = nt.flash_attention_forward(q, k, v, is_causal=is_causal)
        nt.flash_attention_backward(dout, cache)

    def plain():
        out, cache = scaled_dot_product_attention_forward(q, k, v, causal_mask(T, T) if is_causal else None)
        scaled_dot_product_attention_backward(dout, cache)

    tiled_peak, plain_peak = _peak_bytes(tiled), _peak_bytes(plain)
    assert tiled_peak < one_scores / 8, f"tiled peak {tiled_peak / 2**20:.1f} MiB vs one scores array 16 MiB"
    assert plain_peak >= one_scores, f"plain peak {plain_peak / 2**20:.1f} MiB: tracemalloc should see it"


@pytest.mark.parametrize(
    "T_q, T_k, block_q, block_k",
    [(256, 256, 64, 64), (100, 300, 32, 64), (300, 100, 64, 32), (77, 77, 16, 40)],
)
def test_causal_skips_the_blocks_above_the_diagonal(monkeypatch, T_q, T_k, block_q, block_k) -> None:
    """Count the blocks whose scores each pass computes: causal visits exactly the blocks holding at least one
    (query i, key j <= i) pair, the same ones forward and backward; non-causal visits all of them."""
    visits = []
    block_scores = fa._block_scores

    def counting(q_i, k_j, *rest):
        visits.append((q_i.shape[2], k_j.shape[2]))
        return block_scores(q_i, k_j, *rest)

    monkeypatch.setattr(fa, "_block_scores", counting)
    rng = np.random.default_rng(5)
    q, k, v = _inputs(rng, np.float64, 1, 1, T_q, T_k, 4)
    dout = rng.standard_normal(q.shape)
    counts = {}
    for is_causal in (False, True):
        visits.clear()
        out, cache = fa.flash_attention_forward(q, k, v, None, is_causal, block_q, block_k)
        forward = len(visits)
        visits.clear()
        fa.flash_attention_backward(dout, cache)
        counts[is_causal] = (forward, len(visits))

    starts_q, starts_k = range(0, T_q, block_q), range(0, T_k, block_k)
    every = len(starts_q) * len(starts_k)
    below = sum(j0 <= min(i0 + block_q, T_q) - 1 for i0 in starts_q for j0 in starts_k)  # some key j <= some query i
    assert counts[False] == (every, every)
    assert counts[True] == (below, below)
    assert below < every


# ----------------------------------------------------------------------------------------------
# Arguments.


def test_rejects_bad_arguments() -> None:
    rng = np.random.default_rng(6)
    q, k, v = _inputs(rng, np.float64, 1, 2, 5, 6, 4)
    cases = [
        (dict(q=q[0]), ValueError, "q must have shape"),
        (dict(k=k.astype(np.float32)), TypeError, "share one dtype"),
        (dict(v=v.astype(int)), TypeError, "v must be a floating-point"),
        (dict(q=list(q)), TypeError, "q must be a numpy array"),
        (dict(k=k[:, :1]), ValueError, "share \\(B, H\\)"),
        (dict(k=k[..., :3], v=v[..., :3]), ValueError, "head size"),
        (dict(v=v[:, :, :4]), ValueError, "same number of keys"),
        (dict(attn_mask=np.ones((1, 1, 5, 6), dtype=int)), TypeError, "attn_mask must be a bool"),
        (dict(attn_mask=np.ones((5, 5), dtype=bool)), ValueError, "does not broadcast"),
        (dict(attn_mask=np.ones((1, 1, 1, 5, 6), dtype=bool)), ValueError, "does not broadcast"),
        (dict(is_causal=1), TypeError, "is_causal must be a bool"),
        (dict(block_q=0), ValueError, "block_q must be a positive int"),
        (dict(block_k=True), ValueError, "block_k must be a positive int"),
        (dict(block_k=8.0), ValueError, "block_k must be a positive int"),
    ]
    for change, error, message in cases:
        args = dict(q=q, k=k, v=v) | change
        with pytest.raises(error, match=message):
            nt.flash_attention_forward(**args)
    out, cache = nt.flash_attention_forward(q, k, v)
    with pytest.raises(ValueError, match="dout must have shape"):
        nt.flash_attention_backward(rng.standard_normal((1, 2, 4, 4)), cache)
    with pytest.raises(TypeError, match="dout must have dtype"):
        nt.flash_attention_backward(out.astype(np.float32), cache)
    _, plain_cache = scaled_dot_product_attention_forward(q, k, v)
    with pytest.raises(TypeError, match="flash_attention_forward"):
        nt.flash_attention_backward(out, plain_cache)


def _mha_params(rng, D, kv, dtype):
    shapes = {"q_proj": (D, D), "k_proj": (kv, D), "v_proj": (kv, D), "out_proj": (D, D)}
    params = {}
    for name, shape in shapes.items():
        params[f"{name}.weight"] = (rng.standard_normal(shape) / np.sqrt(D)).astype(dtype)
        params[f"{name}.bias"] = rng.standard_normal(shape[0]).astype(dtype) * 0.1
    return params


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_multi_head_attention_kernels_agree(dtype) -> None:
    """kernel="flash" in multi-head attention, with grouped-query heads, rotary positions, padding and causality."""
    rng = np.random.default_rng(7)
    B, T, D, H, H_kv = 2, 70, 16, 4, 2  # T > 64: several blocks at the default block size
    params = _mha_params(rng, D, D // H * H_kv, dtype)
    x = rng.standard_normal((B, T, D)).astype(dtype)
    mask = np.ones((B, 1, 1, T), dtype=bool)
    mask[-1, ..., 50:] = False
    rope = nt.attention.rope_angles(np.arange(T), D // H, 10000.0, dtype)
    dout = rng.standard_normal((B, T, D)).astype(dtype)
    results = {}
    for kernel in ("plain", "flash"):
        out, cache = multi_head_attention_forward(
            params, x, x, x, H, mask, n_kv_heads=H_kv, rope=rope, is_causal=True, kernel=kernel
        )
        results[kernel] = (out, *multi_head_attention_backward(dout, cache))
        assert cache.kernel == kernel and isinstance(cache.attn, ScaledDotProductAttentionCache) == (kernel == "plain")
    flash, plain = results["flash"], results["plain"]
    pairs = {name: (flash[i], plain[i]) for i, name in enumerate(["out", "dquery", "dkey", "dvalue"])}
    pairs |= {name: (flash[4][name], plain[4][name]) for name in plain[4]}
    assert flash[0].dtype == np.dtype(dtype) and all(g.dtype == np.dtype(dtype) for g in flash[4].values())
    _assert_within(pairs, dtype, PLAIN_BAR[np.dtype(dtype)])

    with pytest.raises(ValueError, match="no attention dropout"):
        multi_head_attention_forward(params, x, x, x, H, dropout=Dropout(0.1, rng=rng), kernel="flash")
    with pytest.raises(ValueError, match="kernel must be"):
        multi_head_attention_forward(params, x, x, x, H, kernel="tiled")


# ----------------------------------------------------------------------------------------------
# Whole models with TransformerConfig(attention="flash").

MODEL_CASES = {
    # name: (family, config fields, scenario, lengths)
    "Transformer, post-norm, fully masked rows": ("transformer", dict(), "fully_masked", (6, 5)),
    "Transformer, pre-norm, learned, T > block": (
        "transformer",
        dict(norm_first=True, positional="learned", max_len=128, n_encoder_layers=1, n_decoder_layers=1),
        "padding",
        (70, 67),
    ),
    "TransformerLM, rope, GQA (Llama-like), T > block": (
        "lm",
        dict(positional="rope", n_heads=4, n_kv_heads=2, norm="rms", norm_first=True, activation="silu",
             gated_ffn=True, bias=False, pad_id=None, max_len=128),
        "none",
        (1, 80),
    ),
    "EncoderModel, padding, token types (BERT-like)": (
        "encoder",
        dict(activation="gelu", positional="learned", type_vocab_size=2, embedding_norm=True),
        "padding",
        (7, 1),
    ),
}  # fmt: skip


def _model(family: str, config, dtype):
    cls = {"transformer": nt.Transformer, "lm": nt.TransformerLM, "encoder": nt.EncoderModel}[family]
    return cls(config, seed=0, dtype=dtype)


def _model_inputs(family: str, config, scenario: str, lengths: tuple):
    rng = np.random.default_rng(8)
    if family == "encoder":
        return make_encoder_batch(config, rng, length=lengths[0], scenario=scenario)
    src, tgt_in, _ = make_batch(config, rng, src_len=lengths[0], tgt_len=lengths[1], scenario=scenario)
    return (tgt_in,) if family == "lm" else (src, tgt_in)


@pytest.mark.parametrize("name", list(MODEL_CASES))
def test_flash_model_equals_plain_model(name: str) -> None:
    """The same weights, attention="plain" vs "flash": outputs and every gradient within 1e-12 (float64)."""
    family, fields, scenario, lengths = MODEL_CASES[name]
    config = nt.TransformerConfig(**fields)
    inputs = _model_inputs(family, config, scenario, lengths)
    results = {}
    for attention in ("plain", "flash"):
        model = _model(family, nt.TransformerConfig(**fields, attention=attention), np.float64)
        out = model.forward(*inputs)
        dout = np.random.default_rng(9).standard_normal(out.shape)
        model.zero_grad()
        model.backward(dout)
        results[attention] = (out, dict(model.grads))
    (out_f, grads_f), (out_p, grads_p) = results["flash"], results["plain"]
    _assert_within({"output": (out_f, out_p)}, np.float64, 1e-12)
    _assert_within({k: (grads_f[k], grads_p[k]) for k in grads_p}, np.float64, 1e-12)
    assert all(np.abs(g).max() > 0 for k, g in grads_f.items() if not k.endswith("k_proj.bias"))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", list(MODEL_CASES))
def test_flash_model_matches_torch(name: str, dtype, device: str) -> None:
    """A flash NumPy model against torch_transformer (whose F.scaled_dot_product_attention is itself fused), by
    the conventions' bars. A flash model has no attention maps to compare; everything else (hidden states, logits,
    loss, every gradient) is compared."""
    family, fields, scenario, lengths = MODEL_CASES[name]
    config = nt.TransformerConfig(**fields, attention="flash")
    if family == "encoder":
        result = compare_encoder_models(config, dtype, device, scenario=scenario, length=lengths[0])
    else:
        lm = family == "lm"
        result = compare_models(config, dtype, device, lm=lm, scenario=scenario, src_len=lengths[0], tgt_len=lengths[1])
    assert not failures(result, dtype), "\n".join(failures(result, dtype))
    assert len(result.grads) == len(nt.model.parameter_shapes(config, family == "lm", family == "encoder"))


def test_flash_model_has_no_attention_maps() -> None:
    model = nt.TransformerLM(nt.TransformerConfig(attention="flash"))
    model.forward(np.array([[3, 4, 5]]))
    with pytest.raises(ValueError, match="attention='flash'"):
        model.attention_maps()


@pytest.mark.parametrize("use_cache", [True, False], ids=["kv cache", "recomputed"])
def test_decoding_with_a_flash_config(use_cache: bool) -> None:
    """generate works with a flash model and gives the plain model's tokens. With the KV cache, decoding
    attends with the plain pair (one new query over t cached keys: a (1, t) row, nothing to tile); without it,
    every step runs model.forward, through the tiled pair."""
    fields = dict(positional="rope", n_kv_heads=2, pad_id=None, max_len=32)
    prompt = np.array([[5, 6, 7], [8, 9, 10]])
    tokens = {}
    for attention in ("plain", "flash"):
        model = nt.TransformerLM(nt.TransformerConfig(**fields, attention=attention), seed=3)
        tokens[attention] = nt.generate(model, prompt, max_new_tokens=8, use_cache=use_cache)
    np.testing.assert_array_equal(tokens["flash"], tokens["plain"])
    src = np.array([[5, 6, 7, 8], [9, 10, 11, 0]])
    model = nt.Transformer(nt.TransformerConfig(attention="flash"), seed=3)
    plain = nt.Transformer(nt.TransformerConfig(), seed=3)
    np.testing.assert_array_equal(
        nt.generate(model, src, max_new_tokens=6, use_cache=use_cache),
        nt.generate(plain, src, max_new_tokens=6, use_cache=use_cache),
    )


# ----------------------------------------------------------------------------------------------
# The benchmark.


@pytest.mark.slow  # 10 s of timing; the tiled kernel's parity tests stay in the default run
def test_benchmark_quick_mode(tmp_path) -> None:
    out = tmp_path / "flash.json"
    printed = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json", str(out), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    report = json.loads(out.read_text())
    rows = report["rows"]
    for causal in (False, True):
        for kernel in ("plain", "tiled", "torch"):
            assert any(r["kernel"] == kernel and r["causal"] == causal for r in rows), (kernel, causal)
    tiled = [r for r in rows if r["kernel"] == "tiled"]
    assert all(r["seconds"] > 0 and r["peak_mib"] > 0 for r in tiled)
    assert any(r["kernel"] == "plain" and r["skipped"] for r in rows), "the quick mode exercises the skip"
    assert report["block_sweep"] and report["machine"]["load_average"]
    assert (tmp_path / "flash_attention.png").stat().st_size > 0
    assert "peak MiB" in printed and "skipped" in printed
