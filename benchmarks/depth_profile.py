"""How a checkpoint's muon energies follow the depth, bundle size by bundle size.

    python benchmarks/depth_profile.py --checkpoint RUN/checkpoints --data heldA [--bands 6]

For the held-out rows' primaries, in equal bands of vertical depth and for bundles of
2-9, 10-99 and 100+ muons, prints the mean and the 10% quantile of the muons' log10 E (GeV)
of the simulation ("real"), of the generator given the real muon counts ("real N": its
energy head alone, the rows of each size class the same as the simulation's) and of the
generator drawing its own counts ("own N": the head and the multiplicity together, as
`muongen evaluate` scores it), and how many events each size class holds per band. Where
`evaluate`'s worst bins are the muon energies of one depth band, this says whether the
energy head or the multiplicity moves them, and which way. Asserts nothing.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import numpy as np
import torch

from muongen.evaluate.sample import generate, read_inputs
from muongen.inference import open_for_inference

SIZES = ((2, 9), (10, 99), (100, None))


def profile(depth: np.ndarray, muons: np.ndarray, counts: np.ndarray, edges: np.ndarray) -> dict:
    """{(lo, hi): {"mean", "q10", "events"}}, each a list over the depth bands."""
    counts = np.asarray(counts, dtype=np.int64)
    d, n = np.repeat(depth, counts), np.repeat(counts, counts)
    log_e = np.log10(np.clip(muons[:, 0], 1e-6, None))
    out = {}
    for lo, hi in SIZES:
        top = np.inf if hi is None else hi
        size, rows = (n >= lo) & (n <= top), (counts >= lo) & (counts <= top)
        means, q10s, events = [], [], []
        for a, b in itertools.pairwise(edges):
            sel = log_e[size & (d >= a) & (d < b)]
            means.append(float(sel.mean()) if len(sel) else float("nan"))
            q10s.append(float(np.quantile(sel, 0.1)) if len(sel) else float("nan"))
            events.append(int((rows & (depth >= a) & (depth < b)).sum()))
        out[(lo, hi)] = {"mean": means, "q10": q10s, "events": events}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="checkpoint file or run's checkpoints/")
    ap.add_argument("--data", nargs="+", required=True, help="held-out files or folders")
    ap.add_argument("--bands", type=int, default=6, help="equal depth bands (6)")
    ap.add_argument("--events", type=int, default=None, help="first N held-out rows (all)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    model = open_for_inference(a.checkpoint, torch.device("cpu"))
    real = read_inputs(a.data, a.events)
    depth = real.conditions[:, 3].numpy().astype(np.float64)
    edges = np.linspace(depth.min(), np.nextafter(depth.max(), np.inf), a.bands + 1)
    own = generate(model.generator, real.conditions, seed=a.seed)
    rows = {
        "real": profile(depth, real.muons.numpy(), real.counts.numpy(), edges),
        "real N": profile(
            depth,
            generate(
                model.generator, real.conditions, seed=a.seed, counts=real.counts
            ).muons.numpy(),
            real.counts.numpy(),
            edges,
        ),
        "own N": profile(depth, own.muons.numpy(), own.counts.numpy(), edges),
    }
    bands = " ".join(f"{lo:>6.0f}-{hi:<5.0f}" for lo, hi in itertools.pairwise(edges))
    print(f"{model.source}: {real.n_events} rows of {', '.join(a.data)}; depth bands (m)")
    for lo, hi in SIZES:
        label = f"{lo}+" if hi is None else f"{lo}-{hi}"
        print(f"\n{label} muons {'':14s}{bands}")
        for stat in ("mean", "q10", "events"):
            for name, prof in rows.items():
                if stat == "events" and name == "real N":
                    continue  # the same rows as the simulation's
                values = prof[(lo, hi)][stat]
                cells = " ".join(f"{v:>12d}" if stat == "events" else f"{v:>12.3f}" for v in values)
                print(f"  {stat:6s} {name:7s} {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
