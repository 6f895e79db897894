"""Invertible per-feature standardisation inside the models (the JetNet way).

The design's feature transforms (``muongen.schema``) are kept as the files' contract, but
they leave the networks badly conditioned: on the demo data log10(E / 1e6 GeV) has a
spread of ~1 while x / 500 m has ~0.013. A :class:`Standardiser` maps each feature to
z = (f(x) - mean) / std, with f the identity or, for strictly positive features (the
radial representation's r / 500 m), the natural log; ``inverse`` maps back exactly.

mean and std are buffers: they are fitted once from real data before training starts
(:func:`fit_normalisers`, called by the trainer on a fresh run) and then travel in the
models' ``state_dict`` and so in every checkpoint. An unfitted standardiser is the
identity map (mean 0, std 1), so a model built without data (benchmarks, unit tests)
works unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from muongen.data.batch import RaggedBatch

_MIN_STD = 1e-6
_LOG_FLOOR = 1e-30  # log() guard for a positive feature that rounds to 0


class Standardiser(nn.Module):
    """z = (f(x) - mean) / std per feature, f = log for ``log_features``, else identity.

    Args:
        n_features: F.
        log_features: indices of strictly positive features standardised in log space.
    """

    def __init__(self, n_features: int, log_features: Sequence[int] = ()) -> None:
        super().__init__()
        self.log_features = tuple(sorted(log_features))  # static: no device read per call
        mask = torch.zeros(n_features, dtype=torch.bool)
        mask[list(self.log_features)] = True
        self.register_buffer("log_mask", mask, persistent=False)
        self.register_buffer("mean", torch.zeros(n_features))
        self.register_buffer("std", torch.ones(n_features))
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))

    def _f(self, x: torch.Tensor) -> torch.Tensor:
        if not self.log_features:
            return x
        return torch.where(self.log_mask, torch.log(x.clamp(min=_LOG_FLOOR)), x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, F) features -> (N, F) standardised."""
        return (self._f(x) - self.mean.to(x.dtype)) / self.std.to(x.dtype)

    def inverse(self, z: torch.Tensor) -> torch.Tensor:
        """(N, F) standardised -> (N, F) features (log features come back positive)."""
        y = z * self.std.to(z.dtype) + self.mean.to(z.dtype)
        if not self.log_features:
            return y
        return torch.where(self.log_mask, torch.exp(y), y)

    @torch.no_grad()
    def fit(self, x: torch.Tensor) -> None:
        """Set mean and std from samples (N, F); a constant feature keeps std 1."""
        y = self._f(x.to(self.mean.device, torch.float64))
        if y.shape[0] == 0:
            return
        mean = y.mean(0)
        std = y.std(0, correction=0) if y.shape[0] > 1 else torch.ones_like(mean)
        std = torch.where(std > _MIN_STD, std, torch.ones_like(std))
        self.mean.copy_(mean)
        self.std.copy_(std)
        self.fitted.fill_(True)


def normalisers_fitted(module: nn.Module) -> bool:
    """Whether every :class:`Standardiser` of ``module`` has been fitted."""
    norms = [m for m in module.modules() if isinstance(m, Standardiser)]
    return bool(norms) and all(bool(m.fitted) for m in norms)


@torch.no_grad()
def fit_normalisers(generator: nn.Module, critic: nn.Module, batch: RaggedBatch) -> None:
    """Fit both models' condition and muon standardisers on real events (features units).

    The generator and the critic get the same statistics, so the critic sees generated
    muons in the generator's own standardised coordinates. Conditions are fitted over all
    events (empty ones too), muon features over all muons.
    """
    for model in (generator, critic):
        model.cond_norm.fit(batch.conditions)
        model.muon_norm.fit(batch.muons)
