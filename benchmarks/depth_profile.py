"""How a checkpoint's muon energies follow the depth, bundle size by bundle size.

    python benchmarks/depth_profile.py --checkpoint RUN/checkpoints --data heldA [--by-energy]

For the held-out rows' primaries, in equal bands of vertical depth and for bundles of
2-9, 10-99 and 100+ muons, prints the mean and the 10% quantile of the muons' log10 E (GeV)
of the simulation ("real"), of the generator given the real muon counts ("real N": its
energy head alone, the rows of each size class the same as the simulation's) and of the
generator drawing its own counts ("own N": the head and the multiplicity together, as
`muongen evaluate` scores it), and how many events each size class holds per band. Where
`evaluate`'s worst bins are the muon energies of one depth band, this says whether the
energy head or the multiplicity moves them, and which way. ``--by-energy`` adds, per size
class, the "real N" mean minus the simulation's in each decade of primary energy and depth
band (with the muons it rests on): whether a band's miss holds at fixed primary energy or
comes from the primaries that a size class selects there. Asserts nothing.
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


def _label(lo: int, hi: int | None) -> str:
    """A size class's name: 2-9, 100+."""
    return f"{lo}+" if hi is None else f"{lo}-{hi}"


def _in_size(n: np.ndarray, lo: int, hi: int | None) -> np.ndarray:
    """Whether each count of ``n`` is in the size class [lo, hi] (hi None: no top)."""
    return (n >= lo) & (n <= (np.inf if hi is None else hi))


def _log10_energy(muons: np.ndarray) -> np.ndarray:
    """(N,) log10 of the muons' energies (GeV, column 0), floored at 1e-6 GeV."""
    return np.log10(np.clip(muons[:, 0], 1e-6, None))


def profile(depth: np.ndarray, muons: np.ndarray, counts: np.ndarray, edges: np.ndarray) -> dict:
    """{(lo, hi): {"mean", "q10", "events"}}, each a list over the depth bands."""
    counts = np.asarray(counts, dtype=np.int64)
    d, n = np.repeat(depth, counts), np.repeat(counts, counts)
    log_e = _log10_energy(muons)
    out = {}
    for lo, hi in SIZES:
        size, rows = _in_size(n, lo, hi), _in_size(counts, lo, hi)
        means, q10s, events = [], [], []
        for a, b in itertools.pairwise(edges):
            sel = log_e[size & (d >= a) & (d < b)]
            means.append(float(sel.mean()) if len(sel) else float("nan"))
            q10s.append(float(np.quantile(sel, 0.1)) if len(sel) else float("nan"))
            events.append(int((rows & (depth >= a) & (depth < b)).sum()))
        out[(lo, hi)] = {"mean": means, "q10": q10s, "events": events}
    return out


def energy_depth_shift(
    cond: np.ndarray,
    real: np.ndarray,
    fake: np.ndarray,
    counts: np.ndarray,
    depth_edges: np.ndarray,
    decades: np.ndarray,
    min_muons: int = 200,
) -> dict:
    """{(lo, hi): (shift, muons)}: per size class, the mean muon log10 E of ``fake`` minus
    that of ``real`` (both (N, 3), the same counts) in each decade of primary energy (rows,
    ``decades`` the edges in log10 GeV) and depth band (columns); NaN where the cell holds
    fewer than ``min_muons`` real muons. ``muons``: the real muons of each cell."""
    counts = np.asarray(counts, dtype=np.int64)
    n = np.repeat(counts, counts)
    d = np.repeat(cond[:, 3].astype(np.float64), counts)
    e0 = np.repeat(np.log10(cond[:, 0].astype(np.float64)), counts)
    log_real, log_fake = _log10_energy(real), _log10_energy(fake)
    out = {}
    for lo, hi in SIZES:
        size = _in_size(n, lo, hi)
        shift = np.full((len(decades) - 1, len(depth_edges) - 1), np.nan)
        muons = np.zeros(shift.shape, dtype=np.int64)
        for i, (a, b) in enumerate(itertools.pairwise(decades)):
            for j, (p, q) in enumerate(itertools.pairwise(depth_edges)):
                cell = size & (e0 >= a) & (e0 < b) & (d >= p) & (d < q)
                muons[i, j] = int(cell.sum())
                if muons[i, j] >= min_muons:
                    shift[i, j] = log_fake[cell].mean() - log_real[cell].mean()
        out[(lo, hi)] = (shift, muons)
    return out


def _thousands(n: int) -> str:
    """A muon count in a few characters: 412, 31k."""
    return str(n) if n < 1000 else f"{n / 1000:.0f}k"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="checkpoint file or run's checkpoints/")
    ap.add_argument("--data", nargs="+", required=True, help="held-out files or folders")
    ap.add_argument("--bands", type=int, default=6, help="equal depth bands (6)")
    ap.add_argument("--events", type=int, default=None, help="first N held-out rows (all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--by-energy",
        action="store_true",
        help="also the real-N shift of mean log10 E per primary-energy decade and depth band",
    )
    a = ap.parse_args(argv)
    model = open_for_inference(a.checkpoint, torch.device("cpu"))
    real = read_inputs(a.data, a.events)
    depth = real.conditions[:, 3].numpy().astype(np.float64)
    edges = np.linspace(depth.min(), np.nextafter(depth.max(), np.inf), a.bands + 1)
    own = generate(model.generator, real.conditions, seed=a.seed)
    fixed = generate(model.generator, real.conditions, seed=a.seed, counts=real.counts)
    rows = {
        "real": profile(depth, real.muons.numpy(), real.counts.numpy(), edges),
        "real N": profile(depth, fixed.muons.numpy(), real.counts.numpy(), edges),
        "own N": profile(depth, own.muons.numpy(), own.counts.numpy(), edges),
    }
    bands = " ".join(f"{lo:>6.0f}-{hi:<5.0f}" for lo, hi in itertools.pairwise(edges))
    print(f"{model.source}: {real.n_events} rows of {', '.join(a.data)}; depth bands (m)")
    for lo, hi in SIZES:
        print(f"\n{_label(lo, hi)} muons {'':14s}{bands}")
        for stat in ("mean", "q10", "events"):
            for name, prof in rows.items():
                if stat == "events" and name == "real N":
                    continue  # the same rows as the simulation's
                values = prof[(lo, hi)][stat]
                cells = " ".join(f"{v:>12d}" if stat == "events" else f"{v:>12.3f}" for v in values)
                print(f"  {stat:6s} {name:7s} {cells}")
    if a.by_energy:
        cond = real.conditions.numpy()
        log_e0 = np.log10(cond[:, 0].astype(np.float64))
        decades = np.arange(np.floor(log_e0.min()), np.floor(log_e0.max()) + 2)
        shifts = energy_depth_shift(
            cond, real.muons.numpy(), fixed.muons.numpy(), real.counts.numpy(), edges, decades
        )
        print(
            "\nreal N minus real: mean muon log10 E, then the real muons it rests on, by"
            " primary energy and depth band"
        )
        for (lo, hi), (shift, muons) in shifts.items():
            print(f"\n{_label(lo, hi)} muons {'':14s}{bands}")
            for i, (a0, b0) in enumerate(itertools.pairwise(decades)):
                cells = " ".join(
                    f"{'-':>12s}" if np.isnan(v) else f"{v:+.3f} {_thousands(m):>4s}".rjust(12)
                    for v, m in zip(shift[i], muons[i])
                )
                print(f"  E0 1e{a0:.0f}-1e{b0:.0f}    {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
