"""The comparisons behind the parity tests and the parity report.

One `Case` per operation: the NumPy forward/backward pair with its arguments, and the same
computation written with PyTorch's own ops (`F.*`, or a `torch_transformer` module run with the
NumPy parameters through `torch.func.functional_call`). `run_case` feeds both the same inputs and
the same random upstream gradient and returns the outputs and every input/parameter gradient side
by side; `relative_errors` judges them as docs/conventions.md says.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

import torch_transformer as tt
from numpy_transformer import attention as np_attention
from numpy_transformer import gradcheck
from numpy_transformer import layers as L
from numpy_transformer import loss as np_loss

# docs/conventions.md: error = max|a - b| / max(max|b|, f * s), s the largest |value| in the same comparison.
FLOOR = {np.dtype(np.float64): 1e-3, np.dtype(np.float32): 1e-1}
BAR = {np.dtype(np.float64): 1e-10, np.dtype(np.float32): 1e-5}
FD_BAR = 1e-6
# Float32 against a real model judged by what float32 can do there. On a real model (all-MiniLM-L6-v2: 6 layers,
# 384 wide, a position table whose gradient sums over every token of the batch) float32 rounding alone exceeds the
# float32 bar: transformers' own float32 gradients are 2.0e-5 from its float64 ones. There the reference is run in
# float32 too, on the same inputs, and each tensor of ours may be off by up to SELF_RATIO times the reference's
# own float32 error on that tensor (never held to less than the float32 bar), but never more than FLOAT32_CAP.
# Two float32 computations of the same math round independently: on the tiny Gemma 2 with scores capped at 2 and
# logits at 3, our float32 gradient of input_layernorm.weight measured 2.25 times transformers' own float32 error
# on that tensor with OpenBLAS's Haswell kernel, and v_proj.weight's 3.4 times under OpenBLAS's Sandybridge kernel
# (no FMA): the reference's error is torch's (MKL, which OPENBLAS_CORETYPE does not change), so it does not see our
# kernel's rounding. Where our own float32 error is measured too (Result.own_float32: our float32 run against our
# float64 run, same inputs), a tensor's rounding is the larger of the two own errors, ours or the reference's.
# That cannot pass a wrong gradient: the float64 comparison (1e-10) judges the math. What our own error could hide
# is float32-only inaccuracy of ours (a cancelling formula, a float32-only path), so `failures` also holds our
# rounding as a whole to the reference's: the geometric mean over the tensors of the ratio of the two own errors
# (each floored at float32's epsilon) at most SELF_RATIO (measured 0.8-1.5 on the tiny text models under the
# Haswell and Sandybridge kernels, where single tensors reach 3.4), besides FLOAT32_CAP for each tensor.
SELF_RATIO = 3.0
# Our own float32 error on one tensor is taken as rounding up to OWN_LIMIT times the reference's own (3.4 measured,
# above), so no tensor of ours is allowed more than SELF_RATIO * OWN_LIMIT times the reference's own float32 error.
OWN_LIMIT = 3.0
FLOAT32_CAP = 1e-4
EPS32 = float(np.finfo(np.float32).eps)
TORCH_DTYPE = {np.dtype(np.float64): torch.float64, np.dtype(np.float32): torch.float32}
# What makes a config Llama-style (tests add their sizes and the rest): RMSNorm, rotary positions, SwiGLU,
# no biases anywhere.
LLAMA_OPTIONS = dict(
    norm="rms", positional="rope", gated_ffn=True, activation="silu", bias=False, output_bias=False
)  # fmt: skip


def devices() -> list[str]:
    """Every device torch has here: the CPU always, CUDA when available."""
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def one_torch_thread():
    """The body of an autouse fixture for the test modules: torch runs on one thread during a test, and gets
    its thread count back after it. The tensors compared here are tiny and their ops run one at a time, so a
    thread pool only adds latency; on a machine shared with other jobs, several times the work."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def relative_errors(pairs: dict, dtype) -> dict:
    """name -> (max |a - b|, relative error) for pairs name -> (ours, reference)."""
    f = FLOOR[np.dtype(dtype)]
    s = max((float(np.abs(b).max(initial=0.0)) for _, b in pairs.values()), default=0.0)
    out = {}
    for name, (a, b) in pairs.items():
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if a.shape != b.shape:
            raise AssertionError(f"{name}: shapes differ, {a.shape} vs {b.shape}")
        diff = float(np.abs(a - b).max(initial=0.0))
        denominator = max(float(np.abs(b).max(initial=0.0)), f * s)
        out[name] = (diff, diff / denominator if denominator > 0 else (0.0 if diff == 0 else math.inf))
    return out


def bars(result: Result, dtype) -> dict:
    """name -> the bar each output and gradient of `result` is judged by: the conventions' bar for `dtype`, or,
    where the result carries the reference's own float32 errors, min(FLOAT32_CAP, max(bar, SELF_RATIO * rounding)),
    the rounding the reference's own float32 error on that tensor, or ours where it is measured and larger."""
    bar = BAR[np.dtype(dtype)]
    names = [*result.outputs, *result.grads]
    if result.reference_float32 is None:
        return dict.fromkeys(names, bar)
    return {name: min(FLOAT32_CAP, max(bar, SELF_RATIO * rounding(result, name))) for name in names}


def rounding(result: Result, name: str) -> float:
    """What float32 rounding alone does to tensor `name`: the reference's own float32 error on it, or ours (our
    float32 run against our float64 run) when measured and larger, but never more than OWN_LIMIT times the
    reference's: a float32 inaccuracy of ours on one tensor (which the geometric mean of `rounding_ratio` would
    dilute among the others) is not taken for rounding."""
    theirs = result.reference_float32[name]
    own = 0.0 if result.own_float32 is None else result.own_float32[name]
    return max(theirs, min(own, OWN_LIMIT * theirs))


def rounding_ratio(result: Result) -> float:
    """Our float32 rounding against the reference's over the whole result: the geometric mean over its tensors of
    max(ours, eps) / max(the reference's, eps) (eps float32's). nan without our own errors."""
    if result.own_float32 is None or result.reference_float32 is None:
        return math.nan
    logs = [
        math.log(max(result.own_float32[name], EPS32) / max(result.reference_float32[name], EPS32))
        for name in result.reference_float32
    ]
    return math.exp(sum(logs) / len(logs))


def failures(result: Result, dtype) -> list[str]:
    """Every output or gradient over its bar (`bars`), in forward order, as readable lines.

    Gradients are also required to be non-zero as a whole (a comparison of zeros proves nothing).
    """
    allowed = bars(result, dtype)
    lines = []
    for kind, pairs in (("output", result.outputs), ("gradient", result.grads)):
        for name, (diff, err) in relative_errors(pairs, dtype).items():
            if not err <= allowed[name]:
                own = (
                    ""
                    if result.reference_float32 is None
                    else f"; the reference's own float32 error {result.reference_float32[name]:.3e}"
                )
                if result.own_float32 is not None:
                    own += f", ours {result.own_float32[name]:.3e}"
                lines.append(
                    f"{kind} {name}: relative error {err:.3e} > {allowed[name]:.3g} (max |diff| {diff:.3e}{own})"
                )
    ratio = rounding_ratio(result)
    if result.own_float32 is not None and not ratio <= SELF_RATIO:
        lines.append(
            f"our float32 rounding is {ratio:.2f} times the reference's (geometric mean over the tensors of our own "
            f"float32 error over the reference's own) > {SELF_RATIO:g}: float32 inaccuracy of ours, not kernel rounding"
        )
    if result.grads and all(not np.any(ours) for ours, _ in result.grads.values()):
        lines.append("every gradient is zero: the comparison is vacuous")
    return lines


def worst(result: Result, dtype) -> tuple[float, float, float, float]:
    """(max |diff| of outputs, worst relative error of outputs, the same two for gradients)."""
    figures = []
    for pairs in (result.outputs, result.grads):
        errors = relative_errors(pairs, dtype).values()
        figures += [max((d for d, _ in errors), default=0.0), max((e for _, e in errors), default=0.0)]
    return tuple(figures)


@dataclass
class Case:
    """One operation, written twice. `torch_fn` takes the same keyword arguments as `forward`,
    converted to tensors (float arrays in `wrt` require grad; dicts of arrays become dicts of tensors)."""

    forward: object
    backward: object
    args: dict
    wrt: list
    torch_fn: object
    notes: str = ""


@dataclass
class Result:
    outputs: dict = field(default_factory=dict)  # name -> (numpy, torch)
    grads: dict = field(default_factory=dict)  # name -> (numpy, torch)
    # name -> the reference's own float32 relative error (its float32 run against its float64 run), when a float32
    # result is judged by what float32 can do on that model (see SELF_RATIO); None: the conventions' bar.
    reference_float32: dict | None = None
    # name -> our own float32 relative error (our float32 run against our float64 run, same inputs), where measured
    # (needs reference_float32): a tensor's rounding is then the larger of the two (`rounding`, `rounding_ratio`)
    own_float32: dict | None = None


def result_errors(result: Result, dtype) -> dict:
    """name -> (max |a - b|, relative error) for every output and gradient of `result` (relative_errors of each)."""
    return {**relative_errors(result.outputs, dtype), **relative_errors(result.grads, dtype)}


def self_errors(reference32: Result) -> dict:
    """name -> relative error, for a Result pairing the reference's float32 run with its float64 run."""
    return {name: error for name, (_, error) in result_errors(reference32, np.float32).items()}


def flatten_into(name, value, out):
    if isinstance(value, dict):
        for k, v in value.items():
            out[f"{name}.{k}"] = v
    else:
        out[name] = value


def torch_arguments(case: Case, device: str) -> tuple[dict, dict]:
    """(the case's arguments as tensors on `device`, the leaves whose gradients are compared by flat name): arrays
    and dicts of arrays become tensors (integer ones long), those in case.wrt requiring grad when floating point;
    anything else passes as it is."""

    def tensor(x, requires_grad):
        t = torch.from_numpy(np.ascontiguousarray(x)).to(device)
        if t.dtype == torch.int64 or t.dtype == torch.int32:
            t = t.long()
        return t.requires_grad_(requires_grad and t.is_floating_point())

    targs, leaves = {}, {}
    for name, value in case.args.items():
        if isinstance(value, dict):
            targs[name] = {k: tensor(v, name in case.wrt) for k, v in value.items()}
            if name in case.wrt:
                flatten_into(name, targs[name], leaves)
        elif isinstance(value, np.ndarray):
            targs[name] = tensor(value, name in case.wrt)
            if name in case.wrt:
                leaves[name] = targs[name]
        else:
            targs[name] = value
    return targs, leaves


def run_case(case: Case, device: str, seed: int = 0) -> Result:
    """Run both sides with one random upstream gradient; return outputs and gradients by name."""
    rng = np.random.default_rng(seed + 1000)
    out, cache = case.forward(**case.args)
    dout = rng.standard_normal(np.shape(out)).astype(np.asarray(out).dtype)
    grads = case.backward(dout if np.ndim(out) else float(dout), cache)
    if len(case.wrt) == 1:
        grads = (grads,)

    targs, leaves = torch_arguments(case, device)
    tout = case.torch_fn(**targs)
    tout.backward(torch.as_tensor(dout, device=device))

    result = Result(outputs={"out": (out, to_numpy(tout))})
    ours = {}
    for name, g in zip(case.wrt, grads, strict=True):
        flatten_into(name, g, ours)
    for name, leaf in leaves.items():
        result.grads[name] = (ours[name], to_numpy(leaf.grad))
    return result


def fd_error(case: Case, seed: int = 0) -> float:
    """Worst finite-difference relative error of the NumPy backward (the case must be float64)."""
    return gradcheck.check_pair(case.forward, case.backward, case.args, case.wrt, seed=seed, max_coords=12).worst


# ----------------------------------------------------------------------------------------------
# The cases. Sizes are small; inputs are random with a fixed seed.

B, T, T_K, D, H, FF, V = 2, 5, 4, 8, 2, 12, 11


def _padding_causal_mask(rng) -> np.ndarray:
    """(B, 1, T, T_K): causal-ish and padding, every row keeps at least one key."""
    mask = np.tril(np.ones((T, T_K), dtype=bool), k=0)[None, None].repeat(B, axis=0)
    mask[1, :, :, -1] = False  # a padded key in the second sequence
    mask[:, :, :, 0] = True
    return mask


def case_linear(dtype, rng):
    x, w, b = (rng.standard_normal(s).astype(dtype) for s in ((B, T, D), (FF, D), (FF,)))
    return Case(
        L.linear_forward,
        L.linear_backward,
        dict(x=x, weight=w, bias=b),
        ["x", "weight", "bias"],
        lambda x, weight, bias: F.linear(x, weight, bias),
    )


def case_embedding(dtype, rng):
    ids = rng.integers(0, 4, size=(B, T))  # small range: repeated ids must accumulate
    w = rng.standard_normal((V, D)).astype(dtype)
    scale = math.sqrt(D)
    return Case(
        L.embedding_forward,
        L.embedding_backward,
        dict(ids=ids, weight=w, scale=scale),
        ["weight"],
        lambda ids, weight, scale: F.embedding(ids, weight) * scale,
    )


def case_positions(dtype, rng):
    x, table = rng.standard_normal((B, T, D)).astype(dtype), rng.standard_normal((7, D)).astype(dtype)
    return Case(
        L.add_positions_forward,
        L.add_positions_backward,
        dict(x=x, table=table),
        ["x", "table"],
        lambda x, table: x + table[: x.shape[1]],
    )


def case_softmax(dtype, rng):
    x = rng.standard_normal((B, H, T, T_K)).astype(dtype)
    mask = _padding_causal_mask(rng)
    return Case(
        L.softmax_forward,
        L.softmax_backward,
        dict(x=x, mask=mask),
        ["x"],
        lambda x, mask: F.softmax(x.masked_fill(~mask, float("-inf")), dim=-1),
    )


def _activation_case(name, torch_fn):
    def case(dtype, rng):
        x = rng.standard_normal((B, T, FF)).astype(dtype)
        x[np.abs(x) < 1e-3] = 0.5  # keep relu's kink away from the finite differences
        forward, backward = L.ACTIVATIONS[name]
        return Case(forward, backward, dict(x=x), ["x"], torch_fn)

    return case


def case_dropout(dtype, rng):
    """F.dropout draws its own mask; the NumPy side replays it and must give the same values.

    The mask is drawn on the CPU generator (seeded), so the torch side runs F.dropout there too.
    """
    p, seed = 0.3, int(rng.integers(1 << 30))
    x = rng.standard_normal((B, T, D)).astype(dtype)

    def torch_fn(x, p, keep_mask):
        torch.manual_seed(seed)
        return F.dropout(x.cpu(), p, training=True).to(x.device)

    torch.manual_seed(seed)
    keep = to_numpy(F.dropout(torch.ones(x.shape, dtype=TORCH_DTYPE[dtype]), p, training=True)) != 0
    return Case(L.dropout_forward, L.dropout_backward, dict(x=x, p=p, keep_mask=keep), ["x"], torch_fn)


def case_layer_norm(dtype, rng):
    x = (rng.standard_normal((B, T, D)) * 3 + 1).astype(dtype)
    w, b = (1 + rng.standard_normal(D)).astype(dtype), rng.standard_normal(D).astype(dtype)
    return Case(
        L.layer_norm_forward,
        L.layer_norm_backward,
        dict(x=x, weight=w, bias=b, eps=1e-5),
        ["x", "weight", "bias"],
        lambda x, weight, bias, eps: F.layer_norm(x, (x.shape[-1],), weight, bias, eps),
    )


def case_attention(dtype, rng):
    q = rng.standard_normal((B, H, T, D // H)).astype(dtype)
    k, v = (rng.standard_normal((B, H, T_K, D // H)).astype(dtype) for _ in range(2))
    mask = _padding_causal_mask(rng)
    return Case(
        np_attention.scaled_dot_product_attention_forward,
        lambda dout, cache: np_attention.scaled_dot_product_attention_backward(dout, cache)[:3],  # no T5 table
        dict(q=q, k=k, v=v, mask=mask),
        ["q", "k", "v"],
        lambda q, k, v, mask: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
    )


def _mha_params(dtype, rng):
    return {
        f"{p}_proj.{w}": (rng.standard_normal((D, D) if w == "weight" else D) / math.sqrt(D)).astype(dtype)
        for p in ("q", "k", "v", "out")
        for w in ("weight", "bias")
    }


def case_multi_head_attention(dtype, rng):
    """Cross-attention (T_q != T_k), batch 2, 2 heads, padding + causal mask and one fully masked row."""
    query = rng.standard_normal((B, T, D)).astype(dtype)
    memory = rng.standard_normal((B, T_K, D)).astype(dtype)
    mask = _padding_causal_mask(rng)
    mask[0, :, 2, :] = False  # a query with nothing to attend to: zero probabilities, zero context
    module = tt.MultiHeadAttention(D, H)

    def torch_fn(params, query, key, value, n_heads, attn_mask):
        module.to(query.device)
        return torch.func.functional_call(module, params, (query, key, value), {"attn_mask": attn_mask})[0]

    return Case(
        np_attention.multi_head_attention_forward,
        np_attention.multi_head_attention_backward,
        dict(params=_mha_params(dtype, rng), query=query, key=memory, value=memory.copy(), n_heads=H, attn_mask=mask),
        ["query", "key", "value", "params"],
        torch_fn,
    )


def case_feed_forward(dtype, rng, activation="gelu", gated=False, bias=True):
    """The feed-forward block against torch_transformer.FeedForward: linear2(act(linear1(x))), or with
    `gated` (SwiGLU with silu) linear2(act(gate(x)) * linear1(x)); `bias` False drops every bias."""
    x = rng.standard_normal((B, T, D)).astype(dtype)
    params = {
        "linear1.weight": rng.standard_normal((FF, D)) / math.sqrt(D),
        "linear1.bias": rng.standard_normal(FF),
        "linear2.weight": rng.standard_normal((D, FF)) / math.sqrt(FF),
        "linear2.bias": rng.standard_normal(D),
    }
    if gated:
        params |= {"gate.weight": rng.standard_normal((FF, D)) / math.sqrt(D), "gate.bias": rng.standard_normal(FF)}
    params = {k: v.astype(dtype) for k, v in params.items() if bias or k.endswith("weight")}
    module = tt.FeedForward(D, FF, activation, 0.0, gated=gated, bias=bias)

    def torch_fn(params, x, activation):
        module.to(x.device)
        return torch.func.functional_call(module, params, (x,))

    forward, backward = (
        (L.gated_feed_forward_forward, L.gated_feed_forward_backward)
        if gated
        else (L.feed_forward_forward, L.feed_forward_backward)
    )
    return Case(forward, backward, dict(params=params, x=x, activation=activation), ["x", "params"], torch_fn)


def case_rms_norm(dtype, rng):
    """RMSNorm (Llama) against F.rms_norm: no centring, no bias."""
    x = (rng.standard_normal((B, T, D)) * 3 + 1).astype(dtype)
    w = (1 + rng.standard_normal(D)).astype(dtype)
    return Case(
        L.rms_norm_forward,
        L.rms_norm_backward,
        dict(x=x, weight=w, eps=1e-6),
        ["x", "weight"],
        lambda x, weight, eps: F.rms_norm(x, (x.shape[-1],), weight, eps),
    )


# The gated feed-forward (SwiGLU with silu by default): case_feed_forward with its gate.
case_gated_feed_forward = functools.partial(case_feed_forward, activation="silu", gated=True)


# Rotary positions and grouped-query attention need a head size of a few pairs: D 16 and 4 heads (Dh 4).
D_GQA, H_GQA, ROPE_THETA, ROPE_START = 16, 4, 1000.0, 3


def case_rope(dtype, rng):
    """The NumPy pair rotation (tables (T, Dh/2), computed by rope_angles) against torch_transformer's
    x cos + rotate_half(x) sin with its own tables (T, Dh) from rope_cos_sin: positions 3 .. 3 + T - 1."""
    Dh = 8
    x = rng.standard_normal((B, H, T, Dh)).astype(dtype)
    cos, sin = np_attention.rope_angles(np.arange(ROPE_START, ROPE_START + T), Dh, ROPE_THETA, dtype)

    def torch_fn(x, cos, sin):
        t_cos, t_sin = tt.layers.rope_cos_sin(ROPE_START, ROPE_START + T, Dh, ROPE_THETA, x.dtype, x.device)
        return tt.layers.apply_rope(x, t_cos, t_sin)

    return Case(np_attention.rope_forward, np_attention.rope_backward, dict(x=x, cos=cos, sin=sin), ["x"], torch_fn)


def case_repeat_kv(dtype, rng):
    """Each of 2 K/V heads serves 3 query heads: torch.repeat_interleave over the head axis."""
    x = rng.standard_normal((B, 2, T, 4)).astype(dtype)
    return Case(
        np_attention.repeat_kv_forward,
        np_attention.repeat_kv_backward,
        dict(x=x, n_rep=3),
        ["x"],
        lambda x, n_rep: x.repeat_interleave(n_rep, dim=1),
    )


def _gqa_params(dtype, rng, n_kv_heads: int, bias: bool = True) -> dict:
    kv = n_kv_heads * D_GQA // H_GQA
    shapes = {"q_proj": (D_GQA, D_GQA), "k_proj": (kv, D_GQA), "v_proj": (kv, D_GQA), "out_proj": (D_GQA, D_GQA)}
    params = {}
    for name, shape in shapes.items():
        params[f"{name}.weight"] = (rng.standard_normal(shape) / math.sqrt(D_GQA)).astype(dtype)
        if bias:
            params[f"{name}.bias"] = (0.3 * rng.standard_normal(shape[0])).astype(dtype)
    return params


def case_gqa_attention(dtype, rng, n_kv_heads=2, bias=True, padding=True):
    """Grouped-query self-attention (4 query heads, n_kv_heads K/V heads) with rotary positions and the
    causal mask, against torch_transformer.MultiHeadAttention (SDPA with enable_gqa). query, key and
    value are three arrays of one length, so that each input gradient is compared on its own. With
    `padding`, a padding mask on top of causality, and the first key of the second sequence padded (its
    first query then attends to nothing); without, torch's fused is_causal path runs."""
    x = [rng.standard_normal((B, T, D_GQA)).astype(dtype) for _ in range(3)]
    mask = None
    if padding:
        mask = np.ones((B, 1, 1, T), dtype=bool)
        mask[1, ..., 0] = False
        mask[1, ..., -1] = False
    Dh = D_GQA // H_GQA
    rope = np_attention.rope_angles(np.arange(T), Dh, ROPE_THETA, dtype)
    module = tt.MultiHeadAttention(D_GQA, H_GQA, n_kv_heads=n_kv_heads, bias=bias)

    def torch_fn(params, query, key, value, n_heads, attn_mask, n_kv_heads, rope, is_causal):
        module.to(query.device)
        tables = tt.layers.rope_cos_sin(0, query.shape[1], Dh, ROPE_THETA, query.dtype, query.device)
        kwargs = {"attn_mask": attn_mask, "rope": tables, "is_causal": is_causal}
        return torch.func.functional_call(module, params, (query, key, value), kwargs)[0]

    args = dict(params=_gqa_params(dtype, rng, n_kv_heads, bias), query=x[0], key=x[1], value=x[2], n_heads=H_GQA)
    args |= dict(attn_mask=mask, n_kv_heads=n_kv_heads, rope=rope, is_causal=True)
    return Case(
        np_attention.multi_head_attention_forward,
        np_attention.multi_head_attention_backward,
        args,
        ["query", "key", "value", "params"],
        torch_fn,
    )


def case_bias_free_attention(dtype, rng):
    """Cross-attention as case_multi_head_attention, with no biases (Llama's linears)."""
    case = case_multi_head_attention(dtype, rng)
    case.args["params"] = {k: v for k, v in case.args["params"].items() if k.endswith("weight")}
    module = tt.MultiHeadAttention(D, H, bias=False)

    def torch_fn(params, query, key, value, n_heads, attn_mask):
        module.to(query.device)
        return torch.func.functional_call(module, params, (query, key, value), {"attn_mask": attn_mask})[0]

    case.torch_fn = torch_fn
    return case


def case_cross_entropy(dtype, rng):
    logits = (rng.standard_normal((B, T, V)) * 2).astype(dtype)
    targets = rng.integers(0, V, size=(B, T))
    targets[1, -2:] = -100  # ignored positions
    return Case(
        np_loss.cross_entropy_forward,
        lambda dloss, cache: np_loss.cross_entropy_backward(cache, dloss),
        dict(logits=logits, targets=targets, ignore_index=-100, label_smoothing=0.1),
        ["logits"],
        lambda logits, targets, ignore_index, label_smoothing: F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            targets.reshape(-1),
            ignore_index=ignore_index,
            label_smoothing=label_smoothing,
        ),
    )


CASES = {
    "linear": case_linear,
    "embedding": case_embedding,
    "positions": case_positions,
    "softmax (masked)": case_softmax,
    "relu": _activation_case("relu", lambda x: F.relu(x)),
    "gelu": _activation_case("gelu", F.gelu),
    "gelu_tanh": _activation_case("gelu_tanh", lambda x: F.gelu(x, approximate="tanh")),
    "dropout": case_dropout,
    "layer_norm": case_layer_norm,
    "scaled_dot_product_attention": case_attention,
    "multi_head_attention": case_multi_head_attention,
    "feed_forward": case_feed_forward,
    "cross_entropy": case_cross_entropy,
    # after the paper: Llama's components
    "rms_norm": case_rms_norm,
    "silu": _activation_case("silu", lambda x: F.silu(x)),
    "gated_feed_forward (SwiGLU)": case_gated_feed_forward,
    "gated_feed_forward (SwiGLU, no bias)": functools.partial(case_gated_feed_forward, bias=False),
    "rope": case_rope,
    "repeat_kv": case_repeat_kv,
    "multi_head_attention (GQA 2 of 4, rope, causal, padding)": case_gqa_attention,
    "multi_head_attention (MQA, rope, causal, no bias)": functools.partial(
        case_gqa_attention, n_kv_heads=1, bias=False, padding=False
    ),
    "multi_head_attention (no bias)": case_bias_free_attention,
}


def make_case(name: str, dtype, seed: int = 0) -> Case:
    return CASES[name](np.dtype(dtype), np.random.default_rng(seed))


# ----------------------------------------------------------------------------------------------
# Whole models: one state dict into both, the same batch, the same objective.

MASK_SCENARIOS = ("none", "padding", "fully_masked")


def make_batch(config, rng, batch: int = 2, src_len: int = 6, tgt_len: int = 5, scenario: str = "padding"):
    """Random ids (never pad, bos or eos) with padding placed as the scenario asks:

    "none": no padding; "padding": the last sequence is padded at the end, in source and target;
    "fully_masked": additionally the first source is all pad (its encoder and cross-attention rows
    attend to nothing) and the last target starts with pad (which the decoder reads as a token: its
    self-attention masks only the future, as Marian's decoder start token pad_id needs).
    Returns src_ids (B, S), tgt_in (B, T) (starting with bos), tgt_out (B, T) (targets, pad ignored).
    With pad_id None (no padding token) no position is padded, whatever the scenario.
    """
    pad, first = config.pad_id, 3
    src = rng.integers(first, config.src_vocab_size, size=(batch, src_len))
    tgt = rng.integers(first, config.tgt_vocab_size, size=(batch, tgt_len + 1))
    tgt[:, 0] = config.bos_id
    if pad is None:
        return src, tgt[:, :-1], tgt[:, 1:]
    if scenario in ("padding", "fully_masked"):
        src[-1, src_len // 2 :] = pad
        tgt[-1, (tgt_len + 1) // 2 :] = pad
    if scenario == "fully_masked":
        src[0, :] = pad
        tgt[-1, 0] = pad
    return src, tgt[:, :-1], tgt[:, 1:]


def ignore_index(config) -> int:
    """The loss ignores padded targets: pad_id, or torch's default -100 when there is no padding token."""
    return -100 if config.pad_id is None else config.pad_id


def _hidden_state_hooks(model, names):
    """Forward hooks that record the outputs of the named submodules."""
    recorded, handles = {}, []
    modules = dict(model.named_modules())
    for name in names:
        if name in modules:

            def hook(module, args, output, name=name):
                recorded[name] = output

            handles.append(modules[name].register_forward_hook(hook))
    return recorded, handles


def attention_maps(np_model) -> dict:
    """The NumPy model's attention probabilities by module name; none for a tiled (attention="flash") model,
    which never holds them (its hidden states, logits and gradients are still compared)."""
    return {} if np_model.config.attention == "flash" else np_model.attention_maps()


def compare_models(
    config,
    dtype,
    device: str,
    seed: int = 0,
    lm: bool = False,
    train: bool = False,
    scenario: str = "padding",
    batch: int = 2,
    src_len: int = 6,
    tgt_len: int = 5,
    label_smoothing: float = 0.1,
    ids: tuple | None = None,
) -> Result:
    """NumPy model vs torch_transformer model from one state dict.

    Objective: J = cross_entropy(logits, tgt_out, ignore pad, label smoothing) + sum(logits * R), R random,
    so the upstream gradient is random and never degenerate. Outputs compared: logits, loss, every
    hidden state the NumPy model exposes that torch has a module for (per layer), and the attention
    maps; gradients: every parameter by name. In training mode both sides drop the same units.
    `ids` = (src_ids, tgt_in, tgt_out) overrides the generated batch (src_ids unused by the LM).
    """
    import numpy_transformer as nt

    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    np_model = (nt.TransformerLM if lm else nt.Transformer)(config, seed=seed, dtype=dtype).train(train)
    torch_model = (tt.TransformerLM if lm else tt.Transformer)(config).to(device=device, dtype=TORCH_DTYPE[dtype])
    torch_model.train(train)
    torch_model.load_state_dict({k: torch.from_numpy(v) for k, v in np_model.state_dict().items()})

    if ids is None:
        ids = make_batch(config, rng, batch, src_len, tgt_len, scenario)
    src, tgt_in, tgt_out = ids  # src_ids (B, S), decoder inputs (B, T), targets (B, T)
    batch, tgt_len = tgt_in.shape
    np_inputs = (tgt_in,) if lm else (src, tgt_in)
    torch_inputs = tuple(torch.from_numpy(a).to(device) for a in np_inputs)
    R = (rng.standard_normal((batch, tgt_len, config.tgt_vocab_size)) / tgt_len).astype(dtype)

    # NumPy: forward, loss, backward by hand.
    logits = np_model.forward(*np_inputs)
    loss, ce_cache = nt.cross_entropy_forward(logits, tgt_out, ignore_index(config), label_smoothing)
    np_model.zero_grad()
    np_model.backward(nt.cross_entropy_backward(ce_cache) + R)
    np_acts = np_model.activations()
    np_maps = attention_maps(np_model)

    # torch: the fused fast path (or the explicit one, with shared dropout masks), autograd.
    masks = None
    if train and config.has_dropout:
        masks = {k: torch.from_numpy(v).to(device) for k, v in np_model.dropout_masks.items()}
    recorded, handles = _hidden_state_hooks(torch_model, [k for k in np_acts if k != "logits"])
    try:
        t_logits = torch_model(*torch_inputs, dropout_masks=masks)
    finally:
        for h in handles:
            h.remove()
    t_loss = tt.cross_entropy(t_logits, torch.from_numpy(tgt_out).to(device), ignore_index(config), label_smoothing)
    (t_loss + (t_logits * torch.from_numpy(R).to(device)).sum()).backward()
    with torch.no_grad():
        torch_model(*torch_inputs, dropout_masks=masks, need_weights=True)
    t_maps = torch_model.attention_maps()

    result = Result()  # outputs in the order the forward pass computes them
    for name in np_acts:
        if name in recorded:
            result.outputs[f"hidden {name}"] = (np_acts[name], to_numpy(recorded[name]))
    for name, probs in np_maps.items():
        result.outputs[f"attention {name}"] = (probs, to_numpy(t_maps[name]))
    result.outputs["logits"] = (logits, to_numpy(t_logits))
    result.outputs["loss"] = (loss, to_numpy(t_loss))
    t_params = dict(torch_model.named_parameters())
    for name, g in np_model.grads.items():
        result.grads[name] = (g, to_numpy(t_params[name].grad))
    return result


def make_encoder_batch(config, rng, batch: int = 2, length: int = 6, scenario: str = "padding"):
    """Random ids (B, T) for an EncoderModel, padded as make_batch pads sources, and token types
    (B, T): a first and a second segment, as BERT's sentence pairs (None when the model has no types)."""
    src, _, _ = make_batch(config, rng, batch, length, 1, scenario)
    token_types = None
    if config.type_vocab_size > 0:
        token_types = (np.arange(length) >= length // 2).astype(np.int64)[None].repeat(batch, axis=0)  # (B, T)
        token_types = np.minimum(token_types, config.type_vocab_size - 1)
        if config.type_vocab_size > 2:
            token_types[0] = rng.integers(0, config.type_vocab_size, size=length)
    return src, token_types


def compare_encoder_models(
    config,
    dtype,
    device: str,
    seed: int = 0,
    train: bool = False,
    scenario: str = "padding",
    batch: int = 2,
    length: int = 6,
    ids: tuple | None = None,
) -> Result:
    """NumPy EncoderModel vs torch_transformer EncoderModel from one state dict.

    Objective: J = sum(hidden * R), R random. Outputs compared: the embedding-to-last hidden states per
    layer, the attention maps and the final hidden states; gradients: every parameter by name. In
    training mode both sides drop the same units. `ids` = (ids, token_type_ids) overrides the batch.
    """
    import numpy_transformer as nt

    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    np_model = nt.EncoderModel(config, seed=seed, dtype=dtype).train(train)
    torch_model = tt.EncoderModel(config).to(device=device, dtype=TORCH_DTYPE[dtype]).train(train)
    torch_model.load_state_dict({k: torch.from_numpy(v) for k, v in np_model.state_dict().items()})

    src, token_types = ids if ids is not None else make_encoder_batch(config, rng, batch, length, scenario)
    R = rng.standard_normal((*src.shape, config.d_model)).astype(dtype)

    hidden = np_model.forward(src, token_types)  # (B, T, D)
    np_model.zero_grad()
    np_model.backward(R)
    np_acts, np_maps = np_model.activations(), attention_maps(np_model)

    t_src = torch.from_numpy(src).to(device)
    t_types = None if token_types is None else torch.from_numpy(token_types).to(device)
    masks = None
    if train and config.has_dropout:
        masks = {k: torch.from_numpy(v).to(device) for k, v in np_model.dropout_masks.items()}
    recorded, handles = _hidden_state_hooks(torch_model, [k for k in np_acts if k != "encoder"])
    try:
        t_hidden = torch_model(t_src, t_types, dropout_masks=masks)
    finally:
        for h in handles:
            h.remove()
    (t_hidden * torch.from_numpy(R).to(device)).sum().backward()
    with torch.no_grad():
        torch_model(t_src, t_types, dropout_masks=masks, need_weights=True)
    t_maps = torch_model.attention_maps()

    result = Result()
    for name in np_acts:
        if name in recorded:
            result.outputs[f"hidden {name}"] = (np_acts[name], to_numpy(recorded[name]))
    for name, probs in np_maps.items():
        result.outputs[f"attention {name}"] = (probs, to_numpy(t_maps[name]))
    result.outputs["hidden"] = (hidden, to_numpy(t_hidden))
    t_params = dict(torch_model.named_parameters())
    for name, g in np_model.grads.items():
        result.grads[name] = (g, to_numpy(t_params[name].grad))
    return result


def model_fd_error(
    config,
    lm: bool = False,
    seed: int = 0,
    scenario: str = "padding",
    train: bool = False,
    max_coords: int = 4,
    encoder: bool = False,
) -> float:
    """Worst finite-difference relative error over every parameter tensor of the float64 NumPy model
    (an EncoderModel when `encoder`; in training mode one set of dropout masks is drawn and replayed)."""
    import numpy_transformer as nt

    rng = np.random.default_rng(seed)
    if encoder:
        model = nt.EncoderModel(config, seed=seed).train(train)
        ids = make_encoder_batch(config, rng, scenario=scenario)
    else:
        model = (nt.TransformerLM if lm else nt.Transformer)(config, seed=seed).train(train)
        src, tgt_in, _ = make_batch(config, rng, scenario=scenario)
        ids = (tgt_in,) if lm else (src, tgt_in)
    return gradcheck.check_model(model, *ids, seed=seed, max_coords=max_coords).worst
