"""Statistical floors, their errors and ratios: how far is "close enough"?

A distance between two finite samples is never zero, even for the same distribution. The
floor of a metric is its value between two disjoint random halves A and B of the held-out
data. A candidate (the model, the baseline) is generated for the primaries of half B and
compared with half A exactly as B is, so model and floor see the same sample sizes and the
same primaries: a ratio to floor near 1 means the generator is as close to the simulation
as a second simulation of the same size would be.

One split's floor scatters by 40-100 % around its mean, whatever the sample size (a
distance between two samples of one distribution shrinks like 1/sqrt(n), and so does its
spread). Every value is therefore the mean over ``n_splits`` random splits (whole showers
to each side), and its error is the standard error of that mean, std / sqrt(n_splits). The
model and the baseline are compared split by split (paired), so their difference is known
better than either. A verdict needs the floor to within ``FLOOR_REL_ERR_MAX``; a model worse
than the baseline never passes.

The tail. The median and worst ratio over all metrics follow the bulk of the held-out
events; the bundles IceCube needs most (the most energetic primaries, the richest bundles)
are a few percent of them. Two tail subsets therefore get every metric again, with floors
of their own, and a summary row each (:data:`TAILS`, :func:`tail_summary`):

- ``top_energy_decade``: the events whose primary energy lies in the top decade present in
  the held-out data: the decade below its highest primary energy, snapped to a whole
  decade when that energy is near one (:func:`top_energy_decade`; 1e7-1e8 GeV for data up
  to 1e8 GeV). Chosen by the primary, so the same primaries in every sample (the model's
  events are generated for them).
- ``rich_bundles``: the bundles of ``TAIL_MIN_MUONS`` (100) or more muons, chosen in each
  sample by its own counts: the reference half's 100+-muon events against the candidate's
  100+-muon events. (Choosing the candidate's events by the real counts of their primaries
  would compare a conditional spread of multiplicities with a cut one: a perfect
  generator would not reach the floor.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from muongen.evaluate.baseline import baseline_for
from muongen.evaluate.features import EventSample
from muongen.evaluate.metrics import (
    METRICS,
    MuonGrid,
    bin_index,
    compute_metrics,
    default_edges,
    standardiser,
)

log = logging.getLogger(__name__)

#: Condition variables the metrics are binned in by default.
BIN_VARIABLES = ("log10_energy", "cos_zenith", "depth")
FLOOR = "floor"
#: No pass/fail verdict where the floor's relative error is larger than this.
FLOOR_REL_ERR_MAX = 0.25
#: The least muons of a bundle in the ``rich_bundles`` tail subset.
TAIL_MIN_MUONS = 100


#: within this many dex of a whole decade's edge, the top decade is that whole decade
DECADE_SNAP = 0.1


def top_energy_decade(real: EventSample) -> tuple[float, float]:
    """(lo, hi): the top decade of primary log10(E0/GeV) present in ``real``: the decade
    below the highest energy, hi = log10 max E0, lo = hi - 1; where hi is within
    :data:`DECADE_SNAP` of a whole number d, the whole decade (d - 1, max(d, hi)) (data up
    to 1e8 GeV: 1e7-1e8; up to 1.1e8: 1e7-1.1e8; up to 1.5e8: 1.5e7-1.5e8, where the whole
    decade 1e8-1e9 would hold a sliver of the events). Its events: lo <= log10 E0 <= hi."""
    log_e = real.condition("log10_energy")
    if not log_e.size:
        return -1.0, 0.0
    hi = float(np.max(log_e))
    d = round(hi)
    if abs(hi - d) <= DECADE_SNAP:
        return float(d - 1), max(float(d), hi)
    return hi - 1.0, hi


def _energy_label(log10_e: float) -> str:
    """10^x GeV in short words: 7 -> 1e7, 7.18 -> 1.5e7."""
    exp = int(np.floor(log10_e + 1e-9))
    mant = round(10.0 ** (log10_e - exp), 1)
    if mant >= 10.0:
        exp, mant = exp + 1, 1.0
    return f"{mant:g}e{exp}"


def _decade_label(lo: float, hi: float) -> str:
    return f"{_energy_label(lo)}-{_energy_label(hi)} GeV"


def tail_selectors(real: EventSample) -> dict[str, tuple[str, Callable[[EventSample], np.ndarray]]]:
    """The tail subsets (module docstring): name -> (its range in words, ``select(sample)``
    giving a bool mask (B,) of a sample's events in the subset). The decade comes from
    ``real`` (the whole held-out set), so every split and candidate uses the same one."""
    lo, hi = top_energy_decade(real)

    def in_decade(sample: EventSample) -> np.ndarray:
        log_e = sample.condition("log10_energy")
        return (log_e >= lo - 1e-9) & (log_e <= hi + 1e-9)

    def rich(sample: EventSample) -> np.ndarray:
        return sample.counts >= TAIL_MIN_MUONS

    return {
        "top_energy_decade": (_decade_label(lo, hi), in_decade),
        "rich_bundles": (f"{TAIL_MIN_MUONS}+ muons", rich),
    }


def default_bins(real: EventSample, n_bins: int = 4) -> dict[str, np.ndarray]:
    """``n_bins`` equally populated bins of each of BIN_VARIABLES, edges from ``real``."""
    return {var: default_edges(real.condition(var), n_bins) for var in BIN_VARIABLES}


def split_halves(
    n_events: int, rng: np.random.Generator, groups: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Two disjoint random halves of range(n_events), each sorted.

    Without ``groups`` the halves are equal in size (one event is left out when n_events is
    odd). With ``groups`` (B,) whole groups (showers) are split, half of them to each side
    (one group left out when their number is odd).
    """
    if groups is None:
        perm = rng.permutation(n_events)
        half = n_events // 2
        return np.sort(perm[:half]), np.sort(perm[half : 2 * half])
    unique = np.unique(groups)
    perm = rng.permutation(len(unique))
    half = len(unique) // 2
    in_a = np.isin(groups, unique[perm[:half]])
    in_b = np.isin(groups, unique[perm[half : 2 * half]])
    return np.flatnonzero(in_a), np.flatnonzero(in_b)


def ratio(value: float, floor: float) -> float:
    """value / floor; NaN when the floor is not positive or either is NaN."""
    if not np.isfinite(floor) or floor <= 0 or not np.isfinite(value):
        return float("nan")
    return float(value / floor)


def mean_and_error(x: np.ndarray) -> tuple[float, float]:
    """Mean of the finite values of ``x`` (n_splits,) and its standard error (NaN for < 2)."""
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return float("nan"), float("nan")
    err = float(x.std(ddof=1) / np.sqrt(x.size)) if x.size >= 2 else float("nan")
    return float(x.mean()), err


def entry(per_split: dict[str, np.ndarray]) -> dict[str, float]:
    """One metric's summary from its values per split, {FLOOR or candidate: (K,)}.

    Returns floor, floor_err, floor_rel_err (NaN unless the floor exists in every split)
    and, per candidate c: c, c_err, c_ratio
    (mean c / mean floor), c_ratio_err; with a model and a baseline also
    model_minus_baseline and its (paired) error. A candidate with no value in a split whose
    floor exists (no output there) is NaN.
    """
    f = np.asarray(per_split[FLOOR], dtype=np.float64)
    floor, floor_err = mean_and_error(f)
    has_floor = np.isfinite(f)
    # a floor missing in some splits rests on a handful of muons: its error is not known
    known = floor > 0 and has_floor.all()
    out = {
        "floor": floor,
        "floor_err": floor_err,
        "floor_rel_err": floor_err / floor if known else float("nan"),
    }
    for key, v in per_split.items():
        if key == FLOOR:
            continue
        v = np.asarray(v, dtype=np.float64)
        if has_floor.any() and not np.isfinite(v[has_floor]).all():
            v = np.full_like(v, np.nan)  # no output where the data has some
        value, err = mean_and_error(v)
        r = ratio(value, floor)
        out[key], out[f"{key}_err"], out[f"{key}_ratio"] = value, err, r
        # delta method over the paired splits: var(r) = r^2 var(v/mean v - f/mean f) / K
        both = np.isfinite(v) & has_floor
        r_err = float("nan")
        if np.isfinite(r) and both.sum() >= 2 and value > 0:
            z = v[both] / value - f[both] / floor
            r_err = float(r * z.std(ddof=1) / np.sqrt(both.sum()))
        out[f"{key}_ratio_err"] = r_err
    if "model" in per_split and "baseline" in per_split:
        diff = np.asarray(per_split["model"]) - np.asarray(per_split["baseline"])
        d, d_err = mean_and_error(diff)
        if not np.isfinite(out["model"]):
            d = float("nan")
        out["model_minus_baseline"], out["model_minus_baseline_err"] = d, d_err
    return out


def baseline_below_floor(e: dict[str, float]) -> bool:
    """Whether the baseline is closer to half A than half B is, by more than two standard
    errors of its ratio (paired over the splits).

    Then a second sample of the simulation itself (the floor, ratio 1) would lose to the
    baseline. It happens in pooled per-muon metrics that a few big bundles dominate: real
    muons come in bundles, so two halves differ by whole bundles, while the baseline draws
    each muon on its own from the pool, a smoother sample of the same marginal.
    """
    r, err = e.get("baseline_ratio", float("nan")), e.get("baseline_ratio_err", float("nan"))
    return bool(np.isfinite(r) and np.isfinite(err) and r + 2 * err < 1.0)


def against_baseline(e: dict[str, float]) -> str:
    """How the model fares against the baseline, from their paired difference: "beats"
    (better by more than two standard errors), "ties" (better or equal, within them),
    "worse than (within errors)", "loses to" (worse by more than two standard errors).
    A model worse than a baseline that is below the floor (:func:`baseline_below_floor`)
    gets " (baseline below floor)" added: the simulation itself would be worse too."""
    d = e.get("model_minus_baseline", float("nan"))
    if not np.isfinite(d):
        return ""
    err = e.get("model_minus_baseline_err", float("nan"))
    err = err if np.isfinite(err) else 0.0
    if d < -2 * err:
        return "beats baseline"
    if d <= 0:
        return "ties baseline"
    below = " (baseline below floor)" if baseline_below_floor(e) else ""
    if d <= 2 * err:
        return f"worse than baseline (within errors){below}"
    return f"loses to baseline{below}"


def floor_certain(e: dict[str, float], rel_err_max: float = FLOOR_REL_ERR_MAX) -> bool:
    """Whether an entry's floor is known to ``rel_err_max`` (relative standard error)."""
    return bool(_number(e.get("floor_rel_err")) <= rel_err_max)


def _number(value: Any) -> float:
    """A float, NaN for None (metrics.json writes NaN as null) or a non-finite value."""
    return float(value) if value is not None and np.isfinite(value) else float("nan")


def verdict(
    e: dict[str, float], ratio_target: float, rel_err_max: float = FLOOR_REL_ERR_MAX
) -> str:
    """The verdict on one metric entry of the model.

    "n/a" without a floor (no data); "floor uncertain" where the floor's relative error is
    above ``rel_err_max`` (or unknown: a single split); "FAIL; no model output" where the
    data has muons and the model none; otherwise "FAIL" when the ratio is above
    ``ratio_target`` or the model is worse than the baseline by more than two standard
    errors, "no pass" when it is worse than the baseline within errors, or by more where
    the baseline is below the floor (:func:`baseline_below_floor`: there the simulation
    itself loses to it, as the comparison then says; scored six times on the rich mix,
    benchmarks/perfect_candidate.py, it drew 56 of its 69 FAILs there), else "pass": a
    model worse than the baseline never passes. The baseline comparison follows after "; ".
    """
    floor = e.get("floor", float("nan"))
    if not (np.isfinite(floor) and floor > 0):
        return "n/a"
    certain = floor_certain(e, rel_err_max)
    if not np.isfinite(e.get("model", float("nan"))):
        return "FAIL; no model output" if certain else "floor uncertain; no model output"
    base = against_baseline(e)
    if not certain:
        head = "floor uncertain"
    elif e["model_ratio"] > ratio_target or (
        base.startswith("loses") and not baseline_below_floor(e)
    ):
        head = "FAIL"
    elif base.startswith(("worse", "loses")):
        head = "no pass"
    else:
        head = "pass"
    return f"{head}; {base}" if base else head


class Yardstick:
    """Held-out events split ``n_splits`` times into halves, with the floor of every metric,
    overall and in condition bins, computed once; candidates are then measured against it.

    Args:
        real: held-out events (with shower groups, whole showers go to one side).
        bins: condition variable -> bin edges (see features.CONDITION_VARIABLES).
        n_splits: random half splits everything is averaged over.
        min_events: a bin whose halves would hold fewer events than this is sparse (no
            metrics); in a split whose reference half gives a metric fewer events to rest
            on (events with muons, or of its bundle-size bin: metrics.support), that metric
            is not measured, for the floor and the candidates alike.
        seed: seeds the splits and the baseline.
        baseline: measure the condition-ignoring baseline too (drawn, in each split, from
            the pooled events of half B for half B's primaries; never from the reference A).
        pool: samples whose muons join the held-out ones in the fine W1 grid (the
            candidates, so that their outliers are binned too); None: exact W1 (slower).
        names: the metrics.
    """

    def __init__(
        self,
        real: EventSample,
        *,
        bins: dict[str, np.ndarray] | None = None,
        n_splits: int = 16,
        min_events: int = 50,
        seed: int = 0,
        baseline: bool = True,
        pool: list[EventSample] | None = None,
        names: tuple[str, ...] = METRICS,
    ) -> None:
        if n_splits < 1:
            raise ValueError("n_splits must be >= 1")
        self.names = names
        self.n_splits = n_splits
        self.min_events = min_events
        self.grid = None if pool is None else MuonGrid.from_samples([real, *pool])
        self.real = real if self.grid is None else self.grid.digitise(real)
        self.scale = standardiser(real)
        self.bins = {var: np.asarray(e, dtype=np.float64) for var, e in (bins or {}).items()}
        self.real_bin = {var: bin_index(real.condition(var), e) for var, e in self.bins.items()}
        self.n_in_bin = {
            var: np.bincount(b[b >= 0], minlength=len(self.bins[var]) - 1)
            for var, b in self.real_bin.items()
        }
        self.sparse = {var: n < 2 * max(min_events, 2) for var, n in self.n_in_bin.items()}
        # the tail subsets (module docstring): range, selector, held-out events in them
        self.tails = {
            name: (label, select, int(select(real).sum()))
            for name, (label, select) in tail_selectors(real).items()
        }
        rng = np.random.default_rng(seed)
        self.splits = [split_halves(real.n_events, rng, real.groups) for _ in range(n_splits)]
        self.refs = [self.real.take(ia) for ia, _ in self.splits]
        self.floor = self.measure(self.real, name="the floor (held-out against held-out)")
        self.baseline = None
        if baseline:
            name = "the condition-ignoring baseline"
            started = self._started(name)
            drawn = []
            for _, ib in self.splits:
                half = real.take(ib)
                drawn.append(self._digitised(baseline_for(half, half.conditions, rng)))
            self.baseline = self._measure_halves(drawn, name, started)

    def _digitised(self, sample: EventSample) -> EventSample:
        return sample if self.grid is None else self.grid.digitise(sample)

    def measure(self, candidate: EventSample, name: str = "a candidate") -> dict[str, Any]:
        """Per-split values of every metric for ``candidate``, events aligned with the
        held-out ones (generated for their primaries, in their order); ``name`` is for the
        progress lines."""
        if candidate.n_events != self.real.n_events or not np.array_equal(
            candidate.conditions, self.real.conditions
        ):
            raise ValueError("the candidate is not aligned with the real events (same primaries)")
        started = self._started(name)
        candidate = self._digitised(candidate) if candidate is not self.real else candidate
        return self._measure_halves([candidate.take(ib) for _, ib in self.splits], name, started)

    def measure_draws(
        self, draw: Callable[[np.ndarray, int], EventSample], name: str = "the model"
    ) -> dict[str, Any]:
        """Per-split values of every metric for a candidate drawn anew in each split:
        ``draw(index, s)`` returns events generated for the primaries of the held-out
        events at ``index`` (half B of split ``s``), in that order, with noise of their own.

        A candidate drawn once (:meth:`measure`) brings one draw's noise to every split:
        the splits' spread, and so the error, leaves it out, and the mean carries it whole.
        Drawn in each split, the generator's noise averages down with the splits' and the
        error covers it (the floor's halves and the baseline's draws differ from split to
        split in the same way). Muons are binned on the grid made at construction (from
        ``pool``: pass one draw of the candidate there). ``name`` is for the progress lines."""
        halves = []
        started = self._started(f"{name}, drawn anew in each split")
        for s, (_, ib) in enumerate(self.splits):
            half = draw(ib, s)
            if half.n_events != len(ib) or not np.array_equal(
                half.conditions, self.real.conditions[ib]
            ):
                raise ValueError(f"draw {s} is not aligned with its held-out half (same primaries)")
            halves.append(self._digitised(half))
        return self._measure_halves(halves, name, started)

    def _started(self, name: str) -> float:
        """Log that ``name`` is being measured (long on big held-out sets); the time."""
        log.info(
            "measuring %s: %d metrics overall and in %d bins, %d splits",
            name,
            len(self.names),
            sum(len(e) - 1 for e in self.bins.values()),
            len(self.splits),
        )
        return time.perf_counter()

    def _measure_halves(
        self, halves: list[EventSample], name: str, started: float
    ) -> dict[str, Any]:
        """{"overall": {metric: (K,)}, "bins": {var: [None or {metric: (K,)}] per bin}};
        logs how long measuring ``name`` took since ``started`` (:meth:`_started`)."""
        k_splits = len(self.splits)
        overall = {m: np.full(k_splits, np.nan) for m in self.names}
        per_bin = {
            var: [
                None if self.sparse[var][k] else {m: np.full(k_splits, np.nan) for m in self.names}
                for k in range(len(e) - 1)
            ]
            for var, e in self.bins.items()
        }
        tails = {
            name: None
            if self._tail_sparse(name)
            else {m: np.full(k_splits, np.nan) for m in self.names}
            for name in self.tails
        }
        kw = {
            "scale": self.scale,
            "names": self.names,
            "grid": self.grid,
            "min_support": self.min_events,
        }
        for s, ((ia, ib), ref, half) in enumerate(zip(self.splits, self.refs, halves)):
            for m, v in compute_metrics(ref, half, **kw).items():
                overall[m][s] = v
            for var, rows in per_bin.items():
                bin_ref, bin_half = self.real_bin[var][ia], self.real_bin[var][ib]
                for k, row in enumerate(rows):
                    if row is not None:
                        values = compute_metrics(
                            ref.take(bin_ref == k), half.take(bin_half == k), **kw
                        )
                        for m, v in values.items():
                            row[m][s] = v
            for tail, row in tails.items():
                if row is not None:  # each side's own events of the subset
                    select = self.tails[tail][1]
                    values = compute_metrics(ref.take(select(ref)), half.take(select(half)), **kw)
                    for m, v in values.items():
                        row[m][s] = v
        log.info("measured %s in %.0f s", name, time.perf_counter() - started)
        return {"overall": overall, "bins": per_bin, "tails": tails}

    def _tail_sparse(self, name: str) -> bool:
        """Whether a tail subset holds too few held-out events for its halves (as a bin)."""
        return self.tails[name][2] < 2 * max(self.min_events, 2)

    def result(
        self, candidates: dict[str, dict[str, Any]], ratio_target: float = 3.0
    ) -> dict[str, Any]:
        """The comparison of measured candidates ({name: measure(...)}) in the layout
        :func:`compare` documents, with verdicts and the ratio summary."""
        values = {FLOOR: self.floor, **candidates}
        if self.baseline is not None:
            values["baseline"] = self.baseline
        keys = list(values)

        def section(get) -> dict[str, dict[str, float]]:
            return {m: entry({k: get(values[k])[m] for k in keys}) for m in self.names}

        result: dict[str, Any] = {
            "split": {
                "n_events": self.real.n_events,
                "n_groups": None if self.real.groups is None else len(np.unique(self.real.groups)),
                "n_splits": self.n_splits,
                "min_events": self.min_events,
                "floor_rel_err_max": FLOOR_REL_ERR_MAX,
                "w1": "exact" if self.grid is None else "fine grid",
            },
            "ratio_target": ratio_target,
            "overall": section(lambda v: v["overall"]),
            "binned": {},
            "conditional": {},
        }
        for var, edges in self.bins.items():
            rows = []
            for k in range(len(edges) - 1):
                row = {
                    "lo": float(edges[k]),
                    "hi": float(edges[k + 1]),
                    "n_events": int(self.n_in_bin[var][k]),
                    "sparse": bool(self.sparse[var][k]),
                    "metrics": None,
                }
                if not row["sparse"]:
                    row["metrics"] = section(lambda v, var=var, k=k: v["bins"][var][k])
                rows.append(row)
            result["binned"][var] = {"edges": edges.tolist(), "bins": rows}
            result["conditional"][var] = section(lambda v, var=var: self._weighted(v, var))
        result["tail"] = {}
        for name, (label, _, n_events) in self.tails.items():
            sparse = self._tail_sparse(name)
            result["tail"][name] = {
                "range": label,
                "n_events": n_events,
                "sparse": sparse,
                "metrics": None if sparse else section(lambda v, name=name: v["tails"][name]),
            }
        for e in _entries(result):
            if "model" in e:
                e["verdict"] = verdict(e, ratio_target)
        result["summary"] = ratio_summary(result)
        result["summary"]["tail"] = tail_summary(result)
        return result

    def _weighted(self, values: dict[str, Any], var: str) -> dict[str, np.ndarray]:
        """Event-weighted mean over the populated bins of ``var``, split by split: how well
        the conditional distributions match on average. A bin enters a split's mean where
        the floor is defined there (the same bins for every candidate); a candidate without
        a value in one of them gets NaN."""
        out = {}
        rows = values["bins"][var]
        floor_rows = self.floor["bins"][var]
        for m in self.names:
            acc = np.full(self.n_splits, np.nan)
            for s in range(self.n_splits):
                use = [
                    k
                    for k, row in enumerate(floor_rows)
                    if row is not None and np.isfinite(row[m][s])
                ]
                if use:
                    w = self.n_in_bin[var][use].astype(np.float64)
                    v = np.array([rows[k][m][s] for k in use])
                    acc[s] = float(w @ v / w.sum()) if np.isfinite(v).all() else np.nan
            out[m] = acc
        return out


def _entries(result: dict[str, Any]):
    """Every metric entry of a result: overall, per bin, conditional, in the tail subsets."""
    yield from result["overall"].values()
    for info in result["binned"].values():
        for row in info["bins"]:
            yield from (row["metrics"] or {}).values()
    for section in result["conditional"].values():
        yield from section.values()
    for row in result.get("tail", {}).values():
        yield from (row["metrics"] or {}).values()


def tail_summary(result: dict[str, Any], key: str = "model") -> dict[str, dict[str, Any]]:
    """Per tail subset (``result["tail"]``): ``median_ratio``, ``worst_ratio`` and ``worst``
    (the metric) of candidate ``key`` over the subset's metrics, counted as
    :func:`ratio_summary` counts them (no output where the data has muons: infinite), with
    ``n_events`` (held-out events in the subset), ``range`` (in words) and ``n_metrics``.
    A subset too small to measure (or without a floor anywhere) has NaN ratios and no
    ``worst``. The tail rows are not in the overall median and worst: their events are
    there already."""
    out = {}
    for name, row in result.get("tail", {}).items():
        sub = {"split": result["split"], "overall": row["metrics"] or {}, "binned": {}}
        s = ratio_summary(sub, key=key)
        out[name] = {
            "median_ratio": s["median_ratio"],
            "worst_ratio": s["worst_ratio"],
            "worst": s["worst"],
            "n_events": row["n_events"],
            "range": row["range"],
            "n_metrics": s["n_metrics"],
            "worst_no_output": s["worst_no_output"],
        }
    return out


def scored_entries(result: dict[str, Any]) -> list[tuple[str, dict[str, float]]]:
    """(where, entry) of every overall and per-bin metric entry with a floor: what the median
    and worst ratio run over (the conditional means are summaries of the bins, not extra
    measurements)."""
    out = [(m, e) for m, e in result.get("overall", {}).items()]
    for var, info in result.get("binned", {}).items():
        for row in info["bins"]:
            for m, e in (row["metrics"] or {}).items():
                out.append((f"{m} @ {var} [{row['lo']:g}, {row['hi']:g})", e))
    return [(w, e) for w, e in out if _number(e.get("floor")) > 0]


def ratio_summary(result: dict[str, Any], key: str = "model") -> dict[str, Any]:
    """Median and worst ratio of candidate ``key`` over all overall and binned metrics.

    A metric where the data has muons and the candidate none counts as an infinite ratio
    when its floor is known, and is left out otherwise (no ratio can be given). The same
    figures over the metrics whose floor is known to FLOOR_REL_ERR_MAX ("certain"), and how
    many metrics got each verdict, follow.
    """
    rel_max = result["split"].get("floor_rel_err_max", FLOOR_REL_ERR_MAX)
    scored = []
    for where, e in scored_entries(result):
        r, certain = e.get(f"{key}_ratio", np.nan), floor_certain(e, rel_max)
        if np.isfinite(r) or certain:
            scored.append((float(r) if np.isfinite(r) else np.inf, where, certain))

    def stats(items) -> tuple[float, float, str | None]:
        if not items:
            return float("nan"), float("nan"), None
        worst = max(items, key=lambda t: t[0])
        return float(np.median([r for r, _, _ in items])), worst[0], worst[1]

    median, worst, where = stats(scored)
    median_c, worst_c, where_c = stats([t for t in scored if t[2]])
    out: dict[str, Any] = {
        "n_metrics": len(scored),
        "median_ratio": median,
        "worst_ratio": worst,
        "worst": where,
        "worst_no_output": bool(np.isinf(worst)),  # JSON writes the infinite ratio as null
        "n_floor_certain": sum(1 for t in scored if t[2]),
        "median_ratio_certain": median_c,
        "worst_ratio_certain": worst_c,
        "worst_certain": where_c,
    }
    if key == "model":
        heads = [e.get("verdict", "").split(";")[0] for _, e in scored_entries(result)]
        for head in ("pass", "no pass", "FAIL", "floor uncertain"):
            out[f"n_{head.replace(' ', '_')}"] = heads.count(head)
    return out


def compare(
    real: EventSample,
    candidates: dict[str, EventSample],
    *,
    baseline: bool = True,
    bins: dict[str, np.ndarray] | None = None,
    n_splits: int = 16,
    min_events: int = 50,
    seed: int = 0,
    ratio_target: float = 3.0,
    names: tuple[str, ...] = METRICS,
    fast: bool = True,
    redraw: dict[str, Callable[[np.ndarray, int], EventSample]] | None = None,
) -> dict[str, Any]:
    """Metrics of each candidate against held-out ``real`` events, with floors and ratios.

    Args:
        real: held-out events.
        candidates: name -> events generated for ``real``'s primaries, in the same order
            (e.g. {"model": generated}).
        redraw: name (of a candidate) -> ``draw(index, s)``, events generated anew for the
            primaries ``real.take(index)`` (half B of split ``s``): that candidate is then
            measured on a fresh draw in every split (:meth:`Yardstick.measure_draws`), and
            its entry in ``candidates`` only joins the W1 grid.
        baseline: add the condition-ignoring baseline as candidate "baseline".
        bins: condition variable -> bin edges (see features.CONDITION_VARIABLES); None: none.
        n_splits: random A/B splits every value is the mean of (errors need >= 2).
        min_events: a bin whose halves would hold fewer events than this is sparse; a
            metric with fewer events to rest on in a split's reference half is left out of
            that split (see :class:`Yardstick`).
        seed: seeds the splits and the baseline.
        ratio_target: the ratio to floor a model must stay within to pass.
        fast: per-muon W1 on a fine grid (MuonGrid) instead of exact sorts.

    Returns:
        {"split": {...}, "ratio_target", "overall": {metric: entry}, "binned": {variable:
        {"edges", "bins"}}, "conditional": {variable: {metric: entry}}, "tail", "summary"};
        an entry is :func:`entry`'s, plus a verdict (:func:`verdict`) where there is a
        model. A bin row holds lo, hi, n_events, sparse and metrics ({metric: entry} or
        None). "tail": {subset: {"range", "n_events", "sparse", "metrics"}} for the tail
        subsets (module docstring). "summary" is :func:`ratio_summary`'s, with "tail"
        ({subset: row}, :func:`tail_summary`).
    """
    for key, c in candidates.items():
        if c.n_events != real.n_events or not np.array_equal(c.conditions, real.conditions):
            raise ValueError(
                f"candidate {key!r} is not aligned with the real events (same primaries, order)"
            )
    if FLOOR in candidates or (baseline and "baseline" in candidates):
        raise ValueError(
            f"a candidate cannot be named {FLOOR!r} (or 'baseline' with baseline=True)"
        )
    stick = Yardstick(
        real,
        bins=bins,
        n_splits=n_splits,
        min_events=min_events,
        seed=seed,
        baseline=baseline,
        pool=list(candidates.values()) if fast else None,
        names=names,
    )
    redraw = redraw or {}
    unknown = set(redraw) - set(candidates)
    if unknown:
        raise ValueError(f"redraw names no candidate: {sorted(unknown)}")
    measured = {
        k: stick.measure_draws(redraw[k], name=f"the {k}")
        if k in redraw
        else stick.measure(c, name=f"the {k}")
        for k, c in candidates.items()
    }
    return stick.result(measured, ratio_target)
