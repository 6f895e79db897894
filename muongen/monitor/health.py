"""Training health from the critic loss (design section 7) and the w_gap moving average.

Thresholds on |c_loss|: up to 300 is ``healthy``, above 300 a ``warning``, above 1000 (or
NaN/inf) ``critical``. The design calls |c_loss| <= 200 healthy and > 300 a warning and
leaves 200-300 unnamed; that band is folded into ``healthy`` so that the labels stay the
three of the contract and a loss drifting around 250 does not flap between states.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Literal

Health = Literal["healthy", "warning", "critical"]

#: |c_loss| at or below this is healthy without question (design section 7).
HEALTHY_MAX = 200.0
#: |c_loss| above this is a warning (200-300 counts as healthy, see the module docstring).
WARNING_ABOVE = 300.0
#: |c_loss| above this, or a non-finite c_loss, is critical.
CRITICAL_ABOVE = 1000.0


def classify(c_loss: float) -> Health:
    """The health label of one critic loss value (a float or a 0-d tensor)."""
    c = float(c_loss)
    if not math.isfinite(c) or abs(c) > CRITICAL_ABOVE:
        return "critical"
    if abs(c) > WARNING_ABOVE:
        return "warning"
    return "healthy"


class MovingAverage:
    """Mean of the last ``window`` finite values (w_gap's 500-step average).

    Non-finite values are ignored: a NaN step is skipped by the trainer and must not poison
    the average. ``state_dict()`` / ``load_state_dict()`` carry the window across a resume.
    """

    def __init__(self, window: int = 500) -> None:
        if window < 1:
            raise ValueError(f"MovingAverage window must be >= 1, got {window}")
        self.window = window
        self._values: deque[float] = deque(maxlen=window)

    def update(self, value: float) -> float:
        """Add a value (float or 0-d tensor) and return the current average."""
        v = float(value)
        if math.isfinite(v):
            self._values.append(v)
        return self.value

    @property
    def value(self) -> float:
        """The current average; NaN before the first finite value."""
        if not self._values:
            return math.nan
        return math.fsum(self._values) / len(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def state_dict(self) -> dict[str, Any]:
        return {"window": self.window, "values": list(self._values)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the values; with a different window, the most recent ones are kept."""
        self._values = deque((float(v) for v in state["values"]), maxlen=self.window)
