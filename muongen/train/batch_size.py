"""``data.batch_muons``: a batch sized by its muons, not only its events.

Why. A step's cost grows with the muons of its batch, and what a GAN on muon-rich data
needs is steps: on issue 52's physics (~27 muons a row) a 1024-event step of the quality
preset costs half a 2048-event one, and 14000 steps of 1024 events brought the worst
binned ratio to 1.5-1.8 on two held-out sets (2048-event runs in the same 30 minutes,
~7000 steps: 2.0-3.1; docs/fidelity.md, "Steps, not events: half the batch"). On sparse
data (the quality preset's ``wide`` blend, ~3.6 muons a row) a 2048-event batch holds
~7000 muons and is cheap; there the preset keeps it.

The rule. When a run starts fresh (the trainer resets its parts), the rows of up to
:data:`SAMPLE_FILES` input files spread over the list (the first :data:`SAMPLE_EVENTS`
of each, with the stream's own filters: empty rows only with ``data.keep_empty``, none above
``data.max_muons_per_event``) give the mean muons per row ``m``. ``data.batch_events`` is
halved while ``batch_events x m`` exceeds ``data.batch_muons``, down to a quarter of it
at most (:data:`MAX_HALVINGS`; only one halving is measured). The decision is saved in
every checkpoint: a resumed run, and the next node of a grid chain on its own range of
files, keep it, so one model trains on one batch size. The run's ``config.yaml`` and its
checkpoints' config record the batch trained; a fresh run from that file decides again
from it, which gives the same batch unless the quarter was reached.
``data.batch_muons: 0`` (the default) keeps ``data.batch_events`` as it is.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from muongen.config import DataConfig
from muongen.errors import InputFileError

log = logging.getLogger(__name__)

#: input files read for the mean (spread over the list: first, ..., last)
SAMPLE_FILES = 4
#: rows read from each of them
SAMPLE_EVENTS = 20000
#: at most this many halvings of data.batch_events (a quarter of it)
MAX_HALVINGS = 2


def events_for_muons(batch_events: int, batch_muons: int, mean_muons: float) -> int:
    """``batch_events`` halved while its expected muons exceed ``batch_muons`` (at most
    :data:`MAX_HALVINGS` times, never below 1); unchanged with ``batch_muons`` 0."""
    if batch_muons <= 0:
        return batch_events
    events = batch_events
    for _ in range(MAX_HALVINGS):
        if events * mean_muons <= batch_muons or events < 2:
            break
        events //= 2
    return events


def spread(files: list[str], n: int) -> list[str]:
    """Up to ``n`` of ``files``, evenly spaced from the first to the last."""
    if len(files) <= n:
        return list(files)
    picks = np.linspace(0, len(files) - 1, n).round().astype(int)
    return [files[i] for i in sorted(set(picks.tolist()))]


def mean_muons_per_event(files: list[str], cfg: DataConfig) -> tuple[float, int]:
    """The mean muons per training row over the files :func:`spread` picks, and the rows
    read (0 when none of them reads: then the caller keeps its batch). An unreadable file
    is skipped here (the stream skips and reports it, or fails with ``data.strict``)."""
    from muongen.data.reader import read_events

    counts = []
    for url in spread(files, SAMPLE_FILES):
        try:
            c = np.asarray(read_events(url, max_events=SAMPLE_EVENTS).counts)
        except InputFileError as exc:
            log.warning("data.batch_muons: %s not used for the mean (%s)", url, exc)
            continue
        if not cfg.keep_empty:
            c = c[c > 0]
        if cfg.max_muons_per_event > 0:
            c = c[c <= cfg.max_muons_per_event]
        counts.append(c)
    if not counts:
        return 0.0, 0
    c = np.concatenate(counts)
    return (float(c.mean()) if c.size else 0.0), int(c.size)


class RowMuons:
    """:func:`mean_muons_per_event` of a run's input files, read once, when a trainer part
    first asks (a resumed run's parts keep their saved decisions and never read).

    Args:
        files: the run's input files.
        cfg: the run's data section (its filters).
    """

    def __init__(self, files: list[str], cfg: DataConfig) -> None:
        self.files = files
        self.cfg = cfg
        self._read: tuple[float, int] | None = None

    def mean(self) -> tuple[float, int]:
        """The mean muons per row and the rows read (0 when no file read)."""
        if self._read is None:
            self._read = mean_muons_per_event(self.files, self.cfg)
        return self._read


class MuonBatch:
    """A trainer part that sets ``data.batch_events`` from ``data.batch_muons`` and the
    input files (see the module docstring), and keeps the decision in checkpoints.

    Args:
        data_cfg: the run's data section: ``batch_events`` is read and set.
        files: the run's input files (their mean, :attr:`rows`, is shared with the
            other parts that decide from it).
    """

    follows_data = False  # one model, one batch size: a chain node keeps its predecessor's

    def __init__(self, data_cfg: DataConfig, files: list[str]) -> None:
        self.cfg = data_cfg
        self.rows = RowMuons(files, data_cfg)
        self.requested = self.decided = data_cfg.batch_events
        self.mean_muons: float | None = None

    def _from_data(self) -> int:
        if self.cfg.batch_muons <= 0:
            return self.requested
        mean, rows = self.rows.mean()
        if not rows:
            return self.requested
        self.mean_muons = mean
        events = events_for_muons(self.requested, self.cfg.batch_muons, mean)
        log.info(
            "data.batch_muons=%d: %.1f muons a row (%d rows of %d input file(s)): batches "
            "of %d events (~%.0f muons)%s",
            self.cfg.batch_muons,
            mean,
            rows,
            min(len(self.rows.files), SAMPLE_FILES),
            events,
            events * mean,
            "" if events == self.requested else f", not data.batch_events={self.requested}",
        )
        return events

    def _set(self, events: int) -> None:
        self.decided = self.cfg.batch_events = events

    def state_dict(self) -> dict[str, Any]:
        return {"batch_events": self.decided, "mean_muons": self.mean_muons}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Keep the saved batch size (a resumed run, or the next range of a chain) while
        ``data.batch_muons`` is on, without reading any file; with it 0,
        ``data.batch_events`` is what it says."""
        saved = int(state.get("batch_events") or 0)
        if self.cfg.batch_muons <= 0 or saved <= 0:
            return
        if saved != self.requested:
            log.info(
                "data.batch_events: %d events a batch, as the checkpoint's run decided "
                "(data.batch_muons)",
                saved,
            )
        self.mean_muons = state.get("mean_muons")
        self._set(saved)

    def missing(self, config: dict[str, Any]) -> None:
        """A checkpoint from before this part keeps the batch its config records (what
        its run trained on) while ``data.batch_muons`` is on."""
        saved = int((config.get("data") or {}).get("batch_events") or 0)
        if saved > 0:
            self.load_state_dict({"batch_events": saved})
        else:
            self.reset()

    def reset(self) -> None:
        """A fresh start decides from the files."""
        self.mean_muons = None
        self._set(self._from_data())
