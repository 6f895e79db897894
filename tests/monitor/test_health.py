from __future__ import annotations

import math

import pytest
import torch

from muongen.monitor.health import MovingAverage, classify


@pytest.mark.parametrize(
    ("c_loss", "label"),
    [
        (0.0, "healthy"),
        (-199.0, "healthy"),
        (250.0, "healthy"),  # the 200-300 band is folded into healthy
        (300.0, "healthy"),
        (-300.5, "warning"),
        (999.0, "warning"),
        (1000.5, "critical"),
        (-5000.0, "critical"),
        (math.nan, "critical"),
        (math.inf, "critical"),
        (torch.tensor(-400.0), "warning"),
    ],
)
def test_classify_thresholds(c_loss, label):
    assert classify(c_loss) == label


def test_moving_average_window_and_nan():
    ma = MovingAverage(window=3)
    assert math.isnan(ma.value)
    for v in [1.0, 2.0, 3.0, 4.0]:
        ma.update(v)
    assert ma.value == pytest.approx(3.0)  # mean of 2, 3, 4
    assert ma.update(math.nan) == pytest.approx(3.0)  # a skipped step does not count
    assert len(ma) == 3


def test_moving_average_state_round_trip():
    ma = MovingAverage(window=4)
    for v in range(10):
        ma.update(float(v))
    restored = MovingAverage(window=4)
    restored.load_state_dict(ma.state_dict())
    assert restored.value == ma.value
    assert restored.update(100.0) == ma.update(100.0)

    shorter = MovingAverage(window=2)  # a changed window keeps the newest values
    shorter.load_state_dict(ma.state_dict())
    assert shorter.value == pytest.approx((9.0 + 100.0) / 2)


def test_moving_average_rejects_bad_window():
    with pytest.raises(ValueError, match="window"):
        MovingAverage(window=0)
