"""Gradient penalty: the vectorised version equals the per-event reference; controls work."""

from __future__ import annotations

import pytest
import torch

from muongen.model import build_models
from muongen.model.penalty import (
    draw_pairs,
    gradient_penalty,
    pair_count,
    reference_gradient_penalty,
)

from .conftest import random_counts, small_model_config


class SpyCritic(torch.nn.Module):
    """Wraps a critic and records the interpolated sets it is asked to score."""

    def __init__(self, critic):
        super().__init__()
        self.critic = critic
        self.calls = []

    def forward(self, muons, cond, counts, event_index=None):
        self.calls.append((muons.detach().clone(), counts.clone(), event_index, cond.clone()))
        return self.critic(muons, cond, counts, event_index)

    def last_call(self, cond):
        """The last scored set in the numbering of the caller's events ``cond`` (B, 4):
        rows (M, F), pairs per event (B,), and each row's event (-1: the dummy event)."""
        x, _, ev, scored_cond = self.calls[-1]
        original = _events_of(scored_cond[:-1], cond)
        original = torch.cat([original, torch.tensor([-1])])  # the dummy event, last
        ev = original[ev]
        per_event = torch.zeros(len(cond), dtype=torch.int64)
        per_event.index_add_(0, ev[ev >= 0], torch.ones(int((ev >= 0).sum()), dtype=torch.int64))
        return x, per_event, ev

    def last_reference_call(self, cond):
        """(B,) the pairs per event of the last call by the reference, which hands the
        scored events' conditions and counts (no dummy event, no event index)."""
        _, counts, _, scored_cond = self.calls[-1]
        per_event = torch.zeros(len(cond), dtype=torch.int64)
        per_event[_events_of(scored_cond, cond)] = counts
        return per_event


def _events_of(scored_cond: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
    """(B',) which of the caller's events ``cond`` (B, 4) each scored event is (-1: none).
    The penalty scores only the events with pairs, renumbered; their conditions (distinct
    random rows here) say which events they are."""
    match = (scored_cond[:, None, :] == cond[None, :, :]).all(-1)  # (B', B)
    return torch.where(match.any(1), match.float().argmax(1), -1)


def _pair_batch(seed: int, b: int = 24, n_features: int = 3):
    gen = torch.Generator().manual_seed(seed)
    real_counts = random_counts(b, gen, max_count=7, empty=0.3)
    fake_counts = random_counts(b, gen, max_count=7, empty=0.3)
    cond = torch.randn(b, 4, generator=gen)
    real = torch.randn(int(real_counts.sum()), n_features, generator=gen)
    fake = torch.randn(int(fake_counts.sum()), n_features, generator=gen)
    alpha = torch.rand(b, generator=gen)
    return cond, real, real_counts, fake, fake_counts, alpha


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("norm", ["muon", "event"])
@pytest.mark.parametrize(
    "critic_cfg",
    [
        dict(critic="pointnet", pooling="amax"),
        dict(critic="pointnet", pooling="mean"),
        dict(critic="epic", critic_global_width=24),
    ],
    ids=["amax", "mean", "epic"],
)
@pytest.mark.parametrize("exact", [True, False], ids=["exact", "padded"])
def test_vectorised_equals_reference(seed, norm, critic_cfg, exact, monkeypatch):
    """Also with the events that have pairs padded to min(B, pairs) as on an accelerator
    (``exact=False``; on the CPU their number is read exactly)."""
    import muongen.model.penalty as penalty

    kept = penalty.events_with_muons
    monkeypatch.setattr(penalty, "events_with_muons", lambda c, n: kept(c, n, exact=exact))
    torch.manual_seed(seed)
    _, critic = build_models(small_model_config(**critic_cfg))
    cond, real, rc, fake, fc, alpha = _pair_batch(seed)
    # the batch must hold the edge cases: no real muons, no fake muons, both, neither
    assert ((rc == 0) & (fc > 0)).any() and ((fc == 0) & (rc > 0)).any()
    assert ((rc > 0) & (fc > 0) & (rc != fc)).any()

    fast = gradient_penalty(critic, cond, real, rc, fake, fc, norm=norm, alpha=alpha)
    slow = reference_gradient_penalty(critic, cond, real, rc, fake, fc, norm=norm, alpha=alpha)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-6)
    assert fast.item() > 0

    # and so are their gradients with respect to the critic's parameters
    g_fast = torch.autograd.grad(fast, list(critic.parameters()), allow_unused=True)
    g_slow = torch.autograd.grad(slow, list(critic.parameters()), allow_unused=True)
    for a, b in zip(g_fast, g_slow):
        if a is None or b is None:
            assert a is None or not a.any()
            assert b is None or not b.any()
        else:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("norm", ["muon", "event"])
def test_padded_events_with_pairs_equal_the_reference(norm, monkeypatch):
    """Fewer muons than events: on an accelerator the events with pairs are padded to
    min(B, muons) rows (count 0, condition of row 0), and the dummy event follows them."""
    import muongen.model.penalty as penalty

    kept = penalty.events_with_muons
    seen = []

    def padded(counts, n):
        rows, c = kept(counts, n, exact=False)
        seen.append((rows, c))
        return rows, c

    monkeypatch.setattr(penalty, "events_with_muons", padded)
    torch.manual_seed(0)
    _, critic = build_models(small_model_config())
    b = 30
    rc = torch.zeros(b, dtype=torch.int64)
    fc = torch.zeros(b, dtype=torch.int64)
    rc[[2, 5, 9, 20, 27]] = torch.tensor([3, 1, 2, 4, 2])
    fc[[2, 9, 11, 20, 27]] = torch.tensor([1, 3, 2, 1, 5])  # event 5: real muons, no fake
    cond, alpha = torch.randn(b, 4), torch.rand(b)
    real, fake = torch.randn(int(rc.sum()), 3), torch.randn(int(fc.sum()), 3)
    fast = gradient_penalty(critic, cond, real, rc, fake, fc, norm=norm, alpha=alpha)
    slow = reference_gradient_penalty(critic, cond, real, rc, fake, fc, norm=norm, alpha=alpha)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-6)
    rows, counts = seen[-1]
    assert len(rows) == int(rc.sum()) < b  # padded to the muon count, not B
    assert int((counts > 0).sum()) == 4 and (counts[4:] == 0).all()  # 4 events, then padding


@pytest.mark.parametrize("by", ["muons", "events"])
def test_max_pairs_above_the_total_changes_nothing(by):
    torch.manual_seed(0)
    _, critic = build_models(small_model_config())
    cond, real, rc, fake, fc, alpha = _pair_batch(7)
    pairs = int(torch.minimum(rc, fc).sum())
    full = gradient_penalty(critic, cond, real, rc, fake, fc, alpha=alpha)
    capped = gradient_penalty(
        critic, cond, real, rc, fake, fc, alpha=alpha, max_pairs=pairs + 1, by=by
    )
    torch.testing.assert_close(full, capped)
    ref = reference_gradient_penalty(
        critic, cond, real, rc, fake, fc, alpha=alpha, max_pairs=pairs + 1, by=by
    )
    torch.testing.assert_close(ref, full, rtol=1e-5, atol=1e-6)


def _whole_events_but_one(per_event: torch.Tensor, pairs: torch.Tensor) -> bool:
    """Every event in the draw has all its ``pairs`` but at most one, which has fewer."""
    drawn = per_event > 0
    return bool((per_event <= pairs).all()) and int((per_event[drawn] < pairs[drawn]).sum()) <= 1


@pytest.mark.parametrize("max_pairs", [1, 5, 20, 50])
def test_the_pairs_drawn_by_events_are_whole_events(max_pairs):
    """By events, the penalty scores whole events and cuts at most one, in the
    vectorised penalty, in the reference and in the pairs drawn ahead."""
    torch.manual_seed(0)
    _, critic = build_models(small_model_config())
    spy = SpyCritic(critic)
    cond, real, rc, fake, fc, _ = _pair_batch(3, b=40)
    k = torch.minimum(rc, fc)
    ev = torch.repeat_interleave(torch.arange(len(rc)), rc)
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        gradient_penalty(
            spy, cond, real, rc, fake, fc, max_pairs=max_pairs, by="events", generator=gen
        )
        _, per_event, _ = spy.last_call(cond)
        assert int(per_event.sum()) == min(max_pairs, int(k.sum()))
        assert _whole_events_but_one(per_event, k)
        reference_gradient_penalty(
            spy, cond, real, rc, fake, fc, max_pairs=max_pairs, by="events", generator=gen
        )
        per_event = spy.last_reference_call(cond)
        assert int(per_event.sum()) == min(max_pairs, int(k.sum()))
        assert _whole_events_but_one(per_event, k)
        slots = draw_pairs(rc, fc, max_pairs=max_pairs, by="events", generator=gen)
        ahead = torch.zeros(len(rc), dtype=torch.int64).index_add_(
            0, ev[slots], torch.ones(len(slots), dtype=torch.int64)
        )
        assert int(ahead.sum()) == min(max_pairs, int(k.sum()))
        assert _whole_events_but_one(ahead, k)


@pytest.mark.parametrize("by", ["muons", "events"])
def test_each_pair_is_drawn_with_the_same_probability(by):
    """Both draws take each valid pair with probability max_pairs / valid pairs: by
    events too (a uniform order of the events, the cut one's pairs in a random order)."""
    _, _, rc, _, fc, _ = _pair_batch(5, b=30)
    ev = torch.repeat_interleave(torch.arange(len(rc)), rc)
    rank = torch.arange(len(ev)) - (torch.cumsum(rc, 0) - rc)[ev]
    valid = (rank < torch.minimum(rc, fc)[ev]).nonzero().squeeze(1)
    draws, max_pairs = 4000, 20
    seen = torch.zeros(len(ev))
    for i in range(draws):
        gen = torch.Generator().manual_seed(i)
        seen[draw_pairs(rc, fc, max_pairs=max_pairs, by=by, generator=gen)] += 1
    p = max_pairs / len(valid)
    sd = (p * (1 - p) / draws) ** 0.5
    freq = seen[valid] / draws
    assert seen.sum() == draws * max_pairs and (seen[valid] > 0).all()
    assert (freq - p).abs().max() < 5 * sd  # each pair's frequency within 5 sigma of p


def test_an_unknown_draw_is_an_error():
    _, critic = build_models(small_model_config())
    cond, real, rc, fake, fc, _ = _pair_batch(1)
    with pytest.raises(ValueError, match="draw 'pairs'"):
        gradient_penalty(critic, cond, real, rc, fake, fc, max_pairs=3, by="pairs")
    with pytest.raises(ValueError, match="draw 'pairs'"):
        draw_pairs(rc, fc, max_pairs=3, by="pairs")


@pytest.mark.parametrize("max_pairs", [1, 5, 20])
def test_max_pairs_caps_the_interpolated_set(max_pairs):
    torch.manual_seed(0)
    _, critic = build_models(small_model_config())
    spy = SpyCritic(critic)
    cond, real, rc, fake, fc, _ = _pair_batch(3)
    k = torch.minimum(rc, fc)
    gradient_penalty(spy, cond, real, rc, fake, fc, max_pairs=max_pairs)
    _, counts, _ = spy.last_call(cond)
    assert int(counts.sum()) == min(max_pairs, int(k.sum()))
    assert (counts <= k).all()  # never more pairs than an event has
    # only the events with pairs are scored, plus the dummy event
    assert len(spy.calls[-1][1]) == int((counts > 0).sum()) + 1


def test_interpolation_stays_within_each_event():
    """alpha = 1 puts the real muons of the pairs in the set: they must be each event's own."""
    torch.manual_seed(0)
    _, critic = build_models(small_model_config())
    spy = SpyCritic(critic)
    cond, real, rc, fake, fc, _ = _pair_batch(4)
    b = len(rc)
    ones = torch.ones(b)
    for permute in (False, True):
        gradient_penalty(spy, cond, real, rc, fake, fc, alpha=ones, permute=permute)
        x, _, ev = spy.last_call(cond)
        starts = torch.cumsum(rc, 0) - rc
        for i in range(b):
            mine = x[ev == i]
            assert len(mine) == min(int(rc[i]), int(fc[i]))
            own = real[int(starts[i]) : int(starts[i]) + int(rc[i])]
            for row in mine:  # each interpolated muon is one of the event's real muons
                assert (own == row).all(-1).any()
            if not permute:
                torch.testing.assert_close(mine, own[: len(mine)])


def test_fraction_drops_events():
    torch.manual_seed(0)
    _, critic = build_models(small_model_config())
    spy = SpyCritic(critic)
    gen = torch.Generator().manual_seed(0)
    b = 400
    counts = random_counts(b, gen, empty=0.0)
    cond, muons = torch.randn(b, 4), torch.randn(int(counts.sum()), 3)
    gradient_penalty(spy, cond, muons, counts, muons, counts, fraction=0.25)
    used = int((spy.last_call(cond)[1] > 0).sum())
    assert 60 < used < 140  # about a quarter of 400 events


def test_no_pairs_gives_zero():
    torch.manual_seed(0)
    _, critic = build_models(small_model_config())
    b = 5
    cond = torch.randn(b, 4)
    zero = torch.zeros(b, dtype=torch.int64)
    none = torch.zeros(0, 3)
    for fn in (gradient_penalty, reference_gradient_penalty):
        assert fn(critic, cond, none, zero, none, zero).item() == 0.0  # all-empty batch
        some = torch.tensor([0, 2, 0, 1, 0])
        other = torch.tensor([3, 0, 0, 0, 1])  # no event has both
        gp = fn(critic, cond, torch.randn(3, 3), some, torch.randn(4, 3), other)
        assert gp.item() == 0.0
    empty_batch = torch.zeros(0, 4)
    e = torch.zeros(0, dtype=torch.int64)
    assert gradient_penalty(critic, empty_batch, none, e, none, e).item() == 0.0


@pytest.mark.parametrize("max_pairs", [0, 1, 9, 1000])
def test_pairs_drawn_ahead_are_a_uniform_subset_of_the_valid_ones(max_pairs):
    _, _, rc, _, fc, _ = _pair_batch(5)
    ev = torch.repeat_interleave(torch.arange(len(rc)), rc)
    rank = torch.arange(len(ev)) - (torch.cumsum(rc, 0) - rc)[ev]
    valid = (rank < torch.minimum(rc, fc)[ev]).nonzero().squeeze(1)
    seen = torch.zeros(len(ev))
    for i in range(300):
        slots = draw_pairs(rc, fc, max_pairs=max_pairs, generator=torch.Generator().manual_seed(i))
        assert len(slots) == (min(max_pairs, len(valid)) if max_pairs else len(valid))
        assert (slots.diff() > 0).all() and torch.isin(slots, valid).all()
        seen[slots] += 1
    if max_pairs == 9:  # each valid pair drawn with probability 9 / valid: none left out
        assert (seen[valid] > 0).all() and seen.sum() == 300 * 9


@pytest.mark.parametrize("norm", ["muon", "event"])
def test_parts_of_a_batch_sum_to_its_penalty_with_the_pairs_drawn_ahead(norm):
    """Cut into runs of events, each scored with its own slots and the whole batch's count,
    the parts' penalties (and their gradients) sum to the whole batch's for the same draw;
    without a drawn set, the penalty with all pairs and slots of all pairs agree."""
    torch.manual_seed(0)
    _, critic = build_models(small_model_config(critic="epic", critic_global_width=24))
    cond, real, rc, fake, fc, alpha = _pair_batch(6, b=40)
    every = draw_pairs(rc, fc)
    torch.testing.assert_close(
        gradient_penalty(critic, cond, real, rc, fake, fc, norm=norm, alpha=alpha, slots=every),
        gradient_penalty(critic, cond, real, rc, fake, fc, norm=norm, alpha=alpha),
    )
    slots = draw_pairs(rc, fc, max_pairs=25, generator=torch.Generator().manual_seed(1))
    count = pair_count(slots, rc, norm)
    ev = torch.repeat_interleave(torch.arange(len(rc)), rc)
    assert count == (25 if norm == "muon" else len(torch.unique(ev[slots])))

    def grads(gp):
        return torch.autograd.grad(gp, list(critic.parameters()), allow_unused=True)

    whole = gradient_penalty(critic, cond, real, rc, fake, fc, norm=norm, alpha=alpha, slots=slots)
    parts, part_grads = [], []
    for a, b in ((0, 13), (13, 29), (29, 40)):
        r0, r1 = int(rc[:a].sum()), int(rc[:b].sum())
        f0, f1 = int(fc[:a].sum()), int(fc[:b].sum())
        mine = slots[(slots >= r0) & (slots < r1)] - r0
        gp = gradient_penalty(
            critic, cond[a:b], real[r0:r1], rc[a:b], fake[f0:f1], fc[a:b],
            norm=norm, alpha=alpha[a:b], slots=mine, denominator=count,
        )  # fmt: skip
        parts.append(gp.detach())
        if gp.requires_grad:
            part_grads.append(grads(gp))
    torch.testing.assert_close(sum(parts), whole.detach(), rtol=1e-5, atol=1e-6)
    for w, *ps in zip(grads(whole), *part_grads):
        got = sum(p for p in ps if p is not None)
        torch.testing.assert_close(got, w, rtol=1e-4, atol=1e-6)
