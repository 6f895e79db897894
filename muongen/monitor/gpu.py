"""GPU utilisation and memory for TensorBoard: an NVML sampler thread plus CUDA allocator stats.

NVML's utilisation is a percentage over its own short sample period, so one reading at log
time says little. A daemon thread reads it every ``interval_s`` and ``snapshot()`` returns
the time-weighted mean (and max) since the previous snapshot, with the CUDA caching
allocator's allocated / reserved / max reserved memory of the training device.

Silent and harmless where there is nothing to measure: on a CPU/MPS device, or when NVML
(``nvidia-ml-py``) is missing or fails, the NVML part is off and nothing raises (the reason
is logged once at debug level).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

log = logging.getLogger(__name__)

GIB = 1024**3


class GpuMonitor:
    """Samples one GPU in a daemon thread; ``snapshot()`` averages since the last snapshot.

    Args:
        device: the training device; anything but CUDA makes the monitor a no-op.
        interval_s: seconds between NVML readings.
        nvml: the NVML module (``pynvml``); injectable so tests can drive the averaging.
        clock: monotonic clock in seconds (injectable for the same reason).

    ``snapshot()`` keys: ``gpu/util_pct``, ``gpu/util_max_pct``, ``gpu/mem_used_gib``,
    ``gpu/mem_used_max_gib`` (NVML, when available) and ``cuda/allocated_gib``,
    ``cuda/reserved_gib``, ``cuda/max_reserved_gib`` (when CUDA is available); ``{}`` on CPU.
    """

    def __init__(
        self,
        device: torch.device | str,
        interval_s: float = 1.0,
        *,
        nvml: ModuleType | Any | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.device = torch.device(device)
        self.interval_s = interval_s
        self._clock = clock
        self._nvml = nvml
        self._handle: Any = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False
        self._cuda = self.device.type == "cuda" and torch.cuda.is_available()
        self._index = self._device_index()
        self._reset_window(self._clock())
        if self.device.type == "cuda":
            self._open_nvml()

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def nvml_active(self) -> bool:
        """True while NVML readings are being taken."""
        return self._handle is not None

    def start(self) -> GpuMonitor:
        """Start the sampler thread (no thread without NVML). Returns self."""
        if self._handle is None or self._thread is not None:
            return self
        self._stop.clear()
        self._reset_window(self._clock())
        self._thread = threading.Thread(target=self._run, name="muongen-gpu-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and release NVML; safe to call twice."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 2 * self.interval_s))
            self._thread = None
        if self._handle is not None:
            self._handle = None
            try:
                self._nvml.nvmlShutdown()
            except Exception as exc:  # never raise from monitoring
                self._debug_once(f"nvmlShutdown failed: {exc}")

    def __enter__(self) -> GpuMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- sampling -----------------------------------------------------------------------

    def sample(self) -> None:
        """Take one NVML reading; the thread calls this every ``interval_s``.

        The reading is weighted by the time since the previous one (or since the window
        started), so irregular sampling still gives a time average.
        """
        if self._handle is None:
            return
        try:
            util = float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
            mem = float(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used) / GIB
        except Exception as exc:
            self._debug_once(f"NVML reading failed, GPU sampling off: {exc}")
            self._handle = None
            self._stop.set()
            return
        now = self._clock()
        with self._lock:
            dt = max(now - self._last_t, 0.0)
            self._last_t = now
            self._n += 1
            self._weight += dt
            self._util_sum += util * dt
            self._mem_sum += mem * dt
            self._util_max = max(self._util_max, util)
            self._mem_max = max(self._mem_max, mem)
            self._util_last, self._mem_last = util, mem

    def snapshot(self) -> dict[str, float]:
        """Averages since the last snapshot plus current CUDA allocator stats; never raises."""
        out: dict[str, float] = {}
        if self._handle is not None:
            self.sample()  # close the window with a fresh reading
        with self._lock:
            if self._n:
                if self._weight > 0:
                    util, mem = self._util_sum / self._weight, self._mem_sum / self._weight
                else:  # readings all at one instant
                    util, mem = self._util_last, self._mem_last
                out["gpu/util_pct"] = util
                out["gpu/util_max_pct"] = self._util_max
                out["gpu/mem_used_gib"] = mem
                out["gpu/mem_used_max_gib"] = self._mem_max
            self._reset_window(self._last_t if self._n else self._clock())
        if self._cuda:
            try:
                out["cuda/allocated_gib"] = torch.cuda.memory_allocated(self.device) / GIB
                out["cuda/reserved_gib"] = torch.cuda.memory_reserved(self.device) / GIB
                out["cuda/max_reserved_gib"] = torch.cuda.max_memory_reserved(self.device) / GIB
            except Exception as exc:
                self._debug_once(f"CUDA memory stats failed: {exc}")
        return out

    # -- internals ----------------------------------------------------------------------

    def _reset_window(self, t0: float) -> None:
        self._last_t = t0
        self._n = 0
        self._weight = self._util_sum = self._mem_sum = 0.0
        self._util_max = self._mem_max = 0.0
        self._util_last = self._mem_last = 0.0

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def _device_index(self) -> int:
        if self.device.index is not None:
            return self.device.index
        if self._cuda:
            try:
                return torch.cuda.current_device()
            except Exception:
                return 0
        return 0

    def _open_nvml(self) -> None:
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()
        except Exception as exc:
            self._debug_once(f"NVML unavailable, GPU utilisation not sampled: {exc}")
            self._nvml = None
            return
        try:
            self._handle = self._nvml_handle()
        except Exception as exc:
            self._debug_once(f"no NVML handle for {self.device}: {exc}")
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()

    def _nvml_handle(self) -> Any:
        """The NVML handle of the torch device (NVML ignores CUDA_VISIBLE_DEVICES)."""
        if self._cuda:
            try:
                uuid = str(torch.cuda.get_device_properties(self._index).uuid)
                return self._nvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
            except Exception:
                pass  # old driver or MIG: fall back to the index
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
        index = self._index
        if self._index < len(visible) and visible[self._index].strip().isdigit():
            index = int(visible[self._index])
        return self._nvml.nvmlDeviceGetHandleByIndex(index)

    def _debug_once(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            log.debug(message)
