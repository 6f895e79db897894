"""Campaign files: strict validation with errors naming the field, and the chain plan."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from submit.campaign import load_campaign, node_arguments, parse_campaign, plan_nodes
from submit.errors import CampaignError

EXAMPLE = Path(__file__).resolve().parents[2] / "submit" / "examples" / "campaign.yaml"


def test_annotated_example_is_valid():
    campaign = load_campaign(EXAMPLE)
    assert campaign.ranges.labels()[0] == "0000000-0000999"
    assert campaign.ranges.labels()[-1] == "0099000-0099999"
    assert campaign.image.startswith("osdf:///") and campaign.image.endswith(".sif")


def test_loads_every_section(campaign_text):
    c = parse_campaign(campaign_text(), source="c.yaml")
    assert c.name == "test-camp" and c.source == "c.yaml"
    assert c.resources.gpus_minimum_capability == 8.0
    assert c.training.overrides == ("optim.lr=2e-5", "data.batch_events=48000")
    assert c.dagman.max_idle == 7
    assert c.credentials.oauth_service is None  # defaults fill sections left out


def test_range_labels_follow_the_producer_layout(campaign_text):
    c = parse_campaign(campaign_text(ranges={"start": 3, "end": 5, "step": 1000}))
    assert c.ranges.labels() == ["0003000-0003999", "0004000-0004999", "0005000-0005999"]
    c = parse_campaign(campaign_text(ranges={"start": 0, "end": 1, "step": 500}))
    assert c.ranges.labels() == ["0000000-0000499", "0000500-0000999"]


@pytest.mark.parametrize(
    ("changes", "field", "advice"),
    [
        ({"resources__memory": "24 gigs"}, "resources.memory", "24GB"),
        ({"resources__gpus": "one"}, "resources.gpus", "expected an integer"),
        ({"resources__cpus": True}, "resources.cpus", "expected an integer"),
        ({"image": "muongen.sif"}, "image", "osdf:///"),
        ({"image": "osdf:///x/muongen.tar"}, "image", ".sif"),
        ({"federation": "not a host"}, "federation", "osg-htc.org"),
        ({"name": None}, "name", "is required"),
        ({"name": "bad name!"}, "name", "letters"),
        ({"data__base": "relative/path"}, "data.base", "absolute"),
        ({"data__glob": "sub/*.parquet"}, "data.glob", "inside one range folder"),
        ({"ranges__end": -1}, "ranges.end", "before ranges.start"),
        ({"ranges__end": 10000}, "ranges.end", "past file"),
        ({"outputs__checkpoints": "https://example.org/ckpt"}, "outputs.checkpoints", "osdf://"),
        ({"outputs__tensorboard": "osdf:///a/tb/"}, "outputs.tensorboard", "trailing"),
        ({"training__overrides": ["lr=1"]}, "training.overrides[0]", "section.key=value"),
        ({"training__overrides": "optim.lr=1"}, "training.overrides", "expected a list"),
        ({"training__preset": "a b"}, "training.preset", "preset"),
        ({"dagman__job_duration": "Forever"}, "dagman.job_duration", "Medium or Long"),
        ({"dagman__max_idle": 0}, "dagman.max_idle", "at least 1"),
        ({"dagman__retries": "3$(x)"}, "dagman.retries", "expected an integer"),
        ({"project": "$(evil)"}, "project", "'$'"),
        ({"resources__gpus": 0}, "resources.gpus_minimum_capability", "gpus is 0"),
        ({"credentials": {"oauth_permissions": "storage.read:/"}}, "credentials.oauth_permissions",
         "needs credentials.oauth_service"),
        ({"credentials": {"scitokens_file": "tok"}}, "credentials.scitokens_file", "absolute"),
        ({"training__init_checkpoint": "osdf:///a/prev.pt"}, "training.init_checkpoint", ".json"),
        ({"training__init_checkpoint": "osdf:///a/0000000-0000999.json"},
         "training.init_checkpoint", "same file name"),
    ],
)  # fmt: skip
def test_errors_name_the_field_and_say_what_to_write(campaign_text, changes, field, advice):
    with pytest.raises(CampaignError) as err:
        parse_campaign(campaign_text(**changes), source="camp.yaml")
    message = str(err.value)
    assert message.startswith(f"camp.yaml: {field}:"), message
    assert advice in message


def test_unknown_keys_are_errors_listing_the_known_ones(campaign_text):
    with pytest.raises(CampaignError, match=r"resources\.gpu: unknown key; known keys here: gpus"):
        parse_campaign(campaign_text(resources__gpu=1))
    with pytest.raises(CampaignError, match=r"^<campaign>: walltime: unknown key"):
        parse_campaign(campaign_text(walltime=3))


def test_a_token_in_the_campaign_is_refused(campaign_text):
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzY29wZSI6InN0b3JhZ2UucmVhZDovIn0.c2lnbmF0dXJlX2hlcmU"
    with pytest.raises(CampaignError, match=r"credentials\.token: this looks like a bearer token"):
        parse_campaign(campaign_text(credentials={"token": jwt}))
    with pytest.raises(CampaignError, match="unknown key; tokens come from HTCondor"):
        parse_campaign(campaign_text(bearer_token="abc"))


def test_missing_file_and_bad_yaml_are_campaign_errors(tmp_path):
    with pytest.raises(CampaignError, match="cannot read the campaign file"):
        load_campaign(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(CampaignError, match=r"bad\.yaml: not valid YAML"):
        load_campaign(bad)


def test_plan_chains_each_range_to_the_previous_checkpoint(campaign_text):
    c = parse_campaign(campaign_text())
    nodes = plan_nodes(c)
    assert [n.range_name for n in nodes] == [f"000{i}000-000{i}999" for i in range(5)]
    ckpt = "osdf:///ospool/ap21/data/jdoe/ckpt/test-camp"
    assert nodes[0].input_manifest is None and nodes[0].input_pt is None
    for prev, node in itertools.pairwise(nodes):
        assert node.input_manifest == prev.output_manifest == f"{ckpt}/{prev.range_name}.json"
        assert node.input_pt == prev.output_pt == f"{ckpt}/{prev.range_name}.pt"
    assert nodes[2].data_glob == (
        "pelican://osg-htc.org/icecube/sim/muonitron/0002000-0002999/*.parquet"
    )
    assert nodes[2].tensorboard == "osdf:///ospool/ap21/data/jdoe/tb/test-camp/0002000-0002999"


def test_init_checkpoint_feeds_the_first_node(campaign_text):
    init = "osdf:///ospool/ap21/data/jdoe/ckpt/older/0049000-0049999.json"
    first = plan_nodes(parse_campaign(campaign_text(training__init_checkpoint=init)))[0]
    assert first.input_manifest == init
    assert first.input_pt == init.replace(".json", ".pt")


def test_a_local_chain_campaign_needs_no_image(campaign_text):
    c = parse_campaign(campaign_text(image=None, federation="local"))
    assert c.image is None and c.data_root == "file://"


def test_data_urls_per_federation(campaign_text):
    osdf = parse_campaign(campaign_text(federation="osdf"))
    assert osdf.data_glob("r") == "osdf:///icecube/sim/muonitron/r/*.parquet"
    local = parse_campaign(campaign_text(federation="local"))
    assert local.data_glob("r") == "file:///icecube/sim/muonitron/r/*.parquet"


def test_node_arguments_local_and_on_the_grid(campaign_text):
    c = parse_campaign(campaign_text())
    first, second = plan_nodes(c)[:2]
    local = node_arguments(c, second)
    assert local == [
        "--campaign-name", "test-camp",
        "--range", "0001000-0001999",
        "--prev-manifest", "osdf:///ospool/ap21/data/jdoe/ckpt/test-camp/0000000-0000999.json",
        "--data-glob", "pelican://osg-htc.org/icecube/sim/muonitron/0001000-0001999/*.parquet",
        "--ckpt-dest", "osdf:///ospool/ap21/data/jdoe/ckpt/test-camp",
        "--tb-dest", "osdf:///ospool/ap21/data/jdoe/tb/test-camp/0001000-0001999",
        "--preset", "production-a100",
        "--set", "optim.lr=2e-5",
        "--set", "data.batch_events=48000",
        "--self-checkpoint-s", "1800",
    ]  # fmt: skip
    grid = node_arguments(c, second, transferred=True)
    assert grid[grid.index("--prev-manifest") + 1] == "0000000-0000999.json"  # transferred in
    assert grid[grid.index("--ckpt-dest") + 1] == ""  # HTCondor publishes, not the node
    assert node_arguments(c, first)[5] == ""  # the first range starts fresh
