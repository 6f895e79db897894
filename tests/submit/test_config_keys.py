"""submit/config_keys.json: muongen's config keys and types, checked without muongen."""

from __future__ import annotations

import pytest

from submit.config_keys import (
    REFRESH_COMMAND,
    TABLE_FILE,
    check_value,
    describe,
    table_for,
    table_text,
)


def test_the_checked_in_table_matches_muongen_config():
    config = pytest.importorskip("muongen.config")
    fresh = table_text(table_for(config.Config))
    assert TABLE_FILE.read_text() == fresh, (
        f"{TABLE_FILE.name} is stale (muongen.config changed): run `{REFRESH_COMMAND}` "
        "and commit the file"
    )


def test_check_value_agrees_with_muongen_coercion():
    # The same values through muongen's own --set parsing: accepted exactly when the table
    # says so (a few keys of every kind of type).
    config = pytest.importorskip("muongen.config")
    errors = pytest.importorskip("muongen.errors")
    import yaml

    table = table_for(config.Config)
    cases = {
        "optim.lr_critic": ["1e-4", "3.0e-4", "2", "abc", "true"],
        "model.critic_local_width": ["64", "64.0", "64.5", "x"],
        "model.critic": ["epic", "pointnet", "nope", "1"],
        "train.compile": ["true", "cuda", "gpu"],
        "data.paths": ["a", "[a, b]", "[1]"],
        "data.keep_empty": ["false", "0"],
        "storage.tb_sync_every_s": ["300", "soon"],
    }
    for key, raws in cases.items():
        for raw in raws:
            try:
                config.load_config(None, [f"{key}={raw}"])
                accepted = True
            except errors.MuongenError:
                accepted = False
            assert check_value(yaml.safe_load(raw), table[key]) == accepted, (key, raw)


def test_describe_says_what_a_key_takes():
    assert describe({"choice": ["xy", "radial"]}) == "one of ['xy', 'radial']"
    assert describe({"any": ["bool", {"choice": ["cuda"]}]}) == "true or false or one of ['cuda']"
    assert describe({"list": "int"}) == "a list of an integer"
