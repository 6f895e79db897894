"""benchmarks/other_physics.py: the cross-check physics writes files muongen reads, and its
lateral sampler draws the parametrised density it claims."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from muongen.data.reader import read_events

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "other_physics.py"


@pytest.fixture(scope="module")
def other_physics():
    spec = importlib.util.spec_from_file_location("other_physics", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
