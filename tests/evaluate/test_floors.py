"""Floors, split errors, ratios, binning, verdicts and the ratio summary of floors.compare."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from muongen.evaluate.features import EventSample
from muongen.evaluate.floors import (
    FLOOR_REL_ERR_MAX,
    compare,
    entry,
    mean_and_error,
    ratio,
    ratio_summary,
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


def test_ratio():
    assert ratio(0.3, 0.1) == pytest.approx(3.0)
    assert math.isnan(ratio(0.3, 0.0)) and math.isnan(ratio(float("nan"), 0.1))


def test_mean_and_error_is_the_standard_error_of_the_mean():
    mean, err = mean_and_error(np.array([1.0, 2.0, 3.0, np.nan]))
    assert mean == 2.0 and err == pytest.approx(1.0 / math.sqrt(3))
    assert math.isnan(mean_and_error(np.array([5.0]))[1])  # one split: no error
    assert all(math.isnan(v) for v in mean_and_error(np.array([np.nan])))


def test_entry_pairs_the_splits():
    floor = np.array([1.0, 2.0, 3.0, 2.0])
    e = entry({"floor": floor, "model": 2 * floor, "baseline": 2 * floor + 0.5})
    assert e["floor"] == 2.0 and e["floor_rel_err"] == pytest.approx(e["floor_err"] / 2.0)
    # the model follows the floor split by split: its ratio is exactly 2, with no scatter
    assert e["model_ratio"] == pytest.approx(2.0) and e["model_ratio_err"] == pytest.approx(0.0)
    # the difference to the baseline is the same in every split: known exactly
    assert e["model_minus_baseline"] == pytest.approx(-0.5)
    assert e["model_minus_baseline_err"] == pytest.approx(0.0)
    # no output in a split where the data have some: no value at all
    gap = entry({"floor": floor, "model": np.array([1.0, np.nan, 1.0, 1.0])})
    assert math.isnan(gap["model"]) and math.isnan(gap["model_ratio"])


def test_floor_error_from_splits_matches_the_scatter_of_independent_data_sets():
    """The reported floor error (standard error over splits) against the true scatter of the
    split-mean floor over independent held-out sets of one distribution."""
    means, errs = [], []
    for s in range(12):
        rng = np.random.default_rng(100 + s)
        x = rng.normal(0.0, 1.0, 4000)
        real = EventSample.from_arrays(
            np.tile([1e6, 0.0, 1.0, 1500.0], (4000, 1)),
            np.column_stack([10.0**x, np.ones(4000), np.zeros(4000)]),
            np.ones(4000, dtype=np.int64),
        )
        res = compare(real, {}, baseline=False, n_splits=16, seed=s, names=("muon_log10_energy",))
        e = res["overall"]["muon_log10_energy"]
        means.append(e["floor"])
        errs.append(e["floor_err"])
    true_scatter = np.std(means, ddof=1)
    assert 0.5 < np.mean(errs) / true_scatter < 2.0
    # W1 of two halves of 2000 normal draws: about 0.036 (sqrt(2 / (pi n)) * 1.1)
    assert np.mean(means) == pytest.approx(0.036, rel=0.25)


def _one_muon_events(x: np.ndarray) -> EventSample:
    """Events of one muon each, log10 E = x, at one primary."""
    n = len(x)
    return EventSample.from_arrays(
        np.tile([1e6, 0.0, 1.0, 1500.0], (n, 1)),
        np.column_stack([10.0**x, np.ones(n), np.zeros(n)]),
        np.ones(n, dtype=np.int64),
    )


def test_a_model_drawn_in_each_split_has_its_noise_in_the_errors():
    """A perfect model measured against one fixed held-out set, over 16 independent model
    draws: drawn once, the split-mean carries that draw's noise whole and the error from
    the splits' spread is about half the true scatter; drawn anew in each split
    (``redraw``), the scatter shrinks and the error matches it. The mean is the same."""
    real = _one_muon_events(np.random.default_rng(0).normal(0.0, 1.0, 4000))
    names = ("muon_log10_energy",)
    found = {}
    for mode in ("one", "per split"):
        means, errs = [], []
        for s in range(16):
            model = _one_muon_events(np.random.default_rng(100 + s).normal(0.0, 1.0, 4000))

            def draw(index, split, s=s):
                return _one_muon_events(np.random.default_rng([s, split]).normal(0, 1, len(index)))

            redraw = {"model": draw} if mode == "per split" else None
            res = compare(
                real, {"model": model}, baseline=False, n_splits=16, names=names, redraw=redraw
            )
            means.append(res["overall"]["muon_log10_energy"]["model"])
            errs.append(res["overall"]["muon_log10_energy"]["model_err"])
        found[mode] = (np.mean(means), np.std(means, ddof=1), np.mean(errs))
    (mean_1, scatter_1, err_1), (mean_s, scatter_s, err_s) = found["one"], found["per split"]
    assert err_1 / scatter_1 < 0.8  # one draw: the error leaves its noise out
    assert 0.7 < err_s / scatter_s < 1.5  # drawn in each split: the error is the scatter
    assert scatter_s < 0.75 * scatter_1
    assert mean_s == pytest.approx(mean_1, rel=0.1)


def test_redraws_must_be_aligned_and_name_a_candidate(toy):
    real = toy(400, seed=0)
    model = toy(400, seed=1, conditions=real.conditions)
    calls = []

    def draw(index, split):
        calls.append(split)
        return toy(len(index), seed=10 + split, conditions=real.conditions[index])

    res = compare(real, {"model": model}, n_splits=3, redraw={"model": draw})
    assert calls == [0, 1, 2] and np.isfinite(res["summary"]["median_ratio"])
    with pytest.raises(ValueError, match="not aligned"):
        compare(real, {"model": model}, n_splits=2, redraw={"model": lambda i, s: model})
    with pytest.raises(ValueError, match="names no candidate"):
        compare(real, {"model": model}, n_splits=2, redraw={"other": draw})


def test_compare_says_what_it_measures_and_how_long_it_took(toy, caplog):
    """Each of the floor, the baseline and every candidate gets a line when its
    measurement starts and one when it is done (a 2000000-row set takes minutes)."""
    real = toy(300, seed=0)
    model = toy(300, seed=1, conditions=real.conditions)
    other = toy(300, seed=2, conditions=real.conditions)

    def draw(index, split):
        return toy(len(index), seed=10 + split, conditions=real.conditions[index])

    with caplog.at_level("INFO", logger="muongen.evaluate.floors"):
        compare(real, {"model": model, "other": other}, n_splits=2, redraw={"model": draw})
    lines = [r.getMessage() for r in caplog.records]
    for name in ("the floor", "the condition-ignoring baseline", "the model", "the other"):
        assert sum(m.startswith(f"measuring {name}") for m in lines) == 1, (name, lines)
        assert sum(m.startswith(f"measured {name}") for m in lines) == 1, (name, lines)
    assert any("drawn anew in each split" in m for m in lines)
    assert all(m.endswith(" s") for m in lines if m.startswith("measured "))


def test_perfect_model_sits_at_the_floor_and_bad_model_fails(toy):
    real = toy(6000, seed=0)
    good = toy(6000, seed=1, conditions=real.conditions)  # same physics, same primaries
    bad = toy(6000, seed=2, conditions=real.conditions, shift=0.3)
    bins = {"log10_energy": np.array([5.0, 6.0, 7.0, 8.0])}
    res = compare(real, {"model": good}, bins=bins, n_splits=8, seed=0)
    assert res["split"]["n_splits"] == 8 and res["split"]["w1"] == "fine grid"
    for m, e in res["overall"].items():
        if not np.isfinite(e["floor"]):  # no bundles of 100+ muons in the toy
            assert e["verdict"] == "n/a", m
            continue
        assert e["floor"] > 0 and e["floor_err"] > 0, m
        assert e["model_ratio"] == pytest.approx(e["model"] / e["floor"])
        assert e["model_ratio"] < 2.0, (m, e)
        assert e["verdict"].split(";")[0] in ("pass", "no pass", "floor uncertain"), (m, e)
    # conditionally, the baseline (which ignores the primary) is far off; the model is not
    cond = res["conditional"]["log10_energy"]["multiplicity"]
    assert cond["baseline_ratio"] > 5.0 > cond["model_ratio"]
    assert cond["verdict"] == "pass; beats baseline"
    assert 0.7 < res["summary"]["median_ratio"] < 1.3

    res_bad = compare(real, {"model": bad}, n_splits=4, seed=0)
    e = res_bad["overall"]["muon_log10_energy"]
    assert e["model"] == pytest.approx(0.3, abs=0.05)
    assert e["model_ratio"] > 5 and e["verdict"] == "FAIL; loses to baseline"


def test_grid_and_exact_w1_agree_in_compare(toy):
    real = toy(3000, seed=5)
    model = toy(3000, seed=6, conditions=real.conditions, shift=0.1)
    names = ("muon_log10_energy", "muon_radius", "muon_log10_radius_n2-9")
    names = (*names, "muon_log10_radius_by_energy")
    fast = compare(real, {"model": model}, n_splits=3, names=names)
    exact = compare(real, {"model": model}, n_splits=3, names=names, fast=False)
    assert exact["split"]["w1"] == "exact"
    for m in names:
        for k in ("floor", "model", "baseline"):
            assert fast["overall"][m][k] == pytest.approx(exact["overall"][m][k], rel=0.02), (m, k)


def test_bins_count_events_and_flag_sparse_ones(toy):
    real = toy(2000, seed=3)
    model = toy(2000, seed=4, conditions=real.conditions)
    log_e = real.condition("log10_energy")
    edges = np.array([5.0, 5.1, 7.0, 8.0])  # the first bin holds ~3 % of the events
    res = compare(real, {"model": model}, bins={"log10_energy": edges}, n_splits=2, min_events=100)
    rows = res["binned"]["log10_energy"]["bins"]
    assert [r["n_events"] for r in rows] == [
        int(((log_e >= lo) & (log_e < hi)).sum()) for lo, hi in itertools.pairwise(edges)
    ]
    assert rows[0]["sparse"] and rows[0]["metrics"] is None
    assert not rows[1]["sparse"] and set(rows[1]["metrics"]["multiplicity"]) >= {
        "floor",
        "floor_err",
        "floor_rel_err",
        "model",
        "model_ratio",
        "baseline",
        "verdict",
    }
    assert res["ratio_target"] == 3.0 and res["split"]["n_events"] == 2000


def _thin_bin_sample(real_muons_in_low_bin: bool) -> EventSample:
    """1000 events at 1e5.5 GeV of which 12 hold one muon (or none), 1000 at 1e7 GeV with
    Poisson(3) muons: the low bin has events enough, bundles too few to measure muons by."""
    rng = np.random.default_rng(5)
    e0 = np.r_[np.full(1000, 10**5.5), np.full(1000, 1e7)]
    cond = np.stack([e0, np.full(2000, 0.3), np.full(2000, 4.0), np.full(2000, 1500.0)], 1)
    counts = np.r_[np.zeros(1000, np.int64), rng.poisson(3.0, 1000)]
    if real_muons_in_low_bin:
        counts[rng.choice(1000, 12, replace=False)] = 1
    n = int(counts.sum())
    muons = np.stack([10.0 ** rng.normal(2, 0.5, n), rng.normal(0, 5, n), rng.normal(0, 5, n)], 1)
    return EventSample.from_arrays(cond, muons, counts)


def test_a_bin_of_few_bundles_is_not_failed_for_the_muons_it_cannot_measure():
    """A bin with 500 events per half but ~6 muon-carrying ones: the muon metrics' floor there
    rests on a handful of bundles, so it is not measured, and a model that happens to make
    none of its 12 muons is not a "FAIL; no model output" nor an infinite worst ratio. Its
    multiplicity is measured (1000 events), and a lower --min-bin-events measures the rest."""
    real, model = _thin_bin_sample(True), _thin_bin_sample(False)
    bins = {"log10_energy": np.array([5.0, 6.0, 8.0])}
    res = compare(real, {"model": model}, bins=bins, n_splits=4, min_events=50)
    low = res["binned"]["log10_energy"]["bins"][0]
    assert not low["sparse"] and low["n_events"] == 1000
    for m in ("muon_log10_energy", "muon_radius", "frechet_event", "muon_log10_energy_n1"):
        assert low["metrics"][m]["verdict"] == "n/a", m
    assert math.isfinite(low["metrics"]["multiplicity"]["floor"])
    assert math.isfinite(res["summary"]["worst_ratio"])
    assert not res["summary"]["worst_no_output"]
    thin = compare(real, {"model": model}, bins=bins, n_splits=4, min_events=2)
    low = thin["binned"]["log10_energy"]["bins"][0]["metrics"]
    assert low["muon_log10_energy"]["verdict"].endswith("no model output")
    assert math.isnan(low["muon_log10_energy"]["model"])


def test_compare_refuses_misaligned_candidates(toy):
    real = toy(100, seed=0)
    with pytest.raises(ValueError, match="aligned"):
        compare(real, {"model": toy(100, seed=1)}, n_splits=2)


# ------------------------------------------------------------- verdicts on constructed cases

GOOD = {
    "floor": 1.0,
    "floor_err": 0.1,
    "floor_rel_err": 0.1,
    "model": 1.2,
    "model_ratio": 1.2,
    "baseline": 5.0,
    "model_minus_baseline": -3.8,
    "model_minus_baseline_err": 0.2,
}


def test_verdict_pass_and_fail_on_the_ratio():
    assert verdict(GOOD, 3.0) == "pass; beats baseline"
    worse = {**GOOD, "model": 4.0, "model_ratio": 4.0, "model_minus_baseline": -1.0}
    assert verdict(worse, 3.0) == "FAIL; beats baseline"


def test_no_verdict_where_the_floor_is_uncertain():
    for rel in (FLOOR_REL_ERR_MAX + 0.01, 2.0, float("nan")):  # nan: a single split
        e = {**GOOD, "floor_rel_err": rel, "model": 9.0, "model_ratio": 9.0}
        assert verdict(e, 3.0) == "floor uncertain; beats baseline"
        e = {**e, "model": float("nan"), "model_ratio": float("nan")}
        assert verdict(e, 3.0) == "floor uncertain; no model output"
    at_limit = {**GOOD, "floor_rel_err": FLOOR_REL_ERR_MAX}
    assert verdict(at_limit, 3.0).startswith("pass")


def test_a_model_worse_than_the_baseline_never_passes():
    # worse within two standard errors of the paired difference: no pass (and no "ties")
    e = {**GOOD, "model": 1.1, "baseline": 1.0, "model_minus_baseline": 0.1}
    e["model_minus_baseline_err"] = 0.1
    assert verdict(e, 3.0) == "no pass; worse than baseline (within errors)"
    # worse beyond them: FAIL, although the ratio is within the target
    e["model_minus_baseline_err"] = 0.01
    assert verdict(e, 3.0) == "FAIL; loses to baseline"
    # equal or better within errors: a tie, and a pass
    e = {**e, "model_minus_baseline": -0.05, "model_minus_baseline_err": 0.1}
    assert verdict(e, 3.0) == "pass; ties baseline"
    e["model_minus_baseline"] = 0.0
    assert verdict(e, 3.0) == "pass; ties baseline"


def test_verdict_without_data_or_output():
    assert verdict({**GOOD, "floor": float("nan")}, 3.0) == "n/a"
    assert verdict({**GOOD, "model": float("nan"), "model_ratio": float("nan")}, 3.0) == (
        "FAIL; no model output"
    )


def _result_with_a_bad_bin(toy):
    """A model right everywhere but in the top primary-energy bin, where its muons are
    0.5 dex too energetic."""
    real = toy(6000, seed=0)
    good = toy(6000, seed=1, conditions=real.conditions)
    top = np.repeat(real.condition("log10_energy") >= 7.0, good.counts)
    muons = good.physical_muons()
    muons[top, 0] *= 10.0**0.5
    model = EventSample.from_arrays(real.conditions, muons, good.counts)
    bins = {"log10_energy": np.array([5.0, 6.0, 7.0, 8.0])}
    return compare(real, {"model": model}, bins=bins, n_splits=6, seed=1)


def test_summary_names_the_worst_bin_and_ends_metrics_json(tmp_path, toy):
    import json

    from muongen.evaluate import report

    res = _result_with_a_bad_bin(toy)
    s = res["summary"]
    assert s["worst"].endswith(" @ log10_energy [7, 8)")
    # the median and worst over every overall and binned ratio, recomputed here
    ratios = [e["model_ratio"] for e in res["overall"].values()]
    for row in res["binned"]["log10_energy"]["bins"]:
        ratios += [e["model_ratio"] for e in row["metrics"].values()]
    ratios = [r for r in ratios if np.isfinite(r)]
    assert s["median_ratio"] == pytest.approx(np.median(ratios))
    assert s["worst_ratio"] == pytest.approx(max(ratios)) and s["worst_ratio"] > 10
    assert s["n_metrics"] == len(ratios)
    table = report.summary_table(res)
    row = next(r for r in table.splitlines() if r.startswith("| muon_log10_energy "))
    assert "log10_energy [7, 8): " in row and "FAIL" in row
    path = report.write_metrics_json(tmp_path / "metrics.json", {**res, "meta": {"step": 1}})
    data = json.loads(path.read_text())
    assert list(data)[-1] == "summary"
    assert data["summary"]["median_ratio"] == pytest.approx(s["median_ratio"])
    assert data["summary"]["worst_ratio"] == pytest.approx(s["worst_ratio"])


def test_ratio_summary_counts_no_output_as_infinite():
    e = {**GOOD, "verdict": "pass"}
    missing = {**GOOD, "model": float("nan"), "model_ratio": float("nan"), "verdict": "FAIL"}
    res = {
        "split": {"floor_rel_err_max": FLOOR_REL_ERR_MAX},
        "overall": {"a": e, "b": missing, "c": {**missing, "floor_rel_err": 0.5}},
        "binned": {},
    }
    s = ratio_summary(res)
    assert s["n_metrics"] == 2  # the uncertain one without output has no ratio
    assert s["worst_ratio"] == math.inf and s["worst"] == "b" and s["worst_no_output"]
    assert s["n_pass"] == 1 and s["n_FAIL"] == 2


def test_a_baseline_below_the_floor_is_named_and_losing_to_it_is_no_pass():
    """Where the baseline is closer to half A than half B is (ratio below 1 by more than two
    standard errors), a model worse than it is no pass, not FAIL, however far: the
    comparison says that the simulation itself would be worse too. Where the ratio's error
    reaches 1 losing to it is a FAIL again; a model above the ratio target fails anyway; a
    model that is not worse passes."""
    below = {**GOOD, "baseline": 0.6, "baseline_ratio": 0.6, "baseline_ratio_err": 0.1}
    e = {**below, "model_minus_baseline": 0.6, "model_minus_baseline_err": 0.1}
    assert verdict(e, 3.0) == "no pass; loses to baseline (baseline below floor)"
    assert verdict(e, 0.9).startswith("FAIL; loses")  # ratio 1.0 above a target of 0.9
    e["model_minus_baseline_err"] = 0.4
    assert verdict(e, 3.0) == "no pass; worse than baseline (within errors) (baseline below floor)"
    e = {**e, "baseline_ratio_err": 0.25}  # 0.6 + 2 x 0.25 > 1: not known to be below
    assert verdict(e, 3.0) == "no pass; worse than baseline (within errors)"
    e["model_minus_baseline_err"] = 0.1
    assert verdict(e, 3.0) == "FAIL; loses to baseline"
    e = {**below, "model_minus_baseline": -0.1, "model_minus_baseline_err": 0.1}
    assert verdict(e, 3.0) == "pass; ties baseline"


def test_the_headline_says_how_many_more_showers_would_know_the_uncertain_floors():
    import json

    from muongen.evaluate.report import headline, uncertain_note

    def e(rel):
        return {"floor": 0.1, "floor_rel_err": rel, "model": 0.1, "model_ratio": 1.0}

    result = {
        "summary": {"n_metrics": 4, "median_ratio": 1.0, "worst_ratio": 1.0, "worst": "a"},
        "split": {"n_events": 50000, "n_groups": 1000, "min_events": 50},
        "overall": {"a": e(0.1), "b": e(0.5), "c": e(0.4), "d": e(float("nan"))},
        "binned": {},
    }
    note = uncertain_note(result)
    # (0.5 / 0.25)^2 = 4 times the showers know both; "d" has no error (one split)
    assert "Of the 3 uncertain floors, 1 could be measured in fewer than two splits" in note
    assert "fewer than 50 events of their kind" in note
    assert "2 have floor errors of 40%-50%" in note
    assert "about 4.0x the 1,000 held-out showers here would know the 2" in note
    assert note in headline(result)
    # read back from metrics.json (NaN written as null): the same sentence
    assert uncertain_note(json.loads(json.dumps(result).replace("NaN", "null"))) == note
    # without shower groups the unit is the event; without an error, no factor
    result["split"] = {"n_events": 50000, "min_events": 50}
    result["overall"] = {"a": e(0.1), "d": e(None)}
    note = uncertain_note(result)
    assert "more than the 50,000 held-out events here would give them their splits" in note
    assert "x the" not in note
    result["overall"] = {"a": e(0.1), "b": e(0.3)}
    assert "1 has a floor error of 30%" in uncertain_note(result)
    result["overall"] = {"a": e(0.1)}
    assert uncertain_note(result) == ""


def test_the_headline_counts_where_the_model_is_worse_than_the_baseline():
    from muongen.evaluate.report import headline

    def row(verdict_text):
        return {"lo": 0.0, "hi": 1.0, "metrics": {"m": {"verdict": verdict_text}}}

    result = {
        "summary": {"n_metrics": 4, "median_ratio": 1.1, "worst_ratio": 1.5, "worst": "m"},
        "split": {},
        "binned": {
            "depth": {
                "bins": [
                    row("pass; beats baseline"),
                    row("no pass; loses to baseline (baseline below floor)"),
                    row("no pass; worse than baseline (within errors)"),
                    row("pass; ties baseline"),
                ]
            }
        },
    }
    text = headline(result)
    assert "beats the condition-ignoring baseline on 1 of 4 binned metrics" in text
    assert "worse than it on 2, 1 of them where the baseline is below the floor" in text


def _rich_sample(
    n: int, seed: int, *, conditions: np.ndarray | None = None, rich_shift: float = 0.0
) -> EventSample:
    """Primaries on log10 E0 uniform in [5, 8) GeV with Poisson(10^(log10 E0 - 5.8)) muons
    (100+-muon bundles above ~1e7.8 GeV, ~7 % of the events); muon log10 E ~ N(2, 0.5),
    shifted by ``rich_shift`` in the bundles of 100 or more muons only."""
    rng = np.random.default_rng(seed)
    if conditions is None:
        conditions = np.stack(
            [10.0 ** rng.uniform(5, 8, n), np.full(n, 0.3), np.full(n, 4.0), np.full(n, 1500.0)],
            1,
        )
    counts = rng.poisson(10.0 ** (np.log10(conditions[:, 0]) - 5.8))
    n_mu = int(counts.sum())
    shift = np.repeat(np.where(counts >= 100, rich_shift, 0.0), counts)
    r = rng.exponential(20.0, n_mu)
    phi = rng.uniform(0.0, 2 * np.pi, n_mu)
    muons = np.stack(
        [10.0 ** (rng.normal(2.0, 0.5, n_mu) + shift), r * np.sin(phi), r * np.cos(phi)], 1
    )
    return EventSample.from_arrays(conditions, muons, counts)


def test_top_energy_decade_is_the_decade_below_the_highest_energy():
    from muongen.evaluate.floors import top_energy_decade

    def at(*e0):
        e0 = np.asarray(e0, dtype=np.float64)
        cond = np.stack([e0, np.zeros_like(e0), np.ones_like(e0), np.full_like(e0, 1500.0)], 1)
        return EventSample.from_arrays(cond, np.zeros((0, 3)), np.zeros(len(e0), np.int64))

    assert top_energy_decade(at(1e4, 3e7, 9.9e7)) == (7, 8)
    assert top_energy_decade(at(1e4, 1e8)) == (7, 8)  # a decade's upper edge belongs to it
    lo, hi = top_energy_decade(at(1e4, 1.1e8))  # just past a whole decade: that decade
    assert lo == 7 and hi == pytest.approx(np.log10(1.1e8))
    # well inside a decade: the decade below the highest energy, never a sliver of one
    assert top_energy_decade(at(1e4, 10**5.3)) == pytest.approx((4.3, 5.3), abs=1e-6)
    assert top_energy_decade(at(1e4, 1.5e8)) == pytest.approx(
        (np.log10(1.5e7), np.log10(1.5e8)), abs=1e-6
    )
    from muongen.evaluate.floors import _decade_label

    assert _decade_label(7.0, 8.0) == "1e7-1e8 GeV"
    assert _decade_label(np.log10(1.5e7), np.log10(1.5e8)) == "1.5e7-1.5e8 GeV"
    assert _decade_label(7.0, np.log10(1.1e8)) == "1e7-1.1e8 GeV"


def test_the_tail_rows_tell_apart_a_model_that_misses_only_the_richest_bundles():
    """A model exact but for a +0.5 dex muon energy shift in its 100+-muon bundles: the
    overall median stays near the floor (those bundles are ~7 % of the events), the
    rich_bundles row's worst shows the miss in a muon energy metric (not in the radii), and
    the top decade of primary energy (where those bundles are) shows it too. A perfect
    model's tail rows sit near the floor. The counts of held-out events and the ranges are
    the data's own."""
    real = _rich_sample(4000, seed=0)
    perfect = _rich_sample(4000, seed=1, conditions=real.conditions)
    shifted = _rich_sample(4000, seed=1, conditions=real.conditions, rich_shift=0.5)
    log_e = real.condition("log10_energy")
    res_p = compare(real, {"model": perfect}, n_splits=4, seed=0)
    res_s = compare(real, {"model": shifted}, n_splits=4, seed=0)
    for res in (res_p, res_s):
        tail = res["summary"]["tail"]
        assert set(tail) == {"top_energy_decade", "rich_bundles"}
        top, rich = tail["top_energy_decade"], tail["rich_bundles"]
        assert set(top) >= {"median_ratio", "worst_ratio", "worst", "n_events", "range"}
        assert top["range"] == "1e7-1e8 GeV" and rich["range"] == "100+ muons"
        assert top["n_events"] == int(((log_e >= 7) & (log_e <= 8)).sum())
        assert rich["n_events"] == int((real.counts >= 100).sum()) > 100
        assert res["tail"]["rich_bundles"]["metrics"]["muon_log10_energy"]["verdict"]
    ok = res_p["summary"]["tail"]
    for row in ok.values():
        assert 0.6 < row["median_ratio"] < 1.6 and row["worst_ratio"] < 3.0, row
    bad = res_s["summary"]["tail"]["rich_bundles"]
    e = res_s["tail"]["rich_bundles"]["metrics"]["muon_log10_energy"]
    assert e["model"] == pytest.approx(0.5, abs=0.05) and e["verdict"].startswith("FAIL")
    # the worst is a metric of the muons' energies (the Frechet distance has the bundle's)
    assert bad["worst_ratio"] > 10 and ("energy" in bad["worst"] or bad["worst"] == "frechet_event")
    assert res_s["tail"]["rich_bundles"]["metrics"]["muon_log10_radius_n100+"]["model_ratio"] < 2
    assert res_s["summary"]["tail"]["top_energy_decade"]["worst_ratio"] > 10
    # the overall median does not tell: most metrics follow the bulk
    assert res_s["summary"]["median_ratio"] < 1.5


def test_a_tail_with_too_few_events_is_sparse_without_ratios():
    """No 100+-muon bundles in the toy: the row is sparse, its ratios NaN, its worst None."""
    real = _rich_sample(600, seed=2)
    keep = real.counts < 100
    real = real.take(keep)
    model = _rich_sample(len(real.counts), seed=3, conditions=real.conditions)
    model = model.take(np.ones(model.n_events, bool))
    res = compare(real, {"model": model}, n_splits=2, names=("muon_log10_energy",))
    row = res["summary"]["tail"]["rich_bundles"]
    assert res["tail"]["rich_bundles"]["sparse"] and res["tail"]["rich_bundles"]["metrics"] is None
    assert row["n_events"] == 0 and row["worst"] is None
    assert math.isnan(row["median_ratio"]) and math.isnan(row["worst_ratio"])
