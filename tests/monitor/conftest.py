"""Fixtures of the monitor tests."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest


class FakeClock:
    """A clock the test moves by hand, so time-weighted averages have exact answers."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeNvml:
    """The slice of pynvml that GpuMonitor uses; the test sets the next reading."""

    def __init__(self) -> None:
        self.util = 0.0
        self.used_bytes = 0
        self.inits = 0
        self.shutdowns = 0
        self.indices: list[int] = []

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        self.indices.append(index)
        return f"handle{index}"

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        raise RuntimeError("no UUIDs in the fake")

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(gpu=self.util, memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(used=self.used_bytes, total=80 * 1024**3, free=0)


@pytest.fixture
def fake_clock() -> FakeClock:
    # GpuMonitor and StepTimer take the clock as an argument; this one does not tick.
    return FakeClock()


@pytest.fixture
def fake_nvml() -> FakeNvml:
    # No GPU on CI: a stand-in NVML whose readings the test chooses.
    return FakeNvml()


def write_run(log_dir: Path, steps: int = 3, tag: str = "loss/c_loss") -> Path:
    """A real TensorBoard run with ``steps`` points of ``tag`` (value = step * 0.5)."""
    from muongen.monitor.tensorboard import TensorBoardLogger

    with TensorBoardLogger(log_dir) as tb:
        for step in range(steps):
            tb.scalars(step, {tag: step * 0.5})
    return log_dir


@pytest.fixture
def tb_run():
    # tb-merge tests need real event files in several folders; this writes one run.
    return write_run
