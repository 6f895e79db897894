"""The generator's muon energies calibrated after training (``train.calibrate_rows``).

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

The map of each class is stored as a table on a uniform grid of the generator's log energy
and read by linear interpolation (:class:`EnergyCalibration`): gathers and arithmetic only,
so the exported generator (ONNX, TorchScript) carries it as the sampler does. A checkpoint
holds it under ``energy_calibration`` (its final checkpoint only: a run that trains on
starts without one); :func:`muongen.inference.open_for_inference` attaches it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

STATE_VERSION = 1

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
    log_e0: torch.Tensor,
    e0_edges: torch.Tensor,
    depth: torch.Tensor | None = None,
    depth_edges: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each muon's class (N,) int64 from its bundle's size (N,), its primary's log10
    energy (N,, any fixed unit, as ``e0_edges``) and, with ``depth_edges`` (not empty), its
    depth (N,, as ``depth_edges``): comparisons and sums only (exportable)."""
    mult = sum((n_of_muon >= edge).to(torch.int64) for edge in MULT_EDGES)
    energy = (log_e0.unsqueeze(-1) >= e0_edges.to(log_e0.dtype)).to(torch.int64).sum(-1)
    cls = mult * (e0_edges.numel() + 1) + energy
    if depth is None or depth_edges is None or depth_edges.numel() == 0:
        return cls
    band = (depth.unsqueeze(-1) >= depth_edges.to(depth.dtype)).to(torch.int64).sum(-1)
    return cls * (depth_edges.numel() + 1) + band


def n_classes(n_e0_edges: int, n_depth_edges: int = 0) -> int:
    return (len(MULT_EDGES) + 1) * (n_e0_edges + 1) * (n_depth_edges + 1)


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
    d_e0, d_le, d_n = (np.asarray(a) for a in data[:3])
    m_e0, m_le, m_n = (np.asarray(a) for a in model[:3])
    edges = np.quantile(d_e0, np.arange(1, n_energy_bins) / n_energy_bins)
    t_edges = torch.as_tensor(edges, dtype=torch.float64)
    depth_edges = np.zeros(0)
    if n_depth_bins > 1:
        depth_edges = np.quantile(np.asarray(data[3]), np.arange(1, n_depth_bins) / n_depth_bins)
    t_depth = torch.as_tensor(depth_edges, dtype=torch.float64)

    def classes(sample, e0, n):
        e0 = torch.as_tensor(e0, dtype=torch.float64)
        depth = torch.as_tensor(sample[3], dtype=torch.float64) if len(depth_edges) else None
        per_event = muon_classes(torch.as_tensor(n), e0, t_edges, depth, t_depth)
        return np.repeat(per_event.numpy(), n)

    d_cls, m_cls = classes(data, d_e0, d_n), classes(model, m_e0, m_n)
    n_cls = n_classes(len(edges), len(depth_edges))
    x0 = np.zeros(n_cls)
    step = np.ones(n_cls)
    table = np.zeros((n_cls, GRID))
    fitted = np.zeros(n_cls, dtype=bool)
    d_parts, m_parts = _by_class(d_le, d_cls, n_cls), _by_class(m_le, m_cls, n_cls)
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
        "version": STATE_VERSION,
        "e0_edges": t_edges.float(),
        "depth_edges": t_depth.float(),
        "x0": torch.as_tensor(x0, dtype=torch.float32),
        "step": torch.as_tensor(step, dtype=torch.float32),
        "table": torch.as_tensor(table, dtype=torch.float32),
        "fitted": torch.as_tensor(fitted),
        "events": len(d_n),
        "muons": len(d_le),
    }


def _by_class(values: np.ndarray, cls: np.ndarray, n_cls: int) -> list[np.ndarray]:
    """``values`` split by class (one sort, not a mask per class)."""
    order = np.argsort(cls, kind="stable")
    bounds = np.searchsorted(cls[order], np.arange(n_cls + 1))
    ordered = values[order]
    return [ordered[bounds[c] : bounds[c + 1]] for c in range(n_cls)]


class EnergyCalibration(nn.Module):
    """The fitted maps, applied to the generator's log10 muon energies (feature units)."""

    def __init__(self, state: dict[str, Any]) -> None:
        super().__init__()
        version = state.get("version")
        if version != STATE_VERSION:
            raise ValueError(
                f"an energy calibration of version {version}; this muongen reads {STATE_VERSION}"
            )
        table = torch.as_tensor(state["table"], dtype=torch.float32)
        n_cls, grid = table.shape
        edges = torch.as_tensor(state["e0_edges"], dtype=torch.float32).reshape(-1)
        depth_edges = torch.as_tensor(state.get("depth_edges", ()), dtype=torch.float32)
        depth_edges = depth_edges.reshape(-1)
        if n_cls != n_classes(edges.numel(), depth_edges.numel()) or grid < 2:
            raise ValueError(f"an energy calibration table of shape {tuple(table.shape)}")
        self.register_buffer("e0_edges", edges)
        self.register_buffer("depth_edges", depth_edges)
        self.register_buffer("x0", torch.as_tensor(state["x0"], dtype=torch.float32))
        self.register_buffer("step", torch.as_tensor(state["step"], dtype=torch.float32))
        self.register_buffer("table", table.reshape(-1))
        self.register_buffer("fitted", torch.as_tensor(state["fitted"], dtype=torch.bool))
        self.grid = int(grid)
        self.events = int(state.get("events", 0))
        self.muons = int(state.get("muons", 0))

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
        x = (log_e - self.x0.index_select(0, cls).to(log_e.dtype)) / self.step.index_select(
            0, cls
        ).to(log_e.dtype)
        x = x.clamp(0.0, self.grid - 1.0)
        j = x.floor().clamp(max=self.grid - 2.0)
        w = x - j
        at = cls * self.grid + j.to(torch.int64)
        lo = self.table.index_select(0, at).to(log_e.dtype)
        hi = self.table.index_select(0, at + 1).to(log_e.dtype)
        mapped = lo + w * (hi - lo)
        out = torch.where(self.fitted.index_select(0, cls), mapped, log_e)
        return torch.minimum(out, ceiling.to(log_e.dtype))

    def describe(self) -> str:
        return (
            f"{int(self.fitted.sum())} of {self.fitted.numel()} classes mapped, fitted on "
            f"{self.events:,} training rows ({self.muons:,} muons)"
        )
