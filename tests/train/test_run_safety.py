"""A run folder at its edges: one process at a time (a kernel lock), no step written twice,
damaged checkpoints kept and never silently replaced by a fresh start, and one-line
messages that name the folder (issue 53, items 6, 7, 8 and 9)."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import socket
import subprocess
import sys

import pytest

from muongen import checkpoint as ckpt
from muongen import cli, runlock
from muongen.config import load_config
from muongen.errors import CheckpointError, StorageError
from muongen.train import checkpoint as train_ckpt
from muongen.train.checkpoint import Checkpointer
from muongen.train.signals import EXIT_INTERRUPTED, StopRequest
from muongen.train.trainer import Trainer

from .conftest import tiny_overrides


def train_argv(data, out, *sets: str) -> list[str]:
    argv = ["train", "--config", "demo", "--out", str(out)]
    return argv + [a for s in [*tiny_overrides(data), *sets] for a in ("--set", s)]


# --------------------------------------------------------------------------- item 4: 0 bytes


def test_a_0_byte_first_input_is_skipped_and_recorded(tiny_data, tmp_path):
    # the normalisers were fitted on the first file, which raised before the stream could
    # skip it: training aborted with data.strict false and bad_input.json stayed empty
    data = tmp_path / "data"
    data.mkdir()
    (data / "0-empty.parquet").write_bytes(b"")  # sorts first
    for f in sorted(tiny_data.glob("*.parquet"))[:2]:
        (data / f.name).symlink_to(f)
    cfg = load_config(None, tiny_overrides(data, **{"data.strict": "false", "train.max_steps": 5}))
    t = Trainer(cfg, tmp_path / "r")
    assert t.train() == 0 and t.step > 0
    report = json.loads((tmp_path / "r" / "bad_input.json").read_text())
    assert [f["url"] for f in report["bad_files"]] == [str(data / "0-empty.parquet")]
    assert "empty (0 bytes)" in report["bad_files"][0]["reason"]


# --------------------------------------------------------------------------- item 6: the lock


def test_a_second_train_in_a_held_run_folder_is_refused_naming_the_holder(
    tiny_data, tmp_path, capsys
):
    run = tmp_path / "r"
    with runlock.hold(run, "run folder"):  # this process stands for a running `train`
        code = cli.main(train_argv(tiny_data, run, "train.max_steps=5"))
    err = capsys.readouterr().err
    assert code == 2
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and f"pid {os.getpid()}" in lines[0]
    assert f"host {socket.gethostname()}" in lines[0] and str(run) in lines[0]
    assert "Traceback" not in err
    assert not (run / "checkpoints").exists()  # it touched nothing
    assert cli.main(train_argv(tiny_data, run, "train.max_steps=2")) == 0  # released: runs


def test_a_sigkilled_holder_never_blocks_the_next(tmp_path):
    folder = tmp_path / "w"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom muongen import runlock\n"
            f"with runlock.hold({str(folder)!r}, 'run folder'):\n"
            "    print('held', flush=True)\n    time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with (
            pytest.raises(runlock.FolderBusy, match=f"pid {holder.pid}"),
            runlock.hold(folder, "run folder"),
        ):
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with runlock.hold(folder, "run folder"):  # the kernel dropped the dead holder's lock
        assert f"pid {os.getpid()}" in runlock.holder(folder / runlock.LOCK_FILE)


# --------------------------------------------------------------------------- item 7: once


def checkpoint_writes(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("checkpoint /")]


def test_the_last_step_is_written_once(tiny_config, tmp_path, caplog):
    caplog.set_level(logging.INFO, "muongen.train.checkpoint")
    t = Trainer(tiny_config(train__max_steps=10), tmp_path / "r")  # every_steps=10
    assert t.train() == 0
    writes = checkpoint_writes(caplog)
    assert len(writes) == 1 and "step-000000010.pt" in writes[0], writes
    assert t.checkpointer.last_saved.step == 10  # what a run publishes


def test_a_ctrl_c_at_a_checkpoint_step_writes_it_once_and_exits_130(tiny_config, tmp_path, caplog):
    caplog.set_level(logging.INFO, "muongen.train.checkpoint")
    stop = StopRequest()
    t = Trainer(tiny_config(train__max_steps=30), tmp_path / "r", stop=stop)
    real_save = t.checkpointer.save

    def save_then_ctrl_c(state, step, *again):
        saved = real_save(state, step, *again)
        stop.signum = signal.SIGINT  # Ctrl-C lands while step 10 is written
        return saved

    t.checkpointer.save = save_then_ctrl_c
    assert t.train() == EXIT_INTERRUPTED
    assert t.step == 10
    writes = checkpoint_writes(caplog)
    assert len(writes) == 1 and "step-000000010.pt" in writes[0], writes


def test_a_resumed_run_stopped_at_once_rewrites_nothing(tiny_config, tmp_path, caplog):
    Trainer(tiny_config(train__max_steps=10), tmp_path / "r").train()
    manifest = tmp_path / "r" / "checkpoints" / "step-000000010.json"
    before = manifest.read_bytes()
    caplog.set_level(logging.INFO, "muongen.train.checkpoint")
    stop = StopRequest()
    stop.signum = signal.SIGTERM  # evicted before its first step
    t = Trainer(tiny_config(train__max_steps=30), tmp_path / "r", stop=stop)
    t.resume("auto")
    assert t.train() == 0  # train.signal_exit_code
    assert checkpoint_writes(caplog) == [] and manifest.read_bytes() == before


# --------------------------------------------------------------------------- item 8: damaged


def small_folder(tmp_path, steps=(5, 10, 15)):
    folder = tmp_path / "checkpoints"
    for step in steps:
        ckpt.save({"w": [step]}, folder, ckpt.STEP_NAME.format(step), step=step)
    return folder


def damage(manifest):
    pt = manifest.with_suffix(".pt")
    pt.write_bytes(pt.read_bytes()[:-1] + b"!")


def test_all_checkpoints_damaged_are_kept_and_a_fresh_start_is_refused(tmp_path):
    folder = small_folder(tmp_path)
    manifests = ckpt.list_checkpoints(folder)
    for m in manifests:
        damage(m)
    bytes_before = {m.name: m.read_bytes() for m in manifests}
    bytes_before.update(
        {m.with_suffix(".pt").name: m.with_suffix(".pt").read_bytes() for m in manifests}
    )
    cp = Checkpointer(folder, load_config(None).checkpoint)
    assert cp.find("auto") is None
    with pytest.raises(CheckpointError) as err:
        cp.adopt(None)
    message = str(err.value)
    assert "moved to" in message and "damaged" in message and "--resume fresh" in message
    assert "\n" not in message
    aside = folder / ckpt.DAMAGED_DIR
    assert {p.name: p.read_bytes() for p in aside.iterdir()} == bytes_before  # every byte kept
    assert ckpt.list_checkpoints(folder) == []
    # a second try (auto, or no --resume) still refuses: nothing starts over on its own
    for how in ("auto", None):
        with pytest.raises(CheckpointError, match="--resume fresh"):
            Checkpointer(folder, load_config(None).checkpoint).adopt(cp.find(how))
    Checkpointer(folder, load_config(None).checkpoint).adopt(None, fresh=True)  # asked for


def test_a_damaged_newer_checkpoint_is_moved_aside_not_deleted(tmp_path, caplog):
    folder = small_folder(tmp_path)
    newest = ckpt.list_checkpoints(folder)[-1]
    damage(newest)
    cp = Checkpointer(folder, load_config(None).checkpoint)
    found, _ = cp.find("auto")
    assert ckpt.step_of(found) == 10
    with caplog.at_level(logging.WARNING):
        cp.adopt(found)
    assert [ckpt.step_of(m) for m in ckpt.list_checkpoints(folder)] == [5, 10]
    assert (folder / ckpt.DAMAGED_DIR / newest.name).exists()
    assert (folder / ckpt.DAMAGED_DIR / newest.with_suffix(".pt").name).exists()
    assert any("moved 1 damaged checkpoint" in r.getMessage() for r in caplog.records)


def test_a_node_falls_back_to_the_previous_ranges_checkpoint(tmp_path):
    # a grid node whose own checkpoints are all damaged continues the previous range's
    # published checkpoint (another folder), as before; its damaged ones are kept aside
    folder = small_folder(tmp_path)
    for m in ckpt.list_checkpoints(folder):
        damage(m)
    prev = ckpt.save({"w": [1]}, tmp_path / "previous", "0000000-0000999", step=99)
    cp = Checkpointer(folder, load_config(None).checkpoint)
    assert ckpt.find_latest(folder) is None
    cp.adopt(prev.manifest)
    assert len(list((folder / ckpt.DAMAGED_DIR).glob("*.pt"))) == 3


def test_cli_all_damaged_is_rc_2_in_one_line_and_fresh_starts_over(tiny_data, tmp_path, capsys):
    run = tmp_path / "r"
    assert cli.main(train_argv(tiny_data, run, "train.max_steps=10")) == 0
    for m in ckpt.list_checkpoints(run / "checkpoints"):
        damage(m)
    capsys.readouterr()
    argv = train_argv(tiny_data, run, "train.max_steps=10")
    assert cli.main([*argv, "--resume", "auto"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(err) == 1 and "damaged" in err[0]
    assert (run / "checkpoints" / "damaged" / "step-000000010.pt").exists()
    assert cli.main([*argv, "--resume", "fresh"]) == 0
    assert [ckpt.step_of(m) for m in ckpt.list_checkpoints(run / "checkpoints")] == [10]


# --------------------------------------------------------------------------- item 9: messages


def test_a_full_disk_at_resume_names_the_folder_and_the_checkpoint_kept(
    tiny_config, tmp_path, monkeypatch
):
    run = tmp_path / "r"
    Trainer(tiny_config(train__max_steps=10), run).train()

    def full(*args, dir=None, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", f"{dir}/tmpw5sgupzb")

    monkeypatch.setattr(train_ckpt.tempfile, "TemporaryFile", full)
    with pytest.raises(StorageError) as err:
        Trainer(tiny_config(train__max_steps=20), run).resume("auto")
    message = str(err.value)
    assert f"run folder {run} " in message and "No space left on device" in message
    assert "step-000000010.json" in message and "--resume auto" in message
    assert "tmpw5sgupzb" not in message and "\n" not in message


def test_a_read_only_run_folder_is_named_not_a_temp_file(tiny_config, tmp_path):
    if os.geteuid() == 0:
        run = "/sys/muongen-run"  # root writes anywhere but /sys
        with pytest.raises(StorageError, match=r"cannot write the run folder /sys/muongen-run "):
            Trainer(tiny_config(train__max_steps=10), run).train()
        return
    run = tmp_path / "ro"
    run.mkdir()
    run.chmod(0o555)
    try:
        with pytest.raises(StorageError) as err:
            Trainer(tiny_config(train__max_steps=10), run).train()
        assert f"run folder {run} (" in str(err.value) and "tmp" not in str(err.value)[-40:]
    finally:
        run.chmod(0o755)


def test_max_steps_0_with_a_cosine_schedule_names_max_steps(tiny_data, tmp_path, capsys):
    argv = ["train", "--config", "demo", "--out", str(tmp_path / "r"), "--max-steps", "0"]
    argv += ["--set", f"data.paths=[{tiny_data}]"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--max-steps 0" in err and "decay_steps" not in err


def test_train_help_says_ctrl_c_exits_130_and_names_resume_fresh(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "then 130" in text and "fresh" in text and "damaged" in text
