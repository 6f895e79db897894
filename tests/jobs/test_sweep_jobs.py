"""A sweep's node scripts: jobs/evaluate.sh, jobs/compare.sh and the FINAL POST script.

The wrappers run with a stand-in muongen (MUONGEN_BIN) that records its arguments; the
compare wrapper also runs the real ``muongen compare`` on a DAG directory's metrics/ folder
as HTCondor hands it to the compare job (one member's evaluation came back, one did not).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from submit import constants as C

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "jobs"

# Stand-in muongen: records argv; `evaluate ... --out DIR` writes DIR/metrics.json unless
# told to fail (STUB_EXIT) or to write nothing (STUB_NOTHING).
STUB = """#!/bin/sh
printf '%s\\n' "$@" > argv.txt
if [ -n "${STUB_EXIT:-}" ]; then exit "$STUB_EXIT"; fi
if [ "$1" = evaluate ] && [ -z "${STUB_NOTHING:-}" ]; then
    for last; do :; done
    mkdir -p "$last" && printf '{"summary": {"median_ratio": 1.5}}' > "$last/metrics.json"
fi
"""


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A job's scratch dir with the wrappers in it and a stand-in muongen."""
    stub = tmp_path / "muongen-stub"
    stub.write_text(STUB)
    stub.chmod(0o755)
    job = tmp_path / "scratch"
    job.mkdir()
    for name in (C.EVALUATE_WRAPPER, C.COMPARE_WRAPPER):
        shutil.copy(JOBS / name, job / name)
    monkeypatch.setenv("MUONGEN_BIN", str(stub))
    return job


def run(job: Path, script: str, *args: str, **env) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        ["sh", script, *args], cwd=job, capture_output=True, text=True, timeout=60,
        env={**os.environ, **env},
    )  # fmt: skip


ARGS = ["--checkpoint", "0002000-0002999.json", "--data", "pelican://h/x/*.parquet",
        "--events", "1000"]  # fmt: skip


def test_evaluate_leaves_metrics_and_its_receipt(scratch):
    result = run(scratch, C.EVALUATE_WRAPPER, *ARGS)
    assert result.returncode == 0, result.stderr
    argv = (scratch / "argv.txt").read_text().split("\n")[:-1]
    assert argv == ["evaluate", *ARGS, "--out", "eval"]
    metrics = (scratch / C.METRICS_FILE).read_text()
    assert json.loads(metrics) == {"summary": {"median_ratio": 1.5}}
    assert (scratch / C.METRICS_RECEIPT).read_text() == metrics


def test_evaluate_passes_muongens_failure_on(scratch):
    result = run(scratch, C.EVALUATE_WRAPPER, *ARGS, STUB_EXIT="2")
    assert result.returncode == 2  # a user error: RETRY ... UNLESS-EXIT 2 stops there
    assert not (scratch / C.METRICS_FILE).exists()


def test_evaluate_without_metrics_fails(scratch):
    result = run(scratch, C.EVALUATE_WRAPPER, *ARGS, STUB_NOTHING="1")
    assert result.returncode == 1
    assert "wrote no eval/metrics.json" in result.stderr
    assert not (scratch / C.METRICS_FILE).exists()


def test_compare_wrapper_passes_its_arguments(scratch):
    result = run(scratch, C.COMPARE_WRAPPER, C.METRICS_DIR, "--out", C.BOARD_DIR)
    assert result.returncode == 0, result.stderr
    assert (scratch / "argv.txt").read_text().split() == ["compare", "metrics", "--out", "board"]


def test_compare_ranks_what_came_back_and_names_the_failed_member(tmp_path, monkeypatch):
    """The real `muongen compare` on metrics/ as a sweep's DAG directory lays it out."""
    report = pytest.importorskip("muongen.evaluate.report")
    pytest.importorskip("muongen.compare")
    job = tmp_path / "scratch"
    metrics = job / C.METRICS_DIR
    ok, failed = "lr_critic_1e-5+seed_0", "lr_critic_2e-5+seed_0"
    for member in (ok, failed):
        (metrics / member).mkdir(parents=True)  # the DAG writer makes every member's folder
    table = {
        ok: {"settings": {"optim.lr_critic": 1e-5}, "seed": 0, "overrides": []},
        failed: {"settings": {"optim.lr_critic": 2e-5}, "seed": 0, "overrides": []},
    }
    (metrics / C.MEMBERS_FILE).write_text(json.dumps(table))
    real = tiny_result()
    report.write_metrics_json(metrics / ok / C.METRICS_FILE, {**real, "meta": {}})
    shutil.copy(JOBS / C.COMPARE_WRAPPER, job)
    monkeypatch.setenv("MUONGEN_BIN", str(Path(sys.executable).with_name("muongen")))
    result = run(job, C.COMPARE_WRAPPER, C.METRICS_DIR, "--out", C.BOARD_DIR)
    assert result.returncode == 0, result.stderr
    board = json.loads((job / C.BOARD_DIR / "leaderboard.json").read_text())
    rows = {m["name"]: m for m in board["members"]}
    assert rows[ok]["status"] == "ok" and rows[ok]["settings"] == {"optim.lr_critic": 1e-5}
    assert rows[failed]["status"] == "failed"
    assert board["best"] == ok
    assert (job / C.BOARD_DIR / "leaderboard.md").is_file()


def tiny_result() -> dict:
    """A real evaluation result: toy held-out events scored against a toy model."""
    import numpy as np

    from muongen.evaluate.features import EventSample
    from muongen.evaluate.floors import compare

    def toy(seed: int, conditions=None) -> EventSample:
        rng = np.random.default_rng(seed)
        n = 300
        if conditions is None:
            conditions = np.stack([10.0 ** rng.uniform(5, 8, n), rng.uniform(0, 1.2, n),
                                   rng.choice([1.0, 56.0], n), np.full(n, 1500.0)], 1)  # fmt: skip
        counts = rng.poisson(np.exp(np.log10(conditions[:, 0]) - 5.5))
        m = int(counts.sum())
        muons = np.stack([10.0 ** rng.normal(2, 0.5, m), rng.normal(0, 20, m),
                          rng.normal(0, 20, m)], 1)  # fmt: skip
        return EventSample.from_arrays(conditions, muons, counts)

    real = toy(1)
    return compare(real, {"model": toy(2, real.conditions)}, n_splits=3, min_events=20, seed=0)


@pytest.mark.parametrize(
    "job_return, dag_status, failed, code, says",
    [
        ("0", "0", "0", 0, "ok: every member trained and evaluated"),
        ("0", "2", "1", 1, "1 node(s) failed (DAG a node failed)"),
        ("0", "4", "0", 1, "DAG removed (condor_rm)"),
        ("2", "2", "1", 2, "the compare job failed (return 2)"),
        ("-1002", "4", "0", 1, "the compare job failed (return -1002)"),
    ],
)
def test_final_check_fails_the_dag_when_a_member_failed(job_return, dag_status, failed, code, says):
    result = subprocess.run(
        [sys.executable, str(JOBS / C.FINAL_CHECK), "--job-return", job_return,
         "--dag-status", dag_status, "--failed", failed],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == code
    assert says in result.stdout
