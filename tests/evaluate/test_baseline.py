"""The condition-ignoring baseline."""

from __future__ import annotations

import numpy as np
import pytest

from muongen.evaluate.baseline import baseline_for, sample_baseline


def test_baseline_ignores_the_condition(toy):
    pool = toy(500, seed=0)
    low = np.tile([1e5, 0.0, 1.0, 1000.0], (300, 1))
    high = np.tile([1e9, 1.0, 56.0, 2800.0], (300, 1))
    a = baseline_for(pool, low, np.random.default_rng(7))
    b = baseline_for(pool, high, np.random.default_rng(7))
    assert np.array_equal(a.counts, b.counts)
    assert np.array_equal(a.muon["log10_energy"], b.muon["log10_energy"])
    assert np.array_equal(b.conditions, high)  # carried along, for binning only


def test_baseline_draws_from_the_pooled_marginals(toy):
    pool = toy(3000, seed=1)
    counts_pool, muons_pool = pool.counts, pool.physical_muons()
    muons, counts = sample_baseline(counts_pool, muons_pool, 20000, np.random.default_rng(0))
    assert set(np.unique(counts)) <= set(np.unique(counts_pool))
    assert counts.mean() == pytest.approx(counts_pool.mean(), rel=0.05)
    assert len(muons) == counts.sum()
    # every drawn muon is a muon of the pool
    pool_rows = {tuple(r) for r in muons_pool.round(6)}
    assert all(tuple(r) in pool_rows for r in muons[:200].round(6))


def test_baseline_edge_cases():
    with pytest.raises(ValueError, match="non-empty"):
        sample_baseline(np.array([], int), np.zeros((0, 3)), 5, np.random.default_rng())
    muons, counts = sample_baseline(np.zeros(4, int), np.zeros((0, 3)), 5, np.random.default_rng())
    assert counts.tolist() == [0] * 5 and muons.shape == (0, 3)
