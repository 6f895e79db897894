"""Statistical floors, bootstrapped uncertainties and ratios: how far is "close enough"?

A distance between two finite samples is never zero, even for the same distribution. The
floor of a metric is its value between two disjoint random halves A and B of the held-out
data. A candidate (the model, the baseline) is generated for the primaries of half B and
compared with half A exactly as B is, so model and floor see the same sample sizes and the
same primaries: a ratio to floor near 1 means the generator is as close to the simulation
as a second simulation of the same size would be.

Uncertainties are bootstrapped: events of A and of B are resampled with replacement (the
same B indices for the floor and every candidate, so ratios are paired) and the metric is
recomputed; the error is the standard deviation over the replicas.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from muongen.evaluate.baseline import baseline_for
from muongen.evaluate.features import EventSample, muon_rows
from muongen.evaluate.metrics import METRICS, bin_index, compute_metrics, standardiser

#: Condition variables the metrics are binned in by default.
BIN_VARIABLES = ("log10_energy", "cos_zenith", "depth")
FLOOR = "floor"


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


def resample_index(
    n_events: int, groups: np.ndarray | None, rng: np.random.Generator
) -> np.ndarray:
    """A bootstrap draw of event indices: events with replacement, or, with ``groups``,
    whole groups with replacement (as many groups as there are)."""
    if groups is None:
        return rng.integers(0, n_events, n_events)
    _, inv = np.unique(groups, return_inverse=True)
    sizes = np.bincount(inv)
    order = np.argsort(inv, kind="stable")  # events grouped, groups in order
    chosen = rng.integers(0, len(sizes), len(sizes))
    return order[muon_rows(sizes, chosen)]


def ratio(value: float, floor: float) -> float:
    """value / floor; NaN when the floor is not positive or either is NaN."""
    if not np.isfinite(floor) or floor <= 0 or not np.isfinite(value):
        return float("nan")
    return float(value / floor)


def _std(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(x.std(ddof=1)) if x.size >= 2 else float("nan")


def bootstrap_metrics(
    ref: EventSample,
    others: dict[str, EventSample],
    *,
    n_boot: int,
    rng: np.random.Generator,
    scale: tuple[np.ndarray, np.ndarray] | None = None,
    names: tuple[str, ...] = METRICS,
) -> dict[str, dict[str, np.ndarray]]:
    """Replicas of every metric between ``ref`` and each of ``others``.

    ``others`` must be aligned event by event (the same primaries): each replica resamples
    their events with one shared index, and ``ref`` with its own.

    Returns:
        {other name: {metric: (n_boot,) replicas}}
    """
    sizes = {o.n_events for o in others.values()}
    if len(sizes) > 1:
        raise ValueError(f"bootstrap needs aligned samples, got sizes {sorted(sizes)}")
    n_other = sizes.pop() if sizes else 0
    # the first sample with groups sets the groups of all (they share their events' showers)
    groups_other = next((o.groups for o in others.values() if o.groups is not None), None)
    reps = {k: {m: np.full(n_boot, np.nan) for m in names} for k in others}
    if ref.n_events == 0 or n_other == 0:
        return reps
    for i in range(n_boot):
        ref_i = ref.take(resample_index(ref.n_events, ref.groups, rng))
        idx = resample_index(n_other, groups_other, rng)
        for key, other in others.items():
            for m, v in compute_metrics(ref_i, other.take(idx), scale=scale, names=names).items():
                reps[key][m][i] = v
    return reps


def _entries(
    values: dict[str, dict[str, float]],
    reps: dict[str, dict[str, np.ndarray]],
    names: tuple[str, ...],
) -> dict[str, dict[str, float]]:
    """Per metric: floor, floor_err, and for each candidate c: c, c_err, c_ratio, c_ratio_err."""
    out: dict[str, dict[str, float]] = {}
    for m in names:
        floor = values[FLOOR][m]
        entry = {"floor": floor, "floor_err": _std(reps[FLOOR][m])}
        for key in values:
            if key == FLOOR:
                continue
            entry[key] = values[key][m]
            entry[f"{key}_err"] = _std(reps[key][m])
            entry[f"{key}_ratio"] = ratio(values[key][m], floor)
            with np.errstate(divide="ignore", invalid="ignore"):
                rr = reps[key][m] / np.where(reps[FLOOR][m] > 0, reps[FLOOR][m], np.nan)
            entry[f"{key}_ratio_err"] = _std(rr)
        out[m] = entry
    return out


def _compare_once(ref, others, *, n_boot, rng, scale, names):
    values = {k: compute_metrics(ref, o, scale=scale, names=names) for k, o in others.items()}
    reps = bootstrap_metrics(ref, others, n_boot=n_boot, rng=rng, scale=scale, names=names)
    return values, reps


def verdict(entry: dict[str, float], ratio_target: float) -> str:
    """ "pass"/"FAIL" (model within ``ratio_target`` x floor) and how it fares against the
    baseline ("beats", "ties" within two combined standard errors, "loses to")."""
    r = entry.get("model_ratio", float("nan"))
    if not np.isfinite(r):
        floor_ok = np.isfinite(entry.get("floor", np.nan)) and entry.get("floor", 0) > 0
        if floor_ok and not np.isfinite(entry.get("model", np.nan)):
            return "FAIL; no model output"
        return "n/a"
    text = "pass" if r <= ratio_target else "FAIL"
    if "baseline" in entry and np.isfinite(entry["baseline"]):
        m, b = entry["model"], entry["baseline"]
        err = np.hypot(
            np.nan_to_num(entry.get("model_err", 0.0)),
            np.nan_to_num(entry.get("baseline_err", 0.0)),
        )
        if m < b - 2 * err:
            text += "; beats baseline"
        elif m > b + 2 * err:
            text += "; loses to baseline"
        else:
            text += "; ties baseline"
    return text


def compare(
    real: EventSample,
    candidates: dict[str, EventSample],
    *,
    baseline: bool = True,
    bins: dict[str, np.ndarray] | None = None,
    n_boot: int = 20,
    n_splits: int = 1,
    min_events: int = 50,
    seed: int = 0,
    ratio_target: float = 3.0,
    names: tuple[str, ...] = METRICS,
) -> dict[str, Any]:
    """Metrics of each candidate against held-out ``real`` events, with floors and ratios.

    Args:
        real: held-out events.
        candidates: name -> events generated for ``real``'s primaries, in the same order
            (e.g. {"model": generated}).
        baseline: add the condition-ignoring baseline as candidate "baseline", drawn from
            the pooled events of half B for half B's primaries (never from the reference A).
        bins: condition variable -> bin edges (see features.CONDITION_VARIABLES); None: none.
        n_boot: bootstrap replicas per split (0: no uncertainties).
        n_splits: random A/B splits the values (and replicas) are averaged over. A distance
            between two samples of one distribution fluctuates by tens of percent, so one
            split gives a noisy floor; averaging splits makes the ratios steadier.
        min_events: a bin whose halves would hold fewer events than this is reported as
            sparse, without metrics.
        seed: seeds the splits, the baseline and the bootstrap.
        ratio_target: the ratio to floor a model must stay within to pass.

    Returns:
        {"split": {...}, "overall": {metric: entry}, "binned": {variable: {"edges", "bins"}},
        "conditional": {variable: {metric: entry}}}; an entry holds floor, floor_err and,
        per candidate c, c, c_err, c_ratio, c_ratio_err, plus a verdict when c is "model".
        A bin row holds lo, hi, n_events, sparse and metrics ({metric: entry} or None).
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
    if n_splits < 1 or n_boot < 0:
        raise ValueError("n_splits must be >= 1 and n_boot >= 0")
    rng = np.random.default_rng(seed)
    scale = standardiser(real)
    kw = {"n_boot": n_boot, "rng": rng, "scale": scale, "names": names}
    bins = {var: np.asarray(e, dtype=np.float64) for var, e in (bins or {}).items()}
    real_bin = {var: bin_index(real.condition(var), e) for var, e in bins.items()}
    n_in_bin = {
        var: np.bincount(b[b >= 0], minlength=len(bins[var]) - 1) for var, b in real_bin.items()
    }
    sparse = {var: n < 2 * max(min_events, 2) for var, n in n_in_bin.items()}

    overall_runs = []
    bin_runs = {var: [[] for _ in range(len(e) - 1)] for var, e in bins.items()}
    for _ in range(n_splits):
        ia, ib = split_halves(real.n_events, rng, real.groups)
        ref = real.take(ia)
        others = {FLOOR: real.take(ib), **{k: c.take(ib) for k, c in candidates.items()}}
        if baseline:
            others["baseline"] = baseline_for(others[FLOOR], others[FLOOR].conditions, rng)
        overall_runs.append(_compare_once(ref, others, **kw))
        for var in bins:
            bin_ref, bin_other = real_bin[var][ia], real_bin[var][ib]
            for k, runs in enumerate(bin_runs[var]):
                if not sparse[var][k]:
                    sub = {key: o.take(bin_other == k) for key, o in others.items()}
                    runs.append(_compare_once(ref.take(bin_ref == k), sub, **kw))

    result: dict[str, Any] = {
        "split": {
            "n_events": real.n_events,
            "n_groups": None if real.groups is None else len(np.unique(real.groups)),
            "n_splits": n_splits,
            "n_boot": n_boot,
            "min_events": min_events,
        },
        "ratio_target": ratio_target,
        "overall": _entries(*_mean_runs(overall_runs), names),
        "binned": {},
        "conditional": {},
    }
    for var, edges in bins.items():
        rows, agg = [], []
        for k, runs in enumerate(bin_runs[var]):
            row: dict[str, Any] = {
                "lo": float(edges[k]),
                "hi": float(edges[k + 1]),
                "n_events": int(n_in_bin[var][k]),
                "sparse": bool(sparse[var][k]),
                "metrics": None,
            }
            if runs:
                values, reps = _mean_runs(runs)
                row["metrics"] = _entries(values, reps, names)
                agg.append((row["n_events"], values, reps))
            rows.append(row)
        result["binned"][var] = {"edges": edges.tolist(), "bins": rows}
        result["conditional"][var] = _aggregate(agg, _keys(overall_runs), names, n_boot)
    for section in [result["overall"], *result["conditional"].values()]:
        for entry in section.values():
            if "model" in entry:
                entry["verdict"] = verdict(entry, ratio_target)
    return result


def _keys(runs) -> list[str]:
    return list(runs[0][0])


def _mean_runs(runs):
    """Average (values, replicas) over splits: values by nanmean, replicas element-wise."""
    values0, reps0 = runs[0]
    values = {k: {m: _nanmean([r[0][k][m] for r in runs]) for m in values0[k]} for k in values0}
    reps = {k: {m: np.mean([r[1][k][m] for r in runs], axis=0) for m in reps0[k]} for k in reps0}
    return values, reps


def _nanmean(x: list[float]) -> float:
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else float("nan")


def _aggregate(agg, keys, names, n_boot) -> dict[str, dict[str, float]]:
    """Event-weighted mean over the populated bins of each metric (and of its replicas),
    i.e. how well the conditional distributions match on average."""
    values = {k: {} for k in keys}
    reps = {k: {} for k in keys}
    for m in names:
        # the bins where the floor is defined, the same for every key so that ratios compare
        # like with like; a candidate without data in one of them (NaN) gets NaN
        use = [(n, vals, rp) for n, vals, rp in agg if np.isfinite(vals[FLOOR][m])]
        w = np.array([n for n, _, _ in use], dtype=np.float64)
        for k in keys:
            v = np.array([vals[k][m] for _, vals, _ in use])
            if w.size == 0 or not np.isfinite(v).all():
                values[k][m], reps[k][m] = float("nan"), np.full(n_boot, np.nan)
                continue
            r = np.array([rp[k][m] for _, _, rp in use]).reshape(len(w), n_boot)
            values[k][m] = float(np.sum(w * v) / w.sum())
            reps[k][m] = np.sum(w[:, None] * r, 0) / w.sum()
    return _entries(values, reps, names)
