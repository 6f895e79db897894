"""The ``hurdle`` multiplicity head: P(N = 0) exactly, and a quantile function above it.

Counts of muons per event are far from log-normal: at the production mixture most events
are empty and the rest have one or two muons, while rich events spread over decades. A
Gaussian in log10(N + 1) puts mass where neither is (measured offline on negative-binomial
counts of shape 1, the synthetic physics: its best fit is 9-22x the statistical floor).
This head models the two parts separately:

* ``zero``: an MLP giving the logit of p0 = P(N = 0 | condition), trained by the binary
  cross-entropy of "the event is empty";
* ``knots``: an MLP giving, for events with N >= 1, the quantiles q_k of the dequantised
  y = log10(N + 0.5 + U), U ~ U(0, 1), at K fixed levels t_k = Phi(z_k), z_k evenly
  spaced in [-Z, Z] (denser in the tails), trained by the pinball loss at each level.
  They are monotone by construction: q_0 plus a cumulative sum of softplus increments.
  (y rounds back to N exactly: round(10^y - 1) = N for y in [log10(N + 0.5), log10(N + 1.5)).)

The quantile function Q(t) interpolates linearly between the knots; beyond the end knots
it continues with exponential tails whose slope matches the end segments (so draws are
unbounded but finite, and a few events sample beyond the outer knots as the data does).

* ``exact`` (``model.mult_exact`` = M > 0): the smallest counts get probabilities of their
  own: an MLP gives the logits of h_m = P(N = m | N >= m, condition) for m = 1..M, each
  trained by the binary cross-entropy of "N = m" over the events with N >= m, and the
  knots then fit only the events with N > M. Why: where one muon is as likely as all
  the rest (deep or inclined showers), the dequantised density drops by half at N = 2,
  and the pinball-fitted knots, linear between levels, put ~8-10% of the single-muon
  events at two muons or more (measured on held-out production showers: P(N = 1 | N >=
  1) 0.45 against 0.49; 32 or 64 knots did not change it, exact probabilities for N = 1
  and 2 did: 0.48; docs/fidelity.md, "The multiplicity head").

Sampling takes one N(0, 1) draw per event, as the log-normal head does (the exported
generator's ``event_noise[:, 0]``): u = Phi(z); the event is empty where u < p0, else
v = (u - p0) / (1 - p0) walks the exact counts (N = m where v falls in m's share of what
is left) and the rest is y = Q(v') at the level v' left above them, with at least M + 1
muons (M = 0: y = Q(v), at least one muon). Everything is written with tensor operations
only (erf, comparisons, gather, log), so it traces for TorchScript and ONNX.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from muongen.model.layers import Linear, mlp

#: y of a single muon: log10(2) rounds to N = 1 (log10(1.5) would round to 0, half-even)
ONE_MUON = math.log10(2.0)
#: bounds of the quantile level inside the quantile function (keeps the tails' logs finite)
TAU_EPS = 1e-7


def normal_cdf(z: torch.Tensor) -> torch.Tensor:
    """Phi(z), the standard normal CDF."""
    return 0.5 * (1.0 + torch.erf(z * (1.0 / math.sqrt(2.0))))


def knot_levels(n_knots: int, z_max: float) -> torch.Tensor:
    """(K,) float64 quantile levels Phi(z_k), z_k evenly spaced in [-z_max, z_max]."""
    return normal_cdf(torch.linspace(-z_max, z_max, n_knots, dtype=torch.float64))


def interpolate_quantiles(
    knots: torch.Tensor, levels: torch.Tensor, tau: torch.Tensor
) -> torch.Tensor:
    """Q(tau) per event from its knots: linear between them, exponential tails outside.

    Args:
        knots: (B, K) increasing knot values q_k.
        levels: (K,) increasing levels t_k in (0, 1).
        tau: (B,) levels to evaluate, in [0, 1] (clamped to [TAU_EPS, 1 - TAU_EPS]).

    Returns:
        (B,) Q(tau). The lower tail is q_0 - b0 log(t_0 / tau) with b0 = t_0 times the
        first segment's slope, the upper q_{K-1} + b1 log((1 - t_{K-1}) / (1 - tau)) with
        b1 = (1 - t_{K-1}) times the last segment's slope: Q and its slope are continuous.
    """
    tau = tau.clamp(TAU_EPS, 1.0 - TAU_EPS).unsqueeze(-1)  # (B, 1)
    levels = levels.to(knots.dtype)
    n = levels.shape[0]
    # segment j in [0, K - 2]: how many inner levels lie at or below tau (no searchsorted,
    # which ONNX lacks)
    j = (tau >= levels[1:-1]).sum(-1, keepdim=True)  # (B, 1) int64
    q_lo, q_hi = knots.gather(1, j), knots.gather(1, j + 1)
    t_lo, t_hi = levels[j], levels[j + 1]
    slope = (q_hi - q_lo) / (t_hi - t_lo)
    inner = q_lo + (tau - t_lo) * slope
    t0, t1 = levels[0], levels[n - 1]
    first = (knots[:, 1:2] - knots[:, 0:1]) / (levels[1] - t0)
    last = (knots[:, n - 1 : n] - knots[:, n - 2 : n - 1]) / (t1 - levels[n - 2])
    below = knots[:, 0:1] - first * t0 * torch.log(t0 / tau)
    above = knots[:, n - 1 : n] + last * (1.0 - t1) * torch.log((1.0 - t1) / (1.0 - tau))
    out = torch.where(tau < t0, below, torch.where(tau > t1, above, inner))
    return out.squeeze(-1)


class HurdleMultiplicity(nn.Module):
    """P(N = 0 | c), P(N = m | N >= m, c) for m = 1..M (``exact``), and the quantiles of
    log10(N + 0.5 + U) given N > M (module docstring).

    The three outputs come from MLPs of their own (``shared=False``) or from one trunk
    with a linear layer for all of them (``shared=True``, ``model.mult_trunk: shared``).

    Attributes:
        zero: MLP, standardised condition (B, C) -> logit of P(N = 0) (B, 1).
        exact: MLP, standardised condition (B, C) -> logits of h_1..h_M (B, M); None
            where M = 0.
        knots: MLP, standardised condition (B, C) -> q_0 and K - 1 raw increments (B, K).
        trunk, out: with ``shared``, in their place: the MLP to its last hidden activation
            and one Linear to [logit p0, M exact logits, K raw knots].
        levels: buffer (K,) the knots' quantile levels.
        n_exact: M.
    """

    def __init__(
        self,
        n_cond: int,
        hidden: list[int],
        n_knots: int,
        z_max: float,
        n_exact: int = 0,
        shared: bool = False,
    ) -> None:
        super().__init__()
        if n_knots < 2:
            raise ValueError(f"model.mult_knots must be at least 2, got {n_knots}")
        if n_exact < 0:
            raise ValueError(f"model.mult_exact must be 0 or more, got {n_exact}")
        self.n_exact = n_exact
        self.n_knots = n_knots
        self.shared = shared
        if shared:
            # one trunk (the original trainer's single multiplicity MLP, to its last hidden
            # activation) and one linear layer for every output: [logit p0, M exact
            # logits, K raw knots]
            self.trunk = mlp(n_cond, hidden, None, activation=nn.ELU)
            self.out = Linear(hidden[-1] if hidden else n_cond, 1 + n_exact + n_knots)
        else:
            self.zero = mlp(n_cond, hidden, 1, activation=nn.ELU)
            self.exact = mlp(n_cond, hidden, n_exact, activation=nn.ELU) if n_exact else None
            self.knots = mlp(n_cond, hidden, n_knots, activation=nn.ELU)
        self.register_buffer("levels", knot_levels(n_knots, z_max).float())
        with torch.no_grad():  # start near the fewest muons the knots model (M + 1) and a
            # few more: q_0 ~ log10(M + 2), steps ~ 0.05 dex
            knots = self.output_bias("knots")
            knots.fill_(-3.0)
            knots[0] = self.lowest
            self.output_bias("zero").zero_()

    def output_bias(self, part: str) -> torch.Tensor:
        """The bias of one output, a view to set in place: ``zero`` (1,) the logit of p0,
        ``exact`` (M,) the exact counts' logits, ``knots`` (K,) q_0 and the raw
        increments; whether the outputs have MLPs of their own or share a trunk."""
        if not self.shared:
            return getattr(self, part)[-1].bias
        m = self.n_exact
        bounds = {"zero": (0, 1), "exact": (1, 1 + m), "knots": (1 + m, 1 + m + self.n_knots)}
        a, b = bounds[part]
        return self.out.bias[a:b]

    def outputs(self, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Standardised condition (B, C) -> logit p0 (B,), the exact counts' logits (B, M)
        (None where M = 0) and the raw knots (B, K): from the three MLPs, or from the
        shared trunk's one output layer (``model.mult_trunk``)."""
        if not self.shared:
            exact = self.exact(c) if self.exact is not None else None
            return self.zero(c).squeeze(-1), exact, self.knots(c)
        out = self.out(self.trunk(c))
        m = self.n_exact
        return out[:, 0], (out[:, 1 : 1 + m] if m else None), out[:, 1 + m :]

    @property
    def lowest(self) -> float:
        """log10(M + 2): the least y the quantile function gives (M + 1 muons)."""
        return math.log10(self.n_exact + 2.0)

    def params(self, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Standardised condition (B, C) -> logit p0 (B,) and increasing knots (B, K)."""
        logit, _, raw = self.outputs(c)
        return logit, _monotone(raw)

    def sample(self, c: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """(B,) log10(N + 1) to round counts from, given one N(0, 1) draw z (B,) per event.

        0 where the event is empty, log10(m + 1) exactly where the draw falls on an exact
        count m <= M, else at least log10(M + 2).

        On the CPU, outside tracing and with MLPs of their own, the exact counts' and the
        knots' MLPs run only on the events the draw leaves with muons (most events are
        empty at the production mix, and the head was most of sampling's time there); the
        same values row by row.
        """
        whole = self.shared or c.device.type != "cpu"
        if whole or torch.jit.is_tracing() or torch.compiler.is_compiling():
            logit, exact, raw = self.outputs(c)
            p0 = torch.sigmoid(logit)
            u = normal_cdf(z.to(raw.dtype))
            y = self._above_zero(u, p0, exact, raw)
            return torch.where(u < p0, torch.zeros_like(y), y)
        p0 = torch.sigmoid(self.zero(c).squeeze(-1))
        u = normal_cdf(z.to(p0.dtype))
        rows = torch.nonzero(~(u < p0)).squeeze(-1)  # (B',) the events with muons
        y = torch.zeros_like(u)
        if rows.numel():
            c = c[rows]
            exact = self.exact(c) if self.exact is not None else None
            y[rows] = self._above_zero(u[rows], p0[rows], exact, self.knots(c))
        return y

    def _above_zero(
        self, u: torch.Tensor, p0: torch.Tensor, exact: torch.Tensor | None, raw: torch.Tensor
    ) -> torch.Tensor:
        """(B,) log10(N + 1) of events drawn with muons, at levels u (B,) above p0 (B,),
        given the exact counts' logits (B, M) (or None) and the raw knots (B, K): an exact
        count or the quantile function's draw."""
        tau = (u - p0) / (1.0 - p0).clamp(min=TAU_EPS)
        exact_y, tau = self._walk(exact, tau)
        y = interpolate_quantiles(_monotone(raw), self.levels, tau).clamp(min=self.lowest)
        if exact_y is not None:
            y = torch.where(exact_y > 0, exact_y, y)
        return y

    def _walk(
        self, exact: torch.Tensor | None, v: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The exact counts' part of a draw at level v (B,) in [0, 1) of an event with
        muons, given the exact counts' logits (B, M) (:meth:`outputs`).

        Returns log10(m + 1) (B,) where v falls in count m's share (m = 1..M: the first m
        with v < h_m, v rescaled to (v - h_m) / (1 - h_m) after each count it passes), 0
        elsewhere, and the level left for the quantile function (B,); (None, v) where M = 0.
        """
        if exact is None:
            return None, v
        h = torch.sigmoid(exact).to(v.dtype)  # (B, M)
        exact_y = torch.zeros_like(v)
        taken = torch.zeros_like(v, dtype=torch.bool)
        for m in range(1, self.n_exact + 1):
            h_m = h[:, m - 1]
            hit = (v < h_m) & ~taken
            exact_y = torch.where(hit, torch.full_like(v, math.log10(m + 1.0)), exact_y)
            taken = taken | hit
            v = torch.where(taken, v, (v - h_m) / (1.0 - h_m).clamp(min=TAU_EPS))
        return exact_y, v.clamp(0.0, 1.0)

    def loss(
        self, c: torch.Tensor, counts: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """BCE of "empty" over all events, the BCE of "N = m" over the events with N >= m
        for each exact count m = 1..M, and the mean pinball loss of the knots over the
        events with N > M (their targets dequantised with fresh uniform noise, drawn from
        ``generator`` when given)."""
        logit, exact, raw = self.outputs(c)
        # fp32 targets and loss under autocast
        logit, knots = logit.float(), _monotone(raw).float()
        empty = counts == 0
        loss = F.binary_cross_entropy_with_logits(logit, empty.float())
        if exact is not None:
            exact_logits = exact.float()  # (B, M)
            for m in range(1, self.n_exact + 1):
                at = (counts >= m).float()
                bce = F.binary_cross_entropy_with_logits(
                    exact_logits[:, m - 1], (counts == m).float(), reduction="none"
                )
                loss = loss + (bce * at).sum() / at.sum().clamp(min=1.0)
        n = counts.float()
        u = torch.rand(n.shape, generator=generator, device=n.device, dtype=n.dtype)
        y = torch.log10(n + 0.5 + u).unsqueeze(-1)  # (B, 1)
        resid = y - knots  # (B, K)
        pinball = torch.maximum(self.levels * resid, (self.levels - 1.0) * resid).mean(-1)
        kept = (counts > self.n_exact).float()
        return loss + (pinball * kept).sum() / kept.sum().clamp(min=1.0)


def _monotone(raw: torch.Tensor) -> torch.Tensor:
    """(B, K) raw knot outputs -> increasing knots: q_0, then q_0 plus the cumulative sum
    of the softplus of the other K - 1."""
    steps = F.softplus(raw[:, 1:])
    return torch.cat([raw[:, :1], raw[:, :1] + torch.cumsum(steps, dim=1)], dim=1)
