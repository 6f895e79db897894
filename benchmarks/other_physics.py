"""Showers from a parametric physics that is not `muongen synth`'s, for cross-checks.

    python benchmarks/other_physics.py --out op-train --files 4 --events-per-file 20000 --seed 0
    python benchmarks/other_physics.py --out op-test --files 1 --events-per-file 100000 --seed 1
    python benchmarks/other_physics.py --out op-rich-train --e-min 1e5 ...   # bundle-rich rows
    python benchmarks/other_physics.py --out heldA --e-min 1e4 --e-index 1 ...    # 27 a row
    python benchmarks/other_physics.py --out heldE --e-min 1e5 --e-index 1.3 ...  # 17 a row

Everything muongen is tuned on comes from `muongen synth`, so a model or preset that is
good there may be good only there. This writes production-format files (Parquet v1, the
same writer) of rows from other formulas, in the manner of the fast generators of
underwater/ice telescopes (Becherini et al., hep-ph/0507228; MUPAGE):

* Showers: E0 on E^-1.7 over [3e3, 1e8] GeV (``--e-min``, ``--e-index``: another
  spectrum); A from {1, 4, 16, 24, 56} with weights {0.35, 0.25, 0.2, 0.1, 0.1} (other
  nuclei than synth's); cos(zenith) uniform up to 75 degrees; each shower gives 10 rows
  at depths drawn uniformly in [1000, 2800] m (synth: 100 fixed depths).
* Multiplicity: the Elbert formula with other energy-loss constants (b = 4.2e-4 / m.w.e.,
  eps = 624.5 GeV: those of the parametrisation above, against synth's 3.63e-4 and 713),
  drawn negative binomial with shape 2 (synth: 1).
* Lateral distance R to the axis: dN/dR ~ R / (R + R0)^alpha, the parametrisation's form,
  sampled exactly (R / (R + R0) is Beta(2, alpha - 2)); R0 grows with the slant depth and
  shrinks with sec(zenith) less than synth's geometry, alpha grows with the multiplicity
  (big bundles are tighter at a given depth). A power-law tail, where synth's is Gaussian.
* Muon energy: the surface spectrum E^-gamma above the threshold (capped at E0 / A) with
  continuous losses to the depth, gamma growing with the distance to the axis and falling
  with the multiplicity (muons far out are softer): an energy-radius correlation of
  another form than synth's 1 / E geometry.

Prints what it wrote and a one-line summary of the rows; asserts nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from muongen import schema
from muongen.data.batch import RaggedBatch
from muongen.data.writers import write_events

MASSES = np.array([1.0, 4.0, 16.0, 24.0, 56.0])
MASS_WEIGHTS = np.array([0.35, 0.25, 0.2, 0.1, 0.1])
E_MIN, E_MAX, E_INDEX = 3e3, 1e8, 1.7
ZENITH_MAX_DEG = 75.0
ROWS_PER_SHOWER = 10
DEPTH_RANGE_M = (1000.0, 2800.0)
ICE_DENSITY = 0.917
LOSS_B = 4.2e-4  # 1 / m.w.e.
LOSS_EPS = 624.5  # GeV
ELBERT_K, ELBERT_A1, ELBERT_A2 = 14.5, 0.757, 5.25
NB_SHAPE = 2.0


def _power_law(u, index, lo, hi):
    """Draws on E^-index over [lo, hi] by inverting the CDF (E^-1: log-uniform)."""
    g = 1.0 - index
    if np.ndim(g) == 0 and abs(g) < 1e-9:  # (muon spectra pass an index per muon, never 1)
        return lo * (hi / lo) ** u
    return (lo**g + u * (hi**g - lo**g)) ** (1.0 / g)


def _threshold(slant_mwe):
    return (1.0 + LOSS_EPS) * np.exp(LOSS_B * slant_mwe) - LOSS_EPS


def sample_lateral(r0: np.ndarray, alpha: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Distances R to the axis on dN/dR ~ R / (R + r0)^alpha (alpha > 2), exactly: with
    s = R / (R + r0), the density in s is s (1 - s)^(alpha - 3), a Beta(2, alpha - 2)."""
    s = rng.beta(2.0, alpha - 2.0)
    return r0 * s / (1.0 - s)


def generate(
    n_rows: int,
    rng: np.random.Generator,
    major: int = 0,
    e_min: float = E_MIN,
    e_index: float = E_INDEX,
):
    """``n_rows`` rows (physical units) and their (major, minor) shower ids; primaries on
    E^-``e_index`` from ``e_min`` to :data:`E_MAX`."""
    n_showers = -(-n_rows // ROWS_PER_SHOWER)
    e0 = _power_law(rng.random(n_showers), e_index, e_min, E_MAX)
    mass = rng.choice(MASSES, n_showers, p=MASS_WEIGHTS)
    cos_zen = rng.uniform(np.cos(np.radians(ZENITH_MAX_DEG)), 1.0, n_showers)
    shower = np.repeat(np.arange(n_showers), ROWS_PER_SHOWER)[:n_rows]
    depth = rng.uniform(*DEPTH_RANGE_M, n_rows)
    cond = np.column_stack([e0[shower], np.arccos(cos_zen[shower]), mass[shower], depth])
    ids = (np.full(n_rows, major, np.uint64), shower.astype(np.uint64))
    return bundles(cond, rng), ids


def bundles(cond: np.ndarray, rng: np.random.Generator) -> RaggedBatch:
    """The muons of this physics for given primaries ``cond`` (B, 4) [E0 GeV, zenith rad, A,
    vertical depth m], one independent draw per row (the rows of one shower share only
    their primary, as in :func:`generate`): a perfect generator of the physics, which
    calibrates the evaluation's yardstick (``benchmarks/perfect_candidate.py``)."""
    cond = np.asarray(cond, dtype=np.float64)
    e0, mass, depth = cond[:, 0], cond[:, 2], cond[:, 3]
    cos_zen = np.cos(cond[:, 1])
    n_rows = len(cond)

    slant = ICE_DENSITY * depth / cos_zen  # m.w.e.
    e_th = _threshold(slant)
    ratio = mass * e_th / e0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        mean = (
            mass
            * (ELBERT_K / (e_th * cos_zen))
            * (e0 / (mass * e_th)) ** ELBERT_A1
            * np.clip(1.0 - ratio, 0.0, None) ** ELBERT_A2
        )
    mean = np.where(ratio < 1.0, mean, 0.0)
    counts = rng.poisson(mean * rng.gamma(NB_SHAPE, 1.0 / NB_SHAPE, n_rows)).astype(np.int64)

    ev = np.repeat(np.arange(n_rows), counts)
    m = counts[ev].astype(np.float64)
    x_km = slant[ev] / 1000.0
    # lateral: R0 in m, alpha > 3 (a finite mean)
    r0 = 4.0 * np.sqrt(x_km) * cos_zen[ev] ** -0.4 * (1.0 + 0.1 * np.log(mass[ev]))
    alpha = 4.0 + 0.6 * np.log1p(m) + 0.3 * x_km / (1.0 + x_km)
    r = sample_lateral(r0, alpha, rng)
    # energy: surface power law whose index grows with R / R0 and falls with m
    gamma = 1.6 + 0.25 * np.log1p(r / r0) - 0.04 * np.log1p(m)
    th = e_th[ev]
    cap = np.maximum(e0[ev] / mass[ev], th * 1.0001)
    e_surf = _power_law(rng.random(len(ev)), gamma, th, cap)
    e_mu = np.maximum((e_surf + LOSS_EPS) * np.exp(-LOSS_B * slant[ev]) - LOSS_EPS, 1.0)
    phi = rng.uniform(0.0, 2.0 * np.pi, len(ev))

    muons = np.column_stack([e_mu, r * np.sin(phi), r * np.cos(phi)]).astype(np.float32)
    return RaggedBatch.from_numpy(cond.astype(np.float32), muons, counts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--events-per-file", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--e-min", type=float, default=E_MIN, help=f"least E0, GeV ({E_MIN:g})")
    ap.add_argument(
        "--e-index",
        type=float,
        default=E_INDEX,
        help=f"primaries on E^-index up to {E_MAX:g} GeV ({E_INDEX:g}; 1: issue 52's rich set)",
    )
    a = ap.parse_args()
    n_rows = n_muons = with_muons = 0
    for number in range(a.files):
        batch, ids = generate(
            a.events_per_file, np.random.default_rng([a.seed, number]), number, a.e_min, a.e_index
        )
        path = Path(a.out) / f"{number:07d}.parquet"
        write_events(path, batch, schema.FORMAT_V1, ids=ids)
        counts = batch.counts.numpy()
        n_rows += len(counts)
        n_muons += int(counts.sum())
        with_muons += int((counts > 0).sum())
    print(
        f"wrote {a.files} files to {a.out}: {n_rows} rows, {n_muons} muons "
        f"({n_muons / max(n_rows, 1):.2f} per row), {with_muons / max(n_rows, 1):.1%} with muons"
    )


if __name__ == "__main__":
    main()
