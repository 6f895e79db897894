"""Progress of a training run: a tqdm bar on a terminal, plain lines otherwise (grid jobs).

A plain line reads::

    step 1200/5000 | 2:03 elapsed | eta 8:21 | 45.1 batch/s | 1.2e5 ev/s | 4.0e4 mu/s |
    c_loss -1.23 | g_loss 0.5 | m_loss 0.01 | w_gap 1.2 (ma 1.1) | healthy

(on one line; no eta for a run bounded only by its data). The bar shows the same times and
steps/s itself and the metrics after it. Before the first line, one line says what the
columns are and where they are explained (:data:`DOCS`).

Metrics are looked up by the last part of their key, so the trainer can pass its
TensorBoard dict as is: ``loss/c_loss`` and ``c_loss`` both work. Known names:
``batches_per_s``, ``events_per_s``, ``muons_per_s``, ``c_loss``, ``g_loss``, ``m_loss``,
``w_gap``, ``w_gap_ma`` and ``health`` (a label; derived from ``c_loss`` when absent).
Missing ones are left out of the line, others are ignored.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, TextIO

from muongen.monitor.health import classify

Mode = Literal["auto", "bar", "plain"]

#: Where the losses and the other columns are explained (the user guide's training page).
DOCS = "docs/training.md#reading-the-training-output"
#: The first line of a run's progress.
HEADER = f"what the columns mean (c/g/m_loss, w_gap, health): {DOCS}"

#: (metric name, unit or label, format) in display order; "g" = 3 significant digits.
_FIELDS = (
    ("batches_per_s", "batch/s", ".1f"),
    ("events_per_s", "ev/s", ".1e"),
    ("muons_per_s", "mu/s", ".1e"),
    ("c_loss", "c_loss", ".3g"),
    ("g_loss", "g_loss", ".3g"),
    ("m_loss", "m_loss", ".3g"),
)


def _num(value: Any, spec: str) -> str:
    """Format a number compactly: 1.2e+05 -> 1.2e5, 1e-05 -> 1e-5."""
    v = float(value)
    if not math.isfinite(v):
        return str(v)
    text = format(v, spec)
    if "e" in text:
        mant, exp = text.split("e")
        text = f"{mant}e{int(exp)}"
    return text


def format_seconds(seconds: float) -> str:
    """``m:ss`` below an hour, ``h:mm:ss`` above, ``?`` when unknown (as tqdm's bar)."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = round(seconds)
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def _by_name(metrics: Mapping[str, Any]) -> dict[str, Any]:
    return {key.rsplit("/", 1)[-1]: value for key, value in metrics.items()}


def format_metrics(metrics: Mapping[str, Any]) -> str:
    """The metrics part of a progress line (without the step), ' | '-separated."""
    m = _by_name(metrics)
    parts = []
    for name, label, spec in _FIELDS:
        if name in m:
            text = _num(m[name], spec)
            parts.append(f"{text} {label}" if name.endswith("_per_s") else f"{label} {text}")
    if "w_gap" in m:
        text = f"w_gap {_num(m['w_gap'], '.3g')}"
        if "w_gap_ma" in m:
            text += f" (ma {_num(m['w_gap_ma'], '.3g')})"
        parts.append(text)
    health = m.get("health")
    if health is None and "c_loss" in m:
        health = classify(m["c_loss"])
    if health is not None:
        parts.append(str(health))
    return " | ".join(parts)


class Progress:
    """``update(step)`` every step is cheap; ``update(step, metrics)`` at log steps.

    In bar mode each update moves the bar and metrics go to its postfix; in plain mode only
    updates with metrics print a line. ``total`` is None for a run bounded only by its data;
    ``initial`` is the step a resumed run starts from. Elapsed time counts from construction;
    the ETA uses the pace since the first line (so start-up costs stay out of it).
    """

    def __init__(
        self,
        total: int | None,
        mode: Mode = "auto",
        stream: TextIO | None = None,
        *,
        initial: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if mode not in ("auto", "bar", "plain"):
            raise ValueError(f"progress mode must be auto, bar or plain, got {mode!r}")
        self.total = total
        self.stream = sys.stderr if stream is None else stream
        if mode == "auto":
            isatty = getattr(self.stream, "isatty", None)
            mode = "bar" if isatty is not None and isatty() else "plain"
        self.mode = mode
        self.clock = clock
        self._t0 = clock()
        self._mark: tuple[int, float] = (initial, self._t0)  # pace from here
        self._marked = False
        self._bar = None
        print(HEADER, file=self.stream, flush=True)
        if mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(
                total=total,
                initial=initial,
                file=self.stream,
                unit="step",
                dynamic_ncols=True,
                smoothing=0.05,
            )

    def set_total(self, total: int | None) -> None:
        """The run's length changed (``train.budget_minutes`` cut it): the step count and the
        ETA follow."""
        if total == self.total:
            return
        self.total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def times(self, step: int) -> str:
        """``2:03 elapsed | eta 8:21`` at ``step`` (no eta without a total or a pace yet)."""
        now = self.clock()
        text = f"{format_seconds(now - self._t0)} elapsed"
        if self.total is None:
            return text
        step0, t0 = self._mark
        if step >= self.total:
            return text + " | eta 0:00"
        if step <= step0 or now <= t0:
            return text + " | eta ?"
        return text + f" | eta {format_seconds((self.total - step) * (now - t0) / (step - step0))}"

    def line(self, step: int, metrics: Mapping[str, Any]) -> str:
        """The plain line for ``step``."""
        rest = format_metrics(metrics)
        head = f"step {step}" if self.total is None else f"step {step}/{self.total}"
        head += f" | {self.times(step)}"
        return f"{head} | {rest}" if rest else head

    def update(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
        if self._bar is not None:
            if step > self._bar.n:
                self._bar.update(step - self._bar.n)
            if metrics:
                self._bar.set_postfix_str(format_metrics(metrics), refresh=False)
            return
        if metrics is not None:
            print(self.line(step, metrics), file=self.stream, flush=True)
            if not self._marked:  # the pace counts from the first line
                self._mark, self._marked = (step, self.clock()), True

    def write(self, message: str) -> None:
        """Print a message without breaking the bar."""
        if self._bar is not None:
            self._bar.write(message, file=self.stream)
        else:
            print(message, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
