"""Read production files into flat numpy/torch arrays in physical units, chunk by chunk.

Parquet: ``ParquetFile.iter_batches(columns=["primary", "muons"])`` and the list offsets of
each record batch are flattened with numpy (no Python loop over events): ``primary`` becomes
conditions (B, 4), the inner lists of ``muons`` become muon rows (N, 3 or 4), and the outer
offsets give ``counts``. Sliced Arrow arrays are handled by using their absolute offsets.
HDF5: rows [a, b) are slices of ``primaries`` and ``muons`` found from cumsum(counts); the
producer's one dummy muon of zeros of an empty event (count 1, energy 0) is dropped.

Every event is validated: a null/NaN/inf value, or a non-positive energy or mass, drops
the event and counts it under a reason (nothing is dropped silently). A file that cannot be
read raises InputFileError (SchemaError for wrong columns) naming the file.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from muongen import schema
from muongen.data import formats
from muongen.data.batch import RaggedBatch
from muongen.errors import InputFileError, MuongenError, SchemaError
from muongen.storage import open_input

log = logging.getLogger(__name__)

READ_COLUMNS = ["primary", "muons"]  # v1 shower ids are read only for outliers
V2_KEEP = [0, 2, 3]  # [E, r, x, y] -> [E, x, y]; r is hypot(x, y)

REASON_NULL = "null value"
REASON_NONFINITE = "NaN or inf value"
REASON_ENERGY = "energy <= 0"
REASON_MASS = "mass number <= 0"

# Errors the Arrow/HDF5 stacks raise on damaged files; they become InputFileError.
READ_ERRORS = (OSError, EOFError, ValueError, KeyError, IndexError, RuntimeError, pa.ArrowException)


@dataclass
class Chunk:
    """The valid events among rows [start, stop) of one file, in physical units.

    Attributes:
        conditions: (B, 4) float32 [E, zenith, A, depth].
        muons: (N, 3) float32 [E, x, y], event after event.
        counts: (B,) int64.
        rows: (B,) int64 row of each event in its file.
        start, stop: the file rows this chunk covers (dropped events included).
        bad: reason -> number of events dropped.
        outliers: events with more than the reader's max_muons muons, taken out of the
            chunk, unchanged and in the input schema (None when there are none).
        outlier_rows: (K,) int64 their rows in the file.
    """

    conditions: np.ndarray
    muons: np.ndarray
    counts: np.ndarray
    rows: np.ndarray
    start: int
    stop: int
    bad: dict[str, int] = field(default_factory=dict)
    outliers: pa.Table | None = None
    outlier_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def n_events(self) -> int:
        return len(self.counts)

    def select(self, idx: np.ndarray) -> Chunk:
        """The events at ``idx`` (in that order); the rest of the fields unchanged."""
        mrows = gather_events(offsets_of(self.counts)[:-1], self.counts, idx)
        return replace(
            self,
            conditions=np.take(self.conditions, idx, axis=0),
            muons=np.take(self.muons, mrows, axis=0),
            counts=np.take(self.counts, idx),
            rows=np.take(self.rows, idx),
        )

    def head(self, stop_row: int) -> tuple[Chunk, Chunk]:
        """(rows [start, stop_row), rows [stop_row, stop)); bad counts stay with the head."""
        k = int(np.searchsorted(self.rows, stop_row))
        m = int(self.counts[:k].sum())
        j = int(np.searchsorted(self.outlier_rows, stop_row))
        out_a = out_b = None
        if self.outliers is not None:
            out_a = self.outliers.slice(0, j) if j else None
            out_b = self.outliers.slice(j) if j < self.outliers.num_rows else None
        a = Chunk(
            self.conditions[:k],
            self.muons[:m],
            self.counts[:k],
            self.rows[:k],
            self.start,
            stop_row,
            self.bad,
            out_a,
            self.outlier_rows[:j],
        )
        b = Chunk(
            self.conditions[k:],
            self.muons[m:],
            self.counts[k:],
            self.rows[k:],
            stop_row,
            self.stop,
            {},
            out_b,
            self.outlier_rows[j:],
        )
        return a, b

    def to_batch(self, file_index: int = 0) -> RaggedBatch:
        """A RaggedBatch owning its memory (Arrow's zero-copy buffers are read-only)."""
        keys = (np.int64(file_index) << np.int64(32)) | self.rows
        arrays = (
            a if a.flags.writeable else a.copy() for a in (self.conditions, self.muons, self.counts)
        )
        return RaggedBatch.from_numpy(*arrays, keys)


def gather_events(starts: np.ndarray, counts: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Muon row indices of events ``idx`` in that order (vectorised), given their starts."""
    c = np.take(counts, idx)
    ends = np.cumsum(c)
    total = int(ends[-1]) if len(ends) else 0
    return np.repeat(np.take(starts, idx) - (ends - c), c) + np.arange(total, dtype=np.int64)


def offsets_of(counts: np.ndarray) -> np.ndarray:
    """(B + 1,) int64 start of each event's muons."""
    off = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=off[1:])
    return off


# ------------------------------------------------------------------ Arrow flattening


def _list_offsets(arr: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """(absolute offsets (len + 1,), the unsliced child values) of a list-type array."""
    if pa.types.is_fixed_size_list(arr.type):
        k = arr.type.list_size
        return (np.arange(len(arr) + 1, dtype=np.int64) + arr.offset) * k, arr.values
    return arr.offsets.to_numpy(), arr.values


def _floats(arr: pa.Array) -> np.ndarray:
    """float32 numpy of a float array (nulls become NaN)."""
    out = arr.to_numpy(zero_copy_only=False)
    return out.astype(np.float32, copy=False)


def _null_mask(arr: pa.Array) -> np.ndarray:
    return arr.is_null().to_numpy(zero_copy_only=False)


def _fixed_rows(
    arr: pa.Array, width: int, url: str, what: str
) -> tuple[np.ndarray, np.ndarray | None]:
    """list<float> array of n entries of ``width`` values -> ((n, width) float32, null mask).

    Null entries become rows of NaN and are flagged in the mask (None when there are none);
    a non-null entry of another length means the file has the wrong schema.
    """
    n = len(arr)
    off, values = _list_offsets(arr)
    if arr.null_count == 0 and off[-1] - off[0] == width * n and (np.diff(off) == width).all():
        return _floats(values.slice(off[0], width * n)).reshape(n, width), None
    null = _null_mask(arr)
    lens = np.diff(off)
    wrong = (lens != width) & ~null
    if wrong.any():
        raise SchemaError(
            f"{url}: {what} entries hold {int(lens[wrong][0])} values where {width} are expected"
        )
    flat = _floats(values.slice(off[0], off[-1] - off[0]))
    out = np.full((n, width), np.nan, np.float32)
    ok = ~null
    out[ok] = flat[(off[:-1][ok] - off[0])[:, None] + np.arange(width)]
    return out, null


def parquet_chunk(rb: pa.RecordBatch, fmt: str, start: int, url: str) -> Chunk:
    """Flatten one Arrow record batch of ``primary`` and ``muons`` into a validated Chunk."""
    n = rb.num_rows
    width = formats.MUON_WIDTH[fmt]
    cond, null_primary = _fixed_rows(rb.column("primary"), 4, url, "primary")
    outer = rb.column("muons")
    m_off, inner = _list_offsets(outer)
    counts = np.subtract(m_off[1:], m_off[:-1], dtype=np.int64)
    inner = inner.slice(m_off[0], m_off[-1] - m_off[0])
    muons, null_muon = _fixed_rows(inner, width, url, "muon")
    if fmt == schema.FORMAT_V2:
        muons = muons[:, V2_KEEP]
    null_event = None
    if null_primary is not None or null_muon is not None or outer.null_count:
        null_event = np.zeros(n, bool) if null_primary is None else null_primary.copy()
        if outer.null_count:
            null_event |= _null_mask(outer)
        if null_muon is not None:
            null_event[_event_of(counts, np.flatnonzero(null_muon))] = True
    rows = np.arange(start, start + n, dtype=np.int64)
    return validate(cond, muons, counts, rows, start, start + n, null_event)


def _event_of(counts: np.ndarray, muon_rows: np.ndarray) -> np.ndarray:
    """Event index of each muon row (for the few rows that need it)."""
    return np.searchsorted(np.cumsum(counts), muon_rows, side="right")


# ------------------------------------------------------------------ validation


def _all_good(values: np.ndarray, energy: np.ndarray, mass: np.ndarray | None = None) -> bool:
    """Cheap whole-array test: every value finite and every energy (and mass) positive."""
    if values.size == 0:
        return True
    with np.errstate(over="ignore", invalid="ignore"):
        finite = bool(np.isfinite(np.add.reduce(values, axis=None)))
    return finite and energy.min() > 0 and (mass is None or mass.min() > 0)


def validate(
    cond: np.ndarray,
    muons: np.ndarray,
    counts: np.ndarray,
    rows: np.ndarray,
    start: int,
    stop: int,
    null_event: np.ndarray | None = None,
) -> Chunk:
    """Drop (and count by reason) events with a null, NaN/inf, or non-positive energy/mass."""
    n = len(counts)
    good_c = _all_good(cond, cond[:, 0], cond[:, 2])
    good_m = _all_good(muons, muons[:, 0])
    if good_c and good_m and null_event is None:
        return Chunk(cond, muons, counts, rows, start, stop)
    reasons: list[tuple[str, np.ndarray]] = []
    if null_event is not None:
        reasons.append((REASON_NULL, null_event))
    if not good_c:
        reasons.append((REASON_NONFINITE, ~np.isfinite(cond).all(axis=1)))
        reasons.append((REASON_ENERGY, cond[:, 0] <= 0))
        reasons.append((REASON_MASS, cond[:, 2] <= 0))
    if not good_m:
        for reason, per_muon in (
            (REASON_NONFINITE, ~np.isfinite(muons).all(axis=1)),
            (REASON_ENERGY, muons[:, 0] <= 0),
        ):
            per_event = np.zeros(n, bool)
            per_event[_event_of(counts, np.flatnonzero(per_muon))] = True
            reasons.append((reason, per_event))
    dropped = np.zeros(n, bool)
    bad: dict[str, int] = {}
    for reason, mask in reasons:  # an event counts under its first reason only
        new = mask & ~dropped
        if new.any():
            bad[reason] = bad.get(reason, 0) + int(new.sum())
            dropped |= new
    if not bad:
        return Chunk(cond, muons, counts, rows, start, stop)
    keep = np.flatnonzero(~dropped)
    mrows = gather_events(offsets_of(counts)[:-1], counts, keep)
    take = np.take
    return Chunk(
        take(cond, keep, 0),
        take(muons, mrows, 0),
        take(counts, keep),
        take(rows, keep),
        start,
        stop,
        bad,
    )


# ------------------------------------------------------------------ files


def _wrap(url: str, exc: BaseException) -> InputFileError:
    detail = " ".join(str(exc).split())  # Arrow's messages span lines; ours is one
    return InputFileError(
        f"{url}: cannot read ({type(exc).__name__}: {detail}); the file may be truncated or damaged"
    )


class FileReader:
    """One open input file (Parquet v1/v2 or HDF5) read in row chunks.

    Args:
        url: the file's name in the run (used in messages and reports).
        local_path: a local copy to read instead (from a prefetcher); opened through
            :func:`muongen.storage.open_input` all the same.
    """

    def __init__(self, url: str, *, local_path: str | None = None) -> None:
        self.url = url
        self._fh = open_input(local_path or url)
        self._h5 = None
        self._pf: pq.ParquetFile | None = None
        try:
            kind = formats.sniff(self._fh)
            self._fh.seek(0)
            if kind == "parquet":
                self._pf = pq.ParquetFile(self._fh)
                self.fmt = formats.parquet_format(self._pf.schema_arrow, url)
                md = self._pf.metadata
                self._rg_rows = np.array(
                    [md.row_group(i).num_rows for i in range(md.num_row_groups)], np.int64
                )
                self.n_rows = int(md.num_rows)
            elif kind == "hdf5":
                import h5py

                self._h5 = h5py.File(self._fh, "r")
                formats.hdf5_check(self._h5, url)
                self.fmt = schema.FORMAT_HDF5
                self._h5_init()
            else:
                formats.detect_open(self._fh, url)  # raises SchemaError with the details
        except MuongenError:
            self.close()
            raise
        except READ_ERRORS as exc:
            self.close()
            raise _wrap(url, exc) from None

    def _h5_init(self) -> None:
        h5 = self._h5
        counts = h5["counts"][:].astype(np.int64)
        n_mu = h5["muons"].shape[0]
        if h5["primaries"].shape[0] != len(counts):
            raise SchemaError(
                f"{self.url}: HDF5 primaries has {h5['primaries'].shape[0]} rows "
                f"but counts has {len(counts)}"
            )
        if (counts < 0).any() or counts.sum() != n_mu:
            raise InputFileError(
                f"{self.url}: HDF5 counts sum to {counts.sum()} but muons has {n_mu} rows; "
                "the file is damaged"
            )
        self._h5_counts = counts
        self._h5_off = offsets_of(counts)
        self.n_rows = len(counts)

    def close(self) -> None:
        if self._h5 is not None:
            self._h5.close()
            self._h5 = None
        self._pf = None
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> FileReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def chunks(self, start: int = 0, rows: int = 65536, *, max_muons: int = 0) -> Iterator[Chunk]:
        """Validated chunks of up to ``rows`` file rows, from row ``start`` to the end.

        Events with more than ``max_muons`` muons (if > 0) are moved to ``Chunk.outliers``
        as they are in the file (every column, bit for bit).
        """
        try:
            if self._pf is not None:
                yield from self._parquet_chunks(start, rows, max_muons)
            else:
                yield from self._hdf5_chunks(start, rows, max_muons)
        except MuongenError:
            raise
        except READ_ERRORS as exc:
            raise _wrap(self.url, exc) from None

    def _parquet_chunks(self, start: int, rows: int, max_muons: int) -> Iterator[Chunk]:
        if start >= self.n_rows:
            return
        ends = np.cumsum(self._rg_rows)
        first = int(np.searchsorted(ends, start, side="right"))
        row = int(ends[first - 1]) if first else 0
        groups = list(range(first, len(self._rg_rows)))
        for rb in self._pf.iter_batches(batch_size=rows, row_groups=groups, columns=READ_COLUMNS):
            if row < start:
                skip = start - row
                if skip >= rb.num_rows:
                    row += rb.num_rows
                    continue
                rb, row = rb.slice(skip), start
            chunk = parquet_chunk(rb, self.fmt, row, self.url)
            if max_muons > 0:
                chunk = _siphon(
                    chunk,
                    max_muons,
                    lambda file_rows, rb=rb, row=row: self._parquet_raw(rb, row, file_rows),
                )
            yield chunk
            row += rb.num_rows

    def _parquet_raw(self, rb: pa.RecordBatch, row0: int, file_rows: np.ndarray) -> pa.Table:
        """Rows of the file as written (every column): primary and muons from the record
        batch in hand, the shower ids (v1) read for just their row group."""
        taken = rb.take(pa.array(file_rows - row0))
        columns, names = [taken.column("primary"), taken.column("muons")], ["primary", "muons"]
        if self.fmt == schema.FORMAT_V1:
            id_names = list(formats.PARQUET_COLUMNS[schema.FORMAT_V1][:2])
            ends = np.cumsum(self._rg_rows)
            groups = np.searchsorted(ends, file_rows, side="right")
            parts = []
            for g in np.unique(groups):
                local = file_rows[groups == g] - (ends[g - 1] if g else 0)
                parts.append(
                    self._pf.read_row_group(int(g), columns=id_names).take(pa.array(local))
                )
            ids = pa.concat_tables(parts).combine_chunks()
            columns = [ids.column(0).chunk(0), ids.column(1).chunk(0), *columns]
            names = [*id_names, *names]
        return pa.Table.from_arrays(columns, names=names)

    def _hdf5_chunks(self, start: int, rows: int, max_muons: int) -> Iterator[Chunk]:
        prim_ds, mu_ds = self._h5["primaries"], self._h5["muons"]
        off = self._h5_off
        for a in range(start, self.n_rows, rows):
            b = min(a + rows, self.n_rows)
            prim = prim_ds[a:b]
            block = mu_ds[off[a] : off[b]]
            counts = self._h5_counts[a:b].copy()
            cond = np.ascontiguousarray(prim[:, [2, 3, 4, 6]])
            muons = block[:, 2:5]
            # the producer's stand-in for "no muons": count 1 and a muon of energy 0
            one = np.flatnonzero(counts == 1)
            dummy = one[block[off[a:b][one] - off[a], 2] == 0]
            if len(dummy):
                keep_mu = np.ones(len(block), bool)
                keep_mu[off[a:b][dummy] - off[a]] = False
                muons = muons[keep_mu]
                counts[dummy] = 0
            muons = np.ascontiguousarray(muons)
            chunk = validate(cond, muons, counts, np.arange(a, b, dtype=np.int64), a, b)
            if max_muons > 0:
                raw_counts = self._h5_counts[a:b]
                chunk = _siphon(
                    chunk,
                    max_muons,
                    lambda rows, p=prim, bl=block, c=raw_counts, a=a: _hdf5_raw(p, bl, c, rows - a),
                )
            yield chunk


def _hdf5_raw(
    prim: np.ndarray, block: np.ndarray, counts: np.ndarray, local: np.ndarray
) -> pa.Table:
    """HDF5 rows ``local`` of a block, unchanged, as Parquet columns primaries / muons."""
    from muongen.data import writers

    mrows = gather_events(offsets_of(counts)[:-1], counts, local)
    return pa.Table.from_arrays(
        [writers.rows_array(prim[local]), writers.nested_array(counts[local], block[mrows])],
        schema=writers.HDF5_ROWS_SCHEMA,
    )


def _siphon(chunk: Chunk, max_muons: int, raw) -> Chunk:
    """Move the events with more than ``max_muons`` muons out of ``chunk`` into its outliers;
    ``raw(file_rows)`` returns them as written in the file."""
    big = chunk.counts > max_muons
    if not big.any():
        return chunk
    file_rows = chunk.rows[big]
    out = chunk.select(np.flatnonzero(~big))
    out.outliers, out.outlier_rows = raw(file_rows), file_rows
    return out


def iter_file(
    url: str,
    file_index: int = 0,
    *,
    rows_per_batch: int = 65536,
    start_row: int = 0,
    report=None,
    local_path: str | None = None,
) -> Iterator[RaggedBatch]:
    """The valid events of one file in chunks of ``rows_per_batch`` rows (physical units).

    keys = (file_index << 32) | row. Dropped events are logged and, when a
    :class:`~muongen.data.report.BadInputReport` is given, recorded in it.
    """
    with FileReader(url, local_path=local_path) as fr:
        for chunk in fr.chunks(start_row, rows_per_batch):
            for reason, n in chunk.bad.items():
                log.warning("%s: dropped %d events (%s)", url, n, reason)
                if report is not None:
                    report.bad_events(url, n, reason)
            yield chunk.to_batch(file_index)


def read_events(url: str, *, max_events: int | None = None, report=None) -> RaggedBatch:
    """All valid events of one file (or its first ``max_events``), keys with file_index 0."""
    parts: list[RaggedBatch] = []
    n = 0
    for batch in iter_file(url, report=report):
        parts.append(batch)
        n += batch.n_events
        if max_events is not None and n >= max_events:
            break
    out = RaggedBatch.concat(parts)
    if max_events is not None and out.n_events > max_events:
        out = out.slice(0, max_events)
    return out
