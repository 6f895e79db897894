"""A baseline that ignores the condition: what a generator scores without learning anything.

Each event's multiplicity is drawn from the pooled multiplicity distribution of a set of
real events, and its muons are drawn independently from the pooled muons of that set. The
marginal distributions of the pool are reproduced (so overall per-muon metrics sit near
the floor), but nothing depends on the primary's energy, zenith, mass or depth, and muons
of one event are uncorrelated: the binned (conditional) and event-level metrics show what
a model gains over it.
"""

from __future__ import annotations

import numpy as np

from muongen.evaluate.features import EventSample


def sample_baseline(
    pool_counts: np.ndarray,
    pool_muons: np.ndarray,
    n_events: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``n_events`` events from the pooled marginals, ignoring any condition.

    Args:
        pool_counts: (B,) multiplicities of the pool's events.
        pool_muons: (N, 3) the pool's muons [E GeV, x m, y m].

    Returns:
        (muons (M, 3), counts (n_events,) int64) in physical units.
    """
    pool_counts = np.asarray(pool_counts, dtype=np.int64)
    pool_muons = np.asarray(pool_muons, dtype=np.float64).reshape(-1, 3)
    if len(pool_counts) == 0:
        raise ValueError("the baseline needs a non-empty pool of events")
    counts = rng.choice(pool_counts, size=n_events)
    if len(pool_muons) == 0:
        return np.zeros((0, 3)), np.zeros(n_events, dtype=np.int64)
    muons = pool_muons[rng.integers(0, len(pool_muons), int(counts.sum()))]
    return muons, counts


def baseline_for(
    pool: EventSample, conditions: np.ndarray, rng: np.random.Generator
) -> EventSample:
    """Baseline events for the primaries ``conditions`` (B, 4), drawn from ``pool``.

    The conditions are only carried along (for binning); they do not influence the draw.
    """
    conditions = np.asarray(conditions, dtype=np.float64).reshape(-1, 4)
    muons, counts = sample_baseline(pool.counts, pool.physical_muons(), len(conditions), rng)
    return EventSample.from_arrays(conditions, muons, counts)
