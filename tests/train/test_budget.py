"""train.budget_minutes: the run's length (and the cosine horizon) from its measured step
time, kept across a resume."""

from __future__ import annotations

import re

import pytest

from muongen.config import OptimConfig, TrainConfig
from muongen.train import budget
from muongen.train.budget import StepBudget, steps_that_fit
from muongen.train.trainer import Trainer


def test_steps_that_fit_known_answers():
    # 0.9 x 600 s - 60 s elapsed = 480 s left at 0.5 s a step: 960 more, 1070 -> 1000
    assert steps_that_fit(budget_s=600, elapsed_s=60, seconds_per_step=0.5, steps_done=110) == 1000
    # a budget already spent: the steps done, no fewer
    assert steps_that_fit(budget_s=60, elapsed_s=100, seconds_per_step=0.5, steps_done=110) == 110
    assert steps_that_fit(budget_s=6000, elapsed_s=0, seconds_per_step=0.001, steps_done=0) == (
        5_400_000
    )


class _Step:
    """Records the horizons the budget sets (a GanStep's set_horizon)."""

    def __init__(self) -> None:
        self.horizons: list[int] = []

    def set_horizon(self, steps: int) -> None:
        self.horizons.append(steps)


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _steps(part: StepBudget, clock: _Clock, seconds_per_step: float, first: int, last: int):
    for step in range(first, last + 1):
        clock.t += seconds_per_step
        part.after_step(step)


def _run_probe(part: StepBudget, clock: _Clock, seconds_per_step: float, first: int = 1) -> None:
    _steps(part, clock, seconds_per_step, first, first + budget.PROBE_FROM + budget.PROBE_STEPS - 1)


def test_the_budget_shortens_a_run_that_does_not_fit_and_sets_the_horizon():
    """0.5 s a step against 10 minutes: at step 110 (55 s spent) 0.9 x 600 - 55 = 485 s are
    left, 970 steps: the run ends at 1000 (a multiple of 250), the cosine horizon with it."""
    clock, step = _Clock(), _Step()
    train = TrainConfig(max_steps=14000, budget_minutes=10)
    optim = OptimConfig(schedule="cosine", warmup_steps=200)
    part = StepBudget(train, optim, step, clock)
    _run_probe(part, clock, 0.5)
    assert part.seconds_per_step == pytest.approx(0.5)
    assert part.decided == 1000 and train.max_steps == 1000 and step.horizons == [1000]
    # fast steps: the requested 14000 fit and stay (the horizon too)
    clock, step = _Clock(), _Step()
    train = TrainConfig(max_steps=14000, budget_minutes=30)
    part = StepBudget(train, optim, step, clock)
    _run_probe(part, clock, 0.05)
    assert part.decided == 14000 and train.max_steps == 14000 and step.horizons == [14000]


def test_the_budget_leaves_a_run_alone_when_off_or_given_decay_steps():
    clock, step = _Clock(), _Step()
    train = TrainConfig(max_steps=14000)  # budget_minutes 0: off
    part = StepBudget(train, OptimConfig(schedule="cosine"), step, clock)
    _run_probe(part, clock, 0.5)
    assert part.decided is None and train.max_steps == 14000 and not step.horizons
    # an explicit optim.decay_steps is the user's horizon: only the length changes
    train = TrainConfig(max_steps=14000, budget_minutes=10)
    part = StepBudget(train, OptimConfig(schedule="cosine", decay_steps=9000), step, clock)
    _run_probe(part, clock, 0.5)
    assert train.max_steps < 14000 and not step.horizons


def test_a_resume_keeps_the_decision_and_does_not_measure_again():
    clock, step = _Clock(), _Step()
    optim = OptimConfig(schedule="cosine", warmup_steps=200)
    part = StepBudget(TrainConfig(max_steps=14000, budget_minutes=10), optim, step, clock)
    _run_probe(part, clock, 0.5)
    state = part.state_dict()
    train = TrainConfig(max_steps=14000, budget_minutes=10)
    resumed = StepBudget(train, optim, step, clock)
    resumed.load_state_dict(state)
    assert train.max_steps == 1000 and step.horizons[-1] == 1000
    _run_probe(resumed, clock, 5.0, first=500)  # much slower now: no second decision
    assert train.max_steps == 1000 and resumed.decided == 1000
    # a fresh start forgets it
    resumed.reset()
    assert resumed.decided is None and train.max_steps == 14000


def test_the_checks_move_the_end_with_the_machine_s_pace_up_to_the_steps_asked():
    """Probe at 0.1 s a step against 30 minutes: 14000 steps asked, 16000 would fit, so
    14000 stay. Then each step takes 0.2 s: at the first check (step 1110, 1000 steps
    later) the mean since the probe began (step 10) is 0.191 s (100 x 0.1 + 1000 x 0.2
    over 1100), 1620 - 211 s = 1409 s are left, 7380 more steps: the run ends at 8250,
    the horizon with it. Then each step takes 0.01 s: at the next check (step 2110) the
    mean is 220 s / 2100 steps, 1399 s are left, 15250 steps would fit: the run goes back
    to the 14000 asked, no more."""
    clock, step = _Clock(), _Step()
    train = TrainConfig(max_steps=14000, budget_minutes=30)
    part = StepBudget(train, OptimConfig(schedule="cosine", warmup_steps=200), step, clock)
    _run_probe(part, clock, 0.1)
    assert part.decided == 14000 and step.horizons == [14000]
    _steps(part, clock, 0.2, 111, 1109)
    assert part.decided == 14000  # not a check step yet
    _steps(part, clock, 0.2, 1110, 1110)
    assert part.seconds_per_step == pytest.approx(210 / 1100)
    assert part.decided == 8250 and train.max_steps == 8250 and step.horizons == [14000, 8250]
    _steps(part, clock, 0.01, 1111, 2109)
    assert part.decided == 8250
    _steps(part, clock, 0.01, 2110, 2110)
    assert part.decided == 14000 and train.max_steps == 14000
    assert step.horizons == [14000, 8250, 14000]


def test_a_check_lengthens_only_by_two_multiples_and_shortens_by_any():
    clock, step = _Clock(), _Step()
    train = TrainConfig(max_steps=14000, budget_minutes=30)
    part = StepBudget(train, OptimConfig(schedule="cosine", warmup_steps=200), step, clock)
    _run_probe(part, clock, 0.2)  # 1620 - 22 s at 0.2 s a step: 110 + 7990 -> 8000
    assert part.decided == 8000
    _steps(part, clock, 0.19, 111, 1110)  # one multiple more would fit (8250): kept
    assert part.decided == 8000 and step.horizons == [8000]
    _steps(part, clock, 0.22, 1111, 2110)  # slower: 7912 fit, shortened to 7750 at once
    assert part.decided == 7750 and step.horizons == [8000, 7750]


def test_a_spent_budget_ends_the_run_at_the_check_and_a_steady_machine_is_left_alone():
    clock, step = _Clock(), _Step()
    train = TrainConfig(max_steps=14000, budget_minutes=10)
    part = StepBudget(train, OptimConfig(schedule="cosine", warmup_steps=200), step, clock)
    _run_probe(part, clock, 0.1)
    first = part.decided
    assert first is not None and first < 14000
    _steps(part, clock, 0.1, 111, first - 1)  # the probe's pace all along: no change
    assert part.decided == first and step.horizons == [first]
    # a machine that stalls: the budget is gone at the next check, which ends the run there
    clock, step = _Clock(), _Step()
    train = TrainConfig(max_steps=14000, budget_minutes=10)
    part = StepBudget(train, OptimConfig(schedule="cosine", warmup_steps=200), step, clock)
    _run_probe(part, clock, 0.1)
    _steps(part, clock, 5.0, 111, 1110)
    assert part.decided == 1110 and train.max_steps == 1110


def test_every_check_asks_the_ranks_and_a_resumed_run_does_not_check():
    asked: list[int] = []

    def slowest(steps: int) -> int:  # a rank elsewhere fits 500 fewer steps
        asked.append(steps)
        return steps - 500

    clock, step = _Clock(), _Step()
    train = TrainConfig(max_steps=20000, budget_minutes=30)
    optim = OptimConfig(schedule="cosine", warmup_steps=200)
    part = StepBudget(train, optim, step, clock, slowest=slowest)
    _run_probe(part, clock, 0.1)  # 16000 fit here, 15500 on the slowest rank
    assert part.decided == 15500 and len(asked) == 1
    _steps(part, clock, 0.1, 111, 3110)  # checks at 1110, 2110 and 3110, each collective
    assert len(asked) == 4 and part.decided == 15500
    state = part.state_dict()
    train = TrainConfig(max_steps=20000, budget_minutes=30)
    resumed = StepBudget(train, optim, step, clock, slowest=slowest)
    resumed.load_state_dict(state)
    asked.clear()
    _steps(resumed, clock, 5.0, 3111, 6200)
    assert not asked and resumed.decided == state["decided"]


def _small_probe(monkeypatch) -> None:
    """A probe of 4 steps from step 2, rounded to single steps: a tiny run decides early."""
    monkeypatch.setattr(budget, "PROBE_FROM", 2)
    monkeypatch.setattr(budget, "PROBE_STEPS", 4)
    monkeypatch.setattr(budget, "ROUND_STEPS", 1)


def _cosine_budget_config(tiny_config, minutes: float):
    """A tiny run with a budget of ``minutes`` on a cosine decaying to 0.1 of its peak."""
    return tiny_config(
        train__max_steps=100000,
        train__budget_minutes=minutes,
        optim__schedule="cosine",
        optim__warmup_steps=2,
        optim__min_lr_ratio=0.1,
        optim__ema_decay=0,
    )


def test_a_trainer_with_a_budget_ends_where_it_decided_with_the_rate_decayed(
    tiny_config, tmp_path, monkeypatch
):
    """A real run on a clock that counts its readings: the run ends at the step the budget
    decided (below train.max_steps), and the cosine reached its floor there; a resume from
    its checkpoint keeps that end."""
    _small_probe(monkeypatch)
    readings = [0]

    def clock() -> float:  # every reading is 1 s later: a slow machine, deterministically
        readings[0] += 1
        return float(readings[0])

    cfg = _cosine_budget_config(tiny_config, 0.6)  # 32.4 s of steps, several readings a step
    t = Trainer(cfg, tmp_path / "r", clock=clock)
    assert t.train() == 0
    decided = t.budget.decided
    assert decided is not None and 6 <= decided < 100000
    assert t.step == decided and cfg.train.max_steps == decided
    peak = cfg.optim.lr_generator
    assert t.step_fn.learning_rates()["generator"] == pytest.approx(0.1 * peak)
    # resumed with the config as the command gives it: the decided end is kept
    cfg2 = _cosine_budget_config(tiny_config, 0.6)
    again = Trainer(cfg2, tmp_path / "r", clock=clock)
    again.resume("auto")
    assert cfg2.train.max_steps == decided and again.step == decided
    assert again.step_fn.learning_rates()["generator"] == pytest.approx(0.1 * peak)


def test_a_trainer_whose_clock_slows_is_shortened_by_a_check_and_ends_decayed(
    tiny_config, tmp_path, monkeypatch, caplog
):
    """A real run whose clock runs 1 s a reading through the probe and 4 s after: a check
    moves the end earlier (the log says from where to where), the run ends where the last
    check put it, and the cosine is at its floor at that step."""
    _small_probe(monkeypatch)
    monkeypatch.setattr(budget, "RECHECK_EVERY", 2)
    readings = [0, 0.0]

    def clock() -> float:
        readings[0] += 1
        readings[1] += 1.0 if readings[0] <= 60 else 4.0
        return readings[1]

    cfg = _cosine_budget_config(tiny_config, 2)
    t = Trainer(cfg, tmp_path / "r", clock=clock)
    with caplog.at_level("INFO", logger="muongen.train.budget"):
        assert t.train() == 0
    moves = [
        (int(m.group(1)), int(m.group(2)))
        for r in caplog.records
        if (m := re.search(r"ends at step (\d+), not (\d+), to fill", r.getMessage()))
    ]
    assert any(new < old for new, old in moves)  # a check shortened the run
    decided = t.budget.decided
    assert decided == moves[-1][0] and t.step == decided == cfg.train.max_steps
    assert t.step_fn.learning_rates()["generator"] == pytest.approx(0.1 * cfg.optim.lr_generator)
