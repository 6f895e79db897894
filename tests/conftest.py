"""Shared pytest setup. Area fixtures live in tests/<area>/conftest.py."""

from __future__ import annotations

import os

import pytest

# Two cores on CI: keep torch from oversubscribing when tests start subprocesses.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _torch_threads():
    # Tests are small; one intra-op thread is faster and keeps results reproducible.
    try:
        import torch
    except ImportError:  # submit/ tests run without torch on an access point
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def load_script():
    """``load(relative_path)``: a script of the repository outside the package (benchmarks/),
    imported from its path under the repository root."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).parents[1]

    def load(relative: str):
        path = root / relative
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
