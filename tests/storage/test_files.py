"""expand_inputs / open_input / get_file / put_file against the local federation."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from pelican_federation import Federation, sample_bytes

from muongen.errors import StorageError, TokenError
from muongen.storage import files
from muongen.storage.tokens import Token

READ = "storage.read:/icecube"


def read_token(fed: Federation, scopes: str = READ) -> Token:
    return Token.from_value(fed.token(scopes), "test")


def test_glob_across_range_folders(pelican_federation, sim_tree):
    fed = pelican_federation
    token = read_token(fed)
    got = files.expand_inputs(fed.url("/icecube/sim/*-*/*.parquet"), token=token)
    assert got == [fed.url(p) for p in sim_tree]
    # a pattern in the range component picks the ranges it names
    got = files.expand_inputs(fed.url("/icecube/sim/0001*-*/*.parquet"), token=token)
    assert got == [fed.url(p) for p in sim_tree if "/0001000-0001999/" in p]


def test_glob_uses_discovered_token(pelican_federation, sim_tree, monkeypatch):
    fed = pelican_federation
    monkeypatch.setenv("BEARER_TOKEN", fed.token(READ))
    assert len(files.expand_inputs(fed.url("/icecube/sim/*-*/*.parquet"))) == 9
    assert all(r.authorized for r in fed.requests("origin", "PROPFIND"))


def test_double_star_refused_fast_without_maxdepth(pelican_federation, sim_tree):
    fed = pelican_federation
    with pytest.raises(StorageError, match=r"\*\*.*00\*-\*/\*\.parquet"):
        files.expand_inputs(fed.url("/icecube/sim/**/*.parquet"))
    assert fed.requests() == []  # refused before any request
    got = files.expand_inputs(
        fed.url("/icecube/sim/**/*.parquet"), maxdepth=2, token=read_token(fed)
    )
    assert len(got) == 9


def test_failed_listing_names_url_and_answer(pelican_federation, sim_tree):
    fed = pelican_federation
    fed.inject("status", method="PROPFIND", path="0001000-0001999", status=500, times=99)
    with pytest.raises(StorageError) as err:
        files.expand_inputs(fed.url("/icecube/sim/*-*/*.parquet"), token=read_token(fed))
    msg = str(err.value)
    assert fed.url("/icecube/sim/*-*/*.parquet") in msg
    assert "500" in msg and "0001000-0001999" in msg and "after 4 attempts" in msg


def test_listing_recovers_from_503_and_drop(pelican_federation, sim_tree):
    fed = pelican_federation
    fed.inject("status", method="PROPFIND", path="0001000-0001999", status=503)
    fed.inject("drop", method="PROPFIND", path="0002000-0002999")
    got = files.expand_inputs(fed.url("/icecube/sim/*-*/*.parquet"), token=read_token(fed))
    assert len(got) == 9  # no range folder silently skipped


def test_listing_without_token_is_a_token_error(pelican_federation, sim_tree):
    with pytest.raises(TokenError, match=r"storage\.read:/icecube/sim"):
        files.expand_inputs(pelican_federation.url("/icecube/sim/*-*/*.parquet"))


def test_no_match_is_an_error(pelican_federation, sim_tree):
    with pytest.raises(StorageError, match="matches no files"):
        files.expand_inputs(pelican_federation.url("/public/none/*.parquet"))


def test_open_input_streams_and_seeks(pelican_federation, sim_tree):
    fed = pelican_federation
    path = sim_tree[4]
    with files.open_input(fed.url(path), token=read_token(fed)) as f:
        assert f.seekable()
        assert f.read() == sample_bytes(path)
        f.seek(-100, io.SEEK_END)
        assert f.read(50) == sample_bytes(path)[-100:-50]
        assert f.tell() == 2950
    assert all(r.authorized for r in fed.requests("origin", "GET"))


@pytest.mark.parametrize("kind", ["status", "drop", "truncate", "slow"])
def test_reads_recover_from_faults(pelican_federation, sim_tree, kind):
    fed = pelican_federation
    files.configure(timeout_s=0.5)  # a slow answer (2 s) times out, then the retry succeeds
    path = sim_tree[0]
    with files.open_input(fed.url(path), token=read_token(fed)) as f:
        fed.inject(kind, method="GET", delay_s=2.0)
        assert f.read() == sample_bytes(path)
    assert fed.faults[0].times == 0  # the fault did happen


def test_open_missing_file(pelican_federation, sim_tree):
    with pytest.raises(StorageError, match=r"not found|no such"):
        files.open_input(pelican_federation.url("/public/nope.parquet"))


def test_open_without_token_explains(pelican_federation, sim_tree):
    fed = pelican_federation
    with pytest.raises(TokenError) as err:
        files.open_input(fed.url(sim_tree[0]))
    assert "403" in str(err.value) and "No token was sent" in str(err.value)


def test_get_put_exists_size_cat(pelican_federation, tmp_path):
    fed = pelican_federation
    token = Token.from_value(fed.token("storage.read:/icecube storage.create:/icecube/out"), "t")
    src = tmp_path / "a.bin"
    src.write_bytes(b"x" * 12345)
    url = fed.url("/icecube/out/run1/a.bin")
    assert not files.exists(url, token=token)
    assert files.put_file(str(src), url, token=token) == 12345
    assert files.exists(url, token=token)
    assert files.size(url, token=token) == 12345
    assert files.cat(url, token=token) == b"x" * 12345
    dest = files.get_file(url, str(tmp_path / "dl" / "a.bin"), token=token, expected_size=12345)
    assert Path(dest).read_bytes() == b"x" * 12345
    assert files.list_sizes(fed.url("/icecube/out"), token=token) == {"run1/a.bin": 12345}


def test_put_recovers_from_faults(pelican_federation, tmp_path):
    fed = pelican_federation
    token = Token.from_value(fed.token("storage.read:/icecube storage.modify:/icecube/out"), "t")
    src = tmp_path / "b.bin"
    src.write_bytes(b"y" * 5000)
    fed.inject("status", method="PUT", status=503)
    fed.inject("drop", method="PUT")
    files.put_file(str(src), fed.url("/icecube/out/b.bin"), token=token)
    assert fed.local("/icecube/out/b.bin").read_bytes() == b"y" * 5000
    assert len(fed.requests("origin", "PUT")) == 3


def test_put_with_read_only_token_is_a_token_error(pelican_federation, tmp_path):
    fed = pelican_federation
    src = tmp_path / "c.bin"
    src.write_bytes(b"z")
    with pytest.raises(TokenError, match=r"storage\.create"):
        files.put_file(str(src), fed.url("/icecube/out/c.bin"), token=read_token(fed))
    with pytest.raises(TokenError, match="No token was sent"):
        files.put_file(str(src), fed.url("/icecube/out/c.bin"))
    assert not fed.local("/icecube/out/c.bin").exists()


def test_local_and_file_urls(tmp_path):
    (tmp_path / "d" / "0000000-0000999").mkdir(parents=True)
    for name in ("b.parquet", "a.parquet"):
        (tmp_path / "d" / "0000000-0000999" / name).write_bytes(b"1")
    got = files.expand_inputs(f"file://{tmp_path}/d/*/*.parquet")
    assert [p.rsplit("/", 1)[1] for p in got] == ["a.parquet", "b.parquet"]
    assert files.expand_inputs(str(tmp_path / "d")) == got
    dest = f"file://{tmp_path}/out/x.parquet"
    files.put_file(got[0], dest)
    assert files.exists(dest) and files.size(dest) == 1 and files.cat(dest) == b"1"
    with files.open_input(dest) as f:
        assert f.read() == b"1"


def test_glob_leaves_out_folders(pelican_federation, sim_tree):
    fed = pelican_federation
    got = files.expand_inputs(fed.url("/icecube/sim/*"), token=read_token(fed))
    assert got == [fed.url("/icecube/sim/README.txt")]  # not the three range folders


def test_unknown_namespace_fails_without_retries(pelican_federation):
    fed = pelican_federation
    with pytest.raises(StorageError, match="director answered 404"):
        files.open_input(fed.url("/nowhere/x.parquet"))
    # one try, then one probe: a 404 from the director is not worth retrying
    assert len([r for r in fed.requests("director") if r.path == "/nowhere/x.parquet"]) == 2


@pytest.mark.parametrize(
    "pattern, ranges, files_in_range",
    [
        ("/icecube/*/*-*/*.parquet", (0, 1, 2), (0, 1, 2)),  # a wildcard in every component
        ("/icecube/s?m/*-*/0002*.par*", (2,), (0, 1, 2)),  # "?" in a folder name
        ("/icecube/sim/*/000100?.parquet", (1,), (0, 1, 2)),  # "?" in a file name
        ("/icecube/sim/000[01]*/*[02].parquet", (0, 1), (0, 2)),  # classes in both
        ("/icecube/sim/0001000-0001999", (1,), (0, 1, 2)),  # a folder: its input files
        ("/icecube/sim/", (0, 1, 2), (0, 1, 2)),  # ... found recursively, README.txt not
    ],
)
def test_wildcards_in_any_component_and_folders(
    pelican_federation, sim_tree, pattern, ranges, files_in_range
):
    fed = pelican_federation
    got = files.expand_inputs(fed.url(pattern), token=read_token(fed))
    want = [
        fed.url(f"/icecube/sim/{r * 1000:07d}-{r * 1000 + 999:07d}/{r * 1000 + i:07d}.parquet")
        for r in ranges
        for i in files_in_range
    ]
    assert got == want


def test_osdf_urls_glob_like_pelican_urls(pelican_federation, sim_tree, monkeypatch):
    from muongen.storage import remote

    fed = pelican_federation
    monkeypatch.setattr(remote, "OSDF_DISCOVERY", fed.url("/"))
    got = files.expand_inputs("osdf:///icecube/sim/*/00000?[0-1].parquet", token=read_token(fed))
    assert got == [f"osdf:///icecube/sim/0000000-0000999/000000{i}.parquet" for i in (0, 1)]


def test_a_remote_file_name_costs_no_request(pelican_federation, sim_tree):
    fed = pelican_federation
    before = len(fed.requests())
    url = fed.url("/icecube/sim/0000000-0000999/0000000.parquet")
    assert files.expand_inputs(url, token=read_token(fed)) == [url]
    assert len(fed.requests()) == before


def test_wildcard_above_a_namespace_is_explained(pelican_federation):
    with pytest.raises(StorageError, match="first path component"):
        files.expand_inputs(pelican_federation.url("/ice*/sim/*.parquet"))
