"""What a flux-weighted sample says: rates against the model's integral, and its plots.

:func:`flux_report` writes ``flux.json`` (the generation, the flux model, the area
convention, the model's integral rate by quadrature, the sample's summed weight with its
statistical error, and the bundle rate per depth) and two figures: the weighted primary
energy spectrum against the model, and the weighted against the unweighted multiplicity
at the depth nearest 1.5 km.

With the checkpoint's training domain (:mod:`muongen.domain`), flux.json gets a
``training_domain`` block (the rows and the fraction of the weight outside it, per energy
bin too) and the energy figure shades the energies outside the trained range, where the
model extrapolates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from muongen import domain as training_domain
from muongen.evaluate import plots
from muongen.evaluate.flux import (
    FluxWeighter,
    Generation,
    WeightedPrimaries,
    binned_rate,
    integral_rate,
    write_info,
)

REPORT_DEPTH_M = 1500.0


def rates(
    primaries: WeightedPrimaries,
    counts: np.ndarray,
    depths: np.ndarray,
    weighter: FluxWeighter,
    gen: Generation,
) -> dict[str, Any]:
    """Rates in 1/(m^2 s): the model's integral, the sample's estimate of it, and per depth
    the rate of bundles with at least one muon (each with its statistical error)."""
    area = primaries.info["area"]
    w = primaries.weight
    model = integral_rate(weighter, gen.energy_gev, gen.zenith_rad, area=area)
    sample, err = float(w.sum()), float(np.sqrt((w * w).sum()))
    per_depth = []
    grid = counts.reshape(primaries.n_showers, len(depths))  # shower after shower, D depths
    for j, depth in enumerate(depths):
        hit = grid[:, j] >= 1
        per_depth.append(
            {
                "depth_m": float(depth),
                "bundles": int(hit.sum()),
                "bundle_rate": float(w[hit].sum()),
                "bundle_rate_err": float(np.sqrt((w[hit] ** 2).sum())),
                "mean_muons_weighted": float((w * grid[:, j]).sum() / max(w.sum(), 1e-300)),
            }
        )
    return {
        "units": "1/(m^2 s)",
        "area": area,
        "model_integral_rate": model,
        "sample_rate": sample,
        "sample_rate_err": err,
        "pull": (sample - model) / err if err > 0 else None,
        "by_depth": per_depth,
    }


def flux_report(
    out_dir: str | Path,
    primaries: WeightedPrimaries,
    counts: np.ndarray,
    depths: np.ndarray,
    weighter: FluxWeighter,
    gen: Generation,
    *,
    domain: dict[str, Any] | None = None,
    extrapolated: dict[str, Any] | None = None,
    provenance: str = "",
) -> dict[str, Any]:
    """Write flux.json and the two figures into ``out_dir``; returns what flux.json holds.

    ``domain``: the checkpoint's training domain (None: not recorded); ``extrapolated``:
    what :func:`muongen.domain.check` found for the sample's rows; ``provenance``: the
    figures' footer (:func:`muongen.evaluate.plots.provenance`), kept in flux.json too."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {**primaries.info, "rates": rates(primaries, counts, depths, weighter, gen)}
    edges = np.geomspace(*gen.energy_gev, 21)
    model = binned_rate(weighter, edges, gen.zenith_rad, area=primaries.info["area"])
    j = int(np.argmin(np.abs(depths - REPORT_DEPTH_M)))
    grid = counts.reshape(primaries.n_showers, len(depths))
    summary["training_domain"] = domain_block(domain, extrapolated, primaries, edges)
    spectrum = plots.weighted_energy_spectrum(
        primaries.energy, primaries.weight, edges, model, weighter.name
    )
    if domain is not None and domain.get("events"):
        mark_outside(spectrum, domain, edges)
    figures = {
        "primary_energy": spectrum,
        f"multiplicity_{depths[j]:.0f}m": plots.weighted_multiplicity(
            grid[:, j], primaries.weight, float(depths[j]), weighter.name
        ),
    }
    if provenance:
        summary["provenance"] = provenance
        figures = {name: plots.add_footer(fig, provenance) for name, fig in figures.items()}
    summary["figures"] = [str(p) for p in plots.save_figures(figures, out_dir)]
    write_info(str(out_dir / "flux.json"), summary)
    return summary


def domain_block(
    domain: dict[str, Any] | None,
    extrapolated: dict[str, Any] | None,
    primaries: WeightedPrimaries,
    edges: np.ndarray,
) -> dict[str, Any]:
    """flux.json's ``training_domain``: the sample's rows outside the checkpoint's training
    domain (count, fraction of the weight) and, per energy bin, the fraction of the showers'
    weight outside it (shower primaries, at every depth the domain covers)."""
    if domain is None:
        return {"known": False}
    block = dict(extrapolated or {})
    block["trained_on"] = training_domain.describe(domain)
    cond = np.column_stack(
        [
            primaries.energy,
            primaries.zenith,
            primaries.mass,
            np.full(primaries.n_showers, np.mean(domain["depth_m"] or [0.0])),
        ]
    )
    out = training_domain.outside(domain, cond)["any"]
    w = primaries.weight
    which = np.clip(np.searchsorted(edges, primaries.energy, side="right") - 1, 0, len(edges) - 2)
    total = np.bincount(which, weights=w, minlength=len(edges) - 1)
    beyond = np.bincount(which, weights=w * out, minlength=len(edges) - 1)
    block["energy_edges_gev"] = [float(e) for e in edges]
    block["weight_fraction_outside_by_energy"] = [  # null: no shower in the bin
        float(b / t) if t > 0 else None for b, t in zip(beyond, total)
    ]
    return block


def mark_outside(fig, domain: dict[str, Any], edges: np.ndarray) -> None:
    """Shade the energies outside the trained range on every panel of the spectrum."""
    lo, hi = (10.0**x for x in domain["log10_energy"])
    first = True
    for ax in fig.axes:
        for a, b in ((edges[0], lo), (hi, edges[-1])):
            if b > a:
                label = "outside the training domain" if first else None
                ax.axvspan(a, b, color="0.85", zorder=0, label=label)
                first = False
    if not first and fig.axes:
        fig.axes[0].legend()
