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

from collections.abc import Callable

import torch
from torch import nn

from muongen import schema
from muongen.config import ModelConfig
from muongen.model.attention_pool import AttentionPool
from muongen.model.layers import Linear, leaky_relu, mlp, narrow_linear, split_linear
from muongen.model.muon_critic import MuonCritic
from muongen.model.normaliser import (
    ConditionStandardiser,
    Standardiser,
    condition_dim,
    muon_standardiser,
    per_nucleon_energy,
)
from muongen.model.pooling import event_index_of, rows_of, segment_max, segment_mean


class _SetCritic(nn.Module):
    """What both critics share: ``forward`` maps the muons to the critic's input space
    (:meth:`inputs`: standardised, plus the log radius with ``model.critic_log_radius``)
    and calls the subclass's ``score(inputs, cond, counts, event_index)``, where the
    training step computes the gradient penalty."""

    muon_norm: nn.Module
    cond_norm: nn.Module
    score: Callable[..., torch.Tensor]

    def _setup_muon_critic(self, cfg: ModelConfig, n_features: int, n_cond: int) -> None:
        """Add the per-muon critic when ``model.muon_critic`` names its widths (made after
        the set critic's layers, so those draw the same initial weights as without it)."""
        #: the per-muon critic (:mod:`muongen.model.muon_critic`), or None
        self.muon_critic = (
            MuonCritic(n_features, n_cond, cfg.muon_critic) if cfg.muon_critic else None
        )

    def muon_scores(
        self,
        muons: torch.Tensor,
        cond: torch.Tensor,
        counts: torch.Tensor,
        event_index: torch.Tensor,
    ) -> torch.Tensor:
        """(N,) the per-muon critic's score of each muon: ``muons`` (N, F') mapped by
        :meth:`inputs`, of the events ``event_index`` (N,) (any order) with conditions
        ``cond`` (B, 4) and counts (B,)."""
        if self.muon_critic is None:
            raise ValueError("this critic has no per-muon critic (model.muon_critic is empty)")
        muons = self._with_energy_reference(muons, cond, event_index)
        return self.muon_critic(muons, self.cond_norm(cond), counts, event_index)

    def _setup_inputs(self, cfg: ModelConfig) -> int:
        """Set the input map from the config; returns the number of inputs per muon."""
        self.muon_norm = muon_standardiser(cfg)
        self.log_radius = cfg.critic_log_radius and cfg.representation == "xy"
        self.log_radius_floor = cfg.critic_log_radius_floor
        # per_nucleon: each muon's log10(E / (E0 / A)), standardised, one more input that
        # :meth:`_with_energy_reference` appends in ``score`` (it needs the condition)
        per_nucleon = cfg.energy_reference == "per_nucleon"
        self.energy_norm = Standardiser(1) if per_nucleon else None
        return schema.muon_feature_dim(cfg.representation) + int(self.log_radius) + per_nucleon

    def _with_energy_reference(
        self, muons: torch.Tensor, cond: torch.Tensor, event_index: torch.Tensor
    ) -> torch.Tensor:
        """(N, F') inputs -> (N, F' + 1) with each muon's standardised log10(E / (E0 / A))
        appended (``model.energy_reference: per_nucleon``; else ``muons`` itself). It is an
        affine function of the standardised log E and the event's condition, so the
        gradient penalty, taken on the inputs, holds the critic Lipschitz through it."""
        if self.energy_norm is None:
            return muons
        norm = self.muon_norm
        log_e = muons[:, 0] * norm.std[0].to(muons.dtype) + norm.mean[0].to(muons.dtype)
        ref = per_nucleon_energy(cond).to(muons.dtype).index_select(0, event_index)
        rel = self.energy_norm((log_e - ref).unsqueeze(-1))
        return torch.cat([muons, rel], dim=-1)

    def inputs(self, muons: torch.Tensor) -> torch.Tensor:
        """(N, F) muon features -> (N, F') what :meth:`score` takes: the standardised
        features, then (``model.critic_log_radius``) 0.5 log(x^2 + y^2 + floor^2) of the
        standardised x and y (floor: ``model.critic_log_radius_floor``). The training step
        interpolates real and fake muons here for the gradient penalty, so the critic is
        1-Lipschitz in the log radius as well."""
        z = self.muon_norm(muons)
        if not self.log_radius:
            return z
        xy = z[:, 1:3]
        r2 = xy.square().sum(-1, keepdim=True) + self.log_radius_floor**2
        return torch.cat([z, 0.5 * torch.log(r2)], -1)

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
        return self.score(self.inputs(muons), cond, counts, event_index)


class Critic(_SetCritic):
    """Wasserstein critic of ragged muon sets (features)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_features = self._setup_inputs(cfg)
        self.pooling = cfg.pooling
        nc = condition_dim(cfg)
        self.cond_norm = ConditionStandardiser(cfg.slant_depth)
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
        self._setup_muon_critic(cfg, self.n_features, nc)

    def score(
        self,
        muons: torch.Tensor,
        cond: torch.Tensor,
        counts: torch.Tensor,
        event_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Like :meth:`forward` but for muons already mapped by :meth:`inputs` (N, F')."""
        if event_index is None:
            event_index = event_index_of(counts, muons.shape[0])
        muons = self._with_energy_reference(muons, cond, event_index)
        cond = self.cond_norm(cond)
        x = torch.cat([muons, rows_of(cond, event_index)], dim=-1)  # (N, F + 4)
        if self.pooling == "amax":
            # the last activation is increasing, so it commutes with the maximum: applied
            # to the (B, H) maxima instead of the (N, H) rows, same value and gradient
            pooled = self.muon_net[-1](segment_max(self.muon_net[:-1](x), counts, event_index))
        else:
            pooled = segment_mean(self.muon_net(x), counts, event_index)  # (B, H)
        pooled = torch.where((counts > 0).unsqueeze(-1), pooled, self.empty_fill.to(pooled.dtype))
        return self.head(torch.cat([pooled, cond.to(pooled.dtype)], dim=-1)).squeeze(-1)


class EpicCritic(_SetCritic):
    """An EPiC-style critic (Buhmann et al., "EPiC-GAN", 2023): muons and their event talk.

    Each muon gets a narrow per-muon vector phi (width L), each event a wide vector g
    (width G). g starts from the event's condition, log(N + 1), the low moments of its
    muons (mean and mean square of each standardised feature) and phi pooled by mean and
    max; then ``critic_layers`` times, every muon's phi is updated from [g of its event,
    phi] (residual) and g from [g, mean and max of the new phi, condition] (residual).
    The score is an MLP on [g, condition]. Each muon's update sees the whole bundle through
    g, so the critic judges the within-bundle distribution (the energy-radius correlation,
    the spectrum at a given multiplicity), not only per-muon extremes. The per-event part
    of each per-muon layer is computed once per event (:func:`split_linear`), so the
    per-muon cost follows L, not G. Sum pooling is mean x N, and N is an input.

    An event without muons has mean and max 0 and N = 0: no fill is needed.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_features = f = self._setup_inputs(cfg)
        nc = condition_dim(cfg)
        local, wide = cfg.critic_local_width, cfg.critic_global_width
        self.cond_norm = ConditionStandardiser(cfg.slant_depth)
        self.embed = Linear(f, local)
        self.global_in = Linear(2 * local + 2 * f + nc + 1, wide)
        self.layers = nn.ModuleList(
            _EpicLayer(local, wide, nc, cfg.critic_attention_heads)
            for _ in range(cfg.critic_layers)
        )
        # no output bias: a constant offset cancels in every WGAN loss and in the GP
        self.head = mlp(wide + nc, [wide], 1, activation=leaky_relu, out_bias=False)
        self._setup_muon_critic(cfg, f, nc)

    def score(
        self,
        muons: torch.Tensor,
        cond: torch.Tensor,
        counts: torch.Tensor,
        event_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Like :meth:`forward` but for muons already mapped by :meth:`inputs` (N, F')."""
        if event_index is None:
            event_index = event_index_of(counts, muons.shape[0])
        muons = self._with_energy_reference(muons, cond, event_index)
        c = self.cond_norm(cond).to(muons.dtype)
        log_n = torch.log1p(counts.to(muons.dtype)).unsqueeze(-1)  # (B, 1)
        phi = _act_(narrow_linear(self.embed, muons))  # (N, L)
        moments = segment_mean(torch.cat([muons, muons * muons], -1), counts, event_index)
        pooled = _pool(phi, counts, event_index)  # (B, 2L)
        g = _act(self.global_in(torch.cat([pooled, moments, c, log_n], -1)))  # (B, G)
        for layer in self.layers:
            phi, g = layer(phi, g, c, counts, event_index)
        return self.head(torch.cat([g, c], -1)).squeeze(-1)


def _act(x: torch.Tensor) -> torch.Tensor:
    return nn.functional.leaky_relu(x, 0.2)


def _act_(x: torch.Tensor) -> torch.Tensor:
    """``_act`` overwriting ``x``: for the (N, L) pre-activations, which nothing else reads
    (a linear layer's backward needs its input, not its output; with a positive slope
    autograd differentiates the activation, twice too, from its output). One fresh
    (N, L) tensor fewer per call."""
    return nn.functional.leaky_relu_(x, 0.2)


def _pool(phi: torch.Tensor, counts: torch.Tensor, event_index: torch.Tensor) -> torch.Tensor:
    """(N, L) -> (B, 2L): per-event mean and max."""
    mean = segment_mean(phi, counts, event_index)
    return torch.cat([mean, segment_max(phi, counts, event_index)], -1)


class _EpicLayer(nn.Module):
    """One residual exchange: muons read their event, the event reads its muons."""

    def __init__(self, local: int, wide: int, n_cond: int, attention_heads: int = 0) -> None:
        super().__init__()
        self.local_in = Linear(wide + local, local)  # [g of the event, phi], split
        self.local_out = Linear(local, local)
        self.global_in = Linear(wide + 2 * local + n_cond, wide)
        self.global_out = Linear(wide, wide)
        #: the event also reads its muons through an attention pool
        #: (``model.critic_attention_heads``; zero at the start, no random draws), or None
        self.attention = AttentionPool(local, wide, attention_heads) if attention_heads else None

    def forward(
        self,
        phi: torch.Tensor,
        g: torch.Tensor,
        cond: torch.Tensor,
        counts: torch.Tensor,
        event_index: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h = _act_(split_linear(self.local_in, g, phi, counts, event_index))  # (N, L)
        phi = phi + _act_(self.local_out(h))
        h = self.global_in(torch.cat([g, _pool(phi, counts, event_index), cond], -1))
        if self.attention is not None:
            h = h + self.attention(phi, g, counts, event_index)
        return phi, g + _act(self.global_out(_act(h)))  # (N, L), (B, G)
