from __future__ import annotations

import io

import pytest
import torch

from muongen.monitor.progress import Progress, format_metrics

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


def test_plain_line_format():
    out = io.StringIO()
    p = Progress(5000, mode="plain", stream=out)
    p.update(1199)  # no metrics: nothing printed in plain mode
    p.update(1200, METRICS)
    p.close()
    assert out.getvalue() == (
        "step 1200/5000 | 45.1 batch/s | 1.2e5 ev/s | 4.0e4 mu/s | c_loss -1.23 | "
        "g_loss 0.5 | m_loss 0.01 | w_gap 1.2 (ma 1.1) | healthy\n"
    )


def test_unbounded_run_has_no_total():
    out = io.StringIO()
    Progress(None, mode="plain", stream=out).update(7, {"c_loss": 1.0})
    assert out.getvalue() == "step 7 | c_loss 1 | healthy\n"
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
    assert "50/100" in text
    assert "c_loss -1.23" in text
    assert "a message" in text


def test_bad_mode():
    with pytest.raises(ValueError, match="progress mode"):
        Progress(10, mode="fancy")
