"""Critic: a set function (order-invariant, events independent), explicit empty fill."""

from __future__ import annotations

import math

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


CRITICS = [
    dict(critic="pointnet", pooling="amax"),
    dict(critic="pointnet", pooling="mean"),
    dict(critic="epic", critic_global_width=24),
    dict(critic="epic", critic_log_radius=True),
]
IDS = ["amax", "mean", "epic", "epic-log-radius"]


@pytest.mark.parametrize("critic_cfg", CRITICS, ids=IDS)
def test_score_invariant_to_muon_order_within_events(critic_cfg, ragged):
    torch.manual_seed(0)
    _, critic = build_models(small_model_config(**critic_cfg))
    cond, muons, counts = ragged(b=40, max_count=8, seed=3)
    shuffled, order = _shuffle_within_events(muons, counts, seed=4)
    assert not torch.equal(order, torch.arange(len(order)))
    torch.testing.assert_close(critic(shuffled, cond, counts), critic(muons, cond, counts))


@pytest.mark.parametrize("critic_cfg", CRITICS, ids=IDS)
def test_events_are_scored_independently(critic_cfg, ragged):
    torch.manual_seed(0)
    _, critic = build_models(small_model_config(**critic_cfg))
    cond, muons, counts = ragged(b=10, seed=5)
    assert_scored_alone_as_together(critic, cond, muons, counts, 10)


def assert_scored_alone_as_together(critic, cond, muons, counts, n_events: int) -> None:
    """Each of the first ``n_events`` events scores alone as it does in the batch."""
    scores = critic(muons, cond, counts)
    start = 0
    for i in range(n_events):
        n = int(counts[i])
        alone = critic(muons[start : start + n], cond[i : i + 1], counts[i : i + 1])
        torch.testing.assert_close(alone, scores[i : i + 1])
        start += n


def test_empty_events_use_the_learned_fill():
    torch.manual_seed(0)
    _, critic = build_models(small_model_config(critic="pointnet"))
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


def test_amax_critic_pools_before_its_last_activation_exactly(ragged):
    """The increasing last activation is applied to the maxima, not the rows: the score and
    its gradients (first and second order, as the penalty takes them) equal the textbook
    order, activation then maximum."""
    from muongen.model.critic import event_index_of
    from muongen.model.pooling import segment_max

    torch.manual_seed(0)
    _, critic = build_models(small_model_config(critic="pointnet", pooling="amax"))
    cond, muons, counts = ragged(b=30, max_count=7, seed=8)
    muons = critic.muon_norm(muons).detach().requires_grad_(True)

    def textbook(x):
        ei = event_index_of(counts, x.shape[0])
        c = critic.cond_norm(cond)
        h = critic.muon_net(torch.cat([x, c.index_select(0, ei)], -1))
        pooled = torch.where(
            (counts > 0).unsqueeze(-1), segment_max(h, counts, ei), critic.empty_fill
        )
        return critic.head(torch.cat([pooled, cond], -1)).squeeze(-1)

    got, want = critic.score(muons, cond, counts), textbook(muons)
    torch.testing.assert_close(got, want)
    (g1,) = torch.autograd.grad(got.sum(), muons, create_graph=True)
    (g2,) = torch.autograd.grad(want.sum(), muons, create_graph=True)
    torch.testing.assert_close(g1, g2)
    p1 = torch.autograd.grad(g1.pow(2).sum(), list(critic.parameters()), allow_unused=True)
    p2 = torch.autograd.grad(g2.pow(2).sum(), list(critic.parameters()), allow_unused=True)
    for a, b in zip(p1, p2):
        if a is None or b is None:
            assert a is None and b is None
        else:
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("critic", ["epic", "pointnet"])
def test_log_radius_input_is_the_standardised_radius(critic, ragged):
    torch.manual_seed(0)
    _, plain = build_models(small_model_config(critic=critic))
    _, with_r = build_models(small_model_config(critic=critic, critic_log_radius=True))
    cond, muons, counts = ragged(b=12, seed=6)
    z = plain.inputs(muons)
    assert z.shape[1] == 3
    torch.testing.assert_close(z, plain.muon_norm(muons))
    got = with_r.inputs(muons)
    assert got.shape[1] == 4
    torch.testing.assert_close(got[:, :3], z)
    r = torch.hypot(z[:, 1], z[:, 2])
    torch.testing.assert_close(got[:, 3], torch.log(torch.sqrt(r**2 + 0.03**2)))
    assert torch.isfinite(with_r(muons, cond, counts)).all()
    # model.critic_log_radius_floor sets the floor: on the axis the input is log(floor)
    _, fine = build_models(
        small_model_config(critic=critic, critic_log_radius=True, critic_log_radius_floor=0.01)
    )
    torch.testing.assert_close(fine.inputs(muons)[:, 3], torch.log(torch.sqrt(r**2 + 0.01**2)))
    on_axis = muons.clone()
    on_axis[:, 1:] = fine.muon_norm.mean[1:]  # x = y = their means: standardised 0
    torch.testing.assert_close(
        fine.inputs(on_axis)[:, 3], torch.full((muons.shape[0],), math.log(0.01))
    )
    # no azimuth in the radial representation: nothing is added there
    _, radial = build_models(
        small_model_config(critic=critic, critic_log_radius=True, representation="radial")
    )
    assert radial.inputs(muons[:, :2].abs()).shape[1] == 2
