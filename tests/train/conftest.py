"""Fixtures for trainer tests: a small synthetic dataset and a tiny, fast config."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from muongen.config import load_config


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """Four small Parquet files written once per session: the trainer tests read, never write."""
    from muongen.data.synth import write_synthetic

    out = tmp_path_factory.mktemp("tiny-data")  # muon-rich mix: every batch carries muons
    write_synthetic(out, files=4, events_per_file=400, seed=3, mix="rich")
    return out


def tiny_overrides(data: Path, **extra) -> list[str]:
    """A model and batch small enough that a step takes milliseconds on one CPU thread."""
    sets = {
        "data.paths": f"[{data}]",
        "data.batch_events": 32,
        "data.shuffle_buffer_events": 256,
        "data.open_files": 2,
        "data.max_muons_per_event": 2000,
        "model.z_global": 8,
        "model.z_local": 4,
        "model.context": 32,
        "model.mult_hidden": "[16, 16]",
        "model.local_hidden": "[32]",
        "model.critic_muon_hidden": "[16, 32]",
        "model.critic_head_hidden": "[32]",
        "model.critic_local_width": "8",
        "model.critic_global_width": "16",
        "optim.n_critic": 2,
        "optim.schedule": "constant",  # epoch-bounded runs have no step horizon
        "optim.gp_max_pairs": 64,
        "train.device": "cpu",
        "train.deterministic": "true",
        "train.log_every": 5,
        "checkpoint.every_steps": 10,
        "checkpoint.every_minutes": 0,
        "checkpoint.keep_last": 10,
        "logging.hist_every": 0,
        "logging.gpu_monitor": "false",
        "logging.progress": "plain",
        "logging.audit_events": "true",
    }
    sets.update(extra)
    return [f"{k}={v}" for k, v in sets.items()]


@pytest.fixture
def tiny_config(tiny_data):
    """Build a tiny Config; keyword overrides use dotted keys with '__' for '.'."""

    def make(**extra):
        extra = {k.replace("__", "."): v for k, v in extra.items()}
        return load_config(None, tiny_overrides(tiny_data, **extra))

    return make


@pytest.fixture
def cli_env():
    """Environment for `python -m muongen` subprocesses: one thread, unbuffered output."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[2]), env.get("PYTHONPATH", "")])
    return env


PYTHON = sys.executable
