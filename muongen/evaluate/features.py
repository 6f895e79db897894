"""Observables the metrics compare: per-muon and per-event features of a set of events.

Everything here is numpy on physical units (conditions [E GeV, zenith rad, A, depth m],
muons [E GeV, x m, y m]) and ragged-aware: muons are flat, ``counts`` says how many belong
to each event, nothing is padded.

Per-muon observables (one value per muon): ``log10_energy`` (log10 E/GeV), ``radius`` (m),
``x`` (m), ``y`` (m), and, for the metrics within bundles, ``log10_radius`` (log10 r/m, r
at least 1 mm) and ``bundle_size`` (the muon count N of its event).

Per-event observables (one value per event, NaN where undefined): ``multiplicity``
(log10(N + 1), defined for every event), ``log10_total_energy`` (log10 of the summed muon
energy), ``log10_leading_energy`` (log10 of the most energetic muon) and ``mean_radius``
(m); the last three are defined only for events with at least one muon. The Frechet
distance takes the mean radius in log10 (:data:`FRECHET_OBSERVABLES`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

MUON_OBSERVABLES = ("log10_energy", "radius", "x", "y")
BUNDLE_SIZE = "bundle_size"
LOG10_RADIUS = "log10_radius"
EVENT_OBSERVABLES = ("multiplicity", "log10_total_energy", "log10_leading_energy", "mean_radius")
#: the Frechet distance's inputs (:meth:`EventSample.event_matrix`): the event observables
#: with the mean radius in log10 (r/m, at least 1 mm). Its Gaussians' covariances in metres
#: follow the few widest events: on a power-law lateral tail (benchmarks/other_physics.py)
#: the floor jumped 20-fold between neighbouring bins with one such event in a half
#: (docs/fidelity.md, "Another physics").
FRECHET_OBSERVABLES = (*EVENT_OBSERVABLES[:3], "log10_mean_radius")

#: Condition variables events can be binned in: name -> function of conditions (B, 4).
CONDITION_VARIABLES = {
    "log10_energy": lambda c: np.log10(c[:, 0]),
    "cos_zenith": lambda c: np.cos(c[:, 1]),
    "depth": lambda c: c[:, 3],
    "log10_mass": lambda c: np.log10(c[:, 2]),
}

_TINY = np.finfo(np.float32).tiny  # log10 guard; a real muon never has E <= 0
MIN_RADIUS_M = 1e-3  # radii enter logs at least 1 mm from the axis


def offsets_of(counts: np.ndarray) -> np.ndarray:
    """(B + 1,) start of each event's muons; offsets[-1] == N."""
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def muon_rows(counts: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Rows of the flat muon array that belong to the events ``index``, in that order."""
    counts = np.asarray(counts, dtype=np.int64)
    starts = offsets_of(counts)[:-1][index]
    sel = counts[index]
    total = int(sel.sum())
    # start of its event minus the muons before it in the selection, plus its global rank
    first = np.repeat(starts - (np.cumsum(sel) - sel), sel)
    return first + np.arange(total, dtype=np.int64)


def muon_observables(muons: np.ndarray) -> dict[str, np.ndarray]:
    """Physical muons (N, 3) = [E, x, y] -> {name: (N,) float64}."""
    muons = np.asarray(muons, dtype=np.float64).reshape(-1, 3)
    x, y = muons[:, 1], muons[:, 2]
    r = np.hypot(x, y)
    return {
        "log10_energy": np.log10(np.maximum(muons[:, 0], _TINY)),
        "radius": r,
        "x": x,
        "y": y,
        LOG10_RADIUS: np.log10(np.maximum(r, MIN_RADIUS_M)),
    }


def event_observables(muons: np.ndarray, counts: np.ndarray) -> dict[str, np.ndarray]:
    """Physical muons (N, 3) and counts (B,) -> {name: (B,) float64}, NaN where undefined."""
    muons = np.asarray(muons, dtype=np.float64).reshape(-1, 3)
    counts = np.asarray(counts, dtype=np.int64)
    n_events = len(counts)
    if int(counts.sum()) != len(muons):
        raise ValueError(f"sum(counts) = {int(counts.sum())} but there are {len(muons)} muons")
    event = np.repeat(np.arange(n_events), counts)  # (N,)
    energy = muons[:, 0]
    radius = np.hypot(muons[:, 1], muons[:, 2])
    has = counts > 0
    total = np.bincount(event, weights=energy, minlength=n_events)
    leading = np.full(n_events, np.nan)
    mean_r = np.full(n_events, np.nan)
    log_total = np.full(n_events, np.nan)
    if has.any():
        # consecutive non-empty events: the segment between their starts is exactly one event
        starts = offsets_of(counts)[:-1][has]
        leading[has] = np.log10(np.maximum(np.maximum.reduceat(energy, starts), _TINY))
        mean_r[has] = np.bincount(event, weights=radius, minlength=n_events)[has] / counts[has]
        log_total[has] = np.log10(np.maximum(total[has], _TINY))
    return {
        "multiplicity": np.log10(counts + 1.0),
        "log10_total_energy": log_total,
        "log10_leading_energy": leading,
        "mean_radius": mean_r,
    }


def shower_groups(conditions: np.ndarray) -> np.ndarray:
    """(B,) int64 group id: consecutive events with the same primary (E, zenith, A) share one.

    Production writes one row per (shower, depth), the depths of a shower one after another.
    Rows of one shower are correlated (the same muons seen at several depths), so random
    splits and bootstrap resampling must keep them together, or the floor comes out too low.
    """
    c = np.asarray(conditions).reshape(-1, 4)[:, :3]
    new = np.ones(len(c), dtype=bool)
    new[1:] = np.any(c[1:] != c[:-1], axis=1)
    return np.cumsum(new) - 1


@dataclass(frozen=True)
class EventSample:
    """A set of events with the observables the metrics need, computed once.

    Attributes:
        conditions: (B, 4) float64 physical [E GeV, zenith rad, A, depth m].
        counts: (B,) int64 muons per event.
        muon: per-muon observables, name -> (N,) (muons event after event).
        event: per-event observables, name -> (B,), NaN where undefined.
        groups: (B,) int64 optional group of each event (its shower, see
            :func:`shower_groups`): splits and bootstrap keep a group together.
    """

    conditions: np.ndarray
    counts: np.ndarray
    muon: dict[str, np.ndarray]
    event: dict[str, np.ndarray]
    groups: np.ndarray | None = None

    @classmethod
    def from_arrays(
        cls, conditions: np.ndarray, muons: np.ndarray, counts: np.ndarray
    ) -> EventSample:
        """From physical conditions (B, 4), muons (N, 3) and counts (B,)."""
        counts = np.asarray(counts, dtype=np.int64)
        return cls(
            conditions=np.asarray(conditions, dtype=np.float64).reshape(-1, 4),
            counts=counts,
            muon={**muon_observables(muons), BUNDLE_SIZE: np.repeat(counts, counts)},
            event=event_observables(muons, counts),
        )

    @classmethod
    def from_batch(cls, batch) -> EventSample:
        """From a RaggedBatch in physical units (any device)."""
        return cls.from_arrays(
            batch.conditions.detach().cpu().numpy(),
            batch.muons.detach().cpu().numpy(),
            batch.counts.detach().cpu().numpy(),
        )

    @property
    def n_events(self) -> int:
        return len(self.counts)

    @property
    def n_muons(self) -> int:
        return len(self.muon["log10_energy"])

    def take(self, index: np.ndarray) -> EventSample:
        """The events at ``index`` (ints or a bool mask), in that order; repeats allowed."""
        index = np.asarray(index)
        if index.dtype == bool:
            index = np.flatnonzero(index)
        rows = muon_rows(self.counts, index)
        return EventSample(
            conditions=self.conditions[index],
            counts=self.counts[index],
            muon={k: v[rows] for k, v in self.muon.items()},
            event={k: v[index] for k, v in self.event.items()},
            groups=None if self.groups is None else self.groups[index],
        )

    def with_groups(self, groups: np.ndarray | None) -> EventSample:
        """The same events with group ids (B,) (None: every event on its own)."""
        if groups is not None:
            groups = np.asarray(groups, dtype=np.int64)
            if groups.shape != (self.n_events,):
                raise ValueError(f"groups must be ({self.n_events},), got {groups.shape}")
        return replace(self, groups=groups)

    def physical_muons(self) -> np.ndarray:
        """(N, 3) [E GeV, x m, y m] rebuilt from the observables (float rounding aside)."""
        m = self.muon
        return np.stack([10.0 ** m["log10_energy"], m["x"], m["y"]], axis=1)

    def condition(self, name: str) -> np.ndarray:
        """A condition variable per event (see CONDITION_VARIABLES), (B,)."""
        if name not in CONDITION_VARIABLES:
            raise ValueError(
                f"unknown condition variable {name!r}; use one of {list(CONDITION_VARIABLES)}"
            )
        return CONDITION_VARIABLES[name](self.conditions)

    def muon_condition(self, name: str) -> np.ndarray:
        """A condition variable repeated for each muon of its event, (N,)."""
        return np.repeat(self.condition(name), self.counts)

    def event_matrix(self) -> np.ndarray:
        """(B', 4) :data:`FRECHET_OBSERVABLES` of the events with muons (the Frechet
        distance's input)."""
        has = self.counts > 0
        cols = [self.event[k][has] for k in EVENT_OBSERVABLES[:3]]
        cols.append(np.log10(np.maximum(self.event["mean_radius"][has], MIN_RADIUS_M)))
        return np.stack(cols, axis=1)
