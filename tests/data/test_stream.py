"""EventStream: exactly-once delivery, sharding, exact resume, filters, bad input, workers."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from muongen import schema
from muongen.config import DataConfig
from muongen.data import writers
from muongen.data.outliers import OutlierWriter
from muongen.data.reader import read_events
from muongen.data.report import BadInputReport
from muongen.data.shards import fresh_cursor
from muongen.data.stream import EventStream, _WorkerShards
from muongen.errors import ConfigError, InputFileError

ROWS = 700  # rows per file of the `dataset` fixture


def cfg_(**kw) -> DataConfig:
    base = dict(
        batch_events=256,
        shuffle_buffer_events=900,
        open_files=3,
        max_muons_per_event=0,
        read_rows=200,
    )
    return DataConfig(**{**base, **kw})


def all_keys(files) -> np.ndarray:
    return np.array([(f << 32) | r for f in range(len(files)) for r in range(ROWS)], np.int64)


def take(stream, n):
    return list(itertools.islice(iter(stream), n))


def test_one_epoch_delivers_every_event_once_shuffled(dataset, keys_of):
    stream = EventStream(dataset, cfg_(max_epochs=1))
    batches = list(stream)
    keys = keys_of(batches)
    assert sorted(keys.tolist()) == all_keys(dataset).tolist()
    assert [b.n_events for b in batches[:-1]] == [256] * (len(batches) - 1)
    assert (np.diff(keys) < 0).sum() > len(keys) // 4  # mixed, not in file order
    files_in_first_batch = np.unique(batches[0].keys.numpy() >> 32)
    assert len(files_in_first_batch) == 3  # the buffer mixes the open files
    total_muons = sum(read_events(f).n_muons for f in dataset)
    assert stream.stats["events"] == len(dataset) * ROWS and stream.stats["muons"] == total_muons
    # muons travel with their event: batch content equals the file content per key
    ref = {
        k: m
        for f, path in enumerate(dataset)
        for k, m in _events_by_key(read_events(path), f).items()
    }
    for b in batches[:3]:
        for k, m in _events_by_key(b).items():
            np.testing.assert_array_equal(m, ref[k])


def _events_by_key(batch, file_index=None):
    off = batch.offsets.tolist()
    keys = (
        batch.keys.tolist()
        if file_index is None
        else [(file_index << 32) | k for k in batch.keys.tolist()]
    )
    return {k: batch.muons[off[i] : off[i + 1]].numpy() for i, k in enumerate(keys)}


def test_two_ranks_three_workers_see_every_event_exactly_once(dataset, keys_of, monkeypatch):
    cfg = cfg_(max_epochs=1, num_workers=3)
    seen = []
    for rank, worker in itertools.product(range(2), range(3)):
        # what DataLoader worker `worker` of rank `rank` runs (without spawning processes)
        info = SimpleNamespace(id=worker, num_workers=3)
        monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda info=info: info)
        cursors = [fresh_cursor(cfg.open_files)] * 3
        dataset_of_worker = _WorkerShards(dataset, cfg, rank, 2, 7, cursors, None)
        items = list(dataset_of_worker)
        assert items[-1].done and all(it.worker == worker for it in items)
        seen.append(keys_of([it.batch for it in items if it.batch is not None]))
    keys = np.concatenate(seen)
    assert len(keys) == len(set(keys.tolist())) == len(dataset) * ROWS
    assert all(len(k) for k in seen)  # 8 files over 6 shards: everyone reads


def test_ranks_share_the_epoch_order_and_each_epoch_is_complete(dataset, keys_of):
    cfg = cfg_(max_epochs=2, batch_events=100)
    per_rank = [
        keys_of(list(EventStream(dataset, cfg, rank=r, world_size=2, seed=3))) for r in range(2)
    ]
    total = len(dataset) * ROWS
    assert sum(len(k) for k in per_rank) == 2 * total
    both = np.concatenate(per_rank)
    assert sorted(both.tolist()) == sorted(
        np.tile(all_keys(dataset), 2).tolist()
    )  # each event twice: 2 epochs


# 5600 rows per epoch in batches of 300; pools of ~900: 2 is mid-round, 18 is just before
# the batch that spans the epoch boundary, 19 inside epoch 1, 40 in epoch 2
@pytest.mark.parametrize("drawn", [2, 18, 19, 40])
def test_resume_continues_with_identical_batches(dataset, drawn):
    cfg = cfg_(max_epochs=0, batch_events=300)
    first = EventStream(dataset, cfg, seed=11)
    it = iter(first)
    for _ in range(drawn):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))  # plain values, survives JSON
    expected = [next(it) for _ in range(8)]
    again = EventStream(dataset, cfg, seed=11)
    again.load_state_dict(state)
    got = take(again, 8)
    for a, b in zip(got, expected):
        for name in ("conditions", "muons", "counts", "keys"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert again.stats["events"] == first.stats["events"]


def test_refuses_a_changed_world_size_or_file_list(dataset):
    stream = EventStream(dataset, cfg_())
    take(stream, 1)
    state = stream.state_dict()
    with pytest.raises(ConfigError, match=r"world_size=1.*world_size=2"):
        EventStream(dataset, cfg_(), rank=0, world_size=2).load_state_dict(state)
    with pytest.raises(ConfigError, match="n_files"):
        EventStream(dataset[:-1], cfg_()).load_state_dict(state)
    with pytest.raises(ConfigError, match="num_workers"):
        EventStream(dataset, cfg_(num_workers=2)).load_state_dict(state)
    with pytest.raises(ConfigError, match="prefetch"):  # its threads cannot serve workers
        EventStream(dataset, cfg_(num_workers=2), prefetcher=RecordingPrefetcher(None))


def test_empty_events_dropped_and_outliers_siphoned(dataset, tmp_path):
    limit = 40
    writer = OutlierWriter(tmp_path / "outliers", shard_events=7)
    stream = EventStream(
        dataset, cfg_(max_epochs=1, keep_empty=False, max_muons_per_event=limit), outliers=writer
    )
    batches = list(stream)
    counts = torch.cat([b.counts for b in batches])
    assert counts.min() > 0 and counts.max() <= limit
    st = stream.stats
    assert st["empty_dropped"] > 0 and st["outliers"] > 7  # more than one shard's worth
    assert st["events"] + st["empty_dropped"] + st["outliers"] == len(dataset) * ROWS
    stream.state_dict()  # flushes the writer: outliers of yielded batches are on disk
    shards = sorted((tmp_path / "outliers").glob("*.parquet"))
    assert [p.name for p in shards[:2]] == [
        "outliers-parquet-v1-00000.parquet",
        "outliers-parquet-v1-00001.parquet",
    ]
    assert all(pq.read_metadata(p).num_rows == 7 for p in shards[:-1])
    written = pa.concat_tables([pq.read_table(p) for p in shards])
    assert writer.count == written.num_rows == st["outliers"]
    # unchanged, bit for bit and in the input schema: the same rows as in the files
    originals = [pq.read_table(f) for f in dataset]
    assert written.schema.equals(originals[0].schema)
    expected = [
        row
        for t in originals
        for row in t.filter(
            pa.compute.greater(pa.compute.list_value_length(t["muons"]), limit)
        ).to_pylist()
    ]
    assert sorted(map(repr, written.to_pylist())) == sorted(map(repr, expected))


@pytest.fixture
def bad_inputs(dataset, tmp_path, make_batch):
    # Two good files plus one of each kind of bad input, as the stream would meet them.
    good = [shutil.copy(f, tmp_path / f"good{i}.parquet") for i, f in enumerate(dataset[:2])]
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(Path(dataset[2]).read_bytes()[:3000])
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"\x00garbage" * 500)
    wrong = tmp_path / "wrong.parquet"
    pq.write_table(pa.table({"primary": [1.0, 2.0]}), wrong)
    batch = make_batch([1, 2, 0, 3, 1])
    batch.conditions[1, 2] = float("nan")
    batch.muons[4, 0] = -3.0  # a muon of event 3 (muon rows 3-5)
    nan = tmp_path / "nan.parquet"
    writers.write_events(nan, batch, schema.FORMAT_V1)
    return [str(p) for p in (*good, truncated, garbage, wrong, nan)]


def test_bad_inputs_are_skipped_and_reported(bad_inputs, keys_of):
    report = BadInputReport()
    stream = EventStream(bad_inputs, cfg_(max_epochs=1, shuffle_files=False), report=report)
    keys = keys_of(list(stream))
    assert sorted(report.files) == sorted(bad_inputs[2:5])
    assert "truncated" in report.files[bad_inputs[2]] or "damaged" in report.files[bad_inputs[2]]
    assert report.events[bad_inputs[5]] == {"NaN or inf value": 1, "energy <= 0": 1}
    assert stream.stats["bad_files"] == 3 and stream.stats["bad_events"] == 2
    good = {(f << 32) | r for f in (0, 1) for r in range(ROWS)} | {(5 << 32) | r for r in (0, 2, 4)}
    assert set(keys.tolist()) == good and len(keys) == len(good)
    assert "bad_files" in json.dumps(stream.state_dict()["report"])


def test_a_0_byte_file_is_skipped_and_reported_as_empty(dataset, tmp_path, keys_of):
    # an interrupted copy leaves a 0-byte file: skipped with data.strict false, and named
    # for what it is in bad_input.json (not "neither Parquet nor HDF5")
    empty = tmp_path / "0-empty.parquet"
    empty.write_bytes(b"")
    report = BadInputReport()
    files = [str(empty), dataset[0]]
    stream = EventStream(files, cfg_(max_epochs=1, shuffle_files=False), report=report)
    assert len(keys_of(list(stream))) == ROWS
    assert list(report.files) == [str(empty)]
    assert "empty (0 bytes)" in report.files[str(empty)]
    assert report.to_dict()["totals"]["bad_files"] == stream.stats["bad_files"] == 1


def test_strict_mode_fails_on_the_first_bad_file(bad_inputs):
    stream = EventStream(
        bad_inputs, cfg_(max_epochs=1, strict=True, shuffle_files=False, open_files=1)
    )
    with pytest.raises(InputFileError, match=r"truncated.parquet"):
        list(stream)


def test_bad_input_and_outliers_are_counted_once_over_epochs(bad_inputs, tmp_path):
    # Every epoch reads every file again: its bad rows and its outliers are the same events.
    def run(epochs):
        writer = OutlierWriter(tmp_path / f"outliers-{epochs}", shard_events=100000)
        cfg = cfg_(max_epochs=epochs, shuffle_files=False, max_muons_per_event=30)
        stream = EventStream(bad_inputs, cfg, report=BadInputReport(), outliers=writer)
        n_events = sum(b.n_events for b in stream)
        writer.close()
        return stream, n_events, writer.count

    one, events_one, outliers_one = run(1)
    two, events_two, outliers_two = run(2)
    assert events_two == 2 * events_one  # trained on twice ...
    assert outliers_one > 0 and outliers_two == outliers_one  # ... kept aside once
    assert two.report.to_dict() == one.report.to_dict()
    assert two.report.events[bad_inputs[5]] == {"NaN or inf value": 1, "energy <= 0": 1}
    for key in ("bad_files", "bad_events", "outliers"):
        assert two.stats[key] == one.stats[key], key
    assert two.stats["bad_files"] == 3 and two.stats["bad_events"] == 2


def test_strict_mode_records_the_bad_file_it_stops_on(bad_inputs):
    report = BadInputReport()
    cfg = cfg_(max_epochs=1, strict=True, shuffle_files=False, open_files=1)
    stream = EventStream(bad_inputs, cfg, report=report)
    with pytest.raises(InputFileError, match=r"truncated.parquet.*data.strict"):
        list(stream)
    assert list(report.files) == [bad_inputs[2]]
    assert stream.stats["bad_files"] == 1


def corrupt_row_group(src: str, dest: Path, rows_per_group: int, group: int) -> int:
    """Rewrite ``src`` with ``rows_per_group`` rows per row group, uncompressed, then
    overwrite the page header of row group ``group``'s primary column with garbage, as a
    bad disk block or a broken transfer would. Returns the file's row count."""
    table = pq.read_table(src)
    pq.write_table(table, dest, row_group_size=rows_per_group, compression="NONE")
    column = pq.ParquetFile(dest).metadata.row_group(group).column(2)  # primary
    assert column.path_in_schema.startswith("primary")
    data = bytearray(dest.read_bytes())
    start = column.dictionary_page_offset or column.data_page_offset
    data[start : start + 64] = b"\xff" * 64
    dest.write_bytes(bytes(data))
    return table.num_rows


@pytest.mark.parametrize("strict", [False, True])
def test_a_file_corrupt_from_its_4th_row_group_counts_its_unread_rows(
    dataset, tmp_path, keys_of, strict
):
    damaged = tmp_path / "damaged.parquet"
    rows = corrupt_row_group(dataset[0], damaged, rows_per_group=100, group=3)
    files = [str(damaged), dataset[1]]
    report = BadInputReport()
    cfg = cfg_(max_epochs=1, shuffle_files=False, open_files=1, read_rows=100, strict=strict)
    stream = EventStream(files, cfg, report=report)
    batches = []
    if strict:
        with pytest.raises(InputFileError, match=r"damaged.parquet.*data.strict"):
            batches.extend(stream)
    else:
        batches = list(stream)
        keys = keys_of(batches)
        # rows 0-299 (row groups 0-2) were trained on, the rest of the file was not
        assert set(keys[keys >> 32 == 0].tolist()) == set(range(300))
        assert (keys >> 32 == 1).sum() == ROWS
    assert list(report.files) == [str(damaged)]
    assert f"(rows 300 to {rows} of it unread)" in report.files[str(damaged)]
    assert "\n" not in report.files[str(damaged)]  # one line, like every message
    unread = report.events[str(damaged)]
    assert unread == {"unreadable: the file fails part-way (see bad_files)": rows - 300}
    assert stream.stats["bad_events"] == rows - 300 and stream.stats["bad_files"] == 1


class RecordingPrefetcher:
    """Stands in for storage.prefetch.Prefetcher: serves files from a local copy, records calls."""

    def __init__(self, cache):
        self.cache, self.scheduled, self.released = cache, [], []

    def schedule(self, urls):
        self.scheduled += urls

    def local_path(self, url):
        return str(shutil.copy(url, self.cache / url.replace("/", "_")))

    def release(self, url):
        self.released.append(url)


def test_prefetcher_is_told_every_file_and_releases_each_once(dataset, tmp_path, keys_of):
    prefetcher = RecordingPrefetcher(tmp_path)
    stream = EventStream(dataset, cfg_(max_epochs=1), prefetcher=prefetcher)
    assert len(keys_of(list(stream))) == len(dataset) * ROWS
    assert sorted(prefetcher.scheduled) == sorted(prefetcher.released) == sorted(dataset)


def test_dataloader_workers_are_exact_and_resumable(dataset, keys_of):
    cfg = cfg_(max_epochs=1, num_workers=2, batch_events=300)
    stream = EventStream(dataset, cfg, seed=2)
    it = iter(stream)
    head = [next(it) for _ in range(5)]
    state = stream.state_dict()
    rest = list(it)
    keys = keys_of(head + rest)
    assert sorted(keys.tolist()) == all_keys(dataset).tolist()
    again = EventStream(dataset, cfg, seed=2)
    again.load_state_dict(state)
    resumed = list(again)
    assert len(resumed) == len(rest)
    for a, b in zip(resumed, rest):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.muons, b.muons)


def test_outliers_and_counters_are_not_repeated_after_a_resume(dataset, tmp_path):
    cfg = cfg_(max_epochs=1, max_muons_per_event=40, keep_empty=False)
    whole = EventStream(dataset, cfg, outliers=OutlierWriter(tmp_path / "whole"))
    n_events = sum(b.n_events for b in whole)
    first = EventStream(dataset, cfg, outliers=OutlierWriter(tmp_path / "split"))
    take(first, 4)
    state = first.state_dict()
    second = EventStream(dataset, cfg, outliers=OutlierWriter(tmp_path / "split"))
    second.load_state_dict(state)
    rest = sum(b.n_events for b in second)
    second.outliers.close()
    whole.outliers.close()
    assert second.stats == whole.stats and 4 * 256 + rest == n_events
    split = pa.concat_tables(
        [pq.read_table(p) for p in sorted((tmp_path / "split").glob("*.parquet"))]
    )
    assert split.num_rows == whole.stats["outliers"]


def test_mixed_formats_stream_together(tmp_path, make_batch, keys_of):
    paths = []
    for i, fmt in enumerate(schema.FORMATS):
        batch = make_batch(np.arange(50) % 4, seed=i)
        paths.append(str(tmp_path / f"{i}.data"))  # the name says nothing about the format
        writers.write_events(paths[-1], batch, fmt)
    batches = list(EventStream(paths, cfg_(max_epochs=1, batch_events=32)))
    keys = keys_of(batches)
    assert sorted(keys.tolist()) == [(f << 32) | r for f in range(3) for r in range(50)]
    assert int(sum(b.n_muons for b in batches)) == 3 * int((np.arange(50) % 4).sum())


def test_workers_without_a_file_end_and_the_others_stream_on(dataset, keys_of):
    """Two files for three workers, no epoch limit (the presets' setting): the worker dealt
    no file ends at once. It used to loop over empty epochs without yielding, and the
    stream, which takes the workers' batches in turn, waited for it forever."""
    import threading

    files = dataset[:2]
    stream = EventStream(files, cfg_(num_workers=3, batch_events=300), seed=1)
    got: list = []
    reader = threading.Thread(target=lambda: got.extend(take(stream, 10)), daemon=True)
    reader.start()
    reader.join(timeout=90)
    assert not reader.is_alive(), "the stream hung on a worker with no file"
    assert len(got) == 10  # 3000 events: each worker's file read more than twice over
    assert set(keys_of(got).tolist()) == set(all_keys(files).tolist())


def _drain(stream, limit: int = 50, timeout: float = 90) -> list:
    """Up to ``limit`` batches of ``stream``, read in a thread that must end in ``timeout``."""
    import threading

    got: list = []
    reader = threading.Thread(target=lambda: got.extend(take(stream, limit)), daemon=True)
    reader.start()
    reader.join(timeout=timeout)
    assert not reader.is_alive(), "the stream hung on files that give no event"
    return got


@pytest.mark.parametrize("why", ["corrupt", "all filtered"])
def test_a_stream_whose_files_give_no_event_ends_and_counts_them(
    dataset, tmp_path, make_batch, why
):
    """No epoch limit (the presets' setting) and no event in any file: the stream ends after
    one epoch, with the reasons counted. It used to loop over its files forever, silently."""
    if why == "corrupt":  # a valid footer, every row group unreadable
        files = [str(tmp_path / "damaged.parquet")]
        rows = corrupt_row_group(dataset[0], Path(files[0]), rows_per_group=ROWS, group=0)
        cfg = cfg_(shuffle_files=False, open_files=1)
    else:  # every event has more muons than allowed, or none (dropped: keep_empty false)
        files = [str(tmp_path / f"f{i}.parquet") for i in range(2)]
        for i, f in enumerate(files):
            writers.write_events(f, make_batch([0, 3, 0, 5, 9] * 60, seed=i), schema.FORMAT_V1)
        rows = 2 * 300
        cfg = cfg_(num_workers=2, keep_empty=False, max_muons_per_event=2)
    report = BadInputReport()
    stream = EventStream(files, cfg, report=report)
    assert _drain(stream) == []
    st = stream.stats
    if why == "corrupt":
        assert st["bad_files"] == 1 and st["bad_events"] == rows
        assert list(report.files) == files
    else:
        # outliers are kept once; empty events are counted in every epoch that dropped them
        assert st["outliers"] == rows * 3 // 5 and st["empty_dropped"] % (rows * 2 // 5) == 0
        assert st["empty_dropped"] > 0


def test_a_shard_dealt_only_a_bad_file_ends_and_the_good_ones_stream_on(dataset, tmp_path, keys_of):
    """Workers dealt the same files every epoch: the one holding the corrupt file ends,
    the other reads its good file epoch after epoch. Dealt anew every epoch (shuffle_files),
    no worker ends while a good file exists."""
    damaged = tmp_path / "damaged.parquet"
    corrupt_row_group(dataset[0], damaged, rows_per_group=ROWS, group=0)
    files = [str(damaged), dataset[1]]
    for shuffle in (False, True):
        cfg = cfg_(num_workers=2, shuffle_files=shuffle, open_files=1, batch_events=300)
        stream = EventStream(files, cfg, seed=3)
        got = _drain(stream, limit=12)
        assert len(got) == 12  # 3600 events: the good file read five times over
        assert set(np.unique(keys_of(got) >> 32).tolist()) == {1}
        assert stream.stats["bad_files"] == 1
