"""WGAN losses as pure functions of critic scores (shapes (B,)); they return 0-d tensors."""

from __future__ import annotations

import torch
from torch.nn import functional as F


def critic_loss(
    d_real: torch.Tensor, d_fake: torch.Tensor, gp: torch.Tensor, gp_lambda: float
) -> torch.Tensor:
    """L_C = mean D(fake) - mean D(real) + lambda * GP."""
    return d_fake.mean() - d_real.mean() + gp_lambda * gp


def generator_loss(d_fake: torch.Tensor) -> torch.Tensor:
    """L_G (adversarial part) = -mean D(G(c))."""
    return -d_fake.mean()


def multiplicity_loss(log_mult: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """MSE between the predicted log10(N + 1) (B,) and the real counts (B,) int64."""
    target = torch.log10(counts.to(log_mult.dtype) + 1.0)
    return F.mse_loss(log_mult, target)


def w_gap(d_real: torch.Tensor, d_fake: torch.Tensor) -> torch.Tensor:
    """The Wasserstein-gap estimate mean D(real) - mean D(fake) (reported, not trained)."""
    return (d_real.mean() - d_fake.mean()).detach()
