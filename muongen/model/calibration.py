"""The generator's muon energies and radii calibrated after training
(``train.calibrate_rows``, ``train.calibrate_radius``).

A GAN trained for half an hour gets the shape of each bundle right before it gets every
muon energy's marginal to the last percent: on muon-rich data its pooled muon energies sat
1.1-1.9x the statistical floor, where the simulation itself scores ~1.0-1.2
(docs/fidelity.md, "The muon energies calibrated after training"). At the end of a run the
trainer draws the finished generator for the primaries of the training files and, within
each class of muons, maps its log10 muon energies quantile by quantile onto the training
muons' (:func:`fit`). A class is the muon's bundle size in ``muongen evaluate``'s bins (1,
2-9, 10-99, 100+) times the quartile of its primary's energy, 16 classes. The map is
monotone, so it keeps every muon's rank within its class: the ordering inside a bundle, the
energy-radius correlation and the bundle's multiplicity are the generator's own; only the
energies' scale within a class moves. After it a muon is held at or under its primary's
energy per nucleon, E0 / A.

The muons' log10 distances to the axis get a map of the same kind (:func:`fit_radius`),
its classes the bundle size times the quartile of cos zenith (a bundle spreads wider the
more inclined it is); each muon moves along its own direction from the axis
(docs/fidelity.md, "The radii calibrated after training").

The map of each class is stored as a table on a uniform grid of the generator's value and
read by linear interpolation (:class:`EnergyCalibration`, :class:`RadiusCalibration`):
gathers and arithmetic only, so the exported generator (ONNX, TorchScript) carries them as
the sampler does. A checkpoint holds them under ``energy_calibration`` and
``radius_calibration`` (its final checkpoint only: a run that trains on starts without
them); :func:`muongen.inference.open_for_inference` attaches them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

STATE_VERSION = 1

#: the radius map's own state version (:class:`RadiusCalibration`)
RADIUS_STATE_VERSION = 1

#: the first muon count of each multiplicity class after the first (1, 2-9, 10-99, 100+),
#: as muongen.evaluate.metrics.MULTIPLICITY_BINS
MULT_EDGES = (2, 10, 100)

#: quantile levels matched: uniform in the logit, so both tails are resolved
_LOGIT = 1.0 / (1.0 + np.exp(-np.linspace(-9.0, 9.0, 2049)))
LEVELS = (_LOGIT - _LOGIT[0]) / (_LOGIT[-1] - _LOGIT[0])

#: points of each class's table (uniform in the generator's log10 energy)
GRID = 4096

#: the fewest muons of a class, in the data and in the generator's draw, to map it (a
#: class with fewer is left as drawn)
MIN_MUONS = 2000


def muon_classes(
    n_of_muon: torch.Tensor,
    first: torch.Tensor,
    first_edges: torch.Tensor,
    second: torch.Tensor | None = None,
    second_edges: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each muon's class (N,) int64 from its bundle's size (N,), a quantity of its event
    (N,; the energy map: the primary's log10 energy) banded at ``first_edges`` and, with
    ``second_edges`` not empty, a second one (N,; the energy map: the depth) banded at
    those: comparisons and sums only (exportable)."""
    mult = sum((n_of_muon >= edge).to(torch.int64) for edge in MULT_EDGES)
    band = (first.unsqueeze(-1) >= first_edges.to(first.dtype)).to(torch.int64).sum(-1)
    cls = mult * (first_edges.numel() + 1) + band
    if second is None or second_edges is None or second_edges.numel() == 0:
        return cls
    band = (second.unsqueeze(-1) >= second_edges.to(second.dtype)).to(torch.int64).sum(-1)
    return cls * (second_edges.numel() + 1) + band


def n_classes(n_first_edges: int, n_second_edges: int = 0) -> int:
    return (len(MULT_EDGES) + 1) * (n_first_edges + 1) * (n_second_edges + 1)


def fit(
    data: tuple[np.ndarray, ...],
    model: tuple[np.ndarray, ...],
    n_energy_bins: int = 4,
    n_depth_bins: int = 1,
) -> dict[str, Any]:
    """The calibration's state from the training data and the generator's draw for the
    same primaries.

    Args:
        data, model: (log10 E0 (B,), log10 muon energy (N,), muons per event (B,)[, depth
            (B,)]), in the generator's feature units (log10(E / 1e6 GeV), depth / 1 km);
            muons event after event. The depth is needed with ``n_depth_bins`` > 1.
        n_energy_bins: primary-energy classes (quantiles of the data's log10 E0).
        n_depth_bins: depth classes (quantiles of the data's depth; 1: none).

    Returns:
        the state :class:`EnergyCalibration` is built from (tensors and numbers).
    """
    d_le, d_n, m_le = np.asarray(data[1]), np.asarray(data[2]), np.asarray(model[1])
    e0_edges = _quantile_edges(data[0], n_energy_bins)
    depth_edges = _quantile_edges(data[3] if n_depth_bins > 1 else (), n_depth_bins)

    def classes(sample):
        depth = sample[3] if depth_edges.numel() else None
        return _classes_of_muons(sample[2], sample[0], e0_edges, depth, depth_edges)

    n_cls = n_classes(e0_edges.numel(), depth_edges.numel())
    return {
        "version": STATE_VERSION,
        "e0_edges": e0_edges.float(),
        "depth_edges": depth_edges.float(),
        **fit_tables(d_le, classes(data), m_le, classes(model), n_cls),
        "events": len(d_n),
        "muons": len(d_le),
    }


def _quantile_edges(values, n_bins: int) -> torch.Tensor:
    """The inner edges (n_bins - 1,) float64 of ``n_bins`` equally filled classes of
    ``values``; empty for ``n_bins`` <= 1."""
    if n_bins <= 1:
        return torch.zeros(0, dtype=torch.float64)
    levels = np.arange(1, n_bins) / n_bins
    return torch.as_tensor(np.quantile(np.asarray(values), levels), dtype=torch.float64)


def _classes_of_muons(counts, first, first_edges, second, second_edges) -> np.ndarray:
    """:func:`muon_classes` from per-event arrays (B,): each muon's class (N,), muons
    event after event."""
    counts = np.asarray(counts)

    def per_event(a):
        return None if a is None else torch.as_tensor(np.asarray(a), dtype=torch.float64)

    cls = muon_classes(
        torch.as_tensor(counts), per_event(first), first_edges, per_event(second), second_edges
    )
    return np.repeat(cls.numpy(), counts)


def fit_tables(
    d_values: np.ndarray, d_cls: np.ndarray, m_values: np.ndarray, m_cls: np.ndarray, n_cls: int
) -> dict[str, torch.Tensor]:
    """Per class, the monotone map of the model's values (N,) onto the data's (quantile
    matching at :data:`LEVELS`), tabulated on :data:`GRID` points uniform in the model's
    value: x0, step (n_cls,), table (n_cls, GRID), fitted (n_cls,) bool (a class with under
    :data:`MIN_MUONS` values on either side is not fitted)."""
    x0 = np.zeros(n_cls)
    step = np.ones(n_cls)
    table = np.zeros((n_cls, GRID))
    fitted = np.zeros(n_cls, dtype=bool)
    d_parts, m_parts = _by_class(d_values, d_cls, n_cls), _by_class(m_values, m_cls, n_cls)
    for c in range(n_cls):
        d, m = d_parts[c], m_parts[c]
        if len(d) < MIN_MUONS or len(m) < MIN_MUONS:
            continue
        mq, dq = np.quantile(m, LEVELS), np.quantile(d, LEVELS)
        grid = np.linspace(mq[0], mq[-1], GRID)
        x0[c], step[c] = mq[0], max((mq[-1] - mq[0]) / (GRID - 1), 1e-12)
        table[c] = np.interp(np.interp(grid, mq, LEVELS), LEVELS, dq)
        fitted[c] = True
    return {
        "x0": torch.as_tensor(x0, dtype=torch.float32),
        "step": torch.as_tensor(step, dtype=torch.float32),
        "table": torch.as_tensor(table, dtype=torch.float32),
        "fitted": torch.as_tensor(fitted),
    }


def lookup(
    values: torch.Tensor,
    cls: torch.Tensor,
    x0: torch.Tensor,
    step: torch.Tensor,
    table: torch.Tensor,
    fitted: torch.Tensor,
    grid: int,
) -> torch.Tensor:
    """``values`` (N,) through their classes' (``cls`` (N,) int64) tables of
    :func:`fit_tables` (``table`` flat, (n_cls * grid,)), linear between grid points and
    held at the table's ends; a class not fitted passes its values as they are. Gathers
    and arithmetic only (exportable)."""
    x = (values - x0.index_select(0, cls).to(values.dtype)) / step.index_select(0, cls).to(
        values.dtype
    )
    x = x.clamp(0.0, grid - 1.0)
    j = x.floor().clamp(max=grid - 2.0)
    w = x - j
    at = cls * grid + j.to(torch.int64)
    lo = table.index_select(0, at).to(values.dtype)
    hi = table.index_select(0, at + 1).to(values.dtype)
    return torch.where(fitted.index_select(0, cls), lo + w * (hi - lo), values)


def _by_class(values: np.ndarray, cls: np.ndarray, n_cls: int) -> list[np.ndarray]:
    """``values`` split by class (one sort, not a mask per class)."""
    order = np.argsort(cls, kind="stable")
    bounds = np.searchsorted(cls[order], np.arange(n_cls + 1))
    ordered = values[order]
    return [ordered[bounds[c] : bounds[c + 1]] for c in range(n_cls)]


class _ClassMaps(nn.Module):
    """The tables of :func:`fit_tables` as buffers, with the class edges of their two
    quantities (``edges``: their names, in the state and as buffers); a state of another
    version or shape is a ValueError naming ``what``."""

    def __init__(
        self, state: dict[str, Any], version: int, what: str, edges: tuple[str, str]
    ) -> None:
        super().__init__()
        if state.get("version") != version:
            raise ValueError(
                f"{what} of version {state.get('version')}; this muongen reads {version}"
            )
        table = torch.as_tensor(state["table"], dtype=torch.float32)
        n_cls, grid = table.shape
        sizes = []
        for name in edges:
            values = torch.as_tensor(state.get(name, ()), dtype=torch.float32).reshape(-1)
            self.register_buffer(name, values)
            sizes.append(values.numel())
        if n_cls != n_classes(*sizes) or grid < 2:
            raise ValueError(f"{what} table of shape {tuple(table.shape)}")
        self.register_buffer("x0", torch.as_tensor(state["x0"], dtype=torch.float32))
        self.register_buffer("step", torch.as_tensor(state["step"], dtype=torch.float32))
        self.register_buffer("table", table.reshape(-1))
        self.register_buffer("fitted", torch.as_tensor(state["fitted"], dtype=torch.bool))
        self.grid = int(grid)
        self.events = int(state.get("events", 0))
        self.muons = int(state.get("muons", 0))

    def mapped(self, values: torch.Tensor, cls: torch.Tensor) -> torch.Tensor:
        return lookup(values, cls, self.x0, self.step, self.table, self.fitted, self.grid)

    def describe(self) -> str:
        return (
            f"{int(self.fitted.sum())} of {self.fitted.numel()} classes mapped, fitted on "
            f"{self.events:,} training rows ({self.muons:,} muons)"
        )


class EnergyCalibration(_ClassMaps):
    """The fitted maps, applied to the generator's log10 muon energies (feature units)."""

    def __init__(self, state: dict[str, Any]) -> None:
        edges = ("e0_edges", "depth_edges")
        super().__init__(state, STATE_VERSION, "an energy calibration", edges)

    def forward(
        self,
        log_e: torch.Tensor,
        n_of_muon: torch.Tensor,
        log_e0: torch.Tensor,
        depth: torch.Tensor,
        ceiling: torch.Tensor,
    ) -> torch.Tensor:
        """Calibrated log energies (N,) from the generator's (N,), each muon's bundle size
        (N,), its primary's log10 E0 (N,), its depth (N,) and its ceiling log10(E0 / A)
        (N,), all in feature units."""
        cls = muon_classes(n_of_muon, log_e0, self.e0_edges, depth, self.depth_edges)
        return torch.minimum(self.mapped(log_e, cls), ceiling.to(log_e.dtype))


def fit_radius(
    data: tuple[np.ndarray, ...],
    model: tuple[np.ndarray, ...],
    n_zenith_bins: int = 4,
    n_energy_bins: int = 1,
) -> dict[str, Any]:
    """The radius map's state from the training data and the generator's draw for the
    same primaries.

    Args:
        data, model: (cos zenith (B,), log10 muon distance to the axis (N,; -inf for a
            muon on the axis, left out), muons per event (B,), log10 E0 (B,)), muons event
            after event, in the generator's feature unit (r / schema.POSITION_SCALE_M: the
            unit the map is applied in).
        n_zenith_bins: zenith classes (quantiles of the data's cos zenith).
        n_energy_bins: primary-energy classes (quantiles of the data's log10 E0; 1: none).

    Returns:
        the state :class:`RadiusCalibration` is built from.
    """
    d_lr, d_n, m_lr = np.asarray(data[1]), np.asarray(data[2]), np.asarray(model[1])
    cz_edges = _quantile_edges(data[0], n_zenith_bins)
    e0_edges = _quantile_edges(data[3] if n_energy_bins > 1 else (), n_energy_bins)

    def classes(sample):
        e0 = sample[3] if e0_edges.numel() else None
        return _classes_of_muons(sample[2], sample[0], cz_edges, e0, e0_edges)

    n_cls = n_classes(cz_edges.numel(), e0_edges.numel())
    d_cls, m_cls = classes(data), classes(model)
    d_on, m_on = np.isfinite(d_lr), np.isfinite(m_lr)  # a muon on the axis stays there
    return {
        "version": RADIUS_STATE_VERSION,
        "cos_zenith_edges": cz_edges.float(),
        "e0_edges": e0_edges.float(),
        **fit_tables(d_lr[d_on], d_cls[d_on], m_lr[m_on], m_cls[m_on], n_cls),
        "events": len(d_n),
        "muons": len(d_lr),
    }


class RadiusCalibration(_ClassMaps):
    """The fitted maps of each muon's log distance to the bundle's axis, by class of
    bundle size x zenith quantile (x primary-energy quantile): :func:`fit_radius`."""

    def __init__(self, state: dict[str, Any]) -> None:
        edges = ("cos_zenith_edges", "e0_edges")
        super().__init__(state, RADIUS_STATE_VERSION, "a radius calibration", edges)

    def forward(
        self, x: torch.Tensor, y: torch.Tensor, n_of_muon: torch.Tensor, cond: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The muons' positions (N,) each, moved along their own direction from the axis
        to the mapped distance, from each muon's bundle size (N,) and its event's condition
        features (N, 4). A muon on the axis stays there."""
        r = torch.sqrt(x * x + y * y)
        log_r = torch.log10(r.clamp_min(1e-30))
        cls = muon_classes(n_of_muon, cond[:, 1], self.cos_zenith_edges, cond[:, 0], self.e0_edges)
        mapped = self.mapped(log_r, cls)
        scale = torch.where(r > 0, torch.pow(10.0, mapped - log_r), torch.ones_like(r))
        return x * scale, y * scale
