"""How well `muongen evaluate` knows its floors, by held-out size and number of splits.

    python benchmarks/bench_floors.py [--mix rich] [--events 20000,100000] [--splits 16]
                                      [--sets 4] [--metrics overall|all]

For each size, ``--sets`` independent held-out sets are drawn from ``muongen synth``'s
physics (whole showers of 100 rows) and the floors of every metric, overall and in the
default condition bins, are computed as `muongen evaluate` does (``--splits`` random half
splits, fine-grid W1). Printed per size: the median relative floor error evaluate reports
(standard error over the splits), the share of floors it knows to 25 % (where it gives a
verdict), the true relative scatter of the floor over the independent sets (what the
reported error should match), and the seconds one set's floors take, over all floors
(overall and binned). ``--metrics overall`` adds a table per overall metric. Prints
figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from muongen.data.synth import generate
from muongen.evaluate.features import EventSample, shower_groups
from muongen.evaluate.floors import FLOOR, FLOOR_REL_ERR_MAX, Yardstick, default_bins, entry


def floors(real: EventSample, n_splits: int, seed: int) -> tuple[dict[str, dict], float]:
    """{where: entry} of every floor (overall and binned) and the seconds they took."""
    t0 = time.perf_counter()
    stick = Yardstick(
        real, bins=default_bins(real), n_splits=n_splits, seed=seed, baseline=False, pool=[]
    )
    out = {m: entry({FLOOR: v}) for m, v in stick.floor["overall"].items()}
    for var, rows in stick.floor["bins"].items():
        for k, row in enumerate(rows):
            for m, v in (row or {}).items():
                out[f"{m} @ {var} bin {k}"] = entry({FLOOR: v})
    return out, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mix", default="rich", choices=["rich", "production"])
    parser.add_argument("--events", default="20000,100000", help="held-out sizes (rows)")
    parser.add_argument("--splits", type=int, default=16)
    parser.add_argument("--sets", type=int, default=4, help="independent held-out sets")
    parser.add_argument("--metrics", default="all", choices=["all", "overall"], help="see above")
    args = parser.parse_args()
    print(f"mix={args.mix} splits={args.splits} sets={args.sets}")
    header = (
        f"{'events':>7} {'showers':>7} {'muons':>8} {'floors':>6} {'reported rel err':>16} "
        f"{'known to 25%':>12} {'true scatter':>12} {'s/set':>6}"
    )
    rows_out = []
    for n in (int(x) for x in args.events.split(",")):
        sets, seconds, n_mu = [], [], 0
        for s in range(args.sets):
            batch, _ = generate(n, np.random.default_rng(7000 + s), mix=args.mix)
            real = EventSample.from_batch(batch)
            real = real.with_groups(shower_groups(real.conditions))
            n_mu += real.n_muons
            f, sec = floors(real, args.splits, seed=s)
            sets.append(f)
            seconds.append(sec)
        where = [w for w in sets[0] if all(w in f for f in sets)]
        rel = np.array([[f[w]["floor_rel_err"] for w in where] for f in sets])  # (sets, W)
        val = np.array([[f[w]["floor"] for w in where] for f in sets])
        with np.errstate(invalid="ignore"):
            scatter = np.nanstd(val, 0, ddof=1) / np.nanmean(val, 0)  # (W,)
        known = np.nanmean(np.where(np.isfinite(rel), rel <= FLOOR_REL_ERR_MAX, False))
        rows_out.append(
            f"{n:>7} {n // 100:>7} {n_mu // args.sets:>8} {len(where):>6} "
            f"{np.nanmedian(rel):>16.2f} {known:>12.0%} {np.nanmedian(scatter):>12.2f} "
            f"{np.mean(seconds):>6.1f}"
        )
        if args.metrics == "overall":
            print(f"\n{n} events, overall floors: reported rel err (mean over sets), true scatter")
            for i, w in enumerate(where):
                if "@" not in w:
                    print(f"  {w:32s} {np.nanmean(rel[:, i]):6.2f} {scatter[i]:6.2f}")
    print()
    print(header)
    print("\n".join(rows_out))


if __name__ == "__main__":
    main()
