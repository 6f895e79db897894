"""Summarise DAGMan's node status file (``campaign.dag.status``) for ``python -m submit status``.

The file is a sequence of new-style ClassAds (HTCondor manual, "Current Node Status
File"): one ``Type = "DagStatus"`` ad, one ``Type = "NodeStatus"`` ad per node and a
``Type = "StatusEnd"`` ad; values carry comments such as ``NodeStatus = 5; /* "STATUS_DONE" */``.
A small parser for that subset keeps this module free of the ClassAd bindings.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from submit import constants as C
from submit.errors import DagDirError
from submit.submission import find_rescue

NODE_STATES = {
    0: "not ready",  # a parent has not finished
    1: "ready",  # waiting to be submitted (throttles)
    2: "pre",  # PRE script running
    3: "submitted",  # job in the queue (idle, running or held)
    4: "post",  # POST check running
    5: "done",
    6: "failed",  # retries used up; a rescue DAG will be written
    7: "futile",  # an ancestor failed, so it will never run
}

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<comment>/\*.*?\*/|//[^\n]*)
      | (?P<string>"(?:[^"\\]|\\.)*")
      | (?P<number>[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)
      | (?P<name>[A-Za-z_][A-Za-z0-9_.]*)
      | (?P<punct>[\[\]{};=,])
    )""",
    re.VERBOSE | re.DOTALL,
)


def parse_classads(text: str) -> list[dict[str, Any]]:
    """The top-level ``[ key = value; ... ]`` ads of ``text`` (strings, numbers, lists, names)."""
    tokens = _tokenize(text)
    ads: list[dict[str, Any]] = []
    pos = 0
    while pos < len(tokens):
        if tokens[pos] != ("punct", "["):
            raise ValueError(f"expected '[' but found {tokens[pos][1]!r}")
        pos += 1
        ad: dict[str, Any] = {}
        while tokens[pos] != ("punct", "]"):
            kind, key = tokens[pos]
            if kind != "name" or tokens[pos + 1] != ("punct", "="):
                raise ValueError(f"expected 'name =' but found {key!r}")
            value, pos = _value(tokens, pos + 2)
            ad[key] = value
            if tokens[pos] == ("punct", ";"):
                pos += 1
        ads.append(ad)
        pos += 1
    return ads


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ValueError(f"cannot parse {text[pos : pos + 20]!r}")
        pos = m.end()
        kind = m.lastgroup
        if kind != "comment":
            tokens.append((kind, m.group(kind)))
    return tokens


def _value(tokens: list[tuple[str, str]], pos: int) -> tuple[Any, int]:
    kind, text = tokens[pos]
    if kind == "string":
        try:
            return json.loads(text), pos + 1  # the escapes DAGMan writes are JSON's too
        except ValueError:
            return text[1:-1], pos + 1
    if kind == "number":
        return (float(text) if any(c in text for c in ".eE") else int(text)), pos + 1
    if kind == "name":
        lowered = text.lower()
        return {"true": True, "false": False}.get(lowered, text), pos + 1
    if text == "{":
        items, pos = [], pos + 1
        while tokens[pos] != ("punct", "}"):
            item, pos = _value(tokens, pos)
            items.append(item)
            if tokens[pos] == ("punct", ","):
                pos += 1
        return items, pos + 1
    raise ValueError(f"unexpected {text!r}")


@dataclass(frozen=True)
class NodeState:
    name: str
    state: str
    retries: int
    details: str
    held: int
    step: int | None
    """Training step from the node's receipt (a finished node), if present."""


@dataclass(frozen=True)
class DagSummary:
    dag_state: str
    counts: dict[str, int]
    nodes: list[NodeState]
    updated: datetime | None
    rescue: str | None

    @property
    def failed(self) -> list[NodeState]:
        return [n for n in self.nodes if n.state == "failed"]


def read_status(dag_dir: str | Path) -> DagSummary:
    """Parse ``dag_dir``'s node status file, adding steps from the receipts."""
    dag_dir = Path(dag_dir)
    path = dag_dir / C.STATUS_FILE
    if not path.is_file():
        raise DagDirError(
            f"{path} not found: the DAG was not submitted yet, or DAGMan has not written its "
            f"first status (it does within {C.STATUS_UPDATE_S} s of starting)"
        )
    try:
        ads = parse_classads(path.read_text())
    except (ValueError, IndexError) as exc:
        raise DagDirError(f"{path} is not a DAGMan node status file: {exc}") from None
    dag = next((ad for ad in ads if ad.get("Type") == "DagStatus"), {})
    nodes = []
    for ad in ads:
        if ad.get("Type") != "NodeStatus":
            continue
        name = str(ad.get("Node", "?"))
        nodes.append(
            NodeState(
                name=name,
                state=NODE_STATES.get(ad.get("NodeStatus"), f"status {ad.get('NodeStatus')}"),
                retries=int(ad.get("RetryCount", 0)),
                details=str(ad.get("StatusDetails", "")),
                held=int(ad.get("JobProcsHeld", 0)),
                step=_receipt_step(dag_dir, name),
            )
        )
    stamp = dag.get("Timestamp")
    rescue = find_rescue(dag_dir)
    return DagSummary(
        dag_state=NODE_STATES.get(dag.get("DagStatus"), f"status {dag.get('DagStatus')}"),
        counts=dict(Counter(n.state for n in nodes)),
        nodes=nodes,
        updated=datetime.fromtimestamp(stamp, timezone.utc) if stamp is not None else None,
        rescue=rescue.name if rescue else None,
    )


def _receipt_step(dag_dir: Path, node_name: str) -> int | None:
    if not node_name.startswith(C.NODE_PREFIX):
        return None
    receipt = dag_dir / C.RECEIPTS_DIR / f"{node_name[len(C.NODE_PREFIX) :]}.json"
    try:
        step = json.loads(receipt.read_text()).get("step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


def format_summary(summary: DagSummary, dag_dir: str | Path) -> str:
    """The text ``python -m submit status`` prints."""
    order = [s for s in NODE_STATES.values() if s in summary.counts]
    counts = ", ".join(f"{summary.counts[s]} {s}" for s in order)
    when = f" (updated {summary.updated:%Y-%m-%d %H:%M:%S} UTC)" if summary.updated else ""
    lines = [f"{dag_dir}: DAG {summary.dag_state}; {len(summary.nodes)} nodes: {counts}{when}"]
    width = max((len(n.name) for n in summary.nodes), default=4)
    lines.append(f"  {'node':<{width}}  {'status':<10} {'retries':>7} {'step':>9}  details")
    for n in summary.nodes:
        step = "" if n.step is None else str(n.step)
        details = n.details + (f" ({n.held} held)" if n.held else "")
        lines.append(f"  {n.name:<{width}}  {n.state:<10} {n.retries:>7} {step:>9}  {details}")
    if summary.failed:
        names = ", ".join(n.name for n in summary.failed)
        lines.append(f"failed: {names}; see {dag_dir}/{C.LOGS_DIR}/<node>.* and the .post.log")
    if summary.rescue:
        lines.append(
            f"rescue DAG {summary.rescue} present: once the DAG has left the queue, "
            "`python -m submit submit` continues from it"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- sweeps


@dataclass(frozen=True)
class MemberRow:
    member: str
    chain: str
    """The member's SUBDAG node state in the top DAG (its chain as a whole)."""
    ranges_done: int
    ranges: int
    step: int | None
    """Training step of the member's newest receipt."""
    evaluate: str
    metrics: bool
    """metrics/<member>/metrics.json came back."""


@dataclass(frozen=True)
class SweepSummary:
    top: DagSummary
    members: list[MemberRow]
    compare: str
    board: Path | None


def is_sweep_dir(dag_dir: str | Path) -> bool:
    return (Path(dag_dir) / C.SWEEP_INDEX).is_file()


def read_sweep_status(dag_dir: str | Path) -> SweepSummary:
    """A sweep's DAG directory: one row per member (chain, ranges, evaluation, metrics)."""
    dag_dir = Path(dag_dir)
    top = read_status(dag_dir)
    states = {n.name: n.state for n in top.nodes}
    try:
        index = json.loads((dag_dir / C.SWEEP_INDEX).read_text())
    except (OSError, ValueError) as exc:
        raise DagDirError(f"{dag_dir / C.SWEEP_INDEX} is unreadable ({exc})") from None
    rows = []
    for entry in index:
        member = entry["member"]
        chain_dir = dag_dir / C.CHAINS_DIR / member
        ranges = len(list(chain_dir.glob(f"{C.NODE_PREFIX}*.sub")))
        steps = [_receipt_step_of(p) for p in (chain_dir / C.RECEIPTS_DIR).glob("*.json")]
        done = [s for s in steps if s is not None]
        rows.append(
            MemberRow(
                member=member,
                chain=states.get(entry["chain"], "not ready"),
                ranges_done=len(done),
                ranges=ranges,
                step=max(done) if done else None,
                evaluate=states.get(entry["evaluate"], "not ready"),
                metrics=(dag_dir / C.METRICS_DIR / member / C.METRICS_FILE).is_file(),
            )
        )
    board = dag_dir / C.BOARD_DIR / "leaderboard.md"
    return SweepSummary(
        top=top,
        members=rows,
        compare=states.get(C.COMPARE_NODE, "not ready"),
        board=board if board.is_file() else None,
    )


def _receipt_step_of(path: Path) -> int | None:
    try:
        step = json.loads(path.read_text()).get("step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


def format_sweep_summary(summary: SweepSummary, dag_dir: str | Path) -> str:
    """The text ``python -m submit status`` prints for a sweep: members as rows."""
    top = summary.top
    rows = summary.members
    finished = sum(1 for r in rows if r.metrics)
    when = f" (updated {top.updated:%Y-%m-%d %H:%M:%S} UTC)" if top.updated else ""
    lines = [
        f"{dag_dir}: sweep DAG {top.dag_state}; {len(rows)} members, {finished} evaluated{when}"
    ]
    width = max((len(r.member) for r in rows), default=6)
    lines.append(
        f"  {'member':<{width}}  {'chain':<10} {'ranges':>7} {'step':>9}  {'evaluate':<10} metrics"
    )
    for r in rows:
        step = "" if r.step is None else str(r.step)
        ranges = f"{r.ranges_done}/{r.ranges}"
        lines.append(
            f"  {r.member:<{width}}  {r.chain:<10} {ranges:>7} {step:>9}  {r.evaluate:<10} "
            f"{'yes' if r.metrics else '-'}"
        )
    board = f"{summary.board}" if summary.board else "not written yet"
    lines.append(f"compare: {summary.compare}; leaderboard: {board}")
    failed = [r.member for r in rows if r.chain == "failed" or r.evaluate == "failed"]
    if failed:
        lines.append(
            f"failed: {', '.join(failed)}; see {dag_dir}/{C.CHAINS_DIR}/<member>/{C.LOGS_DIR}/ "
            f"and {dag_dir}/{C.LOGS_DIR}/ (`python -m submit status "
            f"{dag_dir}/{C.CHAINS_DIR}/<member>` shows a member's ranges)"
        )
    if top.rescue:
        lines.append(
            f"rescue DAG {top.rescue} present: once the DAG has left the queue, "
            "`python -m submit submit` continues the members that did not finish"
        )
    return "\n".join(lines)
