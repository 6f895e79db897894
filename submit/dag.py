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

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from submit import constants as C
from submit.campaign import Campaign, Node, node_arguments, plan_nodes
from submit.description import (
    compare_description,
    evaluate_description,
    final_check_arguments,
    node_description,
    post_script_arguments,
)
from submit.errors import CampaignError, DagDirError
from submit.submission import find_rescue
from submit.sweep import evaluation_url, member_campaign, members, members_json

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
    if campaign.sweep is not None:
        return write_sweep_dag(
            campaign, out_dir, campaign_text=campaign_text, jobs_dir=jobs_dir, force=force
        )
    check_grid_ready(campaign)
    out = Path(out_dir)
    sources = _job_files(jobs_dir, (C.NODE_WRAPPER, C.POST_SCRIPT))
    check_out_dir(out)
    _refuse_overwrite(out, force)
    with _write_errors(out):
        return _write_chain(campaign, out, sources, campaign_text)


def _write_chain(
    campaign: Campaign, out: Path, sources: dict[str, Path], campaign_text: str | None
) -> Path:
    from htcondor2 import dags

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


def fix_dag_text(text: str, campaign: Campaign, category: str = C.CATEGORY) -> str:
    """Work around the writer's quirks: MAXJOBS for the category, DEBUG on POST scripts."""
    lines = text.splitlines()
    end_meta = lines.index("# END META")
    lines.insert(end_meta, f"MAXJOBS {category} {campaign.dagman.max_running}")
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


# --------------------------------------------------------------------------- the out folder


def check_out_dir(out: Path) -> None:
    """Refuse an --out that is a file or cannot be written, before anything is written.

    Creates the folder (that is the first write) and a probe file in it, which a read-only
    file system or a folder without write permission refuses even where ``os.access`` would
    say yes (root).
    """
    for path in (out, *out.parents):
        if path.exists():
            if not path.is_dir():
                where = f"--out {out}" if path == out else f"--out {out}: {path}"
                raise DagDirError(
                    f"{where} is a file, not a folder: choose a folder for the DAG with --out DIR"
                )
            break
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out, prefix=".write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise DagDirError(
            f"cannot write the DAG folder {out} ({exc.strerror}): choose a writable --out folder"
        ) from None


class _write_errors:
    """Any OSError while writing the DAG folder: one line naming the file (a full disk)."""

    def __init__(self, out: Path):
        self.out = out

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if isinstance(exc, OSError):
            where = exc.filename or self.out
            raise DagDirError(
                f"cannot write {where} ({exc.strerror}): choose a writable --out folder with "
                "room for the DAG"
            ) from None
        return False


def _job_files(jobs_dir: Path | None, names: tuple[str, ...]) -> dict[str, Path]:
    """jobs/ files a DAG directory gets a copy of (checked before anything is written)."""
    jobs_dir = JOBS_DIR if jobs_dir is None else jobs_dir
    sources = {name: jobs_dir / name for name in names}
    for src in sources.values():
        if not src.is_file():
            raise DagDirError(
                f"{src} not found: run `python -m submit` from a muongen checkout, which has "
                "the node wrapper, the evaluate/compare wrappers and the POST scripts in jobs/"
            )
    return sources


# --------------------------------------------------------------------------- sweeps


def sweep_node_names(count: int) -> list[tuple[str, str]]:
    """(chain node, evaluate node) names of members 0..count-1: chain_00, eval_00, ..."""
    width = max(2, len(str(count - 1)))
    return [
        (f"{C.CHAIN_PREFIX}{i:0{width}d}", f"{C.EVAL_PREFIX}{i:0{width}d}") for i in range(count)
    ]


def build_sweep_dag(campaign: Campaign):
    """The sweep's top DAG: per member a SUBDAG (its chain) then an evaluate node; FINAL compare.

    Why SUBDAG EXTERNAL and not SPLICE: ``dagman.max_running`` must bound *chains*; a
    SUBDAG node is one cluster (its condor_dagman) in the category ``chains``, so
    ``MAXJOBS chains N`` runs N members' chains at a time, each to its end, where with
    splices the category would bound range jobs and the chains would interleave, all of
    them half done. A sub-DAG also keeps the member's chain DAG exactly the single-chain
    DAG (tested on its own), with its own rescue DAG, which DAGMan picks up on resubmit.

    Why FINAL for compare: a child of a failed node never runs, so a compare node under
    every evaluate node would be lost with one failed member. The FINAL node always runs;
    it ranks whatever ``metrics/`` holds and members.json names the rest as failed. Its
    POST script (jobs/final_check.py) then fails the DAG when any node failed, so the DAG
    is not reported successful (a FINAL node's status is the DAG's) and a resubmission
    continues the failed members from the rescue DAGs.
    """
    import htcondor2
    from htcondor2 import dags

    dag = dags.DAG(
        dagman_config={"DAGMAN_MAX_JOBS_IDLE": campaign.dagman.max_idle},
        node_status_file=dags.NodeStatusFile(Path(C.STATUS_FILE), update_time=C.STATUS_UPDATE_S),
    )
    found = members(campaign)
    for member, (chain_name, eval_name) in zip(found, sweep_node_names(len(found))):
        mine = member_campaign(campaign, member)
        last = plan_nodes(mine)[-1]
        chain = dag.subdag(
            name=chain_name,
            dag_file=Path(C.DAG_FILE),
            dir=Path(C.CHAINS_DIR) / member.name,
            category=C.CHAINS_CATEGORY,
        )
        chain.child_layer(
            name=eval_name,
            submit_description=htcondor2.Submit(
                evaluate_description(campaign, mine, last, member.name, eval_name)
            ),
            retries=campaign.dagman.retries,
            retry_unless_exit=C.EXIT_USER_ERROR,
        )
    dag.final(
        name=C.COMPARE_NODE,
        submit_description=htcondor2.Submit(compare_description(campaign)),
        post=dags.Script(C.FINAL_CHECK, arguments=final_check_arguments()),
    )
    return dag


def check_sweep_ready(campaign: Campaign) -> None:
    """What a sweep's evaluate nodes cannot reach from an execute node."""
    if evaluation_url(campaign).startswith("file://"):
        raise CampaignError(
            f"{campaign.source}: evaluation.data: a grid node cannot read files on the access "
            "point; write an osdf:/// or pelican:// URL of the held-out files"
        )


def write_sweep_dag(
    campaign: Campaign,
    out_dir: str | Path,
    *,
    campaign_text: str | None = None,
    jobs_dir: Path | None = None,
    force: bool = False,
) -> Path:
    """Write a sweep's DAG directory (layout in ``submit.constants``); returns the DAG file."""
    check_grid_ready(campaign)
    check_sweep_ready(campaign)
    out = Path(out_dir)
    chain_files = _job_files(jobs_dir, (C.NODE_WRAPPER, C.POST_SCRIPT))
    sweep_files = _job_files(jobs_dir, (C.EVALUATE_WRAPPER, C.COMPARE_WRAPPER, C.FINAL_CHECK))
    found = members(campaign)
    check_out_dir(out)
    _refuse_overwrite(out, force)
    with _write_errors(out):
        from htcondor2 import dags

        for member in found:
            _write_chain(
                member_campaign(campaign, member),
                out / C.CHAINS_DIR / member.name,
                chain_files,
                None,
            )
            (out / C.METRICS_DIR / member.name).mkdir(parents=True, exist_ok=True)
        (out / C.LOGS_DIR).mkdir(exist_ok=True)
        table = json.dumps(members_json(found), indent=2) + "\n"
        (out / C.METRICS_DIR / C.MEMBERS_FILE).write_text(table)
        index = [
            {"member": m.name, "chain": chain, "evaluate": ev}
            for m, (chain, ev) in zip(found, sweep_node_names(len(found)))
        ]
        (out / C.SWEEP_INDEX).write_text(json.dumps(index, indent=2) + "\n")
        dag = build_sweep_dag(campaign)
        dag_file = dags.write_dag(
            dag, out, dag_file_name=C.DAG_FILE, node_name_formatter=_node_name_formatter()
        )
        text = fix_dag_text(dag_file.read_text(), campaign, category=C.CHAINS_CATEGORY)
        dag_file.write_text(text)
        # htcondor2.dags writes no submit file for a FINAL node (design section 6)
        import htcondor2

        compare = htcondor2.Submit(compare_description(campaign))
        (out / f"{C.COMPARE_NODE}.sub").write_text(str(compare))
        for name, src in sweep_files.items():
            shutil.copyfile(src, out / name)
            (out / name).chmod(0o755)
        if campaign_text is not None:
            (out / C.CAMPAIGN_COPY).write_text(campaign_text)
    return dag_file
