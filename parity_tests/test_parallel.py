"""The fast path (numpy_transformer.parallel) against the plain path it speeds up.

DataParallel runs the reference code on parts of the batch in threads and adds the parts' gradients. The
plain path, fed the same dropout masks (the fast path's, replayed by site), must give the same loss, outputs
and gradients: float64 to 1e-12 (only the sums over the batch split differently), float32 within the conventions'
1e-5. A seeded fast step repeats bit for bit, its masks replay into torch_transformer, and the optimizer's
chunked, threaded step equals the plain element-wise update applied to whole tensors, bitwise.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_info

import numpy_transformer as nt
import torch_transformer as tt
from numpy_transformer import optim, parallel
from parity_tests import components as C

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
    grads = {k: (g, params[k].grad.numpy()) for k, g in model.grads.items()}
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
    with pytest.raises(ValueError, match="batch size"):
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
    # the fast kernels were this call's only: every thread is back on the reference's functions
    reference = (nt.layers.gelu_forward, nt.layers.gelu_backward)
    assert nt.layers.ACTIVATIONS["gelu"] == reference
    futures = [parallel.pool().submit(nt.layers.ACTIVATIONS.__getitem__, "gelu") for _ in range(4)]
    assert all(f.result() == reference for f in futures)
    assert "threading" not in vars(nt.layers)  # the reference knows nothing of threads


def test_float32_erf_and_gelu():
    from scipy.special import erf

    x = np.linspace(-8, 8, 2_000_001, dtype=np.float32)
    ours = parallel.erf_float32(x, np.empty_like(x))
    assert np.abs(ours - erf(x.astype(np.float64))).max() <= 4.1e-7
    assert np.abs(ours).max() == 1.0 and ours[-1] == 1.0 and ours[0] == -1.0
    np.testing.assert_array_equal(ours, -ours[::-1])  # odd
    special = np.array([np.nan, np.inf, -np.inf, 0.0], dtype=np.float32)
    np.testing.assert_array_equal(parallel.erf_float32(special, np.empty_like(special)), [np.nan, 1, -1, 0])
    x = np.random.default_rng(0).standard_normal((37, 3001)).astype(np.float32) * 4  # chunks, and a partial one
    (out, (cached_x, cdf)), (ref, (_, ref_cdf)) = parallel.gelu_forward(x), nt.layers.gelu_forward(x)
    assert out.dtype == cdf.dtype == np.float32 and cached_x is x
    assert np.abs(cdf - ref_cdf).max() <= 2.1e-7 and np.abs(out - ref).max() <= 2.1e-7 * np.abs(x).max()
    x64 = x.astype(np.float64)  # float64 runs the reference itself
    np.testing.assert_array_equal(parallel.gelu_forward(x64)[0], nt.layers.gelu_forward(x64)[0])


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


def test_part_threads_see_the_float32_gelu_and_no_other_thread_does():
    """The dispatch lives in parallel.py: a part's thread that set its kernels reads the float32 GELU from
    layers.ACTIVATIONS; the same lookup anywhere else gives the reference's pair."""
    parallel.DataParallel(nt.EncoderModel(BERT, seed=2, dtype=np.float32), 2)  # installs the dispatch
    table = nt.layers.ACTIVATIONS
    assert isinstance(table, parallel._PartKernels)

    def in_a_part():
        parallel._PartKernels._local.kernels = parallel.FLOAT32_KERNELS
        try:
            return table["gelu"], table["relu"]
        finally:
            parallel._PartKernels._local.kernels = None

    gelu, relu = parallel.pool().submit(in_a_part).result()
    assert gelu[0] is parallel.gelu_forward and relu == (nt.layers.relu_forward, nt.layers.relu_backward)
    assert table["gelu"] == (nt.layers.gelu_forward, nt.layers.gelu_backward)
