"""The training domain (muongen.domain): recorded from batches, merged, and used to count
primaries a model never saw."""

from __future__ import annotations

import math

import numpy as np
import pytest

from muongen import domain as D


def cond(energy, zenith_deg, mass, depth):
    """Physical conditions (B, 4) from columns (broadcast)."""
    e, z, a, d = np.broadcast_arrays(energy, np.radians(zenith_deg), mass, depth)
    return np.column_stack([e, z, a, d]).astype(np.float64)


def trained():
    """E 1e5-1e9 GeV (log-uniform), zenith 0-60 deg, A 1/4/56, depth 1500-2500 m."""
    rng = np.random.default_rng(0)
    n = 20000
    return D.observe(
        cond(
            10 ** rng.uniform(5, 9, n),
            np.degrees(np.arccos(rng.uniform(0.5, 1.0, n))),
            rng.choice([1.0, 4.0, 56.0], n),
            rng.uniform(1500, 2500, n),
        )
    )


def test_observe_records_ranges_masses_and_occupancy():
    d = D.observe(cond([1e5, 1e7, 1e9], [0.0, 30.0, 60.0], [1, 4, 56], [1500, 2000, 2500]))
    assert d["events"] == 3
    assert d["log10_energy"] == pytest.approx([5.0, 9.0])
    assert d["cos_zenith"] == pytest.approx([0.5, 1.0])
    assert d["depth_m"] == [1500.0, 2500.0]
    assert d["masses"] == {"1": 1, "4": 1, "56": 1}
    occ = np.asarray(d["occupancy"])
    assert occ.shape == (D.N_ENERGY, D.N_COS) and occ.sum() == 3
    assert occ[4, 5] == 1  # 1e5 GeV (log10 E in [5, 6)), cos 1 (last bin)
    assert occ[8, 3] == 1  # 1e9 GeV, cos 0.5 (in [0.5, 0.667))


def test_merge_is_the_domain_of_the_union():
    a = cond([1e5, 1e6], [10.0, 20.0], [1, 1], [1500, 1500])
    b = cond([1e8], [50.0], [56], [2500])
    merged = D.merge(D.observe(a), D.observe(b))
    assert merged == D.observe(np.concatenate([a, b]))
    assert D.merge(None, D.observe(b)) == D.observe(b)
    assert D.merge(D.empty(), D.empty())["log10_energy"] is None


def test_outside_counts_each_reason():
    d = trained()
    probe = cond(
        [1e6, 1e4, 1e6, 1e6, 1e6, 1e10],
        [20.0, 20.0, 80.0, 20.0, 20.0, 20.0],
        [4, 4, 4, 200, 4, 4],
        [2000, 2000, 2000, 2000, 3000, 2000],
    )
    why = D.outside(d, probe)
    assert why["any"].tolist() == [False, True, True, True, True, True]
    assert why["energy"].tolist() == [False, True, False, False, False, True]
    assert why["zenith"][2] and why["mass"][3] and why["depth"][4]


def test_an_untrained_cell_inside_the_ranges_is_outside():
    """Two mixes: low energies at all zeniths, high energies only near the vertical; a high
    energy at 55 deg is inside every range but in a cell never trained on."""
    low = cond(10 ** np.linspace(5, 6.9, 50), np.linspace(0, 60, 50), 1, 2000)
    high = cond(10 ** np.linspace(7, 9, 50), np.linspace(0, 20, 50), 1, 2000)
    d = D.merge(D.observe(low), D.observe(high))
    why = D.outside(d, cond([1e8, 1e8, 1e6], [55.0, 10.0, 55.0], 1, 2000))
    assert why["cell"].tolist() == [True, False, False]
    assert not why["energy"].any() and not why["zenith"].any()


def test_a_point_on_the_edge_of_a_range_is_inside():
    d = D.observe(cond([1e5, 1e9], [0.0, 60.0], [1, 1], [1500, 1500]))
    # exactly the trained extremes, through float32 as the model's conditions go
    probe = cond([1e5, 1e9], [0.0, 60.0], 1, 1500).astype(np.float32)
    assert not D.outside(d, probe)["any"].any()


def test_report_line_counts_and_weight_fraction():
    d = trained()
    probe = cond([1e4, 1e6, 1e6, 1e6], [20.0, 20.0, 20.0, 20.0], 4, 2000)
    line, info = D.report(d, probe, weights=np.array([3.0, 1.0, 1.0, 1.0]))
    assert info["outside"] == 1 and info["fraction"] == 0.25
    assert info["weight_fraction"] == pytest.approx(0.5)
    assert line.startswith("warning: 1 of 4 primaries (25.0%, 50.0% of the total weight)")
    assert "\n" not in line and "energy 1" in line
    assert D.report(d, probe[1:])[0] is None  # all inside: nothing to say


def test_check_strict_refuses_and_warn_says_one_line():
    d = trained()
    probe = cond([1e4, 1e6], [20.0, 20.0], 4, 2000)
    said = []
    info = D.check(d, probe, "warn", say=said.append)
    assert info["outside"] == 1 and len(said) == 1
    with pytest.raises(D.DomainError, match=r"1 of 2 primaries .* --domain warn"):
        D.check(d, probe, "strict", say=said.append)
    said.clear()
    D.check(None, probe, "strict", say=said.append)  # unknown domain: said, not refused
    assert said and "records no training domain" in said[0]


def test_tracker_merges_ranks_and_resumes():
    """The trainer's part: each process folds in its batches; a checkpoint holds the union
    of every rank and of the checkpoint resumed; loading it and going on adds to it."""
    rank_batches = [cond([1e5], [10.0], [1], [1500]), cond([1e8], [50.0], [56], [2500])]
    trackers = [D.DomainTracker() for _ in rank_batches]
    for t, b in zip(trackers, rank_batches):
        t.update(b)
        t.gather = lambda own: [tr.own for tr in trackers]  # what all_gather_object gives
    state = trackers[0].state_dict()
    assert state == D.observe(np.concatenate(rank_batches))
    assert trackers[1].state_dict() == state
    again = D.DomainTracker()
    again.load_state_dict(state)
    assert again.state_dict() == state  # nothing counted twice
    again.update(cond([1e9], [0.0], [4], [2000]))
    assert again.state_dict()["events"] == 3
    assert again.state_dict()["log10_energy"] == pytest.approx([5.0, 9.0])
    again.reset()
    assert again.state_dict() == D.empty()


def test_describe_names_energy_zenith_depth_and_masses():
    text = D.describe(trained())
    assert text.startswith("E 1e+05-1e+09 GeV, zenith 0.") and "A 1, 4, 56" in text
    assert math.isclose(
        float(text.split("zenith ")[1].split("-")[1].split(" ")[0]), 60.0, abs_tol=0.5
    )
