"""Config tree: strictness (unknown keys, wrong types) and precedence."""

from __future__ import annotations

import pytest
import yaml

from muongen.config import Config, describe, from_dict, load_config, preset_names
from muongen.errors import ConfigError


def test_presets_ship_and_load():
    assert {"demo", "production-a100"} <= set(preset_names())
    prod = load_config("production-a100")
    # the original trainer's settings
    assert prod.data.batch_events == 48000
    assert prod.optim.n_critic == 5
    assert prod.optim.gp_every == 2 and prod.optim.gp_max_pairs == 4096
    assert prod.train.tf32 is True
    # the step recorded as CUDA graphs, compiled on CUDA only (the CPU step runs eagerly)
    assert prod.train.cuda_graphs is True and prod.train.compile == "cuda"


@pytest.mark.parametrize(("value", "want"), [("true", True), ("false", False), ("cuda", "cuda")])
def test_compile_takes_true_false_or_cuda(value, want):
    assert load_config("demo", [f"train.compile={value}"]).train.compile == want


def test_compile_refuses_other_words():
    with pytest.raises(ConfigError, match=r"train\.compile"):
        load_config("demo", ["train.compile=gpu"])


def test_precedence_defaults_file_overrides(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text(
        yaml.safe_dump({"optim": {"lr_critic": 3e-4, "n_critic": 3}, "train": {"seed": 7}})
    )
    cfg = load_config(str(f), ["optim.n_critic=4"])
    assert cfg.optim.lr_critic == pytest.approx(3e-4)  # file beats default
    assert cfg.optim.n_critic == 4  # override beats file
    assert cfg.train.seed == 7
    assert cfg.optim.lr_generator == Config().optim.lr_generator  # default kept


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("optim.lr_critc=1e-4", "optim.lr_critc"),
        ("nosection.x=1", "nosection"),
        ("optim.n_critic=three", "optim.n_critic"),
        ("train.device=tpu", "train.device"),
        ("data.keep_empty=maybe", "data.keep_empty"),
        ("optim.gp_fraction=1.5", "optim.gp_fraction"),
        ("train.step_shards=-1", "train.step_shards"),
        ("model.critic_log_radius_floor=0", "model.critic_log_radius_floor"),
        ("model.mult_hidden=[64, x]", "model.mult_hidden[1]"),
        ("train.calibrate_depth_bins=0", "train.calibrate_depth_bins"),
        ("train.calibrate_rows=-5", "train.calibrate_rows"),
    ],
)
def test_bad_overrides_name_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config("demo", [override])
    assert key in str(err.value)


def test_override_syntax_and_missing_file():
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["optim.lr_critic"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("nope.yaml")
    with pytest.raises(ConfigError, match="unknown preset"):
        load_config("no-such-preset")


def test_yaml_scientific_notation_string_becomes_float(tmp_path):
    # YAML 1.1 (PyYAML) reads 1e-4 without a dot as a string; we accept it as a number.
    f = tmp_path / "c.yaml"
    f.write_text("optim:\n  lr_critic: 1e-4\n")
    assert load_config(str(f)).optim.lr_critic == pytest.approx(1e-4)


def test_round_trip_through_dict_and_yaml():
    cfg = load_config("demo", ["model.representation=radial"])
    again = from_dict(yaml.safe_load(cfg.to_yaml()))
    assert again == cfg


def test_every_field_is_documented():
    text = describe()
    entries = text.split("\n")
    keys = [line for line in entries if not line.startswith("    ")]
    docs = [line for line in entries if line.startswith("    ")]
    assert len(keys) == len(docs) > 50
    assert all(d.strip() for d in docs), "a config field lacks its docstring"


@pytest.mark.parametrize(
    "content",
    [
        b"\x80\x02}q\x00(X\x05\x00\x00\x00model" + bytes(range(256)),  # a pickle / .pt
        b"PAR1\x15\x04\x15\x00\x00\x00",  # a Parquet file
        b"optim:\n  n_critic: 2\x00\x00\x00",  # valid UTF-8 with NUL bytes
    ],
)
def test_binary_config_file_is_a_one_line_config_error(tmp_path, content, capsys):
    from muongen.cli import main

    path = tmp_path / "model.pt"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=r"is not a YAML text file") as err:
        load_config(str(path))
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    assert main(["config", "--config", str(path)]) == 2  # the CLI: one line, no traceback
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_cosine_schedule_needs_a_horizon():
    with pytest.raises(ConfigError, match=r"optim\.decay_steps"):
        load_config("demo", ["train.max_steps=0"])
    cfg = load_config("demo", ["train.max_steps=0", "optim.decay_steps=5000"])
    assert cfg.optim.decay_steps == 5000


def test_a_preset_name_is_the_preset_beside_a_folder_of_that_name(tmp_path, monkeypatch):
    # `muongen train --out demo` leaves a folder `demo` in the working directory; the next
    # `--config demo` must still mean the preset, not "config file demo is a folder".
    monkeypatch.chdir(tmp_path)
    preset = load_config("demo")
    (tmp_path / "demo").mkdir()
    assert load_config("demo") == preset
    with pytest.raises(ConfigError, match="is a folder"):
        load_config("./demo")  # a path is still read as a path
