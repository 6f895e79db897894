"""model.energy_fold: generated muon energies folded into [the data's threshold, E0 / A]."""

from __future__ import annotations

import pytest
import torch

from muongen.config import load_config
from muongen.data.batch import RaggedBatch
from muongen.model import build_models
from muongen.model.generator import ENERGY_FLOOR_UNFITTED, fold_energy
from muongen.model.normaliser import fit_normalisers, per_nucleon_energy

from .conftest import seeded_draw, small_model_config


def test_fold_reflects_each_side_and_leaves_the_inside_alone():
    log_e = torch.tensor([-2.5, -1.5, -0.9, 0.0, 0.5, 2.5, 6.5], requires_grad=True)
    ceiling = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0])
    folded = fold_energy(log_e, -1.0, ceiling)
    # the last overshoots the ceiling by more than the window: reflected at both edges
    torch.testing.assert_close(folded, torch.tensor([0.5, -0.5, -0.9, 0.0, 0.5, 1.5, 0.5]))
    folded.sum().backward()  # slope +-1: the gradient keeps its size past an edge
    torch.testing.assert_close(log_e.grad, torch.tensor([-1.0, -1, 1, 1, 1, -1, 1]))
    # no ceiling: only the floor
    torch.testing.assert_close(
        fold_energy(torch.tensor([-2.0, 3.0]), 0.0), torch.tensor([2.0, 3.0])
    )


def _pair(ragged, **changes):
    """A generator with the fold and one without, the same weights, both fitted on one
    batch whose muon energies lie in [-0.5, 0] and whose E0 / A is 0 on this scale."""
    cfg = small_model_config(energy_fold=True, **changes)
    torch.manual_seed(0)
    gen, critic = build_models(cfg)
    torch.manual_seed(0)
    plain, plain_critic = build_models(small_model_config(**changes))
    cond, muons, counts = ragged(b=40, seed=1, max_count=20, empty=0.1)
    muons[:, 0] = muons[:, 0].clamp(-0.5, 0.0)
    cond[:, 0] = cond[:, 2]
    batch = RaggedBatch(cond, muons, counts)
    fit_normalisers(gen, critic, batch)
    fit_normalisers(plain, plain_critic, batch)
    return gen, plain, cond, counts


@pytest.mark.parametrize("energy_reference", ["none", "per_nucleon"])
def test_the_generator_draws_no_muon_past_either_edge(ragged, energy_reference):
    gen, plain, cond, counts = _pair(ragged, energy_reference=energy_reference)
    assert gen.energy_floor.item() == pytest.approx(-0.5)
    # spread the standardised energy output to N(0, 2^2) over the muons (it is affine in
    # the last layer's row), so that many muons cross an edge
    norm = plain.energy_norm if plain.energy_norm is not None else plain.muon_norm
    out = (seeded_draw(plain, cond, counts)[:, 0] - norm.mean[0]) / norm.std[0]
    k = 2.0 / out.std()
    with torch.no_grad():
        for g in (gen, plain):
            g.local_net[-1].weight[0].mul_(k)
            g.local_net[-1].bias[0].sub_(out.mean()).mul_(k)
    got, want = seeded_draw(gen, cond, counts), seeded_draw(plain, cond, counts)
    ceiling = torch.repeat_interleave(per_nucleon_energy(cond), counts)
    low, high = want[:, 0] < -0.5, want[:, 0] > ceiling
    # both edges are crossed without the fold, and many muons are inside
    assert low.sum() > 5 and high.sum() > 5 and (~low & ~high).float().mean() > 0.25
    assert (got[:, 0] >= -0.5 - 1e-5).all()
    assert (got[:, 0] <= ceiling + 1e-5).all()
    # the same draws otherwise: the inside is untouched, the rest folded, the rest as it was
    inside = ~low & ~high
    torch.testing.assert_close(got[inside], want[inside])
    torch.testing.assert_close(got[:, 1:], want[:, 1:])
    torch.testing.assert_close(got[:, 0], fold_energy(want[:, 0], -0.5, ceiling))


def test_the_floor_travels_in_the_state_and_only_with_the_fold(ragged):
    gen, plain, _, _ = _pair(ragged)
    assert "energy_floor" in gen.state_dict()
    assert "energy_floor" not in plain.state_dict()
    fresh, _ = build_models(small_model_config(energy_fold=True))
    assert fresh.energy_floor.item() == ENERGY_FLOOR_UNFITTED  # unfitted: no fold at all
    fresh.load_state_dict(gen.state_dict())
    assert fresh.energy_floor.item() == pytest.approx(-0.5)


def test_the_fold_takes_no_random_draws():
    torch.manual_seed(3)
    build_models(small_model_config(energy_fold=True))
    after = torch.rand(3)
    torch.manual_seed(3)
    build_models(small_model_config())
    torch.testing.assert_close(torch.rand(3), after)


def test_the_key_reads_from_the_command_line():
    assert load_config(None, ["model.energy_fold=true"]).model.energy_fold
    assert not load_config(None, []).model.energy_fold
