"""Every checkpoint records the domain of its training conditions (muongen.domain), carried
across resume and from one chain node (range) to the next, and names the previous range's
checkpoint it continued (for `muongen inspect`)."""

from __future__ import annotations

import numpy as np

from muongen import checkpoint as ckpt
from muongen import domain as D
from muongen.data.reader import read_events
from muongen.train.trainer import Trainer


def _domain_of(files) -> dict:
    return D.observe(np.concatenate([read_events(str(f)).conditions.numpy() for f in files]))


def test_the_domain_rides_in_checkpoints_across_resume_and_ranges(tiny_config, tiny_data, tmp_path):
    files = sorted(tiny_data.glob("*.parquet"))
    first = tiny_config(train__max_steps=10, data__paths=f"[{files[0]}]")
    Trainer(first, tmp_path / "a").train()
    payload = ckpt.load(tmp_path / "a" / "checkpoints" / "step-000000010.json")
    d = payload["domain"]
    assert d["events"] == 10 * 32  # every event trained on, no more
    whole = _domain_of(files[:1])  # the batches are drawn from this file only
    assert whole["log10_energy"][0] <= d["log10_energy"][0] <= d["log10_energy"][1]
    assert d["log10_energy"][1] <= whole["log10_energy"][1]
    assert set(d["masses"]) <= set(whole["masses"])

    # resume in the same run: the domain goes on from the checkpoint's
    t = Trainer(tiny_config(train__max_steps=15, data__paths=f"[{files[0]}]"), tmp_path / "a")
    t.resume("auto")
    t.train()
    resumed = ckpt.load(tmp_path / "a" / "checkpoints" / "step-000000015.json")["domain"]
    assert resumed["events"] == 15 * 32
    assert resumed["log10_energy"][0] <= d["log10_energy"][0]

    # a chain node on the next range continues the model: its domain holds both ranges, and
    # it names the checkpoint it continued as the previous range's
    prev = tmp_path / "a" / "checkpoints" / "step-000000015.json"
    node = Trainer(
        tiny_config(train__max_steps=20, data__paths=f"[{files[1]}]"),
        tmp_path / "b",
        range_name="0001000-0001999",
    )
    node.resume(str(prev))
    node.train()
    last = ckpt.load(tmp_path / "b" / "checkpoints" / "step-000000020.json")
    assert last["domain"]["events"] == 20 * 32
    assert last["domain"] == D.merge(resumed, node.domain.own)
    assert last["lineage"]["previous"]["name"] == "step-000000015"
    assert last["lineage"]["previous"]["step"] == 15
    assert last["lineage"]["previous"]["sha256"] == ckpt.read_manifest(prev)["sha256"]


def test_a_checkpoint_without_a_domain_is_resumed_and_marked_partial(tiny_config, tmp_path):
    run = tmp_path / "r"
    Trainer(tiny_config(train__max_steps=10), run).train()
    manifest = run / "checkpoints" / "step-000000010.json"
    payload = ckpt.load(manifest)
    del payload["domain"]  # as a checkpoint of an older muongen
    ckpt.remove(manifest)
    state = {k: v for k, v in payload.items() if k not in ("format", "format_version")}
    ckpt.save(state, run / "checkpoints", "step-000000010", step=10)
    t = Trainer(tiny_config(train__max_steps=12), run)
    t.resume("auto")
    t.train()
    d = ckpt.load(run / "checkpoints" / "step-000000012.json")["domain"]
    assert d["partial"] is True and d["events"] == 2 * 32
    line, _ = D.report(d, np.array([[1e1, 0.1, 1.0, 2000.0]]))
    assert "partly known" in line
