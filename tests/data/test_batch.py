"""Microbatching: sum(counts) bounded, events never split, order and content preserved."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from muongen.data.batch import RaggedBatch


@pytest.mark.parametrize("max_muons", [1, 7, 50, 10_000])
def test_split_by_muons_bounds_each_part(make_batch, max_muons):
    counts = np.random.default_rng(1).geometric(0.2, 300) - 1
    counts[17] = 120  # one event larger than small bounds
    batch = make_batch(counts)
    batch.keys = torch.arange(batch.n_events)
    parts = batch.split_by_muons(max_muons)
    for p in parts:
        assert int(p.counts.sum()) <= max_muons or p.n_events == 1  # a lone oversized event
    whole = RaggedBatch.concat(parts)
    for name in ("conditions", "muons", "counts", "keys"):
        assert torch.equal(getattr(whole, name), getattr(batch, name))
    if max_muons >= 120:
        # greedy: no two neighbouring parts could have been merged
        sums = [int(p.counts.sum()) for p in parts]
        assert all(a + b > max_muons for a, b in itertools.pairwise(sums))
