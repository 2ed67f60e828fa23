"""The NumPy reference against PyTorch's own built-in layers (see parity_tests/builtin.py):
outputs and every input and parameter gradient, float64 and float32, every device."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn  # noqa: E402
from torch.func import functional_call  # noqa: E402

from numpy_transformer import TransformerConfig  # noqa: E402
from numpy_transformer import model as M  # noqa: E402
from parity_tests import builtin as BI  # noqa: E402
from parity_tests import components as C  # noqa: E402

DTYPES = [pytest.param(np.float64, id="float64"), pytest.param(np.float32, id="float32")]
LAYER_GRID = [
    pytest.param(False, "relu", id="post-norm-relu"),
    pytest.param(True, "relu", id="pre-norm-relu"),
    pytest.param(False, "gelu", id="post-norm-gelu"),
    pytest.param(True, "gelu", id="pre-norm-gelu"),
    pytest.param(True, "gelu_tanh", id="pre-norm-gelu_tanh"),
]


def assert_parity(case, dtype, device):
    problems = C.failures(C.run_case(case, device), dtype)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["self", "cross"])
def test_multi_head_attention_vs_nn_multihead_attention(kind, dtype, device):
    case = BI.case_nn_multihead_attention(np.dtype(dtype), np.random.default_rng(1), kind)
    assert_parity(case, dtype, device)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_vs_nn_layer_norm(dtype, device):
    assert_parity(BI.case_nn_layer_norm(np.dtype(dtype), np.random.default_rng(2)), dtype, device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_first, activation", LAYER_GRID)
def test_encoder_layer_vs_nn_transformer_encoder_layer(norm_first, activation, dtype, device):
    case = BI.case_nn_encoder_layer(np.dtype(dtype), np.random.default_rng(3), norm_first, activation)
    assert_parity(case, dtype, device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_first, activation", LAYER_GRID)
def test_decoder_layer_vs_nn_transformer_decoder_layer(norm_first, activation, dtype, device):
    case = BI.case_nn_decoder_layer(np.dtype(dtype), np.random.default_rng(4), norm_first, activation)
    assert_parity(case, dtype, device)


def test_builtin_mapping_catches_a_swapped_projection():
    """If q and k were swapped in the packing, the comparison must fail (the test has teeth)."""
    rng = np.random.default_rng(5)
    config = TransformerConfig(d_model=BI.D, n_heads=BI.H, d_ff=BI.FF)
    params = BI.random_params(BI.layer_shapes(config, cross=False), np.float64, rng)
    swapped = dict(params)
    swapped["self_attn.q_proj.weight"], swapped["self_attn.k_proj.weight"] = (
        params["self_attn.k_proj.weight"],
        params["self_attn.q_proj.weight"],
    )
    x = rng.standard_normal((BI.B, BI.T, BI.D))
    ours, _ = M.encoder_layer_forward(params, x, config)
    module = nn.TransformerEncoderLayer(BI.D, BI.H, BI.FF, dropout=0.0, batch_first=True).double()
    tensors = {k: torch.from_numpy(v) for k, v in swapped.items()}
    theirs = functional_call(module, BI.builtin_layer_params(tensors, cross=False), (torch.from_numpy(x),))
    assert np.abs(ours - theirs.detach().numpy()).max() > 1e-3
