"""Gradient penalty (WGAN-GP) on ragged muon sets.

Pairing. Event i has r_i real and f_i fake muons; it contributes k_i = min(r_i, f_i)
pairs: its j-th real muon with its j-th fake muon, j < k_i (order as stored; with
``permute=True`` the real muons are shuffled within each event first). Fake muons are
exchangeable (i.i.d. per-muon noise), so taking the first ones is already a random pick
on the fake side; on the real side it matters only when r_i > f_i, and in training with
the real counts (``train.fake_counts = "real"``) r_i = f_i and every real muon is used.

Interpolation. One alpha ~ U(0, 1) per event, x_j = alpha_i real_j + (1 - alpha_i) fake_j;
the event keeps its condition (the same for the real and the fake event), so the critic
scores the set of the event's interpolated muons under its own condition.

Norm. ``norm="muon"`` (default, the original trainer's): g_j = dD_i / dx_j, the gradient
of the event's score with respect to one interpolated muon's F features, and the penalty
is mean_j (||g_j||_2 - 1)^2 over all paired muons. ``norm="event"``: G_i = the gradient
with respect to all of event i's interpolated muons at once, ||G_i||_2 = sqrt(sum_j
||g_j||^2), and the penalty is mean_i (||G_i|| - 1)^2 over events with pairs. The event
norm is the Lipschitz constraint of the set function in its joint input space; the muon
norm weights busy events by their muon count and, with amax pooling, also pulls muons
that are the maximum of no channel (zero gradient) towards 1. Both use
sqrt(||g||^2 + 1e-12) so a zero gradient has a finite derivative.

Controls: ``max_pairs`` (at most this many pairs, 0: all), drawn ``by`` muons (a
uniform random subset of the valid pairs, the original trainer's) or by events (whole
events in a random order until the cap, the last one cut to fit: each pair is still in
with the same probability, and the penalty's critic scores about a muon-count fewer
events, since a drawn event brings all its pairs; with ``norm="event"`` every drawn
event's gradient is taken over all its muons, not a random few, except the cut one),
``fraction`` (each event takes part with this probability). A batch scored in parts (the
step's CPU shards) draws its pairs once for all its events (:func:`draw_pairs`) and hands
each part its own (``slots``) with the whole batch's count (``denominator``,
:func:`pair_count`): the parts' penalties then sum to the whole batch's, for the same
draws. All of it is index arithmetic
on the device (repeat_interleave, cumsum, topk, argsort, index_add); the tensor shapes depend only
on the number of real muons and on max_pairs, which the host knows, so nothing is read
back from an accelerator (on the CPU the number of events with pairs is read: free).
Rows that are not valid pairs (or not drawn) are parked in one extra dummy event whose
score is left out of the gradient and whose rows are masked out of the mean; rows are
sorted by event (the critic pools contiguous rows) and handed to the critic with their
event index. Only the events with pairs are scored (no other event's score depends on
the interpolated muons): on the CPU exactly those, elsewhere min(B, M) rows padded with
empty events (:func:`muongen.model.generator.events_with_muons`).
"""

from __future__ import annotations

import itertools
from typing import Literal

import torch
from torch import nn

from muongen.model.generator import events_with_muons

_EPS = 1e-12

Norm = Literal["muon", "event"]
Draw = Literal["muons", "events"]


def gradient_penalty(
    critic: nn.Module,
    cond: torch.Tensor,
    real_muons: torch.Tensor,
    real_counts: torch.Tensor,
    fake_muons: torch.Tensor,
    fake_counts: torch.Tensor,
    *,
    max_pairs: int = 0,
    fraction: float = 1.0,
    norm: Norm = "muon",
    alpha: torch.Tensor | None = None,
    permute: bool = False,
    generator: torch.Generator | None = None,
    slots: torch.Tensor | None = None,
    denominator: int | None = None,
    by: Draw = "muons",
) -> torch.Tensor:
    """The (unweighted) gradient penalty of ``critic`` between real and fake events.

    Args:
        critic: called as ``critic(muons, cond, counts, event_index)`` -> (B,) scores, with
            the rows grouped by event.
        cond: (B, 4) condition features.
        real_muons: (N_r, F) real muons, event after event; real_counts: (B,) int64.
        fake_muons: (N_f, F) fake muons, event after event; fake_counts: (B,) int64.
        max_pairs: use at most this many pairs (0: all), drawn ``by``.
        fraction: probability that an event contributes its pairs.
        norm: ``"muon"`` or ``"event"`` (see the module docstring).
        alpha: (B,) interpolation weights; drawn U(0, 1) when None (tests pass them).
        permute: shuffle the real muons within each event before pairing.
        generator: the RNG of the random draws (else the global one).
        slots: the real muons (ascending) whose pairs enter, drawn by the caller
            (:func:`draw_pairs`); ``max_pairs`` and ``fraction`` are then not applied.
        denominator: divide the sum of the pairs' (``"muon"``) or events' (``"event"``)
            terms by this instead of their number here (a part of a batch: the batch's).
        by: draw the ``max_pairs`` pairs by ``"muons"`` (a uniform subset) or by
            ``"events"`` (whole events in a random order, the last one cut).

    Returns:
        0-d float32 tensor, differentiable with respect to the critic's parameters;
        0 when no event has a pair.
    """
    _check_draw(by)
    b, n = cond.shape[0], real_muons.shape[0]
    device = cond.device
    if b == 0 or n == 0 or fake_muons.shape[0] == 0 or (slots is not None and not len(slots)):
        return torch.zeros((), device=device)
    ev, rank = _slot_ranks(real_counts, n)  # (N,) each slot's event and rank within it
    start_fake = torch.cumsum(fake_counts, 0) - fake_counts  # (B,)
    slot = torch.arange(n, device=device)
    if permute:
        # a random order within each event: sort by (event, uniform); float64 keeps the
        # event part exact next to the random part for up to 2^29 events
        key = ev.double() + torch.rand(n, device=device, dtype=torch.float64, generator=generator)
        real_row = torch.argsort(key)  # real row at each slot
    else:
        real_row = slot
    valid = rank < torch.minimum(real_counts, fake_counts)[ev]  # (N,) slot holds a pair
    if slots is not None:  # drawn ahead by the caller (draw_pairs)
        cand = slots
    else:
        if fraction < 1.0:
            valid &= (torch.rand(b, device=device, generator=generator) < fraction)[ev]
        if 0 < max_pairs < n:
            # a subset of the valid slots of fixed size: the smallest random keys, invalid
            # slots keyed last (drawn only when fewer than max_pairs are valid)
            key = _draw_keys(ev, b, by, generator)
            key = torch.where(valid, key, float(b + 1))
            cand = torch.topk(key, max_pairs, largest=False, sorted=False).indices
        else:
            cand = slot
    v = valid[cand]  # (M,)
    # the critic wants rows grouped by event: sort them by event, the dummy event b last
    e, order = torch.sort(torch.where(v, ev[cand], b), stable=True)  # (M,)
    cand, v = cand[order], v[order]
    e_safe = torch.where(v, e, 0)
    fake_row = torch.where(v, start_fake[e_safe] + rank[cand], 0)
    if alpha is None:
        alpha = torch.rand(b, device=device, generator=generator)
    a = alpha.to(real_muons.dtype)[e_safe].unsqueeze(-1)  # (M, 1)
    x = a * real_muons[real_row[cand]] + (1.0 - a) * fake_muons[fake_row]
    x = x.detach().requires_grad_(True)  # (M, F)

    per_event = torch.zeros(b, dtype=torch.int64, device=device).index_add_(
        0, e_safe, v.to(torch.int64)
    )  # (B,) pairs per event
    # only events with pairs are scored: no other event's score depends on x (at the
    # production multiplicity, or with max_pairs below the muon count, most events)
    rows, counts_x = events_with_muons(per_event, x.shape[0])
    if rows is not None:
        # the kept events renumbered 0..B'-1 in order (so e stays sorted), the dummy B'
        new_id = torch.cumsum(per_event > 0, 0) - 1
        e = torch.where(v, new_id[e_safe], rows.shape[0])
        cond = cond[rows]
    b = cond.shape[0]
    counts_x = torch.cat([counts_x, (~v).sum().view(1)])  # (B' + 1,): the dummy event last
    cond_x = torch.cat([cond, cond.new_zeros(1, cond.shape[1])])  # dummy event's condition
    scores = critic(x, cond_x, counts_x, e)  # (B' + 1,)
    (grad,) = torch.autograd.grad(scores[:b].float().sum(), x, create_graph=True)  # (M, F)
    sq = grad.float().pow(2).sum(-1)  # (M,) ||g_j||^2
    vf = v.float()
    if norm == "muon":
        per_muon = (torch.sqrt(sq + _EPS) - 1.0).pow(2)
        return (per_muon * vf).sum() / _denominator(vf, denominator)
    if norm != "event":
        raise ValueError(f"unknown gradient-penalty norm {norm!r}; use 'muon' or 'event'")
    sq_event = torch.zeros(b + 1, device=device).index_add_(0, e, sq * vf)[:b]  # (B,)
    has = (counts_x[:b] > 0).float()
    per_event = (torch.sqrt(sq_event + _EPS) - 1.0).pow(2)
    return (per_event * has).sum() / _denominator(has, denominator)


def _denominator(terms: torch.Tensor, given: int | None) -> torch.Tensor | float:
    """The number of (0/1) ``terms`` that count, at least 1, unless one is ``given``."""
    return terms.sum().clamp(min=1.0) if given is None else float(max(given, 1))


def _check_draw(by: str) -> None:
    if by not in ("muons", "events"):
        raise ValueError(f"unknown gradient-penalty draw {by!r}; use 'muons' or 'events'")


def _draw_keys(
    ev: torch.Tensor, b: int, by: Draw, generator: torch.Generator | None
) -> torch.Tensor:
    """(N,) random keys in [0, b) for the slots of events ``ev`` (of ``b`` events), whose
    smallest k are the draw of k slots: by ``"muons"`` a uniform key per slot (a uniform
    subset); by ``"events"`` the event's place in a random order of the events plus a
    uniform fraction (whole events in that order, the last one's slots in a random
    order). Float64 by events: the place stays exact beside the fraction up to 2^29
    events."""
    n = ev.shape[0]
    if by == "muons":
        return torch.rand(n, device=ev.device, generator=generator)
    u = torch.rand(n, device=ev.device, generator=generator, dtype=torch.float64)
    # the events' order from sorted uniform keys (rand and sort, which a CUDA graph
    # records; randperm's kernels may not be)
    order = torch.argsort(torch.rand(b, device=ev.device, generator=generator))
    place = torch.empty(b, device=ev.device, dtype=torch.float64)
    place[order] = torch.arange(b, device=ev.device, dtype=torch.float64)
    return place[ev] + u


def _slot_ranks(counts: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) the event of each of the ``n`` muon slots of events with ``counts``, and the
    slot's rank within its event."""
    events = torch.arange(counts.shape[0], device=counts.device)
    ev = torch.repeat_interleave(events, counts, output_size=n)
    start = torch.cumsum(counts, 0) - counts  # (B,)
    return ev, torch.arange(n, device=counts.device) - start[ev]


def draw_pairs(
    real_counts: torch.Tensor,
    fake_counts: torch.Tensor,
    *,
    max_pairs: int = 0,
    fraction: float = 1.0,
    generator: torch.Generator | None = None,
    by: Draw = "muons",
) -> torch.Tensor:
    """The pairs :func:`gradient_penalty` would draw for these events, drawn ahead: the
    real muon slots (ascending, so grouped by event) of at most ``max_pairs`` of the valid
    pairs (0: all), drawn ``by`` muons (a uniform subset) or events (whole events in a
    random order, the last one cut), of the events each taking part with probability
    ``fraction``. For a batch whose parts are scored apart (``slots``)."""
    _check_draw(by)
    n = int(real_counts.sum())
    ev, rank = _slot_ranks(real_counts, n)
    valid = rank < torch.minimum(real_counts, fake_counts)[ev]
    if fraction < 1.0:
        b = real_counts.shape[0]
        valid &= (torch.rand(b, device=valid.device, generator=generator) < fraction)[ev]
    slots = valid.nonzero().squeeze(1)
    if 0 < max_pairs < len(slots):
        key = _draw_keys(ev[slots], real_counts.shape[0], by, generator)
        keep = torch.topk(key, max_pairs, largest=False, sorted=False).indices
        slots = slots[keep.sort().values]
    return slots


def pair_count(slots: torch.Tensor, counts: torch.Tensor, norm: Norm) -> int:
    """How many terms the penalty over these drawn ``slots`` (:func:`draw_pairs`) of events
    with ``counts`` averages: its pairs (``"muon"``) or its events with a pair
    (``"event"``); the ``denominator`` of each part's penalty. Reads the count on the host."""
    if norm == "muon" or not len(slots):
        return len(slots)
    ev, _ = _slot_ranks(counts, int(counts.sum()))
    return int(torch.unique_consecutive(ev[slots]).numel())


def reference_gradient_penalty(
    critic: nn.Module,
    cond: torch.Tensor,
    real_muons: torch.Tensor,
    real_counts: torch.Tensor,
    fake_muons: torch.Tensor,
    fake_counts: torch.Tensor,
    *,
    max_pairs: int = 0,
    fraction: float = 1.0,
    norm: Norm = "muon",
    alpha: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    by: Draw = "muons",
) -> torch.Tensor:
    """The same penalty, written straightforwardly with a Python loop over events.

    For tests (it must equal :func:`gradient_penalty` for the same alpha with all pairs
    used) and for the benchmark ratio. It pairs event by event (reading counts on the
    host), subsamples pairs with a randperm (``by="muons"``) or takes whole events in a
    randperm's order until ``max_pairs`` (``by="events"``, the last one's pairs by a
    randperm), and scores the interpolated events in one critic call, as the original
    trainer did.
    """
    _check_draw(by)
    b = cond.shape[0]
    device = cond.device
    rc, fc = real_counts.tolist(), fake_counts.tolist()
    if alpha is None:
        alpha = torch.rand(b, device=device, generator=generator)
    keep = (
        (torch.rand(b, device=device, generator=generator) < fraction).tolist()
        if fraction < 1.0
        else [True] * b
    )
    pieces, events, ks = [], [], []
    r0 = f0 = 0
    for i in range(b):
        k = min(rc[i], fc[i])
        if keep[i] and k > 0:
            a = alpha[i].to(real_muons.dtype)
            pieces.append(a * real_muons[r0 : r0 + k] + (1.0 - a) * fake_muons[f0 : f0 + k])
            events.append(i)
            ks.append(k)
        r0 += rc[i]
        f0 += fc[i]
    if not pieces:
        return torch.zeros((), device=device)
    x = torch.cat(pieces)
    total = x.shape[0]
    if 0 < max_pairs < total:
        chosen = torch.zeros(total, dtype=torch.bool, device=device)
        if by == "muons":
            chosen[torch.randperm(total, device=device, generator=generator)[:max_pairs]] = True
        else:
            starts = [0, *itertools.accumulate(ks)]
            left = max_pairs
            for i in torch.randperm(len(ks), device=device, generator=generator).tolist():
                take = min(ks[i], left)
                pick = torch.randperm(ks[i], device=device, generator=generator)[:take]
                chosen[pick + starts[i]] = True
                left -= take
                if not left:
                    break
        x = x[chosen]
        per_event = []
        start = 0
        for k in ks:
            per_event.append(int(chosen[start : start + k].sum()))
            start += k
        events = [ev for ev, k in zip(events, per_event) if k > 0]
        ks = [k for k in per_event if k > 0]
    x = x.detach().requires_grad_(True)
    counts = torch.tensor(ks, dtype=torch.int64, device=device)
    scores = critic(x, cond[events], counts)
    (grad,) = torch.autograd.grad(scores.sum(), x, create_graph=True)
    if norm == "muon":
        norms = torch.sqrt(grad.float().pow(2).sum(-1) + _EPS)
        return (norms - 1.0).pow(2).mean()
    terms = []
    start = 0
    for k in ks:
        g = grad[start : start + k].float()
        terms.append((torch.sqrt(g.pow(2).sum() + _EPS) - 1.0).pow(2))
        start += k
    return torch.stack(terms).mean()
