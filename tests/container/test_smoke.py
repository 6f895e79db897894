"""The image built from this checkout and run for real (container/smoke.sh): opt-in.

Builds the CPU image and runs doctor, the demo as a non-root user into a bind mount, a
`--resume auto` in a second container, and a grid node evicted by SIGTERM (checkpoint,
exit 85) then restarted until it leaves its receipt, all with no network inside. It takes
minutes (the build alone, on a cold cache), so it is marked slow and container:

    .venv/bin/python -m pytest -m container tests/container -s

The build settings come from the environment (CPU_IMAGE, TORCH_FIND_LINKS, CA_BUNDLE,
IMAGE, SKIP_BUILD, ...: see container/smoke.sh).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.container, pytest.mark.slow]


def test_image_builds_and_runs_doctor_demo_resume_and_an_evicted_grid_node():
    if shutil.which("podman") is None and shutil.which("docker") is None:
        pytest.skip("neither podman nor docker is installed: no container engine to run the image")
    res = subprocess.run(
        ["bash", str(REPO / "container" / "smoke.sh")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    print(res.stdout)
    print(res.stderr)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "smoke: all steps passed" in res.stdout
