"""Submitting: the condor_submit_dag fallback, the schedd path, and rescue DAGs."""

from __future__ import annotations

from pathlib import Path

import htcondor2
import pytest

from submit import constants as C
from submit.__main__ import main
from submit.submission import find_rescue, rescue_done_nodes, submit_dag

NODES = [f"{C.NODE_PREFIX}000{i}000-000{i}999" for i in range(5)]


@pytest.fixture
def no_schedd():
    """The tests run without an HTCondor pool; skip where one actually answers."""
    try:
        htcondor2.Schedd()
    except Exception:
        return
    pytest.skip("an HTCondor schedd is reachable here; these tests need none")


def test_submit_prints_condor_submit_dag_without_a_schedd(
    tmp_path, write_campaign, jobs_dir, no_schedd, capsys
):
    out = tmp_path / "dag dir"
    # nothing was submitted: a script that runs it must not take that for success
    assert main(["submit", str(write_campaign()), "--out", str(out)]) == C.EXIT_NOT_SUBMITTED
    printed, err = capsys.readouterr()
    assert "nothing was submitted" in err
    assert (out / C.DAG_FILE).is_file()
    assert "No HTCondor schedd reachable" in printed
    assert f"cd '{out}' && condor_submit_dag -batch-name test-camp campaign.dag" in printed


class FakeSchedd:
    """Stands in for htcondor2.Schedd: records what would be submitted."""

    def __init__(self):
        self.submitted = []

    def submit(self, description):
        self.submitted.append(description)

        class Result:
            def cluster(self):
                return 4242

        return Result()


def test_submit_goes_through_from_dag_and_the_schedd(tmp_path):
    (tmp_path / C.DAG_FILE).write_text("JOB a a.sub\n")
    schedd, calls = FakeSchedd(), []

    def from_dag(dag_file, options):
        calls.append((dag_file, options, Path.cwd()))
        return "description"

    said = []
    result = submit_dag(
        tmp_path, "camp", schedd_factory=lambda: schedd, from_dag=from_dag, say=said.append
    )
    assert result.cluster == 4242
    # DAGMan resolves the DAG's relative paths against the directory it is submitted from
    assert calls == [(C.DAG_FILE, {"BatchName": "camp"}, tmp_path)]
    assert schedd.submitted == ["description"]
    assert Path.cwd() != tmp_path and "4242" in said[0]
    submit_dag(tmp_path, "camp", force=True, schedd_factory=lambda: schedd, from_dag=from_dag)
    assert calls[-1][1] == {"BatchName": "camp", "Force": True}


def test_find_rescue_picks_the_newest_strictly(tmp_path):
    assert find_rescue(tmp_path) is None
    for name in ("campaign.dag.rescue001", "campaign.dag.rescue002", "campaign.dag.rescue003.orig"):
        (tmp_path / name).write_text("")
    assert find_rescue(tmp_path) == tmp_path / "campaign.dag.rescue002"


def test_rescue_done_nodes(tmp_path):
    rescue = tmp_path / "campaign.dag.rescue001"
    rescue.write_text(
        "# Rescue DAG file, created after running\n#   the campaign.dag DAG file\n"
        f"# Total number of Nodes: 5\n\nDONE {NODES[0]}\nDONE {NODES[1]}\n"
    )
    assert rescue_done_nodes(rescue) == NODES[:2]


def test_resubmitting_after_a_failure_uses_the_rescue_dag(
    tmp_path, write_campaign, jobs_dir, no_schedd, capsys
):
    campaign, out = write_campaign(), tmp_path / "dag"
    assert main(["write", str(campaign), "--out", str(out)]) == 0
    dag = out / C.DAG_FILE
    (out / (C.DAG_FILE + C.CONDOR_SUB_SUFFIX)).write_text("# submitted before\n")
    (out / (C.DAG_FILE + ".rescue001")).write_text(f"DONE {NODES[0]}\nDONE {NODES[1]}\n")
    dag.write_text(dag.read_text() + "# marker: written before the failure\n")
    capsys.readouterr()

    assert main(["submit", str(campaign), "--out", str(out)]) == C.EXIT_NOT_SUBMITTED
    printed = capsys.readouterr().out
    assert "found the rescue DAG campaign.dag.rescue001 (2 of 5 nodes done)" in printed
    command = next(line for line in printed.splitlines() if "condor_submit_dag" in line)
    # without -force: -force would rename the rescue DAG and start the chain over
    assert command.endswith("&& condor_submit_dag -batch-name test-camp campaign.dag")
    assert dag.read_text().endswith("# marker: written before the failure\n")  # untouched
    assert "differs" not in printed

    campaign.write_text(campaign.read_text().replace("retries: 2", "retries: 5"))
    assert main(["submit", str(campaign), "--out", str(out)]) == C.EXIT_NOT_SUBMITTED
    assert "the rescue DAG runs as written" in capsys.readouterr().out


def test_submitting_a_running_dag_again_is_refused(tmp_path, write_campaign, jobs_dir, capsys):
    campaign, out = write_campaign(), tmp_path / "dag"
    assert main(["write", str(campaign), "--out", str(out)]) == 0
    (out / (C.DAG_FILE + C.CONDOR_SUB_SUFFIX)).write_text("# submitted before\n")
    assert main(["submit", str(campaign), "--out", str(out)]) == 2
    assert "already submitted" in capsys.readouterr().err


def test_write_reports_campaign_errors_without_a_traceback(write_campaign, capsys):
    assert main(["write", str(write_campaign(resources__memory="lots"))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "resources.memory" in err and "Traceback" not in err
