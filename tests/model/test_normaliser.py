"""The standardisers inside the models: round trip, fitting, and travel in the state_dict."""

from __future__ import annotations

import torch

from muongen.data.batch import RaggedBatch
from muongen.model import build_models
from muongen.model.normaliser import Standardiser, fit_normalisers, normalisers_fitted

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
    # the critic sees standardised muons; the generator's output is un-standardised
    torch.testing.assert_close(critic.muon_norm(batch.muons).std(0, correction=0), torch.ones(3))

    fresh, _ = build_models(cfg)
    fresh.load_state_dict(gen.state_dict())  # strict: the buffers are in the state_dict
    assert normalisers_fitted(fresh)
    torch.testing.assert_close(fresh.muon_norm.mean, gen.muon_norm.mean)
