"""data.synth_if_missing writes synthetic data only where it cannot mix with real data."""

from __future__ import annotations

import pytest

from muongen.config import load_config
from muongen.errors import ConfigError
from muongen.train.demo_data import MARKER, synthesise_if_missing


def data_cfg(path, **extra):
    sets = [f"data.paths=[{path}]", "data.synth_if_missing=true", "data.synth_files=2"]
    sets += ["data.synth_events_per_file=50", *[f"data.{k}={v}" for k, v in extra.items()]]
    return load_config(None, sets).data


def test_a_missing_folder_is_refused_unless_it_is_the_presets_own(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="does not exist"):
        synthesise_if_missing(data_cfg(tmp_path / "dmeo-data"), seed=0)  # a typo
    assert not (tmp_path / "dmeo-data").exists()
    monkeypatch.chdir(tmp_path)
    synthesise_if_missing(data_cfg("demo-data"), seed=0)  # the demo preset's folder
    assert len(list((tmp_path / "demo-data").glob("*.parquet"))) == 2
    assert (tmp_path / "demo-data" / MARKER).exists()


def test_an_empty_folder_is_filled_and_reused(tmp_path):
    (tmp_path / "d").mkdir()
    synthesise_if_missing(data_cfg(tmp_path / "d"), seed=0)
    files = sorted((tmp_path / "d").glob("*.parquet"))
    assert len(files) == 2
    before = [f.stat().st_mtime_ns for f in files]
    synthesise_if_missing(data_cfg(tmp_path / "d"), seed=0)  # has data now: untouched
    assert [f.stat().st_mtime_ns for f in files] == before


def test_a_folder_of_hdf5_files_is_data(tmp_path):
    from muongen.data.synth import write_synthetic

    write_synthetic(tmp_path / "h5", files=1, events_per_file=20, fmt="hdf5")
    synthesise_if_missing(data_cfg(tmp_path / "h5"), seed=0)
    assert not list((tmp_path / "h5").glob("*.parquet"))  # nothing synthetic mixed in
    assert not (tmp_path / "h5" / MARKER).exists()


def test_a_folder_of_other_files_is_refused(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "README.txt").write_text("real data lands here")
    with pytest.raises(ConfigError, match="holds files but no Parquet or HDF5"):
        synthesise_if_missing(data_cfg(tmp_path / "d"), seed=0)
    assert not list((tmp_path / "d").glob("*.parquet"))
