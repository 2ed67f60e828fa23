"""The fast path (numpy_transformer.parallel) against the plain path it speeds up.

DataParallel runs the reference code on parts of the batch in threads and adds the parts' gradients. The
plain path, fed the same dropout masks (the fast path's, replayed by site), must give the same loss, outputs
and gradients: float64 to 1e-12 (only the sums over the batch split differently), float32 within the conventions'
1e-5. A seeded fast step repeats bit for bit, its masks replay into torch_transformer, and the optimizer's
chunked, threaded step equals the plain element-wise update applied to whole tensors, bitwise.
"""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_info, threadpool_limits

import numpy_transformer as nt
import torch_transformer as tt
from numpy_transformer import optim, parallel
from parity_tests import components as C
from parity_tests._source_checks import private_attributes

CONFIG = nt.TransformerConfig(
    src_vocab_size=17,
    tgt_vocab_size=19,
    d_model=16,
    n_heads=4,
    d_ff=24,
    n_encoder_layers=2,
    n_decoder_layers=2,
    dropout=0.2,
    max_len=12,
)
LLAMA = nt.TransformerConfig(
    tgt_vocab_size=23,
    d_model=16,
    n_heads=4,
    n_kv_heads=2,
    d_ff=24,
    n_decoder_layers=2,
    **C.LLAMA_OPTIONS,
    tie_embeddings=True,
    norm_first=True,
    dropout=0.1,
    max_len=12,
)
BERT = nt.TransformerConfig(
    src_vocab_size=29,
    d_model=16,
    n_heads=2,
    d_ff=32,
    n_encoder_layers=2,
    positional="learned",
    type_vocab_size=2,
    embedding_norm=True,
    activation="gelu",
    dropout=0.1,
    max_len=12,
    scale_embeddings=False,
)
BAR = {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 1e-5}


def make_batch(model, rng, B: int = 5):
    """(inputs, targets) with padding in the sources and ignored targets, for either family."""
    cfg = model.config
    tgt = rng.integers(3, cfg.tgt_vocab_size, size=(B, 7))
    tgt[0, 4:] = cfg.pad_id  # padded decoder inputs, and their targets ignored
    targets = np.roll(tgt, -1, axis=1)
    targets[:, -1] = cfg.pad_id
    if isinstance(model, nt.TransformerLM):
        return (tgt,), targets
    src = rng.integers(3, cfg.src_vocab_size, size=(B, 9))
    src[1, 6:] = cfg.pad_id
    return (src, tgt), targets


def assert_close(pairs: dict, dtype, what: str) -> None:
    errors = C.relative_errors(pairs, dtype)
    bad = {k: e for k, (_, e) in errors.items() if not e <= BAR[np.dtype(dtype)]}
    assert not bad, f"{what}: {bad}"


def plain_step(model, inputs, targets, label_smoothing, masks):
    """The reference: forward (with the given dropout masks), loss, backward."""
    logits = model.forward(*inputs, dropout_masks=masks)
    loss, cache = nt.cross_entropy_forward(logits, targets, model.config.pad_id, label_smoothing)
    model.backward(nt.cross_entropy_backward(cache))
    return loss, logits


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("n_parts", [2, 3])
@pytest.mark.parametrize(
    ("cls", "config"), [(nt.Transformer, CONFIG), (nt.TransformerLM, LLAMA)], ids=["seq2seq", "llama"]
)
def test_fast_step_equals_the_plain_step(cls, config, n_parts, dtype):
    fast = cls(config, seed=2, dtype=dtype).train()
    plain = cls(config, seed=2, dtype=dtype).train()
    inputs, targets = make_batch(fast, np.random.default_rng(0))
    fast.zero_grad()
    loss = parallel.DataParallel(fast, n_parts).forward_backward(inputs, targets, config.pad_id, 0.1)
    masks = fast.dropout_masks
    assert masks and all(m.shape[0] == len(targets) and not m.all() for m in masks.values())  # the batch's masks
    plain.zero_grad()
    plain_loss, _ = plain_step(plain, inputs, targets, 0.1, masks)
    assert plain.dropout_masks.keys() == masks.keys()
    assert np.asarray(loss).dtype == dtype
    assert_close({"loss": (loss, plain_loss)}, dtype, "loss")
    assert fast.grads.keys() == plain.grads.keys()
    assert_close({k: (fast.grads[k], plain.grads[k]) for k in plain.grads}, dtype, "gradients")
    assert all(g.dtype == dtype for g in fast.grads.values())
    assert sum(bool(np.any(g)) for g in fast.grads.values()) >= len(fast.grads) - 8  # k_proj biases: zero


def test_forward_and_backward_separately_equal_the_plain_path():
    """runner.forward / runner.backward, as model.forward / model.backward; and they accumulate."""
    fast, plain = nt.Transformer(CONFIG, seed=4).train(), nt.Transformer(CONFIG, seed=4).train()
    rng = np.random.default_rng(1)
    runner = parallel.DataParallel(fast, 2)
    fast.zero_grad()
    plain.zero_grad()
    for _ in range(2):  # two backward passes without zero_grad: the gradients add up, as in the plain path
        inputs, _ = make_batch(fast, rng)
        logits = runner.forward(*inputs)
        dlogits = rng.standard_normal(logits.shape)
        runner.backward(dlogits)
        plain_logits = plain.forward(*inputs, dropout_masks=fast.dropout_masks)
        plain.backward(dlogits)
        assert_close({"logits": (logits, plain_logits)}, np.float64, "logits")
    assert_close({k: (fast.grads[k], plain.grads[k]) for k in plain.grads}, np.float64, "gradients")


def test_encoder_model_with_token_types():
    fast, plain = nt.EncoderModel(BERT, seed=1).train(), nt.EncoderModel(BERT, seed=1).train()
    rng = np.random.default_rng(3)
    ids = rng.integers(3, BERT.src_vocab_size, size=(4, 10))
    ids[2, 7:] = BERT.pad_id
    types = (np.arange(10) >= 5).astype(np.int64)[None].repeat(4, axis=0)
    runner = parallel.DataParallel(fast, 2)
    hidden = runner.forward(ids, types)
    dhidden = rng.standard_normal(hidden.shape)
    fast.zero_grad()
    runner.backward(dhidden)
    plain_hidden = plain.forward(ids, types, dropout_masks=fast.dropout_masks)
    plain.zero_grad()
    plain.backward(dhidden)
    assert_close({"hidden": (hidden, plain_hidden)}, np.float64, "hidden")
    assert_close({k: (fast.grads[k], plain.grads[k]) for k in plain.grads}, np.float64, "gradients")
    fast.eval()
    plain.eval()  # token types default to zeros on both paths
    assert_close({"hidden": (runner.forward(ids), plain.forward(ids))}, np.float64, "evaluation")


def test_evaluation_forward_equals_the_plain_forward():
    model = nt.Transformer(CONFIG, seed=5).eval()
    inputs, _ = make_batch(model, np.random.default_rng(2), B=6)
    fast = parallel.DataParallel(model, 3).forward(*inputs)
    assert model.dropout_masks == {}
    assert_close({"logits": (fast, model.forward(*inputs))}, np.float64, "logits")


def test_an_inference_forward_equals_the_plain_forward_and_keeps_nothing():
    model = nt.Transformer(CONFIG, seed=5).eval()
    inputs, _ = make_batch(model, np.random.default_rng(2), B=6)
    runner = parallel.DataParallel(model, 3)
    fast = runner.forward(*inputs, keep_cache=False)
    assert_close({"logits": (fast, model.forward(*inputs))}, np.float64, "logits")
    assert runner.replicas == []  # each part's activations went with its thread
    with pytest.raises(ValueError, match="backward called after a forward with keep_cache=False"):
        runner.backward(np.ones_like(fast))
    with pytest.raises(TypeError, match="keep_cache must be a bool, got str"):
        runner.forward(*inputs, keep_cache="no")


def train_fast(dtype, steps: int = 2) -> list[dict]:
    """Seeded model, `steps` fast Adam steps with dropout; loss, masks, gradients and params as bytes."""
    model = nt.Transformer(CONFIG, seed=3, dtype=dtype).train()
    runner = parallel.DataParallel(model, 2)
    optimizer = optim.Adam(model.params, lr=1e-2)
    rng = np.random.default_rng(11)
    record = []
    for _ in range(steps):
        inputs, targets = make_batch(model, rng)
        model.zero_grad()
        loss = runner.forward_backward(inputs, targets, CONFIG.pad_id, 0.1)
        optimizer.step(model.grads)
        record.append(
            {"loss": np.asarray(loss).tobytes()}
            | {f"mask {k}": m.tobytes() for k, m in model.dropout_masks.items()}
            | {f"grad {k}": g.tobytes() for k, g in model.grads.items()}
            | {f"param {k}": p.tobytes() for k, p in model.params.items()}
        )
    return record


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_a_seeded_fast_step_repeats_bitwise(dtype):
    first, second = train_fast(dtype), train_fast(dtype)
    for step, (a, b) in enumerate(zip(first, second, strict=True)):
        assert a.keys() == b.keys()
        differ = [k for k in a if a[k] != b[k]]
        assert not differ, f"step {step}: not bitwise equal: {differ}"
    masks = [k for k in first[0] if k.startswith("mask")]
    assert masks and all(first[0][k] != first[1][k] for k in masks)  # each step draws new masks


def test_fast_masks_replay_into_torch():
    """The fast path's dropout_masks are the masks it used, by site: torch_transformer, fed them, agrees."""
    model = nt.Transformer(CONFIG, seed=6).train()
    torch_model = tt.Transformer(CONFIG).to(torch.float64).train()
    torch_model.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    (src, tgt), targets = make_batch(model, np.random.default_rng(7))
    model.zero_grad()
    loss = parallel.DataParallel(model, 2).forward_backward((src, tgt), targets, CONFIG.pad_id, 0.1)
    masks = {k: torch.from_numpy(v) for k, v in model.dropout_masks.items()}
    logits = torch_model(torch.from_numpy(src), torch.from_numpy(tgt), dropout_masks=masks)
    t_loss = tt.cross_entropy(logits, torch.from_numpy(targets), CONFIG.pad_id, 0.1)
    t_loss.backward()
    params = dict(torch_model.named_parameters())
    pairs = {"loss": (loss, t_loss.detach().numpy())}
    assert_close(pairs, np.float64, "loss")
    grads = {k: (g, params[k].grad.numpy()) for k, g in model.grads.items()}  # type: ignore[union-attr]  # all set by backward
    assert not C.failures(C.Result(grads=grads), np.float64)


def test_edge_cases():
    model = nt.Transformer(CONFIG, seed=1).train()
    runner = parallel.DataParallel(model, 4)
    inputs, targets = make_batch(model, np.random.default_rng(0), B=2)
    model.zero_grad()
    runner.forward_backward(inputs, targets, CONFIG.pad_id)  # fewer rows than parts: one row per part
    assert len(runner.bounds) == 2
    # a part whose targets are all ignored contributes nothing, and the rest is still the batch's mean
    targets = targets.copy()
    targets[1] = CONFIG.pad_id
    model.zero_grad()
    loss = parallel.DataParallel(model, 2).forward_backward(inputs, targets, CONFIG.pad_id)
    plain = nt.Transformer(CONFIG, seed=1).train()
    plain.zero_grad()
    plain_loss, _ = plain_step(plain, inputs, targets, 0.0, model.dropout_masks)
    assert_close({"loss": (loss, plain_loss)}, np.float64, "loss")
    assert_close({k: (model.grads[k], plain.grads[k]) for k in plain.grads}, np.float64, "gradients")
    with pytest.raises(ValueError, match="every target equals ignore_index"):
        runner.forward_backward(inputs, np.full_like(targets, CONFIG.pad_id), CONFIG.pad_id)
    with pytest.raises(ValueError, match="one batch size"):
        runner.forward(inputs[0], inputs[1][:1])
    with pytest.raises(ValueError, match=r"targets must have shape \(2, 7\)"):
        runner.forward_backward(inputs, targets[:1], CONFIG.pad_id)
    with pytest.raises(ValueError, match="before forward"):
        parallel.DataParallel(model).backward(np.zeros((2, 7, CONFIG.tgt_vocab_size)))
    with pytest.raises(ValueError, match="n_parts"):
        parallel.DataParallel(model, 0)
    bad = inputs[0].copy()
    bad[1, 0] = CONFIG.src_vocab_size  # out of the vocabulary, in the second part: raised from its thread
    with pytest.raises(ValueError, match="src_ids"):
        runner.forward(bad, inputs[1])
    # a plain backward after a fast forward has no cache to read (the replicas hold it)
    with pytest.raises(ValueError, match="before forward"):
        model.backward(np.zeros((2, 7, CONFIG.tgt_vocab_size)))


def blas_threads() -> list:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_blas_threads_are_restored():
    before = blas_threads()
    model = nt.TransformerLM(LLAMA, seed=0)
    inputs, targets = make_batch(model, np.random.default_rng(0))
    parallel.DataParallel(model, 2).forward_backward(inputs, targets, LLAMA.pad_id)
    with pytest.raises(ValueError):
        parallel.DataParallel(model, 2).forward(np.full((2, 3), LLAMA.tgt_vocab_size))
    assert blas_threads() == before


def test_split_rows():
    assert parallel.split_rows(5, 2) == [(0, 2), (2, 5)]
    assert parallel.split_rows(6, 3) == [(0, 2), (2, 4), (4, 6)]
    assert parallel.split_rows(1, 4) == [(0, 1)]


@pytest.mark.parametrize(
    "make",
    [
        lambda p: optim.Adam(p, lr=1e-2, weight_decay=1e-3),
        lambda p: optim.AdamW(p, lr=1e-2),
        lambda p: optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3),
    ],
    ids=["adam", "adamw", "sgd"],
)
def test_chunked_optimizer_step_equals_whole_tensor_updates(make, monkeypatch):
    """optim's step cuts tensors into chunks on the pool; the plain update on whole tensors is the reference."""
    rng = np.random.default_rng(0)
    shapes = {"a": (300, 70), "b": (70,), "c": (3, 5, 7)}
    params = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    reference = {k: v.copy() for k, v in params.items()}
    monkeypatch.setattr(parallel, "CHUNK", 1000)  # many chunks, some of them partial
    fast, plain = make(params), make(reference)
    for _ in range(3):
        grads = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
        fast.step(grads)
        plain.step_count += 1
        for name, p in reference.items():
            if not plain.state[name]:
                plain.state[name] = plain.init_state(p)
            plain.update(p, grads[name], plain.state[name])
    for name in shapes:
        assert params[name].tobytes() == reference[name].tobytes(), name


@pytest.mark.parametrize("float32_kernels", [True, False], ids=["float32-kernels", "reference-kernels"])
def test_gelu_model_in_float32(float32_kernels):
    """A GELU model in float32: the fast path's float32 GELU (or the reference's, when asked) within the
    conventions' bar."""
    fast = nt.EncoderModel(BERT, seed=2, dtype=np.float32).train()
    plain = nt.EncoderModel(BERT, seed=2, dtype=np.float32).train()
    rng = np.random.default_rng(5)
    ids = rng.integers(3, BERT.src_vocab_size, size=(4, 10))
    ids[1, 6:] = BERT.pad_id
    runner = parallel.DataParallel(fast, 2, float32_kernels=float32_kernels)
    hidden = runner.forward(ids)
    dhidden = rng.standard_normal(hidden.shape).astype(np.float32)
    fast.zero_grad()
    runner.backward(dhidden)
    plain_hidden = plain.forward(ids, dropout_masks=fast.dropout_masks)
    plain.zero_grad()
    plain.backward(dhidden)
    assert_close({"hidden": (hidden, plain_hidden)}, np.float32, "hidden")
    assert_close({k: (fast.grads[k], plain.grads[k]) for k in plain.grads}, np.float32, "gradients")
    # the fast kernels were the replicas' only: the reference's table and the model's are as they were
    reference = (nt.layers.gelu_forward, nt.layers.gelu_backward)
    assert nt.layers.ACTIVATIONS["gelu"] == reference and fast.activation_table is nt.layers.ACTIVATIONS
    assert "threading" not in vars(nt.layers)  # the reference knows nothing of threads


def test_float32_normal_cdf_and_gelu():
    from scipy.special import ndtr

    x = np.linspace(-9, 9, 2_000_001, dtype=np.float32)
    ours = parallel.normal_cdf_float32(x, np.empty_like(x))
    assert np.abs(ours - ndtr(x.astype(np.float64))).max() <= 1.5e-7
    assert ours[0] < 1e-10 and ours[-1] == 1.0 and (np.diff(ours) >= 0).all()  # a distribution function
    assert np.abs(ours + ours[::-1] - 1).max() <= 1.2e-7  # Phi(-x) = 1 - Phi(x)
    special = np.array([np.nan, np.inf, -np.inf, 0.0], dtype=np.float32)
    cdf = parallel.normal_cdf_float32(special, np.empty_like(special))
    assert np.isnan(cdf[0]) and cdf[1] == 1.0 and 0.0 < cdf[2] < 1e-10 and cdf[3] == 0.5
    x = np.random.default_rng(0).standard_normal((37, 3001)).astype(np.float32) * 4  # chunks, and a partial one
    (out, cache), (ref, ref_cache) = parallel.gelu_forward(x), nt.layers.gelu_forward(x)
    cached_x, cdf, ref_cdf = cache.x, cache.cdf, ref_cache.cdf
    assert out.dtype == cdf.dtype == np.float32 and cached_x is x
    assert np.abs(cdf - ref_cdf).max() <= 2.1e-7 and np.abs(out - ref).max() <= 2.1e-7 * np.abs(x).max()
    x64 = x.astype(np.float64)  # float64 runs the reference itself
    np.testing.assert_array_equal(parallel.gelu_forward(x64)[0], nt.layers.gelu_forward(x64)[0])


def row_ops(rng) -> dict:
    """name -> (forward(x) -> (out, cache), backward(dout, cache) -> dx or (dx, parameter gradients...) or None,
    the input's shape): ops whose rows (axis 0) are independent, with float64 parameters."""
    D = 24
    w, b, W = 1 + 0.1 * rng.standard_normal(D), 0.1 * rng.standard_normal(D), rng.standard_normal((9, D)) / 5

    def cast(*arrays):  # parameters in the input's dtype
        return lambda x: [a.astype(x.dtype) for a in arrays]

    ln, rms, lin = cast(w, b), cast(w), cast(W, b[:9])
    return {
        "softmax": (nt.layers.softmax_forward, nt.layers.softmax_backward, (5, 3, 7, 7)),
        "log-softmax": (lambda x: (nt.loss.log_softmax(x), None), None, (10, 40)),
        "layer norm": (lambda x: nt.layers.layer_norm_forward(x, *ln(x), 1e-5), nt.layers.layer_norm_backward, (10, D)),
        "rms norm": (lambda x: nt.layers.rms_norm_forward(x, *rms(x), 1e-6), nt.layers.rms_norm_backward, (10, D)),
        "gelu": (*nt.layers.ACTIVATIONS["gelu"], (10, D)),
        "silu": (*nt.layers.ACTIVATIONS["silu"], (10, D)),
        "linear": (lambda x: nt.layers.linear_forward(x, *lin(x)), nt.layers.linear_backward, (10, D)),
    }


def ops_on_parts(forward, backward, x, dout, n_parts: int) -> dict:
    """An op as the fast path runs it (parallel.map_parts on the rows of each part), its outputs and input gradients
    put back together and its parameter gradients added in part order: name -> array."""
    bounds = parallel.split_rows(len(x), n_parts)
    results = parallel.map_parts(forward, [(x[lo:hi],) for lo, hi in bounds])
    out = {"out": np.concatenate([r[0] for r in results])}
    if backward is not None:
        grads = parallel.map_parts(backward, [(dout[lo:hi], r[1]) for (lo, hi), r in zip(bounds, results, strict=True)])
        grads = [g if isinstance(g, tuple) else (g,) for g in grads]
        out["dx"] = np.concatenate([g[0] for g in grads])
        for i, parts in enumerate(zip(*(g[1:] for g in grads), strict=True), start=1):
            if parts[0] is not None:
                out[f"dparam{i}"] = sum(parts[1:], parts[0])
    return out


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_row_ops_on_parts_equal_the_plain_ops(dtype):
    """Every row op run as the fast path runs it (bench.py --ops times it so), on 3 uneven parts in the pool,
    against the plain call on the whole array; GELU as the fast path's float32 kernel (parallel.FLOAT32_KERNELS, the
    reference itself in float64). Float64: the rows' outputs and input gradients are the plain ones
    bit for bit (the same arithmetic on each row; linear's products to 1e-15), parameter gradients, sums over the
    rows split into parts, to 1e-15. Float32: no further from the float64 plain op than SELF_RATIO times the plain
    float32 op's own distance from it (the fast float32 GELU kernel included)."""
    rng = np.random.default_rng(7)
    for name, (forward, backward, shape) in row_ops(rng).items():
        x64 = rng.standard_normal(shape) * 2
        dout64 = rng.standard_normal(shape if name != "linear" else (shape[0], 9))
        plain64 = ops_on_parts(forward, backward, x64, dout64, 1)
        assert all(np.abs(v).max() > 0 for v in plain64.values()), name
        x, dout = x64.astype(dtype), dout64.astype(dtype)
        fast = ops_on_parts(*parallel.FLOAT32_KERNELS.get(name, (forward, backward)), x, dout, 3)
        assert all(v.dtype == dtype and np.isfinite(v).all() for v in fast.values()), name
        assert fast.keys() == plain64.keys(), name
        if dtype == np.float64:
            plain = plain64
            for key in ("out", "dx") if name != "linear" else ():
                if key in fast:
                    np.testing.assert_array_equal(fast[key], plain[key], err_msg=f"{name} {key}")
            errors = C.relative_errors({k: (fast[k], plain[k]) for k in plain}, dtype)
            assert all(e <= 1e-15 for _, e in errors.values()), (name, errors)
        else:
            own = C.relative_errors(
                {k: (v, plain64[k]) for k, v in ops_on_parts(forward, backward, x, dout, 1).items()}, dtype
            )
            errors = C.relative_errors({k: (fast[k], plain64[k]) for k in plain64}, dtype)
            bad = {k: (e, own[k][1]) for k, (_, e) in errors.items() if not e <= C.SELF_RATIO * own[k][1]}
            assert not bad, (name, bad)


def test_part_dropout_keep_probability():
    """Keep with probability 1 - ceil(p 2^32) / 2^32: the rows of the batch's mask, drawn from the part's stream."""
    batch_masks = parallel._BatchMasks(6)
    dropout = parallel.PartDropout(0.1, np.random.default_rng(0), batch_masks, 2)
    mask = dropout.keep_mask("site", (3, 1000, 1001))
    assert mask.base is not None and np.shares_memory(mask, batch_masks.masks["site"][2:5])
    n = mask.size
    assert abs(mask.mean() - 0.9) < 5 * (0.09 / n) ** 0.5
    assert dropout.masks["site"] is mask and dropout.used == {"site"}
    assert parallel.PartDropout(1.0, np.random.default_rng(0), batch_masks, 0).keep_mask("all", (2, 5)).sum() == 0
    assert parallel.PartDropout(0.0, np.random.default_rng(0), batch_masks, 0).keep_mask("none", (2, 5)).all()


def test_the_fast_path_leaves_the_allocator_alone():
    """keep_freed_memory changes the allocator of the whole process (torch's speed too): only a call that says so
    may apply it. A fresh process imports everything, trains fast steps and an optimizer step without it."""
    import subprocess
    import sys

    code = """
from numpy_transformer import parallel
calls = []
parallel.keep_freed_memory = lambda: calls.append(1) or {}
import gc
import threading

import numpy as np
import numpy_transformer as nt
import torch_transformer
from numpy_transformer import optim
config = nt.TransformerConfig(src_vocab_size=11, tgt_vocab_size=11, d_model=8, n_heads=2, d_ff=16,
                              n_encoder_layers=1, n_decoder_layers=1, max_len=8)
model = nt.Transformer(config, dtype=np.float32)
ids = np.random.default_rng(0).integers(3, 11, size=(4, 6))
opt = optim.Adam(model.params, lr=1e-3)
for _ in range(2):
    model.zero_grad()
    parallel.DataParallel(model, 2).forward_backward((ids, ids), ids, config.pad_id)
    opt.step(model.grads)
print(len(calls))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "0"


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"/sys/fs/cgroup/cpu.max": "max 100000\n"}, None),
        ({"/sys/fs/cgroup/cpu.max": "150000 100000\n"}, 2),
        ({"/sys/fs/cgroup/cpu.max": "100000 100000\n"}, 1),
        ({"/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "300000\n", "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n"}, 3),
        ({"/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n", "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
)
def test_the_fast_path_counts_the_cores_a_cgroup_quota_allows(files, expected, monkeypatch):
    """One part per core this process may use: a container's CPU quota below its visible CPUs counts."""

    def read(path):
        if path not in files:
            raise FileNotFoundError(path)
        return files[path]

    monkeypatch.setattr(parallel, "_read", read)
    assert parallel.cgroup_cpu_quota() == expected
    monkeypatch.setattr(parallel.os, "sched_getaffinity", lambda pid: set(range(8)))
    assert parallel.available_cores() == (8 if expected is None else expected)


# ----------------------------------------------------------------------------------------------
# Threads: two runners on one model, and BLAS's thread count after every way a call can end.

# Large enough that adding one gradient into another takes milliseconds with the GIL released.
WIDE = nt.TransformerConfig(
    tgt_vocab_size=4099, d_model=256, n_heads=4, d_ff=1024, n_decoder_layers=1, dropout=0.0, max_len=16
)


def accumulate_in_step(model, timeout: float = 0.2):
    """Make `model` (not its replicas) meet the other thread before each accumulation into model.grads: both add
    at the same moment unless something serialises them (then the first waits `timeout` and goes on alone)."""
    arrived = [threading.Event(), threading.Event()]
    who = threading.local()

    class Meeting(type(model)):  # type: ignore[misc]  # the model's own class, whichever it is
        def accumulate_grads(self, grads):
            k = getattr(who, "k", None)
            if self is model and k is not None:
                arrived[k].set()
                arrived[1 - k].wait(timeout)
                arrived[k].clear()
            super().accumulate_grads(grads)

    model.__class__ = Meeting
    return who


def two_runners(model, work: list, concurrent: bool) -> dict:
    """zero_grad, then work[0] and work[1] (lists of (ids, targets)) through two DataParallel objects on `model`,
    at once in two threads or one after the other; model.grads afterwards."""
    who = accumulate_in_step(model)
    model.zero_grad()
    errors = []

    def worker(k):
        who.k = k if concurrent else None
        try:
            runner = parallel.DataParallel(model, 2)
            for ids, targets in work[k]:
                runner.forward_backward((ids,), targets)
        except Exception as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
        if not concurrent:
            t.join()
    for t in threads:
        t.join()
    assert not errors, errors
    model.__class__ = type(model).__mro__[1]
    return {k: g.copy() for k, g in model.grads.items()}


def test_two_runners_on_one_model_from_two_threads_add_up():
    """Two DataParallel objects on one model, each in its own thread, accumulating 5 batches each into model.grads:
    the same gradients (up to the order of the sums) as the 10 batches one after the other."""
    before = blas_threads()
    rng = np.random.default_rng(0)
    model = nt.TransformerLM(WIDE, seed=0).eval()
    work = [[(rng.integers(3, 4099, (4, 12)), rng.integers(3, 4099, (4, 12))) for _ in range(5)] for _ in range(2)]
    serial = two_runners(model, work, concurrent=False)
    together = two_runners(model, work, concurrent=True)
    assert all(np.any(g) for g in serial.values())
    errors = {k: np.abs(together[k] - serial[k]).max() / np.abs(serial[k]).max() for k in serial}
    assert max(errors.values()) <= 1e-12, {k: e for k, e in errors.items() if e > 1e-12}
    assert blas_threads() == before  # the thread limits of the two calls overlap in time: restored at the end


def test_blas_threads_are_restored_however_calls_nest_fail_or_overlap():
    """BLAS's thread count (set to 3 here, a value of its own) is back after each pattern: a runner inside the
    fast path's own limit, inside a caller's threadpoolctl limit, a part that raises, and two runners in two
    threads whose limits overlap, the first in leaving before the second (the order that used to leave 1);
    and the parts of runners in threads other than the one that set the count run on one BLAS thread."""
    model = nt.TransformerLM(LLAMA, seed=0)
    inputs, targets = make_batch(model, np.random.default_rng(0))
    with threadpool_limits(limits=3, user_api="blas"):
        assert set(blas_threads()) == {3}
        with parallel.one_blas_thread():  # nested in the fast path's own limit
            assert set(blas_threads()) == {1}
            parallel.DataParallel(model, 2).forward_backward(inputs, targets, LLAMA.pad_id)
            assert set(blas_threads()) == {1}
        assert set(blas_threads()) == {3}
        with threadpool_limits(limits=2, user_api="blas"):  # nested in a caller's limit
            parallel.DataParallel(model, 2).forward(*inputs)
            assert set(blas_threads()) == {2}
        assert set(blas_threads()) == {3}
        bad = inputs[0].copy()
        bad[-1, 0] = -1  # in the second part
        with pytest.raises(ValueError, match="ids"), parallel.one_blas_thread():  # a failing part, nested
            parallel.DataParallel(model, 2).forward(bad)
        assert set(blas_threads()) == {3}
        overlapping_runners(model, inputs)  # from two threads other than the one that set 3
        assert set(blas_threads()) == {3}
    assert gc.isenabled()  # the cycle collector, paused while parts run, is back too


def overlapping_runners(model, inputs, timeout: float = 5.0) -> None:
    """Runner A enters the BLAS limit, then runner B (another thread); A leaves while B is still inside."""
    a_inside, b_inside, a_done = threading.Event(), threading.Event(), threading.Event()
    role = threading.local()
    errors, inside = [], []

    class Meeting(type(model)):  # type: ignore[misc]  # the model's own class, whichever it is
        def forward(self, *args, **kwargs):  # part 0 runs on the runner's own thread
            inside.append(blas_threads())
            if getattr(role, "name", None) == "A":
                a_inside.set()
                b_inside.wait(timeout)
            elif getattr(role, "name", None) == "B":
                b_inside.set()
                a_done.wait(timeout)
            return super().forward(*args, **kwargs)

    model.__class__ = Meeting

    def runner(name):
        role.name = name
        try:
            if name == "B":
                a_inside.wait(timeout)
            parallel.DataParallel(model, 2).forward(*inputs)
        except Exception as error:
            errors.append(error)
        finally:
            if name == "A":
                a_done.set()

    threads = [threading.Thread(target=runner, args=(name,)) for name in "AB"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    model.__class__ = Meeting.__mro__[1]
    assert not errors, errors
    assert a_inside.is_set() and b_inside.is_set() and a_done.is_set()
    assert len(inside) == 4 and all(set(n) == {1} for n in inside), inside  # every part on one BLAS thread


def test_arguments_are_checked_as_the_library_checks_them():
    model = nt.Transformer(CONFIG, seed=1).eval()
    runner = parallel.DataParallel(model, np.int64(2))  # NumPy integers are integers
    assert runner.n_parts == 2 and type(runner.n_parts) is int
    with pytest.raises(TypeError, match="model must be a numpy_transformer Transformer.*got str"):
        parallel.DataParallel("x")
    with pytest.raises(TypeError, match=r"n_parts must be an int, got float \(2.0\)"):
        parallel.DataParallel(model, 2.0)  # type: ignore[arg-type]  # a float on purpose: refused
    with pytest.raises(TypeError, match="n_parts must be an int, got bool"):
        parallel.DataParallel(model, True)
    with pytest.raises(ValueError, match="n_parts must be >= 1, got -1"):
        parallel.DataParallel(model, np.int32(-1))
    # shapes quoted as the caller gave them, not as a part has them
    ids = np.full((3, CONFIG.max_len + 1), 3)
    with pytest.raises(ValueError, match=r"src_ids has 13 positions.*shape \(3, 13\)"):
        runner.forward(ids, ids[:, :5])
    with pytest.raises(ValueError, match=r"tgt_ids must have shape \(B, T\), got shape \(3,\)"):
        runner.forward(ids[:, :5], ids[:, 0])
    with pytest.raises(ValueError, match=r"tgt_ids must hold ids in \[0, 19\), got values in \[3, 40\]"):
        runner.forward(ids[:, :5], np.where(np.arange(3)[:, None] == 2, 40, ids[:, :4]))
    src, tgt = ids[:, :5], ids[:, :4]
    with pytest.raises(ValueError, match=r"targets must have shape \(3, 4\).*got \(3, 5\)"):
        runner.forward_backward((src, tgt), src)
    with pytest.raises(TypeError, match="targets must be an integer array"):
        runner.forward_backward((src, tgt), tgt.astype(float))
    logits = runner.forward(src, tgt)
    with pytest.raises(ValueError, match=r"dlogits must have shape \(3, 4, 19\), got \(3, 4, 5\)"):
        runner.backward(np.zeros((3, 4, 5)))
    with pytest.raises(TypeError, match="dlogits must have dtype float64, got float32"):
        runner.backward(np.zeros(logits.shape, np.float32))
    with pytest.raises(TypeError, match="dlogits must be a numpy array, got list"):
        runner.backward(logits.tolist())
    encoder = nt.EncoderModel(BERT, seed=0)
    with pytest.raises(ValueError, match=r"token_type_ids must have the shape of ids \(4, 6\), got \(4, 5\)"):
        parallel.DataParallel(encoder, 2).forward(np.full((4, 6), 3), np.zeros((4, 5), int))


def test_the_fast_path_changes_nothing_global_and_touches_nothing_private():
    """Importing parallel and running float32 GELU parts leaves the reference's table as it was (the same dict,
    the same entries); parallel.py reads private attributes of nothing but its own objects."""
    import ast
    import subprocess
    import sys

    code = """
import numpy as np
import numpy_transformer as nt
from numpy_transformer import layers
table, entries = layers.ACTIVATIONS, dict(layers.ACTIVATIONS)
from numpy_transformer import parallel
assert layers.ACTIVATIONS is table and layers.ACTIVATIONS == entries
config = nt.TransformerConfig(src_vocab_size=11, d_model=8, n_heads=2, d_ff=16, n_encoder_layers=1, max_len=8,
                              activation="gelu")
model = nt.EncoderModel(config, dtype=np.float32)
out = parallel.DataParallel(model, 2).forward(np.full((4, 6), 3))
assert layers.ACTIVATIONS is table and layers.ACTIVATIONS == entries and model.activation_table is table
print("unchanged")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "unchanged"
    private = private_attributes(parallel.__file__, owner="self")
    assert not private, private
    tree = ast.parse(open(parallel.__file__).read())
    modules = {"layers", "np", "os", "gc", "math", "threading", "functools", "ctypes", "platform", "weakref"}
    patched = [
        f"line {node.lineno}: {ast.unparse(target)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id in modules
    ]
    assert not patched, patched


def test_a_replica_shares_the_params_and_owns_its_state():
    model = nt.TransformerLM(LLAMA, seed=0).train()
    ids, _ = make_batch(model, np.random.default_rng(0))
    model.forward(*ids)
    model.zero_grad()
    table = {**nt.layers.ACTIVATIONS, "silu": (nt.layers.relu_forward, nt.layers.relu_backward)}
    replica = model.replica(activation_table=table)
    assert replica.params is model.params and replica.config is model.config and replica.training
    assert replica.grads == {} and replica.dropout_masks == {} and replica.activation_table is table
    with pytest.raises(ValueError, match="before forward"):  # the forward pass is the replica's now
        model.backward(np.zeros((5, 7, LLAMA.tgt_vocab_size)))
    logits = replica.eval().forward(*ids)
    assert model.training and not replica.training  # the replica's mode is its own
    plain = model.eval().forward(*ids)
    assert np.abs(logits - plain).max() > 1e-3  # its table was used: ReLU gates instead of SiLU
    dlogits = np.random.default_rng(1).standard_normal(logits.shape)
    replica.backward(dlogits)
    assert replica.grads.keys() == model.params.keys() and all(np.any(g) for g in replica.grads.values())
    assert not any(np.any(g) for g in model.grads.values())  # the model's gradients are untouched
    model.accumulate_grads(replica.grads)
    assert all(model.grads[k] is g for k, g in replica.grads.items())  # the first contribution is kept


def test_blas_threads_sets_the_count_and_restores_it_however_it_exits():
    """parallel.blas_threads(n): n threads inside (what bench.py gives NumPy and torch alike), the earlier counts
    yielded and back afterwards, after an error too; parts that run inside it keep one thread each, and a count set
    while parts run (from another thread) applies once they finish. Bad counts are refused by name."""
    model = nt.TransformerLM(LLAMA, seed=0)
    inputs, targets = make_batch(model, np.random.default_rng(0))
    with threadpool_limits(limits=3, user_api="blas"):
        assert parallel.blas_thread_counts() == blas_threads()
        with parallel.blas_threads(np.int64(2)) as previous:
            assert previous == [3] * len(previous) and set(blas_threads()) == {2}
            assert set(parallel.blas_thread_counts()) == {2}
            parallel.DataParallel(model, 2).forward_backward(inputs, targets, LLAMA.pad_id)
            assert set(blas_threads()) == {2}
        assert set(blas_threads()) == {3}
        with pytest.raises(RuntimeError, match="inside"), parallel.blas_threads(1):
            raise RuntimeError("inside")
        assert set(blas_threads()) == {3}
        with parallel.one_blas_thread():  # parts running: the new count waits for them
            with parallel.blas_threads(2):
                assert set(blas_threads()) == {1}
            assert set(blas_threads()) == {1}
        assert set(blas_threads()) == {3}
        with parallel.one_blas_thread(), parallel.blas_threads(2):
            pass
        assert set(blas_threads()) == {3}
    for bad, error in ((0, ValueError), (True, TypeError), (2.0, TypeError), ("2", TypeError)):
        with pytest.raises(error, match=r"n must be .*BLAS threads.*got"), parallel.blas_threads(bad):  # type: ignore[arg-type]  # wrong on purpose
            pass


def test_a_runner_reports_the_seconds_of_its_phases():
    model = nt.TransformerLM(LLAMA, seed=0)
    inputs, targets = make_batch(model, np.random.default_rng(0))
    runner = parallel.DataParallel(model, 2)
    runner.forward_backward(inputs, targets, LLAMA.pad_id)
    assert set(runner.phase_seconds) == {"parts", "sum of the parts' gradients"}
    assert all(0 < s < 60 for s in runner.phase_seconds.values())
    runner.forward(*inputs)  # no gradients added: the parts' phase only, of this call
    assert set(runner.phase_seconds) == {"parts"} and runner.phase_seconds["parts"] > 0
