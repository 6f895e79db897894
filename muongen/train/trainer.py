"""The Trainer: streams batches, runs the GAN step, logs, checkpoints, survives signals.

Reading order: ``Trainer.__init__`` builds the models, the step and the stateful parts;
``resume()`` continues a checkpoint or starts fresh (resetting every part); ``train()`` is
the loop; ``train_step()`` is one generator step. A checkpoint is the union of the parts'
``state_dict()`` (see :mod:`muongen.train.parts`): weights, optimizers, counters, monitor,
and per rank the data cursor, the random states and the audit log.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from muongen import checkpoint as fmt
from muongen import schema
from muongen.config import Config
from muongen.data.batch import RaggedBatch
from muongen.data.report import REPORT_NAME
from muongen.data.stream import files_digest
from muongen.devices import resolve_device
from muongen.domain import DomainTracker
from muongen.errors import CheckpointError, InputFileError, MuongenError, TrainingError
from muongen.monitor.tensorboard import run_log_dir
from muongen.train import distributed as ddp
from muongen.train.batch_size import MuonBatch
from muongen.train.budget import StepBudget, fewest_over_ranks
from muongen.train.calibrate import CalibrationPart, fit_on_files
from muongen.train.checkpoint import UNWRITABLE, Checkpointer, unwritable
from muongen.train.monitor import TrainingMonitor
from muongen.train.muon_weight import MuonWeight
from muongen.train.parts import (
    AuditLog,
    Counters,
    PerRank,
    RngState,
    StreamState,
    Weights,
    seed_everything,
)
from muongen.train.signals import EXIT_INTERRUPTED, StopRequest

log = logging.getLogger(__name__)

EXIT_DONE = 0


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


def gan_step(generator, critic, cfg: Config, device, sync_grads):
    from muongen.train.step import GanStep

    return GanStep(generator, critic, cfg.optim, cfg.train, device, sync_grads=sync_grads)


class Trainer:
    """One training run (one process of it, under torchrun).

    Args:
        cfg: the resolved config.
        run_dir: the run folder (config.yaml, checkpoints/, tb/, audit/, summary.json).
        dist: this process's place in a torchrun job (default: a single process).
        range_name: the data range a grid node trains (written into manifests).
        clock: monotonic seconds for the time budget, checkpoint timing and rates.
        make_step: builds the training step from (generator, critic, cfg, device,
            sync_grads); default :class:`muongen.train.step.GanStep`.
        stop: the process's signal handling, installed early by the command; by default
            ``train()`` installs its own.
    """

    def __init__(
        self,
        cfg: Config,
        run_dir: str | os.PathLike,
        *,
        dist: ddp.DistInfo | None = None,
        range_name: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        make_step: Callable[..., Any] = gan_step,
        stop: StopRequest | None = None,
    ) -> None:
        from muongen.model import build_models
        from muongen.model.ema import GeneratorEMA

        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.dist = dist = dist or ddp.DistInfo()
        self.range_name = range_name
        self.clock = clock
        self.stop = stop
        self.device = resolve_device(cfg.train.device)
        if cfg.train.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        if self.device.type == "cpu" and cfg.train.cpu_threads > 0:
            torch.set_num_threads(cfg.train.cpu_threads)
        if self.device.type == "cuda":
            torch.cuda.set_device(dist.local_rank)
            self.device = torch.device("cuda", dist.local_rank)
            torch.backends.cuda.matmul.allow_tf32 = cfg.train.tf32
            torch.backends.cudnn.allow_tf32 = cfg.train.tf32

        seed_everything(cfg.train.seed)  # identical initial weights on every rank ...
        self.generator, self.critic = build_models(cfg.model)
        self.generator.to(self.device)
        self.critic.to(self.device)
        ddp.broadcast_module(self.generator, dist)
        ddp.broadcast_module(self.critic, dist)
        seed_everything(self._noise_seed(0))  # ... different noise per rank
        self.step_fn = make_step(
            self.generator, self.critic, cfg, self.device, ddp.make_grad_sync(dist)
        )
        if getattr(self.step_fn, "shards", 1) > 1:
            log.info(
                "training step: %d shards of each batch at once, %d CPU thread(s) each "
                "(train.step_shards)",
                self.step_fn.shards,
                self.step_fn.threads_per_shard,
            )

        self.files = self._input_files()
        self.data_fingerprint = files_digest(self.files)  # a cursor only fits the same list
        # data.batch_muons: the batch's events from its files' muons, decided on a fresh
        # start or restored (the stream reads data.batch_events when it iterates)
        self.batch_size = MuonBatch(cfg.data, self.files)
        self._prefetcher = self._make_prefetcher()
        self.report, self.outliers = self._make_sinks()

        self.checkpointer = Checkpointer(
            cfg.checkpoint.dir or self.run_dir / "checkpoints",
            cfg.checkpoint,
            dist=dist,
            range_name=range_name,
            clock=clock,
        )
        # default <run dir>/tb/<run name>: `tensorboard --logdir <run dir>/tb` names the run
        self.tb_dir = Path(cfg.logging.tb_dir) if cfg.logging.tb_dir else run_log_dir(self.run_dir)
        self.monitor = TrainingMonitor(cfg, self.tb_dir, dist=dist, device=self.device, clock=clock)
        self.counters = Counters()
        self.data = StreamState(self._make_stream)
        self.audit = AuditLog(
            self.run_dir / "audit" / f"rank{dist.rank}.i64", cfg.logging.audit_events
        )
        self._checkpoint_model: dict[str, Any] = {}  # model settings of the checkpoint loaded
        differences = self._model_differences
        self.parts: dict[str, Any] = {}
        self.add_part("generator", Weights(self.generator, "generator", differences))
        self.ema = None  # the generator's weight average, what sampling uses
        if cfg.optim.ema_decay > 0:
            self.ema = GeneratorEMA(self.generator, cfg.optim.ema_decay)
            self.add_part("generator_ema", self.ema)  # after the generator: reset copies it
        self.add_part("critic", Weights(self.critic, "critic", differences))
        self.add_part("optim", self.step_fn)
        self.add_part("trainer", self.counters)
        self.add_part("monitor", self.monitor)
        self.add_part("batch_size", self.batch_size)  # before "data": its stream reads it
        # optim.muon_critic_weight_rich: the per-muon critic's weight from the same rows
        self.muon_weight = MuonWeight(cfg.optim, self.batch_size.rows)
        self.add_part("muon_weight", self.muon_weight)
        self.add_part("data", PerRank(self.data, dist))
        self.add_part("rng", PerRank(RngState(lambda: self._noise_seed(self.step)), dist))
        self.add_part("audit", PerRank(self.audit, dist))
        # the domain of the training conditions (muongen.domain), merged over ranks and runs
        self.domain = DomainTracker(functools.partial(ddp.gather_objects, info=dist))
        self.add_part("domain", self.domain)
        self.lineage = fmt.Lineage()  # the previous range's checkpoint, for `muongen inspect`
        self.add_part("lineage", self.lineage)
        # train.budget_minutes: the run's length from its measured step time (after "optim":
        # restoring it sets the schedule's horizon from the restored step)
        agree = functools.partial(ddp.agree, info=dist, device=self.device)
        self.budget = StepBudget(
            cfg.train, cfg.optim, self.step_fn, clock, fewest_over_ranks(agree)
        )
        self.add_part("budget", self.budget)
        # train.calibrate_rows: the muon energies' map (and, with train.calibrate_radius,
        # the radii's), fitted when the run finishes
        self.calibration = CalibrationPart()
        self.add_part("energy_calibration", self.calibration)
        self.radius_calibration = CalibrationPart()
        self.add_part("radius_calibration", self.radius_calibration)
        self.best = None  # the best validation's checkpoint, kept when validation runs
        if cfg.data.val_paths and cfg.logging.val_every:
            from muongen.evaluate.validation import BestCheckpoint

            self.best = BestCheckpoint(self.checkpointer.dir)
            self.add_part("best", self.best)

        self._started = False
        self._consecutive_skips = torch.zeros((), dtype=torch.int64, device=self.device)
        self.unused_tail_events = 0
        self.timer = None  # a monitor.timing.StepTimer while train() runs

    def add_part(self, name: str, part: Any) -> None:
        """Register a stateful part (``state_dict``, ``load_state_dict``, ``reset``): it is
        saved in every checkpoint under ``name``, restored on resume, reset on a fresh start.
        Parts are restored in the order they were added."""
        self.parts[name] = part

    # ------------------------------------------------------------------ shortcuts

    @property
    def step(self) -> int:
        return self.counters.step

    @step.setter
    def step(self, value: int) -> None:
        self.counters.step = value

    @property
    def sampler(self):
        """The generator that sampling uses: the weight average when there is one."""
        return self.generator if self.ema is None else self.ema.module

    @property
    def events_seen(self) -> int:
        return self.counters.events_seen

    @property
    def rollbacks(self) -> int:
        return self.counters.rollbacks

    @property
    def stream(self):
        return self.data.stream

    @property
    def ckpt_dir(self) -> Path:
        return self.checkpointer.dir

    def _noise_seed(self, step: int) -> int:
        return self.cfg.train.seed + 1000003 * self.dist.rank + step

    # ------------------------------------------------------------------ building

    def _input_files(self) -> list[str]:
        from muongen.storage import expand_inputs
        from muongen.storage import files as storage_files
        from muongen.storage.access import check_access
        from muongen.train.demo_data import synthesise_if_missing

        cfg = self.cfg.data
        if not cfg.paths:
            raise TrainingError("no inputs: set data.paths (files, folders, globs or URLs)")
        storage_files.configure(self.cfg.storage)
        if cfg.synth_if_missing:
            if self.dist.is_main:
                synthesise_if_missing(cfg, self.cfg.train.seed)
            ddp.barrier(self.dist)
        # Tokens and reachability are checked before any training: a missing scope fails
        # now with a clear message, not hours into the run.
        outputs = [u for u in (self.cfg.storage.publish_url, self.cfg.storage.tb_sync_url) if u]
        for line in check_access(cfg.paths, outputs if self.dist.is_main else []):
            log.info("access: %s", line)
        return expand_inputs(cfg.paths)

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
        state = {name: part.state_dict() for name, part in self.parts.items()}
        inputs = {"fingerprint": self.data_fingerprint, "world_size": self.dist.world_size}
        return {**state, "inputs": inputs, "config": self.cfg.to_dict()}

    def load_state_dict(self, payload: dict[str, Any], source: Any = "checkpoint") -> None:
        """Restore every part from a checkpoint payload.

        Weights must fit (else CheckpointError); an optimizer of another type or shape is
        reset with a warning. Parts that follow the data (cursor, random states, audit log)
        are restored only from a checkpoint made on the same input files; from another
        input list (a chain node continuing the previous range) they start afresh. A part
        the checkpoint lacks (one newer than it) starts afresh, or, where it has
        ``missing(config)``, takes what the checkpoint's config records.
        """
        same_inputs = self._same_inputs(payload.get("inputs") or {}, source)
        for name, part in self.parts.items():
            if name in payload:
                if same_inputs or not getattr(part, "follows_data", False):
                    part.load_state_dict(payload[name])
                    continue
            elif hasattr(part, "missing"):  # a checkpoint from before this part
                part.missing(payload.get("config") or {})
                continue
            if hasattr(part, "reset"):  # (GanStep has no reset: it is freshly built)
                part.reset()

    def _same_inputs(self, inputs: dict[str, Any], source: Any) -> bool:
        if inputs.get("fingerprint") != self.data_fingerprint:
            log.warning(
                "checkpoint %s was made on other input files: weights, optimizer and step "
                "restored; the data cursor, random states and audit log start afresh on this "
                "run's %d files",
                source,
                len(self.files),
            )
            return False
        if inputs.get("world_size") != self.dist.world_size:
            raise CheckpointError(
                f"checkpoint {source} was written by {inputs.get('world_size')} processes and "
                f"this run has {self.dist.world_size}: its data cursor cannot be split "
                "differently. Resume with the same number of processes"
            )
        return True

    def _model_differences(self, _state) -> list[str]:
        return fmt.model_differences(self._checkpoint_model, self.cfg.to_dict()["model"])

    def resume(self, how: str | None = None) -> Path | None:
        """Continue a checkpoint, or start fresh; every run calls this once before training.

        ``how``: None starts fresh; ``auto`` continues the newest valid checkpoint of this
        run (fresh when there is none); a path continues that checkpoint (.pt, .json or a
        folder). A checkpoint folder holding another run is refused, never mixed into.
        """
        if self.dist.is_main:
            self.checkpointer.check_writable(self.run_dir)  # names the folder, what is kept
        found, payload = self.checkpointer.find(how) or (None, None)
        self.checkpointer.adopt(found, fresh=how == "fresh")
        if found is None:
            for part in self.parts.values():
                if hasattr(part, "reset"):
                    part.reset()
        else:
            saved_cfg = payload.get("config") or {}
            self._checkpoint_model = saved_cfg.get("model", {})
            for part in self.parts.values():
                if isinstance(part, Weights):
                    part.source = found
            self.load_state_dict(payload, source=found)
            if "domain" not in payload:  # older than the domain record
                self.domain.mark_partial()
            self.lineage.continued(found, self.range_name)
            log.info("resumed from %s at step %d", found, self.step)
            changed = fmt.schedule_differences(saved_cfg, self.cfg.to_dict())
            if changed:
                log.warning(
                    "resuming %s with training settings other than its own (this run's "
                    "apply): %s. To go on as it began, --set them back (or resume with the "
                    "config the run started from: its config.yaml)",
                    found,
                    "; ".join(changed),
                )
        self._started = True
        return found

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
        if self.ema is not None:
            self.ema.update()
        self.audit.record(batch.keys)
        skipped = (out["skipped"] > 0).to(torch.int64)
        self._consecutive_skips = (self._consecutive_skips + 1) * skipped
        return out

    # ------------------------------------------------------------------ the loop

    def train(self, profile_steps: int = 0) -> int:
        """Run until train.max_steps, the end of the data, a signal or the time budget.

        Returns the process exit code (0, train.signal_exit_code, train.budget_exit_code).
        """
        from muongen.monitor.timing import StepTimer

        cfg, main = self.cfg, self.dist.is_main
        if not self._started:
            self.resume(None)
        own_stop = self.stop is None
        stop = self.stop = self.stop or StopRequest().install()
        try:
            if main:
                (self.run_dir / "config.yaml").write_text(cfg.to_yaml())
            self.monitor.open(self.step)
            self._fit_normalisers()
            self.timer = self.step_fn.timer = StepTimer(self.device)
            stop.training = True
            code = self._loop(profile_steps)
            if code == EXIT_DONE:
                # the final step's checkpoint may be on disk already: written again with
                # the map (rank 0 fitted it; every rank agrees, the save is collective)
                (again,) = ddp.agree([int(self._calibrate())], self.dist, self.device)
                self.save_checkpoint(again=bool(again))
                self._write_summary(self.clock() - self._t_start)
        except OSError as exc:
            if exc.errno not in UNWRITABLE:
                raise
            raise unwritable(
                exc, "the run's outputs", "free space or choose a writable --out"
            ) from None
        finally:
            if own_stop:
                stop.restore()
                self.stop = None
            self._close()
        if main:
            log.info("checkpoints: %s", self.ckpt_dir)
            logdir = self.tb_dir if cfg.logging.tb_dir else self.run_dir / "tb"
            log.info("tensorboard: tensorboard --logdir %s", logdir)
        return code

    def _loop(self, profile_steps: int) -> int:
        cfg = self.cfg
        self._t_start = t_start = self.clock()
        it = iter(self.stream)
        if profile_steps:
            self._profile(it, profile_steps)
        while not cfg.train.max_steps or self.step < cfg.train.max_steps:
            # Stop before drawing the next batch: a drawn batch counts as consumed in the
            # data cursor, so checkpointing after drawing it would skip it on resume.
            budget = cfg.train.time_budget_s
            budget_up = budget > 0 and self.clock() - t_start > budget
            stop, budget_up = ddp.agree(
                [int(self.stop.requested), int(budget_up)], self.dist, self.device
            )
            if stop or budget_up:
                self.stop.acted = bool(stop)
                self.save_checkpoint()
                code = cfg.train.signal_exit_code if stop else cfg.train.budget_exit_code
                if stop and self.stop.interrupted:
                    code = EXIT_INTERRUPTED  # Ctrl-C: `muongen train ... && next` stops here
                why = self.stop.name if stop else f"time budget of {budget:.0f} s"
                log.info("stopping after %s: checkpoint written, exit code %d", why, code)
                return code
            with self.timer.phase("data_wait"):
                batch = next(it, None)
            if self._exhausted(batch, it):
                return EXIT_DONE
            out = self.train_step(batch)
            self._count(batch)
            it = self._after_step(out, batch, it)
        log.info("reached train.max_steps=%d", cfg.train.max_steps)
        return EXIT_DONE

    def _exhausted(self, batch: RaggedBatch | None, it) -> bool:
        (exhausted,) = ddp.agree([int(batch is None)], self.dist, self.device)
        if not exhausted:
            return False
        (starved,) = ddp.agree([int(self.stream.stats["events"] == 0)], self.dist, self.device)
        if starved:
            raise self._no_events()
        if batch is not None:  # another rank ran out first (uneven shards)
            self.unused_tail_events = batch.n_events + sum(b.n_events for b in it)
            log.warning(
                "rank %d: another rank ran out of data first; %d events of this rank's shard "
                "were not trained on (recorded in summary.json)",
                self.dist.rank,
                self.unused_tail_events,
            )
        log.info("end of data after %d epoch(s)", self.stream.epoch)
        return True

    def _no_events(self) -> InputFileError:
        """The error for a stream that ended before giving (some rank) a single event."""
        st = self.stream.stats
        return InputFileError(
            f"no event could be read from the {len(self.files)} input file(s) of this run"
            f"{f' (rank {self.dist.rank})' if self.dist.enabled else ''}: "
            f"{st['bad_files']} file(s) unreadable, {st['bad_events']} bad event(s), "
            f"{st['empty_dropped']} empty event(s) dropped (data.keep_empty), "
            f"{st['outliers']} outlier(s) set aside (data.max_muons_per_event); "
            f"{REPORT_NAME} in the run directory names the files and reasons; fix or replace "
            "them, or check data.paths"
        )

    def _count(self, batch: RaggedBatch) -> None:
        c = self.counters
        c.step += 1
        c.events_seen += batch.n_events
        c.muons_seen += batch.n_muons
        self.domain.update(batch.conditions)  # host-side conditions: no device sync
        self.data.steps += 1
        self.monitor.count(batch)

    def _after_step(self, out, batch: RaggedBatch, it):
        """Health check, logging, histograms, validation and checkpoint after a step."""
        cfg, step = self.cfg, self.step
        self.budget.after_step(step)  # may set train.max_steps (train.budget_minutes)
        if step % min(cfg.train.log_every, 10) == 0 or self.device.type == "cpu":
            it = self._check_nonfinite(it)
        if step % cfg.train.log_every == 0:
            self.monitor.log(step, out, self._extra_scalars())
        if self.monitor.due(step, cfg.logging.hist_every):
            self._log_histograms(batch)
        if self.monitor.due(step, cfg.logging.val_every):
            self._keep_best(self.monitor.validate(step, self.sampler))
        by_steps, by_time = self.checkpointer.due(step)
        (by_time,) = ddp.agree([int(by_time)], self.dist, self.device)
        if by_steps or by_time:
            self.save_checkpoint()
        return it

    def _keep_best(self, scalars: dict[str, float] | None) -> None:
        """Save the state as the best checkpoint when this validation's score beats
        the best so far (rank 0 validates and writes; every rank gathers the state)."""
        if self.best is None:
            return
        (better,) = ddp.agree([int(self.best.offer(scalars))], self.dist, self.device)
        if better:
            if scalars is not None:
                self.best.accept(scalars, self.step)
            state = self.state_dict()
            if self.dist.is_main:
                self.best.save(state, range_name=self.checkpointer.range_name)

    def save_checkpoint(self, again: bool = False) -> fmt.Saved | None:
        """Write a checkpoint of the current state (rank 0 writes; every rank must call);
        ``again``: also when this step's checkpoint is on disk already."""
        return self.checkpointer.save(self.state_dict(), self.step, again)

    def _fit_normalisers(self) -> None:
        from muongen.data.reader import read_events
        from muongen.model.normaliser import fit_normalisers, normalisers_fitted

        if normalisers_fitted(self.generator):  # checkpoints carry them
            return
        # a fresh run: fit on the first file that reads (with data.strict false an unreadable
        # one is skipped here, and the stream skips and reports it when it comes to it)
        for url in self.files:
            try:
                sample = read_events(url, max_events=max(self.cfg.data.batch_events, 20000))
            except InputFileError:
                if self.cfg.data.strict:
                    raise
                continue
            if sample.n_events:
                fit_normalisers(self.generator, self.critic, self.to_features(sample))
                return

    def _calibrate(self) -> bool:
        """``train.calibrate_rows``: fit the maps of the finished generator (rank 0, which
        writes the checkpoint that holds them); whether it did."""
        rows = self.cfg.train.calibrate_rows
        if rows <= 0 or not self.dist.is_main:
            return False
        try:
            states = fit_on_files(
                self.sampler,
                self.files,
                rows,
                device=self.device,
                seed=self.cfg.train.seed,
                strict=self.cfg.data.strict,
                depth_bins=self.cfg.train.calibrate_depth_bins,
                radius=self.cfg.train.calibrate_radius,
            )
            self.calibration.state = states.get("energy", {})
            self.radius_calibration.state = states.get("radius", {})
        except (MuongenError, OSError, ValueError, RuntimeError) as exc:
            # the trained model is worth more than its maps: checkpoint it without them
            log.warning(
                "calibration failed (%s); the final checkpoint is written without it "
                "(train.calibrate_rows=0 skips it)",
                exc,
            )
            self.calibration.reset()
            self.radius_calibration.reset()
        return bool(self.calibration.state)

    def _close(self) -> None:
        """Close every sink; an error while closing is logged, never raised over another."""
        for close in (self.outliers.close, self._write_report, self.monitor.close):
            try:
                close()
            except OSError as exc:
                log.warning("while closing the run's outputs: %s", exc)
        if self._prefetcher is not None:
            self._prefetcher.close()

    def _write_report(self) -> None:
        if self.dist.is_main:
            self.report.write(self.run_dir / REPORT_NAME)

    # ------------------------------------------------------------------ health

    def _check_nonfinite(self, it):
        """Roll back to the last good checkpoint after a run of non-finite steps."""
        consecutive = int(self._consecutive_skips)
        if consecutive < self.cfg.train.nonfinite_rollback_after:
            return it
        c = self.counters
        c.nonfinite_total += consecutive
        c.rollbacks += 1
        if c.rollbacks > self.cfg.train.max_rollbacks:
            raise TrainingError(
                f"{consecutive} non-finite steps in a row at step {c.step} and "
                f"{c.rollbacks - 1} rollbacks already: the run diverges. Lower the learning "
                "rates (optim.lr_generator / optim.lr_critic), enable optim.grad_clip, or check "
                f"the inputs (see {self.run_dir / REPORT_NAME})"
            )
        last_good = self.checkpointer.last_good
        if last_good is None:
            raise TrainingError(
                f"{consecutive} non-finite steps in a row at step {c.step} before any "
                "checkpoint exists: lower the learning rates or enable optim.grad_clip"
            )
        log.warning(
            "%d non-finite steps in a row at step %d: rolling back to %s (rollback %d of %d)",
            consecutive,
            c.step,
            last_good,
            c.rollbacks,
            self.cfg.train.max_rollbacks,
        )
        rollbacks = c.rollbacks
        self.load_state_dict(fmt.load(last_good), source=last_good)
        c.rollbacks = rollbacks
        seed_everything(self.cfg.train.seed + 7919 * rollbacks + self.dist.rank)  # new noise
        self._consecutive_skips.zero_()
        return iter(self.stream)

    # ------------------------------------------------------------------ logging

    def _extra_scalars(self) -> dict[str, float]:
        scalars = {f"lr/{k}": v for k, v in self.step_fn.learning_rates().items()}
        stats = self.stream.stats.items()
        scalars.update({f"data/{k}": v for k, v in stats if isinstance(v, (int, float))})
        scalars.update(self.timer.snapshot())  # time/<phase>_s and _frac since the last log
        scalars["health/rollbacks"] = self.rollbacks
        return scalars

    @torch.no_grad()
    def _log_histograms(self, batch: RaggedBatch) -> None:
        """Real vs generated feature histograms on (a capped part of) this batch."""
        cap = self.cfg.logging.hist_max_muons
        cum = torch.cumsum(batch.counts, 0)
        n_ev = max(1, int(torch.searchsorted(cum, torch.tensor(cap)).item()))
        real = self.to_features(batch.slice(0, min(n_ev, batch.n_events)))
        self.monitor.histograms(self.step, real, self.sampler)

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
        reports = ddp.gather_objects(self.report.to_dict(), self.dist)  # collective
        if not self.dist.is_main:
            return
        if len(reports) > 1:  # bad_input.json covers every rank's files, each counted once
            from muongen.data.report import BadInputReport

            self.report = BadInputReport.merged(reports)
        c = self.counters
        summary = {
            "step": c.step,
            "steps_on_these_inputs": self.data.steps,
            "events_seen": c.events_seen,
            "muons_seen": c.muons_seen,
            "wall_s": round(seconds, 2),
            "nonfinite_total": c.nonfinite_total,
            "rollbacks": c.rollbacks,
            "data": self.stream.stats,
            "w_gap_ma": self.monitor.w_gap_ma.value,
            "range": self.range_name,
            "unused_tail_events_per_rank": unused,
        }
        (self.run_dir / "summary.json").write_text(
            json.dumps(summary, indent=2, default=str) + "\n"
        )
