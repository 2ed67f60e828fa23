"""numpy_transformer.special.erf: in float32 it must be within one unit in the last place of the true erf (measured
on every float32: at most 0.863, and the float32 rounding of the true value for 94% of inputs); in float64 it is
SciPy's erf itself. The reference is SciPy's float64 erf (relative error ~1e-16)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special as scipy_special

from numpy_transformer import layers, special

ONE_ULP_OF_ONE = float(np.spacing(np.float32(1.0)))
MAX_ULPS = 0.9  # the bar: at most one unit in the last place; measured on every float32 in [0, 3.94]: 0.863


def float32_grid(lo: float, hi: float, every: int) -> np.ndarray:
    """Every `every`-th float32 from lo to hi (both >= 0), by bit pattern: the same density of tested points
    in every binade, tiny and large alike."""
    bits = np.arange(np.float32(lo).view(np.int32), np.float32(hi).view(np.int32) + 1, every, dtype=np.int32)
    return bits.view(np.float32)


def ulps_off(ours: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(|ours - erf(x)| in units of the last place of the float32 rounding of erf(x), that rounding)."""
    exact = scipy_special.erf(x.astype(np.float64))
    rounded = exact.astype(np.float32)
    ulp = np.spacing(np.abs(rounded)).astype(np.float64)
    return np.abs(ours.astype(np.float64) - exact) / ulp, rounded


def test_float32_is_the_rounding_of_the_true_erf():
    x = float32_grid(0.0, special.ERF_CLIP, 64)  # 16.9 million points, every binade from the subnormals up
    ours = special.erf(x)
    assert ours.dtype == np.float32
    off, rounded = ulps_off(ours, x)
    assert off.max() <= MAX_ULPS, off.max()  # measured on every float32 in the range: 0.863
    misrounded = np.count_nonzero(ours != rounded)
    assert misrounded <= 0.07 * x.size, misrounded  # measured on every float32: 5.8%
    np.testing.assert_array_equal(special.erf(-x), -ours)  # odd, to the bit


@pytest.mark.parametrize("scale", [0.01, 1.0, 3.0])
def test_float32_matches_scipys_float32_erf(scale):
    """SciPy's float32 erf rounds its float64 result: ours is that number or its neighbour."""
    x = (np.random.default_rng(0).standard_normal(1_000_000) * scale).astype(np.float32)
    ours, scipys = special.erf(x), scipy_special.erf(x)
    assert scipys.dtype == np.float32
    assert np.count_nonzero(ours != scipys) <= 0.2 * x.size  # measured: 11% at scale 1
    assert (np.abs(ours - scipys) <= np.spacing(np.abs(scipys))).all()


def test_float32_beyond_the_fit_and_special_values():
    x = np.concatenate([float32_grid(3.9193, 10.0, 997), np.float32([1e30, 3.4e38, np.inf])])
    exact = scipy_special.erf(x.astype(np.float64)).astype(np.float32)
    assert (exact == 1.0).all()  # the premise: float32 rounds erf to 1 from 3.9192 on
    np.testing.assert_array_equal(special.erf(x), 1.0)
    np.testing.assert_array_equal(special.erf(-x), -1.0)
    edge = np.float32([np.nan, 0.0, -0.0, 1e-45, -1e-45, 1e-30])
    out = special.erf(edge)
    assert np.isnan(out[0]) and not np.isnan(out[1:]).any()
    np.testing.assert_array_equal(np.signbit(out[1:3]), [False, True])  # erf(-0) = -0
    off, _ = ulps_off(out[3:], edge[3:])  # subnormal and tiny: within the bar too
    assert off.max() <= MAX_ULPS, off


def test_shapes_layouts_and_other_dtypes():
    rng = np.random.default_rng(1)
    block = rng.standard_normal((3, special.PIECE + 5, 2)).astype(np.float32)  # several pieces, a partial one
    for x in (block, block.transpose(2, 0, 1), block[:, ::3], np.array(0.5, dtype=np.float32), block[:0]):
        ours = special.erf(x)
        assert ours.shape == x.shape and ours.dtype == np.float32
        off, _ = ulps_off(ours, x)
        assert off.size == 0 or off.max() <= MAX_ULPS
    x64 = rng.standard_normal(1000) * 3
    np.testing.assert_array_equal(special.erf(x64), scipy_special.erf(x64))  # float64: SciPy's, bit for bit
    assert special.erf(np.float16([0.5])).dtype == scipy_special.erf(np.float16([0.5])).dtype


def test_exact_gelu_uses_it_and_stays_exact():
    """The reference's float32 GELU: within a float32 rounding or two of the float64 GELU, element by element."""
    x = (np.random.default_rng(2).standard_normal(200_000) * 3).astype(np.float32)
    out, cache = layers.gelu_forward(x)
    cdf = cache.cdf
    x64 = x.astype(np.float64)
    exact_cdf = 0.5 * (1.0 + scipy_special.erf(x64 / np.sqrt(2.0)))
    np.testing.assert_allclose(cdf, exact_cdf, rtol=0, atol=2 * ONE_ULP_OF_ONE)
    # Phi's error, two units of one at most, times x; and the product's own rounding
    bound = 4 * ONE_ULP_OF_ONE * np.abs(x64 * exact_cdf) + 2 * ONE_ULP_OF_ONE * np.abs(x64)
    assert (np.abs(out - x64 * exact_cdf) <= bound).all()
