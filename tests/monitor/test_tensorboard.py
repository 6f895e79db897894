from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from muongen.monitor.tensorboard import (
    REDACTED,
    TensorBoardLogger,
    read_scalars,
    read_tags,
    scrub_secrets,
)

JWT = "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJhbGljZSIsInNjb3BlIjoic3RvcmFnZS5yZWFkOi8ifQ.c2lnbmF0dXJl"


def _texts(log_dir) -> str:
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return " ".join(
        ev.tensor_proto.string_val[0].decode()
        for tag in acc.Tags()["tensors"]
        for ev in acc.Tensors(tag)
        if ev.tensor_proto.string_val
    )


def test_scalars_round_trip(tmp_path):
    with TensorBoardLogger(tmp_path) as tb:
        for step in (1, 2, 3):
            tb.scalars(
                step,
                {
                    "loss/c_loss": torch.tensor(-1.5 * step),
                    "loss/g_loss": torch.tensor([0.25]),
                    "throughput/events_per_s": 1000.0 * step,
                    "health": "healthy",  # labels are skipped
                },
            )
    scalars = read_scalars(tmp_path)
    assert set(scalars) == {"loss/c_loss", "loss/g_loss", "throughput/events_per_s"}
    assert scalars["loss/c_loss"] == [(1, -1.5), (2, -3.0), (3, -4.5)]
    assert scalars["throughput/events_per_s"][-1] == (3, 3000.0)


def test_scalar_with_many_elements_is_refused(tmp_path):
    with TensorBoardLogger(tmp_path) as tb, pytest.raises(ValueError, match="loss/x"):
        tb.scalars(0, {"loss/x": torch.zeros(3)})


def test_histograms_and_overlay_image(tmp_path):
    rng = np.random.default_rng(0)
    real = rng.normal(size=(500, 3)).astype(np.float32)
    gen = torch.from_numpy(rng.normal(0.2, 1.1, size=(400, 3)).astype(np.float32))
    gen[0, 0] = float("nan")  # dropped, not an error
    with TensorBoardLogger(tmp_path) as tb:
        tb.real_vs_generated(7, real, gen, ["logE", "x", "y"])
        tb.histogram(8, "hist/other", torch.arange(10.0))
    tags = read_tags(tmp_path)
    assert {"hist/real/logE", "hist/gen/y", "hist/other"} <= set(tags["histograms"])
    assert tags["images"] == ["hist/real_vs_gen"]
    acc = EventAccumulator(str(tmp_path), size_guidance={"histograms": 0})
    acc.Reload()
    (ev,) = acc.Histograms("hist/gen/logE")
    assert ev.step == 7
    assert ev.histogram_value.num == 399


def test_figure_and_text_are_written(tmp_path):
    from matplotlib.figure import Figure

    fig = Figure()
    fig.subplots().plot([0, 1], [1, 0])
    with TensorBoardLogger(tmp_path) as tb:
        tb.figure(1, "eval/plot", fig)
        tb.text(1, "config", "lr: 2e-5\ntoken_file: /srv/tok\nauthz: " + JWT)
    assert read_tags(tmp_path)["images"] == ["eval/plot"]
    text = _texts(tmp_path)
    assert "lr: 2e-5" in text
    assert "/srv/tok" in text  # a token *file* name is not a secret
    assert JWT not in text and "eyJ" not in text


def test_hparams_never_carry_a_token(tmp_path):
    with TensorBoardLogger(tmp_path) as tb:
        tb.hparams(
            {
                "optim": {"lr": 2e-5, "betas": (0.5, 0.9)},
                "storage": {"token": "s3cr3t-value", "url": f"https://x/y?authz={JWT}"},
            },
            {"final/w_gap": 0.5},
        )
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert b"s3cr3t-value" not in raw
    assert JWT.encode() not in raw
    assert b"optim.lr" in raw
    assert read_scalars(tmp_path)["final/w_gap"] == [(0, 0.5)]


@pytest.mark.parametrize(
    ("text", "kept", "gone"),
    [
        (f"Authorization: Bearer {JWT}", "Authorization:", JWT),
        ("Bearer abcdefgh12345678", "Bearer", "abcdefgh12345678"),
        ("osdf:///ospool/x.pt?authz=abc123&x=1", "&x=1", "abc123"),
        ("BEARER_TOKEN=hunter2xyz", "BEARER_TOKEN=", "hunter2xyz"),
        ('{"password": "pw123456"}', '"password"', "pw123456"),
    ],
)
def test_scrub_secrets(text, kept, gone):
    out = scrub_secrets(text)
    assert kept in out
    assert gone not in out
    assert REDACTED in out


def test_disabled_logger_writes_nothing(tmp_path):
    log_dir = tmp_path / "tb"
    tb = TensorBoardLogger(log_dir, enabled=False)
    tb.scalars(1, {"loss/c_loss": 1.0})
    tb.histogram(1, "h", np.ones(5))
    tb.real_vs_generated(1, np.ones((4, 2)), np.ones((4, 2)), ["a", "b"])
    tb.text(1, "t", "x")
    tb.hparams({"a": 1})
    tb.flush()
    tb.close()
    assert not log_dir.exists()


def test_purge_step_hides_points_of_the_killed_run(tmp_path):
    with TensorBoardLogger(tmp_path) as tb:  # first run reached step 5, checkpoint at 3
        for step in range(6):
            tb.scalars(step, {"loss/c_loss": float(step)})
    with TensorBoardLogger(tmp_path, purge_step=4) as tb:  # resumed from step 3
        for step in range(4, 7):
            tb.scalars(step, {"loss/c_loss": 10.0 + step})
    steps = [s for s, _ in read_scalars(tmp_path)["loss/c_loss"]]
    assert steps == [0, 1, 2, 3, 4, 5, 6]


def _layout(log_dir):
    from tensorboard.plugins.custom_scalar import layout_pb2, metadata

    acc = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    acc.Reload()
    (ev,) = acc.Tensors(metadata.CONFIG_SUMMARY_TAG)
    return layout_pb2.Layout.FromString(ev.tensor_proto.string_val[0])


def test_a_training_run_opens_on_w_gap_losses_validation_and_throughput(tmp_path, capsys):
    # TensorBoard groups tags by their first part and sorts the groups by name: the run's
    # headline groups must come before the input counters (data/bad_events used to be first)
    from muongen.config import load_config
    from muongen.monitor.tensorboard import run_log_dir
    from muongen.train.distributed import DistInfo
    from muongen.train.monitor import TrainingMonitor

    cfg = load_config(None, ["logging.progress=plain", "logging.gpu_monitor=false"])
    log_dir = run_log_dir(tmp_path / "my-run")
    monitor = TrainingMonitor(cfg, log_dir, dist=DistInfo(), device=torch.device("cpu"))
    monitor.open(0)
    out = {k: torch.tensor(0.5) for k in ("c_loss", "g_loss", "m_loss", "gp", "w_gap", "skipped")}
    extra = {"data/bad_events": 0, "data/bad_files": 0, "lr/generator": 1e-4}
    monitor.log(10, out, {**extra, "time/critic_frac": 0.5})
    monitor.tb.scalars(10, {"3_val/median_ratio": 2.0})  # as validate() writes them
    monitor.close()

    assert log_dir == tmp_path / "my-run" / "tb" / "my-run"  # the run's name in TensorBoard
    tags = read_scalars(tmp_path / "my-run" / "tb")  # the one run below tb/
    groups = sorted({tag.split("/")[0] for tag in tags})
    assert groups[:4] == ["1_w_gap", "2_loss", "3_val", "4_throughput"], groups
    assert {"data", "health", "lr", "time"} <= set(groups[4:])
    assert sorted(t for t in tags if t.startswith("1_w_gap/")) == [
        "1_w_gap/w_gap",
        "1_w_gap/w_gap_ma",
    ]
    assert "4_throughput/events_per_s" in tags and "2_loss/c_loss" in tags

    # the custom-scalars tab: w_gap, losses, validation and events/s first, each chart
    # matching tags the run wrote
    layout = _layout(log_dir)
    first = layout.category[0]
    titles = [chart.title for chart in first.chart]
    assert titles[0].startswith("w_gap") and "losses" in titles[1]
    assert titles[2].startswith("validation") and titles[3].startswith("events/s")
    for category in layout.category:
        for chart in category.chart:
            (regex,) = chart.multiline.tag
            assert any(re.search(regex, tag) for tag in tags), (chart.title, regex)
    assert "docs/training.md#reading-the-training-output" in capsys.readouterr().err


def test_run_log_dir_keeps_a_run_written_before_in_tb(tmp_path):
    old = tmp_path / "old"
    write_old = TensorBoardLogger(old / "tb")
    write_old.scalars(1, {"x": 1.0})
    write_old.close()
    from muongen.monitor.tensorboard import run_log_dir

    assert run_log_dir(old) == old / "tb"  # resuming an older run: no second folder
    assert run_log_dir(tmp_path / "new") == tmp_path / "new" / "tb" / "new"
