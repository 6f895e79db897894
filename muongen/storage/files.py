"""Opening and listing inputs through fsspec (local part; remote schemes extend this)."""

from __future__ import annotations

import glob as _glob
import os
from pathlib import Path
from typing import IO

import fsspec

from muongen.errors import StorageError

INPUT_SUFFIXES = (".parquet", ".h5", ".hdf5", ".hdf")


def is_remote(url: str) -> bool:
    """True for URLs that need the network (pelican://, osdf://, http(s)://)."""
    return "://" in url and not url.startswith("file://")


def _strip_file(url: str) -> str:
    return url[len("file://") :] if url.startswith("file://") else url


def expand_inputs(patterns: list[str] | str) -> list[str]:
    """Files, directories (searched recursively for input suffixes) and globs -> a sorted,
    de-duplicated file list. Raises StorageError naming any pattern that matches nothing."""
    if isinstance(patterns, str):
        patterns = [patterns]
    out: list[str] = []
    for pat in patterns:
        if is_remote(pat):
            raise StorageError(f"remote input {pat}: remote storage is not available in this build")
        path = _strip_file(pat)
        if any(c in path for c in "*?["):
            found = [p for p in _glob.glob(path, recursive=True) if os.path.isfile(p)]
        elif os.path.isdir(path):
            found = [str(p) for p in Path(path).rglob("*") if p.suffix in INPUT_SUFFIXES and p.is_file()]
        elif os.path.isfile(path):
            found = [path]
        else:
            raise StorageError(f"input {pat} does not exist")
        if not found:
            raise StorageError(f"input {pat} matches no files (looked for {', '.join(INPUT_SUFFIXES)})")
        out.extend(found)
    return sorted(set(out))


def open_input(url: str, mode: str = "rb") -> IO[bytes]:
    """Open an input for reading through fsspec (seekable file object)."""
    try:
        return fsspec.open(url if "://" in url else os.path.abspath(url), mode).open()
    except FileNotFoundError:
        raise StorageError(f"input {url} does not exist") from None
    except OSError as exc:
        raise StorageError(f"cannot open {url}: {exc}") from None
