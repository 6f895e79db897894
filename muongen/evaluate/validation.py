"""Periodic validation during training: the evaluation's ratios to floor on held-out files.

The held-out events are read once and split ``n_splits`` times into halves A and B; the
floors of every metric, overall and in condition bins, are computed once (a
:class:`~muongen.evaluate.floors.Yardstick`, as ``muongen evaluate`` uses). Each
:meth:`Validator.run` generates for the held-out primaries with a fixed seed (so changes
between runs come from the model, not the noise) and measures the model against every
split. Its score (:func:`validation_score`: the mean of the median ratio and the worst
ratio over all overall and binned metrics) is the number the trainer keeps its best
checkpoint by (:func:`is_better`). The global RNGs and the generator's train/eval mode are
left as they were, so validation does not change training.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure

from muongen.config import Config
from muongen.errors import ConfigError
from muongen.evaluate import plots
from muongen.evaluate.features import EventSample, shower_groups
from muongen.evaluate.floors import Yardstick, default_bins
from muongen.evaluate.sample import generate, read_inputs, split_draws

log = logging.getLogger(__name__)

#: The metrics logged one by one every validation (all of them enter the median ratio).
KEY_METRICS = (
    "multiplicity",
    "muon_log10_energy",
    "muon_radius",
    "event_log10_total_energy",
    "frechet_event",
)
#: The validation scalar the best checkpoint is chosen by (lower is better).
BEST_BY = "score"
#: The most a worst ratio counts in the score: a metric without model output (an infinite
#: ratio) counts as this, so such a checkpoint can still be ranked, below any with output.
SCORE_WORST_CAP = 10.0


def validation_score(summary: dict[str, Any]) -> float:
    """The validation's score: (median ratio + worst ratio) / 2, from a
    :func:`~muongen.evaluate.floors.ratio_summary` (lower is better; NaN without a median).

    The median over all overall and binned metrics follows the bulk: issue 52's runs were
    at the floor there (0.99-1.07) while their worst bins, the most energetic and richest
    bundles, ranged from 1.6x to 3.5x; a checkpoint chosen by the median alone may be one
    whose tail misses. The worst alone is one extreme of ~100 noisy ratios (a perfect
    generator's is ~1.6) and would pick noise, so the two count equally: a step of 0.1 in
    the median weighs as much as one of 0.1 in the worst. The worst is taken over the
    metrics whose floor is known (``worst_ratio_certain``; all of them when none is), so a
    bin of a few events with an uncertain floor does not decide, and it counts at most
    :data:`SCORE_WORST_CAP` (a metric without model output counts that much), or the median
    where that is larger (the score is never below the median).
    """
    median = summary.get("median_ratio")
    if median is None or not math.isfinite(median):
        return float("nan")
    worst = summary.get("worst_ratio_certain") if summary.get("n_floor_certain") else None
    if worst is None or math.isnan(worst):
        worst = summary.get("worst_ratio")
    if worst is None or math.isnan(worst):
        worst = median
    return (median + min(worst, max(SCORE_WORST_CAP, median))) / 2


def is_better(value: float, best: float | None) -> bool:
    """Whether a validation's score (:data:`BEST_BY`) beats the best so far (None: none yet).

    NaN is never better (no floor, or a model without output everywhere); a finite value
    beats no value, and otherwise only a strictly smaller one wins, so ties keep the earlier
    (cheaper) checkpoint.
    """
    if value is None or not math.isfinite(value):
        return False
    return best is None or not math.isfinite(best) or value < best


class BestCheckpoint:
    """Keeps the checkpoint with the best validation (lowest ``score``) as
    ``<checkpoint dir>/best.pt`` + ``best.json``: a trainer part, so the best value so far
    travels in every checkpoint and a resumed run only replaces the best with a better one.

    A fresh start removes a ``best`` left by an earlier run in the folder; a resume removes
    one that is not in the resumed run's past (written after the checkpoint resumed from).
    """

    NAME = "best"
    follows_data = False  # the held-out files, not the training input, define it

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.value: float | None = None
        self.step: int | None = None

    def offer(self, scalars: dict[str, float] | None) -> bool:
        """Whether a validation's scalars beat the best so far (None: no validation here)."""
        return scalars is not None and is_better(scalars.get(BEST_BY), self.value)

    def accept(self, scalars: dict[str, float], step: int) -> None:
        """Record this validation at ``step`` as the best, before the state is saved with it."""
        self.value, self.step = float(scalars[BEST_BY]), int(step)

    def save(self, state: dict[str, Any], *, range_name: str | None = None) -> None:
        """Write ``state`` (the trainer's, gathered after :meth:`accept`) as the best."""
        from muongen import checkpoint as fmt

        saved = fmt.save(state, self.dir, self.NAME, step=self.step, range_name=range_name)
        log.info("best checkpoint %s (step %d, %s %.3g)", saved.pt, self.step, BEST_BY, self.value)

    def state_dict(self) -> dict[str, Any]:
        return {BEST_BY: self.value, "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value, self.step = state.get(BEST_BY), state.get("step")
        if BEST_BY not in state and "median_ratio" in state:
            # a run from before the score: its best was chosen by another number, so the
            # next validation's score replaces it (the best.* files stay until then)
            log.info(
                "the best checkpoint so far was chosen by the median ratio: the next "
                "validation, scored by its %s, replaces it",
                BEST_BY,
            )
        manifest = self.dir / f"{self.NAME}.json"
        if manifest.exists():
            from muongen import checkpoint as fmt

            try:
                step = fmt.read_manifest(manifest).get("step")
            except Exception:  # a broken manifest is no best checkpoint either
                step = None
            if step != self.step:
                log.warning("removing %s: not the best of the run continued here", manifest)
                fmt.remove(manifest)

    def reset(self) -> None:
        self.value = self.step = None
        for suffix in (".json", ".pt"):  # manifest first: a half-removed pair is never trusted
            (self.dir / f"{self.NAME}{suffix}").unlink(missing_ok=True)


class Validator:
    """Evaluates a generator on held-out files every ``logging.val_every`` steps.

    Args:
        paths: held-out files, folders or globs (``cfg.data.val_paths``).
        cfg: the run's config: ``logging.val_events`` events are used, generated
            ``data.batch_events`` at a time.
        device: where the generator runs.
        seed: seeds the splits and the generation noise (the same every run).
        n_splits: random splits the floors and the model's values are averaged over.
    """

    def __init__(
        self,
        paths: list[str] | str,
        cfg: Config,
        device: torch.device | str,
        *,
        seed: int = 0,
        n_splits: int = 4,
    ) -> None:
        batch = read_inputs(paths, cfg.logging.val_events or None)
        if batch.n_events < 4:
            raise ConfigError(
                f"validation files {paths} hold {batch.n_events} events; at least 4 are needed "
                "(set data.val_paths to held-out files, or logging.val_every=0)"
            )
        real = EventSample.from_batch(batch)
        self.real = real.with_groups(shower_groups(real.conditions))
        # exact W1: the grid's bins come from the held-out muons, and a model's outliers
        # beyond them would be clipped
        self.stick = Yardstick(
            self.real, bins=default_bins(self.real), n_splits=n_splits, seed=seed, baseline=False
        )
        # overall floors of the logged metrics (means over the splits)
        self.floor = {m: float(np.nanmean(self.stick.floor["overall"][m])) for m in KEY_METRICS}
        self.conditions = torch.from_numpy(self.real.conditions.astype(np.float32))
        self.device = torch.device(device)
        self.batch_events = cfg.data.batch_events
        self.seed = seed
        log.info(
            "validation: %d held-out events (%d muons), %d splits",
            self.real.n_events,
            self.real.n_muons,
            n_splits,
        )

    def run(
        self, generator: torch.nn.Module, step: int
    ) -> tuple[dict[str, float], dict[str, Figure]]:
        """Generate for the held-out primaries (anew for each split's half, and once for
        all of them for the figures) and measure against every split.

        Returns:
            scalars: ``<metric>`` and ``<metric>_ratio`` (to its floor) of KEY_METRICS,
                ``median_ratio`` and ``worst_ratio`` over all overall and binned metrics
                (as ``muongen evaluate`` reports them; a metric without model output counts
                as infinite), ``worst_ratio_certain`` (over the metrics whose floor is
                known), ``score`` (:func:`validation_score`, what the best checkpoint is
                chosen by), ``<tail>_median_ratio`` and ``<tail>_worst_ratio`` of the tail
                subsets (top_energy_decade, rich_bundles: NaN where too few events),
                ``max_ratio`` (the worst of KEY_METRICS) and ``seconds``;
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
            self.real.conditions, fake_batch.muons.numpy(), fake_batch.counts.numpy()
        )
        # measured as `muongen evaluate` does: generated anew for each split's half
        draw = split_draws(
            generator,
            self.conditions,
            device=self.device,
            batch_events=self.batch_events,
            seed=self.seed,
        )
        result = self.stick.result({"model": self.stick.measure_draws(draw)})
        scalars: dict[str, float] = {}
        for m in KEY_METRICS:
            scalars[m] = result["overall"][m]["model"]
            scalars[f"{m}_ratio"] = result["overall"][m]["model_ratio"]
        finite = [scalars[f"{m}_ratio"] for m in KEY_METRICS]
        finite = [r for r in finite if math.isfinite(r)]
        scalars["max_ratio"] = max(finite) if finite else float("nan")
        summary = result["summary"]
        scalars["median_ratio"] = summary["median_ratio"]
        scalars["worst_ratio"] = summary["worst_ratio"]
        scalars["worst_ratio_certain"] = summary["worst_ratio_certain"]
        scalars["score"] = validation_score(summary)
        for name, row in summary.get("tail", {}).items():
            scalars[f"{name}_median_ratio"] = row["median_ratio"]
            scalars[f"{name}_worst_ratio"] = row["worst_ratio"]
        figures = {
            "features": plots.feature_histograms(self.real, {f"model step {step}": fake}),
            "multiplicity_vs_energy": plots.multiplicity_vs_energy(self.real, {"model": fake}),
        }
        scalars["seconds"] = time.perf_counter() - t0
        return scalars, figures
