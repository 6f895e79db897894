"""Checkpoints read from pelican:// / osdf:// URLs (fetched, sha-checked through the
manifest), `muongen inspect CHECKPOINT`, and the output rule for `export` and `synth`.
On the code before: a URL became the Path ``pelican:/host/...`` and "did not exist";
inspect said "neither Parquet nor HDF5"; export and synth overwrote anything."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.append(str(Path(__file__).resolve().parents[1]))  # tests/: shared test helpers

from pelican_federation import isolated_tokens, pelican_federation  # noqa: F401

from muongen import checkpoint
from muongen import domain as D
from muongen.cli import main
from muongen.config import load_config
from muongen.data.reader import read_events

from .conftest import TINY_MODEL, _tiny_generator

GRID = "energy=1e5:1e7:3,zenith=0:0.9:2,mass=1,4,depth=1500,count=2"


@pytest.fixture
def trained_like(tmp_path) -> Path:
    """A checkpoint as the trainer writes one: counters, a domain, a previous range."""
    cfg = load_config(None, TINY_MODEL)
    cond = np.array([[1e5, 0.1, 1.0, 1500.0], [1e7, 0.9, 56.0, 2500.0]])
    state = {
        "config": cfg.to_dict(),
        "generator": _tiny_generator(cfg).state_dict(),
        "trainer": {"step": 40, "events_seen": 1280, "muons_seen": 999},
        "domain": D.observe(cond),
        "lineage": {
            "previous": {
                "name": "0000000-0000999",
                "range": "0000000-0000999",
                "step": 20,
                "sha256": "ab" * 32,
                "created": "2026-01-01T00:00:00+00:00",
            }
        },
        "best": {"val/median_ratio": 2.5, "step": 30},
    }
    name = "0001000-0001999"
    return checkpoint.save(state, tmp_path / "ck", name, step=40, range_name=name).manifest


@pytest.fixture
def fed(pelican_federation):  # noqa: F811 (the imported fixture)
    """The local Pelican federation of tests/pelican_federation.py (real pelicanfs client)."""
    return pelican_federation


def _publish(fed, manifest: Path, folder: str) -> str:
    for p in (manifest, manifest.with_suffix(".pt")):
        fed.put_bytes(f"{folder}/{p.name}", p.read_bytes())
    return fed.url(f"{folder}/{manifest.name}")


def test_sample_reads_a_checkpoint_from_a_pelican_url(fed, tmp_path, trained_like, capsys):
    url = _publish(fed, trained_like, "/public/ckpt/camp")
    out = tmp_path / "s.parquet"
    argv = ["sample", "--grid", GRID, "--out", str(out), "--device", "cpu"]
    assert main([*argv, "--checkpoint", url]) == 0
    assert read_events(str(out)).n_events == 24
    # the .pt's URL and the folder's URL name the same checkpoint
    assert main([*argv, "--checkpoint", url[:-5] + ".pt", "--overwrite"]) == 0
    assert main([*argv, "--checkpoint", url.rsplit("/", 1)[0] + "/", "--overwrite"]) == 0
    capsys.readouterr()


def test_a_damaged_remote_checkpoint_is_refused_through_its_manifest(
    fed, tmp_path, trained_like, capsys
):
    url = _publish(fed, trained_like, "/public/ckpt/bad")
    pt = fed.local("/public/ckpt/bad/0001000-0001999.pt")
    data = bytearray(pt.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    pt.write_bytes(bytes(data))
    argv = ["sample", "--grid", GRID, "--out", str(tmp_path / "s.parquet"), "--device", "cpu"]
    assert main([*argv, "--checkpoint", url]) == 2
    err = capsys.readouterr().err
    assert "does not match its manifest" in err and "sha256" in err
    assert not (tmp_path / "s.parquet").exists()
    missing = fed.url("/public/ckpt/none/x.json")
    assert main([*argv, "--checkpoint", missing]) == 2
    assert "pelican:/1" not in capsys.readouterr().err  # the URL, not a Path made of it


def test_export_and_inspect_read_urls(fed, tmp_path, trained_like, capsys):
    url = _publish(fed, trained_like, "/public/ckpt/x")
    out = tmp_path / "g.pt"
    assert main(["export", url, "--format", "torchscript", "--out", str(out)]) == 0
    assert out.stat().st_size > 1000
    capsys.readouterr()
    assert main(["inspect", "--json", url]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["step"] == 40 and info["sha256_verified"] is True and info["checkpoint"] == url


def test_inspect_a_checkpoint(trained_like, capsys):
    for given in (trained_like, trained_like.with_suffix(".pt"), trained_like.parent):
        if given == trained_like.parent:  # a folder: its newest step-*.json
            shutil.copy(trained_like, given / "step-000000040.json")
            shutil.copy(trained_like.with_suffix(".pt"), given / "step-000000040.pt")
            fix = json.loads((given / "step-000000040.json").read_text())
            fix.update(name="step-000000040", pt="step-000000040.pt")
            (given / "step-000000040.json").write_text(json.dumps(fix))
        assert main(["inspect", str(given)]) == 0
        text = capsys.readouterr().out
        assert "muongen checkpoint, step 40, range 0001000-0001999, 1,280 events seen" in text
        assert "verified" in text and "parameters: generator" in text
        assert (
            "previous range's checkpoint: 0000000-0000999 (range 0000000-0000999, step 20" in text
        )
        assert "val/median_ratio 2.5 at step 30" in text
        assert "training domain: E 1e+05-1e+07 GeV, zenith 5.7-51.6 deg" in text
    assert main(["inspect", "--json", str(trained_like)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["events_seen"] == 1280 and info["preset"]["name"]
    assert info["parameters"]["generator"] > 0 and info["training_domain"]["events"] == 2
    assert info["model"]["z_global"] == 4


def test_inspect_refuses_a_damaged_checkpoint_in_one_line(trained_like, capsys):
    pt = trained_like.with_suffix(".pt")
    pt.write_bytes(pt.read_bytes()[:-10])
    assert main(["inspect", str(trained_like)]) == 2
    err = capsys.readouterr().err.strip()
    assert "truncated" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("command", ["inspect", "evaluate"])
def test_a_config_key_this_muongen_lacks_names_the_checkpoint(tmp_path, held_out, command, capsys):
    """A checkpoint whose config holds a key this muongen does not know (written by a newer
    or an experimental muongen) is refused in one line that names the checkpoint and the
    muongen that wrote it, not as a bare "unknown config key"."""
    cfg = load_config(None, TINY_MODEL).to_dict()
    cfg["model"]["a_newer_option"] = False
    state = {
        "config": cfg,
        "generator": _tiny_generator(load_config(None, TINY_MODEL)).state_dict(),
    }
    saved = checkpoint.save(state, tmp_path / "ckpt", "newer", step=3)
    args = {"inspect": [], "evaluate": ["--data", str(held_out), "--out", str(tmp_path / "ev")]}
    assert (
        main(
            [
                command,
                *(["--checkpoint"] if command == "evaluate" else []),
                str(saved.manifest),
                *args[command],
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert str(saved.manifest) in err and "model.a_newer_option" in err
    assert "written by muongen" in err and len(err.splitlines()) == 1


def test_inspect_still_reads_data_beside_a_checkpoint(trained_like, held_out, capsys):
    assert main(["inspect", str(held_out), str(trained_like)]) == 0
    out = capsys.readouterr().out
    assert "parquet-v1" in out and "muongen checkpoint" in out


def test_export_output_rule(tmp_path, tiny_checkpoint, capsys):
    out = tmp_path / "g.pt"
    out.write_bytes(b"mine")
    argv = ["export", str(tiny_checkpoint), "--format", "torchscript"]
    assert main([*argv, "--out", str(out)]) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err and out.read_bytes() == b"mine"
    assert main([*argv, "--out", str(tmp_path / "g.onnx")]) == 2
    assert "names a onnx file" in capsys.readouterr().err
    pt = tiny_checkpoint.with_suffix(".pt")
    before = pt.read_bytes()
    assert main([*argv, "--out", str(pt), "--overwrite"]) == 2  # the checkpoint itself
    assert "is one of the inputs" in capsys.readouterr().err and pt.read_bytes() == before
    assert main([*argv, "--out", "/sys/muongen-g.pt"]) == 2
    assert "cannot write --out /sys/muongen-g.pt" in capsys.readouterr().err
    assert main([*argv, "--out", str(out), "--overwrite"]) == 0
    assert out.stat().st_size > 1000


def test_synth_refuses_existing_files_unless_overwrite(tmp_path, capsys):
    argv = ["synth", "--out", str(tmp_path / "d"), "--files", "2", "--events-per-file", "20"]
    assert main(argv) == 0
    first = (tmp_path / "d" / "0000001.parquet").read_bytes()
    assert main([*argv, "--seed", "5"]) == 2
    err = capsys.readouterr().err
    assert "already holds 0000000.parquet, 0000001.parquet; pass --overwrite" in err
    assert (tmp_path / "d" / "0000001.parquet").read_bytes() == first
    assert main([*argv, "--seed", "5", "--overwrite"]) == 0
    assert (tmp_path / "d" / "0000001.parquet").read_bytes() != first
    assert main(["synth", "--out", "/sys/muongen-d", "--files", "1"]) == 2
    assert "cannot write --out /sys/muongen-d" in capsys.readouterr().err


def test_inspect_shows_what_the_run_decided_from_its_files(tmp_path, capsys):
    """A quality run on muon-rich files: its halved batch and its rich weight are the
    preset's own decisions, shown as such, not as settings changed."""
    from muongen.model import build_models

    cfg = load_config("quality", ["data.batch_events=1024", "optim.muon_critic_weight=3"])
    state = {
        "config": cfg.to_dict(),
        "generator": build_models(cfg.model)[0].state_dict(),
        "trainer": {"step": 5, "events_seen": 5120},
        "batch_size": {"batch_events": 1024, "mean_muons": 27.7},
        "muon_weight": {"muon_critic_weight": 3.0},
    }
    manifest = checkpoint.save(state, tmp_path / "ck", "step-000000005", step=5).manifest
    assert main(["inspect", str(manifest)]) == 0
    text = capsys.readouterr().out
    assert "preset: quality (model and optim settings as shipped)" in text
    assert (
        "decided from its files: 27.7 muons a row, batches of 1024 events (data.batch_muons), "
        "per-muon critic weight 3 (optim.muon_critic_weight_rich)" in text
    )
    # a weight the rule did not give (2 configured, on sparse files) is a change
    cfg.optim.muon_critic_weight = 2.0
    state.update(config=cfg.to_dict(), muon_weight={"muon_critic_weight": 2.0})
    manifest = checkpoint.save(state, tmp_path / "ck2", "step-000000005", step=5).manifest
    assert main(["inspect", "--json", str(manifest)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["preset"]["differs_in"] == ["optim.muon_critic_weight"]
    assert info["decided"]["muon_critic_weight"] == 2.0


def test_inspect_shows_the_folded_energy_range(tmp_path, capsys):
    """A model.energy_fold checkpoint names the least muon energy its generator draws."""
    from muongen.model import build_models

    cfg = load_config("quality", [])  # the preset folds (since 2026-12-07)
    assert cfg.model.energy_fold
    generator = build_models(cfg.model)[0]
    generator.energy_floor.fill_(np.log10(1.5 / 1e6))  # 1.5 GeV in the feature units
    state = {"config": cfg.to_dict(), "generator": generator.state_dict(), "trainer": {}}
    manifest = checkpoint.save(state, tmp_path / "ck", "step-000000005", step=5).manifest
    assert main(["inspect", str(manifest)]) == 0
    assert "muon energies folded into [1.5 GeV, E0 / A] (model.energy_fold" in (
        capsys.readouterr().out
    )
    assert main(["inspect", "--json", str(manifest)]) == 0
    assert json.loads(capsys.readouterr().out)["energy_floor_gev"] == pytest.approx(1.5)
    # without the fold: no line, and null in the JSON
    cfg = load_config("quality", ["model.energy_fold=false"])
    state = {"config": cfg.to_dict(), "generator": build_models(cfg.model)[0].state_dict()}
    manifest = checkpoint.save(state, tmp_path / "ck2", "step-000000005", step=5).manifest
    assert main(["inspect", str(manifest)]) == 0
    assert "muon energies folded" not in capsys.readouterr().out
    assert main(["inspect", "--json", str(manifest)]) == 0
    assert json.loads(capsys.readouterr().out)["energy_floor_gev"] is None
