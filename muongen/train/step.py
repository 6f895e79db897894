"""One training step of the WGAN-GP: n_critic critic updates, then one generator update.

Every update accumulates over the microbatches it is given (each microbatch's loss is a
mean over its events, weighted by its share of the batch's events, so the sum is the
mean over the batch). The inputs are features on the device; nothing in the step reads
a value back to the host, so the GPU runs ahead of Python.

Non-finite updates. After the backward passes (and ``sync_grads``) the total gradient
norm is computed anyway for clipping; ``bad = !isfinite(norm) | !isfinite(loss)`` is a
0-d device tensor. It is handed to the fused Adam(W)/SGD kernels through the
``found_inf`` attribute the optimizers read (the protocol ``GradScaler`` uses): a fused
kernel leaves parameters and moments untouched when it is set and Adam takes its step
count back, so a bad update is skipped without a host sync. The counts of skipped
updates stay on the device (returned as ``skipped``; totals in ``state_dict``). Where no
fused kernel exists (e.g. MPS) the fallback reads ``bad`` once per update (one sync).
Gradients are zeroed after every update either way.

Learning rates follow a pure function of the generator step (warm-up, then constant or
cosine); both schedulers advance once per call, applied or skipped. On resume only the
step is taken from the checkpoint; the rates come from the current config.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from muongen.config import OptimConfig, TrainConfig
from muongen.data.batch import RaggedBatch
from muongen.errors import ConfigError
from muongen.model.generator import events_with_muons
from muongen.model.losses import critic_loss, generator_loss, w_gap
from muongen.model.penalty import gradient_penalty
from muongen.model.pooling import event_index_of
from muongen.train import checkpoint as ckpt

STATE_VERSION = 1

log = logging.getLogger(__name__)


def lr_factor(
    step: int, *, schedule: str, warmup_steps: int, decay_steps: int, min_lr_ratio: float
) -> float:
    """Learning rate / peak at generator step ``step`` (0-based)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    t = min(1.0, (step - warmup_steps) / max(1, decay_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))


def make_optimizer(
    params, cfg: OptimConfig, lr: float, device: torch.device
) -> torch.optim.Optimizer:
    """AdamW (decoupled weight decay; Adam when it is 0) or SGD with momentum.

    Fused kernels where torch has them (CUDA, CPU): they accept the skip flag on device.
    """
    params = list(params)
    fused = device.type in ("cuda", "cpu")
    if cfg.optimizer == "adam":
        return torch.optim.AdamW(
            params,
            lr=lr,
            betas=(cfg.betas[0], cfg.betas[1]),
            weight_decay=cfg.weight_decay,
            fused=fused or None,
        )
    opt = torch.optim.SGD(
        params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, fused=fused or None
    )
    if fused and cfg.momentum > 0:
        # zero buffers up front: fused SGD would otherwise create them uninitialised on its
        # first step, and a skipped first step would leave garbage in them
        for p in params:
            opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
    return opt


@dataclass
class _Scored:
    """The events of one microbatch that the critic scores, muons grouped by event.

    With the real counts (``train.fake_counts = "real"``) an event without muons is empty
    in the real and in the fake set alike: it scores the same in both, so it cancels in the
    critic's loss and carries no gradient to the generator. Only events with muons are
    scored then (:func:`muongen.model.generator.events_with_muons`; on an accelerator at
    most N of the B events, padded with empty rows that are masked out); losses stay sums
    over the scored events / B, i.e. the means over the batch that the original computes.
    At the production multiplicity (most events empty) this removes most of the per-event
    work of the generator and the critic.
    With the predicted counts every event is scored. With ``optim.event_weight`` each
    scored event's scores are multiplied by its weight (:meth:`mask`), the same for its
    real and its fake bundle.
    """

    batch: RaggedBatch
    cond: torch.Tensor  # (B', 4)
    muons: torch.Tensor  # (N, F)
    counts: torch.Tensor  # (B',)
    n_events: int  # B, the events the losses average over
    valid: torch.Tensor | None  # (B',) bool: scored rows that count (None: all)
    weight: torch.Tensor | None = None  # (B',) each scored event's loss weight (None: 1)
    # (N, F') the real muons mapped to the critic's inputs (Critic.inputs): once per step,
    # not once per critic call (the map has no trained parameters)
    inputs: torch.Tensor | None = None
    event_index: torch.Tensor = field(init=False)  # (N,) the event of each real muon

    def __post_init__(self) -> None:
        self.event_index = event_index_of(self.counts, self.n_muons)

    @property
    def n_muons(self) -> int:
        return int(self.muons.shape[0])

    def mask(self, scores: torch.Tensor) -> torch.Tensor:
        """(B',) scores with the rows that do not count set to 0, times their weights."""
        if self.valid is not None:
            scores = torch.where(self.valid, scores, 0.0)
        return scores if self.weight is None else scores * self.weight


class GanStep:
    """The WGAN-GP update of a generator and a critic (see the module docstring).

    Args:
        generator: a :class:`muongen.model.Generator`.
        critic: a :class:`muongen.model.Critic`.
        optim_cfg: optimizers, schedule, n_critic, GP controls, multiplicity weight.
        train_cfg: precision, tf32, compile, fake_counts, max_steps (cosine horizon).
        device: where the models and batches are.
        sync_grads: called as ``sync_grads(module)`` once per update after the
            microbatches' backward passes, before clipping and the optimizer step.
        penalty_fn: the gradient-penalty function (the benchmark swaps in the reference).
    """

    def __init__(
        self,
        generator: nn.Module,
        critic: nn.Module,
        optim_cfg: OptimConfig,
        train_cfg: TrainConfig,
        device: torch.device | str,
        *,
        sync_grads: Callable[[nn.Module], None] | None = None,
        penalty_fn: Callable[..., torch.Tensor] = gradient_penalty,
    ) -> None:
        self.generator = generator
        self.critic = critic
        self.optim_cfg = optim_cfg
        self.train_cfg = train_cfg
        self.device = torch.device(device)
        self.sync_grads = sync_grads
        self.penalty_fn = penalty_fn
        cuda = self.device.type == "cuda"

        self.amp_dtype = None
        if cuda and train_cfg.precision != "fp32":
            self.amp_dtype = torch.bfloat16 if train_cfg.precision == "bf16" else torch.float16
        self.scaler = torch.amp.GradScaler("cuda", enabled=cuda and train_cfg.precision == "fp16")
        if cuda and train_cfg.tf32:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

        self.opt_g = make_optimizer(
            generator.parameters(), optim_cfg, optim_cfg.lr_generator, self.device
        )
        self.opt_c = make_optimizer(
            critic.parameters(), optim_cfg, optim_cfg.lr_critic, self.device
        )
        self._fused = bool(self.opt_g.defaults.get("fused"))
        horizon = optim_cfg.decay_steps or train_cfg.max_steps
        if optim_cfg.schedule == "cosine" and horizon <= optim_cfg.warmup_steps:
            raise ConfigError(
                "optim.schedule=cosine needs optim.decay_steps (or train.max_steps) larger "
                f"than optim.warmup_steps (got {horizon} <= {optim_cfg.warmup_steps})"
            )
        if optim_cfg.event_weight != "none" and train_cfg.fake_counts != "real":
            raise ConfigError(
                f"optim.event_weight={optim_cfg.event_weight} weighs an event's real and fake "
                "bundles alike and needs train.fake_counts=real "
                f"(got {train_cfg.fake_counts}); set one of them back"
            )
        factor = functools.partial(
            lr_factor,
            schedule=optim_cfg.schedule,
            warmup_steps=optim_cfg.warmup_steps,
            decay_steps=horizon,
            min_lr_ratio=optim_cfg.min_lr_ratio,
        )
        self.sched_g = torch.optim.lr_scheduler.LambdaLR(self.opt_g, factor)
        self.sched_c = torch.optim.lr_scheduler.LambdaLR(self.opt_c, factor)

        self.generator_step_count = 0
        self.critic_step_count = 0
        self.skipped_generator = torch.zeros((), dtype=torch.int64, device=self.device)
        self.skipped_critic = torch.zeros((), dtype=torch.int64, device=self.device)

        self._generate = generator.generate_with_counts
        # the critic scores muons already mapped by critic.inputs (see _Scored.inputs)
        self._critic_fwd = critic.score
        if train_cfg.compile:
            self._generate = torch.compile(generator.generate_with_counts, dynamic=True)
            if optim_cfg.gp_lambda == 0:  # the GP's double backward does not compile
                self._critic_fwd = torch.compile(critic.score, dynamic=True)

    # ------------------------------------------------------------------ the step

    #: Optional monitor.timing.StepTimer; the trainer sets it to split time per phase.
    timer = None

    def _phase(self, name: str):
        return self.timer.phase(name) if self.timer is not None else contextlib.nullcontext()

    def __call__(self, micro: list[RaggedBatch]) -> dict[str, torch.Tensor]:
        """One generator step: n_critic critic updates then one generator update.

        Args:
            micro: microbatches of one batch (features on ``device``).

        Returns:
            0-d tensors on the device: c_loss, w_gap and gp (means over this call's critic
            updates; gp over those that computed it, 0 when none did, unweighted by
            lambda), g_loss, m_loss (the generator update's; m_loss is the multiplicity
            MSE in ``round`` mode, the Gaussian NLL in ``lognormal`` mode, BCE plus pinball
            in ``hurdle`` mode: :meth:`Generator.multiplicity_loss`) and skipped
            (updates of this call that were not applied).
        """
        micro = [m for m in micro if m.n_events > 0]
        if not micro:
            raise ValueError("GanStep needs at least one microbatch with events")
        total = sum(m.n_events for m in micro)
        weights = [m.n_events / total for m in micro]
        micro = [self._scored(m) for m in micro]
        ocfg = self.optim_cfg

        c_losses, gaps, gps, bads = [], [], [], []
        for _ in range(ocfg.n_critic):
            use_gp = ocfg.gp_lambda > 0 and self.critic_step_count % ocfg.gp_every == 0
            with self._phase("critic"):
                c_loss, gap, gp, bad = self._critic_update(micro, weights, use_gp)
            c_losses.append(c_loss)
            gaps.append(gap)
            if use_gp:
                gps.append(gp)
            bads.append(bad)
            self.critic_step_count += 1
        skipped_c = torch.stack(bads).sum()
        self.skipped_critic += skipped_c

        with self._phase("generator"):
            g_loss, m_loss, bad_g = self._generator_update(micro, weights)
        self.skipped_generator += bad_g
        self.generator_step_count += 1
        self.sched_g.step()
        self.sched_c.step()
        zero = torch.zeros((), device=self.device)
        return {
            "c_loss": torch.stack(c_losses).mean(),
            "g_loss": g_loss,
            "m_loss": m_loss,
            "gp": torch.stack(gps).mean() if gps else zero,
            "w_gap": torch.stack(gaps).mean(),
            "skipped": skipped_c + bad_g.to(torch.int64),
        }

    def _critic_update(
        self, micro: list[_Scored], weights: list[float], use_gp: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One critic update. Its loss, mean D(fake) - mean D(real) + lambda GP, is a sum
        of three terms whose graphs share nothing but the parameters: each term is scored
        and back-propagated on its own (the real set, the fake set, the penalty), so one
        set's activations are still in the cache when its backward reads them, and at most
        one set's are alive at a time. Same gradients, accumulated in another order."""
        ocfg = self.optim_cfg
        self.opt_c.zero_grad(set_to_none=True)
        loss_sum = gap_sum = gp_sum = torch.zeros((), device=self.device)
        lam = ocfg.gp_lambda if use_gp else 0.0
        for mb, w in zip(micro, weights):
            with torch.no_grad(), self._autocast():
                fake, fake_counts = self._fake(mb)
            fake = self.critic.inputs(fake.to(mb.muons.dtype))  # for the fake set and the GP
            fake_index = mb.event_index if fake_counts is mb.counts else None
            per_event = w / max(mb.n_events, 1)  # the losses' means are sums / B
            with self._autocast():
                d_real = mb.mask(self._critic_fwd(mb.inputs, mb.cond, mb.counts, mb.event_index))
            d_real = d_real.float()
            self._backward(d_real.sum() * -per_event)  # - mean D(real)
            with self._autocast():
                d_fake = mb.mask(self._critic_fwd(fake, mb.cond, fake_counts, fake_index))
            d_fake = d_fake.float()
            self._backward(d_fake.sum() * per_event)  # + mean D(fake)
            gp = torch.zeros((), device=self.device)
            if use_gp:
                # fp16 has too little range for the double backward: GP in fp32 then.
                # The penalty acts in the critic's input space (Critic.inputs: standardised
                # muons): a unit gradient norm per standardised feature, not per x / 500 m.
                with self._autocast(enabled=self.amp_dtype is torch.bfloat16):
                    gp = self.penalty_fn(
                        self.critic.score,
                        mb.cond,
                        mb.inputs,
                        mb.counts,
                        fake,
                        fake_counts,
                        max_pairs=ocfg.gp_max_pairs,
                        fraction=ocfg.gp_fraction,
                        norm=ocfg.gp_norm,
                    )
                self._backward(gp * (lam * w))
            loss = critic_loss(d_real.detach(), d_fake.detach(), gp.detach(), lam, mb.n_events)
            loss_sum = loss_sum + loss * w
            gap_sum = gap_sum + w_gap(d_real, d_fake, n_events=mb.n_events) * w
            gp_sum = gp_sum + gp.detach() * w
        bad = self._apply(self.opt_c, self.critic, loss_sum)
        return loss_sum, gap_sum, gp_sum, bad

    def _generator_update(
        self, micro: list[_Scored], weights: list[float]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        self.opt_g.zero_grad(set_to_none=True)
        self.critic.requires_grad_(False)  # no parameter gradients for the critic here
        g_sum = m_sum = total_sum = torch.zeros((), device=self.device)
        try:
            for mb, w in zip(micro, weights):
                with self._autocast():
                    fake, fake_counts = self._fake(mb)
                    # the multiplicity head learns from every event, empty ones too
                    m = self.generator.multiplicity_loss(mb.batch.conditions, mb.batch.counts)
                    fake_index = mb.event_index if fake_counts is mb.counts else None
                    fake = self.critic.inputs(fake)
                    d_fake = mb.mask(self._critic_fwd(fake, mb.cond, fake_counts, fake_index))
                g = generator_loss(d_fake.float(), n_events=mb.n_events)
                m = m.float()
                loss = g + self.optim_cfg.mult_weight * m
                self._backward(loss * w)
                g_sum = g_sum + g.detach() * w
                m_sum = m_sum + m.detach() * w
                total_sum = total_sum + loss.detach() * w
        finally:
            self.critic.requires_grad_(True)
        bad = self._apply(self.opt_g, self.generator, total_sum)
        return g_sum, m_sum, bad

    # ------------------------------------------------------------------ helpers

    def _scored(self, mb: RaggedBatch) -> _Scored:
        """The events of ``mb`` the critic scores (see :class:`_Scored`)."""
        b, n = mb.n_events, mb.n_muons
        with torch.no_grad():
            inputs = self.critic.inputs(mb.muons)
        if self.train_cfg.fake_counts != "real":
            return _Scored(mb, mb.conditions, mb.muons, mb.counts, b, None, inputs=inputs)
        rows, counts = events_with_muons(mb.counts, n)
        cond = mb.conditions if rows is None else mb.conditions[rows]
        weight = None
        if self.optim_cfg.event_weight != "none":
            # log(1 + N) or sqrt(N), mean 1 over all B events (the unscored empty ones weigh 0)
            n_mu = counts.to(torch.float32)
            f = torch.log1p(n_mu) if self.optim_cfg.event_weight == "log" else n_mu.sqrt()
            weight = f * (b / f.sum().clamp(min=1e-12))
        return _Scored(mb, cond, mb.muons, counts, b, counts > 0, weight, inputs)

    def _fake(self, mb: _Scored) -> tuple[torch.Tensor, torch.Tensor]:
        """Fake muons (N', F) and their counts (B',) for the scored events' conditions."""
        if self.train_cfg.fake_counts == "real":
            return self._generate(mb.cond, mb.counts, mb.n_muons), mb.counts
        muons, counts, _ = self.generator(mb.cond)  # sizes the output: one sync
        return muons, counts

    def _autocast(self, enabled: bool = True):
        if self.amp_dtype is None or not enabled:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def _backward(self, loss: torch.Tensor) -> None:
        if not loss.requires_grad:  # a term without a graph (e.g. no pairs for the GP)
            return
        if self.scaler.is_enabled():
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    def _apply(
        self, opt: torch.optim.Optimizer, module: nn.Module, loss: torch.Tensor
    ) -> torch.Tensor:
        """Sync, unscale, clip and step unless the loss or a gradient is non-finite.

        Returns the 0-d bool tensor ``bad`` (the update was skipped).
        """
        if self.sync_grads is not None:
            self.sync_grads(module)
        if self.scaler.is_enabled():
            self.scaler.unscale_(opt)
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        if self.optim_cfg.grad_clip > 0:
            params = [p for p in module.parameters() if p.grad is not None]
            norm = torch.nn.utils.clip_grad_norm_(params, self.optim_cfg.grad_clip, foreach=True)
        elif grads:
            norm = torch.nn.utils.get_total_norm(grads, foreach=True)
        else:
            norm = torch.zeros((), device=self.device)
        bad = ~(torch.isfinite(norm) & torch.isfinite(loss))
        if self._fused:
            opt.found_inf = bad.float()  # read by the fused kernels: skip when 1
            opt.step()
        elif not bool(bad):  # one host sync per update on the unfused fallback
            opt.step()
        if self.scaler.is_enabled():
            self.scaler.update()
        opt.zero_grad(set_to_none=True)
        return bad

    # ------------------------------------------------------------------ state

    @property
    def skipped_updates(self) -> dict[str, int]:
        """Skipped updates so far (reads the device counters: a host sync)."""
        return {"critic": int(self.skipped_critic), "generator": int(self.skipped_generator)}

    def learning_rates(self) -> dict[str, float]:
        """Current learning rates (for logging)."""
        return {
            "generator": self.opt_g.param_groups[0]["lr"],
            "critic": self.opt_c.param_groups[0]["lr"],
        }

    def state_dict(self) -> dict:
        """Optimizers (tagged with their type), scaler and counters.

        No scheduler state: the learning rates are a pure function of the step, and a
        scheduler's own counters (``_step_count``) would make two saves of the same state
        differ in their bytes."""
        return {
            "version": STATE_VERSION,
            "opt_g": ckpt.optimizer_state(self.opt_g),
            "opt_c": ckpt.optimizer_state(self.opt_c),
            "scaler": self.scaler.state_dict(),
            "generator_step_count": self.generator_step_count,
            "critic_step_count": self.critic_step_count,
            "skipped": self.skipped_updates,
        }

    def load_state_dict(self, sd: dict) -> None:
        """Restore :meth:`state_dict` (an empty dict leaves everything fresh).

        The checkpoint brings the optimizer moments, the counters and the scaler. An
        optimizer of another type or shape is reset with a warning
        (:func:`muongen.train.checkpoint.load_optimizer`). The hyperparameters (learning
        rates, betas, momentum, weight decay, fused) stay those of the current config and
        the learning rates are recomputed from the restored step, so a chained run may
        change them between ranges.
        """
        if not sd:
            return
        if sd.get("version") != STATE_VERSION:
            log.warning(
                "training-step state has version %r, this muongen writes %r: weights "
                "restored, optimizers and counters start afresh",
                sd.get("version"),
                STATE_VERSION,
            )
            return
        for opt, key, what in ((self.opt_g, "opt_g", "generator"), (self.opt_c, "opt_c", "critic")):
            hyper = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
            ckpt.load_optimizer(opt, sd.get(key), what)
            for group, h in zip(opt.param_groups, hyper):
                group.update(h)
            if self._fused:  # fused kernels want the step counters beside the parameters
                for slot in opt.state.values():
                    if torch.is_tensor(slot.get("step")):
                        slot["step"] = slot["step"].to(self.device, torch.float32)
        if sd.get("scaler"):
            self.scaler.load_state_dict(sd["scaler"])
        self.generator_step_count = int(sd["generator_step_count"])
        self.critic_step_count = int(sd["critic_step_count"])
        self.skipped_critic.fill_(int(sd["skipped"]["critic"]))
        self.skipped_generator.fill_(int(sd["skipped"]["generator"]))
        for sched in (self.sched_g, self.sched_c):
            sched.last_epoch = self.generator_step_count
            lrs = [base * sched.lr_lambdas[0](sched.last_epoch) for base in sched.base_lrs]
            for group, lr in zip(sched.optimizer.param_groups, lrs):
                group["lr"] = lr
            sched._last_lr = lrs  # what get_last_lr() reports
