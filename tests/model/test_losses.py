"""Losses on known inputs, and gradients reaching every parameter of G and C."""

from __future__ import annotations

import math

import pytest
import torch

from muongen.model import build_models
from muongen.model.losses import (
    critic_loss,
    generator_loss,
    multiplicity_loss,
    multiplicity_nll,
    w_gap,
)
from muongen.model.penalty import gradient_penalty

from .conftest import small_model_config


def test_losses_known_values():
    d_real = torch.tensor([1.0, 3.0])
    d_fake = torch.tensor([0.0, -2.0])
    assert critic_loss(d_real, d_fake, torch.tensor(0.5), 10.0).item() == -1.0 - 2.0 + 5.0
    assert generator_loss(d_fake).item() == 1.0
    assert w_gap(d_real, d_fake).item() == 3.0
    m = multiplicity_loss(torch.tensor([0.0, 1.0]), torch.tensor([0, 9]))
    assert math.isclose(m.item(), 0.0)
    m = multiplicity_loss(torch.tensor([1.0, 1.0]), torch.tensor([0, 99]))
    assert math.isclose(m.item(), (1.0 + 1.0) / 2)


def test_multiplicity_nll_known_values_and_minimum():
    # log10(N + 1) = 0 and 1; a unit spread: 0.5 * mean squared error + log 1
    m = multiplicity_nll(torch.tensor([0.0, 0.0]), torch.zeros(2), torch.tensor([0, 9]))
    assert math.isclose(m.item(), 0.25, rel_tol=1e-6)
    # N = 1 under Normal(0, 0.3): 0.5 * (log10(2) / 0.3)^2 + log 0.3
    m = multiplicity_nll(torch.tensor([0.0]), torch.tensor([math.log(0.3)]), torch.tensor([1]))
    assert math.isclose(m.item(), 0.5 * (math.log10(2) / 0.3) ** 2 + math.log(0.3), rel_tol=1e-5)


def _missing_grads(module):
    return [n for n, p in module.named_parameters() if p.grad is None or not p.grad.any()]


@pytest.mark.parametrize("kind", ["epic", "pointnet"])
def test_gradients_reach_every_parameter(ragged, kind):
    torch.manual_seed(0)
    gen, critic = build_models(small_model_config(critic=kind))
    cond, real, counts = ragged(b=16, seed=1)
    assert (counts == 0).any() and (counts > 0).any()

    fake = gen.generate_with_counts(cond, counts, real.shape[0])
    d = critic(torch.cat([real, fake]), torch.cat([cond, cond]), torch.cat([counts, counts]))
    loss = generator_loss(d[16:]) + gen.multiplicity_loss(cond, counts)  # the hurdle head
    loss.backward()
    assert _missing_grads(gen) == []

    # fake multiplicities that differ from the real ones (as with train.fake_counts =
    # predicted): with equal counts the empty events' scores cancel and so does the fill's
    # gradient, correctly
    critic.zero_grad()
    fake_counts = torch.roll(counts, 1)
    fake = gen.generate_with_counts(cond, fake_counts).detach()
    d = critic(torch.cat([real, fake]), torch.cat([cond, cond]), torch.cat([counts, fake_counts]))
    gp = gradient_penalty(critic, cond, real, counts, fake, fake_counts)
    critic_loss(d[:16], d[16:], gp, 10.0).backward()
    assert _missing_grads(critic) == []

    # the penalty alone is differentiable through the critic's per-muon network
    critic.zero_grad()
    gradient_penalty(critic, cond, real, counts, fake, fake_counts).backward()
    first = critic.muon_net[0] if kind == "pointnet" else critic.embed
    assert first.weight.grad.abs().sum() > 0
