"""Generator: counts follow the multiplicity head, shapes, representations, the cap."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny import set_multiplicity

from muongen.model import build_models
from muongen.model.generator import counts_from_log_mult

from .conftest import small_model_config


def _spread_head(generator, bias: float = 0.6, scale: float = 8.0) -> None:
    """Make the head predict a spread of multiplicities instead of all near zero."""
    last = generator.multiplicity[-1]
    with torch.no_grad():
        last.weight.mul_(scale)
        last.bias.fill_(bias)


@pytest.mark.parametrize("mode", ["round", "lognormal"])
def test_counts_equal_the_heads_rounding(mode):
    """round: counts are the rounding of the predicted mean (the original's); lognormal:
    the rounding of the log10(N + 1) drawn per event, which varies around the mean."""
    torch.manual_seed(0)
    gen, _ = build_models(small_model_config(multiplicity=mode))
    _spread_head(gen)
    cond = torch.randn(400, 4)
    muons, counts, log_mult = gen(cond)
    mean, log_std = gen.multiplicity_params(cond)
    if mode == "round":
        assert log_std is None and torch.equal(log_mult, mean)
    else:
        z = ((log_mult - mean) / log_std.exp()).detach()
        assert abs(float(z.mean())) < 0.2 and abs(float(z.std()) - 1.0) < 0.15
    m = log_mult.detach().double().numpy()
    expected = np.round(np.maximum(10.0**m - 1.0, 0.0)).astype(np.int64)
    expected = np.minimum(expected, gen.max_muons)
    assert len(np.unique(expected)) > 5, "the test needs varied multiplicities"
    assert (expected == 0).any() and expected.max() < gen.max_muons
    np.testing.assert_array_equal(counts.numpy(), expected)
    assert muons.shape == (int(expected.sum()), 3)
    assert counts.dtype == torch.int64


@pytest.mark.parametrize("mode", ["lognormal", "hurdle"])
def test_counts_are_capped_and_nan_gives_zero(mode):
    log_mult = torch.tensor([float("nan"), -3.0, 0.0, 1.0, 9.0])
    np.testing.assert_array_equal(counts_from_log_mult(log_mult, 50).numpy(), [0, 0, 0, 9, 50])
    gen, _ = build_models(small_model_config(max_generated_muons=7, multiplicity=mode))
    if mode == "hurdle":
        with torch.no_grad():
            set_multiplicity(gen, 3.0)  # ~1000 muons per event
    else:
        _spread_head(gen, bias=3.0)
    _, counts, _ = gen(torch.randn(30, 4))
    assert int(counts.max()) == 7


def test_generate_with_counts_follows_the_given_counts():
    torch.manual_seed(1)
    gen, _ = build_models(small_model_config())
    counts = torch.tensor([0, 3, 1, 0, 5])
    out = gen.generate_with_counts(torch.randn(5, 4), counts, 9)
    assert out.shape == (9, 3)
    assert torch.isfinite(out).all()
    # the same context is shared by an event's muons; the per-muon noise tells them apart
    assert not torch.allclose(out[1], out[2])


@pytest.mark.parametrize("representation, n_features", [("xy", 3), ("radial", 2)])
def test_representations(representation, n_features):
    torch.manual_seed(2)
    gen, critic = build_models(small_model_config(representation=representation))
    assert gen.representation == representation
    assert gen.n_features == n_features == critic.n_features
    with torch.no_grad():  # push the radial output negative before the softplus
        gen.local_net[-1].bias.fill_(-5.0)
    out = gen.generate_with_counts(torch.randn(8, 4), torch.full((8,), 4), 32)
    assert out.shape == (32, n_features)
    if representation == "radial":
        assert (out[:, 1] >= 0).all()
    else:
        assert (out[:, 1:] < 0).any()


def test_azimuthal_symmetry_is_exact_by_default():
    """By default each generated bundle is the unrotated generator's bundle turned by an
    angle 2 pi u, u ~ U(0, 1) drawn per event after all other noise. Turning the output
    by any fixed angle d is then the same as drawing u + d / 2 pi (mod 1), which is again
    U(0, 1): the generated distribution is invariant under azimuthal rotation exactly,
    whatever the weights. Checked here draw by draw against that construction."""
    torch.manual_seed(0)
    gen, _ = build_models(small_model_config())
    assert gen.rotate
    plain, _ = build_models(small_model_config(lateral_rotate=False))
    plain.load_state_dict(gen.state_dict())
    with torch.no_grad():  # an offset that training would have to remove without rotation
        for model in (gen, plain):
            model.local_net[-1].bias[1:] += 0.5
    cond = torch.randn(50, 4)
    counts = torch.randint(0, 6, (50,))
    n = int(counts.sum())
    out = gen.generate_with_counts(cond, counts, n, generator=torch.Generator().manual_seed(7))
    rng = torch.Generator().manual_seed(7)
    unturned = plain.generate_with_counts(cond, counts, n, generator=rng)
    u = torch.rand((50,), generator=rng)  # the next draw on the same stream: the angles
    angle = torch.repeat_interleave(2 * torch.pi * u, counts)
    x, y = unturned[:, 1], unturned[:, 2]
    turned = torch.stack(
        [unturned[:, 0], angle.cos() * x - angle.sin() * y, angle.sin() * x + angle.cos() * y], 1
    )
    torch.testing.assert_close(out, turned, rtol=0, atol=1e-6)
    # and the radial representation has no azimuth to get wrong: r > 0 only
    radial, _ = build_models(small_model_config(representation="radial"))
    assert not radial.rotate


def test_without_a_seed_only_events_with_muons_draw_noise_and_turn_exactly():
    """Unseeded (training, the shared benches) only the events with muons draw their
    event noise and angle; the bundles are still the unrotated ones turned by U(0, 1)."""
    gen, _ = build_models(small_model_config())
    plain, _ = build_models(small_model_config(lateral_rotate=False))
    plain.load_state_dict(gen.state_dict())
    cond = torch.randn(40, 4)
    counts = torch.randint(0, 4, (40,))
    counts[:5] = 0
    n, kept = int(counts.sum()), int(torch.count_nonzero(counts))
    torch.manual_seed(3)
    out = gen.generate_with_counts(cond, counts, n)
    torch.manual_seed(3)
    unturned = plain.generate_with_counts(cond, counts, n)
    u = torch.rand((kept,))  # the next draw: one angle per event with muons
    angle = torch.repeat_interleave(2 * torch.pi * u, counts[counts > 0])
    x, y = unturned[:, 1], unturned[:, 2]
    turned = torch.stack(
        [unturned[:, 0], angle.cos() * x - angle.sin() * y, angle.sin() * x + angle.cos() * y], 1
    )
    torch.testing.assert_close(out, turned, rtol=0, atol=1e-6)


@pytest.mark.parametrize("hidden", [[], [8], [8, 12]])
def test_global_net_widths_follow_the_config(hidden):
    """model.global_hidden: the widths before the context layer ([128] the original's)."""
    gen, _ = build_models(small_model_config(global_hidden=hidden, context=32))
    linear = [m for m in gen.global_net if isinstance(m, torch.nn.Linear)]
    assert [m.out_features for m in linear] == [*hidden, 32]
    assert linear[0].in_features == gen.z_global + 5
    counts = torch.tensor([2, 0, 3])
    assert gen.generate_with_counts(torch.randn(3, 4), counts).shape == (5, 3)


@pytest.mark.parametrize("block", [7, 64])
def test_blocked_local_net_equals_the_whole_batch(monkeypatch, block):
    """Without autograd on the CPU the local net runs over blocks of muons (cache-sized);
    the muons are those of the unblocked pass (with autograd) for the same noise, also
    where a block ends inside an event."""
    import muongen.model.generator as generator_module

    torch.manual_seed(0)
    gen, _ = build_models(small_model_config())
    monkeypatch.setattr(generator_module, "LOCAL_BLOCK_ROWS", block)
    cond = torch.randn(60, 4)
    counts = torch.randint(0, 9, (60,))
    counts[:5] = 0
    with torch.no_grad():
        blocked = gen.generate_with_counts(cond, counts, generator=torch.Generator().manual_seed(4))
    whole = gen.generate_with_counts(cond, counts, generator=torch.Generator().manual_seed(4))
    assert whole.requires_grad and not blocked.requires_grad
    assert int(counts.sum()) > 2 * block  # several blocks, the last one partial
    torch.testing.assert_close(blocked, whole.detach(), rtol=1e-5, atol=1e-6)


def test_polar_head_gives_each_muon_its_own_uniform_azimuth():
    """model.lateral_head=polar: the local net gives [log E, log r] (standardised by the
    generator's polar_norm), and each muon is placed at x = r sin(phi), y = r cos(phi) with
    phi = 2 pi u, u ~ U(0, 1) drawn per muon after the per-muon noise: the distribution is
    invariant under any rotation, for every muon on its own, whatever the weights. Checked
    draw by draw against that construction, and for its radii against the net's output."""
    torch.manual_seed(0)
    gen, critic = build_models(small_model_config(lateral_head="polar"))
    assert gen.polar and not gen.rotate and gen.local_net[-1].out_features == 2
    assert critic.n_features == gen.n_features == 3  # the critic and the data stay xy
    with torch.no_grad():
        gen.polar_norm.mean.copy_(torch.tensor([0.3, -4.0]))
        gen.polar_norm.std.copy_(torch.tensor([0.5, 1.2]))
        gen.polar_norm.fitted.fill_(True)
    cond = torch.randn(30, 4)
    counts = torch.randint(0, 7, (30,))
    counts[:3] = 0
    n = int(counts.sum())
    rng = torch.Generator().manual_seed(5)
    out = gen.generate_with_counts(cond, counts, n, generator=rng)
    # replay the draws: event noise, per-muon noise, then one azimuth per muon
    rng = torch.Generator().manual_seed(5)
    rows = counts > 0
    z = torch.randn((30, gen.z_global), generator=rng)[rows]
    z_local = torch.randn((n, gen.z_local), generator=rng)
    u = torch.rand((n,), generator=rng)
    c, kept = gen.cond_norm(cond[rows]), counts[rows]
    log_n = torch.log10(kept.float() + 1.0).unsqueeze(-1)
    context = gen.global_net(torch.cat([z, c, log_n], -1))
    event_r = gen.polar_norm.inverse(gen._local(context, z_local, kept))
    r, phi = event_r[:, 1], 2 * torch.pi * u
    expected = torch.stack([event_r[:, 0], r * phi.sin(), r * phi.cos()], 1)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-7)
    assert (r > 0).all()
    # azimuths differ within an event: not one turn per bundle
    first = slice(0, int(counts[rows][0]))
    assert torch.unique(torch.atan2(out[first, 1], out[first, 2])).numel() == counts[rows][0]


def test_polar_head_is_fitted_on_the_radii_and_refused_with_the_radial_representation():
    from muongen.config import load_config
    from muongen.data.batch import RaggedBatch
    from muongen.errors import ConfigError
    from muongen.model.normaliser import POLAR_MIN_R, fit_normalisers, normalisers_fitted

    gen, critic = build_models(small_model_config(lateral_head="polar"))
    muons = torch.tensor([[0.1, 0.03, 0.04], [0.5, 0.0, 0.0], [-0.2, -0.6, 0.8]])
    batch = RaggedBatch(torch.randn(2, 4), muons, torch.tensor([1, 2]))
    assert not normalisers_fitted(gen)
    fit_normalisers(gen, critic, batch)
    assert normalisers_fitted(gen)
    log_r = torch.log(torch.tensor([0.05, POLAR_MIN_R, 1.0], dtype=torch.float64))
    torch.testing.assert_close(gen.polar_norm.mean[1].double(), log_r.mean())
    torch.testing.assert_close(gen.polar_norm.mean[0].double(), muons[:, 0].double().mean())
    with pytest.raises(ConfigError, match=r"model\.lateral_head=polar"):
        load_config(None, ["model.representation=radial", "model.lateral_head=polar"])


def test_polar_head_passes_gradients_from_x_and_y_to_log_r():
    """Training moves the radius through x and y: a loss on the placed muons' x^2 + y^2
    reaches the log-r output of the local net (and not the energy output)."""
    torch.manual_seed(1)
    gen, _ = build_models(small_model_config(lateral_head="polar"))
    counts = torch.tensor([3, 0, 5])
    out = gen.generate_with_counts(torch.randn(3, 4), counts, 8)
    (out[:, 1].square() + out[:, 2].square()).sum().backward()
    bias_grad = gen.local_net[-1].bias.grad
    assert bias_grad[0] == 0 and bias_grad[1] > 0  # d r^2 / d log r = 2 r^2 > 0
