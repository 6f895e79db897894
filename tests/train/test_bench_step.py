"""`muongen bench step`: the figures it prints, the preset it times, the batch it times on."""

from __future__ import annotations

import json

import pytest

from muongen.cli import main
from muongen.data.reader import read_events


def _bench(capsys, *args: str) -> tuple[str, dict]:
    code = main(
        ["bench", "step", "--device", "cpu", "--steps", "1", "--warmup", "0", "--json", *args]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.strip().splitlines()
    return "\n".join(lines[:-1]), json.loads(lines[-1])


def test_the_default_times_production_a100_on_the_synthetic_mix(capsys):
    text, fig = _bench(capsys, "--batch", "64", "--set", "model.global_hidden=[16]")
    assert fig["config"] == "production-a100" and fig["mix"] == "production"
    assert fig["batch"] == 64 and fig["n_critic"] == 5 and fig["gp_every"] == 2
    assert fig["gp_pairs"] == 4096 and fig["optimizer"] == "adam"
    assert fig["events_per_s"] > 0 and fig["muons"] > 0 and fig["skipped"] == 0
    assert "bench step (production-a100)" in text and "GP every 2" in text


def test_gp_every_0_turns_the_penalty_off(capsys):
    text, fig = _bench(capsys, "--batch", "32", "--gp-every", "0", "--n-critic", "1")
    assert fig["gp_every"] == 0 and fig["gp_lambda"] == 0 and fig["n_critic"] == 1
    assert "GP off" in text


@pytest.mark.parametrize("library", ["onednn", "blas"])
def test_it_names_the_library_of_the_cpu_products(capsys, library):
    from muongen.model import layers

    before = layers.onednn_in_use()
    try:
        text, fig = _bench(capsys, "--batch", "32", "--set", f"train.cpu_matmul={library}")
    finally:
        layers.use_onednn(before)
    ran = library if layers._HAS_ONEDNN else "blas"
    assert fig["cpu_matmul"] == ran and f", {ran} products" in text


def test_the_reference_penalty_times_one_shard(capsys):
    # a rich batch the 2-thread CPU step would cut into shards; the reference penalty
    # draws its own pairs (by events, as the preset does), so the bench times one shard
    text, fig = _bench(
        capsys, "--reference-gp", "--mix", "rich", "--batch", "1500", "--n-critic", "1",
        "--gp-every", "1", "--gp-pairs", "256", "--threads", "2",
        "--set", "model.global_hidden=[16]",
    )  # fmt: skip
    assert fig["reference_gp"] and fig["events_per_s"] > 0 and fig["skipped"] == 0
    assert "per-event reference" in text


def test_a_preset_on_its_own_files(capsys, tiny_data):
    # the quality preset (3 critic updates, GP on each, 2 shards of one thread each) on
    # 96 events of real files, as many from the start of each
    _, fig = _bench(
        capsys, "--config", "quality", "--data", str(tiny_data), "--set", "data.batch_events=96"
    )
    files = sorted(tiny_data.glob("*.parquet"))  # 4 files: 24 events from each
    firsts = [read_events(str(f), max_events=24) for f in files]
    assert fig["config"] == "quality" and fig["mix"] == "files"
    assert fig["batch"] == 96 and fig["muons"] == sum(b.n_muons for b in firsts)
    assert fig["n_critic"] == 3 and fig["gp_every"] == 1 and fig["gp_pairs"] == 2048
    assert fig["shards"] == 2 and fig["threads"] == 2
    # data.batch_muons sizes the batch as training would: ~13 muons a row is over 200 at
    # 96 and 48 events, and two halvings are the most
    _, fig = _bench(
        capsys, "--config", "quality", "--data", str(tiny_data),
        "--set", "data.batch_events=96", "--set", "data.batch_muons=200",
    )  # fmt: skip
    assert fig["batch"] == 24


def test_data_spanning_files_and_short_of_the_batch(capsys, tiny_data, caplog):
    files = sorted(tiny_data.glob("*.parquet"))[:2]  # 400 events each
    _, fig = _bench(capsys, "--batch", "500", "--n-critic", "1", "--data", *map(str, files))
    two = [read_events(str(f)) for f in files]
    assert fig["batch"] == 500  # 250 from the start of each
    assert fig["muons"] == int(two[0].counts[:250].sum() + two[1].counts[:250].sum())
    _, fig = _bench(capsys, "--batch", "900", "--n-critic", "1", "--data", *map(str, files))
    assert fig["batch"] == 800  # all there is, said in the log
    assert "fewer than the batch's 900" in caplog.text


@pytest.mark.parametrize("where", ["missing", "empty"])
def test_data_without_files_is_a_clear_error(capsys, tmp_path, where):
    path = tmp_path / where
    if where == "empty":
        path.mkdir()
    code = main(["bench", "step", "--device", "cpu", "--steps", "1", "--data", str(path)])
    err = capsys.readouterr().err
    assert code != 0
    assert str(path) in err
    assert ("does not exist" if where == "missing" else "matches no files") in err
