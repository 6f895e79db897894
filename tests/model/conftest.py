"""Fixtures for model tests: small configs and random ragged batches in feature units."""

from __future__ import annotations

import pytest
import torch

from muongen.config import ModelConfig


def small_model_config(**changes) -> ModelConfig:
    """Narrow networks: the tests check wiring and maths, not capacity, so keep them fast."""
    base = dict(
        z_global=8,
        z_local=4,
        context=32,
        mult_hidden=[16, 16],
        local_hidden=[32, 16],
        critic_muon_hidden=[16, 32],
        critic_head_hidden=[32, 16],
        critic_local_width=8,
        critic_global_width=16,
    )
    base.update(changes)
    return ModelConfig(**base)


def seeded_draw(gen, cond: torch.Tensor, counts: torch.Tensor, seed: int = 5) -> torch.Tensor:
    """A generator's muons (N, F) for given conditions and counts, with fixed noise and no
    autograd: two generators of the same weights draw the same muons."""
    with torch.no_grad():
        return gen.generate_with_counts(cond, counts, generator=torch.Generator().manual_seed(seed))


def random_counts(b: int, gen: torch.Generator, max_count: int = 6, empty: float = 0.3):
    """(b,) int64 counts in [0, max_count] with about ``empty`` of them zero."""
    counts = torch.randint(1, max_count + 1, (b,), generator=gen)
    return torch.where(torch.rand(b, generator=gen) < empty, 0, counts)


@pytest.fixture
def ragged():
    """Factory of random (cond (B, 4), muons (N, F), counts (B,)) with empty events."""

    def make(b: int = 12, n_features: int = 3, seed: int = 0, max_count: int = 6, empty=0.3):
        gen = torch.Generator().manual_seed(seed)
        counts = random_counts(b, gen, max_count, empty)
        cond = torch.randn(b, 4, generator=gen)
        muons = torch.randn(int(counts.sum()), n_features, generator=gen)
        return cond, muons, counts

    return make
