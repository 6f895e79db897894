"""Split first layers and segment pooling: the same numbers as the plain formulas."""

from __future__ import annotations

import pytest
import torch

from muongen.model import build_models, pooling
from muongen.model.critic import event_index_of
from muongen.model.generator import events_with_muons
from muongen.model.layers import narrow_linear, split_linear
from muongen.model.penalty import gradient_penalty
from muongen.model.pooling import (
    WIDE_INDEX_MAX,
    _no_ties,
    rows_of,
    segment_max,
    segment_mean,
    segment_sum,
    wide_index,
)

from .conftest import random_counts, small_model_config


def test_split_linear_equals_the_unsplit_layer():
    gen = torch.Generator().manual_seed(0)
    counts = random_counts(50, gen, max_count=9)
    n = int(counts.sum())
    linear = torch.nn.Linear(64 + 16, 32).double()
    per_event = torch.randn(50, 64, generator=gen, dtype=torch.float64)
    per_muon = torch.randn(n, 16, generator=gen, dtype=torch.float64)
    index = event_index_of(counts, n)
    plain = linear(torch.cat([per_event[index], per_muon], -1))
    torch.testing.assert_close(split_linear(linear, per_event, per_muon, counts), plain)
    torch.testing.assert_close(split_linear(linear, per_event, per_muon, counts, index), plain)
    # float32, as trained: the same to rounding
    f32 = split_linear(linear.float(), per_event.float(), per_muon.float(), counts)
    assert (f32.double() - plain).abs().max() < 1e-5


def test_split_linear_gradients_equal_the_unsplit_layer_to_second_order():
    """split_linear accumulates in place into the gathered rows: autograd must see the
    same function (first and second derivatives, as the critic's penalty takes them)."""
    gen = torch.Generator().manual_seed(1)
    counts = random_counts(30, gen, max_count=6)
    n = int(counts.sum())
    linear = torch.nn.Linear(8 + 3, 5).double()
    per_event = torch.randn(30, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    per_muon = torch.randn(n, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    index = event_index_of(counts, n)

    def split(e, m):
        return torch.tanh(split_linear(linear, e, m, counts, index))

    def plain(e, m):
        return torch.tanh(linear(torch.cat([e[index], m], -1)))

    torch.testing.assert_close(split(per_event, per_muon), plain(per_event, per_muon))
    assert torch.autograd.gradcheck(split, (per_event, per_muon))
    assert torch.autograd.gradgradcheck(split, (per_event, per_muon))
    (g1,) = torch.autograd.grad(split(per_event, per_muon).sum(), per_muon, create_graph=True)
    (g2,) = torch.autograd.grad(plain(per_event, per_muon).sum(), per_muon, create_graph=True)
    w1 = torch.autograd.grad(g1.pow(2).sum(), linear.weight)[0]
    w2 = torch.autograd.grad(g2.pow(2).sum(), linear.weight)[0]
    torch.testing.assert_close(w1, w2)


def test_narrow_linear_equals_the_linear_to_second_order():
    gen = torch.Generator().manual_seed(3)
    linear = torch.nn.Linear(3, 32).double()
    x = torch.randn(40, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(narrow_linear(linear, x), linear(x))
    w = torch.randn(40, 32, generator=gen, dtype=torch.float64)

    def grads(layer):
        (gx,) = torch.autograd.grad((layer(x).tanh() * w).sum(), x, create_graph=True)
        return torch.autograd.grad(gx.pow(2).sum(), [x, linear.weight, linear.bias])

    for ours, plain in zip(grads(lambda v: narrow_linear(linear, v)), grads(linear)):
        torch.testing.assert_close(ours, plain)


def test_generator_local_net_is_the_split_of_the_unsplit_net():
    """The generator's muons are local_net([context of the event, z_local]) exactly, with
    its per-event nets skipping the events without muons (half of them here)."""
    torch.manual_seed(0)
    gen, _ = build_models(small_model_config(lateral_rotate=False))
    cond = torch.randn(20, 4)
    counts = random_counts(20, torch.Generator().manual_seed(1), max_count=5, empty=0.5)
    assert (counts == 0).sum() >= 5
    n = int(counts.sum())
    out = gen.generate_with_counts(cond, counts, n, generator=torch.Generator().manual_seed(2))
    # redo it unsplit with the same noise draws (z_global, then z_local)
    rng = torch.Generator().manual_seed(2)
    z = torch.randn((20, gen.z_global), generator=rng)
    log_n = torch.log10(counts.float() + 1.0).unsqueeze(-1)
    context = gen.global_net(torch.cat([z, gen.cond_norm(cond), log_n], -1))
    z_local = torch.randn((n, gen.z_local), generator=rng)
    rows = torch.cat([torch.repeat_interleave(context, counts, dim=0), z_local], -1)
    plain = gen.muon_norm.inverse(gen.local_net(rows))
    assert (out - plain).abs().max() < 1e-6


@pytest.mark.parametrize("ties", [False, True])
def test_segment_max_equals_scatter_amax_value_and_gradient(ties):
    gen = torch.Generator().manual_seed(5)
    counts = random_counts(40, gen, max_count=8)
    n = int(counts.sum())
    h = torch.randn(n, 6, generator=gen, dtype=torch.float64)
    if ties:  # equal values inside events: the gradient is shared between them (away from
        h = torch.round(h) + 10.0  # 0, which scatter_reduce also counts its initial zero at)
    h.requires_grad_(True)
    index = event_index_of(counts, n)
    ours = segment_max(h, counts, index)
    ref = h.new_zeros(40, 6).scatter_reduce(
        0, index.unsqueeze(-1).expand_as(h), h, reduce="amax", include_self=False
    )
    torch.testing.assert_close(ours, ref)
    w = torch.randn(40, 6, generator=gen, dtype=torch.float64)
    (g_ours,) = torch.autograd.grad((ours * w).sum(), h)
    (g_ref,) = torch.autograd.grad((ref * w).sum(), h)
    torch.testing.assert_close(g_ours, g_ref)
    if not ties:  # twice differentiable, as the gradient penalty needs (away from ties)
        assert torch.autograd.gradgradcheck(lambda x: segment_max(x, counts, index) ** 2, (h,))


def test_segment_max_takes_the_tie_free_path_only_without_ties():
    counts = torch.tensor([2, 0, 3])
    index = event_index_of(counts, 5)
    distinct = torch.tensor([[1.0, 5], [2, 4], [0, 1], [3, 2], [1, 0]])
    tied = distinct.clone()
    tied[4, 0] = 3.0  # event 2, channel 0: rows 3 and 4 both at the maximum 3
    for h, free in ((distinct, True), (tied, False)):
        top = segment_max(h, counts, index)
        hit = h == top.index_select(0, index)
        assert _no_ties(hit, counts) is free
        for dtype in (torch.float32, torch.float64, torch.bfloat16):  # the float masks
            assert _no_ties(hit.to(dtype), counts) is free
    free_hit = (distinct == segment_max(distinct, counts, index).index_select(0, index)).float()
    assert _no_ties(free_hit, counts) is True
    free_hit[2, 1] = float("nan")  # a NaN row reads as "ties" (the step skips the update)
    assert _no_ties(free_hit, counts) is False
    # the tied channel's gradient is shared by its two rows, the others go to one row
    h = tied.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(segment_max(h, counts, index).sum(), h)
    assert grad[:, 0].tolist() == [0.0, 1.0, 0.0, 0.5, 0.5]
    assert grad[:, 1].tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]


def test_segment_sum_and_mean():
    counts = torch.tensor([2, 0, 3])
    h = torch.arange(10.0).reshape(5, 2)
    index = event_index_of(counts, 5)
    torch.testing.assert_close(segment_sum(h, index, 3), torch.tensor([[2.0, 4], [0, 0], [18, 21]]))
    torch.testing.assert_close(
        segment_mean(h, counts, index), torch.tensor([[1.0, 2], [0, 0], [6, 7]])
    )


@pytest.mark.parametrize("exact", [True, False])
def test_events_with_muons_exact_or_padded_without_a_sync(exact):
    counts = torch.tensor([0, 2, 0, 0, 1, 0, 1, 0])
    rows, n = events_with_muons(counts, 4, exact=exact)
    if exact:  # the three events with muons
        assert n.tolist() == [2, 1, 1] and rows.tolist() == [1, 4, 6]
    else:  # min(B, N) = 4 rows: those three, then an empty padding row
        assert n.tolist() == [2, 1, 1, 0] and rows.tolist()[:3] == [1, 4, 6]
    full = torch.tensor([1, 1])
    assert events_with_muons(full, 2, exact=exact) == (None, full)  # nothing to drop


def test_segment_max_with_a_nan_row_takes_the_tie_path_without_raising():
    counts = torch.tensor([2, 1])
    index = event_index_of(counts, 3)
    h = torch.tensor([[1.0, float("nan")], [2.0, 0.0], [3.0, 1.0]], requires_grad=True)
    top = segment_max(h, counts, index)
    assert top[1].tolist() == [3.0, 1.0] and top[0, 0] == 2.0
    assert top[0, 1].isnan()  # a non-finite score: the training step skips the update
    (grad,) = torch.autograd.grad(top.sum(), h)
    assert grad[:, 0].tolist() == [0.0, 1.0, 1.0]


def _force_wide(monkeypatch):
    """The CUDA path (gather / scatter_add through the (N, H) index) on the CPU too."""
    monkeypatch.setattr(
        pooling, "_use_wide", lambda h, width: 0 < width <= WIDE_INDEX_MAX, raising=True
    )


@pytest.mark.parametrize("ties", [False, True])
def test_the_wide_index_path_equals_the_row_index_path_to_second_order(ties, monkeypatch):
    gen = torch.Generator().manual_seed(7)
    counts = random_counts(30, gen, max_count=7)
    n = int(counts.sum())
    h = torch.randn(n, 5, generator=gen, dtype=torch.float64)
    if ties:
        h = torch.round(h) + 10.0
    per_event = torch.randn(30, 5, generator=gen, dtype=torch.float64)
    w_rows = torch.randn(n, 5, generator=gen, dtype=torch.float64)
    w_events = torch.randn(30, 5, generator=gen, dtype=torch.float64)

    def everything(h, per_event, index):
        # each op's value, and a gradient of it taken with create_graph (the penalty's
        # double backward goes through the backward of each)
        out = (
            (rows_of(per_event, index) ** 2 * h * w_rows).sum()
            + (segment_sum(h * h, index, 30) * w_events).sum()
            + (segment_mean(h, counts, index) * w_events).sum()
            + (segment_max(h, counts, index) ** 2 * w_events).sum()
        )
        g_h, g_e = torch.autograd.grad(out, (h, per_event), create_graph=True)
        second = torch.autograd.grad((g_h**2).sum() + (g_e**2).sum(), (h, per_event))
        return out, g_h, g_e, *second

    def run():
        index = event_index_of(counts, n)  # a fresh index: no expansion cached from before
        return everything(
            h.clone().requires_grad_(True), per_event.clone().requires_grad_(True), index
        )

    narrow = run()
    _force_wide(monkeypatch)
    wide = run()
    for a, b in zip(narrow, wide):
        torch.testing.assert_close(a, b)
    if not ties:
        index = event_index_of(counts, n)
        x = h.clone().requires_grad_(True)
        assert torch.autograd.gradgradcheck(lambda x: segment_max(x, counts, index) ** 2, (x,))
        e = per_event.clone().requires_grad_(True)
        assert torch.autograd.gradgradcheck(
            lambda e: segment_sum(rows_of(e, index) ** 2, index, 30), (e,)
        )


def test_the_wide_index_is_made_once_per_index_and_width(monkeypatch):
    counts = torch.tensor([2, 0, 3])
    index = event_index_of(counts, 5)
    a = wide_index(index, 3)
    assert a.is_contiguous() and a.shape == (5, 3)
    assert a.tolist() == [[0, 0, 0], [0, 0, 0], [2, 2, 2], [2, 2, 2], [2, 2, 2]]
    assert wide_index(index, 3) is a  # cached on the index tensor
    assert wide_index(index, 2) is not a and wide_index(index, 2).shape == (5, 2)
    assert wide_index(event_index_of(counts, 5), 3) is not a  # another index, its own
    # on the CPU the row index path is taken, and nothing is cached on a fresh index
    fresh = event_index_of(counts, 5)
    segment_sum(torch.ones(5, 4), fresh, 3)
    assert getattr(fresh, pooling._WIDE_CACHE, None) is None
    # forced (as on CUDA): rows up to WIDE_INDEX_MAX wide use and cache it, wider do not
    _force_wide(monkeypatch)
    segment_sum(torch.ones(5, 4), fresh, 3)
    rows_of(torch.ones(3, WIDE_INDEX_MAX + 1), fresh)
    assert sorted(getattr(fresh, pooling._WIDE_CACHE)) == [4]


@pytest.mark.parametrize("critic", ["epic", "pointnet"])
def test_critic_and_penalty_gradients_are_the_same_on_the_wide_index_path(critic, monkeypatch):
    torch.manual_seed(0)
    _, model = build_models(small_model_config(critic=critic))
    model.double()
    gen = torch.Generator().manual_seed(3)
    counts = random_counts(16, gen, max_count=6)
    fake_counts = random_counts(16, gen, max_count=6)
    cond = torch.randn(16, 4, generator=gen, dtype=torch.float64)
    real = torch.randn(int(counts.sum()), 3, generator=gen, dtype=torch.float64)
    fake = torch.randn(int(fake_counts.sum()), 3, generator=gen, dtype=torch.float64)
    alpha = torch.rand(16, generator=gen, dtype=torch.float64)

    def grads():
        model.zero_grad(set_to_none=True)
        x_real, x_fake = model.inputs(real), model.inputs(fake)
        score = (
            model.score(x_real, cond, counts).sum() - model.score(x_fake, cond, fake_counts).sum()
        )
        gp = gradient_penalty(
            model.score, cond, x_real, counts, x_fake, fake_counts, norm="event", alpha=alpha
        )
        (score + 10.0 * gp).backward()
        return score.detach(), gp.detach(), [p.grad.clone() for p in model.parameters()]

    narrow = grads()
    _force_wide(monkeypatch)
    wide = grads()
    torch.testing.assert_close(narrow[0], wide[0])
    torch.testing.assert_close(narrow[1], wide[1])
    assert narrow[1] > 0
    for a, b in zip(narrow[2], wide[2]):
        torch.testing.assert_close(a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_pooling_equals_the_cpu_to_second_order():
    gen = torch.Generator().manual_seed(11)
    counts = random_counts(500, gen, max_count=9)
    n = int(counts.sum())
    h = torch.randn(n, 32, generator=gen, dtype=torch.float64)
    per_event = torch.randn(500, 32, generator=gen, dtype=torch.float64)

    def run(device):
        c = counts.to(device)
        index = event_index_of(c, n)
        x = h.to(device).requires_grad_(True)
        e = per_event.to(device).requires_grad_(True)
        out = (segment_max(x, c, index) ** 2).sum() + (segment_mean(x, c, index) ** 2).sum()
        out = out + (rows_of(e, index) * x).sum()
        g = torch.autograd.grad(out, (x, e), create_graph=True)
        second = torch.autograd.grad(sum((t**2).sum() for t in g), (x, e))
        if device == "cuda":
            assert sorted(getattr(index, pooling._WIDE_CACHE)) == [32]
        return [t.cpu() for t in (out, *g, *second)]

    for a, b in zip(run("cpu"), run("cuda")):
        torch.testing.assert_close(a, b)
