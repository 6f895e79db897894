"""Storage test fixtures: a local Pelican federation and token isolation.

The federation lives in tests/pelican_federation.py so that other areas' tests can use it
too (see that module's docstring for how); this file makes its fixtures visible here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parents[1]))  # tests/: shared test helpers

from pelican_federation import (
    Federation,
    isolated_tokens,  # noqa: F401 (a fixture: imported to register it here)
    pelican_federation,  # noqa: F401
    sample_bytes,
)


@pytest.fixture
def sim_tree(pelican_federation: Federation) -> list[str]:  # noqa: F811 (the fixture)
    """Production-like layout (range folders of 7-digit file numbers) with a few small
    files in each of three ranges, in the token-protected namespace; returns the
    namespace paths in sorted order. Contents are deterministic bytes, not Parquet."""
    paths = []
    for r in range(3):
        folder = f"/icecube/sim/{r * 1000:07d}-{r * 1000 + 999:07d}"
        for i in range(3):
            path = f"{folder}/{r * 1000 + i:07d}.parquet"
            pelican_federation.put_bytes(path, sample_bytes(path))
            paths.append(path)
    pelican_federation.put_bytes("/icecube/sim/README.txt", b"not an input")
    return sorted(paths)
