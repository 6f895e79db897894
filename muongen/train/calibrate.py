"""``train.calibrate_rows``: the finished generator's muon energies mapped onto the
training data's, at the end of a run (the map: :mod:`muongen.model.calibration`).

A trainer part: the map is saved in the checkpoint written when the run finishes, and
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


class EnergyCalibrationPart:
    """The map fitted at the end of the run ({} before), under ``energy_calibration``."""

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
) -> dict[str, Any]:
    """The calibration state of ``generator`` (physical in, as the sampler) on the first
    ``rows`` rows of ``files``; {} when they hold no muons. ``depth_bins`` > 1 also splits
    the classes by depth quantile. Logs what it did."""
    from muongen.evaluate.sample import generate

    t0 = time.perf_counter()
    real = read_rows(files, rows, strict)
    if real is None or real.n_muons == 0:
        log.warning("energy calibration: no muons in the training files read; no map")
        return {}
    fake = generate(generator, real.conditions, device=device, seed=seed)

    def parts(batch):
        feat = schema.condition_features(batch.conditions.double()).numpy()
        log_e = np.log10(batch.muons[:, 0].double().numpy() / schema.ENERGY_SCALE_GEV)
        return feat[:, 0], log_e, batch.counts.numpy(), feat[:, 3], feat[:, 2]

    data, model = parts(real), parts(fake)
    state = calibration.fit(data, model, n_depth_bins=depth_bins)
    mapped = calibration.EnergyCalibration(state).double()
    per_muon = [torch.as_tensor(np.repeat(a, model[2])) for a in (model[2], *model[3:], model[0])]
    n, depth, log_a, log_e0 = per_muon
    after = mapped(torch.as_tensor(model[1]), n, log_e0, depth, log_e0 - log_a).numpy()
    log.info(
        "energy calibration: %s in %.1f s; the pooled muon log10 E's W1 to the training "
        "muons: %.4f dex before, %.4f after",
        mapped.describe(),
        time.perf_counter() - t0,
        _w1(model[1], data[1]),
        _w1(after, data[1]),
    )
    return state
