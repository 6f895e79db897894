"""What a run shows while it trains: TensorBoard, its remote sync, the GPU sampler, the
progress display, feature histograms and periodic validation, behind one ``close()``.

A stateful part of the Trainer: its ``state_dict()`` is the w_gap moving average, and a
fresh start (``reset()``) removes a previous attempt's TensorBoard event files, so a run
folder never shows two runs' curves on top of each other. A resumed run opens TensorBoard
with ``purge_step``, which hides what a killed run logged after its checkpoint.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from muongen.config import Config
from muongen.data.batch import RaggedBatch
from muongen.monitor.health import MovingAverage, classify
from muongen.monitor.tensorboard import LOSS, THROUGHPUT, VAL, W_GAP
from muongen.train import distributed as ddp

log = logging.getLogger(__name__)

EVENT_FILES = "events.out.tfevents.*"


class TrainingMonitor:
    """Logging sinks of one training process (rank 0 writes; other ranks only count)."""

    def __init__(
        self,
        cfg: Config,
        tb_dir: str | Path,
        *,
        dist: ddp.DistInfo,
        device: torch.device,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.tb_dir = Path(tb_dir)
        self.dist = dist
        self.device = device
        self.clock = clock
        self.w_gap_ma = MovingAverage(cfg.logging.ma_window)
        self.tb = self.sync = self.gpu = self.progress = self.validator = None
        self._window = {"events": 0, "muons": 0, "steps": 0, "t": clock()}

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        return {"w_gap_ma": self.w_gap_ma.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.w_gap_ma.load_state_dict(state["w_gap_ma"])

    def reset(self) -> None:
        """A fresh start: an empty moving average and no stale TensorBoard event files."""
        self.w_gap_ma = MovingAverage(self.cfg.logging.ma_window)
        if self.dist.is_main and self.tb_dir.is_dir():
            stale = list(self.tb_dir.rglob(EVENT_FILES))
            for path in stale:
                path.unlink()
            if stale:
                log.info(
                    "fresh start: removed %d old TensorBoard file(s) in %s", len(stale), self.tb_dir
                )

    # ------------------------------------------------------------------ open / close

    def open(self, step: int) -> None:
        """Start the sinks; ``step`` > 0 when resuming (TensorBoard purges what follows)."""
        from muongen.monitor.gpu import GpuMonitor
        from muongen.monitor.progress import Progress
        from muongen.monitor.tensorboard import TensorBoardLogger

        cfg, main = self.cfg, self.dist.is_main
        # purge_step: a resumed run hides what a killed run logged after its checkpoint
        self.tb = TensorBoardLogger(
            self.tb_dir,
            enabled=cfg.logging.tensorboard and main,
            purge_step=step + 1 if step else None,
        )
        self.tb.custom_scalars()
        if main and self.cfg.storage.tb_sync_url:
            from muongen.storage.tbsync import TensorBoardSync

            self.sync = TensorBoardSync(
                str(self.tb_dir), cfg.storage.tb_sync_url, cfg.storage.tb_sync_every_s
            )
            self.sync.start()
        if main and cfg.logging.gpu_monitor:
            self.gpu = GpuMonitor(self.device)
            self.gpu.start()
        if main and cfg.data.val_paths and cfg.logging.val_every:
            from muongen.evaluate.validation import Validator

            self.validator = Validator(cfg.data.val_paths, cfg, self.device)
        if main:
            self.progress = Progress(
                cfg.train.max_steps or None,
                mode=cfg.logging.progress,
                initial=step,  # a resumed run's pace counts from where it resumed
                clock=self.clock,
            )
        self._window["t"] = self.clock()

    def close(self) -> None:
        """Stop and flush every sink (also after an error); safe to call twice."""
        if self.progress:
            self.progress.close()
        if self.gpu:
            self.gpu.stop()
        if self.tb:
            self.tb.close()
        if self.sync:
            self.sync.close()
        self.tb = self.sync = self.gpu = self.progress = self.validator = None

    # ------------------------------------------------------------------ per step

    def count(self, batch: RaggedBatch) -> None:
        w = self._window
        w["events"] += batch.n_events
        w["muons"] += batch.n_muons
        w["steps"] += 1

    def log(self, step: int, out: dict[str, torch.Tensor], extra: dict[str, float]) -> None:
        """Losses, rates and ``extra`` scalars (learning rates, time split, data counters)
        at ``step``; the one host sync of a logged step."""
        keys = ("c_loss", "g_loss", "m_loss", "gp", "w_gap", "skipped")
        m = dict(zip(keys, torch.stack([out[k].detach().float() for k in keys]).tolist()))
        m["w_gap_ma"] = self.w_gap_ma.update(m["w_gap"])
        now, w = self.clock(), self._window
        dt = max(now - w["t"], 1e-9)
        world = self.dist.world_size
        m.update(
            batches_per_s=w["steps"] / dt,
            events_per_s=w["events"] / dt,
            muons_per_s=w["muons"] / dt,
            health=classify(m["c_loss"]),
        )
        w.update(events=0, muons=0, steps=0, t=now)
        if not self.dist.is_main:
            return
        # tag groups numbered so that TensorBoard opens on these (tensorboard.py says why)
        scalars = {f"{W_GAP}w_gap": m["w_gap"], f"{W_GAP}w_gap_ma": m["w_gap_ma"]}
        scalars.update({f"{LOSS}{k}": m[k] for k in ("c_loss", "g_loss", "m_loss", "gp")})
        scalars.update(
            {
                f"{THROUGHPUT}batches_per_s": m["batches_per_s"],
                f"{THROUGHPUT}events_per_s": m["events_per_s"] * world,
                f"{THROUGHPUT}muons_per_s": m["muons_per_s"] * world,
                "health/skipped_updates": m["skipped"],
                **extra,
            }
        )
        if self.gpu:
            scalars.update(self.gpu.snapshot())
        self.tb.scalars(step, scalars)
        if self.progress:
            self.progress.set_total(self.cfg.train.max_steps or None)  # the budget may cut it
            self.progress.update(
                step, {**m, **{k: v for k, v in extra.items() if k.startswith("time/")}}
            )
        if m["health"] == "critical" and math.isfinite(m["c_loss"]):
            log.warning(
                "critic loss %.1f at step %d is critical (|c_loss| > 1000)", m["c_loss"], step
            )

    def due(self, step: int, every: int) -> bool:
        return self.dist.is_main and bool(every) and step % every == 0

    @torch.no_grad()
    def histograms(self, step: int, real: RaggedBatch, generator) -> None:
        """Real vs generated feature histograms on ``real`` (features on the device).

        The noise is drawn from a fork of the RNGs (restored afterwards), so logging them
        leaves the training's draws, and so the trained model, as without them."""
        device = real.conditions.device
        devices = [device.index or 0] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, device_type=device.type):
            generator.eval()
            fake_muons = generator.generate_with_counts(real.conditions, real.counts)
            generator.train()
            _, gen_counts, _ = generator(real.conditions)
        names = (
            ["log10_energy", "x", "y"]
            if self.cfg.model.representation == "xy"
            else ["log10_energy", "r"]
        )
        self.tb.real_vs_generated(step, real.muons.float().cpu(), fake_muons.float().cpu(), names)
        for tag, counts in (("real", real.counts), ("gen", gen_counts)):
            log10_mult = torch.log10(counts.float() + 1).cpu().numpy()
            self.tb.histogram(step, f"hist/{tag}/log10_mult", log10_mult)

    def validate(self, step: int, generator) -> dict[str, float] | None:
        """Validate, log under ``val/``; returns the scalars (None where no validator runs)."""
        if self.validator is None:
            return None
        scalars, figures = self.validator.run(generator, step)
        self.tb.scalars(step, {f"{VAL}{k}": v for k, v in scalars.items()})
        for tag, fig in figures.items():
            self.tb.figure(step, f"{VAL}{tag}", fig)
        return scalars
