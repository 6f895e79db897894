"""Quantile matching: the generator's exact one-dimensional Wasserstein term per slice.

The critics estimate the Wasserstein distance through a trained network, and what a
network underfits first is the tails: on muon-rich data the pooled per-muon energies of
the richest bundles stayed 1.3-1.8x the floor with both critics (docs/fidelity.md). In one
dimension the distance needs no network: W1 between two samples of equal size is the mean
distance between their sorted values, and its gradient moves each fake value towards the
real value of the same rank, the tails' included.

With the real counts (``train.fake_counts: real``) a batch's fake muons sit in the same
events as its real ones, so any set of events holds as many fake muons as real ones. The
term (``optim.quantile_match``) cuts the scored events into ``optim.quantile_match_groups``
groups of about equal size along a direction of the standardised condition drawn afresh
at every step (a random slice of the condition space: over the steps every region is
cut), and in each group compares, feature by feature of the critic's input space, the
sorted real and sorted fake muons. Each muon counts alike, as in the pooled and binned
per-muon spectra that ``muongen evaluate`` scores and a detector sees. A group pools
many events, so the term asks only that the mixture over their conditions be right, which
a faithful generator meets whatever the fluctuations from bundle to bundle: it never pulls
a bundle towards a particular real one.
"""

from __future__ import annotations

import torch

#: the sort key's spacing between groups: a feature's standardised value is clamped to
#: +-KEY_CLAMP, so the groups never overlap in the key (float64: exact to ~1e-13)
KEY_CLAMP = 100.0


#: the bundle-size classes of ``optim.quantile_match_sizes`` (those of ``muongen
#: evaluate``'s within-bundle metrics): 1, 2-9, 10-99, 100+ muons
SIZE_EDGES = (2, 10, 100)


def size_class(counts: torch.Tensor) -> torch.Tensor:
    """(B,) int64 class of each bundle's size: 0 for 1 muon (or none), 1 for 2-9, 2 for
    10-99, 3 for 100+ (:data:`SIZE_EDGES`)."""
    edges = torch.tensor(SIZE_EDGES, dtype=counts.dtype, device=counts.device)
    return torch.bucketize(counts, edges, right=True)


def event_features(cond: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """(B, C + 1) what the groups slice: the conditions and log(1 + N), each column
    standardised over the batch (so a random direction weighs them alike)."""
    x = torch.cat([cond.detach().float(), torch.log1p(counts.float()).unsqueeze(-1)], -1)
    if x.shape[0] < 2:
        return x
    return (x - x.mean(0)) / (x.std(0) + 1e-6)


def condition_groups(
    features: torch.Tensor, n_groups: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """(B,) the group of each event: its rank along a random direction of ``features``.

    Args:
        features: (B, C) the events' features (:func:`event_features`).
        n_groups: groups of about B / n_groups events each (1: one group).
        generator: the RNG of the direction (None: the global one).

    Returns:
        (B,) int64 in [0, n_groups).
    """
    b = features.shape[0]
    if n_groups <= 1 or b == 0:
        return torch.zeros(b, dtype=torch.int64, device=features.device)
    kw = {} if generator is None else {"generator": generator}
    direction = torch.randn(features.shape[1], device=features.device, dtype=torch.float32, **kw)
    rank = torch.empty(b, dtype=torch.int64, device=features.device)
    order = torch.argsort(features.detach().float() @ direction)
    rank[order] = torch.arange(b, device=features.device)
    return rank * n_groups // b


def grouped_w1(
    real: torch.Tensor,
    fake: torch.Tensor,
    muon_group: torch.Tensor,
    n_groups: int,
    keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group, the sum over its muons and the features of |sorted fake - sorted real|.

    Divided by the group's muons this is the sum over features of the group's pooled W1
    distances. Real and fake must hold the same number of muons per group (true with the
    real counts: the same events, the same counts).

    Args:
        real: (N, F) real muons (no gradient needed).
        fake: (N, F) fake muons, the same events in the same layout.
        muon_group: (N,) int64 in [0, n_groups), the group of each muon's event.
        n_groups: the number of groups.
        keep: (N,) bool, muons that count (None: all); the others form a group of their
            own (n_groups) whose terms are dropped.

    Returns:
        (n_groups,) sums (float32, differentiable in ``fake``) and (n_groups,) int64
        muons per group.
    """
    group = muon_group if keep is None else torch.where(keep, muon_group, n_groups)
    offset = (group.double() * (4.0 * KEY_CLAMP)).unsqueeze(-1)  # (N, 1)

    def ordered(x: torch.Tensor) -> torch.Tensor:
        key = offset + x.detach().double().clamp(-KEY_CLAMP, KEY_CLAMP)
        return torch.gather(x.float(), 0, torch.argsort(key, dim=0))

    diff = (ordered(fake) - ordered(real)).abs().sum(-1)  # (N,), row i: rank i of both
    sorted_group = torch.sort(group).values  # the group of each rank (both samples)
    sums = diff.new_zeros(n_groups + 1).index_add_(0, sorted_group, diff)
    # index_add, not bincount: bincount reads the largest group back (a sync on a GPU)
    muons = torch.zeros(n_groups + 1, dtype=torch.int64, device=group.device)
    muons.index_add_(0, sorted_group, torch.ones_like(sorted_group))
    return sums[:n_groups], muons[:n_groups]


def mean_over_groups(sums: torch.Tensor, muons: torch.Tensor) -> torch.Tensor:
    """The mean over the groups with muons of each group's per-muon distance
    (:func:`grouped_w1`'s outputs): every group alike, however few its muons."""
    has = muons > 0
    per_group = sums / muons.clamp(min=1)
    return torch.where(has, per_group, 0.0).sum() / has.sum().clamp(min=1)
