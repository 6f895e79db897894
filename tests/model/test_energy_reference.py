"""model.energy_reference: per_nucleon: energies measured from the primary's E0 / A."""

from __future__ import annotations

import pytest
import torch

from muongen.data.batch import RaggedBatch
from muongen.model import build_models
from muongen.model.normaliser import fit_normalisers, normalisers_fitted, per_nucleon_energy

from .conftest import small_model_config


def _batch(seed: int = 0, b: int = 40) -> RaggedBatch:
    """Events whose muons all lie 0.5-3.5 decades below E0 / A (feature units)."""
    gen = torch.Generator().manual_seed(seed)
    log_a = torch.log10(torch.tensor([1.0, 4.0, 56.0]))
    cond = torch.stack(
        [
            torch.rand(b, generator=gen) * 4 - 2,  # log10(E0 / 1e6 GeV)
            torch.rand(b, generator=gen),
            log_a[torch.randint(0, 3, (b,), generator=gen)],
            1 + torch.rand(b, generator=gen),
        ],
        1,
    )
    counts = torch.randint(0, 9, (b,), generator=gen)
    event = torch.repeat_interleave(torch.arange(b), counts)
    n = int(counts.sum())
    below = 0.5 + 3 * torch.rand(n, generator=gen)
    muons = torch.stack(
        [cond[event, 0] - cond[event, 2] - below, torch.randn(n, generator=gen) * 0.01,
         torch.randn(n, generator=gen) * 0.01], 1,
    )  # fmt: skip
    return RaggedBatch(cond, muons, counts)


@pytest.mark.parametrize("lateral_head", ["xy", "polar"])
def test_generator_energies_follow_each_events_energy_per_nucleon(lateral_head):
    """The standardised energy output is log10(E / (E0 / A)), fitted on the real muons;
    E0 / A is added back per event, so the same noise gives muons exactly as many
    decades below E0 / A in an event of any E0 and A."""
    torch.manual_seed(0)
    cfg = small_model_config(energy_reference="per_nucleon", lateral_head=lateral_head)
    gen, critic = build_models(cfg)
    batch = _batch()
    fit_normalisers(gen, critic, batch)
    assert normalisers_fitted(gen) and normalisers_fitted(critic)
    ref = torch.repeat_interleave(per_nucleon_energy(batch.conditions), batch.counts)
    rel = (batch.muons[:, 0] - ref).double()
    torch.testing.assert_close(gen.energy_norm.mean[0].double(), rel.mean(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        critic.energy_norm.std[0].double(), rel.std(correction=0), rtol=1e-4, atol=1e-5
    )
    # one event's condition, then the same with E0 ten times higher and A four times
    cond = batch.conditions[:1].repeat(2, 1)
    cond[1, 0] += 1.0
    cond[1, 2] += torch.log10(torch.tensor(4.0))
    counts = torch.tensor([5, 5])
    with torch.no_grad():
        gen.cond_norm.std.fill_(1e6)  # the nets see (nearly) the same condition
        muons = [
            gen.generate_with_counts(c, counts[:1], 5, generator=torch.Generator().manual_seed(3))
            for c in (cond[:1], cond[1:])
        ]
    shift = float(per_nucleon_energy(cond[1:]) - per_nucleon_energy(cond[:1]))
    assert abs(shift - (1.0 - 0.60206)) < 1e-4
    torch.testing.assert_close(
        muons[1][:, 0] - muons[0][:, 0], torch.full((5,), shift), atol=1e-4, rtol=0
    )
    if lateral_head == "polar":  # the lateral part does not move
        r = [torch.hypot(m[:, 1], m[:, 2]) for m in muons]
        torch.testing.assert_close(r[0], r[1], atol=1e-5, rtol=1e-4)


def test_generator_without_reference_has_no_energy_norm_and_keeps_its_state_dict():
    gen, critic = build_models(small_model_config())
    assert gen.energy_norm is None and critic.energy_norm is None
    assert not any(k.startswith("energy_norm") for k in gen.state_dict())
    gen2, critic2 = build_models(small_model_config(energy_reference="per_nucleon"))
    assert critic2.n_features == critic.n_features + 1
    # a checkpoint of the other setting does not load silently
    with pytest.raises(RuntimeError, match="energy_norm"):
        gen.load_state_dict(gen2.state_dict())


@pytest.mark.parametrize("critic_kind", ["epic", "pointnet"])
def test_critic_sees_the_energy_per_nucleon_and_the_penalty_reaches_it(critic_kind):
    """The critic's extra input is each muon's standardised log10(E / (E0 / A)): scores
    change when only E0 / A moves (muons and the nets' condition inputs fixed), and the
    gradient of the score on the inputs (the gradient penalty's) flows through it."""
    torch.manual_seed(1)
    cfg = small_model_config(energy_reference="per_nucleon", critic=critic_kind)
    gen, critic = build_models(cfg)
    batch = _batch(seed=2)
    fit_normalisers(gen, critic, batch)
    inputs = critic.inputs(batch.muons).requires_grad_(True)
    assert inputs.shape[1] == critic.n_features - 1  # appended inside score
    score = critic.score(inputs, batch.conditions, batch.counts)
    (grad,) = torch.autograd.grad(score.sum(), inputs)
    assert torch.isfinite(grad).all() and grad[:, 0].abs().sum() > 0
    with torch.no_grad():
        critic.cond_norm.std.fill_(1e6)  # the condition inputs barely move
        moved = batch.conditions.clone()
        moved[:, 0] += 1.0
        before = critic.score(inputs, batch.conditions, batch.counts)
        after = critic.score(inputs, moved, batch.counts)
    has = batch.counts > 0
    assert (before[has] - after[has]).abs().min() > 0
    torch.testing.assert_close(before[~has], after[~has], atol=1e-4, rtol=1e-4)


def test_exp_noise_is_exponential_and_only_in_the_first_columns():
    """model.local_exp_noise: N(0, 1) draws mapped to Exp(1) - 1 (Kolmogorov-Smirnov
    distance to Exp(1) below 0.005 on 200000 draws, where a Gaussian's is ~0.1), only in
    the first k columns, and monotone in z (the noise's order is kept)."""
    from muongen.model.generator import exp_noise, with_exp_noise

    z = torch.randn(200000, 4, generator=torch.Generator().manual_seed(0))
    out = with_exp_noise(z, 2)
    assert torch.equal(out[:, 2:], z[:, 2:])
    e = torch.sort(out[:, 0].double() + 1.0).values
    cdf = 1.0 - torch.exp(-e)
    ks = (cdf - torch.arange(1, len(e) + 1, dtype=torch.float64) / len(e)).abs().max()
    assert ks < 0.005, ks
    assert abs(float(e.mean()) - 1.0) < 0.01 and float(e.min()) >= 0.0
    grid = torch.linspace(-8, 8, 1001)
    assert (exp_noise(grid).diff() >= 0).all() and torch.isfinite(exp_noise(grid)).all()
    assert torch.equal(with_exp_noise(z, 0), z)


def test_exp_noise_is_finite_for_bf16_draws():
    """Under bf16 (train.precision on CUDA, the noise drawn in that dtype) the map runs in
    fp32: in bf16, 1 - erf(z / sqrt 2) rounds to 0 from z ~ 2.7 and its log made the step's
    losses NaN. The result keeps the input's dtype and matches the fp32 map to bf16's
    precision."""
    from muongen.model.generator import exp_noise

    grid = torch.linspace(-8, 8, 1001)
    out = exp_noise(grid.bfloat16())
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), exp_noise(grid), rtol=1e-2, atol=1e-2)


def test_generator_feeds_the_exponential_noise_to_its_local_net():
    """The same seed gives the same Gaussian draws; with local_exp_noise=2 the local net
    sees their first two columns mapped, which changes the muons (counts fixed)."""
    torch.manual_seed(2)
    plain, _ = build_models(small_model_config())
    torch.manual_seed(2)
    exp, _ = build_models(small_model_config(local_exp_noise=2))
    exp.load_state_dict(plain.state_dict())
    cond, counts = torch.randn(6, 4), torch.tensor([3, 0, 5, 1, 2, 4])
    with torch.no_grad():
        a, b = (
            m.generate_with_counts(cond, counts, 15, generator=torch.Generator().manual_seed(9))
            for m in (plain, exp)
        )
    assert a.shape == b.shape == (15, 3) and not torch.allclose(a, b)
    from muongen.config import load_config
    from muongen.errors import ConfigError

    with pytest.raises(ConfigError, match=r"model\.local_exp_noise"):
        load_config(None, ["model.local_exp_noise=17"])
