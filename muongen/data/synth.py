"""`muongen synth`: realistic synthetic production files, in the exact formats.

The model (vectorised numpy, physics-inspired, not a simulation):

* Showers: primary energy E0 on a falling power law dN/dE0 ~ E0^-gamma over
  [1e3, 1e9] GeV. The cosmic-ray spectrum is ~E^-2.7, but with it almost no row carries a
  muon; the default ``production`` mix uses gamma = 1.7 (a flat generation spectrum, as
  simulation productions do) which gives the production average of ~0.37 muons per row,
  ~96 % empty rows and a tail of rows with thousands of muons. The ``rich`` mix
  (E0 >= 1e5 GeV, zenith <= 60 deg) gives ~12 muons per row for muon-bound benchmarks;
  the ``broad`` blend draws 2/3 of its showers from the rich mix and 1/3 from the
  production mix (~8 muons per row, 43% of rows with muons), for training on both; the
  ``wide`` blend 1/4 and 3/4 (a batch of 4x the rows holds as many rich rows as one of
  the rich mix, and ~6x broad's production rows with muons).
  Mass number A from {1, 4, 14, 28, 56} (H, He, N, Al, Fe) with weights
  {0.4, 0.3, 0.15, 0.1, 0.05}; cos(zenith) uniform up to 85 degrees.
* Rows: as in production, every shower gives one row per depth of PRODUCTION_DEPTHS_M
  (100 rows per shower, the last shower of a file cut at events_per_file rows).
* Multiplicity: the Elbert formula for muons reaching slant depth X = 0.917 depth / cos
  (metres water equivalent), N = A (K / (E_th cos)) (E0 / (A E_th))^0.757
  (1 - A E_th / E0)^5.25 with K = 14.5 GeV and the threshold E_th = eps (exp(b X) - 1)
  (eps = a / b = 713 GeV, b = 3.63e-4 / m.w.e., plus 1 GeV left at arrival): it rises
  with E0 and A and falls with slant depth. The count is drawn from a gamma-Poisson
  (negative binomial, shape 1) around that mean, which makes the tail heavy.
* Muon energy: surface energy on dN/dE ~ E^-1.757 between E_th and E0 / A, then the
  continuous-loss solution E = (E_surf + eps) exp(-b X) - eps at depth.
* Muon radius: transverse momentum (gamma, mean 0.4 GeV) times the production height
  (15 km, higher for heavier nuclei) over E_surf cos(zenith), plus multiple scattering
  growing with sqrt(X); azimuth uniform; x = r sin(phi), y = r cos(phi).

Files are named by 7-digit zero-padded file numbers; ``ranges`` puts them in
``0000000-0000999``-style folders of 1000 files as production does.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from muongen import schema
from muongen.data.batch import RaggedBatch
from muongen.data.writers import write_events
from muongen.errors import ConfigError

HELP = "write synthetic production-format files (Parquet v1/v2 or HDF5)"

log = logging.getLogger(__name__)

MASSES = np.array([1, 4, 14, 28, 56], np.float64)
MASS_WEIGHTS = np.array([0.4, 0.3, 0.15, 0.1, 0.05])
ICE_DENSITY = 0.917
LOSS_B = 3.63e-4  # 1 / m.w.e., radiative losses
LOSS_EPS = 713.0  # GeV, a / b (critical energy)
ARRIVAL_GEV = 1.0  # least energy a muon arrives with
ELBERT_K, ELBERT_A1, ELBERT_A2 = 14.5, 0.757, 5.25
NB_SHAPE = 1.0
PT_MEAN_GEV = 0.4
HEIGHT_M = 15000.0
ROWS_PER_SHOWER = len(schema.PRODUCTION_DEPTHS_M)
RANGE_FILES = 1000

FORMAT_ALIASES = {"v1": schema.FORMAT_V1, "v2": schema.FORMAT_V2, "hdf5": schema.FORMAT_HDF5}
EXTENSIONS = {schema.FORMAT_V1: ".parquet", schema.FORMAT_V2: ".parquet", schema.FORMAT_HDF5: ".h5"}


@dataclass(frozen=True)
class Mix:
    gamma: float
    e_min: float
    e_max: float
    zenith_max_deg: float


MIXES = {
    "production": Mix(gamma=1.7, e_min=1e3, e_max=1e9, zenith_max_deg=85.0),
    "rich": Mix(gamma=1.7, e_min=1e5, e_max=1e9, zenith_max_deg=60.0),
}
# Blends draw each shower from one of the mixes above, with these probabilities. broad:
# the rich mix's muon-rich showers plus the whole production range (E0 down to 1e3 GeV,
# zenith to 85 degrees), for training a model that is evaluated on both; wide: the same
# with 3/4 of the showers from production (rows without muons are cheap to train on).
BLENDS = {
    "broad": ((2.0 / 3.0, "rich"), (1.0 / 3.0, "production")),
    "wide": ((0.25, "rich"), (0.75, "production")),
}
MIX_NAMES = (*MIXES, *BLENDS)


def _power_law(
    u: np.ndarray, index: float, lo: np.ndarray | float, hi: np.ndarray | float
) -> np.ndarray:
    """Inverse CDF of dN/dE ~ E^-index on [lo, hi] (index != 1)."""
    g = 1.0 - index
    return (lo**g + u * (hi**g - lo**g)) ** (1.0 / g)


def _threshold(slant_mwe: np.ndarray) -> np.ndarray:
    """Surface energy (GeV) a muon needs to arrive at slant depth X with ARRIVAL_GEV."""
    return (ARRIVAL_GEV + LOSS_EPS) * np.exp(LOSS_B * slant_mwe) - LOSS_EPS


def mean_multiplicity(e0, mass, cos_zen, depth) -> np.ndarray:
    """Elbert-formula mean number of muons reaching ``depth`` (m, vertical)."""
    slant = ICE_DENSITY * depth / cos_zen
    e_th = _threshold(slant)
    ratio = mass * e_th / e0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        n = (
            mass
            * (ELBERT_K / (e_th * cos_zen))
            * (e0 / (mass * e_th)) ** ELBERT_A1
            * np.clip(1.0 - ratio, 0.0, None) ** ELBERT_A2
        )
    return np.where(ratio < 1.0, n, 0.0)


def generate(
    n_rows: int, rng: np.random.Generator, *, mix: str = "production", major: int = 0
) -> tuple[RaggedBatch, tuple[np.ndarray, np.ndarray]]:
    """``n_rows`` synthetic rows (physical units) and their (major, minor) shower ids."""
    n_showers = -(-n_rows // ROWS_PER_SHOWER)
    if mix in BLENDS:
        e0, mass, cos_zen = _blend_showers(n_showers, rng, BLENDS[mix])
    else:
        m = MIXES[mix]
        e0 = _power_law(rng.random(n_showers), m.gamma, m.e_min, m.e_max)
        mass = rng.choice(MASSES, n_showers, p=MASS_WEIGHTS)
        cos_zen = rng.uniform(np.cos(np.radians(m.zenith_max_deg)), 1.0, n_showers)
    shower = np.repeat(np.arange(n_showers), ROWS_PER_SHOWER)[:n_rows]  # (B,)
    depth = np.tile(schema.PRODUCTION_DEPTHS_M, n_showers)[:n_rows]
    cond = np.column_stack([e0[shower], np.arccos(cos_zen[shower]), mass[shower], depth])
    ids = (np.full(n_rows, major, np.uint64), shower.astype(np.uint64))
    return bundles(cond, rng), ids


def bundles(cond: np.ndarray, rng: np.random.Generator) -> RaggedBatch:
    """The synthetic physics' muons for given primaries ``cond`` (B, 4) [E0 GeV, zenith rad,
    A, vertical depth m], one independent draw per row (the rows of a shower share only
    their primary, as in :func:`generate`): a perfect generator of this physics, which
    calibrates the evaluation's yardstick (benchmarks/perfect_candidate.py)."""
    cond = np.asarray(cond, dtype=np.float64)
    e0, mass, depth = cond[:, 0], cond[:, 2], cond[:, 3]
    cos_zen = np.cos(cond[:, 1])
    n_rows = len(cond)

    mu = mean_multiplicity(e0, mass, cos_zen, depth) * rng.gamma(NB_SHAPE, 1.0 / NB_SHAPE, n_rows)
    counts = rng.poisson(mu).astype(np.int64)

    ev = np.repeat(np.arange(n_rows), counts)  # (N,) event of each muon
    slant = ICE_DENSITY * depth[ev] / cos_zen[ev]
    e_th = _threshold(slant)
    e_cap = np.maximum(e0[ev] / mass[ev], e_th * 1.0001)
    e_surf = _power_law(rng.random(len(ev)), 1.0 + ELBERT_A1, e_th, e_cap)
    e_mu = np.maximum((e_surf + LOSS_EPS) * np.exp(-LOSS_B * slant) - LOSS_EPS, ARRIVAL_GEV)
    pt = rng.gamma(2.0, PT_MEAN_GEV / 2.0, len(ev))
    height = HEIGHT_M * (1.0 + 0.05 * np.log(mass[ev]))
    r_core = pt * height / (e_surf * cos_zen[ev])
    r = np.hypot(r_core, 0.7 * np.sqrt(slant / 1000.0) * rng.standard_normal(len(ev)))
    phi = rng.uniform(0.0, 2.0 * np.pi, len(ev))

    muons = np.column_stack([e_mu, r * np.sin(phi), r * np.cos(phi)]).astype(np.float32)
    return RaggedBatch.from_numpy(cond.astype(np.float32), muons, counts)


def _blend_showers(
    n: int, rng: np.random.Generator, parts: tuple[tuple[float, str], ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(E0, A, cos zenith) of ``n`` showers, each drawn from one of ``parts``' mixes."""
    weights = np.array([w for w, _ in parts])
    part = rng.choice(len(parts), n, p=weights / weights.sum())
    u_energy, u_zenith = rng.random(n), rng.random(n)
    mass = rng.choice(MASSES, n, p=MASS_WEIGHTS)
    e0, cos_zen = np.empty(n), np.empty(n)
    for i, (_, name) in enumerate(parts):
        m, sel = MIXES[name], part == i
        e0[sel] = _power_law(u_energy[sel], m.gamma, m.e_min, m.e_max)
        lo = np.cos(np.radians(m.zenith_max_deg))
        cos_zen[sel] = lo + (1.0 - lo) * u_zenith[sel]
    return e0, mass, cos_zen


def file_path(out_dir: str | Path, number: int, fmt: str, *, ranges: bool = False) -> Path:
    """``out_dir/0000042.parquet``, or ``out_dir/0000000-0000999/0000042.parquet`` with ranges."""
    name = f"{number:07d}{EXTENSIONS[fmt]}"
    if not ranges:
        return Path(out_dir) / name
    lo = number // RANGE_FILES * RANGE_FILES
    return Path(out_dir) / f"{lo:07d}-{lo + RANGE_FILES - 1:07d}" / name


def write_synthetic(
    out_dir: str | Path,
    *,
    files: int,
    events_per_file: int,
    fmt: str = schema.FORMAT_V1,
    ranges: bool = False,
    seed: int = 0,
    mix: str = "production",
    first: int = 0,
) -> list[str]:
    """Write ``files`` files of ``events_per_file`` rows; returns their paths, sorted.

    File number k (from ``first``) is drawn from ``default_rng([seed, k])``, so a file's
    content does not depend on how many others are written.
    """
    fmt = FORMAT_ALIASES.get(fmt, fmt)
    if fmt not in schema.FORMATS:
        raise ConfigError(f"unknown format {fmt!r}; use v1, v2 or hdf5")
    if mix not in MIX_NAMES:
        raise ConfigError(f"unknown synthetic mix {mix!r}; use one of {sorted(MIX_NAMES)}")
    if files < 0 or events_per_file < 0:
        raise ConfigError("files and events_per_file must be >= 0")
    paths = []
    for number in range(first, first + files):
        rng = np.random.default_rng([seed, number])
        batch, ids = generate(events_per_file, rng, mix=mix, major=number)
        path = file_path(out_dir, number, fmt, ranges=ranges)
        write_events(path, batch, fmt, ids=ids)
        paths.append(str(path))
    return sorted(paths)


# ------------------------------------------------------------------ CLI


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--files", type=int, default=4, help="number of files (default 4)")
    parser.add_argument(
        "--events-per-file", type=int, default=20000, help="rows per file (default 20000)"
    )
    parser.add_argument(
        "--format", default="v1", choices=sorted(FORMAT_ALIASES), help="file format (default v1)"
    )
    parser.add_argument(
        "--ranges", action="store_true", help="put files in 0000000-0000999-style folders"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--mix", default="production", choices=sorted(MIX_NAMES), help="multiplicity mix"
    )
    parser.add_argument("--first", type=int, default=0, help="number of the first file (default 0)")
    parser.add_argument("--json", action="store_true", help="print the written paths as JSON")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace files of these numbers already there"
    )


def run(args: argparse.Namespace) -> int:
    from muongen import outputs

    fmt = FORMAT_ALIASES.get(args.format, args.format)
    if args.files < 0 or args.events_per_file < 0 or args.first < 0:
        raise ConfigError("--files, --events-per-file and --first must be >= 0")
    names = [
        str(file_path("", n, fmt, ranges=args.ranges))
        for n in range(args.first, args.first + args.files)
    ]
    outputs.check_folder(args.out, names, overwrite=args.overwrite)  # before any is written
    with outputs.writing(args.out):
        paths = write_synthetic(
            args.out,
            files=args.files,
            events_per_file=args.events_per_file,
            fmt=args.format,
            ranges=args.ranges,
            seed=args.seed,
            mix=args.mix,
            first=args.first,
        )
    if args.json:
        print(json.dumps({"files": paths}))
    else:
        print(
            f"wrote {len(paths)} {FORMAT_ALIASES[args.format]} files "
            f"of {args.events_per_file} rows to {args.out}"
        )
    return 0
