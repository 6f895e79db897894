"""Files -> RaggedBatch: sources, Parquet and HDF5 readers, the stream, outliers, synthesis."""

from __future__ import annotations

from muongen.data.batch import RaggedBatch

__all__ = ["RaggedBatch"]
