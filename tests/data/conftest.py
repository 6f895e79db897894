"""Fixtures of the data-pipeline tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from muongen.data.batch import RaggedBatch
from muongen.data.synth import write_synthetic


def _make_batch(counts, seed: int = 0) -> RaggedBatch:
    """A batch with the given multiplicities and random valid physical values."""
    rng = np.random.default_rng(seed)
    counts = np.asarray(counts, np.int64)
    n, m = len(counts), int(counts.sum())
    cond = np.column_stack(
        [
            10 ** rng.uniform(3, 9, n),
            rng.uniform(0, 1.4, n),
            rng.choice([1, 4, 14, 28, 56], n),
            rng.uniform(1000, 2800, n),
        ]
    ).astype(np.float32)
    muons = np.column_stack(
        [10 ** rng.uniform(0, 4, m), rng.normal(0, 30, m), rng.normal(0, 30, m)]
    )
    return RaggedBatch.from_numpy(cond, muons.astype(np.float32), counts)


@pytest.fixture
def make_batch():
    """Factory of batches with given multiplicities (random valid physical values)."""
    return _make_batch


@pytest.fixture
def batch() -> RaggedBatch:
    # Hand-picked multiplicities: empty events first, last and in between, a single muon,
    # and a large one, so every offset edge case is exercised by the round trips.
    return _make_batch([0, 3, 0, 0, 1, 250, 0, 7, 2, 0])


@pytest.fixture(scope="session")
def dataset(tmp_path_factory) -> list[str]:
    # Eight small v1 files of the muon-rich mix (so batches carry muons and empty events
    # alike), shared by the stream tests; session scope because writing them is the slow part.
    out = tmp_path_factory.mktemp("dataset")
    return write_synthetic(out, files=8, events_per_file=700, mix="rich", seed=5)


@pytest.fixture
def keys_of():
    """Concatenated keys of a list of batches, as a numpy array."""

    def _keys(batches) -> np.ndarray:
        if not batches:
            return np.zeros(0, np.int64)
        return torch.cat([b.keys for b in batches]).numpy()

    return _keys
