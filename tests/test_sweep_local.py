"""A campaign's sweep on this machine: `muongen chain SWEEP --local --parallel N`.

Each member is a whole local chain (tiny model, synthetic ranges, audit on), then its
evaluation on held-out files, then the leaderboard. The default run stops a sweep with
SIGTERM once some member has finished a range and runs it again; ``pytest -m slow`` kills
it (SIGTERM or SIGKILL, the sweep alone) at random moments several times. Either way the
sweep must end with every member trained once over every range (its audit log: each
event once), evaluated once, and on the board once, and no process left behind.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from tiny import TINY as TINY_BASE

from muongen import checkpoint as ckpt
from muongen.cli import main
from submit import constants as C

pytestmark = pytest.mark.integration

RANGES = ["0000000-0000999", "0001000-0001999"]
FILES_PER_RANGE = 2
EVENTS_PER_FILE = 150
HELD_OUT_EVENTS = 600
TINY = [
    *TINY_BASE,
    "checkpoint.every_steps=3",
    "logging.progress=plain",
    "logging.audit_events=true",
]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Two range folders of synthetic Parquet files and a held-out file, written once."""
    from muongen.data.synth import write_synthetic

    base = tmp_path_factory.mktemp("sweep-data")
    for i, name in enumerate(RANGES):
        write_synthetic(
            base / name, files=FILES_PER_RANGE, events_per_file=EVENTS_PER_FILE, seed=30 + i
        )
    write_synthetic(base / "heldout", files=1, events_per_file=HELD_OUT_EVENTS, seed=99)
    return base


def write_sweep(
    root: Path, data: Path, values: list[float], seeds: list[int], ranges: int = 2
) -> Path:
    campaign = {
        "name": "sweep-test",
        "federation": "local",
        "data": {"base": str(data), "glob": "*.parquet"},
        "ranges": {"start": 0, "end": ranges - 1, "step": 1000},
        "training": {"preset": "demo", "overrides": TINY, "self_checkpoint_s": 0},
        "outputs": {
            "checkpoints": f"file://{root / 'store' / 'ckpt'}",
            "tensorboard": f"file://{root / 'store' / 'tb'}",
        },
        "sweep": {"parameters": {"optim.lr_critic": values}, "seeds": seeds},
        "evaluation": {"data": str(data / "heldout" / "*.parquet"), "events": HELD_OUT_EVENTS},
    }
    root.mkdir(parents=True, exist_ok=True)
    path = root / "sweep.yaml"
    path.write_text(yaml.safe_dump(campaign))
    return path


def env() -> dict[str, str]:
    # one thread per process: the machine is shared
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def sweep_command(campaign: Path, work: Path, *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "muongen", "chain", str(campaign), "--local"]
    return [*argv, "--workdir", str(work), "--backoff", "0.1", *extra]


def ranges_done(work: Path) -> int:
    """Ranges finished over all members so far."""
    n = 0
    for path in work.glob(f"*/{C.PROGRESS_FILE}"):
        try:
            progress = json.loads(path.read_text())
        except ValueError:  # being written
            continue
        n += sum(1 for e in progress.values() if e.get("status") == "done")
    return n


def processes_in(folder: Path) -> list[int]:
    """Pids of live processes whose working directory is inside ``folder``."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cwd = os.readlink(proc / "cwd")
            state = (proc / "stat").read_text().split(") ")[1][0]
        except OSError:
            continue
        if state != "Z" and cwd.startswith(str(folder)):
            found.append(int(proc.name))
    return found


def wait_gone(folder: Path, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while processes_in(folder) and time.monotonic() < end:
        time.sleep(0.2)
    assert not processes_in(folder), "a member or node process outlived the sweep"


def check_sweep(root: Path, work: Path, names: list[str], ranges: list[str]) -> None:
    """Every member once: trained over every range once, evaluated, on the board."""
    members = json.loads((work / "members.json").read_text())
    assert sorted(members) == sorted(names)
    for name in names:
        progress = json.loads((work / name / C.PROGRESS_FILE).read_text())
        assert [progress[r]["status"] for r in ranges] == ["done"] * len(ranges), name
        for r in ranges:
            published = root / "store" / "ckpt" / "sweep-test" / name / f"{r}.json"
            _, meta = ckpt.verify(published)
            assert meta["sha256"] == progress[r]["sha256"]
            audit = work / name / r / C.RUN_DIR.format(range=r) / "audit" / "rank0.i64"
            keys = np.fromfile(audit, dtype="<i8")
            assert len(keys) == len(np.unique(keys)) == FILES_PER_RANGE * EVENTS_PER_FILE
            assert list((root / "store" / "tb" / "sweep-test" / name / r).glob("events.*"))
        record = json.loads((work / name / "evaluated.json").read_text())
        assert record["sha256"] == progress[ranges[-1]]["sha256"]
        metrics = json.loads((work / name / "eval" / "metrics.json").read_text())
        assert metrics["meta"]["checkpoint"].endswith(f"{name}/{ranges[-1]}/{ranges[-1]}.json")
    board = json.loads((work / "board" / "leaderboard.json").read_text())
    assert sorted(m["name"] for m in board["members"]) == sorted(names)
    assert all(m["status"] == "ok" for m in board["members"]), board["members"]
    assert board["best"] == board["members"][0]["name"]
    by = {m["name"]: m for m in board["members"]}
    for name in names:
        assert by[name]["settings"] == members[name]["settings"]
        assert by[name]["events_seen"] == len(ranges) * FILES_PER_RANGE * EVENTS_PER_FILE
    assert "**Best member:" in (work / "board" / "leaderboard.md").read_text()


def test_sweep_stopped_and_run_again_finishes_every_member_once(data, tmp_path):
    root = tmp_path / "s"
    # one range each keeps the default run short; the slow test below runs two
    campaign = write_sweep(root, data, [1e-4, 1e-3], [0], ranges=1)
    work = root / "work"
    names = ["lr_critic_1e-4+seed_0", "lr_critic_1e-3+seed_0"]
    log = (root / "run-1.log").open("w")
    proc = subprocess.Popen(
        sweep_command(campaign, work, "--parallel", "2"), env=env(), stdout=log, stderr=log
    )
    t0 = time.monotonic()
    while ranges_done(work) < 1 and proc.poll() is None and time.monotonic() - t0 < 300:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # passed on to both members: their nodes checkpoint
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM, (root / "run-1.log").read_text()[-3000:]
    wait_gone(work)
    progress = json.loads((work / "sweep-progress.json").read_text())
    assert {e["status"] for e in progress.values()} <= {"interrupted", "done"}
    assert not (work / "board").exists()  # no board before every member ended
    done = subprocess.run(
        sweep_command(campaign, work, "--parallel", "2"),
        env=env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    wait_gone(work)
    check_sweep(root, work, names, RANGES[:1])
    # a third run has nothing left to do
    again = subprocess.run(
        sweep_command(campaign, work), env=env(), capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0 and again.stderr.count("already done") == 2, again.stderr


def test_failed_members_are_failed_rows_and_exit_2(data, tmp_path):
    # A node that always fails (exit 1, no retries): every member fails, none stops the
    # others, the board lists them as failed and the sweep exits 2 naming them.
    root = tmp_path / "f"
    campaign = write_sweep(root, data, [1e-4, 1e-3], [0], ranges=1)
    work = root / "work"
    failing = f"{sys.executable} -c 'import sys; sys.exit(1)'"
    done = subprocess.run(
        sweep_command(
            campaign, work, "--retries", "0", "--parallel", "2", "--node-command", failing
        ),
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == C.EXIT_USER_ERROR, done.stderr[-3000:]
    assert "2 of 2 sweep members failed" in done.stderr
    assert "lr_critic_1e-4+seed_0 (exit code 2" in done.stderr
    board = json.loads((work / "board" / "leaderboard.json").read_text())
    assert [m["status"] for m in board["members"]] == ["failed", "failed"]
    assert board["best"] is None


def test_sweep_arguments_are_checked(data, tmp_path, capsys):
    campaign = write_sweep(tmp_path / "a", data, [1e-4, 1e-3], [0])
    work = str(tmp_path / "a" / "work")
    assert main(["chain", str(campaign), "--local", "--workdir", work, "--member", "nope"]) == 2
    assert "--member nope: not a member" in capsys.readouterr().err
    assert main(["chain", str(campaign), "--local", "--workdir", work, "--parallel", "0"]) == 2
    assert "--parallel must be at least 1" in capsys.readouterr().err
    plain = yaml.safe_load(campaign.read_text())
    del plain["sweep"], plain["evaluation"]
    campaign.write_text(yaml.safe_dump(plain))
    assert main(["chain", str(campaign), "--local", "--workdir", work, "--parallel", "2"]) == 2
    assert "has no sweep: block" in capsys.readouterr().err


@pytest.mark.slow
def test_sweep_survives_random_kills(data, tmp_path):
    # 2 settings x 2 seeds, 2 at a time; the sweep alone is killed (SIGTERM or SIGKILL) at
    # random moments, up to 3 times, then run until it completes.
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "1")))
    root = tmp_path / "r"
    campaign = write_sweep(root, data, [1e-4, 1e-3], [0, 1])
    work = root / "work"
    names = [f"lr_critic_{v}+seed_{s}" for v in ("1e-4", "1e-3") for s in (0, 1)]
    kills, runs = 3, 0
    while runs < 12:
        runs += 1
        log = (root / f"run-{runs}.log").open("w")
        proc = subprocess.Popen(
            sweep_command(campaign, work, "--parallel", "2"), env=env(), stdout=log, stderr=log
        )
        if kills:
            kills -= 1
            time.sleep(rng.uniform(3.0, 40.0))
            if proc.poll() is None:
                proc.send_signal(rng.choice([signal.SIGTERM, signal.SIGKILL]))
        code = proc.wait(timeout=900)
        wait_gone(work)
        if code == 0:
            break
        assert code in (128 + signal.SIGTERM, -signal.SIGKILL), (
            root / f"run-{runs}.log"
        ).read_text()[-3000:]
    assert code == 0, (root / f"run-{runs}.log").read_text()[-3000:]
    check_sweep(root, work, names, RANGES)
