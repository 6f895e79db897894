"""Copy TensorBoard event files to a remote folder every N seconds and once at the end.

A thread looks at the local log folder every ``every_s`` seconds and uploads each file
that is new or has grown since it was last uploaded (a snapshot of its current bytes, so
the writer can keep appending meanwhile). Safe across restarts: TensorBoard names event
files uniquely (time, host, pid), so a restarted job writes new files beside the old
ones; on its first pass a sync reads the sizes already on the remote side and uploads
only what is larger locally, never replacing a remote file with a shorter one.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import BinaryIO

from muongen.errors import MuongenError
from muongen.storage import files
from muongen.storage.tokens import Token

log = logging.getLogger("muongen.storage")


class TensorBoardSync:
    """Keep ``remote_url`` up to date with the files below ``local_dir``.

    Args:
        local_dir: the TensorBoard log folder (searched recursively).
        remote_url: destination folder (pelican://, osdf://, file:// or a local path).
        every_s: seconds between syncs (<= 0: only at close() and on sync()).
        token: bearer token for the uploads (default: discovered).
        start: start the thread now (else call start()).
    """

    def __init__(
        self,
        local_dir: str,
        remote_url: str,
        every_s: float = 300.0,
        *,
        token: Token | None = None,
        start: bool = True,
    ) -> None:
        self.local_dir = Path(local_dir)
        self.remote_url = remote_url.rstrip("/")
        self.every_s = every_s
        self.token = token
        self.uploads = 0
        self.last_error: str = ""
        self._remote_sizes: dict[str, int] | None = None  # learnt on the first sync
        self._lock = threading.Lock()  # one sync at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    def start(self) -> None:
        """Start the periodic thread (no-op if it runs, or if every_s <= 0)."""
        if self._thread is None and self.every_s > 0 and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="muongen-tb-sync", daemon=True)
            self._thread.start()

    def sync(self) -> int:
        """Upload new or grown files now; returns how many were uploaded."""
        with self._lock:
            if self._remote_sizes is None:
                self._remote_sizes = files.list_sizes(self.remote_url, token=self.token)
            done = 0
            for path in sorted(p for p in self.local_dir.rglob("*") if p.is_file()):
                rel = path.relative_to(self.local_dir).as_posix()
                if rel.startswith(".") or "/." in rel:
                    continue
                size = path.stat().st_size
                there = self._remote_sizes.get(rel, -1)
                if size < there:
                    log.warning(
                        "not uploading %s: the remote copy is larger (%d > %d bytes)",
                        rel,
                        there,
                        size,
                    )
                    self._remote_sizes[rel] = size  # warn once
                    continue
                if size == there or size == 0:
                    continue
                self._remote_sizes[rel] = self._upload(path, rel, size)
                done += 1
            self.uploads += done
            return done

    def _upload(self, path: Path, rel: str, size: int) -> int:
        # A snapshot of the first `size` bytes: the writer may append while we upload.
        with tempfile.TemporaryDirectory(prefix="muongen-tb-") as tmp:
            snap = os.path.join(tmp, path.name)
            with open(path, "rb") as src, open(snap, "wb") as out:
                _copy_n(src, out, size)
            return files.put_file(snap, files.join(self.remote_url, rel), token=self.token)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.sync()
                self.last_error = ""
            except MuongenError as exc:  # the next period tries again
                self.last_error = str(exc)
                log.warning("TensorBoard sync to %s failed, will retry: %s", self.remote_url, exc)

    def close(self, *, raise_errors: bool = False) -> bool:
        """Stop the thread and sync once more; returns whether that last sync worked."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=600)
            self._thread = None
        try:
            self.sync()
        except MuongenError as exc:
            self.last_error = str(exc)
            log.warning("final TensorBoard sync to %s failed: %s", self.remote_url, exc)
            if raise_errors:
                raise
            return False
        return True

    def __enter__(self) -> TensorBoardSync:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _copy_n(src: BinaryIO, out: BinaryIO, n: int) -> None:
    left = n
    while left > 0:
        block = src.read(min(left, 1 << 20))
        if not block:
            break
        out.write(block)
        left -= len(block)
