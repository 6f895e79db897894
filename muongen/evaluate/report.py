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

from muongen.evaluate.floors import floor_certain, scored_entries
from muongen.evaluate.metrics import UNITS

#: how the model was drawn (metrics.json's split.model_draws), as the report says it
_MODEL_DRAWS = {
    "per split": ", the model generated anew for each",
    "one": ", one draw of the model for all",
}


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
    """Write ``result`` as strict JSON (no NaN) to ``path``, its "summary" (median and worst
    ratio) last, so that the file ends with the two numbers to look at first."""
    path = Path(path)
    ordered = {k: v for k, v in result.items() if k != "summary"}
    if "summary" in result:
        ordered["summary"] = result["summary"]
    path.write_text(json.dumps(jsonable(ordered), indent=2, allow_nan=False) + "\n")
    return path


def _times(v: Any) -> str:
    """A ratio as "1.23x"; infinite: the model has no output there."""
    if isinstance(v, float) and math.isinf(v):
        return "no model output"
    return f"{_fmt(v)}x"


def _fmt(v: Any, err: Any = None) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    text = f"{v:.3g}"
    if err is not None and isinstance(err, float) and math.isfinite(err):
        text += f" ± {err:.2g}"
    return text


HEADER = (
    "metric",
    "unit",
    "model",
    "floor ± err (rel)",
    "ratio",
    "baseline (ratio)",
    "verdict",
    "worst bin: ratio",
)


def _floor_cell(e: dict[str, Any]) -> str:
    text = _fmt(e.get("floor"), e.get("floor_err"))
    rel = e.get("floor_rel_err")
    if isinstance(rel, float) and math.isfinite(rel):
        text += f" ({rel:.0%})"
    return text


def worst_bin(result: dict[str, Any], metric: str, variables: list[str] | None = None) -> str:
    """ "VAR [lo, hi): R x" for the bin of ``variables`` (default: all) where ``metric``'s model
    ratio is worst ("no output" counts as worst); "" without binned values."""
    worst: tuple[float, str] | None = None
    for var, info in result.get("binned", {}).items():
        if variables is not None and var not in variables:
            continue
        for row in info["bins"]:
            e = (row["metrics"] or {}).get(metric)
            floor = None if e is None else e.get("floor")
            if floor is None or not (isinstance(floor, float) and math.isfinite(floor)):
                continue
            r = e.get("model_ratio")
            r = r if isinstance(r, float) and math.isfinite(r) else math.inf
            if worst is None or r > worst[0]:
                worst = (r, f"{var} [{row['lo']:g}, {row['hi']:g})")
    if worst is None:
        return ""
    value = "no output" if math.isinf(worst[0]) else f"{worst[0]:.3g}x"
    return f"{worst[1]}: {value}"


def summary_rows(
    section: dict[str, dict[str, float]],
    prefix: str = "",
    result: dict[str, Any] | None = None,
    variables: list[str] | None = None,
) -> list[tuple[str, ...]]:
    """One table row per metric of a result section (``overall`` or a ``conditional`` one);
    with ``result``, the last column names the worst bin of ``variables`` (default: all)."""
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
                _floor_cell(e),
                _fmt(e.get("model_ratio"), e.get("model_ratio_err")),
                base,
                e.get("verdict", ""),
                worst_bin(result, metric, variables) if result else "",
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
    """The overall metrics and their event-weighted means over condition bins, one table; each
    row names the worst bin of its metric (overall rows: over every binned variable)."""
    rows = summary_rows(result["overall"], result=result)
    for var, section in result.get("conditional", {}).items():
        rows += summary_rows(section, prefix=f"{var} bins: ", result=result, variables=[var])
    return markdown_table(HEADER, rows)


def headline(result: dict[str, Any]) -> str:
    """Two sentences: the median and worst ratio over all overall and binned metrics with the
    verdict counts, and where the model beats the baseline."""
    s = result.get("summary", {})
    n = s.get("n_metrics", 0)
    if not n:
        return "No metric has a floor: the held-out data hold no muons."
    text = (
        f"Over {n} overall and binned metrics the model's ratio to floor has median "
        f"{_times(s.get('median_ratio'))} and worst {_times(s.get('worst_ratio'))}"
        f" ({s.get('worst')}); {s.get('n_pass', 0)} pass, {s.get('n_no_pass', 0)} no pass "
        f"(worse than the baseline within errors), {s.get('n_FAIL', 0)} FAIL, "
        f"{s.get('n_floor_uncertain', 0)} floor uncertain (floor error above "
        f"{result['split'].get('floor_rel_err_max', 0.25):.0%}; no verdict)."
    )
    text += uncertain_note(result)
    if s.get("n_floor_certain"):
        text += (
            f" Where the floor is known ({s['n_floor_certain']} metrics): median "
            f"{_times(s.get('median_ratio_certain'))}, worst {_times(s.get('worst_ratio_certain'))}"
            f" ({s.get('worst_certain')})."
        )
    binned = [
        e
        for info in result.get("binned", {}).values()
        for row in info["bins"]
        for e in (row["metrics"] or {}).values()
        if "verdict" in e
    ]
    if binned:
        beats = sum(1 for e in binned if "beats baseline" in e["verdict"])
        text += (
            f" The model beats the condition-ignoring baseline on {beats} of {len(binned)}"
            " binned metrics"
        )
        verdicts = [e["verdict"] for e in binned]
        worse = [v for v in verdicts if "worse than baseline" in v or "loses to baseline" in v]
        below = sum(1 for v in worse if "baseline below floor" in v)
        if worse:
            text += (
                f" and is worse than it on {len(worse)}, {below} of them where the baseline"
                " is below the floor (the simulation itself would be worse there too)"
            )
        text += "."
    return text


#: Tail subsets in the console summary, by their key in result["summary"]["tail"].
_TAIL_SHORT = {"top_energy_decade": "top energy decade", "rich_bundles": "100+-muon bundles"}


def console_summary(result: dict[str, Any]) -> str:
    """What ``muongen evaluate`` prints: a few lines of at most ~100 characters (median and
    worst ratio to floor, the verdict counts, the tail subsets where measured); the tables
    stay in report.md, which the caller names."""
    s = result.get("summary", {})
    n = s.get("n_metrics", 0)
    lines = []
    if not n:
        lines.append("No metric has a floor: the held-out data hold no muons.")
    else:
        target = result.get("ratio_target", 3.0)
        lines += [
            f"model / floor over {n} metrics: median {_times(s.get('median_ratio'))}, "
            f"worst {_times(s.get('worst_ratio'))}",
            f"  worst: {s.get('worst')}",
            f"verdicts: {s.get('n_pass', 0)} pass, {s.get('n_no_pass', 0)} no pass, "
            f"{s.get('n_FAIL', 0)} FAIL, {s.get('n_floor_uncertain', 0)} floor uncertain "
            f"(target {target:g}x; 1x = a second simulation)",
        ]
        certain = s.get("n_floor_certain")
        if certain and certain != n:
            lines.append(
                f"floor known ({certain} metrics): median "
                f"{_times(s.get('median_ratio_certain'))}, "
                f"worst {_times(s.get('worst_ratio_certain'))}"
            )
    tails = []
    for name, t in (s.get("tail") or {}).items():
        label = _TAIL_SHORT.get(name, name.replace("_", " "))
        median = t.get("median_ratio")
        if median is None or (isinstance(median, float) and math.isnan(median)):
            tails.append(f"{label} too few events")
        else:
            worst = "no model output" if t.get("worst_no_output") else _times(t.get("worst_ratio"))
            tails.append(f"{label} median {_times(median)}, worst {worst}")
    if tails:
        lines.append("tail: " + "; ".join(tails))
    return "\n".join(lines)


def uncertain_note(result: dict[str, Any]) -> str:
    """A sentence on the metrics whose floor is not known (empty if none): how many could be
    measured in fewer than two splits, the errors of the others, and how many times the
    held-out showers would know those (errors fall as one over the root of the showers)."""
    split = result.get("split", {})
    rel_max = split.get("floor_rel_err_max", 0.25)
    uncertain = [e for _, e in scored_entries(result) if not floor_certain(e, rel_max)]
    if not uncertain:
        return ""
    rels = [e["floor_rel_err"] for e in uncertain if e.get("floor_rel_err") is not None]
    rels = [r for r in rels if np.isfinite(r)]
    unmeasured = len(uncertain) - len(rels)
    if split.get("n_groups"):
        unit, n_held = "showers", split["n_groups"]
    else:
        unit, n_held = "events", split.get("n_events", 0)
    parts = []
    if unmeasured:
        parts.append(
            f"{unmeasured} could be measured in fewer than two splits (their bins hold fewer "
            f"than {split.get('min_events', 50)} events of their kind in a half)"
        )
    if rels:
        errors = f"{min(rels):.0%}-{max(rels):.0%}" if len(rels) > 1 else f"{rels[0]:.0%}"
        has = "has a floor error" if len(rels) == 1 else "have floor errors"
        parts.append(f"{len(rels)} {has} of {errors}")
    text = f" Of the {len(uncertain)} uncertain floors, " + " and ".join(parts) + ": "
    if rels:
        factor = (max(rels) / rel_max) ** 2
        text += (
            f"errors fall as 1 / sqrt({unit}), so about {factor:.1f}x the {n_held:,} held-out "
            f"{unit} here would know the {len(rels)}"
            + (", and more would give the others their splits" if unmeasured else "")
        )
    else:
        text += f"more than the {n_held:,} held-out {unit} here would give them their splits"
    return text + " (--events, more held-out files)."


#: How a tail subset (``result["tail"]``, :mod:`muongen.evaluate.floors`) is named in the report.
TAIL_NAMES = {
    "top_energy_decade": "top decade of primary energy",
    "rich_bundles": "100+-muon bundles",
}


def _worst_cell(v: Any) -> str:
    """A worst ratio: "n/a" without one (NaN, or None from metrics.json), else :func:`_times`."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return _times(v)


def tail_table(result: dict[str, Any]) -> str:
    """The tail subsets, one summary row each (range, held-out events, median and worst
    ratio over the subset's metrics, the worst metric), then their metrics' rows as in the
    summary table; empty without tail subsets."""
    tails = result.get("tail") or {}
    summary = result.get("summary", {}).get("tail", {})
    if not tails:
        return ""
    rows = []
    for name, row in tails.items():
        s = summary.get(name, {})
        worst = s.get("worst")
        rows.append(
            (
                TAIL_NAMES.get(name, name),
                row.get("range", ""),
                str(row.get("n_events", "")),
                "sparse" if row.get("sparse") else _fmt(s.get("median_ratio")),
                "sparse" if row.get("sparse") else _worst_cell(s.get("worst_ratio")),
                worst or "",
            )
        )
    header = ("tail", "range", "held-out events", "median ratio", "worst ratio", "worst metric")
    text = markdown_table(header, rows)
    metric_rows = []
    for name, row in tails.items():
        if row.get("metrics"):
            prefix = f"{TAIL_NAMES.get(name, name)}: "
            metric_rows += [r[:-1] for r in summary_rows(row["metrics"], prefix=prefix)]
    if metric_rows:
        text += "\n\n" + markdown_table(HEADER[:-1], metric_rows)
    return text


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
    for key in (
        "checkpoint",
        "step",
        "energy_calibration",
        "radius_calibration",
        "data",
        "created",
        "muongen_version",
        "device",
    ):
        if key in meta:
            value = meta[key]
            value = ", ".join(map(str, value)) if isinstance(value, list) else value
            lines.append(f"- {key}: {value}")
    split = result.get("split", {})
    lines += [
        f"- events: {split.get('n_events')} held-out"
        + (f" from {split['n_groups']} showers" if split.get("n_groups") else "")
        + f", {split.get('n_splits')} random half splits"
        + _MODEL_DRAWS.get(split.get("model_draws"), ""),
        "",
        headline(result),
        "",
        "**How to read this.** *floor*: the metric between two random halves of the held-out "
        "data, averaged over the splits (± standard error of that mean, and relative to it); "
        "*model*: the metric between one half and events generated for the other half's "
        "primaries; *ratio*: model / floor (1 = as close as a second simulation of the same "
        "size); *baseline*: a generator that ignores the primary (multiplicity and muons "
        "drawn from the pooled held-out events); it matches the overall per-muon marginals "
        "by construction, so the binned rows show what the model learned. Verdict: no "
        "verdict (*floor uncertain*) where the floor's error is above "
        f"{split.get('floor_rel_err_max', 0.25):.0%}; else *pass* when ratio <= "
        f"{result.get('ratio_target', 3.0):g} and the model is no worse than the baseline, "
        "*no pass* when it is worse than the baseline within two standard errors (paired over "
        "the splits) or by more where the baseline is below the floor, *FAIL* when the ratio "
        "is above the target or the model loses to the baseline. *baseline below floor*: the "
        "baseline's ratio is below 1 by more than two standard errors, so a second "
        "simulation would lose to it too (pooled per-muon metrics that a few big bundles "
        "dominate: the baseline draws muons one by one). "
        "*Worst bin*: the condition bin where the metric's ratio is largest.",
        "",
        "## Summary",
        "",
        summary_table(result),
        "",
    ]
    if result.get("tail"):
        lines += [
            "## The tail",
            "",
            "Every metric again on two subsets of the held-out events, with floors of their "
            "own: the top decade of primary energy present in the data (chosen by the "
            "primary, so the same events in every sample) and the bundles of 100 or more "
            "muons (chosen in each sample by its own counts). Their ratios are not in the "
            "overall median and worst above: their events are counted there already.",
            "",
            tail_table(result),
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
