"""container/install.sh's dependency phase run for real against a stand-in `python`: where
torch and the pins come from, and which pip settings reach pip (the package phase writes to
/usr/local/bin and is exercised by the image build itself: container/smoke.sh)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "container" / "install.sh"

# Records every call (one line of arguments) and the PIP_* variables it saw; answers the
# cuda variant's torch version probe (which prints the public version) with $FAKE_TORCH.
FAKE_PYTHON = """#!/bin/sh
if [ "$1" = "-c" ]; then
    [ -n "${FAKE_TORCH:-}" ] || exit 1
    echo "$FAKE_TORCH"
    exit 0
fi
echo "$*" >> "$REC/calls"
env | grep '^PIP_' | sort >> "$REC/env" || :
"""


@pytest.fixture
def sandbox(tmp_path: Path) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    src = tmp_path / "src"
    (src / "container").mkdir(parents=True)
    shutil.copy(REPO / "container" / "requirements.lock", src / "container")
    rec = tmp_path / "rec"
    rec.mkdir()
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "REC": str(rec)}
    return {"src": src, "rec": rec, "env": env, "tmp": tmp_path}


def deps(sb: dict, variant: str = "cpu", **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["sh", str(INSTALL), variant, str(sb["src"]), "deps"],
        env={**sb["env"], **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def calls(sb: dict) -> list[str]:
    path = sb["rec"] / "calls"
    return path.read_text().splitlines() if path.exists() else []


def torch_pin() -> str:
    lock = (REPO / "container" / "requirements.lock").read_text().splitlines()
    return next(ln.split("==")[1] for ln in lock if ln.startswith("torch=="))


def test_cpu_torch_from_a_wheel_folder_asks_no_index(sandbox):
    wheels = sandbox["tmp"] / "wheels"
    wheels.mkdir()
    res = deps(sandbox, TORCH_FIND_LINKS=str(wheels))
    assert res.returncode == 0, res.stderr
    torch_call, lock_call = calls(sandbox)
    assert torch_call == (
        f"-m pip install --no-cache-dir --no-deps --no-index --find-links {wheels} "
        f"torch=={torch_pin()}+cpu"
    )
    assert (
        lock_call
        == f"-m pip install --no-cache-dir -r {sandbox['src']}/container/requirements.lock"
    )


def test_cpu_torch_from_the_index_by_default_or_the_one_given(sandbox):
    assert deps(sandbox).returncode == 0
    assert "--index-url https://download.pytorch.org/whl/cpu " in calls(sandbox)[0]
    (sandbox["rec"] / "calls").unlink()
    assert deps(sandbox, TORCH_INDEX_URL="https://mirror.example/torch-cpu").returncode == 0
    assert "--index-url https://mirror.example/torch-cpu " in calls(sandbox)[0]


def test_a_wheel_folder_that_is_not_there_stops_the_build_with_the_mount_to_add(sandbox):
    res = deps(sandbox, TORCH_FIND_LINKS="/nonexistent/wheels")
    assert res.returncode == 1
    assert "--volume /nonexistent/wheels:/nonexistent/wheels:ro" in res.stderr
    assert calls(sandbox) == []


def test_empty_pip_build_arguments_are_dropped_and_given_ones_reach_pip(sandbox):
    # Docker passes an ARG that was not given as an empty variable
    res = deps(sandbox, PIP_INDEX_URL="", PIP_EXTRA_INDEX_URL="", PIP_CERT="")
    assert res.returncode == 0, res.stderr
    assert (sandbox["rec"] / "env").read_text() == ""
    res = deps(sandbox, PIP_INDEX_URL="https://pypi.mirror.example/simple", PIP_CERT="/ca.pem")
    assert res.returncode == 0, res.stderr
    seen = (sandbox["rec"] / "env").read_text().splitlines()
    assert "PIP_INDEX_URL=https://pypi.mirror.example/simple" in seen
    assert "PIP_CERT=/ca.pem" in seen
    assert not any(ln.startswith("PIP_EXTRA_INDEX_URL") for ln in seen)


def test_cuda_keeps_the_base_images_torch_and_refuses_another_version(sandbox):
    res = deps(sandbox, "cuda", FAKE_TORCH=torch_pin())
    assert res.returncode == 0, res.stderr
    assert [c.split()[-2] for c in calls(sandbox)] == ["-r"]  # the lock only, no torch
    res = deps(sandbox, "cuda", FAKE_TORCH="2.0.1")
    assert res.returncode == 1
    assert f"the base image has torch 2.0.1, the lock pins torch=={torch_pin()}" in res.stderr


def test_unknown_phase_or_variant_is_refused(sandbox):
    res = subprocess.run(
        ["sh", str(INSTALL), "cpu", str(sandbox["src"]), "everything"],
        env=sandbox["env"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 1 and "unknown phase 'everything'" in res.stderr
    res = deps(sandbox, "rocm")
    assert res.returncode == 1 and "unknown variant 'rocm'" in res.stderr
    assert calls(sandbox) == []
