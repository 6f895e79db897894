"""Chaos: a 3-range local chain killed at random moments still ends right.

Each trial runs ``muongen chain CAMPAIGN --local`` (tiny model, synthetic data, audit on,
deterministic CPU training) and kills, with SIGKILL or SIGTERM, the chain process alone, the
running node alone, or both, in a chosen phase of the node: start-up, training, inside a
checkpoint write, or while it names and publishes its range's checkpoint. After a kill the
chain is run again (at once when it died; it retries a dead node itself) until it reports
the chain complete. Then:

- every range's checkpoint is published and passes its sha256 check;
- every range's events were consumed exactly once (the node's audit log, which follows its
  checkpoints);
- every range's published weights and optimizer state equal those of an uninterrupted
  reference chain, tensor for tensor.

The node runs through ``tests/chaos_node.py``: the real node on a slow disk (every fsync
takes longer, so kills land inside writes), which records its phase for the test.

The default run is one trial with a fixed plan that covers each target, signal and phase;
``pytest -m slow tests/test_chaos.py`` runs CHAOS_TRIALS (default 10) random trials and
prints a table of what was killed when.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from tiny import TINY as TINY_BASE

from muongen import checkpoint as ckpt
from submit import constants as C

pytestmark = pytest.mark.integration

RANGES = ["0000000-0000999", "0001000-0001999", "0002000-0002999"]
FILES_PER_RANGE = 2
EVENTS_PER_FILE = 150
NODE = Path(__file__).with_name("chaos_node.py")
TINY = [
    *TINY_BASE,
    "train.deterministic=true",
    "checkpoint.every_steps=2",
    "logging.progress=plain",
    "logging.audit_events=true",
]
TARGETS = ("chain", "node", "both")
SIGNALS = (signal.SIGKILL, signal.SIGTERM)
PHASES = ("start-up", "training", "checkpoint", "publishing")
MAX_RUNS = 25  # chain invocations per trial before the test gives up


@pytest.fixture(scope="module")
def range_data(tmp_path_factory) -> Path:
    """Three range folders of synthetic Parquet files, as production lays them out."""
    from muongen.data.synth import write_synthetic

    base = tmp_path_factory.mktemp("chaos-data")
    for i, name in enumerate(RANGES):
        write_synthetic(
            base / name, files=FILES_PER_RANGE, events_per_file=EVENTS_PER_FILE, seed=20 + i
        )
    return base


def env() -> dict[str, str]:
    # one thread per process: the machine is shared, and the reference used one thread too
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


class Chain:
    """One local chain: its campaign, work dir and checkpoint store."""

    def __init__(self, root: Path, data: Path) -> None:
        self.root, self.work, self.store = root, root / "work", root / "store"
        root.mkdir(parents=True, exist_ok=True)
        campaign = {
            "name": "chaos",
            "federation": "local",
            "data": {"base": str(data), "glob": "*.parquet"},
            "ranges": {"start": 0, "end": len(RANGES) - 1, "step": 1000},
            "training": {"preset": "demo", "overrides": TINY, "self_checkpoint_s": 0},
            "outputs": {
                "checkpoints": f"file://{self.store / 'ckpt'}",
                "tensorboard": f"file://{self.store / 'tb'}",
            },
        }
        self.campaign = root / "campaign.yaml"
        self.campaign.write_text(yaml.safe_dump(campaign))
        self.runs = 0

    def start(self) -> subprocess.Popen:
        self.runs += 1
        log = (self.root / f"chain-{self.runs}.log").open("w")
        command = [sys.executable, "-m", "muongen", "chain", str(self.campaign), "--local"]
        command += ["--workdir", str(self.work), "--retries", "5", "--backoff", "0.1"]
        command += ["--node-command", f"{sys.executable} {NODE}"]
        return subprocess.Popen(command, env=env(), stdout=log, stderr=log)

    def phase(self) -> tuple[str, str, int] | None:
        """(range, phase, node pid) the running node last recorded, if any."""
        try:
            r, phase, pid = (self.work / "chaos-phase").read_text().split()
        except (OSError, ValueError):
            return None
        return r, phase, int(pid)

    def published(self, r: str) -> Path:
        return self.store / "ckpt" / "chaos" / f"{r}.json"

    def log_tail(self) -> str:
        return (self.root / f"chain-{self.runs}.log").read_text()[-4000:]


@dataclass
class Kill:
    target: str  # chain, node or both
    signum: int
    phase: str
    hit: str = ""  # the phase the node was in when the signal went out ("" if none was sent)
    range: str = ""


@dataclass
class Trial:
    kills: list[Kill]
    runs: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) counts as dead
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def run_trial(chain: Chain, kills: list[Kill], rng: random.Random) -> Trial:
    """Run the chain until it completes, sending ``kills`` in order as their phases come."""
    trial, pending, t0 = Trial(kills), list(kills), time.monotonic()
    nodes_seen: set[int] = set()
    while chain.runs < MAX_RUNS:
        proc = chain.start()
        while proc.poll() is None:
            seen = chain.phase()
            if seen is not None:
                nodes_seen.add(seen[2])
            if pending and seen is not None and seen[1] == pending[0].phase and alive(seen[2]):
                kill = pending.pop(0)
                time.sleep(rng.uniform(0, 0.05))  # somewhere inside the phase
                kill.range, kill.hit = seen[0], (chain.phase() or seen)[1]
                if kill.target in ("node", "both"):
                    os.kill(seen[2], kill.signum)
                if kill.target in ("chain", "both"):
                    proc.send_signal(kill.signum)
            time.sleep(0.01)  # phases last longer: every fsync in them is slowed
        trial.notes.append(f"run {chain.runs}: exit {proc.returncode}")
        if proc.returncode == 0:
            break
    trial.runs, trial.seconds = chain.runs, time.monotonic() - t0
    # A node orphaned by a SIGKILLed chain ends before the re-run's node starts (node lock);
    # none may outlive the chain that completed.
    assert not [pid for pid in nodes_seen if alive(pid)], "a node process outlived the chain"
    return trial


def weights(manifest: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint's models and optimizers, by dotted name."""
    payload = ckpt.load(manifest)
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, value) -> None:
        if torch.is_tensor(value):
            flat[prefix] = value
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(f"{prefix}.{i}", v)

    for key in ("generator", "critic", "optim"):
        walk(key, payload[key])
    return flat


def check_chain(chain: Chain, reference: Chain) -> None:
    progress = json.loads((chain.work / C.PROGRESS_FILE).read_text())
    assert [progress[r]["status"] for r in RANGES] == ["done"] * len(RANGES), progress
    for r in RANGES:
        _, meta = ckpt.verify(chain.published(r))  # published, sha256 intact
        audit = chain.work / r / C.RUN_DIR.format(range=r) / "audit" / "rank0.i64"
        keys = np.fromfile(audit, dtype="<i8")
        assert len(keys) == len(np.unique(keys)) == FILES_PER_RANGE * EVENTS_PER_FILE, r
        got, want = weights(chain.published(r)), weights(reference.published(r))
        assert got.keys() == want.keys(), r
        different = [k for k in want if not torch.equal(got[k], want[k])]
        assert not different, f"range {r}: {len(different)} tensors differ, e.g. {different[:3]}"
        assert meta["step"] == ckpt.read_manifest(reference.published(r))["step"]


@pytest.fixture(scope="module")
def reference(range_data, tmp_path_factory) -> Chain:
    """The same chain, never interrupted: its nodes run one after the other in this process
    (the same code as a node process, without paying a process start-up per node)."""
    from muongen.cli import main
    from submit.campaign import load_campaign, node_arguments, plan_nodes

    chain = Chain(tmp_path_factory.mktemp("chaos-reference"), range_data)
    campaign = load_campaign(chain.campaign)
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    cwd, scratch_env = os.getcwd(), os.environ.get("_CONDOR_SCRATCH_DIR")
    torch.set_num_threads(1)  # as in the node processes (OMP_NUM_THREADS=1)
    try:
        for node in plan_nodes(campaign):
            scratch = chain.work / node.range_name
            scratch.mkdir(parents=True)
            os.chdir(scratch)
            os.environ["_CONDOR_SCRATCH_DIR"] = str(scratch)
            assert main(["chain", "--node", *node_arguments(campaign, node)]) == 0
    finally:
        os.chdir(cwd)
        if scratch_env is None:
            os.environ.pop("_CONDOR_SCRATCH_DIR", None)
        else:
            os.environ["_CONDOR_SCRATCH_DIR"] = scratch_env
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    return chain


def test_chain_survives_kills_in_every_phase(range_data, reference, tmp_path):
    # One trial, a fixed plan: each target, each signal and each phase at least once (a node
    # alone evicted by SIGTERM is tests/test_chain.py's own test).
    plan = [
        Kill("node", signal.SIGKILL, "checkpoint"),
        Kill("chain", signal.SIGTERM, "start-up"),
        Kill("both", signal.SIGKILL, "publishing"),
        Kill("chain", signal.SIGKILL, "training"),
    ]
    chain = Chain(tmp_path, range_data)
    trial = run_trial(chain, plan, random.Random(1))
    print_trials([trial])
    assert all(k.hit for k in plan), [(k.target, k.phase, k.hit) for k in plan]
    check_chain(chain, reference)


@pytest.mark.slow
def test_chain_survives_random_kills(range_data, reference, tmp_path):
    trials = int(os.environ.get("CHAOS_TRIALS", "10"))
    seed = int(os.environ.get("CHAOS_SEED", "12"))
    rng, results = random.Random(seed), []
    for i in range(trials):
        kills = [
            Kill(rng.choice(TARGETS), rng.choice(SIGNALS), rng.choice(PHASES))
            for _ in range(rng.randint(1, 4))
        ]
        chain = Chain(tmp_path / f"trial-{i}", range_data)
        trial = run_trial(chain, kills, rng)
        check_chain(chain, reference)
        results.append(trial)
    print_trials(results)


def print_trials(trials: list[Trial]) -> None:
    sent = [k for t in trials for k in t.kills if k.hit]
    by = Counter((k.target, signal.Signals(k.signum).name, k.hit) for k in sent)
    print(f"\nchaos: {len(trials)} trial(s), all complete and equal to the reference")
    print(f"  kills sent: {len(sent)}; chain runs: {sum(t.runs for t in trials)}")
    for (target, name, hit), n in sorted(by.items()):
        print(f"  {target:5s} {name:7s} during {hit:10s} x{n}")
    print(f"  seconds per trial: {[round(t.seconds) for t in trials]}")
