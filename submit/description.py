"""A node's HTCondor submit description, built as a plain dict by pure functions.

``node_description(campaign, node)`` is everything one training job needs: the container,
the resources, the previous range's checkpoint coming in, this range's checkpoint going
out to the destination URLs, self-checkpointing, and a hold/release policy for transient
transfer failures. ``dag.py`` turns the dict into an ``htcondor2.Submit``; keeping it a dict
keeps it testable without HTCondor (htmap does the same).

Two choices differ from the obvious ones, on purpose:

- ``when_to_transfer_output = ON_SUCCESS``, not ``ON_EXIT_OR_EVICT``: HTCondor holds a
  job when a file of ``transfer_output_files`` does not exist at transfer time
  (condor_submit manual). ``ON_EXIT_OR_EVICT`` transfers the output list at every
  eviction, when this range's checkpoint does not exist yet; ``ON_EXIT`` transfers it when
  a failed node exits without one, so a real failure would sit in the hold/release loop
  instead of reaching DAGMan's RETRY. ``ON_SUCCESS`` transfers outputs only after exit 0.
  What survives an eviction is the self-checkpoint: with ``checkpoint_exit_code`` HTCondor
  spools ``transfer_checkpoint_files`` at every exit 85 and restores them on restart.
- The TensorBoard folder is synced by the node itself (``--tb-dest``, periodically and at
  the end), not by ``transfer_output_remaps``: HTCondor cannot remap directories, and a
  periodic sync shows a long job's progress while it runs.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from submit import constants as C
from submit.campaign import Campaign, Node, node_arguments


def node_description(campaign: Campaign, node: Node) -> dict[str, str]:
    """The submit description of one node (keys and values as written in a .sub file)."""
    res = campaign.resources
    desc: dict[str, str] = {
        "universe": "container",
        "container_image": str(campaign.image),
        "executable": C.NODE_WRAPPER,
        "arguments": condor_arguments(node_arguments(campaign, node, transferred=True)),
        "request_cpus": str(res.cpus),
        "request_gpus": str(res.gpus),
        "request_memory": res.memory,
        "request_disk": res.disk,
    }
    if res.gpus_minimum_capability is not None:
        desc["gpus_minimum_capability"] = f"{res.gpus_minimum_capability:.1f}"
    desc |= transfer_settings(campaign, node)
    desc |= {
        "checkpoint_exit_code": str(C.EXIT_SELF_CHECKPOINT),
        "transfer_checkpoint_files": C.RUN_DIR.format(range=node.range_name),
        "My.JobDurationCategory": classad_string(campaign.dagman.job_duration),
        # Filled from the node's VARS, so condor_q -af MuongenRange shows where a job is.
        "My.MuongenCampaign": '"$(campaign)"',
        "My.MuongenRange": '"$(range)"',
        **job_logs(node.name),
    }
    return desc | pool_settings(campaign)


def transfer_settings(campaign: Campaign, node: Node) -> dict[str, str]:
    """Previous checkpoint in; this range's checkpoint out to its URLs; receipt to the AP.

    The node leaves ``<range>.pt``, ``<range>.json`` and ``receipt.json`` (a copy of the
    manifest) at the top of its scratch dir. The .pt is listed before its manifest, so a
    manifest is never uploaded ahead of the file it vouches for.
    """
    pt, manifest = f"{node.range_name}.pt", f"{node.range_name}.json"
    settings = {
        "should_transfer_files": "YES",
        "when_to_transfer_output": "ON_SUCCESS",
        "success_exit_code": "0",  # ON_SUCCESS needs it set
        "max_retries": "0",  # else success_exit_code brings DEFAULT_JOB_MAX_RETRIES; DAGMan retries
        "transfer_output_files": ", ".join((pt, manifest, C.RECEIPT_FILE)),
        "transfer_output_remaps": remaps(
            {
                pt: transfer_url(campaign, node.output_pt),
                manifest: transfer_url(campaign, node.output_manifest),
                C.RECEIPT_FILE: f"{C.RECEIPTS_DIR}/{manifest}",
            }
        ),
    }
    if node.input_manifest is not None:
        assert node.input_pt is not None
        inputs = [
            transfer_url(campaign, node.input_pt),
            transfer_url(campaign, node.input_manifest),
        ]
        settings["transfer_input_files"] = ", ".join(inputs)
    return settings


def job_logs(node_name: str, retried: bool = True) -> dict[str, str]:
    """A node's log, stdout and stderr under logs/; ``$(RETRY)`` is DAGMan's retry number,
    so every attempt of a retried node keeps its own stdout/stderr."""
    attempt = ".$(RETRY)" if retried else ""
    return {
        "log": f"{C.LOGS_DIR}/{node_name}.log",
        "output": f"{C.LOGS_DIR}/{node_name}{attempt}.out",
        "error": f"{C.LOGS_DIR}/{node_name}{attempt}.err",
    }


def pool_settings(campaign: Campaign) -> dict[str, str]:
    """What every job of a campaign that runs muongen carries for the pool: the accounting
    project (when set), the hold policy and the credentials."""
    project = campaign.project
    desc = {"My.ProjectName": classad_string(project)} if project is not None else {}
    return desc | hold_policy(campaign) | credential_settings(campaign)


def hold_policy(campaign: Campaign) -> dict[str, str]:
    """Release holds from transient failures a few times, then remove so DAGMan retries.

    Transient: HTCondor could not transfer input (13) or output/checkpoint (12) files, or
    the node exited 75 (EX_TEMPFAIL: storage unreachable), which ``on_exit_hold`` turns into
    a hold. After ``transfer_holds`` holds the job is removed; DAGMan then counts a failure
    and the node's RETRY starts a fresh job.
    """
    d = campaign.dagman
    transient = (
        f"(HoldReasonCode =?= {C.HOLD_TRANSFER_OUTPUT}"
        f" || HoldReasonCode =?= {C.HOLD_TRANSFER_INPUT}"
        f" || (HoldReasonCode =?= {C.HOLD_JOB_POLICY} && HoldReasonSubCode =?= {C.EXIT_TRANSIENT}))"
    )
    return {
        "on_exit_hold": f"ExitCode =?= {C.EXIT_TRANSIENT}",
        "on_exit_hold_reason": classad_string(
            f"node exited {C.EXIT_TRANSIENT}: storage unreachable; released after a delay"
        ),
        "on_exit_hold_subcode": str(C.EXIT_TRANSIENT),
        "periodic_release": (
            f"{transient} && NumHolds <= {d.transfer_holds}"
            f" && (time() - EnteredCurrentStatus) > {d.release_delay_s}"
        ),
        "periodic_remove": f"JobStatus == 5 && {transient} && NumHolds > {d.transfer_holds}",
    }


def credential_settings(campaign: Campaign) -> dict[str, str]:
    """How jobs get tokens: names of HTCondor mechanisms only, never a token value.

    With neither setting, an OSPool access point's own issuer covers the user's
    ``/ospool/apNN/data/<user>`` namespace and public data needs nothing.
    """
    cred = campaign.credentials
    settings: dict[str, str] = {}
    if cred.oauth_service is not None:
        settings["use_oauth_services"] = cred.oauth_service
        if cred.oauth_permissions is not None:
            settings[f"{cred.oauth_service}_oauth_permissions"] = cred.oauth_permissions
        if cred.oauth_resource is not None:
            settings[f"{cred.oauth_service}_oauth_resource"] = cred.oauth_resource
    if cred.scitokens_file is not None:
        settings["scitokens_file"] = cred.scitokens_file
    return settings


def transfer_url(campaign: Campaign, url: str) -> str:
    """A URL as HTCondor's file transfer should see it.

    file:// destinations are folders on the access point: HTCondor moves those files to
    and from the AP itself (plain absolute paths). With an OAuth service the scheme gets
    the ``<service>+`` prefix, which tells the Pelican plugin which token file in
    ``$_CONDOR_CREDS`` to use.
    """
    if url.startswith("file://"):
        return url[len("file://") :]
    service = campaign.credentials.oauth_service
    return f"{service}+{url}" if service else url


def remaps(mapping: dict[str, str]) -> str:
    """transfer_output_remaps value: ``"a = b; c = d"`` (names never contain ';' or '=')."""
    return '"' + "; ".join(f"{name} = {dest}" for name, dest in mapping.items()) + '"'


def condor_arguments(argv: list[str]) -> str:
    """Quote an argument list in HTCondor's new ``arguments`` syntax.

    The whole value is in double quotes; an argument holding a space, a tab or a single
    quote (or an empty one) is wrapped in single quotes, inside which ``'`` is written
    ``''``; a literal ``"`` is written ``""`` everywhere.
    """
    quoted = []
    for arg in argv:
        arg = arg.replace('"', '""')
        if arg == "" or any(ch in arg for ch in " \t'"):
            arg = "'" + arg.replace("'", "''") + "'"
        quoted.append(arg)
    return '"' + " ".join(quoted) + '"'


def classad_string(value: str) -> str:
    """A ClassAd string literal (for My.* attributes)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def post_script_arguments(campaign: Campaign, node: Node) -> list[str]:
    """Arguments of jobs/post_check.py for this node (DAGMan substitutes ``$RETURN``).

    A file:// checkpoint destination is a folder on the access point: the POST script
    checks the published manifest and its .pt there. A remote destination cannot be read
    without a token, so it checks the receipt (the manifest copy the job sent back); the
    .pt's upload is vouched for by HTCondor, which holds a job whose upload failed.
    """
    if node.output_manifest.startswith("file://"):
        target = [transfer_url(campaign, node.output_manifest)]
    else:
        receipt = str(PurePosixPath(C.RECEIPTS_DIR) / f"{node.range_name}.json")
        target = [receipt, "--manifest-only"]
    return [*target, "--expect-range", node.range_name, "--job-return", "$RETURN"]


# --------------------------------------------------------------------------- a sweep's nodes


def evaluate_arguments(campaign: Campaign, last: Node) -> list[str]:
    """jobs/evaluate.sh's arguments: ``muongen evaluate`` flags but ``--out`` (the wrapper's).

    The member's last range checkpoint comes in by file transfer, so ``--checkpoint`` is its
    manifest's file name in the scratch dir.
    """
    from submit.sweep import evaluation_url

    assert campaign.evaluation is not None
    return [
        "--checkpoint", f"{last.range_name}.json",
        "--data", evaluation_url(campaign),
        "--events", str(campaign.evaluation.events),
    ]  # fmt: skip


def evaluate_description(
    campaign: Campaign, member_campaign: Campaign, last: Node, member: str, node_name: str
) -> dict[str, str]:
    """The evaluate node after a member's chain: score its last checkpoint on held-out data.

    ``member_campaign`` is the member's chain (its checkpoint folder); ``last`` its last node.
    The job leaves ``metrics.json`` (published next to the member's checkpoints) and a copy
    (sent back to the access point as ``metrics/<member>/metrics.json``, which the compare
    node reads: it needs no token and sees a missing member as missing).
    """
    res = campaign.resources
    metrics_url = f"{member_campaign.checkpoint_dir}/{C.METRICS_FILE}"
    desc: dict[str, str] = {
        "universe": "container",
        "container_image": str(campaign.image),
        "executable": C.EVALUATE_WRAPPER,
        "arguments": condor_arguments(evaluate_arguments(campaign, last)),
        "request_cpus": str(res.cpus),
        "request_gpus": str(res.gpus),
        "request_memory": res.memory,
        "request_disk": res.disk,
    }
    if res.gpus_minimum_capability is not None:
        desc["gpus_minimum_capability"] = f"{res.gpus_minimum_capability:.1f}"
    desc |= {
        "should_transfer_files": "YES",
        "when_to_transfer_output": "ON_SUCCESS",
        "success_exit_code": "0",
        "max_retries": "0",
        "transfer_input_files": ", ".join(
            (transfer_url(campaign, last.output_pt), transfer_url(campaign, last.output_manifest))
        ),
        "transfer_output_files": ", ".join((C.METRICS_FILE, C.METRICS_RECEIPT)),
        "transfer_output_remaps": remaps(
            {
                C.METRICS_FILE: transfer_url(campaign, metrics_url),
                C.METRICS_RECEIPT: f"{C.METRICS_DIR}/{member}/{C.METRICS_FILE}",
            }
        ),
        "My.JobDurationCategory": classad_string("Medium"),
        "My.MuongenCampaign": classad_string(campaign.name),
        "My.MuongenMember": classad_string(member),
        **job_logs(node_name),
    }
    return desc | pool_settings(campaign)


COMPARE_RESOURCES = {"request_cpus": "1", "request_memory": "4GB", "request_disk": "4GB"}
"""The compare node reads small JSON files and draws a few plots: no GPU."""


def compare_description(campaign: Campaign) -> dict[str, str]:
    """The FINAL compare node: ``muongen compare metrics --out board`` on every evaluation
    that came back (``metrics/`` holds members.json, so a member without metrics.json is a
    failed row), the board sent back to the DAG directory."""
    desc: dict[str, str] = {
        "universe": "container",
        "container_image": str(campaign.image),
        "executable": C.COMPARE_WRAPPER,
        "arguments": condor_arguments([C.METRICS_DIR, "--out", C.BOARD_DIR]),
        **COMPARE_RESOURCES,
        "should_transfer_files": "YES",
        "when_to_transfer_output": "ON_SUCCESS",
        "success_exit_code": "0",
        "max_retries": "0",
        "transfer_input_files": C.METRICS_DIR,  # no trailing '/': the folder itself
        "transfer_output_files": C.BOARD_DIR,
        "My.JobDurationCategory": classad_string("Medium"),
        "My.MuongenCampaign": classad_string(campaign.name),
        **job_logs(C.COMPARE_NODE, retried=False),
    }
    if campaign.project is not None:
        desc["My.ProjectName"] = classad_string(campaign.project)
    return desc


def final_check_arguments() -> list[str]:
    """jobs/final_check.py's arguments: DAGMan fills in the compare job's status, the DAG's
    status and how many nodes failed."""
    return ["--job-return", "$RETURN", "--dag-status", "$DAG_STATUS", "--failed", "$FAILED_COUNT"]
