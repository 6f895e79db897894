"""Quantile matching (optim.quantile_match): the grouped sorted distance and its groups."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import wasserstein_distance

from muongen.model.quantile_match import (
    condition_groups,
    event_features,
    grouped_w1,
    mean_over_groups,
)


def grouped_w1_sum(real, fake, group, keep=None):
    """The sum over the groups of :func:`grouped_w1`."""
    sums, _ = grouped_w1(real, fake, group, int(group.max()) + 1 if len(group) else 1, keep)
    return sums.sum()


def _reference(real, fake, group, groups):
    """Sum over groups and features of the group's muons times scipy's W1."""
    total = 0.0
    for k in groups:
        m = (group == k).numpy()
        for j in range(real.shape[1]):
            total += m.sum() * wasserstein_distance(real[m, j].numpy(), fake[m, j].numpy())
    return total


def test_the_sum_is_each_groups_w1_times_its_muons():
    g = torch.Generator().manual_seed(0)
    real = torch.randn(600, 3, generator=g)
    fake = 1.5 * torch.randn(600, 3, generator=g) + 0.2
    group = torch.randint(0, 4, (600,), generator=g)
    got = float(grouped_w1_sum(real, fake, group))
    assert got == pytest.approx(_reference(real, fake, group, range(4)), rel=1e-5)
    # one group is the pooled distance, which differs from the grouped one
    pooled = float(grouped_w1_sum(real, fake, torch.zeros_like(group)))
    assert pooled == pytest.approx(_reference(real, fake, group * 0, [0]), rel=1e-5)
    assert pooled != pytest.approx(got, rel=1e-3)


def test_muons_not_kept_are_left_out():
    g = torch.Generator().manual_seed(1)
    real, fake = torch.randn(400, 2, generator=g), torch.randn(400, 2, generator=g) * 3
    group = torch.randint(0, 3, (400,), generator=g)
    keep = group != 1
    got = float(grouped_w1_sum(real, fake, group, keep))
    assert got == pytest.approx(_reference(real, fake, group, [0, 2]), rel=1e-5)
    # a value far outside the clamp does not reorder the groups
    real2 = real.clone()
    real2[0, 0] = 1e6
    assert torch.isfinite(grouped_w1_sum(real2, fake, group, keep))


def test_equal_samples_score_zero_and_the_gradient_moves_fakes_to_the_real_ranks():
    g = torch.Generator().manual_seed(2)
    real = torch.randn(300, 2, generator=g)
    group = torch.randint(0, 2, (300,), generator=g)
    # the same values shuffled within each group: the sorted samples are equal
    perm = torch.arange(300)
    for k in range(2):
        idx = torch.nonzero(group == k).squeeze(-1)
        perm[idx] = idx[torch.randperm(len(idx), generator=g)]
    assert float(grouped_w1_sum(real, real[perm], group)) == pytest.approx(0.0, abs=1e-6)
    fake = (0.5 * torch.randn(300, 2, generator=g)).requires_grad_(True)
    before = float(grouped_w1_sum(real, fake.detach(), group))
    (grad,) = torch.autograd.grad(grouped_w1_sum(real, fake, group), fake)
    assert torch.all(grad.abs() == 1.0)  # d|a - b| / da for every muon and feature
    after = float(grouped_w1_sum(real, fake.detach() - 0.05 * grad, group))
    assert after < before


def test_an_empty_batch_gives_a_zero_that_still_has_a_graph():
    fake = torch.zeros(0, 3, requires_grad=True)
    out = grouped_w1_sum(torch.zeros(0, 3), fake, torch.zeros(0, dtype=torch.int64))
    assert float(out) == 0.0 and out.requires_grad


def test_groups_are_equal_slices_along_a_drawn_direction():
    cond = torch.randn(103, 4, generator=torch.Generator().manual_seed(3))
    a = condition_groups(cond, 4, torch.Generator().manual_seed(5))
    b = condition_groups(cond, 4, torch.Generator().manual_seed(5))
    c = condition_groups(cond, 4, torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.equal(a, c)
    sizes = np.bincount(a.numpy(), minlength=4)
    assert sizes.sum() == 103 and sizes.max() - sizes.min() <= 1
    # a slice: every event of group k lies below every event of group k + 1 along the
    # direction, which is the one the RNG draws first
    direction = torch.randn(4, generator=torch.Generator().manual_seed(5))
    proj = cond @ direction
    for k in range(3):
        assert proj[a == k].max() < proj[a == k + 1].min()
    assert torch.equal(condition_groups(cond, 1), torch.zeros(103, dtype=torch.int64))
    assert condition_groups(cond[:0], 4).shape == (0,)


def test_the_two_weighings():
    """groups: the mean of the groups' per-muon W1; muons: the pooled sum / all muons."""
    g = torch.Generator().manual_seed(4)
    group = torch.cat([torch.zeros(900, dtype=torch.int64), torch.ones(100, dtype=torch.int64)])
    real = torch.randn(1000, 1, generator=g)
    fake = torch.randn(1000, 1, generator=g)
    fake[900:] += 1.0  # only the small group is off
    sums, muons = grouped_w1(real, fake, group, 3)
    assert muons.tolist() == [900, 100, 0] and sums[2] == 0
    w = [wasserstein_distance(real[group == k, 0], fake[group == k, 0]) for k in (0, 1)]
    by_groups = float(mean_over_groups(sums, muons))
    assert by_groups == pytest.approx((w[0] + w[1]) / 2, rel=1e-5)  # the empty group left out
    by_muons = float(sums.sum() / muons.sum())
    assert by_muons == pytest.approx((900 * w[0] + 100 * w[1]) / 1000, rel=1e-5)
    assert by_groups > 2 * by_muons


def test_event_features_standardise_the_conditions_and_the_log_count():
    cond = torch.tensor([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]])
    x = event_features(cond, torch.tensor([0, 9, 99]))
    assert x.shape == (3, 3)
    assert torch.allclose(x.mean(0), torch.zeros(3), atol=1e-6)
    assert torch.allclose(x.std(0), torch.ones(3), atol=1e-4)
    assert x[2, 2] > x[1, 2] > x[0, 2]


def test_size_classes_are_the_evaluations_multiplicity_bins():
    from muongen.model.quantile_match import size_class

    counts = torch.tensor([0, 1, 2, 9, 10, 99, 100, 5000])
    assert size_class(counts).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
