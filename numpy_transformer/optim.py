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

`state_dict()` / `load_state_dict()` are spelled as torch.optim spells them: `state` maps a parameter's
index (its place in the params dict) to its buffers ("step", "exp_avg", "exp_avg_sq" for Adam and AdamW;
"momentum_buffer" for SGD), `param_groups` is one group of hyper-parameters with "params": [0, 1, ...]. So a
torch optimizer's state (tensors on the CPU, or arrays) loads here, and this one's loads into torch once its
arrays are tensors (torch.from_numpy); the next step is then the same on both sides.
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

    # -- state dicts, as torch.optim spells them ------------------------------------------------

    def hyperparameters(self) -> dict:
        """The parameter group's settings, torch's names and defaults for what this optimizer does not do."""
        return {"lr": self.lr}

    def load_hyperparameters(self, group: dict) -> None:
        """Check a loaded group's settings (ValueError for one this optimizer cannot follow); set nothing."""

    def set_hyperparameters(self, group: dict) -> None:
        self.lr = float(group["lr"])

    def state_entry(self, entry: dict) -> dict:
        """One parameter's state as torch holds it (Adam adds its step)."""
        return entry

    def state_dict(self) -> dict:
        """{"state": {index: {buffer name: array copy}}, "param_groups": [{settings..., "params": [0, 1, ...]}]}.
        A parameter has state once a step has run (before it, "state" is empty, as in torch)."""
        state = {
            i: self.state_entry({k: v.copy() for k, v in self.state[name].items()})
            for i, name in enumerate(self.params)
            if self.state[name]
        }
        return {"state": state, "param_groups": [{**self.hyperparameters(), "params": list(range(len(self.params)))}]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a state_dict() of this class, this side's or torch.optim's (its tensors on the CPU): the group's
        settings (the learning rate included) and every parameter's buffers, cast to the parameter's dtype.
        Everything is checked first (ValueError naming what is wrong); when it raises, nothing has changed."""
        if not isinstance(state_dict, dict) or not {"state", "param_groups"} <= state_dict.keys():
            got = list(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__
            raise ValueError(f"state_dict must be an optimizer's state_dict() ('state', 'param_groups'), got {got}")
        groups, loaded = state_dict["param_groups"], state_dict["state"]
        if not isinstance(groups, (list, tuple)) or len(groups) != 1 or not isinstance(groups[0], dict):
            raise ValueError(f"state_dict['param_groups'] must hold one group, got {groups!r:.200}")
        group = groups[0]
        indices = list(group.get("params", []))
        if len(indices) != len(self.params):
            raise ValueError(
                f"state_dict's parameter group holds {len(indices)} parameters, this optimizer {len(self.params)}"
            )
        self.load_hyperparameters(group)
        if not isinstance(loaded, dict) or any(i not in indices for i in loaded):
            raise ValueError(f"state_dict['state'] must map the group's parameter indices {indices[:10]}... to buffers")
        expected = set(self.state_entry(self.init_state(np.zeros(1))))
        state: dict = {}
        steps: set[float] = set()
        for index, (name, p) in zip(indices, self.params.items(), strict=True):
            state[name] = self._buffers(f"state of parameter {index} ({name!r})", loaded.get(index), p, expected, steps)
        empty = [name for name, buffers in state.items() if not buffers]
        if expected and empty and len(empty) < len(state):
            raise ValueError(f"state_dict has no state for parameters {empty[:10]} but has it for others")
        if len(steps) > 1:
            raise ValueError(
                f"state_dict's parameters are at different steps {sorted(steps)}; here one step serves all"
            )
        step = int(steps.pop()) if steps else (1 if len(empty) < len(state) else 0)  # SGD's buffers exist from step 1
        self.set_hyperparameters(group)
        self.state, self.step_count = state, step

    @staticmethod
    def _buffers(where: str, entry: dict | None, p: np.ndarray, expected: set, steps: set) -> dict:
        """One parameter's loaded state, checked and copied (cast to p's dtype); its step goes into `steps`."""
        if not entry:
            return {}
        if set(entry) != expected:
            raise ValueError(f"{where} holds {sorted(entry)}, expected {sorted(expected)}")
        buffers = {}
        for key, value in entry.items():
            array = np.asarray(value)
            if key == "step":
                steps.add(float(array))
            elif array.shape != p.shape or not np.issubdtype(array.dtype, np.floating):
                raise ValueError(f"{where}: {key} is {array.dtype} {array.shape}, expected floating {p.shape}")
            else:
                buffers[key] = np.array(array, dtype=p.dtype, order="C")  # a copy, cast to the parameter's dtype
        return buffers


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

    def hyperparameters(self) -> dict:
        return {
            "lr": self.lr, "momentum": self.momentum, "dampening": self.dampening, "weight_decay": self.weight_decay,
            "nesterov": self.nesterov, "maximize": False, "foreach": None, "differentiable": False, "fused": None,
        }  # fmt: skip

    def load_hyperparameters(self, group: dict) -> None:
        check_group(group, ("lr", "momentum", "dampening", "weight_decay", "nesterov"), {"maximize": False}, "SGD")
        if bool(group["momentum"]) != bool(self.momentum):
            raise ValueError(
                f"state_dict's group has momentum {group['momentum']}, this SGD {self.momentum}: "
                "with and without momentum the state differs (momentum_buffer)"
            )

    def set_hyperparameters(self, group: dict) -> None:
        self.lr, self.momentum, self.dampening = float(group["lr"]), float(group["momentum"]), float(group["dampening"])
        self.weight_decay, self.nesterov = float(group["weight_decay"]), bool(group["nesterov"])

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

    def state_entry(self, entry: dict) -> dict:
        # torch keeps the step per parameter, a float32 scalar tensor; here one count serves every parameter
        return {"step": np.array(float(self.step_count), dtype=np.float32), **entry}

    def hyperparameters(self) -> dict:
        return {
            "lr": self.lr, "betas": (self.beta1, self.beta2), "eps": self.eps, "weight_decay": self.weight_decay,
            "amsgrad": False, "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
            "fused": None, "decoupled_weight_decay": self.decoupled,
        }  # fmt: skip

    def load_hyperparameters(self, group: dict) -> None:
        name = type(self).__name__
        check_group(group, ("lr", "betas", "eps", "weight_decay"), {"amsgrad": False, "maximize": False}, name)
        decoupled = group.get("decoupled_weight_decay", self.decoupled)
        if bool(decoupled) != self.decoupled:
            raise ValueError(
                f"state_dict is {'AdamW' if decoupled else 'Adam'}'s (decoupled_weight_decay {decoupled}), "
                f"this optimizer is {name}"
            )
        betas = group["betas"]
        if not (isinstance(betas, (list, tuple)) and len(betas) == 2 and all(0.0 <= float(b) < 1.0 for b in betas)):
            raise ValueError(f"state_dict's group has betas {betas!r}, expected two numbers in [0, 1)")

    def set_hyperparameters(self, group: dict) -> None:
        self.lr, self.eps, self.weight_decay = float(group["lr"]), float(group["eps"]), float(group["weight_decay"])
        self.beta1, self.beta2 = float(group["betas"][0]), float(group["betas"][1])

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


def check_group(group: dict, required: tuple, unsupported: dict, name: str) -> None:
    """ValueError unless a loaded parameter group has every `required` setting and none of the `unsupported`
    ones switched on (torch options these optimizers do not implement, such as amsgrad)."""
    missing = [k for k in required if k not in group]
    if missing:
        raise ValueError(f"state_dict's parameter group lacks {missing}, settings of {name}")
    for key, default in unsupported.items():
        if group.get(key, default) != default:
            raise ValueError(
                f"state_dict's group has {key}={group[key]!r}; {name} here supports only {key}={default!r}"
            )
    bad = [k for k in required if k != "betas" and not isinstance(group[k], (bool, int, float, np.floating))]
    if bad:
        raise ValueError(f"state_dict's group has non-numeric settings {[(k, group[k]) for k in bad]}")


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

    def state_dict(self) -> dict:
        """The schedule's position, in torch's LambdaLR names ("last_epoch": steps taken)."""
        return {"base_lrs": [self.base_lr], "last_epoch": self.last_step}

    def load_state_dict(self, state_dict: dict) -> None:
        """Continue from a state_dict() (this side's or torch's LambdaLR's): the optimizer's rate becomes
        base_lr * fn(last_epoch), the rate the schedule had set there."""
        base_lrs, last = state_dict.get("base_lrs"), state_dict.get("last_epoch")
        if not (isinstance(base_lrs, (list, tuple)) and len(base_lrs) == 1):
            raise ValueError(f"state_dict['base_lrs'] must be a list of one rate, got {base_lrs!r}")
        if isinstance(last, bool) or not isinstance(last, int) or last < 0:
            raise ValueError(f"state_dict['last_epoch'] must be an int >= 0, got {last!r}")
        self.base_lr, self.last_step = float(base_lrs[0]), last
        self.optimizer.lr = self.base_lr * self.fn(last)


class NoamLR(LambdaLR):
    """The paper's schedule as a LambdaLR: the k-th optimizer step (k = 1, 2, ...) uses noam_rate(k).

    Build the optimizer with lr=1.0 (the schedule gives the whole rate) and call step() after each
    optimizer step, as with torch's schedulers.
    """

    def __init__(self, optimizer: Optimizer, d_model: int, warmup: int = 4000, factor: float = 1.0):
        super().__init__(optimizer, lambda n: noam_rate(n + 1, d_model, warmup, factor))
