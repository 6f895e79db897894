"""Fixtures for the container tests: the images are checked statically (no Docker engine or
Apptainer here), the entrypoint and `muongen doctor` are run for real."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

# Stands in for the `muongen` executable (MUONGEN_BIN): records its pid, arguments and
# environment, then either exits or, with STANDIN_WAIT set, waits for SIGTERM and leaves a
# marker, like a trainer writing its checkpoint on eviction.
STAND_IN = """#!/bin/sh
echo $$ > "$STANDIN_OUT/pid"
printf '%s\\n' "$@" > "$STANDIN_OUT/args"
env > "$STANDIN_OUT/env"
if [ -n "${STANDIN_WAIT:-}" ]; then
    trap 'echo terminated > "$STANDIN_OUT/marker"; exit 143' TERM
    echo ready > "$STANDIN_OUT/ready"
    while :; do sleep 0.05; done
fi
"""


@pytest.fixture
def stand_in(tmp_path: Path) -> tuple[Path, Path]:
    # A fake muongen executable and the folder it reports into (see STAND_IN).
    script = tmp_path / "fake-muongen"
    script.write_text(STAND_IN)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "out"
    out.mkdir()
    return script, out


@pytest.fixture
def base_env(tmp_path: Path, stand_in: tuple[Path, Path]) -> dict[str, str]:
    # A clean environment: none of this machine's HTCondor, thread or cache variables (the
    # shared conftest exports OMP_NUM_THREADS=1), a writable HOME, and the stand-in muongen.
    script, out = stand_in
    home = tmp_path / "home"
    home.mkdir()
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "MUONGEN_BIN": str(script),
        "STANDIN_OUT": str(out),
    }
