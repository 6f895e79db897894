"""The sharded CPU step (train.step_shards): shards at once on their own threads, the same
update as the unsharded step, deterministic, errors carried back."""

from __future__ import annotations

import threading

import pytest
import torch

import muongen.model.generator as generator_module
import muongen.train.step as step_module
from muongen.config import OptimConfig, TrainConfig
from muongen.data.batch import RaggedBatch
from muongen.model.penalty import gradient_penalty
from muongen.train.step import GanStep, resolve_shards, shard_bounds

from .test_step import params, small_models, toy_batch


@pytest.fixture
def small_shards(monkeypatch):
    """Shard even the tests' small batches."""
    monkeypatch.setattr(step_module, "SHARD_MIN_COST", 1)


def fixed_alpha_penalty(critic, cond, *args, generator=None, **kwargs):
    """The penalty with every event's interpolation weight 0.5 (no random draw)."""
    return gradient_penalty(critic, cond, *args, alpha=torch.full((cond.shape[0],), 0.5), **kwargs)


def test_shard_bounds_balance_muons_and_scored_events():
    counts = torch.tensor([3, 0, 5, 1, 0, 2, 7, 1])  # cost: muons + 1 per event with muons
    bounds = shard_bounds(counts, 2)
    assert bounds[0] == 0 and bounds[-1] == 8 and len(bounds) == 3
    cost = (counts + (counts > 0)).tolist()
    left, right = sum(cost[: bounds[1]]), sum(cost[bounds[1] :])
    assert abs(left - right) <= max(cost)  # as even as whole events allow
    assert shard_bounds(counts, 3)[-1] == 8 and len(shard_bounds(counts, 3)) == 4
    # too little work for two shards: all of it in the first, the second empty
    assert shard_bounds(counts, 2, min_cost=100) == [0, 8, 8]
    assert shard_bounds(torch.zeros(4, dtype=torch.int64), 2) == [0, 4, 4]
    assert shard_bounds(torch.zeros(0, dtype=torch.int64), 2) == [0, 0, 0]


def test_resolve_shards():
    cpu = torch.device("cpu")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert resolve_shards(0, cpu, compiled=False) == 2
        torch.set_num_threads(1)
        assert resolve_shards(0, cpu, compiled=False) == 1
        assert resolve_shards(3, cpu, compiled=False) == 3
    finally:
        torch.set_num_threads(before)
    assert resolve_shards(2, cpu, compiled=True) == 1  # compiled calls stay in one thread
    assert resolve_shards(2, torch.device("cuda"), compiled=False) == 1


@pytest.mark.parametrize("cpu_matmul", ["blas", "onednn"])
@pytest.mark.parametrize(
    "gp_lambda, gp_norm, event_weight, energy_balance",
    [
        (0.0, "muon", "none", 0.0),
        (10.0, "muon", "none", 0.0),
        (10.0, "event", "log", 0.0),
        (0.0, "muon", "sqrt", 0.0),
        (0.0, "muon", "none", 1.0),
        (0.0, "event", "log", 1.0),
        (10.0, "event", "log", 1.0),
    ],
)
def test_a_sharded_step_makes_the_unsharded_update(
    small_shards, monkeypatch, gp_lambda, gp_norm, event_weight, energy_balance, cpu_matmul
):
    """Without noise (zero draws, no random azimuth, the multiplicity head's MSE, a fixed
    interpolation weight, every pair) a sharded step and an unsharded step on the same
    batch make the same update (with SGD at lr 1 the change of each parameter is its
    gradient): every normaliser is the whole batch's. The shards' events given as
    microbatches, each normalised over itself, make another update where the penalty or
    the event weights are on. With either library for the products outside autograd
    (``train.cpu_matmul``: the fakes). With ``optim.energy_balance`` and no penalty the
    models have a per-muon critic, whose muon weights the balance sets too (its penalty
    draws its muons at random, per shard)."""
    monkeypatch.setattr(generator_module, "_noise", lambda shape, like, gen: like.new_zeros(shape))
    batch = toy_batch(48, torch.Generator().manual_seed(5))
    cut = shard_bounds(batch.counts, 2)
    parts = [batch.slice(cut[0], cut[1]), batch.slice(cut[1], cut[2])]
    assert parts[0].n_events > 0 and parts[1].n_events > 0
    ocfg = OptimConfig(
        optimizer="sgd", momentum=0.0, lr_generator=1.0, lr_critic=1.0, n_critic=2,
        gp_lambda=gp_lambda, gp_every=1, gp_max_pairs=0, gp_norm=gp_norm,
        event_weight=event_weight, grad_clip=0.0, warmup_steps=0,
        energy_balance=energy_balance, muon_gp_rows=1 << 20,
    )  # fmt: skip
    muon_critic = [8] if energy_balance and not gp_lambda else []

    def run(shards, micro):
        gen, critic = small_models(
            seed=2, lateral_rotate=False, multiplicity="round", muon_critic=muon_critic
        )
        step = GanStep(
            gen, critic, ocfg, TrainConfig(step_shards=shards, cpu_matmul=cpu_matmul), "cpu",
            penalty_fn=fixed_alpha_penalty,
        )  # fmt: skip
        assert step.shards == shards
        out = step(micro)
        return out, params(gen) + params(critic)

    (o2, p2), (o1, p1) = run(2, [batch]), run(1, [batch])
    for a, b in zip(p2, p1):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for k in ("c_loss", "g_loss", "m_loss", "gp", "w_gap"):
        torch.testing.assert_close(o2[k], o1[k], rtol=1e-4, atol=1e-5)
    if gp_lambda:
        assert o2["gp"] > 0
    _, p_parts = run(1, parts)
    apart = any(not torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(p_parts, p1))
    assert apart == (gp_lambda > 0 or event_weight != "none" or energy_balance > 0)


def test_the_shards_run_at_once_on_their_own_threads(small_shards):
    """Each shard's generator call waits at a two-party barrier: the step completes only
    when the two shards run concurrently, on two threads."""
    gen, critic = small_models()
    barrier = threading.Barrier(2, timeout=30)
    threads = set()
    generate = gen.generate_with_counts

    def meeting(*args, **kwargs):
        threads.add(threading.get_ident())
        barrier.wait()
        return generate(*args, **kwargs)

    gen.generate_with_counts = meeting
    step = GanStep(gen, critic, OptimConfig(n_critic=2), TrainConfig(step_shards=2), "cpu")
    out = step([toy_batch(64, torch.Generator().manual_seed(1))])
    assert int(out["skipped"]) == 0 and torch.isfinite(out["c_loss"])
    assert len(threads) == 2 and threading.get_ident() in threads


def test_a_sharded_step_is_deterministic(small_shards):
    """Each shard draws from its own RNG, seeded from the global one: the same seed gives
    the same parameters whichever shard finishes first."""

    def run():
        gen, critic = small_models(seed=4)
        step = GanStep(gen, critic, OptimConfig(n_critic=2), TrainConfig(step_shards=2), "cpu")
        torch.manual_seed(9)
        for i in range(3):
            step([toy_batch(64, torch.Generator().manual_seed(i))])
        return params(gen) + params(critic)

    a, b = run(), run()
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    torch.manual_seed(10)  # another global seed: other noise, another result
    gen, critic = small_models(seed=4)
    step = GanStep(gen, critic, OptimConfig(n_critic=2), TrainConfig(step_shards=2), "cpu")
    for i in range(3):
        step([toy_batch(64, torch.Generator().manual_seed(i))])
    assert not all(torch.equal(x, y) for x, y in zip(a, params(gen) + params(critic)))


@pytest.mark.parametrize("by", ["muons", "events"])
@pytest.mark.parametrize("norm", ["muon", "event"])
def test_the_penalty_pairs_are_drawn_once_for_the_whole_batch(small_shards, norm, by):
    """The step draws the pairs for the whole microbatch and hands each shard its own,
    renumbered from the shard's first muon, with the microbatch's count of terms: the
    microbatch pairs at most gp_max_pairs, and only its real muons; drawn by events
    (optim.gp_draw), whole events but at most one."""
    calls = []

    def recording(critic, cond, real, real_counts, *args, slots=None, denominator=None, **kw):
        assert kw["generator"] is not None  # the shard's own RNG (its alphas)
        assert "max_pairs" not in kw  # drawn ahead, not in the shard
        calls.append((real.clone(), real_counts.clone(), slots, denominator))
        return gradient_penalty(
            critic, cond, real, real_counts, *args, slots=slots, denominator=denominator, **kw
        )

    gen, critic = small_models()
    ocfg = OptimConfig(n_critic=1, gp_every=1, gp_max_pairs=40, gp_norm=norm, gp_draw=by)
    step = GanStep(gen, critic, ocfg, TrainConfig(step_shards=2), "cpu", penalty_fn=recording)
    batch = toy_batch(64, torch.Generator().manual_seed(3))
    step([batch])
    assert len(calls) == 2 and all(len(slots) > 0 for _, _, slots, _ in calls)
    assert sum(len(slots) for _, _, slots, _ in calls) == 40  # the microbatch's cap
    (_, _, _, d0), (_, _, _, d1) = calls

    def events_of(counts):
        return torch.repeat_interleave(torch.arange(len(counts)), counts)

    def events_with_pairs(counts, slots):
        return len(torch.unique(events_of(counts)[slots]))

    events = sum(events_with_pairs(counts, slots) for _, counts, slots, _ in calls)
    assert d0 == d1 == (40 if norm == "muon" else events)
    inputs = critic.inputs(batch.muons)
    drawn = torch.cat([real[slots] for real, _, slots, _ in calls])
    assert all((inputs == row).all(-1).any() for row in drawn)  # each one a real muon
    if by == "events":  # the fakes carry the real counts: an event's pairs are its muons
        cut = 0
        for _, counts, slots, _ in calls:
            per = torch.bincount(events_of(counts)[slots], minlength=len(counts))
            cut += int(((per > 0) & (per < counts)).sum())
        assert cut <= 1


def test_an_error_in_another_shard_reaches_the_caller(small_shards):
    main = threading.get_ident()

    def failing(*args, **kwargs):
        if threading.get_ident() != main:
            raise RuntimeError("shard failed")
        return gradient_penalty(*args, **kwargs)

    gen, critic = small_models()
    ocfg = OptimConfig(n_critic=1, gp_every=1)
    step = GanStep(gen, critic, ocfg, TrainConfig(step_shards=2), "cpu", penalty_fn=failing)
    before = params(critic)
    with pytest.raises(RuntimeError, match="shard failed"):
        step([toy_batch(64, torch.Generator().manual_seed(3))])
    assert all(torch.equal(x, y) for x, y in zip(before, params(critic)))  # no update applied


def test_a_batch_too_small_to_cut_runs_as_one_shard_as_without_shards():
    """Below SHARD_MIN_COST per shard the step is the unsharded one: this thread with
    torch's threads as they are, noise from the global RNG (no generator= passed)."""
    gen, critic = small_models()
    seen = []
    generate = gen.generate_with_counts

    def recording(*args, **kwargs):
        seen.append((threading.get_ident(), "generator" in kwargs, torch.get_num_threads()))
        return generate(*args, **kwargs)

    gen.generate_with_counts = recording
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        step = GanStep(gen, critic, OptimConfig(n_critic=1), TrainConfig(step_shards=2), "cpu")
        assert step.shards == 2
        step([toy_batch(32, torch.Generator().manual_seed(0))])  # far below the minimum
    finally:
        torch.set_num_threads(before)
    assert seen and all(s == (threading.get_ident(), False, 2) for s in seen)


def test_a_quality_sized_batch_is_cut_and_a_sparse_one_left_whole():
    """From 2048 units of work per shard a batch is cut: one of the quality preset's typical
    work (~5000 units; its batches' median is ~6000) in two, while a production-mix batch
    (~0.3 muons per event: ~2000 units) is left whole, as the shared bench measures it."""
    gen, critic = small_models()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        step = GanStep(gen, critic, OptimConfig(), TrainConfig(step_shards=2), "cpu")
        assert (step.shards, step.threads_per_shard) == (2, 1)
    finally:
        torch.set_num_threads(before)

    def work(batch: RaggedBatch) -> int:  # shard_bounds' units: muons + events with muons
        return int(batch.counts.sum() + (batch.counts > 0).sum())

    rng = torch.Generator().manual_seed(0)
    busy = toy_batch(1024, rng)
    assert work(busy) >= 2 * step_module.SHARD_MIN_COST
    assert len(step._shard_work([busy])) == 2
    many = toy_batch(4096, rng)
    counts = (many.counts == 7).to(torch.int64)  # ~0.3 muons per event
    sparse = RaggedBatch(many.conditions, many.muons[: int(counts.sum())], counts)
    assert work(sparse) < 2 * step_module.SHARD_MIN_COST
    assert len(step._shard_work([sparse])) == 1


def test_a_sharded_step_with_the_muon_critic_makes_the_unsharded_update(small_shards, monkeypatch):
    """model.muon_critic: its pooled mean over muons is the whole batch's in every shard
    (each shard's part scaled by 1 / the batch's muons), so two shards make the unsharded
    update (no noise, no penalty: its draws differ by shard)."""
    monkeypatch.setattr(generator_module, "_noise", lambda shape, like, gen: like.new_zeros(shape))
    batch = toy_batch(48, torch.Generator().manual_seed(5))
    ocfg = OptimConfig(
        optimizer="sgd", momentum=0.0, lr_generator=1.0, lr_critic=1.0, n_critic=2,
        gp_lambda=0.0, grad_clip=0.0, warmup_steps=0, muon_critic_weight=2.0,
    )  # fmt: skip

    def run(shards):
        gen, critic = small_models(
            seed=2, lateral_rotate=False, multiplicity="round", muon_critic=[8]
        )
        step = GanStep(gen, critic, ocfg, TrainConfig(step_shards=shards), "cpu")
        assert step.shards == shards
        return step([batch]), params(gen) + params(critic)

    (o2, p2), (o1, p1) = run(2), run(1)
    for a, b in zip(p2, p1):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for k in ("c_loss", "g_loss", "w_gap"):
        torch.testing.assert_close(o2[k], o1[k], rtol=1e-4, atol=1e-5)
