"""Generating bundles for given primaries, in batches on a device, back in physical units.

Primaries come from event files (their muons are ignored) or from a grid spec::

    energy=1e5:1e8:4,zenith=0:1.2:3,mass=1,4,56,depth=1500,2500,count=100

A key starts a list; items after it without ``=`` extend that list. ``a:b:n`` is n values
from a to b inclusive: log-spaced for energy, linear otherwise. Units: energy GeV, zenith
rad (0 = vertically down-going), mass number A, vertical depth m. The grid is the product of
the four lists; ``count`` (default 1) events are generated at each point.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from muongen import schema
from muongen.data.batch import RaggedBatch
from muongen.devices import resolve_device  # noqa: F401 (re-exported for callers)
from muongen.errors import ConfigError

GRID_KEYS = ("energy", "zenith", "mass", "depth")
GRID_EXAMPLE = "energy=1e5:1e8:4,zenith=0:1.2:3,mass=1,4,56,depth=1500,2500,count=100"
FORMAT_NAMES = {
    "v1": schema.FORMAT_V1,
    "v2": schema.FORMAT_V2,
    "hdf5": schema.FORMAT_HDF5,
    **{f: f for f in schema.FORMATS},
}


def _grid_error(spec: str, why: str) -> ConfigError:
    return ConfigError(f"grid spec {spec!r}: {why}; syntax example: {GRID_EXAMPLE}")


def _grid_values(spec: str, key: str, items: list[str]) -> np.ndarray:
    if len(items) == 1 and ":" in items[0]:
        parts = items[0].split(":")
        if len(parts) != 3:
            raise _grid_error(spec, f"{key}={items[0]} must be start:stop:n")
        try:
            a, b, n = float(parts[0]), float(parts[1]), int(parts[2])
        except ValueError:
            raise _grid_error(spec, f"{key}={items[0]} must be numbers start:stop:n") from None
        if n < 1:
            raise _grid_error(spec, f"{key}={items[0]}: n must be >= 1")
        if key == "energy":
            if a <= 0 or b <= 0:
                raise _grid_error(spec, "energies must be > 0 GeV")
            return np.geomspace(a, b, n)
        return np.linspace(a, b, n)
    try:
        return np.array([float(t) for t in items], dtype=np.float64)
    except ValueError:
        raise _grid_error(spec, f"{key} values {','.join(items)} must be numbers") from None


def parse_grid(spec: str) -> np.ndarray:
    """Grid spec (see the module docstring) -> physical conditions (B, 4) float64
    [E GeV, zenith rad, A, depth m], each grid point repeated ``count`` times."""
    lists: dict[str, list[str]] = {}
    key = None
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            raise _grid_error(spec, "empty item (two commas in a row?)")
        if "=" in item:
            key, _, value = (s.strip() for s in item.partition("="))
            key = key.lower()
            if key not in (*GRID_KEYS, "count"):
                raise _grid_error(spec, f"unknown key {key!r}; keys: {', '.join(GRID_KEYS)}, count")
            if key in lists:
                raise _grid_error(spec, f"{key} given twice")
            lists[key] = [value]
        elif key is None:
            raise _grid_error(spec, f"{item!r} comes before any key=")
        else:
            lists[key].append(item)
    missing = [k for k in GRID_KEYS if k not in lists]
    if missing:
        raise _grid_error(spec, f"missing {', '.join(missing)}")
    count = 1
    if "count" in lists:
        try:
            (count,) = (int(t) for t in lists["count"])
        except ValueError:
            raise _grid_error(spec, "count must be one integer") from None
        if count < 1:
            raise _grid_error(spec, "count must be >= 1")
    energy, zenith, mass, depth = (_grid_values(spec, k, lists[k]) for k in GRID_KEYS)
    checks = [
        ("energy", energy > 0, "> 0 GeV"),
        ("zenith", (zenith >= 0) & (zenith <= math.pi), "in [0, pi] rad"),
        ("mass", mass >= 1, ">= 1 (a mass number A)"),
        ("depth", depth > 0, "> 0 m"),
    ]
    for name, ok, why in checks:
        if not np.all(ok):
            raise _grid_error(spec, f"{name} values must be {why}")
    grid = np.stack(np.meshgrid(energy, zenith, mass, depth, indexing="ij"), -1).reshape(-1, 4)
    return np.repeat(grid, count, axis=0)


def parse_depths(text: str) -> np.ndarray:
    """``1500`` / ``1500,2000`` / ``1000:2800:100`` (n linearly spaced) -> depths (D,) in m."""
    values = _grid_values(text, "depth", [t.strip() for t in text.split(",")])
    if values.size == 0 or not np.all(values > 0):
        raise ConfigError(f"--depths {text!r}: depths must be > 0 m, e.g. 1500 or 1000:2800:10")
    return values


def read_inputs(patterns: list[str] | str, max_events: int | None = None) -> RaggedBatch:
    """Events of every file matching ``patterns`` (files, folders, globs; sorted), in
    physical units, stopping after ``max_events``."""
    from muongen.data.reader import read_events
    from muongen.storage.files import expand_inputs

    parts, n = [], 0
    for url in expand_inputs(patterns):
        left = None if max_events is None else max_events - n
        if left is not None and left <= 0:
            break
        batch = read_events(url, max_events=left)
        parts.append(batch)
        n += batch.n_events
    return RaggedBatch.concat(parts)


def representation_of(generator: torch.nn.Module) -> str:
    """The muon representation of a generator, also when wrapped (DDP, torch.compile)."""
    module = generator
    for _ in range(3):
        if hasattr(module, "representation"):
            return module.representation
        module = getattr(module, "module", None) or getattr(module, "_orig_mod", None)
        if module is None:
            break
    raise AttributeError("the generator has no .representation (xy or radial)")


@torch.inference_mode()
def generate(
    generator: torch.nn.Module,
    conditions: np.ndarray | torch.Tensor,
    *,
    device: torch.device | str | None = None,
    batch_events: int = 4096,
    seed: int = 0,
    counts: torch.Tensor | None = None,
) -> RaggedBatch:
    """Bundles for physical ``conditions`` (B, 4), generated ``batch_events`` at a time;
    with ``counts`` (B,) the bundles hold those numbers of muons (the generator's muons
    alone, without its multiplicity head).

    The noise comes from a private RNG seeded with ``seed`` (the global RNGs are not
    touched, so calling this during training changes nothing there), and the generator's
    train/eval mode is restored afterwards.

    Returns:
        RaggedBatch on the CPU in physical units (muons [E, x, y]; for the radial
        representation the azimuth is drawn uniformly), conditions as given.
    """
    if device is None:
        device = next(generator.parameters()).device
    device = torch.device(device)
    if isinstance(conditions, torch.Tensor):
        cond_all = conditions.detach().to("cpu", torch.float32).reshape(-1, 4)
    else:
        cond_all = torch.as_tensor(np.asarray(conditions, dtype=np.float32)).reshape(-1, 4)
    rng = torch.Generator(device=device)
    rng.manual_seed(seed)
    representation = representation_of(generator)
    was_training = generator.training
    generator.eval()
    given = None if counts is None else torch.as_tensor(counts, dtype=torch.int64).reshape(-1)
    muons, counts = [], []
    try:
        for start in range(0, len(cond_all), max(batch_events, 1)):
            cond = cond_all[start : start + batch_events].to(device)
            if given is None:
                feat, n, _ = generator(schema.condition_features(cond), generator=rng)
            else:
                n = given[start : start + batch_events].to(device)
                feat = generator.generate_with_counts(
                    schema.condition_features(cond), n, generator=rng
                )
            phys = schema.muon_physical(feat.float(), representation, generator=rng)
            muons.append(phys.cpu())
            counts.append(n.cpu())
    finally:
        generator.train(was_training)
    if not counts:
        return RaggedBatch(
            cond_all, torch.zeros(0, schema.N_MUON), torch.zeros(0, dtype=torch.int64)
        )
    return RaggedBatch(cond_all, torch.cat(muons), torch.cat(counts))


@dataclass
class Throughput:
    """How fast bundles were generated (host time including the copies back)."""

    events: int
    muons: int
    seconds: float
    device: str

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else float("nan")

    @property
    def muons_per_s(self) -> float:
        return self.muons / self.seconds if self.seconds > 0 else float("nan")

    def as_dict(self) -> dict[str, float | int | str]:
        return {**asdict(self), "events_per_s": self.events_per_s, "muons_per_s": self.muons_per_s}

    def line(self) -> str:
        return (
            f"generated {self.events:,} events, {self.muons:,} muons in {self.seconds:.2f} s on "
            f"{self.device}: {self.events_per_s:,.0f} events/s, {self.muons_per_s:,.0f} muons/s"
        )


def timed_generate(generator, conditions, **kw) -> tuple[RaggedBatch, Throughput]:
    """:func:`generate` plus its :class:`Throughput` (synchronised on CUDA)."""
    device = torch.device(kw.get("device") or next(generator.parameters()).device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    batch = generate(generator, conditions, **kw)
    seconds = time.perf_counter() - t0
    return batch, Throughput(batch.n_events, batch.n_muons, seconds, str(device))


def split_draws(
    generator: torch.nn.Module,
    conditions: torch.Tensor,
    *,
    device: torch.device | str | None = None,
    batch_events: int = 4096,
    seed: int = 0,
):
    """``draw(index, split)`` for :meth:`muongen.evaluate.floors.Yardstick.measure_draws`:
    the generator's events for the primaries ``conditions[index]`` (B, 4, physical), as an
    EventSample with exactly those conditions, from a seed of each split's own (derived
    from ``seed`` and the split; none equals ``seed`` itself, the single draw's)."""
    from muongen.evaluate.features import EventSample

    physical = conditions.detach().cpu().numpy().astype(np.float64)

    def draw(index: np.ndarray, split: int):
        split_seed = int(np.random.SeedSequence([seed, split + 1]).generate_state(1)[0])
        batch = generate(
            generator,
            conditions[torch.as_tensor(index)],
            device=device,
            batch_events=batch_events,
            seed=split_seed,
        )
        return EventSample.from_arrays(physical[index], batch.muons.numpy(), batch.counts.numpy())

    return draw


def write_sample(
    path: str,
    batch: RaggedBatch,
    fmt: str,
    *,
    seed: int = 0,
    minor: np.ndarray | None = None,
    weights: np.ndarray | None = None,
) -> None:
    """Write generated events in a production schema; v1 and HDF5 get shower ids
    (major = seed, minor = ``minor``, default the row number).

    ``weights`` (B,) go beside the events: a float64 ``weight`` column in Parquet (readers
    that want only the production columns ignore it), a ``weights`` dataset in HDF5.
    """
    import os

    from muongen.data.writers import parquet_table, write_events

    fmt = FORMAT_NAMES.get(fmt, fmt)
    if fmt not in schema.FORMATS:
        raise ConfigError(f"unknown output format {fmt!r}; use v1, v2 or hdf5")
    n = batch.n_events
    minor = np.arange(n) if minor is None else np.asarray(minor)
    ids = (np.full(n, seed, dtype=np.uint64), minor.astype(np.uint64))
    ids = None if fmt == schema.FORMAT_V2 else ids
    if weights is None:
        write_events(path, batch, fmt, ids=ids)
        return
    weights = np.asarray(weights, dtype=np.float64)
    if weights.shape != (n,):
        raise ValueError(f"weights must be ({n},), got {weights.shape}")
    if fmt == schema.FORMAT_HDF5:
        import h5py

        write_events(path, batch, fmt, ids=ids)
        with h5py.File(path, "a") as h5:
            h5.create_dataset("weights", data=weights)
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = parquet_table(batch, fmt, ids=ids).append_column("weight", pa.array(weights))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_weights(path: str) -> np.ndarray:
    """The per-event weights written by :func:`write_sample` (local files)."""
    if path.endswith((".h5", ".hdf5", ".hdf")):
        import h5py

        with h5py.File(path, "r") as h5:
            return np.asarray(h5["weights"][:], dtype=np.float64)
    import pyarrow.parquet as pq

    return pq.read_table(path, columns=["weight"]).column("weight").to_numpy()
