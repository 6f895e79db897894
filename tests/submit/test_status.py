"""`status`: DAGMan's node status file (ClassAds with comments) summarised."""

from __future__ import annotations

import json

import pytest

from submit import constants as C
from submit.__main__ import main
from submit.errors import DagDirError
from submit.status import parse_classads, read_status

# As DAGMan writes it (HTCondor manual, "Current Node Status File"), for a chain whose
# third node ran out of retries.
STATUS_TEXT = """\
[
  Type = "DagStatus";
  DagFiles = {
    "campaign.dag"
  };
  Timestamp = 1718000000; /* "Mon Jun 10 06:13:20 2024" */
  DagStatus = 6; /* "STATUS_ERROR" */
  NodesTotal = 5;
  NodesDone = 2;
  NodesFailed = 1;
  NodesFutile = 2;
  JobProcsHeld = 0;
  JobProcsIdle = 0; /* includes held */
]
[
  Type = "NodeStatus";
  Node = "range_0000000-0000999";
  NodeStatus = 5; /* "STATUS_DONE" */
  StatusDetails = "";
  RetryCount = 0;
  JobProcsQueued = 0;
  JobProcsHeld = 0;
]
[
  Type = "NodeStatus";
  Node = "range_0001000-0001999";
  NodeStatus = 5; /* "STATUS_DONE" */
  StatusDetails = "";
  RetryCount = 1;
  JobProcsQueued = 0;
  JobProcsHeld = 0;
]
[
  Type = "NodeStatus";
  Node = "range_0002000-0002999";
  NodeStatus = 6; /* "STATUS_ERROR" */
  StatusDetails = "Job proc (123.0.0) failed with status 1";
  RetryCount = 2;
  JobProcsQueued = 0;
  JobProcsHeld = 0;
]
[
  Type = "NodeStatus";
  Node = "range_0003000-0003999";
  NodeStatus = 7; /* "STATUS_FUTILE" */
  StatusDetails = "";
  RetryCount = 0;
  JobProcsQueued = 0;
  JobProcsHeld = 0;
]
[
  Type = "NodeStatus";
  Node = "range_0004000-0004999";
  NodeStatus = 7; /* "STATUS_FUTILE" */
  StatusDetails = "";
  RetryCount = 0;
  JobProcsQueued = 0;
  JobProcsHeld = 0;
]
[
  Type = "StatusEnd";
  EndTime = 1718000000; /* "Mon Jun 10 06:13:20 2024" */
  NextUpdate = 0; /* "none" */
]
"""


@pytest.fixture
def dag_dir(tmp_path):
    """A DAG directory after a failure: status file, two receipts and a rescue DAG."""
    (tmp_path / C.STATUS_FILE).write_text(STATUS_TEXT)
    receipts = tmp_path / C.RECEIPTS_DIR
    receipts.mkdir()
    for i, step in ((0, 5000), (1, 10400)):
        (receipts / f"000{i}000-000{i}999.json").write_text(json.dumps({"step": step}))
    (tmp_path / (C.DAG_FILE + ".rescue001")).write_text("DONE range_0000000-0000999\n")
    return tmp_path


def test_parser_reads_comments_lists_and_strings():
    ads = parse_classads(STATUS_TEXT)
    assert [ad["Type"] for ad in ads] == ["DagStatus"] + ["NodeStatus"] * 5 + ["StatusEnd"]
    assert ads[0]["DagFiles"] == ["campaign.dag"]
    assert ads[3]["StatusDetails"] == "Job proc (123.0.0) failed with status 1"
    assert ads[0]["Timestamp"] == 1718000000


def test_summary_counts_states_and_names_the_failures(dag_dir):
    summary = read_status(dag_dir)
    assert summary.dag_state == "failed"
    assert summary.counts == {"done": 2, "failed": 1, "futile": 2}
    assert [n.name for n in summary.failed] == ["range_0002000-0002999"]
    assert [n.retries for n in summary.nodes] == [0, 1, 2, 0, 0]
    assert [n.step for n in summary.nodes] == [5000, 10400, None, None, None]
    assert summary.rescue == "campaign.dag.rescue001"
    assert summary.updated.year == 2024


def test_status_command_prints_the_summary(dag_dir, capsys):
    assert main(["status", str(dag_dir)]) == 0
    out = capsys.readouterr().out
    assert "DAG failed; 5 nodes: 2 done, 1 failed, 2 futile" in out
    assert "range_0001000-0001999  done             1     10400" in out
    assert "failed: range_0002000-0002999" in out
    assert "rescue DAG campaign.dag.rescue001 present" in out


def test_no_status_file_yet_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(DagDirError, match="not submitted yet"):
        read_status(tmp_path)
    assert main(["status", str(tmp_path)]) == 2
    assert "campaign.dag.status not found" in capsys.readouterr().err


def test_a_garbled_status_file_is_reported(tmp_path):
    (tmp_path / C.STATUS_FILE).write_text("[ Type = ")
    with pytest.raises(DagDirError, match="is not a DAGMan node status file"):
        read_status(tmp_path)
