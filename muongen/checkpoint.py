"""The checkpoint format, in one place: save, verify, find, load, and name once.

A checkpoint is ``<name>.pt`` (one ``torch.save`` of a dict: the union of the trainer's
parts' ``state_dict()`` plus the resolved config and versions) and ``<name>.json``, its
manifest (:data:`MANIFEST_KEYS`: step, range, created time, size and sha256 of the .pt).

- Local writes are atomic (temp file, fsync, rename; the .pt before its manifest). A kill
  leaves at most a ``.*.tmp`` or a .pt without manifest, which :func:`clean_leftovers`
  removes.
- A .pt is trusted only through a manifest whose size and sha256 match it
  (:func:`verify`); :func:`read_manifest` / :func:`parse_manifest` are the one manifest
  reader, and refuse garbage, non-UTF-8 and wrong JSON with a :class:`CheckpointError`.
- The sha256 is computed once, from the bytes in memory when they are written; naming a
  checkpoint for publication (:func:`publish_once`) hard-links it and reuses that digest.
- A name given with :func:`publish_once` is final: once it holds a verified checkpoint it
  is never replaced (a retried grid node finds it and is done).

This module sits below ``train/``, ``storage/`` and ``evaluate/``: it imports neither.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from torch import nn

from muongen import __version__, schema
from muongen.errors import CheckpointError, ConfigError

log = logging.getLogger(__name__)

FORMAT = "muongen-checkpoint"
FORMAT_VERSION = 1
STEP_NAME = "step-{:09d}"
DAMAGED_DIR = "damaged"  # in a checkpoint folder: checkpoints that failed their checks, kept
_STEP_RE = re.compile(r"^step-(\d{9})\.json$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")

#: Keys every manifest has (jobs/post_check.py, which cannot import muongen, checks the same).
MANIFEST_KEYS = (
    "name",
    "pt",
    "step",
    "range",
    "created",
    "size",
    "sha256",
    "muongen_version",
    "schema_version",
)


@dataclass(frozen=True)
class Saved:
    """A checkpoint on disk: its files and what its manifest says."""

    pt: Path
    manifest: Path
    step: int
    size: int
    sha256: str
    seconds: float = 0.0


# --------------------------------------------------------------------------- writing


def sha256_file(path: str | os.PathLike, chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(directory: Path) -> None:
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file in the same folder, fsync, rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _manifest_bytes(meta: dict[str, Any]) -> bytes:
    return (json.dumps(meta, indent=2) + "\n").encode()


def canonical(obj: Any) -> Any:
    """A copy of the containers in ``obj`` in which equal strings are one object.

    Pickle refers back to a string it has already written when it meets the same object
    again, so the bytes of a state would depend on where its strings came from (a literal
    in the code, or a string read back from an earlier checkpoint): a resumed run would
    write other bytes for the same state. Interning every string makes them equal.
    """
    if type(obj) is str:
        return sys.intern(obj)
    if isinstance(obj, dict):
        new = copy.copy(obj)  # keeps the type and attributes (a state_dict's _metadata)
        new.clear()
        new.update((canonical(k), canonical(v)) for k, v in obj.items())
        if getattr(obj, "__dict__", None):
            new.__dict__.update(canonical(vars(obj)))
        return new
    if type(obj) in (list, tuple):
        return type(obj)(canonical(v) for v in obj)
    return obj


def save(
    state: dict[str, Any],
    directory: str | os.PathLike,
    name: str,
    *,
    step: int,
    range_name: str | None = None,
) -> Saved:
    """Write ``<directory>/<name>.pt`` then its manifest ``<name>.json``, both atomically."""
    t0 = time.perf_counter()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "muongen_version": __version__,
        "schema_version": schema.SCHEMA_VERSION,
        "step": step,
        "range": range_name,
        **state,
    }
    buf = io.BytesIO()
    torch.save(canonical(payload), buf)
    data = buf.getvalue()
    digest = hashlib.sha256(data).hexdigest()  # the one time these bytes are hashed
    pt, manifest = directory / f"{name}.pt", directory / f"{name}.json"
    atomic_write(pt, data)
    meta = {
        "name": name,
        "pt": pt.name,
        "step": step,
        "range": range_name,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "size": len(data),
        "sha256": digest,
        "muongen_version": __version__,
        "schema_version": schema.SCHEMA_VERSION,
    }
    atomic_write(manifest, _manifest_bytes(meta))
    return Saved(pt, manifest, step, len(data), digest, time.perf_counter() - t0)


def publish_once(
    source: Saved, directory: str | os.PathLike, name: str, *, range_name: str | None = None
) -> Saved:
    """Give checkpoint ``source`` the final name ``<directory>/<name>.pt`` + ``.json``.

    A name that already holds a verified checkpoint is final: it is kept and returned, so
    a retried node publishes nothing new. The .pt is hard-linked where the file system
    allows it (copied otherwise), and the digest is the one ``source`` was saved with.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    pt, manifest = directory / f"{name}.pt", directory / f"{name}.json"
    if manifest.exists():
        try:
            _, meta = verify(manifest)
        except CheckpointError as exc:
            log.warning("replacing an unfinished or corrupt %s: %s", manifest, exc)
        else:
            if meta["sha256"] != source.sha256:
                log.warning(
                    "%s already holds a verified checkpoint (step %d); it is final and kept "
                    "(this run's own final checkpoint is %s)",
                    manifest,
                    meta["step"],
                    source.pt,
                )
            return Saved(pt, manifest, meta["step"], meta["size"], meta["sha256"])
    if pt.resolve() != source.pt.resolve():
        for stale in directory.glob(f".{pt.name}.*.tmp"):  # a kill between link and rename
            stale.unlink(missing_ok=True)
        tmp = directory / f".{pt.name}.{os.getpid()}.tmp"
        try:
            os.link(source.pt, tmp)
        except OSError:  # another file system, or links not allowed
            shutil.copyfile(source.pt, tmp)
        os.replace(tmp, pt)
    meta = {**read_manifest(source.manifest), "name": name, "pt": pt.name}
    if range_name is not None:
        meta["range"] = range_name
    atomic_write(manifest, _manifest_bytes(meta))
    return Saved(pt, manifest, source.step, source.size, source.sha256)


# --------------------------------------------------------------------------- reading


def parse_manifest(raw: bytes, where: str | os.PathLike) -> dict[str, Any]:
    """A manifest's bytes -> its dict, every key and type checked.

    Raises:
        CheckpointError: not UTF-8 JSON, not an object, a key missing or of the wrong type.
    """
    what = f"checkpoint manifest {where}"
    fix = (
        "it is damaged or not a manifest: use the .json written beside its .pt, "
        "or another checkpoint"
    )
    try:
        meta = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise CheckpointError(f"{what} is not text (not UTF-8); {fix}") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(
            f"{what} is not valid JSON ({exc.msg}, line {exc.lineno}); {fix}"
        ) from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{what} is JSON but not an object; {fix}")
    missing = [k for k in MANIFEST_KEYS if k not in meta]
    if missing:
        raise CheckpointError(f"{what} lacks {', '.join(missing)}; {fix}")
    for key in ("step", "size"):
        value = meta[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CheckpointError(f"{what}: {key} is {value!r}, not a count; {fix}")
    if not isinstance(meta["sha256"], str) or not _SHA256_RE.match(meta["sha256"]):
        raise CheckpointError(f"{what}: sha256 {meta['sha256']!r} is not a hex digest; {fix}")
    pt = meta["pt"]
    if not isinstance(pt, str) or not pt or "/" in pt or "\\" in pt or pt in (".", ".."):
        raise CheckpointError(f"{what}: pt {pt!r} is not a file name in the same folder; {fix}")
    return meta


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """The manifest at ``path`` (see :func:`parse_manifest`)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        there = [m.name for m in list_checkpoints(path.parent)]
        hint = f"; {path.parent} holds {', '.join(there)}" if there else ""
        raise CheckpointError(f"checkpoint manifest {path} does not exist{hint}") from None
    except OSError as exc:
        raise CheckpointError(
            f"checkpoint manifest {path} cannot be read ({exc.strerror})"
        ) from None
    return parse_manifest(raw, path)


def manifest_for(path: str | os.PathLike) -> Path:
    """The manifest of a checkpoint given as its .pt or .json."""
    path = Path(path)
    return path.with_suffix(".json") if path.suffix == ".pt" else path


def verify(path: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """Check a checkpoint's .pt against its manifest; returns (pt path, manifest).

    Raises CheckpointError when the manifest is missing or invalid, or the size or sha256
    of the .pt differ from it.
    """
    mpath = manifest_for(path)
    meta = read_manifest(mpath)
    pt = mpath.parent / meta["pt"]
    if not pt.is_file():
        raise CheckpointError(f"checkpoint {pt} named by {mpath} does not exist")
    size = pt.stat().st_size
    if size != meta["size"]:
        raise CheckpointError(
            f"checkpoint {pt} is {size} bytes but its manifest says {meta['size']}: "
            "the file is truncated or was replaced; use an earlier checkpoint"
        )
    if sha256_file(pt) != meta["sha256"]:
        raise CheckpointError(
            f"checkpoint {pt} fails its sha256 check (manifest {mpath}): the file is corrupt; "
            "use an earlier checkpoint"
        )
    return pt, meta


def config_of(payload: dict[str, Any], where: str | os.PathLike) -> Any:
    """The :class:`muongen.config.Config` a checkpoint ``payload`` was trained with.

    A config that this muongen cannot read (a key it does not know, from a newer or an
    experimental muongen, or a value it rejects) raises a CheckpointError that names the
    checkpoint ``where`` and the muongen that wrote it."""
    from muongen.config import from_dict  # config imports this module

    try:
        return from_dict(payload.get("config") or {})
    except ConfigError as exc:
        wrote = payload.get("muongen_version", "an unknown version")
        raise CheckpointError(
            f"{where}: its config does not load in muongen {__version__} (the checkpoint was "
            f"written by muongen {wrote}): {exc}. Open it with the muongen that wrote it"
        ) from None


def load(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a verified checkpoint (given as .pt or .json) into a dict."""
    pt, _ = verify(path)
    try:
        payload = torch.load(pt, map_location=map_location, weights_only=False)
    except Exception as exc:  # torch raises many types for a bad pickle/zip
        raise CheckpointError(f"checkpoint {pt} cannot be read by torch ({exc})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{pt} is not a muongen checkpoint")
    if payload.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {pt} has format version {payload['format_version']}, newer than this "
            f"muongen ({__version__}) reads; upgrade muongen"
        )
    return payload


# --------------------------------------------------------------------------- a folder of them


def step_of(manifest: str | os.PathLike) -> int:
    """The step in a step checkpoint's name (``step-000000120.json`` -> 120)."""
    return int(Path(manifest).stem.split("-")[1])


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Manifests of step checkpoints in ``directory``, oldest first (not verified)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _STEP_RE.match(p.name))


def find_latest(directory: str | os.PathLike) -> Path | None:
    """The newest checkpoint in ``directory`` that passes its sha256 check.

    A corrupt newer one is skipped with a warning and the one before it is used.
    """
    for manifest in reversed(list_checkpoints(directory)):
        try:
            verify(manifest)
        except CheckpointError as exc:
            log.warning("skipping checkpoint: %s", exc)
            continue
        return manifest
    return None


def resolve(path: str | os.PathLike) -> Path:
    """The manifest of a checkpoint given as its .pt, its .json, or a checkpoint folder
    (then its newest checkpoint that passes the sha256 check)."""
    path = Path(path)
    if path.is_dir():
        found = find_latest(path)
        if found is None:
            raise CheckpointError(f"no valid checkpoint (step-*.json with its .pt) in {path}")
        return found
    return manifest_for(path)


def remove(manifest: str | os.PathLike) -> None:
    """Delete a checkpoint, manifest first: a half-removed pair is never trusted."""
    manifest = Path(manifest)
    manifest.unlink(missing_ok=True)
    manifest.with_suffix(".pt").unlink(missing_ok=True)


def set_aside(manifest: str | os.PathLike) -> Path:
    """Move a damaged checkpoint (its .pt, then its manifest) into ``<folder>/damaged/``,
    never deleting a byte: a checksum that fails on a flaky network file system may pass
    again later. A name already there gets a ``.N`` suffix. Returns the moved manifest.

    The .pt moves first: a manifest left behind by a kill fails its check again next time,
    while a .pt left without its manifest would be cleaned up as a leftover."""
    manifest = Path(manifest)
    dest = manifest.parent / DAMAGED_DIR
    dest.mkdir(exist_ok=True)
    stem, n = manifest.stem, 0
    while (dest / f"{stem}.json").exists() or (dest / f"{stem}.pt").exists():
        n += 1
        stem = f"{manifest.stem}.{n}"
    pt = manifest.with_suffix(".pt")
    if pt.exists():
        os.replace(pt, dest / f"{stem}.pt")
    if manifest.exists():
        os.replace(manifest, dest / f"{stem}.json")
    _fsync_dir(manifest.parent)
    return dest / f"{stem}.json"


def rotate(directory: str | os.PathLike, keep_last: int) -> list[Path]:
    """Remove all but the newest ``keep_last`` step checkpoints; returns the removed .pt."""
    removed = []
    for manifest in list_checkpoints(directory)[:-keep_last]:
        remove(manifest)
        removed.append(manifest.with_suffix(".pt"))
    return removed


def clean_leftovers(directory: str | os.PathLike) -> list[Path]:
    """Remove what a kill can leave in a checkpoint folder: temp files of an atomic write
    (``.*.tmp``) and step .pt files without a manifest. Returns what was removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for p in directory.iterdir():
        orphan = p.suffix == ".pt" and _STEP_RE.match(p.with_suffix(".json").name)
        if (p.name.startswith(".") and p.name.endswith(".tmp")) or (
            orphan and not p.with_suffix(".json").exists()
        ):
            p.unlink(missing_ok=True)
            removed.append(p)
    if removed:
        log.info(
            "removed %d leftover file(s) of an interrupted write in %s", len(removed), directory
        )
    return removed


# --------------------------------------------------------------------------- restoring


def _differences(prefix: str, saved: dict[str, Any], current: dict[str, Any], keys) -> list[str]:
    """``<prefix><key>: saved -> current`` for each of ``keys`` whose values differ."""
    return [
        f"{prefix}{k}: {saved.get(k)!r} in the checkpoint, {current.get(k)!r} here"
        for k in keys
        if saved.get(k) != current.get(k)
    ]


def model_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``model.<key>: saved -> current`` for every model setting that differs."""
    return _differences("model.", saved, current, sorted(set(saved) | set(current)))


def schedule_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``<key>: saved -> current`` for the settings of how a run trains (every ``optim``
    key, and ``train.max_steps`` where it is the horizon of this run's cosine decay) that
    differ between a checkpoint's config and this run's; both are whole
    :meth:`Config.to_dict` trees (a key the checkpoint lacks is not compared)."""
    old, new = saved.get("optim") or {}, current.get("optim") or {}
    changed = _differences("optim.", old, new, [k for k in sorted(new) if k in old])
    if new.get("schedule") == "cosine" and not new.get("decay_steps"):
        old_train, new_train = saved.get("train") or {}, current.get("train") or {}
        keys = ["max_steps"] if "max_steps" in old_train else []
        changed += _differences("train.", old_train, new_train, keys)
    return changed


def load_module(
    module: nn.Module,
    state: dict[str, torch.Tensor],
    what: str,
    source: Any,
    differences: list[str] | None = None,
) -> None:
    """Load weights strictly; a model of another shape is refused with a clear message
    (naming the model settings that differ, when the caller knows them)."""
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        if differences:
            detail = "; ".join(differences[:4])
        else:
            lines = str(exc).strip().splitlines()
            detail = "; ".join(line.strip() for line in lines[1:4]) or lines[0]
        raise CheckpointError(
            f"checkpoint {source} does not fit this {what} ({detail}): it was made with "
            "other model settings; train with the checkpoint's model settings or start a "
            "fresh run"
        ) from None


def load_for_training(path: str | os.PathLike) -> tuple[Path, dict[str, Any]] | None:
    """(manifest, payload) of the checkpoint given as .pt or .json, or of the newest one in
    a folder that passes its checks (corrupt newer ones are skipped with a warning; None
    when there is none). Each file is read and hashed once."""
    path = Path(path)
    if not path.is_dir():
        manifest = manifest_for(path)
        return manifest, load(manifest)
    for manifest in reversed(list_checkpoints(path)):
        try:
            return manifest, load(manifest)
        except CheckpointError as exc:
            log.warning("skipping checkpoint: %s", exc)
    return None


class Lineage:
    """A stateful part of the trainer: the previous range's checkpoint a run continued (a
    chain node's starting point), so that ``muongen inspect`` can name it. Carried through
    the run's own resumes; replaced when a run continues a checkpoint of another range."""

    follows_data = False

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.previous: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"previous": self.previous}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.previous = (state or {}).get("previous")

    def continued(self, manifest: str | os.PathLike, range_name: str | None) -> None:
        """This run continues ``manifest``; it is the previous range's when its range is
        not ``range_name`` (the run's own)."""
        meta = read_manifest(manifest)
        if meta.get("range") != range_name:
            self.previous = {k: meta.get(k) for k in ("name", "range", "step", "sha256", "created")}
