"""One process at a time in a folder: a kernel file lock that dies with its holder.

A run folder (``muongen train --out``), a local chain's workdir and a grid node's scratch
dir are each owned by one process at a time. The lock is ``fcntl.flock`` on a small file
in the folder: the kernel drops it when its process ends, however it ends (a SIGKILLed
holder never blocks the next run). The file also says who holds it (host, pid, start
time), so a refused process can name the holder. The descriptor is not inherited by child
processes (a local chain's nodes take their own lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from muongen.errors import MuongenError, StorageError

log = logging.getLogger(__name__)

LOCK_FILE = ".muongen.lock"  # in a run folder or a local chain's workdir


class FolderBusy(MuongenError):
    """Another process holds the folder's lock."""


def holder(path: str | os.PathLike) -> str:
    """Who holds (or last held) the lock file ``path``: ``host H, pid P`` (or ``unknown``)."""
    try:
        info = json.loads(Path(path).read_text())
        return f"host {info['host']}, pid {info['pid']}, since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not yet said who it is"


@contextlib.contextmanager
def hold(
    folder: str | os.PathLike, what: str, *, name: str = LOCK_FILE, wait: bool = False
) -> Iterator[Path]:
    """Hold ``folder``'s lock for the ``with`` block.

    Args:
        folder: created when missing.
        what: what the folder is, for the messages ("run folder", "chain workdir").
        name: the lock file's name in ``folder``.
        wait: wait for a holder to end instead of refusing.

    Raises:
        FolderBusy: the folder is held by another process (and ``wait`` is false); the
            message names the holder's host and pid.
    """
    folder = Path(folder)
    path = folder / name
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StorageError(
            f"cannot write {what} {folder} ({exc.strerror or exc}): choose a writable folder"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = holder(path)
            if not wait:
                raise FolderBusy(
                    f"{what} {folder} is in use by another muongen process ({who}): wait for "
                    "it to end, stop it, or use another folder"
                ) from None
            log.warning("%s %s is in use (%s): waiting for it to end", what, folder, who)
            fcntl.flock(fd, fcntl.LOCK_EX)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        info = {"host": socket.gethostname(), "pid": os.getpid(), "since": stamp}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        yield path
    finally:
        os.close(fd)  # releases the lock
