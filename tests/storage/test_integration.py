"""End to end over the local federation: the data reader and stream on pelican:// inputs,
check_access, and no token text in anything a run writes."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from muongen.config import DataConfig
from muongen.data.reader import read_events
from muongen.data.stream import EventStream
from muongen.data.synth import write_synthetic
from muongen.errors import StorageError, TokenError
from muongen.storage import files
from muongen.storage.access import check_access
from muongen.storage.prefetch import Prefetcher
from muongen.storage.publish import fetch_checkpoint, publish_checkpoint
from muongen.storage.tbsync import TensorBoardSync
from muongen.storage.tokens import Token

SCOPES = "storage.read:/icecube storage.create:/icecube/out storage.modify:/icecube/out"


@pytest.fixture
def parquet_ranges(pelican_federation, tmp_path) -> list[Path]:
    """Six small synthetic Parquet files in two range folders, copied onto the origin under
    /icecube/sim (the production layout); returns the local copies."""
    return put_synthetic(pelican_federation, tmp_path, "parquet-v1", "/icecube/sim")


def put_synthetic(fed, tmp_path: Path, fmt: str, where: str) -> list[Path]:
    root = tmp_path / f"synth-{fmt}"
    local = write_synthetic(root, files=6, events_per_file=300, ranges=True, fmt=fmt)
    for p in local:
        rel = Path(p).relative_to(root).as_posix()
        fed.put_bytes(f"{where}/{rel}", Path(p).read_bytes())
    return [Path(p) for p in local]


@pytest.mark.parametrize("fmt", ["parquet-v1", "parquet-v2", "hdf5"])
def test_reader_streams_pelican_inputs(pelican_federation, monkeypatch, tmp_path, fmt):
    fed = pelican_federation
    parquet_ranges = put_synthetic(fed, tmp_path, fmt, "/icecube/sim")
    monkeypatch.setenv("BEARER_TOKEN", fed.token("storage.read:/icecube"))
    urls = files.expand_inputs(fed.url("/icecube/sim/*-*/*.*"))
    assert len(urls) == 6 and urls == sorted(urls)
    fed.inject("status", method="GET", status=503)
    fed.inject("truncate", method="GET")
    for url, local in zip(urls, parquet_ranges):
        remote_batch, local_batch = read_events(url), read_events(str(local))
        assert remote_batch.n_events == local_batch.n_events == 300
        np.testing.assert_array_equal(remote_batch.muons.numpy(), local_batch.muons.numpy())
    assert all(f.times == 0 for f in fed.faults)


def test_event_stream_with_prefetch(pelican_federation, parquet_ranges, monkeypatch, tmp_path):
    fed = pelican_federation
    monkeypatch.setenv("BEARER_TOKEN", fed.token("storage.read:/icecube"))
    urls = files.expand_inputs(fed.url("/icecube/sim/*-*/*.parquet"))
    cfg = DataConfig(batch_events=256, max_epochs=1, open_files=2, shuffle_buffer_events=0)
    cache = tmp_path / "cache"
    with Prefetcher(str(cache), ahead=3, max_bytes=10**8, delete_after_use=True) as pf:
        stream = EventStream(urls, cfg, prefetcher=pf)
        events = sum(b.n_events for b in stream)
        # every event first, then how: a file read directly (5 staged, 1 direct, now and
        # then on a busy machine) was a file wanted out of order that waited behind another
        # one still being sized (test_prefetch: ..._behind_an_earlier_one_being_sized and
        # ..._that_finish_sizing_out_of_order)
        assert events == 6 * 300, pf.stats
        assert pf.stats["staged"] == 6 and pf.stats["direct"] == 0, pf.stats
        assert [n for n in os.listdir(cache) if not n.startswith(".")] == []  # deleted after use
    local = EventStream([str(p) for p in parquet_ranges], cfg)
    assert events == sum(b.n_events for b in local) == 6 * 300


def test_check_access(pelican_federation, parquet_ranges, monkeypatch, tmp_path):
    fed = pelican_federation
    inputs = [fed.url("/icecube/sim/*-*/*.parquet")]
    outputs = [fed.url("/icecube/out/ckpt"), str(tmp_path / "local-out")]
    with pytest.raises(TokenError, match="no token allows read"):
        check_access(inputs)
    monkeypatch.setenv("BEARER_TOKEN", fed.token("storage.read:/icecube"))
    with pytest.raises(TokenError, match=r"no token allows write on .*/icecube/out/ckpt"):
        check_access(inputs, outputs)
    monkeypatch.setenv("BEARER_TOKEN", fed.token(SCOPES, exp_in_s=7200))
    lines = check_access(inputs, outputs)
    assert len(lines) == 3 and "namespace /icecube" in lines[0] and "BEARER_TOKEN" in lines[0]
    assert all(fed.token(SCOPES) not in line for line in lines)
    fed.put_bytes("/public/data/a.parquet", b"x")
    assert "no token needed" in check_access([fed.url("/public/data/*.parquet")])[0]
    with pytest.raises(StorageError, match="does not exist"):
        check_access([fed.url("/icecube/nothing/*.parquet")])
    with pytest.raises(StorageError, match="director"):
        check_access([fed.url("/unknown/ns/*.parquet")])


def test_no_token_text_in_any_file_written(
    pelican_federation, parquet_ranges, monkeypatch, tmp_path
):
    fed = pelican_federation
    value = fed.token(SCOPES)
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    token_file = secrets / "token"
    token_file.write_text(value)
    token_file.chmod(0o600)
    monkeypatch.setenv("BEARER_TOKEN_FILE", str(token_file))
    work = tmp_path / "run"
    work.mkdir()
    handler = logging.FileHandler(work / "debug.log")
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        check_access([fed.url("/icecube/sim/*-*/*.parquet")], [fed.url("/icecube/out")])
        urls = files.expand_inputs(fed.url("/icecube/sim/*-*/*.parquet"))
        fed.inject("status", status=403, method="GET", path=urls[0].split(fed.host)[1])
        with pytest.raises(TokenError) as err:
            files.cat(urls[0])
        (work / "error.txt").write_text(str(err.value) + repr(Token.from_value(value, "x")))
        with Prefetcher(str(work / "cache"), ahead=2, delete_after_use=False) as pf:
            pf.schedule(urls)
            for u in urls:
                assert pf.local_path(u) is not None
                pf.release(u)
        pt = work / "r0.pt"
        pt.write_bytes(os.urandom(5000))
        manifest = {  # every key a manifest has (muongen.checkpoint.MANIFEST_KEYS)
            "name": "r0",
            "pt": "r0.pt",
            "step": 1,
            "range": None,
            "created": "2025-01-01T00:00:00+00:00",
            "size": 5000,
            "sha256": hashlib.sha256(pt.read_bytes()).hexdigest(),
            "muongen_version": "0",
            "schema_version": 1,
        }
        (work / "r0.json").write_text(json.dumps(manifest))
        url = publish_checkpoint(str(pt), str(work / "r0.json"), fed.url("/icecube/out/ckpt"))
        fetch_checkpoint(url, str(work / "fetched"))
        tb = work / "tb"
        tb.mkdir()
        (tb / "events.out.tfevents.1.h.1.0").write_bytes(b"e" * 100)
        assert TensorBoardSync(str(tb), fed.url("/icecube/out/tb"), every_s=0).close()
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        handler.close()
    assert (work / "debug.log").stat().st_size > 0
    needle = value.encode()
    signature = value.rsplit(".", 1)[1].encode()
    leaks = [
        str(p)
        for base in (work, fed.storage)
        for p in base.rglob("*")
        if p.is_file() and (needle in p.read_bytes() or signature in p.read_bytes())
    ]
    assert leaks == []
