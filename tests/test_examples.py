"""The shipped example campaign must be valid for both halves: submit/ (which cannot import
muongen on an access point) and muongen's config (which the nodes apply)."""

from __future__ import annotations

from pathlib import Path

import pytest

from muongen.config import load_config
from submit.campaign import load_campaign, plan_nodes

EXAMPLE = Path(__file__).parents[1] / "submit" / "examples" / "campaign.yaml"


def test_example_campaign_overrides_are_valid_muongen_config():
    campaign = load_campaign(str(EXAMPLE))
    cfg = load_config(campaign.training.preset, list(campaign.training.overrides))
    assert cfg.optim.lr_critic == 2e-5
    assert len(plan_nodes(campaign)) == 100


@pytest.mark.parametrize(
    "name", sorted(p.name for p in EXAMPLE.parent.glob("*.yaml")), ids=lambda n: n
)
def test_every_shipped_example_is_valid_for_both_halves(name):
    """Every example campaign (chains and sweeps): submit/ loads it, and each member's
    --set list (the campaign's own for a plain chain) is a valid muongen config."""
    from submit.sweep import members

    campaign = load_campaign(str(EXAMPLE.parent / name))
    runs = [m.overrides for m in members(campaign)] or [campaign.training.overrides]
    for overrides in runs:
        cfg = load_config(campaign.training.preset, list(overrides))
        assert cfg.train.max_steps >= 0
    assert plan_nodes(campaign)
