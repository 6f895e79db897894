"""Before a verb computes: may it write its outputs? One rule for every verb that writes.

``sample`` (file, grid, flux and its report), ``evaluate``, ``export``, ``synth`` call
:func:`check_file` / :func:`check_folder` first, so that minutes of work never end in a
traceback about a path. The rule:

- an output that is one of the verb's inputs (data files, the checkpoint) is always refused;
- an existing output file is refused unless the user passed ``--overwrite``;
- a suffix that contradicts ``--format`` (``.h5`` with ``--format v1``) is refused;
- an existing folder where a file is expected, an existing file where a folder is expected,
  a parent that is a file, and a place that cannot be written (read-only, no permission, a
  pseudo file system) are refused;

each with one line naming the path and what to do (:class:`OutputError`, exit code 2).
Writes that still fail later (a full disk) go through :func:`writing`, which turns the
OSError into the same kind of line.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from muongen.errors import MuongenError

#: suffix -> the kind of file it names; a suffix of another kind contradicts a format
SUFFIX_KINDS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".h5": "hdf5",
    ".hdf5": "hdf5",
    ".hdf": "hdf5",
    ".onnx": "onnx",
    ".pt": "torchscript",
    ".pth": "torchscript",
    ".ts": "torchscript",
}


class OutputError(MuongenError):
    """An output path cannot or may not be written (exists, is an input, wrong kind)."""


def _same(a: Path, b: str | os.PathLike) -> bool:
    b = Path(b)
    if a.resolve() == b.resolve():
        return True
    with contextlib.suppress(OSError):
        return a.exists() and b.exists() and os.path.samefile(a, b)  # hard links
    return False


def local_inputs(inputs: Iterable[str | os.PathLike | None]) -> list[str]:
    """The local files among ``inputs`` (URLs and None dropped)."""
    out = []
    for p in inputs:
        if p is None:
            continue
        p = str(p)
        if p.startswith("file://"):
            p = p[len("file://") :]
        if "://" not in p:
            out.append(p)
    return out


def _probe(folder: Path, path: Path, flag: str) -> None:
    """Raise OutputError unless a file can be created in ``folder`` (or its nearest
    existing ancestor: the verb creates the rest)."""
    here = folder
    while not here.exists():
        if here.parent == here:
            break
        here = here.parent
    if not here.is_dir():
        raise OutputError(
            f"cannot write {flag} {path}: {here} is a file, not a folder; choose another {flag}"
        )
    try:
        with tempfile.TemporaryFile(dir=here) as f:
            f.write(b"x")
            f.flush()
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise OutputError(
            f"cannot write {flag} {path}: {here} is not writable ({why}); choose a writable {flag}"
        ) from None


def check_file(
    path: str | os.PathLike,
    *,
    flag: str = "--out",
    inputs: Iterable[str | os.PathLike | None] = (),
    overwrite: bool = False,
    kind: str | None = None,
) -> Path:
    """Check that ``path`` may be written as an output file; returns it as a Path.

    Args:
        path: the output file.
        flag: the option that named it, for the message.
        inputs: the verb's input files (local ones are compared; URLs are skipped).
        overwrite: an existing file may be replaced (never an input).
        kind: the format written (``parquet``, ``hdf5``, ``onnx``, ``torchscript``); a
            suffix of another kind (:data:`SUFFIX_KINDS`) is refused.
    """
    raw = str(path)
    if "://" in raw and not raw.startswith("file://"):
        raise OutputError(
            f"{flag} {raw}: outputs are written to local files; write locally, then copy it"
        )
    path = Path(raw[len("file://") :] if raw.startswith("file://") else raw)
    for src in local_inputs(inputs):
        if _same(path, src):
            raise OutputError(
                f"{flag} {path} is one of the inputs ({src}); it is never overwritten: "
                "choose another output name"
            )
    suffix_kind = SUFFIX_KINDS.get(path.suffix.lower())
    if kind is not None and suffix_kind is not None and suffix_kind != kind:
        raise OutputError(
            f"{flag} {path}: the suffix {path.suffix} names a {suffix_kind} file, but the "
            f"--format asked for writes {kind}; change the name or the --format"
        )
    if path.is_dir():
        raise OutputError(
            f"{flag} {path} is a folder; give a file name (e.g. {path / ('out' + _example(kind))})"
        )
    if path.exists() and not overwrite:
        raise OutputError(
            f"{flag} {path} exists; pass --overwrite to replace it, or choose another name"
        )
    _probe(path.parent, path, flag)
    return path


def _example(kind: str | None) -> str:
    return {"hdf5": ".h5", "onnx": ".onnx", "torchscript": ".pt"}.get(kind or "", ".parquet")


def check_folder(
    path: str | os.PathLike,
    files: Iterable[str] = (),
    *,
    flag: str = "--out",
    inputs: Iterable[str | os.PathLike | None] = (),
    overwrite: bool = False,
) -> Path:
    """Check that ``path`` may be used as an output folder that will receive ``files``
    (names relative to it): not an existing file, writable, and none of ``files`` there
    already (unless ``overwrite``) or among the inputs."""
    raw = str(path)
    if "://" in raw and not raw.startswith("file://"):
        raise OutputError(
            f"{flag} {raw}: outputs are written to a local folder; write locally, then copy it"
        )
    path = Path(raw[len("file://") :] if raw.startswith("file://") else raw)
    if path.exists() and not path.is_dir():
        raise OutputError(
            f"{flag} {path} is a file, but a folder is written there; give a folder name "
            "(a new one, or an existing folder)"
        )
    srcs = local_inputs(inputs)
    existing = []
    for name in files:
        target = path / name
        for src in srcs:
            if _same(target, src):
                raise OutputError(
                    f"{flag} {path}: {target} is one of the inputs; it is never overwritten: "
                    "choose another output folder"
                )
        if target.exists():
            existing.append(name)
    if existing and not overwrite:
        raise OutputError(
            f"{flag} {path} already holds {', '.join(existing[:3])}"
            f"{' ...' if len(existing) > 3 else ''}; pass --overwrite to replace them, or "
            "choose another folder"
        )
    _probe(path, path, flag)
    return path


#: errno values that mean the place cannot be written (not a bug of ours)
UNWRITABLE = {
    errno.EROFS,
    errno.EACCES,
    errno.EPERM,
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EFBIG,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.ENOENT,
}


@contextlib.contextmanager
def writing(path: str | os.PathLike, flag: str = "--out") -> Iterator[None]:
    """Turn an OSError while writing ``path`` (a full disk, a folder gone read-only since
    the check) into one line naming the path and what to do."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in UNWRITABLE:
            raise
        raise OutputError(
            f"cannot write {flag} {path}: {exc.strerror or exc}; free space or choose a "
            f"writable {flag}"
        ) from None
