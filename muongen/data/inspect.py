"""`muongen inspect INPUT...`: what a production file holds, at a glance or as JSON.

INPUT is anything the other verbs take: files, folders, globs, pelican:// / osdf:// URLs
with wildcards (:func:`muongen.storage.files.expand_inputs`).

Per file: the format (told from the content), rows, muons, empty rows, the multiplicity
distribution (mean, max, quantiles), the ranges of the primary's energy, zenith, mass and
depth, events dropped by validation, and the first few events. ``--json`` prints one JSON
object per file per line. Files are read in chunks, so memory stays bounded.

A checkpoint (a manifest .json, a .pt, a checkpoint or run folder, or a URL of one; told
from data by its content) is shown by :mod:`muongen.checkpoint_inspect` instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from muongen.data.reader import FileReader
from muongen.errors import MuongenError

HELP = (
    "show what input files hold (format, rows, multiplicity, a few events) or what a "
    "checkpoint holds (step, model, sha256, training domain)"
)

QUANTILES = (0.5, 0.9, 0.99, 0.999)


def inspect_file(url: str, *, events: int = 3, read_rows: int = 65536) -> dict[str, Any]:
    """Summary of one file as plain JSON-able values (see the module doc)."""
    counts: list[np.ndarray] = []
    bad: dict[str, int] = {}
    lo = np.full(4, np.inf)
    hi = np.full(4, -np.inf)
    masses: set[float] = set()
    depths: set[float] = set()
    shown: list[dict[str, Any]] = []
    with FileReader(url) as fr:
        fmt, rows = fr.fmt, fr.n_rows
        for chunk in fr.chunks(0, read_rows):
            counts.append(chunk.counts)
            for reason, n in chunk.bad.items():
                bad[reason] = bad.get(reason, 0) + n
            if chunk.n_events:
                cols = chunk.conditions.T  # per-column reductions (axis=0 on (B, 4) is slow)
                lo = np.minimum(lo, [col.min() for col in cols])
                hi = np.maximum(hi, [col.max() for col in cols])
                masses.update(np.unique(chunk.conditions[:, 2]).tolist())
                depths.update(np.unique(chunk.conditions[:, 3]).tolist())
            if len(shown) < events:
                shown += _examples(chunk, events - len(shown))
    c = np.concatenate(counts) if counts else np.zeros(0, np.int64)
    n = len(c)
    return {
        "file": url,
        "format": fmt,
        "rows": int(rows),
        "events": int(n),
        "muons": int(c.sum()),
        "empty_rows": int((c == 0).sum()),
        "bad_events": bad,
        "mean_multiplicity": float(c.mean()) if n else 0.0,
        "max_multiplicity": int(c.max()) if n else 0,
        "quantiles": {f"q{q * 100:g}": float(np.quantile(c, q)) if n else 0.0 for q in QUANTILES},
        "energy_gev": [float(lo[0]), float(hi[0])] if n else None,
        "zenith_deg": [float(np.degrees(lo[1])), float(np.degrees(hi[1]))] if n else None,
        "masses": sorted(masses),
        "depths_m": [float(lo[3]), float(hi[3])] if n else None,
        "n_depths": len(depths),
        "first_events": shown,
    }


def _examples(chunk, k: int) -> list[dict[str, Any]]:
    out = []
    off = np.concatenate([[0], np.cumsum(chunk.counts)])
    for i in range(min(k, chunk.n_events)):  # a handful of events, for people to read
        e, zen, a, depth = chunk.conditions[i].tolist()
        out.append(
            {
                "row": int(chunk.rows[i]),
                "energy_gev": e,
                "zenith_deg": float(np.degrees(zen)),
                "mass": a,
                "depth_m": depth,
                "muons": int(chunk.counts[i]),
                "first_muons_e_x_y": chunk.muons[off[i] : min(off[i + 1], off[i] + 3)].tolist(),
            }
        )
    return out


def format_text(info: dict[str, Any]) -> str:
    rows = info["rows"]
    pct = 100.0 * info["empty_rows"] / max(info["events"], 1)
    q = "  ".join(f"{k} {v:g}" for k, v in info["quantiles"].items())
    lines = [
        f"{info['file']}: {info['format']}, {rows} rows, {info['muons']} muons, "
        f"{info['empty_rows']} empty rows ({pct:.1f}%)",
        f"  multiplicity: mean {info['mean_multiplicity']:.3g}  "
        f"max {info['max_multiplicity']}  {q}",
    ]
    if info["energy_gev"]:
        e, z, d = info["energy_gev"], info["zenith_deg"], info["depths_m"]
        lines.append(
            f"  primary: E {e[0]:.3g}-{e[1]:.3g} GeV  zenith {z[0]:.1f}-{z[1]:.1f} deg  "
            f"A {', '.join(f'{m:g}' for m in info['masses'])}  depth {d[0]:.0f}-{d[1]:.0f} m "
            f"({info['n_depths']} depths)"
        )
    for reason, n in info["bad_events"].items():
        lines.append(f"  dropped {n} events: {reason}")
    for ev in info["first_events"]:
        mu = "  ".join(
            "[" + ", ".join(f"{v:.4g}" for v in m) + "]" for m in ev["first_muons_e_x_y"]
        )
        lines.append(
            f"  row {ev['row']}: E {ev['energy_gev']:.4g} GeV  zenith {ev['zenith_deg']:.1f} deg  "
            f"A {ev['mass']:g}  depth {ev['depth_m']:.0f} m  {ev['muons']} muons  {mu}"
        )
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files",
        nargs="+",
        metavar="INPUT",
        help=(
            "input files (any format), folders, globs, or pelican:// / osdf:// URLs with "
            "wildcards in any path component; or a checkpoint (.json, .pt, its folder, a run "
            "folder, or a URL of one)"
        ),
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per file per line")
    parser.add_argument("--events", type=int, default=3, help="events to show per file (default 3)")


def _inputs(patterns: list[str], as_json: bool) -> tuple[list[str], int]:
    """The files each pattern names (storage's resolver), and how many patterns failed."""
    from muongen.storage.files import expand_inputs

    urls: list[str] = []
    failed = 0
    for pattern in patterns:
        try:
            urls += [u for u in expand_inputs(pattern) if u not in urls]
        except MuongenError as exc:
            failed += 1
            if as_json:
                print(json.dumps({"file": pattern, "error": str(exc)}))
            print(f"muongen inspect: error: {exc}", file=sys.stderr)
    return urls, failed


def run(args: argparse.Namespace) -> int:
    from muongen.checkpoint_inspect import is_checkpoint, run_one

    data, failed = [], 0
    for item in args.files:
        if not is_checkpoint(item):
            data.append(item)
            continue
        try:
            run_one(item, args.json)
        except MuongenError as exc:
            failed += 1
            if args.json:
                print(json.dumps({"checkpoint": item, "error": str(exc)}))
            print(f"muongen inspect: error: {exc}", file=sys.stderr)
    if not data:
        return 2 if failed else 0
    urls, failed_data = _inputs(data, args.json)
    failed += failed_data
    for url in urls:
        try:
            info = inspect_file(url, events=args.events)
        except MuongenError as exc:
            failed += 1
            if args.json:
                print(json.dumps({"file": url, "error": str(exc)}))
            print(f"muongen inspect: error: {exc}", file=sys.stderr)
            continue
        print(json.dumps(info) if args.json else format_text(info))
    return 2 if failed else 0
