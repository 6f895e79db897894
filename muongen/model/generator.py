"""The generator: condition -> how many muons, then each muon's features.

Three networks (design section 3):

* multiplicity head ``4 -> 64 -> 128 -> 64 -> 1`` (ELU) predicts m = log10(N + 1);
  counts = round(max(10^m - 1, 0)), capped at ``ModelConfig.max_generated_muons``;
* global network ``[z_global, condition, log10(N + 1)] -> context`` (LayerNorm, LeakyReLU
  0.2), one context per event;
* local network ``[context of its event, z_local] -> 128 -> 64 -> F`` per muon.

The global network is fed log10(N + 1) of the counts actually generated, so training
with the real events' counts (teacher forcing) and sampling with the head's counts feed
it the same quantity. Muons stay flat: (N, F) with counts (B,), event after event.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from muongen import schema
from muongen.config import ModelConfig
from muongen.model.layers import leaky_relu, mlp


def counts_from_log_mult(log_mult: torch.Tensor, max_muons: int = 0) -> torch.Tensor:
    """Muons per event from the head's output: round(max(10^m - 1, 0)), capped.

    Args:
        log_mult: (B,) predicted log10(N + 1).
        max_muons: cap per event (0: none). NaN predictions give 0 muons.

    Returns:
        (B,) int64 counts.
    """
    m = torch.nan_to_num(log_mult.detach().float(), nan=0.0)
    # bound m so that 10^m stays finite before the int cast
    m = m.clamp(max=math.log10(max_muons + 1.0) if max_muons > 0 else 30.0)
    counts = torch.round(torch.clamp(10.0**m - 1.0, min=0.0)).to(torch.int64)
    return counts.clamp(max=max_muons) if max_muons > 0 else counts


def _noise(shape: tuple, like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Standard normal noise on ``like``'s device and dtype."""
    if generator is None:  # no generator= keyword: torch.compile traces this overload only
        return torch.randn(shape, device=like.device, dtype=like.dtype)
    return torch.randn(shape, generator=generator, device=like.device, dtype=like.dtype)


class Generator(nn.Module):
    """Conditional generator of ragged muon sets (features, not physical units).

    Attributes:
        representation: ``"xy"`` (features [log E, x/500, y/500]) or ``"radial"``
            ([log E, r/500], r >= 0 through a softplus; the azimuth is drawn uniformly by
            :func:`muongen.schema.muon_physical`).
        n_features: F, the per-muon feature count of the representation.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.representation = cfg.representation
        self.n_features = schema.muon_feature_dim(cfg.representation)
        self.z_global = cfg.z_global
        self.z_local = cfg.z_local
        self.max_muons = cfg.max_generated_muons
        nc = schema.N_CONDITION
        self.multiplicity = mlp(nc, cfg.mult_hidden, 1, activation=nn.ELU)
        self.global_net = mlp(
            cfg.z_global + nc + 1,
            [cfg.context, cfg.context],
            None,
            activation=leaky_relu,
            layer_norm=True,
        )
        self.local_net = mlp(
            cfg.context + cfg.z_local, cfg.local_hidden, self.n_features, activation=leaky_relu
        )

    def log_multiplicity(self, cond: torch.Tensor) -> torch.Tensor:
        """(B, 4) condition features -> (B,) predicted log10(N + 1)."""
        return self.multiplicity(cond).squeeze(-1)

    def forward(
        self, cond: torch.Tensor, *, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample events for the given conditions.

        Args:
            cond: (B, 4) condition features.
            generator: optional RNG for the noise (else the global one).

        Returns:
            muons (N, F) features, counts (B,) int64 (N = counts.sum()), log_mult (B,).
            Sizing the output reads N on the host: one synchronisation per call.
        """
        log_mult = self.log_multiplicity(cond)
        counts = counts_from_log_mult(log_mult, self.max_muons)
        muons = self.generate_with_counts(cond, counts, generator=generator)
        return muons, counts, log_mult

    def generate_with_counts(
        self,
        cond: torch.Tensor,
        counts: torch.Tensor,
        n_muons: int | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Muon features for events whose multiplicities are given.

        Args:
            cond: (B, 4) condition features.
            counts: (B,) int64 muons per event.
            n_muons: counts.sum() when the caller knows it (e.g. the real batch's muon
                count); given, nothing is read back from the device.
            generator: optional RNG for the noise.

        Returns:
            (N, F) muon features, event after event.
        """
        if n_muons is None:
            n_muons = int(counts.sum())
        b = cond.shape[0]
        log_n = torch.log10(counts.to(cond.dtype) + 1.0).unsqueeze(-1)  # (B, 1)
        z = _noise((b, self.z_global), cond, generator)
        context = self.global_net(torch.cat([z, cond, log_n], dim=-1))  # (B, C)
        per_muon = torch.repeat_interleave(context, counts, dim=0, output_size=n_muons)  # (N, C)
        z_local = _noise((n_muons, self.z_local), per_muon, generator)
        out = self.local_net(torch.cat([per_muon, z_local], dim=-1))  # (N, F)
        if self.representation == "radial":
            # r / 500 m must be >= 0; log E stays unconstrained
            out = torch.cat([out[:, :1], F.softplus(out[:, 1:])], dim=-1)
        return out
