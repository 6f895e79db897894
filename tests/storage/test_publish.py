"""Checkpoint publishing (immutable names, .pt first, manifest last) and sha-checked fetch."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from muongen.errors import CheckpointError, StorageError, TokenError
from muongen.storage import files
from muongen.storage.publish import fetch_checkpoint, fetch_published, publish_checkpoint
from muongen.storage.tokens import Token

WRITE = "storage.read:/icecube storage.create:/icecube/ckpt"


def make_checkpoint(folder, name: str, payload: bytes) -> tuple[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    pt = folder / f"{name}.pt"
    pt.write_bytes(payload)
    manifest = {
        "name": name,
        "pt": pt.name,
        "step": 100,
        "range": "0000000-0000999",
        "created": "2025-01-01T00:00:00Z",
        "size": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(),
        "muongen_version": "0",
        "schema_version": 1,
    }
    js = folder / f"{name}.json"
    js.write_text(json.dumps(manifest))
    return str(pt), str(js)


def test_publish_and_fetch_back(pelican_federation, tmp_path):
    fed = pelican_federation
    token = Token.from_value(fed.token(WRITE), "t")
    pt, js = make_checkpoint(tmp_path / "run", "r0", os.urandom(200_000))
    dest = fed.url("/icecube/ckpt/camp")
    manifest_url = publish_checkpoint(pt, js, dest, token=token)
    assert manifest_url == dest + "/r0.json"
    puts = [r.path for r in fed.requests("origin", "PUT")]
    assert puts == ["/icecube/ckpt/camp/r0.pt", "/icecube/ckpt/camp/r0.json"]  # .pt first
    got = fetch_checkpoint(manifest_url, str(tmp_path / "fetched"), token=token)
    assert Path(got).read_bytes() == Path(pt).read_bytes()
    assert os.path.exists(tmp_path / "fetched" / "r0.json")
    # publishing the same checkpoint again (a retried job) is a no-op
    assert publish_checkpoint(pt, js, dest, token=token) == manifest_url
    assert len(fed.requests("origin", "PUT")) == 2


def test_a_published_verified_name_is_final(pelican_federation, tmp_path, caplog):
    """A retried node that trained again (other bytes: GPU training is not bitwise
    reproducible) finds its range published: the published checkpoint is kept, no error."""
    fed = pelican_federation
    token = Token.from_value(fed.token(WRITE.replace("create", "modify")), "t")
    dest = fed.url("/icecube/ckpt/camp")
    url = publish_checkpoint(*make_checkpoint(tmp_path / "a", "r0", b"first"), dest, token=token)
    puts = len(fed.requests("origin", "PUT"))
    with caplog.at_level("WARNING"):
        again = publish_checkpoint(
            *make_checkpoint(tmp_path / "b", "r0", b"second"), dest, token=token
        )
    assert again == url and "is final" in caplog.text
    assert len(fed.requests("origin", "PUT")) == puts  # nothing sent
    assert fed.local("/icecube/ckpt/camp/r0.pt").read_bytes() == b"first"
    got = fetch_published(dest, "r0", str(tmp_path / "f"), token=token)
    assert Path(got).read_bytes() == b"first"
    assert fetch_published(dest, "r9", str(tmp_path / "f"), token=token) is None


def test_a_damaged_published_name_is_refused_not_replaced(pelican_federation, tmp_path):
    fed = pelican_federation
    token = Token.from_value(fed.token(WRITE.replace("create", "modify")), "t")
    dest = fed.url("/icecube/ckpt/camp")
    publish_checkpoint(*make_checkpoint(tmp_path / "a", "r0", b"first"), dest, token=token)
    fed.local("/icecube/ckpt/camp/r0.pt").write_bytes(b"fir5t")  # damaged after publishing
    with pytest.raises(StorageError, match="immutable"):
        publish_checkpoint(*make_checkpoint(tmp_path / "b", "r0", b"second"), dest, token=token)
    assert fed.local("/icecube/ckpt/camp/r0.pt").read_bytes() == b"fir5t"


@pytest.mark.parametrize(
    "content, says",
    [
        (b"\x89PNG\r\n\x1a\n\xff\xfe garbage", "not text"),
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "not an object"),
        (b'{"pt": "r0.pt"}', "lacks"),
    ],
)
def test_a_manifest_of_garbage_is_refused_in_one_line(tmp_path, content, says):
    pt, js = make_checkpoint(tmp_path / "run", "r0", b"bytes")
    Path(js).write_bytes(content)
    with pytest.raises(CheckpointError, match=says) as err:
        publish_checkpoint(pt, js, str(tmp_path / "pub"))
    assert js in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(CheckpointError, match=says):
        fetch_checkpoint(js, str(tmp_path / "f"))


def test_failed_publish_leaves_previous_state(pelican_federation, tmp_path):
    fed = pelican_federation
    token = Token.from_value(fed.token(WRITE), "t")
    dest = fed.url("/icecube/ckpt/camp")
    publish_checkpoint(*make_checkpoint(tmp_path / "a", "r0", b"zero"), dest, token=token)
    before = sorted(p.name for p in fed.local("/icecube/ckpt/camp").iterdir())
    fed.inject("status", method="PUT", path="r1.pt", status=503, times=99)
    with pytest.raises(StorageError, match=r"r1\.json was not written") as err:
        publish_checkpoint(*make_checkpoint(tmp_path / "b", "r1", b"one"), dest, token=token)
    assert "503" in str(err.value)
    assert sorted(p.name for p in fed.local("/icecube/ckpt/camp").iterdir()) == before
    again = fetch_checkpoint(dest + "/r0.json", str(tmp_path / "f"), token=token)
    assert Path(again).read_bytes() == b"zero"


def test_publish_recovers_from_faults(pelican_federation, tmp_path):
    fed = pelican_federation
    token = Token.from_value(fed.token(WRITE), "t")
    fed.inject("status", method="PUT", path="r0.pt", status=503)
    fed.inject("drop", method="PUT", path="r0.json")
    fed.inject("slow", method="PROPFIND", delay_s=0.2)
    pt, js = make_checkpoint(tmp_path / "a", "r0", os.urandom(10_000))
    url = publish_checkpoint(pt, js, fed.url("/icecube/ckpt/c"), token=token)
    assert fetch_checkpoint(url, str(tmp_path / "f"), token=token)
    assert all(f.times == 0 for f in fed.faults)


def test_publish_token_checks(pelican_federation, tmp_path, monkeypatch):
    fed = pelican_federation
    pt, js = make_checkpoint(tmp_path / "a", "r0", b"data")
    dest = fed.url("/icecube/ckpt/c")
    with pytest.raises(TokenError, match="no token allows write"):
        publish_checkpoint(pt, js, dest)
    monkeypatch.setenv("BEARER_TOKEN", fed.token("storage.read:/icecube"))
    with pytest.raises(TokenError, match=r"no token allows write.*storage\.read:/icecube"):
        publish_checkpoint(pt, js, dest)
    read_only = Token.from_value(fed.token("storage.read:/icecube"), "read-only token")
    with pytest.raises(TokenError, match="read-only token cannot write"):
        publish_checkpoint(pt, js, dest, token=read_only)
    assert fed.requests("origin", "PUT") == []  # refused before anything was sent


def test_fetch_detects_corruption(pelican_federation, tmp_path):
    fed = pelican_federation
    token = Token.from_value(fed.token(WRITE), "t")
    url = publish_checkpoint(
        *make_checkpoint(tmp_path / "a", "r0", b"good bytes"),
        fed.url("/icecube/ckpt/c"),
        token=token,
    )
    fed.local("/icecube/ckpt/c/r0.pt").write_bytes(b"evil bytes")  # same size, other sha
    with pytest.raises(CheckpointError, match="sha256"):
        fetch_checkpoint(url, str(tmp_path / "f"), token=token)
    assert not os.path.exists(tmp_path / "f" / "r0.pt")


def test_local_and_file_destinations(tmp_path):
    pt, js = make_checkpoint(tmp_path / "run", "r0", b"local bytes")
    for dest in (str(tmp_path / "pub"), f"file://{tmp_path}/pub2"):
        url = publish_checkpoint(pt, js, dest)
        got = fetch_checkpoint(url, str(tmp_path / "f" / dest[-4:]))
        assert Path(got).read_bytes() == b"local bytes"
    other_pt, other_js = make_checkpoint(tmp_path / "other", "r0", b"other bytes")
    publish_checkpoint(other_pt, other_js, str(tmp_path / "pub"))  # final: kept as it was
    assert (tmp_path / "pub" / "r0.pt").read_bytes() == b"local bytes"
    with open(pt, "ab") as f:
        f.write(b"!")
    with pytest.raises(CheckpointError, match="does not match its manifest"):
        publish_checkpoint(pt, js, str(tmp_path / "pub3"))
    assert not files.exists(str(tmp_path / "pub3" / "r0.pt"))
