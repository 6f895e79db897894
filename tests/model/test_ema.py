"""The generator's weight average: its update rule, buffers, state round trip, choice."""

from __future__ import annotations

import pytest
import torch

from muongen.model import build_models
from muongen.model.ema import GeneratorEMA, inference_weights

from .conftest import small_model_config


def test_update_follows_the_warmed_up_decay_and_copies_buffers():
    torch.manual_seed(0)
    gen, _ = build_models(small_model_config())
    ema = GeneratorEMA(gen, decay=0.9)
    start = [p.detach().clone() for p in gen.parameters()]
    expected = [p.clone() for p in start]
    for t in range(30):
        with torch.no_grad():
            for p in gen.parameters():
                p.add_(0.1)
        rate = 1.0 - min(0.9, (1.0 + t) / (10.0 + t))
        expected = [e + rate * (p.detach() - e) for e, p in zip(expected, gen.parameters())]
        ema.update()
    for e, p in zip(expected, ema.module.parameters()):
        torch.testing.assert_close(p, e)
    # the average lags the trained weights: it is not a copy of them
    assert not torch.allclose(next(ema.module.parameters()), next(gen.parameters()))
    assert not any(p.requires_grad for p in ema.module.parameters())
    with torch.no_grad():  # fitted standardisers are copied, not averaged
        gen.cond_norm.mean.fill_(3.0)
    ema.update()
    assert torch.equal(ema.module.cond_norm.mean, gen.cond_norm.mean)
    assert ema.updates == 31


def test_state_round_trip_and_reset():
    torch.manual_seed(0)
    gen, _ = build_models(small_model_config())
    ema = GeneratorEMA(gen, decay=0.99)
    for _ in range(3):
        with torch.no_grad():
            for p in gen.parameters():
                p.mul_(1.1)
        ema.update()
    state = ema.state_dict()
    other = GeneratorEMA(build_models(small_model_config())[0], decay=0.99)
    other.load_state_dict(state)
    assert other.updates == 3
    for a, b in zip(other.module.state_dict().values(), ema.module.state_dict().values()):
        assert torch.equal(a, b)
    ema.reset()
    assert ema.updates == 0
    for a, b in zip(ema.module.parameters(), gen.parameters()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="decay"):
        GeneratorEMA(gen, decay=1.0)


def test_sampling_prefers_the_average():
    gen_state = {"w": torch.zeros(1)}
    ema_state = {"version": 1, "decay": 0.9, "updates": 5, "weights": {"w": torch.ones(1)}}
    weights, what = inference_weights({"generator": gen_state, "generator_ema": ema_state})
    assert what == "generator_ema" and weights is ema_state["weights"]
    assert inference_weights({"generator": gen_state}) == (gen_state, "generator")
