"""Gradient penalty: the vectorised version equals the per-event reference; controls work."""

from __future__ import annotations

import pytest
import torch

from muongen.model import build_models
from muongen.model.penalty import gradient_penalty, reference_gradient_penalty

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
        # the penalty scores only the events with pairs, renumbered; their conditions
        # (distinct random rows here) say which events they are
        match = (scored_cond[:-1, None, :] == cond[None, :, :]).all(-1)  # (B' + 1 - 1, B)
        original = torch.where(match.any(1), match.float().argmax(1), -1)
        original = torch.cat([original, torch.tensor([-1])])  # the dummy event, last
        ev = original[ev]
        per_event = torch.zeros(len(cond), dtype=torch.int64)
        per_event.index_add_(0, ev[ev >= 0], torch.ones(int((ev >= 0).sum()), dtype=torch.int64))
        return x, per_event, ev


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


def test_max_pairs_above_the_total_changes_nothing():
    torch.manual_seed(0)
    _, critic = build_models(small_model_config())
    cond, real, rc, fake, fc, alpha = _pair_batch(7)
    pairs = int(torch.minimum(rc, fc).sum())
    full = gradient_penalty(critic, cond, real, rc, fake, fc, alpha=alpha)
    capped = gradient_penalty(critic, cond, real, rc, fake, fc, alpha=alpha, max_pairs=pairs + 1)
    torch.testing.assert_close(full, capped)


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
