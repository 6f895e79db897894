"""Energy-balanced event weights (``optim.energy_balance``).

On a steep primary spectrum the showers of the top decade are a small share of a batch (the
`rich` mix: 0.6% of the rows above 7.7e7 GeV), so the critic sees a handful of them a step
and the generator's tail gets little of its gradient. ``optim.energy_balance`` weighs each
scored event by ``(n_max / n_bin) ** exponent``, at most ``optim.energy_balance_max``:
``n_bin`` the microbatch's events with muons in the event's bin of primary energy (bins
:data:`BIN_DEX` wide in log10 E0), ``n_max`` those of the fullest bin. Exponent 1 gives
every bin the same total weight (a flat log10 E0), 0 changes nothing.

An event's real and fake bundles take the same weight, so the conditional optimum is the
same; what changes is which conditions the critic and the generator spend their capacity
on. The factors multiply the set critic's event weights (``optim.event_weight``) and the
per-muon critic's muon weights, each rescaled to keep its total over the microbatch (the
losses keep their scale; a microbatch cut into shards gives its parts its own factors, so
the sharded update is the unsharded one). The penalties stay unweighted. Only tensor
operations, no read back to the host (a CUDA graph records them).
"""

from __future__ import annotations

import math

import torch

from muongen import schema

#: width of the primary-energy bins that the weights flatten (log10 GeV)
BIN_DEX = 0.5
#: the bins cover log10 E0 in [0, 12); energies outside fall in the first or the last bin
N_BINS = 24
#: log10 E0 = the condition's first feature + this (:func:`muongen.schema.condition_features`)
_LOG10_SCALE = math.log10(schema.ENERGY_SCALE_GEV)


def energy_bins(cond: torch.Tensor) -> torch.Tensor:
    """(B,) int64 bin of each event's primary energy, from the condition features (B, 4)."""
    log_e = cond[:, 0].detach().float() + _LOG10_SCALE
    return torch.floor(log_e / BIN_DEX).clamp(0, N_BINS - 1).to(torch.int64)


def raw_factors(
    cond: torch.Tensor, counts: torch.Tensor, exponent: float, cap: float
) -> torch.Tensor:
    """(B,) each event's unnormalised factor: ``(n_max / n_bin) ** exponent``, at most
    ``cap``, over the events with muons (``counts > 0``); 0 for events without muons."""
    has = counts > 0
    bins = energy_bins(cond)
    n = torch.zeros(N_BINS, dtype=torch.float32, device=cond.device)
    n.index_add_(0, bins, has.float())
    per_bin = (n.max() / n.clamp(min=1.0)).pow(exponent).clamp(max=cap)
    return torch.where(has, per_bin.index_select(0, bins), 0.0)


def balance(
    cond: torch.Tensor, counts: torch.Tensor, terms: torch.Tensor, exponent: float, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The factors of a microbatch's events.

    Args:
        cond: (B, 4) condition features.
        counts: (B,) muons per event (0 for padding events).
        terms: (B,) the events' unbalanced WGAN weight terms (``optim.event_weight``'s
            log(1 + N) or sqrt(N), or 1 for every event with muons).
        exponent, cap: ``optim.energy_balance`` and ``optim.energy_balance_max``.

    Returns:
        (B,) factors of the events' WGAN weights, scaled so that ``sum(terms * f)`` is
        ``sum(terms)``, and (B,) factors of their muons' per-muon weights, scaled so that
        ``sum(counts * g)`` is ``sum(counts)``.
    """
    r = raw_factors(cond, counts, exponent, cap)
    t = terms.float()
    c = counts.float()
    events = r * (t.sum() / (t * r).sum().clamp(min=1e-12))
    muons = r * (c.sum() / (c * r).sum().clamp(min=1e-12))
    return events, muons
