from __future__ import annotations

import pytest

from muongen.monitor.timing import PHASES, StepTimer


def test_fractions_sum_to_one_with_other(fake_clock):
    timer = StepTimer("cpu", clock=fake_clock)
    for _ in range(2):
        with timer.phase("data_wait"):
            fake_clock.t += 1.0
        with timer.phase("critic"):
            fake_clock.t += 3.0
        fake_clock.t += 1.0  # outside any phase: "other"
    snap = timer.snapshot()
    assert snap["time/window_s"] == pytest.approx(10.0)
    assert snap["time/data_wait_s"] == pytest.approx(2.0)
    assert snap["time/critic_frac"] == pytest.approx(0.6)
    assert snap["time/other_frac"] == pytest.approx(0.2)
    assert snap["time/generator_s"] == 0.0
    fracs = [snap[f"time/{p}_frac"] for p in (*PHASES, "other")]
    assert sum(fracs) == pytest.approx(1.0)


def test_snapshot_starts_a_new_window(fake_clock):
    timer = StepTimer("cpu", clock=fake_clock)
    with timer.phase("optimizer"):
        fake_clock.t += 2.0
    timer.snapshot()
    fake_clock.t += 4.0
    snap = timer.snapshot()
    assert snap["time/optimizer_s"] == 0.0
    assert snap["time/other_frac"] == pytest.approx(1.0)


def test_real_clock_fractions_sum_to_one():
    timer = StepTimer("cpu")
    for _ in range(3):
        with timer.phase("h2d"):
            sum(range(20000))
        with timer.phase("generator"):
            sum(range(20000))
    snap = timer.snapshot()
    total = sum(snap[f"time/{p}_frac"] for p in (*PHASES, "other"))
    assert total == pytest.approx(1.0)
    assert snap["time/h2d_s"] > 0


def test_unknown_and_nested_phases_are_refused():
    timer = StepTimer("cpu")
    with pytest.raises(ValueError, match="unknown phase"), timer.phase("backward"):
        pass
    with (
        pytest.raises(RuntimeError, match="inside"),
        timer.phase("critic"),
        timer.phase("generator"),
    ):
        pass
    with timer.phase("critic"):  # the failed nesting left no phase active
        pass
