"""`muongen evaluate` end to end on a tiny checkpoint, and its pieces."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from muongen.cli import main
from muongen.errors import ConfigError
from muongen.evaluate.command import evaluate_generator, parse_bins
from muongen.evaluate.metrics import METRICS
from muongen.evaluate.sample import read_inputs


def test_evaluate_end_to_end(tmp_path, tiny_checkpoint, held_out, capsys):
    out = tmp_path / "eval"
    argv = [
        "evaluate",
        "--checkpoint",
        str(tiny_checkpoint),
        "--data",
        str(held_out),
        "--out",
        str(out),
    ]
    code = main(
        [
            *argv,
            "--n-splits",
            "3",
            "--device",
            "cpu",
            "--bins",
            "log10_energy=5,6.5,8",
            "--min-bin-events",
            "20",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    # a short summary that fits a terminal; the full table is in report.md
    lines = printed.splitlines()
    assert "| metric" not in printed and len(lines) <= 8, printed
    assert max(map(len, lines[:-1])) <= 100, printed
    assert "median" in lines[0] and "worst" in lines[0] and "verdicts:" in printed
    assert lines[-1] == f"wrote metrics.json, report.md (the full tables) and 11 plots in {out}"
    data = json.loads((out / "metrics.json").read_text())
    assert set(data["overall"]) == set(METRICS)
    assert list(data)[-1] == "summary" and data["summary"]["median_ratio"] > 0
    assert data["split"]["n_splits"] == 3
    assert data["meta"]["step"] == 7 and data["meta"]["checkpoint"] == str(tiny_checkpoint)
    assert data["split"]["n_events"] == 600 and data["throughput"]["events"] == 600
    assert data["binned"]["log10_energy"]["edges"] == [5.0, 6.5, 8.0]
    assert set(data["binned"]) == {"log10_energy", "cos_zenith", "depth"}  # others by default
    # the tiny model makes 3 muons everywhere: its multiplicity is far off the toy physics
    assert data["overall"]["multiplicity"]["model_ratio"] > 3
    assert data["overall"]["multiplicity"]["verdict"].startswith(("FAIL", "floor uncertain"))
    report = (out / "report.md").read_text()
    assert "| metric" in report and "floor ± err" in report
    assert data["split"]["model_draws"] == "per split"
    assert "3 random half splits, the model generated anew for each" in report
    for name in ("muon_log10_energy", "event_multiplicity", "multiplicity_vs_energy", "by_depth"):
        png = out / f"{name}.png"
        assert png.stat().st_size > 5000 and f"({name}.png)" in report


def test_evaluate_generator_in_process(tiny_generator, held_out):
    real = read_inputs([str(held_out)])
    result, samples = evaluate_generator(
        tiny_generator, real, n_splits=1, bins=[], group_showers=False
    )
    assert samples["model"].n_events == real.n_events
    assert samples["model"].counts.tolist() == [3] * real.n_events
    assert result["split"]["n_groups"] is None and result["split"]["n_splits"] == 1
    entry = result["overall"]["muon_log10_energy"]
    assert entry["floor"] > 0 and np.isnan(entry["floor_err"])  # one split: no errors
    assert entry["verdict"].startswith("floor uncertain")  # and no verdict


def test_parse_bins(toy):
    real = toy(500)
    bins = parse_bins(["depth=1000,2000,2800"], real)
    assert bins["depth"].tolist() == [1000.0, 2000.0, 2800.0]
    assert len(bins["log10_energy"]) == 5  # default: 4 quantile bins
    for bad in ("depth", "colour=1,2", "depth=3,2"):
        with pytest.raises(ConfigError, match="--bins"):
            parse_bins([bad], real)


def test_evaluate_cli_user_errors(tmp_path, tiny_checkpoint, held_out, capsys):
    argv = ["evaluate", "--checkpoint", str(tmp_path / "missing.json"), "--data", str(held_out)]
    assert main([*argv, "--out", str(tmp_path / "o")]) != 0
    assert "missing.json" in capsys.readouterr().err
    argv = ["evaluate", "--checkpoint", str(tiny_checkpoint), "--data", str(tmp_path / "nothing")]
    assert main([*argv, "--out", str(tmp_path / "o"), "--device", "cpu"]) != 0
    assert "nothing" in capsys.readouterr().err


def test_evaluate_keeps_the_metrics_when_the_plots_fail(
    tmp_path, tiny_checkpoint, held_out, capsys, monkeypatch
):
    """A plotting failure (e.g. a missing style package) costs the plots, not the metrics."""
    from muongen.evaluate import plots

    def broken(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'mplhep'")

    monkeypatch.setattr(plots, "feature_figures", broken)
    out = tmp_path / "eval"
    argv = ["evaluate", "--checkpoint", str(tiny_checkpoint), "--data", str(held_out)]
    code = main([*argv, "--out", str(out), "--n-splits", "2", "--device", "cpu"])
    assert code != 0
    err = capsys.readouterr().err
    assert "plots could not be drawn" in err and "mplhep" in err and "metrics.json" in err
    data = json.loads((out / "metrics.json").read_text())
    assert data["summary"]["median_ratio"] > 0
    assert "| metric" in (out / "report.md").read_text()
    assert not list(out.glob("*.png"))


def test_evaluate_generates_on_its_threads_and_gives_the_rest_back(
    tmp_path, tiny_checkpoint, held_out, capsys, monkeypatch
):
    """--threads N sets torch's threads while evaluate runs (what the generator sees)
    and restores the caller's count after; a negative count is a user error."""
    from muongen.evaluate import command

    seen = []
    real_generate = command.evaluate_generator

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(command, "evaluate_generator", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        argv = ["evaluate", "--checkpoint", str(tiny_checkpoint), "--data", str(held_out)]
        argv += ["--n-splits", "2", "--device", "cpu", "--out", str(tmp_path / "e")]
        assert main(argv) == 0  # default: one thread
        assert main([*argv, "--threads", "0", "--overwrite"]) == 0  # torch's own, left alone
        assert seen == [1, 2] and torch.get_num_threads() == 2
        assert main([*argv, "--threads", "-1"]) != 0
        assert "--threads >= 0" in capsys.readouterr().err
    finally:
        torch.set_num_threads(before)


def test_evaluate_draws_the_model_anew_in_each_split(tiny_generator, held_out):
    """By default each split's half gets its own generation (seeded by the seed and the
    split: the same result twice); --single-draw measures the one draw shared by all."""
    real = read_inputs([str(held_out)])
    kw = {"n_splits": 3, "bins": [], "group_showers": False}
    per_split, _ = evaluate_generator(tiny_generator, real, **kw)
    again, _ = evaluate_generator(tiny_generator, real, **kw)
    single, _ = evaluate_generator(tiny_generator, real, redraw=False, **kw)
    assert per_split["split"]["model_draws"] == "per split"
    assert single["split"]["model_draws"] == "one"
    name = "muon_log10_energy"
    assert per_split["overall"][name]["model"] == again["overall"][name]["model"]
    assert per_split["overall"][name]["model"] != single["overall"][name]["model"]
    # the floor and the baseline do not depend on how the model is drawn
    for key in ("floor", "baseline"):
        assert per_split["overall"][name][key] == single["overall"][name][key]


_BLAS_PROBE = """
import os, sys
from muongen import cli
cli.limit_blas_threads(sys.argv[1])
print(os.environ.get("OPENBLAS_NUM_THREADS", "unset"), "numpy" in sys.modules)
"""


@pytest.mark.parametrize(
    "verb, preset, expected",
    [("evaluate", None, "1"), ("train", None, "unset"), ("sample", None, "unset"),
     ("evaluate", "4", "4")],
)  # fmt: skip
def test_evaluate_runs_numpys_blas_on_one_thread_unless_told(verb, preset, expected):
    """`muongen evaluate` sets OPENBLAS_NUM_THREADS=1 before numpy loads (its spare BLAS
    threads only spin), other verbs leave it alone, and a value the user set stays."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if preset is not None:
        env["OPENBLAS_NUM_THREADS"] = preset
    out = subprocess.run(
        [sys.executable, "-c", _BLAS_PROBE, verb],
        env=env, capture_output=True, text=True, check=True, timeout=120,
    ).stdout.split()  # fmt: skip
    assert out == [expected, "False"]  # set before numpy was imported
