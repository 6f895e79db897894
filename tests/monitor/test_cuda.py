"""The monitor on a real GPU: NVML readings, CUDA-event timing without syncs, CUDA profiling."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
import torch

from muongen.monitor.gpu import GpuMonitor
from muongen.monitor.profiler import profile
from muongen.monitor.timing import PHASES, StepTimer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _work(n: int = 2048) -> torch.Tensor:
    a = torch.randn(n, n, device="cuda")
    for _ in range(10):
        a = a @ a / n
    return a


def test_gpu_monitor_reads_nvml_and_allocator():
    with GpuMonitor("cuda", interval_s=0.05) as mon:
        assert mon.nvml_active
        keep = _work()
        time.sleep(0.3)
        snap = mon.snapshot()
    assert 0.0 <= snap["gpu/util_pct"] <= 100.0
    assert snap["gpu/mem_used_gib"] > 0
    assert snap["cuda/allocated_gib"] > 0
    assert snap["cuda/max_reserved_gib"] >= snap["cuda/reserved_gib"] > 0
    del keep


def test_step_timer_uses_events_without_syncs():
    timer = StepTimer("cuda")
    assert timer.uses_events
    torch.cuda.set_sync_debug_mode("error")  # any host-device sync in a phase raises
    try:
        for _ in range(3):
            with timer.phase("h2d"):
                x = torch.ones(1 << 20, pin_memory=True).to("cuda", non_blocking=True)
            with timer.phase("critic"):
                y = _work(1024)
            with timer.phase("optimizer"):
                y.add_(x[:1])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    snap = timer.snapshot()
    assert snap["time/critic_s"] > 0
    assert snap["time/critic_frac"] > snap["time/optimizer_frac"]
    assert sum(snap[f"time/{p}_frac"] for p in (*PHASES, "other")) == pytest.approx(1.0)


def test_profile_records_cuda_kernels(tmp_path):
    out = io.StringIO()
    trace = profile(lambda: _work(512), 2, tmp_path, "cuda", stream=out)
    assert "self_device_time_total" in out.getvalue()
    assert "cuda" in Path(trace).read_text().lower()
