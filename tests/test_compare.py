"""`muongen compare`: the leaderboard of a sweep's evaluations.

The metrics.json files are real: :func:`floors.compare` scores toy models (a perfect one
and shifted ones) against toy held-out events, and :func:`report.write_metrics_json`
writes them, as `muongen evaluate` does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from muongen.cli import main
from muongen.compare import gather, settings_from_name
from muongen.evaluate.features import EventSample
from muongen.evaluate.floors import compare as score
from muongen.evaluate.report import write_metrics_json
from muongen.leaderboard import log_spaced

SETTINGS = {"a": {"optim.lr_critic": 1e-4}, "b": {"optim.lr_critic": 1e-3}}


def toy(n: int, seed: int, shift: float = 0.0, conditions=None) -> EventSample:
    """Toy events: multiplicity rising with energy, muon log10 E ~ N(2 + shift, 0.5)."""
    rng = np.random.default_rng(seed)
    if conditions is None:
        conditions = np.stack(
            [
                10.0 ** rng.uniform(5, 8, n),
                rng.uniform(0.0, 1.2, n),
                rng.choice([1.0, 4.0, 56.0], n),
                rng.choice(np.linspace(1000.0, 2800.0, 100), n),
            ],
            axis=1,
        )
    counts = rng.poisson(np.exp(np.log10(conditions[:, 0]) - 5.5) * np.cos(conditions[:, 1]))
    n_mu = int(counts.sum())
    r, phi = rng.exponential(20.0, n_mu), rng.uniform(0.0, 2 * np.pi, n_mu)
    muons = np.stack(
        [10.0 ** rng.normal(2 + shift, 0.5, n_mu), r * np.sin(phi), r * np.cos(phi)], 1
    )
    return EventSample.from_arrays(conditions, muons, counts)


@pytest.fixture(scope="module")
def results() -> dict[float, dict]:
    """Real evaluation results of toy models whose muon energies are off by a shift (0:
    as good as the floor; larger: worse), each scored once for the module."""
    real = toy(400, seed=1)
    out = {}
    for shift in (0.0, 0.15, 0.4):
        model = toy(400, seed=2, shift=shift, conditions=real.conditions)
        out[shift] = score(real, {"model": model}, n_splits=3, min_events=20, seed=0)
    return out


def write_member(folder: Path, result: dict, **meta) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return write_metrics_json(folder / "metrics.json", {**result, "meta": meta})


@pytest.fixture
def sweep(tmp_path, results) -> Path:
    """A sweep's folder as the local sweep lays it out: members.json and, per member,
    eval/metrics.json; 2 settings x 2 seeds scored, one member never evaluated (its chain
    failed) and one whose metrics.json is truncated."""
    root = tmp_path / "sweep"
    members = {}
    quality = {("a", 0): 0.15, ("a", 1): 0.0, ("b", 0): 0.4, ("b", 1): 0.4}
    for (setting, seed), shift in quality.items():
        name = f"{setting}-s{seed}"
        members[name] = {"settings": SETTINGS[setting], "seed": seed}
        write_member(root / name / "eval", results[shift], checkpoint=f"/nowhere/{name}.json")
    members["c-s0"] = {"settings": {"optim.lr_critic": 3e-3}, "seed": 0}
    members["c-s1"] = {"settings": {"optim.lr_critic": 3e-3}, "seed": 1}
    broken = root / "c-s1" / "eval" / "metrics.json"
    broken.parent.mkdir(parents=True)
    broken.write_text('{"summary": {"median_ra')
    (root / "members.json").write_text(json.dumps(members))
    return root


def test_leaderboard_ranks_members_and_reports_failed_ones(sweep, tmp_path, capsys):
    board = tmp_path / "board"
    assert main(["compare", str(sweep), "--out", str(board)]) == 0
    doc = json.loads((board / "leaderboard.json").read_text())
    rows = {m["name"]: m for m in doc["members"]}
    assert set(rows) == {"a-s0", "a-s1", "b-s0", "b-s1", "c-s0", "c-s1"}
    ok = [m for m in doc["members"] if m["status"] == "ok"]
    # ranked by the worst ratio, then the median: the floor-like model (a, seed 1) first
    assert ok[0]["name"] == doc["best"] == "a-s1"
    worst = [m["worst"] for m in ok]
    assert worst == sorted(worst) and worst[0] < worst[-1]
    assert [m["rank"] for m in ok] == [1, 2, 3, 4]
    assert rows["a-s1"]["settings"] == {"optim.lr_critic": 1e-4} and rows["a-s1"]["seed"] == 1
    # failed rows, not a crash: never evaluated, and unreadable
    assert rows["c-s0"]["status"] == "failed" and "no metrics.json" in rows["c-s0"]["error"]
    assert rows["c-s1"]["status"] == "failed" and "not JSON" in rows["c-s1"]["error"]
    assert rows["c-s1"]["rank"] is None
    # the spread over seeds per setting
    spread = {r["setting"]: r for r in doc["spread"]}
    a = spread["optim.lr_critic=0.0001"]
    assert sorted(a["seeds"]) == [0, 1] and a["failed"] == 0
    assert a["worst"]["min"] == rows["a-s1"]["worst"] and a["worst"]["max"] == rows["a-s0"]["worst"]
    assert a["worst"]["std"] > 0
    assert spread["optim.lr_critic=0.003"]["failed"] == 2
    # one plot per swept parameter, on a log axis (1e-4 .. 3e-3)
    assert doc["swept"] == ["optim.lr_critic"]
    png = board / doc["plots"][0]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (board / "leaderboard.md").read_text()
    assert "**Best member: a-s1**" in md and "lowest worst ratio" in md
    assert "failed: no metrics.json" in md and f"![{png.stem}]({png.name})" in md
    assert "## Spread over seeds" in md
    assert "2 failed" in capsys.readouterr().out


def test_tail_rows_shown_where_present_and_dash_elsewhere(tmp_path, results):
    # summary["tail"] as muongen evaluate writes it (floors.py): name -> row
    tail = {
        "top_energy_decade": {
            "median_ratio": 1.3,
            "worst_ratio": 2.5,
            "worst": "x",
            "n_events": 300,
            "range": "1e7-1e8 GeV",
            "n_metrics": 12,
            "worst_no_output": False,
        },
        "rich_bundles": {
            "median_ratio": None,
            "worst_ratio": None,
            "worst": None,
            "n_events": 14,
            "range": "100+ muons",
            "n_metrics": 0,
            "worst_no_output": False,
        },
    }
    with_tail = {**results[0.0], "summary": {**results[0.0]["summary"], "tail": tail}}
    write_member(tmp_path / "in" / "lr=1e-4,seed=0", with_tail)
    old = {k: v for k, v in results[0.4]["summary"].items() if k != "tail"}  # an older evaluate
    write_member(tmp_path / "in" / "lr=1e-3,seed=0", {**results[0.4], "summary": old})
    board = tmp_path / "board"
    assert main(["compare", str(tmp_path / "in"), "--out", str(board)]) == 0
    md = (board / "leaderboard.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| rank"))
    names = [c.strip() for c in header.strip().strip("|").split("|")]
    rows = [ln for ln in md.splitlines() if ln.startswith("| 1 ") or ln.startswith("| 2 ")]
    cells = [dict(zip(names, (c.strip() for c in r.strip().strip("|").split("|")))) for r in rows]
    first, second = cells
    assert first["member"] == "lr=1e-4,seed=0"
    assert first["tail 1e7-1e8 GeV: worst (median)"] == "2.5 (1.3)"
    assert first["tail 100+ muons: worst (median)"] == "n/a (14 events)"
    assert second["tail 1e7-1e8 GeV: worst (median)"] == "-"  # no tail rows: '-'
    assert second["tail 100+ muons: worst (median)"] == "-"
    doc = json.loads((board / "leaderboard.json").read_text())
    by = {m["name"]: m for m in doc["members"]}
    # no members.json: the settings come from the member's name
    assert by["lr=1e-4,seed=0"]["settings"] == {"lr": 1e-4, "seed": 0}
    assert by["lr=1e-4,seed=0"]["seed"] == 0
    assert by["lr=1e-4,seed=0"]["tail"]["top_energy_decade"]["worst"] == 2.5
    assert by["lr=1e-3,seed=0"]["tail"] == {}


def test_wall_time_and_events_from_the_local_chain(tmp_path, results):
    # A member's local chain: <member>/<range>/<range>.json beside run-<range>/summary.json.
    member = tmp_path / "m1"
    for i, rng in enumerate(["0000000-0000999", "0001000-0001999"]):
        run = member / rng / f"run-{rng}"
        run.mkdir(parents=True)
        summary = {"wall_s": 30.0 + i, "events_seen": 600 * (i + 1), "step": 10 * (i + 1)}
        (run / "summary.json").write_text(json.dumps(summary))
    manifest = member / "0001000-0001999" / "0001000-0001999.json"
    metrics = write_member(member / "eval", results[0.15], checkpoint=str(manifest), step=20)
    [m] = gather([str(metrics)])
    assert m.status == "ok" and m.name == "m1"
    assert m.wall_s == 61.0 and m.events_seen == 1200 and m.step == 20
    board = tmp_path / "board"
    assert main(["compare", str(metrics), "--out", str(board)]) == 0
    assert "| 61 s " in (board / "leaderboard.md").read_text()
    assert "1,200" in (board / "leaderboard.md").read_text()


def test_no_evaluations_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["compare", str(tmp_path / "empty"), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "no metrics.json under" in err and "muongen evaluate" in err


def test_a_board_compare_did_not_write_is_kept(sweep, tmp_path, capsys):
    board = tmp_path / "board"
    board.mkdir()
    (board / "leaderboard.md").write_text("my notes\n")
    assert main(["compare", str(sweep), "--out", str(board)]) == 2
    assert "--force" in capsys.readouterr().err
    assert (board / "leaderboard.md").read_text() == "my notes\n"
    assert main(["compare", str(sweep), "--out", str(board), "--force"]) == 0
    # its own board is refreshed without --force
    assert main(["compare", str(sweep), "--out", str(board)]) == 0


def test_settings_from_name_and_log_axis():
    assert settings_from_name("lr_critic=3e-4,critic_local_width=64,seed=1") == (
        {"lr_critic": 3e-4, "critic_local_width": 64, "seed": 1},
        1,
    )
    assert settings_from_name("3f9a1c2e") == ({}, None)
    assert log_spaced([1e-4, 3e-4]) and not log_spaced([32, 64]) and not log_spaced(["a", "b"])


@pytest.mark.integration
def test_members_read_over_pelican(tmp_path, results, monkeypatch):
    # The compare node reads published evaluations through storage (pelican:// here).
    sys.path.append(str(Path(__file__).resolve().parent))
    from pelican_federation import Federation

    from muongen.storage import files

    with Federation(tmp_path / "fed") as fed:
        monkeypatch.setenv("SSL_CERT_FILE", fed.ca_file)
        files.clear_caches()
        try:
            for name, shift in (("x-s0", 0.0), ("x-s1", 0.4)):
                local = write_member(tmp_path / "src" / name / "eval", results[shift])
                fed.put_bytes(f"/public/sweep/{name}/eval/metrics.json", local.read_bytes())
            fed.put_bytes(
                "/public/sweep/members.json",
                json.dumps({"x-s0": {"settings": {"k": 1}, "seed": 0}}).encode(),
            )
            url = fed.url("/public/sweep")
            board = tmp_path / "board"
            assert main(["compare", url, "--out", str(board)]) == 0
        finally:
            files.clear_caches()
    doc = json.loads((board / "leaderboard.json").read_text())
    by = {m["name"]: m for m in doc["members"]}
    assert doc["best"] == "x-s0" and by["x-s0"]["settings"] == {"k": 1}
    assert by["x-s1"]["status"] == "ok" and by["x-s1"]["source"].startswith("pelican://")


def test_a_grid_scratch_checkpoint_reads_nothing_here(tmp_path, results, monkeypatch):
    # On the grid, evaluate records the checkpoint as its scratch dir named it (relative);
    # the compare node must not take summaries of whatever folder it runs in for it.
    run = tmp_path / "0000000-0000999" / "run-0000000-0000999"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"wall_s": 5.0, "events_seen": 99}))
    metrics = write_member(tmp_path / "m" / "eval", results[0.0], checkpoint="0001000-0001999.json")
    monkeypatch.chdir(tmp_path)
    [m] = gather([str(metrics)])
    assert m.status == "ok" and m.wall_s is None and m.events_seen is None
