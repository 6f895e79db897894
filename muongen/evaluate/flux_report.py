"""What a flux-weighted sample says: rates against the model's integral, and its plots.

:func:`flux_report` writes ``flux.json`` (the generation, the flux model, the area
convention, the model's integral rate by quadrature, the sample's summed weight with its
statistical error, and the bundle rate per depth) and two figures: the weighted primary
energy spectrum against the model, and the weighted against the unweighted multiplicity
at the depth nearest 1.5 km.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

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
) -> dict[str, Any]:
    """Write flux.json and the two figures into ``out_dir``; returns what flux.json holds."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {**primaries.info, "rates": rates(primaries, counts, depths, weighter, gen)}
    edges = np.geomspace(*gen.energy_gev, 21)
    model = binned_rate(weighter, edges, gen.zenith_rad, area=primaries.info["area"])
    j = int(np.argmin(np.abs(depths - REPORT_DEPTH_M)))
    grid = counts.reshape(primaries.n_showers, len(depths))
    figures = {
        "primary_energy": plots.weighted_energy_spectrum(
            primaries.energy, primaries.weight, edges, model, weighter.name
        ),
        f"multiplicity_{depths[j]:.0f}m": plots.weighted_multiplicity(
            grid[:, j], primaries.weight, float(depths[j]), weighter.name
        ),
    }
    summary["figures"] = [str(p) for p in plots.save_figures(figures, out_dir)]
    write_info(str(out_dir / "flux.json"), summary)
    return summary
