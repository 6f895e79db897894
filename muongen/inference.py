"""Opening a checkpoint to use its generator: sampling, evaluation, export, inspection.

A checkpoint may be named by a path (a ``.pt``, its ``.json`` manifest, a checkpoint folder)
or by a ``pelican://`` / ``osdf://`` URL of any of them, fetched and sha-checked into a
temporary folder through :mod:`muongen.storage`. This module sits above
:mod:`muongen.checkpoint` (the on-disk format) and :mod:`muongen.storage` (which publishes
and fetches that format), so neither of them imports the other's user.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from muongen.checkpoint import config_of, load, load_module, read_manifest, resolve

log = logging.getLogger(__name__)


@dataclass
class Inference:
    """A checkpoint opened for sampling, evaluation or export."""

    generator: nn.Module
    config: Any
    manifest: Path  # local (a URL's checkpoint is fetched into a temporary folder)
    meta: dict[str, Any]  # the manifest
    domain: dict[str, Any] | None  # the training domain (muongen.domain); None: not recorded
    source: str  # as the user gave it: a path or a pelican:// / osdf:// URL


def is_url(path: str | os.PathLike) -> bool:
    """A checkpoint named by a URL (pelican://, osdf://, https://), fetched to read it."""
    text = str(path)
    return "://" in text and not text.startswith("file://")


def local_copy(path: str | os.PathLike) -> str:
    """A local path for a checkpoint given as a path, a file:// URL or a remote URL (then
    fetched and sha-checked into a temporary folder, see
    :func:`muongen.storage.publish.fetch_for_reading`)."""
    text = str(path)
    if is_url(text):
        from muongen.storage.publish import fetch_for_reading  # only for a URL: pelicanfs

        return fetch_for_reading(text)
    return text[len("file://") :] if text.startswith("file://") else text


def open_for_inference(
    path: str | os.PathLike, device: str | torch.device = "cpu", calibrated: bool = True
) -> Inference:
    """The generator of a checkpoint (.pt, .json, a checkpoint folder, or the URL of any of
    them, fetched and sha-checked through :mod:`muongen.storage`) with its manifest and
    training domain. The generator carries the checkpoint's weight average
    (``optim.ema_decay``) when it has one, else the trained weights; it is in eval mode on
    ``device``. With ``calibrated`` (the default) it carries the checkpoint's energy and
    radius calibrations (``train.calibrate_rows``) when it has them."""
    from muongen.model import build_models
    from muongen.model.ema import inference_weights

    source = str(path)
    manifest = resolve(local_copy(source))
    payload = load(manifest)
    cfg = config_of(payload, manifest)
    generator, _ = build_models(cfg.model)
    weights, what = inference_weights(payload)
    load_module(generator, weights, what, manifest)
    if calibrated and payload.get("energy_calibration"):
        generator.energy_calibration = calibration_of(payload["energy_calibration"], manifest)
        log.info(
            "%s: muon energies calibrated after training (%s)",
            manifest.name,
            generator.energy_calibration.describe(),
        )
    if calibrated and payload.get("radius_calibration"):
        generator.radius_calibration = calibration_of(
            payload["radius_calibration"], manifest, "radius"
        )
        log.info(
            "%s: muon radii calibrated after training (%s)",
            manifest.name,
            generator.radius_calibration.describe(),
        )
    return Inference(
        generator=generator.to(device).eval(),
        config=cfg,
        manifest=manifest,
        meta=read_manifest(manifest),
        domain=payload.get("domain"),
        source=source,
    )


def calibration_of(state: Any, manifest: Path, kind: str = "energy") -> nn.Module:
    """The :mod:`muongen.model.calibration` map of a checkpoint's state: ``kind`` "energy"
    (:class:`~muongen.model.calibration.EnergyCalibration`) or "radius"
    (:class:`~muongen.model.calibration.RadiusCalibration`)."""
    from muongen.errors import CheckpointError
    from muongen.model.calibration import EnergyCalibration, RadiusCalibration

    try:
        return (RadiusCalibration if kind == "radius" else EnergyCalibration)(state)
    except (ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise CheckpointError(
            f"{manifest}: its {kind} calibration cannot be read ({exc}); open it with a "
            "muongen as new as the one that wrote it, or evaluate it uncalibrated "
            "(muongen evaluate --uncalibrated)"
        ) from None


def load_for_inference(path: str | os.PathLike, device: str | torch.device = "cpu"):
    """Generator and config from a checkpoint (see :func:`open_for_inference`).

    Returns:
        (generator in eval mode on ``device``, Config)
    """
    opened = open_for_inference(path, device)
    return opened.generator, opened.config
