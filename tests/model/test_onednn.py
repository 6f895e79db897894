"""layers.linear through oneDNN: the value and the derivatives of nn.functional.linear
(to fp32 rounding, to second order), taken only where it applies, and train.cpu_matmul."""

from __future__ import annotations

import pytest
import torch

from muongen.config import OptimConfig, TrainConfig
from muongen.model import build_models, layers
from muongen.model.layers import linear, narrow_linear, split_linear
from muongen.model.penalty import gradient_penalty
from muongen.model.pooling import event_index_of
from muongen.train.step import GanStep, cpu_matmul_mode

from .conftest import random_counts, small_model_config

pytestmark = pytest.mark.skipif(not layers._HAS_ONEDNN, reason="this torch has no oneDNN")


@pytest.fixture
def mode():
    """Set the oneDNN mode for one test; the process's mode comes back after it."""
    before = layers.onednn_mode()
    yield layers.use_onednn
    layers.use_onednn(before)


@pytest.fixture
def calls(monkeypatch):
    """Counts the oneDNN products made."""
    seen = []
    real = layers._ONEDNN_LINEAR

    class Counting:
        def __call__(self, *args):
            seen.append("plain")
            return real(*args)

        def binary(self, *args):
            seen.append("binary")
            return real.binary(*args)

    monkeypatch.setattr(layers, "_ONEDNN_LINEAR", Counting())
    return seen


def _grads_to_second_order(fn, x, params):
    """The first derivative with respect to ``x`` and the derivatives of its square norm
    with respect to ``x`` and ``params``, as the critic's penalty takes them."""
    (gx,) = torch.autograd.grad(fn(x).tanh().sum(), x, create_graph=True)
    return [gx, *torch.autograd.grad(gx.pow(2).sum(), [x, *params])]


def test_linear_equals_the_plain_linear_to_second_order(mode, calls):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(300, 24, generator=gen, requires_grad=True)
    w = torch.randn(16, 24, generator=gen, requires_grad=True)
    b = torch.randn(16, generator=gen, requires_grad=True)
    add = torch.randn(300, 16, generator=gen)
    mode("all")
    ours = _grads_to_second_order(lambda v: linear(v, w, b), x, [w, b])
    with_add = linear(x, w, b, add=add)
    assert calls.count("plain") > 3 and calls.count("binary") == 1  # the products took oneDNN
    plain = _grads_to_second_order(lambda v: torch.nn.functional.linear(v, w, b), x, [w, b])
    for a, e in zip(ours, plain):
        torch.testing.assert_close(a, e, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(with_add, torch.nn.functional.linear(x, w, b) + add)
    assert with_add.grad_fn.name().startswith("_OneDnnLinear")


@pytest.mark.parametrize("layout", ["transposed", "column slice", "zero stride", "row slice"])
def test_linear_takes_any_layout(mode, layout):
    """A weight's transpose goes in as it is; a column slice or the zero-stride gradient of
    a sum is copied first (oneDNN would take its reference kernel, ~50x slower)."""
    gen = torch.Generator().manual_seed(1)
    big = torch.randn(64, 40, generator=gen)
    x = {
        "transposed": big[:, :32].t().contiguous().t(),
        "column slice": big[:, 4:36],
        "zero stride": torch.ones(()).expand(64, 32),
        "row slice": big[8:40, :32],
    }[layout]
    w = torch.randn(24, 32, generator=gen)
    mode("all")
    with torch.no_grad():
        ours = linear(x, w)
    torch.testing.assert_close(ours, x @ w.t(), rtol=1e-5, atol=1e-5)
    if layout == "column slice":
        assert layers._dense(x).is_contiguous()
    if layout == "transposed":
        assert layers._dense(x) is x


def test_empty_products(mode):
    mode("all")
    w = torch.randn(8, 5, requires_grad=True)
    x = torch.zeros(0, 5, requires_grad=True)
    y = linear(x, w)
    assert y.shape == (0, 8)
    (gw,) = torch.autograd.grad(y.sum(), w)
    assert torch.equal(gw, torch.zeros(8, 5))
    # an empty inner dimension: torch's own product
    assert torch.equal(linear(torch.zeros(3, 0), torch.zeros(2, 0)), torch.zeros(3, 2))


def test_where_onednn_is_taken(mode, calls):
    gen = torch.Generator().manual_seed(2)
    layer = layers.Linear(6, 4)
    x = torch.randn(10, 6, generator=gen)
    mode("forward")
    layer(x)  # under autograd: torch's own
    assert calls == []
    with torch.no_grad():
        layer(x)
    assert calls == ["plain"]
    mode("all")
    calls.clear()
    layer(x).sum().backward()
    assert len(calls) == 2  # the forward, then the weight's gradient (x needs none)
    calls.clear()
    layer.double()(x.double())  # float64
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer.float()(x)
    traced = torch.jit.trace(layer, (x,), check_trace=False)  # as the export traces
    assert calls == []
    assert "mkldnn" not in str(traced.graph)
    mode("none")
    with torch.no_grad():
        layer(x)
    assert calls == []


def test_split_and_narrow_layers_equal_the_plain_ones_to_second_order(mode, calls):
    gen = torch.Generator().manual_seed(3)
    counts = random_counts(40, gen, max_count=7)
    n = int(counts.sum())
    index = event_index_of(counts, n)
    layer = torch.nn.Linear(12 + 5, 9)
    narrow = torch.nn.Linear(3, 9)
    per_event = torch.randn(40, 12, generator=gen)
    per_muon = torch.randn(n, 5, generator=gen, requires_grad=True)
    small = torch.randn(n, 3, generator=gen, requires_grad=True)

    def split(m):
        return split_linear(layer, per_event, m, counts, index)

    def plain(m):
        return layer(torch.cat([per_event[index], m], -1))

    params = [layer.weight, layer.bias]
    mode("all")
    ours = _grads_to_second_order(split, per_muon, params)
    ours_narrow = _grads_to_second_order(lambda v: narrow_linear(narrow, v), small, [narrow.weight])
    assert "binary" in calls
    mode("none")
    for a, e in zip(ours, _grads_to_second_order(plain, per_muon, params)):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)
    plain_narrow = _grads_to_second_order(narrow, small, [narrow.weight])
    for a, e in zip(ours_narrow, plain_narrow):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("critic", ["epic", "pointnet"])
def test_the_critic_and_its_penalty_are_the_same_through_onednn(mode, calls, critic):
    """The critic's scores and the penalty's parameter gradients (a double backward through
    every layer) through oneDNN equal torch's own to fp32 rounding."""
    cfg = small_model_config(critic=critic, critic_log_radius=True)
    torch.manual_seed(4)
    _, crit = build_models(cfg)
    g = torch.Generator().manual_seed(4)
    counts = random_counts(64, g, max_count=8)
    n = int(counts.sum())
    real = crit.inputs(torch.randn(n, 3, generator=g) * 0.3 + torch.tensor([-1.0, 0.0, 0.0]))
    fake = real + 0.2 * torch.randn(n, 3 + 1, generator=g)
    cond = torch.rand(64, 4, generator=g)

    def grads():
        torch.manual_seed(5)  # the penalty's interpolation weights
        penalty = gradient_penalty(crit.score, cond, real, counts, fake, counts)
        score = crit.score(real, cond, counts).sum()
        params = [p for p in crit.parameters() if p.requires_grad]
        return [score, *torch.autograd.grad(penalty, params, allow_unused=True)]

    mode("all")
    ours = grads()
    assert calls
    mode("none")
    for a, e in zip(ours, grads()):
        if e is not None:
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)


def test_train_cpu_matmul_sets_the_mode(mode):
    assert cpu_matmul_mode("blas", 1, 1) == "none"
    assert cpu_matmul_mode("onednn", 2, 1) == "all"
    assert cpu_matmul_mode("auto", 1, 1) == "all"  # one shard on one thread: no GIL shared
    assert cpu_matmul_mode("auto", 2, 1) == "forward"  # shards: outside autograd only
    assert cpu_matmul_mode("auto", 1, 2) == "forward"
    gen, crit = build_models(small_model_config())

    step = GanStep(gen, crit, OptimConfig(), TrainConfig(cpu_matmul="blas"), "cpu")
    assert step.onednn == "none" == layers.onednn_mode()
    step = GanStep(gen, crit, OptimConfig(), TrainConfig(cpu_matmul="onednn"), "cpu")
    assert step.onednn == "all" == layers.onednn_mode()
