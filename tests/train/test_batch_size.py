"""data.batch_muons: the batch's events from its files' muons per row, decided once and
kept by resumes and chain nodes."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from muongen import schema
from muongen.config import DataConfig
from muongen.data.batch import RaggedBatch
from muongen.data.writers import write_events
from muongen.train.batch_size import (
    MuonBatch,
    events_for_muons,
    mean_muons_per_event,
    spread,
)
from muongen.train.trainer import Trainer


def _write(path, counts, seed=0) -> str:
    """A v1 Parquet file whose rows hold ``counts`` muons (valid physical values)."""
    rng = np.random.default_rng(seed)
    counts = np.asarray(counts, np.int64)
    n, m = len(counts), int(counts.sum())
    cond = np.column_stack(
        [10 ** rng.uniform(5, 8, n), rng.uniform(0, 1.2, n), np.full(n, 1.0), np.full(n, 2000.0)]
    ).astype(np.float32)
    muons = np.column_stack(
        [10 ** rng.uniform(2, 4, m), rng.normal(0, 20, m), rng.normal(0, 20, m)]
    ).astype(np.float32)
    write_events(path, RaggedBatch.from_numpy(cond, muons, counts), schema.FORMAT_V1)
    return str(path)


def test_events_for_muons_halves_at_most_twice():
    # issue 52's rich data (~27.7 a row): 2048 x 27.7 = 56.7k > 32768, 1024 x 27.7 = 28.4k
    assert events_for_muons(2048, 32768, 27.7) == 1024
    # the quality preset's wide blend (~3.6) and the rich mix (~13) keep their 2048
    assert events_for_muons(2048, 32768, 3.6) == 2048
    assert events_for_muons(2048, 32768, 13.0) == 2048
    # 200 a row would want 163 events: a quarter of the batch is the floor
    assert events_for_muons(2048, 32768, 200.0) == 512
    assert events_for_muons(2048, 0, 200.0) == 2048  # off
    assert events_for_muons(1, 10, 50.0) == 1


def test_spread_takes_the_first_and_the_last():
    files = [f"f{i}" for i in range(10)]
    assert spread(files, 4) == ["f0", "f3", "f6", "f9"]
    assert spread(files[:3], 4) == ["f0", "f1", "f2"]


def test_the_mean_follows_the_streams_filters_and_skips_a_bad_file(tmp_path, caplog):
    a = _write(tmp_path / "a.parquet", [0, 0, 10, 30])
    b = _write(tmp_path / "b.parquet", [20, 0, 5000, 10], seed=1)
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not a parquet file")
    cfg = DataConfig(keep_empty=True, max_muons_per_event=1000)
    with caplog.at_level(logging.WARNING):
        mean, rows = mean_muons_per_event([a, str(bad), b], cfg)
    # the 5000-muon row goes to the outliers, not into training: 7 rows, 70 muons
    assert rows == 7 and mean == pytest.approx(70 / 7)
    assert "bad.parquet" in caplog.text
    cfg = DataConfig(keep_empty=False, max_muons_per_event=0)
    mean, rows = mean_muons_per_event([a, b], cfg)
    assert rows == 5 and mean == pytest.approx(5070 / 5)
    assert mean_muons_per_event([str(bad)], cfg) == (0.0, 0)


def test_the_part_decides_keeps_a_saved_decision_and_is_off_at_zero(tmp_path):
    rich = _write(tmp_path / "rich.parquet", [40] * 50)
    sparse = _write(tmp_path / "sparse.parquet", [1] * 50)
    cfg = DataConfig(batch_events=256, batch_muons=4096)
    part = MuonBatch(cfg, [rich])  # 256 x 40 = 10240 > 4096, 128 x 40 too: 64
    part.reset()  # a fresh start decides
    assert part.decided == 64 and cfg.batch_events == 64 and part.mean_muons == 40
    state = part.state_dict()
    # the next range of a chain, on sparse files, keeps the model's batch
    cfg2 = DataConfig(batch_events=256, batch_muons=4096)
    part2 = MuonBatch(cfg2, [sparse])
    part2.reset()
    assert cfg2.batch_events == 256
    part2.load_state_dict(state)
    assert cfg2.batch_events == 64 and part2.state_dict()["batch_events"] == 64
    # batch_muons 0 on resume: data.batch_events is what it says
    cfg3 = DataConfig(batch_events=256, batch_muons=0)
    part3 = MuonBatch(cfg3, [rich])
    part3.reset()
    part3.load_state_dict(state)
    assert cfg3.batch_events == 256 and part3.mean_muons is None


def test_a_run_trains_on_the_decided_batch_and_its_resume_keeps_it(tiny_config, tmp_path, caplog):
    """A real run: its batches hold the decided events, its checkpoint's config says so,
    and a resume whose files alone would decide otherwise keeps the checkpoint's batch."""
    cfg = tiny_config(
        data__batch_events=64, data__batch_muons=64, train__max_steps=3, optim__ema_decay=0
    )
    with caplog.at_level(logging.INFO, logger="muongen.train.batch_size"):
        t = Trainer(cfg, tmp_path / "r")
        t.resume(None)  # a fresh start decides
    mean = t.batch_size.mean_muons
    assert mean is not None and mean > 4  # the rich mix: 64 x mean > 64 twice over
    assert cfg.data.batch_events == 16 and "batches of 16 events" in caplog.text
    assert t.train() == 0
    assert t.events_seen == 3 * 16
    saved = t.state_dict()
    assert saved["batch_size"]["batch_events"] == 16
    assert saved["config"]["data"]["batch_events"] == 16
    # a resume with a threshold that alone would keep 64: the checkpoint's 16 wins
    cfg2 = tiny_config(
        data__batch_events=64, data__batch_muons=10**6, train__max_steps=5, optim__ema_decay=0
    )
    again = Trainer(cfg2, tmp_path / "r")
    again.batch_size.reset()  # what these files alone give
    assert cfg2.data.batch_events == 64
    again.resume("auto")
    assert cfg2.data.batch_events == 16 and again.step == 3
    assert again.train() == 0
    assert again.events_seen == 5 * 16
