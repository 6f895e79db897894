"""Evaluation plots in the HEP style of ``mplhep`` (matplotlib Agg; no pyplot state, so they
are safe in a training loop).

Every function takes :class:`EventSample` objects (held-out simulation first, then a dict
label -> generated samples) and returns a :class:`matplotlib.figure.Figure` (or a dict
name -> Figure); the caller saves or logs them (:func:`save_figures`,
``TensorBoardLogger.figure``). Style: mplhep's experiment-neutral ROOT style, applied per
figure through ``rc_context`` (never globally), axis labels with units, log axes where a
quantity spans decades (ticks read 0.1, 1, 10, and 2, 3, 5 between them on a short axis, not
2x10^0), a legend in every panel with lines (or one for the figure), ratio panels under
histograms labelled "model / simulation", a note where a generated curve ends before the
simulation's, and a provenance footer (:func:`add_footer`: checkpoint, step, data, date).
"""

from __future__ import annotations

import functools
import itertools
import math
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from muongen.evaluate.features import EVENT_OBSERVABLES, MUON_OBSERVABLES, EventSample
from muongen.evaluate.metrics import default_edges

REAL_LABEL = "simulation (held-out)"
RATIO_LABEL = "model / simulation"
COLORS = tuple(f"tab:{c}" for c in ("blue", "orange", "green", "purple", "brown", "cyan", "olive"))

#: Axis labels of the observables, with units.
LABELS = {
    "log10_energy": r"muon $\log_{10}(E_\mu\,/\,\mathrm{GeV})$",
    "radius": r"muon distance to the axis $r$ [m]",
    "x": r"muon $x$ [m]",
    "y": r"muon $y$ [m]",
    "multiplicity": r"$\log_{10}(N_\mu + 1)$",
    "log10_total_energy": r"$\log_{10}(\sum E_\mu\,/\,\mathrm{GeV})$",
    "log10_leading_energy": r"$\log_{10}(E_\mu^\mathrm{leading}\,/\,\mathrm{GeV})$",
    "mean_radius": r"bundle mean $r$ [m]",
}
#: Axis labels of the primary's condition variables (the binned metrics' x axes).
CONDITION_LABELS = {
    "log10_energy": r"primary $\log_{10}(E\,/\,\mathrm{GeV})$",
    "cos_zenith": r"primary $\cos\theta$",
    "log10_mass": r"primary $\log_{10} A$",
    "depth": "vertical depth [m]",
}
#: Observables histogrammed in log-spaced bins on a log axis (they span decades).
LOG_X = ("radius", "mean_radius")
#: Units of one x unit, for the density axis label.
X_UNITS = {"radius": "1/m", "x": "1/m", "y": "1/m", "mean_radius": "1/m"}
#: A value's unit in the notes, by observable.
VALUE_UNITS = {"radius": " m", "x": " m", "y": " m", "mean_radius": " m"}
#: Simulated entries beyond the end of a generated curve that earn it a note.
MIN_MISSING = 5
#: Height of the provenance footer per line of text, in inches.
FOOTER_LINE_IN = 0.16


def _style() -> dict[str, Any]:
    import mplhep

    style = dict(mplhep.style.ROOT)
    style.pop("text.usetex", None)
    style.update({"font.size": 13, "legend.fontsize": 10, "axes.labelsize": 14})
    return style


def hep(fn):
    """Draw inside mplhep's style (``rc_context``: nothing global changes)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with matplotlib.rc_context(_style()):
            return fn(*args, **kwargs)

    return wrapper


def tick_text(value: float) -> str:
    """A log axis' tick: 0.01 ... 1000 as plain numbers, else 10^k or m x 10^k."""
    if not (math.isfinite(value) and value > 0):
        return ""
    if 1e-3 <= value < 1e4:
        return f"{value:g}"
    exp = math.floor(math.log10(value) + 1e-9)
    mant = value / 10.0**exp
    return f"$10^{{{exp}}}$" if abs(mant - 1) < 1e-6 else f"${mant:g}\\times10^{{{exp}}}$"


def _minor_labeller(mantissas: tuple[int, ...]) -> FuncFormatter:
    """Labels for the minor ticks whose mantissa is in ``mantissas`` (2 -> 0.2, 2, 20 ...)."""

    def text(value: float, _pos: Any = None) -> str:
        if not (math.isfinite(value) and value > 0):
            return ""
        mant = value / 10.0 ** math.floor(math.log10(value) + 1e-9)
        return tick_text(value) if any(abs(mant - m) < 1e-6 for m in mantissas) else ""

    return FuncFormatter(text)


def readable_log_ticks(ax) -> None:
    """Plain-number labels on ``ax``'s log axes, and on the minor ticks where the majors
    alone would leave few labels: 2, 3, 5 on an axis of at most 1.5 decades, 2 and 5 up to
    2.5 decades, none on longer axes."""
    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() != "log":
            continue
        lo, hi = sorted(axis.get_view_interval())
        decades = math.log10(hi / lo) if lo > 0 and math.isfinite(hi / lo) else math.inf
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: tick_text(v)))
        if decades <= 1.5:
            axis.set_minor_formatter(_minor_labeller((2, 3, 5)))
        elif decades <= 2.5:
            axis.set_minor_formatter(_minor_labeller((2, 5)))
        else:
            axis.set_minor_formatter(NullFormatter())


class HepFigure(Figure):
    """A Figure that draws in mplhep's style wherever it is rendered (a PNG here, an image
    for TensorBoard elsewhere): fonts and mathtext are resolved at draw time, and so are the
    labels of log axes (:func:`readable_log_ticks`, once the axis limits are final)."""

    def draw(self, renderer) -> None:
        with matplotlib.rc_context(_style()):
            for ax in self.axes:
                readable_log_ticks(ax)
            super().draw(renderer)


def _short_path(path: Any, parts: int = 3) -> str:
    """The last ``parts`` components of a path or URL (a footer has room for little)."""
    text = str(path).rstrip("/")
    pieces = text.split("/")
    return text if len(pieces) <= parts else "…/" + "/".join(pieces[-parts:])


def provenance(meta: Mapping[str, Any] | None) -> str:
    """One line naming what a plot shows, from an evaluation's ``meta``: the checkpoint and
    its step, the held-out data, the date and the muongen version ("" without meta)."""
    meta = meta or {}
    parts = []
    if meta.get("checkpoint"):
        parts.append(f"checkpoint {_short_path(meta['checkpoint'])}")
    if meta.get("step") is not None:
        parts.append(f"step {meta['step']:,}")
    data = meta.get("data")
    if data:
        data = [data] if isinstance(data, (str, Path)) else list(data)
        text = ", ".join(_short_path(d, 2) for d in data[:2])
        parts.append(f"data {text}" + (f" +{len(data) - 2} more" if len(data) > 2 else ""))
    if meta.get("created"):
        created = str(meta["created"]).replace("T", " ")
        parts.append(created[:16] + (" UTC" if created.endswith("+00:00") else ""))
    if meta.get("muongen_version"):
        parts.append(f"muongen {meta['muongen_version']}")
    return " · ".join(parts)


def add_footer(fig: Figure, text: str) -> Figure:
    """``text`` in small grey letters along the bottom edge of ``fig`` (wrapped to its width),
    with the panels moved up to make room. Returns ``fig``."""
    if not text:
        return fig
    per_line = max(int(fig.get_figwidth() / 0.062), 40)  # 7 pt characters per inch
    lines = textwrap.wrap(text, per_line) or [text]
    frac = (FOOTER_LINE_IN * len(lines) + 0.04) / fig.get_figheight()
    engine = fig.get_layout_engine()
    if engine is not None and hasattr(engine, "set"):
        engine.set(rect=(0, frac, 1, 1 - frac))
    fig.text(0.006, 0.006, "\n".join(lines), fontsize=7, color="0.35", ha="left", va="bottom")
    return fig


def new_figure(width: float, height: float) -> Figure:
    """A Figure drawn by the Agg canvas (never registered with pyplot)."""
    fig = HepFigure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def ratio_axes(fig: Figure, spec=None) -> tuple[Any, Any]:
    """A main panel over a ratio panel sharing x (3:1), in ``fig`` or a subplot spec."""
    grid = (spec.subgridspec if spec is not None else fig.add_gridspec)(
        2, 1, height_ratios=[3, 1], hspace=0.05
    )
    ax = fig.add_subplot(grid[0])
    rax = fig.add_subplot(grid[1], sharex=ax)
    ax.tick_params(labelbottom=False)
    return ax, rax


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


def _finite(x: np.ndarray, log: bool = False) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    return x[np.isfinite(x) & (x > 0)] if log else x[np.isfinite(x)]


def _edges(name: str, ref: np.ndarray, n_bins: int) -> np.ndarray:
    if name == "multiplicity":
        # log10(N + 1) is discrete: put edges half-way between counts (k + 1.5), log-spaced
        n_max = int(np.round(10.0 ** ref.max())) if ref.size else 1
        counts = np.unique(np.floor(np.geomspace(1, n_max + 1, n_bins)).astype(int))
        return np.log10(np.concatenate([[0], counts]) + 0.5)
    if ref.size == 0:
        return np.geomspace(0.1, 1.0, n_bins + 1) if name in LOG_X else np.linspace(0, 1, 2)
    lo, hi = np.quantile(ref, [0.002, 0.998])
    if name in LOG_X:
        lo, hi = max(lo, 1e-3), max(hi, 2 * max(lo, 1e-3))
        return np.geomspace(lo / 1.05, hi * 1.05, n_bins + 1)
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    pad = 0.02 * (hi - lo)
    return np.linspace(lo - pad, hi + pad, n_bins + 1)


def weighted_hist(
    values: np.ndarray, edges: np.ndarray, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Sum of weights per bin and its error sqrt(sum w^2) (Poisson for unit weights)."""
    w = np.ones_like(values, dtype=float) if weights is None else np.asarray(weights, float)
    s, _ = np.histogram(values, edges, weights=w)
    s2, _ = np.histogram(values, edges, weights=w * w)
    return s, np.sqrt(s2)


def draw_ratio(rax, edges, num, num_err, den, den_err, color, label=None) -> None:
    """num / den per bin with both errors added in quadrature, as points."""
    centres = np.sqrt(edges[1:] * edges[:-1]) if edges[0] > 0 else 0.5 * (edges[1:] + edges[:-1])
    ok = (num > 0) & (den > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = num / den
        err = r * np.sqrt((num_err / num) ** 2 + (den_err / den) ** 2)
    rax.errorbar(centres[ok], r[ok], yerr=err[ok], fmt="o", ms=3, color=color, lw=1, label=label)


def curve_end_notes(
    n: np.ndarray, n_ref: np.ndarray, edges: np.ndarray, unit: str = ""
) -> list[tuple[float, str]]:
    """Where a generated histogram ``n`` ends before the simulated ``n_ref`` (at least
    :data:`MIN_MISSING` simulated entries beyond its last or before its first filled bin):
    ``[(edge, "none above 15 m (0.6 % of simulated)")]``, high end first."""
    total = n_ref.sum()
    filled = np.flatnonzero(n > 0)
    if total <= 0:
        return []
    if filled.size == 0:
        return [(float(edges[0]), "none in this range")]
    notes = []
    above = n_ref[filled[-1] + 1 :].sum()
    if above >= MIN_MISSING:
        edge = float(edges[filled[-1] + 1])
        notes.append((edge, f"none above {edge:.3g}{unit} ({above / total:.1%} of simulated)"))
    below = n_ref[: filled[0]].sum()
    if below >= MIN_MISSING:
        edge = float(edges[filled[0]])
        notes.append((edge, f"none below {edge:.3g}{unit} ({below / total:.1%} of simulated)"))
    return notes


def histogram_with_ratio(
    ax, rax, name: str, ref: np.ndarray, others: dict[str, np.ndarray], n_bins: int = 40
) -> None:
    """Normalised histograms of ``ref`` (filled, with errors) and ``others`` (lines) on
    ``ax``; other / ref on ``rax`` with the errors of both; a legend entry for each, and
    one for each place where a generated curve ends before the simulation's (a dotted line
    there)."""
    import mplhep

    log_x = name in LOG_X
    ref = _finite(ref, log_x)
    edges = _edges(name, ref, n_bins)
    width = np.diff(edges)
    n_ref, e_ref = weighted_hist(ref, edges)
    norm_ref = max(ref.size, 1) * width
    mplhep.histplot(
        n_ref / norm_ref,
        edges,
        yerr=e_ref / norm_ref,
        histtype="fill",
        color="0.8",
        label=REAL_LABEL,
        ax=ax,
        flow="none",
    )
    outside = []
    for color, (label, values) in zip(COLORS, others.items()):
        values = _finite(values, log_x)
        n, e = weighted_hist(values, edges)
        # normalised to all values, so that mass outside the axis range shows as missing
        norm = max(values.size, 1) * width
        if values.size and n.sum() < 0.99 * values.size:
            outside.append(f"{label}: {1 - n.sum() / values.size:.0%} outside")
        mplhep.histplot(
            n / norm,
            edges,
            yerr=e / norm,
            histtype="step",
            color=color,
            lw=1.4,
            label=label,
            ax=ax,
            flow="none",
        )
        draw_ratio(
            rax,
            edges,
            n / norm,
            e / norm,
            n_ref / norm_ref,
            e_ref / norm_ref,
            color,
            label=f"{label} / simulation",
        )
        for edge, note in curve_end_notes(n, n_ref, edges, VALUE_UNITS.get(name, "")):
            ax.axvline(edge, color=color, ls=":", lw=1.2, label=f"{label}: {note}")
            rax.axvline(edge, color=color, ls=":", lw=1.2)
    if outside:
        ax.text(
            0.98,
            0.97,
            "\n".join(outside),
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=8,
        )
    ax.set_yscale("log")
    unit = X_UNITS.get(name)
    ax.set_ylabel(r"$1/N\;\mathrm{d}N/\mathrm{d}x$" + (f" [{unit}]" if unit else ""))
    # a light frame: the legend may sit on the simulation's grey fill
    ax.legend(
        fontsize=9,
        loc="lower center" if name in ("x", "y") else "best",
        frameon=True,
        facecolor="white",
        edgecolor="none",
        framealpha=0.85,
    )
    rax.axhline(1.0, color="0.4", lw=0.8)
    rax.set_ylim(0.0, 2.0)
    rax.set_ylabel(RATIO_LABEL)
    rax.set_xlabel(LABELS.get(name, name))
    if log_x:
        ax.set_xscale("log")
    ax.set_xlim(edges[0], edges[-1])


@hep
def feature_figure(name: str, real: EventSample, others: dict[str, EventSample]) -> Figure:
    """One observable (muon or event level): normalised histograms with a ratio panel."""
    kind = "muon" if name in MUON_OBSERVABLES else "event"
    fig = new_figure(6.5, 6)
    ax, rax = ratio_axes(fig)
    vals = {k: getattr(s, kind)[name] for k, s in others.items()}
    histogram_with_ratio(ax, rax, name, getattr(real, kind)[name], vals)
    return fig


def feature_figures(real: EventSample, others: dict[str, EventSample]) -> dict[str, Figure]:
    """One figure per observable, named ``muon_<name>`` / ``event_<name>``."""
    out = {f"muon_{n}": feature_figure(n, real, others) for n in MUON_OBSERVABLES}
    out.update({f"event_{n}": feature_figure(n, real, others) for n in EVENT_OBSERVABLES})
    return out


@hep
def feature_histograms(real: EventSample, others: dict[str, EventSample]) -> Figure:
    """All per-muon and per-event observables in one overview figure (2 x 4 panels with
    ratio panels; for TensorBoard, where one image per check is easier to follow)."""
    fig = new_figure(22, 11)
    grid = fig.add_gridspec(2, 4)
    for row, (kind, names) in enumerate((("muon", MUON_OBSERVABLES), ("event", EVENT_OBSERVABLES))):
        for col, name in enumerate(names):
            ax, rax = ratio_axes(fig, grid[row, col])
            vals = {k: getattr(s, kind)[name] for k, s in others.items()}
            histogram_with_ratio(ax, rax, name, getattr(real, kind)[name], vals)
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


@hep
def multiplicity_vs_energy(real: EventSample, others: dict[str, EventSample]) -> Figure:
    """Mean log10(N + 1) against primary log10 energy, one colour per primary mass group:
    held-out simulation as points with errors, generated samples as lines with small markers
    (so a bin between empty ones shows); the ratio panel shows the first generated sample's
    (the model's) (N + 1) / simulated, 10^(mean difference). A mass group whose curves end
    before the highest energy bin says so in its legend entry ("none above 10^6.7 GeV": no
    held-out primaries there, so nothing was generated there either)."""
    fig = new_figure(7.5, 6.5)
    ax, rax = ratio_axes(fig)
    log_e = real.condition("log10_energy")
    edges = np.linspace(log_e.min(), log_e.max() + 1e-9, 13) if real.n_events else np.arange(2.0)
    centres = 0.5 * (edges[1:] + edges[:-1])
    styles = ("-", "--", ":", "-.")
    occupied = np.histogram(log_e, edges)[0] > 0
    last_bin = int(np.flatnonzero(occupied)[-1]) if occupied.any() else 0
    ends = 0
    for color, (label, (lo, hi)) in zip(COLORS * 2, _mass_groups(real)):
        ref = None
        for i, sample in enumerate([real, *others.values()]):
            la = sample.condition("log10_mass")
            sel = (la >= lo) & (la <= hi)
            mean, err = _profile(
                sample.condition("log10_energy")[sel], sample.event["multiplicity"][sel], edges
            )
            if i == 0:
                ref = (mean, err)
                filled = np.flatnonzero(np.isfinite(mean))
                if filled.size and filled[-1] < last_bin:
                    label += f": none above $10^{{{edges[filled[-1] + 1]:.1f}}}$ GeV"
                    ends += 1
                ax.errorbar(centres, mean, yerr=err, fmt="o", ms=4, color=color, label=label)
            else:
                style = styles[(i - 1) % 4]
                ax.plot(centres, mean, style, marker="s", ms=2.5, color=color, lw=1.4)
                if i == 1:  # the model
                    ratio = 10.0 ** (mean - ref[0])
                    rax.errorbar(
                        centres,
                        ratio,
                        yerr=ratio * np.log(10) * np.hypot(err, ref[1]),
                        fmt="o-",
                        ms=3,
                        color=color,
                        lw=1,
                    )
    for i, name in enumerate(others):
        ax.plot([], [], styles[i % 4], marker="s", ms=2.5, color="0.3", label=f"{name} (lines)")
    ax.set_ylabel(r"mean $\log_{10}(N_\mu + 1)$")
    title = f"points: {REAL_LABEL}"
    if ends:
        title += "\nnone above: no held-out primaries,\nso no generated events either"
    ax.legend(fontsize=9, title=title, title_fontsize=9, loc="upper left")
    rax.axhline(1.0, color="0.4", lw=0.8)
    rax.set_ylim(0.5, 1.5)
    first = next(iter(others), "model")
    rax.set_ylabel(RATIO_LABEL if first == "model" else f"{first} / simulation")
    rax.set_xlabel(r"primary $\log_{10}(E\,/\,\mathrm{GeV})$")
    return fig


@hep
def by_depth(real: EventSample, others: dict[str, EventSample]) -> Figure:
    """Median and 16-84 % band of muon log10 energy and radius against vertical depth."""
    fig = new_figure(13, 5)
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
                ax.plot(centres, q[:, 0], ":", color=color, lw=1, label=f"{label} 16 %, 84 %")
                ax.plot(centres, q[:, 2], ":", color=color, lw=1)
        ax.set_xlabel("vertical depth [m]")
        ax.set_ylabel(LABELS[name])
        if name in LOG_X:
            ax.set_yscale("log")
        ax.legend(fontsize=9, frameon=True, facecolor="white", edgecolor="none", framealpha=0.85)
    return fig


KEY_METRICS = (
    "multiplicity",
    "muon_log10_energy",
    "muon_radius",
    "event_log10_total_energy",
    "frechet_event",
)


@hep
def binned_ratios(result: dict[str, Any], metrics: tuple[str, ...] = KEY_METRICS) -> Figure:
    """Ratio to floor of each metric in each condition bin (model: filled, baseline: open)."""
    binned = result.get("binned", {})
    fig = new_figure(5.5 * max(len(binned), 1), 5.8)
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
        ax.axhline(1.0, color="0.4", lw=0.8, label="floor")
        ax.axhline(target, color="tab:red", lw=0.8, ls="--", label=f"target {target:g} x floor")
        ax.set_yscale("log")
        ax.set_xlabel(CONDITION_LABELS.get(var, var))
        ax.set_ylabel("metric / floor")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:  # one legend for all panels, above them
        fig.legend(
            handles,
            labels,
            loc="outside upper center",
            ncol=min(len(handles), 4),
            fontsize=9,
            title="filled: model, open: baseline (a generator that ignores the primary)",
            title_fontsize=9,
        )
    return fig


@hep
def weighted_energy_spectrum(
    energy: np.ndarray,
    weights: np.ndarray,
    edges: np.ndarray,
    model_rate: np.ndarray,
    model_label: str,
) -> Figure:
    """Weighted primary energy spectrum E dR/dE of a sample against the flux model's
    binned rate (same units, 1/(m^2 s)), with the sample / model ratio."""
    import mplhep

    fig = new_figure(7, 6.5)
    ax, rax = ratio_axes(fig)
    rate, err = weighted_hist(energy, edges, weights)
    per_ln_e = np.log(edges[1:] / edges[:-1])
    mplhep.histplot(
        model_rate / per_ln_e,
        edges,
        histtype="step",
        color="0.3",
        lw=2,
        ax=ax,
        label=f"{model_label} (integral per bin)",
        flow="none",
    )
    mplhep.histplot(
        rate / per_ln_e,
        edges,
        yerr=err / per_ln_e,
        histtype="errorbar",
        color=COLORS[0],
        ax=ax,
        label=f"weighted sample ({len(energy):,} showers)",
        flow="none",
    )
    draw_ratio(rax, edges, rate, err, model_rate, np.zeros_like(model_rate), COLORS[0])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylabel(r"$E\,\mathrm{d}R/\mathrm{d}E$ [m$^{-2}$ s$^{-1}$]")
    ax.legend()
    rax.axhline(1.0, color="0.4", lw=0.8)
    rax.set_ylim(0.8, 1.2)
    rax.set_ylabel("sample / model")
    rax.set_xlabel(r"primary energy $E$ [GeV]")
    ax.set_xlim(edges[0], edges[-1])
    return fig


@hep
def weighted_multiplicity(
    counts: np.ndarray, weights: np.ndarray, depth_m: float, flux_label: str
) -> Figure:
    """Bundle multiplicity (N >= 1) at one depth: flux-weighted (a rate) against
    unweighted (as generated), both normalised to unit sum for the shapes, with the
    weighted / unweighted ratio."""
    import mplhep

    fig = new_figure(7, 6.5)
    ax, rax = ratio_axes(fig)
    sel = counts >= 1
    n, w = counts[sel].astype(float), weights[sel]
    top = max(float(n.max()) if n.size else 1.0, 2.0)
    edges = np.unique(np.floor(np.geomspace(1, top + 1, 30))) - 0.5
    edges = np.append(edges, top + 0.5) if edges[-1] < top + 0.5 else edges
    wr, we = weighted_hist(n, edges, w)
    ur, ue = weighted_hist(n, edges)
    ws, us = max(wr.sum(), 1e-300), max(ur.sum(), 1)
    mplhep.histplot(
        wr / ws,
        edges,
        yerr=we / ws,
        histtype="errorbar",
        color=COLORS[0],
        ax=ax,
        flow="none",
        label=f"{flux_label}-weighted: {w.sum():.3g} bundles m$^{{-2}}$ s$^{{-1}}$",
    )
    mplhep.histplot(
        ur / us,
        edges,
        yerr=ue / us,
        histtype="step",
        color=COLORS[1],
        lw=1.5,
        ax=ax,
        flow="none",
        label=f"unweighted (as generated): {int(sel.sum()):,} bundles",
    )
    draw_ratio(rax, edges, wr / ws, we / ws, ur / us, ue / us, COLORS[0])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylabel("fraction of bundles per bin")
    ax.legend(title=f"vertical depth {depth_m:g} m", fontsize=9, title_fontsize=10)
    rax.axhline(1.0, color="0.4", lw=0.8)
    rax.set_yscale("log")
    rax.set_ylabel("weighted / unw.")
    rax.set_xlabel(r"muons per bundle $N_\mu$")
    ax.set_xlim(edges[0], edges[-1])
    return fig
