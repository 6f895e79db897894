"""A published, verified range checkpoint is final: a retried node finds it and is done."""

from __future__ import annotations

from pathlib import Path

import pytest

from muongen import checkpoint as ckpt
from muongen.chain import NodeSpec, run_node
from muongen.train.trainer import Trainer
from submit.constants import RECEIPT_FILE

from .conftest import tiny_overrides

RANGE = "0000000-0000999"


def node(tiny_data, scratch, dest: str = "") -> NodeSpec:
    sets = tiny_overrides(tiny_data, **{"checkpoint.every_steps": 10})
    sets = [s for s in sets if not s.startswith("data.paths")]  # the node sets its range
    return NodeSpec(
        range_name=RANGE,
        data=str(tiny_data),
        preset="demo",
        overrides=sets,
        ckpt_dest=dest,
        scratch=str(scratch),
    )


@pytest.mark.parametrize("published_to", ["a file:// store", "the scratch dir only"])
def test_a_retried_node_finds_its_range_published_and_exits_0(
    tiny_data, tmp_path, monkeypatch, published_to
):
    dest = f"file://{tmp_path}/store" if published_to.startswith("a file") else ""
    spec = node(tiny_data, tmp_path / "scratch", dest)
    assert run_node(spec) == 0
    where = tmp_path / "store" if dest else tmp_path / "scratch"
    first = ckpt.read_manifest(where / f"{RANGE}.json")
    (tmp_path / "scratch" / RECEIPT_FILE).unlink()

    def must_not_train(self, *a, **k):
        raise AssertionError("a retried node trained a range that is published")

    monkeypatch.setattr(Trainer, "train", must_not_train)
    monkeypatch.setattr(Trainer, "__init__", must_not_train)
    retry = node(tiny_data, tmp_path / "retry-scratch" if dest else tmp_path / "scratch", dest)
    assert run_node(retry) == 0
    receipt = ckpt.read_manifest(Path(retry.scratch) / RECEIPT_FILE)
    assert receipt["sha256"] == first["sha256"]
    ckpt.verify(Path(retry.scratch) / f"{RANGE}.json")  # what HTCondor transfers out
