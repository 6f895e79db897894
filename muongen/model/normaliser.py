"""Invertible per-feature standardisation inside the models (the JetNet way).

The design's feature transforms (``muongen.schema``) are kept as the files' contract, but
they leave the networks badly conditioned: on the demo data log10(E / 1e6 GeV) has a
spread of ~1 while x / 500 m has ~0.013. A :class:`Standardiser` maps each feature to
z = (f(x) - mean) / std, with f the identity, the natural log for strictly positive
features (the radial representation's r / 500 m), or asinh(x / scale) for the signed,
heavy-tailed x and y (``ModelConfig.lateral_transform``); ``inverse`` maps back exactly.
x and y can have their mean fixed at 0 (``ModelConfig.lateral_centred``).

mean and std are buffers: they are fitted once from real data before training starts
(:func:`fit_normalisers`, called by the trainer on a fresh run) and then travel in the
models' ``state_dict`` and so in every checkpoint. An unfitted standardiser is the
identity map (mean 0, std 1; asinh features: asinh(x), still invertible), so a model
built without data (benchmarks, unit tests) works unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from muongen import schema
from muongen.config import ModelConfig
from muongen.data.batch import RaggedBatch

_MIN_STD = 1e-6
_LOG_FLOOR = 1e-30  # log() guard for a positive feature that rounds to 0
_ASINH_BOUND = 20.0  # unfitted: sinh(20) ~ 2.4e8, far from float32 overflow
_ASINH_MARGIN = 2.0  # fitted bound = max |asinh(x / scale)| + this: up to ~7x the max |x|


class Standardiser(nn.Module):
    """z = (f(x) - mean) / std per feature, f chosen per feature (see the arguments).

    Args:
        n_features: F.
        log_features: indices of strictly positive features standardised in log space.
        asinh_features: indices of signed, heavy-tailed features (the muons' x and y)
            standardised as f(x) = asinh(x / scale), scale fitted as the median |x|: linear
            within the core, logarithmic in the tails. ``inverse`` clamps f to a margin
            past the fitted range so a stray generator output cannot reach sinh overflow.
        centred_features: indices whose mean is fixed at 0 rather than fitted (x and y,
            symmetric by construction as the azimuth is uniform: the generator gets no
            location to wander to); their std is the root mean square.
    """

    def __init__(
        self,
        n_features: int,
        log_features: Sequence[int] = (),
        asinh_features: Sequence[int] = (),
        centred_features: Sequence[int] = (),
    ) -> None:
        super().__init__()
        if set(log_features) & set(asinh_features):
            raise ValueError("a feature is either log or asinh standardised, not both")
        self.log_features = tuple(sorted(log_features))  # static: no device read per call
        self.asinh_features = tuple(sorted(asinh_features))
        self.centred_features = tuple(sorted(centred_features))
        for name, idx in (("log_mask", self.log_features), ("asinh_mask", self.asinh_features)):
            mask = torch.zeros(n_features, dtype=torch.bool)
            mask[list(idx)] = True
            self.register_buffer(name, mask, persistent=False)
        self.register_buffer("mean", torch.zeros(n_features))
        self.register_buffer("std", torch.ones(n_features))
        # asinh features: f(x) = asinh(x / scale), f clamped to +-bound on the way back
        self.register_buffer("scale", torch.ones(n_features))
        self.register_buffer("bound", torch.full((n_features,), _ASINH_BOUND))
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))

    def _f(self, x: torch.Tensor) -> torch.Tensor:
        if self.log_features:
            x = torch.where(self.log_mask, torch.log(x.clamp(min=_LOG_FLOOR)), x)
        if self.asinh_features:
            x = torch.where(self.asinh_mask, torch.asinh(x / self.scale.to(x.dtype)), x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, F) features -> (N, F) standardised."""
        return (self._f(x) - self.mean.to(x.dtype)) / self.std.to(x.dtype)

    def inverse(self, z: torch.Tensor) -> torch.Tensor:
        """(N, F) standardised -> (N, F) features (log features come back positive)."""
        y = z * self.std.to(z.dtype) + self.mean.to(z.dtype)
        if self.log_features:
            y = torch.where(self.log_mask, torch.exp(y), y)
        if self.asinh_features:
            bound = self.bound.to(z.dtype)
            lateral = torch.sinh(torch.maximum(torch.minimum(y, bound), -bound))
            y = torch.where(self.asinh_mask, lateral * self.scale.to(z.dtype), y)
        return y

    @torch.no_grad()
    def fit(self, x: torch.Tensor) -> None:
        """Set scale, mean and std from samples (N, F); a constant feature keeps std 1."""
        x = x.to(self.mean.device, torch.float64)
        if x.shape[0] == 0:
            return
        for i in self.asinh_features:
            scale = x[:, i].abs().median()
            self.scale[i] = scale if scale > _MIN_STD else 1.0
        y = self._f(x)
        mean = y.mean(0)
        mean[list(self.centred_features)] = 0.0
        std = (y - mean).square().mean(0).sqrt() if y.shape[0] > 1 else torch.ones_like(mean)
        std = torch.where(std > _MIN_STD, std, torch.ones_like(std))
        for i in self.asinh_features:
            self.bound[i] = y[:, i].abs().max() + _ASINH_MARGIN
        self.mean.copy_(mean)
        self.std.copy_(std)
        self.fitted.fill_(True)


#: the least cos(zenith) the slant depth divides by (87 degrees): the files' zenith stops
#: short of the horizon, and this keeps an odd row from an infinite feature
SLANT_MIN_COS = 0.05


class ConditionStandardiser(Standardiser):
    """The condition features (B, 4), with the slant depth appended when asked for.

    ``slant``: a fifth feature depth / cos(zenith) (km, cos clamped at SLANT_MIN_COS),
    computed from the features' depth / 1000 m and cos(zenith) before standardising, so
    every caller keeps passing the four condition features. Without it this is a plain
    :class:`Standardiser` of 4 features (the same buffers: old checkpoints load).
    """

    def __init__(self, slant: bool = False) -> None:
        super().__init__(schema.N_CONDITION + int(slant))
        self.slant = slant

    def extend(self, cond: torch.Tensor) -> torch.Tensor:
        """(B, 4) condition features -> (B, 4 or 5) inputs of the standardisation."""
        if not self.slant:
            return cond
        slant = cond[:, 3] / cond[:, 1].clamp(min=SLANT_MIN_COS)
        return torch.cat([cond, slant.unsqueeze(-1)], dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self.extend(x))

    def fit(self, x: torch.Tensor) -> None:
        super().fit(self.extend(x.to(self.mean.device, torch.float64)))


def condition_dim(cfg: ModelConfig) -> int:
    """How many standardised condition features the models' networks take."""
    return schema.N_CONDITION + int(cfg.slant_depth)


def muon_standardiser(cfg: ModelConfig) -> Standardiser:
    """The muon-feature standardiser the config asks for (the same for both models)."""
    n = schema.muon_feature_dim(cfg.representation)
    if cfg.representation == "radial":  # [log E, r]: r > 0 in log space
        return Standardiser(n, log_features=(1,))
    lateral = (1, 2)  # [log E, x, y]
    return Standardiser(
        n,
        asinh_features=lateral if cfg.lateral_transform == "asinh" else (),
        centred_features=lateral if cfg.lateral_centred else (),
    )


def normalisers_fitted(module: nn.Module) -> bool:
    """Whether every :class:`Standardiser` of ``module`` has been fitted."""
    norms = [m for m in module.modules() if isinstance(m, Standardiser)]
    return bool(norms) and all(bool(m.fitted) for m in norms)


@torch.no_grad()
def fit_normalisers(generator: nn.Module, critic: nn.Module, batch: RaggedBatch) -> None:
    """Fit both models' condition and muon standardisers on real events (features units).

    The generator and the critic get the same statistics, so the critic sees generated
    muons in the generator's own standardised coordinates. Conditions are fitted over all
    events (empty ones too), muon features over all muons; with ``model.energy_fold`` the
    generator also keeps the least muon energy as its floor.
    """
    for model in (generator, critic):
        model.cond_norm.fit(batch.conditions)
        model.muon_norm.fit(batch.muons)
        energy = getattr(model, "energy_norm", None)
        if energy is not None:
            ref = per_nucleon_energy(batch.conditions)
            ref = torch.repeat_interleave(ref, batch.counts, output_size=batch.muons.shape[0])
            energy.fit((batch.muons[:, 0] - ref).unsqueeze(-1))
    polar = getattr(generator, "polar_norm", None)
    if polar is not None:
        polar.fit(polar_features(batch.muons))
    floor = getattr(generator, "energy_floor", None)  # model.energy_fold: the threshold
    if floor is not None and batch.muons.shape[0]:
        floor.fill_(batch.muons[:, 0].min())


def per_nucleon_energy(cond: torch.Tensor) -> torch.Tensor:
    """(B, 4+) condition features -> (B,) log10(E0 / A / 1e6 GeV), the primary's energy per
    nucleon in the muons' energy feature units (``model.energy_reference: per_nucleon``)."""
    return cond[:, 0] - cond[:, 2]


#: polar_features' floor under r (x / 500 m units: 5 mm), so that a muon on the axis
#: does not drag the fitted mean and spread of log r
POLAR_MIN_R = 1e-5


def polar_features(muons: torch.Tensor) -> torch.Tensor:
    """(N, 3) [log E, x, y] features -> (N, 2) [log E, r], r = hypot(x, y) (>= POLAR_MIN_R)."""
    r = torch.hypot(muons[:, 1], muons[:, 2]).clamp(min=POLAR_MIN_R)
    return torch.stack([muons[:, 0], r], dim=1)
