"""`python -m submit write` with an --out it cannot write: one line, rc 2, nothing written
(issue 53 item 2; before, a file or a read-only --out was a traceback with rc 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from submit.__main__ import main

REPO = Path(__file__).resolve().parents[2]


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


def test_an_out_that_is_a_file(tmp_path, write_campaign, jobs_dir, capsys):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    assert main(["write", str(write_campaign()), "--out", str(target)]) == 2
    assert f"--out {target} is a file, not a folder" in one_line_error(capsys)
    assert target.read_text() == "mine"


def test_an_out_below_a_file(tmp_path, write_campaign, jobs_dir, capsys):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    assert main(["write", str(write_campaign()), "--out", str(target / "dag")]) == 2
    assert f"--out {target / 'dag'}: {target} is a file" in one_line_error(capsys)


def test_an_out_the_system_refuses(write_campaign, jobs_dir, capsys):
    # /sys refuses new folders even to root (a read-only permission bit would not stop root)
    target = Path("/sys/muongen-test-dag")
    if not Path("/sys").is_dir():
        pytest.skip("no /sys here")
    assert main(["write", str(write_campaign()), "--out", str(target)]) == 2
    assert f"cannot write the DAG folder {target} (" in one_line_error(capsys)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_out(tmp_path, write_campaign, jobs_dir, capsys):
    target = tmp_path / "ro"
    target.mkdir()
    target.chmod(0o555)
    try:
        assert main(["write", str(write_campaign()), "--out", str(target)]) == 2
        assert f"cannot write the DAG folder {target} (Permission denied)" in one_line_error(capsys)
        assert list(target.iterdir()) == []
    finally:
        target.chmod(0o755)


def test_the_command_prints_no_traceback(tmp_path, write_campaign):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    result = subprocess.run(
        [sys.executable, "-m", "submit", "write", str(write_campaign()), "--out", str(target)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
