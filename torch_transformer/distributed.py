"""Data parallelism with torch.distributed: one process per device, launched by torchrun.

    torchrun --nproc-per-node 2 examples/train_numbers.py --backend torch                 # CPU, gloo
    torchrun --nproc-per-node 8 examples/train_numbers.py --backend torch --device cuda   # GPUs, NCCL

Every process holds the whole model wrapped in `DistributedDataParallel`, reads its own rows of each batch,
and DDP averages the gradients over the processes during `backward`. What this module adds to torch's own
pieces is the loss: a mean over the targets that are not ignored must be the mean over the whole batch,
not an average of each process's own mean (a process with more padding would count more per target).

    ctx = distributed.init("cpu")                     # reads RANK, WORLD_SIZE, LOCAL_RANK from torchrun
    model = distributed.wrap(model.to(ctx.device), ctx)
    rows = distributed.shard(len(batch), ctx)         # this process's rows of the global batch
    n = distributed.count_targets(tgt_out, pad_id)    # non-ignored targets on every process (all-reduce)
    share = distributed.cross_entropy_share(model(src[rows], tgt_in[rows]), tgt_out[rows], n, pad_id)
    share.backward()                                  # .grad: the gradient of the whole batch's mean loss
    loss = distributed.global_loss(share)             # the whole batch's mean loss, the same on every rank

Without torchrun (no RANK in the environment) `init` returns a one-process context and every function here
does what it would do for a single process, with no process group.
"""

from __future__ import annotations

import datetime
import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel


@dataclass(frozen=True)
class Context:
    """Where this process stands: its rank among world_size processes, its rank on this machine (which
    GPU it takes) and its device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that logs, evaluates and writes files."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def any(self, flag: bool) -> bool:
        """True on every process if `flag` is True on any (a decision all processes must share, such as
        stopping when one of them runs out of time; one all-reduce)."""
        if not self.distributed:
            return flag
        t = torch.tensor([float(flag)], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init(device: str | torch.device = "cpu", backend: str | None = None, timeout_minutes: float = 30.0) -> Context:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).

    device "cpu" uses gloo; "cuda" uses NCCL, each process on cuda:LOCAL_RANK. Without torchrun: a
    one-process Context on `device`, no process group."""
    device = torch.device(device)
    if not launched_by_torchrun():
        return Context(device=device)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if backend is None:
        backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        timeout = datetime.timedelta(minutes=timeout_minutes)
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout)
    return Context(rank, world_size, local_rank, device)


def shutdown() -> None:
    """Leave the process group, after every process has come here (a barrier: a process that tears its
    connections down while another still works, rank 0 evaluating say, can abort gloo). Nothing without
    one. Call it at the end of a run that went well; after an error, exit and torchrun stops the rest.

    Drop your references to DistributedDataParallel models first. A DDP reducer that outlives its process
    group is destroyed at interpreter exit, after the group, and that can abort the process ("terminate
    called without an active exception": 4 of 65 two-process gloo runs here; 0 of 45 once the model was
    gone first). DDP modules sit in reference cycles, so this collects them before leaving the group."""
    if dist.is_initialized():
        gc.collect()  # the unreachable DDP reducers go now, while their process group still exists
        dist.barrier()
        dist.destroy_process_group()


def wrap(model: nn.Module, ctx: Context, **ddp_options) -> nn.Module:
    """`DistributedDataParallel(model)` on a multi-process run (the model already on ctx.device), the
    model itself otherwise. DDP copies rank 0's parameters to every process when it wraps."""
    if not ctx.distributed:
        return model
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, **ddp_options)


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside DistributedDataParallel and torch.compile wrappers (for state dicts, decoding)."""
    while True:
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif isinstance(inner := getattr(model, "_orig_mod", None), nn.Module):  # torch.compile's wrapper
            model = inner
        else:
            return model


def shard(n_rows: int, ctx: Context) -> slice:
    """This process's rows of a global batch of n_rows: contiguous, sizes differing by at most one
    (rank r takes rows r * n // W up to (r + 1) * n // W)."""
    return slice(ctx.rank * n_rows // ctx.world_size, (ctx.rank + 1) * n_rows // ctx.world_size)


def count_targets(targets: Tensor, ignore_index: int = -100) -> Tensor:
    """The number of targets != ignore_index summed over every process (an all-reduce; a tensor on
    targets' device, never read on the host). Give it the targets of every micro-batch of an accumulated
    step (stacked, or summed counts) to average over the whole step."""
    count = (targets != ignore_index).sum()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(count)
    return count


def cross_entropy_share(
    logits: Tensor,
    targets: Tensor,
    n_targets: Tensor | int,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> Tensor:
    r"""This process's share of the whole batch's mean cross-entropy, for DDP:

    .. math::

        \mathrm{share} = W \sum_{n \in \text{this process, not ignored}} \frac{\ell_n}{n_{\mathrm{targets}}}

    with :math:`\ell_n` `F.cross_entropy`'s per-target loss (label smoothing included), :math:`W` the world
    size and :math:`n_{\mathrm{targets}}` the non-ignored targets of the whole batch on all processes
    (`count_targets`). DDP averages gradients over the :math:`W` processes, so what it leaves in every
    `.grad` is the gradient of :math:`\sum_{\text{all targets}} \ell_n / n_{\mathrm{targets}}`: exactly the
    whole batch's mean, however the ignored targets fall. Shares of micro-batches (accumulated under
    `no_sync`) add up the same way. logits (..., V), targets (...)."""
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    total = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),  # (N, V)
        targets.reshape(-1).long(),  # (N,)
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        reduction="sum",
    )
    return total / n_targets * world_size  # (an int tensor n_targets keeps total's dtype)


def global_loss(share: Tensor) -> Tensor:
    """The whole batch's mean loss from each process's `cross_entropy_share` (sum over processes / W),
    the same on every process; detached. One all-reduce; the share itself when there is one process."""
    share = share.detach().clone()
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return share
    dist.all_reduce(share)
    return share / dist.get_world_size()
