"""keep_freed_memory: the CPU step stops faulting fresh pages in every step."""

from __future__ import annotations

import statistics
import subprocess
import sys

import pytest

from muongen.train import memory

from .conftest import PYTHON

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")

# a few steps of the production model on a batch of 4096 events with ~3 muons each (per-muon
# activations of 1-6 MiB, as on the shared step bench), then the page faults per step in four
# windows of two steps each; torch's BLAS for the products (train.cpu_matmul=blas): each
# oneDNN call (the fakes' products) faults ~20 pages whatever malloc keeps
FAULTS_PER_STEP = """
import resource, sys, torch
from muongen.config import load_config
from muongen.data.batch import RaggedBatch
from muongen.model import build_models
from muongen.train.step import GanStep
torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
counts = torch.poisson(torch.full((4096,), 3.0), generator=gen).long()
n = int(counts.sum())
muons = torch.cat([-1 + 0.5 * torch.randn(n, 1, generator=gen),
                   0.01 * torch.randn(n, 2, generator=gen)], 1)
cond = torch.rand(4096, 4, generator=gen)
cfg = load_config("production-a100", ["train.device=cpu", "train.precision=fp32",
                  "optim.n_critic=2", "train.cpu_matmul=blas",
                  "train.cpu_keep_memory=" + sys.argv[1]])
torch.manual_seed(0)
step = GanStep(*build_models(cfg.model), cfg.optim, cfg.train, "cpu")
batch = [RaggedBatch(cond, muons, counts)]
for _ in range(3):
    step(batch)
per_step = []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(2):
        step(batch)
    per_step.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 2)
print(*per_step)
"""


def faults_per_step(keep: bool, env: dict) -> list[float]:
    out = subprocess.run(
        [PYTHON, "-c", FAULTS_PER_STEP, str(keep).lower()],
        capture_output=True, text=True, check=True, env=env, timeout=300,
    )  # fmt: skip
    return [float(x) for x in out.stdout.strip().splitlines()[-1].split()]


def test_the_cpu_step_keeps_its_memory(cli_env):
    """With the memory kept the step settles at ~1 fault per step; malloc's defaults hand
    the activations back and fault them in again, thousands per step. (Measured: the
    kept windows are mostly 0-2 per step, a window where the heap still reaches a new
    high-water mark 100-1300 once; the default's windows 400-9000.)"""
    kept, default = faults_per_step(True, cli_env), faults_per_step(False, cli_env)
    assert statistics.median(default) > 500
    assert min(kept) < statistics.median(default) / 10


def test_keep_freed_memory_is_idempotent():
    first = memory.keep_freed_memory()
    assert first is True  # glibc on Linux
    assert memory.keep_freed_memory() is first
