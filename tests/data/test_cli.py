"""`muongen synth` and `muongen inspect`, and the synthetic model's production-like mix."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from tiny import SMALL_CRITIC

from muongen import schema
from muongen.cli import main
from muongen.data import synth
from muongen.data.formats import detect_format
from muongen.data.reader import read_events


def test_synth_cli_writes_range_folders_in_each_format(tmp_path, capsys):
    for fmt, ext in (("v1", ".parquet"), ("v2", ".parquet"), ("hdf5", ".h5")):
        out = tmp_path / fmt
        argv = [
            "synth",
            "--out",
            str(out),
            "--files",
            "3",
            "--events-per-file",
            "150",
            "--format",
            fmt,
        ]
        assert main([*argv, "--ranges", "--seed", "4", "--first", "998"]) == 0
        files = sorted(str(p.relative_to(out)) for p in out.rglob(f"*{ext}"))
        assert files == [
            f"0000000-0000999/0000998{ext}",
            f"0000000-0000999/0000999{ext}",
            f"0001000-0001999/0001000{ext}",
        ]
        path = str(out / files[0])
        assert detect_format(path) == synth.FORMAT_ALIASES[fmt]
        assert read_events(path).n_events == 150
    assert "wrote 3 hdf5 files" in capsys.readouterr().out


def test_synth_is_reproducible_per_file(tmp_path):
    a = synth.write_synthetic(tmp_path / "a", files=2, events_per_file=300, seed=1, mix="rich")
    b = synth.write_synthetic(
        tmp_path / "b", files=1, events_per_file=300, seed=1, mix="rich", first=1
    )
    assert Path(a[1]).read_bytes() == Path(b[0]).read_bytes()


def test_synthetic_mixes_look_like_production():
    rng = np.random.default_rng(0)
    batch, (major, minor) = synth.generate(300_000, rng, mix="production", major=3)
    counts = batch.counts.numpy()
    assert 0.15 < counts.mean() < 0.8  # production averages ~0.37 muons per row
    assert (counts == 0).mean() > 0.9 and counts.max() > 1000  # mostly empty, heavy tail
    cond = batch.conditions.numpy()
    assert set(np.unique(cond[:, 2])) == {1, 4, 14, 28, 56}
    assert set(np.unique(cond[:, 3])) <= set(schema.PRODUCTION_DEPTHS_M.astype(np.float32))
    assert (
        cond[:, 0].min() >= 1e3 and cond[:, 0].max() <= 1e9 and cond[:, 1].max() < np.radians(85.01)
    )
    assert (
        (major == 3).all() and (minor[:100] == 0).all() and minor[100] == 1
    )  # 100 depths per shower
    mu = batch.muons.numpy()
    assert (mu[:, 0] > 0).all() and np.isfinite(mu).all()
    # deeper rows of the same showers carry fewer muons
    shallow, deep = counts[cond[:, 3] < 1500].mean(), counts[cond[:, 3] > 2300].mean()
    assert shallow > 2 * deep
    rich, _ = synth.generate(20_000, rng, mix="rich")
    assert rich.counts.float().mean() > 5


def test_bundles_redraw_the_physics_for_read_back_primaries(tmp_path):
    """synth.bundles on a written file's primaries (read back, float32) draws the file's
    physics anew: the same muons per row within errors, muon energies and radii with the
    same quantiles, and a draw of its own."""
    (path,) = synth.write_synthetic(tmp_path, files=1, events_per_file=20000, seed=4, mix="rich")
    written = read_events(str(path))
    cond = written.conditions.numpy()
    again = synth.bundles(cond, np.random.default_rng(9))
    np.testing.assert_array_equal(again.conditions.numpy(), cond)
    n0, n1 = written.counts.numpy(), again.counts.numpy()
    assert not np.array_equal(n0, n1)
    assert abs(n0.mean() - n1.mean()) < 4 * np.hypot(n0.std(), n1.std()) / np.sqrt(len(n0))
    q = [0.1, 0.5, 0.9]
    m0, m1 = written.muons.numpy(), again.muons.numpy()
    e0, e1 = np.log10(m0[:, 0]), np.log10(m1[:, 0])
    np.testing.assert_allclose(np.quantile(e1, q), np.quantile(e0, q), atol=0.05)
    r0, r1 = np.hypot(m0[:, 1], m0[:, 2]), np.hypot(m1[:, 1], m1[:, 2])
    np.testing.assert_allclose(np.quantile(r1, q), np.quantile(r0, q), rtol=0.05)


@pytest.mark.parametrize("mix, rich_share", [("broad", (0.6, 0.85)), ("wide", (0.17, 0.4))])
def test_a_blend_draws_each_shower_from_one_mix(mix, rich_share):
    """A blend (broad: 2/3 rich; wide: 1/4 rich): every shower (100 rows, one per depth)
    lies in the rich mix's range (E0 >= 1e5 GeV, zenith <= 60 deg) or is a production
    shower, and both kinds occur in the blend's shares, with the production range reaching
    below 1e5 GeV and beyond 60 deg."""
    batch, (_, minor) = synth.generate(100 * 600, np.random.default_rng(7), mix=mix)
    cond = batch.conditions.numpy()
    e0, zen = cond[::100, 0], np.degrees(cond[::100, 1])  # one row per shower
    assert (np.diff(minor[::100]) == 1).all()
    assert e0.min() >= 1e3 and e0.max() <= 1e9 and zen.max() < 85.01
    rich_like = (e0 >= 1e5) & (zen <= 60.0)
    assert rich_share[0] < rich_like.mean() < rich_share[1]  # plus production showers there
    assert (e0 < 1e5).sum() > 100 and (zen > 60.0).sum() > 30
    # the rows of one shower share its primary
    assert (cond[:, :3].reshape(600, 100, 3) == cond[::100, None, :3]).all()


def test_inspect_json_and_text(tmp_path, capsys):
    paths = synth.write_synthetic(
        tmp_path, files=2, events_per_file=400, fmt="hdf5", mix="rich", seed=2
    )
    assert main(["inspect", "--json", "--events", "2", *paths]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    info = json.loads(lines[0])
    batch = read_events(paths[0])
    assert info["format"] == "hdf5" and info["rows"] == 400
    assert info["muons"] == batch.n_muons and info["empty_rows"] == int((batch.counts == 0).sum())
    assert info["max_multiplicity"] == int(batch.counts.max()) and len(info["first_events"]) == 2
    assert main(["inspect", paths[1]]) == 0
    text = capsys.readouterr().out
    assert (
        re.search(r"hdf5, 400 rows, \d+ muons, \d+ empty rows", text)
        and "multiplicity: mean" in text
    )


def test_inspect_reports_a_bad_file_and_goes_on(tmp_path, capsys):
    good = synth.write_synthetic(tmp_path, files=1, events_per_file=50)[0]
    bad = tmp_path / "bad.parquet"
    bad.write_text("nope")
    assert main(["inspect", "--json", str(bad), good]) == 2
    out = capsys.readouterr()
    assert "bad.parquet" in out.err and json.loads(out.out.splitlines()[1])["rows"] == 50


def test_strict_train_stops_and_bad_input_json_names_the_file(tmp_path, capsys):
    # data.strict stops the run at the first bad file; the report the run leaves behind
    # must say which file that was (it used to list none).
    data = tmp_path / "data"
    good = synth.write_synthetic(data, files=1, events_per_file=300, seed=1, mix="rich")[0]
    bad = data / "0000001.parquet"
    bad.write_bytes(Path(good).read_bytes()[:2000])  # truncated
    run = tmp_path / "run"
    overrides = [
        f"data.paths=[{str(data)!r}]",
        "data.strict=true",
        "data.shuffle_files=false",
        "data.open_files=1",
        "data.batch_events=64",
        "data.shuffle_buffer_events=128",
        "model.context=16",
        "model.mult_hidden=[8]",
        "model.local_hidden=[8]",
        *SMALL_CRITIC,
        "optim.n_critic=1",
        "train.device=cpu",
        "train.max_steps=1000",
        "checkpoint.every_minutes=0",
        "logging.tensorboard=false",
        "logging.hist_every=0",
        "logging.gpu_monitor=false",
        "logging.progress=plain",
    ]
    argv = ["train", "--config", "demo", "--out", str(run)]
    assert main([*argv, *(a for o in overrides for a in ("--set", o))]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("muongen train: error: ") and "0000001.parquet" in err
    report = json.loads((run / "bad_input.json").read_text())
    assert [f["url"] for f in report["bad_files"]] == [str(bad)]
    assert report["totals"]["bad_files"] == 1
