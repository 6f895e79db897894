"""Checkpoint files: atomic pair, sha256 trust, rotation, model/optimizer mismatch."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from torch import nn

from muongen import checkpoint as ckpt
from muongen.errors import CheckpointError
from muongen.train.checkpoint import load_optimizer, optimizer_state


def _state(v: float = 1.0):
    return {"generator": {"w": torch.full((3,), v)}, "critic": {}, "trainer": {"step": int(v)}}


def test_save_writes_pt_and_manifest_with_matching_sha(tmp_path):
    saved = ckpt.save(_state(), tmp_path, "step-000000005", step=5, range_name="0000000-0000999")
    meta = json.loads(saved.manifest.read_text())
    assert meta["pt"] == "step-000000005.pt"
    assert meta["size"] == saved.pt.stat().st_size
    assert meta["sha256"] == ckpt.sha256_file(saved.pt)
    assert meta["step"] == 5 and meta["range"] == "0000000-0000999"
    payload = ckpt.load(saved.manifest)
    assert torch.equal(payload["generator"]["w"], torch.ones(3))
    assert not list(tmp_path.glob("*.tmp")), "temp files left behind"


def test_corrupt_newest_is_refused_and_previous_used(tmp_path, caplog):
    ckpt.save(_state(1), tmp_path, ckpt.STEP_NAME.format(1), step=1)
    newest = ckpt.save(_state(2), tmp_path, ckpt.STEP_NAME.format(2), step=2)
    data = bytearray(newest.pt.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different bytes
    newest.pt.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        ckpt.load(newest.pt)
    with caplog.at_level(logging.WARNING):
        found = ckpt.find_latest(tmp_path)
    assert found.name == "step-000000001.json"
    assert "sha256" in caplog.text


def test_truncated_and_manifestless_pt_are_refused(tmp_path):
    s = ckpt.save(_state(), tmp_path, "a", step=1)
    s.pt.write_bytes(s.pt.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match="truncated"):
        ckpt.verify(s.pt)
    lone = tmp_path / "lone.pt"
    torch.save({"x": 1}, lone)
    with pytest.raises(CheckpointError, match="does not exist"):
        ckpt.load(lone)


def test_rotate_keeps_last_k_and_removes_manifest_first(tmp_path):
    for i in range(1, 6):
        ckpt.save(_state(i), tmp_path, ckpt.STEP_NAME.format(i), step=i)
    removed = ckpt.rotate(tmp_path, keep_last=2)
    assert len(removed) == 3
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == [
        "step-000000004.json",
        "step-000000005.json",
    ]
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == [
        "step-000000004.pt",
        "step-000000005.pt",
    ]


def test_publish_once_links_keeps_sha_and_is_final(tmp_path):
    s = ckpt.save(_state(), tmp_path / "run", ckpt.STEP_NAME.format(3), step=3)
    c = ckpt.publish_once(s, tmp_path / "pub", "0001000-0001999", range_name="0001000-0001999")
    assert c.sha256 == s.sha256 and c.pt.read_bytes() == s.pt.read_bytes()
    assert c.pt.stat().st_ino == s.pt.stat().st_ino  # a hard link, not a second copy
    meta = ckpt.read_manifest(c.manifest)
    assert meta["name"] == "0001000-0001999" and meta["pt"] == "0001000-0001999.pt"
    ckpt.verify(c.manifest)
    # a name holding a verified checkpoint is final: another checkpoint does not replace it
    other = ckpt.save(_state(9), tmp_path / "run", ckpt.STEP_NAME.format(9), step=9)
    again = ckpt.publish_once(other, tmp_path / "pub", "0001000-0001999")
    assert again.sha256 == s.sha256 and again.step == 3
    assert ckpt.read_manifest(c.manifest)["sha256"] == s.sha256


def test_model_of_another_shape_is_refused_clearly():
    a, b = nn.Linear(4, 8), nn.Linear(4, 16)
    with pytest.raises(CheckpointError, match="does not fit this generator"):
        ckpt.load_module(b, a.state_dict(), "generator", "x.pt")


def test_optimizer_mismatch_resets_with_warning(caplog):
    model = nn.Linear(4, 4)
    adam = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    adam.step()
    saved = optimizer_state(adam)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level(logging.WARNING):
        assert load_optimizer(sgd, saved, "critic") is False
    assert "reset" in caplog.text
    other = nn.Linear(4, 8)
    adam2 = torch.optim.Adam([*list(other.parameters()), nn.Parameter(torch.zeros(2))])
    assert load_optimizer(adam2, saved, "critic") is False
    same_count = nn.Linear(4, 5)  # same number of tensors, other shapes
    assert load_optimizer(torch.optim.Adam(same_count.parameters()), saved, "critic") is False
    adam3 = torch.optim.Adam(model.parameters())
    assert load_optimizer(adam3, saved, "critic") is True
    assert adam3.state_dict()["state"][0]["step"] == 1


def test_resolve_takes_a_folder_and_picks_the_newest_valid(tmp_path):
    ckpt.save(_state(1), tmp_path, ckpt.STEP_NAME.format(1), step=1)
    ckpt.save(_state(2), tmp_path, ckpt.STEP_NAME.format(2), step=2)
    assert ckpt.resolve(tmp_path).name == "step-000000002.json"
    assert ckpt.resolve(tmp_path / "step-000000001.pt").name == "step-000000001.json"
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no valid checkpoint"):
        ckpt.resolve(tmp_path / "empty")


@pytest.mark.parametrize(
    "content, says",
    [
        (bytes(range(256)), "not text"),
        (b'{"step": 1,', "not valid JSON"),
        (b'"a string"', "not an object"),
        (b'{"pt": "a.pt"}', "lacks"),
    ],
)
def test_a_manifest_of_garbage_is_one_clear_error(tmp_path, content, says):
    ckpt.save(_state(1), tmp_path, ckpt.STEP_NAME.format(1), step=1)
    bad = ckpt.save(_state(2), tmp_path, ckpt.STEP_NAME.format(2), step=2)
    bad.manifest.write_bytes(content)
    with pytest.raises(CheckpointError, match=says) as err:
        ckpt.read_manifest(bad.manifest)
    assert str(bad.manifest) in str(err.value) and "\n" not in str(err.value)
    assert ckpt.find_latest(tmp_path).name == "step-000000001.json"  # skipped, not a crash


def test_sample_with_a_garbage_manifest_prints_one_line(tmp_path, capsys):
    from muongen import cli

    bad = tmp_path / "step-000000001.json"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    grid = "energy=1e6,zenith=0,mass=1,depth=1500,count=1"
    argv = ["sample", "--checkpoint", str(bad), "--grid", grid, "--out", str(tmp_path / "o.h5")]
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2 and "not text" in err and "Traceback" not in err
