from __future__ import annotations

import io
import json
from pathlib import Path

import torch

from muongen.monitor.profiler import profile


def test_profile_writes_trace_and_prints_table(tmp_path):
    layer = torch.nn.Linear(16, 16)
    x = torch.randn(8, 16)
    calls = []

    def step():
        calls.append(1)
        layer(x).relu().sum().backward()

    out = io.StringIO()
    trace = profile(step, 2, tmp_path / "prof", "cpu", warmup=1, stream=out)
    assert len(calls) == 3
    assert Path(trace).parent == tmp_path / "prof"
    events = json.loads(Path(trace).read_text())["traceEvents"]
    assert any(e.get("name") == "step_1" for e in events)
    text = out.getvalue()
    assert "self_cpu_time_total" in text
    assert "aten::" in text  # operator rows
    assert Path(trace).with_suffix(".txt").read_text().startswith("top 15 operators")

    second = profile(step, 1, tmp_path / "prof", "cpu", stream=io.StringIO())
    assert second != trace  # a second profile does not overwrite the first
