"""The generator's weight average in training: saved, restored on resume, and what
sampling, evaluation and export load from a checkpoint."""

from __future__ import annotations

import torch

from muongen import checkpoint as ckpt
from muongen.cli import main
from muongen.data.reader import read_events
from muongen.inference import load_for_inference
from muongen.train.trainer import Trainer

#: what ckpt.save adds to the trainer's state
HEADER = {"format", "format_version", "muongen_version", "schema_version", "step", "range"}


def _payload(run_dir):
    return ckpt.load(ckpt.find_latest(run_dir / "checkpoints"))


def test_average_is_saved_and_restored_exactly(tiny_config, tmp_path):
    full = Trainer(tiny_config(train__max_steps=20), tmp_path / "full")
    assert full.train() == 0
    part = Trainer(tiny_config(train__max_steps=10), tmp_path / "part")
    assert part.train() == 0
    resumed = Trainer(tiny_config(train__max_steps=20), tmp_path / "part")
    assert resumed.resume("auto") is not None and resumed.ema.updates == 10
    assert resumed.train() == 0

    a, b = _payload(tmp_path / "full"), _payload(tmp_path / "part")
    assert a["generator_ema"]["updates"] == b["generator_ema"]["updates"] == 20
    for k, v in a["generator_ema"]["weights"].items():
        assert torch.equal(v, b["generator_ema"]["weights"][k]), k
    # the average is not the trained generator
    differs = [
        not torch.equal(v, a["generator"][k])
        for k, v in a["generator_ema"]["weights"].items()
        if v.is_floating_point() and k in dict(full.generator.named_parameters())
    ]
    assert any(differs)


def test_sample_uses_the_average(tiny_config, tmp_path):
    """`muongen sample` from a checkpoint with an average gives exactly what it gives from
    a checkpoint whose trained weights are that average (and another result without)."""
    run = Trainer(tiny_config(train__max_steps=10), tmp_path / "run")
    assert run.train() == 0
    payload = _payload(tmp_path / "run")
    generator, _ = load_for_inference(tmp_path / "run" / "checkpoints")
    for k, v in generator.state_dict().items():
        assert torch.equal(v, payload["generator_ema"]["weights"][k]), k

    state = {k: v for k, v in payload.items() if k not in HEADER}
    averaged = dict(state, generator=state["generator_ema"]["weights"])
    del averaged["generator_ema"]
    ckpt.save(averaged, tmp_path / "averaged", "step-000000010", step=10)
    trained = {k: v for k, v in state.items() if k != "generator_ema"}
    ckpt.save(trained, tmp_path / "trained", "step-000000010", step=10)

    grid = "energy=1e6:1e8:3,zenith=0:1:2,mass=1,56,depth=1500,count=20"
    outputs = {}
    for name, where in [
        ("ema", tmp_path / "run" / "checkpoints"),
        ("averaged", tmp_path / "averaged"),
        ("trained", tmp_path / "trained"),
    ]:
        out = tmp_path / f"{name}.parquet"
        assert main(["sample", "--checkpoint", str(where), "--grid", grid, "--out", str(out)]) == 0
        outputs[name] = read_events(str(out))
    ema, averaged, trained = outputs["ema"], outputs["averaged"], outputs["trained"]
    assert torch.equal(ema.counts, averaged.counts) and torch.equal(ema.muons, averaged.muons)
    assert ema.muons.shape != trained.muons.shape or not torch.equal(ema.muons, trained.muons)
