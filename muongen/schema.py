"""The on-disk event formats and the feature transforms, in one place.

Formats (facts from the IceCube producer; real production files must load):

* Parquet v1: ``primary_major_id`` uint64, ``primary_minor_id`` uint64,
  ``primary`` list<float32>[4] = [E GeV, zenith rad, A, depth m],
  ``muons`` list<list<float32>[3]> = per muon [E GeV, x m, y m].
* Parquet v2: ``primary`` as v1, ``muons`` list<list<float32>[4]> = [E GeV, r m, x m, y m];
  no id columns; empty rows may have been dropped by the producer.
* HDF5: ``primaries`` float32 [N, 7] = [major, minor, E, zenith, A, time, depth];
  ``muons`` float32 [M, 6] = [major, minor, E, x, y, time]; ``counts`` int32 [N].
  An event without muons was written as ONE dummy muon of zeros with count 1.

In memory (:class:`muongen.data.batch.RaggedBatch`) everything is in physical units in a
canonical layout: conditions [B, 4] = [E, zenith, A, depth], muons [N, 3] = [E, x, y].
The model sees features; the transforms below map between the two and are exact inverses.
"""

from __future__ import annotations

import math
from typing import Literal, TypeVar

import numpy as np
import torch

FORMAT_V1 = "parquet-v1"
FORMAT_V2 = "parquet-v2"
FORMAT_HDF5 = "hdf5"
FORMATS = (FORMAT_V1, FORMAT_V2, FORMAT_HDF5)
SCHEMA_VERSION = 1  # of the in-memory canonical layout and feature transforms

#: The 100 vertical depths (m) Muonitron propagates every shower to.
PRODUCTION_DEPTHS_M = np.linspace(1000.0, 2800.0, 100, dtype=np.float64)

CONDITION_COLUMNS = ("energy", "zenith", "mass", "depth")  # GeV, rad, A, m
MUON_COLUMNS = ("energy", "x", "y")  # GeV, m, m
N_CONDITION = 4
N_MUON = 3

ENERGY_SCALE_GEV = 1e6
POSITION_SCALE_M = 500.0
DEPTH_SCALE_M = 1000.0

Representation = Literal["xy", "radial"]
REPRESENTATIONS = ("xy", "radial")

Array = TypeVar("Array", np.ndarray, torch.Tensor)


def _lib(x):
    return torch if isinstance(x, torch.Tensor) else np


def _stack(cols, like):
    return torch.stack(cols, dim=-1) if isinstance(like, torch.Tensor) else np.stack(cols, -1)


def condition_features(cond: Array) -> Array:
    """Physical conditions (B, 4) -> features (B, 4).

    [log10(E / 1e6 GeV), cos(zenith), log10(A), depth / 1000 m]
    """
    lib = _lib(cond)
    return _stack(
        [
            lib.log10(cond[..., 0] / ENERGY_SCALE_GEV),
            lib.cos(cond[..., 1]),
            lib.log10(cond[..., 2]),
            cond[..., 3] / DEPTH_SCALE_M,
        ],
        cond,
    )


def condition_physical(feat: Array) -> Array:
    """Inverse of :func:`condition_features`: features (B, 4) -> physical (B, 4)."""
    lib = _lib(feat)
    cos_z = feat[..., 1].clamp(-1.0, 1.0) if lib is torch else np.clip(feat[..., 1], -1.0, 1.0)
    return _stack(
        [
            ENERGY_SCALE_GEV * 10.0 ** feat[..., 0],
            lib.arccos(cos_z),
            10.0 ** feat[..., 2],
            feat[..., 3] * DEPTH_SCALE_M,
        ],
        feat,
    )


def muon_feature_dim(representation: Representation) -> int:
    """Number of per-muon features the model sees for a representation."""
    return {"xy": 3, "radial": 2}[_check_rep(representation)]


def _check_rep(representation: str) -> str:
    if representation not in REPRESENTATIONS:
        raise ValueError(
            f"unknown muon representation {representation!r}; use one of {REPRESENTATIONS}"
        )
    return representation


def muon_features(muons: Array, representation: Representation = "xy") -> Array:
    """Physical muons (N, 3) = [E, x, y] -> features (N, F).

    ``xy``: [log10(E / 1e6 GeV), x / 500 m, y / 500 m] (the original trainer's).
    ``radial``: [log10(E / 1e6 GeV), r / 500 m]; the azimuth is uniform by construction
    and is drawn at generation (:func:`muon_physical`).
    """
    lib = _lib(muons)
    log_e = lib.log10(muons[..., 0] / ENERGY_SCALE_GEV)
    if _check_rep(representation) == "xy":
        return _stack(
            [log_e, muons[..., 1] / POSITION_SCALE_M, muons[..., 2] / POSITION_SCALE_M], muons
        )
    r = lib.hypot(muons[..., 1], muons[..., 2])
    return _stack([log_e, r / POSITION_SCALE_M], muons)


def muon_physical(
    feat: Array,
    representation: Representation = "xy",
    *,
    phi: Array | None = None,
    generator: torch.Generator | np.random.Generator | None = None,
) -> Array:
    """Inverse of :func:`muon_features`: features (N, F) -> physical (N, 3) = [E, x, y].

    For ``radial``, the azimuth ``phi`` (N,) is drawn uniformly in [0, 2 pi) unless given;
    x = r sin(phi), y = r cos(phi) as the producer defines them.
    """
    lib = _lib(feat)
    energy = ENERGY_SCALE_GEV * 10.0 ** feat[..., 0]
    if _check_rep(representation) == "xy":
        return _stack(
            [energy, feat[..., 1] * POSITION_SCALE_M, feat[..., 2] * POSITION_SCALE_M], feat
        )
    r = (
        feat[..., 1].abs() * POSITION_SCALE_M
        if lib is torch
        else np.abs(feat[..., 1]) * POSITION_SCALE_M
    )
    if phi is None:
        if lib is torch:
            u = torch.rand(r.shape, generator=generator, device=r.device, dtype=r.dtype)
        else:
            rng = (
                generator if isinstance(generator, np.random.Generator) else np.random.default_rng()
            )
            u = rng.random(r.shape).astype(r.dtype)
        phi = u * (2.0 * math.pi)
    return _stack([energy, r * lib.sin(phi), r * lib.cos(phi)], feat)
