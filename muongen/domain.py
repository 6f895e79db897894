"""The training domain: which primaries a model was trained on, carried in its checkpoints.

A model asked for bundles of primaries it never saw extrapolates, and nothing in its output
says so. Every checkpoint therefore records the domain of its training conditions:

- the ranges of log10(E / GeV), cos(zenith) and the vertical depth (m);
- the mass numbers seen (rounded to integers) with their event counts;
- a coarse occupancy of log10 E x cos zenith: event counts in :data:`N_ENERGY` one-decade
  bins from 10^1 to 10^13 GeV times :data:`N_COS` bins of cos zenith from 0 to 1 (values
  beyond the edges count in the end bins).

A domain is a plain dict of JSON values (:func:`empty`, :func:`observe`, :func:`merge`,
:func:`outside`): the trainer folds in every batch's conditions on the host
(:class:`DomainTracker`, a stateful part, so it rides in every checkpoint, across resumes
and from one chain node to the next), and ``sample``, ``sample --flux`` and ``evaluate``
count the primaries outside it (:func:`report`). A primary is outside when one of its
energy, cos zenith, depth or mass lies beyond the trained range (with a small tolerance for
float32 rounding), or when its (log10 E, cos zenith) cell was never trained on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from muongen.errors import MuongenError

VERSION = 1
E_EDGES = tuple(float(e) for e in range(1, 14))  # log10(E / GeV), one decade per bin
COS_EDGES = tuple(i / 6 for i in range(7))  # cos zenith
N_ENERGY, N_COS = len(E_EDGES) - 1, len(COS_EDGES) - 1
MAX_MASS = 300  # mass numbers are counted in 0..MAX_MASS

#: tolerances beyond the recorded ranges (float32 rounding of the stored conditions)
TOLERANCE = {"log10_energy": 1e-3, "cos_zenith": 1e-3, "depth_m": 1.0, "mass": 0.5}
RANGES = ("log10_energy", "cos_zenith", "depth_m")
MODES = ("warn", "strict")


def empty() -> dict[str, Any]:
    """The domain of no events."""
    return {
        "version": VERSION,
        "events": 0,
        "log10_energy": None,
        "cos_zenith": None,
        "depth_m": None,
        "masses": {},
        "energy_edges": list(E_EDGES),
        "cos_edges": list(COS_EDGES),
        "occupancy": [[0] * N_COS for _ in range(N_ENERGY)],
    }


def _columns(conditions) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Physical conditions (B, 4) [E GeV, zenith rad, A, depth m] -> (log10 E, cos z, A, d)."""
    c = np.asarray(conditions, dtype=np.float64).reshape(-1, 4)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_e = np.log10(c[:, 0])
    return log_e, np.cos(c[:, 1]), c[:, 2], c[:, 3]


def _cells(log_e: np.ndarray, cos_z: np.ndarray) -> np.ndarray:
    """Flat occupancy cell (row-major, N_ENERGY x N_COS) of each primary."""
    i = np.clip(np.floor(log_e - E_EDGES[0]), 0, N_ENERGY - 1).astype(np.int64)
    j = np.clip(np.floor(cos_z * N_COS), 0, N_COS - 1).astype(np.int64)
    return i * N_COS + j


def observe(conditions) -> dict[str, Any]:
    """The domain of one batch of physical conditions (B, 4); non-finite rows are left out."""
    log_e, cos_z, mass, depth = _columns(conditions)
    ok = np.isfinite(log_e) & np.isfinite(cos_z) & np.isfinite(mass) & np.isfinite(depth)
    if not ok.all():
        log_e, cos_z, mass, depth = log_e[ok], cos_z[ok], mass[ok], depth[ok]
    d = empty()
    n = len(log_e)
    if n == 0:
        return d
    d["events"] = n
    for key, col in zip(RANGES, (log_e, cos_z, depth)):
        d[key] = [float(col.min()), float(col.max())]
    a = np.bincount(np.clip(np.rint(mass), 0, MAX_MASS).astype(np.int64), minlength=0)
    d["masses"] = {str(k): int(v) for k, v in enumerate(a.tolist()) if v}
    occ = np.bincount(_cells(log_e, cos_z), minlength=N_ENERGY * N_COS)
    d["occupancy"] = occ.reshape(N_ENERGY, N_COS).tolist()
    return d


def merge(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any]:
    """The domain of the union of the events of ``a`` and ``b`` (None: no events)."""
    a, b = a or empty(), b or empty()
    out = empty()
    out["events"] = int(a["events"]) + int(b["events"])
    for key in RANGES:
        r = [x for x in (a.get(key), b.get(key)) if x]
        out[key] = [min(x[0] for x in r), max(x[1] for x in r)] if r else None
    masses: dict[str, int] = {}
    for m in (a.get("masses") or {}, b.get("masses") or {}):
        for k, v in m.items():
            masses[k] = masses.get(k, 0) + int(v)
    out["masses"] = {k: masses[k] for k in sorted(masses, key=int)}
    occ = np.asarray(a["occupancy"], np.int64) + np.asarray(b["occupancy"], np.int64)
    out["occupancy"] = occ.tolist()
    if a.get("partial") or b.get("partial"):
        out["partial"] = True
    return out


def outside(domain: dict[str, Any], conditions) -> dict[str, np.ndarray]:
    """Which primaries (physical conditions (B, 4)) lie outside ``domain``.

    Returns:
        {"any": (B,) bool, and per reason ("energy", "zenith", "depth", "mass", "cell") a
        (B,) bool of the primaries outside for that reason}
    """
    log_e, cos_z, mass, depth = _columns(conditions)
    n = len(log_e)
    if not domain.get("events"):
        every = np.ones(n, bool)
        return {"any": every, "energy": every, "zenith": every, "depth": every,
                "mass": every, "cell": every}  # fmt: skip

    def beyond(key: str, col: np.ndarray) -> np.ndarray:
        lo, hi = domain[key]
        tol = TOLERANCE[key]
        return ~((col >= lo - tol) & (col <= hi + tol))

    why = {
        "energy": beyond("log10_energy", log_e),
        "zenith": beyond("cos_zenith", cos_z),
        "depth": beyond("depth_m", depth),
    }
    seen = [int(k) for k in domain.get("masses") or {}]
    lo_a, hi_a = (min(seen), max(seen)) if seen else (-math.inf, math.inf)
    tol = TOLERANCE["mass"]
    why["mass"] = ~((mass >= lo_a - tol) & (mass <= hi_a + tol))
    # the cell of the primary clipped into the ranges: a point on a range's edge belongs to
    # the trained cell beside it, not to the empty one beyond
    occ = np.asarray(domain["occupancy"], np.int64).reshape(-1)
    e_lo, e_hi = domain["log10_energy"]
    c_lo, c_hi = domain["cos_zenith"]
    cells = _cells(np.clip(log_e, e_lo, e_hi), np.clip(cos_z, c_lo, c_hi))
    why["cell"] = occ[cells] == 0
    why["any"] = why["energy"] | why["zenith"] | why["depth"] | why["mass"] | why["cell"]
    return why


def describe(domain: dict[str, Any]) -> str:
    """``log10 E 5.00-9.00 (E 1e+05-1e+09 GeV), zenith 0.0-60.0 deg, depth 1000-2800 m,
    A 1, 4, 14, 28, 56`` (what the user can compare with their request)."""
    if not domain.get("events"):
        return "no events"
    e, c, d = domain["log10_energy"], domain["cos_zenith"], domain["depth_m"]
    zen = [math.degrees(math.acos(min(max(x, -1.0), 1.0))) for x in (c[1], c[0])]
    masses = ", ".join(domain.get("masses") or {})
    return (
        f"E {10 ** e[0]:.3g}-{10 ** e[1]:.3g} GeV, zenith {zen[0]:.1f}-{zen[1]:.1f} deg, "
        f"depth {d[0]:.0f}-{d[1]:.0f} m, A {masses}"
    )


def occupied_cells(domain: dict[str, Any]) -> int:
    return int(np.count_nonzero(np.asarray(domain["occupancy"])))


class DomainError(MuongenError):
    """``--domain strict`` and primaries outside the training domain."""


def check(
    domain: dict[str, Any] | None,
    conditions,
    mode: str = "warn",
    *,
    weights: np.ndarray | None = None,
    what: str = "primaries",
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Count the primaries outside ``domain`` and say so in one line (``say``, default
    stderr); with ``mode="strict"`` raise :class:`DomainError` instead. Returns the figures
    of :func:`report`."""
    line, info = report(domain, conditions, weights=weights, what=what)
    if line is not None and mode == "strict" and info.get("known"):
        raise DomainError(
            line.removeprefix("warning: ").replace(
                "; --domain strict refuses this", "; use --domain warn to go on anyway"
            )
        )
    if line is not None:
        (say or _stderr)(line)
    return info


def _stderr(line: str) -> None:
    import sys

    print(line, file=sys.stderr)


def report(
    domain: dict[str, Any] | None,
    conditions,
    *,
    weights: np.ndarray | None = None,
    what: str = "primaries",
) -> tuple[str | None, dict[str, Any]]:
    """One line saying how many primaries (and, with ``weights``, what fraction of the
    total weight) lie outside ``domain``, or None when all are inside; and the figures as a
    dict (for flux.json / metrics.json). A ``domain`` of None (a checkpoint older than the
    domain record) gives a line saying so."""
    if domain is None:
        return (
            "note: this checkpoint records no training domain (made before muongen recorded "
            "it); primaries outside what it was trained on cannot be counted",
            {"known": False},
        )
    why = outside(domain, conditions)
    n, k = len(why["any"]), int(why["any"].sum())
    info: dict[str, Any] = {
        "known": True,
        "outside": k,
        "total": n,
        "fraction": k / n if n else 0.0,
        "by_reason": {r: int(why[r].sum()) for r in ("energy", "zenith", "depth", "mass", "cell")},
        "domain": describe(domain),
    }
    if weights is not None:
        w = np.asarray(weights, dtype=np.float64)
        total = float(w.sum())
        info["weight_fraction"] = float(w[why["any"]].sum()) / total if total > 0 else 0.0
    if k == 0:
        return None, info
    reasons = ", ".join(f"{r} {v:,}" for r, v in info["by_reason"].items() if v)
    weight = f", {info['weight_fraction']:.1%} of the total weight" if weights is not None else ""
    partial = (
        " (partly known: resumed from a checkpoint without one)" if domain.get("partial") else ""
    )
    line = (
        f"warning: {k:,} of {n:,} {what} ({k / n:.1%}{weight}) lie outside the checkpoint's "
        f"training domain{partial} ({describe(domain)}; outside by {reasons}): the model "
        "extrapolates there; --domain strict refuses this"
    )
    return line, info


class DomainTracker:
    """The trainer's stateful part: the domain of every batch trained on.

    ``update`` folds a batch's host-side conditions into running arrays (vectorised, no
    device work); ``state_dict`` merges what this process saw (and, under torchrun, what
    every rank saw: ``gather`` is collective) into the domain loaded from the checkpoint
    resumed, so a chain node's domain includes every range before it.
    """

    follows_data = False  # a chain node continuing the previous range keeps its domain

    def __init__(self, gather: Callable[[Any], list[Any]] = lambda obj: [obj]) -> None:
        self.gather = gather
        self.reset()

    def reset(self) -> None:
        self.base: dict[str, Any] | None = None
        self.own = empty()

    def update(self, conditions) -> None:
        """Fold in a batch of physical conditions (B, 4) (a host tensor or array)."""
        if hasattr(conditions, "numpy"):
            conditions = conditions.detach().cpu().numpy()
        self.own = merge(self.own, observe(conditions))

    def mark_partial(self) -> None:
        """The run resumed a checkpoint that recorded no domain: what came before is unknown."""
        self.base = {**(self.base or empty()), "partial": True}

    def state_dict(self) -> dict[str, Any]:
        out = self.base or empty()
        for own in self.gather(self.own):
            out = merge(out, own)
        return out

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self.base, self.own = (dict(state) if state else None), empty()
