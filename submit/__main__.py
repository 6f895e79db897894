"""``python -m submit``: plan, write, submit and follow a campaign's DAG.

python -m submit plan CAMPAIGN              the nodes: range, input and output checkpoint
python -m submit write CAMPAIGN [--out DIR] the DAG directory (default DIR: ./<name>)
python -m submit submit CAMPAIGN [--out DIR]
                                            write if needed, then submit (or print the
                                            condor_submit_dag command without a schedd,
                                            and exit 3: nothing was submitted);
                                            after a failure it resumes the rescue DAG
python -m submit status DIR                 the node status file, summarised (a sweep:
                                            one row per member)

A campaign with a ``sweep:`` block (see submit/examples/sweep.yaml and docs/sweeps.md) makes
one chain per member, an evaluate node after each and a final compare node: the same verbs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from submit import constants as C
from submit.errors import SubmitError


def cmd_plan(args: argparse.Namespace) -> int:
    from submit.campaign import load_campaign, plan_nodes
    from submit.sweep import member_campaign, members

    campaign = load_campaign(args.campaign)
    nodes = plan_nodes(campaign)
    res, t = campaign.resources, campaign.training
    gpu = f"{res.gpus} GPU" + (
        f" (capability >= {res.gpus_minimum_capability:.1f})" if res.gpus_minimum_capability else ""
    )
    sets = "".join(f" --set {o}" for o in t.overrides)
    print(
        f"campaign {campaign.name}: {len(nodes)} nodes in a chain, ranges "
        f"{nodes[0].range_name} .. {nodes[-1].range_name}"
    )
    print(f"  data         {campaign.data_glob('{range}')}")
    print(f"  image        {campaign.image or '- (none: only muongen chain --local can run it)'}")
    print(
        f"  resources    {gpu}, {res.cpus} CPUs, {res.memory} memory, {res.disk} disk; "
        f"{campaign.dagman.job_duration} jobs, {campaign.dagman.retries} retries"
    )
    print(f"  training     preset {t.preset}{sets}; self-checkpoint every {t.self_checkpoint_s} s")
    if campaign.sweep is None:
        print(f"  checkpoints  {campaign.checkpoint_dir}/{{range}}.pt + .json")
        print(f"  tensorboard  {campaign.tensorboard_dir('{range}')}/")
    else:  # the table below is a member's chain: every URL sits in <name>/<member>/
        nodes = plan_nodes(member_campaign(campaign, members(campaign)[0]))
    width = len(nodes[0].range_name)
    inputs = [n.input_manifest or "- (starts fresh)" for n in nodes]
    in_width = max(len(i) for i in inputs)
    print(f"{'#':>4}  {'range':<{width}}  {'input checkpoint':<{in_width}}  output checkpoint")
    for node, source in zip(nodes, inputs):
        print(f"{node.index + 1:>4}  {node.range_name}  {source:<{in_width}}  {node.output_pt}")
    if campaign.sweep is not None:
        _plan_sweep(campaign, len(nodes))
    return 0


def _plan_sweep(campaign, ranges: int) -> None:
    """The members a sweep campaign makes: each runs the chain above in its own folder."""
    from submit.sweep import evaluation_url, members, name_value

    found = members(campaign)
    ev = campaign.evaluation
    print(
        f"sweep: {len(found)} members, each a chain like the one above ({ranges} ranges; "
        f"member 1's shown) with its own settings, {campaign.dagman.max_running} chain(s) at "
        "a time (dagman.max_running)"
    )
    print(f"  checkpoints  {campaign.checkpoint_dir}/<member>/{{range}}.pt + .json")
    print(f"  tensorboard  {campaign.outputs.tensorboard}/{campaign.name}/<member>/{{range}}/")
    print(
        f"  evaluate     after each chain: muongen evaluate on {ev.events} events of "
        f"{evaluation_url(campaign)} -> {campaign.checkpoint_dir}/<member>/metrics.json"
    )
    print("  compare      at the end (FINAL, also after failures): muongen compare -> board/")
    width = max(len(m.name) for m in found)
    print(f"{'#':>4}  {'member':<{width}}  settings")
    for i, m in enumerate(found):
        sets = " ".join(f"{k}={name_value(v)}" for k, v in m.settings.items())
        print(f"{i + 1:>4}  {m.name:<{width}}  {sets} train.seed={m.seed}")


def _write(args: argparse.Namespace, campaign) -> Path:
    from submit.dag import write_campaign_dag

    out = Path(args.out or campaign.name)
    dag_file = write_campaign_dag(
        campaign, out, campaign_text=Path(args.campaign).read_text(), force=args.force
    )
    ranges = campaign.ranges.end - campaign.ranges.start + 1
    if campaign.sweep is None:
        print(f"wrote {dag_file} ({ranges} nodes)")
    else:
        from submit.sweep import members

        count = len(members(campaign))
        print(
            f"wrote {dag_file} ({count} member chains of {ranges} ranges, {count} evaluate "
            "nodes, 1 compare node)"
        )
    return out


def cmd_write(args: argparse.Namespace) -> int:
    from submit.campaign import load_campaign
    from submit.submission import submit_command

    campaign = load_campaign(args.campaign)
    out = _write(args, campaign)
    print(f"submit it with: {submit_command(out, campaign.name)}")
    print(f"         or:    python -m submit submit {args.campaign} --out {out}")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from submit.campaign import load_campaign, plan_nodes
    from submit.submission import find_rescue, rescue_done_nodes, submit_dag

    campaign = load_campaign(args.campaign)
    out = Path(args.out or campaign.name)
    rescue = find_rescue(out)
    if rescue is not None and not args.force:
        done = rescue_done_nodes(rescue)
        if campaign.sweep is None:
            total = len(plan_nodes(campaign))
        else:
            from submit.sweep import members

            total = 2 * len(members(campaign))  # a chain and an evaluate node per member
        print(
            f"{out}: found the rescue DAG {rescue.name} ({len(done)} of "
            f"{total} nodes done): resubmitting continues from it, with "
            "the DAG and submit files as they were written (pass --force to start over)"
        )
        copy = out / C.CAMPAIGN_COPY
        if copy.is_file() and copy.read_text() != Path(args.campaign).read_text():
            print(f"note: {args.campaign} differs from {copy}; the rescue DAG runs as written")
    else:
        _write(args, campaign)
    if submit_dag(out, campaign.name, force=args.force).cluster is None:
        print(
            f"nothing was submitted (no HTCondor schedd reachable): {out} is written; run the "
            "command above on the access point",
            file=sys.stderr,
        )
        return C.EXIT_NOT_SUBMITTED
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from submit.status import (
        format_summary,
        format_sweep_summary,
        is_sweep_dir,
        read_status,
        read_sweep_status,
    )

    if is_sweep_dir(args.dag_dir):
        print(format_sweep_summary(read_sweep_status(args.dag_dir), args.dag_dir))
    else:
        print(format_summary(read_status(args.dag_dir), args.dag_dir))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m submit",
        description="Train a muongen campaign as an HTCondor DAGMan chain, one node per range.",
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("plan", help="print the chain of nodes a campaign makes")
    p.add_argument("campaign", help="campaign YAML (see submit/examples/campaign.yaml)")
    p.set_defaults(func=cmd_plan)
    for name, func, text in (
        ("write", cmd_write, "write the DAG directory"),
        ("submit", cmd_submit, "write if needed, then submit (or print condor_submit_dag)"),
    ):
        p = verbs.add_parser(name, help=text)
        p.add_argument("campaign", help="campaign YAML")
        p.add_argument("--out", help="DAG directory [./<campaign name>]")
        p.add_argument(
            "--force",
            action="store_true",
            help="rewrite and resubmit a DAG that was already submitted (starts over)",
        )
        p.set_defaults(func=func)
    p = verbs.add_parser("status", help=f"summarise DIR/{C.STATUS_FILE}")
    p.add_argument("dag_dir", help="the DAG directory")
    p.set_defaults(func=cmd_status)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SubmitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
