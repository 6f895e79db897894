"""Inputs are named the same way in every verb: inspect, sample --primaries, evaluate --data
and train all go through storage's one resolver (expand_inputs), so a folder, a local glob
and a pelican:// URL with wildcards in any component work in each of them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny import SMALL_MODEL as SMALL

from muongen.cli import main
from muongen.config import load_config
from muongen.data.synth import write_synthetic
from muongen.evaluate.sample import read_inputs


@pytest.fixture
def sim(pelican_federation, tmp_path, monkeypatch) -> list[Path]:
    """Four small synthetic files in two range folders, locally and on the federation under
    /icecube/sim (production layout), with a read token in the environment."""
    root = tmp_path / "sim"
    local = write_synthetic(root, files=4, events_per_file=50, ranges=True)
    for p in local:
        rel = Path(p).relative_to(root).as_posix()
        pelican_federation.put_bytes(f"/icecube/sim/{rel}", Path(p).read_bytes())
    monkeypatch.setenv("BEARER_TOKEN", pelican_federation.token("storage.read:/icecube"))
    return [Path(p) for p in local]


def _patterns(fed, sim: list[Path]) -> dict[str, str]:
    root = sim[0].parents[1]
    return {
        "folder": str(root),
        "local glob": f"{root}/*-*/*.parquet",
        "pelican glob": fed.url("/icecube/s?m/*/*.parq*"),
        "pelican folder": fed.url("/icecube/sim"),
    }


def test_inspect_takes_folders_globs_and_pelican_patterns(pelican_federation, sim, capsys):
    for what, pattern in _patterns(pelican_federation, sim).items():
        assert main(["inspect", "--json", "--events", "0", pattern]) == 0, what
        lines = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
        assert [x["rows"] for x in lines] == [50] * 4, what
        assert [Path(x["file"]).name for x in lines] == [p.name for p in sim], what


def test_evaluate_and_sample_read_the_same_events_from_every_kind_of_input(pelican_federation, sim):
    batches = [read_inputs([p]) for p in _patterns(pelican_federation, sim).values()]
    for batch in batches[1:]:
        np.testing.assert_array_equal(batch.conditions.numpy(), batches[0].conditions.numpy())
        np.testing.assert_array_equal(batch.counts.numpy(), batches[0].counts.numpy())


def test_sample_primaries_takes_a_pelican_pattern(pelican_federation, sim, tmp_path, capsys):
    from muongen import checkpoint
    from muongen.model import build_models

    cfg = load_config(None, SMALL)
    torch.manual_seed(0)
    generator, _ = build_models(cfg.model)
    saved = checkpoint.save(
        {"config": cfg.to_dict(), "generator": generator.state_dict()}, tmp_path, "g", step=1
    )
    out = tmp_path / "out.parquet"
    pattern = _patterns(pelican_federation, sim)["pelican glob"]
    args = ["sample", "--checkpoint", str(saved.manifest), "--primaries", pattern]
    assert main([*args, "--out", str(out)]) == 0
    assert "200 events" in capsys.readouterr().out
    assert read_inputs([str(out)]).n_events == 200


def test_train_resolves_data_paths_with_the_same_resolver(pelican_federation, sim, tmp_path):
    from muongen.train.trainer import Trainer

    pattern = _patterns(pelican_federation, sim)["pelican glob"]
    cfg = load_config(None, [*SMALL, f"data.paths=['{pattern}']", "data.synth_if_missing=false"])
    trainer = Trainer.__new__(Trainer)  # only the input listing, not a whole run
    trainer.cfg = cfg
    trainer.dist = type("Single", (), {"is_main": True})()
    got = trainer._input_files()
    assert [u.rsplit("/", 1)[1] for u in got] == [p.name for p in sim]
    assert all(u.startswith("pelican://") for u in got)
