"""Outlier shards: names, sizes, bit-exact content, HDF5 rows, consolidation and its CLI."""

from __future__ import annotations

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from muongen import schema
from muongen.cli import main
from muongen.data import writers
from muongen.data.outliers import OutlierWriter, consolidate
from muongen.data.reader import FileReader


def _table(rows: int, start: int = 0) -> pa.Table:
    ids = pa.array(np.arange(start, start + rows, dtype=np.uint64))
    primary = writers.rows_array(np.full((rows, 4), 7.5, np.float32))
    muons = writers.nested_array(
        np.full(rows, 2), np.arange(rows * 6, dtype=np.float32).reshape(-1, 3)
    )
    return pa.Table.from_arrays([ids, ids, primary, muons], schema=writers.V1_SCHEMA)


def test_writer_fills_shards_of_many_events(tmp_path):
    writer = OutlierWriter(tmp_path, shard_events=5)
    for i in range(4):
        writer.add(_table(3, 3 * i), schema.FORMAT_V1)  # 12 events
    assert [p.name for p in sorted(tmp_path.iterdir())] == [
        "outliers-parquet-v1-00000.parquet",
        "outliers-parquet-v1-00001.parquet",
    ]
    writer.close()
    shards = sorted(tmp_path.glob("*.parquet"))
    assert [pq.read_metadata(p).num_rows for p in shards] == [5, 5, 2]
    back = pa.concat_tables([pq.read_table(p) for p in shards])
    assert writer.count == 12
    assert back.equals(pa.concat_tables([_table(3, 3 * i) for i in range(4)]))


def test_a_second_writer_never_overwrites_a_shard(tmp_path):
    for _ in range(2):
        with OutlierWriter(tmp_path, shard_events=10) as w:
            w.add(_table(4), schema.FORMAT_V1)
    assert len(list(tmp_path.glob("outliers-parquet-v1-*.parquet"))) == 2


def test_hdf5_outliers_keep_the_rows_unchanged(tmp_path, make_batch):
    batch = make_batch([2, 60, 0, 75, 1])
    path = tmp_path / "in.h5"
    writers.write_events(path, batch, schema.FORMAT_HDF5, ids=(np.full(5, 9), np.arange(5)))
    with FileReader(str(path)) as fr:
        chunk = next(fr.chunks(0, 100, max_muons=50))
    assert chunk.counts.tolist() == [2, 0, 1] and chunk.outlier_rows.tolist() == [1, 3]
    with h5py.File(path) as h5:
        prim, muons, counts = h5["primaries"][:], h5["muons"][:], h5["counts"][:]
    off = np.concatenate([[0], np.cumsum(counts)])
    rows = chunk.outliers.to_pylist()
    for row, r in zip(rows, (1, 3)):
        np.testing.assert_array_equal(np.float32(row["primaries"]), prim[r])
        np.testing.assert_array_equal(np.float32(row["muons"]), muons[off[r] : off[r + 1]])
    with OutlierWriter(tmp_path / "out") as w:
        w.add(chunk.outliers, schema.FORMAT_HDF5)
    assert (tmp_path / "out" / "outliers-hdf5-00000.parquet").exists()


def test_consolidate_merges_small_files_bit_for_bit(tmp_path):
    for i in range(7):  # seven small files, as checkpoints' partial shards leave them
        with OutlierWriter(tmp_path, shard_events=100) as w:
            w.add(_table(3, 3 * i), schema.FORMAT_V1)
    before = pa.concat_tables([pq.read_table(p) for p in sorted(tmp_path.glob("*.parquet"))])
    new = consolidate(tmp_path, shard_events=8)
    shards = sorted(tmp_path.glob("*.parquet"))
    assert len(new) == len(shards) == 3
    assert [pq.read_metadata(p).num_rows for p in shards] == [8, 8, 5]
    after = pa.concat_tables([pq.read_table(p) for p in shards])
    assert after.equals(before)


def test_consolidate_cli(tmp_path, capsys):
    for i in range(3):
        with OutlierWriter(tmp_path, shard_events=100) as w:
            w.add(_table(2, 2 * i), schema.FORMAT_V1)
    assert main(["outliers", "consolidate", str(tmp_path), "--shard-events", "10"]) == 0
    assert "3 files -> 1 files" in capsys.readouterr().out
    assert pq.read_metadata(next(tmp_path.glob("*.parquet"))).num_rows == 6
    assert main(["outliers", "consolidate", str(tmp_path / "missing")]) != 0


def test_the_outlier_folder_exists_once_the_stream_is_checkpointed(dataset, tmp_path, capsys):
    # The README's `muongen outliers consolidate runs/demo/outliers` must work on a run that
    # met no outlier: the folder is part of the run folder's layout, not of the data.
    from muongen.config import DataConfig
    from muongen.data.stream import EventStream

    out = tmp_path / "run" / "outliers"
    cfg = DataConfig(batch_events=64, shuffle_buffer_events=256, max_muons_per_event=0)
    stream = EventStream(dataset[:2], cfg, outliers=OutlierWriter(out))
    next(iter(stream))
    stream.state_dict()  # what every checkpoint does
    assert out.is_dir() and not list(out.iterdir())
    assert main(["outliers", "consolidate", str(out), "--shard-events", "10000"]) == 0
    assert "0 files -> 0 files" in capsys.readouterr().out
