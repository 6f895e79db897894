"""The leaderboard of ``muongen compare``: ranked members -> ``leaderboard.md``,
``leaderboard.json``, the spread over seeds of each setting and a plot per swept parameter.

:mod:`muongen.compare` reads the members into this module's :class:`Member` rows, ranked by
:data:`RULE`; this module holds the board's rows and writes what was found.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

BOARD_MD = "leaderboard.md"
BOARD_JSON = "leaderboard.json"
FORMAT = "muongen-leaderboard"

#: How the best member is chosen; the board says so.
RULE = (
    "lowest worst ratio to the floor (a metric without model output counts as infinite), "
    "then lowest median ratio, then name"
)
#: Keys of a member's settings that name its seed (not a setting of the spread).
SEED_KEYS = ("seed", "train.seed")


@dataclass
class Member:
    """One row of the leaderboard."""

    name: str
    source: str = ""  # the metrics.json read ("" when none was found)
    status: str = "ok"  # ok, or failed
    error: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    seed: Any = None
    median: float | None = None
    worst: float | None = None  # None with worst_no_output: infinite
    worst_no_output: bool = False
    worst_where: str | None = None
    n_metrics: int = 0
    n_pass: int | None = None
    n_fail: int | None = None
    tail: dict[str, dict[str, Any]] = field(default_factory=dict)
    step: int | None = None
    checkpoint: str | None = None
    wall_s: float | None = None
    events_seen: int | None = None
    rank: int | None = None

    def score(self) -> tuple[float, float, str]:
        """The sort key of :data:`RULE` (failed members last)."""
        if self.status != "ok":
            return (math.inf, math.inf, "~" + self.name)
        worst = math.inf if self.worst is None else self.worst
        median = math.inf if self.median is None else self.median
        return (worst, median, self.name)

    def setting_key(self) -> str:
        """The member's settings without the seed, as one canonical string."""
        kept = {k: v for k, v in self.settings.items() if k not in SEED_KEYS}
        return ",".join(f"{k}={value_text(v)}" for k, v in sorted(kept.items())) or "(defaults)"


def spread(members: list[Member]) -> list[dict[str, Any]]:
    """Per setting (the settings without the seed): the seeds scored and the min, max,
    mean and standard deviation of the worst and the median ratio over them."""
    groups: dict[str, list[Member]] = {}
    for m in members:
        groups.setdefault(m.setting_key(), []).append(m)
    rows = []
    for key, group in groups.items():
        ok = [m for m in group if m.status == "ok"]
        row: dict[str, Any] = {
            "setting": key,
            "members": [m.name for m in group],
            "seeds": sorted((m.seed for m in ok), key=str),
            "failed": len(group) - len(ok),
        }
        for what in ("worst", "median"):
            values = [getattr(m, what) for m in ok]
            values = [math.inf if v is None else v for v in values]
            finite = [v for v in values if math.isfinite(v)]
            row[what] = {
                "min": min(values) if values else None,
                "max": max(values) if values else None,
                "mean": statistics.fmean(finite) if finite and len(finite) == len(values) else None,
                "std": statistics.stdev(finite) if 1 < len(finite) == len(values) else None,
            }
            for k in ("min", "max"):
                if row[what][k] is not None and not math.isfinite(row[what][k]):
                    row[what][k] = None  # JSON has no infinity; "no output" on the board
        rows.append(row)
    return sorted(rows, key=lambda r: (r["worst"]["max"] is None, r["worst"]["max"] or 0))


def swept_parameters(members: list[Member]) -> list[str]:
    """Settings (seed aside) that take more than one value over the members."""
    values: dict[str, set[str]] = {}
    for m in members:
        for k, v in m.settings.items():
            if k not in SEED_KEYS:
                values.setdefault(k, set()).add(json.dumps(v, sort_keys=True, default=str))
    return sorted(k for k, vs in values.items() if len(vs) > 1)


def log_spaced(values: list[Any]) -> bool:
    """Positive numbers spanning a factor 2.5 or more (1e-4 and 3e-4, not 32 and 64): drawn
    on a log axis."""
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return (
        len(nums) == len(values) and bool(nums) and min(nums) > 0 and max(nums) >= 2.5 * min(nums)
    )


def plot_parameters(members: list[Member], out: Path) -> list[Path]:
    """One PNG per swept parameter: its value against the worst and median ratio."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ok = [m for m in members if m.status == "ok"]
    paths = []
    for param in swept_parameters(members):
        pts = [(m.settings[param], m) for m in ok if param in m.settings]
        if not pts:
            continue
        fig = Figure(figsize=(5, 3.6))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        xs_raw = [p for p, _ in pts]
        if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs_raw):
            xs = [float(x) for x in xs_raw]
            if log_spaced(xs_raw):
                ax.set_xscale("log")
        else:
            labels = sorted({value_text(x) for x in xs_raw})
            xs = [labels.index(value_text(x)) for x in xs_raw]
            ax.set_xticks(range(len(labels)), labels)
        shown = []
        for what, marker in (("worst", "o"), ("median", "s")):
            ys = [getattr(m, what) for _, m in pts]
            keep = [(x, y) for x, y in zip(xs, ys) if y is not None]
            if keep:
                ax.scatter(*zip(*keep), marker=marker, label=f"{what} ratio", alpha=0.8)
                shown += [y for _, y in keep]
        if shown and log_spaced(shown):
            ax.set_yscale("log")  # ratios that span orders of magnitude (early training)
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_xlabel(param)
        ax.set_ylabel("ratio to floor")
        ax.set_title(f"score against {param}", fontsize=10)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"score_vs_{_file_part(param)}.png"
        fig.savefig(path, dpi=100)
        paths.append(path)
    return paths


def _file_part(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text)


def value_text(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, dict)):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def _ratio(v: float | None, no_output: bool = False) -> str:
    if v is None:
        return "no output" if no_output else "-"
    return f"{v:.3g}"


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 10:
        return f"{s:.1f} s"
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def _range(stat: dict[str, Any]) -> str:
    lo, hi, std = stat["min"], stat["max"], stat["std"]
    if lo is None and hi is None:
        return "no output"
    text = f"{_ratio(lo)}-{_ratio(hi)}" if lo != hi else _ratio(lo)
    return text + (f" (std {std:.2g})" if std is not None else "")


def board_markdown(members: list[Member], rows: list[dict[str, Any]], plots: list[Path]) -> str:
    from muongen.evaluate.report import markdown_table

    tails = sorted({name for m in members for name in m.tail})
    tail_names = {n: r.get("range") or n for m in members for n, r in m.tail.items()}
    params = sorted({k for m in members for k in m.settings if k not in SEED_KEYS})
    header = (
        "rank",
        "member",
        *params,
        "seed",
        "median",
        "worst (where)",
        *(f"tail {tail_names[t]}: worst (median)" for t in tails),
        "wall time",
        "events seen",
        "status",
    )
    table = []
    for m in members:
        worst = _ratio(m.worst, m.worst_no_output)
        if m.worst_where and m.status == "ok":
            worst += f" ({m.worst_where})"
        cells = [_tail_cell(m.tail.get(t)) for t in tails]
        table.append(
            (
                str(m.rank or "-"),
                m.name,
                *(value_text(m.settings[p]) if p in m.settings else "-" for p in params),
                "-" if m.seed is None else str(m.seed),
                _ratio(m.median),
                worst,
                *cells,
                _duration(m.wall_s),
                "-" if m.events_seen is None else f"{m.events_seen:,}",
                m.status if m.status == "ok" else f"failed: {m.error}",
            )
        )
    ok = [m for m in members if m.status == "ok"]
    lines = ["# muongen leaderboard", ""]
    if ok:
        best = ok[0]
        lines.append(
            f"**Best member: {best.name}** (worst {_ratio(best.worst, best.worst_no_output)}, "
            f"median {_ratio(best.median)}). Rule: {RULE}."
        )
    else:
        lines.append(f"No member was scored ({len(members)} failed). Rule: {RULE}.")
    lines += [
        "",
        f"{len(ok)} of {len(members)} members scored. Ratios are the model's Wasserstein "
        "distance to the held-out data over the statistical floor (1 = as close as a second "
        "simulation), the median and the worst over every overall and binned metric of "
        "`muongen evaluate`; tail rows are the evaluation's own when it has them. Wall time: "
        "the training's, summed over the ranges (each range's last run); events seen: over "
        "the whole chain ('-': not found beside the evaluated checkpoint).",
        "",
        "## Members",
        "",
        markdown_table(header, table),
        "",
        "## Spread over seeds",
        "",
        markdown_table(
            ("setting", "seeds scored", "failed", "worst: range (std)", "median: range (std)"),
            [
                (
                    r["setting"],
                    ", ".join(map(str, r["seeds"])) or "-",
                    str(r["failed"]),
                    _range(r["worst"]),
                    _range(r["median"]),
                )
                for r in rows
            ],
        ),
        "",
    ]
    if plots:
        lines += ["## Score against each swept parameter", ""]
        lines += [f"![{p.stem}]({p.name})" for p in plots]
        lines.append("")
    return "\n".join(lines)


def _tail_cell(row: dict[str, Any] | None) -> str:
    """A tail row on the board: "worst (median)"; "n/a (N events)" where the subset has no
    ratio (too few held-out events in it, or no floor known there); '-': no row."""
    if row is None:
        return "-"
    if row["worst"] is None:
        if row["no_output"]:
            return "no output"
        n = row.get("n_events")  # too few events, or no floor known there
        return "n/a" + (f" ({n} events)" if n is not None else "")
    return f"{_ratio(row['worst'])} ({_ratio(row['median'])})"


def write_board(members: list[Member], out: Path, inputs: list[str]) -> dict[str, Path]:
    """leaderboard.md, leaderboard.json and the plots in ``out``; returns their paths."""
    rows = spread(members)
    try:
        plots = plot_parameters(members, out)
    except Exception as exc:  # the numbers matter more than the pictures
        log.warning("compare: the plots could not be drawn (%s: %s)", type(exc).__name__, exc)
        plots = []
    ok = [m for m in members if m.status == "ok"]
    doc = {
        "format": FORMAT,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "inputs": inputs,
        "rule": RULE,
        "best": ok[0].name if ok else None,
        "swept": swept_parameters(members),
        "members": [asdict(m) for m in members],
        "spread": rows,
        "plots": [p.name for p in plots],
    }
    from muongen.evaluate.report import jsonable

    paths = {"json": out / BOARD_JSON, "md": out / BOARD_MD}
    paths["json"].write_text(json.dumps(jsonable(doc), indent=2, allow_nan=False) + "\n")
    paths["md"].write_text(board_markdown(members, rows, plots))
    return paths
