"""Format round trips, detection from content, HDF5 dummy muons, validation of events."""

from __future__ import annotations

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from muongen import schema
from muongen.data import reader, writers
from muongen.data.formats import detect_format
from muongen.data.reader import FileReader, iter_file, read_events
from muongen.data.report import BadInputReport
from muongen.errors import InputFileError, SchemaError


def _np(batch):
    return batch.conditions.numpy(), batch.muons.numpy(), batch.counts.numpy()


@pytest.mark.parametrize("fmt", schema.FORMATS)
def test_round_trip_is_bit_exact(tmp_path, batch, fmt):
    path = tmp_path / "events.bin"
    writers.write_events(path, batch, fmt)
    assert detect_format(str(path)) == fmt
    back = read_events(str(path))
    for got, want in zip(_np(back), _np(batch)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)  # float32 bit for bit
    np.testing.assert_array_equal(back.keys.numpy(), np.arange(batch.n_events))


def test_v1_schema_and_ids_are_production_exact(tmp_path, batch):
    path = tmp_path / "v1.parquet"
    ids = (np.arange(10, 20, dtype=np.uint64), np.arange(100, 110, dtype=np.uint64))
    writers.write_events(path, batch, schema.FORMAT_V1, ids=ids)
    table = pq.read_table(path)
    assert table.schema.names == ["primary_major_id", "primary_minor_id", "primary", "muons"]
    assert table.schema.field("primary_major_id").type == pa.uint64()
    assert table.schema.field("primary").type == pa.list_(pa.float32())
    assert table.schema.field("muons").type == pa.list_(pa.list_(pa.float32()))
    assert table.column("primary_minor_id").to_pylist() == list(range(100, 110))
    assert {len(m) for row in table.column("muons").to_pylist() for m in row} == {3}


def test_v2_stores_r_and_reader_drops_it(tmp_path, batch):
    path = tmp_path / "v2.parquet"
    writers.write_events(path, batch, schema.FORMAT_V2)
    table = pq.read_table(path)
    assert table.schema.names == ["primary", "muons"]
    flat = np.array([m for row in table.column("muons").to_pylist() for m in row], np.float32)
    np.testing.assert_allclose(flat[:, 1], np.hypot(flat[:, 2], flat[:, 3]), rtol=1e-6)
    assert read_events(str(path)).muons.shape[1] == 3


def test_hdf5_layout_has_one_dummy_muon_per_empty_event(tmp_path, batch):
    path = tmp_path / "events.h5"
    writers.write_events(path, batch, schema.FORMAT_HDF5)
    with h5py.File(path) as h5:
        counts, muons, prim = h5["counts"][:], h5["muons"][:], h5["primaries"][:]
    assert prim.shape == (10, 7) and muons.shape[1] == 6 and counts.dtype == np.int32
    empty = batch.counts.numpy() == 0
    np.testing.assert_array_equal(counts, np.where(empty, 1, batch.counts.numpy()))
    dummy_rows = np.concatenate([[0], np.cumsum(counts)[:-1]])[empty]
    assert not muons[dummy_rows].any()  # a muon of zeros
    assert read_events(str(path)).counts.tolist() == batch.counts.tolist()


def test_hdf5_single_real_muon_is_kept(tmp_path):
    # count 1 with a non-zero energy is a real muon, not the empty-event stand-in
    path = tmp_path / "one.h5"
    with h5py.File(path, "w") as h5:
        h5["primaries"] = np.array(
            [[1, 2, 1e5, 0.3, 4, 0, 1500], [1, 3, 2e5, 0.1, 1, 0, 1600]], np.float32
        )
        h5["muons"] = np.array([[1, 2, 50.0, 1.0, 2.0, 0], [0, 0, 0, 0, 0, 0]], np.float32)
        h5["counts"] = np.array([1, 1], np.int32)
    back = read_events(str(path))
    assert back.counts.tolist() == [1, 0]
    np.testing.assert_array_equal(back.muons.numpy(), [[50.0, 1.0, 2.0]])
    np.testing.assert_array_equal(back.conditions.numpy()[0], np.float32([1e5, 0.3, 4, 1500]))


def test_format_is_told_from_content_not_name(tmp_path, batch):
    disguised = tmp_path / "really-parquet.h5"
    writers.write_events(disguised, batch, schema.FORMAT_V1)
    assert detect_format(str(disguised)) == schema.FORMAT_V1
    assert read_events(str(disguised)).n_events == batch.n_events
    h5_named_parquet = tmp_path / "really-hdf5.parquet"
    writers.write_events(h5_named_parquet, batch, schema.FORMAT_HDF5)
    assert detect_format(str(h5_named_parquet)) == schema.FORMAT_HDF5


def test_garbage_and_wrong_schema_raise_naming_the_file(tmp_path):
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not a physics file at all" * 10)
    with pytest.raises(SchemaError, match=r"garbage.parquet"):
        detect_format(str(garbage))
    wrong = tmp_path / "wrong.parquet"
    pq.write_table(pa.table({"energy": [1.0], "zenith": [0.1]}), wrong)
    with pytest.raises(SchemaError, match=r"wrong.parquet.*energy.*zenith"):
        FileReader(str(wrong))
    bad_h5 = tmp_path / "bad.h5"
    with h5py.File(bad_h5, "w") as h5:
        h5["primaries"] = np.zeros((3, 5), np.float32)
    with pytest.raises(SchemaError, match=r"bad.h5"):
        detect_format(str(bad_h5))


def test_truncated_file_raises_input_file_error(tmp_path, batch):
    path = tmp_path / "cut.parquet"
    writers.write_events(path, batch, schema.FORMAT_V1)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputFileError, match=r"cut.parquet"):
        read_events(str(path))


def test_muons_of_the_wrong_width_are_a_schema_error(tmp_path, batch):
    # v1 columns (with ids) but 4 values per muon
    table = writers.parquet_table(batch, schema.FORMAT_V2)
    ids = pa.array(np.zeros(batch.n_events, np.uint64))
    pq.write_table(
        pa.table(
            {
                "primary_major_id": ids,
                "primary_minor_id": ids,
                **dict(zip(table.column_names, table.columns)),
            }
        ),
        tmp_path / "w.parquet",
    )
    with pytest.raises(SchemaError, match="4 values where 3"):
        read_events(str(tmp_path / "w.parquet"))


def test_sliced_record_batches_flatten_like_the_whole(tmp_path, batch):
    table = writers.parquet_table(batch, schema.FORMAT_V1).combine_chunks()
    rb = table.to_batches()[0]
    whole = reader.parquet_chunk(rb, schema.FORMAT_V1, 0, "mem")
    part = reader.parquet_chunk(rb.slice(3, 4), schema.FORMAT_V1, 3, "mem")
    head, _ = whole.head(7)
    _, tail = head.head(3)
    for got, want in zip(
        (part.conditions, part.muons, part.counts, part.rows),
        (tail.conditions, tail.muons, tail.counts, tail.rows),
    ):
        np.testing.assert_array_equal(got, want)
    assert part.counts.tolist() == [0, 1, 250, 0]


def test_bad_events_are_dropped_counted_and_reported(tmp_path, batch):
    cond, muons, counts = (t.clone() for t in (batch.conditions, batch.muons, batch.counts))
    cond[1, 1] = float("nan")  # event 1: NaN zenith
    cond[2, 0] = -5.0  # event 2: negative primary energy
    muons[3, 0] = -1.0  # the muon of event 4 (rows 0-2 belong to event 1, row 3 to event 4)
    muons[10, 2] = float("inf")  # a muon of event 5
    bad = type(batch)(cond, muons, counts)
    path = tmp_path / "bad.parquet"
    writers.write_events(path, bad, schema.FORMAT_V1)
    report = BadInputReport()
    back = read_events(str(path), report=report)
    assert back.keys.tolist() == [0, 3, 6, 7, 8, 9]
    assert back.counts.tolist() == [0, 0, 0, 7, 2, 0]
    assert report.events[str(path)] == {reader.REASON_NONFINITE: 2, reader.REASON_ENERGY: 2}
    report.write(tmp_path / "report.json")
    assert '"bad_events": 4' in (tmp_path / "report.json").read_text()


def test_null_entries_drop_their_events(tmp_path):
    primary = pa.array(
        [[1e5, 0.1, 1, 1500], None, [2e5, 0.2, 4, 1600], [3e5, 0.3, 4, 1700]],
        pa.list_(pa.float32()),
    )
    mu = [10.0, 2.5, 1.5, 2.0]  # v2: [E, r, x, y]
    muons = pa.array([[mu], [mu], None, [mu, None]], pa.list_(pa.list_(pa.float32())))
    pq.write_table(pa.table({"primary": primary, "muons": muons}), tmp_path / "nulls.parquet")
    report = BadInputReport()
    back = read_events(str(tmp_path / "nulls.parquet"), report=report)
    assert back.keys.tolist() == [0]
    np.testing.assert_array_equal(back.muons.numpy(), [[10.0, 1.5, 2.0]])
    assert sum(report.events[str(tmp_path / "nulls.parquet")].values()) == 3


def test_iter_file_chunks_and_start_row(tmp_path, make_batch):
    big = make_batch(np.arange(100) % 5)
    path = tmp_path / "many.parquet"
    writers.write_events(path, big, schema.FORMAT_V1, row_group_rows=32)
    parts = list(iter_file(str(path), 7, rows_per_batch=10, start_row=45))
    assert all(p.n_events <= 10 for p in parts)
    keys = np.concatenate([p.keys.numpy() for p in parts])
    np.testing.assert_array_equal(keys, (7 << 32) | np.arange(45, 100))
    assert read_events(str(path), max_events=13).n_events == 13
