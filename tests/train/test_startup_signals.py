"""SIGTERM at random moments of a real `muongen train` / `muongen chain --node` process.

The handler used to raise wherever the signal landed: inside ``import torch`` (swallowed by
its C start-up: the eviction was ignored and the run trained to the end with rc 0) or
half-way through numpy's imports (a 20-40 line traceback). Every SIGTERM from 0.4 s after
launch must end with the documented code (85: a node, or ``train.signal_exit_code=85``)
and no traceback, wherever it lands: imports, config, data listing, model build, resume,
training, the final checkpoint, or while the interpreter exits.

The default run sends a few signals at fixed moments; ``pytest -m slow`` sends
SIGTERM_TRIALS (default 50) at random moments over the whole life of the process and
prints the counts.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from .conftest import tiny_overrides

EXIT = 85


def command(kind: str, data, work) -> list[str]:
    sets = [*tiny_overrides(data), "train.signal_exit_code=85", "checkpoint.every_steps=4"]
    if kind == "train":
        argv = ["train", "--config", "demo", "--out", str(work / "run"), "--max-steps", "12"]
    else:  # a node trains its range (the data) once; data.paths is the node's own
        sets = [s for s in sets if not s.startswith("data.paths=")]
        argv = ["chain", "--node", "--range", "0000000-0000999", "--preset", "demo"]
        argv += ["--data", f"{data}/000000[01].parquet", "--scratch", str(work / "scratch")]
    return [sys.executable, "-m", "muongen", *argv, *[a for s in sets for a in ("--set", s)]]


def trial(kind: str, delay: float | None, data, work) -> tuple[str, int, str]:
    """Launch, SIGTERM after ``delay`` s (None: none); returns (what happened, exit code,
    stderr)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        command(kind, data, work), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    sent = False
    if delay is not None:
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            sent = True
    _, err = proc.communicate(timeout=300)
    return ("signalled" if sent else "ended first"), proc.returncode, err.decode(errors="replace")


def check(kind: str, outcome: str, code: int, err: str) -> str:
    """'' when the run ended as documented, else what went wrong."""
    if "Traceback" in err:
        return f"traceback: {err[-1500:]}"
    if outcome == "ended first":
        return "" if code == 0 else f"ended by itself with {code}: {err[-800:]}"
    if code != EXIT:
        return f"exit {code} instead of {EXIT}: {err[-1500:]}"
    if "SIGTERM" not in err:
        return f"exit {EXIT} without a line naming SIGTERM: {err[-800:]}"
    return ""


@pytest.mark.parametrize(
    ("kind", "delay"),
    # moments inside start-up (imports, config, data listing) on any machine: a whole node
    # run took under 3 s on a quiet 2-core VM, so a later fixed moment can miss the run
    [("train", 0.4), ("train", 1.5), ("node", 1.0)],
)
def test_sigterm_during_startup_ends_with_85_and_one_line(tiny_data, tmp_path, kind, delay):
    outcome, code, err = trial(kind, delay, tiny_data, tmp_path)
    assert outcome == "signalled"
    assert check(kind, outcome, code, err) == ""


@pytest.mark.slow
def test_sigterm_at_random_moments_of_a_run(tiny_data, tmp_path):
    n = int(os.environ.get("SIGTERM_TRIALS", "50"))
    rng = random.Random(int(os.environ.get("SIGTERM_SEED", "53")))
    # how long a run lasts here, so that the signals cover all of it (and a bit after)
    spans = {}
    for kind in ("train", "node"):
        t0 = time.monotonic()
        outcome, code, err = trial(kind, None, tiny_data, tmp_path / f"{kind}-plain")
        assert code == 0, err[-2000:]
        spans[kind] = time.monotonic() - t0
    counts: collections.Counter = collections.Counter()
    failures = []
    for i in range(n):
        kind = ("train", "node")[i % 2]
        delay = rng.uniform(0.4, spans[kind] * 1.05)
        outcome, code, err = trial(kind, delay, tiny_data, tmp_path / f"t{i}")
        wrong = check(kind, outcome, code, err)
        counts[(kind, outcome, code, "ok" if not wrong else "WRONG")] += 1
        if wrong:
            failures.append(f"trial {i} ({kind}, SIGTERM at {delay:.2f} s): {wrong}")
    print(f"\nSIGTERM trials (run lasts: {', '.join(f'{k} {v:.1f} s' for k, v in spans.items())})")
    for key, count in sorted(counts.items()):
        print(f"  {key}: {count}")
    assert not failures, "\n\n".join(failures)
