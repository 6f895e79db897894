"""`muongen train`: config -> Trainer -> train -> publish.

Under torchrun (``torchrun --nproc_per_node N -m muongen train ...``) every process runs
this; rank 0 writes checkpoints, TensorBoard events and the run folder.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from pathlib import Path

from muongen.config import load_config, preset_names
from muongen.errors import CheckpointError, ConfigError

HELP = f"train the generator (presets: {', '.join(preset_names())}; or a YAML file)"

log = logging.getLogger(__name__)


EPILOG = """\
exit codes: 0 done; 2 a user error (config, input, checkpoint, a run folder in use by
another process), printed in one line; 3 training diverged; 85 SIGTERM before the first
step (nothing to checkpoint: run the same command again) or train.budget_exit_code after
train.time_budget_s; after SIGTERM during training: a checkpoint, then
train.signal_exit_code [0]; after Ctrl-C (SIGINT): a checkpoint, then 130 (so `muongen
train ... && next-step` does not go on); a second Ctrl-C stops at once."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--config", default="demo", help=f"preset ({', '.join(preset_names())}) or YAML file [demo]"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set optim.lr_critic=2e-5 (repeatable)",
    )
    parser.add_argument("--out", default=None, help="run folder [runs/<preset or file name>]")
    parser.add_argument(
        "--resume",
        default=None,
        metavar="auto|fresh|PATH",
        help="auto: continue this run folder's newest valid checkpoint (fresh if it has none; "
        "refused if all it has are damaged); fresh: start over even where every checkpoint "
        "is damaged (they are kept in checkpoints/damaged/); PATH: continue a checkpoint "
        ".pt/.json or folder. Without it --out must not hold a run",
    )
    parser.add_argument("--device", default=None, choices=["auto", "cpu", "cuda", "mps"])
    parser.add_argument(
        "--max-steps", type=int, default=None, help="same as --set train.max_steps=N"
    )
    parser.add_argument(
        "--range", dest="range_name", default=None, help="name of the data range (grid chain)"
    )
    parser.add_argument(
        "--publish-as", default=None, help="name of the published checkpoint [range or final]"
    )
    parser.add_argument(
        "--profile-steps", type=int, default=0, help="profile N steps first, print top ops"
    )


def run(args: argparse.Namespace) -> int:
    from muongen.train.signals import Evicted, StopRequest, active

    # `muongen train` catches signals from its first line on (muongen.cli); called any other
    # way, install here: an eviction during start-up exits 85 too
    stop = active() or StopRequest("train").install()
    try:
        return _train(args, stop)
    except Evicted as exc:
        print(f"muongen train: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        if stop is not active():
            stop.restore()


def _train(args: argparse.Namespace, stop) -> int:
    from muongen import runlock
    from muongen.train import distributed as ddp

    overrides = list(args.overrides)
    if args.device:
        overrides.append(f"train.device={args.device}")
    if args.max_steps is not None:
        overrides.append(f"train.max_steps={args.max_steps}")
    if args.max_steps == 0:
        _check_no_step_limit(args.config, args.overrides)
    cfg = load_config(args.config, overrides)
    run_dir = Path(args.out or Path("runs") / Path(args.config).stem)
    stop.signal_code = cfg.train.signal_exit_code
    stop.check()  # safe points of start-up: a signal recorded so far is acted on here

    dist = ddp.init("cuda" if cfg.train.device in ("cuda", "auto") and _has_cuda() else "cpu")
    try:
        # one process owns a run folder for the life of the run (rank 0 stands for the job)
        with runlock.hold(run_dir, "the run folder") if dist.is_main else contextlib.nullcontext():
            stop.check()
            from muongen.train.trainer import Trainer

            stop.check()
            trainer = Trainer(cfg, run_dir, dist=dist, range_name=args.range_name, stop=stop)
            stop.check()
            trainer.resume(args.resume)  # refuses a run folder that holds another run
            stop.check()
            if dist.is_main:
                log.info(
                    "run %s: %d input files, device %s, %d process(es), from step %d",
                    run_dir,
                    len(trainer.files),
                    trainer.device,
                    dist.world_size,
                    trainer.step,
                )
            code = trainer.train(profile_steps=args.profile_steps)
            if code == 0 and dist.is_main and cfg.storage.publish_url:
                publish_final(trainer, args.publish_as or args.range_name or "final")
            return stop.late(code, cfg.train.signal_exit_code)
    finally:
        ddp.close(dist)


def _check_no_step_limit(config: str, overrides: list[str]) -> None:
    """``--max-steps 0`` (train to the end of the data) where the learning rate's cosine
    takes its horizon from train.max_steps: say so in the terms the user used."""
    cfg = load_config(config, overrides)
    if cfg.optim.schedule == "cosine" and not cfg.optim.decay_steps:
        raise ConfigError(
            "--max-steps 0 means no step limit (train to the end of the data), but this "
            "config's cosine learning-rate schedule ends at the last step: give --max-steps "
            "a number of steps, or --set optim.schedule=constant"
        )


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def publish_final(trainer, name: str, stage_dir: str | Path | None = None):
    """Give the run's final checkpoint the immutable name ``name`` in ``stage_dir`` (default
    ``<run>/publish``; a hard link, not a copy) and publish it to ``storage.publish_url``
    when that is set. A name that already holds a verified checkpoint is final and kept.

    Returns:
        The named checkpoint (:class:`muongen.checkpoint.Saved`).
    """
    from muongen import checkpoint as fmt
    from muongen.storage.publish import publish_checkpoint

    saved = trainer.checkpointer.last_saved
    if saved is None:
        raise CheckpointError(
            f"nothing to publish: this run wrote no checkpoint in {trainer.ckpt_dir}"
        )
    stage_dir = Path(stage_dir or trainer.run_dir / "publish")
    staged = fmt.publish_once(saved, stage_dir, name, range_name=trainer.range_name)
    url = trainer.cfg.storage.publish_url
    if url:
        publish_checkpoint(str(staged.pt), str(staged.manifest), url, checked=True)
        log.info("published %s.pt and %s.json to %s", name, name, url)
    return staged
