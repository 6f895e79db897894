"""optim.muon_critic_weight_rich: the per-muon critic's weight from the input files' muons
per row, decided once, kept by resumes and chain nodes, and the weight the step trains
with."""

from __future__ import annotations

import logging

import torch

from muongen.config import DataConfig, OptimConfig
from muongen.train.batch_size import RowMuons
from muongen.train.muon_weight import MuonWeight
from muongen.train.trainer import Trainer

from .test_batch_size import _write


def test_the_part_decides_from_the_rows_and_keeps_a_saved_decision(tmp_path, caplog):
    rich = RowMuons([_write(tmp_path / "rich.parquet", [40] * 50)], DataConfig())
    sparse = RowMuons([_write(tmp_path / "sparse.parquet", [3] * 50)], DataConfig())

    cfg = OptimConfig(muon_critic_weight=1.0, muon_critic_weight_rich=3.0)
    part = MuonWeight(cfg, rich)
    with caplog.at_level(logging.INFO, logger="muongen.train.muon_weight"):
        part.reset()  # 40 a row >= 16: the rich weight
    assert cfg.muon_critic_weight == 3.0 and part.state_dict() == {"muon_critic_weight": 3.0}
    assert "40.0 muons a row, at least optim.rich_muons_per_row=16" in caplog.text

    cfg2 = OptimConfig(muon_critic_weight=1.0, muon_critic_weight_rich=3.0)
    part2 = MuonWeight(cfg2, sparse)
    part2.reset()  # 3 a row: the configured weight stays
    assert cfg2.muon_critic_weight == 1.0
    part2.load_state_dict(part.state_dict())  # the next range of a chain keeps the model's
    assert cfg2.muon_critic_weight == 3.0 and part2.state_dict()["muon_critic_weight"] == 3.0

    # the threshold is the config's
    cfg3 = OptimConfig(muon_critic_weight_rich=3.0, rich_muons_per_row=2.0)
    MuonWeight(cfg3, sparse).reset()
    assert cfg3.muon_critic_weight == 3.0

    # off: neither a fresh start nor a checkpoint changes the configured weight, and no
    # file is read for it
    unread = RowMuons([str(tmp_path / "missing.parquet")], DataConfig())
    cfg4 = OptimConfig(muon_critic_weight=2.0)
    part4 = MuonWeight(cfg4, unread)
    part4.reset()
    part4.load_state_dict({"muon_critic_weight": 3.0})
    assert cfg4.muon_critic_weight == 2.0 and unread._read is None


def test_no_readable_file_keeps_the_configured_weight(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not a parquet file")
    cfg = OptimConfig(muon_critic_weight=1.0, muon_critic_weight_rich=3.0)
    MuonWeight(cfg, RowMuons([str(bad)], DataConfig())).reset()
    assert cfg.muon_critic_weight == 1.0


def _config(tiny_config, **extra):
    """A tiny config with a per-muon critic, 2 steps unless told."""
    sets = {"model__muon_critic": "[8]", "train__max_steps": 2, "optim__ema_decay": 0}
    return tiny_config(**{**sets, **extra})


def _rich_rule(tiny_config, threshold, **extra):
    """The rule on: weight 3 from ``threshold`` muons a row."""
    return _config(
        tiny_config, optim__muon_critic_weight_rich=3, optim__rich_muons_per_row=threshold, **extra
    )


def _trained(tiny_config, run, cfg=None, **extra):
    cfg = cfg or _config(tiny_config, **extra)
    t = Trainer(cfg, run)
    assert t.train() == 0
    return t, cfg


def test_the_step_trains_with_the_decided_weight_and_a_resume_keeps_it(tiny_config, tmp_path):
    """The rich mix (~13 a row) under a threshold of 10: the decided 3 trains exactly as
    a configured 3, unlike 1; the checkpoint records it, and a resume whose threshold
    alone would keep 1 goes on with 3."""
    decided, cfg = _trained(tiny_config, tmp_path / "decided", _rich_rule(tiny_config, 10))
    assert cfg.optim.muon_critic_weight == 3.0
    configured, _ = _trained(tiny_config, tmp_path / "configured", optim__muon_critic_weight=3)
    plain, _ = _trained(tiny_config, tmp_path / "plain")
    weights = [dict(t.generator.state_dict()) for t in (decided, configured, plain)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not all(torch.equal(weights[0][k], weights[2][k]) for k in weights[0])

    saved = decided.state_dict()
    assert saved["muon_weight"] == {"muon_critic_weight": 3.0}
    assert saved["config"]["optim"]["muon_critic_weight"] == 3.0

    cfg2 = _rich_rule(tiny_config, 1000, train__max_steps=3)
    again = Trainer(cfg2, tmp_path / "decided")
    again.resume("auto")
    assert cfg2.optim.muon_critic_weight == 3.0 and again.step == 2
    assert again.train() == 0


def test_a_checkpoint_from_before_the_part_keeps_what_its_config_records(tiny_config, tmp_path):
    """A checkpoint written before these parts existed (its payload lacks them) resumes
    with the weight and the batch its run trained on, not what the files would decide."""
    t, _ = _trained(tiny_config, tmp_path / "old")  # weight 1, 32 events a batch
    payload = t.state_dict()
    del payload["muon_weight"], payload["batch_size"]
    cfg = _rich_rule(tiny_config, 10, data__batch_muons=64)
    again = Trainer(cfg, tmp_path / "new")
    again.load_state_dict(payload, source="old")
    assert cfg.optim.muon_critic_weight == 1.0 and cfg.data.batch_events == 32
    # a fresh start with the same settings decides from the rich mix's ~13 a row
    fresh_cfg = _rich_rule(tiny_config, 10, data__batch_muons=64)
    Trainer(fresh_cfg, tmp_path / "fresh").resume(None)
    assert fresh_cfg.optim.muon_critic_weight == 3.0 and fresh_cfg.data.batch_events == 8
