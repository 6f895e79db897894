"""`muongen compare`: one leaderboard from many evaluations (the members of a sweep).

    muongen compare DIR_OR_URL... --out BOARD

Each input is a folder (searched recursively for ``metrics.json``, what ``muongen
evaluate`` writes), a ``metrics.json`` file, or a pelican:// / osdf:// URL (a file, a glob,
or a folder searched a few levels down). A ``members.json`` beside the evaluations (written
by a sweep: member -> its settings and seed) gives each member its settings; without one, a
member named ``key=value,...,seed=N`` is read from its name. A member that
``members.json`` lists but that has no readable ``metrics.json`` is a *failed* row.

Writes ``BOARD/leaderboard.md`` and ``BOARD/leaderboard.json``: one row per member with its
settings, the median and worst ratio to the floor, the tail rows of the evaluation (when
it has them), the training's wall time and events seen (when the evaluated checkpoint is a
local chain's), then the best member by :data:`muongen.leaderboard.RULE`, the spread over
seeds of each setting, and one PNG per swept parameter against the score (written by
:mod:`muongen.leaderboard`; this module finds and reads the members).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
from pathlib import Path, PurePosixPath
from typing import Any

from muongen.errors import InputFileError, MuongenError, StorageError
from muongen.leaderboard import BOARD_JSON, BOARD_MD, FORMAT, SEED_KEYS, Member, write_board

HELP = "rank evaluations (a sweep's members) into leaderboard.md/.json and plots"
log = logging.getLogger(__name__)

METRICS_FILE = "metrics.json"
MEMBERS_FILE = "members.json"
#: Folder names that hold a member's evaluation rather than name the member.
EVAL_FOLDERS = ("eval", "evaluate", "evaluation", "metrics")
#: Levels below a remote folder searched for metrics.json (one listing per folder).
REMOTE_DEPTH = 4
# --------------------------------------------------------------------------- finding inputs


def _read_json(where: str) -> Any:
    from muongen import storage

    try:
        raw = storage.cat(where)
    except StorageError as exc:
        raise InputFileError(str(exc)) from None
    except OSError as exc:
        raise InputFileError(f"cannot read {where}: {exc.strerror or exc}") from None
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputFileError(f"{where} is not JSON ({exc})") from None


def find_inputs(item: str, skip: Path | None = None) -> tuple[list[str], list[str]]:
    """(metrics.json files, members.json files) of one input: folder, file or URL."""
    from muongen import storage

    if storage.is_remote(item):
        if item.endswith(".json") and not any(c in item for c in "*?["):
            return [item], _remote_members([storage.files.parent(item)])
        pattern = item if any(c in item for c in "*?[") else f"{item.rstrip('/')}/**/{METRICS_FILE}"
        try:
            found = storage.expand_inputs(pattern, maxdepth=REMOTE_DEPTH)
        except StorageError as exc:
            if "matches no files" not in str(exc):
                raise
            found = []
        metrics = [u for u in found if u.endswith(METRICS_FILE)]
        members = [u for u in found if u.endswith(MEMBERS_FILE)]
        tops = [item.rstrip("/")] if not any(c in item for c in "*?[") else []
        return metrics, members or _remote_members(tops)
    path = Path(storage.files.local_path(item))
    if path.is_file():
        near = [p for p in (path.parent / MEMBERS_FILE, path.parent.parent / MEMBERS_FILE)]
        return [str(path)], [str(p) for p in near if p.is_file() and p != path]
    if not path.is_dir():
        raise InputFileError(f"compare: {item} is neither a file nor a folder; give evaluations")
    metrics, members = [], []
    skip_real = os.path.realpath(skip) if skip is not None else None
    for dirpath, dirnames, filenames in os.walk(path, followlinks=True):
        if skip_real is not None and os.path.realpath(dirpath) == skip_real:
            dirnames[:] = []
            continue
        dirnames.sort()
        if METRICS_FILE in filenames:
            metrics.append(os.path.join(dirpath, METRICS_FILE))
        if MEMBERS_FILE in filenames:
            members.append(os.path.join(dirpath, MEMBERS_FILE))
    return metrics, members


def _remote_members(folders: list[str]) -> list[str]:
    from muongen import storage

    out = []
    for folder in folders:
        url = f"{folder.rstrip('/')}/{MEMBERS_FILE}"
        try:
            if storage.exists(url):
                out.append(url)
        except StorageError:
            pass
    return out


def read_members(path: str) -> dict[str, dict[str, Any]]:
    """``members.json`` -> {member: {"settings": {...}, "seed": ..., ...}}.

    Accepted: ``{member: entry}``, ``{"members": {member: entry}}`` or a list of entries
    with a "name"; an entry's settings may be under "settings" or be the entry itself.
    """
    data = _read_json(path)
    if isinstance(data, dict) and isinstance(data.get("members"), (dict, list)):
        data = data["members"]
    if isinstance(data, list):
        data = {str(e.get("name")): e for e in data if isinstance(e, dict) and e.get("name")}
    if not isinstance(data, dict):
        raise InputFileError(f"{path}: expected an object of members, got {type(data).__name__}")
    out = {}
    for name, entry in data.items():
        if not isinstance(entry, dict):
            continue
        if isinstance(entry.get("settings"), dict):
            settings = dict(entry["settings"])
        else:
            skip = {"name", "seed", "overrides", "wall_s", "events_seen", "hash"}
            settings = {k: v for k, v in entry.items() if k not in skip}
        out[str(name)] = {**entry, "settings": settings}
    return out


def member_name(metrics: str, root: str, known: dict[str, Any]) -> str:
    """The member a metrics.json belongs to: the deepest folder of its path that
    ``members.json`` names, else its folder below ``root`` (an eval folder left out)."""
    parts = PurePosixPath(metrics.replace("\\", "/")).parent.parts
    for part in reversed(parts):
        if part in known:
            return part
    rel = list(parts[len(PurePosixPath(root.replace("\\", "/")).parts) :])
    if PurePosixPath(root).name == METRICS_FILE:  # the input was the file itself
        rel = []
    while rel and rel[-1] in EVAL_FOLDERS:
        rel.pop()
    if rel:
        return "/".join(rel)
    parts = list(parts)
    while parts and parts[-1] in EVAL_FOLDERS:
        parts.pop()
    return parts[-1] if parts else "member"


def settings_from_name(name: str) -> tuple[dict[str, Any], Any]:
    """``lr_critic=3e-4,critic_local_width=64,seed=1`` -> (settings, seed); ({}, None) for
    a name of another form."""
    import yaml

    settings: dict[str, Any] = {}
    for item in PurePosixPath(name).name.split(","):
        key, sep, text = item.partition("=")
        if not sep or not key:
            return {}, None
        settings[key] = _parse_value(text, yaml)
    seed = next((settings[k] for k in SEED_KEYS if k in settings), None)
    return settings, seed


def _parse_value(text: str, yaml) -> Any:
    """A value written in a member's name: an int, a float (1e-4 too), else YAML."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


# --------------------------------------------------------------------------- one member


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def tail_rows(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The evaluation's tail rows, {name: {"median", "worst", "where", "range", "n_events",
    "n_metrics", "no_output"}}; {} without any.

    ``summary["tail"]`` (muongen evaluate's, floors.py) is {name: row}, a row giving
    ``median_ratio``, ``worst_ratio``, ``worst`` (where), ``range`` (the subset in words),
    ``n_events``, ``n_metrics`` and ``worst_no_output``."""
    tail = summary.get("tail")
    if not isinstance(tail, dict):
        return {}
    out = {}
    for name, row in tail.items():
        if not isinstance(row, dict):
            continue
        out[str(name)] = {
            "median": _number(row.get("median_ratio")),
            "worst": _number(row.get("worst_ratio")),
            "where": row.get("worst"),
            "range": row.get("range"),
            "n_events": row.get("n_events"),
            "n_metrics": row.get("n_metrics"),
            "no_output": bool(row.get("worst_no_output")),
        }
    return out


def training_figures(checkpoint: str | None) -> tuple[float | None, int | None]:
    """(wall seconds, events seen) of the local chain whose checkpoint was evaluated.

    A local chain's range checkpoint sits in ``<member>/<range>/<range>.json`` beside its
    run folder's ``summary.json``: the wall time is the sum over the ranges' summaries
    (each range's last run), the events seen are the largest (a counter over the whole
    chain). (None, None) for a remote checkpoint or one without summaries beside it."""
    from muongen import storage

    if not checkpoint or storage.is_remote(checkpoint):
        return None, None
    here = Path(storage.files.local_path(checkpoint)).parent
    if not here.is_absolute():  # a grid node's scratch dir, not a folder of this machine
        return None, None
    found = sorted(here.glob("run-*/summary.json")) or []
    found += sorted(p for p in here.parent.glob("*/run-*/summary.json") if p.parent.parent != here)
    wall, events = 0.0, None
    for path in found:
        try:
            s = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        wall += float(s.get("wall_s") or 0.0)
        if isinstance(s.get("events_seen"), int):
            events = max(events or 0, s["events_seen"])
    return (round(wall, 1) if found else None), events


def read_member(name: str, source: str, entry: dict[str, Any] | None) -> Member:
    """One member's row from its metrics.json (a failed row when it cannot be read)."""
    entry = entry or {}
    settings = dict(entry.get("settings") or {})
    seed = entry.get("seed")
    if not settings:
        settings, name_seed = settings_from_name(name)
        seed = seed if seed is not None else name_seed
    if seed is None:
        seed = next((settings[k] for k in SEED_KEYS if k in settings), None)
    member = Member(name=name, source=source, settings=settings, seed=seed)
    if entry.get("wall_s") is not None:
        member.wall_s = _number(entry["wall_s"])
    if entry.get("events_seen") is not None:
        member.events_seen = int(entry["events_seen"])
    try:
        result = _read_json(source)
        summary = result["summary"]
        if not isinstance(summary, dict) or "worst_ratio" not in summary:
            raise KeyError("summary.worst_ratio")
    except InputFileError as exc:
        member.status, member.error = "failed", str(exc)
        return member
    except (KeyError, TypeError) as exc:
        member.status = "failed"
        member.error = f"{source} has no evaluation summary ({exc}); re-run muongen evaluate"
        return member
    member.median = _number(summary.get("median_ratio"))
    member.worst = _number(summary.get("worst_ratio"))
    member.worst_no_output = bool(summary.get("worst_no_output"))
    member.worst_where = summary.get("worst")
    member.n_metrics = int(summary.get("n_metrics") or 0)
    member.n_pass = summary.get("n_pass")
    member.n_fail = summary.get("n_FAIL")
    member.tail = tail_rows(summary)
    meta = result.get("meta") or {}
    member.step = meta.get("step")
    member.checkpoint = meta.get("checkpoint")
    if member.wall_s is None or member.events_seen is None:
        wall, events = training_figures(member.checkpoint)
        member.wall_s = member.wall_s if member.wall_s is not None else wall
        member.events_seen = member.events_seen if member.events_seen is not None else events
    if member.n_metrics == 0:
        member.status = "failed"
        member.error = f"{source}: no metric has a floor (held-out data without muons?)"
    return member


def gather(inputs: list[str], skip: Path | None = None) -> list[Member]:
    """Every member of ``inputs``, ranked by :data:`muongen.leaderboard.RULE` (failed rows last)."""
    members: dict[str, Member] = {}
    for item in inputs:
        metrics, member_files = find_inputs(item, skip)
        known: dict[str, dict[str, Any]] = {}
        for path in member_files:
            known.update(read_members(path))
        if not metrics and not known:
            raise InputFileError(
                f"compare: no {METRICS_FILE} under {item}; run muongen evaluate first "
                "(or give the folder its --out went to)"
            )
        for path in metrics:
            name = member_name(path, item, known)
            if name in members:
                name = f"{name} ({path})"
            members[name] = read_member(name, path, known.get(name))
        for name, entry in known.items():  # listed but never evaluated: failed
            if name not in members:
                m = read_member(name, "", entry)
                m.status, m.error = "failed", f"no {METRICS_FILE} found for it under {item}"
                members[name] = m
    ranked = sorted(members.values(), key=Member.score)
    for i, m in enumerate(ranked, 1):
        m.rank = i if m.status == "ok" else None
    return ranked


def check_out(out: Path, force: bool) -> None:
    """Create ``out``, and refuse to replace a leaderboard that compare did not write."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MuongenError(f"compare: cannot create --out {out}: {exc.strerror}") from None
    if not os.access(out, os.W_OK):
        raise MuongenError(f"compare: cannot write in --out {out}; choose another folder")
    board = out / BOARD_JSON
    ours = False
    if board.exists():
        try:
            ours = json.loads(board.read_text()).get("format") == FORMAT
        except (OSError, ValueError, AttributeError):
            ours = False
    if not force and not ours and (board.exists() or (out / BOARD_MD).exists()):
        raise MuongenError(
            f"compare: {out} holds a leaderboard that muongen compare did not write; "
            "choose another --out or pass --force to replace it"
        )


def compare(inputs: list[str], out: str | Path, *, force: bool = False) -> list[Member]:
    """Read every member of ``inputs`` and write the leaderboard to ``out``."""

    out = Path(out)
    check_out(out, force)
    members = gather(inputs, skip=out)
    write_board(members, out, inputs)
    return members


# --------------------------------------------------------------------------- CLI


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="DIR_OR_URL",
        help="evaluation folders (searched for metrics.json), metrics.json files, or "
        "pelican:// / osdf:// URLs (file, glob or folder)",
    )
    parser.add_argument("--out", required=True, help="folder for leaderboard.md/.json, plots")
    parser.add_argument(
        "--force", action="store_true", help="replace a leaderboard compare did not write"
    )


def run(args: argparse.Namespace) -> int:
    members = compare(args.inputs, args.out, force=args.force)
    out = Path(args.out)
    print((out / BOARD_MD).read_text())
    ok = [m for m in members if m.status == "ok"]
    failed = len(members) - len(ok)
    print(
        f"compare: {len(ok)} members scored, {failed} failed; wrote {out / BOARD_MD} and "
        f"{out / BOARD_JSON}"
    )
    return 0 if ok else 1
