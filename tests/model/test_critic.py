"""Critic: a set function (order-invariant, events independent), explicit empty fill."""

from __future__ import annotations

import pytest
import torch

from muongen.model import build_models

from .conftest import small_model_config


def _shuffle_within_events(muons, counts, seed):
    gen = torch.Generator().manual_seed(seed)
    ev = torch.repeat_interleave(torch.arange(len(counts)), counts)
    order = torch.argsort(ev.double() + torch.rand(len(ev), generator=gen, dtype=torch.float64))
    assert torch.equal(ev[order], ev)  # still grouped by event
    return muons[order], order


CRITICS = [dict(pooling="amax"), dict(pooling="mean"), dict(critic="epic", critic_global_width=24)]


@pytest.mark.parametrize("critic_cfg", CRITICS, ids=["amax", "mean", "epic"])
def test_score_invariant_to_muon_order_within_events(critic_cfg, ragged):
    torch.manual_seed(0)
    _, critic = build_models(small_model_config(**critic_cfg))
    cond, muons, counts = ragged(b=40, max_count=8, seed=3)
    shuffled, order = _shuffle_within_events(muons, counts, seed=4)
    assert not torch.equal(order, torch.arange(len(order)))
    torch.testing.assert_close(critic(shuffled, cond, counts), critic(muons, cond, counts))


@pytest.mark.parametrize("critic_cfg", CRITICS, ids=["amax", "mean", "epic"])
def test_events_are_scored_independently(critic_cfg, ragged):
    torch.manual_seed(0)
    _, critic = build_models(small_model_config(**critic_cfg))
    cond, muons, counts = ragged(b=10, seed=5)
    scores = critic(muons, cond, counts)
    start = 0
    for i in range(10):
        n = int(counts[i])
        alone = critic(muons[start : start + n], cond[i : i + 1], counts[i : i + 1])
        torch.testing.assert_close(alone, scores[i : i + 1])
        start += n


def test_empty_events_use_the_learned_fill():
    torch.manual_seed(0)
    _, critic = build_models(small_model_config())
    cond = torch.randn(3, 4)
    counts = torch.zeros(3, dtype=torch.int64)
    none = torch.zeros(0, 3)
    before = critic(none, cond, counts)
    assert torch.isfinite(before).all() and before.abs().max() < 100
    expected = critic.head(torch.cat([critic.empty_fill.expand(3, -1), cond], -1)).squeeze(-1)
    torch.testing.assert_close(before, expected)
    with torch.no_grad():
        critic.empty_fill.add_(1.0)
    assert not torch.allclose(critic(none, cond, counts), before)
