"""The CPU step's shards (``train.step_shards``): how many, where a microbatch is cut,
the threads they run on, and their gradients kept apart.

A second intra-op thread hardly speeds up operations this small, so on the CPU each
microbatch is cut into runs of consecutive events (:func:`shard_bounds`) whose terms run
at once, one thread each (:func:`thread_pool`, process-wide; torch's operations release
the GIL). Each shard collects its gradients apart (:class:`ShardGrads`) and they are
summed in shard order. How the step uses them, and why the sharded step equals the
unsharded one for the same draws: :mod:`muongen.train.step`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

log = logging.getLogger(__name__)

#: the least work (muons plus events with muons) worth a shard of its own: below it the
#: Python side of a shard's ~3300-3700 operations costs more than the thread saves. In
#: in-process A/B on 2 cores (2026-11-26), against one shard on 2 threads: 1.13x slower
#: at ~1000 and ~1900 per shard, even at ~2900, 0.87-0.99x above; the quality preset's
#: batches (median 6064, 5th percentile 3811) took 13-16% less time a step cut at 2048
#: than on one thread (docs/speed.md, "Shards on the CPU")
SHARD_MIN_COST = 2048


def shard_bounds(counts: torch.Tensor, shards: int, min_cost: int = 0) -> list[int]:
    """Event boundaries cutting a microbatch into ``shards`` runs of consecutive events of
    about equal cost, counted as one per muon plus one per event with muons (an empty
    event is not scored); into fewer (the last runs empty) when a run would cost less than
    ``min_cost``. Returns ``shards + 1`` non-decreasing indices from 0 to B."""
    c = counts.detach().cpu().numpy()
    cum = np.cumsum(c + (c > 0))
    total = int(cum[-1]) if len(cum) else 0
    used = max(1, min(shards, total // max(min_cost, 1)))
    cuts = np.searchsorted(cum, [total * j / used for j in range(1, used)], side="left")
    inner = [int(x) + 1 for x in cuts]
    return [0, *inner, *[len(c)] * (shards - len(inner))]


class ShardGrads:
    """The parameter gradients of one shard's terms, summed apart from ``.grad`` (each
    term through ``torch.autograd.grad``): shards running at once never write the same
    tensor. A parameter no term reached stays None, as its ``.grad`` would."""

    def __init__(self, params: Sequence[torch.Tensor]) -> None:
        self.params = list(params)
        self.sums: list[torch.Tensor | None] | None = None

    def backward(self, loss: torch.Tensor) -> None:
        if not loss.requires_grad:  # a term without a graph (e.g. no pairs for the GP)
            return
        self.add(list(torch.autograd.grad(loss, self.params, allow_unused=True)))

    def add(self, grads: list[torch.Tensor | None] | None) -> None:
        """Add another set of gradients (None entries: not reached)."""
        if grads is None:
            return
        if self.sums is None:
            self.sums = grads
        elif all(g is not None for g in grads) and all(s is not None for s in self.sums):
            self.sums = list(torch._foreach_add(self.sums, grads))
        else:
            self.sums = [
                s if g is None else g if s is None else s + g for s, g in zip(self.sums, grads)
            ]


_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def thread_pool(workers: int, threads_each: int) -> ThreadPoolExecutor:
    """A process-wide pool of ``workers`` threads, each running torch with
    ``threads_each`` intra-op threads (set once per thread: the setting is per thread)."""
    key = (workers, threads_each)
    with _POOLS_LOCK:
        if key not in _POOLS:
            _POOLS[key] = ThreadPoolExecutor(
                workers,
                thread_name_prefix="muongen-shard",
                initializer=torch.set_num_threads,
                initargs=(threads_each,),
            )
        return _POOLS[key]


def resolve_shards(requested: int, device: torch.device, compiled: bool) -> int:
    """The step's shard count for ``train.step_shards`` (see there): 1 off the CPU and
    with ``compile``; 0 (auto) is 2 when torch has 2 or more threads, else 1."""
    if device.type != "cpu" or compiled:
        if requested > 1:
            log.info(
                "train.step_shards=%d applies to uncompiled training on the CPU only: "
                "the step runs as one shard",
                requested,
            )
        return 1
    if requested == 0:
        return 2 if torch.get_num_threads() >= 2 else 1
    return requested
