from __future__ import annotations

import io

import pytest
import torch

from muongen.monitor.progress import DOCS, HEADER, Progress, format_metrics, format_seconds

METRICS = {
    "throughput/batches_per_s": 45.1,
    "throughput/events_per_s": 1.2e5,
    "throughput/muons_per_s": 4.0e4,
    "loss/c_loss": torch.tensor(-1.23),
    "loss/g_loss": 0.5,
    "loss/m_loss": 0.01,
    "loss/w_gap": 1.2,
    "loss/w_gap_ma": 1.1,
    "gpu/util_pct": 97.0,  # not part of the line
}


class Clock:
    """A settable clock, so elapsed times and ETAs are known answers."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_plain_line_format():
    out, clock = io.StringIO(), Clock()
    p = Progress(5000, mode="plain", stream=out, clock=clock)
    p.update(1199)  # no metrics: nothing printed in plain mode
    clock.t += 123.0
    p.update(1200, METRICS)  # pace so far: 1200 steps in 123 s -> 3800 steps in 389.5 s
    p.close()
    assert out.getvalue() == (
        f"{HEADER}\n"
        "step 1200/5000 | 2:03 elapsed | eta 6:30 | 45.1 batch/s | 1.2e5 ev/s | 4.0e4 mu/s | "
        "c_loss -1.23 | g_loss 0.5 | m_loss 0.01 | w_gap 1.2 (ma 1.1) | healthy\n"
    )


def test_first_line_points_at_the_docs():
    out = io.StringIO()
    Progress(10, mode="plain", stream=out)
    first = out.getvalue().splitlines()[0]
    assert first == HEADER and first.endswith("docs/training.md#reading-the-training-output")
    assert DOCS in HEADER and "w_gap" in HEADER and "m_loss" in HEADER


def test_eta_uses_the_pace_after_the_first_line():
    # start-up (compilation, normalisers) takes 100 s, then 10 steps/s: the ETA after the
    # first line must not carry the start-up
    out, clock = io.StringIO(), Clock()
    p = Progress(3000, mode="plain", stream=out, clock=clock, initial=1000)
    clock.t += 100.0 + 10.0
    p.update(1100, {"c_loss": 1.0})
    clock.t += 100.0
    p.update(2100, {"c_loss": 1.0})
    clock.t += 90.0
    p.update(3000, {"c_loss": 1.0})
    lines = out.getvalue().splitlines()[1:]
    assert lines[0].startswith("step 1100/3000 | 1:50 elapsed | eta 34:50 |")  # 1900 / (100/110)
    assert lines[1].startswith("step 2100/3000 | 3:30 elapsed | eta 1:30 |")  # 900 at 10/s
    assert lines[2].startswith("step 3000/3000 | 5:00 elapsed | eta 0:00 |")


def test_format_seconds():
    assert [format_seconds(s) for s in (0, 59.4, 61, 3599, 3600, 90061)] == [
        "0:00",
        "0:59",
        "1:01",
        "59:59",
        "1:00:00",
        "25:01:01",
    ]
    assert format_seconds(float("inf")) == "?"


def test_unbounded_run_has_no_total():
    out, clock = io.StringIO(), Clock()
    p = Progress(None, mode="plain", stream=out, clock=clock)
    clock.t += 5
    p.update(7, {"c_loss": 1.0})
    assert out.getvalue().splitlines()[1] == "step 7 | 0:05 elapsed | c_loss 1 | healthy"
    with Progress(None, mode="bar", stream=io.StringIO()) as p:
        p.update(3, {"c_loss": 1.0})


def test_short_names_and_explicit_health():
    line = format_metrics({"c_loss": 512.0, "w_gap": float("nan")})
    assert line == "c_loss 512 | w_gap nan | warning"
    assert format_metrics({"c_loss": 1.0, "health": "critical"}).endswith("| critical")


def test_auto_mode_is_plain_without_a_tty():
    assert Progress(10, stream=io.StringIO()).mode == "plain"


def test_bar_mode_moves_and_shows_metrics():
    out = io.StringIO()
    with Progress(100, mode="bar", stream=out, initial=10) as p:
        p.update(20)
        p.update(50, METRICS)
        p.write("a message")
        assert p._bar.n == 50
    text = out.getvalue()
    assert text.startswith(HEADER)
    assert "50/100" in text
    assert "c_loss -1.23" in text
    assert "a message" in text


def test_bad_mode():
    with pytest.raises(ValueError, match="progress mode"):
        Progress(10, mode="fancy")


#: a step's outputs as the trainer's monitor receives them
LOSSES = {k: torch.tensor(0.5) for k in ("c_loss", "g_loss", "m_loss", "gp", "w_gap", "skipped")}


def plain_monitor(max_steps: int):
    """The trainer's monitor with plain progress lines on a settable clock (no TensorBoard,
    no GPU sampler): the config, the clock and the monitor."""
    from muongen.config import load_config
    from muongen.train.distributed import DistInfo
    from muongen.train.monitor import TrainingMonitor

    cfg = load_config(
        None,
        [
            f"train.max_steps={max_steps}",
            "logging.progress=plain",
            "logging.tensorboard=false",
            "logging.gpu_monitor=false",
        ],
    )
    clock = Clock()
    monitor = TrainingMonitor(
        cfg, "unused", dist=DistInfo(), device=torch.device("cpu"), clock=clock
    )
    return cfg, clock, monitor


def test_a_resumed_run_counts_its_pace_from_where_it_resumed(capsys):
    # the trainer's monitor opens the progress at the resumed step: 100 steps in 100 s
    # leave 900 steps, 15 minutes (not the 1:22 that counting from step 0 would promise)
    _, clock, monitor = plain_monitor(max_steps=2000)
    monitor.open(1000)
    clock.t += 100.0
    monitor.log(1100, LOSSES, {})
    monitor.close()
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith("step 1100/2000 | 1:40 elapsed | eta 15:00 |"), line


def test_a_run_cut_by_its_budget_shows_the_new_length(capsys):
    # train.budget_minutes sets train.max_steps after its probe: the line and the ETA follow
    # (they said step 150/14000, eta 2:06:04 on a run that ends at step 3000)
    cfg, clock, monitor = plain_monitor(max_steps=14000)
    monitor.open(0)
    clock.t += 10.0
    monitor.log(100, LOSSES, {})
    cfg.train.max_steps = 3000  # what StepBudget._apply does
    clock.t += 10.0
    monitor.log(200, LOSSES, {})
    monitor.close()
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith("step 200/3000 | 0:20 elapsed | eta 4:40 |"), line  # 2800 at 10/s
