"""`muongen chain`: one grid node, or the whole chain of nodes on one machine.

A node trains one range of files, continuing from the previous range's checkpoint, and
publishes its own (design section 4):

1. resume from its own self-checkpoint in the scratch dir when the job was restarted
   (eviction, or HTCondor's ``checkpoint_exit_code`` restart);
2. else from the previous range's checkpoint (manifest + sha256 checked; a local file that
   HTCondor transferred in, or a URL fetched through storage);
3. else start fresh, which only the first range may do;
4. train on every file of the range once; exit 85 after the self-checkpoint interval;
5. publish ``<range>.pt`` then ``<range>.json`` and sync TensorBoard events.

``muongen chain --node ...`` is what ``jobs/node.sh`` runs inside the container on an
execute node. ``muongen chain CAMPAIGN --local`` walks a campaign's ranges in order on this
machine, running each node as a subprocess exactly as DAGMan would, with retries,
exponential back-off and a progress record, so a GPU workstation runs what the grid runs.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from muongen.errors import CampaignError, CheckpointError, MuongenError, StorageError
from submit import constants as C  # the grid contract: file names and exit codes, one place

HELP = "run one grid node (--node) or a campaign's whole chain on this machine (--local)"

log = logging.getLogger(__name__)


@dataclass
class NodeSpec:
    """What one node needs; mirrors the arguments jobs/node.sh passes."""

    range_name: str
    data: str
    preset: str = "production-a100"
    overrides: list[str] = field(default_factory=list)
    prev_manifest: str = ""
    ckpt_dest: str = ""
    tb_dest: str = ""
    self_checkpoint_s: float = 0.0
    scratch: str = ""
    campaign: str = ""


def run_node(spec: NodeSpec, stop=None) -> int:
    """Train one range; returns the exit code (0 done, 85 restart me, other: failed).

    ``stop``: the process's StopRequest, installed before anything else (an eviction during
    start-up then exits 85 as well).
    """
    # absolute: a relative scratch dir would be read against whatever the cwd is later
    scratch = Path(spec.scratch or os.environ.get("_CONDOR_SCRATCH_DIR") or os.getcwd()).absolute()
    with node_lock(scratch):
        return _run_node_locked(spec, scratch, stop)


def node_config(spec: NodeSpec, run_dir: Path):
    """The node's config: the campaign's preset and overrides, with what a node must do
    (train its range once, to the end; checkpoint and exit 85 on eviction or budget)."""
    from muongen.config import load_config

    forced = [
        f"data.paths=[{json.dumps(spec.data)}]",
        "data.max_epochs=1",
        "data.synth_if_missing=false",  # a node trains on its range's real files only
        "train.max_steps=0",
        f"train.time_budget_s={float(spec.self_checkpoint_s)}",
        f"train.budget_exit_code={C.EXIT_SELF_CHECKPOINT}",
        # evicted (SIGTERM): checkpoint, then ask to be restarted rather than report success
        f"train.signal_exit_code={C.EXIT_SELF_CHECKPOINT}",
        f"logging.tb_dir={json.dumps(str(run_dir / 'tb' / spec.range_name))}",
    ]
    if spec.ckpt_dest:
        forced.append(f"storage.publish_url={json.dumps(spec.ckpt_dest)}")
    if spec.tb_dest:
        forced.append(f"storage.tb_sync_url={json.dumps(spec.tb_dest)}")
    # train.max_steps has two meanings: where a run stops, and (with optim.decay_steps 0) the
    # cosine schedule's horizon. A node stops at the end of its range instead (max_steps=0
    # above), so the horizon the campaign configured is pinned first, as a count of steps
    # over the whole chain (the step carries over from range to range).
    wanted = load_config(spec.preset, spec.overrides)  # as `muongen train` would run it
    pinned = []
    if wanted.optim.schedule == "cosine" and not wanted.optim.decay_steps:
        pinned.append(f"optim.decay_steps={wanted.train.max_steps}")
    return load_config(spec.preset, [*forced, *pinned, *spec.overrides])


def node_lock(scratch: Path):
    """Hold ``scratch``'s node lock: one node process at a time works in a scratch dir.

    On the grid only one job of a node runs at a time. Here, a node left running after its
    ``muongen chain --local`` was killed would otherwise share the run folder (checkpoints,
    audit log) with the node of the re-run; the later one waits for the earlier to end. The
    kernel drops the lock when its process dies, however it dies.
    """
    from muongen import runlock

    return runlock.hold(scratch, "the node scratch dir", name=C.NODE_LOCK, wait=True)


def _run_node_locked(spec: NodeSpec, scratch: Path, stop=None) -> int:
    from muongen import checkpoint as ckpt
    from muongen.train.command import publish_final
    from muongen.train.trainer import Trainer

    final = _published_final(spec, scratch)
    if final is not None:  # a published, verified range checkpoint is final
        log.info("node %s: %s is published and verified; nothing to do", spec.range_name, final)
        (scratch / C.RECEIPT_FILE).write_bytes(final.read_bytes())
        return 0 if stop is None else stop.late(0, C.EXIT_SELF_CHECKPOINT)
    check = stop.check if stop is not None else (lambda: None)  # start-up's safe points
    run_dir = scratch / C.RUN_DIR.format(range=spec.range_name)
    cfg = node_config(spec, run_dir)
    if stop is not None:
        stop.signal_code = cfg.train.signal_exit_code
    check()
    trainer = Trainer(cfg, run_dir, range_name=spec.range_name, stop=stop)
    check()

    own = ckpt.find_latest(trainer.ckpt_dir)
    if own is not None:
        log.info("node %s: restarted; resuming from its own checkpoint %s", spec.range_name, own)
        trainer.resume(str(own))
    elif spec.prev_manifest:
        check()
        prev = _fetch_previous(spec.prev_manifest, scratch / "previous")
        check()
        log.info(
            "node %s: continuing from the previous range's checkpoint %s", spec.range_name, prev
        )
        trainer.resume(str(prev))
    else:
        log.info("node %s: first range, starting fresh", spec.range_name)
        trainer.resume("fresh")  # (damaged checkpoints of its own are set aside first)
    check()

    code = trainer.train()
    if code == 0:
        # Name <range>.pt/.json at the top of the scratch dir (HTCondor's output transfer
        # picks them up there), and publish through storage when a destination is given.
        staged = publish_final(trainer, spec.range_name, stage_dir=scratch)
        # receipt.json: a copy of the manifest that comes back to the access point, where
        # the POST script checks it when the checkpoint itself went to the OSDF.
        (scratch / C.RECEIPT_FILE).write_bytes(staged.manifest.read_bytes())
    return code if stop is None else stop.late(code, cfg.train.signal_exit_code)


def _published_final(spec: NodeSpec, scratch: Path) -> Path | None:
    """The manifest of this range's final checkpoint when it is already published and
    verified (a retried node), else None. With a destination, only what is published there
    counts (fetched and sha-checked into the scratch dir); without, the named copy here."""
    from muongen import checkpoint as ckpt

    if spec.ckpt_dest:
        from muongen.storage.publish import fetch_published

        pt = fetch_published(spec.ckpt_dest, spec.range_name, str(scratch))
        return None if pt is None else ckpt.manifest_for(pt)
    local = scratch / f"{spec.range_name}.json"
    if not local.exists():
        return None
    try:
        ckpt.verify(local)
    except CheckpointError as exc:
        log.warning("node %s: not final, training again: %s", spec.range_name, exc)
        return None
    return local


def _fetch_previous(manifest: str, dest: Path) -> Path:
    """The previous range's checkpoint as a verified local manifest path."""
    from muongen import checkpoint as ckpt
    from muongen.storage import is_remote

    if is_remote(manifest) or manifest.startswith("file://"):
        from muongen.storage.publish import fetch_checkpoint

        pt = Path(fetch_checkpoint(manifest, str(dest)))
        return ckpt.manifest_for(pt)
    path = Path(manifest)
    if not path.exists():
        raise CheckpointError(
            f"the previous range's checkpoint manifest {manifest} is missing: the previous node "
            "did not publish it (check its POST script log) or it was not transferred in"
        )
    ckpt.verify(path)
    return path


# --------------------------------------------------------------------------- local chain


def run_local_chain(
    campaign_file: str,
    workdir: str | os.PathLike,
    *,
    retries: int = 2,
    backoff_s: float = 5.0,
    node_command: list[str] | None = None,
) -> int:
    """Run every node of a campaign in order on this machine (what DAGMan does on the grid).

    Each node runs as a subprocess (``node_command`` + its arguments; default
    ``python -m muongen chain --node``) and is recorded in ``<workdir>/chain-progress.json``;
    a re-run skips finished ranges. Exit codes mean what they mean to DAGMan: 85 restarts the
    node at once, 2 (a user error) stops the chain with the node's message, anything else is
    retried ``retries`` times (per invocation) with exponential back-off and jitter.
    SIGTERM, SIGINT or SIGHUP is passed on to the running node as SIGTERM (it checkpoints
    and exits 85); the chain then stops with 128 + the signal's number. One local chain at
    a time works in a workdir (a second one is refused, naming the first's host and pid).
    """
    from submit.campaign import load_campaign
    from submit.errors import SubmitError

    try:
        campaign = load_campaign(campaign_file)
    except SubmitError as exc:  # submit/ cannot import muongen, so it raises its own type
        raise CampaignError(str(exc)) from None
    from muongen import runlock

    # Absolute: a node runs with its scratch dir as its cwd, so a relative path it is given
    # (its scratch dir, _CONDOR_SCRATCH_DIR) would point inside itself.
    workdir = Path(workdir).absolute()
    with runlock.hold(workdir, "the chain workdir"):  # one local chain per workdir
        return _run_chain(campaign, workdir, retries, backoff_s, node_command)


def _run_chain(campaign, workdir: Path, retries: int, backoff_s: float, node_command) -> int:
    from muongen.train.signals import active
    from submit.campaign import plan_nodes

    progress_path = workdir / C.PROGRESS_FILE
    progress = json.loads(progress_path.read_text()) if progress_path.exists() else {}
    command = node_command or [sys.executable, "-m", "muongen", "chain", "--node"]
    nodes = plan_nodes(campaign)
    runner = _NodeRunner()
    early = active()  # a signal that came during start-up is passed on like a later one
    runner.stopped = (early.signum or 0) if early is not None else 0
    try:
        with runner.signals_passed_on():
            return _walk(nodes, command, campaign, workdir, runner, progress, retries, backoff_s)
    finally:
        # whatever ended this process's walk, no range stays "running" in the record
        running = [e for e in progress.values() if e.get("status") == "running"]
        for entry in running:
            entry["status"] = "failed"
        if running:
            _write_json(progress_path, progress)


def _walk(nodes, command, campaign, workdir, runner, progress, retries, backoff_s) -> int:
    from muongen import checkpoint as ckpt
    from submit.campaign import node_arguments

    progress_path = workdir / C.PROGRESS_FILE
    for i, node in enumerate(nodes, 1):
        name = node.range_name
        if progress.get(name, {}).get("status") == "done":
            log.info(
                "[%d/%d] %s already done (step %s)",
                i,
                len(nodes),
                name,
                progress[name].get("step"),
            )
            continue
        scratch = workdir / name
        scratch.mkdir(parents=True, exist_ok=True)
        argv = [*command, *node_arguments(campaign, node)]
        entry = progress.setdefault(name, {"attempts": 0})
        failures = 0  # this invocation's: a re-run after fixing the cause starts afresh
        while True:
            if runner.stopped:
                return _interrupted(runner.stopped, name, progress, progress_path)
            entry["attempts"] += 1
            entry["status"] = "running"
            _write_json(progress_path, progress)
            log.info(
                "[%d/%d] %s attempt %d: %s",
                i,
                len(nodes),
                name,
                entry["attempts"],
                shlex.join(argv),
            )
            env = {**os.environ, "_CONDOR_SCRATCH_DIR": str(scratch)}
            code, message = runner.run(argv, scratch, env)
            if code == C.EXIT_SELF_CHECKPOINT:
                entry["attempts"] -= 1  # a self-checkpoint restart is not a failure
                log.info(
                    "%s checkpointed and asked to be restarted (exit %d)",
                    name,
                    C.EXIT_SELF_CHECKPOINT,
                )
                continue
            if code == C.EXIT_DONE:
                meta = ckpt.read_manifest(scratch / f"{name}.json")
                entry.update(status="done", step=meta["step"], sha256=meta["sha256"], exit_code=0)
                _write_json(progress_path, progress)
                break
            entry.update(status="failed", exit_code=code)
            _write_json(progress_path, progress)
            if runner.stopped:
                return _interrupted(runner.stopped, name, progress, progress_path)
            if code == C.EXIT_USER_ERROR:
                raise MuongenError(
                    f"range {name}: {message or 'the node reported a user error'} "
                    f"(exit code {code}: not retried, a retry cannot fix it; fix the cause "
                    "and re-run the same command, finished ranges are skipped)"
                )
            failures += 1
            if failures > retries:
                raise MuongenError(
                    f"range {name} failed {failures} times (last exit code {code}"
                    f"{': ' + message if message else ''}); see {scratch}. Fix the cause and "
                    f"re-run the same command: finished ranges are skipped ({progress_path})"
                )
            delay = backoff_s * 2 ** (failures - 1) * (1 + 0.25 * random.random())
            log.warning("%s failed with exit code %d; retrying in %.1f s", name, code, delay)
            runner.sleep(delay)
    log.info("chain complete: %d ranges; progress in %s", len(nodes), progress_path)
    return 0


def _interrupted(signum: int, name: str, progress: dict, progress_path: Path) -> int:
    progress[name]["status"] = "interrupted"
    _write_json(progress_path, progress)
    log.warning(
        "stopped by %s while on range %s; re-run the same command to continue (finished "
        "ranges are skipped, the node resumes from its checkpoint)",
        signal.Signals(signum).name,
        name,
    )
    return 128 + signum


class _NodeRunner:
    """Runs node processes one at a time, passing this process's stop signals on to them."""

    STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def __init__(self) -> None:
        self.stopped = 0  # the stop signal received, 0 while none
        self._proc: subprocess.Popen | None = None

    @contextlib.contextmanager
    def signals_passed_on(self):
        def handler(signum, _frame):
            self.stopped = self.stopped or signum
            if self._proc is not None and self._proc.poll() is None:
                self._proc.send_signal(signal.SIGTERM)  # an eviction: checkpoint, exit 85

        old = {sig: signal.signal(sig, handler) for sig in self.STOP_SIGNALS}
        try:
            yield self
        finally:
            for sig, h in old.items():
                signal.signal(sig, h)

    def run(self, argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str]:
        """Run one node attempt to its end; returns (exit code, its last error line).

        The node's stderr passes through to ours as it comes. It runs in a session of its
        own, so a Ctrl-C reaches it once, through this process, as a SIGTERM.
        """
        last: collections.deque[str] = collections.deque(maxlen=50)
        try:
            self._proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stderr=subprocess.PIPE,
                start_new_session=True,
                text=True,
                errors="replace",
            )
        except OSError as exc:  # a --node-command that does not exist or cannot run
            raise CampaignError(
                f"cannot start the node command {argv[0]} ({exc.strerror}); check --node-command"
            ) from None
        if self.stopped:  # a signal came while it started
            self._proc.send_signal(signal.SIGTERM)
        try:
            for line in self._proc.stderr:
                sys.stderr.write(line)
                sys.stderr.flush()
                last.append(line.rstrip("\n"))
            code = self._proc.wait()
        finally:
            self._proc.stderr.close()
            self._proc = None
        errors = [line for line in last if ": error: " in line]
        return code, (errors[-1].split(": error: ", 1)[1] if errors else "")

    def sleep(self, seconds: float) -> None:
        """Sleep, but wake up at once on a stop signal."""
        end = time.monotonic() + seconds
        while not self.stopped and time.monotonic() < end:
            time.sleep(min(0.1, end - time.monotonic()))


def _write_json(path: Path, obj) -> None:
    from muongen.checkpoint import atomic_write

    atomic_write(path, (json.dumps(obj, indent=2) + "\n").encode())


# --------------------------------------------------------------------------- CLI


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("campaign_file", nargs="?", help="campaign YAML (with --local)")
    parser.add_argument("--local", action="store_true", help="run every range here, in order")
    parser.add_argument("--workdir", default="chain", help="where the local chain runs [chain]")
    parser.add_argument("--retries", type=int, default=2, help="retries per range [2]")
    parser.add_argument(
        "--backoff", type=float, default=5.0, help="first retry delay, doubling [5 s]"
    )
    parser.add_argument(
        "--node-command", default=None, help="command that runs a node (default: this muongen)"
    )
    node = parser.add_argument_group("one node (what jobs/node.sh runs)")
    node.add_argument("--node", action="store_true", help="run one node")
    node.add_argument("--campaign-name", default="")
    node.add_argument("--range", dest="range_name")
    node.add_argument(
        "--data", "--data-glob", dest="data", help="the range's input files (glob/URL)"
    )
    node.add_argument(
        "--prev-manifest", default="", help="previous range's manifest (path/URL; empty: first)"
    )
    node.add_argument("--ckpt-dest", default="", help="where to publish <range>.pt/.json")
    node.add_argument("--tb-dest", default="", help="where to sync TensorBoard events")
    node.add_argument("--preset", default="production-a100")
    node.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    node.add_argument(
        "--self-checkpoint-s", type=float, default=0.0, help="exit 85 after N s (0: off)"
    )
    node.add_argument("--scratch", default="", help="scratch dir [$_CONDOR_SCRATCH_DIR or cwd]")
    sweep = parser.add_argument_group("a campaign with a sweep: block (muongen/sweep.py)")
    sweep.add_argument("--parallel", type=int, default=1, help="member chains at once [1]")
    sweep.add_argument("--member", default="", help="run one member's chain in --workdir")


def run(args: argparse.Namespace) -> int:
    if args.node:
        from muongen.train.signals import Evicted, StopRequest, active

        if not args.range_name or not args.data:
            raise CampaignError("--node needs --range and --data")
        # installed by muongen.cli before anything heavy loads; called any other way, here
        stop = active() or StopRequest("chain").install()
        try:
            return _run_node_from_args(args, stop)
        except StorageError as exc:
            # Transient on the grid (an origin down, a cache hiccup): ask to be held and
            # released later rather than burning one of DAGMan's retries.
            print(f"muongen chain: storage error: {exc}", file=sys.stderr)
            return C.EXIT_TRANSIENT
        except Evicted as exc:
            print(f"muongen chain: {exc}", file=sys.stderr)
            return exc.exit_code
        finally:
            if stop is not active():
                stop.restore()
    if not args.local or not args.campaign_file:
        raise CampaignError(
            "give a campaign file and --local to run the chain here, or --node to run one node; "
            "to submit to HTCondor use `python -m submit submit CAMPAIGN`"
        )
    from muongen.sweep import local_sweep

    # a sweep: its members (chains, then evaluations), then the board
    code = local_sweep(args, _run_chain)
    if code is not None:
        return code
    command = shlex.split(args.node_command) if args.node_command else None
    return run_local_chain(
        args.campaign_file,
        args.workdir,
        retries=args.retries,
        backoff_s=args.backoff,
        node_command=command,
    )


def _run_node_from_args(args: argparse.Namespace, stop=None) -> int:
    return run_node(
        NodeSpec(
            range_name=args.range_name,
            data=args.data,
            preset=args.preset,
            overrides=args.overrides,
            prev_manifest=args.prev_manifest,
            ckpt_dest=args.ckpt_dest,
            tb_dest=args.tb_dest,
            self_checkpoint_s=args.self_checkpoint_s,
            scratch=args.scratch,
            campaign=args.campaign_name,
        ),
        stop,
    )
