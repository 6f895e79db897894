"""Pooling of per-muon rows into per-event rows over contiguous events (pure functions).

Rows are muons (N, H) grouped by event, event after event, with ``counts`` (B,) rows per
event and ``event_index`` (N,) the event of each row (``repeat_interleave`` of counts).
An event without rows pools to 0 (the critic replaces those rows by a learned fill).

Both reductions are written for the critic's training step, which differentiates them
twice (the gradient penalty). ``segment_sum`` is an ``index_add`` (backward: a row gather).
``segment_max`` returns the maxima (the forward of ``scatter_reduce(amax)``, ~15x faster on
the CPU than ``segment_reduce``) with the gradient of a weighted sum of rows: each row
attaining a maximum weighs 1 / (number of rows attaining it), the others 0, so the gradient
reaches the maximal row(s), split evenly between ties, as ``scatter_reduce(amax)``'s does.
Its backward and double backward are a row gather and an index_add, where
``scatter_reduce``'s own amax backward compares, counts and divides through scattered
N x H indices (half of the original training step's time on the CPU).

On a GPU the row gather and the index_add go through a contiguous (N, H) index instead
(:func:`rows_of`, :func:`segment_sum`): ``index_select`` there gives each row its own
thread block, so for the narrow rows here (32-64 columns) it costs the same ~105 us for
170k rows whatever the width (H200, torch 2.11), where ``gather`` with a contiguous
(N, H) index takes 28 us at 32 columns and 49 at 64, and its backward, ``scatter_add``,
43-100 us against the index_add's 53-133. The (N, H) index is made once per event index
and width (:func:`wide_index`) and reused by every call on the same rows.
"""

from __future__ import annotations

import torch


def event_index_of(counts: torch.Tensor, n_muons: int) -> torch.Tensor:
    """(N,) int64: the event each row belongs to, from counts (B,); no host sync."""
    events = torch.arange(counts.shape[0], device=counts.device)
    return torch.repeat_interleave(events, counts, output_size=n_muons)


#: On CUDA, rows up to this wide are gathered and summed through a contiguous (N, H)
#: index (:func:`wide_index`); wider rows through the (N,) index, where ``index_select``
#: moves enough bytes per row to be the faster (and the (N, H) index would be large).
WIDE_INDEX_MAX = 128

#: the attribute of an event index tensor that holds its (N, H) expansions, by width
_WIDE_CACHE = "_muongen_wide_index"


def wide_index(event_index: torch.Tensor, width: int) -> torch.Tensor:
    """(N, width) int64, contiguous: ``event_index`` repeated along each row.

    Made once per event index tensor and width and kept on that tensor (an attribute), so
    that every gather and sum over the same rows in a step (each critic update, forward,
    backward and the penalty's double backward) reuses it. The event index is never
    written in place, so the expansion stays valid for as long as the tensor lives.
    """
    cache = getattr(event_index, _WIDE_CACHE, None)
    if cache is None:
        cache = {}
        setattr(event_index, _WIDE_CACHE, cache)
    index = cache.get(width)
    if index is None:
        index = cache[width] = event_index.unsqueeze(1).expand(-1, width).contiguous()
    return index


def _use_wide(h: torch.Tensor, width: int) -> bool:
    return h.is_cuda and 0 < width <= WIDE_INDEX_MAX and not torch.compiler.is_compiling()


def rows_of(per_event: torch.Tensor, event_index: torch.Tensor) -> torch.Tensor:
    """(B, H) per-event rows -> (N, H): each muon's row of its event (a row gather, whose
    backward is :func:`segment_sum`)."""
    width = per_event.shape[1]
    if _use_wide(per_event, width):
        return torch.gather(per_event, 0, wide_index(event_index, width))
    return per_event.index_select(0, event_index)


def segment_sum(h: torch.Tensor, event_index: torch.Tensor, n_events: int) -> torch.Tensor:
    """(N, H) rows -> (B, H) per-event sums (rows may be in any order)."""
    width = h.shape[1]
    if _use_wide(h, width):
        return h.new_zeros(n_events, width).scatter_add_(0, wide_index(event_index, width), h)
    return h.new_zeros(n_events, width).index_add_(0, event_index, h)


def segment_mean(h: torch.Tensor, counts: torch.Tensor, event_index: torch.Tensor) -> torch.Tensor:
    """(N, H) rows -> (B, H) per-event means (0 for an event without rows)."""
    total = segment_sum(h, event_index, counts.shape[0])
    return total / counts.clamp(min=1).to(h.dtype).unsqueeze(-1)


def segment_top(h: torch.Tensor, n_events: int, event_index: torch.Tensor) -> torch.Tensor:
    """(N, H) rows -> (B, H) per-event, per-channel maxima, without a gradient (0 for an
    event without rows): ``scatter_reduce``'s fast forward, for a shift such as a softmax's."""
    if _use_wide(h, h.shape[1]):
        rows = wide_index(event_index, h.shape[1])
    else:
        rows = event_index.unsqueeze(1).expand(-1, h.shape[1])
    return h.new_zeros(n_events, h.shape[1]).scatter_reduce_(0, rows, h, "amax", include_self=False)


def segment_max(h: torch.Tensor, counts: torch.Tensor, event_index: torch.Tensor) -> torch.Tensor:
    """(N, H) rows grouped by event -> (B, H) per-event, per-channel maxima (0 if empty)."""
    b = counts.shape[0]
    if h.shape[0] == 0:
        return h.new_zeros(b, h.shape[1])
    return _SegmentMax.apply(h, event_index, counts)


class _SegmentMax(torch.autograd.Function):
    """The maxima, with the gradient of ``segment_sum(h * weight)`` for the constant
    ``weight`` = 1 / (rows at the maximum) at the maximal rows, 0 elsewhere.

    The forward returns the maxima themselves (no N x H product and sum); the backward,
    ``grad[event] * weight``, is written in differentiable operations, so the double
    backward of the gradient penalty goes through it (an index_add of ``weight``-scaled
    rows), and its derivative with respect to ``h`` is 0 as for any piecewise-linear max.

    The mask of the maximal rows is built in floating point, ``h == max`` written straight
    into a float tensor (``torch.eq(..., out=)``, one pass): on the CPU, boolean tensors
    take slow paths (a bool mask and its cast cost ~8x that pass, and ``1 - sign(max -
    h)``, the former way, 3.5x: 0.29 against 0.08 ms for 26k rows of 32). When no (event,
    channel) has two rows at its maximum (the usual case for continuous features) the
    mask is the weight itself and the tie count's (N, H) passes are skipped (read on the
    host; on the CPU only, where that read is free).
    """

    @staticmethod
    def forward(ctx, h: torch.Tensor, event_index: torch.Tensor, counts: torch.Tensor):
        # scatter_reduce's forward is fast (its amax backward is the slow part, unused);
        # an event without rows keeps the 0 it starts from (include_self=False)
        b = counts.shape[0]
        top = segment_top(h, b, event_index)
        top_rows = rows_of(top, event_index)  # (N, H), a fresh tensor
        weight = torch.eq(top_rows, h, out=top_rows)  # 1 at the maxima, 0 elsewhere
        if h.device.type != "cpu" or not _no_ties(weight, counts):
            ties = segment_sum(weight, event_index, b)  # (B, H), >= 1 where rows
            weight = weight.mul_(rows_of(ties.clamp_(min=1.0).reciprocal_(), event_index))
        # the event index itself is kept (not saved for backward): its (N, H) expansions
        # live on it as an attribute, which the backward's gather reuses
        ctx.event_index = event_index
        ctx.save_for_backward(weight)
        return top

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (weight,) = ctx.saved_tensors
        return rows_of(grad, ctx.event_index).mul_(weight), None, None


# rows below which a per-channel sum of a 0/1 mask is exact in the mask's dtype (every
# integer up to 2^mantissa bits + 1 is representable)
_EXACT_ROWS = {
    torch.float32: 2**24,
    torch.float64: 2**53,
    torch.bfloat16: 2**8,
    torch.float16: 2**11,
}


def _no_ties(hit: torch.Tensor, counts: torch.Tensor) -> bool:
    """Whether every (event with rows, channel) has exactly one row at its maximum.

    ``hit`` (N, H) is 1 (or True) at the rows at their event's maximum, 0 elsewhere.
    With finite values each (event with rows, channel) has at least one, so the number of
    hits equals their number exactly when none has two (a NaN row is at no maximum: its
    channel's maximum is NaN, the update non-finite, and the training step skips it).
    """
    # a sum of the 0/1 mask, ~20x faster on the CPU than count_nonzero. Summed per channel in
    # the mask's own dtype, every partial sum is an integer <= N, exact in float32 while
    # N < 2^24; the H channel sums are then added in float64. A float64 sum of the whole
    # mask would first copy it to float64 (~1 ms for 13k x 32 rows, 6% of a step).
    if not hit.is_floating_point():
        hits = torch.count_nonzero(hit)
    elif hit.shape[0] < _EXACT_ROWS.get(hit.dtype, 0):
        hits = hit.sum(0).sum(dtype=torch.float64)
    else:
        hits = hit.sum(dtype=torch.float64)
    return float(hits) == int(torch.count_nonzero(counts)) * hit.shape[1]
