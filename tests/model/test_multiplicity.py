"""The hurdle multiplicity head: its quantile function, its draws and what it can fit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import wasserstein_distance

from muongen.model import build_models
from muongen.model.generator import counts_from_log_mult
from muongen.model.multiplicity import (
    ONE_MUON,
    HurdleMultiplicity,
    interpolate_quantiles,
    knot_levels,
    normal_cdf,
)

from .conftest import small_model_config


def _knots(b: int = 3, k: int = 8, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    steps = torch.rand(b, k - 1, generator=g, dtype=torch.float64) + 0.05
    return torch.cat([torch.zeros(b, 1, dtype=torch.float64), steps.cumsum(1)], 1)


def test_quantile_function_passes_its_knots_and_is_monotone_and_continuous():
    knots, levels = _knots(), knot_levels(8, 2.0)
    for k in range(8):  # exactly the knot at each level
        got = interpolate_quantiles(knots, levels, levels[k].expand(3))
        torch.testing.assert_close(got, knots[:, k])
    tau = torch.linspace(0.0, 1.0, 2001, dtype=torch.float64)
    q = interpolate_quantiles(knots[:1].expand(len(tau), -1), levels, tau)
    assert torch.isfinite(q).all() and (q.diff() >= 0).all()
    # exponential tails: below the first knot and above the last, unbounded but finite
    assert q[0] < knots[0, 0] - 0.1 and q[-1] > knots[0, -1] + 0.1
    for t in (levels[0], levels[-1]):  # value and slope continuous where the tails join
        eps = 1e-6
        at = torch.stack([t - 2 * eps, t - eps, t + eps, t + 2 * eps])
        v = interpolate_quantiles(knots[:1].expand(4, -1), levels, at)
        assert abs(float(v[2] - v[1])) < 1e-4
        left, right = (v[1] - v[0]) / eps, (v[3] - v[2]) / eps
        assert math.isclose(float(left), float(right), rel_tol=1e-3)


@pytest.mark.parametrize("shared", [False, True])
@torch.no_grad()
def test_hurdle_draws_are_empty_exactly_where_the_uniform_falls_below_p0(shared):
    torch.manual_seed(0)
    head = HurdleMultiplicity(4, [16], 8, 2.5, shared=shared)
    head.output_bias("zero").fill_(0.3)
    c, z = torch.randn(5000, 4), torch.randn(5000)
    logit, knots = head.params(c)
    p0, u = torch.sigmoid(logit), normal_cdf(z)
    counts = counts_from_log_mult(head.sample(c, z))
    assert torch.equal(counts == 0, u < p0)
    assert 0.2 < float((counts == 0).float().mean()) < 0.8
    assert int(counts[u >= p0].min()) == 1  # the lowest draws are one muon, not zero
    # given N >= 1, the draw is the quantile function at (u - p0) / (1 - p0)
    keep = u >= p0
    tau = (u - p0) / (1 - p0)
    want = interpolate_quantiles(knots, head.levels, tau).clamp(min=ONE_MUON)
    torch.testing.assert_close(head.sample(c, z)[keep], want[keep])


@pytest.mark.parametrize("shared", [False, True])
@torch.no_grad()
def test_exact_counts_take_their_share_of_the_draw_and_the_knots_the_rest(shared):
    """mult_exact = 2: one muon exactly where v = (u - p0) / (1 - p0) < h_1, two where v
    falls in the next (1 - h_1) h_2, and above that the quantile function at the level
    left, (v - h_1 - (1 - h_1) h_2) / ((1 - h_1)(1 - h_2)), with at least 3 muons."""
    torch.manual_seed(0)
    head = HurdleMultiplicity(4, [16], 8, 2.5, n_exact=2, shared=shared)
    head.output_bias("zero").fill_(-0.5)
    c, z = torch.randn(20000, 4), torch.randn(20000)
    logit, knots = head.params(c)
    p0, u = torch.sigmoid(logit), normal_cdf(z)
    h = torch.sigmoid(head.outputs(c)[1])
    v = (u - p0) / (1 - p0)
    one = (u >= p0) & (v < h[:, 0])
    two = (u >= p0) & ~one & (v < h[:, 0] + (1 - h[:, 0]) * h[:, 1])
    y = head.sample(c, z)
    counts = counts_from_log_mult(y)
    assert torch.equal(counts == 0, u < p0)
    assert torch.equal(counts == 1, one) and torch.equal(counts == 2, two)
    assert one.sum() > 1000 and two.sum() > 500
    rest = (u >= p0) & ~one & ~two
    assert int(counts[rest].min()) == 3
    left = (v - h[:, 0] - (1 - h[:, 0]) * h[:, 1]) / ((1 - h[:, 0]) * (1 - h[:, 1]))
    want = interpolate_quantiles(knots, head.levels, left).clamp(min=math.log10(4.0))
    # (float32: the level left is rescaled in two steps here, in one there)
    torch.testing.assert_close(y[rest], want[rest], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(y[one], torch.full_like(y[one], math.log10(2.0)))
    # without exact counts the head is as it was: the quantile function from one muon up
    plain = HurdleMultiplicity(4, [16], 8, 2.5, shared=shared)
    assert plain.outputs(c)[1] is None and plain.lowest == ONE_MUON
    assert "exact" not in "".join(plain.state_dict())


@pytest.mark.parametrize("n_exact", [0, 2])
@torch.no_grad()
def test_on_the_cpu_the_knots_see_only_the_events_drawn_with_muons(n_exact, monkeypatch):
    # the exact counts' and the knots' MLPs on the events the draw leaves with muons only
    # (most events are empty at the production mix); the same draws as the whole batch's
    # (what a traced export runs)
    torch.manual_seed(0)
    head = HurdleMultiplicity(4, [16], 8, 2.5, n_exact=n_exact)
    head.output_bias("zero").fill_(1.5)  # ~80% empty
    c, z = torch.randn(20000, 4), torch.randn(20000)
    rows = []
    for mlp in [head.knots] + ([head.exact] if n_exact else []):
        mlp.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[0]))
    y = head.sample(c, z)
    empty = normal_cdf(z) < torch.sigmoid(head.params(c)[0])
    assert rows[: 1 + bool(n_exact)] == [int((~empty).sum())] * (1 + bool(n_exact))
    assert 0.7 < float(empty.float().mean()) < 0.9
    rows.clear()
    monkeypatch.setattr(torch.jit, "is_tracing", lambda: True)  # the whole batch's path
    whole = head.sample(c, z)
    assert rows and rows[0] == 20000
    assert torch.equal(counts_from_log_mult(y), counts_from_log_mult(whole))
    torch.testing.assert_close(y, whole, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("trunk", ["separate", "shared"])
def test_exact_counts_learn_the_probabilities_of_one_and_two_muons(trunk):
    """Trained on negative-binomial counts of shape 1 at one condition (a geometric
    distribution: P(N = m | N >= m) = 1 / (1 + mean) for every m), the exact counts'
    draws come out at P(1 | N >= 1) and P(2 | N >= 1) of the data, whether the outputs
    have MLPs of their own or share one trunk."""
    g = torch.Generator().manual_seed(2)
    torch.manual_seed(3)
    cfg = small_model_config(multiplicity="hurdle", mult_exact=2, mult_trunk=trunk)
    gen, _ = build_models(cfg)
    mean = 2.0
    _fit_counts(gen, mean, g)
    with torch.no_grad():
        drawn = counts_from_log_mult(gen.sample_log_multiplicity(torch.zeros(40000, 4)))
    some = drawn[drawn > 0]
    p = 1.0 / (1.0 + mean)
    assert abs(float((some == 1).float().mean()) - p) < 0.02
    assert abs(float((some == 2).float().mean()) - p * (1 - p)) < 0.02
    assert int(some.max()) > 10  # the knots carry the tail


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("n_exact", [0, 2])
def test_hurdle_loss_is_the_bces_plus_the_mean_pinball_above_the_exact_counts(n_exact, shared):
    """The BCE of "empty", one BCE of "N = m" over the events with N >= m per exact count
    m, and the mean pinball loss over the events with N above the exact counts."""
    torch.manual_seed(1)
    head = HurdleMultiplicity(4, [16], 6, 2.0, n_exact=n_exact, shared=shared)
    c = torch.randn(64, 4)
    counts = torch.tensor([0, 1, 2, 3, 40, 1, 0, 7] * 8)
    torch.manual_seed(5)
    loss = head.loss(c, counts)
    torch.manual_seed(5)
    logit, knots = head.params(c)
    y = torch.log10(counts + 0.5 + torch.rand(64)).unsqueeze(1)
    t = head.levels
    pin = torch.where(y >= knots, t * (y - knots), (1 - t) * (knots - y)).mean(1)
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    want = bce(logit, (counts == 0).float()) + pin[counts > n_exact].mean()
    for m in range(1, n_exact + 1):
        at = counts >= m
        want = want + bce(head.outputs(c)[1][at, m - 1], (counts[at] == m).float())
    torch.testing.assert_close(loss, want)


def test_a_shared_trunk_is_one_mlp_with_one_output_layer_for_every_output():
    """model.mult_trunk=shared: the outputs [logit p0, exact logits, knots] are slices of
    one output layer over one trunk of widths mult_hidden, which costs half of the
    separate MLPs; each output starts as the separate head's does."""
    torch.manual_seed(0)
    sep = HurdleMultiplicity(4, [64, 128, 64], 16, 2.5, n_exact=2)
    shared = HurdleMultiplicity(4, [64, 128, 64], 16, 2.5, n_exact=2, shared=True)
    assert {k.split(".")[0] for k in shared.state_dict()} == {"trunk", "out", "levels"}
    assert shared.out.out_features == 1 + 2 + 16
    n = {name: sum(p.numel() for p in h.parameters()) for name, h in (("sep", sep), ("sh", shared))}
    assert n["sh"] < 0.36 * n["sep"], n  # three MLPs against one trunk
    c = torch.randn(32, 4)
    with torch.no_grad():
        shared.out.weight.zero_()  # the outputs are then their biases
        logit, exact, raw = shared.outputs(c)
    torch.testing.assert_close(logit, torch.zeros(32))
    torch.testing.assert_close(raw, shared.output_bias("knots").expand(32, -1))
    torch.testing.assert_close(exact, shared.output_bias("exact").expand(32, -1))
    for part in ("zero", "knots"):
        torch.testing.assert_close(shared.output_bias(part), sep.output_bias(part))
    # the loss reaches every part of the trunk and the output layer
    head = HurdleMultiplicity(4, [16, 16], 8, 2.5, n_exact=2, shared=True)
    head.loss(torch.randn(64, 4), torch.tensor([0, 1, 2, 9] * 16)).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in head.parameters())


def test_a_checkpoint_of_separate_mlps_is_refused_by_a_shared_trunk_naming_the_setting():
    from muongen.checkpoint import load_module, model_differences
    from muongen.config import ModelConfig
    from muongen.errors import CheckpointError

    old = small_model_config(multiplicity="hurdle")
    new = small_model_config(multiplicity="hurdle", mult_trunk="shared")
    saved, _ = build_models(old)
    fresh, _ = build_models(new)
    differences = model_differences(_as_dict(old), _as_dict(new))
    assert differences == ["model.mult_trunk: 'separate' -> 'shared'"] or all(
        "mult_trunk" in d for d in differences
    )
    with pytest.raises(CheckpointError, match="mult_trunk"):
        load_module(fresh, saved.state_dict(), "generator", "old.pt", differences)
    assert ModelConfig().mult_trunk == "separate"  # old checkpoints keep their shape


def _as_dict(cfg) -> dict:
    import dataclasses

    return dataclasses.asdict(cfg)


def _fit_counts(gen, mean: float, g: torch.Generator, lower_rate_from: int = 0) -> None:
    """Train the generator's multiplicity head alone for 300 steps of 512 negative-binomial
    counts at one condition (Adam at 5e-3; 5e-4 from step ``lower_rate_from`` when given)."""
    opt = torch.optim.Adam(gen.multiplicity.parameters(), lr=5e-3)
    if gen.multiplicity_spread is not None:
        opt.add_param_group({"params": list(gen.multiplicity_spread.parameters())})
    cond = torch.zeros(512, 4)
    for i in range(300):
        if lower_rate_from and i == lower_rate_from:
            for group in opt.param_groups:
                group["lr"] = 5e-4
        counts = _negative_binomial(torch.full((512,), mean), g)
        loss = gen.multiplicity_loss(cond, counts)
        opt.zero_grad()
        loss.backward()
        opt.step()


def _negative_binomial(mean: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Counts of a negative binomial of shape 1 (muongen synth's multiplicity family)."""
    rate = mean * torch.empty_like(mean).exponential_(generator=g)
    return torch.poisson(rate, generator=g).long()


@pytest.mark.parametrize("mean", [0.4, 30.0])
def test_hurdle_head_fits_counts_a_lognormal_head_cannot(mean):
    """Both heads trained alike on negative-binomial counts at one condition: the hurdle
    gets P(0) right and its W1 of log10(N + 1) is well below the log-normal's."""
    g = torch.Generator().manual_seed(2)
    w1 = {}
    for mode in ("hurdle", "lognormal"):
        torch.manual_seed(3)
        gen, _ = build_models(small_model_config(multiplicity=mode))
        # a lower rate at the end: less batch noise in the fitted knots
        _fit_counts(gen, mean, g, lower_rate_from=200)
        with torch.no_grad():
            drawn = counts_from_log_mult(gen.sample_log_multiplicity(torch.zeros(10000, 4)))
        real = _negative_binomial(torch.full((10000,), mean), g)
        w1[mode] = wasserstein_distance(np.log10(drawn.numpy() + 1.0), np.log10(real.numpy() + 1.0))
        if mode == "hurdle":
            p0 = 1.0 / (1.0 + mean)  # shape-1 negative binomial
            assert abs(float((drawn == 0).float().mean()) - p0) < 0.02
    print(w1)
    assert w1["hurdle"] < 0.5 * w1["lognormal"], w1


def test_hurdle_generator_draws_one_normal_per_event_like_the_lognormal_head():
    """Same seed, same later noise: the hurdle head takes the multiplicity draw the
    lognormal head takes (the exported generator's event_noise column 0), no more."""
    gens = {}
    for mode in ("hurdle", "lognormal"):
        torch.manual_seed(0)
        gens[mode], _ = build_models(small_model_config(multiplicity=mode))
    gens["hurdle"].global_net.load_state_dict(gens["lognormal"].global_net.state_dict())
    gens["hurdle"].local_net.load_state_dict(gens["lognormal"].local_net.state_dict())
    cond = torch.randn(50, 4)
    counts = torch.full((50,), 2)
    after = {}
    for mode, gen in gens.items():
        rng = torch.Generator().manual_seed(9)
        gen.sample_log_multiplicity(cond, generator=rng)
        after[mode] = gen.generate_with_counts(cond, counts, generator=rng)
    torch.testing.assert_close(after["hurdle"], after["lognormal"])
    with pytest.raises(ValueError, match="hurdle"):
        gens["hurdle"].multiplicity_params(cond)
