"""Primaries drawn from a generation spectrum, weighted to a cosmic-ray flux model.

Generation (as CORSIKA does it): for each mass group g (default p, He, N, Al, Fe: A = 1,
4, 14, 27, 56) ``n_g`` showers with total energy E drawn from a power law E^-gamma between
``energy`` bounds, and directions isotropic (uniform in cos(zenith) and azimuth) between
the ``zenith`` bounds. The flux models come from ``crflux`` (never hand-copied tables);
every element of a model is put in the mass group nearest to it in ln A.

Weight of an event of group g with energy E (the same for every depth row of its shower)::

    w = Phi_g(E) * dOmega / (n_g * p_g(E))          [1 / (m^2 s)]

with Phi_g the model's summed flux of the group's elements in 1/(m^2 s sr GeV), p_g the
normalised generation density in 1/GeV and dOmega = 2 pi (cos z_min - cos z_max) sr. The
sum of the weights of a sample is then an unbiased estimate of the rate of primaries in
the generated energy and zenith ranges crossing a unit area PERPENDICULAR to each shower's
axis (``area="perpendicular"``, the default: what a spherical or volume detector sees per
unit projected area). With ``area="horizontal"`` every weight is multiplied by
cos(zenith): the rate through a unit HORIZONTAL area (a flat surface detector). Summing the
weights of the rows at one depth that carry at least one muon gives the rate of muon
bundles at that depth, per unit area, in 1/(m^2 s).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from muongen.errors import ConfigError

#: --flux name -> (crflux class name, constructor arguments, what it is)
FLUX_MODELS: dict[str, tuple[str, tuple, str]] = {
    "H3a": ("HillasGaisser2012", ("H3a",), "Gaisser, Astropart. Phys. 35 (2012) 801, H3a"),
    "H4a": ("HillasGaisser2012", ("H4a",), "Gaisser, Astropart. Phys. 35 (2012) 801, H4a"),
    "GST": ("GaisserStanevTilav", ("3-gen",), "Gaisser, Stanev, Tilav 2013, 3 generations"),
    "GSF": ("GlobalSplineFit", (), "Global Spline Fit (globalsplinefit, newest version)"),
}
DEFAULT_MASSES = (1.0, 4.0, 14.0, 27.0, 56.0)
AREAS = ("perpendicular", "horizontal")


def flux_model(name: str):
    """The crflux model object for a --flux name (H3a, H4a, GST, GSF)."""
    if name not in FLUX_MODELS:
        raise ConfigError(f"unknown flux model {name!r}; use one of {', '.join(FLUX_MODELS)}")
    cls_name, args, _ = FLUX_MODELS[name]
    try:
        import crflux.models as models

        return getattr(models, cls_name)(*args)
    except ImportError as exc:
        extra = " crflux[gsf]" if name == "GSF" else " crflux"
        raise ConfigError(
            f"flux model {name} needs {exc.name or 'crflux'}; install it: pip install{extra}"
        ) from None


def element_mass(corsika_id: int) -> float:
    """Mass number A of a CORSIKA particle id (14 = proton, 100 A + Z for nuclei)."""
    return 1.0 if corsika_id == 14 else float(corsika_id // 100)


def group_elements(model, masses: tuple[float, ...]) -> list[list[int]]:
    """The model's element ids assigned to each mass group (nearest in ln A)."""
    groups: list[list[int]] = [[] for _ in masses]
    log_m = np.log(np.asarray(masses, dtype=float))
    for cid in model.nucleus_ids:
        a = element_mass(int(cid))
        groups[int(np.argmin(np.abs(log_m - math.log(a))))].append(int(cid))
    return groups


def solid_angle(zenith_rad: tuple[float, float]) -> float:
    """Solid angle in sr between two zenith angles (rad)."""
    lo, hi = zenith_rad
    return 2.0 * math.pi * (math.cos(lo) - math.cos(hi))


@dataclass(frozen=True)
class Generation:
    """How primaries are generated: per mass group a power law in total energy, isotropic.

    Attributes:
        showers: showers in all, split as evenly as possible over the mass groups.
        energy_gev: (min, max) total primary energy, GeV.
        zenith_rad: (min, max) zenith angle, rad (0 = vertically down-going).
        masses: mass number A of each group.
        gamma: spectral index of the generation spectrum E^-gamma.
    """

    showers: int
    energy_gev: tuple[float, float] = (1e4, 1e9)
    zenith_rad: tuple[float, float] = (0.0, math.radians(85.0))
    masses: tuple[float, ...] = DEFAULT_MASSES
    gamma: float = 2.0

    def __post_init__(self) -> None:
        lo, hi = self.energy_gev
        zlo, zhi = self.zenith_rad
        if self.showers < len(self.masses):
            raise ConfigError(f"--showers must be at least the {len(self.masses)} mass groups")
        if not 0 < lo < hi:
            raise ConfigError(f"--energy {lo:g}:{hi:g} must satisfy 0 < min < max (GeV)")
        if not 0 <= zlo < zhi <= math.pi / 2 + 1e-12:
            raise ConfigError(
                f"--zenith {math.degrees(zlo):g}:{math.degrees(zhi):g} must satisfy "
                "0 <= min < max <= 90 degrees (down-going showers)"
            )
        if not self.masses or min(self.masses) < 1:
            raise ConfigError("--masses must be mass numbers A >= 1")

    @property
    def per_group(self) -> np.ndarray:
        """(G,) showers generated in each mass group."""
        g = len(self.masses)
        n = np.full(g, self.showers // g, dtype=np.int64)
        n[: self.showers % g] += 1
        return n

    @property
    def solid_angle_sr(self) -> float:
        return solid_angle(self.zenith_rad)

    def energy_density(self, energy: np.ndarray) -> np.ndarray:
        """Normalised generation density p(E) in 1/GeV on [min, max] (E^-gamma)."""
        lo, hi = self.energy_gev
        g = self.gamma
        norm = math.log(hi / lo) if g == 1 else (hi ** (1 - g) - lo ** (1 - g)) / (1 - g)
        return np.asarray(energy, dtype=float) ** (-g) / norm

    def draw_energy(self, u: np.ndarray) -> np.ndarray:
        """Inverse CDF of the generation spectrum for uniform ``u`` in [0, 1)."""
        lo, hi = self.energy_gev
        g = self.gamma
        if g == 1:
            return lo * (hi / lo) ** u
        a, b = lo ** (1 - g), hi ** (1 - g)
        return (a + u * (b - a)) ** (1 / (1 - g))


@dataclass
class WeightedPrimaries:
    """Generated showers and their flux weights (one row per shower, not per depth).

    Attributes:
        energy: (S,) total primary energy, GeV.
        zenith: (S,) zenith angle, rad.
        mass: (S,) mass number A.
        weight: (S,) rate per unit area in 1/(m^2 s) (see the module docstring).
        info: what produced them (model, generation, area convention, expected rate).
    """

    energy: np.ndarray
    zenith: np.ndarray
    mass: np.ndarray
    weight: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def n_showers(self) -> int:
        return len(self.energy)

    def conditions(self, depths_m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows for the generator, shower after shower, each at every depth (as Muonitron
        writes them). Returns (conditions (S*D, 4) [E, zenith, A, depth], weights (S*D,),
        shower index (S*D,))."""
        depths = np.asarray(depths_m, dtype=np.float64).reshape(-1)
        d = len(depths)
        shower = np.repeat(np.arange(self.n_showers), d)
        cond = np.column_stack(
            [
                self.energy[shower],
                self.zenith[shower],
                self.mass[shower],
                np.tile(depths, self.n_showers),
            ]
        )
        return cond, self.weight[shower], shower


class FluxWeighter:
    """Mass-group fluxes of a crflux model, and weights for generated primaries."""

    def __init__(self, name: str, masses: tuple[float, ...] = DEFAULT_MASSES) -> None:
        self.name = name
        self.model = flux_model(name)
        self.masses = tuple(float(m) for m in masses)
        self.groups = group_elements(self.model, self.masses)

    @cached_property
    def description(self) -> str:
        return f"{FLUX_MODELS[self.name][2]} (crflux {type(self.model).__name__})"

    def group_flux(self, group: int, energy: np.ndarray) -> np.ndarray:
        """Summed flux of the group's elements, 1/(m^2 s sr GeV), at total energy E (GeV)."""
        energy = np.atleast_1d(np.asarray(energy, dtype=float))
        out = np.zeros_like(energy)
        for cid in self.groups[group]:
            out += np.asarray(self.model.nucleus_flux(cid, energy), dtype=float).reshape(
                energy.shape
            )
        return out

    def sample(
        self, gen: Generation, *, seed: int = 0, area: str = "perpendicular"
    ) -> WeightedPrimaries:
        """Draw ``gen.showers`` primaries and weight them (see the module docstring)."""
        if area not in AREAS:
            raise ConfigError(f"unknown area convention {area!r}; use one of {', '.join(AREAS)}")
        if tuple(gen.masses) != self.masses:
            raise ConfigError("the generation's mass groups differ from the weighter's")
        rng = np.random.default_rng(seed)
        parts = []
        for g, n in enumerate(gen.per_group):
            energy = gen.draw_energy(rng.random(n))
            cos_lo, cos_hi = (math.cos(z) for z in gen.zenith_rad)
            zenith = np.arccos(cos_hi + rng.random(n) * (cos_lo - cos_hi))
            weight = (
                self.group_flux(g, energy) * gen.solid_angle_sr / (n * gen.energy_density(energy))
            )
            if area == "horizontal":
                weight = weight * np.cos(zenith)
            parts.append((energy, zenith, np.full(n, self.masses[g]), weight))
        energy, zenith, mass, weight = (np.concatenate(c) for c in zip(*parts))
        info = {
            "flux": self.name,
            "flux_model": self.description,
            "area": area,
            "weight_units": "1/(m^2 s)",
            "generation": {**asdict(gen), "per_group": gen.per_group.tolist()},
            "groups": {f"{m:g}": ids for m, ids in zip(self.masses, self.groups)},
            "seed": seed,
            "rate_per_m2_s": float(weight.sum()),
        }
        return WeightedPrimaries(energy, zenith, mass, weight, info)


def integral_rate(
    weighter: FluxWeighter,
    energy_gev: tuple[float, float],
    zenith_rad: tuple[float, float],
    *,
    area: str = "perpendicular",
) -> float:
    """The flux model's rate in 1/(m^2 s) over an energy and zenith range, by quadrature
    (independent of the sampling): sum over elements of the integral of Phi dE dOmega."""
    from scipy import integrate

    lo, hi = energy_gev
    if area == "perpendicular":
        omega = solid_angle(zenith_rad)
    else:  # integral of cos(zenith) dOmega = pi (sin^2 z_max - sin^2 z_min)
        omega = math.pi * (math.sin(zenith_rad[1]) ** 2 - math.sin(zenith_rad[0]) ** 2)
    total = 0.0
    for cid in weighter.model.nucleus_ids:
        # in ln E: the integrand E * Phi(E) is smooth over the decades
        def f(log_e: float, cid: int = int(cid)) -> float:
            e = math.exp(log_e)
            return e * float(np.asarray(weighter.model.nucleus_flux(cid, e)).reshape(-1)[0])

        value, _ = integrate.quad(f, math.log(lo), math.log(hi), limit=200, epsrel=1e-7)
        total += value
    return total * omega


def parse_range(text: str, what: str, unit: str) -> tuple[float, float]:
    """``a:b`` -> (a, b) floats; ConfigError naming the option otherwise."""
    try:
        a, b = (float(t) for t in text.split(":"))
    except ValueError:
        raise ConfigError(f"--{what} {text!r} must be min:max in {unit}") from None
    return a, b


def write_info(path: str, info: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(info, fh, indent=2)
        fh.write("\n")


def binned_rate(
    weighter: FluxWeighter,
    edges_gev: np.ndarray,
    zenith_rad: tuple[float, float],
    *,
    area: str = "perpendicular",
    points: int = 24,
) -> np.ndarray:
    """The model's rate in 1/(m^2 s) in each energy bin (Gauss-Legendre in ln E per bin,
    summed over all the model's elements), for plots against a weighted sample."""
    x, w = np.polynomial.legendre.leggauss(points)
    if area == "perpendicular":
        omega = solid_angle(zenith_rad)
    else:
        omega = math.pi * (math.sin(zenith_rad[1]) ** 2 - math.sin(zenith_rad[0]) ** 2)
    lo, hi = np.log(edges_gev[:-1]), np.log(edges_gev[1:])
    half = 0.5 * (hi - lo)
    log_e = (0.5 * (hi + lo))[:, None] + half[:, None] * x[None, :]  # (bins, points)
    energy = np.exp(log_e)
    flux = sum(weighter.group_flux(g, energy.ravel()) for g in range(len(weighter.masses)))
    integrand = (energy.ravel() * flux).reshape(energy.shape)
    return omega * half * (integrand @ w)
