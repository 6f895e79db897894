"""``train.budget_minutes``: a run that fits its wall-clock budget on any data.

Why. A step's cost grows with the muons of its batch, while ``train.max_steps`` counts
steps: the quality preset's 14000 steps of 2048 events took ~20-26 minutes on the sparse
``wide`` mix (~3.5 muons per row) and ~2 hours on issue 52's muon-rich data (~27 muons
per row, 2 steps/s on a quiet 2-core machine).

The rule. The run's own steps are timed: from step :data:`PROBE_FROM` of the run (past the
first steps' one-off costs: file reads, the allocator, the shard threads) over
:data:`PROBE_STEPS` steps, wall clock (data, step, logging). From the measured seconds per
step ``t``, the run's length becomes

    max_steps = min(train.max_steps, steps done + (SAFETY x budget - elapsed) / t),

rounded down to a multiple of :data:`ROUND_STEPS` (so that a little timing noise does not
change the run), where elapsed counts from the trainer's construction (model, data
listing, normalisers). Where the requested steps fit, nothing changes: the quality preset
on ``wide`` data trains its 14000 steps as before. Where they do not (muon-rich data, a
slower or busier machine), the run is shortened and, with ``optim.decay_steps`` 0, the
cosine schedule's horizon with it (:meth:`muongen.train.step.GanStep.set_horizon`), so the
learning rate still decays to its floor at the end. The decision comes at step 110 of the
run, before the quality preset's 200 warm-up steps end, so the rate stays a pure function
of the step (the warm-up does not depend on the horizon). It is saved in every checkpoint:
a resumed run keeps it and does not measure again. The margin (:data:`SAFETY`) covers the
periodic checkpoints, the final save and the summary. Under torchrun every rank measures
and the slowest one decides.

A machine that slows down after the probe (a busy neighbour, a slower stretch of the run)
would carry the run past its budget, and 100 steps are a noisy probe, so the decision is
checked again every :data:`RECHECK_EVERY` steps after it, with the mean time a step since
the probe began (the first check: 1100 steps), by the same rule. A check moves the run's
end (never past ``train.max_steps``) and the cosine's horizon with it, so the learning rate
steps a little where it does: down for a machine that slowed, up for one that was busy
during the probe (by two multiples of :data:`ROUND_STEPS` at least, so a pace on a
boundary does not make the end flip back and forth). A resumed run does not check (its
decision was made by another process).

What it does not do: the measured time is the time on this machine at this moment, so a
run whose budget binds is shorter on a busy machine, and two runs with one seed may then
differ in length (the rounding keeps small differences out). A run that does not fit
even its probe (a budget under a few minutes) ends after it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from muongen.config import OptimConfig, TrainConfig

log = logging.getLogger(__name__)

#: steps of the run before the timing starts (their one-off costs are not a step's)
PROBE_FROM = 10
#: steps timed
PROBE_STEPS = 100
#: the share of the budget the steps may fill (the rest: checkpoints, final save, summary)
SAFETY = 0.9
#: the decided length is a multiple of this many steps
ROUND_STEPS = 250
#: steps between the checks of the decision against the mean time a step since the probe
RECHECK_EVERY = 1000


def steps_that_fit(
    *, budget_s: float, elapsed_s: float, seconds_per_step: float, steps_done: int
) -> int:
    """The run's length by the rule of the module docstring (before the cap at
    ``train.max_steps``): the steps done plus what fits in SAFETY x budget - elapsed,
    rounded down to a multiple of ROUND_STEPS, at least the steps done."""
    left = SAFETY * budget_s - elapsed_s
    total = steps_done + max(0, int(left / max(seconds_per_step, 1e-9)))
    rounded = total // ROUND_STEPS * ROUND_STEPS
    return max(steps_done, rounded)


class StepBudget:
    """A trainer part that sets the run's length from its measured step time
    (``train.budget_minutes``; see the module docstring).

    Args:
        train_cfg: the run's train section: ``budget_minutes`` is read, ``max_steps`` set.
        optim_cfg: the schedule (a horizon is set only with ``decay_steps`` 0 and cosine).
        step_fn: the training step; its ``set_horizon(steps)`` is called where it has one.
        clock: monotonic seconds (the trainer's).
        slowest: maps this rank's fitted steps to the fewest over ranks (identity alone).
    """

    follows_data = False  # the decision is the run's, whatever its input files

    def __init__(
        self,
        train_cfg: TrainConfig,
        optim_cfg: OptimConfig,
        step_fn: Any,
        clock: Callable[[], float],
        slowest: Callable[[int], int] = lambda steps: steps,
    ) -> None:
        self.train_cfg = train_cfg
        self.optim_cfg = optim_cfg
        self.step_fn = step_fn
        self.clock = clock
        self.slowest = slowest
        self.requested = train_cfg.max_steps  # what the config asks for
        self.decided: int | None = None
        self.seconds_per_step: float | None = None
        self._t0 = clock()
        self._first: int | None = None  # the first step this process trained
        self._t_probe: float | None = None
        self._probe_step: int | None = None  # the step done when the probe's clock started
        self._decided_at: int | None = None  # the step this process decided at (not resumed)

    @property
    def enabled(self) -> bool:
        return self.train_cfg.budget_minutes > 0

    def after_step(self, step: int) -> None:
        """Called after every step (``step``: steps done); times the probe and decides,
        then checks the decision every RECHECK_EVERY steps."""
        if not self.enabled:
            return
        if self.decided is not None:
            self._recheck(step)
            return
        if self._first is None:
            self._first = step
        ran = step - self._first + 1  # steps of this process, this one included
        if ran == PROBE_FROM:
            self._t_probe, self._probe_step = self.clock(), step
        elif ran == PROBE_FROM + PROBE_STEPS and self._t_probe is not None:
            per_step, fit = self._fit(step)
            self.seconds_per_step = per_step
            self._decided_at = step
            self._decide(fit)

    def _fit(self, step: int) -> tuple[float, int]:
        """The mean seconds a step since the probe began, and the steps that fit at that
        rate (the fewest over ranks)."""
        assert self._t_probe is not None and self._probe_step is not None
        now = self.clock()
        per_step = (now - self._t_probe) / max(1, step - self._probe_step)
        fit = steps_that_fit(
            budget_s=60.0 * self.train_cfg.budget_minutes,
            elapsed_s=now - self._t0,
            seconds_per_step=per_step,
            steps_done=step,
        )
        return per_step, self.slowest(fit)

    def _recheck(self, step: int) -> None:
        """Every RECHECK_EVERY steps after this process decided, until the decided end:
        move the run's end to what fits at the mean step since the probe began (capped at
        the steps asked for). Every rank comes here at the same steps (the decision is
        agreed), so ``slowest`` stays collective."""
        if self._decided_at is None or self.decided is None or step >= self.decided:
            return
        if (step - self._decided_at) % RECHECK_EVERY:
            return
        per_step, fit = self._fit(step)
        if self.requested:
            fit = min(fit, self.requested)
        # shorter by any amount (the budget holds); longer only by 2 x ROUND_STEPS, so the
        # end does not flip between two multiples on a pace at their boundary
        if fit == self.decided or self.decided < fit < self.decided + 2 * ROUND_STEPS:
            return
        (log.warning if fit < self.decided else log.info)(
            "train.budget_minutes=%g: %.3f s a step since step %d (%.3f before): the run "
            "ends at step %d, not %d, to fill its budget and stay within it",
            self.train_cfg.budget_minutes,
            per_step,
            self._probe_step,
            self.seconds_per_step,
            fit,
            self.decided,
        )
        self.decided = fit
        self.seconds_per_step = per_step
        self._apply()

    def _decide(self, fit: int) -> None:
        steps = min(self.requested, fit) if self.requested else fit
        self.decided = steps
        cut = steps != self.requested
        # a cut run is shorter than the preset was tuned for: said as a warning
        (log.warning if cut else log.info)(
            "train.budget_minutes=%g: %.3f s a step (steps %d-%d of this run), %d steps fit: %s",
            self.train_cfg.budget_minutes,
            self.seconds_per_step,
            PROBE_FROM,
            PROBE_FROM + PROBE_STEPS,
            fit,
            f"the run ends at step {steps}, not train.max_steps={self.requested}, with the "
            "learning rate's decay (train.budget_minutes=0: every step, however long)"
            if cut
            else f"train.max_steps={self.requested} kept",
        )
        self._apply()

    def _apply(self) -> None:
        """Set max_steps and, with optim.decay_steps 0, the cosine horizon to the decision."""
        steps = self.decided
        if steps is None:
            return
        if self.requested:
            steps = min(steps, self.requested)
        self.train_cfg.max_steps = steps
        o = self.optim_cfg
        set_horizon = getattr(self.step_fn, "set_horizon", None)
        if o.schedule == "cosine" and not o.decay_steps and set_horizon is not None:
            set_horizon(max(steps, o.warmup_steps + 1))

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        return {"decided": self.decided, "seconds_per_step": self.seconds_per_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Keep a saved decision (a resumed run does not measure again), where the budget
        is still on; a lower train.max_steps than the decision wins."""
        if not self.enabled or not state.get("decided"):
            return
        self.decided = int(state["decided"])
        self.seconds_per_step = state.get("seconds_per_step")
        self._apply()
        log.info(
            "train.budget_minutes: the run ends at step %d, as decided before the resume",
            self.train_cfg.max_steps,
        )

    def reset(self) -> None:
        self.decided = self.seconds_per_step = None
        self._first = self._t_probe = self._probe_step = self._decided_at = None
        self.train_cfg.max_steps = self.requested


def fewest_over_ranks(agree: Callable[[list[int]], list[int]]) -> Callable[[int], int]:
    """``slowest`` from an element-wise max over ranks (``ddp.agree``): the max of -steps."""
    return functools.partial(lambda steps, agree: -agree([-steps])[0], agree=agree)
