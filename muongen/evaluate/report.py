"""Writing evaluation results: ``metrics.json`` (everything) and ``report.md`` (tables).

The result dict is the one :func:`muongen.evaluate.floors.compare` returns, plus whatever
the caller adds at the top level (checkpoint, data, throughput, ...). In JSON, NaN and
infinities become ``null``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from muongen.evaluate.metrics import UNITS


def jsonable(obj: Any) -> Any:
    """Plain JSON types: numpy scalars/arrays to Python, NaN/inf to None, Paths to str."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer, int)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def write_metrics_json(path: str | Path, result: dict[str, Any]) -> Path:
    """Write ``result`` as strict JSON (no NaN) to ``path``."""
    path = Path(path)
    path.write_text(json.dumps(jsonable(result), indent=2, allow_nan=False) + "\n")
    return path


def _fmt(v: Any, err: Any = None) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    text = f"{v:.3g}"
    if err is not None and isinstance(err, float) and math.isfinite(err):
        text += f" ± {err:.2g}"
    return text


HEADER = ("metric", "unit", "model", "floor ± err", "ratio", "baseline (ratio)", "verdict")


def summary_rows(section: dict[str, dict[str, float]], prefix: str = "") -> list[tuple[str, ...]]:
    """One table row per metric of a result section (``overall`` or a ``conditional`` one)."""
    rows = []
    for metric, e in section.items():
        base = "n/a"
        if "baseline" in e and _fmt(e["baseline"]) != "n/a":
            base = f"{_fmt(e['baseline'])} ({_fmt(e.get('baseline_ratio'))}x)"
        rows.append(
            (
                f"{prefix}{metric}",
                UNITS.get(metric, ""),
                _fmt(e.get("model"), e.get("model_err")),
                _fmt(e.get("floor"), e.get("floor_err")),
                _fmt(e.get("model_ratio"), e.get("model_ratio_err")),
                base,
                e.get("verdict", ""),
            )
        )
    return rows


def markdown_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """A GitHub-flavoured Markdown table, columns padded so it also reads in a terminal."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])


def summary_table(result: dict[str, Any]) -> str:
    """The overall metrics and their event-weighted means over condition bins, one table."""
    rows = summary_rows(result["overall"])
    for var, section in result.get("conditional", {}).items():
        rows += summary_rows(section, prefix=f"{var} bins: ")
    return markdown_table(HEADER, rows)


def headline(result: dict[str, Any]) -> str:
    """One sentence: how many overall metrics pass, and where the model beats the baseline."""
    overall = result["overall"]
    target = result.get("ratio_target", 3.0)
    ratios = [e.get("model_ratio") for e in overall.values()]
    ok = sum(1 for r in ratios if r is not None and math.isfinite(r) and r <= target)
    cond = [e for s in result.get("conditional", {}).values() for e in s.values()]
    beats = sum(1 for e in cond if "beats baseline" in e.get("verdict", ""))
    worst = max(
        (
            (m, e["model_ratio"])
            for m, e in overall.items()
            if math.isfinite(e.get("model_ratio", math.nan))
        ),
        key=lambda t: t[1],
        default=None,
    )
    text = f"{ok} of {len(overall)} overall metrics are within {target:g}x their floor"
    if worst:
        text += f" (worst: {worst[0]} at {worst[1]:.2f}x)"
    if cond:
        text += (
            f"; the model beats the condition-ignoring baseline on {beats} of {len(cond)}"
            " binned metrics"
        )
    return text + "."


def _bin_table(var: str, info: dict[str, Any]) -> str:
    header = ("metric", *(f"[{r['lo']:g}, {r['hi']:g}) n={r['n_events']}" for r in info["bins"]))
    names = next((list(r["metrics"]) for r in info["bins"] if r["metrics"]), [])
    rows = []
    for m in names:
        cells = [m]
        for r in info["bins"]:
            if r["sparse"] or not r["metrics"]:
                cells.append("sparse")
            else:
                e = r["metrics"][m]
                cells.append(f"{_fmt(e.get('model_ratio'))} ({_fmt(e.get('baseline_ratio'))})")
        rows.append(tuple(cells))
    return f"#### {var}\n\n" + markdown_table(header, rows)


def write_report(
    path: str | Path, result: dict[str, Any], figures: list[Path] | None = None
) -> Path:
    """Write ``report.md``: what was compared, the summary table, per-bin ratios, plots."""
    path = Path(path)
    meta = result.get("meta", {})
    lines = ["# muongen evaluation", ""]
    for key in ("checkpoint", "step", "data", "created", "muongen_version", "device"):
        if key in meta:
            value = meta[key]
            value = ", ".join(map(str, value)) if isinstance(value, list) else value
            lines.append(f"- {key}: {value}")
    split = result.get("split", {})
    lines += [
        f"- events: {split.get('n_events')} held-out"
        + (f" from {split['n_groups']} showers" if split.get("n_groups") else "")
        + f", {split.get('n_splits')} random half split(s), {split.get('n_boot')} bootstrap"
        " replicas",
        "",
        headline(result),
        "",
        "**How to read this.** *floor*: the metric between two random halves of the held-out "
        "data (± bootstrap standard error); *model*: the metric between one half and events "
        "generated for the other half's primaries; *ratio*: model / floor (1 = as close as a "
        "second simulation of the same size); *baseline*: a generator that ignores the "
        "primary (multiplicity and muons drawn from the pooled held-out events); it matches "
        "the overall per-muon marginals by construction, so the binned rows show what the "
        "model learned. Verdict: pass when ratio <= "
        f"{result.get('ratio_target', 3.0):g}; against the baseline within two standard errors.",
        "",
        "## Summary",
        "",
        summary_table(result),
        "",
    ]
    if result.get("binned"):
        lines += ["## Ratio to floor per bin: model (baseline)", ""]
        for var, info in result["binned"].items():
            lines += [_bin_table(var, info), ""]
    if "throughput" in result:
        t = result["throughput"]
        lines += [
            "## Generation throughput",
            "",
            f"{t.get('events', 0)} events, {t.get('muons', 0)} muons in "
            f"{t.get('seconds', 0):.2f} s on {t.get('device', '?')}: "
            f"{t.get('events_per_s', 0):,.0f} events/s, "
            f"{t.get('muons_per_s', 0):,.0f} muons/s",
            "",
        ]
    if figures:
        lines += ["## Plots", ""]
        lines += [f"![{Path(f).stem}]({Path(f).name})" for f in figures]
        lines.append("")
    path.write_text("\n".join(lines))
    return path
