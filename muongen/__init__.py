"""muongen: a conditional WGAN-GP generator of atmospheric muon bundles for IceCube."""

from __future__ import annotations

__version__ = "0.1.0"

from muongen.errors import MuongenError

__all__ = ["MuongenError", "__version__"]
