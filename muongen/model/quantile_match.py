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


def condition_groups(
    cond: torch.Tensor, n_groups: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """(B,) the group of each event: its rank along a random direction of ``cond``.

    Args:
        cond: (B, C) standardised conditions.
        n_groups: groups of about B / n_groups events each (1: one group).
        generator: the RNG of the direction (None: the global one).

    Returns:
        (B,) int64 in [0, n_groups).
    """
    b = cond.shape[0]
    if n_groups <= 1 or b == 0:
        return torch.zeros(b, dtype=torch.int64, device=cond.device)
    kw = {} if generator is None else {"generator": generator}
    direction = torch.randn(cond.shape[1], device=cond.device, dtype=torch.float32, **kw)
    rank = torch.empty(b, dtype=torch.int64, device=cond.device)
    order = torch.argsort(cond.detach().float() @ direction)
    rank[order] = torch.arange(b, device=cond.device)
    return rank * n_groups // b


def grouped_w1_sum(
    real: torch.Tensor,
    fake: torch.Tensor,
    muon_group: torch.Tensor,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sum over features and muons of |sorted fake - sorted real| within each group.

    Divided by the muons, this is the sum over features of the pooled W1 distances,
    each group weighted by its muons. Real and fake must hold the same number of muons
    per group (true with the real counts: the same events, the same counts).

    Args:
        real: (N, F) real muons (no gradient needed).
        fake: (N, F) fake muons, the same events in the same layout.
        muon_group: (N,) int64 the group of each muon's event.
        keep: (N,) bool, muons that count (None: all); the others form a group of their
            own (larger than every group) whose terms are dropped.

    Returns:
        0-d sum (float32), differentiable in ``fake``.
    """
    if real.shape[0] == 0:
        return fake.sum() * 0.0
    group = muon_group
    if keep is not None:
        group = torch.where(keep, group, group.max() + 1)
    offset = (group.double() * (4.0 * KEY_CLAMP)).unsqueeze(-1)  # (N, 1)

    def ordered(x: torch.Tensor) -> torch.Tensor:
        key = offset + x.detach().double().clamp(-KEY_CLAMP, KEY_CLAMP)
        return torch.gather(x.float(), 0, torch.argsort(key, dim=0))

    diff = (ordered(fake) - ordered(real)).abs()  # (N, F), row i: rank i of both
    if keep is not None:
        # the dropped group sorts last in both (the same rows, the same count)
        diff = torch.where(torch.sort(group).values.unsqueeze(-1) <= muon_group.max(), diff, 0.0)
    return diff.sum()
