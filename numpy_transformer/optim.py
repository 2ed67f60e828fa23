r"""Optimizers, gradient clipping and the paper's learning-rate schedule, in NumPy.

Each one has the hyper-parameters and the arithmetic of its torch counterpart (torch.optim.SGD,
Adam, AdamW, torch.nn.utils.clip_grad_norm_, torch.optim.lr_scheduler.LambdaLR), so that a NumPy
model and a torch model trained side by side from one state dict stay equal step for step::

    opt = Adam(model.params, lr=1e-3)
    model.zero_grad(); model.backward(dlogits)
    clip_grad_norm(model.grads, max_norm=1.0)
    opt.step(model.grads)                      # updates model.params in place

Parameters and gradients are dicts name -> array; the optimizer keeps its state per name.
Hyper-parameters are Python floats, so float32 parameters stay float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .parallel import map_chunks

# How a step is run. The update of one element depends only on that element, so each tensor is cut
# into chunks (parallel.map_chunks): all ~12 array passes of an update then run on data that stays in the
# core's caches instead of streaming the whole tensor from memory 12 times, and the chunks go to a thread
# per core (NumPy releases the GIL inside its array loops; BLAS is idle here). `update` applied to whole
# tensors is the plain rule, and gives the same bits (parity_tests/test_parallel.py).


class Optimizer:
    """Holds the parameter dict (updated in place), the learning rate and per-parameter state.

    Subclasses define `init_state(p) -> dict of arrays shaped like p` and `update(p, g, state)`, the
    element-wise rule, which `step` applies to every tensor, chunk by chunk.
    """

    def __init__(self, params: dict, lr: float):
        if not isinstance(params, dict) or not params:
            raise TypeError(f"params must be a non-empty dict of name -> array, got {type(params).__name__}")
        if not lr >= 0.0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        self.params = params
        self.lr = float(lr)
        self.state: dict = {name: {} for name in params}
        self.step_count = 0

    def step(self, grads: dict) -> None:
        missing = [k for k in self.params if k not in grads]
        if missing:
            raise ValueError(f"grads is missing entries for {missing}")
        self.step_count += 1
        for name, p in self.params.items():
            if not self.state[name]:
                if not p.flags.c_contiguous:
                    raise ValueError(f"params[{name!r}] must be a C-contiguous array (it is updated in place)")
                self.state[name] = self.init_state(p)
        keys = tuple(self.state[next(iter(self.params))])  # every tensor's state has the same names
        groups = [  # flat views (p is contiguous): writing them updates the parameter and its state
            (p.reshape(-1), grads[name].reshape(-1), *(self.state[name][k].reshape(-1) for k in keys))
            for name, p in self.params.items()
        ]
        map_chunks(lambda p, g, *state: self.update(p, g, dict(zip(keys, state, strict=True))), groups)

    def init_state(self, p: np.ndarray) -> dict:
        return {}

    def update(self, p: np.ndarray, g: np.ndarray, state: dict) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class SGD(Optimizer):
    r"""Stochastic gradient descent with momentum (`torch.optim.SGD`). With :math:`\lambda` the weight decay,
    :math:`\mu` the momentum, :math:`\tau` the dampening and :math:`\eta` the learning rate:

    .. math::

        g &= \nabla + \lambda p \\
        b &= g \text{ (first step)}, \qquad b = \mu b + (1 - \tau)\, g \text{ (after)} \\
        g &= g + \mu b \text{ (Nesterov)} \quad\text{or}\quad g = b \\
        p &= p - \eta\, g
    """

    def __init__(
        self,
        params: dict,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ):
        super().__init__(params, lr)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("nesterov momentum requires momentum > 0 and dampening = 0")
        self.momentum, self.dampening = float(momentum), float(dampening)
        self.weight_decay, self.nesterov = float(weight_decay), nesterov

    def init_state(self, p: np.ndarray) -> dict:
        return {"momentum_buffer": np.zeros_like(p)} if self.momentum else {}

    def update(self, p: np.ndarray, g: np.ndarray, state: dict) -> None:
        if self.weight_decay:
            g = g + self.weight_decay * p
        if self.momentum:
            buf = state["momentum_buffer"]
            if self.step_count == 1:
                buf[...] = g
            else:
                buf *= self.momentum
                buf += (1.0 - self.dampening) * g
            g = g + self.momentum * buf if self.nesterov else buf
        p -= self.lr * g


class Adam(Optimizer):
    r"""Adam (`torch.optim.Adam`, Kingma & Ba), with L2 weight decay :math:`\lambda` added to the gradient;
    at step :math:`t`:

    .. math::

        g &= \nabla + \lambda p \\
        m &= \beta_1 m + (1 - \beta_1)\, g, \qquad v = \beta_2 v + (1 - \beta_2)\, g^2 \\
        p &= p - \frac{\eta}{1 - \beta_1^t}\, \frac{m}{\sqrt{v} / \sqrt{1 - \beta_2^t} + \varepsilon}
    """

    decoupled = False

    def __init__(
        self, params: dict, lr: float = 1e-3, betas: tuple = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0
    ):
        super().__init__(params, lr)
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        self.beta1, self.beta2 = float(betas[0]), float(betas[1])
        self.eps, self.weight_decay = float(eps), float(weight_decay)

    def init_state(self, p: np.ndarray) -> dict:
        return {"exp_avg": np.zeros_like(p), "exp_avg_sq": np.zeros_like(p)}

    def update(self, p: np.ndarray, g: np.ndarray, state: dict) -> None:
        if self.weight_decay and self.decoupled:
            p *= 1.0 - self.lr * self.weight_decay  # AdamW: decay the weights, not the gradient
        elif self.weight_decay:
            g = g + self.weight_decay * p
        m, v = state["exp_avg"], state["exp_avg_sq"]
        tmp = np.empty_like(p)  # one chunk: cheap, and in cache
        m *= self.beta1
        np.multiply(g, 1.0 - self.beta1, out=tmp)
        m += tmp  # m = beta1 m + (1 - beta1) g
        v *= self.beta2
        np.multiply(g, g, out=tmp)
        tmp *= 1.0 - self.beta2
        v += tmp  # v = beta2 v + (1 - beta2) g^2
        t = self.step_count
        step_size = self.lr / (1.0 - self.beta1**t)
        np.sqrt(v, out=tmp)
        tmp *= 1.0 / math.sqrt(1.0 - self.beta2**t)
        tmp += self.eps  # denominator: sqrt(v) / sqrt(1 - beta2^t) + eps
        np.divide(m, tmp, out=tmp)
        tmp *= step_size
        p -= tmp


class AdamW(Adam):
    r"""AdamW (`torch.optim.AdamW`, Loshchilov & Hutter): :math:`p \leftarrow p\,(1 - \eta \lambda)`, then Adam."""

    decoupled = True

    def __init__(
        self, params: dict, lr: float = 1e-3, betas: tuple = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2
    ):
        super().__init__(params, lr, betas, eps, weight_decay)


def clip_grad_norm(grads: dict, max_norm: float, eps: float = 1e-6) -> float:
    r"""Scale all gradients together so that their global L2 norm is at most `max_norm`, in place
    (`torch.nn.utils.clip_grad_norm_`), each parameter's gradient :math:`dW`:

    .. math::

        \mathrm{total} = \sqrt{\textstyle\sum_{\text{tensors}} \lVert dW \rVert^2}, \qquad
        dW \leftarrow dW \cdot \min\!\Big(1, \frac{\mathrm{max\_norm}}{\mathrm{total} + 10^{-6}}\Big)

    Returns the total norm before clipping.
    """
    total = math.sqrt(sum(float(np.vdot(g, g)) for g in grads.values()))
    coef = max_norm / (total + eps)
    if coef < 1.0:
        for g in grads.values():
            g *= coef
    return total


def noam_rate(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    r"""The paper's schedule (section 5.3), with :math:`n_w` the warm-up steps:

    .. math::

        \eta(n) = \mathrm{factor} \cdot d_{model}^{-1/2} \cdot \min\big(n^{-1/2},\; n\, n_w^{-3/2}\big)

    Linear warm-up for `warmup` steps, then decay with the inverse square root of the step; step >= 1.
    """
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


class LambdaLR:
    """`lr = base_lr * fn(n)` after n calls of `step()` (`torch.optim.lr_scheduler.LambdaLR`)."""

    def __init__(self, optimizer: Optimizer, fn: Callable[[int], float]) -> None:
        self.optimizer, self.fn = optimizer, fn
        self.base_lr = optimizer.lr
        self.last_step = 0
        optimizer.lr = self.base_lr * fn(0)

    def step(self) -> None:
        self.last_step += 1
        self.optimizer.lr = self.base_lr * self.fn(self.last_step)


class NoamLR(LambdaLR):
    """The paper's schedule as a LambdaLR: the k-th optimizer step (k = 1, 2, ...) uses noam_rate(k).

    Build the optimizer with lr=1.0 (the schedule gives the whole rate) and call step() after each
    optimizer step, as with torch's schedulers.
    """

    def __init__(self, optimizer: Optimizer, d_model: int, warmup: int = 4000, factor: float = 1.0):
        super().__init__(optimizer, lambda n: noam_rate(n + 1, d_model, warmup, factor))
