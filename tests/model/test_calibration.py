"""train.calibrate_rows's maps (muongen.model.calibration): fitted on a biased draw each
brings fresh draws back to the data's quantiles, class by class, keeps every muon's rank
in its class; the energy map holds muons under E0 / A, the radius map keeps each muon's
direction from the axis; the generator applies them where they are attached."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from muongen.data.batch import RaggedBatch
from muongen.model import build_models
from muongen.model.calibration import (
    RADIUS_STATE_VERSION,
    STATE_VERSION,
    EnergyCalibration,
    RadiusCalibration,
    fit,
    fit_radius,
    muon_classes,
)
from muongen.model.normaliser import fit_normalisers, per_nucleon_energy

from .conftest import seeded_draw, small_model_config


def _sample(rng, n_events: int, biased: bool):
    """(log10 E0 (B,), log10 E (N,), counts (B,)) in feature units: bundles of 1, 5, 30
    and 150 muons; ``biased``: the 5-muon bundles 0.2 dex high and the 30-muon ones
    stretched 1.5x about their middle."""
    counts = rng.choice([1, 5, 30, 150], size=n_events, p=[0.4, 0.3, 0.2, 0.1])
    log_e0 = rng.uniform(-2.0, 2.0, n_events)
    size = np.repeat(counts, counts)
    log_e = rng.normal(-3.0, 0.5, counts.sum()) + 0.1 * np.repeat(log_e0, counts)
    if biased:
        log_e = np.where(size == 5, log_e + 0.2, log_e)
        log_e = np.where(size == 30, -3.0 + 1.5 * (log_e + 3.0), log_e)
    return log_e0, log_e, counts


def _apply(cal, sample, ceiling_dex: float = 10.0, depth=None):
    log_e0, log_e, counts = sample[:3]
    e0 = torch.as_tensor(np.repeat(log_e0, counts))
    depth = torch.as_tensor(np.repeat(sample[3] if len(sample) > 3 else 0.0 * log_e0, counts))
    n = torch.as_tensor(np.repeat(counts, counts))
    return cal.double()(torch.as_tensor(log_e), n, e0, depth, e0 + ceiling_dex).numpy()


def test_the_map_brings_fresh_draws_to_the_data_class_by_class():
    rng = np.random.default_rng(0)
    cal = EnergyCalibration(fit(_sample(rng, 8000, False), _sample(rng, 8000, True)))
    fresh, truth = _sample(rng, 8000, True), _sample(rng, 8000, False)
    got = _apply(cal, fresh)
    size, want_size = np.repeat(fresh[2], fresh[2]), np.repeat(truth[2], truth[2])
    q = [0.05, 0.25, 0.5, 0.75, 0.95]
    for n in (1, 5, 30, 150):
        ref = np.quantile(truth[1][want_size == n], q)
        np.testing.assert_allclose(np.quantile(got[size == n], q), ref, atol=0.04)
        if n in (5, 30):  # the bias was there to undo
            assert np.abs(np.quantile(fresh[1][size == n], q) - ref).max() > 0.15
    # monotone within a class: every muon keeps its rank among its class's muons
    cls = muon_classes(
        torch.as_tensor(size), torch.as_tensor(np.repeat(fresh[0], fresh[2])), cal.e0_edges
    ).numpy()
    for c in np.unique(cls):
        sel = cls == c
        order = np.argsort(fresh[1][sel], kind="stable")
        assert (np.diff(got[sel][order]) >= -1e-9).all()


def test_depth_classes_undo_a_bias_of_the_deep_bundles_alone():
    """With n_depth_bins=2 the deep half's own bias (0.3 dex high) is undone and the
    shallow half left where it was; one depth class can only split the difference."""
    rng = np.random.default_rng(4)

    def sample(n_events, biased):
        log_e0, log_e, counts = _sample(rng, n_events, False)
        depth = rng.uniform(1.0, 2.8, n_events)
        deep = np.repeat(depth > 1.9, counts)
        return log_e0, log_e + 0.3 * (biased & deep), counts, depth

    fresh, truth = sample(8000, True), sample(8000, False)
    deep = np.repeat(fresh[3] > 1.9, fresh[2])
    truth_deep = np.repeat(truth[3] > 1.9, truth[2])
    for bins, tolerance in ((2, 0.03), (1, None)):
        cal = EnergyCalibration(fit(sample(8000, False), sample(8000, True), n_depth_bins=bins))
        got = _apply(cal, fresh)
        shift_deep = np.median(got[deep]) - np.median(truth[1][truth_deep])
        shift_shallow = np.median(got[~deep]) - np.median(truth[1][~truth_deep])
        if tolerance:
            assert abs(shift_deep) < tolerance and abs(shift_shallow) < tolerance
            assert cal.depth_edges.numel() == 1 and cal.fitted.numel() == 32
        else:  # one class for both halves: the deep half stays high, the shallow one goes low
            assert shift_deep > 0.08 and shift_shallow < -0.08


def test_the_ceiling_holds_and_unmapped_classes_are_left_as_drawn():
    rng = np.random.default_rng(1)
    data, model = _sample(rng, 6000, False), _sample(rng, 6000, True)
    # no bundles of 150 in the draw fitted on: their classes are not mapped
    keep = model[2] != 150
    model = (model[0][keep], model[1][np.repeat(keep, model[2])], model[2][keep])
    state = fit(data, model)
    cal = EnergyCalibration(state)
    assert not state["fitted"][-4:].any() and state["fitted"][4:12].all()
    fresh = _sample(rng, 3000, True)
    got = _apply(cal, fresh)
    big = np.repeat(fresh[2], fresh[2]) == 150
    np.testing.assert_allclose(got[big], fresh[1][big])
    capped = _apply(cal, fresh, ceiling_dex=-5.0)  # E0 / A 5 dex under E0: many over it
    ceiling = np.repeat(fresh[0], fresh[2]) - 5.0
    assert (capped <= ceiling + 1e-12).all() and (got > ceiling).mean() > 0.2


def test_a_calibration_of_another_version_or_shape_is_refused():
    rng = np.random.default_rng(2)
    state = fit(_sample(rng, 3000, False), _sample(rng, 3000, True))
    with pytest.raises(ValueError, match="version 99; this muongen reads"):
        EnergyCalibration({**state, "version": 99})
    with pytest.raises(ValueError, match="table of shape"):
        EnergyCalibration({**state, "table": state["table"][:5]})
    assert state["version"] == STATE_VERSION
    text = EnergyCalibration(state).describe()
    # per energy quartile ~300 single muons and ~1100 in 5-muon bundles: under MIN_MUONS
    assert text.startswith("8 of 16 classes mapped, fitted on 3,000 training rows")
    assert text.endswith(f"({state['muons']:,} muons)")


def test_the_generator_applies_an_attached_calibration_after_the_fold(ragged):
    cfg = small_model_config(energy_fold=True, energy_reference="per_nucleon")
    torch.manual_seed(0)
    gen, critic = build_models(cfg)
    cond, muons, counts = ragged(b=3000, seed=1, max_count=40, empty=0.1)
    fit_normalisers(gen, critic, RaggedBatch(cond, muons, counts))
    plain = seeded_draw(gen, cond, counts)
    rng = np.random.default_rng(3)
    log_e0 = cond[:, 0].double().numpy()
    model = (log_e0, plain[:, 0].double().numpy(), counts.numpy())
    data = (log_e0, model[1] - 0.3 + 0.05 * rng.standard_normal(len(model[1])), counts.numpy())
    gen.energy_calibration = EnergyCalibration(fit(data, model))
    assert gen.energy_calibration.fitted[8:12].all()  # the 10-99-muon bundles: most muons
    got = seeded_draw(gen, cond, counts)
    n = int(counts.sum())
    want = gen.energy_calibration(
        plain[:, 0],
        torch.repeat_interleave(counts, counts, output_size=n),
        torch.repeat_interleave(cond[:, 0], counts, output_size=n),
        torch.repeat_interleave(cond[:, 3], counts, output_size=n),
        torch.repeat_interleave(per_nucleon_energy(cond), counts, output_size=n),
    )
    torch.testing.assert_close(got[:, 0], want)
    torch.testing.assert_close(got[:, 1:], plain[:, 1:])  # positions as drawn
    assert (got[:, 0] - plain[:, 0]).mean() < -0.2  # the map moved them, as fitted


def _radial_sample(rng, n_events: int, biased: bool):
    """(cos z (B,), log10 r (N,), counts (B,), log10 E0 (B,)): radii that grow with
    inclination; ``biased``: the inclined half's 5-muon bundles 0.25 dex too far out and
    its 30-muon ones squeezed 0.6x about their middle."""
    counts = rng.choice([1, 5, 30, 150], size=n_events, p=[0.4, 0.3, 0.2, 0.1])
    cos_z = rng.uniform(0.2, 1.0, n_events)
    log_e0 = rng.uniform(-2.0, 2.0, n_events)
    size, cz = np.repeat(counts, counts), np.repeat(cos_z, counts)
    log_r = rng.normal(1.2, 0.4, counts.sum()) - 0.5 * cz
    if biased:
        inclined = cz < 0.6
        log_r = np.where(inclined & (size == 5), log_r + 0.25, log_r)
        log_r = np.where(inclined & (size == 30), 0.9 + 0.6 * (log_r - 0.9), log_r)
    return cos_z, log_r, counts, log_e0


def _apply_radius(cal, sample, phi):
    cos_z, log_r, counts, log_e0 = sample
    r = 10.0**log_r
    cond = torch.zeros(len(counts), 4, dtype=torch.float64)
    cond[:, 0], cond[:, 1] = torch.as_tensor(log_e0), torch.as_tensor(cos_z)
    n = torch.as_tensor(np.repeat(counts, counts))
    per_muon = torch.repeat_interleave(cond, torch.as_tensor(counts), dim=0)
    x, y = torch.as_tensor(r * np.cos(phi)), torch.as_tensor(r * np.sin(phi))
    x, y = cal.double()(x, y, n, per_muon)
    return x.numpy(), y.numpy()


def test_the_radius_map_brings_fresh_draws_to_the_data_and_keeps_directions():
    rng = np.random.default_rng(5)
    state = fit_radius(_radial_sample(rng, 20000, False), _radial_sample(rng, 20000, True))
    cal = RadiusCalibration(state)
    assert state["version"] == RADIUS_STATE_VERSION and state["fitted"][4:12].all()
    truth, fresh = _radial_sample(rng, 20000, False), _radial_sample(rng, 20000, True)
    phi = rng.uniform(-np.pi, np.pi, len(fresh[1]))
    x, y = _apply_radius(cal, fresh, phi)
    got = np.log10(np.hypot(x, y))
    np.testing.assert_allclose(np.arctan2(y, x), phi, atol=1e-9)  # each muon's direction
    size, want_size = np.repeat(fresh[2], fresh[2]), np.repeat(truth[2], truth[2])
    cz, want_cz = np.repeat(fresh[0], fresh[2]), np.repeat(truth[0], truth[2])
    q = [0.05, 0.25, 0.5, 0.75, 0.95]
    for n in (5, 30):
        for lo, hi in ((0.2, 0.4), (0.8, 1.0)):  # the inclined quartile and the vertical one
            sel, ref_sel = (
                (size == n) & (cz >= lo) & (cz < hi),
                (want_size == n) & (want_cz >= lo) & (want_cz < hi),
            )
            ref = np.quantile(truth[1][ref_sel], q)
            np.testing.assert_allclose(np.quantile(got[sel], q), ref, atol=0.05)
            if lo == 0.2:  # the bias was there to undo
                assert np.abs(np.quantile(fresh[1][sel], q) - ref).max() > 0.1


def test_the_radius_map_leaves_a_muon_on_the_axis_and_refuses_another_version():
    rng = np.random.default_rng(6)
    data, model = _radial_sample(rng, 3000, False), _radial_sample(rng, 3000, True)
    on_axis = model[1].copy()
    on_axis[:50] = -np.inf  # r = 0: left out of the fit
    state = fit_radius(data, (model[0], on_axis, model[2], model[3]))
    cal = RadiusCalibration(state)
    x, y = _apply_radius(cal, (model[0], on_axis, model[2], model[3]), np.zeros(len(on_axis)))
    assert (x[:50] == 0).all() and (y[:50] == 0).all() and np.isfinite(x).all()
    with pytest.raises(ValueError, match="radius calibration of version 7; this muongen"):
        RadiusCalibration({**state, "version": 7})
    with pytest.raises(ValueError, match="radius calibration table of shape"):
        RadiusCalibration({**state, "table": state["table"][:3]})
    by_energy = fit_radius(data, model, n_zenith_bins=2, n_energy_bins=2)
    assert RadiusCalibration(by_energy).fitted.numel() == 16  # 4 sizes x 2 x 2


@pytest.mark.parametrize("lateral_head", ["polar", "xy"])
def test_the_generator_applies_an_attached_radius_map_last(ragged, lateral_head):
    cfg = small_model_config(lateral_head=lateral_head)
    torch.manual_seed(0)
    gen, critic = build_models(cfg)
    cond, muons, counts = ragged(b=3000, seed=2, max_count=40, empty=0.1)
    fit_normalisers(gen, critic, RaggedBatch(cond, muons, counts))
    plain = seeded_draw(gen, cond, counts)
    n = int(counts.sum())
    log_r = torch.log10(torch.hypot(plain[:, 1], plain[:, 2])).double().numpy()
    rng = np.random.default_rng(4)
    model = (cond[:, 1].double().numpy(), log_r, counts.numpy(), cond[:, 0].double().numpy())
    data = (model[0], log_r + 0.3 + 0.05 * rng.standard_normal(n), model[2], model[3])
    gen.radius_calibration = RadiusCalibration(fit_radius(data, model))
    got = seeded_draw(gen, cond, counts)
    want = gen.radius_calibration(
        plain[:, 1],
        plain[:, 2],
        torch.repeat_interleave(counts, counts, output_size=n),
        torch.repeat_interleave(cond, counts, dim=0, output_size=n),
    )
    torch.testing.assert_close(got[:, 0], plain[:, 0])  # energies as drawn
    torch.testing.assert_close(got[:, 1], want[0])
    torch.testing.assert_close(got[:, 2], want[1])
    moved = torch.log10(torch.hypot(got[:, 1], got[:, 2])).double().numpy() - log_r
    assert moved.mean() > 0.2  # the map moved them out, as fitted
