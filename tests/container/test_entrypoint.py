"""container/entrypoint.sh run directly: dispatch, threads, scratch, and signals (exec)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from muongen.cli import VERBS

ENTRYPOINT = Path(__file__).resolve().parents[2] / "container" / "entrypoint.sh"


def run_entry(env: dict[str, str], *args: str, cwd: Path | None = None):
    return subprocess.run(
        [str(ENTRYPOINT), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=20
    )


def read_env(out: Path) -> dict[str, str]:
    lines = (out / "env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def test_verbs_list_matches_the_cli():
    text = ENTRYPOINT.read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("MUONGEN_VERBS="))
    assert sorted(line.split("=", 1)[1].strip('"').split()) == sorted(VERBS)


def test_verb_arguments_pass_through_unchanged(base_env, stand_in):
    _, out = stand_in
    args = ["train", "--config", "demo", "--set", "optim.lr=2e-5", "two words", "*"]
    res = run_entry(base_env, *args)
    assert res.returncode == 0, res.stderr
    assert (out / "args").read_text().splitlines() == args


@pytest.mark.parametrize("args", [[], ["--help"], ["--version"]])
def test_options_and_no_arguments_go_to_muongen(base_env, stand_in, args):
    _, out = stand_in
    assert run_entry(base_env, *args).returncode == 0
    assert (out / "args").read_text().splitlines() == (args or ["--help"])


def test_other_commands_run_as_given(base_env, stand_in, tmp_path):
    _, out = stand_in
    script = tmp_path / "node.sh"
    script.write_text('#!/bin/sh\necho "node $*"\n')
    script.chmod(0o755)
    res = run_entry(base_env, "sh", "-c", 'echo "shell $0 $1"', "a", "b c")
    assert res.stdout == "shell a b c\n"
    res = run_entry(base_env, "./node.sh", "--range", "3", cwd=tmp_path)
    assert res.stdout == "node --range 3\n"
    assert not (out / "args").exists()  # muongen was not involved


def test_unknown_command_fails_with_a_message(base_env):
    res = run_entry(base_env, "no-such-verb-or-command")
    assert res.returncode == 127
    assert "neither a muongen verb" in res.stderr


MACHINE_AD = """\
Arch = "X86_64"
TotalCpus = 64
DetectedCpus = 64
Cpus = 3
CpusUsage = 0.5
Memory = 8192
"""


def test_threads_follow_the_slot_cpus_in_the_machine_ad(base_env, stand_in, tmp_path):
    _, out = stand_in
    ad = tmp_path / "machine.ad"
    ad.write_text(MACHINE_AD)
    assert run_entry({**base_env, "_CONDOR_MACHINE_AD": str(ad)}, "train").returncode == 0
    env = read_env(out)
    assert env["OMP_NUM_THREADS"] == "3"
    assert env["MKL_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "3"


def test_machine_ad_in_the_scratch_dir_is_the_fallback(base_env, stand_in, tmp_path):
    _, out = stand_in
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / ".machine.ad").write_text(MACHINE_AD.replace("Cpus = 3", "cpus = 5"))
    assert run_entry({**base_env, "_CONDOR_SCRATCH_DIR": str(scratch)}, "train").returncode == 0
    assert read_env(out)["OMP_NUM_THREADS"] == "5"


def test_an_explicit_thread_setting_wins(base_env, stand_in, tmp_path):
    _, out = stand_in
    ad = tmp_path / "machine.ad"
    ad.write_text(MACHINE_AD)
    env = {**base_env, "_CONDOR_MACHINE_AD": str(ad), "OMP_NUM_THREADS": "7"}
    assert run_entry({**env, "MKL_NUM_THREADS": "2"}, "train").returncode == 0
    seen = read_env(out)
    assert seen["OMP_NUM_THREADS"] == seen["OPENBLAS_NUM_THREADS"] == "7"
    assert seen["MKL_NUM_THREADS"] == "2"


def test_outside_htcondor_threads_and_caches_are_left_alone(base_env, stand_in):
    _, out = stand_in
    assert run_entry(base_env, "train").returncode == 0
    seen = read_env(out)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TMPDIR", "XDG_CACHE_HOME", "MPLCONFIGDIR"):
        assert name not in seen
    assert seen["HOME"] == base_env["HOME"]


def test_caches_and_temp_files_go_to_the_job_scratch_dir(base_env, stand_in, tmp_path):
    _, out = stand_in
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**base_env, "_CONDOR_SCRATCH_DIR": str(scratch), "HOME": str(tmp_path / "absent")}
    assert run_entry(env, "train").returncode == 0
    seen = read_env(out)
    assert seen["TMPDIR"] == f"{scratch}/tmp"
    assert seen["XDG_CACHE_HOME"] == f"{scratch}/.cache"
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH", "MPLCONFIGDIR"):
        assert seen[name].startswith(f"{scratch}/.cache/"), name
    assert (scratch / "tmp").is_dir() and Path(seen["MPLCONFIGDIR"]).is_dir()
    assert seen["HOME"] == str(scratch)  # the given HOME does not exist


def test_a_user_temp_dir_is_kept_under_htcondor(base_env, stand_in, tmp_path):
    _, out = stand_in
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**base_env, "_CONDOR_SCRATCH_DIR": str(scratch), "TMPDIR": "/var/tmp"}
    assert run_entry(env, "train").returncode == 0
    seen = read_env(out)
    assert seen["TMPDIR"] == "/var/tmp"
    assert seen["HOME"] == base_env["HOME"]  # writable: kept


def test_sigterm_reaches_the_trainer_through_exec(base_env, stand_in):
    _, out = stand_in
    proc = subprocess.Popen([str(ENTRYPOINT), "train"], env={**base_env, "STANDIN_WAIT": "1"})
    try:
        deadline = time.monotonic() + 10
        while not (out / "ready").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "stand-in never started"
            time.sleep(0.02)
        # exec: the trainer IS the process that was started (no shell left in between)
        assert int((out / "pid").read_text()) == proc.pid
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=10) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (out / "marker").read_text() == "terminated\n"


def test_env_sh_can_be_sourced_twice_under_set_eu(base_env, tmp_path):
    # Apptainer's %environment sources it, and the entrypoint sources it again.
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env_sh = ENTRYPOINT.parent / "env.sh"
    script = f'set -eu; . "{env_sh}"; . "{env_sh}"; env'
    res = subprocess.run(
        ["sh", "-c", script],
        env={**base_env, "_CONDOR_SCRATCH_DIR": str(scratch), "OMP_NUM_THREADS": "4,2"},
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert res.returncode == 0, res.stderr
    seen = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
    assert seen["XDG_CACHE_HOME"] == f"{scratch}/.cache"
    assert seen["OMP_NUM_THREADS"] == "4,2" and "MKL_NUM_THREADS" not in seen
    assert not [name for name in seen if name.startswith("_mg_")]
