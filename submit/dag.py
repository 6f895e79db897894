"""Write a campaign's DAG: one node per range, chained, with htcondor2.dags.

``write_campaign_dag(campaign, out_dir)`` writes the DAG file, one submit file per node, the
DAGMan config, and copies the node wrapper and the POST script next to them, so the
directory is complete on its own (see ``submit.constants`` for the layout).

Quirks of ``htcondor2.dags`` (HTCondor 25) handled here:

- ``DAG(max_jobs_by_category=...)`` writes ``CATEGORY <cat> <n>``; DAGMan wants
  ``MAXJOBS <cat> <n>``. We leave that argument out and add the MAXJOBS line ourselves.
- ``Script`` has no DEBUG option; we add ``DEBUG logs/<node>.post.log ALL`` to each POST
  line so the POST check's message is kept (DAGMan discards script output otherwise).
- The default node names are ``<layer>:<index>``; each range is its own one-node layer
  here (its own submit file), so a formatter keeps the node name equal to the layer name.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from submit import constants as C
from submit.campaign import Campaign, Node, node_arguments, plan_nodes
from submit.description import node_description, post_script_arguments
from submit.errors import CampaignError, DagDirError
from submit.submission import find_rescue

__all__ = ["node_arguments", "plan_nodes", "write_campaign_dag"]  # node_arguments: for muongen

JOBS_DIR = Path(__file__).resolve().parent.parent / "jobs"
"""Where the node wrapper and the POST script live in a muongen checkout."""


def node_vars(campaign: Campaign, node: Node) -> dict[str, str]:
    """The node's DAGMan VARS (used by the submit file's My.Muongen* attributes)."""
    return {"campaign": campaign.name, "range": node.range_name}


def check_grid_ready(campaign: Campaign) -> None:
    """Refuse what a grid job cannot reach (file:// is only on the access point)."""
    if campaign.image is None:
        raise CampaignError(
            f"{campaign.source}: image: is required for grid jobs; write e.g. "
            "image: osdf:///ospool/ap21/data/jdoe/containers/muongen-0.1.0.sif"
        )
    if campaign.federation == C.FEDERATION_LOCAL:
        raise CampaignError(
            f"{campaign.source}: federation: 'local' data is only readable by `muongen chain "
            "--local`; an execute node reads osdf:/// or pelican:// data: write e.g. "
            "federation: osg-htc.org"
        )
    if campaign.outputs.tensorboard.startswith("file://"):
        raise CampaignError(
            f"{campaign.source}: outputs.tensorboard: a grid node syncs TensorBoard events "
            "itself and cannot reach a file:// folder; write an osdf:/// or pelican:// URL"
        )
    init = campaign.training.init_checkpoint
    if init and init.startswith("file://") and not Path(init[len("file://") :]).is_file():
        raise CampaignError(
            f"{campaign.source}: training.init_checkpoint: {init} does not exist on this "
            "access point"
        )


def build_dag(campaign: Campaign):
    """The campaign's ``htcondor2.dags.DAG`` (nothing written yet)."""
    # Imported here, not at the top: muongen imports node_arguments/plan_nodes from this
    # module on machines that have no HTCondor bindings.
    import htcondor2
    from htcondor2 import dags

    dag = dags.DAG(
        dagman_config={"DAGMAN_MAX_JOBS_IDLE": campaign.dagman.max_idle},
        node_status_file=dags.NodeStatusFile(Path(C.STATUS_FILE), update_time=C.STATUS_UPDATE_S),
    )
    previous = None
    for node in plan_nodes(campaign):
        layer = dag.layer(
            name=node.name,
            submit_description=htcondor2.Submit(node_description(campaign, node)),
            vars=[node_vars(campaign, node)],
            retries=campaign.dagman.retries,
            # a user error (a bad config, file or checkpoint) fails the same way every time
            retry_unless_exit=C.EXIT_USER_ERROR,
            post=dags.Script(C.POST_SCRIPT, arguments=post_script_arguments(campaign, node)),
            category=C.CATEGORY,
        )
        if previous is not None:
            previous.add_children(layer)
        previous = layer
    return dag


def _node_name_formatter():
    from htcondor2 import dags

    class OneNodePerLayer(dags.NodeNameFormatter):
        """Node name = layer name (every layer here holds exactly one node)."""

        def generate(self, layer_name: str, node_index: int) -> str:
            if node_index != 0:
                raise ValueError(f"layer {layer_name} has more than one node")
            return layer_name

        def parse(self, node_name: str) -> tuple[str, int]:
            return node_name, 0

    return OneNodePerLayer()


def write_campaign_dag(
    campaign: Campaign,
    out_dir: str | Path,
    *,
    campaign_text: str | None = None,
    jobs_dir: Path | None = None,
    force: bool = False,
) -> Path:
    """Write the DAG directory for ``campaign``; returns the DAG file's path.

    Refuses to touch a directory whose DAG was already submitted (a ``.condor.sub`` or a
    rescue DAG exists) unless ``force``: re-running ``submit`` continues such a DAG.
    """
    from htcondor2 import dags

    check_grid_ready(campaign)
    out = Path(out_dir)
    _refuse_overwrite(out, force)
    jobs_dir = JOBS_DIR if jobs_dir is None else jobs_dir
    sources = {C.NODE_WRAPPER: jobs_dir / C.NODE_WRAPPER, C.POST_SCRIPT: jobs_dir / C.POST_SCRIPT}
    for src in sources.values():
        if not src.is_file():
            raise DagDirError(
                f"{src} not found: run `python -m submit` from a muongen checkout, which has "
                "the node wrapper and the POST script in jobs/"
            )
    out.mkdir(parents=True, exist_ok=True)
    for sub in (C.LOGS_DIR, C.RECEIPTS_DIR):
        (out / sub).mkdir(exist_ok=True)
    if campaign.checkpoint_dir.startswith("file://"):  # remaps need an existing AP folder
        Path(campaign.checkpoint_dir[len("file://") :]).mkdir(parents=True, exist_ok=True)

    dag_file = dags.write_dag(
        build_dag(campaign),
        out,
        dag_file_name=C.DAG_FILE,
        node_name_formatter=_node_name_formatter(),
    )
    dag_file.write_text(fix_dag_text(dag_file.read_text(), campaign))
    for name, src in sources.items():
        shutil.copyfile(src, out / name)
        (out / name).chmod(0o755)
    if campaign_text is not None:
        (out / C.CAMPAIGN_COPY).write_text(campaign_text)
    return dag_file


def fix_dag_text(text: str, campaign: Campaign) -> str:
    """Work around the writer's quirks: MAXJOBS for the category, DEBUG on POST scripts."""
    lines = text.splitlines()
    end_meta = lines.index("# END META")
    lines.insert(end_meta, f"MAXJOBS {C.CATEGORY} {campaign.dagman.max_running}")
    post = re.compile(r"^SCRIPT POST (\S+) ")
    for i, line in enumerate(lines):
        m = post.match(line)
        if m:
            debug = f"{C.LOGS_DIR}/{m.group(1)}.post.log"
            lines[i] = f"SCRIPT DEBUG {debug} ALL POST {line[len('SCRIPT POST ') :]}"
    return "\n".join(lines) + "\n"


def _refuse_overwrite(out: Path, force: bool) -> None:
    dag_file = out / C.DAG_FILE
    if force or not dag_file.exists():
        return
    rescue = find_rescue(out)
    if rescue is not None:
        raise DagDirError(
            f"{out} holds a DAG that ran and left the rescue DAG {rescue.name}; "
            "`python -m submit submit` resumes it as written. To start over, choose a new "
            "--out folder or pass --force (DAGMan then renames the rescue DAGs)"
        )
    if (out / (C.DAG_FILE + C.CONDOR_SUB_SUFFIX)).exists():
        raise DagDirError(
            f"{out} holds a DAG that was already submitted ({C.DAG_FILE}{C.CONDOR_SUB_SUFFIX} "
            f"exists); see `python -m submit status {out}`. To write it again choose a new "
            "--out folder or pass --force"
        )
