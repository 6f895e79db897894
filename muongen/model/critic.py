"""The critic: a set function over one event's muons and its condition -> a score.

Per-muon network over [muon, condition of its event] (-64-128, LayerNorm, LeakyReLU),
pooled per event (amax or mean over the event's contiguous rows,
:mod:`muongen.model.pooling`; a symmetric function, so the score does not depend on the
muons' order within an event), then an event head over [pooled, condition].

Muon features and conditions are standardised first (:mod:`muongen.model.normaliser`,
the generator's statistics); :meth:`Critic.score` takes muons already standardised, which
is where the training step computes the gradient penalty, so the Lipschitz constraint
weighs every feature by its spread and not by its unit (x / 500 m has a spread ~0.01).

An event without muons has nothing to pool: it gets ``empty_fill``, a learned vector of
the pooled width (initialised to zero). Nothing like -1e9 ever reaches the head.
"""

from __future__ import annotations

import torch
from torch import nn

from muongen import schema
from muongen.config import ModelConfig
from muongen.model.layers import leaky_relu, mlp
from muongen.model.normaliser import Standardiser, muon_standardiser
from muongen.model.pooling import segment_max, segment_mean


def event_index_of(counts: torch.Tensor, n_muons: int) -> torch.Tensor:
    """(N,) int64: the event each muon belongs to, from counts (B,); no host sync."""
    events = torch.arange(counts.shape[0], device=counts.device)
    return torch.repeat_interleave(events, counts, output_size=n_muons)


class Critic(nn.Module):
    """Wasserstein critic of ragged muon sets (features)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_features = schema.muon_feature_dim(cfg.representation)
        self.pooling = cfg.pooling
        nc = schema.N_CONDITION
        self.cond_norm = Standardiser(nc)
        self.muon_norm = muon_standardiser(cfg)
        width = cfg.critic_muon_hidden[-1]
        self.muon_net = mlp(
            self.n_features + nc,
            cfg.critic_muon_hidden,
            None,
            activation=leaky_relu,
            layer_norm=True,
        )
        self.empty_fill = nn.Parameter(torch.zeros(width))
        # no output bias: a constant offset cancels in every WGAN loss and in the GP
        self.head = mlp(
            width + nc, cfg.critic_head_hidden, 1, activation=leaky_relu, out_bias=False
        )

    def forward(
        self,
        muons: torch.Tensor,
        cond: torch.Tensor,
        counts: torch.Tensor,
        event_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Score each event.

        Args:
            muons: (N, F) muon features grouped by event, event after event (any order
                within an event).
            cond: (B, 4) condition features.
            counts: (B,) int64 muons per event, sum = N.
            event_index: (N,) the event of each muon (``repeat_interleave`` of counts)
                when the caller has it.

        Returns:
            (B,) scores.
        """
        return self.score(self.muon_norm(muons), cond, counts, event_index)

    def score(
        self,
        muons: torch.Tensor,
        cond: torch.Tensor,
        counts: torch.Tensor,
        event_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Like :meth:`forward` but for standardised muons (N, F) (``muon_norm(muons)``)."""
        if event_index is None:
            event_index = event_index_of(counts, muons.shape[0])
        cond = self.cond_norm(cond)
        h = self.muon_net(torch.cat([muons, cond.index_select(0, event_index)], dim=-1))  # (N, H)
        if self.pooling == "amax":
            pooled = segment_max(h, counts, event_index)  # (B, H)
        else:
            pooled = segment_mean(h, counts, event_index)
        pooled = torch.where((counts > 0).unsqueeze(-1), pooled, self.empty_fill.to(pooled.dtype))
        return self.head(torch.cat([pooled, cond.to(pooled.dtype)], dim=-1)).squeeze(-1)
