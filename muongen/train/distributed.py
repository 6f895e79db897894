"""Data-parallel training across processes started by torchrun.

Gradients are averaged with one flat all-reduce per module after each backward (the
``sync_grads`` hook of GanStep) instead of wrapping the models in DistributedDataParallel:
a WGAN-GP step alternates critic and generator updates, runs the critic inside the
generator's loss, and differentiates twice through the critic for the gradient penalty,
all of which DDP's reducer handles poorly (unused parameters, double backward). The
arithmetic is the same as DDP's: every rank ends each backward with the mean gradient.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init(device_kind: str) -> DistInfo:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1), else single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        backend = "nccl" if device_kind == "cuda" else "gloo"
        dist.init_process_group(backend=backend)
        log.info("rank %d/%d joined the %s process group", info.rank, world, backend)
    return info


def close(info: DistInfo) -> None:
    """Leave the process group together: a rank destroying it while another is still
    talking aborts the other (gloo's "terminate called without an active exception")."""
    if info.enabled and dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


def broadcast_module(module: nn.Module, info: DistInfo) -> None:
    """Give every rank rank 0's parameters and buffers."""
    if not info.enabled:
        return
    for t in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(t.data, src=0)


def make_grad_sync(info: DistInfo):
    """A ``sync_grads(module)`` callback averaging gradients over ranks (None when single)."""
    if not info.enabled:
        return None

    def sync_grads(module: nn.Module) -> None:
        params = [p for p in module.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:  # a parameter unused this step still takes part in the sum
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        flat /= info.world_size
        for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
            g.copy_(synced)

    return sync_grads


def agree(flags: list[int], info: DistInfo, device: torch.device) -> list[int]:
    """Element-wise max of small integer flags over ranks (e.g. stop requested, data exhausted).

    One tiny collective; used once per step in multi-process runs only.
    """
    if not info.enabled:
        return flags
    t = torch.tensor(flags, dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def gather_objects(obj, info: DistInfo) -> list:
    """Every rank's ``obj``, in rank order, on every rank."""
    if not info.enabled:
        return [obj]
    out: list = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()
