"""submit/ runs on an access point: it must never import muongen or torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def __init__(self, names): self.names = names
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ImportError(f"submit/ imported {name}")
sys.meta_path.insert(0, Block(BLOCKED))
"""


def run_blocked(blocked: set[str], body: str) -> subprocess.CompletedProcess:
    code = f"BLOCKED = {sorted(blocked)!r}\n" + BLOCKER + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_submit_works_without_muongen_and_torch(tmp_path, write_campaign, jobs_dir):
    campaign = write_campaign()
    result = run_blocked(
        {"muongen", "torch"},
        f"""
        from pathlib import Path
        import submit, submit.campaign, submit.dag, submit.description, submit.status
        import submit.submission, submit.sweep, submit.config_keys, submit.__main__ as cli
        submit.dag.JOBS_DIR = Path({str(jobs_dir)!r})
        assert cli.main(["plan", {str(campaign)!r}]) == 0
        assert cli.main(["write", {str(campaign)!r}, "--out", {str(tmp_path / "dag")!r}]) == 0
        leaked = [m for m in sys.modules if m.split(".")[0] in ("muongen", "torch")]
        assert not leaked, leaked
        """,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "dag" / "campaign.dag").is_file()


def test_a_sweep_is_written_without_muongen_and_torch(tmp_path, jobs_dir):
    # members are checked against submit/config_keys.json, never against muongen.config
    result = run_blocked(
        {"muongen", "torch"},
        f"""
        from pathlib import Path
        import submit.dag, submit.__main__ as cli
        submit.dag.JOBS_DIR = Path({str(jobs_dir)!r})
        example = "submit/examples/sweep.yaml"
        assert cli.main(["plan", example]) == 0
        assert cli.main(["write", example, "--out", {str(tmp_path / "dag")!r}]) == 0
        leaked = [m for m in sys.modules if m.split(".")[0] in ("muongen", "torch")]
        assert not leaked, leaked
        """,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "dag" / "chains" / "lr_critic_1e-5+seed_0" / "campaign.dag").is_file()


def test_campaign_module_needs_no_htcondor(write_campaign):
    # muongen chain --local reads campaigns and builds node arguments on machines that may
    # have no HTCondor bindings (plan_nodes/node_arguments are re-exported by submit.dag).
    result = run_blocked(
        {"muongen", "torch", "htcondor2", "htcondor", "classad2"},
        f"""
        from submit.campaign import load_campaign
        from submit.dag import node_arguments, plan_nodes
        c = load_campaign({str(write_campaign())!r})
        print(len(node_arguments(c, plan_nodes(c)[1])))
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "20"


def test_post_check_needs_only_the_standard_library(tmp_path):
    result = run_blocked(
        {"muongen", "torch", "yaml", "htcondor2", "numpy"},
        """
        import runpy, sys
        sys.argv = ["post_check.py", "--help"]
        try:
            runpy.run_path("jobs/post_check.py", run_name="__main__")
        except SystemExit as exit:
            assert exit.code == 0
        """,
    )
    assert result.returncode == 0, result.stderr
    assert "MANIFEST" in result.stdout.upper()
