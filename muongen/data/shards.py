"""One shard's reading: files -> rounds -> shuffled pools -> batches, with an exact cursor.

How events flow (one *shard* = one DDP rank, or one DataLoader worker of a rank):

1. Epoch order: the file list is permuted with ``default_rng([seed, epoch])`` (the same on
   every rank) when ``data.shuffle_files``, then file i of that order goes to shard
   ``i % n_shards`` with ``n_shards = world_size * max(1, num_workers)`` and shard
   ``rank * num_workers + worker``. Sharding whole files (not row groups) needs no file
   to be opened in advance, which matters with ~2M remote files; every event is in exactly
   one file, so every event is seen exactly once per epoch. (A rank needs >= 1 file.)
2. Slots: a shard reads ``data.open_files`` files at once. Slot s takes the shard's files
   s, s + k, s + 2k, ... (k = open_files) one after the other, as one stream of rows.
3. Rounds: round r takes the next C rows from every slot (C = shuffle_buffer_events /
   open_files), keeps the valid events (bad ones are reported, outliers siphoned to the
   OutlierWriter, empty ones dropped unless keep_empty), and permutes this pool with a
   generator seeded by (seed, epoch, shard, n_shards, r). The pool is the bounded
   shuffle buffer: it mixes events of ``open_files`` files and holds at most
   shuffle_buffer_events rows. Round r + 1 is read (one thread per slot) and built in
   the background while the consumer takes the batches of round r.
4. Batches: the pools, one after another (across epochs too), are cut into batches of
   ``batch_events``; only the last batch of the last epoch (max_epochs > 0) is shorter.
5. Ends: after ``max_epochs``, or when every file the shard can be dealt has been read in
   epochs that gave it no event (all unreadable, or every event dropped or set aside):
   another epoch could not yield either, and an endless stream would wait silently.

The cursor is (epoch, round, events of the round's pool already yielded, and where each
slot stood at the start of the round). Everything above is a pure function of it, so a
restored stream rebuilds that round's pool and continues at the next unseen event. Side
effects (outliers written, bad input reported, counters) travel with the batch that follows
them (an :class:`Item`) and are applied by :class:`muongen.data.stream.EventStream` when
that batch is handed to the consumer, so its ``state_dict()`` describes exactly the
batches already yielded, in one process or with DataLoader workers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from muongen.config import DataConfig
from muongen.data.batch import RaggedBatch
from muongen.data.reader import Chunk, FileReader, offsets_of
from muongen.errors import InputFileError, StorageError

log = logging.getLogger(__name__)


def fresh_cursor(n_slots: int, epoch: int = 0) -> dict[str, Any]:
    return {
        "epoch": epoch,
        "round": 0,
        "offset": 0,
        "slots": [[0, 0]] * n_slots,
        "built": False,
        "done": False,
    }


@dataclass
class Effects:
    """What building rounds did that the consumer's process must apply (and only once).

    Bad input carries the epoch that met it: the report counts a file's bad events in the
    first epoch that read the file only (every epoch reads every file again).
    """

    outliers: list[tuple[str, pa.Table]] = field(default_factory=list)
    bad_files: list[tuple[str, str, int]] = field(default_factory=list)  # url, reason, epoch
    bad_events: list[tuple[str, int, str, int]] = field(default_factory=list)  # url, n, why, ep
    empty_dropped: int = 0

    def add(self, other: Effects) -> None:
        self.outliers += other.outliers
        self.bad_files += other.bad_files
        self.bad_events += other.bad_events
        self.empty_dropped += other.empty_dropped

    @staticmethod
    def merged(parts: list[Effects]) -> Effects:
        out = Effects()
        for p in parts:
            out.add(p)
        return out


@dataclass
class Item:
    """One message from a shard: a batch (or None), the cursor after it, the side effects.

    ``error`` (with ``done``): data.strict met a bad file; the consumer applies the effects
    (which record the file) and then raises InputFileError with this message.
    """

    batch: RaggedBatch | None
    cursor: dict[str, Any]
    effects: Effects
    worker: int = 0
    done: bool = False
    error: str = ""


REASON_UNREADABLE = "unreadable: the file fails part-way (see bad_files)"


class _StrictStop(Exception):
    """data.strict: a bad file stops the shard; ``effects`` records it for the report."""

    def __init__(self, message: str, effects: Effects) -> None:
        super().__init__(message)
        self.message, self.effects = message, effects


@dataclass
class Pool:
    """One round's events after filtering and shuffling (torch views of numpy arrays)."""

    conditions: torch.Tensor
    muons: torch.Tensor
    counts: torch.Tensor
    keys: torch.Tensor
    offsets: np.ndarray  # (n + 1,)
    n: int  # events (a Python int: len() of a tensor is slow in the hot loop)

    def part(self, a: int, b: int) -> tuple[torch.Tensor, ...]:
        m0, m1 = int(self.offsets[a]), int(self.offsets[b])
        return self.conditions[a:b], self.muons[m0:m1], self.counts[a:b], self.keys[a:b]


def _pool(cond, muons, counts, keys, offsets: np.ndarray | None = None) -> Pool:
    t = torch.from_numpy
    offsets = offsets_of(counts) if offsets is None else offsets
    return Pool(t(cond), t(muons), t(counts), t(keys), offsets, len(counts))


_EMPTY_POOL = (
    np.zeros((0, 4), np.float32),
    np.zeros((0, 3), np.float32),
    np.zeros(0, np.int64),
    np.zeros(0, np.int64),
)


def _batch(parts: list[tuple[torch.Tensor, ...]]) -> RaggedBatch:
    if len(parts) == 1:
        return RaggedBatch(*parts[0])
    return RaggedBatch(*(torch.cat(cols) for cols in zip(*parts)))


def _permutation(n: int, *seed: int) -> np.ndarray:
    """A permutation of range(n) drawn from a seed sequence (torch's randperm is ~3x faster
    than numpy's on CPU)."""
    state = np.random.SeedSequence(list(seed)).generate_state(2, np.uint32)
    gen = torch.Generator().manual_seed(int(state[0]) << 31 | int(state[1]) >> 1)
    return torch.randperm(n, generator=gen).numpy()


class Slot:
    """Reads the rows of a list of files one after the other, C rows per round."""

    def __init__(self, shard: Shard, file_ids: list[int], pos: list[int], epoch: int) -> None:
        self.shard = shard
        self.file_ids = file_ids
        self.i, self.row = pos
        self.epoch = epoch
        self._reader: FileReader | None = None
        self._chunks: Iterator[Chunk] | None = None
        self._left: Chunk | None = None

    @property
    def pos(self) -> list[int]:
        return [self.i, self.row]

    @property
    def exhausted(self) -> bool:
        return self.i >= len(self.file_ids)

    def _url(self) -> str:
        return self.shard.files[self.file_ids[self.i]]

    def _next_file(self) -> None:
        self.close()
        self.i, self.row = self.i + 1, 0

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
            if self.shard.prefetcher is not None:
                self.shard.prefetcher.release(self._url())
        self._chunks, self._left = None, None

    def _fail(self, exc: Exception, effects: Effects | None) -> None:
        """The current file cannot be read (further): record it, then skip the rest of it
        (or, under data.strict, stop the shard)."""
        url, reason = self._url(), str(exc)
        unread = 0
        if self._reader is not None:  # it failed part-way: rows before self.row were read
            unread = max(0, self._reader.n_rows - self.row)
            reason = f"{reason} (rows {self.row} to {self._reader.n_rows} of it unread)"
        record = Effects()
        record.bad_files.append((url, reason, self.epoch))
        if unread:
            record.bad_events.append((url, unread, REASON_UNREADABLE, self.epoch))
        if self.shard.cfg.strict:
            self.close()
            raise _StrictStop(f"{reason} (data.strict is set: fix or remove the file)", record)
        if effects is not None:
            effects.add(record)
        self._next_file()

    def take(self, n: int, effects: Effects | None) -> list[tuple[int, Chunk]]:
        """The next ``n`` rows (fewer at the end of the slot's files) as (file index, chunk)."""
        out: list[tuple[int, Chunk]] = []
        while n > 0 and not self.exhausted:
            if self._chunks is None:
                url = self._url()
                pf = self.shard.prefetcher
                try:
                    local = pf.local_path(url) if pf is not None else None
                    self._reader = FileReader(url, local_path=local)
                except (InputFileError, StorageError) as exc:
                    if pf is not None:
                        pf.release(url)
                    self._fail(exc, effects)
                    continue
                self._chunks = self._reader.chunks(
                    self.row, self.shard.read_rows, max_muons=self.shard.cfg.max_muons_per_event
                )
            try:
                chunk = self._left if self._left is not None else next(self._chunks, None)
            except (InputFileError, StorageError) as exc:
                self._fail(exc, effects)
                continue
            self._left = None
            if chunk is None:  # end of file
                self._next_file()
                continue
            if chunk.stop - self.row > n:
                chunk, self._left = chunk.head(self.row + n)
            out.append((self.file_ids[self.i], chunk))
            n -= chunk.stop - chunk.start
            self.row = chunk.stop
            if self.row >= self._reader.n_rows:
                self._next_file()
        return out


class Shard:
    """One shard's endless (or max_epochs long) sequence of _Items; see the module doc."""

    def __init__(
        self,
        files: list[str],
        cfg: DataConfig,
        *,
        shard: int,
        n_shards: int,
        seed: int,
        cursor: dict[str, Any],
        prefetcher=None,
        worker: int = 0,
    ) -> None:
        self.files, self.cfg, self.shard, self.n_shards = files, cfg, shard, n_shards
        self.seed, self.cursor, self.prefetcher, self.worker = seed, cursor, prefetcher, worker
        self.rows_per_round = rows_per_round(cfg)
        self.read_rows = max(1, min(cfg.read_rows, self.rows_per_round))

    def plan(self, epoch: int) -> list[list[int]]:
        """File indices of each slot in ``epoch``."""
        order = np.arange(len(self.files))
        if self.cfg.shuffle_files:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.files))
        mine = order[self.shard :: self.n_shards].tolist()
        k = self.cfg.open_files
        return [mine[s::k] for s in range(k)]

    def _reachable(self, dealt: set[int]) -> set[int]:
        """The files this shard can be dealt in some epoch (``dealt``: one epoch's)."""
        if self.cfg.shuffle_files and self.n_shards > 1:
            return set(range(len(self.files)))
        return dealt  # the same files every epoch

    def _schedule(self, slots: list[Slot]) -> None:
        if self.prefetcher is None:
            return
        queues = [s.file_ids[s.i :] for s in slots]
        urls = [
            self.files[q[j]]
            for j in range(max(map(len, queues), default=0))
            for q in queues
            if j < len(q)
        ]
        if urls:
            self.prefetcher.schedule(urls)

    def _rounds(
        self,
        slots: list[Slot],
        epoch: int,
        rnd: int,
        quiet: bool,
        readers: ThreadPoolExecutor,
        builder: ThreadPoolExecutor,
    ) -> Iterator[Round]:
        """The built rounds of one epoch from round ``rnd`` on.

        Round r + 1 is read and built in the background while the consumer takes the
        batches of round r; every slot reads in its own thread (Parquet decoding and numpy
        release the GIL). Each slot's reads stay sequential, so the result is deterministic.
        """

        def build(rnd: int, quiet: bool) -> Round:
            start = [s.pos for s in slots]
            fxs = [None if quiet else Effects() for _ in slots]
            futures = [readers.submit(s.take, self.rows_per_round, fx) for s, fx in zip(slots, fxs)]
            try:
                parts = [part for f in futures for part in f.result()]
            finally:
                wait(futures)  # a failed slot must not leave another one reading
            effects = None if quiet else Effects.merged(fxs)
            pool = self._build(parts, epoch, rnd, effects)
            after = [s.pos for s in slots]
            return Round(rnd, start, after, all(s.exhausted for s in slots), pool, effects)

        job = None if all(s.exhausted for s in slots) else builder.submit(build, rnd, quiet)
        try:
            while job is not None:
                rd = job.result()
                job = None if rd.exhausted else builder.submit(build, rd.index + 1, False)
                yield rd
        finally:
            if job is not None:
                wait([job])  # let the round in flight finish before the slots are closed

    def _build(
        self, parts: list[tuple[int, Chunk]], epoch: int, rnd: int, effects: Effects | None
    ) -> Pool:
        """Round ``rnd``'s pool. ``effects`` is None when rebuilding a round already reported."""
        if effects is not None:
            for fid, chunk in parts:
                url = self.files[fid]
                effects.bad_events.extend(
                    (url, n, reason, epoch) for reason, n in chunk.bad.items()
                )
                # Outliers are kept once, from the first epoch (which, over all shards, reads
                # every file once); later epochs meet the same events again.
                if chunk.outliers is not None and epoch == 0:
                    effects.outliers.append((_format_of(chunk.outliers), chunk.outliers))
        parts = [(fid, c) for fid, c in parts if c.n_events]
        if not parts:
            return _pool(*_EMPTY_POOL)
        cond = np.concatenate([c.conditions for _, c in parts])
        muons = np.concatenate([c.muons for _, c in parts])
        counts = np.concatenate([c.counts for _, c in parts])
        keys = np.concatenate([(np.int64(fid) << np.int64(32)) | c.rows for fid, c in parts])
        keep = None
        if not self.cfg.keep_empty:
            nonempty = counts > 0
            if effects is not None:
                effects.empty_dropped += int(len(counts) - nonempty.sum())
            keep = np.flatnonzero(nonempty)
        if self.cfg.shuffle_buffer_events > 0:
            n = len(counts) if keep is None else len(keep)
            perm = _permutation(n, self.seed, epoch, self.shard, self.n_shards, rnd)
            keep = perm if keep is None else np.take(keep, perm)
        if keep is None:
            return _pool(cond, muons, counts, keys)
        # gather the kept events in their new order; each array is read once, at random
        starts = np.take(offsets_of(counts)[:-1], keep)
        counts = np.take(counts, keep)
        offsets = offsets_of(counts)
        rows = np.repeat(starts - offsets[:-1], counts) + np.arange(offsets[-1], dtype=np.int64)
        muons = np.take(muons, rows, axis=0)
        return _pool(np.take(cond, keep, axis=0), muons, counts, np.take(keys, keep), offsets)

    def items(self) -> Iterator[Item]:
        cfg, cur = self.cfg, dict(self.cursor)
        batch_events = cfg.batch_events
        parts: list[tuple[torch.Tensor, ...]] = []
        n_pending = 0
        effects = Effects()
        quiet = cur["built"]  # the cursor's round was built (and reported) before the snapshot
        barren: set[int] = set()  # files read in epochs that gave this shard no event
        readers = ThreadPoolExecutor(cfg.open_files, thread_name_prefix="muongen-read")
        builder = ThreadPoolExecutor(1, thread_name_prefix="muongen-build")
        with readers, builder:
            try:
                while not cur["done"] and not (cfg.max_epochs and cur["epoch"] >= cfg.max_epochs):
                    epoch, plan = cur["epoch"], self.plan(cur["epoch"])
                    if not any(plan):
                        # fewer files than shards: this shard is dealt none in any epoch
                        # (the count is the same every epoch); it ends now, where looping
                        # over empty epochs would never yield and the consumer, which
                        # takes the workers' batches in turn, would wait for it forever
                        break
                    slots = [Slot(self, ids, pos, epoch) for ids, pos in zip(plan, cur["slots"])]
                    self._schedule(slots)
                    offset = cur["offset"]
                    events_read = 0
                    rounds = self._rounds(slots, epoch, cur["round"], quiet, readers, builder)
                    try:
                        for rd in rounds:
                            if rd.effects is not None:
                                effects.add(rd.effects)
                            pool = rd.pool
                            events_read += pool.n
                            offset = offset if quiet else 0
                            quiet = False
                            while offset < pool.n:
                                take = min(batch_events - n_pending, pool.n - offset)
                                parts.append(pool.part(offset, offset + take))
                                n_pending += take
                                offset += take
                                if n_pending < batch_events:
                                    continue
                                if offset < pool.n:  # mid-round: rebuild this round on resume
                                    cur = _cursor(epoch, rd.index, offset, rd.start, built=True)
                                elif rd.exhausted:
                                    cur = fresh_cursor(len(slots), epoch + 1)
                                else:
                                    cur = _cursor(epoch, rd.index + 1, 0, rd.after, built=False)
                                yield Item(_batch(parts), dict(cur), effects, self.worker)
                                parts, n_pending, effects = [], 0, Effects()
                    finally:
                        rounds.close()
                        for s in slots:
                            s.close()
                    cur = fresh_cursor(len(slots), epoch + 1)
                    dealt = {i for ids in plan for i in ids}
                    barren = barren | dealt if not events_read else set()
                    if barren >= self._reachable(dealt):
                        # every file this shard can be dealt gave no event (all unreadable,
                        # or every event dropped): the next epochs would loop without ever
                        # yielding, so the shard ends; the consumer sees its counters
                        log.warning(
                            "shard %d of %d: no event in its %d file(s) in epoch %d (see the "
                            "bad-input report); it stops reading",
                            self.shard,
                            self.n_shards,
                            len(barren),
                            epoch,
                        )
                        break
            except _StrictStop as stop:  # hand over what to report, then the consumer stops
                effects.add(stop.effects)
                yield Item(None, dict(cur), effects, self.worker, done=True, error=stop.message)
                return
        cur = {**cur, "done": True}
        yield Item(_batch(parts) if n_pending else None, cur, effects, self.worker, done=True)


@dataclass
class Round:
    index: int
    start: list[list[int]]  # slot positions at the start of the round
    after: list[list[int]]  # ... and after it
    exhausted: bool  # every slot reached the end of its files
    pool: Pool
    effects: Effects | None  # None when the round was built and reported before


def _cursor(
    epoch: int, rnd: int, offset: int, slots: list[list[int]], *, built: bool
) -> dict[str, Any]:
    return {
        "epoch": epoch,
        "round": rnd,
        "offset": offset,
        "slots": slots,
        "built": built,
        "done": False,
    }


def _format_of(table: pa.Table) -> str:
    from muongen.data.outliers import table_format

    return table_format(table.schema, "outliers")


def rows_per_round(cfg: DataConfig) -> int:
    """Rows each slot contributes to a round (C in the module doc)."""
    if cfg.shuffle_buffer_events > 0:
        return max(1, cfg.shuffle_buffer_events // cfg.open_files)
    return max(1, cfg.read_rows)
