"""Evaluation plots (matplotlib, Agg; no pyplot state, so they are safe in a training loop).

Every function takes :class:`EventSample` objects (held-out simulation first, then a dict
label -> generated samples) and returns a :class:`matplotlib.figure.Figure`; the caller
saves or logs it (:func:`save_figures`, ``TensorBoardLogger.figure``).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from muongen.evaluate.features import EVENT_OBSERVABLES, MUON_OBSERVABLES, EventSample
from muongen.evaluate.metrics import default_edges

REAL_LABEL = "simulation (held-out)"
COLORS = tuple(f"tab:{c}" for c in ("blue", "orange", "green", "purple", "brown", "cyan", "olive"))

#: Axis labels of the observables.
LABELS = {
    "log10_energy": "muon log10(E / GeV)",
    "radius": "muon radius r / m",
    "x": "muon x / m",
    "y": "muon y / m",
    "multiplicity": "log10(N + 1)",
    "log10_total_energy": "log10(sum E / GeV)",
    "log10_leading_energy": "log10(leading E / GeV)",
    "mean_radius": "mean radius / m",
}


def new_figure(width: float, height: float) -> Figure:
    """A Figure drawn by the Agg canvas (never registered with pyplot)."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figures(figures: dict[str, Figure], out_dir: str | Path, dpi: int = 110) -> list[Path]:
    """Write each figure as ``<out_dir>/<name>.png``; returns the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in figures.items():
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=dpi)
        paths.append(path)
    return paths


def _finite(x: np.ndarray) -> np.ndarray:
    return x[np.isfinite(x)]


def _edges(name: str, ref: np.ndarray, n_bins: int) -> np.ndarray:
    if name == "multiplicity":
        # log10(N + 1) is discrete: put edges half-way between counts (k + 1.5), log-spaced
        n_max = int(np.round(10.0 ** ref.max())) if ref.size else 1
        counts = np.unique(np.floor(np.geomspace(1, n_max + 1, n_bins)).astype(int))
        return np.log10(np.concatenate([[0], counts]) + 0.5)
    if ref.size == 0:
        return np.linspace(0.0, 1.0, n_bins + 1)
    lo, hi = np.quantile(ref, [0.002, 0.998])
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    pad = 0.02 * (hi - lo)
    return np.linspace(lo - pad, hi + pad, n_bins + 1)


def histogram_with_ratio(
    ax, rax, name: str, ref: np.ndarray, others: dict[str, np.ndarray], n_bins: int = 40
) -> None:
    """Normalised histograms of ``ref`` and ``others`` on ``ax``; other / ref on ``rax``
    with Poisson errors of both."""
    ref = _finite(ref)
    edges = _edges(name, ref, n_bins)
    width = np.diff(edges)
    centres = 0.5 * (edges[1:] + edges[:-1])
    n_ref, _ = np.histogram(ref, edges)
    d_ref = n_ref / max(n_ref.sum(), 1) / width
    ax.stairs(d_ref, edges, fill=True, color="0.8", label=REAL_LABEL)
    outside = []
    for color, (label, values) in zip(COLORS, others.items()):
        values = _finite(values)
        n, _ = np.histogram(values, edges)
        # normalised to all values, so that mass outside the axis range shows as missing
        d = n / max(values.size, 1) / width
        if values.size and n.sum() < 0.99 * values.size:
            outside.append(f"{label}: {1 - n.sum() / values.size:.0%} outside")
        ax.stairs(d, edges, color=color, lw=1.4, label=label)
        with np.errstate(divide="ignore", invalid="ignore"):
            r = d / d_ref
            err = r * np.sqrt(1.0 / n + 1.0 / n_ref)
        ok = (n_ref > 0) & (n > 0)
        rax.errorbar(centres[ok], r[ok], yerr=err[ok], fmt=".", ms=3, color=color, lw=0.8)
    if outside:
        ax.text(
            0.98, 0.97, "\n".join(outside), transform=ax.transAxes, ha="right", va="top", fontsize=7
        )
    ax.set_yscale("log")
    ax.tick_params(labelbottom=False)
    ax.set_ylabel("density")
    rax.axhline(1.0, color="0.4", lw=0.8)
    rax.set_ylim(0.0, 2.0)
    rax.set_xlim(edges[0], edges[-1])
    ax.set_xlim(edges[0], edges[-1])
    rax.set_ylabel("ratio")
    rax.set_xlabel(LABELS.get(name, name))


def feature_histograms(real: EventSample, others: dict[str, EventSample]) -> Figure:
    """Per-muon and per-event observables: histograms with ratio panels (2 x 4 panels)."""
    fig = new_figure(16, 8)
    grid = fig.add_gridspec(4, 4, height_ratios=[3, 1, 3, 1])
    for row, (kind, names) in enumerate((("muon", MUON_OBSERVABLES), ("event", EVENT_OBSERVABLES))):
        for col, name in enumerate(names):
            ax = fig.add_subplot(grid[2 * row, col])
            rax = fig.add_subplot(grid[2 * row + 1, col], sharex=ax)
            vals = {k: getattr(s, kind)[name] for k, s in others.items()}
            histogram_with_ratio(ax, rax, name, getattr(real, kind)[name], vals)
            if row == 0 and col == 0:
                ax.legend(fontsize=8)
    return fig


def _mass_groups(real: EventSample, max_groups: int = 5) -> list[tuple[str, np.ndarray]]:
    """(label, (lo, hi) in log10 A) groups: one per mass number when few, else quantiles."""
    log_a = real.condition("log10_mass")
    masses = np.unique(np.round(10.0**log_a, 3))
    if len(masses) <= max_groups:
        return [(f"A = {m:g}", np.log10([m * 0.999, m * 1.001])) for m in masses]
    edges = default_edges(log_a, max_groups - 1)
    return [
        (f"A {10**lo:.0f}-{10**hi:.0f}", np.array([lo, hi])) for lo, hi in itertools.pairwise(edges)
    ]


def _profile(x: np.ndarray, y: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean of y and its standard error in bins of x."""
    idx = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)
    n = np.bincount(idx, minlength=len(edges) - 1).astype(float)
    s = np.bincount(idx, weights=y, minlength=len(edges) - 1)
    s2 = np.bincount(idx, weights=y * y, minlength=len(edges) - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = s / n
        err = np.sqrt(np.maximum(s2 / n - mean**2, 0.0) / n)
    mean[n == 0] = np.nan
    return mean, err


def multiplicity_vs_energy(real: EventSample, others: dict[str, EventSample]) -> Figure:
    """Mean log10(N + 1) against primary log10 energy, one colour per primary mass group:
    held-out simulation as points with errors, generated samples as lines."""
    fig = new_figure(7, 5)
    ax = fig.add_subplot()
    log_e = real.condition("log10_energy")
    edges = np.linspace(log_e.min(), log_e.max() + 1e-9, 13) if real.n_events else np.arange(2.0)
    centres = 0.5 * (edges[1:] + edges[:-1])
    styles = ("-", "--", ":", "-.")
    for color, (label, (lo, hi)) in zip(COLORS * 2, _mass_groups(real)):
        for i, sample in enumerate([real, *others.values()]):
            la = sample.condition("log10_mass")
            sel = (la >= lo) & (la <= hi)
            mean, err = _profile(
                sample.condition("log10_energy")[sel], sample.event["multiplicity"][sel], edges
            )
            if i == 0:
                ax.errorbar(centres, mean, yerr=err, fmt="o", ms=3, color=color, label=f"{label}")
            else:
                ax.plot(centres, mean, styles[(i - 1) % 4], color=color, lw=1.2)
    for i, name in enumerate(others):
        ax.plot([], [], styles[i % 4], color="0.3", label=name)
    ax.set_xlabel("primary log10(E / GeV)")
    ax.set_ylabel("mean log10(N + 1)")
    ax.legend(fontsize=8, title=f"points: {REAL_LABEL}", title_fontsize=8)
    return fig


def by_depth(real: EventSample, others: dict[str, EventSample]) -> Figure:
    """Median and 16-84 % band of muon log10 energy and radius against vertical depth."""
    fig = new_figure(12, 4.5)
    axes = fig.subplots(1, 2)
    edges = default_edges(real.condition("depth"), 8, decimals=0)
    centres = 0.5 * (edges[1:] + edges[:-1])
    for ax, name in zip(axes, ("log10_energy", "radius")):
        for i, (label, sample) in enumerate({REAL_LABEL: real, **others}.items()):
            depth = sample.muon_condition("depth")
            values = sample.muon[name]
            idx = np.clip(np.searchsorted(edges, depth, side="right") - 1, 0, len(edges) - 2)
            q = np.full((len(centres), 3), np.nan)
            for k in range(len(centres)):
                v = values[idx == k]
                if v.size:
                    q[k] = np.quantile(v, [0.16, 0.5, 0.84])
            if i == 0:
                ax.fill_between(centres, q[:, 0], q[:, 2], color="0.85", label=f"{label} 16-84 %")
                ax.plot(centres, q[:, 1], color="0.3", lw=2, label=f"{label} median")
            else:
                color = COLORS[(i - 1) % len(COLORS)]
                ax.plot(centres, q[:, 1], "--", color=color, lw=1.5, label=f"{label} median")
                ax.plot(centres, q[:, 0], ":", color=color, lw=1)
                ax.plot(centres, q[:, 2], ":", color=color, lw=1)
        ax.set_xlabel("vertical depth / m")
        ax.set_ylabel(LABELS[name])
    axes[0].legend(fontsize=8)
    return fig


KEY_METRICS = (
    "multiplicity",
    "muon_log10_energy",
    "muon_radius",
    "event_log10_total_energy",
    "frechet_event",
)


def binned_ratios(result: dict[str, Any], metrics: tuple[str, ...] = KEY_METRICS) -> Figure:
    """Ratio to floor of each metric in each condition bin (model: filled, baseline: open)."""
    binned = result.get("binned", {})
    fig = new_figure(5 * max(len(binned), 1), 4.5)
    axes = np.atleast_1d(fig.subplots(1, max(len(binned), 1)))
    target = result.get("ratio_target", 3.0)
    for ax, (var, info) in zip(axes, binned.items()):
        rows = [r for r in info["bins"] if r["metrics"]]
        if not rows:
            continue
        names = [m for m in metrics if m in rows[0]["metrics"]]
        centres = np.array([0.5 * (r["lo"] + r["hi"]) for r in rows])
        for color, m in zip(COLORS * 2, names):
            model = [r["metrics"][m].get("model_ratio") for r in rows]
            base = [r["metrics"][m].get("baseline_ratio") for r in rows]
            ax.plot(centres, np.array(model, dtype=float), "o-", color=color, ms=4, label=m)
            ax.plot(centres, np.array(base, dtype=float), "o", mfc="none", color=color, ms=5)
        ax.axhline(1.0, color="0.4", lw=0.8)
        ax.axhline(target, color="tab:red", lw=0.8, ls="--")
        ax.set_yscale("log")
        ax.set_xlabel(var)
        ax.set_ylabel("metric / floor")
    axes[0].legend(fontsize=7, title="filled: model, open: baseline", title_fontsize=7)
    return fig
