from __future__ import annotations

import time

import pytest
import torch

from muongen.monitor.gpu import GIB, GpuMonitor

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="asserts CPU-only keys")


def test_time_weighted_average_and_max(fake_nvml, fake_clock):
    mon = GpuMonitor("cuda:0", nvml=fake_nvml, clock=fake_clock)  # window opens at t=0
    assert mon.nvml_active
    for t, util, gib in [(1.0, 10.0, 1), (2.0, 50.0, 3)]:
        fake_clock.t, fake_nvml.util, fake_nvml.used_bytes = t, util, gib * GIB
        mon.sample()
    fake_clock.t, fake_nvml.util, fake_nvml.used_bytes = 4.0, 90.0, 2 * GIB
    snap = mon.snapshot()  # reads once more at t=4: weights 1, 1, 2
    assert snap["gpu/util_pct"] == pytest.approx((10 + 50 + 2 * 90) / 4)
    assert snap["gpu/util_max_pct"] == 90.0
    assert snap["gpu/mem_used_gib"] == pytest.approx((1 + 3 + 2 * 2) / 4)
    assert snap["gpu/mem_used_max_gib"] == pytest.approx(3.0)

    fake_clock.t, fake_nvml.util = 6.0, 20.0  # the next window forgets the last one
    snap = mon.snapshot()
    assert snap["gpu/util_pct"] == pytest.approx(20.0)
    assert snap["gpu/util_max_pct"] == 20.0
    mon.stop()
    assert fake_nvml.shutdowns == 1


def test_sampler_thread_runs_and_stops(fake_nvml):
    fake_nvml.util = 42.0
    with GpuMonitor("cuda", interval_s=0.01, nvml=fake_nvml) as mon:
        deadline = time.monotonic() + 2.0
        while mon._n < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert mon._n >= 3  # the thread sampled on its own
        assert mon.snapshot()["gpu/util_pct"] == pytest.approx(42.0)
    assert mon._thread is None
    assert fake_nvml.shutdowns == 1


def test_cuda_visible_devices_maps_the_nvml_index(fake_nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    GpuMonitor("cuda:1", nvml=fake_nvml).stop()
    assert fake_nvml.indices == [5]


def test_cpu_device_is_a_silent_no_op(fake_nvml):
    mon = GpuMonitor("cpu", nvml=fake_nvml).start()
    assert mon.snapshot() == {}
    assert mon._thread is None
    assert fake_nvml.inits == 0
    mon.stop()


@needs_no_cuda
def test_without_nvml_or_cuda_snapshot_is_empty():
    class BrokenNvml:
        def nvmlInit(self):
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    mon = GpuMonitor("cuda", nvml=BrokenNvml()).start()
    assert not mon.nvml_active
    assert mon._thread is None
    assert mon.snapshot() == {}
    mon.stop()


def test_nvml_failure_mid_run_turns_sampling_off(fake_nvml, fake_clock):
    mon = GpuMonitor("cuda", nvml=fake_nvml, clock=fake_clock)

    def fail(handle):
        raise RuntimeError("GPU is lost")

    fake_nvml.nvmlDeviceGetUtilizationRates = fail
    mon.sample()  # does not raise
    assert not mon.nvml_active
    assert "gpu/util_pct" not in mon.snapshot()
    mon.stop()
