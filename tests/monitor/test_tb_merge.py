from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path

import pytest

from muongen.cli import main
from muongen.monitor.tb_merge import SOURCE_MARKER, parse_since, run_names
from muongen.monitor.tensorboard import read_scalars


def _events(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("events.out.tfevents.*"))


def _age(run_dir: Path, days: float) -> None:
    old = time.time() - days * 86400
    for f in _events(run_dir):
        os.utime(f, (old, old))


@pytest.fixture
def nodes(tmp_path, tb_run):
    # Two grid nodes' TB folders; both hold campA/r000 (a collision), node2 also r001.
    for node, ranges in {"node1": ["r000"], "node2": ["r000", "r001"]}.items():
        for i, rng in enumerate(ranges):
            tb_run(tmp_path / node / "tb" / "campA" / rng, steps=2 + i)
    tb_run(tmp_path / "node2" / "tb" / "campB" / "r000", steps=1)
    return tmp_path


def test_symlink_merge_with_collisions(nodes, capsys):
    out = nodes / "merged"
    src = [str(nodes / "node1/tb"), str(nodes / "node2/tb")]
    assert main(["tb-merge", *src, "--out", str(out)]) == 0
    runs = sorted(p.parent.relative_to(out).as_posix() for p in out.rglob("events.out.*"))
    assert runs == [
        "campA/r001",
        "campB/r000",
        "node1/tb/campA/r000",
        "node2/tb/campA/r000",
    ]
    linked = _events(out / "node2/tb/campA/r000")[0]
    assert linked.is_symlink()
    assert linked.resolve() == _events(nodes / "node2/tb/campA/r000")[0].resolve()
    assert read_scalars(out / "campA/r001")["loss/c_loss"] == [(0, 0.0), (1, 0.5), (2, 1.0)]
    text = capsys.readouterr().out
    assert "4 runs" in text and "4 event files linked" in text

    # A second merge adds nothing and keeps the names.
    assert main(["tb-merge", *src, "--out", str(out)]) == 0
    assert "0 event files linked, 4 unchanged" in capsys.readouterr().out


def test_copy_mode_copies_files(nodes):
    out = nodes / "copied"
    assert main(["tb-merge", str(nodes / "node2/tb/campB"), "--out", str(out), "--copy"]) == 0
    (copied,) = _events(out / "r000")
    assert not copied.is_symlink()
    assert copied.read_bytes() == _events(nodes / "node2/tb/campB/r000")[0].read_bytes()


def test_match_glob_and_since_filters(nodes, capsys):
    _age(nodes / "node1/tb/campA/r000", days=5)
    src = [str(nodes / "node1/tb"), str(nodes / "node2/tb")]

    out = nodes / "m1"
    assert main(["tb-merge", *src, "--out", str(out), "--match", r"campA/r00[01]$"]) == 0
    assert not (out / "campB").exists()
    assert (out / "campA/r001").is_dir()

    out = nodes / "m2"
    assert main(["tb-merge", *src, "--out", str(out), "--glob", "campB/*"]) == 0
    assert [p.name for p in out.iterdir()] == ["campB"]
    assert (out / "campB/r000").is_dir()
    assert not (out / "campA").exists()

    out = nodes / "m3"
    assert main(["tb-merge", *src, "--out", str(out), "--since", "2d"]) == 0
    # node1's old run is left out, so node2's campA/r000 no longer collides
    assert (out / "campA/r000").is_dir()
    assert os.path.realpath(_events(out / "campA/r000")[0]).startswith(str(nodes / "node2"))
    assert not (out / "node1").exists()

    since = (dt.datetime.now() - dt.timedelta(days=10)).date().isoformat()
    out = nodes / "m4"
    assert main(["tb-merge", *src, "--out", str(out), "--since", since]) == 0
    assert len(list(out.rglob("events.out.*"))) == 4


def test_dry_run_touches_nothing(nodes, capsys):
    out = nodes / "dry"
    assert main(["tb-merge", str(nodes / "node2/tb"), "--out", str(out), "--dry-run"]) == 0
    assert not out.exists()
    assert "would place" in capsys.readouterr().out


def test_nested_runs_and_out_inside_source(tmp_path, tb_run, capsys):
    tb_run(tmp_path / "tb", steps=1)  # a run at the top of SRC ...
    tb_run(tmp_path / "tb" / "r1", steps=2)  # ... and one inside it
    out = tmp_path / "tb" / "merged"  # OUT inside SRC is not merged into itself
    assert main(["tb-merge", str(tmp_path / "tb"), "--out", str(out)]) == 0
    assert len(_events(out / "tb")) == 1
    assert len(_events(out / "r1")) == 1
    assert (out / "r1" / SOURCE_MARKER).read_text().strip() == str((tmp_path / "tb/r1").resolve())
    assert main(["tb-merge", str(tmp_path / "tb"), "--out", str(out)]) == 0
    assert "2 runs" in capsys.readouterr().out.splitlines()[-2]


def test_name_taken_by_another_source_gets_a_suffix(tmp_path, tb_run):
    tb_run(tmp_path / "a" / "r0")
    tb_run(tmp_path / "b" / "r0")
    out = tmp_path / "out"
    assert main(["tb-merge", str(tmp_path / "a"), "--out", str(out)]) == 0
    assert main(["tb-merge", str(tmp_path / "b"), "--out", str(out)]) == 0  # separate merge
    assert sorted(p.name for p in out.iterdir()) == ["r0", "r0-2"]
    assert os.path.realpath(_events(out / "r0-2")[0]).startswith(str(tmp_path / "b"))


def test_run_names_number_identical_paths(tmp_path, tb_run):
    from muongen.monitor.tb_merge import find_runs

    tb_run(tmp_path / "x" / "r0")
    (run,) = find_runs([tmp_path / "x"])
    assert run_names([run, run]) == ["r0", "r0-2"]


def test_bad_arguments(tmp_path, capsys):
    assert main(["tb-merge", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) != 0
    assert "not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["tb-merge", str(tmp_path), "--out", str(tmp_path / "o"), "--since", "yesterday"])
    with pytest.raises(SystemExit):
        main(["tb-merge", str(tmp_path), "--out", str(tmp_path / "o"), "--match", "("])
    with pytest.raises(SystemExit):
        main(["tb-merge", str(tmp_path), "--out", str(tmp_path / "o"), "--copy", "--symlink"])


def test_parse_since():
    now = dt.datetime(2024, 5, 10, 12, tzinfo=dt.timezone.utc)
    assert parse_since("2d", now) == now - dt.timedelta(days=2)
    assert parse_since("90s", now) == now - dt.timedelta(seconds=90)
    assert parse_since("2024-05-01T00:00+00:00") == dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)
    assert parse_since("2024-05-01").tzinfo is not None


def _hparams_content(run_dir: Path):
    """{tag: HParamsPluginData} of the hparams plugin's summaries in one run folder."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    out = {}
    try:
        content = acc.PluginTagToContent("hparams")
    except KeyError:  # no hparams summaries in this run
        return out
    for tag, raw in content.items():
        data = HParamsPluginData()
        data.ParseFromString(raw)
        out[tag] = data
    return out


@pytest.fixture
def sweep_tb(tmp_path, tb_run):
    # A sweep's synced TensorBoard folders, tb/<campaign>/<member>/<range>/, each range
    # continuing the step count of the one before; and its leaderboard (scores, settings).
    members = {
        "lr_critic_1e-4+seed_0": ({"optim.lr_critic": 1e-4, "model.critic": "epic"}, 0, 2.5),
        "lr_critic_1e-3+seed_0": ({"optim.lr_critic": 1e-3, "model.critic": "pointnet"}, 0, 4.0),
    }
    from muongen.monitor.tensorboard import TensorBoardLogger

    for name in members:
        for i, rng in enumerate(["0000000-0000999", "0001000-0001999"]):
            with TensorBoardLogger(tmp_path / "tb" / "sw" / name / rng) as tb:
                for step in range(3 * i, 3 * i + 3):
                    tb.scalars(step, {"loss/c_loss": step * 0.5})
    tb_run(tmp_path / "tb" / "other" / "r000", steps=2)  # not a member: a run of its own
    board = {
        "format": "muongen-leaderboard",
        "members": [
            {"name": n, "settings": s, "seed": seed, "worst": w, "median": 1.1, "status": "ok"}
            for n, (s, seed, w) in members.items()
        ]
        + [{"name": "failed-one", "settings": {}, "seed": 1, "worst": None, "status": "failed"}],
    }
    (tmp_path / "board").mkdir()
    (tmp_path / "board" / "leaderboard.json").write_text(json.dumps(board))
    return tmp_path, members


def test_sweep_members_side_by_side_with_hparams(sweep_tb, capsys):
    from tensorboard.plugins.hparams import metadata

    root, _ = sweep_tb
    out = root / "merged"
    args = ["tb-merge", str(root / "tb"), "--out", str(out), "--members", str(root / "board")]
    assert main(args) == 0
    assert "2 sweep members" in capsys.readouterr().out
    # one run per member, its two ranges' events together; the other run stays apart
    runs = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert runs == ["lr_critic_1e-3+seed_0", "lr_critic_1e-4+seed_0", "other"]
    member = out / "lr_critic_1e-4+seed_0"
    assert len([p for p in _events(member) if p.is_symlink()]) == 2
    assert [s for s, _ in read_scalars(member)["loss/c_loss"]] == [0, 1, 2, 3, 4, 5]
    # the member's session: its settings and seed, and its score as a scalar
    session = _hparams_content(member)[metadata.SESSION_START_INFO_TAG].session_start_info
    assert session.hparams["optim.lr_critic"].number_value == pytest.approx(1e-4)
    assert session.hparams["model.critic"].string_value == "epic"
    assert session.hparams["seed"].number_value == 0
    assert read_scalars(member)["sweep/worst_ratio"] == [(0, 2.5)]
    # the experiment: every setting with its values, and the metrics
    experiment = _hparams_content(out)[metadata.EXPERIMENT_TAG].experiment
    infos = {h.name: h for h in experiment.hparam_infos}
    assert set(infos) == {"optim.lr_critic", "model.critic", "seed"}
    critic = [v.string_value for v in infos["model.critic"].domain_discrete.values]
    assert critic == ["epic", "pointnet"]
    assert {m.name.tag for m in experiment.metric_infos} == {
        "sweep/worst_ratio",
        "sweep/median_ratio",
    }
    assert not _hparams_content(out / "other")  # not a member: no session
    # a second merge replaces its own hparams files and links nothing new
    assert main(args) == 0
    assert "0 event files linked, 5 unchanged" in capsys.readouterr().out
    assert len(list(member.glob("*.muongen-hparams"))) == 1
    assert len(list(out.glob("*.muongen-hparams"))) == 1


def test_members_file_that_is_missing_is_one_line(tmp_path, tb_run, capsys):
    tb_run(tmp_path / "tb" / "r0")
    args = ["tb-merge", str(tmp_path / "tb"), "--out", str(tmp_path / "o"), "--members"]
    assert main([*args, str(tmp_path)]) == 2
    assert "no leaderboard.json or members.json there" in capsys.readouterr().err
