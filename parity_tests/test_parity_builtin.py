"""The NumPy reference against PyTorch's own built-in layers.

A DESIGN.md parameter dict is mapped onto nn.MultiheadAttention, nn.LayerNorm,
nn.TransformerEncoderLayer and nn.TransformerDecoderLayer (batch_first; q, k and v concatenated
into in_proj_weight; torch's masks use True = "masked out", the opposite of ours), and outputs
and every gradient must match. Agreement here shows that both of our implementations compute the
canonical model, not merely the same mistake.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.func import functional_call  # noqa: E402

from numpy_transformer import TransformerConfig  # noqa: E402
from numpy_transformer import attention as A  # noqa: E402
from numpy_transformer import model as M  # noqa: E402
from parity_tests import components as C  # noqa: E402

B, T, S, D, H, FF = 2, 5, 6, 8, 2, 12
DTYPES = [pytest.param(np.float64, id="float64"), pytest.param(np.float32, id="float32")]
TORCH_ACTIVATION = {"relu": "relu", "gelu": "gelu", "gelu_tanh": functools.partial(F.gelu, approximate="tanh")}


def random_params(shapes: dict, dtype, rng) -> dict:
    """Random weights (norms around 1, biases non-zero, so that every term of the math is exercised)."""
    params = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            value = 1 + 0.3 * rng.standard_normal(shape)
        elif name.endswith(".weight"):
            value = rng.standard_normal(shape) / math.sqrt(shape[-1])
        else:
            value = 0.3 * rng.standard_normal(shape)
        params[name] = value.astype(dtype)
    return params


def layer_shapes(config, cross: bool) -> dict:
    prefix = "decoder.layers.0." if cross else "encoder.layers.0."
    shapes = M.parameter_shapes(config)
    return {k[len(prefix) :]: v for k, v in shapes.items() if k.startswith(prefix)}


def in_proj(params: dict, prefix: str) -> dict:
    """Our q/k/v/out projections as nn.MultiheadAttention's parameters (differentiable: grads flow back)."""
    cat = torch.cat
    return {
        f"{prefix}in_proj_weight": cat([params[f"{prefix}{p}_proj.weight"] for p in "qkv"]),
        f"{prefix}in_proj_bias": cat([params[f"{prefix}{p}_proj.bias"] for p in "qkv"]),
        f"{prefix}out_proj.weight": params[f"{prefix}out_proj.weight"],
        f"{prefix}out_proj.bias": params[f"{prefix}out_proj.bias"],
    }


def builtin_layer_params(params: dict, cross: bool) -> dict:
    """DESIGN.md names -> nn.TransformerEncoderLayer / nn.TransformerDecoderLayer names."""
    mapped = in_proj(params, "self_attn.")
    norms = {"self_attn_norm": "norm1", "cross_attn_norm": "norm2", "ffn_norm": "norm3" if cross else "norm2"}
    for ours, theirs in norms.items():
        if ours == "cross_attn_norm" and not cross:
            continue
        mapped[f"{theirs}.weight"], mapped[f"{theirs}.bias"] = params[f"{ours}.weight"], params[f"{ours}.bias"]
    for w in ("weight", "bias"):
        mapped[f"linear1.{w}"], mapped[f"linear2.{w}"] = params[f"ffn.linear1.{w}"], params[f"ffn.linear2.{w}"]
    if cross:
        cross_params = in_proj(
            {k.replace("cross_attn.", "multihead_attn."): v for k, v in params.items()}, "multihead_attn."
        )
        mapped.update(cross_params)
    return mapped


def padding(length: int, valid: list[int]) -> np.ndarray:
    """(B, length) bool, True where a position holds a real token (the first valid[b] positions)."""
    return np.arange(length)[None, :] < np.array(valid)[:, None]


def assert_parity(result, dtype):
    problems = C.failures(result, dtype)
    assert not problems, "\n".join(problems)
    assert all(np.any(ours) for ours, _ in result.grads.values())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["self", "cross"])
def test_multi_head_attention_vs_nn_multihead_attention(kind, dtype, device):
    rng = np.random.default_rng(1)
    dtype = np.dtype(dtype)
    query = rng.standard_normal((B, T, D)).astype(dtype)
    memory = query if kind == "self" else rng.standard_normal((B, S, D)).astype(dtype)
    keys_valid = padding(memory.shape[1], [memory.shape[1], 3])  # the second sequence has padding
    mask = keys_valid[:, None, None, :]  # (B, 1, 1, T_k), True = may attend
    if kind == "self":
        mask = mask & np.tril(np.ones((T, T), dtype=bool))  # causal as well: (B, 1, T, T)
    shapes = {
        k: v
        for k, v in layer_shapes(TransformerConfig(d_model=D, n_heads=H), cross=False).items()
        if k.startswith("self_attn.")
    }
    params = {k[len("self_attn.") :]: v for k, v in random_params(shapes, dtype, rng).items()}
    module = nn.MultiheadAttention(D, H, batch_first=True)

    def torch_fn(params, query, key, value, n_heads, attn_mask):
        module.to(device=query.device, dtype=query.dtype)
        full = attn_mask.expand(B, H, query.shape[1], key.shape[1]).reshape(B * H, query.shape[1], key.shape[1])
        out, _ = functional_call(
            module, in_proj(params, ""), (query, key, value), {"attn_mask": ~full, "need_weights": False}
        )  # torch: True = masked out
        return out

    case = C.Case(
        A.multi_head_attention_forward,
        A.multi_head_attention_backward,
        dict(params=params, query=query, key=memory.copy(), value=memory.copy(), n_heads=H, attn_mask=mask),
        ["query", "key", "value", "params"],
        torch_fn,
    )
    result = C.run_case(case, device)
    problems = C.failures(result, dtype)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_vs_nn_layer_norm(dtype, device):
    case = C.make_case("layer_norm", dtype, seed=2)
    module = nn.LayerNorm(D, eps=case.args["eps"])

    def torch_fn(x, weight, bias, eps):
        module.to(device=x.device, dtype=x.dtype)
        return functional_call(module, {"weight": weight, "bias": bias}, (x,))

    case.torch_fn = torch_fn
    assert_parity(C.run_case(case, device), dtype)


LAYER_GRID = [
    pytest.param(False, "relu", id="post-norm-relu"),
    pytest.param(True, "relu", id="pre-norm-relu"),
    pytest.param(False, "gelu", id="post-norm-gelu"),
    pytest.param(True, "gelu", id="pre-norm-gelu"),
    pytest.param(True, "gelu_tanh", id="pre-norm-gelu_tanh"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_first, activation", LAYER_GRID)
def test_encoder_layer_vs_nn_transformer_encoder_layer(norm_first, activation, dtype, device):
    rng = np.random.default_rng(3)
    dtype = np.dtype(dtype)
    config = TransformerConfig(
        d_model=D, n_heads=H, d_ff=FF, activation=activation, norm_first=norm_first, layer_norm_eps=1e-5
    )
    params = random_params(layer_shapes(config, cross=False), dtype, rng)
    x = rng.standard_normal((B, T, D)).astype(dtype)
    valid = padding(T, [T, 3])
    module = nn.TransformerEncoderLayer(
        D,
        H,
        FF,
        dropout=0.0,
        activation=TORCH_ACTIVATION[activation],
        batch_first=True,
        norm_first=norm_first,
        layer_norm_eps=1e-5,
    )

    def torch_fn(params, x, mask, config):
        module.to(device=x.device, dtype=x.dtype)
        key_padding = ~mask[:, 0, 0, :]  # (B, T), True = padding
        return functional_call(
            module, builtin_layer_params(params, cross=False), (x,), {"src_key_padding_mask": key_padding}
        )

    case = C.Case(
        M.encoder_layer_forward,
        M.encoder_layer_backward,
        dict(params=params, x=x, mask=valid[:, None, None, :], config=config),
        ["x", "params"],
        torch_fn,
    )
    assert_parity(C.run_case(case, device), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_first, activation", LAYER_GRID)
def test_decoder_layer_vs_nn_transformer_decoder_layer(norm_first, activation, dtype, device):
    rng = np.random.default_rng(4)
    dtype = np.dtype(dtype)
    config = TransformerConfig(d_model=D, n_heads=H, d_ff=FF, activation=activation, norm_first=norm_first)
    params = random_params(layer_shapes(config, cross=True), dtype, rng)
    x = rng.standard_normal((B, T, D)).astype(dtype)
    memory = rng.standard_normal((B, S, D)).astype(dtype)
    tgt_valid, src_valid = padding(T, [T, 3]), padding(S, [4, S])
    self_mask = np.tril(np.ones((T, T), dtype=bool))[None, None] & tgt_valid[:, None, None, :]
    module = nn.TransformerDecoderLayer(
        D, H, FF, dropout=0.0, activation=TORCH_ACTIVATION[activation], batch_first=True, norm_first=norm_first
    )

    def torch_fn(params, x, memory, self_mask, memory_mask, config):
        module.to(device=x.device, dtype=x.dtype)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        return functional_call(
            module,
            builtin_layer_params(params, cross=True),
            (x, memory),
            {
                "tgt_mask": ~causal,
                "tgt_key_padding_mask": ~self_mask[:, 0, -1, :],
                "memory_key_padding_mask": ~memory_mask[:, 0, 0, :],
            },
        )

    case = C.Case(
        M.decoder_layer_forward,
        M.decoder_layer_backward,
        dict(
            params=params,
            x=x,
            memory=memory,
            self_mask=self_mask,
            memory_mask=src_valid[:, None, None, :],
            config=config,
        ),
        ["x", "memory", "params"],
        torch_fn,
    )
    assert_parity(C.run_case(case, device), dtype)


def test_builtin_mapping_catches_a_swapped_projection():
    """If q and k were swapped in the packing, the comparison must fail (the test has teeth)."""
    rng = np.random.default_rng(5)
    config = TransformerConfig(d_model=D, n_heads=H, d_ff=FF)
    params = random_params(layer_shapes(config, cross=False), np.float64, rng)
    swapped = dict(params)
    swapped["self_attn.q_proj.weight"], swapped["self_attn.k_proj.weight"] = (
        params["self_attn.k_proj.weight"],
        params["self_attn.q_proj.weight"],
    )
    x = rng.standard_normal((B, T, D))
    ours, _ = M.encoder_layer_forward(params, x, None, config)
    module = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True).double()
    theirs = functional_call(
        module,
        builtin_layer_params({k: torch.from_numpy(v) for k, v in swapped.items()}, cross=False),
        (torch.from_numpy(x),),
    )
    assert np.abs(ours - theirs.detach().numpy()).max() > 1e-3
