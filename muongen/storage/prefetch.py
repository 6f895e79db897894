"""Stage the next input files into a bounded local cache while the current ones are read.

Over a federation each file costs several round trips (director, cache, ranged GETs)
before its first byte arrives; a stream that reads files one after another waits that
long for every file. The :class:`Prefetcher` downloads the next ``ahead`` files in
background threads, so the stream usually finds its next file already on local disk.

Protocol (what :class:`muongen.data.stream.EventStream` does)::

    pf.schedule(urls)            # the upcoming files, in the order they will be read
    path = pf.local_path(url)    # staged copy (waits while it is being staged), or None:
                                 #   then read the URL directly
    ...read path...
    pf.release(url)              # done with it: deleted if delete_after_use
    pf.close()

Files are downloaded to a temp name and renamed, so a staged path is always complete.
Caps: at most ``ahead`` files staged but not yet handed out, and at most ``max_bytes``
in staged and handed-out files (a file larger than that is never staged). With
``delete_after_use=False`` released files stay in ``cache_dir`` (no longer counted) and
are reused when scheduled again. Local inputs are not staged (they are already on disk):
``local_path`` returns None for them.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass

from muongen.errors import MuongenError
from muongen.storage import files
from muongen.storage.retry import RetryPolicy
from muongen.storage.tokens import Token

log = logging.getLogger("muongen.storage")

QUEUED, SIZING, WAITING, DOWNLOADING, READY, IN_USE, FAILED = (
    "queued",
    "sizing",
    "waiting for space",
    "downloading",
    "ready",
    "in use",
    "failed",
)


@dataclass
class _Entry:
    url: str
    state: str = QUEUED
    path: str = ""
    seq: int = 0  # reading order; bytes are reserved in this order
    size: int = 0  # bytes reserved in the cache
    size_wanted: int = 0  # its size, known once sized
    wanted: bool = False  # the reader is waiting for it: not held back by `ahead`
    error: str = ""


class Prefetcher:
    """Background staging of upcoming input files into a bounded local cache.

    Args:
        cache_dir: folder for staged files; "" or None makes a temp folder removed at
            close().
        ahead: files staged ahead of the reader (not counting files handed out).
        max_bytes: cap on the bytes of all staged and handed-out files.
        delete_after_use: delete a staged file at release().
        retries: attempts per download (exponential back-off with jitter).
        workers: parallel downloads (default: ``ahead``, at most 8).
        token: bearer token for the downloads (default: discovered per URL).
    """

    def __init__(
        self,
        cache_dir: str | None = None,
        *,
        ahead: int = 4,
        max_bytes: int = 8 * 1024**3,
        delete_after_use: bool = True,
        retries: int = 5,
        workers: int | None = None,
        token: Token | None = None,
    ) -> None:
        if ahead < 1:
            raise ValueError("Prefetcher needs ahead >= 1")
        self._own_dir = not cache_dir
        self.cache_dir = cache_dir or tempfile.mkdtemp(prefix="muongen-prefetch-")
        os.makedirs(self.cache_dir, exist_ok=True)
        self.ahead = ahead
        self.max_bytes = max_bytes
        self.delete_after_use = delete_after_use
        base = files.settings().retry
        self.policy = RetryPolicy(retries, base.wait_s, base.max_wait_s)
        self.token = token
        self._cond = threading.Condition()
        self._queue: deque[str] = deque()
        self._entries: dict[str, _Entry] = {}
        self._used_bytes = 0
        self._seq = 0
        self._closed = False
        self.stats = {"staged": 0, "failed": 0, "bytes": 0, "direct": 0, "wait_s": 0.0}
        n = workers or min(ahead, 8)
        self._threads = [
            threading.Thread(target=self._work, name=f"muongen-prefetch-{i}", daemon=True)
            for i in range(n)
        ]
        for t in self._threads:
            t.start()

    # ---- consumer side -------------------------------------------------------------------
    def schedule(self, urls: list[str]) -> None:
        """Add upcoming files, in reading order.

        A file already staged (or being staged) is left alone; one still waiting in the
        queue moves to its place in this call's order (the latest plan wins).
        """
        with self._cond:
            for url in urls:
                if not files.is_remote(url):
                    continue
                entry = self._entries.get(url)
                if entry is not None and entry.state != QUEUED:
                    continue
                self._seq += 1
                if entry is None:
                    self._entries[url] = _Entry(url, seq=self._seq)
                else:
                    entry.seq = self._seq
                    self._queue.remove(url)
                self._queue.append(url)
            self._cond.notify_all()

    def local_path(self, url: str) -> str | None:
        """The staged copy of ``url``, waiting while it is being staged.

        None when ``url`` was not scheduled, staging failed, or the byte cap is full of
        files still in use (then read the URL directly rather than wait on ourselves).
        """
        start = time.monotonic()
        with self._cond:
            entry = self._entries.get(url)
            if entry is None:
                return None
            if entry.state == QUEUED:
                # the reader wants it now: jump the queue
                with contextlib.suppress(ValueError):
                    self._queue.remove(url)
                self._queue.appendleft(url)
                entry.wanted = True
            if entry.state in (QUEUED, SIZING, WAITING):
                # ... and it is first in reading order now, also when it is already being
                # sized or waits to reserve its bytes: several readers (data.open_files)
                # want files out of the scheduled order, and a file that waited behind an
                # earlier one still being sized would otherwise be given up as "cache full"
                entry.seq = min(e.seq for e in self._entries.values()) - 1
                self._cond.notify_all()
            # A file waiting for its bytes is waited for while they fit: then it waits only
            # for the worker to wake, or for files wanted after it (by other readers, so
            # earlier in reading order now) to finish sizing and reserve theirs
            while not self._closed and (
                entry.state in (QUEUED, SIZING, DOWNLOADING)
                or (entry.state == WAITING and self._fits(entry))
            ):
                self._cond.wait(0.5)
            self.stats["wait_s"] += time.monotonic() - start
            if entry.state == READY:
                entry.state = IN_USE
                return entry.path
            if entry.state == WAITING:  # only a release by the reader can make room
                entry.state = FAILED
                entry.error = "cache full"
                self._cond.notify_all()
            self.stats["direct"] += 1
            return None

    def release(self, url: str) -> None:
        """The reader is done with ``url``: its staged copy may go."""
        with self._cond:
            entry = self._entries.pop(url, None)
            if entry is None:
                return
            with contextlib.suppress(ValueError):
                self._queue.remove(url)
            if entry.path and entry.state in (READY, IN_USE):
                if self.delete_after_use:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                self._used_bytes -= entry.size
            elif entry.state in (SIZING, WAITING, DOWNLOADING):
                entry.state = FAILED  # the worker sees this and drops its download
                entry.error = "released before it was staged"
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the workers and delete staged files (and the folder if it was ours)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout=30)
        with self._cond:
            for entry in self._entries.values():
                if entry.path and self.delete_after_use:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
            self._entries.clear()
        if self._own_dir:
            shutil.rmtree(self.cache_dir, ignore_errors=True)
        st = self.stats
        if st["staged"] or st["direct"] or st["failed"]:
            log.info(
                "prefetch: %d file(s) staged (%.1f MB), %d read directly (after a failed "
                "download or with the cache full of files in use), %d download(s) failed, "
                "%.1f s waited for staging",
                st["staged"], st["bytes"] / 1e6, st["direct"], st["failed"], st["wait_s"],
            )  # fmt: skip

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- worker side ---------------------------------------------------------------------
    def _staged_ahead(self) -> int:
        return sum(e.state in (SIZING, WAITING, DOWNLOADING, READY) for e in self._entries.values())

    def _fits(self, entry: _Entry) -> bool:
        return self._used_bytes + entry.size_wanted <= self.max_bytes

    def _has_room(self, entry: _Entry) -> bool:
        return self._fits(entry) and not self._earlier_waiting(entry)

    def _earlier_waiting(self, entry: _Entry) -> bool:
        """Whether a file read before ``entry`` has not reserved its bytes yet.

        Reserving in reading order means the bytes are always held by files the reader
        needs first, so it never waits for a file that waits for a later one.
        """
        return any(
            e.seq < entry.seq and e.state in (SIZING, WAITING) for e in self._entries.values()
        )

    def _next(self) -> _Entry | None:
        with self._cond:
            while not self._closed and not (
                self._queue
                and (self._staged_ahead() < self.ahead or self._entries[self._queue[0]].wanted)
            ):
                self._cond.wait()
            if self._closed:
                return None
            entry = self._entries[self._queue.popleft()]
            entry.state = SIZING
            return entry

    def _work(self) -> None:
        while (entry := self._next()) is not None:
            try:
                self._stage(entry)
            except Exception as exc:  # the reader falls back to reading the URL itself
                with self._cond:
                    if entry.size and not entry.path:
                        self._used_bytes -= entry.size
                    entry.state, entry.error = FAILED, str(exc)
                    self.stats["failed"] += 1
                    self._cond.notify_all()
                level = logging.WARNING if isinstance(exc, MuongenError) else logging.ERROR
                log.log(
                    level, "prefetch of %s failed, it will be read directly: %s", entry.url, exc
                )

    def _stage(self, entry: _Entry) -> None:
        size = files.size(entry.url, token=self.token, policy=self.policy)
        with self._cond:
            if size > self.max_bytes:
                raise MuongenError(f"{size} bytes, more than the cache's cap ({self.max_bytes})")
            entry.state, entry.size_wanted = WAITING, size
            while not self._closed and entry.state == WAITING and not self._has_room(entry):
                self._cond.wait()
            if self._closed or entry.state != WAITING:
                return
            self._used_bytes += size
            entry.size = size
            entry.state = DOWNLOADING
        name = (
            hashlib.sha256(entry.url.encode()).hexdigest()[:12] + "-" + os.path.basename(entry.url)
        )
        path = os.path.join(self.cache_dir, name)
        if not (os.path.isfile(path) and os.path.getsize(path) == size):  # kept from before
            files.get_file(
                entry.url, path, token=self.token, expected_size=size, policy=self.policy
            )
        with self._cond:
            if entry.state != DOWNLOADING or self._closed:  # released or closed meanwhile
                os.unlink(path)
                self._used_bytes -= entry.size
                return
            entry.path, entry.state = path, READY
            self.stats["staged"] += 1
            self.stats["bytes"] += size
            self._cond.notify_all()
