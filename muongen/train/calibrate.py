"""``train.calibrate_rows``: the finished generator's muon energies (and, with
``train.calibrate_radius``, its muons' distances to the axis) mapped onto the training
data's, at the end of a run (the maps: :mod:`muongen.model.calibration`).

Trainer parts: the maps are saved in the checkpoint written when the run finishes, and
nowhere else. A run that resumes from a checkpoint trains on, so a map restored with it
would no longer fit its generator: every run starts without one.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch

from muongen import schema
from muongen.errors import InputFileError
from muongen.model import calibration

log = logging.getLogger(__name__)

#: at most this many muons a side in the logged before-and-after distance
_W1_MUONS = 1_000_000


class CalibrationPart:
    """A map fitted at the end of the run ({} before): the trainer keeps the energies' under
    ``energy_calibration`` and the radii's under ``radius_calibration``."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {}

    def state_dict(self) -> dict[str, Any]:
        return dict(self.state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reset()  # the restored generator trains on: its old map no longer fits

    def reset(self) -> None:
        self.state = {}


def read_rows(files: list[str], rows: int, strict: bool):
    """The first ``rows`` valid rows of ``files`` (physical RaggedBatch), file after file;
    an unreadable file is skipped unless ``strict``."""
    from muongen.data.batch import RaggedBatch
    from muongen.data.reader import read_events

    parts, n = [], 0
    for url in files:
        try:
            part = read_events(url, max_events=rows - n)
        except InputFileError:
            if strict:
                raise
            log.warning("energy calibration: %s cannot be read; it is left out", url)
            continue
        parts.append(part)
        n += part.n_events
        if n >= rows:
            break
    return RaggedBatch.concat(parts) if parts else None


def _w1(a: np.ndarray, b: np.ndarray) -> float:
    """evaluate's W1 of two log-energy samples (dex), on an even stride of each side."""
    from muongen.evaluate.metrics import wasserstein_1d

    return wasserstein_1d(a[:: max(1, len(a) // _W1_MUONS)], b[:: max(1, len(b) // _W1_MUONS)])


def fit_on_files(
    generator: torch.nn.Module,
    files: list[str],
    rows: int,
    *,
    device: torch.device | str,
    seed: int,
    strict: bool = True,
    depth_bins: int = 1,
    radius: bool = True,
    zenith_bins: int = 4,
    radius_energy_bins: int = 1,
) -> dict[str, dict[str, Any]]:
    """The calibration states of ``generator`` (physical in, as the sampler) on the first
    ``rows`` rows of ``files``, from one draw for their primaries: {"energy": the muon
    energies' map, "radius": the muons' distances to the axis' (with ``radius``)}; {} when
    the rows hold no muons. ``depth_bins`` > 1 also splits the energy map's classes by
    depth quantile; ``zenith_bins`` and ``radius_energy_bins`` are the radius map's
    quantiles of cos zenith and of log10 E0. Logs what it did."""
    from muongen.evaluate.sample import generate

    t0 = time.perf_counter()
    real = read_rows(files, rows, strict)
    if real is None or real.n_muons == 0:
        log.warning("calibration: no muons in the training files read; no map")
        return {}
    fake = generate(generator, real.conditions, device=device, seed=seed)

    def parts(batch):
        feat = schema.condition_features(batch.conditions.double()).numpy()
        log_e = np.log10(batch.muons[:, 0].double().numpy() / schema.ENERGY_SCALE_GEV)
        return feat, log_e, batch.counts.numpy()

    (d_feat, d_le, d_n), (m_feat, m_le, m_n) = parts(real), parts(fake)
    data = (d_feat[:, 0], d_le, d_n, d_feat[:, 3])
    model = (m_feat[:, 0], m_le, m_n, m_feat[:, 3])
    states = {"energy": calibration.fit(data, model, n_depth_bins=depth_bins)}
    mapped = calibration.EnergyCalibration(states["energy"]).double()
    per_event = (m_n, m_feat[:, 3], m_feat[:, 2], m_feat[:, 0])
    n, depth, log_a, log_e0 = (torch.as_tensor(np.repeat(a, m_n)) for a in per_event)
    after = mapped(torch.as_tensor(m_le), n, log_e0, depth, log_e0 - log_a).numpy()
    log.info(
        "energy calibration: %s in %.1f s; the pooled muon log10 E's W1 to the training "
        "muons: %.4f dex before, %.4f after",
        mapped.describe(),
        time.perf_counter() - t0,
        _w1(m_le, d_le),
        _w1(after, d_le),
    )
    if radius:
        t0 = time.perf_counter()
        states["radius"] = calibration.fit_radius(
            _radii(real, d_feat), _radii(fake, m_feat), zenith_bins, radius_energy_bins
        )
        log.info(
            "radius calibration: %s in %.1f s",
            calibration.RadiusCalibration(states["radius"]).describe(),
            time.perf_counter() - t0,
        )
    return states


def _radii(batch, feat: np.ndarray) -> tuple[np.ndarray, ...]:
    """(cos zenith (B,), log10 r of the muons (N,; -inf on the axis) in the generator's
    feature unit (r / schema.POSITION_SCALE_M, the unit the map is applied in), counts (B,),
    log10 E0 (B,)) for :func:`muongen.model.calibration.fit_radius`."""
    xy = batch.muons[:, 1:3].double().numpy() / schema.POSITION_SCALE_M
    r = np.hypot(xy[:, 0], xy[:, 1])
    with np.errstate(divide="ignore"):
        log_r = np.log10(r)
    return feat[:, 1], log_r, batch.counts.numpy(), feat[:, 0]
