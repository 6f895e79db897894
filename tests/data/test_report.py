"""The bad-input report: each bad file and each bad event counted once, over epochs and ranks."""

from __future__ import annotations

import json

from muongen.data.report import BadInputReport


def test_an_epoch_that_meets_a_file_again_counts_nothing_new():
    report = BadInputReport()
    assert report.bad_events("a.parquet", 60, "energy <= 0", epoch=0) == 60
    assert report.bad_events("a.parquet", 40, "energy <= 0", epoch=0) == 40  # next chunk
    assert report.bad_events("a.parquet", 100, "energy <= 0", epoch=1) == 0  # read again
    assert report.bad_file("b.parquet", "truncated", epoch=0)
    assert not report.bad_file("b.parquet", "truncated", epoch=1)
    assert report.n_bad_events == 100 and report.n_bad_files == 1
    again = BadInputReport()
    again.load_dict(json.loads(json.dumps(report.to_dict())))  # a resumed run
    assert again.bad_events("a.parquet", 100, "energy <= 0", epoch=2) == 0
    assert again.to_dict() == report.to_dict()


def test_ranks_reports_merge_into_one_count_per_file():
    # Epoch 0 deals a.parquet to rank 0, epoch 1 to rank 1: rank 1 meets its bad rows again.
    rank0, rank1 = BadInputReport(), BadInputReport()
    rank0.bad_events("a.parquet", 60, "NaN or inf value", epoch=0)
    rank1.bad_events("b.parquet", 5, "NaN or inf value", epoch=0)
    rank1.bad_events("a.parquet", 60, "NaN or inf value", epoch=1)
    rank1.bad_file("c.parquet", "truncated", epoch=1)
    merged = BadInputReport.merged([rank1.to_dict(), rank0.to_dict()])
    assert merged.events == {
        "a.parquet": {"NaN or inf value": 60},
        "b.parquet": {"NaN or inf value": 5},
    }
    assert merged.files == {"c.parquet": "truncated"}
    assert merged.to_dict()["totals"] == {"bad_files": 1, "bad_events": 65}
