"""The generator: condition -> how many muons, then each muon's features.

Three networks (design section 3):

* multiplicity head, ``4 -> 64 -> 128 -> 64 -> ...`` MLPs (ELU); ``ModelConfig.multiplicity``
  says what it predicts and how counts follow: ``hurdle`` (default): P(N = 0) and the
  quantiles of the dequantised log10(N + 1) of non-empty events, each from its own MLP
  or all from one (``model.mult_trunk``; :mod:`muongen.model.multiplicity`), one N(0, 1)
  draw per event; ``round`` (the original
  trainer's): the mean m of log10(N + 1), counts = round(max(10^m - 1, 0)), deterministic
  given the condition, so wherever the mean multiplicity is below 0.5 no muon is ever
  made; ``lognormal``: a second head of the same shape predicts log s, and x ~ Normal(m, s)
  is drawn per event, counts = round(max(10^x - 1, 0)) (a discretised log-normal in
  N + 1); both trained by the Gaussian negative log-likelihood of the real log10(N + 1),
  whose mean part is the original MSE. Counts are capped at
  ``ModelConfig.max_generated_muons``;
* global network ``[z_global, condition, log10(N + 1)] -> global_hidden... -> context``
  (LayerNorm, LeakyReLU 0.2), one context per event;
* local network ``[context of its event, z_local] -> 128 -> 64 -> F`` per muon (with
  ``model.energy_scale_head``, each event's energy outputs then mapped a + exp(b) e by a
  linear head on its context: :func:`energy_scale`); its
  first layer is computed split, the context part once per event and the noise part per
  muon (:func:`muongen.model.layers.split_linear`), so a muon costs 16 inputs, not 144.
  With fewer muons than events only events with muons reach the per-event networks.
  Without autograd on the CPU (fakes for the critic, sampling) it runs over cache-sized
  blocks of muons (:meth:`Generator._local`).

Conditions enter every network standardised and the local network's output is
un-standardised (:mod:`muongen.model.normaliser`; the radial representation's r is
modelled in log space, so it comes out positive). In the xy representation each event's
bundle is then turned by a uniform random azimuth (``ModelConfig.lateral_rotate``): the
conditions carry no azimuth, so this symmetry is exact, and x and y get mean 0 and a
common marginal by construction instead of by training. The global network is fed
log10(N + 1) of the counts actually generated, so training with the real events' counts
(teacher forcing) and sampling with the head's counts feed it the same quantity. Muons
stay flat: (N, F) with counts (B,), event after event.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from muongen import schema
from muongen.config import ModelConfig
from muongen.model.layers import (
    add_muon_part,
    leaky_relu_inplace,
    mlp,
    split_linear,
    split_parts,
    zero_linear,
)
from muongen.model.losses import multiplicity_loss, multiplicity_nll
from muongen.model.multiplicity import HurdleMultiplicity
from muongen.model.normaliser import (
    ConditionStandardiser,
    Standardiser,
    condition_dim,
    muon_standardiser,
    per_nucleon_energy,
)
from muongen.model.pooling import event_index_of

#: muons per block of the local net without autograd on the CPU (Generator._local): a
#: block's activations (2048 x 128 floats, 1 MiB) stay in a core's cache between layers
LOCAL_BLOCK_ROWS = 2048

#: bounds of the predicted log standard deviation of log10(N + 1) (numerical safety)
LOG_STD_MIN, LOG_STD_MAX = -7.0, 1.0

#: bounds of the energy scale head's log width (model.energy_scale_head): e^-4 to e^2
ENERGY_LOG_WIDTH_MIN, ENERGY_LOG_WIDTH_MAX = -4.0, 2.0


def energy_scale(head_out: torch.Tensor) -> torch.Tensor:
    """The energy scale head's (B, 2) output [a, b] -> (B, 2) [shift a, width exp(b)], b
    clamped to [:data:`ENERGY_LOG_WIDTH_MIN`, :data:`ENERGY_LOG_WIDTH_MAX`]."""
    shift, log_width = head_out.unbind(-1)
    width = torch.exp(log_width.clamp(ENERGY_LOG_WIDTH_MIN, ENERGY_LOG_WIDTH_MAX))
    return torch.stack([shift, width], dim=-1)


def scale_energy(out: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(N, F) standardised outputs with column 0 mapped to a + w e; ``scale`` (N, 2) holds
    [a, w] of each muon's event (:func:`energy_scale`, repeated per muon)."""
    energy = scale[:, 0] + scale[:, 1] * out[:, 0]
    return torch.cat([energy.unsqueeze(-1), out[:, 1:]], dim=1)


#: model.energy_fold's floor before the normalisers are fitted: log10(E / 1e6 GeV) of
#: 1e-24 GeV, below any energy (finite, so the fold stays the identity, never NaN)
ENERGY_FLOOR_UNFITTED = -30.0


#: fold_energy's least window (dex): an event whose E0 / A is at or under the threshold
FOLD_MIN_WIDTH = 1e-6


def fold_energy(
    log_e: torch.Tensor, floor: torch.Tensor | float, ceiling: torch.Tensor | None = None
) -> torch.Tensor:
    """Fold log energies (N,) into [floor, ceiling] (``model.energy_fold``): a value over
    ``ceiling`` (N,) is reflected below it, one under ``floor`` above it, and one that
    would overshoot the other edge too is reflected again (a triangle wave of period twice
    the window). Without a ceiling only the floor reflects. The inside is untouched; the
    map is continuous with slope +-1, so the gradient keeps its size past an edge."""
    if ceiling is None:
        return floor + (log_e - floor).abs()
    width = (ceiling - floor).clamp(min=FOLD_MIN_WIDTH)
    phase = torch.remainder(log_e - floor, 2.0 * width)
    return floor + width - (phase - width).abs()


def counts_from_log_mult(log_mult: torch.Tensor, max_muons: int = 0) -> torch.Tensor:
    """Muons per event from the head's output: round(max(10^m - 1, 0)), capped.

    Args:
        log_mult: (B,) predicted log10(N + 1).
        max_muons: cap per event (0: none). NaN predictions give 0 muons.

    Returns:
        (B,) int64 counts.
    """
    m = torch.nan_to_num(log_mult.detach().float(), nan=0.0)
    # bound m so that 10^m stays finite before the int cast
    m = m.clamp(max=math.log10(max_muons + 1.0) if max_muons > 0 else 30.0)
    counts = torch.round(torch.clamp(10.0**m - 1.0, min=0.0)).to(torch.int64)
    return counts.clamp(max=max_muons) if max_muons > 0 else counts


def events_with_muons(
    counts: torch.Tensor, n_muons: int, exact: bool | None = None
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The events that have muons, in order: their rows (B',) and counts (B',).

    Events without muons make nothing, so the per-event networks need not see them. On
    the CPU B' is their exact number (reading it costs nothing there); elsewhere it is
    min(B, N), known on the host without a sync (``nonzero_static``), and the rows past
    the events with muons are padding: count 0, row 0.

    Args:
        counts: (B,) int64; n_muons: counts.sum().
        exact: B' exact (True) or min(B, N) (False); None: exact on the CPU only.

    Returns:
        rows (None when every event is kept) and the kept events' counts.
    """
    b = counts.shape[0]
    if exact is None:
        exact = counts.device.type == "cpu"
    size = int(torch.count_nonzero(counts)) if exact else min(b, n_muons)
    if size == b:
        return None, counts
    rows = torch.nonzero_static(counts, size=size, fill_value=-1).squeeze(-1)  # (B',)
    keep = rows >= 0
    rows = rows.clamp(min=0)
    return rows, torch.where(keep, counts[rows], 0)


def _noise(shape: tuple, like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Standard normal noise on ``like``'s device and dtype."""
    if generator is None:  # no generator= keyword: torch.compile traces this overload only
        return torch.randn(shape, device=like.device, dtype=like.dtype)
    return torch.randn(shape, generator=generator, device=like.device, dtype=like.dtype)


#: exp_noise's clamp on z: Phi(-5) = 2.9e-7 is still resolved in float32 by erf, and
#: draws past it (3 in 10 million) take e = 15.07
EXP_NOISE_Z_MAX = 5.0


def exp_noise(z: torch.Tensor) -> torch.Tensor:
    """N(0, 1) draws -> Exp(1) - 1 draws (mean 0, std 1): e = -log(Phi(-z)) - 1, with
    Phi(-z) = (1 - erf(z / sqrt 2)) / 2 and z clamped at :data:`EXP_NOISE_Z_MAX`. Only
    erf and log: the same operations run in the sampler and in an exported graph. Computed
    in fp32 whatever ``z``'s dtype: in bf16, 1 - erf(z / sqrt 2) is 0 from z ~ 2.7 (the
    log's -inf made a bf16 step's losses NaN)."""
    z32 = z.float().clamp(max=EXP_NOISE_Z_MAX)
    tail = 0.5 * (1.0 - torch.erf(z32 * (1.0 / math.sqrt(2.0))))
    return (-torch.log(tail) - 1.0).to(z.dtype)


def with_exp_noise(z_local: torch.Tensor, n_exp: int) -> torch.Tensor:
    """(N, Zl) N(0, 1) per-muon noise with its first ``n_exp`` columns made Exp(1) - 1
    (``model.local_exp_noise``; 0: ``z_local`` itself)."""
    if n_exp == 0:
        return z_local
    return torch.cat([exp_noise(z_local[:, :n_exp]), z_local[:, n_exp:]], dim=1)


def _uniform(n: int, like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """(n,) U(0, 1) draws on ``like``'s device and dtype (the angles of :class:`Generator`)."""
    if generator is None:  # as in _noise: torch.compile traces this overload only
        return torch.rand((n,), device=like.device, dtype=like.dtype)
    return torch.rand((n,), generator=generator, device=like.device, dtype=like.dtype)


class Generator(nn.Module):
    """Conditional generator of ragged muon sets (features, not physical units).

    Attributes:
        representation: ``"xy"`` (features [log E, x/500, y/500]) or ``"radial"``
            ([log E, r/500], r > 0 (modelled in log space); the azimuth is drawn uniformly
            by :func:`muongen.schema.muon_physical`).
        n_features: F, the per-muon feature count of the representation.
        multiplicity_mode: ``"lognormal"``, ``"hurdle"`` or ``"round"`` (see the module
            docstring).
        multiplicity: the head: an MLP predicting the mean of log10(N + 1) (``round``,
            ``lognormal``) or a :class:`HurdleMultiplicity` (``hurdle``).
        multiplicity_spread: ``lognormal``: an MLP predicting its log std; else None.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.representation = cfg.representation
        self.n_features = schema.muon_feature_dim(cfg.representation)
        self.z_global = cfg.z_global
        self.z_local = cfg.z_local
        self.local_exp_noise = cfg.local_exp_noise
        self.max_muons = cfg.max_generated_muons
        self.multiplicity_mode = cfg.multiplicity
        # polar: the local net gives [log E, log r] and each muon draws its own azimuth,
        # which makes turning the bundle needless
        self.polar = cfg.representation == "xy" and cfg.lateral_head == "polar"
        self.rotate = cfg.representation == "xy" and cfg.lateral_rotate and not self.polar
        nc = condition_dim(cfg)
        self.cond_norm = ConditionStandardiser(cfg.slant_depth)
        self.muon_norm = muon_standardiser(cfg)
        # polar: [log E, r] standardised, r in log space (fitted by fit_normalisers)
        self.polar_norm = Standardiser(2, log_features=(1,)) if self.polar else None
        # per_nucleon: the energy output is log10(E / (E0 / A)), standardised by its own
        # fitted mean and spread, E0 / A added back (model.energy_reference)
        self.energy_norm = Standardiser(1) if cfg.energy_reference == "per_nucleon" else None
        # energy_fold: the least real muon energy, log10(E / 1e6 GeV), fitted with the
        # normalisers (None without the fold: not in the state, older checkpoints load)
        floor = torch.tensor(ENERGY_FLOOR_UNFITTED) if cfg.energy_fold else None
        self.register_buffer("energy_floor", floor)
        # train.calibrate_rows: the muon energies' map fitted after training
        # (muongen.model.calibration). Only open_for_inference attaches it, for sampling: a
        # trained generator's state never holds it (the checkpoint keeps it apart)
        self.energy_calibration: nn.Module | None = None
        # and the muons' distances to the axis (model.calibration.RadiusCalibration), the same
        self.radius_calibration: nn.Module | None = None
        self.multiplicity_spread = None
        if cfg.multiplicity == "hurdle":
            self.multiplicity = HurdleMultiplicity(
                nc,
                cfg.mult_hidden,
                cfg.mult_knots,
                cfg.mult_knot_z,
                cfg.mult_exact,
                shared=cfg.mult_trunk == "shared",
            )
        else:
            self.multiplicity = mlp(nc, cfg.mult_hidden, 1, activation=nn.ELU)
        if cfg.multiplicity == "lognormal":
            self.multiplicity_spread = mlp(nc, cfg.mult_hidden, 1, activation=nn.ELU)
            with torch.no_grad():  # start near a spread of 0.4 dex, not 1
                self.multiplicity_spread[-1].bias.fill_(-1.0)
        self.global_net = mlp(
            cfg.z_global + nc + 1,
            [*cfg.global_hidden, cfg.context],
            None,
            # in place: a LayerNorm's backward reads its input, not its output
            activation=leaky_relu_inplace,
            layer_norm=True,
        )
        # in-place activations: the per-muon rows are the sampler's biggest tensors
        self.local_net = mlp(
            cfg.context + cfg.z_local,
            cfg.local_hidden,
            2 if self.polar else self.n_features,
            activation=leaky_relu_inplace,
        )
        # the bundle's energy scale: zero at the start, so the map starts as the identity;
        # made without a random init, so the global RNG, and with it every other weight
        # and draw of a seeded run, stays that of the same run without the head
        self.energy_scale = None
        if cfg.energy_scale_head:
            self.energy_scale = zero_linear(cfg.context, 2)

    @property
    def stochastic_multiplicity(self) -> bool:
        """Whether counts take one N(0, 1) draw per event (all modes but ``round``)."""
        return self.multiplicity_mode != "round"

    def multiplicity_params(self, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, 4) condition features -> mean (B,) and log std (B,) of log10(N + 1).

        The log std is None in ``round`` mode (no spread: the mean is rounded). The
        ``hurdle`` head has neither (its parameters: ``multiplicity.params``).
        """
        if self.multiplicity_mode == "hurdle":
            raise ValueError("the hurdle multiplicity head has no mean and spread")
        c = self.cond_norm(cond)
        mean = self.multiplicity(c).squeeze(-1)
        if self.multiplicity_spread is None:
            return mean, None
        log_std = self.multiplicity_spread(c).squeeze(-1).clamp(LOG_STD_MIN, LOG_STD_MAX)
        return mean, log_std

    def sample_log_multiplicity(
        self, cond: torch.Tensor, *, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """(B,) log10(N + 1) per event: the mean (round), a draw from Normal(m, s)
        (lognormal), or 0 / a draw of the quantile function (hurdle)."""
        if self.multiplicity_mode == "hurdle":
            c = self.cond_norm(cond)
            z = _noise((cond.shape[0],), c, generator)
            return self.multiplicity.sample(c, z)
        mean, log_std = self.multiplicity_params(cond)
        if log_std is None:
            return mean
        return mean + torch.exp(log_std) * _noise(tuple(mean.shape), mean, generator)

    def multiplicity_loss(
        self,
        cond: torch.Tensor,
        counts: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """The head's training loss on the real counts (B,) of conditions (B, 4): the MSE
        of the mean (round), the Gaussian NLL (lognormal), or the hurdle's BCE plus
        pinball loss (:meth:`HurdleMultiplicity.loss`, its noise from ``generator``)."""
        if self.multiplicity_mode == "hurdle":
            return self.multiplicity.loss(self.cond_norm(cond), counts, generator)
        mean, log_std = self.multiplicity_params(cond)
        if log_std is None:  # the original's MSE
            return multiplicity_loss(mean.float(), counts)
        return multiplicity_nll(mean.float(), log_std.float(), counts)

    def forward(
        self, cond: torch.Tensor, *, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample events for the given conditions.

        Args:
            cond: (B, 4) condition features.
            generator: optional RNG for the noise (else the global one).

        Returns:
            muons (N, F) features, counts (B,) int64 (N = counts.sum()), log_mult (B,)
            the log10(N + 1) the counts were rounded from (in ``lognormal`` and
            ``hurdle`` mode the drawn value, in ``round`` mode the predicted mean).
            Sizing the output reads N on the host: one synchronisation per call.
        """
        log_mult = self.sample_log_multiplicity(cond, generator=generator)
        counts = counts_from_log_mult(log_mult, self.max_muons)
        muons = self.generate_with_counts(cond, counts, generator=generator)
        return muons, counts, log_mult

    def generate_with_counts(
        self,
        cond: torch.Tensor,
        counts: torch.Tensor,
        n_muons: int | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Muon features for events whose multiplicities are given.

        Args:
            cond: (B, 4) condition features.
            counts: (B,) int64 muons per event.
            n_muons: counts.sum() when the caller knows it (e.g. the real batch's muon
                count); given, nothing is read back from the device.
            generator: optional RNG for the noise.

        Returns:
            (N, F) muon features, event after event.
        """
        if n_muons is None:
            n_muons = int(counts.sum())
        rows, counts = events_with_muons(counts, n_muons)
        # With a seed (``generator``) the per-event noise is drawn for every event and the
        # events with muons take their rows of it: the seed gives the same muons whichever
        # events the per-event nets skip, in the exported generator's noise layout. Without
        # one nothing is reproducible anyway, and only the events with muons draw (at the
        # production multiplicity ~70% of the events are empty: their draws were ~1/3 of
        # sampling's time there).
        every = generator is not None and rows is not None
        n_draw = cond.shape[0] if rows is None or every else rows.shape[0]
        z = _noise((n_draw, self.z_global), cond, generator)
        if rows is not None:  # the per-event nets see only events with muons
            cond = cond[rows]
            z = z[rows] if every else z
        log_n = torch.log10(counts.to(cond.dtype) + 1.0).unsqueeze(-1)  # (B, 1)
        c = self.cond_norm(cond)
        context = self.global_net(torch.cat([z, c, log_n], dim=-1))  # (B, C)
        # the local net's first layer on [context, z_local], split exactly: its context
        # part once per event, its noise part per muon (per-muon cost independent of C)
        z_local = _noise((n_muons, self.z_local), context, generator)
        z_local = with_exp_noise(z_local, self.local_exp_noise)
        out = self._local(context, z_local, counts)  # (N, F) standardised
        if self.energy_scale is not None:  # a + exp(b) e, [a, b] per event from its context
            scale = energy_scale(self.energy_scale(context))
            out = scale_energy(out, torch.repeat_interleave(scale, counts, 0, output_size=n_muons))
        if self.polar:
            muons = self._polar(out, n_muons, generator, cond, counts)
        else:
            muons = self._absolute_energy(out, self.muon_norm.inverse(out), cond, counts)
        if self.rotate:
            # the azimuth is uniform: turn each event's bundle rigidly by a random angle, so
            # x and y have mean 0 and the same marginal by construction (no drift to learn)
            u = _uniform(n_draw, muons, generator)
            if every:
                u = u[rows]
            turn = torch.stack([torch.cos(2 * torch.pi * u), torch.sin(2 * torch.pi * u)], -1)
            turn = torch.repeat_interleave(turn, counts, dim=0, output_size=n_muons)  # (N, 2)
            cos, sin = turn[:, 0], turn[:, 1]  # per event, then repeated: cheaper than per muon
            x, y = muons[:, 1], muons[:, 2]
            muons = torch.stack([muons[:, 0], cos * x - sin * y, sin * x + cos * y], dim=1)
        return self._calibrated_radius(muons, cond, counts)

    def _calibrated_radius(
        self, muons: torch.Tensor, cond: torch.Tensor, counts: torch.Tensor
    ) -> torch.Tensor:
        """``muons`` (N, F) with their distances to the axis through the radius calibration
        when one is attached (``radius_calibration``; ``cond`` (B', 4) and ``counts`` (B',):
        the muons' events); otherwise ``muons`` itself."""
        calibration = self.radius_calibration
        if calibration is None:
            return muons
        n = muons.shape[0]
        n_of_muon = torch.repeat_interleave(counts, counts, output_size=n)
        per_muon = torch.repeat_interleave(cond, counts, dim=0, output_size=n)
        if muons.shape[1] == 2:  # radial: [log E, r]
            r, _ = calibration(muons[:, 1], torch.zeros_like(muons[:, 1]), n_of_muon, per_muon)
            return torch.stack([muons[:, 0], r], dim=1)
        x, y = calibration(muons[:, 1], muons[:, 2], n_of_muon, per_muon)
        return torch.stack([muons[:, 0], x, y], dim=1)

    def _absolute_energy(
        self, out: torch.Tensor, feat: torch.Tensor, cond: torch.Tensor, counts: torch.Tensor
    ) -> torch.Tensor:
        """``feat`` (N, F) un-standardised from ``out`` with, under
        ``model.energy_reference: per_nucleon``, column 0 replaced by the energy measured
        from each event's E0 / A (``cond`` (B', 4) and ``counts`` (B',) of the events the
        muons belong to), and under ``model.energy_fold`` folded into [the data's
        threshold, E0 / A] (:func:`fold_energy`), then through the energy calibration when
        one is attached (``energy_calibration``); otherwise ``feat`` itself."""
        calibration = self.energy_calibration
        if self.energy_norm is None and self.energy_floor is None and calibration is None:
            return feat
        n = out.shape[0]
        ref = torch.repeat_interleave(per_nucleon_energy(cond).to(out.dtype), counts, output_size=n)
        energy = feat[:, 0]
        if self.energy_norm is not None:
            energy = self.energy_norm.inverse(out[:, :1]).squeeze(-1) + ref
        if self.energy_floor is not None:
            energy = fold_energy(energy, self.energy_floor.to(out.dtype), ref)
        if calibration is not None:
            n_of_muon = torch.repeat_interleave(counts, counts, output_size=n)
            log_e0 = torch.repeat_interleave(cond[:, 0], counts, output_size=n)
            depth = torch.repeat_interleave(cond[:, 3], counts, output_size=n)
            energy = calibration(energy, n_of_muon, log_e0, depth, ref)
        return torch.cat([energy.unsqueeze(-1), feat[:, 1:]], dim=-1)

    def _polar(
        self,
        out: torch.Tensor,
        n_muons: int,
        generator: torch.Generator | None,
        cond: torch.Tensor,
        counts: torch.Tensor,
    ) -> torch.Tensor:
        """(N, 2) standardised [log E, log r] -> (N, 3) [log E, x, y] features, each muon
        turned by its own uniform azimuth (drawn after the per-muon noise); ``cond`` and
        ``counts``: the muons' events, for :meth:`_absolute_energy`."""
        energy_r = self._absolute_energy(out, self.polar_norm.inverse(out), cond, counts)
        phi = (2.0 * torch.pi) * _uniform(n_muons, out, generator)
        r = energy_r[:, 1]
        return torch.stack([energy_r[:, 0], r * torch.sin(phi), r * torch.cos(phi)], dim=1)

    def _local(
        self, context: torch.Tensor, z_local: torch.Tensor, counts: torch.Tensor
    ) -> torch.Tensor:
        """The local net on every muon's [context of its event, z_local]: (N, F).

        Without autograd on the CPU (the critic's fakes in training, sampling) the muons
        go through in blocks of :data:`LOCAL_BLOCK_ROWS` rows: a block's (rows, 128) and
        (rows, 64) activations stay in the core's cache from one layer to the next, where
        the whole batch's would go out to memory and back at every layer (the per-muon net
        is bound by memory traffic on the CPU). The same operations on the same rows: the
        result equals the unblocked one to rounding.
        """
        first, rest = self.local_net[0], self.local_net[1:]
        n_muons = z_local.shape[0]
        if (
            torch.is_grad_enabled()
            or z_local.device.type != "cpu"
            or n_muons <= LOCAL_BLOCK_ROWS
            or torch.compiler.is_compiling()
        ):
            return rest(split_linear(first, context, z_local, counts))
        event_part, w_muon = split_parts(first, context)
        event_index = event_index_of(counts, n_muons)
        out = z_local.new_empty(n_muons, self.local_net[-1].out_features)
        for start in range(0, n_muons, LOCAL_BLOCK_ROWS):
            rows = slice(start, start + LOCAL_BLOCK_ROWS)
            hidden = add_muon_part(
                event_part.index_select(0, event_index[rows]), z_local[rows], w_muon
            )
            out[rows] = rest(hidden)
        return out
