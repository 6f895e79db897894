"""WGAN losses as pure functions of critic scores (shapes (B,)); they return 0-d tensors."""

from __future__ import annotations

import torch
from torch.nn import functional as F


def _mean(scores: torch.Tensor, n_events: int | None) -> torch.Tensor:
    return scores.mean() if n_events is None else scores.sum() / max(n_events, 1)


def critic_loss(
    d_real: torch.Tensor,
    d_fake: torch.Tensor,
    gp: torch.Tensor,
    gp_lambda: float,
    n_events: int | None = None,
) -> torch.Tensor:
    """L_C = mean D(fake) - mean D(real) + lambda * GP.

    With ``n_events`` the scores cover part of a batch of that many events (the others
    score 0 here: events that score alike real and fake) and the means are sums / n_events.
    """
    return _mean(d_fake, n_events) - _mean(d_real, n_events) + gp_lambda * gp


def generator_loss(d_fake: torch.Tensor, n_events: int | None = None) -> torch.Tensor:
    """L_G (adversarial part) = -mean D(G(c)) (``n_events``: as in :func:`critic_loss`)."""
    return -_mean(d_fake, n_events)


def multiplicity_loss(log_mult: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """MSE between the predicted log10(N + 1) (B,) and the real counts (B,) int64."""
    target = torch.log10(counts.to(log_mult.dtype) + 1.0)
    return F.mse_loss(log_mult, target)


def multiplicity_nll(
    mean: torch.Tensor, log_std: torch.Tensor, counts: torch.Tensor
) -> torch.Tensor:
    """Gaussian negative log-likelihood of the real log10(N + 1) (B,) under Normal(mean,
    exp(log_std)) (B,), per event and without the constant 0.5 log(2 pi).

    Its gradient in ``mean`` is the MSE's divided by the variance: it fits the mean as the
    MSE does and the spread on top.
    """
    target = torch.log10(counts.to(mean.dtype) + 1.0)
    return (0.5 * ((target - mean) * torch.exp(-log_std)).pow(2) + log_std).mean()


def w_gap(d_real: torch.Tensor, d_fake: torch.Tensor, n_events: int | None = None) -> torch.Tensor:
    """The Wasserstein-gap estimate mean D(real) - mean D(fake) (reported, not trained)."""
    return (_mean(d_real, n_events) - _mean(d_fake, n_events)).detach()
