"""Flux-weighted primaries: the weights reproduce the flux model's rate (known answers)."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from scipy import integrate

from muongen.cli import main
from muongen.errors import ConfigError
from muongen.evaluate import plots
from muongen.evaluate.flux import FluxWeighter, Generation, binned_rate, integral_rate
from muongen.evaluate.sample import read_weights

ZENITH = (0.0, math.radians(85.0))


@pytest.fixture(scope="module")
def h3a():
    """The H3a weighter (crflux), built once: the module's tests only read it."""
    return FluxWeighter("H3a")


def _quad_rate(model, lo: float, hi: float, omega: float) -> float:
    """Independent reference: scipy quad over crflux's all-particle flux in E (not ln E)."""
    # split per decade: quad over 5 decades of a steep power law in one piece is inaccurate
    edges = np.geomspace(lo, hi, int(np.ceil(np.log10(hi / lo))) + 1)
    total = 0.0
    for a, b in itertools.pairwise(edges):
        value, _ = integrate.quad(lambda e: float(model.total_flux(e)[0]), a, b, epsrel=1e-8)
        total += value
    return total * omega


def test_weights_sum_to_the_models_integral_rate(h3a):
    gen = Generation(20000, energy_gev=(1e4, 1e9), zenith_rad=ZENITH)
    sample = h3a.sample(gen, seed=3)
    omega = 2 * math.pi * (1 - math.cos(ZENITH[1]))
    reference = _quad_rate(h3a.model, 1e4, 1e9, omega)
    assert integral_rate(h3a, gen.energy_gev, ZENITH) == pytest.approx(reference, rel=1e-4)
    err = math.sqrt((sample.weight**2).sum())
    assert abs(sample.weight.sum() - reference) < 4 * err
    assert err / reference < 0.02  # and the test has the power to see a 10% error
    assert sample.info["weight_units"] == "1/(m^2 s)" and sample.info["area"] == "perpendicular"


def test_weighted_energy_spectrum_matches_the_model_per_bin(h3a):
    gen = Generation(25000, energy_gev=(1e4, 1e8), zenith_rad=ZENITH, gamma=1.5)
    sample = h3a.sample(gen, seed=5)
    edges = np.geomspace(1e4, 1e8, 5)
    got, _ = np.histogram(sample.energy, edges, weights=sample.weight)
    err = np.sqrt(np.histogram(sample.energy, edges, weights=sample.weight**2)[0])
    omega = 2 * math.pi * (1 - math.cos(ZENITH[1]))
    want = np.array([_quad_rate(h3a.model, a, b, omega) for a, b in itertools.pairwise(edges)])
    np.testing.assert_allclose(binned_rate(h3a, edges, ZENITH), want, rtol=1e-4)
    pulls = (got - want) / err
    assert np.all(np.abs(pulls) < 4), pulls


def test_horizontal_area_weights_carry_cos_zenith(h3a):
    gen = Generation(20000, energy_gev=(1e4, 1e6), zenith_rad=ZENITH)
    perp = h3a.sample(gen, seed=1)
    horiz = h3a.sample(gen, seed=1, area="horizontal")
    np.testing.assert_allclose(horiz.weight, perp.weight * np.cos(perp.zenith))
    want = integral_rate(h3a, gen.energy_gev, ZENITH, area="horizontal")
    err = math.sqrt((horiz.weight**2).sum())
    assert abs(horiz.weight.sum() - want) < 4 * err


def test_mass_groups_hold_every_element_once():
    gst = FluxWeighter("GST")
    flat = sorted(i for g in gst.groups for i in g)
    assert flat == sorted(gst.model.nucleus_ids)
    assert gst.groups[2] == [1206, 1608]  # C and O go to A = 14
    assert gst.groups[3] == []  # GST has nothing near Al: those showers weigh 0
    gen = Generation(500, energy_gev=(1e4, 1e6))
    sample = gst.sample(gen)
    assert np.all(sample.weight[sample.mass == 27] == 0)
    assert np.all(sample.weight[sample.mass != 27] > 0)


def test_generation_is_checked():
    with pytest.raises(ConfigError, match="--energy"):
        Generation(100, energy_gev=(1e6, 1e4))
    with pytest.raises(ConfigError, match="--zenith"):
        Generation(100, zenith_rad=(0.0, 2.0))
    with pytest.raises(ConfigError, match="unknown flux model"):
        FluxWeighter("H5z")


def test_sample_flux_cli_writes_weights_and_report(tmp_path, tiny_checkpoint, capsys):
    out = tmp_path / "flux.parquet"
    code = main(
        [
            "sample",
            "--checkpoint",
            str(tiny_checkpoint),
            "--flux",
            "H3a",
            "--showers",
            "400",
            "--energy",
            "1e5:1e7",
            "--depths",
            "1500,2500",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "model integral" in printed and "depth 1500 m" in printed
    weights = read_weights(str(out))
    assert weights.shape == (800,)  # 400 showers x 2 depths
    np.testing.assert_array_equal(weights[0::2], weights[1::2])  # one weight per shower
    info = json.loads((tmp_path / "flux-report" / "flux.json").read_text())
    rates = info["rates"]
    assert rates["sample_rate"] == pytest.approx(weights[0::2].sum())
    assert abs(rates["pull"]) < 5
    assert [d["depth_m"] for d in rates["by_depth"]] == [1500.0, 2500.0]
    for name in ("primary_energy.png", "multiplicity_1500m.png"):
        assert (tmp_path / "flux-report" / name).stat().st_size > 5000
    # the figures' footer (and flux.json) name the checkpoint, its step and the sample
    assert info["provenance"].startswith(f"checkpoint {plots._short_path(tiny_checkpoint)}")
    assert " · step 7 · data H3a flux, 400 showers, seed 0 · " in info["provenance"]
    # the file still reads as production events, weights and all
    from muongen.evaluate.sample import read_inputs

    batch = read_inputs([str(out)])
    assert batch.n_events == 800
    np.testing.assert_allclose(batch.conditions[:2, 3].numpy(), [1500.0, 2500.0])
