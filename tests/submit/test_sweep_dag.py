"""A sweep's DAG directory (2 settings x 2 seeds x 3 ranges), written and parsed back.

The structure the issue asks for: one chain per member (a SUBDAG EXTERNAL, throttled by
MAXJOBS on its category), an evaluate node after each chain, a FINAL compare node that runs
also after a failed member, every member's checkpoints and TensorBoard in its own folder.
"""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path

import htcondor2
import pytest
import yaml

from submit import constants as C
from submit.__main__ import main
from submit.campaign import load_campaign, plan_nodes
from submit.errors import CampaignError
from submit.sweep import member_campaign, members

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "submit" / "examples" / "sweep.yaml"
CKPT = "osdf:///ospool/ap21/data/jdoe/muongen/ckpt/h4a-lr-sweep-v1"
TB = "osdf:///ospool/ap21/data/jdoe/muongen/tb/h4a-lr-sweep-v1"
MEMBERS = [
    "lr_critic_1e-5+seed_0",
    "lr_critic_1e-5+seed_1",
    "lr_critic_2e-5+seed_0",
    "lr_critic_2e-5+seed_1",
]
RANGES = ["0000000-0000999", "0001000-0001999", "0002000-0002999"]


def parse_dag(path: Path) -> dict:
    """The DAG file's commands, as DAGMan reads them (the subset the writer emits)."""
    dag = {
        "jobs": {}, "subdags": {}, "final": None, "edges": defaultdict(set), "retry": {},
        "category": {}, "maxjobs": {}, "scripts": {}, "vars": {}, "status_file": None,
    }  # fmt: skip
    for line in path.read_text().splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        head = words[0]
        if head == "JOB":
            dag["jobs"][words[1]] = words[2]
        elif head == "SUBDAG":
            assert words[1] == "EXTERNAL" and words[4] == "DIR", line
            dag["subdags"][words[2]] = (words[3], words[5])
        elif head == "FINAL":
            dag["final"] = (words[1], words[2])
        elif head == "PARENT":
            split = words.index("CHILD")
            for parent in words[1:split]:
                dag["edges"][parent].update(words[split + 1 :])
        elif head == "RETRY":
            dag["retry"][words[1]] = " ".join(words[2:])
        elif head == "CATEGORY":
            dag["category"][words[1]] = words[2]
        elif head == "MAXJOBS":
            dag["maxjobs"][words[1]] = int(words[2])
        elif head == "SCRIPT":
            kind = words.index("POST") if "POST" in words else words.index("PRE")
            dag["scripts"][(words[kind + 1], words[kind])] = words[kind + 2 :]
        elif head == "VARS":
            dag["vars"][words[1]] = words[2:]
        elif head == "NODE_STATUS_FILE":
            dag["status_file"] = words[1]
        elif head == "CONFIG":
            pass
        else:
            raise AssertionError(f"unexpected DAG command: {line}")
    return dag


def load_sub(path: Path) -> htcondor2.Submit:
    return htcondor2.Submit(path.read_text())


@pytest.fixture
def sweep_dir(tmp_path, jobs_dir):
    """`python -m submit write` on the example sweep, into a fresh folder."""
    out = tmp_path / "lr"
    assert main(["write", str(EXAMPLE), "--out", str(out)]) == 0
    return out


def test_the_example_makes_four_members(sweep_dir):
    campaign = load_campaign(EXAMPLE)
    assert [m.name for m in members(campaign)] == MEMBERS
    assert json.loads((sweep_dir / C.SWEEP_INDEX).read_text()) == [
        {"member": m, "chain": f"chain_0{i}", "evaluate": f"eval_0{i}"}
        for i, m in enumerate(MEMBERS)
    ]
    table = json.loads((sweep_dir / C.METRICS_DIR / C.MEMBERS_FILE).read_text())
    assert list(table) == MEMBERS
    assert table["lr_critic_2e-5+seed_1"]["settings"] == {"optim.lr_critic": 2e-5}
    assert table["lr_critic_2e-5+seed_1"]["seed"] == 1


def test_top_dag_is_chains_then_evaluations_then_a_final_compare(sweep_dir):
    dag = parse_dag(sweep_dir / C.DAG_FILE)
    chains = [f"chain_0{i}" for i in range(4)]
    evals = [f"eval_0{i}" for i in range(4)]
    # one SUBDAG per member, each in its own folder, throttled as chains
    assert dag["subdags"] == {
        c: (C.DAG_FILE, f"{C.CHAINS_DIR}/{m}") for c, m in zip(chains, MEMBERS)
    }
    assert dag["category"] == dict.fromkeys(chains, C.CHAINS_CATEGORY)
    assert dag["maxjobs"] == {C.CHAINS_CATEGORY: 4}  # dagman.max_running of the example
    # each evaluate node is the child of its own chain only; nothing else has edges
    assert dag["jobs"] == {e: f"{e}.sub" for e in evals}
    assert dict(dag["edges"]) == {c: {e} for c, e in zip(chains, evals)}
    assert dag["retry"] == dict.fromkeys(evals, "3 UNLESS-EXIT 2")
    # compare is FINAL: it runs after every node, also after failures; its POST decides
    assert dag["final"] == (C.COMPARE_NODE, f"{C.COMPARE_NODE}.sub")
    assert C.COMPARE_NODE not in dag["edges"] and C.COMPARE_NODE not in dag["retry"]
    post = dag["scripts"][(C.COMPARE_NODE, "POST")]
    assert post == [C.FINAL_CHECK, "--job-return", "$RETURN", "--dag-status", "$DAG_STATUS",
                    "--failed", "$FAILED_COUNT"]  # fmt: skip
    assert dag["status_file"] == C.STATUS_FILE
    for name in (C.EVALUATE_WRAPPER, C.COMPARE_WRAPPER, C.FINAL_CHECK, f"{C.COMPARE_NODE}.sub"):
        assert (sweep_dir / name).is_file(), name


def test_each_member_chain_is_three_ranges_in_its_own_folders(sweep_dir):
    for member in MEMBERS:
        chain_dir = sweep_dir / C.CHAINS_DIR / member
        dag = parse_dag(chain_dir / C.DAG_FILE)
        nodes = [C.NODE_PREFIX + r for r in RANGES]
        assert dag["jobs"] == {n: f"{n}.sub" for n in nodes}
        assert dict(dag["edges"]) == {nodes[0]: {nodes[1]}, nodes[1]: {nodes[2]}}
        assert set(dag["scripts"]) == {(n, "POST") for n in nodes}
        assert dag["maxjobs"] == {C.CATEGORY: 1}  # a chain: one range at a time
        for name in (C.NODE_WRAPPER, C.POST_SCRIPT):
            assert (chain_dir / name).is_file()
        for i, r in enumerate(RANGES):
            sub = load_sub(chain_dir / f"{C.NODE_PREFIX}{r}.sub")
            args = sub["arguments"].strip('"').split()
            sets = [args[j + 1] for j, a in enumerate(args) if a == "--set"]
            lr = member.split("+")[0].split("_")[-1]
            seed = member.rsplit("_", 1)[-1]
            # the campaign's overrides, then the member's setting, then its seed
            mine = [f"optim.lr_critic={lr[0]}.0e{lr[2:]}", f"train.seed={seed}"]
            assert sets == ["optim.lr_generator=2e-5", "storage.prefetch=8", *mine]
            assert args[args.index("--tb-dest") + 1] == f"{TB}/{member}/{r}"
            assert f"{r}.pt = {CKPT}/{member}/{r}.pt" in sub["transfer_output_remaps"]
            if i:
                assert f"{CKPT}/{member}/{RANGES[i - 1]}.json" in sub["transfer_input_files"]


def test_evaluate_nodes_score_the_last_range_and_publish_metrics(sweep_dir):
    campaign = load_campaign(EXAMPLE)
    for i, member in enumerate(members(campaign)):
        last = plan_nodes(member_campaign(campaign, member))[-1]
        assert last.range_name == RANGES[-1]
        sub = load_sub(sweep_dir / f"eval_0{i}.sub")
        assert sub["executable"] == C.EVALUATE_WRAPPER
        args = sub["arguments"].strip('"').split()
        assert args == [
            "--checkpoint", f"{RANGES[-1]}.json",
            "--data", "pelican://osg-htc.org/icecube/simulation/muonitron/"
                      "corsika-20904-h4a-heldout/*.parquet",
            "--events", "100000",
        ]  # fmt: skip
        inputs = [f.strip() for f in sub["transfer_input_files"].split(",")]
        assert inputs == [f"{CKPT}/{member.name}/{RANGES[-1]}.pt",
                          f"{CKPT}/{member.name}/{RANGES[-1]}.json"]  # fmt: skip
        remaps = dict(
            part.split(" = ") for part in sub["transfer_output_remaps"].strip('"').split("; ")
        )
        assert remaps == {
            C.METRICS_FILE: f"{CKPT}/{member.name}/{C.METRICS_FILE}",
            C.METRICS_RECEIPT: f"{C.METRICS_DIR}/{member.name}/{C.METRICS_FILE}",
        }
        # HTCondor needs the folder of an access-point remap to exist
        assert (sweep_dir / C.METRICS_DIR / member.name).is_dir()
        assert sub["request_gpus"] == "1"


def test_compare_reads_what_came_back_and_writes_the_board(sweep_dir):
    sub = load_sub(sweep_dir / f"{C.COMPARE_NODE}.sub")
    assert sub["executable"] == C.COMPARE_WRAPPER
    assert sub["arguments"].strip('"').split() == [C.METRICS_DIR, "--out", C.BOARD_DIR]
    assert sub["transfer_input_files"] == C.METRICS_DIR
    assert sub["transfer_output_files"] == C.BOARD_DIR
    assert "request_gpus" not in sub


def test_plan_lists_the_members(capsys):
    assert main(["plan", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "sweep: 4 members" in out and "4 chain(s) at a time" in out
    for member in MEMBERS:
        assert member in out
    assert f"{CKPT}/lr_critic_1e-5+seed_0/0000000-0000999.pt" in out


def test_a_bad_member_key_is_refused_before_anything_is_written(tmp_path, jobs_dir, capsys):
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["sweep"]["parameters"]["model.critic_widht"] = [32, 64]
    campaign = tmp_path / "bad.yaml"
    campaign.write_text(yaml.safe_dump(raw, sort_keys=False))
    out = tmp_path / "dag"
    assert main(["write", str(campaign), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {campaign}: member lr_critic_1e-5+critic_widht_32+seed_0: ")
    assert "model.critic_widht: not a muongen config key (did you mean model.critic_local" in err
    assert "\n" not in err
    assert not out.exists()


def test_grid_evaluation_data_must_be_reachable_from_a_node(tmp_path, jobs_dir):
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["evaluation"]["data"] = "file:///home/jdoe/heldout/*.parquet"
    campaign = tmp_path / "local.yaml"
    campaign.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(CampaignError, match=r"evaluation\.data: a grid node cannot read"):
        from submit.dag import write_campaign_dag

        write_campaign_dag(load_campaign(campaign), tmp_path / "dag")
    assert not (tmp_path / "dag").exists()


def test_status_shows_members_as_rows(sweep_dir, capsys):
    # A node status file as DAGMan writes it mid-sweep: member 0 done and evaluated,
    # member 1's chain failed (its evaluation futile), members 2-3 still running.
    states = {"chain_00": 5, "eval_00": 5, "chain_01": 6, "eval_01": 7, "chain_02": 3,
              "eval_02": 0, "chain_03": 1, "eval_03": 0}  # fmt: skip
    ads = ['[ Type = "DagStatus"; DagStatus = 3; Timestamp = 1764770000; ]']
    ads += [f'[ Type = "NodeStatus"; Node = "{n}"; NodeStatus = {s}; ]' for n, s in states.items()]
    ads.append('[ Type = "StatusEnd"; ]')
    (sweep_dir / C.STATUS_FILE).write_text("\n".join(ads) + "\n")
    first = sweep_dir / C.CHAINS_DIR / MEMBERS[0]
    for step, r in enumerate(RANGES, 1):
        (first / C.RECEIPTS_DIR / f"{r}.json").write_text(json.dumps({"step": 1000 * step}))
    (sweep_dir / C.METRICS_DIR / MEMBERS[0] / C.METRICS_FILE).write_text("{}")
    assert main(["status", str(sweep_dir)]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:6]}
    assert rows[MEMBERS[0]] == ["done", "3/3", "3000", "done", "yes"]
    assert rows[MEMBERS[1]] == ["failed", "0/3", "futile", "-"]
    assert rows[MEMBERS[2]] == ["submitted", "0/3", "not", "ready", "-"]
    assert "4 members, 1 evaluated" in out
    assert f"failed: {MEMBERS[1]};" in out
    assert "compare: not ready; leaderboard: not written yet" in out


def test_a_second_write_of_a_submitted_sweep_is_refused(sweep_dir, capsys):
    (sweep_dir / (C.DAG_FILE + C.CONDOR_SUB_SUFFIX)).write_text("")
    assert main(["write", str(EXAMPLE), "--out", str(sweep_dir)]) == 2
    assert "already submitted" in capsys.readouterr().err


def test_rewriting_an_unsubmitted_sweep_is_fine(sweep_dir):
    shutil.rmtree(sweep_dir / C.CHAINS_DIR / MEMBERS[0])
    assert main(["write", str(EXAMPLE), "--out", str(sweep_dir)]) == 0
    assert (sweep_dir / C.CHAINS_DIR / MEMBERS[0] / C.DAG_FILE).is_file()
