"""Distances between a reference and another set of events: pure functions on numpy arrays.

``compute_metrics(ref, other)`` returns, for two :class:`EventSample`:

==============================  ===========================================================
``muon_log10_energy``           W1 of log10(E/GeV) over all muons
``muon_radius``                 W1 of the radius (m) over all muons
``muon_x``, ``muon_y``          W1 of x, y (m) over all muons
``multiplicity``                W1 of log10(N + 1) over all events
``event_log10_total_energy``    W1 of log10 of the summed muon energy (events with muons)
``event_log10_leading_energy``  W1 of log10 of the leading muon energy (events with muons)
``event_mean_radius``           W1 of the mean radius (m) (events with muons)
``frechet_event``               Frechet distance of the four event observables (standardised)
==============================  ===========================================================

A metric without data on one side (no muons, no events) is NaN. Binning by condition
(primary log10 energy, cos zenith, depth) is in :func:`bin_index` / :func:`default_edges`.
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.linalg
from scipy.stats import wasserstein_distance

from muongen.evaluate.features import EVENT_OBSERVABLES, MUON_OBSERVABLES, EventSample

W1_MUON = {f"muon_{k}": k for k in MUON_OBSERVABLES}
W1_EVENT = {
    "multiplicity": "multiplicity",
    "event_log10_total_energy": "log10_total_energy",
    "event_log10_leading_energy": "log10_leading_energy",
    "event_mean_radius": "mean_radius",
}
FRECHET = "frechet_event"
METRICS = (*W1_MUON, *W1_EVENT, FRECHET)

#: Units of each metric, for reports.
UNITS = {
    "muon_log10_energy": "dex",
    "muon_radius": "m",
    "muon_x": "m",
    "muon_y": "m",
    "multiplicity": "dex",
    "event_log10_total_energy": "dex",
    "event_log10_leading_energy": "dex",
    "event_mean_radius": "m",
    "frechet_event": "σ²",
}


def wasserstein_1d(a: np.ndarray, b: np.ndarray) -> float:
    """1-D Wasserstein (earth mover's) distance of two samples (n,), (m,); NaNs dropped.

    NaN when either side is empty.
    """
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if a.size == 0 or b.size == 0:
        return float("nan")
    return float(wasserstein_distance(a, b))


def gaussian_frechet(mu1: np.ndarray, cov1: np.ndarray, mu2: np.ndarray, cov2: np.ndarray) -> float:
    """||mu1 - mu2||^2 + Tr(C1 + C2 - 2 (C1 C2)^(1/2)) for Gaussians in d dimensions.

    sqrtm of a product of covariances can pick up tiny imaginary parts or fail on singular
    matrices; both are guarded (a small diagonal offset, the real part kept).
    """
    mu1, mu2 = np.atleast_1d(mu1).astype(np.float64), np.atleast_1d(mu2).astype(np.float64)
    cov1, cov2 = np.atleast_2d(cov1).astype(np.float64), np.atleast_2d(cov2).astype(np.float64)
    diff = mu1 - mu2
    with warnings.catch_warnings():
        # a singular product (a constant feature) is expected and handled below
        warnings.simplefilter("ignore", scipy.linalg.LinAlgWarning)
        covmean = scipy.linalg.sqrtm(cov1 @ cov2)
        if not np.isfinite(covmean).all():
            eps = 1e-6 * np.eye(len(mu1))
            covmean = scipy.linalg.sqrtm((cov1 + eps) @ (cov2 + eps))
    if np.iscomplexobj(covmean):
        covmean = covmean.real
    value = diff @ diff + np.trace(cov1) + np.trace(cov2) - 2.0 * np.trace(covmean)
    return float(max(value, 0.0))  # rounding can make a zero distance slightly negative


def frechet_distance(x: np.ndarray, y: np.ndarray) -> float:
    """Frechet distance of the Gaussians fitted to samples x (n, d) and y (m, d).

    NaN when either side has fewer than two rows (no covariance).
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    x = x[np.isfinite(x).all(axis=1)]
    y = y[np.isfinite(y).all(axis=1)]
    if len(x) < 2 or len(y) < 2:
        return float("nan")
    return gaussian_frechet(x.mean(0), np.cov(x, rowvar=False), y.mean(0), np.cov(y, rowvar=False))


def standardiser(sample: EventSample) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) of the event observables of ``sample`` (events with muons), for Frechet.

    The observables have different units (dex, m); every comparison standardises with the
    same reference numbers so that its values stay comparable.
    """
    m = sample.event_matrix()
    if len(m) < 2:
        return np.zeros(len(EVENT_OBSERVABLES)), np.ones(len(EVENT_OBSERVABLES))
    std = m.std(0)
    return m.mean(0), np.where(std > 0, std, 1.0)


def compute_metrics(
    ref: EventSample,
    other: EventSample,
    *,
    scale: tuple[np.ndarray, np.ndarray] | None = None,
    names: tuple[str, ...] = METRICS,
) -> dict[str, float]:
    """Every metric in ``names`` between ``ref`` and ``other``.

    Args:
        scale: (mean, std) standardising the event observables for the Frechet distance
            (default: from ``ref``).
    """
    out: dict[str, float] = {}
    for name in names:
        if name in W1_MUON:
            out[name] = wasserstein_1d(ref.muon[W1_MUON[name]], other.muon[W1_MUON[name]])
        elif name in W1_EVENT:
            out[name] = wasserstein_1d(ref.event[W1_EVENT[name]], other.event[W1_EVENT[name]])
        elif name == FRECHET:
            mean, std = scale if scale is not None else standardiser(ref)
            out[name] = frechet_distance(
                (ref.event_matrix() - mean) / std, (other.event_matrix() - mean) / std
            )
        else:
            raise ValueError(f"unknown metric {name!r}; known: {', '.join(METRICS)}")
    return out


# --------------------------------------------------------------------------- binning


def default_edges(values: np.ndarray, n_bins: int = 4, decimals: int = 2) -> np.ndarray:
    """Edges of about ``n_bins`` equally populated bins of ``values``, rounded for reading.

    Discrete values (depths, masses) can merge quantiles; duplicate edges are dropped. The
    outer edges enclose every value.
    """
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return np.array([0.0, 1.0])
    scale = 10.0**decimals
    inner = np.round(np.quantile(values, np.linspace(0, 1, n_bins + 1)[1:-1]) * scale) / scale
    lo = np.floor(values.min() * scale) / scale
    hi = np.ceil(values.max() * scale) / scale
    edges = np.unique(np.concatenate([[lo], inner, [hi]]))
    if len(edges) < 2:
        edges = np.array([lo, lo + 1.0 / scale])
    return edges


def bin_index(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin of each value (B,) int64: i for edges[i] <= v < edges[i+1] (the last bin also
    holds v == edges[-1]); -1 outside the edges or NaN."""
    values = np.asarray(values, dtype=np.float64)
    edges = np.asarray(edges, dtype=np.float64)
    if edges.ndim != 1 or len(edges) < 2 or np.any(np.diff(edges) <= 0):
        raise ValueError(f"bin edges must be increasing and at least two, got {edges.tolist()}")
    idx = np.searchsorted(edges, values, side="right") - 1
    idx[values == edges[-1]] = len(edges) - 2
    idx[(idx < 0) | (idx >= len(edges) - 1) | ~np.isfinite(values)] = -1
    return idx.astype(np.int64)


def parse_edges(text: str) -> np.ndarray:
    """``"5,6,7,8"`` -> increasing edges; raises ValueError naming the problem."""
    try:
        edges = np.array([float(t) for t in text.split(",") if t.strip()], dtype=np.float64)
    except ValueError:
        raise ValueError(
            f"bin edges {text!r} must be comma-separated numbers, e.g. 5,6,7,8"
        ) from None
    if len(edges) < 2 or np.any(np.diff(edges) <= 0):
        raise ValueError(f"bin edges {text!r} must be at least two increasing numbers")
    return edges
