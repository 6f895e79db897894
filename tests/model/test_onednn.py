"""layers.linear through oneDNN outside autograd: the value of nn.functional.linear (to
fp32 rounding) for any row count and layout, taken only where it applies; train.cpu_matmul."""

from __future__ import annotations

import os

import pytest
import torch

from muongen.config import OptimConfig, TrainConfig
from muongen.model import build_models, layers
from muongen.model.layers import linear, narrow_linear, split_linear
from muongen.model.pooling import event_index_of
from muongen.train.step import GanStep

from .conftest import random_counts, small_model_config

pytestmark = pytest.mark.skipif(not layers._HAS_ONEDNN, reason="this torch has no oneDNN")


@pytest.fixture
def onednn():
    """Switch oneDNN on or off for one test; the process's setting comes back after it."""
    before = layers.onednn_in_use()
    yield layers.use_onednn
    layers.use_onednn(before)


@pytest.fixture
def calls(monkeypatch):
    """The row counts of the oneDNN products made."""
    seen = []
    real = layers._ONEDNN_LINEAR

    class Counting:
        def __call__(self, x, *args):
            seen.append(x.shape[0])
            return real(x, *args)

        def binary(self, x, *args):
            seen.append(x.shape[0])
            return real.binary(x, *args)

    monkeypatch.setattr(layers, "_ONEDNN_LINEAR", Counting())
    return seen


@pytest.mark.parametrize("rows", [256, 300, 2048, 2049, 13160])
def test_linear_equals_the_plain_linear_on_padded_rows(onednn, calls, rows):
    """Rows are padded up to one of 8 sizes per octave, so that a run meets few shapes."""
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 24, generator=gen)
    w = torch.randn(16, 24, generator=gen)
    b = torch.randn(16, generator=gen)
    add = torch.randn(rows, 16, generator=gen)
    onednn(True)
    with torch.no_grad():
        ours, ours_add = linear(x, w, b), linear(x, w, b, add=add)
    padded = layers._row_bucket(rows)
    assert calls == [padded, padded]
    assert rows <= padded <= rows * 1.125
    assert ours.shape == (rows, 16) and ours.is_contiguous()
    plain = torch.nn.functional.linear(x, w, b)
    torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours_add, plain + add, rtol=1e-5, atol=1e-5)


def test_a_run_meets_few_shapes():
    sizes = {layers._row_bucket(n) for n in range(256, 70000)}
    assert len(sizes) < 80  # 8 per octave from 2^8 to 2^16 and a few above


@pytest.mark.parametrize("layout", ["transposed", "column slice", "zero stride", "row slice"])
def test_linear_takes_any_layout(onednn, layout):
    """A weight's transpose goes in as it is; a column slice or the zero-stride gradient of
    a sum is copied first (oneDNN would take its reference kernel, ~50x slower)."""
    gen = torch.Generator().manual_seed(1)
    big = torch.randn(512, 40, generator=gen)
    x = {
        "transposed": big[:, :32].t().contiguous().t(),
        "column slice": big[:, 4:36],
        "zero stride": torch.ones(()).expand(512, 32),
        "row slice": big[8:264, :32],
    }[layout]
    w = torch.randn(24, 40, generator=gen)[:, 3:35]  # a column slice of a weight
    onednn(True)
    with torch.no_grad():
        ours = linear(x, w)
    torch.testing.assert_close(ours, x @ w.t(), rtol=1e-5, atol=1e-5)
    if layout == "column slice":
        assert layers._dense(x).is_contiguous()
    if layout == "transposed":
        assert layers._dense(x) is x


def test_where_onednn_is_taken(onednn, calls):
    gen = torch.Generator().manual_seed(2)
    layer = layers.Linear(6, 4)
    x = torch.randn(300, 6, generator=gen)
    onednn(True)
    layer(x).sum().backward()  # under autograd: torch's own
    assert calls == []
    with torch.no_grad():
        layer(x)
        assert calls == [320]
        layer(x[:255])  # few rows: torch's own
        empty_inner = linear(torch.zeros(300, 0), torch.zeros(2, 0))  # torch's own
        torch.testing.assert_close(empty_inner, torch.zeros(300, 2))
        assert len(calls) == 1
        calls.clear()
        layer.double()(x.double())  # float64
        with torch.autocast("cpu", dtype=torch.bfloat16):
            layer.float()(x)
        traced = torch.jit.trace(layer, (x,), check_trace=False)  # as the export traces
        assert calls == []
        assert "mkldnn" not in str(traced.graph)
        onednn(False)
        layer(x)
        assert calls == []


def test_split_and_narrow_layers_equal_the_plain_ones(onednn, calls):
    gen = torch.Generator().manual_seed(3)
    counts = random_counts(400, gen, max_count=7)
    n = int(counts.sum())
    index = event_index_of(counts, n)
    layer = torch.nn.Linear(12 + 5, 9)
    narrow = torch.nn.Linear(3, 9)
    per_event = torch.randn(400, 12, generator=gen)
    per_muon = torch.randn(n, 5, generator=gen)
    small = torch.randn(n, 3, generator=gen)
    onednn(True)
    with torch.no_grad():
        split = split_linear(layer, per_event, per_muon, counts, index)
        ours_narrow = narrow_linear(narrow, small)
        assert len(calls) == 3  # the per-event part, the per-muon part, the narrow layer
        plain = layer(torch.cat([per_event[index], per_muon], -1))
        torch.testing.assert_close(split, plain, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours_narrow, narrow(small), rtol=1e-5, atol=1e-5)


def test_generated_muons_and_critic_scores_are_the_same_through_onednn(onednn, calls):
    """The generator's muons (the critic's fakes, a sample) and the critic's scores outside
    autograd through oneDNN equal torch's own to fp32 rounding."""
    torch.manual_seed(4)
    gen, crit = build_models(small_model_config(critic_log_radius=True))
    g = torch.Generator().manual_seed(4)
    counts = random_counts(600, g, max_count=8)
    cond = torch.rand(600, 4, generator=g)

    def outputs():
        with torch.no_grad():
            seed = torch.Generator().manual_seed(5)
            muons = gen.generate_with_counts(cond, counts, generator=seed)
            return muons, crit(muons, cond, counts)

    onednn(True)
    ours = outputs()
    assert calls
    onednn(False)
    for a, e in zip(ours, outputs()):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)


def test_train_cpu_matmul_sets_it(onednn):
    gen, crit = build_models(small_model_config())
    step = GanStep(gen, crit, OptimConfig(), TrainConfig(cpu_matmul="blas"), "cpu")
    assert step.onednn is False and not layers.onednn_in_use()
    step = GanStep(gen, crit, OptimConfig(), TrainConfig(cpu_matmul="onednn"), "cpu")
    assert step.onednn is True and layers.onednn_in_use()
    step = GanStep(gen, crit, OptimConfig(), TrainConfig(), "cpu")  # the default: auto
    assert step.onednn is layers.onednn_pays() and layers.onednn_in_use() is step.onednn


def test_auto_takes_onednn_on_amd_processors_only(onednn, monkeypatch):
    # MKL runs its AVX2 kernels on AMD's processors (oneDNN was 2x faster there) and its
    # AVX-512 ones on Intel's (torch's BLAS was the faster); unmeasured ones keep BLAS
    assert layers.onednn_pays("AuthenticAMD") and not layers.onednn_pays("GenuineIntel")
    assert not layers.onednn_pays("")
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            assert f"vendor_id\t: {layers.cpu_vendor()}" in f.read()
    for vendor, expected in (("AuthenticAMD", True), ("GenuineIntel", False)):
        monkeypatch.setattr(layers, "cpu_vendor", lambda v=vendor: v)
        assert onednn("auto") is expected
        assert onednn("onednn") is True and onednn("blas") is False
