"""Where a per-muon energy or radius misses in one corner: the bundles' scale or their shape.

    python benchmarks/bundle_shape.py --checkpoint RUN/checkpoints --data heldA \
        --energy 1e7,1e8 --muons 10,99 [--observable log10_energy] [--seeds 0,1]
        [--quantiles 0.001,0.01,0.5,0.99,0.999]

`muongen evaluate` names its worst bin (for example the muon log10 E of the 10-99-muon
bundles at 1e7-1e8 GeV) with one W1 ratio. This script splits that corner's pooled
per-muon values into two parts and prints, for each, the model's quantiles minus the
held-out simulation's:

* **scale**: each bundle's mean of the observable, one value per bundle;
* **shape**: each muon's value minus its own bundle's mean (the spread inside bundles).

The events are chosen by the primary's energy (the same events in every sample) and by
each sample's own muon count, as evaluate's bins are. The noise row is the same difference
between two random halves of the held-out showers (the root mean square over 20 splits),
so a model row that stays within about that is as close as a second simulation of half
the size. With more than one checkpoint, the runs' rows come one after another; each
``--seeds`` value is one more draw of the model. Asserts nothing.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from muongen.evaluate.features import EventSample, shower_groups
from muongen.evaluate.sample import generate, read_inputs
from muongen.inference import open_for_inference

#: the quantiles printed (of the pooled muons, the bundle means and the in-bundle values)
QUANTILES = np.array([0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99])

#: half splits of the held-out showers behind the noise row
NOISE_SPLITS = 20


def corner(sample: EventSample, energy: tuple[float, float], muons: tuple[int, int]) -> np.ndarray:
    """(B,) bool: the events with primary energy in [lo, hi) GeV and lo <= N <= hi muons
    (N the sample's own count)."""
    e0 = sample.conditions[:, 0]
    n = sample.counts
    return (e0 >= energy[0]) & (e0 < energy[1]) & (n >= muons[0]) & (n <= muons[1])


def parts(sample: EventSample, observable: str) -> dict[str, np.ndarray]:
    """The observable's values: "pooled" (N,), "scale" (B,) each event's mean and "shape"
    (N,) each muon's value minus its event's mean. Events without muons are left out."""
    values = sample.muon[observable]
    counts = sample.counts[sample.counts > 0]
    event = np.repeat(np.arange(len(counts)), counts)
    means = np.bincount(event, weights=values, minlength=len(counts)) / counts
    return {"pooled": values, "scale": means, "shape": values - means[event]}


def quantiles(
    sample: EventSample, observable: str, levels: np.ndarray = QUANTILES
) -> dict[str, np.ndarray]:
    """{part: its quantiles at ``levels``} (see :func:`parts`); NaN where a part is empty."""
    out = {}
    for name, values in parts(sample, observable).items():
        out[name] = np.quantile(values, levels) if len(values) else np.full(len(levels), np.nan)
    return out


def noise(
    real: EventSample,
    pick,
    observable: str,
    rng: np.random.Generator,
    levels: np.ndarray = QUANTILES,
) -> dict[str, np.ndarray]:
    """{part: root mean square over NOISE_SPLITS of (half A's quantiles - half B's)}, the
    halves drawn by shower; ``pick(sample)`` chooses the corner's events."""
    groups = real.groups if real.groups is not None else np.arange(real.n_events)
    ids = np.unique(groups)
    squares = {}
    for _ in range(NOISE_SPLITS):
        half = np.isin(groups, rng.permutation(ids)[: len(ids) // 2])
        a, b = real.take(half), real.take(~half)
        qa = quantiles(a.take(pick(a)), observable, levels)
        qb = quantiles(b.take(pick(b)), observable, levels)
        for name in qa:
            squares[name] = squares.get(name, 0.0) + (qa[name] - qb[name]) ** 2
    return {name: np.sqrt(s / NOISE_SPLITS) for name, s in squares.items()}


def _row(label: str, values: np.ndarray, width: int, signed: bool = True) -> str:
    cells = " ".join(f"{v:+7.3f}" if signed else f"{v:7.3f}" for v in values)
    return f"  {label:{width}s}{cells}"


def _pair(text: str, kind: type) -> tuple:
    lo, hi = (kind(float(v)) for v in text.split(","))
    return lo, hi


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--checkpoint", nargs="+", required=True, help="checkpoint files or runs' checkpoints/"
    )
    ap.add_argument("--data", nargs="+", required=True, help="held-out files or folders")
    ap.add_argument("--energy", default="1e7,1e8", help="primary energy LO,HI in GeV (1e7,1e8)")
    ap.add_argument("--muons", default="10,99", help="bundle size LO,HI, both kept (10,99)")
    ap.add_argument(
        "--observable",
        default="log10_energy",
        help="a per-muon observable: log10_energy (default), log10_radius, radius, x, y",
    )
    ap.add_argument("--seeds", default="0", help="model draws, comma-separated (0)")
    ap.add_argument(
        "--quantiles",
        default=",".join(f"{q:g}" for q in QUANTILES),
        help="the quantiles printed, comma-separated, each in (0, 1) (0.01 to 0.99)",
    )
    ap.add_argument("--events", type=int, default=None, help="first N held-out rows (all)")
    a = ap.parse_args(argv)
    energy, muons = _pair(a.energy, float), _pair(a.muons, int)
    levels = np.array([float(q) for q in a.quantiles.split(",")])
    if not ((levels > 0) & (levels < 1)).all():
        ap.error(f"--quantiles {a.quantiles}: each must lie between 0 and 1")
    real_batch = read_inputs(a.data, a.events)
    real = EventSample.from_batch(real_batch)
    if a.observable not in real.muon:
        ap.error(f"--observable {a.observable!r}: choose one of {', '.join(sorted(real.muon))}")
    real = real.with_groups(shower_groups(real.conditions))
    picked = corner(real, energy, muons)
    if not picked.any():
        ap.error(f"no held-out event has a primary in {a.energy} GeV and {a.muons} muons")
    reference = quantiles(real.take(picked), a.observable, levels)
    pick = lambda s: corner(s, energy, muons)  # noqa: E731
    spread = noise(real, pick, a.observable, np.random.default_rng(0), levels)
    n_muons = int(real.counts[picked].sum())
    print(
        f"{a.observable} at E0 {a.energy} GeV, {a.muons} muons: {int(picked.sum())} held-out"
        f" events, {n_muons} muons of {', '.join(a.data)}"
    )
    models = []  # (label, {part: quantiles}), each checkpoint and seed drawn once
    for path in a.checkpoint:
        model = open_for_inference(path, torch.device("cpu"))
        for seed in (int(s) for s in a.seeds.split(",")):
            fake = generate(model.generator, real_batch.conditions, seed=seed)
            sample = EventSample.from_arrays(
                real.conditions, fake.muons.numpy(), fake.counts.numpy()
            )
            q = quantiles(sample.take(corner(sample, energy, muons)), a.observable, levels)
            models.append((f"{path} s{seed} - sim", q))
    width = max(20, *(len(label) + 1 for label, _ in models))
    for part, about in (
        ("pooled", "every muon"),
        ("scale", "each bundle's mean"),
        ("shape", "each muon minus its bundle's mean"),
    ):
        print(f"\n{part} ({about}): quantile")
        print(f"  {'':{width}s}" + " ".join(f"{q:7.4g}" for q in levels))
        print(_row("simulation", reference[part], width, signed=False))
        print(_row("halves' noise (rms)", spread[part], width, signed=False))
        for label, q in models:
            print(_row(label, q[part] - reference[part], width))
    return 0


if __name__ == "__main__":
    sys.exit(main())
