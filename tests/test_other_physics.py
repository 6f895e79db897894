"""benchmarks/other_physics.py: the cross-check physics writes files muongen reads, and its
lateral sampler draws the parametrised density it claims."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from muongen.data.reader import read_events


@pytest.fixture(scope="module")
def other_physics(load_script):
    return load_script("benchmarks/other_physics.py")


@pytest.mark.parametrize("alpha", [4.0, 6.5])
def test_lateral_sampler_follows_the_parametrised_density(other_physics, alpha):
    """The share of draws inside r0 and inside 5 r0 matches the integral of
    R / (R + r0)^alpha (numerical, on a fine grid), not the Beta identity restated."""
    rng = np.random.default_rng(0)
    n, r0 = 400_000, 3.0
    r = other_physics.sample_lateral(np.full(n, r0), np.full(n, alpha), rng)
    u = np.linspace(0.0, 2000.0, 4_000_001)  # R / r0; the tail past 2000 is < 1e-6 here
    pdf = u / (1.0 + u) ** alpha
    cdf = np.concatenate([[0.0], np.cumsum((pdf[1:] + pdf[:-1]) / 2 * np.diff(u))])
    cdf /= cdf[-1]
    for k in (1.0, 5.0):
        expected = np.interp(k, u, cdf)
        got = float(np.mean(r < k * r0))
        assert got == pytest.approx(expected, abs=4 * np.sqrt(expected * (1 - expected) / n))


def test_written_files_load_in_muongen(other_physics, tmp_path, monkeypatch, capsys):
    argv = ["other_physics.py", "--out", str(tmp_path), "--files", "2"]
    monkeypatch.setattr(sys, "argv", [*argv, "--events-per-file", "3000", "--seed", "5"])
    other_physics.main()
    assert "6000 rows" in capsys.readouterr().out
    files = sorted(tmp_path.glob("*.parquet"))
    assert [f.name for f in files] == ["0000000.parquet", "0000001.parquet"]
    expected, _ = other_physics.generate(3000, np.random.default_rng([5, 1]), 1)
    got = read_events(str(files[1]))
    assert got.counts.tolist() == expected.counts.tolist()
    assert got.counts.sum() > 0
    np.testing.assert_allclose(got.muons.numpy(), expected.muons.numpy(), rtol=1e-6)
    np.testing.assert_allclose(got.conditions.numpy(), expected.conditions.numpy(), rtol=1e-6)
    depth = got.conditions[:, 3].numpy()
    assert depth.min() >= 1000.0 and depth.max() <= 2800.0


@pytest.mark.parametrize("index", [1.0, 1.7])
def test_primary_spectrum_follows_its_index(other_physics, index):
    """E^-1 is log-uniform (the special case of the inverse CDF); E^-1.7 keeps its median."""
    u = np.random.default_rng(0).random(200000)
    e = other_physics._power_law(u, index, 1e4, 1e8)
    assert np.isfinite(e).all() and e.min() >= 1e4 and e.max() <= 1e8
    g = 1.0 - index
    median = 1e4 * 1e4**0.5 if abs(g) < 1e-9 else ((1e4**g + 1e8**g) / 2) ** (1 / g)
    assert np.median(e) == pytest.approx(median, rel=0.02)


def test_bundles_redraw_the_files_physics_for_read_back_primaries(other_physics, tmp_path):
    """bundles() on the primaries read back from a written file (float32) draws the same
    physics as the file: same muons per row and muon energies within their errors, and a
    different draw than the file's own."""
    expected, _ = other_physics.generate(20000, np.random.default_rng([7, 0]), 0, 1e4, 1.0)
    cond = expected.conditions.numpy()
    again = other_physics.bundles(cond, np.random.default_rng(8))
    np.testing.assert_array_equal(again.conditions.numpy(), cond)
    n0, n1 = expected.counts.numpy(), again.counts.numpy()
    assert not np.array_equal(n0, n1)
    # NB(2) x Poisson rows: the mean's error is ~ std / sqrt(rows)
    err = np.hypot(n0.std(), n1.std()) / np.sqrt(len(n0))
    assert abs(n0.mean() - n1.mean()) < 4 * err
    assert np.mean(n0 > 0) == pytest.approx(np.mean(n1 > 0), abs=0.02)
    e0, e1 = (np.log10(b.muons[:, 0].numpy()) for b in (expected, again))
    assert e1.min() >= 0.0
    np.testing.assert_allclose(
        np.quantile(e1, [0.1, 0.5, 0.9]), np.quantile(e0, [0.1, 0.5, 0.9]), atol=0.05
    )


@pytest.mark.parametrize("physics", ["other", "synth"])
def test_perfect_candidate_scores_at_the_floor(
    other_physics, load_script, tmp_path, capsys, physics
):
    """benchmarks/perfect_candidate.py scores a physics itself on a held-out file of it
    (other_physics.py's, or muongen synth's rich mix): its median ratio to the floor is ~1
    and it writes evaluate's metrics.json and report.md."""
    import json

    from muongen import schema
    from muongen.data import synth
    from muongen.data.writers import write_events

    if physics == "other":
        batch, ids = other_physics.generate(6000, np.random.default_rng([3, 0]), 0, 1e4, 1.0)
        write_events(tmp_path / "held" / "0000000.parquet", batch, schema.FORMAT_V1, ids=ids)
    else:
        synth.write_synthetic(tmp_path / "held", files=1, events_per_file=6000, seed=3, mix="rich")
    module = load_script("benchmarks/perfect_candidate.py")
    out = tmp_path / "ev"
    argv = ["--physics", physics, "--data", str(tmp_path / "held"), "--out", str(out)]
    assert module.main([*argv, "--n-splits", "4"]) == 0
    result = json.loads((out / "metrics.json").read_text())
    assert 0.7 < result["summary"]["median_ratio"] < 1.3
    assert result["split"]["model_draws"] == "per split"
    assert (out / "report.md").read_text().startswith("# muongen evaluation")
    assert "perfect generator over 1 seed(s): median" in capsys.readouterr().out
