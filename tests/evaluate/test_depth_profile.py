"""benchmarks/depth_profile.py: the per-band profiles are the numbers they claim, and the
script runs on a checkpoint and a held-out file."""

from __future__ import annotations

import numpy as np
import pytest
import torch


@pytest.fixture(scope="module")
def depth_profile(load_script):
    return load_script("benchmarks/depth_profile.py")


def test_profile_means_quantiles_and_events_per_band(depth_profile):
    # three events: 3 muons at 1100 m (10, 100, 1000 GeV), 12 at 1200 m (all 100 GeV), 0 at
    # 1900 m; bands [1000, 1500) and [1500, 2000)
    depth = np.array([1100.0, 1200.0, 1900.0])
    counts = np.array([3, 12, 0])
    energies = np.concatenate([[10.0, 100.0, 1000.0], np.full(12, 100.0)])
    muons = np.column_stack([energies, np.zeros(15), np.zeros(15)])
    out = depth_profile.profile(depth, muons, counts, np.array([1000.0, 1500.0, 2000.0]))
    small, mid, big = out[(2, 9)], out[(10, 99)], out[(100, None)]
    assert small["mean"][0] == pytest.approx(2.0) and np.isnan(small["mean"][1])
    assert small["q10"][0] == pytest.approx(np.quantile([1.0, 2.0, 3.0], 0.1))
    assert small["events"] == [1, 0] and mid["events"] == [1, 0] and big["events"] == [0, 0]
    assert mid["mean"][0] == pytest.approx(2.0)


def test_real_counts_fix_the_rows_and_the_script_prints_every_size(
    depth_profile, tiny_checkpoint, held_out, capsys
):
    from muongen.evaluate.sample import generate, read_inputs
    from muongen.inference import open_for_inference

    real = read_inputs([str(held_out)])
    model = open_for_inference(str(tiny_checkpoint), torch.device("cpu"))
    fixed = generate(model.generator, real.conditions, batch_events=256, counts=real.counts)
    assert fixed.counts.tolist() == real.counts.tolist()
    muons = fixed.muons.numpy()
    assert muons.shape == (int(real.counts.sum()), 3) and np.isfinite(muons).all()
    assert (muons[:, 0] > 0).all()
    assert (
        depth_profile.main(
            [
                "--checkpoint",
                str(tiny_checkpoint),
                "--data",
                str(held_out),
                "--bands",
                "3",
                "--by-energy",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "real N minus real" in text and text.count("E0 1e") >= 3
    for label in ("2-9 muons", "10-99 muons", "100+ muons"):
        assert label in text
    assert text.count("mean   real N") == 3 and text.count("events own N") == 3


def test_energy_depth_shift_is_the_cells_mean_difference(depth_profile):
    # two events of 10 muons: 1e6 GeV at 1100 m, 1e7 GeV at 1900 m; the fake's energies are
    # 10x the real ones in the first, the same in the second
    cond = np.array([[1e6, 0.0, 1.0, 1100.0], [1e7, 0.0, 1.0, 1900.0]])
    counts = np.array([10, 10])
    real = np.column_stack([np.full(20, 100.0), np.zeros(20), np.zeros(20)])
    fake = real.copy()
    fake[:10, 0] = 1000.0
    shift, muons = depth_profile.energy_depth_shift(
        cond,
        real,
        fake,
        counts,
        np.array([1000.0, 1500.0, 2000.0]),
        np.array([6.0, 7.0, 8.0]),
        min_muons=5,
    )[(10, 99)]
    assert muons.tolist() == [[10, 0], [0, 10]]
    assert shift[0, 0] == pytest.approx(1.0) and shift[1, 1] == pytest.approx(0.0)
    assert np.isnan(shift[0, 1]) and np.isnan(shift[1, 0])
    # too few muons: no figure
    shift, _ = depth_profile.energy_depth_shift(
        cond, real, fake, counts, np.array([1000.0, 2000.0]), np.array([6.0, 8.0])
    )[(10, 99)]
    assert np.isnan(shift).all()
