"""The Trainer: streams batches, runs the GAN step, logs, checkpoints, survives signals.

Reading order: ``Trainer.__init__`` builds everything from the config; ``train()`` is the
loop; ``train_step()`` is one generator step (n critic updates + one generator update);
``state_dict()`` / ``load_state_dict()`` are the union of the parts' states, which is all
a checkpoint holds.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from muongen import __version__, schema
from muongen.config import Config
from muongen.data.batch import RaggedBatch
from muongen.data.report import REPORT_NAME
from muongen.data.stream import files_digest
from muongen.devices import resolve_device
from muongen.errors import CheckpointError, TrainingError
from muongen.train import checkpoint as ckpt
from muongen.train import distributed as ddp

log = logging.getLogger(__name__)

EXIT_DONE = 0


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def make_prefetcher(scfg, scratch: str, rank: int, worker: int | None = None):
    """A Prefetcher staging input files ahead, its cache beside (not inside) the run folder:
    a grid node's run folder is its self-checkpoint, spooled by HTCondor at every exit 85."""
    from muongen.storage.prefetch import Prefetcher

    name = f"cache-rank{rank}" + ("" if worker is None else f"-worker{worker}")
    return Prefetcher(
        os.path.join(scfg.cache_dir or scratch, name),
        ahead=scfg.prefetch,
        max_bytes=scfg.cache_max_bytes,
        delete_after_use=scfg.delete_after_use,
        retries=scfg.retries,
    )


class Trainer:
    """One training run (one process of it, under torchrun)."""

    def __init__(
        self,
        cfg: Config,
        run_dir: str | os.PathLike,
        *,
        dist: ddp.DistInfo | None = None,
        range_name: str | None = None,
    ) -> None:
        from muongen.model import build_models
        from muongen.train.step import GanStep

        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.dist = dist or ddp.DistInfo()
        self.range_name = range_name
        self.device = resolve_device(cfg.train.device)
        self.ckpt_dir = Path(cfg.checkpoint.dir or self.run_dir / "checkpoints")
        self.tb_dir = Path(cfg.logging.tb_dir or self.run_dir / "tb")
        if cfg.train.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.dist.local_rank)
            self.device = torch.device("cuda", self.dist.local_rank)
            torch.backends.cuda.matmul.allow_tf32 = cfg.train.tf32
            torch.backends.cudnn.allow_tf32 = cfg.train.tf32

        seed_everything(cfg.train.seed)  # identical initial weights on every rank ...
        self.generator, self.critic = build_models(cfg.model)
        self.generator.to(self.device)
        self.critic.to(self.device)
        ddp.broadcast_module(self.generator, self.dist)
        ddp.broadcast_module(self.critic, self.dist)
        seed_everything(cfg.train.seed + 1000003 * self.dist.rank)  # ... different noise per rank
        self.step_fn = GanStep(
            self.generator,
            self.critic,
            cfg.optim,
            cfg.train,
            self.device,
            sync_grads=ddp.make_grad_sync(self.dist),
        )

        self.files = self._input_files()
        self.data_fingerprint = files_digest(self.files)  # a cursor only fits the same list
        self._prefetcher = self._make_prefetcher()
        self.report, self.outliers = self._make_sinks()
        self.stream = self._make_stream()

        from muongen.monitor.health import MovingAverage

        self.step = 0  # generator steps taken, over all resumed runs
        self.data_steps = 0  # of which on this run's input files (a chain node's own range)
        self.events_seen = 0
        self.muons_seen = 0
        self.nonfinite_total = 0
        self.rollbacks = 0
        self.w_gap_ma = MovingAverage(cfg.logging.ma_window)
        self._consecutive_skips = torch.zeros((), dtype=torch.int64, device=self.device)
        self._stop_signal: int | None = None
        self._last_good: Path | None = None
        self._audit_pending: list[torch.Tensor] = []
        self.unused_tail_events = 0
        self.timer = None  # a monitor.timing.StepTimer while train() runs
        self._audit_path = self.run_dir / "audit" / f"rank{self.dist.rank}.i64"

    # ------------------------------------------------------------------ building

    def _input_files(self) -> list[str]:
        from muongen.storage import expand_inputs
        from muongen.storage import files as storage_files
        from muongen.storage.access import check_access

        cfg = self.cfg.data
        if not cfg.paths:
            raise TrainingError("no inputs: set data.paths (files, folders, globs or URLs)")
        storage_files.configure(self.cfg.storage)
        if cfg.synth_if_missing:
            self._synthesise_if_missing(cfg.paths[0])
        # Tokens and reachability are checked before any training: a missing scope fails
        # now with a clear message, not hours into the run.
        outputs = [u for u in (self.cfg.storage.publish_url, self.cfg.storage.tb_sync_url) if u]
        for line in check_access(cfg.paths, outputs if self.dist.is_main else []):
            log.info("access: %s", line)
        return expand_inputs(cfg.paths)

    def _synthesise_if_missing(self, folder: str) -> None:
        from muongen.data.synth import write_synthetic

        if "://" in folder or any(c in folder for c in "*?["):
            raise TrainingError(
                f"data.synth_if_missing needs data.paths[0] to be a local folder, not {folder}"
            )
        path = Path(folder)
        if self.dist.is_main and not (path.is_dir() and any(path.rglob("*.parquet"))):
            cfg = self.cfg.data
            log.info(
                "no data in %s: writing %d synthetic files of %d events (muongen synth)",
                path,
                cfg.synth_files,
                cfg.synth_events_per_file,
            )
            write_synthetic(
                path,
                files=cfg.synth_files,
                events_per_file=cfg.synth_events_per_file,
                seed=self.cfg.train.seed,
                mix=cfg.synth_mix,
            )
        ddp.barrier(self.dist)

    def _make_prefetcher(self):
        scfg = self.cfg.storage
        if scfg.prefetch <= 0 or self.cfg.data.num_workers > 0:
            return None  # DataLoader workers are other processes: each makes its own
        return make_prefetcher(scfg, str(self.run_dir.parent), self.dist.rank)

    def _prefetcher_factory(self):
        if self.cfg.storage.prefetch <= 0 or self.cfg.data.num_workers == 0:
            return None
        return functools.partial(
            make_prefetcher, self.cfg.storage, str(self.run_dir.parent), self.dist.rank
        )

    def _make_sinks(self):
        from muongen.data.outliers import OutlierWriter
        from muongen.data.report import BadInputReport

        out = Path(self.cfg.data.outlier_dir or self.run_dir / "outliers")
        if self.dist.enabled:
            out = out / f"rank{self.dist.rank}"
        return BadInputReport(), OutlierWriter(out, self.cfg.data.outlier_shard_events)

    def _make_stream(self):
        from muongen.data.stream import EventStream

        return EventStream(
            self.files,
            self.cfg.data,
            rank=self.dist.rank,
            world_size=self.dist.world_size,
            seed=self.cfg.train.seed,
            prefetcher=self._prefetcher,
            prefetcher_factory=self._prefetcher_factory(),
            outliers=self.outliers,
            report=self.report,
        )

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Everything a checkpoint holds. Collective under torchrun: call on every rank."""
        per_rank = ddp.gather_objects(
            {"data": self.stream.state_dict(), "rng": rng_state(), "audit": self._audit_flush()},
            self.dist,
        )
        return {
            "generator": self.generator.state_dict(),
            "critic": self.critic.state_dict(),
            "optim": self.step_fn.state_dict(),
            "trainer": {
                "step": self.step,
                "events_seen": self.events_seen,
                "muons_seen": self.muons_seen,
                "nonfinite_total": self.nonfinite_total,
                "rollbacks": self.rollbacks,
                "w_gap_ma": self.w_gap_ma.state_dict(),
            },
            "data": {
                "fingerprint": self.data_fingerprint,
                "steps": self.data_steps,
                "world_size": self.dist.world_size,
                "ranks": [r["data"] for r in per_rank],
            },
            "rng": [r["rng"] for r in per_rank],
            "audit_bytes": [r["audit"] for r in per_rank],
            "config": self.cfg.to_dict(),
            "muongen_version": __version__,
        }

    def load_state_dict(self, payload: dict[str, Any], source: Any = "checkpoint") -> None:
        """Restore from a checkpoint payload.

        Weights must fit (else CheckpointError); an optimizer of another type or shape is
        reset with a warning. The data cursor is restored only when the checkpoint was
        made on the same input files (a chain node starts its own range from the top).
        """
        ckpt.load_module(self.generator, payload["generator"], "generator", source)
        ckpt.load_module(self.critic, payload["critic"], "critic", source)
        self.step_fn.load_state_dict(payload.get("optim") or {})
        t = payload.get("trainer", {})
        self.step = int(t.get("step", payload.get("step", 0)))
        self.events_seen = int(t.get("events_seen", 0))
        self.muons_seen = int(t.get("muons_seen", 0))
        self.nonfinite_total = int(t.get("nonfinite_total", 0))
        self.rollbacks = int(t.get("rollbacks", 0))
        if "w_gap_ma" in t:
            self.w_gap_ma.load_state_dict(t["w_gap_ma"])

        data = payload.get("data") or {}
        same_data = data.get("fingerprint") == self.data_fingerprint
        if same_data:
            if data.get("world_size") != self.dist.world_size:
                raise CheckpointError(
                    f"checkpoint {source} was written by {data.get('world_size')} processes and "
                    f"this run has {self.dist.world_size}: its data cursor cannot be split "
                    "differently. Resume with the same number of processes"
                )
            self.stream = self._make_stream()
            self.stream.load_state_dict(data["ranks"][self.dist.rank])
            self.data_steps = int(data.get("steps", 0))
            rngs = payload.get("rng") or []
            if len(rngs) > self.dist.rank:
                set_rng_state(rngs[self.dist.rank])
            audit = payload.get("audit_bytes") or []
            if len(audit) > self.dist.rank:
                self._audit_truncate(audit[self.dist.rank])
        else:
            self.data_steps = 0
            log.info(
                "checkpoint %s was made on other input files: weights, optimizer and step "
                "restored, data starts at the beginning of this run's files",
                source,
            )
            seed_everything(self.cfg.train.seed + 1000003 * self.dist.rank + self.step)

    def save_checkpoint(self, name: str | None = None) -> ckpt.Saved | None:
        """Write a checkpoint (rank 0 writes; every rank must call). Rotates old ones."""
        state = self.state_dict()
        saved = None
        if self.dist.is_main:
            name = name or ckpt.STEP_NAME.format(self.step)
            saved = ckpt.save(
                state, self.ckpt_dir, name, step=self.step, range_name=self.range_name
            )
            ckpt.rotate(self.ckpt_dir, self.cfg.checkpoint.keep_last)
            log.info(
                "checkpoint %s (step %d, %.1f MB, %.2f s)",
                saved.pt,
                self.step,
                saved.size / 1e6,
                saved.seconds,
            )
        ddp.barrier(self.dist)
        self._last_good = self.ckpt_dir / f"{name or ckpt.STEP_NAME.format(self.step)}.json"
        return saved

    def resume(self, how: str | None) -> Path | None:
        """``auto``: the newest valid checkpoint of this run (none: fresh start); a path:
        that checkpoint (.pt or .json), which must be valid."""
        if not how:
            return None
        if how == "auto":
            found = ckpt.find_latest(self.ckpt_dir)
            if found is None:
                log.info("no checkpoint in %s: starting fresh", self.ckpt_dir)
                return None
        else:
            found = ckpt.resolve(how)  # a .pt, its .json, or a folder (newest valid)
        payload = ckpt.load(found)
        self.load_state_dict(payload, source=found)
        self._last_good = found
        log.info("resumed from %s at step %d", found, self.step)
        return found

    def _audit_flush(self) -> int:
        """Append pending event keys to this rank's audit file; returns its length in bytes.

        Called when a checkpoint is taken, so the file always matches the checkpointed state
        (a resume truncates it back to the length its checkpoint recorded).
        """
        if not self.cfg.logging.audit_events:
            return 0
        self._audit_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._audit_path, "ab") as f:
            for keys in self._audit_pending:
                f.write(keys.cpu().numpy().astype("<i8").tobytes())
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        self._audit_pending.clear()
        return size

    def _audit_truncate(self, size: int) -> None:
        self._audit_pending.clear()
        if self.cfg.logging.audit_events and self._audit_path.exists():
            with open(self._audit_path, "r+b") as f:
                f.truncate(size)

    # ------------------------------------------------------------------ one step

    def to_features(self, batch: RaggedBatch) -> RaggedBatch:
        """Physical units on the host -> model features on the device."""
        batch = batch.to(self.device, non_blocking=True)
        return RaggedBatch(
            schema.condition_features(batch.conditions),
            schema.muon_features(batch.muons, self.cfg.model.representation),
            batch.counts,
            batch.keys,
        )

    def _phase(self, name: str):
        return self.timer.phase(name) if self.timer is not None else contextlib.nullcontext()

    def train_step(self, batch: RaggedBatch) -> dict[str, torch.Tensor]:
        """One generator step on a physical batch: microbatch, move, n critic + 1 G update."""
        with self._phase("h2d"):
            parts = batch.split_by_muons(self.cfg.data.max_muons_per_batch)
            micro = [self.to_features(m) for m in parts]
        out = self.step_fn(micro)
        if self.cfg.logging.audit_events and batch.keys is not None:
            self._audit_pending.append(batch.keys.clone())
        skipped = (out["skipped"] > 0).to(torch.int64)
        self._consecutive_skips = (self._consecutive_skips + 1) * skipped
        return out

    # ------------------------------------------------------------------ the loop

    def train(self, profile_steps: int = 0) -> int:
        """Run until train.max_steps, the end of the data, a signal or the time budget.

        Returns the process exit code (0, train.signal_exit_code, train.budget_exit_code).
        """
        from muongen.data.reader import read_events
        from muongen.model.normaliser import fit_normalisers, normalisers_fitted
        from muongen.monitor.gpu import GpuMonitor
        from muongen.monitor.health import classify
        from muongen.monitor.progress import Progress
        from muongen.monitor.tensorboard import TensorBoardLogger
        from muongen.monitor.timing import StepTimer

        cfg = self.cfg
        main = self.dist.is_main
        if main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.yaml").write_text(cfg.to_yaml())
        # purge_step: a resumed run hides what a killed run logged after its checkpoint
        tb = TensorBoardLogger(
            self.tb_dir,
            enabled=cfg.logging.tensorboard and main,
            purge_step=self.step + 1 if self.step else None,
        )
        tb_sync = self._start_tb_sync() if main else None
        gpu = GpuMonitor(self.device) if cfg.logging.gpu_monitor and main else None
        if gpu:
            gpu.start()
        validator = self._make_validator() if main else None
        progress = (
            Progress(cfg.train.max_steps or None, mode=cfg.logging.progress) if main else None
        )
        old_handlers = self._install_signal_handlers()

        t_start = time.monotonic()
        t_ckpt = t_start
        window = {
            "events": 0,
            "muons": 0,
            "steps": 0,
            "t": time.monotonic(),
        }
        exit_code = EXIT_DONE
        if not normalisers_fitted(self.generator):  # a fresh run; checkpoints carry them
            sample = read_events(self.files[0], max_events=max(cfg.data.batch_events, 20000))
            fit_normalisers(self.generator, self.critic, self.to_features(sample))
        self.timer = StepTimer(self.device)
        self.step_fn.timer = self.timer  # the step times its critic / generator phases
        it = iter(self.stream)
        try:
            if profile_steps:
                self._profile(it, profile_steps)
            while not cfg.train.max_steps or self.step < cfg.train.max_steps:
                # Stop before drawing the next batch: a drawn batch counts as consumed in
                # the data cursor, so checkpointing after drawing it would skip it on resume.
                budget_up = (
                    cfg.train.time_budget_s > 0
                    and time.monotonic() - t_start > cfg.train.time_budget_s
                )
                stop, budget = ddp.agree(
                    [int(self._stop_signal is not None), int(budget_up)], self.dist, self.device
                )
                if stop or budget:
                    self.save_checkpoint()
                    exit_code = cfg.train.signal_exit_code if stop else cfg.train.budget_exit_code
                    why = "signal" if stop else f"time budget of {cfg.train.time_budget_s:.0f} s"
                    log.info("stopping after %s: checkpoint written, exit code %d", why, exit_code)
                    break
                with self.timer.phase("data_wait"):
                    batch = next(it, None)
                (exhausted,) = ddp.agree([int(batch is None)], self.dist, self.device)
                if exhausted:
                    if batch is not None:  # another rank ran out first (uneven shards)
                        self.unused_tail_events = batch.n_events + sum(b.n_events for b in it)
                        log.warning(
                            "rank %d: another rank ran out of data first; %d events of this "
                            "rank's shard were not trained on (recorded in summary.json)",
                            self.dist.rank,
                            self.unused_tail_events,
                        )
                    log.info("end of data after %d epoch(s)", self.stream.epoch)
                    break

                out = self.train_step(batch)
                self.step += 1
                self.data_steps += 1
                self.events_seen += batch.n_events
                self.muons_seen += batch.n_muons
                window["events"] += batch.n_events
                window["muons"] += batch.n_muons
                window["steps"] += 1

                if self.step % min(cfg.train.log_every, 10) == 0 or self.device.type == "cpu":
                    it = self._check_nonfinite(it)
                if self.step % cfg.train.log_every == 0:
                    self._log(out, window, tb, gpu, progress, classify)
                if main and cfg.logging.hist_every and self.step % cfg.logging.hist_every == 0:
                    self._log_histograms(batch, tb)
                if validator and cfg.logging.val_every and self.step % cfg.logging.val_every == 0:
                    self._validate(validator, tb)
                due_steps = (
                    cfg.checkpoint.every_steps and self.step % cfg.checkpoint.every_steps == 0
                )
                due_time = (
                    cfg.checkpoint.every_minutes
                    and time.monotonic() - t_ckpt > 60 * cfg.checkpoint.every_minutes
                )
                (due_time,) = ddp.agree([int(bool(due_time))], self.dist, self.device)
                if due_steps or due_time:
                    self.save_checkpoint()
                    t_ckpt = time.monotonic()
            else:
                log.info("reached train.max_steps=%d", cfg.train.max_steps)

            if exit_code == EXIT_DONE:
                self.save_checkpoint()
                self._write_summary(time.monotonic() - t_start)
        finally:
            self._restore_signal_handlers(old_handlers)
            self.outliers.close()
            if main:
                self.report.write(self.run_dir / REPORT_NAME)
            if self._prefetcher is not None:
                self._prefetcher.close()
            if progress:
                progress.close()
            if gpu:
                gpu.stop()
            tb.close()
            if tb_sync:
                tb_sync.close()
        if main:
            log.info("checkpoints: %s", self.ckpt_dir)
            log.info("tensorboard: tensorboard --logdir %s", self.tb_dir)
        return exit_code

    # ------------------------------------------------------------------ health

    def _check_nonfinite(self, it):
        """Roll back to the last good checkpoint after a run of non-finite steps."""
        consecutive = int(self._consecutive_skips)
        if consecutive < self.cfg.train.nonfinite_rollback_after:
            return it
        self.nonfinite_total += consecutive
        self.rollbacks += 1
        if self.rollbacks > self.cfg.train.max_rollbacks:
            raise TrainingError(
                f"{consecutive} non-finite steps in a row at step {self.step} and "
                f"{self.rollbacks - 1} rollbacks already: the run diverges. Lower the learning "
                "rates (optim.lr_generator / optim.lr_critic), enable optim.grad_clip, or check "
                f"the inputs (see {self.run_dir / REPORT_NAME})"
            )
        if self._last_good is None:
            raise TrainingError(
                f"{consecutive} non-finite steps in a row at step {self.step} before any "
                "checkpoint exists: lower the learning rates or enable optim.grad_clip"
            )
        log.warning(
            "%d non-finite steps in a row at step %d: rolling back to %s (rollback %d of %d)",
            consecutive,
            self.step,
            self._last_good,
            self.rollbacks,
            self.cfg.train.max_rollbacks,
        )
        rollbacks = self.rollbacks
        self.load_state_dict(ckpt.load(self._last_good), source=self._last_good)
        self.rollbacks = rollbacks
        seed_everything(self.cfg.train.seed + 7919 * rollbacks + self.dist.rank)  # new noise
        self._consecutive_skips.zero_()
        return iter(self.stream)

    # ------------------------------------------------------------------ logging

    def _log(self, out, window, tb, gpu, progress, classify) -> None:
        keys = ("c_loss", "g_loss", "m_loss", "gp", "w_gap", "skipped")
        values = torch.stack([out[k].detach().float() for k in keys]).tolist()  # the one sync
        m = dict(zip(keys, values))
        self.w_gap_ma.update(m["w_gap"])
        now = time.monotonic()
        dt = max(now - window["t"], 1e-9)
        m.update(
            {
                "w_gap_ma": self.w_gap_ma.value,
                "batches_per_s": window["steps"] / dt,
                "events_per_s": window["events"] / dt,
                "muons_per_s": window["muons"] / dt,
                **self.timer.snapshot(),  # time/<phase>_s and _frac since the last log
                "health": classify(m["c_loss"]),
            }
        )
        window.update(events=0, muons=0, steps=0, t=now)
        if not self.dist.is_main:
            return
        scalars = {
            "loss/c_loss": m["c_loss"],
            "loss/g_loss": m["g_loss"],
            "loss/m_loss": m["m_loss"],
            "loss/gp": m["gp"],
            "loss/w_gap": m["w_gap"],
            "loss/w_gap_ma": m["w_gap_ma"],
            "throughput/batches_per_s": m["batches_per_s"],
            "throughput/events_per_s": m["events_per_s"] * self.dist.world_size,
            "throughput/muons_per_s": m["muons_per_s"] * self.dist.world_size,
            "health/skipped_updates": m["skipped"],
            "health/rollbacks": self.rollbacks,
        }
        scalars.update({f"lr/{k}": v for k, v in self.step_fn.learning_rates().items()})
        scalars.update(
            {f"data/{k}": v for k, v in self.stream.stats.items() if isinstance(v, (int, float))}
        )
        scalars.update({k: v for k, v in m.items() if k.startswith("time/")})
        if gpu:
            scalars.update(gpu.snapshot())
        tb.scalars(self.step, scalars)
        if progress:
            progress.update(self.step, m)
        if m["health"] == "critical" and math.isfinite(m["c_loss"]):
            log.warning(
                "critic loss %.1f at step %d is critical (|c_loss| > 1000)", m["c_loss"], self.step
            )

    @torch.no_grad()
    def _log_histograms(self, batch: RaggedBatch, tb) -> None:
        """Real vs generated feature histograms on (a capped part of) this batch."""
        cap = self.cfg.logging.hist_max_muons
        cum = torch.cumsum(batch.counts, 0)
        n_ev = max(1, int(torch.searchsorted(cum, torch.tensor(cap)).item()))
        real = self.to_features(batch.slice(0, min(n_ev, batch.n_events)))
        self.generator.eval()
        fake_muons = self.generator.generate_with_counts(real.conditions, real.counts)
        self.generator.train()
        names = (
            ["log10_energy", "x", "y"]
            if self.cfg.model.representation == "xy"
            else ["log10_energy", "r"]
        )
        tb.real_vs_generated(self.step, real.muons.float().cpu(), fake_muons.float().cpu(), names)
        tb.histogram(
            self.step, "hist/real/log10_mult", torch.log10(real.counts.float() + 1).cpu().numpy()
        )
        _, gen_counts, _ = self.generator(real.conditions)
        tb.histogram(
            self.step, "hist/gen/log10_mult", torch.log10(gen_counts.float() + 1).cpu().numpy()
        )

    def _make_validator(self):
        if not (self.cfg.data.val_paths and self.cfg.logging.val_every):
            return None
        from muongen.evaluate.validation import Validator

        return Validator(self.cfg.data.val_paths, self.cfg, self.device)

    def _validate(self, validator, tb) -> None:
        scalars, figures = validator.run(self.generator, self.step)
        tb.scalars(self.step, {f"val/{k}": v for k, v in scalars.items()})
        for tag, fig in figures.items():
            tb.figure(self.step, f"val/{tag}", fig)

    def _start_tb_sync(self):
        if not self.cfg.storage.tb_sync_url:
            return None
        from muongen.storage.tbsync import TensorBoardSync

        sync = TensorBoardSync(
            str(self.tb_dir), self.cfg.storage.tb_sync_url, self.cfg.storage.tb_sync_every_s
        )
        sync.start()
        return sync

    def _profile(self, it, steps: int) -> None:
        from muongen.monitor.profiler import profile

        def one():
            batch = next(it)
            self.train_step(batch)
            self.step += 1

        trace = profile(one, steps, self.run_dir / "profile", self.device)
        log.info("profiler trace: %s", trace)

    def _write_summary(self, seconds: float) -> None:
        unused = ddp.gather_objects(self.unused_tail_events, self.dist)  # collective
        if not self.dist.is_main:
            return
        summary = {
            "step": self.step,
            "steps_on_these_inputs": self.data_steps,
            "events_seen": self.events_seen,
            "muons_seen": self.muons_seen,
            "wall_s": round(seconds, 2),
            "nonfinite_total": self.nonfinite_total,
            "rollbacks": self.rollbacks,
            "data": self.stream.stats,
            "w_gap_ma": self.w_gap_ma.value,
            "range": self.range_name,
            "unused_tail_events_per_rank": unused,
        }
        (self.run_dir / "summary.json").write_text(
            json.dumps(summary, indent=2, default=str) + "\n"
        )

    # ------------------------------------------------------------------ signals

    def _install_signal_handlers(self):
        def handler(signum, _frame):
            if self._stop_signal is not None and signum == signal.SIGINT:
                raise KeyboardInterrupt  # a second Ctrl-C stops at once
            self._stop_signal = signum
            log.warning(
                "received %s: will checkpoint and stop after this step", signal.Signals(signum).name
            )

        old = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            # ValueError: not the main thread (tests calling train() in a thread)
            with contextlib.suppress(ValueError):
                old[sig] = signal.signal(sig, handler)
        return old

    @staticmethod
    def _restore_signal_handlers(old) -> None:
        for sig, h in old.items():
            signal.signal(sig, h)
