"""Write events in the exact production schemas (used by synth, outliers and `muongen sample`).

Arrow arrays are built from offsets and flat value buffers, never event by event.
Files are written to a temporary name and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from muongen import schema
from muongen.data.batch import RaggedBatch

V1_SCHEMA = pa.schema(
    [
        pa.field("primary_major_id", pa.uint64()),
        pa.field("primary_minor_id", pa.uint64()),
        pa.field("primary", pa.list_(pa.float32())),
        pa.field("muons", pa.list_(pa.list_(pa.float32()))),
    ]
)
V2_SCHEMA = pa.schema(
    [
        pa.field("primary", pa.list_(pa.float32())),
        pa.field("muons", pa.list_(pa.list_(pa.float32()))),
    ]
)
#: Parquet rendition of HDF5 rows, unchanged (used for outliers of HDF5 inputs).
HDF5_ROWS_SCHEMA = pa.schema(
    [
        pa.field("primaries", pa.list_(pa.float32())),
        pa.field("muons", pa.list_(pa.list_(pa.float32()))),
    ]
)
PARQUET_SCHEMAS = {schema.FORMAT_V1: V1_SCHEMA, schema.FORMAT_V2: V2_SCHEMA}


def list_array(counts: np.ndarray, values: pa.Array) -> pa.ListArray:
    """A list<...> array whose i-th entry holds the next counts[i] items of ``values``."""
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise ValueError(
            f"{offsets[-1]} list items exceed one Parquet list column; write fewer rows"
        )
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)


def rows_array(matrix: np.ndarray) -> pa.ListArray:
    """(n, k) float32 -> list<float32> with n entries of length k."""
    n, k = matrix.shape
    flat = pa.array(np.ascontiguousarray(matrix, dtype=np.float32).reshape(-1))
    return list_array(np.full(n, k, dtype=np.int64), flat)


def nested_array(counts: np.ndarray, matrix: np.ndarray) -> pa.ListArray:
    """counts (B,), muon rows (N, k) -> list<list<float32>> with B entries."""
    return list_array(counts, rows_array(matrix))


def _split_ids(ids, n: int) -> tuple[np.ndarray, np.ndarray]:
    if ids is None:
        return np.zeros(n, np.uint64), np.arange(n, dtype=np.uint64)
    if isinstance(ids, tuple):
        major, minor = ids
    else:
        ids = np.asarray(ids)
        major, minor = ids[:, 0], ids[:, 1]
    major = np.asarray(major, dtype=np.uint64)
    minor = np.asarray(minor, dtype=np.uint64)
    if major.shape != (n,) or minor.shape != (n,):
        raise ValueError(f"ids must give a (major, minor) pair for each of the {n} events")
    return major, minor


def _numpy(batch: RaggedBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cond = batch.conditions.detach().cpu().numpy().astype(np.float32, copy=False)
    muons = batch.muons.detach().cpu().numpy().astype(np.float32, copy=False)
    counts = batch.counts.detach().cpu().numpy().astype(np.int64, copy=False)
    if muons.shape[1] != schema.N_MUON:
        raise ValueError(
            f"write_events needs physical muons [E, x, y], got {muons.shape[1]} columns"
        )
    return cond, muons, counts


def v2_muons(muons: np.ndarray) -> np.ndarray:
    """[E, x, y] -> v2's [E, r, x, y] with r = hypot(x, y) in float32."""
    r = np.hypot(muons[:, 1], muons[:, 2]).astype(np.float32)
    return np.column_stack([muons[:, 0], r, muons[:, 1], muons[:, 2]]).astype(np.float32)


def parquet_table(batch: RaggedBatch, fmt: str, *, ids=None) -> pa.Table:
    """The events of ``batch`` as an Arrow table in the production schema of ``fmt``."""
    cond, muons, counts = _numpy(batch)
    if fmt == schema.FORMAT_V1:
        major, minor = _split_ids(ids, len(counts))
        arrays = [pa.array(major), pa.array(minor), rows_array(cond), nested_array(counts, muons)]
    elif fmt == schema.FORMAT_V2:
        arrays = [rows_array(cond), nested_array(counts, v2_muons(muons))]
    else:
        raise ValueError(f"not a Parquet format: {fmt!r}")
    return pa.Table.from_arrays(arrays, schema=PARQUET_SCHEMAS[fmt])


def write_events(
    path: str | os.PathLike,
    batch: RaggedBatch,
    fmt: str,
    *,
    ids=None,
    row_group_rows: int | None = None,
) -> None:
    """Write ``batch`` (physical units) to ``path`` in the production schema of ``fmt``.

    Args:
        path: local file to (over)write; parent folders are created.
        batch: events in physical units, muons [E, x, y].
        fmt: schema.FORMAT_V1, FORMAT_V2 or FORMAT_HDF5.
        ids: shower ids, a (major, minor) tuple of (B,) arrays or a (B, 2) array; default
            major 0 and minor = row number. v2 has no id columns; HDF5 stores them as float32.
        row_group_rows: Parquet rows per row group (pyarrow's default when None).
    """
    if fmt not in schema.FORMATS:
        raise ValueError(f"unknown format {fmt!r}; use one of {schema.FORMATS}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        if fmt == schema.FORMAT_HDF5:
            _write_hdf5(tmp, batch, ids)
        else:
            table = parquet_table(batch, fmt, ids=ids)
            pq.write_table(table, tmp, row_group_size=row_group_rows)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def hdf5_arrays(batch: RaggedBatch, ids=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(primaries [N, 7], muons [M, 6], counts [N]) in the HDF5 layout, with one dummy muon of
    zeros (count 1) for every event without muons, as the producer wrote them."""
    cond, muons, counts = _numpy(batch)
    major, minor = _split_ids(ids, len(counts))
    n = len(counts)
    prim = np.zeros((n, 7), np.float32)
    prim[:, 0], prim[:, 1] = major, minor
    prim[:, 2:5] = cond[:, 0:3]
    prim[:, 6] = cond[:, 3]
    empty = counts == 0
    out_counts = np.where(empty, 1, counts).astype(np.int32)
    # each event's muons start at its offset in the output; a dummy row stays all zeros
    out_off = np.zeros(n + 1, np.int64)
    np.cumsum(out_counts, out=out_off[1:])
    ev = np.repeat(np.arange(n), counts)
    shift = np.repeat(out_off[:-1] - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    rows = np.arange(len(muons)) + shift
    out = np.zeros((int(out_off[-1]), 6), np.float32)
    out[rows, 0], out[rows, 1] = major[ev], minor[ev]
    out[rows, 2:5] = muons
    return prim, out, out_counts


def _write_hdf5(path: Path, batch: RaggedBatch, ids) -> None:
    import h5py

    prim, muons, counts = hdf5_arrays(batch, ids)
    with h5py.File(path, "w") as h5:
        h5.create_dataset("primaries", data=prim)
        h5.create_dataset("muons", data=muons)
        h5.create_dataset("counts", data=counts)
