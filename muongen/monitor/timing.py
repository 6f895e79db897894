"""Where a training step's time goes: data wait, host-to-device, critic, generator, optimizer.

``StepTimer`` accumulates time per phase between two ``snapshot()`` calls (the log
interval); whatever is not inside a phase is ``other``, so the fractions add up to 1.

On CUDA the phases are timed on the GPU stream with ``torch.cuda.Event`` pairs, which are
only resolved at ``snapshot()`` (one device sync at log time, when the trainer syncs for its
metrics anyway); a phase adds no host-device sync. The split then says how the GPU's time
went: a data wait hidden behind queued kernels costs ~0, which is the point. With
``sync=True`` every phase boundary synchronises and is timed on the host instead (exact
host-side attribution, slower; for diagnosis). On CPU the host clock is used.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

#: Phases a step is split into; time outside all of them is reported as ``other``.
PHASES = ("data_wait", "h2d", "critic", "generator", "optimizer")
#: Unresolved CUDA event pairs kept before completed ones are folded in (bounds memory).
_MAX_PENDING = 512


class StepTimer:
    """Accumulates wall time per phase; ``with timer.phase("critic"): ...``.

    Phases must not nest. ``snapshot()`` returns ``time/<phase>_s`` (seconds in the window),
    ``time/<phase>_frac`` for each phase and ``other``, and ``time/window_s``, then starts a
    new window.
    """

    def __init__(
        self,
        device: torch.device | str = "cpu",
        *,
        sync: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.device = torch.device(device)
        self.sync = sync
        self._clock = clock
        self._cuda = self.device.type == "cuda" and torch.cuda.is_available()
        self._active: str | None = None
        self.reset()

    @property
    def uses_events(self) -> bool:
        """True when phases are timed with CUDA events (CUDA device, ``sync=False``)."""
        return self._cuda and not self.sync

    def reset(self) -> None:
        """Start a new window with nothing accumulated."""
        self._seconds = dict.fromkeys(PHASES, 0.0)
        self._pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self._window_t0 = self._clock()
        self._window_ev = None
        if self.uses_events:
            self._window_ev = self._record()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the body as phase ``name`` (one of :data:`PHASES`)."""
        if name not in self._seconds:
            raise ValueError(f"unknown phase {name!r}; expected one of {PHASES}")
        if self._active is not None:
            raise RuntimeError(f"phase {name!r} started inside phase {self._active!r}")
        self._active = name
        try:
            if self.uses_events:
                start = self._record()
                yield
                self._pending.append((name, start, self._record()))
                if len(self._pending) > _MAX_PENDING:
                    self._resolve(wait=False)
            else:
                if self._cuda:
                    torch.cuda.synchronize(self.device)
                t0 = self._clock()
                yield
                if self._cuda:
                    torch.cuda.synchronize(self.device)
                self._seconds[name] += self._clock() - t0
        finally:
            self._active = None

    def _record(self) -> torch.cuda.Event:
        """A timing event recorded now on the device's current stream."""
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def _resolve(self, *, wait: bool) -> None:
        """Fold finished event pairs into the totals (all of them after a sync if ``wait``)."""
        if wait and self._pending:
            self._pending[-1][2].synchronize()
        done = 0
        for name, start, end in self._pending:
            if not (wait or end.query()):
                break  # later pairs were recorded later on the same stream
            self._seconds[name] += start.elapsed_time(end) / 1000.0
            done += 1
        del self._pending[:done]

    def snapshot(self) -> dict[str, float]:
        """Seconds and fractions per phase since the last snapshot; starts a new window."""
        if self.uses_events:
            end = self._record()
            end.synchronize()
            self._resolve(wait=True)
            window = self._window_ev.elapsed_time(end) / 1000.0
        else:
            window = self._clock() - self._window_t0
        busy = sum(self._seconds.values())
        window = max(window, busy)  # event and clock rounding must not give other < 0
        out: dict[str, float] = {"time/window_s": window}
        for name, seconds in [*self._seconds.items(), ("other", window - busy)]:
            out[f"time/{name}_s"] = seconds
            out[f"time/{name}_frac"] = seconds / window if window > 0 else 0.0
        self.reset()
        return out
