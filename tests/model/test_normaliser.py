"""The standardisers inside the models: round trip, fitting, and travel in the state_dict."""

from __future__ import annotations

import pytest
import torch

from muongen import schema
from muongen.data.batch import RaggedBatch
from muongen.model import build_models
from muongen.model.normaliser import (
    SLANT_MIN_COS,
    ConditionStandardiser,
    Standardiser,
    fit_normalisers,
    normalisers_fitted,
)

from .conftest import small_model_config


def test_round_trip_linear_and_log_features():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(500, 3, generator=gen, dtype=torch.float64) * torch.tensor([1.0, 0.01, 3.0])
    x[:, 1] = x[:, 1].abs() + 1e-3  # a positive feature, standardised in log space
    norm = Standardiser(3, log_features=(1,)).double()
    assert torch.equal(norm(x), torch.where(torch.tensor([False, True, False]), x.log(), x))
    norm.fit(x)
    z = norm(x)
    torch.testing.assert_close(z.mean(0), torch.zeros(3, dtype=torch.float64))
    torch.testing.assert_close(z.std(0, correction=0), torch.ones(3, dtype=torch.float64))
    torch.testing.assert_close(norm.inverse(z), x)
    assert (norm.inverse(torch.full((4, 3), -50.0, dtype=torch.float64))[:, 1] > 0).all()


def test_constant_feature_keeps_unit_std():
    norm = Standardiser(2)
    norm.fit(torch.tensor([[1.0, 5.0], [3.0, 5.0]]))
    assert norm.std.tolist() == [1.0, 1.0] and norm.mean.tolist() == [2.0, 5.0]
    assert bool(norm.fitted)


def test_fit_normalisers_shares_stats_and_travels_in_the_state_dict(ragged):
    torch.manual_seed(0)
    cfg = small_model_config()
    gen, critic = build_models(cfg)
    assert not normalisers_fitted(gen) and not normalisers_fitted(critic)
    cond, muons, counts = ragged(b=40, seed=3)
    batch = RaggedBatch(cond * 3 + 1, muons * 0.01, counts, None)
    fit_normalisers(gen, critic, batch)
    assert normalisers_fitted(gen) and normalisers_fitted(critic)
    torch.testing.assert_close(gen.muon_norm.std, critic.muon_norm.std)
    torch.testing.assert_close(gen.cond_norm.mean, (cond * 3 + 1).mean(0))
    # the critic sees standardised muons (x, y centred at 0: unit root mean square)
    z = critic.muon_norm(batch.muons)
    torch.testing.assert_close(z.square().mean(0)[1:], torch.ones(2))
    torch.testing.assert_close(z[:, 0].std(correction=0), torch.tensor(1.0))

    fresh, _ = build_models(cfg)
    fresh.load_state_dict(gen.state_dict())  # strict: the buffers are in the state_dict
    assert normalisers_fitted(fresh)
    torch.testing.assert_close(fresh.muon_norm.mean, gen.muon_norm.mean)
    torch.testing.assert_close(fresh.muon_norm.scale, gen.muon_norm.scale)


def test_the_slant_depth_is_depth_over_cos_zenith_standardised_with_the_rest():
    # physical conditions [E, zenith, A, depth]; one row beyond SLANT_MIN_COS (89 degrees)
    physical = torch.tensor(
        [[1e5, 0.0, 1.0, 1450.0], [1e7, 1.2, 56.0, 2450.0], [1e6, 1.553, 4.0, 2000.0]],
        dtype=torch.float64,
    )
    cond = schema.condition_features(physical)
    norm = ConditionStandardiser(slant=True).double()
    slant_km = physical[:, 3] / 1000 / torch.cos(physical[:, 1]).clamp(min=SLANT_MIN_COS)
    torch.testing.assert_close(norm(cond), torch.cat([cond, slant_km[:, None]], 1))
    assert slant_km[1] == pytest.approx(2.45 / 0.36236, rel=1e-4)  # 6.8 km at 69 degrees
    norm.fit(cond)
    z = norm(cond)
    assert z.shape == (3, 5)
    torch.testing.assert_close(z.mean(0), torch.zeros(5, dtype=torch.float64))
    torch.testing.assert_close(z[:, 4], (slant_km - slant_km.mean()) / slant_km.std(correction=0))
    # without it: the four features and the plain standardiser's buffers (old checkpoints)
    plain = ConditionStandardiser(slant=False)
    assert plain(cond.float()).shape == (3, 4)
    assert {k: v.shape for k, v in plain.state_dict().items()} == {
        k: v.shape for k, v in Standardiser(4).state_dict().items()
    }


def test_models_with_the_slant_depth_fit_and_use_five_condition_features(ragged):
    torch.manual_seed(0)
    gen, critic = build_models(small_model_config(slant_depth=True, multiplicity="hurdle"))
    cond, muons, counts = ragged(b=40, seed=3)
    cond[:, 1] = cond[:, 1].abs().clamp(0.1, 1.0)  # cos(zenith) of an atmospheric shower
    fit_normalisers(gen, critic, RaggedBatch(cond, muons * 0.01, counts, None))
    for model in (gen, critic):
        assert model.cond_norm.mean.shape == (5,)
        torch.testing.assert_close(
            model.cond_norm.mean[4], (cond[:, 3] / cond[:, 1]).double().mean().float()
        )
    feat, n, _ = gen(cond)
    assert feat.shape[0] == int(n.sum())
    assert critic(feat, cond, n).shape == (40,)
    # the fifth column is read, not only fitted: moving its standardisation moves the
    # critic's scores and the generator's counts
    with torch.no_grad():
        scores = critic(muons, cond, counts)
        params = gen.multiplicity.params(gen.cond_norm(cond))
        for model in (gen, critic):
            model.cond_norm.mean[4] += 3.0
        assert not torch.allclose(critic(muons, cond, counts), scores)
        assert not torch.allclose(gen.multiplicity.params(gen.cond_norm(cond))[0], params[0])


def _heavy_tailed_lateral(n: int = 4000, seed: int = 0) -> torch.Tensor:
    """[log E, x, y] with Laplace-like x and y (heavy tails, as muon bundles have)."""
    gen = torch.Generator().manual_seed(seed)
    log_e = torch.randn(n, generator=gen, dtype=torch.float64)
    r = -0.01 * torch.log(torch.rand(n, generator=gen, dtype=torch.float64))  # exp tail
    phi = 2 * torch.pi * torch.rand(n, generator=gen, dtype=torch.float64)
    return torch.stack([log_e, r * torch.cos(phi), r * torch.sin(phi)], dim=1)


def test_asinh_centred_round_trip_and_fitted_stats():
    x = _heavy_tailed_lateral()
    norm = Standardiser(3, asinh_features=(1, 2), centred_features=(1, 2)).double()
    norm.fit(x)
    torch.testing.assert_close(norm.scale[1:], x[:, 1:].abs().median(0).values)
    assert norm.mean[1:].tolist() == [0.0, 0.0]  # fixed, not fitted
    z = norm(x)
    torch.testing.assert_close(z.square().mean(0)[1:], torch.ones(2, dtype=torch.float64))
    torch.testing.assert_close(z[:, 0].mean(), torch.tensor(0.0, dtype=torch.float64))
    torch.testing.assert_close(norm.inverse(z), x)  # exact round trip, tails included
    # asinh compresses the tails: the standardised max is a few units, not tens
    assert z[:, 1:].abs().max() < 4 < (x[:, 1:].abs().max() / x[:, 1:].std())
    # a runaway generator output is clamped short of sinh overflow, sign kept
    far = norm.inverse(torch.tensor([[0.0, 1e4, -1e4]], dtype=torch.float64))
    assert torch.isfinite(far).all() and far[0, 1] > 0 > far[0, 2]
    assert far[0, 1] < 20 * x[:, 1].abs().max()


def test_unfitted_asinh_is_invertible_and_float32_safe():
    norm = Standardiser(3, asinh_features=(1, 2))
    x = torch.tensor([[0.5, -1e-3, 2.0], [1.0, 0.3, -40.0]])
    torch.testing.assert_close(norm.inverse(norm(x)), x)
    assert torch.isfinite(norm.inverse(torch.full((2, 3), 1e6))).all()


def test_model_config_selects_the_lateral_treatment():
    cfg = small_model_config()
    gen, critic = build_models(cfg)
    for model in (gen, critic):  # default: linear, centred
        assert model.muon_norm.asinh_features == ()
        assert model.muon_norm.centred_features == (1, 2)
    cfg.lateral_transform, cfg.lateral_centred = "asinh", False
    gen, critic = build_models(cfg)
    assert gen.muon_norm.asinh_features == (1, 2) == critic.muon_norm.asinh_features
    assert gen.muon_norm.centred_features == ()
    cfg.representation = "radial"
    gen, _ = build_models(cfg)
    assert gen.muon_norm.log_features == (1,) and gen.muon_norm.asinh_features == ()


def test_generator_rotates_each_bundle_rigidly():
    """lateral_rotate turns every event's bundle by one random azimuth: per-muon radii
    and energies are what the unrotated generator makes, x and y lose any offset."""
    torch.manual_seed(0)
    gen, _ = build_models(small_model_config(lateral_rotate=True))
    plain, _ = build_models(small_model_config(lateral_rotate=False))
    plain.load_state_dict(gen.state_dict())
    with torch.no_grad():
        gen.local_net[-1].bias[1:] += 0.5  # a location offset in x and y
        plain.local_net[-1].bias[1:] += 0.5
    cond = torch.randn(300, 4)
    counts = torch.full((300,), 5)
    rotated = gen.generate_with_counts(cond, counts, generator=torch.Generator().manual_seed(1))
    fixed = plain.generate_with_counts(cond, counts, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(rotated[:, 0], fixed[:, 0])
    torch.testing.assert_close(rotated[:, 1:].norm(dim=1), fixed[:, 1:].norm(dim=1))
    # the same turn for all muons of one event: pairwise distances kept
    d_rot = torch.cdist(rotated[:5, 1:], rotated[:5, 1:])
    torch.testing.assert_close(d_rot, torch.cdist(fixed[:5, 1:], fixed[:5, 1:]))
    assert fixed[:, 1:].mean(0).abs().min() > 5 * rotated[:, 1:].mean(0).abs().max()
