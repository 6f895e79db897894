"""One run folder holds one run: fresh starts reset every part, a second run is refused,
leftovers of a kill are cleaned, unwritable places fail in one line, and a checkpoint's
bytes carry nothing but the training state."""

from __future__ import annotations

import errno
import logging

import numpy as np
import pytest

from muongen import checkpoint as ckpt
from muongen.errors import CheckpointError, StorageError
from muongen.train.trainer import Trainer

from .conftest import tiny_overrides


def audit_keys(run_dir):
    return np.fromfile(run_dir / "audit" / "rank0.i64", dtype="<i8")


def c_loss_steps(run_dir):
    from muongen.monitor.tensorboard import read_scalars

    return [s for s, _ in read_scalars(run_dir / "tb")["2_loss/c_loss"]]


def test_resumed_final_checkpoint_has_the_same_bytes(tiny_config, tmp_path):
    """Two saves of the same state are the same bytes (no scheduler _step_count): a node
    that resumes and re-saves its final state publishes what its first attempt did."""
    Trainer(tiny_config(train__max_steps=20), tmp_path / "full").train()
    Trainer(tiny_config(train__max_steps=10), tmp_path / "part").train()
    resumed = Trainer(tiny_config(train__max_steps=20), tmp_path / "part")
    resumed.resume("auto")
    resumed.train()
    name = ckpt.STEP_NAME.format(20) + ".json"
    full = ckpt.read_manifest(tmp_path / "full" / "checkpoints" / name)
    part = ckpt.read_manifest(tmp_path / "part" / "checkpoints" / name)
    assert full["sha256"] == part["sha256"]


@pytest.mark.parametrize("how", ["killed before the first checkpoint", "every checkpoint corrupt"])
def test_a_fresh_start_resets_audit_log_and_tensorboard(tiny_config, tmp_path, how):
    run = tmp_path / "r"
    Trainer(tiny_config(train__max_steps=10), run).train()
    for manifest in ckpt.list_checkpoints(run / "checkpoints"):
        if how.startswith("killed"):
            ckpt.remove(manifest)
        else:
            pt = manifest.with_suffix(".pt")
            pt.write_bytes(pt.read_bytes()[:-1] + b"!")
    again = Trainer(tiny_config(train__max_steps=10), run)
    # nothing valid: a fresh start (asked for explicitly where every checkpoint is damaged)
    assert again.resume("auto" if how.startswith("killed") else "fresh") is None
    again.train()
    keys = audit_keys(run)
    assert len(keys) == 10 * 32 == len(np.unique(keys))  # once, not twice
    assert c_loss_steps(run) == [5, 10]
    assert [ckpt.step_of(m) for m in ckpt.list_checkpoints(run / "checkpoints")] == [10]


def test_a_second_run_in_a_run_folder_is_refused(tiny_config, tmp_path, caplog):
    run = tmp_path / "r"
    Trainer(tiny_config(train__max_steps=20), run).train()
    before = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    with pytest.raises(CheckpointError, match=r"already holds checkpoints.*--resume auto"):
        Trainer(tiny_config(train__max_steps=10), run).train()
    Trainer(tiny_config(train__max_steps=5), tmp_path / "other").train()
    with pytest.raises(CheckpointError, match="would mix two runs"):
        Trainer(tiny_config(train__max_steps=10), run).resume(
            str(tmp_path / "other" / "checkpoints")
        )
    assert {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()} == before


def test_cli_train_twice_into_one_folder(tiny_data, tmp_path, capsys):
    """The README's demo command run twice: the second refuses in one line, exit 2;
    with --resume auto it continues (here: already at max_steps, so it just ends)."""
    from muongen import cli

    out = tmp_path / "demo"
    argv = ["train", "--config", "demo", "--out", str(out)]
    argv += [a for s in tiny_overrides(tiny_data, **{"train.max_steps": 10}) for a in ("--set", s)]
    assert cli.main(argv) == 0
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "already holds checkpoints" in err and "Traceback" not in err
    assert cli.main([*argv, "--resume", "auto"]) == 0
    assert [ckpt.step_of(m) for m in ckpt.list_checkpoints(out / "checkpoints")] == [10]


def test_leftovers_of_a_kill_are_cleaned(tiny_config, tmp_path):
    run = tmp_path / "r"
    Trainer(tiny_config(train__max_steps=20), run).train()
    folder = run / "checkpoints"
    (folder / ".step-000000030.pt.abc123.tmp").write_bytes(b"x" * 1000)  # killed mid-write
    (folder / "step-000000030.pt").write_bytes(b"y" * 1000)  # killed between .pt and .json
    ckpt.remove(folder / "step-000000010.json")  # ... or mid-rotation (manifest went first)
    (folder / "step-000000010.pt").write_bytes(b"z")
    (folder / "notes.txt").write_text("mine")  # not ours: kept
    again = Trainer(tiny_config(train__max_steps=30), run)
    again.resume("auto")
    assert sorted(p.name for p in folder.iterdir()) == [
        "notes.txt",
        "step-000000020.json",
        "step-000000020.pt",
    ]


def test_an_unwritable_run_folder_fails_in_one_line(tiny_config):
    with pytest.raises(StorageError, match=r"cannot write the run folder.*writable --out"):
        Trainer(tiny_config(train__max_steps=10), "/sys/muongen-run").train()


def test_a_full_disk_at_a_checkpoint_fails_in_one_line(tiny_config, tmp_path, monkeypatch):
    real_save = ckpt.save

    def full_disk(state, directory, name, **kw):
        if kw["step"] >= 20:
            raise OSError(errno.ENOSPC, "No space left on device", str(directory / name))
        return real_save(state, directory, name, **kw)

    monkeypatch.setattr(ckpt, "save", full_disk)
    t = Trainer(tiny_config(train__max_steps=30), tmp_path / "r")
    with pytest.raises(StorageError) as err:
        t.train()
    message = str(err.value)
    assert "No space left on device" in message and "step-000000010.json" in message
    assert "\n" not in message


def test_resume_on_other_inputs_warns_and_restarts_the_data(
    tiny_config, tiny_data, tmp_path, caplog
):
    """A chain node continues the model on new files by design: accepted, with a warning."""
    files = sorted(str(p) for p in tiny_data.glob("*.parquet"))
    Trainer(tiny_config(train__max_steps=10, data__paths=f"[{files[0]}]"), tmp_path / "a").train()
    node = Trainer(tiny_config(train__max_steps=15, data__paths=f"[{files[1]}]"), tmp_path / "b")
    with caplog.at_level(logging.WARNING, logger="muongen.train.trainer"):
        node.resume(str(tmp_path / "a" / "checkpoints"))
    assert "other input files" in caplog.text
    assert node.step == 10 and node.data.steps == 0
    node.train()
    assert node.step == 15 and node.data.steps == 5
    assert len(audit_keys(tmp_path / "b")) == 5 * 32  # this node's events only


def test_a_model_mismatch_names_the_settings_that_differ(tiny_config, tmp_path):
    Trainer(tiny_config(train__max_steps=10), tmp_path / "r").train()
    other = Trainer(tiny_config(train__max_steps=20, model__context=64), tmp_path / "r")
    with pytest.raises(
        CheckpointError, match=r"model\.context: 32 in the checkpoint, 64 here"
    ) as e:
        other.resume("auto")
    assert "inspect-checkpoint" not in str(e.value)
