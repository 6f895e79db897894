"""One training step of the WGAN-GP: n_critic critic updates, then one generator update.

Every update accumulates over the microbatches it is given (each microbatch's loss is a
mean over its events, weighted by its share of the batch's events, so the sum is the
mean over the batch). The inputs are features on the device; nothing in the step reads
a value back to the host, so the GPU runs ahead of Python.

Fakes up front. The generator does not change during the critic updates, so the fake
sets of all n_critic updates of a step are made before the first, in one generator call
on the scored conditions repeated n_critic times (:meth:`GanStep._fakes_ahead`): each set
is an independent draw as before, with fewer and larger operations (measured 2-5% off
the production-mix step on the CPU, ~1% at the quality preset's batch).

Non-finite updates. After the backward passes (and ``sync_grads``) the total gradient
norm is computed anyway for clipping; ``bad = !isfinite(norm) | !isfinite(loss)`` is a
0-d device tensor. It is handed to the fused Adam(W)/SGD kernels through the
``found_inf`` attribute the optimizers read (the protocol ``GradScaler`` uses): a fused
kernel leaves parameters and moments untouched when it is set and Adam takes its step
count back, so a bad update is skipped without a host sync. The counts of skipped
updates stay on the device (returned as ``skipped``; totals in ``state_dict``). Where no
fused kernel exists (e.g. MPS) the fallback reads ``bad`` once per update (one sync).
Gradients are zeroed after every update either way.

Shards (the CPU only, ``train.step_shards``; :mod:`muongen.train.shards`). A second
intra-op thread hardly speeds up operations this small, so on the CPU each microbatch is
cut into runs of consecutive events (:func:`shard_bounds`) whose terms run at once, one
thread each (a process-wide pool; torch's operations release the GIL). Each shard
collects its gradients apart (:class:`ShardGrads`, ``torch.autograd.grad``) and they are
summed in shard order before one clip and one optimizer step. Each shard draws its noise
from its own ``torch.Generator``, seeded once per step from the global RNG. Every normaliser is the
whole microbatch's, so the shards' terms sum to the uncut microbatch's: the losses are
sums over a shard's events / the microbatch's B, ``optim.event_weight`` is normalised
over the microbatch, and the penalty's pairs are drawn once for the whole microbatch (in
this thread, :meth:`GanStep._draw_pairs`) and handed out to the shards with the
microbatch's count of terms (:func:`muongen.model.penalty.draw_pairs`). Sharding is
then parallelism only: for the same draws a sharded step equals the unsharded one. A
batch too small to cut runs as one shard, exactly as without shards.

Learning rates follow a pure function of the generator step (warm-up, then constant or
cosine; :mod:`muongen.train.optimizers`); both schedulers advance once per call, applied
or skipped. On resume only the step is taken from the checkpoint; the rates come from the
current config.

The jobs around the step live apart, one module each: the optimizers and their schedule
(:mod:`muongen.train.optimizers`), the compile probe (:mod:`muongen.train.compile_probe`),
the CPU shards (:mod:`muongen.train.shards`), the scored events (:mod:`muongen.train.scored`)
and the CUDA graphs (:mod:`muongen.train.graphs`). The names tests and benchmarks import
from here are re-exported.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from muongen.config import OptimConfig, TrainConfig
from muongen.data.batch import RaggedBatch
from muongen.errors import ConfigError
from muongen.model.generator import events_with_muons
from muongen.model.layers import use_onednn
from muongen.model.losses import critic_loss, generator_loss, w_gap
from muongen.model.muon_critic import muon_penalty
from muongen.model.penalty import draw_pairs, gradient_penalty, pair_count
from muongen.model.quantile_match import (
    SIZE_EDGES,
    condition_groups,
    event_features,
    grouped_w1,
    mean_over_groups,
    size_class,
)
from muongen.train import checkpoint as ckpt
from muongen.train import compile_probe, energy_balance
from muongen.train.compile_probe import c_compiler, compiles
from muongen.train.graphs import setup_graphs
from muongen.train.memory import keep_freed_memory
from muongen.train.optimizers import host_rates, lr_factor, make_optimizer
from muongen.train.scored import Cut, Scored, Work
from muongen.train.shards import (
    SHARD_MIN_COST,
    ShardGrads,
    resolve_shards,
    shard_bounds,
    thread_pool,
)

# re-exported: tests, benchmarks and the shared benches import these from here
__all__ = [
    "SHARD_MIN_COST",
    "GanStep",
    "c_compiler",
    "compiles",
    "lr_factor",
    "make_optimizer",
    "resolve_shards",
    "shard_bounds",
]

STATE_VERSION = 1

log = logging.getLogger(__name__)


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
        #: whether the critic has a per-muon critic (model.muon_critic) that the step trains
        self.muon_critic = getattr(critic, "muon_critic", None) is not None
        if self.muon_critic and train_cfg.fake_counts != "real":
            raise ConfigError(
                "model.muon_critic pairs each real muon with the fake muon in its place and "
                f"needs train.fake_counts=real (got {train_cfg.fake_counts})"
            )
        if optim_cfg.energy_balance > 0 and train_cfg.fake_counts != "real":
            raise ConfigError(
                "optim.energy_balance weighs an event's real and fake bundles alike and "
                f"needs train.fake_counts=real (got {train_cfg.fake_counts})"
            )
        if optim_cfg.quantile_match > 0 and train_cfg.fake_counts != "real":
            raise ConfigError(
                "optim.quantile_match compares the real and the fake muons of the same events "
                f"and needs train.fake_counts=real (got {train_cfg.fake_counts})"
            )
        #: the weight of the generator's quantile-matching term (optim.quantile_match)
        self.quantile_match = optim_cfg.quantile_match
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

        if self.device.type == "cpu" and train_cfg.cpu_keep_memory:
            keep_freed_memory()
        #: whether the step runs compiled (train.compile, where it applies and can work)
        self.compiled = compiles(train_cfg.compile, self.device)
        self.shards = resolve_shards(train_cfg.step_shards, self.device, self.compiled)
        #: torch's threads shared out among the shards (each shard's thread sets its own)
        self.threads_per_shard = max(1, torch.get_num_threads() // self.shards)
        self._rngs = [torch.Generator() for _ in range(self.shards)] if self.shards > 1 else []
        #: whether the CPU's fp32 products outside autograd take oneDNN (train.cpu_matmul;
        #: process-wide)
        self.onednn = use_onednn(train_cfg.cpu_matmul)
        self.capturing = False  # recording a CUDA graph (autocast must not cache casts)
        #: the step recorded as CUDA graphs (train.cuda_graphs, where it applies), or None
        self.graphs = setup_graphs(self) if train_cfg.cuda_graphs else None
        self._generate = generator.generate_with_counts
        # the critic scores muons already mapped by critic.inputs (see Scored.inputs)
        self._critic_fwd = critic.score
        if self.compiled:
            # a compilation that fails (no libcuda for triton in a container, say) logs its
            # error and runs that code uncompiled instead of ending the run
            torch._dynamo.config.suppress_errors = True
            backend = compile_probe.COMPILE_BACKEND  # read here: tests swap it
            compile_ = functools.partial(torch.compile, dynamic=True, backend=backend)
            self._generate = compile_(generator.generate_with_counts)
            # the WGAN terms differentiate the critic once, so they compile; the penalty's
            # double backward does not, and goes through the eager critic.score (the same
            # parameters: the gradients add up as without compile)
            self._critic_fwd = compile_(critic.score)
            log.info(
                "train.compile: the generator and the critic's WGAN terms are compiled on "
                "their first call (about a minute; the penalty stays uncompiled)"
            )

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
        if self.graphs is not None:
            out = self.graphs(micro)  # None: this batch runs as usual
            if out is not None:
                self.advance()
                return out
        work = self._shard_work(micro)
        with self._shard_threads(len(work)):
            out = self.updates(work, self.gp_pattern())
        self.advance()
        return out

    def gp_pattern(self) -> tuple[bool, ...]:
        """Which of the next step's critic updates compute the penalty (every gp_every-th
        critic update over the run)."""
        o = self.optim_cfg
        count = self.critic_step_count
        return tuple(o.gp_lambda > 0 and (count + k) % o.gp_every == 0 for k in range(o.n_critic))

    def advance(self) -> None:
        """The host's side of a step: update counters and learning rates."""
        self.critic_step_count += self.optim_cfg.n_critic
        self.generator_step_count += 1
        self.sched_g.step()
        self.sched_c.step()

    def updates(self, work: list[Work], gp_pattern: tuple[bool, ...]) -> dict[str, torch.Tensor]:
        """The step's device work: the critic updates (the penalty where ``gp_pattern``
        says) and the generator update; returns :meth:`__call__`'s dict. Reads nothing
        back to the host and leaves the host's counters alone (:meth:`advance`), so a CUDA
        graph can record it (:mod:`muongen.train.graphs`)."""
        c_losses, gaps, gps, bads = [], [], [], []
        with self._phase("critic"):
            self._map(work, self._fakes_ahead)
            self._draw_pairs(work, gp_pattern)
        for k, use_gp in enumerate(gp_pattern):
            with self._phase("critic"):
                c_loss, gap, gp, bad = self._critic_update(work, use_gp, k)
            c_losses.append(c_loss)
            gaps.append(gap)
            if use_gp:
                gps.append(gp)
            bads.append(bad)
        skipped_c = torch.stack(bads).sum()
        self.skipped_critic += skipped_c

        with self._phase("generator"):
            g_loss, m_loss, bad_g = self._generator_update(work)
        self.skipped_generator += bad_g
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
        self, work: list[Work], use_gp: bool, k: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Critic update ``k`` of the step over every shard's events (its fakes: the k-th
        made up front); returns its loss, gap, penalty and ``bad`` (:meth:`_apply`)."""
        self.opt_c.zero_grad(set_to_none=True)
        lam = self.optim_cfg.gp_lambda if use_gp else 0.0
        terms = functools.partial(self._critic_terms, lam=lam, k=k)
        sums = self._run(work, self.critic, terms)
        loss_sum, gap_sum, gp_sum = (torch.stack(t).sum() for t in zip(*sums))
        bad = self._apply(self.opt_c, self.critic, loss_sum)
        return loss_sum, gap_sum, gp_sum, bad

    def _critic_terms(
        self,
        work: Work,
        backward: Callable[[torch.Tensor], None],
        rng: torch.Generator | None,
        *,
        lam: float,
        k: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The critic" loss, mean D(fake) - mean D(real) + lambda GP, of one shard's events.

        With the real counts the real and the fake set are scored in one critic call, as
        one set of 2B' events (:meth:`Scored.both_sets`; a copy of the fake muons' few
        input columns), and back-propagated at once: half the operations of two calls,
        each twice the size (measured 3-10% off the step on the CPU, most with shards,
        where every operation takes and gives back the GIL). With the predicted counts
        they are scored apart. The penalty is scored and back-propagated on its own, right
        after its forward (its graph shares nothing with the sets' but the parameters).
        Returns the shard's weighted sums of the loss, the gap and the penalty."""
        ocfg = self.optim_cfg
        use_gp = lam > 0
        loss_sum = gap_sum = gp_sum = muon_sum = torch.zeros((), device=self.device)
        for mb, w in work:
            fake, fake_counts = mb.fakes[k]  # in the critic's input space, for the GP too
            per_event = w / max(mb.n_events, 1)  # the losses' means are sums / B
            if fake_counts is mb.counts:  # the same counts: one call on both sets
                with self._autocast():
                    both = self._critic_fwd(torch.cat([mb.inputs, fake]), *mb.both_sets())
                d_real, d_fake = (mb.mask(d).float() for d in both.chunk(2))
                loss = (d_fake.sum() - d_real.sum()) * per_event  # mean D(fake) - D(real)
                if self.muon_critic:
                    muon_loss = self._muon_wgan(mb, fake)
                    loss = loss + muon_loss
                    muon_sum = muon_sum + muon_loss.detach()
                backward(loss)
            else:
                with self._autocast():
                    d_real = self._critic_fwd(mb.inputs, mb.cond, mb.counts, mb.event_index)
                d_real = mb.mask(d_real).float()
                backward(d_real.sum() * -per_event)  # - mean D(real)
                with self._autocast():
                    d_fake = self._critic_fwd(fake, mb.cond, fake_counts)
                d_fake = mb.mask(d_fake).float()
                backward(d_fake.sum() * per_event)  # + mean D(fake)
            gp = torch.zeros((), device=self.device)
            gp_w = w  # the penalty's weight: its microbatch's share of the batch
            if use_gp:
                draw = {
                    "max_pairs": mb.gp_pairs,
                    "fraction": ocfg.gp_fraction,
                    "by": ocfg.gp_draw,
                }
                if mb.cut is not None:  # a part: pairs and count drawn for its microbatch
                    slots, denominator = mb.pairs[k]
                    draw = {"slots": slots, "denominator": denominator}
                    gp_w = mb.cut.share
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
                        mb.pair_counts(fake_counts),
                        norm=ocfg.gp_norm,
                        **draw,
                        **self._rng_kw(rng),
                    )
                backward(gp * (lam * gp_w))
                if self.muon_critic:
                    muon_gp = self._muon_penalty(mb, fake, rng) * ocfg.muon_critic_weight
                    backward(muon_gp * lam)
                    muon_sum = muon_sum + lam * muon_gp.detach()
            gp = gp.detach() * gp_w
            loss = critic_loss(d_real.detach(), d_fake.detach(), gp, 0.0, mb.n_events) * w
            loss_sum = loss_sum + loss + lam * gp
            gap_sum = gap_sum + w_gap(d_real, d_fake, n_events=mb.n_events) * w
            gp_sum = gp_sum + gp
        return loss_sum + muon_sum, gap_sum, gp_sum

    def _muon_wgan(self, mb: Scored, fake: torch.Tensor) -> torch.Tensor:
        """The per-muon critic's WGAN term of one shard's events, weight times (sum of
        s(fake) - sum of s(real)) / the batch's muons (:mod:`muongen.model.muon_critic`):
        its part of the pooled means over the whole batch. Real and fake are scored in one
        call, as the set critic scores them (the real counts)."""
        with self._autocast():
            s = self.critic.muon_scores(torch.cat([mb.inputs, fake]), *mb.both_sets())
        s_real, s_fake = (mb.muon_mask(t).float() for t in s.chunk(2))
        scale = self.optim_cfg.muon_critic_weight * mb.muon_scale
        return (s_fake.sum() - s_real.sum()) * scale

    def _muon_penalty(
        self, mb: Scored, fake: torch.Tensor, rng: torch.Generator | None
    ) -> torch.Tensor:
        """The per-muon critic's gradient penalty of one shard's events: its share of the
        batch's mean over ``optim.muon_gp_rows`` muons drawn uniformly (with replacement),
        each real muon paired with the fake muon in its row, an alpha ~ U(0, 1) each."""
        n = mb.n_muons
        draws = min(n, max(1, round(n * mb.muon_gp_share))) if n else 0
        if draws == 0:
            return torch.zeros((), device=self.device)
        kw = {"device": mb.inputs.device, **self._rng_kw(rng)}
        rows = torch.randint(0, n, (draws,), **kw)
        alpha = torch.rand((draws, 1), dtype=mb.inputs.dtype, **kw)
        cond, counts = mb.cond, mb.counts
        with self._autocast(enabled=self.amp_dtype is torch.bfloat16):
            terms = muon_penalty(
                lambda x, e: self.critic.muon_scores(x, cond, counts, e),
                mb.inputs,
                fake,
                mb.event_index,
                rows,
                alpha,
            )
        if mb.valid is not None:
            valid = mb.valid.index_select(0, mb.event_index.index_select(0, rows))
            terms = torch.where(valid, terms, 0.0)
        # each drawn muon stands for 1 / share of the batch's muons: the shards' parts sum
        # to the mean over the batch's draws
        return terms.float().sum() * (mb.muon_scale / (draws / n))

    def _generator_update(
        self, work: list[Work]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        self.opt_g.zero_grad(set_to_none=True)
        self.critic.requires_grad_(False)  # no parameter gradients for the critic here
        try:
            sums = self._run(work, self.generator, self._generator_terms)
        finally:
            self.critic.requires_grad_(True)
        g_sum, m_sum, total_sum = (torch.stack(t).sum() for t in zip(*sums))
        bad = self._apply(self.opt_g, self.generator, total_sum)
        return g_sum, m_sum, bad

    def _generator_terms(
        self, work: Work, backward: Callable[[torch.Tensor], None], rng: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The generator loss of one shard's events; returns its weighted sums of the
        WGAN term, the multiplicity term and their total."""
        g_sum = m_sum = total_sum = torch.zeros((), device=self.device)
        for mb, w in work:
            with self._autocast():
                fake, fake_counts = self._fake(mb.cond, mb.counts, mb.n_muons, rng)
                # the multiplicity head learns from every event, empty ones too
                m = self.generator.multiplicity_loss(
                    mb.all_cond, mb.all_counts, **self._rng_kw(rng)
                )
                fake_index = mb.event_index if fake_counts is mb.counts else None
                fake = self.critic.inputs(fake)
                d_fake = mb.mask(self._critic_fwd(fake, mb.cond, fake_counts, fake_index))
                if self.muon_critic:  # - the pooled mean of s(fake) (real counts)
                    s = mb.muon_mask(
                        self.critic.muon_scores(fake, mb.cond, fake_counts, mb.event_index)
                    )
            g = generator_loss(d_fake.float(), n_events=mb.n_events)
            m = m.float()
            loss = g + self.optim_cfg.mult_weight * m
            weighted, g_part = loss * w, g.detach() * w
            if self.muon_critic:
                muon = s.float().sum() * -(self.optim_cfg.muon_critic_weight * mb.muon_scale)
                weighted = weighted + muon
                g_part = g_part + muon.detach()
            if self.quantile_match:
                weighted = weighted + self._quantile_match(mb, fake, w, rng)
            backward(weighted)
            g_sum = g_sum + g_part
            m_sum = m_sum + m.detach() * w
            total_sum = total_sum + weighted.detach()
        return g_sum, m_sum, total_sum

    def _quantile_match(
        self, mb: Scored, fake: torch.Tensor, w: float, rng: torch.Generator | None
    ) -> torch.Tensor:
        """The quantile-matching term of one shard's events (:mod:`muongen.model.
        quantile_match`), cut into groups among its own events along a direction of their
        conditions and log(1 + N) drawn for this call: weight times, with
        ``optim.quantile_match_weigh: groups``, the mean over the groups of their W1 sums,
        times the shard's share ``w`` of the batch's events; with ``muons``, the sorted
        distances summed / the batch's muons (the shards' parts sum to the batch's mean)."""
        o = self.optim_cfg
        n_groups = o.quantile_match_groups
        groups = condition_groups(event_features(mb.cond, mb.counts), n_groups, rng)
        if o.quantile_match_sizes:  # each slice cut again by bundle size
            groups = groups * (len(SIZE_EDGES) + 1) + size_class(mb.counts)
            n_groups *= len(SIZE_EDGES) + 1
        keep = None if mb.valid is None else mb.valid.index_select(0, mb.event_index)
        muon_group = groups.index_select(0, mb.event_index)
        sums, muons = grouped_w1(mb.inputs, fake, muon_group, n_groups, keep)
        if o.quantile_match_weigh == "muons":
            return sums.sum() * (o.quantile_match * mb.muon_scale)
        return mean_over_groups(sums, muons) * (o.quantile_match * w)

    # ------------------------------------------------------------------ shards

    def _shard_work(self, micro: list[RaggedBatch], padded: int = 0) -> list[Work]:
        """Each shard's scored events and their weights (event shares of the batch).

        One shard (and microbatches whose last ``padded`` events are padding, for a CUDA
        graph: :mod:`muongen.train.graphs`): the microbatches as given. Several: every
        microbatch is cut into that many runs of consecutive events of about equal cost
        (:func:`shard_bounds`; fewer when a shard would get less than ``SHARD_MIN_COST``),
        each part knowing its microbatch (:class:`Cut`: the penalty's pairs are drawn
        for the whole microbatch, :meth:`_draw_pairs`) and weighing its events by the
        microbatch's ``optim.event_weight`` normaliser; a microbatch too small to cut
        stays whole in the first shard. Trailing shards left without work are dropped: a
        batch too small to cut runs as one shard, exactly as without shards (this thread,
        torch's threads, the global RNG).
        """
        total = sum(m.n_events - padded for m in micro)
        cap = self.optim_cfg.gp_max_pairs
        if self.shards == 1 or padded:
            work = [[(self._scored(m, cap, padded), (m.n_events - padded) / total) for m in micro]]
            return self._muon_scales(work, micro)
        work: list[Work] = [[] for _ in range(self.shards)]
        for m in micro:
            bounds = shard_bounds(m.counts, self.shards, min_cost=SHARD_MIN_COST)
            if bounds[1] == m.n_events:  # too little work to cut: whole, in the first shard
                work[0].append((self._scored(m, cap), m.n_events / total))
                continue
            cut = Cut([], m.n_events / total)
            scale = self._weight_scale(m.counts) if self.optim_cfg.event_weight != "none" else 0
            factors = self._balance(m)
            for j, (a, b) in enumerate(itertools.pairwise(bounds)):
                if b > a:
                    part = self._scored(
                        m.slice(a, b), 0, weight_scale=scale,
                        balance=None if factors is None else tuple(f[a:b] for f in factors),
                    )  # fmt: skip
                    part.cut = cut
                    cut.parts.append(part)
                    work[j].append((part, (b - a) / total))
        while len(work) > 1 and not work[-1]:
            work.pop()
        return self._muon_scales(work, micro)

    def _muon_scales(self, work: list[Work], micro: list[RaggedBatch]) -> list[Work]:
        """``work`` with every part's per-muon critic weights set: 1 / the batch's muons,
        and the share of them its penalty draws (``optim.muon_gp_rows``). A padded
        microbatch's padding muons are in the count (a slightly smaller weight)."""
        if self.muon_critic or self.quantile_match:
            n = max(1, sum(m.n_muons for m in micro))
            share = min(1.0, self.optim_cfg.muon_gp_rows / n)
            for shard in work:
                for mb, _ in shard:
                    mb.muon_scale, mb.muon_gp_share = 1.0 / n, share
        return work

    @contextlib.contextmanager
    def _shard_threads(self, shards: int):
        """While the step runs as ``shards`` > 1 shards: this thread runs with its share
        of torch's threads, and each shard's RNG is seeded from the global RNG (one draw
        per step, so a checkpoint's RNG state resumes the same noise)."""
        if shards == 1:
            yield
            return
        seeds = torch.randint(0, 2**62, (self.shards,)).tolist()
        for rng, seed in zip(self._rngs, seeds):
            rng.manual_seed(seed)
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads_per_shard)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def _run(self, work: list[Work], module: nn.Module, terms: Callable) -> list[tuple]:
        """``terms(shard_work, backward, rng)`` for every shard, their gradients in
        ``module``'s ``.grad``; returns each shard's result.

        One shard: in this thread, back-propagated into ``.grad`` as usual, noise from
        the global RNG. Several: shard 0 here and the others on the pool's threads at the
        same time (torch's operations release the GIL), each with its own RNG; each shard
        collects its gradients apart (:class:`ShardGrads`) and they are summed in shard
        order, so the result does not depend on which thread finishes first.
        """
        if len(work) == 1:
            return [terms(work[0], self._backward, None)]
        params = [p for p in module.parameters() if p.requires_grad]
        grads = [ShardGrads(params) for _ in work]
        results = self._map(
            list(zip(work, grads)), lambda shard, rng: terms(shard[0], shard[1].backward, rng)
        )
        total = grads[0]
        for g in grads[1:]:
            total.add(g.sums)
        for p, g in zip(params, total.sums or ()):
            # in the parameter's layout, as backward() leaves .grad: autograd.grad may
            # hand back a transposed view (narrow_linear's weight), which the fused
            # optimizers would read in the wrong order
            p.grad = None if g is None else g.contiguous()
        return results

    # ------------------------------------------------------------------ helpers

    def _draw_pairs(self, work: list[Work], gp_pattern: tuple[bool, ...]) -> None:
        """The penalty's pairs of every microbatch cut into shards, for each critic update
        with the penalty: drawn here (the global RNG) for all the microbatch's events at
        once, with the real counts and the update's fake counts (made ahead), and handed
        out to its parts (``Scored.pairs``: each part's slots, renumbered from its first
        muon) with the microbatch's count of terms. So the microbatch pairs at most
        ``optim.gp_max_pairs`` and its parts' penalties sum to its own."""
        if len(work) == 1:
            return
        ocfg = self.optim_cfg
        cuts = {id(mb.cut): mb.cut for shard in work for mb, _ in shard if mb.cut is not None}
        for cut in cuts.values():
            real = torch.cat([p.counts for p in cut.parts])
            first = np.cumsum([0] + [p.n_muons for p in cut.parts]).tolist()
            for k in (k for k, use_gp in enumerate(gp_pattern) if use_gp):
                fake = torch.cat([p.fakes[k][1] for p in cut.parts])
                slots = draw_pairs(
                    real,
                    fake,
                    max_pairs=ocfg.gp_max_pairs,
                    fraction=ocfg.gp_fraction,
                    by=ocfg.gp_draw,
                )
                denominator = pair_count(slots, real, ocfg.gp_norm)
                ends = torch.searchsorted(slots, torch.tensor(first)).tolist()
                for i, part in enumerate(cut.parts):
                    part.pairs[k] = (slots[ends[i] : ends[i + 1]] - first[i], denominator)

    @staticmethod
    def _event_weight_terms(counts: torch.Tensor, kind: str) -> torch.Tensor:
        """(B,) each event's unnormalised ``optim.event_weight``: log(1 + N) or sqrt(N)."""
        n_mu = counts.to(torch.float32)
        return torch.log1p(n_mu) if kind == "log" else n_mu.sqrt()

    def _weight_scale(self, counts: torch.Tensor) -> float:
        """B / the sum of the events' weight terms: scales them to mean 1 over the events
        with these ``counts`` (the unscored empty ones weigh 0)."""
        f = self._event_weight_terms(counts, self.optim_cfg.event_weight)
        return counts.shape[0] / max(float(f.sum()), 1e-12)

    def _balance(
        self, mb: RaggedBatch, padded: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``optim.energy_balance``'s factors of the events of ``mb`` (its last ``padded``
        events left out), for the WGAN weights and the per-muon weights
        (:func:`muongen.train.energy_balance.balance`); None when it is off."""
        o = self.optim_cfg
        if o.energy_balance <= 0:
            return None
        counts = mb.counts
        if padded:
            keep = torch.arange(mb.n_events, device=counts.device) < mb.n_events - padded
            counts = torch.where(keep, counts, 0)
        if o.event_weight != "none":
            terms = self._event_weight_terms(counts, o.event_weight)
        else:
            terms = (counts > 0).float()
        return energy_balance.balance(
            mb.conditions, counts, terms, o.energy_balance, o.energy_balance_max
        )

    def _scored(
        self,
        mb: RaggedBatch,
        gp_pairs: int,
        padded: int = 0,
        weight_scale: float = 0.0,
        balance: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> Scored:
        """The events of ``mb`` the critic scores (see :class:`Scored`); its last
        ``padded`` events hold padding muons (:mod:`muongen.train.graphs`) and do not count.
        ``weight_scale``: the scale of the events' ``optim.event_weight`` terms (0: scaled
        to mean 1 over ``mb``'s events; a shard's part takes its microbatch's).
        ``balance``: ``optim.energy_balance``'s factors of ``mb``'s events (None: those of
        ``mb`` itself, :meth:`_balance`; a shard's part takes its microbatch's)."""
        b, n = mb.n_events - padded, mb.n_muons
        all_cond, all_counts = mb.conditions[:b], mb.counts[:b]
        with torch.no_grad():
            inputs = self.critic.inputs(mb.muons)
        if self.train_cfg.fake_counts != "real":
            if padded:
                raise ValueError("a padded microbatch needs train.fake_counts=real")
            return Scored(
                mb.conditions, mb.counts, mb.conditions, mb.muons, mb.counts, b, None, None,
                inputs, gp_pairs,
            )  # fmt: skip
        rows, counts = events_with_muons(mb.counts, n)
        cond = mb.conditions if rows is None else mb.conditions[rows]
        valid = counts > 0
        if padded:  # the padding events are the last ones
            row = torch.arange(counts.shape[0], device=counts.device) if rows is None else rows
            valid &= row < b
        weight = None
        if self.optim_cfg.event_weight != "none":
            # log(1 + N) or sqrt(N), mean 1 over all B events (the unscored empty ones weigh 0)
            f = self._event_weight_terms(torch.where(valid, counts, 0), self.optim_cfg.event_weight)
            weight = f * (weight_scale or b / f.sum().clamp(min=1e-12))
        factors = balance if balance is not None else self._balance(mb, padded)
        if factors is not None:
            events, muons = (f if rows is None else f.index_select(0, rows) for f in factors)
            weight = events if weight is None else weight * events
        scored = Scored(
            all_cond, all_counts, cond, mb.muons, counts, b, valid, weight, inputs, gp_pairs,
            padded > 0,
        )  # fmt: skip
        if factors is not None:
            scored.muon_weight = muons.index_select(0, scored.event_index)
        return scored

    def _fakes_ahead(self, work: Work, rng: torch.Generator | None) -> None:
        """Every critic update's fake sets of one shard, made at once (``Scored.fakes``).

        The generator does not change during the critic updates, so the n_critic fake
        sets of a step can all be drawn before the first: one generator call on the
        conditions repeated n_critic times instead of n_critic calls, and one input map.
        Each set is an independent draw as before; only the order of the noise draws
        differs. Fewer, larger operations cost less dispatch, which matters most when
        shards dispatch at once (each operation takes and gives back the GIL).
        """
        n = self.optim_cfg.n_critic
        for mb, _ in work:
            with torch.no_grad(), self._autocast():
                muons, drawn = self._fake(
                    mb.cond.repeat(n, 1), mb.counts.repeat(n), mb.n_muons * n, rng
                )
                if self.train_cfg.fake_counts == "real":
                    sizes = [mb.n_muons] * n
                    counts = [mb.counts] * n  # the real counts themselves (_critic_terms)
                else:
                    counts = list(drawn.view(n, -1))
                    sizes = drawn.view(n, -1).sum(1).tolist()
                inputs = self.critic.inputs(muons.to(mb.muons.dtype))
            mb.fakes = list(zip(inputs.split(sizes), counts))

    def _map(self, work: Sequence, fn: Callable) -> list:
        """``fn(work[i], rng_i)`` for every shard i, at once: shard 0 in this thread, the
        others on the pool's threads (torch's operations release the GIL), each with its
        own RNG (one shard: this thread, the global RNG); returns each shard's result."""
        if len(work) == 1:
            return [fn(work[0], None)]
        pool = thread_pool(self.shards - 1, self.threads_per_shard)
        futures = [pool.submit(fn, w, rng) for w, rng in zip(work[1:], self._rngs[1:])]
        try:
            results = [fn(work[0], self._rngs[0])]
        finally:  # never return (or raise) while another shard still runs
            for f in futures:
                f.exception()
        return results + [f.result() for f in futures]

    def _fake(
        self,
        cond: torch.Tensor,
        counts: torch.Tensor,
        n_muons: int,
        rng: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Fake muons (N', F) and their counts (B',) for conditions (B', 4): with the
        real ``counts`` (N' = ``n_muons``), else with counts the generator draws."""
        rng_kw = self._rng_kw(rng)
        if self.train_cfg.fake_counts == "real":
            return self._generate(cond, counts, n_muons, **rng_kw), counts
        muons, drawn, _ = self.generator(cond, **rng_kw)  # sizes the output: one sync
        return muons, drawn

    @staticmethod
    def _rng_kw(rng: torch.Generator | None) -> dict:
        """``generator=rng`` for a shard's draws; nothing for the global RNG (a compiled
        generator, and a custom ``penalty_fn``, need not take the keyword)."""
        return {} if rng is None else {"generator": rng}

    def _autocast(self, enabled: bool = True):
        if self.amp_dtype is None or not enabled:
            return contextlib.nullcontext()
        # a recording keeps no cast cached past its end (torch's rule for CUDA graphs)
        return torch.autocast(
            self.device.type, dtype=self.amp_dtype, cache_enabled=not self.capturing
        )

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
            "generator": float(self.opt_g.param_groups[0]["lr"]),
            "critic": float(self.opt_c.param_groups[0]["lr"]),
        }

    def state_dict(self) -> dict:
        """Optimizers (tagged with their type), scaler and counters.

        No scheduler state: the learning rates are a pure function of the step, and a
        scheduler's own counters (``_step_count``) would make two saves of the same state
        differ in their bytes."""
        return {
            "version": STATE_VERSION,
            "opt_g": host_rates(ckpt.optimizer_state(self.opt_g)),
            "opt_c": host_rates(ckpt.optimizer_state(self.opt_c)),
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
        if self.graphs is not None:  # recorded on the optimizer tensors replaced below
            self.graphs.reset()
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
        self._set_rates()

    def set_horizon(self, steps: int) -> None:
        """Set the cosine schedule's horizon to ``steps`` generator steps and the current
        learning rates from it (``train.budget_minutes`` decides the run's length early in
        the run: :mod:`muongen.train.budget`). Within the warm-up the rates do not depend
        on the horizon, so a horizon set then leaves the rates a pure function of the step."""
        o = self.optim_cfg
        if o.schedule == "cosine" and steps <= o.warmup_steps:
            raise ValueError(f"a cosine horizon of {steps} steps is within the warm-up")
        factor = functools.partial(
            lr_factor,
            schedule=o.schedule,
            warmup_steps=o.warmup_steps,
            decay_steps=steps,
            min_lr_ratio=o.min_lr_ratio,
        )
        for sched in (self.sched_g, self.sched_c):
            sched.lr_lambdas = [factor]
        self._set_rates()

    def _set_rates(self) -> None:
        """The learning rates of the current generator step, from the schedule."""
        for sched in (self.sched_g, self.sched_c):
            sched.last_epoch = self.generator_step_count
            lrs = [base * sched.lr_lambdas[0](sched.last_epoch) for base in sched.base_lrs]
            for group, lr in zip(sched.optimizer.param_groups, lrs):
                if torch.is_tensor(group["lr"]):  # a CUDA graph reads this very tensor
                    group["lr"].fill_(lr)
                else:
                    group["lr"] = lr
            sched._last_lr = lrs  # what get_last_lr() reports
