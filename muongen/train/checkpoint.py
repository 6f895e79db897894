"""The trainer's checkpointer: when to save, rotation, the last good checkpoint, resume.

The checkpoint format itself (files, manifest, sha256, loading) is :mod:`muongen.checkpoint`;
this module decides *when* and *which*: every ``checkpoint.every_steps`` steps or
``checkpoint.every_minutes`` minutes (on an injectable clock), keeping the newest
``checkpoint.keep_last``; what ``--resume auto|PATH`` means; and that one checkpoint
folder never holds two runs.

It also holds the optimizer-state helpers the training step uses.
"""

from __future__ import annotations

import errno
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from muongen import checkpoint as fmt
from muongen.checkpoint import (  # noqa: F401  (re-exported for code written before the move)
    STEP_NAME,
    Saved,
    atomic_write,
    find_latest,
    list_checkpoints,
    load,
    load_module,
    manifest_for,
    read_manifest,
    resolve,
    rotate,
    save,
    sha256_file,
    verify,
)
from muongen.config import CheckpointConfig
from muongen.errors import CheckpointError, StorageError
from muongen.train import distributed as ddp

log = logging.getLogger(__name__)

#: errno values that mean "this place cannot be written", reported in one line.
UNWRITABLE = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def unwritable(exc: OSError, what: str, fix: str) -> StorageError:
    """A one-line StorageError for an OSError met while writing ``what``."""
    where = f" ({exc.filename})" if exc.filename else ""
    return StorageError(f"cannot write {what}{where}: {exc.strerror or exc}; {fix}")


def check_writable(folder: Path, what: str, fix: str) -> None:
    """Create ``folder`` and a file in it, or raise a one-line StorageError naming the
    folder (not the probe's temporary file)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder) as f:
            f.write(b"x")
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise StorageError(f"cannot write {what} {folder} ({exc.strerror or exc}); {fix}") from None


class Checkpointer:
    """Saves the trainer's state on schedule into one folder that holds one run.

    Args:
        directory: the checkpoint folder (``checkpoint.dir`` or ``<run>/checkpoints``).
        cfg: the checkpoint section of the config.
        dist: this process's place in the job (rank 0 writes; every rank calls).
        range_name: written into every manifest (grid chain).
        clock: seconds, monotonic (injectable for tests).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        cfg: CheckpointConfig,
        *,
        dist: ddp.DistInfo | None = None,
        range_name: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.dir = Path(directory)
        self.cfg = cfg
        self.dist = dist or ddp.DistInfo()
        self.range_name = range_name
        self.clock = clock
        self.last_good: Path | None = None  # manifest to roll back to
        self.last_saved: fmt.Saved | None = None  # the newest checkpoint this process wrote
        self._t_last = clock()

    # ------------------------------------------------------------------ which to resume

    def find(self, how: str | None) -> tuple[Path, dict[str, Any]] | None:
        """(manifest, payload) of what ``--resume`` names: ``auto`` the newest valid
        checkpoint here (None when there is none), a path that checkpoint (.pt, .json, or a
        folder: its newest valid one); None for no resume and for ``fresh``."""
        if not how or how == "fresh":
            return None
        found = fmt.load_for_training(self.dir if how == "auto" else how)
        if found is None and how == "auto" and not fmt.list_checkpoints(self.dir):
            log.info("no checkpoint in %s: starting fresh", self.dir)
        elif found is None and how != "auto":
            raise CheckpointError(f"no valid checkpoint (step-*.json with its .pt) in {how}")
        return found

    def adopt(self, resumed: Path | None, *, fresh: bool = False) -> None:
        """Make this folder hold one run from here on: the one resumed from ``resumed`` (a
        manifest, here or elsewhere), or a fresh one (None).

        Refuses when the folder holds valid checkpoints of a run not being continued, and
        when it holds only damaged ones unless ``fresh`` (``--resume fresh``): a checksum
        that fails on a flaky file system must not silently throw days away. Removes
        leftovers of interrupted writes and valid checkpoints that are not this run's past
        (newer than the one resumed from); damaged ones are moved to ``damaged/``, never
        deleted. Rank 0 only touches files.
        """
        own = resumed is not None and resumed.parent.resolve() == self.dir.resolve()
        if not own:
            newest_valid = fmt.find_latest(self.dir)
            if newest_valid is not None:
                start = f"continue from {resumed}" if resumed else "start a fresh run"
                raise CheckpointError(
                    f"{self.dir} already holds checkpoints of a run (newest: step "
                    f"{fmt.step_of(newest_valid)}); refusing to {start} there, which would mix "
                    "two runs in one folder. Continue that run with --resume auto, or train "
                    "into another --out (or checkpoint.dir)"
                )
        self.last_good = resumed
        if not self.dist.is_main:
            return
        fmt.clean_leftovers(self.dir)
        resumed_step = fmt.step_of(resumed) if own else -1
        stale = [m for m in fmt.list_checkpoints(self.dir) if fmt.step_of(m) > resumed_step]
        damaged = []
        for manifest in stale:
            try:
                fmt.verify(manifest)
            except CheckpointError:
                damaged.append(fmt.set_aside(manifest))
                continue
            log.warning("removing %s: not part of the run continued here", manifest)
            fmt.remove(manifest)
        aside = self.dir / fmt.DAMAGED_DIR
        if resumed is None and not fresh and (damaged or fmt.list_checkpoints(aside)):
            what = (
                f"all {len(damaged)} checkpoint(s) in {self.dir} failed their checks and were "
                f"moved to {aside}/ (kept, not deleted)"
                if damaged
                else f"{self.dir} holds no valid checkpoint; its damaged ones are in {aside}/"
            )
            raise CheckpointError(
                f"{what}: refusing to start over from step 0. If the damage was transient (a "
                "network file system), move them back and --resume auto; to start a fresh "
                "run here, --resume fresh"
            )
        if damaged:
            log.warning(
                "moved %d damaged checkpoint(s) to %s/ (kept, not deleted): %s",
                len(damaged),
                aside,
                ", ".join(m.stem for m in damaged),
            )

    # ------------------------------------------------------------------ saving

    def check_writable(self, run_dir: Path | None = None) -> None:
        """The run folder (when given) and the checkpoint folder can be written, or a
        one-line StorageError that names the folder and the newest checkpoint kept there."""
        newest = fmt.list_checkpoints(self.dir)
        kept = (
            f"; its newest checkpoint {newest[-1]} is kept: continue it with --resume auto "
            "once there is room"
            if newest
            else ""
        )
        if run_dir is not None:
            check_writable(
                run_dir, "the run folder", f"free space or choose a writable --out{kept}"
            )
        check_writable(
            self.dir,
            "the checkpoint folder",
            f"free space or set checkpoint.dir (or --out) to a writable folder{kept}",
        )

    def due(self, step: int) -> tuple[bool, bool]:
        """(due by steps, due by time) after generator step ``step``."""
        every, minutes = self.cfg.every_steps, self.cfg.every_minutes
        by_steps = bool(every) and step % every == 0
        by_time = bool(minutes) and self.clock() - self._t_last > 60 * minutes
        return by_steps, by_time

    def save(self, state: dict[str, Any], step: int, again: bool = False) -> fmt.Saved | None:
        """Write ``state`` as ``step-NNNNNNNNN`` and rotate (rank 0 writes; every rank calls,
        after gathering ``state`` collectively); ``again``: also when this step is on disk
        already (its state has gained a part since: the energy calibration)."""
        name = fmt.STEP_NAME.format(step)
        if not again and self._on_disk(self.dir / f"{name}.json"):
            # this very step is on disk already (a checkpoint step, then the end of training
            # or a stop; or the step resumed from): a second copy only costs time and space
            self._t_last = self.clock()
            return self.last_saved
        saved = None
        if self.dist.is_main:
            try:
                saved = fmt.save(state, self.dir, name, step=step, range_name=self.range_name)
                fmt.rotate(self.dir, self.cfg.keep_last)
            except OSError as exc:
                last = f"the last good one is {self.last_good}" if self.last_good else "none yet"
                raise unwritable(
                    exc,
                    f"checkpoint {name} into {self.dir}",
                    f"free space or set checkpoint.dir to a writable folder ({last})",
                ) from None
            log.info(
                "checkpoint %s (step %d, %.1f MB, %.2f s)",
                saved.pt,
                step,
                saved.size / 1e6,
                saved.seconds,
            )
            self.last_saved = saved
        ddp.barrier(self.dist)
        self.last_good = self.dir / f"{name}.json"
        self._t_last = self.clock()
        return saved

    def _on_disk(self, manifest: Path) -> bool:
        """``manifest`` is this run's last good checkpoint and still there (then it is made
        :attr:`last_saved`, the checkpoint a run publishes)."""
        if self.last_good is None or not manifest.exists():
            return False
        if Path(self.last_good).absolute() != manifest.absolute():
            return False
        if self.dist.is_main and (self.last_saved is None or self.last_saved.manifest != manifest):
            meta = fmt.read_manifest(manifest)
            pt = manifest.parent / meta["pt"]
            self.last_saved = fmt.Saved(pt, manifest, meta["step"], meta["size"], meta["sha256"])
        return True


# --------------------------------------------------------------------------- optimizer state


def optimizer_state(opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Optimizer state tagged with its type, so a changed optimizer is recognised on load."""
    return {"type": type(opt).__name__, "state": opt.state_dict()}


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
