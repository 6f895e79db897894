"""The chain without HTCondor: nodes over three ranges through a file:// store, retries
after an injected failure, and a node restarted after an eviction (SIGTERM)."""

from __future__ import annotations

import json
import os
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
from muongen.chain import NodeSpec, node_config
from muongen.errors import ConfigError
from submit import constants as C

pytestmark = pytest.mark.integration

RANGES = ["0000000-0000999", "0001000-0001999", "0002000-0002999"]
FILES_PER_RANGE = 2
EVENTS_PER_FILE = 150
TINY = [
    *TINY_BASE,
    "checkpoint.every_steps=3",
    "logging.progress=plain",
    "logging.audit_events=true",
]


@pytest.fixture(scope="module")
def range_data(tmp_path_factory) -> Path:
    """Three range folders of synthetic Parquet files, as production lays them out."""
    from muongen.data.synth import write_synthetic

    base = tmp_path_factory.mktemp("store") / "data"
    for i, name in enumerate(RANGES):
        write_synthetic(
            base / name,
            files=FILES_PER_RANGE,
            events_per_file=EVENTS_PER_FILE,
            seed=10 + i,
            mix="rich",
        )
    return base


def write_campaign(tmp_path: Path, base: Path, overrides: list[str] = TINY) -> Path:
    campaign = {
        "name": "test-chain",
        "federation": "local",
        "data": {"base": str(base), "glob": "*.parquet"},
        "ranges": {"start": 0, "end": 2, "step": 1000},
        "training": {"preset": "demo", "overrides": overrides, "self_checkpoint_s": 0},
        "outputs": {
            "checkpoints": f"file://{tmp_path / 'store' / 'ckpt'}",
            "tensorboard": f"file://{tmp_path / 'store' / 'tb'}",
        },
        "dagman": {"retries": 2},
    }
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(campaign))
    return path


@pytest.fixture
def env():
    """One thread per node process; the CPU is shared with the test runner."""
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def chain_command(campaign: Path, work: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "muongen",
        "chain",
        str(campaign),
        "--local",
        "--workdir",
        str(work),
        *extra,
    ]


def test_node_config_keeps_the_cosine_horizon_of_the_preset(tmp_path):
    # The demo preset decays its cosine schedule over train.max_steps=3000; a node runs its
    # range to the end (max_steps=0), so the horizon is pinned before the stop is lifted.
    spec = NodeSpec(range_name=RANGES[0], data="d/*.parquet", preset="demo")
    cfg = node_config(spec, tmp_path / "run")
    assert cfg.train.max_steps == 0 and cfg.data.max_epochs == 1
    assert cfg.optim.schedule == "cosine" and cfg.optim.decay_steps == 3000
    assert cfg.train.signal_exit_code == cfg.train.budget_exit_code == C.EXIT_SELF_CHECKPOINT
    spec.overrides = ["optim.decay_steps=50000"]  # the campaign's own horizon wins
    assert node_config(spec, tmp_path / "run").optim.decay_steps == 50000
    # a cosine schedule with no horizon at all is a one-line config error, at load time
    spec.preset, spec.overrides = "production-a100", ["optim.schedule=cosine"]
    with pytest.raises(ConfigError, match=r"optim\.decay_steps"):
        node_config(spec, tmp_path / "run")


def test_local_chain_stops_at_once_on_a_user_error(tmp_path, range_data, env):
    campaign = write_campaign(tmp_path, range_data, [*TINY, "optim.n_critic=0"])
    work = tmp_path / "work"
    t0 = time.monotonic()
    done = subprocess.run(
        chain_command(campaign, work, "--backoff", "30"),  # a retry would take 30 s
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == C.EXIT_USER_ERROR, done.stderr[-3000:]
    assert time.monotonic() - t0 < 30
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("muongen chain: error: range 0000000-0000999: config key ")
    assert "optim.n_critic must be >= 1" in last and "not retried" in last
    progress = json.loads((work / C.PROGRESS_FILE).read_text())
    assert progress[RANGES[0]] == {"attempts": 1, "status": "failed", "exit_code": 2}
    assert RANGES[1] not in progress


def test_local_chain_names_a_node_command_that_cannot_start(tmp_path, range_data, env):
    campaign = write_campaign(tmp_path, range_data)
    command = chain_command(campaign, tmp_path / "work", "--node-command", "/no/such/node.sh")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == C.EXIT_USER_ERROR
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("muongen chain: error: cannot start the node command /no/such/node.sh")


def test_local_chain_retries_and_hands_checkpoints_on(tmp_path, range_data, env):
    campaign = write_campaign(tmp_path, range_data)
    # A node command that fails the first attempt of range 2, as a flaky execute node would.
    flaky = tmp_path / "flaky-node.sh"
    marker = tmp_path / "failed-once"
    flaky.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *{RANGES[1]}*)\n'
        f"  if [ ! -e {marker} ]; then touch {marker}; exit 1; fi;;\n"
        "esac\n"
        f'exec {sys.executable} -m muongen chain --node "$@"\n'
    )
    flaky.chmod(0o755)
    work = tmp_path / "work"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "muongen",
            "chain",
            str(campaign),
            "--local",
            "--workdir",
            str(work),
            "--backoff",
            "0.1",
            "--node-command",
            str(flaky),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert marker.exists()
    progress = json.loads((work / C.PROGRESS_FILE).read_text())
    assert [progress[r]["status"] for r in RANGES] == ["done"] * 3
    assert progress[RANGES[1]]["attempts"] == 2 and progress[RANGES[0]]["attempts"] == 1

    store = tmp_path / "store" / "ckpt" / "test-chain"
    steps = []
    for r in RANGES:
        _, meta = ckpt.verify(store / f"{r}.json")  # published, sha256 intact
        assert meta["range"] == r
        run_dir = work / r / C.RUN_DIR.format(range=r)
        summary = json.loads((run_dir / "summary.json").read_text())
        steps.append(summary["steps_on_these_inputs"])
        keys = np.fromfile(run_dir / "audit" / "rank0.i64", dtype="<i8")
        assert len(keys) == len(np.unique(keys)) == FILES_PER_RANGE * EVENTS_PER_FILE
        assert (work / r / C.RECEIPT_FILE).exists()
        assert list((tmp_path / "store" / "tb" / "test-chain" / r).rglob("events.out.tfevents.*"))
    final = ckpt.read_manifest(store / f"{RANGES[-1]}.json")
    assert final["step"] == sum(steps) > 0
    assert "resuming" not in done.stderr  # no node had to restart itself

    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "muongen",
            "chain",
            str(campaign),
            "--local",
            "--workdir",
            str(work),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0 and "already done" in again.stderr


def test_evicted_node_resumes_from_its_self_checkpoint(tmp_path, range_data, env):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    node = [
        sys.executable,
        "-m",
        "muongen",
        "chain",
        "--node",
        "--range",
        RANGES[0],
        "--data",
        f"file://{range_data / RANGES[0]}/*.parquet",
        "--preset",
        "demo",
        "--scratch",
        str(scratch),
    ]
    node += [a for s in [*TINY, "checkpoint.every_steps=2"] for a in ("--set", s)]
    ckpts = scratch / f"run-{RANGES[0]}" / "checkpoints"
    proc = subprocess.Popen(
        node, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    t0 = time.monotonic()
    while not ckpt.list_checkpoints(ckpts):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() - t0 < 120
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # HTCondor evicting the job
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 85, err  # checkpointed: restart me
    evicted_at = ckpt.read_manifest(ckpt.find_latest(ckpts))["step"]
    assert not (scratch / f"{RANGES[0]}.json").exists()  # not published: unfinished

    done = subprocess.run(node, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming from its own checkpoint" in done.stderr
    final = ckpt.read_manifest(scratch / f"{RANGES[0]}.json")
    assert final["step"] > evicted_at
    keys = np.fromfile(scratch / f"run-{RANGES[0]}" / "audit" / "rank0.i64", dtype="<i8")
    assert len(keys) == len(np.unique(keys)) == FILES_PER_RANGE * EVENTS_PER_FILE


def write_one_range_campaign(folder: Path, base: Path, tmp_path: Path) -> Path:
    path = write_campaign(tmp_path, base)
    campaign = yaml.safe_load(path.read_text())
    campaign["ranges"]["end"] = 0  # the first node is where the paths went wrong
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "my-campaign.yaml"
    out.write_text(yaml.safe_dump(campaign))
    return out


def test_the_readmes_relative_workdir_from_any_cwd(tmp_path, range_data, env):
    # `muongen chain my-campaign.yaml --local --workdir chain/` as the README prints it: the
    # first node wrote into chain/<range>/chain/<range>/ (a relative scratch dir read from
    # inside itself) and the chain stopped with rc 2, its record left "running".
    here = tmp_path / "a"
    write_one_range_campaign(here, range_data, tmp_path)
    readme = [sys.executable, "-m", "muongen", "chain", "my-campaign.yaml", "--local"]
    readme += ["--workdir", "chain/"]

    # a node that exits 0 without publishing: the chain fails, and says so in its record
    failed = subprocess.run(
        [*readme, "--node-command", "true"], cwd=here, env=env, capture_output=True, text=True
    )
    assert failed.returncode == C.EXIT_USER_ERROR, failed.stderr[-2000:]
    assert "Traceback" not in failed.stderr
    progress = json.loads((here / "chain" / C.PROGRESS_FILE).read_text())
    assert progress[RANGES[0]]["status"] == "failed"  # never "running" once it has ended

    done = subprocess.run(readme, cwd=here, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]  # the re-run recovers
    progress = json.loads((here / "chain" / C.PROGRESS_FILE).read_text())
    assert progress[RANGES[0]]["status"] == "done"
    ckpt.verify(here / "chain" / RANGES[0] / f"{RANGES[0]}.json")
    assert not (here / "chain" / RANGES[0] / "chain").exists()

    # from another working directory, with the default workdir (./chain)
    there = tmp_path / "b" / "c"
    there.mkdir(parents=True)
    again = subprocess.run(
        [sys.executable, "-m", "muongen", "chain", "../../a/my-campaign.yaml", "--local"],
        cwd=there,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    progress = json.loads((there / "chain" / C.PROGRESS_FILE).read_text())
    assert progress[RANGES[0]]["status"] == "done"


def test_a_second_local_chain_on_one_workdir_is_refused(tmp_path, range_data, capsys):
    from muongen import cli, runlock

    campaign = write_campaign(tmp_path, range_data)
    work = tmp_path / "work"
    with runlock.hold(work, "the chain workdir"):  # this process stands for a running chain
        code = cli.main(["chain", str(campaign), "--local", "--workdir", str(work)])
    err = capsys.readouterr().err
    assert code == C.EXIT_USER_ERROR and f"pid {os.getpid()}" in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (work / C.PROGRESS_FILE).exists()
