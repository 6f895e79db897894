"""Metrics against known answers (JetNet style): W1, Frechet, binning."""

from __future__ import annotations

import math

import numpy as np
import pytest

from muongen.evaluate.features import EventSample
from muongen.evaluate.metrics import (
    METRICS,
    MuonGrid,
    bin_index,
    compute_metrics,
    default_edges,
    frechet_distance,
    gaussian_frechet,
    parse_edges,
    support,
    wasserstein_1d,
)


def test_w1_of_shifted_gaussians_is_the_shift():
    rng = np.random.default_rng(0)
    a = rng.normal(0.0, 1.0, 20000)
    b = rng.normal(0.5, 1.0, 20000)
    assert wasserstein_1d(a, b) == pytest.approx(0.5, abs=0.04)


def test_w1_of_identical_samples_is_zero_and_empty_is_nan():
    x = np.random.default_rng(1).normal(size=1000)
    assert wasserstein_1d(x, x.copy()) == 0.0
    assert wasserstein_1d(x, np.array([np.nan, *x])) == 0.0  # NaNs are dropped
    assert math.isnan(wasserstein_1d(x, np.array([])))


def test_gaussian_frechet_known_values():
    # 1-D: (m1 - m2)^2 + (s1 - s2)^2
    assert gaussian_frechet([0.0], [[1.0]], [2.0], [[4.0]]) == pytest.approx(4.0 + 1.0)
    # same covariance: only the mean difference counts
    cov = np.array([[2.0, 0.5], [0.5, 1.0]])
    assert gaussian_frechet([0, 0], cov, [1, 2], cov) == pytest.approx(5.0)
    # diagonal: sum over dimensions of the 1-D formula
    assert gaussian_frechet(
        [0, 0], np.diag([1.0, 9.0]), [0, 0], np.diag([4.0, 1.0])
    ) == pytest.approx(1.0 + 4.0)


def test_frechet_on_samples_approaches_the_analytic_value():
    rng = np.random.default_rng(2)
    x = rng.normal(0.0, 1.0, (40000, 3))
    y = rng.normal(0.0, 1.0, (40000, 3)) * np.array([1.0, 2.0, 1.0]) + np.array([1.0, 0.0, 0.0])
    # mean shift 1 in dim 0 -> 1; std 1 vs 2 in dim 1 -> 1
    assert frechet_distance(x, y) == pytest.approx(2.0, abs=0.1)
    assert frechet_distance(x, x) == pytest.approx(0.0, abs=1e-9)


def test_frechet_survives_singular_covariances_and_tiny_samples():
    x = np.column_stack(
        [np.random.default_rng(3).normal(size=500), np.ones(500)]
    )  # constant column
    value = frechet_distance(x, x + np.array([0.0, 1.0]))
    assert np.isfinite(value) and value == pytest.approx(1.0, abs=1e-3)
    assert math.isnan(frechet_distance(x[:1], x))


def test_compute_metrics_sees_an_energy_shift_and_nothing_else(toy):
    real = toy(4000, seed=0)
    same = EventSample.from_arrays(real.conditions, real.physical_muons(), real.counts)
    zero = compute_metrics(real, same)
    assert set(zero) == set(METRICS)
    assert math.isnan(zero["muon_log10_radius_n100+"])  # the toy has no bundles of 100+ muons
    assert all(v == pytest.approx(0.0, abs=1e-6) for v in zero.values() if not math.isnan(v))
    shifted_muons = real.physical_muons() * np.array([10.0**0.3, 1.0, 1.0])
    shifted = compute_metrics(
        real, EventSample.from_arrays(real.conditions, shifted_muons, real.counts)
    )
    assert shifted["muon_log10_energy"] == pytest.approx(0.3, abs=1e-4)
    assert shifted["event_log10_leading_energy"] == pytest.approx(0.3, abs=1e-4)
    assert shifted["multiplicity"] == 0.0 and shifted["muon_radius"] < 1e-6
    assert shifted["frechet_event"] > 0.05


def test_frechet_takes_the_mean_radius_in_log10_and_is_not_ruled_by_one_wide_event(toy):
    real = toy(4000, seed=0)
    radii = real.event["mean_radius"][real.counts > 0]
    np.testing.assert_allclose(real.event_matrix()[:, 3], np.log10(radii))
    other = toy(4000, seed=1)
    before = compute_metrics(real, other, names=("frechet_event",))["frechet_event"]
    # one more event of the same primaries, its single muon 3 km from the axis
    wide_muons = np.concatenate([other.physical_muons(), [[100.0, 3000.0, 0.0]]])
    wide = EventSample.from_arrays(
        np.concatenate([other.conditions, other.conditions[:1]]),
        wide_muons,
        np.concatenate([other.counts, [1]]),
    )
    after = compute_metrics(real, wide, names=("frechet_event",))["frechet_event"]
    # in metres that one event moves the distance by ~8 (it alone triples the spread of
    # the mean radius); in log10 by less than 0.005
    assert abs(after - before) < 0.005


def test_compute_metrics_rejects_unknown_names(toy):
    s = toy(50)
    with pytest.raises(ValueError, match="unknown metric"):
        compute_metrics(s, s, names=("nope",))


def test_bin_index_puts_values_in_the_right_bins():
    edges = np.array([0.0, 1.0, 2.0, 4.0])
    values = np.array([-0.1, 0.0, 0.5, 1.0, 1.99, 2.0, 4.0, 4.1, np.nan])
    assert bin_index(values, edges).tolist() == [-1, 0, 0, 1, 1, 2, 2, -1, -1]
    with pytest.raises(ValueError, match="increasing"):
        bin_index(values, np.array([1.0, 1.0]))


def test_default_edges_are_equally_populated_and_enclose_everything():
    x = np.random.default_rng(4).uniform(5, 8, 10000)
    edges = default_edges(x, 4)
    assert len(edges) == 5 and edges[0] <= x.min() and edges[-1] >= x.max()
    counts = np.bincount(bin_index(x, edges))
    assert counts.min() > 0.2 * len(x) and (bin_index(x, edges) >= 0).all()
    # discrete values (two depths): merged quantiles give fewer, still valid bins
    d = np.repeat([1500.0, 2500.0], 50)
    e = default_edges(d, 4)
    assert np.all(np.diff(e) > 0) and (bin_index(d, e) >= 0).all()


def test_parse_edges():
    assert parse_edges("5, 6,7.5").tolist() == [5.0, 6.0, 7.5]
    for bad in ("5", "6,5", "a,b"):
        with pytest.raises(ValueError):
            parse_edges(bad)


# ------------------------------------------------------------------ within-bundle metrics


def _bundles(spec, energy_of=None):
    """Events from [(n muons, radius m, log10 E)]; muons on the x axis."""
    counts = np.array([n for n, _, _ in spec], dtype=np.int64)
    muons = np.concatenate(
        [np.tile([10.0**loge, r, 0.0], (n, 1)) for n, r, loge in spec if n > 0]
        or [np.zeros((0, 3))]
    )
    cond = np.tile([1e6, 0.0, 1.0, 1500.0], (len(counts), 1))
    return EventSample.from_arrays(cond, muons, counts)


def test_radial_profile_and_spectrum_in_multiplicity_bins_known_answers():
    # single muons at 1 m vs 3 m; bundles of 5 at 10 m in both; log10 E 2 vs 2.5 in bundles
    real = _bundles([(1, 1.0, 2.0), (1, 1.0, 2.0), (5, 10.0, 2.0)])
    other = _bundles([(1, 3.0, 2.0), (1, 3.0, 2.0), (5, 10.0, 2.5)])
    d = compute_metrics(real, other)
    assert d["muon_log10_radius_n1"] == pytest.approx(np.log10(3.0))
    assert d["muon_log10_radius_n2-9"] == pytest.approx(0.0)
    assert d["muon_log10_energy_n1"] == pytest.approx(0.0)
    assert d["muon_log10_energy_n2-9"] == pytest.approx(0.5)
    # no bundles of 10+ on either side: no value
    assert math.isnan(d["muon_log10_radius_n10-99"]) and math.isnan(d["muon_log10_energy_n100+"])
    # a bundle of 120 muons counts in the 100+ bin only
    big = _bundles([(120, 4.0, 1.0)])
    d = compute_metrics(big, _bundles([(120, 6.0, 1.0)]))
    assert d["muon_log10_radius_n100+"] == pytest.approx(np.log10(1.5))
    assert math.isnan(d["muon_log10_radius_n1"])
    # every bundle counts once: a bundle of 2 at 100 GeV and one of 8 at 1 TeV match the
    # swapped pair (pooled muons would differ by 0.6 dex)
    d = compute_metrics(
        _bundles([(2, 1.0, 2.0), (8, 1.0, 3.0)]), _bundles([(2, 1.0, 3.0), (8, 1.0, 2.0)])
    )
    assert d["muon_log10_energy_n2-9"] == pytest.approx(0.0, abs=1e-12)
    # the model has no bundles of 2-9 where the data do: no value there (-> no model output)
    d = compute_metrics(real, _bundles([(1, 1.0, 2.0)] * 7))
    assert math.isnan(d["muon_log10_radius_n2-9"]) and d["muon_log10_radius_n1"] == 0.0


def test_a_metric_rests_on_the_reference_bundles_not_on_its_muons():
    # 3 single muons, 2 bundles of 5, one of 150, and 4 empty events: 10 events, 6 bundles
    ref = _bundles([(1, 1.0, 2.0)] * 3 + [(5, 10.0, 2.0)] * 2 + [(150, 4.0, 1.0)] + [(0, 0, 0)] * 4)
    assert support(ref, "multiplicity") == 10
    assert support(ref, "muon_log10_energy") == support(ref, "frechet_event") == 6
    assert support(ref, "muon_log10_radius_n1") == 3
    assert support(ref, "muon_log10_energy_n2-9") == 2
    assert support(ref, "muon_log10_radius_n100+") == 1
    assert support(ref, "muon_log10_radius_n10-99") == 0
    # a big other sample does not make up for a thin reference: the 162 muons of 6 bundles
    # are not measured at min_support 7, the 10 events' multiplicity is
    other = _bundles([(5, 10.0, 2.0)] * 200)
    d = compute_metrics(ref, other, min_support=7)
    assert math.isnan(d["muon_log10_energy"]) and math.isnan(d["event_mean_radius"])
    assert math.isnan(d["muon_log10_radius_by_energy"]) and math.isnan(d["frechet_event"])
    assert d["multiplicity"] > 0
    # at min_support 6 the pooled metrics are measured, the 2-9 bundles (2 of them) are not
    d = compute_metrics(ref, other, min_support=6)
    assert d["muon_log10_energy"] > 0 and d["frechet_event"] > 0
    assert math.isnan(d["muon_log10_energy_n2-9"]) and math.isnan(d["muon_log10_radius_n1"])
    # and min_support 0 (the default) measures whatever has data on both sides
    assert compute_metrics(ref, other)["muon_log10_energy_n2-9"] == pytest.approx(0.0)


def test_energy_radius_correlation_sees_what_the_marginals_miss():
    # energetic muons near the core in the data, far out in the other: same marginals
    real = _bundles([(1, 1.0, 3.5), (1, 5.0, 0.5)] * 50)
    swapped = _bundles([(1, 5.0, 3.5), (1, 1.0, 0.5)] * 50)
    d = compute_metrics(real, swapped)
    assert d["muon_radius"] == pytest.approx(0.0) and d["muon_log10_energy"] == pytest.approx(0.0)
    assert d["muon_log10_radius_by_energy"] == pytest.approx(np.log10(5.0))
    assert compute_metrics(real, real)["muon_log10_radius_by_energy"] == pytest.approx(0.0)
    # weighted by the reference's muons per decade: 3 of 4 at 1 m vs 2 m, 1 of 4 equal
    ref = _bundles([(1, 1.0, 0.5)] * 3 + [(1, 7.0, 2.5)])
    oth = _bundles([(1, 2.0, 0.5)] * 5 + [(1, 7.0, 2.5)])
    by_energy = compute_metrics(ref, oth)["muon_log10_radius_by_energy"]
    assert by_energy == pytest.approx(0.75 * np.log10(2.0))
    # multiplicity bins count equally: 1 bundle of 50 muons (off by log10 2) and 50 single
    # muons (exact) give half of log10 2, however many muons each holds
    ref = _bundles([(1, 1.0, 0.5)] * 50 + [(50, 1.0, 0.5)])
    oth = _bundles([(1, 1.0, 0.5)] * 50 + [(50, 2.0, 0.5)])
    by_energy = compute_metrics(ref, oth)["muon_log10_radius_by_energy"]
    assert by_energy == pytest.approx(0.5 * np.log10(2.0))


def test_grid_w1_is_exact_for_small_pools_and_close_for_large_ones(toy):
    a, b = toy(2000, seed=1), toy(2000, seed=2, shift=0.2)
    grid = MuonGrid.from_samples([a, b])
    ga, gb = grid.digitise(a), grid.digitise(b)
    exact = compute_metrics(a, b)
    fast = compute_metrics(ga, gb, grid=grid)
    names = ("muon_log10_energy", "muon_radius", "muon_log10_radius_n2-9")
    for m in (*names, "muon_log10_radius_by_energy"):
        assert fast[m] == pytest.approx(exact[m], rel=1e-9), m
    # a pool larger than the grid: bins of several muons, still within a percent
    rng = np.random.default_rng(3)
    x, y = rng.exponential(20.0, 200000), rng.exponential(22.0, 200000)
    small = MuonGrid.from_samples([_radii(x), _radii(y)], n_bins=4096)
    codes = [small.digitise(_radii(v)).muon["code:radius"] for v in (x, y)]
    assert small.w1("radius", *codes) == pytest.approx(wasserstein_1d(x, y), rel=0.01)


def _radii(r):
    n = len(r)
    return EventSample.from_arrays(
        np.tile([1e6, 0.0, 1.0, 1500.0], (n, 1)),
        np.column_stack([np.ones(n), r, 0 * r]),
        np.ones(n),
    )
