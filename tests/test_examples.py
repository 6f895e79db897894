"""The shipped example campaign must be valid for both halves: submit/ (which cannot import
muongen on an access point) and muongen's config (which the nodes apply)."""

from __future__ import annotations

from pathlib import Path

from muongen.config import load_config
from submit.campaign import load_campaign, plan_nodes

EXAMPLE = Path(__file__).parents[1] / "submit" / "examples" / "campaign.yaml"


def test_example_campaign_overrides_are_valid_muongen_config():
    campaign = load_campaign(str(EXAMPLE))
    cfg = load_config(campaign.training.preset, list(campaign.training.overrides))
    assert cfg.optim.lr_critic == 2e-5
    assert len(plan_nodes(campaign)) == 100
