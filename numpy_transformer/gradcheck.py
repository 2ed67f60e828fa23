r"""Finite-difference gradient checks for any forward/backward pair or model.

The check: pick a random upstream gradient :math:`G` (never all ones: that makes the input gradients of
softmax and layer norm vanish), define the scalar :math:`f = \sum \mathrm{forward}(\dots) \odot G`, and
compare the analytic gradient from `backward(G)` with central differences, coordinate by coordinate:

.. math::

    \mathrm{fd} = \frac{f(x + h) - f(x - h)}{2h}, \qquad
    \mathrm{error} = \frac{|\mathrm{fd} - \mathrm{analytic}|}{\max(|\mathrm{fd}|, |\mathrm{analytic}|, 10^{-2})}

Use float64: in float32 the rounding error of f / h swamps the comparison.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass
class GradcheckResult:
    """Per-tensor worst relative error, how many coordinates were checked, and the largest |gradient|."""

    errors: dict  # name -> worst relative error over the checked coordinates
    checked: dict  # name -> number of coordinates checked
    max_abs_grad: dict  # name -> max |analytic gradient| over the whole tensor

    @property
    def worst(self) -> float:
        errors = list(self.errors.values())
        return math.nan if any(math.isnan(e) for e in errors) else max(errors, default=0.0)  # NaN is never a pass

    def __str__(self) -> str:
        width = max((len(k) for k in self.errors), default=4)
        lines = [f"{'tensor':<{width}}  {'coords':>6}  {'max|grad|':>10}  {'rel error':>10}"]
        for k, err in self.errors.items():
            lines.append(f"{k:<{width}}  {self.checked[k]:>6}  {self.max_abs_grad[k]:>10.3e}  {err:>10.2e}")
        return "\n".join(lines)


def gradcheck(
    fn, inputs: dict, grads: dict, *, eps: float = 1e-5, max_coords: int | None = 24, floor: float = 1e-2, seed: int = 0
) -> GradcheckResult:
    """Compare analytic gradients with central finite differences.

    - fn: a function of no arguments returning the scalar f, computed from the current contents of
      the arrays in `inputs` (which are perturbed in place and restored).
    - inputs: name -> float64 array; grads: name -> the analytic df/d(array), same shape.
    - max_coords: check at most this many coordinates of each tensor, chosen at random (None: all).
    """
    rng = np.random.default_rng(seed)
    errors, checked, max_abs = {}, {}, {}
    for name, x in inputs.items():
        if x.dtype != np.float64:
            raise TypeError(f"gradcheck: inputs[{name!r}] must be float64 for a meaningful check, got {x.dtype}")
        g = np.asarray(grads[name])
        if g.shape != x.shape:
            raise ValueError(f"gradcheck: grads[{name!r}] has shape {g.shape}, expected {x.shape}")
        flat = x.reshape(-1)  # a view: writing it perturbs x
        if not np.shares_memory(flat, x):
            raise ValueError(f"gradcheck: inputs[{name!r}] must be contiguous so it can be perturbed in place")
        coords = np.arange(flat.size)
        if max_coords is not None and flat.size > max_coords:
            coords = rng.choice(flat.size, size=max_coords, replace=False)
        worst = 0.0
        for i in coords:
            old = flat[i]
            flat[i] = old + eps
            f_plus = float(fn())
            flat[i] = old - eps
            f_minus = float(fn())
            flat[i] = old
            fd = (f_plus - f_minus) / (2 * eps)
            an = float(g.reshape(-1)[i])
            error = abs(fd - an) / max(abs(fd), abs(an), floor)
            worst = error if not error <= worst else worst  # a NaN (or inf) is kept: max(worst, nan) keeps worst
        errors[name], checked[name], max_abs[name] = worst, len(coords), float(np.abs(g).max(initial=0.0))
    return GradcheckResult(errors, checked, max_abs)


def _flatten(prefix: str, value, out: dict) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}", v, out)
    else:
        out[prefix] = value


def check_pair(forward, backward, args: dict, wrt: list, *, seed: int = 0, **options) -> GradcheckResult:
    """Finite-difference check of a forward/backward pair of this package.

    forward(**args) -> (out, cache); backward(dout, cache) -> the gradients of the arguments named
    in `wrt`, in that order (a single array when wrt has one name). An argument that is a dict of
    arrays (a composite's params) gets a dict of gradients; its entries are reported as "arg.key"::

        check_pair(layer_norm_forward, layer_norm_backward,
                   dict(x=x, weight=w, bias=b, eps=1e-5), wrt=["x", "weight", "bias"])
    """
    rng = np.random.default_rng(seed)
    out, cache = forward(**args)
    dout = rng.standard_normal(np.shape(out))
    if np.ndim(out) == 0:
        dout = float(dout)
    analytic = backward(dout, cache)
    if len(wrt) == 1:
        analytic = (analytic,)
    inputs: dict[str, np.ndarray] = {}  # name (a params dict's entries as "params.key") -> array
    grads: dict[str, np.ndarray] = {}
    for name, g in zip(wrt, analytic, strict=True):
        _flatten(name, args[name], inputs)
        _flatten(name, g, grads)

    def fn():
        return np.sum(forward(**args)[0] * dout)

    return gradcheck(fn, inputs, grads, seed=seed, **options)


def check_model(model, *ids, seed: int = 0, **options) -> GradcheckResult:
    """Finite-difference check of every parameter tensor of a float64 Transformer / TransformerLM / EncoderModel.

    `ids` are forward's arguments: (src_ids, tgt_ids), (ids) or (ids, token_type_ids). The model should be in eval mode,
    or in training mode with fixed dropout masks, so that repeated forwards agree.
    """
    rng = np.random.default_rng(seed)
    masks = None
    if model.training and model.config.has_dropout:
        model.forward(*ids)  # draw one set of dropout keep-masks ...
        masks = dict(model.dropout_masks)  # ... and replay it in every forward below

    def fn():
        return np.sum(model.forward(*ids, dropout_masks=masks) * dlogits)

    logits = model.forward(*ids, dropout_masks=masks)
    dlogits = rng.standard_normal(logits.shape)
    model.zero_grad()
    model.backward(dlogits)
    grads = {k: g.copy() for k, g in model.grads.items()}
    return gradcheck(fn, model.params, grads, seed=seed, **options)
