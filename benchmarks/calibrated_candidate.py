"""A trained generator with its muon energies calibrated after training, on `muongen
evaluate`'s yardstick: does a monotone map fitted on the training data bring the pooled
muon energies to the floor, and what does it do to the binned ones?

    python benchmarks/calibrated_candidate.py --checkpoint run/checkpoints --fit train \
        --data heldA --out ev-cal-heldA [--by mult] [--fit-rows 80000]

The map: the generator draws bundles for the primaries of the first ``--fit-rows`` rows of
the training files (``--fit``), and within each class of muons (``--by``: ``none``, one
class; ``mult``, the bundle's multiplicity bin 1, 2-9, 10-99, 100+, as evaluate bins it;
``mult-energy``, those times the quartiles of the primary's log10 E0; ``off``: no map, the
control) its log10 muon
energies are matched quantile by quantile to the training muons' (2049 levels, the
finest at both ends). On the held-out primaries each muon's log10 energy goes through its
class's map, then is held at or under its primary's E0 / A. The candidate is scored
exactly as `muongen evaluate` scores the model (the same splits, bins, tail rows and W1,
drawn anew in every split); it writes metrics.json and report.md and prints evaluate's
summary. Asserts nothing. Uses the training files only to fit: the held-out files are
scored, never fitted on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from muongen.evaluate import report
from muongen.evaluate.command import DEFAULT_SPLITS, parse_bins
from muongen.evaluate.features import EventSample, shower_groups
from muongen.evaluate.floors import compare
from muongen.evaluate.metrics import MULTIPLICITY_BINS
from muongen.evaluate.sample import generate, read_inputs
from muongen.inference import open_for_inference

#: quantile levels of each class's map: uniform in the logit, so both tails are resolved
LEVELS = 1.0 / (1.0 + np.exp(-np.linspace(-9.0, 9.0, 2049)))
LEVELS = (LEVELS - LEVELS[0]) / (LEVELS[-1] - LEVELS[0])


def muon_classes(counts: np.ndarray, log_e0: np.ndarray, by: str, edges: np.ndarray) -> np.ndarray:
    """Each muon's class (N,) from its event's count and log10 E0 (B,)."""
    mult = np.zeros(len(counts), dtype=np.int64)
    for k, (lo, hi) in enumerate(MULTIPLICITY_BINS.values()):
        mult[(counts >= lo) & ((counts < hi) if hi is not None else True)] = k
    if by == "none":
        cls = np.zeros(len(counts), dtype=np.int64)
    elif by == "mult":
        cls = mult
    else:
        cls = mult * (len(edges) + 1) + np.searchsorted(edges, log_e0)
    return np.repeat(cls, counts)


class EnergyMap:
    """Per-class monotone maps of log10 muon energy, model quantiles -> data quantiles."""

    def __init__(self, by: str, edges: np.ndarray):
        self.by, self.edges = by, edges
        self.tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def fit(self, data: tuple, model: tuple) -> EnergyMap:
        """``data``, ``model``: (conditions (B, 4), muons (N, 3), counts (B,)) physical."""

        def parts(cond, muons, counts):
            le = np.log10(muons[:, 0])
            return le, muon_classes(counts, np.log10(cond[:, 0]), self.by, self.edges)

        d_le, d_cls = parts(*data)
        m_le, m_cls = parts(*model)
        for c in np.union1d(np.unique(d_cls), np.unique(m_cls)):
            d, m = d_le[d_cls == c], m_le[m_cls == c]
            if len(d) < 200 or len(m) < 200:
                continue  # too few to map: left as drawn
            self.tables[int(c)] = (np.quantile(m, LEVELS), np.quantile(d, LEVELS))
        return self

    def apply(self, cond: np.ndarray, muons: np.ndarray, counts: np.ndarray) -> EventSample:
        """The candidate's events with their muon energies mapped."""
        muons = muons.astype(np.float64)
        le = np.log10(muons[:, 0])
        log_e0 = np.log10(cond[:, 0])
        cls = muon_classes(counts, log_e0, self.by, self.edges)
        out = le.copy()
        for c, (mq, dq) in self.tables.items():
            sel = cls == c
            out[sel] = np.interp(np.interp(le[sel], mq, LEVELS), LEVELS, dq)
        ceiling = np.repeat(log_e0 - np.log10(cond[:, 2]), counts)
        if self.tables:
            muons[:, 0] = 10.0 ** np.minimum(out, ceiling)
        return EventSample.from_arrays(cond, muons, counts)


def draw_arrays(generator, conditions: np.ndarray, seed: int) -> tuple:
    batch = generate(generator, torch.as_tensor(conditions, dtype=torch.float32), seed=seed)
    return conditions, batch.muons.numpy(), batch.counts.numpy()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--fit", nargs="+", required=True, help="training files or folders")
    ap.add_argument("--fit-rows", type=int, default=80000)
    ap.add_argument("--data", nargs="+", required=True, help="held-out files or folders")
    ap.add_argument("--out", required=True)
    ap.add_argument("--by", choices=["off", "none", "mult", "mult-energy"], default="mult")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-splits", type=int, default=DEFAULT_SPLITS)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    model = open_for_inference(a.checkpoint, torch.device("cpu"))
    gen = model.generator

    fit_batch = read_inputs(a.fit, a.fit_rows)
    fit_cond = fit_batch.conditions.numpy().astype(np.float64)
    fit_data = (fit_cond, fit_batch.muons.numpy(), fit_batch.counts.numpy())
    edges = np.quantile(np.log10(fit_cond[:, 0]), [0.25, 0.5, 0.75])
    fit_model = draw_arrays(gen, fit_cond, seed=10_000 + a.seed)
    emap = EnergyMap(a.by, edges)
    if a.by != "off":
        emap.fit(fit_data, fit_model)
    print(f"fitted {len(emap.tables)} class maps ({a.by}) on {fit_batch.n_events} training rows")

    real_batch = read_inputs(a.data)
    conditions = real_batch.conditions.numpy().astype(np.float64)
    real = EventSample.from_batch(real_batch).with_groups(shower_groups(conditions))

    def draw(index: np.ndarray, split: int) -> EventSample:
        split_seed = int(np.random.SeedSequence([a.seed, split + 1]).generate_state(1)[0])
        return emap.apply(*draw_arrays(gen, conditions[index], split_seed))

    one = emap.apply(*draw_arrays(gen, conditions, a.seed))
    result = compare(
        real,
        {"model": one},
        bins=parse_bins([], real),
        n_splits=a.n_splits,
        seed=a.seed,
        redraw={"model": draw},
    )
    result["split"]["model_draws"] = "per split"
    result["meta"] = {
        "checkpoint": f"{model.source} + energy map by {a.by}",
        "step": model.meta.get("step"),
        "seed": a.seed,
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    report.write_metrics_json(out / "metrics.json", result)
    report.write_report(out / "report.md", result)
    print(report.console_summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
