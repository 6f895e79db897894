"""Losses on known inputs, and gradients reaching every parameter of G and C."""

from __future__ import annotations

import math

import torch

from muongen.model import build_models
from muongen.model.losses import critic_loss, generator_loss, multiplicity_loss, w_gap
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


def _missing_grads(module):
    return [n for n, p in module.named_parameters() if p.grad is None or not p.grad.any()]


def test_gradients_reach_every_parameter(ragged):
    torch.manual_seed(0)
    gen, critic = build_models(small_model_config())
    cond, real, counts = ragged(b=16, seed=1)
    assert (counts == 0).any() and (counts > 0).any()

    fake = gen.generate_with_counts(cond, counts, real.shape[0])
    d = critic(torch.cat([real, fake]), torch.cat([cond, cond]), torch.cat([counts, counts]))
    loss = generator_loss(d[16:]) + multiplicity_loss(gen.log_multiplicity(cond), counts)
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
    assert critic.muon_net[0].weight.grad.abs().sum() > 0
