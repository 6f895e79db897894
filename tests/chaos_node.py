"""The node command of the chaos test: `muongen chain --node ARGS`, on a slow disk, telling
the test which phase it is in.

It runs the real node (``muongen.cli.main``) after wrapping a few functions so that:

- ``<workdir>/chaos-phase`` always holds ``<range> <phase> <pid>``, the phase being one of
  start-up, training, checkpoint (inside a checkpoint write), publishing (naming and
  publishing the range's final checkpoint) and done; the test reads it to kill the node,
  the chain or both in the phase it wants;
- every ``os.fsync`` takes FSYNC_DELAY_S longer (a slow disk), so that a kill lands inside a
  checkpoint write or a publish (between the temp file and its rename, between the .pt and
  its manifest) as often as elsewhere.

Nothing of the node's logic is replaced: only time passes slower and a phase is recorded.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path

FSYNC_DELAY_S = float(os.environ.get("CHAOS_FSYNC_DELAY_S", "0.05"))
PHASE_FILE = Path.cwd().parent / "chaos-phase"  # the chain runs a node in <workdir>/<range>


def _range() -> str:
    args = sys.argv[1:]
    return args[args.index("--range") + 1] if "--range" in args else "?"


RANGE = _range()


def set_phase(phase: str) -> None:
    tmp = PHASE_FILE.with_name(f".chaos-phase.{os.getpid()}")
    tmp.write_text(f"{RANGE} {phase} {os.getpid()}\n")
    os.replace(tmp, PHASE_FILE)


def in_phase(phase: str, fn, after: str | None = None):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        before = PHASE_FILE.read_text().split()[1] if PHASE_FILE.exists() else "start-up"
        set_phase(phase)
        try:
            return fn(*args, **kwargs)
        finally:
            set_phase(after or before)

    return wrapper


def slow_fsync(fsync):
    @functools.wraps(fsync)
    def wrapper(fd):
        time.sleep(FSYNC_DELAY_S)
        return fsync(fd)

    return wrapper


def main() -> int:
    set_phase("start-up")
    os.fsync = slow_fsync(os.fsync)
    from muongen import checkpoint as fmt
    from muongen.cli import main as muongen_main
    from muongen.train import command, trainer

    trainer.Trainer.train = in_phase("training", trainer.Trainer.train, after="training")
    fmt.save = in_phase("checkpoint", fmt.save)
    command.publish_final = in_phase("publishing", command.publish_final, after="done")
    return muongen_main(["chain", "--node", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
