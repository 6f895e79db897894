"""Fixtures for the grid-submission tests (no HTCondor daemons: files are parsed back)."""

from __future__ import annotations

import copy
import stat
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

# A 5-range campaign with every section set: the shape the tests parse back.
BASE_CAMPAIGN = {
    "name": "test-camp",
    "project": "IceCube",
    "federation": "osg-htc.org",
    "data": {"base": "/icecube/sim/muonitron", "glob": "*.parquet"},
    "ranges": {"start": 0, "end": 4, "step": 1000},
    "image": "osdf:///ospool/ap21/data/jdoe/muongen.sif",
    "resources": {
        "gpus": 1,
        "cpus": 4,
        "memory": "24GB",
        "disk": "40GB",
        "gpus_minimum_capability": 8.0,
    },
    "training": {
        "preset": "production-a100",
        "overrides": ["optim.lr=2e-5", "data.batch_events=48000"],
        "self_checkpoint_s": 1800,
    },
    "outputs": {
        "checkpoints": "osdf:///ospool/ap21/data/jdoe/ckpt",
        "tensorboard": "osdf:///ospool/ap21/data/jdoe/tb",
    },
    "dagman": {"retries": 2, "max_idle": 7, "max_running": 1, "job_duration": "Long"},
}


def campaign_yaml(**changes) -> str:
    """BASE_CAMPAIGN as YAML with changes, keyed section__key (value None deletes the key)."""
    raw = copy.deepcopy(BASE_CAMPAIGN)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = raw
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return yaml.safe_dump(raw, sort_keys=False)


@pytest.fixture
def write_campaign(tmp_path):
    """Writes a campaign file (BASE_CAMPAIGN plus changes) and returns its path."""

    def write(name: str = "campaign.yaml", **changes) -> Path:
        path = tmp_path / name
        path.write_text(campaign_yaml(**changes))
        return path

    return write


@pytest.fixture
def jobs_dir(tmp_path, monkeypatch):
    """A stand-in jobs/ folder: a stub node wrapper plus the real POST script (and a sweep's
    evaluate/compare wrappers and FINAL check).

    The DAG directory copies both; the tests check the DAG, not the lead's wrapper, so
    they must not depend on jobs/node.sh existing or on its content.
    """
    folder = tmp_path / "jobs"
    folder.mkdir()
    (folder / "node.sh").write_text('#!/bin/sh\nexec muongen chain --node "$@"\n')
    for name in ("post_check.py", "evaluate.sh", "compare.sh", "final_check.py"):
        (folder / name).write_text((REPO / "jobs" / name).read_text())
    for f in folder.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr("submit.dag.JOBS_DIR", folder)
    return folder


@pytest.fixture
def campaign_text():
    """campaign_yaml as a fixture (conftest is not importable under --import-mode=importlib)."""
    return campaign_yaml
