"""GanStep: outputs, determinism, skipped non-finite updates, state round trip, learning."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
from scipy.stats import wasserstein_distance
from tiny import set_multiplicity

from muongen.config import ModelConfig, OptimConfig, TrainConfig
from muongen.data.batch import RaggedBatch
from muongen.errors import ConfigError
from muongen.model import build_models
from muongen.train.step import GanStep, lr_factor

from ..model.conftest import small_model_config

KEYS = {"c_loss", "g_loss", "m_loss", "gp", "w_gap", "skipped"}


def small_models(seed: int = 0, **changes):
    torch.manual_seed(seed)
    return build_models(small_model_config(**changes))


def toy_batch(b: int, gen: torch.Generator) -> RaggedBatch:
    """A simple conditional toy in feature units: the condition's first feature sets the
    mean multiplicity (Poisson 2..6) and the mean muon log-energy (-1.8..-0.2)."""
    u = torch.rand(b, 4, generator=gen)
    cond = torch.stack([u[:, 0] * 2 - 1, u[:, 1], u[:, 2] * 1.7, 1 + 1.8 * u[:, 3]], -1)
    counts = torch.poisson(2.0 + 2.0 * (cond[:, 0] + 1), generator=gen).to(torch.int64)
    n = int(counts.sum())
    ev = torch.repeat_interleave(torch.arange(b), counts)
    log_e = -1.0 + 0.8 * cond[ev, 0] + 0.3 * torch.randn(n, generator=gen)
    xy = 0.2 * torch.randn(n, 2, generator=gen)
    return RaggedBatch(cond, torch.cat([log_e[:, None], xy], -1), counts)


def micro(seed: int = 0, b: int = 32, parts: int = 2) -> list[RaggedBatch]:
    batch = toy_batch(b, torch.Generator().manual_seed(seed))
    step = b // parts
    return [batch.slice(i, min(b, i + step)) for i in range(0, b, step)]


def params(module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_step_outputs_and_counters(optimizer):
    gen, critic = small_models()
    ocfg = OptimConfig(optimizer=optimizer, n_critic=3, gp_every=2, gp_max_pairs=16)
    step = GanStep(gen, critic, ocfg, TrainConfig(), "cpu")
    g0, c0 = params(gen), params(critic)
    out = step(micro())
    assert set(out) == KEYS
    for k, v in out.items():
        assert v.ndim == 0 and torch.isfinite(v), k
    assert out["gp"] > 0 and out["m_loss"] > 0 and int(out["skipped"]) == 0
    assert step.generator_step_count == 1 and step.critic_step_count == 3
    assert not same(g0, params(gen)) and not same(c0, params(critic))
    # gp is reported unweighted; c_loss includes lambda * gp on the updates that had it
    off = GanStep(*small_models(), OptimConfig(gp_lambda=0.0, n_critic=1), TrainConfig(), "cpu")
    assert off(micro())["gp"] == 0


@pytest.mark.parametrize("fake_counts", ["real", "predicted"])
def test_a_microbatch_without_muons_steps(fake_counts):
    """A microbatch whose events are all empty has no penalty pairs and, with the real
    counts, no scored event: its loss terms have no graph, and the step still runs (each
    term is back-propagated on its own, so one without a graph must be skipped)."""
    gen, critic = small_models()
    ocfg = OptimConfig(n_critic=2, gp_every=1, gp_max_pairs=16)
    step = GanStep(gen, critic, ocfg, TrainConfig(fake_counts=fake_counts), "cpu")
    empty = RaggedBatch(torch.rand(6, 4), torch.zeros(0, 3), torch.zeros(6, dtype=torch.int64))
    g0 = params(gen)
    for parts in ([empty], [*micro(), empty]):
        out = step(parts)
        for k, v in out.items():
            assert v.ndim == 0 and torch.isfinite(v), k
        assert int(out["skipped"]) == 0
    assert not same(g0, params(gen))  # the multiplicity head learns from empty events too


def test_same_seed_same_result():
    def run():
        gen, critic = small_models(seed=3)
        step = GanStep(gen, critic, OptimConfig(n_critic=2, gp_every=1), TrainConfig(), "cpu")
        torch.manual_seed(11)
        outs = [step(micro(seed=i)) for i in range(3)]
        return outs, params(gen) + params(critic)

    (o1, p1), (o2, p2) = run(), run()
    assert same(p1, p2)
    for a, b in zip(o1, o2):
        assert all(torch.equal(a[k], b[k]) for k in KEYS)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_non_finite_updates_are_skipped_and_counted(optimizer):
    gen, critic = small_models()
    step = GanStep(gen, critic, OptimConfig(optimizer=optimizer, n_critic=2), TrainConfig(), "cpu")
    step(micro(seed=0))  # one good step so the optimizers have state
    g0, c0 = params(gen), params(critic)
    opt_c0 = copy.deepcopy(step.opt_c.state_dict())

    # NaN real muons poison only the critic's loss: both critic updates are skipped,
    # the generator update (which never sees real muons) is applied
    bad = micro(seed=1)
    bad[0].muons[0, 0] = float("nan")
    out = step(bad)
    assert int(out["skipped"]) == 2
    assert same(c0, params(critic))
    assert not same(g0, params(gen))
    for s0, s1 in zip(opt_c0["state"].values(), step.opt_c.state_dict()["state"].values()):
        assert all(torch.equal(s0[k], s1[k]) for k in s0)  # moments and step count kept
    assert all(p.grad is None for p in critic.parameters())

    # NaN conditions poison everything: all three updates skipped, nothing moves
    g1 = params(gen)
    bad = micro(seed=2)
    bad[1].conditions[0, 0] = float("nan")
    assert int(step(bad)["skipped"]) == 3
    assert same(c0, params(critic)) and same(g1, params(gen))
    assert step.skipped_updates == {"critic": 4, "generator": 1}

    # and training carries on normally afterwards
    out = step(micro(seed=3))
    assert int(out["skipped"]) == 0 and not same(c0, params(critic))


def test_predicted_fake_counts():
    """With the head's counts, fake and real multiplicities differ; the GP pairs min()."""
    gen, critic = small_models()
    with torch.no_grad():
        set_multiplicity(gen, 0.6)  # about 3 muons per event, not all zero
    step = GanStep(
        gen,
        critic,
        OptimConfig(n_critic=2, gp_every=1),
        TrainConfig(fake_counts="predicted"),
        "cpu",
    )
    out = step(micro())
    assert all(torch.isfinite(v) for v in out.values()) and out["gp"] > 0


@pytest.mark.parametrize("fake_counts", ["real", "predicted"])
def test_the_critic_updates_fakes_are_made_up_front_in_one_call(fake_counts, monkeypatch):
    """The n_critic fake sets of a step come from one generator call on the repeated
    conditions (the generator does not change during the critic updates); each update
    scores its own set, an independent draw with the right counts."""
    gen, critic = small_models()
    with torch.no_grad():
        set_multiplicity(gen, 0.6)
    n_critic = 3
    ocfg = OptimConfig(n_critic=n_critic, gp_every=1)
    step = GanStep(gen, critic, ocfg, TrainConfig(fake_counts=fake_counts), "cpu")
    calls, scored = [], []
    for name in ("generate_with_counts", "forward"):
        real_fn = getattr(gen, name)

        def spy(cond, *a, _fn=real_fn, **k):
            calls.append((torch.is_grad_enabled(), cond.shape[0]))
            return _fn(cond, *a, **k)

        monkeypatch.setattr(gen, name, spy)
    if fake_counts == "real":
        step._generate = gen.generate_with_counts
    real_score = step._critic_fwd

    def score(muons, cond, counts, event_index=None):
        if not muons.requires_grad and torch.is_grad_enabled():
            scored.append((muons.detach().clone(), counts.clone()))
        return real_score(muons, cond, counts, event_index)

    step._critic_fwd = score
    batch = micro(parts=1)
    step(batch)
    scored_events = int((batch[0].counts > 0).sum()) if fake_counts == "real" else 32
    without_grad = [n for grad, n in calls if not grad]
    # one call for the critic updates' fakes, on the scored events' conditions x n_critic
    # (with the predicted counts Generator.forward calls generate_with_counts in turn)
    assert without_grad[0] == n_critic * scored_events
    assert all(n == n_critic * scored_events for n in without_grad)
    # each update scored the real set and its own fake set (with the real counts in one
    # call, the fake set's muons after the real ones); the fake sets all differ
    if fake_counts == "real":
        n_real = batch[0].n_muons
        fakes = [(m[n_real:], c[: len(c) // 2]) for m, c in scored[:n_critic]]
    else:
        fakes = scored[1 : 2 * n_critic : 2]
    assert len(fakes) == n_critic
    for (a, ca), (b, cb) in itertools.combinations(fakes, 2):
        assert ca.shape == cb.shape and not (a.shape == b.shape and torch.equal(a, b))
    if fake_counts == "real":
        for muons, counts in fakes:
            assert torch.equal(counts, batch[0].counts[batch[0].counts > 0])
            assert muons.shape[0] == batch[0].n_muons


@pytest.mark.parametrize("weights", ["none", "log"])
def test_real_and_fake_scored_in_one_call_give_the_gradients_of_two_calls(weights):
    """With the real counts the critic scores the real and the fake set as one set of 2B'
    events: the same scores and critic gradients as two calls, one per set."""
    gen, critic = small_models()
    ocfg = OptimConfig(n_critic=1, gp_lambda=0.0, event_weight=weights)
    step = GanStep(gen, critic, ocfg, TrainConfig(), "cpu")
    b = micro(parts=1)[0]
    keep = torch.arange(b.n_events) % 4 != 0  # every 4th event emptied: not scored
    muons = b.muons[torch.repeat_interleave(keep, b.counts)]
    b = RaggedBatch(b.conditions, muons, b.counts * keep)
    (work,) = step._shard_work([b])
    torch.manual_seed(3)
    step._fakes_ahead(work, None)
    mb, w = work[0]
    params = list(critic.parameters())
    got = {}

    def collect(loss):
        got["grads"] = torch.autograd.grad(loss, params)

    loss_sum, gap_sum, _ = step._critic_terms(work, collect, None, lam=0.0, k=0)
    fake, fake_counts = mb.fakes[0]
    assert fake_counts is mb.counts  # the path under test
    d_real = mb.mask(critic.score(mb.inputs, mb.cond, mb.counts, mb.event_index))
    d_fake = mb.mask(critic.score(fake, mb.cond, mb.counts, mb.event_index))
    ref = (d_fake.sum() - d_real.sum()) * (w / mb.n_events)
    for g, r in zip(got["grads"], torch.autograd.grad(ref, params)):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss_sum, ref.detach() * w, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        gap_sum, (d_real.sum() - d_fake.sum()).detach() / mb.n_events * w, rtol=1e-5, atol=1e-6
    )


@pytest.mark.slow
def test_compiled_step_matches_the_eager_step(monkeypatch):
    """With the penalty on too: the WGAN terms run through the compiled critic, the
    penalty's double backward through the eager one; losses and updates are the eager
    step's to rounding (with the eager random numbers: compiled code draws its noise
    from a stream of its own unless ``fallback_random``)."""
    import torch._inductor.config

    monkeypatch.setattr(torch._inductor.config, "fallback_random", True)
    for lam in (10.0, 0.0):
        ocfg = OptimConfig(n_critic=2, gp_lambda=lam, gp_max_pairs=8)
        runs = []
        for compile_ in (False, True):
            gen, critic = small_models()
            step = GanStep(gen, critic, ocfg, TrainConfig(compile=compile_), "cpu")
            assert step.compiled is compile_
            assert (step._critic_fwd == critic.score) is not compile_
            torch.manual_seed(3)
            outs = [step(micro(seed=seed)) for seed in (0, 1)]
            runs.append((outs, params(gen) + params(critic)))
        (eager, p_eager), (compiled, p_compiled) = runs
        for a, b in zip(eager, compiled):
            assert set(b) == KEYS and int(b["skipped"]) == 0
            for k in KEYS:
                torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5)
        for a, b in zip(p_eager, p_compiled):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_compile_applies_where_asked_and_possible(monkeypatch, caplog):
    from muongen.train import compile_probe

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(compile_probe, "_can_compile", lambda device: True)
    assert compile_probe.compiles(True, cpu) and compile_probe.compiles(True, cuda)
    assert compile_probe.compiles("cuda", cuda) and not compile_probe.compiles("cuda", cpu)
    assert not compile_probe.compiles(False, cuda)
    monkeypatch.undo()

    # no C compiler: a warning naming what is missing, and the step runs as usual
    monkeypatch.setattr(compile_probe, "c_compiler", lambda: None)
    gen, critic = small_models()
    with caplog.at_level("WARNING", logger="muongen.train.compile_probe"):
        step = GanStep(gen, critic, OptimConfig(n_critic=1), TrainConfig(compile=True), "cpu")
    assert not step.compiled and step._critic_fwd == critic.score
    assert "train.compile needs a C compiler" in caplog.text
    assert set(step(micro())) == KEYS


def test_a_failed_compilation_runs_the_step_uncompiled(monkeypatch):
    """A backend that fails (as inductor does without libcuda or a working compiler) is
    logged by torch and the step runs eagerly: the uncompiled step's very numbers (both
    with torch's BLAS: a compiled step never takes oneDNN, train.cpu_matmul)."""
    import torch._dynamo

    from muongen.train import compile_probe

    def broken(gm, example_inputs):
        raise RuntimeError("no libcuda.so for triton")

    torch._dynamo.reset()
    monkeypatch.setattr(torch._dynamo.config, "suppress_errors", False)
    monkeypatch.setattr(compile_probe, "_can_compile", lambda device: True)
    monkeypatch.setattr(compile_probe, "COMPILE_BACKEND", broken)
    results = []
    for compile_ in (False, True):
        gen, critic = small_models()
        train_cfg = TrainConfig(compile=compile_, cpu_matmul="blas")
        step = GanStep(gen, critic, OptimConfig(n_critic=1), train_cfg, "cpu")
        assert step.compiled is compile_
        torch.manual_seed(4)
        results.append((step(micro()), params(gen) + params(critic)))
    torch._dynamo.reset()
    (eager, p_eager), (fallback, p_fallback) = results
    assert all(torch.equal(eager[k], fallback[k]) for k in KEYS)
    assert same(p_eager, p_fallback)


def test_c_compiler_follows_cc(monkeypatch, tmp_path):
    from muongen.train.step import c_compiler

    cc = tmp_path / "my-cc"
    cc.write_text("#!/bin/sh\n")
    cc.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CC", "my-cc")
    assert c_compiler() == "my-cc"
    monkeypatch.delenv("CC")
    assert c_compiler() is None  # no cc, gcc or clang on this PATH


def test_sync_grads_is_called_once_per_update():
    calls = []
    gen, critic = small_models()
    with torch.no_grad():
        set_multiplicity(gen, 0.6)  # about 3 muons per event, not all zero
    step = GanStep(
        gen, critic, OptimConfig(n_critic=3), TrainConfig(), "cpu", sync_grads=calls.append
    )
    step(micro(parts=4))
    assert calls == [critic, critic, critic, gen]


def test_state_dict_round_trip():
    gen, critic = small_models(seed=1)
    ocfg = OptimConfig(n_critic=2, gp_every=3, schedule="cosine", warmup_steps=2)
    tcfg = TrainConfig(max_steps=10)
    step = GanStep(gen, critic, ocfg, tcfg, "cpu")
    for i in range(3):
        step(micro(seed=i))
    sd = copy.deepcopy(step.state_dict())
    weights = copy.deepcopy((gen.state_dict(), critic.state_dict()))

    gen2, critic2 = small_models(seed=9)
    gen2.load_state_dict(weights[0])
    critic2.load_state_dict(weights[1])
    step2 = GanStep(gen2, critic2, ocfg, tcfg, "cpu")
    step2.load_state_dict(sd)
    assert step2.generator_step_count == 3 and step2.critic_step_count == 6
    assert step2.opt_g.param_groups[0]["lr"] == step.opt_g.param_groups[0]["lr"]

    torch.manual_seed(5)
    a = step(micro(seed=7))
    torch.manual_seed(5)
    b = step2(micro(seed=7))
    assert all(torch.equal(a[k], b[k]) for k in KEYS)
    assert same(params(gen), params(gen2)) and same(params(critic), params(critic2))

    # hyperparameters come from the current config, the step from the checkpoint
    ocfg3 = OptimConfig(n_critic=2, schedule="cosine", warmup_steps=2, lr_critic=1e-3)
    step3 = GanStep(gen2, critic2, ocfg3, tcfg, "cpu")
    step3.load_state_dict(step2.state_dict())
    expected = 1e-3 * lr_factor(
        4, schedule="cosine", warmup_steps=2, decay_steps=10, min_lr_ratio=0.1
    )
    assert math.isclose(step3.opt_c.param_groups[0]["lr"], expected)
    assert step3.sched_c.get_last_lr() == [step3.opt_c.param_groups[0]["lr"]]


def test_changed_optimizer_is_reset_with_a_warning(caplog):
    gen, critic = small_models()
    step = GanStep(gen, critic, OptimConfig(n_critic=1), TrainConfig(), "cpu")
    step(micro())
    sd = step.state_dict()
    other = GanStep(gen, critic, OptimConfig(optimizer="sgd", n_critic=1), TrainConfig(), "cpu")
    with caplog.at_level("WARNING"):
        other.load_state_dict(sd)
    assert "reset" in caplog.text
    assert other.generator_step_count == 1  # counters still restored
    assert isinstance(other.opt_c, torch.optim.SGD)
    assert int(other(micro(seed=1))["skipped"]) == 0
    fresh = GanStep(gen, critic, OptimConfig(), TrainConfig(), "cpu")
    fresh.load_state_dict({})  # a checkpoint without step state: nothing to restore
    assert fresh.generator_step_count == 0


def test_lr_schedule_is_a_pure_function_of_the_step():
    f = dict(schedule="cosine", warmup_steps=4, decay_steps=14, min_lr_ratio=0.1)
    assert [lr_factor(s, **f) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert math.isclose(lr_factor(9, **f), 0.55)
    assert math.isclose(lr_factor(14, **f), 0.1) and math.isclose(lr_factor(99, **f), 0.1)
    assert lr_factor(50, schedule="constant", warmup_steps=0, decay_steps=0, min_lr_ratio=0) == 1


def _wasserstein(gen, batch):
    with torch.no_grad():
        _, counts, _ = gen(batch.conditions)
        muons = gen.generate_with_counts(batch.conditions, batch.counts)
    energy = wasserstein_distance(batch.muons[:, 0].numpy(), muons[:, 0].numpy())
    mult = wasserstein_distance(batch.counts.numpy(), counts.numpy())
    return energy, mult


def test_learns_a_conditional_toy_distribution():
    """A few hundred CPU steps pull energy and multiplicity towards the toy's (~15 s)."""
    torch.manual_seed(0)
    gen, critic = build_models(ModelConfig(context=64))
    ocfg = OptimConfig(
        lr_generator=5e-4,
        lr_critic=5e-4,
        betas=[0.5, 0.9],
        n_critic=3,
        gp_every=1,
        gp_max_pairs=512,
    )
    step = GanStep(gen, critic, ocfg, TrainConfig(), "cpu")
    held_out = toy_batch(4000, torch.Generator().manual_seed(2))
    energy0, mult0 = _wasserstein(gen, held_out)
    data = torch.Generator().manual_seed(1)
    for _ in range(400):
        out = step([toy_batch(128, data)])
    assert int(step.skipped_critic) == 0 and torch.isfinite(out["c_loss"])
    energy, mult = _wasserstein(gen, held_out)
    assert energy < 0.25 * energy0, (energy0, energy)
    assert mult < 0.35 * mult0, (mult0, mult)  # a deterministic head cannot match a spread


@pytest.mark.parametrize("mode", ["round", "lognormal"])
def test_m_loss_follows_the_multiplicity_mode(mode):
    """round: m_loss is the original's MSE of the mean; lognormal: the Gaussian NLL of the
    real log10(N + 1) under the head's mean and spread (before this step's update)."""
    from muongen.model.losses import multiplicity_loss, multiplicity_nll

    gen, critic = small_models(multiplicity=mode)
    batch = micro(parts=1)
    with torch.no_grad():
        mean, log_std = gen.multiplicity_params(batch[0].conditions)
        expected = (
            multiplicity_loss(mean, batch[0].counts)
            if mode == "round"
            else multiplicity_nll(mean, log_std, batch[0].counts)
        )
    out = GanStep(gen, critic, OptimConfig(n_critic=1), TrainConfig(), "cpu")(batch)
    assert math.isclose(float(out["m_loss"]), float(expected), rel_tol=1e-5)
    assert (log_std is None) == (mode == "round")


def test_the_step_trains_the_hurdle_head_by_its_own_loss():
    """hurdle: m_loss is the head's BCE plus pinball loss on the real counts (its targets'
    dequantisation noise aside), and the update moves both of the head's networks."""
    gen, critic = small_models(multiplicity="hurdle")
    batch = micro(parts=1)
    with torch.no_grad():
        expected = [float(gen.multiplicity_loss(batch[0].conditions, batch[0].counts))]
        expected += [float(gen.multiplicity_loss(batch[0].conditions, batch[0].counts))]
    before = {n: p.detach().clone() for n, p in gen.multiplicity.named_parameters()}
    out = GanStep(gen, critic, OptimConfig(n_critic=1), TrainConfig(), "cpu")(batch)
    assert min(expected) - 0.05 < float(out["m_loss"]) < max(expected) + 0.05
    moved = {
        n.split(".")[0]
        for n, p in gen.multiplicity.named_parameters()
        if not torch.equal(p, before[n])
    }
    assert moved == {"zero", "knots"}


def _gan_state(gen) -> dict[str, torch.Tensor]:
    """The generator's weights outside its multiplicity head."""
    return {k: v for k, v in gen.state_dict().items() if not k.startswith("multiplicity.")}


def test_the_gan_trains_apart_from_the_multiplicity_head():
    """With the real counts on the fakes the GAN part (critic, and the generator outside its
    multiplicity head) gets the same updates whatever the head is: docs/fidelity.md ("The
    exact small counts in the preset") compares heads on one GAN on that ground."""
    ocfg = OptimConfig(n_critic=2, gp_every=1, event_weight="log")
    gen0, critic0 = small_models(seed=5, mult_exact=0)
    gen2, critic2 = small_models(seed=5, mult_exact=2)
    # the same GAN weights, each its own head
    assert not gen2.load_state_dict(_gan_state(gen0), strict=False).unexpected_keys
    critic2.load_state_dict(critic0.state_dict())
    local_before = params(gen0.local_net)
    for gen, critic in ((gen0, critic0), (gen2, critic2)):
        step = GanStep(gen, critic, ocfg, TrainConfig(), "cpu")
        torch.manual_seed(7)
        for i in range(3):
            step(micro(seed=i))
    gan0, gan2 = _gan_state(gen0), _gan_state(gen2)
    assert gan0.keys() == gan2.keys()
    assert all(torch.equal(gan0[k], gan2[k]) for k in gan0)
    assert same(params(critic0), params(critic2))
    assert not same(params(gen0.local_net), local_before)  # it trained


def _check_critic_update(gen, crit, batch, ocfg, weight=None):
    """One critic update of ``step([batch])`` with deterministic fakes (real + 0.3) and SGD
    at lr 1: its c_loss, w_gap and parameter change are checked against those of
    sum_e w_e (D(fake_e) - D(real_e)) / B by hand (w_e = 1 without ``weight``).

    Returns the step's output, the fakes, and that loss and its unweighted twin.
    """
    step = GanStep(gen, crit, ocfg, TrainConfig(), "cpu")
    fake = batch.muons + 0.3  # deterministic fakes: the same for the step and the check
    step._generate = lambda cond, c, n: fake
    plain = copy.deepcopy(crit)
    w = torch.ones(batch.n_events) if weight is None else weight
    d_real = plain(batch.muons, batch.conditions, batch.counts)
    d_fake = plain(fake, batch.conditions, batch.counts)
    loss = (w * (d_fake - d_real)).mean()
    loss.backward()
    before = params(crit)
    step.opt_c = torch.optim.SGD(crit.parameters(), lr=1.0)  # update = -gradient
    step._fused = False
    out = step([batch])
    torch.testing.assert_close(out["c_loss"], loss.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out["w_gap"], -loss.detach(), rtol=1e-5, atol=1e-6)
    for p0, p1, ref in zip(before, params(crit), plain.parameters()):
        torch.testing.assert_close(p0 - p1, ref.grad, rtol=1e-4, atol=1e-6)
    return out, fake, loss.detach(), (d_fake - d_real).mean().detach()


@pytest.mark.parametrize("kind", ["log", "sqrt"])
def test_event_weights_weigh_real_and_fake_alike(kind):
    """optim.event_weight=log|sqrt: c_loss, w_gap and the critic's gradient are those of
    sum_e w_e (D(fake_e) - D(real_e)) / B with w_e = log(1 + N_e) or sqrt(N_e) normalised
    to mean 1 over the batch (empty events weigh 0), and g_loss that of
    -sum_e w_e D(fake_e) / B."""
    gen, crit = small_models(critic_global_width=16)
    batch = toy_batch(40, torch.Generator().manual_seed(3))
    assert (batch.counts == 0).any() and int(batch.counts.max()) > 3
    n = batch.counts.double()
    f = torch.log1p(n) if kind == "log" else n.sqrt()
    w = (f * 40 / f.sum()).float()
    ocfg = OptimConfig(n_critic=1, gp_lambda=0.0, event_weight=kind)
    out, fake, loss, unweighted = _check_critic_update(gen, crit, batch, ocfg, w)
    assert abs(float(loss - unweighted)) > 1e-4  # the weights changed something
    with torch.no_grad():
        d_after = crit(fake, batch.conditions, batch.counts)
    torch.testing.assert_close(out["g_loss"], -(w * d_after).sum() / 40, rtol=1e-5, atol=1e-6)


def test_event_weights_need_the_real_counts():
    gen, crit = small_models()
    ocfg = OptimConfig(event_weight="log")
    with pytest.raises(ConfigError, match="fake_counts"):
        GanStep(gen, crit, ocfg, TrainConfig(fake_counts="predicted"), "cpu")


@pytest.mark.parametrize("critic", ["pointnet", "epic"])
def test_scoring_only_events_with_muons_keeps_the_batch_means(critic):
    """With the real counts the critic scores only events with muons (most are empty
    here); c_loss, w_gap and the critic's gradient are still
    those of mean D(fake) - mean D(real) over all B events, empty ones included."""
    gen, crit = small_models(critic=critic, critic_global_width=16)
    batch = toy_batch(40, torch.Generator().manual_seed(3))
    keep = torch.rand(40, generator=torch.Generator().manual_seed(4)) < 0.15
    counts = torch.where(keep, batch.counts, 0)
    muons = batch.muons[torch.repeat_interleave(keep, batch.counts)]
    batch = RaggedBatch(batch.conditions, muons, counts)
    assert 0 < batch.n_muons < batch.n_events and (counts == 0).sum() > 20
    _check_critic_update(gen, crit, batch, OptimConfig(n_critic=1, gp_lambda=0.0))


def test_log_radius_penalty_interpolates_in_the_critics_input_space():
    """With model.critic_log_radius the penalty gets the critic's inputs (standardised
    features plus the log radius), so it holds the critic to unit slope in the log radius."""
    gen, critic = small_models(critic_log_radius=True)
    step = GanStep(gen, critic, OptimConfig(n_critic=1, gp_every=1), TrainConfig(), "cpu")
    seen = []
    penalty = step.penalty_fn

    def spy(score, cond, real, real_counts, fake, fake_counts, **kw):
        seen.append((real.detach(), fake.detach()))
        return penalty(score, cond, real, real_counts, fake, fake_counts, **kw)

    step.penalty_fn = spy
    batch = toy_batch(24, torch.Generator().manual_seed(2))
    out = step([batch])
    assert torch.isfinite(out["gp"]) and out["gp"] > 0
    ((real, fake),) = seen
    assert real.shape[1] == fake.shape[1] == 4
    torch.testing.assert_close(real, critic.inputs(batch.muons))


@pytest.mark.parametrize("preset", ["production-a100", "quality"])
def test_a_step_runs_under_bf16_autocast(preset):
    """``train.precision=bf16`` (production-a100's setting until 2026-11) runs every forward
    under autocast on CUDA; CPU autocast casts the same ops, so the step is checked here
    with it. The split layers' in-place ``addmm_`` is not cast by autocast and once met bf16
    rows with fp32 weights ("self and mat2 must have the same dtype")."""
    from muongen.config import load_config
    from muongen.train.bench_step import synthetic_batch

    cfg = load_config(preset, ["train.device=cpu", "train.step_shards=1"])
    torch.manual_seed(0)
    gen, critic = build_models(cfg.model)
    step = GanStep(gen, critic, cfg.optim, cfg.train, "cpu")
    step.amp_dtype = torch.bfloat16  # what precision=bf16 sets on CUDA
    before_g, before_c = params(gen), params(critic)
    out = step([synthetic_batch(256, "rich")])
    assert all(torch.isfinite(out[k]) for k in ("c_loss", "g_loss", "m_loss", "gp", "w_gap"))
    assert int(out["skipped"]) == 0
    assert not same(before_g, params(gen)) and not same(before_c, params(critic))
    assert all(p.dtype == torch.float32 for p in gen.parameters())


@pytest.mark.parametrize("critic", ["pointnet", "epic"])
def test_the_muon_critic_adds_the_pooled_mean_over_muons(critic):
    """model.muon_critic: the critic's update is that of mean_e (D(fake_e) - D(real_e))
    plus weight * (sum s(fake muon) - sum s(real muon)) / (muons of the batch): every muon
    counts alike, whatever its bundle; w_gap stays the set critic's."""
    gen, crit = small_models(critic=critic, muon_critic=[8], critic_global_width=16)
    batch = toy_batch(40, torch.Generator().manual_seed(3))
    ocfg = OptimConfig(n_critic=1, gp_lambda=0.0, muon_critic_weight=0.7)
    step = GanStep(gen, crit, ocfg, TrainConfig(), "cpu")
    assert step.muon_critic
    fake = batch.muons + 0.3
    step._generate = lambda cond, c, n: fake
    plain = copy.deepcopy(crit)
    cond, counts = batch.conditions, batch.counts
    ev = torch.repeat_interleave(torch.arange(40), counts)
    d = plain(fake, cond, counts) - plain(batch.muons, cond, counts)
    s_real = plain.muon_scores(plain.inputs(batch.muons), cond, counts, ev)
    s_fake = plain.muon_scores(plain.inputs(fake), cond, counts, ev)
    muon_term = 0.7 * (s_fake.sum() - s_real.sum()) / batch.n_muons
    loss = d.mean() + muon_term
    loss.backward()
    before = params(crit)
    step.opt_c = torch.optim.SGD(crit.parameters(), lr=1.0)
    step._fused = False
    out = step([batch])
    torch.testing.assert_close(out["c_loss"], loss.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out["w_gap"], -d.mean().detach(), rtol=1e-5, atol=1e-6)
    for p0, p1, ref in zip(before, params(crit), plain.parameters()):
        torch.testing.assert_close(p0 - p1, ref.grad, rtol=1e-4, atol=1e-6)
    assert plain.muon_critic.first.weight.grad.abs().sum() > 0


def test_the_muon_critic_trains_with_its_penalty_and_moves_the_generator():
    """With the penalty on, the per-muon critic's weights move and its term reaches the
    generator: the same step with weight 0 makes another generator update."""

    def run(weight):
        gen, crit = small_models(seed=4, muon_critic=[8])
        ocfg = OptimConfig(n_critic=2, gp_every=1, muon_critic_weight=weight, muon_gp_rows=16)
        step = GanStep(gen, crit, ocfg, TrainConfig(seed=1), "cpu")
        m0 = params(crit.muon_critic)
        out = step(micro(seed=7))
        for v in out.values():
            assert torch.isfinite(v)
        return out, m0, params(crit.muon_critic), params(gen)

    out, m0, m1, g1 = run(1.0)
    assert out["gp"] > 0 and not same(m0, m1)
    _, _, _, g0 = run(0.0)
    assert not all(torch.allclose(a, b) for a, b in zip(g0, g1))


def test_the_muon_critic_needs_the_real_counts():
    from muongen.config import Config, validate

    cfg = Config()
    cfg.model.muon_critic = [16]
    cfg.train.fake_counts = "predicted"
    with pytest.raises(ConfigError, match=r"model\.muon_critic"):
        validate(cfg)
    cfg.train.fake_counts, cfg.model.muon_critic = "real", [0]
    with pytest.raises(ConfigError, match="positive widths"):
        validate(cfg)
    gen, crit = small_models(muon_critic=[8])
    with pytest.raises(ConfigError, match="fake_counts"):
        GanStep(gen, crit, OptimConfig(), TrainConfig(fake_counts="predicted"), "cpu")


def test_quantile_matching_moves_the_generator_and_only_it():
    """optim.quantile_match adds a generator term: the critic's update is unchanged, the
    generator's differs from the same step without it; it needs the real counts."""

    def run(weight, shards=1):
        gen, crit = small_models(seed=4)
        ocfg = OptimConfig(n_critic=1, gp_every=1, quantile_match=weight, quantile_match_groups=2)
        step = GanStep(gen, crit, ocfg, TrainConfig(seed=1, step_shards=shards), "cpu")
        torch.manual_seed(11)
        out = step(micro(seed=7, b=64))
        for v in out.values():
            assert torch.isfinite(v)
        return params(crit), params(gen)

    c0, g0 = run(0.0)
    c1, g1 = run(1.0)
    assert same(c0, c1)
    assert not all(torch.allclose(a, b) for a, b in zip(g0, g1))
    gen, crit = small_models()
    with pytest.raises(ConfigError, match="quantile_match"):
        GanStep(
            gen, crit, OptimConfig(quantile_match=1.0), TrainConfig(fake_counts="predicted"), "cpu"
        )
    from muongen.config import Config, validate

    cfg = Config()
    cfg.optim.quantile_match_groups = 0
    with pytest.raises(ConfigError, match="quantile_match_groups"):
        validate(cfg)


def test_quantile_matching_by_bundle_size_changes_the_update():
    """optim.quantile_match_sizes cuts the groups by bundle size: another generator update
    than the same step without it, finite, both weighings."""

    def run(sizes, weigh):
        gen, crit = small_models(seed=4)
        ocfg = OptimConfig(
            n_critic=1, quantile_match=1.0, quantile_match_sizes=sizes, quantile_match_weigh=weigh
        )
        step = GanStep(gen, crit, ocfg, TrainConfig(seed=1, step_shards=1), "cpu")
        torch.manual_seed(11)
        out = step(micro(seed=7, b=64))
        assert all(torch.isfinite(v) for v in out.values())
        return params(gen)

    for weigh in ("groups", "muons"):
        a, b = run(False, weigh), run(True, weigh)
        assert not all(torch.allclose(x, y) for x, y in zip(a, b))


def test_quantile_matching_weighs_groups_alike_when_asked():
    """optim.quantile_match_weigh: groups gives the group mean (times the events' share),
    muons the sum over the batch's muons: two updates that differ."""

    def run(weigh):
        gen, crit = small_models(seed=4)
        ocfg = OptimConfig(n_critic=1, quantile_match=1.0, quantile_match_weigh=weigh)
        step = GanStep(gen, crit, ocfg, TrainConfig(seed=1, step_shards=1), "cpu")
        torch.manual_seed(11)
        step(micro(seed=7, b=64))
        return params(gen)

    a, b = run("groups"), run("muons")
    assert not all(torch.allclose(x, y) for x, y in zip(a, b))
