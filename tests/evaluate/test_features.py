"""Event observables on a hand-made ragged batch, and ragged selection."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from muongen.data.batch import RaggedBatch
from muongen.evaluate.features import EventSample, event_observables, muon_rows, shower_groups

# 3 events: two muons, none, one muon
COND = np.array([[1e6, 0.0, 1.0, 1500.0], [1e7, 0.5, 4.0, 2000.0], [1e5, 0.2, 56.0, 2500.0]])
MUONS = np.array([[100.0, 3.0, 4.0], [10.0, 0.0, 1.0], [1000.0, 6.0, 8.0]])
COUNTS = np.array([2, 0, 1])


def test_event_observables_by_hand():
    ev = event_observables(MUONS, COUNTS)
    assert ev["multiplicity"] == pytest.approx(np.log10([3.0, 1.0, 2.0]))
    assert ev["log10_total_energy"][0] == pytest.approx(np.log10(110.0))
    assert ev["log10_leading_energy"][0] == pytest.approx(2.0)
    assert ev["mean_radius"][0] == pytest.approx((5.0 + 1.0) / 2)
    assert ev["log10_total_energy"][2] == pytest.approx(3.0)
    assert ev["mean_radius"][2] == pytest.approx(10.0)
    for k in ("log10_total_energy", "log10_leading_energy", "mean_radius"):
        assert math.isnan(ev[k][1])  # no muons: undefined
    with pytest.raises(ValueError, match="sum"):
        event_observables(MUONS, np.array([1, 1, 0]) * 0)


def test_event_sample_from_batch_matches_arrays_and_rebuilds_muons():
    batch = RaggedBatch.from_numpy(COND, MUONS, COUNTS)
    s = EventSample.from_batch(batch)
    assert s.n_events == 3 and s.n_muons == 3
    assert s.muon["radius"] == pytest.approx([5.0, 1.0, 10.0])
    assert s.muon["bundle_size"].tolist() == [2, 2, 1]  # each muon's event multiplicity
    assert s.physical_muons() == pytest.approx(MUONS, rel=1e-6)
    assert s.condition("log10_energy") == pytest.approx([6.0, 7.0, 5.0])
    assert s.condition("cos_zenith")[0] == pytest.approx(1.0)
    assert s.muon_condition("depth").tolist() == [1500.0, 1500.0, 2500.0]
    assert s.event_matrix().shape == (2, 4)  # the empty event has no event features
    with pytest.raises(ValueError, match="unknown condition"):
        s.condition("nope")


def test_take_selects_events_with_their_muons_like_ragged_batch_select():
    s = EventSample.from_arrays(COND, MUONS, COUNTS)
    t = s.take(np.array([2, 0, 0, 1]))
    assert t.counts.tolist() == [1, 2, 2, 0]
    assert t.muon["log10_energy"].tolist() == pytest.approx([3.0, 2.0, 1.0, 2.0, 1.0])
    ref = RaggedBatch.from_numpy(COND, MUONS, COUNTS).select(torch.tensor([2, 0, 0, 1]))
    assert t.physical_muons() == pytest.approx(ref.muons.numpy(), rel=1e-6)
    m = s.take(np.array([False, True, True]))
    assert m.counts.tolist() == [0, 1] and m.n_muons == 1
    assert muon_rows(COUNTS, np.array([], dtype=np.int64)).size == 0


def test_shower_groups_join_consecutive_rows_of_one_primary():
    cond = np.array(
        [[1e6, 0.1, 1, 1000], [1e6, 0.1, 1, 1100], [2e6, 0.1, 1, 1000], [1e6, 0.1, 1, 1000]]
    )
    assert shower_groups(cond).tolist() == [0, 0, 1, 2]
    s = EventSample.from_arrays(cond, np.zeros((0, 3)), np.zeros(4, int)).with_groups(
        shower_groups(cond)
    )
    assert s.take(np.array([3, 0])).groups.tolist() == [2, 0]
    with pytest.raises(ValueError):
        s.with_groups(np.zeros(3))
