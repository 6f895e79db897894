"""Token discovery, scope inference and checks, safe handling of the value."""

from __future__ import annotations

import logging
import os
import stat

import pytest
from pelican_federation import Federation

from muongen.errors import TokenError
from muongen.storage import tokens
from muongen.storage.tokens import Token

URL = "pelican://fed.example/icecube/sim/0001000-0001999/*.parquet"


@pytest.mark.parametrize(
    ("url", "want"),
    [
        (URL, "/icecube/sim"),
        ("osdf:///icecube/sim/00*-*/*.parquet", "/icecube/sim"),
        ("pelican://fed/icecube/sim/0001000-0001999/0001003.parquet", "/icecube/sim"),
        ("pelican://fed/icecube/ckpt/campaign", "/icecube/ckpt/campaign"),
        ("pelican://fed/icecube/sim/run_[12]/x", "/icecube/sim"),
        ("/local/data/0000000-0000999/a.parquet", "/local/data"),
    ],
)
def test_scope_path(url, want):
    assert tokens.scope_path(url) == want


def test_repr_and_describe_never_show_the_value():
    value = Federation.token("storage.read:/icecube")
    token = Token.from_value(value, "BEARER_TOKEN")
    for text in (repr(token), str(token), f"{token}", str(token.describe()), str([token])):
        assert value not in text
        assert value.split(".")[1] not in text  # not even the claims part
    d = token.describe()
    assert d["scopes"] == ["storage.read:/icecube"] and d["source"] == "BEARER_TOKEN"
    assert 3500 < d["expires_in_s"] <= 3600


def test_covers_read_and_write():
    token = Token.from_value(
        Federation.token("storage.read:/icecube storage.create:/icecube/ckpt"), "t"
    )
    assert token.covers("/icecube/sim", "read")
    assert not token.covers("/icecubefoo", "read")  # a path boundary, not a string prefix
    assert token.covers("/icecube/ckpt/c1", "write")
    assert not token.covers("/icecube/sim", "write")
    assert Token.from_value("opaque-token", "t").covers("/anything", "write")


def test_discovery_order_and_selection(tmp_path, monkeypatch, isolated_tokens):
    read = Federation.token("storage.read:/icecube")
    write = Federation.token("storage.create:/icecube/ckpt")
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "scitokens.use").write_text(read)
    (creds / "ckpt.use").write_text(write)
    monkeypatch.setenv("_CONDOR_CREDS", str(creds))
    # picked by need and scope path
    assert tokens.find_token(URL, "read").source == "_CONDOR_CREDS/scitokens.use"
    assert (
        tokens.find_token("pelican://fed/icecube/ckpt/c", "write").source
        == "_CONDOR_CREDS/ckpt.use"
    )
    assert tokens.find_token("pelican://fed/other/x", "read") is None
    # picked by name
    only = tokens.candidates(token_name="ckpt")
    assert [t.source for t in only] == ["_CONDOR_CREDS/ckpt.use"]
    # BEARER_TOKEN_FILE comes before _CONDOR_CREDS, BEARER_TOKEN before that
    f = tmp_path / "bt"
    f.write_text(Federation.token("storage.read:/"))
    monkeypatch.setenv("BEARER_TOKEN_FILE", str(f))
    assert tokens.find_token(URL, "read").source.startswith("BEARER_TOKEN_FILE=")
    monkeypatch.setenv("BEARER_TOKEN", Federation.token("storage.read:/icecube/sim"))
    assert tokens.find_token(URL, "read").source == "BEARER_TOKEN"
    # an expired token is passed over
    monkeypatch.setenv("BEARER_TOKEN", Federation.token("storage.read:/", exp_in_s=-10))
    assert tokens.find_token(URL, "read").source.startswith("BEARER_TOKEN_FILE=")


def test_wlcg_default_file_and_json(tmp_path, monkeypatch, isolated_tokens):
    value = Federation.token("storage.read:/icecube")
    path = tokens.default_bearer_token_file()
    tokens.write_token_file(path, f'{{"access_token": "{value}"}}')
    token = tokens.find_token(URL, "read")
    assert token is not None and token.value == value
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_explicit_token_file_is_used_alone(tmp_path, monkeypatch, isolated_tokens):
    monkeypatch.setenv("BEARER_TOKEN", Federation.token("storage.read:/"))
    f = tmp_path / "tok"
    tokens.write_token_file(f, Federation.token("storage.read:/elsewhere"))
    with pytest.raises(
        TokenError, match=r"cannot read .*storage.read:/icecube/sim.*'storage.read:/elsewhere'"
    ):
        tokens.require_token(URL, "read", token_file=str(f))
    with pytest.raises(TokenError, match="cannot read token file"):
        tokens.require_token(URL, "read", token_file=str(tmp_path / "missing"))


def test_require_token_messages(isolated_tokens, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # no pelican command
    with pytest.raises(TokenError) as err:
        tokens.require_token(URL, "read")
    msg = str(err.value)
    assert "no token allows read" in msg and "pelican token fetch" in msg
    assert "pelican://fed.example/icecube/sim -r" in msg and "not installed" in msg
    monkeypatch.setenv("BEARER_TOKEN", Federation.token("storage.read:/icecube", exp_in_s=-5))
    with pytest.raises(TokenError, match="tokens found: Token\\(source='BEARER_TOKEN'"):
        tokens.require_token(URL, "read")
    expired = Token.from_value(Federation.token("storage.read:/", exp_in_s=-5), "old")
    with pytest.raises(TokenError, match="expired"):
        tokens.check_token(expired, URL, "read")


def test_expiry_warning(caplog):
    soon = Token.from_value(Federation.token("storage.read:/", exp_in_s=600), "soon")
    with caplog.at_level(logging.WARNING, logger="muongen.storage"):
        tokens.check_token(soon, URL, "read")
    assert "expires in 9 min" in caplog.text or "expires in 10 min" in caplog.text
    assert soon.value not in caplog.text


def test_token_file_modes(tmp_path, caplog):
    path = tokens.write_token_file(tmp_path / "sub" / "t", "abc.def.ghi")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    os.chmod(path, 0o644)
    with caplog.at_level(logging.WARNING, logger="muongen.storage"):
        tokens.read_token_file(path)
    assert "readable by others" in caplog.text
    tokens.write_token_file(path, "new.token.value")  # replacing keeps 0600
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_device_flow_with_pelican_command(tmp_path, monkeypatch, isolated_tokens):
    value = Federation.token("storage.read:/icecube")
    fake = tmp_path / "bin" / "pelican"
    fake.parent.mkdir()
    fake.write_text(
        f"#!/bin/sh\necho 'Visit https://issuer/device and enter ABCD' >&2\necho '{value}'\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    token = tokens.require_token(URL, "read", interactive=True)
    assert token.value == value and token.path is not None
    assert stat.S_IMODE(os.stat(token.path).st_mode) == 0o600
    # saved for next time: found by plain discovery now
    assert tokens.find_token(URL, "read").value == value
