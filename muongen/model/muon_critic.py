"""The per-muon critic: a Wasserstein critic of the pooled muons, muon by muon.

The set critic (:mod:`muongen.model.critic`) scores events, and the WGAN losses weigh
events (``optim.event_weight``). A muon of a 1000-muon bundle then reaches the score
through a mean over its bundle, ~1/1000 of its event, while the pooled per-muon spectra
that a detector sees (and ``muongen evaluate``'s pooled and binned per-muon metrics)
count every muon alike: the rare high-energy muons of the richest bundles, which
dominate the pooled spectrum, carry almost no gradient. This critic closes that gap. It
scores each muon on its own, s(muon, condition of its event, log(1 + N)), and its WGAN
term compares the mean score over all real muons of a batch with the mean over all fake
ones: the Wasserstein distance between the pooled muon distributions given the primary
and the bundle's multiplicity, in which a muon of a big bundle counts as much as a lone
one.

Its gradient penalty is per muon, exactly: a muon's score depends on that muon alone
(and on its event's condition and count, which are the same in the real and the fake
event), so the gradient of the summed scores over interpolated muons holds each muon's
own gradient in its row (:func:`muon_penalty`).

Cost: one hidden layer fed [per-event part, per-muon part] is split
(:func:`muongen.model.layers.split_linear`), so the per-muon cost is that of the muon's
few inputs times the width, plus the width's activation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from muongen.model.layers import Linear, leaky_relu, mlp, split_linear


class MuonCritic(nn.Module):
    """s(muon, condition, log(1 + N)) -> one score per muon.

    Args:
        n_features: per-muon inputs (the set critic's, energy reference included).
        n_cond: condition inputs (standardised by the set critic).
        hidden: hidden widths (at least one).
    """

    def __init__(self, n_features: int, n_cond: int, hidden: Sequence[int]) -> None:
        super().__init__()
        if not hidden:
            raise ValueError("a muon critic needs at least one hidden layer")
        self.first = Linear(n_cond + 1 + n_features, hidden[0])  # [event part, muon part]
        # no output bias: a constant offset cancels in the WGAN term and in the penalty
        self.rest = mlp(hidden[0], hidden[1:], 1, activation=leaky_relu, out_bias=False)

    def forward(
        self,
        muons: torch.Tensor,
        cond: torch.Tensor,
        counts: torch.Tensor,
        event_index: torch.Tensor,
    ) -> torch.Tensor:
        """Score each muon.

        Args:
            muons: (N, F) the muons in the set critic's input space, grouped by event.
            cond: (B, C) standardised conditions.
            counts: (B,) int64 muons per event.
            event_index: (N,) the event of each muon.

        Returns:
            (N,) scores.
        """
        log_n = torch.log1p(counts.to(muons.dtype)).unsqueeze(-1)  # (B, 1)
        per_event = torch.cat([cond.to(muons.dtype), log_n], -1)  # (B, C + 1)
        h = split_linear(self.first, per_event, muons, counts, event_index)  # (N, H)
        h = nn.functional.leaky_relu_(h, 0.2)
        return self.rest(h).squeeze(-1)


def muon_penalty(
    score: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    real: torch.Tensor,
    fake: torch.Tensor,
    event_index: torch.Tensor,
    rows: torch.Tensor,
    alpha: torch.Tensor,
) -> torch.Tensor:
    """The per-muon gradient penalty's terms (||grad s(x)|| - 1)^2 at interpolated muons.

    Real and fake muons are paired row by row (the same events with the same counts: the
    step's real counts), ``x = alpha real + (1 - alpha) fake`` for the drawn ``rows``.

    Args:
        score: ``score(x, x_event)`` -> (M,) the scores of muons ``x`` (M, F) of the
            events ``x_event`` (M,), in any order.
        real: (N, F) real muons in the critic's input space.
        fake: (N, F) fake muons, the same layout.
        event_index: (N,) the event of each row.
        rows: (M,) int64 the rows drawn.
        alpha: (M, 1) interpolation weights in [0, 1].

    Returns:
        (M,) each drawn row's term (not averaged).
    """
    x = torch.lerp(fake.index_select(0, rows), real.index_select(0, rows), alpha)
    x = x.detach().requires_grad_(True)
    s = score(x, event_index.index_select(0, rows))
    (grad,) = torch.autograd.grad(s.sum(), x, create_graph=True)
    return (torch.sqrt(grad.square().sum(-1) + 1e-12) - 1.0).square()
