"""submit/examples/local-campaign.yaml: the README's local chain, run as the README runs it
(`muongen synth ... --ranges`, then `muongen chain ... --local`), on less data."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from muongen import checkpoint as ckpt
from muongen.config import load_config
from submit import constants as C
from submit.campaign import load_campaign, plan_nodes

ROOT = Path(__file__).parents[1]
EXAMPLE = ROOT / "submit" / "examples" / "local-campaign.yaml"
README = ROOT / "README.md"


def readme_chain_commands() -> list[list[str]]:
    """The README's `muongen synth ... --ranges` and `muongen chain ... local-campaign.yaml`
    lines, split into words (the tour's "local chain" step)."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        for line in block.splitlines():
            line = line.split(" # ")[0].split("  #")[0].strip()
            if "muongen-chain" in line or "local-campaign.yaml" in line:
                lines.append(shlex.split(line))
    return lines


def test_the_readme_runs_the_example_on_the_folders_it_names():
    campaign = load_campaign(EXAMPLE)
    commands = readme_chain_commands()
    synths = [c for c in commands if c[1] == "synth"]
    chains = [c for c in commands if c[1] == "chain"]
    assert len(chains) == 1 and chains[0][2] == "submit/examples/local-campaign.yaml"
    assert "--local" in chains[0]
    # The synth lines fill exactly the example's range folders, one range each.
    assert {c[c.index("--out") + 1] for c in synths} == {campaign.data.base}
    firsts = sorted(int(c[c.index("--first") + 1]) if "--first" in c else 0 for c in synths)
    ranges = campaign.ranges
    assert firsts == [i * ranges.step for i in range(ranges.start, ranges.end + 1)]
    assert all("--ranges" in c for c in synths)


def test_the_example_is_a_local_chain_of_the_demo():
    campaign = load_campaign(EXAMPLE)
    assert campaign.federation == C.FEDERATION_LOCAL
    assert campaign.training.preset == "demo"
    assert len(plan_nodes(campaign)) == 2
    load_config(campaign.training.preset, list(campaign.training.overrides))  # valid keys


@pytest.mark.integration
def test_the_example_chain_runs_and_hands_the_checkpoint_on(tmp_path):
    # The example as shipped, but its /tmp/muongen-chain folders moved under tmp_path, and
    # one file of 600 rows per range instead of two of 20000 (a few steps per node).
    from muongen.data.synth import write_synthetic

    raw = yaml.safe_load(EXAMPLE.read_text())
    base = tmp_path / "data"
    raw["data"]["base"] = str(base)
    raw["outputs"] = {k: f"file://{tmp_path / k}" for k in ("checkpoints", "tensorboard")}
    campaign_file = tmp_path / "campaign.yaml"
    campaign_file.write_text(yaml.safe_dump(raw))
    campaign = load_campaign(campaign_file)
    for i, node in enumerate(plan_nodes(campaign)):
        write_synthetic(
            base, files=1, events_per_file=600, seed=i, mix="rich", ranges=True,
            first=int(node.range_name[:7]),
        )  # fmt: skip

    work = tmp_path / "work"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "muongen", "chain", str(campaign_file), "--local",
         "--workdir", str(work), "--backoff", "0.1"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    first, second = (
        ckpt.read_manifest(tmp_path / "checkpoints" / campaign.name / f"{n.range_name}.json")
        for n in plan_nodes(campaign)
    )
    assert 0 < first["step"] < second["step"]  # the second range continued the first's model
    progress = json.loads((work / C.PROGRESS_FILE).read_text())
    assert [p["status"] for p in progress.values()] == ["done", "done"]
