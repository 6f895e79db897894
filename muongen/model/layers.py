"""Building blocks the generator and the critic share: a plain MLP, a split first layer."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from muongen.model.pooling import rows_of


def mlp(
    n_in: int,
    hidden: Sequence[int],
    n_out: int | None,
    *,
    activation: Callable[[], nn.Module],
    layer_norm: bool = False,
    out_bias: bool = True,
) -> nn.Sequential:
    """Linear layers of widths ``n_in -> hidden... -> n_out``.

    Each hidden layer is Linear [-> LayerNorm] -> activation. With ``n_out`` set, a last
    Linear without activation follows; with ``n_out=None`` the MLP ends on the last hidden
    activation (a feature extractor). ``out_bias=False`` drops the last layer's bias.
    """
    layers: list[nn.Module] = []
    width = n_in
    for h in hidden:
        layers.append(nn.Linear(width, h))
        if layer_norm:
            layers.append(nn.LayerNorm(h))
        layers.append(activation())
        width = h
    if n_out is not None:
        layers.append(nn.Linear(width, n_out, bias=out_bias))
    return nn.Sequential(*layers)


def leaky_relu() -> nn.Module:
    """LeakyReLU with the original trainer's slope 0.2."""
    return nn.LeakyReLU(0.2)


def leaky_relu_inplace() -> nn.Module:
    """LeakyReLU(0.2) overwriting its input: for layers whose pre-activation nothing else
    reads (a positive slope lets autograd differentiate it from its output)."""
    return nn.LeakyReLU(0.2, inplace=True)


def narrow_linear(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``linear(x)`` for a Linear with a handful of inputs and many rows (the critic's
    embedding of each muon's 2-4 inputs): the same value and gradients, but the weight's
    gradient is computed as ``x^T @ grad`` ([in, N] x [N, out]). For a Linear autograd
    computes it as ``(grad^T @ x)^T`` to match the layout of ``weight.t()``, a product
    MKL runs 3-4x slower on the CPU when ``in`` is 3 (0.36 against 0.11 ms for 13k muons).
    """
    return torch.addmm(linear.bias, x, linear.weight.t().contiguous())


def split_linear(
    linear: nn.Linear,
    per_event: torch.Tensor,
    per_muon: torch.Tensor,
    counts: torch.Tensor,
    event_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """``linear`` on each muon's input [per_event of its event, per_muon], computed exactly
    as a per-event part (once per event) plus a per-muon part.

    ``linear.weight`` (H, E + M) splits by columns into W_e (H, E) and W_m (H, M):
    W [e; m] + b = (W_e e + b) + W_m m, so the per-muon cost is that of M inputs, not E + M.

    Args:
        linear: a Linear with E + M inputs.
        per_event: (B, E) one vector per event.
        per_muon: (N, M) one vector per muon, grouped by event.
        counts: (B,) int64 muons per event.
        event_index: (N,) the event of each muon, when the caller has it.

    Returns:
        (N, H), equal (to rounding) to ``linear(cat([per_event[event_index], per_muon]))``.
    """
    event_part, muon_weight = split_parts(linear, per_event)
    if event_index is None:
        rows = torch.repeat_interleave(event_part, counts, dim=0, output_size=per_muon.shape[0])
    else:
        rows = rows_of(event_part, event_index)  # (N, H), a fresh tensor
    return add_muon_part(rows, per_muon, muon_weight)


def add_muon_part(
    rows: torch.Tensor, per_muon: torch.Tensor, muon_weight: torch.Tensor
) -> torch.Tensor:
    """``rows += per_muon @ muon_weight`` in place, for the gathered per-event rows (N, H)
    of :func:`split_parts`: ``rows`` is a fresh tensor (the gather's backward does not need
    it), so the product accumulates into it instead of into a copy. autocast does not cast
    an in-place op, so the per-muon input takes the rows' dtype (bf16 under autocast)."""
    return rows.addmm_(per_muon.to(rows.dtype), muon_weight)


def split_parts(linear: nn.Linear, per_event: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two parts of :func:`split_linear`: the per-event rows W_e e + b (B, H) and the
    per-muon weight W_m^T (M, H), to add as ``event_rows[event] + per_muon @ W_m^T``.

    Under autocast both come in the dtype autocast gives the linear (bf16 or fp16), so that
    the in-place ``addmm_`` that joins them, which autocast does not cast, sees one dtype.
    """
    width = per_event.shape[1]
    event_part = nn.functional.linear(per_event, linear.weight[:, :width], linear.bias)
    return event_part, linear.weight[:, width:].t().to(event_part.dtype)
