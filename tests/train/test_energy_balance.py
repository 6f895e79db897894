"""optim.energy_balance: each event's weight flattens the batch's primary spectrum."""

from __future__ import annotations

import math

import pytest
import torch

from muongen.config import Config, OptimConfig, TrainConfig, validate
from muongen.data.batch import RaggedBatch
from muongen.errors import ConfigError
from muongen.train.energy_balance import BIN_DEX, balance, energy_bins, raw_factors
from muongen.train.step import GanStep

from .test_step import small_models


def features(log10_e0: list[float]) -> torch.Tensor:
    """Condition features (B, 4) of primaries at these log10 E0 / GeV."""
    cond = torch.zeros(len(log10_e0), 4)
    cond[:, 0] = torch.tensor(log10_e0) - 6.0  # log10(E / 1e6 GeV)
    cond[:, 1], cond[:, 3] = 0.8, 1.5
    return cond


def skewed_batch(seed: int = 0) -> RaggedBatch:
    """90 events at 10^5.2 GeV with 1-3 muons, 10 at 10^7.3 GeV with 20-40 and 5 empty
    ones there."""
    gen = torch.Generator().manual_seed(seed)
    low = torch.randint(1, 4, (90,), generator=gen)
    high = torch.randint(20, 41, (10,), generator=gen)
    counts = torch.cat([low, high, torch.zeros(5, dtype=torch.int64)])
    cond = features([5.2] * 90 + [7.3] * 15)
    muons = torch.randn(int(counts.sum()), 3, generator=gen) * 0.3
    return RaggedBatch(cond, muons, counts)


def test_the_bins_are_half_decades_of_the_primary_energy():
    bins = energy_bins(features([5.2, 5.49, 5.51, 7.3, -3.0, 15.0]))
    assert bins.tolist() == [10, 10, 11, 14, 0, 23]
    assert BIN_DEX == 0.5


def test_the_factors_flatten_the_events_with_muons():
    batch = skewed_batch()
    r = raw_factors(batch.conditions, batch.counts, 1.0, 100.0)
    assert torch.all(r[:90] == 1.0)
    torch.testing.assert_close(r[90:100], torch.full((10,), 9.0))  # 90 / 10, empties not counted
    assert torch.all(r[100:] == 0.0)  # events without muons weigh nothing
    assert raw_factors(batch.conditions, batch.counts, 0.5, 100.0)[95] == pytest.approx(3.0)
    assert raw_factors(batch.conditions, batch.counts, 1.0, 4.0)[95] == pytest.approx(4.0)
    assert torch.all(raw_factors(batch.conditions, batch.counts, 0.0, 4.0)[:100] == 1.0)


def test_the_factors_keep_the_totals():
    batch = skewed_batch(1)
    terms = torch.log1p(batch.counts.float())
    events, muons = balance(batch.conditions, batch.counts, terms, 1.0, 10.0)
    assert float((terms * events).sum()) == pytest.approx(float(terms.sum()), rel=1e-6)
    c = batch.counts.float()
    assert float((c * muons).sum()) == pytest.approx(float(c.sum()), rel=1e-6)
    # the top bin's 10 events now weigh as much as the bottom bin's 90
    low, high = (terms * events)[:90].sum(), (terms * events)[90:].sum()
    r = raw_factors(batch.conditions, batch.counts, 1.0, 10.0)
    assert float(high / low) == pytest.approx(
        float((terms * r)[90:].sum() / (terms * r)[:90].sum()), rel=1e-6
    )
    assert float(r[95] / r[0]) == 9.0


@pytest.mark.parametrize("event_weight", ["none", "log"])
def test_the_step_weighs_both_critics_by_the_factors(event_weight):
    """The scored events' WGAN weights are the event weights times the event factors (sum
    kept), and each real muon's per-muon weight is its event's muon factor (mean 1 over the
    batch's muons)."""
    gen, critic = small_models(muon_critic=[8])
    batch = skewed_batch(2)
    ocfg = OptimConfig(n_critic=1, event_weight=event_weight, energy_balance=1.0)
    step = GanStep(gen, critic, ocfg, TrainConfig(step_shards=1), "cpu")
    ((mb, _),) = step._shard_work([batch])[0]
    assert mb.counts.shape[0] == 100  # the empty events are not scored
    terms = torch.log1p(mb.counts.float()) if event_weight == "log" else torch.ones(100)
    total = 105.0 if event_weight == "log" else 100.0  # log: mean 1 over all B events
    torch.testing.assert_close(mb.weight.sum(), torch.tensor(total))
    ratio = mb.weight / terms
    torch.testing.assert_close(ratio[90:], ratio[95].expand(10))
    assert float(ratio[95] / ratio[0]) == pytest.approx(9.0, rel=1e-5)
    assert mb.muon_weight.shape == (batch.n_muons,)
    assert float(mb.muon_weight.mean()) == pytest.approx(1.0, rel=1e-5)
    first_high = int(batch.counts[:90].sum())
    assert float(mb.muon_weight[first_high] / mb.muon_weight[0]) == pytest.approx(9.0, rel=1e-5)
    out = step([batch])
    assert int(out["skipped"]) == 0 and math.isfinite(float(out["c_loss"]))

    plain = GanStep(
        gen, critic, OptimConfig(n_critic=1, event_weight=event_weight), TrainConfig(), "cpu"
    )
    ((mb0, _),) = plain._shard_work([batch])[0]
    assert mb0.muon_weight is None
    assert (mb0.weight is None) == (event_weight == "none")


def test_energy_balance_needs_the_real_counts_and_sane_values():
    gen, critic = small_models()
    with pytest.raises(ConfigError, match=r"energy_balance.*fake_counts=real"):
        GanStep(
            gen,
            critic,
            OptimConfig(energy_balance=1.0),
            TrainConfig(fake_counts="predicted"),
            "cpu",
        )
    for key, value in (("energy_balance", -1.0), ("energy_balance_max", 0.5)):
        cfg = Config()
        setattr(cfg.optim, key, value)
        with pytest.raises(ConfigError, match=f"optim.{key}"):
            validate(cfg)
