"""The per-muon critic (model.muon_critic): one score per muon, the exact per-muon penalty,
and its place beside the set critic."""

from __future__ import annotations

import pytest
import torch

from muongen.model.critic import Critic, EpicCritic
from muongen.model.muon_critic import MuonCritic, muon_penalty

from .conftest import small_model_config


def _batch(ragged, seed=0):
    cond, muons, counts = ragged(b=10, seed=seed)
    event_index = torch.repeat_interleave(torch.arange(10), counts)
    assert int(counts.max()) > 1 and int(counts.sum()) > 10
    return cond, muons, counts, event_index


def test_a_muons_score_depends_on_that_muon_and_its_event_only(ragged):
    torch.manual_seed(0)
    crit = MuonCritic(3, 4, [16, 8])
    cond, muons, counts, ev = _batch(ragged)
    s = crit(muons, cond, counts, ev)
    assert s.shape == (muons.shape[0],) and torch.isfinite(s).all()
    # move every muon but the first of the first multi-muon event: its score stays
    first = int(torch.nonzero(counts > 1)[0])
    i = int(torch.nonzero(ev == first)[0])
    moved = muons + 1.0
    moved[i] = muons[i]
    s2 = crit(moved, cond, counts, ev)
    torch.testing.assert_close(s2[i], s[i])
    assert not torch.allclose(s2[ev != first], s[ev != first])
    # its event's condition and count are inputs
    cond2 = cond.clone()
    cond2[first] += 0.5
    assert not torch.isclose(crit(muons, cond2, counts, ev)[i], s[i])
    # any order of the muons, given their events: the same scores, permuted
    perm = torch.randperm(muons.shape[0], generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(crit(muons[perm], cond, counts, ev[perm]), s[perm])


def test_the_split_first_layer_is_the_concatenated_input(ragged):
    torch.manual_seed(1)
    crit = MuonCritic(3, 4, [16, 8])
    cond, muons, counts, ev = _batch(ragged, seed=2)
    x = torch.cat([cond[ev], torch.log1p(counts.float())[ev, None], muons], -1)
    ref = crit.rest(torch.nn.functional.leaky_relu(crit.first(x), 0.2)).squeeze(-1)
    torch.testing.assert_close(crit(muons, cond, counts, ev), ref, rtol=1e-5, atol=1e-6)


def test_the_penalty_of_a_linear_score_is_exact():
    a = torch.tensor([0.6, 0.0, 1.2])
    real, fake = torch.randn(7, 3), torch.randn(7, 3)
    ev = torch.zeros(7, dtype=torch.int64)
    rows = torch.tensor([0, 3, 3, 6])
    terms = muon_penalty(lambda x, e: x @ a, real, fake, ev, rows, torch.rand(4, 1))
    torch.testing.assert_close(terms, torch.full((4,), (a.norm() - 1) ** 2))


def test_the_penalty_takes_each_muons_own_gradient(ragged):
    """Each drawn row's term is that of the gradient of its own score alone: no other
    muon's score reaches it (the scores are per muon)."""
    torch.manual_seed(3)
    crit = MuonCritic(3, 4, [16])
    cond, real, counts, ev = _batch(ragged, seed=4)
    fake = real + torch.randn_like(real)
    rows = torch.tensor([0, 2, 2, 5, real.shape[0] - 1])
    alpha = torch.rand(5, 1, generator=torch.Generator().manual_seed(5))

    def score(x, e):
        return crit(x, cond, counts, e)

    terms = muon_penalty(score, real, fake, ev, rows, alpha)
    for j, r in enumerate(rows.tolist()):
        x = torch.lerp(fake[r], real[r], alpha[j]).unsqueeze(0).requires_grad_(True)
        (g,) = torch.autograd.grad(score(x, ev[r : r + 1]).sum(), x)
        torch.testing.assert_close(terms[j], (g.norm() - 1) ** 2, rtol=1e-5, atol=1e-6)
    terms.sum().backward()  # a penalty trains the critic: its weights get a gradient
    assert crit.first.weight.grad is not None and crit.first.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("kind", [Critic, EpicCritic])
def test_the_set_critic_carries_it_and_keeps_its_own_weights(kind, ragged):
    """With model.muon_critic the critic holds a per-muon critic, made after its own
    layers: the set critic's initial weights and scores are those without it."""
    critic = "epic" if kind is EpicCritic else "pointnet"
    torch.manual_seed(0)
    plain = kind(small_model_config(critic=critic))
    torch.manual_seed(0)
    both = kind(small_model_config(critic=critic, muon_critic=[8]))
    assert plain.muon_critic is None and isinstance(both.muon_critic, MuonCritic)
    cond, muons, counts, ev = _batch(ragged, seed=6)
    torch.testing.assert_close(both(muons, cond, counts), plain(muons, cond, counts))
    s = both.muon_scores(both.inputs(muons), cond, counts, ev)
    assert s.shape == (muons.shape[0],)
    with pytest.raises(ValueError, match=r"model\.muon_critic"):
        plain.muon_scores(plain.inputs(muons), cond, counts, ev)


def test_it_sees_the_energy_per_nucleon_with_that_reference(ragged):
    torch.manual_seed(0)
    plain = Critic(small_model_config(muon_critic=[8]))
    crit = Critic(small_model_config(muon_critic=[8], energy_reference="per_nucleon"))
    assert crit.muon_critic.first.in_features == plain.muon_critic.first.in_features + 1
    cond, muons, counts, ev = _batch(ragged, seed=7)
    assert torch.isfinite(crit.muon_scores(crit.inputs(muons), cond, counts, ev)).all()
