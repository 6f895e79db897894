"""Checkpoints: one ``<name>.pt`` holding everything, plus a ``<name>.json`` manifest.

The ``.pt`` holds both models, both optimizers, schedulers, the AMP scaler, step counters,
every RNG state, the data cursor, the resolved config, the schema version and muongen's
version. The manifest holds step, range, created time, size and sha256 of the ``.pt``.

Local writes are atomic (temp file, fsync, rename; the ``.pt`` before its manifest), and a
``.pt`` is trusted only through a manifest whose size and sha256 match it. Removing old
checkpoints deletes the manifest first, so a half-removed pair is never trusted.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from torch import nn

from muongen import __version__, schema
from muongen.errors import CheckpointError

log = logging.getLogger(__name__)

FORMAT = "muongen-checkpoint"
FORMAT_VERSION = 1
STEP_NAME = "step-{:09d}"
_STEP_RE = re.compile(r"^step-(\d{9})\.json$")


@dataclass(frozen=True)
class Saved:
    """Where a checkpoint was written and what its manifest says."""

    pt: Path
    manifest: Path
    step: int
    size: int
    sha256: str
    seconds: float


def sha256_file(path: str | os.PathLike, chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file in the same folder, fsync, rename."""
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
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def save(
    state: dict[str, Any],
    directory: str | os.PathLike,
    name: str,
    *,
    step: int,
    range_name: str | None = None,
) -> Saved:
    """Write ``<directory>/<name>.pt`` then ``<name>.json`` atomically."""
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
    torch.save(payload, buf)
    data = buf.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    pt = directory / f"{name}.pt"
    manifest = directory / f"{name}.json"
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
    atomic_write(manifest, (json.dumps(meta, indent=2) + "\n").encode())
    return Saved(pt, manifest, step, len(data), digest, time.perf_counter() - t0)


def copy_as(
    source: str | os.PathLike,
    directory: str | os.PathLike,
    name: str,
    *,
    range_name: str | None = None,
) -> Saved:
    """Copy a verified checkpoint to ``<directory>/<name>.pt`` + ``.json`` (e.g. to publish a
    run's last step checkpoint under its range's name); the bytes and sha256 are unchanged."""
    t0 = time.perf_counter()
    pt, meta = verify(source)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    dest = directory / f"{name}.pt"
    atomic_write(dest, pt.read_bytes())
    meta = {**meta, "name": name, "pt": dest.name, "range": range_name or meta.get("range")}
    manifest = directory / f"{name}.json"
    atomic_write(manifest, (json.dumps(meta, indent=2) + "\n").encode())
    return Saved(
        dest, manifest, meta["step"], meta["size"], meta["sha256"], time.perf_counter() - t0
    )


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint manifest {path} does not exist") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint manifest {path} is unreadable ({exc})") from None
    for key in ("pt", "size", "sha256", "step"):
        if key not in meta:
            raise CheckpointError(f"checkpoint manifest {path} lacks the key {key!r}")
    return meta


def manifest_for(path: str | os.PathLike) -> Path:
    """The manifest of a checkpoint given as its .pt or .json."""
    path = Path(path)
    return path.with_suffix(".json") if path.suffix == ".pt" else path


def verify(path: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """Check a checkpoint's .pt against its manifest; returns (pt path, manifest).

    Raises CheckpointError when the manifest is missing or the size/sha256 differ.
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
    digest = sha256_file(pt)
    if digest != meta["sha256"]:
        raise CheckpointError(
            f"checkpoint {pt} fails its sha256 check (manifest {mpath}): the file is corrupt; "
            "use an earlier checkpoint"
        )
    return pt, meta


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


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Manifests of step checkpoints in ``directory``, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _STEP_RE.match(p.name))


def find_latest(directory: str | os.PathLike) -> Path | None:
    """The newest checkpoint in ``directory`` that passes its sha256 check.

    A corrupt newer one is refused with a warning and the one before it is used.
    """
    for manifest in reversed(list_checkpoints(directory)):
        try:
            verify(manifest)
        except CheckpointError as exc:
            log.warning("skipping checkpoint: %s", exc)
            continue
        return manifest
    return None


def rotate(directory: str | os.PathLike, keep_last: int) -> list[Path]:
    """Remove all but the newest ``keep_last`` step checkpoints; returns what was removed."""
    removed = []
    for manifest in list_checkpoints(directory)[:-keep_last]:
        pt = manifest.with_suffix(".pt")
        manifest.unlink(missing_ok=True)  # manifest first: a lone .pt is never trusted
        pt.unlink(missing_ok=True)
        removed.append(pt)
    return removed


# --------------------------------------------------------------------------- restoring


def load_module(module: nn.Module, state: dict[str, torch.Tensor], what: str, source: Any) -> None:
    """Load weights strictly; a model of another shape is refused with a clear message."""
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        detail = "; ".join(line.strip() for line in first[1:4]) or first[0]
        raise CheckpointError(
            f"checkpoint {source} does not fit this {what}: {detail}. It was made with another "
            "model config (see its model: section, `muongen inspect-checkpoint` or the run's "
            "config.yaml); train with the same model settings or start a fresh run"
        ) from None


def load_optimizer(opt: torch.optim.Optimizer, state: dict[str, Any] | None, what: str) -> bool:
    """Load optimizer state; on a changed type or shape reset it with a warning.

    Returns True when the state was restored.
    """
    if not state:
        return False
    saved_type = state.get("type")
    if saved_type is not None and saved_type != type(opt).__name__:
        log.warning(
            "%s optimizer in the checkpoint is %s, this run uses %s: weights restored, "
            "optimizer state reset",
            what,
            saved_type,
            type(opt).__name__,
        )
        return False
    inner = state["state"] if "type" in state else state
    params = [p for group in opt.param_groups for p in group["params"]]
    for index, slot in inner.get("state", {}).items():
        moments = [v for k, v in slot.items() if torch.is_tensor(v) and k != "step"]
        index = int(index)
        if index >= len(params) or any(v.shape != params[index].shape for v in moments):
            log.warning(
                "%s optimizer state does not fit the parameters' shapes: weights restored, "
                "optimizer state reset",
                what,
            )
            return False
    try:
        opt.load_state_dict(inner)
    except (ValueError, KeyError, RuntimeError) as exc:
        log.warning(
            "%s optimizer state does not fit (%s): weights restored, optimizer reset", what, exc
        )
        return False
    return True


def optimizer_state(opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Optimizer state tagged with its type, so a changed optimizer is recognised on load."""
    return {"type": type(opt).__name__, "state": opt.state_dict()}


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


def load_for_inference(path: str | os.PathLike, device: str | torch.device = "cpu"):
    """Generator and config from a checkpoint (.pt, .json or a checkpoint folder), for
    sampling and evaluation.

    Returns:
        (generator in eval mode on ``device``, Config)
    """
    from muongen.config import from_dict
    from muongen.model import build_models

    manifest = resolve(path)
    payload = load(manifest)
    cfg = from_dict(payload["config"])
    generator, _ = build_models(cfg.model)
    load_module(generator, payload["generator"], "generator", manifest)
    return generator.to(device).eval(), cfg
