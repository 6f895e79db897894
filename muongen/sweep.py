"""`muongen chain SWEEP.yaml --local [--parallel N]`: a campaign's sweep on this machine.

A campaign with a ``sweep:`` block (submit/sweep.py) has many members, each a whole chain
over the campaign's ranges with its own ``--set`` overrides and seed. Locally, as on the
grid, each member's chain runs, then ``muongen evaluate`` scores its last checkpoint on the
held-out ``evaluation.data``, then ``muongen compare`` writes the leaderboard::

    WORKDIR/
      members.json            member -> settings, seed, overrides (submit.sweep.members_json)
      sweep-progress.json     per member: the checkpoint its evaluation scored, exit codes
      <member>/               the member's local chain (chain-progress.json, <range>/ ...)
        sweep.log             what its chain and evaluation printed
        eval/                 metrics.json, report.md, plots (muongen evaluate --out)
      board/                  leaderboard.md, leaderboard.json, plots (muongen compare)

A member's checkpoints are published under ``<outputs.checkpoints>/<campaign>/<member>/``
and its TensorBoard events under ``<outputs.tensorboard>/<campaign>/<member>/<range>/``,
the names the grid uses. Each member's chain is a subprocess (``muongen chain CAMPAIGN
--local --member NAME``), ``--parallel N`` of them at once. Exit codes follow the local
chain's: 0 when every member finished and was scored; a signal (SIGTERM, SIGINT, SIGHUP)
is passed on to every running member as SIGTERM (its node checkpoints) and the sweep stops
with 128 + the signal's number; a member that failed does not stop the others, the board
lists it as failed and the sweep exits 2 naming it. A re-run of the same command skips
finished members (and, inside a member, finished ranges) and evaluations already made.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from muongen.errors import CampaignError, MuongenError
from submit import constants as C

log = logging.getLogger(__name__)

MEMBERS_FILE = "members.json"
PROGRESS_FILE = "sweep-progress.json"
EVAL_DIR = "eval"
BOARD_DIR = "board"
MEMBER_LOG = "sweep.log"
EVAL_RECORD = "evaluated.json"  # in a member's folder: the checkpoint its metrics.json scored
PARENT_ENV = "MUONGEN_SWEEP_PARENT"  # a member's sweep: the member stops when it is gone
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def load(campaign_file: str):
    """The campaign (a CampaignError for a bad file) and its members ([] without a sweep)."""
    from submit.campaign import load_campaign
    from submit.errors import SubmitError
    from submit.sweep import members

    try:
        campaign = load_campaign(campaign_file)
        return campaign, members(campaign)
    except SubmitError as exc:  # submit/ cannot import muongen, so it raises its own type
        raise CampaignError(str(exc)) from None


def member_campaign(campaign, member):
    """The campaign of one member's chain (submit.sweep's, as on the grid): its overrides,
    and its outputs under ``<campaign>/<member>/``."""
    from submit.sweep import member_campaign as of_member

    return of_member(campaign, member)


def local_sweep(args: argparse.Namespace, run_chain) -> int | None:
    """``muongen chain --local`` for a sweep campaign (None: not a sweep, the plain chain).

    ``run_chain(campaign, workdir, retries, backoff_s, node_command) -> exit code`` runs one
    member's chain (:mod:`muongen.chain`'s, passed in: that module dispatches here, so this
    one does not import it back)."""
    campaign, members = load(args.campaign_file)
    if args.member:
        return run_member(args, campaign, members, run_chain)
    if not members:
        if args.parallel != 1:
            raise CampaignError(
                f"--parallel runs a sweep's members at once; {args.campaign_file} has no "
                "sweep: block (one chain runs its ranges in order)"
            )
        return None
    if args.parallel < 1:
        raise CampaignError("--parallel must be at least 1")
    return Sweep(args, campaign, members).run()


def run_member(args: argparse.Namespace, campaign, members, run_chain) -> int:
    """One member, in this process (what the sweep starts per member): its chain over the
    campaign's ranges in ``--workdir``, then its evaluation into ``--workdir``/eval."""
    from muongen import runlock
    from muongen.train.signals import active

    found = {m.name: m for m in members}
    if args.member not in found:
        raise CampaignError(
            f"--member {args.member}: not a member of {args.campaign_file} "
            f"({', '.join(found) or 'it has no sweep: block'})"
        )
    _stop_with_parent()
    workdir = Path(args.workdir).absolute()
    command = shlex.split(args.node_command) if args.node_command else None
    # wait=True: a member left running by a sweep that was killed ends first (its parent
    # watch below has just told it to checkpoint and stop)
    with runlock.hold(workdir, "the member's chain workdir", wait=True):
        code = run_chain(
            member_campaign(campaign, found[args.member]),
            workdir,
            args.retries,
            args.backoff,
            command,
        )
        stop = active()
        if code != 0 or (stop is not None and stop.signum):
            return code or 128 + int(stop.signum)
        return evaluate_member(campaign, workdir)


def _stop_with_parent() -> None:
    """A member started by a sweep stops (SIGTERM to itself: its node checkpoints) when the
    sweep is gone, e.g. SIGKILLed: the re-run's member would otherwise wait for it."""
    parent = int(os.environ.get(PARENT_ENV, "0") or 0)
    if not parent:
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        log.warning("the sweep (pid %d) is gone: stopping this member", parent)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="sweep-parent-watch", daemon=True).start()


def final_checkpoint(campaign, workdir: Path) -> tuple[Path, str] | None:
    """The member's last range checkpoint (its manifest in the scratch dir) and its sha256,
    once every range is done; else None."""
    from submit.campaign import plan_nodes

    ranges = [n.range_name for n in plan_nodes(campaign)]
    try:
        progress = json.loads((workdir / C.PROGRESS_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not all(progress.get(r, {}).get("status") == "done" for r in ranges):
        return None
    last = ranges[-1]
    return workdir / last / f"{last}.json", progress[last]["sha256"]


def evaluated(campaign, workdir: Path) -> bool:
    """Whether the member's final checkpoint has been scored (its metrics.json is there)."""
    final = final_checkpoint(campaign, workdir)
    if final is None or not (workdir / EVAL_DIR / "metrics.json").exists():
        return False
    try:
        record = json.loads((workdir / EVAL_RECORD).read_text())
    except (OSError, ValueError):
        return False
    return record.get("sha256") == final[1]


def evaluate_member(campaign, workdir: Path) -> int:
    """``muongen evaluate`` of the member's final checkpoint on ``evaluation.data`` (skipped
    when done); a record of the checkpoint it scored is written last."""
    from muongen.evaluate import command as evaluate

    manifest, sha = final_checkpoint(campaign, workdir)
    if evaluated(campaign, workdir):
        log.info("member %s: already evaluated", workdir.name)
        return 0
    from submit.sweep import evaluation_url

    out = workdir / EVAL_DIR
    data, events = evaluation_url(campaign), campaign.evaluation.events
    argv = ["--checkpoint", str(manifest), "--data", data, "--events", str(events)]
    argv += ["--out", str(out)]
    if any((out / f).exists() for f in evaluate.OUTPUT_FILES):
        argv.append("--overwrite")  # what an interrupted evaluation of this member left
    parser = argparse.ArgumentParser(prog="muongen evaluate")
    evaluate.configure(parser)
    log.info("member %s: muongen evaluate %s", workdir.name, shlex.join(argv))
    code = evaluate.run(parser.parse_args(argv))
    if code == 0:
        _write_json(workdir / EVAL_RECORD, {"checkpoint": str(manifest), "sha256": sha})
    return code


def _write_json(path: Path, obj) -> None:
    from muongen.checkpoint import atomic_write

    atomic_write(path, (json.dumps(obj, indent=2) + "\n").encode())


def _last_error(path: Path) -> str:
    """The last ``muongen ...: error: ...`` line of a member's log ("" when none)."""
    try:
        lines = collections.deque(path.open(errors="replace"), maxlen=200)
    except OSError:
        return ""
    errors = [ln.strip() for ln in lines if ": error: " in ln]
    return errors[-1].split(": error: ", 1)[1] if errors else ""


class Sweep:
    """The members' chains, evaluations and the board, with a progress record."""

    def __init__(self, args: argparse.Namespace, campaign, members) -> None:
        from submit.campaign import plan_nodes

        self.args, self.campaign, self.members = args, campaign, members
        self.workdir = Path(args.workdir).absolute()
        self.ranges = [n.range_name for n in plan_nodes(campaign)]
        self.progress_path = self.workdir / PROGRESS_FILE
        self.progress: dict[str, dict] = {}
        self.lock = threading.Lock()  # the progress record and the running processes
        self.procs: dict[str, subprocess.Popen] = {}
        self.stopped = 0  # the stop signal received, 0 while none

    # ------------------------------------------------------------------ the whole sweep

    def run(self) -> int:
        from muongen import runlock
        from submit.sweep import members_json

        with runlock.hold(self.workdir, "the sweep workdir"):
            if self.progress_path.exists():
                self.progress = json.loads(self.progress_path.read_text())
            _write_json(self.workdir / MEMBERS_FILE, members_json(self.members))
            with self._signals_passed_on():
                failed = self._run_members()
            if self.stopped:
                log.warning(
                    "sweep stopped by %s; re-run the same command to continue (finished "
                    "members, ranges and evaluations are skipped)",
                    signal.Signals(self.stopped).name,
                )
                return 128 + self.stopped
            board = self._compare()
        if failed:
            raise MuongenError(
                f"{len(failed)} of {len(self.members)} sweep members failed: "
                + "; ".join(f"{m} ({why})" for m, why in failed.items())
                + f". The others finished and {board} lists every member. Fix the cause and "
                "re-run the same command: finished members and ranges are skipped"
            )
        log.info("sweep complete: %d members; leaderboard %s", len(self.members), board)
        return 0

    def _run_members(self) -> dict[str, str]:
        """Every member, ``--parallel`` at a time; returns {failed member: why}."""
        failed: dict[str, str] = {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=self.args.parallel) as pool:
            futures = {pool.submit(self._member, i, m): m for i, m in enumerate(self.members, 1)}
            pending = set(futures)
            while pending:  # the main thread stays free for the signal handlers
                done, pending = concurrent.futures.wait(pending, timeout=0.2)
                for f in done:
                    why = f.result()
                    if why:
                        failed[futures[f].name] = why
        return failed

    def _compare(self) -> Path:
        from muongen.compare import compare

        board = self.workdir / BOARD_DIR
        members = compare([str(self.workdir)], board)
        ok = sum(1 for m in members if m.status == "ok")
        best = next((m for m in members if m.status == "ok"), None)
        log.info(
            "leaderboard: %d of %d members scored%s; %s",
            ok,
            len(members),
            f", best {best.name} (worst {best.worst}, median {best.median})" if best else "",
            board / "leaderboard.md",
        )
        return board / "leaderboard.md"

    # ------------------------------------------------------------------ one member

    def _member(self, index: int, member) -> str:
        """One member's process (chain, then evaluation); returns why it failed ("": it
        did not, or the sweep was stopped)."""
        where = self.workdir / member.name
        tag = f"[{index}/{len(self.members)}] {member.name}"
        mine = member_campaign(self.campaign, member)
        if evaluated(mine, where):
            log.info("%s: chain and evaluation already done", tag)
            self._record(member.name, status="done")
            return ""
        if self.stopped:
            return ""
        log.info(
            "%s: chain over %d ranges, then evaluation (log %s)",
            tag,
            len(self.ranges),
            where / MEMBER_LOG,
        )
        code = self._call(member.name, self._member_argv(member, where), where)
        if self.stopped:
            self._record(member.name, status="interrupted", exit_code=code)
            return ""
        if code != 0 or not evaluated(mine, where):
            why = _last_error(where / MEMBER_LOG) or f"see {where / MEMBER_LOG}"
            self._record(member.name, status="failed", exit_code=code)
            log.error("%s: failed (exit code %d): %s", tag, code, why)
            return f"exit code {code}: {why}"
        self._record(member.name, status="done", exit_code=0)
        summary = json.loads((where / EVAL_DIR / "metrics.json").read_text()).get("summary", {})
        log.info(
            "%s: done; median ratio %s, worst %s",
            tag,
            summary.get("median_ratio"),
            summary.get("worst_ratio"),
        )
        return ""

    def _member_argv(self, member, where: Path) -> list[str]:
        a = self.args
        argv = [sys.executable, "-m", "muongen", "chain", str(Path(a.campaign_file).absolute())]
        argv += ["--local", "--workdir", str(where), "--member", member.name]
        argv += ["--retries", str(a.retries), "--backoff", str(a.backoff)]
        if a.node_command:
            argv += ["--node-command", a.node_command]
        return argv

    def _call(self, name: str, argv: list[str], where: Path) -> int:
        """Run one process of a member (its output appended to its log) to its end."""
        where.mkdir(parents=True, exist_ok=True)
        with (where / MEMBER_LOG).open("a") as out:
            out.write(f"$ {shlex.join(argv)}\n")
            out.flush()
            with self.lock:
                if self.stopped:
                    return 128 + self.stopped
                try:
                    proc = subprocess.Popen(
                        argv,
                        cwd=where,
                        env={**os.environ, PARENT_ENV: str(os.getpid())},
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # a Ctrl-C reaches it once, through us
                    )
                except OSError as exc:
                    raise CampaignError(f"cannot start {argv[0]} ({exc.strerror})") from None
                self.procs[name] = proc
            if self.stopped:  # a signal came while it started
                proc.send_signal(signal.SIGTERM)
            try:
                return proc.wait()
            finally:
                with self.lock:
                    self.procs.pop(name, None)

    def _record(self, name: str, **fields) -> None:
        with self.lock:
            self.progress.setdefault(name, {}).update(fields)
            _write_json(self.progress_path, self.progress)

    # ------------------------------------------------------------------ signals

    def _signals_passed_on(self):
        import contextlib

        @contextlib.contextmanager
        def passed_on():
            def handler(signum, _frame):
                self.stopped = self.stopped or signum
                for proc in list(self.procs.values()):
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGTERM)  # its node checkpoints, exits 85

            from muongen.train.signals import active

            early = active()  # a signal that came while muongen started counts too
            self.stopped = (early.signum or 0) if early is not None else 0
            old = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
            try:
                yield
            finally:
                for sig, h in old.items():
                    signal.signal(sig, h)

        return passed_on()
