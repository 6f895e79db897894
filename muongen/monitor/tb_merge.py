"""`muongen tb-merge`: gather TensorBoard runs from many grid nodes into one folder tree.

A run is any folder holding ``events.out.tfevents.*`` files (a node writes
``tb/<campaign>/<range>/``). Each run becomes ``OUT/<name>/`` with its event files
symlinked (default) or copied in; ``<name>`` is the run's path below its SRC, so
``tensorboard --logdir OUT`` shows one run per range. Runs with the same relative path in
different SRCs get more of their source path in the name (``node1/tb/campA/r0`` vs
``node2/tb/campA/r0``). Event files are linked one by one, so a run nested in another
run's folder stays separate and a re-run only adds what is new.

A sweep's members (``--members``, its members.json or leaderboard.json) are laid side by
side: every run below a member's folder (``tb/<campaign>/<member>/<range>/``) goes into
``OUT/<member>/``, one run per member whose curves continue from range to range, and the
member's settings and seed (with its leaderboard scores, when given) are written there for
TensorBoard's HParams tab (:func:`write_hparams`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import fnmatch
import json
import os
import re
import shutil
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TextIO

from muongen.errors import InputFileError

HELP = "curate TensorBoard runs from many nodes into one folder (symlink or copy)"

#: Prefix of TensorBoard event file names.
EVENTS_PREFIX = "events.out.tfevents."
#: File in each merged run folder naming the run folder it came from (keeps names stable).
SOURCE_MARKER = ".tb-merge-source"
#: Suffix of the event files tb-merge writes itself (hparams), replaced on each merge.
HPARAMS_SUFFIX = ".muongen-hparams"
#: The leaderboard's scores, as HParams metrics (scalar tags of each member's run).
METRIC_TAGS = {"worst": "sweep/worst_ratio", "median": "sweep/median_ratio"}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass
class Run:
    """One TensorBoard run found under a source folder."""

    source: Path  # the SRC it was found under
    path: Path  # the run folder
    files: list[Path]  # its event files
    mtime: float  # newest event file's modification time (epoch seconds)

    @property
    def rel(self) -> PurePosixPath:
        """The run's path below its SRC ('.' when SRC itself is the run)."""
        return PurePosixPath(self.path.relative_to(self.source).as_posix())


def parse_since(text: str, now: dt.datetime | None = None) -> dt.datetime:
    """``2d``/``12h``/``30m``/``1w``/``90s`` ago, or an ISO date/time (local time if no zone)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    m = _DURATION.match(text.strip())
    if m:
        return now - dt.timedelta(seconds=float(m.group(1)) * _UNIT_S[m.group(2)])
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--since {text!r}: expected an ISO date/time (2024-05-01, 2024-05-01T12:00) "
            "or a duration like 90s, 30m, 12h, 2d, 1w"
        ) from None
    return when if when.tzinfo else when.astimezone()


def find_runs(sources: list[Path], exclude: Path | None = None) -> list[Run]:
    """Every folder under ``sources`` that holds event files (symlinks followed, no loops).

    ``exclude`` (the output folder) is never walked.
    """
    runs: list[Run] = []
    seen: set[str] = set()
    skip = os.path.realpath(exclude) if exclude is not None else None
    for source in sources:
        if not source.is_dir():
            raise InputFileError(
                f"tb-merge: source {source} is not a folder; give local folders "
                "(fetch remote ones first, e.g. with `pelican object get --recursive`)"
            )
        for dirpath, dirnames, filenames in os.walk(source, followlinks=True):
            real = os.path.realpath(dirpath)
            if real in seen or real == skip:
                dirnames[:] = []
                continue
            seen.add(real)
            dirnames.sort()
            events = sorted(f for f in filenames if f.startswith(EVENTS_PREFIX))
            if events:
                files = [Path(dirpath, f) for f in events]
                mtime = max(f.stat().st_mtime for f in files)
                runs.append(Run(source, Path(dirpath), files, mtime))
    return runs


def select_runs(
    runs: list[Run],
    *,
    since: dt.datetime | None = None,
    match: re.Pattern[str] | None = None,
    glob: str | None = None,
) -> list[Run]:
    """Runs modified at or after ``since``, whose path matches ``match`` (re.search) and
    ``glob`` (fnmatch on the path below SRC or on the whole path)."""
    out = []
    for run in runs:
        full = run.path.as_posix()
        if since is not None and run.mtime < since.timestamp():
            continue
        if match is not None and not match.search(full):
            continue
        if glob is not None and not (
            fnmatch.fnmatchcase(str(run.rel), glob) or fnmatch.fnmatchcase(full, glob)
        ):
            continue
        out.append(run)
    return out


def _tail(path: Path, k: int) -> str:
    """The last ``k`` components of ``path`` made absolute, '/'-joined."""
    parts = Path(os.path.abspath(path)).parts[1:]  # without the root
    return "/".join(parts[-k:])


def run_names(runs: list[Run], existing: Mapping[str, str] | None = None) -> list[str]:
    """A unique folder name per run: its path below SRC, lengthened where names collide.

    ``existing`` maps names already in the output folder to the run folder each came from
    (see :func:`merged_sources`): a run merged before keeps its name, and a name taken by
    another source is not reused (``-2``, ``-3``, ... is appended).
    """
    existing = dict(existing or {})
    names = [str(r.rel) if str(r.rel) != "." else r.source.resolve().name for r in runs]
    depth = [len(PurePosixPath(n).parts) for n in names]
    fulls = [os.path.abspath(r.path) for r in runs]
    for _ in range(64):  # bounded: each pass adds one path component to colliding names
        paths: dict[str, set[str]] = {}
        for name, full in zip(names, fulls):
            paths.setdefault(name, set()).add(full)
        clashing = [i for i, n in enumerate(names) if len(paths[n]) > 1]
        changed = False
        for i in clashing:
            longer = _tail(runs[i].path, depth[i] + 1)
            if longer != names[i]:
                depth[i] += 1
                names[i] = longer
                changed = True
        if not changed:
            break
    before = {src: name for name, src in existing.items()}
    reals = [os.path.realpath(r.path) for r in runs]
    taken = set(existing)
    result: list[str | None] = [before.get(real) for real in reals]
    for i, name in enumerate(names):
        if result[i] is not None:
            continue
        candidate, n = name, 1
        while candidate in taken:  # same path twice, or the name belongs to another source
            n += 1
            candidate = f"{name}-{n}"
        result[i] = candidate
        taken.add(candidate)
    return [str(n) for n in result]


def merged_sources(out: Path) -> dict[str, str]:
    """``{name: source run folder}`` of the runs an earlier merge placed in ``out``."""
    found: dict[str, str] = {}
    if not out.is_dir():
        return found
    for dirpath, _, filenames in os.walk(out):
        if SOURCE_MARKER in filenames:
            name = Path(dirpath).relative_to(out).as_posix()
            found[name] = Path(dirpath, SOURCE_MARKER).read_text().strip()
    return found


@dataclass
class MergeStats:
    runs: int = 0
    placed: int = 0  # files linked or copied
    unchanged: int = 0  # already there from an earlier merge
    conflicts: int = 0  # a different file already has that name


def _place(src: Path, dest: Path, copy: bool, dry_run: bool) -> str:
    """Link or copy one event file; returns 'placed', 'unchanged' or 'conflict'."""
    target = Path(os.path.realpath(src))
    if dest.is_symlink() or dest.exists():
        if dest.is_symlink():
            same = Path(os.path.realpath(dest)) == target
            if same and not copy:
                return "unchanged"
            if not same:
                return "conflict"
        elif copy:
            s, d = target.stat(), dest.stat()
            if s.st_size == d.st_size and s.st_mtime <= d.st_mtime:
                return "unchanged"  # event files only grow
        # else: an earlier --copy of this file (event file names are unique); link instead
    if dry_run:
        return "placed"
    if dest.is_symlink() or dest.exists():
        dest.unlink()
    if copy:
        shutil.copy2(target, dest)
    else:
        os.symlink(target, dest)
    return "placed"


def member_of(run: Run, members: Mapping[str, object]) -> str | None:
    """The sweep member whose folder holds ``run`` (the deepest path component that names
    one), or None."""
    for part in reversed(Path(os.path.abspath(run.path)).parts):
        if part in members:
            return part
    return None


def merge(
    runs: list[Run],
    out: Path,
    *,
    copy: bool = False,
    dry_run: bool = False,
    stream: TextIO | None = None,
    members: Mapping[str, object] | None = None,
) -> MergeStats:
    """Place each run's event files under ``out/<name>/`` and print one line per run; a run
    of one of ``members`` goes into ``out/<member>/`` with that member's other runs."""
    stream = sys.stdout if stream is None else stream
    stats = MergeStats()
    verb = "copy" if copy else "link"
    members = members or {}
    owner = [member_of(run, members) for run in runs]
    plain = [run for run, m in zip(runs, owner) if m is None]
    existing = {**merged_sources(out), **{m: f"sweep member {m}" for m in owner if m}}
    plain_names = iter(run_names(plain, existing))
    for run, member in zip(runs, owner):
        name = member if member is not None else next(plain_names)
        dest = out / name
        if not dry_run:
            dest.mkdir(parents=True, exist_ok=True)
            if member is None:
                (dest / SOURCE_MARKER).write_text(os.path.realpath(run.path) + "\n")
        results = Counter(_place(f, dest / f.name, copy, dry_run) for f in run.files)
        stats.runs += 1
        stats.placed += results["placed"]
        stats.unchanged += results["unchanged"]
        stats.conflicts += results["conflict"]
        when = dt.datetime.fromtimestamp(run.mtime).strftime("%Y-%m-%d %H:%M")
        note = f"{results['placed']} new, {results['unchanged']} unchanged"
        if results["conflict"]:
            note += f", {results['conflict']} conflicting (left alone)"
        print(f"{verb} {name} <- {run.path} ({note}; modified {when})", file=stream)
    return stats


def read_sweep(path: Path) -> dict[str, dict]:
    """A sweep's members, {member: {"settings", "seed", "worst", "median", "status"}}, from
    a leaderboard.json (with scores) or a members.json, or a folder holding either (also
    in its ``board/``)."""
    from muongen.compare import BOARD_JSON, MEMBERS_FILE, read_members

    if path.is_dir():  # a sweep's workdir (muongen/sweep.py) keeps its board in board/
        candidates = [path / BOARD_JSON, path / "board" / BOARD_JSON]
        candidates.append(path / MEMBERS_FILE)
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            raise InputFileError(
                f"tb-merge --members {path}: no {BOARD_JSON} or {MEMBERS_FILE} there; give the "
                "sweep's workdir, its board folder or one of those files"
            )
        path = found
    if not path.is_file():
        raise InputFileError(f"tb-merge --members {path}: no such file")
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputFileError(f"tb-merge --members {path}: not readable JSON ({exc})") from None
    if isinstance(doc, dict) and isinstance(doc.get("members"), list):  # a leaderboard
        return {
            m["name"]: {
                "settings": m.get("settings") or {},
                "seed": m.get("seed"),
                "worst": m.get("worst"),
                "median": m.get("median"),
                "status": m.get("status"),
            }
            for m in doc["members"]
            if isinstance(m, dict) and m.get("name")
        }
    return {
        name: {"settings": e["settings"], "seed": e.get("seed")}
        for name, e in read_members(str(path)).items()
    }


def _hparam(value: object) -> float | str | bool:
    """A setting as the HParams plugin takes it: numbers as floats, lists etc. as text."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    return value if isinstance(value, str) else json.dumps(value)


def write_hparams(out: Path, members: Mapping[str, dict], present: list[str]) -> list[Path]:
    """The sweep's settings for TensorBoard's HParams tab: in each ``out/<member>/`` of
    ``present`` the member's session (settings, seed; its scores as the scalars
    :data:`METRIC_TAGS`), and in ``out`` the experiment (every setting's values, the
    metrics). Files written by an earlier merge are replaced. Returns the files written."""
    from torch.utils.tensorboard.summary import hparams, scalar
    from torch.utils.tensorboard.writer import FileWriter

    for old in [*out.glob(f"*{HPARAMS_SUFFIX}"), *out.glob(f"*/*{HPARAMS_SUFFIX}")]:
        if old.is_file() and not old.is_symlink():
            old.unlink()
    values = {
        name: {
            **{k: _hparam(v) for k, v in members[name]["settings"].items()},
            **(
                {"seed": _hparam(members[name]["seed"])}
                if members[name].get("seed") is not None
                else {}
            ),
        }
        for name in present
    }
    keys = sorted({k for v in values.values() for k in v})
    domains: dict[str, list] = {}
    for k in keys:
        seen = [v[k] for v in values.values() if k in v]
        if all(type(x) is type(seen[0]) for x in seen):
            domains[k] = sorted(set(seen), key=str)
    metrics = {tag: 0.0 for tag in METRIC_TAGS.values()}
    written = []

    def write(folder: Path, summaries) -> None:
        writer = FileWriter(str(folder), filename_suffix=HPARAMS_SUFFIX)
        for summary in summaries:
            writer.add_summary(summary, 0)
        writer.close()
        written.extend(folder.glob(f"*{HPARAMS_SUFFIX}"))

    union = {k: next(v[k] for v in values.values() if k in v) for k in keys}
    experiment, _, _ = hparams(union, metrics, {k: d for k, d in domains.items() if k in union})
    write(out, [experiment])
    for name in present:
        mine = {k: d for k, d in domains.items() if k in values[name]}
        _, start, end = hparams(values[name], metrics, mine)
        scores = [
            scalar(tag, members[name][key])
            for key, tag in METRIC_TAGS.items()
            if isinstance(members[name].get(key), (int, float))
        ]
        write(out / name, [start, end, *scores])
    return written


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Collect TensorBoard runs (folders holding events.out.tfevents.* files, e.g. "
        "tb/<campaign>/<range>/ from each grid node) into OUT, one subfolder per run, "
        "named after its path below SRC. Sources are local folders: fetch remote ones "
        "first (e.g. `pelican object get --recursive osdf:///.../tb ./tb`). Re-running "
        "adds only what is new. Then: tensorboard --logdir OUT"
    )
    parser.add_argument("sources", nargs="+", metavar="SRC", type=Path, help="folders to search")
    parser.add_argument("--out", required=True, type=Path, help="merged folder (created)")
    parser.add_argument(
        "--since",
        type=parse_since,
        metavar="WHEN",
        help="only runs written since an ISO date/time (2024-05-01) or within the last "
        "duration (90s, 30m, 12h, 2d, 1w)",
    )
    parser.add_argument(
        "--match",
        type=_regex,
        metavar="REGEX",
        help="only runs whose path matches this regular expression (re.search)",
    )
    parser.add_argument(
        "--glob",
        metavar="PATTERN",
        help="only runs whose path (below SRC, or whole) matches this glob pattern",
    )
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--symlink", dest="copy", action="store_false", help="symlink (default)")
    how.add_argument("--copy", dest="copy", action="store_true", help="copy the event files")
    parser.set_defaults(copy=False)
    parser.add_argument("--dry-run", action="store_true", help="print what would be done")
    parser.add_argument(
        "--members",
        type=Path,
        metavar="SWEEP",
        help="a sweep's leaderboard.json or members.json (or its workdir): one run per member "
        "(its ranges' events together) and its settings and scores in the HParams tab",
    )


def _regex(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"--match {text!r}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    found = find_runs(args.sources, exclude=args.out)
    runs = select_runs(found, since=args.since, match=args.match, glob=args.glob)
    if not runs:
        print(f"tb-merge: no runs to merge ({len(found)} found, none passed the filters)")
        return 0
    members = read_sweep(args.members) if args.members else {}
    stats = merge(runs, args.out, copy=args.copy, dry_run=args.dry_run, members=members)
    present = sorted({m for m in (member_of(r, members) for r in runs) if m})
    if present and not args.dry_run:
        write_hparams(args.out, members, present)
        print(f"tb-merge: {len(present)} sweep members, their settings in the HParams tab")
    what = "would place" if args.dry_run else ("copied" if args.copy else "linked")
    print(
        f"tb-merge: {stats.runs} runs ({len(found) - len(runs)} filtered out), "
        f"{stats.placed} event files {what}, {stats.unchanged} unchanged"
        + (f", {stats.conflicts} conflicts" if stats.conflicts else "")
    )
    if not args.dry_run:
        print(f"view with: tensorboard --logdir {args.out}")
    return 1 if stats.conflicts else 0
