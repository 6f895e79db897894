"""Periodic validation during training: a few key distances and their ratios to the floor.

The held-out events are read and split into halves A and B once; the floor (A vs B,
averaged over several random splits for a steady denominator) is computed once. Each
:meth:`Validator.run` generates for B's primaries with a fixed seed (so changes between
runs come from the model, not the noise) and compares with A. The global RNGs and the
generator's train/eval mode are left as they were, so validation does not change training.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
from matplotlib.figure import Figure

from muongen.config import Config
from muongen.errors import ConfigError
from muongen.evaluate import plots
from muongen.evaluate.features import EventSample, shower_groups
from muongen.evaluate.floors import ratio, split_halves
from muongen.evaluate.metrics import compute_metrics, standardiser
from muongen.evaluate.sample import generate, read_inputs

log = logging.getLogger(__name__)

#: The metrics logged every validation.
KEY_METRICS = (
    "multiplicity",
    "muon_log10_energy",
    "muon_radius",
    "event_log10_total_energy",
    "frechet_event",
)


class Validator:
    """Evaluates a generator on held-out files every ``logging.val_every`` steps.

    Args:
        paths: held-out files, folders or globs (``cfg.data.val_paths``).
        cfg: the run's config: ``logging.val_events`` events are used, generated
            ``data.batch_events`` at a time.
        device: where the generator runs.
        seed: seeds the split and the generation noise (the same every run).
        floor_splits: random splits the floor is averaged over.
    """

    def __init__(
        self,
        paths: list[str] | str,
        cfg: Config,
        device: torch.device | str,
        *,
        seed: int = 0,
        floor_splits: int = 5,
    ) -> None:
        batch = read_inputs(paths, cfg.logging.val_events or None)
        if batch.n_events < 4:
            raise ConfigError(
                f"validation files {paths} hold {batch.n_events} events; at least 4 are needed "
                "(set data.val_paths to held-out files, or logging.val_every=0)"
            )
        real = EventSample.from_batch(batch)
        real = real.with_groups(shower_groups(real.conditions))
        rng = np.random.default_rng(seed)
        self.scale = standardiser(real)
        floors = []
        for _ in range(max(floor_splits, 1)):
            ia, ib = split_halves(real.n_events, rng, real.groups)
            floors.append(
                compute_metrics(real.take(ia), real.take(ib), scale=self.scale, names=KEY_METRICS)
            )
        # the last split is the one the model is compared on
        self.reference, self.other = real.take(ia), real.take(ib)
        self.floor = {m: float(np.nanmean([f[m] for f in floors])) for m in KEY_METRICS}
        self.conditions = torch.from_numpy(self.other.conditions.astype(np.float32))
        self.device = torch.device(device)
        self.batch_events = cfg.data.batch_events
        self.seed = seed
        log.info(
            "validation: %d held-out events (%d muons), %d per half",
            real.n_events,
            real.n_muons,
            self.reference.n_events,
        )

    def run(
        self, generator: torch.nn.Module, step: int
    ) -> tuple[dict[str, float], dict[str, Figure]]:
        """Generate for half B and compare with half A.

        Returns:
            scalars: ``<metric>``, ``<metric>_ratio`` (to its floor), ``max_ratio`` and
                ``seconds`` (the trainer logs them under ``val/``);
            figures: ``features`` (histograms with ratio panels) and
                ``multiplicity_vs_energy`` (the caller logs and closes them).
        """
        t0 = time.perf_counter()
        fake_batch = generate(
            generator,
            self.conditions,
            device=self.device,
            batch_events=self.batch_events,
            seed=self.seed,
        )
        fake = EventSample.from_arrays(
            self.other.conditions, fake_batch.muons.numpy(), fake_batch.counts.numpy()
        )
        values = compute_metrics(self.reference, fake, scale=self.scale, names=KEY_METRICS)
        scalars: dict[str, float] = {}
        ratios = []
        for m, v in values.items():
            r = ratio(v, self.floor[m])
            scalars[m] = v
            scalars[f"{m}_ratio"] = r
            ratios.append(r)
        finite = [r for r in ratios if np.isfinite(r)]
        scalars["max_ratio"] = max(finite) if finite else float("nan")
        figures = {
            "features": plots.feature_histograms(self.other, {f"model step {step}": fake}),
            "multiplicity_vs_energy": plots.multiplicity_vs_energy(self.other, {"model": fake}),
        }
        scalars["seconds"] = time.perf_counter() - t0
        return scalars, figures
