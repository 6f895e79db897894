"""The trainer's periodic validation."""

from __future__ import annotations

import math

import pytest
import torch
from matplotlib.figure import Figure

from muongen.errors import ConfigError
from muongen.evaluate.validation import (
    KEY_METRICS,
    SCORE_WORST_CAP,
    Validator,
    is_better,
    validation_score,
)


def test_validator_scalars_and_figures(held_out, tiny_config, tiny_generator):
    v = Validator([str(held_out)], tiny_config, "cpu")
    assert all(v.floor[m] > 0 for m in KEY_METRICS)
    tiny_generator.train()
    state = torch.get_rng_state()
    scalars, figures = v.run(tiny_generator, step=10)
    assert torch.equal(torch.get_rng_state(), state) and tiny_generator.training
    for m in KEY_METRICS:
        assert scalars[f"{m}_ratio"] == pytest.approx(scalars[m] / v.floor[m])
    assert scalars["max_ratio"] == max(scalars[f"{m}_ratio"] for m in KEY_METRICS)
    # the evaluation's median and worst over every overall and binned metric
    assert 0 < scalars["median_ratio"] <= scalars["worst_ratio"]
    # the score the best checkpoint is chosen by weighs in the worst bin
    median = scalars["median_ratio"]
    assert median <= scalars["score"] <= (median + max(SCORE_WORST_CAP, median)) / 2
    for tail in ("top_energy_decade", "rich_bundles"):
        assert f"{tail}_median_ratio" in scalars and f"{tail}_worst_ratio" in scalars
    assert scalars["multiplicity_ratio"] > 3  # the tiny model's constant 3 muons
    assert set(figures) == {"features", "multiplicity_vs_energy"}
    assert all(isinstance(f, Figure) for f in figures.values())
    again, _ = v.run(tiny_generator, step=20)
    assert again["muon_radius"] == scalars["muon_radius"]  # fixed noise seed
    assert again["median_ratio"] == scalars["median_ratio"]
    assert not math.isnan(again["frechet_event"])


def test_validator_needs_events(tmp_path, tiny_config):
    from muongen.data.batch import RaggedBatch
    from muongen.data.writers import write_events

    path = tmp_path / "two.parquet"
    write_events(
        path, RaggedBatch.from_numpy([[1e6, 0, 1, 1500]] * 2, [[10.0, 1, 1]], [1, 0]), "parquet-v1"
    )
    with pytest.raises(ConfigError, match="at least 4"):
        Validator([str(path)], tiny_config, "cpu")


def test_best_checkpoint_rule():
    assert is_better(1.4, None)  # the first finite value is the best so far
    assert is_better(1.2, 1.4) and not is_better(1.4, 1.2)
    assert not is_better(1.4, 1.4)  # a tie keeps the earlier checkpoint
    assert not is_better(float("nan"), None) and not is_better(float("inf"), 3.0)
    assert is_better(2.0, float("nan"))


def test_best_checkpoint_part_saves_resumes_and_forgets(tmp_path):
    from muongen import checkpoint as fmt
    from muongen.evaluate.validation import BestCheckpoint

    best = BestCheckpoint(tmp_path)
    assert best.offer({"score": 3.0}) and not best.offer(None)
    best.accept({"score": 3.0}, 10)
    best.save({"weights": torch.zeros(2), "best": best.state_dict()})
    assert fmt.read_manifest(tmp_path / "best.json")["step"] == 10
    assert not best.offer({"score": 3.5}) and best.offer({"score": 2.0})
    # a resume keeps the best that belongs to its past and knows its value
    again = BestCheckpoint(tmp_path)
    again.load_state_dict({"score": 3.0, "step": 10})
    assert (tmp_path / "best.json").exists() and not again.offer({"score": 3.0})
    # a best of a run from before the score (chosen by the median ratio) is kept, and the
    # next validation replaces it
    again.load_state_dict({"median_ratio": 1.0, "step": 10})
    assert (tmp_path / "best.json").exists() and again.offer({"score": 3.0})
    # one written after the checkpoint resumed from is not the continued run's: removed
    again.load_state_dict({"score": 4.0, "step": 5})
    assert not (tmp_path / "best.json").exists() and not (tmp_path / "best.pt").exists()
    # a fresh start forgets any best left in the folder
    best.save({"best": best.state_dict()})
    best.reset()
    assert best.value is None and not list(tmp_path.glob("best.*"))


def test_validation_score_is_the_mean_of_median_and_worst():
    """Known answers: (median + worst) / 2, the worst over the metrics whose floor is known
    where there are any, capped; NaN without a median."""
    s = {"median_ratio": 1.0, "worst_ratio": 3.0, "n_floor_certain": 5, "worst_ratio_certain": 2.0}
    assert validation_score(s) == pytest.approx(1.5)
    assert validation_score({**s, "n_floor_certain": 0}) == pytest.approx(2.0)
    assert validation_score({**s, "worst_ratio_certain": math.inf}) == (1 + SCORE_WORST_CAP) / 2
    assert validation_score({**s, "worst_ratio_certain": None}) == pytest.approx(2.0)  # JSON null
    assert math.isnan(validation_score({**s, "median_ratio": float("nan")}))
    assert validation_score({**s, "median_ratio": 12.0, "worst_ratio_certain": 30.0}) == 12.0


def test_the_score_prefers_the_checkpoint_whose_tail_is_at_the_floor():
    """Issue 52's pair of seeds: median 0.99 with a 3.53x worst bin against median 1.03 with
    1.58x. By the median alone the first would be kept; by the score, the second."""
    tail_miss = {"median_ratio": 0.99, "worst_ratio": 3.53}
    even = {"median_ratio": 1.03, "worst_ratio": 1.58}
    assert is_better(tail_miss["median_ratio"], even["median_ratio"])
    assert is_better(validation_score(even), validation_score(tail_miss))
