"""The DAG directory for a 5-range campaign, parsed back (no HTCondor daemons needed)."""

from __future__ import annotations

import itertools
import re

import htcondor2
import pytest

from submit import constants as C
from submit.campaign import parse_campaign, plan_nodes
from submit.dag import write_campaign_dag
from submit.errors import CampaignError, DagDirError

RANGES = [f"000{i}000-000{i}999" for i in range(5)]
NODES = [C.NODE_PREFIX + r for r in RANGES]
CKPT = "osdf:///ospool/ap21/data/jdoe/ckpt/test-camp"


def parse_condor_arguments(value: str) -> list[str]:
    """Inverse of HTCondor's new arguments syntax (what condor_submit does with it)."""
    assert value[0] == value[-1] == '"', value
    text, args, current, quoted, started, i = value[1:-1], [], [], False, False, 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            assert text[i + 1] == '"', "a lone double quote ends the value"
            current.append('"')
            started, i = True, i + 2
        elif quoted and ch == "'":
            if text[i + 1 : i + 2] == "'":
                current.append("'")
                i += 2
            else:
                quoted, i = False, i + 1
        elif quoted:
            current.append(ch)
            i += 1
        elif ch == "'":
            quoted = started = True
            i += 1
        elif ch in " \t":
            if started:
                args.append("".join(current))
                current, started = [], False
            i += 1
        else:
            current.append(ch)
            started, i = True, i + 1
    if started:
        args.append("".join(current))
    return args


def dag_lines(out, keyword):
    return [line.split() for line in (out / C.DAG_FILE).read_text().splitlines()
            if line.split()[:1] == [keyword]]  # fmt: skip


@pytest.fixture
def written(tmp_path, campaign_text, jobs_dir):
    """The DAG directory written for the 5-range campaign."""
    campaign = parse_campaign(campaign_text(), source="camp.yaml")
    out = tmp_path / "dag"
    write_campaign_dag(campaign, out, campaign_text=campaign_text())
    return out


def test_five_jobs_in_a_four_edge_chain(written):
    jobs = dag_lines(written, "JOB")
    assert [j[1] for j in jobs] == NODES
    assert [j[2] for j in jobs] == [n + ".sub" for n in NODES]
    edges = [(e[1], e[3]) for e in dag_lines(written, "PARENT")]
    assert all(e[2] == "CHILD" and len(e) == 4 for e in dag_lines(written, "PARENT"))
    assert edges == list(itertools.pairwise(NODES))


def test_every_node_has_retry_post_vars_and_category(written):
    # a user error (exit 2, what every muongen verb exits with for one) is never retried:
    # the POST script passes the job's exit code on, and DAGMan stops the node at once
    user_error = str(C.EXIT_USER_ERROR)
    retry = {tuple(r[1:]) for r in dag_lines(written, "RETRY")}
    assert retry == {(n, "2", "UNLESS-EXIT", user_error) for n in NODES}
    scripts = {s[5]: s for s in dag_lines(written, "SCRIPT")}
    assert set(scripts) == set(NODES)
    for rng, node in zip(RANGES, NODES):
        s = scripts[node]
        assert s[1:6] == ["DEBUG", f"logs/{node}.post.log", "ALL", "POST", node]
        assert s[6:] == [
            C.POST_SCRIPT, f"receipts/{rng}.json", "--manifest-only",
            "--expect-range", rng, "--job-return", "$RETURN",
        ]  # fmt: skip
    dag_vars = {v[1]: v[2:] for v in dag_lines(written, "VARS")}
    assert dag_vars == {n: ['campaign="test-camp"', f'range="{r}"'] for n, r in zip(NODES, RANGES)}
    assert {(c[1], c[2]) for c in dag_lines(written, "CATEGORY")} == {(n, "train") for n in NODES}


def test_category_throttle_is_maxjobs_not_category(written):
    assert dag_lines(written, "MAXJOBS") == [["MAXJOBS", "train", "1"]]
    # htcondor2.dags' max_jobs_by_category would write "CATEGORY train 1": a node named
    # "train" put into category "1". No CATEGORY line may name the category as its node.
    assert all(line[1] in NODES for line in dag_lines(written, "CATEGORY"))


def test_status_file_and_dagman_config(written):
    assert dag_lines(written, "NODE_STATUS_FILE") == [["NODE_STATUS_FILE", C.STATUS_FILE, "60"]]
    assert dag_lines(written, "CONFIG") == [["CONFIG", "dagman.config"]]
    config = dict(
        line.split(" = ") for line in (written / "dagman.config").read_text().splitlines()
    )
    assert config == {"DAGMAN_MAX_JOBS_IDLE": "7"}


def test_directory_is_self_contained(written):
    for name in (C.NODE_WRAPPER, C.POST_SCRIPT):
        assert (written / name).stat().st_mode & 0o111
    assert (written / C.LOGS_DIR).is_dir() and (written / C.RECEIPTS_DIR).is_dir()
    assert parse_campaign((written / C.CAMPAIGN_COPY).read_text()).name == "test-camp"


def load_sub(out, node) -> htcondor2.Submit:
    return htcondor2.Submit((out / f"{node}.sub").read_text())


def test_each_submit_file_parses_and_carries_the_job_settings(written):
    for node in NODES:
        sub = load_sub(written, node)
        assert sub["universe"] == "container"
        assert sub["container_image"] == "osdf:///ospool/ap21/data/jdoe/muongen.sif"
        assert sub["executable"] == C.NODE_WRAPPER
        assert (sub["request_gpus"], sub["request_cpus"]) == ("1", "4")
        assert (sub["request_memory"], sub["request_disk"]) == ("24GB", "40GB")
        assert sub["gpus_minimum_capability"] == "8.0"
        assert sub["checkpoint_exit_code"] == "85"
        assert sub["transfer_checkpoint_files"] == f"run-{node[len(C.NODE_PREFIX) :]}"
        assert sub["My.JobDurationCategory"] == '"Long"'
        assert sub["My.ProjectName"] == '"IceCube"'
        assert sub["My.MuongenRange"] == '"$(range)"'  # filled from the node's VARS
        assert sub["should_transfer_files"] == "YES"
        assert sub["when_to_transfer_output"] == "ON_SUCCESS"  # failures reach DAGMan's RETRY
        assert (sub["success_exit_code"], sub["max_retries"]) == ("0", "0")
        assert sub["log"] == f"logs/{node}.log"
        assert sub["output"] == f"logs/{node}.$(RETRY).out"
        assert sub["error"] == f"logs/{node}.$(RETRY).err"
        assert "HoldReasonCode =?= 13" in sub["periodic_release"]
        assert "HoldReasonCode =?= 12" in sub["periodic_release"]
        assert "NumHolds <= 5" in sub["periodic_release"]
        assert "NumHolds > 5" in sub["periodic_remove"]
        assert sub["on_exit_hold"] == "ExitCode =?= 75"
        assert "use_oauth_services" not in sub and "getenv" not in sub


def remap_dict(value: str) -> dict[str, str]:
    assert value[0] == value[-1] == '"'
    return dict(part.split(" = ") for part in value[1:-1].split("; "))


def test_checkpoints_flow_from_node_to_node(written):
    for i, (rng, node) in enumerate(zip(RANGES, NODES)):
        sub = load_sub(written, node)
        if i == 0:
            assert "transfer_input_files" not in sub  # the first range starts fresh
        else:
            prev = RANGES[i - 1]
            assert sub["transfer_input_files"].split(", ") == [
                f"{CKPT}/{prev}.pt",
                f"{CKPT}/{prev}.json",
            ]
        assert sub["transfer_output_files"].split(", ") == [
            f"{rng}.pt",
            f"{rng}.json",
            "receipt.json",
        ]
        assert remap_dict(sub["transfer_output_remaps"]) == {
            f"{rng}.pt": f"{CKPT}/{rng}.pt",
            f"{rng}.json": f"{CKPT}/{rng}.json",
            "receipt.json": f"receipts/{rng}.json",
        }


def test_arguments_follow_the_node_contract(written):
    for i, (rng, node) in enumerate(zip(RANGES, NODES)):
        argv = parse_condor_arguments(load_sub(written, node)["arguments"])
        assert argv == [
            "--campaign-name", "test-camp",
            "--range", rng,
            "--prev-manifest", f"{RANGES[i - 1]}.json" if i else "",
            "--data-glob", f"pelican://osg-htc.org/icecube/sim/muonitron/{rng}/*.parquet",
            "--ckpt-dest", "",
            "--tb-dest", f"osdf:///ospool/ap21/data/jdoe/tb/test-camp/{rng}",
            "--preset", "production-a100",
            "--set", "optim.lr=2e-5",
            "--set", "data.batch_events=48000",
            "--self-checkpoint-s", "1800",
        ]  # fmt: skip


def test_argument_quoting_round_trips():
    from submit.description import condor_arguments

    argv = ["plain", "", "two words", "it's", 'say "hi"', "tab\there", "*.parquet"]
    assert parse_condor_arguments(condor_arguments(argv)) == argv


def test_no_token_text_in_any_written_file(tmp_path, campaign_text, jobs_dir, monkeypatch):
    secret = "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJqZG9lIn0.SECRET-SIGNATURE-abc123"
    token_file = tmp_path / "token"
    token_file.write_text(secret)
    monkeypatch.setenv("BEARER_TOKEN", secret)
    monkeypatch.setenv("BEARER_TOKEN_FILE", str(token_file))
    text = campaign_text(
        credentials={
            "oauth_service": "scitokens",
            "oauth_permissions": "storage.read:/icecube storage.create:/ospool/ap21/data/jdoe",
        }
    )
    out = tmp_path / "dag"
    write_campaign_dag(parse_campaign(text), out, campaign_text=text)
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) > 5
    for path in files:
        content = path.read_text()
        assert secret not in content and "SECRET-SIGNATURE" not in content, path
        assert str(token_file) not in content, path
    sub = load_sub(out, NODES[1])
    assert sub["use_oauth_services"] == "scitokens"
    assert sub["scitokens_oauth_permissions"].startswith("storage.read:/icecube")
    # the Pelican plugin picks $_CONDOR_CREDS/scitokens.use from the URL's prefix
    assert sub["transfer_input_files"].startswith(f"scitokens+{CKPT}/")
    assert remap_dict(sub["transfer_output_remaps"])[f"{RANGES[1]}.pt"].startswith("scitokens+osdf")


def test_access_point_destination_is_checked_fully(tmp_path, campaign_text, jobs_dir):
    ckpt = tmp_path / "ap-ckpt"
    text = campaign_text(outputs__checkpoints=f"file://{ckpt}")
    out = tmp_path / "dag"
    write_campaign_dag(parse_campaign(text), out)
    assert (ckpt / "test-camp").is_dir()  # remaps need the folder to exist
    sub = load_sub(out, NODES[1])
    assert sub["transfer_input_files"].split(", ") == [
        f"{ckpt}/test-camp/{RANGES[0]}.pt",
        f"{ckpt}/test-camp/{RANGES[0]}.json",
    ]
    post = next(s for s in dag_lines(out, "SCRIPT") if s[5] == NODES[1])
    assert post[7] == f"{ckpt}/test-camp/{RANGES[1]}.json" and "--manifest-only" not in post


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"federation": "local"}, "federation"),
        ({"outputs__tensorboard": "file:///tmp/tb"}, "outputs.tensorboard"),
        ({"image": None}, "image"),
    ],
)
def test_what_a_grid_job_cannot_reach_is_refused(tmp_path, campaign_text, jobs_dir, changes, field):
    with pytest.raises(CampaignError, match=rf"^camp.yaml: {re.escape(field)}:"):
        write_campaign_dag(parse_campaign(campaign_text(**changes), source="camp.yaml"), tmp_path)


def test_a_missing_node_wrapper_is_a_clear_error(tmp_path, campaign_text):
    with pytest.raises(DagDirError, match=r"node\.sh not found"):
        write_campaign_dag(parse_campaign(campaign_text()), tmp_path / "d", jobs_dir=tmp_path)


def test_a_submitted_dag_is_not_overwritten(written, campaign_text):
    campaign = parse_campaign(campaign_text())
    write_campaign_dag(campaign, written)  # written but never submitted: rewriting is fine
    (written / (C.DAG_FILE + ".condor.sub")).write_text("# written by condor_submit_dag\n")
    with pytest.raises(DagDirError, match="already submitted"):
        write_campaign_dag(campaign, written)
    (written / (C.DAG_FILE + ".rescue001")).write_text(f"DONE {NODES[0]}\n")
    with pytest.raises(DagDirError, match=r"rescue DAG campaign\.dag\.rescue001"):
        write_campaign_dag(campaign, written)
    write_campaign_dag(campaign, written, force=True)


def test_plan_and_dag_agree(written, campaign_text):
    nodes = plan_nodes(parse_campaign(campaign_text()))
    assert [n.name for n in nodes] == [j[1] for j in dag_lines(written, "JOB")]
