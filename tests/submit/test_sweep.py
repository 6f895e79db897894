"""submit/sweep.py: a campaign's sweep block -> members (names, overrides, checks)."""

from __future__ import annotations

import pytest

from submit.campaign import parse_campaign
from submit.errors import CampaignError
from submit.sweep import compact_float, members, members_json, override_value

SWEEP = {
    "parameters": {"optim.lr_critic": ["1e-4", 3.0e-4], "model.critic_local_width": [32, 64]},
    "seeds": [0, 1],
}
EVALUATION = {"data": "pelican://osg-htc.org/icecube/heldout/*.parquet", "events": 5000}


def sweep_campaign(campaign_text, sweep=SWEEP, evaluation=EVALUATION, **changes):
    changes.setdefault(
        "training__overrides", ["optim.lr_generator=2e-5", "data.batch_events=48000"]
    )
    return parse_campaign(
        campaign_text(sweep=sweep, evaluation=evaluation, **changes), source="c.yaml"
    )


def test_grid_members_are_the_cross_product_times_seeds_in_file_order(campaign_text):
    found = members(sweep_campaign(campaign_text))
    assert [m.name for m in found] == [
        "lr_critic_1e-4+critic_local_width_32+seed_0",
        "lr_critic_1e-4+critic_local_width_32+seed_1",
        "lr_critic_1e-4+critic_local_width_64+seed_0",
        "lr_critic_1e-4+critic_local_width_64+seed_1",
        "lr_critic_3e-4+critic_local_width_32+seed_0",
        "lr_critic_3e-4+critic_local_width_32+seed_1",
        "lr_critic_3e-4+critic_local_width_64+seed_0",
        "lr_critic_3e-4+critic_local_width_64+seed_1",
    ]
    last = found[-1]
    assert last.settings == {"optim.lr_critic": 3e-4, "model.critic_local_width": 64}
    assert last.seed == 1
    # the campaign's overrides first, then the member's, train.seed last (later --set wins)
    assert last.overrides == (
        "optim.lr_generator=2e-5",
        "data.batch_events=48000",
        "optim.lr_critic=3.0e-4",
        "model.critic_local_width=64",
        "train.seed=1",
    )
    table = members_json(found)
    assert table[last.name] == {
        "settings": last.settings,
        "seed": 1,
        "overrides": list(last.overrides),
    }


def test_member_overrides_read_back_by_muongen_as_the_settings(campaign_text):
    config = pytest.importorskip("muongen.config")
    campaign = sweep_campaign(campaign_text, training__overrides=[])
    for m in members(campaign):
        cfg = config.load_config("demo", list(m.overrides))
        assert cfg.optim.lr_critic == m.settings["optim.lr_critic"]
        assert cfg.model.critic_local_width == m.settings["model.critic_local_width"]
        assert cfg.train.seed == m.seed


@pytest.mark.parametrize(
    "x, name, override",
    [(3e-4, "3e-4", "3.0e-4"), (0.5, "0.5", "0.5"), (2.5e-5, "2.5e-5", "2.5e-5"),
     (1e5, "1e5", "1.0e+5"), (64.0, "64.0", "64.0")],
)  # fmt: skip
def test_numbers_are_named_compactly_and_round_trip_through_yaml(x, name, override):
    assert compact_float(x) == name
    assert override_value(x) == override


def test_samples_are_drawn_deterministically_within_their_ranges(campaign_text):
    sweep = {
        "samples": 5,
        "seed": 7,
        "parameters": {
            "optim.lr_critic": {"log_uniform": ["1e-5", "1e-3"]},
            "model.critic_local_width": {"uniform": [16, 128]},
            "model.critic": {"choice": ["pointnet", "epic"]},
        },
        "seeds": [3],
    }
    first = members(sweep_campaign(campaign_text, sweep=sweep))
    again = members(sweep_campaign(campaign_text, sweep=sweep))
    assert first == again and len(first) == 5
    for m in first:
        lr = m.settings["optim.lr_critic"]
        assert 1e-5 <= lr <= 1e-3 and float(f"{lr:.4g}") == lr  # 4 significant digits kept
        assert isinstance(m.settings["model.critic_local_width"], int)  # an int key: rounded
        assert m.settings["model.critic"] in ("pointnet", "epic")
        assert m.seed == 3 and m.name.endswith("+seed_3")
    other = members(sweep_campaign(campaign_text, sweep={**sweep, "seed": 8}))
    assert [m.settings for m in other] != [m.settings for m in first]


def test_long_or_unsafe_names_become_a_short_hash(campaign_text):
    sweep = {"parameters": {"data.paths": [["/a", "/b"], ["/c"]]}, "seeds": [0]}
    found = members(sweep_campaign(campaign_text, sweep=sweep))
    assert all(m.name.startswith("member-") and len(m.name) == 17 for m in found)
    assert len({m.name for m in found}) == 2


def test_two_keys_with_one_last_component_are_named_in_full(campaign_text):
    sweep = {"parameters": {"optim.lr_critic": [1.0e-4], "model.critic": ["epic"]}}
    (m,) = members(sweep_campaign(campaign_text, sweep=sweep))
    assert m.name == "lr_critic_1e-4+critic_epic+seed_0"
    sweep = {"parameters": {"optim.n_critic": [5], "data.open_files": [2], "optim.gp_every": [1]}}
    (m,) = members(sweep_campaign(campaign_text, sweep=sweep))
    assert m.name == "n_critic_5+open_files_2+gp_every_1+seed_0"


@pytest.mark.parametrize(
    "sweep, evaluation, message",
    [
        ({**SWEEP, "repeat": 2}, EVALUATION, "c.yaml: sweep.repeat: unknown key"),
        (SWEEP, {**EVALUATION, "files": 1}, "c.yaml: evaluation.files: unknown key"),
        (
            {"parameters": {"optim.lr_critc": [1.0e-4]}},
            EVALUATION,
            "c.yaml: member lr_critc_1e-4+seed_0: optim.lr_critc: not a muongen config key",
        ),
        (
            {"parameters": {"model.critic_local_width": [32, "wide"]}},
            EVALUATION,
            "c.yaml: member critic_local_width_wide+seed_0: model.critic_local_width: "
            "expected an integer, got 'wide'",
        ),
        (
            {"parameters": {"model.critic": ["epic", "deepsets"]}, "seeds": [4]},
            EVALUATION,
            "c.yaml: member critic_deepsets+seed_4: model.critic: expected one of",
        ),
        ({"parameters": {"train.seed": [1, 2]}}, EVALUATION, "sweep.parameters.train.seed"),
        ({"parameters": {"optim.lr": {"uniform": [0, 1]}}}, EVALUATION, "needs sweep.samples"),
        ({"parameters": {"optim.lr": [1, 1]}}, EVALUATION, "repeats a value"),
        (SWEEP, None, "c.yaml: evaluation: is required with sweep"),
        (SWEEP, {"data": "heldout/*.parquet"}, "evaluation.data: 'heldout/*.parquet' must be"),
        (SWEEP, {**EVALUATION, "events": 0}, "evaluation.events: 0 must be at least 1"),
    ],
)
def test_bad_sweeps_are_one_line_errors_naming_the_key(campaign_text, sweep, evaluation, message):
    with pytest.raises(CampaignError) as error:
        sweep_campaign(campaign_text, sweep=sweep, evaluation=evaluation)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_a_bad_campaign_override_names_the_member_too(campaign_text):
    wanted = r"member lr_critic_1e-4\+critic_local_width_32\+seed_0: optim\.lr: not a muongen"
    with pytest.raises(CampaignError, match=wanted):
        sweep_campaign(campaign_text, training__overrides=["optim.lr=2e-5"])


def test_evaluation_without_sweep_is_refused(campaign_text):
    with pytest.raises(CampaignError, match="evaluation: scores the members of a sweep"):
        parse_campaign(campaign_text(evaluation=EVALUATION), source="c.yaml")


def test_a_member_campaign_puts_every_url_in_the_members_folder(campaign_text):
    from submit.campaign import plan_nodes
    from submit.sweep import evaluation_url, member_campaign

    campaign = sweep_campaign(campaign_text)
    member = members(campaign)[-1]
    mine = member_campaign(campaign, member)
    assert mine.sweep is None and mine.training.overrides == member.overrides
    last = plan_nodes(mine)[-1]
    base = "osdf:///ospool/ap21/data/jdoe"
    assert last.output_manifest == f"{base}/ckpt/test-camp/{member.name}/0004000-0004999.json"
    assert last.tensorboard == f"{base}/tb/test-camp/{member.name}/0004000-0004999"
    assert evaluation_url(campaign) == EVALUATION["data"]
    local = sweep_campaign(
        campaign_text, evaluation={"data": "/data/heldout/*.parquet"}, federation="local"
    )
    assert evaluation_url(local) == "file:///data/heldout/*.parquet"
