"""CUDA graphs of the training step (``train.cuda_graphs``).

Why. On a GPU the step is bound by the host: ~2700 kernels per step (five critic
updates, each with a double backward for the penalty, and a generator update), each
launched from Python through the dispatcher and autograd, ~60 ms at 48k events, while
the GPU itself is busy for about half of it. A CUDA graph records the step's kernels
once and replays them with one launch: the host's cost per step becomes a few copies and
one replay.

Static shapes. A graph replays the very kernels it recorded, on the very same memory, so
every shape in the step must be the same from one replay to the next. The shapes follow
from each microbatch's event count B (fixed by ``data.batch_events``, but for the last
batch of a finite run) and muon count N (different in every batch). Each microbatch is
therefore padded: its N muons are followed by P padding muons (zeros) shared among
:data:`PAD_EVENTS` extra events at the end, so that N + P is one of a few sizes,
:func:`padded_size` (at most 1/8 more muons). The extra events are scored like any other
(static shapes again) but are not ``valid`` (:class:`muongen.train.scored.Scored`): their
scores are masked out of every loss, they draw no penalty pair, and the multiplicity
head never sees them, so the losses and gradients are those of the unpadded microbatch.
Graphs are kept per (padded shapes of the microbatches, pattern of penalty updates):
with ``gp_every`` 2 and 5 critic updates the pattern alternates from one step to the
next, so each padded shape has two graphs.

Recording. The first ``WARMUP_STEPS`` steps of a new key run eagerly on the padded
inputs in a side stream (they train as usual: the optimizers' state exists before the
recording, and lazily created handles are made outside it); the next one is recorded and
then replayed. A recorded graph's inputs are static tensors: each step copies its batch
into them (the padding muons are zeroed and the padding events' counts set), replays, and
hands back copies of the graph's outputs (copying, filling: no transfer from the host).
Learning rates are device tensors (filled by the schedulers outside the graph, read by
the recorded fused optimizer kernels), noise comes from the CUDA generator (each replay
draws anew), and nothing in the step reads a value back to the host (a read would fail
the recording). With ``train.cuda_graphs_max`` graphs recorded, batches of a new key run
eagerly (logged once).

Everything here is exercised on the CPU by the tests except the recording itself: the
padded step is the eager step on padded inputs (:meth:`StepGraphs.eager_padded`), and
the tests check that it gives the unpadded losses and gradients.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from muongen.data.batch import RaggedBatch

# The step is typed loosely here (``Any``, documented as a GanStep): muongen.train.step
# imports this module, and importing it back, even for type checking only, would make the
# package's one import circle (tests/test_import_graph.py keeps the package free of them).

log = logging.getLogger(__name__)

#: eager steps on a new key before it is recorded
WARMUP_STEPS = 2

#: the least padded size (muons)
MIN_PADDED = 256

#: padding events per microbatch: the padding muons are shared out among several events,
#: since one event of many thousand muons would serialise the segment reductions'
#: atomic adds on its row (measured: a step 17% slower at 192k events)
PAD_EVENTS = 64

#: no graph is recorded while less than this share of the GPU's memory is free (each
#: graph keeps the memory of a whole step: ~0.6 GB at 48k events and 180k muons)
MIN_FREE = 0.25


def _room_for_a_graph() -> bool:
    free, total = torch.cuda.mem_get_info()
    return free >= MIN_FREE * total


def padded_size(n_muons: int) -> int:
    """The muon count a microbatch of ``n_muons`` is padded to: a multiple of 2^(k - 3)
    for n in [2^(k-1), 2^k), i.e. 8 sizes per doubling, at most 1/8 more muons (none
    when n is one of the sizes: the padding events then hold no muon)."""
    n = max(n_muons, MIN_PADDED)
    step = 1 << max(0, n.bit_length() - 4)
    return -(-n // step) * step


def pad(mb: RaggedBatch, size: int) -> RaggedBatch:
    """``mb`` followed by :data:`PAD_EVENTS` padding events that share ``size - N``
    padding muons (zeros) evenly; their conditions are the first event's (any valid values
    do: they are scored, not counted)."""
    extra = size - mb.n_muons
    if extra < 0:
        raise ValueError(f"cannot pad {mb.n_muons} muons to {size}")
    cond = torch.cat([mb.conditions, mb.conditions[:1].expand(PAD_EVENTS, -1)])
    muons = torch.cat([mb.muons, mb.muons.new_zeros(extra, mb.muons.shape[1])])
    counts = torch.cat([mb.counts, mb.counts.new_zeros(PAD_EVENTS)])
    _share_padding(counts[mb.n_events :], extra)
    return RaggedBatch(cond, muons, counts)


def _padded(micro: list[RaggedBatch]) -> list[RaggedBatch]:
    return [pad(m, padded_size(m.n_muons)) for m in micro]


def _share_padding(counts: torch.Tensor, extra: int) -> None:
    """Set the padding events' counts in place: ``extra`` muons shared out evenly, from
    the host's numbers alone (two fills: nothing is copied from the host)."""
    base, rest = divmod(extra, counts.shape[0])
    counts.fill_(base)
    counts[:rest].add_(1)


@dataclass
class _Recorded:
    """One recorded step: its static inputs (padded microbatches) and outputs."""

    graph: torch.cuda.CUDAGraph
    inputs: list[RaggedBatch]
    outputs: dict[str, torch.Tensor]

    def load(self, micro: list[RaggedBatch]) -> None:
        """Copy a batch into the static inputs (same events per microbatch, and muons
        that fit), zeroing the padding muons and setting the padding events' counts."""
        for static, mb in zip(self.inputs, micro):
            b, n = mb.n_events, mb.n_muons
            static.conditions[:b].copy_(mb.conditions, non_blocking=True)
            static.counts[:b].copy_(mb.counts, non_blocking=True)
            _share_padding(static.counts[b:], static.n_muons - n)
            static.muons[:n].copy_(mb.muons, non_blocking=True)
            static.muons[n:].zero_()


def setup_graphs(step: Any) -> StepGraphs | None:
    """The :class:`~muongen.train.step.GanStep` ``step``'s CUDA graphs where they apply
    (``train.cuda_graphs``), else None (logged): on CUDA, in a single-process run, with the
    fused Adam(W) update. Makes the optimizers' learning rates device tensors (the recorded
    kernels read them there)."""
    if step.device.type != "cuda":
        log.info("train.cuda_graphs applies on CUDA only: the step runs as usual")
        return None
    if step.sync_grads is not None:
        log.info(
            "train.cuda_graphs applies to single-process runs: with DDP the step runs as usual"
        )
        return None
    if step.optim_cfg.optimizer != "adam" or not step._fused:
        log.info(
            "train.cuda_graphs records the fused Adam(W) update (optim.optimizer=adam): "
            "with %s the step runs as usual",
            step.optim_cfg.optimizer,
        )
        return None
    # the recorded optimizer kernels read the learning rates from the device; the
    # schedulers (made before, so their base rates stay host floats) fill them in place
    for opt in (step.opt_g, step.opt_c):
        for group in opt.param_groups:
            group["lr"] = torch.tensor(float(group["lr"]), device=step.device)
            group["capturable"] = True
    return StepGraphs(step, step.train_cfg.cuda_graphs_max)


class StepGraphs:
    """Records and replays the :class:`~muongen.train.step.GanStep`'s device work as CUDA
    graphs.

    Called by the step with its microbatches; returns the step's output dict, or None
    when this batch is to run as usual (a key beyond ``max_graphs``). The step then
    advances its host-side counters either way.
    """

    def __init__(self, step: Any, max_graphs: int) -> None:
        self.step = step
        self.max_graphs = max_graphs
        self.recorded: dict[tuple, _Recorded] = {}
        self.seen: Counter[tuple] = Counter()
        self.replays = 0
        self.eager_steps = 0  # steps of a key beyond max_graphs
        self._full_logged = False
        self._side = torch.cuda.Stream() if torch.cuda.is_available() else None

    def reset(self) -> None:
        """Forget every recorded graph: they hold the tensors they were recorded on, and
        loading a state replaces the optimizers' (a rollback, a resume)."""
        self.recorded.clear()
        self.seen.clear()

    def key(self, micro: list[RaggedBatch]) -> tuple:
        shapes = tuple((m.n_events, padded_size(m.n_muons)) for m in micro)
        return shapes, self.step.gp_pattern()

    def __call__(self, micro: list[RaggedBatch]) -> dict[str, torch.Tensor] | None:
        key = self.key(micro)
        rec = self.recorded.get(key)
        if rec is None:
            full = len(self.recorded) >= self.max_graphs
            if full or (self.seen[key] == WARMUP_STEPS and not _room_for_a_graph()):
                self.eager_steps += 1
                if not self._full_logged:
                    self._full_logged = True
                    log.info(
                        "%d CUDA graphs recorded (train.cuda_graphs_max=%d%s); batches of "
                        "other padded sizes run without a graph",
                        len(self.recorded),
                        self.max_graphs,
                        "" if full else f", and less than {MIN_FREE:.0%} of the GPU's memory free",
                    )
                return None
            self.seen[key] += 1
            if self.seen[key] <= WARMUP_STEPS:
                return self.eager_padded(micro, key[1], stream=self._side)
            try:
                rec = self._record(micro, key)
            except RuntimeError as exc:  # e.g. an operation that cannot be recorded
                log.warning(
                    "recording the step as a CUDA graph failed; training goes on without "
                    "graphs (set train.cuda_graphs=false to skip the attempt): %s",
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                )
                self.step.graphs = None
                return None
        rec.load(micro)
        rec.graph.replay()
        self.replays += 1
        return {k: v.clone() for k, v in rec.outputs.items()}

    def eager_padded(
        self,
        micro: list[RaggedBatch],
        gp_pattern: tuple[bool, ...],
        stream: torch.cuda.Stream | None = None,
    ) -> dict[str, torch.Tensor]:
        """The step's updates on the padded microbatches, run as usual (optionally on a
        side stream): what a recorded graph replays."""
        padded = _padded(micro)
        ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream())
        with ctx:
            out = self.step.updates(self.step._shard_work(padded, PAD_EVENTS), gp_pattern)
        if stream is not None:
            torch.cuda.current_stream().wait_stream(stream)
        return out

    def _record(self, micro: list[RaggedBatch], key: tuple) -> _Recorded:
        step = self.step
        inputs = _padded(micro)
        step.opt_g.zero_grad(set_to_none=True)  # gradients come from the graph's pool
        step.opt_c.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        timer, step.timer = step.timer, None  # no timing events inside the recording
        step.capturing = True
        try:
            with torch.cuda.graph(graph):
                outputs = step.updates(step._shard_work(inputs, PAD_EVENTS), key[1])
        finally:
            step.timer = timer
            step.capturing = False
        rec = _Recorded(graph, inputs, outputs)
        self.recorded[key] = rec
        log.info(
            "recorded a CUDA graph of the step for %s (%d of at most %d)",
            ", ".join(f"{b} events / {n} muons" for b, n in key[0]),
            len(self.recorded),
            self.max_graphs,
        )
        return rec
