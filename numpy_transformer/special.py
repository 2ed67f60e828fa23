r"""The error function, within one unit in the last place in float32 and fast: the one special function the reference
computes itself.

.. math::

    \operatorname{erf}(x) = \frac{2}{\sqrt\pi} \int_0^x e^{-t^2}\, dt

The exact GELU, :math:`x\,\Phi(x)` with :math:`\Phi(x) = \tfrac12\big(1 + \operatorname{erf}(x/\sqrt2)\big)`, needs
it for every hidden unit of the feed-forward sublayer. SciPy's ``erf`` evaluates it one element at a time in
float64. For float32 arrays this module evaluates it a cache-sized piece at a time, in two forms:

.. math::

    \operatorname{erf}(x) \approx x + x\, R(x^2) \quad (|x| \le 0.8,\ \text{in float32})

    \operatorname{erf}(x) \approx x\, \frac{P(x^2)}{Q(x^2)} \quad (0.8 < |x| \le 3.94,\ \text{in float64})

    \operatorname{erf}(x) = \pm 1 \text{ beyond},

with :math:`R` of degree 6 and :math:`P`, :math:`Q` of degree 5 (fits of ours: weighted minimax). Below 0.8 the
last operation adds :math:`x R` to the exact :math:`x`, and :math:`|x R| \le 0.13\, |\operatorname{erf}(x)|`, so
the float32 roundings inside :math:`R` reach the result damped; the error is that last rounding (half a unit in the
last place) and a third of a unit more at most. Beyond 0.8 the rational function runs in float64 (relative error
below :math:`2 \times 10^{-8}`, a third of a float32 unit) and is rounded to float32 once. Checked on every float32
in :math:`[0, 3.94]` (1.08 billion inputs): at most 0.863 units in the last place from the true value (the largest
near :math:`|x| = 0.79`), and 5.8% of them are the neighbour of the float32 rounding of the true value
(parity_tests/test_special.py checks every 64th, and agreement with SciPy's float32 ``erf``, which rounds a float64
result, to one unit). Beyond 3.94 the float32 rounding of the true value is exactly :math:`\pm 1` (it is from
:math:`|x| = 3.9192` on). Every other dtype goes to SciPy.

Speed, measured on one core of an AMD EPYC (AVX2), CPU time, on :math:`x \sim N(0, \tfrac12)` (the GELU's
:math:`x / \sqrt 2` of a unit normal): 6.0 ns an element, against 8.3 for the float64 rational function of degree 7
that this replaced (0.5 units in the last place) and about 10 for SciPy's. NumPy pays a Python call and a pass
over memory per arithmetic operation; torch's one fused, vectorised loop per element is what NumPy cannot match.
"""

from __future__ import annotations

import numpy as np
from scipy import special as scipy_special

# x P(x^2) / Q(x^2) for 0.8 < |x| <= 3.94, in float64: coefficients of x^0, x^2, ..., x^10 (P[0] is 2 / sqrt(pi), up
# to the fit's 2e-8)
ERF_P = (
    1.1283791446058078, 0.19116272766403422, 0.05283213542221438, 0.003793669568187909,
    0.0002847377761204667, 2.0338886004556134e-06,
)  # fmt: skip
ERF_Q = (
    1.0, 0.502746254908458, 0.11440663885280766, 0.015025818867210291,
    0.0011679077374760682, 3.79168982775277e-05,
)  # fmt: skip
# x + x R(x^2) for |x| <= 0.8, in float32: R(z) = erf(sqrt z) / sqrt z - 1, coefficients of z^0, ..., z^6 (a fit of
# ours, weighted minimax on the error of x R relative to erf(x): 6e-11)
ERF_R = (
    0.12837916702866564, -0.376126378962886, 0.1128376672570916, -0.0268638374937928,
    0.005213504871122827, -0.0008304048671147896, 9.152899862743293e-05,
)  # fmt: skip
ERF_FLOAT32_BELOW = 0.8
ERF_CLIP = 3.94  # erf(3.94) = 1 - 2.8e-8: 1.0 in float32, as everything beyond
PIECE = 1 << 16  # elements evaluated together: 256 KiB of float32, the passes over a piece in L2, few Python calls


def erf(x: np.ndarray) -> np.ndarray:
    """erf(x), element-wise, the dtype of x. Float32: x + x R(x^2) in float32 up to |x| = 0.8, x P(x^2) / Q(x^2) in
    float64 beyond, rounded to float32 (see the module's docstring); NaN stays NaN. Any other dtype:
    scipy.special.erf."""
    x = np.asarray(x)
    if x.dtype != np.float32:
        return scipy_special.erf(x)
    flat_x = np.ascontiguousarray(x).reshape(-1)
    out = np.empty_like(flat_x)
    for start in range(0, flat_x.size, PIECE):
        piece = slice(start, start + PIECE)
        _erf_float32(flat_x[piece], out[piece])
    return out.reshape(x.shape)


def _erf_float32(x: np.ndarray, out: np.ndarray) -> None:
    """erf of a float32 piece into `out`: x + x R(x^2) in float32 everywhere, then the float64 rational function
    where |x| > 0.8 (and for +-inf)."""
    with np.errstate(over="ignore"):  # a large |x| overflows here to +-inf; its value comes from below
        z = x * x
        r = horner(ERF_R, z)  # float32: the coefficients are Python floats
        r *= x
        np.add(x, r, out=out)  # the last rounding: x is exact and |x R| <= 0.13 |erf(x)|
    far = np.flatnonzero(z > ERF_FLOAT32_BELOW * ERF_FLOAT32_BELOW)  # NaN compares False: x + x R is NaN
    if far.size:
        out[far] = _erf_float64(x[far])


def _erf_float64(x: np.ndarray) -> np.ndarray:
    """x P(x^2) / Q(x^2) of a float32 piece, in float64 (Horner's rule: every coefficient is positive, so no
    term cancels another)."""
    xc = np.clip(x, -ERF_CLIP, ERF_CLIP, dtype=np.float64)  # NaN stays NaN
    z = xc * xc
    p = horner(ERF_P, z)
    p *= xc
    p /= horner(ERF_Q, z)
    return p


def horner(coefficients: tuple, z: np.ndarray) -> np.ndarray:
    """c0 + z (c1 + z (c2 + ...)), in place on one new array of z's dtype (the coefficients are Python floats)."""
    total = z * coefficients[-1]
    for c in coefficients[-2:0:-1]:
        total += c
        total *= z
    total += coefficients[0]
    return total
