"""train.calibrate_rows: a run that finishes maps its generator's muon energies and (with
train.calibrate_radius, the default) radii onto the training files' and stores the maps in
its final checkpoint only; sampling, export and `muongen inspect` read them, `evaluate
--uncalibrated` leaves them off, and a run that resumes and trains on starts without them."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from muongen import checkpoint as ckpt
from muongen.checkpoint_inspect import format_text, inspect_checkpoint
from muongen.evaluate.sample import generate, read_inputs
from muongen.inference import open_for_inference
from muongen.train.trainer import Trainer


def test_a_finished_run_calibrates_its_final_checkpoint_only(
    tiny_config, tiny_data, tmp_path, caplog, monkeypatch
):
    # the tiny untrained model draws few muons: map the classes it draws 50 of
    monkeypatch.setattr("muongen.model.calibration.MIN_MUONS", 50)
    run = tmp_path / "r"
    cfg = tiny_config(train__max_steps=20, train__calibrate_rows=100000, checkpoint__every_steps=10)
    with caplog.at_level(logging.INFO, "muongen.train.calibrate"):
        assert Trainer(cfg, run).train() == 0
    said = [r.getMessage() for r in caplog.records if r.name == "muongen.train.calibrate"]
    assert len(said) == 2 and "fitted on 1,600 training rows" in said[0]
    assert "dex before" in said[0] and said[1].startswith("radius calibration: ")
    manifests = sorted((run / "checkpoints").glob("step-*.json"))
    assert [ckpt.read_manifest(m)["step"] for m in manifests] == [10, 20]
    first, final = ckpt.load(manifests[0]), ckpt.load(manifests[1])
    assert not first.get("energy_calibration") and not first.get("radius_calibration")
    state = final["energy_calibration"]
    assert state["events"] == 1600 and 0 < int(state["fitted"].sum()) <= 16
    assert final["radius_calibration"]["events"] == 1600
    assert int(final["radius_calibration"]["fitted"].sum()) > 0

    # sampling carries the maps; --uncalibrated (calibrated=False) leaves them off
    on = open_for_inference(manifests[1]).generator
    off = open_for_inference(manifests[1], calibrated=False).generator
    assert on.energy_calibration is not None and off.energy_calibration is None
    assert on.radius_calibration is not None and off.radius_calibration is None
    real = read_inputs([str(tiny_data)], 400)
    a, b = generate(on, real.conditions, seed=4), generate(off, real.conditions, seed=4)
    assert torch.equal(a.counts, b.counts)
    moved = (a.muons[:, 0] / b.muons[:, 0] - 1).abs() > 1e-4
    assert moved.float().mean() > 0.2
    # the radii are moved along each muon's own direction, towards the training data's (in
    # metres, as the data: the map is fitted and applied in the same unit)
    angle = [torch.atan2(m.muons[:, 2], m.muons[:, 1]) for m in (a, b)]
    torch.testing.assert_close(angle[0], angle[1], rtol=0, atol=1e-4)

    def log_r(sample):
        return np.log10(torch.hypot(sample.muons[:, 1], sample.muons[:, 2]).double().numpy())

    q = [0.1, 0.5, 0.9]
    want = np.quantile(log_r(real), q)
    assert np.abs(np.quantile(log_r(a), q) - want).max() < 0.1
    assert np.abs(np.quantile(log_r(b), q) - want).max() > 0.2  # the untrained model's own
    text = format_text(inspect_checkpoint(str(manifests[1])))
    assert "muon energies calibrated after training (train.calibrate_rows)" in text
    assert "muon radii calibrated after training (train.calibrate_radius)" in text
    first_text = format_text(inspect_checkpoint(str(manifests[0])))
    assert "no calibration" in first_text and "no radius calibration" in first_text

    # a resumed run trains on: it starts without the maps and fits its own at its end (here
    # the energies' alone, their classes split by depth: train.calibrate_radius false,
    # train.calibrate_depth_bins 2)
    more = tiny_config(
        train__max_steps=30,
        train__calibrate_rows=100000,
        train__calibrate_radius=False,
        train__calibrate_depth_bins=2,
    )
    resumed = Trainer(more, run)
    assert resumed.resume("auto") is not None and resumed.calibration.state == {}
    assert resumed.radius_calibration.state == {}
    assert resumed.train() == 0
    last = ckpt.find_latest(run / "checkpoints")
    assert ckpt.read_manifest(last)["step"] == 30
    assert ckpt.load(last)["energy_calibration"]["events"] == 1600
    assert ckpt.load(last)["energy_calibration"]["depth_edges"].numel() == 1
    assert ckpt.load(last)["energy_calibration"]["table"].shape[0] == 32
    assert not ckpt.load(last).get("radius_calibration")


def test_a_run_without_calibrate_rows_or_stopped_early_has_no_map(tiny_config, tmp_path):
    run = tmp_path / "plain"
    assert Trainer(tiny_config(train__max_steps=10), run).train() == 0
    assert not ckpt.load(ckpt.find_latest(run / "checkpoints")).get("energy_calibration")
    # a map this muongen cannot read: a clear error naming the file, and the way around it
    from muongen.errors import CheckpointError

    payload = ckpt.load(ckpt.find_latest(run / "checkpoints"))
    payload["energy_calibration"] = {"version": 99}
    saved = ckpt.save(payload, tmp_path / "future", "step-000000010", step=10)
    with pytest.raises(CheckpointError, match=r"step-000000010.json: its energy calibration"):
        open_for_inference(saved.manifest)
    assert open_for_inference(saved.manifest, calibrated=False).generator is not None
    del payload["energy_calibration"]
    payload["radius_calibration"] = {"version": 99}
    saved = ckpt.save(payload, tmp_path / "future-r", "step-000000010", step=10)
    with pytest.raises(CheckpointError, match=r"its radius calibration cannot be read"):
        open_for_inference(saved.manifest)
    assert open_for_inference(saved.manifest, calibrated=False).generator is not None
    stopped = tmp_path / "budget"
    cfg = tiny_config(train__max_steps=10**6, train__calibrate_rows=1000, train__time_budget_s=0.5)
    assert Trainer(cfg, stopped).train() == cfg.train.budget_exit_code
    assert not ckpt.load(ckpt.find_latest(stopped / "checkpoints")).get("energy_calibration")


def test_the_benchmark_fits_the_trainers_map_on_a_checkpoint_and_scores_it(
    tiny_config, tiny_data, tmp_path, load_script, monkeypatch
):
    """benchmarks/calibrated_candidate.py: ``--by off`` scores the checkpoint as `muongen
    evaluate` does (the same metrics.json figures); with the map it scores another
    candidate, named so in the metadata."""
    import json

    from muongen.cli import main

    monkeypatch.setattr("muongen.model.calibration.MIN_MUONS", 50)
    run = tmp_path / "r"
    assert Trainer(tiny_config(train__max_steps=10), run).train() == 0
    bench = load_script("benchmarks/calibrated_candidate.py")
    ck, held = str(run / "checkpoints"), str(tiny_data)
    common = ["--checkpoint", ck, "--fit", held, "--data", held, "--n-splits", "2"]
    assert bench.main([*common, "--by", "off", "--out", str(tmp_path / "off")]) == 0
    assert bench.main([*common, "--out", str(tmp_path / "on")]) == 0
    radius = ["--radius", "mult-zenith", "--out", str(tmp_path / "both")]
    assert bench.main([*common, *radius]) == 0
    args = ["evaluate", "--checkpoint", ck, "--data", held, "--n-splits", "2", "--threads", "1"]
    assert main([*args, "--out", str(tmp_path / "ev")]) == 0
    off, on, both, ev = (
        json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("off", "on", "both", "ev")
    )
    assert off["summary"]["median_ratio"] == ev["summary"]["median_ratio"]
    assert off["overall"] == ev["overall"]
    assert on["meta"]["checkpoint"].endswith("+ energy calibration")
    assert both["meta"]["checkpoint"].endswith("+ energy calibration + radius calibration")
    energy = "muon_log10_energy"
    assert on["overall"][energy]["model"] != off["overall"][energy]["model"]
    assert on["overall"]["muon_radius"]["model"] == off["overall"]["muon_radius"]["model"]
    assert both["overall"]["muon_radius"]["model"] != on["overall"]["muon_radius"]["model"]


def test_a_calibration_that_fails_leaves_the_trained_checkpoint(
    tiny_config, tmp_path, caplog, monkeypatch
):
    """An error while fitting the map (here an unreadable training file met with
    data.strict) is a warning: the run still ends with its final checkpoint, without maps."""
    from muongen.errors import InputFileError

    def fail(*args, **kwargs):
        raise InputFileError("/data/0003.parquet: truncated (a test)")

    monkeypatch.setattr("muongen.train.trainer.fit_on_files", fail)
    run = tmp_path / "r"
    cfg = tiny_config(train__max_steps=7, train__calibrate_rows=1000)
    with caplog.at_level(logging.WARNING, "muongen.train.trainer"):
        assert Trainer(cfg, run).train() == 0
    last = ckpt.find_latest(run / "checkpoints")
    assert ckpt.read_manifest(last)["step"] == 7
    assert not ckpt.load(last).get("energy_calibration")
    assert not ckpt.load(last).get("radius_calibration")
    assert any(
        "calibration failed (/data/0003.parquet: truncated" in r.getMessage()
        for r in caplog.records
    )
