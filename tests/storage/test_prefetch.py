"""Prefetcher: staging ahead over the federation, caps, delete-after-use, failures."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from pelican_federation import sample_bytes

from muongen.storage.prefetch import Prefetcher
from muongen.storage.tokens import Token


def test_stages_ahead_and_deletes_after_use(pelican_federation, sim_tree, tmp_path):
    fed = pelican_federation
    token = Token.from_value(fed.token("storage.read:/icecube"), "t")
    urls = [fed.url(p) for p in sim_tree]
    cache = tmp_path / "cache"
    with Prefetcher(str(cache), ahead=3, max_bytes=10**6, delete_after_use=True, token=token) as pf:
        pf.schedule(urls)
        for url, path in zip(urls, sim_tree):
            local = pf.local_path(url)
            assert local is not None and local.startswith(str(cache))
            assert Path(local).read_bytes() == sample_bytes(path)
            pf.release(url)
            assert not os.path.exists(local)
        assert pf.stats["staged"] == len(urls) and pf.stats["failed"] == 0
    assert [n for n in os.listdir(cache) if not n.startswith(".")] == []


def test_ahead_caps_staged_files(pelican_federation, sim_tree, tmp_path):
    fed = pelican_federation
    token = Token.from_value(fed.token("storage.read:/icecube"), "t")
    urls = [fed.url(p) for p in sim_tree]
    with Prefetcher(str(tmp_path / "c"), ahead=2, workers=2, token=token) as pf:
        pf.schedule(urls)
        time.sleep(0.5)  # plenty of time to stage everything, were it not capped
        staged = [n for n in os.listdir(tmp_path / "c") if not n.startswith(".")]
        assert len(staged) == 2
        assert len(fed.requests("origin", "GET")) == 2


def test_byte_cap_and_unscheduled(pelican_federation, sim_tree, tmp_path):
    fed = pelican_federation
    token = Token.from_value(fed.token("storage.read:/icecube"), "t")
    urls = [fed.url(p) for p in sim_tree]
    # room for one 3000-byte file at a time: a second one waits for a release
    with Prefetcher(str(tmp_path / "c"), ahead=4, max_bytes=4000, token=token) as pf:
        assert pf.local_path(urls[0]) is None  # not scheduled: read directly
        pf.schedule(urls[:3])
        first = pf.local_path(urls[0])
        assert first is not None
        # the cap is full of a file the reader holds: the next one is not waited for
        assert pf.local_path(urls[1]) is None
        pf.release(urls[0])
        assert pf.local_path(urls[2]) is not None
    with Prefetcher(str(tmp_path / "d"), ahead=1, max_bytes=100, token=token) as pf:
        pf.schedule(urls[:1])
        assert pf.local_path(urls[0]) is None  # larger than the whole cache
        assert pf.stats["failed"] == 1


def test_retries_faults_then_falls_back(pelican_federation, sim_tree, tmp_path, caplog):
    fed = pelican_federation
    token = Token.from_value(fed.token("storage.read:/icecube"), "t")
    urls = [fed.url(p) for p in sim_tree[:2]]
    fed.inject("status", method="GET", path=sim_tree[0], status=503)
    fed.inject("truncate", method="GET", path=sim_tree[0])
    fed.inject("status", method="GET", path=sim_tree[1], status=503, times=99)
    with Prefetcher(str(tmp_path / "c"), ahead=2, retries=3, token=token) as pf:
        pf.schedule(urls)
        ok = pf.local_path(urls[0])
        assert ok is not None and Path(ok).read_bytes() == sample_bytes(sim_tree[0])
        assert pf.local_path(urls[1]) is None  # gave up: the reader reads the URL itself
        assert pf.stats["failed"] == 1
        caplog.set_level(logging.INFO, logger="muongen.storage")
    # closing says how it went, so a run's log shows files read past the cache
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("prefetch:")]
    assert "1 file(s) staged" in line and "1 read directly" in line
    assert "1 download(s) failed" in line


def test_local_inputs_are_not_staged(tmp_path):
    f = tmp_path / "a.parquet"
    f.write_bytes(b"1")
    with Prefetcher(None, ahead=2) as pf:
        pf.schedule([str(f)])
        assert pf.local_path(str(f)) is None
        cache = pf.cache_dir
    assert not os.path.exists(cache)  # its own temp folder is removed


def test_local_path_waits_for_staging(pelican_federation, sim_tree, tmp_path):
    fed = pelican_federation
    fed.latency_s = 0.05
    token = Token.from_value(fed.token("storage.read:/icecube"), "t")
    urls = [fed.url(p) for p in sim_tree]
    got: list[str | None] = []
    with Prefetcher(str(tmp_path / "c"), ahead=8, token=token) as pf:
        pf.schedule(urls)
        t = threading.Thread(target=lambda: got.append(pf.local_path(urls[-1])))
        t.start()
        t.join(10)
    assert got and got[0] is not None


def test_a_wanted_file_does_not_wait_behind_an_earlier_one_being_sized(
    pelican_federation, sim_tree, tmp_path
):
    # Two readers (data.open_files) want files out of the scheduled order: the second
    # reader's file is sized and waits to reserve its bytes behind the first reader's next
    # file, whose sizing is slow. It used to be given up as "cache full" and read directly
    # (the flake of test_integration's prefetch test); the cache has room, so it is staged.
    fed = pelican_federation
    token = Token.from_value(fed.token("storage.read:/icecube"), "t")
    urls = [fed.url(p) for p in sim_tree[:2]]
    fed.inject("slow", path=sim_tree[0], delay_s=1.5)  # the first file's sizing
    with Prefetcher(str(tmp_path / "c"), ahead=2, workers=2, token=token) as pf:
        pf.schedule(urls)
        time.sleep(0.5)  # the second file is sized and waits behind the first
        local = pf.local_path(urls[1])
        assert local is not None, pf.stats
        assert Path(local).read_bytes() == sample_bytes(sim_tree[1])
        assert pf.local_path(urls[0]) is not None
        assert pf.stats["staged"] == 2 and pf.stats["direct"] == 0, pf.stats


def test_two_readers_wanting_files_that_finish_sizing_out_of_order(
    pelican_federation, sim_tree, tmp_path
):
    # Two readers (data.open_files) want their files while both are still being sized; the
    # second reader's file moves first in reading order. The first reader's file is sized
    # first and waits to reserve its bytes behind the second's. It used to be given up as
    # "cache full" and read directly (the later flake of test_integration's prefetch test,
    # 5 staged and 1 direct); the cache has room for both, so both are staged.
    fed = pelican_federation
    token = Token.from_value(fed.token("storage.read:/icecube"), "t")
    urls = [fed.url(p) for p in sim_tree[:2]]
    fed.inject("slow", path=sim_tree[0], delay_s=1.0)  # sized at ~1 s ...
    fed.inject("slow", path=sim_tree[1], delay_s=2.5)  # ... before this one, at ~2.5 s
    with Prefetcher(str(tmp_path / "c"), ahead=2, workers=2, token=token) as pf:
        pf.schedule(urls)
        got: dict[int, str | None] = {}
        first = threading.Thread(target=lambda: got.update({0: pf.local_path(urls[0])}))
        first.start()
        time.sleep(0.3)  # the first reader waits for its file; now the second wants its own
        got[1] = pf.local_path(urls[1])
        first.join(timeout=10)
        assert got[0] is not None and got[1] is not None, pf.stats
        assert [Path(got[i]).read_bytes() for i in (0, 1)] == [
            sample_bytes(p) for p in sim_tree[:2]
        ]
        assert pf.stats["staged"] == 2 and pf.stats["direct"] == 0, pf.stats
