"""Floors, bootstrap, ratios, binning and verdicts of floors.compare."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from muongen.evaluate.features import EventSample
from muongen.evaluate.floors import (
    bootstrap_metrics,
    compare,
    ratio,
    resample_index,
    split_halves,
    verdict,
)


def test_split_halves_are_disjoint_equal_and_cover():
    a, b = split_halves(101, np.random.default_rng(0))
    assert len(a) == len(b) == 50
    assert not set(a) & set(b) and len(set(a) | set(b)) == 100
    assert np.all(np.diff(a) > 0)


def test_split_by_groups_keeps_groups_together():
    groups = np.repeat(np.arange(10), 7)
    a, b = split_halves(len(groups), np.random.default_rng(1), groups)
    assert not set(groups[a]) & set(groups[b])
    assert len(set(groups[a])) == len(set(groups[b])) == 5 and len(a) == len(b) == 35


def test_group_bootstrap_draws_whole_groups():
    groups = np.repeat([0, 1, 2], [1, 2, 3])
    idx = resample_index(len(groups), groups, np.random.default_rng(2))
    drawn = groups[idx]
    assert sum(np.bincount(drawn, minlength=3) % np.array([1, 2, 3])) == 0  # whole groups only
    assert len(resample_index(9, None, np.random.default_rng(2))) == 9


def test_ratio():
    assert ratio(0.3, 0.1) == pytest.approx(3.0)
    assert math.isnan(ratio(0.3, 0.0)) and math.isnan(ratio(float("nan"), 0.1))


def _w1_sample(n, loc, rng):
    x = rng.normal(loc, 1.0, n)  # muon log10 energy, one muon per event
    muons = np.column_stack([10.0**x, np.zeros(n), np.ones(n)])
    return EventSample.from_arrays(np.tile([1e6, 0.0, 1.0, 1500.0], (n, 1)), muons, np.ones(n))


def test_bootstrap_spread_is_sensible_and_shrinks_with_statistics():
    spreads = []
    for n in (400, 6400):
        rng = np.random.default_rng(n)
        ref, other = _w1_sample(n, 0.0, rng), _w1_sample(n, 0.5, rng)
        reps = bootstrap_metrics(
            ref, {"x": other}, n_boot=40, rng=rng, names=("muon_log10_energy",)
        )["x"]["muon_log10_energy"]
        assert np.all(np.isfinite(reps)) and abs(reps.mean() - 0.5) < 0.1
        spreads.append(reps.std())
    # W1 noise falls like 1/sqrt(n): 16x the events, about 4x less spread
    assert 2.0 < spreads[0] / spreads[1] < 8.0
    assert 0.005 < spreads[1] < 0.05


def test_bootstrap_needs_aligned_samples(toy):
    with pytest.raises(ValueError, match="aligned"):
        bootstrap_metrics(
            toy(10), {"a": toy(10), "b": toy(12)}, n_boot=1, rng=np.random.default_rng()
        )


def test_perfect_model_sits_at_the_floor_and_bad_model_fails(toy):
    real = toy(6000, seed=0)
    good = toy(6000, seed=1, conditions=real.conditions)  # same physics, same primaries
    bad = toy(6000, seed=2, conditions=real.conditions, shift=0.3)
    bins = {"log10_energy": np.array([5.0, 6.0, 7.0, 8.0])}
    res = compare(real, {"model": good}, bins=bins, n_boot=8, n_splits=2, seed=0)
    for m, e in res["overall"].items():
        assert e["floor"] > 0 and e["floor_err"] > 0, m
        assert e["model_ratio"] == pytest.approx(e["model"] / e["floor"])
        assert e["model_ratio"] < 3.0, (m, e)
        assert e["verdict"].startswith("pass")
    # conditionally, the baseline (which ignores the primary) is far off; the model is not
    cond = res["conditional"]["log10_energy"]["multiplicity"]
    assert cond["baseline_ratio"] > 5.0 > cond["model_ratio"]
    assert "beats baseline" in cond["verdict"]

    res_bad = compare(real, {"model": bad}, n_boot=4, seed=0)
    e = res_bad["overall"]["muon_log10_energy"]
    assert e["model"] == pytest.approx(0.3, abs=0.05)
    assert e["model_ratio"] > 5 and e["verdict"].startswith("FAIL")
    assert "loses to baseline" in e["verdict"]


def test_bins_count_events_and_flag_sparse_ones(toy):
    real = toy(2000, seed=3)
    model = toy(2000, seed=4, conditions=real.conditions)
    log_e = real.condition("log10_energy")
    edges = np.array([5.0, 5.1, 7.0, 8.0])  # the first bin holds ~3 % of the events
    res = compare(real, {"model": model}, bins={"log10_energy": edges}, n_boot=2, min_events=100)
    rows = res["binned"]["log10_energy"]["bins"]
    assert [r["n_events"] for r in rows] == [
        int(((log_e >= lo) & (log_e < hi)).sum()) for lo, hi in itertools.pairwise(edges)
    ]
    assert rows[0]["sparse"] and rows[0]["metrics"] is None
    assert not rows[1]["sparse"] and set(rows[1]["metrics"]["multiplicity"]) >= {
        "floor",
        "model",
        "model_ratio",
        "baseline",
    }
    assert res["ratio_target"] == 3.0 and res["split"]["n_events"] == 2000


def test_compare_refuses_misaligned_candidates(toy):
    real = toy(100, seed=0)
    with pytest.raises(ValueError, match="aligned"):
        compare(real, {"model": toy(100, seed=1)}, n_boot=0)


def test_verdict_texts():
    e = {"model": 1.0, "model_err": 0.1, "floor": 1.0, "model_ratio": 1.0, "baseline": 5.0}
    assert verdict(e, 3.0) == "pass; beats baseline"
    assert verdict({**e, "model_ratio": 4.0, "baseline": 1.05}, 3.0) == "FAIL; ties baseline"
    assert verdict({**e, "model": float("nan"), "model_ratio": float("nan")}, 3.0).startswith(
        "FAIL"
    )
