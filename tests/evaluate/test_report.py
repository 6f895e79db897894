"""metrics.json, report.md and the PNG plots."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from muongen.evaluate import plots, report
from muongen.evaluate.floors import compare
from muongen.evaluate.metrics import METRICS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def result_and_samples(toy):
    """A small compare() result with one binned variable, and the samples behind it."""
    real = toy(1500, seed=0)
    model = toy(1500, seed=1, conditions=real.conditions)
    res = compare(
        real, {"model": model}, bins={"depth": np.array([1000.0, 1900.0, 2800.0])}, n_splits=3
    )
    return res, real, model


def test_jsonable_turns_nan_and_numpy_into_plain_json():
    out = report.jsonable(
        {"a": np.float32(1.5), "b": float("nan"), "c": np.arange(2), "d": (np.True_, np.inf)}
    )
    assert out == {"a": 1.5, "b": None, "c": [0, 1], "d": [True, None]}
    json.dumps(out, allow_nan=False)


def test_metrics_json_holds_every_value(tmp_path, result_and_samples):
    res, _, _ = result_and_samples
    path = report.write_metrics_json(tmp_path / "metrics.json", res)
    data = json.loads(path.read_text())  # strict JSON: no NaN
    assert set(data["overall"]) == set(METRICS)
    for entry in data["overall"].values():
        assert {
            "floor",
            "floor_err",
            "floor_rel_err",
            "model",
            "model_err",
            "model_ratio",
            "model_ratio_err",
        } <= set(entry)
        assert {"baseline", "baseline_ratio", "verdict"} <= set(entry)
    assert [b["n_events"] for b in data["binned"]["depth"]["bins"]] == [
        b["n_events"] for b in res["binned"]["depth"]["bins"]
    ]
    assert set(data["conditional"]["depth"]) == set(METRICS)


def test_summary_table_and_report(tmp_path, result_and_samples):
    res, real, model = result_and_samples
    table = report.summary_table(res)
    lines = table.splitlines()
    assert lines[0].startswith("| metric") and "floor ± err" in lines[0] and "verdict" in lines[0]
    assert "worst bin" in lines[0]
    assert len(lines) == 2 + 2 * len(METRICS)  # header, rule, overall + depth-binned rows
    assert len({line.count("|") for line in lines}) == 1  # a well-formed table
    figs = {"features": plots.feature_histograms(real, {"model": model})}
    pngs = plots.save_figures(figs, tmp_path)
    res = {
        **res,
        "throughput": {
            "events": 10,
            "muons": 30,
            "seconds": 0.5,
            "device": "cpu",
            "events_per_s": 20,
            "muons_per_s": 60,
        },
    }
    text = report.write_report(tmp_path / "report.md", res, pngs).read_text()
    assert "## Summary" in text and table in text and "![features](features.png)" in text
    assert "#### depth" in text and "muons/s" in text
    assert "ratio to floor has median" in report.headline(res)


def test_tail_rows_in_metrics_json_and_report(tmp_path, result_and_samples):
    """The tail subsets: summary["tail"] with the keys `muongen compare` reads, in strict
    JSON; report.md's tail table has one row per subset (a sparse one says so: the toy
    has no 100+-muon bundle) and the top decade's metric rows."""
    res, real, _ = result_and_samples
    data = json.loads(report.write_metrics_json(tmp_path / "metrics.json", res).read_text())
    tail = data["summary"]["tail"]
    assert set(tail) == {"top_energy_decade", "rich_bundles"}
    top = tail["top_energy_decade"]
    log_e = real.condition("log10_energy")
    assert top["range"] == "1e7-1e8 GeV" and top["n_events"] == int((log_e >= 7).sum())
    assert 0 < top["median_ratio"] <= top["worst_ratio"] and top["worst"] in METRICS
    assert tail["rich_bundles"]["n_events"] == 0 and tail["rich_bundles"]["median_ratio"] is None
    text = report.write_report(tmp_path / "report.md", res).read_text()
    assert "## The tail" in text
    table = report.tail_table(res).split("\n\n")
    rows = table[0].splitlines()
    assert rows[0].startswith("| tail ") and len(rows) == 4
    top_row = next(r for r in rows if "top decade of primary energy" in r)
    assert "1e7-1e8 GeV" in top_row and f"{top['median_ratio']:.3g}" in top_row
    assert top["worst"] in top_row
    rich_row = next(r for r in rows if "100+-muon bundles" in r)
    assert rich_row.count("sparse") == 2
    metric_rows = table[1].splitlines()[2:]
    assert len(metric_rows) == len(METRICS)
    assert all(r.startswith("| top decade of primary energy: ") for r in metric_rows)
    assert report.tail_table({"overall": {}}) == ""


def test_every_plot_renders_a_png(tmp_path, result_and_samples):
    res, real, model = result_and_samples
    figs = {
        "features": plots.feature_histograms(real, {"model": model}),
        "mult": plots.multiplicity_vs_energy(real, {"model": model}),
        "depth": plots.by_depth(real, {"model": model}),
        "binned": plots.binned_ratios(res),
    }
    for path in plots.save_figures(figs, tmp_path / "png"):
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000


def test_plots_cope_with_a_model_without_muons(tmp_path, toy):
    real = toy(300, seed=0)
    empty = type(real).from_arrays(real.conditions, np.zeros((0, 3)), np.zeros(real.n_events, int))
    fig = plots.feature_histograms(real, {"model": empty})
    assert plots.save_figures({"f": fig}, tmp_path)[0].stat().st_size > 0
    assert math.isnan(empty.event["mean_radius"][0])


def test_console_summary_is_a_few_short_lines(result_and_samples):
    res, _, _ = result_and_samples
    res = {**res, "summary": {**res["summary"]}}
    res["summary"]["tail"] = {
        "top_energy_decade": {"median_ratio": 2.5, "worst_ratio": 7.0, "worst_no_output": False},
        "rich_bundles": {"median_ratio": float("nan"), "worst_ratio": float("nan")},
    }
    text = report.console_summary(res)
    lines = text.splitlines()
    s = res["summary"]
    assert len(lines) <= 6 and max(map(len, lines)) <= 100, text
    assert lines[0] == (
        f"model / floor over {s['n_metrics']} metrics: median {s['median_ratio']:.3g}x, "
        f"worst {s['worst_ratio']:.3g}x"
    )
    assert f"{s['n_pass']} pass" in text and f"{s['n_FAIL']} FAIL" in text
    assert lines[-1] == (
        "tail: top energy decade median 2.5x, worst 7x; 100+-muon bundles too few events"
    )
    assert "|" not in text  # no table: report.md has those
    empty = report.console_summary({"summary": {"n_metrics": 0}})
    assert empty == "No metric has a floor: the held-out data hold no muons."
