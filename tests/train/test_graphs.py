"""CUDA graphs of the step: padding that changes no loss or gradient, device learning
rates, and (on a GPU) recording and replaying the step."""

from __future__ import annotations

import copy

import pytest
import torch

from muongen.config import OptimConfig, TrainConfig, load_config
from muongen.data.batch import RaggedBatch
from muongen.errors import ConfigError
from muongen.model.penalty import gradient_penalty
from muongen.train.graphs import PAD_EVENTS, StepGraphs, pad, padded_size
from muongen.train.step import GanStep

from .test_step import micro, params, small_models, toy_batch

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_padding_muons_are_shared_among_the_padding_events():
    batch = micro(parts=1)[0]
    padded = pad(batch, batch.n_muons + 2 * PAD_EVENTS + 5)
    tail = padded.counts[batch.n_events :]
    assert tail.shape[0] == PAD_EVENTS and int(tail.sum()) == 2 * PAD_EVENTS + 5
    assert set(tail.tolist()) == {2, 3}
    assert torch.equal(padded.counts[: batch.n_events], batch.counts)
    assert torch.equal(padded.muons[: batch.n_muons], batch.muons)
    assert not padded.muons[batch.n_muons :].any()


def test_padded_sizes_are_few_and_close_above():
    sizes = {padded_size(n) for n in range((1 << 12) + 1, (1 << 13) + 1)}
    assert len(sizes) == 8  # 8 sizes per doubling
    for n in [0, 1, 255, 256, 257, 1000, 4095, 4096, 170_605, 1_000_003]:
        size = padded_size(n)
        assert n <= size <= max(256, n + n // 8), n
        assert padded_size(size) == size  # a padded size pads to itself


def _sparse_batch(b: int = 40, seed: int = 3) -> RaggedBatch:
    """A toy batch with most events empty (as at production's multiplicity)."""
    batch = toy_batch(b, torch.Generator().manual_seed(seed))
    keep = torch.rand(b, generator=torch.Generator().manual_seed(seed + 1)) < 0.4
    muons = batch.muons[torch.repeat_interleave(keep, batch.counts)]
    return RaggedBatch(batch.conditions, muons, torch.where(keep, batch.counts, 0))


def _fixed_fakes(step: GanStep) -> None:
    """Fakes that depend on the generator's weights but on no random draw: each muon a
    function of its event's condition and its rank, so padding changes none of them."""
    weight = step.generator.global_net[0].weight

    def fake(cond, counts, n_muons, rng):
        index = torch.repeat_interleave(torch.arange(cond.shape[0]), counts, output_size=n_muons)
        start = torch.cumsum(counts, 0) - counts
        rank = (torch.arange(n_muons) - start[index]).to(cond.dtype)
        base = torch.stack([cond[index, 0] - 0.1 * rank, 0.1 * rank, cond[index, 1]], -1)
        return base * (1.0 + 0.01 * weight.sum()), counts

    step._fake = fake


@pytest.mark.parametrize("weights", ["none", "log"])
@pytest.mark.parametrize("parts", [1, 2])
def test_a_padded_step_gives_the_unpadded_losses_and_updates(weights, parts):
    """The eager step on padded microbatches (what a graph records) against the step on
    the microbatches themselves, from the same state, with fakes that draw no noise and
    no penalty (whose pair draws depend on the muon count): the same losses and the same
    updated weights. The padding event has hundreds of muons, more than any real one."""
    batch = _sparse_batch()
    step_events = batch.n_events // parts
    micro_ = [batch.slice(i, i + step_events) for i in range(0, batch.n_events, step_events)]
    for m in micro_:
        assert padded_size(m.n_muons) - m.n_muons > 100
    # plain SGD: an update is the gradient itself (Adam's first steps are its sign)
    ocfg = OptimConfig(
        n_critic=2, gp_lambda=0.0, event_weight=weights, mult_weight=0.0, optimizer="sgd",
        momentum=0.0, lr_generator=0.1, lr_critic=0.1,
    )  # fmt: skip
    runs = {}
    for name in ("plain", "padded"):
        gen, critic = small_models()
        step = GanStep(gen, critic, ocfg, TrainConfig(step_shards=1), "cpu")
        _fixed_fakes(step)
        if name == "plain":
            out = step(micro_)
        else:
            out = StepGraphs(step, 4).eager_padded(micro_, step.gp_pattern())
            step.advance()
        runs[name] = out, params(gen), params(critic), step.learning_rates()
    (out_a, g_a, c_a, lr_a), (out_b, g_b, c_b, lr_b) = runs["plain"], runs["padded"]
    for key in ("c_loss", "w_gap", "g_loss", "skipped"):
        torch.testing.assert_close(out_b[key], out_a[key], rtol=1e-5, atol=1e-6, msg=key)
    moved = 0
    initial = [p for net in small_models() for p in params(net)]
    for a, b, start in zip(g_a + c_a, g_b + c_b, initial):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
        moved += int(not torch.equal(a, start))
    assert moved > 10  # both nets were updated
    assert lr_a == lr_b


@pytest.mark.parametrize("norm", ["muon", "event"])
def test_the_padding_event_draws_no_penalty_pair(norm):
    """The penalty of a padded microbatch's scored events, with the padding event's pair
    counts at 0, equals the unpadded one (all pairs, the same interpolation weights)."""
    gen, critic = small_models()
    step = GanStep(gen, critic, OptimConfig(), TrainConfig(step_shards=1), "cpu")
    batch = _sparse_batch()
    plain = step._scored(batch, 0)
    padded = step._scored(pad(batch, padded_size(batch.n_muons)), 0, padded=PAD_EVENTS)
    assert padded.cond.shape[0] == plain.cond.shape[0] + PAD_EVENTS  # they are scored
    alpha = torch.rand(plain.cond.shape[0], generator=torch.Generator().manual_seed(1))
    values = []
    for sc, a in ((plain, alpha), (padded, torch.cat([alpha, torch.ones(PAD_EVENTS)]))):
        fake = 0.9 * sc.inputs + 0.05
        gp = gradient_penalty(
            critic.score, sc.cond, sc.inputs, sc.counts, fake, sc.pair_counts(sc.counts),
            alpha=a, norm=norm,
        )  # fmt: skip
        values.append(gp)
    torch.testing.assert_close(values[1], values[0], rtol=1e-5, atol=1e-7)
    assert values[0] > 0


def test_warm_up_steps_run_padded_and_advance_the_counters():
    """Before a key is recorded its steps run eagerly on the padded inputs; the step's
    host counters advance as for any step (the penalty pattern alternates with them)."""
    gen, critic = small_models()
    ocfg = OptimConfig(n_critic=3, gp_every=2, gp_max_pairs=16)
    step = GanStep(gen, critic, ocfg, TrainConfig(step_shards=1), "cpu")
    step.graphs = StepGraphs(step, 4)
    batch = micro(parts=1)
    keys = []
    for _ in range(2):
        keys.append(step.graphs.key(batch))
        out = step(batch)
        assert torch.isfinite(out["c_loss"]) and out["gp"] > 0
    assert keys[0][1] == (True, False, True) and keys[1][1] == (False, True, False)
    assert step.critic_step_count == 6 and step.generator_step_count == 2
    assert sum(step.graphs.seen.values()) == 2 and not step.graphs.recorded


def test_loading_a_state_forgets_the_recorded_graphs():
    """A recorded graph updates the optimizer tensors it was recorded on; loading a state
    (a rollback, a resume) replaces them, so the graphs must be recorded anew."""
    gen, critic = small_models()
    step = GanStep(gen, critic, OptimConfig(), TrainConfig(step_shards=1), "cpu")
    step(micro(parts=1))
    state = step.state_dict()
    step.graphs = StepGraphs(step, 4)
    step.graphs.recorded[("shapes", ())] = "a recorded graph"
    step.graphs.seen[("shapes", ())] = 3
    step.load_state_dict(state)
    assert not step.graphs.recorded and not step.graphs.seen


@pytest.mark.parametrize(
    "change",
    ["train.fake_counts=predicted", "train.precision=fp16"],
)
def test_cuda_graphs_refuse_what_they_cannot_record(change):
    with pytest.raises(ConfigError, match=r"train\.cuda_graphs"):
        load_config("production-a100", ["train.cuda_graphs=true", change])


@cuda
def test_cuda_graphs_need_adam(caplog):
    gen, critic = small_models()
    gen.cuda()
    critic.cuda()
    ocfg = OptimConfig(optimizer="sgd")
    with caplog.at_level("INFO"):
        step = GanStep(gen, critic, ocfg, TrainConfig(cuda_graphs=True), "cuda")
    assert step.graphs is None and "optim.optimizer=adam" in caplog.text


def test_cuda_graphs_off_cuda_leave_the_step_as_it_was(caplog):
    gen, critic = small_models()
    with caplog.at_level("INFO"):
        step = GanStep(gen, critic, OptimConfig(), TrainConfig(cuda_graphs=True), "cpu")
    assert step.graphs is None and "CUDA only" in caplog.text
    assert isinstance(step.opt_g.param_groups[0]["lr"], float)


# ---------------------------------------------------------------------- on a GPU


def _cuda_step(**optim):
    gen, critic = small_models()
    gen.cuda()
    critic.cuda()
    ocfg = OptimConfig(n_critic=3, gp_every=2, gp_max_pairs=64, **optim)
    tcfg = TrainConfig(cuda_graphs=True, cuda_graphs_max=3, max_steps=1000)
    return GanStep(gen, critic, ocfg, tcfg, "cuda")


@cuda
def test_the_step_is_recorded_replayed_and_trains():
    step = _cuda_step(schedule="cosine", warmup_steps=20)
    assert torch.is_tensor(step.opt_g.param_groups[0]["lr"])
    batch = [m.to("cuda") for m in micro(parts=1, b=64)]
    before = params(step.critic)
    lrs = []
    torch.cuda.set_sync_debug_mode("error")  # a replay must not read from the device
    try:
        for i in range(8):
            if i == 6:  # both penalty patterns recorded by now: replays only
                assert len(step.graphs.recorded) == 2
            out = step(batch)
            lrs.append(step.opt_c.param_groups[0]["lr"].clone())
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert step.graphs.replays == 2 + 2  # steps 5-8 (1-4: two warm-ups per pattern)
    assert all(torch.isfinite(v) for v in out.values())
    assert not same_all(before, params(step.critic))
    assert float(lrs[6]) < float(lrs[7])  # the warm-up: device rates, filled in place
    # checkpoints hold host floats, as without graphs
    groups = step.state_dict()["opt_c"]["state"]["param_groups"]
    assert isinstance(groups[0]["lr"], float)
    # a batch of another padded size is recorded too, up to cuda_graphs_max, then runs eagerly
    other = [m.to("cuda") for m in micro(parts=1, b=256, seed=1)]
    for _ in range(6):
        step(other)
    assert len(step.graphs.recorded) == 3 and step.graphs.eager_steps >= 1


def same_all(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


@cuda
def test_a_replayed_step_equals_the_step_without_graphs():
    """Fakes without noise, no penalty, no multiplicity term: nothing random is left, so a
    replayed step must update the weights as the plain step does from the same state."""
    # a learning rate that changes every step: the graph must read each step's (a rate
    # recorded as a constant would make every update 1/6 or more off here)
    step = _cuda_step(gp_lambda=0.0, mult_weight=0.0, schedule="cosine", warmup_steps=50)
    _cuda_fixed_fakes(step)
    batch = [m.to("cuda") for m in micro(parts=1, b=64)]
    for _ in range(3):  # two warm-ups, then recorded and replayed (no penalty: one key)
        step(batch)
    assert step.graphs.replays == 1
    # the same weights, moments and counters, no graphs
    gen, critic = copy.deepcopy(step.generator), copy.deepcopy(step.critic)
    twin = GanStep(gen, critic, step.optim_cfg, TrainConfig(max_steps=1000), "cuda")
    twin.load_state_dict(copy.deepcopy(step.state_dict()))
    _cuda_fixed_fakes(twin)
    nets = (step.generator, step.critic, twin.generator, twin.critic)
    before = [torch.cat([p.flatten() for p in params(n)]) for n in nets]
    for _ in range(2):
        step(batch)
        twin(batch)
    assert step.graphs.replays == 3
    after = [torch.cat([p.flatten() for p in params(n)]) for n in nets]
    moved = [a - b for a, b in zip(after, before)]
    for ours, plain in ((moved[0], moved[2]), (moved[1], moved[3])):
        # the GPU's atomic sums round from run to run, and Adam's first updates are about
        # the gradient's sign: a few entries whose gradient is ~0 may differ, no more
        close = (ours - plain).abs() <= 1e-3 * plain.abs() + 1e-9
        assert close.float().mean() > 0.95, close.float().mean()
        assert plain.abs().max() > 0


def _cuda_fixed_fakes(step: GanStep) -> None:
    weight = step.generator.global_net[0].weight

    def fake(cond, counts, n_muons, rng):
        index = torch.repeat_interleave(
            torch.arange(cond.shape[0], device=cond.device), counts, output_size=n_muons
        )
        base = torch.stack([cond[index, 0], cond[index, 1] * 0.1, cond[index, 2] * 0.1], -1)
        return base * (1.0 + 0.01 * weight.sum()), counts

    step._fake = fake
