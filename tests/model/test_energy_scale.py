"""model.energy_scale_head: each bundle's muon energies mapped a + exp(b) e by a head."""

from __future__ import annotations

import pytest
import torch

from muongen.config import load_config
from muongen.data.batch import RaggedBatch
from muongen.model import build_models
from muongen.model.generator import ENERGY_LOG_WIDTH_MAX, energy_scale
from muongen.model.normaliser import fit_normalisers

from .conftest import seeded_draw, small_model_config


def _pair(ragged, lateral_head: str = "xy"):
    """A generator with the head and one without, the same weights otherwise, both fitted
    on one batch; and that batch."""
    torch.manual_seed(0)
    cfg = small_model_config(energy_scale_head=True, lateral_head=lateral_head)
    gen, critic = build_models(cfg)
    plain, _ = build_models(small_model_config(lateral_head=lateral_head))
    cond, muons, counts = ragged(b=30, seed=1)
    fit_normalisers(gen, critic, RaggedBatch(cond, muons, counts))
    missing = plain.load_state_dict(gen.state_dict(), strict=False)
    assert set(missing.unexpected_keys) == {"energy_scale.weight", "energy_scale.bias"}
    assert not missing.missing_keys
    return gen, plain, cond, counts


@pytest.mark.parametrize("lateral_head", ["xy", "polar"])
def test_the_head_starts_as_the_identity(ragged, lateral_head):
    gen, plain, cond, counts = _pair(ragged, lateral_head)
    assert torch.count_nonzero(gen.energy_scale.weight) == 0
    torch.testing.assert_close(seeded_draw(gen, cond, counts), seeded_draw(plain, cond, counts))


def test_the_head_leaves_the_seeded_weights_of_everything_else_as_they_were():
    """The head takes no random draws, so a seeded run with it starts from the weights of
    the same run without it (a paired comparison changes only the head)."""
    torch.manual_seed(3)
    gen, critic = build_models(small_model_config(energy_scale_head=True))
    after = torch.rand(3)
    torch.manual_seed(3)
    plain_gen, plain_critic = build_models(small_model_config())
    torch.testing.assert_close(torch.rand(3), after)
    for name, w in plain_gen.state_dict().items():
        torch.testing.assert_close(gen.state_dict()[name], w, msg=name)
    for name, w in plain_critic.state_dict().items():
        torch.testing.assert_close(critic.state_dict()[name], w, msg=name)


def test_each_events_energies_are_shifted_and_widened_by_its_own_scale(ragged):
    """With weights on the context, every event gets its own a and b: the head's muon
    energies are mean + std (a + exp(b) e), e the plain generator's standardised ones; the
    other features do not move."""
    gen, plain, cond, counts = _pair(ragged)
    with torch.no_grad():
        torch.nn.init.normal_(gen.energy_scale.weight, std=0.2)
        gen.energy_scale.bias.copy_(torch.tensor([0.3, 0.5]))
    got, want = seeded_draw(gen, cond, counts), seeded_draw(plain, cond, counts)
    torch.testing.assert_close(got[:, 1:], want[:, 1:])
    mean, std = gen.muon_norm.mean[0], gen.muon_norm.std[0]
    # the per-event [a, w] from the same context the generator computes (same seed)
    g = torch.Generator().manual_seed(5)
    z = torch.randn((cond.shape[0], gen.z_global), generator=g)
    keep = counts > 0
    log_n = torch.log10(counts[keep].float() + 1).unsqueeze(-1)
    context = gen.global_net(torch.cat([z[keep], gen.cond_norm(cond[keep]), log_n], -1))
    scale = energy_scale(gen.energy_scale(context)).detach()
    per_muon = torch.repeat_interleave(scale, counts[keep], 0)
    e = (want[:, 0] - mean) / std
    torch.testing.assert_close(got[:, 0], mean + std * (per_muon[:, 0] + per_muon[:, 1] * e))
    assert per_muon[:, 1].std() > 0.01  # the widths differ between events


def test_the_width_is_bounded(ragged):
    gen, _, cond, counts = _pair(ragged)
    with torch.no_grad():
        gen.energy_scale.bias.copy_(torch.tensor([0.0, 50.0]))
    got = seeded_draw(gen, cond, counts)
    assert torch.isfinite(got).all()
    assert energy_scale(torch.tensor([[0.0, 50.0]]))[0, 1] == pytest.approx(
        torch.exp(torch.tensor(ENERGY_LOG_WIDTH_MAX)).item()
    )


def test_the_head_learns_from_the_generators_loss(ragged):
    gen, _, cond, counts = _pair(ragged)
    out = gen.generate_with_counts(cond, counts)
    out[:, 0].square().mean().backward()
    assert gen.energy_scale.bias.grad is not None
    assert torch.count_nonzero(gen.energy_scale.weight.grad) > 0


def test_the_key_reads_from_the_command_line():
    assert load_config(None, ["model.energy_scale_head=true"]).model.energy_scale_head
    assert not load_config(None, []).model.energy_scale_head
