"""What a perfect generator scores on `muongen evaluate`'s yardstick, for a held-out file of
`benchmarks/other_physics.py` or of `muongen synth`.

    python benchmarks/other_physics.py --out heldA --files 1 --events-per-file 20000 \
        --seed 101 --e-min 1e4 --e-index 1
    python benchmarks/perfect_candidate.py --data heldA --out ev-perfect-heldA [--seeds 0,1,2]
    muongen synth --out heldC --mix rich --files 1 --events-per-file 20000 --seed 201
    python benchmarks/perfect_candidate.py --physics synth --data heldC --out ev-perfect-heldC

The candidate is the physics itself: for the held-out primaries (as read back from the
file) `other_physics.bundles` (``--physics synth``: `muongen.data.synth.bundles`, any mix:
the mixes differ only in their primaries) draws fresh muons, anew in every half split, exactly where
`muongen evaluate` draws the model (same splits, bins, tail rows and W1). Its ratios are
what no model can beat on that file: a held-out set's own fluctuation in a bin is not in
the floor (two halves of the same set), so a perfect generator's worst binned ratio sits
above 1, and a model's worst should be read against it. Each ``--seeds`` value is one more
draw (evaluate's ``--seed``: splits and draws); it writes metrics.json and report.md (in
``--out``/seed-N with more than one seed) and prints evaluate's summary per seed, then one
line over the seeds. Asserts nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np

from muongen.evaluate import report
from muongen.evaluate.command import DEFAULT_SPLITS, parse_bins
from muongen.evaluate.features import EventSample, shower_groups
from muongen.evaluate.floors import compare
from muongen.evaluate.sample import read_inputs


def _physics(name: str):
    if name == "synth":
        from muongen.data import synth

        return synth
    spec = importlib.util.spec_from_file_location(
        "other_physics", Path(__file__).with_name("other_physics.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def score(real_batch, seed: int, n_splits: int, physics: str = "other") -> dict:
    """evaluate's result dict for the physics' own draws on ``real_batch``'s primaries."""
    module = _physics(physics)
    conditions = real_batch.conditions.numpy().astype(np.float64)
    real = EventSample.from_batch(real_batch).with_groups(shower_groups(conditions))

    def sample(index: np.ndarray, rng: np.random.Generator) -> EventSample:
        batch = module.bundles(conditions[index], rng)
        return EventSample.from_arrays(conditions[index], batch.muons.numpy(), batch.counts.numpy())

    def draw(index: np.ndarray, split: int) -> EventSample:
        return sample(index, np.random.default_rng([seed, split + 1]))

    one = sample(np.arange(real.n_events), np.random.default_rng([seed, 0]))
    result = compare(
        real,
        {"model": one},
        bins=parse_bins([], real),
        n_splits=n_splits,
        seed=seed,
        redraw={"model": draw},
    )
    result["split"]["model_draws"] = "per split"
    result["meta"] = {"checkpoint": f"the physics itself ({module.__name__}.bundles)", "seed": seed}
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", nargs="+", required=True, help="held-out files or folders")
    ap.add_argument("--out", required=True, help="folder for metrics.json and report.md")
    ap.add_argument(
        "--physics",
        choices=["other", "synth"],
        default="other",
        help="which physics wrote --data: benchmarks/other_physics.py (other) or muongen synth",
    )
    ap.add_argument("--seeds", default="0", help="comma-separated evaluate seeds (0)")
    ap.add_argument("--n-splits", type=int, default=DEFAULT_SPLITS)
    ap.add_argument("--events", type=int, default=None, help="first N held-out rows (all)")
    a = ap.parse_args(argv)
    seeds = [int(s) for s in a.seeds.split(",")]
    real_batch = read_inputs(a.data, a.events)
    print(f"{real_batch.n_events} held-out rows, {real_batch.n_muons} muons from {a.data}")
    medians, worsts = [], []
    for seed in seeds:
        result = score(real_batch, seed, a.n_splits, a.physics)
        out = Path(a.out) if len(seeds) == 1 else Path(a.out) / f"seed-{seed}"
        out.mkdir(parents=True, exist_ok=True)
        report.write_metrics_json(out / "metrics.json", result)
        report.write_report(out / "report.md", result)
        print(f"--- seed {seed} ({out})")
        print(report.console_summary(result))
        medians.append(result["summary"]["median_ratio"])
        worsts.append(result["summary"]["worst_ratio"])
    print(
        f"perfect generator over {len(seeds)} seed(s): median {np.mean(medians):.2f} "
        f"({min(medians):.2f}-{max(medians):.2f}), worst {np.mean(worsts):.2f} "
        f"({min(worsts):.2f}-{max(worsts):.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
