"""Outlier events (more muons than training takes) kept, unchanged, in Parquet shards.

Events with more than ``data.max_muons_per_event`` muons are not trained on; they are
written exactly as they were in the input file (every column, bit for bit) to
``<dir>/outliers-<format>-NNNNN.parquet`` shards of ``shard_events`` events, never one file
per event. Inputs in the HDF5 layout are stored as Parquet columns ``primaries``
list<float32>[7] and ``muons`` list<list<float32>>[6] holding the HDF5 rows.

Shard names are claimed with an exclusive create, so several writers (ranks, restarts) can
share a folder; a shard is written to a temporary file and renamed over its claimed name.
``muongen outliers consolidate DIR`` merges small shards (e.g. the partial shard written at
every checkpoint) into full ones.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from muongen import schema
from muongen.data import formats
from muongen.errors import InputFileError

HELP = "outlier datasets: `outliers consolidate DIR` merges small outlier files into shards"

log = logging.getLogger(__name__)

SHARD_RE = re.compile(r"^outliers-(?P<fmt>[a-z0-9-]+)-(?P<num>\d{5,})\.parquet$")


def shard_name(fmt: str, number: int) -> str:
    return f"outliers-{fmt}-{number:05d}.parquet"


def table_format(table_schema: pa.Schema, where: str) -> str:
    """The input format an outlier table's columns come from."""
    if set(table_schema.names) == {"primaries", "muons"}:
        return schema.FORMAT_HDF5
    return formats.parquet_format(table_schema, where)


class OutlierWriter:
    """Buffers outlier events per input format and writes full shards of ``shard_events``.

    Args:
        out_dir: the outlier folder (created on first write).
        shard_events: events per shard.
    """

    def __init__(self, out_dir: str | os.PathLike, shard_events: int = 10000) -> None:
        if shard_events < 1:
            raise ValueError("shard_events must be >= 1")
        self.dir = Path(out_dir)
        self.shard_events = shard_events
        self.count = 0  # events added
        self.shards: list[str] = []  # shards this writer wrote
        self._buf: dict[str, list[pa.Table]] = {}

    def add(self, table: pa.Table, fmt: str) -> None:
        """Add events (a table in the input schema of ``fmt``); writes each full shard."""
        if table.num_rows == 0:
            return
        parts = self._buf.setdefault(fmt, [])
        if parts and parts[0].schema != table.schema:  # another producer's exact types
            self._write(fmt, pa.concat_tables(parts))
            parts.clear()
        parts.append(table)
        self.count += table.num_rows
        buffered = pa.concat_tables(parts)
        while buffered.num_rows >= self.shard_events:
            self._write(fmt, buffered.slice(0, self.shard_events))
            buffered = buffered.slice(self.shard_events)
        parts[:] = [buffered] if buffered.num_rows else []

    def flush(self) -> None:
        """Write every buffered event now (a partial shard per format).

        The folder exists from the first flush on (every checkpoint flushes), empty when
        there were no outliers: the run folder's layout does not depend on the data.
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        for fmt, parts in self._buf.items():
            if parts:
                self._write(fmt, pa.concat_tables(parts))
                parts.clear()

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> OutlierWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _write(self, fmt: str, table: pa.Table) -> None:
        path = claim_shard(self.dir, fmt)
        tmp = path.with_name(f".{path.name}.tmp")
        pq.write_table(table.combine_chunks(), tmp)
        os.replace(tmp, path)
        self.shards.append(str(path))
        log.info("wrote %d outlier events to %s", table.num_rows, path)


def claim_shard(out_dir: Path, fmt: str) -> Path:
    """Create (exclusively) and return the next free ``outliers-<fmt>-NNNNN.parquet``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    used = [
        int(m["num"]) for p in os.listdir(out_dir) if (m := SHARD_RE.match(p)) and m["fmt"] == fmt
    ]
    number = max(used, default=-1) + 1
    while True:
        path = out_dir / shard_name(fmt, number)
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return path
        except FileExistsError:
            number += 1


def consolidate(out_dir: str | os.PathLike, shard_events: int = 10000) -> list[str]:
    """Merge the Parquet files of ``out_dir`` holding fewer than ``shard_events`` events into
    shards of ``shard_events`` (per format and exact schema); returns the new shards.

    New shards are complete on disk before any source file is removed. Files already full
    are left alone.
    """
    out_dir = Path(out_dir)
    small: dict[tuple[str, str], list[Path]] = {}
    for path in sorted(out_dir.glob("*.parquet")):
        try:
            meta = pq.ParquetFile(path)
            fmt = table_format(meta.schema_arrow, str(path))
        except (OSError, pa.ArrowException) as exc:
            raise InputFileError(f"{path}: cannot read outlier file ({exc})") from None
        if meta.metadata.num_rows < shard_events:
            small.setdefault((fmt, str(meta.schema_arrow)), []).append(path)
    new: list[str] = []
    for (fmt, _), paths in small.items():
        if len(paths) < 2:
            continue
        writer = OutlierWriter(out_dir, shard_events)
        for path in paths:
            writer.add(pq.read_table(path), fmt)
        writer.flush()
        new.extend(writer.shards)
        for path in paths:
            path.unlink()
    return new


# ------------------------------------------------------------------ CLI


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    p = sub.add_parser("consolidate", help="merge small outlier files into shards")
    p.add_argument("dir", help="outlier folder")
    p.add_argument(
        "--shard-events", type=int, default=10000, help="events per shard (default 10000)"
    )


def run(args: argparse.Namespace) -> int:
    if not Path(args.dir).is_dir():
        raise InputFileError(f"outlier folder {args.dir} does not exist")
    before = len(list(Path(args.dir).glob("*.parquet")))
    new = consolidate(args.dir, args.shard_events)
    after = len(list(Path(args.dir).glob("*.parquet")))
    print(f"{args.dir}: {before} files -> {after} files ({len(new)} new shards)")
    return 0
