"""EventStream: files -> shuffled batches of events, sharded, with an exact resumable cursor.

What one shard (a DDP rank, or one DataLoader worker of a rank) does is in
:mod:`muongen.data.shards`: per-epoch seeded file order, whole files dealt to shards (every
event is seen exactly once per epoch), ``open_files`` files read at once into a bounded
shuffle buffer, batches of ``batch_events``, and a cursor from which all of it can be
rebuilt. This module is the consumer's side: it applies each batch's side effects
(outliers written, bad input reported, counters) as the batch is handed over, keeps one
cursor per worker, and saves/restores them as a versioned state that refuses a changed
world size, worker count, file list, seed or buffer layout.

With ``data.num_workers > 0`` a torch DataLoader runs one shard per worker; batches are
handed over in a fixed worker order (round robin, skipping finished workers), so the batch
sequence and the state are as exact as in one process.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import sys
from collections import deque
from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset

from muongen.config import DataConfig
from muongen.data.batch import RaggedBatch
from muongen.data.report import BadInputReport
from muongen.data.shards import Item, Shard, fresh_cursor, rows_per_round
from muongen.errors import ConfigError, InputFileError

log = logging.getLogger(__name__)

STATE_VERSION = 1
STAT_KEYS = ("events", "muons", "empty_dropped", "outliers", "bad_files", "bad_events")


_MALLOC_TUNED = False
M_ARENA_MAX = -8  # glibc mallopt parameter


def limit_malloc_arenas(arenas: int = 2) -> None:
    """Cap glibc's malloc arenas (once per process, unless MALLOC_ARENA_MAX is set).

    The reader threads allocate and free large numpy arrays; with glibc's default of up
    to 8 arenas per core, the freed memory is spread over arenas and the resident size
    creeps up epoch after epoch. Two arenas keep it flat at no measurable speed cost.
    A no-op where glibc is not the C library.
    """
    global _MALLOC_TUNED
    if _MALLOC_TUNED or "MALLOC_ARENA_MAX" in os.environ or not sys.platform.startswith("linux"):
        return
    _MALLOC_TUNED = True
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(M_ARENA_MAX, arenas)


def _layout(cfg: DataConfig) -> dict[str, Any]:
    """The settings a cursor's meaning depends on (a restored state must match them)."""
    return {
        "open_files": cfg.open_files,
        "rows_per_round": rows_per_round(cfg),
        "shuffle": cfg.shuffle_buffer_events > 0,
        "shuffle_files": cfg.shuffle_files,
        "keep_empty": cfg.keep_empty,
        "max_muons_per_event": cfg.max_muons_per_event,
    }


def files_digest(files: list[str]) -> str:
    return hashlib.sha1("\n".join(files).encode()).hexdigest()


# ------------------------------------------------------------------ the public stream


class EventStream:
    """Batches of ``cfg.batch_events`` events (physical units, keys set) from ``files``.

    Args:
        files: input files (local paths or URLs) in a fixed order; an event's key is
            (index in this list << 32) | row.
        cfg: the data config (batch size, shuffling, open files, workers, limits).
        rank, world_size: this process's DDP rank and the number of ranks.
        seed: seed of the file order and the shuffle buffer (same on every rank).
        prefetcher: a storage Prefetcher used when reading in this process
            (num_workers == 0); it is told the upcoming files and released after each.
        prefetcher_factory: ``factory(worker_id) -> Prefetcher`` called in each DataLoader
            worker when num_workers > 0 (a live prefetcher cannot cross processes).
        outliers: OutlierWriter receiving events with > max_muons_per_event muons.
        report: BadInputReport recording skipped files and dropped events (each counted
            once, in the first epoch that met it; a fresh one when not given).

    With ``cfg.num_workers > 0`` the files are read by a torch DataLoader whose workers are
    further shards; the batches are handed over in a fixed worker order, so the sequence
    and the state are as exact as in one process.
    """

    def __init__(
        self,
        files: list[str],
        cfg: DataConfig,
        *,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        prefetcher=None,
        outliers=None,
        report=None,
        prefetcher_factory=None,
    ) -> None:
        self.files = list(files)
        if not self.files:
            raise ConfigError("data.paths holds no input files")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, {world_size})")
        if len(self.files) < world_size:
            raise ConfigError(
                f"{len(self.files)} input files cannot be shared by {world_size} ranks: files are "
                "sharded whole; give at least one file per rank"
            )
        if cfg.num_workers > 0 and prefetcher is not None:
            # a prefetcher's threads live in this process; DataLoader workers cannot use them
            raise ConfigError(
                "data.num_workers > 0 cannot use this process's prefetcher (storage.prefetch "
                "> 0): set one of them to 0 (a caller can instead pass prefetcher_factory, "
                "which gives each worker its own)"
            )
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.seed = seed % 2**63  # seed sequences take non-negative integers
        self.prefetcher, self.prefetcher_factory = prefetcher, prefetcher_factory
        self.outliers = outliers
        # the stream keeps a report even when none is given: it counts every bad event once
        self.report = report if report is not None else BadInputReport()
        self.n_workers = max(1, cfg.num_workers)
        if cfg.num_workers and len(self.files) < world_size * cfg.num_workers:
            log.warning(
                "%d files for %d ranks x %d workers: some workers will have no file to read",
                len(self.files),
                world_size,
                cfg.num_workers,
            )
        limit_malloc_arenas()
        self.stats = dict.fromkeys(STAT_KEYS, 0)
        self._cursors = [fresh_cursor(cfg.open_files) for _ in range(self.n_workers)]
        self._next_worker = 0

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from (the slowest worker's)."""
        return min(c["epoch"] for c in self._cursors)

    def __iter__(self) -> Iterator[RaggedBatch]:
        """Continue from the cursor: the first batch is the first one not yet yielded."""
        if self.cfg.num_workers == 0:
            shard = Shard(
                self.files,
                self.cfg,
                shard=self.rank,
                n_shards=self.world_size,
                seed=self.seed,
                cursor=self._cursors[0],
                prefetcher=self.prefetcher,
            )
            for item in shard.items():
                if self._apply(item):
                    yield item.batch
        else:
            yield from self._iter_workers()

    def _iter_workers(self) -> Iterator[RaggedBatch]:
        from torch.utils.data import DataLoader

        dataset = _WorkerShards(
            self.files,
            self.cfg,
            self.rank,
            self.world_size,
            self.seed,
            list(self._cursors),
            self.prefetcher_factory,
        )
        loader = DataLoader(
            dataset, batch_size=None, num_workers=self.cfg.num_workers, collate_fn=_identity
        )
        it = iter(loader)
        queues: list[deque[Item]] = [deque() for _ in range(self.n_workers)]
        alive = [not c["done"] for c in self._cursors]
        try:
            while any(alive):
                w = self._next_worker
                while not alive[w]:
                    w = (w + 1) % self.n_workers
                while not queues[w]:  # the DataLoader may hand another worker's batch first
                    item = next(it)
                    queues[item.worker].append(item)
                item = queues[w].popleft()
                if item.done:
                    alive[w] = False
                self._next_worker = (w + 1) % self.n_workers
                if self._apply(item):
                    yield item.batch
        finally:
            del it

    def _apply(self, item: Item) -> bool:
        """Apply an item's side effects and cursor; True if it carries a batch to yield."""
        fx = item.effects
        for url, reason, epoch in fx.bad_files:
            if self.report.bad_file(url, reason, epoch):
                self.stats["bad_files"] += 1
                if not item.error:  # else the run stops with the message
                    where = reason if url in reason else f"{url}: {reason}"
                    log.warning("skipped input file: %s", where)
        for url, n, reason, epoch in fx.bad_events:
            counted = self.report.bad_events(url, n, reason, epoch)
            self.stats["bad_events"] += counted
            if counted:
                log.warning("%s: dropped %d events (%s)", url, n, reason)
        for fmt, table in fx.outliers:
            if self.outliers is not None:
                self.outliers.add(table, fmt)
            self.stats["outliers"] += table.num_rows
        self.stats["empty_dropped"] += fx.empty_dropped
        if item.error:
            raise InputFileError(item.error)
        self._cursors[item.worker] = item.cursor
        if item.batch is None:
            return False
        self.stats["events"] += item.batch.n_events
        self.stats["muons"] += item.batch.n_muons
        return True

    def _setup(self) -> dict[str, Any]:
        """What a saved cursor is only valid for: it is stored with it and checked on load."""
        return {
            "world_size": self.world_size,
            "rank": self.rank,
            "num_workers": self.cfg.num_workers,
            "seed": self.seed,
            "n_files": len(self.files),
            "files_sha1": files_digest(self.files),
            "layout": _layout(self.cfg),
        }

    def state_dict(self) -> dict[str, Any]:
        """Where the stream stands after the batches yielded so far (plain Python values).

        The outlier writer is flushed, so outliers of those batches are on disk too.
        """
        if self.outliers is not None:
            self.outliers.flush()
        return {
            "version": STATE_VERSION,
            **self._setup(),
            "cursors": [dict(c) for c in self._cursors],
            "next_worker": self._next_worker,
            "stats": dict(self.stats),
            "report": self.report.to_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` was taken; refuses a state this run cannot continue exactly."""
        if state.get("version") != STATE_VERSION:
            raise ConfigError(
                f"data-stream state version {state.get('version')} is not {STATE_VERSION}; "
                "this muongen cannot resume it (start the data stream afresh)"
            )
        for key, value in self._setup().items():
            if state.get(key) != value:
                raise ConfigError(
                    f"cannot resume the data stream: it was saved with {key}={state.get(key)!r} "
                    f"but this run has {key}={value!r}; resume with the same {key} (every "
                    "event is seen exactly once only then), or start the data stream afresh"
                )
        self._cursors = [dict(c) for c in state["cursors"]]
        self._next_worker = int(state["next_worker"])
        self.stats = {k: int(state["stats"].get(k, 0)) for k in STAT_KEYS}
        if state.get("report"):
            self.report.load_dict(state["report"])


def _identity(item):
    return item


class _WorkerShards(IterableDataset):
    """torch IterableDataset body: each DataLoader worker reads its own shard."""

    def __init__(self, files, cfg, rank, world_size, seed, cursors, prefetcher_factory) -> None:
        super().__init__()
        self.files, self.cfg, self.rank, self.world_size = files, cfg, rank, world_size
        self.seed, self.cursors, self.prefetcher_factory = seed, cursors, prefetcher_factory

    def __iter__(self) -> Iterator[Item]:
        import torch
        from torch.utils.data import get_worker_info

        torch.set_num_threads(1)
        limit_malloc_arenas()
        info = get_worker_info()
        w, n = (info.id, info.num_workers) if info is not None else (0, 1)
        prefetcher = self.prefetcher_factory(w) if self.prefetcher_factory is not None else None
        shard = Shard(
            self.files,
            self.cfg,
            shard=self.rank * n + w,
            n_shards=self.world_size * n,
            seed=self.seed,
            cursor=self.cursors[w],
            prefetcher=prefetcher,
            worker=w,
        )
        try:
            yield from shard.items()
        finally:
            if prefetcher is not None:
                prefetcher.close()
