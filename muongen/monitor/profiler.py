"""``--profile-steps N``: run a step function under ``torch.profiler``, print the top operators
and write a Chrome trace (open it in https://ui.perfetto.dev or chrome://tracing).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import torch
from torch.profiler import ProfilerActivity, record_function

#: Rows of the top-operators table.
TOP_OPS = 15


def profile(
    fn: Callable[[], Any],
    steps: int,
    out_dir: str | Path,
    device: torch.device | str | None = None,
    *,
    warmup: int = 0,
    stream: TextIO | None = None,
) -> str:
    """Call ``fn()`` ``steps`` times under the profiler; return the Chrome trace's path.

    CUDA activity is recorded when ``device`` is a CUDA device (or, with ``device=None``,
    whenever CUDA is available). ``warmup`` calls run first, unprofiled (compilation,
    allocator warm-up). The table of the top :data:`TOP_OPS` operators by self time (CUDA
    and CPU on a GPU, CPU otherwise) is printed to ``stream`` (stdout) and saved next to
    the trace as ``<trace>.txt``.
    """
    if steps < 1:
        raise ValueError(f"profile needs steps >= 1, got {steps}")
    if device is None:
        cuda = torch.cuda.is_available()
    else:
        cuda = torch.device(device).type == "cuda" and torch.cuda.is_available()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stream = sys.stdout if stream is None else stream

    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        for i in range(steps):
            with record_function(f"step_{i}"):
                fn()
        if cuda:
            torch.cuda.synchronize()

    averages = prof.key_averages()
    sort_keys = (
        ["self_device_time_total", "self_cpu_time_total"] if cuda else ["self_cpu_time_total"]
    )
    tables = []
    for key in sort_keys:
        title = f"top {TOP_OPS} operators by {key} over {steps} steps"
        tables.append(f"{title}\n{averages.table(sort_by=key, row_limit=TOP_OPS)}")
    text = "\n".join(tables)
    print(text, file=stream, flush=True)

    stamp = time.strftime("%Y%m%d-%H%M%S")
    trace = out / f"trace-{stamp}.json"
    n = 1
    while trace.exists():  # two profiles within a second
        n += 1
        trace = out / f"trace-{stamp}-{n}.json"
    prof.export_chrome_trace(str(trace))
    trace.with_suffix(".txt").write_text(text + "\n")
    print(f"profiler trace: {trace}", file=stream, flush=True)
    return str(trace)
