"""Trainer: exact resume, signals, time budget, TensorBoard, non-finite rollback."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from muongen import checkpoint as ckpt
from muongen.errors import TrainingError
from muongen.train.trainer import Trainer

from .conftest import PYTHON, tiny_overrides


def audit_keys(run_dir: Path, rank: int = 0) -> np.ndarray:
    return np.fromfile(run_dir / "audit" / f"rank{rank}.i64", dtype="<i8")


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return ckpt.load(ckpt.find_latest(run_dir / "checkpoints"))["generator"]


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"parameter {k} differs"


def test_resume_in_process_equals_uninterrupted_run(tiny_config, tmp_path):
    full = Trainer(tiny_config(train__max_steps=30), tmp_path / "full")
    assert full.train() == 0

    part = Trainer(tiny_config(train__max_steps=20), tmp_path / "part")
    assert part.train() == 0
    resumed = Trainer(tiny_config(train__max_steps=30), tmp_path / "part")
    assert resumed.resume("auto") is not None
    assert resumed.step == 20
    assert resumed.train() == 0

    assert_same_weights(final_weights(tmp_path / "full"), final_weights(tmp_path / "part"))
    keys_full, keys_part = audit_keys(tmp_path / "full"), audit_keys(tmp_path / "part")
    assert len(keys_full) == 30 * 32
    np.testing.assert_array_equal(keys_full, keys_part)  # same events, same order
    assert len(np.unique(keys_part)) == len(keys_part)  # none twice


def test_a_run_with_the_muon_critic_resumes_exactly(tiny_config, tmp_path):
    """model.muon_critic: its weights and optimizer moments travel in the checkpoint (the
    resumed run ends on the uninterrupted run's weights, the per-muon critic's included),
    and a checkpoint made without it is refused, naming the setting."""
    from muongen.errors import CheckpointError

    def run(steps, folder):
        return Trainer(tiny_config(train__max_steps=steps, model__muon_critic=[8]), folder)

    assert run(12, tmp_path / "full").train() == 0
    assert run(7, tmp_path / "part").train() == 0
    resumed = run(12, tmp_path / "part")
    assert resumed.resume("auto") is not None and resumed.train() == 0
    full, part = (
        ckpt.load(ckpt.find_latest(tmp_path / d / "checkpoints")) for d in ("full", "part")
    )
    assert any(k.startswith("muon_critic.") for k in full["critic"])
    assert_same_weights(full["critic"], part["critic"])
    assert_same_weights(full["generator"], part["generator"])
    Trainer(tiny_config(train__max_steps=3), tmp_path / "plain").train()
    with pytest.raises(CheckpointError, match="muon_critic"):
        run(6, tmp_path / "plain").resume("auto")


def test_a_sharded_run_resumes_exactly(tiny_config, tmp_path, monkeypatch):
    """With the step's shards on their threads (train.step_shards, here cutting even the
    tiny batches), an interrupted and resumed run ends on the very same weights: the
    shards' RNGs are seeded from the global RNG, which the checkpoint carries."""
    import muongen.train.step as step_module

    monkeypatch.setattr(step_module, "SHARD_MIN_COST", 1)
    full = Trainer(tiny_config(train__max_steps=12, train__step_shards=2), tmp_path / "full")
    assert full.step_fn.shards == 2
    assert full.train() == 0
    part = Trainer(tiny_config(train__max_steps=7, train__step_shards=2), tmp_path / "part")
    assert part.train() == 0
    resumed = Trainer(tiny_config(train__max_steps=12, train__step_shards=2), tmp_path / "part")
    assert resumed.resume("auto") is not None and resumed.step == 7
    assert resumed.train() == 0
    assert_same_weights(final_weights(tmp_path / "full"), final_weights(tmp_path / "part"))
    # and not the weights of an unsharded run (the shards draw other noise)
    one = Trainer(tiny_config(train__max_steps=12, train__step_shards=1), tmp_path / "one")
    assert one.train() == 0
    a, b = final_weights(tmp_path / "full"), final_weights(tmp_path / "one")
    assert any(not torch.equal(a[k], b[k]) for k in a)


def _train_cmd(data, out, steps, *extra):
    sets = tiny_overrides(data, **{"train.max_steps": steps, "checkpoint.every_steps": 5})
    args = [PYTHON, "-m", "muongen", "train", "--config", "demo", "--out", str(out)]
    args += [a for s in sets for a in ("--set", s)]
    return args + list(extra)


def _wait_for(predicate, proc, timeout=120.0):
    t0 = time.monotonic()
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(
                f"process ended early with {proc.returncode}: {proc.stderr.read()}"
            )
        if time.monotonic() - t0 > timeout:
            proc.kill()
            raise AssertionError("timed out")
        time.sleep(0.05)


@pytest.mark.integration
def test_sigkill_then_resume_equals_uninterrupted_run(tiny_data, tmp_path, cli_env):
    steps = 60
    subprocess.run(
        _train_cmd(tiny_data, tmp_path / "a", steps), env=cli_env, check=True, capture_output=True
    )

    b = tmp_path / "b"
    proc = subprocess.Popen(
        _train_cmd(tiny_data, b, steps),
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for(lambda: len(ckpt.list_checkpoints(b / "checkpoints")) >= 2, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = ckpt.read_manifest(ckpt.list_checkpoints(b / "checkpoints")[-1])["step"]
    assert killed_at < steps, "the run finished before it could be killed"

    done = subprocess.run(
        _train_cmd(tiny_data, b, steps, "--resume", "auto"),
        env=cli_env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "resumed from" in done.stderr

    assert_same_weights(final_weights(tmp_path / "a"), final_weights(b))
    np.testing.assert_array_equal(audit_keys(tmp_path / "a"), audit_keys(b))


@pytest.mark.integration
@pytest.mark.parametrize("exit_code", [0, 85])
def test_sigterm_checkpoints_and_exits(tiny_data, tmp_path, cli_env, exit_code):
    out = tmp_path / "run"
    cmd = _train_cmd(tiny_data, out, 100000, "--set", f"train.signal_exit_code={exit_code}")
    proc = subprocess.Popen(
        cmd, env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    _wait_for(lambda: len(ckpt.list_checkpoints(out / "checkpoints")) >= 1, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == exit_code, err
    last = ckpt.read_manifest(ckpt.find_latest(out / "checkpoints"))
    assert 5 <= last["step"] < 100000
    assert "received SIGTERM" in err


def test_time_budget_exits_85_and_the_restart_loses_no_event(tiny_config, tmp_path):
    epoch = {"train__max_steps": 0, "data__max_epochs": 1}
    Trainer(tiny_config(**epoch), tmp_path / "whole").train()

    # A clock that advances one second per reading: the 7 s budget runs out after a few
    # steps, whatever the speed of the machine.
    ticks = iter(range(10**6))
    t = Trainer(
        tiny_config(**epoch, train__time_budget_s=7),
        tmp_path / "r",
        clock=lambda: float(next(ticks)),
    )
    assert t.train() == 85  # "checkpointed, restart me"
    last = ckpt.read_manifest(ckpt.find_latest(tmp_path / "r" / "checkpoints"))
    assert last["step"] == t.step > 0
    again = Trainer(tiny_config(**epoch), tmp_path / "r")
    again.resume("auto")
    assert again.train() == 0
    np.testing.assert_array_equal(audit_keys(tmp_path / "whole"), audit_keys(tmp_path / "r"))


def test_tensorboard_has_the_scalars(tiny_config, tmp_path):
    from muongen.monitor.tensorboard import read_scalars, read_tags

    t = Trainer(tiny_config(train__max_steps=20, logging__hist_every=10), tmp_path / "r")
    t.train()
    # the run is named after its folder in `tensorboard --logdir r/tb`, not "."
    assert {p.parent.name for p in (tmp_path / "r" / "tb").rglob("events.out.tfevents.*")} == {"r"}
    scalars = read_scalars(tmp_path / "r" / "tb")
    for tag in (
        "2_loss/c_loss",
        "2_loss/g_loss",
        "2_loss/m_loss",
        "1_w_gap/w_gap",
        "1_w_gap/w_gap_ma",
        "4_throughput/events_per_s",
        "4_throughput/muons_per_s",
        "lr/generator",
    ):
        assert tag in scalars, f"{tag} missing from {sorted(scalars)}"
    assert [s for s, _ in scalars["2_loss/c_loss"]] == [5, 10, 15, 20]
    assert all(np.isfinite(v) for _, v in scalars["2_loss/c_loss"])
    for phase in ("data_wait", "h2d", "critic", "generator"):  # the time split
        assert f"time/{phase}_frac" in scalars, phase
    assert scalars["time/critic_frac"][-1][1] > 0.05  # the step's own phases are timed
    assert scalars["time/generator_frac"][-1][1] > 0.01
    tags = read_tags(tmp_path / "r" / "tb")
    assert {"hist/real/log10_energy", "hist/gen/log10_energy", "hist/gen/log10_mult"} <= set(
        tags["histograms"]
    )
    assert "hist/real_vs_gen" in tags["images"]


def test_histograms_leave_the_trained_model_as_without_them(tiny_config, tmp_path):
    """Logging histograms generates bundles; their noise must not come out of the
    training's RNG stream, or turning them on (or their period) changes the model."""
    Trainer(tiny_config(train__max_steps=20), tmp_path / "off").train()
    Trainer(tiny_config(train__max_steps=20, logging__hist_every=3), tmp_path / "on").train()
    assert_same_weights(final_weights(tmp_path / "off"), final_weights(tmp_path / "on"))


def test_run_folder_has_config_summary_and_reports(tiny_config, tmp_path):
    run = tmp_path / "r"
    Trainer(tiny_config(train__max_steps=10), run).train()
    assert "batch_events: 32" in (run / "config.yaml").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["step"] == 10 and summary["events_seen"] == 320
    assert (run / "bad_input.json").exists()


def test_end_of_data_stops_after_max_epochs(tiny_config, tmp_path):
    t = Trainer(tiny_config(train__max_steps=0, data__max_epochs=1), tmp_path / "r")
    assert t.train() == 0
    keys = audit_keys(tmp_path / "r")
    assert len(np.unique(keys)) == len(keys)
    assert t.events_seen == len(keys) == t.stream.stats["events"]


def test_data_that_gives_no_event_is_an_error_naming_the_reasons(tiny_config, tmp_path):
    """Every event an outlier or empty (dropped): the run stops with an error that says so,
    and bad_input.json is written. Without an epoch limit it used to wait forever."""
    from muongen import schema
    from muongen.data.batch import RaggedBatch
    from muongen.data.reader import read_events
    from muongen.data.writers import write_events
    from muongen.errors import InputFileError

    real = read_events(str(sorted((Path(tiny_config().data.paths[0])).glob("*.parquet"))[0]))
    big = np.flatnonzero(real.counts.numpy() > 2)[:100].tolist()
    picked = RaggedBatch.concat([real.slice(i, i + 1) for i in big])
    for i in range(2):
        write_events(tmp_path / "data" / f"f{i}.parquet", picked, schema.FORMAT_V1)
    cfg = tiny_config(
        data__paths=f"[{tmp_path / 'data'}]", data__max_muons_per_event=2, train__max_steps=20
    )
    run = tmp_path / "r"
    with pytest.raises(InputFileError, match=r"no event could be read from the 2 input file"):
        Trainer(cfg, run).train()
    assert (run / "bad_input.json").exists()


def test_nonfinite_steps_roll_back_then_stop(tiny_config, tmp_path, monkeypatch):
    t = Trainer(
        tiny_config(
            train__max_steps=1000, train__nonfinite_rollback_after=3, train__max_rollbacks=2
        ),
        tmp_path / "r",
    )
    real_step = t.step_fn.__class__.__call__

    def poisoned(self, micro):
        out = real_step(self, micro)
        if t.step >= 12:  # from step 12 on every update is "non-finite"
            out = dict(out, skipped=torch.ones((), device=out["skipped"].device))
        return out

    monkeypatch.setattr(t.step_fn.__class__, "__call__", poisoned)
    with pytest.raises(TrainingError, match="non-finite"):
        t.train()
    assert t.rollbacks == 3
    assert ckpt.read_manifest(ckpt.find_latest(tmp_path / "r" / "checkpoints"))["step"] == 10


def test_resume_names_changed_training_settings(tiny_config, tmp_path, caplog):
    Trainer(tiny_config(train__max_steps=10), tmp_path / "r").train()
    same = Trainer(tiny_config(train__max_steps=10), tmp_path / "r")
    with caplog.at_level("WARNING", logger="muongen.train.trainer"):
        assert same.resume("auto") is not None
    assert "training settings other than its own" not in caplog.text

    caplog.clear()
    other = Trainer(tiny_config(train__max_steps=10, optim__lr_critic=3e-4), tmp_path / "r")
    with caplog.at_level("WARNING", logger="muongen.train.trainer"):
        assert other.resume("auto") is not None
    assert "training settings other than its own" in caplog.text
    assert "optim.lr_critic: 0.0001 in the checkpoint, 0.0003 here" in caplog.text
    assert "max_steps" not in caplog.text  # a constant rate: the length is not a schedule


def test_schedule_differences_name_the_cosine_horizon():
    saved = {
        "optim": {"schedule": "cosine", "decay_steps": 0, "lr_critic": 2e-4},
        "train": {"max_steps": 16000},
    }
    now = {
        "optim": {"schedule": "cosine", "decay_steps": 0, "lr_critic": 3e-4},
        "train": {"max_steps": 11000},
    }
    assert ckpt.schedule_differences(saved, now) == [
        "optim.lr_critic: 0.0002 in the checkpoint, 0.0003 here",
        "train.max_steps: 16000 in the checkpoint, 11000 here",
    ]
    assert ckpt.schedule_differences(saved, saved) == []
    assert ckpt.schedule_differences({}, now) == []  # an old checkpoint without a config


def test_resume_refuses_a_model_of_another_shape(tiny_config, tmp_path):
    from muongen.errors import CheckpointError

    Trainer(tiny_config(train__max_steps=10), tmp_path / "r").train()
    other = Trainer(tiny_config(train__max_steps=20, model__context=64), tmp_path / "r")
    with pytest.raises(CheckpointError, match="does not fit"):
        other.resume("auto")


@pytest.mark.integration
def test_ddp_two_processes_on_gloo(tiny_data, tmp_path, cli_env):
    out = tmp_path / "ddp"
    sets = tiny_overrides(
        tiny_data, **{"train.max_steps": 0, "data.max_epochs": 1, "checkpoint.every_steps": 10}
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--standalone",
        "-m",
        "muongen",
        "train",
        "--config",
        "demo",
        "--out",
        str(out),
    ]
    cmd += [a for s in sets for a in ("--set", s)]
    done = subprocess.run(cmd, env=cli_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    k0, k1 = audit_keys(out, 0), audit_keys(out, 1)
    assert len(k0) and len(k1)
    assert not set(k0) & set(k1), "the two ranks trained on the same events"
    assert len(np.unique(k0)) == len(k0) and len(np.unique(k1)) == len(k1)
    manifests = ckpt.list_checkpoints(out / "checkpoints")
    assert manifests, "no checkpoint written"
    payload = ckpt.load(manifests[-1])
    assert payload["inputs"]["world_size"] == 2 and len(payload["data"]) == 2
    assert len(list((out / "tb").rglob("events.out.tfevents.*"))) == 1  # one writer


def test_dataloader_workers_with_prefetch(tiny_config, tmp_path):
    """Worker processes each get their own Prefetcher (a live one cannot cross processes)."""
    t = Trainer(
        tiny_config(
            train__max_steps=0, data__max_epochs=1, data__num_workers=2, storage__prefetch=2
        ),
        tmp_path / "r",
    )
    assert t._prefetcher is None and t.stream.prefetcher_factory is not None
    assert t.train() == 0
    keys = audit_keys(tmp_path / "r")
    assert len(keys) == len(np.unique(keys)) == t.stream.stats["events"]


def test_profile_steps_print_top_operators_and_write_a_trace(tiny_config, tmp_path, capsys):
    t = Trainer(tiny_config(train__max_steps=6), tmp_path / "r")
    assert t.train(profile_steps=2) == 0
    assert list((tmp_path / "r" / "profile").glob("*.json")), "no Chrome trace written"
    out = capsys.readouterr()
    assert "Self CPU" in out.out + out.err  # the operator table
    assert t.step == 6  # profiled steps count as training steps


def test_periodic_validation_reaches_tensorboard(tiny_config, tiny_data, tmp_path):
    from muongen.monitor.tensorboard import read_scalars, read_tags

    held_out = sorted(tiny_data.glob("*.parquet"))[-1]
    t = Trainer(
        tiny_config(
            train__max_steps=10,
            data__val_paths=f"[{held_out}]",
            logging__val_every=5,
            logging__val_events=400,
        ),
        tmp_path / "r",
    )
    t.train()
    scalars = read_scalars(tmp_path / "r" / "tb")
    val = {k: v for k, v in scalars.items() if k.startswith("3_val/")}
    assert val, "no validation scalars"
    assert all(steps == [5, 10] for steps in ([s for s, _ in v] for v in val.values()))
    assert any(tag.startswith("3_val/") for tag in read_tags(tmp_path / "r" / "tb")["images"])
    # the best checkpoint is the validation with the lowest score, kept as best.*
    scores = dict(val["3_val/score"])
    best_step = min(scores, key=lambda s: (scores[s], s))
    from muongen import checkpoint as fmt

    manifest = tmp_path / "r" / "checkpoints" / "best.json"
    assert fmt.read_manifest(manifest)["step"] == best_step
    payload = fmt.load(manifest)
    assert payload["best"] == {"score": pytest.approx(scores[best_step]), "step": best_step}
    assert t.best.value == pytest.approx(scores[best_step])


def test_cpu_threads_sets_torchs_thread_count(tiny_config, tmp_path):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        Trainer(tiny_config(train__cpu_threads=1), tmp_path / "one")
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        Trainer(tiny_config(train__cpu_threads=0), tmp_path / "default")
        assert torch.get_num_threads() == 2  # 0 leaves the count as it was
    finally:
        torch.set_num_threads(before)


def test_negative_cpu_threads_is_a_config_error():
    from muongen.config import load_config
    from muongen.errors import ConfigError

    with pytest.raises(ConfigError, match=r"train\.cpu_threads"):
        load_config("demo", ["train.cpu_threads=-1"])
