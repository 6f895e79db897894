"""jobs/post_check.py, the DAGMan POST script: run as DAGMan runs it (a subprocess)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "jobs" / "post_check.py"
RANGE = "0001000-0001999"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=30
    )


@pytest.fixture
def published(tmp_path):
    """A checkpoint as a node publishes it: <range>.pt and its manifest <range>.json."""
    pt = tmp_path / f"{RANGE}.pt"
    pt.write_bytes(b"not really torch, but bytes with a digest" * 100)
    manifest = tmp_path / f"{RANGE}.json"
    manifest.write_text(
        json.dumps(
            {
                "name": RANGE,
                "pt": pt.name,
                "step": 12345,
                "range": RANGE,
                "created": "2024-06-10T06:13:20Z",
                "size": pt.stat().st_size,
                "sha256": hashlib.sha256(pt.read_bytes()).hexdigest(),
                "muongen_version": "0.1.0",
                "schema_version": 1,
            }
        )
    )
    return manifest, pt


def rewrite(manifest: Path, **changes) -> None:
    meta = json.loads(manifest.read_text())
    meta.update(changes)
    manifest.write_text(json.dumps(meta))


def test_good_checkpoint_passes_and_reports_the_step(published):
    manifest, pt = published
    result = run(str(manifest), "--expect-range", RANGE, "--job-return", "0")
    assert result.returncode == 0, result.stdout
    assert f"ok: range {RANGE} step 12345" in result.stdout
    assert "sha256 verified" in result.stdout
    assert run(str(manifest), str(pt)).returncode == 0  # explicit PT_PATH


def test_missing_manifest_fails(tmp_path):
    result = run(str(tmp_path / f"{RANGE}.json"))
    assert result.returncode == 1
    assert "does not exist: the node did not publish it" in result.stdout


def test_missing_pt_fails(published):
    manifest, pt = published
    pt.unlink()
    result = run(str(manifest))
    assert result.returncode == 1 and "named by the manifest does not exist" in result.stdout


def test_size_mismatch_fails(published):
    manifest, pt = published
    with pt.open("ab") as f:
        f.write(b"x")
    result = run(str(manifest))
    assert result.returncode == 1
    assert f"has {pt.stat().st_size} bytes, the manifest says {pt.stat().st_size - 1}" in (
        result.stdout
    )


def test_sha_mismatch_fails(published):
    manifest, pt = published
    data = bytearray(pt.read_bytes())
    data[0] ^= 0xFF  # same size, different content
    pt.write_bytes(bytes(data))
    result = run(str(manifest))
    assert result.returncode == 1 and "the file is corrupt or from another run" in result.stdout


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"range": "0000000-0000999"}, "is for range '0000000-0000999', not"),
        ({"step": -1}, "step is -1, not a count"),
        ({"sha256": "abc"}, "is not a hex digest"),
        ({"pt": "../elsewhere.pt"}, "is not a file name in the same folder"),
    ],
)
def test_bad_manifest_fields_fail(published, changes, message):
    manifest, _ = published
    rewrite(manifest, **changes)
    result = run(str(manifest), "--expect-range", RANGE)
    assert result.returncode == 1 and message in result.stdout


def test_manifest_missing_keys_or_not_json_fails(published):
    manifest, _ = published
    meta = json.loads(manifest.read_text())
    del meta["sha256"], meta["muongen_version"]
    manifest.write_text(json.dumps(meta))
    assert "lacks sha256, muongen_version" in run(str(manifest)).stdout
    manifest.write_text("{truncated")
    result = run(str(manifest))
    assert result.returncode == 1 and "not readable JSON" in result.stdout


def test_receipt_mode_does_not_need_the_pt(published):
    manifest, pt = published
    pt.unlink()  # on the OSDF, not on the access point
    result = run(str(manifest), "--manifest-only", "--expect-range", RANGE)
    assert result.returncode == 0 and "uploaded by HTCondor" in result.stdout


@pytest.mark.parametrize(("job_return", "exit_code"), [("3", 3), ("-9", 1), ("-1002", 1)])
def test_a_failed_job_is_propagated_without_checking(tmp_path, job_return, exit_code):
    result = run(str(tmp_path / "absent.json"), "--job-return", job_return)
    assert result.returncode == exit_code
    assert f"the node's job failed (return {job_return})" in result.stdout


def test_accepts_what_the_real_checkpoint_save_and_node_staging_write(tmp_path):
    # The grid contract between the node (muongen, torch) and the POST script (standard
    # library only, on the access point): the manifest the real save writes, and the copy a
    # node stages as <range>.json and sends back as its receipt, pass the POST check.
    import runpy

    import torch

    from muongen import checkpoint as ckpt

    state = {"generator": {"w": torch.arange(6.0)}, "step": 321}
    saved = ckpt.save(state, tmp_path / "run", "step-000000321", step=321, range_name=RANGE)
    staged = ckpt.publish_once(saved, tmp_path / "scratch", RANGE, range_name=RANGE)
    required = runpy.run_path(str(SCRIPT))["MANIFEST_KEYS"]
    assert sorted(required) == sorted(ckpt.MANIFEST_KEYS)  # both readers want the same keys
    assert set(required) <= set(json.loads(staged.manifest.read_text()))
    for manifest in (saved.manifest, staged.manifest):
        result = run(str(manifest), "--job-return", "0")
        assert result.returncode == 0, result.stdout
        assert "step 321" in result.stdout and "sha256 verified" in result.stdout
    result = run(str(staged.manifest), "--expect-range", RANGE, "--manifest-only")
    assert result.returncode == 0, result.stdout
    staged.pt.write_bytes(staged.pt.read_bytes()[:-1] + b"x")  # one byte off
    assert run(str(staged.manifest)).returncode == 1


def test_a_user_error_exit_code_reaches_dagman_unchanged():
    # DAGMan's RETRY ... UNLESS-EXIT 2 sees the POST script's exit code: a node's user error
    # must come through as exactly that code, so DAGMan does not retry it.
    from muongen.errors import ConfigError
    from submit import constants as C

    assert ConfigError("x").exit_code == C.EXIT_USER_ERROR
    result = run("missing.json", "--job-return", str(C.EXIT_USER_ERROR))
    assert result.returncode == C.EXIT_USER_ERROR
