"""model.critic_attention_heads: the EPiC critic's events read their muons by attention."""

from __future__ import annotations

import pytest
import torch

from muongen.config import load_config
from muongen.errors import ConfigError
from muongen.model import build_models
from muongen.model.attention_pool import AttentionPool
from muongen.model.pooling import event_index_of

from .conftest import small_model_config
from .test_critic import _shuffle_within_events, assert_scored_alone_as_together


def _randomise(module: torch.nn.Module, seed: int = 7) -> None:
    """Give the attention pools random weights (they start at zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "attention" in name or isinstance(module, AttentionPool):
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))


def _critic(heads: int = 2, **changes):
    torch.manual_seed(0)
    cfg = small_model_config(critic="epic", critic_attention_heads=heads, **changes)
    _, critic = build_models(cfg)
    return critic


def test_the_pool_starts_as_nothing_and_takes_no_random_draws(ragged):
    """Zero at the start: the critic scores as the one without it; and made without random
    draws, so every other weight is the seeded run's own."""
    torch.manual_seed(3)
    _, critic = build_models(small_model_config(critic_attention_heads=4))
    after = torch.rand(3)
    torch.manual_seed(3)
    _, plain = build_models(small_model_config())
    torch.testing.assert_close(torch.rand(3), after)
    missing = plain.load_state_dict(critic.state_dict(), strict=False)
    assert missing.unexpected_keys and all("attention" in k for k in missing.unexpected_keys)
    assert not missing.missing_keys
    for name, w in plain.state_dict().items():
        torch.testing.assert_close(critic.state_dict()[name], w, msg=name)
    cond, muons, counts = ragged(b=20, seed=2)
    torch.testing.assert_close(critic(muons, cond, counts), plain(muons, cond, counts))


def test_the_weights_are_a_softmax_within_each_event_by_hand(ragged):
    torch.manual_seed(0)
    pool = AttentionPool(local=6, wide=5, heads=3)
    _randomise(pool)
    _, _, counts = ragged(b=9, seed=2)
    n = int(counts.sum())
    gen = torch.Generator().manual_seed(2)
    phi, g = torch.randn(n, 6, generator=gen), torch.randn(9, 5, generator=gen)
    index = event_index_of(counts, n)
    w = pool.weights(phi, g, counts, index)
    pooled = pool.pool(phi, g, counts, index)
    start = 0
    for e, c in enumerate(counts.tolist()):
        rows = phi[start : start + c]
        logits = rows @ pool.key.weight.T + (pool.query.weight @ g[e] + pool.query.bias)
        expect = torch.softmax(logits, dim=0)  # (c, heads)
        torch.testing.assert_close(w[start : start + c], expect)
        by_hand = (rows.view(c, 3, 2) * expect.unsqueeze(-1)).sum(0).view(6)
        torch.testing.assert_close(pooled[e], by_hand if c else torch.zeros(6))
        start += c
    assert (counts == 0).any()


def test_large_logits_do_not_overflow():
    """Each event's largest logit is taken out before the exp."""
    pool = AttentionPool(local=4, wide=4, heads=2)
    with torch.no_grad():
        pool.key.weight.fill_(300.0)
    counts = torch.tensor([3, 2])
    phi = torch.tensor([[1.0] * 4, [2.0] * 4, [3.0] * 4, [-1.0] * 4, [-2.0] * 4])
    w = pool.weights(phi, torch.zeros(2, 4), counts, event_index_of(counts, 5))
    assert torch.isfinite(w).all()
    torch.testing.assert_close(w[:, 0], torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0]))


def test_twice_differentiable_as_the_gradient_penalty_needs():
    pool = AttentionPool(local=4, wide=3, heads=2).double()
    _randomise(pool)
    counts = torch.tensor([2, 0, 3])
    index = event_index_of(counts, 5)
    gen = torch.Generator().manual_seed(4)
    phi = torch.randn(5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    g = torch.randn(3, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    fn = lambda p, q: pool(p, q, counts, index)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (phi, g))
    assert torch.autograd.gradgradcheck(fn, (phi, g))


def test_the_critic_with_attention_stays_a_set_function(ragged):
    critic = _critic(heads=2)
    _randomise(critic)
    cond, muons, counts = ragged(b=30, max_count=8, seed=3)
    shuffled, order = _shuffle_within_events(muons, counts, seed=4)
    assert not torch.equal(order, torch.arange(len(order)))
    torch.testing.assert_close(critic(shuffled, cond, counts), critic(muons, cond, counts))
    assert_scored_alone_as_together(critic, cond, muons, counts, 5)


def test_the_pool_changes_the_score_and_learns(ragged):
    """Once trained away from zero it moves the score, and the score's gradient reaches
    its weights (the out map first: the others are multiplied by it at the start)."""
    critic = _critic(heads=2)
    plain = _critic(heads=0)
    cond, muons, counts = ragged(b=20, seed=6)
    critic(muons, cond, counts).sum().backward()
    layer = critic.layers[0].attention
    assert layer.out.weight.grad.abs().sum() > 0
    _randomise(critic)
    assert not torch.allclose(critic(muons, cond, counts), plain(muons, cond, counts))


@pytest.mark.parametrize("heads", [-1, 3])
def test_the_config_rejects_heads_that_do_not_divide_the_width(heads):
    with pytest.raises(ConfigError, match="critic_attention_heads"):
        load_config(None, [f"model.critic_attention_heads={heads}", "model.critic_local_width=32"])
    cfg = load_config("quality", ["model.critic_attention_heads=4"])
    assert cfg.model.critic_attention_heads == 4
